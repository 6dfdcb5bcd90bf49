/*
 * test_review_today.c - the edges of the day's base-2 kernels, each against the
 * reference kernels, on every instruction set this machine runs, with 1 and 2
 * threads (which must give the same bits):
 *
 *   - the float32 forward's tile path (Tq > 8) in base-2 units: sinks far above and
 *     far below every score, with rows whose keys are all hidden (zero output and
 *     the log-sum-exp exactly the sink), scores near the largest float the tile
 *     path keeps finite (2.3e38, below FLT_MAX / log2(e)), a softcap over huge
 *     scores, a bias of huge, -inf and NaN entries, ALiBi with large slopes;
 *   - the fused backward fed the fused forward's own log-sum-exp (m ln 2 + log(l)
 *     on the tile path), which the other backward tests never do (they all start
 *     from the reference's), for every option, against the reference chain;
 *   - the kernels' 2^x where the other tests do not look: each half-integer
 *     boundary of its reduction, the float just below -126, -149, and small x > 0,
 *     which the backward's one FMA, x scale log2(e) - L log2(e), can give at a
 *     row's largest score when L is rounded;
 *   - a 16-bit KV cache's batch growing step after step with the workspace
 *     attn_kv_cache_workspace_size gave at the first step, allocated to exactly
 *     that size (AddressSanitizer reports an access past it): sequences of 1 key,
 *     of the capacity, and in between, with 1 query row a step (the row and
 *     split layouts) and with 12 (the tile path's batch items) with GQA and RoPE;
 *     each step allocates nothing and gives each sequence's own bits.
 *
 * The reference's float32 sums run in another order than the fused kernels', so
 * the two are compared with a tolerance scaled to the largest reference value;
 * NaN must sit exactly where the reference puts it.
 */
#define _POSIX_C_SOURCE 200112L
#include "attn.h"
#include "check.h"
#include "sdpa_fused.h"
#include "test_util.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The inputs' generator: test_util.h's xorshift64*, one stream for the file. */
static uint64_t rng = 0x2545F4914F6CDD1Dull;

static float uni(void) { return tu_uniform(&rng); }

static const attn_arch ARCHS[3] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};

/* ---- problems ------------------------------------------------------------------- */

typedef struct problem {
    int64_t H, Hkv, Tq, Tk, D, Dv;
    int causal;
    float scale;   /* 0: the default 1/sqrt(D) */
    float softcap;
    int alibi;     /* 0 off, 1 the paper's slopes, 2 slopes of 1e3 and 1e30 */
    int bias;      /* 0 none, 1 huge entries (1e37) and -inf (all of row 1 of head 0),
                      2 a NaN entry at row 2, key 0 of head 1, 3 padding rows: every key
                      of row 1 of head 0 -FLT_MAX (torch.finfo's min), of row 2 of head 1
                      -1e9 */
    float sink;    /* 0: no sinks; else head 0's sink (head 1's is -sink) */
    int mask;      /* a bool [Tq, Tk] hiding the diagonal and more */
} problem;

static void describe(const problem *p, char *buf, size_t n)
{
    snprintf(buf, n, "H%lld/%lld Tq%lld Tk%lld D%lld Dv%lld causal%d scale%g cap%g alibi%d "
             "bias%d sink%g mask%d",
             (long long)p->H, (long long)p->Hkv, (long long)p->Tq, (long long)p->Tk,
             (long long)p->D, (long long)p->Dv, p->causal, (double)p->scale,
             (double)p->softcap, p->alibi, p->bias, (double)p->sink, p->mask);
}

typedef struct inputs {
    attn_tensor q, k, v, dout, bias, sinks, mask, slopes;
    float *pq, *pk, *pv, *pdo, *pb, *ps, *psl;
    unsigned char *pm;
    attn_sdpa_params prm;
} inputs;

