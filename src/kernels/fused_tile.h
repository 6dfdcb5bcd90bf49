/*
 * fused_tile.h - the fused kernel's tile path: one work item is (b, h, a tile of
 * br query rows), walking tiles of bc keys with the online softmax. Its contract
 * (tile sizes, the online-softmax state, tails, masks, threads, non-finite values)
 * is written at the top of src/kernels/fused_kernel.h, which includes this file
 * once per instruction set.
 *
 * The item, fk_tile_item at the end, reads as its named steps:
 *
 *   fk_tile_begin       pack the query tile as Q^T micro-panels (unless the last item
 *                       packed it ahead); m = -inf, l = 0, O = 0
 *   for each key tile that is not hidden entirely (fk_tile_kind):
 *     fk_value_tile     pack the value tile (or read it in place)
 *     fk_scores         S = (Q K^T) * scale * log2(e), masked entries -inf
 *     fk_softmax_stats  m, l, P = 2^(S - m), alpha = 2^(m_old - m_new), S in base 2
 *     fk_accumulate     O = O * alpha + P V
 *   fk_finish           out = O / l; rows that saw no key are empty
 *   fk_write_weights    only when asked for: 2^(S - m) / l, tile by tile
 */
#ifndef ATTN_FUSED_TILE_H
#define ATTN_FUSED_TILE_H

#include "fused_common.h"

/* ---- Which key tiles a query tile needs -------------------------------------- */

enum { FK_SKIP = 0, FK_FULL = 1, FK_PARTIAL = 2 };

/* How many (i, j) of rows [i0, i1) x keys [j0, j1) the mask lets through within
 * each row's visible range (fk_row_range); s has a mask. */
static int64_t fk_mask_allowed(const attn__sdpa_shapes *s, int64_t b, int64_t h, int64_t i0,
                               int64_t i1, int64_t j0, int64_t j1)
{
    int64_t allowed = 0;
    const int64_t ms3 = s->mask.stride[3];
    if (s->mask.stride[2] == 0 && j1 - j0 <= 64) {
        /* The same row for every query (a padding mask [B, 1, 1, Tk]): count it
         * once, as prefix sums, and read each row's visible span from them. */
        int64_t prefix[65];
        const uint8_t *mrow = s->mask.data + attn__off4(s->mask.stride, b, h, 0, 0);
        prefix[0] = 0;
        for (int64_t j = j0; j < j1; j++)
            prefix[j - j0 + 1] = prefix[j - j0] + (mrow[j * ms3] != 0);
        for (int64_t i = i0; i < i1; i++) {
            int64_t lo, hi;
            fk_row_range(s, i, &lo, &hi);
            const int64_t js = lo > j0 ? lo : j0, je = fk_min(j1, hi);
            allowed += je > js ? prefix[je - j0] - prefix[js - j0] : 0;
        }
        return allowed;
    }
    for (int64_t i = i0; i < i1; i++) {
        const uint8_t *mrow = s->mask.data + attn__off4(s->mask.stride, b, h, i, 0);
        int64_t lo, hi;
        fk_row_range(s, i, &lo, &hi);
        const int64_t je = fk_min(j1, hi);
        for (int64_t j = lo > j0 ? lo : j0; j < je; j++)
            allowed += mrow[j * ms3] != 0;
    }
    return allowed;
}

/* Classifies the tile rows [i0, i1) x keys [j0, j1); nkp is the padded key count.
 * SKIP when the causal alignment, the window or the mask hide all of it; FULL when
 * nothing in it can be hidden; PARTIAL otherwise. A bias makes every tile it does
 * not skip PARTIAL, since any of its entries may be -inf (a hidden key); it is not
 * searched for a tile it hides entirely. */
static int fk_tile_kind(const attn__sdpa_shapes *s, int64_t b, int64_t h, int64_t i0,
                        int64_t i1, int64_t j0, int64_t j1, int64_t nkp)
{
    const int64_t all = (i1 - i0) * (j1 - j0);
    int64_t seen = all; /* pairs the causal alignment and the window let through */
    if (s->causal && !s->has_window) {
        /* The causal alignment alone: every row's range starts at 0 and ends at
         * hi(i), which grows with i, so the first and the last row decide. */
        int64_t lo, hi_first, hi_last;
        fk_row_range(s, i0, &lo, &hi_first);
        fk_row_range(s, i1 - 1, &lo, &hi_last);
        if (hi_last <= j0)
            return FK_SKIP;
        if (hi_first < j1)
            seen = all - 1; /* some pair is hidden: the tile is PARTIAL */
    } else if (s->causal || s->has_window) {
        seen = 0;
        for (int64_t i = i0; i < i1; i++) {
            int64_t lo, hi;
            fk_row_range(s, i, &lo, &hi);
            const int64_t a = lo > j0 ? lo : j0, e = fk_min(hi, j1);
            seen += e > a ? e - a : 0;
        }
        if (seen == 0)
            return FK_SKIP;
    }
    int partial = j1 - j0 != nkp || seen != all || s->bias != NULL;
    if (!s->mask.data)
        return partial ? FK_PARTIAL : FK_FULL;
    const int64_t allowed = fk_mask_allowed(s, b, h, i0, i1, j0, j1);
    if (allowed == 0)
        return FK_SKIP;
    if (allowed != all)
        partial = 1;
    return partial ? FK_PARTIAL : FK_FULL;
}

/* ---- One item's state --------------------------------------------------------- */

/* One (b, h, query tile): where its data is and the worker's scratch, laid out as
 * fk_tile_ws_floats says. */
typedef struct fk_tile {
    const attn__sdpa_shapes *s;
    int64_t b, h;
    int64_t i0, i1;            /* query rows i0 .. i1-1 */
    float slope;               /* ALiBi's slope for head h (0 when off) */
    float sink;                /* the sink logit of head h (-inf without sinks) */
    int log2_units;            /* 1: S and m hold scores times log2(e) (the float32
                                  path); 0: scores as they are (the bfloat16 path) */
    float sink_m;              /* the sink in m's units */
    int64_t nr;                /* i1 - i0 rounded up to FK_QW: rows the micro-kernels see */
    int64_t br, bc, dvp;       /* the job's tile sizes and padded value width */
    const float *qb, *kb, *vb; /* (b, h)'s q and its key/value head's k and v */
    float *ob;                 /* (b, h)'s out */
    float *qt;                 /* [nr/FK_QW][D][FK_QW]  the query tile, transposed */
    float *vp;                 /* [bc][dvp]  a packed value tile */
    float *ST;                 /* [bc][br]   scores, then weights, key-major */
    float *O;                  /* [br][dvp]  output accumulator */
    float *m;                  /* [br] running max (of S, in its units) */
    float *l;                  /* [br] running sum */
    float *alpha;              /* [br] this key tile's correction factor */
    float *inv;                /* [br] 1 / l, 0 for an empty row, NaN for a NaN row */
    float *cmax;               /* [br] a FULL key tile's max of S per row, gathered by
                                  the score product (fk_max_in_scores) */
    int64_t *ahead;            /* the worker's [2]: the item whose query tile is packed
                                  ahead (-1: none), and which of the two buffers */
    float *qt_next;            /* the other buffer, for the next item's query tile */
    int qt_next_index;         /* 0 or 1: which one qt_next is */
    const float *next_qb;      /* with next_nr > 0: the next item's q, packed into */
    int64_t next_i0, next_nr;  /* qt_next during the last key tile's weighted sum */
} fk_tile;

/* Scratch floats one worker needs on the tile path: the buffers of fk_tile. */
static int64_t fk_tile_ws_floats(const attn__fused_job *job)
{
    const int64_t br = job->br, bc = job->bc, dvp = job->dvp;
    return 16 + 2 * fk_align(br * job->s->D) + fk_align(bc * dvp) + fk_align(bc * br) +
           fk_align(br * dvp) + 5 * fk_align(br);
}

/* ---- Pack ----------------------------------------------------------------------- */

/* Query rows i0 .. i0+nr-1, transposed into micro-panels [nr/FK_QW][D][FK_QW], so
 * that query rows lie along the vector lanes; rows past Tq are zeros. Only the
 * elements d0 <= d < d1 of each row (the whole tile in slices, fk_pack_ahead). */
