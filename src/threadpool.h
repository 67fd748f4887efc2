/*
 * threadpool.h: a fixed set of worker threads owned by a context. A job is a
 * function run once per thread as fn(arg, ith, nth) with the caller as thread 0;
 * work is split inside the job (usually with an atomic task counter, which
 * keeps the result independent of which thread did what).
 */
#ifndef FA_THREADPOOL_H
#define FA_THREADPOOL_H

#include "flashattn.h"

typedef struct fa_pool fa_pool;
typedef void (*fa_job_fn)(void *arg, int ith, int nth);

fa_status fa_pool_create(int workers, fa_pool **out);
void fa_pool_free(fa_pool *pool); /* NULL is fine */

/* Runs fn on nth threads (the caller plus nth-1 workers) and returns when all
 * are done. pool may be NULL when nth == 1. */
void fa_pool_run(fa_pool *pool, int nth, fa_job_fn fn, void *arg);

#endif
