/*
 * test_fused_sweep.c - the fused kernel against the reference and a double-precision
 * oracle, over the sizes, masks, views, instruction sets and thread counts of
 * issue 5:
 *
 *   B in {1, 3}, H in {1, 2, 5}, Tq and Tk in {1, 3, 17, 64, 113, 255},
 *   D in {1, 4, 40, 64, 72, 128} (Dv = D, or for a third of the problems a value
 *   head dim of its own, Dv in {1, 17, 64, 130}), masks none / causal / padding /
 *   random / with fully masked rows, contiguous and strided views, every ISA path
 *   this machine can run, 1 and 2 threads.
 *
 * Sampling: every (Tq, Tk, D, mask kind) is run (1080 problems, so every size meets
 * every mask; under a sanitizer, 216, each size with one mask kind in turn); B, H, the view kind and whether weights are asked for cycle with
 * co-prime periods over those problems, so each of their values appears about
 * evenly at every size. Every problem runs on every path and both thread counts.
 *
 * The bound, per problem and per output (out, and weights when asked for):
 *
 *     max |fused - oracle| <= 2 * max |reference - oracle| + floor
 *
 * The reference is the naive float32 computation; its error against the double
 * oracle measures how hard the problem is for float32 (it grows with Tk and D). The
 * fused kernel sums in another order and uses its own exp (about 2 ulp against
 * libm's 0.5 ulp), so it may differ by a similar amount, hence the factor 2. The
 * floor, 2e-6, is 16 float32 ulps at 1.0 (outputs here are below 1 in magnitude
 * since v is uniform in [-1, 1), and weights are at most 1): it covers problems
 * where the reference happens to be exact (Tk = 1, or one visible key) while the
 * fused kernel rounds once or twice more.
 */
#include "attn.h"
#include "check.h"
#include "sdpa_contract.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FLOOR 2e-6

/* Under a sanitizer (CI runs this test under ThreadSanitizer and AddressSanitizer,
 * 10 to 20 times slower) each size meets one mask kind, in turn, instead of all
 * five: every value of every axis is still covered. */
#define SWEEP_QUICK CHECK_SANITIZED

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static double uni(void) /* uniform in [0, 1), xorshift64* */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

/* A float32 [d0, d1, d2, d3] tensor in one of three memory layouts:
 *   0: contiguous;
 *   1: memory [d0, d2, d1, d3] seen through a transpose of axes 1 and 2 (the heads
 *      split of multi-head attention);
 *   2: every other float along the last axis (stride 2), in padded memory. */
typedef struct view {
    attn_tensor t;
    float *mem;
} view;

static void view_make(view *vw, int kind, int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    const int64_t n = d0 * d1 * d2 * d3;
    vw->mem = calloc((size_t)(kind == 2 ? 2 * n : n), sizeof(float));
    attn_tensor *t = &vw->t;
    memset(t, 0, sizeof *t);
    t->data = vw->mem;
    t->dtype = ATTN_DTYPE_F32;
    t->ndim = 4;
    t->shape[0] = d0, t->shape[1] = d1, t->shape[2] = d2, t->shape[3] = d3;
    if (kind == 1) {
        t->stride[3] = 1, t->stride[1] = d3, t->stride[2] = d1 * d3, t->stride[0] = d1 * d2 * d3;
    } else {
        int64_t e = kind == 2 ? 2 : 1;
        t->stride[3] = e, t->stride[2] = e * d3, t->stride[1] = e * d2 * d3,
        t->stride[0] = e * d1 * d2 * d3;
    }
}

static float *view_at(view *vw, int64_t a, int64_t b, int64_t c, int64_t d)
{
    const int64_t *s = vw->t.stride;
    return vw->mem + a * s[0] + b * s[1] + c * s[2] + d * s[3];
}

enum { MASK_NONE, MASK_CAUSAL, MASK_PADDING, MASK_RANDOM, MASK_EMPTY_ROWS, MASK_KINDS };
static const char *mask_names[] = {"none", "causal", "padding", "random", "empty-rows"};

typedef struct problem {
    int64_t B, H, Tq, Tk, D, Dv;
    int mask_kind, view_kind, want_weights;
} problem;

typedef struct result {
    double err_out, err_w;
    int status;
} result;

/* One problem's inputs, the broadcast mask for the oracle, and the oracle's answer. */
typedef struct fixture {
    problem pb;
    view q, k, v;
    attn_tensor mask_t;
    uint8_t *mask;      /* the mask tensor's data, in its own (broadcast) shape */
    uint8_t *full_mask; /* [B, H, Tq, Tk] after broadcast and the causal flag */
    int causal_flag;
    double *o_out, *o_w; /* oracle [B, H, Tq, Dv], [B, H, Tq, Tk] */
    int empty_rows;      /* rows with no visible key */
} fixture;

