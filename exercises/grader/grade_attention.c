/*
 * grade_attention.c - exercises 3 and 4: the masked softmax and scaled dot-product
 * attention, against attn_sdpa_ref.
 *
 * The masked softmax is graded through attn_sdpa_ref too: with q = the scores
 * [Tq, Tk], k = the identity [Tk, Tk] and scale 1, its scores are the given scores
 * exactly (each is one product by 1 plus zeros), so its weights are their masked
 * softmax.
 *
 * Each mistake's answer comes from one function, wrong_attention(), that computes
 * attention (in double) with one thing changed at a time.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "grader.h"

static const grade_mistake MASKED_ZERO = {
    "masked-zero", "masked scores became 0 instead of -inf",
    "A masked score must be -INFINITY before the softmax: exp(-inf) = 0 gives the key weight "
    "exactly 0. A score of 0 is an ordinary score (exp(0) = 1), so the masked key still gets "
    "weight, often more than a real key with a negative score."};
static const grade_mistake MASK_INVERTED = {
    "mask-inverted", "the mask's meaning is inverted: masked keys are kept, visible ones hidden",
    "Here a mask entry of 1 (true) means \"may attend\", as in the chapter and in "
    "F.scaled_dot_product_attention; nn.MultiheadAttention's boolean masks mean the opposite "
    "(true = ignore). Set the score to -INFINITY where mask[i][j] == 0."};
static const grade_mistake MASK_TRANSPOSED = {
    "mask-transposed",
    "the mask is read transposed (mask[j][i]): it masks by query where it should mask by key",
    "Row i of the mask belongs to query i and column j to key j: read mask[i * Tk + j] for "
    "score (i, j). Read the other way, a padding mask hides the pad QUERY's row instead of "
    "the pad KEY's column, and a causal mask lets queries see the future."};
static const grade_mistake MASK_IGNORED = {
    "mask-ignored", "the mask is ignored: masked keys get weight",
    "Where mask[i][j] == 0 the score must become -INFINITY before the softmax."};
static const grade_mistake MASK_AFTER_SOFTMAX = {
    "mask-after-softmax",
    "masked weights were zeroed after the softmax, so the rows no longer sum to 1",
    "Mask the SCORES (-INFINITY) before the softmax, not the weights after it: zeroing a "
    "weight afterwards leaves the row summing to less than 1, because the masked key's "
    "exp() was already in the denominator."};
static const grade_mistake SOFTMAX_AXIS = {
    "softmax-axis", "the softmax runs over the wrong axis (over queries, down each column)",
    "Each query's row of weights must sum to 1: normalise over the keys j for a fixed i "
    "(PyTorch: softmax(dim=-1)). Normalising over i makes each KEY's column sum to 1."};
static const grade_mistake NO_DIVISION = {
    "no-normalisation", "the weights are not normalised: a row does not sum to 1",
    "After e_j = exp(s_j - max), divide every e_j by the row's sum of e_j."};
static const grade_mistake NO_MAX = {
    "no-max-subtraction",
    "the softmax overflows on large scores: exp() without subtracting the row's max",
    "exp(x) overflows float above about 88.7, and inf / inf is NaN. Subtract the row's "
    "largest (unmasked) score before exp(): softmax(s - c) = softmax(s) for any constant c, "
    "and every exp() is then at most 1."};
static const grade_mistake SCALE_MISSING = {
    "scale-missing", "the scores are not scaled: the 1/sqrt(D) is missing",
    "scores = q k^T / sqrt(D). A dot product of D terms of unit variance has variance D; "
    "without the scale the softmax is much sharper (with D = 64 a row's largest weight is "
    "typically 0.7-1.0 instead of 0.3-0.65), which saturates it and starves the gradients."};
static const grade_mistake SCALE_ONE_OVER_D = {
    "scale-1-over-d", "the scores are scaled by 1/D instead of 1/sqrt(D)",
    "The scale is 1/sqrt(D) (sqrtf((float)D)), which brings the dot product's variance D "
    "back to 1; 1/D shrinks it to 1/D and makes the weights too flat."};
static const grade_mistake SCALE_ZERO = {
    "scale-zero", "every score is 0, so every visible key gets the same weight",
    "The scale came out as 0. In C, 1 / D with an int D is integer division, 0 for any D > 1 "
    "(and 1 / sqrt(D) is fine only because sqrt returns a double). Write "
    "1.0f / sqrtf((float)D)."};
static const grade_mistake SCALE_TIMES_SQRT_D = {
    "scale-times-sqrt-d", "the scores are multiplied by sqrt(D) instead of divided",
    "Divide by sqrt(D) (or multiply by 1/sqrt(D)), do not multiply by it."};
static const grade_mistake SCALE_DV = {
    "scale-dv", "the scale uses the value dim Dv instead of D",
    "The scale comes from the dot product q.k, whose length is D, the head dim of q and k; "
    "v's dim Dv plays no part in the scores."};
static const grade_mistake K_LAYOUT = {
    "k-layout", "k is read as [D, Tk] instead of [Tk, D]",
    "k is [Tk, D], row-major: element d of key j is k[j * D + d]. The score (i, j) is the "
    "dot product of q's row i with k's row j (q @ k^T; the transpose is in the formula, "
    "not in memory)."};
static const grade_mistake V_LAYOUT = {
    "v-layout", "v is read as [Dv, Tk] instead of [Tk, Dv]",
    "v is [Tk, Dv], row-major: out[i][e] = sum over j of weights[i][j] * v[j * Dv + e]."};

enum mask_mode {
    MASK_RIGHT,      /* -inf where the mask is 0 */
    MASK_FLIP,       /* -inf where the mask is 1 */
    MASK_TRANSPOSE,  /* the mask read as [Tk, Tq] */
    MASK_NONE,       /* the mask ignored */
    MASK_ZERO,       /* 0 where the mask is 0 */
    MASK_AFTER       /* softmax unmasked, then masked weights set to 0 */
};

