/*
 * probe.c: fa_probe: how fast this machine can go, measured, so the benchmark
 * can say what fraction of it attention reaches. The ISA's probe kernel (an
 * unrolled loop of independent FMAs) runs on every thread of the context at
 * once; the best of a few timed rounds is the peak.
 */
#include "internal.h"
#include "threadpool.h"

#include <time.h>

typedef struct {
    double (*kernel)(int64_t iters);
    int64_t iters;
    double flops[1024];
} probe_job;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void probe_worker(void *arg, int ith, int nth)
{
    (void)nth;
    probe_job *job = arg;
    job->flops[ith] = job->kernel(job->iters);
}

fa_status fa_probe(fa_context *ctx, fa_probe_kind kind, double *value)
{
    if (!ctx) return FA_ERR_NULL_CONTEXT;
    if (!value) return fa_fail(ctx, FA_ERR_NULL_POINTER, "value is NULL");
    probe_job job = {0};
    if (kind == FA_PROBE_FMA_PEAK) job.kernel = ctx->kernels->probe_fma;
    else if (kind == FA_PROBE_BF16_PEAK) job.kernel = ctx->kernels->probe_bf16;
    else return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "unknown probe kind %d", (int)kind);
    if (!job.kernel)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "the %s path has no %s probe", ctx->kernels->name,
                       kind == FA_PROBE_FMA_PEAK ? "FMA" : "bf16 dot-product");

    /* calibrate on one thread to ~20 ms, then time all threads together */
    job.iters = 1 << 12;
    for (;;) {
        double t = now_s();
        job.kernel(job.iters);
        if (now_s() - t > 0.02 || job.iters > ((int64_t)1 << 40)) break;
        job.iters *= 2;
    }
    double best = 0.0;
    for (int round = 0; round < 5; round++) {
        double t = now_s();
        fa_pool_run(ctx->pool, ctx->threads, probe_worker, &job);
        t = now_s() - t;
        double flops = 0.0;
        for (int i = 0; i < ctx->threads; i++) flops += job.flops[i];
        if (t > 0 && flops / t > best) best = flops / t;
    }
    *value = best * 1e-9;
    return FA_OK;
}
