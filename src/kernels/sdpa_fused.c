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
#include "half_stage.h"
#include "sdpa_bf16.h"

#include <stdint.h>
#include <string.h>

const attn__fused_kernel attn__fused_kernel_scalar = {
    ATTN_ARCH_SCALAR, SIMD_W, FK_QW, FK_MK, fk_ws_floats, fk_item, fk_split_merge, fk_exp_nonpos, fk_tanh,
    fk_hsum4, fk_exp2_nonpos,
};

const attn__fused_kernel *attn__fused_kernel_for(attn_arch arch)
{
    arch = attn__arch_isa(arch);
#ifdef ATTN_HAVE_X86
    if (arch == ATTN_ARCH_AVX512)
        return attn__fused_microtile() == ATTN__MICROTILE_4X4 ? &attn__fused_kernel_avx512_4x4
                                                             : &attn__fused_kernel_avx512;
    if (arch == ATTN_ARCH_AVX2)
        return &attn__fused_kernel_avx2;
#endif
    if (arch == ATTN_ARCH_SCALAR || arch == ATTN_ARCH_REF)
        return &attn__fused_kernel_scalar;
    return NULL;
}

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

static const attn__fused_kernel *kernel_of(attn_arch arch)
{
    const attn__fused_kernel *kern = attn__fused_kernel_for(arch);
    return kern ? kern : &attn__fused_kernel_scalar; /* never for a resolved arch */
}

/* The job's shape-dependent fields, the same for the plan and the run. tile_br and
 * tile_bc are the machine's tile sizes (attn__fused_tiles, src/runtime/dispatch.c)
 * when planning, and the plan's own when running: the plan's are those shrunk to
 * the problem, which shrink to themselves, so the run lays out what was planned. */
static void job_layout(const attn__fused_kernel *kern, const attn__sdpa_shapes *s,
                       int64_t tile_br, int64_t tile_bc, attn__fused_job *job,
                       int64_t *n_items)
{
    memset(job, 0, sizeof *job);
    job->s = s;
    job->dvp = round_up(s->Dv, kern->width);
    /* A handful of query rows (a decoding step, the chapter's toy size): one item
     * per (b, h), its rows in turn, K and V streamed in place. */
    job->row_path = s->Tq <= ATTN__FUSED_ROW_MAX && s->k_s[3] == 1 && s->v_s[3] == 1;
    if (job->row_path) {
        *n_items = s->B * s->H;
        /* Split-key decoding (fused_split.h) when the (batch, key/value head) pairs
         * are too few for the cores of a large machine and the keys are many: as
         * many chunks as bring the items up to ATTN__SPLIT_ITEMS, none shorter than
         * ATTN__SPLIT_MIN_CHUNK keys, each a multiple of 16 keys. Shapes only: the
         * thread count never enters, so neither do the chunk bounds. The weights
         * need every score of a row at once, so a call that asks for them is not
         * split. */
        const int64_t pairs = s->B * s->Hkv;
        if (!s->weights && pairs < ATTN__SPLIT_ITEMS && s->Tk >= ATTN__SPLIT_MIN_TK) {
            int64_t nc = (s->Tk + ATTN__SPLIT_MIN_CHUNK - 1) / ATTN__SPLIT_MIN_CHUNK;
            const int64_t want = (ATTN__SPLIT_ITEMS + pairs - 1) / pairs;
            if (nc > want)
                nc = want;
            if (nc >= 2) {
                job->chunk = round_up((s->Tk + nc - 1) / nc, 16);
                job->n_chunks = (s->Tk + job->chunk - 1) / job->chunk;
                job->pst = 16 + round_up(job->dvp, 16);
                *n_items = pairs * job->n_chunks;
            }
        }
    } else {
        /* The query tile holds whole micro-tiles of the score product: the 4 x 4
         * AVX-512 body's are 64 rows, more than ATTN_TILE's smallest br. Query
         * tiles do not move the key tiles (multiples of bc), so the bits stay. */
        job->br = round_up(s->Tq < tile_br ? s->Tq : tile_br, kern->mr);
        job->bc = s->Tk < tile_bc ? round_up(s->Tk, kern->nk) : tile_bc;
        job->n_qt = (s->Tq + job->br - 1) / job->br;
        *n_items = s->B * s->H * job->n_qt;
    }
}

/* Floats of the split-key partials (B * H * Tq * n_chunks of pst each; 0 when the
 * keys are not split); 0 on overflow. */
static int part_floats(const attn__sdpa_shapes *s, const attn__fused_job *job, int64_t *n)
{
    *n = 0;
    if (!job->n_chunks)
        return 1;
    return attn__mul_i64(s->B, s->H, n) && attn__mul_i64(*n, s->Tq, n) &&
           attn__mul_i64(*n, job->n_chunks, n) && attn__mul_i64(*n, job->pst, n);
}

/* Bytes of widened K and V per chunk on the 16-bit split-key form: a worker's
 * copy of one chunk stays in its L2 (2 MiB a core on the Xeons measured) from the
 * widening to the kernel's reads; 64, 128 and 512 KiB measured no better. */
#define HALF_CHUNK_BYTES (256 * 1024)

/* Keys per chunk of the 16-bit split-key form: HALF_CHUNK_BYTES of widened K and
 * V, a multiple of 16, at least 64. */
static int64_t half_chunk_keys(const attn__sdpa_shapes *st)
{
    const int64_t chunk = HALF_CHUNK_BYTES / (4 * (st->D + st->Dv));
    return chunk < 64 ? 64 : chunk / 16 * 16;
}

/* The 16-bit layout: job_layout on the staged shapes, and on the row path (no
 * weights asked for) always the split-key form with chunks whose widened K and V
 * take at most HALF_CHUNK_BYTES, so that each chunk is widened and used while it
 * stays in the worker's cache. Shapes only, as job_layout. */
static void half_layout(const attn__fused_kernel *kern, const attn__sdpa_shapes *st,
                        int64_t tile_br, int64_t tile_bc, attn__fused_job *job,
                        int64_t *n_items)
{
    job_layout(kern, st, tile_br, tile_bc, job, n_items);
    if (!job->row_path || st->weights)
        return;
    const int64_t chunk = half_chunk_keys(st);
    if (st->Tk < 2 * chunk)
        return;
    job->chunk = chunk;
    job->n_chunks = (st->Tk + chunk - 1) / chunk;
    job->pst = 16 + round_up(job->dvp, 16);
    *n_items = st->B * st->Hkv * job->n_chunks;
}

/* Whether the split items of a 16-bit row-path job read the caller's K and V
 * themselves, widening in registers (fused_split.h, job->kv_dtype), instead of
 * widening each chunk into a worker's float32 copy first: on the builds with
 * the widening loads (AVX-512, and AVX2, whose files are built with F16C), for
 * rows of unit stride; the scalar build keeps the copy. Measured on S5, S7 and
 * S9 (docs/decoding.md): 1.7x to 2.3x the copy's speed on AVX-512, 1.45x to 2.0x
 * on AVX2 for bfloat16 and 1.5x to 2.2x for float16. */
