/*
 * test_backward_extremes.c - the backward at the edges of float32: scores near
 * 1e11 and beyond (huge q and k, scales of 2^90 and 2^-90, negative and zero
 * scales), a log-sum-exp given as -inf, +inf or NaN, sinks of +-inf, softcaps
 * and ALiBi slopes over huge scores, bias rows of -inf, and q, k, v, dO near
 * FLT_MAX; on the reference and every fused path this machine runs, 1 and 2
 * threads, grouped-query heads (H = 4, Hkv = 2; the one-pass form, and the
 * two-pass form with a bias) and key tiles past the first (80 keys).
 *
 * Each case checks, per gradient (dq, dk, dv, dbias, dsinks):
 *   - 1 and 2 threads give the same bits on every fused path;
 *   - an element is finite on a fused path exactly where it is in the reference
 *     (a NaN or inf reaches the same gradients);
 *   - where the float64 oracle below is finite everywhere (the case's inputs are
 *     finite and so are its answers), the reference and the fused paths stay
 *     within 2 max|reference - oracle| + 64 FLT_EPSILON max|oracle| of it
 *     (docs/gradients.md's rule with a floor on the answers' own scale, which this
 *     file's few large terms make the scale of the sums).
 *
 * The huge-score cases have scores exact in float32 (small integers times powers
 * of two), so float32 and float64 see the same scores; their weights are 0, 1 or
 * 1/n (ties at the row's max), which a one-FMA exponent from two rounded
 * factors, S (scale log2 e) - L log2 e, gets wrong by thousands of units there.
 */
#include "attn.h"
#include "check.h"
#include "test_util.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Two key/value heads make two (b, key/value head) items: the one-pass form runs
 * unless dbias is wanted (a bias), which takes the two-pass form. */
enum { B_ = 1, H_ = 4, HKV_ = 2, G_ = H_ / HKV_, T_ = 80, D_ = 4 };
enum { NQ = B_ * H_ * T_ * D_, NK = B_ * HKV_ * T_ * D_, NB = B_ * H_ * T_ * T_ };

typedef struct xcase {
    const char *name;
    float q[NQ], k[NK], v[NK], dout[NQ];
    float bias[NB];
    float sinks[H_], slopes[H_];
    int causal, has_bias, has_sinks, has_alibi;
    float scale, softcap;
    /* When set, overwrites the forward's lse of row (h, i) before the backward. */
    int lse_row_h, lse_row_i;
    float lse_value;
    int set_lse;
} xcase;

static int visible(const xcase *c, int64_t h, int64_t i, int64_t j)
{
    if (c->causal && j > i)
        return 0;
    if (c->has_bias && c->bias[(h * T_ + i) * T_ + j] == -INFINITY)
        return 0;
    return 1;
}

/* The forward and backward in double from the float32 inputs (docs/gradients.md's
 * formulas). Returns 0 when some answer is not a finite float32. */
