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
 */
#include "attn.h"
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
    "                 [--empty-rows error|zero]\n"
    "                 --output Y.npy [--attention A.npy] [--lse L.npy]\n"
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
    "        Token ids [B, T] (or [T]; int32 or int64) and the pad id: keys whose id is\n"
    "        N (any 64-bit whole number, e.g. -1 for none) are masked (a padding\n"
    "        mask [B, 1, 1, T]). Give both or neither.\n"
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
    "        A boolean (or uint8) mask, true = may attend, of any shape that broadcasts\n"
    "        to [B, H, T, T] by numpy's rule.\n"
    CLI_HELP_ROPE("        Here q and k are rotated after the projections, inside the library\n"
                  "        call, both at positions N .. N+T-1 (N = --rope-offset).\n")
    "    --empty-rows error|zero\n"
    "        A query whose keys are all masked is an error (default), or gets zero\n"
    "        output and zero weights ('zero').\n"
    "    --output Y.npy\n"
    "        Where to write the output (float32, the shape of X).\n"
    "    --attention A.npy\n"
    "        Also write the attention weights, [B, H, T, T] (or [H, T, T] for [T, E]).\n"
    "    --lse L.npy\n"
    "        Also write the attention's log-sum-exp per query row, float32 [B, H, T]\n"
    "        (or [H, T] for [T, E]); see 'attn sdpa --help'.\n"
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
    "    --rope-offset without --rope. Slopes\n"
    "    or sinks that are not [H] and a bias that does not broadcast are errors\n"
    "    (exit 1) that name the shapes.\n"
    "\n"
    CLI_HELP_NUMBERS
    "\n"
    CLI_HELP_EXIT
    "\n"
    "EXAMPLE\n"
    "    attn forward --weights mha.safetensors --num-heads 4 --input x.npy \\\n"
    "        --token-ids ids.npy --pad-id 0 --causal --output y.npy --attention a.npy\n"
    "    attn forward --weights llama.safetensors --prefix model.layers.0.self_attn. \\\n"
    "        --num-heads 32 --num-kv-heads 8 --input x.npy --causal \\\n"
    "        --rope half --rope-base 500000.0 --output y.npy\n"
    "\n"
    "    See docs/files-and-cli.md for exporting weights from PyTorch.\n";

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

