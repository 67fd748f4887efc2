/*
 * test_quant.c: FA_PARAM_QUANT_MATMUL, the forward's products on int8 codes
 * (docs/semantics.md, section 11).
 *
 *   setting   default 0, bounds, read back; fa_backward refuses a context with it on
 *             (and fa_backward_check says the same), writing nothing
 *   per call  fa_forward_args.quant_matmul: -1 takes the context's; v gives setting v's
 *             bits on any context; bad values refused; the backward follows the call's mode
 *   accuracy  decoding over int8 caches built here (K, V ~ N(0, 1), or K with outlier
 *             channels; quantised by the test's own rule, optionally after the caller
 *             smoothed K by its mean), D = 64, 128, 256, up to 32K keys: the error of
 *             each mode against an fp64 oracle of the cache's values (and of the float
 *             K/V before quantising), asserted against the bounds docs/semantics.md,
 *             section 11, publishes; next to it the error of P rounded to bf16 (what the
 *             exact bf16 path does). The forms: paged, GQA, several rows, causal,
 *             windows, softcap, sinks, split-KV; bitwise the same on 1 and 2 threads;
 *             where the path has the kernels the mode changes the bits, elsewhere it is
 *             ignored (the exact bits)
 *   strides   a paged bf16 cache with an inner stride: the unit stride's bits, every mode
 */
#include "harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static fa_context *g_ctx;

static float quant_row(const double *x, int64_t n, int8_t *code);
static int mode_applies(void);

static void test_setting(void)
{
    h_case("setting");
    int64_t v = -1;
    CHECK(fa_context_get(g_ctx, FA_PARAM_QUANT_MATMUL, &v) == FA_OK && v == 0, "default %lld", (long long)v);
    CHECK(fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, 3) == FA_ERR_INVALID_ARGUMENT, "3 accepted");
    CHECK(fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, -1) == FA_ERR_INVALID_ARGUMENT, "-1 accepted");
    for (int64_t m = 0; m <= 2; m++) {
        CHECK(fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, m) == FA_OK, "set %lld", (long long)m);
        CHECK(fa_context_get(g_ctx, FA_PARAM_QUANT_MATMUL, &v) == FA_OK && v == m, "got %lld", (long long)v);
    }

    /* the backward is refused with the mode on, before it writes anything */
    h_case("backward refused");
    const h_dims d = {1, 8, 8, 2, 2, 16, 16};
    h_problem p;
    h_problem_alloc(&p, d, FA_DTYPE_F32, FA_DTYPE_F32);
    h_rng r;
    h_rng_seed(&r, 7);
    h_fill_normal(&p.args.q, &r, 1.0), h_fill_normal(&p.args.k, &r, 1.0), h_fill_normal(&p.args.v, &r, 1.0);
    fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, 0);
    CHECK(h_run(g_ctx, FA_ALGO_AUTO, 1, &p.args) == FA_OK, "forward: %s", fa_context_error(g_ctx));
    fa_tensor dout = h_alloc(FA_DTYPE_F32, 1, 8, 2, 16), dq = h_alloc(FA_DTYPE_F32, 1, 8, 2, 16);
    h_fill_normal(&dout, &r, 1.0);
    h_fill(&dq, 12345.0);
    fa_backward_args b;
    fa_backward_args_init(&b);
    b.fwd = &p.args;
    b.do_ = dout;
    b.dq = dq;
    for (int64_t m = 1; m <= 2; m++) {
        fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, m);
        const fa_status st = fa_backward(g_ctx, &b), sc = fa_backward_check(g_ctx, &b);
        CHECK(st == FA_ERR_UNSUPPORTED && sc == st, "mode %lld: backward %d, check %d", (long long)m, st, sc);
        CHECK(strstr(fa_context_error(g_ctx), "FA_PARAM_QUANT_MATMUL") != NULL, "message: %s", fa_context_error(g_ctx));
        int untouched = 1;
        for (int64_t e = 0; e < h_numel(&dq); e++) untouched &= ((float *)dq.data)[e] == 12345.0f;
        CHECK(untouched, "mode %lld: dq written", (long long)m);
    }
    fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, 0);
    CHECK(fa_backward(g_ctx, &b) == FA_OK, "exact backward: %s", fa_context_error(g_ctx));
    free(dout.data), free(dq.data);
    h_problem_free(&p);
}

/* ------------------------------------------------------------- the per-call field */

/* fa_forward_args.quant_matmul (docs/semantics.md, section 11, "The call's mode"): a value
 * v gives the bits of field -1 on a context set to v, whatever the context's setting;
 * -2 and 3 are refused, naming the field, writing nothing; the backward refuses fwd args
 * whose mode is not 0 and takes a per-call 0 on an i8 context. */
