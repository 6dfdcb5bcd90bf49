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
 *
 * The same for its 2^x (the softmax's exp when scores are kept in base-2 units), on
 * [-126, 0]: 2 ulp (the degree-6 minimax polynomial leaves about 1.5), 2^0 = 1,
 * 2^-k exactly a power of two, 0 below -126 and at -inf, NaN for NaN; and, where
 * the CPU has AVX-512, the AVX2 path's bits equal the AVX-512 path's on every
 * input (the tile paths' same-bits claim between the two rests on it).
 */
#include "attn.h"
#include "check.h"
#include "sdpa_fused.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* 2^x on an even grid over [-126, 0] (an odd count, so the tail path runs), and
 * the integers -126 .. 0, where the answer is an exact power of two. */
enum { N2 = 400009 };
static float *grid2(void)
{
    float *x = malloc(N2 * sizeof *x);
    for (int i = 0; i < N2; i++)
        x[i] = (float)(-126.0 * (double)i / (N2 - 1));
    return x;
}

static void check_kernel_exp2(const attn__fused_kernel *k)
{
    float *x = grid2(), *y = malloc(N2 * sizeof *y);
    k->exp2_nonpos(x, y, N2);
    double worst = 0;
    float worst_x = 0;
    int normal = 1;
    for (int i = 0; i < N2; i++) {
        double e = ulp_error(y[i], exp2((double)x[i]));
        if (!(e <= worst)) {
            worst = isnan(e) ? INFINITY : e;
            worst_x = x[i];
        }
        normal &= y[i] >= FLT_MIN;
    }
    fprintf(stderr, "  %s: 2^x worst %.2f ulp at x = %.9g\n", attn_arch_name(k->arch), worst,
            (double)worst_x);
    CHECK(worst <= 2.0);
    CHECK(normal); /* every x in [-126, 0] gives a normal float, never 0 */

    float ints[127], pw[127];
    for (int i = 0; i < 127; i++)
        ints[i] = (float)-i;
    k->exp2_nonpos(ints, pw, 127);
    int exact = 1, bad = -1;
    for (int i = 0; i < 127; i++)
        if (pw[i] != ldexpf(1.0f, -i))
            exact = 0, bad = bad < 0 ? i : bad;
    if (!exact)
        fprintf(stderr, "  2^-%d gave %.9g, want %.9g\n", bad, (double)pw[bad],
                (double)ldexpf(1.0f, -bad));
    CHECK(exact);

    const float special[7] = {0.0f, -0.0f, -INFINITY, -126.5f, -1000.0f, NAN, -1e-30f};
    float out[7];
    k->exp2_nonpos(special, out, 7);
    CHECK(out[0] == 1.0f);
    CHECK(out[1] == 1.0f);
    CHECK(out[2] == 0.0f && !signbit(out[2]));
    CHECK(out[3] == 0.0f);
    CHECK(out[4] == 0.0f);
    CHECK(isnan(out[5]));
    CHECK(out[6] == 1.0f); /* 2^-1e-30 rounds to 1, not to 2^-1 or 2 */
    free(x);
    free(y);
}

/* The AVX2 path's 2^x against the AVX-512 path's, bit for bit, on the grid, on
 * inputs just inside (-1, 0), where r = 1 + x is rounded, and past both ends. */
static void check_exp2_same_bits(const attn__fused_kernel *a, const attn__fused_kernel *b)
{
    enum { NS = 200000 };
    float *x = grid2(), *ya = malloc(N2 * sizeof *ya), *yb = malloc(N2 * sizeof *yb);
    a->exp2_nonpos(x, ya, N2);
    b->exp2_nonpos(x, yb, N2);
    int64_t differ = 0, first = -1;
    for (int i = 0; i < N2; i++)
        if (memcmp(&ya[i], &yb[i], sizeof(float)) != 0)
            differ++, first = first < 0 ? i : first;
    /* Every float32 from -2^-24 down through 1 - 2^-24 below 0 in steps of one ulp
     * near -1 and near 0 (the two places r rounds), and a few beyond the domain's
     * ends whose bits the comparison also pins. */
    float *z = malloc(NS * sizeof *z), *za = malloc(NS * sizeof *za), *zb = malloc(NS * sizeof *zb);
    for (int i = 0; i < NS / 2; i++) {
        z[i] = -ldexpf(1.0f, -24) * (float)(i + 1);       /* just below 0 */
        z[NS / 2 + i] = nextafterf(-1.0f, 0.0f) + ldexpf(1.0f, -24) * (float)i; /* near -1 */
    }
    a->exp2_nonpos(z, za, NS);
    b->exp2_nonpos(z, zb, NS);
    for (int i = 0; i < NS; i++)
        if (memcmp(&za[i], &zb[i], sizeof(float)) != 0) {
            if (differ == 0)
                fprintf(stderr, "  2^x at %.9g: %s %.9g, %s %.9g\n", (double)z[i],
                        attn_arch_name(a->arch), (double)za[i], attn_arch_name(b->arch),
                        (double)zb[i]);
            differ++;
        }
    if (first >= 0)
        fprintf(stderr, "  2^x at %.9g: %s %.9g, %s %.9g\n", (double)x[first],
                attn_arch_name(a->arch), (double)ya[first], attn_arch_name(b->arch),
                (double)yb[first]);
    fprintf(stderr, "  2^x: %lld inputs of %d differ between %s and %s\n", (long long)differ,
            N2 + NS, attn_arch_name(a->arch), attn_arch_name(b->arch));
    CHECK(differ == 0);
    free(x), free(ya), free(yb), free(z), free(za), free(zb);
}

int main(void)
{
    TEST("the kernel's e^x is within 2 ulp on [-87.33, 0], exactly 1 at 0 and 0 at -inf, "
         "0 below the normal range, NaN for NaN, on every path");
    const attn_arch archs[3] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (int a = 0; a < 3; a++)
        if (attn_arch_supported(archs[a]) && attn__fused_kernel_for(archs[a]))
            check_kernel(attn__fused_kernel_for(archs[a]));

    TEST("the kernel's 2^x is within 2 ulp on [-126, 0], exact at the integers, 0 below "
         "-126 and at -inf, NaN for NaN, on every path, and the AVX2 and AVX-512 bits agree");
    for (int a = 0; a < 3; a++)
        if (attn_arch_supported(archs[a]) && attn__fused_kernel_for(archs[a]))
            check_kernel_exp2(attn__fused_kernel_for(archs[a]));
    if (attn_arch_supported(ATTN_ARCH_AVX512) && attn__fused_kernel_for(ATTN_ARCH_AVX512) &&
        attn__fused_kernel_for(ATTN_ARCH_AVX2))
        check_exp2_same_bits(attn__fused_kernel_for(ATTN_ARCH_AVX2),
                             attn__fused_kernel_for(ATTN_ARCH_AVX512));
    else
        fprintf(stderr, "  skipped: the AVX2/AVX-512 comparison needs AVX-512\n");
    return check_summary("test_fused_exp");
}