static float *tensor(attn_tensor *t, int ndim, const int64_t *sh, int dtype)
{
    int64_t n = 1;
    for (int a = 0; a < ndim; a++)
        n *= sh[a];
    const size_t esz = dtype == ATTN_DTYPE_BOOL ? 1 : sizeof(float);
    float *x = malloc((size_t)n * esz);
    if (dtype != ATTN_DTYPE_BOOL)
        for (int64_t i = 0; i < n; i++)
            x[i] = uni();
    attn_tensor_init(NULL, t, dtype, x, ndim, sh);
    return x;
}

static void make_inputs(inputs *in, const problem *p)
{
    memset(in, 0, sizeof *in);
    const int64_t sq[4] = {1, p->H, p->Tq, p->D}, sk[4] = {1, p->Hkv, p->Tk, p->D};
    const int64_t sv[4] = {1, p->Hkv, p->Tk, p->Dv}, so[4] = {1, p->H, p->Tq, p->Dv};
    in->pq = tensor(&in->q, 4, sq, ATTN_DTYPE_F32);
    in->pk = tensor(&in->k, 4, sk, ATTN_DTYPE_F32);
    in->pv = tensor(&in->v, 4, sv, ATTN_DTYPE_F32);
    in->pdo = tensor(&in->dout, 4, so, ATTN_DTYPE_F32);
    attn_sdpa_params_init(&in->prm);
    attn_sdpa_params *r = &in->prm;
    r->causal = p->causal;
    if (p->scale != 0.0f) {
        r->has_scale = 1;
        r->scale = p->scale;
    }
    r->softcap = p->softcap;
    r->empty_rows = ATTN_EMPTY_ROWS_ZERO;
    if (p->alibi) {
        r->alibi = 1;
        if (p->alibi == 2) {
            const int64_t sh[1] = {p->H};
            in->psl = tensor(&in->slopes, 1, sh, ATTN_DTYPE_F32);
            for (int64_t h = 0; h < p->H; h++)
                in->psl[h] = h % 2 ? 1e30f : 1e3f;
            r->alibi_slopes = &in->slopes;
        }
    }
    if (p->bias) {
        const int64_t sh[4] = {1, p->H, p->Tq, p->Tk};
        in->pb = tensor(&in->bias, 4, sh, ATTN_DTYPE_F32);
        for (int64_t h = 0; h < p->H; h++)
            for (int64_t i = 0; i < p->Tq; i++)
                for (int64_t j = 0; j < p->Tk; j++) {
                    float *b = &in->pb[(h * p->Tq + i) * p->Tk + j];
                    if (p->bias == 1 && ((i == 1 && h == 0) || (i * p->Tk + j) % 7 == 3))
                        *b = -INFINITY;
                    else if (p->bias == 1 && (i * p->Tk + j) % 11 == 5)
                        *b = (i + j) % 2 ? 1e37f : -1e37f;
                    else if (p->bias == 2 && h == 1 && i == 2 && j == 0)
                        *b = NAN;
                    else if (p->bias == 3 && h == 0 && i == 1)
                        *b = -FLT_MAX; /* torch.finfo(float32).min: a padding row */
                    else if (p->bias == 3 && h == 1 && i == 2)
                        *b = -1e9f; /* another padding row's additive mask */
                }
        r->bias = &in->bias;
    }
    if (p->sink != 0.0f) {
        const int64_t sh[1] = {p->H};
        in->ps = tensor(&in->sinks, 1, sh, ATTN_DTYPE_F32);
        for (int64_t h = 0; h < p->H; h++)
            in->ps[h] = h % 2 ? -p->sink : p->sink;
        r->sinks = &in->sinks;
    }
    if (p->mask) {
        const int64_t sh[2] = {p->Tq, p->Tk};
        in->pm = (unsigned char *)tensor(&in->mask, 2, sh, ATTN_DTYPE_BOOL);
        for (int64_t i = 0; i < p->Tq; i++)
            for (int64_t j = 0; j < p->Tk; j++)
                in->pm[i * p->Tk + j] = j != i && uni() > -0.6f;
        r->mask = &in->mask;
    }
}

static void free_inputs(inputs *in)
{
    free(in->pq), free(in->pk), free(in->pv), free(in->pdo);
    free(in->pb), free(in->ps), free(in->psl), free(in->pm);
}

