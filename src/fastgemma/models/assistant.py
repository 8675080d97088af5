"""The Gemma 4 assistant (multi-token-prediction drafter), as transformers'
`Gemma4AssistantForCausalLM` computes it.

A small Gemma 4 decoder whose layers are all KV-shared with its target: a layer of type t
attends over the cached K/V of the target's last layer of type t with a cache of its own
(`ArchSpec.kv_store_layers`; transformers' "store" layers). It owns no cache. One step:

    x      = pre_projection(cat(E_target(token), h))       [1, 2 * Db] -> [1, Da]
    y      = norm(decoder layers(x) at position p)         [1, Da]   (RoPE at p for q only)
    logits = lm_head(y)                                    [1, V]    (tied to its embed_tokens;
                                                                      no final softcap)
    h'     = post_projection(y)                            [1, Db]   (the next step's h)

with Db the target's hidden size, E_target the target's scaled input embedding, `token` the
last token (at position p) and h the target's final (normed) hidden state at p - 1. Drafting
K tokens repeats the step K times at the same position p over the same K/V, feeding back
(argmax token, h') — transformers' `Gemma4AssistantCandidateGenerator`.

Which keys a step sees, as transformers' assistant masks them for a query at p over the
target's K/V of positions 0..p-1: full layers all p of them; sliding layers the last W + 1
(`sliding_window_bidirectional_overlay` allows |q - k| <= W on the flipped axis), one more
than a sliding query of the target sees. `context_kv` cuts those from the target's cache.

`use_ordered_embeddings` checkpoints score only part of the vocabulary (the masked
embedder): centroid logits pick the top `centroid_intermediate_top_k` of `num_centroids`
clusters of `token_ordering`, their tokens get lm_head logits, every other token gets
(least selected logit - 1).

This module owns the assistant's weights and maths; the drafting loop is engine/mtp.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fastgemma.kernels import KernelChoice
from fastgemma.kernels.linear import Linear, linear
from fastgemma.models.attention import KV
from fastgemma.models.gemma import DecoderLayer
from fastgemma.models.kv_cache import AttentionMetadata, KVCache
from fastgemma.models.layers import RMSNorm, rope_table
from fastgemma.models.spec import SLIDING, ArchSpec


@dataclass(frozen=True)
class AssistantSpec:
    """What a `gemma4_assistant` config adds to its text decoder's `ArchSpec`."""

    text: ArchSpec  # every layer KV-shared (kv_source EXTERNAL_KV)
    backbone_hidden_size: int  # Db: the target's hidden size
    num_centroids: int | None  # None: a full lm_head (use_ordered_embeddings False)
    centroid_top_k: int

    def check_target(self, target: ArchSpec) -> None:
        """Raise ValueError unless this assistant can draft for `target`."""
        t = self.text
        problems = []
        if target.family != "gemma4":
            problems.append(f"the target is {target.model_type}, not a Gemma 4 model")
        if self.backbone_hidden_size != target.hidden_size:
            problems.append(f"backbone_hidden_size {self.backbone_hidden_size} != target hidden size {target.hidden_size}")
        if t.vocab_size != target.vocab_size:
            problems.append(f"vocab size {t.vocab_size} != target's {target.vocab_size}")
        if t.sliding_window > target.sliding_window:
            problems.append(f"sliding window {t.sliding_window} > target's {target.sliding_window}")
        stores = target.kv_store_layers
        for i, layer in enumerate(t.layers):
            src = stores.get(layer.layer_type)
            if src is None:
                problems.append(f"layer {i} is {layer.layer_type}, which the target has no cache for")
            elif (layer.head_dim, layer.num_kv_heads) != (target.layers[src].head_dim, target.layers[src].num_kv_heads):
                problems.append(
                    f"layer {i} ({layer.layer_type}) expects head dim {layer.head_dim} x {layer.num_kv_heads} KV heads, "
                    f"the target's layer {src} has {target.layers[src].head_dim} x {target.layers[src].num_kv_heads}"
                )
        if problems:
            raise ValueError("the draft model does not fit the target: " + "; ".join(problems))


