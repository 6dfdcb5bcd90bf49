/*
 * fused_row.h - the fused kernel's row path, for problems with a handful of query
 * rows (at most ATTN__FUSED_ROW_MAX): one decoding step against a cache, the
 * chapter's toy size. One work item is one (b, h) and all its query rows, in three
 * phases over all the rows - scores, softmax, weighted sum - so that the rows'
 * independent work overlaps in the core instead of one short row waiting on its
 * own chain of latencies. K and V rows are read in place (unit stride along the
 * head dim required), K in the score phase and V in the weighted-sum phase; the
 * rows' scores live in a [Tq][Tk] scratch block. Its contract is written at the top of
 * src/kernels/fused_kernel.h, which includes this file once per instruction set.
 */
#ifndef ATTN_FUSED_ROW_H
#define ATTN_FUSED_ROW_H

#include "fused_common.h"

/* Vectors of value columns the row path keeps in registers. */
#define FK_ROW_NV 8

/* Scratch floats one worker needs on the row path: the query rows [Tq][align(D)],
 * their scores [Tq][align(Tk)] and one output row [dvp]. */
static int64_t fk_row_ws_floats(const attn__fused_job *job)
{
    const attn__sdpa_shapes *s = job->s;
    return s->Tq * (fk_align(s->D) + fk_align(s->Tk)) + fk_align(job->dvp);
}

/* Dot product of n floats, vectorised along n (the tail by a partial load),
 * summed in a fixed order. */
FK_INLINE float fk_dot(const float *a, const float *x, int64_t n)
{
    simd_f32 acc0 = simd_zero(), acc1 = simd_zero();
    int64_t d = 0;
    for (; d + 2 * SIMD_W <= n; d += 2 * SIMD_W) {
        acc0 = simd_fma(simd_load(a + d), simd_load(x + d), acc0);
        acc1 = simd_fma(simd_load(a + d + SIMD_W), simd_load(x + d + SIMD_W), acc1);
    }
    for (; d + SIMD_W <= n; d += SIMD_W)
        acc0 = simd_fma(simd_load(a + d), simd_load(x + d), acc0);
    if (d < n)
        acc1 = simd_fma(simd_load_n(a + d, n - d, 0.0f), simd_load_n(x + d, n - d, 0.0f), acc1);
    return simd_hsum(simd_add(acc0, acc1));
}

/* Four dot products of q with consecutive rows of k (row stride ldk), times the
 * scale, into out[0..3]; each summed in the same order as fk_dot. */
FK_INLINE void fk_dot4(const float *q, const float *k, int64_t ldk, int64_t n, float scale,
                       float *out)
{
    simd_f32 a0 = simd_zero(), a1 = simd_zero(), a2 = simd_zero(), a3 = simd_zero();
    simd_f32 b0 = simd_zero(), b1 = simd_zero(), b2 = simd_zero(), b3 = simd_zero();
    int64_t d = 0;
    for (; d + 2 * SIMD_W <= n; d += 2 * SIMD_W) {
        const simd_f32 x = simd_load(q + d), y = simd_load(q + d + SIMD_W);
        a0 = simd_fma(x, simd_load(k + d), a0);
        b0 = simd_fma(y, simd_load(k + d + SIMD_W), b0);
        a1 = simd_fma(x, simd_load(k + ldk + d), a1);
        b1 = simd_fma(y, simd_load(k + ldk + d + SIMD_W), b1);
        a2 = simd_fma(x, simd_load(k + 2 * ldk + d), a2);
        b2 = simd_fma(y, simd_load(k + 2 * ldk + d + SIMD_W), b2);
        a3 = simd_fma(x, simd_load(k + 3 * ldk + d), a3);
        b3 = simd_fma(y, simd_load(k + 3 * ldk + d + SIMD_W), b3);
    }
    for (; d + SIMD_W <= n; d += SIMD_W) {
        const simd_f32 x = simd_load(q + d);
        a0 = simd_fma(x, simd_load(k + d), a0);
        a1 = simd_fma(x, simd_load(k + ldk + d), a1);
        a2 = simd_fma(x, simd_load(k + 2 * ldk + d), a2);
        a3 = simd_fma(x, simd_load(k + 3 * ldk + d), a3);
    }
    if (d < n) {
        const int64_t t = n - d;
        const simd_f32 y = simd_load_n(q + d, t, 0.0f);
        b0 = simd_fma(y, simd_load_n(k + d, t, 0.0f), b0);
        b1 = simd_fma(y, simd_load_n(k + ldk + d, t, 0.0f), b1);
        b2 = simd_fma(y, simd_load_n(k + 2 * ldk + d, t, 0.0f), b2);
        b3 = simd_fma(y, simd_load_n(k + 3 * ldk + d, t, 0.0f), b3);
    }
    out[0] = simd_hsum(simd_add(a0, b0)) * scale;
    out[1] = simd_hsum(simd_add(a1, b1)) * scale;
    out[2] = simd_hsum(simd_add(a2, b2)) * scale;
    out[3] = simd_hsum(simd_add(a3, b3)) * scale;
}