static int oracle(const xcase *c, double *dq, double *dk, double *dv, double *db, double *ds)
{
    static double s[T_], P[T_], O[D_], dP[T_];
    memset(dq, 0, sizeof(double) * NQ);
    memset(dk, 0, sizeof(double) * NK);
    memset(dv, 0, sizeof(double) * NK);
    memset(db, 0, sizeof(double) * NB);
    memset(ds, 0, sizeof(double) * H_);
    for (int h = 0; h < H_; h++)
        for (int i = 0; i < T_; i++) {
            const float *q = c->q + (h * T_ + i) * D_, *dout = c->dout + (h * T_ + i) * D_;
            const float *kh = c->k + h / G_ * T_ * D_, *vh = c->v + h / G_ * T_ * D_;
            double *dkh = dk + h / G_ * T_ * D_, *dvh = dv + h / G_ * T_ * D_;
            double m = c->has_sinks ? c->sinks[h] : -INFINITY;
            int n = 0;
            for (int j = 0; j < T_; j++) {
                if (!visible(c, h, i, j))
                    continue;
                double x = 0.0;
                for (int d = 0; d < D_; d++)
                    x += (double)q[d] * kh[j * D_ + d];
                x *= c->scale;
                if (c->softcap > 0.0f)
                    x = c->softcap * tanh(x / c->softcap);
                if (c->has_bias)
                    x += c->bias[(h * T_ + i) * T_ + j];
                if (c->has_alibi)
                    x -= (double)c->slopes[h] * fabs((double)(i - j));
                s[j] = x;
                m = x > m ? x : m;
                n++;
            }
            if (n == 0)
                continue;
            double l = c->has_sinks ? exp(c->sinks[h] - m) : 0.0;
            for (int j = 0; j < T_; j++)
                if (visible(c, h, i, j))
                    l += exp(s[j] - m);
            const double L = m + log(l);
            for (int d = 0; d < D_; d++)
                O[d] = 0.0;
            for (int j = 0; j < T_; j++) {
                P[j] = visible(c, h, i, j) ? exp(s[j] - L) : 0.0;
                for (int d = 0; d < D_; d++)
                    O[d] += P[j] * vh[j * D_ + d];
            }
            double delta = 0.0;
            for (int d = 0; d < D_; d++)
                delta += dout[d] * O[d];
            if (c->has_sinks)
                ds[h] -= exp(c->sinks[h] - L) * delta;
            for (int j = 0; j < T_; j++) {
                if (!visible(c, h, i, j))
                    continue;
                dP[j] = 0.0;
                for (int d = 0; d < D_; d++) {
                    dP[j] += (double)dout[d] * vh[j * D_ + d];
                    dvh[j * D_ + d] += P[j] * dout[d];
                }
                double g = P[j] * (dP[j] - delta);
                db[(h * T_ + i) * T_ + j] = g;
                if (c->softcap > 0.0f) {
                    double x = 0.0;
                    for (int d = 0; d < D_; d++)
                        x += (double)q[d] * kh[j * D_ + d];
                    const double t = tanh(x * c->scale / c->softcap);
                    g *= 1.0 - t * t;
                }
                for (int d = 0; d < D_; d++) {
                    dq[(h * T_ + i) * D_ + d] += c->scale * g * kh[j * D_ + d];
                    dkh[j * D_ + d] += c->scale * g * q[d];
                }
            }
        }
    const double *all[5] = {dq, dk, dv, db, ds};
    const int n5[5] = {NQ, NK, NK, NB, H_};
    for (int x = 0; x < 5; x++)
        for (int e = 0; e < n5[x]; e++)
            if (!(fabs(all[x][e]) <= FLT_MAX))
                return 0;
    return 1;
}

typedef struct grads {
    float dq[NQ], dk[NK], dv[NK], db[NB], ds[H_];
} grads;

static attn_tensor t_bias, t_sinks, t_slopes;

static void params_of(xcase *c, attn_sdpa_params *p)
{
    attn_sdpa_params_init(p);
    p->empty_rows = ATTN_EMPTY_ROWS_ZERO;
    p->causal = c->causal ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_NONE;
    p->has_scale = 1;
    p->scale = c->scale;
    p->softcap = c->softcap;
    const int64_t sh[1] = {H_};
    if (c->has_bias) {
        t_bias = tu_tensor4(c->bias, B_, H_, T_, T_);
        p->bias = &t_bias;
    }
    if (c->has_sinks) {
        attn_tensor_init(NULL, &t_sinks, ATTN_DTYPE_F32, c->sinks, 1, sh);
        p->sinks = &t_sinks;
    }
    if (c->has_alibi) {
        attn_tensor_init(NULL, &t_slopes, ATTN_DTYPE_F32, c->slopes, 1, sh);
        p->alibi = 1;
        p->alibi_slopes = &t_slopes;
    }
}

