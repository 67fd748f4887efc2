/*
 * alloc.c: see alloc.h. The hook counts every attempt, so a test can first run
 * a call to learn how many allocations it makes, then fail each in turn.
 */
#include "alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_llong g_fail_index = -1; /* -1: off */
static atomic_llong g_count;

void fa_alloc_hook_set(int64_t fail_index)
{
    atomic_store(&g_count, 0);
    atomic_store(&g_fail_index, fail_index);
}

int64_t fa_alloc_hook_count(void) { return atomic_load(&g_count); }

/* 1 when this allocation must fail (the hook picked it). Every attempt is counted,
 * with the hook off too, so a test can count a call's allocations first. */
static int hooked_failure(void)
{
    const long long n = atomic_fetch_add_explicit(&g_count, 1, memory_order_relaxed);
    const long long at = atomic_load_explicit(&g_fail_index, memory_order_relaxed);
    return at >= 0 && n == at;
}

void *fa_malloc(int64_t bytes)
{
    if (bytes < 0 || (uint64_t)bytes > (uint64_t)SIZE_MAX || hooked_failure()) return NULL;
    return malloc(bytes ? (size_t)bytes : 1);
}

void *fa_calloc(int64_t count, int64_t size)
{
    int64_t bytes;
    if (count < 0 || size < 0 || __builtin_mul_overflow(count, size, &bytes)) return NULL;
    void *p = fa_malloc(bytes);
    if (p) memset(p, 0, (size_t)bytes);
    return p;
}

void *fa_aligned_alloc(int64_t align, int64_t bytes)
{
    if (bytes < 0 || align <= 0 || (align & (align - 1)) != 0) return NULL;
    if (bytes == 0) bytes = align;
    if (bytes > INT64_MAX - (align - 1)) return NULL;
    const int64_t rounded = (bytes + align - 1) / align * align; /* aligned_alloc wants a multiple */
    if ((uint64_t)rounded > (uint64_t)SIZE_MAX || hooked_failure()) return NULL;
    return aligned_alloc((size_t)align, (size_t)rounded);
}

void fa_free(void *ptr) { free(ptr); }
