"""Quantised checkpoints (weights/quantize.py): the folder `fastgemma quantize` writes loads
as the same model that `--quantization` builds at load time, and bad requests say what to do."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from fastgemma import LLM, SamplingParams
from fastgemma.cli.main import app
from fastgemma.weights.quantize import is_quantized_linear, write_quantized_folder

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = [[2, 17, 301, 5], [2, 9, 9, 44, 120, 7]]


def test_quantised_names():
    assert is_quantized_linear("layers.3.self_attn.k_proj.weight")
    assert is_quantized_linear("layers.0.mlp.down_proj.weight")
    assert is_quantized_linear("layers.1.per_layer_projection.weight")
    assert is_quantized_linear("per_layer_model_projection.weight")
    assert not is_quantized_linear("embed_tokens.weight")
    assert not is_quantized_linear("layers.0.input_layernorm.weight")
    assert not is_quantized_linear("lm_head.weight")


@pytest.mark.parametrize("fixture", ["tiny_gemma3", "tiny_e4b"])
@pytest.mark.parametrize("scheme", ["int8", "int4-g32"])
def test_written_folder_is_the_load_time_quantised_model(fixture, scheme, request, tmp_path):
    source = request.getfixturevalue(fixture)
    folder = write_quantized_folder(str(source), scheme, tmp_path / "q")
    assert json.loads((folder / "config.json").read_text())["quantization_config"] == {
        "quant_method": "fastgemma", "scheme": scheme,
    }
    at_load = LLM(str(source), dtype="float32", device="cpu", max_model_len=64, quantization=scheme)
    stored = LLM(str(folder), dtype="float32", device="cpu", max_model_len=64)
    assert stored.quantization == at_load.quantization == scheme
    a = dict(at_load.model.named_buffers())
    b = dict(stored.model.named_buffers())
    codes = [n for n in a if n.endswith(".qweight") or n.endswith(".scales")]
    assert codes and all(torch.equal(a[n], b[n]) for n in codes)
    plain = LLM(str(source), dtype="float32", device="cpu", max_model_len=64)
    ours = [o.token_ids for o in stored.generate(PROMPTS, GREEDY)]
    assert ours == [o.token_ids for o in at_load.generate(PROMPTS, GREEDY)]
    # the quantised model is a different model: its logits move (its tokens may or may not)
    assert stored.score(PROMPTS[1])[1:] != plain.score(PROMPTS[1])[1:]


def test_quantised_folder_refuses_another_scheme(tiny_gemma3, tmp_path):
    folder = write_quantized_folder(str(tiny_gemma3), "int8", tmp_path / "q")
    with pytest.raises(ValueError, match="already quantised"):
        LLM(str(folder), dtype="float32", device="cpu", max_model_len=64, quantization="int4-g32")
    with pytest.raises(ValueError, match="already quantised"):
        write_quantized_folder(str(folder), "int8", tmp_path / "again")


def test_gguf_is_not_a_folder_scheme(tiny_gemma3, tmp_path):
    with pytest.raises(ValueError, match="load the .gguf with --quantization gguf"):
        write_quantized_folder(None, "gguf", tmp_path / "q")
    folder = write_quantized_folder(str(tiny_gemma3), "int8", tmp_path / "q8")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["scheme"] = "gguf"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="which no folder stores"):
        LLM(str(folder), dtype="float32", device="cpu", max_model_len=64)


def test_cli_quantize_errors_are_one_line(tiny_gemma3, tmp_path):
    result = CliRunner().invoke(app, ["quantize", str(tiny_gemma3), "--scheme", "int5", "--out", str(tmp_path / "x")])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code != 0 and len(lines) == 1 and "int4-g32" in lines[0], result.output
    result = CliRunner().invoke(app, ["quantize", str(tiny_gemma3), "--scheme", "int8", "--out", str(tmp_path / "y")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "y" / "config.json").is_file()
