/*
 * inspect_modern_attention.c - the tutorial's chapter 21 ("modern attention"), as an
 * experiment in C: RoPE, grouped-query attention, the KV cache and a sliding window
 * on one small random Llama-style attention block.
 *
 * It does not train anything. From a seed it draws x ~ N(0, 1) [B, T, E] and four
 * projections as nn.Linear(..., bias=False) layers draw them, in this order:
 * q_proj [H*D, E], k_proj [Hkv*D, E], v_proj [Hkv*D, E], o_proj [E, H*D], with
 * D = E / H. Then:
 *
 *   1. q, k, v = x W^T, split into heads: q [B, H, T, D], k and v [B, Hkv, T, D];
 *      query head h reads key/value head h / (H / Hkv) (grouped-query attention);
 *   2. RoPE turns each pair of features of q and k by an angle that grows with the
 *      position (attn_rope_apply); the pairs keep their lengths, which is checked;
 *   3. the full causal pass: attention over all T positions with the sliding-window
 *      causal mask (query i sees keys i - w + 1 .. i), then o_proj;
 *   4. decoding: the same block token by token through a KV cache (attn_kv_cache_*):
 *      each step appends one key and value (rotated as they are stored) and attends
 *      one query against the cache with the bottom-right causal mask and the window,
 *      and is compared with row t of the full pass.
 *
 * With the same seed it computes on the same numbers as PyTorch (src/core/rng.c);
 * tests/golden/gen_modern.py writes the same lines from a torch block.
 *
 * It runs the library's reference kernels unless --impl fused asks for the fast
 * ones. Not part of libattn: it uses include/attn.h only.
 */
#define _POSIX_C_SOURCE 200809L /* isatty, fileno, open_memstream */

#include "attn.h"
#include "common_cli.h"
#include "common_heatmap.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct options {
    int64_t batch_size;   /* B */
    int64_t seq_len;      /* T */
    int64_t embed_dim;    /* E */
    int64_t num_heads;    /* H */
    int64_t num_kv_heads; /* Hkv */
    int64_t window;       /* w: query i sees keys i - w + 1 .. i */
    int rope;             /* ROPE_INTERLEAVED or ROPE_HALF */
    float rope_base;
    uint64_t seed;
    int trace, values, show;
    const char *heatmap;
    int64_t sample, head;
    int impl;
} options;

enum { ROPE_INTERLEAVED = 0, ROPE_HALF = 1 };
static const char *const rope_names[] = {"interleaved", "half", NULL};
enum { IMPL_REF = 0, IMPL_FUSED = 1 };
static const char *const impl_names[] = {"ref", "fused", NULL};

static const char *prog = "inspect_modern_attention";

static const char HELP[] =
    "NAME\n"
    "    inspect_modern_attention - chapter 21's experiment: RoPE, grouped-query\n"
    "    attention, a sliding window and decoding through a KV cache\n"
    "\n"
    "SYNOPSIS\n"
    "    inspect_modern_attention [--batch-size B] [--seq-len T] [--embed-dim E]\n"
    "                             [--num-heads H] [--num-kv-heads HKV] [--window W]\n"
    "                             [--rope interleaved|half] [--rope-base BASE]\n"
    "                             [--seed N] [--impl ref|fused] [--trace] [--values]\n"
    "                             [--sample S] [--head N] [--heatmap FILE.svg]\n"
    "                             [--show]\n"
    "\n"
    "DESCRIPTION\n"
    "    Draws x ~ N(0, 1) [B, T, E] and then, as nn.Linear(..., bias=False) layers\n"
    "    in this order, q_proj [H*D, E], k_proj [HKV*D, E], v_proj [HKV*D, E] and\n"
    "    o_proj [E, H*D] (D = E/H), from the seed. It projects and splits the heads\n"
    "    (q [B, H, T, D], k and v [B, HKV, T, D]), applies RoPE to q and k, runs the\n"
    "    full causal pass with a sliding window of W, then decodes the same tokens\n"
    "    one at a time through a KV cache and compares. It prints, one per line:\n"
    "      x_shape, q_shape, k_shape, v_shape   the shapes;\n"
    "      kv_head_of_query_head                query head h reads kv head\n"
    "                                           h // (H/HKV);\n"
    "      rope_largest_pair_norm_change        the largest relative change of a\n"
    "                                           pair's length under RoPE, over q and\n"
    "                                           k (0.0: RoPE only rotates);\n"
    "      sliding_window_causal_mask           [T, T] as 0/1, row i = query i;\n"
    "      last_query_head0_weights             weights[0, 0, T-1, :];\n"
    "      decode_step=t (t = 1..T)             the cache's key shape after step t\n"
    "                                           and the largest |decode - full| of\n"
    "                                           the block's output row t-1.\n"
    "    Numbers are rounded to 4 decimals; every one equals PyTorch's for the\n"
    "    same seed. It runs the library's reference kernels unless --impl fused.\n"
    "\n"
    "OPTIONS\n"
    "    --batch-size B\n"
    "        Sequences in the batch, 1..4096 (default 2).\n"
    "    --seq-len T\n"
    "        Tokens per sequence, 1..4096 (default 6).\n"
    "    --embed-dim E\n"
    "        Embedding size, 1..4096 (default 32); E/H must be a whole, even number\n"
    "        (RoPE turns pairs of features).\n"
    "    --num-heads H\n"
    "        Query heads, 1..4096 (default 4).\n"
    "    --num-kv-heads HKV\n"
    "        Key/value heads, 1..4096 (default 2); must divide H. HKV = H is\n"
    "        multi-head attention, HKV = 1 multi-query attention.\n"
    "    --window W\n"
    "        Query i sees keys i-W+1 .. i (chapter 21's sliding_window_causal_mask),\n"
    "        1..4096 (default 3); W >= T is plain causal attention.\n"
    "    --rope interleaved|half\n"
    "        Which features form a pair: interleaved (the default; 2k and 2k+1,\n"
    "        chapter 21's apply_rope) or half (k and k+D/2, Llama's rotate_half).\n"
    "    --rope-base BASE\n"
    "        Pair k turns by position * BASE^(-2k/D) (default 10000; > 0).\n"
    "    --seed N\n"
    "        Random seed, 0..9223372036854775807 (default 42); the same seed draws\n"
    "        the same numbers as torch.manual_seed(N).\n"
    "    --impl ref|fused\n"
    "        Which kernels run: ref (the default), the reference's plain loops, or\n"
    "        fused, the library's fast path.\n"
    "    --trace\n"
    "        After the lines, each step with its formula and shape, the cache's\n"
    "        memory with HKV and with H heads, the unrounded figures behind the\n"
    "        rounded ones, and which kernel ran.\n"
    "    --values\n"
    "        After the lines, the numbers of every step for one sample and query\n"
    "        head (--sample, --head): q and its kv head's k before and after RoPE,\n"
    "        v, the masked scores, the weights, the head's context and the block's\n"
    "        output, rows and columns labelled 'pos P', rounded to 4 decimals.\n"
    "    --sample S\n"
    "        The sample --values, --heatmap and --show show, 0..B-1 (default 0).\n"
    "    --head N\n"
    "        The query head --values shows, 0..H-1 (default 0).\n"
    "    --heatmap FILE.svg\n"
    "        An SVG of the sliding-window causal mask and each head's weights for\n"
    "        one sample (T <= 256, H <= 64; hover a cell to read its value).\n"
    "    --show\n"
    "        The same heatmaps in the terminal (in colour when the output is a\n"
    "        terminal and NO_COLOR is not set).\n"
    "    -h, --help\n"
    "        Print this help and exit.\n"
    "\n"
    "    Options take their value as the next argument or after '=' (--seed=7).\n"
    "    B*T*E, B*H*T*T and E*E must each stay at most 2^26 elements.\n"
    "\n"
    CLI_HELP_NUMBERS
    "\n"
    CLI_HELP_EXIT
    "\n"
    "ENVIRONMENT\n"
    "    ATTN_ARCH\n"
    "        With --impl fused, the instruction set the fast path runs on (see\n"
    "        'attn --help'; default: the best this CPU has). --trace says which\n"
    "        ran. The reference (--impl ref) is the same plain loops whatever it\n"
    "        says.\n"
    "    NO_COLOR\n"
    "        When set, --show shades the cells with characters even on a\n"
    "        terminal.\n"
    "\n"
    "EXAMPLE\n"
    "    inspect_modern_attention --num-kv-heads 1 --window 2 --trace\n"
    "    inspect_modern_attention --rope half --values --head 3 --show\n"
    "\n"
    "SEE ALSO\n"
    "    inspect_self_attention --help (chapter 11's experiment),\n"
    "    attn decode --help; docs/modern-attention.md (this experiment, step by\n"
    "    step), docs/decoding.md (RoPE and the KV cache in the library).\n";

