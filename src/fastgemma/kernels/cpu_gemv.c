/* Matrix-vector products for batch-1 decode on x86-64 CPUs with AVX-512 or AVX2.
 *
 * y[n] = sum_k W[n, k] * x[k] for a row-major W [N, K]. Decode reads every weight once per
 * token, so these loops are bound by memory bandwidth. Rows are walked in memory order (one
 * long sequential stream per thread, which the hardware prefetcher follows; interleaving
 * several short rows defeats it), four rows per block so that their four sums are reduced
 * together, and OpenMP splits the blocks across cores.
 *
 * - gemv_bf16: W and x bf16, `vdpbf16ps` products (exact in fp32) summed in fp32; y rounded
 *   to bf16 (nearest-even, as torch rounds) or kept in fp32.
 * - gemv_f32: W and x fp32, fused multiply-add in fp32.
 * Any K is allowed: the tail of a row is handled with masked loads.
 *
 * Built for AVX-512 BF16 (the code below) or for AVX2 + FMA (the second half: bf16 widened to
 * fp32 exactly, products exact, FMA sums; row tails summed in scalar). The two round their
 * sums differently; one process uses one build for every path, plain and fast.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"
#include "simd.h"

#if defined(__AVX512BF16__)

static inline __m512bh load_bh(const uint16_t *p, __mmask32 m) {
    return (__m512bh)_mm512_maskz_loadu_epi16(m, p);
}

static inline __m512 row_dot_bf16(const uint16_t *w, const uint16_t *x, int64_t K32, __mmask32 tail) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= K32; k += 64) {
        _mm_prefetch((const char *)(w + k) + PREFETCH_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)(w + k) + PREFETCH_BYTES + 64, _MM_HINT_T0);
        a0 = _mm512_dpbf16_ps(a0, load_bh(w + k, 0xffffffffu), load_bh(x + k, 0xffffffffu));
        a1 = _mm512_dpbf16_ps(a1, load_bh(w + k + 32, 0xffffffffu), load_bh(x + k + 32, 0xffffffffu));
    }
    if (k < K32) a0 = _mm512_dpbf16_ps(a0, load_bh(w + k, 0xffffffffu), load_bh(x + k, 0xffffffffu));
    if (tail) a1 = _mm512_dpbf16_ps(a1, load_bh(w + K32, tail), load_bh(x + K32, tail));
    return _mm512_add_ps(a0, a1);
}

/* out_f32: 1 -> y is float*, 0 -> y is bf16 (uint16_t*) */
void gemv_bf16(const uint16_t *W, const uint16_t *x, void *y, int64_t N, int64_t K, int out_f32) {
    const int64_t K32 = K & ~(int64_t)31;
    const __mmask32 tail = (__mmask32)((1ull << (K - K32)) - 1ull);
    #pragma omp parallel for schedule(static)
    for (int64_t n0 = 0; n0 < N; n0 += 4) {
        const int64_t rows = (N - n0) < 4 ? (N - n0) : 4;
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int r = 0; r < rows; r++) acc[r] = row_dot_bf16(W + (n0 + r) * K, x, K32, tail);
        float s[4];
        _mm_storeu_ps(s, reduce4(acc));
        for (int r = 0; r < rows; r++) {
            if (out_f32) ((float *)y)[n0 + r] = s[r];
            else ((uint16_t *)y)[n0 + r] = f32_to_bf16(s[r]);
        }
    }
}

static inline __m512 row_dot_f32(const float *w, const float *x, int64_t K16, __mmask16 tail) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K16; k += 32) {
        _mm_prefetch((const char *)(w + k) + PREFETCH_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)(w + k) + PREFETCH_BYTES + 64, _MM_HINT_T0);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 16), _mm512_loadu_ps(x + k + 16), a1);
    }
    if (k < K16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a0);
    if (tail) a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w + K16), _mm512_maskz_loadu_ps(tail, x + K16), a1);
    return _mm512_add_ps(a0, a1);
}

void gemv_f32(const float *W, const float *x, float *y, int64_t N, int64_t K) {
    const int64_t K16 = K & ~(int64_t)15;
    const __mmask16 tail = (__mmask16)((1u << (K - K16)) - 1u);
    #pragma omp parallel for schedule(static)
    for (int64_t n0 = 0; n0 < N; n0 += 4) {
        const int64_t rows = (N - n0) < 4 ? (N - n0) : 4;
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int r = 0; r < rows; r++) acc[r] = row_dot_f32(W + (n0 + r) * K, x, K16, tail);
        float s[4];
        _mm_storeu_ps(s, reduce4(acc));
        for (int r = 0; r < rows; r++) y[n0 + r] = s[r];
    }
}

