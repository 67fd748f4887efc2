/*
 * test_f32_matmul.c: FA_PARAM_F32_MATMUL, f32 inputs as bf16 products (docs/semantics.md,
 * section 5, "Fast f32").
 *
 *   - the setting: bounds [0, 2], a bad value is FA_ERR_INVALID_ARGUMENT, get reads back;
 *   - the call's field f32_matmul: -1 takes the context's setting, 0..2 give the bits of
 *     a context set to that value whatever the context's, other values refused naming it;
 *   - ieee (0) is today's path: bitwise the same as a context that never set it;
 *   - on a table without bf16 dot products the setting is ignored (bitwise ieee), and the
 *     rest is skipped (exit 77);
 *   - bf16x3 and bf16 against the fp64 oracle over random shapes (tails, odd D, Dv != D,
 *     causal and window masks, GQA incl. stacked heads, forced tiles, K/V packed or not),
 *     each within its bound (below), bf16x3 measurably tighter than bf16;
 *   - bitwise the same for 1, 2 and 3 threads, and packed (FA_PARAM_KV_PACK 2) or not (1);
 *   - both tile paths: the fused forward (kernels.h, fwd_bf16's bf16x3 mode and its
 *     1-term use) where the table has it, and the unfused split path (FA_PARAM_BF16_FUSED
 *     0), each within the bound; on amx and amx-model the two must differ somewhere
 *     (different bits: the fused kernel ran);
 *   - the figures docs/semantics.md quotes: max and median relative error of each mode at
 *     D = 128, Sq = Sk = 512, N(0, 1) inputs, printed.
 *
 * The bound. x = hi + lo + r with hi = bf16(x), lo = bf16(x - hi), |r| <= 2^-18 |x|, and
 * bf16x3 drops lo.lo, so each product q_x k_x (and p_j v_j) is within 3 * 2^-18 |q_x k_x|
 * < 2^-16 |q_x k_x| of the exact one (bf16: hi.hi only, 2 * 2^-9 = 2^-8). A score is then
 * within eps * A of its exact value, A = max over (i, j) of scale * sum_x |q_ix k_jx|, and
 * a change ds of the scores moves o_i by at most 2 max|ds| max|v| (softmax is 1-Lipschitz
 * into the probability simplex's l1 ball, doubled) and lse by max|ds|; P.V adds eps max|v|.
 * So, with fp32's own noise as the accuracy rule has it (2x the naive fp32 error plus a few
 * ulps):
 *   |o - o_ref| <= eps * (2 A + 1) * max|v| + 2 * naive + 16 ulp * max(1, max|o_ref|)
 *   |lse - lse_ref| <= eps * A + 16 ulp(fp32) * max(1, max|lse_ref|)
 * eps = 2^-16 (bf16x3) or 2^-8 (bf16). Worst cases only: random data sits far inside.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "naive.h"

static fa_context *g_ctx, *g_plain; /* g_plain never sets FA_PARAM_F32_MATMUL */
static h_rng g_rng;
static double g_worst[3]; /* per mode: the largest o error over its bound's eps term, seen */
static int g_fused_differs; /* some case's fused and unfused bits differ */

typedef struct {
    h_dims d;
    fa_causal causal;
    int64_t wl, wr;
    int64_t tile_q, tile_kv; /* 0: planned */
    int64_t pack;            /* FA_PARAM_KV_PACK */
} mm_case;

static const char *mode_name(int64_t m) { return m == 0 ? "ieee" : m == 1 ? "bf16x3" : "bf16"; }

/* Runs flash on ctx with the given settings; o and lse land in p's buffers. */
static fa_status run(fa_context *ctx, h_problem *p, const mm_case *c, int64_t mode, int64_t threads)
{
    if (mode >= 0) fa_context_set(ctx, FA_PARAM_F32_MATMUL, mode);
    fa_context_set(ctx, FA_PARAM_KV_PACK, c->pack);
    h_set_tiles(ctx, c->tile_q, c->tile_kv);
    h_poison_outputs(&p->args);
    return h_run(ctx, FA_ALGO_FLASH, threads, &p->args);
}

static void copy_out(const h_problem *p, float *o, float *lse)
{
    memcpy(o, p->args.o.data, (size_t)h_numel(&p->args.o) * sizeof *o);
    memcpy(lse, p->args.lse.data, (size_t)h_numel(&p->args.lse) * sizeof *lse);
}

