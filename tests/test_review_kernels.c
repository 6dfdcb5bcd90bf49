/*
 * test_review_kernels.c - the edges of the day's "same bits" kernel changes, each
 * against the reference kernels, on every instruction set this machine runs, with
 * 1 and 2 threads (which must give the same bits):
 *
 *   - the float32 fused forward: the query tile read by a gather (strided and
 *     transposed q), keys past what a tile's rows may see skipped (fk_keys_seen:
 *     causal top-left and bottom-right with Tq < Tk and Tq > Tk, windows on both
 *     sides, a window that hides whole query tiles), O's rescale folded into the
 *     weighted sum, out written by the last key tile (fk_out_direct: contiguous
 *     and transposed out, Tq and Dv off the block sizes), with sinks, softcap,
 *     ALiBi, a bias holding -inf, a boolean mask hiding the diagonal, lse and
 *     weights out, GQA/MQA, k/v/mask broadcast with stride 0, and NaN/inf in k and
 *     v at visible and hidden keys;
 *   - the fused backward on the same problems (dq, dk, dv, dsinks);
 *   - the kernels' e^x at its edges (0, -0, tiny, around -87.33 where it stops,
 *     -88, -100, -150, -FLT_MAX, -inf, NaN) in every lane of a vector and of a
 *     tail, now that the clamp before 2^n is gone;
 *   - the GEMM behind attn_linear with M, N, K = 1 .. 113, bias, transposed
 *     weights, and a caller workspace of exactly the planned size (under
 *     AddressSanitizer a read or write past it is reported).
 *
 * The reference's float32 sums run in another order than the fused kernels', so
 * the two are compared with a tolerance scaled to the largest reference value
 * (the fused kernels' own accuracy against a double oracle is test_fused_sweep's
 * and test_fused_backward's); NaN must sit exactly where the reference puts it.
 */
#define _POSIX_C_SOURCE 200112L
#include "attn.h"
#include "check.h"
#include "sdpa_fused.h"

#include <float.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float uni(void) /* uniform in [-1, 1), xorshift64* */
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (float)((double)((rng * 2685821657736338717ull) >> 11) / 9007199254740992.0 * 2 - 1);
}

static void fill(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = uni();
}

static const attn_arch ARCHS[3] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};

/* A tensor read as 4-D through its own strides (leading sizes of 1). */
typedef struct view4 {
    const float *p;
    int64_t sh[4], st[4];
} view4;

static view4 v4(const attn_tensor *t)
{
    view4 v = {(const float *)t->data, {1, 1, 1, 1}, {0, 0, 0, 0}};
    const int off = 4 - t->ndim;
    for (int a = 0; a < t->ndim; a++) {
        v.sh[off + a] = t->shape[a];
        v.st[off + a] = t->stride[a];
    }
    return v;
}

static float at(const view4 *v, int64_t a, int64_t b, int64_t c, int64_t d)
{
    return v->p[a * v->st[0] + b * v->st[1] + c * v->st[2] + d * v->st[3]];
}

static double max_abs(const view4 *v)
{
    double m = 0;
    for (int64_t a = 0; a < v->sh[0]; a++)
        for (int64_t b = 0; b < v->sh[1]; b++)
            for (int64_t c = 0; c < v->sh[2]; c++)
                for (int64_t d = 0; d < v->sh[3]; d++) {
                    const double x = fabs((double)at(v, a, b, c, d));
                    if (isfinite(x) && x > m)
                        m = x;
                }
    return m;
}

/* Compares got with want element by element: with exact, bit for bit (the
 * thread-count check); otherwise within tol * (1 + max |want|), NaN only against
 * NaN and an infinity only against the same one. Prints the first few mismatches
 * with both values and counts one check per call. */
