/*
 * shard.c: where a shard's rows sit in the global sequence (the layouts of
 * include/flashattn_mpi.h), the shard and unshard helpers (plain memory copies),
 * and the per-thread error message. Which pairs a block keeps is the core's count
 * (fa_forward_work, in ring.c).
 */
#include "ring_internal.h"

#include <stdarg.h>
#include <stdio.h>
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

void ring_layout_of(fa_ring_sharding sharding, int P, const int64_t *S, int r, ring_layout *out)
{
    memset(out, 0, sizeof *out);
    if (sharding == FA_RING_CONTIGUOUS) {
        int64_t pos = 0;
        for (int x = 0; x < r; x++) pos += S[x];
        out->n = 1;
        out->seg[0] = (ring_seg){pos, S[r], 0};
        return;
    }
    /* zig-zag: the global order of the 2P chunks is rank 0's first, 1's first, ...,
     * P-1's first, P-1's second, ..., 0's second; chunk lengths S_x / 2 */
    int64_t first = 0, second = 0;
    for (int x = 0; x < r; x++) first += S[x] / 2;
    for (int x = 0; x < P; x++) second += S[x] / 2;
    for (int x = P - 1; x > r; x--) second += S[x] / 2;
    const int64_t c = S[r] / 2;
    out->n = 2;
    out->seg[0] = (ring_seg){first, c, 0};
    out->seg[1] = (ring_seg){second, c, c};
}

int64_t fa_ring_position(fa_ring_sharding sharding, int rank, int nranks, int64_t s_local, int64_t i)
{
    if (nranks < 1 || rank < 0 || rank >= nranks || i < 0 || i >= s_local) return -1;
    if (sharding == FA_RING_CONTIGUOUS) return (int64_t)rank * s_local + i;
    if (sharding != FA_RING_ZIGZAG || s_local % 2 != 0) return -1;
    const int64_t c = s_local / 2;
    return i < c ? (int64_t)rank * c + i : (int64_t)(2 * nranks - 1 - rank) * c + (i - c);
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
    int64_t idx[4];
    for (idx[0] = 0; idx[0] < local->shape[0]; idx[0]++)
        for (idx[1] = 0; idx[1] < local->shape[1]; idx[1]++)
            for (idx[2] = 0; idx[2] < local->shape[2]; idx[2]++)
                for (idx[3] = 0; idx[3] < local->shape[3]; idx[3]++) {
                    int64_t lo = 0, fo = 0;
                    for (int d = 0; d < 4; d++) {
                        const int64_t fi = d == axis ? fa_ring_position(sharding, rank, P, s, idx[d]) : idx[d];
                        lo += idx[d] * local->stride[d];
                        fo += fi * full->stride[d];
                    }
                    char *l = (char *)local->data + lo * (int64_t)es, *f = (char *)full->data + fo * (int64_t)es;
                    if (to_local) memcpy(l, f, es);
                    else memcpy(f, l, es);
                }
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
