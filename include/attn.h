/*
 * attn.h - self-attention from scratch, in C11.
 *
 * This is the one public header of libattn. It implements chapter 11 of an LLM
 * tutorial ("Self-Attention 从零实现"): scaled dot-product attention, multi-head
 * self-attention with a fused q/k/v projection, padding and causal masks, and the
 * shape changes between them. The PyTorch module of the chapter is the semantic
 * reference; see docs/ and the README for the walk-through.
 *
 * Conventions used by every function in this header:
 *
 *   - Shapes use the chapter's names: batch B, heads H, query length Tq, key length
 *     Tk (T when both are the same), embed_dim E, head_dim D = E / H.
 *   - Arrays are described by an attn_tensor: a caller-owned buffer with up to four
 *     64-bit sizes and explicit strides (in elements, not bytes), so a function can
 *     read a view (a transpose, a slice) without copying. The library never frees
 *     or keeps a pointer to caller memory. A tensor's data pointer must be a
 *     multiple of its element size (4 bytes for float32, 2 for 16-bit, 8 for
 *     int64; any address for bool); a misaligned one is refused with
 *     ATTN_STATUS_INVALID_ARGUMENT naming it. Strides are never negative.
 *   - Every function returns an attn_status: ATTN_OK (0) or a negative code. When a
 *     call fails and the caller passed an attn_ctx, ctx->message holds one sentence
 *     that names the shapes or values involved. The library never exits, aborts or
 *     prints.
 *   - Weights follow PyTorch's nn.Linear layout: [out_features, in_features], and a
 *     projection computes y = x W^T + b.
 *   - Masks are boolean (one byte per entry, nonzero = true) and true means
 *     "may attend". A mask broadcasts to [B, H, Tq, Tk] by numpy's rule: shapes are
 *     right-aligned and each axis is equal or 1.
 *   - Aliasing: inputs may share memory with each other freely (q, k and v may be
 *     column blocks of one buffer). An output must not share memory with any other
 *     argument, except where a function's comment allows an output to be one
 *     input exactly (the same view, computed in place); an overlap the function
 *     cannot handle is refused with ATTN_STATUS_INVALID_ARGUMENT and a message
 *     naming both tensors, before anything is written. Overlap is decided exactly,
 *     element by element, for views of ordinary arrays (slices, transposes, column
 *     blocks), and costs nothing when the buffers are separate. An input may repeat
 *     memory (stride 0 broadcasts it); an output may not overlap itself (stride 0
 *     on an axis longer than 1), nor have axes whose strides interleave (a layout
 *     no slice or transpose of an array has): refused the same way.
 *
 * Build: link with -lattn (and -lm -lpthread for the static library), or use
 * pkg-config (attn) or CMake's find_package(attn).
 */
#ifndef ATTN_H
#define ATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ATTN_API marks what libattn exports. The library is built with hidden
 * visibility, so its shared object exports the functions marked here and nothing
 * else; internal names (attn__*) never leave it. */
#if defined(_WIN32) && defined(ATTN_BUILD_SHARED)
#define ATTN_API __declspec(dllexport)
#elif defined(__GNUC__) || defined(__clang__)
#define ATTN_API __attribute__((visibility("default")))
#else
#define ATTN_API
#endif

#define ATTN_VERSION_MAJOR 0
#define ATTN_VERSION_MINOR 1
#define ATTN_VERSION_PATCH 0
#define ATTN_VERSION_STRING "0.1.0"

/* The version of the library a program runs with, "MAJOR.MINOR.PATCH": the
 * ATTN_VERSION_STRING that libattn was built with, which may differ from the one
 * the program was compiled with when a shared library is swapped under it. The
 * string is static; do not free it. (CMake's configure step refuses a header
 * whose macros differ from the project's version.) */
ATTN_API const char *attn_version(void);

/* ------------------------------------------------------------------------------
 * Status codes and errors
 * ---------------------------------------------------------------------------- */

typedef enum attn_status {
    ATTN_OK = 0,
    ATTN_STATUS_INVALID_ARGUMENT = -1, /* a NULL pointer, a size below 1, a bad option */
    ATTN_STATUS_SHAPE_MISMATCH = -2,   /* shapes that do not fit together */
    ATTN_STATUS_MASK_BROADCAST = -3,   /* a mask whose shape does not broadcast */
    ATTN_STATUS_EMPTY_ROW = -4,        /* a query row whose keys are all masked */
    ATTN_STATUS_OVERFLOW = -5,         /* sizes whose product overflows */
    ATTN_STATUS_NO_MEMORY = -6,        /* an allocation failed */
    ATTN_STATUS_DTYPE = -7,            /* an element type the call does not take */
    ATTN_STATUS_IO = -8,               /* a file could not be opened, read or written */
    ATTN_STATUS_FORMAT = -9,           /* a file is malformed */
    ATTN_STATUS_UNSUPPORTED = -10      /* valid, but not available in this build */
} attn_status;

/* The enum's name without the prefix, e.g. "EMPTY_ROW"; "UNKNOWN" otherwise. */
ATTN_API const char *attn_status_name(int status);
/* A short English description, e.g. "a query row has all its keys masked". */
ATTN_API const char *attn_strerror(int status);

/* ------------------------------------------------------------------------------
 * Context: allocator, threads, kernel choice, and the last error message.
 *
 * The caller owns the struct (usually on the stack) and fills it with
 * attn_ctx_init(). Every function takes `attn_ctx *ctx`, which may be NULL: then
 * the defaults are used and no message is kept. One context must not be used by
 * two threads at once; use one context per thread (its message is then that
 * thread's own). What calls take as const may be shared by threads calling at
 * once: inputs, packed weights (attn_linear_packed, attn_mha_packed) and a KV cache
 * being attended; an append or truncate must not overlap any other use of that
 * cache. Concurrent calls share the library's worker pool: a call that finds it
 * busy runs its work on its own thread, with the same bits (results never depend
 * on the thread count; tests/test_embed_threads.c). A call's frames take a few KiB
 * of the caller's stack (large scratch comes from the heap or ctx->workspace), so a
 * thread with a 64 KiB stack may call any function (tests/test_embed_stack.c).
 * pthread_cancel: the computing calls hold off a cancel until they return (it then
 * acts at the thread's next cancellation point; tests/test_embed_cancel.c); the
 * file functions do not, and a thread cancelled inside one (in open, read, write
 * or fsync) leaves that call's memory, descriptor and temporary file behind.
 * Signals: the pool's workers block every signal, so a signal sent to the process
 * is handled on one of the program's own threads (tests/test_threads_signals.c).
 * ---------------------------------------------------------------------------- */

#define ATTN_MESSAGE_SIZE 512

/* Both functions, or neither (both NULL: malloc and free). A call that would
 * allocate through a context whose allocator has one and not the other refuses
 * it (ATTN_STATUS_INVALID_ARGUMENT, "ctx->allocator has alloc but no free ..."),
 * before asking for any memory. */
typedef struct attn_allocator {
    /* Returns NULL on failure, else memory aligned for any type, as malloc's is
     * (attn_tensor_alloc's tensors and the loaders' arrays start where it points,
     * and a data pointer must be aligned to its elements). `size` is never 0. */
    void *(*alloc)(void *user, size_t size);
    /* Frees what alloc returned; never called with NULL. */
    void (*free)(void *user, void *ptr);
    void *user;
} attn_allocator;

/* Which attention kernel runs. */
typedef enum attn_impl {
    ATTN_IMPL_AUTO = 0,  /* the library's default (the fused kernel where built) */
    ATTN_IMPL_REF = 1,   /* the reference: scores, softmax, weighted sum */
    ATTN_IMPL_FUSED = 2  /* the fused online-softmax kernel */
} attn_impl;

/* Which instruction set the fast kernels use. */
typedef enum attn_arch {
    ATTN_ARCH_AUTO = 0,   /* decided once from cpuid/xgetbv, or the ATTN_ARCH variable */
    ATTN_ARCH_REF = 1,    /* the reference kernels only */
    ATTN_ARCH_SCALAR = 2, /* portable C fast kernels */
    ATTN_ARCH_AVX2 = 3,   /* AVX2 + FMA + F16C */
    ATTN_ARCH_AVX512 = 4, /* AVX-512 F + DQ + BW + VL */
    ATTN_ARCH_AVX512_BF16 = 5, /* avx512, plus vdpbf16ps for bfloat16 attention */
    ATTN_ARCH_AMX = 6     /* avx512 and AVX512-BF16, plus AMX-BF16 tiles for bfloat16
                             attention */
} attn_arch;

typedef struct attn_ctx {
    attn_allocator allocator; /* malloc/free by default */
    int threads;              /* worker threads; 0 (or below) = one per core the
                                 process may run on (default; attn_threads_online) */
    attn_impl impl;           /* ATTN_IMPL_AUTO by default */
    attn_arch arch;           /* ATTN_ARCH_AUTO by default */
    int status;               /* the last failing call's status, or ATTN_OK */
    char message[ATTN_MESSAGE_SIZE]; /* the last failing call's message, or "" */

    /* Scratch. A call that needs scratch memory (the ..._workspace_size functions
     * say how much) takes it, in this order, from:
     *   1. workspace, when workspace_size is at least what the call needs and it
     *      is 64-byte aligned (the caller's memory, which the library never frees;
     *      a workspace too small or not aligned is passed over, not an error);
     *   2. the context's own buffer, when keep_workspace is nonzero: allocated on
     *      first need, grown when a call needs more, kept between calls, and freed
     *      by attn_ctx_release(); it is freed with the allocator that allocated
     *      it, even if ctx->allocator has changed since;
     *   3. otherwise a fresh allocation, freed before the call returns.
     * So a loop that hands in a large enough workspace, or sets keep_workspace,
     * allocates nothing after its first call. A workspace is one call's scratch
     * while that call runs: contexts used by threads at once need one each. */
    void *workspace;
    size_t workspace_size;
    int keep_workspace;
    void *kept_;              /* the context's own buffer (private) */
    size_t kept_size_;        /* its size in bytes (private) */
} attn_ctx;

/* Fills ctx with the defaults (no workspace, keep_workspace 0). */
ATTN_API void attn_ctx_init(attn_ctx *ctx);
/* Frees the scratch the context kept (keep_workspace) and clears that field;
 * ctx stays usable. NULL-safe. Call it before a context with keep_workspace set
 * goes out of scope. */
