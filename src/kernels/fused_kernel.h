/*
 * fused_kernel.h - the body of the fused attention kernel, written once over the
 * SIMD layer of src/kernels/simd.h and compiled once per instruction set by
 * src/kernels/sdpa_fused.c (portable C), src/kernels/sdpa_fused_avx2.c and src/kernels/sdpa_fused_avx512.c.
 * Not a public header; it is included only by those three files, each of which
 * defines ATTN_SIMD_<ISA> and the micro-tile sizes
 *
 *     FK_MK   keys per micro-tile of the score product
 *     FK_NQV  vectors of query rows per micro-tile of the score product
 *     FK_MR   query rows per micro-tile of the weighted sum
 *     FK_NV   vectors of value columns per micro-tile of the weighted sum
 *
 * and then exports fk_ws_floats, fk_item and fk_exp_nonpos (below) through an
 * attn__fused_kernel.
 *
 * THE CONTRACT
 *
 * What it computes: for one (b, h) and a tile of query rows i0 .. i1-1, with the
 * online softmax of Milakov and Gimelshein (arXiv 1805.02867) in the tiled form of
 * FlashAttention (Dao et al., arXiv 2205.14135; loop order of FlashAttention-2,
 * arXiv 2307.08691: the query tile is the outer loop and owns its output):
 *
 *     m_i = -inf, l_i = 0, O_i = 0                      for every row i of the tile
 *     for each key tile j0 .. j1-1 that is not hidden entirely:
 *         S = (Q K^T) * scale, masked entries = -inf    [bc, br] in scratch
 *         m_new = max(m_i, max_j S_ij)
 *         P_ij = exp(S_ij - m_new)                      exactly 0 where masked
 *         l_i = l_i * exp(m_i - m_new) + sum_j P_ij
 *         O_i = O_i * exp(m_i - m_new) + P V            [br, Dv] in scratch
 *         m_i = m_new
 *     out_i = O_i / l_i; a row with l_i = 0 saw no key: empty (error or zeros)
 *
 * The running max starts at -INFINITY, never at a large negative number, so a
 * masked score never leaks weight, and 1/l is taken only when l > 0.
 *
 * Layout: the scores are kept transposed, key-major ([bc][br]), with query rows
 * along the vector lanes. The score micro-kernel then broadcasts key elements
 * straight from the caller's K (any strides, never copied) against the query tile,
 * which is packed once per item as Q^T micro-panels [br/FK_QW][D][FK_QW]; and
 * every softmax step (max, exp, sum, the correction factor) runs along the key
 * axis, a vector of query rows at a time, with no horizontal reduction. The
 * weighted-sum micro-kernel broadcasts P^T entries and loads rows of V: in place
 * for whole unmasked tiles with unit-stride rows of a multiple of the vector
 * width, else from a packed copy [bc][dvp].
 *
 * Tile sizes: br = 64 query rows and bc = 64 keys (the planner in sdpa_fused.c
 * shrinks them to the problem when it is smaller, rounded up to FK_QW and FK_MK).
 * Scratch per worker, caller-allocated, never allocated here: Q^T [br][D], the
 * value tile [bc][dvp], the scores/weights [bc][br], the output accumulator
 * [br][dvp] and m, l, the correction factor and 1/l, [br] each. With D = Dv = 64
 * that is about 65 KiB, which stays in L2 while the key tiles stream.
 *
 * Tails: micro-kernels only ever see whole micro-tiles. Query rows past Tq are
 * packed as zeros (computed, never written); keys past Tk re-read the last key
 * (valid memory) and their scores are set to -inf; value columns past Dv are zeros
 * in the packed copy (dvp = Dv rounded up to the vector width), and a tile with
 * such columns or missing keys always uses the packed copy. The head dim D is the
 * reduction axis of the score product and needs no padding.
 *
 * Masks: each key tile is classified once per query tile (fk_tile_kind): SKIP when
 * the causal flag or the explicit mask hides every (i, j) of it - it is then never
 * loaded; FULL when nothing in it is hidden - no mask work at all; PARTIAL
 * otherwise - the mask (any numpy-broadcast boolean view, read through
 * attn__mask4's strides) and the causal flag are applied element by element after
 * the scale. Scores are scaled before masking so that any scale, even a negative
 * one, leaves masked entries at -inf.
 *
 * Work items: one item is (b, h, query tile); items are independent and each
 * writes only its own rows of out (and weights), so the result does not depend on
 * which thread runs an item or how many threads there are. Query tile boundaries
 * depend only on the shapes, never on the thread count.
 *
 * Weights: only when asked for; after the output pass, the item recomputes each
 * key tile's scores and writes exp(S - m_i) / l_i straight into the caller's
 * weights (zeros for hidden tiles and empty rows). No [Tq, Tk] scratch is used.
 *
 * The row path (job->row_path) serves problems with a handful of query rows
 * (ATTN__FUSED_ROW_MAX in sdpa_fused.h), such as one decoding step against a cache
 * (S5) or the chapter's toy size: one item is one (b, h) and its few query rows;
 * K and V rows are read in place (unit stride along the head dim required) in two
 * streaming passes, the rows' scores kept in a [Tq][Tk] scratch block (Tq <= 8),
 * so the bandwidth goes to K and V only. Tails along D and Dv use partial vector
 * loads.
 *
 * Room to grow: the (b, h) of K and V is looked up in one place per item
 * (fk_kv_head), so fewer key/value heads than query heads (GQA/MQA) is a change
 * there; a key/value cache is a K/V view longer than the query (Tq < Tk, already
 * allowed); a causal mask aligned to the bottom right is an offset (Tk - Tq) in
 * fk_causal_limit and in the causal loop of fk_scores.
 */