static int run_backward(xcase *c, const float *out, const float *lse, attn_arch arch,
                        int threads, grads *g)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.arch = arch;
    ctx.threads = threads;
    attn_sdpa_params p;
    params_of(c, &p);
    attn_tensor q = tu_tensor4(c->q, B_, H_, T_, D_), k = tu_tensor4(c->k, B_, HKV_, T_, D_);
    attn_tensor v = tu_tensor4(c->v, B_, HKV_, T_, D_);
    attn_tensor to = tu_tensor4((float *)out, B_, H_, T_, D_);
    attn_tensor tl = tu_tensor3((float *)lse, B_, H_, T_);
    attn_tensor tdo = tu_tensor4(c->dout, B_, H_, T_, D_);
    attn_tensor dq = tu_tensor4(g->dq, B_, H_, T_, D_), dk = tu_tensor4(g->dk, B_, HKV_, T_, D_);
    attn_tensor dv = tu_tensor4(g->dv, B_, HKV_, T_, D_), db = tu_tensor4(g->db, B_, H_, T_, T_);
    attn_tensor dsk;
    const int64_t sh[1] = {H_};
    attn_tensor_init(NULL, &dsk, ATTN_DTYPE_F32, g->ds, 1, sh);
    attn_sdpa_grads gr = {&dq, &dk, &dv, c->has_bias ? &db : NULL, c->has_sinks ? &dsk : NULL};
    memset(g, 0, sizeof *g);
    const int rc = arch == ATTN_ARCH_REF
                       ? attn_sdpa_backward_ref(&ctx, &q, &k, &v, &p, &to, &tl, &tdo, &gr)
                       : attn_sdpa_backward(&ctx, &q, &k, &v, &p, &to, &tl, &tdo, &gr);
    if (rc != ATTN_OK)
        fprintf(stderr, "   %s: backward on %s: %s\n", c->name, attn_arch_name(arch), ctx.message);
    attn_ctx_release(&ctx);
    return rc;
}

static const attn_arch fused_archs[] = {ATTN_ARCH_SCALAR, ATTN_ARCH_AVX2, ATTN_ARCH_AVX512};
static int problems = 0;

