"""Read a checkpoint's config and tensors, under the Hugging Face names of the text decoder.

- Folders: config.json via transformers' `AutoConfig`; tensors from `model.safetensors` or a
  sharded `model.safetensors.index.json`. Prefixes of the multimodal / causal-LM wrappers
  (`model.language_model.`, `language_model.model.`, `model.`) are stripped, so every source
  yields `embed_tokens.weight`, `layers.N.self_attn.q_proj.weight`, ..., `lm_head.weight`.
  Tensors of the vision / audio towers are skipped by `open_tensors(source)` and read by
  `open_tensors(source, tower_name)`, named from the tower (`vision_tower.…`, `embed_audio.…`).
- GGUF (architecture gemma3): tensors dequantised to fp32 with `gguf`, renamed from
  llama.cpp's names, and norm weights minus 1 (llama.cpp stores Gemma's (1 + w)). The config
  and tokenizer are converted by transformers once and cached beside the file's cache entry.

Tensors are read lazily (`CheckpointTensors`): a tensor is read (GGUF: dequantised from the
memory-mapped file; safetensors: plain reads at the header's offsets) when asked, in slices
of rows converted straight into the dtype the caller wants, so that loading holds the final
weights plus one slice, never a whole fp32 copy.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastgemma.models.spec import SUPPORTED_MODEL_TYPES
from fastgemma.paths import cache_dir
from fastgemma.tokenizer import GEMMA_TURN_TEMPLATE
from fastgemma.weights.source import ModelSource

_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "model.")
_OTHER_TOWERS = ("vision_tower", "audio_tower", "embed_vision", "embed_audio", "multi_modal_projector")

_GGUF_NAMES = {
    "token_embd": "embed_tokens",
    "output_norm": "norm",
    "output": "lm_head",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def text_name(name: str) -> str | None:
    """Checkpoint name -> decoder name, or None for tensors outside the text decoder."""
    if name.startswith(_OTHER_TOWERS) or any(f".{t}" in name for t in _OTHER_TOWERS):
        return None
    if name == "lm_head.weight":
        return name
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def tower_name(name: str) -> str | None:
    """Checkpoint name -> tower name (`model.vision_tower.x` -> `vision_tower.x`), or None."""
    for tower in _OTHER_TOWERS:
        if name.startswith(tower):
            return name
        if (i := name.find("." + tower)) >= 0:
            return name[i + 1 :]
    return None


GGUF_META_VERSION = 2  # 2: tokenizer_config.json holds the chat template


def gguf_meta_folder(path: Path) -> Path:
    """A cached folder with config.json and tokenizer files converted from the GGUF's metadata.

    The tokenizer carries a chat template in `tokenizer_config.json`: the GGUF's own, or for a
    GGUF without one (a base model, as the embedded one) the fallback the server uses
    (`tokenizer.GEMMA_TURN_TEMPLATE`), so that every tool reading the folder (transformers,
    sglang's bench_serving, the challenge's decode script) builds the prompt the server builds.
    """
    st = path.stat()
    folder = cache_dir() / "gguf" / f"{path.stem}-{st.st_size}-{int(st.st_mtime)}-v{GGUF_META_VERSION}"
    if (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file():
        return folder
    from transformers import AutoConfig, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as e:
        raise ValueError(f"cannot read GGUF metadata from {path}: {e}") from e
    # Written aside and renamed, so a concurrent or interrupted first run never leaves half a folder.
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = GEMMA_TURN_TEMPLATE
    config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp, save_jinja_files=False)  # the template inside tokenizer_config.json
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder


def load_config(source: ModelSource) -> Any:
    from transformers import AutoConfig

    folder = gguf_meta_folder(source.path) if source.kind == "gguf" else source.path
    model_type = _raw_model_type(folder)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"unsupported model_type {model_type!r} in {folder / 'config.json'}; fastgemma supports: "
            + ", ".join(SUPPORTED_MODEL_TYPES)
        )
    try:
        return AutoConfig.from_pretrained(folder)
    except Exception as e:  # malformed or inconsistent config
        raise ValueError(f"cannot load the config of {source.name}: {e}") from e


def _raw_model_type(folder: Path) -> str | None:
    try:
        return json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None


def generation_eos_ids(source: ModelSource) -> list[int]:
    """eos ids from generation_config.json (what vLLM stops on), plus Gemma's <end_of_turn>."""
    folder = gguf_meta_folder(source.path) if source.kind == "gguf" else source.path
    ids: list[int] = []
    gen = folder / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id", [])
        ids = [eos] if isinstance(eos, int) else list(eos or [])
    if source.kind == "gguf":
        ids.append(106)  # <end_of_turn>: the GGUF carries no generation config
    return ids


