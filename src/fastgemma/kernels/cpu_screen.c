/* The exact lm_head screen's native steps (kernels/lm_head_screen.py).
 *
 * Selection (screen_select, after an fp32-activation GEMV): given approximate logits a [V],
 * the per-row bound coefficients coef [V] and |h| (hnorm):
 *   err[i] = coef[i] * hnorm + |a[i]| * 2^-19                         (written to err)
 *   f(x)   = the model's output rounding: x itself (fp32 models), or x rounded to bf16 to
 *            nearest even, then looked up in `table` (the softcap at every bf16 number,
 *            indexed by the signed 16-bit pattern + 32768) when table is not NULL;
 *   candidates = { i : f(a[i] + err[i]) >= max_j f(a[j] - err[j]) }, written ascending to idx.
 * With `allowed` (a bitmask [ceil(V / 32)], bit i & 31 of word i >> 5: a structured output's
 * grammar), i and j range over the allowed rows only; NULL allows every row.
 * Returns the number of candidates, or -1 when some a[i] or err[i] is not finite (the caller
 * then takes the full lm_head).
 *
 * screen_u8s8 (AVX-512 VNNI builds) does all three steps for every row of a step with int8
 * activations: one pass over the codes, then a second level only in the blocks the first
 * leaves open; its bound has the activations' term (below).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "bf16.h"
#include "simd.h"

static inline float out_round(float x, int round_bf16, const uint16_t *table) {
    if (!round_bf16) return x;
    uint16_t b = f32_to_bf16(x);
    if (table) b = table[(int32_t)(int16_t)b + 32768];
    return bf16_to_f32(b);
}

static inline int is_allowed(const uint32_t *allowed, int64_t i) {
    return (allowed[i >> 5] >> (i & 31)) & 1u;
}

/* Floats in order as unsigned keys (-inf lowest, -0 just below +0; NaNs beyond the infinities). */
static inline uint32_t float_key(float x) {
    uint32_t u;
    __builtin_memcpy(&u, &x, 4);
    return (u >> 31) ? ~u : (u | 0x80000000u);
}

static inline float key_float(uint32_t k) {
    const uint32_t u = (k >> 31) ? (k & 0x7fffffffu) : ~k;
    float x;
    __builtin_memcpy(&x, &u, 4);
    return x;
}

/* The key of the smallest float x with f(x) >= f(top): f(x) >= f(top) holds exactly for the
 * floats from there on (f is non-decreasing), found by bisection over the keys. */
static uint32_t threshold_key(float top, int round_bf16, const uint16_t *table) {
    const float best = out_round(top, round_bf16, table);
    uint32_t low = float_key(-INFINITY), high = float_key(top);  /* f(key_float(high)) >= best */
    if (out_round(-INFINITY, round_bf16, table) >= best) return low;
    while (high - low > 1) {  /* f(key_float(low)) < best <= f(key_float(high)) */
        const uint32_t mid = low + (high - low) / 2;
        if (out_round(key_float(mid), round_bf16, table) >= best) high = mid;
        else low = mid;
    }
    return high;
}

/* The candidates' pass writes each thread's ids ascending at idx + u * stride (thread u of
 * `used`, found[u] of them); this moves the runs together, in thread order, and returns the count. */
static int64_t join_runs(int64_t *idx, int64_t stride, const int64_t *found, int used) {
    int64_t n = 0;
    for (int u = 0; u < used; u++) {
        __builtin_memmove(idx + n, idx + u * stride, (size_t)found[u] * sizeof(int64_t));
        n += found[u];
    }
    return n;
}

/* f is non-decreasing, so max_j f(lo_j) = f(max_j lo_j), and f(x) >= B is an up-set of the
 * floats: it holds exactly from the smallest x0 with f(x0) >= B on (found by bisection over
 * the float keys, 32 evaluations of f). Each row then costs a float subtraction and a key
 * comparison, not a rounding and a table lookup twice. `use_mask` is a constant at each call
 * below, so the unmasked selection has no per-row test. */
