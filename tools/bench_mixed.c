/*
 * bench_mixed.c: `flashattn bench --mixed`, one serving step of a chunked-prefill
 * engine: --chunks prefill chunks of --chunk-len query rows and --decodes decoding
 * sequences of one query row, all over one paged KV cache in which every sequence
 * holds --cache-len keys (a chunk's rows are the last of its keys, so causal
 * bottom-right lets row i see keys 0 .. L - chunk_len + i; a decoding row sees all
 * L). The same work is timed three ways, interleaved run by run:
 *   mixed     one fa_forward: q packed by cu_seqlens_q, chunks and decodes together;
 *   separate  two calls: a varlen prefill of the chunks, a (decodes, 1, Hq, D) decode;
 *   per-seq   one call per sequence.
 * The three write different o buffers, compared at the end (bitwise where the
 * planned tiles and splits agree; else the largest difference is printed).
 */
#include "bench_modes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "measure.h"

enum { MIXED_VARIANTS = 3 };
static const char *const variant_names[MIXED_VARIANTS] = {"mixed", "separate", "per-seq"};

typedef struct mixed_bench {
    const cli_shape *s;
    int64_t n, chunks, decodes, chunk_rows;
    void *q;
    void *o[MIXED_VARIANTS];
    int32_t *cu_q;
    decode_cache c;
    fa_kv_cache prefill_cache, decode_cache_part, *seq_cache;
    fa_forward_args mixed, prefill, decode, *seq;
} mixed_bench;

static void mixed_free(mixed_bench *m)
{
    cli_free(m->q);
    for (int v = 0; v < MIXED_VARIANTS; v++)
        cli_free(m->o[v]);
    cli_free(m->cu_q);
    free(m->seq_cache);
    free(m->seq);
    decode_cache_free(&m->c);
}

/* (B, S, Hq, dim) rows of buf starting at packed row r0, as a dense view. */
static fa_tensor rows_view(void *buf, fa_dtype dt, int64_t r0, int64_t B, int64_t S, int64_t H, int64_t dim)
{
    fa_tensor t = fa_tensor_make((char *)buf + r0 * H * dim * (int64_t)fa_dtype_size(dt), dt, FA_LAYOUT_BSND, B, S,
                                 H, dim);
    return t;
}

/* The cache as sequences b0 .. b0+n-1 see it: their seqlens and block-table rows. */
static fa_kv_cache cache_part(const decode_cache *c, int64_t b0)
{
    fa_kv_cache part = c->cache;
    part.seqlens = c->seqlens + b0;
    part.block_table = c->block_table + b0 * c->max_pages;
    return part;
}

static fa_forward_args base_args(const cli_shape *s)
{
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.causal = FA_CAUSAL_BOTTOM_RIGHT;
    a.window_left = s->window_left;
    a.window_right = s->window_right;
    return a;
}

