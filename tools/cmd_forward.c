/*
 * cmd_forward.c - `attn forward`: multi-head self-attention (the chapter's module)
 * with weights from a .safetensors file, on an input from a .npy file.
 *
 *   x [B, T, E] (or [T, E]) -> attn_mha_forward -> y [B, T, E] (or [T, E])
 *   optional: the attention weights [B, H, T, T] (or [H, T, T])
 *
 * Masks: --token-ids/--pad-id build the padding mask [B, 1, 1, T], --mask adds a
 * boolean mask of any shape that broadcasts to [B, H, T, T], --causal the causal
 * mask; all combine by AND. The options of current models that make sense for
 * self-attention (SPEC section 6: window, softcap, ALiBi, bias, sinks, log-sum-exp)
 * go to the attention inside through attn_sdpa_params.
 *
 * Grouped-query attention (SPEC section 7): weights with separate projections
 * (q_proj [H*D, E], k_proj and v_proj [Hkv*D, E], o_proj [E, H*D]) run through
 * attn_gqa_pack with --num-kv-heads Hkv (default H); the fused name sets through
 * attn_mha_pack, and have Hkv = H. Either way the weights are packed once and run
 * through attn_mha_forward_packed_rope, which gives the same bits as the unpacked
 * calls and rotates q and k with --rope between the projections and the attention
 * (SPEC section 7), inside the library call.
 *
 * With --grad-output dY (SPEC section 8) the backward runs after the forward and
 * gives dX (--grad-input) and the gradients of the weights (--grad-weights, a
 * .safetensors file under the very names the weights were loaded by, prefix
 * included, so that a training script can match one file to the other by name):
 * attn_mha_backward for the fused name sets, attn_gqa_backward for separate
 * projections and whenever --rope rotates q and k (the fused W_qkv is then seen as
 * its three row blocks, which gives attn_mha_backward's bits without RoPE).
 */
#include "attn.h"
#include "cmd_forward.h"
#include "cmds.h"
#include "common_cli.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define PROG "attn forward"

