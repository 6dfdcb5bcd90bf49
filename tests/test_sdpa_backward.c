/*
 * test_sdpa_backward.c - the backward of scaled dot-product attention
 * (attn_sdpa_backward, SPEC section 8) against central finite differences of a
 * float64 forward written here from the contract's formulas, on every option of
 * section 6 alone and all together, grouped-query heads and Tq != Tk; against
 * PyTorch's autograd (tests/data/golden_grads/, made by tests/golden/gen_grads.py);
 * and the claims that do not need a tolerance: a hidden key gets exactly zero
 * gradient, a NaN in dO stays in the rows it reaches, and the answer does not
 * depend on the thread count or the instruction set.
 *
 * The loss is L = sum(dO * O) for a fixed random dO, so dL/dO = dO and the
 * finite differences of L give exactly what the backward should return.
 *
 * Tolerances. The finite differences are central differences of a float64
 * forward with step 1e-4: their error is about h^2 |f'''|, below 1e-9 here, far
 * below float32's. The backward runs in float32 on inputs in [-1, 1), and every
 * gradient here is below 2 in magnitude: each is a short sum (at most 7 keys, or
 * 8 query rows of a GQA group, times at most 4 features) of products rounded once, on weights
 * recomputed from a float32 log-sum-exp, so its error is a few ulps of float32
 * (6e-8) times the sum's length: about 1e-6 at most. A gradient must be within
 * 1e-6 + 1e-5 |fd| of the finite difference (measured: every one is within
 * 1e-7 + 1e-7 |fd| on this machine, so the bound has a margin of about 10).
 * PyTorch's golden gradients are float64 results rounded once to float32, so the
 * same bound holds against them.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ATOL 1e-6
#define RTOL 1e-5
#define FD_STEP 1e-4

/* ---- one problem: shapes, options and data ------------------------------------- */

typedef struct problem {
    const char *name;
    int64_t B, H, Hkv, Tq, Tk, D, Dv;
    int causal;
    int has_window;
    int64_t wl, wr;
    float softcap;
    int alibi;
    int64_t bias_shape[4]; /* all 0: no bias */
    int sinks;
    int mask;              /* 1: a boolean mask [B, 1, Tq, Tk] with an empty row */
    float scale;           /* 0: the default */
    /* data, filled by make() */
    float *q, *k, *v, *bias, *sinkv, *dout;
    unsigned char *maskv;
    int64_t nq, nk, nv, nbias, no;
} problem;

static int64_t bias_n(const problem *P)
{
    return P->bias_shape[0] ? P->bias_shape[0] * P->bias_shape[1] * P->bias_shape[2] *
                                  P->bias_shape[3]
                            : 0;
}

static void make(problem *P, uint64_t seed)
{
    P->nq = P->B * P->H * P->Tq * P->D;
    P->nk = P->B * P->Hkv * P->Tk * P->D;
    P->nv = P->B * P->Hkv * P->Tk * P->Dv;
    P->no = P->B * P->H * P->Tq * P->Dv;
    P->nbias = bias_n(P);
    P->q = malloc(sizeof(float) * (size_t)P->nq);
    P->k = malloc(sizeof(float) * (size_t)P->nk);
    P->v = malloc(sizeof(float) * (size_t)P->nv);
    P->dout = malloc(sizeof(float) * (size_t)P->no);
    tu_fill(P->q, P->nq, seed);
    tu_fill(P->k, P->nk, seed + 1);
    tu_fill(P->v, P->nv, seed + 2);
    tu_fill(P->dout, P->no, seed + 3);
    P->bias = P->nbias ? malloc(sizeof(float) * (size_t)P->nbias) : NULL;
    if (P->bias)
        tu_fill(P->bias, P->nbias, seed + 4);
    P->sinkv = P->sinks ? malloc(sizeof(float) * (size_t)P->H) : NULL;
    if (P->sinkv)
        tu_fill(P->sinkv, P->H, seed + 5);
    P->maskv = NULL;
    if (P->mask) {
        /* Random keys hidden, and row 1 of batch 0 sees nothing (a zero-mode row). */
        P->maskv = malloc((size_t)(P->B * P->Tq * P->Tk));
        uint64_t st = seed + 6;
        for (int64_t b = 0; b < P->B; b++)
            for (int64_t i = 0; i < P->Tq; i++)
                for (int64_t j = 0; j < P->Tk; j++)
                    P->maskv[(b * P->Tq + i) * P->Tk + j] =
                        (b == 0 && i == 1) ? 0 : tu_uniform(&st) > -0.5f;
    }
}

static void unmake(problem *P)
{
    free(P->q);
    free(P->k);
    free(P->v);
    free(P->dout);
    free(P->bias);
    free(P->sinkv);
    free(P->maskv);
}

static double slope_of(int64_t h, int64_t H)
{
    int64_t m = 1;
    while (m * 2 <= H)
        m *= 2;
    return h < m ? pow(2.0, -8.0 * (double)(h + 1) / (double)m)
                 : pow(2.0, -8.0 * (double)(2 * (h - m) + 1) / (double)(2 * m));
}

static int visible(const problem *P, int64_t b, int64_t i, int64_t j, double biasv)
{
    const int64_t ip = i + P->Tk - P->Tq;
    if (P->causal == ATTN_CAUSAL_TOP_LEFT && j > i)
        return 0;
    if (P->causal == ATTN_CAUSAL_BOTTOM_RIGHT && j > ip)
        return 0;
    if (P->has_window && ((P->wl >= 0 && j < ip - P->wl) || (P->wr >= 0 && j > ip + P->wr)))
        return 0;
    if (P->maskv && !P->maskv[(b * P->Tq + i) * P->Tk + j])
        return 0;
    return biasv != -INFINITY;
}

