"""Fill a `GemmaForCausalLM` from checkpoint tensors.

Owns the mapping from Hugging Face decoder names to our parameters, including the fusions
(q/k/v -> `qkv_proj`, gate/up -> `gate_up_proj`) and the norm scales (kept in fp32 as
offset + w, after rounding w to the model dtype, as the references do). KV-shared layers'
k/v weights, which Google's Gemma 4 checkpoints carry and re-saved ones omit, are ignored
either way. A tensor the decoder needs and the checkpoint lacks is an error naming it.
A quantised checkpoint (weights/quantize.py) has `qweight` + `scales` in place of the body
linears' `weight`: they are concatenated the same way and loaded into quantised `Linear`s.
Under `gguf` a GGUF's body linears keep the file's blocks (`qweight` + `layout`,
kernels/gguf.py); a matrix with a part in a type no kernel here reads stays dense.

Two steps: `checkpoint_state` (checkpoint tensors -> our state dict, which the ready cache
may keep: weights/ready.py) and `assemble` (state dict -> the built model).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fastgemma.kernels import KernelChoice, gguf, quant
from fastgemma.kernels.quant import QuantScheme
from fastgemma.kernels.schemes import GGUF
from fastgemma.models.gemma import GemmaForCausalLM
from fastgemma.models.spec import ArchSpec
from fastgemma.weights.checkpoint import CheckpointTensors
from fastgemma.weights.quantize import is_quantized_linear, quantize_rows

MAPPED = ("embed_tokens.weight", "embed_tokens_per_layer.weight")  # embedding tables: rows read per step
_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def required_tensors(spec: ArchSpec) -> dict[str, list[str]]:
    """Our state-dict key -> the checkpoint names it is made of (concatenated along rows)."""
    req: dict[str, list[str]] = {"embed_tokens.weight": ["embed_tokens.weight"], "norm.scale": ["norm.weight"]}
    if not spec.tie_word_embeddings:
        req["lm_head.weight"] = ["lm_head.weight"]
    if spec.per_layer_input_size:
        for name in ("embed_tokens_per_layer.weight", "per_layer_model_projection.weight"):
            req[name] = [name]
        req["per_layer_projection_norm.scale"] = ["per_layer_projection_norm.weight"]
    for i, layer in enumerate(spec.layers):
        p = f"layers.{i}."
        qkv = [p + "self_attn.q_proj.weight"]
        if not layer.kv_shared:
            qkv.append(p + "self_attn.k_proj.weight")
            if not layer.k_eq_v:
                qkv.append(p + "self_attn.v_proj.weight")
            req[p + "self_attn.k_norm.scale"] = [p + "self_attn.k_norm.weight"]
        req[p + "self_attn.qkv_proj.weight"] = qkv
        req[p + "self_attn.o_proj.weight"] = [p + "self_attn.o_proj.weight"]
        req[p + "self_attn.q_norm.scale"] = [p + "self_attn.q_norm.weight"]
        req[p + "mlp.gate_up_proj.weight"] = [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
        req[p + "mlp.down_proj.weight"] = [p + "mlp.down_proj.weight"]
        for norm in _NORMS:
            req[p + norm + ".scale"] = [p + norm + ".weight"]
        if spec.per_layer_input_size:
            for name in ("per_layer_input_gate.weight", "per_layer_projection.weight"):
                req[p + name] = [p + name]
            req[p + "post_per_layer_input_norm.scale"] = [p + "post_per_layer_input_norm.weight"]
        if spec.family == "gemma4":
            req[p + "layer_scalar"] = [p + "layer_scalar"]
    return req


def checkpoint_state(
    spec: ArchSpec,
    tensors: Mapping[str, torch.Tensor],
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
    stored: QuantScheme | None = None,
    quantize_to: QuantScheme | None = None,
) -> dict[str, torch.Tensor]:
    """The decoder's state dict (our names: fused q/k/v and gate/up, norm scales, codes and
    scales of quantised linears) from checkpoint `tensors` (decoder names, any dtype), in
    `dtype` on `device`. `stored`: the checkpoint's quantisation (its body linears are codes
    and scales); `quantize_to`: quantise an unquantised checkpoint's body linears from the
    stored weights (before rounding to `dtype`, as `fastgemma quantize` does). Embedding
    tables stored in `dtype` are mapped from the file on the CPU (`MAPPED`); the PLE table
    stays in host memory whatever the device (models/gemma.py)."""
    assert stored is None or quantize_to is None
    required = required_tensors(spec)
    scheme = stored or quantize_to
    bases = [k.removesuffix(".weight") for k in required if scheme is not None and _is_quantized(required, k)]
    if stored is not None:
        required = _quantized_required(required)
    check_present(required, tensors, "the decoder")
    with torch.device("meta"):
        model = GemmaForCausalLM(spec, max_model_len)  # meta: the state's names and shapes
    codes = {}
    second = "layout" if scheme == GGUF else "scales"  # what goes with each `qweight`
    for base in bases:
        module = model.get_submodule(base)
        if stored is not None:
            qweight = torch.cat([tensors[n] for n in required[base + ".qweight"]], dim=0)
            scales = torch.cat([tensors[n].float() for n in required[base + ".scales"]], dim=0)
            _check_codes(base, module, stored, qweight, scales)
        elif scheme == GGUF:
            if (found := _gguf_blocks(tensors, required[base + ".weight"], module.in_features)) is None:
                continue  # stays dense
            qweight, scales = found
            del required[base + ".weight"]
        else:  # per-row schemes: quantising the fused matrix = quantising its parts' row slices
            qweight, scales = quantize_rows(tensors, required.pop(base + ".weight"), quantize_to)
        codes[base + ".qweight"], codes[f"{base}.{second}"] = qweight, scales
        module.quantize_(scheme, (qweight, scales), dtype=dtype)
    state = {key: value.to(device) for key, value in codes.items()}
    state.update(fill_state(model, {k: v for k, v in required.items() if k not in codes}, tensors, spec, dtype, device))
    unset = set(model.state_dict()) - set(state)
    assert not unset, f"loader does not fill {sorted(unset)}"
    return state


def assemble(
    spec: ArchSpec,
    state: dict[str, torch.Tensor],
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
    scheme: QuantScheme | None,
    kernels: KernelChoice = KernelChoice(),
    screen_codes: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> GemmaForCausalLM:
    """The decoder from its state dict (`checkpoint_state`'s, or a cached copy of it;
    consumed: the model takes its tensors), kernels built (`screen_codes`: the lm_head
    screen's, cached)."""
    with torch.device("meta"):
        model = GemmaForCausalLM(spec, max_model_len, kernels)
    second = ".layout" if scheme == GGUF else ".scales"
    for key in [k for k in state if k.endswith(".qweight")]:
        base = key.removesuffix(".qweight")
        model.get_submodule(base).quantize_(scheme, (state[key], state[base + second]), dtype=dtype)
    model.load_state_dict(state, assign=True)
    state.clear()  # the model holds the tensors now; build_kernels re-lays the layers out
    model.requires_grad_(False)  # inference only: no autograd graph may hold intermediates of loading
    # Off the CPU the PLE table stays in host memory (models/gemma.py); on it, it is mapped from the file.
    return model.to_device(device, ple_on_host=device.type != "cpu").eval().build_kernels(screen_codes)


def check_present(required: dict[str, list[str]], tensors: Mapping[str, torch.Tensor], what: str) -> None:
    """A ValueError naming the checkpoint tensors `required` lists that `tensors` lacks."""
    missing = sorted({n for names in required.values() for n in names if n not in tensors})
    if missing:
        shown = ", ".join(missing[:8]) + (f", ... ({len(missing)} in all)" if len(missing) > 8 else "")
        raise ValueError(f"checkpoint is missing tensors {what} needs: {shown}")


def fill_state(
    model: torch.nn.Module,
    required: dict[str, list[str]],
    tensors: Mapping[str, torch.Tensor],
    spec: ArchSpec,
    dtype: torch.dtype,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """Our state-dict entries from checkpoint tensors: parts concatenated along rows, norm
    scales as offset + w (w rounded to `dtype` first), `layer_scalar` as [1], each checked
    against the shape the config implies."""
    expected = model.state_dict()
    state: dict[str, torch.Tensor] = {}
    for key, names in required.items():
        if key.endswith(".scale"):
            value = tensors[names[0]].to(dtype).float() + spec.norm_offset
        elif key.endswith("layer_scalar"):
            value = tensors[names[0]].to(dtype).reshape(1)
        elif not expected[key].is_floating_point():  # index buffers (the assistant's token ordering)
            value = tensors[names[0]]
        elif key in MAPPED and device.type == "cpu" and isinstance(tensors, CheckpointTensors) and (
            mapped := tensors.mapped(names[0], dtype)
        ) is not None:
            value = mapped  # an embedding table stored as it runs: read from the file when touched
        else:
            value = read_rows_into(tensors, names, dtype)
        if value.shape != expected[key].shape:
            raise ValueError(
                f"tensor {names} has shape {tuple(value.shape)}, the config implies {tuple(expected[key].shape)}"
            )
        state[key] = value if key == "embed_tokens_per_layer.weight" else value.to(device)  # stays in host memory
    return state


def read_rows_into(tensors: Mapping[str, torch.Tensor], names: list[str], dtype: torch.dtype) -> torch.Tensor:
    """The named tensors concatenated along rows, in `dtype`, read straight into one new tensor
    (slice by slice when `tensors` is a lazy `CheckpointTensors`)."""
    shapes = [_shape(tensors, n) for n in names]
    out = torch.empty((sum(s[0] for s in shapes), *shapes[0][1:]) if shapes[0] else (), dtype=dtype)
    row = 0
    for name, shape in zip(names, shapes):
        part = out[row : row + shape[0]] if shape else out
        if shape[1:] != shapes[0][1:]:
            raise ValueError(f"tensors {names} cannot be concatenated: shapes {shapes}")
        if isinstance(tensors, CheckpointTensors):
            tensors.read(name, dtype, part)
        else:
            part.copy_(tensors[name])
        row += shape[0] if shape else 0
    return out


def _shape(tensors: Mapping[str, torch.Tensor], name: str) -> tuple[int, ...]:
    return tensors.shape(name) if isinstance(tensors, CheckpointTensors) else tuple(tensors[name].shape)


def _gguf_blocks(
    tensors: Mapping[str, torch.Tensor], names: list[str], K: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The named GGUF matrices' blocks concatenated (uint8) and their layout ([P, 2]: ggml
    type, rows), or None when one is not in blocks a kernel here reads."""
    found = [tensors.ggml_blocks(n) if isinstance(tensors, CheckpointTensors) else None for n in names]
    if any(f is None or not gguf.fits(f[0], K) for f in found):
        return None
    blocks = torch.cat([b.reshape(-1) for _, b in found])
    return blocks, torch.tensor([[t, b.shape[0]] for t, b in found], dtype=torch.int64)


def _is_quantized(required: dict[str, list[str]], key: str) -> bool:
    """Our parameter `key` is a quantised linear: the checkpoint matrices it fuses are."""
    return key.endswith(".weight") and all(is_quantized_linear(n) for n in required[key])


def _quantized_required(required: dict[str, list[str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, names in required.items():
        if _is_quantized(required, key):
            base = key.removesuffix(".weight")
            out[base + ".qweight"] = [n.removesuffix(".weight") + ".qweight" for n in names]
            out[base + ".scales"] = [n.removesuffix(".weight") + ".scales" for n in names]
        else:
            out[key] = names
    return out


def _check_codes(name: str, module, scheme: QuantScheme, qweight: torch.Tensor, scales: torch.Tensor) -> None:
    s = quant.scheme_for(scheme, module.in_features)
    N, K = module.out_features, module.in_features
    want_q = (torch.int8, (N, K)) if s.bits == 8 else (torch.uint8, (N, K // 2))
    want_s = (N,) if s.bits == 8 else (N, K // s.group)
    if (qweight.dtype, tuple(qweight.shape)) != want_q or tuple(scales.shape) != want_s:
        raise ValueError(
            f"{name}: codes {qweight.dtype} {tuple(qweight.shape)} / scales {tuple(scales.shape)} do not fit "
            f"scheme {s.name} for a {N}x{K} matrix (expected {want_q[0]} {want_q[1]} / {want_s}); "
            "re-create the folder with `fastgemma quantize`"
        )
