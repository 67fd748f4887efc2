/*
 * test_block_mask.c: fa_forward_args.block_mask (docs/semantics.md, "Block mask").
 * The test builds each block mask itself and expands it, by its own reading of the
 * contract's layout, into a dense boolean (B, Hq, Sq, Sk) mask for the oracles (naive.c's
 * fp64 and same-precision attention), so nothing the library computes enters an
 * expected value. Sections:
 *   random      random masks (full, partial and shared element masks, empty q blocks,
 *               empty rows, entries in shuffled order), broadcast over batch and heads,
 *               GQA, with causal, windows, softcap, ALiBi, bias, a dense mask and sinks:
 *               reference, standard and flash against the accuracy rule, o = 0 exactly
 *               and lse = -inf (or the sink) on empty rows; flash bitwise over threads
 *   full        a mask that lists every block full: bitwise the call without one
 *   causal      causal as a block mask (a shared lower-triangular diagonal block)
 *               against causal itself, within the rule
 *   documents   document masks on and off block boundaries and a sparse one: flash
 *               against the oracles, bitwise over threads; the planned tiles span whole
 *               blocks for aligned documents, stay inside one for the sparse mask
 *   dense runs  dense boolean masks whose rows keep runs (the fused forward's bounds),
 *               with tiles that are not, empty rows and an inf V row no row keeps
 *   varlen      packed sequences, a mask per sequence or one broadcast, against dense
 *               per-sequence oracles
 *   cache       a decoding step's tree mask over a contiguous or paged KV cache, new
 *               rows appended (few: the small-row kernels; per-head masks, GQA and MQA
 *               stacks), against each sequence's dense oracle; its work
 *   work        fa_forward_work's pairs against a brute-force count
 *   backward    the reference backward against finite differences of the fp64 naive
 *               forward; flash and standard against the reference; varlen; bitwise
 *               over threads
 *   misuse      every bad count, index and size: its status, a message, outputs untouched
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "naive.h"

static fa_context *g_ctx;

/* ------------------------------------------------------------ a block mask */

typedef struct {
    fa_block_mask m;
    int64_t batch, heads, bq, bk, nqb, nkb;
    int64_t *off;
    int32_t *idx;
    int64_t *part;
    uint8_t *bits;
    int64_t n, np, row_bytes; /* entries, element masks, bytes per element-mask row */
} tmask;

static void tm_init(tmask *t, int64_t batch, int64_t heads, int64_t Sq, int64_t Sk, int64_t bq, int64_t bk)
{
    memset(t, 0, sizeof *t);
    t->batch = batch, t->heads = heads, t->bq = bq, t->bk = bk;
    t->nqb = (Sq + bq - 1) / bq;
    t->nkb = (Sk + bk - 1) / bk;
    t->row_bytes = (bk + 7) / 8;
    const int64_t rows = batch * heads * t->nqb, cap = rows * t->nkb + 1;
    t->off = calloc((size_t)rows + 1, sizeof *t->off);
    t->idx = calloc((size_t)cap, sizeof *t->idx);
    t->part = calloc((size_t)cap, sizeof *t->part);
    t->bits = calloc((size_t)(cap * bq * t->row_bytes), 1);
}

static void tm_free(tmask *t) { free(t->off), free(t->idx), free(t->part), free(t->bits); }

/* The finished mask as the caller hands it over. */
static const fa_block_mask *tm_mask(tmask *t)
{
    fa_block_mask_init(&t->m);
    t->m.block_q = t->bq, t->m.block_k = t->bk, t->m.batch = t->batch, t->m.heads = t->heads;
    t->m.q_blocks = t->nqb;
    t->m.offsets = t->off, t->m.kv_blocks = t->idx, t->m.partial = t->part, t->m.bits = t->bits;
    t->m.n_partial = t->np;
    return &t->m;
}

static uint8_t *tm_block(const tmask *t, int64_t id) { return t->bits + id * t->bq * t->row_bytes; }
static void tm_bit(tmask *t, int64_t id, int64_t r, int64_t c, int keep)
{
    uint8_t *byte = tm_block(t, id) + r * t->row_bytes + c / 8;
    *byte = (uint8_t)(keep ? *byte | (1u << (c % 8)) : *byte & ~(1u << (c % 8)));
}
static int64_t tm_new_block(tmask *t) { return t->np++; }
/* Entry (kb, id) appended to mask row r (rows are filled in order). */
static void tm_add(tmask *t, int64_t r, int64_t kb, int64_t id)
{
    t->idx[t->n] = (int32_t)kb;
    t->part[t->n] = id;
    t->off[r + 1] = ++t->n;
}
static void tm_end_row(tmask *t, int64_t r) { t->off[r + 1] = t->n; }

/* The contract's rule, read by the test: does the mask keep (i, j) of (b, h)? */
static int tm_keeps(const tmask *t, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const int64_t r = ((t->batch > 1 ? b : 0) * t->heads + (t->heads > 1 ? h : 0)) * t->nqb + i / t->bq;
    for (int64_t e = t->off[r]; e < t->off[r + 1]; e++) {
        if (t->idx[e] != j / t->bk) continue;
        if (t->part[e] < 0) return 1;
        const int64_t c = j % t->bk;
        return (tm_block(t, t->part[e])[(i % t->bq) * t->row_bytes + c / 8] >> (c % 8)) & 1;
    }
    return 0;
}

typedef struct {
    double density;    /* share of kv blocks a row lists */
    double partial;    /* share of listed blocks with an element mask */
    double empty_qb;   /* share of mask rows that list nothing */
    double bit_keep;   /* share of set bits in an element mask */
    double share;      /* share of partial entries reusing an earlier element mask */
} tm_spec;

static void tm_random(tmask *t, h_rng *r, const tm_spec *s)
{
    int64_t *order = malloc((size_t)t->nkb * sizeof *order);
    const int64_t rows = t->batch * t->heads * t->nqb;
    for (int64_t row = 0; row < rows; row++) {
        tm_end_row(t, row);
        if (h_rng_uniform(r) < s->empty_qb) continue;
        for (int64_t k = 0; k < t->nkb; k++) order[k] = k;
        for (int64_t k = t->nkb - 1; k > 0; k--) { /* any order (the contract) */
            const int64_t x = h_rng_int(r, 0, k), y = order[k];
            order[k] = order[x], order[x] = y;
        }
        for (int64_t k = 0; k < t->nkb; k++) {
            if (h_rng_uniform(r) >= s->density) continue;
            int64_t id = -1;
            if (h_rng_uniform(r) < s->partial) {
                if (t->np > 0 && h_rng_uniform(r) < s->share) {
                    id = h_rng_int(r, 0, t->np - 1);
                } else {
                    id = tm_new_block(t);
                    for (int64_t a = 0; a < t->bq; a++) {
                        const int empty = h_rng_uniform(r) < 0.15; /* rows of the block that keep nothing */
                        for (int64_t c = 0; c < t->bk; c++) tm_bit(t, id, a, c, !empty && h_rng_uniform(r) < s->bit_keep);
                    }
                }
            }
            tm_add(t, row, order[k], id);
        }
    }
    free(order);
}

/* The mask as a dense bool (B, Hq, Sq, Sk), and-ed with `dense` (NULL: none). */
static fa_tensor tm_expand(const tmask *t, const fa_tensor *dense, int64_t B, int64_t Hq, int64_t Sq, int64_t Sk)
{
    fa_tensor e = h_alloc(FA_DTYPE_BOOL, B, Hq, Sq, Sk);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Sq; i++)
                for (int64_t j = 0; j < Sk; j++) {
                    int keep = tm_keeps(t, b, h, i, j);
                    if (dense && dense->data)
                        keep &= h_get(dense, dense->shape[0] > 1 ? b : 0, dense->shape[1] > 1 ? h : 0, i, j) != 0.0;
                    h_set(&e, b, h, i, j, keep);
                }
    return e;
}

/* ---------------------------------------------------------- comparisons */

static double max_abs(const double *x, int64_t n)
{
    double m = 0.0;
    for (int64_t a = 0; a < n; a++)
        if (isfinite(x[a])) m = fmax(m, fabs(x[a]));
    return m;
}

static int is_ninf(double x) { return isinf(x) && x < 0; }

/* The oracles of one call: fp64 and same-precision o and lse. */
typedef struct {
    int64_t n_o, n_lse;
    double *o64, *lse64, *os, *lses;
} oracle;

/* The oracles of `x` as it is (no block mask). */
static void oracle_of(oracle *or, const fa_forward_args *x)
{
    const int64_t B = x->q.shape[0], Sq = x->q.shape[1], Hq = x->q.shape[2], Dv = x->v.shape[3];
    or->n_o = B * Sq * Hq * Dv;
    or->n_lse = B * Hq * Sq;
    or->o64 = malloc((size_t)(or->n_o + 1) * sizeof(double));
    or->os = malloc((size_t)(or->n_o + 1) * sizeof(double));
    or->lse64 = malloc((size_t)(or->n_lse + 1) * sizeof(double));
    or->lses = malloc((size_t)(or->n_lse + 1) * sizeof(double));
    naive_forward(x, NAIVE_FP64, or->o64, or->lse64, NULL);
    naive_forward(x, NAIVE_SAME_PRECISION, or->os, or->lses, NULL);
}