#ifndef ATTN_FUSED_KERNEL_H
#define ATTN_FUSED_KERNEL_H

#include "sdpa_fused.h"
#include "simd.h"

#include <float.h>
#include <math.h>

#if !defined(FK_MR) || !defined(FK_NV) || !defined(FK_MK) || !defined(FK_NQV)
#error "define FK_MR, FK_NV, FK_MK and FK_NQV before including fused_kernel.h"
#endif

/* Query rows per micro-tile of the score product, along the vector lanes. */
#define FK_QW (FK_NQV * SIMD_W)
/* Vectors of value columns the row path keeps in registers. */
#define FK_ROW_NV 8

#if defined(__GNUC__) || defined(__clang__)
#define FK_INLINE static inline __attribute__((always_inline))
#else
#define FK_INLINE static inline
#endif

enum { FK_SKIP = 0, FK_FULL = 1, FK_PARTIAL = 2 };

static int64_t fk_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static int64_t fk_min(int64_t a, int64_t b) { return a < b ? a : b; }
/* Scratch sub-buffers start on 64-byte boundaries relative to the worker's base. */
static int64_t fk_align(int64_t n) { return fk_round_up(n, 16); }

static int64_t fk_ws_floats(const attn__fused_job *job)
{
    const attn__sdpa_shapes *s = job->s;
    if (job->row_path)
        return s->Tq * (fk_align(s->D) + fk_align(s->Tk)) + fk_align(job->dvp);
    return fk_align(job->br * s->D) + fk_align(job->bc * job->dvp) +
           fk_align(job->bc * job->br) + fk_align(job->br * job->dvp) +
           4 * fk_align(job->br);
}

/* The key/value head that query head (b, h) reads: h / (H / Hkv) (grouped-query
 * attention; MQA when Hkv = 1), read in place. */
static void fk_kv_head(const attn__sdpa_shapes *s, int64_t b, int64_t h, int64_t *kb,
                       int64_t *kh)
{
    *kb = b;
    *kh = h / s->group;
}

/* The last key query i may see under the causal flag, plus one (top-left aligned,
 * as SPEC says: position t sees 0..t). */
static int64_t fk_causal_limit(const attn__sdpa_shapes *s, int64_t i)
{
    return fk_min(s->Tk, i + 1);
}

/* How many (i, j) of rows [i0, i1) x keys [j0, j1) the mask and the causal flag
 * let through. */
