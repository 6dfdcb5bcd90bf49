/*
 * sdpa_fused_backward.h - the fused backward of attention: one call's plan and data
 * (attn__fused_bwd_job) and what each instruction set's build of the body in
 * src/kernels/fused_backward.h provides (attn__fused_bwd_kernel). The planner and
 * the runner are in src/kernels/sdpa_fused_backward.c. Internal; names start with
 * attn__.
 */
#ifndef ATTN_SDPA_FUSED_BACKWARD_H
#define ATTN_SDPA_FUSED_BACKWARD_H

#include "attn_internal.h"
#include "dispatch.h"
#include "sdpa_contract.h"
#include "threads.h"

#include <stddef.h>
#include <stdint.h>

/* Query rows per tile of the dQ pass and keys per tile of both passes. */
#define ATTN__FUSED_BWD_BR 64
#define ATTN__FUSED_BWD_BC 64

/* One call's plan and data, read by every worker. */
typedef struct attn__fused_bwd_job {
    const attn__sdpa_bwd_shapes *bs;
    const float *q, *k, *v, *o, *lse, *dout;
    float *dq, *dk, *dv;
    float *delta;          /* [B * H * Tq]: Delta_i = rowsum(dO_i * O_i), 0 for an
                              empty row */
    unsigned char *sees;   /* [B * H * Tq]: 1 when the row sees at least one key */
    int64_t br, bc;        /* query rows per dQ tile, keys per key tile */
    int64_t n_qt, n_kt;    /* query tiles, key tiles per head */
    int64_t bcp;           /* bc rounded up to the vector width */
    int64_t dp, dvp;       /* D and Dv rounded up to the vector width */
    int one_pass;          /* 1: fb_head_item's one pass over (b, hk) items;
                              0: pass 1 over key tiles, then pass 2 over query tiles */
    int64_t ws_floats;     /* floats of scratch per worker */
    float *ws;             /* workers * ws_floats */
    int64_t *empty_first;  /* per worker: smallest flat row b*H*Tq + h*Tq + i that
                              sees no key, or INT64_MAX */
} attn__fused_bwd_job;

/* What one instruction set's build of the body provides: the three passes' items. */
typedef struct attn__fused_bwd_kernel {
    attn_arch arch;
    int width;    /* floats per vector */
    int key_step; /* keys scored at once: the key tile is padded to a multiple */
    /* Pass 0, item (b, h): Delta and which rows see a key. */
    void (*delta_item)(void *job, int64_t item, int worker);
    /* Pass 1, item (b, key/value head, key tile): that tile's rows of dK and dV. */
    void (*kv_item)(void *job, int64_t item, int worker);
    /* Pass 2, item (b, h, query tile): that tile's rows of dQ (and dbias). */
    void (*q_item)(void *job, int64_t item, int worker);
    /* The one-pass form, item (b, key/value head): dQ, dK and dV of that head's
     * group, in place of passes 1 and 2. */
    void (*head_item)(void *job, int64_t item, int worker);
} attn__fused_bwd_kernel;

extern const attn__fused_bwd_kernel attn__fused_bwd_kernel_scalar;
#ifdef ATTN_HAVE_X86
extern const attn__fused_bwd_kernel attn__fused_bwd_kernel_avx2;
extern const attn__fused_bwd_kernel attn__fused_bwd_kernel_avx512;     /* tiles 8 x 2, 6 x 4 */
extern const attn__fused_bwd_kernel attn__fused_bwd_kernel_avx512_4x4; /* tiles 4 x 4 */
#endif

/* The build for arch (REF gives the portable one), or NULL when this library was
 * built without it. For AVX-512, the body of the register tiles that go with the
 * forward's micro-tile shape chosen for this machine (attn__fused_microtile,
 * src/runtime/dispatch.c); both bodies give the same bits. */
const attn__fused_bwd_kernel *attn__fused_bwd_kernel_for(attn_arch arch);

#endif /* ATTN_SDPA_FUSED_BACKWARD_H */
