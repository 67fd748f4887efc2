/*
 * measure.h: what the `bench` and `tune` verbs share: the FLOP count of one
 * call (the core's fa_forward_work; docs/semantics.md, section 9), timing an algorithm (warm-up, runs, median), the
 * machine's peak from fa_probe, and the plain-text table and JSON writers.
 */
#ifndef FLASHATTN_TOOLS_MEASURE_H
#define FLASHATTN_TOOLS_MEASURE_H

#include <stdint.h>
#include <stdio.h>

#include "flashattn.h"
#include "shape.h"

/* The key columns query row i keeps under causal and window masking,
 * [*lo, *hi] within [0, Sk-1] (empty when *lo > *hi): the core's fa_forward_band on
 * the shape's call (empty for a shape the core refuses). Both ends are
 * non-decreasing in i. */
void cli_row_band(const cli_shape *s, int64_t i, int64_t *lo, int64_t *hi);

/* (i, j) pairs the causal/window masks keep, per (batch, head), as the core counts
 * them (fa_forward_work); 0 for a shape the core refuses. */
int64_t cli_kept_pairs(const cli_shape *s);

/* FLOPs of one call, fa_forward_work's: 2*(D+Dv) per kept pair, times B*Hq. */
double cli_flops(const cli_shape *s);
/* What the backward is credited with, fa_forward_work's backward_flops (2.5x the
 * forward's); a training step's is cli_flops + this. */
double cli_backward_flops(const cli_shape *s);

/* One algorithm, timed. Everything but algo and oom is read from the context
 * after the timed runs, so it names what really ran. */
typedef struct cli_timing {
    fa_algo algo;            /* what ran (auto resolves to a concrete algorithm) */
    int oom;                 /* a call returned FA_ERR_OUT_OF_MEMORY */
    double median_s;
    int64_t extra_bytes;     /* FA_PARAM_LAST_EXTRA_BYTES, the largest over the runs */
    int64_t threads;         /* FA_PARAM_LAST_THREADS */
    int64_t tile_q, tile_kv; /* FA_PARAM_LAST_TILE_Q/_KV: 0 when the algorithm has no tiles */
    int64_t passes;          /* FA_PARAM_LAST_BACKWARD_PASSES of a timed backward (0 otherwise) */
    int64_t kv_packed;       /* FA_PARAM_LAST_KV_PACKED of the last forward */
    int64_t kv_pack_us;      /* FA_PARAM_LAST_KV_PACK_US of the last forward */
} cli_timing;

/*
 * A buffer streamed through the caches (read and written, line by line) to
 * push a call's data out of them, so that the call starts cold: twice the L2
 * leaves nothing of the previous contents in an LRU-like L2.
 */
typedef struct cli_flush {
    unsigned char *buf;
    int64_t bytes;
    int read_only; /* 1: only read the buffer (one load per line), so the flush leaves
                      no dirty lines whose write-back would land inside the timed call */
} cli_flush;

int cli_flush_make(cli_flush *f, int64_t bytes); /* 0, or -1 out of memory (reported); read_only = 0 */
void cli_flush_run(cli_flush *f);
void cli_flush_free(cli_flush *f);

/*
 * One warm-up, then s->runs timed calls of `algo` on `args`; the median goes to
 * t->median_s. `times` holds s->runs doubles. With s->runs == 0 only the
 * warm-up runs (median_s stays 0), to learn what a call allocates and plans.
 * With `flush` (else NULL), the flush runs before every timed call, untimed,
 * and with s->runs == 0 once after the warm-up: where a timed call would start.
 * 0 done (t->oom may be set), -1 a library error, already reported for `verb`.
 */
int cli_time_algo(fa_context *ctx, const cli_shape *s, fa_algo algo, const fa_forward_args *args,
                  double *times, cli_flush *flush, cli_timing *t, const char *verb);

/*
 * The backward of `algo`, timed like cli_time_algo. `fwd` must ask for an lse;
 * `bwd` refers to it. with_forward 0: one untimed forward, then one warm-up
 * backward and s->runs timed ones (the backward leaves the forward's outputs
 * as they are, so one forward serves them all); t->extra_bytes is the
 * backward's. with_forward 1: a training step, forward then backward timed
 * together, one warm-up step then s->runs; t->extra_bytes is the larger of
 * the two calls' (each frees its workspace before returning). The tiles are
 * the backward's. Returns as cli_time_algo; s->runs >= 1.
 */
int cli_time_backward(fa_context *ctx, const cli_shape *s, fa_algo algo,
                      const fa_forward_args *fwd, const fa_backward_args *bwd, int with_forward,
                      double *times, cli_flush *flush, cli_timing *t, const char *verb);

/*
 * The peak a run is compared with: fp32 FMA for f32 and f16 inputs (both are
 * computed in fp32); for bf16 on the avx512bf16 path, whose kernels multiply
 * bf16 pairs, the bf16 dot-product peak; on a path with a tile unit (amx), the
 * tile product's peak (FA_PROBE_TILE_PEAK).
 */
typedef struct cli_peak {
    double gflops;    /* 0 when not measured */
    const char *kind; /* "fp32 FMA", "bf16 dot" or "bf16 tile" */
    const char *json_kind; /* "fp32_fma", "bf16_dot" or "bf16_tile" */
    char why[160];    /* when not measured: why */
} cli_peak;

/* Runs fa_probe on ctx (about half a second) unless `skip`; never fails the
 * verb: a path without the probe leaves gflops 0 and says so in `why`. */
void cli_measure_peak(fa_context *ctx, fa_dtype dtype, int skip, cli_peak *peak);

