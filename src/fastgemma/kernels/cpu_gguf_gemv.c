/* Matrix-vector products that read a GGUF's own quantised blocks (AVX-512 or AVX2 + FMA).
 *
 * y[m, n] = sum_k W[n, k] x[m, k] where row n of W is stored as llama.cpp stores it: K / 32
 * blocks of 32 weights (Q4_0, Q5_0, Q8_0) or K / 256 super-blocks of 256 (Q4_K, Q6_K), the
 * layouts of ggml-common.h. Each weight is decoded into fp32 registers as *exactly* the value
 * llama.cpp's and gguf-py's dequantisation give: every product of a block's fp16 scale (11
 * significant bits), its sub-scale (Q4_K: 6 bits; Q6_K: int8, at most 7) and the code (at most
 * 6 bits) has at most 24 significant bits, so it is exact in fp32, and so is d (q - z) formed
 * as an FMA d q - z d; Q4_K's d1 q - m1 rounds once, as theirs does (an FMA of an exact
 * product). The model these products run is the file's, with no second rounding of the
 * weights. x and the sums are fp32.
 *
 * Row-invariant: a weight row is decoded once per tile of up to MT inputs and each input's
 * sum runs in 2 NV FMA chains (even and odd blocks, NV vectors a block: 4 chains of 16 lanes
 * in the AVX-512 build, 8 of 8 in the AVX2 one) summed in a fixed order, so y[m, n] has the
 * same bits whatever M is.
 * Rows are split across cores. y is fp32 (out_f32 = 1) or bf16 rounded to nearest even, with
 * row stride ldy (a part of a fused matrix writes its columns of a wider output).
 *
 * gguf_dequantize writes the dense matrix (fp32 or bf16) from the same decoding: prefill
 * multiplies by it.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "simd.h"
#include "vec.h"

enum { GGML_Q4_0 = 2, GGML_Q5_0 = 6, GGML_Q8_0 = 8, GGML_Q4_K = 12, GGML_Q6_K = 14 };

#define NV (32 / VEC) /* vectors per 32 weights */

#ifdef __AVX512F__
#define MT 4
#else
#define MT 2
#endif

static inline float fp16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Bytes per row-unit (32 or 256 weights) and weights per unit. */
static inline int64_t unit_bytes(int type) {
    switch (type) {
        case GGML_Q4_0: return 18;
        case GGML_Q5_0: return 22;
        case GGML_Q8_0: return 34;
        case GGML_Q4_K: return 144;
        case GGML_Q6_K: return 210;
        default: return 0;
    }
}
static inline int64_t unit_weights(int type) { return type == GGML_Q4_K || type == GGML_Q6_K ? 256 : 32; }

/* Bytes of a row of K weights of `type`; 0 for a type without a kernel here. */
int64_t gguf_row_bytes(int type, int64_t K) { return K / unit_weights(type) * unit_bytes(type); }

/* Nibble vector c of a 32-weight block whose 16 bytes q hold weight j in the low nibble of
 * byte j and weight j + 16 in the high one (Q4_0, Q5_0). */
static inline vi nibbles16(const uint8_t *q, int c) {
    const int lo = c * VEC < 16;
    const vi v = load_u8(q + (c * VEC) % 16);
    return lo ? vand_i(v, vset1_i(0x0f)) : vsrl_i(v, 4);
}

/* v | 16 in the lanes whose bit of `bits` is set (lane i: bit i). */
static inline vi with_bit4(vi v, uint32_t bits) {
#ifdef __AVX512F__
    return _mm512_mask_or_epi32(v, (__mmask16)bits, v, vset1_i(16));
#else
    const vi lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const vi set = _mm256_cmpeq_epi32(_mm256_and_si256(vset1_i((int)bits), lane_bit), lane_bit);
    return vor_i(v, _mm256_and_si256(set, vset1_i(16)));
#endif
}