static int parse_options(int argc, char **argv, options *o)
{
    /* Sizes are capped so that the experiment's arrays stay printable and small. */
    const int64_t max_size = 4096;
    int64_t seed = 42;
    memset(o, 0, sizeof *o);
    o->batch_size = 2;
    o->seq_len = 6;
    o->embed_dim = 32;
    o->num_heads = 4;
    o->num_kv_heads = 2;
    o->window = 3;
    o->rope = ROPE_INTERLEAVED;
    o->rope_base = 10000.0f;
    o->impl = IMPL_REF;
    cli_opt opts[] = {
        {"batch-size", CLI_INT, &o->batch_size, NULL, 1, max_size, 0},
        {"seq-len", CLI_INT, &o->seq_len, NULL, 1, max_size, 0},
        {"embed-dim", CLI_INT, &o->embed_dim, NULL, 1, max_size, 0},
        {"num-heads", CLI_INT, &o->num_heads, NULL, 1, max_size, 0},
        {"num-kv-heads", CLI_INT, &o->num_kv_heads, NULL, 1, max_size, 0},
        {"window", CLI_INT, &o->window, NULL, 1, max_size, 0},
        {"rope", CLI_CHOICE, &o->rope, rope_names, 0, 0, 0},
        {"rope-base", CLI_FLOAT, &o->rope_base, NULL, 0, 0, 0},
        {"seed", CLI_INT, &seed, NULL, 0, INT64_MAX, 0},
        {"impl", CLI_CHOICE, &o->impl, impl_names, 0, 0, 0},
        {"trace", CLI_FLAG, &o->trace, NULL, 0, 0, 0},
        {"values", CLI_FLAG, &o->values, NULL, 0, 0, 0},
        {"sample", CLI_INT, &o->sample, NULL, 0, max_size, 0},
        {"head", CLI_INT, &o->head, NULL, 0, max_size, 0},
        {"heatmap", CLI_STRING, &o->heatmap, NULL, 0, 0, 0},
        {"show", CLI_FLAG, &o->show, NULL, 0, 0, 0},
    };
    int rc = cli_parse(prog, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), HELP);
    if (rc != CLI_PARSED)
        return rc;
    o->seed = (uint64_t)seed;
    if (!(o->rope_base > 0.0f))
        return cli_usage_error(prog, "--rope-base must be greater than 0, got %g",
                               (double)o->rope_base);
    if (o->embed_dim % o->num_heads != 0)
        return cli_usage_error(prog, "--embed-dim %" PRId64 " is not divisible by --num-heads %"
                               PRId64, o->embed_dim, o->num_heads);
    if ((o->embed_dim / o->num_heads) % 2 != 0)
        return cli_usage_error(prog, "RoPE needs an even head size, but --embed-dim %" PRId64
                               " / --num-heads %" PRId64 " = %" PRId64, o->embed_dim,
                               o->num_heads, o->embed_dim / o->num_heads);
    if (o->num_heads % o->num_kv_heads != 0)
        return cli_usage_error(prog, "--num-kv-heads %" PRId64 " does not divide --num-heads %"
                               PRId64, o->num_kv_heads, o->num_heads);
    if (o->sample >= o->batch_size)
        return cli_usage_error(prog, "--sample %" PRId64 " is out of range for --batch-size %"
                               PRId64 " (samples are 0 .. %" PRId64 ")",
                               o->sample, o->batch_size, o->batch_size - 1);
    if (o->head >= o->num_heads)
        return cli_usage_error(prog, "--head %" PRId64 " is out of range for --num-heads %"
                               PRId64 " (heads are 0 .. %" PRId64 ")",
                               o->head, o->num_heads, o->num_heads - 1);
    if ((o->heatmap || o->show) && (o->seq_len > 256 || o->num_heads > 64))
        return cli_usage_error(prog, "--heatmap and --show draw at most --seq-len 256 and "
                               "--num-heads 64, got %" PRId64 " and %" PRId64,
                               o->seq_len, o->num_heads);
    /* In double: each size is at most 2^12, so the products cannot overflow there. */
    const double limit = (double)(1 << 26);
    const double B = (double)o->batch_size, T = (double)o->seq_len, E = (double)o->embed_dim;
    if (B * T * E > limit || B * (double)o->num_heads * T * T > limit || E * E > limit)
        return cli_usage_error(prog, "sizes B=%" PRId64 " T=%" PRId64 " E=%" PRId64 " H=%" PRId64
                               " are too large for the experiment (over 2^26 elements)",
                               o->batch_size, o->seq_len, o->embed_dim, o->num_heads);
    return CLI_PARSED;
}

