"""MTP speculative decoding with a tiny random Gemma 4 target and a tiny random assistant.

Greedy output identical to plain decoding on every decode path (fused bf16, per-op bf16,
per-op fp32) and K; each round's drafter reads exactly the accepted context — the target's
K/V of positions < p (rejected tokens' entries excluded, the oldest sliding entry not yet
overwritten) and the hidden state a plain prefill of the same ids gives.
"""

from __future__ import annotations

import pytest
import torch

from fastgemma import LLM, SamplingParams
from fastgemma.kernels import native
from tests import tiny_models

needs_native = pytest.mark.skipif(native.load() is None, reason=f"native kernels unavailable: {native.status()}")

PROMPTS = [[1, 2, 3], list(range(5, 40)), [9, 4] * 6, [7] * 20]


def _assistant(target_config, tmp_path_factory, seed: int):
    config = tiny_models.gemma4_assistant_config(target_config, ordered=seed % 2 == 1)
    return tiny_models.save_tiny_assistant(config, tmp_path_factory.mktemp("assistant"), seed=seed)


@pytest.fixture(scope="module")
def drafters(tiny_e4b, tiny_e2b, tmp_path_factory):
    return {
        "tiny_e4b": (tiny_e4b, _assistant(tiny_models.gemma4_e4b_like_config(), tmp_path_factory, 11)),
        "tiny_e2b": (tiny_e2b, _assistant(tiny_models.gemma4_e2b_like_config(), tmp_path_factory, 12)),
    }


@needs_native
@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_e2b"])
@pytest.mark.parametrize("path", ["fused bf16", "per-op bf16", "per-op fp32"])
def test_mtp_greedy_is_identical_to_plain(name, path, drafters):
    target, assistant = drafters[name]
    dtype = "float32" if "fp32" in path else "bfloat16"
    params = SamplingParams(max_tokens=70, temperature=0.0, ignore_eos=True)  # > 8 sliding windows
    plain = LLM(str(target), dtype=dtype, device="cpu", max_model_len=128)
    expected = [o.token_ids for o in plain.generate(PROMPTS, params)]
    for k in (1, 4):
        spec = LLM(str(target), dtype=dtype, device="cpu", max_model_len=128, speculative="mtp",
                   draft_model=str(assistant), num_speculative_tokens=k, fused_decode=path != "per-op bf16")
        assert spec.model.fused_decode == (path == "fused bf16")
        assert [o.token_ids for o in spec.generate(PROMPTS, params)] == expected
        assert spec.engine.spec_stats.num_drafts > 0


@needs_native
def test_each_round_reads_exactly_the_accepted_context(drafters):
    target, assistant = drafters["tiny_e4b"]
    kw = dict(dtype="float32", device="cpu", max_model_len=128, speculative="mtp", draft_model=str(assistant),
              num_speculative_tokens=4)
    spec, ref = LLM(str(target), **kw), LLM(str(target), **kw)
    proposer = spec.engine.proposer
    propose, rounds = proposer.propose, []

    def checked(ids, limit=None, hidden=None, cache=None):  # cache: the sequence's slot (requests batch)
        p = len(ids) - 1
        ref.runner.prefill(ids[:-1])
        want = proposer.assistant.context_kv(ref.spec, ref.runner.cache, p)
        got = proposer.assistant.context_kv(spec.spec, cache, p)
        for layer_type in want:
            for a, b in zip(got[layer_type], want[layer_type]):
                assert a.shape == b.shape and torch.allclose(a, b, atol=1e-4), (p, layer_type)
        assert torch.allclose(hidden, ref.runner.last_hidden[-1], atol=1e-4), p  # prefill vs decode summation order
        rounds.append(p)
        return propose(ids, limit, hidden, cache)

    proposer.propose = checked
    spec.generate(PROMPTS, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    stats = spec.engine.spec_stats
    assert len(rounds) == stats.num_drafts > 20 and stats.num_accepted_tokens < stats.num_draft_tokens  # rejections


@needs_native
def test_mtp_sampling_runs_and_is_seeded(drafters):
    target, assistant = drafters["tiny_e4b"]
    spec = LLM(str(target), dtype="bfloat16", device="cpu", max_model_len=128, speculative="mtp",
               draft_model=str(assistant), num_speculative_tokens=3)
    params = SamplingParams(max_tokens=30, temperature=1.0, seed=3, ignore_eos=True)
    a = spec.generate([PROMPTS[1]], params)[0].outputs[0].token_ids
    b = spec.generate([PROMPTS[1]], params)[0].outputs[0].token_ids
    assert len(a) == 30 and a == b
