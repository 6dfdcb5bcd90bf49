/*
 * sdpa_fused.h - the fused attention kernel: one call's plan (attn__fused_job) and
 * what each instruction set's build provides (attn__fused_kernel). The planner is
 * src/kernels/sdpa_fused.c; the kernel body, and its contract, src/kernels/fused_kernel.h.
 * Internal; names start with attn__.
 */
#ifndef ATTN_SDPA_FUSED_H
#define ATTN_SDPA_FUSED_H

#include "attn_internal.h"
#include "dispatch.h"
#include "sdpa_contract.h"
#include "threads.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Up to this many query rows, the fused kernel takes its row path (see
 * src/kernels/fused_kernel.h): a decoding step, the chapter's toy size. */
#define ATTN__FUSED_ROW_MAX 8

/* Split-key decoding (src/kernels/fused_split.h): the row path splits the keys
 * into chunks when there are fewer than ATTN__SPLIT_ITEMS (batch, key/value head)
 * pairs and at least ATTN__SPLIT_MIN_TK keys, into at most ATTN__SPLIT_ITEMS /
 * (B * Hkv) chunks of at least ATTN__SPLIT_MIN_CHUNK keys. These numbers are the
 * only inputs besides the shapes: never the thread count, so the bits of the
 * result are the same for any number of threads. */
#define ATTN__SPLIT_ITEMS 64
#define ATTN__SPLIT_MIN_TK 512
#define ATTN__SPLIT_MIN_CHUNK 256

/* One call's plan and data, filled by src/kernels/sdpa_fused.c and read by every worker. */
typedef struct attn__fused_job {
    const attn__sdpa_shapes *s;
    const float *q, *k, *v; /* q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv] */
    float *out;             /* [B, H, Tq, Dv] */
    float *weights;         /* [B, H, Tq, Tk] or NULL */
    int64_t br;             /* query rows per tile (a multiple of the kernel's mr) */
    int64_t bc;             /* keys per tile (a multiple of the kernel's nk) */
    int64_t n_qt;           /* query tiles per (b, h) */
    int64_t dvp;            /* Dv rounded up to the vector width */
    int row_path;           /* 1: one (b, h) per item, row by row, K and V in place */
    int64_t n_chunks;       /* split-key path (row path only): key chunks per
                               (b, key/value head), or 0 when the keys are not split */
    int64_t chunk;          /* keys per chunk (a multiple of 16); the last may be short */
    int64_t kv_first;       /* split-key path: the key that row 0 of k and v (at each
                               (b, key/value head)) holds; 0, except for the 16-bit
                               path's chunk-sized copy, where it is the chunk's first
                               key. A split item reads key j at row j - kv_first. */
    attn_dtype kv_dtype;    /* split-key path: F32 (0), K and V in k and v; or BF16
                               or F16 (AVX-512 and AVX2): the split items read
                               the caller's 16-bit K and V, k16 and v16 (strides
                               s->k_s, s->v_s), widening them in registers */
    const uint16_t *k16, *v16;
    int64_t pst;            /* floats per partial result: 16 of header (m, l, seen)
                               and then dvp of unnormalised output */
    float *part;            /* partials [B, H, Tq, n_chunks][pst] */
    int64_t ws_floats;      /* floats of scratch per worker */
    float *ws;              /* workers * ws_floats */
    int64_t *empty_first;   /* per worker: smallest flat row index b*H*Tq + h*Tq + i
                               of a row with every key masked, or INT64_MAX */
    _Atomic int64_t *claim; /* tile path, when set: the counter each worker takes its
                               items from itself (fk_tile_worker), n_items of them;
                               the pool's item is then the worker's share, not an
                               item. NULL: each call of item is one item */
    int64_t n_items;
} attn__fused_job;

