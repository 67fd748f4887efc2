/*
 * test_threads.c: fa_forward from several host threads (the header's "Threads" rule).
 *
 *   independent  8 threads at once, each with its own context (1 or 2 worker threads),
 *                each running a dense causal prefill and a KV-cache decode with an append
 *                into its own copy of the cache; every o, lse and cache byte must equal
 *                the serial calls' bit for bit (results never depend on thread counts).
 *   shared       one context hammered by two threads: fa_forward, fa_merge_states and
 *                fa_context_set each return their own result or FA_ERR_BUSY, never
 *                anything else; an OK result is bitwise the serial one, a BUSY call
 *                leaves its outputs untouched.
 *   packed waves the pool's threads on a forward whose packed K/V (FA_PARAM_KV_PACK) come
 *                in waves through two buffers, so packing a wave waits for the tasks
 *                of the one before last; long units in key chunks, each task in
 *                steps that wait for its previous one; o and lse bitwise the unpacked 1-thread
 *                run's on 1 to 4 threads.
 *   backward     the pool's threads sharing one MQA backward: one (sequence, kv head)
 *                walk, so 2 to 4 threads take the two-pass schedule (key tiles, then
 *                query blocks, in one pool of tasks); dq, dk, dv bitwise the fused
 *                1-thread run's.
 *
 * Runs in the Release and ASan builds and, with the label "threads", in the TSan build,
 * which also sees any data race between contexts or inside one. Worker threads record
 * their findings; the main thread CHECKs them after joining (the harness counters are
 * not thread-safe).
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* HAMMER: successful forward calls each hammering thread must make; a BUSY call
 * yields and tries again (up to MAX_ATTEMPTS calls in all), since a thread that only
 * ever meets BUSY would otherwise finish at once and stop competing. */
enum { NTHREADS = 8, ROUNDS = 3, HAMMER = 60, MAX_ATTEMPTS = 200000, SENTINEL = 0xa5 };

static int untouched(const fa_tensor *t) {
    const unsigned char *c = t->data;
    for (size_t i = 0; i < h_nbytes(t); i++)
        if (c[i] != SENTINEL) return 0;
    return 1;
}

/* ------------------------------------------------------------ the two calls */

/* Dense causal prefill: B=1, S=80, Hq=4, Hk=2, D=Dv=64, bf16 in, f32 out. */
static h_problem g_dense;
/* Decode: q (2, 1, 8, 64) f32 against an f16 cache (2, 256, 2, 64) holding 200 and 131
 * rows, one new row appended per sequence. */
static fa_tensor g_q, g_knew, g_vnew, g_kc, g_vc;
static const int32_t g_seqlens[2] = {200, 131};
/* The serial results. */
static fa_tensor g_dense_o, g_dense_lse, g_dec_o, g_dec_lse, g_kc_after, g_vc_after;

static void setup(void) {
    h_rng r;
    h_rng_seed(&r, h_env_u64("FA_TEST_SEED", 77));
    const h_dims d = {1, 80, 80, 4, 2, 64, 64};
    h_problem_alloc(&g_dense, d, FA_DTYPE_BF16, FA_DTYPE_F32);
    h_fill_normal(&g_dense.args.q, &r, 1.0);
    h_fill_normal(&g_dense.args.k, &r, 1.0);
    h_fill_normal(&g_dense.args.v, &r, 1.0);
    g_dense.args.causal = FA_CAUSAL_BOTTOM_RIGHT;

    g_q = h_alloc(FA_DTYPE_F32, 2, 1, 8, 64);
    g_knew = h_alloc(FA_DTYPE_F32, 2, 1, 2, 64);
    g_vnew = h_alloc(FA_DTYPE_F32, 2, 1, 2, 64);
    g_kc = h_alloc(FA_DTYPE_F16, 2, 256, 2, 64);
    g_vc = h_alloc(FA_DTYPE_F16, 2, 256, 2, 64);
    h_fill_normal(&g_q, &r, 1.0);
    h_fill_normal(&g_knew, &r, 1.0);
    h_fill_normal(&g_vnew, &r, 1.0);
    h_fill_normal(&g_kc, &r, 1.0);
    h_fill_normal(&g_vc, &r, 1.0);
}