typedef struct wrong_opts {
    double scale;
    enum mask_mode mask_mode;
    int over_queries;   /* softmax down the columns */
    int no_division;    /* exp(s - max) not divided by the sum */
    int k_transposed;   /* k read as [D, Tk] */
    int v_transposed;   /* v read as [Dv, Tk] */
} wrong_opts;

/* One attention problem: either given scores (exercise 3) or q, k, v (exercise 4). */
typedef struct problem {
    int Tq, Tk, D, Dv;
    const float *scores;           /* [Tq, Tk], or NULL */
    const float *q, *k, *v;        /* [Tq, D], [Tk, D], [Tk, Dv] */
    const uint8_t *mask;           /* [Tq, Tk] or NULL */
} problem;

static int visible(const problem *p, const wrong_opts *o, int64_t i, int64_t j)
{
    if (!p->mask)
        return 1;
    switch (o->mask_mode) {
    case MASK_FLIP: return !p->mask[i * p->Tk + j];
    case MASK_TRANSPOSE: return p->mask[j * p->Tq + i] != 0;
    case MASK_NONE:
    case MASK_ZERO:
    case MASK_AFTER: return 1;
    default: return p->mask[i * p->Tk + j] != 0;
    }
}

/* Attention with the change `o` describes: weights [Tq, Tk] and, when out is not
 * NULL, out [Tq, Dv]. A row (or, over queries, a column) left with no key has no
 * defined answer: its entries match anything. */