static void compare(const char *what, const char *problem, const char *path,
                    const attn_tensor *got, const attn_tensor *want, double tol, int exact)
{
    view4 g = v4(got), w = v4(want);
    const double scale = 1.0 + max_abs(&w);
    int64_t bad = 0;
    for (int64_t a = 0; a < w.sh[0]; a++)
        for (int64_t b = 0; b < w.sh[1]; b++)
            for (int64_t c = 0; c < w.sh[2]; c++)
                for (int64_t d = 0; d < w.sh[3]; d++) {
                    const float x = at(&g, a, b, c, d), y = at(&w, a, b, c, d);
                    int ok;
                    if (exact)
                        ok = memcmp(&x, &y, sizeof x) == 0;
                    else if (isnan(y) || isnan(x))
                        ok = isnan(x) && isnan(y);
                    else if (isinf(y) || isinf(x))
                        ok = x == y;
                    else
                        ok = fabs((double)x - (double)y) <= tol * scale;
                    if (!ok && bad++ < 3)
                        fprintf(stderr,
                                "  %s [%s] %s at [%lld,%lld,%lld,%lld]: got %.9g, want %.9g%s\n",
                                what, problem, path, (long long)a, (long long)b, (long long)c,
                                (long long)d, (double)x, (double)y,
                                exact ? " (1 vs 2 threads, bits)" : "");
                }
    CHECK(bad == 0);
}

/* ---- attention ------------------------------------------------------------------ */

typedef struct problem {
    int64_t B, H, Hkv, Tq, Tk, D, Dv;
    int causal;           /* attn_causal */
    int64_t wl, wr;       /* window, or wl = -2 for none */
    float softcap;
    int alibi, bias, sinks, mask; /* mask: a bool [Tq, Tk] broadcast, diagonal hidden */
    int weights;
    int qview;            /* 0 contiguous, 1 transposed ([B,H,D,Tq] storage), 2 padded rows */
    int oview;            /* 0 contiguous, 1 transposed, 2 padded rows */
    int kvbcast;          /* k and v with batch stride 0 */
    int kview;            /* k, v (and the gradients) stored transposed, or not */
    int nonfinite;        /* NaN in a row of k, v, q and dO, inf in another v row */
    attn_empty_rows empty;
} problem;

static void describe(const problem *p, char *buf, size_t n)
{
    snprintf(buf, n,
             "B%lld H%lld/%lld Tq%lld Tk%lld D%lld Dv%lld causal%d win(%lld,%lld) cap%g "
             "alibi%d bias%d sinks%d mask%d w%d qv%d ov%d kv%d bc%d nf%d empty%d",
             (long long)p->B, (long long)p->H, (long long)p->Hkv, (long long)p->Tq,
             (long long)p->Tk, (long long)p->D, (long long)p->Dv, p->causal, (long long)p->wl,
             (long long)p->wr, (double)p->softcap, p->alibi, p->bias, p->sinks, p->mask,
             p->weights, p->qview, p->oview, p->kview, p->kvbcast, p->nonfinite, (int)p->empty);
}

/* A float32 tensor over fresh storage with the strides a view kind gives. */
static float *make4(attn_tensor *t, int64_t a, int64_t b, int64_t c, int64_t d, int view)
{
    int64_t n = a * b * c * (d + (view == 2 ? 5 : 0));
    float *x = malloc((size_t)n * sizeof *x);
    fill(x, n);
    memset(t, 0, sizeof *t);
    t->data = x;
    t->dtype = ATTN_DTYPE_F32;
    t->ndim = 4;
    t->shape[0] = a, t->shape[1] = b, t->shape[2] = c, t->shape[3] = d;
    if (view == 1) { /* stored [a, b, d, c]: the last axis has stride c */
        t->stride[0] = b * c * d, t->stride[1] = c * d, t->stride[2] = 1, t->stride[3] = c;
    } else {
        const int64_t row = d + (view == 2 ? 5 : 0);
        t->stride[0] = b * c * row, t->stride[1] = c * row, t->stride[2] = row,
        t->stride[3] = 1;
    }
    return x;
}

typedef struct fwd_out {
    attn_tensor out, lse, w;
    float *po, *pl, *pw;
    int status;
} fwd_out;

static void fwd_alloc(fwd_out *f, const problem *p)
{
    f->po = make4(&f->out, p->B, p->H, p->Tq, p->Dv, p->oview);
    f->pl = malloc((size_t)(p->B * p->H * p->Tq) * sizeof *f->pl);
    int64_t sh[3] = {p->B, p->H, p->Tq};
    attn_tensor_init(NULL, &f->lse, ATTN_DTYPE_F32, f->pl, 3, sh);
    f->pw = p->weights ? make4(&f->w, p->B, p->H, p->Tq, p->Tk, 0) : NULL;
}