/* ------------------------------------------------------------------------------
 * The experiment
 * ---------------------------------------------------------------------------- */

typedef struct experiment {
    int64_t B, T, E, H, Hkv, D, w;
    attn_tensor x;                   /* [B, T, E] */
    attn_tensor wq, wk, wv, wo;      /* [H*D, E], [Hkv*D, E], [Hkv*D, E], [E, H*D] */
    attn_tensor q_lin, k_lin, v_lin; /* [B, T, H*D], [B, T, Hkv*D] x2: x W^T */
    attn_tensor q, k, v;             /* [B, H, T, D], [B, Hkv, T, D] x2: heads split */
    attn_tensor q_rope, k_rope;      /* q and k after RoPE */
    attn_tensor weights;             /* [B, H, T, T] the full pass's weights */
    attn_tensor context;             /* [B, H, T, D] weights v */
    attn_tensor merged;              /* [B, T, H*D] heads side by side */
    attn_tensor output;              /* [B, T, E]   merged W_o^T */
    attn_tensor step_out, step_merged, step_y; /* [B, H, 1, D], [B, 1, H*D], [B, 1, E] */
    attn_kv_cache *cache;
    double rope_change;              /* largest relative change of a pair's length */
    double *decode_diff;             /* [T] largest |decode - full| per step */
    int64_t *cache_len;              /* [T] the cache's length after each step */
    size_t cache_bytes;              /* the cache (capacity T) with Hkv heads */
    size_t cache_bytes_mha;          /* the same with H heads, for --trace */
} experiment;

static void experiment_free(attn_ctx *ctx, experiment *e)
{
    attn_tensor *all[] = {&e->x, &e->wq, &e->wk, &e->wv, &e->wo, &e->q_lin, &e->k_lin,
                          &e->v_lin, &e->q, &e->k, &e->v, &e->q_rope, &e->k_rope,
                          &e->weights, &e->context, &e->merged, &e->output, &e->step_out,
                          &e->step_merged, &e->step_y};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        attn_tensor_free(ctx, all[i]);
    attn_kv_cache_free(ctx, e->cache);
    free(e->decode_diff);
    free(e->cache_len);
}

/* dst [B, heads, T, D] (contiguous) = src [B, T, heads*D] viewed [B, T, heads, D]
 * with axes 1 and 2 swapped: the head split of q = x W_q^T. */
static int split_heads(attn_ctx *ctx, const attn_tensor *src, int64_t heads, attn_tensor *dst)
{
    const int64_t s4[4] = {src->shape[0], src->shape[1], heads, src->shape[2] / heads};
    attn_tensor r, t;
    int rc;
    if ((rc = attn_tensor_reshape(ctx, src, 4, s4, &r)) ||
        (rc = attn_tensor_transpose(ctx, &r, 1, 2, &t)))
        return rc;
    return attn_tensor_copy(ctx, &t, dst);
}

/* dst [B, T, H*D] = src [B, H, T, D] with the heads side by side: the merge. */
static int merge_heads(attn_ctx *ctx, const attn_tensor *src, attn_tensor *dst)
{
    const int64_t s4[4] = {src->shape[0], src->shape[2], src->shape[1], src->shape[3]};
    attn_tensor r, t;
    int rc;
    if ((rc = attn_tensor_reshape(ctx, dst, 4, s4, &r)) ||
        (rc = attn_tensor_transpose(ctx, &r, 1, 2, &t)))
        return rc;
    return attn_tensor_copy(ctx, src, &t);
}

/* The largest relative change of a pair's length between x and its rotation y
 * (both [rows, D] contiguous), in double; pairs of length 0 have no direction to
 * keep and are skipped. */