/* The oracles of `a` with its block mask replaced by the test's dense expansion. */
static void oracle_build(oracle *or, const fa_forward_args *a, const tmask *t)
{
    const int64_t B = a->q.shape[0], Sq = a->q.shape[1], Hq = a->q.shape[2], Sk = a->k.shape[1];
    fa_forward_args x = *a;
    x.block_mask = NULL;
    x.mask = tm_expand(t, &a->mask, B, Hq, Sq, Sk);
    oracle_of(or, &x);
    free(x.mask.data);
}

static void oracle_free(oracle *or) { free(or->o64), free(or->os), free(or->lse64), free(or->lses); }

/* The accuracy rule on o and lse (docs/semantics.md, section 5), o = 0 exactly and lse
 * as the fp64 oracle on rows that keep nothing. */
static void check_rule(const char *what, const fa_forward_args *a, const oracle *or)
{
    const fa_dtype out = a->o.dtype;
    double naive_o = 0.0, naive_l = 0.0, worst = 0.0, lworst = 0.0;
    for (int64_t e = 0; e < or->n_o; e++) naive_o = fmax(naive_o, fabs(or->os[e] - or->o64[e]));
    for (int64_t e = 0; e < or->n_lse; e++)
        if (!is_ninf(or->lse64[e]) && !is_ninf(or->lses[e])) naive_l = fmax(naive_l, fabs(or->lses[e] - or->lse64[e]));
    const double tol = 2.0 * naive_o + h_prop_ulps(out) * h_eps(out) * fmax(1.0, max_abs(or->o64, or->n_o));
    const double ltol = 2.0 * naive_l + h_prop_lse_ulps() * FLT_EPSILON * fmax(1.0, max_abs(or->lse64, or->n_lse));
    int64_t at = -1, lat = -1, inf_bad = 0, empty_bad = 0;
    const int64_t Sq = a->q.shape[1], Hq = a->q.shape[2], Dv = a->v.shape[3];
    for (int64_t e = 0; e < or->n_o; e++) {
        double d = fabs(h_get(&a->o, 0, 0, 0, e) - or->o64[e]);
        if (isnan(d)) d = INFINITY;
        if (d > worst) worst = d, at = e;
    }
    for (int64_t e = 0; e < or->n_lse; e++) {
        const double g = h_get(&a->lse, 0, 0, 0, e), w = or->lse64[e];
        if (is_ninf(w) || is_ninf(g)) {
            inf_bad += is_ninf(w) != is_ninf(g);
        } else {
            double d = fabs(g - w);
            if (isnan(d)) d = INFINITY;
            if (d > lworst) lworst = d, lat = e;
        }
        /* an empty row's o is 0 exactly: lse e is (b, h, i) */
        const int64_t i = e % Sq, h = (e / Sq) % Hq, b = e / (Sq * Hq);
        const int empty = is_ninf(w) || (a->sinks && w == (double)a->sinks[h] && or->o64[((b * Sq + i) * Hq + h) * Dv] == 0.0);
        if (is_ninf(w) || (empty && a->sinks))
            for (int64_t x = 0; x < Dv && is_ninf(w); x++) empty_bad += h_get(&a->o, b, i, h, x) != 0.0;
    }
    CHECK(worst <= tol, "%s: o max err %.3g > tol %.3g at %lld", what, worst, tol, (long long)at);
    CHECK(lworst <= ltol && inf_bad == 0, "%s: lse max err %.3g > tol %.3g (at %lld), %lld -inf mismatches", what,
          lworst, ltol, (long long)lat, (long long)inf_bad);
    CHECK(empty_bad == 0, "%s: %lld elements of empty rows are not 0", what, (long long)empty_bad);
}

static unsigned char *bytes_of(const fa_tensor *t)
{
    const size_t n = (size_t)h_numel(t) * h_dtype_bytes(t->dtype);
    unsigned char *x = malloc(n + 1);
    memcpy(x, t->data, n);
    return x;
}

static int same_bytes(const fa_tensor *t, const unsigned char *x)
{
    return memcmp(t->data, x, (size_t)h_numel(t) * h_dtype_bytes(t->dtype)) == 0;
}

/* ------------------------------------------------------------- a case */

typedef struct {
    h_dims d;
    fa_dtype dt, out;
    fa_causal causal;
    int64_t wl, wr;
    float softcap;
    int alibi, bias, dmask, sinks;
    int64_t bq, bk, mb, mh; /* block sizes; the mask's batch and heads (1: broadcast) */
    tm_spec spec;
    int64_t tile_q, tile_kv;
} bcase;

typedef struct {
    h_problem p;
    tmask tm;
    float slopes[64], sinks[64];
} bprob;

static void describe(const bcase *c, char *buf, size_t n)
{
    snprintf(buf, n,
             "%s dt=%s out=%s causal=%d win=(%lld,%lld) cap=%g alibi=%d bias=%d dmask=%d sinks=%d "
             "blocks=%lldx%lld mask=(%lld,%lld) density=%.2f partial=%.2f empty_qb=%.2f tiles=%lldx%lld",
             h_dims_str(&c->d), h_dtype_str(c->dt), h_dtype_str(c->out), (int)c->causal, (long long)c->wl,
             (long long)c->wr, (double)c->softcap, c->alibi, c->bias, c->dmask, c->sinks, (long long)c->bq,
             (long long)c->bk, (long long)c->mb, (long long)c->mh, c->spec.density, c->spec.partial, c->spec.empty_qb,
             (long long)c->tile_q, (long long)c->tile_kv);
}

static void build(bprob *bp, const bcase *c, h_rng *r)
{
    memset(bp, 0, sizeof *bp);
    const h_dims d = c->d;
    h_problem_alloc(&bp->p, d, c->dt, c->out);
    fa_forward_args *a = &bp->p.args;
    h_fill_normal(&a->q, r, 1.0);
    h_fill_normal(&a->k, r, 1.0);
    h_fill_normal(&a->v, r, 1.0);
    a->causal = c->causal;
    a->window_left = c->wl;
    a->window_right = c->wr;
    a->softcap = c->softcap;
    if (c->alibi) {
        for (int64_t h = 0; h < d.Hq && h < 64; h++) bp->slopes[h] = 0.03f * (float)(h + 1);
        a->alibi_slopes = bp->slopes;
    }
    if (c->bias) {
        a->bias = h_alloc(FA_DTYPE_F32, 1, d.Hq, d.Sq, d.Sk);
        h_fill_normal(&a->bias, r, 0.5);
    }
    if (c->dmask) {
        a->mask = h_alloc(FA_DTYPE_BOOL, d.B, 1, d.Sq, d.Sk);
        for (int64_t e = 0; e < h_numel(&a->mask); e++) ((unsigned char *)a->mask.data)[e] = h_rng_uniform(r) < 0.8;
    }
    if (c->sinks) {
        for (int64_t h = 0; h < d.Hq && h < 64; h++) bp->sinks[h] = (float)h_rng_range(r, -1.0, 2.0);
        a->sinks = bp->sinks;
    }
    tm_init(&bp->tm, c->mb, c->mh, d.Sq, d.Sk, c->bq, c->bk);
    tm_random(&bp->tm, r, &c->spec);
    a->block_mask = tm_mask(&bp->tm);
}

static void release(bprob *bp)
{
    free(bp->p.args.bias.data);
    free(bp->p.args.mask.data);
    tm_free(&bp->tm);
    h_problem_free(&bp->p);
}

/* Every algorithm on `a` against the oracles; flash on threads 1, 2, 3 bitwise. */
static void check_algos(const char *desc, const fa_forward_args *a, const oracle *or)
{
    const fa_algo algos[] = {FA_ALGO_REFERENCE, FA_ALGO_STANDARD, FA_ALGO_FLASH, FA_ALGO_FLASH, FA_ALGO_FLASH};
    const int threads[] = {1, 2, 1, 2, 3};
    unsigned char *o1 = NULL, *l1 = NULL;
    for (int k = 0; k < 5; k++) {
        h_case("%s algo=%s threads=%d", desc, h_algo_str(algos[k]), threads[k]);
        h_poison_outputs(a);
        const fa_status st = h_run(g_ctx, algos[k], threads[k], a);
        if (!CHECK(st == FA_OK, "%s: %s", fa_status_string(st), fa_context_error(g_ctx))) continue;
        char what[64];
        snprintf(what, sizeof what, "%s threads=%d", h_algo_str(algos[k]), threads[k]);
        check_rule(what, a, or);
        if (k == 2) {
            o1 = bytes_of(&a->o);
            l1 = bytes_of(&a->lse);
        } else if (k > 2 && o1) {
            CHECK(same_bytes(&a->o, o1) && same_bytes(&a->lse, l1), "flash threads=%d differs from threads=1",
                  threads[k]);
        }
    }
    free(o1), free(l1);
}

/* A random case's call against the oracles (check_algos) at its tiles. */
static void check_case(const bcase *c, h_rng *r)
{
    char desc[512];
    describe(c, desc, sizeof desc);
    bprob bp;
    build(&bp, c, r);
    oracle or;
    oracle_build(&or, &bp.p.args, &bp.tm);
    h_set_tiles(g_ctx, c->tile_q, c->tile_kv);
    check_algos(desc, &bp.p.args, &or);
    h_set_tiles(g_ctx, 0, 0);
    oracle_free(&or);
    release(&bp);
}

/* A case with random batch, heads (MHA or GQA) and lengths up to lmax, nothing else set. */
static bcase random_heads(h_rng *r, int64_t lmax)
{
    bcase c;
    memset(&c, 0, sizeof c);
    c.d.Hk = h_rng_int(r, 1, 2);
    c.d.Hq = c.d.Hk * h_rng_int(r, 1, 3);
    c.d.B = h_rng_int(r, 1, 2);
    c.d.Sq = h_rng_int(r, 1, lmax);
    c.d.Sk = h_rng_uniform(r) < 0.3 ? c.d.Sq : h_rng_int(r, 1, lmax);
    return c;
}