static int64_t bias_index(const problem *P, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const int64_t *s = P->bias_shape;
    const int64_t idx[4] = {s[0] == 1 ? 0 : b, s[1] == 1 ? 0 : h, s[2] == 1 ? 0 : i,
                            s[3] == 1 ? 0 : j};
    return ((idx[0] * s[1] + idx[1]) * s[2] + idx[2]) * s[3] + idx[3];
}

/* The loss sum(dO * O) of the contract's forward in float64, from the float32
 * inputs with one of them (which: 0 q, 1 k, 2 v, 3 bias, 4 sinks) moved by
 * `delta` at element `at`. */
static double oracle_loss(const problem *P, int which, int64_t at, double delta)
{
    const int64_t B = P->B, H = P->H, Tq = P->Tq, Tk = P->Tk, D = P->D, Dv = P->Dv;
    const int64_t group = H / P->Hkv;
    const double scale = P->scale != 0.0f ? P->scale : 1.0 / sqrt((double)D);
    double loss = 0.0;
    double *s = malloc(sizeof(double) * (size_t)Tk);
#define IN(arr, w, idx) ((double)(arr)[idx] + (which == (w) && at == (idx) ? delta : 0.0))
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t hk = h / group;
            for (int64_t i = 0; i < Tq; i++) {
                double m = P->sinks ? IN(P->sinkv, 4, h) : -INFINITY;
                int any = 0;
                for (int64_t j = 0; j < Tk; j++) {
                    const double bv = P->bias ? IN(P->bias, 3, bias_index(P, b, h, i, j)) : 0.0;
                    s[j] = -INFINITY;
                    if (!visible(P, b, i, j, bv))
                        continue;
                    double x = 0.0;
                    for (int64_t d = 0; d < D; d++)
                        x += IN(P->q, 0, ((b * H + h) * Tq + i) * D + d) *
                             IN(P->k, 1, ((b * P->Hkv + hk) * Tk + j) * D + d);
                    x *= scale;
                    if (P->softcap > 0.0f)
                        x = P->softcap * tanh(x / P->softcap);
                    x += bv;
                    if (P->alibi) {
                        const int64_t dist = i + Tk - Tq - j;
                        x -= slope_of(h, H) * (double)(dist < 0 ? -dist : dist);
                    }
                    s[j] = x;
                    any = 1;
                    if (x > m)
                        m = x;
                }
                if (!any)
                    continue; /* a row that sees nothing: zero output */
                double sum = P->sinks ? exp(IN(P->sinkv, 4, h) - m) : 0.0;
                for (int64_t j = 0; j < Tk; j++)
                    sum += exp(s[j] - m);
                for (int64_t d = 0; d < Dv; d++) {
                    double o = 0.0;
                    for (int64_t j = 0; j < Tk; j++)
                        if (s[j] != -INFINITY)
                            o += exp(s[j] - m) / sum *
                                 IN(P->v, 2, ((b * P->Hkv + hk) * Tk + j) * Dv + d);
                    loss += (double)P->dout[((b * H + h) * Tq + i) * Dv + d] * o;
                }
            }
        }
#undef IN
    free(s);
    return loss;
}

static double fd(const problem *P, int which, int64_t at)
{
    return (oracle_loss(P, which, at, FD_STEP) - oracle_loss(P, which, at, -FD_STEP)) /
           (2.0 * FD_STEP);
}

/* ---- running attn on a problem ----------------------------------------------- */

typedef struct result {
    float *out, *lse, *dq, *dk, *dv, *dbias, *dsinks;
    int rc_fwd, rc_bwd;
} result;

static void params_of(problem *P, attn_sdpa_params *p, attn_tensor *bias, attn_tensor *sinks,
                      attn_tensor *mask)
{
    attn_sdpa_params_init(p);
    p->causal = P->causal;
    p->has_window = P->has_window;
    p->window_left = P->wl;
    p->window_right = P->wr;
    p->softcap = P->softcap;
    p->alibi = P->alibi;
    if (P->scale != 0.0f) {
        p->has_scale = 1;
        p->scale = P->scale;
    }
    if (P->bias) {
        *bias = tu_tensor4(P->bias, P->bias_shape[0], P->bias_shape[1], P->bias_shape[2],
                           P->bias_shape[3]);
        p->bias = bias;
    }
    if (P->sinks) {
        const int64_t sh[1] = {P->H};
        attn_tensor_init(NULL, sinks, ATTN_DTYPE_F32, P->sinkv, 1, sh);
        p->sinks = sinks;
    }
    if (P->maskv) {
        const int64_t sh[4] = {P->B, 1, P->Tq, P->Tk};
        attn_tensor_init(NULL, mask, ATTN_DTYPE_BOOL, P->maskv, 4, sh);
        p->mask = mask;
        p->empty_rows = ATTN_EMPTY_ROWS_ZERO;
    }
}

/* The forward on ctx (its out and lse kept in r unless `given` has them), then the
 * backward on ctx. */
