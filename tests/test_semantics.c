/*
 * test_semantics.c: known-answer tests. Every expected value here comes from the
 * contract in docs/semantics.md worked out by hand or in closed form, never from an
 * implementation, and every case runs on all three algorithms (reference, flash,
 * standard) and on f32, f16, bf16 inputs with the output in the input dtype or f32.
 *
 * The main trick: q = 0 makes every score 0 (whatever k is), so each row's softmax is
 * uniform over its kept columns; with V = identity (Dv = Sk) row i of O *is* that
 * distribution: 1/|kept(i)| at kept columns, 0 elsewhere, and lse_i = log|kept(i)|.
 * That pins down causal alignment, windows and mask broadcasting exactly. Adding
 * known scores (ALiBi, bias, chosen q and k) turns the rows into closed-form softmaxes.
 *
 * FA_TEST_SEED changes the random k, masks and biases (the answers must not change).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef struct dtype_cfg {
    fa_dtype in, out;
} dtype_cfg;

static const dtype_cfg CFGS[] = {
    {FA_DTYPE_F32, FA_DTYPE_F32}, {FA_DTYPE_F16, FA_DTYPE_F16}, {FA_DTYPE_BF16, FA_DTYPE_BF16},
    {FA_DTYPE_F16, FA_DTYPE_F32}, {FA_DTYPE_BF16, FA_DTYPE_F32},
};
enum { NCFG = sizeof CFGS / sizeof CFGS[0] };


static fa_context *g_ctx;
static h_rng g_rng;
static int64_t g_run_counter;

/* Expected outputs of one problem: o (B, Sq, Hq, Dv) and lse (B, Hq, Sq), in double. */
typedef struct expected {
    double *o;
    double *lse;
} expected;

static expected expected_alloc(const h_dims *d) {
    expected e;
    e.o = calloc((size_t)(d->B * d->Sq * d->Hq * d->Dv), sizeof(double));
    e.lse = calloc((size_t)(d->B * d->Hq * d->Sq), sizeof(double));
    if (!e.o || !e.lse) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return e;
}

static void expected_free(expected *e) {
    free(e->o);
    free(e->lse);
}

static double *exp_o(const expected *e, const h_dims *d, int64_t b, int64_t i, int64_t h) {
    return e->o + ((b * d->Sq + i) * d->Hq + h) * d->Dv;
}

static double *exp_lse(const expected *e, const h_dims *d, int64_t b, int64_t h, int64_t i) {
    return e->lse + (b * d->Hq + h) * d->Sq + i;
}

/*
 * Compares p's outputs with the expectation. An expected NaN demands NaN; an expected
 * lse of -inf demands -inf and an o row of exact zeros; everything else is within the
 * known-answer tolerance of its dtype.
 */
static void compare(const h_problem *p, const expected *e) {
    const h_dims *d = &p->dims;
    const double tol = h_ka_tol(p->dtype, p->out_dtype), ltol = h_ka_lse_tol(p->dtype);
    int64_t nbad = 0, fb = 0, fi = 0, fh = 0, fc = 0;
    double fgot = 0, fexp = 0;
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t i = 0; i < d->Sq; i++)
            for (int64_t h = 0; h < d->Hq; h++) {
                const double l = *exp_lse(e, d, b, h, i);
                const int empty = isinf(l) && l < 0;
                for (int64_t c = 0; c < d->Dv; c++) {
                    const double want = exp_o(e, d, b, i, h)[c];
                    const double got = h_get(&p->args.o, b, i, h, c);
                    int ok;
                    if (isnan(want)) ok = isnan(got);
                    else if (empty) ok = got == 0.0;
                    else ok = fabs(got - want) <= tol * fmax(1.0, fabs(want));
                    if (!ok && nbad++ == 0) fb = b, fi = i, fh = h, fc = c, fgot = got, fexp = want;
                }
            }
    CHECK(nbad == 0,
          "o: %lld bad elements; first at (b=%lld, i=%lld, h=%lld, d=%lld): got %.9g, expected "
          "%.9g, tol %.3g relative",
          (long long)nbad, (long long)fb, (long long)fi, (long long)fh, (long long)fc, fgot, fexp,
          tol);

    nbad = 0;
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t h = 0; h < d->Hq; h++)
            for (int64_t i = 0; i < d->Sq; i++) {
                const double want = *exp_lse(e, d, b, h, i);
                const double got = h_get(&p->args.lse, b, h, i, 0);
                int ok;
                if (isnan(want)) ok = isnan(got);
                else if (isinf(want)) ok = got == want;
                else ok = fabs(got - want) <= ltol * fmax(1.0, fabs(want));
                if (!ok && nbad++ == 0) fb = b, fh = h, fi = i, fgot = got, fexp = want;
            }
    CHECK(nbad == 0,
          "lse: %lld bad rows; first at (b=%lld, h=%lld, i=%lld): got %.9g, expected %.9g, tol "
          "%.3g relative",
          (long long)nbad, (long long)fb, (long long)fh, (long long)fi, fgot, fexp, ltol);
}

/*
 * Runs p on every algorithm (threads cycling 1, 2, 3) and compares with e. Flash runs
 * twice: with planned tiles, and with forced small tiles (cycling through a few sizes,
 * odd ones included) so that short rows still cross K/V tile boundaries and exercise
 * the online rescaling.
 */
