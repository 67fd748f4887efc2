/*
 * test_alloc.c: every allocation the library makes may fail, and each failure must give
 * FA_ERR_OUT_OF_MEMORY with nothing written and nothing leaked.
 *
 * The hook of src/util/alloc.h (internal, so this program links the library's objects like
 * test_kernels) counts the allocations a call attempts, then makes allocation k fail for
 * every k below that count. For each k: a fresh context in the same state (cold, or warm
 * after one call, since a context keeps its workspace between calls), the outputs filled
 * with a sentinel and the cache restored; the call must return FA_ERR_OUT_OF_MEMORY with
 * a message and leave every output and cache byte as it was. With k = count the call
 * must succeed with the same bits as the unhooked call. fa_context_create must give
 * FA_ERR_OUT_OF_MEMORY and *out = NULL; fa_context_set(THREADS) must give it and leave
 * the context usable. Leaks are found by the ASan build's leak checker (detect_leaks=1).
 *
 * The calls: dense (flash, standard, reference; 1 and 2 threads), varlen, a contiguous
 * cache append (the slot-collision check allocates), a paged int8 cache append, a decode
 * with split-KV, MLA latent cache appends (contiguous f32, paged int8), fa_merge_states.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "harness.h"

enum { SENTINEL = 0xa5, MAX_REGIONS = 8 };

/* The bytes a call may write: outputs (reset to the sentinel) and caches (reset to their
 * initial bytes). */
typedef struct region {
    void *data;
    size_t bytes;
    unsigned char *initial; /* NULL: an output */
    unsigned char *result;  /* bytes after the unhooked call */
} region;

typedef struct scenario {
    const char *name;
    fa_status (*call)(fa_context *ctx, struct scenario *s);
    fa_algo algo;
    int64_t threads, splits;
    int warm; /* run once before the counted call */
    fa_forward_args args;
    fa_kv_cache cache;
    region r[MAX_REGIONS];
    int nr;
} scenario;

static void watch(scenario *s, void *data, size_t bytes, int is_cache) {
    region *r = &s->r[s->nr++];
    r->data = data, r->bytes = bytes;
    r->initial = NULL;
    if (is_cache) {
        r->initial = malloc(bytes);
        memcpy(r->initial, data, bytes);
    }
    r->result = malloc(bytes);
}

static void watch_tensor(scenario *s, const fa_tensor *t, int is_cache) {
    size_t es = t->dtype == FA_DTYPE_I8 ? 1 : h_dtype_bytes(t->dtype);
    watch(s, t->data, (size_t)h_numel(t) * es, is_cache);
}

static void reset(scenario *s) {
    for (int i = 0; i < s->nr; i++) {
        if (s->r[i].initial) memcpy(s->r[i].data, s->r[i].initial, s->r[i].bytes);
        else memset(s->r[i].data, SENTINEL, s->r[i].bytes);
    }
}

/* 1 when every region is as reset left it. */
static int untouched(const scenario *s) {
    for (int i = 0; i < s->nr; i++) {
        const unsigned char *c = s->r[i].data;
        if (s->r[i].initial) {
            if (memcmp(c, s->r[i].initial, s->r[i].bytes) != 0) return 0;
        } else {
            for (size_t b = 0; b < s->r[i].bytes; b++)
                if (c[b] != SENTINEL) return 0;
        }
    }
    return 1;
}

static void save_result(scenario *s) {
    for (int i = 0; i < s->nr; i++) memcpy(s->r[i].result, s->r[i].data, s->r[i].bytes);
}

static int same_result(const scenario *s) {
    for (int i = 0; i < s->nr; i++)
        if (memcmp(s->r[i].result, s->r[i].data, s->r[i].bytes) != 0) return 0;
    return 1;
}

/* Counting without failing: an index no call reaches (with -1 the hook is off and,
 * in this library, counts nothing). */
#define HOOK_COUNT_ONLY INT64_MAX