static int64_t fk_mask_allowed(const attn__sdpa_shapes *s, int64_t b, int64_t h, int64_t i0,
                               int64_t i1, int64_t j0, int64_t j1)
{
    int64_t allowed = 0;
    const int64_t ms3 = s->mask.stride[3];
    if (s->mask.stride[2] == 0 && j1 - j0 <= 64) {
        /* The same row for every query (a padding mask [B, 1, 1, Tk]): count it
         * once, as prefix sums, and read each row's causal span from them. */
        int64_t prefix[65];
        const uint8_t *mrow = s->mask.data + attn__off4(s->mask.stride, b, h, 0, 0);
        prefix[0] = 0;
        for (int64_t j = j0; j < j1; j++)
            prefix[j - j0 + 1] = prefix[j - j0] + (mrow[j * ms3] != 0);
        for (int64_t i = i0; i < i1; i++) {
            const int64_t je = s->causal ? fk_min(j1, fk_causal_limit(s, i)) : j1;
            allowed += je > j0 ? prefix[je - j0] : 0;
        }
        return allowed;
    }
    for (int64_t i = i0; i < i1; i++) {
        const uint8_t *mrow = s->mask.data + attn__off4(s->mask.stride, b, h, i, 0);
        const int64_t je = s->causal ? fk_min(j1, fk_causal_limit(s, i)) : j1;
        for (int64_t j = j0; j < je; j++)
            allowed += mrow[j * ms3] != 0;
    }
    return allowed;
}

/* Classifies the tile rows [i0, i1) x keys [j0, j1); nkp is the padded key count. */
static int fk_tile_kind(const attn__sdpa_shapes *s, int64_t b, int64_t h, int64_t i0,
                        int64_t i1, int64_t j0, int64_t j1, int64_t nkp)
{
    if (s->causal && j0 >= fk_causal_limit(s, i1 - 1))
        return FK_SKIP;
    int partial = (j1 - j0 != nkp);
    if (s->causal && j1 > fk_causal_limit(s, i0))
        partial = 1;
    if (!s->mask.data)
        return partial ? FK_PARTIAL : FK_FULL;
    const int64_t allowed = fk_mask_allowed(s, b, h, i0, i1, j0, j1);
    if (allowed == 0)
        return FK_SKIP;
    if (allowed != (i1 - i0) * (j1 - j0))
        partial = 1;
    return partial ? FK_PARTIAL : FK_FULL;
}

/* Query rows i0 .. i0+nr-1, transposed into micro-panels [nr/FK_QW][D][FK_QW], so
 * that query rows lie along the vector lanes; rows past Tq are zeros. */
static void fk_pack_qt(const attn__sdpa_shapes *s, const float *qb, int64_t i0,
                       int64_t nr, float *qt)
{
    const int64_t D = s->D, rows = fk_min(nr, s->Tq - i0);
    /* Panel by panel, d outer: the writes run contiguously (FK_QW floats a d) and
     * the strided reads stay within the panel's rows, which fit in L1. */
    for (int64_t p0 = 0; p0 < nr; p0 += FK_QW) {
        float *panel = qt + p0 * D;
        const int64_t live = fk_min(FK_QW, rows - p0); /* may be <= 0 */
        for (int64_t d = 0; d < D; d++) {
            float *dst = panel + d * FK_QW;
            const float *src = qb + (i0 + p0) * s->q_s[2] + d * s->q_s[3];
            int64_t r = 0;
            for (; r < live; r++)
                dst[r] = src[r * s->q_s[2]];
            for (; r < FK_QW; r++)
                dst[r] = 0.0f;
        }
    }
}

/* Values of keys j0 .. j0+nkp-1 into [nkp][dvp]; keys past Tk and columns past Dv
 * are zeros. With `check`, returns 1 when a value is not finite (inf or NaN), so
 * that the caller can keep a masked key's value out of the output (0 * inf is
 * NaN). */
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
                chk1 += vdst[e] * 0.0f;
            }
        }
        for (; e < dvp; e++)
            vdst[e] = 0.0f;
    }
    chk1 += simd_hsum(chk);
    return chk1 != chk1;
}

/* Score micro-kernel, transposed: ST[kk][c] = (sum_d k_kk[d] * qt[d][c]) * scale for
 * FK_MK keys kk (key rows read in place at krow[kk], element stride ks, broadcast
 * one element at a time) and FK_QW query rows c (qt, a packed micro-panel
 * [D][FK_QW]), summed over d in increasing order; ST has key stride ldst. */
