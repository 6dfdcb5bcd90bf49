/*
 * test_fused_microtile.c - the AVX-512 fused kernel's two micro-tile shapes
 * (src/kernels/sdpa_fused_avx512.c, 8 x 2, and src/kernels/sdpa_fused_4x4_avx512.c,
 * 4 x 4; chosen per microarchitecture in src/runtime/dispatch.c) give the same bits.
 *
 * Why they must: a score is summed over d in increasing order and an output over
 * keys in increasing order whatever the micro-tile, and the key tiles start at
 * multiples of bc for both; the shapes change only which products run side by side
 * and how many keys past a row's causal end are skipped as -inf (weight exactly 0).
 *
 * The choice is made once per process, so each shape runs in a child process
 * (fork) that sets ATTN_MICROTILE before its first call and writes every output
 * into memory shared with the parent, which compares the two bit for bit. Each
 * child also checks that the shape it asked for is the one the reason reports, that
 * 2 threads give the 1-thread bits, and that the output is near the reference
 * (below). The problems: Tq and Tk in {1, 3, 17, 113} and longer, D from 1 to 128,
 * Dv = D or not, and in turn no option, causal (both alignments, Tq < and > Tk), a
 * window, softcap, an additive bias, ALiBi, a boolean mask, sinks, grouped-query
 * heads, with the log-sum-exp and the weights asked for on some; and the row path
 * (Tq <= 8) with its split-key decoding (Tq = 1, 1100 keys).
 *
 * The bound against the reference, |fused - ref| <= 3e-5 + 1e-4 |ref|, is loose: it
 * only catches a body wired wrong in a way that gives the same wrong bits in both
 * shapes. The tight bound is test_fused_sweep.c's against a float64 oracle, which
 * the 8 x 2 body meets and which the equal bits carry over to 4 x 4 (CTest also
 * runs that sweep under ATTN_MICROTILE=4x4: test_fused_sweep_4x4).
 */
#define _DEFAULT_SOURCE 1 /* MAP_ANONYMOUS */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "check.h"
#include "child.h"
#include "option_problems.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const shapes[2] = {"8x2", "4x4"};

static const int64_t sizes[] = {1, 3, 17, 113, 200};
static const int64_t dims[] = {1, 3, 17, 64, 128};
#define N_SIZES 5
#define N_DIMS 5

/* Problem n of the sweep: every (Tq, Tk) pair meets every option once over the
 * sweep's length; D, Dv and the outputs asked for cycle with co-prime periods. The
 * last two are the row path's split-key decoding. */
#define N_GRID (N_SIZES * N_SIZES * 2)
#define N_PROBLEMS (N_GRID + 2)
static problem problem_of(int n)
{
    problem p = {1, 2, 2, 1, 1, 1, 1, OPT_NONE, 0, 0};
    if (n >= N_GRID) {
        p.Tq = 1;
        p.Tk = 1100;
        p.D = p.Dv = 64;
        p.opt = n == N_GRID ? OPT_NONE : OPT_GQA;
        p.H = 4;
        p.Hkv = p.opt == OPT_GQA ? 1 : 4;
        p.lse = 1;
        return p;
    }
    p.Tq = sizes[(n / 2) % N_SIZES];
    p.Tk = sizes[(n / 2 / N_SIZES) % N_SIZES];
    p.opt = (n * 3 + n / 7) % OPT_KINDS;
    p.D = dims[(n * 2 + 1) % N_DIMS];
    p.Dv = n % 3 == 0 ? dims[(n + 3) % N_DIMS] : p.D;
    p.B = 1 + n % 2;
    if (p.opt == OPT_GQA) {
        p.H = 4;
        p.Hkv = 2;
    }
    p.lse = n % 2 == 0;
    p.weights = n % 4 == 1;
    return p;
}

/* The child for shapes[s]: every problem on the AVX-512 fused path with 1 thread
 * (into res) and 2 threads, and on the reference, under its own ATTN_MICROTILE
 * (child.h). Skipped without AVX-512. */
