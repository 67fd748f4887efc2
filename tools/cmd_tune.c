/*
 * cmd_tune.c: `flashattn tune`: a shell over fa_tune, which times flash over a
 * grid of tile sizes on one shape (FA_PARAM_TILE_Q x FA_PARAM_TILE_KV) and with
 * the library's heuristic plan, and saves the best pair in the tune file
 * (docs/tool.md, "The tune file"). This verb only parses the flags, shows progress
 * on a terminal, and prints the pairs fastest first, the best one, the planned
 * one and where the best was saved. The file's format, path and key are the
 * library's alone.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flashattn.h"
#include "measure.h"
#include "shape.h"

int cmd_tune(int argc, char **argv);

static void tune_usage(FILE *f)
{
    cli_shape d = cli_shape_defaults();
    d.runs = FA_TUNE_DEFAULT_RUNS;
    d.algo = FA_ALGO_FLASH;
    fprintf(f, "usage: flashattn tune [--no-save] [shape flags]\n\n"
               "Times flash with tile_q in {16,32,64,128,256} x tile_kv in {32,64,128,256,512}\n"
               "(query rows x key/value rows per tile) and with the library's planned tiles;\n"
               "each: one warm-up, then --runs timed runs (default %d), median. Prints the\n"
               "configurations fastest first, the best pair and the planned pair's time.\n"
               "Tiles are shown as the library used them (FA_PARAM_LAST_TILE_Q/_KV): a tile\n"
               "larger than the sequence is clamped to it, and a pair that ends up the same\n"
               "as one already timed is listed once. --tile-q or --tile-kv pins that side of\n"
               "the grid. Flash only: --algo other than flash is an error. \"planned\" is\n"
               "the library's heuristic: an existing tune file is not read while tuning.\n\n"
               "The best pair is saved in the tune file, replacing the entry of the same\n"
               "CPU, ISA path, dtype, head dims, length buckets and masking and keeping the\n"
               "others: $FLASHATTN_TUNE_FILE, else $XDG_CACHE_HOME/flashattn/tune.txt, else\n"
               "$HOME/.cache/flashattn/tune.txt (FLASHATTN_TUNE_FILE= empty turns tuned\n"
               "tiles off). Later contexts use it for calls of that class at any thread\n"
               "count. --no-save only prints. Progress goes to stderr on a terminal.\n"
               "The sweep is the library's fa_tune (include/flashattn.h).\n\n",
            FA_TUNE_DEFAULT_RUNS);
    cli_shape_usage(f, &d);
}

/* "[12/26] 64x128: 1.234 ms" on stderr after each candidate, on a terminal. */
static void tune_progress(void *user, int done, int total, int64_t tq, int64_t tkv, double ms)
{
    (void)user;
    if (isnan(ms))
        fprintf(stderr, "\r[%d/%d] %lldx%lld: out of memory     ", done, total, (long long)tq, (long long)tkv);
    else
        fprintf(stderr, "\r[%d/%d] %lldx%lld: %.3f ms     ", done, total, (long long)tq, (long long)tkv, ms);
    fflush(stderr);
}

enum { TUNE_COLS = 6 };

/* The table, fastest first (fa_tune's order), and the planned and best lines. */
static void print_results(const cli_shape *s, const char *isa, const fa_tune_result *r)
{
    const double flops = cli_flops(s);
    const double planned_ms = r->heuristic.ms; /* NaN: out of memory */
    char shape[256];
    cli_shape_describe(s, shape, sizeof shape);
    printf("# flashattn %s tune: flash, %s %s, isa %s, %lld thread%s; median of %lld runs after "
           "1 warm-up per pair\n",
           fa_version_string(), fa_dtype_name(s->dtype), shape, isa, (long long)r->threads,
           r->threads == 1 ? "" : "s", (long long)r->runs);

    static const char *const head[TUNE_COLS] = {"rank", "tiles", "median ms", "GFLOP/s", "vs planned", "note"};
    static const int right[TUNE_COLS] = {1, 1, 1, 1, 1, 0};
    const int n = r->n_timings;
    char *cells = calloc((size_t)n * TUNE_COLS, CLI_CELL);
    if (!cells) {
        fprintf(stderr, "flashattn tune: out of memory\n");
        return;
    }
    for (int i = 0; i < n; i++) {
        const fa_tune_timing *t = &r->timings[i];
        const int oom = isnan(t->ms);
        snprintf(cli_cell(cells, TUNE_COLS, i, 0), CLI_CELL, "%d", i + 1);
        snprintf(cli_cell(cells, TUNE_COLS, i, 1), CLI_CELL, "%lldx%lld", (long long)t->tile_q, (long long)t->tile_kv);
        if (oom)
            snprintf(cli_cell(cells, TUNE_COLS, i, 2), CLI_CELL, "out of memory");
        else
            snprintf(cli_cell(cells, TUNE_COLS, i, 2), CLI_CELL, "%.3f", t->ms);
        snprintf(cli_cell(cells, TUNE_COLS, i, 3), CLI_CELL, oom ? "-" : "%.2f", flops / t->ms * 1e-6);
        if (oom || isnan(planned_ms))
            snprintf(cli_cell(cells, TUNE_COLS, i, 4), CLI_CELL, "-");
        else
            snprintf(cli_cell(cells, TUNE_COLS, i, 4), CLI_CELL, "%.2fx", planned_ms / t->ms);
        snprintf(cli_cell(cells, TUNE_COLS, i, 5), CLI_CELL, "%s",
                 t->asked_q == 0 && t->asked_kv == 0 ? "planned" : "");
    }
    cli_print_table(stdout, TUNE_COLS, head, right, n, cells);
    free(cells);

    const fa_tune_timing *best = &r->best;
    if (!isnan(planned_ms))
        printf("planned %lldx%lld: %.3f ms\n", (long long)r->heuristic.tile_q, (long long)r->heuristic.tile_kv,
               planned_ms);
    printf("best %lldx%lld: %.3f ms", (long long)best->tile_q, (long long)best->tile_kv, best->ms);
    if (!isnan(planned_ms))
        printf(", %.2fx the planned tiles' speed", planned_ms / best->ms);
    printf(" (--tile-q %lld --tile-kv %lld)\n", (long long)best->tile_q, (long long)best->tile_kv);
}