/* acc[c] = sum_j p[j] * v[j][c] (added to acc's contents when add is 1) over the keys j < nkeys that the row may see, for
 * nv vectors of columns, the last of which holds only `last` columns (1 .. SIMD_W).
 * mrow is the row's mask (element stride ms3) and brow its bias (element stride
 * bs3), each NULL when absent. A key they hide (a false mask entry, a -inf bias) is
 * skipped, so its value never reaches the output; every other weight is
 * multiplied, zeros included, so that a NaN or inf value reaches the row even where
 * its weight underflowed to 0 (0 * NaN = NaN, as in the reference). */
FK_INLINE void fk_row_pv(const float *p, int64_t nkeys, const uint8_t *mrow, int64_t ms3,
                         const float *brow, int64_t bs3, const float *v, int64_t ldv,
                         float *acc, const int nv, int64_t last, const int add)
{
    simd_f32 a[FK_ROW_NV];
    for (int c = 0; c < nv; c++)
        a[c] = add ? simd_load(acc + c * SIMD_W) : simd_zero();
    for (int64_t j = 0; j < nkeys; j++) {
        if ((mrow && !mrow[j * ms3]) || (brow && brow[j * bs3] == -INFINITY))
            continue;
        const simd_f32 pj = simd_set1(p[j]);
        const float *vrow = v + j * ldv;
        for (int c = 0; c < nv - 1; c++)
            a[c] = simd_fma(pj, simd_load(vrow + c * SIMD_W), a[c]);
        const float *vlast = vrow + (nv - 1) * SIMD_W;
        a[nv - 1] = simd_fma(pj, last == SIMD_W ? simd_load(vlast) : simd_load_n(vlast, last, 0.0f),
                             a[nv - 1]);
    }
    for (int c = 0; c < nv; c++)
        simd_store(acc + c * SIMD_W, a[c]);
}

/* fk_row_pv over the last `cols` columns (fewer than FK_ROW_NV vectors of them), all
 * in one pass over the keys: one accumulator per vector of columns, each a chain of
 * its own, instead of one pass per vector (which would read the weights again and
 * leave a single chain of multiply-adds waiting on each other). The switch gives
 * the compiler a constant count, so the accumulators stay in registers. */
FK_INLINE void fk_row_pv_rest(const float *p, int64_t nkeys, const uint8_t *mrow, int64_t ms3,
                              const float *brow, int64_t bs3, const float *v, int64_t ldv,
                              float *acc, int64_t cols, const int add)
{
    const int nv = (int)((cols + SIMD_W - 1) / SIMD_W);
    const int64_t last = cols - (int64_t)(nv - 1) * SIMD_W;
    switch (nv) {
#define FK_PV_CASE(N)                                                                       \
    case N:                                                                                 \
        fk_row_pv(p, nkeys, mrow, ms3, brow, bs3, v, ldv, acc, N, last, add);              \
        break;
        FK_PV_CASE(1)
        FK_PV_CASE(2)
        FK_PV_CASE(3)
        FK_PV_CASE(4)
        FK_PV_CASE(5)
        FK_PV_CASE(6)
        FK_PV_CASE(7)
        FK_PV_CASE(8) /* cols of 113 to 127 on AVX-512, 57 to 63 on AVX2 */
#undef FK_PV_CASE
    default:
        break; /* cols is at most FK_ROW_NV vectors */
    }
}

