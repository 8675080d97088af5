/* Weight-only quantised matrix-vector products for batch-1 decode (AVX-512 or AVX2 + FMA).
 *
 * y[n] = sum_k W[n, k] * x[k] with W stored in fewer bits; x and the sums are fp32, the
 * weights are widened to fp32 in registers (exactly: they are small integers) and scaled
 * after the integer-weighted sums, so the only rounding is the fp32 summation's. Rows go in
 * blocks of four, walked together (four independent FMA chains: a lone row's chain is
 * latency-bound at these short K) and in memory order; blocks are split across cores.
 * VEC lanes per vector: 16 in the AVX-512 build, 8 in the AVX2 one.
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

#ifdef __AVX512F__
#define VEC 16
typedef __m512 vf;
typedef __m512i vi;
#define vzero _mm512_setzero_ps
#define _add _mm512_add_ps
#define vload _mm512_loadu_ps
#define vfma _mm512_fmadd_ps
#define vset1 _mm512_set1_ps
#define vcvt _mm512_cvtepi32_ps
#define vand_i _mm512_and_si512
#define vsub_i _mm512_sub_epi32
#define vsrl_i _mm512_srli_epi32
#define vset1_i _mm512_set1_epi32
static inline vi load_i8(const int8_t *p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline vi load_u8(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline __m128 vreduce4(const vf acc[4]) { return reduce4(acc); }
#else
#define VEC 8
typedef __m256 vf;
typedef __m256i vi;
#define vzero _mm256_setzero_ps
#define _add _mm256_add_ps
#define vload _mm256_loadu_ps
#define vfma _mm256_fmadd_ps
#define vset1 _mm256_set1_ps
#define vcvt _mm256_cvtepi32_ps
#define vand_i _mm256_and_si256
#define vsub_i _mm256_sub_epi32
#define vsrl_i _mm256_srli_epi32
#define vset1_i _mm256_set1_epi32
static inline vi load_i8(const int8_t *p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline vi load_u8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline __m128 vreduce4(const vf acc[4]) { return reduce4_256(acc); }
#endif

static inline void store_rows(void *y, int64_t n0, int rows, const float s[4], int out_f32) {
    for (int r = 0; r < rows; r++) {
        if (out_f32) ((float *)y)[n0 + r] = s[r];
        else ((uint16_t *)y)[n0 + r] = f32_to_bf16(s[r]);
    }
}

/* The block's row pointers; a short last block repeats its first row (computed, not stored). */
static inline void block_rows(const uint8_t *base, int64_t n0, int rows, int64_t row_bytes, const uint8_t *p[4]) {
    for (int r = 0; r < 4; r++) p[r] = base + (n0 + (r < rows ? r : 0)) * row_bytes;
}

void gemv_q8(const int8_t *W, const float *scale, const float *x, void *y, int64_t N, int64_t K, int out_f32) {
    #pragma omp parallel for schedule(static)
    for (int64_t n0 = 0; n0 < N; n0 += 4) {
        const int rows = (N - n0) < 4 ? (int)(N - n0) : 4;
        vf acc[4];
        float s[4], t[4];
        for (int r = 0; r < rows; r++) {
            const int8_t *w = W + (n0 + r) * K;
            vf a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
            int64_t k = 0;
            for (; k + 4 * VEC <= K; k += 4 * VEC) {
                _mm_prefetch((const char *)(w + k + PREFETCH_BYTES), _MM_HINT_T0);
                a0 = vfma(vcvt(load_i8(w + k)), vload(x + k), a0);
                a1 = vfma(vcvt(load_i8(w + k + VEC)), vload(x + k + VEC), a1);
                a2 = vfma(vcvt(load_i8(w + k + 2 * VEC)), vload(x + k + 2 * VEC), a2);
                a3 = vfma(vcvt(load_i8(w + k + 3 * VEC)), vload(x + k + 3 * VEC), a3);
            }
            for (; k + VEC <= K; k += VEC) a0 = vfma(vcvt(load_i8(w + k)), vload(x + k), a0);
            acc[r] = _add(_add(a0, a1), _add(a2, a3));
            t[r] = 0.f;
            for (; k < K; k++) t[r] += (float)w[k] * x[k];
        }
        for (int r = rows; r < 4; r++) acc[r] = vzero();
        _mm_storeu_ps(s, vreduce4(acc));
        for (int r = 0; r < rows; r++) s[r] = (s[r] + t[r]) * scale[n0 + r];
        store_rows(y, n0, rows, s, out_f32);
    }
}

void gemv_q4(const uint8_t *W, const float *scales, const float *x, void *y, int64_t N, int64_t K, int64_t G,
             int out_f32) {
    const int64_t groups = K / G;
    const vi low4 = vset1_i(0x0f), eight = vset1_i(8);
    #pragma omp parallel for schedule(static)
    for (int64_t n0 = 0; n0 < N; n0 += 4) {
        const int rows = (N - n0) < 4 ? (int)(N - n0) : 4;
        const uint8_t *p[4];
        block_rows(W, n0, rows, K / 2, p);
        const float *d[4];
        for (int r = 0; r < 4; r++) d[r] = scales + (n0 + (r < rows ? r : 0)) * groups;
        vf acc[4] = {vzero(), vzero(), vzero(), vzero()};
        for (int64_t g = 0; g < groups; g++) {
            vf gs[4] = {vzero(), vzero(), vzero(), vzero()};
            for (int64_t b = g * G; b < (g + 1) * G; b += 32) {
                if (b % 128 == 0) /* once per cache line of each row */
                    for (int r = 0; r < 4; r++) _mm_prefetch((const char *)(p[r] + b / 2 + PREFETCH_BYTES), _MM_HINT_T0);
                for (int c = 0; c < 16; c += VEC) { /* bytes c.. of the block: weights b+c.. and b+16+c.. */
                    const vf xlo = vload(x + b + c), xhi = vload(x + b + 16 + c);
                    for (int r = 0; r < 4; r++) {
                        const vi v = load_u8(p[r] + b / 2 + c);
                        gs[r] = vfma(vcvt(vsub_i(vand_i(v, low4), eight)), xlo, gs[r]);
                        gs[r] = vfma(vcvt(vsub_i(vsrl_i(v, 4), eight)), xhi, gs[r]);
                    }
                }
            }
            for (int r = 0; r < 4; r++) acc[r] = vfma(gs[r], vset1(d[r][g]), acc[r]);
        }
        float s[4];
        _mm_storeu_ps(s, vreduce4(acc));
        store_rows(y, n0, rows, s, out_f32);
    }
}