ATTN_API void attn_ctx_release(attn_ctx *ctx);

/* ------------------------------------------------------------------------------
 * Tensors: up to four dimensions, 64-bit sizes, strides in elements.
 * ---------------------------------------------------------------------------- */

#define ATTN_MAX_DIMS 4

typedef enum attn_dtype {
    ATTN_DTYPE_F32 = 0,  /* float */
    ATTN_DTYPE_BOOL = 1, /* one byte, nonzero = true */
    ATTN_DTYPE_I64 = 2,  /* int64_t, e.g. token ids */
    ATTN_DTYPE_I32 = 3,  /* int32_t, e.g. token ids */
    ATTN_DTYPE_BF16 = 4, /* bfloat16 in a uint16_t: the top half of a float32 */
    ATTN_DTYPE_F16 = 5   /* IEEE binary16 (float16) in a uint16_t */
} attn_dtype;

typedef struct attn_tensor {
    void *data;                    /* first element; caller-owned */
    attn_dtype dtype;
    int ndim;                      /* 1 .. ATTN_MAX_DIMS */
    int64_t shape[ATTN_MAX_DIMS];  /* sizes, each >= 1; entries past ndim are 1 */
    int64_t stride[ATTN_MAX_DIMS]; /* in elements; entries past ndim are 1 */
} attn_tensor;

/* Bytes per element of a dtype (4, 1, 8, 4, 2, 2), or 0 for an unknown one. */
ATTN_API size_t attn_dtype_size(attn_dtype dtype);
/* "float32", "bool", "int64", "int32", "bfloat16", "float16". */
ATTN_API const char *attn_dtype_name(attn_dtype dtype);

/* Describes `data` as a C-contiguous (row-major) array of the given shape.
 * Fails with OVERFLOW when the number of bytes does not fit in size_t. */
ATTN_API int attn_tensor_init(attn_ctx *ctx, attn_tensor *t, attn_dtype dtype, void *data,
                     int ndim, const int64_t *shape);

/* Allocates a zero-filled C-contiguous tensor with ctx's allocator.
 * Free it with attn_tensor_free(). */
ATTN_API int attn_tensor_alloc(attn_ctx *ctx, attn_tensor *t, attn_dtype dtype, int ndim,
                      const int64_t *shape);
/* Frees what attn_tensor_alloc allocated (with the same ctx) and clears t. */
ATTN_API void attn_tensor_free(attn_ctx *ctx, attn_tensor *t);

/* Number of elements (the product of the sizes), or -1 if it overflows. */
ATTN_API int64_t attn_tensor_numel(const attn_tensor *t);
/* 1 if the strides are those of a C-contiguous array of t's shape, else 0. */
ATTN_API int attn_tensor_is_contiguous(const attn_tensor *t);
/* Checks ndim, sizes >= 1, non-negative strides, a non-NULL data pointer, and that
 * the largest element offset fits in 64 bits; `name` labels the message. */
ATTN_API int attn_tensor_check(attn_ctx *ctx, const attn_tensor *t, const char *name);

/* A view with axes a and b swapped (no copy): shape and stride entries swap. */
ATTN_API int attn_tensor_transpose(attn_ctx *ctx, const attn_tensor *t, int a, int b,
                          attn_tensor *view);
/* A view of a contiguous tensor with another shape of the same element count. */
ATTN_API int attn_tensor_reshape(attn_ctx *ctx, const attn_tensor *t, int ndim,
                        const int64_t *shape, attn_tensor *view);
/* A view of t narrowed to [start, start + length) along `axis`. */
ATTN_API int attn_tensor_narrow(attn_ctx *ctx, const attn_tensor *t, int axis, int64_t start,
                       int64_t length, attn_tensor *view);
/* Copies src into dst element by element (same shape and dtype; any strides).
 * Aliasing: dst may be src itself (the same view: nothing changes); a dst that
 * overlaps src otherwise is refused (INVALID_ARGUMENT, naming both). */
ATTN_API int attn_tensor_copy(attn_ctx *ctx, const attn_tensor *src, attn_tensor *dst);
/* Copies src into dst converting between the floating dtypes float32, bfloat16 and
 * float16 (same shape, any strides; src and dst may have the same dtype). Widening
 * is exact; narrowing rounds to nearest, ties to even, keeps a NaN a NaN and
 * overflows to infinity (float16 from 65520 up). Aliasing as attn_tensor_copy; a
 * dst that overlaps src is refused unless it is src itself with the same dtype.
 * DTYPE for any other dtype, naming it. */
ATTN_API int attn_tensor_convert(attn_ctx *ctx, const attn_tensor *src, attn_tensor *dst);

/* Writes a shape as a Python tuple: "(2, 5, 16)", "(5,)", "()".
 * Returns the length it needed (like snprintf). */
ATTN_API int attn_shape_format(char *buf, size_t size, int ndim, const int64_t *shape);

/* The numpy broadcast of two shapes (right-aligned, each axis equal or 1).
 * On success *out_ndim = max(ndim_a, ndim_b) and out_shape holds the result. */
ATTN_API int attn_broadcast_shape(attn_ctx *ctx, int ndim_a, const int64_t *shape_a, int ndim_b,
                         const int64_t *shape_b, int *out_ndim, int64_t *out_shape);

/* ------------------------------------------------------------------------------
 * Masks (boolean, true = may attend)
 * ---------------------------------------------------------------------------- */

/* Padding mask from token ids [B, T] (int64 or int32): mask [B, 1, 1, T] (bool) is
 * false where the KEY is the pad token. A pad query still attends.
 * Aliasing: mask must not overlap token_ids (refused, naming both). */
ATTN_API int attn_mask_padding(attn_ctx *ctx, const attn_tensor *token_ids, int64_t pad_id,
                      attn_tensor *mask);

/* Causal mask [1, 1, T, T] (bool): entry (i, j) is true when j <= i, so position t
 * sees positions 0..t. */
ATTN_API int attn_mask_causal(attn_ctx *ctx, int64_t T, attn_tensor *mask);

/* out = a AND b, broadcast by numpy's rule; out's shape must be the broadcast
 * shape (e.g. [B,1,1,T] and [1,1,T,T] give [B,1,T,T]).
 * Aliasing: out may be a or b itself (the same view, in place); an out that
 * overlaps a or b otherwise is refused (INVALID_ARGUMENT, naming both). */
ATTN_API int attn_mask_and(attn_ctx *ctx, const attn_tensor *a, const attn_tensor *b,
                  attn_tensor *out);

/* Checks that `mask` (bool) broadcasts to [B, H, Tq, Tk]; the message names both
 * shapes, e.g. "mask shape (5, 5) does not broadcast to (2, 1, 3, 3)". */
ATTN_API int attn_mask_check(attn_ctx *ctx, const attn_tensor *mask, int64_t B, int64_t H,
                    int64_t Tq, int64_t Tk);

/* ------------------------------------------------------------------------------
 * Linear projection (nn.Linear)
 * ---------------------------------------------------------------------------- */

/* y = x W^T + b.  x [..., in], W [out, in], b [out] or NULL, y [..., out].
 * The leading axes of x and y (up to three) must match. All float32; any strides.
 * The GEMM packs W into panels first, in scratch taken as attn_ctx says (see
 * attn_linear_workspace_size); with ATTN_ARCH_REF it reads W in place.
 * Aliasing: y must not overlap x, W or b (each y element needs a whole row of x and
 * of W); such a call is refused, naming both. */
ATTN_API int attn_linear(attn_ctx *ctx, const attn_tensor *x, const attn_tensor *W,
                const attn_tensor *b, attn_tensor *y);

/* The scratch attn_linear needs for these arguments under ctx (its arch), in
 * bytes: W packed for the GEMM, or 0 on ATTN_ARCH_REF. Checks the arguments as
 * attn_linear does; *bytes is 0 on failure. */
ATTN_API int attn_linear_workspace_size(attn_ctx *ctx, const attn_tensor *x, const attn_tensor *W,
                               const attn_tensor *b, const attn_tensor *y, size_t *bytes);

/* A linear weight packed once into the GEMM's panel layout for one instruction
 * set (opaque; made by attn_linear_pack, freed by attn_linear_packed_free). It
 * holds a copy of W and b: the caller's tensors may change or go away after
 * packing. */
typedef struct attn_linear_packed attn_linear_packed;

/* Packs W [out, in] and b [out] (or NULL: zeros) for attn_arch_selected(ctx), in
 * one allocation with ctx's allocator. On success *out must be freed with
 * attn_linear_packed_free(); on failure *out is NULL. */
ATTN_API int attn_linear_pack(attn_ctx *ctx, const attn_tensor *W, const attn_tensor *b,
                     attn_linear_packed **out);
/* Frees a packed weight with the allocator that packed it (ctx is not used and
 * may be NULL). NULL-safe. */
ATTN_API void attn_linear_packed_free(attn_ctx *ctx, attn_linear_packed *pw);

/* attn_linear with a packed weight: x [..., in], y [..., out] (float32, any
 * strides; leading axes equal). It needs no scratch and allocates nothing, and
 * gives the same bits as attn_linear with the weight it was packed from. The
 * call's arch (attn_arch_selected(ctx)) must be the one the weight was packed
 * for: otherwise it fails with INVALID_ARGUMENT and a message naming both (pack
 * the weight again under that arch). Aliasing: y must not overlap x (refused). */
ATTN_API int attn_linear_forward_packed(attn_ctx *ctx, const attn_tensor *x,
                               const attn_linear_packed *pw, attn_tensor *y);

/* ------------------------------------------------------------------------------
 * Scaled dot-product attention
 *
 *   scores  = q k^T * scale            [B, H, Tq, Tk]   scale = 1/sqrt(D) by default
 *   masked scores become -inf          (where the mask is false)
 *   weights = softmax(scores, axis=-1) [B, H, Tq, Tk]
 *   out     = weights v                [B, H, Tq, Dv]
 *
 * The options of current models (all optional, combinable with each other and with
 * the masks, on every kernel and instruction set) enter each score in this order:
 *
 *   s = scale * q.k  ->  softcap: c * tanh(s / c)  ->  + bias  + alibi
 *     ->  hidden keys -inf (mask, causal, window, a bias of -inf)
 *     ->  softmax over the keys, with the sink in the denominator  ->  weights v
 *
 * Positions: query i sits at key position i' = i + Tk - Tq (the bottom-right
 * alignment of a query block at the end of the keys); with Tq == Tk, i' = i.
 * ---------------------------------------------------------------------------- */

