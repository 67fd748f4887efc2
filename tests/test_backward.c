/*
 * test_backward.c: fa_backward and dropout.
 *
 *  1. The oracle itself: the reference algorithm's backward (fp64 inside) against
 *     central finite differences of the test's own fp64 naive forward (naive.c)
 *     on L = sum(o * dO), so the oracle cannot be wrong the way the code is.
 *  2. flash and standard against the reference backward on random shapes: odd
 *     lengths, Sq != Sk both ways (and a few with several hundred keys), D in {1, 8, 59, 64, 80, 111, 128, 256, 512},
 *     GQA 1/4/8, causal both ways, windows, softcap, ALiBi, bias, boolean mask,
 *     fully masked rows (gradient 0), f32/f16/bf16, f32 or input-dtype grads,
 *     dropout, strided (BNSD) layouts, optional outputs left out.
 *  3. Variable-length batches against per-sequence dense calls of the reference.
 *  4. Dropout: Philox4x32-10 of the test's own against the known answers of
 *     docs/semantics.md; the library's returned mask against it; the keep rate
 *     within 5 sigma; the forward with dropout against the fp64 masked naive sum.
 *  5. Determinism: bitwise equal gradients on 1, 2 and 3 threads and two runs, and
 *     for one MQA sequence on 1 to 4 threads, where more than one takes the two-pass
 *     schedule; with all gradients asked for and with only dQ or only dK, dV.
 *  6. Misuse: a status and message for every new field, and dq, dk, dv untouched.
 * Tolerance: the error of the fp32 pipeline is a few ulps per accumulated term;
 * f16/bf16 inputs are read exactly and computed in fp32, so their gradients carry
 * only fp32 error plus the rounding of the output dtype (see grad_tol).
 */
#include "harness.h"
#include "naive.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static fa_context *g_ctx;

/* ------------------------------------------------------------ Philox, our own */

static void philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t x[4] = {ctr[0], ctr[1], ctr[2], ctr[3]}, k[2] = {key[0], key[1]};
    for (int r = 0; r < 10; r++) {
        if (r) k[0] += 0x9E3779B9u, k[1] += 0xBB67AE85u;
        const uint64_t a = (uint64_t)x[0] * 0xD2511F53u, b = (uint64_t)x[2] * 0xCD9E8D57u;
        const uint32_t n0 = (uint32_t)(b >> 32) ^ x[1] ^ k[0], n2 = (uint32_t)(a >> 32) ^ x[3] ^ k[1];
        x[1] = (uint32_t)b;
        x[3] = (uint32_t)a;
        x[0] = n0;
        x[2] = n2;
    }
    memcpy(out, x, sizeof x);
}

/* The rule of docs/semantics.md, section 6, restated from the text. */
static int keep_bit(double p, uint64_t seed, uint32_t offset, int64_t b, int64_t h, int64_t Hq, int64_t i, int64_t j)
{
    const uint32_t ctr[4] = {(uint32_t)(j / 4), (uint32_t)i, (uint32_t)(b * Hq + h), offset};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t w[4];
    philox(ctr, key, w);
    const double t = floor((1.0 - p) * 4294967296.0);
    return (double)w[j % 4] < t;
}

static void test_philox_known_answers(void)
{
    static const uint32_t cases[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6,
         0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420,
         0x24126ea1},
    };
    for (int c = 0; c < 3; c++) {
        uint32_t out[4];
        philox(cases[c], cases[c] + 4, out);
        h_case("philox known answer %d", c);
        CHECK(memcmp(out, cases[c] + 6, sizeof out) == 0, "got %08x %08x %08x %08x", out[0], out[1], out[2], out[3]);
    }
}

/* ----------------------------------------------------------------- a problem */

typedef struct {
    h_dims d;
    fa_dtype dtype, gdtype;
    int causal, window, softcap, alibi, bias, mask, dropout, bnsd, empty_rows;
    int aligned; /* dq 64-byte aligned: the library may accumulate dQ in it directly */
} bcase;

typedef struct {
    bcase c;
    h_problem p;
    fa_tensor dout, dq, dk, dv;
    fa_tensor bias, mask;
    float slopes[64];
} bprob;

static fa_tensor make(fa_dtype dt, int bnsd, int64_t B, int64_t S, int64_t H, int64_t Dd)
{
    fa_tensor t = h_alloc(dt, B, S, H, Dd); /* BSND storage of the right size */
    if (bnsd) t = fa_tensor_make(t.data, dt, FA_LAYOUT_BNSD, B, S, H, Dd);
    return t;
}

