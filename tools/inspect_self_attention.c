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
 * With the same seed it computes on the same numbers as the chapter's PyTorch code:
 * x and both nn.Linear layers are drawn as torch.manual_seed + torch.randn +
 * nn.Linear's default initialisation draw them (src/core/rng.c).
 *
 * It runs the library's reference kernels (attn_sdpa_ref and the plain loops of
 * attn_linear) unless --impl fused asks for the fast ones, so that a debugger
 * stops in the three steps of src/attention/sdpa_ref.c (`make learn`,
 * docs/debugging.md).
 *
 * For a learner there is more to see on request: --trace prints every step with its
 * formula and shape, --values the numbers of every step for one sample and head,
 * --dump DIR writes every array (.npy, .safetensors), --heatmap FILE.svg and --show
 * draw the masks and each head's scaled scores and weights for one sample, --layout
 * separate draws the weights as three nn.Linear(E, E) layers (the chapter's W_q,
 * W_k, W_v) and --mistake NAME shows what one classic mistake changes
 * (tools/common_mistakes.c).
 *
 * Usage: inspect_self_attention [--batch-size 2] [--seq-len 5] [--embed-dim 16]
 *                               [--num-heads 4] [--seed 42] [--trace] [--dump DIR]
 *                               [--heatmap FILE.svg] [--show] [--sample 0]
 *                               [--values] [--head 0] [--impl ref|fused]
 *                               [--layout fused|separate] [--mistake NAME]
 */
#define _POSIX_C_SOURCE 200809L /* mkdir, isatty, fileno, open_memstream */

#include "attn.h"
#include "common_cli.h"
#include "common_grad.h"
#include "common_heatmap.h"
#include "common_mistakes.h"
#include "common_trace.h"
#include "common_values.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct options {
    int64_t batch_size; /* B */
    int64_t seq_len;    /* T */
    int64_t embed_dim;  /* E */
    int64_t num_heads;  /* H */
    uint64_t seed;
    int trace;          /* --trace: print each step with its formula and shape */
    int grad;           /* --grad: the gradient of mean(output) for every step */
    const char *dump;   /* --dump DIR: write every array there, or NULL */
    const char *heatmap; /* --heatmap FILE.svg, or NULL */
    int show;           /* --show: heatmaps in the terminal */
    int64_t sample;     /* --sample N: which sample --heatmap, --show and --values show */
    int64_t head;       /* --head N: which head --values shows */
    int values;         /* --values: print every step's matrices */
    int impl;           /* --impl: IMPL_REF (the default) or IMPL_FUSED */
    int layout;         /* --layout: LAYOUT_FUSED (the default) or LAYOUT_SEPARATE */
    int mistake;        /* --mistake: a mistake enum value, MISTAKE_NONE by default */
} options;

enum { IMPL_REF = 0, IMPL_FUSED = 1 };
static const char *const impl_names[] = {"ref", "fused", NULL};
enum { LAYOUT_FUSED = 0, LAYOUT_SEPARATE = 1 };
static const char *const layout_names[] = {"fused", "separate", NULL};

static const char *prog = "inspect_self_attention";