/* What to do with a query row whose keys are all masked. */
typedef enum attn_empty_rows {
    ATTN_EMPTY_ROWS_ERROR = 0, /* fail with ATTN_STATUS_EMPTY_ROW (default) */
    ATTN_EMPTY_ROWS_ZERO = 1   /* zero output and zero weights for that row */
} attn_empty_rows;

/* The causal mask's alignment, for any Tq and Tk. */
typedef enum attn_causal {
    ATTN_CAUSAL_NONE = 0,
    ATTN_CAUSAL_TOP_LEFT = 1,    /* query i sees keys j <= i (the chapter's; PyTorch's
                                    is_causal) */
    ATTN_CAUSAL_BOTTOM_RIGHT = 2 /* query i sees keys j <= i + Tk - Tq (a query block
                                    at the end of a cache; FlashAttention >= 2.1) */
} attn_causal;

/* The parameters of one attention call. Fill with attn_sdpa_params_init(), or
 * zero it: every field's zero value means "off" (and a NULL tensor "none"). */
typedef struct attn_sdpa_params {
    const attn_tensor *mask;    /* bool, broadcasts to [B, H, Tq, Tk]; NULL = none */
    int causal;                 /* an attn_causal value (1, any nonzero-true value of
                                   older code, is TOP_LEFT) */
    int has_scale;              /* nonzero: use `scale` instead of 1/sqrt(D) */
    float scale;
    attn_empty_rows empty_rows; /* ATTN_EMPTY_ROWS_ERROR by default */

    /* Sliding window (FlashAttention's convention): with has_window set, key j is
     * visible from query i iff i' - window_left <= j <= i' + window_right; -1
     * means unbounded on that side. The tutorial's sliding_window_causal_mask(T, w)
     * is (w - 1, 0). */
    int has_window;
    int64_t window_left, window_right;
    /* Logit softcap c > 0 (Gemma 2): s = c * tanh(s / c). 0 = off. */
    float softcap;
    /* ALiBi: adds -slope_h * |i' - j| to query head h's scores. On when `alibi` is
     * nonzero or alibi_slopes is given; alibi_slopes [H] float32, or NULL for the
     * ALiBi paper's slopes (2^(-8k/H), k = 1..H, for H a power of two, and its
     * interleaving rule otherwise; attn_alibi_slopes gives them). */
    int alibi;
    const attn_tensor *alibi_slopes;
    /* Additive float32 bias that broadcasts to [B, H, Tq, Tk] (PyTorch's float
     * attn_mask); -inf in it hides a key as a mask does. NULL = none. */
    const attn_tensor *bias;
    /* Sinks [H] float32 (gpt-oss): one logit per query head in each row's softmax
     * denominator, with no value: w_ij = exp(s_ij - m) / (exp(sink_h - m) +
     * sum_j exp(s_ij - m)). A row whose keys are all hidden then gives zero output
     * and zero weights, never an error. NULL = none. */
    const attn_tensor *sinks;
    /* Output: the log-sum-exp of each row's final scores [B, H, Tq] float32,
     * log(sum_j exp(s_ij) [+ exp(sink_h)]); for a row with every key hidden,
     * sink_h with sinks and -inf without (zero mode). NULL = not wanted. */
    attn_tensor *lse;
} attn_sdpa_params;

/* Fills p with the defaults: no mask, not causal, scale 1/sqrt(D), empty rows are
 * an error, and every option above off. */
ATTN_API void attn_sdpa_params_init(attn_sdpa_params *p);

/* The ALiBi paper's default slopes for num_heads heads, into slopes [num_heads]:
 * 2^(-8k/n) for k = 1..n when n is a power of two; otherwise those of the largest
 * power of two m below n, followed by every other slope of 2m heads (k = 1, 3,
 * 5, ...) until n are given. Computed in double, rounded to float. */
ATTN_API int attn_alibi_slopes(attn_ctx *ctx, int64_t num_heads, float *slopes);

/* Scaled dot-product attention with the kernel ctx->impl selects.
 *   q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv]  (float32, any strides)
 *   out [B, H, Tq, Dv]; weights [B, H, Tq, Tk] or NULL when not wanted.
 * Grouped-query attention: k and v may have fewer heads than q (Hkv dividing H;
 * Hkv = 1 is multi-query attention); query head h reads key/value head
 * h / (H / Hkv), in place - no repeated k or v is ever built.
 * Tensors with fewer than 4 dims are read as if they had leading sizes of 1.
 * Half precision (SPEC section 10): q, k, v and out may instead all be bfloat16
 * (ATTN_DTYPE_BF16) or all float16 (ATTN_DTYPE_F16); every product and sum is
 * then still float32, out is rounded once to nearest even, and weights, lse, bias,
 * sinks and slopes stay float32. Any other mix (a 16-bit q with a float32 k, bf16
 * with f16, ...) is a DTYPE error naming every dtype.
 * p may be NULL for the defaults.
 * Aliasing: out may be q itself (the same view, D == Dv: each query row is read
 * before its output is written); no other output (out, weights, p->lse) may share
 * memory with any argument. */
ATTN_API int attn_sdpa(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
              const attn_tensor *v, const attn_sdpa_params *p, attn_tensor *out,
              attn_tensor *weights);

/* The scratch attn_sdpa needs for these arguments under ctx (its threads, impl
 * and arch), in bytes: hand in at least that much as ctx->workspace and the call
 * allocates nothing. Checks the arguments as attn_sdpa does; *bytes is 0 on
 * failure. */
ATTN_API int attn_sdpa_workspace_size(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                             const attn_tensor *v, const attn_sdpa_params *p,
                             const attn_tensor *out, const attn_tensor *weights,
                             size_t *bytes);

/* The reference, in three visible steps (scores, masked softmax, weighted sum). Same
 * contract as attn_sdpa. It materialises one [Tq, Tk] score block per (b, h). */
ATTN_API int attn_sdpa_ref(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                  const attn_tensor *v, const attn_sdpa_params *p, attn_tensor *out,
                  attn_tensor *weights);

/* ------------------------------------------------------------------------------
 * Gradients of scaled dot-product attention (SPEC section 8)
 *
 * The backward pass of attn_sdpa with every option above: given the forward's
 * inputs, its output O and log-sum-exp L, and the gradient dO of a loss with
 * respect to O, the gradients of that loss with respect to q, k and v (and the
 * bias and the sinks when asked). Per (b, h), with S the final scores and P the
 * weights, recomputed from q, k and L (never stored by the forward):
 *
 *   P     = exp(S - L)                      [Tq, Tk]   (0 for a hidden key)
 *   dV   += P^T dO                          [Tk, Dv]
 *   dP    = dO V^T                          [Tq, Tk]
 *   Delta = rowsum(dO * O)                  [Tq]       (= rowsum(P * dP))
 *   dS    = P * (dP - Delta)                [Tq, Tk]
 *   dbias += dS;  dsink_h = -sum_i P_sink,i Delta_i    (P_sink,i = exp(sink_h - L_i))
 *   softcap: dS *= 1 - tanh^2(x / c), x = scale q.k before the cap
 *   dQ    = scale dS K,  dK += scale dS^T Q            [Tq, D], [Tk, D]
 *
 * ALiBi slopes are constants (no gradient). The meaning is PyTorch autograd's
 * through the forward: a hidden key gets exactly zero gradient from the rows that
 * cannot see it (its value is never read, so even a NaN in it stays out); a row
 * that sees no key (empty_rows = zero, or sinks) gives and gets zero gradient;
 * with GQA, dk and dv sum over the H / Hkv query heads that share a key/value
 * head; dbias has the bias's own shape, summed over the axes it was broadcast
 * along (those where it has size 1: a bias expanded with stride 0 on a full-size
 * axis gets each element's own gradient, as a contiguous copy would). A NaN in dO reaches exactly the gradients that depend on its row. Every
 * sum runs in a fixed order: the answer does not depend on ctx->threads or the
 * instruction set. docs/gradients.md derives the formulas and states the
 * tolerance a faster backward must meet.
 * ---------------------------------------------------------------------------- */

/* Where the backward writes. dq, dk and dv are required; dbias and dsinks are
 * NULL when not wanted (and may be given only with p->bias, p->sinks).
 *   dq [B, H, Tq, D], dk [B, Hkv, Tk, D], dv [B, Hkv, Tk, Dv]  (q's, k's, v's shape)
 *   dbias: the shape of p->bias exactly; dsinks [H]  (float32, any strides) */
typedef struct attn_sdpa_grads {
    attn_tensor *dq, *dk, *dv;
    attn_tensor *dbias;
    attn_tensor *dsinks;
} attn_sdpa_grads;

/* The backward of attn_sdpa. q, k, v and p are the forward's (p->lse must be
 * NULL: the forward's log-sum-exp is `lse`); out [B, H, Tq, Dv] is the forward's
 * output, lse [B, H, Tq] its log-sum-exp (p->lse of the forward call), dout
 * [B, H, Tq, Dv] the loss's gradient with respect to out. Every element of
 * grads' tensors is written (overwritten, not accumulated). Tensors with fewer
 * than 4 dims are read with leading sizes of 1, as in attn_sdpa.
 * It runs the kernel ctx->impl and the selected arch choose, as attn_sdpa does:
 * the fused backward (FlashAttention-2's tiling: the weights recomputed tile by
 * tile from lse, scratch O(B H Tq) plus O(tile) per thread, no [Tq, Tk] block),
 * which gives the reference's results within the bound docs/gradients.md states
 * and the same bits for any thread count; ATTN_IMPL_REF or ATTN_ARCH_REF runs
 * attn_sdpa_backward_ref. No gradient may share memory with an argument or with
 * another gradient (INVALID_ARGUMENT naming both). A query row that sees no key
 * is EMPTY_ROW unless p->empty_rows is zero or p has sinks, as in the forward. */
ATTN_API int attn_sdpa_backward(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                                const attn_tensor *v, const attn_sdpa_params *p,
                                const attn_tensor *out, const attn_tensor *lse,
                                const attn_tensor *dout, const attn_sdpa_grads *grads);

/* The reference backward in plain loops, the formulas above step by step
 * (src/attention/sdpa_ref_backward.c). Same contract as attn_sdpa_backward. It
 * keeps two [Tq, Tk] blocks (P and dS) and one [Tq] (Delta) as scratch. */
