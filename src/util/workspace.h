/*
 * workspace.h: scratch memory of a call: one aligned allocation door (alloc.c's),
 * the context's buffers kept between calls, and the layout table that carves them.
 */
#ifndef FA_WORKSPACE_H
#define FA_WORKSPACE_H

#include "flashattn.h"

#include <stddef.h>
#include <stdint.h>

#define FA_CACHE_LINE 64

/* Workspace: 64-byte aligned. Fails (NULL) rather than over-commit when bytes
 * exceed physical memory, since a successful malloc on Linux does not mean the
 * pages exist, and touching them later would kill the process. */
void *fa_workspace_alloc(int64_t bytes);
void fa_workspace_free(void *ptr);
/* The context's own workspace, kept between calls up to FA_WORKSPACE_KEEP bytes:
 * decoding calls take a millisecond or less, and fresh pages from the kernel (a
 * page fault per 4 KiB) would cost a good share of that. Release with
 * fa_context_workspace_done. */
#define FA_WORKSPACE_KEEP ((int64_t)64 << 20)
void *fa_context_workspace(fa_context *ctx, int64_t bytes);
void fa_context_workspace_done(fa_context *ctx, void *ptr);
/* The same for a second buffer a call sizes only after filling the first (slot 1:
 * the forward's packed K/V, planned from its tasks); slot 0 is fa_context_workspace's. */
void *fa_context_workspace_slot(fa_context *ctx, int slot, int64_t bytes);

/*
 * A workspace carved by one table: each part gets its own cache lines, and the same
 * table gives the total size (base == NULL) and the offsets (base != NULL), so the
 * two can never disagree. A part of bytes < 0 (an overflowed size upstream) or a
 * total beyond int64 makes fa_ws_layout return -1. A part of 0 bytes gets a valid
 * pointer it must not dereference.
 */
typedef struct fa_ws_part {
    void **slot;
    int64_t bytes;
} fa_ws_part;
int64_t fa_ws_layout(const fa_ws_part *parts, size_t n, char *base);


#endif
