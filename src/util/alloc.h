/*
 * alloc.h: the one door through which the library takes memory. Every
 * allocation goes through these functions, so that
 *  - a request is checked for size before it reaches libc (a negative or
 *    wrapped size never becomes a small buffer), and
 *  - the test suite can make any single allocation fail (fa_alloc_hook_set)
 *    and prove that each failure gives FA_ERR_OUT_OF_MEMORY with outputs
 *    untouched and nothing leaked.
 * The hook is internal (hidden, never exported) and costs one relaxed atomic
 * load per allocation; allocations happen per call, never per tile.
 */
#ifndef FA_ALLOC_H
#define FA_ALLOC_H

#include <stddef.h>
#include <stdint.h>

/* NULL for bytes < 0 and when the hook says this allocation fails. bytes == 0
 * allocates a minimal block (never NULL for lack of size). */
void *fa_malloc(int64_t bytes);
void *fa_calloc(int64_t count, int64_t size); /* zeroed; the product is checked */
/* align a power of two >= sizeof(void *); bytes is rounded up to it. */
void *fa_aligned_alloc(int64_t align, int64_t bytes);
void fa_free(void *ptr); /* NULL is fine */

/* Test hook: allocation number fail_index (0-based, counted over all threads
 * from this call on) fails; -1 turns the hook off. */
void fa_alloc_hook_set(int64_t fail_index);
/* Allocations attempted since the last fa_alloc_hook_set. */
int64_t fa_alloc_hook_count(void);

#endif
