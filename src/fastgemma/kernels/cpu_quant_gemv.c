/* Weight-only quantised matrix-vector products for batch-1 decode (AVX2 + FMA).
 *
 * y[n] = sum_k W[n, k] * x[k] with W stored in fewer bits; x and the sums are fp32, the
 * weights are widened to fp32 in registers (exactly: they are small integers) and scaled
 * after the integer-weighted sums, so the only rounding is the fp32 summation's. Rows are
 * walked in memory order, four per block, blocks split across cores (as cpu_gemv.c).
 * The same code is built into the AVX2 and the AVX-512 library: the products are bound
 * by reading the codes, and 8-wide widening keeps up with memory on either.
 *
 * - gemv_q8: int8 W [N, K], one fp32 scale per row:    y[n] = s[n] * sum_k q[n,k] x[k].
 * - gemv_q4: 4-bit W, one fp32 scale per group of G consecutive k (G a multiple of 32):
 *            y[n] = sum_g d[n,g] * sum_{k in g} (u[n,k] - 8) x[k], u in [0, 15].
 *   Packing: each 32-weight block is 16 bytes; byte j holds weight j in its low nibble and
 *   weight j + 16 in its high nibble. Requires K % G == 0.
 * y is fp32 (out_f32 = 1) or bf16 rounded to nearest even (out_f32 = 0).
 */
#include <immintrin.h>
#include <stdint.h>

#include "bf16.h"
#include "simd.h"

/* sum_k q[k] x[k] over one int8 row: 16 per step in two accumulators, scalar tail. */
static inline __m256 row_dot_q8(const int8_t *w, const float *x, int64_t K, float *tail_sum) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        const __m128i q = _mm_loadu_si128((const __m128i *)(w + k));
        a0 = _mm256_fmadd_ps(widen_i8x8(q), _mm256_loadu_ps(x + k), a0);
        a1 = _mm256_fmadd_ps(widen_i8x8(_mm_srli_si128(q, 8)), _mm256_loadu_ps(x + k + 8), a1);
    }
    float t = 0.f;
    for (; k < K; k++) t += (float)w[k] * x[k];
    *tail_sum = t;
    return _mm256_add_ps(a0, a1);
}

static inline void store_rows(void *y, int64_t n0, int rows, const float s[4], int out_f32) {
    for (int r = 0; r < rows; r++) {
        if (out_f32) ((float *)y)[n0 + r] = s[r];
        else ((uint16_t *)y)[n0 + r] = f32_to_bf16(s[r]);
    }
}

void gemv_q8(const int8_t *W, const float *scale, const float *x, void *y, int64_t N, int64_t K, int out_f32) {
    #pragma omp parallel for schedule(static)
    for (int64_t n0 = 0; n0 < N; n0 += 4) {
        const int rows = (N - n0) < 4 ? (int)(N - n0) : 4;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        float tail[4] = {0.f, 0.f, 0.f, 0.f};
        for (int r = 0; r < rows; r++) acc[r] = row_dot_q8(W + (n0 + r) * K, x, K, &tail[r]);
        float s[4];
        _mm_storeu_ps(s, reduce4_256(acc));
        for (int r = 0; r < rows; r++) s[r] = (s[r] + tail[r]) * scale[n0 + r];
        store_rows(y, n0, rows, s, out_f32);
    }
}

/* sum_g d[g] * sum_{k in g} (u[k] - 8) x[k] over one packed 4-bit row. */
static inline __m256 row_dot_q4(const uint8_t *w, const float *d, const float *x, int64_t K, int64_t G) {
    const __m128i low4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t g = 0; g < K; g += G) {
        __m256 lo_sum = _mm256_setzero_ps(), hi_sum = _mm256_setzero_ps();
        for (int64_t b = g; b < g + G; b += 32) {
            const __m128i bytes = _mm_loadu_si128((const __m128i *)(w + b / 2));
            const __m128i lo = _mm_sub_epi8(_mm_and_si128(bytes, low4), eight);                    /* weights b..b+15 */
            const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), low4), eight); /* b+16..b+31 */
            lo_sum = _mm256_fmadd_ps(widen_i8x8(lo), _mm256_loadu_ps(x + b), lo_sum);
            lo_sum = _mm256_fmadd_ps(widen_i8x8(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + b + 8), lo_sum);
            hi_sum = _mm256_fmadd_ps(widen_i8x8(hi), _mm256_loadu_ps(x + b + 16), hi_sum);
            hi_sum = _mm256_fmadd_ps(widen_i8x8(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + b + 24), hi_sum);
        }
        acc = _mm256_fmadd_ps(_mm256_add_ps(lo_sum, hi_sum), _mm256_set1_ps(d[g / G]), acc);
    }
    return acc;
}

void gemv_q4(const uint8_t *W, const float *scales, const float *x, void *y, int64_t N, int64_t K, int64_t G,
             int out_f32) {
    const int64_t groups = K / G;
    #pragma omp parallel for schedule(static)
    for (int64_t n0 = 0; n0 < N; n0 += 4) {
        const int rows = (N - n0) < 4 ? (int)(N - n0) : 4;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int r = 0; r < rows; r++) acc[r] = row_dot_q4(W + (n0 + r) * (K / 2), scales + (n0 + r) * groups, x, K, G);
        float s[4];
        _mm_storeu_ps(s, reduce4_256(acc));
        store_rows(y, n0, rows, s, out_f32);
    }
}
