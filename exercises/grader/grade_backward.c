/*
 * grade_backward.c - exercise 7 (stretch): the backward of one head, against
 * attn_sdpa_backward_ref, with the weights from attn_sdpa_ref's forward.
 *
 * 7a (the softmax's backward alone) is graded through the whole head's backward, as
 * exercise 3 is through the forward: with q = the scores [Tq, Tk], k = v = the
 * identity [Tk, Tk] and scale 1, the forward's P is the scores' masked softmax, dP =
 * dO v^T is dO exactly, and dq = dS k is dS exactly (each a product by 1 plus zeros).
 *
 * Each mistake's answer comes from wrong_backward(), which computes the backward (in
 * double, from the same float P) with one thing changed at a time. Two mistakes are
 * told by a property instead: a hidden key (P = 0) that gets any gradient at all
 * (the right formulas give it exactly 0, every term having a factor P: a wrong answer
 * no variant matches, or even a right one within the tolerance, is then named
 * masked-gradient), and gradients that depend on what the buffers held before the
 * call (not set to 0 first: the function is run again on zeroed buffers, and then is
 * right).
 *
 * The tolerance is grade_common.c's, 1e-5 + 1e-4 |expected|. Float sums in another
 * order than the reference's differ by about n * 2^-24 * (the sum of the terms' sizes)
 * for n terms: here at most 17 terms of size below 10 for dS, then 17 or 64 terms for
 * dq, dk and dv, about 1e-6 at worst, and the model solution (whose Delta comes from
 * dO o O, the reference's, while 7a's comes from P o dP) lands within a tenth of the
 * bound on every case (measured: 0.027 of it at worst). The broken files in
 * exercises/tests/ show each named mistake told apart from the right answer.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "grader.h"

static const grade_mistake NO_ROWSUM = {
    "no-rowsum", "the rowsum term is missing: dS = P o dP",
    "Each weight of a row depends on every score of the row (they share the softmax's "
    "denominator), so the Jacobian of one row is diag(p) - p p^T, not diag(p). Its second "
    "part gives every entry of row i a share of one extra term, in proportion to p_ij. "
    "Work out ds_l = sum_j dp_j * (d p_j / d s_l), with d p_j / d s_l = p_j (delta_jl - "
    "p_l), for one row."};
static const grade_mistake ROWSUM_AXIS = {
    "rowsum-axis", "the rowsum runs over the wrong axis (over queries, down each column)",
    "Delta belongs to one query row: the softmax mixes the scores of row i only, so "
    "Delta_i sums over the keys j of that row (one number per query, [Tq]), and is "
    "subtracted from every entry of row i. Summing down a column mixes different rows' "
    "softmaxes."};
static const grade_mistake ROWSUM_UNWEIGHTED = {
    "rowsum-unweighted", "Delta is the plain rowsum of dP, without the weights",
    "Delta_i = sum_j p_ij dp_ij: each dp_ij weighted by its p_ij (equivalently dO_i . o_i, "
    "the walkthrough's form). The unweighted sum of dP is a different number, unless dP's "
    "row happens to be constant."};
static const grade_mistake DELTA_OUTSIDE_P = {
    "delta-outside-p", "Delta is not multiplied by P: dS = P o dP - Delta",
    "The factor p_ij multiplies the whole bracket, Delta included: it comes from the "
    "Jacobian's p_j (delta_jl - p_l), whose two parts both carry p_j. Without it, a key of "
    "weight 0 (a masked one) gets gradient -Delta_i."};
static const grade_mistake MASKED_GRADIENT = {
    "masked-gradient", "a hidden key (weight 0) gets gradient",
    "A masked key never took part in the forward: its weight is exactly 0, and so must be "
    "its gradient. Use the weights you are given (exactly 0 at every hidden key) and keep "
    "the factor P in every term (dS = P o (dP - Delta), dV = P^T dO): then a hidden key's "
    "dS, dk and dv are exactly 0 with no special case for the mask."};
static const grade_mistake SCALE_MISSING = {
    "scale-missing", "dq and dk lack the factor 1/sqrt(D)",
    "The scores are s_ij = scale * (q_i . k_j): the chain rule through that product brings "
    "the scale back. dv is right, which shows the rest of the chain is."};
static const grade_mistake SCALE_TWICE = {
    "scale-twice", "dq and dk carry the factor 1/sqrt(D) twice",
    "The scale appears once in the forward (s = scale * q k^T), so once in the backward: "
    "apply it to dS or to dq and dk, not to both."};
static const grade_mistake DK_NOT_TRANSPOSED = {
    "dk-not-transposed", "dk is computed from dS where it needs dS^T",
    "Key j appears in column j of the scores: dk_j = scale * sum_i ds_ij q_i sums DOWN "
    "column j of dS. Reading dS's row j mixes up which query looked at which key; the "
    "shapes only fit by chance because Tq = Tk here."};
static const grade_mistake DV_NOT_TRANSPOSED = {
    "dv-not-transposed", "dv is P dO where it must be P^T dO",
    "Value j is read by every query i with weight p_ij: dv_j = sum_i p_ij dO_i, down "
    "column j of P. P dO only has the right shape because Tq = Tk here."};
static const grade_mistake NOT_ZEROED = {
    "not-zeroed", "the gradients depend on what the buffers held before the call",
    "dk and dv are sums over the query rows, so every entry must be set to 0 before the "
    "first += (and a key that no query sees keeps that 0). The caller's buffers hold "
    "anything (here: a NaN marker); with buffers that happened to be 0 your answer is "
    "right."};
static const grade_mistake NOT_ACCUMULATED = {
    "not-accumulated", "dk and dv keep only the last query row's part",
    "Every query row sends gradient to every key it looks at, so dk_j and dv_j are sums "
    "over i; with one query this is invisible. Add each row's part (+=) instead of "
    "assigning (=) it."};
static const grade_mistake DQ_DK_SWAPPED = {
    "dq-dk-swapped", "dq and dk are swapped",
    "dq [Tq, D] is scale dS k (one row per query), dk [Tk, D] is scale dS^T q (one row "
    "per key). With Tq = Tk the shapes match, so nothing stops the swap but the values."};

typedef enum delta_mode {
    DELTA_RIGHT,      /* Delta_i = sum_j p_ij dp_ij */
    DELTA_NONE,       /* no rowsum term */
    DELTA_COLUMNS,    /* Delta_j = sum_i p_ij dp_ij, subtracted down column j */
    DELTA_UNWEIGHTED, /* Delta_i = sum_j dp_ij */
} delta_mode;

