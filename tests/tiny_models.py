"""Tiny random Gemma checkpoints built from transformers configs, saved with save_pretrained.

Weights are random with non-trivial norm weights and `layer_scalar`, so that a port that
ignores a norm, its offset or the scalar cannot pass. `reference_model` is transformers'
own implementation (eager attention, fp32) of the same checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch

SLIDING, FULL = "sliding_attention", "full_attention"


def randomize(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))  # Gemma 4: w; Gemma 3: 1 + w
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))


def gemma4_e4b_like_config(vocab_size: int = 512):
    """KV sharing on both layer types, global head dim != head dim, proportional RoPE."""
    from transformers import Gemma4TextConfig

    layer_types = [SLIDING, SLIDING, FULL, SLIDING, SLIDING, FULL, SLIDING, FULL]
    return Gemma4TextConfig(
        vocab_size=vocab_size, vocab_size_per_layer_input=vocab_size, hidden_size=64, intermediate_size=96,
        num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        global_head_dim=32, num_global_key_value_heads=2, hidden_size_per_layer_input=8,
        sliding_window=8, num_kv_shared_layers=3, layer_types=layer_types, final_logit_softcapping=30.0,
        max_position_embeddings=256, rms_norm_eps=1e-6, attn_implementation="eager",
    )


def gemma4_e2b_like_config(vocab_size: int = 512):
    """One KV head, double-wide MLP on the KV-shared layers."""
    from transformers import Gemma4TextConfig

    layer_types = [SLIDING, FULL, SLIDING, SLIDING, FULL, SLIDING, FULL]
    return Gemma4TextConfig(
        vocab_size=vocab_size, vocab_size_per_layer_input=vocab_size, hidden_size=48, intermediate_size=64,
        num_hidden_layers=7, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        global_head_dim=32, num_global_key_value_heads=1, hidden_size_per_layer_input=8,
        sliding_window=8, num_kv_shared_layers=4, layer_types=layer_types, use_double_wide_mlp=True,
        final_logit_softcapping=30.0, max_position_embeddings=256, attn_implementation="eager",
    )


def gemma4_k_eq_v_config(vocab_size: int = 512):
    """Full layers whose values are their (un-normed) keys (`attention_k_eq_v`), 1 global KV head."""
    from transformers import Gemma4TextConfig

    layer_types = [SLIDING, SLIDING, FULL, SLIDING, FULL]
    return Gemma4TextConfig(
        vocab_size=vocab_size, vocab_size_per_layer_input=vocab_size, hidden_size=32, intermediate_size=64,
        num_hidden_layers=5, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
        global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True, hidden_size_per_layer_input=8,
        sliding_window=8, num_kv_shared_layers=2, layer_types=layer_types, final_logit_softcapping=30.0,
        max_position_embeddings=256, attn_implementation="eager",
    )


def gemma3_config(vocab_size: int = 512):
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
        sliding_window=8, layer_types=[SLIDING, SLIDING, FULL, SLIDING], max_position_embeddings=256,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                         "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0}},
        attn_implementation="eager",
    )


def save_tiny(config, folder: Path, seed: int = 0) -> Path:
    """Build the causal LM for `config`, randomise it, save it to `folder`."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    randomize(model, seed)
    model.save_pretrained(folder)
    return folder


def reference_model(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
