/*
 * checks.h: the checks every entry point shares (see checks.c for the size
 * rule they enforce). Each records a message on ctx and returns its status.
 */
#ifndef FA_CHECKS_H
#define FA_CHECKS_H

#include "context.h"
#include "problem.h"

/* Copies a caller's versioned struct (struct_size first) into dst, which holds the
 * library's defaults: fields the caller's header lacked keep them; bytes of a newer
 * header must be zero. min_size: the fields every caller must have. */
fa_status fa_read_struct(fa_context *ctx, const char *name, const void *user, size_t user_size, void *dst,
                         size_t lib_size, size_t min_size);

/* The element count of t, or -1 when it overflows int64 (dims >= 0 assumed). */
int64_t fa_tensor_count(const fa_tensor *t);
/* dims >= 0; element count and byte extent in range. Empty tensors always pass. */
fa_status fa_check_tensor(fa_context *ctx, const char *name, const fa_tensor *t);
/* t as the core stores it: an axis of size 1 gets stride 0 and an empty tensor all
 * strides 0. Its elements are the same, and offsets computed from such an axis
 * (row 0 of a one-row tensor, the base of an empty view) can never overflow,
 * whatever the caller's stride there was: checks prove only the strides that are
 * used in range. */
fa_tensor fa_tensor_canonical(fa_tensor t);
/* A required tensor's data: NULL only where it has no elements. */
fa_status fa_check_data(fa_context *ctx, const char *name, const fa_tensor *t);
/* t's shape equals (d0, d1, d2, d3) wherever the wanted value is >= 0. */
fa_status fa_check_shape(fa_context *ctx, const char *name, const fa_tensor *t, int64_t d0, int64_t d1, int64_t d2,
                         int64_t d3);
/* bias and mask: each dim equals want[] or is 1 (then out gets stride 0 there). */
fa_status fa_check_broadcast(fa_context *ctx, const char *name, const fa_tensor *t, const int64_t want[4],
                             fa_tensor *out);
/* cu has n+1 entries, non-decreasing, within [0, len]. */
fa_status fa_check_cu(fa_context *ctx, const char *name, const int32_t *cu, int64_t n, int64_t len);
/* k and v given, of q's dtype, and well-formed tensors. */
fa_status fa_check_kv_inputs(fa_context *ctx, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v);
/* q's and k's head dims agree and are >= 1; Hq is a multiple of Hk. */
fa_status fa_check_heads(fa_context *ctx, int64_t D, int64_t kD, int64_t Hq, int64_t Hk);
/* An lse tensor of shape (B, H, S, 1), f32. */
fa_status fa_check_lse(fa_context *ctx, const fa_tensor *lse, int64_t B, int64_t H, int64_t S);
/* scale, softcap, causal, window, ALiBi and positions, into p (windows clamped). */
fa_status fa_check_scalars(fa_context *ctx, const fa_forward_args *a, fa_problem *p);
/* Once p holds Hq: the sinks (Hq floats, none +inf), into p. */
fa_status fa_check_sinks(fa_context *ctx, const fa_forward_args *a, fa_problem *p);
/* Once p holds B, Hq and the longest Sq, Sk: args->block_mask (docs/semantics.md,
 * "Block mask"), every count and index of it, into p->bm. */
fa_status fa_check_block_mask(fa_context *ctx, const fa_forward_args *a, fa_problem *p);
/* Once p holds its dims: positions within FA_POSITION_MAX and the work within int64. */
fa_status fa_check_extents(fa_context *ctx, const fa_problem *p);

#endif
