/*
 * inspect_self_attention.c - the chapter's experiment, in C.
 *
 * It does not train anything. It draws a batch x ~ N(0, 1) [B, T, E] and the
 * projection weights (nn.Linear's default initialisation) from a seed, builds demo
 * token ids with padding, the padding mask, the causal mask and their AND, runs
 * multi-head self-attention asking for the weights, and prints the seven lines of
 * the chapter: the shapes, the token ids, the first head's first weight row and
 * which keys the last real token of sample 0 may attend to.
 *
 * Usage: inspect_self_attention [--batch-size 2] [--seq-len 5] [--embed-dim 16]
 *                               [--num-heads 4] [--seed 42]
 */
#include "attn.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct options {
    int64_t batch_size; /* B */
    int64_t seq_len;    /* T */
    int64_t embed_dim;  /* E */
    int64_t num_heads;  /* H */
    uint64_t seed;
} options;

static const char *prog = "inspect_self_attention";

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: %s [OPTIONS]\n"
            "\n"
            "The chapter's experiment: multi-head self-attention on a random batch with a\n"
            "padding mask and a causal mask, printing the shapes and what the masks do.\n"
            "\n"
            "Options (defaults as in the chapter):\n"
            "  --batch-size B   sequences in the batch (default 2)\n"
            "  --seq-len T      tokens per sequence (default 5)\n"
            "  --embed-dim E    embedding size (default 16); must be divisible by H\n"
            "  --num-heads H    attention heads (default 4)\n"
            "  --seed N         random seed for x and the weights (default 42)\n"
            "  -h, --help       show this help and exit\n"
            "\n"
            "Output: seven lines, x_shape, token_ids, output_shape, attention_shape,\n"
            "combined_mask_shape, first_head_weights_row0 (weights[0, 0, 0, :] rounded\n"
            "to 4 decimals) and last_real_query_can_attend_to (the combined mask's row\n"
            "for the last real token of sample 0, as 0/1).\n"
            "\n"
            "Exit status: 0 on success, 2 on a bad option, 1 on any other error.\n",
            prog);
}

/* Parses a whole decimal number in [lo, hi]; prints one line and returns 0 if not. */
static int parse_int(const char *flag, const char *text, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (text[0] == '\0' || *end != '\0' || errno == ERANGE) {
        fprintf(stderr, "%s: %s expects a whole number, got '%s'\n", prog, flag, text);
        return 0;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "%s: %s must be between %lld and %lld, got %lld\n", prog, flag,
                (long long)lo, (long long)hi, v);
        return 0;
    }
    *out = v;
    return 1;
}

/* Returns 0 to run, 1 when --help was printed, 2 on a usage error. */
static int parse_options(int argc, char **argv, options *o)
{
    o->batch_size = 2;
    o->seq_len = 5;
    o->embed_dim = 16;
    o->num_heads = 4;
    o->seed = 42;
    /* Sizes are capped so that the experiment's arrays stay printable and in memory. */
    const int64_t max_size = 1 << 20;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            usage(stdout);
            return 1;
        }
        const char *names[] = {"--batch-size", "--seq-len", "--embed-dim", "--num-heads", "--seed"};
        int which = -1;
        const char *value = NULL;
        for (int n = 0; n < 5; n++) {
            size_t len = strlen(names[n]);
            if (!strncmp(arg, names[n], len) && (arg[len] == '\0' || arg[len] == '=')) {
                which = n;
                value = arg[len] == '=' ? arg + len + 1 : NULL;
            }
        }
        if (which < 0) {
            fprintf(stderr, "%s: unknown option '%s' (see --help)\n", prog, arg);
            return 2;
        }
        if (!value) {
            if (i + 1 >= argc) {
                fprintf(stderr, "%s: %s needs a value\n", prog, names[which]);
                return 2;
            }
            value = argv[++i];
        }
        int64_t v;
        int ok = which == 4 ? parse_int(names[which], value, 0, INT64_MAX, &v)
                            : parse_int(names[which], value, 1, max_size, &v);
        if (!ok)
            return 2;
        switch (which) {
        case 0: o->batch_size = v; break;
        case 1: o->seq_len = v; break;
        case 2: o->embed_dim = v; break;
        case 3: o->num_heads = v; break;
        case 4: o->seed = (uint64_t)v; break;
        }
    }
    if (o->embed_dim % o->num_heads != 0) {
        fprintf(stderr, "%s: --embed-dim %" PRId64 " is not divisible by --num-heads %" PRId64 "\n",
                prog, o->embed_dim, o->num_heads);
        return 2;
    }
    /* In double: each size is at most 2^20, so the products cannot overflow there. */
    const double limit = (double)(1 << 28);
    if ((double)o->batch_size * (double)o->seq_len * (double)o->embed_dim > limit ||
        (double)o->batch_size * (double)o->num_heads * (double)o->seq_len * (double)o->seq_len > limit ||
        3.0 * (double)o->embed_dim * (double)o->embed_dim > limit) {
        fprintf(stderr, "%s: sizes B=%" PRId64 " T=%" PRId64 " E=%" PRId64 " H=%" PRId64
                        " are too large for the experiment (over 2^28 elements)\n",
                prog, o->batch_size, o->seq_len, o->embed_dim, o->num_heads);
        return 2;
    }
    return 0;
}

