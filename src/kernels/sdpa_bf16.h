/*
 * sdpa_bf16.h - the bfloat16 tile path of the fused kernel: q, k and v stay in 16
 * bits and the two products run on bfloat16 hardware, AMX-BF16 tiles (the "amx"
 * arch) or vdpbf16ps (the "avx512bf16" arch), accumulating in float32, while the
 * online softmax between them is the float32 tile path's own code (fused_tile.h).
 * Internal; names start with attn__.
 *
 * Which calls take it (attn__bf16_eligible): q, k, v and out all in bfloat16 (the
 * KV cache may hand in a float32 q or out), an arch with a bfloat16 kernel, more
 * than ATTN__FUSED_ROW_MAX query rows (decoding steps are bound by memory and keep
 * the row path, which already reads K and V in 16 bits) and no weights asked for. Every option of SPEC section 6 is supported. Any other
 * 16-bit call runs the float32 kernel on widened copies (half_stage.h).
 *
 * The run (src/kernels/sdpa_bf16.c):
 *
 *   1. pack, in parallel blocks of 32 keys of one (batch, key/value head):
 *        Kp [B*Hkv][Tkp][Dp]   K rows, unit stride, zeros past Tk and D (left
 *                              out where K is already so: k_inplace)
 *        Vt [B*Hkv][Tkp/32][Dvp][32]  V transposed by blocks of 32 keys, so that
 *                              16 columns of a block are 1 KiB in a row; zeros
 *                              past Tk and Dv
 *        vbad [B*Hkv][Tkp/32]  per block of values: bit 0 an inf or a NaN, bit 1
 *                              a value of vbig and more (bf16_tile.h's stale max)
 *      with Tkp, Dp, Dvp = Tk, D, Dv rounded up to 32;
 *   2. the items (b, h, query tile), as on the float32 tile path (bf16_tile.h):
 *        the query tile packed as pairs along D:  Qp[D/32][nr/16][16][16][2]
 *        per key tile:  S^T = Kp Q^T          (bfloat16 products, float32 sums)
 *                       scale, softcap, bias, ALiBi, hiding, online softmax
 *                                               (fused_tile.h, float32)
 *                       P^T rounded to bfloat16 as pairs along the keys:
 *                                         Pp[bc/32][nr/16][16][16][2]
 *                       O^T = O^T * alpha + Vt P^T   (bfloat16 products)
 *        then O^T transposed, divided by the sum of the weights as rounded
 *        (the empty rows and the log-sum-exp as on the float32 path,
 *        fk_finish_rows) and rounded to bfloat16 once into out.
 *
 * Both products read the same packed layouts: an AMX tile multiply takes A = 16
 * rows of Kp (or Vt) and B = 16 rows of pairs of Qp (or Pp), which is also what
 * one vdpbf16ps needs: a broadcast pair of A and a row of pairs of B, 16 queries
 * along the lanes. Work items and blocks depend on the shapes only, so the bits do
 * not depend on the thread count.
 */
#ifndef ATTN_SDPA_BF16_H
#define ATTN_SDPA_BF16_H

#include "sdpa_fused.h"

#include <stdint.h>

/* One call's plan and data for the bfloat16 tile path. */
typedef struct attn__bf16_job {
    attn__fused_job f;           /* s: the caller's shapes (= s0; the float32 path's
                                    steps read only their sizes and options); br, bc,
                                    n_qt, dvp (= dvp32), ws, ws_floats, empty_first */
    const struct attn__bf16_kernel *kern; /* the kernel that runs it */
    const attn__sdpa_shapes *s0; /* the caller's shapes (16-bit q, k, v strides) */
    const uint16_t *q, *k, *v;   /* the caller's arrays */
    void *out;
    int64_t dp, dvp, tkp;        /* D, Dv and Tk rounded up to 32 */
    uint16_t *kp;                /* [B*Hkv][tkp][dp] */
    int k_inplace;               /* 1: k itself has Kp's layout (unit stride, rows dp
                                    elements apart, Tk = tkp): Kp is not packed and
                                    the items read k's rows in place */
    uint16_t *vt;                /* [B*Hkv][tkp/32][dvp][32] */
    uint8_t *vbad;               /* [B*Hkv][tkp/32]: ATTN__BF16_VBAD, ATTN__BF16_VBIG */
    uint16_t vbig;               /* the exponent bits (x & 0x7f80) from which |x| counts
                                    as big: 2^(ATTN__BF16_VBIG_LOG2 - ceil log2 tkp) */
} attn__bf16_job;

/* A block's flags in vbad. The weights taken against a stale max (bf16_tile.h) are up
 * to 2^8 (2^(8 + 2^-6) with their exponent's rounding) rather than 1, so O^T may
 * reach 2^8 Tk max |v|: below 2^(119 - ceil log2 Tk) (2^109 with 520 keys) that stays
 * below 2^128; where a head's values hold one of that size or more, its items keep
 * every weight at most 1 (their max current), as the float32 path does. */
