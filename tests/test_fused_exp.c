/*
 * test_fused_exp.c - the fused kernel's own e^x (src/kernels/simd.h), on every instruction
 * set this machine runs, against the double-precision exp of libm.
 *
 * The kernel only ever takes e^x of x <= 0 (a score minus the running max), so the
 * claim covers x in [-87.33, 0]: at most 2 ulp of relative error (the Taylor
 * polynomial to degree 7 and the Cody-Waite reduction leave about 1.5), and the
 * special cases a softmax relies on: e^0 = 1 exactly (the maximum's own weight),
 * e^-inf = 0 exactly (a masked score), 0 below the smallest normal float (no
 * denormals), and NaN in, NaN out (a NaN score makes its row NaN).
 */
#include "attn.h"
#include "check.h"
#include "sdpa_fused.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Distance in units in the last place of the float nearest to `want`. */
static double ulp_error(float got, double want)
{
    int e;
    frexp(want, &e);
    double ulp = ldexp(1.0, e - 24); /* 2^(e-1) * 2^-23 */
    return fabs((double)got - want) / ulp;
}

static void check_kernel(const attn__fused_kernel *k)
{
    enum { N = 200003 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    /* An even grid over [-87.33, 0], plus an odd count so the tail path runs. */
    for (int i = 0; i < N; i++)
        x[i] = (float)(-87.33 * (double)i / (N - 1));
    k->exp_nonpos(x, y, N);
    double worst = 0;
    float worst_x = 0;
    for (int i = 0; i < N; i++) {
        double e = ulp_error(y[i], exp((double)x[i]));
        if (!(e <= worst)) {
            worst = isnan(e) ? INFINITY : e;
            worst_x = x[i];
        }
    }
    fprintf(stderr, "  %s: worst %.2f ulp at x = %.9g\n", attn_arch_name(k->arch), worst,
            (double)worst_x);
    CHECK(worst <= 2.0);

    const float special[6] = {0.0f, -0.0f, -INFINITY, -88.0f, -1000.0f, NAN};
    float out[6];
    k->exp_nonpos(special, out, 6);
    CHECK(out[0] == 1.0f);
    CHECK(out[1] == 1.0f);
    CHECK(out[2] == 0.0f && !signbit(out[2]));
    CHECK(out[3] == 0.0f);
    CHECK(out[4] == 0.0f);
    CHECK(isnan(out[5]));
    /* Results are normal floats or exactly 0: no denormals from the kernel. */
    int normal = 1;
    for (int i = 0; i < N; i++)
        normal &= y[i] == 0.0f || y[i] >= FLT_MIN;
    CHECK(normal);
    free(x);
    free(y);
}

int main(void)
{
    TEST("the kernel's e^x is within 2 ulp on [-87.33, 0], exactly 1 at 0 and 0 at -inf, "
         "0 below the normal range, NaN for NaN, on every path");
    const attn_arch archs[3] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (int a = 0; a < 3; a++)
        if (attn_arch_supported(archs[a]) && attn__fused_kernel_for(archs[a]))
            check_kernel(attn__fused_kernel_for(archs[a]));
    return check_summary("test_fused_exp");
}