/* The decode call on (kc, vc), writing o and lse. */
static fa_status decode(fa_context *ctx, fa_tensor *kc, fa_tensor *vc, fa_tensor *o, fa_tensor *lse) {
    fa_kv_cache c = FA_KV_CACHE_INIT;
    c.k = *kc, c.v = *vc, c.seqlens = g_seqlens;
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = g_q, a.k = g_knew, a.v = g_vnew, a.o = *o, a.lse = *lse;
    a.kv_cache = &c;
    return fa_forward(ctx, &a);
}

static fa_status dense(fa_context *ctx, fa_tensor *o, fa_tensor *lse) {
    fa_forward_args a = g_dense.args;
    a.o = *o, a.lse = *lse;
    return fa_forward(ctx, &a);
}

/* ------------------------------------------------------------ independent contexts */

typedef struct worker {
    int id;
    int failures;
    char first[200];
} worker;

static void note(worker *w, const char *what, fa_status st) {
    if (w->failures++ == 0)
        snprintf(w->first, sizeof w->first, "%s (status %s)", what, fa_status_string(st));
}

static void *independent(void *arg) {
    worker *w = arg;
    fa_context *ctx;
    fa_status st = fa_context_create(&ctx);
    if (st != FA_OK) {
        note(w, "fa_context_create", st);
        return NULL;
    }
    if ((st = fa_context_set(ctx, FA_PARAM_THREADS, 1 + w->id % 2)) != FA_OK) note(w, "set THREADS", st);
    fa_tensor o = h_clone(&g_dense_o), lse = h_clone(&g_dense_lse);
    fa_tensor dec_o = h_clone(&g_dec_o), dec_lse = h_clone(&g_dec_lse);
    fa_tensor kc = h_clone(&g_kc), vc = h_clone(&g_vc);
    for (int round = 0; round < ROUNDS; round++) {
        memset(o.data, SENTINEL, h_nbytes(&o));
        memset(lse.data, SENTINEL, h_nbytes(&lse));
        if ((st = dense(ctx, &o, &lse)) != FA_OK) note(w, "dense call failed", st);
        else if (!h_same_bytes(&o, &g_dense_o) || !h_same_bytes(&lse, &g_dense_lse)) note(w, "dense result differs from serial", st);

        memcpy(kc.data, g_kc.data, h_nbytes(&kc));
        memcpy(vc.data, g_vc.data, h_nbytes(&vc));
        memset(dec_o.data, SENTINEL, h_nbytes(&dec_o));
        memset(dec_lse.data, SENTINEL, h_nbytes(&dec_lse));
        if ((st = decode(ctx, &kc, &vc, &dec_o, &dec_lse)) != FA_OK) note(w, "decode call failed", st);
        else if (!h_same_bytes(&dec_o, &g_dec_o) || !h_same_bytes(&dec_lse, &g_dec_lse))
            note(w, "decode result differs from serial", st);
        else if (!h_same_bytes(&kc, &g_kc_after) || !h_same_bytes(&vc, &g_vc_after))
            note(w, "cache after the append differs from serial", st);
    }
    free(o.data), free(lse.data), free(dec_o.data), free(dec_lse.data), free(kc.data), free(vc.data);
    fa_context_free(ctx);
    return NULL;
}

static void test_independent(void) {
    h_case("independent contexts");
    pthread_t tid[NTHREADS];
    worker w[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) {
        memset(&w[t], 0, sizeof w[t]);
        w[t].id = t;
        CHECK(pthread_create(&tid[t], NULL, independent, &w[t]) == 0, "pthread_create %d", t);
    }
    for (int t = 0; t < NTHREADS; t++) {
        pthread_join(tid[t], NULL);
        CHECK(w[t].failures == 0, "thread %d: %d failures, first: %s", t, w[t].failures, w[t].first);
    }
}

/* ------------------------------------------------------------ one shared context */

/* A small dense call and a merge, each thread with its own outputs. */
static h_problem g_small;
static fa_tensor g_small_o, g_small_lse;
static fa_tensor g_parts[2], g_part_lse[2], g_merged, g_merged_lse;
static fa_context *g_shared;