static void bprob_build(bprob *bp, const bcase *c, h_rng *r)
{
    memset(bp, 0, sizeof *bp);
    bp->c = *c;
    const h_dims d = c->d;
    h_problem_alloc(&bp->p, d, c->dtype, c->dtype);
    fa_forward_args *a = &bp->p.args;
    if (c->bnsd) {
        a->q = fa_tensor_make(a->q.data, c->dtype, FA_LAYOUT_BNSD, d.B, d.Sq, d.Hq, d.D);
        a->k = fa_tensor_make(a->k.data, c->dtype, FA_LAYOUT_BNSD, d.B, d.Sk, d.Hk, d.D);
        a->v = fa_tensor_make(a->v.data, c->dtype, FA_LAYOUT_BNSD, d.B, d.Sk, d.Hk, d.Dv);
        a->o = fa_tensor_make(a->o.data, c->dtype, FA_LAYOUT_BNSD, d.B, d.Sq, d.Hq, d.Dv);
    }
    h_fill_normal(&a->q, r, 1.0);
    h_fill_normal(&a->k, r, 1.0);
    h_fill_normal(&a->v, r, 1.0);
    bp->dout = make(c->dtype, c->bnsd, d.B, d.Sq, d.Hq, d.Dv);
    h_fill_normal(&bp->dout, r, 1.0);
    bp->dq = make(c->gdtype, c->bnsd, d.B, d.Sq, d.Hq, d.D);
    if (c->aligned) { /* the same view over a 64-byte aligned copy of the storage */
        const size_t bytes = (size_t)h_numel(&bp->dq) * h_dtype_bytes(c->gdtype);
        void *mem = aligned_alloc(64, (bytes + 63) / 64 * 64);
        memset(mem, 0, bytes);
        free(bp->dq.data);
        bp->dq.data = mem;
    }
    bp->dk = make(c->gdtype, c->bnsd, d.B, d.Sk, d.Hk, d.D);
    bp->dv = make(c->gdtype, c->bnsd, d.B, d.Sk, d.Hk, d.Dv);
    a->causal = c->causal == 1 ? FA_CAUSAL_BOTTOM_RIGHT : c->causal == 2 ? FA_CAUSAL_TOP_LEFT : FA_CAUSAL_NONE;
    if (c->window) a->window_left = 7, a->window_right = 3;
    if (c->softcap) a->softcap = 2.5f;
    if (c->alibi) {
        for (int64_t h = 0; h < d.Hq && h < 64; h++) bp->slopes[h] = 0.05f * (float)(h + 1);
        a->alibi_slopes = bp->slopes;
    }
    if (c->bias) {
        bp->bias = h_alloc(FA_DTYPE_F32, 1, d.Hq, d.Sq, d.Sk);
        h_fill_normal(&bp->bias, r, 0.5);
        a->bias = bp->bias;
    }
    if (c->mask || c->empty_rows) {
        bp->mask = h_alloc(FA_DTYPE_BOOL, d.B, 1, d.Sq, d.Sk);
        for (int64_t b = 0; b < d.B; b++)
            for (int64_t i = 0; i < d.Sq; i++)
                for (int64_t j = 0; j < d.Sk; j++) {
                    int keep = c->mask ? h_rng_uniform(r) < 0.7 : 1;
                    if (c->empty_rows && i % 5 == 2) keep = 0; /* rows that keep nothing */
                    h_set(&bp->mask, b, 0, i, j, keep);
                }
        a->mask = bp->mask;
    }
    if (c->dropout) {
        a->dropout_p = 0.2f;
        a->dropout_seed = 0x123456789abcull + (uint64_t)d.Sq;
        a->dropout_offset = 7;
    }
}

static void bprob_free(bprob *bp)
{
    free(bp->dout.data), free(bp->dq.data), free(bp->dk.data), free(bp->dv.data);
    free(bp->bias.data), free(bp->mask.data);
    h_problem_free(&bp->p);
}

static fa_backward_args bwd_args(bprob *bp)
{
    fa_backward_args b = FA_BACKWARD_ARGS_INIT;
    b.fwd = &bp->p.args;
    b.do_ = bp->dout;
    b.dq = bp->dq;
    b.dk = bp->dk;
    b.dv = bp->dv;
    return b;
}

/* Runs forward then backward on algo; the gradients land in bp->dq/dk/dv. */
static fa_status run_both(bprob *bp, fa_algo algo, int threads)
{
    fa_status st = h_run(g_ctx, algo, threads, &bp->p.args);
    if (st != FA_OK) return st;
    const fa_backward_args b = bwd_args(bp);
    return fa_backward(g_ctx, &b);
}

static double *snapshot(const fa_tensor *t)
{
    const int64_t n = h_numel(t);
    double *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    int64_t k = 0;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t d = 0; d < t->shape[3]; d++) x[k++] = h_get(t, a, b, c, d);
    return x;
}

/* Tolerance on a gradient of `terms` accumulated products, relative to the largest
 * |value| of the reference: fp32 summation error grows like sqrt(terms) ulps, then
 * the output dtype rounds once. */
static double grad_tol(fa_dtype gdt, int64_t terms)
{
    return (8.0 + 2.0 * sqrt((double)terms)) * 1.2e-7 + h_eps(gdt);
}

static void compare(const char *what, const double *want, const fa_tensor *got, fa_dtype gdt, int64_t terms,
                    double naive_err, const char *desc)
{
    const int64_t n = h_numel(got);
    double *g = snapshot(got), scale = 0.0, worst = 0.0;
    int64_t at = -1;
    for (int64_t k = 0; k < n; k++) scale = fmax(scale, fabs(want[k]));
    for (int64_t k = 0; k < n; k++) {
        const double e = fabs(g[k] - want[k]);
        if (!(e <= worst)) worst = e, at = k;
    }
    /* docs/semantics.md's rule: at most twice the naive same-precision error, plus
     * the fp32 pipeline's own few ulps */
    const double tol = 2.0 * naive_err + grad_tol(gdt, terms) * fmax(scale, 1.0);
    CHECK(worst <= tol, "%s %s: max |err| %.3g at %lld (got %.9g, want %.9g), tol %.3g", desc, what, worst,
          (long long)at, at >= 0 ? g[at] : 0.0, at >= 0 ? want[at] : 0.0, tol);
    free(g);
}

static void describe(const bcase *c, char *buf, size_t n)
{
    snprintf(buf, n, "%s dt=%s g=%s causal=%d win=%d cap=%d alibi=%d bias=%d mask=%d drop=%d bnsd=%d empty=%d aligned=%d",
             h_dims_str(&c->d), h_dtype_str(c->dtype), h_dtype_str(c->gdtype), c->causal, c->window, c->softcap,
             c->alibi, c->bias, c->mask, c->dropout, c->bnsd, c->empty_rows, c->aligned);
}

/*
 * The naive same-precision backward, the yardstick of the accuracy rule: eager
 * attention in the input dtype, as PyTorch runs it on f16/bf16: every matrix it
 * materialises (S, P, O, dP, dS) is rounded to the input dtype (O to the output's),
 * sums in fp32, the gradients rounded once to their dtype. Returns the gradients as
 * doubles in dense (B, S, H, dim) order.
 */
