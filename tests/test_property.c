/*
 * test_property.c: random sweeps with a fixed seed. For each case:
 *   1. the library's fp64 oracle (FA_ALGO_REFERENCE, f32 output) is cross-checked
 *      against our own naive fp64 attention with a tight tolerance;
 *   2. flash (threads 1, 2, 3) and standard (the case's thread count) must satisfy the
 *      accuracy rule of docs/semantics.md against the oracle:
 *        max|o_alg - o_ref| <= 2 * max|o_naive_same_precision - o_ref| + ulp term,
 *      and likewise for lse (tolerances: harness.h);
 *   3. flash must be bitwise identical across thread counts 1, 2, 3, and with lse
 *      omitted (lse must not change the path that computes o); most cases force small
 *      flash tiles (FA_PARAM_TILE_Q/KV) so short rows span several K/V tiles, and a
 *      final section checks determinism with planner-chosen tiles on long rows (causal
 *      both ways, a window, f32 and bf16; threads 1, 2, 3 and a second 3-thread run).
 * It checks one micro-kernel path: the one FLASHATTN_ARCH names (the default otherwise);
 * ctest runs it once per path (tests/CMakeLists.txt). FA_TEST_SCALE < 1 runs a share of
 * the cases (see round_stride).
 * Cases cover lengths 1 and odd, Sq != Sk both ways, D in DS, Dv != D, MHA/GQA/MQA,
 * bool masks, both causal alignments, windows, softcap, ALiBi [Hq] and [B, Hq], bias with
 * broadcast dims (size-1 dims and stride-0 dims), f32/f16/bf16 with o in the input dtype
 * or f32, and thread counts 1..3.
 *
 * Reproduce one case: FA_TEST_SEED=<seed> FA_TEST_CASE=<index> ./test_property
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "naive.h"

static const int64_t DS[] = {1, 8, 40, 59, 64, 80, 96, 111, 128, 160, 192, 256, 512};
enum { NDS = sizeof DS / sizeof DS[0] };
static const int64_t LENS[] = {1, 2, 3, 5, 7, 16, 17, 31, 33, 64, 65, 100, 128, 129, 200};
enum { NLENS = sizeof LENS / sizeof LENS[0] };
static const fa_dtype DTYPES[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};

/* Cases per (D, dtype) pair; the total is NDS * 3 * CASES_PER_CELL. */
enum { CASES_PER_CELL = 12 };
/*
 * Work budget per case, in multiply-adds of the reference (B*Hq*Sq*Sk*(D+Dv)): the fp64
 * reference and the naive oracles are scalar, so this bounds the run time; big-D cases
 * get short sequences.
 */
static const double WORK_BUDGET = 2e6;

typedef struct pcase {
    int index;
    h_dims d;
    fa_dtype dt, out;
    float scale, softcap;
    fa_causal causal;
    int64_t wl, wr;
    int alibi;        /* 0 none, 1 slopes [Hq], 2 slopes [B, Hq] */
    int bias;         /* 0 none, else 1 + broadcast pattern (bit a set: dim a is 1) */
    fa_dtype bias_dt;
    int bias_stride0; /* broadcast dims given as full size with stride 0 */
    int mask;         /* 0 none, else 1 + broadcast pattern */
    int64_t threads;
    int64_t tile_q, tile_kv; /* flash tiles; 0 = planned */
    double q_sigma;   /* sharper or flatter softmax */
} pcase;

/* Worst err/tol seen per (flash|standard, dtype index), printed for information. */
static double g_worst[2][3];
/* Random cases whose flash threads 1/2/3 bits were compared, per dtype, and how many of
 * them were causal: determinism must have been seen on causal and on bf16 cases. */
static int g_det_cases[3], g_det_causal[3];

static int dtype_index(fa_dtype dt) { return dt == FA_DTYPE_F32 ? 0 : dt == FA_DTYPE_F16 ? 1 : 2; }

static int64_t pick(h_rng *r, const int64_t *xs, int n) { return xs[h_rng_int(r, 0, n - 1)]; }

