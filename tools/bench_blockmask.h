/*
 * bench_blockmask.h: `flashattn bench --block-mask SPEC [--block-size N]`
 * (tools/bench_blockmask.c): a block mask against the same mask as a dense boolean
 * tensor, and against the unmasked, causal or varlen call where one equals it.
 */
#ifndef FLASHATTN_TOOLS_BENCH_BLOCKMASK_H
#define FLASHATTN_TOOLS_BENCH_BLOCKMASK_H

#include <stdint.h>

#include "flashattn.h"
#include "shape.h"

/* The default --block-size: FlexAttention's BLOCK_SIZE. */
enum { BENCH_BLOCK_DEFAULT = 128 };

/* Runs the comparison; a CLI_EXIT_* status (CLI_EXIT_USAGE for a bad SPEC). */
int bench_block_mask(fa_context *ctx, const cli_shape *s, const char *spec, int64_t block, int json, int no_probe);

#endif /* FLASHATTN_TOOLS_BENCH_BLOCKMASK_H */