static void naive_backward_same(const bprob *bp, double *dq, double *dk, double *dv)
{
    const bcase *c = &bp->c;
    const fa_forward_args *a = &bp->p.args;
    const h_dims d = c->d;
    const int64_t G = d.Hq / d.Hk;
    const fa_dtype in = c->dtype;
    const float scale = 1.0f / sqrtf((float)d.D);
    float *s = malloc((size_t)d.Sk * sizeof *s), *pz = malloc((size_t)d.Sk * sizeof *pz);
    float *pp = malloc((size_t)d.Sk * sizeof *pp), *o = malloc((size_t)(d.Dv + 1) * sizeof *o);
    float *acc_k = calloc((size_t)(d.B * d.Sk * d.Hk * d.D), sizeof *acc_k);
    float *acc_v = calloc((size_t)(d.B * d.Sk * d.Hk * d.Dv), sizeof *acc_v);
    for (int64_t b = 0; b < d.B; b++)
        for (int64_t h = 0; h < d.Hq; h++)
            for (int64_t i = 0; i < d.Sq; i++) {
                const int64_t hk = h / G;
                float m = -INFINITY;
                for (int64_t j = 0; j < d.Sk; j++) {
                    int keep = naive_kept_by_position(a, d.Sq, d.Sk, i, j);
                    if (c->mask || c->empty_rows) keep &= h_get(&a->mask, b, 0, i, j) != 0.0;
                    if (!keep) {
                        s[j] = -INFINITY;
                        continue;
                    }
                    float dot = 0.0f;
                    for (int64_t x = 0; x < d.D; x++) dot += (float)h_get(&a->q, b, i, h, x) * (float)h_get(&a->k, b, j, hk, x);
                    float v = (float)h_round(scale * dot, in);
                    if (c->softcap) v = (float)h_round(a->softcap * tanhf(v / a->softcap), in);
                    if (c->bias) v = (float)h_round(v + (float)h_get(&a->bias, 0, h, i, j), in);
                    if (c->alibi) v = (float)h_round(v - bp->slopes[h] * (float)llabs(i + d.Sk - d.Sq - j), in);
                    s[j] = v;
                    m = fmaxf(m, v);
                }
                float sum = 0.0f;
                for (int64_t j = 0; j < d.Sk; j++) sum += m == -INFINITY ? 0.0f : expf(s[j] - m);
                for (int64_t j = 0; j < d.Sk; j++) {
                    pp[j] = m == -INFINITY ? 0.0f : (float)h_round(expf(s[j] - m) / sum, in);
                    const double z = c->dropout ? (keep_bit(a->dropout_p, a->dropout_seed, a->dropout_offset, b, h,
                                                            d.Hq, i, j) ? 1.0 / (1.0 - a->dropout_p) : 0.0)
                                                : 1.0;
                    pz[j] = (float)h_round(pp[j] * z, in);
                }
                for (int64_t e = 0; e < d.Dv; e++) {
                    float t = 0.0f;
                    for (int64_t j = 0; j < d.Sk; j++) t += pz[j] * (float)h_get(&a->v, b, j, hk, e);
                    o[e] = (float)h_round(t, in);
                }
                float Di = 0.0f;
                for (int64_t e = 0; e < d.Dv; e++) Di += (float)h_get(&bp->dout, b, i, h, e) * o[e];
                for (int64_t x = 0; x < d.D; x++) dq[((b * d.Sq + i) * d.Hq + h) * d.D + x] = 0.0;
                for (int64_t j = 0; j < d.Sk; j++) {
                    if (pp[j] == 0.0f) continue;
                    float dpv = 0.0f;
                    for (int64_t e = 0; e < d.Dv; e++) dpv += (float)h_get(&bp->dout, b, i, h, e) * (float)h_get(&a->v, b, j, hk, e);
                    const float zf = pp[j] > 0.0f ? pz[j] / pp[j] : 0.0f;
                    const float dpr = (float)h_round(zf * dpv, in);
                    float ds = (float)h_round(pp[j] * (dpr - Di), in);
                    if (c->softcap) {
                        /* tanh of the scaled dot, recomputed as eager code keeps it */
                        float dot = 0.0f;
                        for (int64_t x = 0; x < d.D; x++) dot += (float)h_get(&a->q, b, i, h, x) * (float)h_get(&a->k, b, j, hk, x);
                        const float th = tanhf((float)h_round(scale * dot, in) / a->softcap);
                        ds = (float)h_round(ds * (1.0f - th * th), in);
                    }
                    for (int64_t x = 0; x < d.D; x++) {
                        dq[((b * d.Sq + i) * d.Hq + h) * d.D + x] += (double)(scale * ds * (float)h_get(&a->k, b, j, hk, x));
                        acc_k[((b * d.Sk + j) * d.Hk + hk) * d.D + x] += scale * ds * (float)h_get(&a->q, b, i, h, x);
                    }
                    for (int64_t e = 0; e < d.Dv; e++)
                        acc_v[((b * d.Sk + j) * d.Hk + hk) * d.Dv + e] += pz[j] * (float)h_get(&bp->dout, b, i, h, e);
                }
                for (int64_t x = 0; x < d.D; x++) {
                    double *q = &dq[((b * d.Sq + i) * d.Hq + h) * d.D + x];
                    *q = h_round((float)*q, c->gdtype);
                }
            }
    for (int64_t k = 0; k < d.B * d.Sk * d.Hk * d.D; k++) dk[k] = h_round(acc_k[k], c->gdtype);
    for (int64_t k = 0; k < d.B * d.Sk * d.Hk * d.Dv; k++) dv[k] = h_round(acc_v[k], c->gdtype);
    free(s), free(pz), free(pp), free(o), free(acc_k), free(acc_v);
}

static double max_err(const double *a, const double *b, int64_t n)
{
    double w = 0.0;
    for (int64_t k = 0; k < n; k++) w = fmax(w, fabs(a[k] - b[k]));
    return w;
}

