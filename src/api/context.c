/*
 * context.c: the lasting state of the library: contexts, their threads and kernel
 * table, their settings and read-outs (the tables of context.h), and error messages.
 */
#include "context.h"
#include "algos.h"
#include "workspace.h"
#include "cpu.h"
#include "threadpool.h"
#include "alloc.h"
#include "tune.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int fa_context_enter(fa_context *ctx)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&ctx->busy, &expected, 1)) return 0;
    ctx->error[0] = '\0';
    if (ctx->pool) fa_pool_clear(ctx->pool); /* FA_PARAM_LAST_POOL speaks of this call alone */
    return 1;
}

void fa_context_leave(fa_context *ctx) { atomic_store(&ctx->busy, 0); }

fa_status fa_fail(fa_context *ctx, fa_status status, const char *fmt, ...)
{
    if (ctx) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->error, sizeof ctx->error, fmt, ap);
        va_end(ap);
    }
    return status;
}

static int online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (n > 1024 ? 1024 : (int)n);
}

/* (Re)starts the worker pool for `setting` threads, on the host's parallel-for
 * `host` when non-NULL; the old pool stays on failure. The pool exists for one
 * thread too: it runs the kernel table's per-thread hooks. */
static fa_status apply_pool(fa_context *ctx, int64_t setting, fa_parallel_fn host, void *user)
{
    int n = setting == 0 ? online_cpus() : (int)setting;
    fa_pool *pool = NULL;
    const fa_thread_hook begin = ctx->kernels->thread_begin, end = ctx->kernels->thread_end;
    fa_status st = host ? fa_pool_create_host(n, host, user, begin, end, &pool) : fa_pool_create(n - 1, begin, end, &pool);
    if (st != FA_OK) {
        if (st == FA_ERR_THREADS) return fa_fail(ctx, st, "could not start %d worker threads", n - 1);
        return fa_fail(ctx, st, "out of memory for a pool of %d worker threads", n - 1);
    }
    fa_pool_free(ctx->pool);
    ctx->pool = pool;
    ctx->threads = n;
    ctx->set.threads = setting;
    ctx->host = host;
    ctx->host_user = user;
    return FA_OK;
}

fa_status fa_context_set_parallel(fa_context *ctx, fa_parallel_fn fn, void *user)
{
    if (!ctx) return FA_ERR_NULL_CONTEXT;
    if (!fa_context_enter(ctx)) return FA_ERR_BUSY;
    const fa_status st = apply_pool(ctx, ctx->set.threads, fn, fn ? user : NULL);
    fa_context_leave(ctx);
    return st;
}

fa_status fa_context_create(fa_context **out)
{
    if (!out) return FA_ERR_NULL_POINTER;
    *out = NULL;
    fa_context *ctx = fa_calloc(1, (int64_t)sizeof *ctx);
    if (!ctx) return FA_ERR_OUT_OF_MEMORY;
    ctx->set.algo = FA_ALGO_AUTO;
    ctx->last.algo = FA_ALGO_AUTO;
    const char *verbose = getenv("FLASHATTN_VERBOSE");
    ctx->set.verbose = verbose && *verbose && strcmp(verbose, "0") != 0;
    const char *dot = getenv("FLASHATTN_BF16_DOT");
    ctx->set.bf16_dot = dot && (*dot == '1' || *dot == '2') ? *dot - '0' : 0;
    const char *mm = getenv("FLASHATTN_F32_MATMUL");
    ctx->set.f32_matmul = !mm                       ? FA_F32_MATMUL_IEEE
                          : strcmp(mm, "bf16x3") == 0 ? FA_F32_MATMUL_BF16X3
                          : strcmp(mm, "bf16") == 0   ? FA_F32_MATMUL_BF16
                                                      : FA_F32_MATMUL_IEEE;
    const char *fu = getenv("FLASHATTN_BF16_FUSED");
    ctx->set.bf16_fused = !(fu && strcmp(fu, "0") == 0); /* on unless "0" */
    const char *qm = getenv("FLASHATTN_QUANT_MATMUL");
    ctx->set.quant_matmul = !qm                     ? FA_QUANT_MATMUL_EXACT
                            : strcmp(qm, "i8") == 0   ? FA_QUANT_MATMUL_I8
                            : strcmp(qm, "i8x2") == 0 ? FA_QUANT_MATMUL_I8X2
                                                      : FA_QUANT_MATMUL_EXACT;
    fa_status st = fa_kernels_select(&ctx->kernels, ctx->error, sizeof ctx->error);
    if (st == FA_OK) st = apply_pool(ctx, 0, NULL, NULL);
    if (st != FA_OK) {
        fa_context_free(ctx);
        return st;
    }
    fa_context_read_tune(ctx);
    *out = ctx;
    return FA_OK;
}