/* ---- running and comparing ------------------------------------------------------- */

typedef struct fwd_out {
    attn_tensor out, lse;
    float *po, *pl;
    int status;
} fwd_out;

static void fwd_alloc(fwd_out *f, const problem *p)
{
    const int64_t so[4] = {1, p->H, p->Tq, p->Dv}, sl[3] = {1, p->H, p->Tq};
    f->po = tensor(&f->out, 4, so, ATTN_DTYPE_F32);
    f->pl = tensor(&f->lse, 3, sl, ATTN_DTYPE_F32);
}

static void fwd_free(fwd_out *f) { free(f->po), free(f->pl); }

/* The forward; the fused one with a caller workspace of exactly the planned size,
 * so that AddressSanitizer sees an access past it. */
static int run_fwd(attn_impl impl, attn_arch arch, int threads, const inputs *in, fwd_out *f)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = impl;
    ctx.arch = arch;
    ctx.threads = threads;
    attn_sdpa_params prm = in->prm;
    prm.lse = &f->lse;
    size_t bytes = 0;
    void *ws = NULL;
    if (impl == ATTN_IMPL_FUSED &&
        attn_sdpa_workspace_size(&ctx, &in->q, &in->k, &in->v, &prm, &f->out, NULL, &bytes) ==
            ATTN_OK &&
        bytes > 0 && posix_memalign(&ws, 64, bytes) == 0) {
        ctx.workspace = ws;
        ctx.workspace_size = bytes;
    }
    f->status = attn_sdpa(&ctx, &in->q, &in->k, &in->v, &prm, &f->out, NULL);
    if (f->status != ATTN_OK)
        fprintf(stderr, "  forward: %s\n", ctx.message);
    free(ws);
    attn_ctx_release(&ctx);
    return f->status;
}

typedef struct bwd_out {
    attn_tensor dq, dk, dv, ds;
    float *pq, *pk, *pv, *ps;
    int status;
} bwd_out;

static void bwd_alloc(bwd_out *g, const problem *p)
{
    const int64_t sq[4] = {1, p->H, p->Tq, p->D}, sk[4] = {1, p->Hkv, p->Tk, p->D};
    const int64_t sv[4] = {1, p->Hkv, p->Tk, p->Dv}, ss[1] = {p->H};
    g->pq = tensor(&g->dq, 4, sq, ATTN_DTYPE_F32);
    g->pk = tensor(&g->dk, 4, sk, ATTN_DTYPE_F32);
    g->pv = tensor(&g->dv, 4, sv, ATTN_DTYPE_F32);
    g->ps = tensor(&g->ds, 1, ss, ATTN_DTYPE_F32);
}

static void bwd_free(bwd_out *g) { free(g->pq), free(g->pk), free(g->pv), free(g->ps); }

static int run_bwd(int ref, attn_arch arch, int threads, const inputs *in, const problem *p,
                   const fwd_out *f, bwd_out *g)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = ref ? ATTN_IMPL_REF : ATTN_IMPL_FUSED;
    ctx.arch = arch;
    ctx.threads = threads;
    attn_sdpa_params prm = in->prm;
    prm.lse = NULL;
    attn_sdpa_grads gr = {&g->dq, &g->dk, &g->dv, NULL, p->sink != 0.0f ? &g->ds : NULL};
    g->status = ref ? attn_sdpa_backward_ref(&ctx, &in->q, &in->k, &in->v, &prm, &f->out,
                                             &f->lse, &in->dout, &gr)
                    : attn_sdpa_backward(&ctx, &in->q, &in->k, &in->v, &prm, &f->out,
                                         &f->lse, &in->dout, &gr);
    if (g->status != ATTN_OK)
        fprintf(stderr, "  backward: %s\n", ctx.message);
    attn_ctx_release(&ctx);
    return g->status;
}

static int64_t numel(const attn_tensor *t)
{
    int64_t n = 1;
    for (int a = 0; a < t->ndim; a++)
        n *= t->shape[a];
    return n;
}

