/*
 * cmd_sdpa.c - `attn sdpa`: scaled dot-product attention on .npy arrays.
 *
 *   q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv]  (or without B, or
 *   without B and H) -> out [.., H, Tq, Dv]; optional weights [.., H, Tq, Tk] and
 *   log-sum-exp [.., H, Tq]
 *
 * With --grad-output dO (SPEC section 8) the backward runs after the forward, on
 * the forward's output and log-sum-exp, and writes dq, dk, dv (and dbias, dsinks)
 * in the shapes of q, k, v, the bias and the sinks; every file the run writes is
 * one output set, written whole or not at all.
 *
 * The options of current models (SPEC section 6) are read by common_cli's
 * CLI_SDPA_OPTIONS and checked by the library; grouped-query attention needs no
 * flag, as k and v's head count says it. --rope (SPEC section 7) rotates the q and
 * k inputs with attn_rope_apply before the call: keys at positions N .. N+Tk-1,
 * the queries at the last Tq of those (the bottom-right alignment).
 */
#include "attn.h"
#include "cmds.h"
#include "common_cli.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define PROG "attn sdpa"

static const char HELP[] =
    "NAME\n"
    "    attn sdpa - scaled dot-product attention on .npy arrays\n"
    "\n"
    "SYNOPSIS\n"
    "    attn sdpa --query Q.npy --key K.npy --value V.npy [--mask M.npy]\n"
    "              [--causal | --causal-bottom-right] [--window LEFT,RIGHT]\n"
    "              [--softcap C] [--alibi | --alibi-slopes S.npy] [--bias B.npy]\n"
    "              [--sinks S.npy] [--scale S] [--empty-rows error|zero]\n"
    "              [--rope interleaved|half [--rope-base B] [--rope-offset N]]\n"
    "              [--dtype f32|bf16|f16] [--threads N]\n"
    "              --output O.npy [--attention A.npy] [--lse L.npy]\n"
    "              [--grad-output DO.npy --grad-query DQ.npy --grad-key DK.npy\n"
    "               --grad-value DV.npy [--grad-bias DB.npy] [--grad-sinks DS.npy]]\n"
    "\n"
    "DESCRIPTION\n"
    "    Computes attention for every batch b and head h:\n"
    "\n"
    "        Q, K    = RoPE(Q), RoPE(K)         with --rope\n"
    "        scores  = Q K^T * scale            [B, H, Tq, Tk]   scale = 1/sqrt(D)\n"
    "        scores  = C tanh(scores / C)       with --softcap C\n"
    "        scores += bias + ALiBi             with --bias, --alibi\n"
    "        scores  = -inf where a key is hidden (--mask, --causal, --window)\n"
    "        weights = softmax(scores) over the key axis (and the sink, --sinks)\n"
    "        O       = weights V                [B, H, Tq, Dv]\n"
    "\n"
    "    Q is [B, H, Tq, D], K is [B, Hkv, Tk, D], V is [B, Hkv, Tk, Dv]; the leading\n"
    "    axes may be left out ([H, T, D] or [T, D]), the same way in all three.\n"
    "    Tq and Tk may differ (cross-attention). Arrays are .npy files (float32, or\n"
    "    float64/float16, converted).\n"
    "\n"
    "    Grouped-query attention (GQA; MQA when Hkv = 1) needs no flag: when K and V\n"
    "    have fewer heads than Q, query head h reads key/value head h / (H / Hkv).\n"
    "    H must be a multiple of Hkv.\n"
    "\n"
    "    Positions: query i sits at key position i' = i + Tk - Tq, at the end of the\n"
    "    keys (i' = i when Tq == Tk); --causal-bottom-right, --window and --alibi\n"
    "    measure from there.\n"
    "\n"
    "OPTIONS\n"
    "    --query Q.npy, --key K.npy, --value V.npy\n"
    "        The queries, keys and values.\n"
    "    --mask M.npy\n"
    "        A boolean (or uint8) mask, true = may attend, of any shape that\n"
    "        broadcasts to [B, H, Tq, Tk] by numpy's rule (e.g. a padding mask\n"
    "        [B, 1, 1, Tk]).\n"
    "    --causal\n"
    "        Top-left causal (the chapter's; PyTorch's is_causal): query i attends to\n"
    "        keys 0..i only, for any Tq and Tk. Combines with --mask by AND.\n"
    "    --causal-bottom-right\n"
    "        Bottom-right causal (a query block at the end of a cache; PyTorch's\n"
    "        causal_lower_right): query i attends to keys 0..i + Tk - Tq. The same as\n"
    "        --causal when Tq == Tk. Give one of the two.\n"
    "    --window LEFT,RIGHT\n"
    "        A sliding window: key j is visible from query i iff\n"
    "        i' - LEFT <= j <= i' + RIGHT; each side is -1 (unbounded) or >= 0.\n"
    "        '--window 3,0' is a causal window of 4 keys (Mistral's W = 4).\n"
    "    --softcap C\n"
    "        Cap the scores smoothly at +-C: scores = C tanh(scores / C) (Gemma 2);\n"
    "        C > 0.\n"
    "    --alibi\n"
    "        ALiBi with the paper's slopes for H heads (2^(-8k/H), k = 1..H, when H\n"
    "        is a power of two; the paper's interleaving rule otherwise): query head\n"
    "        h's scores get -slope_h * |i' - j|.\n"
    "    --alibi-slopes S.npy\n"
    "        ALiBi with these slopes, float [H]. Not with --alibi.\n"
    "    --bias B.npy\n"
    "        An additive float bias of any shape that broadcasts to [B, H, Tq, Tk]\n"
    "        (PyTorch's float attn_mask); -inf in it hides a key as a mask does.\n"
    "    --sinks S.npy\n"
    "        One sink logit per query head, float [H] (gpt-oss): it joins each row's\n"
    "        softmax denominator with no value, so a row's weights sum to less than\n"
    "        1, and a row whose keys are all hidden gets zero output (not an error).\n"
    "    --scale S\n"
    "        Multiply the scores by S instead of 1/sqrt(D): any number float32\n"
    "        holds (see NUMBERS); 0 makes every weight of a row equal.\n"
    "    --empty-rows error|zero\n"
    "        A query whose keys are all masked is an error (default), or gets zero\n"
    "        output and zero weights ('zero').\n"
    CLI_HELP_ROPE("        Here the Q and K inputs are rotated: the keys at positions N ..\n"
                  "        N+Tk-1 (N = --rope-offset), the queries at the last Tq of those,\n"
                  "        N+Tk-Tq .. N+Tk-1 (bottom-right, as at the end of a KV cache);\n"
                  "        Tq > N+Tk would put a query before position 0: an error.\n")
    "    --output O.npy\n"
    "        Where to write the output, float32 [.., Tq, Dv].\n"
    "    --attention A.npy\n"
    "        Also write the attention weights, float32 [.., Tq, Tk].\n"
    "    --lse L.npy\n"
    "        Also write each row's log-sum-exp of its final scores, float32\n"
    "        [B, H, Tq] ([H, Tq] for 3-D inputs, [Tq] for 2-D):\n"
    "        log(sum_j exp(s_ij) [+ exp(sink)]); -inf for a row that sees no key\n"
    "        (with --empty-rows zero), the sink's logit with --sinks.\n"
    "    --grad-output DO.npy\n"
    "        Also run the backward pass: DO is the gradient of a loss with respect to\n"
    "        the output, float [.., Tq, Dv] like O. The forward runs first and its\n"
    "        output and log-sum-exp feed the backward, which recomputes the weights:\n"
    "\n"
    "            P  = exp(S - lse)         dV = P^T DO       dP = DO V^T\n"
    "            dS = P * (dP - rowsum(DO * O))\n"
    "            dQ = scale dS K           dK = scale dS^T Q\n"
    "\n"
    "        with the softcap's derivative, the bias's and the sink's gradients\n"
    "        where they enter (docs/gradients.md). Needs --grad-query, --grad-key\n"
    "        and --grad-value.\n"
    "    --grad-query DQ.npy, --grad-key DK.npy, --grad-value DV.npy\n"
    "        Where to write the gradients of the loss with respect to Q, K and V,\n"
    "        float32, in Q's, K's and V's shapes. With grouped-query attention dK and\n"
    "        dV sum over the query heads that share a key/value head. A hidden key\n"
    "        gets exactly zero gradient from the rows that cannot see it. With\n"
    "        --rope they are the gradients of the inputs as given (unrotated): the\n"
    "        backward's dQ and dK are turned back by the inverse rotation.\n"
    "    --grad-bias DB.npy\n"
    "        With --bias: the bias's gradient, float32 in the bias file's own shape\n"
    "        (summed over the axes it was broadcast along).\n"
    "    --grad-sinks DS.npy\n"
    "        With --sinks: the sinks' gradient, float32 [H].\n"
    "    --dtype f32|bf16|f16\n"
    "        Store q, k, v and the output in this dtype (default f32): the inputs\n"
    "        are rounded to it (to nearest, ties to even; a float16 file's values\n"
    "        are kept exactly), attention computes in float32 as always, and the\n"
    "        output is rounded once. --output is then float16 for f16, and float32\n"
    "        holding the bfloat16 values exactly for bf16 (numpy has no bfloat16).\n"
    "        The weights and --lse stay float32. Not with --grad-output (the\n"
    "        backward is float32 only). See docs/half-precision.md.\n"
    CLI_HELP_THREADS
    "    -h, --help\n"
    "        Print this help and exit.\n"
    "\n"
    "    Options take their value as the next argument or after '=' (--scale=0.5).\n"
    "    Output files (--output, --attention, --lse and the --grad-* outputs) are\n"
    "    written whole or not at all: each goes to a temporary file next to it, and\n"
    "    all are renamed into place only when all are written.\n"
    "\n"
    "    Usage errors (exit 2): --causal with --causal-bottom-right, --alibi with\n"
    "    --alibi-slopes, a window side below -1, a softcap that is not > 0, a\n"
    "    --rope-base that is not > 0, a --rope-offset below 0, --rope-base or\n"
    "    --rope-offset without --rope, --grad-output without all of --grad-query,\n"
    "    --grad-key and --grad-value (or one of those without it), --grad-bias\n"
    "    without --bias, --grad-sinks without --sinks, two outputs that name one\n"
    "    file, an output that names an input file (an existing output file is\n"
    "    otherwise replaced). Shapes that do not fit (H not a multiple of Hkv,\n"
    "    slopes or sinks not [H], a bias that does not broadcast) are errors\n"
    "    (exit 1) that name the shapes.\n"
    "\n"
    CLI_HELP_FILES
    "\n"
    CLI_HELP_NUMBERS
    "\n"
    CLI_HELP_EXIT
    "\n"
    CLI_HELP_ENVIRONMENT
    "\n"
    "EXAMPLES\n"
    "    attn sdpa --query q.npy --key k.npy --value v.npy --causal \\\n"
    "        --output o.npy --attention a.npy\n"
    "    attn sdpa --query q.npy --key k.npy --value v.npy --causal-bottom-right \\\n"
    "        --window 4095,0 --softcap 50 --sinks sinks.npy --output o.npy \\\n"
    "        --lse l.npy\n"
    "    attn sdpa --query q.npy --key k.npy --value v.npy --causal --output o.npy \\\n"
    "        --grad-output do.npy --grad-query dq.npy --grad-key dk.npy \\\n"
    "        --grad-value dv.npy\n"
    "    attn sdpa --query q.npy --key k.npy --value v.npy --causal --dtype bf16 \\\n"
    "        --output o.npy\n"
    "\n"
    "SEE ALSO\n"
    "    attn forward --help (the same attention inside a multi-head block), attn\n"
    "    --help; docs/files-and-cli.md (files, PyTorch equivalents of each option),\n"
    "    docs/gradients.md, docs/half-precision.md.\n";

