"""The engine options on every command line come from their declarations (cli/options.py):
each command that runs an engine has every flag, with the declared help, untruncated at 80
columns, switches without a type label; options left out stay out (a preset or the default
applies)."""

from __future__ import annotations

from dataclasses import fields

import pytest
import typer
from typer.testing import CliRunner

from fastgemma.cli.main import app
from fastgemma.config import EngineConfig, spec_of

COMMANDS = (["serve"], ["generate"], ["bench", "decode"], ["verify"])
runner = CliRunner()


def _help(command: list[str]) -> str:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_engine_flag_with_its_declared_help(command):
    text = _help(command)
    flat = "".join(text.split())  # help text wraps, also after a hyphen
    for f in fields(EngineConfig):
        spec = spec_of(f)
        if spec.flag is None:
            continue
        assert spec.flag in text, f"{spec.flag} missing from {' '.join(command)} --help"
        assert "".join(spec.help.split()) in flat, f"{f.name}: help text differs"
    assert "…" not in text and "<bool>" not in text


def test_every_command_help_is_untruncated():
    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        sub = [[name, s] for s in command.commands] if hasattr(command, "commands") else [[name]]
        for words in sub:
            text = _help(words)
            assert "…" not in text and "<bool>" not in text, " ".join(words)


def test_tune_help_names_what_it_searches():
    flat = " ".join(_help(["tune"]).split())
    searched = [f.name for f in fields(EngineConfig) if spec_of(f).tune is not None]
    assert f"Search {', '.join(searched)} for the highest TPS" in flat
    assert "prefill_chunk" in flat.split("not searched:")[1]  # the README says so too
