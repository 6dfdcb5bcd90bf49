/*
 * sdpa_fused_backward_4x4_avx512.c - the fused backward of attention
 * (src/kernels/fused_backward.h) built for AVX-512 F + DQ + BW + VL a second time,
 * with square register tiles: the scores, dP and dQ take 4 query rows by 4 vectors
 * (of keys, of d), and dK, dV 4 keys by 4 vectors of d (16 accumulators each).
 *
 * Why a second body: on Zen 4, which runs a 512-bit FMA once a cycle and whose
 * first-level cache serves one 512-bit load a cycle, the 8 x 2 and 6 x 4 tiles of
 * sdpa_fused_backward_avx512.c (chosen on a Sapphire Rapids class Xeon) left FMA
 * cycles empty: these tiles took 4-5% less time on S2 and S3 with one thread
 * (docs/performance.md, "An eighth look: Zen 4"). The scores' key step is then 64
 * keys, the whole key tile, so the tile is not cut into slices (FB_SLICE).
 * src/runtime/dispatch.c's micro-tile choice picks the body (attn__fused_microtile,
 * the forward's: 4 x 4 on Zen 4 and Zen 5; ATTN_MICROTILE forces it).
 *
 * The shapes change only which products run side by side, never a sum's order
 * (each score and dP over d in order, each dQ over keys in order, each dK and dV
 * over rows in order, blocks of 32 rows as before), so this body gives the same
 * bits as sdpa_fused_backward_avx512.c (tests/test_fused_backward_microtile.c).
 */
#define ATTN_SIMD_AVX512 1
#define FB_R 4
#define FB_NV 4
#define FB_SLICE 64
#define FB_KQ 4
/* dK and dV without the sub-blocks a key group's keys lie outside (the same bits;
 * measured on Zen 4 only: docs/performance.md, "A ninth look"). */
#define FB_KV_TRIM 1
#include "fused_backward.h"

const attn__fused_bwd_kernel attn__fused_bwd_kernel_avx512_4x4 = {
    ATTN_ARCH_AVX512, SIMD_W, FB_NV * SIMD_W, fb_delta_item, fb_kv_item, fb_q_item, fb_head_item,
};
