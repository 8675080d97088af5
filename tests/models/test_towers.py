"""Loading the vision / audio towers: from checkpoints and quantised folders, with clear errors."""

from __future__ import annotations

import pytest
import torch

from fastgemma import SamplingParams
from fastgemma.models.towers import load_towers
from fastgemma.weights.checkpoint import load_config, open_tensors, tower_name
from fastgemma.weights.source import resolve_model
from tests.media_samples import make_image


def test_towers_load_and_a_missing_tensor_is_named(tiny_multimodal):
    source = resolve_model(str(tiny_multimodal))
    config = load_config(source)
    tensors = open_tensors(source, tower_name)
    assert any(k.startswith("vision_tower.") for k in tensors) and any(k.startswith("embed_audio.") for k in tensors)
    towers = load_towers(config, tensors, torch.float32, torch.device("cpu"))
    assert towers.has_vision and towers.has_audio
    tensors = {k: tensors[k] for k in tensors if k != "embed_vision.embedding_projection.weight"}
    with pytest.raises(ValueError, match="embed_vision.embedding_projection.weight"):
        load_towers(config, tensors, torch.float32, torch.device("cpu"))


def test_quantized_folder_keeps_the_towers(tiny_multimodal, mm_llm, tmp_path):
    from fastgemma import LLM
    from fastgemma.weights.quantize import write_quantized_folder

    out = write_quantized_folder(str(tiny_multimodal), "int8", tmp_path / "q8")
    llm = LLM(str(out), dtype="float32", max_model_len=512)
    assert llm.quantization == "int8" and llm.processor is not None
    prompt = {"prompt": "<|image|> What?", "multi_modal_data": {"image": [make_image()]}}
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=0)
    ours, ref = llm.generate(prompt, params)[0], mm_llm.generate(prompt, params)[0]
    assert ours.prompt_token_ids == ref.prompt_token_ids
    # the towers are unquantised: only the decoder's int8 rounding separates the two
    a, b = (next(iter(o.outputs[0].logprobs[0].values())) for o in (ours, ref))
    assert abs(a - b) < 0.05


def test_vision_attention_is_eager_in_fp32_and_sdpa_in_bf16(tiny_multimodal, mm_llm):
    """fp32: the reference's eager maths (bit-identical); bf16: SDPA, whose rows are as close
    to the fp32 rows as eager bf16's are."""
    from fastgemma.models.towers import MultimodalTowers

    source = resolve_model(str(tiny_multimodal))
    config, tensors = load_config(source), open_tensors(source, tower_name)
    fp32, bf16 = (load_towers(config, tensors, dt, torch.device("cpu")) for dt in (torch.float32, torch.bfloat16))
    assert fp32.vision_tower.config._attn_implementation == "eager"
    assert bf16.vision_tower.config._attn_implementation == "sdpa"
    assert bf16.audio_tower.config._attn_implementation == "eager"
    eager_bf16 = MultimodalTowers(config, vision_attention="eager")
    eager_bf16.load_state_dict(bf16.state_dict(), assign=True)
    ids, mm = mm_llm.encode_inputs({"prompt": "<|image|>", "multi_modal_data": {"image": [make_image()]}})
    with torch.inference_mode():
        ref, sdpa, eager = (t.eval().soft_embeddings(torch.tensor(ids), mm)[0].float() for t in (fp32, bf16, eager_bf16))
    assert ref.shape[0] > 10
    assert (sdpa - ref).norm() <= 1.25 * (eager - ref).norm() and not torch.equal(sdpa, eager)
