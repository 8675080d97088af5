"""`ModelRunner` on a tiny random Gemma 3: prefill in chunks, decode and verification rows,
and prompt log-probs agree with each other (the engine's loop is not involved)."""

from __future__ import annotations

import pytest
import torch

from fastgemma.config import EngineConfig
from fastgemma.engine.model_runner import ModelRunner
from fastgemma.kernels import native
from fastgemma.weights import load

PROMPT = [2, 17, 301, 5, 88, 9, 40, 7, 120, 33, 61, 12]


@pytest.fixture(scope="module")
def loaded(tiny_gemma3):
    return load(EngineConfig(model=str(tiny_gemma3), dtype="float32", device="cpu", max_model_len=64))


def _runner(loaded, **kw) -> ModelRunner:
    return ModelRunner(loaded.model, loaded.max_model_len, **kw)


def test_chunked_prefill_matches_one_chunk(loaded):
    whole = _runner(loaded, prefill_chunk=512)
    chunked = _runner(loaded, prefill_chunk=5)
    a, b = whole.prefill(PROMPT), chunked.prefill(PROMPT)
    assert a.shape == (loaded.spec.vocab_size,)
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    # the caches agree too: the next step's logits match
    assert torch.allclose(whole.decode(3, len(PROMPT)), chunked.decode(3, len(PROMPT)), atol=1e-5, rtol=1e-5)


def test_decode_continues_prefill(loaded):
    runner = _runner(loaded)
    runner.prefill(PROMPT[:-1])
    stepped = runner.decode(PROMPT[-1], len(PROMPT) - 1)
    fresh = _runner(loaded).prefill(PROMPT)
    assert torch.allclose(stepped, fresh, atol=1e-5, rtol=1e-5)
    assert runner.last_hidden.shape == (1, loaded.spec.hidden_size)


@pytest.mark.skipif(native.load() is None, reason=f"native kernels unavailable: {native.status()}")
def test_verification_rows_are_decode_steps_bit_for_bit(tiny_gemma3):
    """With the row-invariant native kernels, K + 1 rows at once give each row's decode-step bits."""
    loaded = load(EngineConfig(model=str(tiny_gemma3), dtype="float32", device="cpu", max_model_len=64))
    assert loaded.model.kernels.native
    ids = [3, 99, 4, 250]
    batched = _runner(loaded, num_speculative_tokens=len(ids))
    batched.prefill(PROMPT)
    rows = batched.verify(ids, len(PROMPT), greedy=False)
    single = _runner(loaded)
    single.prefill(PROMPT)
    steps = torch.stack([single.decode(t, len(PROMPT) + i) for i, t in enumerate(ids)])
    assert rows.shape == (len(ids), loaded.spec.vocab_size) and torch.equal(rows, steps)
    assert batched.verify(ids, len(PROMPT), greedy=True) == torch.argmax(steps, dim=-1).tolist()


def test_prompt_logprobs_score_each_token_given_its_prefix(loaded):
    runner = _runner(loaded, prefill_chunk=5, logits_chunk=3)
    scored = runner.prompt_logprobs(PROMPT, top=2)
    assert scored[0] is None and len(scored) == len(PROMPT)
    for i in (1, 6, len(PROMPT) - 1):
        logp = torch.log_softmax(_runner(loaded).prefill(PROMPT[:i]).float(), dim=-1)
        entry = scored[i]
        assert entry.logprob == pytest.approx(float(logp[PROMPT[i]]), abs=1e-4)
        assert entry.rank == int((logp > logp[PROMPT[i]]).sum()) + 1
        assert [t for t, _ in entry.top] == torch.topk(logp, 2).indices.tolist()
