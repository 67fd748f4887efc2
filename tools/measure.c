/*
 * measure.c: the FLOP count (the core's, fa_forward_work), timing, peak probe and output writers that
 * `bench` and `tune` share (see measure.h). Everything goes through the
 * public API: what ran, its tiles, threads and memory are read back from the
 * context rather than predicted.
 */
#include "measure.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The tools are single-threaded: one context for the rule queries, kept for the
 * process (NULL when it cannot be had: then the queries answer nothing). */
static fa_context *rules_context(void)
{
    static fa_context *ctx;
    if (!ctx && fa_context_create(&ctx) != FA_OK) ctx = NULL;
    return ctx;
}

/* The shape as a call the core can judge and count, on a pointer it never reads:
 * fa_forward_work and fa_forward_band touch no data. */
static fa_forward_args shape_call(const cli_shape *s)
{
    static float never_read[1];
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = fa_tensor_make(never_read, s->dtype, FA_LAYOUT_BSND, s->batch, s->seq, s->heads, s->dim);
    a.k = fa_tensor_make(never_read, s->dtype, FA_LAYOUT_BSND, s->batch, s->seq_kv, s->kv_heads, s->dim);
    a.v = fa_tensor_make(never_read, s->dtype, FA_LAYOUT_BSND, s->batch, s->seq_kv, s->kv_heads, s->dim_v);
    a.o = fa_tensor_make(never_read, s->dtype, FA_LAYOUT_BSND, s->batch, s->seq, s->heads, s->dim_v);
    a.causal = s->causal;
    a.window_left = s->window_left;
    a.window_right = s->window_right;
    return a;
}

void cli_row_band(const cli_shape *s, int64_t i, int64_t *lo, int64_t *hi)
{
    fa_context *ctx = rules_context();
    const fa_forward_args a = shape_call(s);
    if (!ctx || fa_forward_band(ctx, &a, 0, i, lo, hi) != FA_OK) *lo = 0, *hi = -1;
}

static fa_work shape_work(const cli_shape *s)
{
    fa_work w = FA_WORK_INIT;
    fa_context *ctx = rules_context();
    const fa_forward_args a = shape_call(s);
    if (!ctx || fa_forward_work(ctx, &a, &w) != FA_OK) w.pairs = 0, w.flops = w.backward_flops = 0.0;
    return w;
}

int64_t cli_kept_pairs(const cli_shape *s)
{
    const fa_work w = shape_work(s);
    const int64_t bh = s->batch * s->heads;
    return bh > 0 ? w.pairs / bh : 0;
}

double cli_flops(const cli_shape *s)
{
    return shape_work(s).flops;
}

