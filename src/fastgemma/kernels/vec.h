/* One vector vocabulary for the quantised GEMVs (cpu_quant_gemv.c, cpu_gguf_gemv.c), whatever
 * the build: VEC fp32 lanes (16 with AVX-512, 8 with AVX2), vf / vi their float / int32
 * vectors, and the few operations those kernels use on them. */
#ifndef FASTGEMMA_VEC_H
#define FASTGEMMA_VEC_H
#include <immintrin.h>
#include <stdint.h>

#include "simd.h"

#ifdef __AVX512F__
#define VEC 16
typedef __m512 vf;
typedef __m512i vi;
#define vzero _mm512_setzero_ps
#define vadd _mm512_add_ps
#define vmul _mm512_mul_ps
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vfma _mm512_fmadd_ps
#define vfmsub _mm512_fmsub_ps
#define vset1 _mm512_set1_ps
#define vcvt _mm512_cvtepi32_ps
#define vand_i _mm512_and_si512
#define vor_i _mm512_or_si512
#define vsub_i _mm512_sub_epi32
#define vsrl_i _mm512_srli_epi32
#define vsll_i _mm512_slli_epi32
#define vsrl_n(v, n) _mm512_srl_epi32(v, _mm_cvtsi32_si128(n))
#define vset1_i _mm512_set1_epi32
static inline vi load_i8(const void *p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline vi load_u8(const void *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline float vsum(vf a) { return _mm512_reduce_add_ps(a); }
static inline __m128 vreduce4(const vf acc[4]) { return reduce4(acc); }
#else
#define VEC 8
typedef __m256 vf;
typedef __m256i vi;
#define vzero _mm256_setzero_ps
#define vadd _mm256_add_ps
#define vmul _mm256_mul_ps
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vfma _mm256_fmadd_ps
#define vfmsub _mm256_fmsub_ps
#define vset1 _mm256_set1_ps
#define vcvt _mm256_cvtepi32_ps
#define vand_i _mm256_and_si256
#define vor_i _mm256_or_si256
#define vsub_i _mm256_sub_epi32
#define vsrl_i _mm256_srli_epi32
#define vsll_i _mm256_slli_epi32
#define vsrl_n(v, n) _mm256_srl_epi32(v, _mm_cvtsi32_si128(n))
#define vset1_i _mm256_set1_epi32
static inline vi load_i8(const void *p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline vi load_u8(const void *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline float vsum(vf a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
static inline __m128 vreduce4(const vf acc[4]) { return reduce4_256(acc); }
#endif
#endif
