"""What one decode step must read from memory: the model's own cost model.

Batch-1 decode is bound by memory bandwidth: every weight matrix is read once per token,
plus one row of each embedding table and the K/V of every cached position. This module
counts those bytes from the loaded model; it measures nothing.
"""

from __future__ import annotations

from fastgemma.kernels.linear import Linear
from fastgemma.models.gemma import GemmaForCausalLM


def weight_bytes_per_token(model: GemmaForCausalLM) -> int:
    """Linear weights (all read per token, quantised ones as stored) + the lm_head (its int8
    screen copy when the screen is on, which greedy decoding reads instead) + one
    embedding row per table."""
    total = sum(m.nbytes() for m in model.modules() if isinstance(m, Linear) and m is not model.lm_head)
    emb = model.embed_tokens.weight
    head = model.lm_head_weight()
    if model.lm_head_screen is not None:
        total += model.lm_head_screen.nbytes()
    else:
        total += head.numel() * head.element_size()
    total += emb.shape[1] * emb.element_size()  # the token's embedding row
    if model.spec.per_layer_input_size:
        ple = model.ple_host if model.ple_host is not None else model.embed_tokens_per_layer.weight
        total += ple.shape[1] * ple.element_size()
    return total


def kv_bytes_per_token(model: GemmaForCausalLM, context: int) -> int:
    """K and V read by attention at `context` cached positions (rings capped at the window)."""
    spec, elt = model.spec, model.embed_tokens.weight.element_size()
    total = 0
    for i in spec.cache_layers:
        layer = spec.layers[i]
        seen = min(context, spec.sliding_window) if layer.is_sliding else context
        readers = sum(1 for other in spec.layers if other.kv_source == i)  # itself + shared layers
        total += readers * 2 * layer.num_kv_heads * layer.head_dim * seen * elt
    return total


def bytes_per_token(model: GemmaForCausalLM, context: int) -> int:
    return weight_bytes_per_token(model) + kv_bytes_per_token(model, context)
