"""Serve presets: a JSON file of engine options that `fastgemma serve --preset FILE` starts with.

    {"fastgemma_preset": 1, "model": null,
     "options": {"quantization": "int8", "speculative": "ngram", "num_speculative_tokens": 8},
     "measured": {...}}

`options` holds `EngineConfig` fields that have a serve flag (config.py), under their field
names; `model` is the checkpoint the preset was made for (null: the embedded default model);
`measured` is free-form provenance (what `fastgemma tune` measured) and is not read back.
`fastgemma tune` writes presets; anyone may write one by hand. Precedence when serving: a
flag given on the command line, then the preset, then the environment (`$MODEL_ID`), then
the defaults.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from fastgemma.config import EngineConfig, spec_of

PRESET_VERSION = 1


def serve_option_names() -> list[str]:
    """The `EngineConfig` options a preset (and `fastgemma serve`) can set."""
    return [f.name for f in fields(EngineConfig) if spec_of(f).flag is not None]


@dataclass(frozen=True)
class Preset:
    model: str | None
    options: dict[str, Any]  # EngineConfig field name -> value, only options that differ from the defaults

    def to_json(self, measured: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"fastgemma_preset": PRESET_VERSION, "model": self.model, "options": self.options, "measured": measured or {}}


def check_options(options: dict[str, Any], where: str) -> None:
    """ValueError naming the unknown option or the engine's objection to the values."""
    allowed = serve_option_names()
    for name in options:
        if name not in allowed:
            raise ValueError(f"{where}: unknown option {name!r}; a preset sets: {', '.join(allowed)}")
    try:
        EngineConfig(**options)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def load_preset(path: Path) -> Preset:
    where = f"preset {path}"
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"cannot read {where}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or data.get("fastgemma_preset") != PRESET_VERSION:
        raise ValueError(f"{where} is not a fastgemma preset: expected an object with \"fastgemma_preset\": {PRESET_VERSION}")
    model, options = data.get("model"), data.get("options", {})
    if model is not None and not isinstance(model, str):
        raise ValueError(f"{where}: \"model\" must be a string or null")
    if not isinstance(options, dict):
        raise ValueError(f"{where}: \"options\" must be an object of option name to value")
    check_options(options, where)
    return Preset(model, options)


def write_preset(path: Path, preset: Preset, measured: dict[str, Any] | None = None) -> Path:
    check_options(preset.options, f"preset {path}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(preset.to_json(measured), indent=2) + "\n")
    return path
