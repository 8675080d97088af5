"""Where fastgemma keeps files it makes: $FASTGEMMA_CACHE, else $XDG_CACHE_HOME/fastgemma, else ~/.cache/fastgemma;
and the permissions they get."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    if env := os.environ.get("FASTGEMMA_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fastgemma"


def with_normal_permissions(folder: Path) -> None:
    """Files in `folder` readable as the umask allows (safetensors writes them 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    for f in folder.iterdir():
        if f.is_file():
            f.chmod(0o666 & ~umask)