static void run_both(problem *P, attn_ctx *ctx, result *r, const result *given)
{
    attn_sdpa_params p;
    attn_tensor bias, sinks, mask;
    params_of(P, &p, &bias, &sinks, &mask);
    r->out = calloc((size_t)P->no, sizeof(float));
    r->lse = calloc((size_t)(P->B * P->H * P->Tq), sizeof(float));
    r->dq = calloc((size_t)P->nq, sizeof(float));
    r->dk = calloc((size_t)P->nk, sizeof(float));
    r->dv = calloc((size_t)P->nv, sizeof(float));
    r->dbias = P->nbias ? calloc((size_t)P->nbias, sizeof(float)) : NULL;
    r->dsinks = P->sinks ? calloc((size_t)P->H, sizeof(float)) : NULL;
    attn_tensor q = tu_tensor4(P->q, P->B, P->H, P->Tq, P->D);
    attn_tensor k = tu_tensor4(P->k, P->B, P->Hkv, P->Tk, P->D);
    attn_tensor v = tu_tensor4(P->v, P->B, P->Hkv, P->Tk, P->Dv);
    attn_tensor out = tu_tensor4(r->out, P->B, P->H, P->Tq, P->Dv);
    attn_tensor lse = tu_tensor3(r->lse, P->B, P->H, P->Tq);
    attn_tensor dout = tu_tensor4(P->dout, P->B, P->H, P->Tq, P->Dv);
    attn_tensor dq = tu_tensor4(r->dq, P->B, P->H, P->Tq, P->D);
    attn_tensor dk = tu_tensor4(r->dk, P->B, P->Hkv, P->Tk, P->D);
    attn_tensor dv = tu_tensor4(r->dv, P->B, P->Hkv, P->Tk, P->Dv);
    attn_tensor dbias, dsinks;
    attn_sdpa_grads g = {&dq, &dk, &dv, NULL, NULL};
    if (r->dbias) {
        dbias = tu_tensor4(r->dbias, P->bias_shape[0], P->bias_shape[1], P->bias_shape[2],
                           P->bias_shape[3]);
        g.dbias = &dbias;
    }
    if (r->dsinks) {
        const int64_t sh[1] = {P->H};
        attn_tensor_init(NULL, &dsinks, ATTN_DTYPE_F32, r->dsinks, 1, sh);
        g.dsinks = &dsinks;
    }
    if (given) {
        memcpy(r->out, given->out, sizeof(float) * (size_t)P->no);
        memcpy(r->lse, given->lse, sizeof(float) * (size_t)(P->B * P->H * P->Tq));
        r->rc_fwd = ATTN_OK;
    } else {
        p.lse = &lse;
        r->rc_fwd = attn_sdpa(ctx, &q, &k, &v, &p, &out, NULL);
        p.lse = NULL;
    }
    r->rc_bwd = attn_sdpa_backward(ctx, &q, &k, &v, &p, &out, &lse, &dout, &g);
}

static void result_free(result *r)
{
    free(r->out);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    free(r->dbias);
    free(r->dsinks);
}

/* Every gradient of r against the finite differences. */
static void check_fd(problem *P, const result *r, const char *path)
{
    CHECK_INT(r->rc_fwd, ATTN_OK);
    CHECK_INT(r->rc_bwd, ATTN_OK);
    const float *got[5] = {r->dq, r->dk, r->dv, r->dbias, r->dsinks};
    const int64_t n[5] = {P->nq, P->nk, P->nv, P->nbias, P->sinks ? P->H : 0};
    const char *names[5] = {"dq", "dk", "dv", "dbias", "dsinks"};
    for (int w = 0; w < 5; w++)
        for (int64_t e = 0; e < n[w]; e++) {
            if (w == 3 && P->bias[e] == -INFINITY) {
                CHECK(got[w][e] == 0.0f); /* a hidden key's bias: exactly zero */
                continue;
            }
            const double want = fd(P, w, e);
            const double diff = fabs((double)got[w][e] - want);
            if (!(diff <= ATOL + RTOL * fabs(want)))
                fprintf(stderr, "   %s %s %s[%lld]: attn %.9g, finite differences %.9g\n",
                        P->name, path, names[w], (long long)e, (double)got[w][e], want);
            CHECK_NEAR(got[w][e], want, ATOL, RTOL);
        }
}

/* ---- the problems ------------------------------------------------------------ */

#define NPROB 14
static problem problems[NPROB] = {
    {.name = "plain", .B = 2, .H = 2, .Hkv = 2, .Tq = 5, .Tk = 5, .D = 4, .Dv = 3},
    {.name = "causal top-left Tq < Tk", .B = 1, .H = 2, .Hkv = 2, .Tq = 4, .Tk = 6, .D = 3,
     .Dv = 4, .causal = ATTN_CAUSAL_TOP_LEFT},
    {.name = "causal bottom-right Tq < Tk", .B = 1, .H = 2, .Hkv = 2, .Tq = 3, .Tk = 6,
     .D = 4, .Dv = 2, .causal = ATTN_CAUSAL_BOTTOM_RIGHT},
    {.name = "Tq > Tk", .B = 1, .H = 1, .Hkv = 1, .Tq = 6, .Tk = 3, .D = 3, .Dv = 3},
    {.name = "window (2, 1)", .B = 1, .H = 2, .Hkv = 2, .Tq = 6, .Tk = 6, .D = 3, .Dv = 3,
     .has_window = 1, .wl = 2, .wr = 1},
    {.name = "softcap", .B = 1, .H = 2, .Hkv = 2, .Tq = 4, .Tk = 5, .D = 4, .Dv = 3,
     .softcap = 0.8f, .scale = 2.5f},
    {.name = "ALiBi", .B = 1, .H = 3, .Hkv = 3, .Tq = 4, .Tk = 5, .D = 3, .Dv = 3, .alibi = 1},
    {.name = "full bias", .B = 2, .H = 2, .Hkv = 2, .Tq = 3, .Tk = 4, .D = 3, .Dv = 2,
     .bias_shape = {2, 2, 3, 4}},
    {.name = "broadcast bias [1, H, 1, Tk]", .B = 2, .H = 2, .Hkv = 2, .Tq = 4, .Tk = 5,
     .D = 3, .Dv = 2, .bias_shape = {1, 2, 1, 5}},
    {.name = "sinks", .B = 2, .H = 2, .Hkv = 2, .Tq = 4, .Tk = 4, .D = 3, .Dv = 3, .sinks = 1},
    {.name = "GQA (H 4, Hkv 2)", .B = 1, .H = 4, .Hkv = 2, .Tq = 3, .Tk = 5, .D = 3, .Dv = 2},
    {.name = "MQA causal", .B = 2, .H = 3, .Hkv = 1, .Tq = 4, .Tk = 4, .D = 2, .Dv = 3,
     .causal = ATTN_CAUSAL_TOP_LEFT},
    {.name = "mask with an empty row (zero mode)", .B = 2, .H = 2, .Hkv = 1, .Tq = 4,
     .Tk = 5, .D = 3, .Dv = 3, .mask = 1},
    {.name = "everything together", .B = 2, .H = 4, .Hkv = 2, .Tq = 4, .Tk = 7, .D = 3,
     .Dv = 2, .causal = ATTN_CAUSAL_BOTTOM_RIGHT, .has_window = 1, .wl = 3, .wr = -1,
     .softcap = 1.5f, .alibi = 1, .bias_shape = {1, 4, 4, 7}, .sinks = 1, .mask = 1,
     .scale = 0.9f},
};