static void wrong_attention(const problem *p, const wrong_opts *o, float *weights, float *out)
{
    const int64_t Tq = p->Tq, Tk = p->Tk, D = p->D, Dv = p->Dv;
    double s[64][64];
    int keep[64][64];
    for (int64_t i = 0; i < Tq; i++)
        for (int64_t j = 0; j < Tk; j++) {
            double x;
            if (p->scores) {
                x = p->scores[i * Tk + j];
            } else {
                x = 0.0;
                for (int64_t d = 0; d < D; d++)
                    x += (double)p->q[i * D + d] *
                         (o->k_transposed ? p->k[d * Tk + j] : p->k[j * D + d]);
            }
            s[i][j] = x * o->scale;
            keep[i][j] = visible(p, o, i, j);
            if (o->mask_mode == MASK_ZERO && p->mask && !p->mask[i * Tk + j])
                s[i][j] = 0.0;
        }
    /* Softmax along rows, or along columns when over_queries. */
    int64_t lines = o->over_queries ? Tk : Tq, len = o->over_queries ? Tq : Tk;
    for (int64_t a = 0; a < lines; a++) {
        double m = -INFINITY, sum = 0.0;
        for (int64_t b = 0; b < len; b++) {
            int64_t i = o->over_queries ? b : a, j = o->over_queries ? a : b;
            if (keep[i][j] && s[i][j] > m)
                m = s[i][j];
        }
        for (int64_t b = 0; b < len; b++) {
            int64_t i = o->over_queries ? b : a, j = o->over_queries ? a : b;
            sum += keep[i][j] ? exp(s[i][j] - m) : 0.0;
        }
        for (int64_t b = 0; b < len; b++) {
            int64_t i = o->over_queries ? b : a, j = o->over_queries ? a : b;
            double e = keep[i][j] ? exp(s[i][j] - m) : 0.0;
            if (m == -INFINITY)
                weights[i * Tk + j] = grade_any();
            else
                weights[i * Tk + j] = (float)(o->no_division ? e : e / sum);
            if (o->mask_mode == MASK_AFTER && p->mask && !p->mask[i * Tk + j])
                weights[i * Tk + j] = 0.0f;
        }
    }
    if (!out)
        return;
    for (int64_t i = 0; i < Tq; i++)
        for (int64_t e = 0; e < Dv; e++) {
            double acc = 0.0;
            int any = 0;
            for (int64_t j = 0; j < Tk; j++) {
                float w = weights[i * Tk + j];
                if (isnan(w)) {
                    any = 1;
                    continue;
                }
                acc += (double)w * (o->v_transposed ? p->v[e * Tk + j] : p->v[j * Dv + e]);
            }
            out[i * Dv + e] = any ? grade_any() : (float)acc;
        }
}

/* A variant's arrays, or NULL ones when the change does not apply (no mask to
 * misuse) or leaves a whole row without keys. */
static void add_variant(grade_variant *vars, int *nvar, const grade_mistake *m,
                        const problem *p, wrong_opts o, int with_out)
{
    int needs_mask = o.mask_mode != MASK_RIGHT;
    if (needs_mask && !p->mask)
        return;
    float *w = grade_alloc_f((int64_t)p->Tq * p->Tk);
    float *out = with_out ? grade_alloc_f((int64_t)p->Tq * p->Dv) : NULL;
    wrong_attention(p, &o, w, out);
    /* Rows without keys are allowed only for the column softmax, whose columns
     * often have none under a random mask. */
    if (!o.over_queries)
        for (int64_t i = 0; i < (int64_t)p->Tq * p->Tk; i++)
            if (isnan(w[i]))
                return;
    vars[*nvar].mistake = m;
    vars[*nvar].values[0] = w;
    vars[*nvar].values[1] = out;
    (*nvar)++;
}

/* Every row of a random mask keeps at least one key and, when Tk > 1, hides at
 * least one, so that an inverted mask is defined and differs. */
