/*
 * test_sinks.c: attention sinks (docs/semantics.md, step 6; fa_forward_args.sinks and
 * fa_backward_args.dsinks), against oracles the test writes itself.
 *
 * The forward oracle is naive.c (fp64, and the same-precision run that sets the
 * tolerance by docs/semantics.md's accuracy rule), which adds the sink straight from
 * the formula: lse_i = log(sum_j exp(s_ij) + exp(sink_h)), o_i = sum_j exp(s_ij - lse_i) v_j.
 * Inference forms are turned into dense per-sequence calls by the test (it builds the
 * packed rows, the caches and the block tables from its own per-sequence tensors).
 * The gradient oracle: dsinks from the test's formula on the fp64 naive o and lse,
 * dsink_h = -sum_{b,i} exp(sink_h - lse_i) dot(dO_i, o_i); the reference backward
 * against central finite differences of the naive forward for dq, dk, dv and dsinks;
 * flash and standard against the reference backward.
 *
 * Sections:
 *  1. dense: reference, standard, flash; f32/f16/bf16, o in q's dtype or f32; GQA;
 *     causal both ways (with empty rows), windows, softcap, ALiBi; sinks random, far
 *     above every score (o ~ 0), mixed with -inf (no sink).
 *  2. forms: varlen (with empty sequences), contiguous and paged caches with appends,
 *     decoding rows (the small-row path) with forced split-KV 1, 2, 3, 7, planned;
 *     fa_merge_states of sink-free parts plus (o = 0, lse = sink) equals the call.
 *  3. edge values: -inf sinks equal no sinks bitwise; a NaN sink; an old struct_size
 *     ignores the field; +inf refused with nothing written (o, lse, the cache, dsinks).
 *  4. dropout: flash and standard against the reference (the sink never dropped, the
 *     lse undropped), forward and backward.
 *  5. backward: finite differences, the dsinks formula, flash and standard against
 *     the reference, varlen, and bitwise dsinks on 1, 2 and 3 threads.
 * Runs once per ISA path (FLASHATTN_ARCH, tests/CMakeLists.txt); FA_TEST_SCALE < 1 runs
 * a share of the (dtype, sink kind) cells of sections 1, 2 and 5 (see skip_share).
 */
#include "harness.h"
#include "naive.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAXS = 6, MAXH = 16 };

static fa_context *g_ctx;

/* The sweeps over (dtype, sink kind) run a share h_test_scale() of their cells, at
 * least a third (the sanitizer build and amx-model: about a third, a different third
 * per ISA path as the seed mixes in FLASHATTN_ARCH); the fixed sections always run. */
static int skip_share(h_rng *r) { return h_rng_uniform(r) >= fmax(h_test_scale(), 0.34); }

static double *dalloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

/* Sinks of one of three kinds: 0 random N(0, 2); 1 far above any score here (the sink
 * takes nearly all the weight); 2 random with every third head -inf (no sink). */
static void fill_sinks(float *s, int64_t Hq, h_rng *r, int kind)
{
    for (int64_t h = 0; h < Hq; h++) {
        s[h] = (float)(2.0 * h_rng_normal(r));
        if (kind == 1) s[h] = (float)(25.0 + h);
        if (kind == 2 && h % 3 == 0) s[h] = -INFINITY;
    }
}

/* A row-compare under docs/semantics.md's rule. ref/naive/got are n doubles each;
 * lse compares in f32 ulps. Non-finite references must be matched exactly. */
static void compare(const char *what, const double *ref, const double *naive, const double *got, int64_t n,
                    fa_dtype odt, int is_lse)
{
    double scale = 1.0, nerr = 0.0, worst = 0.0;
    int64_t at = -1;
    for (int64_t k = 0; k < n; k++)
        if (isfinite(ref[k])) {
            scale = fmax(scale, fabs(ref[k]));
            if (isfinite(naive[k])) nerr = fmax(nerr, fabs(naive[k] - ref[k]));
        }
    const double tol = 2.0 * nerr + (is_lse ? h_prop_lse_ulps() * h_eps(FA_DTYPE_F32) : h_prop_ulps(odt) * h_eps(odt)) * scale;
    for (int64_t k = 0; k < n; k++) {
        int ok;
        if (isnan(ref[k])) ok = isnan(got[k]);
        else if (isinf(ref[k])) ok = got[k] == ref[k];
        else ok = fabs(got[k] - ref[k]) <= tol;
        if (!ok && at < 0) at = k;
        if (isfinite(ref[k]) && isfinite(got[k])) worst = fmax(worst, fabs(got[k] - ref[k]));
    }
    CHECK(at < 0, "%s: element %lld got %.9g want %.9g (max err %.3g, tol %.3g)", what, (long long)at,
          at >= 0 ? got[at] : 0.0, at >= 0 ? ref[at] : 0.0, worst, tol);
}

/* Rows that keep nothing: o exactly 0 and lse exactly the sink (-inf without one). */
static void check_empty_rows(const char *what, const fa_forward_args *a, const double *o, const double *lse)
{
    const int64_t B = a->q.shape[0], Sq = a->q.shape[1], Hq = a->q.shape[2], Sk = a->k.shape[1], Dv = a->v.shape[3];
    int64_t bad = 0, empty = 0;
    for (int64_t i = 0; i < Sq; i++) {
        int64_t kept = 0;
        for (int64_t j = 0; j < Sk; j++) kept += naive_kept_by_position(a, Sq, Sk, i, j);
        if (kept) continue;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hq; h++) {
                empty++;
                const float want = a->sinks ? a->sinks[h] : -INFINITY;
                if (lse[(b * Hq + h) * Sq + i] != (double)want) bad++;
                for (int64_t e = 0; e < Dv; e++) bad += o[((b * Sq + i) * Hq + h) * Dv + e] != 0.0;
            }
    }
    CHECK(bad == 0, "%s: %lld of %lld empty rows are not o = 0, lse = sink", what, (long long)bad, (long long)empty);
}

/* The library's o (B, Sq, Hq, Dv) and lse (B, Hq, Sq, 1) as doubles in naive.h's order. */
static void read_out(const fa_forward_args *a, double *o, double *lse)
{
    const int64_t B = a->o.shape[0], Sq = a->o.shape[1], Hq = a->o.shape[2], Dv = a->o.shape[3];
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Sq; i++)
            for (int64_t h = 0; h < Hq; h++) {
                for (int64_t e = 0; e < Dv; e++) o[((b * Sq + i) * Hq + h) * Dv + e] = h_get(&a->o, b, i, h, e);
                if (lse) lse[(b * Hq + h) * Sq + i] = h_get(&a->lse, b, h, i, 0);
            }
}

/* ------------------------------------------------------------------ 1. dense */

typedef struct {
    h_dims d;
    fa_dtype dt, odt;
    int causal; /* fa_causal */
    int64_t wl, wr;
    float softcap;
    int alibi;
    int sink_kind;
} dcase;

