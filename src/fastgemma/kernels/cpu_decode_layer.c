/* Whole Gemma decoder layers for a few tokens (batch-1 decode, bf16), in one call.
 *
 * Composes the kernels of cpu_gemv.c, cpu_norm.c and cpu_attention.c with the layer's glue
 * (RoPE, residual adds, GELU, PLE, layer_scalar), so that a decode step costs one foreign
 * call per model instead of ~40 torch ops per layer. Every intermediate is rounded to bf16
 * where the torch path (models/gemma.py, models/attention.py) rounds it:
 *
 *   x = norm(h); qkv = Wqkv x; q = rope(norm_q(q)); k = rope(norm_k(k)); v = [v_norm](v)
 *   write k, v at their slots; o = attend(q, visible keys); h = h + norm_pa(Wo o)
 *   h = h + norm_pf(Wdown (gelu(gate) * up)) with [gate|up] = Wgu norm_ff(h)
 *   PLE: h = h + norm_ple(Wproj (gelu(Wgate h) * ple)); h = h * layer_scalar
 * KV-shared layers get their source layer's cache and write nothing.
 * Each weight matrix is a `Mat`: bf16, int8 / int4 codes with fp32 scales (kernels/quant.py),
 * or a GGUF's blocks, one part per fused matrix (kernels/gguf.py); the quantised GEMVs take the
 * input widened to fp32, as the per-op path does.
 *
 * T rows, row t the token at position pos[t] of the sequence in cache slot seq[t] (its
 * buffers start seq[t] * seq_stride elements past slot 0's). Rows of several sequences may
 * share a call (continuous batching), and one sequence may have several rows at consecutive
 * positions (a speculative verification). Every row goes through exactly what a one-token
 * step would do to it — row-invariant GEMVs, row-wise norms and glue, and each query
 * attending alone over its own sequence's keys at positions <= its own (in position order) —
 * and all T rows' K/V are written before any query attends. So row t's result is, bit for
 * bit, its sequence's one-token step at pos[t] after the steps before it, whatever else is in
 * the call; engine/speculative.py and the batching engine rely on it. On a sliding layer the
 * ring must have at least window + n - 1 slots for n rows of one sequence, so that writing
 * them does not overwrite a key an earlier row still sees (models/kv_cache.py checks).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

void gemv_bf16(const uint16_t *W, const uint16_t *x, void *y, int64_t M, int64_t N, int64_t K, int out_f32);
void gemv_q8(const int8_t *W, const float *scale, const float *x, void *y, int64_t M, int64_t N, int64_t K,
             int out_f32);
void gemv_q4(const uint8_t *W, const float *scales, const float *x, void *y, int64_t M, int64_t N, int64_t K,
             int64_t G, int out_f32);
void gguf_gemv(int type, const uint8_t *W, const float *x, void *y, int64_t M, int64_t N, int64_t K, int64_t ldy,
               int out_f32);
int64_t gguf_row_bytes(int type, int64_t K);
void rms_norm_bf16(const uint16_t *x, const float *scale, uint16_t *y, int64_t rows, int64_t D, float eps);
void attend_decode_bf16_rows(const uint16_t *q, int64_t q_stride, const uint16_t *const *k,
                             const uint16_t *const *v, uint16_t *o, int64_t o_stride, const int64_t *S,
                             const int64_t *first, int64_t n, int64_t H, int64_t Hkv, int64_t slots, int64_t hd,
                             float scaling, float *scratch);

enum { MAT_BF16 = 0, MAT_Q8 = 1, MAT_Q4 = 2, MAT_GGUF = 3 };

typedef struct {
    const void *w;        /* bf16 [N, K], int8 [N, K], packed 4-bit [N, K / 2], or GGUF blocks */
    const float *scales;  /* q8: [N]; q4: [N, K / group] */
    int64_t kind, group;
    int64_t parts, part_type[4], part_rows[4]; /* gguf: the parts' ggml types and rows, in order */
} Mat;