static int half_direct(const attn__fused_kernel *kern, const attn__fused_job *job,
                       const attn__sdpa_shapes *s0)
{
    return job->row_path && job->n_chunks && kern->width >= 8 && s0->k_s[3] == 1 &&
           s0->v_s[3] == 1;
}

/* Key rows of the float32 copies of K and V the 16-bit row path keeps. On the
 * split-key form each worker widens its item's chunk into a chunk-sized copy of
 * its own, which at HALF_CHUNK_BYTES stays in the worker's L2 from the widening to
 * the kernel's reads (a head-sized copy, 4 MiB a worker on S5, went out to memory
 * and back). Unsplit, the head's items share one copy of its keys.
 *
 * The rows are at least max(threads, 2) half-chunks, whatever the form, so that a
 * plan for a longer key axis covers one for a shorter (the KV cache plans for its
 * capacity and relies on that, as for the kernel's own scratch): a split layout
 * uses threads chunks of at most a half-chunk (job_layout splits only a Tk under
 * two half-chunks, in at least 2 chunks), an unsplit one without weights has
 * fewer than two half-chunks of keys, and one with weights plans every length
 * unsplit, Tk rows. */
static int64_t half_kv_rows(const attn__fused_job *job, const attn__sdpa_shapes *s,
                            int threads)
{
    int64_t rows = (threads > 2 ? threads : 2) * half_chunk_keys(s);
    if (!job->n_chunks && s->Tk > rows)
        rows = s->Tk;
    return rows;
}

/* Key rows of the float32 copies of K and V a 16-bit call uses, as the plan and
 * the run both count them: on the tile path, one (b, key/value head)'s Tk keys
 * (rounded up to 16, so that each worker's copy starts 64-byte aligned) in each
 * worker's copy (half_floats' `copies`: the run's half_head_item widens a head
 * per item into its worker's copy); none where the split items widen in
 * registers (half_direct), which read the caller's rows and nothing else; else
 * half_kv_rows. A plan whose split items read in place thus holds no copy, while
 * a shorter, unsplit call of the same shapes does, so a plan for more keys no
 * longer covers one for fewer: the KV cache therefore plans the longest unsplit
 * length besides its current lengths and its capacity (src/attention/kv_cache.c,
 * longest_unsplit), so that the scratch of its first step still serves every
 * later one (tests/test_half_decode_scratch.c). */
static int64_t half_copy_rows(const attn__fused_kernel *kern, const attn__fused_job *job,
                              const attn__sdpa_shapes *st, const attn__sdpa_shapes *s0,
                              int threads)
{
    if (!job->row_path)
        return round_up(st->Tk, 16);
    return half_direct(kern, job, s0) ? 0 : half_kv_rows(job, st, threads);
}

/* Floats of one query head's rows of q and out in float32, [Tq][D] and [Tq][Dv],
 * each rounded up to 16 (so that the next starts 64-byte aligned): what a worker
 * of the 16-bit head items holds (half_head_item); 0 on overflow. */
static int64_t half_head_qo_floats(const attn__sdpa_shapes *s, int64_t *q_floats)
{
    int64_t q, o;
    if (!attn__mul_i64(s->Tq, s->D, &q) || !attn__mul_i64(s->Tq, s->Dv, &o) ||
        q > INT64_MAX / 4 || o > INT64_MAX / 4)
        return 0;
    if (q_floats)
        *q_floats = round_up(q, 16);
    return round_up(q, 16) + round_up(o, 16);
}

/* Floats of the 16-bit staging (src/kernels/half_stage.h), in order: q, out, k, v,
 * each rounded up to 16. q and out whole, [B][H][Tq][.] (qo_copies 0: the row
 * path), or, in f[0] and none in f[1], qo_copies blocks of one head's q rows then
 * out rows (half_head_qo_floats; the tile path, one block per worker); k and v of
 * `copies` times `rows` keys: on the row path one run of rows (half_kv_rows,
 * which counts the workers itself), on the tile path one copy of a head's keys
 * per worker; 0 on overflow. */
static int half_floats(const attn__sdpa_shapes *s, int64_t qo_copies, int64_t copies, int64_t rows,
                       int64_t f[4])
{
    int64_t bh, tk;
    if (!attn__mul_i64(s->B, s->H, &bh) || !attn__mul_i64(bh, s->Tq, &bh) ||
        !attn__mul_i64(copies, rows, &tk))
        return 0;
    if (qo_copies) {
        const int64_t qo = half_head_qo_floats(s, NULL);
        if (!qo || !attn__mul_i64(qo_copies, qo, &f[0]))
            return 0;
        f[1] = 0;
    } else if (!attn__mul_i64(bh, s->D, &f[0]) || !attn__mul_i64(bh, s->Dv, &f[1])) {
        return 0;
    }
    if (!attn__mul_i64(tk, s->D, &f[2]) || !attn__mul_i64(tk, s->Dv, &f[3]))
        return 0;
    int64_t total = 0;
    for (int i = 0; i < 4; i++) {
        if (f[i] > INT64_MAX / 2 - total)
            return 0;
        f[i] = round_up(f[i], 16);
        total += f[i];
    }
    return 1;
}