/* Phase 2's per-key step over keys [lo, hi) of one row (shared by the row path
 * and the split path): + bias and + ALiBi on the visible keys, in the contract's
 * order, -inf on the keys the mask or a -inf bias hide, and the row's max folded
 * into *m (a NaN score makes the max NaN, so that the row comes out NaN).
 * Returns the number of visible keys. */
FK_INLINE int64_t fk_row_scores(float *sc, int64_t lo, int64_t hi, const uint8_t *mrow,
                                int64_t ms3, const float *brow, int64_t bs3, int alibi,
                                float slope, int64_t ip, float *mp)
{
    float m = *mp;
    int64_t visible = 0;
    if (!mrow && !brow && !alibi && hi - lo >= SIMD_W) {
        /* A decoding step's usual row: every key in [lo, hi) is visible and the
         * scores stay as they are, so only the max is left, taken a vector at a
         * time (the scalar loop's max is one dependent chain of compares, which on
         * the split path cost more than its loads). x - x is 0 for a finite x and
         * NaN for a NaN or an infinity: when any lane saw one, the scalar loop
         * below decides instead, so that a NaN still wins the max exactly as
         * there. The max of finite floats is the same whatever the order (the
         * sign of a zero max can differ, which no output sees: s - m and m +
         * log(l) are the same either way). */
        simd_f32 vmax = simd_load(sc + lo), vbad = simd_zero();
        int64_t j = lo;
        for (; j + SIMD_W <= hi; j += SIMD_W) {
            const simd_f32 x = simd_load(sc + j);
            vmax = simd_max(vmax, x);
            vbad = simd_add(vbad, simd_sub(x, x));
        }
        if (j < hi) {
            const simd_f32 x = simd_load_n(sc + j, hi - j, sc[lo]);
            vmax = simd_max(vmax, x);
            vbad = simd_add(vbad, simd_sub(x, x));
        }
        if (simd_hsum(vbad) == 0.0f) {
            const float vm = simd_hmax(vmax);
            *mp = vm > m ? vm : m;
            return hi - lo;
        }
    }
    for (int64_t j = lo; j < hi; j++) {
        float x = sc[j];
        if ((!mrow || mrow[j * ms3]) && (!brow || brow[j * bs3] != -INFINITY)) {
            if (brow)
                x = x + brow[j * bs3];
            if (alibi)
                x = x - slope * (float)(ip - j < 0 ? j - ip : ip - j);
            sc[j] = x;
            visible++;
            if (x != x)
                m = x;
        } else {
            x = sc[j] = -INFINITY;
        }
        m = x > m ? x : m;
    }
    *mp = m;
    return visible;
}

/* The mask row of query i of (b, h), or NULL when there is no mask. */
static const uint8_t *fk_row_mask(const attn__sdpa_shapes *s, int64_t b, int64_t h, int64_t i)
{
    return s->mask.data ? s->mask.data + attn__off4(s->mask.stride, b, h, i, 0) : NULL;
}

/* The bias row of query i of (b, h), or NULL when there is no bias. */
static const float *fk_row_bias(const attn__sdpa_shapes *s, int64_t b, int64_t h, int64_t i)
{
    return s->bias ? s->bias + attn__off4(s->bias_s, b, h, i, 0) : NULL;
}