static const char HELP[] =
    "NAME\n"
    "    inspect_self_attention - the chapter's experiment: multi-head self-attention\n"
    "    on a random batch with a padding mask and a causal mask\n"
    "\n"
    "SYNOPSIS\n"
    "    inspect_self_attention [--batch-size B] [--seq-len T] [--embed-dim E]\n"
    "                           [--num-heads H] [--seed N] [--trace] [--grad]\n"
    "                           [--dump DIR]\n"
    "                           [--heatmap FILE.svg] [--show] [--sample S]\n"
    "                           [--values] [--head N] [--impl ref|fused]\n"
    "                           [--layout fused|separate] [--mistake NAME]\n"
    "\n"
    "DESCRIPTION\n"
    "    Draws x ~ N(0, 1) [B, T, E] and the projection weights (nn.Linear's default\n"
    "    initialisation) from the seed, builds demo token ids with padding, the\n"
    "    padding mask [B, 1, 1, T] (pad id 0), the causal mask [1, 1, T, T] and their\n"
    "    AND [B, 1, T, T], runs multi-head self-attention asking for the weights\n"
    "    [B, H, T, T], and prints seven lines: x_shape, token_ids, output_shape,\n"
    "    attention_shape, combined_mask_shape, first_head_weights_row0\n"
    "    (weights[0, 0, 0, :] rounded to 4 decimals) and\n"
    "    last_real_query_can_attend_to (the combined mask's row for the last real\n"
    "    token of sample 0, as 0/1).\n"
    "    It runs the library's reference kernels unless --impl fused is given.\n"
    "\n"
    "OPTIONS\n"
    "    --batch-size B\n"
    "        Sequences in the batch, 1..1048576 (default 2).\n"
    "    --seq-len T\n"
    "        Tokens per sequence, 1..1048576 (default 5).\n"
    "    --embed-dim E\n"
    "        Embedding size, 1..1048576 (default 16); must be divisible by H.\n"
    "    --num-heads H\n"
    "        Attention heads, 1..1048576 (default 4).\n"
    "    --seed N\n"
    "        Random seed for x and the weights, 0..9223372036854775807 (default 42);\n"
    "        the same seed draws the same numbers as torch.manual_seed(N).\n"
    "    --impl ref|fused\n"
    "        Which kernels run: ref (the default) is the reference, the chapter's\n"
    "        three steps on plain loops (attn_sdpa_ref, src/attention/sdpa_ref.c, and\n"
    "        attn_linear's plain loops), the code to step through in a debugger;\n"
    "        fused is the library's fast path (the fused online-softmax kernel and\n"
    "        the packed GEMM on the best instruction set, or ATTN_ARCH's), which\n"
    "        never builds the [T, T] scores.\n"
    "    --layout fused|separate\n"
    "        How the weights are drawn. fused (the default) is the chapter's module:\n"
    "        qkv = nn.Linear(E, 3E), then output = nn.Linear(E, E); W_q, W_k and W_v\n"
    "        are rows 0..E-1, E..2E-1 and 2E..3E-1 of qkv.weight. separate draws\n"
    "        three nn.Linear(E, E) layers in q, k, v order, then the output layer, as\n"
    "        a module written with q_proj, k_proj, v_proj and out_proj draws them\n"
    "        after the same torch.manual_seed; they are stored stacked as qkv.weight\n"
    "        all the same. The two layouts draw different numbers from one seed.\n"
    "    --trace\n"
    "        After the seven lines, each step with its formula and shape, the masks\n"
    "        and how they broadcast, and which kernel ran (for the fused kernel,\n"
    "        that it never materialises the scores).\n"
    "    --grad\n"
    "        After the seven lines (and --trace), the experiment one step further:\n"
    "        the gradient of the loss L = mean(output) with respect to each step's\n"
    "        tensor, from the output back to x (output, W_o, b_o, the merged context,\n"
    "        v, k, q per head, qkv, W_qkv, b_qkv, x), one line each: its shape, its\n"
    "        norm and its first four values. Every element of dL/doutput is\n"
    "        1 / (B T E); the rest is attn_sdpa_backward and attn_mha_backward\n"
    "        (docs/gradients.md). Always the correct module, even with --mistake.\n"
    "    --values\n"
    "        After the seven lines, the numbers of every step for one sample and\n"
    "        head (--sample, --head): x, q, k, v of that head, the raw scores q k^T,\n"
    "        the scaled scores, the masked scores (-inf where hidden), the weights,\n"
    "        the context, the merged heads and the output, each titled with its\n"
    "        formula and shape, rows and columns labelled 'pos P (id I)' (position\n"
    "        P, token id I), rounded to 4 decimals.\n"
    "    --head N\n"
    "        The head --values shows, 0..H-1 (default 0).\n"
    "    --mistake NAME\n"
    "        Run the attention with one classic mistake, on plain loops with\n"
    "        PyTorch's semantics (tools/common_mistakes.c): no-scale (no 1/sqrt(D)),\n"
    "        inverted-mask (true read as 'hide', nn.MultiheadAttention's boolean\n"
    "        attn_mask convention), mask-queries (the padding mask hides pad\n"
    "        queries instead of pad keys), softmax-wrong-axis (softmax over the\n"
    "        queries), mask-zero (hidden scores 0 instead of -inf); none (the\n"
    "        default) is the correct run. The seven lines, --values, --dump,\n"
    "        --heatmap and --show then show the mistaken numbers, and lines after\n"
    "        the seven say which mistake is on and what it changed against the\n"
    "        correct run.\n"
    "    --dump DIR\n"
    "        Write x.npy, token_ids.npy, padding_mask.npy, causal_mask.npy,\n"
    "        combined_mask.npy, weights.safetensors (qkv.weight, qkv.bias,\n"
    "        output.weight, output.bias), output.npy and attention.npy into DIR\n"
    "        (created if needed, and removed again if the run fails), and the\n"
    "        steps between them: q.npy, k.npy, v.npy [B, H, T, D] (after the\n"
    "        head split), scores.npy (q k^T), scaled_scores.npy (/ sqrt(D)),\n"
    "        masked_scores.npy (-inf where hidden) [B, H, T, T] and context.npy\n"
    "        [B, H, T, D] (weights v, before the merge).\n"
    "    --heatmap FILE.svg\n"
    "        An SVG of the padding, causal and combined masks and each head's\n"
    "        scaled scores (before the softmax, -inf where masked) and attention\n"
    "        weights for one sample, positions and token ids on the axes as\n"
    "        \"pos P (id I)\" (T <= 256, H <= 64; hover a cell to read its value).\n"
    "    --show\n"
    "        The same heatmaps in the terminal (in colour when the output is a\n"
    "        terminal and NO_COLOR is not set).\n"
    "    --sample S\n"
    "        The sample --heatmap, --show and --values show, 0..B-1 (default 0).\n"
    "    -h, --help\n"
    "        Print this help and exit.\n"
    "\n"
    "    Options take their value as the next argument or after '=' (--seed=7).\n"
    "    B*T*E, B*H*T*T and 3*E*E must each stay at most 2^28 elements.\n"
    "\n"
    CLI_HELP_NUMBERS
    "\n"
    CLI_HELP_EXIT
    "\n"
    "ENVIRONMENT\n"
    "    ATTN_ARCH\n"
    "        With --impl fused, the instruction set the fast path runs on: scalar,\n"
    "        avx2 or avx512 (default: the best this CPU has; an unknown value is\n"
    "        taken as that default). --trace says which ran and why. The\n"
    "        reference (--impl ref) is the same plain loops whatever it says.\n"
    "    NO_COLOR\n"
    "        When set, --show shades the cells with characters even on a\n"
    "        terminal.\n"
    "    ATTN_FAIL_ALLOC_AT=N\n"
    "        Make the Nth allocation fail (for testing the out-of-memory paths:\n"
    "        exit 1, one line, no file written).\n"
    "    ATTN_TEST_OUTPUT_PAUSE_MS=N\n"
    "        Wait N ms (1..600000) after --dump's and --heatmap's files are\n"
    "        written and before they are renamed into place (for testing Ctrl-C).\n"
    "    The library's other variables (ATTN_TILE, ...) are in 'attn --help'.\n"
    "\n"
    "FILES\n"
    "    DIR/*.npy, DIR/weights.safetensors\n"
    "        What --dump DIR writes (listed under --dump): numpy's .npy, read\n"
    "        with numpy.load, and safetensors, the chapter module's state_dict\n"
    "        (torch's load_state_dict takes it as it is). The attn program reads\n"
    "        them too: ATTN_ARCH=ref attn forward --weights\n"
    "        DIR/weights.safetensors --num-heads H --input DIR/x.npy ... gives\n"
    "        output.npy's bytes (docs/walkthrough.md).\n"
    "    FILE.svg\n"
    "        What --heatmap writes: one self-contained SVG, no scripts.\n"
    "\n"
    "EXAMPLES\n"
    "    inspect_self_attention --seq-len 8 --trace --heatmap weights.svg\n"
    "    inspect_self_attention --values --sample 1 --head 2\n"
    "    inspect_self_attention --mistake mask-zero --show\n"
    "    inspect_self_attention --grad\n"
    "\n"
    "SEE ALSO\n"
    "    inspect_modern_attention --help (chapter 21's experiment),\n"
    "    train_attention --help, attn forward --help; docs/walkthrough.md (this\n"
    "    experiment, step by step), docs/debugging.md, docs/exercises.md.\n";