int attn__sdpa_fused_plan(attn_ctx *ctx, attn__sdpa_plan *plan)
{
    /* A 16-bit call runs the float32 kernel on staged copies: it is planned on their
     * shapes, and the copies go after the kernel's own scratch. */
    attn__sdpa_shapes staged;
    const int half = plan->s.dtype != ATTN_DTYPE_F32;
    if (half)
        attn__half_staged_shapes(&plan->s, 1, 0, &staged);
    const attn__sdpa_shapes *s = half ? &staged : &plan->s;
    const attn__fused_kernel *kern = kernel_of(plan->arch);
    attn__fused_job job;
    int64_t n_items, tile_br, tile_bc;
    attn__fused_tiles(&tile_br, &tile_bc);
    if (half)
        half_layout(kern, s, tile_br, tile_bc, &job, &n_items);
    else
        job_layout(kern, s, tile_br, tile_bc, &job, &n_items);

    /* The work is that of the (query, key) pairs the causal alignment and the window
     * let through: summed over the rows' ranges, which costs Tq steps, nothing next
     * to the attention itself. */
    double pairs = 0.0;
    for (int64_t i = 0; i < s->Tq; i++) {
        int64_t lo, hi;
        fk_row_range(s, i, &lo, &hi);
        pairs += (double)(hi - lo);
    }
    double flops = 4.0 * (double)s->B * (double)s->H * pairs * (double)(s->D + s->Dv) / 2.0;
    /* bfloat16 on an arch with a bfloat16 kernel: its own tile path (sdpa_bf16.h). */
    if (attn__bf16_eligible(&plan->s, plan->arch)) {
        if (plan->arch == ATTN_ARCH_AMX)
            attn__amx_tiles(&tile_br, &tile_bc);
        return attn__bf16_plan(ctx, plan, flops, tile_br, tile_bc);
    }
    plan->threads = attn__threads_for(ctx, flops, n_items);
    plan->br = job.br;
    plan->bc = job.bc;
    plan->n_chunks = job.n_chunks;
    plan->ws_floats = kern->ws_floats(&job);

    /* Scratch: per-worker empty-row records (padded to 64 bytes), then per-worker
     * scratch of ws_floats each (a multiple of 16 floats, so every worker's slice
     * starts on a 64-byte boundary), then the split-key partials. */
    int64_t total, parts = 0;
    size_t bytes;
    if (!attn__mul_i64(plan->ws_floats, plan->threads, &total) ||
        !part_floats(s, &job, &parts) || total > INT64_MAX - parts - 16 * (int64_t)plan->threads ||
        !attn__bytes(total + parts + 16 * (int64_t)plan->threads, sizeof(float), &bytes))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "fused attention scratch of %lld floats x %d threads overflows",
                          (long long)plan->ws_floats, plan->threads);
    if (half) {
        int64_t f[4];
        size_t extra;
        /* The tile path's q and out: one head's rows per worker (half_head_item). */
        const int64_t copies = job.row_path ? 1 : plan->threads;
        if (!half_floats(s, job.row_path ? 0 : plan->threads, copies,
                         half_copy_rows(kern, &job, s, &plan->s, plan->threads), f) ||
            !attn__bytes(f[0] + f[1] + f[2] + f[3], sizeof(float), &extra) ||
            attn__align64(bytes) > SIZE_MAX - extra)
            return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                              "float32 copies of %s q, k, v and out for fused attention do not "
                              "fit in memory",
                              attn_dtype_name(plan->s.dtype));
        bytes = attn__align64(bytes) + extra;
    }
    plan->scratch_bytes = bytes;
    return ATTN_OK;
}

/* One (batch, key/value head) of a 16-bit call: its work items are a contiguous
 * range of the job's (first .. first + count - 1), and so are its split-key merges.
 * kb16/vb16 are the head's 16-bit K and V, widened into kf/vf [Tk][D], [Tk][Dv]
 * (on the split-key form, a chunk's [chunk][D], [chunk][Dv]). */
typedef struct half_group {
    const attn__fused_kernel *kern;
    const attn__half_kernels *hk;
    attn__fused_job *job;
    int64_t first;
    attn_dtype dt;
    const uint16_t *kb16, *vb16;
    const int64_t *k_s, *v_s; /* the caller's strides */
    float *kf, *vf;
    int64_t lo, hi;           /* the keys any query row of the call may see */
    int64_t wrows;            /* key rows of each worker's copy (split-key form and
                                 the head items): worker w's rows start at
                                 kf + w * wrows * D and vf + w * wrows * Dv */
    int64_t parts;            /* head items per (b, key/value head) (half_head_item):
                                 1, or the threads where the pairs are few and
                                 uneven on them (fused_run_half) */
    /* The head items' q and out (half_head_item; the job's staged shapes give q
     * and out batch and head strides of 0): the caller's arrays as s0 describes
     * them (dtype, q_f32, out_f32, strides), and each worker's float32 rows of one
     * query head (half_head_qo_floats): worker w's q [Tq][D] at qo + w *
     * qo_floats, its out [Tq][Dv] q_floats after. */
    const attn__sdpa_shapes *s0;
    const void *qh;
    void *oh;
    float *qo;
    int64_t qo_floats, q_floats;
} half_group;

/* Rows [j0, j1) of the head's K and V widened into kf and vf, key j at row
 * j - first (first <= j0). */
static void half_widen_kv(const half_group *g, int64_t j0, int64_t j1, int64_t first)
{
    const attn__sdpa_shapes *s = g->job->s;
    for (int64_t j = j0; j < j1; j++) {
        const uint16_t *kr = g->kb16 + j * g->k_s[2], *vr = g->vb16 + j * g->v_s[2];
        float *kd = g->kf + (j - first) * s->D, *vd = g->vf + (j - first) * s->Dv;
        if (g->k_s[3] == 1) {
            attn__half_widen(g->hk, g->dt, kr, kd, s->D);
        } else {
            for (int64_t d = 0; d < s->D; d++)
                kd[d] = g->dt == ATTN_DTYPE_BF16 ? attn__bf16_to_f32(kr[d * g->k_s[3]])
                                                 : attn__f16_to_f32(kr[d * g->k_s[3]]);
        }
        if (g->v_s[3] == 1) {
            attn__half_widen(g->hk, g->dt, vr, vd, s->Dv);
        } else {
            for (int64_t d = 0; d < s->Dv; d++)
                vd[d] = g->dt == ATTN_DTYPE_BF16 ? attn__bf16_to_f32(vr[d * g->v_s[3]])
                                                 : attn__f16_to_f32(vr[d * g->v_s[3]]);
        }
    }
}

/* Rows per item when a head's K and V are widened before its items run. */
#define HALF_KV_ROWS 64

static void half_kv_item(void *arg, int64_t item, int worker)
{
    (void)worker;
    const half_group *g = (const half_group *)arg;
    const int64_t j0 = g->lo + item * HALF_KV_ROWS;
    half_widen_kv(g, j0, fk_min(j0 + HALF_KV_ROWS, g->hi), 0);
}

static void half_group_item(void *arg, int64_t item, int worker)
{
    const half_group *g = (const half_group *)arg;
    g->kern->item(g->job, g->first + item, worker);
}

/* The group g0 narrowed to key/value head (b, kvh) and to worker's own float32
 * copy, with a job of its own (copied from g0's) that reads keys from that copy. */
static void half_worker_group(const half_group *g0, int64_t b, int64_t kvh, int worker,
                              half_group *g, attn__fused_job *job)
{
    const attn__sdpa_shapes *s = g0->job->s;
    *g = *g0;
    *job = *g0->job;
    g->job = job;
    g->kb16 = g0->kb16 + b * g0->k_s[0] + kvh * g0->k_s[1];
    g->vb16 = g0->vb16 + b * g0->v_s[0] + kvh * g0->v_s[1];
    g->kf = g0->kf + (int64_t)worker * g0->wrows * s->D;
    g->vf = g0->vf + (int64_t)worker * g0->wrows * s->Dv;
    job->k = g->kf;
    job->v = g->vf;
}