/* Where the best went: "saved ..." on stdout, or why not on stderr. */
static void print_saved(const fa_tune_result *r, int save)
{
    if (r->saved) {
        printf("saved %lldx%lld", (long long)r->saved_tile_q, (long long)r->saved_tile_kv);
        if (r->saved_tile_q != r->best.tile_q || r->saved_tile_kv != r->best.tile_kv)
            printf(" (ran as %lldx%lld: clamped to this shape)", (long long)r->best.tile_q,
                   (long long)r->best.tile_kv);
        printf(" to %s for %s cpu=%s\n", r->path, r->key, r->cpu);
        if (r->note[0])
            fprintf(stderr, "flashattn tune: %s: %s\n", r->path, r->note);
    } else if (save && !r->path[0]) {
        fprintf(stderr, "flashattn tune: tune file %s: not saving\n", r->note);
    }
}

/* The flags; -1 usage error (reported), 1 --help printed, 0 go on. */
static int parse_flags(int argc, char **argv, cli_shape *s, int *save)
{
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            tune_usage(stdout);
            return 1;
        }
        if (strcmp(argv[i], "--no-save") == 0) {
            *save = 0;
            continue;
        }
        int r = cli_shape_flag(s, argc, argv, &i, "tune");
        if (r < 0)
            return -1;
        if (r == 0) {
            cli_unknown_arg("tune", argv[i], tune_usage);
            return -1;
        }
    }
    if (s->algo_given && s->algo != FA_ALGO_FLASH) {
        fprintf(stderr, "flashattn tune: tiles are flash's; --algo %s cannot be tuned\n", fa_algo_name(s->algo));
        return -1;
    }
    if (!s->runs_given)
        s->runs = FA_TUNE_DEFAULT_RUNS;
    return cli_shape_finish(s, "tune") != 0 ? -1 : 0;
}

int cmd_tune(int argc, char **argv)
{
    cli_shape s = cli_shape_defaults();
    int save = 1;
    const int parsed = parse_flags(argc, argv, &s, &save);
    if (parsed != 0)
        return parsed > 0 ? CLI_EXIT_OK : CLI_EXIT_USAGE;

    /* A pinned side is a grid of one; the context starts on the plan. */
    fa_tune_options opt = FA_TUNE_OPTIONS_INIT;
    const int64_t pin_q = s.tile_q, pin_kv = s.tile_kv;
    if (pin_q > 0) {
        opt.tile_qs = &pin_q;
        opt.n_tile_qs = 1;
    }
    if (pin_kv > 0) {
        opt.tile_kvs = &pin_kv;
        opt.n_tile_kvs = 1;
    }
    s.tile_q = s.tile_kv = 0;
    opt.runs = s.runs;
    opt.save = save;
    const int progress = isatty(STDERR_FILENO);
    if (progress)
        opt.progress = tune_progress;

    int status = CLI_EXIT_FAIL;
    fa_context *ctx = NULL;
    cli_inputs in = {0};
    void *o = NULL;
    fa_tune_result *r = calloc(1, sizeof *r);
    if (!r || cli_context_make(&s, "tune", &ctx) != 0 || cli_inputs_make(&s, &in) != 0)
        goto done;
    o = cli_alloc(in.o_elems, fa_dtype_size(s.dtype));
    if (!o) {
        fprintf(stderr, "flashattn tune: out of memory allocating the output\n");
        goto done;
    }
    fa_forward_args args = cli_forward_args(&s, &in, o, s.dtype, NULL);
    r->struct_size = sizeof *r;
    const fa_status st = fa_tune(ctx, &args, &opt, r);
    if (progress)
        fprintf(stderr, "\r%*s\r", 48, ""); /* the progress line is gone */
    if (st == FA_OK || (st == FA_ERR_IO && r->n_timings > 0)) {
        print_results(&s, fa_context_isa(ctx), r);
        print_saved(r, save);
    }
    if (st != FA_OK)
        fprintf(stderr, "flashattn tune: %s: %s\n", fa_status_string(st), fa_context_error(ctx));
    else
        status = CLI_EXIT_OK;

done:
    free(r);
    cli_free(o);
    cli_inputs_free(&in);
    fa_context_free(ctx);
    return status;
}
