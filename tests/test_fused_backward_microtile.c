/*
 * test_fused_backward_microtile.c - the AVX-512 fused backward's two bodies
 * (src/kernels/sdpa_fused_backward_avx512.c, register tiles 8 x 2 and 6 x 4, and
 * src/kernels/sdpa_fused_backward_4x4_avx512.c, 4 x 4; chosen with the forward's
 * micro-tile shape in src/runtime/dispatch.c) give the same bits.
 *
 * Why they must: each score and dP is summed over d in increasing order, each dQ
 * over key tiles and keys in order, each dK and dV over query heads and rows in
 * order, in blocks of 32 rows for both; the shapes change only which products run
 * side by side, how many keys a step scores (64 or 32) and whether the key tile is
 * cut into slices.
 *
 * The choice is made once per process, so each shape runs in a child process
 * (fork) that sets ATTN_MICROTILE before its first call and writes every gradient
 * into memory shared with the parent, which compares the two bit for bit. Each
 * child also checks that 2 threads give the 1-thread bits. The problems: Tq and Tk
 * in {1, 17, 64, 113, 200}, D in {1, 17, 64, 100} (Dv = D or not), one or two
 * (batch, key/value head) items (the two-pass and one-pass forms), grouped-query
 * heads, and in turn no option, causal (both alignments), a window, a softcap,
 * ALiBi, a boolean mask, a padding mask, a bias with its gradient, and a NaN in one
 * row of dO. How near the reference and a float64 oracle each body is, is
 * test_fused_backward's to check (CTest runs it under ATTN_MICROTILE=8x2 and 4x4
 * too).
 */
#define _DEFAULT_SOURCE 1 /* MAP_ANONYMOUS */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "check.h"
#include "child.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const shapes[2] = {"8x2", "4x4"};

enum { O_NONE, O_CAUSAL_TL, O_CAUSAL_BR, O_WINDOW, O_SOFTCAP, O_ALIBI, O_MASK, O_PADDING,
       O_BIAS, O_NAN, O_KINDS };
static const char *const opt_names[O_KINDS] = {"none", "causal top-left", "causal bottom-right",
                                                "window", "softcap", "alibi", "mask",
                                                "padding mask", "bias and dbias", "NaN in dO"};

static const int64_t sizes[] = {1, 17, 64, 113, 200};
static const int64_t dims[] = {1, 17, 64, 100};
#define N_SIZES 5
#define N_DIMS 4
#define N_PROBLEMS (N_SIZES * N_SIZES * 3)

typedef struct problem {
    int64_t B, H, Hkv, Tq, Tk, D, Dv;
    int opt;
} problem;

/* Problem n: every (Tq, Tk) pair three times, with the options, head sizes and
 * head layouts cycling at co-prime periods. */
static problem problem_of(int n)
{
    problem p;
    p.Tq = sizes[n % N_SIZES];
    p.Tk = sizes[(n / N_SIZES) % N_SIZES];
    p.opt = (n * 7 + n / 5) % O_KINDS;
    p.D = dims[(n * 3 + 1) % N_DIMS];
    p.Dv = n % 3 == 0 ? dims[(n + 2) % N_DIMS] : p.D;
    static const int64_t heads[4][3] = {{2, 2, 2}, {1, 4, 2}, {1, 1, 1}, {2, 3, 1}};
    p.B = heads[n % 4][0];
    p.H = heads[n % 4][1];
    p.Hkv = heads[n % 4][2];
    if (p.opt == O_CAUSAL_BR || p.opt == O_WINDOW) /* every row must see a key */
        p.Tq = p.Tq < p.Tk ? p.Tq : p.Tk;
    return p;
}

static int64_t n_q(const problem *p) { return p->B * p->H * p->Tq * p->D; }
static int64_t n_k(const problem *p) { return p->B * p->Hkv * p->Tk * p->D; }
static int64_t n_v(const problem *p) { return p->B * p->Hkv * p->Tk * p->Dv; }
static int64_t n_o(const problem *p) { return p->B * p->H * p->Tq * p->Dv; }
static int64_t n_bias(const problem *p) { return p->B * p->H * p->Tq * p->Tk; }

/* The floats of a problem's gradients: dq, dk, dv and, with a bias, dbias. */
static int64_t result_floats(const problem *p)
{
    return n_q(p) + n_k(p) + n_v(p) + (p->opt == O_BIAS ? n_bias(p) : 0);
}

static void describe(int n, const problem *p)
{
    fprintf(stderr, "   problem %d: B %lld H %lld Hkv %lld Tq %lld Tk %lld D %lld Dv %lld, %s\n", n,
            (long long)p->B, (long long)p->H, (long long)p->Hkv, (long long)p->Tq, (long long)p->Tk,
            (long long)p->D, (long long)p->Dv, opt_names[p->opt]);
}