/* Block b (32 weights) of the row at `row` -> w[NV], the dequantised weights. */
static inline __attribute__((always_inline)) void decode32(int type, const uint8_t *row, int64_t b, vf w[NV]) {
    if (type == GGML_Q8_0) {
        const uint8_t *p = row + b * 34;
        const vf d = vset1(fp16(p));
        for (int c = 0; c < NV; c++) w[c] = vmul(vcvt(load_i8(p + 2 + c * VEC)), d);
    } else if (type == GGML_Q5_0) {
        const uint8_t *p = row + b * 22;
        const vf d = vset1(fp16(p));
        uint32_t qh;
        memcpy(&qh, p + 2, 4);
        const vf d16 = vmul(d, vset1(16.f));
        for (int c = 0; c < NV; c++) /* weight j's fifth bit is bit j of qh; d q - 16 d = d (q - 16), exact */
            w[c] = vfmsub(vcvt(with_bit4(nibbles16(p + 6, c), qh >> (c * VEC))), d, d16);
    } else if (type == GGML_Q4_0) {
        const uint8_t *p = row + b * 18;
        const vf d = vset1(fp16(p));
        const vf d8 = vmul(d, vset1(8.f));
        for (int c = 0; c < NV; c++) w[c] = vfmsub(vcvt(nibbles16(p + 2, c)), d, d8);
    } else if (type == GGML_Q4_K) {
        const uint8_t *p = row + (b / 8) * 144;
        const int s = (int)(b % 8); /* sub-block: 32 weights from bytes 32 (s / 2).., low nibbles if s even */
        const uint8_t *sc = p + 4;
        int scale, min;
        if (s < 4) {
            scale = sc[s] & 63;
            min = sc[s + 4] & 63;
        } else {
            scale = (sc[s + 4] & 0xf) | ((sc[s - 4] >> 6) << 4);
            min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
        }
        const vf d1 = vset1(fp16(p) * (float)scale), m1 = vset1(fp16(p + 2) * (float)min);
        const uint8_t *q = p + 16 + 32 * (s / 2);
        for (int c = 0; c < NV; c++) {
            const vi v = load_u8(q + c * VEC);
            w[c] = vfmsub(d1, vcvt(s % 2 ? vsrl_i(v, 4) : vand_i(v, vset1_i(0x0f))), m1);
        }
    } else { /* GGML_Q6_K */
        const uint8_t *p = row + (b / 8) * 210;
        const int s = (int)(b % 8), half = s / 4, t = s % 4; /* 128-weight half, quarter t of it */
        const uint8_t *ql = p + 64 * half + (t % 2) * 32, *qh = p + 128 + 32 * half;
        const int8_t *sc = (const int8_t *)(p + 192) + 8 * half + 2 * t;
        const float d = fp16(p + 208);
        for (int c = 0; c < NV; c++) {
            const vi l = load_u8(ql + c * VEC), h = load_u8(qh + c * VEC);
            const vi lo4 = t < 2 ? vand_i(l, vset1_i(0x0f)) : vsrl_i(l, 4);
            const vi hi2 = vsll_i(vand_i(vsrl_n(h, 2 * t), vset1_i(3)), 4);
            const float ds = d * (float)sc[(c * VEC) / 16]; /* exact: 11 + 8 bits; so is ds q - 32 ds */
            w[c] = vfmsub(vcvt(vor_i(lo4, hi2)), vset1(ds), vset1(32.f * ds));
        }
    }
}