class CheckpointTensors(Mapping[str, torch.Tensor]):
    """A checkpoint's tensors by name, read only when asked: `tensors[name]` reads one whole
    (its stored dtype; fp32 for a GGUF), `read(name, dtype, out)` converts it slice by slice
    of rows into `out` (or a new tensor), so that no full-size intermediate of another dtype
    exists; `rows(name, a, b)` reads rows a..b. The files stay open (mapped) until `close()`."""

    def __init__(
        self,
        shapes: dict[str, tuple[int, ...]],
        dtypes: dict[str, torch.dtype],
        read_rows: Callable[[str, int, int], torch.Tensor],
        close: Callable[[], None] = lambda: None,
        map_tensor: Callable[[str], torch.Tensor] | None = None,
        ggml_blocks: Callable[[str], tuple[int, torch.Tensor] | None] | None = None,
    ):
        self._shapes, self._dtypes, self._read_rows, self.close = shapes, dtypes, read_rows, close
        self._map, self._blocks = map_tensor, ggml_blocks

    def ggml_blocks(self, name: str) -> tuple[int, torch.Tensor] | None:
        """A GGUF matrix stored in quantised blocks: (its ggml type id, its bytes [rows,
        bytes per row], a copy); None for anything else (a float tensor, another format)."""
        return None if self._blocks is None else self._blocks(name)

    def mapped(self, name: str, dtype: torch.dtype) -> torch.Tensor | None:
        """The tensor as a view of its file, memory-mapped copy-on-write (pages read when
        touched), when it is stored in `dtype` and the format allows; else None."""
        if self._map is None or self._dtypes[name] != dtype:
            return None
        return self._map(name)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._shapes:
            raise KeyError(name)
        return self.read(name, self._dtypes[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def dtype(self, name: str) -> torch.dtype:
        """The dtype it is stored in (fp32 for a GGUF's dequantised tensors)."""
        return self._dtypes[name]

    def rows(self, name: str, a: int, b: int) -> torch.Tensor:
        return self._read_rows(name, a, b)

    def read(self, name: str, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
        shape = self.shape(name)
        if out is None:
            out = torch.empty(shape, dtype=dtype)
        if not shape:
            return out.copy_(self.rows(name, 0, 1))
        step = max(1, _SLICE_ELEMENTS // max(1, math.prod(shape[1:])))
        for a in range(0, shape[0], step):
            b = min(a + step, shape[0])
            out[a:b].copy_(self.rows(name, a, b))
        return out


_SLICE_ELEMENTS = 1 << 22  # rows converted at a time: a 16 MiB fp32 intermediate at most


def open_tensors(source: ModelSource, rename: Callable[[str], str | None] = text_name) -> CheckpointTensors:
    """The text decoder's tensors (decoder names), or with `rename=tower_name` the towers'."""
    if source.kind == "gguf":
        return _open_gguf(source.path) if rename is text_name else CheckpointTensors({}, {}, _no_rows)
    return _open_safetensors(source.path, rename)


def _no_rows(name: str, a: int, b: int) -> torch.Tensor:
    raise KeyError(name)


def _open_safetensors(folder: Path, rename: Callable[[str], str | None]) -> CheckpointTensors:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder} has no .safetensors weights (pytorch .bin checkpoints are not supported)")
    # Plain reads at the header's offsets (the format: 8-byte header size, JSON header, data):
    # a slice of rows is read into memory of its own, and nothing of the file stays mapped.
    handles = [open(folder / file, "rb") for file in files]
    where: dict[str, tuple[Any, int]] = {}  # name -> (file, offset of its data)
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, torch.dtype] = {}
    for f in handles:
        try:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        except ValueError as e:
            raise ValueError(f"{f.name} is not a safetensors file: {e}") from None
        for name, info in header.items():
            if name != "__metadata__" and (mapped := rename(name)) is not None:
                if info["dtype"] not in _SAFETENSORS_DTYPES:
                    raise ValueError(f"{f.name}: tensor {name} has unsupported dtype {info['dtype']}")
                where[mapped] = (f, 8 + n + info["data_offsets"][0])
                shapes[mapped], dtypes[mapped] = tuple(info["shape"]), _SAFETENSORS_DTYPES[info["dtype"]]

    def read_rows(name: str, a: int, b: int) -> torch.Tensor:
        f, offset = where[name]
        shape = shapes[name]
        row = math.prod(shape[1:]) * dtypes[name].itemsize
        out = torch.empty((b - a, *shape[1:]) if shape else (), dtype=dtypes[name])
        nbytes = out.numel() * out.element_size()
        f.seek(offset + a * row)
        if nbytes and f.readinto(memoryview(out.view(-1).view(torch.uint8).numpy())) != nbytes:
            raise ValueError(f"{f.name}: tensor {name} is cut short")
        return out

    def close() -> None:
        for f in handles:
            f.close()

    def map_tensor(name: str) -> torch.Tensor:
        f, offset = where[name]
        return map_region(Path(f.name), offset, shapes[name], dtypes[name])

    return CheckpointTensors(shapes, dtypes, read_rows, close, map_tensor)


def map_region(path: Path, offset: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor over bytes offset.. of `path`, memory-mapped copy-on-write: nothing is read
    until touched, and untouched pages cost no memory (the mapping lives with the tensor)."""
    import mmap

    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    count = math.prod(shape)
    return torch.frombuffer(mm, dtype=dtype, count=count, offset=offset).view(shape)


_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


def _open_gguf(path: Path) -> CheckpointTensors:
    import gguf

    reader = gguf.GGUFReader(str(path))  # the file memory-mapped; tensors are views of it
    arch = reader.fields["general.architecture"].contents()
    if arch != "gemma3":
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported; fastgemma reads gemma3 GGUFs")
    found: dict[str, Any] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    norms: set[str] = set()
    for t in reader.tensors:
        m = re.fullmatch(r"(?:blk\.(\d+)\.)?(\w+)\.weight", t.name)
        if m is None or m.group(2) not in _GGUF_NAMES:
            raise ValueError(f"{path}: unexpected GGUF tensor {t.name}")
        layer, base = m.groups()
        name = _GGUF_NAMES[base] + ".weight"
        if layer is not None:
            name = f"layers.{layer}.{name}"
        found[name] = t
        if base.endswith("norm"):
            norms.add(name)
        shapes[name] = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dimensions innermost first

    def read_rows(name: str, a: int, b: int) -> torch.Tensor:
        t = found[name]
        array = gguf.quants.dequantize(t.data[a:b], t.tensor_type)  # [rows, in] for matrices
        tensor = torch.from_numpy(np.array(array, dtype=np.float32))  # own memory: the file is read-only
        if name in norms:
            tensor = tensor - 1.0  # llama.cpp stores Gemma norms as 1 + w
        return tensor

    float_types = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16}

    def ggml_blocks(name: str) -> tuple[int, torch.Tensor] | None:
        t = found[name]
        if t.tensor_type in float_types or len(shapes[name]) != 2:
            return None
        return int(t.tensor_type), torch.from_numpy(np.array(t.data, dtype=np.uint8)).view(shapes[name][0], -1)

    return CheckpointTensors(shapes, dict.fromkeys(shapes, torch.float32), read_rows, found.clear,
                             ggml_blocks=ggml_blocks)
