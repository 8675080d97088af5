"""`--quantization gguf` on the embedded Q4_K_M GGUF: the body linears keep the file's own
blocks (Q5_0, Q8_0, Q4_K and Q6_K, mixed within fused q/k/v), the matrix they stand for is the
file's exactly, the fast path (fused step, screen, batching) gives the plain path's tokens,
and in fp32 the model gives transformers' greedy tokens on the same file."""

from __future__ import annotations

import gguf as gguf_py
import numpy as np
import pytest
import torch

from fastgemma import LLM, SamplingParams
from fastgemma.kernels import gguf, native
from fastgemma.kernels.schemes import GGUF
from fastgemma.weights.source import embedded_model_path

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def gguf_llm():
    return LLM(quantization="gguf", max_model_len=1024, max_num_seqs=4)


def test_body_linears_are_the_files_blocks(gguf_llm):
    reader = gguf_py.GGUFReader(str(embedded_model_path()))
    file = {t.name: t for t in reader.tensors}
    types = set()
    for i in range(len(gguf_llm.model.layers)):
        layer = gguf_llm.model.layers[i]
        modules = {
            "attn_q|attn_k|attn_v": layer.self_attn.qkv_proj, "attn_output": layer.self_attn.o_proj,
            "ffn_gate|ffn_up": layer.mlp.gate_up_proj, "ffn_down": layer.mlp.down_proj,
        }
        for names, module in modules.items():
            parts = [file[f"blk.{i}.{n}.weight"] for n in names.split("|")]
            assert module.scheme == GGUF and not hasattr(module, "weight")
            assert module.layout.tolist() == [[int(t.tensor_type), int(t.shape[1])] for t in parts]
            assert torch.equal(module.qweight, torch.from_numpy(np.concatenate([np.asarray(t.data).reshape(-1) for t in parts])))
            if i in (0, 1):  # the dense matrix: gguf-py's dequantisation, bit for bit
                want = torch.cat([torch.from_numpy(gguf_py.quants.dequantize(t.data, t.tensor_type)) for t in parts])
                dense = gguf.dequantize(module.qweight, module.layout, module.in_features, torch.float32, native.load())
                assert torch.equal(dense, want)
            types |= {t.tensor_type.name for t in parts}
    assert types == {"Q5_0", "Q8_0", "Q4_K", "Q6_K"}
    assert gguf_llm.quantization == "gguf"


def test_fast_path_and_batching_give_the_plain_paths_tokens(gguf_llm, eval_prompts):
    prompts = [gguf_llm.chat_prompt_ids([{"role": "user", "content": t[:400]}]) for t in eval_prompts[:3]]
    batched = [o.outputs[0].token_ids for o in gguf_llm.generate(prompts, GREEDY)]
    plain = LLM(quantization="gguf", max_model_len=1024, fused_decode=False, lm_head_screen=False)
    alone = [plain.generate([p], GREEDY)[0].outputs[0].token_ids for p in prompts]
    assert batched == alone


def test_fp32_matches_transformers_on_the_file(embedded_reference, eval_prompts):
    llm = LLM(quantization="gguf", dtype="float32", max_model_len=1024)
    for text in eval_prompts[:2]:
        ids = llm.chat_prompt_ids([{"role": "user", "content": text[:400]}])
        with torch.no_grad():
            gen = embedded_reference.generate(
                torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32, do_sample=False
            )
            ref = torch.log_softmax(embedded_reference(torch.tensor([ids])).logits[0].double(), -1)
        assert llm.generate([ids], GREEDY)[0].outputs[0].token_ids == gen[0, len(ids) :].tolist()
        ours = torch.tensor(llm.score(ids)[1:], dtype=torch.float64)
        want = ref[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
        assert (ours - want).abs().max() < 1e-3


def test_refused_off_a_gguf(tiny_gemma3):
    with pytest.raises(ValueError, match="gguf keeps a GGUF file's own blocks"):
        LLM(str(tiny_gemma3), dtype="float32", quantization="gguf")