#define ATTN__BF16_VBAD 1u
#define ATTN__BF16_VBIG 2u
#define ATTN__BF16_VBIG_LOG2 119

/* One worker's scratch, in floats from its start, each part 64-byte aligned:
 * ST and ST2 [bc][br] scores then weights, key-major (the float32 path's layout), two
 * so that the next key tile's product can start before this one's softmax; O [br][dvp]
 * the output accumulator for fk_finish; OT [dvp][br] the accumulator the products
 * update; m, l, alpha, inv [br]; l2 [br] the sum of the weights as rounded to
 * bfloat16 (b16_finish divides by it); cmax [2][br] the max per row of ST's and ST2's
 * products where the product gathered it; Qp [dp][br] and Pp [ATTN__BF16_PP_TILES bc][br]
 * bfloat16 pairs; cfg, the 64 bytes of an AMX tile configuration. */
/* Key tiles whose weights Pp holds at once: the vdpbf16ps kernels sum up to this
 * many consecutive tiles' weights times V in one pass over O^T (bf16_tile.h). */
#define ATTN__BF16_PP_TILES 4

typedef struct attn__bf16_ws {
    int64_t st, st2, o, ot, m, l, l2, alpha, inv, cmax, qp, pp, cfg, total;
} attn__bf16_ws;

static inline void attn__bf16_ws_layout(const attn__bf16_job *job, attn__bf16_ws *w)
{
    const int64_t br = job->f.br, bc = job->f.bc;
    int64_t at = 0;
#define ATTN__BF16_PART(field, floats) (w->field = at, at += ((floats) + 15) / 16 * 16)
    ATTN__BF16_PART(st, bc * br);
    ATTN__BF16_PART(st2, bc * br);
    ATTN__BF16_PART(o, br * job->dvp);
    ATTN__BF16_PART(ot, job->dvp * br);
    ATTN__BF16_PART(m, br);
    ATTN__BF16_PART(l, br);
    ATTN__BF16_PART(l2, br);
    ATTN__BF16_PART(alpha, br);
    ATTN__BF16_PART(inv, br);
    ATTN__BF16_PART(cmax, 2 * br);
    ATTN__BF16_PART(qp, job->dp * br / 2);
    ATTN__BF16_PART(pp, ATTN__BF16_PP_TILES * bc * br / 2);
    ATTN__BF16_PART(cfg, 16);
#undef ATTN__BF16_PART
    w->total = at;
}

/* What one bfloat16 kernel provides. */
typedef struct attn__bf16_kernel {
    attn_arch arch;
    const char *products; /* "amx-bf16 tiles", "vdpbf16ps", "vdpbf16ps emulated" */
    /* Processes one work item (b, h, query tile). */
    void (*item)(void *job, int64_t item, int worker);
    /* V^T of one whole block: 32 value rows of 32 columns from src (rows ld apart,
     * unit stride) into dst's 32 rows of 32 keys; returns ATTN__BF16_VBAD when a
     * value is an inf or a NaN, ORed with ATTN__BF16_VBIG when one's exponent bits
     * are vbig or more. */
    unsigned (*vblock)(const uint16_t *src, int64_t ld, uint16_t *dst, uint16_t vbig);
} attn__bf16_kernel;

#ifdef ATTN_HAVE_X86
/* vdpbf16ps's products done by AVX-512F FMAs (ATTN_BF16_EMULATE, for the tests on a
 * CPU without AVX512-BF16; src/kernels/sdpa_bf16_avx512.c). */
extern const attn__bf16_kernel attn__bf16_kernel_emulated;
#ifdef ATTN_HAVE_BF16_KERNELS
extern const attn__bf16_kernel attn__bf16_kernel_dp;  /* sdpa_bf16_dp.c */
extern const attn__bf16_kernel attn__bf16_kernel_amx; /* sdpa_bf16_amx.c */
#endif
#endif

/* The bfloat16 kernel arch runs, or NULL when it has none (every arch but
 * avx512bf16 and amx, or a build without them). */
const attn__bf16_kernel *attn__bf16_kernel_for(attn_arch arch);

/* 1 when a call of shapes s under arch takes the bfloat16 tile path. */
int attn__bf16_eligible(const attn__sdpa_shapes *s, attn_arch arch);

/* Plans such a call: threads (from flops, the work the fused planner counted),
 * tiles from the machine's (tile_br, tile_bc), scratch bytes. */
int attn__bf16_plan(attn_ctx *ctx, attn__sdpa_plan *plan, double flops, int64_t tile_br,
                    int64_t tile_bc);

/* Runs it with the plan's scratch; *empty is the first empty row's flat index
 * (b*H*Tq + h*Tq + i) or INT64_MAX. */
void attn__bf16_run(const attn__sdpa_plan *plan, const void *q, const void *k, const void *v,
                    void *out, void *scratch, int64_t *empty);

#endif /* ATTN_SDPA_BF16_H */
