/*
 * probe.c: fa_probe: how fast this machine can go, measured, so the benchmark
 * can say what fraction of it attention reaches.
 *
 * FMA and bf16 peaks: the ISA's probe kernel (an unrolled loop of independent
 * FMAs) runs on every thread of the context at once; the best of a few timed
 * rounds is the peak.
 *
 * Read bandwidth: every thread of the context streams its own slice of one
 * buffer of twice the last-level cache (so no pass finds its data cached),
 * summing it; the best of a few passes, in 1e9 bytes per second, is the rate.
 * The loop is plain C built with the baseline ISA, like the rest of the core:
 * four sequential streams per thread read side by side, eight independent
 * 64-bit sums, and a software prefetch 4 KiB ahead on each stream. What limits
 * a streaming read is the number of cache lines in flight, not the load width:
 * with the streams and the prefetch these loads come within 10-15% of an
 * AVX-512 loop of the same shape; a single stream without them, some 20% below.
 */
#include "context.h"
#include "threadpool.h"
#include "alloc.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    double (*kernel)(int64_t iters);
    int64_t iters;
    double flops[1024];
} probe_job;

static void probe_worker(void *arg, int ith, int nth)
{
    (void)nth;
    probe_job *job = arg;
    job->flops[ith] = job->kernel(job->iters);
}

/* ------------------------------------------------------- read bandwidth */

enum {
    READ_STREAMS = 4,        /* sequential streams per thread, read in lockstep */
    READ_LINE_WORDS = 8,     /* uint64 words per 64-byte line */
    READ_PREFETCH = 4096,    /* bytes ahead of each stream the prefetch touches */
    READ_PASSES = 4          /* timed passes; the best counts */
};
#define READ_MIN_BYTES ((int64_t)512 << 20)  /* at least this much ... */
#define READ_MAX_BYTES ((int64_t)1 << 30)    /* ... at most this much (the first touch costs ~0.3 s/GiB) */
#define READ_FLOOR_BYTES ((int64_t)64 << 20) /* give up below this when memory is short */
#define READ_PASS_BUDGET 0.25                /* seconds of timed passes, beyond the first two */

typedef struct {
    uint64_t *buf;
    int64_t words_per_thread; /* a multiple of READ_STREAMS * READ_LINE_WORDS */
    int touch;                /* 1: write the slice (first touch), 0: read it */
    uint64_t sums[1024];      /* one per thread: stored to memory other threads see, so the reads stay */
} read_job;

#if defined(__GNUC__) || defined(__clang__)
#define READ_PREFETCH_AT(p) __builtin_prefetch((p), 0, 3)
#else
#define READ_PREFETCH_AT(p) ((void)0)
#endif

/* Sums n words as READ_STREAMS consecutive parts read side by side. */
static uint64_t read_slice(const uint64_t *restrict p, int64_t n)
{
    const int64_t len = n / READ_STREAMS; /* a multiple of READ_LINE_WORDS */
    const int64_t ahead = READ_PREFETCH / (int64_t)sizeof(uint64_t);
    const uint64_t *s0 = p, *s1 = p + len, *s2 = p + 2 * len, *s3 = p + 3 * len;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    for (int64_t i = 0; i < len; i += READ_LINE_WORDS) {
        if (i + ahead < len) {
            READ_PREFETCH_AT(s0 + i + ahead);
            READ_PREFETCH_AT(s1 + i + ahead);
            READ_PREFETCH_AT(s2 + i + ahead);
            READ_PREFETCH_AT(s3 + i + ahead);
        }
        a0 += s0[i + 0] + s1[i + 0] + s2[i + 0] + s3[i + 0];
        a1 += s0[i + 1] + s1[i + 1] + s2[i + 1] + s3[i + 1];
        a2 += s0[i + 2] + s1[i + 2] + s2[i + 2] + s3[i + 2];
        a3 += s0[i + 3] + s1[i + 3] + s2[i + 3] + s3[i + 3];
        a4 += s0[i + 4] + s1[i + 4] + s2[i + 4] + s3[i + 4];
        a5 += s0[i + 5] + s1[i + 5] + s2[i + 5] + s3[i + 5];
        a6 += s0[i + 6] + s1[i + 6] + s2[i + 6] + s3[i + 6];
        a7 += s0[i + 7] + s1[i + 7] + s2[i + 7] + s3[i + 7];
    }
    return a0 ^ a1 ^ a2 ^ a3 ^ a4 ^ a5 ^ a6 ^ a7;
}

static void read_worker(void *arg, int ith, int nth)
{
    (void)nth;
    read_job *job = arg;
    uint64_t *slice = job->buf + (int64_t)ith * job->words_per_thread;
    if (job->touch) {
        /* Each thread faults in its own slice, so its pages are local to it. */
        memset(slice, 0x5a, (size_t)job->words_per_thread * sizeof(uint64_t));
        job->sums[ith] = 0;
    } else {
        job->sums[ith] += read_slice(slice, job->words_per_thread);
    }
}

