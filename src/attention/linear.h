/*
 * linear.h - nn.Linear inside the library: the packed weight behind
 * attn_linear_packed, and the unchecked projection that attn_linear,
 * attn_linear_forward_packed and multi-head attention run after their one check.
 * Internal; names start with attn__.
 */
#ifndef ATTN_LINEAR_H
#define ATTN_LINEAR_H

#include "gemm.h"

/* What attn_linear_pack returns: the weight packed for one arch, in the same
 * allocation as this header (made with `allocator`, which also frees it). */
struct attn_linear_packed {
    attn_allocator allocator;
    attn__gemm_packed g;
};

/* Allocates `header` bytes (a struct that starts with the allocator that frees it)
 * followed by `data` bytes that start on a 64-byte boundary: the one allocation
 * behind a packed weight. Returns the header, and the data in *mem. */
void *attn__packed_alloc(attn_ctx *ctx, size_t header, size_t data, const char *what,
                         void **mem);
/* Frees what attn__packed_alloc returned, with the allocator stored at its start. */
void attn__packed_free(void *header);

/* The arch a packed weight runs on under ctx, or an INVALID_ARGUMENT that names
 * both when ctx's selected arch is not the one the weight was packed for. */
int attn__packed_arch_check(attn_ctx *ctx, attn_arch packed, const char *what);

/* y = x W^T + b on checked data: the reference loop when pw->arch is REF, the
 * GEMM otherwise. Allocates nothing. */
void attn__linear_run(attn_ctx *ctx, const attn__gemm_packed *pw, const float *x,
                      const attn__gemm_rows *xr, float *y, const attn__gemm_rows *yr);

#endif /* ATTN_LINEAR_H */