static pcase make_case(h_rng *r, int index) {
    pcase c;
    memset(&c, 0, sizeof c);
    c.index = index;
    c.d.D = DS[index % NDS];
    c.dt = DTYPES[(index / NDS) % 3];
    c.out = (c.dt != FA_DTYPE_F32 && h_rng_uniform(r) < 0.35) ? FA_DTYPE_F32 : c.dt;
    const double u = h_rng_uniform(r);
    c.d.Dv = u < 0.6 ? c.d.D : u < 0.8 ? DS[h_rng_int(r, 0, NDS - 1)] : h_rng_int(r, 1, 160);

    const double hk = h_rng_uniform(r);
    if (hk < 0.4) { /* MHA */
        c.d.Hk = h_rng_int(r, 1, 3);
        c.d.Hq = c.d.Hk;
    } else if (hk < 0.7) { /* GQA */
        c.d.Hk = h_rng_int(r, 2, 3);
        c.d.Hq = c.d.Hk * h_rng_int(r, 2, 3);
    } else { /* MQA */
        c.d.Hk = 1;
        c.d.Hq = h_rng_int(r, 2, 4);
    }
    c.d.B = h_rng_int(r, 1, 3);
    c.d.Sq = pick(r, LENS, NLENS);
    c.d.Sk = h_rng_uniform(r) < 0.3 ? c.d.Sq : pick(r, LENS, NLENS);
    for (;;) {
        const double work = (double)(c.d.B * c.d.Hq * c.d.Sq * c.d.Sk * (c.d.D + c.d.Dv));
        if (work <= WORK_BUDGET) break;
        if (c.d.B > 1) c.d.B--;
        else if (c.d.Hq > c.d.Hk && c.d.Hq > 2) c.d.Hq -= c.d.Hk, c.d.Hq = c.d.Hq < c.d.Hk ? c.d.Hk : c.d.Hq;
        else if (c.d.Sq >= c.d.Sk) c.d.Sq = (c.d.Sq + 1) / 2;
        else c.d.Sk = (c.d.Sk + 1) / 2;
    }

    static const float scales[] = {0.05f, 0.3f, 1.0f, -0.2f};
    c.scale = h_rng_uniform(r) < 0.7 ? 0.0f : scales[h_rng_int(r, 0, 3)];
    static const float caps[] = {1.5f, 5.0f, 20.0f};
    c.softcap = h_rng_uniform(r) < 0.2 ? caps[h_rng_int(r, 0, 2)] : 0.0f;
    const double cu = h_rng_uniform(r);
    c.causal = cu < 0.4 ? FA_CAUSAL_NONE : cu < 0.7 ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_TOP_LEFT;
    static const int64_t wins[] = {-1, 0, 1, 3, 8, 20};
    c.wl = c.wr = -1;
    if (h_rng_uniform(r) < 0.25) {
        c.wl = pick(r, wins, 6);
        c.wr = pick(r, wins, 6);
    }
    c.alibi = h_rng_uniform(r) < 0.2 ? (int)h_rng_int(r, 1, 2) : 0;
    if (h_rng_uniform(r) < 0.3) {
        c.bias = 1 + (int)h_rng_int(r, 0, 15);
        c.bias_dt = DTYPES[h_rng_int(r, 0, 2)];
        c.bias_stride0 = h_rng_uniform(r) < 0.3;
    }
    c.mask = h_rng_uniform(r) < 0.25 ? 1 + (int)h_rng_int(r, 0, 15) : 0;
    c.threads = h_rng_int(r, 1, 3);
    static const double sigmas[] = {0.5, 1.0, 2.0};
    c.q_sigma = sigmas[h_rng_int(r, 0, 2)];
    /* forced small tiles in most cases, so short rows cross K/V tile boundaries; tall
     * ones (over 64 rows) so that a causal band's diagonal tile is cut into row blocks
     * that stop at their last kept column (algo_flash.c, wide_trimmed), the last block
     * taking a short remainder with it (100 = 64 + 36, 200 = 64 + 64 + 72) */
    static const int64_t tq[] = {1, 3, 8, 16, 64, 100, 200}, tkv[] = {1, 5, 16, 32, 100, 150};
    if (h_rng_uniform(r) < 0.6) {
        c.tile_q = pick(r, tq, 7);
        c.tile_kv = pick(r, tkv, 6);
    }
    return c;
}