static void fwd_free(fwd_out *f)
{
    free(f->po);
    free(f->pl);
    free(f->pw);
}

typedef struct inputs {
    attn_tensor q, k, v, bias, sinks, mask, dout;
    float *pq, *pk, *pv, *pb, *ps, *pdo;
    unsigned char *pm;
    attn_sdpa_params prm;
} inputs;

static void make_inputs(inputs *in, problem *p)
{
    in->pq = make4(&in->q, p->B, p->H, p->Tq, p->D, p->qview);
    in->pk = make4(&in->k, p->B, p->Hkv, p->Tk, p->D, p->kview);
    in->pv = make4(&in->v, p->B, p->Hkv, p->Tk, p->Dv, p->kview);
    in->pdo = make4(&in->dout, p->B, p->H, p->Tq, p->Dv, p->kview ? 2 : 0);
    if (p->kvbcast)
        in->k.stride[0] = in->v.stride[0] = 0;
    if (p->nonfinite) {
        /* Batch 0, kv head 0: k row Tk/3 NaN, v row Tk/2 NaN, v row Tk-1 inf. */
        in->pk[(p->Tk / 3) * in->k.stride[2]] = NAN;
        in->pv[(p->Tk / 2) * in->v.stride[2] + (p->Dv - 1) * in->v.stride[3]] = NAN;
        in->pv[(p->Tk - 1) * in->v.stride[2]] = INFINITY;
        /* a NaN in dO's row Tq/2 of batch 0, head 0 (the backward's), and one in
         * q's last row of batch 0, head 0 */
        in->pdo[(p->Tq / 2) * in->dout.stride[2]] = NAN;
        in->pq[(p->Tq - 1) * in->q.stride[2] + (p->D - 1) * in->q.stride[3]] = NAN;
    }
    attn_sdpa_params_init(&in->prm);
    attn_sdpa_params *r = &in->prm;
    r->causal = p->causal;
    if (p->wl != -2) {
        r->has_window = 1;
        r->window_left = p->wl;
        r->window_right = p->wr;
    }
    r->softcap = p->softcap;
    r->alibi = p->alibi;
    r->empty_rows = p->empty;
    in->pb = NULL, in->ps = NULL, in->pm = NULL;
    if (p->bias) { /* [1, H, Tq, Tk], with -inf on every 7th entry and all of row 1 */
        in->pb = make4(&in->bias, 1, p->H, p->Tq, p->Tk, 0);
        for (int64_t h = 0; h < p->H; h++)
            for (int64_t i = 0; i < p->Tq; i++)
                for (int64_t j = 0; j < p->Tk; j++)
                    if ((i * p->Tk + j) % 7 == 3 || (i == 1 && h == 0))
                        in->pb[(h * p->Tq + i) * p->Tk + j] = -INFINITY;
        r->bias = &in->bias;
    }
    if (p->sinks) {
        in->ps = malloc((size_t)p->H * sizeof *in->ps);
        fill(in->ps, p->H);
        int64_t sh[1] = {p->H};
        attn_tensor_init(NULL, &in->sinks, ATTN_DTYPE_F32, in->ps, 1, sh);
        r->sinks = &in->sinks;
    }
    if (p->mask) { /* [Tq, Tk], broadcast over B and H; the diagonal hidden */
        in->pm = malloc((size_t)(p->Tq * p->Tk));
        for (int64_t i = 0; i < p->Tq; i++)
            for (int64_t j = 0; j < p->Tk; j++)
                in->pm[i * p->Tk + j] = j != i && uni() > -0.8f;
        int64_t sh[2] = {p->Tq, p->Tk};
        attn_tensor_init(NULL, &in->mask, ATTN_DTYPE_BOOL, in->pm, 2, sh);
        r->mask = &in->mask;
    }
}

static void free_inputs(inputs *in)
{
    free(in->pq), free(in->pk), free(in->pv), free(in->pdo);
    free(in->pb), free(in->ps), free(in->pm);
}

