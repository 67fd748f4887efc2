/*
 * tune.h: tuned tile sizes from the tune file that `flashattn tune` writes.
 * The planner (src/plan.c) asks fa_tune_lookup for the tiles of a call's shape
 * class; the file is read once per context, at the first planned flash call.
 * Anything wrong with the file (missing, unreadable, another version, another
 * CPU or ISA, bad lines, absurd values) only means no tuned tiles: never an
 * error, never output. ctx->tune_note says what happened, for FLASHATTN_VERBOSE.
 *
 * The file, version 1 (README.md, "The tune file"):
 *
 *   flashattn-tune 1
 *   # comment lines and blank lines are skipped
 *   isa=avx512 dtype=f32 d=128 dv=128 sk=2048 rows=256 masked=0 tile_q=64 tile_kv=128 cpu=AMD EPYC 9R14
 *
 * An entry holds every field once, separated by blanks, in any order except that
 * cpu= comes last: its value (fa_cpu_model(), blanks collapsed) runs to the end of
 * the line. isa is fa_context_isa(); d, dv the head dims; sk and rows the smallest
 * power of two >= Sk and >= the rows a task holds (Sq x Hq/Hk, as the planner
 * sees them); masked 1 with a causal mask or a window. Every line ends with a
 * newline: a last line without one was cut off and is skipped. A bad line is
 * skipped and the others are kept; the first entry with a call's key wins.
 */
#ifndef FA_TUNE_H
#define FA_TUNE_H

#include "internal.h"

#define FA_TUNE_HEADER "flashattn-tune"
#define FA_TUNE_VERSION 1

typedef struct fa_tune_table fa_tune_table;

/* Where a plan's tile sizes came from (ctx->tile_src_q, ctx->tile_src_kv). */
enum { FA_TILES_HEURISTIC = 0, FA_TILES_TUNED = 1, FA_TILES_OVERRIDE = 2 };

static inline const char *fa_tiles_source_name(int src)
{
    return src == FA_TILES_TUNED ? "tuned" : src == FA_TILES_OVERRIDE ? "override" : "heuristic";
}

/* The smallest power of two >= n (1 for n < 1), at most 2^62: the length buckets. */
int64_t fa_tune_bucket(int64_t n);

/*
 * The tuned tiles for the shape class of p (a problem as the planner sees it) and
 * `masked` (causal or window), reading the tune file first if ctx has not yet.
 * 1 with *br, *bc set, or 0. Sets ctx->tune_note_due when this call read the file
 * (the caller clears it before each plan).
 */
int fa_tune_lookup(fa_context *ctx, const fa_problem *p, int masked, int64_t *br, int64_t *bc);

/* Frees a table read from the file; NULL is fine. */
void fa_tune_free(fa_tune_table *t);

#endif
