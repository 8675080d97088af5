"""The exact lm_head screen: the greedy token of the full-precision lm_head at int8 cost.

The lm_head (for Gemma 3 270M, 63% of the bytes a decode step reads) is only needed for its
argmax under greedy decoding. The screen keeps an int8 copy Q (one scale s_i per row) and,
per step, for the normed hidden state h [D]:

1. approximate logits  a_i = s_i * (q_i . h)  for the whole vocabulary (int8 GEMV, fp32);
2. a per-row bound  |z_i - a_i| <= e_i,  where z_i is the fp32 sum the full-precision GEMV
   computes for row i (before rounding to the model dtype);
3. candidates: the rows whose upper bound can still reach the best lower bound, both
   passed through the model's own output rounding f (to the model dtype, then softcap);
4. z_i recomputed for the candidates with the full-precision GEMV (the same kernel, so the
   same per-row numerics as the plain path), and the lowest-index maximum of f(z_i) taken.

Why that is the plain path's token: f is non-decreasing (rounding is; the softcap table is
checked to be), so every row i left out has f(z_i) <= f(a_i + e_i) < max_j f(a_j - e_j)
<= max_j f(z_j): it is strictly below the maximum and can be neither the argmax nor a tie.
Among the candidates the values are the plain path's own, bit for bit.

The bound: with w_i the row in the model dtype, r_i = w_i - s_i q_i its quantisation
residual (computed in fp64), u = 2^-24 and g = (K + 2) u / (1 - (K + 2) u),
    |r_i . h| <= |r_i| |h|                                (Cauchy-Schwarz),
    |fp32 dot(w_i, h) - w_i . h| <= g |w_i| |h|           (any summation order, FMA or not),
    |a_i - s_i q_i . h| <= g |s_i q_i| |h| <= g (|w_i| + |r_i|) |h|,
so e_i = |h| (|r_i| + 2 g (|w_i| + |r_i|)), widened by 2^-10 relatively and |a_i| 2^-19
absolutely to absorb the rounding of the bound's own arithmetic. |h| is computed in fp64.

Where the CPU has AVX-512 VNNI, h is quantised too, to two int8 levels h^ = t1 p1 + t2 p2
(the second quantises what the first leaves), and the integer dots are exact (`vpdpbusd`,
64 products an instruction, so eight rows of h cost about what one does). By Cauchy-Schwarz
    |s_i q_i . (h - h^)| <= |s_i q_i| |h - h^|,
and the float arithmetic of a_i stays within 2^-20 |s_i q_i| (|t1 p1| + |t2 p2|) + u |a_i|,
so e_i gains |s_i q_i| (|h - h^| + 2^-20 (|t1 p1| + |t2 p2|)) (|s_i q_i| from an exact
integer sum of squares, rounded up; the rest in fp64, widened by 2^-10). Two stages: the
first level alone for every row (a wider bound: on the embedded model's outlier-heavy
hidden states, 6% would fall back to the full head with it alone), then the second level only in
the 16-row blocks where some row can still win. A row left out by the first stage stays out
(its upper bound is below a lower bound the second stage can only raise), and on the
embedded model the candidates are those of fp32 activations (benchmarks/lm_head_screen.py) for the
products of about one level.
A non-finite hidden state falls back to the full lm_head, and so does a flat distribution
(more than V / 8 candidates, where gathering rows would cost more than reading them all).
Steps 2 and 3 run natively (cpu_screen.c), as the GEMVs do. Several hidden states (a
speculative verification) share one pass of step 1 over Q; each row is then screened alone.

A row may come with the allowed tokens of a structured output's grammar (a bitmask): the
maximum of step 3 and the candidates are then taken over the allowed rows only, and the
argument above, read over those rows, gives the plain path's masked argmax (the lowest
allowed id of the largest allowed f(z_i)).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from fastgemma.kernels import bf16_table, native, quant
from fastgemma.kernels.huge_pages import empty as huge_pages_empty
from fastgemma.kernels.huge_pages import huge_pages
from fastgemma.kernels.linear import linear

_U = 2.0**-24


def _output_table(finalize: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """f at every bf16 number, indexed by its signed 16-bit pattern + 32768 [65536] bf16;
    ValueError unless f is non-decreasing over the ordered non-NaN bf16 numbers."""
    every = bf16_table.every_bf16()
    table = bf16_table.tabulate(finalize)
    order = every.float().argsort()
    ordered = table.float()[order][~every.float()[order].isnan()]
    if not bool((ordered[1:] >= ordered[:-1]).all()):
        raise ValueError("the logits post-processing is not monotone in bf16; the lm_head screen cannot be used")
    return table


_SLICE_ROWS = 4096  # rows of the lm_head quantised and bounded at a time


@torch.no_grad()
def _build(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(qweight, scales, coef) of the module docstring, row slice by row slice: the codes
    straight into huge pages, the fp64 residuals of one slice at a time."""
    V, K = weight.shape
    qweight = huge_pages_empty((V, K), torch.int8)
    scales = torch.empty(V, dtype=torch.float32)
    coef = torch.empty(V, dtype=torch.float32)
    g = (K + 2) * _U / (1 - (K + 2) * _U)
    for a in range(0, V, _SLICE_ROWS):
        b = min(a + _SLICE_ROWS, V)
        q, s = quant.quantize(weight[a:b], quant.INT8)
        qweight[a:b], scales[a:b] = q, s
        w = weight[a:b].double()
        residual = (w - q.double() * s.double()[:, None]).norm(dim=1)
        c = (residual + 2 * g * (w.norm(dim=1) + residual)) * (1 + 2.0**-10)
        coef[a:b] = torch.nextafter(c.float(), torch.tensor(math.inf))  # rounded up
    return qweight, scales, coef


