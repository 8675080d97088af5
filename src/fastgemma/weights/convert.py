"""Write any loadable checkpoint as a Hugging Face folder (config.json, safetensors, tokenizer).

Used to turn the embedded GGUF into a transformers-loadable `Gemma3ForCausalLM` folder:
tensors under `model.`-prefixed names, norms back in transformers' convention (w, not
llama.cpp's 1 + w), in `dtype`: `auto` (bfloat16: what the model runs in, half the bytes;
a GGUF's dequantised values are rounded to it, as loading the GGUF in bf16 does) or
`float32` (the dequantised values exactly). `fastgemma convert MODEL --out DIR [--dtype D]`.
Files get the permissions the umask allows.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from fastgemma.weights.checkpoint import gguf_meta_folder, open_tensors
from fastgemma.weights.source import resolve_model

DTYPES = {"auto": None, "bfloat16": torch.bfloat16, "float32": torch.float32}


def output_dtype(name: str, default: torch.dtype | None) -> torch.dtype | None:
    """The dtype a written folder's floating tensors get (None: each keeps its stored dtype)."""
    if name not in DTYPES:
        raise ValueError(f"unknown --dtype {name!r}; use one of: {', '.join(DTYPES)}")
    return DTYPES[name] or default


def convert_to_hf_folder(model: str | None, out: Path, dtype: str = "auto") -> Path:
    from safetensors.torch import save_file

    from fastgemma.paths import with_normal_permissions

    source = resolve_model(model)
    if source.kind != "gguf":
        raise ValueError(f"{source.name} is already a Hugging Face folder; nothing to convert")
    target = output_dtype(dtype, torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    tensors = open_tensors(source)
    state = {name if name == "lm_head.weight" else f"model.{name}": tensors.read(name, target) for name in tensors}
    tensors.close()
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    del state
    for f in gguf_meta_folder(source.path).iterdir():
        if f.is_file():
            shutil.copy(f, out / f.name)
    config = json.loads((out / "config.json").read_text())
    config["dtype"] = str(target).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    with_normal_permissions(out)
    return out