static void dense_case(const dcase *c, h_rng *r)
{
    h_problem p;
    h_problem_alloc(&p, c->d, c->dt, c->odt);
    fa_forward_args *a = &p.args;
    h_fill_normal(&a->q, r, 1.0);
    h_fill_normal(&a->k, r, 1.0);
    h_fill_normal(&a->v, r, 1.0);
    float sinks[MAXH], slopes[MAXH];
    fill_sinks(sinks, c->d.Hq, r, c->sink_kind);
    for (int64_t h = 0; h < c->d.Hq; h++) slopes[h] = 0.25f / (float)(h + 1);
    a->sinks = sinks;
    a->causal = (fa_causal)c->causal;
    a->window_left = c->wl;
    a->window_right = c->wr;
    a->softcap = c->softcap;
    a->alibi_slopes = c->alibi ? slopes : NULL;
    const int64_t no = c->d.B * c->d.Sq * c->d.Hq * c->d.Dv, nl = c->d.B * c->d.Hq * c->d.Sq;
    double *oref = dalloc(no), *onaive = dalloc(no), *o = dalloc(no), *lref = dalloc(nl), *lnaive = dalloc(nl),
           *l = dalloc(nl);
    naive_forward(a, NAIVE_FP64, oref, lref, NULL);
    naive_forward(a, NAIVE_SAME_PRECISION, onaive, lnaive, NULL);
    const fa_algo algos[3] = {FA_ALGO_REFERENCE, FA_ALGO_STANDARD, FA_ALGO_FLASH};
    for (int k = 0; k < 3; k++) {
        char what[256];
        snprintf(what, sizeof what, "dense %s %s->%s causal=%d win=(%lld,%lld) cap=%g alibi=%d sinks=%d %s",
                 h_dims_str(&c->d), h_dtype_str(c->dt), h_dtype_str(c->odt), c->causal, (long long)c->wl,
                 (long long)c->wr, (double)c->softcap, c->alibi, c->sink_kind, h_algo_str(algos[k]));
        h_case("%s", what);
        h_poison_outputs(a);
        const fa_status st = h_run(g_ctx, algos[k], 2, a);
        CHECK(st == FA_OK, "%s: %s", what, fa_context_error(g_ctx));
        if (st != FA_OK) continue;
        read_out(a, o, l);
        compare(what, oref, onaive, o, no, c->odt, 0);
        compare(what, lref, lnaive, l, nl, FA_DTYPE_F32, 1);
        check_empty_rows(what, a, o, l);
    }
    free(oref), free(onaive), free(o), free(lref), free(lnaive), free(l);
    h_problem_free(&p);
}

static void test_dense(h_rng *r)
{
    const fa_dtype dts[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int t = 0; t < 3; t++)
        for (int kind = 0; kind < 3; kind++) {
            if (skip_share(r)) continue;
            dcase c = {{2, 37, 45, 4, 2, 40, 24}, dts[t], t == 0 ? FA_DTYPE_F32 : (kind == 1 ? FA_DTYPE_F32 : dts[t]),
                       0, -1, -1, 0.0f, 0, kind};
            dense_case(&c, r);
            c.causal = FA_CAUSAL_BOTTOM_RIGHT; /* Sq < Sk: no empty row */
            c.d = (h_dims){1, 50, 33, 6, 3, 32, 32}; /* Sq > Sk: 17 empty rows */
            dense_case(&c, r);
            c.causal = FA_CAUSAL_TOP_LEFT;
            c.softcap = 5.0f;
            dense_case(&c, r);
            c.causal = 0;
            c.softcap = 0.0f;
            c.wl = 7, c.wr = 3, c.alibi = 1;
            c.d = (h_dims){2, 70, 90, 2, 2, 64, 64}; /* wide enough for the bf16 pair path */
            dense_case(&c, r);
        }
}

/* ------------------------------------------------------------------ 2. forms */

enum { MODE_VARLEN = 0, MODE_CONTIG = 1, MODE_PAGED = 2 };

typedef struct {
    int mode;
    int64_t nseq, Hq, Hk, D, Dv;
    int64_t sq[MAXS];    /* query rows of each sequence (cache modes: all alike) */
    int64_t sk[MAXS];    /* keys of each sequence, after any append */
    int64_t snew;        /* cache modes: rows appended to every sequence */
    int64_t page;        /* paged: page size */
    fa_dtype dt;
    int causal;
    int64_t splits;      /* FA_PARAM_KV_SPLITS; 0 planned */
    int sink_kind;
} fcase;

/* Row j of sequence b's keys in a contiguous or paged cache. */
static void cache_slot(const fcase *c, const int32_t *table, int64_t max_pages, int64_t b, int64_t j, int64_t *i0,
                       int64_t *i1)
{
    if (c->mode == MODE_PAGED) {
        *i0 = table[b * max_pages + j / c->page];
        *i1 = j % c->page;
    } else {
        *i0 = b;
        *i1 = j;
    }
}

static void copy_row(const fa_tensor *dst, int64_t d0, int64_t d1, int64_t h, const fa_tensor *src, int64_t s1,
                     int64_t n)
{
    for (int64_t e = 0; e < n; e++) h_set(dst, d0, d1, h, e, h_get(src, 0, s1, h, e));
}