static void random_mask(attn_rng *rng, int Tq, int Tk, uint8_t *mask)
{
    for (int64_t i = 0; i < Tq; i++) {
        for (int64_t j = 0; j < Tk; j++)
            mask[i * Tk + j] = (uint8_t)(attn_rng_u32(rng) & 1);
        int64_t one = attn_rng_u32(rng) % (uint32_t)Tk;
        mask[i * Tk + one] = 1;
        if (Tk > 1)
            mask[i * Tk + (one + 1 + attn_rng_u32(rng) % (uint32_t)(Tk - 1)) % Tk] = 0;
    }
}

static void causal(int T, uint8_t *mask)
{
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++)
            mask[i * T + j] = j <= i;
}

/* attn_sdpa_ref on 2-D tensors (read as [1, 1, rows, cols]). */
static int reference(attn_ctx *ctx, const problem *p, const float *q, const float *k,
                     const float *v, int D, int Dv, int has_scale, float *weights, float *out)
{
    attn_tensor tq, tk, tv, tm, tw, to;
    int64_t sq[2] = {p->Tq, D}, sk[2] = {p->Tk, D}, sv[2] = {p->Tk, Dv},
            sm[2] = {p->Tq, p->Tk}, so[2] = {p->Tq, Dv};
    attn_sdpa_params params;
    attn_sdpa_params_init(&params);
    if (has_scale) {
        params.has_scale = 1;
        params.scale = 1.0f;
    }
    int st = attn_tensor_init(ctx, &tq, ATTN_DTYPE_F32, (void *)q, 2, sq);
    if (!st) st = attn_tensor_init(ctx, &tk, ATTN_DTYPE_F32, (void *)k, 2, sk);
    if (!st) st = attn_tensor_init(ctx, &tv, ATTN_DTYPE_F32, (void *)v, 2, sv);
    if (!st) st = attn_tensor_init(ctx, &tw, ATTN_DTYPE_F32, weights, 2, sm);
    if (!st) st = attn_tensor_init(ctx, &to, ATTN_DTYPE_F32, out, 2, so);
    if (!st && p->mask) {
        st = attn_tensor_init(ctx, &tm, ATTN_DTYPE_BOOL, (void *)p->mask, 2, sm);
        params.mask = &tm;
    }
    if (!st)
        st = attn_sdpa_ref(ctx, &tq, &tk, &tv, &params, &to, &tw);
    return st;
}

static const char *mask_name(int kind)
{
    return kind == 0 ? "no mask" : kind == 1 ? "a random mask" : kind == 2 ? "a causal mask"
                                                                           : "a padding mask";
}

static void make_mask(attn_rng *rng, int kind, int Tq, int Tk, uint8_t **mask)
{
    if (kind == 0) {
        *mask = NULL;
        return;
    }
    *mask = grade_alloc_u8((int64_t)Tq * Tk);
    if (kind == 1)
        random_mask(rng, Tq, Tk, *mask);
    else if (kind == 2)
        causal(Tq, *mask);
    else /* the last key is a pad for every query */
        for (int64_t i = 0; i < (int64_t)Tq * Tk; i++)
            (*mask)[i] = (i % Tk) != Tk - 1;
}