static void fixture_make(fixture *f, const problem *pb)
{
    memset(f, 0, sizeof *f);
    f->pb = *pb;
    const int64_t B = pb->B, H = pb->H, Tq = pb->Tq, Tk = pb->Tk, D = pb->D, Dv = pb->Dv;
    view_make(&f->q, pb->view_kind, B, H, Tq, D);
    view_make(&f->k, pb->view_kind, B, H, Tk, D);
    view_make(&f->v, pb->view_kind, B, H, Tk, Dv);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            for (int64_t i = 0; i < Tq; i++)
                for (int64_t d = 0; d < D; d++)
                    *view_at(&f->q, b, h, i, d) = (float)(2.0 * uni() - 1.0);
            for (int64_t j = 0; j < Tk; j++) {
                for (int64_t d = 0; d < D; d++)
                    *view_at(&f->k, b, h, j, d) = (float)(2.0 * uni() - 1.0);
                for (int64_t d = 0; d < Dv; d++)
                    *view_at(&f->v, b, h, j, d) = (float)(2.0 * uni() - 1.0);
            }
        }

    /* The mask tensor, in a broadcast shape that depends on the kind. */
    int64_t ms[4] = {1, 1, 1, 1};
    int mndim = 4;
    switch (pb->mask_kind) {
    case MASK_NONE:
        break;
    case MASK_CAUSAL:
        if (Tq == Tk) {
            f->causal_flag = 1;
        } else { /* causal needs Tq == Tk; the same rule as an explicit mask */
            mndim = 2, ms[0] = Tq, ms[1] = Tk;
        }
        break;
    case MASK_PADDING: /* [B, 1, 1, Tk]: odd samples pad their last quarter of keys */
        ms[0] = B, ms[3] = Tk;
        f->causal_flag = Tq == Tk && (Tq % 2 == 1); /* padding AND causal, sometimes */
        break;
    case MASK_RANDOM: /* [H, Tq, Tk] (3-D, broadcast over B), about 70% visible */
        mndim = 3, ms[0] = H, ms[1] = Tq, ms[2] = Tk;
        break;
    case MASK_EMPTY_ROWS: /* [B, 1, Tq, Tk]: every third query row sees nothing */
        ms[0] = B, ms[2] = Tq, ms[3] = Tk;
        break;
    }
    if (pb->mask_kind != MASK_NONE && !(pb->mask_kind == MASK_CAUSAL && f->causal_flag)) {
        int64_t n = ms[0] * ms[1] * ms[2] * ms[3];
        f->mask = malloc((size_t)n);
        int64_t shape[4];
        for (int a = 0; a < mndim; a++)
            shape[a] = ms[a];
        attn_tensor_init(NULL, &f->mask_t, ATTN_DTYPE_BOOL, f->mask, mndim, shape);
        for (int64_t x = 0; x < n; x++) {
            int64_t j = x % Tk, rest = x / Tk;
            int64_t i = rest % Tq, outer = rest / Tq;
            uint8_t m = 1;
            if (pb->mask_kind == MASK_CAUSAL)
                m = j <= i;
            else if (pb->mask_kind == MASK_PADDING)
                m = !((x / Tk) % 2 == 1 && j >= Tk - Tk / 4);
            else if (pb->mask_kind == MASK_RANDOM)
                m = uni() < 0.7 || j == i % Tk; /* every row keeps one key */
            else if (pb->mask_kind == MASK_EMPTY_ROWS)
                m = (i % 3 != 1) && (uni() < 0.7 || j == (i + outer) % Tk);
            f->mask[x] = m;
        }
    }

    /* Broadcast for the oracle. */
    f->full_mask = malloc((size_t)(B * H * Tq * Tk));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Tq; i++)
                for (int64_t j = 0; j < Tk; j++) {
                    uint8_t m = 1;
                    if (f->mask) {
                        const int64_t *st = f->mask_t.stride;
                        int off = 4 - mndim;
                        int64_t idx[4] = {b, h, i, j};
                        int64_t o = 0;
                        for (int a = 0; a < mndim; a++)
                            o += (ms[a] == 1 ? 0 : idx[a + off]) * st[a];
                        m = f->mask[o];
                    }
                    if (f->causal_flag && j > i)
                        m = 0;
                    f->full_mask[((b * H + h) * Tq + i) * Tk + j] = m;
                }

    /* The oracle, in double, straight from softmax(q k^T * scale, masked) v. */
    f->o_out = calloc((size_t)(B * H * Tq * Dv), sizeof(double));
    f->o_w = calloc((size_t)(B * H * Tq * Tk), sizeof(double));
    double *row = malloc((size_t)Tk * sizeof(double));
    const double scale = 1.0 / sqrt((double)D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Tq; i++) {
                const uint8_t *mrow = f->full_mask + ((b * H + h) * Tq + i) * Tk;
                double mx = -INFINITY;
                for (int64_t j = 0; j < Tk; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < D; d++)
                        s += (double)*view_at(&f->q, b, h, i, d) *
                             (double)*view_at(&f->k, b, h, j, d);
                    row[j] = mrow[j] ? s * scale : -INFINITY;
                    if (row[j] > mx)
                        mx = row[j];
                }
                double *orow = f->o_out + ((b * H + h) * Tq + i) * Dv;
                double *wrow = f->o_w + ((b * H + h) * Tq + i) * Tk;
                if (mx == -INFINITY) {
                    f->empty_rows++;
                    continue; /* zeros */
                }
                double sum = 0;
                for (int64_t j = 0; j < Tk; j++) {
                    row[j] = mrow[j] ? exp(row[j] - mx) : 0.0;
                    sum += row[j];
                }
                for (int64_t j = 0; j < Tk; j++) {
                    wrow[j] = row[j] / sum;
                    for (int64_t d = 0; d < Dv; d++)
                        orow[d] += wrow[j] * (double)*view_at(&f->v, b, h, j, d);
                }
            }
    free(row);
}

static void fixture_free(fixture *f)
{
    free(f->q.mem), free(f->k.mem), free(f->v.mem);
    free(f->mask), free(f->full_mask), free(f->o_out), free(f->o_w);
}

/* Runs one kernel on the fixture and measures its error against the oracle. */
static result run_one(fixture *f, attn_impl impl, attn_arch arch, int threads,
                      attn_empty_rows empty_rows, char *msg, size_t msg_size)
{
    const problem *pb = &f->pb;
    const int64_t B = pb->B, H = pb->H, Tq = pb->Tq, Tk = pb->Tk, Dv = pb->Dv;
    result r = {0, 0, 0};
    float *out = malloc((size_t)(B * H * Tq * Dv) * sizeof(float));
    float *w = pb->want_weights ? malloc((size_t)(B * H * Tq * Tk) * sizeof(float)) : NULL;
    /* NaN fill: a kernel that forgets to write an element fails the check. */
    for (int64_t x = 0; x < B * H * Tq * Dv; x++)
        out[x] = NAN;
    for (int64_t x = 0; w && x < B * H * Tq * Tk; x++)
        w[x] = NAN;
    attn_tensor to, tw;
    const int64_t os[4] = {B, H, Tq, Dv}, wsh[4] = {B, H, Tq, Tk};
    attn_tensor_init(NULL, &to, ATTN_DTYPE_F32, out, 4, os);
    if (w)
        attn_tensor_init(NULL, &tw, ATTN_DTYPE_F32, w, 4, wsh);
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = impl;
    ctx.arch = arch;
    ctx.threads = threads;
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.mask = f->mask ? &f->mask_t : NULL;
    p.causal = f->causal_flag;
    p.empty_rows = empty_rows;
    r.status = attn_sdpa(&ctx, &f->q.t, &f->k.t, &f->v.t, &p, &to, w ? &tw : NULL);
    if (msg)
        snprintf(msg, msg_size, "%s", ctx.message);
    if (r.status == ATTN_OK) {
        for (int64_t x = 0; x < B * H * Tq * Dv; x++) {
            double e = fabs((double)out[x] - f->o_out[x]);
            if (!(e <= r.err_out))
                r.err_out = isnan(e) ? INFINITY : e;
        }
        for (int64_t x = 0; w && x < B * H * Tq * Tk; x++) {
            double e = fabs((double)w[x] - f->o_w[x]);
            if (!(e <= r.err_w))
                r.err_w = isnan(e) ? INFINITY : e;
        }
    }
    free(out);
    free(w);
    return r;
}