typedef struct run_path {
    char name[32];
    attn_arch arch;
    int threads;
} run_path;

static int paths_of(run_path *paths)
{
    const attn_arch archs[] = {ATTN_ARCH_REF, ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2,
                               ATTN_ARCH_AVX512};
    int n = 0;
    for (int a = 0; a < 4; a++) {
        if (!attn_arch_supported(archs[a]))
            continue;
        for (int t = 1; t <= 2; t++) {
            snprintf(paths[n].name, sizeof paths[n].name, "%s/%dt", attn_arch_name(archs[a]), t);
            paths[n].arch = archs[a];
            paths[n].threads = t;
            n++;
        }
    }
    return n;
}

static int same_bits(const float *a, const float *b, int64_t n)
{
    return (n == 0) || (a && b && memcmp(a, b, sizeof(float) * (size_t)n) == 0);
}

static void test_finite_differences(void)
{
    TEST("every gradient (dq, dk, dv, dbias, dsinks) matches float64 central finite "
         "differences of the loss sum(dO * O), on every option alone and all together, "
         "with the forward on every path and 1 and 2 threads");
    run_path paths[8];
    const int np = paths_of(paths);
    for (int c = 0; c < NPROB; c++) {
        problem *P = &problems[c];
        make(P, 1000 + 17 * (uint64_t)c);
        if (P->bias && c == NPROB - 1)
            P->bias[3] = -INFINITY; /* a bias of -inf hides a key: zero gradient */
        for (int pi = 0; pi < np; pi++) {
            attn_ctx ctx;
            attn_ctx_init(&ctx);
            ctx.arch = paths[pi].arch;
            ctx.threads = paths[pi].threads;
            result r;
            run_both(P, &ctx, &r, NULL);
            check_fd(P, &r, paths[pi].name);
            result_free(&r);
            attn_ctx_release(&ctx);
        }
    }
}

static void test_paths_agree(void)
{
    /* Until the fused backward came (issue 14) every path ran the reference, and
     * this test pinned the same bits on every instruction set. The fused backward
     * rounds differently per instruction set (its sums run a vector at a time);
     * what it promises is the same bits for any thread count, checked here, and
     * the reference's results within a bound, checked against float64 above and
     * in tests/test_fused_backward.c. */
    TEST("given the same out and lse, the backward gives the same bits for any thread "
         "count on each instruction set");
    run_path paths[8];
    const int np = paths_of(paths);
    for (int c = 0; c < NPROB; c++) {
        problem *P = &problems[c];
        attn_ctx ctx0;
        attn_ctx_init(&ctx0);
        ctx0.impl = ATTN_IMPL_REF;
        result r0;
        run_both(P, &ctx0, &r0, NULL);
        for (int pi = 0; pi < np; pi++) {
            if (paths[pi].threads != 1)
                continue;
            attn_ctx ctx1;
            attn_ctx_init(&ctx1);
            ctx1.arch = paths[pi].arch;
            ctx1.threads = 1;
            result r1;
            run_both(P, &ctx1, &r1, &r0);
            for (int pj = 0; pj < np; pj++) {
                if (paths[pj].arch != paths[pi].arch || paths[pj].threads == 1)
                    continue;
                attn_ctx ctx;
                attn_ctx_init(&ctx);
                ctx.arch = paths[pj].arch;
                ctx.threads = paths[pj].threads;
                result r;
                run_both(P, &ctx, &r, &r0);
                int same = same_bits(r.dq, r1.dq, P->nq) && same_bits(r.dk, r1.dk, P->nk) &&
                           same_bits(r.dv, r1.dv, P->nv) &&
                           same_bits(r.dbias, r1.dbias, P->nbias) &&
                           same_bits(r.dsinks, r1.dsinks, P->sinks ? P->H : 0);
                if (!same)
                    fprintf(stderr,
                            "   %s on %s: the gradients differ from those on %s\n",
                            P->name, paths[pj].name, paths[pi].name);
                CHECK(same);
                result_free(&r);
                attn_ctx_release(&ctx);
            }
            result_free(&r1);
            attn_ctx_release(&ctx1);
        }
        result_free(&r0);
        attn_ctx_release(&ctx0);
    }
}