static inline __attribute__((always_inline)) int64_t select_rows(
        const float *a, const float *coef, float hnorm, int64_t V, int round_bf16, const uint16_t *table,
        const int use_mask, const uint32_t *allowed, float *err, int64_t *idx) {
    float top = -INFINITY;  /* max_j a_j - e_j over the allowed rows */
    int bad = 0;
    #pragma omp parallel for schedule(static) reduction(max:top) reduction(|:bad)
    for (int64_t i = 0; i < V; i++) {
        const float e = coef[i] * hnorm + fabsf(a[i]) * 0x1p-19f;
        err[i] = e;
        bad |= !isfinite(e);  /* a non-finite a[i] makes e non-finite too */
        const float lo = a[i] - e;
        if ((!use_mask || is_allowed(allowed, i)) && lo > top) top = lo;
    }
    if (bad) return -1;
    const uint32_t threshold = threshold_key(top, round_bf16, table);  /* candidates: key(a_i + e_i) >= threshold */
    int64_t counts[256], n = 0;
    #pragma omp parallel num_threads(omp_get_max_threads() < 256 ? omp_get_max_threads() : 256)
    {
        const int threads = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t per = (V + threads - 1) / threads, start = t * per, end = start + per < V ? start + per : V;
        int64_t c = 0;
        for (int64_t i = start; i < end; i++)
            if ((!use_mask || is_allowed(allowed, i)) && float_key(a[i] + err[i]) >= threshold) idx[start + c++] = i;
        counts[t] = c;
        #pragma omp barrier
        #pragma omp single
        n = join_runs(idx, per, counts, threads);
    }
    return n;
}

int64_t screen_select(const float *a, const float *coef, float hnorm, int64_t V, int round_bf16, const uint16_t *table,
                      const uint32_t *allowed, float *err, int64_t *idx) {
    if (allowed)
        return select_rows(a, coef, hnorm, V, round_bf16, table, 1, allowed, err, idx);
    return select_rows(a, coef, hnorm, V, round_bf16, table, 0, allowed, err, idx);
}

#if defined(__AVX512VNNI__)
#include <immintrin.h>

/* The int8 lm_head in VNNI order: P [ceil(N / 16), K4, 16, 4] with P[b, k, r, j] = Q[16 b + r,
 * 4 k + j] (K4 = ceil(K / 4); rows and columns past Q's are zero), so that one 64-byte load
 * holds four consecutive weights of 16 rows and one `vpdpbusd` against four broadcast
 * activation bytes adds them to 16 row sums at once: no horizontal sums. Also per row:
 * rowsum[n] = sum_k Q[n, k] (the u8 offset of screen_u8s8, taken back out) and
 * qnorm[n] >= |s[n] Q[n]| (the bound's activation coefficient: an exact integer sum of
 * squares, its root scaled and rounded up to fp32). rowsum and qnorm are [ceil(N / 16) 16]. */
void screen_pack_q8(const int8_t *Q, const float *scale, int64_t N, int64_t K, int8_t *P, int32_t *rowsum,
                    float *qnorm) {
    const int64_t K4 = (K + 3) / 4, blocks = (N + 15) / 16;
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        int8_t *dst = P + b * K4 * 64;
        for (int r = 0; r < 16; r++) {
            const int64_t n = 16 * b + r;
            int64_t sum = 0, sq = 0;
            for (int64_t k = 0; k < 4 * K4; k++) {
                const int8_t q = n < N && k < K ? Q[n * K + k] : 0;
                dst[(k / 4) * 64 + r * 4 + k % 4] = q;
                sum += q;
                sq += (int64_t)q * q;
            }
            rowsum[n] = (int32_t)sum;
            qnorm[n] = n < N ? nextafterf((float)(sqrt((double)sq) * (double)scale[n] * (1.0 + 0x1p-40)), INFINITY) : 0.f;
        }
    }
}

/* Q back from P (the row layout the ready cache stores). */
void screen_unpack_q8(const int8_t *P, int64_t N, int64_t K, int8_t *Q) {
    const int64_t K4 = (K + 3) / 4;
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) Q[n * K + k] = P[((n / 16) * K4 + k / 4) * 64 + (n % 16) * 4 + k % 4];
}

/* One 16-row block of P against NT <= 8 quantised inputs (stride K4 words): four chains per
 * input (k mod 4; integer sums, so the split changes no bits) while they fit in registers,
 * two beyond four inputs, so that a lone input is not bound by the instruction's latency. */
