/* A whole Gemma decoder layer for one token (batch-1 decode, bf16), in one call.
 *
 * Composes the kernels of cpu_gemv.c, cpu_norm.c and cpu_attention.c with the layer's glue
 * (RoPE, residual adds, GELU, PLE, layer_scalar), so that a decode step costs one foreign
 * call per model instead of ~40 torch ops per layer. Every intermediate is rounded to bf16
 * where the torch path (models/gemma.py, models/attention.py) rounds it:
 *
 *   x = norm(h); qkv = Wqkv x; q = rope(norm_q(q)); k = rope(norm_k(k)); v = [v_norm](v)
 *   write k, v at `slot`; o = attend(q, cache[:S]); h = h + norm_pa(Wo o)
 *   h = h + norm_pf(Wdown (gelu(gate) * up)) with [gate|up] = Wgu norm_ff(h)
 *   PLE: h = h + norm_ple(Wproj (gelu(Wgate h) * ple)); h = h * layer_scalar
 * KV-shared layers get their source layer's cache and write nothing (slot < 0).
 * Each weight matrix is a `Mat`: bf16, or int8 / int4 codes with fp32 scales (kernels/quant.py);
 * the quantised GEMVs take the input widened to fp32, as the per-op path does.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

void gemv_bf16(const uint16_t *W, const uint16_t *x, void *y, int64_t N, int64_t K, int out_f32);
void gemv_q8(const int8_t *W, const float *scale, const float *x, void *y, int64_t N, int64_t K, int out_f32);
void gemv_q4(const uint8_t *W, const float *scales, const float *x, void *y, int64_t N, int64_t K, int64_t G,
             int out_f32);
void rms_norm_bf16(const uint16_t *x, const float *scale, uint16_t *y, int64_t rows, int64_t D, float eps);
void attend_decode_bf16(const uint16_t *q, const uint16_t *k, const uint16_t *v, uint16_t *o, int64_t H,
                        int64_t Hkv, int64_t S, int64_t hd, int64_t head_stride, float scaling, float *scratch);

enum { MAT_BF16 = 0, MAT_Q8 = 1, MAT_Q4 = 2 };

typedef struct {
    const void *w;        /* bf16 [N, K], int8 [N, K] or packed 4-bit [N, K / 2] */
    const float *scales;  /* q8: [N]; q4: [N, K / group] */
    int64_t kind, group;
} Mat;

/* y [N] (bf16) = W x for x [K] (bf16); xf: fp32 scratch of K. */
static void matvec(const Mat *m, const uint16_t *x, uint16_t *y, int64_t N, int64_t K, float *xf) {
    if (m->kind == MAT_BF16) {
        gemv_bf16((const uint16_t *)m->w, x, y, N, K, 0);
        return;
    }
    for (int64_t k = 0; k < K; k++) xf[k] = bf16_to_f32(x[k]);
    if (m->kind == MAT_Q8) gemv_q8((const int8_t *)m->w, m->scales, xf, y, N, K, 0);
    else gemv_q4((const uint8_t *)m->w, m->scales, xf, y, N, K, m->group, 0);
}

typedef struct {
    int64_t D, H, Hkv, hd, I, P, slots;  /* geometry; I = MLP width, P = PLE width (0: none) */
    int64_t S, slot;                      /* per step: keys to attend over, slot to write (-1: shared) */
    int64_t k_eq_v, v_norm;
    float eps, scaling;
    Mat w_qkv, w_o, w_gu, w_down, w_ple_gate, w_ple_proj;
    const uint16_t *layer_scalar;
    const float *n_in, *n_post_attn, *n_pre_ff, *n_post_ff, *n_q, *n_k, *n_post_ple;
    const uint16_t *cos, *sin, *ple;      /* per step: [hd] RoPE row, [P] this layer's PLE input */
    uint16_t *k_cache, *v_cache;          /* [Hkv, slots, hd] (the source layer's when shared) */
} GemmaLayer;

static inline uint16_t bmul(uint16_t a, uint16_t b) { return f32_to_bf16(bf16_to_f32(a) * bf16_to_f32(b)); }
static inline uint16_t badd(uint16_t a, uint16_t b) { return f32_to_bf16(bf16_to_f32(a) + bf16_to_f32(b)); }

/* GELU (tanh) at every bf16 input, by bit pattern: the per-op path's own table
 * (models/layers.py gelu_tanh), set by kernels/decode_layers.py before the first step, so the
 * two paths agree for every input by construction (a formula here disagreed with torch's
 * vectorised tanh on 4 of the 65 280 finite inputs). */
static uint16_t gelu_table[65536];

void set_gelu_table_bf16(const uint16_t *table_by_signed_bits) {
    for (uint32_t b = 0; b < 65536; b++) gelu_table[b] = table_by_signed_bits[(int32_t)(int16_t)b + 32768];
}

