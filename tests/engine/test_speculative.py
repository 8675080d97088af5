"""Speculative decoding: acceptance rules, statistics, and output identity with plain decoding.

Identity is by construction (engine/speculative.py): a verification's rows are bit for bit
the one-token steps' rows. Checked here on tiny random models (rings of 8 slots, so drafts
cross the sliding window constantly) for every decode path — fused bf16, per-op bf16, per-op
fp32 — with the n-gram drafter and with a drafter that is partly right, so that every
acceptance length and every rollback happens.
"""

from __future__ import annotations

import math

import pytest
import torch

from fastgemma import LLM, SamplingParams
from fastgemma.engine.speculative import SpecStats, accept_greedy, accept_sampled
from fastgemma.kernels import native

needs_native = pytest.mark.skipif(native.load() is None, reason=f"native kernels unavailable: {native.status()}")


def test_accept_greedy_keeps_the_agreeing_prefix_and_the_targets_next_token():
    assert accept_greedy([5, 6, 7], [5, 6, 9, 1]) == [5, 6, 9]
    assert accept_greedy([5, 6, 7], [5, 6, 7, 1]) == [5, 6, 7, 1]
    assert accept_greedy([5, 6, 7], [4, 6, 7, 1]) == [4]
    assert accept_greedy([], [3]) == [3]


def test_stats_per_position_counts_only_drafts_that_reached_it():
    s = SpecStats()
    s.record(4, 4)
    s.record(2, 1)
    d = s.as_dict()
    assert d["num_drafts"] == 2 and d["num_draft_tokens"] == 6 and d["num_accepted_tokens"] == 5
    assert d["mean_acceptance_length"] == 3.5 and d["acceptance_per_position"] == [1.0, 0.5, 1.0, 1.0]
    before = s.snapshot()
    s.record(3, 0)
    assert s.since(before).as_dict()["acceptance_per_position"] == [0.0, 0.0, 0.0]


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of Pearson's chi-square test (Wilson-Hilferty normal approximation)."""
    n = counts.sum()
    keep = probs > 0
    expected = probs[keep] * n
    stat = float(((counts[keep] - expected) ** 2 / expected).sum())
    k = int(keep.sum()) - 1
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_rejection_sampling_preserves_the_target_distribution():
    """First emitted token ~ p_0 whatever the draft; given d_0 kept, the next ~ p_1."""
    g = torch.Generator().manual_seed(0)
    V = 12
    logits = torch.randn(3, V, generator=g) * 1.5
    params = SamplingParams(temperature=0.8, top_k=9)
    from fastgemma.engine.sampler import filtered_probs

    p0, p1 = filtered_probs(logits[0], params), filtered_probs(logits[1], params)
    draft = [int(torch.argsort(p0)[-2]), 3]  # a likely but not the likeliest token
    first, second = torch.zeros(V), torch.zeros(V)
    for _ in range(20000):
        out = accept_sampled(draft, logits, params, g)
        first[out[0]] += 1
        if out[0] == draft[0]:
            second[out[1]] += 1
    assert _chi_square_p(first, p0) > 1e-3
    assert _chi_square_p(second, p1) > 1e-3
    assert first[p0 == 0].sum() == 0 and second[p1 == 0].sum() == 0  # top-k kept


class _PartlyRight:
    """Drafts the plain path's own continuation with about one token in four wrong (where,
    varies with the call), so that verifications keep 0..K tokens and roll back."""

    def __init__(self, plain: dict[tuple[int, ...], list[int]], k: int):
        self.plain, self.k, self.calls = plain, k, 0

    def propose(self, ids: list[int], limit: int | None = None, hidden=None, cache=None) -> list[int]:
        self.calls += 1
        for prompt, out in self.plain.items():
            n = len(prompt)
            if tuple(ids[:n]) == prompt:
                done = len(ids) - n
                draft = out[done : done + min(self.k, limit or self.k)]
                return [(t + 1) % 512 if (3 * i + self.calls) % 4 == 0 else t for i, t in enumerate(draft)]
        return []