FK_INLINE void fk_ukr_qk(int64_t D, const float *const *krow, int64_t ks, const float *qt,
                         float *ST, int64_t ldst, simd_f32 vscale)
{
    simd_f32 acc[FK_MK][FK_NQV];
    for (int kk = 0; kk < FK_MK; kk++)
        for (int c = 0; c < FK_NQV; c++)
            acc[kk][c] = simd_zero();
    for (int64_t d = 0; d < D; d++) {
        simd_f32 qv[FK_NQV];
        for (int c = 0; c < FK_NQV; c++)
            qv[c] = simd_load(qt + d * FK_QW + c * SIMD_W);
        for (int kk = 0; kk < FK_MK; kk++) {
            simd_f32 kv = simd_set1(krow[kk][d * ks]);
            for (int c = 0; c < FK_NQV; c++)
                acc[kk][c] = simd_fma(kv, qv[c], acc[kk][c]);
        }
    }
    for (int kk = 0; kk < FK_MK; kk++)
        for (int c = 0; c < FK_NQV; c++)
            simd_store(ST + kk * ldst + c * SIMD_W, simd_mul(acc[kk][c], vscale));
}

/* Weighted-sum micro-kernel: O[r][c] += sum_j PT[j][r] * V[j][c] for r < FK_MR and
 * nv vectors of columns (nv is a constant at each call site), summed over j in
 * increasing order; PT has key stride ldp, V row stride ldv, O row stride ldo. */
FK_INLINE void fk_ukr_pv(int64_t nkeys, const float *PT, int64_t ldp, const float *V,
                         int64_t ldv, float *O, int64_t ldo, const int nv)
{
    simd_f32 acc[FK_MR][FK_NV];
    for (int r = 0; r < FK_MR; r++)
        for (int c = 0; c < nv; c++)
            acc[r][c] = simd_load(O + r * ldo + c * SIMD_W);
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
    for (int r = 0; r < FK_MR; r++)
        for (int c = 0; c < nv; c++)
            simd_store(O + r * ldo + c * SIMD_W, acc[r][c]);
}

/* ST [nkp][ldst] = (K Q^T) * scale for nkp keys from j0 and nr query rows from i0,
 * then the mask for PARTIAL tiles (keys past Tk count as masked). */
static void fk_scores(const attn__sdpa_shapes *s, int64_t b, int64_t h, int64_t i0,
                      int64_t nr, int64_t j0, int64_t nkp, int kind, const float *qt,
                      const float *kb, float *ST, int64_t ldst)
{
    const int64_t D = s->D;
    const simd_f32 vscale = simd_set1(s->scale);
    for (int64_t kg = 0; kg < nkp; kg += FK_MK) {
        const float *krow[FK_MK];
        for (int kk = 0; kk < FK_MK; kk++) {
            /* Keys past Tk repeat the last key (valid memory); they are masked below. */
            const int64_t j = fk_min(j0 + kg + kk, s->Tk - 1);
            krow[kk] = kb + j * s->k_s[2];
        }
        for (int64_t rb = 0; rb < nr; rb += FK_QW)
            fk_ukr_qk(D, krow, s->k_s[3], qt + rb * D, ST + kg * ldst + rb, ldst, vscale);
    }
    if (kind != FK_PARTIAL)
        return;
    const int64_t rows = fk_min(nr, s->Tq - i0); /* real query rows */
    for (int64_t c = 0; c < nkp; c++) {
        const int64_t j = j0 + c;
        float *strow = ST + c * ldst;
        if (j >= s->Tk) {
            for (int64_t r = 0; r < nr; r++)
                strow[r] = -INFINITY;
            continue;
        }
        int64_t r = 0;
        if (s->causal) /* key j is hidden from the query rows i with i + 1 <= j */
            for (const int64_t rc = fk_min(rows, j - i0); r < rc; r++)
                strow[r] = -INFINITY;
        if (s->mask.data) {
            const uint8_t *mcol = s->mask.data + attn__off4(s->mask.stride, b, h, i0, j);
            const int64_t ms2 = s->mask.stride[2];
            if (ms2 == 0) { /* one value for the whole column */
                if (!mcol[0])
                    for (; r < rows; r++)
                        strow[r] = -INFINITY;
            } else {
                for (; r < rows; r++)
                    if (!mcol[r * ms2])
                        strow[r] = -INFINITY;
            }
        }
    }
}