/* A split-key item, any (b, key/value head, chunk) of the call: it widens its own
 * chunk's keys into its worker's chunk-sized copy (no other item reads them), key
 * c0 at row 0, and runs the float32 item on a copy of the job that reads that
 * worker's copy (kv_first = c0, so the item reads key j at row j - c0). The
 * chunk's keys are read once, by the worker that uses them, while they are in its
 * cache; all the call's items run in one parallel pass, so no head waits for the
 * one before it. The values are those one shared copy would hold, so the bits are
 * too. */
static void half_split_item(void *arg, int64_t item, int worker)
{
    const half_group *g0 = (const half_group *)arg;
    const attn__sdpa_shapes *s = g0->job->s;
    const int64_t nc = g0->job->n_chunks, c = item % nc, kvh = (item / nc) % s->Hkv,
                  b = item / (nc * s->Hkv);
    half_group g;
    attn__fused_job job;
    half_worker_group(g0, b, kvh, worker, &g, &job);
    const int64_t c0 = c * job.chunk, c1 = c0 + job.chunk;
    job.kv_first = c0;
    half_widen_kv(&g, c0 > g.lo ? c0 : g.lo, fk_min(c1, g.hi), c0);
    g.kern->item(&job, item, worker);
}

/* Rows [i0, i1) of query head (b, h) of the call: the caller's q widened into the
 * same rows of buf [Tq][D] (narrow 0), or those of buf [Tq][Dv] rounded into the
 * caller's out (narrow 1), on the worker's own thread. A float32 q or out (the
 * KV cache's q_f32, out_f32) is copied. */
static void half_head_rows(const half_group *g, int narrow, int64_t b, int64_t h, int64_t i0,
                           int64_t i1, float *buf)
{
    const attn__sdpa_shapes *s0 = g->s0;
    const int64_t *hs = narrow ? s0->o_s : s0->q_s;
    const attn_dtype dt = (narrow ? s0->out_f32 : s0->q_f32) ? ATTN_DTYPE_F32 : s0->dtype;
    const int64_t esize = dt == ATTN_DTYPE_F32 ? (int64_t)sizeof(float) : (int64_t)sizeof(uint16_t);
    unsigned char *arr = narrow ? (unsigned char *)g->oh : (unsigned char *)(uintptr_t)g->qh;
    void *base = arr + (b * hs[0] + h * hs[1]) * esize;
    const attn__half_rows r = {g->hk, dt, narrow, base, buf,
                               {1, 1, s0->Tq, narrow ? s0->Dv : s0->D},
                               {0, 0, hs[2], hs[3]}};
    attn__half_rows_block(&r, i0, i1);
}

/* The query rows [*i0, *i1) that the kernel's item `item` of `job` reads from q
 * and writes to out: on the row path every row of its (b, h); on the tile path
 * its query tile, numbered as fk_tile_begin (src/kernels/fused_tile.h) numbers
 * them, the last tile of each head first. */
static void half_item_rows(const attn__fused_job *job, int64_t item, int64_t *i0, int64_t *i1)
{
    const int64_t Tq = job->s->Tq;
    if (job->row_path) {
        *i0 = 0;
        *i1 = Tq;
        return;
    }
    *i0 = (job->n_qt - 1 - item % job->n_qt) * job->br;
    *i1 = fk_min(*i0 + job->br, Tq);
}

/* One (b, key/value head) of an unsplit call, or one part of it: its keys widened
 * once into the worker's own copy, key j at row j, then the kernel's items of each
 * query head of its group on that copy: the row item of each head (in a batch,
 * below), or on the tile path (more than ATTN__FUSED_ROW_MAX query rows: a
 * prefill, a chunked prefill, a speculative step; one call or a batch) each head's
 * query tiles. Where the (b, key/value head) pairs do not fall evenly on the
 * threads and are few (g->parts > 1: one sequence with one or a few key/value
 * heads; fused_run_half), the group's tiles are dealt out to g->parts items, part
 * p taking every parts-th tile from the p-th, so that causal tiles of every
 * length fall to each part; each part widens the head into its own worker's
 * copy, which is cheap beside the tiles it then computes (a head's Tk (D + Dv)
 * conversions against at least 9 Tk (D + Dv) multiply-adds per query head).
 * Before issue 16's second session a single call widened all of K and V (32 MiB
 * of float32 for one S9 sequence) before any tile ran, which went out to memory
 * and came back; a head's copy (512 KiB on S2, 2 MiB on S4) is used while the
 * worker's cache still holds much of it.
 *
 * q and out go the same way (since issue 16's third session): each item of the
 * kernel reads its query rows from, and writes its output rows to, the worker's
 * own one-head [Tq][D] and [Tq][Dv] (the staged shapes' q and out batch and head
 * strides are 0, while the item's index still carries the true (b, h) for the
 * masks, the ALiBi slopes, the sinks, the log-sum-exp and the weights): its rows
 * (half_item_rows) are widened just before it and rounded into the caller's out
 * just after, while they are in the worker's cache. Before, q was widened whole
 * and out written whole in float32, then rounded in a pass of its own: 32 MiB
 * written, gone to memory and read back, on S4.
 *
 * The copies hold the values the whole copies held (widening is exact), each item
 * reads only keys in [lo, hi) (the row item its rows' ranges; the tile item whole
 * key tiles, so there lo is 0 and hi is Tk, every key) and only its own query
 * rows, and writes only its own output rows, and a tile's sums do not depend on
 * who computes it, so the bits are the same, for any thread count. */
static void half_head_item(void *arg, int64_t item, int worker)
{
    const half_group *g0 = (const half_group *)arg;
    const attn__sdpa_shapes *s = g0->job->s;
    const int64_t parts = g0->parts, part = item % parts, pair = item / parts;
    const int64_t b = pair / s->Hkv, kvh = pair % s->Hkv;
    half_group g;
    attn__fused_job job;
    half_worker_group(g0, b, kvh, worker, &g, &job);
    if (g.hi > g.lo)
        half_widen_kv(&g, g.lo, g.hi, 0);
    float *qw = g0->qo + (int64_t)worker * g0->qo_floats, *ow = qw + g0->q_floats;
    job.q = qw;
    job.out = ow;
    const int64_t tiles = job.row_path ? 1 : job.n_qt; /* items per (b, h) */
    const int64_t bh0 = b * s->H + kvh * s->group; /* the group's first query head */
    for (int64_t t = part; t < s->group * tiles; t += parts) {
        const int64_t it = bh0 * tiles + t, h = kvh * s->group + t / tiles;
        int64_t i0, i1;
        half_item_rows(&job, it, &i0, &i1);
        half_head_rows(&g, 0, b, h, i0, i1, qw);
        g.kern->item(&job, it, worker);
        half_head_rows(&g, 1, b, h, i0, i1, ow);
    }
}

/* Points a 16-bit split job at the caller's K and V (half_direct): st, the job's
 * staged shapes, takes their strides. */