static const int64_t SMALL_TILES[][2] = {{16, 16}, {5, 3}, {1, 7}, {32, 64}};
enum { NSMALL = sizeof SMALL_TILES / sizeof SMALL_TILES[0] };

/*
 * The reference algorithm uses no micro-kernels, so only one run of the ISA matrix needs
 * to check it: the ref path's, or a run with no FLASHATTN_ARCH at all (set in main). On
 * the other paths it would be half of this program's time for nothing new.
 */
static int g_check_reference = 1;

static void check_all_algos(h_problem *p, const expected *e, const char *name) {
    const fa_algo runs[] = {FA_ALGO_REFERENCE, FA_ALGO_FLASH, FA_ALGO_FLASH, FA_ALGO_STANDARD};
    for (size_t a = g_check_reference ? 0 : 1; a < sizeof runs / sizeof runs[0]; a++) {
        const int64_t threads = 1 + (g_run_counter++ % 3);
        const int64_t *tiles = a == 2 ? SMALL_TILES[g_run_counter % NSMALL] : (const int64_t[2]){0, 0};
        h_case("%s: %s in=%s out=%s algo=%s threads=%lld tiles=%lldx%lld causal=%d window=(%lld,%lld) "
               "scale=%g softcap=%g%s%s%s",
               name, h_dims_str(&p->dims), h_dtype_str(p->dtype), h_dtype_str(p->out_dtype),
               h_algo_str(runs[a]), (long long)threads, (long long)tiles[0], (long long)tiles[1],
               (int)p->args.causal, (long long)p->args.window_left, (long long)p->args.window_right,
               (double)p->args.scale, (double)p->args.softcap, p->args.mask.data ? " mask" : "",
               p->args.bias.data ? " bias" : "", p->args.alibi_slopes ? " alibi" : "");
        h_poison_outputs(&p->args);
        fa_status st = h_set_tiles(g_ctx, tiles[0], tiles[1]);
        if (st == FA_OK) st = h_run(g_ctx, runs[a], threads, &p->args);
        if (!CHECK(st == FA_OK, "status %d (%s): %s", (int)st, fa_status_string(st),
                   fa_context_error(g_ctx)))
            continue;
        compare(p, e);
    }
}

/* ------------------------------------------------------------------ rules */

/* The keep rule of docs/semantics.md step 5, restated here from the text. */
typedef struct keep_rule {
    fa_causal causal;
    int64_t wl, wr;
    const fa_tensor *mask; /* bool, (B|1, Hq|1, Sq|1, Sk|1), or NULL */
} keep_rule;

static int keep(const keep_rule *r, const h_dims *d, int64_t b, int64_t h, int64_t i, int64_t j) {
    const int64_t shift = d->Sk - d->Sq;
    if (r->causal == FA_CAUSAL_BOTTOM_RIGHT && j > i + shift) return 0;
    if (r->causal == FA_CAUSAL_TOP_LEFT && j > i) return 0;
    if (r->wl != -1 && j < i + shift - r->wl) return 0;
    if (r->wr != -1 && j > i + shift + r->wr) return 0;
    if (r->mask) {
        const fa_tensor *m = r->mask;
        if (h_get(m, m->shape[0] == 1 ? 0 : b, m->shape[1] == 1 ? 0 : h,
                  m->shape[2] == 1 ? 0 : i, m->shape[3] == 1 ? 0 : j) == 0.0)
            return 0;
    }
    return 1;
}

static void apply_rule(fa_forward_args *a, const keep_rule *r) {
    a->causal = r->causal;
    a->window_left = r->wl;
    a->window_right = r->wr;
    if (r->mask) a->mask = *r->mask;
}

/* q = 0, k random (must not matter), v = identity per kv head (Dv = Sk). */
static void fill_q0_videntity(h_problem *p) {
    const h_dims *d = &p->dims;
    h_fill(&p->args.q, 0.0);
    h_fill_normal(&p->args.k, &g_rng, 1.0);
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t j = 0; j < d->Sk; j++)
            for (int64_t hk = 0; hk < d->Hk; hk++)
                for (int64_t c = 0; c < d->Dv; c++) h_set(&p->args.v, b, j, hk, c, c == j ? 1.0 : 0.0);
}

/*
 * Expected o and lse for q = 0, V = I and score bias `extra(b, h, i, j)` (0 when NULL):
 * row i of O is softmax over kept j of extra, lse its log-sum-exp, computed in double.
 */
typedef double (*extra_score_fn)(const void *ctx, int64_t b, int64_t h, int64_t i, int64_t j);

static void expect_softmax_rows(const h_dims *d, const keep_rule *r, extra_score_fn extra,
                                const void *ectx, expected *e) {
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t h = 0; h < d->Hq; h++)
            for (int64_t i = 0; i < d->Sq; i++) {
                double *orow = exp_o(e, d, b, i, h);
                double m = -INFINITY, z = 0.0;
                for (int64_t j = 0; j < d->Sk; j++)
                    if (keep(r, d, b, h, i, j)) m = fmax(m, extra ? extra(ectx, b, h, i, j) : 0.0);
                for (int64_t j = 0; j < d->Sk; j++)
                    if (keep(r, d, b, h, i, j)) z += exp((extra ? extra(ectx, b, h, i, j) : 0.0) - m);
                for (int64_t c = 0; c < d->Dv; c++) {
                    orow[c] = (isinf(m) || !keep(r, d, b, h, i, c))
                                  ? 0.0
                                  : exp((extra ? extra(ectx, b, h, i, c) : 0.0) - m) / z;
                }
                *exp_lse(e, d, b, h, i) = isinf(m) ? -INFINITY : m + log(z);
            }
}