static int run_fwd(attn_impl impl, attn_arch arch, int threads, inputs *in, const problem *p,
                   fwd_out *f)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = impl;
    ctx.arch = arch;
    ctx.threads = threads;
    attn_sdpa_params prm = in->prm;
    prm.lse = &f->lse;
    /* The fused path takes a caller workspace of exactly the planned size, so
     * that AddressSanitizer sees any access past it. */
    size_t bytes = 0;
    void *ws = NULL;
    if (impl == ATTN_IMPL_FUSED &&
        attn_sdpa_workspace_size(&ctx, &in->q, &in->k, &in->v, &prm, &f->out,
                                 p->weights ? &f->w : NULL, &bytes) == ATTN_OK &&
        bytes > 0 && posix_memalign(&ws, 64, bytes) == 0) {
        ctx.workspace = ws;
        ctx.workspace_size = bytes;
    }
    f->status = attn_sdpa(&ctx, &in->q, &in->k, &in->v, &prm, &f->out,
                          p->weights ? &f->w : NULL);
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
    g->pq = make4(&g->dq, p->B, p->H, p->Tq, p->D, p->kview);
    g->pk = make4(&g->dk, p->B, p->Hkv, p->Tk, p->D, p->kview);
    g->pv = make4(&g->dv, p->B, p->Hkv, p->Tk, p->Dv, p->kview);
    g->ps = malloc((size_t)p->H * sizeof *g->ps);
    int64_t sh[1] = {p->H};
    attn_tensor_init(NULL, &g->ds, ATTN_DTYPE_F32, g->ps, 1, sh);
}

static void bwd_free(bwd_out *g)
{
    free(g->pq), free(g->pk), free(g->pv), free(g->ps);
}

static int run_bwd(int ref, attn_arch arch, int threads, inputs *in, const problem *p,
                   fwd_out *f, bwd_out *g)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = ref ? ATTN_IMPL_REF : ATTN_IMPL_FUSED;
    ctx.arch = arch;
    ctx.threads = threads;
    attn_sdpa_params prm = in->prm;
    prm.lse = NULL; /* the forward's output; the backward takes it as an argument */
    attn_sdpa_grads gr = {&g->dq, &g->dk, &g->dv, NULL, p->sinks ? &g->ds : NULL};
    g->status = ref ? attn_sdpa_backward_ref(&ctx, &in->q, &in->k, &in->v, &prm, &f->out,
                                             &f->lse, &in->dout, &gr)
                    : attn_sdpa_backward(&ctx, &in->q, &in->k, &in->v, &prm, &f->out,
                                         &f->lse, &in->dout, &gr);
    if (g->status != ATTN_OK)
        fprintf(stderr, "  backward: %s\n", ctx.message);
    attn_ctx_release(&ctx);
    return g->status;
}

