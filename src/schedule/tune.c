/*
 * tune.c: fa_tune, the sweep behind `flashattn tune` and flashattn.tune(): times
 * the flash forward of one call with the planner's tiles and with every pair of a
 * grid, keeps the fastest, and saves it through the tune file's writer
 * (src/schedule/tune_file.c, the file's only home). The shape class comes from the
 * planner itself (ctx->tune.key, recorded by the heuristic run's plan), so the
 * saved entry is keyed exactly as later calls look it up. Never prints: progress
 * goes to the caller's callback.
 */
#include "tune.h"
#include "entry.h"
#include "alloc.h"
#include "checks.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const int64_t default_qs[] = {16, 32, 64, 128, 256};
static const int64_t default_kvs[] = {32, 64, 128, 256, 512};
#define TUNE_RUNS_MAX ((int64_t)1 << 20)

/* One sweep: the call, the resolved options, and the result it builds. */
typedef struct sweep {
    fa_context *ctx;
    const fa_forward_args *args;
    fa_tune_options opt;
    double *times; /* opt.runs */
    int done, total;
    fa_tune_result r;
} sweep;

/* A candidate list: the caller's, each within its setting's bounds, or the default. */
static fa_status check_tiles(fa_context *ctx, const char *name, fa_param param, const int64_t **list, int *n,
                             const int64_t *dflt, int n_dflt)
{
    if (!*list) {
        *list = dflt;
        *n = n_dflt;
        return FA_OK;
    }
    if (*n < 1 || *n > FA_TUNE_MAX_TILES)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "options->n_%s is %d; 1 to %d candidates", name, *n,
                       FA_TUNE_MAX_TILES);
    int64_t lo, hi;
    fa_param_bounds(param, &lo, &hi);
    for (int i = 0; i < *n; i++)
        if ((*list)[i] < 1 || (*list)[i] > hi)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "options->%s[%d] is %lld; a tile is 1 to %lld", name, i,
                           (long long)(*list)[i], (long long)hi);
    return FA_OK;
}

static fa_status read_options(fa_context *ctx, const fa_tune_options *user, fa_tune_options *opt)
{
    fa_tune_options_init(opt);
    if (user) {
        const fa_status st =
            fa_read_struct(ctx, "options", user, user->struct_size, opt, sizeof *opt, sizeof *opt);
        if (st != FA_OK) return st;
    }
    fa_status st = check_tiles(ctx, "tile_qs", FA_PARAM_TILE_Q, &opt->tile_qs, &opt->n_tile_qs, default_qs,
                               (int)(sizeof default_qs / sizeof default_qs[0]));
    if (st == FA_OK)
        st = check_tiles(ctx, "tile_kvs", FA_PARAM_TILE_KV, &opt->tile_kvs, &opt->n_tile_kvs, default_kvs,
                         (int)(sizeof default_kvs / sizeof default_kvs[0]));
    if (st != FA_OK) return st;
    if (opt->runs < 0 || opt->runs > TUNE_RUNS_MAX)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "options->runs is %lld; 0 (the default, %d) to %lld",
                       (long long)opt->runs, FA_TUNE_DEFAULT_RUNS, (long long)TUNE_RUNS_MAX);
    if (opt->runs == 0) opt->runs = FA_TUNE_DEFAULT_RUNS;
    if (opt->save != 0 && opt->save != 1)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "options->save is %d; 0 or 1", opt->save);
    return FA_OK;
}

static int by_time(const double *a, const double *b)
{
    return isnan(*a) ? 0 : isnan(*b) || *a < *b; /* out of memory (NaN) last */
}

/* One warm-up and opt.runs timed forwards with tiles (tq, tkv) into *t. A run out of
 * memory gives ms NaN and FA_OK; other failures their status. */
