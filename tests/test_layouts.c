/*
 * test_layouts.c: memory layout is only addressing. The named layouts (BSND, BNSD,
 * BSH, SBH via fa_tensor_make), mixed layouts, strided views with padding on every axis,
 * permuted axis orders, negative strides, a non-unit innermost stride and stride-0
 * broadcasts must all give results bitwise identical to the contiguous BSND call with the
 * same algorithm and thread count. Padding in input buffers holds NaN (a stray read
 * poisons the result); padding in o and lse buffers holds a sentinel byte pattern that
 * must survive the call.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static const fa_algo ALGOS[] = {FA_ALGO_FLASH, FA_ALGO_STANDARD, FA_ALGO_REFERENCE};
static const fa_dtype DTYPES[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
enum { THREADS = 2, OUT_SENTINEL = 0x5a };

static fa_context *g_ctx;
static h_rng g_rng;

/* ------------------------------------------------------------- strided views */

typedef struct view_spec {
    int order[4];   /* logical axes from outermost to innermost in memory */
    int64_t pad[4]; /* extra extent per logical axis; pad > 0 also leaves one leading element */
    int negate[4];  /* walk this logical axis backwards */
    int64_t step;   /* stride of the innermost memory axis */
} view_spec;

typedef struct view {
    fa_tensor t;
    unsigned char *base; /* the whole allocation */
    int64_t nelem;
    int64_t origin; /* element offset of t.data in base */
} view;

static view view_make(fa_dtype dt, const int64_t shape[4], const view_spec *vs) {
    view w;
    memset(&w, 0, sizeof w);
    int64_t ext[4], stride[4];
    for (int a = 0; a < 4; a++) ext[a] = shape[a] + vs->pad[a];
    int64_t s = vs->step;
    for (int k = 3; k >= 0; k--) {
        stride[vs->order[k]] = s;
        s *= ext[vs->order[k]];
    }
    w.nelem = s;
    for (int a = 0; a < 4; a++)
        if (vs->pad[a] > 0) w.origin += stride[a];
    for (int a = 0; a < 4; a++)
        if (vs->negate[a]) {
            w.origin += (shape[a] - 1) * stride[a];
            stride[a] = -stride[a];
        }
    const size_t es = h_dtype_bytes(dt);
    w.base = malloc((size_t)w.nelem * es);
    if (!w.base) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    w.t.data = w.base + w.origin * (int64_t)es;
    w.t.dtype = dt;
    for (int a = 0; a < 4; a++) w.t.shape[a] = shape[a], w.t.stride[a] = stride[a];
    return w;
}

/* Inputs: every element NaN (bool: false) first, then the logical contents of src. */
static view view_input(const fa_tensor *src, const view_spec *vs) {
    view w = view_make(src->dtype, src->shape, vs);
    const size_t es = h_dtype_bytes(src->dtype);
    for (int64_t e = 0; e < w.nelem; e++) h_store_nan(w.base + e * (int64_t)es, src->dtype);
    h_copy(&w.t, src);
    return w;
}

/* Outputs: every byte the sentinel. */
static view view_output(fa_dtype dt, const int64_t shape[4], const view_spec *vs) {
    view w = view_make(dt, shape, vs);
    memset(w.base, OUT_SENTINEL, (size_t)w.nelem * h_dtype_bytes(dt));
    return w;
}

/* Counts bytes outside the view that lost the sentinel. */
static int64_t gaps_touched(const view *w) {
    const size_t es = h_dtype_bytes(w->t.dtype);
    unsigned char *covered = calloc((size_t)w->nelem, 1);
    const fa_tensor *t = &w->t;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t d = 0; d < t->shape[3]; d++) covered[w->origin + h_offset(t, a, b, c, d)] = 1;
    int64_t bad = 0;
    for (int64_t e = 0; e < w->nelem; e++) {
        if (covered[e]) continue;
        for (size_t k = 0; k < es; k++) bad += w->base[e * (int64_t)es + (int64_t)k] != OUT_SENTINEL;
    }
    free(covered);
    return bad;
}

