/*
 * entry.c: what the public calls that run attention share (entry.h): the table of
 * algorithms, which is the one place a new algorithm is registered (its forward and
 * its backward), the choice of a call's entry, the record of what ran, and the guard
 * around every call on a context.
 */
#include "entry.h"
#include "threadpool.h"

#include <stddef.h>

/* The baselines materialise per-(b, h) matrices of one dense shape; the inference
 * forms (ragged, cached, paged) exist to be fast, so only flash runs them. */
static const char *dense_only(const fa_problem *p)
{
    return fa_problem_is_form(p) ? "variable-length and KV-cache calls run on flash only" : NULL;
}

static const fa_algo_entry g_algos[] = {
    {FA_ALGO_FLASH, NULL, fa_run_flash, fa_run_flash_backward},
    {FA_ALGO_STANDARD, dense_only, fa_run_standard, fa_run_standard_backward},
    {FA_ALGO_REFERENCE, dense_only, fa_run_reference, fa_run_reference_backward},
};

static const fa_algo_entry *find_algo(fa_algo algo)
{
    for (size_t i = 0; i < sizeof g_algos / sizeof g_algos[0]; i++)
        if (g_algos[i].algo == algo) return &g_algos[i];
    return NULL;
}

const fa_algo_entry *fa_algo_choose(fa_context *ctx, const fa_problem *p, const char **fallback, fa_status *st)
{
    const fa_algo want = ctx->set.algo == FA_ALGO_AUTO ? FA_ALGO_FLASH : ctx->set.algo;
    const fa_algo_entry *e = find_algo(want);
    if (!e) {
        *st = fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "unknown algorithm %d", (int)want);
        return NULL;
    }
    const char *why = e->cannot_run ? e->cannot_run(p) : NULL;
    if (why && ctx->set.algo == FA_ALGO_AUTO) {
        *fallback = why;
        e = find_algo(FA_ALGO_STANDARD);
        why = e->cannot_run ? e->cannot_run(p) : NULL;
    }
    if (why) {
        *st = fa_fail(ctx, FA_ERR_UNSUPPORTED, "%s cannot run this call: %s", fa_algo_name(want), why);
        return NULL;
    }
    return e;
}

void fa_run_record(fa_context *ctx, const fa_problem *p, const fa_algo_entry *e, const char *fallback,
                   const fa_run_info *info, double t0)
{
    ctx->last = *info;
    ctx->last.algo = e->algo;
    ctx->last.pool = fa_pool_kind(ctx->pool);
    if (ctx->set.verbose) fa_verbose_exec(ctx, p, e->algo, fallback, &ctx->last, (fa_now_s() - t0) * 1e3);
}

fa_status fa_guarded_call(fa_context *ctx, fa_entry_call call, const void *args, void *out, int trace)
{
    if (!ctx) return FA_ERR_NULL_CONTEXT;
    if (!fa_context_enter(ctx)) return FA_ERR_BUSY;
    const fa_status st = call(ctx, args, out);
    if (trace && st != FA_OK && ctx->set.verbose) fa_verbose_error(ctx, st);
    fa_context_leave(ctx);
    return st;
}