/* flash and standard against the reference backward of the same inputs. */
static void check_case(const bcase *c, h_rng *r)
{
    char desc[400];
    describe(c, desc, sizeof desc);
    bprob bp;
    bprob_build(&bp, c, r);
    h_case("%s (reference)", desc);
    fa_status st = run_both(&bp, FA_ALGO_REFERENCE, 1);
    CHECK(st == FA_OK, "reference: %s: %s", fa_status_string(st), fa_context_error(g_ctx));
    double *rq = snapshot(&bp.dq), *rk = snapshot(&bp.dk), *rv = snapshot(&bp.dv);
    const fa_algo algos[2] = {FA_ALGO_FLASH, FA_ALGO_STANDARD};
    const h_dims d = c->d;
    /* the yardstick: the naive same-precision backward's error against the oracle
     * (dense layouts only: its indexing is BSND, which h_get hides anyway) */
    const int64_t nq = h_numel(&bp.dq), nk = h_numel(&bp.dk), nv = h_numel(&bp.dv);
    double *sq = malloc((size_t)nq * sizeof *sq), *sk = malloc((size_t)nk * sizeof *sk), *sv = malloc((size_t)nv * sizeof *sv);
    naive_backward_same(&bp, sq, sk, sv);
    const double eq = max_err(sq, rq, nq), ek = max_err(sk, rk, nk), ev = max_err(sv, rv, nv);
    free(sq), free(sk), free(sv);
    for (int a = 0; a < 2; a++) {
        h_fill(&bp.dq, 777.0), h_fill(&bp.dk, 777.0), h_fill(&bp.dv, 777.0);
        h_case("%s (%s)", desc, h_algo_str(algos[a]));
        st = run_both(&bp, algos[a], 2);
        CHECK(st == FA_OK, "%s: %s", fa_status_string(st), fa_context_error(g_ctx));
        if (st != FA_OK) continue;
        /* terms: dq sums Sk products of D and Dv; dk, dv sum group * Sq */
        compare("dq", rq, &bp.dq, c->gdtype, d.Sk * (d.D + d.Dv), eq, desc);
        compare("dk", rk, &bp.dk, c->gdtype, d.Sq * (d.Hq / d.Hk) * (d.D + d.Dv), ek, desc);
        compare("dv", rv, &bp.dv, c->gdtype, d.Sq * (d.Hq / d.Hk) * d.Dv, ev, desc);
    }
    free(rq), free(rk), free(rv);
    bprob_free(&bp);
}

static void test_random(h_rng *r)
{
    static const int64_t dims[] = {1, 8, 59, 64, 80, 111, 128, 256, 512};
    static const int64_t groups[] = {1, 4, 8};
    const int rounds = h_scaled(40);
    for (int t = 0; t < rounds; t++) {
        bcase c;
        memset(&c, 0, sizeof c);
        const int64_t D = dims[t % 9];
        const int64_t big = D >= 256 ? 40 : 150; /* the oracle is O(Sq * Sk * D) per head */
        c.d.B = h_rng_int(r, 1, 2);
        c.d.Hk = h_rng_int(r, 1, 2);
        c.d.Hq = c.d.Hk * groups[h_rng_int(r, 0, 2)];
        c.d.Sq = h_rng_int(r, 1, big);
        c.d.Sk = h_rng_int(r, 1, big);
        c.d.D = D;
        c.d.Dv = h_rng_int(r, 0, 3) == 0 ? h_rng_int(r, 1, 96) : D;
        if (t % 10 == 7) c.d.Dv = 0; /* no output: every gradient is 0 (a fuzzer finding) */
        c.dtype = (fa_dtype)h_rng_int(r, 0, 2);
        c.gdtype = h_rng_int(r, 0, 1) ? FA_DTYPE_F32 : c.dtype;
        c.causal = (int)h_rng_int(r, 0, 2);
        c.window = h_rng_int(r, 0, 4) == 0;
        c.softcap = h_rng_int(r, 0, 4) == 0;
        c.alibi = h_rng_int(r, 0, 4) == 0;
        c.bias = h_rng_int(r, 0, 5) == 0;
        c.mask = h_rng_int(r, 0, 5) == 0;
        c.dropout = h_rng_int(r, 0, 4) == 0;
        c.bnsd = h_rng_int(r, 0, 3) == 0;
        c.empty_rows = h_rng_int(r, 0, 6) == 0;
        c.aligned = h_rng_int(r, 0, 1) == 0;
        check_case(&c, r);
    }
}

/* Longer keys than test_random's: the fused walk takes key tiles in groups (each query
 * block's rows loaded once for several tiles), so these span several groups and end in
 * a partial one, causal and windowed so the tiles of a group see different query
 * blocks, with rows of the (B, S, H, D) layout a page or 1 KB apart (gathered, K and V
 * packed, dQ summed in scratch) and one that is not. */
static void test_long_keys(h_rng *r)
{
    bcase c;
    memset(&c, 0, sizeof c);
    c.d = (h_dims){1, 96, 600, 8, 2, 128, 128};
    c.dtype = c.gdtype = FA_DTYPE_F32;
    c.causal = 1;
    c.aligned = 1;
    check_case(&c, r);
    c.d = (h_dims){1, 64, 900, 4, 4, 256, 64};
    c.causal = 0;
    c.window = 1;
    check_case(&c, r);
    c.d = (h_dims){1, 650, 650, 2, 2, 40, 40};
    c.dtype = FA_DTYPE_BF16;
    c.window = 0;
    c.causal = 2;
    check_case(&c, r);
}

/* -------------------------------------------------- finite differences, fp64 */

/* L = sum(o * dO) with o from the test's fp64 naive forward. */
static double loss(const fa_forward_args *a, const fa_tensor *dout, double *o)
{
    naive_forward(a, NAIVE_FP64, o, NULL, NULL);
    double L = 0.0;
    const int64_t B = a->q.shape[0], Sq = a->q.shape[1], Hq = a->q.shape[2], Dv = a->v.shape[3];
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Sq; i++)
            for (int64_t h = 0; h < Hq; h++)
                for (int64_t e = 0; e < Dv; e++) L += o[((b * Sq + i) * Hq + h) * Dv + e] * h_get(dout, b, i, h, e);
    return L;
}

