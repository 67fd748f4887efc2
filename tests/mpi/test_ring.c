/*
 * test_ring.c: ring attention over MPI (include/flashattn_mpi.h), run by ctest as
 * `mpirun --oversubscribe -np N test_ring` for N = 1, 2, 3, 4.
 *
 * Every rank builds the same full problem from one seed, so each has the gathered
 * tensors at hand. It takes its shard by the test's own position rule (written
 * from the header's definition, not the library's helpers), runs the ring, and
 * checks its rows:
 *  1. forward o and lse against the fp64 naive oracle of the whole sequence
 *     (tests/naive.c) within docs/semantics.md's accuracy rule: at most 2x the
 *     naive same-precision error plus a few ulps. Dropout cases (the oracle has no
 *     dropout) use the core's fp64 reference algorithm as oracle and the
 *     single-process flash call's error as the yardstick. The single-process call
 *     on the full tensors is checked against the same bound, so the bound is real;
 *  2. backward dq, dk, dv against the core's fp64 reference backward on the full
 *     tensors, within 2x the single-process flash backward's error plus the fp32
 *     pipeline's few ulps (tests/test_backward.c's grad_tol);
 *  3. bitwise identical o, lse, dq, dk, dv over two runs;
 *  4. the overlap instrumentation: every step but the last posted its transfer
 *     before its first piece; kept pairs summed over the ranks equal the count of
 *     the whole problem's kept pairs; zig-zag causal work is balanced;
 *  5. the shard / unshard helpers against the test's own rule, bitwise;
 *  6. error agreement: one rank's bad argument (shape, NULL context, unsupported
 *     field, cross-rank disagreement, odd zig-zag shard, missing lse) gives every
 *     rank the same status and leaves its outputs untouched; then a good call works.
 * The matrix (cases[] in main): non-causal, causal contiguous and zig-zag (both
 * alignments), window, ALiBi, softcap, dropout (with and without a window), MHA,
 * GQA and MQA, f32 / bf16 / f16 inputs with input-dtype or f32 outputs and
 * gradients, BSND and BNSD shards, 1..7 pieces, shards of 8 to 96 rows, unequal
 * shard lengths (contiguous and zig-zag, one rank holding none), Dv = 0 and Dv != D,
 * attention sinks (o, lse and dsinks; one head -inf).
 * The fault hook (mpi/ring_internal.h) makes one rank's core call fail inside the
 * ring, after the agreement, for the closing agreement's test.
 * A deadlock fails through ctest's TIMEOUT. Each rank prints its own summary and
 * exits non-zero on any failure, which mpirun passes on.
 */
#include <mpi.h>

#include "flashattn_mpi.h"
#include "harness.h"
#include "naive.h"
#include "ring_internal.h" /* the fault hook only: ring_fault_step */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static fa_context *g_ctx;
static int g_rank, g_P;

typedef struct rcase {
    const char *name;
    fa_ring_sharding sharding;
    fa_causal causal;
    int64_t wl, wr;
    int alibi, softcap, dropout, bnsd, pieces;
    int unequal;            /* shard lengths: 1 = 5 + 3r; 2 = 0 on rank 0, 4 + 2r elsewhere; 3 = 4 + 2r */
    int64_t B, S, Hq, Hk, D, Dv;
    fa_dtype dt, odt, gdt;
    int sinks; /* per-head sink logits (g_sinks), and the backward's dsinks */
} rcase;

/* One head's sink is -inf (no sink), the others finite of either sign. */
static const float g_sinks[16] = {0.7f, -INFINITY, 2.5f, -1.0f, 0.25f, 1.5f, -0.5f, 3.0f,
                                  0.7f, -INFINITY, 2.5f, -1.0f, 0.25f, 1.5f, -0.5f, 3.0f};

/* ------------------------------------------------------------ positions */

static int64_t shard_len(const rcase *c, int r)
{
    if (c->unequal == 2) return r == 0 ? 0 : 4 + 2 * r;
    if (c->unequal == 3) return 4 + 2 * r;
    return c->unequal ? 5 + 3 * r : c->S;
}

/* Global row of local row i of rank r: the header's definition, restated. */
static int64_t global_row(const rcase *c, int r, int64_t i)
{
    if (c->sharding == FA_RING_CONTIGUOUS) {
        int64_t start = 0;
        for (int x = 0; x < r; x++) start += shard_len(c, x);
        return start + i;
    }
    /* the 2P chunks in global order: every rank's first half by rank, then every
     * rank's second half by falling rank */
    const int64_t C = shard_len(c, r) / 2;
    int64_t before = 0;
    if (i < C) {
        for (int x = 0; x < r; x++) before += shard_len(c, x) / 2;
        return before + i;
    }
    for (int x = 0; x < g_P; x++) before += shard_len(c, x) / 2;
    for (int x = g_P - 1; x > r; x--) before += shard_len(c, x) / 2;
    return before + (i - C);
}

/* ------------------------------------------------------------- tensors */

static fa_tensor alloc_t(fa_dtype dt, int bnsd, int64_t B, int64_t S, int64_t H, int64_t X)
{
    fa_tensor t = h_alloc(dt, B, S, H, X);
    if (bnsd) t = fa_tensor_make(t.data, dt, FA_LAYOUT_BNSD, B, S, H, X);
    return t;
}

