/*
 * half_stage.c - 16-bit attention calls on the float32 kernels: the staged
 * shapes, the row converters run over the thread pool, and the reference's 16-bit
 * run. The plan is in src/kernels/half_stage.h.
 */
#include "half_stage.h"
#include "threads.h"

/* Rows per block of the parallel converters: large enough that a block is worth
 * a thread's wake-up, small enough that the rows spread over the workers. */
#define HALF_ROWS_PER_ITEM 64

void attn__half_staged_shapes(const attn__sdpa_shapes *s, int per_head, int qo_per_head,
                              attn__sdpa_shapes *st)
{
    *st = *s;
    st->dtype = ATTN_DTYPE_F32;
    const int64_t qs[4] = {qo_per_head ? 0 : s->H * s->Tq * s->D, qo_per_head ? 0 : s->Tq * s->D,
                           s->D, 1};
    const int64_t os[4] = {qo_per_head ? 0 : s->H * s->Tq * s->Dv, qo_per_head ? 0 : s->Tq * s->Dv,
                           s->Dv, 1};
    const int64_t ks[4] = {per_head ? 0 : s->Hkv * s->Tk * s->D, per_head ? 0 : s->Tk * s->D,
                           s->D, 1};
    const int64_t vs[4] = {per_head ? 0 : s->Hkv * s->Tk * s->Dv, per_head ? 0 : s->Tk * s->Dv,
                           s->Dv, 1};
    memcpy(st->q_s, qs, sizeof qs);
    memcpy(st->o_s, os, sizeof os);
    memcpy(st->k_s, ks, sizeof ks);
    memcpy(st->v_s, vs, sizeof vs);
}

void attn__half_rows_block(const attn__half_rows *r, int64_t r0, int64_t r1)
{
    const int64_t n3 = r->n[3];
    for (int64_t row = r0; row < r1; row++) {
        const int64_t i2 = row % r->n[2], i1 = row / r->n[2] % r->n[1], i0 = row / (r->n[2] * r->n[1]);
        const int64_t at = i0 * r->hs[0] + i1 * r->hs[1] + i2 * r->hs[2];
        float *f = r->f32 + row * n3;
        if (r->dt == ATTN_DTYPE_F32) {
            float *x = (float *)r->half + at;
            for (int64_t e = 0; e < n3; e++) {
                if (r->narrow)
                    x[e * r->hs[3]] = f[e];
                else
                    f[e] = x[e * r->hs[3]];
            }
            continue;
        }
        uint16_t *h = (uint16_t *)r->half + at;
        if (r->hs[3] == 1) {
            if (r->narrow)
                attn__half_narrow(r->hk, r->dt, f, h, n3);
            else
                attn__half_widen(r->hk, r->dt, h, f, n3);
        } else if (r->narrow) {
            for (int64_t e = 0; e < n3; e++)
                h[e * r->hs[3]] = r->dt == ATTN_DTYPE_BF16 ? attn__f32_to_bf16(f[e])
                                                           : attn__f32_to_f16(f[e]);
        } else {
            for (int64_t e = 0; e < n3; e++)
                f[e] = r->dt == ATTN_DTYPE_BF16 ? attn__bf16_to_f32(h[e * r->hs[3]])
                                                : attn__f16_to_f32(h[e * r->hs[3]]);
        }
    }
}

static void half_rows_item(void *arg, int64_t item, int worker)
{
    (void)worker;
    const attn__half_rows *r = (const attn__half_rows *)arg;
    const int64_t rows = r->n[0] * r->n[1] * r->n[2];
    const int64_t r0 = item * HALF_ROWS_PER_ITEM;
    attn__half_rows_block(r, r0, r0 + HALF_ROWS_PER_ITEM < rows ? r0 + HALF_ROWS_PER_ITEM : rows);
}

void attn__half_rows_run(const attn__half_rows *r, int threads)
{
    const int64_t rows = r->n[0] * r->n[1] * r->n[2];
    const int64_t items = (rows + HALF_ROWS_PER_ITEM - 1) / HALF_ROWS_PER_ITEM;
    attn__parallel_for(items < threads ? (int)items : threads, items, half_rows_item, (void *)r);
}

/* The reference's staged floats, in order: q, k, v, out, each rounded up to 16. */
static int ref_floats(const attn__sdpa_shapes *s, int64_t f[4])
{
    const int64_t heads[4] = {s->H, s->Hkv, s->Hkv, s->H};
    const int64_t rows[4] = {s->Tq, s->Tk, s->Tk, s->Tq};
    const int64_t cols[4] = {s->D, s->D, s->Dv, s->Dv};
    for (int i = 0; i < 4; i++) {
        if (!attn__mul_i64(s->B, heads[i], &f[i]) || !attn__mul_i64(f[i], rows[i], &f[i]) ||
            !attn__mul_i64(f[i], cols[i], &f[i]) || f[i] > INT64_MAX - 16)
            return 0;
        f[i] = (f[i] + 15) / 16 * 16;
    }
    return 1;
}

size_t attn__half_ref_bytes(const attn__sdpa_shapes *s)
{
    int64_t f[4];
    size_t bytes;
    if (!ref_floats(s, f) || f[0] > INT64_MAX - f[1] || f[0] + f[1] > INT64_MAX - f[2] ||
        f[0] + f[1] + f[2] > INT64_MAX - f[3] ||
        !attn__bytes(f[0] + f[1] + f[2] + f[3], sizeof(float), &bytes))
        return 0;
    return bytes;
}

int attn__half_ref_run(attn_ctx *ctx, const attn__sdpa_shapes *s, const void *q,
                       const void *k, const void *v, void *out, float *weights,
                       float *scores, void *stage)
{
    /* The reference is the proof: portable converters, one thread. */
    const attn__half_kernels *hk = &attn__half_scalar;
    attn__sdpa_shapes st;
    attn__half_staged_shapes(s, 0, 0, &st);
    int64_t f[4];
    ref_floats(s, f);
    float *qf = (float *)stage, *kf = qf + f[0], *vf = kf + f[1], *of = vf + f[2];
    const attn__half_rows rq = {hk, s->q_f32 ? ATTN_DTYPE_F32 : s->dtype, 0, (void *)(uintptr_t)q, qf,
                                {s->B, s->H, s->Tq, s->D}, {s->q_s[0], s->q_s[1], s->q_s[2], s->q_s[3]}};
    const attn__half_rows rk = {hk, s->dtype, 0, (uint16_t *)(uintptr_t)k, kf,
                                {s->B, s->Hkv, s->Tk, s->D}, {s->k_s[0], s->k_s[1], s->k_s[2], s->k_s[3]}};
    const attn__half_rows rv = {hk, s->dtype, 0, (uint16_t *)(uintptr_t)v, vf,
                                {s->B, s->Hkv, s->Tk, s->Dv}, {s->v_s[0], s->v_s[1], s->v_s[2], s->v_s[3]}};
    attn__half_rows_run(&rq, 1);
    attn__half_rows_run(&rk, 1);
    attn__half_rows_run(&rv, 1);
    const int rc = attn__sdpa_ref_run(ctx, &st, qf, kf, vf, of, weights, scores);
    if (rc != ATTN_OK)
        return rc;
    const attn__half_rows ro = {hk, s->out_f32 ? ATTN_DTYPE_F32 : s->dtype, 1, out, of,
                                {s->B, s->H, s->Tq, s->Dv}, {s->o_s[0], s->o_s[1], s->o_s[2], s->o_s[3]}};
    attn__half_rows_run(&ro, 1);
    return ATTN_OK;
}
