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
    assert fast.model.use_native and not plain.model.use_native
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)  # > 7 sliding windows
    prompts = [[1, 2, 3], list(range(5, 40)), [9] * 12]
    for a, b in zip(fast.generate(prompts, params), plain.generate(prompts, params)):
        assert a.token_ids == b.token_ids