static void test_per_call(void)
{
    h_case("per-call field");
    const int64_t D = 64, Sk = 300, Hq = 8, Hk = 2;
    h_rng r;
    h_rng_seed(&r, 31);
    fa_tensor kc = h_alloc(FA_DTYPE_I8, 1, Sk, Hk, D), vc = h_alloc(FA_DTYPE_I8, 1, Sk, Hk, D);
    fa_tensor ksc = h_alloc(FA_DTYPE_F32, 1, Sk, Hk, 1), vsc = h_alloc(FA_DTYPE_F32, 1, Sk, Hk, 1);
    double row[256];
    int8_t code[256];
    for (int kv = 0; kv < 2; kv++)
        for (int64_t j = 0; j < Sk; j++)
            for (int64_t g = 0; g < Hk; g++) {
                for (int64_t x = 0; x < D; x++) row[x] = h_rng_normal(&r);
                h_set(kv ? &vsc : &ksc, 0, j, g, 0, quant_row(row, D, code));
                for (int64_t x = 0; x < D; x++) ((int8_t *)(kv ? vc : kc).data)[h_offset(kv ? &vc : &kc, 0, j, g, x)] = code[x];
            }
    fa_tensor qt = h_alloc(FA_DTYPE_F32, 1, 1, Hq, D), ot = h_alloc(FA_DTYPE_F32, 1, 1, Hq, D);
    h_fill_normal(&qt, &r, 1.0);
    const int32_t seqlens[1] = {(int32_t)Sk};
    fa_kv_cache cache = FA_KV_CACHE_INIT;
    cache.k = kc, cache.v = vc, cache.k_scale = ksc, cache.v_scale = vsc, cache.seqlens = seqlens;
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    CHECK(a.quant_matmul == -1, "FA_FORWARD_ARGS_INIT's quant_matmul is %d", (int)a.quant_matmul);
    a.q = qt, a.o = ot, a.kv_cache = &cache;
    const size_t bytes = sizeof(float) * (size_t)(Hq * D);
    float *want[3];
    for (int m = 0; m < 3; m++) { /* the context's setting, field -1 */
        want[m] = malloc(bytes);
        fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, m);
        CHECK(h_run(g_ctx, FA_ALGO_AUTO, 1, &a) == FA_OK, "setting %d: %s", m, fa_context_error(g_ctx));
        memcpy(want[m], ot.data, bytes);
    }
    CHECK(memcmp(want[0], want[1], bytes) != 0 || !mode_applies(), "i8 keeps the exact bits on %s", fa_context_isa(g_ctx));
    for (int w = 0; w < 3; w++)
        for (int v = 0; v < 3; v++) {
            fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, w);
            a.quant_matmul = v;
            h_fill(&ot, -7.0);
            CHECK(h_run(g_ctx, FA_ALGO_AUTO, 2, &a) == FA_OK, "field %d, context %d: %s", v, w, fa_context_error(g_ctx));
            CHECK(memcmp(ot.data, want[v], bytes) == 0, "field %d on a context set to %d: not the bits of setting %d", v,
                  w, v);
        }
    static const int32_t bad[] = {-2, 3, INT32_MIN, INT32_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        a.quant_matmul = bad[i];
        h_fill(&ot, -7.0);
        const fa_status st = fa_forward(g_ctx, &a);
        CHECK(st == FA_ERR_INVALID_ARGUMENT && strstr(fa_context_error(g_ctx), "quant_matmul"), "%d: status %d (%s)",
              (int)bad[i], (int)st, fa_context_error(g_ctx));
        int untouched = 1;
        for (int64_t e = 0; e < Hq * D; e++) untouched &= ((float *)ot.data)[e] == -7.0f;
        CHECK(untouched, "%d: o written", (int)bad[i]);
    }
    for (int m = 0; m < 3; m++) free(want[m]);
    free(kc.data), free(vc.data), free(ksc.data), free(vsc.data), free(qt.data), free(ot.data);

    /* the backward: the call's mode decides */
    h_case("per-call field, backward");
    const h_dims d = {1, 8, 8, 2, 2, 16, 16};
    h_problem p;
    h_problem_alloc(&p, d, FA_DTYPE_F32, FA_DTYPE_F32);
    h_fill_normal(&p.args.q, &r, 1.0), h_fill_normal(&p.args.k, &r, 1.0), h_fill_normal(&p.args.v, &r, 1.0);
    fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, 0);
    CHECK(h_run(g_ctx, FA_ALGO_AUTO, 1, &p.args) == FA_OK, "forward: %s", fa_context_error(g_ctx));
    fa_tensor dout = h_alloc(FA_DTYPE_F32, 1, 8, 2, 16), dq = h_alloc(FA_DTYPE_F32, 1, 8, 2, 16);
    h_fill_normal(&dout, &r, 1.0);
    fa_backward_args b;
    fa_backward_args_init(&b);
    b.fwd = &p.args, b.do_ = dout, b.dq = dq;
    for (int v = 1; v <= 2; v++) {
        p.args.quant_matmul = v;
        h_fill(&dq, 12345.0);
        const fa_status st = fa_backward(g_ctx, &b);
        CHECK(st == FA_ERR_UNSUPPORTED && strstr(fa_context_error(g_ctx), "quant_matmul"), "field %d on an exact "
              "context: backward %d (%s)", v, (int)st, fa_context_error(g_ctx));
        int untouched = 1;
        for (int64_t e = 0; e < h_numel(&dq); e++) untouched &= ((float *)dq.data)[e] == 12345.0f;
        CHECK(untouched, "field %d: dq written", v);
    }
    p.args.quant_matmul = 0;
    fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, 1);
    CHECK(fa_backward(g_ctx, &b) == FA_OK, "field 0 on an i8 context: %s", fa_context_error(g_ctx));
    fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, 0);
    free(dout.data), free(dq.data);
    h_problem_free(&p);
}

/* ------------------------------------------------------------- accuracy */

typedef struct qcase {
    int64_t D, Sk, Sq, Hq, Hk;
    int outliers;   /* K with outlier channels (a common offset of 12 in D/16 channels) */
    int smooth;     /* the caller subtracts K's mean over the keys before quantising */
    int paged;      /* pages of 16 keys, shuffled */
    int causal;     /* bottom-right causal (Sq > 1) */
    int64_t window; /* left window, or -1 */
    float softcap;
    int sinks;
    int64_t splits; /* FA_PARAM_KV_SPLITS, 0 = planned */
    int mla;        /* a latent cache (v_in_k): V is K's rows, Dv = D */
} qcase;

typedef struct qresult {
    double err[3], lse_err[3]; /* per mode: max|o - o_ref| / max|o_ref|, max|lse - lse_ref| */
    double bf16_err;           /* P rounded to bf16, same oracle */
    double float_err[3];       /* against the fp64 attention of the float K, V before quantising */
    int differs[3];            /* the mode's bits differ from mode 0's */
    int threads_same;          /* 1 and 2 threads give the same bits, every mode */
    double fused_lse;          /* prefill, i8: max |lse - lse'| / max(1, |lse|) with FA_PARAM_BF16_FUSED flipped */
} qresult;

/* The test's own int8 quantiser (docs/semantics.md, section 8): scale = max|x| / 127, codes
 * x * (1 / scale) rounded to nearest even, clamped. */
static float quant_row(const double *x, int64_t n, int8_t *code)
{
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++)
        if (fabsf((float)x[i]) > amax) amax = fabsf((float)x[i]);
    const float sc = amax / 127.0f, inv = sc > 0.0f ? 1.0f / sc : 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float y = nearbyintf((float)x[i] * inv);
        code[i] = (int8_t)(y > 127.0f ? 127.0f : y < -127.0f ? -127.0f : y);
    }
    return sc;
}

