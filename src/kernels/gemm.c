/*
 * gemm.c - the projection GEMM behind attn_linear: packing a weight into panels,
 * planning a call (work items, threads), and the kernel body of
 * src/kernels/gemm_kernel.h built as portable C. The AVX2 and AVX-512 builds are
 * src/kernels/gemm_avx2.c and src/kernels/gemm_avx512.c; the contract (what is packed,
 * who handles tails) is written in src/kernels/gemm_kernel.h.
 *
 * Packing is separate from running so that a weight can be packed once and used by
 * many calls (attn_linear_pack, attn_mha_pack) or packed per call into the caller's
 * scratch (attn_linear, attn_mha_forward); neither step allocates.
 */
#define ATTN_SIMD_SCALAR 1
#define GK_MR 4
#define GK_NRV 4
#include "gemm_kernel.h"

const attn__gemm_kernel attn__gemm_kernel_scalar = {
    ATTN_ARCH_SCALAR, GK_MR, GK_NR, gk_tile_item, GK_PACK_BODY,
};

static const attn__gemm_kernel *gemm_kernel_for(attn_arch arch)
{
    arch = attn__arch_isa(arch);
#ifdef ATTN_HAVE_X86
    if (arch == ATTN_ARCH_AVX512)
        return &attn__gemm_kernel_avx512;
    if (arch == ATTN_ARCH_AVX2)
        return &attn__gemm_kernel_avx2;
#endif
    (void)arch;
    return &attn__gemm_kernel_scalar;
}

/* The panel width of arch: the kernel's micro-tile width, or 1 for the reference,
 * which reads W row by row. */
static int gemm_nr(attn_arch arch)
{
    return arch == ATTN_ARCH_REF ? 1 : gemm_kernel_for(arch)->nr;
}

void attn__gemm_rows_from4d(const int64_t shape[4], const int64_t stride[4],
                            attn__gemm_rows *r)
{
    for (int i = 0; i < 3; i++) {
        r->n[i] = shape[i];
        r->s[i] = stride[i];
    }
    r->cs = stride[3];
    r->cb = 0;
    r->cbs = 0;
}

size_t attn__gemm_pack_bytes(attn_arch arch, int64_t N, int64_t K)
{
    const int64_t nr = gemm_nr(arch);
    const int64_t cols = (N / nr + (N % nr != 0)) * nr; /* N rounded up, no overflow */
    int64_t wp_floats;
    size_t wp_bytes, bp_bytes;
    if (cols < N || !attn__mul_i64(cols, K, &wp_floats) ||
        !attn__bytes(wp_floats, sizeof(float), &wp_bytes) ||
        !attn__bytes(cols, sizeof(float), &bp_bytes))
        return 0;
    wp_bytes = attn__align64(wp_bytes);
    bp_bytes = attn__align64(bp_bytes);
    if (!wp_bytes || !bp_bytes || wp_bytes > SIZE_MAX - bp_bytes)
        return 0;
    return wp_bytes + bp_bytes;
}

/* What the packing workers share: the source and the destination. */
typedef struct pack_job {
    const float *w;
    int64_t w_rs, w_cs;
    const float *bias;
    int64_t b_s;
    attn__gemm_packed *pw;
    int64_t (*body)(const float *w, int64_t w_rs, int64_t K, float *dst); /* or NULL */
} pack_job;

/* Packs panel `item` of w (nr output features) and of the bias, zero past N.
 * The copy walks k in blocks of PACK_KB: each feature's row contributes a short
 * contiguous run to the block, whose destination (PACK_KB x nr floats, 12 KiB with
 * AVX-512's 48 columns) stays in L1 until every feature has written its column.
 * Walking all of k for one feature before the next instead touches the whole
 * K x nr panel (96 KiB at K = 768 and 32 columns) once per feature, from L2: that
 * made packing a seventh of the projections' time in a multi-head forward. */
