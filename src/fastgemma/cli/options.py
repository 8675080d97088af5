"""Engine options on the command line, derived from their declarations (config.py).

`@engine_options()` adds one typer option per `EngineConfig` field that has a flag, with the
declared help text and default, to the decorated command, and hands the command the values
given on the command line as one dict, `options` (an option left out is absent, so a preset
or the engine's default applies). Bool options are `--flag/--no-flag` switches. `lists=`
names options that take comma-separated values (bench decode runs one engine per value):
their entry is a tuple of strings. No command declares an engine option itself.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import fields
from typing import Any, Optional

import typer

from fastgemma.config import EngineConfig, base_type, spec_of

# What a default reads as in --help, where the value alone would say nothing.
_DEFAULT_WORDS = {None: "unset", True: "on", False: "off"}


def option_help(name: str) -> str:
    """The declared help text of the `EngineConfig` option `name`."""
    return spec_of(next(f for f in fields(EngineConfig) if f.name == name)).help


def flagged_options() -> list[str]:
    """The `EngineConfig` fields that have a command-line flag, in declaration order."""
    return [f.name for f in fields(EngineConfig) if spec_of(f).flag is not None]


def _parameter(name: str, default: Any, as_list: bool) -> inspect.Parameter:
    spec = spec_of(next(f for f in fields(EngineConfig) if f.name == name))
    assert spec.flag is not None
    kind = str if as_list else base_type(name)
    shown = _DEFAULT_WORDS.get(default, default) if isinstance(default, (bool, type(None))) else default
    text = ("Comma-separated, each its own engine. " if as_list else "") + spec.help
    if "(default:" not in spec.help:  # else the help says what the default means
        text += f" [default: {shown}]"
    names = [f"{spec.flag}/--no-{spec.flag.removeprefix('--')}"] if kind is bool else [spec.flag]
    if spec.short:
        names.append(spec.short)
    info = typer.Option(None, *names, help=text, show_default=False)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=Optional[kind])


def engine_options(lists: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add every flagged engine option to a command that takes `options: dict[str, Any]`."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        defaults = {f.name: f.default for f in fields(EngineConfig)}
        added = [_parameter(name, defaults[name], name in lists) for name in flagged_options()]
        own = [p for p in inspect.signature(command).parameters.values() if p.name != "options"]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            given = {p.name: kwargs.pop(p.name) for p in added}
            options = {name: value for name, value in given.items() if value is not None}
            for name in lists:
                if name in options:
                    options[name] = tuple(v.strip() for v in options[name].split(",") if v.strip())
            return command(options=options, **kwargs)

        run.__signature__ = inspect.Signature([*own, *added])  # type: ignore[attr-defined]
        return run

    return decorate