/* fp64 attention of row i of head h over keys kv[j][g][x] (any values), section 3's rules. */
static double oracle_row(const qcase *c, const float *q, const double *kv_k, const double *kv_v, const float *sinks,
                         int64_t h, int64_t i, double *o, double *bf16_o)
{
    const int64_t D = c->D, g = h / (c->Hq / c->Hk), diag = i + c->Sk - c->Sq;
    const double scale = 1.0 / sqrt((double)D);
    double *sc = malloc(sizeof(double) * (size_t)c->Sk);
    double m = -INFINITY;
    for (int64_t j = 0; j < c->Sk; j++) {
        const int kept = (!c->causal || j <= diag) && (c->window < 0 || j >= diag - c->window);
        double s = 0;
        for (int64_t x = 0; x < D; x++) s += (double)q[(i * c->Hq + h) * D + x] * kv_k[(j * c->Hk + g) * D + x];
        s *= scale;
        if (c->softcap > 0) s = c->softcap * tanh(s / c->softcap);
        sc[j] = kept ? s : -INFINITY;
        if (sc[j] > m) m = sc[j];
    }
    const double sink = sinks ? sinks[h] : -INFINITY;
    if (sink > m) m = sink;
    double l = exp(sink - m);
    for (int64_t j = 0; j < c->Sk; j++) l += exp(sc[j] - m);
    const double lse = m + log(l);
    for (int64_t e = 0; e < D; e++) o[e] = bf16_o[e] = 0;
    for (int64_t j = 0; j < c->Sk; j++) {
        if (sc[j] == -INFINITY) continue;
        const double p = exp(sc[j] - lse), pb = h_bf16_to_f32(h_f32_to_bf16((float)p));
        for (int64_t e = 0; e < D; e++) {
            o[e] += p * kv_v[(j * c->Hk + g) * D + e];
            bf16_o[e] += pb * kv_v[(j * c->Hk + g) * D + e];
        }
    }
    free(sc);
    return lse;
}

static void run_case(const qcase *c, uint64_t seed, qresult *res)
{
    const int64_t D = c->D, Sk = c->Sk, Sq = c->Sq, Hq = c->Hq, Hk = c->Hk, n = Sk * Hk * D;
    h_rng r;
    h_rng_seed(&r, seed);
    float *q = malloc(sizeof(float) * (size_t)(Sq * Hq * D));
    for (int64_t e = 0; e < Sq * Hq * D; e++) q[e] = (float)h_rng_normal(&r);
    double *kf = malloc(sizeof(double) * (size_t)n), *vf = malloc(sizeof(double) * (size_t)n);
    for (int64_t e = 0; e < n; e++) {
        kf[e] = (float)h_rng_normal(&r) + (c->outliers && (e % D) % 16 == 5 ? 12.0 : 0.0);
        vf[e] = (float)h_rng_normal(&r);
    }
    /* what goes into the cache: K, or K minus its mean over the keys (per kv head) */
    double *ks = malloc(sizeof(double) * (size_t)n);
    memcpy(ks, kf, sizeof(double) * (size_t)n);
    if (c->smooth)
        for (int64_t g = 0; g < Hk; g++)
            for (int64_t x = 0; x < D; x++) {
                double mean = 0;
                for (int64_t j = 0; j < Sk; j++) mean += kf[(j * Hk + g) * D + x];
                mean /= (double)Sk;
                for (int64_t j = 0; j < Sk; j++) ks[(j * Hk + g) * D + x] -= (float)mean;
            }
    /* the cache: codes and per-(token, head) scales; its values, dequantised */
    const int64_t page = 16, pages = (Sk + page - 1) / page, rows_alloc = pages * page;
    fa_tensor kc = h_alloc(FA_DTYPE_I8, c->paged ? pages : 1, c->paged ? page : rows_alloc, Hk, D);
    fa_tensor vc = h_alloc(FA_DTYPE_I8, kc.shape[0], kc.shape[1], Hk, D);
    fa_tensor ksc = h_alloc(FA_DTYPE_F32, kc.shape[0], kc.shape[1], Hk, 1), vsc = h_alloc(FA_DTYPE_F32, kc.shape[0], kc.shape[1], Hk, 1);
    int32_t *table = malloc(sizeof(int32_t) * (size_t)pages);
    for (int64_t p = 0; p < pages; p++) table[p] = (int32_t)p;
    for (int64_t p = pages - 1; p > 0; p--) {
        const int64_t j = h_rng_int(&r, 0, p);
        const int32_t t = table[p];
        table[p] = table[j], table[j] = t;
    }
    double *kd = malloc(sizeof(double) * (size_t)n), *vd = malloc(sizeof(double) * (size_t)n);
    int8_t *code = malloc((size_t)D);
    for (int64_t j = 0; j < Sk; j++)
        for (int64_t g = 0; g < Hk; g++) {
            const int64_t b0 = c->paged ? table[j / page] : 0, r0 = c->paged ? j % page : j;
            for (int kv = 0; kv < 2; kv++) {
                if (kv && c->mla) { /* V is K's row: its values, and the cache's */
                    memcpy(vf + (j * Hk + g) * D, kf + (j * Hk + g) * D, sizeof(double) * (size_t)D);
                    memcpy(vd + (j * Hk + g) * D, kd + (j * Hk + g) * D, sizeof(double) * (size_t)D);
                    continue;
                }
                const double *src = (kv ? vf : ks) + (j * Hk + g) * D;
                const float s = quant_row(src, D, code);
                h_set(kv ? &vsc : &ksc, b0, r0, g, 0, s);
                for (int64_t x = 0; x < D; x++) {
                    ((int8_t *)(kv ? vc : kc).data)[h_offset(kv ? &vc : &kc, b0, r0, g, x)] = code[x];
                    (kv ? vd : kd)[(j * Hk + g) * D + x] = (double)s * code[x];
                }
            }
        }
    float *sinks = NULL;
    if (c->sinks) {
        sinks = malloc(sizeof(float) * (size_t)Hq);
        for (int64_t h = 0; h < Hq; h++) sinks[h] = (float)h_rng_range(&r, -1.0, 3.0);
    }
    /* oracles */
    double *oref = malloc(sizeof(double) * (size_t)(Sq * Hq * D)), *obf = malloc(sizeof(double) * (size_t)(Sq * Hq * D));
    double *ofl = malloc(sizeof(double) * (size_t)(Sq * Hq * D)), *tmp = malloc(sizeof(double) * (size_t)D);
    double *lref = malloc(sizeof(double) * (size_t)(Sq * Hq));
    double omax = 0, bf16_err = 0, omax_f = 0;
    for (int64_t i = 0; i < Sq; i++)
        for (int64_t h = 0; h < Hq; h++) {
            double *o = oref + (i * Hq + h) * D;
            lref[i * Hq + h] = oracle_row(c, q, kd, vd, sinks, h, i, o, obf + (i * Hq + h) * D);
            oracle_row(c, q, kf, vf, sinks, h, i, ofl + (i * Hq + h) * D, tmp);
            for (int64_t e = 0; e < D; e++) {
                omax = fmax(omax, fabs(o[e]));
                omax_f = fmax(omax_f, fabs(ofl[(i * Hq + h) * D + e]));
                bf16_err = fmax(bf16_err, fabs(obf[(i * Hq + h) * D + e] - o[e]));
            }
        }
    res->bf16_err = bf16_err / omax;

    fa_tensor qt = h_alloc(FA_DTYPE_F32, 1, Sq, Hq, D), ot = h_alloc(FA_DTYPE_F32, 1, Sq, Hq, D);
    fa_tensor lt = h_alloc(FA_DTYPE_F32, 1, Hq, Sq, 1);
    memcpy(qt.data, q, sizeof(float) * (size_t)(Sq * Hq * D));
    const int32_t seqlens[1] = {(int32_t)Sk};
    fa_kv_cache cache = FA_KV_CACHE_INIT;
    cache.k = kc, cache.v = vc, cache.k_scale = ksc, cache.v_scale = vsc, cache.seqlens = seqlens;
    if (c->paged) cache.block_table = table, cache.max_pages = pages;
    if (c->mla) cache.v = (fa_tensor){0}, cache.v_scale = (fa_tensor){0}, cache.v_in_k = 1;
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = qt, a.o = ot, a.lse = lt, a.kv_cache = &cache;
    a.causal = c->causal ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
    a.window_left = c->window;
    a.softcap = c->softcap;
    a.sinks = sinks;
    float *o0 = malloc(sizeof(float) * (size_t)(Sq * Hq * D)), *om = malloc(sizeof(float) * (size_t)(Sq * Hq * D));
    res->threads_same = 1;
    fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, c->splits);
    for (int mode = 0; mode < 3; mode++) {
        fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, mode);
        for (int th = 2; th >= 1; th--) {
            const fa_status st = h_run(g_ctx, FA_ALGO_AUTO, th, &a);
            CHECK(st == FA_OK, "mode %d: %s", mode, fa_context_error(g_ctx));
            if (th == 2) memcpy(om, ot.data, sizeof(float) * (size_t)(Sq * Hq * D));
            else res->threads_same &= memcmp(om, ot.data, sizeof(float) * (size_t)(Sq * Hq * D)) == 0;
        }
        if (mode == 0) memcpy(o0, om, sizeof(float) * (size_t)(Sq * Hq * D));
        res->differs[mode] = memcmp(o0, om, sizeof(float) * (size_t)(Sq * Hq * D)) != 0;
        double err = 0, ferr = 0, lerr = 0;
        for (int64_t e = 0; e < Sq * Hq * D; e++) {
            err = fmax(err, fabs((double)om[e] - oref[e]));
            ferr = fmax(ferr, fabs((double)om[e] - ofl[e]));
            if (isnan(om[e])) err = ferr = INFINITY;
        }
        for (int64_t i = 0; i < Sq; i++)
            for (int64_t h = 0; h < Hq; h++) {
                const double l = (double)((float *)lt.data)[h * Sq + i], want = lref[i * Hq + h];
                lerr = fmax(lerr, isnan(l) ? INFINITY : fabs(l - want));
            }
        res->err[mode] = err / omax;
        res->float_err[mode] = ferr / omax_f;
        res->lse_err[mode] = lerr;
    }
    fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, 0);
    fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, 0);
    free(q), free(kf), free(vf), free(ks), free(kd), free(vd), free(code), free(sinks), free(table);
    free(oref), free(obf), free(ofl), free(tmp), free(lref), free(o0), free(om);
    free(kc.data), free(vc.data), free(ksc.data), free(vsc.data), free(qt.data), free(ot.data), free(lt.data);
}

