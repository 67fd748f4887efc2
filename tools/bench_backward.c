/*
 * bench_backward.c: `flashattn bench --backward` (see bench_backward.h).
 *
 * The backward reads the forward's o and lse and writes only dq, dk and dv,
 * so one untimed forward serves every timed backward of an algorithm. A
 * "fwd+bwd" row times what a training step pays for attention: the forward
 * (with its lse) and the backward back to back. The traffic model of the
 * forward's --seqs table does not cover the backward, so it is not shown.
 */
#include "bench_backward.h"
#include "bench_profile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Everything one shape's forward and backward read and write. */
typedef struct bwd_buffers {
    cli_timed_io io;
    cli_grads g;
    fa_forward_args fwd;
    fa_backward_args bwd; /* bwd.fwd points at fwd: the struct stays where it was made */
} bwd_buffers;

static void buffers_free(bwd_buffers *b)
{
    cli_grads_free(&b->g);
    cli_timed_io_free(&b->io);
    memset(b, 0, sizeof *b);
}

static int buffers_make(const cli_shape *s, bwd_buffers *b)
{
    memset(b, 0, sizeof *b);
    /* The training forward: the lse is what the backward recomputes P from. */
    if (cli_timed_io_make(s, 1, &b->io) != 0)
        return -1;
    if (cli_grads_make(s, s->dtype, &b->g) != 0) {
        buffers_free(b);
        return -1;
    }
    b->fwd = cli_forward_args(s, &b->io.in, b->io.o, s->dtype, b->io.lse);
    b->bwd = cli_backward_args(s, &b->fwd, &b->g);
    return 0;
}

static double gflops_of(const cli_timing *t, double flops)
{
    return t->oom ? NAN : flops / t->median_s * 1e-9;
}

/* The reference runs fp64 on one thread: a share of the threads' fp32 peak means nothing. */
static double pct_of(const cli_timing *t, double gflops, const cli_peak *peak)
{
    return t->algo == FA_ALGO_REFERENCE ? NAN : cli_pct_peak(gflops, peak);
}

/* ------------------------------------------------------------- one shape */

/* One table row: an algorithm's backward alone, or its whole step. */
typedef struct bwd_row {
    cli_timing t;
    int step;        /* 0: "backward", 1: "fwd+bwd" */
    double flops;    /* credited to this pass */
    double standard_s; /* standard's time for the same pass; 0 when unknown */
} bwd_row;

/* The pass, and "2-pass" where flash's backward ran as two passes of finer tasks
 * (FA_PARAM_LAST_BACKWARD_PASSES: too few (sequence, kv head) walks for the threads). */
static const char *pass_name(const bwd_row *r)
{
    if (r->t.passes == 2)
        return r->step ? "fwd+bwd 2-pass" : "backward 2-pass";
    return r->step ? "fwd+bwd" : "backward";
}

static void print_row_json(const cli_shape *s, const char *isa, const bwd_row *r,
                           const cli_peak *peak, const bench_profile *pr)
{
    FILE *f = stdout;
    const cli_timing *t = &r->t;
    const double gflops = gflops_of(t, r->flops);
    cli_json_run_head(f, s, isa, t, gflops);
    fputs(",\"pass\":", f);
    cli_json_string(f, r->step ? "fwd+bwd" : "backward");
    fprintf(f, ",\"backward_passes\":%lld", (long long)r->t.passes);
    fputs(",\"dropout\":", f);
    cli_json_number(f, s->dropout);
    cli_json_run_tiles(f, s, t, r->flops, r->standard_s);
    cli_json_peak(f, peak, pct_of(t, gflops, peak));
    if (pr && pr->ran)
        bench_profile_json(f, pr, peak);
    if (t->oom)
        fputs(",\"error\":\"out of memory\"", f);
    fputs("}\n", f);
}

enum { ROW_COLS = 12, MAX_ROWS = 4 };