static const char HELP[] =
    "NAME\n"
    "    attn forward - multi-head self-attention with weights from a file\n"
    "\n"
    "SYNOPSIS\n"
    "    attn forward --weights W.safetensors [--prefix P] --num-heads H\n"
    "                 [--num-kv-heads Hkv]\n"
    "                 --input X.npy [--token-ids IDS.npy --pad-id N]\n"
    "                 [--causal | --causal-bottom-right] [--mask M.npy]\n"
    "                 [--window LEFT,RIGHT] [--softcap C]\n"
    "                 [--alibi | --alibi-slopes S.npy] [--bias B.npy] [--sinks S.npy]\n"
    "                 [--rope interleaved|half [--rope-base B] [--rope-offset N]]\n"
    "                 [--empty-rows error|zero] [--threads N]\n"
    "                 --output Y.npy [--attention A.npy] [--lse L.npy]\n"
    "                 [--grad-output DY.npy [--grad-input DX.npy]\n"
    "                  [--grad-weights G.safetensors]]\n"
    "\n"
    "DESCRIPTION\n"
    "    Runs the chapter's multi-head self-attention on X:\n"
    "\n"
    "        qkv = X W_qkv^T + b_qkv            [B, T, 3E], split into q, k, v\n"
    "        q, k, v -> [B, H, T, D]            D = E / H\n"
    "        q, k rotated by position           (with --rope only)\n"
    "        weights = softmax(q k^T / sqrt(D)) with masked keys at -inf\n"
    "                  (and the options below, in SPEC section 6's order)\n"
    "        Y = merge(weights v) W_o^T + b_o   [B, T, E]\n"
    "\n"
    "    With separate projections (q_proj, k_proj, v_proj, o_proj) it is\n"
    "    grouped-query attention, as in Llama: q has H heads and k and v have Hkv\n"
    "    heads of the same size D (from the weights: q_proj has H*D rows, which need\n"
    "    not be E); query head h reads key/value head h / (H / Hkv).\n"
    "\n"
    "    X is [B, T, E] (a batch) or [T, E] (one sequence); Y has the shape of X.\n"
    "    Arrays are .npy files (float32, or float64/float16, converted).\n"
    "\n"
    "OPTIONS\n"
    "    --weights W.safetensors\n"
    "        The projection weights, by any of these names (each under --prefix):\n"
    "          qkv.weight [3E,E], qkv.bias [3E], output.weight [E,E], output.bias [E]\n"
    "              (the chapter's module);\n"
    "          in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias\n"
    "              (PyTorch nn.MultiheadAttention's state_dict; biases optional);\n"
    "          q_proj.weight [H*D,E], k_proj.weight [Hkv*D,E], v_proj.weight\n"
    "              [Hkv*D,E], o_proj.weight [E,H*D] (separate projections, e.g. a\n"
    "              Llama layer under --prefix 'model.layers.0.self_attn.'; each\n"
    "              .bias optional, none if absent).\n"
    "        F32, F16, BF16 and F64 tensors are read (converted to float32).\n"
    "    --prefix P\n"
    "        A prefix for every weight name, e.g. 'layers.0.attn.' (default none).\n"
    "    --num-heads H\n"
    "        The number of (query) heads, a whole number >= 1. For the fused name\n"
    "        sets E must be divisible by H (D = E / H); for separate projections\n"
    "        q_proj's rows must be (D = rows / H).\n"
    "    --num-kv-heads Hkv\n"
    "        The number of key/value heads (default: H). H must be a multiple of\n"
    "        Hkv, and k_proj and v_proj must have Hkv*D rows; Hkv = 1 is multi-query\n"
    "        attention. Anything else is an error (exit 1) that names the shapes.\n"
    "        Fused weights (qkv.weight, in_proj_weight) have Hkv = H.\n"
    "    --input X.npy\n"
    "        The input, [B, T, E] or [T, E].\n"
    "    --token-ids IDS.npy, --pad-id N\n"
    "        Token ids [B, T] (or [T]; int32 or int64) and the pad id: keys whose\n"
    "        id is N (any 64-bit whole number, e.g. -1 for none) are masked (a\n"
    "        padding mask [B, 1, 1, T]). Give both or neither.\n"
    "    --causal\n"
    "        Position t attends to positions 0..t only (mask [1, 1, T, T]).\n"
    "    --causal-bottom-right\n"
    "        The same as --causal here: queries and keys are the same T positions,\n"
    "        so both alignments agree. Give one of the two.\n"
    "    --window LEFT,RIGHT\n"
    "        A sliding window: position t sees positions t - LEFT .. t + RIGHT; each\n"
    "        side is -1 (unbounded) or >= 0. With --causal, '--window 4095,0' is\n"
    "        Mistral's window of 4096 positions.\n"
    "    --softcap C\n"
    "        Cap the scores smoothly at +-C: scores = C tanh(scores / C) (Gemma 2);\n"
    "        C > 0.\n"
    "    --alibi\n"
    "        ALiBi with the paper's slopes for H heads: head h's scores get\n"
    "        -slope_h * |t - j|.\n"
    "    --alibi-slopes S.npy\n"
    "        ALiBi with these slopes, float [H]. Not with --alibi.\n"
    "    --bias B.npy\n"
    "        An additive float bias of any shape that broadcasts to [B, H, T, T];\n"
    "        -inf in it hides a key as a mask does.\n"
    "    --sinks S.npy\n"
    "        One sink logit per head, float [H] (gpt-oss): it joins each row's\n"
    "        softmax denominator with no value; a row that sees no key then gets\n"
    "        zero output, not an error.\n"
    "    --mask M.npy\n"
    "        A boolean (or uint8) mask, true = may attend, of any shape that\n"
    "        broadcasts to [B, H, T, T] by numpy's rule.\n"
    CLI_HELP_ROPE("        Here q and k are rotated after the projections, inside the library\n"
                  "        call, both at positions N .. N+T-1 (N = --rope-offset).\n")
    "    --empty-rows error|zero\n"
    "        A query whose keys are all masked is an error (default), or gets zero\n"
    "        output and zero weights ('zero').\n"
    "    --output Y.npy\n"
    "        Where to write the output (float32, the shape of X).\n"
    "    --attention A.npy\n"
    "        Also write the attention weights, [B, H, T, T] (or [H, T, T] for\n"
    "        [T, E]).\n"
    "    --lse L.npy\n"
    "        Also write the attention's log-sum-exp per query row, float32 [B, H, T]\n"
    "        (or [H, T] for [T, E]); see 'attn sdpa --help'.\n"
    "    --grad-output DY.npy\n"
    "        Also run the backward pass: DY (float32, or float64/float16 converted;\n"
    "        the shape of Y) is the gradient of a loss with respect to Y, e.g. all\n"
    "        1/N (N = Y's size) for the mean of Y. The forward is recomputed inside\n"
    "        the call (docs/gradients.md, 'Multi-head attention' and 'Grouped-query\n"
    "        attention and RoPE'). Takes every weight name set (separate\n"
    "        projections with --num-kv-heads too), every mask and option above and\n"
    "        --rope (whose backward turns the gradients of q and k back by the same\n"
    "        angles). Needs --grad-input or --grad-weights (or both).\n"
    "    --grad-input DX.npy\n"
    "        Where to write the gradient with respect to X (float32, X's shape).\n"
    "    --grad-weights G.safetensors\n"
    "        Where to write the gradients of the weights, float32, under exactly the\n"
    "        names the weights file has (prefix included): e.g. qkv.weight,\n"
    "        qkv.bias, output.weight, output.bias, or q_proj.weight .. o_proj.bias.\n"
    "        With grouped-query attention the gradients of k_proj and v_proj sum\n"
    "        over the H / Hkv query heads that read each key/value head. A bias the\n"
    "        file does not have is zero, and no gradient is written for it.\n"
    CLI_HELP_THREADS
    "    -h, --help\n"
    "        Print this help and exit.\n"
    "\n"
    "    Options take their value as the next argument or after '=' (--num-heads=4).\n"
    "    Output files are written whole or not at all: each goes to a temporary file\n"
    "    next to it, and all are renamed into place only when all are written.\n"
    "\n"
    "    Usage errors (exit 2): --causal with --causal-bottom-right, --alibi with\n"
    "    --alibi-slopes, a window side below -1, a softcap that is not > 0, a\n"
    "    --rope-base that is not > 0, a --rope-offset below 0, --rope-base or\n"
    "    --rope-offset without --rope, --grad-output without --grad-input or\n"
    "    --grad-weights (or either without --grad-output), two outputs that name\n"
    "    one file, an output that names an input file (an existing output file is\n"
    "    otherwise replaced). Slopes or sinks that are not [H] and a bias that\n"
    "    does not broadcast are errors (exit 1) that name the shapes.\n"
    "\n"
    CLI_HELP_FILES
    "\n"
    "    The weights are a .safetensors file: F32, F16, BF16 or F64 tensors (see\n"
    "    --weights), in any order in the file, with or without __metadata__; a\n"
    "    header that lies (offsets out of range, overlapping tensors, gaps between\n"
    "    them) is an error (exit 1) naming the file and the tensors.\n"
    "\n"
    CLI_HELP_NUMBERS
    "\n"
    CLI_HELP_EXIT
    "\n"
    CLI_HELP_ENVIRONMENT
    "\n"
    "EXAMPLE\n"
    "    attn forward --weights mha.safetensors --num-heads 4 --input x.npy \\\n"
    "        --token-ids ids.npy --pad-id 0 --causal --output y.npy --attention a.npy\n"
    "    attn forward --weights llama.safetensors \\\n"
    "        --prefix model.layers.0.self_attn. \\\n"
    "        --num-heads 32 --num-kv-heads 8 --input x.npy --causal \\\n"
    "        --rope half --rope-base 500000.0 --output y.npy\n"
    "    attn forward --weights mha.safetensors --num-heads 4 --input x.npy \\\n"
    "        --causal \\\n"
    "        --output y.npy --grad-output dy.npy --grad-input dx.npy \\\n"
    "        --grad-weights grads.safetensors\n"
    "    attn forward --weights llama.safetensors --num-heads 8 --num-kv-heads 2 \\\n"
    "        --input x.npy --causal --rope half --output y.npy \\\n"
    "        --grad-output dy.npy --grad-weights grads.safetensors\n"
    "\n"
    "SEE ALSO\n"
    "    attn decode --help (the same block through a KV cache), attn sdpa --help\n"
    "    (the attention alone), attn --help; docs/files-and-cli.md (exporting\n"
    "    weights from PyTorch), docs/gradients.md.\n";

