/*
 * tune.h: tuned tile sizes. src/tune_file.c owns the tune file: where it is, its
 * one reader (the planner, src/plan.c, asks fa_tune_lookup for the tiles of a
 * call's shape class; the file is read once per context, at the first planned
 * flash call) and its one writer (fa_tune_save). src/tune.c is fa_tune, the
 * public sweep that finds the tiles and saves them.
 * Anything wrong with the file when reading (missing, unreadable, another version,
 * another CPU or ISA, bad lines, absurd values) only means no tuned tiles: never an
 * error, never output. ctx->tune.note says what happened, for FLASHATTN_VERBOSE.
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

#include "context.h"
#include "problem.h"

typedef struct fa_tune_table fa_tune_table;

/* Where a plan's tile sizes came from (ctx->tune.tile_src_q, ctx->tune.tile_src_kv). */
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
 * 1 with *br, *bc set, or 0. Records the class in ctx->tune.key (for fa_tune);
 * while ctx->tune.off, answers 0 without reading. Sets ctx->tune.note_due when
 * this call read the file (the caller clears it before each plan).
 */
int fa_tune_lookup(fa_context *ctx, const fa_problem *p, int masked, int64_t *br, int64_t *bc);

/* Frees a table read from the file; NULL is fine. */
void fa_tune_free(fa_tune_table *t);

/* The tune file's path by the library's rule (README.md): 1 with the path in buf;
 * 0 when there is none (tuned tiles off, or no place), with `note` saying why. */
int fa_tune_path(char *buf, size_t n, char *note, size_t note_size);

/* The shape class as the entry's text: "isa=.. dtype=.. d=.. dv=.. sk=.. rows=.. masked=..". */
void fa_tune_key_text(const char *isa, const fa_tune_key *k, char *buf, size_t n);

/* Whether a file at path may be replaced: absent, or starting with the version
 * line. FA_OK, or FA_ERR_IO with the reason on ctx. */
fa_status fa_tune_file_check(fa_context *ctx, const char *path);

/*
 * Saves tiles (tq, tkv) for class k of this CPU and ctx's ISA: the entry of the same
 * key is replaced, other entries kept, lines that are not entries dropped (counted
 * in *dropped); written next to the file and renamed over it, so a reader sees the
 * old file or the new one. FA_OK, or FA_ERR_IO (the file is not a tune file, cannot
 * be written, or the tiles are beyond what a reader accepts) with the reason on ctx.
 */
fa_status fa_tune_save(fa_context *ctx, const char *path, const fa_tune_key *k, int64_t tq, int64_t tkv,
                       int64_t *dropped);

#endif