/* local (B, Sl, H, X) rows <- full rows at the global positions (axis 1). */
static void take_rows(const rcase *c, const fa_tensor *full, const fa_tensor *local)
{
    for (int64_t b = 0; b < local->shape[0]; b++)
        for (int64_t i = 0; i < local->shape[1]; i++)
            for (int64_t h = 0; h < local->shape[2]; h++)
                for (int64_t x = 0; x < local->shape[3]; x++)
                    h_set(local, b, i, h, x, h_get(full, b, global_row(c, g_rank, i), h, x));
}

static double tmax(double a, double b)
{
    return a > b ? a : b;
}

/* max |local - want rows| with want a dense (B, N, H, X) array of doubles */
static double rows_err(const rcase *c, const fa_tensor *local, const double *want, int64_t N, double *scale)
{
    double e = 0.0, s = 0.0;
    const int64_t H = local->shape[2], X = local->shape[3];
    for (int64_t b = 0; b < local->shape[0]; b++)
        for (int64_t i = 0; i < local->shape[1]; i++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t x = 0; x < X; x++) {
                    const double w = want[((b * N + global_row(c, g_rank, i)) * H + h) * X + x];
                    const double d = fabs(h_get(local, b, i, h, x) - w);
                    if (!(d <= e)) e = d; /* NaN sticks */
                    s = tmax(s, fabs(w));
                }
    if (scale) *scale = s;
    return e;
}

/* the same for lse: local (B, H, Sl, 1) against want (B, H, N) */
static double lse_rows_err(const rcase *c, const fa_tensor *local, const double *want, int64_t N, double *scale)
{
    double e = 0.0, s = 0.0;
    for (int64_t b = 0; b < local->shape[0]; b++)
        for (int64_t h = 0; h < local->shape[1]; h++)
            for (int64_t i = 0; i < local->shape[2]; i++) {
                const double w = want[(b * local->shape[1] + h) * N + global_row(c, g_rank, i)];
                const double g = h_get(local, b, h, i, 0);
                const double d = (w == -INFINITY && g == -INFINITY) ? 0.0 : fabs(g - w);
                if (!(d <= e)) e = d;
                s = tmax(s, fabs(w) < INFINITY ? fabs(w) : 0.0);
            }
    if (scale) *scale = s;
    return e;
}

static double *dense(const fa_tensor *t)
{
    const int64_t n = h_numel(t);
    double *x = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    int64_t k = 0;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t cc = 0; cc < t->shape[2]; cc++)
                for (int64_t d = 0; d < t->shape[3]; d++) x[k++] = h_get(t, a, b, cc, d);
    return x;
}

static double arr_err(const double *a, const double *b, int64_t n)
{
    double e = 0.0;
    for (int64_t k = 0; k < n; k++) {
        const double d = (a[k] == b[k]) ? 0.0 : fabs(a[k] - b[k]);
        if (!(d <= e)) e = d;
    }
    return e;
}

static int same_bits(const fa_tensor *a, const fa_tensor *b)
{
    const size_t n = (size_t)h_numel(a) * h_dtype_bytes(a->dtype);
    return n == 0 || memcmp(a->data, b->data, n) == 0;
}

static fa_tensor clone(const fa_tensor *t)
{
    fa_tensor c = *t;
    const size_t n = (size_t)h_numel(t) * h_dtype_bytes(t->dtype);
    c.data = malloc(n ? n : 1);
    memcpy(c.data, t->data, n);
    return c;
}

/* Tolerance of a gradient of `terms` accumulated products (tests/test_backward.c). */
static double grad_tol(fa_dtype gdt, int64_t terms)
{
    return (8.0 + 2.0 * sqrt((double)terms)) * 1.2e-7 + h_eps(gdt);
}

static int agreed_failures(void)
{
    int64_t mine = h_failures(), all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    return all != 0;
}

/* ------------------------------------------------------------- one case */

static void apply_options(const rcase *c, fa_forward_args *a, const float *slopes)
{
    a->causal = c->causal;
    a->window_left = c->wl;
    a->window_right = c->wr;
    if (c->alibi) a->alibi_slopes = slopes;
    if (c->softcap) a->softcap = 3.0f;
    if (c->sinks) a->sinks = g_sinks;
    if (c->dropout) {
        a->dropout_p = 0.25f;
        a->dropout_seed = 0xfeedbeef12345ull;
        a->dropout_offset = 3;
    }
}