/* The documented bounds (docs/semantics.md, section 11), per mode: exact (checked apart), i8, i8x2. */
static const double BOUND_O[3] = {0, 4e-2, 2.5e-4}, BOUND_LSE[3] = {0, 8e-3, 4e-5};
static const double BOUND_O_OUTLIER[3] = {0, 4e-2, 2.5e-4}, BOUND_LSE_OUTLIER[3] = {0, 0.15, 5e-4};

/* The paths whose tables have the int8 kernels (FA_KERNELS_I8_DOT): the mode changes the
 * bits there, and is ignored (the exact bits) elsewhere. */
static int mode_applies(void)
{
    static const char *const with[] = {"ref", "avx2vnni", "avx512bf16", "amx", "amx-model"};
    for (size_t i = 0; i < sizeof with / sizeof with[0]; i++)
        if (strcmp(fa_context_isa(g_ctx), with[i]) == 0) return 1;
    return 0;
}

/* bound[m]: o's bound of mode m (1 i8, 2 i8x2); lse[m] likewise */
static void check_result(const qcase *c, const qresult *q, const char *what, const double bound[3], const double lse[3])
{
    const int applies = mode_applies();
    CHECK(q->threads_same, "%s: 1 and 2 threads differ", what);
    CHECK(q->err[0] <= 1e-5 && q->lse_err[0] <= 1e-4, "%s: exact mode's error %.3g (lse %.3g)", what, q->err[0],
          q->lse_err[0]);
    for (int m = 1; m < 3; m++) {
        CHECK(q->differs[m] == applies, "%s: mode %d %s the exact bits on %s", what, m,
              q->differs[m] ? "changes" : "keeps", fa_context_isa(g_ctx));
        CHECK(q->err[m] <= bound[m] && q->lse_err[m] <= lse[m],
              "%s (D %lld, Sk %lld): mode %d error %.3g (bound %.3g), lse %.3g (bound %.3g)", what, (long long)c->D,
              (long long)c->Sk, m, q->err[m], bound[m], q->lse_err[m], lse[m]);
    }
}

static void test_accuracy(void)
{
    printf("relative error max|o - o_ref| / max|o_ref| against fp64 (the cache's values); lse absolute; "
           "'float' against the float K, V before quantising\n");
    printf("%-22s %5s %6s | %9s %9s %9s | %9s | %9s %9s | %9s %9s %9s\n", "K", "D", "Sk", "exact", "i8", "i8x2",
           "bf16 P", "lse i8", "lse i8x2", "float ex", "float i8", "flt i8x2");
    static const char *const kname[3] = {"N(0,1)", "outlier channels", "outliers, smoothed"};
    for (int kind = 0; kind < 3; kind++)
        for (int64_t D = 64; D <= 256; D *= 2)
            for (int64_t Sk = 4096; Sk <= 32768; Sk *= 8) {
                if (Sk > 4096 && (D != 128 || h_test_scale() < 1)) continue;
                const qcase c = {D, Sk, 1, 8, 2, kind > 0, kind == 2, 0, 0, -1, 0.0f, 0, 0, 0};
                qresult q;
                h_case("accuracy %s D=%lld Sk=%lld", kname[kind], (long long)D, (long long)Sk);
                run_case(&c, 1000 + (uint64_t)(kind * 7 + D + Sk), &q);
                printf("%-22s %5lld %6lld | %9.2e %9.2e %9.2e | %9.2e | %9.2e %9.2e | %9.2e %9.2e %9.2e\n",
                       kname[kind], (long long)D, (long long)Sk, q.err[0], q.err[1], q.err[2], q.bf16_err, q.lse_err[1],
                       q.lse_err[2], q.float_err[0], q.float_err[1], q.float_err[2]);
                check_result(&c, &q, kname[kind], kind ? BOUND_O_OUTLIER : BOUND_O, kind ? BOUND_LSE_OUTLIER : BOUND_LSE);
                /* two digits: within 4x the error of P rounded to bf16 */
                CHECK(q.err[2] <= 4 * q.bf16_err, "%s D %lld: i8x2 error %.3g, 4x bf16 P's %.3g", kname[kind],
                      (long long)D, q.err[2], 4 * q.bf16_err);
            }
}

