/*
 * sdpa_fused_backward.c - the fused backward of attention: the planner (tile
 * sizes, threads, scratch) and the runner of its three passes, and the body of
 * src/kernels/fused_backward.h built as portable C (the ATTN_ARCH=scalar path).
 * The contract (what each pass computes, who owns which rows, why the bits do not
 * depend on the thread count) is at the top of fused_backward.h.
 */
#define ATTN_SIMD_SCALAR 1
#include "fused_backward.h"

#include <stdint.h>
#include <string.h>

const attn__fused_bwd_kernel attn__fused_bwd_kernel_scalar = {
    ATTN_ARCH_SCALAR, SIMD_W, FB_NV * SIMD_W, fb_delta_item, fb_kv_item, fb_q_item, fb_head_item,
};

const attn__fused_bwd_kernel *attn__fused_bwd_kernel_for(attn_arch arch)
{
    arch = attn__arch_isa(arch);
#ifdef ATTN_HAVE_X86
    if (arch == ATTN_ARCH_AVX512)
        return attn__fused_microtile() == ATTN__MICROTILE_4X4 ? &attn__fused_bwd_kernel_avx512_4x4
                                                             : &attn__fused_bwd_kernel_avx512;
    if (arch == ATTN_ARCH_AVX2)
        return &attn__fused_bwd_kernel_avx2;
#endif
    if (arch == ATTN_ARCH_SCALAR || arch == ATTN_ARCH_REF)
        return &attn__fused_bwd_kernel_scalar;
    return NULL;
}

static const attn__fused_bwd_kernel *bwd_kernel_of(attn_arch arch)
{
    const attn__fused_bwd_kernel *kern = attn__fused_bwd_kernel_for(arch);
    return kern ? kern : &attn__fused_bwd_kernel_scalar; /* never for a resolved arch */
}

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* The job's shape-dependent fields, the same for the plan and the run. */
static void job_layout(const attn__fused_bwd_kernel *kern, const attn__sdpa_bwd_shapes *bs,
                       attn__fused_bwd_job *job)
{
    const attn__sdpa_shapes *s = &bs->s;
    memset(job, 0, sizeof *job);
    job->bs = bs;
    job->br = s->Tq < ATTN__FUSED_BWD_BR ? s->Tq : ATTN__FUSED_BWD_BR;
    job->bc = s->Tk < ATTN__FUSED_BWD_BC ? s->Tk : ATTN__FUSED_BWD_BC;
    job->n_qt = (s->Tq + job->br - 1) / job->br;
    job->n_kt = (s->Tk + job->bc - 1) / job->bc;
    job->bcp = round_up(job->bc, kern->key_step);
    job->dp = round_up(s->D, kern->width);
    job->dvp = round_up(s->Dv, kern->width);
    /* The one-pass form needs (b, hk) items for the threads to share (two keep
     * two cores busy on causal shapes, whose heads all cost the same), a dQ
     * accumulator of group * Tq rows per worker that stays small (at most 4 Mi
     * floats), and no dbias (a broadcast dbias would be written by several
     * items). The choice depends on the shapes alone; both forms sum every
     * element in the same order anyway. */
    const int64_t dq_rows = s->group * s->Tq;
    job->one_pass = !bs->dbias && s->B * s->Hkv >= 2 && dq_rows <= (INT64_C(4) << 20) / job->dp;
    job->ws_floats = fb_ws_floats_of(s->D, s->Dv, job->br, job->bc, job->bcp, job->dp, job->dvp,
                                     job->one_pass ? dq_rows : 0);
}

/* 1 when dbias is wanted and broadcast along b, h or the query axis: then items of
 * pass 2 would add into the same element, so pass 2 runs on one thread. */
static int dbias_shared(const attn__sdpa_bwd_shapes *bs)
{
    const attn__sdpa_shapes *s = &bs->s;
    return bs->dbias && ((s->B > 1 && bs->dbias_s[0] == 0) || (s->H > 1 && bs->dbias_s[1] == 0) ||
                         (s->Tq > 1 && bs->dbias_s[2] == 0));
}

