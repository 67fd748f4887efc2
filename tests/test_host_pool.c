/*
 * test_host_pool.c: fa_context_set_parallel, the library's parallel work on the
 * caller's thread pool (flashattn.h, "The host's threads").
 *
 *   bits      a forward (causal bf16 prefill, and a split-KV f32 one whose partial
 *             states are merged), a KV-cache decode with an append, and an MQA
 *             backward with dropout (its two-pass schedule) on the context's own
 *             pool and on host pools at 2 to 4 threads: a pthread team started per
 *             job, a team of two threads for any number of shares, a loop on the
 *             calling thread in order and in reverse, and an OpenMP parallel region
 *             where the compiler has OpenMP. Every output byte must equal the own
 *             pool's (and so the 1-thread run's), FA_PARAM_LAST_POOL must say host,
 *             every job must ask for 2..threads shares, and on the tile paths each
 *             host thread must hold no tile configuration after a share (the kernel
 *             table's thread_end ran on it).
 *   failing   hosts that break the contract (return nonzero having run nothing, run
 *             share 0 only, run every share twice, call shares outside [0, nth)):
 *             the calls still complete with the same bits and LAST_POOL says 2.
 *   misuse    a NULL context; a host that calls fa_context_set or
 *             fa_context_set_parallel on the running context gets FA_ERR_BUSY; one
 *             thread uses no host at all; NULL returns to the own pool, and
 *             FA_PARAM_THREADS keeps a host pool a host pool.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "harness.h"

#if defined(FA_BUILD_AMX)
int fa_amx_tile_configured(void);
#endif
#if defined(FA_BUILD_AMX_MODEL)
int fa_tm_configured(void);
#endif

/* ------------------------------------------------------------ the host pools */

/* What every host records, from any of its threads. */
typedef struct host_log {
    atomic_int calls;        /* parallel-fors the library asked for */
    atomic_int bad_nth;      /* ... with nth outside [2, threads] */
    atomic_int tiles_held;   /* shares after which their thread still held tiles */
    int threads;             /* the context's FA_PARAM_THREADS */
    const char *isa;         /* the context's kernel path */
    fa_context *ctx;         /* for the hosts that misuse it */
    atomic_int busy_ok;      /* fa_context_set(_parallel) from inside said FA_ERR_BUSY */
} host_log;

static host_log g_log;

/* 1 when the calling thread holds tiles of the context's table (0 for tables without tiles). */
static int tiles_held(void) {
#if defined(FA_BUILD_AMX)
    if (strcmp(g_log.isa, "amx") == 0) return fa_amx_tile_configured();
#endif
#if defined(FA_BUILD_AMX_MODEL)
    if (strcmp(g_log.isa, "amx-model") == 0) return fa_tm_configured();
#endif
    return 0;
}

static void note_call(int nth) {
    atomic_fetch_add(&g_log.calls, 1);
    if (nth < 2 || nth > g_log.threads) atomic_fetch_add(&g_log.bad_nth, 1);
}

/* Runs one share and checks its thread gave its tiles back. */
static void share(fa_parallel_task task, void *arg, int ith, int nth) {
    task(arg, ith, nth);
    if (tiles_held()) atomic_fetch_add(&g_log.tiles_held, 1);
}

/* A team of threads started for the job, one per share but the caller's. */
typedef struct team_arg {
    fa_parallel_task task;
    void *arg;
    int ith, nth, stride; /* shares ith, ith + stride, ... */
} team_arg;

static void *team_main(void *p) {
    const team_arg *t = p;
    for (int i = t->ith; i < t->nth; i += t->stride) share(t->task, t->arg, i, t->nth);
    return NULL;
}

/* `width` threads (the caller one of them) share nth shares round robin. */
static int run_team(int nth, int width, fa_parallel_task task, void *arg) {
    pthread_t th[64];
    team_arg ta[64];
    if (width > nth) width = nth;
    for (int w = 0; w < width; w++) ta[w] = (team_arg){task, arg, w, nth, width};
    for (int w = 1; w < width; w++)
        if (pthread_create(&th[w], NULL, team_main, &ta[w]) != 0) return -1; /* joined by no one: the test fails */
    team_main(&ta[0]);
    for (int w = 1; w < width; w++) pthread_join(th[w], NULL);
    return 0;
}

static int host_pthreads(void *user, int nth, fa_parallel_task task, void *arg) {
    (void)user;
    note_call(nth);
    return run_team(nth, nth, task, arg);
}

