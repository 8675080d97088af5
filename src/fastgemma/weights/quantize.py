"""Quantised checkpoints: which tensors are quantised, and the folder `fastgemma quantize` writes.

The decoder body's linear weights (attention q/k/v/o, MLP gate/up/down, the Gemma 4 PLE
gate/projection and model projection) are stored as `<name>.qweight` + `<name>.scales`
(kernels/quant.py) in place of `<name>.weight`; embeddings, norms and an untied lm_head are
not quantised (greedy decoding reads the lm_head through the exact screen instead): they are
written as stored, or in `--dtype` (a GGUF's in bfloat16 unless `--dtype float32`).
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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from fastgemma.kernels import quant
from fastgemma.kernels.quant import QuantScheme
from fastgemma.kernels.schemes import GGUF

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
    if scheme is None or scheme == GGUF:
        raise ValueError(f"quantization_config names scheme {scheme.name if scheme else 'none'!r}, which no folder "
                         "stores; re-create the folder with `fastgemma quantize`")
    return scheme


def quantize_rows(
    tensors: Mapping[str, torch.Tensor], names: list[str], scheme: QuantScheme
) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and scales of the named matrices concatenated along rows, quantised a slice of
    rows at a time from the stored weights (the schemes are per row: the same codes)."""
    codes, scales = [], []
    for name in names:
        lazy = hasattr(tensors, "rows")  # a CheckpointTensors: read slice by slice
        rows, K = tensors.shape(name) if lazy else tuple(tensors[name].shape)
        s = quant.scheme_for(scheme, K)
        step = max(1, (1 << 22) // K)
        for a in range(0, rows, step):
            w = tensors.rows(name, a, min(a + step, rows)) if lazy else tensors[name][a : a + step]
            q, sc = quant.quantize(w, s)
            codes.append(q)
            scales.append(sc)
    return torch.cat(codes), torch.cat(scales)


def write_quantized_folder(model: str | None, scheme_name: str, out: Path, dtype: str = "auto") -> Path:
    """Quantise a checkpoint's body linears from its stored weights and write a folder: codes
    and scales for those, every other floating tensor in `dtype` (auto: as stored; a GGUF's
    in bfloat16, as convert.py), a slice of rows at a time."""
    from safetensors.torch import save_file

    from fastgemma.paths import with_normal_permissions
    from fastgemma.weights.checkpoint import gguf_meta_folder, open_tensors, tower_name
    from fastgemma.weights.convert import output_dtype
    from fastgemma.weights.source import resolve_model

    scheme = QuantScheme.parse(scheme_name)
    if scheme is None:
        raise ValueError("--scheme none writes nothing new; use `fastgemma convert` for an unquantised folder")
    if scheme == GGUF:
        raise ValueError("--scheme gguf is a GGUF file's own blocks: load the .gguf with --quantization gguf")
    source = resolve_model(model)
    meta = gguf_meta_folder(source.path) if source.kind == "gguf" else source.path
    config = json.loads((meta / "config.json").read_text())
    if "quantization_config" in config or "quantization_config" in config.get("text_config", {}):
        raise ValueError(f"{source.name} is already quantised; quantise the original checkpoint")
    target = output_dtype(dtype, torch.bfloat16 if source.kind == "gguf" else None)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, torch.Tensor] = {}
    decoder = open_tensors(source)
    for name in decoder:
        key = name if name == "lm_head.weight" else f"model.{name}"
        shape = decoder.shape(name)
        if is_quantized_linear(name) and len(shape) == 2:
            base = key.removesuffix(".weight")
            written[base + ".qweight"], written[base + ".scales"] = quantize_rows(decoder, [name], scheme)
        else:
            written[key] = _stored(decoder, name, target)
    decoder.close()
    towers = open_tensors(source, tower_name)
    for name in towers:  # vision / audio towers: copied unquantised
        written[f"model.{name}"] = _stored(towers, name, target)
    towers.close()
    save_file(written, out / "model.safetensors", metadata={"format": "pt"})
    del written
    for f in meta.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy(f, out / f.name)
    config["quantization_config"] = {"quant_method": QUANT_METHOD, "scheme": scheme.name}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    with_normal_permissions(out)
    return out


def _stored(tensors, name: str, target: torch.dtype | None) -> torch.Tensor:
    """A tensor as written: floating ones in `target` (None: as stored), others as stored."""
    if target is None or not tensors.dtype(name).is_floating_point:
        return tensors[name]
    return tensors.read(name, target)