static void fk_pack_qt(const attn__sdpa_shapes *s, const float *qb, int64_t i0,
                       int64_t nr, float *qt, int64_t d0, int64_t d1)
{
    const int64_t D = s->D, rows = fk_min(nr, s->Tq - i0), qs2 = s->q_s[2];
    /* A whole panel is read a vector of rows at a time (a gather of rows qs2
     * apart) when the offsets fit the gather's 32-bit indices: element by
     * element, the transpose took about 5% of S2's time. */
    const int gather = qs2 >= 0 && qs2 <= INT32_MAX / FK_QW;
    /* Panel by panel, d outer: the writes run contiguously (FK_QW floats a d) and
     * the strided reads stay within the panel's rows, which fit in L1. */
    for (int64_t p0 = 0; p0 < nr; p0 += FK_QW) {
        float *panel = qt + p0 * D;
        const int64_t live = fk_min(FK_QW, rows - p0); /* may be <= 0 */
        int64_t d = d0;
#if SIMD_HAS_TRANSPOSE
        /* Whole panels of unit-stride rows go SIMD_W x SIMD_W blocks at a time,
         * transposed in registers: a row's SIMD_W values of d are one load, where
         * the gather below reads them one by one. Together with the logf that
         * fk_finish_rows no longer calls unasked, this took an item's fixed cost
         * from about 2.2 to 1.5 us (docs/performance.md). */
        if (live == FK_QW && s->q_s[3] == 1)
            for (; d + SIMD_W <= d1; d += SIMD_W)
                for (int64_t r0 = 0; r0 < FK_QW; r0 += SIMD_W)
                    simd_transpose_block(panel + d * FK_QW + r0, FK_QW,
                                         qb + (i0 + p0 + r0) * qs2 + d, qs2);
#endif
        for (; d < d1; d++) {
            float *dst = panel + d * FK_QW;
            const float *src = qb + (i0 + p0) * qs2 + d * s->q_s[3];
            int64_t r = 0;
            if (gather && live == FK_QW)
                for (; r < FK_QW; r += SIMD_W)
                    simd_store(dst + r, simd_load_strided(src + r * qs2, (int32_t)qs2));
            for (; r < live; r++)
                dst[r] = src[r * qs2];
            for (; r < FK_QW; r++)
                dst[r] = 0.0f;
        }
    }
}

/* Values of keys j0 .. j0+nkp-1 into [nkp][dvp]; keys past Tk and columns past Dv
 * are zeros. With `check`, returns 1 when a value is not finite (inf or NaN), so
 * that the caller can keep a masked key's value out of the output (0 * inf is
 * NaN); without it, returns 0 and looks at nothing. */
static int fk_pack_v(const attn__sdpa_shapes *s, const float *vb, int64_t j0, int64_t nkp,
                     int64_t dvp, float *vp, int check)
{
    const int64_t Dv = s->Dv;
    /* x * 0 is NaN exactly when x is inf or NaN; the sum of those products flags a
     * non-finite value anywhere in the tile's values. */
    const simd_f32 zero = simd_zero();
    simd_f32 chk = simd_zero();
    float chk1 = 0.0f;
    for (int64_t c = 0; c < nkp; c++) {
        float *vdst = vp + c * dvp;
        const int64_t j = j0 + c;
        int64_t e = 0;
        if (j < s->Tk) {
            const float *vsrc = vb + j * s->v_s[2];
            if (s->v_s[3] == 1)
                for (; e + SIMD_W <= Dv; e += SIMD_W) {
                    simd_f32 x = simd_load(vsrc + e);
                    simd_store(vdst + e, x);
                    if (check)
                        chk = simd_add(chk, simd_mul(x, zero));
                }
            for (; e < Dv; e++) {
                vdst[e] = vsrc[e * s->v_s[3]];
                if (check)
                    chk1 += vdst[e] * 0.0f;
            }
        }
        for (; e < dvp; e++)
            vdst[e] = 0.0f;
    }
    chk1 += simd_hsum(chk);
    return chk1 != chk1;
}

/* 1 when a value of keys j0 .. j0+nk-1 is not finite (inf or NaN), read in place:
 * rows of Dv values, unit stride, Dv a multiple of SIMD_W. As in fk_pack_v, x * 0
 * is NaN exactly when x is not finite, here summed by fma in four independent
 * chains: one chain waits out the add's latency at every vector. */
static int fk_check_v(const attn__sdpa_shapes *s, const float *vb, int64_t j0, int64_t nk)
{
    const int64_t Dv = s->Dv, ldv = s->v_s[2];
    const simd_f32 zero = simd_zero();
    simd_f32 c0 = simd_zero(), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t j = j0; j < j0 + nk; j++) {
        const float *v = vb + j * ldv;
        int64_t e = 0;
        for (; e + 4 * SIMD_W <= Dv; e += 4 * SIMD_W) {
            c0 = simd_fma(simd_load(v + e), zero, c0);
            c1 = simd_fma(simd_load(v + e + SIMD_W), zero, c1);
            c2 = simd_fma(simd_load(v + e + 2 * SIMD_W), zero, c2);
            c3 = simd_fma(simd_load(v + e + 3 * SIMD_W), zero, c3);
        }
        for (; e < Dv; e += SIMD_W)
            c0 = simd_fma(simd_load(v + e), zero, c0);
    }
    const float chk = simd_hsum(simd_add(simd_add(c0, c1), simd_add(c2, c3)));
    return chk != chk;
}

/* Step 1: lays out the worker's scratch for item `item`, packs its query tile and
 * starts the online-softmax state: m = -inf, l = 0, O = 0, or with a sink
 * m = sink (times log2(e), as S holds every score: fk_scores), l = 2^(m - m) = 1
 * (the sink's term of the denominator, with no value, so O = 0 still). */
static void fk_tile_begin(const attn__fused_job *job, int64_t item, int worker, int ahead,
                          fk_tile *t)
{
    const attn__sdpa_shapes *s = job->s;
    /* Items go head by head, so that consecutive items reuse the head's K and V
     * from cache; within a head the last query tiles come first, since under the
     * causal mask they are the heaviest and the light ones then fill the tail. */
    const int64_t bh = item / job->n_qt;
    const int64_t qt_index = job->n_qt - 1 - item % job->n_qt;
    t->s = s;
    t->b = bh / s->H;
    t->h = bh % s->H;
    t->br = job->br;
    t->bc = job->bc;
    t->dvp = job->dvp;
    t->i0 = qt_index * t->br;
    t->i1 = fk_min(t->i0 + t->br, s->Tq);
    t->nr = fk_round_up(t->i1 - t->i0, FK_QW);

    float *ws = job->ws + (int64_t)worker * job->ws_floats;
    /* Two buffers for query tiles: this item's, and the next one's, packed ahead
     * (fk_pack_ahead) when the worker runs its items itself (`ahead`). */
    t->ahead = (int64_t *)(void *)ws;
    float *qbuf[2] = {ws + 16, ws + 16 + fk_align(t->br * s->D)};
    const int packed = ahead && t->ahead[0] == item;
    const int cur = packed ? (int)t->ahead[1] : 0;
    t->ahead[0] = -1;
    t->qt = qbuf[cur];
    t->qt_next = qbuf[1 - cur];
    t->qt_next_index = 1 - cur;
    t->next_qb = NULL;
    t->next_i0 = t->next_nr = 0;
    t->vp = qbuf[1] + fk_align(t->br * s->D);
    t->ST = t->vp + fk_align(t->bc * t->dvp);
    t->O = t->ST + fk_align(t->bc * t->br);
    t->m = t->O + fk_align(t->br * t->dvp);
    t->l = t->m + fk_align(t->br);
    t->alpha = t->l + fk_align(t->br);
    t->inv = t->alpha + fk_align(t->br);
    t->cmax = t->inv + fk_align(t->br);

    int64_t kvb, kvh;
    fk_kv_head(s, t->b, t->h, &kvb, &kvh);
    t->qb = job->q + t->b * s->q_s[0] + t->h * s->q_s[1];
    t->kb = job->k + kvb * s->k_s[0] + kvh * s->k_s[1];
    t->vb = job->v + kvb * s->v_s[0] + kvh * s->v_s[1];
    t->ob = job->out + t->b * s->o_s[0] + t->h * s->o_s[1];

    t->slope = attn__alibi_slope(s, t->h);
    t->sink = attn__sink(s, t->h);
    t->log2_units = 1;
    t->sink_m = t->sink * SIMD_LOG2E;
    /* A finite sink beyond FLT_MAX / log2(e) in size stays finite, as a bias that
     * large does (fk_score_mod): as +inf it made every exp 2^(inf - inf) = NaN where
     * the reference gives zero weights and the sink as the lse. */
    if (isinf(t->sink_m) && !isinf(t->sink))
        t->sink_m = t->sink_m < 0.0f ? -FLT_MAX : FLT_MAX;
    if (!packed)
        fk_pack_qt(s, t->qb, t->i0, t->nr, t->qt, 0, s->D);
    for (int64_t r = 0; r < t->nr; r++) {
        t->m[r] = t->sink_m;
        t->l[r] = t->sink > -INFINITY ? 1.0f : 0.0f;
    }
    /* O's rows are contiguous: zeroed as one block, in vectors (dvp is a multiple
     * of SIMD_W). Row by row, GCC called memset 64 times an item: about 4% of the
     * kernel's samples (perf) where each item has one key tile. */
    const simd_f32 zero = simd_zero();
    for (int64_t e = 0; e < t->nr * t->dvp; e += SIMD_W)
        simd_store(t->O + e, zero);
}

