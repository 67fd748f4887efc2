/*
 * test_positions.c: the position offsets q_start / k_start, and fa_kv_cache's
 * struct_size.
 *
 * Offsets: a full problem of lengths (Nq, Nk) is computed by the fp64 naive oracle
 * (tests/naive.c, which knows nothing of offsets). It is then cut into a shard of
 * query rows [qs, qs + n) and key chunks [ks, ks + m) that cover all keys; each
 * (query shard, key chunk) pair runs as its own call with offsets, on every
 * algorithm, and the chunks' (o, lse) are merged with fa_merge_states. The merged
 * rows must equal the oracle's rows of the full problem (causal both ways, windows,
 * ALiBi, none). This is what ring attention and chunked prefill rely on.
 *
 * The offsets the calls get follow the header's rule for a shard at global starts
 * (qs, ks): q_start - k_start = qs - ks for top-left alignment, and
 * qs - ks + (Nk - Nq) - (Sk - Sq) for bottom-right (causal, window, ALiBi), with
 * the same constant added to both so that neither is negative.
 */
#include "harness.h"
#include "naive.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MODE_NONE, MODE_CAUSAL_BR, MODE_CAUSAL_TL, MODE_WINDOW, MODE_ALIBI, MODE_COUNT };
static const char *mode_name[MODE_COUNT] = {"none", "causal-bottom-right", "causal-top-left", "window", "alibi"};

static fa_context *g_ctx;

/* A (1, rows, H, dim) view of rows r0 .. of a contiguous BSND tensor. */
static fa_tensor rows_of(const fa_tensor *t, int64_t r0, int64_t rows)
{
    fa_tensor v = *t;
    v.data = (char *)t->data + r0 * t->stride[1] * (int64_t)h_dtype_bytes(t->dtype);
    v.shape[1] = rows;
    return v;
}

static void set_mode(fa_forward_args *a, int mode, const float *slopes)
{
    a->causal = mode == MODE_CAUSAL_BR ? FA_CAUSAL_BOTTOM_RIGHT : mode == MODE_CAUSAL_TL ? FA_CAUSAL_TOP_LEFT
                                                                                          : FA_CAUSAL_NONE;
    a->window_left = mode == MODE_WINDOW ? 5 : FA_WINDOW_UNBOUNDED;
    a->window_right = mode == MODE_WINDOW ? 2 : FA_WINDOW_UNBOUNDED;
    a->alibi_slopes = mode == MODE_ALIBI ? slopes : NULL;
}

