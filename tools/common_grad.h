/*
 * common_grad.h - the chapter's experiment one step further: the gradient of a
 * simple loss, the mean of the output, with respect to every step's tensor and
 * every weight of the module, each printed with its shape. Used by
 * inspect_self_attention --grad.
 */
#ifndef TOOLS_COMMON_GRAD_H
#define TOOLS_COMMON_GRAD_H

#include "attn.h"

#include <stdint.h>
#include <stdio.h>

/* Runs the module on x [B, T, E] with weights w, H heads and mask (bool, broadcast
 * to [B, H, T, T]), then its backward for loss = mean(output), and prints to f one
 * line per tensor:
 *   grad NAME [shape] norm=N first=[g0, g1, g2, g3]
 * (N the Euclidean norm, g the first four elements in C order, %.6e), after a line
 * giving the loss. Returns ATTN_OK or the library's status (ctx->message says why). */
int grad_report(attn_ctx *ctx, FILE *f, const attn_tensor *x, const attn_mha_weights *w,
                int64_t H, const attn_tensor *mask);

#endif /* TOOLS_COMMON_GRAD_H */
