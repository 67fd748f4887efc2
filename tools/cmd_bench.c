/*
 * cmd_bench.c: `flashattn bench`: times the algorithms through the public API
 * and reports median latency, GFLOP/s and the share of the machine's measured
 * peak, the extra memory each call allocated, the flash tiles used and the
 * speed-up over the standard (materialise S) baseline. Three modes:
 *   one shape     flash, standard (and reference when small), one row each;
 *   --seqs LIST   flash against standard, one row per N (Sq = Sk = N), with the
 *                 modelled main-memory traffic of each (tools/traffic.c);
 *   --model-only  the traffic model alone, no timing (for bench/cachegrind.sh).
 * and two serving modes in tools/bench_modes.c: --decode (against a KV cache,
 * judged by K/V read bandwidth) and --varlen (packed prefill against a dense
 * batch of the same work); and the training mode in tools/bench_backward.c:
 * --backward (the backward, and forward+backward, on one shape or --seqs).
 *
 * FLOPs are the core's (fa_forward_work; docs/semantics.md, section 9): 2*(D+Dv)
 * per (i, j) pair the mask keeps,
 * times B*Hq, so masked variants are credited only for the work they must do.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_backward.h"
#include "bench_profile.h"
#include "bench_blockmask.h"
#include "bench_modes.h"
#include "flashattn.h"
#include "measure.h"
#include "shape.h"
#include "traffic.h"

int cmd_bench(int argc, char **argv);

/* The reference is fp64 and single-threaded; above this it takes too long to
 * be part of a default run (it can still be asked for with --algo reference). */
#define REFERENCE_MAX_FLOPS 2e9

/* --seqs: at most this many lengths, and this many runs unless --runs says:
 * a sweep up to 8192 at the default shape stays within minutes. */
enum { SEQS_MAX = 32, SEQS_DEFAULT_RUNS = 3 };