static double pair_norm_change(const float *x, const float *y, int64_t rows, int64_t D,
                               int half)
{
    double worst = 0.0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < D / 2; k++) {
            const int64_t i0 = half ? k : 2 * k, i1 = half ? k + D / 2 : 2 * k + 1;
            const float *a = x + r * D, *b = y + r * D;
            double n0 = hypot((double)a[i0], (double)a[i1]);
            double n1 = hypot((double)b[i0], (double)b[i1]);
            if (n0 > 0.0 && fabs(n1 - n0) / n0 > worst)
                worst = fabs(n1 - n0) / n0;
        }
    return worst;
}

static void sdpa_params(const experiment *e, int causal, attn_sdpa_params *p)
{
    attn_sdpa_params_init(p);
    p->causal = causal;
    /* chapter 21's sliding_window_causal_mask(T, w): 0 <= i - j < w. */
    p->has_window = 1;
    p->window_left = e->w - 1;
    p->window_right = 0;
}

static int experiment_run(attn_ctx *ctx, const options *o, experiment *e)
{
    memset(e, 0, sizeof *e);
    const int64_t B = o->batch_size, T = o->seq_len, E = o->embed_dim, H = o->num_heads,
                  Hkv = o->num_kv_heads, D = E / H;
    e->B = B, e->T = T, e->E = E, e->H = H, e->Hkv = Hkv, e->D = D, e->w = o->window;
    int rc;
#define TRY(call)          \
    do {                   \
        if ((rc = (call))) \
            return rc;     \
    } while (0)
    const int64_t x_s[3] = {B, T, E}, wq_s[2] = {H * D, E}, wk_s[2] = {Hkv * D, E},
                  wo_s[2] = {E, H * D}, ql_s[3] = {B, T, H * D}, kl_s[3] = {B, T, Hkv * D},
                  q_s[4] = {B, H, T, D}, k_s[4] = {B, Hkv, T, D}, w_s[4] = {B, H, T, T},
                  so_s[4] = {B, H, 1, D}, sm_s[3] = {B, 1, H * D}, sy_s[3] = {B, 1, E};
    TRY(attn_tensor_alloc(ctx, &e->x, ATTN_DTYPE_F32, 3, x_s));
    TRY(attn_tensor_alloc(ctx, &e->wq, ATTN_DTYPE_F32, 2, wq_s));
    TRY(attn_tensor_alloc(ctx, &e->wk, ATTN_DTYPE_F32, 2, wk_s));
    TRY(attn_tensor_alloc(ctx, &e->wv, ATTN_DTYPE_F32, 2, wk_s));
    TRY(attn_tensor_alloc(ctx, &e->wo, ATTN_DTYPE_F32, 2, wo_s));
    TRY(attn_tensor_alloc(ctx, &e->q_lin, ATTN_DTYPE_F32, 3, ql_s));
    TRY(attn_tensor_alloc(ctx, &e->k_lin, ATTN_DTYPE_F32, 3, kl_s));
    TRY(attn_tensor_alloc(ctx, &e->v_lin, ATTN_DTYPE_F32, 3, kl_s));
    TRY(attn_tensor_alloc(ctx, &e->q, ATTN_DTYPE_F32, 4, q_s));
    TRY(attn_tensor_alloc(ctx, &e->k, ATTN_DTYPE_F32, 4, k_s));
    TRY(attn_tensor_alloc(ctx, &e->v, ATTN_DTYPE_F32, 4, k_s));
    TRY(attn_tensor_alloc(ctx, &e->q_rope, ATTN_DTYPE_F32, 4, q_s));
    TRY(attn_tensor_alloc(ctx, &e->k_rope, ATTN_DTYPE_F32, 4, k_s));
    TRY(attn_tensor_alloc(ctx, &e->weights, ATTN_DTYPE_F32, 4, w_s));
    TRY(attn_tensor_alloc(ctx, &e->context, ATTN_DTYPE_F32, 4, q_s));
    TRY(attn_tensor_alloc(ctx, &e->merged, ATTN_DTYPE_F32, 3, ql_s));
    TRY(attn_tensor_alloc(ctx, &e->output, ATTN_DTYPE_F32, 3, x_s));
    TRY(attn_tensor_alloc(ctx, &e->step_out, ATTN_DTYPE_F32, 4, so_s));
    TRY(attn_tensor_alloc(ctx, &e->step_merged, ATTN_DTYPE_F32, 3, sm_s));
    TRY(attn_tensor_alloc(ctx, &e->step_y, ATTN_DTYPE_F32, 3, sy_s));
    e->decode_diff = calloc((size_t)T, sizeof *e->decode_diff);
    e->cache_len = calloc((size_t)T, sizeof *e->cache_len);
    if (!e->decode_diff || !e->cache_len)
        return ATTN_STATUS_NO_MEMORY;

    /* x ~ N(0, 1), then the four projections as nn.Linear(in, out, bias=False)
     * initialises them (a Llama block has no biases), draw for draw as PyTorch
     * after torch.manual_seed, in the order a module defines them. */
    attn_rng rng;
    attn_rng_seed(&rng, o->seed);
    attn_rng_randn(&rng, e->x.data, B * T * E);
    attn_rng_linear_init(&rng, e->wq.data, NULL, H * D, E);
    attn_rng_linear_init(&rng, e->wk.data, NULL, Hkv * D, E);
    attn_rng_linear_init(&rng, e->wv.data, NULL, Hkv * D, E);
    attn_rng_linear_init(&rng, e->wo.data, NULL, E, H * D);

    /* 1. Projections and the head split. k and v have Hkv heads only. */
    TRY(attn_linear(ctx, &e->x, &e->wq, NULL, &e->q_lin));
    TRY(attn_linear(ctx, &e->x, &e->wk, NULL, &e->k_lin));
    TRY(attn_linear(ctx, &e->x, &e->wv, NULL, &e->v_lin));
    TRY(split_heads(ctx, &e->q_lin, H, &e->q));
    TRY(split_heads(ctx, &e->k_lin, Hkv, &e->k));
    TRY(split_heads(ctx, &e->v_lin, Hkv, &e->v));

    /* 2. RoPE on q and k, row t at position t. */
    attn_rope_params rp;
    attn_rope_params_init(&rp);
    rp.pairing = o->rope == ROPE_HALF ? ATTN_ROPE_HALF : ATTN_ROPE_INTERLEAVED;
    rp.base = o->rope_base;
    TRY(attn_rope_apply(ctx, &rp, &e->q, &e->q_rope));
    TRY(attn_rope_apply(ctx, &rp, &e->k, &e->k_rope));
    const int half = o->rope == ROPE_HALF;
    double cq = pair_norm_change(e->q.data, e->q_rope.data, B * H * T, D, half);
    double ck = pair_norm_change(e->k.data, e->k_rope.data, B * Hkv * T, D, half);
    e->rope_change = cq > ck ? cq : ck;

    /* 3. The full causal pass with the window; query head h reads kv head
     * h / (H / Hkv) in place (no repeated k or v is built). */
    attn_sdpa_params p;
    sdpa_params(e, ATTN_CAUSAL_TOP_LEFT, &p);
    TRY(attn_sdpa(ctx, &e->q_rope, &e->k_rope, &e->v, &p, &e->context, &e->weights));
    TRY(merge_heads(ctx, &e->context, &e->merged));
    TRY(attn_linear(ctx, &e->merged, &e->wo, NULL, &e->output));

    /* 4. Decoding. The cache is given the keys before RoPE: append turns
     * each new key at its position as it stores it, and attend turns each query at
     * its own. A query is the last position of its sequence, so the causal mask is
     * the bottom-right one. */
    attn_kv_cache_config cfg = {B, Hkv, T, D, D, ATTN_DTYPE_F32};
    TRY(attn_kv_cache_bytes(ctx, &cfg, &e->cache_bytes));
    attn_kv_cache_config mha = {B, H, T, D, D, ATTN_DTYPE_F32};
    TRY(attn_kv_cache_bytes(ctx, &mha, &e->cache_bytes_mha));
    TRY(attn_kv_cache_create(ctx, &cfg, NULL, 0, &e->cache));
    sdpa_params(e, ATTN_CAUSAL_BOTTOM_RIGHT, &p);
    const float *full = e->output.data, *y = e->step_y.data;
    for (int64_t t = 0; t < T; t++) {
        attn_tensor qt, kt, vt;
        TRY(attn_tensor_narrow(ctx, &e->q, 2, t, 1, &qt));
        TRY(attn_tensor_narrow(ctx, &e->k, 2, t, 1, &kt));
        TRY(attn_tensor_narrow(ctx, &e->v, 2, t, 1, &vt));
        TRY(attn_kv_cache_append(ctx, e->cache, 0, &kt, &vt, &rp));
        TRY(attn_kv_cache_attend(ctx, e->cache, 0, &qt, &p, &rp, &e->step_out, NULL));
        TRY(merge_heads(ctx, &e->step_out, &e->step_merged));
        TRY(attn_linear(ctx, &e->step_merged, &e->wo, NULL, &e->step_y));
        double worst = 0.0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < E; j++) {
                double d = fabs((double)y[b * E + j] - (double)full[(b * T + t) * E + j]);
                /* A NaN is the largest difference there is: it must show. */
                if (!(d <= worst))
                    worst = d;
            }
        e->decode_diff[t] = worst;
        e->cache_len[t] = attn_kv_cache_length(e->cache, 0);
    }