static void test_forms(void)
{
    static const struct {
        const char *what;
        qcase c;
    } forms[] = {
        {"paged", {128, 1000, 1, 8, 2, 0, 0, 1, 0, -1, 0.0f, 0, 0, 0}},
        {"two rows, causal, GQA 4", {128, 777, 2, 8, 2, 0, 0, 0, 1, -1, 0.0f, 0, 0, 0}},
        {"window 100", {64, 900, 1, 4, 4, 0, 0, 0, 1, 100, 0.0f, 0, 0, 0}},
        {"softcap 5", {64, 600, 1, 4, 1, 0, 0, 1, 0, -1, 5.0f, 0, 0, 0}},
        {"sinks", {128, 700, 1, 8, 1, 0, 0, 0, 0, -1, 0.0f, 1, 0, 0}},
        {"split-KV 3", {256, 2000, 1, 4, 2, 0, 0, 1, 0, -1, 0.0f, 1, 3, 0}},
        {"D 100, eight rows", {100, 513, 1, 8, 1, 0, 0, 0, 0, -1, 0.0f, 0, 0, 0}},
        {"MLA latent, paged", {192, 600, 1, 8, 1, 0, 0, 1, 0, -1, 0.0f, 0, 0, 1}},
    };
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        qresult q;
        h_case("form %s", forms[i].what);
        run_case(&forms[i].c, 77 + i, &q);
        printf("form %-26s exact %.2e  i8 %.2e  i8x2 %.2e  (lse %.2e %.2e)\n", forms[i].what, q.err[0], q.err[1],
               q.err[2], q.lse_err[1], q.lse_err[2]);
        check_result(&forms[i].c, &q, forms[i].what, BOUND_O, BOUND_LSE);
    }
}

/* ------------------------------------------------------------- prefill (the wide path) */

typedef struct pcase {
    qcase c;        /* shapes and rules (c.smooth, c.paged, c.splits, c.mla unused) */
    fa_dtype dtype; /* q, k, v: f32 or bf16 */
    int form;       /* 0 dense, 1 varlen (two copies of the sequence), 2 paged f32 cache, 3 int8 cache */
} pcase;

enum { P_DENSE, P_VARLEN, P_PAGED, P_INT8 };

/* Prefill: Sq query rows (the last Sq of the Sk positions) over Sk keys, each mode's
 * error against the fp64 attention of the values the call sees (every 'step'th row),
 * next to the error of P rounded to bf16 against the same oracle. res as run_case's. */