static fa_context *fresh_context(scenario *s) {
    fa_context *ctx = NULL;
    fa_alloc_hook_set(-1);
    if (fa_context_create(&ctx) != FA_OK) return NULL;
    fa_context_set(ctx, FA_PARAM_THREADS, s->threads);
    fa_context_set(ctx, FA_PARAM_ALGO, s->algo);
    fa_context_set(ctx, FA_PARAM_KV_SPLITS, s->splits);
    if (s->warm) {
        reset(s);
        s->call(ctx, s);
    }
    return ctx;
}

static fa_status call_forward(fa_context *ctx, scenario *s) { return fa_forward(ctx, &s->args); }

/* Counts the allocations of s->call, then fails each in turn. */
static void drive(scenario *s) {
    h_case("%s algo=%s threads=%lld warm=%d", s->name, h_algo_str(s->algo), (long long)s->threads, s->warm);
    fa_context *ctx = fresh_context(s);
    if (!CHECK(ctx != NULL, "fa_context_create failed")) return;
    reset(s);
    fa_alloc_hook_set(HOOK_COUNT_ONLY);
    fa_status st = s->call(ctx, s);
    const int64_t n = fa_alloc_hook_count();
    fa_alloc_hook_set(-1);
    fa_context_free(ctx);
    if (!CHECK(st == FA_OK, "%s: the unhooked call failed: %s", s->name, fa_status_string(st))) return;
    save_result(s);
    printf("%-40s algo=%-9s threads=%lld warm=%d: %lld allocations\n", s->name, h_algo_str(s->algo),
           (long long)s->threads, s->warm, (long long)n);

    for (int64_t k = 0; k <= n; k++) {
        h_case("%s algo=%s threads=%lld warm=%d: allocation %lld of %lld fails", s->name, h_algo_str(s->algo),
               (long long)s->threads, s->warm, (long long)k, (long long)n);
        ctx = fresh_context(s);
        if (!CHECK(ctx != NULL, "fa_context_create failed")) return;
        reset(s);
        fa_alloc_hook_set(k);
        st = s->call(ctx, s);
        fa_alloc_hook_set(-1);
        if (k < n) {
            CHECK(st == FA_ERR_OUT_OF_MEMORY, "status %s (%s), expected OUT_OF_MEMORY", fa_status_string(st),
                  fa_context_error(ctx));
            CHECK(fa_context_error(ctx)[0] != '\0', "no error message");
            CHECK(untouched(s), "a call that ran out of memory wrote its outputs or the cache");
        } else {
            CHECK(st == FA_OK && same_result(s), "with every allocation granted: status %s, result %s",
                  fa_status_string(st), st == FA_OK && same_result(s) ? "same" : "differs");
        }
        fa_context_free(ctx);
    }
}

static void scenario_free(scenario *s) {
    for (int i = 0; i < s->nr; i++) free(s->r[i].initial), free(s->r[i].result);
}

/* ------------------------------------------------------------ the calls */

static h_rng g_rng;

static void test_dense(void) {
    const h_dims d = {2, 40, 64, 4, 2, 32, 24};
    h_problem p;
    h_problem_alloc(&p, d, FA_DTYPE_F16, FA_DTYPE_F32);
    h_fill_normal(&p.args.q, &g_rng, 1.0);
    h_fill_normal(&p.args.k, &g_rng, 1.0);
    h_fill_normal(&p.args.v, &g_rng, 1.0);
    p.args.causal = FA_CAUSAL_BOTTOM_RIGHT;
    const fa_algo algos[] = {FA_ALGO_FLASH, FA_ALGO_STANDARD, FA_ALGO_REFERENCE};
    for (size_t al = 0; al < 3; al++)
        for (int64_t threads = 1; threads <= 2; threads++)
            for (int warm = 0; warm < 2; warm++) {
                scenario s;
                memset(&s, 0, sizeof s);
                s.name = "dense";
                s.call = call_forward;
                s.algo = algos[al], s.threads = threads, s.warm = warm;
                s.args = p.args;
                watch_tensor(&s, &p.args.o, 0);
                watch_tensor(&s, &p.args.lse, 0);
                drive(&s);
                scenario_free(&s);
            }
    h_problem_free(&p);
}