class LmHeadScreen:
    def __init__(
        self,
        weight: torch.Tensor,
        finalize: Callable[[torch.Tensor], torch.Tensor],
        codes: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
        int8_activations: bool | None = None,
    ):
        """weight: [V, D] the full-precision lm_head (bf16 or fp32, CPU); finalize: the
        model's logits post-processing on model-dtype logits (softcap or identity), which
        for bf16 must depend on each value only (it is tabulated and checked monotone here);
        for fp32 it must be the identity (ValueError otherwise). `codes`: (qweight, scales,
        coef) as `codes()` returned them for this weight (a cached build), else built here
        a slice of rows at a time (no full-size fp32 / fp64 copy of the weight).
        `int8_activations`: quantise h too (the VNNI GEMV); None takes it where the native
        build has it."""
        self.weight, self.finalize = weight, finalize
        V, K = weight.shape
        lib = native.load()
        has_vnni = lib is not None and hasattr(lib, "screen_u8s8")
        if int8_activations and not has_vnni:
            raise ValueError("int8 activations in the lm_head screen need the AVX-512 VNNI native build")
        self.int8_activations = has_vnni and K <= 65536 if int8_activations is None else int8_activations
        if codes is None:
            codes = _build(weight)
        elif not self.int8_activations:
            codes = (huge_pages(codes[0]), *codes[1:])
        qweight, self.scales, self.coef = codes
        if tuple(qweight.shape) != (V, K) or self.scales.shape != (V,) or self.coef.shape != (V,):
            raise ValueError(f"lm_head screen codes {tuple(qweight.shape)} do not fit a {V}x{K} lm_head")
        self.qweight = qweight  # int8 [V, K], streamed every greedy step: in huge pages
        if self.int8_activations:  # kept in VNNI order instead (cpu_screen.c): packed int8 [V16, K4 * 4]
            blocks, k4 = -(-V // 16), -(-K // 4)
            self.packed = huge_pages_empty((blocks * 16, k4 * 4), torch.int8)
            self.rowsum = torch.empty(blocks * 16, dtype=torch.int32)  # sum_k q_ik: the u8 offset's correction
            self.qnorm = torch.empty(blocks * 16, dtype=torch.float32)  # >= |s_i q_i|
            scales = self.scales.contiguous()
            lib.screen_pack_q8(
                qweight.contiguous().data_ptr(), scales.data_ptr(), V, K, self.packed.data_ptr(),
                self.rowsum.data_ptr(), self.qnorm.data_ptr(),
            )
            self.qweight = None
        # scratch [rows, V], grown on demand (pages are touched only where written: ids, err)
        self.approx, self.err = torch.empty(0, V, dtype=torch.float32), torch.empty(0, V, dtype=torch.float32)
        self.ids = torch.empty(0, V, dtype=torch.int64)
        # int8 activations (cpu_screen.c): the second level's logits (up to 4 rows) and each
        # 16-row block's largest stage-1 key [rows, V16 / 16]
        self.second = torch.empty(0, V, dtype=torch.float32)
        self.block_keys = torch.empty(0, -(-V // 16), dtype=torch.int32)
        self.table = _output_table(finalize) if weight.dtype == torch.bfloat16 else None  # f at every bf16 [65536]
        probe = torch.linspace(-100.0, 100.0, 9)
        if self.table is None and not torch.equal(finalize(probe), probe):
            raise ValueError("the lm_head screen needs fp32 logits without post-processing")
        self.last_candidates = 0  # rows recomputed in full precision by the last call
        self._every_id = pack_bitmask(torch.ones(V, dtype=torch.bool))  # a bitmask allowing every id

    def codes(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(qweight int8 [V, D], scales fp32 [V], coef fp32 [V]): what a cached build restores
        (a row-major copy of the codes where they are held in VNNI order)."""
        qweight = self.qweight
        if qweight is None:
            qweight = torch.empty(self.weight.shape, dtype=torch.int8)
            native.load().screen_unpack_q8(self.packed.data_ptr(), *self.weight.shape, qweight.data_ptr())
        return qweight, self.scales, self.coef

    def nbytes(self) -> int:
        if self.int8_activations:
            return self.packed.numel() + 4 * (self.scales.numel() + self.coef.numel() + 2 * self.rowsum.numel())
        return self.qweight.numel() + 4 * (self.scales.numel() + self.coef.numel())

    def bounds(
        self, hidden: torch.Tensor, allowed: Sequence[torch.Tensor | None] | None = None, with_err: bool = True
    ) -> list[ScreenRow]:
        """hidden: [T, D] -> per row, steps 1-3 of the module docstring natively (cpu_screen.c,
        and cpu_quant_gemv.c's GEMV for fp32 activations): the approximate logits a [V], the
        bound e [V] (with_err; fp32 activations' per-row selection always writes it) and the
        candidates' ids ascending (their count -1 when not finite). The tensors are views of
        scratch buffers, overwritten by the next call. allowed[t]: row t's grammar bitmask
        (int32 [ceil(V / 32)]) or None (every token)."""
        lib = native.load()
        hf = hidden.float().contiguous()
        (V, K), T = self.weight.shape, hidden.shape[0]
        if self.approx.shape[0] < T:
            self.approx, self.ids = torch.empty(T, V, dtype=torch.float32), torch.empty(T, V, dtype=torch.int64)
        with_err = with_err or not self.int8_activations  # the per-row selection needs it
        if with_err and self.err.shape[0] < T:
            self.err = torch.empty(T, V, dtype=torch.float32)
        table = self.table.data_ptr() if self.table is not None else None
        masks = [None if allowed is None or allowed[t] is None else _bitmask_ptr(allowed[t], V) for t in range(T)]
        hnorms = torch.linalg.vector_norm(hidden.double(), dim=1) * (1 + 2.0**-20)  # [T] fp64
        self.activation_error = torch.zeros(T, 2, dtype=torch.float64)  # per row, one level / two (int8 activations)
        counts = torch.empty(T, dtype=torch.int64)
        if self.int8_activations:  # one call: two quantisation levels per row, levels [2T, K4 * 4], steps [2T]
            levels, steps = torch.empty(2 * T, self.packed.shape[1], dtype=torch.uint8), torch.empty(2 * T)
            if self.block_keys.shape[0] < T:  # scratch kept across steps: 64 KiB a row, not faulted in each step
                self.block_keys = torch.empty(T, self.block_keys.shape[1], dtype=torch.int32)
            if T <= 4 and self.second.shape[0] < T:  # both levels in one pass
                self.second = torch.empty(4, V, dtype=torch.float32)
            mask_array = (ctypes.c_void_p * T)(*masks) if allowed is not None else None
            lib.screen_u8s8(
                self.packed.data_ptr(), self.rowsum.data_ptr(), self.scales.data_ptr(), self.coef.data_ptr(),
                self.qnorm.data_ptr(), hf.data_ptr(), hnorms.data_ptr(), T, V, K, self.table is not None, table,
                mask_array, levels.data_ptr(), steps.data_ptr(), self.block_keys.data_ptr(), self.approx.data_ptr(),
                self.err.data_ptr() if with_err else None,
                self.activation_error.data_ptr(), self.ids.data_ptr(), counts.data_ptr(),
                self.second.data_ptr() if T <= 4 else None,
            )
        else:
            lib.gemv_q8(self.qweight.data_ptr(), self.scales.data_ptr(), hf.data_ptr(), self.approx.data_ptr(), T, V, K, 1)
            for t in range(T):
                counts[t] = lib.screen_select(
                    self.approx[t].data_ptr(), self.coef.data_ptr(), float(hnorms[t]), V,
                    self.table is not None, table, masks[t], self.err[t].data_ptr(), self.ids[t].data_ptr(),
                )
        return [
            ScreenRow(self.approx[t], self.err[t] if with_err else None, int(c), self.ids[t, : max(int(c), 0)])
            for t, c in enumerate(counts.tolist())
        ]

    def argmax(self, hidden: torch.Tensor, allowed: Sequence[torch.Tensor | None] | None = None) -> list[int]:
        """hidden: [T, D] normed hidden states (model dtype) -> the plain path's greedy token of
        each row; with allowed[t] (a grammar bitmask), its greedy token among the allowed ids."""
        tokens, self.last_candidates = [], 0
        for t, screened in enumerate(self.bounds(hidden, allowed, with_err=False)):
            row = hidden[t : t + 1]
            mask = allowed[t] if allowed is not None else None
            if screened.count <= 0 or screened.count > self.weight.shape[0] // 8:
                # not finite, a flat distribution (the full lm_head costs less than gathering
                # rows), or nothing allowed: the full lm_head
                full = self.finalize(linear(row, self.weight, True))[0]
                self.last_candidates += full.shape[0]
                tokens.append(int(torch.argmax(full if mask is None else masked(full, mask))))
                continue
            candidates = screened.ids  # ascending
            exact = self.finalize(linear(row, self.weight.index_select(0, candidates), True))[0]
            self.last_candidates += screened.count
            tokens.append(int(candidates[torch.argmax(exact)]))
        return tokens

    def sparse_logits(
        self, hidden: torch.Tensor, keep: Sequence[torch.Tensor], allowed: Sequence[torch.Tensor | None] | None = None
    ) -> torch.Tensor:
        """hidden: [T, D]; keep[t]: distinct ids (int64) whose logits a later step may change (a
        request's penalties, bias, masked stop ids); allowed[t]: a grammar bitmask or None ->
        [T, V] logits (weight dtype), exact at keep[t] and at the ids that can be the argmax
        among the rest (the screen over the allowed ids outside keep[t]), -inf elsewhere: the
        argmax of any processing that leaves the other ids as they are is the full logits'
        (an id left out has a lower logit than some unchanged allowed id, ties included, so it
        is never the pick, nor the lowest of tied picks). A row whose screen finds nothing
        usable is computed in full."""
        (V, _), T = self.weight.shape, hidden.shape[0]
        words = -(-V // 32)
        screens = []
        for t in range(T):  # the allowed bits (all V ids, or the grammar's) with keep[t]'s cleared
            ids = keep[t]
            clear = torch.zeros(words, dtype=torch.int64).index_add_(0, ids >> 5, torch.ones_like(ids) << (ids & 31))
            base = self._every_id if allowed is None or allowed[t] is None else allowed[t]
            screens.append(base & ~_as_words(clear))
        out = torch.full((T, V), float("-inf"), dtype=self.weight.dtype)
        for t, screened in enumerate(self.bounds(hidden, screens, with_err=False)):
            row = hidden[t : t + 1]
            if screened.count <= 0 or screened.count > V // 8:
                out[t] = self.finalize(linear(row, self.weight, True))[0]
                continue
            ids = torch.unique(torch.cat([screened.ids, keep[t]]))  # ascending
            out[t, ids] = self.finalize(linear(row, self.weight.index_select(0, ids), True))[0]
        return out


class ScreenRow(NamedTuple):
    """One hidden state's screen: approximate logits a [V], bound e [V] (None when not
    asked for), the candidate count (-1: not finite) and the candidates' ids ascending."""

    approx: torch.Tensor
    err: torch.Tensor | None
    count: int
    ids: torch.Tensor


def masked(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits [..., V] with the ids a bitmask (int32 [..., ceil(V / 32)], bit i & 31 of word
    i >> 5) leaves out set to -inf (a copy)."""
    return logits.masked_fill(~unpack_bitmask(bitmask.to(logits.device), logits.shape[-1]), float("-inf"))


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [..., W] -> bool [..., vocab_size]: True where a token is allowed."""
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    return ((bitmask[..., None] >> bits) & 1).bool().flatten(-2)[..., :vocab_size]


def pack_bitmask(mask: torch.Tensor) -> torch.Tensor:
    """bool [V] -> int32 [ceil(V / 32)] (bit i & 31 of word i >> 5: id i allowed)."""
    words = -(-mask.shape[0] // 32)
    bits = torch.zeros(words * 32, dtype=torch.int64)
    bits[: mask.shape[0]] = mask.to(torch.int64)
    return _as_words((bits.view(words, 32) << torch.arange(32)).sum(1))


def _as_words(bits: torch.Tensor) -> torch.Tensor:
    """int64 [W] of 32-bit patterns in [0, 2^32) -> the same bits as int32 [W]."""
    return torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)


def _bitmask_ptr(bitmask: torch.Tensor, vocab_size: int) -> int:
    assert bitmask.dtype == torch.int32 and bitmask.is_contiguous() and bitmask.numel() * 32 >= vocab_size
    return bitmask.data_ptr()