/* ---- The options of SPEC section 6 ----------------------------------------------
 *
 * A second sweep, over the options the fused kernel takes on top of masks: GQA
 * ratios 1, 2, 4 and H (MQA), top-left and bottom-right causal with Tq < Tk,
 * Tq == Tk and Tq > Tk, windows (some hiding whole rows), softcap, ALiBi (default and
 * caller slopes), biases in every broadcast shape with -inf entries, sinks, the
 * log-sum-exp, and a random mask on top. The first problems take each option
 * alone, at every size; the rest draw combinations. Sizes cross both of the
 * kernel's paths: Tq <= 8 runs the row path, larger Tq the tile path with several
 * query and key tiles (64 each). Problems with rows that see no key run in the zero
 * mode, and also in the default mode, where every path must report the empty row
 * (unless a sink takes its weight). The bound is the one above, per output: out,
 * weights and the log-sum-exp, the last with its floor scaled by its magnitude
 * (it is a log of a sum plus a max, so its rounding is relative). Under a
 * sanitizer only every other single-option problem runs. */

enum {
    OPT_GQA = 1, OPT_CAUSAL_TL = 2, OPT_CAUSAL_BR = 4, OPT_WINDOW = 8, OPT_SOFTCAP = 16,
    OPT_ALIBI = 32, OPT_BIAS = 64, OPT_SINKS = 128, OPT_MASK = 256, OPT_KINDS = 9
};

typedef struct opt_problem {
    int64_t B, H, Hkv, Tq, Tk, D, Dv;
    int causal, has_window;
    int64_t wl, wr;
    float softcap;
    int alibi;        /* 0 off, 1 default slopes, 2 caller slopes */
    int bias_kind;    /* 0 none, 1 [Tk], 2 [1, H, 1, Tk], 3 [B, 1, Tq, Tk], 4 [B, H, Tq, Tk] */
    int sinks, mask, want_weights;
} opt_problem;

typedef struct opt_fixture {
    opt_problem pb;
    float *q, *k, *v, *slopes, *sinks, *bias; /* the bias in its own shape */
    uint8_t *mask;                             /* [B, 1, Tq, Tk] */
    int64_t bshape[4];
    double *o_out, *o_w, *o_lse;
    int empty_rows;
} opt_fixture;

static float *uniform_array(int64_t n, double lo, double hi)
{
    float *a = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t x = 0; x < n; x++)
        a[x] = (float)(lo + (hi - lo) * uni());
    return a;
}

static double oracle_slope(const opt_fixture *f, int64_t h)
{
    if (f->pb.alibi == 2)
        return f->slopes[h];
    if (f->pb.alibi == 0)
        return 0.0;
    /* The paper's default, rounded to float32 as the library's is. */
    int64_t m = 1;
    while (m * 2 <= f->pb.H)
        m *= 2;
    return (float)(h < m ? pow(2.0, -8.0 * (double)(h + 1) / (double)m)
                         : pow(2.0, -8.0 * (double)(2 * (h - m) + 1) / (double)(2 * m)));
}

