/*
 * fused_kernel.h - the fused attention kernel: its contract, and the body written
 * once over the SIMD layer of src/kernels/simd.h and compiled once per instruction
 * set by src/kernels/sdpa_fused.c (portable C), src/kernels/sdpa_fused_avx2.c and
 * src/kernels/sdpa_fused_avx512.c. Not a public header; it is included only by
 * those three files, each of which defines ATTN_SIMD_<ISA> and the micro-tile sizes
 *
 *     FK_MK   keys per micro-tile of the score product
 *     FK_NQV  vectors of query rows per micro-tile of the score product
 *     FK_MR   query rows per micro-tile of the weighted sum
 *     FK_NV   vectors of value columns per micro-tile of the weighted sum
 *
 * and then exports fk_ws_floats, fk_item and fk_exp_nonpos (below) through an
 * attn__fused_kernel. The body is in three headers:
 *
 *     fused_common.h  index helpers, the key/value head, which keys a query sees
 *     fused_tile.h    the tile path, in named steps (pack, score, online-softmax
 *                     update, accumulate, finish, write weights)
 *     fused_row.h     the row path, for a handful of query rows
 *
 * THE CONTRACT
 *
 * What it computes: for one (b, h) and a tile of query rows i0 .. i1-1, with the
 * online softmax of Milakov and Gimelshein (arXiv 1805.02867) in the tiled form of
 * FlashAttention (Dao et al., arXiv 2205.14135; loop order of FlashAttention-2,
 * arXiv 2307.08691: the query tile is the outer loop and owns its output):
 *
 *     m_i = -inf, l_i = 0, O_i = 0                      fk_tile_begin
 *         (with a sink: m_i = sink_h, l_i = 1)
 *     for each key tile j0 .. j1-1 within [lo(i0), hi(i1-1)) not hidden entirely:
 *         pack the value tile (or read it in place)     fk_value_tile
 *         S = (Q K^T) * scale                           fk_scores   [bc, br] in scratch
 *         S = softcap, + bias, + ALiBi                  fk_score_mod
 *         hidden entries = -inf                         fk_scores
 *         m_new = max(m_i, max_j S_ij)                  fk_softmax_stats
 *         P_ij = exp(S_ij - m_new)                        (exactly 0 where masked)
 *         l_i = l_i * exp(m_i - m_new) + sum_j P_ij
 *         m_i = m_new
 *         O_i = O_i * exp(m_i - m_new) + P V            fk_accumulate [br, Dv] in scratch
 *     out_i = O_i / l_i, lse_i = m_i + log(l_i)         fk_finish
 *     weights, only when asked for                      fk_write_weights
 *
 * On the tile path S holds the scores times log2(e) (fk_scores: the factor joins
 * the scale, or follows the softcap), m likewise, so each exp above is a 2^x
 * (simd_exp2_nonpos, cheaper than e^x), and lse = m ln 2 + log(l). The row and
 * split paths keep the scores as they are and use e^x (simd_exp_nonpos).
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
 * for tiles whose keys are all below Tk, with unit-stride rows of a multiple of
 * the vector width (a PARTIAL one only when its values are all finite, below),
 * else from a packed copy [bc][dvp].
 *
 * Tile sizes: br query rows and bc keys, chosen once per process for the
 * microarchitecture (attn__fused_tiles, src/runtime/dispatch.c: 64 x 64 unless that
 * file says otherwise for the family) or forced with ATTN_TILE=BRxBC, and recorded
 * in the plan; the planner in sdpa_fused.c shrinks them to the problem when it is
 * smaller, rounded up to FK_QW and FK_MK. They never depend on the thread count.
 * Scratch per worker, caller-allocated, never allocated here (fk_tile_ws_floats):
 * Q^T [br][D] twice (this item's, and the next one's, packed during this item's
 * last key tile), the value tile [bc][dvp], the scores/weights [bc][br], the output
 * accumulator [br][dvp] and m, l, the correction factor and 1/l, [br] each. With
 * D = Dv = 64 that is about 81 KiB, which stays in L2 while the key tiles stream.
 *
 * Tails: micro-kernels only ever see whole micro-tiles. Query rows past Tq are
 * packed as zeros (computed, never written); keys past Tk re-read the last key
 * (valid memory) and their scores are set to -inf; value columns past Dv are zeros
 * in the packed copy (dvp = Dv rounded up to the vector width), and a tile with
 * such columns or missing keys always uses the packed copy. The head dim D is the
 * reduction axis of the score product and needs no padding.
 *
 * Masks: each key tile is classified once per query tile (fk_tile_kind): SKIP when
 * the causal alignment, the window or the explicit mask hides every (i, j) of it -
 * it is then never loaded; FULL when nothing in it is hidden - no mask work at all;
 * PARTIAL otherwise - the ranges, the mask (any numpy-broadcast boolean view, read
 * through attn__mask4's strides) and a -inf bias are applied element by element
 * after the scale and the score modifications. Hiding comes last so that any scale,
 * even a negative one, and any score leave hidden entries at -inf.
 *
 * Non-finite values, one rule on both paths, the reference's and PyTorch's: a NaN
 * or an inf in q, k or v reaches every row whose softmax includes that key, and a
 * masked key never reaches the output. So the kernel may skip a key only because
 * it is masked, never because its weight is 0: a key whose weight underflowed to 0
 * but that is not masked still multiplies its value (0 * NaN = NaN, 0 * inf = NaN).
 * On the tile path a FULL tile masks nothing and multiplies every weight, with no
 * check; a PARTIAL tile's values are checked for inf/NaN, where they lie
 * (fk_check_v) or as they are packed (fk_pack_v), and only a tile that holds one
 * is packed and takes a plain loop that skips the masked (i, j)
 * (fk_accumulate_visible), with the micro-kernel's order, so rows the bad value
 * does not reach keep their bits. The row path skips masked keys by the
 * mask itself (fk_row_pv). A row whose every visible score is -inf has l = 0 like
 * an empty row, but is not one: the reference's exp(-inf - -inf) makes it NaN, and
 * the kernel tells the two apart by the mask (fk_finish). In a NaN row the weights
 * of masked keys are NaN too (0 / NaN, as in the reference and PyTorch). One
 * difference is left, in the exp itself (simd.h): below -87.33 it gives exactly 0
 * where expf still gives a subnormal (down to -103.97), so an inf value at a key
 * whose score is 87.33 to 103.97 below its row's max gives inf in the reference
 * and NaN here (a NaN value gives NaN in both). And one in the order: the online
 * softmax multiplies a key's value by exp(s - m) with the running max of the tiles
 * seen so far, so an inf value at a key whose final weight underflows to 0 (the
 * reference's 0 * inf = NaN) may have met a nonzero weight first and give inf
 * here; it takes scores more than 87 apart in one row (found by
 * tests/test_bf16_tile_edges.c's review with q and k scaled up 4-16 times).
 *
 * Work items: one item is (b, h, query tile); items are independent and each
 * writes only its own rows of out (and weights), so the result does not depend on
 * which thread runs an item or how many threads there are. Query tile boundaries
 * depend only on the shapes, never on the thread count.
 *
 * Weights: only when asked for; after the output pass, the item recomputes each
 * key tile's scores and writes exp(S - m_i) / l_i straight into the caller's
 * weights (zeros for empty rows; 0 * (1 / l_i) for hidden tiles, which is zero
 * except in a NaN row). No [Tq, Tk] scratch is used.
 *
 * The row path (job->row_path, fused_row.h) serves problems with a handful of
 * query rows (ATTN__FUSED_ROW_MAX in sdpa_fused.h), such as one decoding step
 * against a cache (S5) or the chapter's toy size: one item is one (b, h) and its
 * few query rows; K and V rows are read in place (unit stride along the head dim
 * required), K in a score phase and V in a weighted-sum phase, the rows' scores
 * kept in a [Tq][Tk] scratch block (Tq <= 8), so the bandwidth goes to K and V only. Tails along D and Dv use
 * partial vector loads.
 *
 * WHERE EACH OPTION OF SPEC SECTION 6 ENTERS (the contract's order per score:
 * s = scale * q.k -> softcap -> + bias + ALiBi -> hidden keys -inf -> softmax with
 * the sink; sdpa_contract.h's attn__score_mod and attn__may_attend say it once for
 * every kernel):
 *
 *   GQA/MQA      fk_kv_head: query head h reads key/value head h / (H / Hkv), in
 *                place; nothing is repeated or copied.
 *   causal       fk_row_range (fused_common.h): query i sees keys below hi(i) =
 *   (both), and  i + 1 (top-left) or i + Tk - Tq + 1 (bottom-right), the window's
 *   the window   i' + right + 1 if smaller, and from lo(i) = i' - left; both ends
 *                grow with i. A query tile visits only the key tiles meeting
 *                [lo(i0), hi(i1 - 1)) (fk_tile_item, from a multiple of bc, so the
 *                order of sums depends on the shapes only): a window of w keys costs
 *                O(Tq * w), not O(Tq * Tk). fk_tile_kind counts, row by row, the pairs
 *                the ranges let through (SKIP at 0, FULL when all), and fk_scores
 *                sets -inf on the prefix of rows whose range ends at or before key j
 *                and the suffix whose range starts after it. The row path computes
 *                scores for [lo(i), hi(i)) only.
 *   softcap      fk_score_mod / the row path's phase 2: c * tanh(S / c) with the
 *                vector tanh of simd.h (within 1.5 ulp, tests/test_fused_tanh.c),
 *                right after the scale, on every tile, FULL ones included.
 *   bias         fk_score_mod: added after the softcap, read through its strides (0
 *                on broadcast axes), never copied. Any entry may be -inf, so a tile
 *                under a bias is never FULL: its -inf entries are hidden keys
 *                (fk_scores sets them to -inf after the additions, whatever the
 *                score, even NaN, as attn__may_attend says), and its values are
 *                packed and checked like any tile with a hidden key.
 *   ALiBi        fk_score_mod: - slope_h * |i' - j| computed per tile from the row
 *                and key indices (exact in float32 below 2^24), never stored as a
 *                [Tq, Tk] array; the slope is taken once per item.
 *   sinks        fk_tile_begin: the sink is the online softmax's first term, m =
 *                sink (times log2(e) on the tile path, kept within
 *                +-FLT_MAX there), l = exp(sink - sink) = 1,
 *                with no value (O = 0); the usual
 *                rescaling carries it. A row whose keys are all hidden keeps l = 1
 *                and O = 0: zero output, and no empty-row error.
 *   lse          fk_finish: m + log(l) (the sink included; the tile path's m times
 *                ln 2, or the sink itself while it is the max); an empty row gives the
 *                sink, or -inf without one; a NaN row NaN. The row path writes the
 *                same in its phase 2.
 *
 * Split-key decoding (fused_split.h): on the row path, when there are fewer than
 * ATTN__SPLIT_ITEMS (batch, key/value head) pairs and enough keys, and the weights
 * are not asked for, the keys are cut into chunks whose number and bounds depend
 * on the shapes only (sdpa_fused.c, job_layout). An item is then one (b, key/value
 * head, chunk) and serves all the group's query rows, so K and V are read once per
 * key/value head; it leaves each row's partial (m, l, O) in the plan's scratch, and
 * a second pass merges the partials by their log-sum-exp in chunk order, adding the
 * sink's term once. Every option above applies per key inside the chunk exactly as
 * on the row path; the same bits come out for any thread count.
 *
 * The KV cache attends new queries with bottom-right causal against a K/V view
 * longer than the query, which is this kernel unchanged.
 */
