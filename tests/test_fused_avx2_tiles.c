/*
 * test_fused_avx2_tiles.c - the AVX2 fused kernel's micro-tiles
 * (src/kernels/sdpa_fused_avx2.c: 4 keys x 3 vectors of query rows for the scores,
 * 6 query rows x 2 vectors of value columns for the weighted sum) on the tails they
 * make: query tiles of 24 rows, so Tq, the query tile and the weighted sum's 6-row
 * blocks end anywhere, and D and Dv not multiples of 6, 8 or 24.
 *
 * What it protects, on the tile path (Tq above the row path's handful of rows):
 *
 *   - 2 threads give the 1-thread bits;
 *   - the output is near the reference, |avx2 - ref| <= 3e-5 + 1e-4 |ref|, which
 *     only catches a micro-tile wired wrong (test_fused_sweep.c holds the tight
 *     bound against a float64 oracle, on every path);
 *   - where the CPU has AVX-512, the AVX2 body gives the AVX-512 body's bits. Both
 *     sum each score over d in increasing order and each output over keys in
 *     increasing order, from key tiles at the same multiples of bc, with the same
 *     exp (simd.h: p * 2^n rounded once on both), so the vector width and the
 *     micro-tile shapes change only which products run side by side. The AVX2
 *     body's micro-tiles were 4 x 2 and 4 x 2 before, with these same sums, so this
 *     also says that the change of shape left the bits as they were.
 *
 * The problems: Tq in {9, 23, 25, 49, 73, 113, 200}, Tk in {1, 5, 17, 65, 130}, D
 * and Dv from 1 to 128, and in turn no option, causal (both alignments), a window,
 * softcap, a bias, ALiBi, a boolean mask, sinks and grouped-query heads, with the
 * log-sum-exp and the weights asked for on some. Each runs under the context's
 * default tiles (64 x 64 unless the machine's entry says otherwise); CTest runs the
 * test a second time under ATTN_TILE=32x24, whose br is not a multiple of 24.
 */
#include "attn.h"
#include "check.h"
#include "option_problems.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const int64_t tqs[] = {9, 23, 25, 49, 73, 113, 200};
static const int64_t tks[] = {1, 5, 17, 65, 130};
static const int64_t dims[] = {1, 5, 7, 13, 64, 71, 128};
#define N_TQ 7
#define N_TK 5
#define N_DIMS 7
#define N_PROBLEMS (N_TQ * N_TK * 2)
#define SEED 4000 /* inputs apart from test_fused_microtile.c's */

/* Problem n: every (Tq, Tk) pair twice, with the options, D, Dv and the outputs
 * asked for cycling with periods co-prime to the grid's. */
static problem problem_of(int n)
{
    problem p = {1, 2, 2, 1, 1, 1, 1, OPT_NONE, 0, 0};
    p.Tq = tqs[(n / 2) % N_TQ];
    p.Tk = tks[(n / 2 / N_TQ) % N_TK];
    p.opt = (n * 3 + n / 11) % OPT_KINDS;
    p.D = dims[(n * 3 + 1) % N_DIMS];
    p.Dv = n % 3 == 0 ? dims[(n + 4) % N_DIMS] : p.D;
    p.B = 1 + n % 2;
    if (p.opt == OPT_GQA) {
        p.H = 4;
        p.Hkv = 2;
    }
    p.lse = n % 2 == 0;
    p.weights = n % 4 == 1;
    return p;
}

int main(void)
{
    TEST("the AVX2 fused kernel's 4 x 3 and 6 x 2 micro-tiles: 1 and 2 threads give the "
         "same bits, near the reference, and the AVX-512 body's bits where it runs");
    if (!attn_arch_supported(ATTN_ARCH_AVX2)) {
        printf("test_fused_avx2_tiles: skipped (this CPU or build has no AVX2 path)\n");
        return check_summary("test_fused_avx2_tiles");
    }
    const int with_avx512 = attn_arch_supported(ATTN_ARCH_AVX512);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    int compared = 0;
    for (int n = 0; n < N_PROBLEMS; n++) {
        const problem p = problem_of(n);
        const int64_t nf = result_floats(&p);
        float *one = malloc((size_t)nf * sizeof *one), *two = malloc((size_t)nf * sizeof *two);
        float *wide = malloc((size_t)nf * sizeof *wide), *ref = malloc((size_t)nf * sizeof *ref);
        ctx.impl = ATTN_IMPL_FUSED;
        ctx.arch = ATTN_ARCH_AVX2;
        ctx.threads = 1;
        CHECK_INT(run_problem(&ctx, &p, n, SEED, one), ATTN_OK);
        ctx.threads = 2;
        CHECK_INT(run_problem(&ctx, &p, n, SEED, two), ATTN_OK);
        ctx.impl = ATTN_IMPL_REF;
        ctx.threads = 1;
        CHECK_INT(run_problem(&ctx, &p, n, SEED, ref), ATTN_OK);
        const int64_t bad_threads = count_bit_differences(one, two, nf, "", "1 thread", "2 threads");
        const int64_t bad_ref = count_far_from_reference(one, ref, nf, "", "avx2");
        int64_t bad_wide = 0;
        if (with_avx512) {
            ctx.impl = ATTN_IMPL_FUSED;
            ctx.arch = ATTN_ARCH_AVX512;
            CHECK_INT(run_problem(&ctx, &p, n, SEED, wide), ATTN_OK);
            bad_wide = count_bit_differences(one, wide, nf, "", "avx2", "avx512");
            compared++;
        }
        if (bad_threads || bad_ref || bad_wide)
            describe(n, &p);
        CHECK_INT(bad_threads, 0);
        CHECK_INT(bad_ref, 0);
        CHECK_INT(bad_wide, 0);
        free(one);
        free(two);
        free(wide);
        free(ref);
    }
    attn_ctx_release(&ctx);
    printf("test_fused_avx2_tiles: %d problems on AVX2, %d of them also against AVX-512%s\n",
           N_PROBLEMS, compared, with_avx512 ? "" : " (this CPU has no AVX-512 path)");
    return check_summary("test_fused_avx2_tiles");
}
