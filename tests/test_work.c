/*
 * test_work.c: the calls that stop before running. fa_forward_work's kept pairs and
 * FLOPs against counts made here pair by pair from docs/semantics.md's band rule
 * (causal both ways, windows up to "unbounded", q_start/k_start, varlen, KV caches);
 * fa_forward_check and fa_backward_check agree with the calls they check and write
 * nothing (o, lse, gradients, the cache); fa_struct_read keeps the struct_size rule.
 *
 * Legend: B batch, Sq/Sk query/key length, Hq/Hk heads, D/Dv head dims.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static fa_context *g_ctx;
static h_rng g_rng;

/* Whether key j is kept by query row i: docs/semantics.md, section 4, one pair at a time.
 * Differences are formed before comparing with a window, so huge windows cannot overflow. */
static int kept(fa_causal causal, int64_t wl, int64_t wr, int64_t qs, int64_t ks, int64_t sq, int64_t sk,
                int64_t i, int64_t j)
{
    const int64_t tl = i + qs - ks, diag = tl + sk - sq;
    if (causal == FA_CAUSAL_BOTTOM_RIGHT && j > diag) return 0;
    if (causal == FA_CAUSAL_TOP_LEFT && j > tl) return 0;
    if (wl >= 0 && diag - j > wl) return 0;
    if (wr >= 0 && j - diag > wr) return 0;
    return 1;
}

static int64_t brute(const fa_forward_args *a, int64_t sq, int64_t sk)
{
    int64_t n = 0;
    for (int64_t i = 0; i < sq; i++)
        for (int64_t j = 0; j < sk; j++)
            n += kept(a->causal, a->window_left, a->window_right, a->q_start, a->k_start, sq, sk, i, j);
    return n;
}

static int64_t pick_window(void)
{
    static const int64_t huge[] = {(int64_t)1 << 60, (int64_t)1 << 61, (int64_t)1 << 62, INT64_MAX};
    const int64_t r = h_rng_int(&g_rng, 0, 9);
    if (r < 3) return FA_WINDOW_UNBOUNDED;
    if (r < 8) return h_rng_int(&g_rng, 0, 6);
    return huge[h_rng_int(&g_rng, 0, 3)];
}

static int64_t pick_start(int64_t len)
{
    const int64_t r = h_rng_int(&g_rng, 0, 5);
    if (r < 2) return 0;
    if (r < 5) return h_rng_int(&g_rng, 0, 20);
    return FA_POSITION_MAX - len; /* the far end: the band's arithmetic near its limits */
}

static void randomise_band(fa_forward_args *a, int64_t sq_max, int64_t sk_max)
{
    a->causal = (fa_causal)h_rng_int(&g_rng, 0, 2);
    a->window_left = pick_window();
    a->window_right = pick_window();
    a->q_start = pick_start(sq_max);
    a->k_start = pick_start(sk_max);
}

static void check_work(const fa_forward_args *a, int64_t want_pairs, int64_t D, int64_t Dv)
{
    fa_work w = FA_WORK_INIT;
    const fa_status st = fa_forward_work(g_ctx, a, &w);
    if (!CHECK(st == FA_OK, "fa_forward_work: %s: %s", fa_status_string(st), fa_context_error(g_ctx))) return;
    const double flops = 2.0 * (double)(D + Dv) * (double)want_pairs;
    CHECK(w.pairs == want_pairs, "pairs %lld, counted %lld (causal %d, window %lld %lld, starts %lld %lld)",
          (long long)w.pairs, (long long)want_pairs, (int)a->causal, (long long)a->window_left,
          (long long)a->window_right, (long long)a->q_start, (long long)a->k_start);
    CHECK(w.flops == flops, "flops %.17g, want %.17g", w.flops, flops);
    CHECK(w.backward_flops == 2.5 * flops, "backward_flops %.17g, want %.17g", w.backward_flops, 2.5 * flops);
}

static void test_dense(void)
{
    for (int c = 0; c < h_scaled(400); c++) {
        const int64_t Hk = h_rng_int(&g_rng, 1, 2);
        const h_dims d = {h_rng_int(&g_rng, 0, 3), h_rng_int(&g_rng, 0, 12), h_rng_int(&g_rng, 0, 12),
                          Hk * h_rng_int(&g_rng, 0, 2), Hk, h_rng_int(&g_rng, 1, 3), h_rng_int(&g_rng, 0, 2)};
        h_problem p;
        h_problem_alloc(&p, d, FA_DTYPE_F32, FA_DTYPE_F32);
        randomise_band(&p.args, d.Sq, d.Sk);
        h_case("dense %s case %d", h_dims_str(&d), c);
        check_work(&p.args, brute(&p.args, d.Sq, d.Sk) * d.B * d.Hq, d.D, d.Dv);
        h_problem_free(&p);
    }
}

