/*
 * cmd_decode.c - `attn decode`: the attention block of `attn forward --causal`,
 * run the way a model generates text: the first N tokens of the input as one
 * causal block into a KV cache (the prefill), then every later token alone
 * against the cache (the decoding steps).
 *
 *   x [B, T, E] -> for each block of tokens t0 .. t0+n-1 (n = N once, then 1):
 *       qkv [B, n, H*D + 2*Hkv*D] = x[:, t0:t0+n] W_qkv^T + b   (one packed GEMM)
 *       k, v [B, Hkv, n, D] appended to the cache (RoPE'd at their positions)
 *       context [B, H, n, D] = attend(q [B, H, n, D], cache)    (bottom-right causal)
 *       y[:, t0:t0+n] = merge(context) W_o^T + b_o              [B, n, E]
 *
 * which equals `attn forward --causal` on the same input and weights within the
 * fused kernel's error bound: the projections are the same sums per row, and the
 * attention of a query over its visible keys is the same softmax, computed by
 * another kernel call. Everything the steps need is made before the first block:
 * the weights are packed once, the cache is allocated once (capacity T), the
 * buffers for q, k, v, the context and the outputs are allocated once, and the
 * context keeps its workspace (keep_workspace), so a step calls the allocator zero
 * times; --stats prints how many times it did.
 */
#include "attn.h"
#include "cmd_forward.h"
#include "cmds.h"
#include "common_cli.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define PROG "attn decode"

static const char HELP[] =
    "NAME\n"
    "    attn decode - multi-head self-attention token by token through a KV cache\n"
    "\n"
    "SYNOPSIS\n"
    "    attn decode --weights W.safetensors [--prefix P] --num-heads H\n"
    "                [--num-kv-heads Hkv] --input X.npy [--prefill N]\n"
    "                [--token-ids IDS.npy --pad-id N] [--mask M.npy]\n"
    "                [--causal | --causal-bottom-right]\n"
    "                [--window LEFT,RIGHT] [--softcap C]\n"
    "                [--alibi | --alibi-slopes S.npy] [--bias B.npy] [--sinks S.npy]\n"
    "                [--rope interleaved|half [--rope-base B] [--rope-offset N]]\n"
    "                [--empty-rows error|zero] [--dtype f32|bf16|f16] [--stats]\n"
    "                [--threads N]\n"
    "                --output Y.npy [--attention A.npy] [--lse L.npy]\n"
    "\n"
    "DESCRIPTION\n"
    "    Runs 'attn forward --causal' on X the way a model generates text. The\n"
    "    first N tokens of each sequence go through the attention block as one\n"
    "    causal block (the prefill), and their keys and values are stored in a KV\n"
    "    cache; then every later token goes through alone, its query attending to\n"
    "    the cache, into which its own key and value were appended first:\n"
    "\n"
    "        prefill   tokens 0 .. N-1     one block, causal\n"
    "        step t    token t (N <= t < T) against keys 0 .. t\n"
    "\n"
    "    Y [B, T, E] holds every token's output, equal to 'attn forward --causal'\n"
    "    on the same input and weights within the error bound of the attention\n"
    "    kernels (the same sums in another order; tests/test_cli_decode.sh states\n"
    "    the bound). Causal attention is implied. The weights are packed once and\n"
    "    the cache, which holds T positions, and every buffer are allocated before\n"
    "    the first block, so no decoding step allocates memory.\n"
    "\n"
    "    Every option of 'attn forward' is taken, with the same meaning (see 'attn\n"
    "    forward --help'), plus the ones below. --causal and --causal-bottom-right\n"
    "    may be given and change nothing. A --mask or --bias of [.., T, T] is read\n"
    "    row by row as the tokens are decoded.\n"
    "\n"
    "OPTIONS\n"
    "    --prefill N\n"
    "        The number of tokens in the prefill block, a whole number with\n"
    "        0 <= N <= T (default 0). N = 0 means no prefill: every token, the\n"
    "        first one too, is a decoding step of its own. N = T is one causal\n"
    "        block through the cache and no steps. N > T is an error (exit 1).\n"
    CLI_HELP_ROPE("        Here q and k are rotated after the projections, token t at position\n"
                  "        O+t (O = --rope-offset, not the --prefill N); with O = 0 the cache\n"
                  "        rotates the keys as it stores them and the queries as it attends.\n")
    "    --dtype f32|bf16|f16\n"
    "        How the KV cache stores K and V (default f32). bf16 and f16 round each\n"
    "        key and value once, to nearest even, as it is appended (after RoPE,\n"
    "        which turns it in float32) and keep half the bytes; q, the\n"
    "        projections, every product and sum and the output stay float32. The\n"
    "        output then differs from 'attn forward --causal' by that rounding\n"
    "        (docs/half-precision.md); --prefill N changes only the order of sums.\n"
    "    --stats\n"
    "        Print one line on standard output: the prefill's length, the number\n"
    "        of steps, and how many times the steps after the first called the\n"
    "        allocator (0).\n"
    CLI_HELP_THREADS
    "    -h, --help\n"
    "        Print this help and exit.\n"
    "\n"
    "    Usage errors (exit 2): those of 'attn forward', and a --prefill below 0.\n"
    "\n"
    CLI_HELP_FILES
    "\n"
    CLI_HELP_NUMBERS
    "\n"
    CLI_HELP_EXIT
    "\n"
    CLI_HELP_ENVIRONMENT
    "\n"
    "EXAMPLE\n"
    "    attn decode --weights llama.safetensors \\\n"
    "        --prefix model.layers.0.self_attn. \\\n"
    "        --num-heads 32 --num-kv-heads 8 --input x.npy --prefill 12 \\\n"
    "        --rope half --rope-base 500000.0 --window 4095,0 --output y.npy\n"
    "\n"
    "SEE ALSO\n"
    "    attn forward --help (every option and the weights' names), attn --help;\n"
    "    docs/decoding.md (the KV cache and RoPE), docs/half-precision.md.\n";