/* Whether the file holds separate projections under prefix (*separate 1) or not;
 * fails (with the library's message) when the file cannot be opened. */
static int has_separate(attn_ctx *ctx, const char *path, const char *prefix, int *separate)
{
    attn_safetensors *st;
    if (attn_safetensors_open(ctx, path, &st) != ATTN_OK)
        return -1;
    static const char *const names[4] = {"q_proj.weight", "k_proj.weight", "v_proj.weight",
                                         "o_proj.weight"};
    char name[512];
    *separate = 0;
    for (int i = 0; i < 4 && !*separate; i++) {
        /* A prefix too long for the buffer is the loader's to refuse. */
        if (snprintf(name, sizeof name, "%s%s", prefix, names[i]) < (int)sizeof name)
            *separate = attn_safetensors_has(st, name);
    }
    attn_safetensors_close(ctx, st);
    return 0;
}

const char *const fwd_empty_choices[] = {"error", "zero", NULL};

/* The options of attn forward and attn decode that name files the run reads, which
 * no output may name. */
static const char *const fwd_inputs[] = {"weights", "input", "token-ids",   "mask",
                                         "bias",    "sinks", "alibi-slopes", "grad-output",
                                         NULL};

int fwd_check(const char *prog, const cli_opt *opts, int nopts, fwd_args *a,
              attn_rope_params *rope, int *use_rope)
{
    static const char *const required[] = {"weights", "num-heads", "input", "output", NULL};
    int rc;
    if ((rc = cli_require(prog, opts, nopts, required)) != CLI_PARSED)
        return rc;
    if (cli_seen(opts, nopts, "token-ids") != cli_seen(opts, nopts, "pad-id"))
        return cli_usage_error(prog, "--token-ids and --pad-id go together");
    static const char *const out_names[3] = {"output", "attention", "lse"};
    const char *out_paths[3] = {a->output, a->attention, a->so.lse};
    if ((rc = cli_distinct_outputs(prog, 3, out_names, out_paths)) != CLI_PARSED ||
        (rc = cli_outputs_spare_inputs(prog, opts, nopts, 3, out_names, out_paths,
                                       fwd_inputs)) != CLI_PARSED ||
        (rc = cli_sdpa_options_check(prog, &a->so, cli_seen(opts, nopts, "softcap"))) !=
            CLI_PARSED)
        return rc;
    return cli_rope_options_get(prog, opts, nopts, &a->ro, rope, use_rope);
}