ATTN_API int attn_sdpa_backward_ref(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                                    const attn_tensor *v, const attn_sdpa_params *p,
                                    const attn_tensor *out, const attn_tensor *lse,
                                    const attn_tensor *dout, const attn_sdpa_grads *grads);

/* The scratch attn_sdpa_backward needs for these arguments under ctx, in bytes
 * (hand in at least that much as ctx->workspace and it allocates nothing). Checks
 * the arguments as attn_sdpa_backward does; *bytes is 0 on failure. */
ATTN_API int attn_sdpa_backward_workspace_size(attn_ctx *ctx, const attn_tensor *q,
                                               const attn_tensor *k, const attn_tensor *v,
                                               const attn_sdpa_params *p,
                                               const attn_tensor *out, const attn_tensor *lse,
                                               const attn_tensor *dout,
                                               const attn_sdpa_grads *grads, size_t *bytes);

/* ------------------------------------------------------------------------------
 * Multi-head self-attention (the chapter's module)
 *
 *   x [B, T, E] -> qkv = x W_qkv^T + b_qkv [B, T, 3E] -> q, k, v [B, T, E] each
 *   -> split heads [B, H, T, D] -> attention -> [B, H, T, D] -> merge [B, T, E]
 *   -> out = context W_o^T + b_o [B, T, E]
 * ---------------------------------------------------------------------------- */

typedef struct attn_mha_weights {
    attn_tensor w_qkv; /* [3E, E]: rows 0..E-1 make q, E..2E-1 k, 2E..3E-1 v */
    attn_tensor b_qkv; /* [3E] */
    attn_tensor w_o;   /* [E, E] */
    attn_tensor b_o;   /* [E] */
} attn_mha_weights;

/* Checks the four weight shapes against each other and against num_heads
 * (E % num_heads == 0). On success *embed_dim holds E (may be NULL). */
ATTN_API int attn_mha_weights_check(attn_ctx *ctx, const attn_mha_weights *w, int64_t num_heads,
                           int64_t *embed_dim);

/* Multi-head self-attention forward.
 *   x [B, T, E] (float32)   out [B, T, E]   weights [B, H, T, T] or NULL
 * p->mask broadcasts to [B, H, T, T] (e.g. a padding mask [B, 1, 1, T] AND a causal
 * mask, [B, 1, T, T]); p->causal adds the causal mask; p->has_scale overrides
 * 1/sqrt(D). The arguments are checked once. Its scratch (q, k, v, the context,
 * the attention's own, and W_qkv and W_o packed for the GEMM) is one block of
 * attn_mha_workspace_size bytes, taken as attn_ctx says: the caller's workspace,
 * the context's kept buffer, or one allocation freed before the call returns.
 * Aliasing: out may be x itself (the same view: x is read whole before out is
 * written); out, weights and p->lse must not overlap x otherwise, nor the weight
 * tensors, p's inputs or each other (refused, naming both). */
ATTN_API int attn_mha_forward(attn_ctx *ctx, const attn_mha_weights *w, int64_t num_heads,
                     const attn_tensor *x, const attn_sdpa_params *p, attn_tensor *out,
                     attn_tensor *weights);

/* The scratch attn_mha_forward needs for these arguments under ctx (its threads,
 * impl and arch), in bytes. Checks the arguments as attn_mha_forward does;
 * *bytes is 0 on failure. */
ATTN_API int attn_mha_workspace_size(attn_ctx *ctx, const attn_mha_weights *w, int64_t num_heads,
                            const attn_tensor *x, const attn_sdpa_params *p,
                            const attn_tensor *out, const attn_tensor *weights,
                            size_t *bytes);

/* Multi-head attention weights packed once for the GEMM of one instruction set:
 * W_qkv, b_qkv, W_o and b_o copied into its panel layout (opaque; made by
 * attn_mha_pack, freed by attn_mha_packed_free). The caller's weight tensors may
 * change or go away after packing. The type is opaque so that other weight
 * layouts pack into it too: attn_gqa_pack packs separate q/k/v projections with
 * fewer k/v heads, run through the same attn_mha_forward_packed. */
typedef struct attn_mha_packed attn_mha_packed;

/* Checks w as attn_mha_weights_check does (shapes, float32) and packs it for
 * attn_arch_selected(ctx), in one allocation with ctx's allocator. The head count
 * is given to each forward call. On success *out must be freed with
 * attn_mha_packed_free(); on failure *out is NULL. */
ATTN_API int attn_mha_pack(attn_ctx *ctx, const attn_mha_weights *w, attn_mha_packed **out);
/* Frees packed weights with the allocator that packed them (ctx is not used and
 * may be NULL). NULL-safe. */
ATTN_API void attn_mha_packed_free(attn_ctx *ctx, attn_mha_packed *pw);

/* attn_mha_forward with packed weights: same arguments, checks and results (the
 * same bits as attn_mha_forward with the weights they were packed from). Its
 * scratch, attn_mha_packed_workspace_size bytes (no packing: less than
 * attn_mha_forward's), is taken as attn_ctx says, so with a large enough
 * ctx->workspace, or keep_workspace set, a call after the first allocates
 * nothing. The call's arch (attn_arch_selected(ctx)) must be the one the weights
 * were packed for: otherwise it fails with INVALID_ARGUMENT and a message naming
 * both (pack them again under that arch). Weights from attn_gqa_pack run as
 * grouped-query attention with the head size and key/value heads they were packed
 * with; num_heads must then be the H they were packed for (otherwise
 * SHAPE_MISMATCH naming both). */
ATTN_API int attn_mha_forward_packed(attn_ctx *ctx, const attn_mha_packed *pw, int64_t num_heads,
                            const attn_tensor *x, const attn_sdpa_params *p, attn_tensor *out,
                            attn_tensor *weights);

struct attn_rope_params; /* defined in the RoPE section below */

/* attn_mha_forward_packed with RoPE (see "RoPE" below for attn_rope_params) on q
 * and k between the projections and the attention, as in Llama's attention block:
 *   q [B, H, T, D] and k [B, Hkv, T, D] are rotated in place in the scratch, row t
 *   at position rope->offset + t (keys at offset .. offset + T - 1, the queries
 *   at the same positions: Tq == Tk); v is not rotated.
 * rope NULL is attn_mha_forward_packed itself (the same bits). rope is checked as
 * attn_rope_apply checks it (pairing, base > 0 and finite, offset >= 0 and
 * offset + T - 1 within int64, D even: an odd D is SHAPE_MISMATCH naming it).
 * Everything else (arguments, checks, aliasing, results) is as for
 * attn_mha_forward_packed, and so is the scratch: the rotation needs none of its
 * own, so attn_mha_packed_workspace_size gives the bytes. */
ATTN_API int attn_mha_forward_packed_rope(attn_ctx *ctx, const attn_mha_packed *pw,
                                          int64_t num_heads, const attn_tensor *x,
                                          const attn_sdpa_params *p,
                                          const struct attn_rope_params *rope,
                                          attn_tensor *out, attn_tensor *weights);

/* The scratch attn_mha_forward_packed needs for these arguments under ctx, in
 * bytes. Checks the arguments as attn_mha_forward_packed does; *bytes is 0 on
 * failure. */
ATTN_API int attn_mha_packed_workspace_size(attn_ctx *ctx, const attn_mha_packed *pw,
                                   int64_t num_heads, const attn_tensor *x,
                                   const attn_sdpa_params *p, const attn_tensor *out,
                                   const attn_tensor *weights, size_t *bytes);

/* Gradients of the chapter's multi-head self-attention (attn_mha_forward below):
 * given x, the weights, p and dout [B, T, E], the gradient of a loss with respect
 * to out, the gradients with respect to x and to both projections' weights and
 * biases. With qkv, the context (merged) and its log-sum-exp recomputed from x
 * (the forward keeps nothing):
 *
 *   dmerged = dout W_o                    [B, T, E]
 *   dW_o    = dout^T merged               [E, E]     (summed over B and T)
 *   db_o    = column sums of dout         [E]
 *   dq, dk, dv = attn_sdpa_backward on the heads, written into dqkv [B, T, 3E]
 *   dx      = dqkv W_qkv                  [B, T, E]
 *   dW_qkv  = dqkv^T x                    [3E, E]
 *   db_qkv  = column sums of dqkv         [3E]
 *
 * Every field is required; every element is written (overwritten, not
 * accumulated). float32, any strides. */
typedef struct attn_mha_grads {
    attn_tensor *dx;     /* [B, T, E] */
    attn_tensor *dw_qkv; /* [3E, E] */
    attn_tensor *db_qkv; /* [3E] */
    attn_tensor *dw_o;   /* [E, E] */
    attn_tensor *db_o;   /* [E] */
} attn_mha_grads;

/* The backward of attn_mha_forward. w, num_heads, x and p are the forward's (p may
 * carry any option attn_sdpa takes except p->lse, which must be NULL: the
 * log-sum-exp is recomputed in the scratch); dout [B, T, E]. The products run
 * through the projection GEMM under ctx's arch and the sums over B and T run in a
 * fixed order, so the result has the same bits for any ctx->threads. Its scratch
 * (x and dout copied, qkv, the context, the log-sum-exp, their gradients, and the
 * attention's and the GEMM's own) is one block of attn_mha_backward_workspace_size
 * bytes taken as attn_ctx says: with a large enough ctx->workspace it allocates
 * nothing. No gradient may share memory with an argument or another gradient
 * (INVALID_ARGUMENT naming both). A query row that sees no key is EMPTY_ROW
 * unless p->empty_rows is zero or p has sinks, as in the forward. */
ATTN_API int attn_mha_backward(attn_ctx *ctx, const attn_mha_weights *w, int64_t num_heads,
                               const attn_tensor *x, const attn_sdpa_params *p,
                               const attn_tensor *dout, const attn_mha_grads *grads);

/* The scratch attn_mha_backward needs for these arguments under ctx, in bytes.
 * Checks the arguments as attn_mha_backward does; *bytes is 0 on failure. */
ATTN_API int attn_mha_backward_workspace_size(attn_ctx *ctx, const attn_mha_weights *w,
                                              int64_t num_heads, const attn_tensor *x,
                                              const attn_sdpa_params *p,
                                              const attn_tensor *dout,
                                              const attn_mha_grads *grads, size_t *bytes);

