/*
 * sdpa_fused.c - the fused attention path: the planner that picks tile sizes,
 * scratch and threads for one attn_sdpa call, and the kernel body of
 * src/kernels/fused_kernel.h built as portable C (the ATTN_ARCH=scalar path, and the only
 * fast path on a machine that is not x86-64).
 *
 * The contract of the kernel (tile sizes, the online-softmax state, who handles
 * tails and masks) is written at the top of src/kernels/fused_kernel.h. Arguments are
 * checked by attn__sdpa_prepare(), the same function the reference uses, so both
 * paths accept and refuse exactly the same calls with the same messages.
 */
#define ATTN_SIMD_SCALAR 1
#define FK_MR 4
#define FK_NV 4
#define FK_MK 4
#define FK_NQV 4
#include "fused_kernel.h"

#include <stdint.h>

const attn__fused_kernel attn__fused_kernel_scalar = {
    ATTN_ARCH_SCALAR, SIMD_W, FK_QW, FK_MK, fk_ws_floats, fk_item, fk_exp_nonpos,
};

/* Query rows and keys per tile; see the contract in src/kernels/fused_kernel.h. */
#define ATTN_FUSED_BR 64
#define ATTN_FUSED_BC 64
/* Scratch up to this many floats lives on the stack (4 KiB). */
#define ATTN_FUSED_STACK_FLOATS 1024

const attn__fused_kernel *attn__fused_kernel_for(attn_arch arch)
{
#ifdef ATTN_HAVE_X86
    if (arch == ATTN_ARCH_AVX512)
        return &attn__fused_kernel_avx512;
    if (arch == ATTN_ARCH_AVX2)
        return &attn__fused_kernel_avx2;
#endif
    if (arch == ATTN_ARCH_SCALAR || arch == ATTN_ARCH_REF)
        return &attn__fused_kernel_scalar;
    return NULL;
}

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

int attn__sdpa_fused_arch(attn_ctx *ctx, attn_arch arch, const attn_tensor *q,
                          const attn_tensor *k, const attn_tensor *v,
                          const attn_sdpa_params *p, attn_tensor *out,
                          attn_tensor *weights)
{
    attn__sdpa_shapes s;
    int status = attn__sdpa_prepare(ctx, q, k, v, p, out, weights, &s);
    if (status != ATTN_OK)
        return status;
    const attn__fused_kernel *kern = attn__fused_kernel_for(arch);
    if (!kern) /* never for an arch attn__arch_resolve() gave */
        kern = &attn__fused_kernel_scalar;

    attn__fused_job job;
    memset(&job, 0, sizeof job);
    job.s = &s;
    job.q = (const float *)q->data;
    job.k = (const float *)k->data;
    job.v = (const float *)v->data;
    job.out = (float *)out->data;
    job.weights = weights ? (float *)weights->data : NULL;
    job.dvp = round_up(s.Dv, kern->width);

    /* A handful of query rows (a decoding step, the chapter's toy size): one item
     * per (b, h), its rows in turn, K and V streamed in place. */
    job.row_path = s.Tq <= ATTN__FUSED_ROW_MAX && s.k_s[3] == 1 && s.v_s[3] == 1;
    int64_t n_items;
    if (job.row_path) {
        n_items = s.B * s.H;
    } else {
        job.br = s.Tq < ATTN_FUSED_BR ? round_up(s.Tq, kern->mr) : ATTN_FUSED_BR;
        job.bc = s.Tk < ATTN_FUSED_BC ? round_up(s.Tk, kern->nk) : ATTN_FUSED_BC;
        job.n_qt = (s.Tq + job.br - 1) / job.br;
        n_items = s.B * s.H * job.n_qt;
    }

    double flops = 4.0 * (double)s.B * (double)s.H * (double)s.Tq * (double)s.Tk *
                   (double)(s.D + s.Dv) / 2.0;
    if (s.causal)
        flops /= 2.0;
    const int threads = attn__threads_for(ctx, flops, n_items);

    job.ws_floats = kern->ws_floats(&job);
    /* One allocation: per-thread empty-row records, then per-thread scratch. A
     * problem as small as the chapter's uses the stack instead, so that it pays for
     * no allocation at all. */
    int64_t total;
    size_t bytes;
    if (!attn__mul_i64(job.ws_floats, threads, &total) ||
        !attn__bytes(total + 2 * (int64_t)threads, sizeof(float), &bytes))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "fused attention scratch of %lld floats x %d threads overflows",
                          (long long)job.ws_floats, threads);
    int64_t small[ATTN_FUSED_STACK_FLOATS / 2];
    void *block = small;
    if (bytes > sizeof small) {
        block = attn__alloc(ctx, bytes, "fused attention scratch");
        if (!block)
            return ATTN_STATUS_NO_MEMORY;
    }
    job.empty_first = (int64_t *)block;
    job.ws = (float *)(job.empty_first + threads);
    for (int t = 0; t < threads; t++)
        job.empty_first[t] = INT64_MAX;

    attn__parallel_for(threads, n_items, kern->item, &job);

    int64_t empty = INT64_MAX;
    for (int t = 0; t < threads; t++)
        if (job.empty_first[t] < empty)
            empty = job.empty_first[t];
    if (block != small)
        attn__free(ctx, block);

    if (empty != INT64_MAX && s.empty_rows == ATTN_EMPTY_ROWS_ERROR) {
        const int64_t bh = empty / s.Tq;
        return attn__empty_row_fail(ctx, &s, bh / s.H, bh % s.H, empty % s.Tq);
    }
    return ATTN_OK;
}

int attn_sdpa_fused(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                    const attn_tensor *v, const attn_sdpa_params *p, attn_tensor *out,
                    attn_tensor *weights)
{
    attn_arch arch;
    int status = attn__arch_resolve(ctx, &arch);
    if (status != ATTN_OK)
        return status;
    if (arch == ATTN_ARCH_REF)
        arch = ATTN_ARCH_SCALAR; /* the fused kernel asked for by name: portable C */
    return attn__sdpa_fused_arch(ctx, arch, q, k, v, p, out, weights);
}
