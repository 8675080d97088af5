"""A whole bf16 decode step's layers in one native call (`cpu_decode_layer.c`).

`NativeDecodeLayers(model, cache)` lays out one `GemmaLayer` struct per layer — pointers to
the layer's weights, norm scales and cache buffers (slot 0 of the cache's pool, and the
stride between slots; laid out again when the pool reallocates) — and `run(h, ple, meta)` fills in the
per-step fields (RoPE rows, PLE rows, each row's position and cache slot) and runs every
layer on the [T, D] hidden states in place. Rows may belong to different sequences
(continuous batching) and one sequence may have several consecutive rows (a speculative
verification); every row is its sequence's one-token decode step, bit for bit (see the C
file). Same maths and bf16 rounding points as the torch path of models/gemma.py with native
kernels; a quantised `Linear` is passed as its codes and scales (or its GGUF blocks, part by
part) and multiplied by the same quantised GEMV.
"""

from __future__ import annotations

import ctypes

import torch

from fastgemma.kernels import native
from fastgemma.kernels.activation import gelu_tanh_table
from fastgemma.kernels.schemes import GGUF

_i64, _f32, _ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


class Mat(ctypes.Structure):
    _fields_ = [("w", _ptr), ("scales", _ptr), ("kind", _i64), ("group", _i64),
                ("parts", _i64), ("part_type", _i64 * 4), ("part_rows", _i64 * 4)]


_MAT_BF16, _MAT_Q8, _MAT_Q4, _MAT_GGUF = 0, 1, 2, 3


def _mat(module) -> Mat:
    """A `Linear`'s weight as the C side's `Mat`."""
    if module.scheme is None:
        return Mat(module.weight.data_ptr(), None, _MAT_BF16, 0)
    if module.scheme == GGUF:
        layout = module.layout.tolist()
        assert len(layout) <= 4, layout
        types, rows = [t for t, _ in layout], [r for _, r in layout]
        pad = [0] * (4 - len(layout))
        return Mat(module.qweight.data_ptr(), None, _MAT_GGUF, 0, len(layout),
                   (_i64 * 4)(*types, *pad), (_i64 * 4)(*rows, *pad))
    kind = _MAT_Q8 if module.scheme.bits == 8 else _MAT_Q4
    return Mat(module.qweight.data_ptr(), module.scales.data_ptr(), kind, module.scheme.group)


class GemmaLayer(ctypes.Structure):
    _fields_ = [
        *[(n, _i64) for n in ("D", "H", "Hkv", "hd", "I", "P", "slots", "window", "shared", "k_eq_v", "v_norm")],
        ("seq_stride", _i64),
        ("ple_stride", _i64),
        ("eps", _f32), ("scaling", _f32),
        *[(n, Mat) for n in ("w_qkv", "w_o", "w_gu", "w_down", "w_ple_gate", "w_ple_proj")],
        ("layer_scalar", _ptr),
        *[(n, _ptr) for n in ("n_in", "n_post_attn", "n_pre_ff", "n_post_ff", "n_q", "n_k", "n_post_ple")],
        *[(n, _ptr) for n in ("cos", "sin", "ple", "k_cache", "v_cache")],
    ]


def supported(model) -> bool:
    spec = model.spec
    return (
        native.load() is not None
        and model.dtype == torch.bfloat16
        and model.embed_tokens.weight.device.type == "cpu"
        and spec.attn_softcap is None
        and all(layer.head_dim % 16 == 0 for layer in spec.layers)
    )


