/* Single-query attention (decode) over a static KV cache, on x86-64 with AVX-512
 * (16 lanes, hd % 16 == 0) or AVX2 + FMA (8 lanes, hd % 8 == 0), whichever the library is
 * built for.
 *
 * For each query head h (kv head g = h / (H / Hkv)):
 *   s_j = scaling * (q_h . k_{g,j})           j < S, fp32
 *   p   = softmax(s)                          fp32
 *   o_h = sum_j p_j v_{g,j}                   fp32, stored in the cache dtype
 * q, o: [H, hd] contiguous; k, v: [Hkv, slots, hd] (the cache buffers). Key j is the one in
 * slot (first + j) mod slots: the visible keys in position order, whether the cache is a
 * flat buffer (first = 0) or a ring that has wrapped (models/kv_cache.py). Summing in
 * position order makes the result independent of the ring's size, so a cache with spare
 * ring slots (speculative decoding) gives the plain path's bits. One query a row; a call
 * takes one row (`attend_decode_*`) or the rows of a batched step (`attend_decode_*_rows`).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "bf16.h"
#include "simd.h"

#if defined(__AVX512F__)
#define VEC __m512
#define LANES 16
#define VZERO _mm512_setzero_ps
#define VFMA _mm512_fmadd_ps
#define VSET1 _mm512_set1_ps
#define VLOADF _mm512_loadu_ps
#define VSTOREF _mm512_storeu_ps
#define VSUM _mm512_reduce_add_ps
static inline __m512 ld_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
#else
#define VEC __m256
#define LANES 8
#define VZERO _mm256_setzero_ps
#define VFMA _mm256_fmadd_ps
#define VSET1 _mm256_set1_ps
#define VLOADF _mm256_loadu_ps
#define VSTOREF _mm256_storeu_ps
static inline float VSUM(__m256 a) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    r = _mm_hadd_ps(r, r);
    r = _mm_hadd_ps(r, r);
    return _mm_cvtss_f32(r);
}
#define ld_bf16 widen_bf16x8
#endif

/* n rows in one call (a batched decode step: each row its own sequence's query over its own
 * keys). Row t: query q + t q_stride ([H, hd]), its sequence's cache buffers k[t], v[t]
 * ([Hkv, slots, hd]), S[t] visible keys from slot first[t], output o + t o_stride.
 * The heads of one kv head are taken together, so that each key / value vector is loaded
 * (and widened) once for all of them, and the work of all rows is split across threads by
 * keys (scores) and by lanes of d (output) rather than by heads (a model may have a single
 * kv head), with one barrier a phase for the whole call:
 *   1. scores, blocks of 4 keys x up to 4 heads: 16 independent FMA chains, each over d in
 *      order (one chain per key is bound by the FMA's latency);
 *   2. per head: max, exp and their sum in key order;
 *   3. output tiles of ATTN_TILE vectors of d x up to 4 heads, each lane summed over the keys
 *      in position order.
 * Every number is formed by the same operations in the same order as one row, one head, one
 * key and one lane at a time, so a row's result has the same bits whatever the split and
 * whatever other rows share the call. */