/* Sum of a[0..n) (n a multiple of 64): a pure streaming read, the bandwidth probe of
 * `fastgemma bench` — the same access pattern and threads as the GEMVs above. */
float stream_read_f32(const float *a, int64_t n) {
    float total = 0.f;
    #pragma omp parallel reduction(+:total)
    {
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i += 64) {
            s0 = _mm512_add_ps(s0, _mm512_loadu_ps(a + i));
            s1 = _mm512_add_ps(s1, _mm512_loadu_ps(a + i + 16));
            s2 = _mm512_add_ps(s2, _mm512_loadu_ps(a + i + 32));
            s3 = _mm512_add_ps(s3, _mm512_loadu_ps(a + i + 48));
        }
        total += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
    }
    return total;
}

#else /* AVX2 + FMA */

static inline float row_dot_bf16_avx2(const uint16_t *w, const float *x, int64_t K) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        if (k % 32 == 0) _mm_prefetch((const char *)(w + k) + PREFETCH_BYTES, _MM_HINT_T0);
        a0 = _mm256_fmadd_ps(widen_bf16x8(w + k), _mm256_loadu_ps(x + k), a0);
        a1 = _mm256_fmadd_ps(widen_bf16x8(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
    }
    if (k + 8 <= K) { a0 = _mm256_fmadd_ps(widen_bf16x8(w + k), _mm256_loadu_ps(x + k), a0); k += 8; }
    __m256 a = _mm256_add_ps(a0, a1);
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    r = _mm_hadd_ps(r, r);
    r = _mm_hadd_ps(r, r);
    float s = _mm_cvtss_f32(r);
    for (; k < K; k++) s = fmaf(bf16_to_f32(w[k]), x[k], s);
    return s;
}

void gemv_bf16(const uint16_t *W, const uint16_t *x, void *y, int64_t N, int64_t K, int out_f32) {
    float stack_xf[4096];
    float *xf = K <= 4096 ? stack_xf : (float *)malloc(sizeof(float) * (size_t)K); /* x widened once */
    for (int64_t k = 0; k < K; k++) xf[k] = bf16_to_f32(x[k]);
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float s = row_dot_bf16_avx2(W + n * K, xf, K);
        if (out_f32) ((float *)y)[n] = s;
        else ((uint16_t *)y)[n] = f32_to_bf16(s);
    }
    if (xf != stack_xf) free(xf);
}

static inline float row_dot_f32_avx2(const float *w, const float *x, int64_t K) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        _mm_prefetch((const char *)(w + k) + PREFETCH_BYTES, _MM_HINT_T0);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
    }
    if (k + 8 <= K) { a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0); k += 8; }
    __m256 a = _mm256_add_ps(a0, a1);
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    r = _mm_hadd_ps(r, r);
    r = _mm_hadd_ps(r, r);
    float s = _mm_cvtss_f32(r);
    for (; k < K; k++) s = fmaf(w[k], x[k], s);
    return s;
}

void gemv_f32(const float *W, const float *x, float *y, int64_t N, int64_t K) {
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) y[n] = row_dot_f32_avx2(W + n * K, x, K);
}

/* Sum of a[0..n) (n a multiple of 64): a pure streaming read, the bandwidth probe of
 * `fastgemma bench` — the same access pattern and threads as the GEMVs above. */
float stream_read_f32(const float *a, int64_t n) {
    float total = 0.f;
    #pragma omp parallel reduction(+:total)
    {
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i += 32) {
            s0 = _mm256_add_ps(s0, _mm256_loadu_ps(a + i));
            s1 = _mm256_add_ps(s1, _mm256_loadu_ps(a + i + 8));
            s2 = _mm256_add_ps(s2, _mm256_loadu_ps(a + i + 16));
            s3 = _mm256_add_ps(s3, _mm256_loadu_ps(a + i + 24));
        }
        float part[8];
        _mm256_storeu_ps(part, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
        for (int k = 0; k < 8; k++) total += part[k];
    }
    return total;
}

#endif