int fwd_load(const char *prog, attn_ctx *ctx, fwd_args *a, fwd_data *d)
{
    /* Separate projections load with their grouped-query shapes; the fused sets
     * as the chapter's weights, and only with Hkv = H (otherwise the grouped-query
     * loader is asked, whose message says why those names cannot have Hkv < H). */
    const int64_t H = a->num_heads, Hkv = a->num_kv_heads ? a->num_kv_heads : a->num_heads;
    const char *prefix = a->prefix ? a->prefix : "";
    if (has_separate(ctx, a->weights, prefix, &d->separate) ||
        (d->separate || Hkv != H
             ? attn_weights_load_gqa(ctx, a->weights, prefix, H, Hkv, &d->g)
             : attn_weights_load(ctx, a->weights, prefix, H, &d->w)) != ATTN_OK)
        return cli_fail(prog, ctx);
    /* A fused name set asked for Hkv < H fails in the loader above, so Hkv = H
     * whenever d->separate is 0. */
    d->separate = d->separate || Hkv != H;
    const int64_t E = d->separate ? d->g.w_o.shape[0] : d->w.w_o.shape[0];
    d->H = H, d->Hkv = Hkv, d->E = E;
    d->D = d->separate ? d->g.w_q.shape[0] / H : E / H;
    if (cli_load_npy(prog, ctx, "--input", a->input, &d->x))
        return CLI_EXIT_ERROR;
    const attn_tensor *xt = &d->x.tensor;
    if (xt->dtype != ATTN_DTYPE_F32 || (xt->ndim != 2 && xt->ndim != 3) ||
        xt->shape[xt->ndim - 1] != E) {
        char s[96];
        cli_error(prog,
                  "--input %s: expected a float array [B, T, %lld] or [T, %lld] (E from the "
                  "weights), got %s %s",
                  a->input, (long long)E, (long long)E, attn_dtype_name(xt->dtype),
                  cli_shape(xt, s, sizeof(s)));
        return CLI_EXIT_ERROR;
    }
    d->single = xt->ndim == 2;
    const int64_t B = d->single ? 1 : xt->shape[0], T = xt->shape[xt->ndim - 2];
    d->B = B, d->T = T;
    const int64_t s3[3] = {B, T, E};
    attn_tensor_init(ctx, &d->x3, ATTN_DTYPE_F32, xt->data, 3, s3);

    const attn_tensor *mask = NULL;
    if (a->ids_path) {
        if (cli_load_npy(prog, ctx, "--token-ids", a->ids_path, &d->ids))
            return CLI_EXIT_ERROR;
        attn_tensor ids2 = d->ids.tensor;
        int ok = ids2.dtype == ATTN_DTYPE_I64 || ids2.dtype == ATTN_DTYPE_I32;
        if (ok && ids2.ndim == 1 && d->single) {
            const int64_t s2[2] = {1, ids2.shape[0]};
            attn_tensor_init(ctx, &ids2, d->ids.tensor.dtype, d->ids.tensor.data, 2, s2);
        }
        if (!ok || ids2.ndim != 2 || ids2.shape[0] != B || ids2.shape[1] != T) {
            char s[96];
            cli_error(prog, "--token-ids %s: expected int32 or int64 ids [%lld, %lld], got %s %s",
                      a->ids_path, (long long)B, (long long)T,
                      d->ids.file_dtype ? d->ids.file_dtype : attn_dtype_name(d->ids.tensor.dtype),
                      cli_shape(&d->ids.tensor, s, sizeof(s)));
            return CLI_EXIT_ERROR;
        }
        const int64_t sp[4] = {B, 1, 1, T};
        if (attn_tensor_alloc(ctx, &d->pad, ATTN_DTYPE_BOOL, 4, sp) ||
            attn_mask_padding(ctx, &ids2, a->pad_id, &d->pad))
            return cli_fail(prog, ctx);
        mask = &d->pad;
    }
    if (a->mask_path) {
        if (cli_load_mask(prog, ctx, a->mask_path, &d->user_mask))
            return CLI_EXIT_ERROR;
        if (attn_mask_check(ctx, &d->user_mask.tensor, B, H, T, T)) {
            cli_error(prog, "--mask %s: %s", a->mask_path, ctx->message);
            return CLI_EXIT_ERROR;
        }
        if (mask) {
            int nd;
            int64_t sb[ATTN_MAX_DIMS];
            if (attn_broadcast_shape(ctx, d->pad.ndim, d->pad.shape, d->user_mask.tensor.ndim,
                                     d->user_mask.tensor.shape, &nd, sb) ||
                attn_tensor_alloc(ctx, &d->both, ATTN_DTYPE_BOOL, nd, sb) ||
                attn_mask_and(ctx, &d->pad, &d->user_mask.tensor, &d->both))
                return cli_fail(prog, ctx);
            mask = &d->both;
        } else {
            mask = &d->user_mask.tensor;
        }
    }

    attn_sdpa_params_init(&d->p);
    if (cli_sdpa_options_load(prog, ctx, &a->so, &d->p))
        return CLI_EXIT_ERROR;
    /* Self-attention has Tq == Tk, where bottom-right and top-left causal are the
     * same mask; top-left is the one every kernel has always run. */
    if (d->p.causal == ATTN_CAUSAL_BOTTOM_RIGHT)
        d->p.causal = ATTN_CAUSAL_TOP_LEFT;
    d->p.mask = mask;
    d->p.empty_rows = a->empty_rows ? ATTN_EMPTY_ROWS_ZERO : ATTN_EMPTY_ROWS_ERROR;
    return 0;
}

