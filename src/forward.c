/*
 * forward.c: fa_forward: validate, pick the algorithm, run it, record what ran.
 * The algorithm table below is the one place a new algorithm is registered.
 */
#include "internal.h"

#include <time.h>

typedef struct {
    fa_algo algo;
    /* NULL when the algorithm runs every valid call; else says why it cannot. */
    const char *(*cannot_run)(const fa_problem *p);
    fa_status (*run)(fa_context *ctx, const fa_problem *p, fa_run_info *info);
} fa_algo_entry;

/* The baselines materialise per-(b, h) matrices of one dense shape; the inference
 * forms (ragged, cached, paged) exist to be fast, so only flash runs them. */
static const char *dense_only(const fa_problem *p)
{
    return fa_problem_is_form(p) ? "variable-length and KV-cache calls run on flash only" : NULL;
}

static const fa_algo_entry g_algos[] = {
    {FA_ALGO_FLASH, NULL, fa_run_flash},
    {FA_ALGO_STANDARD, dense_only, fa_run_standard},
    {FA_ALGO_REFERENCE, dense_only, fa_run_reference},
};

static const fa_algo_entry *find_algo(fa_algo algo)
{
    for (size_t i = 0; i < sizeof g_algos / sizeof g_algos[0]; i++)
        if (g_algos[i].algo == algo) return &g_algos[i];
    return NULL;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

fa_status fa_forward(fa_context *ctx, const fa_forward_args *args)
{
    if (!ctx) return FA_ERR_NULL_CONTEXT;
    ctx->error[0] = '\0';
    fa_problem p;
    fa_status st = fa_validate_forward(ctx, args, &p);
    if (st != FA_OK) {
        if (ctx->verbose) fa_verbose_error(ctx, st);
        return st;
    }

    /* auto: flash whenever flash supports the call; there is no head-dim list. */
    const fa_algo want = ctx->algo == FA_ALGO_AUTO ? FA_ALGO_FLASH : ctx->algo;
    const fa_algo_entry *e = find_algo(want);
    if (!e) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "unknown algorithm %d", (int)want);
    const char *why = e->cannot_run ? e->cannot_run(&p) : NULL;
    const char *fallback = NULL;
    if (why && ctx->algo == FA_ALGO_AUTO) {
        fallback = why;
        e = find_algo(FA_ALGO_STANDARD);
        why = e->cannot_run ? e->cannot_run(&p) : NULL;
    }
    if (why) return fa_fail(ctx, FA_ERR_UNSUPPORTED, "%s cannot run this call: %s", fa_algo_name(want), why);

    fa_run_info info = {0, 0, 0, 1, "", 0};
    const double t0 = ctx->verbose ? now_ms() : 0.0;
    st = e->run(ctx, &p, &info);
    if (st != FA_OK) {
        if (ctx->verbose) fa_verbose_error(ctx, st);
        return st;
    }
    ctx->last_algo = e->algo;
    ctx->last_extra_bytes = info.extra_bytes;
    ctx->last_tile_q = info.br;
    ctx->last_tile_kv = info.bc;
    ctx->last_threads = info.threads;
    ctx->last_kv_splits = info.kv_splits;
    if (ctx->verbose) fa_verbose_exec(ctx, &p, e->algo, fallback, &info, now_ms() - t0);
    return FA_OK;
}