static void test_hidden_keys_exact_zero(void)
{
    TEST("a key that no query may see (causal, Tk > Tq) gets exactly zero dk and dv, "
         "even with NaN in its value and key rows; a query row that sees no key gets "
         "exactly zero dq");
    problem P = {.name = "hidden", .B = 1, .H = 2, .Hkv = 1, .Tq = 3, .Tk = 5, .D = 3, .Dv = 2,
                 .causal = ATTN_CAUSAL_TOP_LEFT, .mask = 1};
    make(&P, 77);
    /* Top-left causal: keys 3 and 4 are seen by no query (i <= 2). */
    for (int64_t d = 0; d < P.Dv; d++)
        P.v[4 * P.Dv + d] = NAN;
    for (int64_t d = 0; d < P.D; d++)
        P.k[4 * P.D + d] = NAN;
    result r;
    run_both(&P, NULL, &r, NULL);
    CHECK_INT(r.rc_fwd, ATTN_OK);
    CHECK_INT(r.rc_bwd, ATTN_OK);
    for (int64_t j = 3; j < 5; j++) {
        for (int64_t d = 0; d < P.D; d++) {
            CHECK(r.dk[j * P.D + d] == 0.0f);
            if (r.dk[j * P.D + d] != 0.0f)
                fprintf(stderr, "   dk[%lld][%lld] = %g, want 0\n", (long long)j, (long long)d,
                        (double)r.dk[j * P.D + d]);
        }
        for (int64_t d = 0; d < P.Dv; d++)
            CHECK(r.dv[j * P.Dv + d] == 0.0f);
    }
    /* Keys the queries do see have finite gradients: the NaN stayed out. */
    for (int64_t e = 0; e < 3 * P.D; e++)
        CHECK(isfinite(r.dk[e]));
    /* Row 1 of batch 0 sees no key (the mask), in both heads. */
    for (int64_t h = 0; h < P.H; h++)
        for (int64_t d = 0; d < P.D; d++)
            CHECK(r.dq[(h * P.Tq + 1) * P.D + d] == 0.0f);
    result_free(&r);
    unmake(&P);
}

static void test_nan_in_dout(void)
{
    TEST("a NaN in dO (query 1 of batch 0, head 0, feature 0, causal) makes NaN exactly "
         "the gradients it reaches: dq of that row, dk of the keys it sees, and feature 0 "
         "of those keys' dv (dV = P^T dO keeps features apart); every other gradient "
         "stays finite");
    problem P = {.name = "nan", .B = 2, .H = 2, .Hkv = 2, .Tq = 4, .Tk = 4, .D = 3, .Dv = 3,
                 .causal = ATTN_CAUSAL_TOP_LEFT};
    make(&P, 91);
    P.dout[1 * P.Dv + 0] = NAN;
    result r;
    run_both(&P, NULL, &r, NULL);
    CHECK_INT(r.rc_bwd, ATTN_OK);
    int wrong = 0;
    for (int64_t b = 0; b < P.B; b++)
        for (int64_t h = 0; h < P.H; h++) {
            const int head = b == 0 && h == 0;
            for (int64_t i = 0; i < P.Tq; i++)
                for (int64_t d = 0; d < P.D; d++)
                    wrong += isnan(r.dq[((b * P.H + h) * P.Tq + i) * P.D + d]) != (head && i == 1);
            for (int64_t j = 0; j < P.Tk; j++) {
                for (int64_t d = 0; d < P.D; d++)
                    wrong += isnan(r.dk[((b * P.H + h) * P.Tk + j) * P.D + d]) != (head && j <= 1);
                for (int64_t d = 0; d < P.Dv; d++)
                    wrong += isnan(r.dv[((b * P.H + h) * P.Tk + j) * P.Dv + d]) !=
                             (head && j <= 1 && d == 0);
            }
        }
    CHECK_INT(wrong, 0);
    result_free(&r);
    unmake(&P);
}

