/*
 * test_simd_hsum4.c - simd_hsum4_scaled (src/kernels/simd.h), the split-key path's
 * reduction of four dot-product accumulators at once, on every instruction set this
 * machine runs.
 *
 * It protects three things the split path relies on: each output is the sum of its
 * own vector and no other (the transposition keeps the four apart, so a NaN or inf
 * in one accumulator reaches only its own score); the sum is taken in the documented
 * fixed order - fold the vector in halves, x[i] += x[i + W/2], W/2 then W/4 ... then
 * 1, and multiply the total by the scale once - to the bit, so the split path's bits
 * are what that order gives; and the scale is applied after the sum, not to each lane.
 */
#include "attn.h"
#include "check.h"
#include "sdpa_fused.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { MAXW = 16 };

/* The documented order in plain C: halve the vector until one float is left. */
static float fold_sum(const float *x, int w)
{
    float t[MAXW];
    memcpy(t, x, (size_t)w * sizeof *t);
    for (int half = w / 2; half >= 1; half /= 2)
        for (int i = 0; i < half; i++)
            t[i] = t[i] + t[i + half];
    return t[0];
}

/* Bits of a float, so that -0 and NaN compare as themselves. */
static uint32_t bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static void check_kernel(const attn__fused_kernel *k)
{
    const int w = k->width;
    float x[4 * MAXW], out[4];
    uint32_t seed = 12345u;

    /* Values whose sums round differently in different orders (wide exponents,
     * both signs): bit equality with fold_sum then pins the order. */
    int same = 1, own = 1;
    for (int trial = 0; trial < 2000; trial++) {
        for (int i = 0; i < 4 * w; i++) {
            seed = seed * 1664525u + 1013904223u;
            const float m = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
            x[i] = ldexpf(m, (int)((seed >> 3) % 24) - 12);
        }
        const float scale = 1.0f / sqrtf((float)(1 + trial % 200));
        k->hsum4(x, scale, out);
        for (int r = 0; r < 4; r++) {
            const float want = fold_sum(x + r * w, w) * scale;
            if (bits(out[r]) != bits(want)) {
                if (same)
                    printf("  width %d trial %d row %d: got %.9g, want %.9g\n", w, trial, r,
                           (double)out[r], (double)want);
                same = 0;
            }
        }
    }
    CHECK(same);

    /* Integers sum exactly in any order: row r holds r + 1 in every lane, so each
     * sum is (r + 1) w, and any mixing of rows shows. */
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < w; i++)
            x[r * w + i] = (float)(r + 1);
    k->hsum4(x, 0.5f, out);
    for (int r = 0; r < 4; r++) {
        if (out[r] != 0.5f * (float)((r + 1) * w)) {
            printf("  width %d row %d: got %g, want %g\n", w, r, (double)out[r],
                   0.5 * (double)((r + 1) * w));
            own = 0;
        }
    }
    CHECK(own);

    /* A NaN in the last lane of row 1 and +inf in the first lane of row 2: rows 0 and
     * 3 stay finite and exact, row 1 is NaN, row 2 is +inf. */
    for (int i = 0; i < 4 * w; i++)
        x[i] = 1.0f;
    x[1 * w + w - 1] = NAN;
    x[2 * w] = INFINITY;
    k->hsum4(x, 2.0f, out);
    printf("  width %d: non-finite rows give %g %g %g %g (want %d nan inf %d)\n", w,
           (double)out[0], (double)out[1], (double)out[2], (double)out[3], 2 * w, 2 * w);
    CHECK(out[0] == (float)(2 * w));
    CHECK(isnan(out[1]));
    CHECK(out[2] == INFINITY);
    CHECK(out[3] == (float)(2 * w));
}

int main(void)
{
    TEST("simd_hsum4_scaled sums each of four vectors on its own, in the documented "
         "halving order to the bit, scaled once, on every path");
    const attn_arch archs[3] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (int a = 0; a < 3; a++)
        if (attn_arch_supported(archs[a]) && attn__fused_kernel_for(archs[a]))
            check_kernel(attn__fused_kernel_for(archs[a]));
    return check_summary("test_simd_hsum4");
}