typedef struct hammer {
    worker w;
    int64_t ok, busy, forward_ok;
} hammer;

/* OK with a bitwise-correct result, or BUSY with the outputs untouched. */
static void judge(hammer *h, const char *what, fa_status st, fa_tensor *o, fa_tensor *lse, const fa_tensor *want_o,
                  const fa_tensor *want_lse) {
    if (st == FA_OK) {
        h->ok++;
        if (!h_same_bytes(o, want_o) || !h_same_bytes(lse, want_lse)) note(&h->w, what, st);
    } else if (st == FA_ERR_BUSY) {
        h->busy++;
        if (!untouched(o) || !untouched(lse)) note(&h->w, "a BUSY call wrote its outputs", st);
    } else {
        note(&h->w, what, st);
    }
}

static void *hammering(void *arg) {
    hammer *h = arg;
    fa_tensor o = h_clone(&g_small_o), lse = h_clone(&g_small_lse);
    fa_tensor mo = h_clone(&g_merged), ml = h_clone(&g_merged_lse);
    for (int it = 0; h->forward_ok < HAMMER && it < MAX_ATTEMPTS; it++) {
        memset(o.data, SENTINEL, h_nbytes(&o));
        memset(lse.data, SENTINEL, h_nbytes(&lse));
        fa_forward_args a = g_small.args;
        a.o = o, a.lse = lse;
        const int64_t busy_before = h->busy;
        const fa_status fst = fa_forward(g_shared, &a);
        judge(h, "shared forward", fst, &o, &lse, &g_small_o, &g_small_lse);
        h->forward_ok += fst == FA_OK;

        switch ((it + h->w.id) % 4) {
        case 0: {
            memset(mo.data, SENTINEL, h_nbytes(&mo));
            memset(ml.data, SENTINEL, h_nbytes(&ml));
            const fa_status st = fa_merge_states(g_shared, 2, g_parts, g_part_lse, &mo, &ml);
            judge(h, "shared merge", st, &mo, &ml, &g_merged, &g_merged_lse);
            break;
        }
        case 1: { /* a setting that changes nothing, and one that rebuilds the pool */
            fa_status st = fa_context_set(g_shared, FA_PARAM_TILE_Q, 0);
            if (st != FA_OK && st != FA_ERR_BUSY) note(&h->w, "set TILE_Q", st);
            st = fa_context_set(g_shared, FA_PARAM_THREADS, 1 + (it / 4) % 2);
            if (st != FA_OK && st != FA_ERR_BUSY) note(&h->w, "set THREADS", st);
            h->busy += st == FA_ERR_BUSY;
            break;
        }
        case 2: { /* a call that fails validation: its own status or BUSY */
            memset(o.data, SENTINEL, h_nbytes(&o));
            a.k.shape[3] = 3;
            const fa_status st = fa_forward(g_shared, &a);
            if (st != FA_ERR_SHAPE_MISMATCH && st != FA_ERR_BUSY) note(&h->w, "a bad call", st);
            if (!untouched(&o)) note(&h->w, "a failed call wrote o", st);
            break;
        }
        default: break;
        }
        if (h->busy != busy_before) sched_yield();
    }
    free(o.data), free(lse.data), free(mo.data), free(ml.data);
    return NULL;
}

