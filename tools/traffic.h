/*
 * traffic.h: a model of the main-memory traffic of one forward call, for
 * flash and for standard: the bytes each moves between the per-core L2 and
 * what lies beyond it. The model and why it is shaped so are in traffic.c
 * and bench/README.md; bench/cachegrind.sh compares it with a simulated cache.
 */
#ifndef FLASHATTN_TOOLS_TRAFFIC_H
#define FLASHATTN_TOOLS_TRAFFIC_H

#include <stdint.h>

#include "shape.h"

typedef struct cli_traffic {
    double read_bytes;       /* fetched from beyond the L2 */
    double write_bytes;      /* written back beyond the L2 (dirty lines leaving it) */
    double write_miss_bytes; /* the part of write_bytes stored to lines the call had not
                                read first: what a write-allocate cache fetches on a
                                store miss (cachegrind's DLmw counts these) */
    double passes;           /* flash: K/V reads per query head, in whole K/V bands;
                                standard: passes over S that miss the L2 (0 when it fits) */
    int resident;            /* flash: K/V stays in L2 across q tiles; standard: S fits in L2 */
    double s_bytes;          /* standard: one head's Sq x Sk fp32 score matrix */
} cli_traffic;

/* The per-core L2 in bytes: sysconf(_SC_LEVEL2_CACHE_SIZE), or 2 MiB when unknown. */
int64_t cli_l2_bytes(void);

/* The last-level cache in bytes: sysconf(_SC_LEVEL3_CACHE_SIZE), else the L2
 * (a CPU without an L3), else 32 MiB when the system says neither. */
int64_t cli_llc_bytes(void);

void cli_traffic_standard(const cli_shape *s, int64_t l2, cli_traffic *t);

/* tile_q: FA_PARAM_LAST_TILE_Q of a flash call on this shape; workspace: the
 * bytes of one thread's tile scratch (LAST_EXTRA_BYTES / LAST_THREADS). */
void cli_traffic_flash(const cli_shape *s, int64_t l2, int64_t tile_q, int64_t workspace,
                       cli_traffic *t);

#endif /* FLASHATTN_TOOLS_TRAFFIC_H */