static void test_random(h_rng *r)
{
    static const int64_t blocks[] = {1, 3, 8, 16, 32, 64, 128};
    static const int64_t tq[] = {0, 0, 8, 16, 24, 64}, tkv[] = {0, 0, 8, 16, 48, 64};
    const int rounds = h_scaled(60);
    for (int t = 0; t < rounds; t++) {
        bcase c = random_heads(r, 160);
        static const int64_t Ds[] = {8, 32, 64, 80, 128};
        c.d.D = Ds[h_rng_int(r, 0, 4)];
        c.d.Dv = h_rng_uniform(r) < 0.8 ? c.d.D : h_rng_int(r, 1, 64);
        c.dt = (fa_dtype)h_rng_int(r, 0, 2);
        c.out = c.dt != FA_DTYPE_F32 && h_rng_uniform(r) < 0.3 ? FA_DTYPE_F32 : c.dt;
        const double u = h_rng_uniform(r);
        c.causal = u < 0.5 ? FA_CAUSAL_NONE : u < 0.75 ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_TOP_LEFT;
        c.wl = c.wr = -1;
        if (h_rng_uniform(r) < 0.2) c.wl = h_rng_int(r, 0, 40), c.wr = h_rng_int(r, -1, 20);
        c.softcap = h_rng_uniform(r) < 0.15 ? 5.0f : 0.0f;
        c.alibi = h_rng_uniform(r) < 0.15;
        c.bias = h_rng_uniform(r) < 0.15;
        c.dmask = h_rng_uniform(r) < 0.2;
        c.sinks = h_rng_uniform(r) < 0.25;
        c.bq = blocks[h_rng_int(r, 0, 6)];
        c.bk = blocks[h_rng_int(r, 0, 6)];
        c.mb = h_rng_uniform(r) < 0.5 ? 1 : c.d.B;
        c.mh = h_rng_uniform(r) < 0.5 ? 1 : c.d.Hq;
        c.spec = (tm_spec){h_rng_range(r, 0.1, 1.0), h_rng_range(r, 0.0, 0.8), h_rng_uniform(r) < 0.3 ? 0.2 : 0.0,
                           h_rng_range(r, 0.3, 0.9), 0.3};
        c.tile_q = tq[h_rng_int(r, 0, 5)];
        c.tile_kv = tkv[h_rng_int(r, 0, 5)];
        check_case(&c, r);
    }
    /* the case the brief names: block mask + dense mask + causal + window + sinks + GQA,
     * long enough for several tiles of planned size */
    bcase c;
    memset(&c, 0, sizeof c);
    c.d = (h_dims){2, 300, 300, 8, 2, 64, 64};
    c.dt = c.out = FA_DTYPE_BF16;
    c.causal = FA_CAUSAL_BOTTOM_RIGHT;
    c.wl = 150, c.wr = -1;
    c.dmask = c.sinks = 1;
    c.bq = c.bk = 64;
    c.mb = 2, c.mh = 8;
    c.spec = (tm_spec){0.6, 0.4, 0.1, 0.7, 0.3};
    check_case(&c, r);
    c.dt = c.out = FA_DTYPE_F32;
    c.bq = 32, c.bk = 128, c.mh = 1;
    check_case(&c, r);
}

/* ------------------------------------------- full mask = no mask, bitwise */

/* Every block listed full: bitwise the call without a mask, on each algorithm; with
 * tiles the planner picks for block sizes they divide, and with forced ones. */
static void test_full(h_rng *r)
{
    const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_BF16, FA_DTYPE_F16};
    for (int k = 0; k < 6; k++) {
        const h_dims d = {1, 256 + 64 * (k % 2), 512, 4, 2, 64, 64};
        bprob bp;
        memset(&bp, 0, sizeof bp);
        h_problem_alloc(&bp.p, d, dts[k % 3], dts[k % 3]);
        fa_forward_args *a = &bp.p.args;
        h_fill_normal(&a->q, r, 1.0);
        h_fill_normal(&a->k, r, 1.0);
        h_fill_normal(&a->v, r, 1.0);
        a->causal = k >= 3 ? FA_CAUSAL_TOP_LEFT : FA_CAUSAL_NONE;
        const int64_t bq = k == 1 ? 64 : 128, bk = k == 2 ? 64 : 256;
        tm_init(&bp.tm, 1, k == 4 ? d.Hq : 1, d.Sq, d.Sk, bq, bk);
        for (int64_t row = 0; row < bp.tm.batch * bp.tm.heads * bp.tm.nqb; row++) {
            tm_end_row(&bp.tm, row);
            for (int64_t kb = bp.tm.nkb - 1; kb >= 0; kb--) tm_add(&bp.tm, row, kb, -1); /* in reverse order */
        }
        /* planned tiles (bitwise where both calls plan the same), and forced ones that
         * divide every block size here, so the two calls run the same tiles */
        const int64_t tiles[2][2] = {{0, 0}, {64, 64}};
        int compared = 0;
        for (int t = 0; t < 2; t++)
            for (int algo = 0; algo < 3; algo++) {
                const fa_algo al = algo == 0 ? FA_ALGO_FLASH : algo == 1 ? FA_ALGO_STANDARD : FA_ALGO_REFERENCE;
                if (al != FA_ALGO_FLASH && t == 1) continue;
                h_case("full mask k=%d tiles=%lldx%lld %s", k, (long long)tiles[t][0], (long long)tiles[t][1], h_algo_str(al));
                h_set_tiles(g_ctx, tiles[t][0], tiles[t][1]);
                a->block_mask = NULL;
                fa_status st = h_run(g_ctx, al, 2, a);
                CHECK(st == FA_OK, "unmasked: %s", fa_context_error(g_ctx));
                unsigned char *o0 = bytes_of(&a->o), *l0 = bytes_of(&a->lse);
                int64_t bq0 = 0, bc0 = 0, bq1 = 0, bc1 = 0;
                fa_context_get(g_ctx, FA_PARAM_LAST_TILE_Q, &bq0);
                fa_context_get(g_ctx, FA_PARAM_LAST_TILE_KV, &bc0);
                h_poison_outputs(a);
                a->block_mask = tm_mask(&bp.tm);
                st = h_run(g_ctx, al, 2, a);
                CHECK(st == FA_OK, "full block mask: %s", fa_context_error(g_ctx));
                fa_context_get(g_ctx, FA_PARAM_LAST_TILE_Q, &bq1);
                fa_context_get(g_ctx, FA_PARAM_LAST_TILE_KV, &bc1);
                /* the contract's promise holds where the planned tiles divide the blocks */
                if (bq0 == bq1 && bc0 == bc1) {
                    compared++;
                    CHECK(same_bytes(&a->o, o0) && same_bytes(&a->lse, l0),
                          "a mask keeping every block differs from no mask (tiles %lldx%lld)", (long long)bq1, (long long)bc1);
                }
                /* inside the blocks, or whole blocks (every block is listed) */
                if (al == FA_ALGO_FLASH && t == 0)
                    CHECK(bq1 > 0 && bc1 > 0 && (bq % bq1 == 0 || (bq1 % bq == 0 || bq1 == d.Sq)) &&
                              (bk % bc1 == 0 || bc1 % bk == 0 || bc1 == d.Sk),
                          "planned tiles %lldx%lld cross %lldx%lld blocks", (long long)bq1, (long long)bc1,
                          (long long)bq, (long long)bk);
                free(o0), free(l0);
            }
        CHECK(compared >= 3, "full mask k=%d: only %d calls ran the tiles of the unmasked one", k, compared);
        h_set_tiles(g_ctx, 0, 0);
        tm_free(&bp.tm);
        h_problem_free(&bp.p);
    }
}

/* ---------------------------------------------------- causal as a block mask */

/* A problem of shape d in dtype dt (o too), q, k, v standard normal. */
static fa_forward_args *random_qkv(h_problem *p, h_dims d, fa_dtype dt, h_rng *r)
{
    h_problem_alloc(p, d, dt, dt);
    h_fill_normal(&p->args.q, r, 1.0);
    h_fill_normal(&p->args.k, r, 1.0);
    h_fill_normal(&p->args.v, r, 1.0);
    return &p->args;
}