static void attention_problem(problem *p)
{
    char name[400];
    describe(p, name, sizeof name);
    inputs in;
    make_inputs(&in, p);
    fwd_out ref;
    fwd_alloc(&ref, p);
    run_fwd(ATTN_IMPL_REF, ATTN_ARCH_AUTO, 1, &in, p, &ref);
    /* The backward wherever the forward succeeded (the weights' problems excepted, to
     * keep the test short); with NaN and inf in k, v and dO, the NaN must land in
     * exactly the gradients' entries where the reference puts them. */
    const int do_bwd = ref.status == ATTN_OK && !p->weights;
    bwd_out gref;
    if (do_bwd) {
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
            run_fwd(ATTN_IMPL_FUSED, ARCHS[a], t + 1, &in, p, &f[t]);
            if (f[t].status != ref.status)
                fprintf(stderr, "  status [%s] %s: fused %d, reference %d\n", name, path,
                        f[t].status, ref.status);
            CHECK_INT(f[t].status, ref.status);
        }
        if (ref.status == ATTN_OK && f[0].status == ATTN_OK && f[1].status == ATTN_OK) {
            compare("out", name, path, &f[0].out, &ref.out, 2e-5, 0);
            compare("lse", name, path, &f[0].lse, &ref.lse, 2e-5, 0);
            compare("out", name, path, &f[1].out, &f[0].out, 0, 1);
            compare("lse", name, path, &f[1].lse, &f[0].lse, 0, 1);
            if (p->weights) {
                compare("weights", name, path, &f[0].w, &ref.w, 2e-5, 0);
                compare("weights", name, path, &f[1].w, &f[0].w, 0, 1);
            }
        }
        if (do_bwd) {
            bwd_out g[2];
            for (int t = 0; t < 2; t++) {
                bwd_alloc(&g[t], p);
                CHECK_INT(run_bwd(0, ARCHS[a], t + 1, &in, p, &ref, &g[t]), ATTN_OK);
            }
            compare("dq", name, path, &g[0].dq, &gref.dq, 1e-4, 0);
            compare("dk", name, path, &g[0].dk, &gref.dk, 1e-4, 0);
            compare("dv", name, path, &g[0].dv, &gref.dv, 1e-4, 0);
            compare("dq", name, path, &g[1].dq, &g[0].dq, 0, 1);
            compare("dk", name, path, &g[1].dk, &g[0].dk, 0, 1);
            compare("dv", name, path, &g[1].dv, &g[0].dv, 0, 1);
            if (p->sinks) {
                compare("dsinks", name, path, &g[0].ds, &gref.ds, 1e-4, 0);
                compare("dsinks", name, path, &g[1].ds, &g[0].ds, 0, 1);
            }
            bwd_free(&g[0]);
            bwd_free(&g[1]);
        }
        fwd_free(&f[0]);
        fwd_free(&f[1]);
    }
    if (do_bwd)
        bwd_free(&gref);
    fwd_free(&ref);
    free_inputs(&in);
}

static void attention(void)
{
    TEST("the fused forward and backward agree with the reference kernels, and with "
         "themselves bit for bit on 1 and 2 threads, on every path, where the day's "
         "changes have edges: tails of T, D and Dv, strided and transposed q, k, v, out, "
         "dO and gradients, "
         "k/v with batch stride 0, GQA and MQA, causal both ways with Tq < Tk and "
         "Tq > Tk, two-sided windows and a window hiding whole query tiles, sinks, "
         "softcap, ALiBi, a bias with -inf, a mask hiding the diagonal, lse and weights, "
         "NaN and inf in k and v (and NaN in dO: the gradients hold NaN exactly where the "
         "reference puts it)");
    /* Sizes: awkward ones around the tiles and vectors (1, 3, 17, 113, 130). */
    static const int64_t TS[][2] = {{1, 1}, {3, 17}, {17, 3}, {113, 113}, {17, 130},
                                    {130, 17}, {113, 200}, {200, 113}};
    static const int64_t DS[][2] = {{1, 1}, {3, 17}, {17, 3}, {40, 33}, {64, 64}, {16, 8}};
    int n = 0;
    for (int ti = 0; ti < 8; ti++)
        for (int opt = 0; opt < 14; opt++) {
            problem p;
            memset(&p, 0, sizeof p);
            const int64_t *ds = DS[(ti * 5 + opt) % 6];
            p.Tq = TS[ti][0], p.Tk = TS[ti][1], p.D = ds[0], p.Dv = ds[1];
            p.B = 1 + (opt % 2), p.H = (opt % 3 == 0) ? 4 : 2;
            p.Hkv = (opt % 3 == 0) ? 1 : (opt % 3 == 1 ? 2 : 1);
            p.wl = -2;
            p.empty = ATTN_EMPTY_ROWS_ZERO;
            p.qview = opt % 3;
            p.oview = (opt / 2) % 3;
            p.kvbcast = p.B > 1 && opt % 4 == 1;
            p.kview = (opt + ti) % 3 == 2;
            p.weights = opt % 5 == 2 && p.Tq * p.Tk < 20000;
            switch (opt) {
            case 0: p.causal = ATTN_CAUSAL_TOP_LEFT; break;
            case 1: p.causal = ATTN_CAUSAL_BOTTOM_RIGHT; break;
            case 2: p.causal = ATTN_CAUSAL_BOTTOM_RIGHT, p.wl = 5, p.wr = 0; break;
            case 3: p.wl = 9, p.wr = 4; break; /* both sides */
            case 13: p.wl = -1, p.wr = 2; break; /* unbounded on the left */
            case 4: p.wl = 0, p.wr = -1, p.bias = 1; break; /* unbounded on the right */
            case 5: /* top-left causal whose window ends before the diagonal's tile:
                     * with Tk < Tq, later query tiles see no key at all */
                p.causal = ATTN_CAUSAL_TOP_LEFT, p.wl = 2, p.wr = 0;
                p.empty = ATTN_EMPTY_ROWS_ERROR;
                break;
            case 6: p.causal = ATTN_CAUSAL_TOP_LEFT, p.softcap = 3.0f, p.sinks = 1; break;
            case 7: p.causal = ATTN_CAUSAL_BOTTOM_RIGHT, p.alibi = 1; break;
            case 8: p.causal = ATTN_CAUSAL_TOP_LEFT, p.mask = 1; break;
            case 9: p.causal = ATTN_CAUSAL_TOP_LEFT, p.nonfinite = 1; break;
            case 10: p.wl = 3, p.wr = 3, p.nonfinite = 1, p.sinks = 1; break;
            case 11: p.nonfinite = 1, p.softcap = 2.0f; break;
            case 12: p.causal = ATTN_CAUSAL_BOTTOM_RIGHT, p.alibi = 1, p.bias = 1; break;
            default: break;
            }
            if (p.qview == 1 && p.oview == 1 && p.Tq == 1)
                p.qview = 2;
            attention_problem(&p);
            n++;
        }
    fprintf(stderr, "  %d problems\n", n);
}

