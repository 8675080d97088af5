"""Which sequences a step advances: admission to cache slots, prefill chunks, decode rows.

`Scheduler(max_num_seqs, max_num_batched_tokens, prefill_chunk, num_stages)` keeps `waiting`
(FIFO) and `running` (in admission order) and the free cache slots (one per running sequence,
models/kv_cache.py). One rule covers prefill, chunking and decoding: each sequence has
`num_computed_tokens`, the tokens whose K/V are in its slot, and catches up:

    schedule():
        admit waiting sequences while a slot is free           (FIFO; the rest wait; a
                                                                sequence with forks: when
                                                                a slot is free for each)
        decodes  = running sequences whose prompt is computed  (one row each, + drafts)
        prefills = running sequences still behind, in order (forks wait for their source's
                   prompt, engine/llm_engine.py, and get no work): (sequence, stages of its
                   current chunk to run) within the step's prompt tokens,
                   max_num_batched_tokens - len(decodes) (unset: `paced_budget`), a chunk
                   of n tokens costing n / num_stages a stage (one layer's attention or
                   feed-forward); a chunk that does not fit whole runs the stages that fit
                   and pauses, and later prompts wait (FIFO); at least one stage a step,
                   and the whole chunk when nothing decodes (no stream waits for it then)

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

PACED_EXTRA_TOKENS = 8  # paced budget: prompt tokens a step beyond one per decode row
PACED_QUEUE_STEPS = 48  # paced budget: a queue of prompt tokens is worked off in about as many steps


def paced_budget(num_decodes: int, queued_tokens: int) -> int:
    """The token budget of a step with `num_decodes` decode rows when none is set (on a CPU):
    as many prompt tokens' worth of stages as decode rows, plus `PACED_EXTRA_TOKENS`, plus
    1 / `PACED_QUEUE_STEPS` of the prompt tokens queued behind the chunk in progress. On a
    CPU a prompt token through every layer costs about what a decode row adds to a step, so a
    step with prompt work stays within ~2x a decode step while prompt work keeps pace with
    the streams (a request whose prompt is about as long as its output frees its slot as fast
    as the next prompt fills one); a burst of arrivals (a queue) is worked off faster, so
    that the time to first token stays bounded. A fixed budget must choose between long
    stalls when few rows decode and prompts that queue without bound when many do."""
    return 2 * num_decodes + PACED_EXTRA_TOKENS + queued_tokens // PACED_QUEUE_STEPS


@dataclass
class SchedulerOutput:
    prefills: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, stages of its chunk to run)
    decodes: list[Sequence] = field(default_factory=list)  # each decodes one token (plus drafts)

    @property
    def empty(self) -> bool:
        return not self.prefills and not self.decodes


class Scheduler:
    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int | None, prefill_chunk: int, num_stages: int):
        """max_num_batched_tokens None: `paced_budget` at every step."""
        assert max_num_seqs >= 1 and (max_num_batched_tokens or 1) >= 1 and prefill_chunk >= 1 and num_stages >= 1
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
        while self.waiting and len(self.free_slots) > len(self.waiting[0].forks):
            seq = self.waiting.popleft()
            for s in (seq, *seq.forks):  # with its forks: a slot each
                s.slot, s.status = self.free_slots.pop(0), Status.RUNNING
                self.running.append(s)
        out = SchedulerOutput(decodes=[s for s in self.running if s.num_computed_tokens >= s.num_prompt_tokens])
        S = self.num_stages
        behind = [s for s in self.running if s.num_computed_tokens < s.num_prompt_tokens and s.fork_of is None]
        tokens = self.max_num_batched_tokens
        if tokens is None:
            remaining = [s.num_prompt_tokens - s.num_computed_tokens for s in [*behind, *self.waiting]]
            in_progress = min(self.prefill_chunk, remaining[0]) if remaining else 0  # the first's current chunk
            tokens = paced_budget(len(out.decodes), sum(remaining) - in_progress)
        budget = (tokens - len(out.decodes)) * S  # token-stages
        for seq in behind:
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
        """Drop a finished (or aborted) sequence; its slot is free for the next step. Forks
        still waiting for its prompt compute their own (the same bits, later): admitted ones
        at once, waiting ones in its place in the queue. A fork leaves its source's forks."""
        if seq.fork_of is not None:
            seq.fork_of.forks.remove(seq)
            seq.fork_of = None
        forks, seq.forks = seq.forks, []
        for fork in forks:
            fork.fork_of = None
        if seq in self.running:
            self.running.remove(seq)
            assert seq.slot is not None
            self.free_slots.append(seq.slot)
            self.free_slots.sort()
        elif seq in self.waiting:
            at = self.waiting.index(seq)
            self.waiting.remove(seq)
            for i, fork in enumerate(forks):
                self.waiting.insert(at + i, fork)

    def take_slot(self) -> int | None:
        """A free slot for work outside the sequences (prompt scoring), or None; give it back
        with `give_slot`."""
        if not self.free_slots:
            return None
        return self.free_slots.pop(0)

    def give_slot(self, slot: int) -> None:
        self.free_slots.append(slot)
        self.free_slots.sort()