static void test_causal(h_rng *r)
{
    const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_BF16};
    for (int k = 0; k < 4; k++) {
        const int64_t N = k < 2 ? 384 : 200, blk = k % 2 ? 64 : 32;
        h_problem p;
        fa_forward_args *a = random_qkv(&p, (h_dims){1, N, N, 4, 4, 64, 64}, dts[k % 2], r);
        /* top-left causal: blocks below the diagonal full, the diagonal one lower
         * triangular, one element mask shared by every diagonal entry */
        tmask tm;
        tm_init(&tm, 1, 1, N, N, blk, blk);
        const int64_t diag = tm_new_block(&tm);
        for (int64_t x = 0; x < blk; x++)
            for (int64_t y = 0; y < blk; y++) tm_bit(&tm, diag, x, y, y <= x);
        for (int64_t qb = 0; qb < tm.nqb; qb++) {
            tm_end_row(&tm, qb);
            for (int64_t kb = 0; kb <= qb; kb++) tm_add(&tm, qb, kb, kb == qb ? diag : -1);
        }
        h_case("causal as a block mask k=%d", k);
        a->causal = FA_CAUSAL_TOP_LEFT;
        fa_status st = h_run(g_ctx, FA_ALGO_FLASH, 2, a);
        CHECK(st == FA_OK, "causal: %s", fa_context_error(g_ctx));
        const int64_t n_o = h_numel(&a->o);
        double *oc = malloc((size_t)n_o * sizeof *oc);
        for (int64_t e = 0; e < n_o; e++) oc[e] = h_get(&a->o, 0, 0, 0, e);
        a->causal = FA_CAUSAL_NONE;
        a->block_mask = tm_mask(&tm);
        h_poison_outputs(a);
        st = h_run(g_ctx, FA_ALGO_FLASH, 2, a);
        CHECK(st == FA_OK, "causal block mask: %s", fa_context_error(g_ctx));
        oracle or;
        oracle_build(&or, a, &tm);
        check_rule("causal block mask", a, &or);
        /* and against causal itself: both within the rule of the same oracle, so within
         * twice its tolerance of each other */
        double naive_o = 0.0, diff = 0.0;
        for (int64_t e = 0; e < n_o; e++) naive_o = fmax(naive_o, fabs(or.os[e] - or.o64[e]));
        for (int64_t e = 0; e < n_o; e++) diff = fmax(diff, fabs(h_get(&a->o, 0, 0, 0, e) - oc[e]));
        const double tol = 2.0 * (2.0 * naive_o + h_prop_ulps(a->o.dtype) * h_eps(a->o.dtype) * fmax(1.0, max_abs(or.o64, n_o)));
        CHECK(diff <= tol, "causal block mask vs causal: %.3g > %.3g", diff, tol);
        oracle_free(&or);
        free(oc);
        tm_free(&tm);
        h_problem_free(&p);
    }
}

/* ---------------------------------------- dense masks of block structure */

/* The keep rule of dense-mask case k for (b, h, i, j): random 32 x 48 blocks (the
 * runs of a tile's rows break where it spans kept and dropped blocks in turn: the
 * careful path), ragged documents, a prefix-LM, a window per head; head 1's row 5
 * keeps every other key of the first 40 (no run: that tile's stack takes the careful
 * path), and key 7 is never kept (its V row is inf). */
static int runs_keep(int k, const unsigned char *blk, int64_t nkb, int64_t b, int64_t h, int64_t i, int64_t j)
{
    if (j == 7) return 0;
    if (h == 1 && i == 5 && j < 40) return j % 2 == 0;
    switch (k % 4) {
    case 0: return blk[((b * 4 + h) * 64 + i / 32) * nkb + j / 48];
    case 1: {
        static const int64_t cuts[] = {0, 70, 150, 151, 260, 1 << 20};
        int64_t di = 0, dj = 0;
        while (cuts[di + 1] <= i + 13 * b) di++;
        while (cuts[dj + 1] <= j + 13 * b) dj++;
        return di == dj;
    }
    case 2: return j < 50 + 20 * h || j <= i;
    default: return j <= i + 5 && j >= i - 30 * (h + 1);
    }
}

/* Dense boolean masks whose rows keep runs of keys (the fused bf16 forward takes
 * their tiles by the runs), per head (GQA: stacked heads differ) or broadcast, with
 * causal on top, rows keeping nothing, tiles that are not runs and an inf V row
 * that every row drops: every algorithm against the oracles, flash bitwise over
 * threads. */
static void test_dense_runs(h_rng *r)
{
    for (int k = 0; k < 8; k++) {
        const int per_head = k % 3 != 2;
        const h_dims d = {2, k % 2 ? 290 : 40, 260, 4, 2, 64, 64};
        const fa_dtype dt = k == 5 ? FA_DTYPE_F32 : FA_DTYPE_BF16;
        h_problem p;
        fa_forward_args *a = random_qkv(&p, d, dt, r);
        a->causal = k >= 4 ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
        const int64_t nkb = (d.Sk + 47) / 48;
        unsigned char *blk = malloc((size_t)(2 * 4 * 64 * nkb));
        for (int64_t e = 0; e < 2 * 4 * 64 * nkb; e++) blk[e] = h_rng_uniform(r) < 0.4;
        a->mask = h_alloc(FA_DTYPE_BOOL, d.B, per_head ? d.Hq : 1, d.Sq, d.Sk);
        for (int64_t b = 0; b < d.B; b++)
            for (int64_t h = 0; h < a->mask.shape[1]; h++)
                for (int64_t i = 0; i < d.Sq; i++)
                    for (int64_t j = 0; j < d.Sk; j++)
                        h_set(&a->mask, b, h, i, j, runs_keep(k, blk, nkb, b, per_head ? h : 0, i, j) ? 1.0 : 0.0);
        for (int64_t b = 0; b < d.B; b++)
            for (int64_t h = 0; h < d.Hk; h++)
                for (int64_t x = 0; x < d.Dv; x++) h_set(&a->v, b, 7, h, x, x % 2 ? INFINITY : -INFINITY);
        oracle or;
        oracle_of(&or, a);
        char desc[64];
        snprintf(desc, sizeof desc, "dense runs k=%d per_head=%d %s", k, per_head, h_dtype_str(dt));
        check_algos(desc, a, &or);
        free(blk);
        oracle_free(&or);
        free(a->mask.data);
        h_problem_free(&p);
    }
}

/* --------------------------------------------------- documents and tiles */

/* Documents (each row keeps its own document's keys) at block boundaries and off
 * them, and a sparse random mask: flash against the oracles on 1 and 2 threads,
 * bitwise between them; the planned tiles of block-aligned documents span whole
 * blocks (more than one), those of the sparse mask stay inside one. */
static void test_documents(h_rng *r)
{
    static const int32_t aligned[] = {0, 128, 256, 384, 512}, ragged[] = {0, 100, 228, 390, 512};
    const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_BF16};
    for (int k = 0; k < 6; k++) {
        const int64_t N = 512, blk = 32;
        const int32_t *docs = k % 3 == 1 ? ragged : aligned;
        const int sparse = k % 3 == 2;
        h_problem p;
        fa_forward_args *a = random_qkv(&p, (h_dims){1, N, N, 4, 2, 64, 64}, dts[k / 3], r);
        tmask tm;
        tm_init(&tm, 1, 1, N, N, blk, blk);
        if (sparse) {
            tm_random(&tm, r, &(tm_spec){0.1, 0.0, 0.0, 0.5, 0.0});
        } else {
            for (int64_t qb = 0; qb < tm.nqb; qb++) {
                tm_end_row(&tm, qb);
                for (int64_t kb = 0; kb < tm.nkb; kb++) { /* its bits, then whether it is full or empty */
                    const int64_t id = tm_new_block(&tm);
                    int64_t kept = 0;
                    for (int64_t x = 0; x < blk; x++)
                        for (int64_t y = 0; y < blk; y++) {
                            int di = 0, dj = 0;
                            while (docs[di + 1] <= qb * blk + x) di++;
                            while (docs[dj + 1] <= kb * blk + y) dj++;
                            tm_bit(&tm, id, x, y, di == dj);
                            kept += di == dj;
                        }
                    if (kept < blk * blk && kept > 0) {
                        tm_add(&tm, qb, kb, id);
                        continue;
                    }
                    memset(tm_block(&tm, id), 0, (size_t)(blk * tm.row_bytes));
                    tm.np--;
                    if (kept > 0) tm_add(&tm, qb, kb, -1);
                }
            }
        }
        a->block_mask = tm_mask(&tm);
        oracle or;
        oracle_build(&or, a, &tm);
        unsigned char *o1 = NULL;
        for (int threads = 1; threads <= 2; threads++) {
            h_case("documents k=%d (%s, %s) threads=%d", k, sparse ? "sparse" : docs == aligned ? "aligned" : "ragged",
                   h_dtype_str(dts[k / 3]), threads);
            h_poison_outputs(a);
            const fa_status st = h_run(g_ctx, FA_ALGO_FLASH, threads, a);
            if (!CHECK(st == FA_OK, "%s", fa_context_error(g_ctx))) continue;
            check_rule("documents", a, &or);
            int64_t tq = 0, tk = 0;
            fa_context_get(g_ctx, FA_PARAM_LAST_TILE_Q, &tq);
            fa_context_get(g_ctx, FA_PARAM_LAST_TILE_KV, &tk);
            if (sparse) CHECK(tq <= blk && tk <= blk, "sparse mask: tiles %lldx%lld cross blocks", (long long)tq, (long long)tk);
            if (docs == aligned && !sparse)
                CHECK(tq % blk == 0 && tk % blk == 0 && tq * tk > blk * blk, "aligned documents: tiles %lldx%lld",
                      (long long)tq, (long long)tk);
            if (threads == 1) o1 = bytes_of(&a->o);
            else if (o1) CHECK(same_bytes(&a->o, o1), "threads=2 differs from threads=1");
        }
        free(o1);
        oracle_free(&or);
        tm_free(&tm);
        h_problem_free(&p);
    }
}

/* ------------------------------------------------------------------ varlen */

/* n sequences' lengths: queries in [1, qmax] (sequence 1 may be empty), keys in
 * [1, kmax] or equal to the queries' (same); their cu arrays and the longest. */
