"""`fastgemma convert` / `quantize` write lean folders: the model's dtype, not fp32, normal
file permissions, and what they write loads to the same model as the GGUF does."""

from __future__ import annotations

import json
import os

import pytest

from fastgemma import LLM, SamplingParams
from fastgemma.kernels import native
from fastgemma.weights.convert import convert_to_hf_folder
from fastgemma.weights.quantize import write_quantized_folder

needs_native = pytest.mark.skipif(native.load() is None, reason=f"native kernels unavailable: {native.status()}")
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def _header_dtypes(path) -> set[str]:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


@needs_native
def test_convert_and_quantize_write_bf16_with_normal_permissions_and_load_as_the_gguf(tmp_path):
    old = os.umask(0o022)
    try:
        converted = convert_to_hf_folder(None, tmp_path / "bf16")
        quantized = write_quantized_folder(None, "int8", tmp_path / "int8")
    finally:
        os.umask(old)
    for folder in (converted, quantized):
        for f in folder.iterdir():
            assert f.stat().st_mode & 0o777 == 0o644, f
    assert _header_dtypes(converted / "model.safetensors") == {"BF16"}
    assert (converted / "model.safetensors").stat().st_size < 560 * 2**20  # 268M parameters in bf16
    assert _header_dtypes(quantized / "model.safetensors") == {"BF16", "I8", "F32"}  # + codes, fp32 scales
    assert json.loads((converted / "config.json").read_text())["dtype"] == "bfloat16"
    prompt = [[2, 818, 5279, 529, 7001, 563]]
    opts = dict(dtype="bfloat16", max_model_len=256, max_num_seqs=1)
    want = LLM(**opts).generate(prompt, GREEDY)[0].token_ids
    assert LLM(str(converted), **opts).generate(prompt, GREEDY)[0].token_ids == want
    want_q = LLM(quantization="int8", **opts).generate(prompt, GREEDY)[0].token_ids
    assert LLM(str(quantized), **opts).generate(prompt, GREEDY)[0].token_ids == want_q