/* The uniform-row test for one keep rule on every dtype config. */
static void ka_uniform(const char *name, h_dims d, const keep_rule *r) {
    d.Dv = d.Sk;
    expected e = expected_alloc(&d);
    expect_softmax_rows(&d, r, NULL, NULL, &e);
    for (int c = 0; c < NCFG; c++) {
        h_problem p;
        h_problem_alloc(&p, d, CFGS[c].in, CFGS[c].out);
        fill_q0_videntity(&p);
        apply_rule(&p.args, r);
        check_all_algos(&p, &e, name);
        h_problem_free(&p);
    }
    expected_free(&e);
}

/* --------------------------------------------------------- literal tables */

/*
 * Keep patterns written out by hand from the contract ('1' kept, '.' masked), one
 * string per query row, for tiny shapes where the alignment is easy to see.
 */
typedef struct literal_case {
    const char *name;
    int64_t Sq, Sk;
    fa_causal causal;
    int64_t wl, wr;
    const char *rows[8];
} literal_case;

static const literal_case LITERALS[] = {
    {"causal BR Sq<Sk", 2, 4, FA_CAUSAL_BOTTOM_RIGHT, -1, -1, {"111.", "1111"}},
    {"causal TL Sq<Sk", 2, 4, FA_CAUSAL_TOP_LEFT, -1, -1, {"1...", "11.."}},
    {"causal BR Sq>Sk", 4, 2, FA_CAUSAL_BOTTOM_RIGHT, -1, -1, {"..", "..", "1.", "11"}},
    {"causal TL Sq>Sk", 4, 2, FA_CAUSAL_TOP_LEFT, -1, -1, {"1.", "11", "11", "11"}},
    {"causal BR Sq=Sk", 3, 3, FA_CAUSAL_BOTTOM_RIGHT, -1, -1, {"1..", "11.", "111"}},
    {"causal TL Sq=Sk", 3, 3, FA_CAUSAL_TOP_LEFT, -1, -1, {"1..", "11.", "111"}},
    {"window (1,0) Sq=Sk", 4, 4, FA_CAUSAL_NONE, 1, 0, {"1...", "11..", ".11.", "..11"}},
    {"window (0,1) Sq<Sk", 2, 4, FA_CAUSAL_NONE, 0, 1, {"..11", "...1"}},
    {"window (1,1) Sq>Sk", 4, 2, FA_CAUSAL_NONE, 1, 1, {"..", "1.", "11", "11"}},
    {"window (0,0) Sq<Sk", 3, 5, FA_CAUSAL_NONE, 0, 0, {"..1..", "...1.", "....1"}},
    {"window (-1,0) = causal BR", 2, 4, FA_CAUSAL_NONE, -1, 0, {"111.", "1111"}},
    {"window (2,-1)", 3, 6, FA_CAUSAL_NONE, 2, -1, {".11111", "..1111", "...111"}},
    {"window (0,-1) Sq>Sk", 4, 2, FA_CAUSAL_NONE, 0, -1, {"11", "11", "11", ".1"}},
    {"causal TL + window (1,-1)", 2, 4, FA_CAUSAL_TOP_LEFT, 1, -1, {"....", "...."}},
    {"causal TL + window (-1,0)", 2, 4, FA_CAUSAL_TOP_LEFT, -1, 0, {"1...", "11.."}},
    {"causal BR + window (1,-1)", 3, 3, FA_CAUSAL_BOTTOM_RIGHT, 1, -1, {"1..", "11.", ".11"}},
    {"no mask 1x1", 1, 1, FA_CAUSAL_NONE, -1, -1, {"1"}},
    {"causal BR 1x1", 1, 1, FA_CAUSAL_BOTTOM_RIGHT, -1, -1, {"1"}},
    {"causal TL Sq=1 Sk=3", 1, 3, FA_CAUSAL_TOP_LEFT, -1, -1, {"1.."}},
    {"causal BR Sq=1 Sk=3", 1, 3, FA_CAUSAL_BOTTOM_RIGHT, -1, -1, {"111"}},
};

static void test_literals(void) {
    for (size_t t = 0; t < sizeof LITERALS / sizeof LITERALS[0]; t++) {
        const literal_case *lc = &LITERALS[t];
        const h_dims d = {1, lc->Sq, lc->Sk, 1, 1, 3, lc->Sk};
        expected e = expected_alloc(&d);
        for (int64_t i = 0; i < d.Sq; i++) {
            int64_t n = 0;
            for (int64_t j = 0; j < d.Sk; j++) n += lc->rows[i][j] == '1';
            for (int64_t j = 0; j < d.Sk; j++)
                exp_o(&e, &d, 0, i, 0)[j] = (lc->rows[i][j] == '1') ? 1.0 / (double)n : 0.0;
            *exp_lse(&e, &d, 0, 0, i) = n ? log((double)n) : -INFINITY;
        }
        for (int c = 0; c < NCFG; c++) {
            h_problem p;
            h_problem_alloc(&p, d, CFGS[c].in, CFGS[c].out);
            fill_q0_videntity(&p);
            p.args.causal = lc->causal;
            p.args.window_left = lc->wl;
            p.args.window_right = lc->wr;
            check_all_algos(&p, &e, lc->name);
            h_problem_free(&p);
        }
        expected_free(&e);
    }
}