static void describe(const pcase *c, uint64_t seed, char *buf, size_t n) {
    snprintf(buf, n,
             "seed=%llu case=%d %s in=%s out=%s scale=%g softcap=%g causal=%d window=(%lld,%lld) "
             "alibi=%d bias=%d(%s%s) mask=%d q_sigma=%g tiles=%lldx%lld",
             (unsigned long long)seed, c->index, h_dims_str(&c->d), h_dtype_str(c->dt),
             h_dtype_str(c->out), (double)c->scale, (double)c->softcap, (int)c->causal,
             (long long)c->wl, (long long)c->wr, c->alibi, c->bias ? c->bias - 1 : -1,
             c->bias ? h_dtype_str(c->bias_dt) : "-", c->bias_stride0 ? ",stride0" : "",
             c->mask ? c->mask - 1 : -1, c->q_sigma, (long long)c->tile_q, (long long)c->tile_kv);
}

/* A (B|1, Hq|1, Sq|1, Sk|1) tensor per the broadcast pattern; stride0 keeps full sizes. */
static fa_tensor broadcast_tensor(const h_dims *d, int pattern, fa_dtype dt, int stride0) {
    const int64_t full[4] = {d->B, d->Hq, d->Sq, d->Sk};
    int64_t shape[4];
    for (int a = 0; a < 4; a++) shape[a] = (pattern >> a) & 1 ? 1 : full[a];
    fa_tensor t = h_alloc(dt, shape[0], shape[1], shape[2], shape[3]);
    if (stride0)
        for (int a = 0; a < 4; a++)
            if (shape[a] == 1) t.shape[a] = full[a], t.stride[a] = 0;
    return t;
}

typedef struct oracle {
    double *o64, *lse64;   /* naive fp64 */
    double *os, *lses;     /* naive same precision */
    double smax;           /* max |s| */
} oracle;

/* max |a - b| over finite b; NaN anywhere counts as infinite error. */
static double max_err(const fa_tensor *got, const double *want, int64_t n, int64_t *where) {
    double m = 0.0;
    *where = -1;
    for (int64_t a = 0; a < n; a++) {
        const double g = h_get(got, 0, 0, 0, a);
        double e = fabs(g - want[a]);
        if (isnan(e)) e = INFINITY;
        if (e > m || (*where < 0 && e == INFINITY)) m = e, *where = a;
    }
    return m;
}

static double max_abs(const double *x, int64_t n) {
    double m = 0.0;
    for (int64_t a = 0; a < n; a++)
        if (isfinite(x[a]) && fabs(x[a]) > m) m = fabs(x[a]);
    return m;
}

/*
 * lse error: -inf must match -inf exactly (a row with nothing kept), anything else is
 * compared numerically. Returns the max error over rows; *inf_mismatch counts rows where
 * exactly one side is -inf.
 */
static double lse_err(const double *got, const double *want, int64_t n, int64_t *inf_mismatch,
                      int64_t *where) {
    double m = 0.0;
    *inf_mismatch = 0;
    *where = -1;
    for (int64_t a = 0; a < n; a++) {
        const int gi = isinf(got[a]) && got[a] < 0, wi = isinf(want[a]) && want[a] < 0;
        if (gi || wi) {
            if (gi != wi) *inf_mismatch += 1, *where = a;
            continue;
        }
        double e = fabs(got[a] - want[a]);
        if (isnan(e)) e = INFINITY;
        if (e > m) m = e, *where = a;
    }
    return m;
}

static void read_lse(const fa_tensor *t, double *out) {
    for (int64_t a = 0; a < h_numel(t); a++) out[a] = h_get(t, 0, 0, 0, a);
}