static void run_case(const rcase *c, int idx)
{
    if (c->unequal == 2 && g_P == 1) return; /* its only rank would hold nothing */
    h_case("%s, P=%d", c->name, g_P);
    int64_t N = 0;
    for (int r = 0; r < g_P; r++) N += shard_len(c, r);
    const int64_t Sl = shard_len(c, g_rank), B = c->B, Hq = c->Hq, Hk = c->Hk, D = c->D, Dv = c->Dv;
    h_rng rng;
    h_rng_seed(&rng, h_env_u64("FA_TEST_SEED", 0x5eed) + (uint64_t)N * 7919u + (uint64_t)idx);
    float slopes[16];
    for (int h = 0; h < 16; h++) slopes[h] = 0.03f * (float)(h + 1);

    /* ---- the full problem, the same on every rank */
    h_problem full;
    h_problem_alloc(&full, (h_dims){B, N, N, Hq, Hk, D, Dv}, c->dt, c->odt);
    fa_forward_args *fa = &full.args;
    h_fill_normal(&fa->q, &rng, 1.0);
    h_fill_normal(&fa->k, &rng, 1.0);
    h_fill_normal(&fa->v, &rng, 1.0);
    fa_tensor dO = h_alloc(c->dt, B, N, Hq, Dv);
    h_fill_normal(&dO, &rng, 1.0);
    apply_options(c, fa, slopes);

    /* the oracle and the yardstick */
    const int64_t no = B * N * Hq * Dv, nl = B * Hq * N;
    double *o_ref = malloc(sizeof(double) * (size_t)no), *lse_ref = malloc(sizeof(double) * (size_t)nl);
    double *o_nv = malloc(sizeof(double) * (size_t)no), *lse_nv = malloc(sizeof(double) * (size_t)nl);
    fa_status st;
    if (!c->dropout) {
        naive_forward(fa, NAIVE_FP64, o_ref, lse_ref, NULL);
        naive_forward(fa, NAIVE_SAME_PRECISION, o_nv, lse_nv, NULL);
    } else { /* the core's fp64 reference with an f32 o: it draws the same mask */
        fa_forward_args ra = *fa;
        ra.o = h_alloc(FA_DTYPE_F32, B, N, Hq, Dv);
        st = h_run(g_ctx, FA_ALGO_REFERENCE, 1, &ra);
        CHECK(st == FA_OK, "reference forward: %s", fa_context_error(g_ctx));
        double *t = dense(&ra.o), *l = dense(&ra.lse);
        memcpy(o_ref, t, sizeof(double) * (size_t)no), memcpy(lse_ref, l, sizeof(double) * (size_t)nl);
        free(t), free(l), free(ra.o.data);
    }
    /* the single-process flash call on the gathered tensors */
    st = h_run(g_ctx, FA_ALGO_FLASH, 1, fa);
    CHECK(st == FA_OK, "single-process forward: %s", fa_context_error(g_ctx));
    double *o_single = dense(&fa->o), *lse_single = dense(&fa->lse);
    if (c->dropout) {
        memcpy(o_nv, o_single, sizeof(double) * (size_t)no);
        memcpy(lse_nv, lse_single, sizeof(double) * (size_t)nl);
    }
    double o_scale = 0.0, l_scale = 0.0;
    for (int64_t k = 0; k < no; k++) o_scale = tmax(o_scale, fabs(o_ref[k]));
    for (int64_t k = 0; k < nl; k++) l_scale = tmax(l_scale, isfinite(lse_ref[k]) ? fabs(lse_ref[k]) : 0.0);
    const double o_tol = 2.0 * arr_err(o_nv, o_ref, no) + h_prop_ulps(c->odt) * h_eps(c->odt) * tmax(1.0, o_scale);
    const double l_tol = 2.0 * arr_err(lse_nv, lse_ref, nl) + h_prop_lse_ulps() * 0x1.0p-23 * tmax(1.0, l_scale);
    CHECK(arr_err(o_single, o_ref, no) <= o_tol, "%s: the single-process o misses the rule itself", c->name);

    /* ---- this rank's shards */
    fa_forward_args la = FA_FORWARD_ARGS_INIT;
    la.q = alloc_t(c->dt, c->bnsd, B, Sl, Hq, D);
    la.k = alloc_t(c->dt, c->bnsd, B, Sl, Hk, D);
    la.v = alloc_t(c->dt, c->bnsd, B, Sl, Hk, Dv);
    la.o = alloc_t(c->odt, c->bnsd, B, Sl, Hq, Dv);
    la.lse = h_alloc(FA_DTYPE_F32, B, Hq, Sl, 1);
    take_rows(c, &fa->q, &la.q);
    take_rows(c, &fa->k, &la.k);
    take_rows(c, &fa->v, &la.v);
    apply_options(c, &la, slopes);
    fa_tensor ldo = alloc_t(c->dt, c->bnsd, B, Sl, Hq, Dv);
    take_rows(c, &dO, &ldo);
    if (!c->unequal) { /* the helper gives the same shard, bitwise */
        fa_tensor hq = alloc_t(c->dt, 0, B, Sl, Hq, D);
        st = fa_ring_shard(&fa->q, &hq, 1, c->sharding, g_rank, g_P);
        CHECK(st == FA_OK && h_numel(&hq) == h_numel(&la.q), "fa_ring_shard: %s", fa_ring_error());
        int same = 1;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < Sl; i++)
                for (int64_t h = 0; h < Hq; h++)
                    for (int64_t x = 0; x < D; x++) same &= h_bits(&hq, b, i, h, x) == h_bits(&la.q, b, i, h, x);
        CHECK(same, "%s: fa_ring_shard differs from the header's rule", c->name);
        free(hq.data);
    }

    fa_ring_args ring = FA_RING_ARGS_INIT;
    fa_ring_stats stats = FA_RING_STATS_INIT;
    ring.sharding = c->sharding;
    ring.pieces = c->pieces;
    ring.stats = &stats;
    h_poison_outputs(&la);
    st = fa_ring_forward(g_ctx, MPI_COMM_WORLD, &ring, &la);
    CHECK(st == FA_OK, "%s: fa_ring_forward: %s: %s", c->name, fa_status_string(st), fa_ring_error());
    double e = rows_err(c, &la.o, o_ref, N, NULL);
    CHECK(e <= o_tol, "%s: o max |err| %.3g > tol %.3g", c->name, e, o_tol);
    e = lse_rows_err(c, &la.lse, lse_ref, N, NULL);
    CHECK(e <= l_tol, "%s: lse max |err| %.3g > tol %.3g", c->name, e, l_tol);

    /* the overlap hook and the work count */
    CHECK(stats.steps == g_P, "steps %lld", (long long)stats.steps);
    CHECK(stats.steps_prefetched == g_P - 1, "%s: %lld of %d steps posted their transfer before computing", c->name,
          (long long)stats.steps_prefetched, g_P - 1);
    int64_t kept = stats.kept_pairs, kept_sum = 0, kept_max = 0, kept_min = 0;
    MPI_Allreduce(&kept, &kept_sum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&kept, &kept_max, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&kept, &kept_min, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
    int64_t want_kept = 0;
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < N; j++) want_kept += naive_kept_by_position(fa, N, N, i, j);
    CHECK(kept_sum == want_kept, "%s: ranks computed %lld kept pairs, the problem has %lld", c->name,
          (long long)kept_sum, (long long)want_kept);
    if (c->sharding == FA_RING_ZIGZAG && c->causal && c->wl < 0 && c->wr < 0 && !c->unequal)
        CHECK(kept_max == kept_min, "%s: zig-zag causal work %lld..%lld pairs per rank", c->name, (long long)kept_min,
              (long long)kept_max);

    /* bitwise repeat */
    fa_tensor o1 = clone(&la.o), l1 = clone(&la.lse);
    st = fa_ring_forward(g_ctx, MPI_COMM_WORLD, &ring, &la);
    CHECK(st == FA_OK && same_bits(&o1, &la.o) && same_bits(&l1, &la.lse), "%s: a second forward differs", c->name);
    free(o1.data), free(l1.data);

    /* ---- backward */
    fa_tensor gq = h_alloc(c->gdt, B, N, Hq, D), gk = h_alloc(c->gdt, B, N, Hk, D), gv = h_alloc(c->gdt, B, N, Hk, Dv);
    fa_backward_args fb = FA_BACKWARD_ARGS_INIT;
    fb.fwd = fa, fb.do_ = dO, fb.dq = gq, fb.dk = gk, fb.dv = gv;
    float ds_ref[16] = {0}, ds_single[16] = {0}, ds_ring[16], ds_again[16];
    fb.dsinks = c->sinks ? ds_ref : NULL;
    fa_context_set(g_ctx, FA_PARAM_ALGO, FA_ALGO_REFERENCE);
    st = fa_backward(g_ctx, &fb);
    CHECK(st == FA_OK, "reference backward: %s", fa_context_error(g_ctx));
    double *rq = dense(&gq), *rk = dense(&gk), *rv = dense(&gv);
    fa_context_set(g_ctx, FA_PARAM_ALGO, FA_ALGO_FLASH);
    fb.dsinks = c->sinks ? ds_single : NULL;
    st = fa_backward(g_ctx, &fb);
    CHECK(st == FA_OK, "single-process backward: %s", fa_context_error(g_ctx));
    double *sq = dense(&gq), *sk = dense(&gk), *sv = dense(&gv);
    const int64_t nq = B * N * Hq * D, nk = B * N * Hk * D, nv = B * N * Hk * Dv, G = Hq / Hk;
    double scq = 0, sck = 0, scv = 0;
    for (int64_t k = 0; k < nq; k++) scq = tmax(scq, fabs(rq[k]));
    for (int64_t k = 0; k < nk; k++) sck = tmax(sck, fabs(rk[k]));
    for (int64_t k = 0; k < nv; k++) scv = tmax(scv, fabs(rv[k]));
    const double tq = 2.0 * arr_err(sq, rq, nq) + grad_tol(c->gdt, N * (D + Dv)) * tmax(1.0, scq);
    const double tk = 2.0 * arr_err(sk, rk, nk) + grad_tol(c->gdt, N * G * (D + Dv)) * tmax(1.0, sck);
    const double tv = 2.0 * arr_err(sv, rv, nv) + grad_tol(c->gdt, N * G * Dv) * tmax(1.0, scv);

    fa_backward_args lb = FA_BACKWARD_ARGS_INIT;
    lb.fwd = &la;
    lb.do_ = ldo;
    lb.dq = alloc_t(c->gdt, c->bnsd, B, Sl, Hq, D);
    lb.dk = alloc_t(c->gdt, c->bnsd, B, Sl, Hk, D);
    lb.dv = alloc_t(c->gdt, c->bnsd, B, Sl, Hk, Dv);
    h_fill(&lb.dq, 777.0), h_fill(&lb.dk, 777.0), h_fill(&lb.dv, 777.0);
    for (int h = 0; h < 16; h++) ds_ring[h] = ds_again[h] = 777.0f;
    lb.dsinks = c->sinks ? ds_ring : NULL;
    st = fa_ring_backward(g_ctx, MPI_COMM_WORLD, &ring, &lb);
    CHECK(st == FA_OK, "%s: fa_ring_backward: %s: %s", c->name, fa_status_string(st), fa_ring_error());
    for (int64_t h = 0; c->sinks && h < Hq; h++) { /* a sum over every row of the sequence (B N terms of Dv products) */
        /* dot(dO_i, o_i) takes the o each forward returned, rounded to o's dtype: the ring's
         * and the single call's o may each be off by eps |o| (their rounding slack) */
        double slack = 0.0;
        for (int64_t b = 0; b < B && g_sinks[h] != -INFINITY; b++)
            for (int64_t i = 0; i < N; i++) {
                double dot = 0.0;
                for (int64_t x = 0; x < Dv; x++)
                    dot += fabs(h_get(&dO, b, i, h, x)) * fabs(o_ref[((b * N + i) * Hq + h) * Dv + x]);
                slack += exp((double)g_sinks[h] - lse_ref[(b * Hq + h) * N + i]) * dot;
            }
        const double ts = 2.0 * fabs((double)ds_single[h] - ds_ref[h]) + 2.0 * h_eps(c->odt) * slack +
                          grad_tol(FA_DTYPE_F32, B * N * Dv) * tmax(1.0, fabs((double)ds_ref[h]));
        CHECK(fabs((double)ds_ring[h] - ds_ref[h]) <= ts, "%s: dsinks[%lld] %.9g, reference %.9g (tol %.3g)", c->name,
              (long long)h, (double)ds_ring[h], (double)ds_ref[h], ts);
    }
    e = rows_err(c, &lb.dq, rq, N, NULL);
    CHECK(e <= tq, "%s: dq max |err| %.3g > tol %.3g", c->name, e, tq);
    e = rows_err(c, &lb.dk, rk, N, NULL);
    CHECK(e <= tk, "%s: dk max |err| %.3g > tol %.3g", c->name, e, tk);
    e = rows_err(c, &lb.dv, rv, N, NULL);
    CHECK(e <= tv, "%s: dv max |err| %.3g > tol %.3g", c->name, e, tv);
    CHECK(stats.steps_prefetched == g_P - 1, "%s: backward: %lld of %d steps prefetched", c->name,
          (long long)stats.steps_prefetched, g_P - 1);
    fa_tensor q1 = clone(&lb.dq), k1 = clone(&lb.dk), v1 = clone(&lb.dv);
    if (c->sinks) lb.dsinks = ds_again;
    st = fa_ring_backward(g_ctx, MPI_COMM_WORLD, &ring, &lb);
    CHECK(st == FA_OK && same_bits(&q1, &lb.dq) && same_bits(&k1, &lb.dk) && same_bits(&v1, &lb.dv) &&
              memcmp(ds_ring, ds_again, sizeof ds_ring) == 0,
          "%s: a second backward differs", c->name);
    if (c->sinks) { /* every rank holds the same dsinks, bitwise */
        float ds0[16];
        memcpy(ds0, ds_ring, sizeof ds0);
        MPI_Bcast(ds0, 16, MPI_FLOAT, 0, MPI_COMM_WORLD);
        CHECK(memcmp(ds0, ds_ring, sizeof ds0) == 0, "%s: ranks disagree on dsinks", c->name);
    }
    free(q1.data), free(k1.data), free(v1.data);

    free(rq), free(rk), free(rv), free(sq), free(sk), free(sv);
    free(gq.data), free(gk.data), free(gv.data);
    free(lb.dq.data), free(lb.dk.data), free(lb.dv.data), free(ldo.data);
    free(la.q.data), free(la.k.data), free(la.v.data), free(la.o.data), free(la.lse.data);
    free(o_ref), free(lse_ref), free(o_nv), free(lse_nv), free(o_single), free(lse_single), free(dO.data);
    h_problem_free(&full);
}