static int host_two(void *user, int nth, fa_parallel_task task, void *arg) {
    (void)user;
    note_call(nth);
    return run_team(nth, 2, task, arg);
}

static int host_serial(void *user, int nth, fa_parallel_task task, void *arg) {
    (void)user;
    note_call(nth);
    for (int i = 0; i < nth; i++) share(task, arg, i, nth);
    return 0;
}

static int host_reverse(void *user, int nth, fa_parallel_task task, void *arg) {
    (void)user;
    note_call(nth);
    for (int i = nth - 1; i >= 0; i--) share(task, arg, i, nth);
    return 0;
}

#if defined(_OPENMP)
static int host_openmp(void *user, int nth, fa_parallel_task task, void *arg) {
    (void)user;
    note_call(nth);
#pragma omp parallel num_threads(nth)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        for (int i = t; i < nth; i += n) share(task, arg, i, nth);
    }
    return 0;
}
#endif

/* The contract breakers. */
static int host_refuses(void *user, int nth, fa_parallel_task task, void *arg) {
    (void)user, (void)task, (void)arg;
    note_call(nth);
    return -1;
}

static int host_first_only(void *user, int nth, fa_parallel_task task, void *arg) {
    (void)user;
    note_call(nth);
    share(task, arg, 0, nth);
    return 0;
}

static int host_twice(void *user, int nth, fa_parallel_task task, void *arg) {
    note_call(nth);
    for (int k = 0; k < 2; k++) run_team(nth, nth, task, arg);
    (void)user;
    return 0; /* fails by its doubles alone */
}

static int host_strays(void *user, int nth, fa_parallel_task task, void *arg) {
    (void)user;
    note_call(nth);
    task(arg, -1, nth);
    task(arg, nth, nth);
    task(arg, 0, nth + 1);
    return run_team(nth, nth, task, arg);
}

/* Calls back into the context it runs on, which is busy with this very call. */
static int host_reenters(void *user, int nth, fa_parallel_task task, void *arg) {
    (void)user;
    note_call(nth);
    if (fa_context_set(g_log.ctx, FA_PARAM_THREADS, 1) == FA_ERR_BUSY &&
        fa_context_set_parallel(g_log.ctx, NULL, NULL) == FA_ERR_BUSY)
        atomic_fetch_add(&g_log.busy_ok, 1);
    return run_team(nth, nth, task, arg);
}

typedef struct host {
    const char *name;
    fa_parallel_fn fn;
    int fails; /* breaks the contract: LAST_POOL 2 */
} host;

static const host g_hosts[] = {
    {"pthreads", host_pthreads, 0},  {"two threads", host_two, 0},  {"serial", host_serial, 0},
    {"reverse", host_reverse, 0},
#if defined(_OPENMP)
    {"openmp", host_openmp, 0},
#endif
    {"refuses", host_refuses, 1},    {"first only", host_first_only, 1}, {"twice", host_twice, 1},
    {"strays", host_strays, 1},      {"re-enters", host_reenters, 0},
};

/* ------------------------------------------------------------ the calls */

/* Everything one round of calls reads and writes. */
typedef struct calls {
    h_problem prefill, split, bwd;
    fa_tensor q, knew, vnew, kc, vc, dec_o, dec_lse; /* the decode */
    fa_tensor dout, dq, dk, dv;
} calls;

static const int32_t g_seqlens[2] = {200, 131};

