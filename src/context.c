/*
 * context.c: the lasting state of the library (contexts, their settings and
 * error messages) and the small public helpers that need no algorithm:
 * versions, status and dtype names, tensor views.
 */
#include "internal.h"
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

#define FA_STR2(x) #x
#define FA_STR(x) FA_STR2(x)

unsigned fa_version_number(void) { return FA_VERSION_NUMBER; }

const char *fa_version_string(void)
{
    return FA_STR(FA_VERSION_MAJOR) "." FA_STR(FA_VERSION_MINOR) "." FA_STR(FA_VERSION_PATCH);
}

const char *fa_status_string(fa_status status)
{
    switch (status) {
    case FA_OK: return "ok";
    case FA_ERR_NULL_CONTEXT: return "the context is NULL";
    case FA_ERR_NULL_POINTER: return "a required pointer is NULL";
    case FA_ERR_STRUCT_SIZE: return "the argument struct's struct_size is not one this library knows";
    case FA_ERR_INVALID_DIM: return "a dimension is negative, or zero where it has no meaning";
    case FA_ERR_SHAPE_MISMATCH: return "tensor shapes do not agree";
    case FA_ERR_HEAD_RATIO: return "query heads are not a multiple of key/value heads";
    case FA_ERR_DTYPE: return "unsupported or mixed dtypes";
    case FA_ERR_OVERFLOW: return "a size or offset overflows 64 bits";
    case FA_ERR_BROADCAST: return "bias or mask does not broadcast to [B, Hq, Sq, Sk]";
    case FA_ERR_INVALID_ARGUMENT: return "invalid argument value";
    case FA_ERR_UNSUPPORTED: return "not supported by the chosen algorithm or instruction-set path";
    case FA_ERR_OUT_OF_MEMORY: return "out of memory";
    case FA_ERR_THREADS: return "worker threads could not be started";
    case FA_ERR_ISA_UNAVAILABLE: return "the requested instruction-set path is not available";
    case FA_ERR_OUT_OF_RANGE: return "an index or length is out of range";
    case FA_ERR_BUSY: return "the context is in use by another thread";
    case FA_ERR_IO: return "the tune file could not be read or written";
    }
    return "unknown status code";
}

size_t fa_dtype_size(fa_dtype dtype)
{
    switch (dtype) {
    case FA_DTYPE_F32: return 4;
    case FA_DTYPE_F16: return 2;
    case FA_DTYPE_BF16: return 2;
    case FA_DTYPE_BOOL: return 1;
    case FA_DTYPE_I8: return 1;
    }
    return 0;
}

const char *fa_dtype_name(fa_dtype dtype)
{
    switch (dtype) {
    case FA_DTYPE_F32: return "f32";
    case FA_DTYPE_F16: return "f16";
    case FA_DTYPE_BF16: return "bf16";
    case FA_DTYPE_BOOL: return "bool";
    case FA_DTYPE_I8: return "i8";
    }
    return "unknown";
}

const char *fa_algo_name(fa_algo algo)
{
    switch (algo) {
    case FA_ALGO_AUTO: return "auto";
    case FA_ALGO_FLASH: return "flash";
    case FA_ALGO_STANDARD: return "standard";
    case FA_ALGO_REFERENCE: return "reference";
    }
    return "unknown";
}

/* x * y, or INT64_MAX when the product does not fit: a stride that no valid tensor
 * has, since a tensor whose strides overflow has an element count that does too,
 * which every call refuses (FA_ERR_OVERFLOW). Negative dims are refused as well. */
static int64_t stride_mul(int64_t x, int64_t y)
{
    int64_t r;
    return fa_mul_ok(x, y, &r) ? r : INT64_MAX;
}