/* ------------------------------------------------------------ helpers */

static void test_unshard(void)
{
    h_case("shard then unshard, P=%d", g_P);
    const int64_t B = 2, S = 6, H = 3, X = 5, N = S * g_P;
    for (int sh = 0; sh < 2; sh++) {
        fa_tensor full = h_alloc(FA_DTYPE_BF16, B, N, H, X), back = h_alloc(FA_DTYPE_BF16, B, N, H, X);
        fa_tensor lse = h_alloc(FA_DTYPE_F32, B, H, N, 1), lse_back = h_alloc(FA_DTYPE_F32, B, H, N, 1);
        h_rng r;
        h_rng_seed(&r, 99);
        h_fill_normal(&full, &r, 1.0);
        h_fill_normal(&lse, &r, 1.0);
        /* every rank shards the whole for every rank and unshards it back */
        int ok = 1;
        for (int x = 0; x < g_P; x++) {
            fa_tensor loc = fa_tensor_make(malloc((size_t)(B * S * H * X * 2)), FA_DTYPE_BF16, FA_LAYOUT_BNSD, B, S, H, X);
            fa_tensor ll = h_alloc(FA_DTYPE_F32, B, H, S, 1);
            ok &= fa_ring_shard(&full, &loc, 1, (fa_ring_sharding)sh, x, g_P) == FA_OK;
            ok &= fa_ring_shard(&lse, &ll, 2, (fa_ring_sharding)sh, x, g_P) == FA_OK;
            for (int64_t i = 0; i < S; i++) /* row i of rank x sits at the header's position */
                ok &= h_bits(&loc, 1, i, 2, 4) == h_bits(&full, 1, fa_ring_position((fa_ring_sharding)sh, x, g_P, S, i), 2, 4);
            ok &= fa_ring_unshard(&loc, &back, 1, (fa_ring_sharding)sh, x, g_P) == FA_OK;
            ok &= fa_ring_unshard(&ll, &lse_back, 2, (fa_ring_sharding)sh, x, g_P) == FA_OK;
            free(loc.data), free(ll.data);
        }
        CHECK(ok && same_bits(&full, &back) && same_bits(&lse, &lse_back), "sharding %d: unshard(shard(x)) != x", sh);
        fa_tensor odd = h_alloc(FA_DTYPE_BF16, B, S + 1, H, X);
        CHECK(fa_ring_shard(&full, &odd, 1, (fa_ring_sharding)sh, 0, g_P) == FA_ERR_SHAPE_MISMATCH,
              "a wrong shard length is refused");
        free(odd.data), free(full.data), free(back.data), free(lse.data), free(lse_back.data);
    }
}