#undef TRY
    return ATTN_OK;
}

/* ------------------------------------------------------------------------------
 * The lines
 * ---------------------------------------------------------------------------- */

/* A number rounded to 4 decimals in Python's shortest form: "%.4f" rounds
 * correctly, then trailing zeros go, keeping one ("1.0", "0.25"); NaN is "nan". */
static void print_rounded(double value)
{
    char buf[64];
    if (isnan(value)) {
        fputs("nan", stdout);
        return;
    }
    snprintf(buf, sizeof buf, "%.4f", value);
    size_t n = strlen(buf);
    while (n > 2 && buf[n - 1] == '0' && buf[n - 2] != '.')
        buf[--n] = '\0';
    fputs(buf, stdout);
}

static void print_shape4(const char *name, int64_t a, int64_t b, int64_t c, int64_t d)
{
    const int64_t s[4] = {a, b, c, d};
    char buf[128];
    attn_shape_format(buf, sizeof buf, d < 0 ? 3 : 4, s);
    printf("%s=%s", name, buf);
}

/* Whether query i may attend to key j: chapter 21's 0 <= i - j < w. */
static int window_visible(int64_t i, int64_t j, int64_t w)
{
    return i - j >= 0 && i - j < w;
}

static void experiment_print(const options *o, const experiment *e)
{
    const int64_t T = e->T, H = e->H, Hkv = e->Hkv;
    print_shape4("x_shape", e->B, T, e->E, -1);
    printf("\n");
    print_shape4("q_shape", e->B, H, T, e->D);
    printf("\n");
    print_shape4("k_shape", e->B, Hkv, T, e->D);
    printf("\n");
    print_shape4("v_shape", e->B, Hkv, T, e->D);
    printf("\n");
    printf("kv_head_of_query_head=[");
    for (int64_t h = 0; h < H; h++)
        printf(h ? ", %" PRId64 : "%" PRId64, h / (H / Hkv));
    printf("]\n");
    printf("rope_largest_pair_norm_change=");
    print_rounded(e->rope_change);
    printf("\n");
    printf("sliding_window_causal_mask=[");
    for (int64_t i = 0; i < T; i++) {
        printf(i ? ", [" : "[");
        for (int64_t j = 0; j < T; j++)
            printf(j ? ", %d" : "%d", window_visible(i, j, e->w));
        printf("]");
    }
    printf("]\n");
    printf("last_query_head0_weights=[");
    const float *w = (const float *)e->weights.data + (T - 1) * T; /* [0, 0, T-1, :] */
    for (int64_t j = 0; j < T; j++) {
        if (j)
            printf(", ");
        print_rounded(w[j]);
    }
    printf("]\n");
    for (int64_t t = 0; t < T; t++) {
        printf("decode_step=%" PRId64 " ", t + 1);
        print_shape4("cache_k_shape", e->B, Hkv, e->cache_len[t], e->D);
        printf(" largest_diff_from_full=");
        print_rounded(e->decode_diff[t]);
        printf("\n");
    }
    (void)o;
}

