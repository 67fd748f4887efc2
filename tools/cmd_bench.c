/*
 * cmd_bench.c: `flashattn bench`: times the algorithms on one shape through
 * the public API and reports median latency, GFLOP/s, the extra memory each
 * call allocated and the speed-up over the standard (materialise S) baseline.
 *
 * FLOPs follow STYLE.md rule 10: 2*(D+Dv) per (i, j) pair the mask keeps,
 * times B*Hq, so masked variants are credited only for the work they must do.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "shape.h"

int cmd_bench(int argc, char **argv);

/* The reference is fp64 and single-threaded; above this it takes too long to
 * be part of a default run (it can still be asked for with --algo reference). */
#define REFERENCE_MAX_FLOPS 2e9

static void bench_usage(FILE *f)
{
    cli_shape d = cli_shape_defaults();
    fprintf(f, "usage: flashattn bench [shape flags] [--json]\n\n"
               "Times flash and standard, and reference when a call is at most 2 GFLOP,\n"
               "or only --algo when given. Each: one warm-up, then --runs timed runs;\n"
               "reports the median. GFLOP/s = 2*(D+Dv) * kept (i,j) pairs * B * Hq / time.\n"
               "  --json             one JSON object per line per algorithm, fields first:\n"
               "                     algo isa dtype B Hq Hk Sq Sk D Dv causal threads\n"
               "                     median_ms gflops extra_bytes\n\n");
    cli_shape_usage(f, &d);
}

/*
 * (i, j) pairs kept by causal and window, per SEMANTICS.md step 5: row i keeps
 * the contiguous columns lo..hi, so each row is counted in closed form.
 */
static int64_t kept_pairs(const cli_shape *s)
{
    const int64_t sq = s->seq, sk = s->seq_kv, off = sk - sq;
    int64_t total = 0;
    for (int64_t i = 0; i < sq; i++) {
        int64_t lo = 0, hi = sk - 1;
        if (s->window_left >= 0 && i + off - s->window_left > lo)
            lo = i + off - s->window_left;
        if (s->window_right >= 0 && i + off + s->window_right < hi)
            hi = i + off + s->window_right;
        if (s->causal == FA_CAUSAL_BOTTOM_RIGHT && i + off < hi)
            hi = i + off;
        if (s->causal == FA_CAUSAL_TOP_LEFT && i < hi)
            hi = i;
        if (hi >= lo)
            total += hi - lo + 1;
    }
    return total;
}

typedef struct bench_row {
    fa_algo algo;        /* what ran (auto resolves to a concrete algorithm) */
    int oom;             /* a call returned FA_ERR_OUT_OF_MEMORY */
    double median_s;
    int64_t extra_bytes; /* the largest over the timed runs */
    int64_t threads;     /* threads the algorithm used */
} bench_row;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* 0 done (row->oom may be set), -1 a library error, already reported. */
static int bench_one(fa_context *ctx, const cli_shape *s, fa_algo algo,
                     const fa_forward_args *args, double *times, bench_row *row)
{
    memset(row, 0, sizeof *row);
    row->algo = algo;
    fa_status st = fa_context_set(ctx, FA_PARAM_ALGO, algo);
    for (int64_t r = -1; st == FA_OK && r < s->runs; r++) { /* r = -1: the warm-up */
        double t0 = cli_now();
        st = fa_forward(ctx, args);
        double t = cli_now() - t0;
        if (st != FA_OK)
            break;
        if (r < 0)
            continue;
        times[r] = t;
        int64_t extra = 0;
        if (fa_context_get(ctx, FA_PARAM_LAST_EXTRA_BYTES, &extra) == FA_OK &&
            extra > row->extra_bytes)
            row->extra_bytes = extra;
    }
    if (st == FA_ERR_OUT_OF_MEMORY) {
        row->oom = 1;
        return 0;
    }
    if (st != FA_OK) {
        fprintf(stderr, "flashattn bench: %s failed: %s: %s\n", fa_algo_name(algo),
                fa_status_string(st), fa_context_error(ctx));
        return -1;
    }
    int64_t ran = algo;
    if (fa_context_get(ctx, FA_PARAM_LAST_ALGO, &ran) == FA_OK)
        row->algo = (fa_algo)ran;
    qsort(times, (size_t)s->runs, sizeof *times, cmp_double);
    int64_t m = s->runs / 2;
    row->median_s = (s->runs % 2) ? times[m] : 0.5 * (times[m - 1] + times[m]);
    /* The reference ignores the thread setting; say what it really used. */
    row->threads = row->algo == FA_ALGO_REFERENCE ? 1 : cli_resolved_threads(s->threads);
    return 0;
}

/* A JSON string literal; the library's names are plain ASCII, but a quote or
 * a control character must still never break the line. */
static void json_string(FILE *f, const char *text)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static void json_number(FILE *f, double x)
{
    if (isfinite(x))
        fprintf(f, "%.6g", x);
    else
        fputs("null", f); /* JSON has no inf or NaN */
}