static void test_finite_differences(h_rng *r)
{
    const int options = 6;
    for (int opt = 0; opt < options; opt++) {
        bcase c;
        memset(&c, 0, sizeof c);
        c.d = (h_dims){1, 5, 7, 2, 1, 6, 4};
        c.dtype = c.gdtype = FA_DTYPE_F32;
        c.causal = opt == 1 ? 1 : opt == 2 ? 2 : 0;
        c.softcap = opt == 3;
        c.alibi = c.bias = opt == 4;
        c.window = opt == 5;
        bprob bp;
        bprob_build(&bp, &c, r);
        fa_forward_args *a = &bp.p.args;
        /* inputs on a 2^-8 grid, so that +-2^-10 steps are exact in f32 */
        const fa_tensor *ins[3] = {&a->q, &a->k, &a->v};
        for (int t = 0; t < 3; t++)
            for (int64_t k = 0; k < h_numel(ins[t]); k++) {
                float *x = (float *)ins[t]->data + k;
                *x = roundf(*x * 256.0f) / 256.0f;
            }
        h_case("finite differences, option %d", opt);
        fa_status st = run_both(&bp, FA_ALGO_REFERENCE, 1);
        CHECK(st == FA_OK, "reference backward: %s", fa_context_error(g_ctx));
        const fa_tensor *grads[3] = {&bp.dq, &bp.dk, &bp.dv};
        double *o = malloc((size_t)(c.d.B * c.d.Sq * c.d.Hq * c.d.Dv) * sizeof *o);
        const float step = 1.0f / 1024.0f;
        double worst = 0.0, scale = 0.0;
        for (int t = 0; t < 3; t++)
            for (int64_t k = 0; k < h_numel(ins[t]); k++) {
                float *x = (float *)ins[t]->data + k;
                const float x0 = *x;
                *x = x0 + step;
                const double lp = loss(a, &bp.dout, o);
                *x = x0 - step;
                const double lm = loss(a, &bp.dout, o);
                *x = x0;
                const double fd = (lp - lm) / (2.0 * (double)step);
                const double an = (double)((const float *)grads[t]->data)[k];
                worst = fmax(worst, fabs(fd - an));
                scale = fmax(scale, fabs(fd));
            }
        /* central differences: O(step^2) truncation (~1e-6 of the curvature) plus the
         * f32 rounding of the analytic gradient */
        CHECK(worst <= 2e-5 * fmax(scale, 1.0), "max |finite difference - backward| = %.3g (scale %.3g)", worst, scale);
        free(o);
        bprob_free(&bp);
    }
}

/* -------------------------------------------------------------- dropout */

static void test_dropout(h_rng *r)
{
    bcase c;
    memset(&c, 0, sizeof c);
    c.d = (h_dims){2, 37, 53, 3, 3, 16, 16};
    c.dtype = c.gdtype = FA_DTYPE_F32;
    c.dropout = 1;
    bprob bp;
    bprob_build(&bp, &c, r);
    fa_forward_args *a = &bp.p.args;
    a->q_start = 5; /* positions enter the counter */
    a->k_start = 2;
    fa_tensor mask = h_alloc(FA_DTYPE_BOOL, c.d.B, c.d.Hq, c.d.Sq, c.d.Sk);
    a->dropout_mask = mask;
    h_case("dropout forward with its mask");
    fa_status st = h_run(g_ctx, FA_ALGO_FLASH, 2, a);
    CHECK(st == FA_OK, "%s", fa_context_error(g_ctx));
    int64_t bad = 0, kept = 0, total = 0;
    for (int64_t b = 0; b < c.d.B; b++)
        for (int64_t h = 0; h < c.d.Hq; h++)
            for (int64_t i = 0; i < c.d.Sq; i++)
                for (int64_t j = 0; j < c.d.Sk; j++) {
                    const int want = keep_bit(a->dropout_p, a->dropout_seed, a->dropout_offset, b, h, c.d.Hq, i + 5, j + 2);
                    const int got = h_get(&mask, b, h, i, j) != 0.0;
                    bad += want != got;
                    kept += want;
                    total++;
                }
    CHECK(bad == 0, "%lld mask bits differ from the rule", (long long)bad);
    const double pk = 1.0 - a->dropout_p, sd = sqrt(total * pk * (1.0 - pk));
    CHECK(fabs((double)kept - total * pk) <= 5.0 * sd, "kept %lld of %lld, expected %.1f +- %.1f", (long long)kept,
          (long long)total, total * pk, 5 * sd);

    /* o against the fp64 sum with the test's own mask */
    double worst = 0.0;
    for (int64_t b = 0; b < c.d.B; b++)
        for (int64_t h = 0; h < c.d.Hq; h++)
            for (int64_t i = 0; i < c.d.Sq; i++) {
                double s[64], m = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j < c.d.Sk; j++) {
                    double dot = 0.0;
                    for (int64_t x = 0; x < c.d.D; x++) dot += h_get(&a->q, b, i, h, x) * h_get(&a->k, b, j, h, x);
                    s[j] = dot / sqrt((double)c.d.D);
                    m = fmax(m, s[j]);
                }
                for (int64_t j = 0; j < c.d.Sk; j++) sum += exp(s[j] - m);
                for (int64_t e = 0; e < c.d.Dv; e++) {
                    double o = 0.0;
                    for (int64_t j = 0; j < c.d.Sk; j++)
                        if (keep_bit(a->dropout_p, a->dropout_seed, a->dropout_offset, b, h, c.d.Hq, i + 5, j + 2))
                            o += exp(s[j] - m) / sum / pk * h_get(&a->v, b, j, h, e);
                    worst = fmax(worst, fabs(o - h_get(&a->o, b, i, h, e)));
                }
            }
    CHECK(worst <= 2e-5, "dropout forward: max |o - o_ref| = %.3g", worst);
    /* the mask does not depend on threads, tiles or algorithm */
    const fa_algo algos[3] = {FA_ALGO_FLASH, FA_ALGO_STANDARD, FA_ALGO_REFERENCE};
    double *o_first = snapshot(&a->o);
    for (int al = 0; al < 3; al++)
        for (int th = 1; th <= 3; th++) {
            h_case("dropout forward, algo %s, %d threads, tiles 16x32", h_algo_str(algos[al]), th);
            h_set_tiles(g_ctx, 16, 32);
            st = h_run(g_ctx, algos[al], th, a);
            h_set_tiles(g_ctx, 0, 0);
            double *o2 = snapshot(&a->o), w = 0.0;
            for (int64_t k = 0; k < h_numel(&a->o); k++) w = fmax(w, fabs(o2[k] - o_first[k]));
            CHECK(st == FA_OK && w <= 2e-5, "status %s, max diff %.3g from the first run", fa_status_string(st), w);
            free(o2);
        }
    free(o_first);
    a->dropout_mask.data = NULL;
    free(mask.data);
    bprob_free(&bp);
}

