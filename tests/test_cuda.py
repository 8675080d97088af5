"""The same decoder on a CUDA device (skipped without one): fp32 logits vs transformers, bf16 runs."""

from __future__ import annotations

import pytest
import torch

from fastgemma import LLM, SamplingParams
from tests.tiny_models import reference_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_gemma3"])
def test_cuda_fp32_matches_transformers(name, request):
    folder = request.getfixturevalue(name)
    llm = LLM(str(folder), dtype="float32", device="cuda", max_model_len=64)
    ids = torch.randint(0, llm.spec.vocab_size, (40,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = reference_model(folder)(ids[None]).logits[0]
    got = llm.runner.prompt_logprobs(ids.tolist())
    ref_lp = torch.log_softmax(ref[:-1].double(), -1).gather(1, ids[1:, None])[:, 0]
    ours = torch.tensor([e.logprob for e in got[1:]], dtype=torch.float64)
    assert (ours - ref_lp).abs().max() < 1e-4


def test_cuda_bf16_generates(tiny_e4b):
    llm = LLM(str(tiny_e4b), dtype="bfloat16", device="cuda", max_model_len=128)
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))[0]
    assert len(out.token_ids) == 40
    sampled = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8, temperature=1.0, seed=3, ignore_eos=True))[0]
    assert len(sampled.token_ids) == 8
