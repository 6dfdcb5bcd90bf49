/*
 * fused_backward.h - the fused backward of scaled dot-product attention, written
 * once over the SIMD layer of src/kernels/simd.h and compiled once per instruction
 * set by sdpa_fused_backward.c (portable C), sdpa_fused_backward_avx2.c and
 * sdpa_fused_backward_avx512.c, each of which defines ATTN_SIMD_<ISA> first.
 *
 * THE CONTRACT
 *
 * What it computes is what the reference (src/attention/sdpa_ref_backward.c)
 * computes, in FlashAttention-2's way (Dao, arXiv 2307.08691, section 3.2,
 * Algorithm 2): the weights are never stored; each tile recomputes its scores from
 * q and k and its weights from the forward's log-sum-exp L, P_ij = exp(S_ij - L_i),
 * so memory is O(T): no [Tq, Tk] block exists anywhere. Pass 0, then one of two
 * forms:
 *
 *   pass 0, item (b, h):     Delta_i = rowsum(dO_i * O_i), whether row i sees a key
 *                            (a row that sees none gives and gets nothing) and
 *                            whether its q and dO are all finite. The one-pass
 *                            form's pass 0 only finds which rows see a key (for
 *                            the EMPTY_ROW error, before anything is written);
 *                            each of its items computes Delta and finiteness for
 *                            its own rows first, with the same code.
 *
 * The one-pass form (fb_head_item), item (b, hk): for each group of FB_KC key
 * tiles in order, for each query head h of the group of hk in order, each block
 * of rows i in order, each of the key tiles j0 .. j1-1 in order, the S, P, dP and
 * dS below once, then dV_j += P_ij dO_i, dK_j += dS_ij q_i and dQ_i += dS_ij k_j. The item owns dK and dV of (b, hk) and dQ of its group's query
 * heads (accumulated in its own scratch rows, key tile by key tile): five products
 * of Q K^T's size per visible pair, FlashAttention-2's count. The planner takes it
 * when there are two or more (b, hk) items and no dbias is wanted.
 *
 * The two-pass form, for a single (b, hk) item (nothing to share among threads)
 * or a dbias (which a broadcast bias would have several items write):
 *
 *   pass 1, item (b, hk, key tile j0 .. j1-1): for each query head h of the group
 *                            of hk in order, each row i in order:
 *                              S_ij, P_ij = exp(S_ij - L_i), dP_ij = dO_i . v_j,
 *                              dS_ij = P_ij (dP_ij - Delta_i) (times 1 - tanh^2
 *                              under a softcap),
 *                              dV_j += P_ij dO_i,  dK_j += dS_ij q_i
 *                            then dK *= scale. The item owns rows j0 .. j1-1 of dK
 *                            and dV of (b, hk): GQA's sum over the group is a loop
 *                            inside one item, in a fixed order.
 *   pass 2, item (b, h, query tile i0 .. i1-1): for each key tile the rows see, the
 *                            same S, P, dP and dS again, dQ_i += dS_ij k_j, then
 *                            dQ *= scale; dbias += dS where it is wanted. The item
 *                            owns rows i0 .. i1-1 of dQ.
 *
 * Every sum runs in an order fixed by the shapes (tile boundaries never depend on
 * the thread count), and no two items write the same float, so the result has
 * the same bits for any number of threads: no atomics, no reductions across
 * threads. The two-pass form pays for it by recomputing S and dP in pass 2 (seven
 * products instead of five). Both forms add each element's terms in the same
 * order (dQ_i over key tiles, then keys, in order; dK_j and dV_j over query heads,
 * then rows, in order), so they give the same bits. A dbias broadcast along b, h
 * or the query axis would be written by several items; then pass 2 runs on one
 * thread (the planner in sdpa_fused_backward.c decides), which keeps the bits.
 * dsinks is a sum over (b, i) of exp(sink - L_i) Delta_i and is taken last, on
 * the caller, in the reference's order.
 *
 * Layout: per key tile, K and V are packed transposed, K^T [D][bcp] and V^T
 * [Dv][bcp], so the scores and dP of FB_R query rows along the tile's keys are
 * vector FMAs of a broadcast q_i[d] (dO_i[d]) against a row of K^T (V^T), each
 * loaded vector feeding the FB_R rows: no horizontal sums. The accumulators dK
 * [bc][dp] and dV [bc][dvp] take a block's FB_RB rows' dS_ij (P_ij) times their
 * packed, zero-padded q (dO) rows in one load and store; dQ [br][dp] keeps a
 * vector in a register while the tile's keys stream. Keys past Tk are packed as zeros and are
 * hidden; columns past D and Dv are zeros and never written out. These blocked
 * sums add a hidden pair's 0 * (a finite number), which changes nothing; when a
 * row's q or dO (pass 1) or the tile's k (pass 2) holds an inf or a NaN, the
 * kernel skips hidden pairs one by one instead, as the reference does.
 *
 * Hidden keys (attn__may_attend: causal, window, mask, a -inf bias) are skipped,
 * never multiplied by a zero weight, exactly as in the reference: their dK and dV
 * get exactly zero from the rows that cannot see them, and a NaN or inf in their
 * k or v, or in a row's dO, never reaches them. A row's visible key range comes
 * from the causal alignment and the window (fb_row_range), so key tiles outside
 * it are never visited.
 *
 * Options, in the contract's order per score (attn__score_mod): x = scale q.k,
 * softcap c tanh(x / c) (this build's vector tanh, as in the forward), + bias, +
 * ALiBi; the gradient walks back through them: the bias gets dS, ALiBi nothing,
 * the softcap multiplies dS by 1 - tanh^2(x / c); sinks enter only through L
 * (which includes them) and dsinks.
 */
#ifndef ATTN_FUSED_BACKWARD_H
#define ATTN_FUSED_BACKWARD_H

#include "sdpa_fused_backward.h"
#include "simd.h"

#include <math.h>
#include <string.h>

/* The register-blocked helpers must be inlined into their loops, or their vector
 * arrays would go through memory. */
#if defined(__GNUC__) || defined(__clang__)
#define FB_INLINE static inline __attribute__((always_inline))
#else
#define FB_INLINE static inline
#endif

