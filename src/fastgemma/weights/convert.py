"""Write any loadable checkpoint as a Hugging Face folder (config.json, safetensors, tokenizer).

Used to turn the embedded GGUF into a transformers-loadable `Gemma3ForCausalLM` folder:
tensors are the dequantised fp32 weights under `model.`-prefixed names, norms back in
transformers' convention (w, not llama.cpp's 1 + w). `fastgemma convert MODEL --out DIR`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from fastgemma.weights.checkpoint import gguf_meta_folder, iter_tensors
from fastgemma.weights.source import resolve_model


def convert_to_hf_folder(model: str | None, out: Path) -> Path:
    from safetensors.torch import save_file

    source = resolve_model(model)
    if source.kind != "gguf":
        raise ValueError(f"{source.name} is already a Hugging Face folder; nothing to convert")
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in iter_tensors(source):
        tensors[name if name == "lm_head.weight" else f"model.{name}"] = tensor.contiguous()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    for f in gguf_meta_folder(source.path).iterdir():
        if f.is_file():
            shutil.copy(f, out / f.name)
    return out