static inline __attribute__((always_inline)) void block_u8s8(const int8_t *w, const uint8_t *xu, int64_t K4, int nt,
                                                             int prefetch, __m512i d[8]) {
    const int chains = nt <= 4 ? 4 : 2;
    __m512i acc[4][8];
    for (int c = 0; c < 4; c++)
        for (int m = 0; m < 8; m++) acc[c][m] = _mm512_setzero_si512();
    const int32_t *x = (const int32_t *)xu;
    int64_t k = 0;
    for (; k + chains <= K4; k += chains) {
        if (prefetch && nt >= 3)  /* every line, into L2, far ahead (simd.h) */
            for (int c = 0; c < chains; c++) _mm_prefetch((const char *)(w + (k + c) * 64) + PREFETCH_FAR_BYTES, _MM_HINT_T1);
        else if (prefetch) {
            _mm_prefetch((const char *)(w + k * 64) + PREFETCH_BYTES, _MM_HINT_T0);
            if (chains == 4) _mm_prefetch((const char *)(w + k * 64) + PREFETCH_BYTES + 128, _MM_HINT_T0);
        }
        for (int c = 0; c < chains; c++) {
            const __m512i wc = _mm512_loadu_si512((const void *)(w + (k + c) * 64));
            for (int m = 0; m < nt; m++) acc[c][m] = _mm512_dpbusd_epi32(acc[c][m], _mm512_set1_epi32(x[m * K4 + k + c]), wc);
        }
    }
    for (; k < K4; k++) {
        const __m512i wc = _mm512_loadu_si512((const void *)(w + k * 64));
        for (int m = 0; m < nt; m++) acc[0][m] = _mm512_dpbusd_epi32(acc[0][m], _mm512_set1_epi32(x[m * K4 + k]), wc);
    }
    for (int m = 0; m < nt; m++)
        d[m] = _mm512_add_epi32(_mm512_add_epi32(acc[0][m], acc[1][m]), _mm512_add_epi32(acc[2][m], acc[3][m]));
}

/* Quantise one input x [K] to two int8 levels, x ~ s1 p1 + s2 p2 (s1 = max|x| / 127, p1 =
 * round(x / s1); s2 = max|x - s1 p1| / 127, p2 = round((x - s1 p1) / s2)), stored as the
 * unsigned bytes p + 128 in u1, u2 [4 K4] (padded with 128: zero after the offset). The bound's
 * activation terms (fp64; infinite for a non-finite x), the 2^-20 parts covering the fp32
 * rounding of a's products and sum:
 *   term[0] = |x - s1 p1| + 2^-20 |s1 p1|                    (one level)
 *   term[1] = |x - s1 p1 - s2 p2| + 2^-20 (|s1 p1| + |s2 p2|)  (both) */
static void quantise_two_levels(const float *x, int64_t K, int64_t K4, uint8_t *u1, uint8_t *u2, float s[2],
                                double term[2]) {
    float amax = 0.f;
    for (int64_t k = 0; k < K; k++) amax = fmaxf(amax, fabsf(x[k]));
    if (!isfinite(amax)) {
        for (int64_t k = 0; k < 4 * K4; k++) u1[k] = u2[k] = 128;
        s[0] = s[1] = 1.f;
        term[0] = term[1] = INFINITY;
        return;
    }
    s[0] = amax > 0.f ? amax / 127.f : 1.f;
    float rmax = 0.f;
    double r1 = 0.0, n1 = 0.0;
    for (int64_t k = 0; k < K; k++) {
        const float p = fminf(fmaxf(nearbyintf(x[k] / s[0]), -127.f), 127.f);
        u1[k] = (uint8_t)((int)p + 128);
        const double r = (double)x[k] - (double)s[0] * p;  /* exact in fp64 */
        rmax = fmaxf(rmax, (float)fabs(r));
        r1 += r * r;
        n1 += (double)s[0] * p * (double)s[0] * p;
    }
    s[1] = rmax > 0.f ? rmax / 127.f : 1.f;
    double r2 = 0.0, n2 = 0.0;
    for (int64_t k = 0; k < K; k++) {
        const double p1 = (double)((int)u1[k] - 128), r = (double)x[k] - (double)s[0] * p1;
        const float p2 = fminf(fmaxf(nearbyintf((float)(r / s[1])), -127.f), 127.f);
        u2[k] = (uint8_t)((int)p2 + 128);
        const double left = r - (double)s[1] * p2;
        r2 += left * left;
        n2 += (double)s[1] * p2 * (double)s[1] * p2;
    }
    for (int64_t k = K; k < 4 * K4; k++) u1[k] = u2[k] = 128;
    term[0] = sqrt(r1) + 0x1p-20 * sqrt(n1);
    term[1] = sqrt(r2) + 0x1p-20 * (sqrt(n1) + sqrt(n2));
}