fa_tensor fa_tensor_make(void *data, fa_dtype dtype, fa_layout layout,
                         int64_t batch, int64_t seq, int64_t heads, int64_t dim)
{
    /* Logical order is always (b, s, n, d); only the strides differ. */
    fa_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.shape[0] = batch;
    t.shape[1] = seq;
    t.shape[2] = heads;
    t.shape[3] = dim;
    t.stride[3] = 1;
    switch (layout) {
    case FA_LAYOUT_BNSD:
        t.stride[1] = dim;
        t.stride[2] = stride_mul(seq, dim);
        t.stride[0] = stride_mul(heads, t.stride[2]);
        break;
    case FA_LAYOUT_SBH:
        t.stride[2] = dim;
        t.stride[0] = stride_mul(heads, dim);
        t.stride[1] = stride_mul(batch, t.stride[0]);
        break;
    case FA_LAYOUT_BSND:
    case FA_LAYOUT_BSH:
    default:
        t.stride[2] = dim;
        t.stride[1] = stride_mul(heads, dim);
        t.stride[0] = stride_mul(seq, t.stride[1]);
        break;
    }
    return t;
}

fa_tensor fa_tensor_contiguous(void *data, fa_dtype dtype, int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    fa_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.shape[0] = d0;
    t.shape[1] = d1;
    t.shape[2] = d2;
    t.shape[3] = d3;
    t.stride[3] = 1;
    t.stride[2] = d3;
    t.stride[1] = stride_mul(d2, d3);
    t.stride[0] = stride_mul(d1, t.stride[1]);
    return t;
}

void fa_kv_cache_init(fa_kv_cache *cache)
{
    if (!cache) return;
    fa_kv_cache init = FA_KV_CACHE_INIT;
    *cache = init;
}

int fa_context_enter(fa_context *ctx)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&ctx->busy, &expected, 1)) return 0;
    ctx->error[0] = '\0';
    return 1;
}

void fa_context_leave(fa_context *ctx) { atomic_store(&ctx->busy, 0); }

void fa_backward_args_init(fa_backward_args *args)
{
    if (!args) return;
    fa_backward_args init = FA_BACKWARD_ARGS_INIT;
    *args = init;
}

void fa_forward_args_init(fa_forward_args *args)
{
    if (!args) return;
    fa_forward_args init = FA_FORWARD_ARGS_INIT;
    *args = init;
}

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

/* (Re)starts the worker pool for `setting` threads; the old pool stays on failure.
 * The pool exists for one thread too: it runs the kernel table's per-thread hooks. */
static fa_status apply_threads(fa_context *ctx, int64_t setting)
{
    int n = setting == 0 ? online_cpus() : (int)setting;
    fa_pool *pool = NULL;
    fa_status st = fa_pool_create(n - 1, ctx->kernels->thread_begin, ctx->kernels->thread_end, &pool);
    if (st != FA_OK) {
        if (st == FA_ERR_THREADS) return fa_fail(ctx, st, "could not start %d worker threads", n - 1);
        return fa_fail(ctx, st, "out of memory for a pool of %d worker threads", n - 1);
    }
    fa_pool_free(ctx->pool);
    ctx->pool = pool;
    ctx->threads = n;
    ctx->threads_setting = setting;
    return FA_OK;
}

fa_status fa_context_create(fa_context **out)
{
    if (!out) return FA_ERR_NULL_POINTER;
    *out = NULL;
    fa_context *ctx = fa_calloc(1, (int64_t)sizeof *ctx);
    if (!ctx) return FA_ERR_OUT_OF_MEMORY;
    ctx->algo = FA_ALGO_AUTO;
    ctx->last_algo = FA_ALGO_AUTO;
    const char *verbose = getenv("FLASHATTN_VERBOSE");
    ctx->verbose = verbose && *verbose && strcmp(verbose, "0") != 0;
    const char *dot = getenv("FLASHATTN_BF16_DOT");
    ctx->bf16_dot = dot && (*dot == '1' || *dot == '2') ? *dot - '0' : 0;
    fa_status st = fa_kernels_select(&ctx->kernels, ctx->error, sizeof ctx->error);
    if (st == FA_OK) st = apply_threads(ctx, 0);
    if (st != FA_OK) {
        fa_context_free(ctx);
        return st;
    }
    *out = ctx;
    return FA_OK;
}