static void check_case(xcase *c)
{
    static float out[NQ], lse[B_ * H_ * T_];
    static grads ref, g1, g2;
    static double o5[5][NB];
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.impl = ATTN_IMPL_REF;
    attn_sdpa_params p;
    params_of(c, &p);
    attn_tensor q = tu_tensor4(c->q, B_, H_, T_, D_), k = tu_tensor4(c->k, B_, HKV_, T_, D_);
    attn_tensor v = tu_tensor4(c->v, B_, HKV_, T_, D_), to = tu_tensor4(out, B_, H_, T_, D_);
    attn_tensor tl = tu_tensor3(lse, B_, H_, T_);
    p.lse = &tl;
    CHECK_INT(attn_sdpa(&ctx, &q, &k, &v, &p, &to, NULL), ATTN_OK);
    attn_ctx_release(&ctx);
    if (c->set_lse)
        lse[c->lse_row_h * T_ + c->lse_row_i] = c->lse_value;
    const int finite_in = !c->set_lse;
    const int oracle_ok = finite_in && oracle(c, o5[0], o5[1], o5[2], o5[3], o5[4]);
    CHECK_INT(run_backward(c, out, lse, ATTN_ARCH_REF, 1, &ref), ATTN_OK);

    const char *names[5] = {"dq", "dk", "dv", "dbias", "dsinks"};
    const int n5[5] = {NQ, NK, NK, c->has_bias ? NB : 0, c->has_sinks ? H_ : 0};
    const float *r5[5] = {ref.dq, ref.dk, ref.dv, ref.db, ref.ds};
    double eref[5] = {0}, scale5[5] = {0};
    if (oracle_ok)
        for (int x = 0; x < 5; x++)
            for (int e = 0; e < n5[x]; e++) {
                /* Not fmax, which would pass over a NaN. */
                const double d = fabs(r5[x][e] - o5[x][e]);
                eref[x] = d <= eref[x] ? eref[x] : d;
                scale5[x] = fmax(scale5[x], fabs(o5[x][e]));
            }
    for (size_t a = 0; a < sizeof fused_archs / sizeof fused_archs[0]; a++) {
        if (!attn_arch_supported(fused_archs[a]))
            continue;
        CHECK_INT(run_backward(c, out, lse, fused_archs[a], 1, &g1), ATTN_OK);
        CHECK_INT(run_backward(c, out, lse, fused_archs[a], 2, &g2), ATTN_OK);
        const float *f5[5] = {g1.dq, g1.dk, g1.dv, g1.db, g1.ds};
        const float *t5[5] = {g2.dq, g2.dk, g2.dv, g2.db, g2.ds};
        for (int x = 0; x < 5; x++) {
            int bits = 1, cls = 0, first = -1;
            double err = 0.0;
            for (int e = 0; e < n5[x]; e++) {
                if (memcmp(&f5[x][e], &t5[x][e], sizeof(float)) != 0)
                    bits = 0;
                const int bad = isfinite(f5[x][e]) != isfinite(r5[x][e]);
                if (bad && first < 0)
                    first = e;
                cls += bad;
                const double d = fabs(f5[x][e] - o5[x][e]);
                if (oracle_ok && !(d <= err))
                    err = d;
            }
            const double bound = 2.0 * eref[x] + 64.0 * FLT_EPSILON * scale5[x];
            const int ok = bits && cls == 0 && (!oracle_ok || err <= bound);
            if (!ok)
                fprintf(stderr,
                        "   %s on %s, %s: %d elements' class differs from the reference "
                        "(first %d: %g vs %g), error %.3g bound %.3g (reference %.3g), "
                        "1 and 2 threads %s\n",
                        c->name, attn_arch_name(fused_archs[a]), names[x], cls, first,
                        first >= 0 ? f5[x][first] : 0.0, first >= 0 ? r5[x][first] : 0.0, err,
                        bound, eref[x], bits ? "agree" : "DIFFER");
            CHECK(ok);
        }
    }
    problems++;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static int small_int(int lo, int hi)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (int)((rng >> 33) % (uint64_t)(hi - lo + 1));
}

/* Inputs whose scores are exact in float32: q and k small integers times 2^eq and
 * 2^ek, v and dO small integers over 8. */
static void fill_exact(xcase *c, int eq, int ek)
{
    memset(c, 0, sizeof *c);
    for (int e = 0; e < NQ; e++) {
        c->q[e] = ldexpf((float)small_int(-2, 2), eq);
        c->dout[e] = (float)small_int(-8, 8) / 8.0f;
    }
    for (int e = 0; e < NK; e++) {
        c->k[e] = ldexpf((float)small_int(-2, 2), ek);
        c->v[e] = (float)small_int(-8, 8) / 8.0f;
    }
    c->scale = 1.0f;
}

