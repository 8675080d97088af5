"""Presets: JSON engine options for `fastgemma serve --preset`, checked against `EngineConfig`."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from fastgemma.config import EngineConfig, spec_of
from fastgemma.preset import Preset, load_preset, serve_option_names, write_preset


def test_round_trip(tmp_path):
    preset = Preset("some/model", {"quantization": "int8", "speculative": "ngram", "num_speculative_tokens": 8})
    path = write_preset(tmp_path / "p.json", preset, measured={"tps": 150.0})
    assert load_preset(path) == preset
    assert json.loads(path.read_text())["measured"] == {"tps": 150.0}


def test_option_names_are_the_engines_serve_options():
    assert serve_option_names() == [f.name for f in fields(EngineConfig) if spec_of(f).flag]
    assert "device" not in serve_option_names() and "model" not in serve_option_names()


@pytest.mark.parametrize("content, words", [
    ("{not json", "not valid JSON"),
    ('{"options": {}}', "not a fastgemma preset"),
    ('{"fastgemma_preset": 1, "options": {"quantisation": "int8"}}', "unknown option 'quantisation'"),
    ('{"fastgemma_preset": 1, "options": {"quantization": "int3"}}', "unknown quantization 'int3'"),
    ('{"fastgemma_preset": 1, "options": {"speculative": "ngram", "kernels": "torch"}}', "kernels=auto"),
    ('{"fastgemma_preset": 1, "model": 3}', "\"model\" must be a string"),
    ('{"fastgemma_preset": 1, "options": []}', "\"options\" must be an object"),
])
def test_bad_presets_name_the_problem(tmp_path, content, words):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=words):
        load_preset(path)


def test_missing_preset(tmp_path):
    with pytest.raises(ValueError, match="cannot read preset"):
        load_preset(tmp_path / "none.json")
