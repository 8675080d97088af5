"""A Fast Gemma Challenge submission folder: export one from a preset, check one.

The challenge's job script (`hf_bucket_single_job.py`) reads `manifest.json`:
- `dependencies`: pip requirement strings, installed with `uv pip install` into a fresh venv,
  from the job's own working directory (so a relative path there would not resolve);
- `serve`: a list of strings, run with the submission folder as working directory;
- `model_id` (a path inside the folder, made absolute by the job, or a hub id),
  `served_model_name`, `port` and `env`: passed to the server as `MODEL_ID`,
  `SERVED_MODEL_NAME`, `PORT` and environment variables.

What `export_submission` writes, so that installing `dependencies` and running `serve` gives a
working server with nothing else installed:
- `src/fastgemma/`: fastgemma itself, the installed package's source; `serve.py` puts `src/`
  first on `sys.path`, so no package index needs to know fastgemma;
- `manifest.json`: `dependencies` = fastgemma's own requirements pinned to the versions
  installed here (`torch==X`: on Linux, PyPI's torch is the CUDA build the job's GPU needs);
- `preset.json`: the engine options (`fastgemma serve --preset`), with a local `draft_model`
  copied under `draft/` and named relative to the folder;
- `model/`: the checkpoint when it is local (the embedded model's GGUF included), and
  `model_id` pointing at it; a hub id stays a hub id.

`check_submission` applies the job script's manifest rules and ours (the model resolves,
`serve.py` exists); every problem is a `ValueError` naming the folder and the field.
"""

from __future__ import annotations

import json
import re
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

from fastgemma.preset import Preset, write_preset
from fastgemma.weights.source import embedded_model_path, looks_like_path

SERVE_PY = '''"""Challenge submission: fastgemma serving $MODEL_ID with the engine options in preset.json.

The job runs this with the submission folder as working directory, after installing
manifest.json's `dependencies` (fastgemma's requirements, pinned) into a fresh venv. fastgemma
itself is the source under src/, put first on the path here. The job sets MODEL_ID,
SERVED_MODEL_NAME, HOST and PORT; `fastgemma serve` reads the last three from the environment.
"""

import os
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here / "src"))

from fastgemma.cli.main import main  # noqa: E402

model = os.environ.get("MODEL_ID") or "{model_id}"
sys.argv = ["fastgemma", "serve", model, "--preset", str(here / "preset.json")]
main()
'''

_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")


def pinned_requirements() -> list[str]:
    """fastgemma's own requirements (no extras), each pinned to the installed version.

    A local version label (`2.13.0+cpu`) is dropped: the job installs from PyPI, where the
    plain version is the build for its platform (CUDA on Linux)."""
    pins = []
    for requirement in metadata.requires("fastgemma") or []:
        if "extra ==" in requirement:
            continue
        name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
        pins.append(f"{name}=={metadata.version(name).split('+')[0]}")
    return pins


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target, ignore=_IGNORED, dirs_exist_ok=True)
    else:
        shutil.copyfile(source, target)


def _carry_model(model: str | None, folder: Path, subdir: str) -> str:
    """The model as the submission names it: a path under `folder/subdir` (copied there) for a
    local checkpoint or the embedded model, the id itself for a hub id."""
    if model is None:
        source = embedded_model_path()
    else:
        source = Path(model).expanduser()
        if not source.exists():
            if looks_like_path(model):
                raise ValueError(f"model path {model!r} does not exist; pass an existing folder, a .gguf file or a hub id")
            return model  # a hub id: the job downloads it
    relative = f"{subdir}/{source.name}"
    _copy(source, folder / relative)
    return relative


def export_submission(folder: Path, preset: Preset, served_model_name: str, port: int = 8000,
                      measured: dict[str, Any] | None = None, replace: bool = False) -> Path:
    """Write the submission for `preset` (its model: None is the embedded one) into `folder`,
    a new or empty folder; `replace`: an earlier submission there (it has a manifest.json) is
    removed first (`fastgemma tune --resume` re-exports its winner)."""
    import fastgemma

    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        if not (replace and (folder / "manifest.json").is_file()):
            raise ValueError(f"the submission folder {folder} is not empty; give a new folder with --out")
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _copy(Path(fastgemma.__file__).resolve().parent, folder / "src" / "fastgemma")
    options = dict(preset.options)
    if options.get("draft_model"):
        options["draft_model"] = _carry_model(options["draft_model"], folder, "draft")
    model_id = _carry_model(preset.model, folder, "model")
    write_preset(folder / "preset.json", Preset(None, options), measured)
    (folder / "serve.py").write_text(SERVE_PY.replace("{model_id}", model_id))
    manifest = {
        "name": "fastgemma",
        "description": f"fastgemma {metadata.version('fastgemma')} serving {model_id} with the options in preset.json",
        "dependencies": pinned_requirements(),
        "model_id": model_id,
        "served_model_name": served_model_name,
        "port": port,
        "serve": ["python", "serve.py"],
        "env": {},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    check_submission(folder)
    return folder


def check_submission(folder: Path) -> dict[str, Any]:
    """The manifest of the submission in `folder`, checked as the job script reads it."""
    folder = Path(folder)
    path = folder / "manifest.json"
    where = f"submission {folder}"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{where} has no manifest.json") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: cannot read manifest.json ({e})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: manifest.json is not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{where}: manifest.json must be a JSON object")

    def bad(field: str, what: str) -> ValueError:
        return ValueError(f"{where}: manifest field {field!r} {what}")

    serve = manifest.get("serve")
    if not serve or not isinstance(serve, list) or not all(isinstance(x, str) for x in serve):
        raise bad("serve", 'must be a non-empty list of strings, e.g. ["python", "serve.py"]')
    scripts = [x for x in serve[:2] if x.endswith(".py")]
    if scripts and not (folder / scripts[0]).is_file():
        raise bad("serve", f"runs {scripts[0]}, which is not in the folder")
    dependencies = manifest.get("dependencies") or []
    if not isinstance(dependencies, list) or not all(isinstance(x, str) for x in dependencies):
        raise bad("dependencies", "must be a list of pip requirement strings")
    model_id = manifest.get("model_id")
    if not isinstance(model_id, str) or not model_id:
        raise bad("model_id", "must name the model: a path inside the submission or a hub id (org/name)")
    if looks_like_path(model_id) and not (folder / model_id).exists():  # (an absolute model_id stays absolute)
        raise bad("model_id", f"is {model_id!r}: no such file or folder in the submission, and not a hub id (org/name)")
    if not isinstance(manifest.get("served_model_name", ""), str):
        raise bad("served_model_name", "must be a string")
    port = manifest.get("port", 8000)
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise bad("port", "must be an integer in 1..65535")
    env = manifest.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(v, (str, int, float, bool)) for v in env.values()):
        raise bad("env", "must be an object of environment variable name to value")
    return manifest