/* The running max with -inf (a row that has seen nothing yet) raised to -FLT_MAX,
 * so that exp(S - m) is exp(-inf) = 0 for masked scores rather than exp(NaN).
 * The operand order keeps NaN: simd_max returns its second operand when either is
 * NaN, and a NaN max must make its row NaN. */
FK_INLINE simd_f32 fk_max_for_exp(simd_f32 m)
{
    return simd_max(simd_set1(-FLT_MAX), m);
}

/* One (b, h, query tile). */
static void fk_tile_item(void *arg, int64_t item, int worker)
{
    const attn__fused_job *job = (const attn__fused_job *)arg;
    const attn__sdpa_shapes *s = job->s;
    /* Items go head by head, so that consecutive items reuse the head's K and V
     * from cache; within a head the last query tiles come first, since under the
     * causal mask they are the heaviest and the light ones then fill the tail. */
    const int64_t bh = item / job->n_qt;
    const int64_t qt_index = job->n_qt - 1 - item % job->n_qt;
    const int64_t b = bh / s->H, h = bh % s->H;
    const int64_t D = s->D, Dv = s->Dv, br = job->br, bc = job->bc, dvp = job->dvp;
    const int64_t i0 = qt_index * br, i1 = fk_min(i0 + br, s->Tq);
    const int64_t nr = fk_round_up(i1 - i0, FK_QW);

    float *ws = job->ws + (int64_t)worker * job->ws_floats;
    float *qt = ws;                      /* [nr/FK_QW][D][FK_QW] */
    float *vp = qt + fk_align(br * D);   /* [bc][dvp] */
    float *ST = vp + fk_align(bc * dvp); /* [bc][br]: scores, then weights, key-major */
    float *O = ST + fk_align(bc * br);   /* [br][dvp] */
    float *m = O + fk_align(br * dvp);   /* [br] running max */
    float *l = m + fk_align(br);         /* [br] running sum */
    float *alpha = l + fk_align(br);     /* [br] this tile's correction factor */
    float *inv = alpha + fk_align(br);   /* [br] 1 / l, or 0 for an empty row */

    int64_t kb_, kh_;
    fk_kv_head(s, b, h, &kb_, &kh_);
    const float *qb = job->q + b * s->q_s[0] + h * s->q_s[1];
    const float *kb = job->k + kb_ * s->k_s[0] + kh_ * s->k_s[1];
    const float *vb = job->v + kb_ * s->v_s[0] + kh_ * s->v_s[1];
    float *ob = job->out + b * s->o_s[0] + h * s->o_s[1];

    fk_pack_qt(s, qb, i0, nr, qt);
    for (int64_t r = 0; r < nr; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        for (int64_t e = 0; e < dvp; e++)
            O[r * dvp + e] = 0.0f;
    }

    const int64_t j_end = s->causal ? fk_causal_limit(s, i1 - 1) : s->Tk;
    for (int64_t j0 = 0; j0 < j_end; j0 += bc) {
        const int64_t j1 = fk_min(j0 + bc, s->Tk);
        const int64_t nkp = fk_round_up(j1 - j0, FK_MK);
        const int kind = fk_tile_kind(s, b, h, i0, i1, j0, j1, nkp);
        if (kind == FK_SKIP)
            continue;
        /* V is read in place when the tile is whole, nothing in it is masked (so no
         * masked value can leak) and rows are unit-stride multiples of the vector;
         * otherwise it is packed, and checked for inf/NaN when something is masked. */
        const int v_direct = kind == FK_FULL && s->v_s[3] == 1 && dvp == Dv;
        const float *vt = v_direct ? vb + j0 * s->v_s[2] : vp;
        const int64_t ldv = v_direct ? s->v_s[2] : dvp;
        const int v_nonfinite =
            v_direct ? 0 : fk_pack_v(s, vb, j0, nkp, dvp, vp, kind == FK_PARTIAL);
        fk_scores(s, b, h, i0, nr, j0, nkp, kind, qt, kb, ST, br);

        /* Online softmax, a vector of query rows at a time: every step is along the
         * key axis, so no horizontal reduction is needed. */
        for (int64_t r0 = 0; r0 < nr; r0 += SIMD_W) {
            simd_f32 vmax = simd_set1(-INFINITY);
            for (int64_t c = 0; c < nkp; c++)
                vmax = simd_max(vmax, simd_load(ST + c * br + r0));
            const simd_f32 mold = simd_load(m + r0);
            const simd_f32 mnew = simd_max(mold, vmax);
            const simd_f32 msafe = fk_max_for_exp(mnew);
            simd_store(alpha + r0, simd_exp_nonpos(simd_sub(mold, msafe)));
            simd_store(m + r0, mnew);
            simd_f32 vsum = simd_zero();
            for (int64_t c = 0; c < nkp; c++) {
                simd_f32 p = simd_exp_nonpos(simd_sub(simd_load(ST + c * br + r0), msafe));
                simd_store(ST + c * br + r0, p);
                vsum = simd_add(vsum, p);
            }
            simd_store(l + r0, simd_fma(simd_load(l + r0), simd_load(alpha + r0), vsum));
        }
        for (int64_t r = 0; r < nr; r++)
            if (alpha[r] != 1.0f) {
                const simd_f32 va = simd_set1(alpha[r]);
                float *orow = O + r * dvp;
                for (int64_t e = 0; e < dvp; e += SIMD_W)
                    simd_store(orow + e, simd_mul(simd_load(orow + e), va));
            }

        /* O += P V, micro-tile by micro-tile. A value row that is not finite must
         * not reach a row that masks its key (the reference skips masked keys), so
         * such rare tiles take a plain loop that skips zero weights, with the same
         * fma per element and order as the micro-kernel, so that rows that see only
         * finite values get the same bits as without the NaN. */
        if (v_nonfinite) {
            for (int64_t r = 0; r < nr; r++)
                for (int64_t j = 0; j < nkp; j++) {
                    const float pj = ST[j * br + r];
                    if (pj == 0.0f)
                        continue;
                    const simd_f32 pv = simd_set1(pj);
                    for (int64_t e = 0; e < dvp; e += SIMD_W)
                        simd_store(O + r * dvp + e,
                                   simd_fma(pv, simd_load(vp + j * dvp + e),
                                            simd_load(O + r * dvp + e)));
                }
            continue;
        }
        for (int64_t rb = 0; rb < nr; rb += FK_MR) {
            int64_t e = 0;
            for (; e + FK_NV * SIMD_W <= dvp; e += FK_NV * SIMD_W)
                fk_ukr_pv(nkp, ST + rb, br, vt + e, ldv, O + rb * dvp + e, dvp, FK_NV);
            for (; e < dvp; e += SIMD_W)
                fk_ukr_pv(nkp, ST + rb, br, vt + e, ldv, O + rb * dvp + e, dvp, 1);
        }
    }

    /* out = O / l; rows that saw no key are empty. */
    int64_t empty = INT64_MAX;
    for (int64_t r = 0; r < nr; r++)
        inv[r] = l[r] == 0.0f ? 0.0f : 1.0f / l[r];
    for (int64_t r = 0; r < i1 - i0; r++) {
        const int64_t i = i0 + r;
        float *orow = ob + i * s->o_s[2];
        const float *acc = O + r * dvp;
        if (l[r] == 0.0f && empty == INT64_MAX)
            empty = (b * s->H + h) * s->Tq + i;
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
    if (empty < job->empty_first[worker])
        job->empty_first[worker] = empty;

    if (!job->weights)
        return;

    /* Weights, only when asked for: exp(S - m) / l written tile by tile. */
    float *wb = job->weights + b * s->w_s[0] + h * s->w_s[1];
    for (int64_t j0 = 0; j0 < s->Tk; j0 += bc) {
        const int64_t j1 = fk_min(j0 + bc, s->Tk);
        const int64_t nkp = fk_round_up(j1 - j0, FK_MK);
        const int kind = fk_tile_kind(s, b, h, i0, i1, j0, j1, nkp);
        if (kind == FK_SKIP) {
            for (int64_t i = i0; i < i1; i++)
                for (int64_t j = j0; j < j1; j++)
                    wb[i * s->w_s[2] + j * s->w_s[3]] = 0.0f;
            continue;
        }
        fk_scores(s, b, h, i0, nr, j0, nkp, kind, qt, kb, ST, br);
        for (int64_t r0 = 0; r0 < nr; r0 += SIMD_W) {
            const simd_f32 msafe = fk_max_for_exp(simd_load(m + r0));
            const simd_f32 vinv = simd_load(inv + r0);
            for (int64_t c = 0; c < nkp; c++)
                simd_store(ST + c * br + r0,
                           simd_mul(simd_exp_nonpos(simd_sub(simd_load(ST + c * br + r0), msafe)),
                                    vinv));
        }
        for (int64_t r = 0; r < i1 - i0; r++) {
            float *wrow = wb + (i0 + r) * s->w_s[2];
            for (int64_t j = j0; j < j1; j++)
                wrow[j * s->w_s[3]] = ST[(j - j0) * br + r];
        }
    }
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

/* acc[c] = sum_j p[j] * v[j][c] over keys with p != 0, for nv vectors of columns,
 * the last of which holds only `last` columns (1 .. SIMD_W). */
FK_INLINE void fk_row_pv(const float *p, int64_t nkeys, const float *v, int64_t ldv,
                         float *acc, const int nv, int64_t last)
{
    simd_f32 a[FK_ROW_NV];
    for (int c = 0; c < nv; c++)
        a[c] = simd_zero();
    for (int64_t j = 0; j < nkeys; j++) {
        if (p[j] == 0.0f)
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

/* One (b, h) on the row path: its few query rows (at most ATTN__FUSED_ROW_MAX),
 * in three phases over all the rows - scores, softmax, weighted sum - so that the
 * rows' independent work overlaps in the core instead of one short row waiting on
 * its own chain of latencies. K and V are read in place. */
static void fk_row_item(void *arg, int64_t item, int worker)
{
    const attn__fused_job *job = (const attn__fused_job *)arg;
    const attn__sdpa_shapes *s = job->s;
    const int64_t b = item / s->H, h = item % s->H;
    const int64_t D = s->D, Dv = s->Dv, Tq = s->Tq, Tk = s->Tk;
    const int64_t ldq = fk_align(D), ldsc = fk_align(Tk);
    float *ws = job->ws + (int64_t)worker * job->ws_floats;
    float *qrows = ws;               /* [Tq][ldq] */
    float *scores = qrows + Tq * ldq; /* [Tq][ldsc] */
    float *acc = scores + Tq * ldsc;  /* [dvp] */

    int64_t kb_, kh_;
    fk_kv_head(s, b, h, &kb_, &kh_);
    const float *kb = job->k + kb_ * s->k_s[0] + kh_ * s->k_s[1];
    const float *vb = job->v + kb_ * s->v_s[0] + kh_ * s->v_s[1];
    float inv[ATTN__FUSED_ROW_MAX]; /* 1 / l per row, 0 for an empty row */
    int64_t jn[ATTN__FUSED_ROW_MAX];

    /* Phase 1, over K: scores. */
    for (int64_t i = 0; i < Tq; i++) {
        const float *qsrc = job->q + attn__off4(s->q_s, b, h, i, 0);
        float *qrow = qrows + i * ldq, *sc = scores + i * ldsc;
        for (int64_t d = 0; d < D; d++)
            qrow[d] = qsrc[d * s->q_s[3]];
        jn[i] = s->causal ? fk_causal_limit(s, i) : Tk;
        int64_t j = 0;
        for (; j + 4 <= jn[i]; j += 4)
            fk_dot4(qrow, kb + j * s->k_s[2], s->k_s[2], D, s->scale, sc + j);
        for (; j < jn[i]; j++)
            sc[j] = fk_dot(qrow, kb + j * s->k_s[2], D) * s->scale;
    }

    /* Phase 2: the mask, the max, the softmax numerators and 1 / their sum.
     * Visibility comes from the mask, not the scores, so that a NaN score makes
     * its row NaN rather than empty. */
    for (int64_t i = 0; i < Tq; i++) {
        float *sc = scores + i * ldsc;
        const uint8_t *mrow =
            s->mask.data ? s->mask.data + attn__off4(s->mask.stride, b, h, i, 0) : NULL;
        float m = -INFINITY;
        int64_t visible = 0, j;
        for (j = 0; j < jn[i]; j++) {
            float x = sc[j];
            if (!mrow || mrow[j * s->mask.stride[3]]) {
                visible++;
                if (x != x)
                    m = x;
            } else {
                x = sc[j] = -INFINITY;
            }
            m = x > m ? x : m;
        }
        for (; j < Tk; j++)
            sc[j] = -INFINITY;
        if (visible == 0) {
            inv[i] = 0.0f; /* marks the row empty (l is never 0 otherwise) */
            continue;
        }
        /* The tail through a partial vector whose other lanes are -inf, so they
         * add exp(-inf) = 0. */
        const simd_f32 vm = simd_set1(m);
        simd_f32 vsum = simd_zero();
        j = 0;
        for (; j + SIMD_W <= jn[i]; j += SIMD_W) {
            simd_f32 p = simd_exp_nonpos(simd_sub(simd_load(sc + j), vm));
            simd_store(sc + j, p);
            vsum = simd_add(vsum, p);
        }
        if (j < jn[i]) {
            simd_f32 p =
                simd_exp_nonpos(simd_sub(simd_load_n(sc + j, jn[i] - j, -INFINITY), vm));
            simd_store_n(sc + j, p, jn[i] - j);
            vsum = simd_add(vsum, p);
        }
        inv[i] = 1.0f / simd_hsum(vsum);
    }

    /* Phase 3, over V: the weighted sum, skipping keys with weight 0; the sums of
     * up to FK_ROW_NV vectors of columns stay in registers over all the keys. */
    for (int64_t i = 0; i < Tq; i++) {
        const float *sc = scores + i * ldsc;
        float *orow = job->out + attn__off4(s->o_s, b, h, i, 0);
        float *wrow = job->weights ? job->weights + attn__off4(s->w_s, b, h, i, 0) : NULL;
        if (inv[i] == 0.0f) {
            const int64_t flat = (b * s->H + h) * Tq + i;
            if (flat < job->empty_first[worker])
                job->empty_first[worker] = flat;
            for (int64_t e = 0; e < Dv; e++)
                orow[e * s->o_s[3]] = 0.0f;
            if (wrow)
                for (int64_t j = 0; j < Tk; j++)
                    wrow[j * s->w_s[3]] = 0.0f;
            continue;
        }
        int64_t e0 = 0;
        for (; e0 + FK_ROW_NV * SIMD_W <= Dv; e0 += FK_ROW_NV * SIMD_W)
            fk_row_pv(sc, jn[i], vb + e0, s->v_s[2], acc + e0, FK_ROW_NV, SIMD_W);
        for (; e0 < Dv; e0 += SIMD_W) {
            const int64_t last = Dv - e0 < SIMD_W ? Dv - e0 : SIMD_W;
            fk_row_pv(sc, jn[i], vb + e0, s->v_s[2], acc + e0, 1, last);
        }
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
        if (wrow) {
            int64_t j = 0;
            for (; j < jn[i]; j++)
                wrow[j * s->w_s[3]] = sc[j] * inv[i];
            for (; j < Tk; j++)
                wrow[j * s->w_s[3]] = 0.0f;
        }
    }
}

static void fk_exp_nonpos(const float *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + SIMD_W <= n; i += SIMD_W)
        simd_store(y + i, simd_exp_nonpos(simd_load(x + i)));
    if (i < n)
        simd_store_n(y + i, simd_exp_nonpos(simd_load_n(x + i, n - i, 0.0f)), n - i);
}

static void fk_item(void *arg, int64_t item, int worker)
{
    const attn__fused_job *job = (const attn__fused_job *)arg;
    if (job->row_path)
        fk_row_item(arg, item, worker);
    else
        fk_tile_item(arg, item, worker);
}

#endif /* ATTN_FUSED_KERNEL_H */
