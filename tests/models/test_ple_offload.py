"""Gemma 4's PLE table in host memory (what CUDA does: only each step's rows travel) gives
the same bits as the table in the model: prefill logits, decode logits, greedy tokens, and
the fixed-shape step that stages the rows itself. Run on CPU, where both paths exist."""

from __future__ import annotations

import pytest
import torch

from fastgemma import LLM, SamplingParams
from fastgemma.engine.model_runner import ModelRunner
from fastgemma.engine.static_step import StaticStep

PROMPT = [3, 17, 99, 4, 250, 31, 7, 8, 9, 10, 11, 12]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_ple_table_in_host_memory_gives_the_same_bits(tiny_e4b, dtype):
    opts = dict(device="cpu", dtype=dtype, max_model_len=64, max_num_seqs=1)
    plain, host = LLM(str(tiny_e4b), **opts), LLM(str(tiny_e4b), **opts)
    host.model.to_device(torch.device("cpu"), ple_on_host=True)
    assert host.model.ple_host is not None and host.model.embed_tokens_per_layer is None
    assert plain.model.ple_host is None
    a, b = plain.runner.prefill(PROMPT), host.runner.prefill(PROMPT)
    assert torch.equal(a, b)
    assert torch.equal(plain.runner.decode(5, len(PROMPT)), host.runner.decode(5, len(PROMPT)))
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    assert plain.generate([PROMPT], params)[0].token_ids == host.generate([PROMPT], params)[0].token_ids


def test_the_fixed_shape_step_stages_the_rows_itself(tiny_e4b):
    llm = LLM(str(tiny_e4b), device="cpu", dtype="float32", max_model_len=64, kernels="torch")
    runner = ModelRunner(llm.model, 64, prefill_chunk=16, static_steps=True, enforce_eager=True)
    runner.prefill(PROMPT)
    want = StaticStep(llm.model, runner.cache, use_graph=False).run([5], len(PROMPT), want_logits=True)
    llm.model.to_device(torch.device("cpu"), ple_on_host=True)
    step = StaticStep(llm.model, runner.cache, use_graph=False)
    assert step.ple_input is not None
    got = step.run([5], len(PROMPT), want_logits=True)
    assert got.tokens == want.tokens and torch.equal(got.logits, want.logits) and torch.equal(got.hidden, want.hidden)
