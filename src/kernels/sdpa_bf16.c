/*
 * sdpa_bf16.c - the bfloat16 tile path's plan and run (sdpa_bf16.h): which calls
 * take it, the scratch, the packing of K and V, the items.
 * Portable C; the items are the ISA builds' (bf16_tile.h).
 */
#include "sdpa_bf16.h"
#include "dispatch.h"

#include <string.h>

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

const attn__bf16_kernel *attn__bf16_kernel_for(attn_arch arch)
{
#ifdef ATTN_HAVE_X86
    const unsigned cpu = attn__cpu_features();
#ifdef ATTN_HAVE_BF16_KERNELS
    if (arch == ATTN_ARCH_AMX)
        return &attn__bf16_kernel_amx;
    if (arch == ATTN_ARCH_AVX512_BF16 && (cpu & ATTN_CPU_AVX512_BF16) &&
        !attn__bf16_emulate_always())
        return &attn__bf16_kernel_dp;
#endif
    /* avx512bf16 without the instruction (or with ATTN_BF16_EMULATE=always):
     * dispatch allows it only under ATTN_BF16_EMULATE, for the tests. */
    if (arch == ATTN_ARCH_AVX512_BF16 &&
        (!(cpu & ATTN_CPU_AVX512_BF16) || attn__bf16_emulate_always()))
        return &attn__bf16_kernel_emulated;
#endif
    (void)arch;
    return NULL;
}

int attn__bf16_eligible(const attn__sdpa_shapes *s, attn_arch arch)
{
    /* q and out in bfloat16 too: the KV cache may hand in float32 ones (q_f32,
     * out_f32), which the widening path serves. */
    return s->dtype == ATTN_DTYPE_BF16 && !s->q_f32 && !s->out_f32 && !s->weights &&
           s->Tq > ATTN__FUSED_ROW_MAX && attn__bf16_kernel_for(arch) != NULL;
}

/* The job's shape-dependent fields, the same for the plan and the run: tiles of
 * multiples of 32 rows and keys (tile_br, tile_bc the machine's when planning, the
 * plan's when running; the plan's shrink to themselves). */
static void bf16_layout(const attn__sdpa_shapes *s, int64_t tile_br, int64_t tile_bc,
                        attn__bf16_job *job, int64_t *n_items)
{
    memset(job, 0, sizeof *job);
    job->f.s = s;
    job->dp = round_up(s->D, 32);
    job->dvp = round_up(s->Dv, 32);
    job->tkp = round_up(s->Tk, 32);
    job->f.dvp = job->dvp;
    const int64_t br = round_up(tile_br, 32), bc = round_up(tile_bc, 32);
    job->f.br = s->Tq < br ? round_up(s->Tq, 32) : br;
    job->f.bc = s->Tk < bc ? round_up(s->Tk, 32) : bc;
    job->f.n_qt = (s->Tq + job->f.br - 1) / job->f.br;
    *n_items = s->B * s->H * job->f.n_qt;
}

/* Elements of the packed K and V^T and bytes of the flags, over all (batch,
 * key/value head); 0 on overflow. */
static int bf16_packed(const attn__sdpa_shapes *s, const attn__bf16_job *job, int64_t *kp,
                       int64_t *vt, int64_t *flags)
{
    int64_t heads;
    return attn__mul_i64(s->B, s->Hkv, &heads) && attn__mul_i64(heads, job->tkp, kp) &&
           attn__mul_i64(*kp, job->dvp, vt) && attn__mul_i64(*kp, job->dp, kp) &&
           attn__mul_i64(heads, job->tkp / 32, flags);
}

/* The scratch after the workers' own: Kp, Vt and the flags, each 64-byte aligned;
 * 0 on overflow. */
static int bf16_extra_bytes(const attn__sdpa_shapes *s, const attn__bf16_job *job,
                            size_t part[3])
{
    int64_t kp, vt, flags;
    if (!bf16_packed(s, job, &kp, &vt, &flags) || !attn__bytes(kp, 2, &part[0]) ||
        !attn__bytes(vt, 2, &part[1]) || !attn__bytes(flags, 1, &part[2]))
        return 0;
    for (int i = 0; i < 3; i++) {
        if (part[i] > SIZE_MAX - 64)
            return 0;
        part[i] = attn__align64(part[i]);
    }
    return 1;
}

int attn__bf16_plan(attn_ctx *ctx, attn__sdpa_plan *plan, double flops, int64_t tile_br,
                    int64_t tile_bc)
{
    attn__bf16_job job;
    int64_t n_items;
    bf16_layout(&plan->s, tile_br, tile_bc, &job, &n_items);
    attn__bf16_ws w;
    attn__bf16_ws_layout(&job, &w);
    plan->threads = attn__threads_for(ctx, flops, n_items);
    plan->br = job.f.br;
    plan->bc = job.f.bc;
    plan->n_chunks = 0;
    plan->ws_floats = w.total;
    int64_t own;
    size_t bytes, part[3];
    if (!attn__mul_i64(w.total + 16, plan->threads, &own) ||
        !attn__bytes(own, sizeof(float), &bytes) || !bf16_extra_bytes(&plan->s, &job, part) ||
        attn__align64(bytes) > SIZE_MAX - part[0] - part[1] - part[2])
        return attn__fail(ctx, ATTN_STATUS_OVERFLOW,
                          "bfloat16 attention's packed K and V do not fit in memory");
    plan->scratch_bytes = attn__align64(bytes) + part[0] + part[1] + part[2];
    return ATTN_OK;
}

/* One block of 32 keys of one (batch, key/value head): its rows of Kp, its columns
 * of Vt, and its flags: whether its values hold an inf or a NaN (all exponent bits
 * set), or a value of job->vbig and more. */