static int same_bits(const h_problem *p, const float *o, const float *lse)
{
    return memcmp(o, p->args.o.data, (size_t)h_numel(&p->args.o) * sizeof *o) == 0 &&
           memcmp(lse, p->args.lse.data, (size_t)h_numel(&p->args.lse) * sizeof *lse) == 0;
}

/* A = max over kept (i, j) and heads of scale * sum_x |q_ix k_jx| (all pairs: an upper bound). */
static double abs_score_sum(const h_problem *p)
{
    const h_dims *d = &p->dims;
    const double scale = 1.0 / sqrt((double)d->D);
    double a = 0.0;
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t h = 0; h < d->Hq; h++) {
            const int64_t hk = h / (d->Hq / d->Hk);
            for (int64_t i = 0; i < d->Sq; i++)
                for (int64_t j = 0; j < d->Sk; j++) {
                    double s = 0.0;
                    for (int64_t x = 0; x < d->D; x++)
                        s += fabs(h_get(&p->args.q, b, i, h, x) * h_get(&p->args.k, b, j, hk, x));
                    if (s * scale > a) a = s * scale;
                }
        }
    return a;
}

/* Errors of o and lse (in p) against the oracle: max |o - o_ref|, max |lse - lse_ref| over
 * finite rows. */
static void errors(const h_problem *p, const double *o_ref, const double *lse_ref, double *eo, double *el)
{
    const h_dims *d = &p->dims;
    *eo = *el = 0.0;
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t i = 0; i < d->Sq; i++)
            for (int64_t h = 0; h < d->Hq; h++) {
                for (int64_t e = 0; e < d->Dv; e++) {
                    const double x = fabs(h_get(&p->args.o, b, i, h, e) - o_ref[((b * d->Sq + i) * d->Hq + h) * d->Dv + e]);
                    if (!(x <= *eo)) *eo = x;
                }
                const double lr = lse_ref[(b * d->Hq + h) * d->Sq + i];
                const double l = h_get(&p->args.lse, b, h, i, 0);
                if (isinf(lr)) {
                    if (!(l == lr)) *el = INFINITY;
                } else if (!(fabs(l - lr) <= *el)) {
                    *el = fabs(l - lr);
                }
            }
}

static double max_abs(const double *x, int64_t n)
{
    double m = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i]) && fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