/* An allocator that counts the calls it passes on to the context's own, so that
 * --stats can say how many times the decoding steps allocated. */
typedef struct counting_alloc {
    attn_allocator inner;
    long calls;
} counting_alloc;

static void *count_alloc(void *user, size_t size)
{
    counting_alloc *c = user;
    c->calls++;
    return c->inner.alloc(c->inner.user, size);
}

static void count_free(void *user, void *ptr)
{
    counting_alloc *c = user;
    c->inner.free(c->inner.user, ptr);
}

/* A [B, H, n, D] view of heads that lie in a [B, T, row] buffer at column col,
 * rows t0 .. t0+n-1: element (b, h, t, d) is at b*T*row + (t0+t)*row + col + h*D + d. */
static void head_view(attn_tensor *v, float *base, int64_t B, int64_t T, int64_t row,
                      int64_t col, int64_t H, int64_t D, int64_t t0, int64_t n)
{
    memset(v, 0, sizeof *v);
    v->data = base + t0 * row + col;
    v->dtype = ATTN_DTYPE_F32;
    v->ndim = 4;
    v->shape[0] = B, v->shape[1] = H, v->shape[2] = n, v->shape[3] = D;
    v->stride[0] = T * row, v->stride[1] = D, v->stride[2] = row, v->stride[3] = 1;
}

/* A mask or bias that broadcasts to [B, H, T, T], narrowed to the query rows
 * t0 .. t0+n-1 when its query axis has all T rows (an axis of 1 broadcasts). Its
 * key axis is the cache's capacity, T, as attend wants. */
static void rows_view(attn_ctx *ctx, const attn_tensor *t, int64_t T, int64_t t0, int64_t n,
                      attn_tensor *v)
{
    *v = *t;
    if (t->ndim >= 2 && t->shape[t->ndim - 2] == T)
        attn_tensor_narrow(ctx, t, t->ndim - 2, t0, n, v);
}

/* W_q, W_k and W_v (with their biases, zeros where there is none) as one [R, E]
 * weight and [R] bias, so that one GEMM makes q, k and v for a block of tokens. */
static int concat_qkv(attn_ctx *ctx, const attn_gqa_weights *g, attn_tensor *W, attn_tensor *b)
{
    const attn_tensor *Ws[3] = {&g->w_q, &g->w_k, &g->w_v};
    const attn_tensor *bs[3] = {&g->b_q, &g->b_k, &g->b_v};
    const int64_t E = g->w_q.shape[1];
    const int64_t R = g->w_q.shape[0] + g->w_k.shape[0] + g->w_v.shape[0];
    const int64_t sw[2] = {R, E}, sb[1] = {R};
    if (attn_tensor_alloc(ctx, W, ATTN_DTYPE_F32, 2, sw) ||
        attn_tensor_alloc(ctx, b, ATTN_DTYPE_F32, 1, sb))
        return -1;
    memset(b->data, 0, (size_t)R * sizeof(float));
    int64_t row = 0;
    for (int i = 0; i < 3; i++) {
        attn_tensor wv, bv;
        const int64_t n = Ws[i]->shape[0];
        if (attn_tensor_narrow(ctx, W, 0, row, n, &wv) || attn_tensor_copy(ctx, Ws[i], &wv) ||
            (bs[i]->data && (attn_tensor_narrow(ctx, b, 0, row, n, &bv) ||
                             attn_tensor_copy(ctx, bs[i], &bv))))
            return -1;
        row += n;
    }
    return 0;
}