/* Logical elements of a and b (same shape and dtype) whose bits differ; first one in *at. */
static int64_t bit_diffs(const fa_tensor *a, const fa_tensor *b, int64_t at[4]) {
    int64_t n = 0;
    for (int64_t i0 = 0; i0 < a->shape[0]; i0++)
        for (int64_t i1 = 0; i1 < a->shape[1]; i1++)
            for (int64_t i2 = 0; i2 < a->shape[2]; i2++)
                for (int64_t i3 = 0; i3 < a->shape[3]; i3++)
                    if (h_bits(a, i0, i1, i2, i3) != h_bits(b, i0, i1, i2, i3) && n++ == 0)
                        at[0] = i0, at[1] = i1, at[2] = i2, at[3] = i3;
    return n;
}

/* ---------------------------------------------------------------- the cases */

typedef struct base_problem {
    h_problem p; /* contiguous BSND inputs and outputs */
    fa_tensor bias, mask;
} base_problem;

static void base_make(base_problem *bp, h_dims d, fa_dtype dt, int features) {
    memset(bp, 0, sizeof *bp);
    h_problem_alloc(&bp->p, d, dt, dt);
    fa_forward_args *a = &bp->p.args;
    h_fill_normal(&a->q, &g_rng, 1.0);
    h_fill_normal(&a->k, &g_rng, 1.0);
    h_fill_normal(&a->v, &g_rng, 1.0);
    if (features) {
        a->causal = FA_CAUSAL_BOTTOM_RIGHT;
        a->softcap = 7.0f;
        bp->bias = h_alloc(FA_DTYPE_F32, d.B, 1, d.Sq, d.Sk);
        h_fill_normal(&bp->bias, &g_rng, 1.0);
        bp->mask = h_alloc(FA_DTYPE_BOOL, 1, 1, d.Sq, d.Sk);
        for (int64_t e = 0; e < h_numel(&bp->mask); e++)
            ((unsigned char *)bp->mask.data)[e] = h_rng_uniform(&g_rng) < 0.8;
        a->bias = bp->bias;
        a->mask = bp->mask;
    }
}

static void base_free(base_problem *bp) {
    free(bp->bias.data);
    free(bp->mask.data);
    h_problem_free(&bp->p);
}

/* Runs args and compares o and lse with the base run's, bitwise. */
static void run_compare(const char *what, fa_algo algo, const fa_forward_args *args,
                        const fa_tensor *base_o, const fa_tensor *base_lse) {
    fa_status st = h_run(g_ctx, algo, THREADS, args);
    if (!CHECK(st == FA_OK, "%s: status %d (%s): %s", what, (int)st, fa_status_string(st),
               fa_context_error(g_ctx)))
        return;
    int64_t at[4] = {0, 0, 0, 0};
    int64_t n = bit_diffs(&args->o, base_o, at);
    CHECK(n == 0, "%s: o differs from contiguous BSND in %lld elements, first (%lld,%lld,%lld,%lld): %.9g vs %.9g",
          what, (long long)n, (long long)at[0], (long long)at[1], (long long)at[2], (long long)at[3],
          h_get(&args->o, at[0], at[1], at[2], at[3]), h_get(base_o, at[0], at[1], at[2], at[3]));
    if (args->lse.data) {
        n = bit_diffs(&args->lse, base_lse, at);
        CHECK(n == 0, "%s: lse differs from contiguous in %lld rows, first (%lld,%lld,%lld): %.9g vs %.9g",
              what, (long long)n, (long long)at[0], (long long)at[1], (long long)at[2],
              h_get(&args->lse, at[0], at[1], at[2], 0), h_get(base_lse, at[0], at[1], at[2], 0));
    }
}

/* A fa_tensor_make copy of src in `layout`, in a fresh exact-size buffer. */
static fa_tensor layout_copy(const fa_tensor *src, fa_layout layout) {
    void *buf = calloc((size_t)h_numel(src), h_dtype_bytes(src->dtype));
    fa_tensor t = fa_tensor_make(buf, src->dtype, layout, src->shape[0], src->shape[1], src->shape[2],
                                 src->shape[3]);
    h_copy(&t, src);
    return t;
}

static const char *LAYOUT_NAMES[] = {"BSND", "BNSD", "BSH", "SBH"};