/* ------------------------------------------------------------------------------
 * Grouped-query attention with separate projections (Llama-style)
 *
 *   x [B, T, E] -> q = x W_q^T + b_q [B, T, H*D],  k = x W_k^T + b_k [B, T, Hkv*D],
 *                  v = x W_v^T + b_v [B, T, Hkv*D]
 *   -> split heads: q [B, H, T, D], k and v [B, Hkv, T, D]
 *   -> attention (query head h reads key/value head h / (H / Hkv))  [B, H, T, D]
 *   -> merge [B, T, H*D] -> out = merged W_o^T + b_o [B, T, E]
 *
 * H = Hkv is multi-head attention, Hkv = 1 multi-query attention. The head size D
 * comes from the weights (W_q has H*D rows) and need not be E / H. k and v are
 * never repeated: the attention reads each key/value head once per group of
 * query heads. attn_gqa_pack packs the weights into an attn_mha_packed that
 * attn_mha_forward_packed runs like the chapter's.
 * ---------------------------------------------------------------------------- */

/* The four projections, nn.Linear's layout [out_features, in_features]. Every
 * bias is optional: a bias tensor whose data is NULL means none (a Linear with
 * bias=False, as in Llama). */
typedef struct attn_gqa_weights {
    attn_tensor w_q; /* [H*D, E] */
    attn_tensor w_k; /* [Hkv*D, E] */
    attn_tensor w_v; /* [Hkv*D, E] */
    attn_tensor w_o; /* [E, H*D] */
    attn_tensor b_q; /* [H*D] or data NULL */
    attn_tensor b_k; /* [Hkv*D] or data NULL */
    attn_tensor b_v; /* [Hkv*D] or data NULL */
    attn_tensor b_o; /* [E] or data NULL */
} attn_gqa_weights;

/* Checks the weight shapes against each other and against the head counts:
 * num_heads H >= 1 and num_kv_heads Hkv >= 1, H a multiple of Hkv, W_q's rows a
 * multiple of H (D = rows / H), W_k and W_v [Hkv*D, E], W_o [E, H*D], the biases
 * (when given) of their projection's rows; float32. A mismatch is
 * SHAPE_MISMATCH with a message naming the shapes. On success *embed_dim holds E
 * and *head_dim D (either may be NULL). */
ATTN_API int attn_gqa_weights_check(attn_ctx *ctx, const attn_gqa_weights *w,
                                    int64_t num_heads, int64_t num_kv_heads,
                                    int64_t *embed_dim, int64_t *head_dim);

/* Grouped-query self-attention forward.
 *   x [B, T, E] (float32)   out [B, T, E]   weights [B, H, T, T] or NULL
 * p as for attn_mha_forward (masks broadcast to [B, H, T, T]; p->scale defaults
 * to 1/sqrt(D); every option of attn_sdpa_params; p->lse [B, H, T]). Scratch and
 * aliasing as for attn_mha_forward: one block of attn_gqa_workspace_size bytes
 * (q, k, v, the context, the attention's own and each weight packed in turn);
 * out may be x itself and nothing else may overlap. */
ATTN_API int attn_gqa_forward(attn_ctx *ctx, const attn_gqa_weights *w, int64_t num_heads,
                              int64_t num_kv_heads, const attn_tensor *x,
                              const attn_sdpa_params *p, attn_tensor *out,
                              attn_tensor *weights);

/* The scratch attn_gqa_forward needs for these arguments under ctx, in bytes.
 * Checks the arguments as attn_gqa_forward does; *bytes is 0 on failure. */
ATTN_API int attn_gqa_workspace_size(attn_ctx *ctx, const attn_gqa_weights *w,
                                     int64_t num_heads, int64_t num_kv_heads,
                                     const attn_tensor *x, const attn_sdpa_params *p,
                                     const attn_tensor *out, const attn_tensor *weights,
                                     size_t *bytes);

/* Checks w as attn_gqa_weights_check does and packs it for attn_arch_selected(ctx):
 * W_q, W_k and W_v as one projection of H*D + 2*Hkv*D outputs, and W_o. The
 * packed weights remember D and Hkv: attn_mha_forward_packed (and its workspace
 * size) must then be called with num_heads = H, and gives the same bits as
 * attn_gqa_forward. On success *out must be freed with attn_mha_packed_free(); on
 * failure *out is NULL. */
ATTN_API int attn_gqa_pack(attn_ctx *ctx, const attn_gqa_weights *w, int64_t num_heads,
                           int64_t num_kv_heads, attn_mha_packed **out);

/* Gradients of grouped-query attention (attn_gqa_forward, with RoPE or without):
 * given x, the weights, p, the RoPE parameters and dout [B, T, E], the gradient of a
 * loss with respect to out, the gradients with respect to x and to every
 * projection's weight and bias. With q, k, v (rotated), the context (merged) and
 * its log-sum-exp recomputed from x (the forward keeps nothing):
 *
 *   dmerged = dout W_o                         [B, T, H*D]
 *   dW_o    = dout^T merged                    [E, H*D]    (summed over B and T)
 *   db_o    = column sums of dout              [E]
 *   dq, dk, dv = attn_sdpa_backward on the heads; dk and dv [B, Hkv, T, D] are
 *                summed over the H / Hkv query heads of each group
 *   with RoPE: dq and dk turned back by attn_rope_backward (the inverse rotation)
 *   dx      = dq W_q + dk W_k + dv W_v         [B, T, E]
 *   dW_q    = dq^T x   [H*D, E];   dW_k, dW_v = dk^T x, dv^T x   [Hkv*D, E]
 *   db_q, db_k, db_v = column sums of dq, dk, dv
 *
 * dx and the four weight gradients are required; each bias gradient may be NULL
 * (not computed). A bias gradient does not depend on the bias, so it may be asked
 * for when the weights have no bias (their data NULL). Every element of a given
 * gradient is written (overwritten, not accumulated). float32, any strides. */
typedef struct attn_gqa_grads {
    attn_tensor *dx;   /* [B, T, E] */
    attn_tensor *dw_q; /* [H*D, E] */
    attn_tensor *dw_k; /* [Hkv*D, E] */
    attn_tensor *dw_v; /* [Hkv*D, E] */
    attn_tensor *dw_o; /* [E, H*D] */
    attn_tensor *db_q; /* [H*D] or NULL */
    attn_tensor *db_k; /* [Hkv*D] or NULL */
    attn_tensor *db_v; /* [Hkv*D] or NULL */
    attn_tensor *db_o; /* [E] or NULL */
} attn_gqa_grads;

/* The backward of attn_gqa_forward (rope NULL) and of attn_mha_forward_packed_rope
 * on attn_gqa_pack's weights (rope given: q and k rotated at positions
 * rope->offset + t, checked as there). w, num_heads, num_kv_heads, x and p are the
 * forward's (p may carry any option attn_sdpa takes except p->lse, which must be
 * NULL: the log-sum-exp is recomputed in the scratch); dout [B, T, E].
 *
 * The chapter's module is the case H = Hkv with W_q, W_k and W_v the three row
 * blocks of W_qkv (views: rows 0..E-1, E..2E-1, 2E..3E-1, and the same blocks of
 * b_qkv): with views of dW_qkv and db_qkv as the gradients this gives
 * attn_mha_backward's results, with RoPE too.
 *
 * As in attn_mha_backward the products run through the projection GEMM under ctx's
 * arch, the sums over B and T in a fixed order, so the result has the same bits for
 * any ctx->threads; the scratch is one block of attn_gqa_backward_workspace_size
 * bytes taken as attn_ctx says (with a large enough ctx->workspace it allocates
 * nothing); no gradient may share memory with an argument or another gradient
 * (INVALID_ARGUMENT naming both); a query row that sees no key is EMPTY_ROW unless
 * p->empty_rows is zero or p has sinks. */
ATTN_API int attn_gqa_backward(attn_ctx *ctx, const attn_gqa_weights *w, int64_t num_heads,
                               int64_t num_kv_heads, const attn_tensor *x,
                               const attn_sdpa_params *p, const struct attn_rope_params *rope,
                               const attn_tensor *dout, const attn_gqa_grads *grads);

/* The scratch attn_gqa_backward needs for these arguments under ctx, in bytes.
 * Checks the arguments as attn_gqa_backward does; *bytes is 0 on failure. */
ATTN_API int attn_gqa_backward_workspace_size(attn_ctx *ctx, const attn_gqa_weights *w,
                                              int64_t num_heads, int64_t num_kv_heads,
                                              const attn_tensor *x, const attn_sdpa_params *p,
                                              const struct attn_rope_params *rope,
                                              const attn_tensor *dout,
                                              const attn_gqa_grads *grads, size_t *bytes);

/* ------------------------------------------------------------------------------
 * RoPE: rotary position embedding
 *
 * RoPE rotates pairs of features of a query or key row by an angle that grows with
 * the row's position: pair k of the row at position p turns by p * inv_freq[k],
 * inv_freq[k] = 1 / base^(2k / D). It is computed in float32 the way the
 * tutorial's chapter 21 (build_rope_cache) and PyTorch compute it:
 *
 *   e = (float)(2k) / (float)D;  inv_freq = 1.0f / powf(base, e);
 *   angle = (float)p * inv_freq;  c = cosf(angle), s = sinf(angle)
 *   x'[i0] = x[i0] * c - x[i1] * s;   x'[i1] = x[i0] * s + x[i1] * c
 *
 * so results equal PyTorch's to float32 rounding (its pow, cos and sin may differ
 * from the C library's in the last bit). The pairing says which features form
 * pair k = 0 .. D/2 - 1 (see docs/decoding.md for a worked example):
 * ---------------------------------------------------------------------------- */

typedef enum attn_rope_pairing {
    ATTN_ROPE_INTERLEAVED = 0, /* features 2k and 2k+1 (chapter 21's apply_rope, GPT-J) */
    ATTN_ROPE_HALF = 1         /* features k and k + D/2 (Llama, GPT-NeoX: rotate_half) */
} attn_rope_pairing;

typedef struct attn_rope_params {
    attn_rope_pairing pairing;
    float base;      /* a positive finite number; 10000 by attn_rope_params_init */
    int64_t offset;  /* the position of row 0 (>= 0): row t sits at offset + t */
} attn_rope_params;