static void one_case(const mm_case *c, uint64_t seed)
{
    h_problem p;
    h_problem_alloc(&p, c->d, FA_DTYPE_F32, FA_DTYPE_F32);
    h_rng r;
    h_rng_seed(&r, seed);
    h_fill_normal(&p.args.q, &r, 1.0);
    h_fill_normal(&p.args.k, &r, 1.0);
    h_fill_normal(&p.args.v, &r, 1.0);
    p.args.causal = c->causal;
    p.args.window_left = c->wl;
    p.args.window_right = c->wr;
    const char *desc = h_dims_str(&c->d);
    const int64_t no = h_numel(&p.args.o), nl = h_numel(&p.args.lse);
    double *o_ref = malloc((size_t)no * sizeof *o_ref), *lse_ref = malloc((size_t)nl * sizeof *lse_ref);
    double *o_nv = malloc((size_t)no * sizeof *o_nv), *lse_nv = malloc((size_t)nl * sizeof *lse_nv);
    float *o0 = malloc((size_t)no * sizeof *o0), *l0 = malloc((size_t)nl * sizeof *l0);
    float *o1 = malloc((size_t)no * sizeof *o1), *l1 = malloc((size_t)nl * sizeof *l1);
    naive_forward(&p.args, NAIVE_FP64, o_ref, lse_ref, NULL);
    naive_forward(&p.args, NAIVE_SAME_PRECISION, o_nv, lse_nv, NULL);
    double naive_o = 0.0;
    for (int64_t e = 0; e < no; e++)
        if (fabs(o_nv[e] - o_ref[e]) > naive_o) naive_o = fabs(o_nv[e] - o_ref[e]);
    const double omax = max_abs(o_ref, no), lmax = max_abs(lse_ref, nl);
    double vm = 0.0;
    for (int64_t b = 0; b < c->d.B; b++)
        for (int64_t j = 0; j < c->d.Sk; j++)
            for (int64_t h = 0; h < c->d.Hk; h++)
                for (int64_t e = 0; e < c->d.Dv; e++) vm = fmax(vm, fabs(h_get(&p.args.v, b, j, h, e)));
    const double A = abs_score_sum(&p);
    const double ulp = ldexp(1.0, -23);

    /* ieee: the plain context's bits */
    h_case("%s causal=%d window=(%lld,%lld) tiles=%lldx%lld pack=%lld: unset", desc, (int)c->causal,
           (long long)c->wl, (long long)c->wr, (long long)c->tile_q, (long long)c->tile_kv, (long long)c->pack);
    fa_status st = run(g_plain, &p, c, -1, 2);
    CHECK(st == FA_OK, "status %d: %s", (int)st, fa_context_error(g_plain));
    copy_out(&p, o0, l0);
    st = run(g_ctx, &p, c, 0, 2);
    CHECK(st == FA_OK && same_bits(&p, o0, l0), "ieee (0) differs from the unset setting (status %d)", (int)st);

    for (int64_t mode = 1; mode <= 2; mode++) {
        h_case("%s causal=%d window=(%lld,%lld) tiles=%lldx%lld pack=%lld: %s", desc, (int)c->causal,
               (long long)c->wl, (long long)c->wr, (long long)c->tile_q, (long long)c->tile_kv, (long long)c->pack,
               mode_name(mode));
        st = run(g_ctx, &p, c, mode, 2);
        if (!CHECK(st == FA_OK, "status %d: %s", (int)st, fa_context_error(g_ctx))) continue;
        double eo, el;
        errors(&p, o_ref, lse_ref, &eo, &el);
        const double eps = mode == 1 ? ldexp(1.0, -16) : ldexp(1.0, -8);
        const double tol_o = eps * (2 * A + 1) * vm + 2 * naive_o + 16 * ulp * fmax(1.0, omax);
        const double tol_l = eps * A + 16 * ulp * fmax(1.0, lmax);
        CHECK(eo <= tol_o, "%s: max|o - o_ref| = %.3e > bound %.3e (A = %.2f, max|v| = %.2f, naive %.3e)",
              mode_name(mode), eo, tol_o, A, vm, naive_o);
        CHECK(el <= tol_l, "%s: max|lse - lse_ref| = %.3e > bound %.3e (A = %.2f)", mode_name(mode), el, tol_l, A);
        if (vm > 0) g_worst[mode] = fmax(g_worst[mode], eo / ((2 * A + 1) * vm));
        /* the same bits on 1, 2, 3 threads, and packed or not */
        copy_out(&p, o1, l1);
        for (int64_t th = 1; th <= 3; th += 2) {
            st = run(g_ctx, &p, c, mode, th);
            CHECK(st == FA_OK && same_bits(&p, o1, l1), "%s: %lld threads differ from 2", mode_name(mode),
                  (long long)th);
        }
        mm_case other = *c;
        other.pack = c->pack == 2 ? 1 : 2;
        st = run(g_ctx, &p, &other, mode, 2);
        CHECK(st == FA_OK && same_bits(&p, o1, l1), "%s: KV_PACK %lld differs from %lld", mode_name(mode),
              (long long)other.pack, (long long)c->pack);
        /* the unfused split path (the only one where no fused kernel exists): the same bound */
        fa_context_set(g_ctx, FA_PARAM_BF16_FUSED, 0);
        st = run(g_ctx, &p, c, mode, 2);
        fa_context_set(g_ctx, FA_PARAM_BF16_FUSED, 1);
        if (!CHECK(st == FA_OK, "unfused %s: status %d: %s", mode_name(mode), (int)st, fa_context_error(g_ctx)))
            continue;
        g_fused_differs |= !same_bits(&p, o1, l1);
        errors(&p, o_ref, lse_ref, &eo, &el);
        CHECK(eo <= tol_o, "unfused %s: max|o - o_ref| = %.3e > bound %.3e", mode_name(mode), eo, tol_o);
        CHECK(el <= tol_l, "unfused %s: max|lse - lse_ref| = %.3e > bound %.3e", mode_name(mode), el, tol_l);
    }
    fa_context_set(g_ctx, FA_PARAM_F32_MATMUL, 0);
    free(o_ref), free(lse_ref), free(o_nv), free(lse_nv), free(o0), free(l0), free(o1), free(l1);
    h_problem_free(&p);
}

/* fa_forward_args.f32_matmul: each per-call value v on a context set to each c gives
 * the bits of field -1 on a context set to v (docs/semantics.md, section 5). */