static void test_refusals(void)
{
    TEST("the backward refuses p->lse (the forward's output), gradients that overlap an "
         "input or each other, dbias without a bias, shapes that do not fit (naming the "
         "tensors), and a row that sees no key unless empty_rows is zero");
    problem P = {.name = "args", .B = 1, .H = 2, .Hkv = 1, .Tq = 3, .Tk = 4, .D = 2, .Dv = 2};
    make(&P, 5);
    float out_d[12], lse_d[6], dq_d[12], dk_d[8], dv_d[8];
    attn_tensor q = tu_tensor4(P.q, 1, 2, 3, 2), k = tu_tensor4(P.k, 1, 1, 4, 2),
                v = tu_tensor4(P.v, 1, 1, 4, 2), out = tu_tensor4(out_d, 1, 2, 3, 2),
                lse = tu_tensor3(lse_d, 1, 2, 3), dout = tu_tensor4(P.dout, 1, 2, 3, 2),
                dq = tu_tensor4(dq_d, 1, 2, 3, 2), dk = tu_tensor4(dk_d, 1, 1, 4, 2),
                dv = tu_tensor4(dv_d, 1, 1, 4, 2);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.lse = &lse;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    CHECK_INT(attn_sdpa(&ctx, &q, &k, &v, &p, &out, NULL), ATTN_OK);
    attn_sdpa_grads g = {&dq, &dk, &dv, NULL, NULL};
    CHECK_INT(attn_sdpa_backward(&ctx, &q, &k, &v, &p, &out, &lse, &dout, &g),
              ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "p->lse must be NULL");
    p.lse = NULL;
    attn_sdpa_grads alias = {&dq, &dk, &dv, NULL, NULL};
    attn_tensor dq_on_q = tu_tensor4(P.q, 1, 2, 3, 2);
    alias.dq = &dq_on_q;
    CHECK_INT(attn_sdpa_backward(&ctx, &q, &k, &v, &p, &out, &lse, &dout, &alias),
              ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "dq and q share memory");
    attn_sdpa_grads twice = {&dq, &dk, &dk, NULL, NULL};
    CHECK_INT(attn_sdpa_backward(&ctx, &q, &k, &v, &p, &out, &lse, &dout, &twice),
              ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "dv and dk share memory");
    attn_tensor dbias = tu_tensor4(dq_d, 1, 1, 3, 4);
    attn_sdpa_grads nobias = {&dq, &dk, &dv, &dbias, NULL};
    CHECK_INT(attn_sdpa_backward(&ctx, &q, &k, &v, &p, &out, &lse, &dout, &nobias),
              ATTN_STATUS_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(ctx.message, "p->bias is NULL");
    attn_tensor dk_wrong = tu_tensor4(dk_d, 1, 2, 2, 2);
    attn_sdpa_grads shape = {&dq, &dk_wrong, &dv, NULL, NULL};
    CHECK_INT(attn_sdpa_backward(&ctx, &q, &k, &v, &p, &out, &lse, &dout, &shape),
              ATTN_STATUS_SHAPE_MISMATCH);
    CHECK_STR_CONTAINS(ctx.message, "grads->dk has shape (1, 2, 2, 2); expected (1, 1, 4, 2)");
    /* A row that sees no key is an error in the backward as in the forward. */
    unsigned char none[4] = {0, 0, 0, 0};
    const int64_t msh[4] = {1, 1, 1, 4};
    attn_tensor mask;
    attn_tensor_init(NULL, &mask, ATTN_DTYPE_BOOL, none, 4, msh);
    attn_sdpa_params pm = p;
    pm.mask = &mask;
    CHECK_INT(attn_sdpa_backward(&ctx, &q, &k, &v, &pm, &out, &lse, &dout, &g),
              ATTN_STATUS_EMPTY_ROW);
    CHECK_STR_CONTAINS(ctx.message, "empty_rows = zero");
    /* The reference's scratch is P and dS [Tq, Tk] and Delta [Tq]; the size is what
     * attn_sdpa_backward would run under ctx, so ask with ctx->impl = REF (the
     * fused backward's own size is its planner's business). */
    size_t bytes = 0;
    ctx.impl = ATTN_IMPL_REF;
    CHECK_INT(attn_sdpa_backward_workspace_size(&ctx, &q, &k, &v, &p, &out, &lse, &dout, &g,
                                                &bytes),
              ATTN_OK);
    ctx.impl = ATTN_IMPL_AUTO;
    CHECK_INT(bytes, (2 * 3 * 4 + 3) * sizeof(float));
    CHECK_INT(attn_sdpa_backward_ref(&ctx, &q, &k, &v, &p, &out, &lse, &dout, &g), ATTN_OK);
    attn_ctx_release(&ctx);
    unmake(&P);
}

static long alloc_calls;

static void *counting_alloc(void *user, size_t n)
{
    (void)user;
    alloc_calls++;
    return malloc(n);
}

static void counting_free(void *user, void *p)
{
    (void)user;
    free(p);
}

static void test_workspace(void)
{
    TEST("with a workspace of attn_sdpa_backward_workspace_size bytes the backward "
         "allocates nothing and gives the same bits as without one; without it, the "
         "scratch (larger than the stack's 4096 bytes here) is one allocation");
    problem P = {.name = "workspace", .B = 1, .H = 2, .Hkv = 1, .Tq = 24, .Tk = 30, .D = 4,
                 .Dv = 4, .causal = ATTN_CAUSAL_BOTTOM_RIGHT};
    make(&P, 123);
    result plain;
    run_both(&P, NULL, &plain, NULL);
    CHECK_INT(plain.rc_bwd, ATTN_OK);

    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.allocator.alloc = counting_alloc;
    ctx.allocator.free = counting_free;
    attn_tensor q = tu_tensor4(P.q, P.B, P.H, P.Tq, P.D);
    attn_tensor k = tu_tensor4(P.k, P.B, P.Hkv, P.Tk, P.D);
    attn_tensor v = tu_tensor4(P.v, P.B, P.Hkv, P.Tk, P.Dv);
    attn_tensor out = tu_tensor4(plain.out, P.B, P.H, P.Tq, P.Dv);
    attn_tensor lse = tu_tensor3(plain.lse, P.B, P.H, P.Tq);
    attn_tensor dout = tu_tensor4(P.dout, P.B, P.H, P.Tq, P.Dv);
    float *dq_d = calloc((size_t)P.nq, sizeof(float));
    float *dk_d = calloc((size_t)P.nk, sizeof(float));
    float *dv_d = calloc((size_t)P.nv, sizeof(float));
    attn_tensor dq = tu_tensor4(dq_d, P.B, P.H, P.Tq, P.D);
    attn_tensor dk = tu_tensor4(dk_d, P.B, P.Hkv, P.Tk, P.D);
    attn_tensor dv = tu_tensor4(dv_d, P.B, P.Hkv, P.Tk, P.Dv);
    attn_sdpa_grads g = {&dq, &dk, &dv, NULL, NULL};
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = P.causal;
    size_t bytes = 0;
    CHECK_INT(attn_sdpa_backward_workspace_size(&ctx, &q, &k, &v, &p, &out, &lse, &dout, &g,
                                                &bytes),
              ATTN_OK);
    CHECK(bytes > 4096);
    alloc_calls = 0;
    CHECK_INT(attn_sdpa_backward(&ctx, &q, &k, &v, &p, &out, &lse, &dout, &g), ATTN_OK);
    CHECK_INT(alloc_calls, 1);
    void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64);
    ctx.workspace = ws;
    ctx.workspace_size = bytes;
    memset(dq_d, 0, sizeof(float) * (size_t)P.nq);
    alloc_calls = 0;
    CHECK_INT(attn_sdpa_backward(&ctx, &q, &k, &v, &p, &out, &lse, &dout, &g), ATTN_OK);
    CHECK_INT(alloc_calls, 0);
    CHECK(same_bits(dq_d, plain.dq, P.nq) && same_bits(dk_d, plain.dk, P.nk) &&
          same_bits(dv_d, plain.dv, P.nv));
    free(ws);
    free(dq_d);
    free(dk_d);
    free(dv_d);
    result_free(&plain);
    unmake(&P);
}

