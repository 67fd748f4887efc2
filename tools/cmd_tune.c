/*
 * cmd_tune.c: `flashattn tune`: times flash over a grid of tile sizes on one
 * shape (FA_PARAM_TILE_Q x FA_PARAM_TILE_KV) and prints the pairs fastest
 * first, the best one, and how the library's own plan (both set to 0) compares.
 * What it finds is for this machine, shape and thread count only; a pair is
 * applied with --tile-q/--tile-kv on bench and check, or fa_context_set.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "measure.h"
#include "shape.h"

int cmd_tune(int argc, char **argv);

static const int64_t tile_qs[] = {16, 32, 64, 128, 256};
static const int64_t tile_kvs[] = {32, 64, 128, 256, 512};
enum {
    N_TQ = sizeof tile_qs / sizeof tile_qs[0],
    N_TKV = sizeof tile_kvs / sizeof tile_kvs[0],
    MAX_PAIRS = N_TQ * N_TKV + 1, /* + the planned pair */
    TUNE_DEFAULT_RUNS = 3         /* 26 configurations: keep the default sweep in minutes */
};

static void tune_usage(FILE *f)
{
    cli_shape d = cli_shape_defaults();
    d.runs = TUNE_DEFAULT_RUNS;
    d.algo = FA_ALGO_FLASH;
    fprintf(f, "usage: flashattn tune [shape flags]\n\n"
               "Times flash with tile_q in {16,32,64,128,256} x tile_kv in {32,64,128,256,512}\n"
               "(query rows x key/value rows per tile) and with the library's planned tiles;\n"
               "each: one warm-up, then --runs timed runs (default %d), median. Prints the\n"
               "configurations fastest first, the best pair and the planned pair's time.\n"
               "Tiles are shown as the library used them (FA_PARAM_LAST_TILE_Q/_KV): a tile\n"
               "larger than the sequence is clamped to it, and a pair that ends up the same\n"
               "as one already timed is listed once. --tile-q or --tile-kv pins that side of\n"
               "the grid. Flash only: --algo other than flash is an error.\n\n",
            TUNE_DEFAULT_RUNS);
    cli_shape_usage(f, &d);
}

typedef struct tune_pair {
    cli_timing t;
    int planned; /* ran with both tiles 0 */
} tune_pair;

static int by_time(const void *a, const void *b)
{
    const tune_pair *x = a, *y = b;
    if (x->t.oom != y->t.oom)
        return x->t.oom - y->t.oom; /* out of memory sorts last */
    return (x->t.median_s > y->t.median_s) - (x->t.median_s < y->t.median_s);
}

/* Times flash with the given tiles into *p. 0, or -1 on a library error (reported). */
static int time_pair(fa_context *ctx, const cli_shape *s, const fa_forward_args *args,
                     double *times, int64_t tq, int64_t tkv, tune_pair *p)
{
    fa_status st = fa_context_set(ctx, FA_PARAM_TILE_Q, tq);
    if (st == FA_OK)
        st = fa_context_set(ctx, FA_PARAM_TILE_KV, tkv);
    if (st != FA_OK) {
        fprintf(stderr, "flashattn tune: setting tiles %lldx%lld: %s: %s\n", (long long)tq,
                (long long)tkv, fa_status_string(st), fa_context_error(ctx));
        return -1;
    }
    p->planned = tq == 0 && tkv == 0;
    return cli_time_algo(ctx, s, FA_ALGO_FLASH, args, times, NULL, &p->t, "tune");
}

static int same_tiles(const tune_pair *a, const tune_pair *b)
{
    return a->t.tile_q == b->t.tile_q && a->t.tile_kv == b->t.tile_kv;
}

enum { TUNE_COLS = 6 };

