/*
 * common_values.c - the chapter's multi-head self-attention step by step with every
 * intermediate array kept, and the --values printer (see common_values.h).
 */
#include "common_values.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void steps_free(attn_ctx *ctx, steps *s)
{
    attn_tensor *all[] = {&s->qkv, &s->q, &s->k, &s->v, &s->scores, &s->scaled,
                          &s->masked, &s->weights, &s->context, &s->merged, &s->output};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        attn_tensor_free(ctx, all[i]);
}

int steps_run(attn_ctx *ctx, const attn_tensor *x, const attn_mha_weights *w, int64_t H,
              const attn_tensor *padding_mask, const attn_tensor *combined_mask, mistake m,
              steps *s)
{
    memset(s, 0, sizeof *s);
    const int64_t B = x->shape[0], T = x->shape[1], E = x->shape[2], D = E / H;
    s->B = B, s->T = T, s->E = E, s->H = H, s->D = D;
    s->mistake = m;
    const int64_t qkv_s[3] = {B, T, 3 * E}, head_s[4] = {B, H, T, D}, sc_s[4] = {B, H, T, T},
                  x_s[3] = {B, T, E};
    int rc;
    if ((rc = attn_tensor_alloc(ctx, &s->qkv, ATTN_DTYPE_F32, 3, qkv_s)) ||
        (rc = attn_tensor_alloc(ctx, &s->q, ATTN_DTYPE_F32, 4, head_s)) ||
        (rc = attn_tensor_alloc(ctx, &s->k, ATTN_DTYPE_F32, 4, head_s)) ||
        (rc = attn_tensor_alloc(ctx, &s->v, ATTN_DTYPE_F32, 4, head_s)) ||
        (rc = attn_tensor_alloc(ctx, &s->scores, ATTN_DTYPE_F32, 4, sc_s)) ||
        (rc = attn_tensor_alloc(ctx, &s->scaled, ATTN_DTYPE_F32, 4, sc_s)) ||
        (rc = attn_tensor_alloc(ctx, &s->masked, ATTN_DTYPE_F32, 4, sc_s)) ||
        (rc = attn_tensor_alloc(ctx, &s->weights, ATTN_DTYPE_F32, 4, sc_s)) ||
        (rc = attn_tensor_alloc(ctx, &s->context, ATTN_DTYPE_F32, 4, head_s)) ||
        (rc = attn_tensor_alloc(ctx, &s->merged, ATTN_DTYPE_F32, 3, x_s)) ||
        (rc = attn_tensor_alloc(ctx, &s->output, ATTN_DTYPE_F32, 3, x_s)))
        return rc;

    /* qkv = x W_qkv^T + b_qkv  [B, T, 3E], the same call attn_mha_forward makes. */
    if ((rc = attn_linear(ctx, x, &w->w_qkv, &w->b_qkv, &s->qkv)))
        return rc;

    /* The head split: q[b, h, t, d] = qkv[b, t, 0*E + h*D + d], k from column E, v
     * from 2E; copied here so that --dump writes them as plain [B, H, T, D] arrays. */
    const float *qkv = s->qkv.data;
    float *dst[3] = {s->q.data, s->k.data, s->v.data};
    for (int part = 0; part < 3; part++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t t = 0; t < T; t++)
                    memcpy(dst[part] + ((b * H + h) * T + t) * D,
                           qkv + (b * T + t) * 3 * E + part * E + h * D, (size_t)D * sizeof(float));

    /* Steps 1 to 3. The scale is the library's default, 1/sqrt(D) rounded once to
     * float (src/attention/sdpa_contract.c). */
    const float scale = (float)(1.0 / sqrt((double)D));
    const uint8_t *pad = padding_mask->data, *comb = combined_mask->data;
    if (m == MISTAKE_NONE) {
        /* The scores for display; the weights and context are the library's. */
        mistake_attention(m, B, H, T, D, scale, s->q.data, s->k.data, s->v.data, pad, comb,
                          s->scores.data, s->scaled.data, s->masked.data, NULL, NULL);
        attn_sdpa_params p;
        attn_sdpa_params_init(&p);
        p.mask = combined_mask;
        if ((rc = attn_sdpa(ctx, &s->q, &s->k, &s->v, &p, &s->context, &s->weights)))
            return rc;
    } else {
        mistake_attention(m, B, H, T, D, scale, s->q.data, s->k.data, s->v.data, pad, comb,
                          s->scores.data, s->scaled.data, s->masked.data, s->weights.data,
                          s->context.data);
    }

    /* The merge: merged[b, t, h*D + d] = context[b, h, t, d]. */
    const float *c = s->context.data;
    float *mg = s->merged.data;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++)
                memcpy(mg + (b * T + t) * E + h * D, c + ((b * H + h) * T + t) * D,
                       (size_t)D * sizeof(float));

    /* output = merged W_o^T + b_o  [B, T, E] */
    return attn_linear(ctx, &s->merged, &w->w_o, &w->b_o, &s->output);
}