static void huge_scores(void)
{
    static xcase c;
    const struct {
        const char *name;
        int eq, ek;
        float scale;
    } sets[] = {
        {"scores ~2^40 (q 2^20, k 2^18)", 20, 18, 1.0f},
        {"scores ~2^36, scale 1", 18, 16, 1.0f},
        {"scale 2^90 on small integers", 0, 0, 0x1p90f},
        {"scale -2^90", 0, 0, -0x1p90f},
        {"scale 2^-90 on q, k of 2^60", 60, 60, 0x1p-90f},
        {"scores ~2^20", 10, 8, 1.0f},
        {"scores ~2^16", 8, 6, 1.0f},
        {"scores ~2^13", 6, 5, 1.0f},
        {"scores ~2^11", 5, 4, 1.0f},
        {"scores ~2^9", 4, 3, 1.0f},
        {"scores ~2^8", 4, 2, 1.0f},
        {"scores ~2^7", 3, 2, 1.0f},
        {"scores ~2^6", 3, 1, 1.0f},
        {"scores ~2^5", 2, 1, 1.0f},
        {"scale 0", 0, 0, 0.0f},
    };
    for (size_t t = 0; t < sizeof sets / sizeof sets[0]; t++)
        for (int opt = 0; opt < 6; opt++) {
            fill_exact(&c, sets[t].eq, sets[t].ek);
            c.scale = sets[t].scale;
            char name[160];
            static const char *const on[] = {"", ", causal", ", sinks", ", bias",
                                             ", softcap 30", ", alibi"};
            snprintf(name, sizeof name, "%s%s", sets[t].name, on[opt]);
            c.name = name;
            c.causal = opt == 1;
            if (opt == 2) {
                c.has_sinks = 1;
                c.sinks[0] = 0.5f;
                c.sinks[1] = -3.0f;
                c.sinks[2] = 2.0f;
                c.sinks[3] = -0.25f;
            }
            if (opt == 3) {
                c.has_bias = 1;
                for (int e = 0; e < NB; e++)
                    c.bias[e] = (float)small_int(-4, 4);
            }
            if (opt == 4)
                c.softcap = 30.0f;
            if (opt == 5) {
                c.has_alibi = 1;
                c.slopes[0] = 1e9f;
                c.slopes[1] = 0.25f;
                c.slopes[2] = 0.0f;
                c.slopes[3] = 1e-9f;
            }
            check_case(&c);
        }
}

/* Random (inexact) inputs with scores up to about 40. Larger ones (q and k times
 * 14 and more, scores in the hundreds) take the AVX2 and AVX-512 paths past twice
 * the reference's error whichever exponent they use: they sum q.k in another order
 * than the forward that made L, and the reference sums it in the forward
 * reference's order, so its weights share its rounding (docs/gradients.md). */
static void large_random(void)
{
    static xcase c;
    const float amp[3] = {5.0f, 9.0f, 12.0f};
    for (int a = 0; a < 3; a++)
        for (int causal = 0; causal < 2; causal++) {
            fill_exact(&c, 0, 0);
            tu_fill(c.q, NQ, 11 + a);
            tu_fill(c.k, NK, 21 + a);
            tu_fill(c.v, NK, 31 + a);
            tu_fill(c.dout, NQ, 41 + a);
            for (int e = 0; e < NQ; e++)
                c.q[e] *= amp[a];
            for (int e = 0; e < NK; e++)
                c.k[e] *= amp[a];
            c.causal = causal;
            char name[96];
            snprintf(name, sizeof name, "random q, k times %g%s", (double)amp[a],
                     causal ? ", causal" : "");
            c.name = name;
            check_case(&c);
        }
}

/* The log-sum-exp given as -inf, +inf and NaN for one row (in the first tile and
 * in the second), sinks of +-inf, a bias row of -inf, huge finite q, k, v, dO. */
static void odd_inputs(void)
{
    static xcase c;
    const float lv[3] = {-INFINITY, INFINITY, NAN};
    const int rows[2] = {5, 70};
    for (int a = 0; a < 3; a++)
        for (int r = 0; r < 2; r++)
            for (int causal = 0; causal < 2; causal++) {
                fill_exact(&c, 0, -1);
                c.causal = causal;
                c.set_lse = 1;
                c.lse_row_h = 1;
                c.lse_row_i = rows[r];
                c.lse_value = lv[a];
                char name[96];
                snprintf(name, sizeof name, "lse %g at row %d%s", (double)lv[a], rows[r],
                         causal ? ", causal" : "");
                c.name = name;
                check_case(&c);
            }
    for (int sgn = 0; sgn < 2; sgn++) {
        fill_exact(&c, 0, -1);
        c.has_sinks = 1;
        c.sinks[0] = c.sinks[3] = sgn ? INFINITY : -INFINITY;
        c.name = sgn ? "sink +inf" : "sink -inf";
        check_case(&c);
    }
    fill_exact(&c, 0, -1);
    c.has_bias = 1;
    for (int j = 0; j < T_; j++) {
        c.bias[(1 * T_ + 3) * T_ + j] = -INFINITY;
        c.bias[(0 * T_ + 66) * T_ + j] = -INFINITY;
    }
    c.name = "bias rows of -inf";
    check_case(&c);
    /* Huge but finite: v near FLT_MAX / 8 in key 67 and dO of 2^120 in row 9 of
     * head 1, which (causal) does not see it, so that dP stays finite. (q and k
     * near 2^62 with a scale of 2^-124 are not here: q.k and dS K, taken before
     * the scale, overflow float32 in the reference and the fused paths alike.) */
    fill_exact(&c, 0, -1);
    c.causal = 1;
    for (int d = 0; d < D_; d++) {
        c.v[67 * D_ + d] = 0x1p124f;
        c.dout[(1 * T_ + 9) * D_ + d] = 0x1p120f;
    }
    c.name = "v 2^124 in a key, dO 2^120 in a row";
    check_case(&c);
}