void fwd_free(attn_ctx *ctx, fwd_args *a, fwd_data *d)
{
    attn_weights_free(ctx, &d->w);
    attn_gqa_weights_free(ctx, &d->g);
    attn_array_free(ctx, &d->x);
    attn_array_free(ctx, &d->ids);
    attn_array_free(ctx, &d->user_mask);
    attn_tensor_free(ctx, &d->pad);
    attn_tensor_free(ctx, &d->both);
    cli_sdpa_options_free(ctx, &a->so);
}

int fwd_save(const char *prog, attn_ctx *ctx, const fwd_args *a, const fwd_data *d,
             const attn_tensor *out, const attn_tensor *att, const attn_tensor *lse)
{
    /* One sequence in, one sequence out: drop the batch axis of size 1 again. The
     * outputs asked for go out as one output set: all are written or none. */
    const int64_t T = d->T, H = d->H;
    attn_tensor results[3];
    const char *paths[3];
    int n_out = 0;
    paths[n_out] = a->output;
    results[n_out] = *out;
    if (d->single) {
        const int64_t s2[2] = {T, d->E};
        attn_tensor_reshape(ctx, out, 2, s2, &results[n_out]);
    }
    n_out++;
    if (a->attention) {
        const int64_t sw[3] = {H, T, T};
        paths[n_out] = a->attention;
        results[n_out] = *att;
        if (d->single)
            attn_tensor_reshape(ctx, att, 3, sw, &results[n_out]);
        n_out++;
    }
    if (a->so.lse) {
        const int64_t sl2[2] = {H, T};
        paths[n_out] = a->so.lse;
        results[n_out] = *lse;
        if (d->single)
            attn_tensor_reshape(ctx, lse, 2, sl2, &results[n_out]);
        n_out++;
    }
    return cli_save_npys(prog, ctx, n_out, paths, results);
}

/* The weight names of the fused set the file has under prefix, in attn_mha_weights'
 * order (w_qkv, b_qkv, w_o, b_o), with has[i] 0 for a bias the file lacks. */
static int grad_names(attn_ctx *ctx, const char *path, const char *prefix, char names[4][512],
                      int has[4])
{
    static const char *const sets[2][4] = {
        {"qkv.weight", "qkv.bias", "output.weight", "output.bias"},
        {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}};
    attn_safetensors *st;
    if (attn_safetensors_open(ctx, path, &st) != ATTN_OK)
        return cli_fail(PROG, ctx);
    int set = -1;
    for (int k = 0; k < 2 && set < 0; k++) {
        snprintf(names[0], 512, "%s%s", prefix, sets[k][0]);
        if (attn_safetensors_has(st, names[0]))
            set = k;
    }
    for (int i = 0; i < 4 && set >= 0; i++) {
        snprintf(names[i], 512, "%s%s", prefix, sets[set][i]);
        has[i] = attn_safetensors_has(st, names[i]);
    }
    attn_safetensors_close(ctx, st);
    if (set < 0) {
        cli_error(PROG, "--grad-output: %s has no qkv.weight or in_proj_weight under the "
                        "prefix; the backward takes the fused weights", path);
        return CLI_EXIT_ERROR;
    }
    return 0;
}