static void varlen_lengths(h_rng *r, int n, int64_t qmax, int64_t kmax, int same, int32_t *cuq, int32_t *cuk,
                           int64_t *sq, int64_t *sk, int64_t *mq, int64_t *mk)
{
    cuq[0] = cuk[0] = 0;
    *mq = *mk = 0;
    for (int b = 0; b < n; b++) {
        sq[b] = h_rng_int(r, b == 1 ? 0 : 1, qmax);
        sk[b] = same ? (sq[b] > 0 ? sq[b] : 1) : h_rng_int(r, 1, kmax);
        cuq[b + 1] = cuq[b] + (int32_t)sq[b];
        cuk[b + 1] = cuk[b] + (int32_t)sk[b];
        *mq = sq[b] > *mq ? sq[b] : *mq;
        *mk = sk[b] > *mk ? sk[b] : *mk;
    }
}

/* Sequence b of the packed call `a` as a dense problem of its own: its q, k, v rows,
 * a's causal, and tm's rows of b as a dense mask. */
static void seq_dense(h_problem *p, const fa_forward_args *a, const tmask *tm, int b, int64_t q0, int64_t sq, int64_t k0,
                      int64_t sk)
{
    const int64_t Hq = a->q.shape[2], Hk = a->k.shape[2], D = a->q.shape[3];
    h_problem_alloc(p, (h_dims){1, sq, sk, Hq, Hk, D, D}, a->q.dtype, a->o.dtype);
    fa_forward_args *x = &p->args;
    for (int64_t i = 0; i < sq; i++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t e = 0; e < D; e++) h_set(&x->q, 0, i, h, e, h_get(&a->q, 0, q0 + i, h, e));
    for (int64_t j = 0; j < sk; j++)
        for (int64_t h = 0; h < Hk; h++)
            for (int64_t e = 0; e < D; e++) {
                h_set(&x->k, 0, j, h, e, h_get(&a->k, 0, k0 + j, h, e));
                h_set(&x->v, 0, j, h, e, h_get(&a->v, 0, k0 + j, h, e));
            }
    x->causal = a->causal;
    x->mask = h_alloc(FA_DTYPE_BOOL, 1, Hq, sq, sk);
    for (int64_t h = 0; h < Hq; h++)
        for (int64_t i = 0; i < sq; i++)
            for (int64_t j = 0; j < sk; j++) h_set(&x->mask, 0, h, i, j, tm_keeps(tm, b, h, i, j));
}

/* Sequence b of a packed or cached call, its o rows r0.. of batch row ob (lse likewise),
 * against the oracles of x, the same sequence as a dense call with the block mask's
 * rows as a dense mask. */
static void check_sequence(const char *what, int b, const fa_forward_args *x, const fa_tensor *o, const fa_tensor *lse,
                           int64_t ob, int64_t r0)
{
    const int64_t sq = x->q.shape[1], Hq = x->q.shape[2], Dv = x->v.shape[3], n_o = sq * Hq * Dv;
    double *o64 = malloc((size_t)(n_o + 1) * sizeof *o64), *l64 = malloc((size_t)(sq * Hq + 1) * sizeof *l64);
    double *os = malloc((size_t)(n_o + 1) * sizeof *os);
    naive_forward(x, NAIVE_FP64, o64, l64, NULL);
    naive_forward(x, NAIVE_SAME_PRECISION, os, NULL, NULL);
    double naive_o = 0.0, worst = 0.0, lworst = 0.0;
    int64_t inf_bad = 0;
    for (int64_t e = 0; e < n_o; e++) naive_o = fmax(naive_o, fabs(os[e] - o64[e]));
    for (int64_t i = 0; i < sq; i++)
        for (int64_t h = 0; h < Hq; h++) {
            for (int64_t e = 0; e < Dv; e++)
                worst = fmax(worst, fabs(h_get(o, ob, r0 + i, h, e) - o64[(i * Hq + h) * Dv + e]));
            const double g = h_get(lse, ob, h, r0 + i, 0), w = l64[h * sq + i];
            if (is_ninf(g) || is_ninf(w)) inf_bad += is_ninf(g) != is_ninf(w);
            else lworst = fmax(lworst, fabs(g - w));
        }
    const fa_dtype dt = o->dtype;
    const double tol = 2.0 * naive_o + h_prop_ulps(dt) * h_eps(dt) * fmax(1.0, max_abs(o64, n_o));
    CHECK(worst <= tol, "%s sequence %d: o err %.3g > %.3g", what, b, worst, tol);
    CHECK(inf_bad == 0 && lworst <= 1e-3 * fmax(1.0, max_abs(l64, sq * Hq)), "%s sequence %d: lse err %.3g, %lld -inf mismatches",
          what, b, lworst, (long long)inf_bad);
    free(o64), free(l64), free(os);
}

static void test_varlen(h_rng *r)
{
    for (int k = 0; k < 6; k++) {
        const int64_t n = 3, Hq = 4, Hk = 2, D = 32;
        int32_t cuq[4], cuk[4];
        int64_t sq[3], sk[3], mq, mk;
        varlen_lengths(r, (int)n, 90, 120, k == 5, cuq, cuk, sq, sk, &mq, &mk);
        const fa_dtype dt = k % 2 ? FA_DTYPE_BF16 : FA_DTYPE_F32;
        fa_tensor q = h_alloc(dt, 1, cuq[n], Hq, D), kk = h_alloc(dt, 1, cuk[n], Hk, D), v = h_alloc(dt, 1, cuk[n], Hk, D);
        fa_tensor o = h_alloc(dt, 1, cuq[n], Hq, D), lse = h_alloc(FA_DTYPE_F32, 1, Hq, cuq[n], 1);
        h_fill_normal(&q, r, 1.0), h_fill_normal(&kk, r, 1.0), h_fill_normal(&v, r, 1.0);
        tmask tm;
        const int64_t mb = k % 3 == 0 ? 1 : n;
        tm_init(&tm, mb, k >= 4 ? Hq : 1, mq, mk, k % 2 ? 16 : 7, k % 2 ? 32 : 5);
        const tm_spec spec = {0.6, 0.5, 0.15, 0.6, 0.3};
        tm_random(&tm, r, &spec);
        fa_forward_args a = FA_FORWARD_ARGS_INIT;
        a.q = q, a.k = kk, a.v = v, a.o = o, a.lse = lse;
        a.cu_seqlens_q = cuq, a.cu_seqlens_k = cuk, a.num_seqs = n;
        a.causal = k == 5 ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
        a.block_mask = tm_mask(&tm);
        h_case("varlen k=%d", k);
        h_poison_outputs(&a);
        const fa_status st = h_run(g_ctx, FA_ALGO_FLASH, 2, &a);
        CHECK(st == FA_OK, "varlen: %s", fa_context_error(g_ctx));
        for (int b = 0; b < n && st == FA_OK; b++) {
            if (sq[b] == 0) continue;
            /* sequence b as a dense call, its mask rows (b, or the broadcast ones) */
            h_problem p;
            seq_dense(&p, &a, &tm, b, cuq[b], sq[b], cuk[b], sk[b]);
            fa_forward_args *x = &p.args;
            check_sequence("varlen", b, x, &o, &lse, 0, cuq[b]);
            free(x->mask.data);
            h_problem_free(&p);
        }
        tm_free(&tm);
        free(q.data), free(kk.data), free(v.data), free(o.data), free(lse.data);
    }
}

/* ------------------------------------------------------------------- caches */

/* A decoding step's tree mask over a KV cache (contiguous or paged, new rows appended):
 * each sequence against its own dense oracle with its keys after the append. */