/* ---- golden gradients from PyTorch -------------------------------------------- */

#ifndef ATTN_TEST_DATA_DIR
#define ATTN_TEST_DATA_DIR "tests/data"
#endif

/* One case.txt: key=value lines (tests/golden/gen_grads.py). */
typedef struct golden_case {
    char keys[32][160];
    char vals[32][160];
    int n;
} golden_case;

static const char *gval(const golden_case *c, const char *key)
{
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->keys[i], key) == 0)
            return c->vals[i];
    return "";
}

static int golden_read(const char *dir, golden_case *c)
{
    char path[512], line[160];
    if (snprintf(path, sizeof path, "%s/case.txt", dir) >= (int)sizeof path)
        return -1;
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    c->n = 0;
    while (fgets(line, sizeof line, f) && c->n < 32) {
        char *eq = strchr(line, '=');
        if (line[0] == '#' || !eq)
            continue;
        *eq = '\0';
        eq[strcspn(eq + 1, "\r\n") + 1] = '\0';
        memcpy(c->keys[c->n], line, strlen(line) + 1);
        memcpy(c->vals[c->n], eq + 1, strlen(eq + 1) + 1);
        c->n++;
    }
    fclose(f);
    return 0;
}

/* Loads DIR/NAME into a (an empty NAME loads nothing and returns 0). */
static int golden_load(attn_ctx *ctx, const char *dir, const char *name, attn_array *a)
{
    memset(a, 0, sizeof *a);
    if (!name[0])
        return 0;
    char path[512];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return -1;
    int rc = attn_npy_load(ctx, path, a);
    if (rc)
        fprintf(stderr, "   cannot load %s: %s\n", path, ctx->message);
    return rc;
}

/* Every value of got [n] against PyTorch's want, within the bound above. */
static void check_golden(const char *cname, const char *what, const float *got,
                         const attn_array *want)
{
    const int64_t n = attn_tensor_numel(&want->tensor);
    const float *w = want->tensor.data;
    int64_t bad = 0;
    for (int64_t e = 0; e < n; e++) {
        const double diff = fabs((double)got[e] - (double)w[e]);
        if (!(diff <= ATOL + RTOL * fabs((double)w[e]))) {
            if (bad++ < 3)
                fprintf(stderr, "   %s %s[%lld]: attn %.9g, PyTorch %.9g\n", cname, what,
                        (long long)e, (double)got[e], (double)w[e]);
        }
    }
    CHECK_INT(bad, 0);
}

