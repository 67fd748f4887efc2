/*
 * tune.h: tuned tile sizes. src/schedule/tune_file.c owns the tune file: where it is, its
 * one reader (fa_tune_read, which a context runs when it is made, src/schedule/plan_inputs.c;
 * the planner then takes the entry of a call's shape class as an input) and its one
 * writer (fa_tune_save). src/schedule/tune.c is fa_tune, the public sweep that finds the
 * tiles and saves them. Nothing here knows a context: the reader and the writer
 * take the ISA's name and a buffer for their words.
 * Anything wrong with the file when reading (missing, unreadable, another version,
 * another CPU or ISA, bad lines, absurd values) only means no tuned tiles: never an
 * error, never output. The reader's note says what happened, for FLASHATTN_VERBOSE.
 *
 * The file, version 1 (docs/tool.md, "The tune file"):
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

#include "problem.h"

#include <stddef.h>
#include <stdint.h>

/* A tune file entry's shape class; the CPU and ISA are the reader's. */
typedef struct fa_tune_key {
    fa_dtype dtype;
    int64_t d, dv, sk, rows; /* sk, rows: the length buckets */
    int masked;              /* a causal mask or a window */
} fa_tune_key;

typedef struct fa_tune_table fa_tune_table;

/* The smallest power of two >= n (1 for n < 1), at most 2^62: the length buckets. */
int64_t fa_tune_bucket(int64_t n);

/* The shape class of p (a problem as the planner sees it) and `masked` (causal or window). */
fa_tune_key fa_tune_key_of(const fa_problem *p, int masked);

/* Reads the tune file the library's rule names (fa_tune_path): this CPU's entries
 * for ISA `isa`, or NULL when there are none; either way `note` says what happened. */
fa_tune_table *fa_tune_read(const char *isa, char *note, size_t note_size);

/* The entry of class k in t (NULL is an empty table): 1 with *tile_q, *tile_kv set (>= 1), or 0. */
int fa_tune_find(const fa_tune_table *t, const fa_tune_key *k, int64_t *tile_q, int64_t *tile_kv);

/* Frees a table read from the file; NULL is fine. */
void fa_tune_free(fa_tune_table *t);

/* The tune file's path by the library's rule (docs/tool.md): 1 with the path in buf;
 * 0 when there is none (tuned tiles off, or no place), with `note` saying why. */
int fa_tune_path(char *buf, size_t n, char *note, size_t note_size);

/* The shape class as the entry's text: "isa=.. dtype=.. d=.. dv=.. sk=.. rows=.. masked=..". */
void fa_tune_key_text(const char *isa, const fa_tune_key *k, char *buf, size_t n);

/* Whether a file at path may be replaced: absent, or starting with the version
 * line. FA_OK, or FA_ERR_IO with the reason in why (a context's error message). */
fa_status fa_tune_file_check(const char *path, char *why, size_t why_size);

/*
 * Saves tiles (tq, tkv) for class k of this CPU and ISA isa: the entry of the same
 * key is replaced, other entries kept, lines that are not entries dropped (counted
 * in *dropped); written next to the file and renamed over it, so a reader sees the
 * old file or the new one. FA_OK, or FA_ERR_IO (the file is not a tune file, cannot
 * be written, or the tiles are beyond what a reader accepts) with the reason in why.
 */
fa_status fa_tune_save(const char *path, const char *isa, const fa_tune_key *k, int64_t tq, int64_t tkv,
                       int64_t *dropped, char *why, size_t why_size);

#endif
