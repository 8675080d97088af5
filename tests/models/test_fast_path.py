"""fp32: decoding with fastgemma's CPU kernels is token-identical to torch's stock kernels under greedy.

(In bf16 the two round differently — a GEMV sums in another order before rounding to
bf16 — so there the kernel choice is part of the model's numerics, the same for the plain
path and every fast path; `fastgemma bench decode` reports bf16 agreement on real prompts.)
"""

from __future__ import annotations

import pytest

from fastgemma import LLM, SamplingParams
from fastgemma.kernels import native


@pytest.mark.skipif(native.load() is None, reason=f"native kernels unavailable: {native.status()}")
@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_gemma3"])
def test_native_decode_matches_torch_kernels(name, request):
    dtype = "float32"
    folder = request.getfixturevalue(name)
    fast = LLM(str(folder), dtype=dtype, device="cpu", max_model_len=128)
    plain = LLM(str(folder), dtype=dtype, device="cpu", max_model_len=128, kernels="torch")
    assert fast.model.kernels.native and not plain.model.kernels.native
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)  # > 7 sliding windows
    prompts = [[1, 2, 3], list(range(5, 40)), [9] * 12]
    for a, b in zip(fast.generate(prompts, params), plain.generate(prompts, params)):
        assert a.token_ids == b.token_ids


@pytest.mark.skipif(native.load() is None, reason=f"native kernels unavailable: {native.status()}")
@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_e2b", "tiny_k_eq_v", "tiny_gemma3"])
def test_fused_decode_layers_match_per_op_path(name, request):
    """bf16: all layers in one native call round where the per-op path rounds: identical logits and tokens."""
    import torch

    folder = request.getfixturevalue(name)
    llm = LLM(str(folder), dtype="bfloat16", device="cpu", max_model_len=128)
    assert llm.model.fused_decode
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    prompts = [[1, 2, 3], list(range(5, 40)), [9] * 12]
    fused = [o.token_ids for o in llm.generate(prompts, params)]
    one_op = LLM(str(folder), dtype="bfloat16", device="cpu", max_model_len=128, fused_decode=False)
    assert not one_op.model.fused_decode
    per_op = [o.token_ids for o in one_op.generate(prompts, params)]
    assert fused == per_op
    # And one step's logits are bit-identical (the same rounding points, the same kernels).
    logits = []
    for engine in (one_op, llm):
        engine.runner.prefill(list(range(1, 20)))
        logits.append(engine.runner.decode(5, 19).float())
    assert torch.equal(*logits)