void fa_context_free(fa_context *ctx)
{
    if (!ctx) return;
    fa_pool_free(ctx->pool);
    fa_workspace_free(ctx->ws_kept[0]);
    fa_workspace_free(ctx->ws_kept[1]);
    fa_tune_free(ctx->tune);
    fa_free(ctx);
}

fa_status fa_param_bounds(fa_param param, int64_t *lo, int64_t *hi)
{
    if (!lo || !hi) return FA_ERR_NULL_POINTER;
    switch (param) {
    case FA_PARAM_THREADS: *lo = 0; *hi = 1024; return FA_OK;
    case FA_PARAM_ALGO: *lo = FA_ALGO_AUTO; *hi = FA_ALGO_REFERENCE; return FA_OK;
    case FA_PARAM_TILE_Q: *lo = 0; *hi = 4096; return FA_OK;
    case FA_PARAM_TILE_KV: *lo = 0; *hi = 65536; return FA_OK;
    case FA_PARAM_VERBOSE: *lo = 0; *hi = 1; return FA_OK;
    case FA_PARAM_BF16_DOT: *lo = 0; *hi = 2; return FA_OK;
    case FA_PARAM_KV_SPLITS: *lo = 0; *hi = FA_MAX_KV_SPLITS; return FA_OK;
    case FA_PARAM_KV_PACK: *lo = 0; *hi = 2; return FA_OK;
    case FA_PARAM_LAST_ALGO: *lo = FA_ALGO_AUTO; *hi = FA_ALGO_REFERENCE; return FA_OK;
    case FA_PARAM_LAST_EXTRA_BYTES: *lo = 0; *hi = INT64_MAX; return FA_OK;
    case FA_PARAM_LAST_TILE_Q: *lo = 0; *hi = INT64_MAX; return FA_OK;
    case FA_PARAM_LAST_TILE_KV: *lo = 0; *hi = INT64_MAX; return FA_OK;
    case FA_PARAM_LAST_THREADS: *lo = 0; *hi = 1024; return FA_OK;
    case FA_PARAM_BF16_DOT_ACTIVE: *lo = 0; *hi = 1; return FA_OK;
    case FA_PARAM_LAST_KV_SPLITS: *lo = 0; *hi = FA_MAX_KV_SPLITS; return FA_OK;
    case FA_PARAM_LAST_BACKWARD_PASSES: *lo = 0; *hi = 2; return FA_OK;
    case FA_PARAM_LAST_KV_PACKED: *lo = 0; *hi = INT64_MAX; return FA_OK;
    case FA_PARAM_LAST_KV_PACK_US: *lo = 0; *hi = INT64_MAX; return FA_OK;
    }
    return FA_ERR_INVALID_ARGUMENT;
}

