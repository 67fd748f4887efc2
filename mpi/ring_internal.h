/*
 * ring_internal.h: what the files of libflashattn_mpi share and nothing outside
 * it sees: one call's state, its local checks and its agreement (ring.c, used by
 * the ring and by Ulysses), the fault hook and the error buffer. Where a shard's
 * rows sit and what the ranks agree on are the core's ring planner's.
 */
#ifndef FA_RING_INTERNAL_H
#define FA_RING_INTERNAL_H

#include <stdint.h>

#include "flashattn_mpi.h"

typedef struct ring_call {
    fa_context *ctx;
    int P, rank, prev, next;
    MPI_Comm comm; /* our duplicate of the caller's */
    fa_forward_args a; /* the local forward arguments, struct_size normalised */
    fa_backward_args g; /* the backward's (backward only) */
    fa_ring_plan plan; /* the core's ring planner: placement, pieces, agreement */
    int pieces;        /* per (segment, segment) block, resolved */
    int64_t B, Hq, Hk, D, Dv, Sl, Smax;
    fa_dtype dt;
    int64_t es;
    int64_t *S;        /* (P) shard lengths */
    fa_ring_stats *stats, local_stats;
    const char *driver; /* "ring attention" or "Ulysses attention": what a refusal names */
    fa_status st;      /* the first failure inside the ring */
    char msg[400];
} ring_call;

/* The opening of every call: a clean error, this rank's place in the communicator. */
fa_status ring_begin(ring_call *rc, MPI_Comm comm, const char *driver);
/* Pass 1, local: the forward's arguments (the backward's, with its fwd; *grads: which
 * gradients, the value the ranks agree on). */
fa_status ring_check_forward(ring_call *rc, fa_context *ctx, const fa_ring_args *ring, const fa_forward_args *local);
fa_status ring_check_backward(ring_call *rc, fa_context *ctx, const fa_ring_args *ring, const fa_backward_args *local,
                              int64_t *grads);
/* Pass 2: the agreement on every rank's descriptor (extra: the driver's own value);
 * on success rc->S holds every rank's shard length (the caller frees it). */
fa_status ring_agree(ring_call *rc, MPI_Comm comm, fa_status local_st, int64_t extra);
/* Agrees on a flag every rank computed itself (1 = failed). */
int ring_any(int flag, MPI_Comm comm);
/* The first failing rank's status inside the call (rc->st), on every rank (on rc->comm). */
fa_status ring_agree_end(ring_call *rc);
/* Records the first failure inside the call, with the core's message. */
fa_status ring_call_fail(ring_call *rc, fa_status st, int step, const char *what);
/* A failure the core found, reported with the core's own message. */
fa_status ring_core_fail(fa_status st, fa_context *ctx);
/* Rows [r0, r0 + n) of a tensor along axis `ax`. */
fa_tensor ring_rows(const fa_tensor *t, int ax, int64_t r0, int64_t n);
fa_ring_stats *ring_stats_of(ring_call *rc);

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