#ifndef ATTN_FUSED_KERNEL_H
#define ATTN_FUSED_KERNEL_H

#include "fused_common.h"
#include "fused_row.h"
#include "fused_split.h"
#include "fused_tile.h"

/* Scratch floats one worker needs for a job planned with these sizes. */
static int64_t fk_ws_floats(const attn__fused_job *job)
{
    if (job->row_path)
        return job->n_chunks ? fk_split_ws_floats(job) : fk_row_ws_floats(job);
    return fk_tile_ws_floats(job);
}

/* One work item: (b, h, query tile) on the tile path, (b, h) on the row path,
 * (b, key/value head, key chunk) on its split-key form; or, on the tile path with
 * job->claim set, a worker's whole share, which it takes from that counter. */
static void fk_item(void *arg, int64_t item, int worker)
{
    const attn__fused_job *job = (const attn__fused_job *)arg;
    if (!job->row_path && job->claim)
        fk_tile_worker(job, worker);
    else if (job->row_path && job->n_chunks)
        fk_split_item(arg, item, worker);
    else if (job->row_path)
        fk_row_item(arg, item, worker);
    else
        fk_tile_item(arg, item, worker);
}

/* y = e^x for x <= 0 with this build's vector exp (for tests/test_fused_exp.c). */
static void fk_exp_nonpos(const float *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + SIMD_W <= n; i += SIMD_W)
        simd_store(y + i, simd_exp_nonpos(simd_load(x + i)));
    if (i < n)
        simd_store_n(y + i, simd_exp_nonpos(simd_load_n(x + i, n - i, 0.0f)), n - i);
}

