/*
 * gemm.h - the projection GEMM behind attn_linear and multi-head attention: a
 * weight packed into panels, the rows it multiplies, and the two steps of a call,
 * pack (once, or per call into scratch) and run (unchecked, allocates nothing).
 * The planner is src/kernels/gemm.c; the kernel body, and its contract,
 * src/kernels/gemm_kernel.h. Internal; names start with attn__.
 */
#ifndef ATTN_GEMM_H
#define ATTN_GEMM_H

#include "attn_internal.h"
#include "dispatch.h"
#include "threads.h"

#include <stddef.h>
#include <stdint.h>

/* A weight W [N, K] and bias b [N] packed for one instruction set:
 *   wp [ceil(N / nr)][K][nr]   panel p holds features p*nr .. p*nr+nr-1, zero past N
 *   bp [ceil(N / nr) * nr]     the bias (zeros when there is none, and past N)
 * nr is the arch's micro-tile width (4 scalar, 16 AVX2, 32 AVX-512); for the
 * reference (ATTN_ARCH_REF) it is 1, so wp is W itself, row by row. Element
 * (n, k) of W is wp[(n / nr) * K * nr + k * nr + n % nr] on every arch. */
typedef struct attn__gemm_packed {
    attn_arch arch;
    int nr;
    int64_t N, K;
    float *wp;
    float *bp;
} attn__gemm_packed;

/* M rows of a matrix whose row index is split over up to three leading axes, the
 * way attn_linear walks x [..., K] and y [..., N] (any strides): row m is
 * (i0, i1, i2) with m = (i0 * n[1] + i1) * n[2] + i2, and starts at element
 * i0 * s[0] + i1 * s[1] + i2 * s[2]; its elements are cs apart. Describing rows this
 * way, instead of by an array of row offsets, is what lets a call run without
 * scratch for them.
 *
 * An output's columns may also come in blocks (cb > 0): column n is then at
 * (n / cb) * cbs + (n % cb) * cs from its row's start. Multi-head attention writes
 * its q/k/v projection this way, one block of D columns per head, so that each
 * head lands contiguous ([B, heads, T, D]; src/attention/mha.c). cb = 0 (what a
 * brace initialiser leaves) is one block; the rows of x never have blocks. */
typedef struct attn__gemm_rows {
    int64_t n[3];
    int64_t s[3];
    int64_t cs;
    int64_t cb, cbs;
} attn__gemm_rows;

/* The element offset of column n within a row. */
static inline int64_t attn__gemm_col(const attn__gemm_rows *r, int64_t n)
{
    return r->cb > 0 ? (n / r->cb) * r->cbs + (n % r->cb) * r->cs : n * r->cs;
}

/* The element offset of row m. */
static inline int64_t attn__gemm_row(const attn__gemm_rows *r, int64_t m)
{
    const int64_t i2 = m % r->n[2], t = m / r->n[2];
    return (t / r->n[1]) * r->s[0] + (t % r->n[1]) * r->s[1] + i2 * r->s[2];
}

/* The element offsets of rows m0 .. m0 + n - 1 into off[0 .. n-1]: one division
 * for the first row, then the indices are counted up, so a block of rows costs no
 * division per row. */
static inline void attn__gemm_row_offsets(const attn__gemm_rows *r, int64_t m0, int64_t n,
                                          int64_t *off)
{
    const int64_t t = m0 / r->n[2];
    int64_t i2 = m0 % r->n[2], i1 = t % r->n[1], i0 = t / r->n[1];
    for (int64_t j = 0; j < n; j++) {
        off[j] = i0 * r->s[0] + i1 * r->s[1] + i2 * r->s[2];
        if (++i2 == r->n[2]) {
            i2 = 0;
            if (++i1 == r->n[1]) {
                i1 = 0;
                i0++;
            }
        }
    }
}

/* Fills r from a 4-D view's sizes and strides (attn__as4d): the first three axes
 * are the rows, the last one the columns. */
void attn__gemm_rows_from4d(const int64_t shape[4], const int64_t stride[4],
                            attn__gemm_rows *r);

/* The bytes a packed W [N, K] (and its bias) takes on arch, two 64-byte aligned
 * parts; 0 when that overflows size_t. */
size_t attn__gemm_pack_bytes(attn_arch arch, int64_t N, int64_t K);

/* Packs W (row stride w_rs, column stride w_cs) and bias (N floats at stride b_s,
 * or NULL) for arch into mem, which holds attn__gemm_pack_bytes(arch, N, K) bytes
 * and is 64-byte aligned, and describes the result in *pw. Runs on ctx's threads;
 * never fails and allocates nothing. */
void attn__gemm_pack(attn_ctx *ctx, attn_arch arch, const float *w, int64_t w_rs,
                     int64_t w_cs, const float *bias, int64_t b_s, int64_t N, int64_t K,
                     void *mem, attn__gemm_packed *pw);

/* y[m, n] = sum_k x[m, k] * W[n, k] + b[n] (nn.Linear's x W^T + b) for the M rows
 * that xr and yr describe (the same leading sizes), with the packed weight pw,
 * through the kernel of gemm_kernel.h for pw->arch. pw->arch is never REF here:
 * the reference loop is attn_linear's own (src/attention/linear.c). Unchecked and
 * allocation-free; the result does not depend on the thread count. */
void attn__gemm_run(attn_ctx *ctx, const attn__gemm_packed *pw, const float *x,
                    const attn__gemm_rows *xr, float *y, const attn__gemm_rows *yr);

/* The most micro-tiles of rows one work item holds: an item keeps its rows'
 * offsets on the worker's stack (src/kernels/gemm_kernel.h), two int64_t per row.
 * How many it holds, and how many panels of w, is chosen per call in gemm.c. */
#define ATTN_GEMM_MB_TILES_MAX 16

/* One call's plan, shared by the workers (see gemm_kernel.h). */
typedef struct attn__gemm_job {
    const attn__gemm_packed *pw;
    const float *x;
    const attn__gemm_rows *xr;
    float *y;
    const attn__gemm_rows *yr;
    int64_t M;
    int64_t mb; /* rows of x per work item: mr times at most ATTN_GEMM_MB_TILES_MAX */
    int64_t nb; /* panels of w per work item */
} attn__gemm_job;

/* pack_body, where a build has one, packs the leading steps of k of a full panel
 * (nr features of w, unit column stride, row stride w_rs) into dst [K][nr] with
 * register transposes, and returns how many steps it packed (a multiple of the
 * vector width); the portable loop in gemm.c packs the rest, the partial last
 * panel and strided weights. Both write the same floats, so it changes no bits. */
typedef struct attn__gemm_kernel {
    attn_arch arch;
    int mr, nr;
    void (*tile)(void *job, int64_t item, int worker);
    int64_t (*pack_body)(const float *w, int64_t w_rs, int64_t K, float *dst);
} attn__gemm_kernel;

extern const attn__gemm_kernel attn__gemm_kernel_scalar;
#ifdef ATTN_HAVE_X86
extern const attn__gemm_kernel attn__gemm_kernel_avx2;
extern const attn__gemm_kernel attn__gemm_kernel_avx512;
#endif

#endif /* ATTN_GEMM_H */