class Gemma4Assistant(nn.Module):
    def __init__(self, spec: AssistantSpec, max_model_len: int, kernels: KernelChoice = KernelChoice()):
        super().__init__()
        self.spec = spec
        # fastgemma's GEMV and norm kernels for the one-row linears, as the target's (attention
        # stays torch's: the keys are the target's, cut by `context_kv`)
        native = self.use_native = kernels.native
        t = spec.text
        Da, Db, V = t.hidden_size, spec.backbone_hidden_size, t.vocab_size
        self.embed_tokens = nn.Embedding(V, Da)  # used only as the tied lm_head
        self.layers = nn.ModuleList(DecoderLayer(t, i, native, native_attention=False) for i in range(t.num_layers))
        self.norm = RMSNorm(Da, t.rms_norm_eps, use_rsqrt=False, native=native)
        self.pre_projection = Linear(2 * Db, Da, native)
        self.post_projection = Linear(Da, Db, native)
        if spec.num_centroids is not None:
            self.centroids = Linear(Da, spec.num_centroids, native)
            self.token_ordering = nn.Buffer(torch.zeros(V, dtype=torch.long))
        self.rope_cos, self.rope_sin = {}, {}
        for layer in t.layers:
            if layer.layer_type not in self.rope_cos:
                cos, sin = rope_table(t.rope[layer.layer_type], layer.head_dim, max_model_len)
                self.rope_cos[layer.layer_type], self.rope_sin[layer.layer_type] = cos, sin

    def to_device(self, device: torch.device) -> Gemma4Assistant:
        self.to(device)
        self.rope_cos = {k: v.to(device) for k, v in self.rope_cos.items()}
        self.rope_sin = {k: v.to(device) for k, v in self.rope_sin.items()}
        return self

    def context_kv(self, target_spec: ArchSpec, cache: KVCache, position: int) -> dict[str, KV]:
        """Layer type -> the target's K/V [Hkv, S, hd] a query at `position` sees (module docstring)."""
        out = {}
        for layer_type, src in target_spec.kv_store_layers.items():
            window = self.spec.text.sliding_window + 1 if layer_type == SLIDING else None
            out[layer_type] = cache.context(src, position, window)
        return out

    def forward(
        self,
        x: torch.Tensor,  # [1, 2 * Db]: cat(target embedding of the token, target hidden before it)
        position: int,
        kv: dict[str, KV],  # from context_kv
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (normed hidden y [1, Da], next target-space hidden h' [1, Db])."""
        h = self.pre_projection(x)
        pos = torch.tensor([position], device=x.device)
        meta = AttentionMetadata(position, position + 1, pos, dict.fromkeys(kv))  # every given key visible
        for layer in self.layers:
            layer_type = layer.self_attn.layer_type
            cos = self.rope_cos[layer_type][pos].to(h.dtype)
            sin = self.rope_sin[layer_type][pos].to(h.dtype)
            h, _ = layer(h, None, cos, sin, meta, None, kv[layer_type])
        y = self.norm(h)
        return y, self.post_projection(y)

    def logits(self, y: torch.Tensor) -> torch.Tensor:
        """[T, Da] -> [T, V] as transformers' assistant returns them."""
        if self.spec.num_centroids is None:
            return linear(y, self.embed_tokens.weight, self.use_native)
        ids = self.candidates(y)  # [T, n]
        sel = torch.einsum("td,tnd->tn", y, self.embed_tokens.weight[ids])  # [T, n]
        out = torch.full((y.shape[0], self.spec.text.vocab_size), float(sel.min()) - 1.0, dtype=y.dtype, device=y.device)
        return out.scatter_(1, ids, sel)

    def candidates(self, y: torch.Tensor) -> torch.Tensor:
        """Masked embedder: the token ids of the top clusters [T, top_k * V / num_centroids]."""
        C = self.spec.num_centroids
        assert C is not None
        top = torch.topk(linear(y, self.centroids.weight, self.use_native), self.spec.centroid_top_k, dim=-1).indices
        clusters = self.token_ordering.view(C, -1)  # [C, V / C]
        return clusters[top].reshape(y.shape[0], -1)