/* Where the weighted sum reads a key tile's values from. */
typedef struct fk_vtile {
    const float *v; /* [nkp][ldv] */
    int64_t ldv;
    int nonfinite; /* a PARTIAL tile whose values hold an inf or a NaN */
} fk_vtile;

/* Step 1, per key tile: the values of keys j0 .. j0+nkp-1. Read in place when the
 * tile's keys are all below Tk and rows are unit-stride multiples of the vector;
 * otherwise packed (zeros past Tk and Dv). Only a PARTIAL tile is checked for
 * inf/NaN: where nothing is masked, every value must reach the output anyway
 * (0 * NaN = NaN, as in the reference), so a FULL tile costs no check. A PARTIAL
 * tile read in place (the causal diagonal's, a padding mask's) is checked where it
 * lies, and packed only when it holds a non-finite value, for the plain loop
 * (fk_accumulate_visible) that reads the packed copy: packing and checking every
 * such tile in one chain took 1.1% of S2's samples, about 2,000 cycles a causal
 * diagonal tile (the same values either way, so the same bits). */
static fk_vtile fk_value_tile(const fk_tile *t, int64_t j0, int64_t nkp, int kind)
{
    const attn__sdpa_shapes *s = t->s;
    fk_vtile vt;
    if (s->v_s[3] == 1 && t->dvp == s->Dv && j0 + nkp <= s->Tk &&
        (kind == FK_FULL || !fk_check_v(s, t->vb, j0, nkp))) {
        vt.v = t->vb + j0 * s->v_s[2];
        vt.ldv = s->v_s[2];
        vt.nonfinite = 0;
    } else {
        vt.nonfinite = fk_pack_v(s, t->vb, j0, nkp, t->dvp, t->vp, kind == FK_PARTIAL);
        vt.v = t->vp;
        vt.ldv = t->dvp;
    }
    return vt;
}

/* How many of the nkp keys from j0 the tile's rows 0 .. rend - 1 may see at most:
 * a key at or past hi(i) of the last of those rows is hidden from all of them,
 * since fk_row_range's ends only grow with i. On the causal diagonal this is what
 * spares the hidden triangle: the score product skips a micro-tile whose keys all
 * lie past it, the softmax and the weighted sum stop there. Every entry skipped
 * is hidden, so its weight is exactly 0, and leaving out a 0 * v term of a sum
 * gives the same bits (the sums never hold -0, so adding +-0 changes nothing);
 * values past it cannot reach the output either, as the contract asks. */
static int64_t fk_keys_seen(const fk_tile *t, int64_t j0, int64_t nkp, int kind, int64_t rend)
{
    if (kind != FK_PARTIAL)
        return nkp;
    int64_t lo, hi;
    fk_row_range(t->s, fk_min(t->i0 + rend, t->i1) - 1, &lo, &hi);
    return hi <= j0 ? 0 : fk_min(nkp, hi - j0);
}

/* ---- Score ---------------------------------------------------------------------- */

/* Part g of G of the next item's query rows (t->next_qb, fk_ahead_item) asked of
 * the L2, every line of them: one part per key group of the last key tile's score
 * product, so that they arrive before that tile's weighted sum packs them
 * (fk_pack_ahead) and the requests never queue up as a block of them did
 * (fk_prime). Rows of unit stride only. */
static void fk_ask_ahead(const fk_tile *t, int64_t g, int64_t G)
{
    const attn__sdpa_shapes *s = t->s;
    if (s->q_s[3] != 1)
        return;
    const int64_t rows = fk_min(t->next_nr, s->Tq - t->next_i0);
    const int64_t bytes = s->D * (int64_t)sizeof(float);
    for (int64_t r = g * rows / G; r < (g + 1) * rows / G; r++) {
        const uintptr_t row = (uintptr_t)(t->next_qb + (t->next_i0 + r) * s->q_s[2]);
        for (uintptr_t line = row & ~(uintptr_t)63; line < row + (uintptr_t)bytes; line += 64)
            FK_PREFETCH_L2((const void *)line);
    }
}

/* Score micro-kernel, transposed: ST[kk][c] = (sum_d k_kk[d] * qt[d][c]) * scale for
 * FK_MK keys kk (key rows read in place at krow[kk], element stride ks, broadcast
 * one element at a time) and nq * SIMD_W query rows c (qt, within a packed
 * micro-panel [D][FK_QW]; nq <= FK_NQV, a constant at each call site), summed over
 * d in increasing order; ST has key stride ldst. */
FK_INLINE void fk_ukr_qk(int64_t D, const float *const *krow, int64_t ks, const float *qt,
                         float *ST, int64_t ldst, simd_f32 vscale, float *cmax, const int nq)
{
    simd_f32 acc[FK_MK][FK_NQV];
    for (int kk = 0; kk < FK_MK; kk++)
        for (int c = 0; c < nq; c++)
            acc[kk][c] = simd_zero();
    for (int64_t d = 0; d < D; d++) {
        simd_f32 qv[FK_NQV];
        for (int c = 0; c < nq; c++)
            qv[c] = simd_load(qt + d * FK_QW + c * SIMD_W);
        for (int kk = 0; kk < FK_MK; kk++) {
            simd_f32 kv = simd_set1(krow[kk][d * ks]);
            for (int c = 0; c < nq; c++)
                acc[kk][c] = simd_fma(kv, qv[c], acc[kk][c]);
        }
    }
    for (int kk = 0; kk < FK_MK; kk++)
        for (int c = 0; c < nq; c++) {
            acc[kk][c] = simd_mul(acc[kk][c], vscale);
            simd_store(ST + kk * ldst + c * SIMD_W, acc[kk][c]);
        }
    if (cmax) /* the running column max of these rows, from the registers */
        for (int c = 0; c < nq; c++) {
            simd_f32 mx = simd_load(cmax + c * SIMD_W);
            for (int kk = 0; kk < FK_MK; kk++)
                mx = simd_max(mx, acc[kk][c]);
            simd_store(cmax + c * SIMD_W, mx);
        }
}

/* fk_ukr_qk for the last nq vectors of rows of a micro-panel (0 < nq < FK_NQV)
 * whose first ones see none of the keys (the causal diagonal, fk_scores), with nq
 * a constant at each call of the micro-kernel; qt and ST point at the panel's
 * first row, as for the whole panel. */
static void fk_ukr_qk_last(int64_t D, const float *const *krow, int64_t ks, const float *qt,
                           float *ST, int64_t ldst, simd_f32 vscale, int nq)
{
    const int64_t c0 = (FK_NQV - nq) * SIMD_W;
    switch (nq) {
#if FK_NQV > 3
    case 3:
        fk_ukr_qk(D, krow, ks, qt + c0, ST + c0, ldst, vscale, NULL, 3);
        break;
#endif
#if FK_NQV > 2
    case 2:
        fk_ukr_qk(D, krow, ks, qt + c0, ST + c0, ldst, vscale, NULL, 2);
        break;
#endif
    default:
        fk_ukr_qk(D, krow, ks, qt + c0, ST + c0, ldst, vscale, NULL, 1);
        break;
    }
}

/* The factor by which fk_score_mod multiplies what it adds: log2(e) where ST
 * already holds the scores in base-2 units (the float32 path without a softcap,
 * fk_scores), else 1 (exact, so the bfloat16 path's bits are the plain sums). An
 * added term goes through the same two roundings, x * factor then the sum, whether
 * it is a bias or ALiBi's, so that a bias of 0 (or -inf) gives the bits of no bias
 * (or of a mask) as in the reference. */