int cmd_forward(int argc, char **argv)
{
    const char *weights = NULL, *prefix = "", *input = NULL, *ids_path = NULL;
    const char *mask_path = NULL, *output = NULL, *attention = NULL;
    int64_t num_heads = 0, num_kv_heads = 0, pad_id = 0;
    int empty_rows = 0;
    cli_sdpa_options so;
    cli_rope_options ro;
    memset(&so, 0, sizeof so);
    memset(&ro, 0, sizeof ro);
    static const char *const empty_choices[] = {"error", "zero", NULL};
    cli_opt opts[] = {
        {"weights", CLI_STRING, &weights, NULL, 0, 0, 0},
        {"prefix", CLI_STRING, &prefix, NULL, 0, 0, 0},
        {"num-heads", CLI_INT, &num_heads, NULL, 1, INT64_MAX, 0},
        {"num-kv-heads", CLI_INT, &num_kv_heads, NULL, 1, INT64_MAX, 0},
        {"input", CLI_STRING, &input, NULL, 0, 0, 0},
        {"token-ids", CLI_STRING, &ids_path, NULL, 0, 0, 0},
        {"pad-id", CLI_INT, &pad_id, NULL, INT64_MIN, INT64_MAX, 0},
        CLI_SDPA_OPTIONS(&so),
        CLI_ROPE_OPTIONS(&ro),
        {"mask", CLI_STRING, &mask_path, NULL, 0, 0, 0},
        {"empty-rows", CLI_CHOICE, &empty_rows, empty_choices, 0, 0, 0},
        {"output", CLI_STRING, &output, NULL, 0, 0, 0},
        {"attention", CLI_STRING, &attention, NULL, 0, 0, 0},
    };
    const int nopts = (int)(sizeof(opts) / sizeof(opts[0]));
    int rc = cli_parse(PROG, argc, argv, opts, nopts, HELP);
    if (rc != CLI_PARSED)
        return rc;
    static const char *const required[] = {"weights", "num-heads", "input", "output", NULL};
    if ((rc = cli_require(PROG, opts, nopts, required)) != CLI_PARSED)
        return rc;
    if (cli_seen(opts, nopts, "token-ids") != cli_seen(opts, nopts, "pad-id"))
        return cli_usage_error(PROG, "--token-ids and --pad-id go together");
    static const char *const out_names[3] = {"output", "attention", "lse"};
    const char *out_paths[3] = {output, attention, so.lse};
    attn_rope_params rope;
    int use_rope;
    if ((rc = cli_distinct_outputs(PROG, 3, out_names, out_paths)) != CLI_PARSED ||
        (rc = cli_sdpa_options_check(PROG, &so, cli_seen(opts, nopts, "softcap"))) !=
            CLI_PARSED ||
        (rc = cli_rope_options_get(PROG, opts, nopts, &ro, &rope, &use_rope)) != CLI_PARSED)
        return rc;

    attn_ctx ctx;
    cli_ctx_init(&ctx);
    attn_mha_weights w;
    attn_gqa_weights g;
    attn_mha_packed *packed = NULL;
    attn_array x = {0}, ids = {0}, user_mask = {0};
    attn_tensor pad = {0}, both = {0}, out = {0}, att = {0}, lse = {0};
    const attn_tensor *mask = NULL;
    int status = CLI_EXIT_ERROR;
    memset(&w, 0, sizeof(w));
    memset(&g, 0, sizeof(g));

    /* Separate projections load with their grouped-query shapes; the fused sets
     * as the chapter's weights, and only with Hkv = H (otherwise the grouped-query
     * loader is asked, whose message says why those names cannot have Hkv < H). */
    const int64_t H = num_heads, Hkv = num_kv_heads ? num_kv_heads : num_heads;
    int separate = 0;
    if (has_separate(&ctx, weights, prefix, &separate) ||
        (separate || Hkv != H ? attn_weights_load_gqa(&ctx, weights, prefix, H, Hkv, &g)
                              : attn_weights_load(&ctx, weights, prefix, H, &w)) != ATTN_OK ||
        (separate ? attn_gqa_pack(&ctx, &g, H, Hkv, &packed)
                  : attn_mha_pack(&ctx, &w, &packed)) != ATTN_OK) {
        cli_fail(PROG, &ctx);
        goto done;
    }
    const int64_t E = separate ? g.w_o.shape[0] : w.w_o.shape[0];
    if (cli_load_npy(PROG, &ctx, "--input", input, &x))
        goto done;
    if (x.tensor.dtype != ATTN_DTYPE_F32 || (x.tensor.ndim != 2 && x.tensor.ndim != 3) ||
        x.tensor.shape[x.tensor.ndim - 1] != E) {
        char s[96];
        cli_error(PROG,
                  "--input %s: expected a float array [B, T, %lld] or [T, %lld] (E from the "
                  "weights), got %s %s",
                  input, (long long)E, (long long)E, attn_dtype_name(x.tensor.dtype),
                  cli_shape(&x.tensor, s, sizeof(s)));
        goto done;
    }
    const int single = x.tensor.ndim == 2;
    const int64_t B = single ? 1 : x.tensor.shape[0];
    const int64_t T = x.tensor.shape[x.tensor.ndim - 2];
    attn_tensor x3;
    const int64_t s3[3] = {B, T, E};
    attn_tensor_init(&ctx, &x3, ATTN_DTYPE_F32, x.tensor.data, 3, s3);

    if (ids_path) {
        if (cli_load_npy(PROG, &ctx, "--token-ids", ids_path, &ids))
            goto done;
        attn_tensor ids2 = ids.tensor;
        int ok = ids.tensor.dtype == ATTN_DTYPE_I64 || ids.tensor.dtype == ATTN_DTYPE_I32;
        if (ok && ids.tensor.ndim == 1 && single) {
            const int64_t s2[2] = {1, ids.tensor.shape[0]};
            attn_tensor_init(&ctx, &ids2, ids.tensor.dtype, ids.tensor.data, 2, s2);
        }
        if (!ok || ids2.ndim != 2 || ids2.shape[0] != B || ids2.shape[1] != T) {
            char s[96];
            cli_error(PROG, "--token-ids %s: expected int32 or int64 ids [%lld, %lld], got %s %s",
                      ids_path, (long long)B, (long long)T,
                      ids.file_dtype ? ids.file_dtype : attn_dtype_name(ids.tensor.dtype),
                      cli_shape(&ids.tensor, s, sizeof(s)));
            goto done;
        }
        const int64_t sp[4] = {B, 1, 1, T};
        if (attn_tensor_alloc(&ctx, &pad, ATTN_DTYPE_BOOL, 4, sp) ||
            attn_mask_padding(&ctx, &ids2, pad_id, &pad)) {
            cli_fail(PROG, &ctx);
            goto done;
        }
        mask = &pad;
    }
    if (mask_path) {
        if (cli_load_mask(PROG, &ctx, mask_path, &user_mask))
            goto done;
        if (attn_mask_check(&ctx, &user_mask.tensor, B, H, T, T)) {
            cli_error(PROG, "--mask %s: %s", mask_path, ctx.message);
            goto done;
        }
        if (mask) {
            int nd;
            int64_t sb[ATTN_MAX_DIMS];
            if (attn_broadcast_shape(&ctx, pad.ndim, pad.shape, user_mask.tensor.ndim,
                                     user_mask.tensor.shape, &nd, sb) ||
                attn_tensor_alloc(&ctx, &both, ATTN_DTYPE_BOOL, nd, sb) ||
                attn_mask_and(&ctx, &pad, &user_mask.tensor, &both)) {
                cli_fail(PROG, &ctx);
                goto done;
            }
            mask = &both;
        } else {
            mask = &user_mask.tensor;
        }
    }

    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    if (cli_sdpa_options_load(PROG, &ctx, &so, &p))
        goto done;
    /* Self-attention has Tq == Tk, where bottom-right and top-left causal are the
     * same mask; top-left is the one every kernel has always run. */
    if (p.causal == ATTN_CAUSAL_BOTTOM_RIGHT)
        p.causal = ATTN_CAUSAL_TOP_LEFT;
    p.mask = mask;
    p.empty_rows = empty_rows ? ATTN_EMPTY_ROWS_ZERO : ATTN_EMPTY_ROWS_ERROR;
    const int64_t sa[4] = {B, H, T, T}, sl[3] = {B, H, T};
    if (attn_tensor_alloc(&ctx, &out, ATTN_DTYPE_F32, 3, s3) ||
        (attention && attn_tensor_alloc(&ctx, &att, ATTN_DTYPE_F32, 4, sa)) ||
        (so.lse && attn_tensor_alloc(&ctx, &lse, ATTN_DTYPE_F32, 3, sl))) {
        cli_fail(PROG, &ctx);
        goto done;
    }
    p.lse = so.lse ? &lse : NULL;
    if (attn_mha_forward_packed_rope(&ctx, packed, H, &x3, &p, use_rope ? &rope : NULL, &out,
                                     attention ? &att : NULL)) {
        cli_fail_sdpa(PROG, &ctx, &so, NULL);
        goto done;
    }

    /* One sequence in, one sequence out: drop the batch axis of size 1 again. The
     * outputs asked for go out as one output set: all are written or none. */
    attn_tensor results[3];
    const char *paths[3];
    int n_out = 0;
    paths[n_out] = output;
    results[n_out] = out;
    if (single) {
        const int64_t s2[2] = {T, E};
        attn_tensor_reshape(&ctx, &out, 2, s2, &results[n_out]);
    }
    n_out++;
    if (attention) {
        const int64_t sw[3] = {H, T, T};
        paths[n_out] = attention;
        results[n_out] = att;
        if (single)
            attn_tensor_reshape(&ctx, &att, 3, sw, &results[n_out]);
        n_out++;
    }
    if (so.lse) {
        const int64_t sl2[2] = {H, T};
        paths[n_out] = so.lse;
        results[n_out] = lse;
        if (single)
            attn_tensor_reshape(&ctx, &lse, 2, sl2, &results[n_out]);
        n_out++;
    }
    if (cli_save_npys(PROG, &ctx, n_out, paths, results))
        goto done;
    status = CLI_EXIT_OK;

done:
    attn_weights_free(&ctx, &w);
    attn_gqa_weights_free(&ctx, &g);
    attn_mha_packed_free(&ctx, packed);
    attn_array_free(&ctx, &x);
    attn_array_free(&ctx, &ids);
    attn_array_free(&ctx, &user_mask);
    attn_tensor_free(&ctx, &pad);
    attn_tensor_free(&ctx, &both);
    attn_tensor_free(&ctx, &out);
    attn_tensor_free(&ctx, &att);
    attn_tensor_free(&ctx, &lse);
    cli_sdpa_options_free(&ctx, &so);
    return status;
}