typedef struct wrong_opts {
    delta_mode delta;
    int delta_without_p;  /* dS = P o dP - Delta */
    int scale_power;      /* dq and dk carry scale^scale_power (right: 1) */
    int dk_from_ds;       /* dk_j = scale sum_i ds[j][i] q_i (Tq = Tk) */
    int dv_from_p;        /* dv_j = sum_i p[j][i] dO_i (Tq = Tk) */
    int last_row_only;    /* dk and dv from the last query row only */
    int swap_dq_dk;       /* (Tq = Tk) */
} wrong_opts;

typedef struct problem {
    int Tq, Tk, D, Dv;
    const float *q, *k, *v; /* 7b only */
    const float *p;         /* P [Tq, Tk] */
    const float *dp;        /* 7a: dP [Tq, Tk]; 7b: NULL (from dout and v) */
    const float *dout;      /* 7b: dO [Tq, Dv] */
    double scale;
} problem;

enum { MAXT = 17, MAXD = 64 };

/* dS [Tq, Tk], and when dq is not NULL dq, dk, dv, with the change `o`. */
static void wrong_backward(const problem *pr, const wrong_opts *o, float *ds_out, float *dq,
                           float *dk, float *dv)
{
    const int64_t Tq = pr->Tq, Tk = pr->Tk, D = pr->D, Dv = pr->Dv;
    double dp[MAXT][MAXT], ds[MAXT][MAXT], delta[MAXT];
    for (int64_t i = 0; i < Tq; i++)
        for (int64_t j = 0; j < Tk; j++) {
            double x = 0.0;
            if (pr->dp)
                x = pr->dp[i * Tk + j];
            else
                for (int64_t e = 0; e < Dv; e++)
                    x += (double)pr->dout[i * Dv + e] * pr->v[j * Dv + e];
            dp[i][j] = x;
        }
    int64_t lines = o->delta == DELTA_COLUMNS ? Tk : Tq;
    for (int64_t a = 0; a < lines; a++) {
        double s = 0.0;
        int64_t len = o->delta == DELTA_COLUMNS ? Tq : Tk;
        for (int64_t b = 0; b < len; b++) {
            int64_t i = o->delta == DELTA_COLUMNS ? b : a, j = o->delta == DELTA_COLUMNS ? a : b;
            s += o->delta == DELTA_UNWEIGHTED ? dp[i][j] : pr->p[i * Tk + j] * dp[i][j];
        }
        delta[a] = o->delta == DELTA_NONE ? 0.0 : s;
    }
    for (int64_t i = 0; i < Tq; i++)
        for (int64_t j = 0; j < Tk; j++) {
            double d = delta[o->delta == DELTA_COLUMNS ? j : i], p = pr->p[i * Tk + j];
            ds[i][j] = o->delta_without_p ? p * dp[i][j] - d : p * (dp[i][j] - d);
            if (ds_out)
                ds_out[i * Tk + j] = (float)ds[i][j];
        }
    if (!dq)
        return;
    const double sc = pr->scale * (o->scale_power == 2 ? pr->scale : 1.0) /
                      (o->scale_power == 0 ? pr->scale : 1.0);
    float *gq = o->swap_dq_dk ? dk : dq, *gk = o->swap_dq_dk ? dq : dk;
    for (int64_t i = 0; i < Tq; i++)
        for (int64_t d = 0; d < D; d++) {
            double acc = 0.0;
            for (int64_t j = 0; j < Tk; j++)
                acc += ds[i][j] * pr->k[j * D + d];
            gq[i * D + d] = (float)(sc * acc);
        }
    const int64_t i0 = o->last_row_only ? Tq - 1 : 0;
    for (int64_t j = 0; j < Tk; j++) {
        for (int64_t d = 0; d < D; d++) {
            double acc = 0.0;
            for (int64_t i = i0; i < Tq; i++)
                acc += (o->dk_from_ds ? ds[j][i] : ds[i][j]) * pr->q[i * D + d];
            gk[j * D + d] = (float)(sc * acc);
        }
        for (int64_t e = 0; e < Dv; e++) {
            double acc = 0.0;
            for (int64_t i = i0; i < Tq; i++)
                acc += (double)(o->dv_from_p ? pr->p[j * Tk + i] : pr->p[i * Tk + j]) *
                       pr->dout[i * Dv + e];
            dv[j * Dv + e] = (float)acc;
        }
    }
}

