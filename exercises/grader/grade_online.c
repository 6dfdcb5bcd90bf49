/*
 * grade_online.c - exercise 6 (stretch): the online softmax, against attn_sdpa_ref
 * on the same scores (q = the scores, k = the identity, scale 1, empty rows zero).
 *
 * The grader feeds each query row's keys one at a time, so the learner's code
 * cannot look ahead: it must keep the running max, sum and accumulator, and fix
 * them up when the max grows. The wrong answers are the same single pass with
 * one of those fix-ups left out.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "grader.h"

static const grade_mistake NO_RESCALE = {
    "no-rescale", "the running sum and accumulator are not rescaled when the max grows",
    "When a score raises the max from m to m', everything already in l and acc was computed "
    "as exp(s - m) and is too large by exp(m' - m): multiply both by exp(m - m') before "
    "adding the new key's exp(s - m') and exp(s - m') * v."};
static const grade_mistake RESCALE_SUM_ONLY = {
    "rescale-sum-only", "the running sum is rescaled when the max grows, the accumulator not",
    "l and acc hold terms computed against the same max, so both need the factor "
    "exp(m - m') when the max grows; acc (all Dv entries) was left as it was."};
static const grade_mistake RESCALE_ACC_ONLY = {
    "rescale-acc-only", "the accumulator is rescaled when the max grows, the running sum not",
    "l and acc hold terms computed against the same max, so both need the factor "
    "exp(m - m') when the max grows; l was left as it was."};
static const grade_mistake NO_DIVISION = {
    "no-normalisation", "the result is acc, not acc / l",
    "acc is the sum of exp(s - m) * v: the softmax's denominator is still missing. "
    "online_softmax_result must divide by l."};
static const grade_mistake MASKED_FIRST_NAN = {
    "masked-first-nan", "a row whose first keys are masked becomes NaN",
    "A masked key arrives with score -INFINITY. While the max is still -INFINITY, "
    "exp(m - m') is exp(-inf - (-inf)) = exp(NaN), and the NaN stays in l and acc for good. "
    "A masked key contributes nothing: return before touching the state (or guard the "
    "rescale when m' is -INFINITY)."};
static const grade_mistake EMPTY_ROW_NAN = {
    "empty-row-nan", "a row whose keys are all masked gives NaN instead of zeros",
    "With every key masked l stays 0 and acc / l is 0/0 = NaN. Guard the division: when "
    "l == 0 the result is zeros (libattn's ATTN_EMPTY_ROWS_ZERO does the same)."};
static const grade_mistake NO_RUNNING_MAX = {
    "no-max-subtraction", "the sum overflows on large scores: exp(score) without the running max",
    "exp(x) overflows float above about 88.7. Keep the running max m and add exp(score - m), "
    "rescaling what is already summed when m grows; every exp() is then at most 1."};

enum {
    RESCALE_L = 1, RESCALE_ACC = 2, DIVIDE = 4, SKIP_MASKED = 8, GUARD_EMPTY = 16,
    ALL_STEPS = 31
};

/* The single pass with some steps left out (in float, as a learner writes it, so
 * that its NaN fall where the learner's do). */
static void wrong_online(const float *s, const float *v, int Tk, int Dv, int steps,
                         float *out)
{
    float m = -INFINITY, l = 0.0f, acc[ONLINE_MAX_DV] = {0};
    for (int j = 0; j < Tk; j++) {
        if ((steps & SKIP_MASKED) && s[j] == -INFINITY)
            continue;
        float m_new = s[j] > m ? s[j] : m;
        float alpha = expf(m - m_new), p = expf(s[j] - m_new);
        l = ((steps & RESCALE_L) ? l * alpha : l) + p;
        for (int e = 0; e < Dv; e++)
            acc[e] = ((steps & RESCALE_ACC) ? acc[e] * alpha : acc[e]) + p * v[j * Dv + e];
        m = m_new;
    }
    for (int e = 0; e < Dv; e++) {
        if (!(steps & DIVIDE))
            out[e] = acc[e];
        else if ((steps & GUARD_EMPTY) && l == 0.0f)
            out[e] = 0.0f;
        else
            out[e] = acc[e] / l;
    }
}

enum { CASES = 7 };
/* Random scores; scores that grow with every key, so the max changes at each
 * step; rows whose first keys are masked; a single key; a row with every key
 * masked; D = 64-sized rows; scores large enough that exp() overflows. */
static const struct { int Tq, Tk, Dv, kind; } CASE[CASES] = {
    {3, 6, 4, 0}, {2, 8, 3, 1}, {3, 5, 4, 2}, {2, 1, 2, 0}, {2, 4, 3, 3}, {2, 64, 64, 4},
    {2, 10, 4, 5}};
static const char *const KIND[] = {
    "random scores", "scores growing with every key", "the first keys of rows 0 and 2 masked",
    "row 0 with every key masked", "a random mask", "scores between 60 and 120"};