/* Returns CLI_PARSED to run, CLI_EXIT_OK when --help was printed, or
 * CLI_EXIT_USAGE after one line on stderr. */
static int parse_options(int argc, char **argv, options *o)
{
    /* Sizes are capped so that the experiment's arrays stay printable and in memory. */
    const int64_t max_size = 1 << 20;
    int64_t seed = 42;
    o->batch_size = 2;
    o->seq_len = 5;
    o->embed_dim = 16;
    o->num_heads = 4;
    o->trace = 0;
    o->grad = 0;
    o->dump = NULL;
    o->heatmap = NULL;
    o->show = 0;
    o->sample = -1; /* -1: not given (the option's range starts at 0) */
    o->head = -1;
    o->values = 0;
    o->impl = IMPL_REF;
    o->layout = LAYOUT_FUSED;
    o->mistake = MISTAKE_NONE;
    cli_opt opts[] = {
        {"batch-size", CLI_INT, &o->batch_size, NULL, 1, max_size, 0},
        {"seq-len", CLI_INT, &o->seq_len, NULL, 1, max_size, 0},
        {"embed-dim", CLI_INT, &o->embed_dim, NULL, 1, max_size, 0},
        {"num-heads", CLI_INT, &o->num_heads, NULL, 1, max_size, 0},
        {"seed", CLI_INT, &seed, NULL, 0, INT64_MAX, 0},
        {"trace", CLI_FLAG, &o->trace, NULL, 0, 0, 0},
        {"grad", CLI_FLAG, &o->grad, NULL, 0, 0, 0},
        {"dump", CLI_STRING, &o->dump, NULL, 0, 0, 0},
        {"heatmap", CLI_STRING, &o->heatmap, NULL, 0, 0, 0},
        {"show", CLI_FLAG, &o->show, NULL, 0, 0, 0},
        {"sample", CLI_INT, &o->sample, NULL, 0, max_size, 0},
        {"head", CLI_INT, &o->head, NULL, 0, max_size, 0},
        {"values", CLI_FLAG, &o->values, NULL, 0, 0, 0},
        {"impl", CLI_CHOICE, &o->impl, impl_names, 0, 0, 0},
        {"layout", CLI_CHOICE, &o->layout, layout_names, 0, 0, 0},
        {"mistake", CLI_CHOICE, &o->mistake, mistake_names, 0, 0, 0},
    };
    int rc = cli_parse(prog, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), HELP);
    if (rc != CLI_PARSED)
        return rc;
    o->seed = (uint64_t)seed;
    /* A picture of T x T cells per head stops being readable (and an SVG with a
     * titled <rect> per cell stops being small) long before memory runs out. */
    if ((o->heatmap || o->show) && (o->seq_len > 256 || o->num_heads > 64))
        return cli_usage_error(prog, "--heatmap and --show draw at most --seq-len 256 and "
                               "--num-heads 64, got %" PRId64 " and %" PRId64,
                               o->seq_len, o->num_heads);
    /* An option that changes nothing is a mistake the learner should hear about:
     * `--head 2` alone would print the seven lines, which show head 0, and leave
     * them thinking they were looking at head 2. */
    if (o->sample >= 0 && !(o->values || o->heatmap || o->show))
        return cli_usage_error(prog, "--sample picks the sample that --values, --heatmap and "
                               "--show show; give one of them with it");
    if (o->head >= 0 && !o->values)
        return cli_usage_error(prog, "--head picks the head that --values shows; give "
                               "--values with it (the seven lines always show head 0)");
    if (o->sample < 0)
        o->sample = 0;
    if (o->head < 0)
        o->head = 0;
    if (o->sample >= o->batch_size)
        return cli_usage_error(prog, "--sample %" PRId64 " is out of range for --batch-size %"
                               PRId64 " (samples are 0 .. %" PRId64 ")",
                               o->sample, o->batch_size, o->batch_size - 1);
    if (o->head >= o->num_heads)
        return cli_usage_error(prog, "--head %" PRId64 " is out of range for --num-heads %"
                               PRId64 " (heads are 0 .. %" PRId64 ")",
                               o->head, o->num_heads, o->num_heads - 1);
    if (o->embed_dim % o->num_heads != 0)
        return cli_usage_error(prog, "--embed-dim %" PRId64 " is not divisible by --num-heads %"
                               PRId64, o->embed_dim, o->num_heads);
    /* In double: each size is at most 2^20, so the products cannot overflow there. */
    const double limit = (double)(1 << 28);
    if ((double)o->batch_size * (double)o->seq_len * (double)o->embed_dim > limit ||
        (double)o->batch_size * (double)o->num_heads * (double)o->seq_len * (double)o->seq_len > limit ||
        3.0 * (double)o->embed_dim * (double)o->embed_dim > limit)
        return cli_usage_error(prog, "sizes B=%" PRId64 " T=%" PRId64 " E=%" PRId64 " H=%" PRId64
                               " are too large for the experiment (over 2^28 elements)",
                               o->batch_size, o->seq_len, o->embed_dim, o->num_heads);
    return CLI_PARSED;
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
    if (isnan(value)) { /* Python prints NaN as "nan" whatever its sign bit */
        fputs("nan", stdout);
        return;
    }
    snprintf(buf, sizeof buf, "%.4f", (double)value);
    size_t n = strlen(buf);
    while (n > 0 && buf[n - 1] == '0' && buf[n - 2] != '.')
        buf[--n] = '\0';
    fputs(buf, stdout);
}