static void print_results(const cli_shape *s, const char *isa, tune_pair *pairs, int n)
{
    const double flops = cli_flops(s);
    const tune_pair *planned = NULL;
    for (int i = 0; i < n; i++)
        if (pairs[i].planned)
            planned = &pairs[i];
    /* Sorting moves the planned entry: remember its time first. */
    const double planned_s = planned && !planned->t.oom ? planned->t.median_s : NAN;
    const int64_t planned_q = planned ? planned->t.tile_q : 0;
    const int64_t planned_kv = planned ? planned->t.tile_kv : 0;
    qsort(pairs, (size_t)n, sizeof *pairs, by_time);

    char shape[256];
    cli_shape_describe(s, shape, sizeof shape);
    printf("# flashattn %s tune: flash, %s %s, isa %s, %lld thread%s; median of %lld runs after "
           "1 warm-up per pair\n",
           fa_version_string(), fa_dtype_name(s->dtype), shape, isa,
           (long long)pairs[0].t.threads, pairs[0].t.threads == 1 ? "" : "s", (long long)s->runs);

    static const char *const head[TUNE_COLS] = {"rank", "tiles", "median ms", "GFLOP/s",
                                                "vs planned", "note"};
    static const int right[TUNE_COLS] = {1, 1, 1, 1, 1, 0};
    char *cells = calloc((size_t)n * TUNE_COLS, CLI_CELL);
    if (!cells) {
        fprintf(stderr, "flashattn tune: out of memory\n");
        return;
    }
    for (int r = 0; r < n; r++) {
        const cli_timing *t = &pairs[r].t;
        char *row[TUNE_COLS];
        for (int c = 0; c < TUNE_COLS; c++)
            row[c] = cells + ((size_t)r * TUNE_COLS + (size_t)c) * CLI_CELL;
        snprintf(row[0], CLI_CELL, "%d", r + 1);
        snprintf(row[1], CLI_CELL, "%lldx%lld", (long long)t->tile_q, (long long)t->tile_kv);
        if (t->oom) {
            snprintf(row[2], CLI_CELL, "out of memory");
            snprintf(row[3], CLI_CELL, "-");
            snprintf(row[4], CLI_CELL, "-");
        } else {
            snprintf(row[2], CLI_CELL, "%.3f", t->median_s * 1e3);
            snprintf(row[3], CLI_CELL, "%.2f", flops / t->median_s * 1e-9);
            if (isfinite(planned_s))
                snprintf(row[4], CLI_CELL, "%.2fx", planned_s / t->median_s);
            else
                snprintf(row[4], CLI_CELL, "-");
        }
        snprintf(row[5], CLI_CELL, "%s", pairs[r].planned ? "planned" : "");
    }
    cli_print_table(stdout, TUNE_COLS, head, right, n, cells);
    free(cells);

    const cli_timing *best = &pairs[0].t;
    if (isfinite(planned_s))
        printf("planned %lldx%lld: %.3f ms\n", (long long)planned_q, (long long)planned_kv,
               planned_s * 1e3);
    if (best->oom) {
        printf("best: none ran (out of memory)\n");
    } else {
        printf("best %lldx%lld: %.3f ms", (long long)best->tile_q, (long long)best->tile_kv,
               best->median_s * 1e3);
        if (isfinite(planned_s))
            printf(", %.2fx the planned tiles' speed", planned_s / best->median_s);
        printf(" (--tile-q %lld --tile-kv %lld)\n", (long long)best->tile_q,
               (long long)best->tile_kv);
    }
}

int cmd_tune(int argc, char **argv)
{
    cli_shape s = cli_shape_defaults();
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            tune_usage(stdout);
            return CLI_EXIT_OK;
        }
        int r = cli_shape_flag(&s, argc, argv, &i, "tune");
        if (r < 0)
            return CLI_EXIT_USAGE;
        if (r == 0) {
            fprintf(stderr, "flashattn tune: unknown argument '%s'\n\n", argv[i]);
            tune_usage(stderr);
            return CLI_EXIT_USAGE;
        }
    }
    if (s.algo_given && s.algo != FA_ALGO_FLASH) {
        fprintf(stderr, "flashattn tune: tiles are flash's; --algo %s cannot be tuned\n",
                fa_algo_name(s.algo));
        return CLI_EXIT_USAGE;
    }
    if (!s.runs_given)
        s.runs = TUNE_DEFAULT_RUNS;
    if (cli_shape_finish(&s, "tune") != 0)
        return CLI_EXIT_USAGE;

    /* The grid, or one side of it pinned; the context starts on the plan. */
    const int64_t pin_q = s.tile_q, pin_kv = s.tile_kv;
    s.tile_q = s.tile_kv = 0;

    int status = CLI_EXIT_FAIL;
    fa_context *ctx = NULL;
    cli_inputs in = {0};
    void *o = NULL;
    double *times = NULL;
    tune_pair pairs[MAX_PAIRS];
    int n = 0;

    if (cli_context_make(&s, "tune", &ctx) != 0)
        return CLI_EXIT_FAIL;
    if (cli_inputs_make(&s, &in) != 0)
        goto done;
    o = cli_alloc(in.o_elems, fa_dtype_size(s.dtype));
    times = cli_alloc(s.runs, sizeof *times);
    if (!o || !times) {
        fprintf(stderr, "flashattn tune: out of memory allocating the output\n");
        goto done;
    }
    fa_forward_args args = cli_forward_args(&s, &in, o, s.dtype, NULL);

    /* The plan first, so a grid pair the library would have chosen anyway is
     * shown as the planned one rather than twice. */
    if (time_pair(ctx, &s, &args, times, 0, 0, &pairs[n]) != 0)
        goto done;
    n++;
    for (int a = 0; a < N_TQ; a++) {
        for (int b = 0; b < N_TKV; b++) {
            const int64_t tq = pin_q > 0 ? pin_q : tile_qs[a];
            const int64_t tkv = pin_kv > 0 ? pin_kv : tile_kvs[b];
            if ((pin_q > 0 && a > 0) || (pin_kv > 0 && b > 0))
                continue; /* a pinned side runs once */
            if (time_pair(ctx, &s, &args, times, tq, tkv, &pairs[n]) != 0)
                goto done;
            int dup = 0;
            for (int k = 0; k < n && !dup; k++)
                dup = !pairs[n].t.oom && same_tiles(&pairs[k], &pairs[n]);
            if (!dup)
                n++;
        }
    }
    print_results(&s, fa_context_isa(ctx), pairs, n);
    status = CLI_EXIT_OK;

done:
    cli_free(times);
    cli_free(o);
    cli_inputs_free(&in);
    fa_context_free(ctx);
    return status;
}
