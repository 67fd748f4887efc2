/*
 * threadpool.c: pthread workers that sleep on a condition variable between
 * jobs. A job is published by bumping a generation counter; each worker runs
 * its share (between the pool's hooks) and the last one to finish wakes the
 * caller. A pool of 0 workers starts no thread: the caller runs every job.
 * A host pool hands each job to the caller's parallel-for and checks that every
 * share ran exactly once: a share it left runs on the caller, one it repeats is
 * skipped, so a host that breaks its contract cannot lose or double work.
 */
#include "threadpool.h"

#include "alloc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* FA_PARAM_THREADS' bound: the most shares a job has. */
#define FA_POOL_MAX_SHARES 1024

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
    fa_parallel_fn host;       /* a host pool: the caller's parallel-for, else NULL */
    void *host_user;
    int host_threads;          /* a host pool's most shares per job */
    int host_failed;           /* the host failed its contract since fa_pool_clear */
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

fa_status fa_pool_create_host(int threads, fa_parallel_fn host, void *user, fa_thread_hook begin, fa_thread_hook end,
                              fa_pool **out)
{
    fa_status st = fa_pool_create(0, begin, end, out);
    if (st != FA_OK) return st;
    (*out)->host = host;
    (*out)->host_user = user;
    (*out)->host_threads = threads < 1 ? 1 : (threads > FA_POOL_MAX_SHARES ? FA_POOL_MAX_SHARES : threads);
    return FA_OK;
}

int fa_pool_kind(const fa_pool *pool)
{
    return !pool->host ? FA_POOL_OWN : pool->host_failed ? FA_POOL_HOST_FAILED : FA_POOL_HOST;
}

void fa_pool_clear(fa_pool *pool) { pool->host_failed = 0; }

const char *fa_pool_kind_name(int kind)
{
    return kind == FA_POOL_OWN ? "own" : kind == FA_POOL_HOST ? "host" : "host-failed";
}

/* One job on the host's threads: which of its shares have been claimed. */
typedef struct host_job {
    const fa_pool *pool;
    fa_job_fn fn;
    void *arg;
    int nth;
    atomic_int strays; /* calls for a share outside [0, nth) or one claimed already */
    atomic_uchar claimed[FA_POOL_MAX_SHARES];
} host_job;

/* What the host runs per share: a stray call runs nothing (it would lose or double
 * work) and fails the host's contract. */
static void host_share(void *p, int ith, int nth)
{
    host_job *job = p;
    if (ith < 0 || ith >= job->nth || nth != job->nth || atomic_exchange(&job->claimed[ith], 1)) {
        atomic_fetch_add(&job->strays, 1);
        return;
    }
    run_share(job->pool, job->fn, job->arg, ith, job->nth);
}

static void host_run(fa_pool *pool, int nth, fa_job_fn fn, void *arg)
{
    host_job job = {.pool = pool, .fn = fn, .arg = arg, .nth = nth};
    atomic_init(&job.strays, 0);
    for (int i = 0; i < nth; i++) atomic_init(&job.claimed[i], 0);
    const int rc = pool->host(pool->host_user, nth, host_share, &job);
    int left = 0;
    for (int i = 0; i < nth; i++)
        if (!atomic_exchange(&job.claimed[i], 1)) {
            run_share(pool, fn, arg, i, nth);
            left++;
        }
    if (rc != 0 || left > 0 || atomic_load(&job.strays) > 0) pool->host_failed = 1;
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
    const int most = pool->host ? pool->host_threads : pool->started + 1;
    if (nth > most) nth = most;
    if (nth <= 1) {
        run_share(pool, fn, arg, 0, 1);
        return;
    }
    if (pool->host) {
        host_run(pool, nth, fn, arg);
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