/* The chapter's demo token ids [B, T]: sample b has
 * real_len = max(1, T - 1 - (b mod max(1, min(T, 3)))) real tokens numbered
 * 1 .. real_len plus b*T, then pad tokens (id 0). */
static int64_t demo_real_len(int64_t b, int64_t T)
{
    int64_t m = T < 3 ? T : 3;
    if (m < 1)
        m = 1;
    int64_t len = T - 1 - (b % m);
    return len < 1 ? 1 : len;
}

/* Prints weights[0, 0, 0, j] rounded to 4 decimals in Python's shortest form:
 * "%.4f" rounds correctly, then trailing zeros go, keeping one ("1.0", "0.25"). */
static void print_rounded(float value)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%.4f", (double)value);
    size_t n = strlen(buf);
    while (n > 0 && buf[n - 1] == '0' && buf[n - 2] != '.')
        buf[--n] = '\0';
    fputs(buf, stdout);
}

static void print_shape(const char *name, const attn_tensor *t)
{
    char s[128];
    attn_shape_format(s, sizeof s, t->ndim, t->shape);
    printf("%s=%s\n", name, s);
}

/* Everything the experiment computes, so each step can be inspected. */
typedef struct experiment {
    attn_tensor x;              /* [B, T, E]   float32 */
    attn_mha_weights w;         /* qkv [3E, E] + [3E], output [E, E] + [E] */
    attn_tensor token_ids;      /* [B, T]      int64 */
    attn_tensor padding_mask;   /* [B, 1, 1, T] bool */
    attn_tensor causal_mask;    /* [1, 1, T, T] bool */
    attn_tensor combined_mask;  /* [B, 1, T, T] bool */
    attn_tensor output;         /* [B, T, E]   float32 */
    attn_tensor attention;      /* [B, H, T, T] float32 */
} experiment;

static void experiment_free(attn_ctx *ctx, experiment *e)
{
    attn_tensor *all[] = {&e->x, &e->w.w_qkv, &e->w.b_qkv, &e->w.w_o, &e->w.b_o,
                          &e->token_ids, &e->padding_mask, &e->causal_mask,
                          &e->combined_mask, &e->output, &e->attention};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        attn_tensor_free(ctx, all[i]);
}