static void per_call(void)
{
    const mm_case c = {.d = {1, 70, 90, 4, 2, 64, 48}, .causal = FA_CAUSAL_BOTTOM_RIGHT, .wl = FA_WINDOW_UNBOUNDED,
                       .wr = FA_WINDOW_UNBOUNDED};
    h_problem p;
    h_problem_alloc(&p, c.d, FA_DTYPE_F32, FA_DTYPE_F32);
    h_fill_normal(&p.args.q, &g_rng, 1.0);
    h_fill_normal(&p.args.k, &g_rng, 1.0);
    h_fill_normal(&p.args.v, &g_rng, 1.0);
    const int64_t no = h_numel(&p.args.o), nl = h_numel(&p.args.lse);
    float *o[3], *l[3];
    for (int64_t v = 0; v <= 2; v++) { /* the settings' bits, field -1 */
        o[v] = malloc((size_t)no * sizeof *o[v]), l[v] = malloc((size_t)nl * sizeof *l[v]);
        h_case("per call: field -1 on a context set to %s", mode_name(v));
        const fa_status st = run(g_ctx, &p, &c, v, 2);
        CHECK(st == FA_OK, "status %d: %s", (int)st, fa_context_error(g_ctx));
        copy_out(&p, o[v], l[v]);
    }
    CHECK(!same_bits(&p, o[0], l[0]) && memcmp(o[1], o[2], (size_t)no * sizeof *o[1]) != 0,
          "the three settings do not give three results (the test would prove nothing)");
    for (int64_t ctxv = 0; ctxv <= 2; ctxv++)
        for (int32_t v = 0; v <= 2; v++) {
            h_case("per call: f32_matmul = %s on a context set to %s", mode_name(v), mode_name(ctxv));
            p.args.f32_matmul = v;
            const fa_status st = run(g_ctx, &p, &c, ctxv, 2);
            CHECK(st == FA_OK && same_bits(&p, o[v], l[v]), "status %d, or not the bits of the setting %s", (int)st,
                  mode_name(v));
        }
    for (int32_t bad = -2; bad <= 3; bad += 5) {
        h_case("per call: f32_matmul = %d refused", (int)bad);
        p.args.f32_matmul = bad;
        const fa_status st = run(g_ctx, &p, &c, 0, 2);
        CHECK(st == FA_ERR_INVALID_ARGUMENT && strstr(fa_context_error(g_ctx), "f32_matmul") != NULL,
              "status %d, message \"%s\"", (int)st, fa_context_error(g_ctx));
        int64_t written = 0; /* run() poisoned o and lse: a refusal leaves them so */
        for (int64_t i = 0; i < h_numel(&p.args.o); i++) written += ((const float *)p.args.o.data)[i] != 12345.0f;
        for (int64_t i = 0; i < h_numel(&p.args.lse); i++) written += ((const float *)p.args.lse.data)[i] != 12345.0f;
        CHECK(written == 0, "the refused call wrote %lld values of o or lse", (long long)written);
    }
    p.args.f32_matmul = -1;
    fa_context_set(g_ctx, FA_PARAM_F32_MATMUL, 0);
    for (int v = 0; v <= 2; v++) free(o[v]), free(l[v]);
    h_problem_free(&p);
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The figures of docs/semantics.md: D = 128, Sq = Sk = 512, N(0, 1) q, k, v, 2 heads. Relative
 * error of an element: |o - o_ref| / max|o_ref| (over all of o). Returns the maxima. */
static void measure(double out_max[3])
{
    const h_dims d = {.B = 1, .Sq = 512, .Sk = 512, .Hq = 2, .Hk = 2, .D = 128, .Dv = 128};
    h_problem p;
    h_problem_alloc(&p, d, FA_DTYPE_F32, FA_DTYPE_F32);
    h_rng r;
    h_rng_seed(&r, 2026);
    h_fill_normal(&p.args.q, &r, 1.0);
    h_fill_normal(&p.args.k, &r, 1.0);
    h_fill_normal(&p.args.v, &r, 1.0);
    const int64_t no = h_numel(&p.args.o);
    double *o_ref = malloc((size_t)no * sizeof *o_ref), *rel = malloc((size_t)no * sizeof *rel);
    naive_forward(&p.args, NAIVE_FP64, o_ref, NULL, NULL);
    const double omax = max_abs(o_ref, no);
    const mm_case c = {.d = d, .wl = FA_WINDOW_UNBOUNDED, .wr = FA_WINDOW_UNBOUNDED};
    for (int64_t mode = 0; mode <= 2; mode++) {
        h_case("measure %s", mode_name(mode));
        const fa_status st = run(g_ctx, &p, &c, mode, 2);
        CHECK(st == FA_OK, "status %d", (int)st);
        const float *o = p.args.o.data;
        for (int64_t e = 0; e < no; e++) rel[e] = fabs(o[e] - o_ref[e]) / omax;
        qsort(rel, (size_t)no, sizeof *rel, cmp_double);
        out_max[mode] = rel[no - 1];
        printf("measured %-6s D=128 N=512: relative error vs fp64, max %.2e, median %.2e (max|o_ref| = %.3f)\n",
               mode_name(mode), rel[no - 1], rel[no / 2], omax);
    }
    fa_context_set(g_ctx, FA_PARAM_F32_MATMUL, 0);
    free(o_ref), free(rel);
    h_problem_free(&p);
}

int main(void)
{
    unsetenv("FLASHATTN_F32_MATMUL"); /* every context here starts at ieee */
    fa_status st = h_context_create(&g_ctx);
    CHECK(st == FA_OK, "context: %d", (int)st);
    st = fa_context_create(&g_plain);
    CHECK(st == FA_OK, "context: %d", (int)st);
    if (st != FA_OK) return h_summary();

    /* the setting itself */
    h_case("setting");
    int64_t lo = -1, hi = -1, v = -1;
    CHECK(fa_param_bounds(FA_PARAM_F32_MATMUL, &lo, &hi) == FA_OK && lo == 0 && hi == 2, "bounds [%lld, %lld]",
          (long long)lo, (long long)hi);
    CHECK(fa_context_get(g_ctx, FA_PARAM_F32_MATMUL, &v) == FA_OK && v == 0, "default %lld, expected 0 (ieee)",
          (long long)v);
    CHECK(fa_context_set(g_ctx, FA_PARAM_F32_MATMUL, 3) == FA_ERR_INVALID_ARGUMENT, "3 accepted");
    CHECK(fa_context_set(g_ctx, FA_PARAM_F32_MATMUL, -1) == FA_ERR_INVALID_ARGUMENT, "-1 accepted");
    CHECK(fa_context_error(g_ctx)[0] != '\0', "no error text after a bad value");
    CHECK(fa_context_set(g_ctx, FA_PARAM_F32_MATMUL, 1) == FA_OK, "1 refused");
    CHECK(fa_context_get(g_ctx, FA_PARAM_F32_MATMUL, &v) == FA_OK && v == 1, "read back %lld", (long long)v);
    fa_context_set(g_ctx, FA_PARAM_F32_MATMUL, 0);

    /* does this table multiply bf16 natively? (FA_PARAM_BF16_DOT forced on says so) */
    int64_t dot = 0;
    fa_context_set(g_ctx, FA_PARAM_BF16_DOT, 1);
    fa_context_get(g_ctx, FA_PARAM_BF16_DOT_ACTIVE, &dot);
    fa_context_set(g_ctx, FA_PARAM_BF16_DOT, 0);
    h_rng_seed(&g_rng, h_env_u64("FA_TEST_SEED", 21));

    if (!dot) { /* ignored: every mode is ieee, bit for bit */
        const mm_case c = {.d = {1, 37, 45, 2, 1, 24, 24}, .wl = FA_WINDOW_UNBOUNDED, .wr = FA_WINDOW_UNBOUNDED};
        h_problem p;
        h_problem_alloc(&p, c.d, FA_DTYPE_F32, FA_DTYPE_F32);
        h_fill_normal(&p.args.q, &g_rng, 1.0);
        h_fill_normal(&p.args.k, &g_rng, 1.0);
        h_fill_normal(&p.args.v, &g_rng, 1.0);
        float *o0 = malloc((size_t)h_numel(&p.args.o) * sizeof *o0), *l0 = malloc((size_t)h_numel(&p.args.lse) * 4);
        run(g_plain, &p, &c, -1, 2);
        copy_out(&p, o0, l0);
        for (int64_t mode = 1; mode <= 2; mode++) {
            h_case("ignored on %s: %s", fa_context_isa(g_ctx), mode_name(mode));
            st = run(g_ctx, &p, &c, mode, 2);
            CHECK(st == FA_OK && same_bits(&p, o0, l0), "%s on a table without bf16 dot is not ieee",
                  mode_name(mode));
        }
        free(o0), free(l0);
        h_problem_free(&p);
        printf("%s has no bf16 dot product: FA_PARAM_F32_MATMUL is ignored (checked); the rest skipped\n",
               fa_context_isa(g_ctx));
        const int rc = h_summary();
        fa_context_free(g_ctx);
        fa_context_free(g_plain);
        return rc ? rc : H_SKIP;
    }

    /* fixed cases first (odd D, stacked GQA heads, windows at odd keys), then random ones */
    const mm_case fixed[] = {
        {{1, 64, 64, 2, 2, 128, 128}, FA_CAUSAL_NONE, FA_WINDOW_UNBOUNDED, FA_WINDOW_UNBOUNDED, 0, 0, 0},
        {{1, 33, 71, 4, 1, 63, 40}, FA_CAUSAL_BOTTOM_RIGHT, FA_WINDOW_UNBOUNDED, FA_WINDOW_UNBOUNDED, 0, 0, 0},
        {{2, 20, 90, 8, 2, 64, 64}, FA_CAUSAL_NONE, FA_WINDOW_UNBOUNDED, FA_WINDOW_UNBOUNDED, 0, 0, 2},
        {{1, 100, 100, 2, 2, 32, 48}, FA_CAUSAL_TOP_LEFT, 17, 3, 32, 48, 2},
        {{1, 97, 131, 3, 3, 80, 80}, FA_CAUSAL_NONE, 31, 0, 16, 37, 0},
        /* the fused kernel's blocks: several strips and key blocks, tails, D > 128 */
        {{1, 300, 333, 2, 1, 256, 200}, FA_CAUSAL_BOTTOM_RIGHT, FA_WINDOW_UNBOUNDED, FA_WINDOW_UNBOUNDED, 0, 0, 0},
        {{1, 257, 600, 2, 2, 128, 128}, FA_CAUSAL_NONE, 100, 50, 0, 0, 2},
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) one_case(&fixed[i], 100 + i);
    const int rounds = h_scaled(14);
    for (int t = 0; t < rounds; t++) {
        mm_case c = {.wl = FA_WINDOW_UNBOUNDED, .wr = FA_WINDOW_UNBOUNDED};
        const int64_t Dchoices[] = {16, 31, 64, 96, 128};
        c.d.B = h_rng_int(&g_rng, 1, 2);
        c.d.Hk = h_rng_int(&g_rng, 1, 2);
        c.d.Hq = c.d.Hk * h_rng_int(&g_rng, 1, 4);
        c.d.Sq = h_rng_int(&g_rng, 1, 130);
        c.d.Sk = h_rng_int(&g_rng, 1, 160);
        c.d.D = Dchoices[h_rng_int(&g_rng, 0, 4)];
        c.d.Dv = h_rng_int(&g_rng, 0, 3) == 0 ? h_rng_int(&g_rng, 1, 100) : c.d.D;
        const int64_t mask = h_rng_int(&g_rng, 0, 3);
        if (mask == 1) c.causal = FA_CAUSAL_BOTTOM_RIGHT;
        if (mask == 2) c.causal = FA_CAUSAL_TOP_LEFT;
        if (mask == 3) {
            c.wl = h_rng_int(&g_rng, 0, 40);
            c.wr = h_rng_int(&g_rng, 0, 10);
        }
        if (h_rng_int(&g_rng, 0, 2) == 0) {
            c.tile_q = 16 * h_rng_int(&g_rng, 1, 4);
            c.tile_kv = h_rng_int(&g_rng, 8, 70);
        }
        c.pack = h_rng_int(&g_rng, 0, 2);
        one_case(&c, 1000 + (uint64_t)t);
    }
    const char *isa = fa_context_isa(g_ctx);
    if (strcmp(isa, "amx") == 0 || strcmp(isa, "amx-model") == 0) {
        h_case("fused on %s", isa);
        CHECK(g_fused_differs, "FA_PARAM_BF16_FUSED 0 and 1 gave the same bits in every case: the fused kernel never ran");
    }
    printf("worst o error / ((2A + 1) max|v|): bf16x3 %.2e (bound 2^-16 = %.2e), bf16 %.2e (bound 2^-8 = %.2e)\n",
           g_worst[1], ldexp(1.0, -16), g_worst[2], ldexp(1.0, -8));

    per_call();
    double mx[3];
    measure(mx);
    h_case("bf16x3 tighter than bf16");
    CHECK(mx[1] * 16 < mx[2], "bf16x3's max relative error %.2e is not 16x below bf16's %.2e", mx[1], mx[2]);
    CHECK(mx[1] < ldexp(1.0, -14), "bf16x3's max relative error %.2e at D=128 N=512 exceeds 2^-14", mx[1]);
    const int rc = h_summary();
    fa_context_free(g_ctx);
    fa_context_free(g_plain);
    return rc;
}
