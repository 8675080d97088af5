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
 * ring slots (speculative decoding) gives the plain path's bits. One query per call;
 * OpenMP splits the heads.
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

#define DEFINE_ATTN(NAME, T, LOAD)                                                              \
void NAME(const T *q, const T *k, const T *v, T *o, int64_t H, int64_t Hkv, int64_t S,          \
          int64_t first, int64_t slots, int64_t hd, float scaling, float *scratch) {            \
    /* scratch: H * (S + hd) floats */                                                          \
    const int64_t G = H / Hkv, head_stride = slots * hd;                                        \
    _Pragma("omp parallel for schedule(static)")                                                \
    for (int64_t h = 0; h < H; h++) {                                                           \
        const T *kh = k + (h / G) * head_stride, *vh = v + (h / G) * head_stride;               \
        const T *qh = q + h * hd;                                                               \
        float *s = scratch + h * (S + hd), *acc = s + S;                                        \
        float m = -INFINITY;                                                                    \
        for (int64_t j = 0; j < S; j++) {                                                       \
            const int64_t slot = first + j < slots ? first + j : first + j - slots;            \
            VEC a = VZERO();                                                                    \
            for (int64_t d = 0; d < hd; d += LANES)                                             \
                a = VFMA(LOAD(qh + d), LOAD(kh + slot * hd + d), a);                            \
            s[j] = VSUM(a) * scaling;                                                           \
            if (s[j] > m) m = s[j];                                                             \
        }                                                                                       \
        float total = 0.f;                                                                      \
        for (int64_t j = 0; j < S; j++) { s[j] = expf(s[j] - m); total += s[j]; }               \
        const float inv = 1.f / total;                                                          \
        for (int64_t d = 0; d < hd; d += LANES) VSTOREF(acc + d, VZERO());                      \
        for (int64_t j = 0; j < S; j++) {                                                       \
            const VEC p = VSET1(s[j] * inv);                                                    \
            const int64_t slot = first + j < slots ? first + j : first + j - slots;            \
            for (int64_t d = 0; d < hd; d += LANES)                                             \
                VSTOREF(acc + d, VFMA(p, LOAD(vh + slot * hd + d),                              \
                                                          VLOADF(acc + d)));                    \
        }                                                                                       \
        STORE_##T(o + h * hd, acc, hd);                                                         \
    }                                                                                           \
}

#define STORE_float(dst, acc, hd) for (int64_t d = 0; d < (hd); d++) (dst)[d] = (acc)[d]
#define STORE_uint16_t(dst, acc, hd) for (int64_t d = 0; d < (hd); d++) (dst)[d] = f32_to_bf16((acc)[d])

DEFINE_ATTN(attend_decode_f32, float, VLOADF)
DEFINE_ATTN(attend_decode_bf16, uint16_t, ld_bf16)
