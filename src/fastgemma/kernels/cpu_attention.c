/* Single-query attention (batch-1 decode) over a static KV cache, on x86-64 with AVX-512
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
 * ring slots (speculative decoding) gives the plain path's bits. One query per call.
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

/* The heads of one kv head are taken together, so that each key / value vector is loaded
 * (and widened) once for all of them, and the work is split across threads by keys (scores)
 * and by lanes of d (output) rather than by heads (a model may have a single kv head):
 *   1. scores, blocks of 4 keys x up to 4 heads: 16 independent FMA chains, each over d in
 *      order (one chain per key is bound by the FMA's latency);
 *   2. per head: max, exp and their sum in key order;
 *   3. output tiles of ATTN_TILE vectors of d x up to 4 heads, each lane summed over the keys
 *      in position order.
 * Every number is formed by the same operations in the same order as one head, one key and
 * one lane at a time, so the result has the same bits whatever the split. */
#define ATTN_TILE 4
#define ATTN_SLOT(j) (first + (j) < slots ? first + (j) : first + (j) - slots)
#define DEFINE_ATTN(NAME, T, LOAD)                                                              \
void NAME(const T *q, const T *k, const T *v, T *o, int64_t H, int64_t Hkv, int64_t S,          \
          int64_t first, int64_t slots, int64_t hd, float scaling, float *scratch) {            \
    /* scratch: H * (S + hd) floats: head h's scores (then exps) and output sums */             \
    const int64_t G = H / Hkv, head_stride = slots * hd, key_blocks = (S + 3) / 4;              \
    const int64_t tile = hd % (ATTN_TILE * LANES) == 0 ? ATTN_TILE : 1, tiles = hd / (tile * LANES); \
    float inv[H];                                                                               \
    _Pragma("omp parallel")                                                                     \
    {                                                                                           \
        _Pragma("omp for schedule(static)")                                                     \
        for (int64_t item = 0; item < Hkv * key_blocks; item++) {  /* 1. scores */              \
            const int64_t g = item / key_blocks, j0 = (item % key_blocks) * 4;                  \
            const int64_t nk = S - j0 < 4 ? S - j0 : 4;                                         \
            const T *kj[4];                                                                     \
            for (int64_t i = 0; i < 4; i++)                                                     \
                kj[i] = k + g * head_stride + ATTN_SLOT(j0 + (i < nk ? i : 0)) * hd;            \
            for (int64_t h0 = g * G; h0 < (g + 1) * G; h0 += 4) {                               \
                const int64_t nh = (g + 1) * G - h0 < 4 ? (g + 1) * G - h0 : 4;                 \
                VEC a[4][4];  /* [head][key] */                                                 \
                for (int i = 0; i < 4; i++) for (int u = 0; u < 4; u++) a[i][u] = VZERO();      \
                for (int64_t d = 0; d < hd; d += LANES) {                                       \
                    const VEC k0 = LOAD(kj[0] + d), k1 = LOAD(kj[1] + d);                       \
                    const VEC k2 = LOAD(kj[2] + d), k3 = LOAD(kj[3] + d);                       \
                    for (int i = 0; i < 4; i++) {                                               \
                        if (i >= nh) break;                                                     \
                        const VEC qd = LOAD(q + (h0 + i) * hd + d);                             \
                        a[i][0] = VFMA(qd, k0, a[i][0]), a[i][1] = VFMA(qd, k1, a[i][1]);       \
                        a[i][2] = VFMA(qd, k2, a[i][2]), a[i][3] = VFMA(qd, k3, a[i][3]);       \
                    }                                                                           \
                }                                                                               \
                for (int64_t i = 0; i < nh; i++)                                                \
                    for (int64_t u = 0; u < nk; u++) scratch[(h0 + i) * (S + hd) + j0 + u] = VSUM(a[i][u]) * scaling; \
            }                                                                                   \
        }                                                                                       \
        _Pragma("omp for schedule(static)")                                                     \
        for (int64_t h = 0; h < H; h++) {  /* 2. softmax's exps and sum, in key order */        \
            float *s = scratch + h * (S + hd), m = -INFINITY, total = 0.f;                      \
            for (int64_t j = 0; j < S; j++) if (s[j] > m) m = s[j];                             \
            for (int64_t j = 0; j < S; j++) { s[j] = expf(s[j] - m); total += s[j]; }           \
            inv[h] = 1.f / total;                                                               \
        }                                                                                       \
        _Pragma("omp for schedule(static)")                                                     \
        for (int64_t item = 0; item < Hkv * tiles; item++) {  /* 3. outputs */                  \
            const int64_t g = item / tiles, d0 = (item % tiles) * tile * LANES;                 \
            const T *vg = v + g * head_stride + d0;                                             \
            for (int64_t h0 = g * G; h0 < (g + 1) * G; h0 += 4) {                               \
                const int64_t nh = (g + 1) * G - h0 < 4 ? (g + 1) * G - h0 : 4;                 \
                VEC t[4][ATTN_TILE];  /* [head][vector] */                                      \
                for (int i = 0; i < 4; i++) for (int r = 0; r < ATTN_TILE; r++) t[i][r] = VZERO(); \
                if (tile == ATTN_TILE) {                                                        \
                    for (int64_t j = 0; j < S; j++) {                                           \
                        const T *vj = vg + ATTN_SLOT(j) * hd;                                   \
                        VEC x[ATTN_TILE];                                                       \
                        for (int r = 0; r < ATTN_TILE; r++) x[r] = LOAD(vj + r * LANES);        \
                        for (int i = 0; i < 4; i++) {                                           \
                            if (i >= nh) break;                                                 \
                            const VEC p = VSET1(scratch[(h0 + i) * (S + hd) + j] * inv[h0 + i]); \
                            for (int r = 0; r < ATTN_TILE; r++) t[i][r] = VFMA(p, x[r], t[i][r]); \
                        }                                                                       \
                    }                                                                           \
                } else {                                                                        \
                    for (int64_t j = 0; j < S; j++) {                                           \
                        const VEC x = LOAD(vg + ATTN_SLOT(j) * hd);                             \
                        for (int i = 0; i < 4; i++) {                                           \
                            if (i >= nh) break;                                                 \
                            t[i][0] = VFMA(VSET1(scratch[(h0 + i) * (S + hd) + j] * inv[h0 + i]), x, t[i][0]); \
                        }                                                                       \
                    }                                                                           \
                }                                                                               \
                for (int64_t i = 0; i < nh; i++) {                                              \
                    float *sums = scratch + (h0 + i) * (S + hd) + S + d0;                       \
                    for (int r = 0; r < tile; r++) VSTOREF(sums + r * LANES, t[i][r]);          \
                    STORE_##T(o + (h0 + i) * hd + d0, sums, tile * LANES);                      \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
}

#define STORE_float(dst, acc, hd) for (int64_t d = 0; d < (hd); d++) (dst)[d] = (acc)[d]
#define STORE_uint16_t(dst, acc, hd) for (int64_t d = 0; d < (hd); d++) (dst)[d] = f32_to_bf16((acc)[d])

DEFINE_ATTN(attend_decode_f32, float, VLOADF)
DEFINE_ATTN(attend_decode_bf16, uint16_t, ld_bf16)
