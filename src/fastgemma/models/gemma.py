"""The Gemma 3 / Gemma 4 text decoder: embeddings, decoder layers, final norm, logits.

One module covers both families; `ArchSpec` says which features are on. The input path is
split so that multimodal soft tokens can be merged without touching the decoder:

    embeds, ple_ids = model.embed(input_ids, soft_embeds, soft_mask)   # merge happens here
    hidden = model(embeds, ple_ids, meta, cache, keep)                  # [len(keep), D]
    logits = model.compute_logits(hidden)                               # [len(keep), V]

Gemma 4 per-layer embeddings (PLE), with E = the merged input embeddings:
    tok = embed_tokens_per_layer(ple_ids) * sqrt(P)               -> [T, L, P]
    ctx = RMSNorm_P(per_layer_model_projection(E) * D^-0.5)       -> [T, L, P]
    ple = (ctx + tok) * 2^-0.5;  layer i receives ple[:, i]
At soft-token positions `ple_ids` holds the pad id, as transformers does.
The PLE table (E4B: 262144 x 42 x 256 bf16, 5.6 GB) is read a row per token. Off the CPU it
stays in host memory (`to_device(..., ple_on_host=True)`: pinned, `ple_host`) and each
forward gathers its tokens' rows there and sends only them (`ple_rows`; a fixed-shape step
stages them itself, engine/static_step.py); rows are copied, never computed, so this is bit
for bit the table on the device. On the CPU the loader maps it from the file instead.

A forward in stages: `forward` = `advance(begin(...))`. `begin` prepares the inputs (PLE,
RoPE rows) and `advance(work, stages)` runs the next stages, two a layer (its attention, then
its feed-forward), pausing in between (`PartialForward` holds the hidden rows; the K/V are
already in the cache). The engine spreads a long prompt chunk over several steps so; the ops
and their order are the same as one call's, so are the bits.

Prefill shortcut (Gemma 4): when only some positions' hidden states are wanted (`keep`),
the KV-shared layers run on those positions only; scoring passes keep=None (all).
Decode-like chunks (`meta.decode_like`: a decode step, or the K + 1 tokens of a speculative
verification): every token is computed as its own one-token step would be, bit for bit —
row-invariant native GEMVs, row-wise norms, each query attending alone (models/kv_cache.py).
Fused decode (bf16 on CPU): such a chunk runs every layer in one native call
(kernels/decode_layers.py) with the same rounding as the loop below, bit for bit.
Greedy tokens: `greedy_tokens(hidden, allowed)` is argmax(compute_logits(hidden)) per row,
over the ids a row's grammar bitmask allows when it has one; with the lm_head screen on
(kernels/lm_head_screen.py) it gets the same tokens from an int8 copy of lm_head plus a few
exactly recomputed rows.

This module owns no cache and no sampling; it reads and writes the cache it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from fastgemma.kernels import KernelChoice, bf16_table, decode_layers, huge_pages
from fastgemma.kernels.activation import gelu_tanh, gelu_tanh_mul
from fastgemma.kernels.linear import NATIVE_MAX_ROWS, Linear, linear
from fastgemma.kernels.lm_head_screen import LmHeadScreen, masked
from fastgemma.models.attention import KV, Attention
from fastgemma.models.kv_cache import AttentionMetadata, KVCache
from fastgemma.models.layers import ROPE_BLOCK, RMSNorm, rope_table
from fastgemma.models.spec import ArchSpec


class MLP(nn.Module):
    """down(gelu_tanh(gate(x)) * up(x)) with gate and up fused into one matmul."""

    def __init__(self, hidden: int, intermediate: int, native: bool = False):
        super().__init__()
        self.intermediate, self.use_native = intermediate, native
        self.gate_up_proj = Linear(hidden, 2 * intermediate, native)
        self.down_proj = Linear(intermediate, hidden, native)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gelu_tanh_mul(self.gate_up_proj(x), self.intermediate, self.use_native))  # [T, 2I] -> [T, I]


class DecoderLayer(nn.Module):
    def __init__(self, spec: ArchSpec, layer_idx: int, native: bool = False, native_attention: bool | None = None):
        super().__init__()
        D, eps = spec.hidden_size, spec.rms_norm_eps
        rsqrt = spec.family == "gemma3"
        self.self_attn = Attention(spec, layer_idx, native if native_attention is None else native_attention)
        self.mlp = MLP(D, spec.layers[layer_idx].intermediate_size, native)
        self.input_layernorm = RMSNorm(D, eps, use_rsqrt=rsqrt, native=native)
        self.post_attention_layernorm = RMSNorm(D, eps, use_rsqrt=rsqrt, native=native)
        self.pre_feedforward_layernorm = RMSNorm(D, eps, use_rsqrt=rsqrt, native=native)
        self.post_feedforward_layernorm = RMSNorm(D, eps, use_rsqrt=rsqrt, native=native)
        self.has_ple = spec.per_layer_input_size > 0
        if self.has_ple:
            P = spec.per_layer_input_size
            self.per_layer_input_gate = Linear(D, P, native)
            self.per_layer_projection = Linear(P, D, native)
            self.post_per_layer_input_norm = RMSNorm(D, eps, use_rsqrt=rsqrt, native=native)
        # Gemma 4 stores a per-layer output scale in the checkpoint; Gemma 3 has none (1).
        self.layer_scalar = nn.Buffer(torch.ones(1)) if spec.family == "gemma4" else None

    def forward(
        self,
        h: torch.Tensor,  # [T, D]
        ple: torch.Tensor | None,  # [T, P]
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        cache: KVCache,
        shared_kv: KV | None,
    ) -> tuple[torch.Tensor, KV]:
        h, kv = self.attend(h, cos, sin, meta, cache, shared_kv)
        return self.feed_forward(h, ple), kv

    def attend(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata, cache: KVCache,
        shared_kv: KV | None,
    ) -> tuple[torch.Tensor, KV]:
        """The layer's first half: h [T, D] + its attention's output; the K/V it attended over."""
        attn, kv = self.self_attn(self.input_layernorm(h), cos, sin, meta, cache, shared_kv)
        return h + self.post_attention_layernorm(attn), kv

    def feed_forward(self, h: torch.Tensor, ple: torch.Tensor | None) -> torch.Tensor:
        """The layer's second half: MLP, per-layer input (Gemma 4) and layer scalar; [T, D]."""
        h = h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
        if self.has_ple:
            gated = gelu_tanh(self.per_layer_input_gate(h), self.per_layer_input_gate.use_native) * ple
            h = h + self.post_per_layer_input_norm(self.per_layer_projection(gated))
        if self.layer_scalar is not None:
            h = h * self.layer_scalar
        return h


