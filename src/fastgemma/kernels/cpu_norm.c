/* RMSNorm rows (plain C, vectorised by the compiler), replacing eight small torch ops, and
 * fp32 GELU for decode rows. A row's result depends on that row only (a prompt's rows are
 * split over the threads).
 *
 * y = x * rsqrt(mean(x^2) + eps) * scale   (scale optional; statistics and products in fp32,
 * y rounded to x's dtype), for `rows` contiguous rows of D values. Same maths as
 * models/layers.py RMSNorm; the sum of squares is accumulated in another order than torch's.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "bf16.h"

#define NORM_PARALLEL_MIN 32768  /* values in a call from which the rows are split over the threads */
#define DEFINE_NORM(NAME, T, TO_F32, FROM_F32)                                                  \
void NAME(const T *x, const float *scale, T *y, int64_t rows, int64_t D, float eps) {          \
    _Pragma("omp parallel for schedule(static) if (rows * D >= NORM_PARALLEL_MIN)")             \
    for (int64_t r = 0; r < rows; r++) {                                                        \
        const T *xr = x + r * D;                                                                \
        T *yr = y + r * D;                                                                      \
        float ss = 0.f;                                                                         \
        for (int64_t d = 0; d < D; d++) { float v = TO_F32(xr[d]); ss += v * v; }              \
        const float inv = 1.f / sqrtf(ss / (float)D + eps);                                     \
        if (scale) for (int64_t d = 0; d < D; d++) yr[d] = FROM_F32((TO_F32(xr[d]) * inv) * scale[d]); \
        else for (int64_t d = 0; d < D; d++) yr[d] = FROM_F32(TO_F32(xr[d]) * inv);             \
    }                                                                                           \
}

#define ID(v) (v)
DEFINE_NORM(rms_norm_f32, float, ID, ID)
DEFINE_NORM(rms_norm_bf16, uint16_t, bf16_to_f32, f32_to_bf16)

/* GELU (tanh approximation) of n fp32 values, each by the same scalar code (libm's tanhf; not
 * vectorised without -ffast-math), so a value's result depends on the value only: torch's
 * vectorised and scalar tails differ in the last bit, and where a value falls depends on how
 * many rows share the call (kernels/activation.py). */
void gelu_tanh_f32(const float *x, float *y, int64_t n) {
    const float beta = 0.7978845608028654f, kappa = 0.044715f;  /* sqrt(2 / pi) */
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(beta * (v + kappa * v * v * v)));
    }
}