static void form_case(const fcase *c, h_rng *r, int threads)
{
    const int64_t n = c->nseq, Hq = c->Hq, Hk = c->Hk, D = c->D, Dv = c->Dv;
    fa_tensor qs[MAXS], ks[MAXS], vs[MAXS];
    int32_t cu_q[MAXS + 1] = {0}, cu_k[MAXS + 1] = {0}, seqlens[MAXS], table[MAXS * 64];
    int64_t smax = 0;
    for (int64_t b = 0; b < n; b++) {
        qs[b] = h_alloc(c->dt, 1, c->sq[b], Hq, D);
        ks[b] = h_alloc(c->dt, 1, c->sk[b], Hk, D);
        vs[b] = h_alloc(c->dt, 1, c->sk[b], Hk, Dv);
        h_fill_normal(&qs[b], r, 1.0);
        h_fill_normal(&ks[b], r, 1.0);
        h_fill_normal(&vs[b], r, 1.0);
        cu_q[b + 1] = cu_q[b] + (int32_t)c->sq[b];
        cu_k[b + 1] = cu_k[b] + (int32_t)c->sk[b];
        seqlens[b] = (int32_t)(c->sk[b] - c->snew);
        if (c->sk[b] > smax) smax = c->sk[b];
    }
    float sinks[MAXH];
    fill_sinks(sinks, Hq, r, c->sink_kind);
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    fa_kv_cache kc = FA_KV_CACHE_INIT;
    a.sinks = sinks;
    a.causal = (fa_causal)c->causal;
    const int64_t tq = cu_q[n], tk = cu_k[n];
    fa_tensor q, o, lse, kn = {0}, vn = {0};
    int64_t max_pages = 0, npages = 0;
    if (c->mode == MODE_VARLEN) {
        q = h_alloc(c->dt, 1, tq, Hq, D), o = h_alloc(c->dt, 1, tq, Hq, Dv), lse = h_alloc(FA_DTYPE_F32, 1, Hq, tq, 1);
        kn = h_alloc(c->dt, 1, tk, Hk, D), vn = h_alloc(c->dt, 1, tk, Hk, Dv);
        for (int64_t b = 0; b < n; b++) {
            for (int64_t i = 0; i < c->sq[b]; i++)
                for (int64_t h = 0; h < Hq; h++) copy_row(&q, 0, cu_q[b] + i, h, &qs[b], i, D);
            for (int64_t j = 0; j < c->sk[b]; j++)
                for (int64_t h = 0; h < Hk; h++) {
                    copy_row(&kn, 0, cu_k[b] + j, h, &ks[b], j, D);
                    copy_row(&vn, 0, cu_k[b] + j, h, &vs[b], j, Dv);
                }
        }
        a.cu_seqlens_q = cu_q, a.cu_seqlens_k = cu_k, a.num_seqs = n;
    } else {
        const int64_t sq = c->sq[0];
        q = h_alloc(c->dt, n, sq, Hq, D), o = h_alloc(c->dt, n, sq, Hq, Dv), lse = h_alloc(FA_DTYPE_F32, n, Hq, sq, 1);
        for (int64_t b = 0; b < n; b++)
            for (int64_t i = 0; i < sq; i++)
                for (int64_t h = 0; h < Hq; h++) copy_row(&q, b, i, h, &qs[b], i, D);
        if (c->mode == MODE_PAGED) {
            max_pages = (smax + c->page - 1) / c->page;
            npages = n * max_pages + 3;
            int32_t perm[MAXS * 64 + 3];
            for (int64_t k = 0; k < npages; k++) perm[k] = (int32_t)k;
            for (int64_t k = npages - 1; k > 0; k--) { /* pages in random order */
                const int64_t j = h_rng_int(r, 0, k);
                const int32_t t = perm[k];
                perm[k] = perm[j], perm[j] = t;
            }
            for (int64_t k = 0; k < n * max_pages; k++) table[k] = perm[k];
            kc.k = h_alloc(c->dt, npages, c->page, Hk, D), kc.v = h_alloc(c->dt, npages, c->page, Hk, Dv);
            kc.block_table = table, kc.max_pages = max_pages;
        } else {
            kc.k = h_alloc(c->dt, n, smax + 2, Hk, D), kc.v = h_alloc(c->dt, n, smax + 2, Hk, Dv);
        }
        /* every slot no sequence may read holds NaN */
        memset(kc.k.data, 0xff, (size_t)h_numel(&kc.k) * h_dtype_bytes(c->dt));
        memset(kc.v.data, 0xff, (size_t)h_numel(&kc.v) * h_dtype_bytes(c->dt));
        if (c->snew > 0) kn = h_alloc(c->dt, n, c->snew, Hk, D), vn = h_alloc(c->dt, n, c->snew, Hk, Dv);
        for (int64_t b = 0; b < n; b++)
            for (int64_t j = 0; j < c->sk[b]; j++)
                for (int64_t h = 0; h < Hk; h++) {
                    if (j >= seqlens[b]) { /* a new row: appended by the call */
                        copy_row(&kn, b, j - seqlens[b], h, &ks[b], j, D);
                        copy_row(&vn, b, j - seqlens[b], h, &vs[b], j, Dv);
                        continue;
                    }
                    int64_t i0, i1;
                    cache_slot(c, table, max_pages, b, j, &i0, &i1);
                    copy_row(&kc.k, i0, i1, h, &ks[b], j, D);
                    copy_row(&kc.v, i0, i1, h, &vs[b], j, Dv);
                }
        kc.seqlens = seqlens;
        a.kv_cache = &kc;
    }
    a.q = q, a.k = kn, a.v = vn, a.o = o, a.lse = lse;
    char what[256];
    snprintf(what, sizeof what, "form %d nseq=%lld Hq=%lld Hk=%lld D=%lld Dv=%lld sq0=%lld sk0=%lld new=%lld page=%lld %s "
             "causal=%d splits=%lld sinks=%d threads=%d", c->mode, (long long)n, (long long)Hq, (long long)Hk,
             (long long)D, (long long)Dv, (long long)c->sq[0], (long long)c->sk[0], (long long)c->snew,
             (long long)c->page, h_dtype_str(c->dt), c->causal, (long long)c->splits, c->sink_kind, threads);
    h_case("%s", what);
    h_poison_outputs(&a);
    fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, c->splits);
    const fa_status st = h_run(g_ctx, FA_ALGO_FLASH, threads, &a);
    fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, 0);
    CHECK(st == FA_OK, "%s: %s", what, fa_context_error(g_ctx));
    for (int64_t b = 0; st == FA_OK && b < n; b++) { /* each sequence against its own dense oracle */
        fa_forward_args s = FA_FORWARD_ARGS_INIT;
        s.q = qs[b], s.k = ks[b], s.v = vs[b], s.sinks = sinks, s.causal = a.causal;
        s.o = h_alloc(c->dt, 1, c->sq[b], Hq, Dv);
        const int64_t no = c->sq[b] * Hq * Dv, nl = Hq * c->sq[b];
        double *oref = dalloc(no), *onaive = dalloc(no), *og = dalloc(no), *lref = dalloc(nl), *lnaive = dalloc(nl),
               *lg = dalloc(nl);
        naive_forward(&s, NAIVE_FP64, oref, lref, NULL);
        naive_forward(&s, NAIVE_SAME_PRECISION, onaive, lnaive, NULL);
        const int64_t ob = c->mode == MODE_VARLEN ? 0 : b, r0 = c->mode == MODE_VARLEN ? cu_q[b] : 0;
        for (int64_t i = 0; i < c->sq[b]; i++)
            for (int64_t h = 0; h < Hq; h++) {
                for (int64_t e = 0; e < Dv; e++) og[(i * Hq + h) * Dv + e] = h_get(&o, ob, r0 + i, h, e);
                lg[h * c->sq[b] + i] = h_get(&lse, ob, h, r0 + i, 0);
            }
        char seq[300];
        snprintf(seq, sizeof seq, "%s, sequence %lld", what, (long long)b);
        compare(seq, oref, onaive, og, no, c->dt, 0);
        compare(seq, lref, lnaive, lg, nl, FA_DTYPE_F32, 1);
        check_empty_rows(seq, &s, og, lg);
        free(oref), free(onaive), free(og), free(lref), free(lnaive), free(lg), free(s.o.data);
    }
    for (int64_t b = 0; b < n; b++) free(qs[b].data), free(ks[b].data), free(vs[b].data);
    free(q.data), free(o.data), free(lse.data), free(kn.data), free(vn.data), free(kc.k.data), free(kc.v.data);
}