static void test_varlen(void) {
    const int32_t cu_q[4] = {0, 5, 5, 30}, cu_k[4] = {0, 9, 20, 40};
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = h_alloc(FA_DTYPE_BF16, 1, 30, 4, 16);
    a.k = h_alloc(FA_DTYPE_BF16, 1, 40, 1, 16);
    a.v = h_alloc(FA_DTYPE_BF16, 1, 40, 1, 16);
    a.o = h_alloc(FA_DTYPE_BF16, 1, 30, 4, 16);
    a.lse = h_alloc(FA_DTYPE_F32, 1, 4, 30, 1);
    h_fill_normal(&a.q, &g_rng, 1.0), h_fill_normal(&a.k, &g_rng, 1.0), h_fill_normal(&a.v, &g_rng, 1.0);
    a.cu_seqlens_q = cu_q, a.cu_seqlens_k = cu_k, a.num_seqs = 3;
    a.causal = FA_CAUSAL_BOTTOM_RIGHT;
    for (int64_t threads = 1; threads <= 2; threads++) {
        scenario s;
        memset(&s, 0, sizeof s);
        s.name = "varlen";
        s.call = call_forward;
        s.algo = FA_ALGO_AUTO, s.threads = threads;
        s.args = a;
        watch_tensor(&s, &a.o, 0);
        watch_tensor(&s, &a.lse, 0);
        drive(&s);
        scenario_free(&s);
    }
    free(a.q.data), free(a.k.data), free(a.v.data), free(a.o.data), free(a.lse.data);
}

static fa_status call_cache(fa_context *ctx, scenario *s) {
    s->args.kv_cache = &s->cache; /* the scenario was copied: point at its own cache */
    return fa_forward(ctx, &s->args);
}

/* A cache append: contiguous f32, or paged int8 (with its scales); splits forced for
 * the decode form. latent: an MLA latent cache (v_in_k; V = K's first Dv = 12 columns,
 * v, new v and v_scale empty), whose undo copy covers each shared row once. */