/* One (b, h) on the row path. */
static void fk_row_item(void *arg, int64_t item, int worker)
{
    const attn__fused_job *job = (const attn__fused_job *)arg;
    const attn__sdpa_shapes *s = job->s;
    const int64_t b = item / s->H, h = item % s->H;
    const int64_t D = s->D, Dv = s->Dv, Tq = s->Tq, Tk = s->Tk;
    const int64_t ldq = fk_align(D), ldsc = fk_align(Tk), ms3 = s->mask.stride[3];
    float *ws = job->ws + (int64_t)worker * job->ws_floats;
    float *qrows = ws;                /* [Tq][ldq] */
    float *scores = qrows + Tq * ldq; /* [Tq][ldsc] */
    float *acc = scores + Tq * ldsc;  /* [dvp] */

    int64_t kvb, kvh;
    fk_kv_head(s, b, h, &kvb, &kvh);
    const float *kb = job->k + kvb * s->k_s[0] + kvh * s->k_s[1];
    const float *vb = job->v + kvb * s->v_s[0] + kvh * s->v_s[1];
    const float slope = attn__alibi_slope(s, h), sink = attn__sink(s, h);
    const int64_t bs3 = s->bias_s[3];
    float inv[ATTN__FUSED_ROW_MAX];  /* 1 / l per row */
    int empty[ATTN__FUSED_ROW_MAX];  /* 1: the row may see no key */
    int64_t jlo[ATTN__FUSED_ROW_MAX], jhi[ATTN__FUSED_ROW_MAX]; /* fk_row_range: keys
                                        outside it are never read */

    /* Phase 1, over K: scores of the keys in each row's causal and window range. */
    for (int64_t i = 0; i < Tq; i++) {
        const float *qsrc = job->q + attn__off4(s->q_s, b, h, i, 0);
        float *qrow = qrows + i * ldq, *sc = scores + i * ldsc;
        for (int64_t d = 0; d < D; d++)
            qrow[d] = qsrc[d * s->q_s[3]];
        fk_row_range(s, i, &jlo[i], &jhi[i]);
        int64_t j = jlo[i];
        for (; j + 4 <= jhi[i]; j += 4)
            fk_dot4(qrow, kb + j * s->k_s[2], s->k_s[2], D, s->scale, sc + j);
        for (; j < jhi[i]; j++)
            sc[j] = fk_dot(qrow, kb + j * s->k_s[2], D) * s->scale;
    }

    /* Phase 2: the score modifications in the contract's order (softcap, + bias,
     * + ALiBi), the keys the mask or a -inf bias hide, the max (starting from the
     * sink), the softmax numerators and 1 / their sum (with the sink's term).
     * Visibility comes from the mask and the bias, not the scores, so that a NaN
     * score makes its row NaN rather than empty, and a row whose every visible
     * score is -inf gets exp(-inf - -inf) = NaN, as in the reference. */
    for (int64_t i = 0; i < Tq; i++) {
        float *sc = scores + i * ldsc;
        const uint8_t *mrow = fk_row_mask(s, b, h, i);
        const float *brow = fk_row_bias(s, b, h, i);
        const int64_t lo = jlo[i], hi = jhi[i], ip = i + s->offset;
        if (s->softcap > 0.0f)
            fk_softcap(sc + lo, hi - lo, s->softcap);
        float m = sink;
        int64_t j;
        for (j = 0; j < lo; j++)
            sc[j] = -INFINITY;
        const int64_t visible =
            fk_row_scores(sc, lo, hi, mrow, ms3, brow, bs3, s->alibi, slope, ip, &m);
        for (j = hi; j < Tk; j++)
            sc[j] = -INFINITY;
        empty[i] = visible == 0;
        if (empty[i]) {
            /* Zeros, and the sink's (or -inf's) log-sum-exp; an error only without
             * a sink. */
            inv[i] = 0.0f;
            if (s->lse)
                s->lse[b * s->lse_s[0] + h * s->lse_s[1] + i * s->lse_s[2]] = sink;
            continue;
        }
        /* The tail through a partial vector whose other lanes are -inf, so they
         * add exp(-inf) = 0. */
        const simd_f32 vm = simd_set1(m);
        simd_f32 vsum = simd_zero();
        for (j = lo; j + SIMD_W <= hi; j += SIMD_W) {
            simd_f32 p = simd_exp_nonpos(simd_sub(simd_load(sc + j), vm));
            simd_store(sc + j, p);
            vsum = simd_add(vsum, p);
        }
        if (j < hi) {
            simd_f32 p = simd_exp_nonpos(simd_sub(simd_load_n(sc + j, hi - j, -INFINITY), vm));
            simd_store_n(sc + j, p, hi - j);
            vsum = simd_add(vsum, p);
        }
        float sum = simd_hsum(vsum);
        if (s->sinks)
            sum += simd_exp_nonpos_1(sink - m);
        inv[i] = 1.0f / sum;
        if (s->lse)
            s->lse[b * s->lse_s[0] + h * s->lse_s[1] + i * s->lse_s[2]] = m + logf(sum);
    }

    /* Phase 3, over V: the weighted sum of the keys each row may see (its range
     * bounds the loop, the mask and the bias are read per key); the sums of up to
     * FK_ROW_NV vectors of columns stay in registers over all the keys. */
    for (int64_t i = 0; i < Tq; i++) {
        const float *sc = scores + i * ldsc;
        const uint8_t *mrow = fk_row_mask(s, b, h, i);
        const float *brow = fk_row_bias(s, b, h, i);
        const int64_t lo = jlo[i], n = jhi[i] - lo;
        float *orow = job->out + attn__off4(s->o_s, b, h, i, 0);
        float *wrow = job->weights ? job->weights + attn__off4(s->w_s, b, h, i, 0) : NULL;
        if (empty[i]) {
            const int64_t flat = (b * s->H + h) * Tq + i;
            if (!s->sinks && flat < job->empty_first[worker])
                job->empty_first[worker] = flat;
            for (int64_t e = 0; e < Dv; e++)
                orow[e * s->o_s[3]] = 0.0f;
            if (wrow)
                for (int64_t j = 0; j < Tk; j++)
                    wrow[j * s->w_s[3]] = 0.0f;
            continue;
        }
        const uint8_t *mr = mrow ? mrow + lo * ms3 : NULL;
        const float *br = brow ? brow + lo * bs3 : NULL;
        const float *vlo = vb + lo * s->v_s[2];
        int64_t e0 = 0;
        for (; e0 + FK_ROW_NV * SIMD_W <= Dv; e0 += FK_ROW_NV * SIMD_W)
            fk_row_pv(sc + lo, n, mr, ms3, br, bs3, vlo + e0, s->v_s[2], acc + e0, FK_ROW_NV,
                      SIMD_W, 0);
        if (e0 < Dv)
            fk_row_pv_rest(sc + lo, n, mr, ms3, br, bs3, vlo + e0, s->v_s[2], acc + e0, Dv - e0,
                           0);
        if (s->o_s[3] == 1) {
            const simd_f32 vinv = simd_set1(inv[i]);
            int64_t e = 0;
            for (; e + SIMD_W <= Dv; e += SIMD_W)
                simd_store(orow + e, simd_mul(simd_load(acc + e), vinv));
            if (e < Dv)
                simd_store_n(orow + e, simd_mul(simd_load(acc + e), vinv), Dv - e);
        } else {
            for (int64_t e = 0; e < Dv; e++)
                orow[e * s->o_s[3]] = acc[e] * inv[i];
        }
        /* Keys outside the row's range get 0 * (1 / l): zero, except in a NaN row,
         * where the reference's 0 / NaN is NaN too. */
        if (wrow) {
            for (int64_t j = 0; j < Tk; j++)
                wrow[j * s->w_s[3]] = (j >= lo && j < jhi[i] ? sc[j] : 0.0f) * inv[i];
        }
    }
}

#endif /* ATTN_FUSED_ROW_H */