void grade_masked_softmax(grade_result *r)
{
    enum { CASES = 5 };
    /* Tq != Tk so that rows and columns differ; a causal square; a single key;
     * scores large enough that exp() overflows without the max. */
    static const struct { int Tq, Tk, mask; float lo, hi; } cases[CASES] = {
        {3, 5, 0, 0, 0}, {4, 6, 1, 0, 0}, {5, 5, 2, 0, 0}, {2, 1, 0, 0, 0}, {3, 7, 1, 60, 120}};
    grade_begin(r, CASES);
    attn_rng rng;
    attn_rng_seed(&rng, 3);
    for (int c = 0; c < CASES; c++) {
        const int Tq = cases[c].Tq, Tk = cases[c].Tk;
        float *scores = grade_alloc_f((int64_t)Tq * Tk);
        if (cases[c].hi > 0)
            attn_rng_uniform(&rng, scores, (int64_t)Tq * Tk, cases[c].lo, cases[c].hi);
        else
            grade_randn(&rng, scores, (int64_t)Tq * Tk, 2.0f);
        uint8_t *mask;
        make_mask(&rng, cases[c].mask, Tq, Tk, &mask);
        problem p = {Tq, Tk, Tk, Tk, scores, NULL, NULL, NULL, mask};

        float *got = grade_alloc_f((int64_t)Tq * Tk);
        char where[160];
        snprintf(where, sizeof where, "case %d of %d (Tq = %d, Tk = %d, %s, scores %s)", c + 1,
                 CASES, Tq, Tk, mask_name(cases[c].mask),
                 cases[c].hi > 0 ? "between 60 and 120" : "of order 1");
        grade_running(where);
        masked_softmax(Tq, Tk, scores, mask, got);

        attn_ctx ctx;
        attn_ctx_init(&ctx);
        float *eye = grade_alloc_f((int64_t)Tk * Tk);
        for (int64_t i = 0; i < (int64_t)Tk * Tk; i++)
            eye[i] = (i / Tk == i % Tk) ? 1.0f : 0.0f;
        float *want = grade_alloc_f((int64_t)Tq * Tk), *unused = grade_alloc_f((int64_t)Tq * Tk);
        int st = reference(&ctx, &p, scores, eye, eye, Tk, Tk, 1, want, unused);
        if (st) {
            grade_library_failed(r, "attn_sdpa_ref", &ctx, st);
            grade_free_all();
            return;
        }

        grade_variant vars[16];
        int nvar = 0;
        wrong_opts base = {1.0, MASK_RIGHT, 0, 0, 0, 0}, o;
        o = base; o.mask_mode = MASK_ZERO; add_variant(vars, &nvar, &MASKED_ZERO, &p, o, 0);
        o = base; o.mask_mode = MASK_FLIP; add_variant(vars, &nvar, &MASK_INVERTED, &p, o, 0);
        o = base; o.mask_mode = MASK_TRANSPOSE; add_variant(vars, &nvar, &MASK_TRANSPOSED, &p, o, 0);
        o = base; o.mask_mode = MASK_AFTER; add_variant(vars, &nvar, &MASK_AFTER_SOFTMAX, &p, o, 0);
        o = base; o.mask_mode = MASK_NONE; add_variant(vars, &nvar, &MASK_IGNORED, &p, o, 0);
        o = base; o.over_queries = 1; add_variant(vars, &nvar, &SOFTMAX_AXIS, &p, o, 0);
        o = base; o.no_division = 1; add_variant(vars, &nvar, &NO_DIVISION, &p, o, 0);

        grade_output out = {"weights", 2, {Tq, Tk}, got, want};
        int ok = grade_case(r, where, 1, &out, nvar, vars, cases[c].hi > 0 ? &NO_MAX : NULL);
        grade_free_all();
        if (!ok)
            return;
    }
}