/* 100 * gflops / peak, or NaN when either is unknown. */
double cli_pct_peak(double gflops, const cli_peak *peak);

/* ---------------------------------------------------------------- output */

/* A plain-text table: `rows` x `cols` cells of CLI_CELL bytes each, row-major
 * in `cells`; columns as wide as their widest cell, numbers (right[c]) right-aligned. */
enum { CLI_CELL = 64 };
void cli_print_table(FILE *f, int cols, const char *const *head, const int *right, int rows,
                     const char *cells);

/* Bytes as "812 KiB", "3.25 MiB", "1.50 GiB". */
void cli_format_bytes(char *buf, size_t n, double bytes);

/* JSON values: a string literal, a number (null unless finite), an integer
 * (null when `known` is 0). */
void cli_json_string(FILE *f, const char *text);
void cli_json_number(FILE *f, double x);
void cli_json_int(FILE *f, int64_t x, int known);
/* The peak fields every bench row carries: ,"peak_gflops":..,"peak_kind":..,"pct_peak":pct */
void cli_json_peak(FILE *f, const cli_peak *peak, double pct);
/* The fields every --seqs JSON row has, flash against standard over `flops`:
 * threads, runs, tiles, both times, speed-up, FLOPs, both GFLOP/s, the peak and %
 * (of flash), both extra bytes. The row's "{" and shape come before, its own fields
 * after; cli_json_seq_end closes it with the out-of-memory note where one ran out. */
void cli_json_seq_pair(FILE *f, const cli_timing *flash, const cli_timing *standard, int64_t runs, double flops,
                       const cli_peak *peak);
void cli_json_seq_end(FILE *f, const cli_timing *flash, const cli_timing *standard);
/* The first fields of a one-run bench row: {"algo":.. and the shape, then threads,
 * median_ms, gflops, extra_bytes (null where the run ran out of memory). */
void cli_json_run_head(FILE *f, const cli_shape *s, const char *isa, const cli_timing *t, double gflops);
/* A one-run row's window, runs, flops, speedup_vs_standard (standard_s 0: unknown)
 * and tiles. */
void cli_json_run_tiles(FILE *f, const cli_shape *s, const cli_timing *t, double flops, double standard_s);

/* ------------------------------------------------------ bench's tables */

/* "# peak 1234.5 GFLOP/s: fp32 FMA of the avx512 path on 2 threads, ...", or why not. */
void cli_print_peak_line(const cli_peak *peak, const char *isa, int64_t threads);

/* "; each timed call after streaming 4.00 MiB through the caches (--cold)" with
 * a flush, else "" (then buf is unused). */
const char *cli_cold_note(const cli_flush *flush, char *buf, size_t n);

/* The JSON fields after every bench object's first: ,"isa":..,"dtype":..,"B":.. ..,"causal":.. */
void cli_json_shape(FILE *f, const cli_shape *s, const char *isa);

/* "B1 H32 S2048 D128 causal=bottom-right", a pair written once when both sides
 * agree; the sequence lengths only when with_seq. */
void cli_compact_shape(const cli_shape *s, int with_seq, char *buf, size_t n);

/*
 * A --seqs sweep of n rows of row_size bytes (zeroed): run(sw, rows, r) times row
 * r (0, or -1 after a message, which ends the sweep); with json, json_row prints
 * each row as it finishes, else text prints the header and the table of `cols`
 * columns (cells, zeroed, n x cols of CLI_CELL) once all ran. CLI_EXIT_OK or
 * CLI_EXIT_FAIL.
 */
typedef struct cli_seqs {
    fa_context *ctx;
    const char *isa;
    const cli_peak *peak;
    cli_flush *flush;
    const void *shapes; /* the caller's rows as given */
    int n, json, cols;
    size_t row_size;
    int (*run)(const struct cli_seqs *sw, void *rows, int r);
    void (*json_row)(const struct cli_seqs *sw, const void *rows, int r);
    void (*text)(const struct cli_seqs *sw, const void *rows, char *cells);
} cli_seqs;
int cli_run_seqs(const cli_seqs *sw);

/* The algorithms a bench times: --algo's alone, else flash, standard and, with
 * with_reference, the reference. Returns how many (at most 3) are in algos. */
int cli_bench_algos(const cli_shape *s, int with_reference, fa_algo algos[3]);

/* "# flashattn <version> bench <flags>: <what>, Sq = Sk = N, <dtype> <shape>, isa ..,
 * N threads; median of R runs after 1 warm-up<after><cold note>", a sweep's first line. */
void cli_print_seqs_head(const char *flags, const char *what, const cli_shape *s, const char *isa,
                         int64_t threads, const char *after, const cli_flush *flush);

/* Cell (r, c) of a cli_print_table grid with `cols` columns. */
char *cli_cell(char *cells, int cols, int r, int c);

/* "128x256", or "-" for an algorithm without tiles. */
void cli_tiles_cell(char *buf, const cli_timing *t);

/* A run's cells from column k of row r: median ms, GFLOP/s, % peak ("-" unless
 * finite), extra MiB; a run out of memory: "out of memory", then "-" to the row's
 * end. 1 when the run has a time, else 0. */
int cli_run_cells(char *cells, int cols, int r, int k, const cli_timing *t, double gflops, double pct);

/* Columns 0..8 of a --seqs row, flash against standard over `flops`: N, tiles, flash
 * ms, standard ms, speed-up, GFLOP/s, % peak (of flash), flash extra, std extra. */
void cli_seq_pair_cells(char *cells, int cols, int r, const cli_shape *s, const cli_timing *flash,
                        const cli_timing *standard, double flops, const cli_peak *peak);

#endif /* FLASHATTN_TOOLS_MEASURE_H */