static void test_named_layouts(base_problem *bp, fa_algo algo, const fa_tensor *base_o,
                               const fa_tensor *base_lse) {
    /* each tensor in the named layout, then a mix of all four */
    const fa_layout mixes[5][4] = {
        {FA_LAYOUT_BNSD, FA_LAYOUT_BNSD, FA_LAYOUT_BNSD, FA_LAYOUT_BNSD},
        {FA_LAYOUT_BSH, FA_LAYOUT_BSH, FA_LAYOUT_BSH, FA_LAYOUT_BSH},
        {FA_LAYOUT_SBH, FA_LAYOUT_SBH, FA_LAYOUT_SBH, FA_LAYOUT_SBH},
        {FA_LAYOUT_BNSD, FA_LAYOUT_SBH, FA_LAYOUT_BSND, FA_LAYOUT_SBH},
        {FA_LAYOUT_SBH, FA_LAYOUT_BNSD, FA_LAYOUT_SBH, FA_LAYOUT_BNSD},
    };
    for (int m = 0; m < 5; m++) {
        fa_forward_args a = bp->p.args;
        a.q = layout_copy(&bp->p.args.q, mixes[m][0]);
        a.k = layout_copy(&bp->p.args.k, mixes[m][1]);
        a.v = layout_copy(&bp->p.args.v, mixes[m][2]);
        a.o = layout_copy(&bp->p.args.o, mixes[m][3]);
        h_fill(&a.o, 777.0);
        char what[96];
        snprintf(what, sizeof what, "layouts q=%s k=%s v=%s o=%s", LAYOUT_NAMES[mixes[m][0]],
                 LAYOUT_NAMES[mixes[m][1]], LAYOUT_NAMES[mixes[m][2]], LAYOUT_NAMES[mixes[m][3]]);
        run_compare(what, algo, &a, base_o, base_lse);
        free(a.q.data), free(a.k.data), free(a.v.data), free(a.o.data);
    }
}

static const view_spec SPEC_A = {{2, 0, 1, 3}, {1, 2, 1, 3}, {0, 1, 0, 0}, 1};
static const view_spec SPEC_B = {{1, 2, 0, 3}, {2, 1, 1, 1}, {0, 0, 0, 1}, 2};
static const view_spec SPEC_C = {{3, 1, 0, 2}, {0, 1, 0, 1}, {1, 0, 1, 0}, 3};
static const view_spec SPEC_D = {{0, 1, 2, 3}, {1, 1, 1, 1}, {1, 1, 1, 1}, 1};
static const view_spec SPEC_LSE = {{2, 1, 0, 3}, {1, 1, 2, 0}, {0, 0, 1, 0}, 2};
static const view_spec SPEC_BIAS = {{3, 2, 1, 0}, {1, 0, 1, 2}, {0, 0, 0, 1}, 1};
static const view_spec SPEC_MASK = {{0, 1, 3, 2}, {0, 0, 1, 1}, {0, 0, 1, 0}, 1};

static void test_strided(base_problem *bp, fa_algo algo, const fa_tensor *base_o,
                         const fa_tensor *base_lse) {
    const view_spec *specs[4] = {&SPEC_A, &SPEC_B, &SPEC_C, &SPEC_D};
    for (int rot = 0; rot < 4; rot++) {
        const fa_forward_args *b = &bp->p.args;
        fa_forward_args a = *b;
        view q = view_input(&b->q, specs[rot % 4]);
        view k = view_input(&b->k, specs[(rot + 1) % 4]);
        view v = view_input(&b->v, specs[(rot + 2) % 4]);
        view o = view_output(b->o.dtype, b->o.shape, specs[(rot + 3) % 4]);
        view lse = view_output(FA_DTYPE_F32, b->lse.shape, &SPEC_LSE);
        view bias, mask;
        memset(&bias, 0, sizeof bias);
        memset(&mask, 0, sizeof mask);
        a.q = q.t, a.k = k.t, a.v = v.t, a.o = o.t, a.lse = lse.t;
        if (b->bias.data) {
            bias = view_input(&b->bias, &SPEC_BIAS);
            a.bias = bias.t;
        }
        if (b->mask.data) {
            mask = view_input(&b->mask, &SPEC_MASK);
            a.mask = mask.t;
        }
        char what[64];
        snprintf(what, sizeof what, "strided views, rotation %d", rot);
        run_compare(what, algo, &a, base_o, base_lse);
        int64_t bad = gaps_touched(&o);
        CHECK(bad == 0, "%s: %lld bytes of o's padding were overwritten", what, (long long)bad);
        bad = gaps_touched(&lse);
        CHECK(bad == 0, "%s: %lld bytes of lse's padding were overwritten", what, (long long)bad);
        free(q.base), free(k.base), free(v.base), free(o.base), free(lse.base);
        free(bias.base), free(mask.base);
    }
}