static void half_direct_setup(attn__fused_job *job, attn__sdpa_shapes *st,
                              const attn__sdpa_shapes *s0, const void *k, const void *v)
{
    memcpy(st->k_s, s0->k_s, sizeof st->k_s);
    memcpy(st->v_s, s0->v_s, sizeof st->v_s);
    job->kv_dtype = s0->dtype;
    job->k16 = (const uint16_t *)k;
    job->v16 = (const uint16_t *)v;
    job->kv_first = 0;
}

static void half_merge(void *arg, int64_t item, int worker)
{
    const half_group *g = (const half_group *)arg;
    g->kern->merge(g->job, item, worker);
}

/* The 16-bit run (src/kernels/half_stage.h). The tile path runs one parallel pass
 * of head items (half_head_item): each widens one (b, key/value head)'s K and V
 * into its worker's own copy and runs its group's query tiles on it, each tile's
 * query rows widened into, and its output rows rounded from, the worker's own
 * rows of one head (g.parts items per head where the heads are few and uneven on
 * the threads). The row path widens q whole, once (a few rows a head). Its
 * split-key form runs every item at once: where
 * half_direct says (AVX-512 and AVX2) each reads its chunk of the caller's K and
 * V and widens in registers, elsewhere (scalar) each widens its chunk into its
 * worker's copy first (half_split_item). Unsplit, the row path goes one (b,
 * key/value head) at a time: its K and V rows are widened into one head's float32
 * copy (the staged shapes give k and v batch and head strides of 0, so every item
 * of the head reads the copy). Its out is rounded once at the end. The tiles and the
 * chunks depend on the shapes only, and each is computed whole by one item,
 * however the items are dealt out, so the bits do not depend on the thread count;
 * the widened values are exact, so neither do they depend on where they are
 * widened. */
static void fused_run_half(const attn__sdpa_plan *plan, const void *q, const void *k,
                           const void *v, void *out, float *weights, void *scratch,
                           int64_t *empty)
{
    const attn__sdpa_shapes *s0 = &plan->s;
    attn__sdpa_shapes st;
    attn__half_staged_shapes(s0, 1, 0, &st);
    const attn__fused_kernel *kern = kernel_of(plan->arch);
    const attn__half_kernels *hk = attn__half_for(plan->arch);
    attn__fused_job job;
    int64_t n_items, f[4];
    half_layout(kern, &st, plan->br, plan->bc, &job, &n_items);
    const int tile = !job.row_path;
    if (tile) /* one head's q and out rows per worker (half_head_item) */
        attn__half_staged_shapes(s0, 1, 1, &st);
    const int threads = plan->threads;
    int64_t parts = 0;
    part_floats(&st, &job, &parts);
    job.ws_floats = plan->ws_floats;
    job.empty_first = (int64_t *)scratch;
    job.ws = (float *)scratch + 16 * (int64_t)threads;
    job.part = job.ws + plan->ws_floats * (int64_t)threads;
    for (int t = 0; t < threads; t++)
        job.empty_first[t] = INT64_MAX;
    half_floats(&st, tile ? threads : 0, tile ? threads : 1,
                half_copy_rows(kern, &job, &st, s0, threads), f);
    const size_t own = attn__align64((size_t)(16 * (int64_t)threads + plan->ws_floats * (int64_t)threads + parts) *
                                     sizeof(float));
    float *qf = (float *)((unsigned char *)scratch + own), *of = qf + f[0], *kf = of + f[1],
          *vf = kf + f[2];
    job.q = qf;
    job.k = kf;
    job.v = vf;
    job.out = of;
    job.weights = weights;

    const attn__half_rows rq = {hk, s0->q_f32 ? ATTN_DTYPE_F32 : s0->dtype, 0, (void *)(uintptr_t)q, qf,
                                {s0->B, s0->H, s0->Tq, s0->D},
                                {s0->q_s[0], s0->q_s[1], s0->q_s[2], s0->q_s[3]}};
    if (!tile)
        attn__half_rows_run(&rq, threads);
    /* The keys any row may see: rows' ranges only grow with i, so row 0's start
     * and the last row's end bound them. Keys outside are never widened nor read. */
    int64_t lo0, hi0, lo1, hi1;
    fk_row_range(&st, 0, &lo0, &hi0);
    fk_row_range(&st, st.Tq - 1, &lo1, &hi1);
    const int64_t G = st.group;
    half_group g = {kern, hk, &job, 0, s0->dtype, NULL, NULL, s0->k_s, s0->v_s, kf, vf,
                    lo0 < lo1 ? lo0 : lo1, hi0 > hi1 ? hi0 : hi1, job.chunk, 1,
                    s0, q, out, qf, 0, 0};
    if (tile)
        g.qo_floats = half_head_qo_floats(&st, &g.q_floats);
    const int split = job.row_path && job.n_chunks;
    if (tile) {
        /* The tile path loads whole key tiles from a multiple of bc, and pads the
         * last with the last key, masking what lies outside the rows' ranges: those
         * keys are read, though they never count, so all of them are widened. A
         * head's items do equal work (its tiles whatever the mask), so where the
         * pairs do not fall evenly on the threads and are fewer than four a thread
         * (one sequence's one to a few key/value heads), each head is dealt out to
         * as many parts as threads, each widening it again: a conversion per key
         * element beside the tiles' multiply-adds. The bits do not depend on the
         * parts. */
        const int64_t pairs = st.B * st.Hkv;
        g.kb16 = (const uint16_t *)k;
        g.vb16 = (const uint16_t *)v;
        g.lo = 0;
        g.hi = st.Tk;
        g.wrows = round_up(st.Tk, 16);
        g.parts = pairs % threads == 0 || pairs >= 4 * (int64_t)threads ? 1 : threads;
        if (g.parts > G * job.n_qt)
            g.parts = G * job.n_qt;
        const int64_t items = pairs * g.parts;
        attn__parallel_for(items < threads ? (int)items : threads, items, half_head_item, &g);
    } else if (split && half_direct(kern, &job, s0)) {
        half_direct_setup(&job, &st, s0, k, v);
        attn__parallel_for(n_items < threads ? (int)n_items : threads, n_items, kern->item, &job);
    } else if (split) {
        g.kb16 = (const uint16_t *)k;
        g.vb16 = (const uint16_t *)v;
        attn__parallel_for(n_items < threads ? (int)n_items : threads, n_items, half_split_item,
                           &g);
    }
    for (int64_t b = 0; b < st.B && !tile && !split; b++)
        for (int64_t kvh = 0; kvh < st.Hkv; kvh++) {
            g.kb16 = (const uint16_t *)k + b * s0->k_s[0] + kvh * s0->k_s[1];
            g.vb16 = (const uint16_t *)v + b * s0->v_s[0] + kvh * s0->v_s[1];
            const int64_t bh0 = b * st.H + kvh * G; /* the group's first query head */
            if (g.hi > g.lo) {
                const int64_t blocks = (g.hi - g.lo + HALF_KV_ROWS - 1) / HALF_KV_ROWS;
                attn__parallel_for(blocks < threads ? (int)blocks : threads, blocks,
                                   half_kv_item, &g);
            }
            g.first = bh0;
            attn__parallel_for(G < threads ? (int)G : threads, G, half_group_item, &g);
        }
    if (job.n_chunks) {
        /* The merges read what every chunk wrote, so they start after the last. */
        const int64_t rows = st.B * st.H;
        attn__parallel_for(rows < threads ? (int)rows : threads, rows, half_merge, &g);
    }
    const attn__half_rows ro = {hk, s0->out_f32 ? ATTN_DTYPE_F32 : s0->dtype, 1, out, of,
                                {s0->B, s0->H, s0->Tq, s0->Dv},
                                {s0->o_s[0], s0->o_s[1], s0->o_s[2], s0->o_s[3]}};
    if (!tile)
        attn__half_rows_run(&ro, threads);
    *empty = INT64_MAX;
    for (int t = 0; t < threads; t++)
        if (job.empty_first[t] < *empty)
            *empty = job.empty_first[t];
}

