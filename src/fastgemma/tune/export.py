"""The winner, exported: a serve preset and a challenge submission folder.

- `preset.json`: `fastgemma serve --preset preset.json` (preset.py), with what was measured;
- `submission/`: the challenge's shape, written by `fastgemma.submission` (the same code as
  `fastgemma submission --preset preset.json`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastgemma.config import EngineConfig
from fastgemma.preset import Preset, write_preset
from fastgemma.submission import export_submission


def winner_preset(options: EngineConfig) -> Preset:
    return Preset(options.model, options.changed())


def export_preset(path: Path, options: EngineConfig, measured: dict[str, Any]) -> Path:
    return write_preset(path, winner_preset(options), measured)


def export_winner_submission(folder: Path, options: EngineConfig, served_model_name: str,
                             measured: dict[str, Any]) -> Path:
    return export_submission(folder, winner_preset(options), served_model_name, measured=measured, replace=True)