/* got against want (contiguous, same shape): with exact, bit for bit (the thread
 * count check); otherwise within tol * (1 + max |want|), or with per_value
 * tol * (1 + |want|) (the log-sum-exp, whose rows differ in size by up to 1e38),
 * with NaN only against NaN and an infinity only against the same one. Prints the first few mismatches with
 * both values; one check per call. */
static void compare(const char *what, const char *name, const char *path,
                    const attn_tensor *got, const attn_tensor *want, double tol, int exact,
                    int per_value)
{
    const float *g = got->data, *w = want->data;
    const int64_t n = numel(want);
    double big = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(w[i]) && fabs((double)w[i]) > big)
            big = fabs((double)w[i]);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int ok;
        if (exact)
            ok = memcmp(&g[i], &w[i], sizeof(float)) == 0;
        else if (isnan(g[i]) || isnan(w[i]))
            ok = isnan(g[i]) && isnan(w[i]);
        else if (isinf(g[i]) || isinf(w[i]))
            ok = g[i] == w[i];
        else
            ok = fabs((double)g[i] - (double)w[i]) <= tol * (1.0 + (per_value ? fabs((double)w[i]) : big));
        if (!ok && bad++ < 3)
            fprintf(stderr, "  %s [%s] %s at flat %lld: got %.9g, want %.9g%s\n", what, name,
                    path, (long long)i, (double)g[i], (double)w[i],
                    exact ? " (1 vs 2 threads, bits)" : "");
    }
    CHECK(bad == 0);
}

/* ---- the forward's edges, and the backward from its own lse ----------------------- */

static void one_problem(const problem *p, int backward)
{
    char name[300];
    describe(p, name, sizeof name);
    inputs in;
    make_inputs(&in, p);
    fwd_out ref;
    fwd_alloc(&ref, p);
    CHECK_INT(run_fwd(ATTN_IMPL_REF, ATTN_ARCH_AUTO, 1, &in, &ref), ATTN_OK);
    bwd_out gref;
    if (backward) {
        bwd_alloc(&gref, p);
        CHECK_INT(run_bwd(1, ATTN_ARCH_AUTO, 1, &in, p, &ref, &gref), ATTN_OK);
    }
    for (int a = 0; a < 3; a++) {
        if (!attn_arch_supported(ARCHS[a]))
            continue;
        const char *path = attn_arch_name(ARCHS[a]);
        fwd_out f[2];
        for (int t = 0; t < 2; t++) {
            fwd_alloc(&f[t], p);
            CHECK_INT(run_fwd(ATTN_IMPL_FUSED, ARCHS[a], t + 1, &in, &f[t]), ATTN_OK);
        }
        compare("out", name, path, &f[0].out, &ref.out, 2e-5, 0, 0);
        compare("lse", name, path, &f[0].lse, &ref.lse, 2e-5, 0, 1);
        compare("out", name, path, &f[1].out, &f[0].out, 0, 1, 0);
        compare("lse", name, path, &f[1].lse, &f[0].lse, 0, 1, 0);
        /* A row whose keys are all hidden (row 1 of head 0 under bias 1) with a sink
         * has zero output and the sink itself as its log-sum-exp, exactly: the tile
         * path's m starts at sink log2(e) and must go back to the sink, not to
         * sink log2(e) ln 2. */
        if (p->bias == 1 && p->sink != 0.0f && p->Tq > 1) {
            const float *l = f[0].lse.data, *o = f[0].out.data;
            int zero = 1;
            for (int64_t d = 0; d < p->Dv; d++)
                zero &= o[1 * p->Dv + d] == 0.0f;
            if (l[1] != p->sink || !zero)
                fprintf(stderr, "  hidden row with a sink [%s] %s: lse %.9g, want %.9g; out[0] "
                        "%.9g, want 0\n", name, path, (double)l[1], (double)p->sink,
                        (double)o[p->Dv]);
            CHECK(l[1] == p->sink && zero);
        }
        if (backward) {
            /* The backward from this path's own out and lse (base 2 on the tile path),
             * against the reference backward from the reference's. */
            bwd_out g[2];
            for (int t = 0; t < 2; t++) {
                bwd_alloc(&g[t], p);
                CHECK_INT(run_bwd(0, ARCHS[a], t + 1, &in, p, &f[0], &g[t]), ATTN_OK);
            }
            compare("dq", name, path, &g[0].dq, &gref.dq, 1e-4, 0, 0);
            compare("dk", name, path, &g[0].dk, &gref.dk, 1e-4, 0, 0);
            compare("dv", name, path, &g[0].dv, &gref.dv, 1e-4, 0, 0);
            compare("dq", name, path, &g[1].dq, &g[0].dq, 0, 1, 0);
            compare("dk", name, path, &g[1].dk, &g[0].dk, 0, 1, 0);
            compare("dv", name, path, &g[1].dv, &g[0].dv, 0, 1, 0);
            if (p->sink != 0.0f) {
                compare("dsinks", name, path, &g[0].ds, &gref.ds, 1e-4, 0, 0);
                compare("dsinks", name, path, &g[1].ds, &g[0].ds, 0, 1, 0);
            }
            bwd_free(&g[0]);
            bwd_free(&g[1]);
        }
        fwd_free(&f[0]);
        fwd_free(&f[1]);
    }
    if (backward)
        bwd_free(&gref);
    fwd_free(&ref);
    free_inputs(&in);
}