static fa_status time_candidate(sweep *sw, int64_t tq, int64_t tkv, fa_tune_timing *t)
{
    fa_context *ctx = sw->ctx;
    ctx->set.tile_q = tq;
    ctx->set.tile_kv = tkv;
    *t = (fa_tune_timing){.tile_q = tq, .tile_kv = tkv, .asked_q = tq, .asked_kv = tkv, .ms = NAN};
    fa_status st = FA_OK;
    for (int64_t r = -1; st == FA_OK && r < sw->opt.runs; r++) { /* r = -1: the warm-up */
        const double t0 = fa_now_s();
        st = fa_forward_entered(ctx, sw->args);
        if (r >= 0) sw->times[r] = fa_now_s() - t0;
    }
    if (st == FA_ERR_OUT_OF_MEMORY) return FA_OK;
    if (st != FA_OK) return st;
    t->tile_q = ctx->last.br;
    t->tile_kv = ctx->last.bc;
    /* the median, by insertion: runs are few */
    const int64_t n = sw->opt.runs;
    for (int64_t i = 1; i < n; i++)
        for (int64_t j = i; j > 0 && sw->times[j] < sw->times[j - 1]; j--) {
            const double x = sw->times[j];
            sw->times[j] = sw->times[j - 1];
            sw->times[j - 1] = x;
        }
    t->ms = 1e3 * (n % 2 ? sw->times[n / 2] : 0.5 * (sw->times[n / 2 - 1] + sw->times[n / 2]));
    return FA_OK;
}

/* Times one candidate and adds it to the result, fastest first, unless it ran as one
 * already there did. */
static fa_status add_candidate(sweep *sw, int64_t tq, int64_t tkv)
{
    fa_tune_timing t;
    const fa_status st = time_candidate(sw, tq, tkv, &t);
    if (st != FA_OK) return st;
    if (tq == 0 && tkv == 0) {
        sw->r.heuristic = t;
        sw->r.threads = sw->ctx->last.threads;
    }
    fa_tune_result *r = &sw->r;
    int dup = 0;
    for (int i = 0; i < r->n_timings && !dup; i++)
        dup = !isnan(t.ms) && !isnan(r->timings[i].ms) && r->timings[i].tile_q == t.tile_q &&
              r->timings[i].tile_kv == t.tile_kv;
    if (!dup) {
        int i = r->n_timings++;
        for (; i > 0 && by_time(&t.ms, &r->timings[i - 1].ms); i--) r->timings[i] = r->timings[i - 1];
        r->timings[i] = t;
        if (i == 0 && !isnan(t.ms)) r->threads = sw->ctx->last.threads;
    }
    sw->done++;
    if (sw->opt.progress) sw->opt.progress(sw->opt.user, sw->done, sw->total, t.tile_q, t.tile_kv, t.ms);
    return FA_OK;
}

/* The planner's pair first (it records the call's shape class), then the grid. */
static fa_status run_sweep(sweep *sw)
{
    fa_context *ctx = sw->ctx;
    sw->total = 1 + sw->opt.n_tile_qs * sw->opt.n_tile_kvs;
    ctx->tune.key.d = 0; /* D >= 1 in every valid call: 0 says no plan ran */
    fa_status st = add_candidate(sw, 0, 0);
    if (st != FA_OK) return st;
    if (ctx->tune.key.d == 0)
        return isnan(sw->r.heuristic.ms)
                   ? fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "tune: the planned tiles ran out of memory")
                   : fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "tune: the call is empty (no rows or no keys): "
                                                           "there are no tiles to tune");
    const fa_tune_key key = ctx->tune.key; /* the grid's runs plan with overrides: no lookup */
    for (int a = 0; a < sw->opt.n_tile_qs && st == FA_OK; a++)
        for (int b = 0; b < sw->opt.n_tile_kvs && st == FA_OK; b++)
            st = add_candidate(sw, sw->opt.tile_qs[a], sw->opt.tile_kvs[b]);
    ctx->tune.key = key;
    if (st != FA_OK) return st;
    if (isnan(sw->r.timings[0].ms))
        return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "tune: every candidate ran out of memory");
    return FA_OK;
}

/* Saves the best pair where opt.path or the library's rule says; the path, or why
 * there is none, goes into the result. */
static fa_status save_best(sweep *sw)
{
    fa_context *ctx = sw->ctx;
    fa_tune_result *r = &sw->r;
    const fa_tune_timing *best = &r->timings[0];
    r->saved_tile_q = best->asked_q > 0 ? best->asked_q : best->tile_q;
    r->saved_tile_kv = best->asked_kv > 0 ? best->asked_kv : best->tile_kv;
    if (!sw->opt.save || !r->path[0]) return FA_OK;
    int64_t dropped = 0;
    const fa_status st = fa_tune_save(r->path, ctx->kernels->name, &ctx->tune.key, r->saved_tile_q,
                                      r->saved_tile_kv, &dropped, ctx->error, sizeof ctx->error);
    if (st != FA_OK) {
        snprintf(r->note, sizeof r->note, "%s", ctx->error);
        return st;
    }
    r->saved = 1;
    if (dropped > 0)
        snprintf(r->note, sizeof r->note, "dropped %lld line%s that %s not tune entries", (long long)dropped,
                 dropped == 1 ? "" : "s", dropped == 1 ? "was" : "were");
    /* the context reads the file again: its next planned call finds the new entry */
    fa_context_read_tune(ctx);
    return FA_OK;
}