static void run_case(fa_context *ctx, uint64_t seed, int index) {
    h_rng r;
    h_rng_seed(&r, seed + 0x9e3779b97f4a7c15ull * (uint64_t)(index + 1));
    const pcase c = make_case(&r, index);
    char desc[400];
    describe(&c, seed, desc, sizeof desc);
    const h_dims *d = &c.d;

    h_problem p;
    h_problem_alloc(&p, c.d, c.dt, c.out);
    fa_forward_args *a = &p.args;
    h_fill_normal(&a->q, &r, c.q_sigma);
    h_fill_normal(&a->k, &r, 1.0);
    h_fill_normal(&a->v, &r, 1.0);
    a->scale = c.scale;
    a->softcap = c.softcap;
    a->causal = c.causal;
    a->window_left = c.wl;
    a->window_right = c.wr;

    float *slopes = NULL;
    if (c.alibi) {
        const int64_t n = c.alibi == 2 ? d->B * d->Hq : d->Hq;
        slopes = malloc(sizeof(float) * (size_t)n);
        for (int64_t s = 0; s < n; s++) slopes[s] = (float)h_rng_range(&r, 0.01, 1.0);
        a->alibi_slopes = slopes;
        a->alibi_stride_b = c.alibi == 2 ? d->Hq : 0;
    }
    if (c.bias) {
        a->bias = broadcast_tensor(d, c.bias - 1, c.bias_dt, c.bias_stride0);
        for (int64_t e = 0; e < d->B * d->Hq * d->Sq * d->Sk; e++) {
            /* written through the broadcast view: the last write per element wins */
            const int64_t j = e % d->Sk, i = (e / d->Sk) % d->Sq, h = (e / (d->Sk * d->Sq)) % d->Hq,
                          b = e / (d->Sk * d->Sq * d->Hq);
            if ((a->bias.shape[0] == 1 && b) || (a->bias.shape[1] == 1 && h) ||
                (a->bias.shape[2] == 1 && i) || (a->bias.shape[3] == 1 && j))
                continue;
            h_set(&a->bias, b, h, i, j, h_rng_normal(&r));
        }
    }
    if (c.mask) {
        a->mask = broadcast_tensor(d, c.mask - 1, FA_DTYPE_BOOL, 0);
        const double density = h_rng_range(&r, 0.3, 0.95);
        for (int64_t e = 0; e < h_numel(&a->mask); e++)
            ((unsigned char *)a->mask.data)[e] = h_rng_uniform(&r) < density;
    }

    const int64_t n_o = d->B * d->Sq * d->Hq * d->Dv, n_lse = d->B * d->Hq * d->Sq;

    /* 1. the oracle: reference with f32 output */
    fa_forward_args ra = *a;
    ra.o = h_alloc(FA_DTYPE_F32, d->B, d->Sq, d->Hq, d->Dv);
    ra.lse = h_alloc(FA_DTYPE_F32, d->B, d->Hq, d->Sq, 1);
    h_case("%s algo=reference", desc);
    fa_status st = h_run(ctx, FA_ALGO_REFERENCE, 1, &ra);
    oracle orc;
    orc.o64 = malloc(sizeof(double) * (size_t)n_o);
    orc.os = malloc(sizeof(double) * (size_t)n_o);
    orc.lse64 = malloc(sizeof(double) * (size_t)n_lse);
    orc.lses = malloc(sizeof(double) * (size_t)n_lse);
    double *o_ref = malloc(sizeof(double) * (size_t)n_o);
    double *lse_ref = malloc(sizeof(double) * (size_t)n_lse);
    double *lse_got = malloc(sizeof(double) * (size_t)n_lse);
    if (!CHECK(st == FA_OK, "status %d (%s): %s", (int)st, fa_status_string(st), fa_context_error(ctx)))
        goto done;
    for (int64_t e = 0; e < n_o; e++) o_ref[e] = h_get(&ra.o, 0, 0, 0, e);
    read_lse(&ra.lse, lse_ref);

    /* the reference against the naive fp64 attention: two independent fp64 oracles */
    CHECK(naive_forward(&ra, NAIVE_FP64, orc.o64, orc.lse64, &orc.smax) == 0, "naive fp64 failed");
    CHECK(naive_forward(a, NAIVE_SAME_PRECISION, orc.os, orc.lses, NULL) == 0, "naive same failed");
    {
        const double omax = max_abs(orc.o64, n_o);
        double vmax = 0.0;
        for (int64_t e = 0; e < h_numel(&a->v); e++) vmax = fmax(vmax, fabs(h_get(&a->v, 0, 0, 0, e)));
        /*
         * f32 output rounding of the oracle (<= 1/2 ulp) plus, when the scale is the
         * default, the float rounding of 1/sqrt(D) (2^-24 relative) that may be in the
         * library but not in our double: moves each s by <= 2^-24 |s|, so o by at most
         * ~2 * 2^-24 * smax * max|v| and lse by 2^-24 * smax.
         */
        int64_t at;
        const double scale_term = c.scale == 0.0f ? 2.0 * FLT_EPSILON * orc.smax : 0.0;
        const double tol = 4.0 * FLT_EPSILON * fmax(1.0, omax) + scale_term * vmax;
        const double err = max_err(&ra.o, orc.o64, n_o, &at);
        CHECK(err <= tol, "reference vs naive fp64: o max err %.3g > tol %.3g at flat index %lld",
              err, tol, (long long)at);
        int64_t infs;
        const double lmax = max_abs(orc.lse64, n_lse);
        const double ltol = 4.0 * FLT_EPSILON * fmax(1.0, lmax) + scale_term;
        const double lerr = lse_err(lse_ref, orc.lse64, n_lse, &infs, &at);
        CHECK(lerr <= ltol && infs == 0,
              "reference vs naive fp64: lse max err %.3g > tol %.3g or %lld -inf mismatches (row %lld)",
              lerr, ltol, (long long)infs, (long long)at);
    }

    {
        /* 2. the accuracy rule */
        int64_t at, infs;
        const double omax = max_abs(o_ref, n_o);
        double naive_o_err = 0.0;
        for (int64_t e = 0; e < n_o; e++) naive_o_err = fmax(naive_o_err, fabs(orc.os[e] - o_ref[e]));
        const double tol = 2.0 * naive_o_err + h_prop_ulps(c.out) * h_eps(c.out) * fmax(1.0, omax);
        const double naive_lse_err = lse_err(orc.lses, lse_ref, n_lse, &infs, &at);
        const double ltol = 2.0 * naive_lse_err +
                            h_prop_lse_ulps() * FLT_EPSILON * fmax(1.0, max_abs(lse_ref, n_lse));

        unsigned char *first_o = NULL, *first_lse = NULL;
        const size_t o_bytes = (size_t)n_o * h_dtype_bytes(c.out), lse_bytes = (size_t)n_lse * 4;
        const fa_algo algos[] = {FA_ALGO_FLASH, FA_ALGO_FLASH, FA_ALGO_FLASH, FA_ALGO_STANDARD};
        const int64_t threads[] = {1, 2, 3, c.threads};
        for (int run = 0; run < 4; run++) {
            h_case("%s algo=%s threads=%lld", desc, h_algo_str(algos[run]), (long long)threads[run]);
            h_poison_outputs(a);
            st = h_set_tiles(ctx, c.tile_q, c.tile_kv);
            if (st == FA_OK) st = h_run(ctx, algos[run], threads[run], a);
            if (!CHECK(st == FA_OK, "status %d (%s): %s", (int)st, fa_status_string(st),
                       fa_context_error(ctx)))
                continue;
            const double err = max_err(&a->o, o_ref, n_o, &at);
            double *worst = &g_worst[algos[run] == FA_ALGO_STANDARD][dtype_index(c.dt)];
            if (err / tol > *worst) *worst = err / tol;
            CHECK(err <= tol, "o max err %.3g > tol %.3g (naive same-precision err %.3g) at flat index %lld",
                  err, tol, naive_o_err, (long long)at);
            read_lse(&a->lse, lse_got);
            const double lerr = lse_err(lse_got, lse_ref, n_lse, &infs, &at);
            CHECK(lerr <= ltol && infs == 0,
                  "lse max err %.3g > tol %.3g (naive err %.3g) or %lld -inf mismatches (row %lld)",
                  lerr, ltol, naive_lse_err, (long long)infs, (long long)at);

            /* 3. determinism of flash across thread counts */
            if (algos[run] != FA_ALGO_FLASH) continue;
            if (!first_o) {
                first_o = malloc(o_bytes);
                first_lse = malloc(lse_bytes);
                memcpy(first_o, a->o.data, o_bytes);
                memcpy(first_lse, a->lse.data, lse_bytes);
            } else {
                CHECK(memcmp(first_o, a->o.data, o_bytes) == 0 && memcmp(first_lse, a->lse.data, lse_bytes) == 0,
                      "flash with %lld threads is not bitwise identical to flash with 1 thread",
                      (long long)threads[run]);
                if (threads[run] == 3) {
                    g_det_cases[dtype_index(c.dt)]++;
                    g_det_causal[dtype_index(c.dt)] += c.causal != FA_CAUSAL_NONE;
                }
            }
        }
        /* lse omitted: o must not change (index-selected subset of cases) */
        if (first_o && index % 4 == 0) {
            fa_forward_args na = *a;
            na.lse.data = NULL;
            h_case("%s algo=flash threads=%lld lse=NULL", desc, (long long)c.threads);
            h_poison_outputs(&na);
            st = h_run(ctx, FA_ALGO_FLASH, c.threads, &na);
            CHECK(st == FA_OK && memcmp(first_o, na.o.data, o_bytes) == 0,
                  "status %d; flash o without lse differs from flash o with lse", (int)st);
        }
        free(first_o);
        free(first_lse);
    }

done:
    free(orc.o64), free(orc.os), free(orc.lse64), free(orc.lses);
    free(o_ref), free(lse_ref), free(lse_got);
    free(ra.o.data), free(ra.lse.data);
    free(slopes);
    free(a->bias.data);
    free(a->mask.data);
    h_problem_free(&p);
}