static void run_case(h_rng *r, int64_t Nq, int64_t Nk, int mode, fa_algo algo)
{
    const int64_t H = 2, Hk = 1, D = 8, Dv = 8;
    h_problem full;
    h_problem_alloc(&full, (h_dims){1, Nq, Nk, H, Hk, D, Dv}, FA_DTYPE_F32, FA_DTYPE_F32);
    h_fill_normal(&full.args.q, r, 1.0);
    h_fill_normal(&full.args.k, r, 1.0);
    h_fill_normal(&full.args.v, r, 1.0);
    const float slopes[2] = {0.25f, 0.0625f};
    set_mode(&full.args, mode, slopes);
    double *o_ref = malloc((size_t)(Nq * H * Dv) * sizeof *o_ref);
    double *lse_ref = malloc((size_t)(H * Nq) * sizeof *lse_ref);
    naive_forward(&full.args, NAIVE_FP64, o_ref, lse_ref, NULL);

    /* a query shard in the middle and key chunks of uneven lengths */
    const int64_t qs = Nq / 3, n = Nq - qs - Nq / 4 > 0 ? Nq - qs - Nq / 4 : 1;
    const int64_t cuts[4] = {0, Nk / 5, Nk / 2 + 1, Nk};
    fa_tensor o_parts[3], lse_parts[3];
    int nparts = 0;
    for (int c = 0; c < 3; c++) {
        const int64_t ks = cuts[c], m = cuts[c + 1] - cuts[c];
        if (m <= 0) continue;
        fa_forward_args a = full.args;
        a.q = rows_of(&full.args.q, qs, n);
        a.k = rows_of(&full.args.k, ks, m);
        a.v = rows_of(&full.args.v, ks, m);
        o_parts[nparts] = h_alloc(FA_DTYPE_F32, 1, n, H, Dv);
        lse_parts[nparts] = h_alloc(FA_DTYPE_F32, 1, H, n, 1);
        a.o = o_parts[nparts];
        a.lse = lse_parts[nparts];
        int64_t delta = qs - ks;
        if (mode != MODE_CAUSAL_TL) delta += (Nk - Nq) - (m - n);
        a.q_start = delta > 0 ? delta : 0;
        a.k_start = delta > 0 ? 0 : -delta;
        h_case("positions: %s Nq=%lld Nk=%lld shard rows %lld+%lld keys %lld+%lld algo=%s", mode_name[mode],
               (long long)Nq, (long long)Nk, (long long)qs, (long long)n, (long long)ks, (long long)m,
               h_algo_str(algo));
        const fa_status st = h_run(g_ctx, algo, 2, &a);
        CHECK(st == FA_OK, "status %s: %s", fa_status_string(st), fa_context_error(g_ctx));
        nparts++;
    }
    fa_tensor o = h_alloc(FA_DTYPE_F32, 1, n, H, Dv), lse = h_alloc(FA_DTYPE_F32, 1, H, n, 1);
    fa_context_set(g_ctx, FA_PARAM_ALGO, FA_ALGO_AUTO);
    const fa_status st = fa_merge_states(g_ctx, nparts, o_parts, lse_parts, &o, &lse);
    CHECK(st == FA_OK, "merge: %s", fa_context_error(g_ctx));
    double worst = 0.0, worst_lse = 0.0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < H; h++) {
            const double lr = lse_ref[h * Nq + qs + i], lg = h_get(&lse, 0, h, i, 0);
            if (isinf(lr) || isinf(lg)) {
                CHECK(lr == lg, "row %lld head %lld: lse %g, want %g", (long long)i, (long long)h, lg, lr);
            } else if (fabs(lg - lr) > worst_lse) {
                worst_lse = fabs(lg - lr);
            }
            for (int64_t e = 0; e < Dv; e++) {
                const double err = fabs(h_get(&o, 0, i, h, e) - o_ref[((qs + i) * H + h) * Dv + e]);
                if (err > worst) worst = err;
            }
        }
    /* f32 tiles merged in double: a few ulps of |o| <= a few (unit-normal v) */
    CHECK(worst <= 1e-5, "max |o - o_ref| = %g over the shard", worst);
    CHECK(worst_lse <= 1e-5, "max |lse - lse_ref| = %g over the shard", worst_lse);
    for (int c = 0; c < nparts; c++) free(o_parts[c].data), free(lse_parts[c].data);
    free(o.data), free(lse.data), free(o_ref), free(lse_ref);
    h_problem_free(&full);
}

/* Positions outside [0, 2^60] are refused, and so are q_start + Sq beyond it. */
static void test_position_bounds(void)
{
    h_problem p;
    h_problem_alloc(&p, (h_dims){1, 4, 4, 1, 1, 8, 8}, FA_DTYPE_F32, FA_DTYPE_F32);
    const struct { int64_t qs, ks; fa_status want; } cases[] = {
        {-1, 0, FA_ERR_INVALID_ARGUMENT},
        {0, -5, FA_ERR_INVALID_ARGUMENT},
        {INT64_MAX, 0, FA_ERR_INVALID_ARGUMENT},
        {FA_POSITION_MAX, 0, FA_ERR_OVERFLOW}, /* the last query row would lie beyond 2^60 */
        {FA_POSITION_MAX - 4, FA_POSITION_MAX - 4, FA_OK},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fa_forward_args a = p.args;
        a.q_start = cases[c].qs;
        a.k_start = cases[c].ks;
        h_case("positions (%lld, %lld)", (long long)cases[c].qs, (long long)cases[c].ks);
        h_poison_outputs(&a);
        const fa_status st = h_run(g_ctx, FA_ALGO_FLASH, 1, &a);
        CHECK(st == cases[c].want, "status %s, want %s", fa_status_string(st), fa_status_string(cases[c].want));
    }
    h_problem_free(&p);
}