/* Fills p with the defaults: interleaved pairing, base 10000, offset 0. */
ATTN_API void attn_rope_params_init(attn_rope_params *p);

/* RoPE on x [B, H, T, D] (float32, any strides; fewer dims read as leading sizes
 * of 1) into out of the same shape: row t of every (b, h) sits at position
 * p->offset + t. D must be even. p NULL: the defaults. Positions are converted
 * to float32 as PyTorch's float32 arange does (exact up to 2^24).
 * For a query block at the end of Tk keys whose first key sits at position P, the
 * queries' offset is P + Tk - Tq (the bottom-right alignment).
 * Aliasing: out may be x itself (the same view, in place); an out that overlaps
 * x otherwise is refused (INVALID_ARGUMENT, naming both). Allocates nothing. */
ATTN_API int attn_rope_apply(attn_ctx *ctx, const attn_rope_params *p, const attn_tensor *x,
                             attn_tensor *out);

/* RoPE's backward: given dy [B, H, T, D], the gradient of a loss with respect to
 * attn_rope_apply's out, the gradient with respect to its x, which is dy turned by
 * the opposite angles (a rotation's transpose is its inverse):
 *   dx[i0] = dy[i0] * c + dy[i1] * s;   dx[i1] = dy[i1] * c - dy[i0] * s
 * with c, s computed as attn_rope_apply computes them. p, the shapes, the checks
 * and the aliasing (dx may be dy itself) are attn_rope_apply's. Allocates nothing. */
ATTN_API int attn_rope_backward(attn_ctx *ctx, const attn_rope_params *p, const attn_tensor *dy,
                                attn_tensor *dx);

/* ------------------------------------------------------------------------------
 * KV cache: the keys and values of earlier tokens, for decoding
 *
 * A cache holds, for B sequences, the keys [B, Hkv, capacity, D] and values
 * [B, Hkv, capacity, Dv] of up to `capacity` positions each (C-contiguous, stored
 * in the config's dtype: float32, or bfloat16 / float16 at half the bytes, SPEC
 * section 10), and one length per sequence: sequence b holds positions
 * 0 .. length(b) - 1.
 * Its memory is one block, allocated once at creation or handed in by the caller;
 * nothing after creation allocates except attend's scratch, which is taken as
 * attn_ctx says (ctx->workspace, or keep_workspace), so a decoding loop allocates
 * nothing per step. Calls name sequences by a range: `first` and the batch size
 * Bn of the tensor given (sequences first .. first + Bn - 1).
 * ---------------------------------------------------------------------------- */

typedef struct attn_kv_cache_config {
    int64_t batch;     /* B: sequences */
    int64_t kv_heads;  /* Hkv: key/value heads */
    int64_t capacity;  /* positions each sequence can hold */
    int64_t head_dim;  /* D: features of a key (and of a query) */
    int64_t value_dim; /* Dv: features of a value; 0 means D */
    attn_dtype dtype;  /* how K and V are stored: ATTN_DTYPE_F32 (0, so a zeroed
                          config is float32), ATTN_DTYPE_BF16 or ATTN_DTYPE_F16;
                          anything else is a DTYPE error. Every product and sum of
                          attend is float32 whatever the storage. */
} attn_kv_cache_config;

/* A cache (opaque). Made by attn_kv_cache_create, freed by attn_kv_cache_free. */
typedef struct attn_kv_cache attn_kv_cache;

/* The bytes a cache of this configuration needs (its bookkeeping, the lengths,
 * K and V in the config's dtype, and for a 16-bit cache one float32 [Hkv, D] row
 * block where RoPE turns the keys before they are rounded), for a caller that
 * hands in its own memory. */
ATTN_API int attn_kv_cache_bytes(attn_ctx *ctx, const attn_kv_cache_config *cfg, size_t *bytes);

/* Creates an empty cache (every length 0) in *out (NULL on failure). memory NULL:
 * one allocation with ctx's allocator. Otherwise the cache lives in `memory`, at
 * least attn_kv_cache_bytes bytes (memory_size says how many), 64-byte aligned,
 * which the library never frees; the caller keeps it alive while the cache is
 * used. The stored keys and values start zeroed. */
ATTN_API int attn_kv_cache_create(attn_ctx *ctx, const attn_kv_cache_config *cfg, void *memory,
                                  size_t memory_size, attn_kv_cache **out);

/* Frees a cache with the allocator that created it (ctx is not used and may be
 * NULL); a cache in caller memory frees nothing. NULL-safe. */
ATTN_API void attn_kv_cache_free(attn_ctx *ctx, attn_kv_cache *cache);

/* The number of positions sequence `seq` holds, or -1 when cache is NULL or seq
 * is not in 0 .. B - 1. */
ATTN_API int64_t attn_kv_cache_length(const attn_kv_cache *cache, int64_t seq);

/* Appends k [Bn, Hkv, Tnew, D] and v [Bn, Hkv, Tnew, Dv] (any strides) to
 * sequences first .. first + Bn - 1: row t of k[i] goes to position
 * length(first + i) + t. k and v are each float32 or the cache's dtype: float32
 * into a 16-bit cache is rounded once to nearest even; the cache's own dtype is
 * copied bit for bit (anything else: DTYPE). With rope (not NULL), the keys are
 * rotated at those positions as they are stored (rope->offset is not used: the
 * cache knows each sequence's positions); into a 16-bit cache the rotation is
 * computed in float32 (from k widened, when k is 16-bit) and rounded once. A
 * sequence without room for Tnew more positions fails the whole call with
 * INVALID_ARGUMENT, naming the sequence, its length, Tnew and the capacity, and
 * appends nothing to any sequence. k and v must not overlap the cache's memory
 * (refused). Allocates nothing. */
ATTN_API int attn_kv_cache_append(attn_ctx *ctx, attn_kv_cache *cache, int64_t first,
                                  const attn_tensor *k, const attn_tensor *v,
                                  const attn_rope_params *rope);

/* Rolls sequence seq back to `length` positions (0 <= length <= its length; the
 * positions past it are forgotten and will be overwritten); seq -1 rolls back
 * every sequence to min(length, its length). */
ATTN_API int attn_kv_cache_truncate(attn_ctx *ctx, attn_kv_cache *cache, int64_t seq,
                                    int64_t length);

/* Views of what sequence seq holds: k [1, Hkv, length(seq), D] and v [1, Hkv,
 * length(seq), Dv], views in the cache's dtype into the cache (strides of the
 * [B, Hkv, capacity, D] layout; no copy), valid until the cache is freed; an
 * append or a truncate changes what they see. Either may be NULL. An empty
 * sequence has no view: INVALID_ARGUMENT. */
ATTN_API int attn_kv_cache_view(attn_ctx *ctx, const attn_kv_cache *cache, int64_t seq,
                                attn_tensor *k, attn_tensor *v);

/* Attention of q [Bn, H, Tq, D] (any strides; H a multiple of Hkv) against
 * sequences first .. first + Bn - 1, each with its own Tk = length(first + i):
 * the queries are the last Tq positions of each sequence (append their keys
 * first; Tq above a sequence's length is refused), so the causal mask is always
 * the bottom-right one (p->causal may be NONE or BOTTOM_RIGHT; TOP_LEFT is
 * refused). Every other option of attn_sdpa_params applies as attn_sdpa
 * defines it, with positions counted from the sequence's start (a window sees
 * the last keys of the sequence); p->mask and p->bias broadcast to
 * [Bn, H, Tq, capacity] (key axis = cache position; each sequence reads its
 * first length entries), p->lse is [Bn, H, Tq]. With rope (not NULL) the queries
 * are rotated at their positions first (into float32 scratch; q is not changed).
 *   out [Bn, H, Tq, Dv]; weights [Bn, H, Tq, capacity] or NULL (positions past a
 *   sequence's length get weight 0). With Bn > 1, out and lse have exactly these
 *   dims (a batch axis of Bn, not 1 or absent: SHAPE_MISMATCH).
 * Dtypes: weights, bias and lse are float32. q and out are float32, or, with a
 * 16-bit cache, each may also be the cache's dtype: out's dtype decides what is
 * written (rounded once to nearest even when 16-bit); a float32 q is used as it
 * is, not rounded; every product and sum is float32. A 16-bit q against a float32
 * cache, or another mix, is a DTYPE error naming the dtypes.
 * Each sequence runs as one attention call (the kernel ctx->impl selects); with
 * several sequences and no weights, the fused kernel runs all their work as one
 * parallel job (docs/decoding.md, split-key decoding; a 16-bit cache runs its
 * sequences one after another, each call parallel in itself). Its scratch,
 * attn_kv_cache_workspace_size bytes, is taken once as attn_ctx says.
 * Aliasing: outputs must not overlap q, the cache or each other (refused). */
ATTN_API int attn_kv_cache_attend(attn_ctx *ctx, const attn_kv_cache *cache, int64_t first,
                                  const attn_tensor *q, const attn_sdpa_params *p,
                                  const attn_rope_params *rope, attn_tensor *out,
                                  attn_tensor *weights);

/* The scratch attn_kv_cache_attend needs for these arguments under ctx, in bytes:
 * planned for a full cache as well as for the current lengths (the larger is
 * taken), so that a ctx->workspace of that size serves the later steps of a
 * decoding loop with the same shapes as the keys grow. Checks the arguments as
 * attend does; *bytes is 0 on failure. */
ATTN_API int attn_kv_cache_workspace_size(attn_ctx *ctx, const attn_kv_cache *cache,
                                          int64_t first, const attn_tensor *q,
                                          const attn_sdpa_params *p,
                                          const attn_rope_params *rope,
                                          const attn_tensor *out, const attn_tensor *weights,
                                          size_t *bytes);

/* ------------------------------------------------------------------------------
 * Random numbers (for the chapter's experiment and for tests)
 * ---------------------------------------------------------------------------- */

/* PyTorch's CPU generator draw for draw: with the same seed, attn_rng_randn equals
 * torch.randn and attn_rng_uniform equals Tensor.uniform_ (see src/core/rng.c for the
 * details followed and where they come from). torch's float kernels round the last
 * bit differently in its AVX2/AVX-512 build (the default on x86-64 CPUs with AVX2)
 * and in its baseline build (ATEN_CPU_CAPABILITY=default, CPUs without AVX2); the
 * flavor picks which one to equal. */