static void bench_usage(FILE *f)
{
    cli_shape d = cli_shape_defaults();
    fprintf(f, "usage: flashattn bench [shape flags] [--seqs N,N,...] [--json] [--no-probe]\n"
               "                       [--model-only] [--cold[=BYTES]] [--warmup-only]\n"
               "       flashattn bench --decode [--q-rows N] [--cache-len N|LO:HI] [--page-size N]\n"
               "                       [--kv-dtype T] [--kv-splits N] [--warm] [shape flags] [--json]\n"
               "       flashattn bench --varlen L,L,...|N:LO-HI [shape flags] [--json]\n"
               "       flashattn bench --mixed [--chunks N] [--chunk-len N] [--decodes N] [--cache-len N]\n"
               "                       [--page-size N] [--kv-dtype T] [shape flags] [--json]\n"
               "       flashattn bench --backward [--seqs N,N,...] [shape flags] [--json]\n"
               "                       [--no-probe] [--cold[=BYTES]]\n"
               "       flashattn bench --block-mask full|causal|random:F|doc:N|prefix:P\n"
               "                       [--block-size N] [shape flags] [--json] [--no-probe]\n\n"
               "Times flash and standard, and reference when a call is at most 2 GFLOP,\n"
               "or only --algo when given. Each: one warm-up, then --runs timed runs;\n"
               "reports the median. GFLOP/s = 2*(D+Dv) * kept (i,j) pairs * B * Hq / time;\n"
               "%% peak = GFLOP/s against the peak fa_probe measures for the kernel path on\n"
               "the same threads (fp32 FMA; the bf16 dot product for bf16 inputs when the library multiplies them as bf16 pairs).\n"
               "  --seqs N,N,...     one table, flash against standard, one row per N with\n"
               "                     Sq = Sk = N (overrides --seq and --seq-kv; --runs\n"
               "                     defaults to %d): times, speed-up, flash GFLOP/s and\n"
               "                     %% peak, tiles, extra memory, and the main-memory\n"
               "                     traffic of each algorithm by the model in\n"
               "                     bench/README.md. \"out of memory\" when standard\n"
               "                     cannot allocate its score matrix.\n"
               "  --json             one JSON object per line: per algorithm, fields first\n"
               "                     algo isa dtype B Hq Hk Sq Sk D Dv causal threads\n"
               "                     median_ms gflops extra_bytes, later tile_q tile_kv\n"
               "                     kv_packed kv_pack_ms (the (sequence, kv head) units\n"
               "                     whose K/V flash packed once, see --kv-pack, and the\n"
               "                     thread time that took in the last run; extra_bytes\n"
               "                     counts their buffers) peak_gflops pct_peak; with\n"
               "                     --seqs one object per N\n"
               "  --no-probe         skip the peak probe (about 0.5 s); %% peak is then empty\n"
               "  --profile          3 flash calls more, after the timed ones, with\n"
               "                     FA_PARAM_PROFILE on; of the fastest: its phases (S scores, X softmax,\n"
               "                     P P.V, M merge; the fused bf16 kernel's products and\n"
               "                     softmax all in P), the K/V packing and the rest, in\n"
               "                     thread time and as shares of threads x its wall time,\n"
               "                     and each phase's products (GFLOP/s per thread) as %%\n"
               "                     of the probed peak per thread; JSON: profile_wall_ms,\n"
               "                     phase_{S,X,P,M,pack,rest}_{ms,share},\n"
               "                     phase_{S,X,P,M}_{gflop,pct_peak} on the flash row;\n"
               "                     with --backward the flash backward's phases (S, X,\n"
               "                     dP, dS, dV, dK, dQ) on its \"backward\" row; with\n"
               "                     --decode the decode call's, each profiled call after\n"
               "                     the same flush as the timed ones (unless --warm)\n"
               "  --model-only       print the traffic model of flash and standard for the\n"
               "                     shape (or each --seqs N) without timing: flash runs\n"
               "                     once, untimed, to learn its tiles and scratch size\n"
               "  --cold[=BYTES]     before each timed call, stream BYTES (default twice the\n"
               "                     L2) through the caches, untimed, so the call starts\n"
               "                     with none of its data in L2, as the traffic model assumes\n"
               "  --warmup-only      make each algorithm's warm-up call (and, with --cold,\n"
               "                     the flush after it) and stop: nothing is timed or printed.\n"
               "                     bench/cachegrind.sh subtracts such a run from --runs 1\n",
            SEQS_DEFAULT_RUNS);
    fprintf(f, "  --backward         training: times fa_backward (each timed backward after\n"
               "                     one untimed forward with an lse) and, as a \"fwd+bwd\"\n"
               "                     row, forward and backward timed together, for flash and\n"
               "                     standard (or only --algo). GFLOP/s credits the backward\n"
               "                     2.5x the forward's FLOPs and fwd+bwd 3.5x; extra memory\n"
               "                     is the backward's (fwd+bwd: the larger call's). JSON\n"
               "                     rows as above plus \"pass\": \"backward\" | \"fwd+bwd\".\n"
               "                     With --seqs: one table of flash against standard\n"
               "                     backward per N (no traffic model). Standard keeps P, dP\n"
               "                     and dS per head and may be \"out of memory\" at large N.\n"
               "                     %% peak is of the same probe as the forward's (bf16 dot\n"
               "                     where bf16 inputs multiply as bf16 pairs). Pass\n"
               "                     \"backward 2-pass\" (JSON backward_passes 2): flash ran\n"
               "                     two passes of finer tasks, the (sequence, kv head)\n"
               "                     walks being too few for the threads. --dropout P applies to\n"
               "                     both algorithms.\n");
    fprintf(f, "  --block-mask SPEC  a block mask (fa_block_mask) of blocks of --block-size\n"
               "                     [%d] rows and keys, broadcast over batch and heads,\n"
               "                     against the same mask as a dense bool tensor and, where\n"
               "                     one equals it, the call without a mask (full), causal\n"
               "                     (causal) or varlen (doc, B = 1): interleaved rounds, each\n"
               "                     credited the mask's kept pairs, with the unmasked call\n"
               "                     for scale. full: every block;\n"
               "                     causal: j <= i; random:F: each block with probability F;\n"
               "                     doc:N: N equal documents; prefix:P:\n"
               "                     keys < P for every query, causal beyond. The shape's\n"
               "                     --causal and --window apply on top, to every call.\n\n",
            BENCH_BLOCK_DEFAULT);
    bench_mode_usage(f);
    cli_shape_usage(f, &d);
}

/* ------------------------------------------------------------ shared bits */

static void json_bytes(FILE *f, const char *name, double bytes)
{
    fprintf(f, ",\"%s\":", name);
    if (isfinite(bytes))
        fprintf(f, "%.0f", bytes);
    else
        fputs("null", f);
}


/* One thread's flash tile scratch, for the model's residency test. */
static int64_t workspace_per_thread(const cli_timing *t)
{
    return t->threads > 0 ? t->extra_bytes / t->threads : t->extra_bytes;
}

/* Inputs and output of one shape, and room for its run times. */
typedef struct bench_buffers {
    cli_timed_io io;
    fa_forward_args args;
} bench_buffers;

static int buffers_make(const cli_shape *s, bench_buffers *b)
{
    memset(b, 0, sizeof *b);
    /* No LSE: the inference forward, which is what a serving stack calls. */
    if (cli_timed_io_make(s, 0, &b->io) != 0)
        return -1;
    b->args = cli_forward_args(s, &b->io.in, b->io.o, s->dtype, NULL);
    return 0;
}

/* ------------------------------------------------------------- one shape */