int attn__sdpa_fused_backward_plan(attn_ctx *ctx, attn__sdpa_bwd_plan *plan)
{
    const attn__sdpa_bwd_shapes *bs = &plan->bs;
    const attn__sdpa_shapes *s = &bs->s;
    const attn__fused_bwd_kernel *kern = bwd_kernel_of(plan->arch);
    attn__fused_bwd_job job;
    job_layout(kern, bs, &job);

    /* Seven products of Q K^T's size per visible pair in two passes (S and dP
     * twice, dV, dK, dQ), five in one; the count need only be good enough to
     * choose the thread count. */
    double pairs = 0.0;
    for (int64_t i = 0; i < s->Tq; i++) {
        int64_t lo, hi;
        fb_row_range(s, i, &lo, &hi);
        pairs += (double)(hi - lo);
    }
    const double flops = 2.0 * (double)s->B * (double)s->H * pairs *
                         (job.one_pass ? 3.0 * (double)s->D + 2.0 * (double)s->Dv
                                       : 3.0 * (double)s->D + 4.0 * (double)s->Dv);
    int64_t items = s->B * s->Hkv * job.n_kt;
    if (s->B * s->H * job.n_qt > items)
        items = s->B * s->H * job.n_qt;
    if (job.one_pass)
        items = s->B * s->Hkv;
    plan->threads = attn__threads_for(ctx, flops, items);
    plan->ws_floats = job.ws_floats;

    /* Scratch: per-worker empty-row records (16 floats each), Delta [B H Tq], the
     * rows' flags [B H Tq] bytes (rounded up to floats), then per-worker scratch. */
    int64_t rows, total;
    size_t bytes;
    if (!attn__mul_i64(s->B * s->H, s->Tq, &rows) ||
        !attn__mul_i64(plan->ws_floats, plan->threads, &total) ||
        total > INT64_MAX / 2 - 16 * (int64_t)plan->threads - 3 * rows ||
        !attn__bytes(total + 16 * (int64_t)plan->threads + fb_a16(rows) +
                         fb_a16((rows + 3) / 4),
                     sizeof(float), &bytes))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "fused backward scratch of %lld floats x %d threads overflows",
                          (long long)plan->ws_floats, plan->threads);
    plan->scratch_bytes = bytes;
    return ATTN_OK;
}

int attn__sdpa_fused_backward_run(attn_ctx *ctx, const attn__sdpa_bwd_plan *plan,
                                  const float *q, const float *k, const float *v,
                                  const float *out, const float *lse, const float *dout,
                                  float *dq, float *dk, float *dv, void *scratch)
{
    const attn__sdpa_bwd_shapes *bs = &plan->bs;
    const attn__sdpa_shapes *s = &bs->s;
    const attn__fused_bwd_kernel *kern = bwd_kernel_of(plan->arch);
    attn__fused_bwd_job job;
    job_layout(kern, bs, &job);
    job.q = q;
    job.k = k;
    job.v = v;
    job.o = out;
    job.lse = lse;
    job.dout = dout;
    job.dq = dq;
    job.dk = dk;
    job.dv = dv;
    const int threads = plan->threads;
    const int64_t rows = s->B * s->H * s->Tq;
    job.empty_first = (int64_t *)scratch;
    job.delta = (float *)scratch + 16 * (int64_t)threads;
    job.sees = (unsigned char *)(job.delta + fb_a16(rows));
    job.ws = job.delta + fb_a16(rows) + fb_a16((rows + 3) / 4);
    for (int t = 0; t < threads; t++)
        job.empty_first[t] = INT64_MAX;

    /* Pass 0, then the empty-row error before anything is written. */
    attn__parallel_for(threads, s->B * s->H, kern->delta_item, &job);
    int64_t empty = INT64_MAX;
    for (int t = 0; t < threads; t++)
        if (job.empty_first[t] < empty)
            empty = job.empty_first[t];
    if (empty != INT64_MAX && s->empty_rows == ATTN_EMPTY_ROWS_ERROR && !s->sinks) {
        const int64_t bh = empty / s->Tq;
        return attn__empty_row_fail(ctx, s, bh / s->H, bh % s->H, empty % s->Tq);
    }

    /* dbias starts at zero (through its broadcast view) and gathers dS in pass 2. */
    if (bs->dbias)
        for (int64_t b = 0; b < s->B; b++)
            for (int64_t h = 0; h < s->H; h++)
                for (int64_t i = 0; i < s->Tq; i++)
                    for (int64_t j = 0; j < s->Tk; j++)
                        bs->dbias[attn__off4(bs->dbias_s, b, h, i, j)] = 0.0f;

    if (job.one_pass) {
        attn__parallel_for(threads, s->B * s->Hkv, kern->head_item, &job);
    } else {
        attn__parallel_for(threads, s->B * s->Hkv * job.n_kt, kern->kv_item, &job);
        attn__parallel_for(dbias_shared(bs) ? 1 : threads, s->B * s->H * job.n_qt,
                           kern->q_item, &job);
    }
    /* dsinks_h = -sum_b sum_i exp(sink_h - L_i) Delta_i over the rows that see a
     * key, in the reference's order: a sum over i per (b, h), added over b. Taken
     * last: the one-pass form's items compute their rows' Delta themselves. */
    if (bs->dsinks) {
        for (int64_t h = 0; h < s->H; h++)
            bs->dsinks[h * bs->dsinks_s] = 0.0f;
        for (int64_t b = 0; b < s->B; b++)
            for (int64_t h = 0; h < s->H; h++) {
                const float sink = attn__sink(s, h);
                float acc = 0.0f;
                for (int64_t i = 0; i < s->Tq; i++) {
                    const int64_t row = (b * s->H + h) * s->Tq + i;
                    if (job.sees[row])
                        acc -= expf(sink - lse[b * bs->lse_s[0] + h * bs->lse_s[1] +
                                               i * bs->lse_s[2]]) *
                               job.delta[row];
                }
                bs->dsinks[h * bs->dsinks_s] += acc;
            }
    }
    return ATTN_OK;
}
