/* Matrix-vector products for batch-1 decode on x86-64 CPUs with AVX-512 or AVX2.
 *
 * y[m, n] = sum_k W[n, k] * x[m, k] for a row-major W [N, K] and M input rows x [M, K]
 * (M = 1: a decode step; M = K + 1: a speculative verification). Decode reads every weight
 * once per token, so these loops are bound by memory bandwidth. Rows are walked in memory
 * order (one long sequential stream per thread, which the hardware prefetcher follows;
 * interleaving several short rows defeats it), four rows per block so that their four sums
 * are reduced together, and OpenMP splits the blocks across cores. Each block is applied to
 * the M inputs in turn while it sits in L1, so M rows cost one pass over W. With three or
 * more inputs a tile (a batched decode step) is bound by its loads and by memory latency,
 * not bandwidth: two rows share each input load (row_dot2_bf16) and the weights are
 * prefetched further ahead into L2 (simd.h), without changing any sum's order.
 *
 * Row invariance: y[m, n] is computed by the same instructions in the same order whatever M
 * is and wherever row m sits, so a verification over K + 1 rows gives each row exactly the
 * bits a one-row decode step gives it (engine/speculative.py relies on this).
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

/* One weight row against nt <= 4 inputs (stride K): for each input the two FMA chains of a
 * lone row (even / odd 32-blocks, then the tail on the odd chain), so an input's sum does
 * not depend on nt; the weights are loaded once for all nt, and the nt x 2 independent
 * chains keep the multi-row product from being latency-bound. */
static inline __attribute__((always_inline)) void row_dot_bf16(const uint16_t *w, const uint16_t *x, int64_t K,
                                                               int64_t K32, __mmask32 tail, int nt, __m512 out[4]) {
    __m512 a0[4], a1[4];
    for (int m = 0; m < 4; m++) a0[m] = a1[m] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= K32; k += 64) {
        if (nt >= 3) {  /* constant per tile size (simd.h) */
            _mm_prefetch((const char *)(w + k) + PREFETCH_FAR_BYTES, _MM_HINT_T1);
            _mm_prefetch((const char *)(w + k) + PREFETCH_FAR_BYTES + 64, _MM_HINT_T1);
        } else {
            _mm_prefetch((const char *)(w + k) + PREFETCH_BYTES, _MM_HINT_T0);
            _mm_prefetch((const char *)(w + k) + PREFETCH_BYTES + 64, _MM_HINT_T0);
        }
        const __m512bh w0 = load_bh(w + k, 0xffffffffu), w1 = load_bh(w + k + 32, 0xffffffffu);
        for (int m = 0; m < nt; m++) {
            a0[m] = _mm512_dpbf16_ps(a0[m], w0, load_bh(x + m * K + k, 0xffffffffu));
            a1[m] = _mm512_dpbf16_ps(a1[m], w1, load_bh(x + m * K + k + 32, 0xffffffffu));
        }
    }
    if (k < K32) {
        const __m512bh w0 = load_bh(w + k, 0xffffffffu);
        for (int m = 0; m < nt; m++) a0[m] = _mm512_dpbf16_ps(a0[m], w0, load_bh(x + m * K + k, 0xffffffffu));
    }
    if (tail) {
        const __m512bh w1 = load_bh(w + K32, tail);
        for (int m = 0; m < nt; m++) a1[m] = _mm512_dpbf16_ps(a1[m], w1, load_bh(x + m * K + K32, tail));
    }
    for (int m = 0; m < nt; m++) out[m] = _mm512_add_ps(a0[m], a1[m]);
}

/* Two adjacent weight rows against nt (3 or 4) inputs: each (row, input) sum with exactly the
 * chains and order of row_dot_bf16, so the bits are the same; each input's block is loaded
 * once for both rows (6 loads per 8 products instead of 10: with several inputs the loop is
 * bound by its loads once the weights arrive in time). */
static inline __attribute__((always_inline)) void row_dot2_bf16(const uint16_t *w, const uint16_t *v, const uint16_t *x,
                                                                int64_t K, int64_t K32, __mmask32 tail, int nt,
                                                                __m512 out_w[4], __m512 out_v[4]) {
    __m512 a0[4], a1[4], b0[4], b1[4];  /* row w: a, row v: b; chains 0 / 1 as row_dot_bf16's */
    for (int m = 0; m < 4; m++) a0[m] = a1[m] = b0[m] = b1[m] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= K32; k += 64) {
        _mm_prefetch((const char *)(w + k) + PREFETCH_FAR_BYTES, _MM_HINT_T1);
        _mm_prefetch((const char *)(w + k) + PREFETCH_FAR_BYTES + 64, _MM_HINT_T1);
        _mm_prefetch((const char *)(v + k) + PREFETCH_FAR_BYTES, _MM_HINT_T1);
        _mm_prefetch((const char *)(v + k) + PREFETCH_FAR_BYTES + 64, _MM_HINT_T1);
        const __m512bh w0 = load_bh(w + k, 0xffffffffu), w1 = load_bh(w + k + 32, 0xffffffffu);
        const __m512bh v0 = load_bh(v + k, 0xffffffffu), v1 = load_bh(v + k + 32, 0xffffffffu);
        for (int m = 0; m < nt; m++) {
            const __m512bh x0 = load_bh(x + m * K + k, 0xffffffffu), x1 = load_bh(x + m * K + k + 32, 0xffffffffu);
            a0[m] = _mm512_dpbf16_ps(a0[m], w0, x0);
            b0[m] = _mm512_dpbf16_ps(b0[m], v0, x0);
            a1[m] = _mm512_dpbf16_ps(a1[m], w1, x1);
            b1[m] = _mm512_dpbf16_ps(b1[m], v1, x1);
        }
    }
    if (k < K32) {
        const __m512bh w0 = load_bh(w + k, 0xffffffffu), v0 = load_bh(v + k, 0xffffffffu);
        for (int m = 0; m < nt; m++) {
            const __m512bh x0 = load_bh(x + m * K + k, 0xffffffffu);
            a0[m] = _mm512_dpbf16_ps(a0[m], w0, x0);
            b0[m] = _mm512_dpbf16_ps(b0[m], v0, x0);
        }
    }
    if (tail) {
        const __m512bh w1 = load_bh(w + K32, tail), v1 = load_bh(v + K32, tail);
        for (int m = 0; m < nt; m++) {
            const __m512bh x1 = load_bh(x + m * K + K32, tail);
            a1[m] = _mm512_dpbf16_ps(a1[m], w1, x1);
            b1[m] = _mm512_dpbf16_ps(b1[m], v1, x1);
        }
    }
    for (int m = 0; m < nt; m++) out_w[m] = _mm512_add_ps(a0[m], a1[m]), out_v[m] = _mm512_add_ps(b0[m], b1[m]);
}