static void test_cache(h_rng *r)
{
    /* k < 3 and 6, 7: few rows, the small-row kernels' stacks (7: eight heads on one kv head) */
    for (int k = 0; k < 8; k++) {
        const int64_t n = 2, Hq = k >= 6 ? 8 : 4, Hk = k == 7 ? 1 : 2, D = k >= 6 ? 64 : 16,
                      snew = k >= 6 ? 2 : 1 + 3 * k, page = 4;
        const int paged = k % 2;
        const fa_dtype dt = k % 3 == 2 ? FA_DTYPE_BF16 : FA_DTYPE_F32;
        int64_t sk[2], smax = 0;
        int32_t seqlens[2], table[2 * 32];
        for (int b = 0; b < n; b++) {
            seqlens[b] = (int32_t)h_rng_int(r, 0, 40);
            sk[b] = seqlens[b] + snew;
            smax = sk[b] > smax ? sk[b] : smax;
        }
        h_problem seq[2];
        for (int b = 0; b < n; b++) { /* each sequence whole, as the oracle sees it */
            h_problem_alloc(&seq[b], (h_dims){1, snew, sk[b], Hq, Hk, D, D}, dt, dt);
            h_fill_normal(&seq[b].args.q, r, 1.0), h_fill_normal(&seq[b].args.k, r, 1.0), h_fill_normal(&seq[b].args.v, r, 1.0);
        }
        fa_kv_cache kc = FA_KV_CACHE_INIT;
        const int64_t max_pages = (smax + page - 1) / page;
        if (paged) {
            for (int64_t e = 0; e < n * max_pages; e++) table[e] = (int32_t)(n * max_pages - 1 - e); /* reversed */
            kc.k = h_alloc(dt, n * max_pages, page, Hk, D), kc.v = h_alloc(dt, n * max_pages, page, Hk, D);
            kc.block_table = table, kc.max_pages = max_pages;
        } else {
            kc.k = h_alloc(dt, n, smax + 3, Hk, D), kc.v = h_alloc(dt, n, smax + 3, Hk, D);
        }
        fa_tensor q = h_alloc(dt, n, snew, Hq, D), o = h_alloc(dt, n, snew, Hq, D), lse = h_alloc(FA_DTYPE_F32, n, Hq, snew, 1);
        fa_tensor kn = h_alloc(dt, n, snew, Hk, D), vn = h_alloc(dt, n, snew, Hk, D);
        for (int b = 0; b < n; b++) {
            const fa_forward_args *x = &seq[b].args;
            for (int64_t i = 0; i < snew; i++)
                for (int64_t h = 0; h < Hq; h++)
                    for (int64_t e = 0; e < D; e++) h_set(&q, b, i, h, e, h_get(&x->q, 0, i, h, e));
            for (int64_t j = 0; j < sk[b]; j++)
                for (int64_t h = 0; h < Hk; h++)
                    for (int64_t e = 0; e < D; e++) {
                        const double kv[2] = {h_get(&x->k, 0, j, h, e), h_get(&x->v, 0, j, h, e)};
                        if (j >= seqlens[b]) { /* a new row, appended by the call */
                            h_set(&kn, b, j - seqlens[b], h, e, kv[0]), h_set(&vn, b, j - seqlens[b], h, e, kv[1]);
                        } else if (paged) {
                            const int64_t pg = table[b * max_pages + j / page];
                            h_set(&kc.k, pg, j % page, h, e, kv[0]), h_set(&kc.v, pg, j % page, h, e, kv[1]);
                        } else {
                            h_set(&kc.k, b, j, h, e, kv[0]), h_set(&kc.v, b, j, h, e, kv[1]);
                        }
                    }
        }
        kc.seqlens = seqlens;
        tmask tm;
        tm_init(&tm, k % 3 ? n : 1, k >= 3 ? Hq : 1, snew, smax, 1 + k % 4, k == 7 ? 16 : 8);
        const tm_spec spec = {0.7, 0.6, 0.1, 0.6, 0.3};
        tm_random(&tm, r, &spec);
        fa_forward_args a = FA_FORWARD_ARGS_INIT;
        a.q = q, a.k = kn, a.v = vn, a.o = o, a.lse = lse, a.kv_cache = &kc;
        a.causal = k >= 2 ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
        a.block_mask = tm_mask(&tm);
        const int64_t splits = k % 3 == 1 ? 3 : 0; /* split-KV: key chunks merged after */
        h_case("cache k=%d paged=%d new=%lld splits=%lld", k, paged, (long long)snew, (long long)splits);
        h_poison_outputs(&a);
        fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, splits);
        const fa_status st = h_run(g_ctx, FA_ALGO_FLASH, 2, &a);
        fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, 0);
        CHECK(st == FA_OK, "cache: %s", fa_context_error(g_ctx));
        for (int b = 0; b < n && st == FA_OK; b++) {
            fa_forward_args *x = &seq[b].args;
            x->causal = a.causal;
            x->mask = h_alloc(FA_DTYPE_BOOL, 1, Hq, snew, sk[b]);
            for (int64_t h = 0; h < Hq; h++)
                for (int64_t i = 0; i < snew; i++)
                    for (int64_t j = 0; j < sk[b]; j++) h_set(&x->mask, 0, h, i, j, tm_keeps(&tm, b, h, i, j));
            check_sequence("cache", b, x, &o, &lse, b, 0);
            free(x->mask.data);
        }
        fa_work w = FA_WORK_INIT;
        int64_t want = 0;
        for (int b = 0; b < n; b++) /* the pairs after the append */
            for (int64_t h = 0; h < Hq; h++)
                for (int64_t i = 0; i < snew; i++)
                    for (int64_t j = 0; j < sk[b]; j++)
                        want += (a.causal == FA_CAUSAL_NONE || j <= i + sk[b] - snew) && tm_keeps(&tm, b, h, i, j);
        CHECK(fa_forward_work(g_ctx, &a, &w) == FA_OK && w.pairs == want, "cache: fa_forward_work %lld, brute force %lld",
              (long long)w.pairs, (long long)want);
        tm_free(&tm);
        for (int b = 0; b < n; b++) h_problem_free(&seq[b]);
        free(kc.k.data), free(kc.v.data), free(q.data), free(o.data), free(lse.data), free(kn.data), free(vn.data);
    }
}

/* -------------------------------------------------------------------- work */

static void test_work(h_rng *r)
{
    for (int k = 0; k < 8; k++) {
        const h_dims d = {2, h_rng_int(r, 1, 70), h_rng_int(r, 1, 70), 3, 1, 8, 8};
        h_problem p;
        h_problem_alloc(&p, d, FA_DTYPE_F32, FA_DTYPE_F32);
        fa_forward_args *a = &p.args;
        a->causal = k % 3 == 1 ? FA_CAUSAL_BOTTOM_RIGHT : k % 3 == 2 ? FA_CAUSAL_TOP_LEFT : FA_CAUSAL_NONE;
        if (k >= 5) a->window_left = 9, a->window_right = 2;
        tmask tm;
        tm_init(&tm, k % 2 ? d.B : 1, k % 4 < 2 ? 1 : d.Hq, d.Sq, d.Sk, h_rng_int(r, 1, 20), h_rng_int(r, 1, 20));
        const tm_spec spec = {0.5, 0.5, 0.1, 0.5, 0.2};
        tm_random(&tm, r, &spec);
        a->block_mask = tm_mask(&tm);
        int64_t want = 0;
        for (int64_t b = 0; b < d.B; b++)
            for (int64_t h = 0; h < d.Hq; h++)
                for (int64_t i = 0; i < d.Sq; i++)
                    for (int64_t j = 0; j < d.Sk; j++)
                        want += naive_kept_by_position(a, d.Sq, d.Sk, i, j) && tm_keeps(&tm, b, h, i, j);
        fa_work w = FA_WORK_INIT;
        h_case("work k=%d", k);
        const fa_status st = fa_forward_work(g_ctx, a, &w);
        CHECK(st == FA_OK && w.pairs == want, "fa_forward_work: %s, pairs %lld, brute force %lld", fa_status_string(st),
              (long long)w.pairs, (long long)want);
        CHECK(w.flops == 2.0 * (double)(d.D + d.Dv) * (double)want, "flops %.0f", w.flops);
        tm_free(&tm);
        h_problem_free(&p);
    }
}

/* ----------------------------------------------------------------- backward */

typedef struct {
    fa_tensor dout, dq, dk, dv;
} grads;

static void grads_alloc(grads *g, const fa_forward_args *a, fa_dtype gdt)
{
    g->dout = h_alloc(a->q.dtype, a->o.shape[0], a->o.shape[1], a->o.shape[2], a->o.shape[3]);
    g->dq = h_alloc(gdt, a->q.shape[0], a->q.shape[1], a->q.shape[2], a->q.shape[3]);
    g->dk = h_alloc(gdt, a->k.shape[0], a->k.shape[1], a->k.shape[2], a->k.shape[3]);
    g->dv = h_alloc(gdt, a->v.shape[0], a->v.shape[1], a->v.shape[2], a->v.shape[3]);
}

static void grads_free(grads *g) { free(g->dout.data), free(g->dq.data), free(g->dk.data), free(g->dv.data); }

static fa_status run_backward(const fa_forward_args *a, grads *g, fa_algo algo, int threads)
{
    fa_status st = h_run(g_ctx, algo, threads, a);
    if (st != FA_OK) return st;
    fa_backward_args b = FA_BACKWARD_ARGS_INIT;
    b.fwd = a;
    b.do_ = g->dout, b.dq = g->dq, b.dk = g->dk, b.dv = g->dv;
    return fa_backward(g_ctx, &b);
}

static double *snapshot(const fa_tensor *t)
{
    const int64_t n = h_numel(t);
    double *x = malloc((size_t)(n + 1) * sizeof *x);
    for (int64_t e = 0; e < n; e++) x[e] = h_get(t, 0, 0, 0, e);
    return x;
}

/* L = sum(o * dO), o from the fp64 naive forward of `a` with mask `m` in place of the block mask. */
static double loss(const fa_forward_args *a, const fa_tensor *m, const fa_tensor *dout, double *o)
{
    fa_forward_args x = *a;
    x.block_mask = NULL;
    x.mask = *m;
    naive_forward(&x, NAIVE_FP64, o, NULL, NULL);
    double L = 0.0;
    for (int64_t e = 0; e < h_numel(dout); e++) L += o[e] * h_get(dout, 0, 0, 0, e);
    return L;
}

/* The reference backward with a block mask against central differences of the fp64
 * naive forward with the test's expansion of it. */
