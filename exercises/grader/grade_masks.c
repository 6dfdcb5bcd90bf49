/*
 * grade_masks.c - exercises 1 and 2: the padding mask and the causal mask, against
 * attn_mask_padding (broadcast over queries with attn_mask_and) and
 * attn_mask_causal.
 */
#include <stdio.h>
#include <string.h>

#include "grader.h"

static const grade_mistake MASK_INVERTED = {
    "mask-inverted", "the mask's meaning is inverted: 1 where the key is hidden",
    "Here (as in the chapter and in F.scaled_dot_product_attention) true means \"may attend\". "
    "nn.MultiheadAttention's key_padding_mask and boolean attn_mask use the opposite "
    "convention (true = ignore), which is the usual source of this mix-up. Flip the condition."};

static const grade_mistake MASK_QUERIES = {
    "mask-queries", "the padding masks queries instead of keys",
    "mask[b][i][j] must depend on token j (the key), not on token i (the query): the chapter's "
    "mask is [B, 1, 1, T], a row vector over keys, so every query of a sample gets the same row. "
    "Hiding a pad QUERY is wrong: it hides nothing from the real tokens, which still read the "
    "pad keys."};

static const grade_mistake PAD_WRONG_SAMPLE = {
    "pad-wrong-sample", "every sample gets sample 0's padding: the sample's offset is missing",
    "token_ids is [B, T], row-major: key j of sample b is token_ids[b * T + j]. Reading "
    "token_ids[j] gives every sample the pads of sample 0, so the other samples hide the "
    "wrong keys and show their own pads."};

static const grade_mistake PAD_NOT_MASKED = {
    "pad-not-masked", "nothing is masked: the pad keys are visible",
    "Compare each key's token id with pad_id: key j is masked (0) when "
    "token_ids[b * T + j] == pad_id."};

static const grade_mistake CAUSAL_TRANSPOSED = {
    "causal-transposed", "the triangle is the wrong way round: queries see the future",
    "Row i is the query and column j the key. Position i may see j <= i (the lower triangle, "
    "the chapter's picture); j >= i lets every position read the answers to its right."};

static const grade_mistake CAUSAL_NO_DIAGONAL = {
    "causal-no-diagonal", "the diagonal is masked: a position cannot see itself",
    "Position t sees positions 0..t, itself included, so the condition is j <= i, not j < i. "
    "Without the diagonal the first row has no key at all and its softmax is 0/0."};

static const grade_mistake CAUSAL_OFF_BY_ONE = {
    "causal-off-by-one", "the diagonal is one step too far right: each position sees the next token",
    "Position i may see j <= i, not j <= i + 1. The key at i + 1 is the very token position i "
    "has to predict (the label is the input shifted by one), so training would copy the answer "
    "and generation, which has no next token to read, would fail."};

static const grade_mistake CAUSAL_NOTHING_MASKED = {
    "causal-nothing-masked", "nothing is masked: every position sees every other",
    "Entry (i, j) is 1 only when j <= i; the keys to the right of the query (j > i) are "
    "the future and must be 0."};

static int padding_case(grade_result *r, const char *where, int B, int T,
                        const int64_t *ids, int64_t pad)
{
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    int64_t n = (int64_t)B * T * T;
    uint8_t *got = grade_alloc_u8(n);
    padding_mask(B, T, ids, pad, got);

    /* The reference: attn_mask_padding's [B, 1, 1, T], broadcast to [B, 1, T, T] by
     * AND-ing it with a mask of ones. */
    uint8_t *key = grade_alloc_u8((int64_t)B * T), *ones = grade_alloc_u8((int64_t)T * T);
    uint8_t *want = grade_alloc_u8(n);
    memset(ones, 1, (size_t)T * (size_t)T);
    attn_tensor tids, tkey, tones, twant;
    int64_t sid[2] = {B, T}, skey[4] = {B, 1, 1, T}, sones[4] = {1, 1, T, T},
            swant[4] = {B, 1, T, T};
    int st = attn_tensor_init(&ctx, &tids, ATTN_DTYPE_I64, (void *)ids, 2, sid);
    if (!st) st = attn_tensor_init(&ctx, &tkey, ATTN_DTYPE_BOOL, key, 4, skey);
    if (!st) st = attn_tensor_init(&ctx, &tones, ATTN_DTYPE_BOOL, ones, 4, sones);
    if (!st) st = attn_tensor_init(&ctx, &twant, ATTN_DTYPE_BOOL, want, 4, swant);
    if (!st) st = attn_mask_padding(&ctx, &tids, pad, &tkey);
    if (!st) st = attn_mask_and(&ctx, &tkey, &tones, &twant);
    if (st) {
        grade_library_failed(r, "attn_mask_padding / attn_mask_and", &ctx, st);
        return 0;
    }

    float *inverted = grade_alloc_f(n), *queries = grade_alloc_f(n), *first = grade_alloc_f(n),
          *all = grade_alloc_f(n);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = 0; j < T; j++) {
                int64_t at = (b * T + i) * T + j;
                inverted[at] = want[at] ? 0.0f : 1.0f;
                queries[at] = ids[b * T + i] != pad ? 1.0f : 0.0f;
                first[at] = ids[j] != pad ? 1.0f : 0.0f;
                all[at] = 1.0f;
            }
    grade_variant vars[] = {
        {&MASK_INVERTED, {inverted}},
        {&MASK_QUERIES, {queries}},
        {&PAD_WRONG_SAMPLE, {first}},
        {&PAD_NOT_MASKED, {all}},
    };
    int64_t shape[3] = {B, T, T};
    return grade_mask_case(r, where, "mask", 3, shape, got, want,
                           (int)(sizeof vars / sizeof vars[0]), vars);
}