static int experiment_run(attn_ctx *ctx, const options *o, experiment *e)
{
    const int64_t B = o->batch_size, T = o->seq_len, E = o->embed_dim, H = o->num_heads;
    int rc;
    memset(e, 0, sizeof *e);
#define TRY(call)         \
    do {                  \
        if ((rc = (call))) \
            return rc;    \
    } while (0)
    const int64_t x_shape[3] = {B, T, E}, wqkv_shape[2] = {3 * E, E}, bqkv_shape[1] = {3 * E},
                  wo_shape[2] = {E, E}, bo_shape[1] = {E}, ids_shape[2] = {B, T},
                  pad_shape[4] = {B, 1, 1, T}, causal_shape[4] = {1, 1, T, T},
                  comb_shape[4] = {B, 1, T, T}, attn_shape[4] = {B, H, T, T};
    TRY(attn_tensor_alloc(ctx, &e->x, ATTN_DTYPE_F32, 3, x_shape));
    TRY(attn_tensor_alloc(ctx, &e->w.w_qkv, ATTN_DTYPE_F32, 2, wqkv_shape));
    TRY(attn_tensor_alloc(ctx, &e->w.b_qkv, ATTN_DTYPE_F32, 1, bqkv_shape));
    TRY(attn_tensor_alloc(ctx, &e->w.w_o, ATTN_DTYPE_F32, 2, wo_shape));
    TRY(attn_tensor_alloc(ctx, &e->w.b_o, ATTN_DTYPE_F32, 1, bo_shape));
    TRY(attn_tensor_alloc(ctx, &e->token_ids, ATTN_DTYPE_I64, 2, ids_shape));
    TRY(attn_tensor_alloc(ctx, &e->padding_mask, ATTN_DTYPE_BOOL, 4, pad_shape));
    TRY(attn_tensor_alloc(ctx, &e->causal_mask, ATTN_DTYPE_BOOL, 4, causal_shape));
    TRY(attn_tensor_alloc(ctx, &e->combined_mask, ATTN_DTYPE_BOOL, 4, comb_shape));
    TRY(attn_tensor_alloc(ctx, &e->output, ATTN_DTYPE_F32, 3, x_shape));
    TRY(attn_tensor_alloc(ctx, &e->attention, ATTN_DTYPE_F32, 4, attn_shape));

    /* x ~ N(0, 1), then nn.Linear's default initialisation of the two projections:
     * weight and bias uniform in +-1/sqrt(in_features) (in_features = E for both). */
    attn_rng rng;
    attn_rng_seed(&rng, o->seed);
    attn_rng_randn(&rng, e->x.data, B * T * E);
    const float bound = (float)(1.0 / sqrt((double)E));
    attn_rng_uniform(&rng, e->w.w_qkv.data, 3 * E * E, -bound, bound);
    attn_rng_uniform(&rng, e->w.b_qkv.data, 3 * E, -bound, bound);
    attn_rng_uniform(&rng, e->w.w_o.data, E * E, -bound, bound);
    attn_rng_uniform(&rng, e->w.b_o.data, E, -bound, bound);

    int64_t *ids = e->token_ids.data;
    for (int64_t b = 0; b < B; b++) {
        int64_t real_len = demo_real_len(b, T);
        for (int64_t t = 0; t < T; t++)
            ids[b * T + t] = t < real_len ? t + 1 + b * T : 0;
    }

    /* padding [B, 1, 1, T] AND causal [1, 1, T, T] -> combined [B, 1, T, T] */
    TRY(attn_mask_padding(ctx, &e->token_ids, 0, &e->padding_mask));
    TRY(attn_mask_causal(ctx, T, &e->causal_mask));
    TRY(attn_mask_and(ctx, &e->padding_mask, &e->causal_mask, &e->combined_mask));

    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.mask = &e->combined_mask;
    TRY(attn_mha_forward(ctx, &e->w, H, &e->x, &p, &e->output, &e->attention));
#undef TRY
    return ATTN_OK;
}

static void experiment_print(const options *o, const experiment *e)
{
    const int64_t B = o->batch_size, T = o->seq_len;
    print_shape("x_shape", &e->x);

    const int64_t *ids = e->token_ids.data;
    printf("token_ids=[");
    for (int64_t b = 0; b < B; b++) {
        printf(b ? ", [" : "[");
        for (int64_t t = 0; t < T; t++)
            printf(t ? ", %" PRId64 : "%" PRId64, ids[b * T + t]);
        printf("]");
    }
    printf("]\n");

    print_shape("output_shape", &e->output);
    print_shape("attention_shape", &e->attention);
    print_shape("combined_mask_shape", &e->combined_mask);

    const float *w = e->attention.data; /* weights[0, 0, 0, :] is the first T floats */
    printf("first_head_weights_row0=[");
    for (int64_t j = 0; j < T; j++) {
        if (j)
            printf(", ");
        print_rounded(w[j]);
    }
    printf("]\n");

    /* The last real token of sample 0 is its last non-pad position. */
    int64_t last = 0;
    for (int64_t t = 0; t < T; t++)
        if (ids[t] != 0)
            last = t;
    const uint8_t *m = e->combined_mask.data; /* [B, 1, T, T]: sample 0, row `last` */
    printf("last_real_query_can_attend_to=[");
    for (int64_t j = 0; j < T; j++)
        printf(j ? ", %d" : "%d", m[last * T + j] ? 1 : 0);
    printf("]\n");
}

int main(int argc, char **argv)
{
    options o;
    int rc = parse_options(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : 2;

    attn_ctx ctx;
    attn_ctx_init(&ctx);
    experiment e;
    rc = experiment_run(&ctx, &o, &e);
    if (rc) {
        fprintf(stderr, "%s: %s\n", prog, ctx.message[0] ? ctx.message : attn_strerror(rc));
        experiment_free(&ctx, &e);
        return 1;
    }
    experiment_print(&o, &e);
    experiment_free(&ctx, &e);
    return fflush(stdout) == 0 ? 0 : 1;
}