/* fa_kv_cache.struct_size: the library refuses sizes it cannot read, and accepts a
 * newer caller's larger struct when its extra bytes are zero. */
static void test_cache_struct_size(void)
{
    const int64_t B = 1, S = 8, H = 1, D = 8;
    h_problem p;
    h_problem_alloc(&p, (h_dims){B, 1, S, H, H, D, D}, FA_DTYPE_F32, FA_DTYPE_F32);
    fa_tensor kc = h_alloc(FA_DTYPE_F32, B, S, H, D), vc = h_alloc(FA_DTYPE_F32, B, S, H, D);
    h_rng r;
    h_rng_seed(&r, 7);
    h_fill_normal(&kc, &r, 1.0);
    h_fill_normal(&vc, &r, 1.0);
    h_fill_normal(&p.args.q, &r, 1.0);
    const int32_t seqlens[1] = {5};
    /* room for a newer, larger struct */
    union { fa_kv_cache c; unsigned char bytes[sizeof(fa_kv_cache) + 32]; } u;
    const struct { size_t size; int tail_byte; fa_status want; } cases[] = {
        {0, 0, FA_ERR_STRUCT_SIZE},
        {sizeof(size_t), 0, FA_ERR_STRUCT_SIZE},
        {offsetof(fa_kv_cache, max_pages) + 4, 0, FA_ERR_STRUCT_SIZE}, /* max_pages cut: required */
        {offsetof(fa_kv_cache, v_in_k), 0, FA_OK},                     /* a caller from before v_in_k */
        {offsetof(fa_kv_cache, leftpad), 0, FA_OK},                    /* a caller from before leftpad */
        {sizeof(fa_kv_cache) + 32, 1, FA_ERR_STRUCT_SIZE},
        {sizeof(fa_kv_cache) + 32, 0, FA_OK},
        {sizeof(fa_kv_cache), 0, FA_OK},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memset(&u, 0, sizeof u);
        fa_kv_cache_init(&u.c);
        u.c.k = kc;
        u.c.v = vc;
        u.c.seqlens = seqlens;
        u.c.struct_size = cases[c].size;
        if (cases[c].tail_byte) u.bytes[sizeof(fa_kv_cache) + 5] = 1;
        fa_forward_args a = p.args;
        a.k.data = a.v.data = NULL; /* no new rows */
        a.kv_cache = &u.c;
        h_case("kv_cache struct_size %zu (tail %d)", cases[c].size, cases[c].tail_byte);
        h_poison_outputs(&a);
        unsigned char before[8 * 4];
        memcpy(before, a.o.data, sizeof before);
        const fa_status st = h_run(g_ctx, FA_ALGO_AUTO, 1, &a);
        CHECK(st == cases[c].want, "status %s, want %s (%s)", fa_status_string(st), fa_status_string(cases[c].want),
              fa_context_error(g_ctx));
        if (st != FA_OK) CHECK(memcmp(before, a.o.data, sizeof before) == 0, "a refused call wrote o");
    }
    free(kc.data), free(vc.data);
    h_problem_free(&p);
}

int main(void)
{
    if (h_context_create(&g_ctx) != FA_OK) return 1;
    h_rng r;
    h_rng_seed(&r, h_env_u64("FA_TEST_SEED", 20261201));
    const int64_t lens[][2] = {{37, 37}, {23, 41}, {41, 23}, {64, 200}, {130, 130}};
    const fa_algo algos[] = {FA_ALGO_FLASH, FA_ALGO_STANDARD, FA_ALGO_REFERENCE};
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
        for (int mode = 0; mode < MODE_COUNT; mode++)
            for (size_t a = 0; a < sizeof algos / sizeof algos[0]; a++) run_case(&r, lens[l][0], lens[l][1], mode, algos[a]);
    test_position_bounds();
    test_cache_struct_size();
    fa_context_free(g_ctx);
    return h_summary();
}