@dataclass
class PartialForward:
    """A forward paused between stages (`GemmaForCausalLM.begin` / `advance`; a stage is a
    decoder layer's attention or its feed-forward): the engine runs a long prompt chunk a few
    stages per step, so that the running streams' steps do not wait for the whole chunk.
    Nothing of it lives in the model: a paused forward's state is here, its K/V already in its
    sequence's cache."""

    h: torch.Tensor  # [T, D] the hidden rows entering stage `next_stage` (after the KV-shared cut: [K, D])
    ple: torch.Tensor | None  # [T, L, P] per-layer inputs (Gemma 4)
    rope: dict[str, tuple[torch.Tensor, torch.Tensor]]  # layer type -> (cos, sin) [T, hd] at the rows' positions
    meta: AttentionMetadata
    cache: KVCache
    keep: torch.Tensor | None  # [K] rows to return (None: all), until the KV-shared cut applies it
    shared: dict[int, KV] = field(default_factory=dict)  # K/V of source layers for later KV-shared layers
    next_stage: int = 0


class GemmaForCausalLM(nn.Module):
    def __init__(self, spec: ArchSpec, max_model_len: int, kernels: KernelChoice = KernelChoice()):
        super().__init__()
        self.spec = spec
        self.kernels = kernels  # asked for; `build_kernels` settles where each applies
        native = self.use_native = kernels.native
        D, V = spec.hidden_size, spec.vocab_size
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList(DecoderLayer(spec, i, native) for i in range(spec.num_layers))
        self.norm = RMSNorm(D, spec.rms_norm_eps, use_rsqrt=spec.family == "gemma3", native=native)
        self.lm_head = None if spec.tie_word_embeddings else Linear(D, V, native)
        P, L = spec.per_layer_input_size, spec.num_layers
        if P:
            self.embed_tokens_per_layer = nn.Embedding(spec.vocab_size_per_layer_input, L * P)
            self.per_layer_model_projection = Linear(D, L * P, native)
            self.per_layer_projection_norm = RMSNorm(P, spec.rms_norm_eps, use_rsqrt=False, native=native)
        # RoPE tables per layer type (fp32), sliced by position and cast at use; positions
        # 0..rope_len-1, grown with the positions a forward reaches (whole off the CPU).
        self.max_model_len, self.rope_len = max_model_len, 0
        self.rope_cos: dict[str, torch.Tensor] = {}
        self.rope_sin: dict[str, torch.Tensor] = {}
        self.reserve_positions(min(max_model_len, ROPE_BLOCK))
        # Layers whose K/V a later (shared) layer reads in the same forward.
        self.kv_sources = {layer.kv_source for layer in spec.layers if layer.kv_shared}

    def reserve_positions(self, n: int) -> None:
        """RoPE tables for positions 0..n-1 at least (grown a `ROPE_BLOCK` at a time)."""
        if n <= self.rope_len:
            return
        n = min(self.max_model_len, -(-n // ROPE_BLOCK) * ROPE_BLOCK)
        device = next(iter(self.rope_cos.values())).device if self.rope_cos else torch.device("cpu")
        for kind, layer in {layer.layer_type: layer for layer in self.spec.layers}.items():
            cos, sin = rope_table(self.spec.rope[kind], layer.head_dim, n)
            self.rope_cos[kind], self.rope_sin[kind] = cos.to(device), sin.to(device)
        self.rope_len = n

    ple_host: torch.Tensor | None = None  # [V_ple, L * P] the PLE table in host memory (pinned), when offloaded

    def to_device(self, device: torch.device, ple_on_host: bool = False) -> GemmaForCausalLM:
        """Move the model to `device`; with `ple_on_host` (and a PLE table) the table stays
        in host memory, pinned where CUDA is, and only its rows travel (module docstring)."""
        if ple_on_host and self.spec.per_layer_input_size and self.ple_host is None:
            table = self.embed_tokens_per_layer.weight.data.to("cpu")
            self.embed_tokens_per_layer = None
            self.ple_host = table.pin_memory() if torch.cuda.is_available() else table
        self.to(device)
        self.rope_cos = {k: v.to(device) for k, v in self.rope_cos.items()}
        self.rope_sin = {k: v.to(device) for k, v in self.rope_sin.items()}
        if device.type != "cpu":  # fixed-shape steps index the tables on the device, by device positions
            self.reserve_positions(self.max_model_len)
        return self

    fused_decode = False  # bf16 CPU decode: all layers in one native call (kernels/decode_layers.py)
    _decode_layers = None
    lm_head_screen: LmHeadScreen | None = None
    _softcap_table: torch.Tensor | None = None

    def build_kernels(
        self, screen_codes: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    ) -> GemmaForCausalLM:
        """Once the weights are in place (the loader calls it): what `kernels` asks for,
        where the model supports it: the layers in huge pages for the native kernels, the
        fused decode step (bf16 CPU), the exact lm_head screen (CPU, monotone rounding;
        `screen_codes`: its codes from a cached build)."""
        if self.use_native:
            self._layers_in_huge_pages()
        self.fused_decode = self.kernels.fused_decode and self.use_native and decode_layers.supported(self)
        if self.kernels.lm_head_screen and self.screen_supported():
            self.lm_head_screen = LmHeadScreen(self.lm_head_weight(), self.finalize_logits, screen_codes)
        return self

    _in_huge_pages = False

    def _layers_in_huge_pages(self) -> None:
        """Each decoder layer's tensors, in order, into one huge-page mapping (once): decode
        streams them every step (kernels/huge_pages.py). One layer at a time, so the extra
        memory is one layer's."""
        if self._in_huge_pages:
            return
        self._in_huge_pages = True
        for layer in self.layers:
            slots = [(m, n, t, True) for m in layer.modules() for n, t in m._parameters.items() if t is not None]
            slots += [(m, n, t, False) for m in layer.modules() for n, t in m._buffers.items() if t is not None]
            for (m, n, _, is_param), new in zip(slots, huge_pages.pack([t.data for _, _, t, _ in slots])):
                if is_param:
                    m._parameters[n].data = new
                else:
                    m._buffers[n] = new

    def screen_supported(self) -> bool:
        """CPU, our GEMV for lm_head, and a provably monotone output rounding: bf16 (the
        softcap is a table, checked), or fp32 without softcap."""
        w = self.lm_head_weight()
        if w.device.type != "cpu" or not self.use_native or w.dtype not in (torch.bfloat16, torch.float32):
            return False
        return w.dtype == torch.bfloat16 or self.spec.final_softcap is None

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def embed(
        self,
        input_ids: torch.Tensor,  # [T] int64
        soft_embeds: torch.Tensor | None = None,  # [N, D] already in model space (not scaled)
        soft_mask: torch.Tensor | None = None,  # [T] bool, N True entries
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Input embeddings [T, D] and the ids the per-layer embeddings look up [T]."""
        w = self.embed_tokens.weight
        h = self.embed_tokens(input_ids) * torch.tensor(self.spec.embed_scale, dtype=w.dtype)
        ple_ids = input_ids
        if soft_embeds is not None:
            assert soft_mask is not None and int(soft_mask.sum()) == soft_embeds.shape[0]
            h = h.masked_scatter(soft_mask[:, None], soft_embeds.to(h.dtype))
            ple_ids = input_ids.masked_fill(soft_mask, self.spec.pad_token_id)
        return h, ple_ids

    def ple_rows(self, ple_ids: torch.Tensor) -> torch.Tensor:
        """The PLE table's rows for ple_ids [T] -> [T, L * P] on the model's device."""
        if self.ple_host is None:
            return self.embed_tokens_per_layer(ple_ids)
        rows = self.ple_host.index_select(0, ple_ids.to("cpu"))
        return rows.to(self.embed_tokens.weight.device)

    def per_layer_inputs(
        self, embeds: torch.Tensor, ple_ids: torch.Tensor, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[T, L, P]; see the module docstring. `rows`: the table's rows for ple_ids, already
        gathered (a fixed-shape step's staged input)."""
        T, L, P = embeds.shape[0], self.spec.num_layers, self.spec.per_layer_input_size
        rows = self.ple_rows(ple_ids) if rows is None else rows  # [T, L * P]
        tok = (rows * torch.tensor(P**0.5, dtype=rows.dtype)).view(T, L, P)
        ctx = self.per_layer_model_projection(embeds) * self.spec.hidden_size**-0.5
        ctx = self.per_layer_projection_norm(ctx.view(T, L, P))
        return (ctx + tok) * 2.0**-0.5

    def forward(
        self,
        embeds: torch.Tensor,  # [T, D]
        ple_ids: torch.Tensor,  # [T]
        meta: AttentionMetadata,
        cache: KVCache,
        keep: torch.Tensor | None = None,  # [K] chunk indices whose hidden states are returned; None = all
        ple_rows: torch.Tensor | None = None,  # [T, L * P] the PLE table's rows, gathered by the caller
    ) -> torch.Tensor:
        """The final normed hidden states [K, D] (K = len(keep), or T)."""
        out = self.advance(self.begin(embeds, ple_ids, meta, cache, keep, ple_rows))
        assert out is not None
        return out

    def begin(
        self,
        embeds: torch.Tensor,  # [T, D]
        ple_ids: torch.Tensor,  # [T]
        meta: AttentionMetadata,
        cache: KVCache,
        keep: torch.Tensor | None = None,
        ple_rows: torch.Tensor | None = None,
    ) -> PartialForward:
        """A forward with no stage run yet (`advance` runs them); arguments as `forward`'s."""
        ple = self.per_layer_inputs(embeds, ple_ids, ple_rows) if self.spec.per_layer_input_size else None
        self.reserve_positions(max(meta.end, max(meta.row_positions) + 1 if meta.row_positions else 0))
        rope = {}
        if not (self.fused_decode and meta.decode_like):
            dtype, pos = embeds.dtype, meta.positions
            rope = {t: (self.rope_cos[t][pos].to(dtype), self.rope_sin[t][pos].to(dtype)) for t in self.rope_cos}
        return PartialForward(embeds, ple, rope, meta, cache, keep)

    @property
    def num_stages(self) -> int:
        """What `advance` counts: two stages a decoder layer (its attention, its feed-forward)."""
        return 2 * self.spec.num_layers

    def advance(self, work: PartialForward, stages: int | None = None) -> torch.Tensor | None:
        """Run the forward's next `stages` stages (None: the rest; a fused decode-like forward
        runs whole); once the last has run, the final normed hidden states [K, D], else None.
        Split or not, the same ops run in the same order: the same bits."""
        meta = work.meta
        if self.fused_decode and meta.decode_like:
            first = meta.row_caches[0]
            if self._decode_layers is None or not self._decode_layers.serves(first):
                self._decode_layers = decode_layers.NativeDecodeLayers(self, first, NATIVE_MAX_ROWS)
            work.next_stage = self.num_stages
            return self.norm(self._decode_layers.run(work.h.contiguous(), work.ple, meta))
        stop = self.num_stages if stages is None else min(self.num_stages, work.next_stage + stages)
        for stage in range(work.next_stage, stop):
            i, layer = stage // 2, self.layers[stage // 2]
            if stage % 2:
                work.h = layer.feed_forward(work.h, None if work.ple is None else work.ple[:, i])
                continue
            if i == self.spec.first_kv_shared_layer and work.keep is not None and meta.num_tokens > 1:
                # KV-shared layers write no cache, so only the kept positions need to go on
                # (transformers' `_maybe_slice_kv_shared_inputs`): their queries still see
                # every key their source layers produced.
                keep = work.keep
                work.h, work.ple = work.h[keep], None if work.ple is None else work.ple[keep]
                work.rope = {t: (c[keep], s_[keep]) for t, (c, s_) in work.rope.items()}
                meta = work.meta = replace(meta, masks={t: None if m is None else m[keep] for t, m in meta.masks.items()})
                work.keep = None
            cos, sin = work.rope[self.spec.layers[i].layer_type]
            work.h, kv = layer.attend(work.h, cos, sin, meta, work.cache, work.shared.get(self.spec.layers[i].kv_source))
            if i in self.kv_sources:
                work.shared[i] = kv
        work.next_stage = stop
        if stop < self.num_stages:
            return None
        h = work.h if work.keep is None else work.h[work.keep]
        return self.norm(h)

    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[K, D] normed hidden states -> [K, V] logits (softcapped when the config says so)."""
        return self.finalize_logits(linear(hidden, self.lm_head_weight(), self.use_native))

    def greedy_tokens(self, hidden: torch.Tensor, allowed: list[torch.Tensor | None] | None = None) -> list[int]:
        """[T, D] -> argmax of compute_logits(hidden) per row (lowest id on ties), screened when
        on; allowed[t]: row t's grammar bitmask (int32 [ceil(V / 32)]) or None (every id)."""
        if self.lm_head_screen is not None and hidden.device.type == "cpu" and hidden.shape[0] <= NATIVE_MAX_ROWS:
            return self.lm_head_screen.argmax(hidden, allowed)
        logits = self.compute_logits(hidden)
        if allowed is not None:
            logits = torch.stack([row if m is None else masked(row, m) for row, m in zip(logits, allowed)])
        return torch.argmax(logits, dim=-1).tolist()

    def screened_logits(
        self, hidden: torch.Tensor, keep: list[torch.Tensor], allowed: list[torch.Tensor | None] | None = None
    ) -> torch.Tensor:
        """[T, D] -> [T, V] logits enough for the argmax after a processing that changes only
        the ids keep[t] (LmHeadScreen.sparse_logits: exact there and at the screen's
        candidates, -inf elsewhere) when the screen is on; else compute_logits(hidden)."""
        if self.lm_head_screen is not None and hidden.device.type == "cpu" and hidden.shape[0] <= NATIVE_MAX_ROWS:
            return self.lm_head_screen.sparse_logits(hidden, keep, allowed)
        return self.compute_logits(hidden)

    def finalize_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Softcap tanh(x / cap) * cap in the logits' dtype; identity without a cap. For bf16
        it is a lookup in the table of its value at every bf16 number, so that each logit's
        rounding depends on its value only (not on where it sits in a vectorised loop)."""
        cap = self.spec.final_softcap
        if cap is None:
            return logits
        if logits.dtype != torch.bfloat16:
            return torch.tanh(logits / cap) * cap
        if self._softcap_table is None or self._softcap_table.device != logits.device:
            self._softcap_table = bf16_table.tabulate(lambda x: torch.tanh(x / cap) * cap, logits.device)
        return bf16_table.lookup(self._softcap_table, logits)