/* "NAME=[w0, w1, ...]" and then `end`. */
static void print_weights_row(const char *name, const float *w, int64_t n, const char *end)
{
    printf("%s=[", name);
    for (int64_t j = 0; j < n; j++) {
        if (j)
            printf(", ");
        print_rounded(w[j]);
    }
    printf("]%s", end);
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
    /* With --values, --dump or --mistake: every step's array (common_values.h).
     * Under a mistake, output and attention above hold the mistaken results and
     * the two below the correct ones, for the comparison. */
    int have_steps;
    steps st;
    attn_tensor correct_output;    /* [B, T, E]    only under a mistake */
    attn_tensor correct_attention; /* [B, H, T, T] only under a mistake */
} experiment;

static void experiment_free(attn_ctx *ctx, experiment *e)
{
    attn_tensor *all[] = {&e->x, &e->w.w_qkv, &e->w.b_qkv, &e->w.w_o, &e->w.b_o,
                          &e->token_ids, &e->padding_mask, &e->causal_mask,
                          &e->combined_mask, &e->output, &e->attention,
                          &e->correct_output, &e->correct_attention};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        attn_tensor_free(ctx, all[i]);
    if (e->have_steps)
        steps_free(ctx, &e->st);
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

    /* x ~ N(0, 1), then nn.Linear's default initialisation of the two projections
     * (qkv = Linear(E, 3E), then output = Linear(E, E); weight then bias, uniform in
     * +-1/sqrt(in_features)), draw for draw as PyTorch after torch.manual_seed. */
    attn_rng rng;
    attn_rng_seed(&rng, o->seed);
    attn_rng_randn(&rng, e->x.data, B * T * E);
    float *wqkv = e->w.w_qkv.data, *bqkv = e->w.b_qkv.data;
    if (o->layout == LAYOUT_SEPARATE) {
        /* Three nn.Linear(E, E) layers, q then k then v, each weight then bias: the
         * same bounds as Linear(E, 3E) (both have in_features E) but another order
         * of draws, so other numbers. Stacked, they are qkv.weight's row blocks. */
        for (int64_t part = 0; part < 3; part++)
            attn_rng_linear_init(&rng, wqkv + part * E * E, bqkv + part * E, E, E);
    } else {
        attn_rng_linear_init(&rng, wqkv, bqkv, 3 * E, E);
    }
    attn_rng_linear_init(&rng, e->w.w_o.data, e->w.b_o.data, E, E);

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

    if (o->values || o->dump || o->mistake != MISTAKE_NONE) {
        e->have_steps = 1;
        TRY(steps_run(ctx, &e->x, &e->w, H, &e->padding_mask, &e->combined_mask,
                      (mistake)o->mistake, &e->st));
    }
    if (o->mistake != MISTAKE_NONE) {
        /* Keep the correct results for the comparison; everything printed, drawn or
         * written from here on is the mistaken run's. */
        TRY(attn_tensor_alloc(ctx, &e->correct_output, ATTN_DTYPE_F32, 3, x_shape));
        TRY(attn_tensor_alloc(ctx, &e->correct_attention, ATTN_DTYPE_F32, 4, attn_shape));
        memcpy(e->correct_output.data, e->output.data, (size_t)(B * T * E) * sizeof(float));
        memcpy(e->correct_attention.data, e->attention.data, (size_t)(B * H * T * T) * sizeof(float));
        memcpy(e->output.data, e->st.output.data, (size_t)(B * T * E) * sizeof(float));
        memcpy(e->attention.data, e->st.weights.data, (size_t)(B * H * T * T) * sizeof(float));
    }
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

    /* weights[0, 0, 0, :] is the first T floats */
    print_weights_row("first_head_weights_row0", e->attention.data, T, "\n");

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

/* ------------------------------------------------------------------------------
 * --mistake: what it is and what it changed against the correct run
 * ---------------------------------------------------------------------------- */

/* Counts the rows of `rows` x `n` arrays where the mistaken run differs from the
 * correct one: by more than 1e-6 (the mistaken loops and the reference compute an
 * unchanged row in the same order, so they agree far closer than that), or by being
 * NaN in one and not the other. Also the rows that hold a NaN, and the largest
 * finite difference. */
static void compare_rows(const float *bad, const float *good, int64_t rows, int64_t n,
                         int64_t *changed, int64_t *nan_rows, double *largest)
{
    *changed = *nan_rows = 0;
    *largest = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        int differs = 0, has_nan = 0;
        for (int64_t j = 0; j < n; j++) {
            const float a = bad[r * n + j], b = good[r * n + j];
            has_nan |= isnan(a);
            if (isnan(a) != isnan(b)) {
                differs = 1;
            } else if (!isnan(a)) {
                double d = fabs((double)a - (double)b);
                differs |= d > 1e-6;
                if (d > *largest)
                    *largest = d;
            }
        }
        *changed += differs;
        *nan_rows += has_nan;
    }
}