/* The usage rules of --grad-*: --grad-output with at least one of --grad-input and
 * --grad-weights, each of those with it, every output distinct and none an input. */
static int check_grad_flags(const cli_opt *opts, int nopts, const fwd_args *a,
                            const char *const g[3])
{
    if (g[0] && !g[1] && !g[2])
        return cli_usage_error(PROG, "--grad-output needs --grad-input or --grad-weights "
                                     "(where to write the gradients)");
    if (!g[0] && (g[1] || g[2]))
        return cli_usage_error(PROG, "%s needs --grad-output (the output's gradient)",
                               g[1] ? "--grad-input" : "--grad-weights");
    static const char *const out_names[5] = {"output", "attention", "lse", "grad-input",
                                              "grad-weights"};
    const char *out_paths[5] = {a->output, a->attention, a->so.lse, g[1], g[2]};
    const int rc = cli_distinct_outputs(PROG, 5, out_names, out_paths);
    return rc != CLI_PARSED ? rc
                            : cli_outputs_spare_inputs(PROG, opts, nopts, 5, out_names,
                                                       out_paths, fwd_inputs);
}

/* Rows r0 .. r0 + n - 1 of a 1-D or 2-D tensor as a view. */
static attn_tensor rows_view(const attn_tensor *t, int64_t r0, int64_t n)
{
    attn_tensor v = *t;
    v.data = (float *)t->data + r0 * t->stride[0];
    v.shape[0] = n;
    return v;
}

/* The weights' names (prefix included), tensors and presence, in the order of the
 * gradients: fused sets w_qkv, b_qkv, w_o, b_o (n = 4); separate projections W_q,
 * W_k, W_v, W_o, then b_q, b_k, b_v, b_o (n = 8). */
typedef struct grad_set {
    int n;
    char names[8][512];
    int has[8];
    const attn_tensor *of[8];
} grad_set;

static int grad_set_make(attn_ctx *ctx, const fwd_args *a, const fwd_data *d, grad_set *gs)
{
    const char *prefix = a->prefix ? a->prefix : "";
    memset(gs, 0, sizeof *gs);
    if (!d->separate) {
        const attn_tensor *ws[4] = {&d->w.w_qkv, &d->w.b_qkv, &d->w.w_o, &d->w.b_o};
        gs->n = 4;
        for (int i = 0; i < 4; i++)
            gs->of[i] = ws[i];
        return grad_names(ctx, a->weights, prefix, gs->names, gs->has);
    }
    static const char *const names[8] = {"q_proj.weight", "k_proj.weight", "v_proj.weight",
                                         "o_proj.weight", "q_proj.bias",   "k_proj.bias",
                                         "v_proj.bias",   "o_proj.bias"};
    const attn_tensor *ws[8] = {&d->g.w_q, &d->g.w_k, &d->g.w_v, &d->g.w_o,
                                &d->g.b_q, &d->g.b_k, &d->g.b_v, &d->g.b_o};
    gs->n = 8;
    for (int i = 0; i < 8; i++) {
        snprintf(gs->names[i], sizeof gs->names[i], "%s%s", prefix, names[i]);
        /* The loader leaves a bias the file lacks without data. */
        gs->has[i] = i < 4 || ws[i]->data != NULL;
        gs->of[i] = ws[i];
    }
    return 0;
}

/* The backward on d's weights into dx and dw[] (grad_set's order; a separate bias
 * the file lacks has no tensor and is not computed). */