static void forward_edges(void)
{
    TEST("the float32 forward's tile path in base 2 agrees with the reference, and with "
         "itself bit for bit on 1 and 2 threads, on every path: sinks far above and far "
         "below every score (and the sink exactly as a hidden row's lse), scores up to "
         "2.3e38, a softcap over scores of 1e30, a bias of +-1e37, -inf and NaN, ALiBi "
         "slopes of 1e3 and 1e30, with T, D and Dv of 1, 3, 17 and 113");
    const int64_t T[4][2] = {{17, 17}, {113, 17}, {17, 113}, {3, 113}};
    const int64_t DD[3][2] = {{17, 3}, {1, 17}, {3, 1}};
    for (int t = 0; t < 4; t++)
        for (int d = 0; d < 3; d++) {
            problem base = {2, 1, T[t][0], T[t][1], DD[d][0], DD[d][1], 0, 0, 0, 0, 0, 0, 0};
            problem p = base;
            p.bias = 1, p.sink = 30.0f; /* the sink above every score, head 1's below */
            one_problem(&p, 0);
            p.sink = 1e-3f, p.causal = 1;
            one_problem(&p, 0);
            /* Scores of up to about 2.3e38 in size (|q.k| <= D), below the
             * 2.4e38 where the tile path's scores times log2(e) overflow. */
            p = base;
            p.scale = 2.3e38f / (float)p.D;
            one_problem(&p, 0);
            p.softcap = 20.0f, p.scale = 1e30f, p.sink = -5.0f;
            one_problem(&p, 0);
            p = base;
            p.bias = 2, p.alibi = 2;
            one_problem(&p, 0);
        }
}

static void backward_from_fused_lse(void)
{
    TEST("the fused backward fed the fused forward's own out and log-sum-exp (in base 2 "
         "on the tile path: m ln 2 + log(l), or the sink) agrees with the reference "
         "backward from the reference forward, and with itself bit for bit on 1 and 2 "
         "threads, on every path, for every option: none, causal, a bias with -inf, "
         "ALiBi, a softcap, a mask, sinks that dominate every row and sinks below every "
         "score, GQA");
    const int64_t T[3][2] = {{17, 17}, {113, 113}, {9, 40}};
    for (int t = 0; t < 3; t++)
        for (int o = 0; o < 9; o++) {
            problem p = {4, 2, T[t][0], T[t][1], 17, 3, 0, 0, 0, 0, 0, 0, 0};
            switch (o) {
            case 1: p.causal = 1; break;
            case 2: p.bias = 1, p.sink = 0.5f; break;
            case 3: p.alibi = 1, p.causal = 1; break;
            case 4: p.softcap = 0.7f, p.scale = 3.0f; break;
            case 5: p.mask = 1; break;
            case 6: p.sink = 12.0f; break; /* head 0's dominates, head 1's is far below */
            case 8: p.bias = 3; break;
            case 7: p.softcap = 5.0f, p.alibi = 1, p.sink = 3.0f, p.causal = 1; break;
            default: break;
            }
            one_problem(&p, 1);
        }
}