/* ------------------------------------------------------------ determinism */

/*
 * The gradients of case c on 1 .. max_threads threads, each twice, and with only dQ
 * or only dK and dV asked for, must be the 1-thread run's bit for bit. With
 * expect_two_pass (one MQA sequence: B * Hk = 1 fused walk) every run on more than
 * one thread must have taken the two-pass schedule, key tiles for dK, dV and query
 * blocks for dQ (either pass alone when one side is not asked for).
 */
static void same_bits(const char *name, const bcase *c, h_rng *r, int max_threads, int expect_two_pass)
{
    bprob bp;
    bprob_build(&bp, c, r);
    h_case("%s: threads 1", name);
    CHECK(run_both(&bp, FA_ALGO_FLASH, 1) == FA_OK, "%s", fa_context_error(g_ctx));
    const size_t nq = (size_t)h_numel(&bp.dq) * 4, nk = (size_t)h_numel(&bp.dk) * 4, nv = (size_t)h_numel(&bp.dv) * 4;
    unsigned char *q1 = malloc(nq), *k1 = malloc(nk), *v1 = malloc(nv);
    memcpy(q1, bp.dq.data, nq), memcpy(k1, bp.dk.data, nk), memcpy(v1, bp.dv.data, nv);
    for (int th = 1; th <= max_threads; th++)
        for (int which = 0; which < 4; which++) { /* all three twice, dQ only, dK and dV only */
            h_case("%s: threads %d, %s", name, th, which < 2 ? "dq dk dv" : which == 2 ? "dq" : "dk dv");
            h_fill(&bp.dq, 777.0), h_fill(&bp.dk, 777.0), h_fill(&bp.dv, 777.0);
            fa_backward_args b = bwd_args(&bp);
            if (which == 2) b.dk.data = NULL, b.dv.data = NULL;
            if (which == 3) b.dq.data = NULL;
            fa_context_set(g_ctx, FA_PARAM_THREADS, th);
            fa_context_set(g_ctx, FA_PARAM_ALGO, FA_ALGO_FLASH);
            CHECK(fa_backward(g_ctx, &b) == FA_OK, "%s", fa_context_error(g_ctx));
            int64_t passes = 0;
            fa_context_get(g_ctx, FA_PARAM_LAST_BACKWARD_PASSES, &passes);
            if (expect_two_pass)
                CHECK(passes == (th > 1 ? 2 : 1), "LAST_BACKWARD_PASSES %lld on %d threads", (long long)passes, th);
            CHECK(which == 3 || !memcmp(q1, bp.dq.data, nq), "dq differs bitwise from the 1-thread run");
            CHECK(which == 2 || (!memcmp(k1, bp.dk.data, nk) && !memcmp(v1, bp.dv.data, nv)),
                  "dk or dv differs bitwise from the 1-thread run");
        }
    free(q1), free(k1), free(v1);
    bprob_free(&bp);
}

static void test_determinism(h_rng *r)
{
    bcase c;
    memset(&c, 0, sizeof c);
    c.d = (h_dims){2, 300, 277, 4, 2, 64, 64};
    c.dtype = c.gdtype = FA_DTYPE_F32;
    c.causal = 1;
    c.dropout = 1;
    c.aligned = 1;
    same_bits("determinism", &c, r, 3, 0);
    c.d = (h_dims){1, 700, 520, 4, 1, 64, 48};
    c.aligned = 0;
    same_bits("two-pass MQA", &c, r, 4, 1);
}

/* ------------------------------------------------------------------ varlen */