static int run_backward(attn_ctx *ctx, const fwd_data *d, const attn_sdpa_params *p,
                        const attn_rope_params *rope, const attn_tensor *dy3, attn_tensor *dx,
                        attn_tensor *dw)
{
    if (!d->separate && !rope) {
        const attn_mha_grads grads = {dx, &dw[0], &dw[1], &dw[2], &dw[3]};
        return attn_mha_backward(ctx, &d->w, d->H, &d->x3, p, dy3, &grads);
    }
    if (d->separate) {
        attn_tensor *db[4];
        for (int i = 0; i < 4; i++)
            db[i] = dw[4 + i].data ? &dw[4 + i] : NULL;
        const attn_gqa_grads grads = {dx,    &dw[0], &dw[1], &dw[2], &dw[3],
                                      db[0], db[1],  db[2],  db[3]};
        return attn_gqa_backward(ctx, &d->g, d->H, d->Hkv, &d->x3, p, rope, dy3, &grads);
    }
    /* The chapter's module with RoPE: W_qkv's row blocks are q's, k's and v's, and
     * the same blocks of dW_qkv and db_qkv their gradients. */
    const int64_t E = d->E;
    attn_gqa_weights w;
    attn_tensor v[6];
    w.w_q = rows_view(&d->w.w_qkv, 0, E);
    w.w_k = rows_view(&d->w.w_qkv, E, E);
    w.w_v = rows_view(&d->w.w_qkv, 2 * E, E);
    w.b_q = rows_view(&d->w.b_qkv, 0, E);
    w.b_k = rows_view(&d->w.b_qkv, E, E);
    w.b_v = rows_view(&d->w.b_qkv, 2 * E, E);
    w.w_o = d->w.w_o;
    w.b_o = d->w.b_o;
    for (int i = 0; i < 3; i++) {
        v[i] = rows_view(&dw[0], i * E, E);
        v[3 + i] = rows_view(&dw[1], i * E, E);
    }
    const attn_gqa_grads grads = {dx, &v[0], &v[1], &v[2], &dw[2], &v[3], &v[4], &v[5], &dw[3]};
    return attn_gqa_backward(ctx, &w, d->H, d->H, &d->x3, p, rope, dy3, &grads);
}

/* Runs the backward for the dY at path g[0] and writes Y (and the forward's other
 * outputs) with dX and the weights' gradients as one output set. */
static int forward_grad(attn_ctx *ctx, const fwd_args *a, const fwd_data *d,
                        const char *const g[3], const attn_rope_params *rope,
                        const attn_tensor *out, const attn_tensor *att, const attn_tensor *lse)
{
    grad_set gs;
    if (grad_set_make(ctx, a, d, &gs))
        return CLI_EXIT_ERROR;
    attn_array dy = {0};
    attn_tensor dx = {0}, dw[8] = {{0}};
    int status = CLI_EXIT_ERROR;
    if (cli_load_npy(PROG, ctx, "--grad-output", g[0], &dy))
        goto done;
    const attn_tensor *yt = &dy.tensor;
    const int want_nd = d->single ? 2 : 3;
    if (yt->dtype != ATTN_DTYPE_F32 || yt->ndim != want_nd ||
        memcmp(yt->shape, d->x.tensor.shape, sizeof(int64_t) * (size_t)want_nd) != 0) {
        char s1[96], s2[96];
        cli_error(PROG, "--grad-output %s: expected float %s (the output's shape), got %s %s",
                  g[0], cli_shape(&d->x.tensor, s1, sizeof s1), attn_dtype_name(yt->dtype),
                  cli_shape(yt, s2, sizeof s2));
        goto done;
    }
    const int64_t E = d->E, s3[3] = {d->B, d->T, E};
    attn_tensor dy3;
    attn_tensor_init(ctx, &dy3, ATTN_DTYPE_F32, yt->data, 3, s3);
    int bad = attn_tensor_alloc(ctx, &dx, ATTN_DTYPE_F32, 3, s3);
    /* Every fused tensor has a gradient (a bias the file lacks is zeros, written
     * nowhere); a separate bias the file lacks has none. */
    for (int i = 0; i < gs.n && !bad; i++)
        if (gs.n == 4 || gs.has[i])
            bad = attn_tensor_alloc(ctx, &dw[i], ATTN_DTYPE_F32, gs.of[i]->ndim,
                                    gs.of[i]->shape);
    if (bad) {
        cli_fail(PROG, ctx);
        goto done;
    }
    attn_sdpa_params p = d->p;
    p.lse = NULL; /* the backward recomputes its own */
    if (run_backward(ctx, d, &p, rope, &dy3, &dx, dw)) {
        cli_fail_sdpa(PROG, ctx, &a->so, NULL);
        goto done;
    }

    /* One output set: Y (and A, L), then dX, then the weights' gradients; a [T, E]
     * input drops the batch axis of each, as fwd_save does. */
    cli_output outs[5];
    attn_tensor shown[3] = {*out, *att, *lse}, dx_shown = dx, gt[8];
    const char *gnames[8];
    int n = 0, ng = 0;
    const int64_t T = d->T, H = d->H, s2[2] = {T, E}, sw[3] = {H, T, T}, sl[2] = {H, T};
    if (d->single) {
        attn_tensor_reshape(ctx, out, 2, s2, &shown[0]);
        if (a->attention)
            attn_tensor_reshape(ctx, att, 3, sw, &shown[1]);
        if (a->so.lse)
            attn_tensor_reshape(ctx, lse, 2, sl, &shown[2]);
        attn_tensor_reshape(ctx, &dx, 2, s2, &dx_shown);
    }
    outs[n++] = (cli_output){a->output, &shown[0], NULL, NULL, 0, NULL, 0};
    if (a->attention)
        outs[n++] = (cli_output){a->attention, &shown[1], NULL, NULL, 0, NULL, 0};
    if (a->so.lse)
        outs[n++] = (cli_output){a->so.lse, &shown[2], NULL, NULL, 0, NULL, 0};
    if (g[1])
        outs[n++] = (cli_output){g[1], &dx_shown, NULL, NULL, 0, NULL, 0};
    for (int i = 0; i < gs.n; i++)
        if (gs.has[i]) {
            gnames[ng] = gs.names[i];
            gt[ng++] = dw[i];
        }
    if (g[2])
        outs[n++] = (cli_output){g[2], NULL, gnames, gt, ng, NULL, 0};
    if (cli_save_outputs(PROG, ctx, n, outs))
        goto done;
    status = CLI_EXIT_OK;

done:
    attn_array_free(ctx, &dy);
    attn_tensor_free(ctx, &dx);
    for (int i = 0; i < 8; i++)
        attn_tensor_free(ctx, &dw[i]);
    return status;
}