/* x: [rows, hd] in place; out = x * cos + rotate_half(x) * sin, each product rounded. */
static void rope_rows(uint16_t *x, const uint16_t *cos, const uint16_t *sin, int64_t rows, int64_t hd) {
    const int64_t half = hd / 2;
    for (int64_t r = 0; r < rows; r++) {
        uint16_t *xr = x + r * hd;
        for (int64_t d = 0; d < half; d++) {
            const uint16_t x1 = xr[d], x2 = xr[d + half];
            xr[d] = badd(bmul(x1, cos[d]), bmul(x2 ^ 0x8000u, sin[d]));
            xr[d + half] = badd(bmul(x2, cos[d + half]), bmul(x1, sin[d + half]));
        }
    }
}

/* h: [D] in place. buf: bf16 scratch of at least max(2I, (H + 2 Hkv) hd) + H hd + 2 D + 2 P;
 * fbuf: fp32 scratch of H * (S + hd); xf: fp32 scratch of the widest matrix input. */
static void layer_forward(const GemmaLayer *L, uint16_t *h, uint16_t *buf, float *fbuf, float *xf) {
    const int64_t D = L->D, H = L->H, Hkv = L->Hkv, hd = L->hd;
    const int64_t qkv_n = (H + (L->slot >= 0 ? (L->k_eq_v ? 1 : 2) * Hkv : 0)) * hd;
    const int64_t big = (2 * L->I > qkv_n ? 2 * L->I : qkv_n);
    uint16_t *x = buf, *wide = x + D, *attn = wide + big, *o = attn + H * hd, *small = o + D;

    rms_norm_bf16(h, L->n_in, x, 1, D, L->eps);
    matvec(&L->w_qkv, x, wide, qkv_n, D, xf);
    uint16_t *q = wide, *k = wide + H * hd;
    rms_norm_bf16(q, L->n_q, q, H, hd, L->eps);
    rope_rows(q, L->cos, L->sin, H, hd);
    if (L->slot >= 0) {
        uint16_t *v = L->k_eq_v ? attn : k + Hkv * hd;  /* k_eq_v: v is the raw k (attn is free here) */
        if (L->k_eq_v) memcpy(v, k, (size_t)(Hkv * hd) * 2);
        rms_norm_bf16(k, L->n_k, k, Hkv, hd, L->eps);
        rope_rows(k, L->cos, L->sin, Hkv, hd);
        if (L->v_norm) rms_norm_bf16(v, NULL, v, Hkv, hd, L->eps);
        for (int64_t g = 0; g < Hkv; g++) {
            memcpy(L->k_cache + (g * L->slots + L->slot) * hd, k + g * hd, (size_t)hd * 2);
            memcpy(L->v_cache + (g * L->slots + L->slot) * hd, v + g * hd, (size_t)hd * 2);
        }
    }
    attend_decode_bf16(q, L->k_cache, L->v_cache, attn, H, Hkv, L->S, hd, L->slots * hd, L->scaling, fbuf);
    matvec(&L->w_o, attn, o, D, H * hd, xf);
    rms_norm_bf16(o, L->n_post_attn, o, 1, D, L->eps);
    for (int64_t d = 0; d < D; d++) h[d] = badd(h[d], o[d]);

    rms_norm_bf16(h, L->n_pre_ff, x, 1, D, L->eps);
    matvec(&L->w_gu, x, wide, 2 * L->I, D, xf);
    for (int64_t i = 0; i < L->I; i++) wide[i] = bmul(gelu_table[wide[i]], wide[L->I + i]);
    matvec(&L->w_down, wide, o, D, L->I, xf);
    rms_norm_bf16(o, L->n_post_ff, o, 1, D, L->eps);
    for (int64_t d = 0; d < D; d++) h[d] = badd(h[d], o[d]);

    if (L->P) {
        matvec(&L->w_ple_gate, h, small, L->P, D, xf);
        for (int64_t p = 0; p < L->P; p++) small[p] = bmul(gelu_table[small[p]], L->ple[p]);
        matvec(&L->w_ple_proj, small, o, D, L->P, xf);
        rms_norm_bf16(o, L->n_post_ple, o, 1, D, L->eps);
        for (int64_t d = 0; d < D; d++) h[d] = badd(h[d], o[d]);
    }
    if (L->layer_scalar)
        for (int64_t d = 0; d < D; d++) h[d] = bmul(h[d], L->layer_scalar[0]);
}

void gemma_decode_layers_bf16(const GemmaLayer *layers, int64_t n, uint16_t *h, uint16_t *buf, float *fbuf,
                              float *xf) {
    for (int64_t i = 0; i < n; i++) layer_forward(&layers[i], h, buf, fbuf, xf);
}