#define ATTN_TILE 4
#define ATTN_SLOT(j) (first_t + (j) < slots ? first_t + (j) : first_t + (j) - slots)
#define DEFINE_ATTN(NAME, T, LOAD)                                                              \
void NAME##_rows(const T *q, int64_t q_stride, const T *const *k, const T *const *v, T *o,      \
                 int64_t o_stride, const int64_t *S, const int64_t *first, int64_t n, int64_t H, \
                 int64_t Hkv, int64_t slots, int64_t hd, float scaling, float *scratch) {       \
    /* scratch: sum over rows of H * (S[t] + hd) floats: head h's scores (then exps) and output sums */ \
    const int64_t G = H / Hkv, head_stride = slots * hd;                                        \
    const int64_t tile = hd % (ATTN_TILE * LANES) == 0 ? ATTN_TILE : 1, tiles = hd / (tile * LANES); \
    int64_t blocks[n + 1], base[n + 1];  /* before row t: phase-1 items, scratch floats */      \
    blocks[0] = base[0] = 0;                                                                    \
    for (int64_t t = 0; t < n; t++) {                                                           \
        blocks[t + 1] = blocks[t] + Hkv * ((S[t] + 3) / 4);                                     \
        base[t + 1] = base[t] + H * (S[t] + hd);                                                \
    }                                                                                           \
    float inv[n * H];                                                                           \
    _Pragma("omp parallel")                                                                     \
    {                                                                                           \
        _Pragma("omp for schedule(static)")                                                     \
        for (int64_t item = 0; item < blocks[n]; item++) {  /* 1. scores */                     \
            int64_t t = 0;                                                                      \
            while (item >= blocks[t + 1]) t++;                                                  \
            const int64_t S_t = S[t], first_t = first[t], key_blocks = (S_t + 3) / 4;           \
            const int64_t g = (item - blocks[t]) / key_blocks, j0 = ((item - blocks[t]) % key_blocks) * 4; \
            const int64_t nk = S_t - j0 < 4 ? S_t - j0 : 4;                                     \
            const T *qt = q + t * q_stride, *kj[4];                                             \
            float *st = scratch + base[t];                                                      \
            for (int64_t i = 0; i < 4; i++)                                                     \
                kj[i] = k[t] + g * head_stride + ATTN_SLOT(j0 + (i < nk ? i : 0)) * hd;         \
            for (int64_t h0 = g * G; h0 < (g + 1) * G; h0 += 4) {                               \
                const int64_t nh = (g + 1) * G - h0 < 4 ? (g + 1) * G - h0 : 4;                 \
                VEC a[4][4];  /* [head][key] */                                                 \
                for (int i = 0; i < 4; i++) for (int u = 0; u < 4; u++) a[i][u] = VZERO();      \
                for (int64_t d = 0; d < hd; d += LANES) {                                       \
                    const VEC k0 = LOAD(kj[0] + d), k1 = LOAD(kj[1] + d);                       \
                    const VEC k2 = LOAD(kj[2] + d), k3 = LOAD(kj[3] + d);                       \
                    for (int i = 0; i < 4; i++) {                                               \
                        if (i >= nh) break;                                                     \
                        const VEC qd = LOAD(qt + (h0 + i) * hd + d);                            \
                        a[i][0] = VFMA(qd, k0, a[i][0]), a[i][1] = VFMA(qd, k1, a[i][1]);       \
                        a[i][2] = VFMA(qd, k2, a[i][2]), a[i][3] = VFMA(qd, k3, a[i][3]);       \
                    }                                                                           \
                }                                                                               \
                for (int64_t i = 0; i < nh; i++)                                                \
                    for (int64_t u = 0; u < nk; u++) st[(h0 + i) * (S_t + hd) + j0 + u] = VSUM(a[i][u]) * scaling; \
            }                                                                                   \
        }                                                                                       \
        _Pragma("omp for schedule(static)")                                                     \
        for (int64_t item = 0; item < n * H; item++) {  /* 2. softmax's exps and sum, in key order */ \
            const int64_t t = item / H, h = item % H, S_t = S[t];                               \
            float *s = scratch + base[t] + h * (S_t + hd), m = -INFINITY, total = 0.f;          \
            for (int64_t j = 0; j < S_t; j++) if (s[j] > m) m = s[j];                           \
            for (int64_t j = 0; j < S_t; j++) { s[j] = expf(s[j] - m); total += s[j]; }         \
            inv[item] = 1.f / total;                                                            \
        }                                                                                       \
        _Pragma("omp for schedule(static)")                                                     \
        for (int64_t item = 0; item < n * Hkv * tiles; item++) {  /* 3. outputs */              \
            const int64_t t = item / (Hkv * tiles), g = item / tiles % Hkv;                     \
            const int64_t d0 = (item % tiles) * tile * LANES, S_t = S[t], first_t = first[t];   \
            const T *vg = v[t] + g * head_stride + d0;                                          \
            const float *st = scratch + base[t], *inv_t = inv + t * H;                          \
            for (int64_t h0 = g * G; h0 < (g + 1) * G; h0 += 4) {                               \
                const int64_t nh = (g + 1) * G - h0 < 4 ? (g + 1) * G - h0 : 4;                 \
                VEC acc[4][ATTN_TILE];  /* [head][vector] */                                    \
                for (int i = 0; i < 4; i++) for (int r = 0; r < ATTN_TILE; r++) acc[i][r] = VZERO(); \
                if (tile == ATTN_TILE) {                                                        \
                    for (int64_t j = 0; j < S_t; j++) {                                         \
                        const T *vj = vg + ATTN_SLOT(j) * hd;                                   \
                        VEC x[ATTN_TILE];                                                       \
                        for (int r = 0; r < ATTN_TILE; r++) x[r] = LOAD(vj + r * LANES);        \
                        for (int i = 0; i < 4; i++) {                                           \
                            if (i >= nh) break;                                                 \
                            const VEC p = VSET1(st[(h0 + i) * (S_t + hd) + j] * inv_t[h0 + i]); \
                            for (int r = 0; r < ATTN_TILE; r++) acc[i][r] = VFMA(p, x[r], acc[i][r]); \
                        }                                                                       \
                    }                                                                           \
                } else {                                                                        \
                    for (int64_t j = 0; j < S_t; j++) {                                         \
                        const VEC x = LOAD(vg + ATTN_SLOT(j) * hd);                             \
                        for (int i = 0; i < 4; i++) {                                           \
                            if (i >= nh) break;                                                 \
                            acc[i][0] = VFMA(VSET1(st[(h0 + i) * (S_t + hd) + j] * inv_t[h0 + i]), x, acc[i][0]); \
                        }                                                                       \
                    }                                                                           \
                }                                                                               \
                for (int64_t i = 0; i < nh; i++) {                                              \
                    float *sums = scratch + base[t] + (h0 + i) * (S_t + hd) + S_t + d0;         \
                    for (int r = 0; r < tile; r++) VSTOREF(sums + r * LANES, acc[i][r]);        \
                    STORE_##T(o + t * o_stride + (h0 + i) * hd + d0, sums, tile * LANES);       \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
}                                                                                               \
/* One row (the per-op path): q, o [H, hd]; k, v one sequence's buffers. */                    \
void NAME(const T *q, const T *k, const T *v, T *o, int64_t H, int64_t Hkv, int64_t S,          \
          int64_t first, int64_t slots, int64_t hd, float scaling, float *scratch) {            \
    NAME##_rows(q, 0, &k, &v, o, 0, &S, &first, 1, H, Hkv, slots, hd, scaling, scratch);        \
}

#define STORE_float(dst, acc, hd) for (int64_t d = 0; d < (hd); d++) (dst)[d] = (acc)[d]
#define STORE_uint16_t(dst, acc, hd) for (int64_t d = 0; d < (hd); d++) (dst)[d] = f32_to_bf16((acc)[d])

DEFINE_ATTN(attend_decode_f32, float, VLOADF)
DEFINE_ATTN(attend_decode_bf16, uint16_t, ld_bf16)
