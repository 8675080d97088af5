"""Quantised checkpoints: which tensors are quantised, and the folder `fastgemma quantize` writes.

The decoder body's linear weights (attention q/k/v/o, MLP gate/up/down, the Gemma 4 PLE
gate/projection and model projection) are stored as `<name>.qweight` + `<name>.scales`
(kernels/quant.py) in place of `<name>.weight`; embeddings, norms and an untied lm_head stay
in full precision (greedy decoding reads the lm_head through the exact screen instead).
The schemes are per output row, so q/k/v (and gate/up) quantised one by one are the fused
matrix quantised at once: the loader concatenates codes and scales along rows.

config.json carries `"quantization_config": {"quant_method": "fastgemma", "scheme": S}`;
such a folder loads like any checkpoint and is "the submitted checkpoint": its plain path
is the dequantised model. A multimodal Gemma 4's vision / audio tower tensors are copied
unquantised (they run once per request, at prefill).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from fastgemma.kernels import quant
from fastgemma.kernels.quant import QuantScheme

QUANT_METHOD = "fastgemma"
_LINEAR = re.compile(
    r"(layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj|per_layer_input_gate|per_layer_projection)"
    r"|per_layer_model_projection)\.weight"
)


def is_quantized_linear(name: str) -> bool:
    """Decoder name of a tensor that a quantised checkpoint stores as codes and scales."""
    return _LINEAR.fullmatch(name) is not None


def checkpoint_scheme(hf_config: Any) -> QuantScheme | None:
    """The scheme a checkpoint was written with, from its config; None if unquantised."""
    qc = getattr(hf_config, "quantization_config", None)
    if qc is None:
        text = getattr(hf_config, "text_config", None)
        qc = getattr(text, "quantization_config", None) if text is not None else None
    if qc is None:
        return None
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    method = qc.get("quant_method")
    if method != QUANT_METHOD:
        raise ValueError(
            f"checkpoint quantised with {method!r}; fastgemma loads unquantised checkpoints and its own "
            "(`fastgemma quantize`) — pass the original model and --quantization instead"
        )
    scheme = QuantScheme.parse(qc.get("scheme", ""))
    if scheme is None:
        raise ValueError("quantization_config names scheme 'none'; remove it from config.json")
    return scheme


def write_quantized_folder(model: str | None, scheme_name: str, out: Path) -> Path:
    """Quantise a checkpoint's body linears from its stored weights and write a folder."""
    from safetensors.torch import save_file

    from fastgemma.weights.checkpoint import gguf_meta_folder, iter_tensors, iter_tower_tensors
    from fastgemma.weights.source import resolve_model

    scheme = QuantScheme.parse(scheme_name)
    if scheme is None:
        raise ValueError("--scheme none writes nothing new; use `fastgemma convert` for an unquantised folder")
    source = resolve_model(model)
    meta = gguf_meta_folder(source.path) if source.kind == "gguf" else source.path
    config = json.loads((meta / "config.json").read_text())
    if "quantization_config" in config or "quantization_config" in config.get("text_config", {}):
        raise ValueError(f"{source.name} is already quantised; quantise the original checkpoint")
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in iter_tensors(source):
        key = name if name == "lm_head.weight" else f"model.{name}"
        if is_quantized_linear(name) and tensor.dim() == 2:
            qweight, scales = quant.quantize(tensor, quant.scheme_for(scheme, tensor.shape[1]))
            base = key.removesuffix(".weight")
            tensors[base + ".qweight"], tensors[base + ".scales"] = qweight, scales
        else:
            tensors[key] = tensor.contiguous()
    for name, tensor in iter_tower_tensors(source):  # vision / audio towers: copied unquantised
        tensors[f"model.{name}"] = tensor.contiguous()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    for f in meta.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy(f, out / f.name)
    config["quantization_config"] = {"quant_method": QUANT_METHOD, "scheme": scheme.name}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