static void opt_fixture_make(opt_fixture *f, const opt_problem *pb)
{
    memset(f, 0, sizeof *f);
    f->pb = *pb;
    const int64_t B = pb->B, H = pb->H, Hkv = pb->Hkv, Tq = pb->Tq, Tk = pb->Tk, D = pb->D,
                  Dv = pb->Dv;
    f->q = uniform_array(B * H * Tq * D, -1, 1);
    f->k = uniform_array(B * Hkv * Tk * D, -1, 1);
    f->v = uniform_array(B * Hkv * Tk * Dv, -1, 1);
    f->slopes = uniform_array(H, 0.01, 0.3);
    f->sinks = uniform_array(H, -1, 3);
    int64_t *bs = f->bshape;
    bs[0] = bs[1] = bs[2] = 1, bs[3] = Tk;
    if (pb->bias_kind == 2)
        bs[1] = H;
    if (pb->bias_kind == 3)
        bs[0] = B, bs[2] = Tq;
    if (pb->bias_kind == 4)
        bs[0] = B, bs[1] = H, bs[2] = Tq;
    const int64_t nb = bs[0] * bs[1] * bs[2] * bs[3];
    f->bias = uniform_array(nb, -2, 2);
    for (int64_t x = 0; x < nb; x++)
        if (uni() < 0.1)
            f->bias[x] = -INFINITY;
    f->mask = malloc((size_t)(B * Tq * Tk));
    for (int64_t x = 0; x < B * Tq * Tk; x++)
        f->mask[x] = uni() < 0.75;

    f->o_out = calloc((size_t)(B * H * Tq * Dv), sizeof(double));
    f->o_w = calloc((size_t)(B * H * Tq * Tk), sizeof(double));
    f->o_lse = calloc((size_t)(B * H * Tq), sizeof(double));
    double *sc = malloc((size_t)Tk * sizeof(double));
    int *vis = malloc((size_t)Tk * sizeof(int));
    const double scale = 1.0 / sqrt((double)D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t hk = h / (H / Hkv);
            const double slope = oracle_slope(f, h);
            const double sink = pb->sinks ? f->sinks[h] : -INFINITY;
            for (int64_t i = 0; i < Tq; i++) {
                const int64_t ip = i + Tk - Tq, row = (b * H + h) * Tq + i;
                double m = sink;
                int nvis = 0;
                for (int64_t j = 0; j < Tk; j++) {
                    double x = 0;
                    for (int64_t d = 0; d < D; d++)
                        x += (double)f->q[row * D + d] * (double)f->k[((b * Hkv + hk) * Tk + j) * D + d];
                    x *= (double)(float)scale;
                    if (pb->softcap > 0)
                        x = pb->softcap * tanh(x / pb->softcap);
                    double bias = 0;
                    if (pb->bias_kind)
                        bias = f->bias[((bs[0] > 1 ? b : 0) * bs[1] + (bs[1] > 1 ? h : 0)) * bs[2] * bs[3] +
                                       (bs[2] > 1 ? i : 0) * bs[3] + j];
                    x += bias - slope * fabs((double)(ip - j));
                    int ok = bias != -INFINITY;
                    if ((pb->causal == ATTN_CAUSAL_TOP_LEFT && j > i) ||
                        (pb->causal == ATTN_CAUSAL_BOTTOM_RIGHT && j > ip))
                        ok = 0;
                    if (pb->has_window && ((pb->wl >= 0 && j < ip - pb->wl) ||
                                           (pb->wr >= 0 && j > ip + pb->wr)))
                        ok = 0;
                    if (pb->mask && !f->mask[(b * Tq + i) * Tk + j])
                        ok = 0;
                    vis[j] = ok;
                    sc[j] = x;
                    if (ok) {
                        nvis++;
                        m = x > m ? x : m;
                    }
                }
                if (nvis == 0) {
                    f->empty_rows++;
                    f->o_lse[row] = sink; /* zeros out and weights */
                    continue;
                }
                double sum = pb->sinks ? exp(sink - m) : 0.0;
                for (int64_t j = 0; j < Tk; j++)
                    sum += vis[j] ? exp(sc[j] - m) : 0.0;
                f->o_lse[row] = m + log(sum);
                for (int64_t j = 0; j < Tk; j++) {
                    const double w = vis[j] ? exp(sc[j] - m) / sum : 0.0;
                    f->o_w[row * Tk + j] = w;
                    for (int64_t e = 0; w != 0 && e < Dv; e++)
                        f->o_out[row * Dv + e] += w * (double)f->v[((b * Hkv + hk) * Tk + j) * Dv + e];
                }
            }
        }
    free(sc);
    free(vis);
}

static void opt_fixture_free(opt_fixture *f)
{
    free(f->q), free(f->k), free(f->v), free(f->slopes), free(f->sinks), free(f->bias);
    free(f->mask), free(f->o_out), free(f->o_w), free(f->o_lse);
}

typedef struct opt_result {
    double err_out, err_w, err_lse; /* err_lse relative to 1 + |lse| */
    int status;
} opt_result;

static void worse(double *acc, double e)
{
    if (!(e <= *acc))
        *acc = isnan(e) ? INFINITY : e;
}

/* Runs f's problem; when n_chunks is given, also says how many key chunks the
 * plan of that call splits the keys into (0: not split). */
static opt_result opt_run_chunks(const opt_fixture *f, attn_impl impl, attn_arch arch,
                                 int threads, attn_empty_rows empty_rows, int64_t *n_chunks)
{
    const opt_problem *pb = &f->pb;
    const int64_t B = pb->B, H = pb->H, Tq = pb->Tq, Tk = pb->Tk;
    const int64_t no = B * H * Tq * pb->Dv, nw = B * H * Tq * Tk, nl = B * H * Tq;
    opt_result r = {0, 0, 0, 0};
    float *out = malloc((size_t)no * sizeof(float)), *lse = malloc((size_t)nl * sizeof(float));
    float *w = pb->want_weights ? malloc((size_t)nw * sizeof(float)) : NULL;
    for (int64_t x = 0; x < no; x++)
        out[x] = NAN;
    for (int64_t x = 0; x < nl; x++)
        lse[x] = NAN;
    for (int64_t x = 0; w && x < nw; x++)
        w[x] = NAN;
    attn_tensor tq, tk, tv, to, tw, tl, tm, tb, tsl, tsk;
    const int64_t qs[4] = {B, H, Tq, pb->D}, ks[4] = {B, pb->Hkv, Tk, pb->D};
    const int64_t vs[4] = {B, pb->Hkv, Tk, pb->Dv}, os[4] = {B, H, Tq, pb->Dv};
    const int64_t wsh[4] = {B, H, Tq, Tk}, ls[3] = {B, H, Tq}, ms[4] = {B, 1, Tq, Tk};
    const int64_t hs[1] = {H};
    attn_tensor_init(NULL, &tq, ATTN_DTYPE_F32, f->q, 4, qs);
    attn_tensor_init(NULL, &tk, ATTN_DTYPE_F32, f->k, 4, ks);
    attn_tensor_init(NULL, &tv, ATTN_DTYPE_F32, f->v, 4, vs);
    attn_tensor_init(NULL, &to, ATTN_DTYPE_F32, out, 4, os);
    attn_tensor_init(NULL, &tl, ATTN_DTYPE_F32, lse, 3, ls);
    attn_tensor_init(NULL, &tm, ATTN_DTYPE_BOOL, f->mask, 4, ms);
    if (pb->bias_kind == 1)
        attn_tensor_init(NULL, &tb, ATTN_DTYPE_F32, f->bias, 1, f->bshape + 3);
    else
        attn_tensor_init(NULL, &tb, ATTN_DTYPE_F32, f->bias, 4, f->bshape);
    attn_tensor_init(NULL, &tsl, ATTN_DTYPE_F32, f->slopes, 1, hs);
    attn_tensor_init(NULL, &tsk, ATTN_DTYPE_F32, f->sinks, 1, hs);
    if (w)
        attn_tensor_init(NULL, &tw, ATTN_DTYPE_F32, w, 4, wsh);
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.causal = pb->causal;
    p.has_window = pb->has_window;
    p.window_left = pb->wl;
    p.window_right = pb->wr;
    p.softcap = pb->softcap;
    p.alibi = pb->alibi != 0;
    p.alibi_slopes = pb->alibi == 2 ? &tsl : NULL;
    p.bias = pb->bias_kind ? &tb : NULL;
    p.sinks = pb->sinks ? &tsk : NULL;
    p.mask = pb->mask ? &tm : NULL;
    p.lse = &tl;
    p.empty_rows = empty_rows;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = impl;
    ctx.arch = arch;
    ctx.threads = threads;
    if (n_chunks) {
        attn__sdpa_shapes s;
        attn__sdpa_plan plan;
        *n_chunks = -1;
        if (attn__sdpa_prepare(&ctx, &tq, &tk, &tv, &p, &to, w ? &tw : NULL, &s) == ATTN_OK &&
            attn__sdpa_plan_for_ctx(&ctx, &s, &plan) == ATTN_OK)
            *n_chunks = plan.n_chunks;
    }
    r.status = attn_sdpa(&ctx, &tq, &tk, &tv, &p, &to, w ? &tw : NULL);
    if (r.status == ATTN_OK) {
        for (int64_t x = 0; x < no; x++)
            worse(&r.err_out, fabs((double)out[x] - f->o_out[x]));
        for (int64_t x = 0; w && x < nw; x++)
            worse(&r.err_w, fabs((double)w[x] - f->o_w[x]));
        for (int64_t x = 0; x < nl; x++) /* equal infinities (an empty row's -inf) match */
            worse(&r.err_lse, (double)lse[x] == f->o_lse[x]
                                  ? 0.0
                                  : fabs((double)lse[x] - f->o_lse[x]) / (1.0 + fabs(f->o_lse[x])));
    }
    free(out), free(lse), free(w);
    return r;
}