static void child(int s, void *out)
{
    const char *shape = shapes[s];
    float *res = out;
    setenv("ATTN_MICROTILE", shape, 1);
    if (!attn_arch_supported(ATTN_ARCH_AVX512))
        _exit(TU_CHILD_SKIPPED);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = ATTN_IMPL_FUSED;
    ctx.arch = ATTN_ARCH_AVX512;
    char want[32];
    snprintf(want, sizeof want, "micro-tiles %s, forced", shape);
    const char *reason = attn_arch_reason(NULL);
    if (!strstr(reason, want))
        fprintf(stderr, "   %s: the reason does not say \"%s\": %s\n", shape, want, reason);
    CHECK(strstr(reason, want) != NULL);
    for (int n = 0; n < N_PROBLEMS; n++) {
        const problem p = problem_of(n);
        const int64_t nf = result_floats(&p);
        float *two = malloc((size_t)nf * sizeof *two), *ref = malloc((size_t)nf * sizeof *ref);
        ctx.threads = 1;
        ctx.impl = ATTN_IMPL_FUSED;
        CHECK_INT(run_problem(&ctx, &p, n, 0, res), ATTN_OK);
        ctx.threads = 2;
        CHECK_INT(run_problem(&ctx, &p, n, 0, two), ATTN_OK);
        ctx.impl = ATTN_IMPL_REF;
        CHECK_INT(run_problem(&ctx, &p, n, 0, ref), ATTN_OK);
        const int64_t bad_threads = count_bit_differences(res, two, nf, shape, "1 thread", "2 threads");
        const int64_t bad_ref = count_far_from_reference(res, ref, nf, shape, "fused");
        if (bad_threads || bad_ref)
            describe(n, &p);
        CHECK_INT(bad_threads, 0);
        CHECK_INT(bad_ref, 0);
        res += nf;
        free(two);
        free(ref);
    }
}

/* A child that sets ATTN_MICROTILE to something that is not a shape: the value is
 * ignored, and the reason says so and names the shape used instead. */
static void child_invalid(int unused, void *res)
{
    (void)unused, (void)res;
    setenv("ATTN_MICROTILE", "5x5", 1);
    const char *reason = attn_arch_reason(NULL);
    const int said = strstr(reason, "ATTN_MICROTILE=5x5 ignored") != NULL &&
                     (strstr(reason, "micro-tiles 8x2") || strstr(reason, "micro-tiles 4x4"));
    if (!said)
        fprintf(stderr, "   ATTN_MICROTILE=5x5: the reason does not say it was ignored: %s\n",
                reason);
    CHECK(said);
}

int main(void)
{
    TEST("the AVX-512 fused kernel's 8 x 2 and 4 x 4 micro-tiles give the same bits, "
         "for 1 and 2 threads, near the reference");
    int64_t total = 0;
    for (int n = 0; n < N_PROBLEMS; n++) {
        const problem p = problem_of(n);
        total += result_floats(&p);
    }
    const size_t bytes = 2 * (size_t)total * sizeof(float);
    float *shared = tu_shared_alloc(bytes);
    if (!shared)
        return check_summary("test_fused_microtile");
    for (int s = 0; s < 2; s++)
        if (tu_run_child(child, s, shared + s * total, shapes[s]) == TU_CHILD_SKIP) {
            printf("test_fused_microtile: skipped (this CPU or build has no AVX-512 path)\n");
            tu_shared_free(shared, bytes);
            return check_summary("test_fused_microtile");
        }
    TEST("an ATTN_MICROTILE value that is not 8x2 or 4x4 is ignored, and the reason says so");
    tu_run_child(child_invalid, 0, NULL, "ATTN_MICROTILE=5x5");

    /* The two shapes' results, problem by problem, bit for bit. */
    const float *a = shared, *b = shared + total;
    int differing = 0;
    for (int n = 0; n < N_PROBLEMS; n++) {
        const problem p = problem_of(n);
        const int64_t nf = result_floats(&p);
        const int64_t diff = count_bit_differences(a, b, nf, "", "8x2", "4x4");
        if (diff) {
            describe(n, &p);
            differing++;
        }
        a += nf;
        b += nf;
    }
    CHECK_INT(differing, 0);
    printf("test_fused_microtile: %d problems, 8x2 and 4x4 %s\n", N_PROBLEMS,
           differing ? "differ" : "give the same bits");
    tu_shared_free(shared, bytes);
    return check_summary("test_fused_microtile");
}