static fa_status context_set(fa_context *ctx, fa_param param, int64_t value)
{
    int64_t lo, hi;
    if (fa_param_bounds(param, &lo, &hi) != FA_OK)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "unknown parameter %d", (int)param);
    if (param >= FA_PARAM_LAST_ALGO)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "parameter %d is read-only", (int)param);
    if (value < lo || value > hi)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "parameter %d: value %lld is outside [%lld, %lld]",
                       (int)param, (long long)value, (long long)lo, (long long)hi);
    switch (param) {
    case FA_PARAM_THREADS: return apply_threads(ctx, value);
    case FA_PARAM_ALGO: ctx->algo = (fa_algo)value; return FA_OK;
    case FA_PARAM_TILE_Q: ctx->tile_q = value; return FA_OK;
    case FA_PARAM_TILE_KV: ctx->tile_kv = value; return FA_OK;
    case FA_PARAM_VERBOSE: ctx->verbose = (int)value; return FA_OK;
    case FA_PARAM_BF16_DOT: ctx->bf16_dot = (int)value; return FA_OK;
    case FA_PARAM_KV_SPLITS: ctx->kv_splits = value; return FA_OK;
    case FA_PARAM_KV_PACK: ctx->kv_pack = (int)value; return FA_OK;
    default: break;
    }
    return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "unknown parameter %d", (int)param);
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
    switch (param) {
    case FA_PARAM_THREADS: *value = ctx->threads_setting; return FA_OK;
    case FA_PARAM_ALGO: *value = ctx->algo; return FA_OK;
    case FA_PARAM_TILE_Q: *value = ctx->tile_q; return FA_OK;
    case FA_PARAM_TILE_KV: *value = ctx->tile_kv; return FA_OK;
    case FA_PARAM_VERBOSE: *value = ctx->verbose; return FA_OK;
    case FA_PARAM_BF16_DOT: *value = ctx->bf16_dot; return FA_OK;
    case FA_PARAM_LAST_ALGO: *value = ctx->last_algo; return FA_OK;
    case FA_PARAM_LAST_EXTRA_BYTES: *value = ctx->last_extra_bytes; return FA_OK;
    case FA_PARAM_LAST_TILE_Q: *value = ctx->last_tile_q; return FA_OK;
    case FA_PARAM_LAST_TILE_KV: *value = ctx->last_tile_kv; return FA_OK;
    case FA_PARAM_LAST_THREADS: *value = ctx->last_threads; return FA_OK;
    case FA_PARAM_BF16_DOT_ACTIVE: *value = fa_bf16_dot_active(ctx); return FA_OK;
    case FA_PARAM_KV_SPLITS: *value = ctx->kv_splits; return FA_OK;
    case FA_PARAM_LAST_KV_SPLITS: *value = ctx->last_kv_splits; return FA_OK;
    case FA_PARAM_LAST_BACKWARD_PASSES: *value = ctx->last_backward_passes; return FA_OK;
    case FA_PARAM_KV_PACK: *value = ctx->kv_pack; return FA_OK;
    case FA_PARAM_LAST_KV_PACKED: *value = ctx->last_kv_packed; return FA_OK;
    case FA_PARAM_LAST_KV_PACK_US: *value = ctx->last_kv_pack_us; return FA_OK;
    }
    return FA_ERR_INVALID_ARGUMENT;
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

void *fa_workspace_alloc(int64_t bytes)
{
    /* a negative size is a wrapped product upstream: never a small buffer */
    if (bytes < 0) return NULL;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && bytes / page > pages) return NULL;
    return fa_aligned_alloc(FA_CACHE_LINE, bytes);
}

void fa_workspace_free(void *ptr) { fa_free(ptr); }

double fa_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int64_t fa_bytes3(int64_t a, int64_t b, int64_t c)
{
    int64_t ab, abc;
    if (a < 0 || b < 0 || c < 0 || !fa_mul_ok(a, b, &ab) || !fa_mul_ok(ab, c, &abc)) return -1;
    return abc;
}

int64_t fa_ws_layout(const fa_ws_part *parts, size_t n, char *base)
{
    int64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const int64_t b = parts[i].bytes;
        if (b < 0 || b > INT64_MAX - FA_CACHE_LINE) return -1;
        /* a part of 0 bytes still gets a valid (never dereferenced) pointer: libc
         * calls such as memset(p, 0, 0) require one */
        *parts[i].slot = base ? base + off : NULL;
        if (!fa_add_ok(off, fa_round_up(b, FA_CACHE_LINE), &off)) return -1;
    }
    return off;
}

void *fa_context_workspace_slot(fa_context *ctx, int slot, int64_t bytes)
{
    if (bytes > FA_WORKSPACE_KEEP) return fa_workspace_alloc(bytes);
    if (ctx->ws_kept[slot] && ctx->ws_kept_bytes[slot] >= bytes) return ctx->ws_kept[slot];
    void *ws = fa_workspace_alloc(bytes);
    if (!ws) return NULL;
    fa_workspace_free(ctx->ws_kept[slot]);
    ctx->ws_kept[slot] = ws;
    ctx->ws_kept_bytes[slot] = bytes;
    return ws;
}

void *fa_context_workspace(fa_context *ctx, int64_t bytes) { return fa_context_workspace_slot(ctx, 0, bytes); }

void fa_context_workspace_done(fa_context *ctx, void *ptr)
{
    if (ptr != ctx->ws_kept[0] && ptr != ctx->ws_kept[1]) fa_workspace_free(ptr);
}
