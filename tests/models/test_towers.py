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
