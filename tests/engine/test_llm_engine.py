"""`LLMEngine` on its own, with a tiny scripted runner (no model): scheduling, stopping,
drafting and log-probs are the engine's, so they are checked without any numerics."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fastgemma.engine.llm_engine import LLMEngine
from fastgemma.engine.model_runner import DecodeResult, DecodeRows
from fastgemma.engine.sampling_params import SamplingParams

V = 32  # vocabulary
EOS = 31


class CountingRunner:
    """Predicts (token + 1) % V after every token: logits one-hot at that id. Records calls:
    ("prefill", chunk, start, slot) when a chunk is done, ("stages", start, slot, from, to) when
    it pauses, and ("decode", [(slot, ids, position), ...])."""

    device = torch.device("cpu")
    num_stages = 4

    def __init__(self, max_model_len: int = 64, num_seqs: int = 1, prefill_chunk: int = 512):
        self.max_model_len, self.prefill_chunk = max_model_len, prefill_chunk
        self.cache = SimpleNamespace(max_decode_like_tokens=8)
        self.pool = SimpleNamespace(num_seqs=num_seqs, seqs=[self.cache] * num_seqs)
        self.calls: list[tuple] = []
        self.last_hidden: torch.Tensor | None = None

    @staticmethod
    def _rows(ids: list[int]) -> torch.Tensor:
        rows = torch.full((len(ids), V), -10.0)
        rows[torch.arange(len(ids)), torch.tensor([(t + 1) % V for t in ids])] = 10.0
        return rows

    def start_prefill(self, ids: list[int], start: int, slot: int, soft=None) -> SimpleNamespace:
        return SimpleNamespace(chunk=ids[start : start + self.prefill_chunk], start=start, slot=slot, next_stage=0)

    def advance_prefill(self, work: SimpleNamespace, stages: int | None = None) -> torch.Tensor | None:
        stop = self.num_stages if stages is None else min(self.num_stages, work.next_stage + stages)
        if stop < self.num_stages:
            self.calls.append(("stages", work.start, work.slot, work.next_stage, stop))
            work.next_stage = stop
            return None
        self.calls.append(("prefill", list(work.chunk), work.start, work.slot))
        self.last_hidden = torch.zeros(1, 4)
        self.last_hidden[0, 0] = work.chunk[-1]  # first_token reads the chunk's last id from it
        return self.last_hidden

    def first_token(self, hidden: torch.Tensor, out: str = "logits", allowed=None):
        logits = self._rows([int(hidden[-1, 0])])[-1]
        return int(torch.argmax(logits)) if out == "greedy" else logits

    def decode_batch(self, batch: list[DecodeRows]) -> list[DecodeResult]:
        self.calls.append(("decode", [(r.slot, list(r.ids), r.position) for r in batch]))
        out = []
        for r in batch:
            rows = self._rows(r.ids)
            tokens = torch.argmax(rows, dim=-1).tolist() if r.greedy else None
            out.append(DecodeResult(tokens, None if r.greedy else rows, torch.zeros(len(r.ids), 4)))
        self.last_hidden = out[-1].hidden
        return out


def _engine(proposer=None, max_model_len: int = 64, num_seqs: int = 1, prefill_chunk: int = 512,
            max_num_batched_tokens: int | None = None) -> tuple[LLMEngine, CountingRunner]:
    runner = CountingRunner(max_model_len, num_seqs, prefill_chunk)
    return LLMEngine(runner, (EOS,), V, proposer, max_num_batched_tokens), runner  # type: ignore[arg-type]


def _run(engine: LLMEngine) -> None:
    while engine.has_unfinished():
        engine.step()


def test_with_one_slot_requests_run_one_at_a_time_in_order():
    engine, runner = _engine()
    a = engine.add_request([1, 2], SamplingParams(max_tokens=3, temperature=0.0))
    b = engine.add_request([7], SamplingParams(max_tokens=2, temperature=0.0))
    _run(engine)
    assert a.output_token_ids == [3, 4, 5] and b.output_token_ids == [8, 9]
    assert [c[0] for c in runner.calls] == ["prefill", "decode", "decode", "prefill", "decode"]
    assert runner.calls[1] == ("decode", [(0, [3], 2)])  # the last token at its position, slot 0
    assert a.finish_reason == b.finish_reason == "length"


def test_sequences_decode_together_and_a_finished_ones_slot_is_reused():
    engine, runner = _engine(num_seqs=2)
    a = engine.add_request([1, 2], SamplingParams(max_tokens=3, temperature=0.0))
    b = engine.add_request([7], SamplingParams(max_tokens=1, temperature=0.0))
    c = engine.add_request([20], SamplingParams(max_tokens=2, temperature=0.0))
    assert engine.step() == [a, b]  # both prompts in one step; b is done (one token)
    assert [s.slot for s in (a, b)] == [0, 1] and b.is_finished and c.slot is None
    engine.step()  # c takes b's slot; its prompt runs beside a's decode
    assert c.slot == 1 and runner.calls[-2:] == [("prefill", [20], 0, 1), ("decode", [(0, [3], 2)])]
    _run(engine)
    assert a.output_token_ids == [3, 4, 5] and b.output_token_ids == [8] and c.output_token_ids == [21, 22]
    assert ("decode", [(0, [4], 3), (1, [21], 1)]) in runner.calls  # one forward for both


def test_a_long_prompt_is_chunked_within_the_token_budget_beside_running_decodes():
    engine, runner = _engine(num_seqs=2, prefill_chunk=4, max_num_batched_tokens=5)
    a = engine.add_request([1], SamplingParams(max_tokens=6, temperature=0.0))
    engine.step()
    b = engine.add_request(list(range(1, 11)), SamplingParams(max_tokens=1, temperature=0.0))
    _run(engine)
    prefills = [c for c in runner.calls if c[0] == "prefill" and c[3] == b.slot and c[1] != [1]]
    assert [(c[1][0], c[2]) for c in prefills] == [(1, 0), (5, 4), (9, 8)]  # absolute chunks of 4
    assert a.output_token_ids == [2, 3, 4, 5, 6, 7] and b.output_token_ids == [11]
    # every step while b's prompt ran still decoded a: no stream freezes
    steps = [c for c in runner.calls if c[0] == "decode"]
    assert len(steps) == 5


def test_a_chunk_beyond_the_budget_runs_a_few_stages_a_step_beside_the_decodes():
    """Budget 3 tokens a step, 1 decode: 2 tokens x 4 stages of room, so a chunk of 4 runs 2
    stages a step (paused between), a chunk of 2 whole; a second prompt waits its turn (FIFO)."""
    engine, runner = _engine(num_seqs=3, prefill_chunk=4, max_num_batched_tokens=3)
    a = engine.add_request([1], SamplingParams(max_tokens=9, temperature=0.0))
    engine.step()  # nothing else runs: a's prompt whole
    b = engine.add_request(list(range(1, 11)), SamplingParams(max_tokens=1, temperature=0.0))
    c = engine.add_request([20, 21, 22, 23], SamplingParams(max_tokens=1, temperature=0.0))
    steps = []
    while not b.is_finished:
        runner.calls.clear()
        engine.step()
        steps.append([call for call in runner.calls if call[0] != "decode" or call[1][0][0] != a.slot])
        assert ("decode", [(a.slot, [a.output_token_ids[-2]], a.num_tokens - 2)]) in runner.calls  # a every step
    assert steps == [
        [("stages", 0, b.slot, 0, 2)],
        [("prefill", [1, 2, 3, 4], 0, b.slot)],
        [("stages", 4, b.slot, 0, 2)],
        [("prefill", [5, 6, 7, 8], 4, b.slot)],
        [("prefill", [9, 10], 8, b.slot)],  # 2 tokens x 4 stages fit
    ]
    assert b.output_token_ids == [11] and not c.output_token_ids  # c waited behind b
    _run(engine)
    assert c.output_token_ids == [24] and a.output_token_ids == list(range(2, 11))


def test_a_budget_below_one_stage_still_runs_one_stage_a_step():
    engine, runner = _engine(num_seqs=2, prefill_chunk=4, max_num_batched_tokens=1)
    a = engine.add_request([1], SamplingParams(max_tokens=8, temperature=0.0))
    engine.step()
    b = engine.add_request([5, 6, 7, 8], SamplingParams(max_tokens=1, temperature=0.0))
    _run(engine)
    stages = [c for c in runner.calls if c[0] in ("stages", "prefill") and c[-1 if c[0] == "prefill" else 2] == b.slot]
    assert stages == [("stages", 0, b.slot, 0, 1), ("stages", 0, b.slot, 1, 2), ("stages", 0, b.slot, 2, 3),
                      ("prefill", [5, 6, 7, 8], 0, b.slot)]
    assert b.output_token_ids == [9] and a.output_token_ids == list(range(2, 10))


@pytest.mark.parametrize("params, prompt, output, reason", [
    (SamplingParams(max_tokens=10, temperature=0.0), [28], [29, 30, 31], "stop"),  # end of sequence
    (SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True), [28], [29, 30, 31, 0, 1], "length"),
    (SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=[5]), [2], [3, 4, 5], "stop"),
])
def test_a_sequence_stops_where_vllm_stops_it(params, prompt, output, reason):
    engine, _ = _engine()
    seq = engine.add_request(prompt, params)
    _run(engine)
    assert (seq.output_token_ids, seq.finish_reason) == (output, reason)


def test_max_model_len_ends_a_sequence_and_bounds_prompts():
    engine, _ = _engine(max_model_len=6)
    seq = engine.add_request([1, 2, 3, 4], SamplingParams(max_tokens=10, temperature=0.0))
    _run(engine)
    assert seq.output_token_ids == [5, 6] and seq.finish_reason == "length"
    with pytest.raises(ValueError, match="7 tokens but max_model_len is 6"):
        engine.add_request(list(range(7)), SamplingParams())
    with pytest.raises(ValueError, match="token id 40 is outside the vocabulary"):
        engine.add_request([1, 40], SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        engine.add_request([], SamplingParams())


def test_finish_aborts_a_waiting_request_and_cuts_outputs():
    engine, _ = _engine()
    a = engine.add_request([1], SamplingParams(max_tokens=4, temperature=0.0))
    b = engine.add_request([2], SamplingParams(max_tokens=4, temperature=0.0))
    engine.finish(b, "abort")
    assert b.finish_reason == "abort" and list(engine.scheduler.waiting) == [a]
    engine.step()
    engine.step()
    engine.finish(a, "stop", num_output_tokens=1)  # a stop string matched after the first token
    assert a.output_token_ids == [2] and a.finish_reason == "stop" and not engine.has_unfinished()


class FixedDraft:
    """Drafts `right` correct tokens, then wrong ones, `k` in all."""

    def __init__(self, k: int, right: int):
        self.k, self.right = k, right

    def propose(self, ids: list[int], limit: int, hidden, cache=None) -> list[int]:
        good = [(ids[-1] + 1 + i) % V for i in range(self.right)]
        return (good + [0] * self.k)[: min(self.k, limit)]


def test_drafts_are_verified_and_counted():
    engine, runner = _engine(FixedDraft(k=3, right=2))
    seq = engine.add_request([1], SamplingParams(max_tokens=7, temperature=0.0))
    _run(engine)
    assert seq.output_token_ids == [2, 3, 4, 5, 6, 7, 8]  # the drafts change nothing
    first = runner.calls[1]
    assert first == ("decode", [(0, [2, 3, 4, 0], 1)])  # the last token and three drafted
    stats = engine.spec_stats
    assert stats.num_drafts == 2 and stats.num_accepted_tokens == 4  # two kept per step, +1 from the target each
    assert runner.calls[-1][1][0][1][0] == 5  # the second step starts after the accepted tokens


def test_the_draft_never_runs_past_max_tokens():
    engine, runner = _engine(FixedDraft(k=5, right=5))
    seq = engine.add_request([1], SamplingParams(max_tokens=3, temperature=0.0))
    _run(engine)
    assert seq.output_token_ids == [2, 3, 4]
    assert len(runner.calls[1][1][0][1]) == 2  # the last token + 1 draft: 1 emitted, the target gives the third


def test_logprobs_and_seeded_sampling():
    engine, _ = _engine()
    seq = engine.add_request([3], SamplingParams(max_tokens=2, temperature=0.0, logprobs=2))
    _run(engine)
    assert seq.output_token_ids == [4, 5]
    first = seq.output_logprobs[0]
    assert max(first, key=first.get) == 4 and len(first) == 2 and first[4] == pytest.approx(0.0, abs=1e-6)

    def draw(seed: int) -> list[int]:
        engine, _ = _engine()
        s = engine.add_request([3], SamplingParams(max_tokens=6, temperature=100.0, seed=seed))
        _run(engine)
        return s.output_token_ids

    assert draw(7) == draw(7) and len({tuple(draw(s)) for s in range(4)}) > 1