static void test_finite_differences(h_rng *r)
{
    for (int opt = 0; opt < 4; opt++) {
        const h_dims d = {1, 7, 9, 2, 1, 6, 4};
        h_problem p;
        h_problem_alloc(&p, d, FA_DTYPE_F32, FA_DTYPE_F32);
        fa_forward_args *a = &p.args;
        h_fill_normal(&a->q, r, 1.0), h_fill_normal(&a->k, r, 1.0), h_fill_normal(&a->v, r, 1.0);
        const fa_tensor *ins[3] = {&a->q, &a->k, &a->v};
        for (int t = 0; t < 3; t++) /* a 2^-8 grid, so +-2^-10 steps are exact in f32 */
            for (int64_t e = 0; e < h_numel(ins[t]); e++) {
                float *x = (float *)ins[t]->data + e;
                *x = roundf(*x * 256.0f) / 256.0f;
            }
        float sinks[2] = {0.3f, -0.5f};
        if (opt == 1) a->causal = FA_CAUSAL_TOP_LEFT;
        if (opt == 2) a->softcap = 2.0f, a->sinks = sinks;
        if (opt == 3) a->window_left = 3, a->window_right = 1;
        tmask tm;
        tm_init(&tm, 1, opt % 2 ? 1 : d.Hq, d.Sq, d.Sk, 2, 3);
        const tm_spec spec = {0.8, 0.6, 0.1, 0.6, 0.3};
        tm_random(&tm, r, &spec);
        a->block_mask = tm_mask(&tm);
        fa_tensor m = tm_expand(&tm, NULL, d.B, d.Hq, d.Sq, d.Sk);
        grads g;
        grads_alloc(&g, a, FA_DTYPE_F32);
        h_fill_normal(&g.dout, r, 1.0);
        h_case("finite differences opt=%d", opt);
        const fa_status st = run_backward(a, &g, FA_ALGO_REFERENCE, 1);
        CHECK(st == FA_OK, "reference backward: %s", fa_context_error(g_ctx));
        const fa_tensor *gr[3] = {&g.dq, &g.dk, &g.dv};
        double *o = malloc((size_t)h_numel(&a->o) * sizeof *o), worst = 0.0, scale = 0.0;
        const float step = 1.0f / 1024.0f;
        for (int t = 0; t < 3; t++)
            for (int64_t e = 0; e < h_numel(ins[t]); e++) {
                float *x = (float *)ins[t]->data + e;
                const float x0 = *x;
                *x = x0 + step;
                const double lp = loss(a, &m, &g.dout, o);
                *x = x0 - step;
                const double lm = loss(a, &m, &g.dout, o);
                *x = x0;
                const double fd = (lp - lm) / (2.0 * (double)step);
                worst = fmax(worst, fabs(fd - h_get(gr[t], 0, 0, 0, e)));
                scale = fmax(scale, fabs(fd));
            }
        CHECK(worst <= 2e-5 * fmax(scale, 1.0) && scale > 0.0, "max |finite difference - backward| %.3g (scale %.3g)",
              worst, scale);
        free(o), free(m.data);
        grads_free(&g);
        tm_free(&tm);
        h_problem_free(&p);
    }
}

/* Flash and standard backward against the reference backward of the same block-masked
 * call (itself checked by finite differences above); flash bitwise over threads. f32:
 * the fp32 pipeline's few ulps per accumulated term; bf16: against the flash backward of
 * the same call with the expanded dense mask, which differs only in what is skipped. */
static void test_backward(h_rng *r)
{
    const int rounds = h_scaled(16);
    for (int t = 0; t < rounds; t++) {
        bcase c = random_heads(r, 150);
        c.d.D = c.d.Dv = t % 3 == 0 ? 64 : 32;
        c.dt = c.out = t % 4 == 3 ? FA_DTYPE_BF16 : FA_DTYPE_F32;
        if (c.dt != FA_DTYPE_F32 && c.d.Sq < 17) c.d.Sq += 17; /* wide tiles (below) */
        c.causal = t % 3 == 1 ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
        c.wl = c.wr = -1;
        if (t % 5 == 4) c.wl = 30, c.wr = 10;
        c.softcap = t % 6 == 5 ? 4.0f : 0.0f;
        c.dmask = t % 7 == 3;
        c.sinks = t % 4 == 1;
        static const int64_t blocks[] = {4, 16, 32, 64};
        c.bq = blocks[h_rng_int(r, c.dt == FA_DTYPE_F32 ? 0 : 1, 3)];
        c.bk = blocks[h_rng_int(r, 0, 3)];
        c.mb = t % 2 ? c.d.B : 1;
        c.mh = t % 3 ? c.d.Hq : 1;
        c.spec = (tm_spec){h_rng_range(r, 0.2, 0.9), 0.5, 0.15, 0.6, 0.3};
        char desc[512];
        describe(&c, desc, sizeof desc);
        bprob bp;
        build(&bp, &c, r);
        fa_forward_args *a = &bp.p.args;
        grads g;
        grads_alloc(&g, a, FA_DTYPE_F32);
        h_fill_normal(&g.dout, r, 1.0);
        const fa_tensor *gr[3] = {&g.dq, &g.dk, &g.dv};
        const char *names[3] = {"dq", "dk", "dv"};
        double *want[3];
        fa_status st;
        /* bf16: the same tiles for both calls, and wide ones (the rounding of P and dS
         * to bf16 makes another blocking of the products, or the small-row path the
         * dense call takes for blocks of a few rows, differ by bf16 ulps) */
        if (c.dt != FA_DTYPE_F32) h_set_tiles(g_ctx, c.bq, c.bk);
        if (c.dt == FA_DTYPE_F32) {
            h_case("%s backward reference", desc);
            st = run_backward(a, &g, FA_ALGO_REFERENCE, 1);
            CHECK(st == FA_OK, "reference: %s", fa_context_error(g_ctx));
        } else { /* the dense-mask twin on flash */
            fa_forward_args x = *a;
            x.block_mask = NULL;
            fa_tensor m = tm_expand(&bp.tm, &a->mask, c.d.B, c.d.Hq, c.d.Sq, c.d.Sk);
            x.mask = m;
            h_case("%s backward dense-mask twin", desc);
            st = run_backward(&x, &g, FA_ALGO_FLASH, 2);
            CHECK(st == FA_OK, "dense twin: %s", fa_context_error(g_ctx));
            free(m.data);
        }
        for (int k = 0; k < 3; k++) want[k] = snapshot(gr[k]);
        const fa_algo algos[4] = {FA_ALGO_STANDARD, FA_ALGO_FLASH, FA_ALGO_FLASH, FA_ALGO_FLASH};
        const int threads[4] = {2, 1, 2, 3};
        double *first[3] = {0};
        for (int run = 0; run < 4; run++) {
            if (c.dt != FA_DTYPE_F32 && run == 0) continue;
            h_case("%s backward %s threads=%d", desc, h_algo_str(algos[run]), threads[run]);
            for (int k = 0; k < 3; k++) h_fill(gr[k], 777.0);
            st = run_backward(a, &g, algos[run], threads[run]);
            if (!CHECK(st == FA_OK, "%s: %s", h_algo_str(algos[run]), fa_context_error(g_ctx))) continue;
            for (int k = 0; k < 3; k++) {
                const int64_t n = h_numel(gr[k]);
                double scale = 0.0, worst = 0.0;
                for (int64_t e = 0; e < n; e++) scale = fmax(scale, fabs(want[k][e]));
                for (int64_t e = 0; e < n; e++) {
                    double x = fabs(h_get(gr[k], 0, 0, 0, e) - want[k][e]);
                    worst = fmax(worst, isnan(x) ? INFINITY : x);
                }
                const int64_t terms = (k == 0 ? c.d.Sk : c.d.Sq * (c.d.Hq / c.d.Hk)) * (c.d.D + c.d.Dv);
                /* the fp32 pipeline's few ulps per accumulated term (bf16: the two calls'
                 * forwards may differ in the last bit of an lse, where the band and the
                 * -inf of a mask reach the softmax kernel in two forms) */
                double tol = (8.0 + 2.0 * sqrt((double)terms)) * 1.2e-7 * fmax(scale, 1.0);
                /* bf16 pairs: the twins may take different pipelines (the fused tile
                 * backward takes the block mask, not the dense one), whose exps differ in
                 * the last bits of an f32 p, which flips the bf16 rounding of a p or ds
                 * term; two bf16 ulps of the gradient's scale bound such flips */
                if (c.dt != FA_DTYPE_F32) tol += 2.0 * 0x1p-8 * scale;
                CHECK(worst <= tol, "%s %s threads=%d: max err %.3g > %.3g", names[k], h_algo_str(algos[run]),
                      threads[run], worst, tol);
                if (run == 1) first[k] = snapshot(gr[k]);
                else if (run > 1 && first[k]) {
                    int same = 1;
                    for (int64_t e = 0; e < n; e++) same &= h_get(gr[k], 0, 0, 0, e) == first[k][e];
                    CHECK(same, "%s: flash threads=%d differs from threads=1", names[k], threads[run]);
                }
            }
        }
        h_set_tiles(g_ctx, 0, 0);
        for (int k = 0; k < 3; k++) free(want[k]), free(first[k]);
        grads_free(&g);
        release(&bp);
    }
}