static void test_shared(void) {
    h_case("one shared context");
    h_rng r;
    h_rng_seed(&r, 78);
    const h_dims d = {1, 8, 24, 2, 1, 16, 16};
    h_problem_alloc(&g_small, d, FA_DTYPE_F32, FA_DTYPE_F32);
    h_fill_normal(&g_small.args.q, &r, 1.0);
    h_fill_normal(&g_small.args.k, &r, 1.0);
    h_fill_normal(&g_small.args.v, &r, 1.0);
    for (int i = 0; i < 2; i++) {
        g_parts[i] = h_alloc(FA_DTYPE_F32, 2, 3, 2, 16);
        g_part_lse[i] = h_alloc(FA_DTYPE_F32, 2, 2, 3, 1);
        h_fill_normal(&g_parts[i], &r, 1.0);
        h_fill_normal(&g_part_lse[i], &r, 2.0);
    }
    g_merged = h_alloc(FA_DTYPE_F32, 2, 3, 2, 16);
    g_merged_lse = h_alloc(FA_DTYPE_F32, 2, 2, 3, 1);

    CHECK(fa_context_create(&g_shared) == FA_OK, "fa_context_create");
    CHECK(fa_context_set(g_shared, FA_PARAM_THREADS, 2) == FA_OK, "set THREADS");
    /* serial results (thread counts never change them) */
    g_small_o = h_clone(&g_small.args.o), g_small_lse = h_clone(&g_small.args.lse);
    fa_forward_args a = g_small.args;
    a.o = g_small_o, a.lse = g_small_lse;
    CHECK(fa_forward(g_shared, &a) == FA_OK, "serial small call: %s", fa_context_error(g_shared));
    CHECK(fa_merge_states(g_shared, 2, g_parts, g_part_lse, &g_merged, &g_merged_lse) == FA_OK, "serial merge: %s",
          fa_context_error(g_shared));

    pthread_t tid[2];
    hammer h[2];
    for (int t = 0; t < 2; t++) {
        memset(&h[t], 0, sizeof h[t]);
        h[t].w.id = t;
        CHECK(pthread_create(&tid[t], NULL, hammering, &h[t]) == 0, "pthread_create");
    }
    for (int t = 0; t < 2; t++) {
        pthread_join(tid[t], NULL);
        CHECK(h[t].w.failures == 0, "shared thread %d: %d failures, first: %s", t, h[t].w.failures, h[t].w.first);
        CHECK(h[t].forward_ok == HAMMER, "shared thread %d: %lld of %d forward calls succeeded", t,
              (long long)h[t].forward_ok, (int)HAMMER);
    }
    printf("shared context: %lld + %lld OK calls, %lld + %lld BUSY\n", (long long)h[0].ok, (long long)h[1].ok,
           (long long)h[0].busy, (long long)h[1].busy);
    /* the context is still whole: one more serial call gives the same result */
    memset(a.o.data, SENTINEL, h_nbytes(&a.o));
    CHECK(fa_forward(g_shared, &a) == FA_OK && h_same_bytes(&a.o, &g_small_o), "the shared context after the hammering");

    fa_context_free(g_shared);
    free(g_small_o.data), free(g_small_lse.data), free(g_merged.data), free(g_merged_lse.data);
    for (int i = 0; i < 2; i++) free(g_parts[i].data), free(g_part_lse[i].data);
    h_problem_free(&g_small);
}

/* An f32 problem with q, k, v drawn from N(0, 1), the seed from FA_TEST_SEED or
 * `seed`; r is left for further draws. */
static void random_problem(h_problem *p, h_dims d, uint64_t seed, h_rng *r) {
    h_rng_seed(r, h_env_u64("FA_TEST_SEED", seed));
    h_problem_alloc(p, d, FA_DTYPE_F32, FA_DTYPE_F32);
    h_fill_normal(&p->args.q, r, 1.0);
    h_fill_normal(&p->args.k, r, 1.0);
    h_fill_normal(&p->args.v, r, 1.0);
}

/* ------------------------------------------------------------ packed waves */

/* f32 BSND K/V of 6 kv heads of 128 (rows 3 KB apart, which auto packs). Sk = 4096:
 * each unit is 4 MiB, over FA_PACK_UNIT_MAX, so it goes in key chunks of 1 MiB (tasks.h)
 * and each task in one step per chunk its window reaches, its online softmax state in
 * a state slot between them; one wave per chunk. Sk = 1536: whole units of 1.5 MiB,
 * as many per wave as the threads need (twice their number in tasks). */
