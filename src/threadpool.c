/*
 * threadpool.c: pthread workers that sleep on a condition variable between
 * jobs. A job is published by bumping a generation counter; each worker runs
 * its share (between the pool's hooks) and the last one to finish wakes the
 * caller. A pool of 0 workers starts no thread: the caller runs every job.
 */
#include "threadpool.h"

#include "alloc.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct fa_worker {
    struct fa_pool *pool;
    pthread_t thread;
    int ith;
} fa_worker;

struct fa_pool {
    pthread_mutex_t lock;
    pthread_cond_t wake; /* workers wait here for a new generation */
    pthread_cond_t done; /* the caller waits here for pending == 0 */
    fa_worker *workers;
    int started;
    unsigned long generation;
    int pending;
    int stop;
    int nth;
    fa_job_fn fn;
    void *arg;
    fa_thread_hook begin, end; /* around each thread's share of a job */
};

static void run_share(const fa_pool *pool, fa_job_fn fn, void *arg, int ith, int nth)
{
    if (pool->begin) pool->begin();
    fn(arg, ith, nth);
    if (pool->end) pool->end();
}

static void *worker_main(void *p)
{
    fa_worker *self = p;
    fa_pool *pool = self->pool;
    unsigned long seen = 0;
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        while (pool->generation == seen && !pool->stop) pthread_cond_wait(&pool->wake, &pool->lock);
        if (pool->stop) break;
        seen = pool->generation;
        int nth = pool->nth;
        fa_job_fn fn = pool->fn;
        void *arg = pool->arg;
        pthread_mutex_unlock(&pool->lock);
        if (self->ith < nth) run_share(pool, fn, arg, self->ith, nth);
        pthread_mutex_lock(&pool->lock);
        if (--pool->pending == 0) pthread_cond_signal(&pool->done);
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

fa_status fa_pool_create(int workers, fa_thread_hook begin, fa_thread_hook end, fa_pool **out)
{
    *out = NULL;
    if (workers < 0) workers = 0;
    fa_pool *pool = fa_calloc(1, (int64_t)sizeof *pool);
    if (!pool) return FA_ERR_OUT_OF_MEMORY;
    pool->begin = begin;
    pool->end = end;
    if (workers > 0) {
        pool->workers = fa_calloc(workers, (int64_t)sizeof *pool->workers);
        if (!pool->workers) {
            fa_free(pool);
            return FA_ERR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    for (int i = 0; i < workers; i++) {
        pool->workers[i].pool = pool;
        pool->workers[i].ith = i + 1;
        if (pthread_create(&pool->workers[i].thread, NULL, worker_main, &pool->workers[i]) != 0) {
            fa_pool_free(pool);
            return FA_ERR_THREADS;
        }
        pool->started = i + 1;
    }
    *out = pool;
    return FA_OK;
}

void fa_pool_free(fa_pool *pool)
{
    if (!pool) return;
    pthread_mutex_lock(&pool->lock);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 0; i < pool->started; i++) pthread_join(pool->workers[i].thread, NULL);
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->lock);
    fa_free(pool->workers);
    fa_free(pool);
}

void fa_pool_run(fa_pool *pool, int nth, fa_job_fn fn, void *arg)
{
    if (nth > pool->started + 1) nth = pool->started + 1;
    if (nth <= 1) {
        run_share(pool, fn, arg, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool->lock);
    pool->fn = fn;
    pool->arg = arg;
    pool->nth = nth;
    pool->pending = pool->started; /* every worker checks in, idle ones too */
    pool->generation++;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);

    run_share(pool, fn, arg, 0, nth);

    pthread_mutex_lock(&pool->lock);
    while (pool->pending > 0) pthread_cond_wait(&pool->done, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
}