/* ------------------------------------------------- causal, window, mask */

static const int64_t SHAPES[][2] = {{5, 5}, {3, 7}, {7, 3}, {1, 9}, {9, 1}, {70, 150}, {150, 70}};
enum { NSHAPES = sizeof SHAPES / sizeof SHAPES[0] };

static void test_causal_shapes(void) {
    const fa_causal kinds[] = {FA_CAUSAL_NONE, FA_CAUSAL_BOTTOM_RIGHT, FA_CAUSAL_TOP_LEFT};
    for (int s = 0; s < NSHAPES; s++)
        for (int k = 0; k < 3; k++) {
            const h_dims d = {2, SHAPES[s][0], SHAPES[s][1], 2, 1, 8, 0};
            const keep_rule r = {kinds[k], -1, -1, NULL};
            ka_uniform(k == 0 ? "no mask" : k == 1 ? "causal bottom-right" : "causal top-left", d, &r);
        }
}

static void test_windows(void) {
    static const int64_t wins[][2] = {{0, 0}, {1, 0}, {0, 1}, {2, 3}, {-1, 0}, {0, -1},
                                      {-1, -1}, {3, -1}, {-1, 2}, {17, 5}};
    static const int64_t shapes[][2] = {{6, 6}, {4, 9}, {9, 4}, {100, 130}, {130, 100}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t w = 0; w < sizeof wins / sizeof wins[0]; w++)
            for (int k = 0; k < 3; k++) {
                /* the long shapes only once per window, without causal, to keep it fast */
                if (s >= 3 && k != 0) continue;
                const fa_causal kinds[] = {FA_CAUSAL_NONE, FA_CAUSAL_BOTTOM_RIGHT, FA_CAUSAL_TOP_LEFT};
                const h_dims d = {1, shapes[s][0], shapes[s][1], 2, 2, 4, 0};
                const keep_rule r = {kinds[k], wins[w][0], wins[w][1], NULL};
                ka_uniform("window", d, &r);
            }
}

/* Random bool masks in every broadcast pattern, alone and with causal. */
static void test_masks(void) {
    const h_dims d = {2, 7, 11, 3, 1, 5, 0};
    const int64_t full[4] = {d.B, d.Hq, d.Sq, d.Sk};
    for (int pattern = 0; pattern < 16; pattern++) {
        int64_t shape[4];
        for (int a = 0; a < 4; a++) shape[a] = (pattern >> a) & 1 ? 1 : full[a];
        fa_tensor m = h_alloc(FA_DTYPE_BOOL, shape[0], shape[1], shape[2], shape[3]);
        for (int64_t a = 0; a < h_numel(&m); a++)
            ((unsigned char *)m.data)[a] = h_rng_uniform(&g_rng) < 0.6 ? 1 : 0;
        /* true means any non-zero byte, not just 1 */
        if (h_numel(&m) > 2) ((unsigned char *)m.data)[0] = ((unsigned char *)m.data)[0] ? 0x80 : 0;
        char name[64];
        snprintf(name, sizeof name, "mask shape (%lld,%lld,%lld,%lld)", (long long)shape[0],
                 (long long)shape[1], (long long)shape[2], (long long)shape[3]);
        keep_rule r = {FA_CAUSAL_NONE, -1, -1, &m};
        ka_uniform(name, d, &r);
        if (pattern % 5 == 0) {
            r.causal = FA_CAUSAL_BOTTOM_RIGHT;
            ka_uniform(name, d, &r);
            r.causal = FA_CAUSAL_TOP_LEFT;
            r.wl = 2;
            ka_uniform(name, d, &r);
        }
        free(m.data);
    }
    /* every row masked: o = 0, lse = -inf everywhere */
    fa_tensor none = h_alloc(FA_DTYPE_BOOL, 1, 1, 1, 1);
    const keep_rule r = {FA_CAUSAL_NONE, -1, -1, &none};
    ka_uniform("mask all false", d, &r);
    free(none.data);
}

/* ---------------------------------------------------------------- ALiBi */

typedef struct alibi_ctx {
    const float *slopes;
    int64_t stride_b;
    int64_t Sq, Sk;
} alibi_ctx;

static double alibi_score(const void *vc, int64_t b, int64_t h, int64_t i, int64_t j) {
    const alibi_ctx *c = vc;
    return -(double)c->slopes[b * c->stride_b + h] * fabs((double)(i + c->Sk - c->Sq - j));
}