/* ------------------------------------------------------ error agreement */

typedef enum {
    BAD_SHAPE, BAD_CTX, BAD_BIAS, BAD_HEADS, BAD_ODD, BAD_LSE, BAD_DROPWIN, BAD_STRIDE, BAD_FAULT, BAD_FAULT_BWD,
    BAD_SINKS, BAD_SINK_INF, BAD_BMASK, BAD_BMASK_BWD, BAD_KINDS
} bad_kind;

static void test_errors(void)
{
    const int64_t B = 1, S = 8, H = 2, D = 8;
    for (int kind = 0; kind < BAD_KINDS; kind++) {
        if ((kind == BAD_HEADS || kind == BAD_DROPWIN || kind == BAD_SINKS) && g_P == 1) continue; /* need a second rank to differ */
        const int culprit = kind == BAD_CTX ? 0 : g_P - 1, me = g_rank == culprit;
        h_case("error agreement %d, culprit rank %d of %d", kind, culprit, g_P);
        int64_t Sl = S, Hq = H;
        if (kind == BAD_ODD && me) Sl = S - 1;
        if (kind == BAD_DROPWIN && me) Sl = S + 2; /* lengths differ: fine alone, not with window+dropout */
        if (kind == BAD_HEADS && me) Hq = 2 * H;
        fa_forward_args a = FA_FORWARD_ARGS_INIT;
        a.q = h_alloc(FA_DTYPE_F32, B, Sl, Hq, D);
        a.k = h_alloc(FA_DTYPE_F32, B, Sl, H, (kind == BAD_SHAPE && me) ? D + 1 : D);
        a.v = h_alloc(FA_DTYPE_F32, B, Sl, H, D);
        a.o = h_alloc(FA_DTYPE_F32, B, Sl, Hq, D);
        a.lse = h_alloc(FA_DTYPE_F32, B, Hq, Sl, 1);
        a.causal = FA_CAUSAL_TOP_LEFT;
        fa_tensor bias = h_alloc(FA_DTYPE_F32, 1, 1, 1, 1);
        if (kind == BAD_BIAS && me) a.bias = bias;
        static const float sinks_ok[2] = {0.5f, -1.0f}, sinks_inf[2] = {INFINITY, 0.0f};
        if (kind == BAD_SINKS && me) a.sinks = sinks_ok; /* the others have none */
        if (kind == BAD_SINK_INF) a.sinks = me ? sinks_inf : sinks_ok;
        if (kind == BAD_DROPWIN) a.dropout_p = 0.1f, a.window_left = 3, a.window_right = 0;
        /* a valid block mask of the culprit's shard (one block, kept): the ring still
         * refuses it, since a shard's blocks are not the sequence's */
        static const int64_t bm_offsets[2] = {0, 1};
        static const int32_t bm_kv[1] = {0};
        fa_block_mask bm = FA_BLOCK_MASK_INIT;
        bm.block_q = bm.block_k = Sl, bm.q_blocks = 1, bm.offsets = bm_offsets, bm.kv_blocks = bm_kv;
        if ((kind == BAD_BMASK || kind == BAD_BMASK_BWD) && me) a.block_mask = &bm;
        /* a failure inside the ring, after the agreement: this rank's first core call */
        ring_fault_step = ((kind == BAD_FAULT) && me) ? 0 : -1;
        h_rng r;
        h_rng_seed(&r, 5);
        h_fill_normal(&a.q, &r, 1.0), h_fill_normal(&a.k, &r, 1.0), h_fill_normal(&a.v, &r, 1.0);
        if (kind == BAD_STRIDE && me) a.q.stride[1] = INT64_MAX / 4; /* refused before it is used */
        fa_ring_args ring = FA_RING_ARGS_INIT;
        ring.sharding = kind == BAD_ODD ? FA_RING_ZIGZAG : FA_RING_CONTIGUOUS;
        const fa_status want[BAD_KINDS] = {FA_ERR_SHAPE_MISMATCH, FA_ERR_NULL_CONTEXT, FA_ERR_UNSUPPORTED,
                                           FA_ERR_SHAPE_MISMATCH, FA_ERR_INVALID_DIM, FA_ERR_NULL_POINTER,
                                           FA_ERR_UNSUPPORTED,   FA_ERR_OVERFLOW,     FA_ERR_OUT_OF_MEMORY,
                                           FA_ERR_OUT_OF_MEMORY, FA_ERR_INVALID_ARGUMENT, FA_ERR_INVALID_ARGUMENT,
                                           FA_ERR_UNSUPPORTED,   FA_ERR_UNSUPPORTED};
        fa_status st;
        if (kind != BAD_LSE && kind != BAD_FAULT_BWD && kind != BAD_BMASK_BWD) {
            h_poison_outputs(&a);
            fa_tensor o0 = clone(&a.o);
            st = fa_ring_forward((kind == BAD_CTX && me) ? NULL : g_ctx, MPI_COMM_WORLD, &ring, &a);
            CHECK(st == want[kind], "rank %d: got %s, want %s (%s)", g_rank, fa_status_string(st),
                  fa_status_string(want[kind]), fa_ring_error());
            CHECK(fa_ring_error()[0] != '\0', "no message with the error");
            CHECK(same_bits(&o0, &a.o), "o was written by a failed call");
            if (kind == BAD_BMASK && me) CHECK(strstr(fa_ring_error(), "block mask") != NULL, "message: %s", fa_ring_error());
            free(o0.data);
        } else {
            const fa_block_mask *bmask = a.block_mask;
            a.block_mask = NULL; /* the forward runs; its args then carry the mask to the backward */
            st = fa_ring_forward(g_ctx, MPI_COMM_WORLD, &ring, &a);
            CHECK(st == FA_OK, "forward before the backward misuse: %s", fa_ring_error());
            a.block_mask = bmask;
            fa_tensor dO = h_alloc(FA_DTYPE_F32, B, Sl, Hq, D), dq = h_alloc(FA_DTYPE_F32, B, Sl, Hq, D);
            h_fill(&dq, 777.0);
            fa_tensor dq0 = clone(&dq);
            fa_forward_args fwd = a;
            if (me && kind == BAD_LSE) fwd.lse.data = NULL;
            ring_fault_step = (kind == BAD_FAULT_BWD && me) ? 0 : -1;
            fa_backward_args g = FA_BACKWARD_ARGS_INIT;
            g.fwd = &fwd, g.do_ = dO, g.dq = dq;
            st = fa_ring_backward(g_ctx, MPI_COMM_WORLD, &ring, &g);
            CHECK(st == want[kind], "rank %d: backward got %s, want %s (%s)", g_rank, fa_status_string(st),
                  fa_status_string(want[kind]), fa_ring_error());
            CHECK(fa_ring_error()[0] != '\0', "no message with the backward's error");
            if (kind == BAD_BMASK_BWD && me)
                CHECK(strstr(fa_ring_error(), "block mask") != NULL, "message: %s", fa_ring_error());
            CHECK(same_bits(&dq0, &dq), "dq was written by a failed call");
            free(dO.data), free(dq.data), free(dq0.data);
        }
        ring_fault_step = -1;
        free(a.q.data), free(a.k.data), free(a.v.data), free(a.o.data), free(a.lse.data), free(bias.data);
    }
    /* nothing is left in flight: a good call still works */
    h_case("a good call after the errors, P=%d", g_P);
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = h_alloc(FA_DTYPE_F32, 1, 4, 1, 4), a.k = h_alloc(FA_DTYPE_F32, 1, 4, 1, 4);
    a.v = h_alloc(FA_DTYPE_F32, 1, 4, 1, 4), a.o = h_alloc(FA_DTYPE_F32, 1, 4, 1, 4);
    h_fill(&a.v, 2.0);
    fa_ring_args ring = FA_RING_ARGS_INIT;
    fa_status st = fa_ring_forward(g_ctx, MPI_COMM_WORLD, &ring, &a);
    CHECK(st == FA_OK && h_get(&a.o, 0, 3, 0, 2) == 2.0, "good call: %s (o = %g)", fa_ring_error(),
          h_get(&a.o, 0, 3, 0, 2));
    free(a.q.data), free(a.k.data), free(a.v.data), free(a.o.data);
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_P);
    fa_status st = h_context_create(&g_ctx);
    CHECK(st == FA_OK, "context: %s", fa_status_string(st));
    fa_context_set(g_ctx, FA_PARAM_THREADS, 1);

    const fa_dtype F = FA_DTYPE_F32, BF = FA_DTYPE_BF16, H = FA_DTYPE_F16;
    const fa_causal NC = FA_CAUSAL_NONE, TL = FA_CAUSAL_TOP_LEFT, BR = FA_CAUSAL_BOTTOM_RIGHT;
    const fa_ring_sharding CT = FA_RING_CONTIGUOUS, ZZ = FA_RING_ZIGZAG;
    const rcase cases[] = {
        /* name                      shard causal wl  wr al sc dr bnsd pcs uneq B  S  Hq Hk D   Dv  dt  odt gdt sinks */
        {"non-causal contiguous f32", CT, NC, -1, -1, 0, 0, 0, 0, 0, 0, 2, 12, 4, 4, 16, 16, F, F, F, 0},
        {"causal contiguous f32 GQA", CT, TL, -1, -1, 0, 0, 0, 0, 0, 0, 1, 12, 4, 2, 16, 16, F, F, F, 0},
        {"causal zig-zag f32 MQA", ZZ, BR, -1, -1, 0, 0, 0, 0, 3, 0, 1, 12, 4, 1, 16, 16, F, F, F, 0},
        {"causal zig-zag bf16 GQA", ZZ, TL, -1, -1, 0, 0, 0, 0, 0, 0, 2, 16, 4, 2, 32, 32, BF, BF, BF, 0},
        {"causal zig-zag bf16 in, f32 out, BNSD", ZZ, BR, -1, -1, 0, 0, 0, 1, 2, 0, 1, 16, 2, 1, 32, 32, BF, F, F, 0},
        {"window+alibi+softcap zig-zag f32, Dv!=D", ZZ, NC, 9, 4, 1, 1, 0, 0, 0, 0, 1, 12, 2, 2, 16, 8, F, F, F, 0},
        {"causal window contiguous, unequal shards", CT, TL, 6, 0, 0, 0, 0, 0, 0, 1, 1, 0, 2, 1, 16, 16, F, F, F, 0},
        {"dropout causal zig-zag f32", ZZ, TL, -1, -1, 0, 0, 1, 0, 0, 0, 1, 12, 2, 1, 16, 16, F, F, F, 0},
        {"dropout+window+alibi zig-zag f32", ZZ, NC, 7, 2, 1, 0, 1, 0, 0, 0, 1, 12, 2, 2, 16, 16, F, F, F, 0},
        {"non-causal contiguous f16, one piece", CT, NC, -1, -1, 0, 0, 0, 0, 1, 0, 1, 10, 2, 2, 16, 16, H, H, F, 0},
        {"no value dims (Dv = 0): lse alone", ZZ, NC, -1, -1, 0, 0, 0, 0, 0, 0, 1, 8, 2, 1, 16, 0, F, F, F, 0},
        {"causal, rank 0 holds no rows", CT, BR, -1, -1, 0, 0, 0, 0, 0, 2, 1, 0, 2, 1, 16, 16, F, F, F, 0},
        {"causal window+alibi zig-zag, unequal shards", ZZ, TL, 5, 0, 1, 0, 0, 0, 0, 3, 1, 0, 2, 1, 16, 16, F, F, F, 0},
        {"dropout causal zig-zag, unequal shards", ZZ, TL, -1, -1, 0, 0, 1, 0, 0, 3, 1, 0, 2, 2, 16, 16, F, F, F, 0},
        /* longer shards: the core's own tiles, several pieces per segment, messages of ~100 KB */
        {"causal zig-zag f32 GQA, S_local 96", ZZ, TL, -1, -1, 0, 0, 0, 0, 7, 0, 1, 96, 4, 2, 64, 64, F, F, F, 0},
        {"window zig-zag bf16, S_local 64", ZZ, BR, 40, 0, 0, 0, 0, 0, 0, 0, 1, 64, 2, 1, 64, 64, BF, BF, F, 0},
        /* attention sinks (one head's -inf): the sink once per row, dsinks over every rank's rows */
        {"sinks causal zig-zag f32 GQA", ZZ, TL, -1, -1, 0, 0, 0, 0, 3, 0, 2, 12, 4, 2, 16, 16, F, F, F, 1},
        {"sinks non-causal contiguous bf16, BNSD", CT, NC, -1, -1, 0, 0, 0, 1, 0, 0, 1, 10, 4, 4, 32, 32, BF, BF, F, 1},
        {"sinks window+softcap, rank 0 holds no rows", CT, BR, 6, 0, 0, 1, 0, 0, 0, 2, 1, 0, 4, 1, 16, 16, F, F, F, 1},
        {"sinks dropout causal zig-zag f32", ZZ, TL, -1, -1, 0, 0, 1, 0, 0, 0, 1, 12, 2, 1, 16, 8, F, F, F, 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) run_case(&cases[k], (int)k);
    test_unshard();
    test_errors();

    const int any = agreed_failures();
    if (g_rank == 0) printf("ring attention on %d rank(s): %s\n", g_P, any ? "FAILURES (see above)" : "all ranks passed");
    fa_context_free(g_ctx);
    MPI_Finalize();
    return h_summary();
}