static void test_varlen(h_rng *r)
{
    const int32_t lq[4] = {5, 0, 33, 17}, lk[4] = {9, 4, 33, 0};
    int32_t cuq[5] = {0}, cuk[5] = {0};
    for (int b = 0; b < 4; b++) cuq[b + 1] = cuq[b] + lq[b], cuk[b + 1] = cuk[b] + lk[b];
    const int64_t Hq = 4, Hk = 2, D = 24, Dv = 16;
    fa_tensor q = h_alloc(FA_DTYPE_F32, 1, cuq[4], Hq, D), o = h_alloc(FA_DTYPE_F32, 1, cuq[4], Hq, Dv);
    fa_tensor k = h_alloc(FA_DTYPE_F32, 1, cuk[4], Hk, D), v = h_alloc(FA_DTYPE_F32, 1, cuk[4], Hk, Dv);
    fa_tensor lse = h_alloc(FA_DTYPE_F32, 1, Hq, cuq[4], 1), dout = h_alloc(FA_DTYPE_F32, 1, cuq[4], Hq, Dv);
    fa_tensor dq = h_alloc(FA_DTYPE_F32, 1, cuq[4], Hq, D), dk = h_alloc(FA_DTYPE_F32, 1, cuk[4], Hk, D);
    fa_tensor dv = h_alloc(FA_DTYPE_F32, 1, cuk[4], Hk, Dv);
    h_fill_normal(&q, r, 1), h_fill_normal(&k, r, 1), h_fill_normal(&v, r, 1), h_fill_normal(&dout, r, 1);
    h_fill(&dq, 555), h_fill(&dk, 555), h_fill(&dv, 555);
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse;
    a.cu_seqlens_q = cuq, a.cu_seqlens_k = cuk, a.num_seqs = 4;
    a.causal = FA_CAUSAL_BOTTOM_RIGHT;
    a.dropout_p = 0.1f, a.dropout_seed = 99;
    h_case("varlen backward");
    CHECK(h_run(g_ctx, FA_ALGO_FLASH, 2, &a) == FA_OK, "forward: %s", fa_context_error(g_ctx));
    fa_backward_args ba = FA_BACKWARD_ARGS_INIT;
    ba.fwd = &a, ba.do_ = dout, ba.dq = dq, ba.dk = dk, ba.dv = dv;
    fa_status st = fa_backward(g_ctx, &ba);
    CHECK(st == FA_OK, "backward: %s", fa_context_error(g_ctx));
    /* each sequence alone, dense, on the reference; dropout uses b = sequence index,
     * so batch each sequence as b of a B = 4 problem would not match: use b = 0 rows
     * only when the sequence is the first. Instead compare sequences with dropout off. */
    a.dropout_p = 0.0f;
    CHECK(h_run(g_ctx, FA_ALGO_FLASH, 2, &a) == FA_OK && fa_backward(g_ctx, &ba) == FA_OK, "no dropout: %s",
          fa_context_error(g_ctx));
    /* 8 threads for B * Hk = 8 walks of unequal length: the two-pass schedule, whose
     * tasks cut sequences into key tiles and query blocks; the same bits */
    {
        h_case("varlen backward, two passes on 8 threads");
        fa_tensor g2[3] = {h_alloc(FA_DTYPE_F32, 1, cuq[4], Hq, D), h_alloc(FA_DTYPE_F32, 1, cuk[4], Hk, D),
                           h_alloc(FA_DTYPE_F32, 1, cuk[4], Hk, Dv)};
        fa_backward_args b8 = ba;
        b8.dq = g2[0], b8.dk = g2[1], b8.dv = g2[2];
        fa_context_set(g_ctx, FA_PARAM_THREADS, 8);
        CHECK(fa_backward(g_ctx, &b8) == FA_OK, "%s", fa_context_error(g_ctx));
        int64_t passes = 0;
        fa_context_get(g_ctx, FA_PARAM_LAST_BACKWARD_PASSES, &passes);
        CHECK(passes == 2, "LAST_BACKWARD_PASSES %lld on 8 threads", (long long)passes);
        CHECK(!memcmp(g2[0].data, dq.data, (size_t)h_numel(&dq) * 4) && !memcmp(g2[1].data, dk.data, (size_t)h_numel(&dk) * 4) &&
                  !memcmp(g2[2].data, dv.data, (size_t)h_numel(&dv) * 4),
              "gradients differ bitwise from the 2-thread run");
        for (int t = 0; t < 3; t++) free(g2[t].data);
    }
    for (int b = 0; b < 4; b++) {
        fa_forward_args s = FA_FORWARD_ARGS_INIT;
        const size_t fq = 4;
        s.q = fa_tensor_make((char *)q.data + (size_t)cuq[b] * Hq * D * fq, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, lq[b], Hq, D);
        s.k = fa_tensor_make((char *)k.data + (size_t)cuk[b] * Hk * D * fq, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, lk[b], Hk, D);
        s.v = fa_tensor_make((char *)v.data + (size_t)cuk[b] * Hk * Dv * fq, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, lk[b], Hk, Dv);
        fa_tensor so = h_alloc(FA_DTYPE_F32, 1, lq[b], Hq, Dv), sl = h_alloc(FA_DTYPE_F32, 1, Hq, lq[b], 1);
        fa_tensor sq = h_alloc(FA_DTYPE_F32, 1, lq[b], Hq, D), sk = h_alloc(FA_DTYPE_F32, 1, lk[b], Hk, D);
        fa_tensor sv = h_alloc(FA_DTYPE_F32, 1, lk[b], Hk, Dv);
        s.o = so, s.lse = sl, s.causal = FA_CAUSAL_BOTTOM_RIGHT;
        fa_backward_args sb = FA_BACKWARD_ARGS_INIT;
        sb.fwd = &s;
        sb.do_ = fa_tensor_make((char *)dout.data + (size_t)cuq[b] * Hq * Dv * fq, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, lq[b], Hq, Dv);
        sb.dq = sq, sb.dk = sk, sb.dv = sv;
        h_case("varlen sequence %d (%d x %d) against the dense reference", b, lq[b], lk[b]);
        CHECK(h_run(g_ctx, FA_ALGO_REFERENCE, 1, &s) == FA_OK && fa_backward(g_ctx, &sb) == FA_OK, "%s",
              fa_context_error(g_ctx));
        double w = 0.0;
        for (int64_t i = 0; i < lq[b]; i++)
            for (int64_t h = 0; h < Hq; h++)
                for (int64_t x = 0; x < D; x++) w = fmax(w, fabs(h_get(&sq, 0, i, h, x) - h_get(&dq, 0, cuq[b] + i, h, x)));
        for (int64_t j = 0; j < lk[b]; j++)
            for (int64_t h = 0; h < Hk; h++) {
                for (int64_t x = 0; x < D; x++) w = fmax(w, fabs(h_get(&sk, 0, j, h, x) - h_get(&dk, 0, cuk[b] + j, h, x)));
                for (int64_t e = 0; e < Dv; e++) w = fmax(w, fabs(h_get(&sv, 0, j, h, e) - h_get(&dv, 0, cuk[b] + j, h, e)));
            }
        CHECK(w <= 1e-4, "max |varlen - dense| = %.3g", w);
        free(so.data), free(sl.data), free(sq.data), free(sk.data), free(sv.data);
    }
    free(q.data), free(k.data), free(v.data), free(o.data), free(lse.data), free(dout.data);
    free(dq.data), free(dk.data), free(dv.data);
}

/* ------------------------------------------------------------------ misuse */

static int all_value(const fa_tensor *t, double x)
{
    for (int64_t k = 0; k < h_numel(t); k++)
        if (((const float *)t->data)[k] != (float)x) return 0;
    return 1;
}