static void test_alibi(void) {
    /* powers of two, so every score is exact in bf16 and f16 */
    static const float slopes_h[4] = {0.5f, 0.25f, 0.125f, 1.0f};
    static const float slopes_bh[8] = {0.5f, 0.25f, 0.125f, 1.0f, 0.0625f, 2.0f, 0.03125f, 0.75f};
    static const int64_t shapes[][2] = {{5, 9}, {9, 5}, {6, 6}, {130, 130}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int per_batch = 0; per_batch < 2; per_batch++)
            for (int causal = 0; causal < 2; causal++) {
                const h_dims d = {2, shapes[s][0], shapes[s][1], 4, 2, 4, shapes[s][1]};
                const alibi_ctx ac = {per_batch ? slopes_bh : slopes_h, per_batch ? 4 : 0, d.Sq, d.Sk};
                const keep_rule r = {causal ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE, -1, -1, NULL};
                expected e = expected_alloc(&d);
                expect_softmax_rows(&d, &r, alibi_score, &ac, &e);
                for (int c = 0; c < NCFG; c++) {
                    h_problem p;
                    h_problem_alloc(&p, d, CFGS[c].in, CFGS[c].out);
                    fill_q0_videntity(&p);
                    apply_rule(&p.args, &r);
                    p.args.alibi_slopes = ac.slopes;
                    p.args.alibi_stride_b = ac.stride_b;
                    check_all_algos(&p, &e, per_batch ? "alibi [B,Hq]" : "alibi [Hq]");
                    h_problem_free(&p);
                }
                expected_free(&e);
            }
}

/* ----------------------------------------------------------------- bias */

typedef struct bias_ctx {
    const fa_tensor *bias;
} bias_ctx;

static double bias_score(const void *vc, int64_t b, int64_t h, int64_t i, int64_t j) {
    const fa_tensor *t = ((const bias_ctx *)vc)->bias;
    return h_get(t, t->shape[0] == 1 ? 0 : b, t->shape[1] == 1 ? 0 : h, t->shape[2] == 1 ? 0 : i,
                 t->shape[3] == 1 ? 0 : j);
}

static void test_bias(void) {
    const h_dims d = {2, 6, 10, 2, 1, 4, 10};
    const int64_t full[4] = {d.B, d.Hq, d.Sq, d.Sk};
    const fa_dtype bdts[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int pattern = 0; pattern < 16; pattern++) {
        int64_t shape[4];
        for (int a = 0; a < 4; a++) shape[a] = (pattern >> a) & 1 ? 1 : full[a];
        fa_tensor bias = h_alloc(bdts[pattern % 3], shape[0], shape[1], shape[2], shape[3]);
        /* multiples of 1/4 in [-2, 2]: exact in every dtype */
        for (int64_t a = 0; a < h_numel(&bias); a++)
            h_set(&bias, 0, 0, 0, a, 0.25 * (double)h_rng_int(&g_rng, -8, 8));
        fa_tensor mask = h_alloc(FA_DTYPE_BOOL, 1, 1, d.Sq, d.Sk);
        h_fill(&mask, 1.0);
        for (int64_t a = 0; a < h_numel(&mask); a++)
            if (h_rng_uniform(&g_rng) < 0.3) ((unsigned char *)mask.data)[a] = 0;

        for (int with_mask = 0; with_mask < 2; with_mask++) {
            const keep_rule r = {pattern % 4 == 1 ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE, -1, -1,
                                 with_mask ? &mask : NULL};
            const bias_ctx bc = {&bias};
            expected e = expected_alloc(&d);
            expect_softmax_rows(&d, &r, bias_score, &bc, &e);
            char name[96];
            snprintf(name, sizeof name, "bias %s shape (%lld,%lld,%lld,%lld)", h_dtype_str(bias.dtype),
                     (long long)shape[0], (long long)shape[1], (long long)shape[2], (long long)shape[3]);
            for (int c = 0; c < NCFG; c++) {
                h_problem p;
                h_problem_alloc(&p, d, CFGS[c].in, CFGS[c].out);
                fill_q0_videntity(&p);
                apply_rule(&p.args, &r);
                p.args.bias = bias;
                check_all_algos(&p, &e, name);
                h_problem_free(&p);
            }
            expected_free(&e);
        }
        free(bias.data);
        free(mask.data);
    }

    /* -inf bias on whole columns (in every bias dtype): those columns drop out */
    for (int bt = 0; bt < 3; bt++) {
        fa_tensor col = h_alloc(bdts[bt], 1, 1, 1, d.Sk);
        h_set(&col, 0, 0, 0, 3, -INFINITY);
        h_set(&col, 0, 0, 0, 0, -INFINITY);
        h_set(&col, 0, 0, 0, d.Sk - 1, -INFINITY);
        const keep_rule r = {FA_CAUSAL_NONE, -1, -1, NULL};
        const bias_ctx bc = {&col};
        expected e = expected_alloc(&d);
        expect_softmax_rows(&d, &r, bias_score, &bc, &e);
        char name[64];
        snprintf(name, sizeof name, "bias -inf columns (%s)", h_dtype_str(col.dtype));
        for (int c = 0; c < NCFG; c++) {
            h_problem p;
            h_problem_alloc(&p, d, CFGS[c].in, CFGS[c].out);
            fill_q0_videntity(&p);
            p.args.bias = col;
            check_all_algos(&p, &e, name);
            h_problem_free(&p);
        }
        expected_free(&e);
        free(col.data);
    }
}