static float fk_mod_unit(const fk_tile *t)
{
    /* A scale beyond FLT_MAX / log2(e) (2.36e38) in size takes the softcap's way
     * too: its factor scale * log2(e) is inf, which made every score +-inf or NaN
     * (0 * inf where q.k = 0), where the reference's scores stay finite. */
    return t->log2_units && !(t->s->softcap > 0.0f) && fabsf(t->s->scale) * SIMD_LOG2E <= FLT_MAX
               ? SIMD_LOG2E
               : 1.0f;
}

/* Step 2b, when a softcap, a bias or ALiBi is on: each score of ST in the
 * contract's order, softcap, then + bias (read through its broadcast strides), then
 * + ALiBi's -slope * |i' - j| (computed here, per tile, never stored), the added
 * terms times fk_mod_unit. Rows past Tq and keys past Tk are left as they are; they
 * are hidden below or never written. */
static void fk_score_mod(const fk_tile *t, int64_t j0, int64_t nkp)
{
    const attn__sdpa_shapes *s = t->s;
    const float unit = fk_mod_unit(t);
    const int64_t ldst = t->br, nr = t->nr, i0 = t->i0, rows = t->i1 - i0;
    const int64_t nk = fk_min(nkp, s->Tk - j0);
    float *ST = t->ST;
    if (s->softcap > 0.0f)
        for (int64_t c = 0; c < nk; c++)
            fk_softcap(ST + c * ldst, nr, s->softcap);
    if (s->bias) {
        const float *bb = s->bias + t->b * s->bias_s[0] + t->h * s->bias_s[1];
        const int64_t bs2 = s->bias_s[2];
        for (int64_t c = 0; c < nk; c++) {
            const float *bcol = bb + i0 * bs2 + (j0 + c) * s->bias_s[3];
            float *strow = ST + c * ldst;
            for (int64_t r = 0; r < rows; r++) {
                /* Two statements, so that no compiler contracts them to an fma:
                 * ALiBi's term below is rounded twice too. */
                float add = bcol[r * bs2] * unit;
                /* A finite bias beyond FLT_MAX / log2(e) in size (-FLT_MAX is
                 * torch.finfo(float32).min, the usual additive padding mask) stays
                 * finite: as -inf it would hide its key, and a row whose keys all
                 * carry it would be NaN where the reference averages them. */
                if (isinf(add) && !isinf(bcol[r * bs2]))
                    add = add < 0.0f ? -FLT_MAX : FLT_MAX;
                strow[r] = strow[r] + add;
            }
        }
    }
    if (s->alibi) {
        /* The distance i' - j of row r is d0 + r, exact in float32 up to 2^24. */
        const simd_f32 vslope = simd_set1(t->slope), vunit = simd_set1(unit);
        float iota[SIMD_W];
        for (int r = 0; r < SIMD_W; r++)
            iota[r] = (float)r;
        const simd_f32 viota = simd_load(iota);
        for (int64_t c = 0; c < nk; c++) {
            float *strow = ST + c * ldst;
            for (int64_t r0 = 0; r0 < nr; r0 += SIMD_W) {
                const simd_f32 dist =
                    simd_abs(simd_add(simd_set1((float)(i0 + r0 + s->offset - j0 - c)), viota));
                simd_store(strow + r0, simd_sub(simd_load(strow + r0),
                                                simd_mul(simd_mul(vslope, dist), vunit)));
            }
        }
    }
}

/* x[0 .. n-1] = -inf, a vector at a time: the causal diagonal's hidden prefix of
 * each key's row, which GCC's loop wrote one float at a time (about 1% of S2's
 * samples in perf). */
static void fk_fill_neginf(float *x, int64_t n)
{
    const simd_f32 ninf = simd_set1(-INFINITY);
    int64_t r = 0;
    for (; r + SIMD_W <= n; r += SIMD_W)
        simd_store(x + r, ninf);
    if (r < n)
        simd_store_n(x + r, ninf, n - r);
}

/* Step 2c, for a PARTIAL tile: -inf at every hidden entry of ST's nkp keys from j0
 * (keys past Tk, keys outside each row's causal and window range, a false mask
 * entry, a -inf bias), after the score modifications, so that a hidden entry is
 * -inf whatever its score was (even NaN), for any scale, as in the reference. */
static void fk_hide(const fk_tile *t, int64_t j0, int64_t nkp)
{
    const attn__sdpa_shapes *s = t->s;
    const int64_t ldst = t->br, nr = t->nr, i0 = t->i0;
    float *ST = t->ST;
    const int64_t rows = t->i1 - i0; /* real query rows */
    const int by_position = s->causal || s->has_window;
    for (int64_t c = 0; c < nkp; c++) {
        const int64_t j = j0 + c;
        float *strow = ST + c * ldst;
        if (j >= s->Tk) {
            fk_fill_neginf(strow, nr);
            continue;
        }
        if (by_position && !s->has_window) {
            /* The causal alignment alone: the rows i with hi(i) <= j, i.e.
             * i + off + 1 <= j (off = 0 top-left, Tk - Tq bottom-right), form a
             * prefix of the tile, and no range starts after j. */
            const int64_t off = s->causal == ATTN_CAUSAL_TOP_LEFT ? 0 : s->offset;
            fk_fill_neginf(strow, fk_min(rows, j - off - i0 > 0 ? j - off - i0 : 0));
        } else if (by_position) {
            /* The rows whose range ends at or before j form a prefix of the tile,
             * and those whose range starts after j a suffix (fk_row_range's ends
             * grow with i). */
            int64_t lo, hi, r = 0, re = rows;
            for (; r < rows; r++) {
                fk_row_range(s, i0 + r, &lo, &hi);
                if (j < hi)
                    break;
                strow[r] = -INFINITY;
            }
            for (; re > r; re--) {
                fk_row_range(s, i0 + re - 1, &lo, &hi);
                if (j >= lo && j < hi)
                    break;
                strow[re - 1] = -INFINITY;
            }
        }
        if (s->mask.data) {
            const uint8_t *mcol =
                s->mask.data + attn__off4(s->mask.stride, t->b, t->h, i0, j);
            const int64_t ms2 = s->mask.stride[2];
            if (ms2 == 0) { /* one value for the whole column */
                if (!mcol[0])
                    for (int64_t r = 0; r < rows; r++)
                        strow[r] = -INFINITY;
            } else {
                for (int64_t r = 0; r < rows; r++)
                    if (!mcol[r * ms2])
                        strow[r] = -INFINITY;
            }
        }
        if (s->bias) {
            const float *bcol = s->bias + attn__off4(s->bias_s, t->b, t->h, i0, j);
            for (int64_t r = 0; r < rows; r++)
                if (bcol[r * s->bias_s[2]] == -INFINITY)
                    strow[r] = -INFINITY;
        }
    }
}

/* 1 when the score product gathers the tile's max per row as it stores the scores
 * (into cmax), so that the softmax need not read S once more for it: a FULL tile
 * (nothing in it hidden, so every entry counts) whose scores nothing changes after
 * the product (no softcap, bias or ALiBi). A max is exact in any order, so this is
 * the max fk_col_max would find. */
static int fk_max_in_scores(const fk_tile *t, int kind)
{
    return kind == FK_FULL && !fk_has_score_mod(t->s) && fk_mod_unit(t) != 1.0f;
}

/* Step 2: ST [nkp][br] = (K Q^T) * scale * log2(e) for the nkp keys from j0 and the
 * tile's query rows, modified by the softcap, the bias and ALiBi (fk_score_mod, on
 * the scores times scale, before the factor log2(e)), then, for a PARTIAL tile,
 * -inf at every hidden entry: keys past Tk, keys outside each row's causal and
 * window range, a false mask entry, a -inf bias. Hiding comes last, so a hidden
 * entry is -inf whatever its score was (even NaN), for any scale, as in the
 * reference.
 *
 * The factor log2(e) puts the scores in base-2 units, so that the softmax's
 * e^(S - m) is 2^(S' - m') (simd_exp2_nonpos), which needs neither the multiply by
 * log2(e) nor the Cody-Waite reduction of simd_exp_nonpos (10 vector instructions
 * a score where that takes 14, on the ports the products need). It rides on the
 * product's own multiply by the scale (one rounded factor scale * log2(e)), and a
 * bias or ALiBi's term is multiplied by log2(e) before it is added (fk_mod_unit);
 * only the softcap, whose tanh needs the scores as they are, and a scale whose
 * factor would overflow (fk_mod_unit) get the plain scale and one multiply more per
 * score after the modifications. A product q.k times
 * the scale beyond FLT_MAX / log2(e) (2.4e38) in size overflows to inf here, where
 * it would stay finite in the reference; a bias that large (torch.finfo's min, an
 * additive mask) is kept finite at +-FLT_MAX instead (fk_score_mod). */