int cmd_forward(int argc, char **argv)
{
    fwd_args a;
    memset(&a, 0, sizeof a);
    /* --grad-output, --grad-input, --grad-weights */
    const char *g[3] = {NULL, NULL, NULL};
    cli_opt opts[] = {FWD_OPTIONS(&a),
                      {"grad-output", CLI_STRING, &g[0], NULL, 0, 0, 0},
                      {"grad-input", CLI_STRING, &g[1], NULL, 0, 0, 0},
                      {"grad-weights", CLI_STRING, &g[2], NULL, 0, 0, 0}};
    const int nopts = (int)(sizeof(opts) / sizeof(opts[0]));
    int rc = cli_parse(PROG, argc, argv, opts, nopts, HELP);
    if (rc != CLI_PARSED)
        return rc;
    attn_rope_params rope;
    int use_rope;
    if ((rc = fwd_check(PROG, opts, nopts, &a, &rope, &use_rope)) != CLI_PARSED ||
        (rc = check_grad_flags(opts, nopts, &a, g)) != CLI_PARSED)
        return rc;

    attn_ctx ctx;
    cli_ctx_init(&ctx);
    ctx.threads = (int)a.threads;
    fwd_data d;
    memset(&d, 0, sizeof d);
    attn_mha_packed *packed = NULL;
    attn_tensor out = {0}, att = {0}, lse = {0};
    int status = CLI_EXIT_ERROR;
    if (fwd_load(PROG, &ctx, &a, &d))
        goto done;
    /* Packed once, both name sets run through the one call that takes RoPE; packed
     * weights give the same bits as attn_mha_forward and attn_gqa_forward. */
    if ((d.separate ? attn_gqa_pack(&ctx, &d.g, d.H, d.Hkv, &packed)
                    : attn_mha_pack(&ctx, &d.w, &packed)) != ATTN_OK) {
        cli_fail(PROG, &ctx);
        goto done;
    }
    const int64_t s3[3] = {d.B, d.T, d.E}, sa[4] = {d.B, d.H, d.T, d.T},
                  sl[3] = {d.B, d.H, d.T};
    if (attn_tensor_alloc(&ctx, &out, ATTN_DTYPE_F32, 3, s3) ||
        (a.attention && attn_tensor_alloc(&ctx, &att, ATTN_DTYPE_F32, 4, sa)) ||
        (a.so.lse && attn_tensor_alloc(&ctx, &lse, ATTN_DTYPE_F32, 3, sl))) {
        cli_fail(PROG, &ctx);
        goto done;
    }
    d.p.lse = a.so.lse ? &lse : NULL;
    if (attn_mha_forward_packed_rope(&ctx, packed, d.H, &d.x3, &d.p, use_rope ? &rope : NULL,
                                     &out, a.attention ? &att : NULL)) {
        cli_fail_sdpa(PROG, &ctx, &a.so, NULL);
        goto done;
    }
    if (g[0] ? forward_grad(&ctx, &a, &d, g, use_rope ? &rope : NULL, &out, &att, &lse)
             : fwd_save(PROG, &ctx, &a, &d, &out, &att, &lse))
        goto done;
    status = CLI_EXIT_OK;

done:
    attn_mha_packed_free(&ctx, packed);
    attn_tensor_free(&ctx, &out);
    attn_tensor_free(&ctx, &att);
    attn_tensor_free(&ctx, &lse);
    fwd_free(&ctx, &a, &d);
    return status;
}