static void calls_make(calls *c) {
    h_rng r;
    h_rng_seed(&r, h_env_u64("FA_TEST_SEED", 31));
    h_problem *ps[3] = {&c->prefill, &c->split, &c->bwd};
    const h_dims dims[3] = {{1, 96, 96, 4, 2, 64, 64}, {2, 3, 700, 4, 1, 32, 32}, {1, 90, 150, 4, 1, 32, 24}};
    const fa_dtype dt[3] = {FA_DTYPE_BF16, FA_DTYPE_F32, FA_DTYPE_F32};
    for (int i = 0; i < 3; i++) {
        h_problem_alloc(ps[i], dims[i], dt[i], FA_DTYPE_F32);
        h_fill_normal(&ps[i]->args.q, &r, 1.0);
        h_fill_normal(&ps[i]->args.k, &r, 1.0);
        h_fill_normal(&ps[i]->args.v, &r, 1.0);
    }
    c->prefill.args.causal = FA_CAUSAL_BOTTOM_RIGHT;
    c->bwd.args.causal = FA_CAUSAL_BOTTOM_RIGHT;
    c->bwd.args.dropout_p = 0.2f, c->bwd.args.dropout_seed = 5;
    c->q = h_alloc(FA_DTYPE_F32, 2, 1, 8, 64);
    c->knew = h_alloc(FA_DTYPE_F32, 2, 1, 2, 64);
    c->vnew = h_alloc(FA_DTYPE_F32, 2, 1, 2, 64);
    c->kc = h_alloc(FA_DTYPE_F16, 2, 256, 2, 64);
    c->vc = h_alloc(FA_DTYPE_F16, 2, 256, 2, 64);
    c->dec_o = h_alloc(FA_DTYPE_F32, 2, 1, 8, 64);
    c->dec_lse = h_alloc(FA_DTYPE_F32, 2, 8, 1, 1);
    fa_tensor *fill[] = {&c->q, &c->knew, &c->vnew, &c->kc, &c->vc};
    for (int i = 0; i < 5; i++) h_fill_normal(fill[i], &r, 1.0);
    c->dout = h_alloc(FA_DTYPE_F32, 1, 90, 4, 24);
    h_fill_normal(&c->dout, &r, 1.0);
    c->dq = h_alloc(FA_DTYPE_F32, 1, 90, 4, 32);
    c->dk = h_alloc(FA_DTYPE_F32, 1, 150, 1, 32);
    c->dv = h_alloc(FA_DTYPE_F32, 1, 150, 1, 24);
}

/* The tensors a round writes, in one list (for copies and comparisons). */
enum { N_OUT = 12 };
static void calls_outputs(calls *c, fa_tensor *out[N_OUT]) {
    fa_tensor *o[N_OUT] = {&c->prefill.args.o, &c->prefill.args.lse, &c->split.args.o, &c->split.args.lse,
                           &c->kc, &c->vc, &c->dec_o, &c->dec_lse, &c->dq, &c->dk, &c->dv, &c->bwd.args.o};
    memcpy(out, o, sizeof o);
}

static void calls_free(calls *c) {
    h_problem_free(&c->prefill), h_problem_free(&c->split), h_problem_free(&c->bwd);
    fa_tensor *t[] = {&c->q, &c->knew, &c->vnew, &c->kc, &c->vc, &c->dec_o, &c->dec_lse,
                      &c->dout, &c->dq, &c->dk, &c->dv};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) free(t[i]->data);
}

/* The round on ctx: each call's status, and the LAST_POOL of each. Returns the first
 * failure or FA_OK; *pools gets the LAST_POOL values seen, one bit each. */
static fa_status run_calls(fa_context *ctx, calls *c, const fa_tensor *kc0, const fa_tensor *vc0, int *pools) {
    fa_status st = FA_OK;
    int64_t pool = -1;
    *pools = 0;
#define CALL(expr)                                                                                   \
    do {                                                                                             \
        if (st == FA_OK) st = (expr);                                                                \
        if (st == FA_OK && fa_context_get(ctx, FA_PARAM_LAST_POOL, &pool) == FA_OK) *pools |= 1 << pool; \
    } while (0)
    fa_context_set(ctx, FA_PARAM_ALGO, FA_ALGO_FLASH);
    CALL(fa_forward(ctx, &c->prefill.args));
    fa_context_set(ctx, FA_PARAM_KV_SPLITS, 5);
    CALL(fa_forward(ctx, &c->split.args));
    fa_context_set(ctx, FA_PARAM_KV_SPLITS, 0);
    /* the decode appends into the cache: start each round from the same bytes */
    memcpy(c->kc.data, kc0->data, h_nbytes(kc0));
    memcpy(c->vc.data, vc0->data, h_nbytes(vc0));
    fa_kv_cache kv = FA_KV_CACHE_INIT;
    kv.k = c->kc, kv.v = c->vc, kv.seqlens = g_seqlens;
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = c->q, a.k = c->knew, a.v = c->vnew, a.o = c->dec_o, a.lse = c->dec_lse, a.kv_cache = &kv;
    CALL(fa_forward(ctx, &a));
    CALL(fa_forward(ctx, &c->bwd.args));
    fa_backward_args b = FA_BACKWARD_ARGS_INIT;
    b.fwd = &c->bwd.args, b.do_ = c->dout, b.dq = c->dq, b.dk = c->dk, b.dv = c->dv;
    CALL(fa_backward(ctx, &b));
#undef CALL
    return st;
}

/* ------------------------------------------------------------ bits */