/*
 * Determinism where the planner chooses the tiles: sequences long enough for several
 * K/V tiles and few enough (b, h) pairs that the planner may cut Q finer for more
 * threads. Whatever it picks, threads 1, 2 and 3 must give the same bits. No oracle
 * here (too long for the fp64 reference); accuracy is the sweep's job.
 */
static void test_planned_determinism(fa_context *ctx, uint64_t seed) {
    static const struct {
        h_dims d;
        fa_causal causal;
        int64_t wl, wr;
    } shapes[] = {
        {{1, 1024, 700, 1, 1, 128, 128}, FA_CAUSAL_NONE, -1, -1},
        {{1, 777, 1100, 2, 1, 64, 64}, FA_CAUSAL_BOTTOM_RIGHT, -1, -1},
        {{1, 600, 900, 1, 1, 96, 80}, FA_CAUSAL_NONE, 300, 40},
        {{2, 300, 2100, 1, 1, 32, 32}, FA_CAUSAL_TOP_LEFT, -1, -1},
    };
    h_rng r;
    h_rng_seed(&r, seed ^ 0xdeadbeefull);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int dt = 0; dt < 2; dt++) {
            const fa_dtype dtype = dt ? FA_DTYPE_BF16 : FA_DTYPE_F32;
            h_problem p;
            h_problem_alloc(&p, shapes[s].d, dtype, dtype);
            h_fill_normal(&p.args.q, &r, 1.0);
            h_fill_normal(&p.args.k, &r, 1.0);
            h_fill_normal(&p.args.v, &r, 1.0);
            p.args.causal = shapes[s].causal;
            p.args.window_left = shapes[s].wl;
            p.args.window_right = shapes[s].wr;
            const size_t o_bytes = (size_t)h_numel(&p.args.o) * h_dtype_bytes(dtype);
            const size_t lse_bytes = (size_t)h_numel(&p.args.lse) * 4;
            unsigned char *o1 = malloc(o_bytes), *lse1 = malloc(lse_bytes);
            /* threads 1, 2, 3, then 3 again: the same bits run to run as well (3 threads
             * take the q blocks in a different order each run) */
            static const int64_t runs[] = {1, 2, 3, 3};
            for (int run = 0; run < (int)(sizeof runs / sizeof runs[0]); run++) {
                const int64_t t = runs[run];
                h_case("planned-tile determinism: %s dtype=%s causal=%d window=(%lld,%lld) algo=flash "
                       "tiles=planned run %d threads=%lld vs the first run (threads=1)",
                       h_dims_str(&shapes[s].d), h_dtype_str(dtype), (int)shapes[s].causal,
                       (long long)shapes[s].wl, (long long)shapes[s].wr, run, (long long)t);
                fa_status st = h_set_tiles(ctx, 0, 0);
                if (st == FA_OK) st = h_run(ctx, FA_ALGO_FLASH, t, &p.args);
                if (!CHECK(st == FA_OK, "status %d: %s", (int)st, fa_context_error(ctx))) break;
                if (run == 0) {
                    memcpy(o1, p.args.o.data, o_bytes);
                    memcpy(lse1, p.args.lse.data, lse_bytes);
                    continue;
                }
                int64_t ndiff = 0;
                for (size_t e = 0; e < o_bytes; e++) ndiff += o1[e] != ((unsigned char *)p.args.o.data)[e];
                CHECK(ndiff == 0 && memcmp(lse1, p.args.lse.data, lse_bytes) == 0,
                      "flash output bytes differ from threads=1 (%lld of %zu o bytes; lse %s)",
                      (long long)ndiff, o_bytes, memcmp(lse1, p.args.lse.data, lse_bytes) ? "differs" : "same");
            }
            free(o1), free(lse1);
            h_problem_free(&p);
        }
}