/* ---- 2^x where the other tests do not look ------------------------------------------ */

static double ulps(float got, double want)
{
    if (want == 0.0)
        return got == 0.0f ? 0.0 : INFINITY;
    const double ulp = ldexp(1.0, ilogb(want) - 23);
    return fabs((double)got - want) / ulp;
}

static void exp2_edges(void)
{
    TEST("the kernels' 2^x on every path is within 2 ulp at each half-integer boundary "
         "of its reduction (-0.5 .. -125.5, where r is +-1/2) and just inside -126, "
         "exactly 0 just below -126 and at -149, and within 2 ulp for small x > 0 on the "
         "vector paths (the backward's FMA gives x > 0 at a row's largest score)");
    enum { N = 126 + 6 };
    float x[N], y[N];
    for (int i = 0; i < 126; i++)
        x[i] = -0.5f - (float)i; /* -0.5 .. -125.5 */
    x[126] = nextafterf(-126.0f, 0.0f);
    x[127] = -125.9f;
    x[128] = nextafterf(-126.0f, -INFINITY);
    x[129] = -149.0f;
    x[130] = 0x1p-20f;
    x[131] = 3e-5f;
    for (int a = 0; a < 3; a++) {
        const attn__fused_kernel *k = attn__fused_kernel_for(ARCHS[a]);
        if (!k || !attn_arch_supported(ARCHS[a]))
            continue;
        k->exp2_nonpos(x, y, N);
        double worst = 0;
        int at = 0;
        for (int i = 0; i < 128; i++) {
            const double e = ulps(y[i], exp2((double)x[i]));
            if (!(e <= worst))
                worst = isnan(e) ? INFINITY : e, at = i;
        }
        if (!(worst <= 2.0))
            fprintf(stderr, "  %s: 2^%.9g = %.9g, want %.9g (%.2f ulp)\n",
                    attn_arch_name(k->arch), (double)x[at], (double)y[at],
                    exp2((double)x[at]), worst);
        CHECK(worst <= 2.0);
        if (!(y[128] == 0.0f && y[129] == 0.0f))
            fprintf(stderr, "  %s: 2^%.9g = %.9g and 2^-149 = %.9g, want 0 and 0\n",
                    attn_arch_name(k->arch), (double)x[128], (double)y[128], (double)y[129]);
        CHECK(y[128] == 0.0f && y[129] == 0.0f);
        if (ARCHS[a] != ATTN_ARCH_SCALAR)
            for (int i = 130; i < N; i++) {
                const double e = ulps(y[i], exp2((double)x[i]));
                if (!(e <= 2.0))
                    fprintf(stderr, "  %s: 2^%.9g = %.9g, want %.9g\n",
                            attn_arch_name(k->arch), (double)x[i], (double)y[i],
                            exp2((double)x[i]));
                CHECK(e <= 2.0);
            }
    }
}


/* ---- a 16-bit cache's batch growing with one workspace ----------------------------- */

static int64_t differ_bytes(const attn_tensor *a, const attn_tensor *b, size_t esz)
{
    int64_t n = 0;
    const unsigned char *x = a->data, *y = b->data;
    const int64_t m = numel(a);
    for (int64_t i = 0; i < m; i++)
        n += memcmp(x + i * esz, y + i * esz, esz) != 0;
    return n;
}

/* B sequences starting at the lengths pre[], each step appending tq keys to every
 * one and attending tq queries (the last tq positions), steps times, on one fused
 * path with `threads`. */