static void test_forms(h_rng *r)
{
    const fa_dtype dts[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int t = 0; t < 3; t++)
        for (int kind = 0; kind < 3; kind++) {
            if (skip_share(r)) continue;
            /* varlen: an empty sequence, one without keys, a long one */
            fcase v = {MODE_VARLEN, 5, 4, 2, 32, 16, {3, 0, 9, 40, 5}, {7, 4, 0, 61, 5}, 0, 0, dts[t],
                       kind == 1 ? FA_CAUSAL_BOTTOM_RIGHT : 0, 0, kind};
            form_case(&v, r, 2);
            v.splits = 3;
            form_case(&v, r, 2);
            /* decoding on caches: one query row (or four), GQA 4, the small-row path;
             * forced splits and the planned count */
            const int64_t splits[5] = {0, 1, 2, 3, 7};
            for (int m = MODE_CONTIG; m <= MODE_PAGED; m++)
                for (int s = 0; s < 5; s++) {
                    fcase c = {m, 3, 8, 2, 64, 64, {1, 1, 1}, {150, 1, 97}, 1, 3, dts[t], FA_CAUSAL_BOTTOM_RIGHT,
                               splits[s], kind};
                    form_case(&c, r, 2);
                    if (s == 3) {
                        c.sq[0] = c.sq[1] = c.sq[2] = 4; /* a short prefill: 4 rows x 4 heads */
                        c.sk[1] = 6;
                        c.snew = 4;
                        form_case(&c, r, 1);
                        c.Hk = 8; /* MHA: rows of one head, Dv != D */
                        c.Dv = 40;
                        form_case(&c, r, 2);
                    }
                }
        }
}

/* Split-KV gives the same bits on any thread count, with sinks too. */
static void test_split_bits(h_rng *r)
{
    h_problem p;
    h_problem_alloc(&p, (h_dims){2, 1, 700, 8, 2, 64, 64}, FA_DTYPE_F32, FA_DTYPE_F32);
    fa_forward_args *a = &p.args;
    h_fill_normal(&a->q, r, 1.0), h_fill_normal(&a->k, r, 1.0), h_fill_normal(&a->v, r, 1.0);
    float sinks[8];
    fill_sinks(sinks, 8, r, 0);
    a->sinks = sinks;
    const int64_t no = h_numel(&a->o), nl = h_numel(&a->lse);
    float *o1 = malloc((size_t)no * 4), *l1 = malloc((size_t)nl * 4);
    for (int64_t splits = 1; splits <= 5; splits += 2)
        for (int th = 1; th <= 3; th++) {
            h_case("split bits: splits %lld threads %d", (long long)splits, th);
            fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, splits);
            const fa_status st = h_run(g_ctx, FA_ALGO_FLASH, th, a);
            CHECK(st == FA_OK, "%s", fa_context_error(g_ctx));
            if (th == 1) {
                memcpy(o1, a->o.data, (size_t)no * 4), memcpy(l1, a->lse.data, (size_t)nl * 4);
            } else {
                CHECK(!memcmp(o1, a->o.data, (size_t)no * 4) && !memcmp(l1, a->lse.data, (size_t)nl * 4),
                      "splits %lld: threads %d differ from 1", (long long)splits, th);
            }
        }
    fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, 0);
    free(o1), free(l1);
    h_problem_free(&p);
}

/* docs/semantics.md's rule for a caller merging partial states itself: parts without
 * sinks, plus one part (o = 0, lse = sink_h), equal the call with sinks. */
static void test_merge_rule(h_rng *r)
{
    const h_dims d = {2, 6, 40, 4, 2, 16, 16};
    h_problem p;
    h_problem_alloc(&p, d, FA_DTYPE_F32, FA_DTYPE_F32);
    fa_forward_args *a = &p.args;
    h_fill_normal(&a->q, r, 1.0), h_fill_normal(&a->k, r, 1.0), h_fill_normal(&a->v, r, 1.0);
    float sinks[4], zero = 0.0f;
    fill_sinks(sinks, 4, r, 2);
    sinks[1] = 9.0f;
    a->sinks = sinks;
    h_case("merge rule");
    CHECK(h_run(g_ctx, FA_ALGO_FLASH, 2, a) == FA_OK, "%s", fa_context_error(g_ctx));
    fa_tensor o[3], l[3], om = h_alloc(FA_DTYPE_F32, d.B, d.Sq, d.Hq, d.Dv), lm = h_alloc(FA_DTYPE_F32, d.B, d.Hq, d.Sq, 1);
    for (int part = 0; part < 2; part++) { /* keys 0..19 and 20..39, no sinks */
        fa_forward_args h = *a;
        h.sinks = NULL;
        h.k.data = (float *)a->k.data + part * 20 * a->k.stride[1], h.k.shape[1] = 20;
        h.v.data = (float *)a->v.data + part * 20 * a->v.stride[1], h.v.shape[1] = 20;
        h.o = o[part] = h_alloc(FA_DTYPE_F32, d.B, d.Sq, d.Hq, d.Dv);
        h.lse = l[part] = h_alloc(FA_DTYPE_F32, d.B, d.Hq, d.Sq, 1);
        CHECK(h_run(g_ctx, FA_ALGO_FLASH, 2, &h) == FA_OK, "%s", fa_context_error(g_ctx));
    }
    o[2] = (fa_tensor){&zero, FA_DTYPE_F32, {d.B, d.Sq, d.Hq, d.Dv}, {0, 0, 0, 0}};
    l[2] = (fa_tensor){sinks, FA_DTYPE_F32, {d.B, d.Hq, d.Sq, 1}, {0, 1, 0, 0}};
    CHECK(fa_merge_states(g_ctx, 3, o, l, &om, &lm) == FA_OK, "%s", fa_context_error(g_ctx));
    double worst = 0.0;
    for (int64_t k = 0; k < h_numel(&om); k++) worst = fmax(worst, fabs(((float *)om.data)[k] - ((float *)a->o.data)[k]));
    for (int64_t k = 0; k < h_numel(&lm); k++) {
        const double x = ((float *)lm.data)[k], y = ((float *)a->lse.data)[k];
        worst = fmax(worst, x == y ? 0.0 : fabs(x - y) / fmax(1.0, fabs(y)));
    }
    CHECK(worst <= 1e-5, "merged parts + (0, sink) against the call with sinks: max err %.3g", worst);
    for (int k = 0; k < 2; k++) free(o[k].data), free(l[k].data);
    free(om.data), free(lm.data);
    h_problem_free(&p);
}

/* ------------------------------------------------------------ 3. edge values */

static int same_bytes(const fa_tensor *a, const void *b) { return !memcmp(a->data, b, (size_t)h_numel(a) * h_dtype_bytes(a->dtype)); }

static void *copy_bytes(const fa_tensor *t)
{
    const size_t n = (size_t)h_numel(t) * h_dtype_bytes(t->dtype);
    void *c = malloc(n);
    memcpy(c, t->data, n);
    return c;
}