/* e = coef hnorm + qnorm dnorm + |a| 2^-19 for 16 rows, in the order of select_rows' scalar sum. */
static inline __m512 bound16(__m512 a, __m512 coef, __m512 qnorm, float hnorm, float dnorm) {
    const __m512 abs_a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7fffffff)));
    return _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(coef, _mm512_set1_ps(hnorm)), _mm512_mul_ps(qnorm, _mm512_set1_ps(dnorm))),
                         _mm512_mul_ps(abs_a, _mm512_set1_ps(0x1p-19f)));
}

/* float_key for 16 lanes. */
static inline __m512i keys16(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    return _mm512_xor_si512(u, _mm512_or_si512(_mm512_srai_epi32(u, 31), _mm512_set1_epi32((int)0x80000000u)));
}

/* The rows of block b that grammar mask `allowed` (NULL: all) and the vocabulary (`lanes`) leave. */
static inline __mmask16 allowed16(const uint32_t *allowed, int64_t b, __mmask16 lanes) {
    if (!allowed) return lanes;
    return lanes & (__mmask16)(allowed[b >> 1] >> ((b & 1) * 16));
}

/* 128 rowsum[16 b ..]: the u8 offset's share of 16 rows' integer dots. */
static inline __m512i offset16(const int32_t *rowsum, int64_t b) {
    return _mm512_slli_epi32(_mm512_loadu_si512((const void *)(rowsum + 16 * b)), 7);
}

/* One level's logits for 16 rows: float(d - offset) (s[n] step), both products rounded. */
static inline __m512 level16(__m512i d, __m512i offset, __m512 scale, float step) {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(d, offset)), _mm512_mul_ps(scale, _mm512_set1_ps(step)));
}

static inline __mmask16 block_lanes(int64_t N, int64_t b) {
    return (N - 16 * b) >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (N - 16 * b)) - 1u);
}

/* The whole screen (steps 1-3 of kernels/lm_head_screen.py) for M hidden states, with int8
 * activations (AVX-512 VNNI); P / rowsum as screen_pack_q8 made them. Each input x[m] is
 * quantised to two int8 levels (quantise_two_levels) into xu [2 M, 4 K4] (rows m: level 1,
 * M + m: level 2) and sx [2 M];
 *   d_l[m, n] = sum_k Q[n, k] p_l[m, k] = sum_k Q[n, k] u_l[m, k] - 128 rowsum[n], exact in
 *   int32 (the u8 sums stay below 127 * 255 * K: K must be at most 65536).
 * Two stages, each a valid bound |s[n] Q[n] . x[m] - a| <= qnorm[n] term + u |a| (terms of
 * quantise_two_levels, written to dnorm [M, 2]):
 *   1. every row: a1 = float(d_1) (s[n] sx_1), e1 with term[0] (one level: a wide bound);
 *   2. only in the 16-row blocks where some allowed row can still win under stage 1
 *      (f(a1 + e1) >= f(max a1 - e1)): a2 = a1 + float(d_2) (s[n] sx_2), e2 with term[1].
 * Rows left out at stage 1 stay out (their upper bound is below a lower bound that stage 2
 * can only raise), so the candidates are the rows of those blocks with
 *   f(a2 + e2) >= f(max(max_all a1 - e1, max_blocks a2 - e2)),
 * the bounds e as in screen_select, with the terms (1 + 2^-10) and hnorm[m] rounded to fp32.
 * a and err (when not NULL) [M, N] hold each row's tightest bound (stage 2 where computed);
 * the candidates of row m ascending in idx[m N ..], their count in counts[m] (-1 when some
 * stage-1 err is not finite). allowed: NULL, or M grammar bitmasks (each NULL or
 * [ceil(N / 32)] words). Stage 2 costs a second pass over P's rows only where the first
 * level leaves doubt (a few blocks of 16384 on the embedded model's hidden states, a few
 * thousand for some), so M rows cost one level's products, not two. Up to four inputs, both
 * levels fit stage 1's tile of eight at no extra read of P: stage 1 then forms a2 for every
 * row into `second` [M, N] (scratch) and stage 2 takes it from there (the same bits).
 *
 * Stage 1 is one pass over P: 16-row blocks in memory order, split across cores, each applied
 * to the inputs eight at a time while it sits in L1; a block's a1 and e1 are formed in
 * registers, which keep each thread's max a1 - e1 per input and write each block's largest
 * key(a1 + e1) to blockkey [M, ceil(N / 16)]. */