static void run_prefill(const pcase *pc, uint64_t seed, qresult *res)
{
    const qcase *c = &pc->c;
    const int64_t D = c->D, Sk = c->Sk, Sq = c->Sq, Hq = c->Hq, Hk = c->Hk, nkv = Sk * Hk * D, nq = Sq * Hq * D;
    const int copies = pc->form == P_VARLEN ? 2 : 1;
    h_rng r;
    h_rng_seed(&r, seed);
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = h_alloc(pc->dtype, 1, copies * Sq, Hq, D);
    a.o = h_alloc(FA_DTYPE_F32, 1, copies * Sq, Hq, D);
    a.lse = h_alloc(FA_DTYPE_F32, 1, Hq, copies * Sq, 1);
    float *q = malloc(sizeof(float) * (size_t)nq);
    double *kd = malloc(sizeof(double) * (size_t)nkv), *vd = malloc(sizeof(double) * (size_t)nkv);
    for (int64_t i = 0; i < Sq; i++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t x = 0; x < D; x++) {
                h_set(&a.q, 0, i, h, x, h_rng_normal(&r));
                q[(i * Hq + h) * D + x] = (float)h_get(&a.q, 0, i, h, x);
                if (copies == 2) h_set(&a.q, 0, Sq + i, h, x, q[(i * Hq + h) * D + x]);
            }
    /* K, V as the call holds them (rounded to the dtype, or an int8 cache's codes) */
    const int64_t page = 32, pages = (Sk + page - 1) / page;
    fa_kv_cache cache = FA_KV_CACHE_INIT;
    int32_t *table = NULL, seqlens[1] = {(int32_t)Sk}, cu_q[3] = {0, (int32_t)Sq, (int32_t)(2 * Sq)},
            cu_k[3] = {0, (int32_t)Sk, (int32_t)(2 * Sk)};
    fa_tensor kt, vt, ksc = {0}, vsc = {0};
    if (pc->form == P_PAGED) {
        kt = h_alloc(FA_DTYPE_F32, pages, page, Hk, D), vt = h_alloc(FA_DTYPE_F32, pages, page, Hk, D);
        table = malloc(sizeof(int32_t) * (size_t)pages);
        for (int64_t p = 0; p < pages; p++) table[p] = (int32_t)(pages - 1 - p);
    } else if (pc->form == P_INT8) {
        kt = h_alloc(FA_DTYPE_I8, 1, Sk, Hk, D), vt = h_alloc(FA_DTYPE_I8, 1, Sk, Hk, D);
        ksc = h_alloc(FA_DTYPE_F32, 1, Sk, Hk, 1), vsc = h_alloc(FA_DTYPE_F32, 1, Sk, Hk, 1);
    } else {
        kt = h_alloc(pc->dtype, 1, copies * Sk, Hk, D), vt = h_alloc(pc->dtype, 1, copies * Sk, Hk, D);
    }
    double row[1024];
    int8_t code[1024];
    for (int kv = 0; kv < 2; kv++)
        for (int64_t j = 0; j < Sk; j++)
            for (int64_t g = 0; g < Hk; g++) {
                const fa_tensor *t = kv ? &vt : &kt;
                double *dst = (kv ? vd : kd) + (j * Hk + g) * D;
                for (int64_t x = 0; x < D; x++)
                    row[x] = h_rng_normal(&r) + (!kv && c->outliers && x % 16 == 5 ? 12.0 : 0.0);
                const int64_t b0 = pc->form == P_PAGED ? table[j / page] : 0, r0 = pc->form == P_PAGED ? j % page : j;
                if (pc->form == P_INT8) {
                    const float sc = quant_row(row, D, code);
                    h_set(kv ? &vsc : &ksc, 0, j, g, 0, sc);
                    for (int64_t x = 0; x < D; x++) {
                        ((int8_t *)t->data)[h_offset(t, 0, j, g, x)] = code[x];
                        dst[x] = (double)sc * code[x];
                    }
                    continue;
                }
                for (int64_t x = 0; x < D; x++) {
                    h_set(t, b0, r0, g, x, row[x]);
                    dst[x] = h_get(t, b0, r0, g, x);
                    if (copies == 2) h_set(t, 0, Sk + j, g, x, dst[x]);
                }
            }
    if (pc->form == P_PAGED || pc->form == P_INT8) {
        cache.k = kt, cache.v = vt, cache.seqlens = seqlens;
        if (table) cache.block_table = table, cache.max_pages = pages;
        if (pc->form == P_INT8) cache.k_scale = ksc, cache.v_scale = vsc;
        a.kv_cache = &cache;
    } else {
        a.k = kt, a.v = vt;
    }
    if (copies == 2) a.cu_seqlens_q = cu_q, a.cu_seqlens_k = cu_k, a.num_seqs = 2;
    float *sinks = NULL;
    if (c->sinks) {
        sinks = malloc(sizeof(float) * (size_t)Hq);
        for (int64_t h = 0; h < Hq; h++) sinks[h] = (float)h_rng_range(&r, -1.0, 3.0);
    }
    a.causal = c->causal ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
    a.window_left = c->window;
    a.softcap = c->softcap;
    a.sinks = sinks;
    /* the oracle, on every step'th row (a long row costs Sk * D) */
    const int64_t step = Sq * Sk > (int64_t)1 << 20 ? 7 : 1;
    double *oref = malloc(sizeof(double) * (size_t)nq), *obf = malloc(sizeof(double) * (size_t)nq);
    double *lref = malloc(sizeof(double) * (size_t)(Sq * Hq));
    double omax = 0, bf16_err = 0;
    for (int64_t i = 0; i < Sq; i += step)
        for (int64_t h = 0; h < Hq; h++) {
            double *o = oref + (i * Hq + h) * D;
            lref[i * Hq + h] = oracle_row(c, q, kd, vd, sinks, h, i, o, obf + (i * Hq + h) * D);
            for (int64_t e = 0; e < D; e++) {
                omax = fmax(omax, fabs(o[e]));
                bf16_err = fmax(bf16_err, fabs(obf[(i * Hq + h) * D + e] - o[e]));
            }
        }
    res->bf16_err = bf16_err / omax;
    /* the exact bf16 path as it computes on tiles: q, K and V rounded to bf16 (f32 inputs),
     * then P rounded to bf16, against the same oracle */
    double path_err = 0;
    if (pc->dtype == FA_DTYPE_F32 && pc->form != P_INT8) {
        float *qb = malloc(sizeof(float) * (size_t)nq);
        double *kb = malloc(sizeof(double) * (size_t)nkv), *vb = malloc(sizeof(double) * (size_t)nkv);
        double *tmp = malloc(sizeof(double) * (size_t)D), *ob = malloc(sizeof(double) * (size_t)D);
        for (int64_t e = 0; e < nq; e++) qb[e] = h_bf16_to_f32(h_f32_to_bf16(q[e]));
        for (int64_t e = 0; e < nkv; e++)
            kb[e] = h_bf16_to_f32(h_f32_to_bf16((float)kd[e])), vb[e] = h_bf16_to_f32(h_f32_to_bf16((float)vd[e]));
        for (int64_t i = 0; i < Sq; i += step)
            for (int64_t h = 0; h < Hq; h++) {
                oracle_row(c, qb, kb, vb, sinks, h, i, tmp, ob);
                for (int64_t e = 0; e < D; e++) path_err = fmax(path_err, fabs(ob[e] - oref[(i * Hq + h) * D + e]));
            }
        free(qb), free(kb), free(vb), free(tmp), free(ob);
    }
    res->float_err[0] = path_err / omax;
    const size_t obytes = sizeof(float) * (size_t)(copies * nq);
    float *o0 = malloc(obytes), *om = malloc(obytes);
    res->threads_same = 1;
    for (int mode = 0; mode < 3; mode++) {
        a.quant_matmul = mode;
        for (int th = 2; th >= 1; th--) {
            const fa_status st = h_run(g_ctx, FA_ALGO_AUTO, th, &a);
            CHECK(st == FA_OK, "mode %d: %s", mode, fa_context_error(g_ctx));
            if (th == 2) memcpy(om, a.o.data, obytes);
            else res->threads_same &= memcmp(om, a.o.data, obytes) == 0;
        }
        if (mode == 0) memcpy(o0, om, obytes);
        res->differs[mode] = memcmp(o0, om, obytes) != 0;
        double err = 0, lerr = 0;
        for (int cp = 0; cp < copies; cp++)
            for (int64_t i = 0; i < Sq; i += step)
                for (int64_t h = 0; h < Hq; h++) {
                    for (int64_t e = 0; e < D; e++) {
                        const float g = om[((cp * Sq + i) * Hq + h) * D + e];
                        err = fmax(err, isnan(g) ? INFINITY : fabs((double)g - oref[(i * Hq + h) * D + e]));
                    }
                    const double l = h_get(&a.lse, 0, h, cp * Sq + i, 0);
                    lerr = fmax(lerr, isnan(l) ? INFINITY : fabs(l - lref[i * Hq + h]));
                }
        res->err[mode] = err / omax;
        res->lse_err[mode] = lerr;
    }
    /* i8 with the fused forward flipped (fwd_i8 against flash_task_q8's small-row kernels
     * on a table with both; elsewhere the same path), and with the bf16 dot products off
     * (bf16 inputs: qk_i8's route, flash_task_i8p, against the small-row kernels on a
     * table with qk_i8; elsewhere the same path): the same scores bit for bit, so the
     * lse differs only by the exps' rounding (fwd_bf16's, section 5; the wide softmax's
     * against the small-row one's), far below the quantisation error the bounds above
     * allow. A wrong key code, sum or scale shows here. */
    res->fused_lse = 0;
    int64_t fused = 1, dot = 0;
    CHECK(fa_context_get(g_ctx, FA_PARAM_BF16_FUSED, &fused) == FA_OK, "FA_PARAM_BF16_FUSED");
    CHECK(fa_context_get(g_ctx, FA_PARAM_BF16_DOT, &dot) == FA_OK, "FA_PARAM_BF16_DOT");
    a.quant_matmul = 1;
    float *lse2 = malloc(sizeof(float) * (size_t)(copies * Sq * Hq));
    for (int flip = 0; flip < 3; flip++) {
        CHECK(fa_context_set(g_ctx, FA_PARAM_BF16_FUSED, flip == 1 ? !fused : fused) == FA_OK, "FA_PARAM_BF16_FUSED");
        CHECK(fa_context_set(g_ctx, FA_PARAM_BF16_DOT, flip == 2 ? 2 : dot) == FA_OK, "FA_PARAM_BF16_DOT");
        CHECK(h_run(g_ctx, FA_ALGO_AUTO, 2, &a) == FA_OK, "i8: %s", fa_context_error(g_ctx));
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < copies * Sq; i++) {
                const double l = h_get(&a.lse, 0, h, i, 0);
                float *keep = lse2 + h * copies * Sq + i;
                if (!flip) *keep = (float)l;
                else res->fused_lse = fmax(res->fused_lse, isnan(l) != isnan(*keep) ? INFINITY
                                                           : isnan(l) ? 0 : fabs(l - *keep) / fmax(1.0, fabs(l)));
            }
    }
    CHECK(fa_context_set(g_ctx, FA_PARAM_BF16_FUSED, fused) == FA_OK, "FA_PARAM_BF16_FUSED");
    CHECK(fa_context_set(g_ctx, FA_PARAM_BF16_DOT, dot) == FA_OK, "FA_PARAM_BF16_DOT");
    free(lse2);
    free(q), free(kd), free(vd), free(table), free(sinks), free(oref), free(obf), free(lref), free(o0), free(om);
    free(a.q.data), free(a.o.data), free(a.lse.data), free(kt.data), free(vt.data), free(ksc.data), free(vsc.data);
}

