/*
 * ring_internal.h: what the files of libflashattn_mpi share and nothing outside
 * it sees: the shard layout (which global rows a shard holds) and the error buffer.
 *
 * Legend: P ranks, S_r rows of rank r; a segment is a run of a shard's rows that
 * is contiguous in the global sequence: one per shard (contiguous sharding), or
 * two (zig-zag: chunk r, then chunk 2P-1-r).
 */
#ifndef FA_RING_INTERNAL_H
#define FA_RING_INTERNAL_H

#include <stdint.h>

#include "flashattn_mpi.h"

typedef struct ring_seg {
    int64_t pos; /* global position of its first row */
    int64_t len; /* rows */
    int64_t off; /* its first row within the shard */
} ring_seg;

typedef struct ring_layout {
    int n;           /* 1 or 2 segments */
    ring_seg seg[2];
} ring_layout;

/* Rank r's segments, given every rank's shard length S[0..P-1] (zig-zag: even). */
void ring_layout_of(fa_ring_sharding sharding, int P, const int64_t *S, int r, ring_layout *out);

/* Test hook (tests/mpi/test_ring.c, linked statically): the ring step at which
 * this rank's core calls fail with FA_ERR_OUT_OF_MEMORY, as a failure inside the
 * ring would; -1 (the default) = off. Never exported from the shared library. */
extern int ring_fault_step;

/* Records the message fa_ring_error() returns; returns st. */
fa_status ring_fail(fa_status st, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void ring_clear_error(void);

#endif /* FA_RING_INTERNAL_H */
