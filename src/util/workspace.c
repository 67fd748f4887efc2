/*
 * workspace.c: scratch memory of calls: the physical-memory guard on every
 * workspace, the context's two buffers kept between calls, and the layout table
 * that carves one allocation into parts (workspace.h).
 */
#include "workspace.h"
#include "alloc.h"
#include "arith.h"
#include "context.h"

#include <unistd.h>

void *fa_workspace_alloc(int64_t bytes)
{
    /* a negative size is a wrapped product upstream: never a small buffer */
    if (bytes < 0) return NULL;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && bytes / page > pages) return NULL;
    return fa_aligned_alloc(FA_CACHE_LINE, bytes);
}

void fa_workspace_free(void *ptr) { fa_free(ptr); }

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