static void test_varlen(void)
{
    for (int c = 0; c < h_scaled(200); c++) {
        const int64_t n = h_rng_int(&g_rng, 1, 4), Hq = 2, Hk = 1, D = 3, Dv = 2;
        int32_t cu_q[5] = {0}, cu_k[5] = {0};
        for (int64_t b = 0; b < n; b++) {
            cu_q[b + 1] = cu_q[b] + (int32_t)h_rng_int(&g_rng, 0, 7);
            cu_k[b + 1] = cu_k[b] + (int32_t)h_rng_int(&g_rng, 0, 7);
        }
        const h_dims d = {1, cu_q[n], cu_k[n], Hq, Hk, D, Dv};
        h_problem p;
        h_problem_alloc(&p, d, FA_DTYPE_F32, FA_DTYPE_F32);
        void *lse = p.args.lse.data; /* no lse: given back for h_problem_free */
        p.args.lse.data = NULL;
        p.args.cu_seqlens_q = cu_q;
        p.args.cu_seqlens_k = cu_k;
        p.args.num_seqs = n;
        randomise_band(&p.args, 7, 7);
        int64_t want = 0;
        for (int64_t b = 0; b < n; b++) want += brute(&p.args, cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]) * Hq;
        h_case("varlen %lld sequences, case %d", (long long)n, c);
        check_work(&p.args, want, D, Dv);
        p.args.lse.data = lse;
        h_problem_free(&p);
    }
}

/* A contiguous KV cache with new rows: counted at seqlens[b] + S_new keys per sequence;
 * neither fa_forward_work nor fa_forward_check touches the cache or o. */
static void test_cache(void)
{
    enum { B = 3, SMAX = 12, HK = 2, HQ = 4, D = 4 };
    for (int c = 0; c < h_scaled(100); c++) {
        const int64_t sq = h_rng_int(&g_rng, 1, 3), snew = h_rng_int(&g_rng, 0, 2);
        h_problem p;
        h_problem_alloc(&p, (h_dims){B, sq, snew, HQ, HK, D, D}, FA_DTYPE_F32, FA_DTYPE_F32);
        fa_tensor kc = h_alloc(FA_DTYPE_F32, B, SMAX, HK, D), vc = h_alloc(FA_DTYPE_F32, B, SMAX, HK, D);
        const size_t cache_bytes = (size_t)h_numel(&kc) * 4;
        memset(kc.data, 0x5a, cache_bytes);
        memset(vc.data, 0x5a, cache_bytes);
        int32_t seqlens[B];
        for (int b = 0; b < B; b++) seqlens[b] = (int32_t)h_rng_int(&g_rng, 0, SMAX - snew);
        fa_kv_cache cache = FA_KV_CACHE_INIT;
        cache.k = kc, cache.v = vc, cache.seqlens = seqlens;
        fa_forward_args *a = &p.args;
        a->kv_cache = &cache;
        void *knew = a->k.data, *vnew = a->v.data; /* given back for h_problem_free */
        if (snew == 0) a->k.data = a->v.data = NULL; /* no append */
        randomise_band(a, sq, SMAX);
        if (h_rng_int(&g_rng, 0, 1)) a->causal = FA_CAUSAL_BOTTOM_RIGHT; /* decoding's usual form */
        int64_t want = 0;
        for (int b = 0; b < B; b++) want += brute(a, sq, seqlens[b] + snew) * HQ;
        h_case("cache sq=%lld new=%lld case %d", (long long)sq, (long long)snew, c);
        h_poison_outputs(a);
        const size_t o_bytes = (size_t)h_numel(&a->o) * 4;
        unsigned char *o_before = malloc(o_bytes);
        memcpy(o_before, a->o.data, o_bytes);
        check_work(a, want, D, D);
        const fa_status st = fa_forward_check(g_ctx, a);
        CHECK(st == FA_OK, "fa_forward_check: %s: %s", fa_status_string(st), fa_context_error(g_ctx));
        int cache_same = 1;
        for (size_t k = 0; k < cache_bytes; k++)
            cache_same &= ((unsigned char *)kc.data)[k] == 0x5a && ((unsigned char *)vc.data)[k] == 0x5a;
        CHECK(cache_same, "checking or counting wrote to the cache");
        CHECK(memcmp(o_before, a->o.data, o_bytes) == 0, "checking or counting wrote to o");
        free(o_before);
        free(kc.data);
        free(vc.data);
        a->k.data = knew, a->v.data = vnew;
        h_problem_free(&p);
    }
}

