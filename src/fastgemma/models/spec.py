"""The decoder's architecture, read once from a transformers config.

`ArchSpec` is the only place that knows how Gemma 3 and Gemma 4 configs name things. It
owns: which variant the checkpoint is, the per-layer geometry (head dim, KV heads, RoPE,
sliding or full, KV-shared or not), and the numerics that differ between the families
(norm offset, attention scaling, v-norm, PLE, logit softcaps). It does not own weights,
caches or the forward pass.

Supported `model_type`s: see `SUPPORTED_MODEL_TYPES`. A multimodal config (`gemma3`,
`gemma4`) contributes its `text_config`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_MODEL_TYPES = ("gemma3_text", "gemma3", "gemma4_text", "gemma4")
SLIDING, FULL = "sliding_attention", "full_attention"
EXTERNAL_KV = -1  # kv_source of a layer that reads another model's cache (the MTP assistant's layers)


@dataclass(frozen=True)
class RopeSpec:
    """RoPE for one layer type. `inv_freq[i] = theta^(-2i/dim)` for the rotated pairs.

    rope_type "default": every pair rotates; "linear": inv_freq / factor;
    "proportional" (Gemma 4 full layers): the first `partial_rotary_factor * dim / 2` pairs
    rotate with exponent 2i/dim (the full head dim), the rest have inv_freq 0 (identity).
    """

    rope_type: str
    theta: float
    factor: float = 1.0
    partial_rotary_factor: float = 1.0


@dataclass(frozen=True)
class LayerSpec:
    layer_type: str  # SLIDING or FULL
    head_dim: int
    num_kv_heads: int
    kv_shared: bool  # reads the K/V of `kv_source` instead of computing its own
    kv_source: int  # the layer whose cache this layer attends over (itself if not shared; EXTERNAL_KV)
    intermediate_size: int
    k_eq_v: bool  # values are the (un-normed) key projection (attention_k_eq_v full layers)

    @property
    def is_sliding(self) -> bool:
        return self.layer_type == SLIDING


@dataclass(frozen=True)
class ArchSpec:
    family: str  # "gemma3" | "gemma4"
    model_type: str  # the config's own model_type
    vocab_size: int
    hidden_size: int
    num_heads: int
    layers: tuple[LayerSpec, ...]
    rope: dict[str, RopeSpec]  # by layer type
    sliding_window: int
    rms_norm_eps: float
    norm_offset: float  # Gemma 3 scales by (1 + w), Gemma 4 by w
    attn_scaling: float  # multiplies q·k
    attn_softcap: float | None
    final_softcap: float | None
    v_norm: bool  # weightless RMSNorm on values (Gemma 4)
    per_layer_input_size: int  # PLE width P; 0 = no PLE (Gemma 3)
    vocab_size_per_layer_input: int
    max_position_embeddings: int
    pad_token_id: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    tie_word_embeddings: bool

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def embed_scale(self) -> float:
        return self.hidden_size**0.5

    @property
    def cache_layers(self) -> list[int]:
        """Layers that own a KV cache (everything not KV-shared)."""
        return [i for i, layer in enumerate(self.layers) if not layer.kv_shared]

    @property
    def kv_store_layers(self) -> dict[str, int]:
        """Layer type -> the last layer of that type with a cache of its own (transformers'
        "store" layers): the K/V a Gemma 4 assistant reads."""
        return {layer.layer_type: i for i, layer in enumerate(self.layers) if not layer.kv_shared}

    @property
    def first_kv_shared_layer(self) -> int:
        shared = [i for i, layer in enumerate(self.layers) if layer.kv_shared]
        return shared[0] if shared else self.num_layers


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    value = getattr(cfg, name, default)
    return default if value is None else value


def _rope_specs(cfg: Any, layer_types: list[str]) -> dict[str, RopeSpec]:
    params = _get(cfg, "rope_parameters", {}) or {}
    specs = {}
    for layer_type in set(layer_types):
        p = params.get(layer_type) if isinstance(params, dict) else None
        if p is None:
            raise ValueError(f"config has no rope_parameters for {layer_type}")
        rope_type = p.get("rope_type", "default")
        if rope_type not in ("default", "linear", "proportional"):
            raise ValueError(
                f"unsupported rope_type {rope_type!r} for {layer_type}; "
                "fastgemma supports default, linear and proportional"
            )
        specs[layer_type] = RopeSpec(
            rope_type=rope_type,
            theta=float(p["rope_theta"]),
            factor=float(p.get("factor", 1.0) or 1.0),
            partial_rotary_factor=float(p.get("partial_rotary_factor", 1.0) or 1.0),
        )
    return specs


def _eos_ids(cfg: Any, extra: list[int] | None) -> tuple[int, ...]:
    eos = _get(cfg, "eos_token_id", [])
    eos = [eos] if isinstance(eos, int) else list(eos)
    for e in extra or []:
        if e not in eos:
            eos.append(e)
    return tuple(eos)


def arch_spec_from_config(config: Any, extra_eos_ids: list[int] | None = None) -> ArchSpec:
    """Build the spec from a transformers `PretrainedConfig` (text or multimodal)."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"unsupported model_type {model_type!r}; fastgemma supports: "
            + ", ".join(SUPPORTED_MODEL_TYPES)
        )
    text = config.get_text_config() if model_type in ("gemma3", "gemma4") else config
    family = "gemma4" if model_type.startswith("gemma4") else "gemma3"
    if _get(text, "enable_moe_block", False):
        raise ValueError("Gemma 4 mixture-of-experts checkpoints are not supported yet; use E2B/E4B")
    if _get(text, "use_bidirectional_attention", None) not in (None, False):
        raise ValueError("bidirectional-attention Gemma variants are not supported (decoders only)")

    n = text.num_hidden_layers
    layer_types = list(text.layer_types)
    num_heads = text.num_attention_heads
    hidden = text.hidden_size

    if family == "gemma4":
        # The last num_kv_shared_layers layers reuse K/V (transformers' kv_sharing_modes
        # "reuse"; all of them in an assistant), computed here: older releases lack the property.
        first_shared = n - text.num_kv_shared_layers
        per_layer = text.per_layer_config
        k_eq_v_flag = bool(_get(text, "attention_k_eq_v", False))
    else:
        first_shared, per_layer, k_eq_v_flag = n, None, False

    layers = []
    for i, layer_type in enumerate(layer_types):
        if per_layer is not None:
            lc = per_layer[i]
            head_dim, num_kv = lc.head_dim, lc.num_key_value_heads
        else:
            head_dim = _get(text, "head_dim", hidden // num_heads)
            num_kv = text.num_key_value_heads
        shared = i >= first_shared
        if shared:
            # The last non-shared layer of the same type (transformers' "store" layer); none
            # in a Gemma 4 assistant, whose layers all read its target's cache.
            producers = [j for j in range(first_shared) if layer_types[j] == layer_type]
            source = max(producers) if producers else EXTERNAL_KV
        else:
            source = i
        double = family == "gemma4" and _get(text, "use_double_wide_mlp", False) and shared
        layers.append(
            LayerSpec(
                layer_type=layer_type,
                head_dim=head_dim,
                num_kv_heads=num_kv,
                kv_shared=shared,
                kv_source=source,
                intermediate_size=text.intermediate_size * (2 if double else 1),
                k_eq_v=k_eq_v_flag and layer_type == FULL,
            )
        )
    # A shared layer attends over its source's K/V, so the geometry must agree.
    for layer in layers:
        if layer.kv_source == EXTERNAL_KV:
            continue
        src = layers[layer.kv_source]
        if (layer.head_dim, layer.num_kv_heads) != (src.head_dim, src.num_kv_heads):
            raise ValueError("a KV-shared layer's head geometry differs from its source layer's")

    if family == "gemma4":
        attn_scaling, norm_offset, v_norm = 1.0, 0.0, True
        ple = int(_get(text, "hidden_size_per_layer_input", 0) or 0)
    else:
        attn_scaling = float(text.query_pre_attn_scalar) ** -0.5
        norm_offset, v_norm, ple = 1.0, False, 0

    return ArchSpec(
        family=family,
        model_type=model_type,
        vocab_size=text.vocab_size,
        hidden_size=hidden,
        num_heads=num_heads,
        layers=tuple(layers),
        rope=_rope_specs(text, layer_types),
        sliding_window=int(text.sliding_window),
        rms_norm_eps=float(text.rms_norm_eps),
        norm_offset=norm_offset,
        attn_scaling=attn_scaling,
        attn_softcap=_get(text, "attn_logit_softcapping", None),
        final_softcap=_get(text, "final_logit_softcapping", None),
        v_norm=v_norm,
        per_layer_input_size=ple,
        vocab_size_per_layer_input=int(_get(text, "vocab_size_per_layer_input", text.vocab_size)),
        max_position_embeddings=int(_get(text, "max_position_embeddings", 8192)),
        pad_token_id=int(_get(text, "pad_token_id", 0)),
        bos_token_id=_get(text, "bos_token_id", None),
        eos_token_ids=_eos_ids(text, extra_eos_ids),
        tie_word_embeddings=bool(_get(config, "tie_word_embeddings", True)),
    )