def _p(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class NativeDecodeLayers:
    def __init__(self, model, cache, max_tokens: int):
        """cache: any sequence cache of the pool the steps run on (or a standalone one);
        max_tokens: the most rows one `run` takes."""
        spec = model.spec
        self.pool = cache.pool  # None: a standalone cache, every row's slot 0
        self.generation = 0 if self.pool is None else self.pool.generation  # the buffers laid out here
        base = cache if self.pool is None else self.pool.seqs[0]
        self.model, self.cache, self.spec, self.max_tokens = model, base, spec, max_tokens
        cache = base
        n = spec.num_layers
        self.structs = (GemmaLayer * n)()
        widest = max(
            max(2 * l.intermediate_size, (spec.num_heads + 2 * l.num_kv_heads) * l.head_dim) for l in spec.layers
        )
        max_hd_h = max(spec.num_heads * l.head_dim for l in spec.layers)
        D, P, T = spec.hidden_size, spec.per_layer_input_size, max_tokens
        self.buf = torch.empty(T * (D + widest + max_hd_h + D + max(P, 1)), dtype=torch.bfloat16)
        self.max_keys = max(cache.k[i].shape[1] for i in cache.k)
        # attention scratch, every row's scores and sums (pages touched only as far as the rows' keys reach)
        self.fbuf = torch.empty(T * spec.num_heads * (self.max_keys + max(l.head_dim for l in spec.layers)))
        widest_input = max(max(D, l.intermediate_size, spec.num_heads * l.head_dim) for l in spec.layers)
        self.xf = torch.empty(T * max(widest_input, P))
        for i, (layer, s) in enumerate(zip(model.layers, spec.layers)):
            a, L = layer.self_attn, self.structs[i]
            src = s.kv_source
            L.D, L.H, L.Hkv, L.hd, L.I, L.P = D, spec.num_heads, s.num_kv_heads, s.head_dim, s.intermediate_size, P
            L.slots = cache.k[src].shape[1]
            L.window = cache.window if s.is_sliding else 0
            L.shared, L.ple_stride = int(s.kv_shared), spec.num_layers * P
            L.k_eq_v, L.v_norm = int(s.k_eq_v), int(a.v_norm is not None)
            L.eps, L.scaling = spec.rms_norm_eps, a.scaling
            L.w_qkv, L.w_o = _mat(a.qkv_proj), _mat(a.o_proj)
            L.w_gu, L.w_down = _mat(layer.mlp.gate_up_proj), _mat(layer.mlp.down_proj)
            if P:
                L.w_ple_gate, L.w_ple_proj = _mat(layer.per_layer_input_gate), _mat(layer.per_layer_projection)
                L.n_post_ple = _p(layer.post_per_layer_input_norm.scale)
            L.layer_scalar = _p(layer.layer_scalar)
            L.n_in, L.n_post_attn = _p(layer.input_layernorm.scale), _p(layer.post_attention_layernorm.scale)
            L.n_pre_ff, L.n_post_ff = _p(layer.pre_feedforward_layernorm.scale), _p(layer.post_feedforward_layernorm.scale)
            L.n_q, L.n_k = _p(a.q_norm.scale), _p(a.k_norm.scale) if a.k_norm is not None else None
            L.k_cache, L.v_cache = _p(cache.k[src]), _p(cache.v[src])
            L.seq_stride = 0 if self.pool is None else self.pool.k[src].stride(0)
        native.load().set_gelu_table_bf16(gelu_tanh_table().data_ptr())
        self.types = [s.layer_type for s in spec.layers]

    def serves(self, cache) -> bool:
        """Whether `cache`'s buffers are the ones laid out here (not since reallocated)."""
        if self.pool is None:
            return cache is self.cache
        return cache.pool is self.pool and self.pool.generation == self.generation

    def run(self, h: torch.Tensor, ple: torch.Tensor | None, meta) -> torch.Tensor:
        """h: [T, D] bf16, row t at meta.row_positions[t] of the sequence meta.row_caches[t]
        (updated in place and returned); ple: [T, L, P] bf16 or None."""
        T = h.shape[0]
        assert h.is_contiguous() and h.dtype == torch.bfloat16 and T <= self.max_tokens, (h.shape, self.max_tokens)
        assert all(self.serves(c) for c in meta.row_caches), "rows of a cache these layers were not built for"
        rows = {}
        for t in set(self.types):
            cos = self.model.rope_cos[t][meta.positions].to(torch.bfloat16).contiguous()  # [T, hd]
            sin = self.model.rope_sin[t][meta.positions].to(torch.bfloat16).contiguous()
            rows[t] = (cos, sin)  # kept alive until the call returns
        where = torch.tensor([meta.row_positions, [c.index for c in meta.row_caches]], dtype=torch.int64)  # [2, T]
        if ple is not None:
            ple = ple.contiguous()
            P = self.spec.per_layer_input_size
        for i, L in enumerate(self.structs):
            cos, sin = rows[self.types[i]]
            L.cos, L.sin = cos.data_ptr(), sin.data_ptr()
            if ple is not None:
                L.ple = ple.data_ptr() + i * P * 2
        native.load().gemma_decode_layers_bf16(
            self.structs, len(self.structs), h.data_ptr(), T, where[0].data_ptr(), where[1].data_ptr(),
            self.buf.data_ptr(), self.fbuf.data_ptr(), self.xf.data_ptr(),
        )
        return h