void screen_u8s8(const int8_t *P, const int32_t *rowsum, const float *scale, const float *coef, const float *qnorm,
                 const float *x, const double *hnorm, int64_t M, int64_t N, int64_t K, int round_bf16,
                 const uint16_t *table, const uint32_t *const *allowed, uint8_t *xu, float *sx, uint32_t *blockkey,
                 float *a, float *err, double *dnorm, int64_t *idx, int64_t *counts, float *second) {
    const int64_t K4 = (K + 3) / 4, blocks = (N + 15) / 16;
    const int both = 2 * M <= 8;  /* both levels fit stage 1's tile: computed there, kept in second [M, N] */
    float hn[M], dn1[M], dn2[M], top[M];
    int bad[M];
    uint32_t first[M], threshold[M];
    for (int64_t m = 0; m < M; m++) {
        quantise_two_levels(x + m * K, K, K4, xu + m * 4 * K4, xu + (M + m) * 4 * K4, sx + 2 * m, dnorm + 2 * m);
        dn1[m] = (float)(dnorm[2 * m] * (1 + 0x1p-10));
        dn2[m] = (float)(dnorm[2 * m + 1] * (1 + 0x1p-10));
        hn[m] = (float)hnorm[m];
        top[m] = -INFINITY;
        bad[m] = !isfinite(dn1[m]) || !isfinite(dn2[m]) || !isfinite(hn[m]);
    }
    #pragma omp parallel
    {
        float lo_max[M];
        int lo_bad[M];
        for (int64_t m = 0; m < M; m++) lo_max[m] = -INFINITY, lo_bad[m] = 0;
        #pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {  /* stage 1 */
            const int8_t *w = P + b * K4 * 64;
            const __mmask16 lanes = block_lanes(N, b);
            const __m512i offset = offset16(rowsum, b);
            const __m512 sc = _mm512_maskz_loadu_ps(lanes, scale + 16 * b);
            const __m512 cf = _mm512_maskz_loadu_ps(lanes, coef + 16 * b), qn = _mm512_maskz_loadu_ps(lanes, qnorm + 16 * b);
            for (int64_t m0 = 0; m0 < M; m0 += 8) {
                const int nt = both ? (int)(2 * M) : (M - m0) < 8 ? (int)(M - m0) : 8;  /* both: rows m, then M + m */
                const uint8_t *xb = xu + m0 * 4 * K4;
                __m512i d[8];
                switch (nt) {  /* constant tile sizes: the chains stay in registers */
                    case 1: block_u8s8(w, xb, K4, 1, m0 == 0, d); break;
                    case 2: block_u8s8(w, xb, K4, 2, m0 == 0, d); break;
                    case 3: block_u8s8(w, xb, K4, 3, m0 == 0, d); break;
                    case 4: block_u8s8(w, xb, K4, 4, m0 == 0, d); break;
                    case 5: block_u8s8(w, xb, K4, 5, m0 == 0, d); break;
                    case 6: block_u8s8(w, xb, K4, 6, m0 == 0, d); break;
                    case 7: block_u8s8(w, xb, K4, 7, m0 == 0, d); break;
                    default: block_u8s8(w, xb, K4, 8, m0 == 0, d); break;
                }
                for (int l = 0; l < (both ? (int)M : nt); l++) {
                    const int64_t m = m0 + l;
                    const __m512 a1 = level16(d[l], offset, sc, sx[2 * m]);
                    if (both)  /* a2 as stage 2 forms it */
                        _mm512_mask_storeu_ps(second + m * N + 16 * b, lanes,
                                              _mm512_add_ps(a1, level16(d[M + l], offset, sc, sx[2 * m + 1])));
                    const __m512 e1 = bound16(a1, cf, qn, hn[m], dn1[m]);
                    _mm512_mask_storeu_ps(a + m * N + 16 * b, lanes, a1);
                    if (err) _mm512_mask_storeu_ps(err + m * N + 16 * b, lanes, e1);
                    lo_bad[m] |= _mm512_mask_fpclass_ps_mask(lanes, e1, 0x99) != 0;  /* NaN or infinite */
                    const __mmask16 ok = allowed16(allowed ? allowed[m] : NULL, b, lanes);
                    lo_max[m] = fmaxf(lo_max[m], _mm512_mask_reduce_max_ps(ok, _mm512_sub_ps(a1, e1)));
                    blockkey[m * blocks + b] = ok ? _mm512_mask_reduce_max_epu32(ok, keys16(_mm512_add_ps(a1, e1))) : 0u;
                }
            }
        }
        #pragma omp critical
        for (int64_t m = 0; m < M; m++) {
            top[m] = fmaxf(top[m], lo_max[m]);
            bad[m] |= lo_bad[m];
        }
        #pragma omp barrier
        #pragma omp single
        for (int64_t m = 0; m < M; m++) first[m] = bad[m] ? 0xffffffffu : threshold_key(top[m], round_bf16, table);
        for (int64_t m = 0; m < M; m++) lo_max[m] = -INFINITY;
        #pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {  /* stage 2, in the blocks stage 1 leaves open */
            const __mmask16 lanes = block_lanes(N, b);
            for (int64_t m = 0; m < M; m++) {
                if (blockkey[m * blocks + b] < first[m]) continue;
                __m512 a2;
                if (both) {
                    a2 = _mm512_maskz_loadu_ps(lanes, second + m * N + 16 * b);
                } else {
                    __m512i d[8];
                    block_u8s8(P + b * K4 * 64, xu + (M + m) * 4 * K4, K4, 1, 0, d);
                    a2 = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, a + m * N + 16 * b),
                                       level16(d[0], offset16(rowsum, b), _mm512_maskz_loadu_ps(lanes, scale + 16 * b),
                                               sx[2 * m + 1]));
                }
                const __m512 e2 = bound16(a2, _mm512_maskz_loadu_ps(lanes, coef + 16 * b),
                                          _mm512_maskz_loadu_ps(lanes, qnorm + 16 * b), hn[m], dn2[m]);
                _mm512_mask_storeu_ps(a + m * N + 16 * b, lanes, a2);
                if (err) _mm512_mask_storeu_ps(err + m * N + 16 * b, lanes, e2);
                const __mmask16 ok = allowed16(allowed ? allowed[m] : NULL, b, lanes);
                lo_max[m] = fmaxf(lo_max[m], _mm512_mask_reduce_max_ps(ok, _mm512_sub_ps(a2, e2)));
            }
        }
        #pragma omp critical
        for (int64_t m = 0; m < M; m++) top[m] = fmaxf(top[m], lo_max[m]);
    }
    for (int64_t m = 0; m < M; m++) threshold[m] = bad[m] ? 0xffffffffu : threshold_key(top[m], round_bf16, table);
    const int threads = omp_get_max_threads() < 64 ? omp_get_max_threads() : 64;
    int64_t found[M][64];
    #pragma omp parallel num_threads(threads)
    {
        const int used = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t per = (blocks + used - 1) / used, start = t * per, end = start + per < blocks ? start + per : blocks;
        for (int64_t m = 0; m < M; m++) {
            int64_t c = 0, *out = idx + m * N + 16 * start;
            const uint32_t *mask = allowed ? allowed[m] : NULL;
            for (int64_t b = start; b < end; b++) {
                if (blockkey[m * blocks + b] < first[m]) continue;  /* stage 2 was computed here */
                const __mmask16 lanes = block_lanes(N, b);
                const __m512 a2 = _mm512_maskz_loadu_ps(lanes, a + m * N + 16 * b);
                const __m512 e2 = bound16(a2, _mm512_maskz_loadu_ps(lanes, coef + 16 * b),
                                          _mm512_maskz_loadu_ps(lanes, qnorm + 16 * b), hn[m], dn2[m]);
                __mmask16 keep = allowed16(mask, b, lanes) &
                                 _mm512_cmpge_epu32_mask(keys16(_mm512_add_ps(a2, e2)), _mm512_set1_epi32((int)threshold[m]));
                for (; keep; keep &= keep - 1) out[c++] = 16 * b + __builtin_ctz(keep);
            }
            found[m][t] = c;
        }
        #pragma omp barrier
        #pragma omp single
        for (int64_t m = 0; m < M; m++) {
            const int64_t n = join_runs(idx + m * N, 16 * per, found[m], used);
            counts[m] = bad[m] ? -1 : n;
        }
    }
}
#endif
