"""`fastgemma generate` / `convert`: output on success, one readable line and exit 2 on bad input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fastgemma.cli.main import app

runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, list(args))


def _assert_usage_error(result, *words: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for w in words:
        assert w in lines[0], lines[0]


def test_missing_path():
    _assert_usage_error(_run("generate", "--model", "./no/such/folder", "hi"), "does not exist")


def test_unknown_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    _assert_usage_error(_run("generate", "--model", str(tmp_path), "hi"), "gemma3_text", "gemma4_text")


def test_mtp_without_a_draft_model(tiny_e4b):
    _assert_usage_error(_run("generate", "--model", str(tiny_e4b), "--speculative", "mtp", "hi"), "--draft-model")


def test_draft_model_that_is_not_an_assistant(tiny_e4b):
    _assert_usage_error(
        _run("generate", "--model", str(tiny_e4b), "--speculative", "mtp", "--draft-model", str(tiny_e4b), "hi"),
        "gemma4_assistant",
    )


def test_invalid_dtype(tiny_gemma3):
    _assert_usage_error(_run("generate", "--model", str(tiny_gemma3), "--dtype", "float8", "hi"), "dtype")


def test_invalid_sampling_value(tiny_gemma3):
    _assert_usage_error(_run("generate", "--model", str(tiny_gemma3), "--temperature", "-1", "hi"), "temperature")


@pytest.mark.parametrize("flag,value,field", [("--repetition-penalty", "0", "repetition_penalty"),
                                              ("--presence-penalty", "3", "presence_penalty"),
                                              ("--frequency-penalty", "-2.5", "frequency_penalty"),
                                              ("--min-p", "2", "min_p"),
                                              ("--min-tokens", "-1", "min_tokens")])
def test_invalid_penalty_min_p_or_min_tokens(tiny_gemma3, flag, value, field):
    _assert_usage_error(_run("generate", "--model", str(tiny_gemma3), flag, value, "hi"), field)


def test_text_prompt_without_tokenizer(tiny_gemma3):
    _assert_usage_error(_run("generate", "--model", str(tiny_gemma3), "hi"), "token ids")


def test_hub_id_not_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    _assert_usage_error(_run("generate", "--model", "google/not-a-real-gemma", "hi"), "google/not-a-real-gemma")


@pytest.mark.slow
def test_generate_on_embedded_model():
    result = _run("generate", "--max-tokens", "8", "--dtype", "float32", "The capital of France is")
    assert result.exit_code == 0, result.output
    assert len(result.output.strip()) > 0


@pytest.mark.slow
@pytest.mark.parametrize("max_tokens", ["1", "100"])
def test_prompt_plus_max_tokens_over_max_model_len_is_refused(max_tokens):
    """As the server refuses it (vLLM's words), not cut short to a token and exit 0."""
    result = _run("generate", "--max-model-len", "8", "--max-tokens", max_tokens, "one two three four five six seven")
    _assert_usage_error(result, "maximum context length is 8 tokens", "in the completion")
