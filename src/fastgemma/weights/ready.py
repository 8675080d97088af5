"""The ready form of a loaded model, cached: a warm load reads it instead of converting again.

What loading computes from a checkpoint and can be kept is written once, beside the user
cache (`<cache>/ready/<model>-<path hash>-<dtype>-<quantization>/`):
- `state.safetensors`: the decoder's state dict (our names, in the dtype it runs in, quantised
  linears as codes and scales), written when loading converted something — a GGUF's
  dequantisation, or quantising on load. A bf16 safetensors folder is already in that form
  and gets none; embedding tables such a folder stores as they run (Gemma 4's PLE table:
  5.6 GB for E4B) are left out and mapped from the folder itself;
- `screen.safetensors`: the exact lm_head screen's int8 codes, scales and bounds.
A warm load then reads tensors straight into place: no GGUF parsing, no re-quantising, no
re-building the screen. `source.json` records what the entry was made from (the files'
paths, sizes and modification times); an entry whose source changed is rebuilt, one entry
per model path, dtype and quantization exists at a time, and entries whose source files are
gone are removed when a new one is written. Entries are written to a
temporary folder and renamed, so an interrupted write leaves none. Set `FASTGEMMA_READY_CACHE=0`
to neither read nor write them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from pathlib import Path

import torch

from fastgemma.paths import cache_dir, with_normal_permissions
from fastgemma.weights.checkpoint import map_region
from fastgemma.weights.loader import MAPPED
from fastgemma.weights.source import ModelSource

READY_VERSION = 1  # bump when what a state holds changes



class ReadyEntry:
    def __init__(self, source: ModelSource, dtype: torch.dtype, quantization: str):
        path = source.path.resolve()
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
        stem = path.stem if source.kind == "gguf" else path.name
        self.folder = cache_dir() / "ready" / f"{stem}-{digest}-{str(dtype).removeprefix('torch.')}-{quantization}"
        self.stamp = {"version": READY_VERSION, "files": _fingerprint(source)}
        self.enabled = os.environ.get("FASTGEMMA_READY_CACHE", "1") != "0"

    def _valid(self) -> bool:
        try:
            return json.loads((self.folder / "source.json").read_text()) == self.stamp
        except (OSError, ValueError):
            return False

    def read(self, part: str) -> dict[str, torch.Tensor] | None:
        """The tensors of `part` ("state" or "screen"), or None where not cached."""
        file = self.folder / f"{part}.safetensors"
        if not self.enabled or not file.is_file() or not self._valid():
            return None
        try:
            return read_safetensors(file, MAPPED)
        except (OSError, ValueError, KeyError):  # a damaged entry: rebuilt by this load
            return None

    def write(self, part: str, tensors: dict[str, torch.Tensor]) -> None:
        """Store `part`; a stale entry (another source, version) is replaced whole. Failing to
        write (a read-only or full disk) only costs the next load its speed."""
        if not self.enabled:
            return
        from safetensors.torch import save_file

        tmp = self.folder.with_name(f"{self.folder.name}.tmp{os.getpid()}")
        _prune(self.folder.parent)
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            if self._valid():
                shutil.copytree(self.folder, tmp)
            else:
                tmp.mkdir(parents=True)
                (tmp / "source.json").write_text(json.dumps(self.stamp))
            save_file({k: v.contiguous() for k, v in tensors.items()}, tmp / f"{part}.safetensors")
            with_normal_permissions(tmp)
            shutil.rmtree(self.folder, ignore_errors=True)
            os.replace(tmp, self.folder)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)


_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
           "I8": torch.int8, "U8": torch.uint8, "I32": torch.int32, "I64": torch.int64, "BOOL": torch.bool}


def read_safetensors(path: Path, mapped: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file read into memory of its own (plain reads, no
    mapping left behind: a mapped file would stay resident beside the copies that the
    model re-lays out, kernels/huge_pages.py), except those named in `mapped`: views of the
    file, memory-mapped (embedding tables, of which a step touches a few rows)."""
    out = {}
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            dtype = _DTYPES[info["dtype"]]
            if end - begin != math.prod(info["shape"]) * dtype.itemsize:
                raise ValueError(f"{path}: {name} has {end - begin} bytes for shape {info['shape']}")
            if name in mapped:
                out[name] = map_region(path, base + begin, tuple(info["shape"]), dtype)
                continue
            t = torch.empty(info["shape"], dtype=dtype)
            f.seek(base + begin)
            if end > begin and f.readinto(memoryview(t.view(-1).view(torch.uint8).numpy())) != end - begin:
                raise ValueError(f"{path}: {name} is cut short")
            out[name] = t
    return out


def _prune(root: Path) -> None:
    """Remove entries whose source files no longer exist (a deleted or moved model)."""
    for stamp in root.glob("*/source.json"):
        try:
            files = json.loads(stamp.read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if any(not Path(f[0]).exists() for f in files):
            shutil.rmtree(stamp.parent, ignore_errors=True)


def _fingerprint(source: ModelSource) -> list[list]:
    """(path, size, mtime) of every file a load reads tensors from."""
    if source.kind == "gguf":
        files = [source.path]
    else:
        files = sorted([*source.path.glob("*.safetensors"), source.path / "config.json"])
    out = []
    for f in files:
        st = f.stat()
        out.append([str(f.resolve()), st.st_size, st.st_mtime_ns])
    return out