static void describe_ids(char *buf, size_t size, int B, int T, const int64_t *ids, int64_t pad,
                         int which, int cases)
{
    buf[0] = '\0';
    grade_appendf(buf, size, "case %d of %d (B = %d, T = %d, pad_id = %lld, token_ids = [",
                  which, cases, B, T, (long long)pad);
    for (int b = 0; b < B; b++) {
        grade_appendf(buf, size, "%s[", b ? ", " : "");
        for (int t = 0; t < T; t++)
            grade_appendf(buf, size, "%s%lld", t ? ", " : "", (long long)ids[b * T + t]);
        grade_appendf(buf, size, "]");
    }
    grade_appendf(buf, size, "])");
}

void grade_padding_mask(grade_result *r)
{
    enum { CASES = 4 };
    grade_begin(r, CASES);
    /* The chapter's batch; pads in the middle and at the start with pad_id 7 and a
     * sample without pads; a single token; random ids where pad_id 2 is common. */
    static const int64_t chapter[] = {1, 2, 3, 4, 0, 6, 7, 8, 0, 0};
    static const int64_t middle[] = {7, 1, 2, 3, 4, 7, 7, 5, 1, 2, 3, 4};
    static const int64_t single[] = {5};
    int64_t random_ids[2 * 6];
    attn_rng rng;
    attn_rng_seed(&rng, 11);
    for (int i = 0; i < 12; i++)
        random_ids[i] = attn_rng_u32(&rng) % 4;
    random_ids[0] = 2; /* at least one pad, at the start of sample 0 */

    struct { int B, T; const int64_t *ids; int64_t pad; } cases[CASES] = {
        {2, 5, chapter, 0}, {3, 4, middle, 7}, {1, 1, single, 0}, {2, 6, random_ids, 2}};
    char where[512];
    for (int c = 0; c < CASES; c++) {
        describe_ids(where, sizeof where, cases[c].B, cases[c].T, cases[c].ids, cases[c].pad,
                     c + 1, CASES);
        grade_running(where);
        int ok = padding_case(r, where, cases[c].B, cases[c].T, cases[c].ids, cases[c].pad);
        grade_free_all();
        if (!ok)
            return;
    }
}

void grade_causal_mask(grade_result *r)
{
    enum { CASES = 4 };
    static const int sizes[CASES] = {4, 1, 2, 7};
    grade_begin(r, CASES);
    for (int c = 0; c < CASES; c++) {
        int T = sizes[c];
        attn_ctx ctx;
        attn_ctx_init(&ctx);
        uint8_t *got = grade_alloc_u8((int64_t)T * T), *want = grade_alloc_u8((int64_t)T * T);
        char where[128];
        snprintf(where, sizeof where, "case %d of %d (T = %d)", c + 1, CASES, T);
        grade_running(where);
        causal_mask(T, got);
        attn_tensor tw;
        int64_t sw[4] = {1, 1, T, T};
        int st = attn_tensor_init(&ctx, &tw, ATTN_DTYPE_BOOL, want, 4, sw);
        if (!st) st = attn_mask_causal(&ctx, T, &tw);
        if (st) {
            grade_library_failed(r, "attn_mask_causal", &ctx, st);
            grade_free_all();
            return;
        }
        float *inverted = grade_alloc_f((int64_t)T * T), *upper = grade_alloc_f((int64_t)T * T),
              *strict = grade_alloc_f((int64_t)T * T), *ahead = grade_alloc_f((int64_t)T * T),
              *all = grade_alloc_f((int64_t)T * T);
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = 0; j < T; j++) {
                inverted[i * T + j] = j > i ? 1.0f : 0.0f;
                upper[i * T + j] = j >= i ? 1.0f : 0.0f;
                strict[i * T + j] = j < i ? 1.0f : 0.0f;
                ahead[i * T + j] = j <= i + 1 ? 1.0f : 0.0f;
                all[i * T + j] = 1.0f;
            }
        grade_variant vars[] = {
            {&MASK_INVERTED, {inverted}},
            {&CAUSAL_TRANSPOSED, {upper}},
            {&CAUSAL_NO_DIAGONAL, {strict}},
            {&CAUSAL_OFF_BY_ONE, {ahead}},
            {&CAUSAL_NOTHING_MASKED, {all}},
        };
        int64_t shape[2] = {T, T};
        int ok = grade_mask_case(r, where, "mask", 2, shape, got, want,
                                 (int)(sizeof vars / sizeof vars[0]), vars);
        grade_free_all();
        if (!ok)
            return;
    }
}