static void print_rows_table(const cli_shape *s, const char *isa, const bwd_row *rows, int n,
                             const cli_peak *peak)
{
    static const char *const head[ROW_COLS] = {"algo", "pass", "isa", "dtype", "shape",
                                               "threads", "tiles", "median ms", "GFLOP/s",
                                               "% peak", "extra MiB", "vs standard"};
    static const int right[ROW_COLS] = {0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1};
    char cells[MAX_ROWS * ROW_COLS * CLI_CELL];
    char shape[CLI_CELL];
    cli_compact_shape(s, 1, shape, sizeof shape);
    for (int r = 0; r < n; r++) {
        const cli_timing *t = &rows[r].t;
        char *c[ROW_COLS];
        for (int k = 0; k < ROW_COLS; k++)
            c[k] = cli_cell(cells, ROW_COLS, r, k);
        snprintf(c[0], CLI_CELL, "%s", fa_algo_name(t->algo));
        snprintf(c[1], CLI_CELL, "%s", pass_name(&rows[r]));
        snprintf(c[2], CLI_CELL, "%s", isa);
        snprintf(c[3], CLI_CELL, "%s", fa_dtype_name(s->dtype));
        snprintf(c[4], CLI_CELL, "%s", shape);
        snprintf(c[5], CLI_CELL, "%lld", (long long)t->threads);
        cli_tiles_cell(c[6], t);
        const double gflops = gflops_of(t, rows[r].flops);
        if (!cli_run_cells(cells, ROW_COLS, r, 7, t, gflops, pct_of(t, gflops, peak)))
            continue;
        if (rows[r].standard_s > 0)
            snprintf(c[11], CLI_CELL, "%.2fx", rows[r].standard_s / t->median_s);
        else
            snprintf(c[11], CLI_CELL, "-");
    }
    cli_print_table(stdout, ROW_COLS, head, right, n, cells);
}

