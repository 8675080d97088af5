"""`LLMEngine` on its own, with a tiny scripted runner (no model): scheduling, stopping,
drafting and log-probs are the engine's, so they are checked without any numerics."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fastgemma.engine.llm_engine import LLMEngine
from fastgemma.engine.sampling_params import SamplingParams
from fastgemma.engine.sequence import Status

V = 32  # vocabulary
EOS = 31


class CountingRunner:
    """Predicts (token + 1) % V after every token: logits one-hot at that id. Records calls."""

    device = torch.device("cpu")

    def __init__(self, max_model_len: int = 64):
        self.max_model_len = max_model_len
        self.cache = SimpleNamespace(max_decode_like_tokens=8)
        self.calls: list[tuple[str, list[int], int]] = []
        self.last_hidden: torch.Tensor | None = None

    @staticmethod
    def _rows(ids: list[int]) -> torch.Tensor:
        rows = torch.full((len(ids), V), -10.0)
        rows[torch.arange(len(ids)), torch.tensor([(t + 1) % V for t in ids])] = 10.0
        return rows

    def prefill(self, ids: list[int], start: int = 0, multimodal=None) -> torch.Tensor:
        self.calls.append(("prefill", list(ids), start))
        self.last_hidden = torch.zeros(len(ids), 4)
        return self._rows(ids)[-1]

    def verify(self, ids: list[int], position: int, greedy: bool):
        self.calls.append(("verify", list(ids), position))
        self.last_hidden = torch.zeros(len(ids), 4)
        rows = self._rows(ids)
        return torch.argmax(rows, dim=-1).tolist() if greedy else rows


def _engine(proposer=None, max_model_len: int = 64) -> tuple[LLMEngine, CountingRunner]:
    runner = CountingRunner(max_model_len)
    return LLMEngine(runner, (EOS,), V, proposer), runner  # type: ignore[arg-type]


def _run(engine: LLMEngine) -> None:
    while engine.has_unfinished():
        engine.step()


def test_requests_run_one_at_a_time_in_order():
    engine, runner = _engine()
    a = engine.add_request([1, 2], SamplingParams(max_tokens=3, temperature=0.0))
    b = engine.add_request([7], SamplingParams(max_tokens=2, temperature=0.0))
    assert engine.next_sequence() is a and b.status is Status.WAITING
    _run(engine)
    assert a.output_token_ids == [3, 4, 5] and b.output_token_ids == [8, 9]
    assert [c[0] for c in runner.calls] == ["prefill", "verify", "verify", "prefill", "verify"]
    assert runner.calls[1] == ("verify", [3], 2)  # the last token at its position
    assert a.finish_reason == b.finish_reason == "length"


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
    assert b.finish_reason == "abort" and engine.next_sequence() is a
    engine.step()
    engine.step()
    engine.finish(a, "stop", num_output_tokens=1)  # a stop string matched after the first token
    assert a.output_token_ids == [2] and a.finish_reason == "stop" and not engine.has_unfinished()


class FixedDraft:
    """Drafts `right` correct tokens, then wrong ones, `k` in all."""

    def __init__(self, k: int, right: int):
        self.k, self.right = k, right

    def propose(self, ids: list[int], limit: int, hidden) -> list[int]:
        good = [(ids[-1] + 1 + i) % V for i in range(self.right)]
        return (good + [0] * self.k)[: min(self.k, limit)]


def test_drafts_are_verified_and_counted():
    engine, runner = _engine(FixedDraft(k=3, right=2))
    seq = engine.add_request([1], SamplingParams(max_tokens=7, temperature=0.0))
    _run(engine)
    assert seq.output_token_ids == [2, 3, 4, 5, 6, 7, 8]  # the drafts change nothing
    first = runner.calls[1]
    assert first == ("verify", [2, 3, 4, 0], 1)  # the last token and three drafted
    stats = engine.spec_stats
    assert stats.num_drafts == 2 and stats.num_accepted_tokens == 4  # two kept per step, +1 from the target each
    assert runner.calls[-1][1][0] == 5  # the second step starts after the accepted tokens


def test_the_draft_never_runs_past_max_tokens():
    engine, runner = _engine(FixedDraft(k=5, right=5))
    seq = engine.add_request([1], SamplingParams(max_tokens=3, temperature=0.0))
    _run(engine)
    assert seq.output_token_ids == [2, 3, 4]
    assert len(runner.calls[1][1]) == 2  # the last token + 1 draft: 1 emitted, the target gives the third


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