/*
 * The fused bf16 forward's lse (FA_PARAM_BF16_FUSED, docs/semantics.md 5) against the
 * fp64 oracle, with the unfused path's error as the yardstick: |lse - lse_ref| <= 2 *
 * the unfused path's + h_prop_lse_ulps() ulps of max(1, max|lse_ref|). The random sweep
 * checks lse only against the naive bf16 attention (S rounded to bf16), a far looser
 * bound, which a bf16-accurate lse met while a backward fed by it missed its own. Rows
 * long enough for the wide tiles the fused kernel takes, causal both ways (bottom-right
 * with Sq > Sk: empty rows; some on tiles set here, several per row), GQA, D = 64, an odd D, Dv != D. On a path with the fused kernel (amx,
 * amx-model) the two settings must differ in their bits, else the test proved nothing.
 */
static void test_fused_lse(fa_context *ctx, uint64_t seed) {
    static const struct {
        h_dims d;
        fa_causal causal;
        int64_t wl, wr;
        double q_sigma;
        int64_t tile_q, tile_kv; /* 0: planned */
    } shapes[] = {
        {{1, 300, 700, 2, 1, 128, 128}, FA_CAUSAL_NONE, -1, -1, 1.0, 0, 0},
        {{1, 257, 600, 2, 2, 64, 64}, FA_CAUSAL_TOP_LEFT, -1, -1, 3.0, 64, 128},
        {{2, 400, 300, 1, 1, 96, 80}, FA_CAUSAL_BOTTOM_RIGHT, -1, -1, 1.0, 64, 128},
        {{1, 160, 500, 1, 1, 59, 130}, FA_CAUSAL_NONE, -1, -1, 0.3, 0, 0},
    };
    int64_t fused0 = 1; /* the setting to restore */
    fa_context_get(ctx, FA_PARAM_BF16_FUSED, &fused0);
    const char *isa = fa_context_isa(ctx);
    const int fused_table = isa && (strcmp(isa, "amx") == 0 || strcmp(isa, "amx-model") == 0);
    h_rng r;
    h_rng_seed(&r, seed ^ 0xf05edull);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const h_dims *d = &shapes[s].d;
        h_problem p;
        h_problem_alloc(&p, *d, FA_DTYPE_BF16, FA_DTYPE_F32); /* o in f32: the paths' differences show */
        fa_forward_args *a = &p.args;
        h_fill_normal(&a->q, &r, shapes[s].q_sigma);
        h_fill_normal(&a->k, &r, 1.0);
        h_fill_normal(&a->v, &r, 1.0);
        a->causal = shapes[s].causal;
        a->window_left = shapes[s].wl;
        a->window_right = shapes[s].wr;
        const int64_t n_o = d->B * d->Sq * d->Hq * d->Dv, n_lse = d->B * d->Hq * d->Sq;
        const size_t o_bytes = (size_t)n_o * 4;
        double *o64 = malloc(sizeof(double) * (size_t)n_o), *lse64 = malloc(sizeof(double) * (size_t)n_lse);
        double *lse_got[2] = {malloc(sizeof(double) * (size_t)n_lse), malloc(sizeof(double) * (size_t)n_lse)};
        unsigned char *o_got[2] = {malloc(o_bytes), malloc(o_bytes)};
        double smax;
        h_case("fused lse: %s causal=%d window=(%lld,%lld) bf16 (o f32) against the fp64 oracle and the unfused path",
               h_dims_str(d), (int)a->causal, (long long)a->window_left, (long long)a->window_right);
        CHECK(naive_forward(a, NAIVE_FP64, o64, lse64, &smax) == 0, "naive fp64 failed");
        int ok = 1;
        for (int fused = 0; fused < 2 && ok; fused++) {
            fa_status st = fa_context_set(ctx, FA_PARAM_BF16_FUSED, fused);
            if (st == FA_OK) st = h_set_tiles(ctx, shapes[s].tile_q, shapes[s].tile_kv);
            if (st == FA_OK) st = h_run(ctx, FA_ALGO_FLASH, 2, a);
            ok = CHECK(st == FA_OK, "fused=%d: status %d: %s", fused, (int)st, fa_context_error(ctx));
            if (!ok) break;
            read_lse(&a->lse, lse_got[fused]);
            memcpy(o_got[fused], a->o.data, o_bytes);
        }
        if (ok) {
            int64_t infs[2], at[2];
            const double e_unfused = lse_err(lse_got[0], lse64, n_lse, &infs[0], &at[0]);
            const double e_fused = lse_err(lse_got[1], lse64, n_lse, &infs[1], &at[1]);
            const double tol = 2.0 * e_unfused + h_prop_lse_ulps() * FLT_EPSILON * fmax(1.0, max_abs(lse64, n_lse));
            printf("fused lse: %s: max error %.3g fused, %.3g unfused, tolerance %.3g\n", h_dims_str(d), e_fused,
                   e_unfused, tol);
            CHECK(e_fused <= tol && infs[0] == 0 && infs[1] == 0,
                  "fused lse max err %.3g > tol %.3g (unfused %.3g) or -inf mismatches (%lld fused, %lld unfused)",
                  e_fused, tol, e_unfused, (long long)infs[1], (long long)infs[0]);
            if (fused_table)
                CHECK(memcmp(o_got[0], o_got[1], o_bytes) != 0, "o bitwise the same with and without the fused kernel");
        }
        fa_context_set(ctx, FA_PARAM_BF16_FUSED, fused0);
        h_set_tiles(ctx, 0, 0);
        free(o64), free(lse64), free(lse_got[0]), free(lse_got[1]), free(o_got[0]), free(o_got[1]);
        h_problem_free(&p);
    }
}

