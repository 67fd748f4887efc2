/*
 * ring_internal.h: what the files of libflashattn_mpi share and nothing outside
 * it sees: the fault hook and the error buffer. Where a shard's rows sit is the
 * core's ring planner's (fa_ring_placement).
 */
#ifndef FA_RING_INTERNAL_H
#define FA_RING_INTERNAL_H

#include <stdint.h>

#include "flashattn_mpi.h"

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