static void print_json(const cli_shape *s, const char *isa, const bench_row *row, double flops,
                       double standard_s)
{
    FILE *f = stdout;
    fputs("{\"algo\":", f);
    json_string(f, fa_algo_name(row->algo));
    fputs(",\"isa\":", f);
    json_string(f, isa);
    fputs(",\"dtype\":", f);
    json_string(f, fa_dtype_name(s->dtype));
    fprintf(f, ",\"B\":%lld,\"Hq\":%lld,\"Hk\":%lld,\"Sq\":%lld,\"Sk\":%lld,\"D\":%lld,\"Dv\":%lld",
            (long long)s->batch, (long long)s->heads, (long long)s->kv_heads, (long long)s->seq,
            (long long)s->seq_kv, (long long)s->dim, (long long)s->dim_v);
    fputs(",\"causal\":", f);
    json_string(f, cli_causal_name(s->causal));
    fprintf(f, ",\"threads\":%lld", (long long)(row->oom ? cli_resolved_threads(s->threads)
                                                         : row->threads));
    if (row->oom) {
        fputs(",\"median_ms\":null,\"gflops\":null,\"extra_bytes\":null", f);
    } else {
        fputs(",\"median_ms\":", f);
        json_number(f, row->median_s * 1e3);
        fputs(",\"gflops\":", f);
        json_number(f, flops / row->median_s * 1e-9);
        fprintf(f, ",\"extra_bytes\":%lld", (long long)row->extra_bytes);
    }
    fprintf(f, ",\"window_left\":%lld,\"window_right\":%lld,\"runs\":%lld,\"flops\":",
            (long long)s->window_left, (long long)s->window_right, (long long)s->runs);
    json_number(f, flops);
    fputs(",\"speedup_vs_standard\":", f);
    json_number(f, (!row->oom && standard_s > 0) ? standard_s / row->median_s : NAN);
    if (row->oom)
        fputs(",\"error\":\"out of memory\"", f);
    fputs("}\n", f);
}

enum { COLS = 9, CELL = 96 };

static void print_table(const cli_shape *s, const char *isa, const bench_row *rows, int n,
                        double flops, double standard_s)
{
    static const char *head[COLS] = {"algo", "isa", "dtype", "shape", "threads",
                                     "median ms", "GFLOP/s", "extra MiB", "vs standard"};
    /* Text columns align left, numbers right. */
    static const int right[COLS] = {0, 0, 0, 0, 1, 1, 1, 1, 1};
    char cell[8][COLS][CELL];
    int width[COLS];

    /* Compact shape: a pair is written once when both sides agree. */
    char shape[CELL];
    char hs[40], ss[48], ds[48];
    if (s->heads == s->kv_heads)
        snprintf(hs, sizeof hs, "%lld", (long long)s->heads);
    else
        snprintf(hs, sizeof hs, "%lld/%lld", (long long)s->heads, (long long)s->kv_heads);
    if (s->seq == s->seq_kv)
        snprintf(ss, sizeof ss, "%lld", (long long)s->seq);
    else
        snprintf(ss, sizeof ss, "%lld/%lld", (long long)s->seq, (long long)s->seq_kv);
    if (s->dim == s->dim_v)
        snprintf(ds, sizeof ds, "%lld", (long long)s->dim);
    else
        snprintf(ds, sizeof ds, "%lld/%lld", (long long)s->dim, (long long)s->dim_v);
    int w = snprintf(shape, sizeof shape, "B%lld H%s S%s D%s", (long long)s->batch, hs, ss, ds);
    if (w > 0 && w < CELL && s->causal != FA_CAUSAL_NONE)
        w += snprintf(shape + w, sizeof shape - (size_t)w, " causal=%s", cli_causal_name(s->causal));
    if (w > 0 && w < CELL &&
        (s->window_left != FA_WINDOW_UNBOUNDED || s->window_right != FA_WINDOW_UNBOUNDED))
        snprintf(shape + w, sizeof shape - (size_t)w, " win=%lld,%lld", (long long)s->window_left,
                 (long long)s->window_right);

    for (int c = 0; c < COLS; c++)
        width[c] = (int)strlen(head[c]);
    for (int r = 0; r < n && r < 8; r++) {
        const bench_row *row = &rows[r];
        snprintf(cell[r][0], CELL, "%s", fa_algo_name(row->algo));
        snprintf(cell[r][1], CELL, "%s", isa);
        snprintf(cell[r][2], CELL, "%s", fa_dtype_name(s->dtype));
        snprintf(cell[r][3], CELL, "%s", shape);
        if (row->oom) {
            snprintf(cell[r][4], CELL, "%lld", (long long)cli_resolved_threads(s->threads));
            snprintf(cell[r][5], CELL, "out of memory");
            for (int c = 6; c < COLS; c++)
                snprintf(cell[r][c], CELL, "-");
        } else {
            snprintf(cell[r][4], CELL, "%lld", (long long)row->threads);
            snprintf(cell[r][5], CELL, "%.3f", row->median_s * 1e3);
            snprintf(cell[r][6], CELL, "%.2f", flops / row->median_s * 1e-9);
            snprintf(cell[r][7], CELL, "%.2f", (double)row->extra_bytes / (1024.0 * 1024.0));
            if (standard_s > 0)
                snprintf(cell[r][8], CELL, "%.2fx", standard_s / row->median_s);
            else
                snprintf(cell[r][8], CELL, "-");
        }
        for (int c = 0; c < COLS; c++)
            if ((int)strlen(cell[r][c]) > width[c])
                width[c] = (int)strlen(cell[r][c]);
    }
    for (int c = 0; c < COLS; c++)
        printf("%s%*s", c ? "  " : "", right[c] ? width[c] : -width[c], head[c]);
    printf("\n");
    for (int r = 0; r < n && r < 8; r++) {
        for (int c = 0; c < COLS; c++)
            printf("%s%*s", c ? "  " : "", right[c] ? width[c] : -width[c], cell[r][c]);
        printf("\n");
    }
}