/* The checks agree with the calls: a valid call passes and then runs; a bad one
 * fails with fa_forward's status and message, and nothing is written either way. */
static void test_check_agrees(void)
{
    const h_dims d = {2, 5, 6, 4, 2, 8, 8};
    h_problem p;
    h_problem_alloc(&p, d, FA_DTYPE_F32, FA_DTYPE_F32); /* zero inputs: only statuses are looked at */
    const size_t o_bytes = (size_t)h_numel(&p.args.o) * 4;
    unsigned char *before = malloc(o_bytes);

    h_case("valid forward");
    h_poison_outputs(&p.args);
    memcpy(before, p.args.o.data, o_bytes);
    fa_status st = fa_forward_check(g_ctx, &p.args);
    CHECK(st == FA_OK && fa_context_error(g_ctx)[0] == '\0', "status %s: %s", fa_status_string(st),
          fa_context_error(g_ctx));
    CHECK(memcmp(before, p.args.o.data, o_bytes) == 0, "fa_forward_check wrote to o");
    CHECK(fa_forward(g_ctx, &p.args) == FA_OK, "the call it passed fails: %s", fa_context_error(g_ctx));

    h_case("bad forward: window -2");
    fa_forward_args bad = p.args;
    bad.window_left = -2;
    st = fa_forward_check(g_ctx, &bad);
    char msg[320];
    snprintf(msg, sizeof msg, "%s", fa_context_error(g_ctx));
    const fa_status ran = fa_forward(g_ctx, &bad);
    CHECK(st == FA_ERR_INVALID_ARGUMENT && st == ran, "check %d, forward %d", (int)st, (int)ran);
    CHECK(strcmp(msg, fa_context_error(g_ctx)) == 0, "messages differ: \"%s\" vs \"%s\"", msg, fa_context_error(g_ctx));
    fa_work w = FA_WORK_INIT;
    CHECK(fa_forward_work(g_ctx, &bad, &w) == FA_ERR_INVALID_ARGUMENT && w.pairs == 0, "work of a bad call");

    h_case("varlen on standard: unsupported, as fa_forward");
    int32_t cu[2] = {0, 5}, cuk[2] = {0, 6};
    fa_forward_args vl = p.args;
    vl.q.shape[0] = vl.o.shape[0] = vl.k.shape[0] = vl.v.shape[0] = 1;
    vl.lse.data = NULL;
    vl.cu_seqlens_q = cu, vl.cu_seqlens_k = cuk, vl.num_seqs = 1;
    fa_context_set(g_ctx, FA_PARAM_ALGO, FA_ALGO_STANDARD);
    CHECK(fa_forward_check(g_ctx, &vl) == FA_ERR_UNSUPPORTED && fa_forward(g_ctx, &vl) == FA_ERR_UNSUPPORTED,
          "the algorithm's support is part of validity");
    fa_context_set(g_ctx, FA_PARAM_ALGO, FA_ALGO_AUTO);
    CHECK(fa_forward_check(g_ctx, &vl) == FA_OK, "auto runs it: %s", fa_context_error(g_ctx));

    h_case("backward check");
    CHECK(fa_forward(g_ctx, &p.args) == FA_OK, "forward: %s", fa_context_error(g_ctx));
    fa_tensor dout = h_alloc(FA_DTYPE_F32, d.B, d.Sq, d.Hq, d.Dv), dq = h_alloc(FA_DTYPE_F32, d.B, d.Sq, d.Hq, d.D);
    memset(dq.data, 0x5a, (size_t)h_numel(&dq) * 4);
    fa_backward_args g = FA_BACKWARD_ARGS_INIT;
    g.fwd = &p.args, g.do_ = dout, g.dq = dq;
    CHECK(fa_backward_check(g_ctx, &g) == FA_OK, "valid backward: %s", fa_context_error(g_ctx));
    fa_forward_args no_lse = p.args;
    no_lse.lse.data = NULL;
    g.fwd = &no_lse;
    st = fa_backward_check(g_ctx, &g);
    CHECK(st == FA_ERR_NULL_POINTER && st == fa_backward(g_ctx, &g), "no lse: check %d", (int)st);
    g.fwd = &bad;
    CHECK(fa_backward_check(g_ctx, &g) == FA_ERR_INVALID_ARGUMENT, "a bad fwd is the backward's failure");
    int same = 1;
    for (int64_t k = 0; k < h_numel(&dq) * 4; k++) same &= ((unsigned char *)dq.data)[k] == 0x5a;
    CHECK(same, "a backward check wrote to dq");
    CHECK(fa_forward_check(NULL, &p.args) == FA_ERR_NULL_CONTEXT && fa_backward_check(NULL, &g) == FA_ERR_NULL_CONTEXT,
          "NULL context");
    free(dout.data);
    free(dq.data);
    free(before);
    h_problem_free(&p);
}