static void test_packed_waves_at(int64_t sk) {
    h_rng r;
    h_problem p;
    random_problem(&p, (h_dims){1, 64, sk, 6, 6, 128, 128}, 79, &r);
    p.args.window_left = 3001; /* tiles from an odd key too (the band's first) */
    fa_tensor want_o = h_clone(&p.args.o), want_lse = h_clone(&p.args.lse);
    fa_context *ctx;
    CHECK(h_context_create(&ctx) == FA_OK, "fa_context_create");
    fa_context_set(ctx, FA_PARAM_ALGO, FA_ALGO_FLASH);
    h_set_tiles(ctx, 16, 0); /* four query blocks per head: every unit is read four times, as auto wants */
    for (int th = 0; th <= 4; th++) {
        /* th = 0: the unpacked serial run the others must match */
        h_case("packed waves on %d pool threads, Sk = %lld", th, (long long)sk);
        fa_context_set(ctx, FA_PARAM_THREADS, th ? th : 1);
        fa_context_set(ctx, FA_PARAM_KV_PACK, th ? 0 : 1);
        fa_forward_args a = p.args;
        if (th == 0) a.o = want_o, a.lse = want_lse;
        const fa_status st = fa_forward(ctx, &a);
        int64_t packed = -1, us = -1, extra = -1;
        fa_context_get(ctx, FA_PARAM_LAST_KV_PACKED, &packed);
        fa_context_get(ctx, FA_PARAM_LAST_KV_PACK_US, &us);
        fa_context_get(ctx, FA_PARAM_LAST_EXTRA_BYTES, &extra);
        if (!CHECK(st == FA_OK, "%s", fa_context_error(ctx))) continue;
        CHECK(packed == (th ? 6 : 0), "LAST_KV_PACKED %lld", (long long)packed);
        CHECK(th ? us > 0 : us == 0, "LAST_KV_PACK_US %lld with %lld units packed", (long long)us, (long long)packed);
        /* chunked: two wave buffers of 1 MiB slots (two slots each on 3-4 threads) and the
         * state slots, not two 4 MiB units */
        if (th && sk > 2048) CHECK(extra < (8 << 20), "LAST_EXTRA_BYTES %lld with chunked units", (long long)extra);
        if (th) CHECK(h_same_bytes(&a.o, &want_o) && h_same_bytes(&a.lse, &want_lse), "o or lse differ bitwise from the unpacked run");
    }
    fa_context_free(ctx);
    free(want_o.data), free(want_lse.data);
    h_problem_free(&p);
}

static void test_packed_waves(void) {
    test_packed_waves_at(4096);
    test_packed_waves_at(1536);
}

/* ------------------------------------------------------------ the phase profile */

/* A backward's dO (N(0, 1), o's shape) and two sets of f32 dq, dk, dv for call a. */
static void grad_buffers(const fa_forward_args *a, h_rng *r, fa_tensor *dout, fa_tensor g[2][3]) {
    const int64_t *o = a->o.shape, *q = a->q.shape, *k = a->k.shape, *v = a->v.shape;
    *dout = h_alloc(FA_DTYPE_F32, o[0], o[1], o[2], o[3]);
    h_fill_normal(dout, r, 1.0);
    for (int x = 0; x < 2; x++) {
        g[x][0] = h_alloc(FA_DTYPE_F32, q[0], q[1], q[2], q[3]);
        g[x][1] = h_alloc(FA_DTYPE_F32, k[0], k[1], k[2], k[3]);
        g[x][2] = h_alloc(FA_DTYPE_F32, v[0], v[1], v[2], v[3]);
    }
}

/* The profile tests' call: B 1, Sq = Sk = 150, Hq 4 on Hk 2, D 64, Dv 48, bottom-right
 * causal, N(0, 1) data in f32 or bf16 (o f32); returns its kept pairs times query heads. */
static int64_t profile_problem(h_problem *p, int bf, uint64_t seed, h_rng *r) {
    h_rng_seed(r, h_env_u64("FA_TEST_SEED", seed));
    h_problem_alloc(p, (h_dims){1, 150, 150, 4, 2, 64, 48}, bf ? FA_DTYPE_BF16 : FA_DTYPE_F32, FA_DTYPE_F32);
    h_fill_normal(&p->args.q, r, 1.0);
    h_fill_normal(&p->args.k, r, 1.0);
    h_fill_normal(&p->args.v, r, 1.0);
    p->args.causal = FA_CAUSAL_BOTTOM_RIGHT;
    return 150 * 151 / 2 * 4;
}

