/* Weight-only quantised matrix-vector products for batch-1 decode (AVX-512 or AVX2 + FMA).
 *
 * y[m, n] = sum_k W[n, k] * x[m, k] with W stored in fewer bits, for M input rows (as in
 * cpu_gemv.c: one pass over W, and each y[m, n] computed by the same instructions whatever M
 * is); x and the sums are fp32, the weights are widened to fp32 in registers (exactly: they
 * are small integers) and scaled after the integer-weighted sums, so the only rounding is the
 * fp32 summation's. Rows go in blocks of four, in memory order; blocks are split across
 * cores. int8 rows are summed in four independent FMA chains (a lone chain is latency-bound
 * at these short K), 4-bit blocks walk their four rows together.
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
#include "vec.h"

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

/* Sums for one int8 row and NT <= MT input rows (stride K): each input's four FMA chains
 * (the same chains for any NT, so a row's sum does not depend on how many inputs share the
 * pass), the weights widened once per chunk for all NT. acc: [NT] vectors, t: [NT] tails. */
#ifdef __AVX512F__
#define MT 4
#else
#define MT 2
#endif
static inline __attribute__((always_inline)) void dot_q8_rows(const int8_t *w, const float *x, int64_t K, int nt,
                                                              vf acc[MT], float t[MT]) {
    vf a[MT][4];
    for (int m = 0; m < MT; m++) a[m][0] = a[m][1] = a[m][2] = a[m][3] = vzero();
    int64_t k = 0;
    for (; k + 4 * VEC <= K; k += 4 * VEC) {
        _mm_prefetch((const char *)(w + k + PREFETCH_BYTES), _MM_HINT_T0);
        const vf w0 = vcvt(load_i8(w + k)), w1 = vcvt(load_i8(w + k + VEC));
        const vf w2 = vcvt(load_i8(w + k + 2 * VEC)), w3 = vcvt(load_i8(w + k + 3 * VEC));
        for (int m = 0; m < nt; m++) {
            const float *xm = x + m * K + k;
            a[m][0] = vfma(w0, vload(xm), a[m][0]);
            a[m][1] = vfma(w1, vload(xm + VEC), a[m][1]);
            a[m][2] = vfma(w2, vload(xm + 2 * VEC), a[m][2]);
            a[m][3] = vfma(w3, vload(xm + 3 * VEC), a[m][3]);
        }
    }
    for (; k + VEC <= K; k += VEC) {
        const vf w0 = vcvt(load_i8(w + k));
        for (int m = 0; m < nt; m++) a[m][0] = vfma(w0, vload(x + m * K + k), a[m][0]);
    }
    for (int m = 0; m < nt; m++) {
        acc[m] = vadd(vadd(a[m][0], a[m][1]), vadd(a[m][2], a[m][3]));
        t[m] = 0.f;
        for (int64_t j = k; j < K; j++) t[m] += (float)w[j] * x[m * K + j];
    }
}

void gemv_q8(const int8_t *W, const float *scale, const float *x, void *y, int64_t M, int64_t N, int64_t K,
             int out_f32) {
    #pragma omp parallel for schedule(static)
    for (int64_t n0 = 0; n0 < N; n0 += 4) {
        const int rows = (N - n0) < 4 ? (int)(N - n0) : 4;
        for (int64_t m0 = 0; m0 < M; m0 += MT) {
            const int nt = (M - m0) < MT ? (int)(M - m0) : MT;
            vf acc[MT][4];
            float t[MT][4], part[MT];
            vf row_acc[MT];
            for (int r = 0; r < 4; r++) {
                const int8_t *w = W + (n0 + r) * K;
                const float *xm = x + m0 * K;
                if (r < rows) switch (nt) {  /* constant tile sizes: the chains stay in registers */
                    case 1: dot_q8_rows(w, xm, K, 1, row_acc, part); break;
#if MT > 2
                    case 2: dot_q8_rows(w, xm, K, 2, row_acc, part); break;
                    case 3: dot_q8_rows(w, xm, K, 3, row_acc, part); break;
#endif
                    default: dot_q8_rows(w, xm, K, MT, row_acc, part); break;
                }
                for (int m = 0; m < nt; m++) {
                    acc[m][r] = r < rows ? row_acc[m] : vzero();
                    t[m][r] = r < rows ? part[m] : 0.f;
                }
            }
            for (int m = 0; m < nt; m++) {
                float s[4];
                _mm_storeu_ps(s, vreduce4(acc[m]));
                for (int r = 0; r < rows; r++) s[r] = (s[r] + t[m][r]) * scale[n0 + r];
                store_rows((char *)y + (m0 + m) * N * (out_f32 ? 4 : 2), n0, rows, s, out_f32);
            }
        }
    }
}

void gemv_q4(const uint8_t *W, const float *scales, const float *xs, void *y, int64_t M, int64_t N, int64_t K,
             int64_t G, int out_f32) {
    const int64_t groups = K / G;
    const vi low4 = vset1_i(0x0f), eight = vset1_i(8);
    #pragma omp parallel for schedule(static) collapse(2)
    for (int64_t n0 = 0; n0 < N; n0 += 4) {
      for (int64_t m = 0; m < M; m++) {
        const float *x = xs + m * K;
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
        store_rows((char *)y + m * N * (out_f32 ? 4 : 2), n0, rows, s, out_f32);
      }
    }
}