static void add_variant(grade_variant *vars, int *nvar, const grade_mistake *m,
                        const problem *pr, wrong_opts o, int whole_head)
{
    const int64_t Tq = pr->Tq, Tk = pr->Tk;
    if ((o.dk_from_ds || o.dv_from_p || o.swap_dq_dk) && Tq != Tk)
        return; /* the shapes do not fit: such code fails another way */
    vars[*nvar].mistake = m;
    if (!whole_head) {
        float *ds = grade_alloc_f(Tq * Tk);
        wrong_backward(pr, &o, ds, NULL, NULL, NULL);
        vars[*nvar].values[0] = ds;
    } else {
        float *dq = grade_alloc_f(Tq * pr->D), *dk = grade_alloc_f(Tk * pr->D),
              *dv = grade_alloc_f(Tk * pr->Dv);
        wrong_backward(pr, &o, NULL, dq, dk, dv);
        vars[*nvar].values[0] = dq;
        vars[*nvar].values[1] = dk;
        vars[*nvar].values[2] = dv;
    }
    (*nvar)++;
}

/* Every row keeps at least one key and, when Tk > 1, hides at least one. */
static void make_mask(attn_rng *rng, int kind, int Tq, int Tk, uint8_t **mask)
{
    if (kind == 0) {
        *mask = NULL;
        return;
    }
    uint8_t *m = *mask = grade_alloc_u8((int64_t)Tq * Tk);
    for (int64_t i = 0; i < Tq; i++)
        for (int64_t j = 0; j < Tk; j++) {
            if (kind == 2)
                m[i * Tk + j] = j <= i;
            else if (kind == 3) /* the last key is a pad, hidden from every query */
                m[i * Tk + j] = j != Tk - 1;
            else
                m[i * Tk + j] = (uint8_t)(attn_rng_u32(rng) & 1);
        }
    if (kind == 1)
        for (int64_t i = 0; i < Tq; i++) {
            int64_t one = attn_rng_u32(rng) % (uint32_t)Tk;
            m[i * Tk + one] = 1;
            if (Tk > 1)
                m[i * Tk + (one + 1 + attn_rng_u32(rng) % (uint32_t)(Tk - 1)) % Tk] = 0;
        }
}