PROMPTS = [[1, 2, 3], list(range(5, 40)), [9, 4] * 6, [7] * 20]


@needs_native
@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_e2b", "tiny_k_eq_v", "tiny_gemma3"])
@pytest.mark.parametrize("path", ["fused bf16", "per-op bf16", "per-op fp32"])
def test_speculative_greedy_is_identical_to_plain(name, path, request):
    folder = request.getfixturevalue(name)
    dtype = "float32" if "fp32" in path else "bfloat16"
    params = SamplingParams(max_tokens=70, temperature=0.0, ignore_eos=True)  # > 8 sliding windows
    plain = LLM(str(folder), dtype=dtype, device="cpu", max_model_len=128)
    expected = [o.token_ids for o in plain.generate(PROMPTS, params)]
    for k in (1, 3, 7):
        spec = LLM(str(folder), dtype=dtype, device="cpu", max_model_len=128, speculative="ngram",
                   num_speculative_tokens=k, prompt_lookup_min=1, fused_decode=path != "per-op bf16")
        assert spec.model.fused_decode == (path == "fused bf16")
        assert [o.token_ids for o in spec.generate(PROMPTS, params)] == expected
        spec.engine.proposer = _PartlyRight({tuple(p): e for p, e in zip(PROMPTS, expected)}, k)
        assert [o.token_ids for o in spec.generate(PROMPTS, params)] == expected
        stats = spec.engine.spec_stats  # some drafts kept up to 3 tokens, some were cut short
        assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens and stats.accepted_per_position[min(k, 3) - 1] > 0


@needs_native
@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_gemma3"])
def test_verification_rows_are_the_decode_steps_bits(name, request):
    """Logits of a K + 1 verification equal, bit for bit, K + 1 one-token steps (past the window)."""
    folder = request.getfixturevalue(name)
    llm = LLM(str(folder), dtype="bfloat16", device="cpu", max_model_len=128, speculative="ngram",
              num_speculative_tokens=5)
    runner, ids = llm.runner, list(range(3, 30))
    draft = [11, 12, 13, 14, 15]
    runner.prefill(ids[:-1])
    rows = runner.verify([ids[-1], *draft], len(ids) - 1, greedy=False)
    runner.prefill(ids[:-1])
    steps = [runner.decode(t, len(ids) - 1 + i) for i, t in enumerate([ids[-1], *draft])]
    assert torch.equal(rows, torch.stack(steps))
    greedy = runner.verify([ids[-1], *draft], len(ids) - 1, greedy=True)
    assert greedy == torch.argmax(rows, dim=-1).tolist()


@needs_native
def test_logprobs_stop_strings_and_sampling_with_speculation(tiny_gemma3):
    plain = LLM(str(tiny_gemma3), dtype="bfloat16", device="cpu", max_model_len=128)
    spec = LLM(str(tiny_gemma3), dtype="bfloat16", device="cpu", max_model_len=128, speculative="ngram",
               num_speculative_tokens=4, prompt_lookup_min=1)
    prompt = [9, 4] * 6
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=2)
    a, b = plain.generate([prompt], params)[0].outputs[0], spec.generate([prompt], params)[0].outputs[0]
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    text = a.text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    if stop.strip():
        params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, stop=[stop])
        a, b = plain.generate([prompt], params)[0].outputs[0], spec.generate([prompt], params)[0].outputs[0]
        assert (a.text, a.token_ids, a.finish_reason) == (b.text, b.token_ids, b.finish_reason)
    sampled = spec.generate([prompt], SamplingParams(max_tokens=30, temperature=1.0, seed=3, ignore_eos=True))
    assert len(sampled[0].outputs[0].token_ids) == 30


def test_speculative_options_are_validated():
    with pytest.raises(ValueError, match="speculative"):
        LLM(speculative="eagle")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLM(speculative="ngram", num_speculative_tokens=16)
    with pytest.raises(ValueError, match="kernels"):
        LLM(speculative="ngram", kernels="torch", dtype="float32")