/* The varlen backward against each sequence's dense backward on the reference. */
static void test_varlen_backward(h_rng *r)
{
    for (int k = 0; k < 3; k++) {
        const int64_t n = 2, Hq = 2, Hk = 1, D = 16;
        int32_t cuq[3], cuk[3];
        int64_t sq[2], sk[2], mq, mk;
        varlen_lengths(r, (int)n, 60, 60, 0, cuq, cuk, sq, sk, &mq, &mk);
        fa_forward_args a = FA_FORWARD_ARGS_INIT;
        a.q = h_alloc(FA_DTYPE_F32, 1, cuq[n], Hq, D), a.k = h_alloc(FA_DTYPE_F32, 1, cuk[n], Hk, D);
        a.v = h_alloc(FA_DTYPE_F32, 1, cuk[n], Hk, D), a.o = h_alloc(FA_DTYPE_F32, 1, cuq[n], Hq, D);
        a.lse = h_alloc(FA_DTYPE_F32, 1, Hq, cuq[n], 1);
        h_fill_normal(&a.q, r, 1.0), h_fill_normal(&a.k, r, 1.0), h_fill_normal(&a.v, r, 1.0);
        a.cu_seqlens_q = cuq, a.cu_seqlens_k = cuk, a.num_seqs = n;
        a.causal = k == 1 ? FA_CAUSAL_TOP_LEFT : FA_CAUSAL_NONE;
        tmask tm;
        tm_init(&tm, k == 2 ? 1 : n, Hq, mq, mk, 8, 16);
        const tm_spec spec = {0.6, 0.5, 0.1, 0.6, 0.3};
        tm_random(&tm, r, &spec);
        a.block_mask = tm_mask(&tm);
        grads g;
        grads_alloc(&g, &a, FA_DTYPE_F32);
        h_fill_normal(&g.dout, r, 1.0);
        h_case("varlen backward k=%d", k);
        fa_status st = run_backward(&a, &g, FA_ALGO_FLASH, 2);
        CHECK(st == FA_OK, "varlen backward: %s", fa_context_error(g_ctx));
        for (int b = 0; b < n && st == FA_OK; b++) {
            if (sq[b] == 0) continue;
            h_problem p;
            grads gb;
            seq_dense(&p, &a, &tm, b, cuq[b], sq[b], cuk[b], sk[b]);
            fa_forward_args *x = &p.args;
            grads_alloc(&gb, x, FA_DTYPE_F32);
            for (int64_t i = 0; i < sq[b]; i++)
                for (int64_t h = 0; h < Hq; h++)
                    for (int64_t e = 0; e < D; e++) h_set(&gb.dout, 0, i, h, e, h_get(&g.dout, 0, cuq[b] + i, h, e));
            st = run_backward(x, &gb, FA_ALGO_REFERENCE, 1);
            CHECK(st == FA_OK, "dense reference: %s", fa_context_error(g_ctx));
            double worst = 0.0, scale = 0.0;
            for (int64_t i = 0; i < sq[b]; i++)
                for (int64_t h = 0; h < Hq; h++)
                    for (int64_t e = 0; e < D; e++) {
                        const double w = h_get(&gb.dq, 0, i, h, e);
                        scale = fmax(scale, fabs(w));
                        worst = fmax(worst, fabs(h_get(&g.dq, 0, cuq[b] + i, h, e) - w));
                    }
            for (int64_t j = 0; j < sk[b]; j++)
                for (int64_t e = 0; e < D; e++) {
                    const double wk = h_get(&gb.dk, 0, j, 0, e), wv = h_get(&gb.dv, 0, j, 0, e);
                    scale = fmax(scale, fmax(fabs(wk), fabs(wv)));
                    worst = fmax(worst, fabs(h_get(&g.dk, 0, cuk[b] + j, 0, e) - wk));
                    worst = fmax(worst, fabs(h_get(&g.dv, 0, cuk[b] + j, 0, e) - wv));
                }
            CHECK(worst <= 2e-5 * fmax(scale, 1.0), "varlen backward sequence %d: err %.3g (scale %.3g)", b, worst, scale);
            free(x->mask.data);
            grads_free(&gb);
            h_problem_free(&p);
        }
        grads_free(&g);
        tm_free(&tm);
        free(a.q.data), free(a.k.data), free(a.v.data), free(a.o.data), free(a.lse.data);
    }
}

/* ------------------------------------------------------------------- misuse */

static int all_value(const fa_tensor *t, double x)
{
    for (int64_t e = 0; e < h_numel(t); e++)
        if (h_get(t, 0, 0, 0, e) != x) return 0;
    return 1;
}

static void expect(const fa_forward_args *a, fa_status want, const char *what)
{
    h_case("misuse: %s", what);
    h_poison_outputs(a);
    const fa_status st = h_run(g_ctx, FA_ALGO_FLASH, 2, a);
    CHECK(st == want, "%s: got %s, want %s (%s)", what, fa_status_string(st), fa_status_string(want), fa_context_error(g_ctx));
    CHECK(fa_context_error(g_ctx)[0] != '\0', "%s: no message", what);
    CHECK(all_value(&a->o, 12345.0) && all_value(&a->lse, 12345.0), "%s: outputs written", what);
    const fa_status st2 = fa_forward_check(g_ctx, a);
    CHECK(st2 == want, "%s: fa_forward_check says %s", what, fa_status_string(st2));
}

static void test_misuse(h_rng *r)
{
    const h_dims d = {2, 20, 30, 2, 1, 8, 8};
    h_problem p;
    h_problem_alloc(&p, d, FA_DTYPE_F32, FA_DTYPE_F32);
    fa_forward_args *a = &p.args;
    h_fill_normal(&a->q, r, 1.0), h_fill_normal(&a->k, r, 1.0), h_fill_normal(&a->v, r, 1.0);
    tmask tm;
    tm_init(&tm, 1, 1, d.Sq, d.Sk, 8, 8); /* 3 q blocks, 4 kv blocks */
    const tm_spec spec = {1.0, 0.5, 0.0, 0.5, 0.0};
    tm_random(&tm, r, &spec);
    a->block_mask = tm_mask(&tm);
    h_case("misuse: the valid mask");
    CHECK(h_run(g_ctx, FA_ALGO_FLASH, 2, a) == FA_OK, "valid mask refused: %s", fa_context_error(g_ctx));

    fa_block_mask m = tm.m;
    a->block_mask = &m;
#define BAD(field, value, status)                                                                                    \
    do {                                                                                                             \
        m = tm.m;                                                                                                    \
        m.field = value;                                                                                             \
        expect(a, status, #field " = " #value);                                                                      \
    } while (0)
    BAD(struct_size, 8, FA_ERR_STRUCT_SIZE);
    BAD(block_q, 0, FA_ERR_INVALID_ARGUMENT);
    BAD(block_k, -3, FA_ERR_INVALID_ARGUMENT);
    BAD(block_k, (int64_t)1 << 31, FA_ERR_INVALID_ARGUMENT);
    BAD(batch, 3, FA_ERR_BROADCAST);
    BAD(heads, 0, FA_ERR_BROADCAST);
    BAD(q_blocks, 2, FA_ERR_SHAPE_MISMATCH);
    BAD(offsets, NULL, FA_ERR_NULL_POINTER);
    BAD(kv_blocks, NULL, FA_ERR_NULL_POINTER);
    BAD(bits, NULL, FA_ERR_NULL_POINTER);
    BAD(n_partial, -1, FA_ERR_INVALID_ARGUMENT);
    BAD(n_partial, INT64_MAX / 2, FA_ERR_OVERFLOW);
    /* the arrays themselves: a copy of each, spoiled one entry at a time */
    const int64_t rows = tm.nqb, entries = tm.n;
    int64_t *off = malloc((size_t)(rows + 1) * sizeof *off), *part = malloc((size_t)entries * sizeof *part);
    int32_t *idx = malloc((size_t)entries * sizeof *idx);
#define RESET() (memcpy(off, tm.off, (size_t)(rows + 1) * sizeof *off), memcpy(idx, tm.idx, (size_t)entries * sizeof *idx), \
                 memcpy(part, tm.part, (size_t)entries * sizeof *part), m = tm.m, m.offsets = off, m.kv_blocks = idx,     \
                 m.partial = part)
    RESET();
    off[0] = 1;
    expect(a, FA_ERR_OUT_OF_RANGE, "offsets[0] = 1");
    RESET();
    off[1] = off[2] + 1;
    expect(a, FA_ERR_OUT_OF_RANGE, "offsets decreasing");
    RESET();
    idx[entries - 1] = (int32_t)tm.nkb;
    expect(a, FA_ERR_OUT_OF_RANGE, "kv block = ceil(Sk / block_k)");
    RESET();
    idx[0] = -1;
    expect(a, FA_ERR_OUT_OF_RANGE, "kv block -1");
    RESET();
    part[1] = tm.np;
    expect(a, FA_ERR_OUT_OF_RANGE, "partial = n_partial");
    RESET();
    part[0] = -2;
    expect(a, FA_ERR_OUT_OF_RANGE, "partial = -2");
    RESET();
    idx[1] = idx[0]; /* row 0 lists all 4 blocks: entries 0 and 1 are in it */
    expect(a, FA_ERR_INVALID_ARGUMENT, "a kv block twice in one row");
    /* a backward with a bad mask writes no gradient */
    RESET();
    idx[0] = (int32_t)tm.nkb;
    {
        grads g;
        grads_alloc(&g, a, FA_DTYPE_F32);
        h_fill(&g.dq, 777.0), h_fill(&g.dk, 777.0), h_fill(&g.dv, 777.0);
        fa_backward_args b = FA_BACKWARD_ARGS_INIT;
        b.fwd = a;
        b.do_ = g.dout, b.dq = g.dq, b.dk = g.dk, b.dv = g.dv;
        h_case("misuse: backward with a bad index");
        const fa_status st = fa_backward(g_ctx, &b);
        CHECK(st == FA_ERR_OUT_OF_RANGE, "backward: got %s", fa_status_string(st));
        CHECK(all_value(&g.dq, 777.0) && all_value(&g.dk, 777.0) && all_value(&g.dv, 777.0), "backward wrote gradients");
        grads_free(&g);
    }
    free(off), free(idx), free(part);
#undef RESET
#undef BAD
    tm_free(&tm);
    h_problem_free(&p);
}

int main(void)
{
    if (h_context_create(&g_ctx) != FA_OK) return 1;
    h_rng r;
    h_rng_seed(&r, h_env_u64("FA_TEST_SEED", 32));
    test_misuse(&r);
    test_work(&r);
    test_full(&r);
    test_causal(&r);
    test_documents(&r);
    test_dense_runs(&r);
    test_random(&r);
    test_varlen(&r);
    test_cache(&r);
    test_finite_differences(&r);
    test_backward(&r);
    test_varlen_backward(&r);
    fa_context_free(g_ctx);
    return h_summary();
}