static void test_edges(h_rng *r)
{
    const h_dims d = {2, 9, 6, 4, 2, 16, 16};
    h_problem p;
    h_problem_alloc(&p, d, FA_DTYPE_F32, FA_DTYPE_F32);
    fa_forward_args *a = &p.args;
    h_fill_normal(&a->q, r, 1.0), h_fill_normal(&a->k, r, 1.0), h_fill_normal(&a->v, r, 1.0);
    a->causal = FA_CAUSAL_BOTTOM_RIGHT; /* 3 empty rows */
    const fa_algo algos[3] = {FA_ALGO_REFERENCE, FA_ALGO_STANDARD, FA_ALGO_FLASH};
    float none[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    float nan_head[4] = {NAN, 0.5f, -1.0f, 2.0f};
    float bad[4] = {0.0f, 1.0f, INFINITY, 0.0f};
    for (int k = 0; k < 3; k++) {
        h_case("edges, %s", h_algo_str(algos[k]));
        /* -inf sinks are no sinks, bit for bit */
        a->sinks = NULL;
        CHECK(h_run(g_ctx, algos[k], 2, a) == FA_OK, "%s", fa_context_error(g_ctx));
        void *o0 = copy_bytes(&a->o), *l0 = copy_bytes(&a->lse);
        a->sinks = none;
        CHECK(h_run(g_ctx, algos[k], 2, a) == FA_OK, "%s", fa_context_error(g_ctx));
        CHECK(same_bytes(&a->o, o0) && same_bytes(&a->lse, l0), "%s: -inf sinks differ from none", h_algo_str(algos[k]));
        /* an old caller's struct_size ends before sinks: the field is not read */
        a->sinks = bad;
        a->struct_size = offsetof(fa_forward_args, sinks);
        CHECK(h_run(g_ctx, algos[k], 2, a) == FA_OK, "old struct_size: %s", fa_context_error(g_ctx));
        CHECK(same_bytes(&a->o, o0) && same_bytes(&a->lse, l0), "%s: old struct_size read sinks", h_algo_str(algos[k]));
        a->struct_size = sizeof(fa_forward_args);
        /* +inf is refused, nothing written */
        h_poison_outputs(a);
        void *op = copy_bytes(&a->o), *lp = copy_bytes(&a->lse);
        CHECK(h_run(g_ctx, algos[k], 2, a) == FA_ERR_INVALID_ARGUMENT, "+inf sink: not FA_ERR_INVALID_ARGUMENT");
        CHECK(strstr(fa_context_error(g_ctx), "sinks[2]") != NULL, "message: %s", fa_context_error(g_ctx));
        CHECK(fa_forward_check(g_ctx, a) == FA_ERR_INVALID_ARGUMENT, "fa_forward_check accepts +inf");
        CHECK(same_bytes(&a->o, op) && same_bytes(&a->lse, lp), "+inf sink: outputs written");
        free(op), free(lp);
        /* a NaN sink: that head's lse NaN, o NaN where a key is kept, 0 where none is;
         * the other heads as the oracle says */
        a->sinks = nan_head;
        CHECK(h_run(g_ctx, algos[k], 2, a) == FA_OK, "%s", fa_context_error(g_ctx));
        const int64_t no = h_numel(&a->o), nl = h_numel(&a->lse);
        double *o = dalloc(no), *l = dalloc(nl), *oref = dalloc(no), *lref = dalloc(nl);
        read_out(a, o, l);
        naive_forward(a, NAIVE_FP64, oref, lref, NULL);
        int64_t bad_rows = 0;
        for (int64_t b = 0; b < d.B; b++)
            for (int64_t i = 0; i < d.Sq; i++)
                for (int64_t h = 0; h < d.Hq; h++) {
                    const double lw = lref[(b * d.Hq + h) * d.Sq + i], lg = l[(b * d.Hq + h) * d.Sq + i];
                    if (h == 0 && !isnan(lg)) bad_rows++;
                    for (int64_t e = 0; e < d.Dv; e++) {
                        const double ow = oref[((b * d.Sq + i) * d.Hq + h) * d.Dv + e], og = o[((b * d.Sq + i) * d.Hq + h) * d.Dv + e];
                        if (h == 0 && i < 3 && og != 0.0) bad_rows++;           /* empty: o = 0 */
                        if (h == 0 && i >= 3 && !isnan(og)) bad_rows++;         /* kept keys: NaN */
                        if (h > 0 && !(fabs(og - ow) <= 1e-5)) bad_rows++;
                    }
                    if (h > 0 && !(fabs(lg - lw) <= 1e-5 * fmax(1.0, fabs(lw)))) bad_rows++;
                }
        CHECK(bad_rows == 0, "%s: NaN sink: %lld elements wrong", h_algo_str(algos[k]), (long long)bad_rows);
        free(o), free(l), free(oref), free(lref), free(o0), free(l0);
    }

    /* a cache call with +inf: status, and neither o nor the cache touched */
    fa_kv_cache kc = FA_KV_CACHE_INIT;
    int32_t seqlens[2] = {3, 5};
    kc.k = h_alloc(FA_DTYPE_F32, 2, 12, 2, 16), kc.v = h_alloc(FA_DTYPE_F32, 2, 12, 2, 16), kc.seqlens = seqlens;
    h_fill_normal(&kc.k, r, 1.0), h_fill_normal(&kc.v, r, 1.0);
    fa_forward_args c = FA_FORWARD_ARGS_INIT;
    c.q = h_alloc(FA_DTYPE_F32, 2, 2, 4, 16), c.o = h_alloc(FA_DTYPE_F32, 2, 2, 4, 16);
    c.k = h_alloc(FA_DTYPE_F32, 2, 2, 2, 16), c.v = h_alloc(FA_DTYPE_F32, 2, 2, 2, 16);
    h_fill_normal(&c.q, r, 1.0), h_fill_normal(&c.k, r, 1.0), h_fill_normal(&c.v, r, 1.0);
    c.kv_cache = &kc, c.sinks = bad;
    h_poison_outputs(&c);
    void *kb = copy_bytes(&kc.k), *vb = copy_bytes(&kc.v), *ob = copy_bytes(&c.o);
    h_case("cache call with a +inf sink");
    CHECK(h_run(g_ctx, FA_ALGO_FLASH, 2, &c) == FA_ERR_INVALID_ARGUMENT, "cache +inf: not refused");
    CHECK(same_bytes(&kc.k, kb) && same_bytes(&kc.v, vb) && same_bytes(&c.o, ob), "cache +inf: something written");
    free(kb), free(vb), free(ob), free(kc.k.data), free(kc.v.data), free(c.q.data), free(c.o.data), free(c.k.data),
        free(c.v.data);
    h_problem_free(&p);
}

/* ------------------------------------------------------------- 5. backward */

typedef struct {
    h_problem p;
    fa_tensor dout, dq, dk, dv;
    float sinks[MAXH], dsinks[MAXH];
} bprob;

static void bprob_make(bprob *bp, h_dims d, fa_dtype dt, int causal, float softcap, h_rng *r, int kind)
{
    memset(bp, 0, sizeof *bp);
    h_problem_alloc(&bp->p, d, dt, dt);
    fa_forward_args *a = &bp->p.args;
    h_fill_normal(&a->q, r, 1.0), h_fill_normal(&a->k, r, 1.0), h_fill_normal(&a->v, r, 1.0);
    bp->dout = h_alloc(dt, d.B, d.Sq, d.Hq, d.Dv);
    h_fill_normal(&bp->dout, r, 1.0);
    bp->dq = h_alloc(FA_DTYPE_F32, d.B, d.Sq, d.Hq, d.D);
    bp->dk = h_alloc(FA_DTYPE_F32, d.B, d.Sk, d.Hk, d.D);
    bp->dv = h_alloc(FA_DTYPE_F32, d.B, d.Sk, d.Hk, d.Dv);
    fill_sinks(bp->sinks, d.Hq, r, kind);
    if (kind == 1)
        for (int64_t h = 0; h < d.Hq; h++) bp->sinks[h] = (float)(1.5 + 0.5 * (double)h); /* comparable to the scores */
    a->sinks = bp->sinks;
    a->causal = (fa_causal)causal;
    a->softcap = softcap;
}

static void bprob_free(bprob *bp)
{
    free(bp->dout.data), free(bp->dq.data), free(bp->dk.data), free(bp->dv.data);
    h_problem_free(&bp->p);
}

/* The forward and backward of algo; dsinks written to bp->dsinks. */
static fa_status run_fb(bprob *bp, fa_algo algo, int threads)
{
    fa_status st = h_run(g_ctx, algo, threads, &bp->p.args);
    if (st != FA_OK) return st;
    fa_backward_args g = FA_BACKWARD_ARGS_INIT;
    g.fwd = &bp->p.args, g.do_ = bp->dout, g.dq = bp->dq, g.dk = bp->dk, g.dv = bp->dv, g.dsinks = bp->dsinks;
    return fa_backward(g_ctx, &g);
}

/* dsink_h = -sum_{b,i} exp(sink_h - lse_i) dot(dO_i, o_i) from the fp64 naive o and lse;
 * *mag receives sum |term|, the scale the f32 sums are judged against. */
static void dsinks_oracle(const bprob *bp, double *want, double *mag)
{
    const fa_forward_args *a = &bp->p.args;
    const h_dims d = bp->p.dims;
    double *o = dalloc(d.B * d.Sq * d.Hq * d.Dv), *lse = dalloc(d.B * d.Hq * d.Sq);
    naive_forward(a, NAIVE_FP64, o, lse, NULL);
    for (int64_t h = 0; h < d.Hq; h++) {
        want[h] = 0.0, mag[h] = 0.0;
        if (bp->sinks[h] == -INFINITY) continue;
        for (int64_t b = 0; b < d.B; b++)
            for (int64_t i = 0; i < d.Sq; i++) {
                double dot = 0.0;
                for (int64_t e = 0; e < d.Dv; e++)
                    dot += h_get(&bp->dout, b, i, h, e) * o[((b * d.Sq + i) * d.Hq + h) * d.Dv + e];
                const double t = exp((double)bp->sinks[h] - lse[(b * d.Hq + h) * d.Sq + i]) * dot;
                want[h] -= t;
                mag[h] += fabs(t);
            }
    }
    free(o), free(lse);
}

static double loss(const fa_forward_args *a, const fa_tensor *dout, double *o)
{
    naive_forward(a, NAIVE_FP64, o, NULL, NULL);
    double L = 0.0;
    const int64_t n = h_numel(&a->o), Sq = a->o.shape[1], Hq = a->o.shape[2], Dv = a->o.shape[3];
    for (int64_t k = 0; k < n; k++) {
        const int64_t e = k % Dv, h = k / Dv % Hq, i = k / Dv / Hq % Sq, b = k / Dv / Hq / Sq;
        L += o[k] * h_get(dout, b, i, h, e);
    }
    return L;
}

static void test_finite_differences(h_rng *r)
{
    for (int opt = 0; opt < 4; opt++) {
        bprob bp;
        bprob_make(&bp, (h_dims){2, 5, 7, 4, 2, 6, 4}, FA_DTYPE_F32, opt == 1 ? FA_CAUSAL_BOTTOM_RIGHT : 0,
                   opt == 2 ? 3.0f : 0.0f, r, opt == 3 ? 2 : 1);
        fa_forward_args *a = &bp.p.args;
        /* inputs on a 2^-8 grid, so that +-2^-10 steps are exact in f32 */
        float *ins[4] = {a->q.data, a->k.data, a->v.data, bp.sinks};
        const int64_t lens[4] = {h_numel(&a->q), h_numel(&a->k), h_numel(&a->v), a->q.shape[2]};
        for (int t = 0; t < 4; t++)
            for (int64_t k = 0; k < lens[t]; k++)
                if (isfinite(ins[t][k])) ins[t][k] = roundf(ins[t][k] * 256.0f) / 256.0f;
        h_case("finite differences, option %d", opt);
        CHECK(run_fb(&bp, FA_ALGO_REFERENCE, 1) == FA_OK, "reference backward: %s", fa_context_error(g_ctx));
        const float *grads[4] = {bp.dq.data, bp.dk.data, bp.dv.data, bp.dsinks};
        double *o = dalloc(h_numel(&a->o));
        const float step = 1.0f / 1024.0f;
        double worst = 0.0, scale = 0.0, worst_s = 0.0;
        for (int t = 0; t < 4; t++)
            for (int64_t k = 0; k < lens[t]; k++) {
                float *x = ins[t] + k;
                if (!isfinite(*x)) {
                    CHECK(grads[t][k] == 0.0f, "dsinks of a -inf sink is %g, not 0", (double)grads[t][k]);
                    continue;
                }
                const float x0 = *x;
                *x = x0 + step;
                const double lp = loss(a, &bp.dout, o);
                *x = x0 - step;
                const double lm = loss(a, &bp.dout, o);
                *x = x0;
                const double fd = (lp - lm) / (2.0 * (double)step), e = fabs(fd - (double)grads[t][k]);
                worst = fmax(worst, e);
                if (t == 3) worst_s = fmax(worst_s, e);
                scale = fmax(scale, fabs(fd));
            }
        CHECK(worst <= 2e-5 * fmax(scale, 1.0), "option %d: max |finite difference - backward| = %.3g (dsinks %.3g, scale %.3g)",
              opt, worst, worst_s, scale);
        free(o);
        bprob_free(&bp);
    }
}

static void compare_grad(const char *what, const fa_tensor *got, const double *want, double tol_rel)
{
    const int64_t n = h_numel(got);
    double scale = 1.0, worst = 0.0;
    for (int64_t k = 0; k < n; k++) scale = fmax(scale, fabs(want[k]));
    for (int64_t k = 0; k < n; k++) {
        const double e = fabs((double)((const float *)got->data)[k] - want[k]);
        if (!(e <= worst)) worst = e;
    }
    CHECK(worst <= tol_rel * scale, "%s: max err %.3g, tol %.3g", what, worst, tol_rel * scale);
}

static double *to_doubles(const fa_tensor *t)
{
    double *x = dalloc(h_numel(t));
    for (int64_t k = 0; k < h_numel(t); k++) x[k] = ((const float *)t->data)[k];
    return x;
}

/* flash and standard against the reference backward; every algorithm's dsinks against
 * the formula. dt: q, k, v, dO dtype (gradients f32). drop: dropout_p. */
static void backward_case(h_dims d, fa_dtype dt, int causal, float softcap, float drop, int kind, h_rng *r)
{
    bprob bp;
    bprob_make(&bp, d, dt, causal, softcap, r, kind);
    bp.p.args.dropout_p = drop;
    bp.p.args.dropout_seed = 1234567;
    char what[256];
    snprintf(what, sizeof what, "backward %s %s causal=%d cap=%g drop=%g sinks=%d", h_dims_str(&d), h_dtype_str(dt),
             causal, (double)softcap, (double)drop, kind);
    h_case("%s", what);
    CHECK(run_fb(&bp, FA_ALGO_REFERENCE, 1) == FA_OK, "%s reference: %s", what, fa_context_error(g_ctx));
    double *rq = to_doubles(&bp.dq), *rk = to_doubles(&bp.dk), *rv = to_doubles(&bp.dv), rs[MAXH], want[MAXH], mag[MAXH];
    for (int64_t h = 0; h < d.Hq; h++) rs[h] = bp.dsinks[h];
    if (drop == 0.0f) { /* the formula on the naive forward (which has no dropout) */
        dsinks_oracle(&bp, want, mag);
        int64_t bad = 0;
        for (int64_t h = 0; h < d.Hq; h++) bad += !(fabs(rs[h] - want[h]) <= 1e-6 * fmax(mag[h], 1e-3));
        CHECK(bad == 0, "%s: reference dsinks against the formula: %lld heads off", what, (long long)bad);
    }
    /* bf16/f16 inputs: the forward's o rounds to the dtype, and D_i = dot(dO, o) with it;
     * bf16 pair paths round P and dS too */
    const double tol = dt == FA_DTYPE_F32 ? 2e-5 : dt == FA_DTYPE_F16 ? 4e-3 : 3e-2;
    const fa_algo algos[2] = {FA_ALGO_STANDARD, FA_ALGO_FLASH};
    for (int k = 0; k < 2; k++) {
        char w2[300];
        snprintf(w2, sizeof w2, "%s %s", what, h_algo_str(algos[k]));
        memset(bp.dsinks, 0xff, sizeof bp.dsinks);
        const fa_status st = run_fb(&bp, algos[k], 2);
        CHECK(st == FA_OK, "%s: %s", w2, fa_context_error(g_ctx));
        if (st != FA_OK) continue;
        compare_grad(w2, &bp.dq, rq, tol);
        compare_grad(w2, &bp.dk, rk, tol);
        compare_grad(w2, &bp.dv, rv, tol);
        double smag = 1.0;
        for (int64_t h = 0; h < d.Hq; h++) smag = fmax(smag, fabs(rs[h]));
        int64_t bad = 0;
        for (int64_t h = 0; h < d.Hq; h++) bad += !(fabs((double)bp.dsinks[h] - rs[h]) <= tol * smag);
        CHECK(bad == 0, "%s: dsinks: %lld heads off (head 0 got %.9g want %.9g)", w2, (long long)bad,
              (double)bp.dsinks[0], rs[0]);
    }
    free(rq), free(rk), free(rv);
    bprob_free(&bp);
}

static void test_backward(h_rng *r)
{
    const fa_dtype dts[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int t = 0; t < 3; t++)
        for (int kind = 0; kind < 3; kind++) {
            if (skip_share(r)) continue;
            backward_case((h_dims){2, 33, 41, 4, 2, 32, 24}, dts[t], 0, 0.0f, 0.0f, kind, r);
            backward_case((h_dims){1, 45, 30, 4, 1, 64, 64}, dts[t], FA_CAUSAL_BOTTOM_RIGHT, 0.0f, 0.0f, kind, r);
            backward_case((h_dims){2, 20, 20, 2, 2, 16, 16}, dts[t], FA_CAUSAL_TOP_LEFT, 4.0f, 0.0f, kind, r);
        }
    /* 4. dropout: the sink never dropped, the lse undropped */
    backward_case((h_dims){2, 33, 41, 4, 2, 32, 24}, FA_DTYPE_F32, 0, 0.0f, 0.25f, 0, r);
    backward_case((h_dims){1, 40, 40, 2, 2, 16, 16}, FA_DTYPE_F32, FA_CAUSAL_BOTTOM_RIGHT, 0.0f, 0.5f, 1, r);
    backward_case((h_dims){1, 40, 40, 2, 2, 64, 64}, FA_DTYPE_BF16, 0, 0.0f, 0.1f, 2, r);
}

/* The forward with dropout keeps the undropped lse: the naive (dropout-free) one. */
static void test_dropout_lse(h_rng *r)
{
    bprob bp;
    bprob_make(&bp, (h_dims){2, 17, 23, 4, 2, 16, 16}, FA_DTYPE_F32, 0, 0.0f, r, 0);
    fa_forward_args *a = &bp.p.args;
    const int64_t nl = h_numel(&a->lse), no = h_numel(&a->o);
    double *lref = dalloc(nl), *o = dalloc(no), *l = dalloc(nl), *oref = dalloc(no);
    naive_forward(a, NAIVE_FP64, o, lref, NULL);
    a->dropout_p = 0.3f, a->dropout_seed = 99;
    const fa_algo algos[3] = {FA_ALGO_REFERENCE, FA_ALGO_STANDARD, FA_ALGO_FLASH};
    for (int k = 0; k < 3; k++) {
        h_case("dropout lse, %s", h_algo_str(algos[k]));
        CHECK(h_run(g_ctx, algos[k], 2, a) == FA_OK, "%s", fa_context_error(g_ctx));
        read_out(a, o, l);
        compare("dropout lse", lref, lref, l, nl, FA_DTYPE_F32, 1);
        if (k == 0) memcpy(oref, o, (size_t)no * sizeof *o);
        else compare("dropout o against the reference", oref, oref, o, no, FA_DTYPE_F32, 0);
    }
    free(lref), free(o), free(l), free(oref);
    bprob_free(&bp);
}

/* Variable-length backward: each sequence's dsinks share adds up; against the dense
 * reference backward of each sequence, summed in the test. */
static void test_varlen_backward(h_rng *r)
{
    const int64_t n = 3, Hq = 4, Hk = 2, D = 16, Dv = 16, sq[3] = {5, 0, 11}, sk[3] = {7, 3, 11};
    int32_t cu_q[4] = {0}, cu_k[4] = {0};
    for (int64_t b = 0; b < n; b++) cu_q[b + 1] = cu_q[b] + (int32_t)sq[b], cu_k[b + 1] = cu_k[b] + (int32_t)sk[b];
    float sinks[4];
    fill_sinks(sinks, Hq, r, 0);
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = h_alloc(FA_DTYPE_F32, 1, cu_q[n], Hq, D), a.k = h_alloc(FA_DTYPE_F32, 1, cu_k[n], Hk, D);
    a.v = h_alloc(FA_DTYPE_F32, 1, cu_k[n], Hk, Dv), a.o = h_alloc(FA_DTYPE_F32, 1, cu_q[n], Hq, Dv);
    a.lse = h_alloc(FA_DTYPE_F32, 1, Hq, cu_q[n], 1);
    h_fill_normal(&a.q, r, 1.0), h_fill_normal(&a.k, r, 1.0), h_fill_normal(&a.v, r, 1.0);
    a.cu_seqlens_q = cu_q, a.cu_seqlens_k = cu_k, a.num_seqs = n, a.sinks = sinks, a.causal = FA_CAUSAL_BOTTOM_RIGHT;
    fa_tensor dout = h_alloc(FA_DTYPE_F32, 1, cu_q[n], Hq, Dv), dq = h_alloc(FA_DTYPE_F32, 1, cu_q[n], Hq, D);
    h_fill_normal(&dout, r, 1.0);
    float dsinks[4];
    h_case("varlen backward");
    CHECK(h_run(g_ctx, FA_ALGO_FLASH, 2, &a) == FA_OK, "%s", fa_context_error(g_ctx));
    fa_backward_args g = FA_BACKWARD_ARGS_INIT;
    g.fwd = &a, g.do_ = dout, g.dq = dq, g.dsinks = dsinks;
    CHECK(fa_backward(g_ctx, &g) == FA_OK, "%s", fa_context_error(g_ctx));
    double want[4] = {0}, mag[4] = {0};
    for (int64_t b = 0; b < n; b++) { /* sequence b as a dense problem, its share of dsinks */
        bprob bp;
        memset(&bp, 0, sizeof bp);
        h_problem_alloc(&bp.p, (h_dims){1, sq[b], sk[b], Hq, Hk, D, Dv}, FA_DTYPE_F32, FA_DTYPE_F32);
        bp.dout = h_alloc(FA_DTYPE_F32, 1, sq[b], Hq, Dv);
        memcpy(bp.sinks, sinks, sizeof sinks);
        bp.p.args.sinks = bp.sinks, bp.p.args.causal = FA_CAUSAL_BOTTOM_RIGHT;
        for (int64_t h = 0; h < Hq; h++) {
            for (int64_t i = 0; i < sq[b]; i++) {
                for (int64_t e = 0; e < D; e++) h_set(&bp.p.args.q, 0, i, h, e, h_get(&a.q, 0, cu_q[b] + i, h, e));
                for (int64_t e = 0; e < Dv; e++) h_set(&bp.dout, 0, i, h, e, h_get(&dout, 0, cu_q[b] + i, h, e));
            }
        }
        for (int64_t j = 0; j < sk[b]; j++)
            for (int64_t h = 0; h < Hk; h++) {
                for (int64_t e = 0; e < D; e++) h_set(&bp.p.args.k, 0, j, h, e, h_get(&a.k, 0, cu_k[b] + j, h, e));
                for (int64_t e = 0; e < Dv; e++) h_set(&bp.p.args.v, 0, j, h, e, h_get(&a.v, 0, cu_k[b] + j, h, e));
            }
        double w[4], m[4];
        dsinks_oracle(&bp, w, m);
        for (int64_t h = 0; h < Hq; h++) want[h] += w[h], mag[h] += m[h];
        free(bp.dout.data);
        h_problem_free(&bp.p);
    }
    int64_t bad = 0;
    for (int64_t h = 0; h < Hq; h++) bad += !(fabs((double)dsinks[h] - want[h]) <= 1e-5 * fmax(mag[h], 1e-3));
    CHECK(bad == 0, "varlen dsinks: %lld heads off (head 0 got %.9g want %.9g)", (long long)bad, (double)dsinks[0], want[0]);
    free(a.q.data), free(a.k.data), free(a.v.data), free(a.o.data), free(a.lse.data), free(dout.data), free(dq.data);
}

/* dsinks bitwise on 1, 2 and 3 threads: (sequence, kv head) tasks, and one MQA
 * sequence, where the backward runs two passes. */
static void test_determinism(h_rng *r)
{
    const h_dims ds[2] = {{3, 40, 50, 6, 2, 32, 32}, {1, 64, 64, 4, 1, 32, 32}};
    for (int k = 0; k < 2; k++) {
        bprob bp;
        bprob_make(&bp, ds[k], FA_DTYPE_F32, FA_CAUSAL_BOTTOM_RIGHT, 0.0f, r, 0);
        float first[MAXH];
        for (int th = 1; th <= 3; th++) {
            h_case("dsinks determinism, shape %d, threads %d", k, th);
            CHECK(run_fb(&bp, FA_ALGO_FLASH, th) == FA_OK, "%s", fa_context_error(g_ctx));
            if (th == 1) memcpy(first, bp.dsinks, sizeof first);
            else CHECK(!memcmp(first, bp.dsinks, (size_t)ds[k].Hq * sizeof(float)), "threads %d: dsinks differ", th);
        }
        bprob_free(&bp);
    }
}

/* The backward's misuse: +inf refused with dsinks untouched; an old struct_size never
 * writes dsinks; no sinks gives dsinks 0. */
static void test_backward_edges(h_rng *r)
{
    bprob bp;
    bprob_make(&bp, (h_dims){1, 8, 8, 4, 2, 16, 16}, FA_DTYPE_F32, 0, 0.0f, r, 0);
    h_case("backward edges");
    CHECK(run_fb(&bp, FA_ALGO_FLASH, 2) == FA_OK, "%s", fa_context_error(g_ctx));
    fa_backward_args g = FA_BACKWARD_ARGS_INIT;
    g.fwd = &bp.p.args, g.do_ = bp.dout, g.dq = bp.dq, g.dsinks = bp.dsinks;
    float poison[MAXH];
    memset(poison, 0x7f, sizeof poison);
    memcpy(bp.dsinks, poison, sizeof poison);
    g.struct_size = offsetof(fa_backward_args, dsinks);
    CHECK(fa_backward(g_ctx, &g) == FA_OK, "old struct_size: %s", fa_context_error(g_ctx));
    CHECK(!memcmp(bp.dsinks, poison, sizeof poison), "old struct_size: dsinks written");
    g.struct_size = sizeof g;
    bp.sinks[1] = INFINITY;
    CHECK(fa_backward(g_ctx, &g) == FA_ERR_INVALID_ARGUMENT, "backward with a +inf sink: not refused");
    CHECK(!memcmp(bp.dsinks, poison, sizeof poison), "+inf: dsinks written");
    bp.p.args.sinks = NULL; /* no sinks: their gradient is 0 */
    CHECK(run_fb(&bp, FA_ALGO_FLASH, 2) == FA_OK, "%s", fa_context_error(g_ctx));
    int64_t nz = 0;
    for (int64_t h = 0; h < 4; h++) nz += bp.dsinks[h] != 0.0f;
    CHECK(nz == 0, "dsinks without sinks: %lld non-zero", (long long)nz);
    bprob_free(&bp);
}

int main(void)
{
    CHECK(h_context_create(&g_ctx) == FA_OK, "context");
    h_rng r;
    uint64_t seed = h_env_u64("FA_TEST_SEED", 0x51c5);
    for (const char *a = getenv("FLASHATTN_ARCH"); a && *a; a++) seed = seed * 131 + (unsigned char)*a;
    h_rng_seed(&r, seed);
    test_dense(&r);
    test_forms(&r);
    test_split_bits(&r);
    test_merge_rule(&r);
    test_edges(&r);
    test_dropout_lse(&r);
    test_finite_differences(&r);
    test_backward(&r);
    test_varlen_backward(&r);
    test_determinism(&r);
    test_backward_edges(&r);
    fa_context_free(g_ctx);
    return h_summary();
}
