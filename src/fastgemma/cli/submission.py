"""`fastgemma submission`: a challenge submission folder from a preset, or a check of one.

`--preset FILE --out DIR [--model M]` writes the folder (`fastgemma.submission`; the same code
exports `fastgemma tune`'s winner); `--check DIR` reads one back as the challenge's job script
would. Bad input prints one `error: ...` line naming the file or manifest field and exits with
code 2 (the CLI's convention).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from fastgemma.cli.errors import fail


def submission(
    preset: Optional[Path] = typer.Option(None, "--preset", help="Engine options (a preset file; default: the defaults)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="The submission folder to write (new or empty)."),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", help="Model folder, .gguf file or hub id (default: the preset's, else the embedded model)."
    ),
    served_model_name: str = typer.Option(
        "gemma-4-e4b-it", "--served-model-name", help="manifest served_model_name (the job's default name)."
    ),
    port: int = typer.Option(8000, "--port", help="manifest port."),
    check: Optional[Path] = typer.Option(None, "--check", help="Check an existing submission folder instead."),
) -> None:
    """Write a Fast Gemma Challenge submission (manifest.json, serve.py, preset.json, fastgemma's source, the model when local), or --check one.

    The challenge's job installs manifest.json's dependencies (fastgemma's requirements, pinned to the versions installed here) into a fresh venv and runs `python serve.py` in the folder, which starts `fastgemma serve $MODEL_ID --preset preset.json`.
    """
    from fastgemma.preset import Preset, load_preset
    from fastgemma.submission import check_submission, export_submission

    try:
        if check is not None:
            if preset is not None or out is not None or model is not None:
                raise ValueError("--check reads a submission folder; --preset, --out and --model write one: give one or the other")
            manifest = check_submission(check)
            typer.echo(f"{check}: ok (model_id {manifest['model_id']}, serve {' '.join(manifest['serve'])}, "
                       f"{len(manifest.get('dependencies') or [])} dependencies)")
            return
        if out is None:
            raise ValueError("give --out DIR (the submission folder to write), or --check DIR")
        chosen = load_preset(preset) if preset is not None else Preset(None, {})
        chosen = Preset(model if model is not None else chosen.model, chosen.options)
        typer.echo(str(export_submission(out, chosen, served_model_name, port)))
    except ValueError as e:
        fail(str(e))