/* ------------------------------------------------------------------------------
 * --trace
 * ---------------------------------------------------------------------------- */

static void print_trace(const attn_ctx *ctx, const options *o, const experiment *e)
{
    const int64_t B = e->B, T = e->T, E = e->E, H = e->H, Hkv = e->Hkv, D = e->D;
    const attn_arch arch = attn_arch_selected(ctx);
    const int ref = ctx->impl == ATTN_IMPL_REF || arch == ATTN_ARCH_REF;
    printf("== trace: B=%" PRId64 " T=%" PRId64 " E=%" PRId64 " H=%" PRId64 " Hkv=%" PRId64
           " D=E/H=%" PRId64 " window=%" PRId64 " rope=%s base=%g seed %" PRIu64 "\n",
           B, T, E, H, Hkv, D, e->w, rope_names[o->rope], (double)o->rope_base, o->seed);
    printf(" 1  input        x [%" PRId64 ", %" PRId64 ", %" PRId64 "]  ~ N(0, 1)\n", B, T, E);
    printf(" 2  projections  q = x W_q^T [%" PRId64 ", %" PRId64 ", %" PRId64 "], k = x W_k^T"
           " and v = x W_v^T [%" PRId64 ", %" PRId64 ", %" PRId64 "]  (no biases)\n",
           B, T, H * D, B, T, Hkv * D);
    printf(" 3  head split   q [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "], k and v [%"
           PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "]  view [B, T, heads, D], swap axes 1, 2\n",
           B, H, T, D, B, Hkv, T, D);
    printf("    grouped-query attention: %" PRId64 " query heads share each kv head; query head h"
           " reads kv head h // %" PRId64 "\n", H / Hkv, H / Hkv);
    printf(" 4  RoPE         q' = rope(q), k' = rope(k), same shapes; pair k of position p turns"
           " by p * %g^(-2k/%" PRId64 ") (%s pairs: %s)\n", (double)o->rope_base, D,
           rope_names[o->rope], o->rope == ROPE_HALF ? "features k and k+D/2" : "features 2k and 2k+1");
    printf("    largest relative change of a pair's length: %.3g (float32 rounding; a rotation"
           " keeps lengths)\n", e->rope_change);
    printf(" 5  full pass    scores = q' k'^T / sqrt(%" PRId64 ") [%" PRId64 ", %" PRId64 ", %"
           PRId64 ", %" PRId64 "], -inf unless 0 <= i - j < %" PRId64 "; weights = softmax;"
           " context = weights v [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "]\n",
           D, B, H, T, T, e->w, B, H, T, D);
    printf(" 6  output       merge [%" PRId64 ", %" PRId64 ", %" PRId64 "], output = merged W_o^T"
           " [%" PRId64 ", %" PRId64 ", %" PRId64 "]\n", B, T, H * D, B, T, E);
    printf(" 7  KV cache     K and V [%" PRId64 ", %" PRId64 ", capacity %" PRId64 ", %" PRId64
           "], %zu bytes with %" PRId64 " kv heads (%zu with %" PRId64 " heads: grouped-query"
           " attention keeps %.3g of it)\n", B, Hkv, T, D, e->cache_bytes, Hkv,
           e->cache_bytes_mha, H, (double)e->cache_bytes / (double)e->cache_bytes_mha);
    printf(" 8  decode       for t = 0..%" PRId64 ": append k[:, :, t], v[:, :, t] (k turned by RoPE at"
           " position t as stored); attend q[:, :, t] (RoPE at t) to the cache, bottom-right"
           " causal, window %" PRId64 "; merge; W_o^T\n", T - 1, e->w);
    for (int64_t t = 0; t < T; t++)
        printf("    step %" PRId64 ": cache length %" PRId64 ", largest |decode - full| of"
               " output row %" PRId64 ": %.3g\n", t + 1, e->cache_len[t], t, e->decode_diff[t]);
    if (ref)
        printf("kernels: the reference (attn_sdpa_ref's three steps, attn_linear's plain loops)%s\n",
               ctx->impl == ATTN_IMPL_REF ? ": --impl ref (the default)"
                                          : ": --impl fused, but the selected arch is ref");
    else
        printf("kernels: the fused online-softmax kernel and the packed GEMM, %s build"
               " (--impl fused)\n", attn_arch_name(arch));
    printf("threads: at most %d per call\n", attn_threads_resolve(ctx));
}

/* ------------------------------------------------------------------------------
 * --values
 * ---------------------------------------------------------------------------- */

/* One number as --values prints it: 4 decimals, "-inf", "inf" or "nan". */
static void number(char *buf, size_t size, float v)
{
    if (isnan(v))
        snprintf(buf, size, "nan");
    else
        snprintf(buf, size, "%.4f", (double)v);
}

/* Prints a [rows, cols] matrix (element (i, j) at a[i * cols + j]) under `title`:
 * rows are positions, labelled "pos P" followed by row_note; columns are positions
 * too when col_pos is set, otherwise feature indices. Columns are as wide as their
 * widest entry. */