int attn__sdpa_fused_run(attn_ctx *ctx, const attn__sdpa_plan *plan, const void *q,
                         const void *k, const void *v, void *out, float *weights,
                         void *scratch)
{
    const attn__sdpa_shapes *s = &plan->s;
    if (s->dtype != ATTN_DTYPE_F32) {
        int64_t e;
        if (attn__bf16_eligible(s, plan->arch))
            attn__bf16_run(plan, q, k, v, out, scratch, &e);
        else
            fused_run_half(plan, q, k, v, out, weights, scratch, &e);
        if (e != INT64_MAX && s->empty_rows == ATTN_EMPTY_ROWS_ERROR) {
            const int64_t bh = e / s->Tq;
            return attn__empty_row_fail(ctx, s, bh / s->H, bh % s->H, e % s->Tq);
        }
        return ATTN_OK;
    }
    const attn__fused_kernel *kern = kernel_of(plan->arch);
    attn__fused_job job;
    int64_t n_items;
    job_layout(kern, s, plan->br, plan->bc, &job, &n_items);
    job.q = q;
    job.k = k;
    job.v = v;
    job.out = out;
    job.weights = weights;
    job.ws_floats = plan->ws_floats;
    const int threads = plan->threads;
    job.empty_first = (int64_t *)scratch;
    job.ws = (float *)scratch + 16 * (int64_t)threads;
    for (int t = 0; t < threads; t++)
        job.empty_first[t] = INT64_MAX;

    job.part = job.ws + plan->ws_floats * (int64_t)threads;
    if (job.row_path) {
        attn__parallel_for(threads, n_items, kern->item, &job);
    } else {
        /* The tile path's workers take their items from a counter of the job's own,
         * each claiming its next item before its current one ends, so that it asks
         * the L2 for that item's data ahead (fk_tile_worker, fused_tile.h); the pool
         * then hands out one share per worker. */
        _Atomic int64_t claim;
        atomic_init(&claim, 0);
        job.claim = &claim;
        job.n_items = n_items;
        const int shares = n_items < threads ? (int)n_items : threads;
        attn__parallel_for(shares, shares, kern->item, &job);
    }
    if (job.n_chunks) {
        /* The merge reads what every chunk wrote, so it starts after the last. */
        const int64_t rows = s->B * s->H;
        attn__parallel_for(rows < threads ? (int)rows : threads, rows, kern->merge, &job);
    }

    int64_t empty = INT64_MAX;
    for (int t = 0; t < threads; t++)
        if (job.empty_first[t] < empty)
            empty = job.empty_first[t];
    if (empty != INT64_MAX && s->empty_rows == ATTN_EMPTY_ROWS_ERROR) {
        const int64_t bh = empty / s->Tq;
        return attn__empty_row_fail(ctx, s, bh / s->H, bh % s->H, empty % s->Tq);
    }
    return ATTN_OK;
}

/* ---- Several planned calls as one parallel job (the KV cache's batched attend) ----
 *
 * Each sequence of a batched decoding step has its own key length, so it is its own
 * planned call; running them one after another wakes the threads once per sequence
 * and leaves a core idle at the end of each. Here their work items are numbered one
 * after another (sequence 0's items, then sequence 1's, ...) and handed to one
 * attn__parallel_for, then their split-key merges likewise. Every item still writes
 * only what it wrote in its own call, into the same places, so the bits are those
 * of the calls made one by one, for any thread count.
 *
 * A 16-bit batch runs the 16-bit row path's items, or the tile path's for calls
 * of more than ATTN__FUSED_ROW_MAX query rows: each split call's q widened whole
 * (by the calling thread: a decoding step's few rows), then in the one job every
 * call's split-key items (the kernel's own, widening in registers, where
 * half_direct says; elsewhere half_split_item, which widens its chunk into its
 * worker's copy) and the (b, key/value head) items of the calls not split
 * (half_head_item: the row path's short calls, and every tile-path call; each
 * widens its items' query rows into, and rounds their output rows from, its
 * worker's rows of one head, BATCH_HEAD_QO, sized for the largest such call),
 * then every merge, then each split call's out rounded. The workers' copies hold
 * max(2 half-chunks, ATTN__SPLIT_MIN_TK) key rows where a row-path call uses
 * them: an unsplit row-path call without weights has fewer keys than that
 * (half_layout splits from two half-chunks, job_layout from ATTN__SPLIT_MIN_TK
 * where the pairs are few), and a split one's chunks are at most a half-chunk. A
 * tile-path call's copy holds its Tk keys, so the scratch for a full cache serves
 * every shorter length; and a batch whose calls all read in place holds none. */

/* Key rows of a worker's copy in a 16-bit batch (above) for one call: 0 when its
 * split items read the caller's rows (half_direct), else at least the plan's
 * unsplit key count, should a layout ever leave more keys unsplit (the tile path
 * always does). */
static int64_t half_batch_rows(const attn__fused_kernel *kern, const attn__fused_job *job,
                               const attn__sdpa_shapes *st, const attn__sdpa_shapes *s0)
{
    if (half_direct(kern, job, s0))
        return 0;
    int64_t rows = 2 * half_chunk_keys(st);
    if (rows < ATTN__SPLIT_MIN_TK)
        rows = ATTN__SPLIT_MIN_TK;
    if (!job->n_chunks && st->Tk > rows)
        rows = round_up(st->Tk, 16);
    return rows; /* a multiple of 16, so that each worker's rows start 64-byte aligned */
}

/* The layout of one plan as the batch runs it: its job, its items (for a 16-bit
 * call, `st` gets the staged shapes the job points to), and whether it can be
 * batched at all. */
