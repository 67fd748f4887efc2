/*
 * threadpool.h: a fixed set of worker threads owned by a context. A job is a
 * function run once per thread as fn(arg, ith, nth) with the caller as thread 0;
 * work is split inside the job (usually with an atomic task counter, which
 * keeps the result independent of which thread did what).
 *
 * Every thread that takes part in a job, the caller included, runs the pool's
 * begin hook before its share and the end hook after it: the kernel table's
 * thread_begin/thread_end, so that an ISA with per-thread state (tile
 * registers) sets it up on the thread that uses it and releases it before
 * control returns to the user. The pool therefore exists even for one thread
 * (0 workers).
 *
 * A host pool (fa_pool_create_host) starts no thread either: each job of two or
 * more threads goes to the caller's parallel-for (fa_context_set_parallel), which
 * runs the same shares, each between the same hooks, on the host's threads.
 */
#ifndef FA_THREADPOOL_H
#define FA_THREADPOOL_H

#include "flashattn.h"

typedef struct fa_pool fa_pool;
typedef void (*fa_job_fn)(void *arg, int ith, int nth);
typedef void (*fa_thread_hook)(void);

/* workers >= 0 threads besides the caller; begin and end may be NULL (no hook). */
fa_status fa_pool_create(int workers, fa_thread_hook begin, fa_thread_hook end, fa_pool **out);
/* A pool whose jobs of 2..threads threads go to host(user, nth, ...); see flashattn.h. */
fa_status fa_pool_create_host(int threads, fa_parallel_fn host, void *user, fa_thread_hook begin, fa_thread_hook end,
                              fa_pool **out);
void fa_pool_free(fa_pool *pool); /* NULL is fine */

/* Where the jobs since the last fa_pool_clear ran (FA_PARAM_LAST_POOL's values):
 * the pool's own threads, the host's, or the host's with a failure of its
 * parallel-for (a nonzero return or a share it left, which the caller then ran). */
enum { FA_POOL_OWN = 0, FA_POOL_HOST = 1, FA_POOL_HOST_FAILED = 2 };
int fa_pool_kind(const fa_pool *pool);
const char *fa_pool_kind_name(int kind); /* "own", "host", "host-failed" */
void fa_pool_clear(fa_pool *pool);

/* Runs fn on nth threads (the caller plus nth-1 workers, at most all of them),
 * each between the hooks, and returns when all are done. */
void fa_pool_run(fa_pool *pool, int nth, fa_job_fn fn, void *arg);

#endif