/* ------------------------------------------------ scale, softcap, D = 1 */

/*
 * Two keys, V = I (Dv = 2): o_i = (sigma(t), 1 - sigma(t)) with t = s_i0 - s_i1,
 * lse_i = log(exp(s_i0) + exp(s_i1)). q_i = c_i * ones(D), k_0 = ones(D), k_1 = kneg * ones(D),
 * so the raw dots are D*c_i and D*c_i*kneg.
 */
/* Optional extras on top of the two scores, to pin the order of docs/semantics.md steps 2-4. */
typedef struct two_key_extras {
    const float *bias2;  /* (1, 1, 1, 2) bias added after softcap, or NULL */
    float slope;         /* ALiBi slope, 0 = off: s_j -= slope * |i + Sk - Sq - j| after softcap */
} two_key_extras;

static void two_key_case_ex(const char *name, int64_t D, float scale, float softcap, double kneg,
                            const two_key_extras *x) {
    static const double cs[] = {0.5, 1.0, 1.5, 2.0, -1.0, 0.0};
    const h_dims d = {1, 6, 2, 1, 1, D, 2};
    const double sc = scale != 0.0f ? (double)scale : 1.0 / sqrt((double)D);
    expected e = expected_alloc(&d);
    for (int64_t i = 0; i < d.Sq; i++) {
        double s0 = sc * (double)D * cs[i], s1 = sc * (double)D * cs[i] * kneg;
        if (softcap > 0.0f) {
            s0 = softcap * tanh(s0 / softcap);
            s1 = softcap * tanh(s1 / softcap);
        }
        if (x && x->bias2) s0 += x->bias2[0], s1 += x->bias2[1];
        if (x && x->slope != 0.0f) { /* Sk - Sq = -4 */
            s0 -= x->slope * fabs((double)(i - 4 - 0));
            s1 -= x->slope * fabs((double)(i - 4 - 1));
        }
        const double m = fmax(s0, s1);
        const double z = exp(s0 - m) + exp(s1 - m);
        exp_o(&e, &d, 0, i, 0)[0] = exp(s0 - m) / z;
        exp_o(&e, &d, 0, i, 0)[1] = exp(s1 - m) / z;
        *exp_lse(&e, &d, 0, 0, i) = m + log(z);
    }
    for (int c = 0; c < NCFG; c++) {
        h_problem p;
        h_problem_alloc(&p, d, CFGS[c].in, CFGS[c].out);
        for (int64_t i = 0; i < d.Sq; i++)
            for (int64_t a = 0; a < D; a++) h_set(&p.args.q, 0, i, 0, a, cs[i]);
        for (int64_t a = 0; a < D; a++) {
            h_set(&p.args.k, 0, 0, 0, a, 1.0);
            h_set(&p.args.k, 0, 1, 0, a, kneg);
        }
        h_set(&p.args.v, 0, 0, 0, 0, 1.0);
        h_set(&p.args.v, 0, 1, 0, 1, 1.0);
        p.args.scale = scale;
        p.args.softcap = softcap;
        fa_tensor bias = {0};
        if (x && x->bias2) {
            bias = h_alloc(FA_DTYPE_F32, 1, 1, 1, 2);
            h_set(&bias, 0, 0, 0, 0, x->bias2[0]);
            h_set(&bias, 0, 0, 0, 1, x->bias2[1]);
            p.args.bias = bias;
        }
        if (x && x->slope != 0.0f) p.args.alibi_slopes = &x->slope;
        check_all_algos(&p, &e, name);
        free(bias.data);
        h_problem_free(&p);
    }
    expected_free(&e);
}

static void two_key_case(const char *name, int64_t D, float scale, float softcap, double kneg) {
    two_key_case_ex(name, D, scale, softcap, kneg, NULL);
}

static void test_scale_softcap(void) {
    two_key_case("default scale 1/sqrt(4)", 4, 0.0f, 0.0f, 0.0);
    two_key_case("default scale 1/sqrt(16)", 16, 0.0f, 0.0f, -0.5);
    two_key_case("default scale 1/sqrt(1), D=1", 1, 0.0f, 0.0f, -1.0);
    two_key_case("explicit scale 0.25", 4, 0.25f, 0.0f, 0.0);
    two_key_case("negative scale -0.5", 4, -0.5f, 0.0f, 0.5);
    two_key_case("softcap 3", 4, 1.0f, 3.0f, 0.0);
    two_key_case("softcap 1, D=1", 1, 2.0f, 1.0f, -1.0);
    two_key_case("softcap 50 (nearly linear)", 8, 0.0f, 50.0f, -0.25);
    /* softcap applies to scale*qk only; bias and ALiBi are added after it, uncapped */
    static const float bias2[2] = {2.5f, -1.0f};
    const two_key_extras with_bias = {bias2, 0.0f}, with_alibi = {NULL, 0.75f}, with_both = {bias2, 0.25f};
    two_key_case_ex("softcap 1 then bias", 4, 1.0f, 1.0f, 0.0, &with_bias);
    two_key_case_ex("softcap 2 then ALiBi", 4, 1.0f, 2.0f, -1.0, &with_alibi);
    two_key_case_ex("softcap 3 then bias and ALiBi", 4, 0.0f, 3.0f, 0.5, &with_both);
}

