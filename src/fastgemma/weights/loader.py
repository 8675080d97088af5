"""Fill a `GemmaForCausalLM` from checkpoint tensors.

Owns the mapping from Hugging Face decoder names to our parameters, including the fusions
(q/k/v -> `qkv_proj`, gate/up -> `gate_up_proj`) and the norm scales (kept in fp32 as
offset + w, after rounding w to the model dtype, as the references do). KV-shared layers'
k/v weights, which Google's Gemma 4 checkpoints carry and re-saved ones omit, are ignored
either way. A tensor the decoder needs and the checkpoint lacks is an error naming it.
"""

from __future__ import annotations

import torch

from fastgemma.models.gemma import GemmaForCausalLM
from fastgemma.models.spec import ArchSpec

_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def _required(spec: ArchSpec) -> dict[str, list[str]]:
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


def load_model(
    spec: ArchSpec,
    tensors: dict[str, torch.Tensor],
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
) -> GemmaForCausalLM:
    """Build the decoder on `device` in `dtype` from `tensors` (decoder names, any dtype)."""
    required = _required(spec)
    missing = sorted({n for names in required.values() for n in names if n not in tensors})
    if missing:
        shown = ", ".join(missing[:8]) + (f", ... ({len(missing)} in all)" if len(missing) > 8 else "")
        raise ValueError(f"checkpoint is missing tensors the decoder needs: {shown}")
    with torch.device("meta"):
        model = GemmaForCausalLM(spec, max_model_len)
    expected = model.state_dict()
    state: dict[str, torch.Tensor] = {}
    for key, names in required.items():
        parts = [tensors[n] for n in names]
        if key.endswith(".scale"):
            value = parts[0].to(dtype).float() + spec.norm_offset
        elif key.endswith("layer_scalar"):
            value = parts[0].to(dtype).reshape(1)
        else:
            value = (torch.cat(parts, dim=0) if len(parts) > 1 else parts[0]).to(dtype)
        if value.shape != expected[key].shape:
            raise ValueError(
                f"tensor {names} has shape {tuple(value.shape)}, the config implies {tuple(expected[key].shape)}"
            )
        state[key] = value.to(device)
    unset = set(expected) - set(state)
    assert not unset, f"loader does not fill {sorted(unset)}"
    model.load_state_dict(state, assign=True)
    return model.to_device(device).eval()