/* y = 2^x for x <= 0 with this build's vector 2^x (for tests/test_fused_exp.c). */
static void fk_exp2_nonpos(const float *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + SIMD_W <= n; i += SIMD_W)
        simd_store(y + i, simd_exp2_nonpos(simd_load(x + i)));
    if (i < n)
        simd_store_n(y + i, simd_exp2_nonpos(simd_load_n(x + i, n - i, 0.0f)), n - i);
}

/* y = tanh(x) with this build's vector tanh (for tests/test_fused_tanh.c). */
static void fk_tanh(const float *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + SIMD_W <= n; i += SIMD_W)
        simd_store(y + i, simd_tanh(simd_load(x + i)));
    if (i < n)
        simd_store_n(y + i, simd_tanh(simd_load_n(x + i, n - i, 0.0f)), n - i);
}

/* out[r] = sum of the r-th vector of x, times scale, with this build's four-way
 * reduction (for tests/test_simd_hsum4.c). */
static void fk_hsum4(const float *x, float scale, float *out)
{
    simd_hsum4_scaled(out, simd_load(x), simd_load(x + SIMD_W), simd_load(x + 2 * SIMD_W),
                      simd_load(x + 3 * SIMD_W), scale);
}

#endif /* ATTN_FUSED_KERNEL_H */
