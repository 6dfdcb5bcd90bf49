/*
 * common_trace.c - the --trace of inspect_self_attention: SPEC section 1's table
 * with the sizes at hand, where each step lives in libattn, the masks and their
 * broadcast, and the kernel that ran.
 *
 * Only text: it computes nothing, so the shapes it prints are derived here from
 * B, T, E, H by the same rules the library checks (the tests compare them with the
 * arrays --dump writes). The numbers of each step are --values' (common_values.c).
 */
#include "common_trace.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

/* A shape as the issue writes it: "[2, 5, 16]". */
static const char *shape(char *buf, size_t size, int ndim, const int64_t *s)
{
    size_t used = 0;
    used += (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, i ? ", %" PRId64 : "%" PRId64, s[i]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
    return buf;
}

/* Writes s and pads it with spaces to `width` characters as a terminal shows them
 * (UTF-8 continuation bytes take no column). */
static void padded(FILE *f, const char *s, int width)
{
    int cols = 0;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++)
        cols += (*c & 0xc0) != 0x80;
    fputs(s, f);
    for (; cols < width; cols++)
        fputc(' ', f);
}

/* One step: number, what it does, the result's name and shape, the formula. */
static void step(FILE *f, int n, const char *what, const char *name, const char *shp,
                 const char *fmt, ...)
{
    char formula[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(formula, sizeof formula, fmt, ap);
    va_end(ap);
    char result[160];
    snprintf(result, sizeof result, "%s %s", name, shp);
    fprintf(f, "%2d  ", n);
    padded(f, what, 26);
    fputc(' ', f);
    padded(f, result, 26);
    fprintf(f, " %s\n", formula);
}

int trace_print(FILE *f, const trace_info *t)
{
    const int64_t B = t->B, T = t->T, E = t->E, H = t->H, D = t->E / t->H;
    char s[10][96], w1[64], w2[64], w3[64], w4[64];
    const int64_t x_s[3] = {B, T, E}, qkv_s[3] = {B, T, 3 * E}, view_s[4] = {B, T, H, D},
                  head_s[4] = {B, H, T, D}, sc_s[4] = {B, H, T, T}, wq_s[2] = {3 * E, E},
                  bq_s[1] = {3 * E}, wo_s[2] = {E, E}, bo_s[1] = {E},
                  pad_s[4] = {B, 1, 1, T}, cau_s[4] = {1, 1, T, T}, comb_s[4] = {B, 1, T, T};

    fprintf(f, "== trace: multi-head self-attention, B=%" PRId64 " T=%" PRId64 " E=%" PRId64
               " H=%" PRId64 " D=E/H=%" PRId64 " (seed %" PRIu64 ")\n",
            B, T, E, H, D, t->seed);
    fprintf(f, "%2s  %-26s %-26s %s\n", "#", "step", "result [shape]", "formula (where in libattn)");
    step(f, 1, "input", "x", shape(s[0], sizeof s[0], 3, x_s),
         "x ~ N(0, 1) as torch.randn(%" PRId64 ", %" PRId64 ", %" PRId64 ") (attn_rng_randn, src/core/rng.c)",
         B, T, E);
    step(f, 2, "fused q/k/v projection", "qkv", shape(s[1], sizeof s[1], 3, qkv_s),
         "qkv = x \xc2\xb7 W_qkv\xe1\xb5\x80 + b_qkv, W_qkv %s, b_qkv %s (attn_linear, src/attention/linear.c)",
         shape(w1, sizeof w1, 2, wq_s), shape(w2, sizeof w2, 1, bq_s));
    /* The chapter writes three projections; they are row blocks of the fused one. */
    fprintf(f, "%4s%s W_q = W_qkv[0:%" PRId64 "], W_k = W_qkv[%" PRId64 ":%" PRId64 "], W_v = W_qkv[%"
               PRId64 ":%" PRId64 "] (rows; the same blocks of b_qkv)%s\n",
            "", "the chapter's", E, E, 2 * E, 2 * E, 3 * E,
            t->separate_layout ? ", drawn as three nn.Linear(E, E) (--layout separate)" : "");
    char three[128];
    snprintf(three, sizeof three, "3 \xc3\x97 %s", shape(s[2], sizeof s[2], 3, x_s));
    step(f, 3, "split the last axis", "q, k, v", three,
         "q = qkv[..., 0:%" PRId64 "], k = qkv[..., %" PRId64 ":%" PRId64 "], v = qkv[..., %" PRId64
         ":%" PRId64 "] (strided views, attn_mha_forward, src/attention/mha.c)",
         E, E, 2 * E, 2 * E, 3 * E);
    step(f, 4, "split heads", "q, k, v", shape(s[3], sizeof s[3], 4, head_s),
         "view %s, swap axes 1 and 2 (no copy: strides, src/attention/mha.c)",
         shape(w3, sizeof w3, 4, view_s));
    char scale[64];
    snprintf(scale, sizeof scale, "%.9g", 1.0 / sqrt((double)D));
    const char *not_built = t->scores_built ? "" : " (never built by the fused kernel)";
    step(f, 5, "scaled dot products", "scores", shape(s[4], sizeof s[4], 4, sc_s),
         "scores = q \xc2\xb7 k\xe1\xb5\x80 / sqrt(%" PRId64 ") = q \xc2\xb7 k\xe1\xb5\x80 \xc3\x97 %s%s",
         D, scale, not_built);
    step(f, 6, "mask", "scores", shape(s[5], sizeof s[5], 4, sc_s),
         "scores = -inf where the combined mask %s is false%s",
         shape(w4, sizeof w4, 4, comb_s), not_built);
    step(f, 7, "softmax over the keys", "weights", shape(s[6], sizeof s[6], 4, sc_s),
         "weights = softmax(scores, axis=-1); a masked key gets exactly 0");
    step(f, 8, "weighted sum of values", "context", shape(s[7], sizeof s[7], 4, head_s),
         "context = weights \xc2\xb7 v");
    step(f, 9, "merge heads", "context", shape(s[8], sizeof s[8], 3, x_s),
         "swap axes 1 and 2, view [B, T, H\xc2\xb7" "D] (written in place, src/attention/mha.c)");
    step(f, 10, "output projection", "output", shape(s[9], sizeof s[9], 3, x_s),
         "output = context \xc2\xb7 W_o\xe1\xb5\x80 + b_o, W_o %s, b_o %s (attn_linear, src/attention/linear.c)",
         shape(w1, sizeof w1, 2, wo_s), shape(w2, sizeof w2, 1, bo_s));

    fprintf(f, "== masks (bool, true = may attend)\n");
    fprintf(f, "padding  %-16s false where the KEY token is the pad id %" PRId64
               " (attn_mask_padding, src/core/mask.c)\n",
            shape(s[0], sizeof s[0], 4, pad_s), t->pad_id);
    fprintf(f, "causal   %-16s true where key <= query, lower triangle (attn_mask_causal)\n",
            shape(s[1], sizeof s[1], 4, cau_s));
    fprintf(f, "combined %-16s padding AND causal (attn_mask_and): %s and %s broadcast to %s\n",
            shape(s[2], sizeof s[2], 4, comb_s), shape(w1, sizeof w1, 4, pad_s),
            shape(w2, sizeof w2, 4, cau_s), shape(w3, sizeof w3, 4, comb_s));
    fprintf(f, "         axis 0: padding has B=%" PRId64 ", causal 1 -> %" PRId64
               "; axis 2: padding 1 -> T=%" PRId64 " (every query sees the same keys)\n",
            B, B, T);
    fprintf(f, "scores   %-16s the combined mask %s broadcasts over axis 1: 1 -> H=%" PRId64
               " (every head uses the same mask)\n",
            shape(s[3], sizeof s[3], 4, sc_s), shape(w4, sizeof w4, 4, comb_s), H);

    fprintf(f, "== kernel\n");
    fprintf(f, "attention:   %s\n", t->attention_kernel ? t->attention_kernel : "unknown");
    if (t->kernel_reason)
        fprintf(f, "why:         %s\n", t->kernel_reason);
    if (t->scores_note)
        fprintf(f, "scores:      %s\n", t->scores_note);
    fprintf(f, "projections: %s\n",
            t->projections ? t->projections : "attn_linear (src/attention/linear.c)");
    fprintf(f, "threads:     at most %d (attn_threads_resolve); small calls such as the "
               "chapter's use fewer, and the count never changes the results\n",
            t->threads);
    return ferror(f) ? -1 : 0;
}