static void kv_grow(attn_dtype dt, attn_arch arch, int threads, int64_t cap, int64_t D,
                    int64_t tq, int steps, const int64_t *pre, int rope_on)
{
    enum { B = 4, H = 4, HKV = 2 };
    const char *path = attn_arch_name(arch);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = ATTN_IMPL_FUSED;
    ctx.arch = arch;
    ctx.threads = threads;
    const attn_kv_cache_config cfg = {B, HKV, cap, D, D, dt};
    attn_kv_cache *c = NULL;
    CHECK_INT(attn_kv_cache_create(&ctx, &cfg, NULL, 0, &c), ATTN_OK);
    if (!c) {
        fprintf(stderr, "  attn_kv_cache_create: %s\n", ctx.message);
        attn_ctx_release(&ctx);
        return;
    }
    attn_rope_params rope;
    attn_rope_params_init(&rope);
    const attn_rope_params *rp = rope_on ? &rope : NULL;
    float *kb = malloc((size_t)(HKV * cap * D) * sizeof *kb);
    float *vb = malloc((size_t)(HKV * cap * D) * sizeof *vb);
    for (int64_t b = 0; b < B; b++)
        if (pre[b] > 0) {
            tu_fill(kb, HKV * pre[b] * D, 300 + (uint64_t)b);
            tu_fill(vb, HKV * pre[b] * D, 400 + (uint64_t)b);
            attn_tensor k = tu_tensor4(kb, 1, HKV, pre[b], D), v = tu_tensor4(vb, 1, HKV, pre[b], D);
            CHECK_INT(attn_kv_cache_append(&ctx, c, b, &k, &v, rp), ATTN_OK);
        }
    float *qb = malloc((size_t)(B * H * tq * D) * sizeof *qb);
    tu_fill(qb, B * H * tq * D, 7);
    attn_tensor q32 = tu_tensor4(qb, B, H, tq, D), q, o, o1;
    CHECK_INT(attn_tensor_alloc(&ctx, &q, dt, 4, q32.shape), ATTN_OK);
    CHECK_INT(attn_tensor_convert(&ctx, &q32, &q), ATTN_OK);
    CHECK_INT(attn_tensor_alloc(&ctx, &o, dt, 4, q32.shape), ATTN_OK);
    CHECK_INT(attn_tensor_alloc(&ctx, &o1, dt, 4, q32.shape), ATTN_OK);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;

    /* The first step's keys go in before its workspace is sized, as a decoding
     * loop does; the workspace then serves every later step. */
    tu_fill(kb, B * HKV * tq * D, 500);
    tu_fill(vb, B * HKV * tq * D, 600);
    attn_tensor k = tu_tensor4(kb, B, HKV, tq, D), v = tu_tensor4(vb, B, HKV, tq, D);
    CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k, &v, rp), ATTN_OK);
    size_t bytes = 0;
    CHECK_INT(attn_kv_cache_workspace_size(&ctx, c, 0, &q, &p, rp, &o, NULL, &bytes), ATTN_OK);
    void *ws = NULL;
    CHECK_INT(posix_memalign(&ws, 64, bytes ? bytes : 64), 0);
    const attn_allocator orig = ctx.allocator;
    tu_counting count = {0};
    int64_t bad = 0;
    for (int st = 0; st < steps; st++) {
        if (st > 0) {
            tu_fill(kb, B * HKV * tq * D, 500 + (uint64_t)st);
            tu_fill(vb, B * HKV * tq * D, 600 + (uint64_t)st);
            CHECK_INT(attn_kv_cache_append(&ctx, c, 0, &k, &v, rp), ATTN_OK);
        }
        /* The batch with the first step's workspace and an allocator that counts. */
        ctx.workspace = ws;
        ctx.workspace_size = bytes;
        ctx.allocator.alloc = tu_count_alloc;
        ctx.allocator.free = tu_count_free;
        ctx.allocator.user = &count;
        const int rc = attn_kv_cache_attend(&ctx, c, 0, &q, &p, rp, &o, NULL);
        if (rc != ATTN_OK)
            fprintf(stderr, "  step %d [%s, %s, tq %lld]: %s\n", st, attn_dtype_name(dt), path,
                    (long long)tq, ctx.message);
        CHECK_INT(rc, ATTN_OK);
        ctx.workspace = NULL;
        ctx.workspace_size = 0;
        ctx.allocator = orig;
        /* Each sequence on its own, with the library's own scratch. */
        for (int64_t b = 0; b < B; b++) {
            attn_tensor qv, ov;
            attn_tensor_narrow(&ctx, &q, 0, b, 1, &qv);
            attn_tensor_narrow(&ctx, &o1, 0, b, 1, &ov);
            CHECK_INT(attn_kv_cache_attend(&ctx, c, b, &qv, &p, rp, &ov, NULL), ATTN_OK);
        }
        const int64_t n = differ_bytes(&o, &o1, 2);
        if (n)
            fprintf(stderr, "  step %d [%s, %s, %d threads, tq %lld, lengths %lld %lld %lld "
                    "%lld]: %lld values differ from each sequence's own attend\n",
                    st, attn_dtype_name(dt), path, threads, (long long)tq,
                    (long long)attn_kv_cache_length(c, 0), (long long)attn_kv_cache_length(c, 1),
                    (long long)attn_kv_cache_length(c, 2), (long long)attn_kv_cache_length(c, 3),
                    (long long)n);
        bad += n;
    }
    if (count.allocs)
        fprintf(stderr, "  [%s, %s, %d threads, tq %lld]: %lld allocations with the workspace\n",
                attn_dtype_name(dt), path, threads, (long long)tq, count.allocs);
    CHECK_INT(count.allocs, 0);
    CHECK_INT(bad, 0);
    free(ws);
    attn_tensor_free(&ctx, &q), attn_tensor_free(&ctx, &o), attn_tensor_free(&ctx, &o1);
    free(qb), free(kb), free(vb);
    attn_kv_cache_free(&ctx, c);
    attn_ctx_release(&ctx);
}