int bench_backward(fa_context *ctx, const cli_shape *s, int json, const cli_peak *peak,
                   cli_flush *flush, int profile)
{
    const double fwd_flops = cli_flops(s), bwd_flops = cli_backward_flops(s);
    fa_algo algos[3];
    const int n_algos = cli_bench_algos(s, 0, algos);

    bwd_buffers b;
    bwd_row rows[MAX_ROWS];
    memset(rows, 0, sizeof rows);
    if (buffers_make(s, &b) != 0)
        return CLI_EXIT_FAIL;
    int n = 0;
    for (int a = 0; a < n_algos; a++) {
        for (int step = 0; step < 2; step++, n++) {
            rows[n].step = step;
            rows[n].flops = step ? fwd_flops + bwd_flops : bwd_flops;
            if (cli_time_backward(ctx, s, algos[a], &b.fwd, &b.bwd, step, b.io.times, flush,
                                  &rows[n].t, "bench") != 0) {
                buffers_free(&b);
                return CLI_EXIT_FAIL;
            }
        }
    }
    /* --profile: the flash backward's phases (the buffers hold the last forward's o, lse) */
    bench_profile pr = {0};
    for (int r = 0; r < n && profile && s->runs > 0; r++)
        for (int c = 0; c < BENCH_PROFILE_CALLS && rows[r].t.algo == FA_ALGO_FLASH && rows[r].step == 0 &&
                        !rows[r].t.oom; c++)
            if (bench_profile_call(ctx, &b.fwd, &b.bwd, &pr) != 0) {
                buffers_free(&b);
                return CLI_EXIT_FAIL;
            }
    buffers_free(&b);

    /* Each pass against standard's same pass. */
    for (int r = 0; r < n; r++)
        for (int k = 0; k < n; k++)
            if (rows[k].t.algo == FA_ALGO_STANDARD && !rows[k].t.oom &&
                rows[k].step == rows[r].step)
                rows[r].standard_s = rows[k].t.median_s;

    const char *isa = fa_context_isa(ctx);
    if (json) {
        for (int r = 0; r < n; r++)
            print_row_json(s, isa, &rows[r], peak, rows[r].t.algo == FA_ALGO_FLASH && rows[r].step == 0 ? &pr : NULL);
        return CLI_EXIT_OK;
    }
    char note[128];
    printf("# flashattn %s bench --backward: median of %lld runs after 1 warm-up%s\n"
           "# backward: each timed after one untimed forward with lse; fwd+bwd: forward and "
           "backward timed together\n"
           "# GFLOP/s: backward 2.5 x 2*(D+Dv)*kept(i,j)*B*Hq = %.4g GFLOP, fwd+bwd 3.5 x = "
           "%.4g GFLOP, / time\n",
           fa_version_string(), (long long)s->runs, cli_cold_note(flush, note, sizeof note),
           bwd_flops * 1e-9, (fwd_flops + bwd_flops) * 1e-9);
    cli_print_peak_line(peak, isa, cli_resolved_threads(s->threads));
    print_rows_table(s, isa, rows, n, peak);
    if (pr.ran)
        bench_profile_text(&pr, peak);
    for (int r = 0; r < n; r++)
        if (rows[r].t.oom && rows[r].t.algo == FA_ALGO_STANDARD) {
            printf("# standard materialises P, dP and dS per head: out of memory at this "
                   "shape\n");
            break;
        }
    return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------- --seqs */

typedef struct bwd_seq_row {
    cli_shape shape;
    cli_timing flash, standard; /* backward alone */
} bwd_seq_row;

static void print_seq_json(const bwd_seq_row *r, const char *isa, const cli_peak *peak)
{
    FILE *f = stdout;
    const cli_shape *s = &r->shape;
    fprintf(f, "{\"N\":%lld", (long long)s->seq);
    cli_json_shape(f, s, isa);
    fputs(",\"pass\":\"backward\",\"dropout\":", f);
    cli_json_number(f, s->dropout);
    cli_json_seq_pair(f, &r->flash, &r->standard, s->runs, cli_backward_flops(s), peak);
    cli_json_seq_end(f, &r->flash, &r->standard);
}

enum { SEQ_COLS = 9 };

static void print_seq_table(const bwd_seq_row *rows, int n, const cli_peak *peak, char *cells)
{
    static const char *const head[SEQ_COLS] = {"N", "tiles", "flash ms", "standard ms",
                                               "speedup", "GFLOP/s", "% peak", "flash extra",
                                               "std extra"};
    static const int right[SEQ_COLS] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    for (int r = 0; r < n; r++) {
        const bwd_seq_row *row = &rows[r];
        cli_seq_pair_cells(cells, SEQ_COLS, r, &row->shape, &row->flash, &row->standard,
                           cli_backward_flops(&row->shape), peak);
    }
    cli_print_table(stdout, SEQ_COLS, head, right, n, cells);
}

static int seqs_run(const cli_seqs *sw, void *rows, int r)
{
    bwd_seq_row *row = (bwd_seq_row *)rows + r;
    row->shape = ((const cli_shape *)sw->shapes)[r];
    bwd_buffers b;
    if (buffers_make(&row->shape, &b) != 0)
        return -1;
    int rc = cli_time_backward(sw->ctx, &row->shape, FA_ALGO_FLASH, &b.fwd, &b.bwd, 0, b.io.times, sw->flush,
                               &row->flash, "bench");
    if (rc == 0)
        rc = cli_time_backward(sw->ctx, &row->shape, FA_ALGO_STANDARD, &b.fwd, &b.bwd, 0, b.io.times, sw->flush,
                               &row->standard, "bench");
    buffers_free(&b);
    return rc != 0 ? -1 : 0;
}

static void seqs_json(const cli_seqs *sw, const void *rows, int r)
{
    print_seq_json((const bwd_seq_row *)rows + r, sw->isa, sw->peak);
}

static void seqs_text(const cli_seqs *sw, const void *rows_, char *cells)
{
    const bwd_seq_row *rows = rows_;
    const cli_shape *s = sw->shapes;
    cli_print_seqs_head("--backward --seqs", "flash vs standard backward", s, sw->isa, rows[0].flash.threads,
                        ", each after one untimed forward", sw->flush);
    printf("# GFLOP/s and %% peak are flash's: 2.5 x 2*(D+Dv)*kept(i,j)*B*Hq / time\n");
    cli_print_peak_line(sw->peak, sw->isa, cli_resolved_threads(s->threads));
    printf("# extra = peak bytes a backward allocated (\"out of memory\": standard "
           "materialises P, dP and dS per head); no traffic model for the backward\n");
    print_seq_table(rows, sw->n, sw->peak, cells);
}

int bench_backward_seqs(fa_context *ctx, const cli_shape *shapes, int n, int json,
                        const cli_peak *peak, cli_flush *flush)
{
    const cli_seqs sw = {ctx, fa_context_isa(ctx), peak, flush, shapes, n, json, SEQ_COLS, sizeof(bwd_seq_row),
                         seqs_run, seqs_json, seqs_text};
    return cli_run_seqs(&sw);
}