/* The prefill bounds (docs/semantics.md, section 11, "Accuracy"), per mode: o relative,
 * lse absolute; and i8x2 within 4x the error of P rounded to bf16 and of the whole exact
 * bf16 path (inputs and P rounded), where there is one (f32 inputs). */
static const double P_O[3] = {0, 4e-2, 2.5e-4}, P_LSE[3] = {0, 4e-2, 4e-4};

static void check_prefill(const pcase *pc, const qresult *q, const char *what)
{
    const int applies = mode_applies();
    CHECK(q->threads_same, "%s: 1 and 2 threads differ", what);
    /* the exact mode: f32 products, or (bf16 inputs on a bf16 dot-product path) P as bf16,
     * and with the fused bf16 forward a bf16-accurate lse (docs/semantics.md, section 5) */
    const int b16 = pc->dtype == FA_DTYPE_BF16;
    const double exact = b16 ? 2 * q->bf16_err + 1e-5 : 1e-5, exact_lse = b16 ? 4e-3 : 1e-4;
    CHECK(q->err[0] <= exact && q->lse_err[0] <= exact_lse, "%s: exact mode's error %.3g (lse %.3g)", what, q->err[0],
          q->lse_err[0]);
    for (int m = 1; m < 3; m++) {
        CHECK(q->differs[m] == applies, "%s: mode %d %s the exact bits on %s", what, m,
              q->differs[m] ? "changes" : "keeps", fa_context_isa(g_ctx));
        CHECK(q->err[m] <= P_O[m] && q->lse_err[m] <= P_LSE[m], "%s (D %lld, Sk %lld): mode %d error %.3g (bound %.3g), "
              "lse %.3g (bound %.3g)", what, (long long)pc->c.D, (long long)pc->c.Sk, m, q->err[m], P_O[m],
              q->lse_err[m], P_LSE[m]);
    }
    CHECK(q->err[2] <= 4 * q->bf16_err, "%s: i8x2 error %.3g, 4x bf16 P's %.3g", what, q->err[2], 4 * q->bf16_err);
    CHECK(q->fused_lse <= 0x1p-17, "%s: i8's lse fused and unfused (or bf16 dot products off) differ by %.3g relative", what, q->fused_lse);
    CHECK(q->float_err[0] == 0 || q->err[2] <= 4 * q->float_err[0], "%s: i8x2 error %.3g, 4x the bf16 path's %.3g",
          what, q->err[2], 4 * q->float_err[0]);
    /* N(0,1) inputs: i8 too within 4x the exact bf16 path's error (the target) */
    if (!pc->c.outliers && q->float_err[0] > 0)
        CHECK(q->err[1] <= 4 * q->float_err[0], "%s: i8 error %.3g, 4x the bf16 path's %.3g", what, q->err[1],
              4 * q->float_err[0]);
}