static int batch_layout(const attn__sdpa_plan *plan, attn__sdpa_shapes *st,
                        attn__fused_job *job, int64_t *n_items)
{
    const attn__fused_kernel *kern = kernel_of(plan->arch);
    if (plan->s.dtype == ATTN_DTYPE_F32) {
        job_layout(kern, &plan->s, plan->br, plan->bc, job, n_items);
        return 1;
    }
    attn__half_staged_shapes(&plan->s, 1, 0, st);
    half_layout(kern, st, plan->br, plan->bc, job, n_items);
    if (!job->n_chunks) {
        *n_items = st->B * st->Hkv; /* half_head_item's */
        /* Its q and out: one head's rows per worker (the layout does not read
         * q's or out's strides). */
        attn__half_staged_shapes(&plan->s, 1, 1, st);
    }
    return !plan->s.weights && !attn__bf16_eligible(&plan->s, plan->arch);
}

/* The sizes the batch's scratch depends on, over every plan added. */
void attn__fused_batch_add(attn__fused_batch_size *acc, const attn__sdpa_plan *plan)
{
    attn__sdpa_shapes st;
    attn__fused_job job;
    int64_t n_items, parts = 0;
    const int half = plan->s.dtype != ATTN_DTYPE_F32;
    if (!batch_layout(plan, &st, &job, &n_items) || (acc->n > 0 && half != acc->half))
        acc->one_by_one = 1;
    acc->half = half;
    const attn__sdpa_shapes *s = half ? &st : &plan->s;
    if (!part_floats(s, &job, &parts) || parts > INT64_MAX / 2 - acc->parts)
        acc->overflow = 1;
    else
        acc->parts += round_up(parts, 16);
    if (half) {
        /* A split call's q and out whole; the head items' (every call not split),
         * one head's rows per worker. */
        int64_t f[4], kv;
        const int64_t head_qo = job.n_chunks ? 0 : half_head_qo_floats(s, NULL);
        if (!half_floats(s, 0, 1, 0, f) || f[0] + f[1] > INT64_MAX / 2 - acc->qo_floats ||
            (!job.n_chunks && !head_qo) ||
            !attn__mul_i64(half_batch_rows(kernel_of(plan->arch), &job, s, &plan->s),
                           s->D + s->Dv, &kv))
            acc->overflow = 1;
        else {
            if (job.n_chunks)
                acc->qo_floats += f[0] + f[1];
            if (head_qo > acc->head_qo_floats)
                acc->head_qo_floats = head_qo;
            if (kv > acc->kv_floats)
                acc->kv_floats = kv;
        }
    }
    if (plan->threads > acc->threads)
        acc->threads = plan->threads;
    if (plan->ws_floats > acc->ws_floats)
        acc->ws_floats = plan->ws_floats;
    acc->n++;
}

/* The batch's scratch regions, in order. */
enum {
    BATCH_JOBS,   /* n attn__fused_job */
    BATCH_STARTS, /* item and merge starts, 2 (n + 1) int64 */
    BATCH_EMPTY,  /* empty-row records, n * threads int64 */
    BATCH_WS,     /* the kernel's per-worker scratch */
    BATCH_PARTS,  /* split-key partials */
    BATCH_GROUPS, /* 16-bit: n half_group */
    BATCH_SHAPES, /* 16-bit: n staged attn__sdpa_shapes */
    BATCH_QO,     /* 16-bit: the split calls' q and out in float32 */
    BATCH_HEAD_QO, /* 16-bit: each worker's rows of one head's q and out in float32 */
    BATCH_KV,     /* 16-bit: each worker's K and V rows in float32 */
    BATCH_REGIONS
};

/* Bytes of each region of the batch's scratch (each a multiple of 64); the total,
 * or 0 on overflow. */
static size_t batch_regions(const attn__fused_batch_size *acc, size_t r[BATCH_REGIONS])
{
    const size_t n = (size_t)acc->n, t = (size_t)acc->threads, hn = acc->half ? n : 0;
    r[BATCH_JOBS] = n * sizeof(attn__fused_job);
    r[BATCH_STARTS] = 2 * (n + 1) * sizeof(int64_t);
    r[BATCH_EMPTY] = n * t * sizeof(int64_t);
    r[BATCH_GROUPS] = hn * sizeof(half_group);
    r[BATCH_SHAPES] = hn * sizeof(attn__sdpa_shapes);
    int64_t ws, kv, hqo;
    if (acc->overflow || !attn__mul_i64(acc->ws_floats, acc->threads, &ws) ||
        !attn__mul_i64(acc->kv_floats, acc->threads, &kv) ||
        !attn__mul_i64(acc->head_qo_floats, acc->threads, &hqo) ||
        !attn__bytes(hqo, sizeof(float), &r[BATCH_HEAD_QO]) ||
        !attn__bytes(ws, sizeof(float), &r[BATCH_WS]) ||
        !attn__bytes(acc->parts, sizeof(float), &r[BATCH_PARTS]) ||
        !attn__bytes(acc->qo_floats, sizeof(float), &r[BATCH_QO]) ||
        !attn__bytes(kv, sizeof(float), &r[BATCH_KV]))
        return 0;
    size_t total = 0;
    for (int i = 0; i < BATCH_REGIONS; i++) {
        if (r[i] > SIZE_MAX - total - 64)
            return 0;
        r[i] = attn__align64(r[i]);
        total += r[i];
    }
    return total;
}

int attn__fused_batch_bytes(attn_ctx *ctx, const attn__fused_batch_size *acc, size_t *bytes)
{
    size_t r[BATCH_REGIONS];
    if (acc->n > INT64_MAX / 1024 || !(*bytes = batch_regions(acc, r)))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "batched attention scratch for %lld calls overflows",
                          (long long)acc->n);
    return ATTN_OK;
}

typedef struct fused_batch {
    const attn__fused_kernel *kern;
    attn__fused_job *jobs;
    half_group *groups;   /* [n] for a 16-bit batch, else NULL */
    const int64_t *start; /* [n + 1]: the first global item of each call */
    int64_t n;
} fused_batch;

/* The call that global item `item` belongs to: the last j with start[j] <= item. */
static int64_t batch_find(const int64_t *start, int64_t n, int64_t item)
{
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo + 1) / 2;
        if (start[mid] <= item)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static void batch_item(void *arg, int64_t item, int worker)
{
    const fused_batch *fb = (const fused_batch *)arg;
    const int64_t j = batch_find(fb->start, fb->n, item), own = item - fb->start[j];
    if (!fb->groups || fb->jobs[j].kv_dtype != ATTN_DTYPE_F32)
        fb->kern->item(&fb->jobs[j], own, worker);
    else if (fb->jobs[j].n_chunks)
        half_split_item(&fb->groups[j], own, worker);
    else
        half_head_item(&fb->groups[j], own, worker);
}