static void test_hosts(void) {
    calls c;
    calls_make(&c);
    const fa_tensor kc0 = h_clone(&c.kc), vc0 = h_clone(&c.vc);
    fa_tensor *out[N_OUT], want[N_OUT];
    calls_outputs(&c, out);
    fa_context *ctx;
    CHECK(h_context_create(&ctx) == FA_OK, "fa_context_create");
    g_log.isa = fa_context_isa(ctx);
    g_log.ctx = ctx;
    for (int th = 2; th <= 4; th++) {
        h_case("own pool, %d threads", th);
        fa_context_set(ctx, FA_PARAM_THREADS, th);
        int pools = 0;
        CHECK(run_calls(ctx, &c, &kc0, &vc0, &pools) == FA_OK, "%s", fa_context_error(ctx));
        CHECK(pools == 1 << 0, "LAST_POOL: seen %#x, not own alone", pools);
        int64_t passes = 0;
        fa_context_get(ctx, FA_PARAM_LAST_BACKWARD_PASSES, &passes);
        CHECK(passes == 2, "the MQA backward on %d threads took %lld passes, not the two-pass schedule", th,
              (long long)passes);
        for (int i = 0; i < N_OUT; i++) {
            if (th == 2) want[i] = h_clone(out[i]);
            else CHECK(h_same_bytes(out[i], &want[i]), "output %d on %d own threads differs from 2 threads", i, th);
        }
        for (size_t k = 0; k < sizeof g_hosts / sizeof g_hosts[0]; k++) {
            const host *hp = &g_hosts[k];
            h_case("host pool %s, %d threads", hp->name, th);
            for (int i = 0; i < N_OUT; i++) memset(out[i]->data, 0x5a, h_nbytes(out[i]));
            atomic_store(&g_log.calls, 0), atomic_store(&g_log.bad_nth, 0), atomic_store(&g_log.tiles_held, 0);
            atomic_store(&g_log.busy_ok, 0);
            g_log.threads = th;
            if (!CHECK(fa_context_set_parallel(ctx, hp->fn, (void *)hp) == FA_OK, "%s", fa_context_error(ctx))) continue;
            const fa_status st = run_calls(ctx, &c, &kc0, &vc0, &pools);
            CHECK(fa_context_set_parallel(ctx, NULL, NULL) == FA_OK, "back to the own pool: %s", fa_context_error(ctx));
            if (!CHECK(st == FA_OK, "%s", fa_context_error(ctx))) continue;
            const int want_pool = hp->fails ? 2 : 1;
            CHECK(pools == 1 << want_pool, "LAST_POOL: seen %#x, not %d alone", pools, want_pool);
            CHECK(atomic_load(&g_log.calls) >= 5, "the host ran %d jobs of the five calls", atomic_load(&g_log.calls));
            CHECK(atomic_load(&g_log.bad_nth) == 0, "%d jobs asked for a count outside [2, %d]",
                  atomic_load(&g_log.bad_nth), th);
            CHECK(atomic_load(&g_log.tiles_held) == 0, "%d shares left their host thread holding tiles",
                  atomic_load(&g_log.tiles_held));
            if (hp->fn == host_reenters)
                CHECK(atomic_load(&g_log.busy_ok) == atomic_load(&g_log.calls),
                      "fa_context_set(_parallel) from inside a call: FA_ERR_BUSY %d times of %d",
                      atomic_load(&g_log.busy_ok), atomic_load(&g_log.calls));
            for (int i = 0; i < N_OUT; i++)
                CHECK(h_same_bytes(out[i], &want[i]), "output %d on the %s host differs from the own pool", i, hp->name);
        }
    }
    fa_context_free(ctx);
    for (int i = 0; i < N_OUT; i++) free(want[i].data);
    free(kc0.data), free(vc0.data);
    calls_free(&c);
}

/* ------------------------------------------------------------ misuse */