static opt_result opt_run(const opt_fixture *f, attn_impl impl, attn_arch arch, int threads,
                          attn_empty_rows empty_rows)
{
    return opt_run_chunks(f, impl, arch, threads, empty_rows, NULL);
}

/* Problem n of the options sweep: options alone first (one per problem, every size
 * in turn), then combinations. */
static void opt_problem_make(int n, int n_alone, opt_problem *pb)
{
    static const int64_t Ts[][2] = {{1, 200}, {5, 17}, {8, 8}, {17, 5}, {64, 64},
                                    {113, 200}, {200, 113}, {150, 150}};
    static const int64_t Ds[][2] = {{8, 8}, {40, 40}, {64, 64}, {64, 24}, {13, 32}};
    static const int64_t wins[] = {-1, 0, 3, 40, 100};
    memset(pb, 0, sizeof *pb);
    const int size = n % 8;
    pb->Tq = Ts[size][0], pb->Tk = Ts[size][1];
    pb->D = Ds[n % 5][0], pb->Dv = Ds[n % 5][1];
    pb->B = 1 + n % 2;
    pb->H = n % 3 == 0 ? 8 : 4;
    pb->want_weights = n % 3 != 1;
    const int opts = n < n_alone ? 1 << (n / 8 % OPT_KINDS) : (int)(uni() * 512);
    static const int ratios[] = {2, 4, 0 /* H: MQA */};
    pb->Hkv = opts & OPT_GQA ? (ratios[n % 3] ? pb->H / ratios[n % 3] : 1) : pb->H;
    pb->causal = opts & OPT_CAUSAL_BR ? ATTN_CAUSAL_BOTTOM_RIGHT
                 : opts & OPT_CAUSAL_TL ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_NONE;
    if (opts & OPT_WINDOW) {
        pb->has_window = 1;
        pb->wl = wins[(n / 3) % 5];
        pb->wr = wins[(n / 7) % 5];
        if (pb->wl < 0 && pb->wr < 0)
            pb->wl = 3;
    }
    pb->softcap = opts & OPT_SOFTCAP ? (n % 2 ? 1.5f : 20.0f) : 0.0f;
    pb->alibi = opts & OPT_ALIBI ? 1 + n % 2 : 0;
    pb->bias_kind = opts & OPT_BIAS ? 1 + n % 4 : 0;
    pb->sinks = (opts & OPT_SINKS) != 0;
    pb->mask = (opts & OPT_MASK) != 0;
    /* Keep the largest problems from dominating the run time. */
    if (pb->Tq * pb->Tk >= 100 * 100)
        pb->B = 1, pb->H = 4, pb->Hkv = pb->Hkv > 4 ? 4 : pb->Hkv;
}