/* Checks that a loaded q/k/v is a float array of 2 to 4 dimensions. */
static int check_qkv(const char *opt, const char *path, const attn_array *a)
{
    if (a->tensor.dtype == ATTN_DTYPE_F32 && a->tensor.ndim >= 2)
        return 0;
    char s[96];
    cli_error(PROG, "--%s %s: expected a float array of 2 to 4 dimensions, got %s %s", opt,
              path, attn_dtype_name(a->tensor.dtype), cli_shape(&a->tensor, s, sizeof(s)));
    return CLI_EXIT_ERROR;
}

/* The usage rules of the --grad-* flags: --grad-output and the three gradients of
 * q, k and v come together; --grad-bias and --grad-sinks need what they are the
 * gradient of. */
static int check_grad_flags(const char *const g[6], const cli_sdpa_options *so)
{
    static const char *const names[4] = {"--grad-query", "--grad-key", "--grad-value", NULL};
    for (int i = 0; i < 3; i++)
        if (g[0] && !g[i + 1])
            return cli_usage_error(PROG, "--grad-output needs --grad-query, --grad-key and "
                                         "--grad-value (%s is missing)",
                                   names[i]);
    for (int i = 1; i < 6; i++)
        if (g[i] && !g[0])
            return cli_usage_error(PROG, "%s needs --grad-output (the output's gradient)",
                                   i < 4 ? names[i - 1] : i == 4 ? "--grad-bias" : "--grad-sinks");
    if (g[4] && !so->bias)
        return cli_usage_error(PROG, "--grad-bias needs --bias (there is no bias to "
                                     "differentiate)");
    if (g[5] && !so->sinks)
        return cli_usage_error(PROG, "--grad-sinks needs --sinks (there are no sinks to "
                                     "differentiate)");
    return CLI_PARSED;
}