static const char *mask_name(int kind)
{
    return kind == 0 ? "no mask" : kind == 1 ? "a random mask" : kind == 2 ? "a causal mask"
                                                                           : "a padding mask";
}

/* The forward (P, O and the log-sum-exp) and the reference backward, on 2-D
 * tensors read as [1, 1, rows, cols]. scale1: scale 1 instead of 1/sqrt(D). */
static int reference(attn_ctx *ctx, int Tq, int Tk, int D, int Dv, const float *q,
                     const float *k, const float *v, const uint8_t *mask, int scale1,
                     const float *dout, float *p, float *dq, float *dk, float *dv)
{
    float *out = grade_alloc_f((int64_t)Tq * Dv), *lse = grade_alloc_f(Tq);
    attn_tensor tq, tk, tv, tm, tp, to, tl, tdo, tdq, tdk, tdv;
    int64_t sq[2] = {Tq, D}, sk[2] = {Tk, D}, sv[2] = {Tk, Dv}, sm[2] = {Tq, Tk},
            so[2] = {Tq, Dv}, sl[1] = {Tq};
    attn_sdpa_params params;
    attn_sdpa_params_init(&params);
    if (scale1) {
        params.has_scale = 1;
        params.scale = 1.0f;
    }
    int st = attn_tensor_init(ctx, &tq, ATTN_DTYPE_F32, (void *)q, 2, sq);
    if (!st) st = attn_tensor_init(ctx, &tk, ATTN_DTYPE_F32, (void *)k, 2, sk);
    if (!st) st = attn_tensor_init(ctx, &tv, ATTN_DTYPE_F32, (void *)v, 2, sv);
    if (!st) st = attn_tensor_init(ctx, &tp, ATTN_DTYPE_F32, p, 2, sm);
    if (!st) st = attn_tensor_init(ctx, &to, ATTN_DTYPE_F32, out, 2, so);
    if (!st) st = attn_tensor_init(ctx, &tl, ATTN_DTYPE_F32, lse, 1, sl);
    if (!st) st = attn_tensor_init(ctx, &tdo, ATTN_DTYPE_F32, (void *)dout, 2, so);
    if (!st) st = attn_tensor_init(ctx, &tdq, ATTN_DTYPE_F32, dq, 2, sq);
    if (!st) st = attn_tensor_init(ctx, &tdk, ATTN_DTYPE_F32, dk, 2, sk);
    if (!st) st = attn_tensor_init(ctx, &tdv, ATTN_DTYPE_F32, dv, 2, sv);
    if (!st && mask) {
        st = attn_tensor_init(ctx, &tm, ATTN_DTYPE_BOOL, (void *)mask, 2, sm);
        params.mask = &tm;
    }
    if (!st) {
        params.lse = &tl;
        st = attn_sdpa_ref(ctx, &tq, &tk, &tv, &params, &to, &tp);
        params.lse = NULL;
    }
    if (!st) {
        attn_sdpa_grads g = {&tdq, &tdk, &tdv, NULL, NULL};
        st = attn_sdpa_backward_ref(ctx, &tq, &tk, &tv, &params, &to, &tl, &tdo, &g);
    }
    return st;
}

/* The first entry of `got` (n entries) that is not exactly 0 where `hidden` says
 * the key is hidden, or -1. hidden(x) is the entry's "P = 0 by the mask". */
static int64_t first_nonzero(const float *got, const uint8_t *hidden, int64_t n)
{
    for (int64_t x = 0; x < n; x++)
        if (hidden[x] && got[x] != 0.0f)
            return x;
    return -1;
}