void grade_sdpa(grade_result *r)
{
    enum { CASES = 5 };
    /* The chapter's D = 4 is too small to tell 1/D from 1/sqrt(D) well; these
     * have D != Dv, Tq != Tk, D = 64 as in real models, one query and one key,
     * and more queries than keys. */
    static const struct { int Tq, Tk, D, Dv, mask; } cases[CASES] = {
        {3, 5, 8, 4, 0}, {4, 7, 64, 64, 1}, {5, 5, 16, 16, 2}, {1, 1, 3, 2, 0}, {6, 3, 5, 9, 3}};
    grade_begin(r, CASES);
    attn_rng rng;
    attn_rng_seed(&rng, 4);
    for (int c = 0; c < CASES; c++) {
        const int Tq = cases[c].Tq, Tk = cases[c].Tk, D = cases[c].D, Dv = cases[c].Dv;
        float *q = grade_alloc_f((int64_t)Tq * D), *k = grade_alloc_f((int64_t)Tk * D),
              *v = grade_alloc_f((int64_t)Tk * Dv);
        grade_randn(&rng, q, (int64_t)Tq * D, 1.0f);
        grade_randn(&rng, k, (int64_t)Tk * D, 1.0f);
        grade_randn(&rng, v, (int64_t)Tk * Dv, 1.0f);
        uint8_t *mask;
        make_mask(&rng, cases[c].mask, Tq, Tk, &mask);
        problem p = {Tq, Tk, D, Dv, NULL, q, k, v, mask};

        float *gw = grade_alloc_f((int64_t)Tq * Tk), *go = grade_alloc_f((int64_t)Tq * Dv);
        char where[160];
        snprintf(where, sizeof where, "case %d of %d (Tq = %d, Tk = %d, D = %d, Dv = %d, %s)",
                 c + 1, CASES, Tq, Tk, D, Dv, mask_name(cases[c].mask));
        grade_running(where);
        sdpa(Tq, Tk, D, Dv, q, k, v, mask, gw, go);

        attn_ctx ctx;
        attn_ctx_init(&ctx);
        float *ww = grade_alloc_f((int64_t)Tq * Tk), *wo = grade_alloc_f((int64_t)Tq * Dv);
        int st = reference(&ctx, &p, q, k, v, D, Dv, 0, ww, wo);
        if (st) {
            grade_library_failed(r, "attn_sdpa_ref", &ctx, st);
            grade_free_all();
            return;
        }

        grade_variant vars[16];
        int nvar = 0;
        const double right = 1.0 / sqrt((double)D);
        wrong_opts base = {right, MASK_RIGHT, 0, 0, 0, 0}, o;
        o = base; o.scale = 1.0; add_variant(vars, &nvar, &SCALE_MISSING, &p, o, 1);
        o = base; o.scale = 1.0 / D; add_variant(vars, &nvar, &SCALE_ONE_OVER_D, &p, o, 1);
        o = base; o.scale = sqrt((double)D); add_variant(vars, &nvar, &SCALE_TIMES_SQRT_D, &p, o, 1);
        o = base; o.scale = 0.0; add_variant(vars, &nvar, &SCALE_ZERO, &p, o, 1);
        if (Dv != D) {
            o = base; o.scale = 1.0 / sqrt((double)Dv);
            add_variant(vars, &nvar, &SCALE_DV, &p, o, 1);
        }
        o = base; o.mask_mode = MASK_ZERO; add_variant(vars, &nvar, &MASKED_ZERO, &p, o, 1);
        o = base; o.mask_mode = MASK_FLIP; add_variant(vars, &nvar, &MASK_INVERTED, &p, o, 1);
        o = base; o.mask_mode = MASK_TRANSPOSE; add_variant(vars, &nvar, &MASK_TRANSPOSED, &p, o, 1);
        o = base; o.mask_mode = MASK_AFTER; add_variant(vars, &nvar, &MASK_AFTER_SOFTMAX, &p, o, 1);
        o = base; o.mask_mode = MASK_NONE; add_variant(vars, &nvar, &MASK_IGNORED, &p, o, 1);
        o = base; o.over_queries = 1; add_variant(vars, &nvar, &SOFTMAX_AXIS, &p, o, 1);
        o = base; o.no_division = 1; add_variant(vars, &nvar, &NO_DIVISION, &p, o, 1);
        o = base; o.k_transposed = 1; add_variant(vars, &nvar, &K_LAYOUT, &p, o, 1);
        o = base; o.v_transposed = 1; add_variant(vars, &nvar, &V_LAYOUT, &p, o, 1);

        grade_output outs[2] = {{"weights", 2, {Tq, Tk}, gw, ww}, {"out", 2, {Tq, Dv}, go, wo}};
        int ok = grade_case(r, where, 2, outs, nvar, vars, NULL);
        grade_free_all();
        if (!ok)
            return;
    }
}
