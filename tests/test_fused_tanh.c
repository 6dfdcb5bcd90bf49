/*
 * test_fused_tanh.c - the fused kernel's own tanh (src/kernels/simd.h, softcap's
 * c * tanh(s / c)), on every instruction set this machine runs, against the
 * double-precision tanh of libm, in the manner of tests/test_fused_exp.c.
 *
 * The claim: at most 3 ulp of relative error for every float (checked on an even
 * grid over [-12, 12], which crosses the switch between the polynomial and the exp
 * form at |x| = 0.55, plus a geometric grid of small magnitudes down to 1e-30,
 * where the polynomial must keep the relative accuracy); and the special cases a
 * softcap relies on: tanh(+-0) = +-0, tanh(+-inf) = +-1 exactly, 1 exactly for
 * large arguments (|tanh| never exceeds 1, so a capped score never exceeds c), odd
 * symmetry bit for bit, NaN in, NaN out.
 */
#include "attn.h"
#include "check.h"
#include "sdpa_fused.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Distance in units in the last place of the float nearest to `want`. */
static double ulp_error(float got, double want)
{
    if (want == 0.0)
        return got == 0.0f ? 0.0 : INFINITY;
    int e;
    frexp(want, &e);
    double ulp = ldexp(1.0, e - 24);
    return fabs((double)got - want) / ulp;
}

static void check_kernel(const attn__fused_kernel *k)
{
    enum { N = 240001, M = 4001 };
    float *x = malloc((N + M) * sizeof *x), *y = malloc((N + M) * sizeof *y);
    float *ny = malloc((N + M) * sizeof *ny), *nx = malloc((N + M) * sizeof *nx);
    for (int i = 0; i < N; i++)
        x[i] = (float)(-12.0 + 24.0 * (double)i / (N - 1));
    for (int i = 0; i < M; i++) /* 1e-30 .. 1, both signs */
        x[N + i] = (float)((i % 2 ? -1.0 : 1.0) * pow(10.0, -30.0 + 30.0 * (double)i / (M - 1)));
    k->tanh(x, y, N + M);
    double worst = 0;
    float worst_x = 0;
    int odd = 1, bounded = 1;
    for (int i = 0; i < N + M; i++) {
        double e = ulp_error(y[i], tanh((double)x[i]));
        if (!(e <= worst)) {
            worst = isnan(e) ? INFINITY : e;
            worst_x = x[i];
        }
        nx[i] = -x[i];
        bounded &= fabsf(y[i]) <= 1.0f;
    }
    k->tanh(nx, ny, N + M);
    for (int i = 0; i < N + M; i++)
        odd &= ny[i] == -y[i];
    fprintf(stderr, "  %s: worst %.2f ulp at x = %.9g\n", attn_arch_name(k->arch), worst,
            (double)worst_x);
    CHECK(worst <= 3.0);
    CHECK(odd);
    CHECK(bounded);

    const float special[8] = {0.0f, -0.0f, INFINITY, -INFINITY, 50.0f, -1e30f, NAN, 0.55f};
    float out[8];
    k->tanh(special, out, 8);
    CHECK(out[0] == 0.0f && !signbit(out[0]));
    CHECK(out[1] == 0.0f && signbit(out[1]));
    CHECK(out[2] == 1.0f);
    CHECK(out[3] == -1.0f);
    CHECK(out[4] == 1.0f);
    CHECK(out[5] == -1.0f);
    CHECK(isnan(out[6]));
    CHECK(ulp_error(out[7], tanh(0.55)) <= 3.0);
    free(x), free(y), free(nx), free(ny);
}

int main(void)
{
    TEST("the kernel's tanh is within 3 ulp of libm's, odd, at most 1 in magnitude, "
         "+-1 at +-inf and NaN for NaN, on every path");
    const attn_arch archs[3] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (int a = 0; a < 3; a++)
        if (attn_arch_supported(archs[a]) && attn__fused_kernel_for(archs[a]))
            check_kernel(attn__fused_kernel_for(archs[a]));
    return check_summary("test_fused_tanh");
}
