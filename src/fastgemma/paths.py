"""Where fastgemma keeps files it makes: $FASTGEMMA_CACHE, else $XDG_CACHE_HOME/fastgemma, else ~/.cache/fastgemma."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    if env := os.environ.get("FASTGEMMA_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fastgemma"