/*
 * Huge scores: one key scores +/-big, the rest 0, placed first, in the middle and last,
 * so the running max must be rescaled. o is one-hot (or uniform over the others).
 */
static void test_large_scores(void) {
    const int64_t Sk = 200;
    const int64_t places[3] = {0, 77, Sk - 1};
    for (int sgn = 0; sgn < 2; sgn++)
        for (int pl = 0; pl < 3; pl++) {
            const double big = sgn ? -1000.0 : 1000.0;
            const int64_t j0 = places[pl];
            const h_dims d = {1, 2, Sk, 1, 1, 1, Sk};
            expected e = expected_alloc(&d);
            for (int64_t i = 0; i < d.Sq; i++) {
                for (int64_t c = 0; c < Sk; c++)
                    exp_o(&e, &d, 0, i, 0)[c] = sgn ? (c == j0 ? 0.0 : 1.0 / (double)(Sk - 1))
                                                    : (c == j0 ? 1.0 : 0.0);
                *exp_lse(&e, &d, 0, 0, i) = sgn ? log((double)(Sk - 1)) : big;
            }
            for (int c = 0; c < NCFG; c++) {
                h_problem p;
                h_problem_alloc(&p, d, CFGS[c].in, CFGS[c].out);
                fill_q0_videntity(&p);
                h_fill(&p.args.q, big);
                h_fill(&p.args.k, 0.0);
                h_set(&p.args.k, 0, j0, 0, 0, 1.0);
                p.args.scale = 1.0f;
                check_all_algos(&p, &e, sgn ? "one huge negative score" : "one huge positive score");
                h_problem_free(&p);
            }
            expected_free(&e);
        }
}

/* --------------------------------------------------- heads, tiny shapes */

/* GQA/MQA/MHA: with q = 0, o[b,i,h,:] is the mean of v[b,:,h/(Hq/Hk),:] over kept j. */
static void test_head_mapping(void) {
    static const int64_t heads[][2] = {{4, 4}, {4, 2}, {6, 3}, {4, 1}, {1, 1}};
    for (size_t t = 0; t < sizeof heads / sizeof heads[0]; t++)
        for (int causal = 0; causal < 2; causal++) {
            const h_dims d = {2, 5, 7, heads[t][0], heads[t][1], 3, 6};
            const keep_rule r = {causal ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE, -1, -1, NULL};
            /* v values: small integers plus halves, exact in bf16 and distinct per (b, kv head) */
            fa_tensor vals = h_alloc(FA_DTYPE_F32, d.B, d.Sk, d.Hk, d.Dv);
            for (int64_t a = 0; a < h_numel(&vals); a++)
                h_set(&vals, 0, 0, 0, a, 0.5 * (double)h_rng_int(&g_rng, -16, 16));
            expected e = expected_alloc(&d);
            for (int64_t b = 0; b < d.B; b++)
                for (int64_t h = 0; h < d.Hq; h++)
                    for (int64_t i = 0; i < d.Sq; i++) {
                        const int64_t hk = h / (d.Hq / d.Hk);
                        int64_t n = 0;
                        for (int64_t j = 0; j < d.Sk; j++) n += keep(&r, &d, b, h, i, j);
                        for (int64_t c = 0; c < d.Dv; c++) {
                            double sum = 0.0;
                            for (int64_t j = 0; j < d.Sk; j++)
                                if (keep(&r, &d, b, h, i, j)) sum += h_get(&vals, b, j, hk, c);
                            exp_o(&e, &d, b, i, h)[c] = n ? sum / (double)n : 0.0;
                        }
                        *exp_lse(&e, &d, b, h, i) = n ? log((double)n) : -INFINITY;
                    }
            for (int c = 0; c < NCFG; c++) {
                h_problem p;
                h_problem_alloc(&p, d, CFGS[c].in, CFGS[c].out);
                h_fill_normal(&p.args.k, &g_rng, 1.0);
                h_copy(&p.args.v, &vals);
                apply_rule(&p.args, &r);
                check_all_algos(&p, &e, "head mapping");
                h_problem_free(&p);
            }
            expected_free(&e);
            free(vals.data);
        }
}

/* Sq = Sk = 1: p = 1, so o = v exactly and lse = the one score. */
static void test_single_key(void) {
    static const int64_t Ds[] = {1, 3, 64};
    for (size_t t = 0; t < sizeof Ds / sizeof Ds[0]; t++)
        for (int c = 0; c < NCFG; c++) {
            const h_dims d = {2, 1, 1, 2, 1, Ds[t], 5};
            h_problem p;
            h_problem_alloc(&p, d, CFGS[c].in, CFGS[c].out);
            /* multiples of 1/4 in [-2, 2]: every product and partial sum is exact in fp32 */
            for (int64_t a = 0; a < h_numel(&p.args.q); a++)
                h_set(&p.args.q, 0, 0, 0, a, 0.25 * (double)h_rng_int(&g_rng, -8, 8));
            for (int64_t a = 0; a < h_numel(&p.args.k); a++)
                h_set(&p.args.k, 0, 0, 0, a, 0.25 * (double)h_rng_int(&g_rng, -8, 8));
            h_fill_normal(&p.args.v, &g_rng, 1.0);
            expected e = expected_alloc(&d);
            for (int64_t b = 0; b < d.B; b++)
                for (int64_t h = 0; h < d.Hq; h++) {
                    double dot = 0.0;
                    for (int64_t a = 0; a < d.D; a++)
                        dot += h_get(&p.args.q, b, 0, h, a) * h_get(&p.args.k, b, 0, 0, a);
                    *exp_lse(&e, &d, b, h, 0) = dot / sqrt((double)d.D);
                    for (int64_t a = 0; a < d.Dv; a++)
                        exp_o(&e, &d, b, 0, h)[a] = h_round(h_get(&p.args.v, b, 0, 0, a), p.out_dtype);
                }
            check_all_algos(&p, &e, "Sq=Sk=1");
            expected_free(&e);
            h_problem_free(&p);
        }
}

