"""Which sequences a step advances: admission to cache slots, prefill chunks, decode rows.

`Scheduler(max_num_seqs, max_num_batched_tokens, prefill_chunk)` keeps `waiting` (FIFO) and
`running` (in admission order) and the free cache slots (one per running sequence,
models/kv_cache.py). One rule covers prefill, chunking and decoding: each sequence has
`num_computed_tokens`, the tokens whose K/V are in its slot, and catches up:

    schedule():
        admit waiting sequences while a slot is free           (FIFO; the rest wait)
        decodes  = running sequences whose prompt is computed  (one row each, + drafts)
        prefills = running sequences still behind, in order, one chunk each, while
                   len(decodes) + the chunks' tokens <= max_num_batched_tokens
                   (at least one chunk when nothing decodes, so a step always progresses)

A chunk is `prefill_chunk` tokens at an absolute boundary (a multiple of prefill_chunk), so
a prompt's numbers do not depend on the steps its chunks share; the budget only decides when
a chunk runs. So a long prompt shares steps with the running streams instead of freezing
them, and every sequence's tokens are the ones it gets alone.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from fastgemma.engine.sequence import Sequence, Status


@dataclass
class SchedulerOutput:
    prefills: list[Sequence] = field(default_factory=list)  # each computes its next chunk
    decodes: list[Sequence] = field(default_factory=list)  # each decodes one token (plus drafts)

    @property
    def empty(self) -> bool:
        return not self.prefills and not self.decodes


class Scheduler:
    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int, prefill_chunk: int):
        assert max_num_seqs >= 1 and max_num_batched_tokens >= 1 and prefill_chunk >= 1
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free_slots: list[int] = list(range(max_num_seqs))  # cache slots not held by a sequence

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def schedule(self) -> SchedulerOutput:
        while self.waiting and self.free_slots:
            seq = self.waiting.popleft()
            seq.slot, seq.status = self.free_slots.pop(0), Status.RUNNING
            self.running.append(seq)
        out = SchedulerOutput(decodes=[s for s in self.running if s.num_computed_tokens >= s.num_prompt_tokens])
        budget = self.max_num_batched_tokens - len(out.decodes)
        for seq in self.running:
            if seq.num_computed_tokens >= seq.num_prompt_tokens:
                continue
            n = min(self.prefill_chunk, seq.num_prompt_tokens - seq.num_computed_tokens)
            if n > budget and not out.empty:
                break  # FIFO: a later prompt does not overtake this one
            out.prefills.append(seq)
            budget -= n
        return out

    def finish(self, seq: Sequence) -> None:
        """Drop a finished (or aborted) sequence; its slot is free for the next step."""
        if seq in self.running:
            self.running.remove(seq)
            assert seq.slot is not None
            self.free_slots.append(seq.slot)
            self.free_slots.sort()
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def take_slot(self) -> int | None:
        """A free slot for work outside the sequences (prompt scoring), or None; give it back
        with `give_slot`."""
        if not self.free_slots:
            return None
        return self.free_slots.pop(0)

    def give_slot(self, slot: int) -> None:
        self.free_slots.append(slot)
        self.free_slots.sort()
