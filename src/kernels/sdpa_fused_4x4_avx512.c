/*
 * sdpa_fused_4x4_avx512.c - the fused attention kernel (src/kernels/fused_kernel.h)
 * built for AVX-512 F + DQ + BW + VL a second time, with square micro-tiles:
 * 4 keys x 4x16 query rows for the scores (16 accumulators) and 4 query rows x 4
 * vectors of value columns for the weighted sum.
 *
 * Why a second body: both shapes run 16 FMAs per step of the reduction, but 4 x 4
 * needs 4 broadcasts where 8 x 2 needs 8. llvm-mca-19's Zen 4 and Zen 5 models send
 * each 512-bit broadcast from memory to an FP pipe the FMAs also use, so there 4 x 4
 * models about 20% faster; on the Sapphire Rapids class, whose loads broadcast
 * without an FP pipe, 8 x 2 measured as fast or faster (docs/performance.md).
 * src/runtime/dispatch.c picks the body per microarchitecture (ATTN_MICROTILE
 * forces it), and src/kernels/sdpa_fused.c hands it out as the AVX-512 kernel.
 *
 * The shapes change only which products run together, never a sum's order: each
 * score is summed over d in increasing order and each output over keys in
 * increasing order, whatever the micro-tile, so this body gives the same bits as
 * sdpa_fused_avx512.c (tests/test_fused_microtile.c). Its query rows per
 * micro-tile of the scores (FK_QW) are 64: the planner rounds the query tile up to
 * a multiple of that (kern->mr), which leaves the key tiles, and so the bits, as
 * they are.
 */
#define ATTN_SIMD_AVX512 1
#define FK_MR 4
#define FK_NV 4
#define FK_MK 4
#define FK_NQV 4
#include "fused_kernel.h"

const attn__fused_kernel attn__fused_kernel_avx512_4x4 = {
    ATTN_ARCH_AVX512, SIMD_W, FK_QW, FK_MK, fk_ws_floats, fk_item, fk_split_merge, fk_exp_nonpos, fk_tanh,
    fk_hsum4, fk_exp2_nonpos,
};