/* out_f32: 1 -> y is float*, 0 -> y is bf16 (uint16_t*) */
void gemv_bf16(const uint16_t *W, const uint16_t *x, void *y, int64_t M, int64_t N, int64_t K, int out_f32) {
    const int64_t K32 = K & ~(int64_t)31;
    const __mmask32 tail = (__mmask32)((1ull << (K - K32)) - 1ull);
    #pragma omp parallel for schedule(static)
    for (int64_t n0 = 0; n0 < N; n0 += 4) {
        const int64_t rows = (N - n0) < 4 ? (N - n0) : 4;
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
            const int nt = (M - m0) < 4 ? (int)(M - m0) : 4;
            __m512 acc[4][4], row[4], next[4];  /* acc[input][weight row] */
            for (int r = 0; r < 4; r++) {
                const uint16_t *w = W + (n0 + r) * K, *xm = x + m0 * K;
                if (nt >= 3 && r + 1 < rows) {  /* two rows at once (the same bits) */
                    if (nt == 3) row_dot2_bf16(w, w + K, xm, K, K32, tail, 3, row, next);
                    else row_dot2_bf16(w, w + K, xm, K, K32, tail, 4, row, next);
                    for (int m = 0; m < nt; m++) acc[m][r] = row[m], acc[m][r + 1] = next[m];
                    r++;
                    continue;
                }
                if (r < rows) switch (nt) {  /* constant tile sizes: the chains stay in registers */
                    case 1: row_dot_bf16(w, xm, K, K32, tail, 1, row); break;
                    case 2: row_dot_bf16(w, xm, K, K32, tail, 2, row); break;
                    case 3: row_dot_bf16(w, xm, K, K32, tail, 3, row); break;
                    default: row_dot_bf16(w, xm, K, K32, tail, 4, row); break;
                }
                for (int m = 0; m < nt; m++) acc[m][r] = r < rows ? row[m] : _mm512_setzero_ps();
            }
            for (int m = 0; m < nt; m++) {
                float s[4];
                _mm_storeu_ps(s, reduce4(acc[m]));
                for (int r = 0; r < rows; r++) {
                    if (out_f32) ((float *)y)[(m0 + m) * N + n0 + r] = s[r];
                    else ((uint16_t *)y)[(m0 + m) * N + n0 + r] = f32_to_bf16(s[r]);
                }
            }
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

void gemv_f32(const float *W, const float *x, float *y, int64_t M, int64_t N, int64_t K) {
    const int64_t K16 = K & ~(int64_t)15;
    const __mmask16 tail = (__mmask16)((1u << (K - K16)) - 1u);
    #pragma omp parallel for schedule(static)
    for (int64_t n0 = 0; n0 < N; n0 += 4) {
        const int64_t rows = (N - n0) < 4 ? (N - n0) : 4;
        for (int64_t m = 0; m < M; m++) {
            __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
            for (int r = 0; r < rows; r++) acc[r] = row_dot_f32(W + (n0 + r) * K, x + m * K, K16, tail);
            float s[4];
            _mm_storeu_ps(s, reduce4(acc));
            for (int r = 0; r < rows; r++) y[m * N + n0 + r] = s[r];
        }
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

void gemv_bf16(const uint16_t *W, const uint16_t *x, void *y, int64_t M, int64_t N, int64_t K, int out_f32) {
    float stack_xf[4096];
    float *xf = M * K <= 4096 ? stack_xf : (float *)malloc(sizeof(float) * (size_t)(M * K)); /* x widened once */
    for (int64_t k = 0; k < M * K; k++) xf[k] = bf16_to_f32(x[k]);
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t m = 0; m < M; m++) {
            const float s = row_dot_bf16_avx2(W + n * K, xf + m * K, K);
            if (out_f32) ((float *)y)[m * N + n] = s;
            else ((uint16_t *)y)[m * N + n] = f32_to_bf16(s);
        }
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

void gemv_f32(const float *W, const float *x, float *y, int64_t M, int64_t N, int64_t K) {
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t m = 0; m < M; m++) y[m * N + n] = row_dot_f32_avx2(W + n * K, x + m * K, K);
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
