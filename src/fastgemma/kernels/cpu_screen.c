/* The exact lm_head screen's selection step (kernels/lm_head_screen.py), in one pass pair
 * over the vocabulary instead of a dozen full-width torch ops.
 *
 * Given approximate logits a [V] (the int8 screen's fp32 GEMV), the per-row bound
 * coefficients coef [V] and |h| (hnorm):
 *   err[i] = coef[i] * hnorm + |a[i]| * 2^-20                      (written to err)
 *   f(x)   = the model's output rounding: x itself (fp32 models), or x rounded to bf16 to
 *            nearest even, then looked up in `table` (the softcap at every bf16 number,
 *            indexed by the signed 16-bit pattern + 32768) when table is not NULL;
 *   candidates = { i : f(a[i] + err[i]) >= max_j f(a[j] - err[j]) }, written ascending to idx.
 * With `allowed` (a bitmask [ceil(V / 32)], bit i & 31 of word i >> 5: a structured output's
 * grammar), i and j range over the allowed rows only; NULL allows every row.
 * keep [V] is scratch. Returns the number of candidates, or -1 when some a[i] or err[i] is
 * not finite (the caller then takes the full lm_head).
 */
#include <math.h>
#include <stdint.h>

#include "bf16.h"

static inline float out_round(float x, int round_bf16, const uint16_t *table) {
    if (!round_bf16) return x;
    uint16_t b = f32_to_bf16(x);
    if (table) b = table[(int32_t)(int16_t)b + 32768];
    return bf16_to_f32(b);
}

static inline int is_allowed(const uint32_t *allowed, int64_t i) {
    return (allowed[i >> 5] >> (i & 31)) & 1u;
}

/* `use_mask` is a constant at each call below, so the unmasked selection compiles to the
 * loops it had before masks existed (no per-row test on the plain greedy path). */
static inline __attribute__((always_inline)) int64_t select_rows(
        const float *a, const float *coef, float hnorm, int64_t V, int round_bf16, const uint16_t *table,
        const int use_mask, const uint32_t *allowed, float *err, uint8_t *keep, int64_t *idx) {
    float best = -INFINITY;
    int bad = 0;
    #pragma omp parallel for schedule(static) reduction(max:best) reduction(|:bad)
    for (int64_t i = 0; i < V; i++) {
        const float e = coef[i] * hnorm + fabsf(a[i]) * 0x1p-20f;
        err[i] = e;
        bad |= !isfinite(e);  /* a non-finite a[i] makes e non-finite too */
        if (use_mask && !is_allowed(allowed, i)) continue;
        const float lo = out_round(a[i] - e, round_bf16, table);
        if (lo > best) best = lo;
    }
    if (bad) return -1;
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < V; i++)
        keep[i] = (!use_mask || is_allowed(allowed, i)) && out_round(a[i] + err[i], round_bf16, table) >= best;
    int64_t n = 0;
    for (int64_t i = 0; i < V; i++)
        if (keep[i]) idx[n++] = i;
    return n;
}

int64_t screen_select(const float *a, const float *coef, float hnorm, int64_t V, int round_bf16,
                      const uint16_t *table, const uint32_t *allowed, float *err, uint8_t *keep, int64_t *idx) {
    if (allowed)
        return select_rows(a, coef, hnorm, V, round_bf16, table, 1, allowed, err, keep, idx);
    return select_rows(a, coef, hnorm, V, round_bf16, table, 0, allowed, err, keep, idx);
}
