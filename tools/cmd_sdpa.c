/*
 * cmd_sdpa.c - `attn sdpa`: scaled dot-product attention on .npy arrays.
 *
 *   q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv]  (or without B, or without B
 *   and H) -> out [.., Tq, Dv]; optional weights [.., Tq, Tk]
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
    "    attn sdpa --query Q.npy --key K.npy --value V.npy [--mask M.npy] [--causal]\n"
    "              [--scale S] [--empty-rows error|zero]\n"
    "              --output O.npy [--attention A.npy]\n"
    "\n"
    "DESCRIPTION\n"
    "    Computes attention for every batch b and head h:\n"
    "\n"
    "        scores  = Q K^T * scale            [B, H, Tq, Tk]   scale = 1/sqrt(D)\n"
    "        scores  = -inf where the mask is false\n"
    "        weights = softmax(scores) over the key axis\n"
    "        O       = weights V                [B, H, Tq, Dv]\n"
    "\n"
    "    Q is [B, H, Tq, D], K is [B, H, Tk, D], V is [B, H, Tk, Dv]; the leading\n"
    "    axes may be left out ([H, T, D] or [T, D]), the same way in all three.\n"
    "    Tq and Tk may differ (cross-attention). Arrays are .npy files (float32, or\n"
    "    float64/float16, converted).\n"
    "\n"
    "OPTIONS\n"
    "    --query Q.npy, --key K.npy, --value V.npy\n"
    "        The queries, keys and values.\n"
    "    --mask M.npy\n"
    "        A boolean (or uint8) mask, true = may attend, of any shape that broadcasts\n"
    "        to [B, H, Tq, Tk] by numpy's rule (e.g. a padding mask [B, 1, 1, Tk]).\n"
    "    --causal\n"
    "        Query i attends to keys 0..i only; needs Tq == Tk. Combines with --mask\n"
    "        by AND.\n"
    "    --scale S\n"
    "        Multiply the scores by S instead of 1/sqrt(D): any number float32\n"
    "        holds (see NUMBERS); 0 makes every weight of a row equal.\n"
    "    --empty-rows error|zero\n"
    "        A query whose keys are all masked is an error (default), or gets zero\n"
    "        output and zero weights ('zero').\n"
    "    --output O.npy\n"
    "        Where to write the output, float32 [.., Tq, Dv].\n"
    "    --attention A.npy\n"
    "        Also write the attention weights, float32 [.., Tq, Tk].\n"
    "    -h, --help\n"
    "        Print this help and exit.\n"
    "\n"
    "    Options take their value as the next argument or after '=' (--scale=0.5).\n"
    "    Output files are written whole or not at all: each goes to a temporary file\n"
    "    next to it, and all are renamed into place only when all are written.\n"
    "\n"
    CLI_HELP_NUMBERS
    "\n"
    CLI_HELP_EXIT
    "\n"
    "EXAMPLE\n"
    "    attn sdpa --query q.npy --key k.npy --value v.npy --causal \\\n"
    "        --output o.npy --attention a.npy\n";

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

int cmd_sdpa(int argc, char **argv)
{
    const char *qp = NULL, *kp = NULL, *vp = NULL, *mask_path = NULL, *output = NULL,
               *attention = NULL;
    float scale = 0;
    int causal = 0, empty_rows = 0;
    static const char *const empty_choices[] = {"error", "zero", NULL};
    cli_opt opts[] = {
        {"query", CLI_STRING, &qp, NULL, 0, 0, 0},
        {"key", CLI_STRING, &kp, NULL, 0, 0, 0},
        {"value", CLI_STRING, &vp, NULL, 0, 0, 0},
        {"mask", CLI_STRING, &mask_path, NULL, 0, 0, 0},
        {"causal", CLI_FLAG, &causal, NULL, 0, 0, 0},
        {"scale", CLI_FLOAT, &scale, NULL, 0, 0, 0},
        {"empty-rows", CLI_CHOICE, &empty_rows, empty_choices, 0, 0, 0},
        {"output", CLI_STRING, &output, NULL, 0, 0, 0},
        {"attention", CLI_STRING, &attention, NULL, 0, 0, 0},
    };
    const int nopts = (int)(sizeof(opts) / sizeof(opts[0]));
    int rc = cli_parse(PROG, argc, argv, opts, nopts, HELP);
    if (rc != CLI_PARSED)
        return rc;
    static const char *const required[] = {"query", "key", "value", "output", NULL};
    if ((rc = cli_require(PROG, opts, nopts, required)) != CLI_PARSED)
        return rc;
    if (attention && strcmp(attention, output) == 0)
        return cli_usage_error(PROG, "--output and --attention name the same file");

    attn_ctx ctx;
    cli_ctx_init(&ctx);
    attn_array q = {0}, k = {0}, v = {0}, m = {0};
    attn_tensor out = {0}, att = {0};
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

    /* out: q's shape with v's last size; weights: q's shape with Tk last. */
    int64_t so[ATTN_MAX_DIMS], sw[ATTN_MAX_DIMS];
    for (int i = 0; i < nd; i++)
        so[i] = sw[i] = q.tensor.shape[i];
    so[nd - 1] = v.tensor.shape[nd - 1];
    sw[nd - 1] = k.tensor.shape[nd - 2];
    if (attn_tensor_alloc(&ctx, &out, ATTN_DTYPE_F32, nd, so) ||
        (attention && attn_tensor_alloc(&ctx, &att, ATTN_DTYPE_F32, nd, sw))) {
        cli_fail(PROG, &ctx);
        goto done;
    }
    attn_sdpa_params p;
    attn_sdpa_params_init(&p);
    p.mask = mask_path ? &m.tensor : NULL;
    p.causal = causal;
    p.has_scale = cli_seen(opts, nopts, "scale");
    p.scale = scale;
    p.empty_rows = empty_rows ? ATTN_EMPTY_ROWS_ZERO : ATTN_EMPTY_ROWS_ERROR;
    if (attn_sdpa(&ctx, &q.tensor, &k.tensor, &v.tensor, &p, &out, attention ? &att : NULL)) {
        cli_fail_attention(PROG, &ctx, mask_path);
        goto done;
    }
    const char *paths[2] = {output, attention};
    attn_tensor results[2] = {out, att};
    if (cli_save_npys(PROG, &ctx, attention ? 2 : 1, paths, results))
        goto done;
    status = CLI_EXIT_OK;

done:
    attn_array_free(&ctx, &q);
    attn_array_free(&ctx, &k);
    attn_array_free(&ctx, &v);
    attn_array_free(&ctx, &m);
    attn_tensor_free(&ctx, &out);
    attn_tensor_free(&ctx, &att);
    return status;
}
