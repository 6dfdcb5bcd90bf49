/*
 * gemm.h - the projection GEMM behind attn_linear: its arguments, one call's plan
 * and what each instruction set's build provides. The planner is src/kernels/gemm.c;
 * the kernel body, and its contract, src/kernels/gemm_kernel.h. Internal; names
 * start with attn__.
 */
#ifndef ATTN_GEMM_H
#define ATTN_GEMM_H

#include "attn_internal.h"
#include "dispatch.h"
#include "threads.h"

#include <stddef.h>
#include <stdint.h>

/* y[m, n] = sum_k x[m, k] * w[n, k] + (bias ? bias[n] : 0)  (nn.Linear's x W^T + b)
 *   x: M rows, row m at x + x_row[m], element k at stride x_cs
 *   w: [N, K] with row stride w_rs and column stride w_cs
 *   y: M rows, row m at y + y_row[m], element n at stride y_cs
 *   bias: N floats at stride b_s, or NULL
 * Row offsets come as arrays so that any strided view of [..., K] works. The
 * result does not depend on the thread count. Fails only on allocation. */
typedef struct attn__gemm_args {
    int64_t M, N, K;
    const float *x; const int64_t *x_row; int64_t x_cs;
    const float *w; int64_t w_rs, w_cs;
    const float *bias; int64_t b_s;
    float *y; const int64_t *y_row; int64_t y_cs;
} attn__gemm_args;

int attn__gemm(attn_ctx *ctx, attn_arch arch, const attn__gemm_args *g);

/* One call's plan, shared by the workers (see src/gemm_kernel.h). */
typedef struct attn__gemm_job {
    const attn__gemm_args *g;
    float *wp;     /* packed w: [ceil(N / nr)][K][nr] */
    float *bp;     /* packed bias: [ceil(N / nr) * nr] */
    int64_t mb;    /* rows of x per work item (a multiple of mr) */
    int64_t nb;    /* panels of w per work item */
} attn__gemm_job;

typedef struct attn__gemm_kernel {
    attn_arch arch;
    int mr, nr;
    void (*pack)(void *job, int64_t panel, int worker);
    void (*tile)(void *job, int64_t item, int worker);
} attn__gemm_kernel;

extern const attn__gemm_kernel attn__gemm_kernel_scalar;
#ifdef ATTN_HAVE_X86
extern const attn__gemm_kernel attn__gemm_kernel_avx2;
extern const attn__gemm_kernel attn__gemm_kernel_avx512;
#endif

#endif /* ATTN_GEMM_H */
