/*
 * cmd_forward.h - the parts of `attn forward` that `attn decode` shares: the
 * options, their usage rules, and loading the weights, the input and the masks
 * into attn_sdpa_params. Both commands then run their own way (one packed forward
 * call, or a KV cache step by step) and write their outputs through fwd_save.
 */
#ifndef TOOLS_CMD_FORWARD_H
#define TOOLS_CMD_FORWARD_H

#include "attn.h"
#include "common_cli.h"

#include <stdint.h>

/* What the command line gave. Zero it before parsing. */
typedef struct fwd_args {
    const char *weights, *prefix, *input, *ids_path, *mask_path, *output, *attention;
    int64_t num_heads, num_kv_heads, pad_id;
    int64_t threads; /* --threads; 0: one per usable core (attn_threads_online) */
    int empty_rows;
    cli_sdpa_options so;
    cli_rope_options ro;
} fwd_args;

extern const char *const fwd_empty_choices[]; /* "error", "zero", NULL */

/* The cli_opt entries of attn forward's options, for a command's option table. */
#define FWD_OPTIONS(a)                                                                   \
    {"weights", CLI_STRING, &(a)->weights, NULL, 0, 0, 0},                                \
    {"prefix", CLI_STRING, &(a)->prefix, NULL, 0, 0, 0},                                  \
    {"num-heads", CLI_INT, &(a)->num_heads, NULL, 1, INT64_MAX, 0},                       \
    {"num-kv-heads", CLI_INT, &(a)->num_kv_heads, NULL, 1, INT64_MAX, 0},                 \
    {"input", CLI_STRING, &(a)->input, NULL, 0, 0, 0},                                    \
    {"token-ids", CLI_STRING, &(a)->ids_path, NULL, 0, 0, 0},                             \
    {"pad-id", CLI_INT, &(a)->pad_id, NULL, INT64_MIN, INT64_MAX, 0},                     \
    CLI_SDPA_OPTIONS(&(a)->so),                                                           \
    CLI_ROPE_OPTIONS(&(a)->ro),                                                           \
    {"mask", CLI_STRING, &(a)->mask_path, NULL, 0, 0, 0},                                 \
    {"empty-rows", CLI_CHOICE, &(a)->empty_rows, fwd_empty_choices, 0, 0, 0},             \
    {"output", CLI_STRING, &(a)->output, NULL, 0, 0, 0},                                  \
    {"attention", CLI_STRING, &(a)->attention, NULL, 0, 0, 0},                            \
    {"threads", CLI_INT, &(a)->threads, NULL, 1, CLI_MAX_THREADS, 0}

/* The usage rules after cli_parse: the required options, --token-ids with
 * --pad-id, distinct output files, section 6's and RoPE's rules (rope and
 * *use_rope are set). Returns CLI_PARSED or CLI_EXIT_USAGE. */
int fwd_check(const char *prog, const cli_opt *opts, int nopts, fwd_args *a,
              attn_rope_params *rope, int *use_rope);

/* What fwd_load made; fwd_free frees it. Zero it before loading. */
typedef struct fwd_data {
    int separate;              /* separate projections (g) or fused ones (w) */
    attn_mha_weights w;        /* [3E, E], [3E], [E, E], [E] */
    attn_gqa_weights g;        /* q/k/v/o_proj, GQA shapes */
    int64_t B, T, E, H, Hkv, D;
    int single;                /* the input was [T, E]: outputs drop the batch axis */
    attn_array x;              /* the input as loaded */
    attn_tensor x3;            /* a [B, T, E] view of it */
    attn_array ids, user_mask; /* --token-ids, --mask */
    attn_tensor pad, both;     /* the padding mask [B, 1, 1, T], and it AND --mask */
    attn_sdpa_params p;        /* masks, section 6's options, empty rows; p.lse unset */
} fwd_data;

/* Loads the weights (by their name set), the input, the token ids and the mask,
 * and fills d->p. Returns 0, or CLI_EXIT_ERROR after one line. */
int fwd_load(const char *prog, attn_ctx *ctx, fwd_args *a, fwd_data *d);
void fwd_free(attn_ctx *ctx, fwd_args *a, fwd_data *d);

/* Writes out [B, T, E], and the attention weights [B, H, T, T] and log-sum-exp
 * [B, H, T] when asked for (att and lse are then allocated), as one output set;
 * a [T, E] input drops the batch axis of each. Returns 0 or CLI_EXIT_ERROR. */
int fwd_save(const char *prog, attn_ctx *ctx, const fwd_args *a, const fwd_data *d,
             const attn_tensor *out, const attn_tensor *att, const attn_tensor *lse);

#endif /* TOOLS_CMD_FORWARD_H */