static void test_cache(int paged, int64_t splits, int64_t sq, int latent) {
    const int64_t B = 2, Hq = 4, Hk = 2, D = 16, Dv = latent ? 12 : D, pages = 8, page = 8, Smax = 40;
    const int32_t seqlens[2] = {17, 6}, table[2 * 4] = {3, 0, 5, 1, 6, 2, 7, 4};
    fa_kv_cache c = FA_KV_CACHE_INIT;
    const fa_dtype cdt = paged ? FA_DTYPE_I8 : FA_DTYPE_F32;
    const int64_t d0 = paged ? pages : B, d1 = paged ? page : Smax;
    c.k = h_alloc(paged ? FA_DTYPE_BOOL : FA_DTYPE_F32, d0, d1, Hk, D);
    c.v = h_alloc(paged ? FA_DTYPE_BOOL : FA_DTYPE_F32, d0, d1, Hk, D);
    c.k.dtype = c.v.dtype = cdt;
    if (paged) {
        c.k_scale = h_alloc(FA_DTYPE_F32, d0, d1, Hk, 1);
        c.v_scale = h_alloc(FA_DTYPE_F32, d0, d1, Hk, 1);
        for (int64_t e = 0; e < h_numel(&c.k); e++)
            ((signed char *)c.k.data)[e] = (signed char)(e % 17 - 8), ((signed char *)c.v.data)[e] = (signed char)(e % 13 - 6);
        h_fill(&c.k_scale, 0.05), h_fill(&c.v_scale, 0.07);
        c.block_table = table, c.max_pages = 4;
    } else {
        h_fill_normal(&c.k, &g_rng, 1.0), h_fill_normal(&c.v, &g_rng, 1.0);
    }
    c.seqlens = seqlens;
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = h_alloc(FA_DTYPE_F32, B, sq, Hq, D);
    a.k = h_alloc(FA_DTYPE_F32, B, 2, Hk, D); /* two new rows per sequence */
    a.v = h_alloc(FA_DTYPE_F32, B, 2, Hk, D);
    a.o = h_alloc(FA_DTYPE_F32, B, sq, Hq, Dv);
    a.lse = h_alloc(FA_DTYPE_F32, B, Hq, sq, 1);
    h_fill_normal(&a.q, &g_rng, 1.0), h_fill_normal(&a.k, &g_rng, 1.0), h_fill_normal(&a.v, &g_rng, 1.0);
    fa_tensor v_new = a.v, v_cache = c.v, v_scale = c.v_scale; /* freed below, latent or not */
    if (latent) {
        c.v_in_k = 1;
        a.v = c.v = c.v_scale = (fa_tensor){0};
    }
    for (int64_t threads = 1; threads <= 2; threads++)
        for (int warm = 0; warm < 2; warm++) {
            scenario s;
            memset(&s, 0, sizeof s);
            s.name = latent ? (paged ? "paged int8 latent cache append" : "latent cache append")
                     : paged ? (splits ? "paged int8 cache append, split-KV" : "paged int8 cache append")
                             : (splits ? "cache append, split-KV" : "cache append");
            s.call = call_cache;
            s.algo = FA_ALGO_AUTO, s.threads = threads, s.splits = splits, s.warm = warm;
            s.args = a;
            s.cache = c;
            watch_tensor(&s, &a.o, 0);
            watch_tensor(&s, &a.lse, 0);
            watch_tensor(&s, &c.k, 1);
            watch_tensor(&s, &v_cache, 1);
            if (paged) watch_tensor(&s, &c.k_scale, 1), watch_tensor(&s, &v_scale, 1);
            drive(&s);
            scenario_free(&s);
        }
    free(c.k.data), free(v_cache.data), free(c.k_scale.data), free(v_scale.data);
    free(a.q.data), free(a.k.data), free(v_new.data), free(a.o.data), free(a.lse.data);
}

static fa_tensor g_parts[3], g_part_lse[3], g_mo, g_ml;

static fa_status call_merge(fa_context *ctx, scenario *s) {
    (void)s;
    return fa_merge_states(ctx, 3, g_parts, g_part_lse, &g_mo, &g_ml);
}

static void test_merge(void) {
    for (int i = 0; i < 3; i++) {
        g_parts[i] = h_alloc(i == 1 ? FA_DTYPE_F16 : FA_DTYPE_F32, 2, 5, 3, 20);
        g_part_lse[i] = h_alloc(FA_DTYPE_F32, 2, 3, 5, 1);
        h_fill_normal(&g_parts[i], &g_rng, 1.0);
        h_fill_normal(&g_part_lse[i], &g_rng, 2.0);
    }
    g_mo = h_alloc(FA_DTYPE_BF16, 2, 5, 3, 20);
    g_ml = h_alloc(FA_DTYPE_F32, 2, 3, 5, 1);
    scenario s;
    memset(&s, 0, sizeof s);
    s.name = "fa_merge_states";
    s.call = call_merge;
    s.algo = FA_ALGO_AUTO, s.threads = 1;
    watch_tensor(&s, &g_mo, 0);
    watch_tensor(&s, &g_ml, 0);
    drive(&s);
    scenario_free(&s);
    for (int i = 0; i < 3; i++) free(g_parts[i].data), free(g_part_lse[i].data);
    free(g_mo.data), free(g_ml.data);
}