/* ------------------------------------------------------------------------------
 * --values
 * ---------------------------------------------------------------------------- */

/* "pos 3 (id 4)": position 3 in the sequence holds token id 4. The heatmaps use the
 * same words. */
static void token_label(char *buf, size_t size, int64_t pos, int64_t id)
{
    snprintf(buf, size, "pos %" PRId64 " (id %" PRId64 ")", pos, id);
}

/* One number as --values prints it: 4 decimals, "-inf", "inf" or "nan". */
static void number(char *buf, size_t size, float v)
{
    if (isnan(v))
        snprintf(buf, size, "nan");
    else
        snprintf(buf, size, "%.4f", (double)v);
}

/* Prints a [rows, cols] matrix (element (i, j) at a[i * cols + j]) under `title`.
 * Rows are tokens, labelled "pos P (id I)" from ids; columns are tokens too when
 * col_tokens is set (a [T, T] array: rows are queries, columns keys), otherwise
 * feature indices 0 .. cols-1. Each column is as wide as its widest entry. */
static void matrix(FILE *f, const char *title, int64_t rows, int64_t cols, const float *a,
                   const int64_t *ids, int col_tokens)
{
    fprintf(f, "\n%s\n", title);
    char buf[64];
    int label_w = 0;
    for (int64_t i = 0; i < rows; i++) {
        token_label(buf, sizeof buf, i, ids[i]);
        int n = (int)strlen(buf);
        label_w = n > label_w ? n : label_w;
    }
    int *width = malloc((size_t)cols * sizeof *width);
    if (!width) {
        fprintf(f, "(out of memory for the column widths)\n");
        return;
    }
    for (int64_t j = 0; j < cols; j++) {
        if (col_tokens)
            token_label(buf, sizeof buf, j, ids[j]);
        else
            snprintf(buf, sizeof buf, "%" PRId64, j);
        width[j] = (int)strlen(buf);
        for (int64_t i = 0; i < rows; i++) {
            number(buf, sizeof buf, a[i * cols + j]);
            int n = (int)strlen(buf);
            width[j] = n > width[j] ? n : width[j];
        }
    }
    fprintf(f, "%*s", label_w, col_tokens ? "query \\ key" : "");
    for (int64_t j = 0; j < cols; j++) {
        if (col_tokens)
            token_label(buf, sizeof buf, j, ids[j]);
        else
            snprintf(buf, sizeof buf, "%" PRId64, j);
        fprintf(f, "  %*s", width[j], buf);
    }
    fputc('\n', f);
    for (int64_t i = 0; i < rows; i++) {
        token_label(buf, sizeof buf, i, ids[i]);
        fprintf(f, "%-*s", label_w, buf);
        for (int64_t j = 0; j < cols; j++) {
            number(buf, sizeof buf, a[i * cols + j]);
            fprintf(f, "  %*s", width[j], buf);
        }
        fputc('\n', f);
    }
    free(width);
}

