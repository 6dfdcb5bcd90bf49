/*
 * fused.h - internal declarations shared by the fast paths: dispatch, the thread
 * pool, the fused attention kernel and the GEMM. Not installed; names start with
 * attn__ and may change at any time.
 */
#ifndef ATTN_FUSED_H
#define ATTN_FUSED_H

#include "attn_internal.h"

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------------------
 * Dispatch (src/dispatch.c)
 * ---------------------------------------------------------------------------- */

/* The arch a call with ctx runs (never AUTO): ctx->arch when set, else the
 * process-wide choice (ATTN_ARCH or cpuid/xgetbv, decided once). Fails with
 * UNSUPPORTED when ctx->arch names a path this build or CPU cannot run. */
int attn__arch_resolve(attn_ctx *ctx, attn_arch *arch);

/* ------------------------------------------------------------------------------
 * Threads (src/threads.c)
 * ---------------------------------------------------------------------------- */

/* Runs fn(arg, item, worker) for every item in [0, n_items) on up to `threads`
 * threads (the caller is worker 0; workers are numbered 0 .. threads-1, so a
 * worker may index per-thread scratch). Items are handed out in increasing order
 * from a shared counter, so which thread runs an item varies from run to run: fn
 * must write results that depend on the item only. Returns when every item is
 * done. Never fails: without threads it runs the items on the caller. */
typedef void (*attn__task_fn)(void *arg, int64_t item, int worker);
void attn__parallel_for(int threads, int64_t n_items, attn__task_fn fn, void *arg);

/* How many threads a problem of `flops` floating-point operations split into
 * `n_items` pieces should use under ctx: ctx->threads (0 = online cores), no more
 * than the items, and 1 below about 1 MFLOP per thread, where waking a thread
 * costs more than it saves. */
int attn__threads_for(const attn_ctx *ctx, double flops, int64_t n_items);

/* ------------------------------------------------------------------------------
 * The fused attention kernel (src/sdpa_fused*.c, body in src/fused_kernel.h)
 * ---------------------------------------------------------------------------- */

/* Up to this many query rows, the fused kernel takes its row path (see
 * src/fused_kernel.h): a decoding step, the chapter's toy size. */
#define ATTN__FUSED_ROW_MAX 8

/* One call's plan and data, filled by src/sdpa_fused.c and read by every worker. */
typedef struct attn__fused_job {
    const attn__sdpa_shapes *s;
    const float *q, *k, *v; /* q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv] */
    float *out;             /* [B, H, Tq, Dv] */
    float *weights;         /* [B, H, Tq, Tk] or NULL */
    int64_t br;             /* query rows per tile (a multiple of the kernel's mr) */
    int64_t bc;             /* keys per tile (a multiple of the kernel's nk) */
    int64_t n_qt;           /* query tiles per (b, h) */
    int64_t dvp;            /* Dv rounded up to the vector width */
    int row_path;           /* 1: one (b, h) per item, row by row, K and V in place */
    int64_t ws_floats;      /* floats of scratch per worker */
    float *ws;              /* workers * ws_floats */
    int64_t *empty_first;   /* per worker: smallest flat row index b*H*Tq + h*Tq + i
                               of a row with every key masked, or INT64_MAX */
} attn__fused_job;

/* What one instruction set's build of the kernel body provides. */
typedef struct attn__fused_kernel {
    attn_arch arch;
    int width; /* floats per vector */
    int mr;    /* query rows per micro-tile (tiles hold a multiple of it) */
    int nk;    /* keys per micro-tile of the score product */
    /* Scratch floats one worker needs for a job planned with these sizes. */
    int64_t (*ws_floats)(const attn__fused_job *job);
    /* Processes one work item: (b, h, query tile), or (b, h) on the row path. */
    void (*item)(void *job, int64_t item, int worker);
    /* y[i] = e^x[i] for x[i] <= 0 with this build's vector exp (for the tests). */
    void (*exp_nonpos)(const float *x, float *y, int64_t n);
} attn__fused_kernel;

extern const attn__fused_kernel attn__fused_kernel_scalar;
#ifdef ATTN_HAVE_X86
extern const attn__fused_kernel attn__fused_kernel_avx2;
extern const attn__fused_kernel attn__fused_kernel_avx512;
#endif

/* The build of the kernel for arch (REF gives the portable one), or NULL when
 * this library was built without it (AVX2/AVX-512 off x86-64). */
const attn__fused_kernel *attn__fused_kernel_for(attn_arch arch);

/* The fused kernel for an already resolved arch (SCALAR, AVX2 or AVX512). */
int attn__sdpa_fused_arch(attn_ctx *ctx, attn_arch arch, const attn_tensor *q,
                          const attn_tensor *k, const attn_tensor *v,
                          const attn_sdpa_params *p, attn_tensor *out,
                          attn_tensor *weights);

/* ------------------------------------------------------------------------------
 * GEMM (src/gemm*.c)
 * ---------------------------------------------------------------------------- */

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

#endif /* ATTN_FUSED_H */