/* Broadcast by stride 0 instead of size 1: bias and mask given at full (B, Hq, Sq, Sk). */
static void test_stride0_broadcast(base_problem *bp, fa_algo algo, const fa_tensor *base_o,
                                   const fa_tensor *base_lse) {
    if (!bp->bias.data) return;
    fa_forward_args a = bp->p.args;
    const h_dims *d = &bp->p.dims;
    a.bias.shape[1] = d->Hq;
    a.bias.stride[1] = 0;
    a.mask.shape[0] = d->B, a.mask.stride[0] = 0;
    a.mask.shape[1] = d->Hq, a.mask.stride[1] = 0;
    run_compare("bias/mask broadcast by stride 0", algo, &a, base_o, base_lse);
}

/* k and v shared across the batch by a stride-0 batch axis equal duplicated data. */
static void test_kv_batch_stride0(fa_dtype dt, fa_algo algo) {
    const h_dims d = {3, 9, 14, 2, 1, 16, 8};
    h_problem p;
    h_problem_alloc(&p, d, dt, dt);
    h_fill_normal(&p.args.q, &g_rng, 1.0);
    fa_tensor k1 = h_alloc(dt, 1, d.Sk, d.Hk, d.D), v1 = h_alloc(dt, 1, d.Sk, d.Hk, d.Dv);
    h_fill_normal(&k1, &g_rng, 1.0);
    h_fill_normal(&v1, &g_rng, 1.0);
    for (int64_t b = 0; b < d.B; b++)
        for (int64_t j = 0; j < d.Sk; j++) {
            for (int64_t c = 0; c < d.D; c++) h_set(&p.args.k, b, j, 0, c, h_get(&k1, 0, j, 0, c));
            for (int64_t c = 0; c < d.Dv; c++) h_set(&p.args.v, b, j, 0, c, h_get(&v1, 0, j, 0, c));
        }
    fa_status st = h_run(g_ctx, algo, THREADS, &p.args);
    if (CHECK(st == FA_OK, "status %d: %s", (int)st, fa_context_error(g_ctx))) {
        fa_forward_args a = p.args;
        a.k = k1, a.v = v1;
        a.k.shape[0] = a.v.shape[0] = d.B;
        a.k.stride[0] = a.v.stride[0] = 0;
        a.o = h_alloc(dt, d.B, d.Sq, d.Hq, d.Dv);
        a.lse = h_alloc(FA_DTYPE_F32, d.B, d.Hq, d.Sq, 1);
        run_compare("k, v batch stride 0", algo, &a, &p.args.o, &p.args.lse);
        free(a.o.data), free(a.lse.data);
    }
    free(k1.data), free(v1.data);
    h_problem_free(&p);
}

/* fa_tensor_make and fa_tensor_contiguous give the documented strides. */
static void test_make_strides(void) {
    int dummy;
    const int64_t B = 2, S = 3, N = 5, D = 7;
    struct {
        fa_layout layout;
        int64_t stride[4];
    } want[4] = {
        {FA_LAYOUT_BSND, {S * N * D, N * D, D, 1}},
        {FA_LAYOUT_BNSD, {N * S * D, D, S * D, 1}},
        {FA_LAYOUT_BSH, {S * N * D, N * D, D, 1}},
        {FA_LAYOUT_SBH, {N * D, B * N * D, D, 1}},
    };
    h_case("fa_tensor_make strides");
    for (int l = 0; l < 4; l++) {
        fa_tensor t = fa_tensor_make(&dummy, FA_DTYPE_F16, want[l].layout, B, S, N, D);
        int ok = t.data == (void *)&dummy && t.dtype == FA_DTYPE_F16 && t.shape[0] == B &&
                 t.shape[1] == S && t.shape[2] == N && t.shape[3] == D;
        for (int a = 0; a < 4; a++) ok = ok && t.stride[a] == want[l].stride[a];
        CHECK(ok, "%s: got shape (%lld,%lld,%lld,%lld) strides (%lld,%lld,%lld,%lld)", LAYOUT_NAMES[l],
              (long long)t.shape[0], (long long)t.shape[1], (long long)t.shape[2], (long long)t.shape[3],
              (long long)t.stride[0], (long long)t.stride[1], (long long)t.stride[2], (long long)t.stride[3]);
    }
    fa_tensor c = fa_tensor_contiguous(&dummy, FA_DTYPE_F32, 2, 3, 5, 7);
    CHECK(c.data == (void *)&dummy && c.dtype == FA_DTYPE_F32 && c.shape[0] == 2 && c.shape[3] == 7 &&
              c.stride[0] == 105 && c.stride[1] == 35 && c.stride[2] == 7 && c.stride[3] == 1,
          "fa_tensor_contiguous: strides (%lld,%lld,%lld,%lld)", (long long)c.stride[0],
          (long long)c.stride[1], (long long)c.stride[2], (long long)c.stride[3]);
}