static void options_sweep(const attn_arch *archs, int n_archs)
{
    TEST("with every option of SPEC section 6, alone and combined (GQA 1, 2, 4, H; both "
         "causal alignments with Tq <, ==, > Tk; windows hiding whole rows; softcap; ALiBi; "
         "broadcast biases with -inf; sinks; log-sum-exp; a mask on top), the fused kernel "
         "stays within twice the reference's error (plus the floor) on every path and "
         "thread count, in the zero mode and the default");
    const int n_alone = 8 * OPT_KINDS, n_total = SWEEP_QUICK ? n_alone : n_alone + 150;
    double worst_ratio = 0;
    char worst[400] = "";
    int with_empty = 0;
    int problems = 0;
    for (int n = 0; n < n_total; n++) {
        /* Under a sanitizer, each option alone at four sizes (two on each path). */
        if (SWEEP_QUICK && n % 2)
            continue;
        problems++;
        opt_problem pb;
        opt_problem_make(n, n_alone, &pb);
        opt_fixture f;
        opt_fixture_make(&f, &pb);
        with_empty += f.empty_rows > 0;
        const attn_empty_rows er = f.empty_rows ? ATTN_EMPTY_ROWS_ZERO : ATTN_EMPTY_ROWS_ERROR;
        const opt_result ref = opt_run(&f, ATTN_IMPL_REF, ATTN_ARCH_AUTO, 1, er);
        CHECK_INT(ref.status, ATTN_OK);
        char what[300];
        snprintf(what, sizeof what,
                 "problem %d: B=%lld H=%lld Hkv=%lld Tq=%lld Tk=%lld D=%lld Dv=%lld causal=%d "
                 "window=%s%lld,%lld softcap=%g alibi=%d bias=%d sinks=%d mask=%d weights=%d",
                 n, (long long)pb.B, (long long)pb.H, (long long)pb.Hkv, (long long)pb.Tq,
                 (long long)pb.Tk, (long long)pb.D, (long long)pb.Dv, pb.causal,
                 pb.has_window ? "" : "off:", (long long)pb.wl, (long long)pb.wr,
                 (double)pb.softcap, pb.alibi, pb.bias_kind, pb.sinks, pb.mask, pb.want_weights);
        for (int a = 0; a < n_archs; a++)
            for (int t = 1; t <= 2; t++) {
                const opt_result fu = opt_run(&f, ATTN_IMPL_FUSED, archs[a], t, er);
                CHECK_INT(fu.status, ATTN_OK);
                const double bo = 2 * ref.err_out + FLOOR, bw = 2 * ref.err_w + FLOOR;
                const double bl = 2 * ref.err_lse + FLOOR;
                if (!(fu.err_out <= bo) || !(fu.err_w <= bw) || !(fu.err_lse <= bl))
                    fprintf(stderr, "  %s arch=%s threads=%d: out err %.3g (bound %.3g), "
                                    "weights err %.3g (bound %.3g), lse err %.3g (bound %.3g)\n",
                            what, attn_arch_name(archs[a]), t, fu.err_out, bo, fu.err_w, bw,
                            fu.err_lse, bl);
                CHECK(fu.err_out <= bo);
                CHECK(fu.err_w <= bw);
                CHECK(fu.err_lse <= bl);
                if (fu.err_out / bo > worst_ratio) {
                    worst_ratio = fu.err_out / bo;
                    snprintf(worst, sizeof worst, "%s arch=%s", what, attn_arch_name(archs[a]));
                }
            }
        /* The default mode: an empty row is an error on every path, unless a sink
         * takes its weight. */
        if (f.empty_rows)
            for (int a = 0; a < n_archs; a++) {
                const opt_result fe = opt_run(&f, ATTN_IMPL_FUSED, archs[a], 2, ATTN_EMPTY_ROWS_ERROR);
                const opt_result re = opt_run(&f, ATTN_IMPL_REF, ATTN_ARCH_AUTO, 1, ATTN_EMPTY_ROWS_ERROR);
                CHECK_INT(fe.status, pb.sinks ? ATTN_OK : ATTN_STATUS_EMPTY_ROW);
                CHECK_INT(fe.status, re.status);
            }
        opt_fixture_free(&f);
    }
    fprintf(stderr, "%d option problems (%d with rows that see no key); worst error / bound = "
                    "%.3f at %s\n", problems, with_empty, worst_ratio, worst);
    /* Enough rows that see no key to test both modes (46 in the full sweep). */
    CHECK(with_empty >= (SWEEP_QUICK ? 1 : 20));
}

/* ---- Split-key decoding ---------------------------------------------------------
 *
 * A third sweep, over decoding shapes: Tq = 1, 3 and 8 query rows (the row path)
 * against Tk = 1, 3, 17, 113, 4097 and 8193 keys, with few (batch, key/value head)
 * pairs, so that the long key axes take the split-key path (the test checks that
 * the plan splits them) and the short ones the unsplit row path. Each option of
 * SPEC section 6 alone, then all of them at once, with GQA, on every path and 1
 * and 2 threads, against the float64 oracle with the same bound as above; one
 * problem per key length asks for the weights, which the split path leaves to the
 * unsplit one. Under a sanitizer the longest key axis is left out, and so are
 * some of the short ones. */