/* When the case failed as wrong-values or not-finite, or passed although a hidden
 * key got a (small) gradient, and some hidden entry is not exactly 0: that is the
 * diagnosis. hidden marks, per output entry, a key no query can see (7b) or a
 * masked (i, j) (7a). */
static int check_hidden(grade_result *r, int ok, const char *where, int nout,
                        const grade_output *outs, uint8_t *const *hidden)
{
    if (!ok && strcmp(r->id, "wrong-values") != 0 && strcmp(r->id, "not-finite") != 0)
        return ok;
    for (int o = 0; o < nout; o++) {
        if (!hidden[o])
            continue;
        int64_t x = first_nonzero(outs[o].got, hidden[o], outs[o].shape[0] * outs[o].shape[1]);
        if (x < 0)
            continue;
        if (ok)
            r->cases_passed--;
        r->verdict = GRADE_WRONG;
        snprintf(r->id, sizeof r->id, "%s", MASKED_GRADIENT.id);
        snprintf(r->title, sizeof r->title, "%s", MASKED_GRADIENT.title);
        snprintf(r->hint, sizeof r->hint, "%s", MASKED_GRADIENT.hint);
        snprintf(r->detail, sizeof r->detail, "%s: %s[%lld, %lld] is %.6g, expected exactly 0 "
                 "(the key is hidden)", where, outs[o].name, (long long)(x / outs[o].shape[1]),
                 (long long)(x % outs[o].shape[1]), (double)outs[o].got[x]);
        return 0;
    }
    return ok;
}

void grade_softmax_backward(grade_result *r)
{
    enum { CASES = 5 };
    /* Tq != Tk both ways, a single key (dS is then 0: the weight is 1 whatever
     * the score), a causal square and masks with hidden keys. */
    static const struct { int Tq, Tk, mask; } cases[CASES] = {
        {3, 5, 0}, {2, 1, 0}, {4, 17, 1}, {17, 3, 3}, {5, 5, 2}};
    grade_begin(r, CASES);
    attn_rng rng;
    attn_rng_seed(&rng, 7);
    for (int c = 0; c < CASES; c++) {
        const int Tq = cases[c].Tq, Tk = cases[c].Tk;
        float *scores = grade_alloc_f((int64_t)Tq * Tk), *dp = grade_alloc_f((int64_t)Tq * Tk);
        grade_randn(&rng, scores, (int64_t)Tq * Tk, 2.0f);
        grade_randn(&rng, dp, (int64_t)Tq * Tk, 1.0f);
        uint8_t *mask;
        make_mask(&rng, cases[c].mask, Tq, Tk, &mask);
        float *eye = grade_alloc_f((int64_t)Tk * Tk);
        for (int64_t x = 0; x < (int64_t)Tk * Tk; x++)
            eye[x] = (x / Tk == x % Tk) ? 1.0f : 0.0f;

        attn_ctx ctx;
        attn_ctx_init(&ctx);
        float *p = grade_alloc_f((int64_t)Tq * Tk), *want = grade_alloc_f((int64_t)Tq * Tk),
              *dk = grade_alloc_f((int64_t)Tk * Tk), *dv = grade_alloc_f((int64_t)Tk * Tk);
        int st = reference(&ctx, Tq, Tk, Tk, Tk, scores, eye, eye, mask, 1, dp, p, want, dk, dv);
        if (st) {
            grade_library_failed(r, "attn_sdpa_ref or attn_sdpa_backward_ref", &ctx, st);
            grade_free_all();
            return;
        }

        float *got = grade_alloc_f((int64_t)Tq * Tk);
        char where[160];
        snprintf(where, sizeof where, "case %d of %d (Tq = %d, Tk = %d, %s, scores of order 1)",
                 c + 1, CASES, Tq, Tk, mask_name(cases[c].mask));
        grade_running(where);
        softmax_backward(Tq, Tk, p, dp, got);

        problem pr = {Tq, Tk, Tk, Tk, NULL, NULL, NULL, p, dp, NULL, 1.0};
        grade_variant vars[8];
        int nvar = 0;
        wrong_opts base = {DELTA_RIGHT, 0, 1, 0, 0, 0, 0}, o;
        o = base; o.delta = DELTA_NONE; add_variant(vars, &nvar, &NO_ROWSUM, &pr, o, 0);
        o = base; o.delta = DELTA_COLUMNS; add_variant(vars, &nvar, &ROWSUM_AXIS, &pr, o, 0);
        o = base; o.delta = DELTA_UNWEIGHTED; add_variant(vars, &nvar, &ROWSUM_UNWEIGHTED, &pr, o, 0);
        o = base; o.delta_without_p = 1; add_variant(vars, &nvar, &DELTA_OUTSIDE_P, &pr, o, 0);

        uint8_t *hidden[1] = {NULL};
        if (mask) {
            hidden[0] = grade_alloc_u8((int64_t)Tq * Tk);
            for (int64_t x = 0; x < (int64_t)Tq * Tk; x++)
                hidden[0][x] = !mask[x];
        }
        grade_output out = {"dscores", 2, {Tq, Tk}, got, want};
        int ok = grade_case(r, where, 1, &out, nvar, vars, NULL);
        ok = check_hidden(r, ok, where, 1, &out, hidden);
        grade_free_all();
        if (!ok)
            return;
    }
}