/* A float32 tensor in the shape of t (allocated; free with attn_tensor_free). */
static int alloc_like(attn_ctx *ctx, attn_tensor *out, const attn_tensor *t)
{
    return attn_tensor_alloc(ctx, out, ATTN_DTYPE_F32, t->ndim, t->shape);
}

int cmd_sdpa(int argc, char **argv)
{
    const char *qp = NULL, *kp = NULL, *vp = NULL, *mask_path = NULL, *output = NULL,
               *attention = NULL;
    /* --grad-output, --grad-query, --grad-key, --grad-value, --grad-bias, --grad-sinks */
    const char *g[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    float scale = 0;
    int empty_rows = 0;
    cli_sdpa_options so;
    cli_rope_options ro;
    memset(&so, 0, sizeof so);
    memset(&ro, 0, sizeof ro);
    static const char *const empty_choices[] = {"error", "zero", NULL};
    static const char *const dtype_choices[] = {"f32", "bf16", "f16", NULL};
    static const attn_dtype dtypes[] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_F16};
    int dtype_ix = 0;
    int64_t threads = 0; /* 0: one per usable core (attn_threads_online) */
    cli_opt opts[] = {
        {"query", CLI_STRING, &qp, NULL, 0, 0, 0},
        {"key", CLI_STRING, &kp, NULL, 0, 0, 0},
        {"value", CLI_STRING, &vp, NULL, 0, 0, 0},
        {"mask", CLI_STRING, &mask_path, NULL, 0, 0, 0},
        CLI_SDPA_OPTIONS(&so),
        CLI_ROPE_OPTIONS(&ro),
        {"scale", CLI_FLOAT, &scale, NULL, 0, 0, 0},
        {"empty-rows", CLI_CHOICE, &empty_rows, empty_choices, 0, 0, 0},
        {"output", CLI_STRING, &output, NULL, 0, 0, 0},
        {"attention", CLI_STRING, &attention, NULL, 0, 0, 0},
        {"grad-output", CLI_STRING, &g[0], NULL, 0, 0, 0},
        {"grad-query", CLI_STRING, &g[1], NULL, 0, 0, 0},
        {"grad-key", CLI_STRING, &g[2], NULL, 0, 0, 0},
        {"grad-value", CLI_STRING, &g[3], NULL, 0, 0, 0},
        {"grad-bias", CLI_STRING, &g[4], NULL, 0, 0, 0},
        {"grad-sinks", CLI_STRING, &g[5], NULL, 0, 0, 0},
        {"dtype", CLI_CHOICE, &dtype_ix, dtype_choices, 0, 0, 0},
        {"threads", CLI_INT, &threads, NULL, 1, CLI_MAX_THREADS, 0},
    };
    const int nopts = (int)(sizeof(opts) / sizeof(opts[0]));
    int rc = cli_parse(PROG, argc, argv, opts, nopts, HELP);
    if (rc != CLI_PARSED)
        return rc;
    static const char *const required[] = {"query", "key", "value", "output", NULL};
    if ((rc = cli_require(PROG, opts, nopts, required)) != CLI_PARSED)
        return rc;
    static const char *const out_names[8] = {"output",     "attention", "lse",
                                             "grad-query", "grad-key",  "grad-value",
                                             "grad-bias",  "grad-sinks"};
    const char *out_paths[8] = {output, attention, so.lse, g[1], g[2], g[3], g[4], g[5]};
    attn_rope_params rope;
    int use_rope;
    static const char *const inputs[] = {"query", "key",   "value", "mask",       "alibi-slopes",
                                         "bias",  "sinks", "grad-output", NULL};
    if ((rc = cli_distinct_outputs(PROG, 8, out_names, out_paths)) != CLI_PARSED ||
        (rc = cli_outputs_spare_inputs(PROG, opts, nopts, 8, out_names, out_paths, inputs)) !=
            CLI_PARSED ||
        (rc = cli_sdpa_options_check(PROG, &so, cli_seen(opts, nopts, "softcap"))) !=
            CLI_PARSED ||
        (rc = check_grad_flags(g, &so)) != CLI_PARSED ||
        (rc = cli_rope_options_get(PROG, opts, nopts, &ro, &rope, &use_rope)) != CLI_PARSED)
        return rc;
    if (dtype_ix != 0 && g[0])
        return cli_usage_error(PROG, "--dtype %s with --grad-output: the backward runs in "
                                     "float32 only",
                               dtype_choices[dtype_ix]);

    attn_ctx ctx;
    cli_ctx_init(&ctx);
    ctx.threads = (int)threads;
    attn_array q = {0}, k = {0}, v = {0}, m = {0}, dout = {0};
    attn_tensor q16 = {0}, k16 = {0}, v16 = {0}; /* --dtype bf16|f16: the stored inputs */
    const attn_dtype dt = dtypes[dtype_ix];
    attn_tensor out = {0}, att = {0}, lse = {0};
    attn_tensor dq = {0}, dk = {0}, dv = {0}, dbias = {0}, dsinks = {0};
    int status = CLI_EXIT_ERROR;

    if (cli_load_npy(PROG, &ctx, "--query", qp, &q) || check_qkv("query", qp, &q) ||
        cli_load_npy(PROG, &ctx, "--key", kp, &k) || check_qkv("key", kp, &k) ||
        cli_load_npy(PROG, &ctx, "--value", vp, &v) || check_qkv("value", vp, &v))
        goto done;
    const int nd = q.tensor.ndim;
    if (k.tensor.ndim != nd || v.tensor.ndim != nd) {
        char a[96], b[96], c[96];
        cli_error(PROG,
                  "query %s, key %s and value %s must have the same number of dimensions",
                  cli_shape(&q.tensor, a, sizeof(a)), cli_shape(&k.tensor, b, sizeof(b)),
                  cli_shape(&v.tensor, c, sizeof(c)));
        goto done;
    }
    if (mask_path && cli_load_mask(PROG, &ctx, mask_path, &m))
        goto done;
    attn_rope_params rq; /* the queries' RoPE: the keys' shifted to the last Tq positions */
    if (use_rope) {
        /* The loaded arrays are this program's own, so they are rotated in place. */
        const int64_t Tq = q.tensor.shape[nd - 2], Tk = k.tensor.shape[nd - 2];
        if (Tq > Tk && Tq - Tk > rope.offset) {
            char a[96], b[96];
            cli_error(PROG,
                      "--rope: query %s has %lld rows and key %s %lld, so with --rope-offset "
                      "%lld the first query would sit at position %lld; the queries are "
                      "the last Tq of the key positions",
                      cli_shape(&q.tensor, a, sizeof(a)), (long long)Tq,
                      cli_shape(&k.tensor, b, sizeof(b)), (long long)Tk,
                      (long long)rope.offset, (long long)(rope.offset + Tk - Tq));
            goto done;
        }
        /* The keys first: their check keeps N + Tk within 64 bits, so the
         * queries' offset below cannot overflow. */
        rq = rope;
        int bad = attn_rope_apply(&ctx, &rope, &k.tensor, &k.tensor);
        if (!bad) {
            rq.offset = rope.offset + (Tk - Tq);
            bad = attn_rope_apply(&ctx, &rq, &q.tensor, &q.tensor);
        }
        if (bad) {
            cli_error(PROG, "--rope: %s", ctx.message);
            goto done;
        }
    }
    if (g[0] && cli_load_npy(PROG, &ctx, "--grad-output", g[0], &dout))
        goto done;
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    if (cli_sdpa_options_load(PROG, &ctx, &so, &p))
        goto done;

    /* out: q's shape with v's last size; weights: q's shape with Tk last; the
     * log-sum-exp: q's shape without its last axis. */
    int64_t s_out[ATTN_MAX_DIMS], s_att[ATTN_MAX_DIMS];
    for (int i = 0; i < nd; i++)
        s_out[i] = s_att[i] = q.tensor.shape[i];
    s_out[nd - 1] = v.tensor.shape[nd - 1];
    s_att[nd - 1] = k.tensor.shape[nd - 2];
    /* --dtype: q, k and v rounded to 16 bits once, here, after any rotation. */
    const attn_tensor *qt = &q.tensor, *kt = &k.tensor, *vt = &v.tensor;
    if (dt != ATTN_DTYPE_F32) {
        attn_tensor *const dst[3] = {&q16, &k16, &v16};
        const attn_tensor *const src[3] = {&q.tensor, &k.tensor, &v.tensor};
        for (int i = 0; i < 3; i++)
            if (attn_tensor_alloc(&ctx, dst[i], dt, src[i]->ndim, src[i]->shape) ||
                attn_tensor_convert(&ctx, src[i], dst[i])) {
                cli_fail(PROG, &ctx);
                goto done;
            }
        qt = &q16, kt = &k16, vt = &v16;
    }
    if (attn_tensor_alloc(&ctx, &out, dt, nd, s_out) ||
        (attention && attn_tensor_alloc(&ctx, &att, ATTN_DTYPE_F32, nd, s_att)) ||
        ((so.lse || g[0]) &&
         attn_tensor_alloc(&ctx, &lse, ATTN_DTYPE_F32, nd - 1, q.tensor.shape)) ||
        (g[0] && (alloc_like(&ctx, &dq, &q.tensor) || alloc_like(&ctx, &dk, &k.tensor) ||
                  alloc_like(&ctx, &dv, &v.tensor))) ||
        (g[4] && alloc_like(&ctx, &dbias, p.bias)) ||
        (g[5] && alloc_like(&ctx, &dsinks, p.sinks))) {
        cli_fail(PROG, &ctx);
        goto done;
    }
    p.mask = mask_path ? &m.tensor : NULL;
    /* The backward needs the forward's log-sum-exp even when --lse is not given. */
    p.lse = (so.lse || g[0]) ? &lse : NULL;
    p.has_scale = cli_seen(opts, nopts, "scale");
    p.scale = scale;
    p.empty_rows = empty_rows ? ATTN_EMPTY_ROWS_ZERO : ATTN_EMPTY_ROWS_ERROR;
    if (attn_sdpa(&ctx, qt, kt, vt, &p, &out, attention ? &att : NULL)) {
        cli_fail_sdpa(PROG, &ctx, &so, mask_path);
        goto done;
    }
    if (g[0]) {
        attn_sdpa_grads grads = {&dq, &dk, &dv, g[4] ? &dbias : NULL, g[5] ? &dsinks : NULL};
        p.lse = NULL; /* the forward's output; the backward takes it as `lse` */
        if (attn_sdpa_backward(&ctx, &q.tensor, &k.tensor, &v.tensor, &p, &out, &lse,
                               &dout.tensor, &grads)) {
            /* The library calls the output's gradient dout; the user knows its flag. */
            if (strncmp(ctx.message, "dout ", 5) == 0)
                cli_error(PROG, "--grad-output %s: %s", g[0], ctx.message);
            else
                cli_fail_sdpa(PROG, &ctx, &so, mask_path);
            goto done;
        }
        /* The backward gave the gradients of the rotated q and k; the user's inputs
         * are the unrotated ones, so each is turned back by the inverse rotation. */
        if (use_rope && (attn_rope_backward(&ctx, &rq, &dq, &dq) ||
                         attn_rope_backward(&ctx, &rope, &dk, &dk))) {
            cli_error(PROG, "--rope: %s", ctx.message);
            goto done;
        }
    }
    /* The outputs asked for, as one output set: all are written or none. */
    const char *paths[8];
    attn_tensor results[8];
    int n_out = 0;
    paths[n_out] = output;
    results[n_out++] = out;
    if (attention) {
        paths[n_out] = attention;
        results[n_out++] = att;
    }
    if (so.lse) {
        paths[n_out] = so.lse;
        results[n_out++] = lse;
    }
    const attn_tensor *grad_t[5] = {&dq, &dk, &dv, &dbias, &dsinks};
    for (int i = 0; i < 5; i++)
        if (g[i + 1]) {
            paths[n_out] = g[i + 1];
            results[n_out++] = *grad_t[i];
        }
    if (cli_save_npys(PROG, &ctx, n_out, paths, results))
        goto done;
    status = CLI_EXIT_OK;

done:
    attn_array_free(&ctx, &q);
    attn_array_free(&ctx, &k);
    attn_array_free(&ctx, &v);
    attn_tensor_free(&ctx, &q16);
    attn_tensor_free(&ctx, &k16);
    attn_tensor_free(&ctx, &v16);
    attn_array_free(&ctx, &m);
    attn_tensor_free(&ctx, &out);
    attn_tensor_free(&ctx, &att);
    attn_tensor_free(&ctx, &lse);
    attn_array_free(&ctx, &dout);
    attn_tensor_free(&ctx, &dq);
    attn_tensor_free(&ctx, &dk);
    attn_tensor_free(&ctx, &dv);
    attn_tensor_free(&ctx, &dbias);
    attn_tensor_free(&ctx, &dsinks);
    cli_sdpa_options_free(&ctx, &so);
    return status;
}