static void print_json(const cli_shape *s, const char *isa, const cli_timing *t, double flops,
                       double standard_s, const cli_peak *peak, const bench_profile *pr)
{
    FILE *f = stdout;
    const double gflops = t->oom ? NAN : flops / t->median_s * 1e-9;
    cli_json_run_head(f, s, isa, t, gflops);
    cli_json_run_tiles(f, s, t, flops, standard_s);
    fprintf(f, ",\"kv_packed\":%lld,\"kv_pack_ms\":%.3f", (long long)t->kv_packed, (double)t->kv_pack_us * 1e-3);
    /* The reference runs fp64 on one thread: a share of the threads' fp32 peak means nothing. */
    cli_json_peak(f, peak, t->algo == FA_ALGO_REFERENCE ? NAN : cli_pct_peak(gflops, peak));
    if (pr && pr->ran && t->algo == FA_ALGO_FLASH)
        bench_profile_json(f, pr, peak);
    if (t->oom)
        fputs(",\"error\":\"out of memory\"", f);
    fputs("}\n", f);
}

enum { SINGLE_COLS = 11 };

static void print_table(const cli_shape *s, const char *isa, const cli_timing *rows, int n,
                        double flops, double standard_s, const cli_peak *peak)
{
    static const char *const head[SINGLE_COLS] = {"algo", "isa", "dtype", "shape", "threads",
                                                  "tiles", "median ms", "GFLOP/s", "% peak",
                                                  "extra MiB", "vs standard"};
    /* Text columns align left, numbers right. */
    static const int right[SINGLE_COLS] = {0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1};
    char cells[3 * SINGLE_COLS * CLI_CELL];
    char shape[CLI_CELL];
    cli_compact_shape(s, 1, shape, sizeof shape);

    for (int r = 0; r < n && r < 3; r++) {
        const cli_timing *t = &rows[r];
        snprintf(cli_cell(cells, SINGLE_COLS, r, 0), CLI_CELL, "%s", fa_algo_name(t->algo));
        snprintf(cli_cell(cells, SINGLE_COLS, r, 1), CLI_CELL, "%s", isa);
        snprintf(cli_cell(cells, SINGLE_COLS, r, 2), CLI_CELL, "%s", fa_dtype_name(s->dtype));
        snprintf(cli_cell(cells, SINGLE_COLS, r, 3), CLI_CELL, "%s", shape);
        snprintf(cli_cell(cells, SINGLE_COLS, r, 4), CLI_CELL, "%lld", (long long)t->threads);
        cli_tiles_cell(cli_cell(cells, SINGLE_COLS, r, 5), t);
        const double gflops = flops / t->median_s * 1e-9;
        const double pct = t->algo == FA_ALGO_REFERENCE ? NAN : cli_pct_peak(gflops, peak);
        if (!cli_run_cells(cells, SINGLE_COLS, r, 6, t, gflops, pct))
            continue;
        if (standard_s > 0)
            snprintf(cli_cell(cells, SINGLE_COLS, r, 10), CLI_CELL, "%.2fx", standard_s / t->median_s);
        else
            snprintf(cli_cell(cells, SINGLE_COLS, r, 10), CLI_CELL, "-");
    }
    cli_print_table(stdout, SINGLE_COLS, head, right, n < 3 ? n : 3, cells);
    /* the breakdown's one part the library times itself: its packing of K/V */
    for (int r = 0; r < n && r < 3; r++)
        if (!rows[r].oom && rows[r].kv_packed > 0)
            printf("# %s packed the K/V of %lld (sequence, kv head) units once each: %.3f ms of thread time, "
                   "%.1f%% of the call's %lld threads x %.3f ms\n",
                   fa_algo_name(rows[r].algo), (long long)rows[r].kv_packed, (double)rows[r].kv_pack_us * 1e-3,
                   100.0 * (double)rows[r].kv_pack_us * 1e-6 / ((double)rows[r].threads * rows[r].median_s),
                   (long long)rows[r].threads, rows[r].median_s * 1e3);
}