void fa_context_free(fa_context *ctx)
{
    if (!ctx) return;
    fa_pool_free(ctx->pool);
    fa_workspace_free(ctx->ws_kept[0]);
    fa_workspace_free(ctx->ws_kept[1]);
    fa_tune_free(ctx->tune.table);
    fa_free(ctx->seqs);
    fa_free(ctx);
}

/* context.h's two tables as one: each parameter's bounds and where its value lives. */
typedef struct param_row {
    fa_param param;
    int64_t lo, hi;
    size_t offset;  /* of its int64_t in fa_context */
    int read_only;  /* a read-out of the last call */
} param_row;

static const param_row g_params[] = {
#define FA_SETTING_ROW(param, field, lo, hi) {param, lo, hi, offsetof(fa_context, set.field), 0},
    FA_SETTINGS(FA_SETTING_ROW)
#undef FA_SETTING_ROW
#define FA_READOUT_ROW(param, field, lo, hi) {param, lo, hi, offsetof(fa_context, last.field), 1},
    FA_READOUTS(FA_READOUT_ROW)
#undef FA_READOUT_ROW
    /* the phase profile's read-outs, one per phase and kind */
#define FA_PHASE_ROW(k)                                                                                      \
    {(fa_param)(FA_PARAM_LAST_PHASE_US + (k)), 0, INT64_MAX, offsetof(fa_context, last.phase_us) + (k) * sizeof(int64_t), 1}, \
    {(fa_param)(FA_PARAM_LAST_PHASE_FLOP + (k)), 0, INT64_MAX, offsetof(fa_context, last.phase_flop) + (k) * sizeof(int64_t), 1},
    FA_PHASE_ROW(0) FA_PHASE_ROW(1) FA_PHASE_ROW(2) FA_PHASE_ROW(3) FA_PHASE_ROW(4) FA_PHASE_ROW(5) FA_PHASE_ROW(6)
#undef FA_PHASE_ROW
};
_Static_assert(FA_PHASES == 7, "one FA_PHASE_ROW per phase");

static const param_row *param_find(fa_param param)
{
    for (size_t i = 0; i < sizeof g_params / sizeof g_params[0]; i++)
        if (g_params[i].param == param) return &g_params[i];
    return NULL;
}

static int64_t *param_field(fa_context *ctx, const param_row *row) { return (int64_t *)(void *)((char *)ctx + row->offset); }

fa_status fa_param_bounds(fa_param param, int64_t *lo, int64_t *hi)
{
    if (!lo || !hi) return FA_ERR_NULL_POINTER;
    const param_row *row = param_find(param);
    if (param == FA_PARAM_BF16_DOT_ACTIVE) { /* computed, not stored */
        *lo = 0;
        *hi = 1;
        return FA_OK;
    }
    if (!row) return FA_ERR_INVALID_ARGUMENT;
    *lo = row->lo;
    *hi = row->hi;
    return FA_OK;
}

static fa_status context_set(fa_context *ctx, fa_param param, int64_t value)
{
    const param_row *row = param_find(param);
    if (!row && param != FA_PARAM_BF16_DOT_ACTIVE)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "unknown parameter %d", (int)param);
    if (!row || row->read_only)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "parameter %d is read-only", (int)param);
    if (value < row->lo || value > row->hi)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "parameter %d: value %lld is outside [%lld, %lld]",
                       (int)param, (long long)value, (long long)row->lo, (long long)row->hi);
    if (param == FA_PARAM_THREADS) return apply_pool(ctx, value, ctx->host, ctx->host_user);
    *param_field(ctx, row) = value;
    return FA_OK;
}

fa_status fa_context_set(fa_context *ctx, fa_param param, int64_t value)
{
    if (!ctx) return FA_ERR_NULL_CONTEXT;
    if (!fa_context_enter(ctx)) return FA_ERR_BUSY;
    const fa_status st = context_set(ctx, param, value);
    fa_context_leave(ctx);
    return st;
}

fa_status fa_context_get(const fa_context *ctx, fa_param param, int64_t *value)
{
    if (!ctx) return FA_ERR_NULL_CONTEXT;
    if (!value) return FA_ERR_NULL_POINTER;
    if (param == FA_PARAM_BF16_DOT_ACTIVE) {
        *value = fa_bf16_dot_active(ctx);
        return FA_OK;
    }
    const param_row *row = param_find(param);
    if (!row) return FA_ERR_INVALID_ARGUMENT;
    *value = *param_field((fa_context *)(uintptr_t)ctx, row);
    return FA_OK;
}

const char *fa_context_error(const fa_context *ctx)
{
    return ctx ? ctx->error : "the context is NULL";
}

const char *fa_context_isa(const fa_context *ctx)
{
    return ctx && ctx->kernels ? ctx->kernels->name : "none";
}

int fa_isa_info(int index, const char **name, const char **why)
{
    int runs = 0;
    const fa_kernels *k = fa_kernels_at(index, &runs);
    if (!k) return -1;
    if (name) *name = k->name;
    if (why) *why = fa_kernels_why_not(index);
    return runs;
}