int cmd_decode(int argc, char **argv)
{
    fwd_args a;
    memset(&a, 0, sizeof a);
    int64_t prefill = 0;
    int stats = 0, dtype_ix = 0;
    static const char *const dtype_choices[] = {"f32", "bf16", "f16", NULL};
    static const attn_dtype dtypes[] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_F16};
    cli_opt opts[] = {
        FWD_OPTIONS(&a),
        {"prefill", CLI_INT, &prefill, NULL, 0, INT64_MAX, 0},
        {"dtype", CLI_CHOICE, &dtype_ix, dtype_choices, 0, 0, 0},
        {"stats", CLI_FLAG, &stats, NULL, 0, 0, 0},
    };
    const int nopts = (int)(sizeof(opts) / sizeof(opts[0]));
    int rc = cli_parse(PROG, argc, argv, opts, nopts, HELP);
    if (rc != CLI_PARSED)
        return rc;
    attn_rope_params rope;
    int use_rope;
    if ((rc = fwd_check(PROG, opts, nopts, &a, &rope, &use_rope)) != CLI_PARSED)
        return rc;

    attn_ctx ctx;
    cli_ctx_init(&ctx);
    ctx.threads = (int)a.threads;
    counting_alloc counter = {ctx.allocator, 0};
    ctx.allocator.alloc = count_alloc;
    ctx.allocator.free = count_free;
    ctx.allocator.user = &counter;
    /* The scratch the first attend takes is planned for a full cache and kept,
     * so the later steps take it again instead of allocating. */
    ctx.keep_workspace = 1;

    fwd_data d;
    memset(&d, 0, sizeof d);
    attn_tensor cat_w = {0}, cat_b = {0}, qkv = {0}, merged = {0}, out = {0}, att = {0},
                lse = {0};
    attn_linear_packed *p_qkv = NULL, *p_o = NULL;
    attn_kv_cache *cache = NULL;
    int status = CLI_EXIT_ERROR;
    if (fwd_load(PROG, &ctx, &a, &d))
        goto done;
    const int64_t B = d.B, T = d.T, E = d.E, H = d.H, Hkv = d.Hkv, D = d.D;
    if (prefill > T) {
        char s[96];
        cli_error(PROG, "--prefill %lld is more than the input's %lld tokens (--input %s is %s)",
                  (long long)prefill, (long long)T, a.input, cli_shape(&d.x.tensor, s, sizeof s));
        goto done;
    }
    if (T == 0) {
        char s[96];
        cli_error(PROG, "--input %s is %s: there is no token to decode", a.input,
                  cli_shape(&d.x.tensor, s, sizeof s));
        goto done;
    }
    /* Each step rotates at --rope-offset + t: the last position must fit in int64
     * (checked once here, so the message names the offset as given, not a step's). */
    if (use_rope && rope.offset > INT64_MAX - (T - 1)) {
        cli_error(PROG, "--rope-offset %lld: the input's %lld tokens would sit at positions "
                  "beyond %lld (int64's largest)", (long long)rope.offset, (long long)T,
                  (long long)INT64_MAX);
        goto done;
    }
    /* The queries of a block are the last ones in their sequences' cache. */
    d.p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;

    /* The weights, packed once: q, k and v as one projection, then W_o. */
    if (d.separate) {
        if (concat_qkv(&ctx, &d.g, &cat_w, &cat_b) ||
            attn_linear_pack(&ctx, &cat_w, &cat_b, &p_qkv) ||
            attn_linear_pack(&ctx, &d.g.w_o, d.g.b_o.data ? &d.g.b_o : NULL, &p_o)) {
            cli_fail(PROG, &ctx);
            goto done;
        }
    } else if (attn_linear_pack(&ctx, &d.w.w_qkv, &d.w.b_qkv, &p_qkv) ||
               attn_linear_pack(&ctx, &d.w.w_o, &d.w.b_o, &p_o)) {
        cli_fail(PROG, &ctx);
        goto done;
    }
    const int64_t qr = H * D, kvr = Hkv * D, R = qr + 2 * kvr;
    const int64_t s_qkv[3] = {B, T, R}, s_merged[3] = {B, T, qr}, s3[3] = {B, T, E},
                  sa[4] = {B, H, T, T}, sl[3] = {B, H, T};
    /* --dtype: the cache's storage only; the projections and attend's q and out
     * stay float32 (a float32 k or v is rounded once as it is appended). */
    const attn_kv_cache_config cfg = {B, Hkv, T, D, 0, dtypes[dtype_ix]};
    if (attn_tensor_alloc(&ctx, &qkv, ATTN_DTYPE_F32, 3, s_qkv) ||
        attn_tensor_alloc(&ctx, &merged, ATTN_DTYPE_F32, 3, s_merged) ||
        attn_tensor_alloc(&ctx, &out, ATTN_DTYPE_F32, 3, s3) ||
        (a.attention && attn_tensor_alloc(&ctx, &att, ATTN_DTYPE_F32, 4, sa)) ||
        (a.so.lse && attn_tensor_alloc(&ctx, &lse, ATTN_DTYPE_F32, 3, sl)) ||
        attn_kv_cache_create(&ctx, &cfg, NULL, 0, &cache)) {
        cli_fail(PROG, &ctx);
        goto done;
    }
    /* With offset 0 the cache rotates keys and queries at their positions itself;
     * it counts positions from 0, so another offset is applied here instead. */
    const int cache_rope = use_rope && rope.offset == 0;

    long calls_before_steps = 0, calls_after_first_step = 0;
    int64_t steps = 0;
    for (int64_t t0 = 0; t0 < T;) {
        const int is_prefill = t0 == 0 && prefill > 0;
        const int64_t n = is_prefill ? prefill : 1;
        attn_tensor xv, qkvv, q, k, v, cv, mv, ov, mask, bias, attv, lsev;
        head_view(&q, qkv.data, B, T, R, 0, H, D, t0, n);
        head_view(&k, qkv.data, B, T, R, qr, Hkv, D, t0, n);
        head_view(&v, qkv.data, B, T, R, qr + kvr, Hkv, D, t0, n);
        head_view(&cv, merged.data, B, T, qr, 0, H, D, t0, n);
        attn_sdpa_params ps = d.p;
        if (ps.mask) {
            rows_view(&ctx, d.p.mask, T, t0, n, &mask);
            ps.mask = &mask;
        }
        if (ps.bias) {
            rows_view(&ctx, d.p.bias, T, t0, n, &bias);
            ps.bias = &bias;
        }
        if (a.so.lse) {
            attn_tensor_narrow(&ctx, &lse, 2, t0, n, &lsev);
            ps.lse = &lsev;
        }
        if (a.attention)
            attn_tensor_narrow(&ctx, &att, 2, t0, n, &attv);
        attn_rope_params rq = rope;
        rq.offset = rope.offset + t0;
        if (attn_tensor_narrow(&ctx, &d.x3, 1, t0, n, &xv) ||
            attn_tensor_narrow(&ctx, &qkv, 1, t0, n, &qkvv) ||
            attn_linear_forward_packed(&ctx, &xv, p_qkv, &qkvv) ||
            (use_rope && !cache_rope &&
             (attn_rope_apply(&ctx, &rq, &q, &q) || attn_rope_apply(&ctx, &rq, &k, &k))) ||
            attn_kv_cache_append(&ctx, cache, 0, &k, &v, cache_rope ? &rope : NULL)) {
            cli_fail(PROG, &ctx);
            goto done;
        }
        if (attn_kv_cache_attend(&ctx, cache, 0, &q, &ps, cache_rope ? &rope : NULL, &cv,
                                 a.attention ? &attv : NULL)) {
            cli_fail_sdpa(PROG, &ctx, &a.so, a.mask_path);
            goto done;
        }
        if (attn_tensor_narrow(&ctx, &merged, 1, t0, n, &mv) ||
            attn_tensor_narrow(&ctx, &out, 1, t0, n, &ov) ||
            attn_linear_forward_packed(&ctx, &mv, p_o, &ov)) {
            cli_fail(PROG, &ctx);
            goto done;
        }
        /* The prefill and the first step may take the kept workspace's memory;
         * the steps after those must not allocate. */
        if (!is_prefill && steps++ == 0)
            calls_before_steps = counter.calls;
        t0 += n;
    }
    calls_after_first_step = steps > 0 ? counter.calls - calls_before_steps : 0;
    if (fwd_save(PROG, &ctx, &a, &d, &out, &att, &lse))
        goto done;
    if (stats)
        printf("prefill %lld tokens, %lld steps of 1 token, allocations in the steps after "
               "the first: %ld\n",
               (long long)prefill, (long long)steps, calls_after_first_step);
    status = CLI_EXIT_OK;

done:
    attn_kv_cache_free(&ctx, cache);
    attn_linear_packed_free(&ctx, p_qkv);
    attn_linear_packed_free(&ctx, p_o);
    attn_tensor_free(&ctx, &cat_w);
    attn_tensor_free(&ctx, &cat_b);
    attn_tensor_free(&ctx, &qkv);
    attn_tensor_free(&ctx, &merged);
    attn_tensor_free(&ctx, &out);
    attn_tensor_free(&ctx, &att);
    attn_tensor_free(&ctx, &lse);
    fwd_free(&ctx, &a, &d);
    attn_ctx_release(&ctx);
    return status;
}