/* One NaN, +inf or -inf in q or dO (a row of head 1) or k or v (a key of key/value
 * head 0, read by heads 0 and 1) at a row or key of the first tile, of the second
 * (later) tile, on the causal diagonal, in a key the causal mask hides from most
 * rows, in a key a bias of -inf hides from every row and in a row whose bias is
 * all -inf (two-pass form): the fused paths' non-finite gradients are exactly the
 * reference's. */
static void nonfinite_inputs(void)
{
    static xcase c;
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    const char *const what[4] = {"q", "k", "v", "dO"};
    const int at[4] = {10, 70, 20, 75};
    for (int x = 0; x < 3; x++)
        for (int in = 0; in < 4; in++)
            for (int a = 0; a < 4; a++)
                for (int mode = 0; mode < 3; mode++) {
                    fill_exact(&c, 0, -1);
                    c.causal = mode == 1;
                    if (mode == 2) {
                        c.has_bias = 1;
                        for (int e = 0; e < NB; e++)
                            c.bias[e] = (float)small_int(-2, 2) / 4.0f;
                        for (int h = 0; h < H_; h++)
                            for (int i = 0; i < T_; i++)
                                c.bias[(h * T_ + i) * T_ + 20] = -INFINITY;
                        for (int j = 0; j < T_; j++)
                            c.bias[(1 * T_ + 70) * T_ + j] = -INFINITY;
                    }
                    const int row = in == 0 || in == 3;
                    float *t = in == 0 ? c.q + T_ * D_ : in == 1 ? c.k : in == 2 ? c.v : c.dout + T_ * D_;
                    t[at[a] * D_ + 1] = bad[x];
                    char name[128];
                    snprintf(name, sizeof name, "%g in %s at %s %d%s", (double)bad[x], what[in],
                             row ? "row" : "key", at[a],
                             mode == 1 ? ", causal" : mode == 2 ? ", bias (key 20, row 70 hidden)" : "");
                    c.name = name;
                    check_case(&c);
                }
}

/* A scale of +-inf or NaN is refused (SPEC: the scale is a finite number) by the
 * reference and the fused backward alike. */
static void bad_scales(void)
{
    static xcase c;
    static float out[NQ], lse[B_ * H_ * T_];
    static grads g;
    const float bad[3] = {INFINITY, -INFINITY, NAN};
    fill_exact(&c, 0, -1);
    c.name = "scale not finite";
    for (int x = 0; x < 3; x++) {
        c.scale = bad[x];
        for (int a = 0; a < 2; a++)
            CHECK_INT(run_backward(&c, out, lse, a ? ATTN_ARCH_SCALAR : ATTN_ARCH_REF, 1, &g),
                      ATTN_STATUS_INVALID_ARGUMENT);
    }
}

int main(void)
{
    bad_scales();
    huge_scores();
    large_random();
    odd_inputs();
    nonfinite_inputs();
    printf("test_backward_extremes: %d cases\n", problems);
    return check_summary("test_backward_extremes");
}