static void test_context(void) {
    /* fa_context_create (default threads: a pool when the machine has > 1 CPU) */
    h_case("fa_context_create");
    fa_context *ctx = NULL;
    fa_alloc_hook_set(HOOK_COUNT_ONLY);
    fa_status st = fa_context_create(&ctx);
    int64_t n = fa_alloc_hook_count();
    fa_alloc_hook_set(-1);
    CHECK(st == FA_OK, "fa_context_create failed");
    fa_context_free(ctx);
    printf("%-40s %lld allocations\n", "fa_context_create", (long long)n);
    CHECK(n > 0, "fa_context_create allocates nothing through the hook");
    for (int64_t k = 0; k < n; k++) {
        h_case("fa_context_create: allocation %lld of %lld fails", (long long)k, (long long)n);
        ctx = (fa_context *)&n; /* must be overwritten with NULL */
        fa_alloc_hook_set(k);
        st = fa_context_create(&ctx);
        fa_alloc_hook_set(-1);
        CHECK(st == FA_ERR_OUT_OF_MEMORY && ctx == NULL, "status %s, *out %s", fa_status_string(st),
              ctx ? "not NULL" : "NULL");
        if (st == FA_OK) fa_context_free(ctx);
    }

    /* fa_context_set(THREADS): 1 -> 2 and 3 starts a pool */
    const h_dims d = {1, 16, 16, 2, 2, 16, 16};
    h_problem p;
    h_problem_alloc(&p, d, FA_DTYPE_F32, FA_DTYPE_F32);
    h_fill_normal(&p.args.q, &g_rng, 1.0), h_fill_normal(&p.args.k, &g_rng, 1.0), h_fill_normal(&p.args.v, &g_rng, 1.0);
    for (int64_t to = 2; to <= 3; to++) {
        h_case("fa_context_set(THREADS, %lld)", (long long)to);
        fa_context_create(&ctx);
        fa_context_set(ctx, FA_PARAM_THREADS, 1);
        fa_alloc_hook_set(HOOK_COUNT_ONLY);
        st = fa_context_set(ctx, FA_PARAM_THREADS, to);
        n = fa_alloc_hook_count();
        fa_alloc_hook_set(-1);
        CHECK(st == FA_OK, "set THREADS failed");
        fa_context_free(ctx);
        printf("%-40s %lld allocations\n", to == 2 ? "fa_context_set(THREADS, 1 -> 2)" : "fa_context_set(THREADS, 1 -> 3)",
               (long long)n);
        for (int64_t k = 0; k < n; k++) {
            h_case("fa_context_set(THREADS, %lld): allocation %lld of %lld fails", (long long)to, (long long)k,
                   (long long)n);
            fa_context_create(&ctx);
            fa_context_set(ctx, FA_PARAM_THREADS, 1);
            fa_alloc_hook_set(k);
            st = fa_context_set(ctx, FA_PARAM_THREADS, to);
            fa_alloc_hook_set(-1);
            CHECK(st == FA_ERR_OUT_OF_MEMORY, "status %s (%s)", fa_status_string(st), fa_context_error(ctx));
            /* the context still works */
            st = fa_forward(ctx, &p.args);
            CHECK(st == FA_OK, "a call after the failed setting: %s", fa_context_error(ctx));
            fa_context_free(ctx);
        }
    }
    h_problem_free(&p);
}

int main(void) {
    fa_context *probe;
    if (!CHECK(h_context_create(&probe) == FA_OK, "fa_context_create failed")) return h_summary();
    fa_context_free(probe);
    h_rng_seed(&g_rng, h_env_u64("FA_TEST_SEED", 88));
    test_context();
    test_dense();
    test_varlen();
    test_cache(0, 0, 3, 0);
    test_cache(0, 3, 1, 0);
    test_cache(1, 0, 3, 0);
    test_cache(1, 2, 1, 0);
    test_cache(0, 2, 1, 1);
    test_cache(1, 0, 3, 1);
    test_merge();
    return h_summary();
}