static void print_mistake(const options *o, const experiment *e)
{
    const int64_t B = o->batch_size, T = o->seq_len, E = o->embed_dim, H = o->num_heads;
    const mistake m = (mistake)o->mistake;
    printf("mistake=%s: %s\n", mistake_names[m], mistake_explain(m));
    printf("mistake_code=%s\n", mistake_code(m));
    const float *bad = e->attention.data, *good = e->correct_attention.data;
    int same = 1;
    for (int64_t j = 0; j < T; j++)
        same &= memcmp(&bad[j], &good[j], sizeof(float)) == 0;
    print_weights_row("correct_first_head_weights_row0", good, T,
                      same ? " (first_head_weights_row0 is unchanged by the mistake)\n"
                           : " (first_head_weights_row0 above is the mistaken one)\n");
    int64_t changed, nan_rows;
    double largest;
    compare_rows(bad, good, B * H * T, T, &changed, &nan_rows, &largest);
    printf("mistake_changed_weight_rows=%" PRId64 " of %" PRId64 " (largest finite difference %.4f;"
           " %" PRId64 " rows hold NaN)\n", changed, B * H * T, largest, nan_rows);
    compare_rows(e->output.data, e->correct_output.data, B * T, E, &changed, &nan_rows, &largest);
    printf("mistake_changed_output_rows=%" PRId64 " of %" PRId64 " (largest finite difference %.4f;"
           " %" PRId64 " rows hold NaN)\n", changed, B * T, largest, nan_rows);
}

/* ------------------------------------------------------------------------------
 * --trace: which kernel ran, then the step table (tools/common_trace.c)
 * ---------------------------------------------------------------------------- */

static void print_trace(const attn_ctx *ctx, const options *o)
{
    char kernel[256];
    char reason[512];
    const char *arch_reason = attn_arch_reason(ctx);
    attn_arch arch = attn_arch_selected(ctx);
    const char *scores_note = NULL;
    int scores_built = 1;
    if (ctx->impl == ATTN_IMPL_REF) {
        snprintf(kernel, sizeof kernel,
                 "reference: scores, masked softmax, weighted sum (attn_sdpa_ref, src/attention/sdpa_ref.c)");
        snprintf(reason, sizeof reason,
                 "--impl ref (the default): ctx->impl = ATTN_IMPL_REF and ctx->arch = ATTN_ARCH_REF");
    } else if (arch == ATTN_ARCH_REF) {
        snprintf(kernel, sizeof kernel,
                 "reference: scores, masked softmax, weighted sum (attn_sdpa_ref, src/attention/sdpa_ref.c)");
        snprintf(reason, sizeof reason, "--impl fused, but the selected arch is ref (%s)",
                 arch_reason);
    } else {
        snprintf(kernel, sizeof kernel,
                 "fused online-softmax kernel (attn_sdpa_fused, src/kernels/sdpa_fused.c), %s build",
                 attn_arch_name(arch));
        snprintf(reason, sizeof reason, "--impl fused: ctx->impl = ATTN_IMPL_FUSED; arch %s",
                 arch_reason);
        scores_built = 0;
        scores_note = "the fused kernel never materialises the scores [B, H, T, T]: steps 5 to 7 "
                      "run one tile of keys at a time with a running max and sum per query row; "
                      "the weights are recomputed tile by tile only because the experiment asks "
                      "for them";
    }
    char mistaken[512];
    if (o->mistake != MISTAKE_NONE) {
        /* The printed lines come from the mistaken run, not from the kernel above. */
        snprintf(mistaken, sizeof mistaken,
                 "MISTAKE %s: the seven lines, --values and the pictures come from the mistaken "
                 "steps on plain loops (tools/common_mistakes.c); the kernel above ran the "
                 "correct attention they are compared with", mistake_names[o->mistake]);
        scores_note = mistaken;
    }
    char projections[256];
    if (ctx->impl == ATTN_IMPL_REF || arch == ATTN_ARCH_REF)
        snprintf(projections, sizeof projections,
                 "attn_linear (src/attention/linear.c), its plain reference loops");
    else
        snprintf(projections, sizeof projections,
                 "attn_linear (src/attention/linear.c), the packed GEMM, %s build",
                 attn_arch_name(arch));
    trace_info t;
    t.B = o->batch_size;
    t.T = o->seq_len;
    t.E = o->embed_dim;
    t.H = o->num_heads;
    t.seed = o->seed;
    t.pad_id = 0;
    t.attention_kernel = kernel;
    t.kernel_reason = reason;
    t.scores_built = scores_built;
    t.scores_note = scores_note;
    t.projections = projections;
    t.separate_layout = o->layout == LAYOUT_SEPARATE;
    t.threads = attn_threads_resolve(ctx);
    trace_print(stdout, &t);
}