typedef enum attn_rng_flavor {
    ATTN_RNG_TORCH_AVX2 = 0,   /* torch's AVX2/AVX-512 kernels (set by attn_rng_seed) */
    ATTN_RNG_TORCH_DEFAULT = 1 /* torch's baseline kernels (C library log/sin/cos) */
} attn_rng_flavor;

/* A Mersenne Twister (MT19937) generator, seeded as torch.manual_seed seeds it. */
typedef struct attn_rng {
    uint32_t state[624];
    int index;             /* next word of state; 624 = regenerate first */
    int has_next_normal;   /* a cached second Box-Muller value (double) */
    double next_normal;
    attn_rng_flavor flavor;
} attn_rng;

/* The random number functions draw nothing (and return 0, or NaN for
 * attn_rng_normal_f64) when given a NULL generator or buffer, sizes below 1, or
 * sizes whose product overflows; an unseeded or corrupted index is re-twisted. */

/* torch.manual_seed(seed): MT19937 from the low 32 bits of seed, no cached normal,
 * flavor ATTN_RNG_TORCH_AVX2 (change the field afterwards to pick the other). */
ATTN_API void attn_rng_seed(attn_rng *rng, uint64_t seed);
/* One 32-bit output (torch's random()). */
ATTN_API uint32_t attn_rng_u32(attn_rng *rng);
/* Two outputs, the first in the high half (torch's random64()). */
ATTN_API uint64_t attn_rng_u64(attn_rng *rng);
/* One N(0, 1) double as at::normal_distribution<double> draws it (Box-Muller with a
 * cached second value). */
ATTN_API double attn_rng_normal_f64(attn_rng *rng);
/* Fills n floats with N(0, 1) draws: torch.randn(n) (any shape with n elements). */
ATTN_API void attn_rng_randn(attn_rng *rng, float *out, int64_t n);
/* Fills n floats with uniform draws in [lo, hi): Tensor.uniform_(lo, hi) with the
 * bounds already rounded to float. */
ATTN_API void attn_rng_uniform(attn_rng *rng, float *out, int64_t n, float lo, float hi);
/* nn.Linear(in_features, out_features)'s default initialisation: weight
 * [out_features, in_features] from kaiming_uniform_(a=sqrt(5)), i.e. uniform in
 * +-1/sqrt(in_features), then bias [out_features] (may be NULL to skip it) uniform
 * in +-1/sqrt(in_features). */
ATTN_API void attn_rng_linear_init(attn_rng *rng, float *weight, float *bias, int64_t out_features,
                          int64_t in_features);

/* ------------------------------------------------------------------------------
 * Files: .npy arrays, .safetensors named tensors, attention weights
 *
 * Every loader checks the file against its own header before it trusts a size: a
 * truncated file, a header that lies about sizes, offsets out of range, overlapping
 * tensors, an unknown dtype or a shape whose product overflows is refused with
 * ATTN_STATUS_FORMAT (or DTYPE / IO) and a message "PATH: problem". Every writer
 * is an output set (below): attn_npy_save and attn_safetensors_save are sets of one
 * file, so an output file is written whole or not at all.
 * ---------------------------------------------------------------------------- */

/* An array that owns its memory: what the loaders return. `tensor` is C-contiguous
 * and its data points into `buffer`. Free with attn_array_free(). */
typedef struct attn_array {
    attn_tensor tensor;
    void *buffer; /* allocated with the ctx's allocator */
    /* The element type as the file stored it, in numpy's words ("float32",
     * "float64", "float16", "bfloat16", "int32", "int64", "bool", "uint8"), for
     * messages about the file: a uint8 file loads as ATTN_DTYPE_BOOL (tensor.dtype
     * is what is in memory), and is still called "uint8" here. A static string;
     * NULL when the array was not loaded from a file. */
    const char *file_dtype;
} attn_array;

/* Frees the buffer (with the same ctx that loaded it) and clears a. NULL-safe. */
ATTN_API void attn_array_free(attn_ctx *ctx, attn_array *a);

/* Loads a .npy file (format versions 1.0, 2.0 and 3.0; any other, 1.1 included, is
 * refused as numpy refuses it), 1 to 4 dimensions, each size >= 1, C or Fortran
 * order (a Fortran-order file is reordered to C order). Element types:
 *   float32, float64, float16 -> ATTN_DTYPE_F32 (float64 rounds to nearest)
 *   int32 -> ATTN_DTYPE_I32, int64 -> ATTN_DTYPE_I64
 *   bool, uint8 -> ATTN_DTYPE_BOOL (bytes kept as they are: nonzero = true)
 * Little- or big-endian. Anything else fails with ATTN_STATUS_DTYPE. uint8 loads as
 * bool because attn uses it for masks (a decision: attn has no uint8 dtype); out->
 * file_dtype still says "uint8", so a message about the file (e.g. uint8 given
 * where token ids are expected) can name what the file holds. The header is read
 * as numpy reads it, with two stated differences: sizes must be plain decimal
 * (numpy, evaluating Python, also takes 0x2 or 2_0) and a key given twice is
 * refused (Python keeps the last). */
ATTN_API int attn_npy_load(attn_ctx *ctx, const char *path, attn_array *out);

/* Flags of the loaders below. ATTN_LOAD_HALF: a float16 array (.npy '<f2',
 * safetensors F16) loads as ATTN_DTYPE_F16 and a safetensors BF16 one as
 * ATTN_DTYPE_BF16, bit for bit, instead of being widened to float32. */
#define ATTN_LOAD_HALF 1u
/* attn_npy_load with flags (0 or ATTN_LOAD_HALF; others INVALID_ARGUMENT). */
ATTN_API int attn_npy_load_flags(attn_ctx *ctx, const char *path, unsigned flags,
                                 attn_array *out);

/* Saves t (float32, int32, int64, bool or float16; any strides) as a little-endian,
 * C-order .npy file, format version 1 (version 2 only when the header needs it). A
 * bfloat16 tensor is saved as float32 (numpy has no bfloat16; the values are
 * exact). */
ATTN_API int attn_npy_save(attn_ctx *ctx, const char *path, const attn_tensor *t);

/* An open .safetensors file: the header is parsed and checked at open time; tensor
 * data is read on demand by attn_safetensors_get. */
typedef struct attn_safetensors attn_safetensors;

/* Opens and checks a .safetensors file. On success *out must be closed with
 * attn_safetensors_close(). The header is accepted as Python's safetensors package
 * accepts it ("__metadata__" null or an object of strings; UTF-8; numbers without
 * leading zeros), except that a name given twice or holding a NUL character is
 * refused (Python keeps the last of two names; attn's names are C strings). */
ATTN_API int attn_safetensors_open(attn_ctx *ctx, const char *path, attn_safetensors **out);
/* Closes st and frees it with the allocator of the context that opened it (ctx is
 * not used and may be NULL or another context). */
ATTN_API void attn_safetensors_close(attn_ctx *ctx, attn_safetensors *st);

/* Number of tensors, and the name of tensor i (0 <= i < count), in the order of
 * their data in the file. */
ATTN_API int64_t attn_safetensors_count(const attn_safetensors *st);
ATTN_API const char *attn_safetensors_name(const attn_safetensors *st, int64_t i);
/* 1 if the file has a tensor of this name, else 0. */
ATTN_API int attn_safetensors_has(const attn_safetensors *st, const char *name);

/* Reads tensor `name` into an owned array. F32, F16, BF16, F64 -> float32; I32, I64
 * kept; BOOL, U8 -> bool (out->file_dtype says "uint8" for U8). Other dtypes fail
 * with ATTN_STATUS_DTYPE; a missing name with ATTN_STATUS_INVALID_ARGUMENT; a rank
 * of 0 or above ATTN_MAX_DIMS, or a size of 0, with ATTN_STATUS_UNSUPPORTED. */
ATTN_API int attn_safetensors_get(attn_ctx *ctx, const attn_safetensors *st, const char *name,
                         attn_array *out);
/* attn_safetensors_get with flags (0 or ATTN_LOAD_HALF: F16 and BF16 kept in 16
 * bits; other flags INVALID_ARGUMENT). */
ATTN_API int attn_safetensors_get_flags(attn_ctx *ctx, const attn_safetensors *st,
                                        const char *name, unsigned flags, attn_array *out);

/* Saves n named tensors (float32, int32, int64, bool, bfloat16 (BF16) or float16
 * (F16); any strides) as one .safetensors file, data in the order given. Names must be unique, non-empty, not
 * "__metadata__", and valid UTF-8 (Python's safetensors refuses a file whose header
 * is not); anything else fails with ATTN_STATUS_INVALID_ARGUMENT and writes nothing. */
ATTN_API int attn_safetensors_save(attn_ctx *ctx, const char *path, const char *const *names,
                          const attn_tensor *tensors, int64_t n);

/* Loads multi-head attention weights from a .safetensors file, by any of these name
 * sets under `prefix` (NULL or "" for none; e.g. "layers.0.attn."):
 *   the chapter's module: qkv.weight [3E,E], qkv.bias [3E], output.weight [E,E],
 *                         output.bias [E]
 *   nn.MultiheadAttention: in_proj_weight, in_proj_bias, out_proj.weight,
 *                         out_proj.bias (biases optional, as with bias=False)
 *   separate projections: q_proj.weight, k_proj.weight, v_proj.weight [E,E] and
 *                         o_proj.weight [E,E], each .bias [E] optional
 * Separate q/k/v are concatenated into w_qkv (q rows first); a missing bias becomes
 * zeros. The shapes are checked against each other and against num_heads
 * (E % num_heads == 0). When no set or more than one set is found, the message says
 * which names were looked for. w is filled with owned tensors: free them with
 * attn_weights_free(). */
ATTN_API int attn_weights_load(attn_ctx *ctx, const char *path, const char *prefix,
                      int64_t num_heads, attn_mha_weights *w);
/* Frees what attn_weights_load allocated (same ctx) and clears w. NULL-safe. */
ATTN_API void attn_weights_free(attn_ctx *ctx, attn_mha_weights *w);

/* Loads grouped-query attention weights from a .safetensors file: the separate
 * projections under `prefix` (NULL or "" for none; e.g. "model.layers.0.self_attn."):
 *   q_proj.weight [H*D, E], k_proj.weight [Hkv*D, E], v_proj.weight [Hkv*D, E],
 *   o_proj.weight [E, H*D], each .bias ([H*D], [Hkv*D], [Hkv*D], [E]) optional
 * (a missing bias stays data NULL: none). The shapes are checked as
 * attn_gqa_weights_check does, with messages naming the file and the tensor. A
 * file with only the fused name sets (qkv.weight, in_proj_weight) is refused with
 * a message that says so (attn_weights_load reads those). w is filled with owned
 * tensors: free them with attn_gqa_weights_free(). */