double cli_backward_flops(const cli_shape *s)
{
    return shape_work(s).backward_flops;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int cli_flush_make(cli_flush *f, int64_t bytes)
{
    f->bytes = bytes;
    f->read_only = 0;
    f->buf = cli_alloc(bytes, 1);
    if (f->buf == NULL) {
        fprintf(stderr, "flashattn: out of memory allocating a %lld-byte cache flush buffer\n",
                (long long)bytes);
        return -1;
    }
    return 0;
}

void cli_flush_run(cli_flush *f)
{
    /* volatile: the loads and stores must happen even though nothing uses them */
    volatile unsigned char *p = f->buf;
    if (f->read_only) {
        for (int64_t i = 0; i < f->bytes; i += 64)
            (void)p[i];
        return;
    }
    for (int64_t i = 0; i < f->bytes; i += 64)
        p[i] = (unsigned char)(p[i] + 1);
}

void cli_flush_free(cli_flush *f)
{
    cli_free(f->buf);
    f->buf = NULL;
}

/* Raises t->extra_bytes to what the call just made allocated. */
static void note_extra(fa_context *ctx, cli_timing *t)
{
    int64_t extra = 0;
    if (fa_context_get(ctx, FA_PARAM_LAST_EXTRA_BYTES, &extra) == FA_OK && extra > t->extra_bytes)
        t->extra_bytes = extra;
}

/* After the last timed call: what ran, on how many threads, with which tiles,
 * and the median; or the out-of-memory row, or the error reported. */
static int finish_timing(fa_context *ctx, const cli_shape *s, fa_algo algo, fa_status st,
                         double *times, cli_timing *t, const char *verb)
{
    if (st == FA_ERR_OUT_OF_MEMORY) {
        t->oom = 1;
        t->threads = cli_resolved_threads(s->threads);
        return 0;
    }
    if (st != FA_OK) {
        fprintf(stderr, "flashattn %s: %s failed: %s: %s\n", verb, fa_algo_name(algo),
                fa_status_string(st), fa_context_error(ctx));
        return -1;
    }
    int64_t v = algo;
    if (fa_context_get(ctx, FA_PARAM_LAST_ALGO, &v) == FA_OK)
        t->algo = (fa_algo)v;
    /* The reference ignores the thread setting, and few tasks use fewer threads:
     * the library says what it really used. */
    t->threads = fa_context_get(ctx, FA_PARAM_LAST_THREADS, &v) == FA_OK && v > 0
                     ? v : cli_resolved_threads(s->threads);
    if (fa_context_get(ctx, FA_PARAM_LAST_TILE_Q, &v) == FA_OK)
        t->tile_q = v;
    if (fa_context_get(ctx, FA_PARAM_LAST_TILE_KV, &v) == FA_OK)
        t->tile_kv = v;
    if (fa_context_get(ctx, FA_PARAM_LAST_KV_PACKED, &v) == FA_OK)
        t->kv_packed = v;
    if (fa_context_get(ctx, FA_PARAM_LAST_KV_PACK_US, &v) == FA_OK)
        t->kv_pack_us = v;
    if (s->runs > 0) {
        qsort(times, (size_t)s->runs, sizeof *times, cmp_double);
        int64_t m = s->runs / 2;
        t->median_s = (s->runs % 2) ? times[m] : 0.5 * (times[m - 1] + times[m]);
    }
    return 0;
}

int cli_time_algo(fa_context *ctx, const cli_shape *s, fa_algo algo, const fa_forward_args *args,
                  double *times, cli_flush *flush, cli_timing *t, const char *verb)
{
    memset(t, 0, sizeof *t);
    t->algo = algo;
    fa_status st = fa_context_set(ctx, FA_PARAM_ALGO, algo);
    for (int64_t r = -1; st == FA_OK && r < s->runs; r++) { /* r = -1: the warm-up */
        if (flush && r >= 0)
            cli_flush_run(flush);
        double t0 = cli_now();
        st = fa_forward(ctx, args);
        double dt = cli_now() - t0;
        if (st != FA_OK)
            break;
        note_extra(ctx, t);
        if (r >= 0)
            times[r] = dt;
    }
    if (st == FA_OK && flush && s->runs == 0)
        cli_flush_run(flush);
    return finish_timing(ctx, s, algo, st, times, t, verb);
}

int cli_time_backward(fa_context *ctx, const cli_shape *s, fa_algo algo,
                      const fa_forward_args *fwd, const fa_backward_args *bwd, int with_forward,
                      double *times, cli_flush *flush, cli_timing *t, const char *verb)
{
    memset(t, 0, sizeof *t);
    t->algo = algo;
    fa_status st = fa_context_set(ctx, FA_PARAM_ALGO, algo);
    if (st == FA_OK && !with_forward)
        st = fa_forward(ctx, fwd); /* the lse and o every backward below reads */
    for (int64_t r = -1; st == FA_OK && r < s->runs; r++) { /* r = -1: the warm-up */
        if (flush && r >= 0)
            cli_flush_run(flush);
        double t0 = cli_now();
        if (with_forward) {
            st = fa_forward(ctx, fwd);
            if (st != FA_OK)
                break;
            note_extra(ctx, t);
        }
        st = fa_backward(ctx, bwd);
        double dt = cli_now() - t0;
        if (st != FA_OK)
            break;
        note_extra(ctx, t);
        fa_context_get(ctx, FA_PARAM_LAST_BACKWARD_PASSES, &t->passes);
        if (r >= 0)
            times[r] = dt;
    }
    return finish_timing(ctx, s, algo, st, times, t, verb);
}

void cli_measure_peak(fa_context *ctx, fa_dtype dtype, int skip, cli_peak *peak)
{
    memset(peak, 0, sizeof *peak);
    fa_probe_kind kind = FA_PROBE_FMA_PEAK;
    peak->kind = "fp32 FMA";
    peak->json_kind = "fp32_fma";
    int64_t dot = 0, mm = 0;
    /* f32 inputs with FA_PARAM_F32_MATMUL set multiply as bf16 on a path with bf16
     * products (elsewhere the setting is ignored and the probe below answers so) */
    const int f32_bf16 = dtype == FA_DTYPE_F32 && fa_context_get(ctx, FA_PARAM_F32_MATMUL, &mm) == FA_OK && mm != 0;
    if (f32_bf16 ||
        (dtype == FA_DTYPE_BF16 && fa_context_get(ctx, FA_PARAM_BF16_DOT_ACTIVE, &dot) == FA_OK && dot)) {
        kind = FA_PROBE_BF16_PEAK;
        peak->kind = "bf16 dot";
        peak->json_kind = "bf16_dot";
    }
    if (skip) {
        snprintf(peak->why, sizeof peak->why, "not measured (--no-probe)");
        return;
    }
    double g = 0.0;
    fa_status st = FA_ERR_UNSUPPORTED;
    /* a path with a tile unit (AMX) multiplies bf16 on it: its peak is the tile
     * product's; elsewhere the probe answers FA_ERR_UNSUPPORTED at once */
    if (kind == FA_PROBE_BF16_PEAK && (st = fa_probe(ctx, FA_PROBE_TILE_PEAK, &g)) == FA_OK) {
        peak->kind = "bf16 tile";
        peak->json_kind = "bf16_tile";
    } else {
        st = fa_probe(ctx, kind, &g);
        if (st == FA_ERR_UNSUPPORTED && f32_bf16) { /* no bf16 products here: f32 stays ieee */
            peak->kind = "fp32 FMA";
            peak->json_kind = "fp32_fma";
            st = fa_probe(ctx, FA_PROBE_FMA_PEAK, &g);
        }
    }
    if (st != FA_OK || !(g > 0.0)) {
        snprintf(peak->why, sizeof peak->why, "not measured: %s",
                 st != FA_OK ? fa_context_error(ctx) : "the probe returned no rate");
        return;
    }
    peak->gflops = g;
}

double cli_pct_peak(double gflops, const cli_peak *peak)
{
    if (!(peak->gflops > 0.0) || !isfinite(gflops))
        return NAN;
    return 100.0 * gflops / peak->gflops;
}

/* ---------------------------------------------------------------- output */

void cli_json_peak(FILE *f, const cli_peak *peak, double pct)
{
    fputs(",\"peak_gflops\":", f);
    cli_json_number(f, peak->gflops > 0 ? peak->gflops : NAN);
    fputs(",\"peak_kind\":", f);
    cli_json_string(f, peak->json_kind);
    fputs(",\"pct_peak\":", f);
    cli_json_number(f, pct);
}

void cli_print_table(FILE *f, int cols, const char *const *head, const int *right, int rows,
                     const char *cells)
{
    int width[32];
    if (cols > 32)
        cols = 32;
    for (int c = 0; c < cols; c++) {
        width[c] = (int)strlen(head[c]);
        for (int r = 0; r < rows; r++) {
            int w = (int)strlen(cells + ((size_t)r * (size_t)cols + (size_t)c) * CLI_CELL);
            if (w > width[c])
                width[c] = w;
        }
    }
    for (int r = -1; r < rows; r++) { /* r = -1: the header */
        for (int c = 0; c < cols; c++) {
            const char *text =
                r < 0 ? head[c] : cells + ((size_t)r * (size_t)cols + (size_t)c) * CLI_CELL;
            /* no trailing blanks after a left-aligned last column */
            int w = right[c] ? width[c] : c == cols - 1 ? 0 : -width[c];
            if (w == 0 && *text == '\0')
                break;
            fprintf(f, "%s%*s", c ? "  " : "", w, text);
        }
        fputc('\n', f);
    }
}

void cli_format_bytes(char *buf, size_t n, double bytes)
{
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%.0f B", bytes);
    else
        snprintf(buf, n, "%.*f %s", bytes < 10.0 ? 2 : bytes < 100.0 ? 1 : 0, bytes, unit[u]);
}

/* The library's names are plain ASCII, but a quote or a control character must
 * still never break the line. */
void cli_json_string(FILE *f, const char *text)
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

void cli_json_number(FILE *f, double x)
{
    if (isfinite(x))
        fprintf(f, "%.6g", x);
    else
        fputs("null", f); /* JSON has no inf or NaN */
}

void cli_json_int(FILE *f, int64_t x, int known)
{
    if (known)
        fprintf(f, "%lld", (long long)x);
    else
        fputs("null", f);
}

/* ------------------------------------------------------ bench's tables */

void cli_print_peak_line(const cli_peak *peak, const char *isa, int64_t threads)
{
    if (peak->gflops > 0.0)
        printf("# peak %.1f GFLOP/s: %s of the %s path on %lld thread%s, measured by fa_probe\n",
               peak->gflops, peak->kind, isa, (long long)threads, threads == 1 ? "" : "s");
    else
        printf("# peak (%s): %s\n", peak->kind, peak->why);
}

/* "; each timed call after streaming 4.00 MiB through the caches" for --cold, else "". */
const char *cli_cold_note(const cli_flush *flush, char *buf, size_t n)
{
    char size[32];
    if (!flush)
        return "";
    cli_format_bytes(size, sizeof size, (double)flush->bytes);
    snprintf(buf, n, "; each timed call after streaming %s through the caches (--cold)", size);
    return buf;
}

/* The JSON fields every object starts with, after its first one. */
void cli_json_shape(FILE *f, const cli_shape *s, const char *isa)
{
    fputs(",\"isa\":", f);
    cli_json_string(f, isa);
    fputs(",\"dtype\":", f);
    cli_json_string(f, fa_dtype_name(s->dtype));
    fprintf(f, ",\"B\":%lld,\"Hq\":%lld,\"Hk\":%lld,\"Sq\":%lld,\"Sk\":%lld,\"D\":%lld,\"Dv\":%lld",
            (long long)s->batch, (long long)s->heads, (long long)s->kv_heads, (long long)s->seq,
            (long long)s->seq_kv, (long long)s->dim, (long long)s->dim_v);
    fputs(",\"causal\":", f);
    cli_json_string(f, cli_causal_name(s->causal));
}

/* "B1 H32 S2048 D128 causal=bottom-right", a pair written once when both sides agree. */
void cli_compact_shape(const cli_shape *s, int with_seq, char *buf, size_t n)
{
    char hs[48], ss[48], ds[48];
    if (s->heads == s->kv_heads)
        snprintf(hs, sizeof hs, "%lld", (long long)s->heads);
    else
        snprintf(hs, sizeof hs, "%lld/%lld", (long long)s->heads, (long long)s->kv_heads);
    if (s->seq == s->seq_kv)
        snprintf(ss, sizeof ss, " S%lld", (long long)s->seq);
    else
        snprintf(ss, sizeof ss, " S%lld/%lld", (long long)s->seq, (long long)s->seq_kv);
    if (s->dim == s->dim_v)
        snprintf(ds, sizeof ds, "%lld", (long long)s->dim);
    else
        snprintf(ds, sizeof ds, "%lld/%lld", (long long)s->dim, (long long)s->dim_v);
    int w = snprintf(buf, n, "B%lld H%s%s D%s", (long long)s->batch, hs, with_seq ? ss : "", ds);
    if (w > 0 && (size_t)w < n && s->causal != FA_CAUSAL_NONE)
        w += snprintf(buf + w, n - (size_t)w, " causal=%s", cli_causal_name(s->causal));
    if (w > 0 && (size_t)w < n &&
        (s->window_left != FA_WINDOW_UNBOUNDED || s->window_right != FA_WINDOW_UNBOUNDED))
        w += snprintf(buf + w, n - (size_t)w, " win=%lld,%lld", (long long)s->window_left,
                      (long long)s->window_right);
    if (w > 0 && (size_t)w < n && s->dropout > 0.0)
        snprintf(buf + w, n - (size_t)w, " dropout=%g", s->dropout);
}

char *cli_cell(char *cells, int cols, int r, int c)
{
    return cells + ((size_t)r * (size_t)cols + (size_t)c) * CLI_CELL;
}

void cli_tiles_cell(char *buf, const cli_timing *t)
{
    if (t->tile_q > 0)
        snprintf(buf, CLI_CELL, "%lldx%lld", (long long)t->tile_q, (long long)t->tile_kv);
    else
        snprintf(buf, CLI_CELL, "-");
}

int cli_bench_algos(const cli_shape *s, int with_reference, fa_algo algos[3])
{
    int n = 0;
    if (s->algo_given) {
        algos[n++] = s->algo;
    } else {
        algos[n++] = FA_ALGO_FLASH;
        algos[n++] = FA_ALGO_STANDARD;
        if (with_reference)
            algos[n++] = FA_ALGO_REFERENCE;
    }
    return n;
}

int cli_run_seqs(const cli_seqs *sw)
{
    char *rows = calloc((size_t)sw->n, sw->row_size);
    char *cells = calloc((size_t)sw->n * (size_t)sw->cols, CLI_CELL);
    int status = CLI_EXIT_FAIL;
    if (!rows || !cells) {
        fprintf(stderr, "flashattn bench: out of memory\n");
        goto done;
    }
    for (int r = 0; r < sw->n; r++) {
        if (sw->run(sw, rows, r) != 0)
            goto done;
        if (sw->json) {
            sw->json_row(sw, rows, r);
            fflush(stdout); /* a long sweep shows each row as it finishes */
        }
    }
    if (!sw->json)
        sw->text(sw, rows, cells);
    status = CLI_EXIT_OK;
done:
    free(cells);
    free(rows);
    return status;
}

void cli_print_seqs_head(const char *flags, const char *what, const cli_shape *s, const char *isa,
                         int64_t threads, const char *after, const cli_flush *flush)
{
    char shape[CLI_CELL], note[128];
    cli_compact_shape(s, 0, shape, sizeof shape);
    printf("# flashattn %s bench %s: %s, Sq = Sk = N, %s %s, isa %s, %lld thread%s; median of %lld runs after 1 "
           "warm-up%s%s\n",
           fa_version_string(), flags, what, fa_dtype_name(s->dtype), shape, isa, (long long)threads,
           threads == 1 ? "" : "s", (long long)s->runs, after, cli_cold_note(flush, note, sizeof note));
}

int cli_run_cells(char *cells, int cols, int r, int k, const cli_timing *t, double gflops, double pct)
{
    if (t->oom) {
        snprintf(cli_cell(cells, cols, r, k), CLI_CELL, "out of memory");
        for (int c = k + 1; c < cols; c++)
            snprintf(cli_cell(cells, cols, r, c), CLI_CELL, "-");
        return 0;
    }
    snprintf(cli_cell(cells, cols, r, k), CLI_CELL, "%.3f", t->median_s * 1e3);
    snprintf(cli_cell(cells, cols, r, k + 1), CLI_CELL, "%.2f", gflops);
    if (isfinite(pct))
        snprintf(cli_cell(cells, cols, r, k + 2), CLI_CELL, "%.1f", pct);
    else
        snprintf(cli_cell(cells, cols, r, k + 2), CLI_CELL, "-");
    snprintf(cli_cell(cells, cols, r, k + 3), CLI_CELL, "%.2f", (double)t->extra_bytes / (1024.0 * 1024.0));
    return 1;
}

void cli_seq_pair_cells(char *cells, int cols, int r, const cli_shape *s, const cli_timing *flash,
                        const cli_timing *standard, double flops, const cli_peak *peak)
{
    snprintf(cli_cell(cells, cols, r, 0), CLI_CELL, "%lld", (long long)s->seq);
    cli_tiles_cell(cli_cell(cells, cols, r, 1), flash);
    if (flash->oom) {
        snprintf(cli_cell(cells, cols, r, 2), CLI_CELL, "out of memory");
        snprintf(cli_cell(cells, cols, r, 5), CLI_CELL, "-");
        snprintf(cli_cell(cells, cols, r, 6), CLI_CELL, "-");
        snprintf(cli_cell(cells, cols, r, 7), CLI_CELL, "-");
    } else {
        const double gf = flops / flash->median_s * 1e-9, pct = cli_pct_peak(gf, peak);
        snprintf(cli_cell(cells, cols, r, 2), CLI_CELL, "%.3f", flash->median_s * 1e3);
        snprintf(cli_cell(cells, cols, r, 5), CLI_CELL, "%.2f", gf);
        if (isfinite(pct))
            snprintf(cli_cell(cells, cols, r, 6), CLI_CELL, "%.1f", pct);
        else
            snprintf(cli_cell(cells, cols, r, 6), CLI_CELL, "-");
        cli_format_bytes(cli_cell(cells, cols, r, 7), CLI_CELL, (double)flash->extra_bytes);
    }
    if (standard->oom) {
        snprintf(cli_cell(cells, cols, r, 3), CLI_CELL, "out of memory");
        snprintf(cli_cell(cells, cols, r, 8), CLI_CELL, "-");
    } else {
        snprintf(cli_cell(cells, cols, r, 3), CLI_CELL, "%.3f", standard->median_s * 1e3);
        cli_format_bytes(cli_cell(cells, cols, r, 8), CLI_CELL, (double)standard->extra_bytes);
    }
    if (flash->oom || standard->oom)
        snprintf(cli_cell(cells, cols, r, 4), CLI_CELL, "-");
    else
        snprintf(cli_cell(cells, cols, r, 4), CLI_CELL, "%.2fx", standard->median_s / flash->median_s);
}

void cli_json_run_head(FILE *f, const cli_shape *s, const char *isa, const cli_timing *t, double gflops)
{
    fputs("{\"algo\":", f);
    cli_json_string(f, fa_algo_name(t->algo));
    cli_json_shape(f, s, isa);
    fprintf(f, ",\"threads\":%lld", (long long)t->threads);
    fputs(",\"median_ms\":", f);
    cli_json_number(f, t->oom ? NAN : t->median_s * 1e3);
    fputs(",\"gflops\":", f);
    cli_json_number(f, gflops);
    fputs(",\"extra_bytes\":", f);
    cli_json_int(f, t->extra_bytes, !t->oom);
}

void cli_json_run_tiles(FILE *f, const cli_shape *s, const cli_timing *t, double flops, double standard_s)
{
    fprintf(f, ",\"window_left\":%lld,\"window_right\":%lld,\"runs\":%lld,\"flops\":",
            (long long)s->window_left, (long long)s->window_right, (long long)s->runs);
    cli_json_number(f, flops);
    fputs(",\"speedup_vs_standard\":", f);
    cli_json_number(f, (!t->oom && standard_s > 0) ? standard_s / t->median_s : NAN);
    fputs(",\"tile_q\":", f);
    cli_json_int(f, t->tile_q, t->tile_q > 0);
    fputs(",\"tile_kv\":", f);
    cli_json_int(f, t->tile_kv, t->tile_kv > 0);
}

void cli_json_seq_pair(FILE *f, const cli_timing *flash, const cli_timing *standard, int64_t runs, double flops,
                       const cli_peak *peak)
{
    const double flash_gf = flash->oom ? NAN : flops / flash->median_s * 1e-9;
    const double std_gf = standard->oom ? NAN : flops / standard->median_s * 1e-9;
    fprintf(f, ",\"threads\":%lld,\"runs\":%lld", (long long)flash->threads, (long long)runs);
    fputs(",\"tile_q\":", f);
    cli_json_int(f, flash->tile_q, flash->tile_q > 0);
    fputs(",\"tile_kv\":", f);
    cli_json_int(f, flash->tile_kv, flash->tile_kv > 0);
    fputs(",\"flash_ms\":", f);
    cli_json_number(f, flash->oom ? NAN : flash->median_s * 1e3);
    fputs(",\"standard_ms\":", f);
    cli_json_number(f, standard->oom ? NAN : standard->median_s * 1e3);
    fputs(",\"speedup\":", f);
    cli_json_number(f, !flash->oom && !standard->oom ? standard->median_s / flash->median_s : NAN);
    fputs(",\"flops\":", f);
    cli_json_number(f, flops);
    fputs(",\"flash_gflops\":", f);
    cli_json_number(f, flash_gf);
    fputs(",\"standard_gflops\":", f);
    cli_json_number(f, std_gf);
    cli_json_peak(f, peak, cli_pct_peak(flash_gf, peak));
    fputs(",\"flash_extra_bytes\":", f);
    cli_json_int(f, flash->extra_bytes, !flash->oom);
    fputs(",\"standard_extra_bytes\":", f);
    cli_json_int(f, standard->extra_bytes, !standard->oom);
}

void cli_json_seq_end(FILE *f, const cli_timing *flash, const cli_timing *standard)
{
    if (flash->oom || standard->oom) {
        fputs(",\"error\":", f);
        cli_json_string(f, flash->oom && standard->oom ? "flash and standard: out of memory"
                           : flash->oom                ? "flash: out of memory"
                                                       : "standard: out of memory");
    }
    fputs("}\n", f);
}
