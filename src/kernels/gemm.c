/*
 * gemm.c - the projection GEMM behind attn_linear: the planner (packing, work
 * items, threads) and the kernel body of src/kernels/gemm_kernel.h built as portable C.
 * The AVX2 and AVX-512 builds are src/kernels/gemm_avx2.c and src/kernels/gemm_avx512.c; the
 * contract (what is packed, who handles tails) is written in src/kernels/gemm_kernel.h.
 */
#define ATTN_SIMD_SCALAR 1
#define GK_MR 4
#define GK_NRV 4
#include "gemm_kernel.h"

const attn__gemm_kernel attn__gemm_kernel_scalar = {
    ATTN_ARCH_SCALAR, GK_MR, GK_NR, gk_pack_item, gk_tile_item,
};

/* Micro-tiles of rows per work item, and panels of w per work item: a block of
 * 8 micro-tiles of x (under 100 rows) against 4 panels (64 or 128 features). */
#define ATTN_GEMM_MB_TILES 8
#define ATTN_GEMM_NB_PANELS 4

static const attn__gemm_kernel *gemm_kernel_for(attn_arch arch)
{
#ifdef ATTN_HAVE_X86
    if (arch == ATTN_ARCH_AVX512)
        return &attn__gemm_kernel_avx512;
    if (arch == ATTN_ARCH_AVX2)
        return &attn__gemm_kernel_avx2;
#endif
    (void)arch;
    return &attn__gemm_kernel_scalar;
}

int attn__gemm(attn_ctx *ctx, attn_arch arch, const attn__gemm_args *g)
{
    const attn__gemm_kernel *kern = gemm_kernel_for(arch);
    const int64_t n_panels = (g->N + kern->nr - 1) / kern->nr;
    int64_t wp_floats;
    size_t wp_bytes, bp_bytes;
    if (!attn__mul_i64(n_panels * kern->nr, g->K, &wp_floats) ||
        !attn__bytes(wp_floats, sizeof(float), &wp_bytes) ||
        !attn__bytes(n_panels * kern->nr, sizeof(float), &bp_bytes))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "linear: a packed weight of %lld x %lld floats overflows",
                          (long long)g->N, (long long)g->K);
    attn__gemm_job job;
    job.g = g;
    job.wp = (float *)attn__alloc(ctx, wp_bytes, "the packed linear weight");
    job.bp = (float *)attn__alloc(ctx, bp_bytes, "the packed linear bias");
    if (!job.wp || !job.bp) {
        if (job.wp)
            attn__free(ctx, job.wp);
        if (job.bp)
            attn__free(ctx, job.bp);
        return ATTN_STATUS_NO_MEMORY;
    }
    job.mb = (int64_t)kern->mr * ATTN_GEMM_MB_TILES;
    job.nb = ATTN_GEMM_NB_PANELS;

    /* Packing moves N*K floats; count it as a few operations each. */
    attn__parallel_for(attn__threads_for(ctx, 4.0 * (double)wp_floats, n_panels), n_panels,
                       kern->pack, &job);
    const int64_t items = ((g->M + job.mb - 1) / job.mb) * ((n_panels + job.nb - 1) / job.nb);
    const double flops = 2.0 * (double)g->M * (double)g->N * (double)g->K;
    attn__parallel_for(attn__threads_for(ctx, flops, items), items, kern->tile, &job);

    attn__free(ctx, job.wp);
    attn__free(ctx, job.bp);
    return ATTN_OK;
}