static void matrix(const char *title, int64_t rows, int64_t cols, const float *a,
                   const char *row_note, int col_pos)
{
    printf("\n%s\n", title);
    char buf[96];
    int label_w = (int)strlen(col_pos ? "query \\ key" : "");
    for (int64_t i = 0; i < rows; i++) {
        int n = snprintf(buf, sizeof buf, "pos %" PRId64 "%s", i, row_note);
        label_w = n > label_w ? n : label_w;
    }
    int *width = malloc((size_t)cols * sizeof *width);
    if (!width) {
        printf("(out of memory for the column widths)\n");
        return;
    }
    for (int64_t j = 0; j < cols; j++) {
        width[j] = snprintf(buf, sizeof buf, col_pos ? "pos %" PRId64 : "%" PRId64, j);
        for (int64_t i = 0; i < rows; i++) {
            number(buf, sizeof buf, a[i * cols + j]);
            int n = (int)strlen(buf);
            width[j] = n > width[j] ? n : width[j];
        }
    }
    printf("%-*s", label_w, col_pos ? "query \\ key" : "");
    for (int64_t j = 0; j < cols; j++) {
        snprintf(buf, sizeof buf, col_pos ? "pos %" PRId64 : "%" PRId64, j);
        printf("  %*s", width[j], buf);
    }
    printf("\n");
    for (int64_t i = 0; i < rows; i++) {
        snprintf(buf, sizeof buf, "pos %" PRId64 "%s", i, row_note);
        printf("%-*s", label_w, buf);
        for (int64_t j = 0; j < cols; j++) {
            number(buf, sizeof buf, a[i * cols + j]);
            printf("  %*s", width[j], buf);
        }
        printf("\n");
    }
    free(width);
}

/* The masked scores of sample s, query head h [T, T]: q' . k' summed in order of
 * the features, times the float32 scale 1/sqrt(D) (as the library rounds it), -inf
 * outside the window. */
static int values_print(const options *o, const experiment *e)
{
    const int64_t T = e->T, E = e->E, H = e->H, Hkv = e->Hkv, D = e->D, s = o->sample,
                  h = o->head, g = h / (H / Hkv);
    const float *q = (const float *)e->q.data + (s * H + h) * T * D;
    const float *qr = (const float *)e->q_rope.data + (s * H + h) * T * D;
    const float *k = (const float *)e->k.data + (s * Hkv + g) * T * D;
    const float *kr = (const float *)e->k_rope.data + (s * Hkv + g) * T * D;
    const float *v = (const float *)e->v.data + (s * Hkv + g) * T * D;
    float *scores = malloc((size_t)(T * T) * sizeof *scores);
    if (!scores) {
        cli_error(prog, "out of memory for --values");
        return 1;
    }
    const float scale = (float)(1.0 / sqrt((double)D));
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++) {
            float dot = 0.0f;
            for (int64_t d = 0; d < D; d++)
                dot += qr[i * D + d] * kr[j * D + d];
            scores[i * T + j] = window_visible(i, j, e->w) ? dot * scale : -INFINITY;
        }
    printf("== values: sample %" PRId64 ", query head %" PRId64 " of %" PRId64 ", which reads kv"
           " head %" PRId64 " of %" PRId64 " (%" PRId64 " // %" PRId64 "); D = %" PRId64
           ", rounded to 4 decimals\n", s, h, H, g, Hkv, h, H / Hkv, D);
    printf("   a row or column 'pos P' is position P of the sequence; RoPE turns it by P\n");
    char title[512], note[64];
    const char *pairs = o->rope == ROPE_HALF ? "features k, k+D/2" : "features 2k, 2k+1";
    snprintf(title, sizeof title, "q[%" PRId64 ", %" PRId64 "]  [T, D] = [%" PRId64 ", %" PRId64
             "]  = x W_q^T, head %" PRId64 " (rows %" PRId64 "..%" PRId64 " of q_proj), before RoPE",
             s, h, T, D, h, h * D, h * D + D - 1);
    matrix(title, T, D, q, "", 0);
    snprintf(title, sizeof title, "q'[%" PRId64 ", %" PRId64 "]  [%" PRId64 ", %" PRId64
             "]  = rope(q): pair k (%s) of pos P turned by P * %g^(-2k/%" PRId64 ")",
             s, h, T, D, pairs, (double)o->rope_base, D);
    matrix(title, T, D, qr, "", 0);
    snprintf(note, sizeof note, ", kv head %" PRId64, g);
    snprintf(title, sizeof title, "k[%" PRId64 ", %" PRId64 "]  [%" PRId64 ", %" PRId64
             "]  = x W_k^T, kv head %" PRId64 " (rows %" PRId64 "..%" PRId64 " of k_proj), before RoPE",
             s, g, T, D, g, g * D, g * D + D - 1);
    matrix(title, T, D, k, note, 0);
    snprintf(title, sizeof title, "k'[%" PRId64 ", %" PRId64 "]  [%" PRId64 ", %" PRId64
             "]  = rope(k), kv head %" PRId64 ": what the KV cache stores", s, g, T, D, g);
    matrix(title, T, D, kr, note, 0);
    snprintf(title, sizeof title, "v[%" PRId64 ", %" PRId64 "]  [%" PRId64 ", %" PRId64
             "]  = x W_v^T, kv head %" PRId64 " (no RoPE on values)", s, g, T, D, g);
    matrix(title, T, D, v, note, 0);
    snprintf(title, sizeof title, "masked scores[%" PRId64 ", %" PRId64 "]  [%" PRId64 ", %" PRId64
             "]  = q' k'^T / sqrt(%" PRId64 "), -inf unless 0 <= query - key < %" PRId64
             " (keys of kv head %" PRId64 ")", s, h, T, T, D, e->w, g);
    matrix(title, T, T, scores, "", 1);
    snprintf(title, sizeof title, "weights[%" PRId64 ", %" PRId64 "]  [%" PRId64 ", %" PRId64
             "]  = softmax(masked scores) over the keys: each row sums to 1", s, h, T, T);
    matrix(title, T, T, (const float *)e->weights.data + (s * H + h) * T * T, "", 1);
    snprintf(title, sizeof title, "context[%" PRId64 ", %" PRId64 "]  [%" PRId64 ", %" PRId64
             "]  = weights v", s, h, T, D);
    matrix(title, T, D, (const float *)e->context.data + (s * H + h) * T * D, "", 0);
    snprintf(title, sizeof title, "output[%" PRId64 "]  [T, E] = [%" PRId64 ", %" PRId64
             "]  = merged heads W_o^T (the full pass; decoding gives the same rows)", s, T, E);
    matrix(title, T, E, (const float *)e->output.data + s * T * E, "", 0);
    free(scores);
    return 0;
}