static void batch_merge(void *arg, int64_t item, int worker)
{
    const fused_batch *fb = (const fused_batch *)arg;
    const int64_t j = batch_find(fb->start, fb->n, item);
    fb->kern->merge(&fb->jobs[j], item - fb->start[j], worker);
}

int attn__sdpa_fused_run_batch(attn_ctx *ctx, const attn__sdpa_plan *plans, int64_t n,
                               const attn__fused_io *io, void *scratch)
{
    attn__fused_batch_size acc = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = 0; j < n; j++)
        attn__fused_batch_add(&acc, &plans[j]);
    size_t r[BATCH_REGIONS], off[BATCH_REGIONS];
    if (n < 1 || !batch_regions(&acc, r))
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW, "batched attention scratch overflows");
    if (acc.one_by_one)
        return attn__fail(ctx, ATTN_STATUS_UNSUPPORTED,
                          "batched attention: a %s call of %lld query rows cannot join a batch",
                          attn_dtype_name(plans[0].s.dtype), (long long)plans[0].s.Tq);
    unsigned char *base = (unsigned char *)scratch;
    off[0] = 0;
    for (int i = 1; i < BATCH_REGIONS; i++)
        off[i] = off[i - 1] + r[i - 1];
    attn__fused_job *jobs = (attn__fused_job *)(base + off[BATCH_JOBS]);
    int64_t *start = (int64_t *)(base + off[BATCH_STARTS]), *mstart = start + n + 1;
    int64_t *empty = (int64_t *)(base + off[BATCH_EMPTY]);
    float *ws = (float *)(base + off[BATCH_WS]);
    float *part = (float *)(base + off[BATCH_PARTS]);
    half_group *groups = acc.half ? (half_group *)(base + off[BATCH_GROUPS]) : NULL;
    attn__sdpa_shapes *shapes = (attn__sdpa_shapes *)(base + off[BATCH_SHAPES]);
    float *qo = (float *)(base + off[BATCH_QO]), *kvf = (float *)(base + off[BATCH_KV]);
    float *head_qo = (float *)(base + off[BATCH_HEAD_QO]);
    const int threads = acc.threads;
    const attn__fused_kernel *kern = kernel_of(plans[0].arch);
    const attn__half_kernels *hk = attn__half_for(plans[0].arch);
    start[0] = mstart[0] = 0;
    for (int64_t j = 0; j < n; j++) {
        const attn__sdpa_shapes *s0 = &plans[j].s;
        attn__fused_job *job = &jobs[j];
        int64_t n_items, parts = 0;
        batch_layout(&plans[j], &shapes[j], job, &n_items);
        const attn__sdpa_shapes *s = groups ? &shapes[j] : s0;
        part_floats(s, job, &parts);
        job->q = (const float *)io[j].q;
        job->k = (const float *)io[j].k;
        job->v = (const float *)io[j].v;
        job->out = (float *)io[j].out;
        job->weights = NULL;
        job->ws_floats = acc.ws_floats;
        job->ws = ws;
        job->part = part;
        part += round_up(parts, 16);
        job->empty_first = empty + j * threads;
        for (int t = 0; t < threads; t++)
            job->empty_first[t] = INT64_MAX;
        if (groups) {
            /* A split call's q whole in float32 (fused_run_half's), the others' a
             * head's rows at a time in the workers' own (half_head_item), then K
             * and V in the workers' copies. */
            int64_t f[4], lo0, hi0, lo1, hi1;
            half_floats(s, 0, 1, 0, f);
            job->q = job->out = NULL; /* the head items point them at their rows */
            if (job->n_chunks) {
                job->q = qo;
                job->out = qo + f[0];
                qo += f[0] + f[1];
                const attn__half_rows rq = {hk, s0->q_f32 ? ATTN_DTYPE_F32 : s0->dtype, 0,
                                            (void *)(uintptr_t)io[j].q, (float *)job->q,
                                            {s0->B, s0->H, s0->Tq, s0->D},
                                            {s0->q_s[0], s0->q_s[1], s0->q_s[2], s0->q_s[3]}};
                attn__half_rows_run(&rq, 1);
            }
            const int64_t wrows = acc.kv_floats / (s->D + s->Dv);
            job->k = kvf;
            job->v = kvf + (int64_t)threads * wrows * s->D;
            fk_row_range(s, 0, &lo0, &hi0);
            fk_row_range(s, s->Tq - 1, &lo1, &hi1);
            if (!job->row_path) { /* the tile path reads whole key tiles: every key */
                lo0 = lo1 = 0;
                hi0 = hi1 = s->Tk;
            }
            const half_group g = {kern, hk, job, 0, s0->dtype, (const uint16_t *)io[j].k,
                                  (const uint16_t *)io[j].v, s0->k_s, s0->v_s,
                                  (float *)job->k, (float *)job->v, lo0 < lo1 ? lo0 : lo1,
                                  hi0 > hi1 ? hi0 : hi1, wrows, 1, s0, io[j].q, io[j].out,
                                  head_qo, acc.head_qo_floats, 0};
            groups[j] = g;
            if (!job->n_chunks)
                half_head_qo_floats(s, &groups[j].q_floats);
            if (half_direct(kern, job, s0))
                half_direct_setup(job, &shapes[j], s0, io[j].k, io[j].v);
        }
        start[j + 1] = start[j] + n_items;
        mstart[j + 1] = mstart[j] + (job->n_chunks ? s->B * s->H : 0);
    }
    fused_batch fb = {kern, jobs, groups, start, n};
    attn__parallel_for(threads, start[n], batch_item, &fb);
    if (mstart[n] > 0) {
        /* The merges read what every chunk wrote, so they start after the last. */
        fb.start = mstart;
        attn__parallel_for(threads, mstart[n], batch_merge, &fb);
    }
    for (int64_t j = 0; j < n; j++) {
        const attn__sdpa_shapes *s = &plans[j].s;
        if (groups && jobs[j].n_chunks) {
            const attn__half_rows ro = {hk, s->out_f32 ? ATTN_DTYPE_F32 : s->dtype, 1,
                                        io[j].out, jobs[j].out,
                                        {s->B, s->H, s->Tq, s->Dv},
                                        {s->o_s[0], s->o_s[1], s->o_s[2], s->o_s[3]}};
            attn__half_rows_run(&ro, 1);
        }
    }
    for (int64_t j = 0; j < n; j++) {
        const attn__sdpa_shapes *s = &plans[j].s;
        int64_t e = INT64_MAX;
        for (int t = 0; t < threads; t++)
            if (jobs[j].empty_first[t] < e)
                e = jobs[j].empty_first[t];
        if (e != INT64_MAX && s->empty_rows == ATTN_EMPTY_ROWS_ERROR) {
            const int64_t bh = e / s->Tq;
            return attn__empty_row_fail(ctx, s, bh / s->H, bh % s->H, e % s->Tq);
        }
    }
    return ATTN_OK;
}