static void test_misuse(void) {
    h_case("misuse");
    CHECK(fa_context_set_parallel(NULL, host_serial, NULL) == FA_ERR_NULL_CONTEXT, "NULL context");
    CHECK(fa_context_set_parallel(NULL, NULL, NULL) == FA_ERR_NULL_CONTEXT, "NULL context, NULL fn");
    fa_context *ctx;
    CHECK(h_context_create(&ctx) == FA_OK, "fa_context_create");
    g_log.isa = fa_context_isa(ctx);
    h_problem p;
    h_rng r;
    h_rng_seed(&r, 3);
    h_problem_alloc(&p, (h_dims){2, 64, 64, 4, 4, 32, 32}, FA_DTYPE_F32, FA_DTYPE_F32);
    h_fill_normal(&p.args.q, &r, 1.0), h_fill_normal(&p.args.k, &r, 1.0), h_fill_normal(&p.args.v, &r, 1.0);
    int64_t pool = -1, lo = -1, hi = -1;
    CHECK(fa_param_bounds(FA_PARAM_LAST_POOL, &lo, &hi) == FA_OK && lo == 0 && hi == 2, "LAST_POOL bounds [%lld, %lld]",
          (long long)lo, (long long)hi);
    CHECK(fa_context_set(ctx, FA_PARAM_LAST_POOL, 1) == FA_ERR_INVALID_ARGUMENT, "LAST_POOL is read-only");

    /* one thread: the job runs on the caller, the host is never asked */
    fa_context_set(ctx, FA_PARAM_THREADS, 1);
    CHECK(fa_context_set_parallel(ctx, host_serial, NULL) == FA_OK, "install");
    atomic_store(&g_log.calls, 0);
    CHECK(fa_forward(ctx, &p.args) == FA_OK, "%s", fa_context_error(ctx));
    CHECK(atomic_load(&g_log.calls) == 0, "a 1-thread context asked the host %d times", atomic_load(&g_log.calls));
    fa_context_get(ctx, FA_PARAM_LAST_POOL, &pool);
    CHECK(pool == 1, "LAST_POOL %lld on a host pool of one thread", (long long)pool);

    /* FA_PARAM_THREADS rebuilds the pool and keeps the host */
    CHECK(fa_context_set(ctx, FA_PARAM_THREADS, 3) == FA_OK, "THREADS 3");
    g_log.threads = 3;
    atomic_store(&g_log.bad_nth, 0);
    CHECK(fa_forward(ctx, &p.args) == FA_OK, "%s", fa_context_error(ctx));
    CHECK(atomic_load(&g_log.calls) > 0 && atomic_load(&g_log.bad_nth) == 0,
          "after THREADS 3 the host ran %d jobs, %d of them outside [2, 3]", atomic_load(&g_log.calls),
          atomic_load(&g_log.bad_nth));
    fa_context_get(ctx, FA_PARAM_LAST_POOL, &pool);
    CHECK(pool == 1, "LAST_POOL %lld after THREADS 3", (long long)pool);
    int64_t threads = 0;
    fa_context_get(ctx, FA_PARAM_THREADS, &threads);
    CHECK(threads == 3, "THREADS %lld", (long long)threads);

    /* a failed host marks its own call only */
    CHECK(fa_context_set_parallel(ctx, host_refuses, NULL) == FA_OK, "install");
    CHECK(fa_forward(ctx, &p.args) == FA_OK, "%s", fa_context_error(ctx));
    fa_context_get(ctx, FA_PARAM_LAST_POOL, &pool);
    CHECK(pool == 2, "LAST_POOL %lld after a refusing host", (long long)pool);
    CHECK(fa_context_set_parallel(ctx, host_serial, NULL) == FA_OK, "install");
    CHECK(fa_forward(ctx, &p.args) == FA_OK, "%s", fa_context_error(ctx));
    fa_context_get(ctx, FA_PARAM_LAST_POOL, &pool);
    CHECK(pool == 1, "LAST_POOL %lld on the call after the failed one", (long long)pool);

    /* NULL: the own pool again, FA_PARAM_THREADS of it */
    CHECK(fa_context_set_parallel(ctx, NULL, (void *)ctx) == FA_OK, "reset");
    atomic_store(&g_log.calls, 0);
    CHECK(fa_forward(ctx, &p.args) == FA_OK, "%s", fa_context_error(ctx));
    fa_context_get(ctx, FA_PARAM_LAST_POOL, &pool);
    CHECK(pool == 0 && atomic_load(&g_log.calls) == 0, "after NULL: LAST_POOL %lld, %d host jobs", (long long)pool,
          atomic_load(&g_log.calls));
    int64_t last_threads = 0;
    fa_context_get(ctx, FA_PARAM_LAST_THREADS, &last_threads);
    CHECK(last_threads == 3, "LAST_THREADS %lld on the own pool of 3", (long long)last_threads);
    h_problem_free(&p);
    fa_context_free(ctx);
}

int main(void) {
    test_hosts();
    test_misuse();
    return h_summary();
}