static void test_misuse(h_rng *r)
{
    bcase c;
    memset(&c, 0, sizeof c);
    c.d = (h_dims){1, 9, 11, 2, 1, 8, 8};
    c.dtype = c.gdtype = FA_DTYPE_F32;
    bprob bp;
    bprob_build(&bp, &c, r);
    CHECK(h_run(g_ctx, FA_ALGO_FLASH, 2, &bp.p.args) == FA_OK, "forward");
    fa_kv_cache cache = FA_KV_CACHE_INIT;
    int32_t seqlens[1] = {11};
    cache.k = bp.p.args.k, cache.v = bp.p.args.v, cache.seqlens = seqlens;
    for (int k = 0; k < 12; k++) {
        fa_backward_args b = bwd_args(&bp);
        fa_forward_args f = bp.p.args;
        fa_status want = FA_OK;
        const char *name = "";
        switch (k) {
        case 0: b.fwd = NULL, want = FA_ERR_NULL_POINTER, name = "fwd NULL"; break;
        case 1: f.lse.data = NULL, b.fwd = &f, want = FA_ERR_NULL_POINTER, name = "lse NULL"; break;
        case 2: b.do_.data = NULL, want = FA_ERR_NULL_POINTER, name = "do NULL"; break;
        case 3: b.dq.shape[1] = 8, want = FA_ERR_SHAPE_MISMATCH, name = "dq shape"; break;
        case 4: b.dk.shape[2] = 2, want = FA_ERR_SHAPE_MISMATCH, name = "dk heads"; break;
        case 5: b.dv.dtype = FA_DTYPE_F16, want = FA_ERR_DTYPE, name = "dv f16 for f32 q"; break;
        case 6: b.do_.dtype = FA_DTYPE_BOOL, want = FA_ERR_DTYPE, name = "do bool"; break;
        case 7: b.struct_size = 8, want = FA_ERR_STRUCT_SIZE, name = "struct_size"; break;
        case 8: f.dropout_p = 1.0f, b.fwd = &f, want = FA_ERR_INVALID_ARGUMENT, name = "dropout_p 1"; break;
        case 9: f.kv_cache = &cache, f.k.data = f.v.data = NULL, b.fwd = &f, want = FA_ERR_UNSUPPORTED, name = "KV cache"; break;
        case 10: b.do_.shape[3] = 9, want = FA_ERR_SHAPE_MISMATCH, name = "do shape"; break;
        case 11: f.dropout_p = NAN, b.fwd = &f, want = FA_ERR_INVALID_ARGUMENT, name = "dropout_p NaN"; break;
        }
        h_fill(&bp.dq, 321.0), h_fill(&bp.dk, 321.0), h_fill(&bp.dv, 321.0);
        h_case("backward misuse: %s", name);
        const fa_status st = fa_backward(g_ctx, &b);
        CHECK(st == want, "status %s, want %s", fa_status_string(st), fa_status_string(want));
        CHECK(fa_context_error(g_ctx)[0] != '\0', "no message");
        CHECK(all_value(&bp.dq, 321.0) && all_value(&bp.dk, 321.0) && all_value(&bp.dv, 321.0),
              "a failed backward wrote a gradient");
    }
    /* the forward's new fields */
    for (int k = 0; k < 5; k++) {
        fa_forward_args f = bp.p.args;
        fa_tensor m = h_alloc(FA_DTYPE_BOOL, c.d.B, c.d.Hq, c.d.Sq, c.d.Sk);
        fa_status want = FA_ERR_INVALID_ARGUMENT;
        const char *name = "";
        int32_t cu[2] = {0, (int32_t)c.d.Sq}, cuk[2] = {0, (int32_t)c.d.Sk};
        switch (k) {
        case 0: f.dropout_p = -0.1f, name = "dropout_p < 0"; break;
        case 1: f.dropout_mask = m, f.dropout_mask.dtype = FA_DTYPE_F32, want = FA_ERR_DTYPE, name = "mask dtype"; break;
        case 2: f.dropout_mask = m, f.dropout_mask.shape[3] = c.d.Sk - 1, want = FA_ERR_SHAPE_MISMATCH, name = "mask shape"; break;
        case 3:
            f.dropout_mask = m, f.cu_seqlens_q = cu, f.cu_seqlens_k = cuk, f.num_seqs = 1;
            want = FA_ERR_UNSUPPORTED, name = "mask with varlen";
            break;
        case 4: f.kv_cache = &cache, f.k.data = f.v.data = NULL, f.dropout_p = 0.5f, want = FA_ERR_UNSUPPORTED, name = "dropout with a cache"; break;
        }
        h_poison_outputs(&f);
        h_fill(&m, 0.0);
        h_case("forward misuse: %s", name);
        const fa_status st = h_run(g_ctx, FA_ALGO_AUTO, 2, &f);
        CHECK(st == want, "status %s, want %s (%s)", fa_status_string(st), fa_status_string(want), fa_context_error(g_ctx));
        int mask_clean = 1;
        for (int64_t e = 0; e < h_numel(&m); e++) mask_clean &= ((const unsigned char *)m.data)[e] == 0;
        CHECK(all_value(&f.o, 12345.0) && mask_clean, "a failed forward wrote o or the mask");
        free(m.data);
    }
    h_case("backward: NULL context");
    fa_backward_args b = bwd_args(&bp);
    CHECK(fa_backward(NULL, &b) == FA_ERR_NULL_CONTEXT, "NULL context");
    /* optional outputs: only dv */
    b.dq.data = b.dk.data = NULL;
    h_fill(&bp.dq, 321.0);
    h_case("backward with dv alone");
    CHECK(fa_backward(g_ctx, &b) == FA_OK && all_value(&bp.dq, 321.0), "dv alone: %s", fa_context_error(g_ctx));
    bprob_free(&bp);
}

int main(void)
{
    if (h_context_create(&g_ctx) != FA_OK) return 1;
    h_rng r;
    h_rng_seed(&r, h_env_u64("FA_TEST_SEED", 1101));
    test_philox_known_answers();
    test_finite_differences(&r);
    test_dropout(&r);
    test_determinism(&r);
    test_varlen(&r);
    test_misuse(&r);
    test_random(&r);
    test_long_keys(&r);
    fa_context_free(g_ctx);
    return h_summary();
}