#define PACK_KB 64
static void pack_item(void *arg, int64_t item, int worker)
{
    (void)worker;
    const pack_job *job = (const pack_job *)arg;
    const attn__gemm_packed *pw = job->pw;
    const int64_t K = pw->K, nr = pw->nr;
    float *dst = pw->wp + item * K * nr;
    float *bdst = pw->bp + item * nr;
    for (int64_t c = 0; c < nr; c++) {
        const int64_t n = item * nr + c;
        bdst[c] = n < pw->N && job->bias ? job->bias[n * job->b_s] : 0.0f;
    }
    /* The build's register transposes pack what they can of a full panel; the
     * loop below does the rest. */
    int64_t kdone = 0;
    if (job->body && job->w_cs == 1 && (item + 1) * nr <= pw->N)
        kdone = job->body(job->w + item * nr * job->w_rs, job->w_rs, K, dst);
    for (int64_t k0 = kdone; k0 < K; k0 += PACK_KB) {
        const int64_t k1 = K - k0 < PACK_KB ? K : k0 + PACK_KB;
        for (int64_t c = 0; c < nr; c++) {
            const int64_t n = item * nr + c;
            if (n >= pw->N) {
                for (int64_t k = k0; k < k1; k++)
                    dst[k * nr + c] = 0.0f;
                continue;
            }
            const float *src = job->w + n * job->w_rs;
            if (job->w_cs == 1)
                for (int64_t k = k0; k < k1; k++)
                    dst[k * nr + c] = src[k];
            else
                for (int64_t k = k0; k < k1; k++)
                    dst[k * nr + c] = src[k * job->w_cs];
        }
    }
}

void attn__gemm_pack(attn_ctx *ctx, attn_arch arch, const float *w, int64_t w_rs,
                     int64_t w_cs, const float *bias, int64_t b_s, int64_t N, int64_t K,
                     void *mem, attn__gemm_packed *pw)
{
    const int nr = gemm_nr(arch);
    const int64_t n_panels = N / nr + (N % nr != 0);
    pw->arch = arch;
    pw->nr = nr;
    pw->N = N;
    pw->K = K;
    pw->wp = (float *)mem;
    /* The size was checked by attn__gemm_pack_bytes, so this cannot overflow. */
    pw->bp = (float *)((char *)mem + attn__align64((size_t)(n_panels * nr * K) * sizeof(float)));
    pack_job job = {w, w_rs, w_cs, bias, b_s, pw,
                    arch == ATTN_ARCH_REF ? NULL : gemm_kernel_for(arch)->pack_body};
    /* Packing moves N*K floats; count it as a few operations each. */
    attn__parallel_for(attn__threads_for(ctx, 4.0 * (double)N * (double)K, n_panels), n_panels,
                       pack_item, &job);
}

/* A work item's rows (job->mb) and panels (job->nb). The item's panels of w
 * stay in L2 while its rows stream past them, so the split follows the L2 size.
 * Each output element is one sum over k in one micro-tile whatever the item, so
 * the size changes the speed and never a bit.
 *
 * With AVX-512 and a 2 MiB L2 (the Sapphire Rapids class), 16 micro-tiles of 8
 * rows against 2 panels of 48 features: 128 x 96 per item, which was 2-5% faster
 * than 64 x 192 on the 2048^3 GEMM and on both multi-head projections (1 thread,
 * thread CPU time, docs/performance.md). Elsewhere (Zen 4 and Zen 5 have 1 MiB,
 * AVX2 cores and the portable build) the 8 x 4 the kernel was first tuned with on
 * Zen 5. Only the L2 size decides; the class and L1 size come along unused. */
static void gemm_item_size(const attn__gemm_kernel *kern, int64_t *mb, int64_t *nb)
{
    const char *uarch;
    int64_t l1d_kib, l2_kib;
    attn__cpu_caches(&uarch, &l1d_kib, &l2_kib);
    int64_t tiles = 8, panels = 4;
    if (kern->arch == ATTN_ARCH_AVX512 && l2_kib >= 2048) {
        tiles = 16;
        panels = 2;
    }
    *mb = (int64_t)kern->mr * tiles;
    *nb = panels;
}

void attn__gemm_run(attn_ctx *ctx, const attn__gemm_packed *pw, const float *x,
                    const attn__gemm_rows *xr, float *y, const attn__gemm_rows *yr)
{
    const attn__gemm_kernel *kern = gemm_kernel_for(pw->arch);
    const int64_t n_panels = (pw->N + kern->nr - 1) / kern->nr;
    attn__gemm_job job;
    job.pw = pw;
    job.x = x;
    job.xr = xr;
    job.y = y;
    job.yr = yr;
    job.M = xr->n[0] * xr->n[1] * xr->n[2]; /* checked: x's element count fits */
    gemm_item_size(kern, &job.mb, &job.nb);
    const int64_t items = ((job.M + job.mb - 1) / job.mb) * ((n_panels + job.nb - 1) / job.nb);
    const double flops = 2.0 * (double)job.M * (double)pw->N * (double)pw->K;
    attn__parallel_for(attn__threads_for(ctx, flops, items), items, kern->tile, &job);
}
