/* SIMD helpers shared by the GEMV kernels: AVX2 (always) and AVX-512 (when compiled for it). */
#ifndef FASTGEMMA_SIMD_H
#define FASTGEMMA_SIMD_H
#include <immintrin.h>
#include <stdint.h>

/* How far ahead of its reads a GEMV thread prefetches its weight stream. Rows here are short
 * (K <= a few thousand), so the hardware prefetcher restarts at every row; an explicit hint
 * 2 KiB ahead keeps the stream in flight (int8 lm_head: 9 ms -> 6 ms per product here). */
#define PREFETCH_BYTES 2048

/* Where a block of weights is applied to three or more inputs (a batched decode step), its
 * loop consumes the stream several times slower and a hint 2 KiB ahead lands too late to
 * hide the memory's latency (the loops stalled on the weight loads): those loops prefetch
 * into L2 (`_MM_HINT_T1`) this far ahead instead (benchmarks/batched_kernels.py, 8 rows: the
 * int8 lm_head screen 8.7-9.6 -> 4.5-4.8 ms). Prefetches change no result. */
#define PREFETCH_FAR_BYTES 8192

/* The four row sums of acc[0..3] (8 lanes each) as one vector [s0, s1, s2, s3]. */
static inline __m128 reduce4_256(const __m256 acc[4]) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* 8 bf16 values -> 8 floats (exact). */
static inline __m256 widen_bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* 8 int8 values (the low 8 bytes of q) -> 8 floats (exact). */
static inline __m256 widen_i8x8(__m128i q) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)); }

#ifdef __AVX512F__
/* The four row sums of acc[0..3] (16 lanes each) as one vector [s0, s1, s2, s3]. */
static inline __m128 reduce4(const __m512 acc[4]) {
    __m256 b[4];
    for (int r = 0; r < 4; r++)
        b[r] = _mm256_add_ps(_mm512_castps512_ps256(acc[r]), _mm512_extractf32x8_ps(acc[r], 1));
    return reduce4_256(b);
}
#endif

#endif