/*
 * One base configuration: the contiguous BSND call, then every layout variant of it
 * with the same algorithm, threads and tiles, compared bit for bit.
 */
static void run_configuration(const h_dims *shape, fa_dtype dt, int features, const int64_t tiles[2],
                              fa_algo algo) {
    base_problem bp;
    base_make(&bp, *shape, dt, features);
    h_case("%s dtype=%s algo=%s threads=%d tiles=%lldx%lld features=%s", h_dims_str(shape), h_dtype_str(dt),
           h_algo_str(algo), THREADS, (long long)tiles[0], (long long)tiles[1],
           features ? "causal BR, softcap 7, bias (B,1,Sq,Sk), mask (1,1,Sq,Sk)" : "none");
    fa_status st = h_set_tiles(g_ctx, tiles[0], tiles[1]);
    if (st == FA_OK) st = h_run(g_ctx, algo, THREADS, &bp.p.args);
    if (CHECK(st == FA_OK, "contiguous BSND: status %d (%s): %s", (int)st, fa_status_string(st),
              fa_context_error(g_ctx))) {
        /* keep the base results aside: the variants reuse bp's inputs and lse */
        fa_tensor base_o = h_alloc(dt, shape->B, shape->Sq, shape->Hq, shape->Dv);
        fa_tensor base_lse = h_alloc(FA_DTYPE_F32, shape->B, shape->Hq, shape->Sq, 1);
        h_copy(&base_o, &bp.p.args.o);
        h_copy(&base_lse, &bp.p.args.lse);
        test_named_layouts(&bp, algo, &base_o, &base_lse);
        test_strided(&bp, algo, &base_o, &base_lse);
        test_stride0_broadcast(&bp, algo, &base_o, &base_lse);
        free(base_o.data), free(base_lse.data);
    }
    base_free(&bp);
}

int main(void) {
    h_rng_seed(&g_rng, h_env_u64("FA_TEST_SEED", 777));
    fa_status st = h_context_create(&g_ctx);
    h_case("fa_context_create");
    if (!CHECK(st == FA_OK && g_ctx, "status %d (%s)", (int)st, fa_status_string(st))) return h_summary();
    test_make_strides();

    const h_dims shapes[2] = {{2, 13, 19, 4, 2, 40, 24}, {1, 70, 33, 3, 1, 64, 64}};
    /* planned flash tiles, and small ones so that strided rows span several tiles */
    static const int64_t tiles[2][2] = {{0, 0}, {8, 6}};
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < 3; t++)
            for (size_t al = 0; al < sizeof ALGOS / sizeof ALGOS[0]; al++) {
                run_configuration(&shapes[s], DTYPES[t], s == 0, tiles[0], ALGOS[al]);
                if (ALGOS[al] == FA_ALGO_FLASH) run_configuration(&shapes[s], DTYPES[t], s == 0, tiles[1], ALGOS[al]);
                h_set_tiles(g_ctx, 0, 0);
                h_case("k/v batch stride 0: dtype=%s algo=%s threads=%d", h_dtype_str(DTYPES[t]),
                       h_algo_str(ALGOS[al]), THREADS);
                if (s == 0) test_kv_batch_stride0(DTYPES[t], ALGOS[al]);
            }
    fa_context_free(g_ctx);
    return h_summary();
}