static int bench_single(fa_context *ctx, const cli_shape *s, int json, const cli_peak *peak,
                        cli_flush *flush, int profile)
{
    const double flops = cli_flops(s);
    fa_algo algos[3];
    const int with_reference = flops <= REFERENCE_MAX_FLOPS;
    const int n_algos = cli_bench_algos(s, with_reference, algos);
    const int reference_skipped = !s->algo_given && !with_reference;

    bench_buffers b;
    cli_timing rows[3];
    if (buffers_make(s, &b) != 0)
        return CLI_EXIT_FAIL;
    for (int a = 0; a < n_algos; a++) {
        if (cli_time_algo(ctx, s, algos[a], &b.args, b.io.times, flush, &rows[a], "bench") != 0) {
            cli_timed_io_free(&b.io);
            return CLI_EXIT_FAIL;
        }
    }
    bench_profile pr = {0};
    for (int a = 0; a < n_algos && profile && s->runs > 0; a++)
        for (int c = 0; c < BENCH_PROFILE_CALLS && rows[a].algo == FA_ALGO_FLASH && !rows[a].oom; c++)
            if (bench_profile_call(ctx, &b.args, NULL, &pr) != 0) {
                cli_timed_io_free(&b.io);
                return CLI_EXIT_FAIL;
            }
    cli_timed_io_free(&b.io);
    if (s->runs == 0)
        return CLI_EXIT_OK; /* --warmup-only */

    double standard_s = 0.0;
    for (int a = 0; a < n_algos; a++)
        if (rows[a].algo == FA_ALGO_STANDARD && !rows[a].oom)
            standard_s = rows[a].median_s;

    const char *isa = fa_context_isa(ctx);
    if (json) {
        for (int a = 0; a < n_algos; a++)
            print_json(s, isa, &rows[a], flops, standard_s, peak, &pr);
        return CLI_EXIT_OK;
    }
    char note[128];
    printf("# flashattn %s: median of %lld runs after 1 warm-up%s\n"
           "# GFLOP/s = 2*(D+Dv)*kept(i,j)*B*Hq / time = %.4g GFLOP / time\n",
           fa_version_string(), (long long)s->runs, cli_cold_note(flush, note, sizeof note),
           flops * 1e-9);
    cli_print_peak_line(peak, isa, cli_resolved_threads(s->threads));
    if (reference_skipped)
        printf("# reference skipped: %.3g GFLOP per call > %.3g (--algo reference runs it)\n",
               flops * 1e-9, REFERENCE_MAX_FLOPS * 1e-9);
    print_table(s, isa, rows, n_algos, flops, standard_s, peak);
    if (pr.ran)
        bench_profile_text(&pr, peak);
    return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------- --seqs */

typedef struct seq_row {
    cli_shape shape;              /* Sq = Sk = N */
    cli_timing flash, standard;
    cli_traffic flash_traffic, standard_traffic;
    int flash_modelled;           /* a flash call ran, so its tiles are known */
} seq_row;

static void print_seq_json(const seq_row *r, const char *isa, int64_t l2, const cli_peak *peak)
{
    FILE *f = stdout;
    const cli_shape *s = &r->shape;
    fprintf(f, "{\"N\":%lld", (long long)s->seq);
    cli_json_shape(f, s, isa);
    cli_json_seq_pair(f, &r->flash, &r->standard, s->runs, cli_flops(s), peak);
    fprintf(f, ",\"l2_bytes\":%lld", (long long)l2);
    const double nan = NAN;
    const cli_traffic *ft = &r->flash_traffic, *st = &r->standard_traffic;
    json_bytes(f, "flash_read_bytes", r->flash_modelled ? ft->read_bytes : nan);
    json_bytes(f, "flash_write_bytes", r->flash_modelled ? ft->write_bytes : nan);
    json_bytes(f, "flash_traffic_bytes",
               r->flash_modelled ? ft->read_bytes + ft->write_bytes : nan);
    json_bytes(f, "standard_read_bytes", st->read_bytes);
    json_bytes(f, "standard_write_bytes", st->write_bytes);
    json_bytes(f, "standard_traffic_bytes", st->read_bytes + st->write_bytes);
    cli_json_seq_end(f, &r->flash, &r->standard);
}

enum { SEQ_COLS = 11 };

static void print_seq_table(const seq_row *rows, int n, const cli_peak *peak, char *cells)
{
    static const char *const head[SEQ_COLS] = {
        "N", "tiles", "flash ms", "standard ms", "speedup", "GFLOP/s", "% peak",
        "flash extra", "std extra", "flash traffic", "std traffic"};
    static const int right[SEQ_COLS] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    for (int r = 0; r < n; r++) {
        const seq_row *row = &rows[r];
        cli_seq_pair_cells(cells, SEQ_COLS, r, &row->shape, &row->flash, &row->standard, cli_flops(&row->shape),
                           peak);
        if (row->flash_modelled)
            cli_format_bytes(cli_cell(cells, SEQ_COLS, r, 9), CLI_CELL,
                             row->flash_traffic.read_bytes + row->flash_traffic.write_bytes);
        else
            snprintf(cli_cell(cells, SEQ_COLS, r, 9), CLI_CELL, "-");
        cli_format_bytes(cli_cell(cells, SEQ_COLS, r, 10), CLI_CELL,
                         row->standard_traffic.read_bytes + row->standard_traffic.write_bytes);
    }
    cli_print_table(stdout, SEQ_COLS, head, right, n, cells);
}

/* Times flash and standard on one row's shape and models their traffic. 0 or -1. */
static int run_seq_row(fa_context *ctx, seq_row *r, int64_t l2, cli_flush *flush)
{
    bench_buffers b;
    if (buffers_make(&r->shape, &b) != 0)
        return -1;
    int rc = cli_time_algo(ctx, &r->shape, FA_ALGO_FLASH, &b.args, b.io.times, flush, &r->flash,
                           "bench");
    if (rc == 0)
        rc = cli_time_algo(ctx, &r->shape, FA_ALGO_STANDARD, &b.args, b.io.times, flush,
                           &r->standard, "bench");
    cli_timed_io_free(&b.io);
    if (rc != 0)
        return -1;
    r->flash_modelled = !r->flash.oom;
    if (r->flash_modelled)
        cli_traffic_flash(&r->shape, l2, r->flash.tile_q, workspace_per_thread(&r->flash),
                          &r->flash_traffic);
    cli_traffic_standard(&r->shape, l2, &r->standard_traffic);
    return 0;
}

static int seqs_run(const cli_seqs *sw, void *rows, int r)
{
    seq_row *row = (seq_row *)rows + r;
    *row = ((const seq_row *)sw->shapes)[r];
    return run_seq_row(sw->ctx, row, cli_l2_bytes(), sw->flush);
}

static void seqs_json(const cli_seqs *sw, const void *rows, int r)
{
    print_seq_json((const seq_row *)rows + r, sw->isa, cli_l2_bytes(), sw->peak);
}

static void seqs_text(const cli_seqs *sw, const void *rows_, char *cells)
{
    const seq_row *rows = rows_;
    const cli_shape *s = &((const seq_row *)sw->shapes)[0].shape;
    char l2s[32];
    cli_format_bytes(l2s, sizeof l2s, (double)cli_l2_bytes());
    cli_print_seqs_head("--seqs", "flash vs standard", s, sw->isa, rows[0].flash.threads, "", sw->flush);
    printf("# GFLOP/s and %% peak are flash's: 2*(D+Dv)*kept(i,j)*B*Hq / time\n");
    cli_print_peak_line(sw->peak, sw->isa, cli_resolved_threads(s->threads));
    printf("# extra = peak bytes a call allocated; traffic = modelled bytes to and from "
           "memory beyond the %s L2 (bench/README.md)\n", l2s);
    print_seq_table(rows, sw->n, sw->peak, cells);
}

/* proto: the rows' shapes (Sq = Sk = N). */
static int bench_seqs(fa_context *ctx, const seq_row *proto, int n, int json,
                      const cli_peak *peak, cli_flush *flush)
{
    const cli_seqs sw = {ctx, fa_context_isa(ctx), peak, flush, proto, n, json, SEQ_COLS, sizeof(seq_row),
                         seqs_run, seqs_json, seqs_text};
    return cli_run_seqs(&sw);
}

/* ------------------------------------------------------------ --model-only */

static void print_model_json(const cli_shape *s, const char *isa, const char *algo,
                             const cli_timing *t, const cli_traffic *m, int64_t l2)
{
    FILE *f = stdout;
    fputs("{\"algo\":", f);
    cli_json_string(f, algo);
    cli_json_shape(f, s, isa);
    fprintf(f, ",\"threads\":%lld", (long long)t->threads);
    fputs(",\"tile_q\":", f);
    cli_json_int(f, t->tile_q, t->tile_q > 0);
    fputs(",\"tile_kv\":", f);
    cli_json_int(f, t->tile_kv, t->tile_kv > 0);
    fprintf(f, ",\"l2_bytes\":%lld,\"resident\":%s,\"passes\":", (long long)l2,
            m->resident ? "true" : "false");
    cli_json_number(f, m->passes);
    json_bytes(f, "read_bytes", m->read_bytes);
    json_bytes(f, "write_bytes", m->write_bytes);
    json_bytes(f, "write_miss_bytes", m->write_miss_bytes);
    json_bytes(f, "traffic_bytes", m->read_bytes + m->write_bytes);
    if (m->s_bytes > 0)
        json_bytes(f, "s_bytes", m->s_bytes);
    fputs("}\n", f);
}

enum { MODEL_COLS = 9 };

static int bench_model(fa_context *ctx, const seq_row *proto, int n, int json)
{
    const int64_t l2 = cli_l2_bytes();
    const char *isa = fa_context_isa(ctx);
    char *cells = calloc((size_t)n * 2 * MODEL_COLS, CLI_CELL);
    if (!cells) {
        fprintf(stderr, "flashattn bench: out of memory\n");
        return CLI_EXIT_FAIL;
    }
    for (int r = 0; r < n; r++) {
        /* Only flash runs, once and untimed: its tiles and scratch decide its model. */
        cli_shape s = proto[r].shape;
        s.runs = 0;
        cli_timing flash, standard;
        bench_buffers b;
        if (buffers_make(&s, &b) != 0) {
            free(cells);
            return CLI_EXIT_FAIL;
        }
        int rc = cli_time_algo(ctx, &s, FA_ALGO_FLASH, &b.args, b.io.times, NULL, &flash, "bench");
        cli_timed_io_free(&b.io);
        if (rc != 0 || flash.oom) {
            if (flash.oom)
                fprintf(stderr, "flashattn bench: flash: out of memory\n");
            free(cells);
            return CLI_EXIT_FAIL;
        }
        memset(&standard, 0, sizeof standard);
        standard.algo = FA_ALGO_STANDARD;
        standard.threads = flash.threads;
        cli_traffic ft, st;
        cli_traffic_flash(&s, l2, flash.tile_q, workspace_per_thread(&flash), &ft);
        cli_traffic_standard(&s, l2, &st);
        if (json) {
            print_model_json(&s, isa, "flash", &flash, &ft, l2);
            print_model_json(&s, isa, "standard", &standard, &st, l2);
            continue;
        }
        const cli_timing *ts[2] = {&flash, &standard};
        const cli_traffic *ms[2] = {&ft, &st};
        for (int a = 0; a < 2; a++) {
            char *row[MODEL_COLS];
            for (int c = 0; c < MODEL_COLS; c++)
                row[c] = cli_cell(cells, MODEL_COLS, 2 * r + a, c);
            snprintf(row[0], CLI_CELL, "%s", a == 0 ? "flash" : "standard");
            snprintf(row[1], CLI_CELL, "%lld", (long long)s.seq);
            snprintf(row[2], CLI_CELL, "%lld", (long long)s.seq_kv);
            cli_tiles_cell(row[3], ts[a]);
            if (a == 0)
                snprintf(row[4], CLI_CELL, "%.4g K/V%s", ms[a]->passes,
                         ms[a]->resident ? " (in L2)" : "");
            else if (ms[a]->resident)
                snprintf(row[4], CLI_CELL, "0 (S in L2)");
            else
                snprintf(row[4], CLI_CELL, "%.0f S", ms[a]->passes);
            cli_format_bytes(row[5], CLI_CELL, ms[a]->read_bytes);
            cli_format_bytes(row[6], CLI_CELL, ms[a]->write_bytes);
            cli_format_bytes(row[7], CLI_CELL, ms[a]->write_miss_bytes);
            cli_format_bytes(row[8], CLI_CELL, ms[a]->read_bytes + ms[a]->write_bytes);
        }
    }
    if (!json) {
        static const char *const head[MODEL_COLS] = {"algo", "Sq", "Sk", "tiles", "reads of",
                                                     "read", "write", "write miss", "traffic"};
        static const int right[MODEL_COLS] = {0, 1, 1, 1, 1, 1, 1, 1, 1};
        char shape[CLI_CELL], l2s[32];
        cli_compact_shape(&proto[0].shape, 0, shape, sizeof shape);
        cli_format_bytes(l2s, sizeof l2s, (double)l2);
        printf("# traffic model (bench/README.md): bytes one call moves beyond a %s per-core L2, "
               "%s %s, isa %s; not timed\n", l2s, fa_dtype_name(proto[0].shape.dtype), shape, isa);
        cli_print_table(stdout, MODEL_COLS, head, right, 2 * n, cells);
    }
    free(cells);
    return CLI_EXIT_OK;
}

/* ------------------------------------------------------------------ verb */

/* argv[i] is `name` or `name=...`. */
static int is_flag(const char *arg, const char *name)
{
    size_t n = strlen(name);
    return strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

static int bench_main(int argc, char **argv, bench_mode_opts *m)
{
    cli_shape s = cli_shape_defaults();
    int json = 0, no_probe = 0, model_only = 0, warmup_only = 0, n_seqs = 0, seq_given = 0;
    int backward = 0, profile = 0;
    int64_t seqs[SEQS_MAX], cold_bytes = 0; /* -1: --cold without a size */
    const char *block_mask = NULL;
    int64_t block_size = BENCH_BLOCK_DEFAULT;
    const cli_switch switches[] = {{"--json", &json},
                                   {"--no-probe", &no_probe},
                                   {"--backward", &backward},
                                   {"--profile", &profile},
                                   {"--model-only", &model_only},
                                   {"--warmup-only", &warmup_only}};
    for (int i = 1; i < argc; i++) {
        const char *value = NULL;
        if (is_flag(argv[i], "--seq") || is_flag(argv[i], "--seq-kv"))
            seq_given = 1;
        if (cli_is_help(argv[i])) {
            bench_usage(stdout);
            return CLI_EXIT_OK;
        }
        if (cli_switch_flag(argv[i], switches, (int)(sizeof switches / sizeof switches[0])))
            continue;
        /* --cold alone is a switch, like --causal: its size only comes after '=' */
        if (strcmp(argv[i], "--cold") == 0) {
            cold_bytes = -1; /* twice the L2, or with --decode the last-level cache */
            continue;
        }
        if (strncmp(argv[i], "--cold=", 7) == 0) {
            if (cli_parse_i64(argv[i] + 7, &cold_bytes) != 0 || cold_bytes < 64) {
                fprintf(stderr, "flashattn bench: bad value '%s' for --cold (want bytes >= 64)\n",
                        argv[i] + 7);
                return CLI_EXIT_USAGE;
            }
            continue;
        }
        if (cli_take_value("--seqs", argc, argv, &i, &value)) {
            n_seqs = cli_parse_i64_list(value, 1, seqs, SEQS_MAX);
            if (n_seqs < 1) {
                fprintf(stderr, "flashattn bench: bad value '%s' for --seqs (want N,N,... with "
                                "each N >= 1, at most %d)\n", value ? value : "", SEQS_MAX);
                return CLI_EXIT_USAGE;
            }
            continue;
        }
        if (cli_take_value("--block-mask", argc, argv, &i, &value)) {
            if (!value) {
                fprintf(stderr, "flashattn bench: --block-mask needs a value\n");
                return CLI_EXIT_USAGE;
            }
            block_mask = value;
            continue;
        }
        if (cli_take_value("--block-size", argc, argv, &i, &value)) {
            if (!value || cli_parse_i64(value, &block_size) != 0 || block_size < 1 || block_size >= ((int64_t)1 << 31)) {
                fprintf(stderr, "flashattn bench: bad value '%s' for --block-size (want 1 .. 2^31 - 1)\n",
                        value ? value : "");
                return CLI_EXIT_USAGE;
            }
            continue;
        }
        int r = bench_mode_flag(m, argc, argv, &i);
        if (r == 0)
            r = cli_shape_flag(&s, argc, argv, &i, "bench");
        if (r < 0)
            return CLI_EXIT_USAGE;
        if (r == 0)
            return cli_unknown_arg("bench", argv[i], bench_usage);
    }
    if (n_seqs > 0 && s.algo_given) {
        fprintf(stderr, "flashattn bench: --seqs always compares flash with standard; "
                        "drop --algo\n");
        return CLI_EXIT_USAGE;
    }
    if (warmup_only && (n_seqs > 0 || model_only)) {
        fprintf(stderr, "flashattn bench: --warmup-only times one shape; it does not combine "
                        "with --seqs or --model-only\n");
        return CLI_EXIT_USAGE;
    }
    const int serving = m->decode || m->varlen_given || m->mixed;
    if (backward && (serving || model_only || warmup_only)) {
        fprintf(stderr, "flashattn bench: --backward does not combine with %s\n",
                m->decode || m->mixed ? "--decode or --mixed (KV caches are inference-only)"
                : m->varlen_given ? "--varlen"
                : model_only ? "--model-only (the traffic model is the forward's)"
                             : "--warmup-only");
        return CLI_EXIT_USAGE;
    }
    if ((m->decode || m->mixed) && s.dropout > 0.0) {
        fprintf(stderr, "flashattn bench: --dropout does not apply with --decode (KV caches "
                        "are inference-only)\n");
        return CLI_EXIT_USAGE;
    }
    if (serving && (n_seqs > 0 || model_only || warmup_only)) {
        fprintf(stderr, "flashattn bench: %s does not combine with --seqs, --model-only or "
                        "--warmup-only\n", m->decode ? "--decode" : m->mixed ? "--mixed" : "--varlen");
        return CLI_EXIT_USAGE;
    }
    if (m->warm && cold_bytes != 0) {
        fprintf(stderr, "flashattn bench: --warm and --cold contradict each other\n");
        return CLI_EXIT_USAGE;
    }
    if ((m->varlen_given || m->mixed) && cold_bytes != 0) {
        fprintf(stderr, "flashattn bench: %s times its calls warm; drop --cold\n", m->mixed ? "--mixed" : "--varlen");
        return CLI_EXIT_USAGE;
    }
    if (block_mask && (serving || backward || n_seqs > 0 || model_only || warmup_only || cold_bytes != 0)) {
        fprintf(stderr, "flashattn bench: --block-mask times one shape's forward, warm; it does not combine "
                        "with --decode, --varlen, --mixed, --backward, --seqs, --model-only, --warmup-only or "
                        "--cold\n");
        return CLI_EXIT_USAGE;
    }
    if (profile && (m->varlen_given || m->mixed || block_mask || n_seqs > 0 || model_only || warmup_only)) {
        fprintf(stderr, "flashattn bench: --profile splits one timed shape's flash call (the one-shape bench, "
                        "--backward or --decode); it does not combine with %s\n",
                m->varlen_given ? "--varlen" : m->mixed ? "--mixed" : block_mask ? "--block-mask"
                : n_seqs > 0 ? "--seqs" : model_only ? "--model-only" : "--warmup-only");
        return CLI_EXIT_USAGE;
    }
    if (bench_mode_finish(m, &s, seq_given) != 0)
        return CLI_EXIT_USAGE;
    if (n_seqs > 0 && !s.runs_given)
        s.runs = SEQS_DEFAULT_RUNS;
    if (cli_shape_finish(&s, "bench") != 0)
        return CLI_EXIT_USAGE;
    if (cold_bytes < 0 && !m->decode)
        cold_bytes = 2 * cli_l2_bytes();
    if (block_mask) {
        fa_context *bctx = NULL;
        if (cli_context_make(&s, "bench", &bctx) != 0)
            return CLI_EXIT_FAIL;
        const int status = bench_block_mask(bctx, &s, block_mask, block_size, json, no_probe);
        fa_context_free(bctx);
        return status;
    }
    if (serving) {
        fa_context *sctx = NULL;
        if (cli_context_make(&s, "bench", &sctx) != 0)
            return CLI_EXIT_FAIL;
        fa_status st = m->kv_splits_given ? fa_context_set(sctx, FA_PARAM_KV_SPLITS, m->kv_splits)
                                          : FA_OK;
        int status;
        if (st != FA_OK) {
            fprintf(stderr, "flashattn bench: setting kv splits: %s: %s\n", fa_status_string(st),
                    fa_context_error(sctx));
            status = CLI_EXIT_FAIL;
        } else if (m->mixed) {
            status = bench_mixed(sctx, &s, m, json);
        } else if (m->decode) {
            status = bench_decode(sctx, &s, m, json, no_probe, cold_bytes < 0 ? 0 : cold_bytes, profile);
        } else {
            status = bench_varlen(sctx, &s, m, json, no_probe);
        }
        fa_context_free(sctx);
        return status;
    }

    /* One row per shape: the --seqs lengths, or the shape as given. Each is
     * checked now, so a bad length fails before minutes of timing. */
    seq_row rows[SEQS_MAX];
    int n_rows = n_seqs > 0 ? n_seqs : 1;
    memset(rows, 0, sizeof rows);
    for (int r = 0; r < n_rows; r++) {
        rows[r].shape = s;
        if (n_seqs > 0) {
            rows[r].shape.seq = rows[r].shape.seq_kv = seqs[r];
            if (cli_shape_finish(&rows[r].shape, "bench") != 0)
                return CLI_EXIT_USAGE;
        }
    }

    fa_context *ctx = NULL;
    cli_flush flush = {NULL, 0, 0};
    if (cold_bytes > 0 && !model_only && cli_flush_make(&flush, cold_bytes) != 0)
        return CLI_EXIT_FAIL;
    if (cli_context_make(&s, "bench", &ctx) != 0) {
        cli_flush_free(&flush);
        return CLI_EXIT_FAIL;
    }
    if (m->kv_splits_given && fa_context_set(ctx, FA_PARAM_KV_SPLITS, m->kv_splits) != FA_OK) {
        fprintf(stderr, "flashattn bench: setting kv splits: %s\n", fa_context_error(ctx));
        fa_context_free(ctx);
        cli_flush_free(&flush);
        return CLI_EXIT_FAIL;
    }
    cli_flush *fl = flush.buf ? &flush : NULL;
    int status;
    if (model_only) {
        status = bench_model(ctx, rows, n_rows, json);
    } else if (warmup_only) {
        s.runs = 0;
        status = bench_single(ctx, &s, json, NULL, fl, 0);
    } else {
        cli_peak peak;
        /* The backward takes bf16 pairs exactly where the forward does (the library's
         * rule), so both are measured against the same peak. */
        cli_measure_peak(ctx, s.dtype, no_probe, &peak);
        if (backward && n_seqs > 0) {
            cli_shape shapes[SEQS_MAX];
            for (int r = 0; r < n_rows; r++)
                shapes[r] = rows[r].shape;
            status = bench_backward_seqs(ctx, shapes, n_rows, json, &peak, fl);
        } else if (backward) {
            status = bench_backward(ctx, &s, json, &peak, fl, profile);
        } else {
            status = n_seqs > 0 ? bench_seqs(ctx, rows, n_rows, json, &peak, fl)
                                : bench_single(ctx, &s, json, &peak, fl, profile);
        }
    }
    fa_context_free(ctx);
    cli_flush_free(&flush);
    return status;
}

int cmd_bench(int argc, char **argv)
{
    bench_mode_opts m;
    bench_mode_defaults(&m);
    int status = bench_main(argc, argv, &m);
    bench_mode_free(&m);
    return status;
}