static void test_golden(void)
{
    TEST("on every case of tests/data/golden_grads (PyTorch 2.15 autograd through "
         "scaled_dot_product_attention, or the contract written out in torch for the "
         "softcap, sinks and empty rows), attn's forward then backward give PyTorch's "
         "output, dq, dk, dv, dbias and dsinks within 1e-6 + 1e-5 |torch|");
    char manifest[512], name[128];
    snprintf(manifest, sizeof manifest, "%s/golden_grads/MANIFEST", ATTN_TEST_DATA_DIR);
    FILE *mf = fopen(manifest, "r");
    CHECK(mf != NULL);
    if (!mf)
        return;
    int ncases = 0;
    while (fgets(name, sizeof name, mf)) {
        name[strcspn(name, "\r\n")] = '\0';
        if (name[0] == '#' || !name[0])
            continue;
        char dir[512];
        if (snprintf(dir, sizeof dir, "%s/golden_grads/%s", ATTN_TEST_DATA_DIR, name) >=
            (int)sizeof dir)
            continue;
        golden_case c;
        CHECK_INT(golden_read(dir, &c), 0);
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        attn_array q, k, v, m, bias, sinks, dout, out_w, dq_w, dk_w, dv_w, db_w, ds_w;
        int rc = golden_load(&ctx, dir, gval(&c, "query"), &q) |
                 golden_load(&ctx, dir, gval(&c, "key"), &k) |
                 golden_load(&ctx, dir, gval(&c, "value"), &v) |
                 golden_load(&ctx, dir, gval(&c, "mask"), &m) |
                 golden_load(&ctx, dir, gval(&c, "bias"), &bias) |
                 golden_load(&ctx, dir, gval(&c, "sinks"), &sinks) |
                 golden_load(&ctx, dir, gval(&c, "grad_output"), &dout) |
                 golden_load(&ctx, dir, gval(&c, "output"), &out_w) |
                 golden_load(&ctx, dir, gval(&c, "grad_query"), &dq_w) |
                 golden_load(&ctx, dir, gval(&c, "grad_key"), &dk_w) |
                 golden_load(&ctx, dir, gval(&c, "grad_value"), &dv_w) |
                 golden_load(&ctx, dir, gval(&c, "grad_bias"), &db_w) |
                 golden_load(&ctx, dir, gval(&c, "grad_sinks"), &ds_w);
        CHECK_INT(rc, 0);
        if (rc == 0) {
            attn_sdpa_params p;
            attn_sdpa_params_init(&p);
            p.causal = atoi(gval(&c, "causal"));
            if (gval(&c, "scale")[0]) {
                p.has_scale = 1;
                p.scale = strtof(gval(&c, "scale"), NULL);
            }
            if (gval(&c, "window")[0]) {
                long long l = 0, r = 0;
                sscanf(gval(&c, "window"), "%lld,%lld", &l, &r);
                p.has_window = 1;
                p.window_left = l;
                p.window_right = r;
            }
            if (gval(&c, "softcap")[0])
                p.softcap = strtof(gval(&c, "softcap"), NULL);
            p.alibi = strcmp(gval(&c, "alibi"), "1") == 0;
            p.mask = m.buffer ? &m.tensor : NULL;
            p.bias = bias.buffer ? &bias.tensor : NULL;
            p.sinks = sinks.buffer ? &sinks.tensor : NULL;
            p.empty_rows = strcmp(gval(&c, "empty_rows"), "zero") == 0 ? ATTN_EMPTY_ROWS_ZERO
                                                                      : ATTN_EMPTY_ROWS_ERROR;
            const attn_tensor *qt = &q.tensor;
            const int64_t B = qt->shape[0], H = qt->shape[1], Tq = qt->shape[2];
            const int64_t Dv = v.tensor.shape[3];
            const int64_t n_out = B * H * Tq * Dv;
            float *buf_out = calloc((size_t)n_out, sizeof(float));
            float *buf_lse = calloc((size_t)(B * H * Tq), sizeof(float));
            float *buf_dq = calloc((size_t)attn_tensor_numel(qt), sizeof(float));
            float *buf_dk = calloc((size_t)attn_tensor_numel(&k.tensor), sizeof(float));
            float *buf_dv = calloc((size_t)attn_tensor_numel(&v.tensor), sizeof(float));
            float *buf_db = bias.buffer ? calloc((size_t)attn_tensor_numel(&bias.tensor), 4)
                                        : NULL;
            float *buf_ds = sinks.buffer ? calloc((size_t)H, sizeof(float)) : NULL;
            attn_tensor out = tu_tensor4(buf_out, B, H, Tq, Dv);
            attn_tensor lse = tu_tensor3(buf_lse, B, H, Tq);
            attn_tensor dq, dk, dv, db, ds;
            attn_tensor_init(NULL, &dq, ATTN_DTYPE_F32, buf_dq, 4, qt->shape);
            attn_tensor_init(NULL, &dk, ATTN_DTYPE_F32, buf_dk, 4, k.tensor.shape);
            attn_tensor_init(NULL, &dv, ATTN_DTYPE_F32, buf_dv, 4, v.tensor.shape);
            attn_sdpa_grads g = {&dq, &dk, &dv, NULL, NULL};
            if (buf_db) {
                attn_tensor_init(NULL, &db, ATTN_DTYPE_F32, buf_db, bias.tensor.ndim,
                                 bias.tensor.shape);
                g.dbias = &db;
            }
            if (buf_ds) {
                attn_tensor_init(NULL, &ds, ATTN_DTYPE_F32, buf_ds, 1, sinks.tensor.shape);
                g.dsinks = &ds;
            }
            /* A case with RoPE rotates q and k first (keys at offset .., the queries
             * at the last Tq positions) and turns dq and dk back after, as `attn sdpa
             * --rope` does; its golden gradients are the unrotated inputs'. */
            const int rope = gval(&c, "rope")[0] != '\0';
            attn_rope_params rk, rq;
            attn_rope_params_init(&rk);
            if (rope) {
                rk.pairing = strcmp(gval(&c, "rope"), "half") == 0 ? ATTN_ROPE_HALF
                                                                   : ATTN_ROPE_INTERLEAVED;
                rk.base = strtof(gval(&c, "rope_base"), NULL);
                rk.offset = atoll(gval(&c, "rope_offset"));
            }
            rq = rk;
            rq.offset = rk.offset + k.tensor.shape[2] - Tq;
            if (rope) {
                CHECK_INT(attn_rope_apply(&ctx, &rk, &k.tensor, &k.tensor), ATTN_OK);
                CHECK_INT(attn_rope_apply(&ctx, &rq, &q.tensor, &q.tensor), ATTN_OK);
            }
            p.lse = &lse;
            CHECK_INT(attn_sdpa(&ctx, qt, &k.tensor, &v.tensor, &p, &out, NULL), ATTN_OK);
            p.lse = NULL;
            CHECK_INT(attn_sdpa_backward(&ctx, qt, &k.tensor, &v.tensor, &p, &out, &lse,
                                         &dout.tensor, &g),
                      ATTN_OK);
            if (rope) {
                CHECK_INT(attn_rope_backward(&ctx, &rq, &dq, &dq), ATTN_OK);
                CHECK_INT(attn_rope_backward(&ctx, &rk, &dk, &dk), ATTN_OK);
            }
            check_golden(name, "out", buf_out, &out_w);
            check_golden(name, "dq", buf_dq, &dq_w);
            check_golden(name, "dk", buf_dk, &dk_w);
            check_golden(name, "dv", buf_dv, &dv_w);
            if (buf_db)
                check_golden(name, "dbias", buf_db, &db_w);
            if (buf_ds)
                check_golden(name, "dsinks", buf_ds, &ds_w);
            free(buf_out);
            free(buf_lse);
            free(buf_dq);
            free(buf_dk);
            free(buf_dv);
            free(buf_db);
            free(buf_ds);
        }
        attn_array *all[] = {&q, &k, &v, &m, &bias, &sinks, &dout, &out_w, &dq_w, &dk_w,
                             &dv_w, &db_w, &ds_w};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            attn_array_free(&ctx, all[i]);
        attn_ctx_release(&ctx);
        ncases++;
    }
    fclose(mf);
    CHECK(ncases >= 12);
}

int main(void)
{
    test_finite_differences();
    test_paths_agree();
    for (int c = 0; c < NPROB; c++)
        unmake(&problems[c]);
    test_hidden_keys_exact_zero();
    test_nan_in_dout();
    test_refusals();
    test_golden();
    test_workspace();
    return check_summary("test_sdpa_backward");
}