/* Validates, resolves where to save (refusing a file that is not a tune file before
 * anything runs), sweeps and saves. */
static fa_status tune(sweep *sw, const fa_tune_options *options)
{
    fa_context *ctx = sw->ctx;
    fa_problem p;
    fa_status st = read_options(ctx, options, &sw->opt);
    if (st == FA_OK) st = fa_validate_forward(ctx, sw->args, &p);
    if (st != FA_OK) return st;
    fa_tune_result *r = &sw->r;
    r->runs = sw->opt.runs;
    if (sw->opt.path && snprintf(r->path, sizeof r->path, "%s", sw->opt.path) >= (int)sizeof r->path)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "options->path is longer than %zu bytes", sizeof r->path - 1);
    if (!sw->opt.path && !fa_tune_path(r->path, sizeof r->path, r->note, sizeof r->note)) r->path[0] = '\0';
    if (sw->opt.save && r->path[0] && (st = fa_tune_file_check(r->path, ctx->error, sizeof ctx->error)) != FA_OK)
        return st;
    sw->times = fa_malloc(sw->opt.runs * (int64_t)sizeof *sw->times);
    if (!sw->times) return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "tune: out of memory for %lld timings",
                                   (long long)sw->opt.runs);
    const fa_algo algo = ctx->set.algo;
    const int64_t tile_q = ctx->set.tile_q, tile_kv = ctx->set.tile_kv;
    ctx->set.algo = FA_ALGO_FLASH;
    ctx->tune.off = 1;
    st = run_sweep(sw);
    ctx->set.algo = algo;
    ctx->set.tile_q = tile_q;
    ctx->set.tile_kv = tile_kv;
    ctx->tune.off = 0;
    fa_free(sw->times);
    if (st != FA_OK) return st;
    r->best = r->timings[0];
    fa_tune_key_text(ctx->kernels->name, &ctx->tune.key, r->key, sizeof r->key);
    snprintf(r->cpu, sizeof r->cpu, "%s", fa_cpu_model());
    return save_best(sw);
}

void fa_tune_options_init(fa_tune_options *options)
{
    if (!options) return;
    const fa_tune_options init = FA_TUNE_OPTIONS_INIT;
    *options = init;
}

fa_status fa_tune(fa_context *ctx, const fa_forward_args *args, const fa_tune_options *options,
                  fa_tune_result *result)
{
    if (!ctx) return FA_ERR_NULL_CONTEXT;
    if (!fa_context_enter(ctx)) return FA_ERR_BUSY;
    fa_status st = FA_OK;
    if (!args || !result) {
        st = fa_fail(ctx, FA_ERR_NULL_POINTER, "fa_tune: %s is NULL", !args ? "args" : "result");
    } else if (result->struct_size < sizeof *result) {
        st = fa_fail(ctx, FA_ERR_STRUCT_SIZE, "result->struct_size is %zu; initialise it with "
                     "FA_TUNE_RESULT_INIT (this library's is %zu)", result->struct_size, sizeof *result);
    } else {
        sweep *sw = fa_calloc(1, (int64_t)sizeof *sw);
        if (!sw) {
            st = fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "tune: out of memory");
        } else {
            sw->ctx = ctx;
            sw->args = args;
            sw->r.struct_size = result->struct_size;
            st = tune(sw, options);
            /* a failed save keeps the timings: the one failure that fills the result */
            if (st == FA_OK || (st == FA_ERR_IO && sw->r.n_timings > 0)) memcpy(result, &sw->r, sizeof sw->r);
            fa_free(sw);
        }
    }
    if (st == FA_OK) ctx->error[0] = '\0'; /* candidates out of memory left their words */
    if (st != FA_OK && ctx->set.verbose) fa_verbose_error(ctx, st);
    fa_context_leave(ctx);
    return st;
}