static int mixed_make(mixed_bench *m, const cli_shape *s, const bench_mode_opts *o)
{
    memset(m, 0, sizeof *m);
    m->s = s;
    m->chunks = o->chunks;
    m->decodes = o->decodes;
    m->n = o->chunks + o->decodes;
    m->chunk_rows = o->chunks * o->chunk_len;
    const int64_t total_q = m->chunk_rows + o->decodes, H = s->heads;
    int64_t *lens = malloc((size_t)m->n * sizeof *lens);
    m->cu_q = cli_alloc(m->n + 1, sizeof *m->cu_q);
    m->seq_cache = malloc((size_t)m->n * sizeof *m->seq_cache);
    m->seq = malloc((size_t)m->n * sizeof *m->seq);
    m->q = cli_alloc(total_q * H * s->dim, fa_dtype_size(s->dtype));
    for (int v = 0; v < MIXED_VARIANTS; v++)
        m->o[v] = cli_alloc(total_q * H * s->dim_v, fa_dtype_size(s->dtype));
    int ok = lens && m->cu_q && m->seq_cache && m->seq && m->q && m->o[0] && m->o[1] && m->o[2];
    cli_shape cs = *s;
    cs.batch = m->n;
    if (ok) {
        for (int64_t b = 0; b < m->n; b++)
            lens[b] = o->cache_lo;
        ok = decode_cache_make(&cs, o, lens, &m->c) == 0;
    }
    free(lens);
    if (!ok) {
        fprintf(stderr, "flashattn bench: out of memory allocating the mixed batch\n");
        mixed_free(m);
        return -1;
    }
    bench_fill_values(m->q, s->dtype, total_q * H * s->dim, (uint64_t)s->seed * 0x2545f4914f6cdd1dull ^ 0x71ull);
    m->cu_q[0] = 0;
    for (int64_t b = 0; b < m->n; b++)
        m->cu_q[b + 1] = m->cu_q[b] + (int32_t)(b < m->chunks ? o->chunk_len : 1);

    /* one call: every sequence packed along q's seq axis */
    m->mixed = base_args(s);
    m->mixed.q = rows_view(m->q, s->dtype, 0, 1, total_q, H, s->dim);
    m->mixed.o = rows_view(m->o[0], s->dtype, 0, 1, total_q, H, s->dim_v);
    m->mixed.cu_seqlens_q = m->cu_q;
    m->mixed.num_seqs = m->n;
    m->mixed.kv_cache = &m->c.cache;
    /* two calls: the chunks packed, the decodes as a dense batch of one row each */
    m->prefill_cache = cache_part(&m->c, 0);
    m->prefill = m->mixed;
    m->prefill.q.shape[1] = m->prefill.o.shape[1] = m->chunk_rows;
    m->prefill.o.data = m->o[1];
    m->prefill.num_seqs = m->chunks;
    m->prefill.kv_cache = &m->prefill_cache;
    m->decode_cache_part = cache_part(&m->c, m->chunks);
    m->decode = base_args(s);
    m->decode.q = rows_view(m->q, s->dtype, m->chunk_rows, m->decodes, 1, H, s->dim);
    m->decode.o = rows_view(m->o[1], s->dtype, m->chunk_rows, m->decodes, 1, H, s->dim_v);
    m->decode.kv_cache = &m->decode_cache_part;
    /* a call per sequence */
    for (int64_t b = 0; b < m->n; b++) {
        const int64_t rows = m->cu_q[b + 1] - m->cu_q[b];
        m->seq_cache[b] = cache_part(&m->c, b);
        m->seq[b] = base_args(s);
        m->seq[b].q = rows_view(m->q, s->dtype, m->cu_q[b], 1, rows, H, s->dim);
        m->seq[b].o = rows_view(m->o[2], s->dtype, m->cu_q[b], 1, rows, H, s->dim_v);
        m->seq[b].kv_cache = &m->seq_cache[b];
    }
    return 0;
}

/* One run of variant v: its seconds, or a negative value after a failed call; *cpu
 * its CPU seconds over all threads (what a loaded machine's wall time hides: the
 * work, not the balance). */
