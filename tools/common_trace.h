/*
 * common_trace.h - prints the chapter's multi-head self-attention step by step
 * (SPEC section 1's table) with each step's formula and its concrete shape, the
 * masks and how they broadcast, and which kernel ran. Used by
 * inspect_self_attention --trace.
 */
#ifndef TOOLS_COMMON_TRACE_H
#define TOOLS_COMMON_TRACE_H

#include <stdint.h>
#include <stdio.h>

typedef struct trace_info {
    int64_t B, T, E, H;      /* batch, sequence length, embed_dim, heads */
    uint64_t seed;           /* where x and the weights came from */
    int64_t pad_id;          /* the pad token of the padding mask */
    const char *attention_kernel; /* e.g. "fused online-softmax kernel (src/kernels/sdpa_fused.c), avx512" */
    const char *kernel_reason;    /* why that path, e.g. "auto: best path for this CPU" */
    int scores_built;        /* 0 when the kernel that ran never built the scores array */
    const char *scores_note; /* a sentence printed under the kernel, or NULL */
    const char *projections; /* how attn_linear ran, or NULL for the file alone */
    int separate_layout;     /* the weights were drawn as three nn.Linear(E, E) */
    int threads;             /* most threads a call may use */
} trace_info;

/* Prints the trace. Every step line has the form
 *   " N  <what>  <name> [shape]  <formula>"
 * so `x [2, 5, 16]`, `qkv [2, 5, 48]`, ..., `output [2, 5, 16]` can be read off
 * in order. Returns 0, or -1 if writing failed. */
int trace_print(FILE *f, const trace_info *t);

#endif /* TOOLS_COMMON_TRACE_H */