static void bf16_pack_item(void *arg, int64_t item, int worker)
{
    (void)worker;
    const attn__bf16_job *job = (const attn__bf16_job *)arg;
    const attn__sdpa_shapes *s0 = job->s0;
    const int64_t nb = job->tkp / 32, hk = item / nb, j0 = item % nb * 32;
    const int64_t b = hk / s0->Hkv, kvh = hk % s0->Hkv;
    const int64_t D = s0->D, Dv = s0->Dv, dp = job->dp, dvp = job->dvp, tkp = job->tkp;
    const uint16_t *kb = job->k + b * s0->k_s[0] + kvh * s0->k_s[1];
    const uint16_t *vb = job->v + b * s0->v_s[0] + kvh * s0->v_s[1];
    uint16_t *kp = job->kp + hk * tkp * dp, *vt = job->vt + hk * dvp * tkp;
    for (int64_t j = j0; j < (job->k_inplace ? j0 : j0 + 32); j++) {
        uint16_t *row = kp + j * dp;
        int64_t d = 0;
        if (j < s0->Tk) {
            const uint16_t *src = kb + j * s0->k_s[2];
            if (s0->k_s[3] == 1) {
                memcpy(row, src, (size_t)D * sizeof *row);
                d = D;
            }
            for (; d < D; d++)
                row[d] = src[d * s0->k_s[3]];
        }
        for (; d < dp; d++)
            row[d] = 0;
    }
    /* V^T by blocks of 32 columns: a whole block by the kernel's vector transpose,
     * any other through a block of the worker's stack, the 32 value rows copied as
     * they are (zeros past Tk and Dv), then read down its columns into the block's
     * rows of Vt, each written whole (64 bytes). */
    uint16_t blk[32][32];
    unsigned bad = 0;
    uint16_t *vblk = vt + (j0 / 32) * dvp * 32;
    for (int64_t e0 = 0; e0 < dvp; e0 += 32) {
        const int64_t ne = 32;
        if (job->kern->vblock && s0->v_s[3] == 1 && j0 + 32 <= s0->Tk && e0 + 32 <= Dv) {
            bad |= job->kern->vblock(vb + j0 * s0->v_s[2] + e0, s0->v_s[2], vblk + e0 * 32,
                                     job->vbig);
            continue;
        }
        for (int64_t c = 0; c < 32; c++) {
            const int64_t j = j0 + c;
            int64_t e = 0;
            if (j < s0->Tk && e0 < Dv) {
                const uint16_t *src = vb + j * s0->v_s[2] + e0 * s0->v_s[3];
                for (; e < ne && e0 + e < Dv; e++) {
                    const uint16_t x = src[e * s0->v_s[3]];
                    bad |= ((x & 0x7f80u) == 0x7f80u ? ATTN__BF16_VBAD : 0u) |
                           ((x & 0x7f80u) >= job->vbig ? ATTN__BF16_VBIG : 0u);
                    blk[c][e] = x;
                }
            }
            for (; e < ne; e++)
                blk[c][e] = 0;
        }
        for (int64_t e = 0; e < ne; e++) {
            uint16_t *dst = vblk + (e0 + e) * 32;
            for (int64_t c = 0; c < 32; c++)
                dst[c] = blk[c][e];
        }
    }
    job->vbad[hk * nb + j0 / 32] = (uint8_t)bad;
}

void attn__bf16_run(const attn__sdpa_plan *plan, const void *q, const void *k, const void *v,
                    void *out, void *scratch, int64_t *empty)
{
    const attn__sdpa_shapes *s0 = &plan->s;
    attn__bf16_job job;
    int64_t n_items;
    bf16_layout(s0, plan->br, plan->bc, &job, &n_items);
    const attn__bf16_kernel *kern = attn__bf16_kernel_for(plan->arch);
    const int threads = plan->threads;
    job.kern = kern;
    job.s0 = s0;
    job.q = (const uint16_t *)q;
    job.k = (const uint16_t *)k;
    job.v = (const uint16_t *)v;
    job.out = out;
    job.f.ws_floats = plan->ws_floats;
    job.f.empty_first = (int64_t *)scratch;
    job.f.ws = (float *)scratch + 16 * (int64_t)threads;
    for (int t = 0; t < threads; t++)
        job.f.empty_first[t] = INT64_MAX;
    size_t part[3];
    bf16_extra_bytes(s0, &job, part);
    unsigned char *at = (unsigned char *)scratch +
                        attn__align64((size_t)((plan->ws_floats + 16) * (int64_t)threads) * sizeof(float));
    job.kp = (uint16_t *)at;
    job.vt = (uint16_t *)(at + part[0]);
    job.vbad = at + part[0] + part[1];
    /* K already in Kp's layout (a [B, H, T, D] array with D and Tk multiples of 32):
     * the items read the same elements in place, and the packing copies V only
     * (S2 and S3 on Zen 4: ~2% less time). */
    int lg = 0;
    while (((int64_t)1 << lg) < job.tkp)
        lg++;
    job.vbig = (uint16_t)((ATTN__BF16_VBIG_LOG2 - lg + 127) << 7);
    job.k_inplace = s0->k_s[3] == 1 && s0->k_s[2] == job.dp && s0->D == job.dp &&
                    s0->Tk == job.tkp;

    const int64_t blocks = s0->B * s0->Hkv * (job.tkp / 32);
    attn__parallel_for(blocks < threads ? (int)blocks : threads, blocks, bf16_pack_item, &job);
    attn__parallel_for(threads, n_items, kern->item, &job);
    *empty = INT64_MAX;
    for (int t = 0; t < threads; t++)
        if (job.f.empty_first[t] < *empty)
            *empty = job.f.empty_first[t];
}