ATTN_API int attn_weights_load_gqa(attn_ctx *ctx, const char *path, const char *prefix,
                                   int64_t num_heads, int64_t num_kv_heads,
                                   attn_gqa_weights *w);
/* Frees what attn_weights_load_gqa allocated (same ctx) and clears w. NULL-safe. */
ATTN_API void attn_gqa_weights_free(attn_ctx *ctx, attn_gqa_weights *w);

/* ------------------------------------------------------------------------------
 * Output sets: several output files, written all or nothing
 *
 * A run that writes several files (an output and its attention weights, a dump of
 * every array) adds each to one set and commits the set. The guarantee:
 *
 *   - Regular files (new or existing) are written to a temporary file beside the
 *     target, "NAME.tmp.XXXXXXXXXXXX" (a random part; created with O_CREAT|O_EXCL,
 *     so nothing that exists is ever opened or followed; NAME is shortened when
 *     needed, so names up to NAME_MAX work), synced, and renamed over their targets
 *     only after EVERY output of the set is complete and synced. A failure before
 *     that point (a bad name, a full disk, no memory, a device that refuses the
 *     bytes) removes every temporary file and changes no target.
 *   - An existing file keeps its permission bits (a 0600 file stays 0600) and, when
 *     the process runs as root, its owner and group. A symbolic link to a regular
 *     file is written through (the file it names is replaced and the link stays),
 *     unless the link belongs to another user (other than root): that is refused,
 *     as is a link to nothing.
 *   - A character or block device, a FIFO, or "-" (standard output, file
 *     descriptor 1) is written directly, never replaced by a regular file: its
 *     bytes are held in memory and written at the commit, after the temporary
 *     files are synced and before any rename, with errors reported ("/dev/full:
 *     cannot write: No space left on device"). A FIFO's open waits for its reader.
 *     A device or FIFO that is standard output itself (/dev/stdout on a pipe) is
 *     written through descriptor 1 rather than reopened.
 *     Bytes a device accepted before a later failure cannot be taken back.
 *   - Two names for the same file (a hard or symbolic link, "./x" and "x", "-" and
 *     the file standard output is redirected to) are refused when the second is
 *     added, before anything is renamed (INVALID_ARGUMENT naming both).
 *   - The remaining window: the renames happen one after another. If one fails
 *     after an earlier one succeeded (the directory was removed or made read-only
 *     in that instant), the outputs renamed so far hold the new contents, the rest
 *     keep their old ones, no temporary file is left, and the call fails with a
 *     message naming the failed output and the ones already replaced.
 *   - Interrupted runs: every live temporary file is listed in a lock-free table;
 *     attn_output_remove_temporaries() unlinks them and is async-signal-safe, so a
 *     program's SIGINT/SIGTERM handler can call it (the attn programs do). A
 *     temporary file is not listed when more than 256 are live at once.
 *   - Threads: sets share no mutable state (the table above changes only by
 *     atomic compare-and-swap); threads may each use their own set and context.
 *
 * The set uses the allocator of the context it was created with; a set is used by
 * one thread at a time. After a failed add the set writes nothing: commit fails and
 * only attn_output_set_free is left. After commit (success or not) the set is spent.
 * ---------------------------------------------------------------------------- */

typedef struct attn_output_set attn_output_set;

/* A new, empty output set in *out (NULL on failure). Free it with
 * attn_output_set_free. */
ATTN_API int attn_output_set_create(attn_ctx *ctx, attn_output_set **out);

/* Adds a .npy file of t (float32, int32, int64 or bool; any strides; the format of
 * attn_npy_save) at path. The bytes are written now (to the temporary file, or to
 * memory for a device), so t may change or go away after the call. */
ATTN_API int attn_output_set_add_npy(attn_ctx *ctx, attn_output_set *set, const char *path,
                                     const attn_tensor *t);

/* Adds a .safetensors file of n named tensors (the format and rules of
 * attn_safetensors_save) at path. */
ATTN_API int attn_output_set_add_safetensors(attn_ctx *ctx, attn_output_set *set,
                                             const char *path, const char *const *names,
                                             const attn_tensor *tensors, int64_t n);

/* Adds a file holding the `size` bytes at data (an SVG, a text report). data may be
 * NULL when size is 0 (an empty file). */
ATTN_API int attn_output_set_add_bytes(attn_ctx *ctx, attn_output_set *set, const char *path,
                                       const void *data, size_t size);

/* Puts every output in place as described above. A program that printed to
 * stdout through stdio and has "-" in the set should fflush(stdout) first. */
ATTN_API int attn_output_set_commit(attn_ctx *ctx, attn_output_set *set);

/* Removes the temporary files of a set that was not committed, and frees it.
 * NULL-safe. */
ATTN_API void attn_output_set_free(attn_ctx *ctx, attn_output_set *set);

/* Unlinks every temporary file that an output set of this process has open now
 * (in a child of fork(), not those of the parent's sets, whose table the child
 * inherits). Async-signal-safe (only atomics, getpid and unlink): call it from a
 * SIGINT/SIGTERM handler, then end the process (for instance restore the default
 * action and raise the signal again). */
ATTN_API void attn_output_remove_temporaries(void);

/* ------------------------------------------------------------------------------
 * Fast paths: instruction-set dispatch, threads, the fused kernel by name
 *
 * The fused kernel and the GEMM come in three builds: portable C ("scalar"),
 * AVX2 + FMA + F16C ("avx2") and AVX-512 F + DQ + BW + VL ("avx512"). Two more paths
 * are the avx512 build with a bfloat16 attention kernel of their own: "avx512bf16"
 * (products by vdpbf16ps) and "amx" (products on AMX-BF16 tiles); float32 and
 * float16 calls run the avx512 build on them unchanged. Which one runs is decided
 * once per process from cpuid and xgetbv (the CPU has the instructions and the OS
 * saves their registers; AMX also needs Linux's permission for the tile data):
 * amx where the CPU has it, else avx512bf16 on AMD cores with AVX512-BF16 (Zen 4,
 * Zen 5: vdpbf16ps issues there as often as a 512-bit FMA), else avx512, avx2 or
 * scalar; on Intel avx512bf16 runs only when asked for (it measured slower than
 * avx512 there); the
 * environment variable ATTN_ARCH=ref|scalar|avx2|avx512|avx512bf16|amx|auto forces
 * a path for the whole process, and ctx->arch (when not AUTO) for calls made with
 * that context. "ref" makes attn_sdpa run the reference.
 * ---------------------------------------------------------------------------- */

/* "auto", "ref", "scalar", "avx2", "avx512", "avx512bf16", "amx" ("unknown"
 * otherwise). */
ATTN_API const char *attn_arch_name(attn_arch arch);
/* The inverse of attn_arch_name; INVALID_ARGUMENT for any other name. */
ATTN_API int attn_arch_parse(const char *name, attn_arch *arch);
/* 1 when this build and this CPU can run arch (AUTO, REF and SCALAR always can). */
ATTN_API int attn_arch_supported(attn_arch arch);
/* The fastest path this build and CPU can run, ignoring ATTN_ARCH. */
ATTN_API attn_arch attn_arch_best(void);
/* The path calls with ctx run (never AUTO): ctx->arch if set, else ATTN_ARCH if it
 * names a path the machine can run, else attn_arch_best(). ctx may be NULL. */
ATTN_API attn_arch attn_arch_selected(const attn_ctx *ctx);
/* One sentence saying why attn_arch_selected(ctx) is what it is, e.g.
 * "forced by ATTN_ARCH=avx2" or "auto: best path for this CPU (cpuid ...)".
 * The string is the library's (static); do not free it. */
ATTN_API const char *attn_arch_reason(const attn_ctx *ctx);

/* CPU features beyond the paths above, as attn_cpu_features reports them: each is
 * set only when cpuid lists it and the OS enables its register state (xgetbv; for
 * AMX also Linux's arch_prctl(ARCH_REQ_XCOMP_PERM) granting the tile data). attn
 * uses F16C for float16 conversion on the avx2 path, AVX512-BF16 on the avx512bf16
 * and amx paths and AMX-BF16 on the amx path; AVX512-FP16 is detected and reported
 * only (docs/half-precision.md). */
#define ATTN_CPU_F16C 1u        /* vcvtph2ps / vcvtps2ph on XMM/YMM */
#define ATTN_CPU_AVX512_BF16 2u /* vdpbf16ps, vcvtneps2bf16 */
#define ATTN_CPU_AVX512_FP16 4u /* float16 arithmetic on ZMM */
#define ATTN_CPU_AMX_BF16 8u    /* AMX tiles with bfloat16 products */
/* The ATTN_CPU_* bits of this CPU, decided once per process. */
ATTN_API unsigned attn_cpu_features(void);
/* The features as words, e.g. "f16c avx512-bf16:no avx512-fp16:no amx-bf16:no"
 * (static; do not free). */
ATTN_API const char *attn_cpu_features_string(void);

/* The cores this process may run on (at least 1): the online cores, or fewer
 * under a CPU affinity (taskset, a container's cpuset), as OpenMP counts them.
 * Counted once per process, at the first call that asks. */
ATTN_API int attn_threads_online(void);
/* The most threads a large call with ctx uses: ctx->threads, or
 * attn_threads_online() when that is 0 (or ctx is NULL). Small problems use fewer (one for the
 * chapter's sizes), and results never depend on the count. */
ATTN_API int attn_threads_resolve(const attn_ctx *ctx);

/* The fused online-softmax kernel (FlashAttention-style, no [Tq, Tk] scratch) by
 * name, whatever ctx->impl says. Same contract and checks as attn_sdpa. It uses
 * attn_arch_selected(ctx); "ref" there means its portable C build. */
ATTN_API int attn_sdpa_fused(attn_ctx *ctx, const attn_tensor *q, const attn_tensor *k,
                    const attn_tensor *v, const attn_sdpa_params *p, attn_tensor *out,
                    attn_tensor *weights);

#ifdef __cplusplus
}
#endif

#endif /* ATTN_H */
