"""The winner, exported: a serve preset and a challenge submission folder.

- `preset.json`: `fastgemma serve --preset preset.json` (preset.py), with what was measured;
- `submission/`: the challenge's shape (notes: manifest.json + serve.py): `manifest.json`
  names the pip dependencies, `model_id`, `served_model_name`, `port`, the `serve` command and
  `env`; `serve.py` starts `fastgemma serve $MODEL_ID --preset preset.json` on `$HOST:$PORT`
  (`$SERVED_MODEL_NAME` names the model), with the preset beside it.
"""

from __future__ import annotations

import json
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

from fastgemma.preset import Preset, write_preset
from fastgemma.verify.config import ServeOptions

SERVE_PY = '''"""Challenge submission: an OpenAI-compatible server for $MODEL_ID with the engine options in
preset.json (chosen by `fastgemma tune`). The harness sets MODEL_ID, SERVED_MODEL_NAME, HOST, PORT."""

import os
import sys
from pathlib import Path

from fastgemma.cli.main import main

preset = Path(__file__).resolve().with_name("preset.json")
model = os.environ.get("MODEL_ID")
sys.argv = ["fastgemma", "serve", *([model] if model else []), "--preset", str(preset)]
main()
'''


def export_preset(path: Path, options: ServeOptions, measured: dict[str, Any]) -> Path:
    return write_preset(path, Preset(options.model, options.changed()), measured)


def export_submission(folder: Path, preset_path: Path, options: ServeOptions, served_model_name: str,
                      port: int = 8000) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(preset_path, folder / "preset.json")
    (folder / "serve.py").write_text(SERVE_PY)
    manifest = {
        "model_id": options.model or "",  # empty: fastgemma's embedded default model
        "served_model_name": served_model_name,
        "port": port,
        "serve": "python serve.py",
        "pip": [f"fastgemma=={metadata.version('fastgemma')}"],
        "env": {},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return folder