static int64_t fb_min(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t fb_max(int64_t a, int64_t b) { return a > b ? a : b; }

/* The keys [*lo, *hi) query i may see by the causal alignment and the window
 * alone; both ends grow with i. The forward's fk_row_range says the same; it lives
 * in a header built with the forward's micro-tile sizes, so the backward states
 * the rule again from sdpa_contract.h's attn__may_attend. */
static void fb_row_range(const attn__sdpa_shapes *s, int64_t i, int64_t *lo, int64_t *hi)
{
    const int64_t ip = i + s->offset;
    int64_t a = 0, e = s->Tk;
    if (s->causal == ATTN_CAUSAL_TOP_LEFT)
        e = fb_min(e, i + 1);
    else if (s->causal == ATTN_CAUSAL_BOTTOM_RIGHT)
        e = fb_min(e, ip + 1);
    if (s->has_window) {
        if (s->window_left >= 0)
            a = fb_max(a, ip - s->window_left);
        if (s->window_right >= 0)
            e = fb_min(e, ip + s->window_right + 1);
    }
    e = fb_max(e, 0);
    *lo = fb_min(a, e);
    *hi = e;
}

/* Query rows scored together against one key tile: each packed K^T (V^T) vector
 * loaded feeds FB_R FMAs.
 * FB_NV vectors side by side (of keys in the scores, of d in the products) keep
 * FB_R x FB_NV accumulators in registers: 16 of AVX-512's 32, 8 of AVX2's 16.
 * A file may set FB_R, FB_NV, FB_SLICE and FB_KQ before including this one
 * (sdpa_fused_backward_4x4_avx512.c: 4 x 4 register tiles for Zen 4). The shapes
 * change only which products run side by side, never a sum's order, so every
 * shape gives the same bits. */
#ifndef FB_R
#define FB_R 8
#endif
/* Sub-blocks of FB_R rows in one block of the one-pass form and of pass 1. The
 * scores, dP and dQ work on one sub-block at a time (their register tiles are
 * FB_R rows); the dK and dV products take the whole block, so their
 * accumulators (FB_KQ keys by FB_ND vectors in registers) are loaded and stored
 * once per FB_RB rows instead of once per FB_R. Those accumulators do not stay
 * in the first-level cache from one block to the next (FB_KC tiles' packed K, V
 * and accumulators are larger than it). Measured on S2 with one thread: 5% less
 * time with blocks of 32 rows than of 8 (one sub-block of 8 x 2 tiles), and 64
 * gave no more (nor on Zen 4 with the 4 x 4 body). One value for every body, as
 * FB_KC: the planner sizes the scratch with the portable build's fb_ws_floats_of. */
#define FB_RB 32
#define FB_SB (FB_RB / FB_R)
/* Keys of a slice in fb_block_tile's fast scores: a multiple of every build's key
 * step (FB_NV vectors: 32 keys for AVX-512, 8 for AVX2, 1 for portable C). With
 * AVX2, slices of one step (8 keys) took 1.5% more time than the whole range per
 * sub-block, slices of 32 keys 0.9% less; with AVX-512 the slices took 0-3% less
 * on S2 and 1-4% less on S3, S4 and S8 (one thread, CPU time, interleaved runs;
 * docs/performance.md). The 4 x 4 body's step is 64 keys, the whole key tile, so
 * its slice is the tile. */
#ifndef FB_SLICE
#define FB_SLICE 32
#endif
/* 1: dK and dV leave out a block's leading and trailing sub-blocks that reach none
 * of a key group's keys (fb_outer_acc); 1 in the 4 x 4 body only, where it was
 * measured (Zen 4). */
#ifndef FB_KV_TRIM
#define FB_KV_TRIM 0
#endif
/* The sub-blocks' key ranges fb_outer_acc takes with FB_KV_TRIM: without it they
 * are not passed at all, so that the other bodies compile to what they did. */
#if FB_KV_TRIM
#define FB_TRIM_PARAMS , const int64_t *sjlo, const int64_t *sjhi
#define FB_TRIM_ARGS(lo, hi) , (lo), (hi)
#else
#define FB_TRIM_PARAMS
#define FB_TRIM_ARGS(lo, hi)
#endif
/* Key tiles the one-pass form holds at once (see fb_head_item). */
#define FB_KC 4
#ifndef FB_NV
#if defined(ATTN_SIMD_AVX512)
#define FB_NV 2
#else
#define FB_NV 1
#endif
#endif
/* Vectors of d in the dK and dV tiles of FB_KQ keys (see fb_outer_keys), each
 * broadcast weight feeding FB_ND FMAs. */
#if defined(ATTN_SIMD_AVX512)
#define FB_ND 4
#elif defined(ATTN_SIMD_AVX2)
#define FB_ND 2
#else
#define FB_ND 1
#endif

/* The per-worker scratch, carved from job->ws in this order (each part a multiple
 * of 16 floats, so every part starts on a 64-byte boundary). */
typedef struct fb_ws {
    float *kt;   /* K^T of the key tile [D][bcp] */
    float *vt;   /* V^T of the key tile [Dv][bcp] */
    float *krow; /* the key tile's rows, padded [bc][dp] (pass 2) */
    float *acc1; /* dK [bc][dp] (pass 1) or dQ [br][dp] (pass 2) */
    float *acc2; /* dV [bc][dvp] (pass 1) */
    float *qi;   /* FB_RB query rows, when copied (padded) [FB_RB][dp] */
    float *doi;  /* FB_RB rows of dO, when copied [FB_RB][dvp] */
    float *p;    /* the rows' weights along the tile [FB_RB][bcp] */
    float *ds;   /* dS before the softcap's factor [FB_RB][bcp] */
    float *dsx;  /* dS after it (the score product's gradient) [FB_RB][bcp] */
    float *t;    /* tanh(x / c) under a softcap [FB_RB][bcp] */
    float *vis;  /* 1 where the key is visible to the row, else 0 [FB_RB][bcp] */
    float *dqpad; /* where an unused slot's dQ goes (one-pass form) [dp] */
    float *more;  /* tiles 1 .. FB_KC-1's kt, vt, krow, acc1, acc2 (one-pass form) */
    float *dqacc; /* dQ of the item's rows (one-pass form) [group][Tq][dp] */
    /* The block's rows of q (dp floats readable) and dO (dvp): in place in the
     * arguments when a row is contiguous and needs no padding, else in qi, doi. */
    const float *qrow[FB_RB], *drow[FB_RB];
} fb_ws;

/* One sub-block of FB_R rows of a block: its rows' pointers and its rows of the
 * weight buffers, over w's packed key tile. */
typedef struct fb_sub {
    const float *const *qrow, *const *drow;
    const float *kt, *vt;
    float *p, *ds, *dsx, *t, *vis;
} fb_sub;

/* log2(e), to be rounded to float once with what it multiplies. */
#define FB_LOG2E 1.4426950408889634074

/* scale log2(e), rounded once: what a raw score q.k is multiplied by to be a
 * base-2 exponent. */
static float fb_scale2(const attn__sdpa_shapes *s) { return (float)((double)s->scale * FB_LOG2E); }

/* job->sees[row]'s bits: the row sees a key; its q and dO are all finite. */
#define FB_ROW_SEES 1
#define FB_ROW_FINITE 2

/* A block's rows as its key tiles see them: each slot's row i of (b, h) (-1 for an
 * unused slot), the keys [lo, hi) the causal alignment and the window let it see,
 * and its L and Delta. Found once per block and read by every tile the block
 * visits, instead of once per tile and sub-block (on S2 the block meets eight
 * tiles on average). An unused slot has lo = hi = 0 and L = Delta = 0. */
typedef struct fb_rows {
    int64_t i[FB_RB], lo[FB_RB], hi[FB_RB];
    float delta[FB_RB];
    float nl2[FB_RB]; /* -L_i log2(e), the log-sum-exp in base 2 (see fb_rows_tile) */
    float L[FB_RB];   /* L_i itself, for the general path's (S - L) log2(e) */
    int big;          /* the head's L is too large for the one-FMA exponent (fb_head_big) */
} fb_rows;

/* The largest |L log2(e)| of a head for which P may be taken by one FMA, x (scale
 * log2(e)) - L log2(e), as fb_rows_tile_fast does: both factors are rounded, so
 * the exponent of a score equal to L is off by units in the last place of L
 * log2(e), not 0; at 2^37 (scores of 1e11) that is 2^13 and more, and the
 * weights come out inf or 0 (rows of NaN). Beyond, the scores are scaled first
 * and P = 2^((S - L) log2(e)), the general path's form, whose S - L is exact
 * near L. 128 is where exp(L) leaves float32's range (|L| of 88.7): below it
 * the one FMA's error (about |L| 2^-24 in each exponent) stays within twice the
 * reference's; at 2^16 (the forward's bf16 B16_BASE2_MAX) it was three times at
 * scores of 2^9 (tests/test_backward_extremes.c). Ordinary rows keep the FMA. */
#define FB_BASE2_MAX 128.0

/* 1 when some row of (b, h) that sees a key has |L log2(e)| >= FB_BASE2_MAX. Taken
 * per head, not per block, so that every form and block of rows makes the same
 * choice for a row (the same bits); a scan of Tq floats per item and head. */
static int fb_head_big(const attn__fused_bwd_job *job, int64_t b, int64_t h)
{
    const attn__sdpa_bwd_shapes *bs = job->bs;
    const attn__sdpa_shapes *s = &bs->s;
    for (int64_t i = 0; i < s->Tq; i++) {
        const float L = job->lse[b * bs->lse_s[0] + h * bs->lse_s[1] + i * bs->lse_s[2]];
        if ((job->sees[(b * s->H + h) * s->Tq + i] & FB_ROW_SEES) &&
            fabs((double)L * FB_LOG2E) >= FB_BASE2_MAX)
            return 1;
    }
    return 0;
}

static void fb_rows_set(const attn__fused_bwd_job *job, int64_t b, int64_t h, fb_rows *rs,
                        int r, int64_t i)
{
    const attn__sdpa_bwd_shapes *bs = job->bs;
    const attn__sdpa_shapes *s = &bs->s;
    rs->i[r] = i;
    rs->lo[r] = rs->hi[r] = 0;
    rs->delta[r] = rs->nl2[r] = rs->L[r] = 0.0f;
    if (i < 0)
        return;
    fb_row_range(s, i, &rs->lo[r], &rs->hi[r]);
    float L = job->lse[b * bs->lse_s[0] + h * bs->lse_s[1] + i * bs->lse_s[2]];
    /* A row that sees a key never has L = -inf from the forward; given one, its
     * weights exp(S - L) are +inf in the reference, but the base-2 exp is only
     * defined for exponents <= 0 (portable C's clamps +inf to 0: weights of 1,
     * finite gradients). NaN keeps the row's gradients non-finite on every path. */
    if (L == -INFINITY)
        L = NAN;
    rs->nl2[r] = (float)(-(double)L * FB_LOG2E);
    rs->L[r] = L;
    rs->delta[r] = job->delta[(b * s->H + h) * s->Tq + i];
}

/* The first row whose key range ends after key j (Tq when none does). Both ends
 * of a row's range grow with the row (fb_row_range), so the rows that reach a
 * run of keys [j, j') are one run of rows too: from this one up to the first
 * whose range starts at j' or later. */
static int64_t fb_first_row_past(const attn__sdpa_shapes *s, int64_t j)
{
    int64_t lo = 0, hi = s->Tq;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        int64_t a, e;
        fb_row_range(s, mid, &a, &e);
        if (e > j)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

static int64_t fb_a16(int64_t n) { return (n + 15) / 16 * 16; }

/* Floats of scratch one worker needs (the planner calls the portable build's). */
static inline int64_t fb_tile_floats(int64_t D, int64_t Dv, int64_t br, int64_t bc,
                                     int64_t bcp, int64_t dp, int64_t dvp)
{
    return fb_a16(D * bcp) + fb_a16(Dv * bcp) + fb_a16(bc * dp) +
           fb_a16(fb_max(bc, br) * dp) + fb_a16(bc * dvp);
}

/* dq_rows is 0 for the two-pass form, else group x Tq (the one-pass form, which
 * also keeps FB_KC key tiles at once). */
static inline int64_t fb_ws_floats_of(int64_t D, int64_t Dv, int64_t br, int64_t bc,
                                      int64_t bcp, int64_t dp, int64_t dvp, int64_t dq_rows)
{
    const int64_t tile = fb_tile_floats(D, Dv, br, bc, bcp, dp, dvp);
    return tile + fb_a16(FB_RB * dp) + fb_a16(FB_RB * dvp) + 5 * fb_a16(FB_RB * bcp) +
           fb_a16(dp) + (dq_rows ? (FB_KC - 1) * tile + dq_rows * dp : 0);
}

static fb_ws fb_ws_of(const attn__fused_bwd_job *job, int worker)
{
    const attn__sdpa_shapes *s = &job->bs->s;
    float *w = job->ws + (int64_t)worker * job->ws_floats;
    fb_ws r;
    r.kt = w;
    w += fb_a16(s->D * job->bcp);
    r.vt = w;
    w += fb_a16(s->Dv * job->bcp);
    r.krow = w;
    w += fb_a16(job->bc * job->dp);
    r.acc1 = w;
    w += fb_a16(fb_max(job->bc, job->br) * job->dp);
    r.acc2 = w;
    w += fb_a16(job->bc * job->dvp);
    r.qi = w;
    w += fb_a16(FB_RB * job->dp);
    r.doi = w;
    w += fb_a16(FB_RB * job->dvp);
    r.p = w;
    w += fb_a16(FB_RB * job->bcp);
    r.ds = w;
    w += fb_a16(FB_RB * job->bcp);
    r.dsx = w;
    w += fb_a16(FB_RB * job->bcp);
    r.t = w;
    w += fb_a16(FB_RB * job->bcp);
    r.vis = w;
    w += fb_a16(FB_RB * job->bcp);
    r.dqpad = w;
    w += fb_a16(job->dp);
    r.more = w;
    if (job->one_pass) /* the two-pass form has neither part */
        w += (FB_KC - 1) * fb_tile_floats(s->D, s->Dv, job->br, job->bc, job->bcp, job->dp,
                                          job->dvp);
    r.dqacc = w;
    return r;
}

/* w with its key tile's buffers (kt, vt, krow, acc1, acc2) those of tile c of the
 * one-pass form's FB_KC (tile 0 is w's own). */
static fb_ws fb_ws_tile(const attn__fused_bwd_job *job, const fb_ws *w, int c)
{
    const attn__sdpa_shapes *s = &job->bs->s;
    fb_ws r = *w;
    if (c == 0)
        return r;
    float *t = w->more + (int64_t)(c - 1) * fb_tile_floats(s->D, s->Dv, job->br, job->bc,
                                                            job->bcp, job->dp, job->dvp);
    r.kt = t;
    t += fb_a16(s->D * job->bcp);
    r.vt = t;
    t += fb_a16(s->Dv * job->bcp);
    r.krow = t;
    t += fb_a16(job->bc * job->dp);
    r.acc1 = t;
    t += fb_a16(fb_max(job->bc, job->br) * job->dp);
    r.acc2 = t;
    return r;
}

static fb_sub fb_sub_of(const attn__fused_bwd_job *job, const fb_ws *w, int sb)
{
    const int64_t at = (int64_t)sb * FB_R * job->bcp;
    fb_sub r;
    r.qrow = w->qrow + sb * FB_R;
    r.drow = w->drow + sb * FB_R;
    r.kt = w->kt;
    r.vt = w->vt;
    r.p = w->p + at;
    r.ds = w->ds + at;
    r.dsx = w->dsx + at;
    r.t = w->t + at;
    r.vis = w->vis + at;
    return r;
}

/* dst[d * bcp + j] = x[j * ld0 + d * ld1] for j < n, d < cols, and 0 for n <= j <
 * bcp: K^T or V^T of a key tile. Whole SIMD_W x SIMD_W blocks of rows whose d is
 * contiguous go through registers; the rest element by element. */
static void fb_pack_t(float *dst, int64_t bcp, const float *x, int64_t ld0, int64_t ld1,
                      int64_t n, int64_t cols)
{
    int64_t jb = 0, db = 0;
#if SIMD_HAS_TRANSPOSE
    if (ld1 == 1) {
        jb = n / SIMD_W * SIMD_W;
        db = cols / SIMD_W * SIMD_W;
        for (int64_t j = 0; j < jb; j += SIMD_W)
            for (int64_t d = 0; d < db; d += SIMD_W)
                simd_transpose_block(dst + d * bcp + j, bcp, x + j * ld0 + d, ld0);
    }
#endif
    for (int64_t d = 0; d < cols; d++) {
        float *row = dst + d * bcp;
        for (int64_t j = d < db ? jb : 0; j < n; j++)
            row[j] = x[j * ld0 + d * ld1];
        for (int64_t j = n; j < bcp; j++)
            row[j] = 0.0f;
    }
}

/* Packs keys j0 .. j0+n-1 of (b, hk): K^T and V^T with zero columns past n, and
 * (when rows is set) K's rows padded with zeros to dp. Returns 1 when every
 * packed k is finite (pass 2 may then add a hidden key's zero term instead of
 * skipping it: 0 * finite = 0). */
static int fb_pack_kv(const attn__fused_bwd_job *job, int64_t b, int64_t hk, int64_t j0,
                      int64_t n, const fb_ws *w, int rows)
{
    const attn__sdpa_shapes *s = &job->bs->s;
    const int64_t bcp = job->bcp;
    const float *k = job->k + attn__off4(s->k_s, b, hk, j0, 0);
    const float *v = job->v + attn__off4(s->v_s, b, hk, j0, 0);
    fb_pack_t(w->kt, bcp, k, s->k_s[2], s->k_s[3], n, s->D);
    fb_pack_t(w->vt, bcp, v, s->v_s[2], s->v_s[3], n, s->Dv);
    /* x * 0 is 0 for a finite x and NaN for an inf or a NaN, so the sum of them
     * over K^T (whose padding is zeros) is 0 exactly when every k is finite. */
    const simd_f32 zero = simd_zero();
    simd_f32 z = zero;
    for (int64_t at = 0; at < s->D * bcp; at += SIMD_W)
        z = simd_fma(simd_load(w->kt + at), zero, z);
    const int finite = simd_hsum(z) == 0.0f;
    if (rows)
        for (int64_t j = 0; j < n; j++) {
            float *dst = w->krow + j * job->dp;
            const float *src = k + j * s->k_s[2];
            if (s->k_s[3] == 1)
                memcpy(dst, src, (size_t)s->D * sizeof(float));
            else
                for (int64_t d = 0; d < s->D; d++)
                    dst[d] = src[d * s->k_s[3]];
            for (int64_t d = s->D; d < job->dp; d++)
                dst[d] = 0.0f;
        }
    return finite;
}

/* Points slot r of w->qrow and w->drow at row i of (b, h)'s q and dO: in place
 * when the row is contiguous and D (Dv) is a whole number of vectors, else
 * gathered into w->qi (w->doi) and zero-padded; i < 0 makes the slot a row of
 * zeros (an unused slot). Returns 1 when both rows are finite (fb_row_delta looked). */
static int fb_load_row(const attn__fused_bwd_job *job, int64_t b, int64_t h, int64_t i,
                       int r, fb_ws *w)
{
    const attn__sdpa_bwd_shapes *bs = job->bs;
    const attn__sdpa_shapes *s = &bs->s;
    float *qi = w->qi + r * job->dp, *doi = w->doi + r * job->dvp;
    w->qrow[r] = qi;
    w->drow[r] = doi;
    if (i < 0) {
        memset(qi, 0, (size_t)job->dp * sizeof(float));
        memset(doi, 0, (size_t)job->dvp * sizeof(float));
        return 1;
    }
    if (s->q_s[3] == 1 && s->D == job->dp) {
        w->qrow[r] = job->q + attn__off4(s->q_s, b, h, i, 0);
    } else {
        memset(qi, 0, (size_t)job->dp * sizeof(float));
        for (int64_t d = 0; d < s->D; d++)
            qi[d] = job->q[attn__off4(s->q_s, b, h, i, d)];
    }
    if (bs->do_s[3] == 1 && s->Dv == job->dvp) {
        w->drow[r] = job->dout + attn__off4(bs->do_s, b, h, i, 0);
    } else {
        memset(doi, 0, (size_t)job->dvp * sizeof(float));
        for (int64_t d = 0; d < s->Dv; d++)
            doi[d] = job->dout[attn__off4(bs->do_s, b, h, i, d)];
    }
    return (job->sees[(b * s->H + h) * s->Tq + i] & FB_ROW_FINITE) != 0;
}

/* vis[jv0 .. jv1-1] = 1 for a <= j < e, else 0 (jv0, jv1 multiples of the vector
 * width): whole vectors where they lie on one side of both ends, element by
 * element only in the vectors an end cuts. */
static void fb_fill_range(float *vis, int64_t a, int64_t e, int64_t jv0, int64_t jv1)
{
    const simd_f32 one = simd_set1(1.0f), zero = simd_zero();
    for (int64_t jv = jv0; jv < jv1; jv += SIMD_W) {
        if (jv >= a && jv + SIMD_W <= e)
            simd_store(vis + jv, one);
        else if (jv + SIMD_W <= a || jv >= e)
            simd_store(vis + jv, zero);
        else
            for (int64_t j = jv; j < jv + SIMD_W; j++)
                vis[j] = j >= a && j < e ? 1.0f : 0.0f;
    }
}

/* x[r][c] = sum over d < n of rows[r][d] * tile[d * bcp + c * SIMD_W], for the FB_R
 * rows and nv vectors of keys (nv <= FB_NV, a constant at each call, which unrolls
 * the loops over c): the register block both of fb_rows_tile's products use (q
 * K^T and dO V^T). Each loaded tile vector feeds FB_R FMAs, each broadcast row
 * element nv; the sums run in d order, whatever nv, so a key's value does not
 * depend on the block it was computed in. */
FB_INLINE void fb_rows_by_tile(const float *const rows[FB_R], const float *tile, int64_t bcp,
                               int64_t n, simd_f32 x[FB_R][FB_NV], int nv)
{
    for (int r = 0; r < FB_R; r++)
        for (int c = 0; c < nv; c++)
            x[r][c] = simd_zero();
    /* Rows equally spaced in memory (consecutive rows of q or dO read in place,
     * the usual case) are read from one pointer at fixed offsets: the loop then
     * advances one pointer a step instead of FB_R, and the integer additions it
     * saves would otherwise compete with the FMAs for their ports. The products
     * are the same, in the same order. */
    const intptr_t base = (intptr_t)rows[0];
    const intptr_t ld = (intptr_t)rows[1] - base;
    int even = ld % (intptr_t)sizeof(float) == 0;
    for (int r = 2; r < FB_R; r++)
        even &= (intptr_t)rows[r] - base == (intptr_t)r * ld;
    if (even) {
        const float *row0 = rows[0];
        const int64_t step = (int64_t)(ld / (intptr_t)sizeof(float));
        for (int64_t d = 0; d < n; d++) {
            simd_f32 t[FB_NV];
            for (int c = 0; c < nv; c++)
                t[c] = simd_load(tile + d * bcp + c * SIMD_W);
            for (int r = 0; r < FB_R; r++) {
                const simd_f32 g = simd_set1(row0[r * step + d]);
                for (int c = 0; c < nv; c++)
                    x[r][c] = simd_fma(g, t[c], x[r][c]);
            }
        }
        return;
    }
    for (int64_t d = 0; d < n; d++) {
        simd_f32 t[FB_NV];
        for (int c = 0; c < nv; c++)
            t[c] = simd_load(tile + d * bcp + c * SIMD_W);
        for (int r = 0; r < FB_R; r++) {
            const simd_f32 g = simd_set1(rows[r][d]);
            for (int c = 0; c < nv; c++)
                x[r][c] = simd_fma(g, t[c], x[r][c]);
        }
    }
}

/* 1 when no key is hidden by anything but its row's range and a boolean mask,
 * and a score is scale x itself (no bias, ALiBi or softcap): then
 * fb_rows_tile_fast may do fb_rows_tile's work. */
static int fb_simple(const attn__sdpa_shapes *s)
{
    return !s->bias && !s->alibi && !(s->softcap > 0.0f);
}

/* v where the mask lets key j of a row through, else 0, chosen: m is the row's
 * mask at key 0 of the tile, ms3 its stride along the keys, and keys j .. j +
 * SIMD_W - 1 of the tile, of which those at n or past it are not read (0). A
 * chosen 0 is what the general path stores for a hidden key, and a NaN or an inf
 * in v stays out of it. Whole vectors of a contiguous row are tested in
 * registers: two instructions on AVX-512 (a byte test into a mask register, a
 * zeroing move), three on AVX2. */
FB_INLINE simd_f32 fb_mask_keep(simd_f32 v, const uint8_t *m, int64_t ms3, int64_t j, int64_t n)
{
#if defined(ATTN_SIMD_AVX512)
    if (ms3 == 1 && j + SIMD_W <= n) {
        const __m128i bytes = _mm_loadu_si128((const __m128i *)(const void *)(m + j));
        return _mm512_maskz_mov_ps(_mm_test_epi8_mask(bytes, bytes), v);
    }
#elif defined(ATTN_SIMD_AVX2)
    if (ms3 == 1 && j + SIMD_W <= n) {
        const __m128i b8 = _mm_loadl_epi64((const __m128i *)(const void *)(m + j));
        const __m256i w = _mm256_cvtepu8_epi32(b8);
        const __m256i off = _mm256_cmpeq_epi32(w, _mm256_setzero_si256());
        return _mm256_andnot_ps(_mm256_castsi256_ps(off), v);
    }
#endif
    float keep[SIMD_W];
    for (int t = 0; t < SIMD_W; t++)
        keep[t] = j + t < n && m[(j + t) * ms3] ? 1.0f : 0.0f;
    return simd_select_lt(simd_load(keep), simd_set1(0.5f), simd_zero(), v);
}

/* The keys 0, 1, ... of a vector, as floats (exact below 2^24). */
static const float fb_iota[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* v where key index jj (a vector of them) lies in [a, e), else 0, chosen. */
FB_INLINE simd_f32 fb_keep_range(simd_f32 v, simd_f32 jj, simd_f32 a, simd_f32 e)
{
    const simd_f32 zero = simd_zero();
    return simd_select_lt(jj, e, simd_select_lt(jj, a, zero, v), zero);
}

/* A sub-block's rows of the boolean mask for fb_rows_tile_fast: each row's mask
 * at key 0 of the tile (NULL for an unused slot), the stride along the keys, and
 * the tile's keys n (the mask has none past them). */
typedef struct fb_mrows {
    const uint8_t *m[FB_R];
    int64_t ms3, n;
} fb_mrows;

/* One step of fb_rows_tile_fast: the nv vectors of keys from jv (nv <= FB_NV, a
 * constant at each call, which unrolls the loops over them); with msk (also a
 * constant at each call) the mask mk chooses too. */
FB_INLINE void fb_fast_step(const attn__sdpa_shapes *s, int64_t bcp, const float *nl2,
                            const float *delta, const fb_sub *w, const int64_t *ra,
                            const int64_t *re, const float *fa, const float *fe,
                            simd_f32 vscale2, simd_f32 iota, int64_t jv, int nv, int msk,
                            const fb_mrows *mk)
{
    simd_f32 x[FB_R][FB_NV];
    fb_rows_by_tile(w->qrow, w->kt + jv, bcp, s->D, x, nv);
    for (int r = 0; r < FB_R; r++) {
        /* Whole vectors inside the row's range need no choosing. */
        const int whole = jv >= ra[r] && jv + nv * SIMD_W <= re[r];
        const simd_f32 vnl2 = simd_set1(nl2[r]);
        for (int c = 0; c < nv; c++) {
            const int64_t j = jv + c * SIMD_W;
            simd_f32 pv = simd_exp2_nonpos(simd_fma(x[r][c], vscale2, vnl2));
            if (!whole)
                pv = fb_keep_range(pv, simd_add(iota, simd_set1((float)j)), simd_set1(fa[r]),
                                   simd_set1(fe[r]));
            if (msk && mk->m[r])
                pv = fb_mask_keep(pv, mk->m[r], mk->ms3, j, mk->n);
            simd_store(w->p + r * bcp + j, pv);
        }
    }
    fb_rows_by_tile(w->drow, w->vt + jv, bcp, s->Dv, x, nv);
    for (int r = 0; r < FB_R; r++) {
        const int whole = jv >= ra[r] && jv + nv * SIMD_W <= re[r];
        const simd_f32 vdelta = simd_set1(delta[r]);
        for (int c = 0; c < nv; c++) {
            const int64_t j = jv + c * SIMD_W;
            simd_f32 dsv = simd_mul(simd_load(w->p + r * bcp + j), simd_sub(x[r][c], vdelta));
            if (!whole)
                dsv = fb_keep_range(dsv, simd_add(iota, simd_set1((float)j)), simd_set1(fa[r]),
                                    simd_set1(fe[r]));
            if (msk && mk->m[r])
                dsv = fb_mask_keep(dsv, mk->m[r], mk->ms3, j, mk->n);
            simd_store(w->dsx + r * bcp + j, dsv);
        }
    }
}

/* fb_rows_tile's work when no key is hidden by anything but the range [ra[r],
 * re[r]) of its row and the boolean mask (mk, NULL without one), a score is
 * scale x itself (no bias, ALiBi or softcap) and no one reads vis (the block's
 * rows and the tile's keys are finite): P and dS are made in registers as each
 * vector of scores and of dP comes out of its products, instead of being stored,
 * read back and stored again. Every value is what the general path computes, by
 * the same operations in the same order: P = 2^(x (scale log2(e)) - L log2(e))
 * (one FMA and simd_exp2_nonpos), dS = P (dP - Delta), and 0 chosen for a hidden
 * key in both (by the range, then the mask). dS goes to dsx only (without a
 * softcap the two are the same). The general path tests the mask one pair at a
 * time in a second loop; S6's padding mask took it 1.6x the time of the same
 * shape without a mask (docs/performance.md, "A sixth look").
 *
 * [jv0, jv1) is whole vectors (of SIMD_W keys, not necessarily FB_NV of them):
 * FB_NV vectors a step, then one at a time for what is left, so that on the
 * causal diagonal, where a sub-block's rows end 8 keys apart, the keys scored are
 * rounded up to one vector, not FB_NV (fb_sub_range): a sixth fewer of a 64 x 64
 * diagonal tile's scores on AVX-512, 2% less time with a causal window of 128
 * keys, within the noise on S2 (docs/performance.md, "A fifth look"). */
static void fb_rows_tile_fast(const attn__fused_bwd_job *job, const float *nl2,
                              const float *delta, const fb_sub *w, const int64_t *ra,
                              const int64_t *re, const fb_mrows *mk, int64_t jv0, int64_t jv1)
{
    const attn__sdpa_shapes *s = &job->bs->s;
    const int64_t bcp = job->bcp;
    const simd_f32 vscale2 = simd_set1(fb_scale2(s)), iota = simd_load(fb_iota);
    float fa[FB_R], fe[FB_R];
    for (int r = 0; r < FB_R; r++) {
        fa[r] = (float)ra[r];
        fe[r] = (float)re[r];
    }
    int64_t jv = jv0;
    if (mk) {
        for (; jv + FB_NV * SIMD_W <= jv1; jv += FB_NV * SIMD_W)
            fb_fast_step(s, bcp, nl2, delta, w, ra, re, fa, fe, vscale2, iota, jv, FB_NV, 1, mk);
#if FB_NV > 1
        for (; jv < jv1; jv += SIMD_W)
            fb_fast_step(s, bcp, nl2, delta, w, ra, re, fa, fe, vscale2, iota, jv, 1, 1, mk);
#endif
        return;
    }
    for (; jv + FB_NV * SIMD_W <= jv1; jv += FB_NV * SIMD_W)
        fb_fast_step(s, bcp, nl2, delta, w, ra, re, fa, fe, vscale2, iota, jv, FB_NV, 0, mk);
#if FB_NV > 1
    for (; jv < jv1; jv += SIMD_W)
        fb_fast_step(s, bcp, nl2, delta, w, ra, re, fa, fe, vscale2, iota, jv, 1, 0, mk);
#endif
}

/* For sub-block sb of w's block, the FB_R rows of (b, h) in slots sb * FB_R on
 * of rs (their q and dO already in w->qrow, w->drow; a row of -1 is an unused
 * slot), against the packed key tile j0 .. j0+n-1: in the sub-block's slot r,
 * w->p = P_ij, w->ds = dS_ij, w->dsx = dS_ij times the softcap's factor, w->vis = 1
 * for the visible keys. Hidden keys (and unused slots) get 0 in p, ds and dsx by
 * selection, never by a product, so a NaN score there stays out. [*jlo, *jhi) is
 * the tile's keys (0-based in the tile) that some row's range reaches: only they
 * are scored (rounded out to whole key steps: the diagonal tiles of a causal mask
 * cost about half), and only they may be read afterwards; [*vlo, *vhi) is the
 * range of key vectors scored, which holds it. */
/* The part of fb_rows_tile's work that needs no key: the tile's range [ra[r],
 * re[r]) of each row of sub-block sb, and [*jlo, *jhi), [*vlo, *vhi) as above,
 * the latter rounded out to multiples of step keys: FB_NV vectors for
 * fb_rows_tile's loop, one vector for fb_rows_tile_fast's, which takes a last
 * single vector where FB_NV would reach past the rows' keys. */
static void fb_sub_range(const attn__fused_bwd_job *job, const fb_rows *rs, int sb, int64_t j0,
                         int64_t n, int64_t step, int64_t ra[FB_R], int64_t re[FB_R],
                         int64_t *jlo, int64_t *jhi, int64_t *vlo, int64_t *vhi)
{
    const int64_t *rows = rs->i + sb * FB_R;
    int64_t ulo = n, uhi = 0;
    for (int r = 0; r < FB_R; r++) {
        ra[r] = re[r] = 0;
        if (rows[r] < 0)
            continue;
        ra[r] = fb_max(0, fb_min(n, rs->lo[sb * FB_R + r] - j0));
        re[r] = fb_max(ra[r], fb_min(n, rs->hi[sb * FB_R + r] - j0));
        ulo = fb_min(ulo, ra[r]);
        uhi = fb_max(uhi, re[r]);
    }
    uhi = fb_max(ulo, uhi);
    *jlo = ulo;
    *jhi = uhi;
    const int64_t jv0 = ulo / step * step, jv1 = fb_min(job->bcp, (uhi + step - 1) / step * step);
    *vlo = jv0;
    *vhi = jv1;
}

/* fb_rows_tile itself (described above), in the general form: the scores and dP
 * stored, then the options applied row by row. fb_block_tile does the same work
 * with fb_rows_tile_fast when fb_simple allows. */
static void fb_rows_tile(const attn__fused_bwd_job *job, int64_t b, int64_t h,
                         const fb_rows *rs, int64_t j0, int64_t n, float slope,
                         const fb_ws *w0, int sb, int64_t *jlo, int64_t *jhi, int64_t *vlo,
                         int64_t *vhi)
{
    const fb_sub sub = fb_sub_of(job, w0, sb), *w = &sub;
    const int64_t *rows = rs->i + sb * FB_R;
    int64_t ra[FB_R], re[FB_R];
    fb_sub_range(job, rs, sb, j0, n, FB_NV * SIMD_W, ra, re, jlo, jhi, vlo, vhi);
    const int64_t jv0 = *vlo, jv1 = *vhi;
    const attn__sdpa_bwd_shapes *bs = job->bs;
    const attn__sdpa_shapes *s = &bs->s;
    const int64_t bcp = job->bcp;
    const simd_f32 vscale = simd_set1(s->scale);
    const int cap = s->softcap > 0.0f;
    const simd_f32 vc = simd_set1(s->softcap), one = simd_set1(1.0f);
    const simd_f32 zero = simd_zero(), half = simd_set1(0.5f);
    /* The weights are P = 2^(S log2(e) - L log2(e)), by the base-2 exp, which
     * needs no reduction by ln 2 (simd_exp2_nonpos). With no softcap, bias or
     * ALiBi the score S is scale x itself, so p keeps the raw x and one FMA takes
     * scale log2(e) (fb_scale2) and -L log2(e): what fb_rows_tile_fast computes,
     * the same bits. Otherwise p keeps S, and P = 2^((S - L) log2(e)): S - L is
     * exact where S is near L (Sterbenz), whereas S log2(e) and L log2(e), each
     * rounded (or S times log2(e) rounded to float against L times log2(e) in
     * double), differ by about |L| 2^-24, which a bias makes large: a row whose
     * every key has a bias of -1e9 (an additive padding mask) would get weights
     * of 2^18, and one of 1e37 weights of 0 (tests/test_review_today.c). The
     * same holds for a head whose L itself is huge (rs->big: scores of 1e11, a
     * scale of 1e30), which takes the second form too (test_backward_extremes). */
    const int raw = !cap && !s->bias && !s->alibi && !rs->big;
    const simd_f32 vk2 = simd_set1(raw ? fb_scale2(s) : (float)FB_LOG2E);

    /* x = scale q_i.k_j and dP = dO_i.v_j along the tile's keys, FB_NV vectors of
     * keys for the FB_R rows at a time (job->bcp is a multiple of FB_NV vectors):
     * each loaded K^T (V^T) vector feeds FB_R FMAs, each broadcast q_i[d]
     * (dO_i[d]) FB_NV. The softcap's tanh is kept for its derivative. */
    for (int64_t jv = jv0; jv < jv1; jv += FB_NV * SIMD_W) {
        simd_f32 x[FB_R][FB_NV];
        fb_rows_by_tile(w->qrow, w->kt + jv, bcp, s->D, x, FB_NV);
        for (int r = 0; r < FB_R; r++)
            for (int c = 0; c < FB_NV; c++) {
                const int64_t at = r * bcp + jv + c * SIMD_W;
                if (raw) {
                    simd_store(w->p + at, x[r][c]);
                    continue;
                }
                simd_f32 xr = simd_mul(x[r][c], vscale);
                if (cap) {
                    const simd_f32 t = simd_tanh(simd_div(xr, vc));
                    simd_store(w->t + at, t);
                    xr = simd_mul(vc, t);
                }
                simd_store(w->p + at, xr); /* the score so far */
            }
        fb_rows_by_tile(w->drow, w->vt + jv, bcp, s->Dv, x, FB_NV);
        for (int r = 0; r < FB_R; r++)
            for (int c = 0; c < FB_NV; c++)
                simd_store(w->ds + r * bcp + jv + c * SIMD_W, x[r][c]); /* dP for now */
    }
    const int check = s->mask.data != NULL || s->bias != NULL;
    for (int r = 0; r < FB_R; r++) {
        const int64_t i = rows[r];
        float *p = w->p + r * bcp, *ds = w->ds + r * bcp, *dsx = w->dsx + r * bcp;
        float *vis = w->vis + r * bcp;
        if (i < 0) {
            for (int64_t jv = jv0; jv < jv1; jv += SIMD_W) {
                simd_store(vis + jv, zero);
                simd_store(p + jv, zero);
                simd_store(ds + jv, zero);
                simd_store(dsx + jv, zero);
            }
            continue;
        }
        /* Which keys are visible: the range [a, e) of the tile that the causal
         * alignment and the window let through, then, element by element within
         * it, the mask and a -inf bias; the bias and ALiBi are added there. */
        const int64_t a = ra[r], e = re[r];
        fb_fill_range(vis, a, e, jv0, jv1);
        if (check || s->alibi)
            for (int64_t j = a; j < e; j++) {
                const int64_t jj = j0 + j;
                if (check && !attn__may_attend(s, b, h, i, jj)) {
                    vis[j] = 0.0f;
                    continue;
                }
                if (s->bias)
                    p[j] += s->bias[attn__off4(s->bias_s, b, h, i, jj)];
                if (s->alibi) {
                    const int64_t dist = i + s->offset - jj;
                    p[j] -= slope * (float)(dist < 0 ? -dist : dist);
                }
            }
        /* P = exp(S - L), dS = P (dP - Delta), and the softcap's 1 - tanh^2; a
         * hidden key's three are 0, chosen, not multiplied. */
        const simd_f32 vnl2 = simd_set1(rs->nl2[sb * FB_R + r]);
        const simd_f32 vL = simd_set1(rs->L[sb * FB_R + r]);
        const simd_f32 vdelta = simd_set1(rs->delta[sb * FB_R + r]);
        for (int64_t jv = jv0; jv < jv1; jv += SIMD_W) {
            const simd_f32 vv = simd_load(vis + jv);
            const simd_f32 pv =
                raw ? simd_exp2_nonpos(simd_fma(simd_load(p + jv), vk2, vnl2))
                    : simd_exp2_nonpos(simd_mul(simd_sub(simd_load(p + jv), vL), vk2));
            const simd_f32 dsv = simd_mul(pv, simd_sub(simd_load(ds + jv), vdelta));
            simd_f32 dsxv = dsv;
            if (cap) {
                const simd_f32 t = simd_load(w->t + r * bcp + jv);
                dsxv = simd_mul(dsv, simd_sub(one, simd_mul(t, t)));
            }
            simd_store(p + jv, simd_select_lt(vv, half, zero, pv));
            simd_store(ds + jv, simd_select_lt(vv, half, zero, dsv));
            simd_store(dsx + jv, simd_select_lt(vv, half, zero, dsxv));
        }
    }
}

/* Scores a block's nsb sub-blocks of FB_R rows (rs's slots 0 .. nsb*FB_R-1, -1 an
 * unused slot) against the packed key tile j0 .. j0+n-1 as fb_rows_tile does
 * (with fb_rows_tile_fast when fast is set), each
 * over the keys its own rows reach, [jlo[sb], jhi[sb]); a sub-block none of whose
 * rows reaches the tile is not scored (jlo = jhi = 0). [*ulo, *uhi) is the union
 * (empty: both 0); within it, each sub-block's p, ds, dsx and vis outside the key
 * vectors it scored are set to 0, so that fb_kv_accumulate may take the whole
 * block over the union: those are hidden pairs' terms, zero by selection. */
static void fb_block_tile(const attn__fused_bwd_job *job, int64_t b, int64_t h,
                          const fb_rows *rs, int nsb, int64_t j0, int64_t n, float slope,
                          const fb_ws *w, int fast, int64_t jlo[FB_SB], int64_t jhi[FB_SB],
                          int64_t *ulo, int64_t *uhi)
{
    int64_t vlo[FB_SB], vhi[FB_SB], ra[FB_SB][FB_R], re[FB_SB][FB_R], lo = n, hi = 0;
    int64_t vmin = job->bcp, vmax = 0;
    /* The fast path's exponent is the one FMA, wrong for a huge L (fb_head_big). */
    fast = fast && !rs->big;
    for (int sb = 0; sb < nsb; sb++) {
        int reach = 0;
        for (int u = sb * FB_R; u < (sb + 1) * FB_R; u++)
            reach |= rs->i[u] >= 0 && rs->hi[u] > j0 && rs->lo[u] < j0 + n;
        jlo[sb] = jhi[sb] = vlo[sb] = vhi[sb] = 0;
        if (!reach)
            continue;
        if (fast)
            fb_sub_range(job, rs, sb, j0, n, SIMD_W, ra[sb], re[sb], &jlo[sb], &jhi[sb], &vlo[sb],
                         &vhi[sb]);
        else
            fb_rows_tile(job, b, h, rs, j0, n, slope, w, sb, &jlo[sb], &jhi[sb], &vlo[sb],
                         &vhi[sb]);
        if (jlo[sb] < jhi[sb]) {
            lo = fb_min(lo, jlo[sb]);
            hi = fb_max(hi, jhi[sb]);
        }
        if (vlo[sb] < vhi[sb]) {
            vmin = fb_min(vmin, vlo[sb]);
            vmax = fb_max(vmax, vhi[sb]);
        }
    }
    if (fast) {
        /* The mask's rows of each sub-block, for the slices below. */
        const attn__sdpa_shapes *s = &job->bs->s;
        const int mask = s->mask.data != NULL;
        fb_mrows mk[FB_SB];
        for (int sb = 0; mask && sb < nsb; sb++) {
            mk[sb].ms3 = s->mask.stride[3];
            mk[sb].n = n;
            for (int r = 0; r < FB_R; r++) {
                const int64_t i = rs->i[sb * FB_R + r];
                mk[sb].m[r] =
                    i >= 0 ? s->mask.data + attn__off4(s->mask.stride, b, h, i, j0) : NULL;
            }
        }
        /* Slices of FB_SLICE keys outside, sub-blocks inside: the slice's columns
         * of K^T and V^T (2 x D x FB_SLICE floats, 16 KiB for D = 64) are read by
         * every sub-block while they are in the first-level cache, where the
         * whole packed tile is not. Each key's values are computed by the same
         * operations in the same order as in fb_rows_tile, whatever the slices
         * and however many vectors a step takes. */
        for (int64_t jv = vmin / FB_SLICE * FB_SLICE; jv < vmax; jv += FB_SLICE)
            for (int sb = 0; sb < nsb; sb++) {
                const int64_t a = fb_max(jv, vlo[sb]), e = fb_min(jv + FB_SLICE, vhi[sb]);
                if (a < e) {
                    const fb_sub sub = fb_sub_of(job, w, sb);
                    fb_rows_tile_fast(job, rs->nl2 + sb * FB_R, rs->delta + sb * FB_R, &sub,
                                      ra[sb], re[sb], mask ? &mk[sb] : NULL, a, e);
                }
            }
    }
    if (hi <= lo) {
        *ulo = *uhi = 0;
        return;
    }
    *ulo = lo;
    *uhi = hi;
    const int64_t u0 = lo / SIMD_W * SIMD_W, u1 = (hi + SIMD_W - 1) / SIMD_W * SIMD_W;
    const simd_f32 zero = simd_zero();
    for (int sb = 0; sb < nsb; sb++) {
        const fb_sub v = fb_sub_of(job, w, sb);
        const int64_t a = fb_min(vlo[sb], u1), e = fb_max(vhi[sb], u0);
        if (a <= u0 && e >= u1)
            continue;
        for (int r = 0; r < FB_R; r++) {
            const int64_t at = r * job->bcp;
            for (int64_t jv = u0; jv < u1; jv += SIMD_W) {
                if (jv >= a && jv < e)
                    continue;
                simd_store(v.p + at + jv, zero);
                simd_store(v.ds + at + jv, zero);
                simd_store(v.dsx + at + jv, zero);
                simd_store(v.vis + at + jv, zero);
            }
        }
    }
}

/* acc[0 .. len-1] += a * x[0 .. len-1]; len a multiple of the vector width. */
static void fb_axpy(float *acc, float a, const float *x, int64_t len)
{
    const simd_f32 va = simd_set1(a);
    for (int64_t d = 0; d < len; d += SIMD_W)
        simd_store(acc + d, simd_fma(va, simd_load(x + d), simd_load(acc + d)));
}

/* Keys of dK and dV held in registers at once by fb_outer_acc: FB_KQ x FB_ND
 * accumulators (24 of AVX-512's 32 registers, 12 of AVX2's 16), so that each
 * loaded row vector feeds six FMAs. Four keys a tile (16 accumulators) took 2%
 * more time on S2 with one thread, AVX-512, and 5% more with AVX2, on a Sapphire
 * Rapids class Xeon; seven would not leave registers for the loaded row. On Zen 4
 * four keys took 2.6% less time than six (the 4 x 4 body's FB_KQ). */
#ifndef FB_KQ
#define FB_KQ 6
#endif

/* c[q][v] += a[q] * x[v * SIMD_W] for kq keys q and FB_ND vectors v: one row's
 * terms into fb_outer_keys' register tile. */
FB_INLINE void fb_outer_row(simd_f32 c[FB_KQ][FB_ND], const float *x, const float *a, int kq)
{
    simd_f32 xv[FB_ND];
    for (int v = 0; v < FB_ND; v++)
        xv[v] = simd_load(x + v * SIMD_W);
    for (int q = 0; q < kq; q++) {
        const simd_f32 g = simd_set1(a[q]);
        for (int v = 0; v < FB_ND; v++)
            c[q][v] = simd_fma(g, xv[v], c[q][v]);
    }
}

/* acc[(j + q) * ld + d] += sum over the nr slots u, in order, of a[u * bcp + j + q]
 * * x[u][d], for the kq keys j .. j+kq-1 (kq <= FB_KQ, a constant at each call,
 * which unrolls the loops over q) and d < len. kq x FB_ND accumulators stay in
 * registers while the rows stream past, two rows a trip (nr is even). */
FB_INLINE void fb_outer_keys(float *acc, int64_t ld, const float *a, int64_t bcp,
                             const float *const *x, int nr, int64_t len, int64_t j, int kq)
{
    int64_t d = 0;
    for (; d + FB_ND * SIMD_W <= len; d += FB_ND * SIMD_W) {
        simd_f32 c[FB_KQ][FB_ND];
        for (int q = 0; q < kq; q++)
            for (int v = 0; v < FB_ND; v++)
                c[q][v] = simd_load(acc + (j + q) * ld + d + v * SIMD_W);
        for (int u = 0; u < nr; u += 2) {
            fb_outer_row(c, x[u] + d, a + u * bcp + j, kq);
            fb_outer_row(c, x[u + 1] + d, a + (u + 1) * bcp + j, kq);
        }
        for (int q = 0; q < kq; q++)
            for (int v = 0; v < FB_ND; v++)
                simd_store(acc + (j + q) * ld + d + v * SIMD_W, c[q][v]);
    }
    for (; d < len; d += SIMD_W) {
        simd_f32 c[FB_KQ];
        for (int q = 0; q < kq; q++)
            c[q] = simd_load(acc + (j + q) * ld + d);
        for (int u = 0; u < nr; u++) {
            const simd_f32 xv = simd_load(x[u] + d);
            for (int q = 0; q < kq; q++)
                c[q] = simd_fma(simd_set1(a[u * bcp + j + q]), xv, c[q]);
        }
        for (int q = 0; q < kq; q++)
            simd_store(acc + (j + q) * ld + d, c[q]);
    }
}

/* For the keys j of [j0, j1): acc[j * ld + d] += sum over the nr slots u, in
 * order, of a[u * bcp + j] * x[u][d], d < len (a multiple of the vector width;
 * nr even): dV += P^T dO and dK += dS^T Q on one tile, FB_KQ keys at a time, then
 * four, then one. Each accumulator is loaded and stored once per nr rows. */
static void fb_outer_acc(float *acc, int64_t ld, const float *a, int64_t bcp,
                         const float *const *x, int nr, int64_t len, int64_t j0,
                         int64_t j1 FB_TRIM_PARAMS)
{
    int64_t j = j0;
#if FB_KV_TRIM
    /* A sub-block whose rows' ranges all end at or before key j (sjhi, from
     * fb_block_tile), or all start at or after key j + FB_KQ (sjlo), has P and dS
     * 0 at the group's keys: on a causal diagonal tile the leading sub-blocks of a
     * block, a third of the tile's dK and dV terms when a block of 32 rows meets
     * 64 keys (2.7% of them on S2), and with a window also the trailing ones at
     * the tile where the rows' ranges start. Leaving those terms out of sums that
     * start at +0 (and so are never -0) changes no bit. Both ends of the rows'
     * ranges grow with the row, so both ends of the sub-blocks kept only grow
     * with j (an unused slot's sub-block, sjlo = sjhi = 0, is last and all zeros).
     * With a causal window of 128 keys the backward took 4% less time; on S2 the
     * change is within the noise (docs/performance.md, "A ninth look"). */
    const int nsb = nr / FB_R;
    int s0 = 0, e = 0;
    /* A tile every sub-block reaches from end to end (the first one's keys run to
     * j1, the last one's start by j0) takes the whole block, without the search. */
    if (sjhi[0] >= j1 && sjlo[nsb - 1] <= j0)
        for (; j + FB_KQ <= j1; j += FB_KQ)
            fb_outer_keys(acc, ld, a, bcp, x, nr, len, j, FB_KQ);
    for (; j + FB_KQ <= j1; j += FB_KQ) {
        while (s0 < nsb - 1 && sjhi[s0] <= j)
            s0++;
        while (e < nsb && sjlo[e] < j + FB_KQ)
            e++;
        e = e > s0 ? e : s0 + 1;
        const int64_t sh = (int64_t)s0 * FB_R;
        fb_outer_keys(acc, ld, a + sh * bcp, bcp, x + sh, (e - s0) * FB_R, len, j, FB_KQ);
    }
#else
    for (; j + FB_KQ <= j1; j += FB_KQ)
        fb_outer_keys(acc, ld, a, bcp, x, nr, len, j, FB_KQ);
#endif
    for (; j + 4 <= j1; j += 4)
        fb_outer_keys(acc, ld, a, bcp, x, nr, len, j, 4);
    for (; j < j1; j++)
        fb_outer_keys(acc, ld, a, bcp, x, nr, len, j, 1);
}

/* dV_j += sum_r P_rj dO_r and dK_j += sum_r dS_rj q_r (before the scale) for the
 * tile's keys [jlo, jhi), from the nr rows of the block fb_block_tile just scored
 * (outside that range every row's P and dS are 0). finite says every row's q and
 * dO is finite. */
static void fb_kv_accumulate(const attn__fused_bwd_job *job, const fb_ws *w, int nr,
                             int64_t jlo, int64_t jhi FB_TRIM_PARAMS, int finite)
{
    const int64_t bcp = job->bcp, dp = job->dp, dvp = job->dvp;
    if (finite) {
        /* A hidden (i, j) adds 0 * a finite number: nothing. */
        fb_outer_acc(w->acc2, dvp, w->p, bcp, w->drow, nr, dvp, jlo, jhi FB_TRIM_ARGS(sjlo, sjhi));
        fb_outer_acc(w->acc1, dp, w->dsx, bcp, w->qrow, nr, dp, jlo, jhi FB_TRIM_ARGS(sjlo, sjhi));
        return;
    }
    /* A NaN or inf in a row's q or dO must not reach the keys that row cannot
     * see: skip them, as the reference does. */
    for (int64_t j = jlo; j < jhi; j++)
        for (int u = 0; u < nr; u++)
            if (w->vis[u * bcp + j] != 0.0f) {
                fb_axpy(w->acc2 + j * dvp, w->p[u * bcp + j], w->drow[u], dvp);
                fb_axpy(w->acc1 + j * dp, w->dsx[u * bcp + j], w->qrow[u], dp);
            }
}

/* dst[r * ld0 + d * ld1] = scale * src[r * lds + d] for r < rows, d < cols: an
 * accumulator's rows written out, a vector at a time where the destination's row
 * is contiguous (the same product, so the same bits; 1 * x is x). */
static void fb_put_rows(float *dst, int64_t ld0, int64_t ld1, const float *src, int64_t lds,
                        int64_t rows, int64_t cols, float scale)
{
    const simd_f32 vs = simd_set1(scale);
    for (int64_t r = 0; r < rows; r++) {
        float *out = dst + r * ld0;
        const float *in = src + r * lds;
        int64_t d = 0;
        if (ld1 == 1)
            for (; d + SIMD_W <= cols; d += SIMD_W)
                simd_store(out + d, simd_mul(vs, simd_load(in + d)));
        for (; d < cols; d++)
            out[d * ld1] = scale * in[d];
    }
}

/* fb_put_rows for a write-out from scratch that is not read again (each item's
 * accumulators are zeroed before their next use): when the destination's rows lie
 * one after another with no gap and the scratch's rows are as long as the
 * destination's, the scratch is scaled in place (the same products, so the same
 * bits) and the block goes out in one memcpy.
 * The stores of the write-out miss the caches (the outputs were last touched by
 * another call), and a vector store to such a line waits for the line to be read
 * first (a read for ownership). glibc copies blocks this large with rep movsb,
 * which Intel's manual describes as working a cache line at a time, invalidating
 * the destination's line instead of reading it (SDM vol. 3, "Out-of-Order Stores
 * For String Operations"). On S2 the backward took 2% less time with one thread
 * (docs/performance.md, "A fourth look"). */
/* Floats scaled and copied at a time by fb_put_block: 16 KiB, a third of the
 * first-level cache, and large enough for glibc to copy with rep movsb. */
#define FB_PUT_PIECE 4096

static void fb_put_block(float *dst, int64_t ld0, int64_t ld1, float *src, int64_t lds,
                         int64_t rows, int64_t cols, float scale)
{
    if (ld1 != 1 || ld0 != cols || lds != cols) {
        fb_put_rows(dst, ld0, ld1, src, lds, rows, cols, scale);
        return;
    }
    /* In pieces of FB_PUT_PIECE floats, each scaled and then copied while it is
     * still in the first-level cache: a block larger than the second-level cache
     * (GQA's dQ rows of S8, 4 MiB an item) would otherwise be read from further
     * out twice, once by the scaling and once by the copy. */
    const int64_t n = rows * cols;
    const simd_f32 vs = simd_set1(scale);
    for (int64_t x0 = 0; x0 < n; x0 += FB_PUT_PIECE) {
        const int64_t x1 = fb_min(n, x0 + FB_PUT_PIECE);
        if (scale != 1.0f) {
            int64_t x = x0;
            for (; x + SIMD_W <= x1; x += SIMD_W)
                simd_store(src + x, simd_mul(vs, simd_load(src + x)));
            for (; x < x1; x++)
                src[x] = scale * src[x];
        }
        memcpy(dst + x0, src + x0, (size_t)(x1 - x0) * sizeof(float));
    }
}

/* Row i of (b, h), whose job->sees[row] already says whether it sees a key:
 * Delta_i = rowsum(dO_i * O_i) (0 for a row that sees none) and whether its q and
 * dO are all finite. */
static void fb_row_delta(const attn__fused_bwd_job *job, int64_t b, int64_t h, int64_t i)
{
    const attn__sdpa_bwd_shapes *bs = job->bs;
    const attn__sdpa_shapes *s = &bs->s;
    const int64_t row = (b * s->H + h) * s->Tq + i;
    const int sees = (job->sees[row] & FB_ROW_SEES) != 0;
    /* x * 0 is 0 for a finite x and NaN for an inf or a NaN, so the sum is 0
     * exactly when both rows are finite. */
    simd_f32 zv = simd_zero();
    const simd_f32 zero = simd_zero();
    int64_t dq0 = 0, dd0 = 0;
    if (s->q_s[3] == 1) {
        const float *pq = job->q + attn__off4(s->q_s, b, h, i, 0);
        for (; dq0 + SIMD_W <= s->D; dq0 += SIMD_W)
            zv = simd_fma(simd_load(pq + dq0), zero, zv);
    }
    if (bs->do_s[3] == 1) {
        const float *pd = job->dout + attn__off4(bs->do_s, b, h, i, 0);
        for (; dd0 + SIMD_W <= s->Dv; dd0 += SIMD_W)
            zv = simd_fma(simd_load(pd + dd0), zero, zv);
    }
    float z = simd_hsum(zv);
    for (int64_t d = dq0; d < s->D; d++)
        z += job->q[attn__off4(s->q_s, b, h, i, d)] * 0.0f;
    for (int64_t d = dd0; d < s->Dv; d++)
        z += job->dout[attn__off4(bs->do_s, b, h, i, d)] * 0.0f;
    job->sees[row] = (unsigned char)((sees ? FB_ROW_SEES : 0) | (z == 0.0f ? FB_ROW_FINITE : 0));
    float dl = 0.0f;
    if (sees) {
        /* Gathered, then summed a vector at a time; the reference's order is
         * plain left to right, and the two differ only by rounding. */
        simd_f32 acc = simd_zero();
        int64_t d = 0;
        if (bs->do_s[3] == 1 && s->o_s[3] == 1) {
            const float *pd = job->dout + attn__off4(bs->do_s, b, h, i, 0);
            const float *po = job->o + attn__off4(s->o_s, b, h, i, 0);
            for (; d + SIMD_W <= s->Dv; d += SIMD_W)
                acc = simd_fma(simd_load(pd + d), simd_load(po + d), acc);
        }
        dl = simd_hsum(acc);
        for (; d < s->Dv; d++)
            dl += job->dout[attn__off4(bs->do_s, b, h, i, d)] *
                  job->o[attn__off4(s->o_s, b, h, i, d)];
    }
    job->delta[row] = dl;
}

/* Pass 0, item (b, h): whether each row sees a key, the first row that sees none
 * recorded for the EMPTY_ROW error, and (fb_row_delta) Delta and the finiteness
 * of each row; the one-pass form leaves the last two to its items, which read
 * those rows' dO and q soon after anyway. */
static void fb_delta_item(void *arg, int64_t item, int worker)
{
    const attn__fused_bwd_job *job = (const attn__fused_bwd_job *)arg;
    const attn__sdpa_bwd_shapes *bs = job->bs;
    const attn__sdpa_shapes *s = &bs->s;
    const int64_t b = item / s->H, h = item % s->H;
    const int check = s->mask.data != NULL || s->bias != NULL;
    for (int64_t i = 0; i < s->Tq; i++) {
        const int64_t row = item * s->Tq + i;
        int64_t lo, hi;
        fb_row_range(s, i, &lo, &hi);
        int sees = lo < hi;
        if (sees && check) {
            sees = 0;
            for (int64_t j = lo; j < hi && !sees; j++)
                sees = attn__may_attend(s, b, h, i, j);
        }
        job->sees[row] = sees ? FB_ROW_SEES : 0;
        job->delta[row] = 0.0f;
        if (!sees && row < job->empty_first[worker])
            job->empty_first[worker] = row;
        if (!job->one_pass)
            fb_row_delta(job, b, h, i);
    }
}

/* Pass 1, item (b, hk, key tile): rows j0 .. j1-1 of dK and dV of (b, hk). */
static void fb_kv_item(void *arg, int64_t item, int worker)
{
    const attn__fused_bwd_job *job = (const attn__fused_bwd_job *)arg;
    const attn__sdpa_bwd_shapes *bs = job->bs;
    const attn__sdpa_shapes *s = &bs->s;
    const int64_t kt = item % job->n_kt, bhk = item / job->n_kt;
    const int64_t b = bhk / s->Hkv, hk = bhk % s->Hkv;
    const int64_t j0 = kt * job->bc, n = fb_min(job->bc, s->Tk - j0);
    const int64_t dp = job->dp, dvp = job->dvp;
    fb_ws w = fb_ws_of(job, worker);

    memset(w.acc1, 0, (size_t)(n * dp) * sizeof(float));
    memset(w.acc2, 0, (size_t)(n * dvp) * sizeof(float));
    fb_pack_kv(job, b, hk, j0, n, &w, 0);
    for (int64_t h = hk * s->group; h < (hk + 1) * s->group; h++) {
        const float slope = attn__alibi_slope(s, h);
        const int big = fb_head_big(job, b, h);
        int64_t i = fb_first_row_past(s, j0);
        while (i < s->Tq) {
            /* The next FB_RB rows, in order, that see a key of this tile. */
            fb_rows rs;
            rs.big = big;
            int r = 0, finite = 1;
            for (; i < s->Tq && r < FB_RB; i++) {
                int64_t lo, hi;
                fb_row_range(s, i, &lo, &hi);
                if (lo >= j0 + n) {
                    i = s->Tq; /* and so does every later row's */
                    break;
                }
                if (hi <= j0 || !(job->sees[(b * s->H + h) * s->Tq + i] & FB_ROW_SEES))
                    continue;
                fb_rows_set(job, b, h, &rs, r, i);
                finite &= fb_load_row(job, b, h, i, r, &w);
                r++;
            }
            if (r == 0)
                break;
            const int nsb = (r + FB_R - 1) / FB_R;
            for (int u = r; u < nsb * FB_R; u++) {
                fb_rows_set(job, b, h, &rs, u, -1);
                fb_load_row(job, b, h, -1, u, &w);
            }
            int64_t jlo[FB_SB], jhi[FB_SB], ulo, uhi;
            fb_block_tile(job, b, h, &rs, nsb, j0, n, slope, &w, fb_simple(s) && finite, jlo,
                          jhi, &ulo, &uhi);
            fb_kv_accumulate(job, &w, nsb * FB_R, ulo, uhi FB_TRIM_ARGS(jlo, jhi), finite);
        }
    }
    fb_put_block(job->dk + attn__off4(bs->dk_s, b, hk, j0, 0), bs->dk_s[2], bs->dk_s[3], w.acc1,
                 dp, n, s->D, s->scale);
    fb_put_block(job->dv + attn__off4(bs->dv_s, b, hk, j0, 0), bs->dv_s[2], bs->dv_s[3], w.acc2,
                 dvp, n, s->Dv, 1.0f);
}

/* dQ_i += sum_j dS_ij k_j for the FB_R rows' slots into acc[u] (dp floats each;
 * an unused slot's dS row is all zeros and its acc a scratch row), over the keys
 * [j0, j1) of the tile's packed rows w->krow (outside them every dS is 0). Each
 * loaded key vector feeds the FB_R rows, FB_NV vectors of d at a time; each
 * element's sum runs over j in order, the order of pass 2, and the zero terms it
 * leaves out could only add +0 to a sum that is never -0: both give the same
 * bits. Only for a tile whose k is all finite (a hidden key then adds 0 * k). */
static void fb_dq_rows(float *const acc[FB_R], const float *dsx, int64_t bcp,
                       const float *krow, int64_t dp, int64_t j0, int64_t j1)
{
    int64_t d = 0;
    for (; d + FB_NV * SIMD_W <= dp; d += FB_NV * SIMD_W) {
        simd_f32 c[FB_R][FB_NV];
        for (int u = 0; u < FB_R; u++)
            for (int v = 0; v < FB_NV; v++)
                c[u][v] = simd_load(acc[u] + d + v * SIMD_W);
        for (int64_t j = j0; j < j1; j++) {
            simd_f32 kv[FB_NV];
            for (int v = 0; v < FB_NV; v++)
                kv[v] = simd_load(krow + j * dp + d + v * SIMD_W);
            for (int u = 0; u < FB_R; u++) {
                const simd_f32 g = simd_set1(dsx[u * bcp + j]);
                for (int v = 0; v < FB_NV; v++)
                    c[u][v] = simd_fma(g, kv[v], c[u][v]);
            }
        }
        for (int u = 0; u < FB_R; u++)
            for (int v = 0; v < FB_NV; v++)
                simd_store(acc[u] + d + v * SIMD_W, c[u][v]);
    }
    for (; d < dp; d += SIMD_W) {
        simd_f32 c[FB_R];
        for (int u = 0; u < FB_R; u++)
            c[u] = simd_load(acc[u] + d);
        for (int64_t j = j0; j < j1; j++) {
            const simd_f32 kv = simd_load(krow + j * dp + d);
            for (int u = 0; u < FB_R; u++)
                c[u] = simd_fma(simd_set1(dsx[u * bcp + j]), kv, c[u]);
        }
        for (int u = 0; u < FB_R; u++)
            simd_store(acc[u] + d, c[u]);
    }
}

/* 1 when a mask with one row for every query of (b, h) (a padding mask [B, 1, 1,
 * Tk] or [B, H, 1, Tk]: stride 0 along the queries) hides every key of the tile
 * j0 .. j0+n-1 that the block's r rows reach. Such a tile adds nothing but terms
 * 0 * x (P and dS chosen 0) to sums that start at +0 and so are never -0, or
 * skips them (non-finite rows): leaving it out gives the same bits. Other masks
 * would need a row each, which costs more to read than it saves. */
static int fb_mask_hides_tile(const attn__sdpa_shapes *s, int64_t b, int64_t h, const fb_rows *rs,
                              int r, int64_t j0, int64_t n)
{
    if (!s->mask.data || s->mask.stride[2] != 0)
        return 0;
    int64_t a = j0 + n, e = j0;
    for (int u = 0; u < r; u++)
        if (rs->hi[u] > j0 && rs->lo[u] < j0 + n) {
            a = fb_min(a, fb_max(rs->lo[u], j0));
            e = fb_max(e, fb_min(rs->hi[u], j0 + n));
        }
    const uint8_t *m = s->mask.data + attn__off4(s->mask.stride, b, h, 0, 0);
    const int64_t ms3 = s->mask.stride[3];
    for (int64_t j = a; j < e; j++)
        if (m[j * ms3])
            return 0;
    return 1;
}

/* The one-pass form, item (b, hk): every gradient of the key/value head hk of
 * sample b and of its group's query heads. Key tiles run in order; for each, dK
 * and dV of the tile as in pass 1, and, from the same P and dS, dQ of each row
 * that sees the tile, added into the item's own rows of w->dqacc [group][Tq][dp]
 * in key-tile order, as pass 2 would. Five products per visible pair instead of
 * the two passes' seven; the planner chooses it (by the shapes alone, never the
 * thread count) when there are enough (b, hk) items to share among threads and no
 * dbias is wanted. */
static void fb_head_item(void *arg, int64_t item, int worker)
{
    const attn__fused_bwd_job *job = (const attn__fused_bwd_job *)arg;
    const attn__sdpa_bwd_shapes *bs = job->bs;
    const attn__sdpa_shapes *s = &bs->s;
    const int64_t b = item / s->Hkv, hk = item % s->Hkv;
    const int64_t bcp = job->bcp, dp = job->dp, dvp = job->dvp;
    fb_ws w = fb_ws_of(job, worker);
    float *const dqacc = w.dqacc;
    memset(dqacc, 0, (size_t)(s->group * s->Tq * dp) * sizeof(float));
    for (int64_t g = 0; g < s->group; g++)
        for (int64_t i = 0; i < s->Tq; i++)
            fb_row_delta(job, b, hk * s->group + g, i);
    memset(w.dqpad, 0, (size_t)dp * sizeof(float));

    /* FB_KC key tiles at a time: a block of rows loaded (q, dO, its dQ rows) serves
     * all of them, so the rows stream from memory FB_KC times less often while the
     * tiles' packed K, V and dK, dV accumulators stay in the core's cache. Each
     * tile still sees the heads and rows in order, and each dQ row the tiles in
     * order: the sums are the same as one tile at a time. */
    for (int64_t kc = 0; kc < job->n_kt; kc += FB_KC) {
        const int nt = (int)fb_min(FB_KC, job->n_kt - kc);
        fb_ws wt[FB_KC];
        int64_t j0[FB_KC], n[FB_KC];
        int packed[FB_KC], kfinite[FB_KC];
        for (int c = 0; c < nt; c++) {
            wt[c] = fb_ws_tile(job, &w, c);
            j0[c] = (kc + c) * job->bc;
            n[c] = fb_min(job->bc, s->Tk - j0[c]);
            packed[c] = 0;
            kfinite[c] = 1;
            memset(wt[c].acc1, 0, (size_t)(n[c] * dp) * sizeof(float));
            memset(wt[c].acc2, 0, (size_t)(n[c] * dvp) * sizeof(float));
        }
        const int64_t J0 = j0[0], J1 = j0[nt - 1] + n[nt - 1];
        const int64_t first = fb_first_row_past(s, J0);
        for (int64_t g = 0; g < s->group; g++) {
            const int64_t h = hk * s->group + g;
            const float slope = attn__alibi_slope(s, h);
            const int big = fb_head_big(job, b, h);
            int64_t i = first;
            while (i < s->Tq) {
                /* The next FB_RB rows, in order, that see a key of these tiles. */
                fb_rows rs;
                rs.big = big;
                float *dqrow[FB_RB];
                int r = 0, finite = 1;
                for (; i < s->Tq && r < FB_RB; i++) {
                    int64_t lo, hi;
                    fb_row_range(s, i, &lo, &hi);
                    if (lo >= J1) {
                        i = s->Tq; /* and so does every later row's */
                        break;
                    }
                    if (hi <= J0 || !(job->sees[(b * s->H + h) * s->Tq + i] & FB_ROW_SEES))
                        continue;
                    fb_rows_set(job, b, h, &rs, r, i);
                    dqrow[r] = dqacc + (g * s->Tq + i) * dp;
                    finite &= fb_load_row(job, b, h, i, r, &w);
                    r++;
                }
                if (r == 0)
                    break;
                const int nsb = (r + FB_R - 1) / FB_R;
                for (int u = r; u < nsb * FB_R; u++) {
                    fb_rows_set(job, b, h, &rs, u, -1);
                    dqrow[u] = w.dqpad; /* an unused slot adds its zeros here */
                    fb_load_row(job, b, h, -1, u, &w);
                }
                for (int c = 0; c < nt; c++) {
                    /* Only the tiles some row of the block reaches. */
                    int reach = 0;
                    for (int u = 0; u < r; u++)
                        reach |= rs.hi[u] > j0[c] && rs.lo[u] < j0[c] + n[c];
                    if (!reach || fb_mask_hides_tile(s, b, h, &rs, r, j0[c], n[c]))
                        continue;
                    if (!packed[c]) {
                        kfinite[c] = fb_pack_kv(job, b, hk, j0[c], n[c], &wt[c], 1);
                        packed[c] = 1;
                    }
                    fb_ws *v = &wt[c];
                    memcpy(v->qrow, w.qrow, sizeof w.qrow);
                    memcpy(v->drow, w.drow, sizeof w.drow);
                    int64_t jlo[FB_SB], jhi[FB_SB], ulo, uhi;
                    fb_block_tile(job, b, h, &rs, nsb, j0[c], n[c], slope, v,
                                  fb_simple(s) && finite && kfinite[c], jlo, jhi, &ulo, &uhi);
                    fb_kv_accumulate(job, v, nsb * FB_R, ulo, uhi FB_TRIM_ARGS(jlo, jhi), finite);
                    for (int sb = 0; sb < nsb; sb++) {
                        const float *dsx = v->dsx + (int64_t)sb * FB_R * bcp;
                        const float *vis = v->vis + (int64_t)sb * FB_R * bcp;
                        float *const *dq = dqrow + sb * FB_R;
                        if (jlo[sb] >= jhi[sb])
                            continue;
                        if (kfinite[c]) {
                            fb_dq_rows(dq, dsx, bcp, v->krow, dp, jlo[sb], jhi[sb]);
                            continue;
                        }
                        for (int u = 0; u < FB_R && sb * FB_R + u < r; u++)
                            for (int64_t j = jlo[sb]; j < jhi[sb]; j++)
                                if (vis[u * bcp + j] != 0.0f)
                                    fb_axpy(dq[u], dsx[u * bcp + j], v->krow + j * dp, dp);
                    }
                }
            }
        }
        for (int c = 0; c < nt; c++) {
            fb_put_block(job->dk + attn__off4(bs->dk_s, b, hk, j0[c], 0), bs->dk_s[2],
                         bs->dk_s[3], wt[c].acc1, dp, n[c], s->D, s->scale);
            fb_put_block(job->dv + attn__off4(bs->dv_s, b, hk, j0[c], 0), bs->dv_s[2],
                         bs->dv_s[3], wt[c].acc2, dvp, n[c], s->Dv, 1.0f);
        }
    }
    for (int64_t g = 0; g < s->group; g++)
        fb_put_block(job->dq + attn__off4(bs->dq_s, b, hk * s->group + g, 0, 0), bs->dq_s[2],
                     bs->dq_s[3], dqacc + g * s->Tq * dp, dp, s->Tq, s->D, s->scale);
}

/* Pass 2, item (b, h, query tile): rows i0 .. i1-1 of dQ of (b, h), and their
 * share of dbias when it is wanted. */
static void fb_q_item(void *arg, int64_t item, int worker)
{
    const attn__fused_bwd_job *job = (const attn__fused_bwd_job *)arg;
    const attn__sdpa_bwd_shapes *bs = job->bs;
    const attn__sdpa_shapes *s = &bs->s;
    const int64_t qt = item % job->n_qt, bh = item / job->n_qt;
    const int64_t b = bh / s->H, h = bh % s->H, hk = h / s->group;
    const int64_t i0 = qt * job->br, m = fb_min(job->br, s->Tq - i0);
    const int64_t bcp = job->bcp, dp = job->dp;
    const float slope = attn__alibi_slope(s, h);
    const int big = fb_head_big(job, b, h);
    fb_ws w = fb_ws_of(job, worker);

    memset(w.acc1, 0, (size_t)(m * dp) * sizeof(float));
    memset(w.dqpad, 0, (size_t)dp * sizeof(float));
    int64_t lo, hi, lo_last, hi_last;
    fb_row_range(s, i0, &lo, &hi);
    fb_row_range(s, i0 + m - 1, &lo_last, &hi_last);
    for (int64_t j0 = lo / job->bc * job->bc; j0 < hi_last; j0 += job->bc) {
        const int64_t n = fb_min(job->bc, s->Tk - j0);
        int packed = 0, kfinite = 1;
        int64_t r0 = 0;
        while (r0 < m) {
            fb_rows rs;
            rs.big = big;
            int64_t slot[FB_R];
            int r = 0;
            for (; r0 < m && r < FB_R; r0++) {
                const int64_t i = i0 + r0;
                int64_t a, e;
                fb_row_range(s, i, &a, &e);
                if (e <= j0 || a >= j0 + n || !(job->sees[bh * s->Tq + i] & FB_ROW_SEES))
                    continue;
                if (!packed) {
                    kfinite = fb_pack_kv(job, b, hk, j0, n, &w, 1);
                    packed = 1;
                }
                fb_rows_set(job, b, h, &rs, r, i);
                slot[r] = r0;
                fb_load_row(job, b, h, i, r, &w);
                r++;
            }
            if (r == 0)
                break;
            for (int u = r; u < FB_R; u++) {
                fb_rows_set(job, b, h, &rs, u, -1);
                fb_load_row(job, b, h, -1, u, &w);
            }
            int64_t jlo, jhi, vlo, vhi;
            fb_rows_tile(job, b, h, &rs, j0, n, slope, &w, 0, &jlo, &jhi, &vlo, &vhi);
            if (kfinite) {
                /* A hidden key adds 0 * a finite k: nothing. */
                float *dqrow[FB_R];
                for (int u = 0; u < FB_R; u++)
                    dqrow[u] = u < r ? w.acc1 + slot[u] * dp : w.dqpad;
                fb_dq_rows(dqrow, w.dsx, bcp, w.krow, dp, jlo, jhi);
            }
            for (int u = 0; u < r; u++) {
                const float *dsx = w.dsx + u * bcp, *vis = w.vis + u * bcp;
                if (!kfinite)
                    for (int64_t j = jlo; j < jhi; j++)
                        if (vis[j] != 0.0f)
                            fb_axpy(w.acc1 + slot[u] * dp, dsx[j], w.krow + j * dp, dp);
                if (bs->dbias)
                    for (int64_t j = jlo; j < jhi; j++)
                        if (vis[j] != 0.0f)
                            bs->dbias[attn__off4(bs->dbias_s, b, h, rs.i[u], j0 + j)] +=
                                w.ds[u * bcp + j];
            }
        }
    }
    fb_put_block(job->dq + attn__off4(bs->dq_s, b, h, i0, 0), bs->dq_s[2], bs->dq_s[3], w.acc1,
                 dp, m, s->D, s->scale);
}

#endif /* ATTN_FUSED_BACKWARD_H */