/* fa_work grows like every struct of the library; fa_struct_read is that rule. */
static void test_struct_sizes(void)
{
    h_problem p;
    h_problem_alloc(&p, (h_dims){1, 4, 4, 1, 1, 2, 2}, FA_DTYPE_F32, FA_DTYPE_F32);
    p.args.causal = FA_CAUSAL_BOTTOM_RIGHT;

    h_case("fa_work: an older caller's");
    fa_work w = FA_WORK_INIT;
    w.struct_size = offsetof(fa_work, backward_flops);
    w.backward_flops = -1.0;
    CHECK(fa_forward_work(g_ctx, &p.args, &w) == FA_OK && w.pairs == 10 && w.flops == 80.0 && w.backward_flops == -1.0,
          "pairs %lld flops %g, backward_flops %g must stay", (long long)w.pairs, w.flops, w.backward_flops);
    w.struct_size = sizeof(size_t);
    CHECK(fa_forward_work(g_ctx, &p.args, &w) == FA_ERR_STRUCT_SIZE, "struct_size below pairs and flops");
    CHECK(fa_forward_work(g_ctx, &p.args, NULL) == FA_ERR_NULL_POINTER, "NULL out");

    h_case("fa_struct_read");
    typedef struct { size_t struct_size; int a, b; int64_t c; } s3;
    typedef struct { size_t struct_size; int a, b; int64_t c; int64_t later; } s4;
    s3 defaults = {sizeof(s3), 1, 2, 3}, dst = defaults;
    s3 old = {offsetof(s3, b), 7, 99, 99};
    CHECK(fa_struct_read(g_ctx, "s", &old, &dst, sizeof dst, offsetof(s3, b)) == FA_OK && dst.a == 7 && dst.b == 2 &&
              dst.c == 3 && dst.struct_size == sizeof(s3),
          "an older struct keeps the defaults of what it lacks");
    s4 newer = {sizeof(s4), 7, 8, 9, 0};
    dst = defaults;
    CHECK(fa_struct_read(g_ctx, "s", &newer, &dst, sizeof dst, offsetof(s3, b)) == FA_OK && dst.c == 9,
          "a newer struct whose extra fields are zero");
    newer.later = 1;
    CHECK(fa_struct_read(g_ctx, "s", &newer, &dst, sizeof dst, offsetof(s3, b)) == FA_ERR_STRUCT_SIZE &&
              fa_context_error(g_ctx)[0] != '\0',
          "a newer struct that sets a field this reader lacks");
    old.struct_size = sizeof(size_t);
    CHECK(fa_struct_read(NULL, "s", &old, &dst, sizeof dst, offsetof(s3, b)) == FA_ERR_STRUCT_SIZE, "below min_size");
    CHECK(fa_struct_read(g_ctx, "s", NULL, &dst, sizeof dst, 0) == FA_ERR_NULL_POINTER, "NULL struct");
    h_problem_free(&p);
}

int main(void)
{
    h_rng_seed(&g_rng, h_env_u64("FA_TEST_SEED", 19));
    h_case("setup");
    const fa_status created = h_context_create(&g_ctx);
    if (!CHECK(created == FA_OK && g_ctx, "fa_context_create: %s", fa_status_string(created))) return h_summary();
    test_dense();
    test_varlen();
    test_cache();
    test_check_agrees();
    test_struct_sizes();
    fa_context_free(g_ctx);
    return h_summary();
}