void grade_online_softmax(grade_result *r)
{
    grade_begin(r, CASES);
    attn_rng rng;
    attn_rng_seed(&rng, 6);
    for (int c = 0; c < CASES; c++) {
        const int Tq = CASE[c].Tq, Tk = CASE[c].Tk, Dv = CASE[c].Dv, kind = CASE[c].kind;
        float *scores = grade_alloc_f((int64_t)Tq * Tk), *v = grade_alloc_f((int64_t)Tk * Dv);
        uint8_t *mask = grade_alloc_u8((int64_t)Tq * Tk);
        memset(mask, 1, (size_t)Tq * (size_t)Tk);
        if (kind == 5)
            attn_rng_uniform(&rng, scores, (int64_t)Tq * Tk, 60.0f, 120.0f);
        else
            grade_randn(&rng, scores, (int64_t)Tq * Tk, 2.0f);
        grade_randn(&rng, v, (int64_t)Tk * Dv, 1.0f);
        if (kind == 1)
            for (int64_t i = 0; i < Tq; i++)
                for (int64_t j = 0; j < Tk; j++)
                    scores[i * Tk + j] = -3.0f + 0.8f * (float)j + 0.1f * scores[i * Tk + j];
        if (kind == 2) {
            mask[0] = mask[1] = 0;
            mask[1 * Tk + 3] = 0;
            mask[2 * Tk + 0] = mask[2 * Tk + 1] = 0;
        }
        if (kind == 3)
            memset(mask, 0, (size_t)Tk);
        if (kind == 4)
            for (int64_t i = 0; i < (int64_t)Tq * Tk; i++)
                mask[i] = (uint8_t)((attn_rng_u32(&rng) % 4) != 0);

        char where[200];
        snprintf(where, sizeof where, "case %d of %d (%d rows of Tk = %d keys, Dv = %d%s%s)",
                 c + 1, CASES, Tq, Tk, Dv, ", ", KIND[kind]);
        grade_running(where);
        /* The learner's pass, one key at a time; the state starts as NaN bytes so
         * that a missing init shows. */
        float *got = grade_alloc_f((int64_t)Tq * Dv), *fed = grade_alloc_f((int64_t)Tq * Tk);
        for (int64_t i = 0; i < Tq; i++) {
            online_softmax st;
            memset(&st, 0xff, sizeof st);
            online_softmax_init(&st, Dv);
            for (int64_t j = 0; j < Tk; j++) {
                fed[i * Tk + j] = mask[i * Tk + j] ? scores[i * Tk + j] : -INFINITY;
                online_softmax_add(&st, fed[i * Tk + j], v + j * Dv);
            }
            online_softmax_result(&st, got + i * Dv);
        }

        attn_ctx ctx;
        attn_ctx_init(&ctx);
        float *eye = grade_alloc_f((int64_t)Tk * Tk), *want = grade_alloc_f((int64_t)Tq * Dv);
        for (int64_t i = 0; i < (int64_t)Tk * Tk; i++)
            eye[i] = (i / Tk == i % Tk) ? 1.0f : 0.0f;
        attn_tensor tq, tk, tv, tm, to;
        int64_t sq[2] = {Tq, Tk}, sk[2] = {Tk, Tk}, sv[2] = {Tk, Dv}, so[2] = {Tq, Dv};
        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        p.has_scale = 1;
        p.scale = 1.0f;
        p.empty_rows = ATTN_EMPTY_ROWS_ZERO;
        p.mask = &tm;
        int st = attn_tensor_init(&ctx, &tq, ATTN_DTYPE_F32, scores, 2, sq);
        if (!st) st = attn_tensor_init(&ctx, &tk, ATTN_DTYPE_F32, eye, 2, sk);
        if (!st) st = attn_tensor_init(&ctx, &tv, ATTN_DTYPE_F32, v, 2, sv);
        if (!st) st = attn_tensor_init(&ctx, &tm, ATTN_DTYPE_BOOL, mask, 2, sq);
        if (!st) st = attn_tensor_init(&ctx, &to, ATTN_DTYPE_F32, want, 2, so);
        if (!st) st = attn_sdpa_ref(&ctx, &tq, &tk, &tv, &p, &to, NULL);
        if (st) {
            grade_library_failed(r, "attn_sdpa_ref", &ctx, st);
            grade_free_all();
            return;
        }

        static const struct { const grade_mistake *m; int steps; } WRONG[] = {
            {&NO_RESCALE, ALL_STEPS & ~(RESCALE_L | RESCALE_ACC)},
            {&RESCALE_SUM_ONLY, ALL_STEPS & ~RESCALE_ACC},
            {&RESCALE_ACC_ONLY, ALL_STEPS & ~RESCALE_L},
            {&NO_DIVISION, ALL_STEPS & ~DIVIDE},
            /* Before masked-first-nan: on a row with every key masked both give NaN,
             * and there the missing guard is the mistake to name. */
            {&EMPTY_ROW_NAN, ALL_STEPS & ~GUARD_EMPTY},
            {&MASKED_FIRST_NAN, ALL_STEPS & ~SKIP_MASKED},
        };
        enum { NWRONG = sizeof WRONG / sizeof WRONG[0] };
        grade_variant vars[NWRONG];
        for (int w = 0; w < NWRONG; w++) {
            float *vals = grade_alloc_f((int64_t)Tq * Dv);
            for (int64_t i = 0; i < Tq; i++)
                wrong_online(fed + i * Tk, v, Tk, Dv, WRONG[w].steps, vals + i * Dv);
            vars[w] = (grade_variant){WRONG[w].m, {vals}};
        }

        grade_output out = {"out", 2, {Tq, Dv}, got, want};
        int ok = grade_case(r, where, 1, &out, NWRONG, vars, kind == 5 ? &NO_RUNNING_MAX : NULL);
        grade_free_all();
        if (!ok)
            return;
    }
}