/* ------------------------------------------------------------------------------
 * --dump DIR: every array, in the formats the attn program reads
 * ---------------------------------------------------------------------------- */

/* Every file one run writes (--dump's arrays and weights, --heatmap's SVG), saved
 * as one output set: nothing is renamed into place before all are written. */
enum { DUMP_ARRAYS = 14, MAX_OUTPUTS = DUMP_ARRAYS + 2 };
typedef struct run_outputs {
    cli_output outs[MAX_OUTPUTS];
    int n;
    char paths[DUMP_ARRAYS + 1][4096];
    attn_tensor tensors[DUMP_ARRAYS + 4]; /* the arrays, then the four weights */
    char *svg;                            /* --heatmap's document (malloc'd) */
    size_t svg_len;
    int made_dir;                         /* dump_all created --dump's directory */
} run_outputs;

static int dump_all(const char *dir, const experiment *e, run_outputs *r)
{
    if (mkdir(dir, 0777) == 0) {
        r->made_dir = 1;
    } else if (errno != EEXIST) {
        fprintf(stderr, "%s: cannot create directory %s: %s\n", prog, dir, strerror(errno));
        return 1;
    }
    static const char *const files[DUMP_ARRAYS] = {
        "x.npy", "token_ids.npy", "padding_mask.npy", "causal_mask.npy",
        "combined_mask.npy", "output.npy", "attention.npy",
        "q.npy", "k.npy", "v.npy", "scores.npy", "scaled_scores.npy", "masked_scores.npy",
        "context.npy"};
    const attn_tensor *arrays[DUMP_ARRAYS] = {&e->x, &e->token_ids, &e->padding_mask,
                                              &e->causal_mask, &e->combined_mask,
                                              &e->output, &e->attention,
                                              &e->st.q, &e->st.k, &e->st.v, &e->st.scores,
                                              &e->st.scaled, &e->st.masked, &e->st.context};
    /* The chapter module's parameter names (nn.Module.state_dict()). */
    static const char *const names[4] = {"qkv.weight", "qkv.bias", "output.weight",
                                         "output.bias"};
    r->tensors[DUMP_ARRAYS + 0] = e->w.w_qkv;
    r->tensors[DUMP_ARRAYS + 1] = e->w.b_qkv;
    r->tensors[DUMP_ARRAYS + 2] = e->w.w_o;
    r->tensors[DUMP_ARRAYS + 3] = e->w.b_o;
    for (int i = 0; i <= DUMP_ARRAYS; i++) {
        snprintf(r->paths[i], sizeof r->paths[i], "%s/%s", dir,
                 i < DUMP_ARRAYS ? files[i] : "weights.safetensors");
        if (i < DUMP_ARRAYS) {
            r->tensors[i] = *arrays[i];
            r->outs[r->n++] = (cli_output){r->paths[i], &r->tensors[i], NULL, NULL, 0, NULL, 0};
        } else {
            r->outs[r->n++] = (cli_output){r->paths[i], NULL, names, &r->tensors[DUMP_ARRAYS],
                                           4, NULL, 0};
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------
 * --heatmap FILE.svg and --show: one sample's masks and weights
 * (tools/common_heatmap.c)
 * ---------------------------------------------------------------------------- */

/* Panels for sample s: padding mask [T] (one row: it is the same for every query),
 * causal mask [T, T], combined mask [T, T], then one [T, T] panel of scaled scores
 * per head (before the softmax, -inf where masked) and one of weights per head. The
 * masks are shown as 0/1 values, and every cell the mask forbids is marked. */
typedef struct picture {
    heatmap_panel panels[3 + 2 * 64];
    int n;
    float *mask_values;   /* padding [T], causal [T, T], combined [T, T] as 0/1 */
    uint8_t *mask_off;    /* the same three, 1 where the mask is false */
    float *scores;        /* [H, T, T] scaled scores of sample s */
    char titles[3 + 2 * 64][64];
    char title[512];
} picture;

/* The scaled scores of sample s, [H, T, T], as the reference's step 1 computes them
 * (src/attention/sdpa_ref.c): q and k of head h are columns h*D .. h*D+D-1 and
 * E + h*D .. of qkv = x W_qkv^T + b_qkv; score = (q . k in order of d) * 1/sqrt(D),
 * -inf where the combined mask is false. attn_mha_forward never hands its scores
 * out (the fused kernel never makes them), so the picture computes its own. */
static int picture_scores(attn_ctx *ctx, const options *o, const experiment *e, float *scores)
{
    const int64_t T = o->seq_len, E = o->embed_dim, H = o->num_heads, D = E / H, s = o->sample;
    const int64_t x_shape[2] = {T, E}, qkv_shape[2] = {T, 3 * E};
    float *qkv = malloc((size_t)(T * 3 * E) * sizeof(float));
    attn_tensor tx, tqkv;
    int rc = qkv ? ATTN_OK : ATTN_STATUS_NO_MEMORY;
    if (!rc)
        rc = attn_tensor_init(ctx, &tx, ATTN_DTYPE_F32, (float *)e->x.data + s * T * E, 2, x_shape);
    if (!rc)
        rc = attn_tensor_init(ctx, &tqkv, ATTN_DTYPE_F32, qkv, 2, qkv_shape);
    if (!rc)
        rc = attn_linear(ctx, &tx, &e->w.w_qkv, &e->w.b_qkv, &tqkv);
    if (rc) {
        fprintf(stderr, "%s: the heatmap's scores: %s\n", prog,
                rc == ATTN_STATUS_NO_MEMORY ? "out of memory" : ctx->message);
        free(qkv);
        return 1;
    }
    const float scale = (float)(1.0 / sqrt((double)D)); /* as sdpa_contract.c */
    const uint8_t *comb = (const uint8_t *)e->combined_mask.data + s * T * T;
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = 0; j < T; j++) {
                float dot = 0.0f;
                for (int64_t d = 0; d < D; d++)
                    dot += qkv[i * 3 * E + h * D + d] * qkv[j * 3 * E + E + h * D + d];
                scores[(h * T + i) * T + j] = comb[i * T + j] ? dot * scale : -INFINITY;
            }
    free(qkv);
    return 0;
}

static int picture_build(attn_ctx *ctx, const options *o, const experiment *e, picture *pic)
{
    const int64_t T = o->seq_len, H = o->num_heads, s = o->sample;
    const int64_t n = T + 2 * T * T;
    memset(pic, 0, sizeof *pic);
    if (H > 64) {
        fprintf(stderr, "%s: --heatmap and --show draw at most 64 heads, got %" PRId64 "\n",
                prog, H);
        return 1;
    }
    pic->mask_values = malloc((size_t)n * sizeof(float));
    pic->mask_off = malloc((size_t)n);
    pic->scores = malloc((size_t)(H * T * T) * sizeof(float));
    if (!pic->mask_values || !pic->mask_off || !pic->scores) {
        fprintf(stderr, "%s: out of memory for the heatmaps\n", prog);
        return 1;
    }
    if (picture_scores(ctx, o, e, pic->scores))
        return 1;
    const uint8_t *pad = (const uint8_t *)e->padding_mask.data + s * T;
    const uint8_t *cau = e->causal_mask.data;
    const uint8_t *comb = (const uint8_t *)e->combined_mask.data + s * T * T;
    for (int64_t i = 0; i < n; i++) {
        uint8_t m = i < T ? pad[i] : i < T + T * T ? cau[i - T] : comb[i - T - T * T];
        pic->mask_values[i] = m ? 1.0f : 0.0f;
        pic->mask_off[i] = !m;
    }
    const int64_t *ids = (const int64_t *)e->token_ids.data + s * T;
    const char *what[3] = {"padding mask", "causal mask", "combined mask"};
    const int64_t offset[3] = {0, T, T + T * T};
    for (int k = 0; k < 3; k++) {
        heatmap_panel *p = &pic->panels[k];
        snprintf(pic->titles[k], sizeof pic->titles[k], "%s", what[k]);
        p->title = pic->titles[k];
        p->rows = k == 0 ? 1 : T;
        p->cols = T;
        p->values = pic->mask_values + offset[k];
        p->masked = pic->mask_off + offset[k];
        p->row_stride = p->mask_row_stride = k == 0 ? 0 : T;
        p->col_stride = p->mask_col_stride = 1;
        p->row_labels = k == 0 ? NULL : ids;
        p->col_labels = ids;
        p->row_axis = k == 0 ? NULL : "query";
        p->col_axis = "key";
        p->kind = HEATMAP_MASK;
    }
    /* Every score panel shares one colour range, so the heads compare. */
    double range = 0.0;
    for (int64_t i = 0; i < H * T * T; i++)
        if (isfinite(pic->scores[i]) && fabs(pic->scores[i]) > range)
            range = fabs(pic->scores[i]);
    const float *att = (const float *)e->attention.data + s * H * T * T;
    for (int64_t k = 0; k < 2 * H; k++) {
        const int64_t h = k % H;
        const int is_scores = k < H;
        heatmap_panel *p = &pic->panels[3 + k];
        snprintf(pic->titles[3 + k], sizeof pic->titles[3 + k], "head %" PRId64 " %s", h,
                 is_scores ? "scaled scores" : "weights");
        p->title = pic->titles[3 + k];
        p->rows = p->cols = T;
        p->values = (is_scores ? pic->scores : att) + h * T * T;
        p->row_stride = p->mask_row_stride = T;
        p->col_stride = p->mask_col_stride = 1;
        p->masked = pic->mask_off + T + T * T; /* the combined mask, for every head */
        p->row_labels = p->col_labels = ids;
        p->row_axis = "query";
        p->col_axis = "key";
        p->kind = is_scores ? HEATMAP_SCORES : HEATMAP_WEIGHTS;
        p->range = range;
        p->new_row = h == 0; /* the scores on one row, the weights under them */
    }
    pic->n = (int)(3 + 2 * H);
    int used = snprintf(pic->title, sizeof pic->title,
                        "sample %" PRId64 ", token ids [", s);
    for (int64_t t = 0; t < T && used < (int)sizeof pic->title - 40; t++)
        used += snprintf(pic->title + used, sizeof pic->title - (size_t)used,
                         t ? ", %" PRId64 : "%" PRId64, ids[t]);
    used += snprintf(pic->title + used, sizeof pic->title - (size_t)used,
                     "] (pad id 0): masks, scaled scores and attention weights, B=%" PRId64 " T=%" PRId64
                     " E=%" PRId64 " H=%" PRId64 ", seed %" PRIu64,
                     o->batch_size, T, o->embed_dim, H, o->seed);
    if (o->mistake != MISTAKE_NONE && used < (int)sizeof pic->title)
        snprintf(pic->title + used, sizeof pic->title - (size_t)used,
                 "; MISTAKE %s (the weights are the mistaken ones, the masks the correct ones)",
                 mistake_names[o->mistake]);
    return 0;
}

static void picture_free(picture *pic)
{
    free(pic->mask_values);
    free(pic->mask_off);
    free(pic->scores);
}

/* Draws the SVG into memory; it joins the run's output set (see run_outputs). */
static int heatmap_svg_add(const char *path, const picture *pic, run_outputs *r)
{
    FILE *f = open_memstream(&r->svg, &r->svg_len);
    if (!f) {
        fprintf(stderr, "%s: out of memory for the heatmap %s\n", prog, path);
        return 1;
    }
    int bad = heatmap_write_svg(f, pic->title, pic->panels, pic->n, 3, 4) != 0;
    bad |= fclose(f) != 0;
    if (bad) {
        fprintf(stderr, "%s: out of memory drawing the heatmap %s\n", prog, path);
        return 1;
    }
    r->outs[r->n++] = (cli_output){path, NULL, NULL, NULL, 0, r->svg, r->svg_len};
    return 0;
}

int main(int argc, char **argv)
{
    options o;
    int rc = parse_options(argc, argv, &o);
    if (rc != CLI_PARSED)
        return rc;

    attn_ctx ctx;
    cli_ctx_init(&ctx);
    if (o.impl == IMPL_REF) {
        /* The reference kernels, so that a breakpoint in src/attention/sdpa_ref.c is
         * hit and attn_linear runs its plain loops (docs/debugging.md). */
        ctx.impl = ATTN_IMPL_REF;
        ctx.arch = ATTN_ARCH_REF;
    } else {
        ctx.impl = ATTN_IMPL_FUSED;
    }
    experiment e;
    rc = experiment_run(&ctx, &o, &e);
    if (rc) {
        fprintf(stderr, "%s: %s\n", prog, ctx.message[0] ? ctx.message : attn_strerror(rc));
        experiment_free(&ctx, &e);
        return 1;
    }
    experiment_print(&o, &e);
    /* The seven lines above stay exactly the chapter's; what follows is asked for. */
    if (o.mistake != MISTAKE_NONE)
        print_mistake(&o, &e);
    if (o.trace) {
        printf("\n");
        print_trace(&ctx, &o);
    }
    if (o.grad) {
        printf("\n");
        rc = grad_report(&ctx, stdout, &e.x, &e.w, o.num_heads, &e.combined_mask);
        if (rc) {
            fprintf(stderr, "%s: %s\n", prog, ctx.message[0] ? ctx.message : attn_strerror(rc));
            experiment_free(&ctx, &e);
            return 1;
        }
    }
    if (o.values) {
        printf("\n");
        values_print(stdout, &e.st, &e.x, e.token_ids.data, o.sample, o.head);
    }
    rc = 0;
    run_outputs *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, "%s: out of memory\n", prog);
        rc = 1;
    }
    if (rc == 0 && o.dump)
        rc = dump_all(o.dump, &e, r);
    if (rc == 0 && (o.heatmap || o.show)) {
        picture pic;
        rc = picture_build(&ctx, &o, &e, &pic);
        if (rc == 0 && o.heatmap)
            rc = heatmap_svg_add(o.heatmap, &pic, r);
        if (rc == 0 && o.show) {
            printf("\n%s\n\n", pic.title);
            int color = isatty(fileno(stdout)) && !getenv("NO_COLOR");
            heatmap_print_terminal(stdout, pic.panels, pic.n, color);
        }
        picture_free(&pic);
    }
    /* An interrupted run (SIGINT, SIGTERM) leaves no trace either. */
    if (rc == 0 && r->made_dir)
        cli_rmdir_on_signal(o.dump);
    if (rc == 0 && r->n > 0 && cli_save_outputs(prog, &ctx, r->n, r->outs))
        rc = 1;
    cli_rmdir_on_signal(NULL);
    /* A failed run leaves no trace, not even the --dump directory it made; rmdir
     * removes only an empty one, so files a late failure left renamed in it stay. */
    if (rc != 0 && r && r->made_dir)
        (void)rmdir(o.dump);
    if (r)
        free(r->svg);
    free(r);
    experiment_free(&ctx, &e);
    if (fflush(stdout) != 0)
        return 1;
    return rc;
}