/* ---- e^x at its edges ------------------------------------------------------------ */

static void exp_edges(void)
{
    TEST("the fused kernels' e^x gives exactly 1 at 0, -0 and tiny x, is within 2 ulp "
         "and a normal float from -87.33 to 0, exactly +0 below -87.33 (-88, -100, "
         "-150, -FLT_MAX, -inf: the dropped clamp's range) and NaN for NaN, in every "
         "lane of a vector and of a tail, on every path");
    const float special[] = {0.0f, -0.0f, -1e-45f, -FLT_MIN, -1e-30f, -1e-7f, -0.5f,
                             -87.33f, nextafterf(-87.33f, 0.0f), nextafterf(-87.33f, -1e9f),
                             -87.3365f, -88.0f, -100.0f, -103.98f, -150.0f, -1000.0f,
                             -FLT_MAX, -INFINITY, NAN, -NAN};
    const int ns = (int)(sizeof special / sizeof special[0]);
    static const int lens[] = {1, 7, 16, 17, 33};
    for (int a = 0; a < 3; a++) {
        const attn__fused_kernel *k = attn__fused_kernel_for(ARCHS[a]);
        if (!attn_arch_supported(ARCHS[a]) || !k)
            continue;
        int bad = 0;
        for (int li = 0; li < 5; li++)
            for (int pos = 0; pos < lens[li]; pos++)
                for (int si = 0; si < ns; si++) {
                    float x[33], y[33];
                    for (int i = 0; i < lens[li]; i++)
                        x[i] = -1.0f;
                    x[pos] = special[si];
                    k->exp_nonpos(x, y, lens[li]);
                    for (int i = 0; i < lens[li]; i++) {
                        const float xi = x[i], yi = y[i];
                        const double want = exp((double)xi);
                        int ok;
                        if (isnan(xi))
                            ok = isnan(yi);
                        else if (xi < -87.33f)
                            ok = yi == 0.0f && !signbit(yi);
                        else if (fabsf(xi) < 1e-8f)
                            ok = yi == 1.0f;
                        else {
                            int e;
                            frexp(want, &e);
                            ok = fabs((double)yi - want) <= 2.0 * ldexp(1.0, e - 24) &&
                                 yi >= FLT_MIN && yi <= 1.0f;
                        }
                        if (!ok && bad++ < 5)
                            fprintf(stderr, "  exp %s: x = %.9g (lane %d of %d): got %.9g, "
                                            "want %.9g\n",
                                    attn_arch_name(ARCHS[a]), (double)xi, i, lens[li],
                                    (double)yi, want);
                    }
                }
        CHECK(bad == 0);
    }
}

/* ---- GEMM (attn_linear) ------------------------------------------------------------ */