/*
 * Which cases run. Every ISA path runs this program (tests/CMakeLists.txt), and the
 * sanitizer build would take minutes per path at full size, so it compiles in
 * FA_TEST_SCALE < 1 (harness.h): then only one round in `stride` of the CASES_PER_CELL
 * rounds runs (a round holds one case per (D, dtype) cell, so every cell is still
 * covered), and each path takes a different residue, so that together the paths still
 * see about as many distinct cases as one full run. FA_TEST_SCALE=1 runs everything.
 */
static int round_stride(void) {
    const int stride = (int)floor(1.0 / h_test_scale() + 0.5);
    return stride < 1 ? 1 : stride > CASES_PER_CELL ? CASES_PER_CELL : stride;
}

/* The path's place in the library's own list (fa_isa_info), so that each path of a
 * scaled-down run takes other rounds and every path added later gets its own offset. */
static int isa_offset(const char *isa, int stride) {
    const char *name = NULL;
    for (int i = 0; fa_isa_info(i, &name, NULL) >= 0; i++)
        if (isa && name && strcmp(isa, name) == 0) return i % stride;
    return 0;
}

int main(void) {
    const uint64_t seed = h_env_u64("FA_TEST_SEED", 12345);
    const int64_t only = (int64_t)h_env_u64("FA_TEST_CASE", (uint64_t)-1);
    fa_context *ctx = NULL;
    fa_status st = h_context_create(&ctx);
    h_case("fa_context_create");
    if (!CHECK(st == FA_OK && ctx, "status %d (%s)", (int)st, fa_status_string(st))) return h_summary();
    const int ncases = NDS * 3 * CASES_PER_CELL;
    const int stride = round_stride(), offset = isa_offset(fa_context_isa(ctx), stride);
    if (stride > 1)
        printf("FA_TEST_SCALE=%g: running rounds r with (r + %d) %% %d == 0 of %d (all cells, fewer cases)\n",
               h_test_scale(), offset, stride, (int)CASES_PER_CELL);
    for (int index = 0; index < ncases; index++) {
        const int round = index / (NDS * 3);
        if (only == index || (only < 0 && (round + offset) % stride == 0)) run_case(ctx, seed, index);
    }
    if (only < 0) {
        h_case("determinism coverage of the random cases");
        CHECK(g_det_causal[0] > 0 && g_det_causal[2] > 0 && g_det_cases[2] > 0,
              "threads 1/2/3 compared on %d/%d/%d f32/f16/bf16 cases, %d/%d/%d of them causal: want causal f32 "
              "and causal bf16 among them",
              g_det_cases[0], g_det_cases[1], g_det_cases[2], g_det_causal[0], g_det_causal[1], g_det_causal[2]);
        test_planned_determinism(ctx, seed);
        test_fused_lse(ctx, seed);
    }
    fa_context_free(ctx);
    printf("worst o err/tol (f32 f16 bf16): flash %.3f %.3f %.3f, standard %.3f %.3f %.3f\n",
           g_worst[0][0], g_worst[0][1], g_worst[0][2], g_worst[1][0], g_worst[1][1], g_worst[1][2]);
    return h_summary();
}
