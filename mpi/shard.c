/*
 * shard.c: the shard and unshard helpers (plain memory copies to and from the rows
 * the core's ring planner places on a rank, fa_ring_placement), and the per-thread
 * error message.
 */
#include "ring_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char ring_error_text[512];

fa_status ring_fail(fa_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ring_error_text, sizeof ring_error_text, fmt, ap);
    va_end(ap);
    return st;
}

void ring_clear_error(void)
{
    ring_error_text[0] = '\0';
}

const char *fa_ring_error(void)
{
    return ring_error_text;
}

/* Local row i's global position for the P equal shards of s rows, by the core's
 * placement: the row's segment start plus its offset in it; -1 when the plan is
 * not one (an unknown sharding, an odd zig-zag shard, a rank outside the ring). */
static int64_t position_of(fa_ring_sharding sharding, int rank, int P, int64_t s, const int64_t *lengths, int64_t i)
{
    fa_ring_plan plan = FA_RING_PLAN_INIT;
    plan.nranks = P, plan.rank = rank, plan.lengths = lengths, plan.sharding = sharding;
    fa_ring_segment seg[2];
    int n = 0;
    if (i < 0 || i >= s || fa_ring_placement(NULL, &plan, rank, seg, &n) != FA_OK) return -1;
    for (int k = 0; k < n; k++)
        if (i >= seg[k].off && i < seg[k].off + seg[k].len) return seg[k].pos + (i - seg[k].off);
    return -1;
}

/* P copies of s: the lengths of equal shards (NULL when P is not a rank count or
 * there is no memory). */
static int64_t *equal_lengths(int P, int64_t s)
{
    if (P < 1) return NULL;
    int64_t *S = malloc(sizeof(int64_t) * (size_t)P);
    for (int x = 0; S && x < P; x++) S[x] = s;
    return S;
}

int64_t fa_ring_position(fa_ring_sharding sharding, int rank, int nranks, int64_t s_local, int64_t i)
{
    int64_t *S = equal_lengths(nranks, s_local);
    const int64_t pos = S ? position_of(sharding, rank, nranks, s_local, S, i) : -1;
    free(S);
    return pos;
}

/* Copies between a full tensor and a shard, one element of esize bytes at a time
 * (any strides); to_local picks the direction. */
static fa_status shard_copy(const fa_tensor *full, const fa_tensor *local, int axis, fa_ring_sharding sharding,
                            int rank, int P, int to_local)
{
    if (!full || !local) return ring_fail(FA_ERR_NULL_POINTER, "a tensor argument is NULL");
    if (axis < 0 || axis > 3) return ring_fail(FA_ERR_INVALID_ARGUMENT, "seq_axis %d is not 0..3", axis);
    if (P < 1 || rank < 0 || rank >= P) return ring_fail(FA_ERR_INVALID_ARGUMENT, "rank %d of %d", rank, P);
    if (sharding != FA_RING_CONTIGUOUS && sharding != FA_RING_ZIGZAG)
        return ring_fail(FA_ERR_INVALID_ARGUMENT, "unknown sharding %d", (int)sharding);
    if (full->dtype != local->dtype) return ring_fail(FA_ERR_DTYPE, "full and local dtypes differ");
    const size_t es = fa_dtype_size(full->dtype);
    if (es == 0) return ring_fail(FA_ERR_DTYPE, "unknown dtype %d", (int)full->dtype);
    for (int d = 0; d < 4; d++) {
        if (full->shape[d] < 0 || local->shape[d] < 0) return ring_fail(FA_ERR_INVALID_DIM, "a negative extent");
        if (d != axis && full->shape[d] != local->shape[d])
            return ring_fail(FA_ERR_SHAPE_MISMATCH, "extent %d differs: full %lld, local %lld", d,
                             (long long)full->shape[d], (long long)local->shape[d]);
    }
    const int64_t s = local->shape[axis];
    if (full->shape[axis] != s * P)
        return ring_fail(FA_ERR_SHAPE_MISMATCH, "full length %lld is not %d x the shard's %lld",
                         (long long)full->shape[axis], P, (long long)s);
    if (sharding == FA_RING_ZIGZAG && s % 2 != 0)
        return ring_fail(FA_ERR_SHAPE_MISMATCH, "zig-zag needs an even shard length, not %lld", (long long)s);
    int64_t count = 1;
    for (int d = 0; d < 4; d++) count *= local->shape[d];
    if (count == 0) return FA_OK;
    if (!full->data || !local->data) return ring_fail(FA_ERR_NULL_POINTER, "a tensor's data is NULL");
    int64_t *S = equal_lengths(P, s);
    if (!S) return ring_fail(FA_ERR_OUT_OF_MEMORY, "no memory for %d shard lengths", P);
    int64_t idx[4];
    for (idx[0] = 0; idx[0] < local->shape[0]; idx[0]++)
        for (idx[1] = 0; idx[1] < local->shape[1]; idx[1]++)
            for (idx[2] = 0; idx[2] < local->shape[2]; idx[2]++)
                for (idx[3] = 0; idx[3] < local->shape[3]; idx[3]++) {
                    int64_t lo = 0, fo = 0;
                    for (int d = 0; d < 4; d++) {
                        const int64_t fi = d == axis ? position_of(sharding, rank, P, s, S, idx[d]) : idx[d];
                        lo += idx[d] * local->stride[d];
                        fo += fi * full->stride[d];
                    }
                    char *l = (char *)local->data + lo * (int64_t)es, *f = (char *)full->data + fo * (int64_t)es;
                    if (to_local) memcpy(l, f, es);
                    else memcpy(f, l, es);
                }
    free(S);
    return FA_OK;
}

fa_status fa_ring_shard(const fa_tensor *full, const fa_tensor *local, int seq_axis, fa_ring_sharding sharding,
                        int rank, int nranks)
{
    ring_clear_error();
    return shard_copy(full, local, seq_axis, sharding, rank, nranks, 1);
}

fa_status fa_ring_unshard(const fa_tensor *local, const fa_tensor *full, int seq_axis, fa_ring_sharding sharding,
                          int rank, int nranks)
{
    ring_clear_error();
    return shard_copy(full, local, seq_axis, sharding, rank, nranks, 0);
}