/* ------------------------------------------------------------------------------
 * --heatmap and --show: the mask and each head's weights (tools/common_heatmap.c)
 * ---------------------------------------------------------------------------- */

typedef struct picture {
    heatmap_panel panels[1 + 64];
    char titles[1 + 64][64];
    char title[256];
    float *mask_values; /* [T, T] 0/1 */
    uint8_t *mask_off;  /* [T, T] 1 where hidden */
    int n;
} picture;

static int picture_build(const options *o, const experiment *e, picture *pic)
{
    const int64_t T = e->T, H = e->H, s = o->sample;
    memset(pic, 0, sizeof *pic);
    pic->mask_values = malloc((size_t)(T * T) * sizeof(float));
    pic->mask_off = malloc((size_t)(T * T));
    if (!pic->mask_values || !pic->mask_off) {
        cli_error(prog, "out of memory for the heatmaps");
        return 1;
    }
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++) {
            int vis = window_visible(i, j, e->w);
            pic->mask_values[i * T + j] = vis ? 1.0f : 0.0f;
            pic->mask_off[i * T + j] = (uint8_t)!vis;
        }
    for (int64_t k = 0; k <= H; k++) {
        heatmap_panel *p = &pic->panels[k];
        if (k == 0)
            snprintf(pic->titles[0], sizeof pic->titles[0], "sliding window causal mask, w=%" PRId64,
                     e->w);
        else
            snprintf(pic->titles[k], sizeof pic->titles[k], "head %" PRId64 " weights (kv head %"
                     PRId64 ")", k - 1, (k - 1) / (H / e->Hkv));
        p->title = pic->titles[k];
        p->rows = p->cols = T;
        p->values = k == 0 ? pic->mask_values
                           : (const float *)e->weights.data + (s * H + k - 1) * T * T;
        p->row_stride = p->mask_row_stride = T;
        p->col_stride = p->mask_col_stride = 1;
        p->masked = pic->mask_off;
        p->row_axis = "query";
        p->col_axis = "key";
        p->kind = k == 0 ? HEATMAP_MASK : HEATMAP_WEIGHTS;
        p->new_row = k == 1;
    }
    pic->n = (int)(H + 1);
    snprintf(pic->title, sizeof pic->title,
             "sample %" PRId64 ": the sliding-window causal mask and attention weights, B=%" PRId64
             " T=%" PRId64 " E=%" PRId64 " H=%" PRId64 " Hkv=%" PRId64 " rope %s, seed %" PRIu64,
             s, e->B, T, e->E, H, e->Hkv, rope_names[o->rope], o->seed);
    return 0;
}

static void picture_free(picture *pic)
{
    free(pic->mask_values);
    free(pic->mask_off);
}

static int show_pictures(attn_ctx *ctx, const options *o, const experiment *e)
{
    picture pic;
    int rc = picture_build(o, e, &pic);
    char *svg = NULL;
    size_t svg_len = 0;
    if (rc == 0 && o->heatmap) {
        FILE *f = open_memstream(&svg, &svg_len);
        if (!f) {
            cli_error(prog, "out of memory for the heatmap %s", o->heatmap);
            rc = 1;
        } else {
            int bad = heatmap_write_svg(f, pic.title, pic.panels, pic.n, 1, 4) != 0;
            bad |= fclose(f) != 0;
            if (bad) {
                cli_error(prog, "out of memory drawing the heatmap %s", o->heatmap);
                rc = 1;
            }
        }
        if (rc == 0) {
            cli_output out = {o->heatmap, NULL, NULL, NULL, 0, svg, svg_len};
            rc = cli_save_outputs(prog, ctx, 1, &out) ? 1 : 0;
        }
    }
    if (rc == 0 && o->show) {
        printf("\n%s\n\n", pic.title);
        int color = isatty(fileno(stdout)) && !getenv("NO_COLOR");
        heatmap_print_terminal(stdout, pic.panels, pic.n, color);
    }
    free(svg);
    picture_free(&pic);
    return rc;
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
        ctx.impl = ATTN_IMPL_REF;
        ctx.arch = ATTN_ARCH_REF;
    } else {
        ctx.impl = ATTN_IMPL_FUSED;
    }
    experiment e;
    rc = experiment_run(&ctx, &o, &e);
    if (rc) {
        cli_error(prog, "%s", ctx.message[0] ? ctx.message : attn_strerror(rc));
        experiment_free(&ctx, &e);
        return 1;
    }
    experiment_print(&o, &e);
    if (o.trace) {
        printf("\n");
        print_trace(&ctx, &o, &e);
    }
    if (o.values) {
        printf("\n");
        rc = values_print(&o, &e);
    }
    if (rc == 0 && (o.heatmap || o.show))
        rc = show_pictures(&ctx, &o, &e);
    experiment_free(&ctx, &e);
    if (fflush(stdout) != 0)
        return 1;
    return rc;
}