/* Problem n's backward on the AVX-512 fused path with the given threads into res
 * (result_floats floats), from the reference forward's out and lse. */
static int run_problem(int n, int threads, float *res)
{
    const problem p = problem_of(n);
    float *q = malloc((size_t)n_q(&p) * sizeof(float)),
          *k = malloc((size_t)n_k(&p) * sizeof(float));
    float *v = malloc((size_t)n_v(&p) * sizeof(float)),
          *dout = malloc((size_t)n_o(&p) * sizeof(float));
    float *out = malloc((size_t)n_o(&p) * sizeof(float));
    float *lse = malloc((size_t)(p.B * p.H * p.Tq) * sizeof(float));
    float *bias = NULL, slopes[8];
    unsigned char *mask = NULL;
    tu_fill(q, n_q(&p), 10 * (uint64_t)n + 1);
    tu_fill(k, n_k(&p), 10 * (uint64_t)n + 2);
    tu_fill(v, n_v(&p), 10 * (uint64_t)n + 3);
    tu_fill(dout, n_o(&p), 10 * (uint64_t)n + 4);
    for (int64_t i = 0; i < n_q(&p); i++)
        q[i] *= 2.0f; /* weights far from uniform */
    attn_sdpa_params prm;
    attn_sdpa_params_init(&prm);
    prm.empty_rows = ATTN_EMPTY_ROWS_ZERO;
    attn_tensor tbias, tmask;
    if (p.opt == O_CAUSAL_TL || p.opt == O_NAN)
        prm.causal = ATTN_CAUSAL_TOP_LEFT;
    if (p.opt == O_CAUSAL_BR)
        prm.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    if (p.opt == O_WINDOW) {
        prm.has_window = 1;
        prm.window_left = 40;
        prm.window_right = 3;
    }
    if (p.opt == O_SOFTCAP)
        prm.softcap = 1.5f;
    if (p.opt == O_ALIBI) {
        prm.alibi = 1;
        prm.causal = ATTN_CAUSAL_TOP_LEFT;
        attn_alibi_slopes(NULL, p.H, slopes);
    }
    if (p.opt == O_BIAS) {
        bias = malloc((size_t)n_bias(&p) * sizeof(float));
        tu_fill(bias, n_bias(&p), 10 * (uint64_t)n + 5);
        tbias = tu_tensor4(bias, p.B, p.H, p.Tq, p.Tk);
        prm.bias = &tbias;
    }
    if (p.opt == O_MASK || p.opt == O_PADDING) {
        /* A random [B, 1, Tq, Tk] mask, or [B, 1, 1, Tk] hiding the last third of
         * the keys of every other sample. */
        const int64_t tq = p.opt == O_MASK ? p.Tq : 1, nm = p.B * tq * p.Tk;
        mask = malloc((size_t)nm);
        uint64_t s = 10 * (uint64_t)n + 6;
        for (int64_t i = 0; i < nm; i++) {
            const int64_t b = i / (tq * p.Tk), j = i % p.Tk;
            mask[i] = p.opt == O_MASK ? tu_uniform(&s) > -0.4f : !(b % 2 == 1 && 3 * j >= 2 * p.Tk);
        }
        const int64_t sh[4] = {p.B, 1, tq, p.Tk};
        attn_tensor_init(NULL, &tmask, ATTN_DTYPE_BOOL, mask, 4, sh);
        prm.mask = &tmask;
    }
    attn_tensor tq = tu_tensor4(q, p.B, p.H, p.Tq, p.D), tk = tu_tensor4(k, p.B, p.Hkv, p.Tk, p.D);
    attn_tensor tv = tu_tensor4(v, p.B, p.Hkv, p.Tk, p.Dv);
    attn_tensor to = tu_tensor4(out, p.B, p.H, p.Tq, p.Dv),
                tdo = tu_tensor4(dout, p.B, p.H, p.Tq, p.Dv);
    attn_tensor tl = tu_tensor3(lse, p.B, p.H, p.Tq);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = ATTN_IMPL_REF;
    attn_sdpa_params fp = prm;
    fp.lse = &tl;
    int rc = attn_sdpa(&ctx, &tq, &tk, &tv, &fp, &to, NULL);
    if (p.opt == O_NAN && p.Tq > 1)
        dout[(p.Tq / 2) * p.Dv] = NAN; /* one row of head 0's dO */
    float *dq = res, *dk = dq + n_q(&p), *dv = dk + n_k(&p), *db = dv + n_v(&p);
    attn_tensor tdq = tu_tensor4(dq, p.B, p.H, p.Tq, p.D),
                tdk = tu_tensor4(dk, p.B, p.Hkv, p.Tk, p.D);
    attn_tensor tdv = tu_tensor4(dv, p.B, p.Hkv, p.Tk, p.Dv),
                tdb = tu_tensor4(db, p.B, p.H, p.Tq, p.Tk);
    attn_sdpa_grads gr = {&tdq, &tdk, &tdv, p.opt == O_BIAS ? &tdb : NULL, NULL};
    if (rc == ATTN_OK) {
        ctx.impl = ATTN_IMPL_FUSED;
        ctx.arch = ATTN_ARCH_AVX512;
        ctx.threads = threads;
        rc = attn_sdpa_backward(&ctx, &tq, &tk, &tv, &prm, &to, &tl, &tdo, &gr);
    }
    if (rc != ATTN_OK)
        fprintf(stderr, "   problem %d: %s\n", n, ctx.message);
    attn_ctx_release(&ctx);
    free(q);
    free(k);
    free(v);
    free(dout);
    free(out);
    free(lse);
    free(bias);
    free(mask);
    return rc;
}