/* FA_PARAM_PROFILE and the FA_PARAM_LAST_PHASE_* read-outs: all 0 with it off; with it on,
 * on every thread count, the products' FLOPs per phase are the call's (2 D per kept pair
 * for S, 2 Dv for P; the fused bf16 kernel's both in P) and P took time; the results are
 * bitwise those without it; the read-outs are read-only. A causal band and a tile that
 * ends inside it (the kept pairs counted row by row). f32 and bf16 (fused where the path
 * has the kernel). */
static void test_phase_profile(void) {
    for (int bf = 0; bf < 2; bf++) {
        h_rng r;
        h_problem p;
        const int64_t kept = profile_problem(&p, bf, 80, &r);
        fa_tensor want_o = h_clone(&p.args.o);
        fa_context *ctx;
        CHECK(h_context_create(&ctx) == FA_OK, "fa_context_create");
        fa_context_set(ctx, FA_PARAM_ALGO, FA_ALGO_FLASH);
        h_set_tiles(ctx, 32, 48);
        for (int th = 1; th <= 3; th++)
            for (int on = 0; on < 2; on++) {
                h_case("phase profile %s, %d threads, profile %s", bf ? "bf16" : "f32", th, on ? "on" : "off");
                fa_context_set(ctx, FA_PARAM_THREADS, th);
                CHECK(fa_context_set(ctx, FA_PARAM_PROFILE, on) == FA_OK, "set PROFILE");
                fa_forward_args a = p.args;
                if (th == 1 && !on) a.o = want_o;
                if (!CHECK(fa_forward(ctx, &a) == FA_OK, "%s", fa_context_error(ctx))) continue;
                int64_t us[FA_PHASES], flop[FA_PHASES], sum = 0;
                for (int k = 0; k < FA_PHASES; k++) {
                    us[k] = flop[k] = -1;
                    CHECK(fa_context_get(ctx, (fa_param)(FA_PARAM_LAST_PHASE_US + k), &us[k]) == FA_OK &&
                              fa_context_get(ctx, (fa_param)(FA_PARAM_LAST_PHASE_FLOP + k), &flop[k]) == FA_OK,
                          "get phase %d", k);
                    if (!on) CHECK(us[k] == 0 && flop[k] == 0, "phase %d: %lld us, %lld FLOP with the profile off", k,
                                   (long long)us[k], (long long)flop[k]);
                    sum += flop[k];
                }
                if (on) {
                    CHECK(sum == kept * 2 * (64 + 48) && flop[1] == 0 && flop[3] == 0, "FLOPs S %lld P %lld, sum %lld, want %lld",
                          (long long)flop[0], (long long)flop[2], (long long)sum, (long long)(kept * 2 * (64 + 48)));
                    CHECK(flop[0] == 0 || flop[0] == kept * 2 * 64, "S FLOPs %lld: the scores' 2 D per pair, or none (fused)",
                          (long long)flop[0]);
                    CHECK(us[2] > 0 || flop[2] > 0, "P: %lld us", (long long)us[2]);
                }
                if (th > 1 || on) CHECK(h_same_bytes(&a.o, &want_o), "o differs bitwise from the run without the profile");
            }
        CHECK(fa_context_set(ctx, FA_PARAM_LAST_PHASE_US, 1) == FA_ERR_INVALID_ARGUMENT &&
                  fa_context_set(ctx, (fa_param)(FA_PARAM_LAST_PHASE_FLOP + FA_PHASES - 1), 1) == FA_ERR_INVALID_ARGUMENT,
              "the phase read-outs are read-only");
        int64_t v = 0;
        CHECK(fa_context_get(ctx, (fa_param)(FA_PARAM_LAST_PHASE_US + FA_PHASES), &v) == FA_ERR_INVALID_ARGUMENT,
              "no read-out past the last phase");
        fa_context_free(ctx);
        free(want_o.data);
        h_problem_free(&p);
    }
}

/* The backward's phase read-outs (profile.h's second list): with the profile on, on every
 * thread count, the products' FLOPs are the call's, 2 per kept pair and dimension of each
 * product (S 2 D, dP 2 Dv, dV 2 Dv, dK 2 D, dQ 2 D; the fused bf16 tile's all in S; S and dP
 * once per pass), and a gradient not asked for is not counted; the gradients are bitwise those without it. */
