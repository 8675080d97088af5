"""`fastgemma serve`: every engine option has its flag, and `--preset` fills what the command
line leaves at its default (the server itself is replaced by a recorder here)."""

from __future__ import annotations

import json
from dataclasses import asdict, fields

import pytest
import typer
from typer.testing import CliRunner

from fastgemma.cli.main import app
from fastgemma.config import EngineConfig, spec_of
from fastgemma.preset import serve_option_names

runner = CliRunner()


def _serve_flags() -> set[str]:
    command = typer.main.get_command(app).commands["serve"]
    return {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}


def test_every_engine_flag_is_a_serve_flag_and_a_serve_option():
    flagged = [f for f in fields(EngineConfig) if spec_of(f).flag]
    assert {spec_of(f).flag for f in flagged} <= _serve_flags()
    assert [f.name for f in flagged] == serve_option_names()


@pytest.fixture
def recorded(monkeypatch):
    calls: list[dict] = []
    def record(config, **settings):  # the engine options as run_server gets them, by name
        calls.append({**asdict(config), **settings})

    monkeypatch.setattr("fastgemma.server.run_server", record)
    monkeypatch.delenv("MODEL_ID", raising=False)
    return calls


def test_preset_fills_defaults_and_flags_win(tmp_path, recorded):
    preset = tmp_path / "p.json"
    preset.write_text(json.dumps({"fastgemma_preset": 1, "model": "tuned/model", "options": {
        "quantization": "int8", "speculative": "ngram", "num_speculative_tokens": 8, "lm_head_screen": False}}))
    result = runner.invoke(app, ["serve", "--preset", str(preset), "--num-speculative-tokens", "3"])
    assert result.exit_code == 0, result.output
    kw = recorded[0]
    assert kw["model"] == "tuned/model" and kw["quantization"] == "int8" and kw["speculative"] == "ngram"
    assert kw["num_speculative_tokens"] == 3 and kw["lm_head_screen"] is False  # the flag won; the preset's bool applied
    assert kw["dtype"] == "auto" and kw["threads"] is None

    result = runner.invoke(app, ["serve", "other/model", "--preset", str(preset), "--lm-head-screen", "-q", "none"])
    kw = recorded[1]
    assert kw["model"] == "other/model" and kw["lm_head_screen"] is True and kw["quantization"] == "none"


def test_preset_model_beats_the_environment(tmp_path, recorded, monkeypatch):
    preset = tmp_path / "p.json"
    preset.write_text(json.dumps({"fastgemma_preset": 1, "model": None, "options": {"threads": 1}}))
    monkeypatch.setenv("MODEL_ID", "env/model")
    assert runner.invoke(app, ["serve", "--preset", str(preset)]).exit_code == 0
    assert recorded[0]["model"] == "env/model" and recorded[0]["threads"] == 1  # no model in the preset: $MODEL_ID


def test_bad_preset_is_one_line(tmp_path, recorded):
    preset = tmp_path / "p.json"
    preset.write_text(json.dumps({"fastgemma_preset": 1, "options": {"warp_speed": True}}))
    result = runner.invoke(app, ["serve", "--preset", str(preset)])
    assert result.exit_code == 2 and result.output.strip().startswith("error: preset") and "warp_speed" in result.output
    assert not recorded


def test_verify_takes_a_preset_and_flags_win(tmp_path, monkeypatch):
    configs: list = []
    monkeypatch.setattr("fastgemma.verify.run_verify", lambda cfg: configs.append(cfg) or {"verdict": "VERIFIED", "reasons": []})
    monkeypatch.setattr("fastgemma.verify.report.render_table", lambda summary: None)
    preset = tmp_path / "p.json"
    preset.write_text(json.dumps({"fastgemma_preset": 1, "model": "tuned/model", "options": {
        "quantization": "int8", "speculative": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 6}}))
    result = runner.invoke(app, ["verify", "--preset", str(preset), "-k", "5", "--out", str(tmp_path / "v")])
    assert result.exit_code == 0, result.output
    serve = configs[0].serve
    assert (serve.model, serve.quantization, serve.speculative) == ("tuned/model", "int8", "ngram")
    assert serve.num_speculative_tokens == 5 and serve.prompt_lookup_max == 6
    assert "--prompt-lookup-max" in serve.serve_args()

    result = runner.invoke(app, ["verify", "--preset", str(preset), "--url", "http://127.0.0.1:1"])
    assert result.exit_code == 2 and "give one or the other" in result.output