static void test_prefill(void)
{
    printf("prefill: relative error against fp64 (sampled rows); lse absolute\n");
    printf("%-30s %5s %6s | %9s %9s %9s | %9s %9s | %6s %6s | %9s %9s\n", "case", "D", "Sk", "exact", "i8", "i8x2",
           "bf16 P", "bf16 path", "i8/bp", "x2/bp", "lse i8", "lse i8x2");
    static const struct {
        const char *what;
        int big; /* FA_QUANT_TABLE=1 only: docs/semantics.md's table */
        pcase pc;
    } cases[] = {
        {"N(0,1) f32", 0, {{64, 2048, 128, 2, 1, 0, 0, 0, 0, -1, 0.0f, 0, 0, 0}, FA_DTYPE_F32, P_DENSE}},
        {"N(0,1) f32", 0, {{128, 2048, 128, 2, 1, 0, 0, 0, 0, -1, 0.0f, 0, 0, 0}, FA_DTYPE_F32, P_DENSE}},
        {"N(0,1) f32", 0, {{256, 1024, 64, 2, 1, 0, 0, 0, 0, -1, 0.0f, 0, 0, 0}, FA_DTYPE_F32, P_DENSE}},
        {"N(0,1) f32", 1, {{64, 8192, 128, 2, 1, 0, 0, 0, 0, -1, 0.0f, 0, 0, 0}, FA_DTYPE_F32, P_DENSE}},
        {"N(0,1) f32", 1, {{128, 8192, 128, 2, 1, 0, 0, 0, 0, -1, 0.0f, 0, 0, 0}, FA_DTYPE_F32, P_DENSE}},
        {"N(0,1) f32", 1, {{256, 8192, 128, 2, 1, 0, 0, 0, 0, -1, 0.0f, 0, 0, 0}, FA_DTYPE_F32, P_DENSE}},
        {"N(0,1) f32", 1, {{128, 32768, 64, 2, 1, 0, 0, 0, 0, -1, 0.0f, 0, 0, 0}, FA_DTYPE_F32, P_DENSE}},
        {"N(0,1) bf16", 0, {{128, 1024, 96, 2, 1, 0, 0, 0, 0, -1, 0.0f, 0, 0, 0}, FA_DTYPE_BF16, P_DENSE}},
        {"outliers f32", 0, {{128, 2048, 128, 2, 1, 1, 0, 0, 0, -1, 0.0f, 0, 0, 0}, FA_DTYPE_F32, P_DENSE}},
        {"outliers f32", 0, {{64, 1024, 64, 2, 1, 1, 0, 0, 0, -1, 0.0f, 0, 0, 0}, FA_DTYPE_F32, P_DENSE}},
        {"outliers f32", 1, {{256, 8192, 128, 2, 1, 1, 0, 0, 0, -1, 0.0f, 0, 0, 0}, FA_DTYPE_F32, P_DENSE}},
        {"outliers f32", 1, {{128, 32768, 64, 2, 1, 1, 0, 0, 0, -1, 0.0f, 0, 0, 0}, FA_DTYPE_F32, P_DENSE}},
        {"causal GQA 4, bf16", 0, {{128, 600, 600, 4, 1, 0, 0, 0, 1, -1, 0.0f, 0, 0, 0}, FA_DTYPE_BF16, P_DENSE}},
        {"window 200, softcap 20, sinks", 0, {{64, 700, 150, 2, 2, 0, 0, 0, 1, 200, 20.0f, 1, 0, 0}, FA_DTYPE_F32, P_DENSE}},
        {"varlen, causal", 0, {{64, 500, 100, 2, 1, 0, 0, 0, 1, -1, 0.0f, 0, 0, 0}, FA_DTYPE_BF16, P_VARLEN}},
        {"paged f32 cache, causal", 0, {{128, 700, 60, 4, 1, 0, 0, 0, 1, -1, 0.0f, 0, 0, 0}, FA_DTYPE_F32, P_PAGED}},
        {"int8 cache, 40 rows", 0, {{128, 1500, 40, 4, 2, 0, 0, 0, 1, -1, 0.0f, 0, 0, 0}, FA_DTYPE_F32, P_INT8}},
        {"D 100", 0, {{100, 400, 40, 2, 1, 0, 0, 0, 0, -1, 0.0f, 0, 0, 0}, FA_DTYPE_F32, P_DENSE}},
    };
    const char *table = getenv("FA_QUANT_TABLE");
    const int big = table && strcmp(table, "1") == 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const pcase *pc = &cases[i].pc;
        if (cases[i].big && !big) continue;
        qresult q;
        h_case("prefill %s D=%lld Sk=%lld", cases[i].what, (long long)pc->c.D, (long long)pc->c.Sk);
        run_prefill(pc, 500 + i, &q);
        printf("%-30s %5lld %6lld | %9.2e %9.2e %9.2e | %9.2e %9.2e | %6.2f %6.2f | %9.2e %9.2e\n", cases[i].what,
               (long long)pc->c.D, (long long)pc->c.Sk, q.err[0], q.err[1], q.err[2], q.bf16_err, q.float_err[0],
               q.float_err[0] > 0 ? q.err[1] / q.float_err[0] : NAN, q.float_err[0] > 0 ? q.err[2] / q.float_err[0] : NAN,
               q.lse_err[1], q.lse_err[2]);
        check_prefill(pc, &q, cases[i].what);
    }
}

/* A paged bf16 cache whose rows have an inner stride (every other element) gives the
 * bits of the same values at a unit stride, in every mode: the path depends on shapes,
 * never on strides (the fused int8 forward once read such pages as if unit-strided). */
static void test_page_strides(void)
{
    const int64_t Sq = 64, Sk = 100, Hq = 2, Hk = 2, D = 64, page = 16, pages = 8; /* no decode tiles (group 1) */
    h_case("paged bf16 cache, inner stride 2, prefill");
    h_rng r;
    h_rng_seed(&r, 31);
    fa_tensor q = h_alloc(FA_DTYPE_BF16, 1, Sq, Hq, D), o[2], k[2], v[2];
    h_fill_normal(&q, &r, 1.0);
    int32_t table[8], seqlens[1] = {(int32_t)Sk};
    for (int64_t p = 0; p < pages; p++) table[p] = (int32_t)(pages - 1 - p);
    for (int s = 0; s < 2; s++) {
        o[s] = h_alloc(FA_DTYPE_F32, 1, Sq, Hq, D);
        k[s] = h_alloc(FA_DTYPE_BF16, pages, page, Hk, (s + 1) * D), v[s] = h_alloc(FA_DTYPE_BF16, pages, page, Hk, (s + 1) * D);
        if (s) k[s].shape[3] = v[s].shape[3] = D, k[s].stride[3] = v[s].stride[3] = 2;
    }
    h_fill_normal(&k[0], &r, 1.0);
    h_fill_normal(&v[0], &r, 1.0);
    h_copy(&k[1], &k[0]);
    h_copy(&v[1], &v[0]);
    for (int mode = 0; mode < 3; mode++) {
        for (int s = 0; s < 2; s++) {
            fa_forward_args a = FA_FORWARD_ARGS_INIT;
            fa_kv_cache c = FA_KV_CACHE_INIT;
            c.k = k[s], c.v = v[s], c.seqlens = seqlens, c.block_table = table, c.max_pages = pages;
            a.q = q, a.o = o[s], a.kv_cache = &c, a.quant_matmul = mode;
            const fa_status st = h_run(g_ctx, FA_ALGO_AUTO, 2, &a);
            CHECK(st == FA_OK, "mode %d, stride %d: %s", mode, s + 1, fa_context_error(g_ctx));
        }
        CHECK(h_same_bytes(&o[0], &o[1]), "mode %d: the strided pages' o differs from the unit stride's", mode);
    }
    free(q.data);
    for (int s = 0; s < 2; s++) free(o[s].data), free(k[s].data), free(v[s].data);
}

int main(void)
{
    CHECK(h_context_create(&g_ctx) == FA_OK, "context");
    if (!g_ctx) return h_summary();
    test_setting();
    test_per_call();
    test_accuracy();
    test_forms();
    test_prefill();
    test_page_strides();
    fa_context_free(g_ctx);
    return h_summary();
}