static void fk_scores(const fk_tile *t, int64_t j0, int64_t nkp, int kind)
{
    const attn__sdpa_shapes *s = t->s;
    const int64_t D = s->D, ldst = t->br, nr = t->nr;
    float *ST = t->ST;
    const int natural = fk_mod_unit(t) == 1.0f; /* the softcap's scores, as they are */
    const simd_f32 vscale = simd_set1(natural ? s->scale : s->scale * SIMD_LOG2E);
    float *cmax = fk_max_in_scores(t, kind) ? t->cmax : NULL;
    if (cmax)
        for (int64_t r0 = 0; r0 < nr; r0 += SIMD_W)
            simd_store(cmax + r0, simd_set1(-INFINITY));
    for (int64_t kg = 0; kg < nkp; kg += FK_MK) {
        const float *krow[FK_MK];
        if (t->next_nr)
            fk_ask_ahead(t, kg / FK_MK, nkp / FK_MK);
        for (int kk = 0; kk < FK_MK; kk++) {
            /* Keys past Tk repeat the last key (valid memory); they are masked below. */
            const int64_t j = fk_min(j0 + kg + kk, s->Tk - 1);
            krow[kk] = t->kb + j * s->k_s[2];
        }
        for (int64_t rb = 0; rb < nr; rb += FK_QW) {
            /* On the causal diagonal, the micro-panel's first c0 vectors of rows
             * see none of these keys (fk_keys_seen grows with the rows): their
             * scores are hidden, never computed (the softmax and the weighted sum
             * read no further than their rows see), and only the last
             * FK_NQV - c0 vectors, if any, go through the product. */
            int c0 = 0;
            while (c0 < FK_NQV && kg >= fk_keys_seen(t, j0, nkp, kind, rb + (c0 + 1) * SIMD_W))
                c0++;
            if (c0 == 0) {
                fk_ukr_qk(D, krow, s->k_s[3], t->qt + rb * D, ST + kg * ldst + rb, ldst, vscale,
                          cmax ? cmax + rb : NULL, FK_NQV);
                continue;
            }
            for (int kk = 0; kk < FK_MK; kk++)
                fk_fill_neginf(ST + (kg + kk) * ldst + rb, c0 * SIMD_W);
            if (c0 < FK_NQV)
                fk_ukr_qk_last(D, krow, s->k_s[3], t->qt + rb * D, ST + kg * ldst + rb, ldst,
                               vscale, FK_NQV - c0);
        }
    }
    if (fk_has_score_mod(s))
        fk_score_mod(t, j0, nkp);
    if (natural && s->bias) {
        /* As in fk_score_mod: a finite score (a softcapped one plus a bias of
         * -FLT_MAX) stays finite in base-2 units; an infinite or NaN one stays so. */
        const simd_f32 vlog2e = simd_set1(SIMD_LOG2E), vinf = simd_set1(INFINITY);
        const simd_f32 vmax = simd_set1(FLT_MAX);
        for (int64_t c = 0; c < nkp; c++)
            for (int64_t r0 = 0; r0 < nr; r0 += SIMD_W) {
                const simd_f32 x = simd_load(ST + c * ldst + r0), y = simd_mul(x, vlog2e);
                const simd_f32 yc = simd_select_lt(simd_abs(y), vinf, y, simd_copysign(vmax, y));
                simd_store(ST + c * ldst + r0, simd_select_lt(simd_abs(x), vinf, yc, y));
            }
    } else if (natural) {
        const simd_f32 vlog2e = simd_set1(SIMD_LOG2E);
        for (int64_t c = 0; c < nkp; c++)
            for (int64_t r0 = 0; r0 < nr; r0 += SIMD_W)
                simd_store(ST + c * ldst + r0, simd_mul(simd_load(ST + c * ldst + r0), vlog2e));
    }
    if (kind == FK_PARTIAL)
        fk_hide(t, j0, nkp);
}

/* ---- Online-softmax update ------------------------------------------------------ */

/* The running max with -inf (a row that has seen nothing yet) raised to -FLT_MAX,
 * so that 2^(S - m) is 2^-inf = 0 for masked scores rather than 2^NaN.
 * The operand order keeps NaN: simd_max returns its second operand when either is
 * NaN, and a NaN max must make its row NaN. */
FK_INLINE simd_f32 fk_max_for_exp(simd_f32 m)
{
    return simd_max(simd_set1(-FLT_MAX), m);
}

/* The max over keys c < nkp of ST[c * ld .. c * ld + SIMD_W - 1], in eight chains:
 * a max is exact in any order, and one chain would wait out the instruction's
 * latency at every key (four chains still did: 2.4% of S2's samples, some 500
 * cycles a 64 x 64 tile where the two max ports need 128). A NaN may be dropped or kept, in one order or
 * another; its row is NaN all the same (see below). */