static void test_backward_phase_profile(void) {
    for (int bf = 0; bf < 2; bf++) {
        h_rng r;
        h_problem p;
        const int64_t kept = profile_problem(&p, bf, 81, &r);
        fa_tensor dout, g[2][3];
        grad_buffers(&p.args, &r, &dout, g);
        fa_context *ctx;
        CHECK(h_context_create(&ctx) == FA_OK, "fa_context_create");
        fa_context_set(ctx, FA_PARAM_ALGO, FA_ALGO_FLASH);
        h_set_tiles(ctx, 32, 48);
        CHECK(fa_forward(ctx, &p.args) == FA_OK, "forward: %s", fa_context_error(ctx));
        for (int th = 1; th <= 3; th++)
            for (int on = 0; on < 2; on++)
                for (int no_dq = 0; no_dq < 2; no_dq++) {
                    h_case("backward phase profile %s, %d threads, profile %s%s", bf ? "bf16" : "f32", th,
                           on ? "on" : "off", no_dq ? ", no dq" : "");
                    fa_context_set(ctx, FA_PARAM_THREADS, th);
                    CHECK(fa_context_set(ctx, FA_PARAM_PROFILE, on) == FA_OK, "set PROFILE");
                    const int k = th > 1 || on;
                    fa_backward_args b = FA_BACKWARD_ARGS_INIT;
                    b.fwd = &p.args, b.do_ = dout, b.dk = g[k][1], b.dv = g[k][2];
                    if (!no_dq) b.dq = g[k][0];
                    if (!CHECK(fa_backward(ctx, &b) == FA_OK, "%s", fa_context_error(ctx))) continue;
                    int64_t us[FA_PHASES], flop[FA_PHASES], sum = 0, time = 0;
                    for (int x = 0; x < FA_PHASES; x++) {
                        us[x] = flop[x] = -1;
                        CHECK(fa_context_get(ctx, (fa_param)(FA_PARAM_LAST_PHASE_US + x), &us[x]) == FA_OK &&
                                  fa_context_get(ctx, (fa_param)(FA_PARAM_LAST_PHASE_FLOP + x), &flop[x]) == FA_OK,
                              "get phase %d", x);
                        if (!on) CHECK(us[x] == 0 && flop[x] == 0, "phase %d: %lld us, %lld FLOP with the profile off",
                                       x, (long long)us[x], (long long)flop[x]);
                        sum += flop[x], time += us[x];
                    }
                    /* two passes (dK, dV, then dQ) recompute S and dP in each; without dq the
                     * second has nothing to do */
                    int64_t passes = 0;
                    fa_context_get(ctx, FA_PARAM_LAST_BACKWARD_PASSES, &passes);
                    if (on) {
                        const int64_t np = passes == 2 && !no_dq ? 2 : 1;
                        const int64_t want = kept * 2 * ((np + (no_dq ? 1 : 2)) * 64 + (np + 1) * 48);
                        const int fused = flop[0] == want;
                        CHECK(sum == want, "FLOPs %lld, want %lld (%lld passes)", (long long)sum, (long long)want,
                              (long long)passes);
                        CHECK(fused || (flop[0] == np * kept * 2 * 64 && flop[1] == 0 && flop[2] == np * kept * 2 * 48 &&
                                        flop[3] == 0 && flop[4] == kept * 2 * 48 && flop[5] == kept * 2 * 64 &&
                                        flop[6] == (no_dq ? 0 : kept * 2 * 64)),
                              "FLOPs S %lld X %lld dP %lld dS %lld dV %lld dK %lld dQ %lld", (long long)flop[0],
                              (long long)flop[1], (long long)flop[2], (long long)flop[3], (long long)flop[4],
                              (long long)flop[5], (long long)flop[6]);
                        CHECK(time > 0, "no phase took time");
                    }
                    if (k && !no_dq)
                        CHECK(h_same_bytes(&g[0][0], &g[1][0]), "dq differs bitwise from the 1-thread run without the profile");
                    if (k)
                        CHECK(h_same_bytes(&g[0][1], &g[1][1]) && h_same_bytes(&g[0][2], &g[1][2]),
                              "dk or dv differs bitwise from the 1-thread run without the profile");
                }
        fa_context_free(ctx);
        for (int k = 0; k < 2; k++)
            for (int t = 0; t < 3; t++) free(g[k][t].data);
        free(dout.data);
        h_problem_free(&p);
    }
}

