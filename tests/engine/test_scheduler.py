"""The scheduler's step plan: which prompt chunks run how many stages beside the decodes."""

from __future__ import annotations

from fastgemma.engine.sampling_params import SamplingParams
from fastgemma.engine.scheduler import PACED_EXTRA_TOKENS, PACED_QUEUE_STEPS, Scheduler
from fastgemma.engine.sequence import Sequence

STAGES = 36  # the embedded model: 18 layers


def _decoding(sched: Scheduler, n: int) -> list[Sequence]:
    """n running sequences whose prompts are computed (they decode)."""
    seqs = [Sequence([1, 2, 3], SamplingParams()) for _ in range(n)]
    for seq in seqs:
        sched.add(seq)
    sched.schedule()
    for seq in seqs:
        seq.num_computed_tokens = seq.num_prompt_tokens
    return seqs


def _prompt(sched: Scheduler, n: int) -> Sequence:
    seq = Sequence(list(range(n)), SamplingParams())
    sched.add(seq)
    return seq


def test_nothing_decoding_a_chunk_runs_whole():
    sched = Scheduler(16, None, 512, STAGES)
    seq = _prompt(sched, 250)
    assert sched.schedule().prefills == [(seq, STAGES)]


def test_the_paced_budget_gives_the_decode_rows_plus_8_tokens_and_works_off_a_queue():
    sched = Scheduler(16, None, 512, STAGES)
    _decoding(sched, 8)
    first = _prompt(sched, 250)
    plan = sched.schedule()
    paced = (8 + PACED_EXTRA_TOKENS) * STAGES // 250  # the decode rows + 8 prompt tokens' worth of stages
    assert len(plan.decodes) == 8 and plan.prefills == [(first, paced)] and paced == 2
    for _ in range(4):  # a burst: 1000 prompt tokens queued behind the chunk in progress
        _prompt(sched, 250)
    plan = sched.schedule()
    faster = (8 + PACED_EXTRA_TOKENS + 1000 // PACED_QUEUE_STEPS) * STAGES // 250
    assert plan.prefills == [(first, faster)] and faster > paced  # only the first: FIFO


def test_a_fixed_budget_ignores_the_queue_and_fills_in_chunks_that_fit():
    sched = Scheduler(16, 24, 512, STAGES)
    _decoding(sched, 8)
    a, b = _prompt(sched, 250), _prompt(sched, 250)
    assert sched.schedule().prefills == [(a, (24 - 8) * STAGES // 250)]
    sched = Scheduler(16, 8 + 2 * 8, 512, STAGES)
    _decoding(sched, 8)
    a, b = _prompt(sched, 4), _prompt(sched, 250)
    # a's 4 tokens x 36 stages fit whole; b gets what is left, in whole stages
    assert sched.schedule().prefills == [(a, STAGES), (b, (16 * STAGES - 4 * STAGES) // 250)]


def _choices(sched: Scheduler, n: int) -> list[Sequence]:
    """A prompt's n choices as the engine queues them: the first, and its forks."""
    first = _prompt(sched, 20)
    forks = [Sequence(list(range(20)), SamplingParams(), fork_of=first) for _ in range(n - 1)]
    first.forks = list(forks)
    return [first, *forks]


def test_choices_are_admitted_together_and_only_the_first_computes_the_prompt():
    sched = Scheduler(4, None, 512, STAGES)
    _decoding(sched, 2)
    group = _choices(sched, 3)  # 3 slots needed, 2 free: it waits
    assert sched.schedule().prefills == [] and sched.num_waiting == 1
    sched.finish(sched.running[0])
    plan = sched.schedule()
    assert [s.slot for s in group] == [0, 2, 3] and sched.running[-3:] == group
    # one decode row; the forks get no work and their prompts are not counted as queued
    assert plan.prefills == [(group[0], (2 + PACED_EXTRA_TOKENS - 1) * STAGES // 20)] and len(plan.decodes) == 1


def test_a_finished_source_leaves_its_forks_to_compute_their_own_prompt():
    sched = Scheduler(4, None, 512, STAGES)
    group = _choices(sched, 3)
    sched.schedule()
    sched.finish(group[1])  # a fork cancelled: it leaves the group
    assert group[0].forks == [group[2]] and group[1].fork_of is None
    sched.finish(group[0])  # the source cancelled before its prompt was computed
    assert group[2].fork_of is None and sched.schedule().prefills == [(group[2], STAGES)]
    waiting = Scheduler(1, None, 512, STAGES)
    _decoding(waiting, 1)
    group = _choices(waiting, 2)
    waiting.finish(group[0])  # still queued: its fork takes its place
    assert list(waiting.waiting) == [group[1]] and group[1].fork_of is None
