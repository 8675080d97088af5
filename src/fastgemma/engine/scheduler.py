"""Which sequences a step advances: admission to cache slots, prefill chunks, decode rows.

`Scheduler(max_num_seqs, max_num_batched_tokens, prefill_chunk, num_stages)` keeps `waiting`
(FIFO) and `running` (in admission order) and the free cache slots (one per running sequence,
models/kv_cache.py). One rule covers prefill, chunking and decoding: each sequence has
`num_computed_tokens`, the tokens whose K/V are in its slot, and catches up:

    schedule():
        admit waiting sequences while a slot is free           (FIFO; the rest wait)
        decodes  = running sequences whose prompt is computed  (one row each, + drafts)
        prefills = running sequences still behind, in order: (sequence, stages of its
                   current chunk to run), within max_num_batched_tokens - len(decodes)
                   tokens, where a chunk of n tokens costs n / num_stages per stage
                   (a stage: one layer's attention or feed-forward); a chunk that does not
                   fit whole runs the stages that fit and pauses, and later prompts wait
                   (FIFO); at least one stage a step, and the whole chunk when nothing
                   decodes (no stream waits for it then)

A chunk is `prefill_chunk` tokens at an absolute boundary (a multiple of prefill_chunk), and
its stages are the same ops in the same order however many steps they spread over
(models/gemma.py `PartialForward`), so a prompt's numbers do not depend on the steps its
chunks share; the budget only decides when each part runs. So a long prompt shares steps
with the running streams, a few stages at a time, instead of freezing them (vLLM splits a
prompt's tokens over steps instead, which changes a bf16 prefill's rounding), and every
sequence's tokens are the ones it gets alone.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from fastgemma.engine.sequence import Sequence, Status

CPU_PREFILL_TOKENS = 8  # prompt tokens' worth of stages beside a full batch, by default on a CPU


def default_token_budget(max_num_seqs: int, prefill_chunk: int, cpu: bool) -> int:
    """max_num_batched_tokens when none is given. On a CPU a prompt token through every layer
    costs about what one more decode row does, and a whole chunk of a few hundred tokens
    stalls the running streams for ten decode steps: a full batch plus `CPU_PREFILL_TOKENS`
    keeps a step with prompt work within ~2x a decode step (the embedded model, 8 streams:
    one or two stages of a 250-token chunk a step). On a GPU a chunk costs a few decode
    steps: one whole chunk beside a full batch."""
    return max_num_seqs + (CPU_PREFILL_TOKENS if cpu else prefill_chunk)


@dataclass
class SchedulerOutput:
    prefills: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, stages of its chunk to run)
    decodes: list[Sequence] = field(default_factory=list)  # each decodes one token (plus drafts)

    @property
    def empty(self) -> bool:
        return not self.prefills and not self.decodes


class Scheduler:
    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int, prefill_chunk: int, num_stages: int):
        assert max_num_seqs >= 1 and max_num_batched_tokens >= 1 and prefill_chunk >= 1 and num_stages >= 1
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.prefill_chunk, self.num_stages = prefill_chunk, num_stages
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
        S = self.num_stages
        budget = (self.max_num_batched_tokens - len(out.decodes)) * S  # token-stages
        for seq in self.running:
            if seq.num_computed_tokens >= seq.num_prompt_tokens:
                continue
            n = min(self.prefill_chunk, seq.num_prompt_tokens - seq.num_computed_tokens)
            left = S - seq.num_computed_stages
            stages = min(left, max(budget, 0) // n)
            if not out.decodes and not out.prefills:
                stages = left  # nothing else runs: no stream waits for this chunk
            elif stages == 0 and not out.prefills:
                stages = 1  # the budget is below one stage of the chunk: one, so that it progresses
            if stages == 0:
                break
            out.prefills.append((seq, stages))
            budget -= stages * n
            if stages < left:
                break  # FIFO: a later prompt does not overtake this one
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