FK_INLINE simd_f32 fk_col_max(const float *ST, int64_t ld, int64_t nkp)
{
    simd_f32 m0 = simd_set1(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    simd_f32 m4 = m0, m5 = m0, m6 = m0, m7 = m0;
    int64_t c = 0;
    for (; c + 8 <= nkp; c += 8) {
        m0 = simd_max(m0, simd_load(ST + c * ld));
        m1 = simd_max(m1, simd_load(ST + (c + 1) * ld));
        m2 = simd_max(m2, simd_load(ST + (c + 2) * ld));
        m3 = simd_max(m3, simd_load(ST + (c + 3) * ld));
        m4 = simd_max(m4, simd_load(ST + (c + 4) * ld));
        m5 = simd_max(m5, simd_load(ST + (c + 5) * ld));
        m6 = simd_max(m6, simd_load(ST + (c + 6) * ld));
        m7 = simd_max(m7, simd_load(ST + (c + 7) * ld));
    }
    for (; c < nkp; c++)
        m0 = simd_max(m0, simd_load(ST + c * ld));
    return simd_max(simd_max(simd_max(m0, m1), simd_max(m2, m3)),
                    simd_max(simd_max(m4, m5), simd_max(m6, m7)));
}

/* Step 3: with the scores of nkp keys in ST (in base-2 units, fk_scores),
 * m_new = max(m, max_j S_ij), alpha = 2^(m - m_new), P = 2^(S - m_new) in place of
 * S, l = l * alpha + sum_j P (O = O * alpha follows in fk_accumulate): the
 * e^(score - max) of the softmax, since S = score * log2(e). A vector of query
 * rows at a time: every step runs along the key axis, so no horizontal reduction
 * is needed. The max may drop a NaN score (simd_max
 * returns its second operand when either is NaN); that row is NaN all the same,
 * since its P holds exp(NaN) = NaN, which reaches l and O. */
static void fk_softmax_stats(const fk_tile *t, int64_t j0, int64_t nkp, int kind)
{
    const int64_t br = t->br, nr = t->nr;
    float *ST = t->ST, *m = t->m, *l = t->l, *alpha = t->alpha;
    const int fused_max = fk_max_in_scores(t, kind);
    for (int64_t r0 = 0; r0 < nr; r0 += SIMD_W) {
        /* Only the keys these rows, and the rows of every weighted-sum micro-tile
         * they belong to, may see: fk_accumulate reads no further (the rest of ST
         * stays -inf). */
        const int64_t nk = fk_keys_seen(t, j0, nkp, kind, fk_round_up(r0 + SIMD_W, FK_MR));
        const simd_f32 vmax = fused_max ? simd_load(t->cmax + r0) : fk_col_max(ST + r0, br, nk);
        const simd_f32 mold = simd_load(m + r0);
        const simd_f32 mnew = simd_max(mold, vmax);
        const simd_f32 msafe = fk_max_for_exp(mnew);
        simd_store(alpha + r0, simd_exp2_nonpos(simd_sub(mold, msafe)));
        simd_store(m + r0, mnew);
        simd_f32 vsum = simd_zero();
        for (int64_t c = 0; c < nk; c++) {
            simd_f32 p = simd_exp2_nonpos(simd_sub(simd_load(ST + c * br + r0), msafe));
            simd_store(ST + c * br + r0, p);
            vsum = simd_add(vsum, p);
        }
        simd_store(l + r0, simd_fma(simd_load(l + r0), simd_load(alpha + r0), vsum));
    }
}

/* O = O * alpha, row by row where alpha is not 1, for the tiles whose weighted sum
 * takes the plain loop (fk_accumulate_visible); the micro-kernel's path scales O
 * as it loads it (fk_ukr_pv), with the same products. */
static void fk_rescale(const fk_tile *t)
{
    const int64_t nr = t->nr, dvp = t->dvp;
    const float *alpha = t->alpha;
    for (int64_t r = 0; r < nr; r++)
        if (alpha[r] != 1.0f) {
            const simd_f32 va = simd_set1(alpha[r]);
            float *orow = t->O + r * dvp;
            for (int64_t e = 0; e < dvp; e += SIMD_W)
                simd_store(orow + e, simd_mul(simd_load(orow + e), va));
        }
}

/* ---- Accumulate ------------------------------------------------------------------ */

/* Part k of n of the next item's query tile, packed into t->qt_next (its elements
 * d in whole vectors, the tile in n parts as even as they go): one part between
 * each two micro-tiles of the last key tile's weighted sum, so that the loads of
 * q, which wait on the L2 or memory, overlap the products instead of holding up
 * the next item's start (fk_pack_qt there took about 2.3% of S2's time on Zen 4). */
static void fk_pack_ahead(const fk_tile *t, int64_t k, int64_t n)
{
    const int64_t D = t->s->D, vecs = (D + SIMD_W - 1) / SIMD_W;
    const int64_t d0 = k * vecs / n * SIMD_W, d1 = fk_min(D, (k + 1) * vecs / n * SIMD_W);
    if (d1 > d0)
        fk_pack_qt(t->s, t->next_qb, t->next_i0, t->next_nr, t->qt_next, d0, d1);
}

/* Weighted-sum micro-kernel: O[r][c] = O[r][c] * alpha[r] + sum_j PT[j][r] * V[j][c]
 * for r < FK_MR and nv vectors of columns (nv is a constant at each call site),
 * summed over j in increasing order (alpha NULL: every alpha[r] is 1, and O is not
 * multiplied); PT has key stride ldp, V row stride ldv, O row stride ldo. With
 * `out`, the sums are not stored to O but times inv[r] to out (row stride ldout). */
FK_INLINE void fk_ukr_pv(int64_t nkeys, const float *PT, int64_t ldp, const float *V,
                         int64_t ldv, float *O, int64_t ldo, const float *alpha, float *out,
                         int64_t ldout, const float *inv, const int nv)
{
    simd_f32 acc[FK_MR][FK_NV];
    for (int r = 0; r < FK_MR; r++)
        for (int c = 0; c < nv; c++)
            acc[r][c] = simd_load(O + r * ldo + c * SIMD_W);
    if (alpha) /* the online softmax's rescale of these rows, O * alpha, first */
        for (int r = 0; r < FK_MR; r++) {
            const simd_f32 va = simd_set1(alpha[r]);
            for (int c = 0; c < nv; c++)
                acc[r][c] = simd_mul(acc[r][c], va);
        }
    for (int64_t j = 0; j < nkeys; j++) {
        simd_f32 vv[FK_NV];
        for (int c = 0; c < nv; c++)
            vv[c] = simd_load(V + j * ldv + c * SIMD_W);
        for (int r = 0; r < FK_MR; r++) {
            simd_f32 pv = simd_set1(PT[j * ldp + r]);
            for (int c = 0; c < nv; c++)
                acc[r][c] = simd_fma(pv, vv[c], acc[r][c]);
        }
    }
    if (out) /* the item's last key tile: out = O / l straight away (fk_finish's product) */
        for (int r = 0; r < FK_MR; r++) {
            const simd_f32 vinv = simd_set1(inv[r]);
            for (int c = 0; c < nv; c++)
                simd_store(out + r * ldout + c * SIMD_W, simd_mul(acc[r][c], vinv));
        }
    else
        for (int r = 0; r < FK_MR; r++)
            for (int c = 0; c < nv; c++)
                simd_store(O + r * ldo + c * SIMD_W, acc[r][c]);
}

/* O += P V for a PARTIAL tile whose packed values hold an inf or a NaN: a plain
 * loop that skips exactly the masked (i, j) - never a weight because it is 0, since
 * an unmasked key whose weight underflowed to 0 still makes its NaN reach the row
 * (0 * NaN = NaN, as in the reference) - with the same fma per element, in the same
 * order, as the micro-kernel, so that a row the bad value does not reach keeps the
 * bits it would have without it. Such tiles are rare, so speed does not matter. */
static void fk_accumulate_visible(const fk_tile *t, int64_t j0, int64_t nkp)
{
    const attn__sdpa_shapes *s = t->s;
    const int64_t br = t->br, dvp = t->dvp;
    for (int64_t r = 0; r < t->i1 - t->i0; r++)
        for (int64_t c = 0; c < nkp; c++) {
            if (!fk_key_visible(s, t->b, t->h, t->i0 + r, j0 + c))
                continue;
            const simd_f32 pv = simd_set1(t->ST[c * br + r]);
            float *orow = t->O + r * dvp;
            const float *vrow = t->vp + c * dvp;
            for (int64_t e = 0; e < dvp; e += SIMD_W)
                simd_store(orow + e, simd_fma(pv, simd_load(vrow + e), simd_load(orow + e)));
        }
}

/* Step 4: O = O * alpha + P V over the nkp keys from j0, micro-tile by micro-tile;
 * on the item's last key tile, the blocks of rows below rows_out (fk_out_direct)
 * go straight to out as O / l, as fk_finish would write them. Every
 * weight is multiplied, zeros included: a masked key's weight is exactly 0 and its
 * value, in a tile without inf or NaN, finite, so it adds nothing; a tile whose
 * values are not all finite and that masks something takes the plain loop above. */
static void fk_accumulate(const fk_tile *t, int64_t j0, int64_t nkp, int kind,
                          const fk_vtile *vt, int64_t rows_out)
{
    if (vt->nonfinite) {
        fk_rescale(t);
        fk_accumulate_visible(t, j0, nkp);
        return;
    }
    const int64_t br = t->br, dvp = t->dvp, ldout = t->s->o_s[2];
    for (int64_t rb = 0; rb < t->nr; rb += FK_MR) {
        if (t->next_nr)
            fk_pack_ahead(t, rb / FK_MR, t->nr / FK_MR);
        float *out = rb < rows_out ? t->ob + (t->i0 + rb) * ldout : NULL;
        /* The keys these rows may see (fk_keys_seen): past them every weight is 0. */
        const int64_t nk = fk_keys_seen(t, j0, nkp, kind, rb + FK_MR);
        /* The rescale by alpha rides on the micro-kernel's loads of O, and only
         * when some row of the block moved its max (x * 1 is x, so skipping it
         * where every alpha is 1 changes no bit). */
        int moved = 0;
        for (int r = 0; r < FK_MR; r++)
            moved |= t->alpha[rb + r] != 1.0f;
        const float *alpha = moved ? t->alpha + rb : NULL;
        int64_t e = 0;
        for (; e + FK_NV * SIMD_W <= dvp; e += FK_NV * SIMD_W)
            fk_ukr_pv(nk, t->ST + rb, br, vt->v + e, vt->ldv, t->O + rb * dvp + e, dvp, alpha,
                      out ? out + e : NULL, ldout, t->inv + rb, FK_NV);
        for (; e < dvp; e += SIMD_W)
            fk_ukr_pv(nk, t->ST + rb, br, vt->v + e, vt->ldv, t->O + rb * dvp + e, dvp, alpha,
                      out ? out + e : NULL, ldout, t->inv + rb, 1);
    }
}

/* ---- Finish ----------------------------------------------------------------------- */

/* Step 5: out = O / l for the tile's rows, the log-sum-exp m + log(l) when asked
 * for, and the first empty row recorded for the worker. l = 0 (never with a sink,
 * which starts l at 1) has two causes: the row may attend to no key (empty: an
 * error, or zeros), or every key it may attend to scored -inf, where the
 * reference's softmax is exp(-inf - -inf) = NaN; the mask tells them apart, as in
 * the reference. A row whose keys are all hidden has O = 0: with a sink it gives
 * zeros and a log-sum-exp of m + log(1) = sink, as the contract says, and no error;
 * without one, zeros (or the error) and -inf. fk_finish_rows decides 1 / l (inv),
 * the log-sum-exp and the empty rows; fk_finish also writes out. */
static void fk_finish_rows(const attn__fused_job *job, const fk_tile *t, int worker)
{
    const attn__sdpa_shapes *s = t->s;
    float *l = t->l, *inv = t->inv;
    int64_t empty = INT64_MAX;
    for (int64_t r = 0; r < t->nr; r++)
        inv[r] = l[r] == 0.0f ? 0.0f : 1.0f / l[r];
    for (int64_t r = 0; r < t->i1 - t->i0; r++) {
        const int64_t i = t->i0 + r;
        float lse = t->sink; /* an empty row's: -inf without sinks */
        if (l[r] == 0.0f) {
            if (fk_row_sees_a_key(s, t->b, t->h, i))
                inv[r] = lse = NAN;
            else if (empty == INT64_MAX && !s->sinks)
                empty = (t->b * s->H + t->h) * s->Tq + i;
        } else if (s->lse) {
            /* Only when asked for: it is a call to libm per row, 64 an item,
             * part of the item's fixed cost (fk_pack_qt, docs/performance.md).
             * m in base-2 units goes back by a factor ln 2, except a max that is
             * still the sink's, which is the sink itself, exactly. */
            /* A max of +-FLT_MAX is a bias beyond FLT_MAX / log2(e) kept finite
             * (fk_score_mod): the reference's lse there is +-FLT_MAX too (a bias
             * of torch.finfo's min on every key), not FLT_MAX ln 2. */
            const float m = !t->log2_units ? t->m[r]
                            : t->m[r] == t->sink_m ? t->sink
                            : fabsf(t->m[r]) == FLT_MAX ? t->m[r]
                                                   : t->m[r] * 0.693147180559945309f;
            lse = m + logf(l[r]);
        }
        if (s->lse)
            s->lse[t->b * s->lse_s[0] + t->h * s->lse_s[1] + i * s->lse_s[2]] = lse;
    }
    if (empty < job->empty_first[worker])
        job->empty_first[worker] = empty;
}

/* out = O / l for the tile's rows from r0 (fk_finish_rows has set inv). */
static void fk_finish_out(const fk_tile *t, int64_t r0)
{
    const attn__sdpa_shapes *s = t->s;
    const int64_t Dv = s->Dv, dvp = t->dvp;
    const float *inv = t->inv;
    for (int64_t r = r0; r < t->i1 - t->i0; r++) {
        const int64_t i = t->i0 + r;
        float *orow = t->ob + i * s->o_s[2];
        const float *acc = t->O + r * dvp;
        if (s->o_s[3] == 1) {
            int64_t e = 0;
            const simd_f32 vinv = simd_set1(inv[r]);
            for (; e + SIMD_W <= Dv; e += SIMD_W)
                simd_store(orow + e, simd_mul(simd_load(acc + e), vinv));
            for (; e < Dv; e++)
                orow[e] = acc[e] * inv[r];
        } else {
            for (int64_t e = 0; e < Dv; e++)
                orow[e * s->o_s[3]] = acc[e] * inv[r];
        }
    }
}

static void fk_finish(const attn__fused_job *job, const fk_tile *t, int worker)
{
    fk_finish_rows(job, t, worker);
    fk_finish_out(t, 0);
}

/* How many of the tile's rows, in whole blocks of FK_MR, the last key tile's
 * weighted sum may write to out itself: those blocks whose rows are all real
 * (below Tq), when out's rows are unit-stride and the padded value width is Dv
 * (the micro-kernel writes whole vectors); 0 otherwise. Writing out there rather
 * than from O in a pass of its own saves reading O back, and spreads out's stores
 * (whose cache lines are usually not yet in cache) among the products. */
static int64_t fk_out_direct(const fk_tile *t)
{
    const attn__sdpa_shapes *s = t->s;
    if (s->o_s[3] != 1 || t->dvp != s->Dv)
        return 0;
    return (t->i1 - t->i0) / FK_MR * FK_MR;
}

/* ---- Write weights ------------------------------------------------------------------ */

/* Step 6, only when the weights are wanted: each key tile's scores recomputed and
 * 2^(S - m) / l (S and m in base-2 units) written straight into the caller's
 * weights. A hidden tile gets
 * 0 * (1 / l): zero, except in a NaN row, where the reference's 0 / NaN is NaN too. */
static void fk_write_weights(const attn__fused_job *job, const fk_tile *t)
{
    const attn__sdpa_shapes *s = t->s;
    const int64_t br = t->br, bc = t->bc, i0 = t->i0, i1 = t->i1;
    float *wb = job->weights + t->b * s->w_s[0] + t->h * s->w_s[1];
    float *ST = t->ST;
    for (int64_t j0 = 0; j0 < s->Tk; j0 += bc) {
        const int64_t j1 = fk_min(j0 + bc, s->Tk);
        const int64_t nkp = fk_round_up(j1 - j0, FK_MK);
        const int kind = fk_tile_kind(s, t->b, t->h, i0, i1, j0, j1, nkp);
        if (kind == FK_SKIP) {
            for (int64_t i = i0; i < i1; i++)
                for (int64_t j = j0; j < j1; j++)
                    wb[i * s->w_s[2] + j * s->w_s[3]] = 0.0f * t->inv[i - i0];
            continue;
        }
        fk_scores(t, j0, nkp, kind);
        for (int64_t r0 = 0; r0 < t->nr; r0 += SIMD_W) {
            const simd_f32 msafe = fk_max_for_exp(simd_load(t->m + r0));
            const simd_f32 vinv = simd_load(t->inv + r0);
            for (int64_t c = 0; c < nkp; c++)
                simd_store(ST + c * br + r0,
                           simd_mul(simd_exp2_nonpos(simd_sub(simd_load(ST + c * br + r0), msafe)),
                                    vinv));
        }
        for (int64_t r = 0; r < i1 - i0; r++) {
            float *wrow = wb + (i0 + r) * s->w_s[2];
            for (int64_t j = j0; j < j1; j++)
                wrow[j * s->w_s[3]] = ST[(j - j0) * br + r];
        }
    }
}

/* ---- Ahead of the data ------------------------------------------------------------- */

/* Cache lines asked for at the start of each 4 KiB page by fk_prime. */
#define FK_PRIME_LINES 2
/* A line asked for to be written (into L2); FK_PREFETCH_L2 (fused_split.h) to be
 * read. Without the GCC/Clang builtin, neither does anything. */
#if defined(__GNUC__) || defined(__clang__)
#define FK_PREFETCH_W(p) __builtin_prefetch((p), 1, 2)
#else
#define FK_PREFETCH_W(p) ((void)(p))
#endif

/* Asks the L2 for the first FK_PRIME_LINES cache lines of every 4 KiB page of
 * [p, p + bytes) (`write`: to be written). Why only those: asking for every line
 * of a 16 KiB tile measured slower than two a page (and, for the item's own query
 * rows, moved the wait into the prefetch loop), which fits the core's own requests,
 * software prefetches included, each holding one of its few L1 fill buffers until
 * the line arrives; two requests in a page are enough to set the L2's own
 * streaming prefetcher, which works page by page, on the rest. Nothing is read
 * here, so nothing changes a bit of the result. */
static void fk_prime(const void *p, int64_t bytes, int write)
{
    const uintptr_t end = (uintptr_t)p + (uintptr_t)bytes;
    for (uintptr_t page = (uintptr_t)p; page < end; page = (page | 4095) + 1)
        for (uintptr_t a = page; a < end && a < page + 64 * FK_PRIME_LINES; a += 64) {
            if (write)
                FK_PREFETCH_W((const void *)a);
            else
                FK_PREFETCH_L2((const void *)a);
        }
}

/* The key tile from j0 of the item's K and V, when their rows are contiguous
 * (rows of other layouts lie apart, one short stream each, which this does not
 * help). */
static void fk_prime_kv(const attn__sdpa_shapes *s, const float *kb, const float *vb,
                        int64_t j0, int64_t bc)
{
    const int64_t n = fk_min(bc, s->Tk - j0);
    if (n <= 0)
        return;
    if (s->k_s[3] == 1 && s->k_s[2] == s->D)
        fk_prime(kb + j0 * s->D, n * s->D * (int64_t)sizeof(float), 0);
    if (s->v_s[3] == 1 && s->v_s[2] == s->Dv)
        fk_prime(vb + j0 * s->Dv, n * s->Dv * (int64_t)sizeof(float), 0);
}

/* What the item's next steps will first touch, asked for one key tile ahead (the
 * time of a tile's products covers a fetch from memory): before each key tile but
 * the last, the next one's K and V; before the last, this item's out rows, which
 * its weighted sum then writes, and item `next`'s query rows and first key tile:
 * the item this worker runs next (fk_tile_worker claims it just before), or item
 * + 1 when the caller hands out the items (the next one when it runs alone; with
 * more workers item + 1 may already run elsewhere). Items run head by head
 * (fk_tile_begin), so that first key tile is in memory only when `next` starts a
 * head. The figures are in docs/performance.md (the float32 forward's sixth and
 * seventh sessions). A worker that claims its items also asks for every line of
 * `next`'s query rows during the last tile's score product and packs them during
 * its weighted sum (fk_ask_ahead, fk_pack_ahead; the eighth session). */
static void fk_prime_next(const attn__fused_job *job, const fk_tile *t, int64_t next,
                          int64_t jn, int64_t j_end)
{
    const attn__sdpa_shapes *s = t->s;
    if (jn < j_end) {
        fk_prime_kv(s, t->kb, t->vb, jn, t->bc);
        return;
    }
    if (s->o_s[3] == 1 && s->o_s[2] == s->Dv)
        fk_prime(t->ob + t->i0 * s->Dv, (t->i1 - t->i0) * s->Dv * (int64_t)sizeof(float), 1);
    if (next < 0 || next >= s->B * s->H * job->n_qt)
        return;
    /* Item numbering as in fk_tile_begin. */
    const int64_t bh = next / job->n_qt;
    const int64_t i0 = (job->n_qt - 1 - next % job->n_qt) * job->br;
    const int64_t b = bh / s->H, h = bh % s->H;
    if (s->q_s[3] == 1 && s->q_s[2] == s->D)
        fk_prime(job->q + b * s->q_s[0] + h * s->q_s[1] + i0 * s->D,
                 fk_min(job->br, s->Tq - i0) * s->D * (int64_t)sizeof(float), 0);
    int64_t kvb, kvh, lo, hi;
    fk_kv_head(s, b, h, &kvb, &kvh);
    fk_row_range(s, i0, &lo, &hi);
    fk_prime_kv(s, job->k + kvb * s->k_s[0] + kvh * s->k_s[1],
                job->v + kvb * s->v_s[0] + kvh * s->v_s[1], lo / job->bc * job->bc, job->bc);
}

/* ---- The item ------------------------------------------------------------------------- */

/* Sets t up to pack item `next`'s query tile during its last weighted sum
 * (fk_pack_ahead); item numbering as in fk_tile_begin. */
static void fk_ahead_item(const attn__fused_job *job, fk_tile *t, int64_t next)
{
    const attn__sdpa_shapes *s = t->s;
    const int64_t bh = next / job->n_qt;
    const int64_t i0 = (job->n_qt - 1 - next % job->n_qt) * job->br;
    const int64_t b = bh / s->H, h = bh % s->H;
    t->next_qb = job->q + b * s->q_s[0] + h * s->q_s[1];
    t->next_i0 = i0;
    t->next_nr = fk_round_up(fk_min(i0 + job->br, s->Tq) - i0, FK_QW);
}

/* From key tile *j0 on (multiples of bc), the first that is not SKIP: moves *j0 to
 * it (to j_end or past when none is left) and returns its kind. */
static int fk_next_tile(const fk_tile *t, int64_t *j0, int64_t j_end)
{
    const attn__sdpa_shapes *s = t->s;
    for (; *j0 < j_end; *j0 += t->bc) {
        const int64_t j1 = fk_min(*j0 + t->bc, s->Tk);
        const int kind = fk_tile_kind(s, t->b, t->h, t->i0, t->i1, *j0, j1,
                                      fk_round_up(j1 - *j0, FK_MK));
        if (kind != FK_SKIP)
            return kind;
    }
    return FK_SKIP;
}

/* One (b, h, query tile), in the steps above. With `claim`, the worker takes its
 * next item from it when it reaches this item's last key tile and returns it (-1
 * when the item had no key tile to compute, so claimed none); without, it returns
 * -1 and asks the L2 for item + 1's data. */
static int64_t fk_tile_run(const attn__fused_job *job, int64_t item, int worker,
                           _Atomic int64_t *claim)
{
    const attn__sdpa_shapes *s = job->s;
    int64_t next = -1;
    fk_tile t;
    fk_tile_begin(job, item, worker, claim != NULL, &t);
    /* Only the key tiles that meet [lo(i0), hi(i1 - 1)), the keys the causal
     * alignment and the window let these rows see; tiles start at multiples of bc
     * whatever that range, so the summation order depends on the shapes only. */
    int64_t j_begin, j_end, lo, hi;
    fk_row_range(s, t.i0, &j_begin, &hi);
    fk_row_range(s, t.i1 - 1, &lo, &j_end);
    /* Each key tile's kind is known one tile ahead, so that the last tile the item
     * computes can write out itself (fk_out_direct). */
    int64_t j0 = j_begin / t.bc * t.bc, done = -1;
    int kind = fk_next_tile(&t, &j0, j_end);
    while (j0 < j_end) {
        const int64_t j1 = fk_min(j0 + t.bc, s->Tk);
        const int64_t nkp = fk_round_up(j1 - j0, FK_MK);
        int64_t jn = j0 + t.bc;
        const int kind_next = fk_next_tile(&t, &jn, j_end);
        const fk_vtile vt = fk_value_tile(&t, j0, nkp, kind);
        if (jn >= j_end)
            next = claim ? atomic_fetch_add_explicit(claim, 1, memory_order_relaxed)
                         : item + 1;
        fk_prime_next(job, &t, next, jn, j_end);
        if (jn >= j_end && claim && next < job->n_items && !vt.nonfinite)
            fk_ahead_item(job, &t, next);
        fk_scores(&t, j0, nkp, kind);
        fk_softmax_stats(&t, j0, nkp, kind);
        int64_t rows_out = 0;
        if (jn >= j_end && !vt.nonfinite) {
            /* The last tile: l and m are final, so 1 / l is known before the sum. */
            fk_finish_rows(job, &t, worker);
            rows_out = fk_out_direct(&t);
            done = rows_out;
        }
        fk_accumulate(&t, j0, nkp, kind, &vt, rows_out);
        if (t.next_nr) { /* the next item's query tile is ready */
            t.ahead[0] = next;
            t.ahead[1] = t.qt_next_index;
            t.next_nr = 0;
        }
        j0 = jn;
        kind = kind_next;
    }
    if (done < 0)
        fk_finish(job, &t, worker);
    else
        fk_finish_out(&t, done);
    if (job->weights)
        fk_write_weights(job, &t);
    return claim ? next : -1;
}

/* One item for a caller that hands out the items (attn__parallel_for, the batch). */
static void fk_tile_item(void *arg, int64_t item, int worker)
{
    fk_tile_run((const attn__fused_job *)arg, item, worker, NULL);
}

/* One worker's items of a job whose workers take them from job->claim themselves.
 * A worker asks for its next item at the start of its current item's last key
 * tile, not after it, so that fk_prime_next asks the L2 for the item it will in
 * fact run: with one counter and two workers that is usually item + 2, not the
 * item + 1 another worker is already running. Which worker runs an item never
 * changes its bits (each item writes its own rows alone). The cost is at the end
 * of a call: a worker may hold a claimed item for one key tile while another finds
 * the counter empty; the last items of each head are its lightest (fk_tile_begin). */
static void fk_tile_worker(const attn__fused_job *job, int worker)
{
    /* No query tile is packed ahead yet (the scratch may hold a past call's). */
    ((int64_t *)(void *)(job->ws + (int64_t)worker * job->ws_floats))[0] = -1;
    int64_t item = atomic_fetch_add_explicit(job->claim, 1, memory_order_relaxed);
    while (item < job->n_items) {
        const int64_t next = fk_tile_run(job, item, worker, job->claim);
        item = next >= 0 ? next : atomic_fetch_add_explicit(job->claim, 1, memory_order_relaxed);
    }
}

#endif /* ATTN_FUSED_TILE_H */