/* ------------------------------------------------------------------ NaN */

/*
 * NaN in q row i0 (of one head) makes exactly that (b, i0, h) row NaN (o and lse); every
 * other row keeps its known uniform answer.
 */
static void test_nan_q(void) {
    for (int c = 0; c < NCFG; c++) {
        const h_dims d = {2, 6, 9, 2, 1, 4, 9};
        const keep_rule r = {FA_CAUSAL_NONE, -1, -1, NULL};
        const int64_t b0 = 1, i0 = 3, h0 = 1;
        expected e = expected_alloc(&d);
        expect_softmax_rows(&d, &r, NULL, NULL, &e);
        for (int64_t a = 0; a < d.Dv; a++) exp_o(&e, &d, b0, i0, h0)[a] = NAN;
        *exp_lse(&e, &d, b0, h0, i0) = NAN;
        h_problem p;
        h_problem_alloc(&p, d, CFGS[c].in, CFGS[c].out);
        fill_q0_videntity(&p);
        h_set(&p.args.q, b0, i0, h0, 2, NAN);
        check_all_algos(&p, &e, "NaN in one q element");
        h_problem_free(&p);
        expected_free(&e);
    }
}

/*
 * NaN in v row j0 (or k row j0) under causal masking: rows that keep j0 are NaN in o
 * (v: lse stays finite; k: lse is NaN too), rows that do not keep j0 keep their known
 * answer. Shapes cover Sq = Sk, Sq < Sk and Sq > Sk and j0 inside a long row.
 */
static void test_nan_kv(void) {
    static const int64_t shapes[][3] = {{8, 8, 5}, {4, 10, 8}, {10, 4, 2}, {150, 150, 70}};
    for (int which = 0; which < 2; which++) /* 0: v, 1: k */
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int align = 0; align < 2; align++) {
                const h_dims d = {1, shapes[s][0], shapes[s][1], 2, 2, 4, shapes[s][1]};
                const int64_t j0 = shapes[s][2];
                const keep_rule r = {align ? FA_CAUSAL_TOP_LEFT : FA_CAUSAL_BOTTOM_RIGHT, -1, -1, NULL};
                expected e = expected_alloc(&d);
                expect_softmax_rows(&d, &r, NULL, NULL, &e);
                for (int64_t h = 0; h < d.Hq; h++)
                    for (int64_t i = 0; i < d.Sq; i++) {
                        if (!keep(&r, &d, 0, h, i, j0)) continue;
                        for (int64_t a = 0; a < d.Dv; a++) exp_o(&e, &d, 0, i, h)[a] = NAN;
                        if (which == 1) *exp_lse(&e, &d, 0, h, i) = NAN;
                    }
                for (int c = 0; c < NCFG; c++) {
                    h_problem p;
                    h_problem_alloc(&p, d, CFGS[c].in, CFGS[c].out);
                    fill_q0_videntity(&p);
                    apply_rule(&p.args, &r);
                    for (int64_t hk = 0; hk < d.Hk; hk++) {
                        if (which == 0)
                            for (int64_t a = 0; a < d.Dv; a++) h_set(&p.args.v, 0, j0, hk, a, NAN);
                        else
                            h_set(&p.args.k, 0, j0, hk, 1, NAN);
                    }
                    check_all_algos(&p, &e, which == 0 ? "NaN v row under causal" : "NaN k row under causal");
                    h_problem_free(&p);
                }
                expected_free(&e);
            }
}

int main(void) {
    h_rng_seed(&g_rng, h_env_u64("FA_TEST_SEED", 20240601));
    fa_status st = h_context_create(&g_ctx);
    h_case("fa_context_create");
    if (!CHECK(st == FA_OK && g_ctx, "status %d (%s)", (int)st, fa_status_string(st))) return h_summary();
    const char *arch = getenv("FLASHATTN_ARCH");
    g_check_reference = !arch || !*arch || strcmp(fa_context_isa(g_ctx), "ref") == 0;
    if (!g_check_reference)
        printf("algo=reference not checked on this path: it runs no micro-kernels (the ref path checks it)\n");

    test_literals();
    test_causal_shapes();
    test_windows();
    test_masks();
    test_alibi();
    test_bias();
    test_scale_softcap();
    test_large_scores();
    test_head_mapping();
    test_single_key();
    test_nan_q();
    test_nan_kv();

    fa_context_free(g_ctx);
    return h_summary();
}