/* y [T, N] (bf16) = x W^T for x [T, K] (bf16); xf: fp32 scratch of T K. */
static void matvec(const Mat *m, const uint16_t *x, uint16_t *y, int64_t T, int64_t N, int64_t K, float *xf) {
    if (m->kind == MAT_BF16) {
        gemv_bf16((const uint16_t *)m->w, x, y, T, N, K, 0);
        return;
    }
    for (int64_t k = 0; k < T * K; k++) xf[k] = bf16_to_f32(x[k]);
    if (m->kind == MAT_Q8) gemv_q8((const int8_t *)m->w, m->scales, xf, y, T, N, K, 0);
    else if (m->kind == MAT_Q4) gemv_q4((const uint8_t *)m->w, m->scales, xf, y, T, N, K, m->group, 0);
    else { /* each part writes its columns of y */
        const uint8_t *w = (const uint8_t *)m->w;
        int64_t col = 0;
        for (int64_t p = 0; p < m->parts; p++) {
            const int type = (int)m->part_type[p];
            gguf_gemv(type, w, xf, y + col, T, m->part_rows[p], K, N, 0);
            w += m->part_rows[p] * gguf_row_bytes(type, K);
            col += m->part_rows[p];
        }
    }
}

typedef struct {
    int64_t D, H, Hkv, hd, I, P, slots;  /* geometry; I = MLP width, P = PLE width (0: none) */
    int64_t window;                       /* sliding window (ring of `slots` >= window); 0: full attention */
    int64_t shared, k_eq_v, v_norm;
    int64_t seq_stride;                   /* elements between two sequence slots' buffers */
    int64_t ple_stride;
    float eps, scaling;
    Mat w_qkv, w_o, w_gu, w_down, w_ple_gate, w_ple_proj;
    const uint16_t *layer_scalar;
    const float *n_in, *n_post_attn, *n_pre_ff, *n_post_ff, *n_q, *n_k, *n_post_ple;
    const uint16_t *cos, *sin;            /* per step: [T, hd] RoPE rows of the T positions */
    const uint16_t *ple;                  /* per step: row 0's PLE input [P]; row t at + t * ple_stride */
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

/* y [T, I] = gelu(gate) * up for gate_up [T, 2 I] = [gate | up] per row (a prefill chunk's MLP,
 * kernels/activation.py): the same table lookup and bf16 product as the torch ops and the
 * decode step above, one pass and no int64 index copy. table: by signed bits, as above. */
void gelu_mul_bf16(const uint16_t *table_by_signed_bits, const uint16_t *gate_up, uint16_t *y, int64_t T, int64_t I) {
    #pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *gate = gate_up + t * 2 * I, *up = gate + I;
        for (int64_t i = 0; i < I; i++)
            y[t * I + i] = bmul(table_by_signed_bits[(int32_t)(int16_t)gate[i] + 32768], up[i]);
    }
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

/* The keys position p attends to: S of them, the first in slot `first` (cpu_attention.c). */
static inline void visible_keys(const GemmaLayer *L, int64_t p, int64_t *S, int64_t *first) {
    if (L->window > 0) {
        *S = p + 1 < L->window ? p + 1 : L->window;
        *first = (p + 1 - *S) % L->slots;
    } else {
        *S = p + 1;
        *first = 0;
    }
}

/* h: [T, D] in place. buf: bf16 scratch of T (max(2I, (H + 2 Hkv) hd) + H hd + 2 D + P);
 * fbuf: fp32 scratch of T H (S + hd), S the most keys a row sees; xf: fp32 scratch of T times the widest matrix input. */
static void layer_forward(const GemmaLayer *L, uint16_t *h, int64_t T, const int64_t *pos, const int64_t *seq,
                          uint16_t *buf, float *fbuf, float *xf) {
    const int64_t D = L->D, H = L->H, Hkv = L->Hkv, hd = L->hd, I = L->I, P = L->P;
    const int64_t qkv_n = (H + (!L->shared ? (L->k_eq_v ? 1 : 2) * Hkv : 0)) * hd;
    const int64_t big = (2 * I > qkv_n ? 2 * I : qkv_n);
    uint16_t *x = buf, *wide = x + T * D, *attn = wide + T * big, *o = attn + T * H * hd, *small = o + T * D;

    rms_norm_bf16(h, L->n_in, x, T, D, L->eps);
    matvec(&L->w_qkv, x, wide, T, qkv_n, D, xf);  /* wide: [T, qkv_n] */
    for (int64_t t = 0; t < T; t++) {
        uint16_t *q = wide + t * qkv_n, *k = q + H * hd;
        rms_norm_bf16(q, L->n_q, q, H, hd, L->eps);
        rope_rows(q, L->cos + t * hd, L->sin + t * hd, H, hd);
        if (L->shared) continue;
        uint16_t *v = L->k_eq_v ? attn + t * H * hd : k + Hkv * hd;  /* k_eq_v: v is the raw k (attn is free here) */
        if (L->k_eq_v) memcpy(v, k, (size_t)(Hkv * hd) * 2);
        rms_norm_bf16(k, L->n_k, k, Hkv, hd, L->eps);
        rope_rows(k, L->cos + t * hd, L->sin + t * hd, Hkv, hd);
        if (L->v_norm) rms_norm_bf16(v, NULL, v, Hkv, hd, L->eps);
        const int64_t slot = L->window > 0 ? pos[t] % L->slots : pos[t];
        uint16_t *kc = L->k_cache + seq[t] * L->seq_stride, *vc = L->v_cache + seq[t] * L->seq_stride;
        for (int64_t g = 0; g < Hkv; g++) {
            memcpy(kc + (g * L->slots + slot) * hd, k + g * hd, (size_t)hd * 2);
            memcpy(vc + (g * L->slots + slot) * hd, v + g * hd, (size_t)hd * 2);
        }
    }
    int64_t S[T], first[T];
    const uint16_t *kr[T], *vr[T];
    for (int64_t t = 0; t < T; t++) {
        visible_keys(L, pos[t], &S[t], &first[t]);
        kr[t] = L->k_cache + seq[t] * L->seq_stride, vr[t] = L->v_cache + seq[t] * L->seq_stride;
    }
    attend_decode_bf16_rows(wide, qkv_n, kr, vr, attn, H * hd, S, first, T, H, Hkv, L->slots, hd, L->scaling, fbuf);
    matvec(&L->w_o, attn, o, T, D, H * hd, xf);
    rms_norm_bf16(o, L->n_post_attn, o, T, D, L->eps);
    for (int64_t d = 0; d < T * D; d++) h[d] = badd(h[d], o[d]);

    rms_norm_bf16(h, L->n_pre_ff, x, T, D, L->eps);
    matvec(&L->w_gu, x, wide, T, 2 * I, D, xf);  /* wide: [T, 2I] = [gate | up] per row */
    /* gelu(gate) * up, packed to [T, I] in place (row t's writes end before its reads begin) */
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < I; i++) wide[t * I + i] = bmul(gelu_table[wide[t * 2 * I + i]], wide[t * 2 * I + I + i]);
    matvec(&L->w_down, wide, o, T, D, I, xf);
    rms_norm_bf16(o, L->n_post_ff, o, T, D, L->eps);
    for (int64_t d = 0; d < T * D; d++) h[d] = badd(h[d], o[d]);

    if (P) {
        matvec(&L->w_ple_gate, h, small, T, P, D, xf);
        for (int64_t t = 0; t < T; t++)
            for (int64_t p = 0; p < P; p++)
                small[t * P + p] = bmul(gelu_table[small[t * P + p]], L->ple[t * L->ple_stride + p]);
        matvec(&L->w_ple_proj, small, o, T, D, P, xf);
        rms_norm_bf16(o, L->n_post_ple, o, T, D, L->eps);
        for (int64_t d = 0; d < T * D; d++) h[d] = badd(h[d], o[d]);
    }
    if (L->layer_scalar)
        for (int64_t d = 0; d < T * D; d++) h[d] = bmul(h[d], L->layer_scalar[0]);
}

/* h: [T, D] hidden states of the rows (positions pos[T], cache slots seq[T]), in place. */
void gemma_decode_layers_bf16(const GemmaLayer *layers, int64_t n, uint16_t *h, int64_t T, const int64_t *pos,
                              const int64_t *seq, uint16_t *buf, float *fbuf, float *xf) {
    for (int64_t i = 0; i < n; i++) layer_forward(&layers[i], h, T, pos, seq, buf, fbuf, xf);
}