int cmd_bench(int argc, char **argv)
{
    cli_shape s = cli_shape_defaults();
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            bench_usage(stdout);
            return CLI_EXIT_OK;
        }
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
            continue;
        }
        int r = cli_shape_flag(&s, argc, argv, &i, "bench");
        if (r < 0)
            return CLI_EXIT_USAGE;
        if (r == 0) {
            fprintf(stderr, "flashattn bench: unknown argument '%s'\n\n", argv[i]);
            bench_usage(stderr);
            return CLI_EXIT_USAGE;
        }
    }
    if (cli_shape_finish(&s, "bench") != 0)
        return CLI_EXIT_USAGE;

    const double flops = 2.0 * (double)(s.dim + s.dim_v) * (double)kept_pairs(&s) *
                         (double)s.batch * (double)s.heads;
    fa_algo algos[3];
    int n_algos = 0;
    int reference_skipped = 0;
    if (s.algo_given) {
        algos[n_algos++] = s.algo;
    } else {
        algos[n_algos++] = FA_ALGO_FLASH;
        algos[n_algos++] = FA_ALGO_STANDARD;
        if (flops <= REFERENCE_MAX_FLOPS)
            algos[n_algos++] = FA_ALGO_REFERENCE;
        else
            reference_skipped = 1;
    }

    int status = CLI_EXIT_FAIL;
    fa_context *ctx = NULL;
    cli_inputs in = {0};
    void *o = NULL;
    double *times = NULL;
    bench_row rows[3];

    fa_status st = fa_context_create(&ctx);
    if (st != FA_OK) {
        fprintf(stderr, "flashattn bench: cannot create a context: %s\n", fa_status_string(st));
        return CLI_EXIT_FAIL;
    }
    st = fa_context_set(ctx, FA_PARAM_THREADS, s.threads);
    if (st != FA_OK) {
        fprintf(stderr, "flashattn bench: setting threads: %s: %s\n", fa_status_string(st),
                fa_context_error(ctx));
        goto done;
    }
    if (cli_inputs_make(&s, &in) != 0)
        goto done;
    o = cli_alloc(in.o_elems, fa_dtype_size(s.dtype));
    times = cli_alloc(s.runs, sizeof *times);
    if (!o || !times) {
        fprintf(stderr, "flashattn bench: out of memory allocating the output\n");
        goto done;
    }
    /* No LSE: the inference forward, which is what a serving stack calls. */
    fa_forward_args args = cli_forward_args(&s, &in, o, s.dtype, NULL);
    for (int a = 0; a < n_algos; a++)
        if (bench_one(ctx, &s, algos[a], &args, times, &rows[a]) != 0)
            goto done;

    double standard_s = 0.0;
    for (int a = 0; a < n_algos; a++)
        if (rows[a].algo == FA_ALGO_STANDARD && !rows[a].oom)
            standard_s = rows[a].median_s;

    const char *isa = fa_context_isa(ctx);
    if (json) {
        for (int a = 0; a < n_algos; a++)
            print_json(&s, isa, &rows[a], flops, standard_s);
    } else {
        printf("# flashattn %s: median of %lld runs after 1 warm-up; "
               "GFLOP/s = 2*(D+Dv)*kept(i,j)*B*Hq / time = %.4g GFLOP / time\n",
               fa_version_string(), (long long)s.runs, flops * 1e-9);
        if (reference_skipped)
            printf("# reference skipped: %.3g GFLOP per call > %.3g (--algo reference runs it)\n",
                   flops * 1e-9, REFERENCE_MAX_FLOPS * 1e-9);
        print_table(&s, isa, rows, n_algos, flops, standard_s);
    }
    status = CLI_EXIT_OK;

done:
    cli_free(times);
    cli_free(o);
    cli_inputs_free(&in);
    fa_context_free(ctx);
    return status;
}