int values_print(FILE *f, const steps *s, const attn_tensor *x, const int64_t *ids_all,
                 int64_t b, int64_t h)
{
    const int64_t T = s->T, E = s->E, H = s->H, D = s->D;
    const int64_t *ids = ids_all + b * T;
    const int64_t bh = (b * H + h);
    char title[512];

    fprintf(f, "== values: sample %" PRId64 ", head %" PRId64 " of %" PRId64 " (D = E/H = %"
               PRId64 "), token ids [",
            b, h, H, D);
    for (int64_t t = 0; t < T; t++)
        fprintf(f, t ? ", %" PRId64 : "%" PRId64, ids[t]);
    fprintf(f, "], rounded to 4 decimals\n");
    fprintf(f, "   a row or column 'pos P (id I)' is position P of the sequence, holding "
               "token id I (id 0 is padding)\n");
    if (s->mistake != MISTAKE_NONE)
        fprintf(f, "   MISTAKE %s is on: %s\n", mistake_names[s->mistake], mistake_code(s->mistake));

    snprintf(title, sizeof title, "x[%" PRId64 "]  [T, E] = [%" PRId64 ", %" PRId64
             "]  the input, one row per token", b, T, E);
    matrix(f, title, T, E, (const float *)x->data + b * T * E, ids, 0);

    const char *qkv_name[3] = {"q", "k", "v"};
    const attn_tensor *qkv_t[3] = {&s->q, &s->k, &s->v};
    for (int part = 0; part < 3; part++) {
        snprintf(title, sizeof title,
                 "%s[%" PRId64 ", %" PRId64 "]  [T, D] = [%" PRId64 ", %" PRId64 "]  "
                 "= x W_%s^T + b_%s, columns %" PRId64 "..%" PRId64 " of qkv (rows %" PRId64
                 "..%" PRId64 " of qkv.weight)",
                 qkv_name[part], b, h, T, D, qkv_name[part], qkv_name[part],
                 part * E + h * D, part * E + h * D + D - 1, part * E + h * D,
                 part * E + h * D + D - 1);
        matrix(f, title, T, D, (const float *)qkv_t[part]->data + bh * T * D, ids, 0);
    }

    const float scale = (float)(1.0 / sqrt((double)D));
    snprintf(title, sizeof title, "scores[%" PRId64 ", %" PRId64 "]  [T, T] = [%" PRId64 ", %"
             PRId64 "]  = q k^T (rows: queries, columns: keys)", b, h, T, T);
    matrix(f, title, T, T, (const float *)s->scores.data + bh * T * T, ids, 1);
    if (s->mistake == MISTAKE_NO_SCALE)
        snprintf(title, sizeof title, "scaled scores[%" PRId64 ", %" PRId64 "]  [%" PRId64
                 ", %" PRId64 "]  = q k^T, NOT divided by sqrt(%" PRId64 ") (mistake no-scale)",
                 b, h, T, T, D);
    else
        snprintf(title, sizeof title, "scaled scores[%" PRId64 ", %" PRId64 "]  [%" PRId64 ", %"
                 PRId64 "]  = q k^T / sqrt(%" PRId64 ") = q k^T * %.9g", b, h, T, T, D,
                 (double)scale);
    matrix(f, title, T, T, (const float *)s->scaled.data + bh * T * T, ids, 1);
    const char *how = "-inf where the combined mask is false (may not attend)";
    if (s->mistake == MISTAKE_INVERTED_MASK)
        how = "-inf where the combined mask is TRUE (mistake inverted-mask)";
    else if (s->mistake == MISTAKE_MASK_QUERIES)
        how = "-inf at pad QUERIES and future keys (mistake mask-queries)";
    else if (s->mistake == MISTAKE_MASK_ZERO)
        how = "0, NOT -inf, where the combined mask is false (mistake mask-zero)";
    snprintf(title, sizeof title, "masked scores[%" PRId64 ", %" PRId64 "]  [%" PRId64 ", %"
             PRId64 "]  = scaled scores, %s", b, h, T, T, how);
    matrix(f, title, T, T, (const float *)s->masked.data + bh * T * T, ids, 1);
    snprintf(title, sizeof title, "weights[%" PRId64 ", %" PRId64 "]  [%" PRId64 ", %" PRId64
             "]  = softmax(masked scores) over %s", b, h, T, T,
             s->mistake == MISTAKE_SOFTMAX_WRONG_AXIS
                 ? "the QUERIES: each column sums to 1 (mistake softmax-wrong-axis)"
                 : "the keys: each row sums to 1");
    matrix(f, title, T, T, (const float *)s->weights.data + bh * T * T, ids, 1);
    snprintf(title, sizeof title, "context[%" PRId64 ", %" PRId64 "]  [T, D] = [%" PRId64 ", %"
             PRId64 "]  = weights v", b, h, T, D);
    matrix(f, title, T, D, (const float *)s->context.data + bh * T * D, ids, 0);
    snprintf(title, sizeof title, "merged heads[%" PRId64 "]  [T, E] = [%" PRId64 ", %" PRId64
             "]  every head's context side by side: head %" PRId64 " is columns %" PRId64
             "..%" PRId64, b, T, E, h, h * D, h * D + D - 1);
    matrix(f, title, T, E, (const float *)s->merged.data + b * T * E, ids, 0);
    snprintf(title, sizeof title, "output[%" PRId64 "]  [T, E] = [%" PRId64 ", %" PRId64
             "]  = merged W_o^T + b_o", b, T, E);
    matrix(f, title, T, E, (const float *)s->output.data + b * T * E, ids, 0);
    return ferror(f) ? -1 : 0;
}