static void kv_growing_batch(void)
{
    TEST("a 16-bit cache's batch of 1 key, the capacity and lengths between (across the "
         "split layouts' thresholds), growing step after step, runs every step in the "
         "workspace sized at the first step (allocated to exactly that size), allocates "
         "nothing, and gives each sequence's own bits, on every fused path, 1 and 2 "
         "threads: 1 query row a step, and 12 (the tile path) with GQA and RoPE (and the "
         "bfloat16 kernels' paths where they run)");
    static const attn_dtype DT[2] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16};
    /* 1 query row: a sequence from 0 keys (1 at the first step), two that cross 512
     * and 1024 keys during the loop (where this shape's layouts change, as
     * test_kv_half's loop finds), and one that reaches the capacity. */
    const int64_t pre1[4] = {0, 505, 1017, 1100 - 8};
    /* 12 query rows: from 0 keys, two between, one that reaches the capacity. */
    const int64_t pre12[4] = {0, 57, 200, 330 - 12 * 4};
    /* The bfloat16 kernels' paths too where they run (ATTN_BF16_EMULATE=1 lets
     * avx512bf16 run on any AVX-512 CPU: test_review_today_bf16_emulated), since
     * with RoPE a bfloat16 q of more than 8 rows is planned as float32 there. */
    static const attn_arch KV_ARCHS[5] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512,
                                          ATTN_ARCH_AVX512_BF16, ATTN_ARCH_AMX};
    for (int d = 0; d < 2; d++)
        for (int a = 0; a < 5; a++) {
            if (!attn_arch_supported(KV_ARCHS[a]))
                continue;
            for (int t = 1; t <= 2; t++) {
                kv_grow(DT[d], KV_ARCHS[a], t, 1100, 64, 1, 8, pre1, 0);
                kv_grow(DT[d], KV_ARCHS[a], t, 330, 40, 12, 4, pre12, 1);
            }
        }
}

int main(void)
{
    exp2_edges();
    forward_edges();
    backward_from_fused_lse();
    kv_growing_batch();
    return check_summary("test_review_today");
}
