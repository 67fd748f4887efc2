/*
 * forward.c: fa_forward: validate, pick the algorithm, run it, record what ran.
 * The algorithm table below is the one place a new algorithm is registered.
 */
#include "internal.h"
#include "convert.h"

#include <math.h>

typedef struct {
    fa_algo algo;
    /* NULL when the algorithm runs every valid call; else says why it cannot. */
    const char *(*cannot_run)(const fa_problem *p);
    fa_status (*run)(fa_context *ctx, const fa_problem *p, fa_run_info *info);
    /* The backward pass of the same algorithm (fa_backward, planned): each
     * algorithm differentiates its own forward; NULL until it is written, and
     * fa_backward will refuse an algorithm whose entry is NULL. */
    fa_status (*run_backward)(fa_context *ctx, const fa_problem *p, fa_run_info *info);
} fa_algo_entry;

/* The baselines materialise per-(b, h) matrices of one dense shape; the inference
 * forms (ragged, cached, paged) exist to be fast, so only flash runs them. */
static const char *dense_only(const fa_problem *p)
{
    return fa_problem_is_form(p) ? "variable-length and KV-cache calls run on flash only" : NULL;
}

static const fa_algo_entry g_algos[] = {
    {FA_ALGO_FLASH, NULL, fa_run_flash, NULL},
    {FA_ALGO_STANDARD, dense_only, fa_run_standard, NULL},
    {FA_ALGO_REFERENCE, dense_only, fa_run_reference, NULL},
};

static const fa_algo_entry *find_algo(fa_algo algo)
{
    for (size_t i = 0; i < sizeof g_algos / sizeof g_algos[0]; i++)
        if (g_algos[i].algo == algo) return &g_algos[i];
    return NULL;
}

/* A dense call with no keys: every row keeps nothing, so o = 0 and lse = -inf
 * (docs/semantics.md, empty rows), whichever algorithm was asked for. */
static void write_empty_rows(const fa_problem *p)
{
    static const float zeros[256];
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < p->Hq; h++) {
            for (int64_t e0 = 0; e0 < p->Dv; e0 += 256) {
                fa_tensor o = p->o; /* columns e0 .. of every row */
                o.data = (char *)o.data + e0 * o.stride[3] * (int64_t)fa_dtype_size(o.dtype);
                for (int64_t i = 0; i < p->Sq; i++)
                    fa_store_rows(&o, b, i, 1, h, p->Dv - e0 < 256 ? p->Dv - e0 : 256, zeros, 0);
            }
            if (p->has_lse)
                for (int64_t i = 0; i < p->Sq; i++)
                    ((float *)p->lse.data)[b * p->lse.stride[0] + h * p->lse.stride[1] + i * p->lse.stride[2]] =
                        -INFINITY;
        }
}

static fa_status forward(fa_context *ctx, const fa_forward_args *args)
{
    fa_problem p;
    fa_status st = fa_validate_forward(ctx, args, &p);
    if (st != FA_OK) return st;

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
    const double t0 = ctx->verbose ? fa_now_s() : 0.0;
    if (!fa_problem_is_form(&p) && (p.B == 0 || p.Sq == 0 || p.Hq == 0)) {
        info.path = "empty"; /* nothing to compute or write */
    } else if (!fa_problem_is_form(&p) && p.Sk == 0) {
        write_empty_rows(&p);
        info.path = "empty";
    } else if ((st = e->run(ctx, &p, &info)) != FA_OK) {
        return st;
    }
    ctx->last_algo = e->algo;
    ctx->last_extra_bytes = info.extra_bytes;
    ctx->last_tile_q = info.br;
    ctx->last_tile_kv = info.bc;
    ctx->last_threads = info.threads;
    ctx->last_kv_splits = info.kv_splits;
    if (ctx->verbose) fa_verbose_exec(ctx, &p, e->algo, fallback, &info, (fa_now_s() - t0) * 1e3);
    return FA_OK;
}

fa_status fa_forward(fa_context *ctx, const fa_forward_args *args)
{
    if (!ctx) return FA_ERR_NULL_CONTEXT;
    if (!fa_context_enter(ctx)) return FA_ERR_BUSY;
    const fa_status st = forward(ctx, args);
    if (st != FA_OK && ctx->verbose) fa_verbose_error(ctx, st);
    fa_context_leave(ctx);
    return st;
}