/* One weight row against nt <= MT inputs (stride K): s[m] = sum_k w[k] x[m, k]. */
static inline __attribute__((always_inline)) void dot_rows(int type, const uint8_t *row, const float *x, int64_t K,
                                                           int nt, float s[MT]) {
    vf a[MT][2 * NV];
    for (int m = 0; m < MT; m++)
        for (int c = 0; c < 2 * NV; c++) a[m][c] = vzero();
    const int64_t blocks = K / 32, ub = unit_bytes(type), per_unit = unit_weights(type) / 32;
    int64_t b = 0;
    for (; b + 2 <= blocks; b += 2) { /* even blocks into chains 0.., odd ones into NV.. */
        if (b % per_unit == 0) _mm_prefetch((const char *)(row + (b / per_unit) * ub + PREFETCH_BYTES), _MM_HINT_T0);
        vf w0[NV], w1[NV];
        decode32(type, row, b, w0);
        decode32(type, row, b + 1, w1);
        for (int m = 0; m < nt; m++) {
            const float *xb = x + m * K + b * 32;
            for (int c = 0; c < NV; c++) {
                a[m][c] = vfma(w0[c], vload(xb + c * VEC), a[m][c]);
                a[m][NV + c] = vfma(w1[c], vload(xb + 32 + c * VEC), a[m][NV + c]);
            }
        }
    }
    if (b < blocks) { /* an odd count's last block (even: chains 0..) */
        vf w0[NV];
        decode32(type, row, b, w0);
        for (int m = 0; m < nt; m++)
            for (int c = 0; c < NV; c++) a[m][c] = vfma(w0[c], vload(x + m * K + b * 32 + c * VEC), a[m][c]);
    }
    for (int m = 0; m < nt; m++) {
        vf t = a[m][0];
        for (int c = 1; c < 2 * NV; c++) t = vadd(t, a[m][c]);
        s[m] = vsum(t);
    }
}

static inline void store(void *y, int64_t i, float v, int out_f32) {
    if (out_f32) ((float *)y)[i] = v;
    else ((uint16_t *)y)[i] = f32_to_bf16(v);
}

/* y[m, n] (row stride ldy) = sum_k W[n, k] x[m, k] for W of `type`, N rows of K weights. */
void gguf_gemv(int type, const uint8_t *W, const float *x, void *y, int64_t M, int64_t N, int64_t K, int64_t ldy,
               int out_f32) {
    const int64_t row_bytes = gguf_row_bytes(type, K);
    if (!row_bytes) return; /* a type without a kernel: the caller checks (kernels/gguf.py) */
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *row = W + n * row_bytes;
        for (int64_t m0 = 0; m0 < M; m0 += MT) {
            const int nt = (M - m0) < MT ? (int)(M - m0) : MT;
            const float *xm = x + m0 * K;
            float s[MT] = {0};
            switch (type) { /* constant types and tile sizes: decoding and chains inlined */
#define TILES(T)                                             \
                case T:                                       \
                    if (nt == 1) dot_rows(T, row, xm, K, 1, s);   \
                    else if (nt == 2) dot_rows(T, row, xm, K, 2, s); \
                    else if (nt == 3) dot_rows(T, row, xm, K, 3 % MT, s); /* (AVX2: MT = 2, never 3) */ \
                    else dot_rows(T, row, xm, K, MT, s);          \
                    break;
                TILES(GGML_Q4_0) TILES(GGML_Q5_0) TILES(GGML_Q8_0) TILES(GGML_Q4_K) TILES(GGML_Q6_K)
#undef TILES
                default: break; /* not reached: the type was checked above */
            }
            for (int m = 0; m < nt; m++) store(y, (m0 + m) * ldy + n, s[m], out_f32);
        }
    }
}

/* The dense matrix [N, K] (fp32, or bf16 rounded to nearest even) the blocks stand for. */
void gguf_dequantize(int type, const uint8_t *W, void *out, int64_t N, int64_t K, int out_f32) {
    const int64_t row_bytes = gguf_row_bytes(type, K);
    if (!row_bytes) return;
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        float buf[32];
        for (int64_t b = 0; b < K / 32; b++) {
            vf w[NV];
            decode32(type, W + n * row_bytes, b, w);
            for (int c = 0; c < NV; c++) vstore(buf + c * VEC, w[c]);
            for (int j = 0; j < 32; j++) store(out, n * K + b * 32 + j, buf[j], out_f32);
        }
    }
}