static void split_sweep(const attn_arch *archs, int n_archs)
{
    TEST("split-key decoding (Tq 1, 3, 8 against Tk 1, 3, 17, 113, 4097, 8193) with each "
         "option of SPEC section 6 alone and all at once, GQA included, stays within twice "
         "the reference's error (plus the floor) on every path and 1 and 2 threads, and the "
         "long key axes are split");
    static const int64_t Tks[] = {1, 3, 17, 113, 4097, 8193};
    static const int64_t Tqs[] = {1, 3, 8};
    static const int64_t Ds[][2] = {{64, 64}, {13, 24}, {128, 128}, {40, 17}};
    const int n_tk = SWEEP_QUICK ? 5 : 6, n_opts = OPT_KINDS + 2;
    int problems = 0, split = 0, with_empty = 0;
    double worst_ratio = 0;
    char worst[400] = "";
    for (int it = 0; it < n_tk; it++)
        for (int o = 0; o < n_opts; o++) {
            const int n = it * n_opts + o;
            /* Under a sanitizer: every option at 4097 keys (split), every other one
             * at 1 and 17 keys, none at 3 and 113. */
            if (SWEEP_QUICK && (it == 1 || it == 3 || (it < 4 && o % 2)))
                continue;
            opt_problem pb;
            memset(&pb, 0, sizeof pb);
            pb.Tk = Tks[it];
            pb.Tq = Tqs[n % 3];
            pb.D = Ds[n % 4][0], pb.Dv = Ds[n % 4][1];
            pb.B = 1 + n % 2;
            pb.H = 8;
            /* Option kind o alone; o = OPT_KINDS: all at once; the last: none, with
             * the weights asked for. */
            const int opts = o < OPT_KINDS ? 1 << o : o == OPT_KINDS ? 511 : 0;
            pb.want_weights = o == OPT_KINDS + 1;
            pb.Hkv = opts & OPT_GQA ? (n % 2 ? 2 : 1) : (n % 2 ? 8 : 4);
            if (!(opts & OPT_GQA) && pb.Hkv != pb.H)
                pb.Hkv = pb.H;
            pb.causal = opts & OPT_CAUSAL_BR ? ATTN_CAUSAL_BOTTOM_RIGHT
                        : opts & OPT_CAUSAL_TL ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_NONE;
            if (opts & OPT_WINDOW) {
                /* A left window of 100 keys: with bottom-right causal only the last
                 * chunk is seen, so most chunks have nothing to add. */
                pb.has_window = 1, pb.wl = 100, pb.wr = n % 2 ? 0 : -1;
            }
            pb.softcap = opts & OPT_SOFTCAP ? (n % 2 ? 1.5f : 20.0f) : 0.0f;
            pb.alibi = opts & OPT_ALIBI ? 1 + n % 2 : 0;
            pb.bias_kind = opts & OPT_BIAS ? 1 + n % 4 : 0;
            pb.sinks = (opts & OPT_SINKS) != 0;
            pb.mask = (opts & OPT_MASK) != 0;
            opt_fixture f;
            opt_fixture_make(&f, &pb);
            problems++;
            with_empty += f.empty_rows > 0;
            const attn_empty_rows er = f.empty_rows ? ATTN_EMPTY_ROWS_ZERO : ATTN_EMPTY_ROWS_ERROR;
            const opt_result ref = opt_run(&f, ATTN_IMPL_REF, ATTN_ARCH_AUTO, 1, er);
            CHECK_INT(ref.status, ATTN_OK);
            for (int a = 0; a < n_archs; a++)
                for (int t = 1; t <= 2; t++) {
                    int64_t chunks = -1;
                    const opt_result fu = opt_run_chunks(&f, ATTN_IMPL_FUSED, archs[a], t, er,
                                                         &chunks);
                    CHECK_INT(fu.status, ATTN_OK);
                    /* The long key axes are split unless the weights are asked for. */
                    if (pb.Tk > 4000 && !pb.want_weights) {
                        if (chunks < 2)
                            fprintf(stderr, "  problem %d (Tk=%lld): %lld chunks\n", n,
                                    (long long)pb.Tk, (long long)chunks);
                        CHECK(chunks >= 2);
                    }
                    split += chunks >= 2;
                    const double bo = 2 * ref.err_out + FLOOR, bw = 2 * ref.err_w + FLOOR;
                    const double bl = 2 * ref.err_lse + FLOOR;
                    char what[300];
                    snprintf(what, sizeof what,
                             "split problem %d: B=%lld H=%lld Hkv=%lld Tq=%lld Tk=%lld D=%lld "
                             "Dv=%lld opts=%d chunks=%lld arch=%s threads=%d",
                             n, (long long)pb.B, (long long)pb.H, (long long)pb.Hkv,
                             (long long)pb.Tq, (long long)pb.Tk, (long long)pb.D,
                             (long long)pb.Dv, opts, (long long)chunks,
                             attn_arch_name(archs[a]), t);
                    if (!(fu.err_out <= bo) || !(fu.err_w <= bw) || !(fu.err_lse <= bl))
                        fprintf(stderr, "  %s: out err %.3g (bound %.3g), weights err %.3g "
                                        "(bound %.3g), lse err %.3g (bound %.3g)\n",
                                what, fu.err_out, bo, fu.err_w, bw, fu.err_lse, bl);
                    CHECK(fu.err_out <= bo);
                    CHECK(fu.err_w <= bw);
                    CHECK(fu.err_lse <= bl);
                    if (fu.err_out / bo > worst_ratio) {
                        worst_ratio = fu.err_out / bo;
                        snprintf(worst, sizeof worst, "%s", what);
                    }
                }
            /* The default mode: an empty row is an error on the split path too,
             * unless a sink takes its weight. */
            if (f.empty_rows)
                for (int a = 0; a < n_archs; a++) {
                    const opt_result fe =
                        opt_run(&f, ATTN_IMPL_FUSED, archs[a], 2, ATTN_EMPTY_ROWS_ERROR);
                    CHECK_INT(fe.status, pb.sinks ? ATTN_OK : ATTN_STATUS_EMPTY_ROW);
                }
            opt_fixture_free(&f);
        }
    fprintf(stderr, "%d decoding problems (%d runs split, %d with rows that see no key); "
                    "worst error / bound = %.3f at %s\n",
            problems, split, with_empty, worst_ratio, worst);
    CHECK(split > 0);
}

/* The split path takes a GQA group's query heads four at a time, then two at a time,
 * then one (fused_split.h): groups of 2, 3, 6 and 12 put heads on every one of those
 * boundaries. Each runs with no mask or bias (where the heads share their passes over
 * K and V) and with bottom-right causal, against the double oracle within the
 * sweep's bound, on every path with 1 and 2 threads. */
static void split_groups(const attn_arch *archs, int n_archs)
{
    TEST("split-key decoding with GQA groups of 2, 3, 6 and 12 query heads per key/value "
         "head (four, two and one at a time) matches the double oracle on every path");
    static const int64_t groups[][2] = {{4, 2}, {3, 1}, {6, 1}, {12, 1}};
    static const int64_t dims[][2] = {{128, 128}, {113, 17}};
    int runs = 0, split = 0;
    for (int gi = 0; gi < 4; gi++)
        for (int n = 0; n < 4; n++) {
            opt_problem pb;
            memset(&pb, 0, sizeof pb);
            pb.B = 1, pb.H = groups[gi][0], pb.Hkv = groups[gi][1];
            pb.Tq = n % 2 ? 3 : 1;
            pb.Tk = 1031;
            pb.D = dims[n / 2][0], pb.Dv = dims[n / 2][1];
            pb.causal = n % 2 ? ATTN_CAUSAL_BOTTOM_RIGHT : ATTN_CAUSAL_NONE;
            opt_fixture f;
            opt_fixture_make(&f, &pb);
            const opt_result ref = opt_run(&f, ATTN_IMPL_REF, ATTN_ARCH_AUTO, 1,
                                           ATTN_EMPTY_ROWS_ERROR);
            CHECK_INT(ref.status, ATTN_OK);
            const double bo = 2 * ref.err_out + FLOOR, bl = 2 * ref.err_lse + FLOOR;
            for (int a = 0; a < n_archs; a++)
                for (int t = 1; t <= 2; t++) {
                    int64_t chunks = -1;
                    const opt_result fu = opt_run_chunks(&f, ATTN_IMPL_FUSED, archs[a], t,
                                                         ATTN_EMPTY_ROWS_ERROR, &chunks);
                    CHECK_INT(fu.status, ATTN_OK);
                    runs++, split += chunks >= 2;
                    if (!(fu.err_out <= bo) || !(fu.err_lse <= bl))
                        fprintf(stderr, "  H=%lld Hkv=%lld Tq=%lld D=%lld Dv=%lld causal=%d "
                                        "arch=%s threads=%d: out err %.3g (bound %.3g), lse "
                                        "err %.3g (bound %.3g)\n",
                                (long long)pb.H, (long long)pb.Hkv, (long long)pb.Tq,
                                (long long)pb.D, (long long)pb.Dv, pb.causal,
                                attn_arch_name(archs[a]), t, fu.err_out, bo, fu.err_lse, bl);
                    CHECK(fu.err_out <= bo);
                    CHECK(fu.err_lse <= bl);
                }
            opt_fixture_free(&f);
        }
    fprintf(stderr, "%d grouped runs, %d split\n", runs, split);
    CHECK_INT(split, runs);
}