/* ------------------------------------------------------------ backward on the pool */

static void test_backward_pool(void) {
    h_rng r;
    h_problem p;
    random_problem(&p, (h_dims){1, 90, 150, 4, 1, 32, 24}, 78, &r);
    p.args.causal = FA_CAUSAL_BOTTOM_RIGHT;
    p.args.dropout_p = 0.2f, p.args.dropout_seed = 5;
    fa_tensor dout, g[2][3];
    grad_buffers(&p.args, &r, &dout, g);
    fa_context *ctx;
    CHECK(h_context_create(&ctx) == FA_OK, "fa_context_create");
    for (int th = 1; th <= 4; th++) {
        h_case("backward on %d pool threads", th);
        fa_context_set(ctx, FA_PARAM_THREADS, th);
        fa_context_set(ctx, FA_PARAM_ALGO, FA_ALGO_FLASH);
        const int k = th > 1;
        fa_backward_args b = FA_BACKWARD_ARGS_INIT;
        b.fwd = &p.args, b.do_ = dout, b.dq = g[k][0], b.dk = g[k][1], b.dv = g[k][2];
        fa_status st = fa_forward(ctx, &p.args);
        if (st == FA_OK) st = fa_backward(ctx, &b);
        int64_t passes = 0;
        fa_context_get(ctx, FA_PARAM_LAST_BACKWARD_PASSES, &passes);
        CHECK(st == FA_OK, "%s", fa_context_error(ctx));
        CHECK(passes == (th > 1 ? 2 : 1), "LAST_BACKWARD_PASSES %lld on %d threads", (long long)passes, th);
        if (th > 1)
            CHECK(h_same_bytes(&g[0][0], &g[1][0]) && h_same_bytes(&g[0][1], &g[1][1]) && h_same_bytes(&g[0][2], &g[1][2]),
                  "gradients differ bitwise from the 1-thread fused run");
    }
    fa_context_free(ctx);
    for (int k = 0; k < 2; k++)
        for (int t = 0; t < 3; t++) free(g[k][t].data);
    free(dout.data);
    h_problem_free(&p);
}

int main(void) {
    fa_context *ctx;
    const fa_status st = h_context_create(&ctx);
    if (!CHECK(st == FA_OK, "fa_context_create: %s", fa_status_string(st))) return h_summary();
    setup();
    /* serial results on one thread */
    CHECK(fa_context_set(ctx, FA_PARAM_THREADS, 1) == FA_OK, "set THREADS");
    g_dense_o = h_clone(&g_dense.args.o), g_dense_lse = h_clone(&g_dense.args.lse);
    CHECK(dense(ctx, &g_dense_o, &g_dense_lse) == FA_OK, "serial dense: %s", fa_context_error(ctx));
    g_dec_o = h_alloc(FA_DTYPE_F32, 2, 1, 8, 64);
    g_dec_lse = h_alloc(FA_DTYPE_F32, 2, 8, 1, 1);
    g_kc_after = h_clone(&g_kc), g_vc_after = h_clone(&g_vc);
    CHECK(decode(ctx, &g_kc_after, &g_vc_after, &g_dec_o, &g_dec_lse) == FA_OK, "serial decode: %s",
          fa_context_error(ctx));
    fa_context_free(ctx);

    test_independent();
    test_shared();
    test_packed_waves();
    test_phase_profile();
    test_backward_phase_profile();
    test_backward_pool();

    free(g_dense_o.data), free(g_dense_lse.data), free(g_dec_o.data), free(g_dec_lse.data);
    free(g_kc_after.data), free(g_vc_after.data);
    free(g_q.data), free(g_knew.data), free(g_vnew.data), free(g_kc.data), free(g_vc.data);
    h_problem_free(&g_dense);
    return h_summary();
}