static double mixed_run(fa_context *ctx, const mixed_bench *m, int v, double *cpu)
{
    fa_status st = FA_OK;
    const double c0 = cli_cpu_seconds(), t0 = cli_now();
    if (v == 0) {
        st = fa_forward(ctx, &m->mixed);
    } else if (v == 1) {
        if (m->chunks > 0)
            st = fa_forward(ctx, &m->prefill);
        if (st == FA_OK && m->decodes > 0)
            st = fa_forward(ctx, &m->decode);
    } else {
        for (int64_t b = 0; b < m->n && st == FA_OK; b++)
            st = fa_forward(ctx, &m->seq[b]);
    }
    const double dt = cli_now() - t0;
    *cpu = cli_cpu_seconds() - c0;
    if (st != FA_OK) {
        fprintf(stderr, "flashattn bench: %s call: %s: %s\n", variant_names[v], fa_status_string(st),
                fa_context_error(ctx));
        return -1.0;
    }
    return dt;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of n values (sorts them). */
static double median(double *x, int64_t n)
{
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* The largest |a - b| over n elements of two outputs (0: bitwise the same). */
static double max_diff(const void *a, const void *b, fa_dtype dt, int64_t n, int *same)
{
    *same = memcmp(a, b, (size_t)n * fa_dtype_size(dt)) == 0;
    double worst = 0.0;
    for (int64_t i = 0; !*same && i < n; i++) {
        const double d = fabs(cli_load(a, dt, i) - cli_load(b, dt, i));
        if (!(d <= worst))
            worst = d;
    }
    return worst;
}

int bench_mixed(fa_context *ctx, const cli_shape *s, const bench_mode_opts *o, int json)
{
    mixed_bench m;
    if (mixed_make(&m, s, o) != 0)
        return CLI_EXIT_FAIL;
    int status = CLI_EXIT_FAIL;
    const int64_t runs = s->runs > 0 ? s->runs : 1;
    double *times = cli_alloc(2 * MIXED_VARIANTS * runs, sizeof *times), med[MIXED_VARIANTS], cpu[MIXED_VARIANTS];
    double *cpus = times ? times + MIXED_VARIANTS * runs : NULL, spare;
    fa_work work = FA_WORK_INIT;
    int64_t splits = 0, tile_q = 0, tile_kv = 0;
    if (!times)
        goto done;
    if (fa_forward_work(ctx, &m.mixed, &work) != FA_OK) {
        fprintf(stderr, "flashattn bench: %s\n", fa_context_error(ctx));
        goto done;
    }
    for (int v = 0; v < MIXED_VARIANTS; v++) /* warm-up */
        if (mixed_run(ctx, &m, v, &spare) < 0)
            goto done;
    fa_context_get(ctx, FA_PARAM_LAST_KV_SPLITS, &splits); /* of the last per-seq call: a decode's */
    /* interleaved, the first variant rotating, so that drift in the machine's load
     * falls on every variant alike */
    for (int64_t r = 0; r < runs; r++)
        for (int k = 0; k < MIXED_VARIANTS; k++) {
            const int v = (int)((k + r) % MIXED_VARIANTS);
            if ((times[v * runs + r] = mixed_run(ctx, &m, v, &cpus[v * runs + r])) < 0)
                goto done;
        }
    if (mixed_run(ctx, &m, 0, &spare) < 0) /* the read-outs of a mixed call */
        goto done;
    fa_context_get(ctx, FA_PARAM_LAST_TILE_Q, &tile_q);
    fa_context_get(ctx, FA_PARAM_LAST_TILE_KV, &tile_kv);
    int64_t mixed_splits = 0, threads = 0;
    fa_context_get(ctx, FA_PARAM_LAST_KV_SPLITS, &mixed_splits);
    fa_context_get(ctx, FA_PARAM_LAST_THREADS, &threads);
    for (int v = 0; v < MIXED_VARIANTS; v++) {
        med[v] = median(times + v * runs, runs);
        cpu[v] = median(cpus + v * runs, runs);
    }
    const int64_t n_out = (m.chunk_rows + m.decodes) * s->heads * s->dim_v;
    int same_sep, same_seq;
    const double d_sep = max_diff(m.o[0], m.o[1], s->dtype, n_out, &same_sep);
    const double d_seq = max_diff(m.o[0], m.o[2], s->dtype, n_out, &same_seq);
    const char *isa = fa_context_isa(ctx);
    if (json) {
        printf("{\"mode\":\"mixed\",\"isa\":");
        cli_json_string(stdout, isa);
        printf(",\"dtype\":\"%s\",\"kv_dtype\":\"%s\",\"Hq\":%lld,\"Hk\":%lld,\"D\":%lld,\"Dv\":%lld"
               ",\"chunks\":%lld,\"chunk_len\":%lld,\"decodes\":%lld,\"cache_len\":%lld,\"page_size\":%lld"
               ",\"threads\":%lld,\"runs\":%lld,\"flops\":%.0f",
               fa_dtype_name(s->dtype), o->kv_dtype == FA_DTYPE_I8 ? "i8" : fa_dtype_name(o->kv_dtype),
               (long long)s->heads, (long long)s->kv_heads, (long long)s->dim, (long long)s->dim_v,
               (long long)m.chunks, (long long)o->chunk_len, (long long)m.decodes, (long long)o->cache_lo,
               (long long)o->page_size, (long long)threads, (long long)runs, work.flops);
        for (int v = 0; v < MIXED_VARIANTS; v++)
            printf(",\"%s_ms\":%.4f,\"%s_cpu_ms\":%.4f", v == 0 ? "mixed" : v == 1 ? "separate" : "per_seq",
                   med[v] * 1e3, v == 0 ? "mixed" : v == 1 ? "separate" : "per_seq", cpu[v] * 1e3);
        printf(",\"mixed_over_separate\":%.4f,\"mixed_over_per_seq\":%.4f,\"tile_q\":%lld,\"tile_kv\":%lld"
               ",\"kv_splits\":%lld,\"same_as_separate\":%s,\"max_diff_separate\":%.3g,\"same_as_per_seq\":%s"
               ",\"max_diff_per_seq\":%.3g}\n",
               med[0] / med[1], med[0] / med[2], (long long)tile_q, (long long)tile_kv, (long long)mixed_splits,
               same_sep ? "true" : "false", d_sep, same_seq ? "true" : "false", d_seq);
    } else {
        printf("# flashattn %s bench --mixed: median of %lld interleaved runs after 1 warm-up, warm caches\n",
               fa_version_string(), (long long)runs);
        printf("# %lld chunks of %lld rows + %lld decoding rows; every sequence %lld cached keys, causal "
               "bottom-right\n", (long long)m.chunks, (long long)o->chunk_len, (long long)m.decodes,
               (long long)o->cache_lo);
        printf("# q %s, cache %s paged (%lld-row pages, shuffled); Hq=%lld Hk=%lld D=%lld Dv=%lld; %s, %lld "
               "threads; mixed tiles %lldx%lld, kv splits %lld\n",
               fa_dtype_name(s->dtype), o->kv_dtype == FA_DTYPE_I8 ? "i8" : fa_dtype_name(o->kv_dtype),
               (long long)o->page_size, (long long)s->heads, (long long)s->kv_heads, (long long)s->dim,
               (long long)s->dim_v, isa, (long long)threads, (long long)tile_q, (long long)tile_kv,
               (long long)mixed_splits);
        printf("variant    median ms  GFLOP/s  x mixed's  cpu ms (all threads)  x mixed's\n");
        for (int v = 0; v < MIXED_VARIANTS; v++)
            printf("%-9s %10.3f %8.1f %10.3f %21.3f %10.3f%s\n", variant_names[v], med[v] * 1e3,
                   work.flops / med[v] * 1e-9, med[v] / med[0], cpu[v] * 1e3, cpu[v] / cpu[0],
                   v == 0 ? "" : v == 1 ? "  (varlen prefill + decode)" : "  (one call per sequence)");
        printf("# mixed vs separate: %s; vs per-seq: %s", same_sep ? "bitwise equal" : "differ", 
               same_seq ? "bitwise equal" : "differ");
        if (!same_sep || !same_seq)
            printf(" (max |diff| %.3g, %.3g: the calls planned other tiles or splits)", d_sep, d_seq);
        printf("\n");
    }
    status = CLI_EXIT_OK;
done:
    cli_free(times);
    mixed_free(&m);
    return status;
}