int main(void)
{
    static const int64_t Bs[] = {1, 3}, Hs[] = {1, 2, 5};
    static const int64_t Ts[] = {1, 3, 17, 64, 113, 255};
    static const int64_t Ds[] = {1, 4, 40, 64, 72, 128};
    static const int64_t Dvs[] = {1, 17, 64, 130};
    attn_arch archs[3];
    int n_archs = 0;
    const attn_arch all[3] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
    for (int a = 0; a < 3; a++)
        if (attn_arch_supported(all[a]))
            archs[n_archs++] = all[a];
    fprintf(stderr, "paths on this machine:");
    for (int a = 0; a < n_archs; a++)
        fprintf(stderr, " %s", attn_arch_name(archs[a]));
    fprintf(stderr, "\n");

    TEST("the fused kernel stays within twice the reference's float32 error (plus 2e-6) "
         "on every path, size, mask, view and thread count of the sweep");
    double worst_ratio = 0;
    char worst[400] = "";
    int n = 0, problems = 0;
    for (int iq = 0; iq < 6; iq++)
        for (int ik = 0; ik < 6; ik++)
            for (int id = 0; id < 6; id++)
                for (int mk = 0; mk < MASK_KINDS; mk++, n++) {
                    if (SWEEP_QUICK && mk != (iq + ik + id) % MASK_KINDS)
                        continue;
                    problem pb;
                    pb.Tq = Ts[iq], pb.Tk = Ts[ik], pb.D = Ds[id];
                    pb.Dv = (iq + 2 * ik + 3 * id + mk) % 3 == 0 ? Dvs[(iq + id + mk) % 4]
                                                                 : pb.D;
                    pb.mask_kind = mk;
                    /* Co-prime periods 2, 3 and 7 (and 11 over 3 view kinds) spread the
                     * other axes evenly over sizes and masks. */
                    pb.B = Bs[n % 2];
                    pb.H = Hs[n % 3];
                    pb.view_kind = (n / 11) % 3;
                    pb.want_weights = n % 7 < 3;
                    /* Keep the largest problems from dominating the run time. */
                    if (pb.Tq * pb.Tk * pb.D > 255 * 255 * 64)
                        pb.B = 1, pb.H = pb.H > 2 ? 2 : pb.H;
                    fixture f;
                    fixture_make(&f, &pb);
                    problems++;
                    const attn_empty_rows er =
                        f.empty_rows ? ATTN_EMPTY_ROWS_ZERO : ATTN_EMPTY_ROWS_ERROR;
                    result ref = run_one(&f, ATTN_IMPL_REF, ATTN_ARCH_AUTO, 1, er, NULL, 0);
                    CHECK_INT(ref.status, ATTN_OK);
                    for (int a = 0; a < n_archs; a++)
                        for (int t = 1; t <= 2; t++) {
                            result fu = run_one(&f, ATTN_IMPL_FUSED, archs[a], t, er, NULL, 0);
                            char what[200];
                            snprintf(what, sizeof what,
                                     "B=%lld H=%lld Tq=%lld Tk=%lld D=%lld Dv=%lld mask=%s view=%d "
                                     "weights=%d arch=%s threads=%d",
                                     (long long)pb.B, (long long)pb.H, (long long)pb.Tq,
                                     (long long)pb.Tk, (long long)pb.D, (long long)pb.Dv,
                                     mask_names[pb.mask_kind],
                                     pb.view_kind, pb.want_weights, attn_arch_name(archs[a]), t);
                            CHECK_INT(fu.status, ATTN_OK);
                            const double bo = 2 * ref.err_out + FLOOR, bw = 2 * ref.err_w + FLOOR;
                            if (!(fu.err_out <= bo) || !(fu.err_w <= bw))
                                fprintf(stderr, "  %s: out err %.3g (bound %.3g), weights err %.3g "
                                                "(bound %.3g)\n",
                                        what, fu.err_out, bo, fu.err_w, bw);
                            CHECK(fu.err_out <= bo);
                            CHECK(fu.err_w <= bw);
                            double ratio = fu.err_out / bo;
                            if (ratio > worst_ratio) {
                                worst_ratio = ratio;
                                snprintf(worst, sizeof worst, "%s (err %.3g, ref err %.3g)", what,
                                         fu.err_out, ref.err_out);
                            }
                        }
                    /* An empty row is an error by default, on every path, with the
                     * reference's status. */
                    if (f.empty_rows) {
                        for (int a = 0; a < n_archs; a++) {
                            char msg[ATTN_MESSAGE_SIZE];
                            result fe = run_one(&f, ATTN_IMPL_FUSED, archs[a], 2,
                                                ATTN_EMPTY_ROWS_ERROR, msg, sizeof msg);
                            CHECK_INT(fe.status, ATTN_STATUS_EMPTY_ROW);
                            CHECK_STR_CONTAINS(msg, "query 1 of batch 0, head 0");
                        }
                    }
                    fixture_free(&f);
                }
    fprintf(stderr, "%d problems; worst error / bound = %.3f at %s\n", problems, worst_ratio,
            worst);
    options_sweep(archs, n_archs);
    split_sweep(archs, n_archs);
    split_groups(archs, n_archs);
    return check_summary("test_fused_sweep");
}