/* The number of floats whose bits differ (NaN and NaN count as the same). */
static int64_t bit_differences(const float *a, const float *b, int64_t n)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0 && !(isnan(a[i]) && isnan(b[i])))
            bad++;
    return bad;
}

/* The child for shapes[s]: every problem with 1 thread (into res) and 2 threads,
 * under its own ATTN_MICROTILE (child.h). Skipped without AVX-512. */
static void child(int s, void *out)
{
    const char *shape = shapes[s];
    float *res = out;
    setenv("ATTN_MICROTILE", shape, 1);
    if (!attn_arch_supported(ATTN_ARCH_AVX512))
        _exit(TU_CHILD_SKIPPED);
    char want[32];
    snprintf(want, sizeof want, "micro-tiles %s, forced", shape);
    CHECK(strstr(attn_arch_reason(NULL), want) != NULL);
    for (int n = 0; n < N_PROBLEMS; n++) {
        const problem p = problem_of(n);
        const int64_t nf = result_floats(&p);
        float *two = malloc((size_t)nf * sizeof *two);
        CHECK_INT(run_problem(n, 1, res), ATTN_OK);
        CHECK_INT(run_problem(n, 2, two), ATTN_OK);
        const int64_t bad = bit_differences(res, two, nf);
        if (bad) {
            fprintf(stderr, "   %s: %lld floats differ between 1 and 2 threads\n", shape,
                    (long long)bad);
            describe(n, &p);
        }
        CHECK_INT(bad, 0);
        res += nf;
        free(two);
    }
}

int main(void)
{
    TEST("the AVX-512 fused backward's 8 x 2 and 4 x 4 register tiles give the same bits, "
         "for 1 and 2 threads");
    int64_t total = 0;
    for (int n = 0; n < N_PROBLEMS; n++) {
        const problem p = problem_of(n);
        total += result_floats(&p);
    }
    const size_t bytes = 2 * (size_t)total * sizeof(float);
    float *shared = tu_shared_alloc(bytes);
    if (!shared)
        return check_summary("test_fused_backward_microtile");
    for (int s = 0; s < 2; s++)
        if (tu_run_child(child, s, shared + s * total, shapes[s]) == TU_CHILD_SKIP) {
            printf("test_fused_backward_microtile: skipped (this CPU or build has no AVX-512 "
                   "path)\n");
            tu_shared_free(shared, bytes);
            return check_summary("test_fused_backward_microtile");
        }

    /* The two shapes' gradients, problem by problem, bit for bit. */
    const float *a = shared, *b = shared + total;
    int differing = 0, nans = 0;
    for (int n = 0; n < N_PROBLEMS; n++) {
        const problem p = problem_of(n);
        const int64_t nf = result_floats(&p);
        const int64_t diff = bit_differences(a, b, nf);
        if (diff) {
            fprintf(stderr, "   %lld floats differ between 8x2 and 4x4\n", (long long)diff);
            describe(n, &p);
            differing++;
        }
        for (int64_t i = 0; i < nf; i++)
            nans += isnan(a[i]) != 0;
        a += nf;
        b += nf;
    }
    CHECK_INT(differing, 0);
    /* The NaN problems reach the non-finite path: some gradients are NaN. */
    CHECK(nans > 0);
    printf("test_fused_backward_microtile: %d problems, 8x2 and 4x4 %s\n", N_PROBLEMS,
           differing ? "differ" : "give the same bits");
    tu_shared_free(shared, bytes);
    return check_summary("test_fused_backward_microtile");
}