void grade_sdpa_backward(grade_result *r)
{
    enum { CASES = 5 };
    /* A square case first, where dS and dS^T (P and P^T, dq and dk) have the same
     * shape, so code that confuses them is named rather than reading out of bounds
     * on a later case; one query and one key; D = 64 with 17 keys; more queries
     * than keys with a key hidden from all of them; a causal square. */
    static const struct { int Tq, Tk, D, Dv, mask; } cases[CASES] = {
        {4, 4, 8, 4, 0}, {1, 1, 3, 2, 0}, {3, 17, 64, 8, 1}, {17, 3, 5, 9, 3}, {6, 6, 16, 16, 2}};
    grade_begin(r, CASES);
    attn_rng rng;
    attn_rng_seed(&rng, 8);
    for (int c = 0; c < CASES; c++) {
        const int Tq = cases[c].Tq, Tk = cases[c].Tk, D = cases[c].D, Dv = cases[c].Dv;
        float *q = grade_alloc_f((int64_t)Tq * D), *k = grade_alloc_f((int64_t)Tk * D),
              *v = grade_alloc_f((int64_t)Tk * Dv), *dout = grade_alloc_f((int64_t)Tq * Dv);
        grade_randn(&rng, q, (int64_t)Tq * D, 1.0f);
        grade_randn(&rng, k, (int64_t)Tk * D, 1.0f);
        grade_randn(&rng, v, (int64_t)Tk * Dv, 1.0f);
        grade_randn(&rng, dout, (int64_t)Tq * Dv, 1.0f);
        uint8_t *mask;
        make_mask(&rng, cases[c].mask, Tq, Tk, &mask);

        attn_ctx ctx;
        attn_ctx_init(&ctx);
        float *p = grade_alloc_f((int64_t)Tq * Tk), *wq = grade_alloc_f((int64_t)Tq * D),
              *wk = grade_alloc_f((int64_t)Tk * D), *wv = grade_alloc_f((int64_t)Tk * Dv);
        int st = reference(&ctx, Tq, Tk, D, Dv, q, k, v, mask, 0, dout, p, wq, wk, wv);
        if (st) {
            grade_library_failed(r, "attn_sdpa_ref or attn_sdpa_backward_ref", &ctx, st);
            grade_free_all();
            return;
        }

        float *gq = grade_alloc_f((int64_t)Tq * D), *gk = grade_alloc_f((int64_t)Tk * D),
              *gv = grade_alloc_f((int64_t)Tk * Dv);
        char where[160];
        snprintf(where, sizeof where, "case %d of %d (Tq = %d, Tk = %d, D = %d, Dv = %d, %s)",
                 c + 1, CASES, Tq, Tk, D, Dv, mask_name(cases[c].mask));
        grade_running(where);
        sdpa_backward(Tq, Tk, D, Dv, q, k, v, mask, p, dout, gq, gk, gv);

        problem pr = {Tq, Tk, D, Dv, q, k, v, p, NULL, dout, 1.0 / sqrt((double)D)};
        grade_variant vars[16];
        int nvar = 0;
        wrong_opts base = {DELTA_RIGHT, 0, 1, 0, 0, 0, 0}, o;
        o = base; o.delta = DELTA_NONE; add_variant(vars, &nvar, &NO_ROWSUM, &pr, o, 1);
        o = base; o.delta = DELTA_COLUMNS; add_variant(vars, &nvar, &ROWSUM_AXIS, &pr, o, 1);
        o = base; o.delta = DELTA_UNWEIGHTED; add_variant(vars, &nvar, &ROWSUM_UNWEIGHTED, &pr, o, 1);
        o = base; o.delta_without_p = 1; add_variant(vars, &nvar, &DELTA_OUTSIDE_P, &pr, o, 1);
        o = base; o.scale_power = 0; add_variant(vars, &nvar, &SCALE_MISSING, &pr, o, 1);
        o = base; o.scale_power = 2; add_variant(vars, &nvar, &SCALE_TWICE, &pr, o, 1);
        o = base; o.dk_from_ds = 1; add_variant(vars, &nvar, &DK_NOT_TRANSPOSED, &pr, o, 1);
        o = base; o.dv_from_p = 1; add_variant(vars, &nvar, &DV_NOT_TRANSPOSED, &pr, o, 1);
        o = base; o.swap_dq_dk = 1; add_variant(vars, &nvar, &DQ_DK_SWAPPED, &pr, o, 1);
        if (Tq > 1) {
            o = base; o.last_row_only = 1; add_variant(vars, &nvar, &NOT_ACCUMULATED, &pr, o, 1);
        }

        /* Keys no query can see: their dk and dv rows must be exactly 0. */
        uint8_t *hidden[3] = {NULL, NULL, NULL};
        if (mask) {
            hidden[1] = grade_alloc_u8((int64_t)Tk * D);
            hidden[2] = grade_alloc_u8((int64_t)Tk * Dv);
            for (int64_t j = 0; j < Tk; j++) {
                int seen = 0;
                for (int64_t i = 0; i < Tq; i++)
                    seen |= mask[i * Tk + j];
                memset(hidden[1] + j * D, !seen, (size_t)D);
                memset(hidden[2] + j * Dv, !seen, (size_t)Dv);
            }
        }
        grade_output outs[3] = {{"dq", 2, {Tq, D}, gq, wq},
                                {"dk", 2, {Tk, D}, gk, wk},
                                {"dv", 2, {Tk, Dv}, gv, wv}};
        int ok = grade_case(r, where, 3, outs, nvar, vars, NULL);
        ok = check_hidden(r, ok, where, 3, outs, hidden);

        /* An output left as "never written", or NaN, may be a sum that started from
         * the buffer's old contents: run it again on zeroed buffers. */
        if (!ok && (r->verdict == GRADE_TODO || !strcmp(r->id, "not-written") ||
                    !strcmp(r->id, "not-finite"))) {
            float *zq = grade_alloc_f((int64_t)Tq * D), *zk = grade_alloc_f((int64_t)Tk * D),
                  *zv = grade_alloc_f((int64_t)Tk * Dv);
            memset(zq, 0, (size_t)Tq * D * sizeof *zq);
            memset(zk, 0, (size_t)Tk * D * sizeof *zk);
            memset(zv, 0, (size_t)Tk * Dv * sizeof *zv);
            sdpa_backward(Tq, Tk, D, Dv, q, k, v, mask, p, dout, zq, zk, zv);
            grade_output zouts[3] = {{"dq", 2, {Tq, D}, zq, wq},
                                     {"dk", 2, {Tk, D}, zk, wk},
                                     {"dv", 2, {Tk, Dv}, zv, wv}};
            grade_result again;
            grade_begin(&again, CASES);
            if (grade_case(&again, where, 3, zouts, 0, NULL, NULL)) {
                r->verdict = GRADE_WRONG;
                snprintf(r->id, sizeof r->id, "%s", NOT_ZEROED.id);
                snprintf(r->title, sizeof r->title, "%s", NOT_ZEROED.title);
                snprintf(r->hint, sizeof r->hint, "%s", NOT_ZEROED.hint);
                snprintf(r->detail, sizeof r->detail, "%s: with buffers filled with NaN markers "
                         "some outputs stayed NaN; with buffers of zeros the answer is right",
                         where);
            }
        }
        grade_free_all();
        if (!ok)
            return;
    }
}