static void linear_one(int64_t M, int64_t N, int64_t K, int bias, int wt)
{
    char name[120];
    snprintf(name, sizeof name, "M%lld N%lld K%lld bias%d wT%d", (long long)M, (long long)N,
             (long long)K, bias, wt);
    float *x = malloc((size_t)(M * K) * sizeof *x), *w = malloc((size_t)(N * K) * sizeof *w);
    float *b = malloc((size_t)N * sizeof *b);
    fill(x, M * K), fill(w, N * K), fill(b, N);
    attn_tensor tx, tw, tb, ty[3];
    int64_t sx[2] = {M, K}, sw[2] = {N, K}, sy[2] = {M, N}, sb[1] = {N};
    attn_tensor_init(NULL, &tx, ATTN_DTYPE_F32, x, 2, sx);
    attn_tensor_init(NULL, &tw, ATTN_DTYPE_F32, w, 2, sw);
    if (wt) { /* W [N, K] read from storage [K, N]: its last stride is N */
        tw.stride[0] = 1;
        tw.stride[1] = N;
    }
    attn_tensor_init(NULL, &tb, ATTN_DTYPE_F32, b, 1, sb);
    float *y[3];
    /* The double oracle. */
    float *yo = malloc((size_t)(M * N) * sizeof *yo);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = bias ? b[j] : 0.0;
            for (int64_t kk = 0; kk < K; kk++)
                s += (double)x[i * K + kk] * w[j * tw.stride[0] + kk * tw.stride[1]];
            yo[i * N + j] = (float)s;
        }
    attn_tensor to;
    attn_tensor_init(NULL, &to, ATTN_DTYPE_F32, yo, 2, sy);
    for (int a = 0; a < 3; a++) {
        if (!attn_arch_supported(ARCHS[a]))
            continue;
        for (int t = 0; t < 2; t++) {
            y[t] = malloc((size_t)(M * N) * sizeof *y[t]);
            attn_tensor_init(NULL, &ty[t], ATTN_DTYPE_F32, y[t], 2, sy);
            attn_ctx ctx;
            attn_ctx_init(&ctx);
            ctx.arch = ARCHS[a];
            ctx.threads = t + 1;
            size_t bytes = 0;
            void *ws = NULL;
            CHECK_INT(attn_linear_workspace_size(&ctx, &tx, &tw, bias ? &tb : NULL, &ty[t],
                                                 &bytes),
                      ATTN_OK);
            if (bytes > 0 && posix_memalign(&ws, 64, bytes) == 0) {
                ctx.workspace = ws;
                ctx.workspace_size = bytes;
            }
            CHECK_INT(attn_linear(&ctx, &tx, &tw, bias ? &tb : NULL, &ty[t]), ATTN_OK);
            free(ws);
            attn_ctx_release(&ctx);
        }
        /* float32 sums of K products of numbers below 1 in magnitude: a few ulp
         * of sqrt(K) at most, 1e-5 of the largest value for K <= 113. */
        compare("linear", name, attn_arch_name(ARCHS[a]), &ty[0], &to, 1e-5, 0);
        compare("linear", name, attn_arch_name(ARCHS[a]), &ty[1], &ty[0], 0, 1);
        free(y[0]);
        free(y[1]);
    }
    free(yo), free(x), free(w), free(b);
}

static void linear(void)
{
    TEST("attn_linear's GEMM matches a double oracle for M, N, K in 1 .. 113 (off every "
         "micro-tile and packing width), with and without bias, W contiguous and "
         "transposed, with a caller workspace of exactly the planned size, 1 and 2 "
         "threads the same bits, on every path");
    static const int64_t S[] = {1, 2, 3, 17, 33, 113};
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 6; j++) {
            const int64_t M = S[i], N = S[j], K = S[(i + 2 * j) % 6];
            linear_one(M, N, K, (i + j) % 2, (i * j) % 3 == 1);
        }
    linear_one(1, 1, 1, 1, 0);
    linear_one(1, 1, 1, 0, 1);
    linear_one(130, 200, 97, 1, 0); /* more than one 128 x 96 work item */
    linear_one(130, 200, 97, 0, 1);
}

int main(void)
{
    attention();
    exp_edges();
    linear();
    return check_summary("test_review_kernels");
}
