/*
 * sdpa_fused_avx2.c - the fused attention kernel (src/kernels/fused_kernel.h) built for
 * AVX2 + FMA (8 floats a vector; 16 registers).
 * CMake compiles this file alone with the ISA flags; src/runtime/dispatch.c calls it only
 * when cpuid and xgetbv say the CPU and the OS support those registers.
 *
 * Micro-tiles: 4 keys x 3x8 query rows for the scores (12 accumulators, 3 query
 * vectors and 1 broadcast key element: the 16 registers), 6 query rows x 2 vectors
 * of value columns for the weighted sum (12 accumulators, 2 value vectors, 1
 * broadcast weight). Two FMA pipes of 4 to 5 cycles' latency need 8 to 10
 * independent sums in flight; the 4 x 2 shapes used before had exactly 8, so any
 * stall of a load or a broadcast left a pipe idle (llvm-mca-19's Haswell model
 * put them at 80% of the FMA throughput, docs/performance.md).
 *
 * The keys per micro-tile stay 4, which divides every key tile (bc is a multiple
 * of 8), so the key tiles, and with them every sum's order, are those of the 4 x 2
 * shapes and of the AVX-512 bodies: the same bits (tests/test_fused_avx2_tiles.c).
 * The query panels are 24 rows: the planner rounds the query tile up to a multiple
 * of that (64 -> 72), which moves no key tile; 24 is a multiple of the weighted
 * sum's 6 rows, so its blocks never straddle a panel.
 */
#define ATTN_SIMD_AVX2 1
#define FK_MR 6
#define FK_NV 2
#define FK_MK 4
#define FK_NQV 3
#include "fused_kernel.h"

const attn__fused_kernel attn__fused_kernel_avx2 = {
    ATTN_ARCH_AVX2, SIMD_W, FK_QW, FK_MK, fk_ws_floats, fk_item, fk_split_merge, fk_exp_nonpos, fk_tanh,
    fk_hsum4, fk_exp2_nonpos,
};
