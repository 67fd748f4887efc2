/*
 * cache.h: the KV cache (docs/semantics.md, section 8): contiguous (B_cache, S_max,
 * Hk, D) or paged (pages, page_size, Hk, D), float or int8 with per-row scales.
 * cache.c owns its validation, each sequence's view of it and the append; the rule
 * that places key j of a sequence in the cache is fa_cache_slot, below, and nowhere
 * else: kv.h's row access, the validation's slot-collision check and the append all
 * call it. A new cache format goes here and in cache.c; kv.c reads its rows.
 */
#ifndef FA_CACHE_H
#define FA_CACHE_H

#include "context.h"
#include "problem.h"

/* A cache row: blk indexes axis 0 (a contiguous cache's row, or a page), row axis 1. */
typedef struct fa_slot {
    int64_t blk, row;
} fa_slot;

/* Where key j of one sequence lives: with pages (the sequence's block_table row),
 * row j % page_size of page pages[j / page_size]; without, row j of cache row blk.
 * Inline: the small-row kernels take a row pointer per key through it. */
static inline fa_slot fa_cache_slot(const int32_t *pages, int64_t page_size, int64_t blk, int64_t j)
{
    if (pages) return (fa_slot){pages[j / page_size], j % page_size};
    return (fa_slot){blk, j};
}

/* 1 when keys j0 .. j0+cols-1 (cols >= 1) of one sequence are consecutive rows of one
 * cache row or page, so that they read as one strided block. */
static inline int fa_cache_one_block(const int32_t *pages, int64_t page_size, int64_t j0, int64_t cols)
{
    return !pages || j0 / page_size == (j0 + cols - 1) / page_size;
}

/* The cache row of sequence b's key 0 (fa_kv_cache.leftpad), and the keys it holds
 * before the append: seqlens[b] counts rows from the cache row's start. */
static inline int64_t fa_cache_first_row(const fa_problem *p, int64_t b) { return p->leftpad ? p->leftpad[b] : 0; }
static inline int64_t fa_cache_old_keys(const fa_problem *p, int64_t b)
{
    return (int64_t)p->seqlens[b] - fa_cache_first_row(p, b);
}

/* Where key j of sequence b lives in the whole problem's cache (a left-padded
 * sequence's keys start at its leftpad row). */
static inline fa_slot fa_cache_seq_slot(const fa_problem *p, int64_t b, int64_t j)
{
    return fa_cache_slot(p->block_table ? p->block_table + b * p->max_pages : NULL, p->page_size,
                         p->batch_idx ? p->batch_idx[b] : b, j + fa_cache_first_row(p, b));
}

/* The new rows sequence b of a cached call appends (0 without an append). */
static inline int64_t fa_cache_new_rows(const fa_problem *p, int64_t b)
{
    if (!p->append) return 0;
    return p->cu_k ? (int64_t)p->cu_k[b + 1] - p->cu_k[b] : p->k.shape[1];
}

/* Checks a->kv_cache and any new k, v rows, every bound, page id and slot collision
 * included, and fills p's cache fields (p holds B, Hq and varlen's cu_q already). */
fa_status fa_cache_validate(fa_context *ctx, const fa_forward_args *a, fa_problem *p);

/* Sequence b's keys and values in s (its view as fa_seq_view cuts it; q its table
 * entry): s->k, s->v (and the int8 scales) become the cache as this sequence sees it,
 * a (1, Sk, ..) view of its cache row, or the page pool with s->pages its block_table row. */
void fa_cache_view(const fa_problem *p, int64_t b, const fa_seq *q, fa_view *s);

/*
 * The append: new rows written into their slots before any algorithm runs. The
 * bytes they replace are kept until fa_cache_append_end, so that a call that fails
 * after the append (an algorithm out of memory) puts them back and leaves the cache
 * as it was (docs/semantics.md, section 9).
 */
typedef struct fa_cache_undo {
    char *saved;   /* the replaced bytes, slot by slot; NULL when nothing was written */
    int64_t bytes; /* allocated, scratch row included */
} fa_cache_undo;
/* After validation; FA_ERR_OUT_OF_MEMORY (nothing written) when the copy of the
 * replaced bytes cannot be allocated. */
fa_status fa_cache_append(fa_context *ctx, const fa_problem *p, fa_cache_undo *undo);
/* Puts back what fa_cache_append replaced (the call failed after it). */
void fa_cache_append_undo(const fa_problem *p, const fa_cache_undo *undo);
void fa_cache_append_end(fa_cache_undo *undo);

#endif