/* What one instruction set's build of the kernel body provides. */
typedef struct attn__fused_kernel {
    attn_arch arch;
    int width; /* floats per vector */
    int mr;    /* query rows per micro-tile (tiles hold a multiple of it) */
    int nk;    /* keys per micro-tile of the score product */
    /* Scratch floats one worker needs for a job planned with these sizes. */
    int64_t (*ws_floats)(const attn__fused_job *job);
    /* Processes one work item: (b, h, query tile), or (b, h) on the row path. */
    void (*item)(void *job, int64_t item, int worker);
    /* Merges the split-key partials of one (b, h) into out and lse. */
    void (*merge)(void *job, int64_t item, int worker);
    /* y[i] = e^x[i] for x[i] <= 0 with this build's vector exp (for the tests). */
    void (*exp_nonpos)(const float *x, float *y, int64_t n);
    /* y[i] = tanh(x[i]) with this build's vector tanh, softcap's (for the tests). */
    void (*tanh)(const float *x, float *y, int64_t n);
    /* out[r] = (sum of x[r * width .. r * width + width - 1]) * scale, r = 0..3,
     * by this build's simd_hsum4_scaled, the split path's reduction (for the
     * tests). */
    void (*hsum4)(const float *x, float scale, float *out);
    /* y[i] = 2^x[i] for x[i] <= 0 with this build's vector 2^x (for the tests). */
    void (*exp2_nonpos)(const float *x, float *y, int64_t n);
} attn__fused_kernel;

extern const attn__fused_kernel attn__fused_kernel_scalar;
#ifdef ATTN_HAVE_X86
extern const attn__fused_kernel attn__fused_kernel_avx2;
extern const attn__fused_kernel attn__fused_kernel_avx512;     /* micro-tiles 8 x 2 */
extern const attn__fused_kernel attn__fused_kernel_avx512_4x4; /* micro-tiles 4 x 4 */
#endif

/* The build of the kernel for arch (REF gives the portable one), or NULL when
 * this library was built without it (AVX2/AVX-512 off x86-64). For AVX-512, the
 * body of the micro-tile shape chosen for this machine (attn__fused_microtile,
 * src/runtime/dispatch.c); both bodies give the same bits. */
const attn__fused_kernel *attn__fused_kernel_for(attn_arch arch);

/* Several planned fused calls run as one parallel job (sdpa_fused.c): the KV
 * cache's batched attend, one call per sequence. attn__fused_batch_add takes every
 * plan in turn into a zeroed attn__fused_batch_size, attn__fused_batch_bytes says
 * the scratch, and attn__sdpa_fused_run_batch runs plans[0 .. n-1] (fused plans of
 * one arch and one dtype, no weights) on io[j]'s data with that scratch, 64-byte
 * aligned. A 16-bit batch runs the row path's items (split-key chunks read in
 * place or widened by the item that uses them, or one key/value head widened once
 * for its group) and the tile path's (one key/value head widened once for its
 * group's query tiles, each tile's query and output rows through its worker's
 * float32 rows of one head); a plan that asks for weights, or one on the bfloat16
 * kernel's path, sets one_by_one and must run as its own call. It allocates nothing; the bits are those of the calls
 * run one by one, for any thread count. */
typedef struct attn__fused_batch_size {
    int64_t n;         /* plans added */
    int threads;       /* the most any plan uses */
    int64_t ws_floats; /* the most any plan needs per worker */
    int64_t parts;     /* split-key partials of all, each rounded up to 16 floats */
    int64_t qo_floats; /* 16-bit: float32 copies of q and out of every plan whose
                          keys are split, each rounded up to 16 floats */
    int64_t head_qo_floats; /* 16-bit: one worker's float32 rows of one query head's
                               q and out, the most any plan not split needs */
    int64_t kv_floats; /* 16-bit: one worker's float32 copy of K and V rows */
    int half;          /* 1: the plans are 16-bit */
    int one_by_one;    /* 1: some plan cannot join a batch */
    int overflow;
} attn__fused_batch_size;

/* One call's arrays: float32, or the 16-bit dtype of a 16-bit plan (q and out
 * as the plan's q_f32 and out_f32 say). */
typedef struct attn__fused_io {
    const void *q, *k, *v;
    void *out;
} attn__fused_io;

void attn__fused_batch_add(attn__fused_batch_size *acc, const attn__sdpa_plan *plan);
int attn__fused_batch_bytes(attn_ctx *ctx, const attn__fused_batch_size *acc, size_t *bytes);
int attn__sdpa_fused_run_batch(attn_ctx *ctx, const attn__sdpa_plan *plans, int64_t n,
                               const attn__fused_io *io, void *scratch);

#endif /* ATTN_SDPA_FUSED_H */