/* Twice the last-level cache, within [READ_MIN_BYTES, READ_MAX_BYTES] and a quarter of RAM. */
static int64_t read_buffer_bytes(void)
{
    int64_t bytes = READ_MIN_BYTES;
#if defined(_SC_LEVEL3_CACHE_SIZE)
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc > 0 && 2 * (int64_t)llc > bytes) bytes = 2 * (int64_t)llc;
#endif
    if (bytes > READ_MAX_BYTES) bytes = READ_MAX_BYTES;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && (int64_t)pages / 4 < bytes / (int64_t)page)
        bytes = (int64_t)pages / 4 * (int64_t)page;
    return bytes;
}

static fa_status probe_read_bw(fa_context *ctx, double *value)
{
    const int nth = ctx->threads;
    const int64_t chunk = (int64_t)nth * READ_STREAMS * READ_LINE_WORDS * (int64_t)sizeof(uint64_t);
    read_job *job = fa_calloc(1, (int64_t)sizeof *job);
    if (!job) return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "cannot allocate the read-bandwidth probe's state");
    int64_t bytes = read_buffer_bytes();
    for (; bytes >= READ_FLOOR_BYTES; bytes /= 2) {
        int64_t usable = bytes / chunk * chunk;
        if (usable <= 0) break;
        job->buf = fa_aligned_alloc(4096, usable);
        if (job->buf) {
            bytes = usable;
            break;
        }
    }
    if (!job->buf) {
        fa_free(job);
        return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "cannot allocate %lld MiB for the read-bandwidth probe",
                       (long long)(READ_FLOOR_BYTES >> 20));
    }
    job->words_per_thread = bytes / nth / (int64_t)sizeof(uint64_t);

    job->touch = 1;
    fa_pool_run(ctx->pool, nth, read_worker, job);
    job->touch = 0;
    double best = 0.0, spent = 0.0;
    /* READ_PASSES passes, but on a crowded machine (slow passes) stop after two
     * once they have taken READ_PASS_BUDGET: the probe stays under a second. */
    for (int pass = 0; pass < READ_PASSES && (pass < 2 || spent < READ_PASS_BUDGET); pass++) {
        double t = fa_now_s();
        fa_pool_run(ctx->pool, nth, read_worker, job);
        t = fa_now_s() - t;
        spent += t;
        if (t > 0 && (double)bytes / t > best) best = (double)bytes / t;
    }
    fa_free(job->buf);
    fa_free(job);
    *value = best * 1e-9;
    return FA_OK;
}

/* ----------------------------------------------------------------- probe */

static fa_status probe(fa_context *ctx, fa_probe_kind kind, double *value)
{
    if (!value) return fa_fail(ctx, FA_ERR_NULL_POINTER, "value is NULL");
    if (kind == FA_PROBE_READ_BW) return probe_read_bw(ctx, value);
    probe_job job = {0};
    if (kind == FA_PROBE_FMA_PEAK) job.kernel = ctx->kernels->probe_fma;
    else if (kind == FA_PROBE_BF16_PEAK) job.kernel = ctx->kernels->probe_bf16;
    else if (kind == FA_PROBE_TILE_PEAK) job.kernel = ctx->kernels->probe_tile;
    else return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "unknown probe kind %d", (int)kind);
    /* every table has a probe_bf16 (the reference's is scalar C); a peak only means
     * something for a native bf16 dot product */
    if (kind == FA_PROBE_BF16_PEAK && !(ctx->kernels->flags & FA_KERNELS_BF16_DOT))
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "the %s path has no native bf16 dot product to probe",
                       ctx->kernels->name);
    if (kind == FA_PROBE_TILE_PEAK && !(ctx->kernels->flags & FA_KERNELS_TILES))
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "the %s path has no tile unit to probe", ctx->kernels->name);

    /* calibrate on one thread to ~20 ms, then time all threads together */
    job.iters = 1 << 12;
    for (;;) { /* between the hooks, as on the pool's threads: a tile unit is configured there */
        ctx->kernels->thread_begin();
        double t = fa_now_s();
        job.kernel(job.iters);
        t = fa_now_s() - t;
        ctx->kernels->thread_end();
        if (t > 0.02 || job.iters > ((int64_t)1 << 40)) break;
        job.iters *= 2;
    }
    double best = 0.0;
    for (int round = 0; round < 5; round++) {
        double t = fa_now_s();
        fa_pool_run(ctx->pool, ctx->threads, probe_worker, &job);
        t = fa_now_s() - t;
        double flops = 0.0;
        for (int i = 0; i < ctx->threads; i++) flops += job.flops[i];
        if (t > 0 && flops / t > best) best = flops / t;
    }
    *value = best * 1e-9;
    return FA_OK;
}

fa_status fa_probe(fa_context *ctx, fa_probe_kind kind, double *value)
{
    if (!ctx) return FA_ERR_NULL_CONTEXT;
    if (!fa_context_enter(ctx)) return FA_ERR_BUSY;
    const fa_status st = probe(ctx, kind, value);
    fa_context_leave(ctx);
    return st;
}
