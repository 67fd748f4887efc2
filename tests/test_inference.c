/*
 * test_inference.c: the inference forms (docs/semantics.md, section 8; the header's
 * comments on cu_seqlens_*, fa_kv_cache, FA_PARAM_KV_SPLITS and fa_merge_states)
 * against an oracle that shares nothing with them.
 *
 * The oracle. For every call the test itself turns what the library is given into
 * plain dense per-sequence tensors: it slices packed q/k/v by cu_seqlens, walks the
 * block table, applies batch_idx, performs the append into its own copy of the cache
 * (rounding to the cache dtype, or quantising int8 rows with its own quantiser), and
 * dequantises int8 rows with their scales. Each sequence is then one dense B = 1 call
 * with FA_ALGO_REFERENCE (fp64 loops, tested by test_property against naive.c), and
 * the accuracy rule of docs/semantics.md applies over the whole call, as in test_property:
 *   max|o - o_ref| <= 2 * max|o_naive_same_precision - o_ref| + ulps * max(1, max|o_ref|),
 * with the naive same-precision attention (naive.c) run in q's dtype when the cache has
 * q's dtype, and in f32 otherwise (mixed dtypes promote, as in PyTorch; int8 caches are
 * judged on their dequantised values in f32). Rows with no key at all must be exactly
 * o = 0, lse = -inf.
 *
 * Beyond the numbers, every call with a cache checks the cache afterwards: appended rows
 * must sit exactly at seqlens[b].. (bit for bit for float caches; int8 rows may differ by
 * one step only where x / scale is within 2e-4 of a rounding tie, and scales by at most
 * one ulp), every other byte of k, v and the scales must be unchanged. Every slot no
 * sequence may read (rows past the valid length, spare pages, unowned packed rows) holds
 * NaN (int8: a NaN scale), so reading one shows up as a NaN output. Packed o rows that no
 * sequence owns must keep their sentinel bytes.
 *
 * Sections: varlen (ragged lengths with 0, 1 and one long sequence; causal both ways,
 * windows, softcap, ALiBi [Hq] and [B, Hq], lse; unowned packed rows before and after),
 * contiguous caches with and without batch_idx, paged caches (page sizes 1, 3, 16, 128;
 * pages in random order; pages shared between sequences, also at other positions;
 * invalid ids in block-table entries no sequence uses), strided caches (head-major, padded
 * rows) and head-major q/o, append into f32/f16/bf16/i8 caches (with all-zero rows),
 * chunked prefill (packed q + cache + packed new rows), a decode sweep (Sq 1..16, GQA
 * 1/4/8, D 64/128/72, q f32/f16/bf16), MLA latent caches (v_in_k: DeepSeek's decode
 * shape Hq 128 / Hk 1 / D 576 / Dv 512 and a 16-head stack in every form and cache dtype,
 * prefill chunks, random latent shapes; the oracle builds explicit V from the latent
 * rows), new rows of every float dtype into every cache dtype with q of another dtype
 * (the header's contract), split-KV (forced 1, 2, 3, 7, 64, 256 and planned,
 * LAST_KV_SPLITS, the planned count's formula, threads 1 vs 2 bitwise, a dense call with
 * forced splits), int8 rows with known quantisation, fa_merge_states (the formula with
 * lse far from 0, -inf sides, all sides empty, in place, n = 1, strided o; merging
 * attention over 2 and 3 disjoint key sets equals attention over all keys; misuse), the
 * error cases (status, o/lse untouched, cache byte-identical; latent-cache misuse too), NaN isolation between
 * sequences, and an old struct_size that must ignore the new fields.
 *
 * Inference forms run only on flash: a subset of the cases also checks that STANDARD and
 * REFERENCE refuse them with FA_ERR_UNSUPPORTED and touch nothing.
 * FA_TEST_SCALE < 1 (the sanitizer build) runs a share of the random cases, drawn with a
 * different seed on each ISA path; the fixed cases all run.
 * FA_TEST_SEED overrides the seed; FA_TEST_VERBOSE=1 prints each case as it starts.
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "naive.h"

enum { MAXS = 12 };         /* sequences per case */
enum { SENTINEL = 0xa5 };   /* o/lse bytes before a call */
enum { MODE_VARLEN = 0, MODE_CONTIG = 1, MODE_PAGED = 2 };

static fa_context *g_ctx;
static double g_worst[3];   /* worst err/tol per q dtype, printed for information */
static double g_q_max_err[3][3]; /* max |o - o_ref| seen on i8, f8e4m3, f8e5m2 caches, per o dtype */
static double g_q_worst[3][3];   /* worst err/tol there */
static int64_t g_i8_ties;   /* int8 appends that landed one step off at a near-tie */
static int64_t g_cases;

/* ------------------------------------------------------------ small helpers */

static size_t dt_bytes(fa_dtype dt) { return h_dtype_bytes(dt); }
static const char *dt_str(fa_dtype dt) { return h_dtype_str(dt); }
/* i8 and the fp8 formats: cache dtypes of codes times scales */
static int dt_quant(fa_dtype dt) { return dt == FA_DTYPE_I8 || dt == FA_DTYPE_F8E4M3 || dt == FA_DTYPE_F8E5M2; }
static int dt_fp8(fa_dtype dt) { return dt == FA_DTYPE_F8E4M3 || dt == FA_DTYPE_F8E5M2; }
/* The largest code magnitude: a per-row scale is max|x| / this (docs/semantics.md). */
static float dt_qmax(fa_dtype dt) { return dt == FA_DTYPE_F8E4M3 ? 448.0f : dt == FA_DTYPE_F8E5M2 ? 57344.0f : 127.0f; }
static int dt_index(fa_dtype dt) { return dt == FA_DTYPE_F32 ? 0 : dt == FA_DTYPE_F16 ? 1 : 2; }

/* A zeroed row-major tensor of any dtype. */
static fa_tensor t_alloc(fa_dtype dt, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    return h_alloc(dt, d0, d1, d2, d3);
}

static size_t t_nbytes(const fa_tensor *t) { return (size_t)h_numel(t) * dt_bytes(t->dtype); }

/* A (d0, d1, d2, d3) tensor in a layout: 0 row-major; 1 axes 1 and 2 swapped in memory
 * (head-major for (B, S, H, D)); 2 row-major with `pad` spare elements after each
 * last-axis row, filled with 0xff bytes (NaN in every float dtype). *bytes receives the
 * size of the allocation. */
static fa_tensor t_alloc_layout(fa_dtype dt, int64_t d0, int64_t d1, int64_t d2, int64_t d3, int layout, int64_t pad,
                                size_t *bytes) {
    fa_tensor t;
    if (layout == 1) {
        t = t_alloc(dt, d0, d2, d1, d3);
        const int64_t sh = t.shape[1], st = t.stride[1];
        t.shape[1] = t.shape[2], t.stride[1] = t.stride[2];
        t.shape[2] = sh, t.stride[2] = st;
        *bytes = t_nbytes(&t);
    } else if (layout == 2) {
        t = t_alloc(dt, d0, d1, d2, d3 + pad);
        *bytes = t_nbytes(&t);
        t.shape[3] = d3;
        memset(t.data, 0xff, *bytes);
    } else {
        t = t_alloc(dt, d0, d1, d2, d3);
        *bytes = t_nbytes(&t);
    }
    return t;
}

static int8_t *i8_at(const fa_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return (int8_t *)t->data + h_offset(t, i0, i1, i2, i3);
}

/* A cache element's value: dequantised for int8 and fp8 (the code's value by the
 * format's definition, harness.c, times the scale). */
static double cache_val(const fa_tensor *data, const fa_tensor *scale, int64_t i0, int64_t i1, int64_t h,
                        int64_t d) {
    if (dt_quant(data->dtype)) return h_get(scale, i0, i1, h, 0) * h_get(data, i0, i1, h, d);
    return h_get(data, i0, i1, h, d);
}

static void shuffle(h_rng *r, int32_t *x, int64_t n) {
    for (int64_t i = n - 1; i > 0; i--) {
        const int64_t j = h_rng_int(r, 0, i);
        const int32_t t = x[i];
        x[i] = x[j], x[j] = t;
    }
}

static int all_bytes(const void *p, size_t n, unsigned char value) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != value) return 0;
    return 1;
}

static double max_abs(const double *x, int64_t n) {
    double m = 0.0;
    for (int64_t a = 0; a < n; a++)
        if (isfinite(x[a]) && fabs(x[a]) > m) m = fabs(x[a]);
    return m;
}

/* The test's own int8 quantiser (the header's rule): scale = max|x| / 127 in f32 (or s_in, shared),
 * q = round-to-nearest(x / scale), a zero row gets scale 0 and q = 0. *tie[d] is set
 * where x / scale lies within 2e-4 of a rounding tie (an implementation multiplying by
 * 1/scale may land on the other side there). */
static float quantize_row(const double *x, int64_t n, const float *s_in, int8_t *q, unsigned char *tie) {
    float amax = 0.0f;
    for (int64_t d = 0; d < n; d++) amax = fmaxf(amax, fabsf((float)x[d]));
    const float s = s_in ? *s_in : amax / 127.0f;
    for (int64_t d = 0; d < n; d++) {
        if (s == 0.0f) {
            q[d] = 0, tie[d] = 0;
            continue;
        }
        const float r = (float)x[d] / s;
        double v = floor((double)r + 0.5);
        if (v > 127.0) v = 127.0;
        if (v < -127.0) v = -127.0;
        q[d] = (int8_t)v;
        const double frac = (double)r - floor((double)r);
        tie[d] = fabs(frac - 0.5) < 2e-4;
    }
    return s;
}

/* The fp8 append of one row, by the test's reading of the rule: scale = max|x| / FMAX
 * in f32 (or the shared scale s_in when s_in is not NULL), codes = the nearest code to
 * x * (1 / scale) in f32 (harness.c's bisection), 0 for a zero scale. Bit-exact. */
static float quantize_row_fp8(const double *x, int64_t n, fa_dtype dt, const float *s_in, uint8_t *q) {
    float s;
    if (s_in) {
        s = *s_in;
    } else {
        float amax = 0.0f;
        for (int64_t d = 0; d < n; d++) amax = fmaxf(amax, fabsf((float)x[d]));
        s = amax / dt_qmax(dt);
    }
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    for (int64_t d = 0; d < n; d++) q[d] = (uint8_t)h_fp8_from_double((double)((float)x[d] * inv), dt);
    return s;
}

/* ------------------------------------------------------------------ a case */

typedef struct icase {
    int mode;          /* MODE_VARLEN (no cache), MODE_CONTIG, MODE_PAGED */
    int varlen_q;      /* cache modes: q (and the new rows) packed by cu_seqlens */
    int64_t B, Hq, Hk, D, Dv;
    fa_dtype qdt, odt, cdt; /* cdt: the cache dtype (MODE_VARLEN: q's) */
    int32_t sq[MAXS], sold[MAXS], snew[MAXS]; /* per sequence: q rows, cached rows, new rows */
    int append;        /* new rows given (MODE_VARLEN: always, they are the keys) */
    int batch_idx;     /* contiguous: map sequences to random rows of a larger cache */
    int64_t page_size;
    int share;         /* paged: sequences share whole old pages of sequence 0 (reads only) */
    int bt_garbage;    /* paged: invalid ids in block-table entries no sequence uses */
    int32_t q_off, q_tail, k_off, k_tail; /* unowned packed rows before / after */
    int zero_rows;     /* make some new (token, head) rows all zero (int8: scale 0) */
    float scale, softcap;
    fa_causal causal;
    int64_t wl, wr;
    int alibi;         /* 0, 1 = [Hq], 2 = [B, Hq] */
    int lse;
    int64_t tile_q, tile_kv;
    double q_sigma;
    int qlayout;       /* q, o, new k/v: 0 (B, S, H, D) row-major, 1 head-major (B, H, S, D) */
    int clayout;       /* cache: 0 row-major, 1 head-major, 2 rows padded (3 spare elements) */
    int mla;           /* MLA latent cache (v_in_k): V is K's first Dv columns; 1: the cache's v, the
                          new v and v_scale empty, 2: given as K's views */
    int new_dt;        /* 1: the new k, v rows are kdt, vdt (else q's dtype) */
    fa_dtype kdt, vdt;
    int scale_mode;    /* quantised caches: 0 a scale per (token, head); 1 shared by a cache row's or page's
                          tokens (token stride 0); 2 one per tensor (all strides 0) */
} icase;

static void icase_init(icase *c) {
    memset(c, 0, sizeof *c);
    c->B = 1, c->Hq = 2, c->Hk = 1, c->D = 64, c->Dv = 64;
    c->qdt = c->odt = c->cdt = FA_DTYPE_F32;
    c->wl = c->wr = -1;
    c->lse = 1;
    c->page_size = 16;
    c->q_sigma = 1.0;
}

static void describe(const icase *c, char *buf, size_t n) {
    static const char *const modes[] = {"varlen", "contiguous", "paged"};
    int k = snprintf(buf, n,
                     "%s%s B=%lld Hq=%lld Hk=%lld D=%lld Dv=%lld q=%s o=%s cache=%s append=%d%s%s ps=%lld%s "
                     "causal=%d win=(%lld,%lld) softcap=%g scale=%g alibi=%d lse=%d tiles=%lldx%lld off=%d/%d/%d/%d "
                     "zero_rows=%d layouts=%d/%d mla=%d new=%s/%s scale_mode=%d lens(sq,old,new)=",
                     modes[c->mode], c->varlen_q ? "+packed q" : "", (long long)c->B, (long long)c->Hq,
                     (long long)c->Hk, (long long)c->D, (long long)c->Dv, dt_str(c->qdt), dt_str(c->odt),
                     dt_str(c->cdt), c->append, c->batch_idx ? " batch_idx" : "", c->share ? " shared" : "",
                     (long long)c->page_size, c->bt_garbage ? " bt-garbage" : "", (int)c->causal,
                     (long long)c->wl, (long long)c->wr, (double)c->softcap, (double)c->scale, c->alibi, c->lse,
                     (long long)c->tile_q, (long long)c->tile_kv, c->q_off, c->q_tail, c->k_off, c->k_tail,
                     c->zero_rows, c->qlayout, c->clayout, c->mla, dt_str(c->new_dt ? c->kdt : c->qdt),
                     dt_str(c->new_dt ? c->vdt : c->qdt), c->scale_mode);
    for (int64_t b = 0; b < c->B && k > 0 && (size_t)k < n; b++)
        k += snprintf(buf + k, n - (size_t)k, "(%d,%d,%d)", c->sq[b], c->sold[b], c->snew[b]);
}

/* Everything one call needs, and the test's own view of it. */
typedef struct iprob {
    icase c;
    char desc[900];
    int packed_q, packed_k, has_cache;
    fa_forward_args a;
    fa_tensor v_own; /* mla: the new v buffer the call does not get (a.v is k's view or empty) */
    fa_kv_cache kc;
    fa_tensor lse_t; /* allocated even when the call gets no lse */
    int32_t cu_q[MAXS + 1], cu_k[MAXS + 1], seqlens[MAXS], bidx[MAXS];
    int32_t *bt;
    int64_t total_q, total_k, num_pages;
    float *slopes;
    fa_tensor cache[4];            /* k, v, k_scale, v_scale (the scales: int8 only) */
    size_t cbytes[4];              /* their allocations' sizes (layouts may pad) */
    unsigned char *snap[4];        /* before the call */
    unsigned char *expect[4];      /* the test's own append applied to the snapshot */
    unsigned char *tie_k, *tie_v;  /* near-tie flags of the expected int8 k, v elements */
    int ncache;
    size_t o_bytes, lse_bytes;
    int64_t last_splits;
    int64_t last_packed; /* FA_PARAM_LAST_KV_PACKED after the last run */
    /* the oracle, computed once per problem (runs differ only in threads and splits) */
    int have_oracle;
    double *ref, *nv, *lref, *lnv;
    int64_t no, nl;
    fa_dtype in_dt;
} iprob;

/* The slot (cache row or page, row) of key j of sequence b. */
static void slot_of(const iprob *p, int64_t b, int64_t j, int64_t *i0, int64_t *i1) {
    if (p->c.mode == MODE_PAGED) {
        *i0 = p->bt[b * p->kc.max_pages + j / p->c.page_size];
        *i1 = j % p->c.page_size;
    } else {
        *i0 = p->c.batch_idx ? p->bidx[b] : b;
        *i1 = j;
    }
}

/* Row indices (i0, i1) of q/o row i of sequence b, and of new k/v row j. */
static void q_row(const iprob *p, int64_t b, int64_t i, int64_t *i0, int64_t *i1) {
    *i0 = p->packed_q ? 0 : b;
    *i1 = p->packed_q ? p->cu_q[b] + i : i;
}
static void k_row(const iprob *p, int64_t b, int64_t j, int64_t *i0, int64_t *i1) {
    *i0 = p->packed_k ? 0 : b;
    *i1 = p->packed_k ? p->cu_k[b] + j : j;
}

static void fill_nan(const fa_tensor *t) {
    for (int64_t e = 0; e < h_numel(t); e++) h_set(t, 0, 0, 0, e, NAN);
}

static void iprob_expect(iprob *p);

/* A quantised cache's scale tensor over (d0, d1, Hk, 1) as c->scale_mode says:
 * per row (in the cache's layout), shared along the tokens, or one for all. */
static fa_tensor scale_alloc(const icase *c, int64_t d0, int64_t d1, size_t *bytes) {
    if (c->scale_mode == 0) return t_alloc_layout(FA_DTYPE_F32, d0, d1, c->Hk, 1, c->clayout, 1, bytes);
    fa_tensor t = c->scale_mode == 1 ? t_alloc(FA_DTYPE_F32, d0, 1, c->Hk, 1) : t_alloc(FA_DTYPE_F32, 1, 1, 1, 1);
    *bytes = t_nbytes(&t);
    if (c->scale_mode == 2) t.shape[0] = d0, t.shape[2] = c->Hk, t.stride[0] = t.stride[2] = 0;
    t.shape[1] = d1, t.stride[1] = 0;
    return t;
}

static void iprob_build(iprob *p, const icase *c, h_rng *r) {
    memset(p, 0, sizeof *p);
    fa_kv_cache_init(&p->kc);
    p->c = *c;
    describe(c, p->desc, sizeof p->desc);
    const int64_t B = c->B;
    p->has_cache = c->mode != MODE_VARLEN;
    p->packed_q = c->mode == MODE_VARLEN || c->varlen_q;
    const int has_new = c->mode == MODE_VARLEN || c->append;
    p->packed_k = has_new && p->packed_q;
    fa_forward_args init = FA_FORWARD_ARGS_INIT;
    p->a = init;
    fa_forward_args *a = &p->a;

    p->cu_q[0] = c->q_off;
    p->cu_k[0] = c->k_off;
    for (int64_t b = 0; b < B; b++) {
        p->cu_q[b + 1] = p->cu_q[b] + c->sq[b];
        p->cu_k[b + 1] = p->cu_k[b] + c->snew[b];
    }
    p->total_q = p->cu_q[B] + c->q_tail;
    p->total_k = p->cu_k[B] + c->k_tail;

    /* q, o, lse */
    if (p->packed_q) {
        a->q = t_alloc_layout(c->qdt, 1, p->total_q, c->Hq, c->D, c->qlayout, 0, &p->o_bytes);
        a->o = t_alloc_layout(c->odt, 1, p->total_q, c->Hq, c->Dv, c->qlayout, 0, &p->o_bytes);
        p->lse_t = h_alloc(FA_DTYPE_F32, 1, c->Hq, p->total_q, 1);
        fill_nan(&a->q);
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < c->sq[b]; i++)
                for (int64_t h = 0; h < c->Hq; h++)
                    for (int64_t d = 0; d < c->D; d++)
                        h_set(&a->q, 0, p->cu_q[b] + i, h, d, c->q_sigma * h_rng_normal(r));
        a->cu_seqlens_q = p->cu_q;
        a->num_seqs = B;
    } else {
        a->q = t_alloc_layout(c->qdt, B, c->sq[0], c->Hq, c->D, c->qlayout, 0, &p->o_bytes);
        a->o = t_alloc_layout(c->odt, B, c->sq[0], c->Hq, c->Dv, c->qlayout, 0, &p->o_bytes);
        p->lse_t = h_alloc(FA_DTYPE_F32, B, c->Hq, c->sq[0], 1);
        h_fill_normal(&a->q, r, c->q_sigma);
    }
    if (c->lse) a->lse = p->lse_t;
    p->lse_bytes = t_nbytes(&p->lse_t);

    /* new rows (MODE_VARLEN: all the keys) */
    if (has_new) {
        const fa_dtype kdt = c->new_dt ? c->kdt : c->qdt, vdt = c->new_dt ? c->vdt : c->qdt;
        if (p->packed_k) {
            size_t nb;
            a->k = t_alloc_layout(kdt, 1, p->total_k, c->Hk, c->D, c->qlayout, 0, &nb);
            a->v = t_alloc_layout(vdt, 1, p->total_k, c->Hk, c->Dv, c->qlayout, 0, &nb);
            fill_nan(&a->k), fill_nan(&a->v);
            for (int64_t b = 0; b < B; b++)
                for (int64_t j = 0; j < c->snew[b]; j++)
                    for (int64_t h = 0; h < c->Hk; h++) {
                        for (int64_t d = 0; d < c->D; d++) h_set(&a->k, 0, p->cu_k[b] + j, h, d, h_rng_normal(r));
                        for (int64_t d = 0; d < c->Dv; d++) h_set(&a->v, 0, p->cu_k[b] + j, h, d, h_rng_normal(r));
                    }
            a->cu_seqlens_k = p->cu_k;
        } else {
            size_t nb;
            a->k = t_alloc_layout(kdt, B, c->snew[0], c->Hk, c->D, c->qlayout, 0, &nb);
            a->v = t_alloc_layout(vdt, B, c->snew[0], c->Hk, c->Dv, c->qlayout, 0, &nb);
            h_fill_normal(&a->k, r, 1.0);
            h_fill_normal(&a->v, r, 1.0);
        }
        if (c->zero_rows) /* every third (token, head) row of k, every fourth of v: all zero */
            for (int64_t b = 0; b < B; b++)
                for (int64_t j = 0; j < c->snew[b]; j++)
                    for (int64_t h = 0; h < c->Hk; h++) {
                        int64_t i0, i1;
                        k_row(p, b, j, &i0, &i1);
                        if ((j + h) % 3 == 0)
                            for (int64_t d = 0; d < c->D; d++) h_set(&a->k, i0, i1, h, d, 0.0);
                        if ((j + 2 * h) % 4 == 1)
                            for (int64_t d = 0; d < c->Dv; d++) h_set(&a->v, i0, i1, h, d, 0.0);
                    }
        if (c->mla) { /* V is the new k's first Dv columns: its own buffer stays unused */
            p->v_own = a->v;
            fa_tensor view = a->k;
            view.shape[3] = c->Dv;
            a->v = c->mla == 2 ? view : (fa_tensor){0};
        }
    }

    a->scale = c->scale;
    a->softcap = c->softcap;
    a->causal = c->causal;
    a->window_left = c->wl;
    a->window_right = c->wr;
    if (c->alibi) {
        const int64_t n = c->alibi == 2 ? B * c->Hq : c->Hq;
        p->slopes = malloc(sizeof(float) * (size_t)n);
        for (int64_t s = 0; s < n; s++) p->slopes[s] = (float)h_rng_range(r, 0.01, 1.0);
        a->alibi_slopes = p->slopes;
        a->alibi_stride_b = c->alibi == 2 ? c->Hq : 0;
    }
    if (!p->has_cache) return;

    /* ---- the cache */
    int64_t need_max = 0;
    for (int64_t b = 0; b < B; b++) {
        p->seqlens[b] = c->sold[b];
        const int64_t need = c->sold[b] + (c->append ? c->snew[b] : 0);
        need_max = need > need_max ? need : need_max;
    }
    int64_t d0, d1;
    if (c->mode == MODE_CONTIG) {
        const int64_t b_cache = B + (c->batch_idx ? h_rng_int(r, 1, 3) : 0);
        d0 = b_cache;
        d1 = need_max + h_rng_int(r, 0, 4);
        if (d1 < 1) d1 = 1;
        if (c->batch_idx) {
            int32_t perm[MAXS + 4];
            for (int64_t i = 0; i < b_cache; i++) perm[i] = (int32_t)i;
            shuffle(r, perm, b_cache);
            for (int64_t b = 0; b < B; b++) p->bidx[b] = perm[b];
            p->kc.batch_idx = p->bidx;
        }
    } else {
        const int64_t ps = c->page_size;
        int64_t np[MAXS], shared[MAXS], distinct = 0, max_np = 0;
        for (int64_t b = 0; b < B; b++) {
            const int64_t need = c->sold[b] + (c->append ? c->snew[b] : 0);
            np[b] = (need + ps - 1) / ps;
            shared[b] = 0;
            if (c->share && b > 0) {
                const int64_t f0 = c->sold[0] / ps, fb = c->sold[b] / ps;
                shared[b] = f0 < fb ? f0 : fb;
            }
            distinct += np[b] - shared[b];
            max_np = np[b] > max_np ? np[b] : max_np;
        }
        const int64_t spare = h_rng_int(r, 1, 3);
        p->num_pages = distinct + spare;
        const int64_t max_pages = max_np + h_rng_int(r, 0, 2) + (max_np == 0);
        int32_t *perm = malloc(sizeof(int32_t) * (size_t)p->num_pages);
        for (int64_t i = 0; i < p->num_pages; i++) perm[i] = (int32_t)i;
        shuffle(r, perm, p->num_pages);
        p->bt = malloc(sizeof(int32_t) * (size_t)(B * max_pages));
        int64_t next = 0;
        for (int64_t b = 0; b < B; b++) {
            int32_t sperm[4096];
            for (int64_t g = 0; g < shared[b]; g++) sperm[g] = (int32_t)g;
            shuffle(r, sperm, shared[b]); /* a shared page may sit at another position */
            for (int64_t g = 0; g < max_pages; g++) {
                int32_t id;
                if (g < shared[b]) id = p->bt[0 * max_pages + sperm[g]];
                else if (g < np[b]) id = perm[next++];
                else if (c->bt_garbage) {
                    static const int32_t junk[] = {-1, -7, INT32_MAX, INT32_MIN};
                    id = (g % 2) ? (int32_t)p->num_pages + (int32_t)g : junk[g % 4];
                } else id = perm[distinct + h_rng_int(r, 0, spare - 1)]; /* a spare (NaN) page */
                p->bt[b * max_pages + g] = id;
            }
        }
        free(perm);
        p->kc.block_table = p->bt;
        p->kc.max_pages = max_pages;
        d0 = p->num_pages;
        d1 = ps;
    }
    p->cache[0] = t_alloc_layout(c->cdt, d0, d1, c->Hk, c->D, c->clayout, 3, &p->cbytes[0]);
    p->cache[1] = t_alloc_layout(c->cdt, d0, d1, c->Hk, c->Dv, c->clayout, 3, &p->cbytes[1]);
    p->ncache = 2;
    /* unreadable slots hold NaN: 0xff bytes (a NaN in every float dtype and both fp8
     * formats); int8 slots random bytes with NaN scales (per-row scales only: shared
     * int8 scales leave them readable) */
    for (int t = 0; t < 2; t++) memset(p->cache[t].data, 0xff, p->cbytes[t]);
    if (dt_quant(c->cdt)) {
        for (int t = 2; t < 4; t++) p->cache[t] = scale_alloc(c, d0, d1, &p->cbytes[t]);
        p->ncache = 4;
        if (c->cdt == FA_DTYPE_I8)
            for (int t = 0; t < 2; t++)
                for (size_t e = 0; e < p->cbytes[t]; e++) ((int8_t *)p->cache[t].data)[e] = (int8_t)h_rng_int(r, -127, 127);
        for (int t = 2; t < 4; t++)
            for (size_t e = 0; e < p->cbytes[t] / 4; e++) /* a shared scale holds x up to 2.5-5 sigma */
                ((float *)p->cache[t].data)[e] = c->scale_mode ? (float)h_rng_range(r, 2.5, 5.0) / dt_qmax(c->cdt) : NAN;
    }
    /* the valid old rows */
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < c->sold[b]; j++) {
            int64_t i0, i1;
            slot_of(p, b, j, &i0, &i1);
            for (int64_t h = 0; h < c->Hk; h++) {
                if (c->cdt == FA_DTYPE_I8) {
                    if (!c->scale_mode) {
                        h_set(&p->cache[2], i0, i1, h, 0, h_rng_range(r, 0.004, 0.03));
                        h_set(&p->cache[3], i0, i1, h, 0, h_rng_range(r, 0.004, 0.03));
                    }
                    for (int64_t d = 0; d < c->D; d++) *i8_at(&p->cache[0], i0, i1, h, d) = (int8_t)h_rng_int(r, -127, 127);
                    for (int64_t d = 0; d < c->Dv; d++) *i8_at(&p->cache[1], i0, i1, h, d) = (int8_t)h_rng_int(r, -127, 127);
                } else if (dt_fp8(c->cdt)) { /* codes of N(0, 1) values at the row's scale */
                    for (int kv = 0; kv < 2; kv++) {
                        if (!c->scale_mode) h_set(&p->cache[2 + kv], i0, i1, h, 0, h_rng_range(r, 2.5, 5.0) / dt_qmax(c->cdt));
                        const double sc = h_get(&p->cache[2 + kv], i0, i1, h, 0);
                        for (int64_t d = 0; d < (kv ? c->Dv : c->D); d++)
                            h_set(&p->cache[kv], i0, i1, h, d, h_rng_normal(r) / sc);
                    }
                } else {
                    for (int64_t d = 0; d < c->D; d++) h_set(&p->cache[0], i0, i1, h, d, h_rng_normal(r));
                    for (int64_t d = 0; d < c->Dv; d++) h_set(&p->cache[1], i0, i1, h, d, h_rng_normal(r));
                }
            }
        }
    p->kc.k = p->cache[0];
    p->kc.v = p->cache[1];
    if (p->ncache == 4) p->kc.k_scale = p->cache[2], p->kc.v_scale = p->cache[3];
    if (c->mla) { /* V is K's first Dv columns; cache[1] and cache[3] stay unused (and unchanged) */
        fa_tensor view = p->cache[0];
        view.shape[3] = c->Dv;
        p->kc.v_in_k = 1;
        p->kc.v = c->mla == 2 ? view : (fa_tensor){0};
        if (p->ncache == 4) p->kc.v_scale = c->mla == 2 ? p->cache[2] : (fa_tensor){0};
    }
    p->kc.seqlens = p->seqlens;
    a->kv_cache = &p->kc;

    for (int t = 0; t < p->ncache; t++) {
        const size_t n = p->cbytes[t];
        p->snap[t] = malloc(n);
        p->expect[t] = malloc(n);
        memcpy(p->snap[t], p->cache[t].data, n);
        memcpy(p->expect[t], p->cache[t].data, n);
    }
    if (c->cdt == FA_DTYPE_I8) {
        p->tie_k = calloc(p->cbytes[0], 1);
        p->tie_v = calloc(p->cbytes[1], 1);
    }

    iprob_expect(p);
}

/* The test's own append, into a fresh copy of the snapshot. */
static void iprob_expect(iprob *p) {
    const icase *c = &p->c;
    const fa_forward_args *a = &p->a;
    const int64_t B = c->B;
    if (!p->has_cache) return;
    for (int t = 0; t < p->ncache; t++) memcpy(p->expect[t], p->snap[t], p->cbytes[t]);
    if (!c->append) return;
    fa_tensor ex[4];
    for (int t = 0; t < p->ncache; t++) ex[t] = p->cache[t], ex[t].data = p->expect[t];
    const int64_t dmax = c->D > c->Dv ? c->D : c->Dv;
    double *x = malloc(sizeof(double) * (size_t)dmax);
    int8_t *q8 = malloc((size_t)dmax);
    unsigned char *tie = malloc((size_t)dmax);
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < c->snew[b]; j++) {
            int64_t i0, i1, s0, s1;
            slot_of(p, b, c->sold[b] + j, &i0, &i1);
            k_row(p, b, j, &s0, &s1);
            for (int64_t h = 0; h < c->Hk; h++)
                for (int kv = 0; kv < 2 - (c->mla != 0); kv++) { /* a latent V is inside K's row */
                    const fa_tensor *src = kv ? &a->v : &a->k;
                    const int64_t dim = kv ? c->Dv : c->D;
                    if (!dt_quant(c->cdt)) {
                        for (int64_t d = 0; d < dim; d++) h_set(&ex[kv], i0, i1, h, d, h_get(src, s0, s1, h, d));
                        continue;
                    }
                    for (int64_t d = 0; d < dim; d++) x[d] = h_get(src, s0, s1, h, d);
                    const float shared = (float)h_get(&ex[2 + kv], i0, i1, h, 0);
                    if (dt_fp8(c->cdt)) {
                        const float s = quantize_row_fp8(x, dim, c->cdt, c->scale_mode ? &shared : NULL, (uint8_t *)q8);
                        if (!c->scale_mode) h_set(&ex[2 + kv], i0, i1, h, 0, s);
                        for (int64_t d = 0; d < dim; d++) *i8_at(&ex[kv], i0, i1, h, d) = q8[d];
                        continue;
                    }
                    const float s = quantize_row(x, dim, c->scale_mode ? &shared : NULL, q8, tie);
                    if (!c->scale_mode) h_set(&ex[2 + kv], i0, i1, h, 0, s);
                    unsigned char *tf = kv ? p->tie_v : p->tie_k;
                    for (int64_t d = 0; d < dim; d++) {
                        *i8_at(&ex[kv], i0, i1, h, d) = q8[d];
                        tf[h_offset(&ex[kv], i0, i1, h, d)] = tie[d];
                    }
                }
        }
    free(x), free(q8), free(tie);
}

static void iprob_free(iprob *p) {
    free(p->a.q.data), free(p->a.o.data), free(p->lse_t.data);
    free(p->a.k.data), free(p->c.mla ? p->v_own.data : p->a.v.data);
    free(p->slopes), free(p->bt);
    for (int t = 0; t < 4; t++) free(p->cache[t].data), free(p->snap[t]), free(p->expect[t]);
    free(p->tie_k), free(p->tie_v);
    free(p->ref), free(p->nv), free(p->lref), free(p->lnv);
    memset(p, 0, sizeof *p);
}

/* Restores the cache, fills o/lse with the sentinel and runs the call. */
static fa_status iprob_run(fa_context *ctx, iprob *p, fa_algo algo, int64_t threads, int64_t splits) {
    for (int t = 0; t < p->ncache; t++) memcpy(p->cache[t].data, p->snap[t], p->cbytes[t]);
    memset(p->a.o.data, SENTINEL, p->o_bytes);
    memset(p->lse_t.data, SENTINEL, p->lse_bytes);
    fa_status st = fa_context_set(ctx, FA_PARAM_KV_SPLITS, splits);
    if (st == FA_OK) st = h_set_tiles(ctx, p->c.tile_q, p->c.tile_kv);
    if (st == FA_OK) st = h_run(ctx, algo, threads, &p->a);
    p->last_splits = p->last_packed = -1;
    if (st == FA_OK) fa_context_get(ctx, FA_PARAM_LAST_KV_SPLITS, &p->last_splits);
    if (st == FA_OK) fa_context_get(ctx, FA_PARAM_LAST_KV_PACKED, &p->last_packed);
    return st;
}

/* The cache after a successful call: the test's expected copy, byte for byte. Int8
 * elements may be one step off at a near-tie (then the library's value is adopted into
 * the expected copy, so the oracle uses what was stored), scales one ulp. */
static void check_cache(iprob *p) {
    if (!p->has_cache) return;
    if (p->c.cdt == FA_DTYPE_I8 && p->c.append) {
        for (int kv = 0; kv < 2; kv++) {
            const size_t n = p->cbytes[kv];
            const int8_t *got = p->cache[kv].data;
            int8_t *want = (int8_t *)p->expect[kv];
            const unsigned char *tie = kv ? p->tie_v : p->tie_k;
            for (size_t e = 0; e < n; e++)
                if (got[e] != want[e] && tie[e] && abs(got[e] - want[e]) == 1) want[e] = got[e], g_i8_ties++;
            const size_t ns = p->cbytes[2 + kv] / 4;
            const float *gs = p->cache[2 + kv].data;
            float *ws = (float *)p->expect[2 + kv];
            for (size_t e = 0; e < ns; e++)
                if (memcmp(&gs[e], &ws[e], 4) != 0 && isfinite(ws[e]) && ws[e] > 0.0f &&
                    fabsf(gs[e] - ws[e]) <= ws[e] * FLT_EPSILON)
                    ws[e] = gs[e];
        }
    }
    static const char *const names[] = {"k", "v", "k_scale", "v_scale"};
    for (int t = 0; t < p->ncache; t++) {
        const size_t n = p->cbytes[t];
        const unsigned char *got = p->cache[t].data;
        size_t first = n, ndiff = 0;
        for (size_t e = 0; e < n; e++)
            if (got[e] != p->expect[t][e]) {
                if (first == n) first = e;
                ndiff++;
            }
        if (ndiff == 0) {
            CHECK(1, "cache unchanged");
            continue;
        }
        /* where the first difference is, in logical coordinates (or padding) */
        const fa_tensor *ct = &p->cache[t];
        const size_t eb = dt_bytes(ct->dtype);
        int64_t at[4] = {-1, -1, -1, -1};
        for (int64_t i0 = 0; i0 < ct->shape[0] && at[0] < 0; i0++)
            for (int64_t i1 = 0; i1 < ct->shape[1] && at[0] < 0; i1++)
                for (int64_t i2 = 0; i2 < ct->shape[2] && at[0] < 0; i2++)
                    for (int64_t i3 = 0; i3 < ct->shape[3]; i3++)
                        if ((size_t)h_offset(ct, i0, i1, i2, i3) * eb == first - first % eb) {
                            at[0] = i0, at[1] = i1, at[2] = i2, at[3] = i3;
                            break;
                        }
        CHECK(ndiff == 0,
              "cache %s after the call differs from the expected (appended rows at seqlens[b].., all else "
              "unchanged) in %zu bytes; the first at (block %lld, row %lld, head %lld, dim %lld)%s: %s",
              names[t], ndiff, (long long)at[0], (long long)at[1], (long long)at[2], (long long)at[3],
              at[0] < 0 ? " (padding)" : "",
              memcmp(ct->data, p->snap[t], n) == 0 ? "the cache is unchanged (nothing appended)"
                                                    : "the cache was written elsewhere or differently");
    }
}

/* Packed o/lse rows no sequence owns keep the sentinel. */
static void check_unowned(const iprob *p) {
    if (!p->packed_q) return;
    const size_t eb = dt_bytes(p->c.odt);
    const unsigned char *o = p->a.o.data;
    int ok = 1;
    for (int64_t rr = 0; rr < p->total_q; rr++) {
        if (rr >= p->cu_q[0] && rr < p->cu_q[p->c.B]) continue;
        for (int64_t h = 0; h < p->c.Hq; h++) {
            for (int64_t e = 0; e < p->c.Dv; e++) ok &= all_bytes(o + (size_t)h_offset(&p->a.o, 0, rr, h, e) * eb, eb, SENTINEL);
            ok &= all_bytes((const float *)p->lse_t.data + h * p->total_q + rr, 4, SENTINEL);
        }
    }
    CHECK(ok, "packed o or lse rows that no sequence owns (before cu_seqlens_q[0] = %d or from cu_seqlens_q[B] = %d "
              "to %lld) were written",
          p->cu_q[0], p->cu_q[p->c.B], (long long)p->total_q);
}

/* The oracle: one dense reference call per sequence, and the naive same-precision
 * attention on the same values. Values are stored sequence by sequence, row by row. */
static void compute_oracle(fa_context *ctx, iprob *p) {
    const icase *c = &p->c;
    const int64_t Hq = c->Hq, Hk = c->Hk, D = c->D, Dv = c->Dv;
    int64_t n_o = 0, n_l = 0;
    for (int64_t b = 0; b < c->B; b++) n_o += (int64_t)c->sq[b] * Hq * Dv, n_l += (int64_t)c->sq[b] * Hq;
    p->ref = malloc(sizeof(double) * (size_t)(n_o + 1)), p->nv = malloc(sizeof(double) * (size_t)(n_o + 1));
    p->lref = malloc(sizeof(double) * (size_t)(n_l + 1)), p->lnv = malloc(sizeof(double) * (size_t)(n_l + 1));
    int64_t no = 0, nl = 0;
    const fa_dtype in_dt = (p->has_cache && c->cdt != c->qdt) ? FA_DTYPE_F32 : c->qdt;
    p->in_dt = in_dt;
    fa_tensor ex[4];
    for (int t = 0; t < p->ncache; t++) ex[t] = p->cache[t], ex[t].data = p->expect[t];

    for (int64_t b = 0; b < c->B; b++) {
        const int64_t sq = c->sq[b];
        const int64_t sk = p->has_cache ? c->sold[b] + (c->append ? c->snew[b] : 0) : c->snew[b];
        if (sq == 0 || sk == 0) continue; /* sk == 0: checked exactly in check_numbers */
        /* the dense per-sequence tensors (f32 holds every value exactly) */
        fa_tensor qd = h_alloc(FA_DTYPE_F32, 1, sq, Hq, D), kd = h_alloc(FA_DTYPE_F32, 1, sk, Hk, D),
                  vd = h_alloc(FA_DTYPE_F32, 1, sk, Hk, Dv);
        for (int64_t i = 0; i < sq; i++) {
            int64_t i0, i1;
            q_row(p, b, i, &i0, &i1);
            for (int64_t h = 0; h < Hq; h++)
                for (int64_t d = 0; d < D; d++) h_set(&qd, 0, i, h, d, h_get(&p->a.q, i0, i1, h, d));
        }
        for (int64_t j = 0; j < sk; j++) {
            int64_t i0, i1;
            if (p->has_cache) slot_of(p, b, j, &i0, &i1);
            else k_row(p, b, j, &i0, &i1);
            for (int64_t h = 0; h < Hk; h++) {
                for (int64_t d = 0; d < D; d++)
                    h_set(&kd, 0, j, h, d,
                          p->has_cache ? cache_val(&ex[0], &ex[2], i0, i1, h, d) : h_get(&p->a.k, i0, i1, h, d));
                const int vt = c->mla ? 0 : 1; /* a latent V: the first Dv columns of K's cache row */
                for (int64_t d = 0; d < Dv; d++)
                    h_set(&vd, 0, j, h, d,
                          p->has_cache ? cache_val(&ex[vt], &ex[2 + vt], i0, i1, h, d) : h_get(&p->a.v, i0, i1, h, d));
            }
        }
        fa_forward_args ra = FA_FORWARD_ARGS_INIT;
        ra.q = qd, ra.k = kd, ra.v = vd;
        ra.o = h_alloc(FA_DTYPE_F32, 1, sq, Hq, Dv);
        ra.lse = h_alloc(FA_DTYPE_F32, 1, Hq, sq, 1);
        ra.scale = c->scale, ra.softcap = c->softcap, ra.causal = c->causal;
        ra.window_left = c->wl, ra.window_right = c->wr;
        if (c->alibi) ra.alibi_slopes = p->slopes + (c->alibi == 2 ? b * Hq : 0), ra.alibi_stride_b = 0;
        fa_context_set(ctx, FA_PARAM_KV_SPLITS, 0);
        const fa_status st = h_run(ctx, FA_ALGO_REFERENCE, 1, &ra);
        CHECK(st == FA_OK, "dense reference call for sequence %lld: status %d: %s", (long long)b, (int)st,
              fa_context_error(ctx));
        /* the naive same-precision attention on the same values */
        fa_forward_args na = ra;
        na.q = h_alloc(in_dt, 1, sq, Hq, D), na.k = h_alloc(in_dt, 1, sk, Hk, D), na.v = h_alloc(in_dt, 1, sk, Hk, Dv);
        h_copy(&na.q, &qd), h_copy(&na.k, &kd), h_copy(&na.v, &vd);
        na.o.dtype = c->odt;
        double *os = malloc(sizeof(double) * (size_t)(sq * Hq * Dv)), *ls = malloc(sizeof(double) * (size_t)(sq * Hq));
        CHECK(naive_forward(&na, NAIVE_SAME_PRECISION, os, ls, NULL) == 0, "naive_forward failed");
        for (int64_t i = 0; i < sq; i++)
            for (int64_t h = 0; h < Hq; h++) {
                for (int64_t e = 0; e < Dv; e++) {
                    p->ref[no] = h_get(&ra.o, 0, i, h, e);
                    p->nv[no++] = os[(i * Hq + h) * Dv + e];
                }
                p->lref[nl] = h_get(&ra.lse, 0, h, i, 0);
                p->lnv[nl++] = ls[h * sq + i];
            }
        free(os), free(ls);
        free(na.q.data), free(na.k.data), free(na.v.data);
        free(qd.data), free(kd.data), free(vd.data), free(ra.o.data), free(ra.lse.data);
    }
    p->no = no, p->nl = nl;
    p->have_oracle = 1;
}

/* The accuracy rule over the whole call; rows of sequences without keys exactly 0 / -inf. */
static void check_numbers(fa_context *ctx, iprob *p) {
    const icase *c = &p->c;
    const int64_t Hq = c->Hq, Dv = c->Dv;
    if (!p->have_oracle) compute_oracle(ctx, p);
    const int64_t n_o = p->no, n_l = p->nl;
    double *got = malloc(sizeof(double) * (size_t)(n_o + 1)), *lgot = malloc(sizeof(double) * (size_t)(n_l + 1));
    int64_t *where = malloc(sizeof(int64_t) * (size_t)(n_o + 1)); /* sequence of each o value */
    int64_t *lwhere = malloc(sizeof(int64_t) * (size_t)(n_l + 1));
    int64_t no = 0, nl = 0, empty_bad = 0, empty_rows = 0;
    for (int64_t b = 0; b < c->B; b++) {
        const int64_t sq = c->sq[b];
        const int64_t sk = p->has_cache ? c->sold[b] + (c->append ? c->snew[b] : 0) : c->snew[b];
        for (int64_t i = 0; i < sq; i++) {
            int64_t i0, i1;
            q_row(p, b, i, &i0, &i1);
            for (int64_t h = 0; h < Hq; h++) {
                const double l = p->packed_q ? h_get(&p->lse_t, 0, h, i1, 0) : h_get(&p->lse_t, b, h, i, 0);
                if (sk == 0) { /* no keys: o = 0, lse = -inf exactly */
                    int bad = 0;
                    for (int64_t e = 0; e < Dv; e++) bad |= h_get(&p->a.o, i0, i1, h, e) != 0.0;
                    if (c->lse) bad |= !(isinf(l) && l < 0);
                    empty_bad += bad, empty_rows++;
                    continue;
                }
                for (int64_t e = 0; e < Dv; e++) got[no] = h_get(&p->a.o, i0, i1, h, e), where[no++] = b;
                lgot[nl] = l, lwhere[nl++] = b;
            }
        }
    }
    CHECK(empty_bad == 0, "%lld of %lld rows of sequences with no keys are not o = 0, lse = -inf exactly",
          (long long)empty_bad, (long long)empty_rows);
    const double *ref = p->ref, *nv = p->nv, *lref = p->lref, *lnv = p->lnv;
    if (no > 0) {
        double nerr = 0.0, err = 0.0;
        int64_t at = -1;
        for (int64_t e = 0; e < no; e++) {
            nerr = fmax(nerr, fabs(nv[e] - ref[e]));
            double d = fabs(got[e] - ref[e]);
            if (isnan(d)) d = INFINITY;
            if (d > err || (at < 0 && d == INFINITY)) err = d, at = e;
        }
        const double omax = max_abs(ref, no);
        const double tol = 2.0 * nerr + h_prop_ulps(c->odt) * h_eps(c->odt) * fmax(1.0, omax);
        double *w = &g_worst[dt_index(c->qdt)];
        if (err / tol > *w) *w = err / tol;
        if (dt_quant(c->cdt) && p->has_cache) {
            const int oi = dt_index(c->odt), qi = c->cdt == FA_DTYPE_I8 ? 0 : c->cdt == FA_DTYPE_F8E4M3 ? 1 : 2;
            g_q_max_err[qi][oi] = fmax(g_q_max_err[qi][oi], err);
            g_q_worst[qi][oi] = fmax(g_q_worst[qi][oi], err / tol);
        }
        CHECK(err <= tol, "o max err %.3g > tol %.3g (naive same-precision err %.3g, in %s) at flat %lld (sequence "
                          "%lld): got %.9g want %.9g",
              err, tol, nerr, dt_str(p->in_dt), (long long)at, at >= 0 ? (long long)where[at] : -1LL,
              at >= 0 ? got[at] : 0.0, at >= 0 ? ref[at] : 0.0);
    }
    if (nl > 0 && c->lse) {
        double nerr = 0.0, err = 0.0;
        int64_t at = -1, infs = 0;
        for (int64_t e = 0; e < nl; e++) {
            const int gi = isinf(lgot[e]) && lgot[e] < 0, wi = isinf(lref[e]) && lref[e] < 0;
            if (gi || wi) {
                if (gi != wi) infs++, at = e;
                continue;
            }
            if (!(isinf(lnv[e]) && lnv[e] < 0)) nerr = fmax(nerr, fabs(lnv[e] - lref[e]));
            double d = fabs(lgot[e] - lref[e]);
            if (isnan(d)) d = INFINITY;
            if (d > err) err = d, at = e;
        }
        const double tol = 2.0 * nerr + h_prop_lse_ulps() * FLT_EPSILON * fmax(1.0, max_abs(lref, nl));
        CHECK(err <= tol && infs == 0,
              "lse max err %.3g > tol %.3g (naive err %.3g), or %lld -inf mismatches; worst at row %lld (sequence "
              "%lld): got %.9g want %.9g",
              err, tol, nerr, (long long)infs, (long long)at, at >= 0 ? (long long)lwhere[at] : -1LL,
              at >= 0 ? lgot[at] : 0.0, at >= 0 ? lref[at] : 0.0);
    }
    free(got), free(lgot), free(where), free(lwhere);
}

static int64_t g_refused_checked;
/* det cases run again with packed K/V switched the other way (FA_PARAM_KV_PACK), and
 * those where one of the two runs packed */
static int64_t g_pack_compared, g_pack_packed;

/*
 * Runs a case: flash with `threads` and forced `splits` (0 = planned), then the cache,
 * unowned rows and numbers. With `det`, a second flash run with the other thread count
 * must give the same bytes, and so must a third with packed K/V the other way (never
 * where the first packed, always where it did not). With `refuse`, STANDARD and REFERENCE must refuse the call
 * and leave o, lse and the cache alone.
 */
static void run_case(const icase *c, uint64_t seed, int64_t threads, int64_t splits, int det, int refuse) {
    h_rng r;
    h_rng_seed(&r, seed);
    iprob p;
    iprob_build(&p, c, &r);
    g_cases++;
    h_case("%s | seed=%llu threads=%lld splits=%lld", p.desc, (unsigned long long)seed, (long long)threads,
           (long long)splits);
    fa_status st = iprob_run(g_ctx, &p, FA_ALGO_FLASH, threads, splits);
    if (CHECK(st == FA_OK, "flash: status %d (%s): %s", (int)st, fa_status_string(st), fa_context_error(g_ctx))) {
        check_cache(&p);
        check_unowned(&p);
        check_numbers(g_ctx, &p);
        if (det) {
            unsigned char *o1 = malloc(p.o_bytes), *l1 = malloc(p.lse_bytes);
            memcpy(o1, p.a.o.data, p.o_bytes);
            memcpy(l1, p.lse_t.data, p.lse_bytes);
            const int64_t other = threads == 1 ? 2 : 1, s1 = p.last_splits;
            h_case("%s | seed=%llu threads=%lld vs %lld splits=%lld", p.desc, (unsigned long long)seed,
                   (long long)other, (long long)threads, (long long)splits);
            st = iprob_run(g_ctx, &p, FA_ALGO_FLASH, other, splits);
            if (CHECK(st == FA_OK, "flash: status %d: %s", (int)st, fa_context_error(g_ctx))) {
                CHECK(memcmp(o1, p.a.o.data, p.o_bytes) == 0 && memcmp(l1, p.lse_t.data, p.lse_bytes) == 0,
                      "threads %lld and %lld differ bitwise (o %s, lse %s; LAST_KV_SPLITS %lld vs %lld)",
                      (long long)threads, (long long)other, memcmp(o1, p.a.o.data, p.o_bytes) ? "differs" : "same",
                      memcmp(l1, p.lse_t.data, p.lse_bytes) ? "differs" : "same", (long long)s1,
                      (long long)p.last_splits);
                CHECK(s1 == p.last_splits, "LAST_KV_SPLITS depends on the thread count: %lld vs %lld", (long long)s1,
                      (long long)p.last_splits);
            }
            const int64_t packed1 = p.last_packed, mode = packed1 > 0 ? 1 : 2;
            h_case("%s | seed=%llu threads=%lld, KV_PACK %lld (auto packed %lld units)", p.desc,
                   (unsigned long long)seed, (long long)threads, (long long)mode, (long long)packed1);
            st = fa_context_set(g_ctx, FA_PARAM_KV_PACK, mode);
            if (st == FA_OK) st = iprob_run(g_ctx, &p, FA_ALGO_FLASH, threads, splits);
            fa_context_set(g_ctx, FA_PARAM_KV_PACK, 0);
            if (CHECK(st == FA_OK, "flash with KV_PACK %lld: status %d: %s", (long long)mode, (int)st,
                      fa_context_error(g_ctx))) {
                CHECK(memcmp(o1, p.a.o.data, p.o_bytes) == 0 && memcmp(l1, p.lse_t.data, p.lse_bytes) == 0,
                      "packed and unpacked K/V differ bitwise (o %s, lse %s; packed units %lld vs %lld)",
                      memcmp(o1, p.a.o.data, p.o_bytes) ? "differs" : "same",
                      memcmp(l1, p.lse_t.data, p.lse_bytes) ? "differs" : "same", (long long)packed1,
                      (long long)p.last_packed);
                CHECK(mode == 2 || p.last_packed == 0, "KV_PACK 1 (never) still packed %lld units",
                      (long long)p.last_packed);
                g_pack_compared++;
                g_pack_packed += packed1 > 0 || p.last_packed > 0;
            }
            free(o1), free(l1);
        }
    }
    if (refuse) {
        static const fa_algo others[] = {FA_ALGO_STANDARD, FA_ALGO_REFERENCE};
        for (int k = 0; k < 2; k++) {
            h_case("%s | algo=%s must refuse", p.desc, h_algo_str(others[k]));
            st = iprob_run(g_ctx, &p, others[k], threads, 0);
            CHECK(st == FA_ERR_UNSUPPORTED, "status %d (%s), want FA_ERR_UNSUPPORTED", (int)st, fa_status_string(st));
            CHECK(all_bytes(p.a.o.data, p.o_bytes, SENTINEL) && all_bytes(p.lse_t.data, p.lse_bytes, SENTINEL),
                  "a refused call wrote o or lse");
            int same = 1;
            for (int t = 0; t < p.ncache; t++) same &= memcmp(p.cache[t].data, p.snap[t], p.cbytes[t]) == 0;
            CHECK(same, "a refused call changed the cache");
            g_refused_checked++;
        }
    }
    iprob_free(&p);
}

/* ------------------------------------------------------------- random cases */

/*
 * Work budget per random case, in multiply-adds of the fp64 reference (sum over
 * sequences of Hq * Sq * Sk * (D + Dv)): the reference and the naive oracle are scalar,
 * so this bounds the run time. Long sequences are shortened until the case fits.
 */
static const double WORK_BUDGET = 2.5e6;

static double case_work(const icase *c) {
    double w = 0.0;
    for (int64_t b = 0; b < c->B; b++) {
        const double sk = c->mode == MODE_VARLEN ? c->snew[b] : c->sold[b] + (c->append ? c->snew[b] : 0);
        w += (double)c->Hq * c->sq[b] * sk * (double)(c->D + c->Dv);
    }
    return w;
}

static void fit_budget(icase *c) {
    const int packed = c->mode == MODE_VARLEN || c->varlen_q;
    for (int guard = 0; guard < 200 && case_work(c) > WORK_BUDGET; guard++) {
        int64_t wb = 0;
        double wmax = -1.0;
        for (int64_t b = 0; b < c->B; b++) {
            const double sk = c->mode == MODE_VARLEN ? c->snew[b] : c->sold[b] + (c->append ? c->snew[b] : 0);
            const double w = (double)c->sq[b] * sk;
            if (w > wmax) wmax = w, wb = b;
        }
        if (c->mode != MODE_VARLEN && c->sold[wb] > 4) c->sold[wb] /= 2;
        else if (c->mode == MODE_VARLEN && c->snew[wb] > 4) c->snew[wb] /= 2;
        else if (packed && c->sq[wb] > 4) {
            if (c->varlen_q && c->snew[wb] == c->sq[wb]) c->snew[wb] /= 2;
            c->sq[wb] /= 2;
        } else if (c->B > 1) c->B--;
        else if (c->Hq > c->Hk) c->Hq = c->Hk * ((c->Hq / c->Hk) / 2);
        else break;
    }
}

static const fa_dtype QDT[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
static const fa_dtype CDT[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16, FA_DTYPE_I8, FA_DTYPE_F8E4M3, FA_DTYPE_F8E5M2};
enum { NCDT = sizeof CDT / sizeof CDT[0] };

/* Masking, scale, ALiBi, lse and tiles drawn at random. */
static void random_extras(icase *c, h_rng *r, int allow_top_left) {
    const double u = h_rng_uniform(r);
    c->causal = u < 0.35 ? FA_CAUSAL_NONE : (u < 0.75 || !allow_top_left) ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_TOP_LEFT;
    if (h_rng_uniform(r) < 0.25) {
        static const int64_t wins[] = {-1, 0, 2, 5, 40};
        c->wl = wins[h_rng_int(r, 0, 4)];
        c->wr = wins[h_rng_int(r, 0, 4)];
    }
    static const float caps[] = {2.0f, 10.0f, 30.0f};
    c->softcap = h_rng_uniform(r) < 0.2 ? caps[h_rng_int(r, 0, 2)] : 0.0f;
    static const float scales[] = {0.1f, 0.3f, -0.15f};
    c->scale = h_rng_uniform(r) < 0.25 ? scales[h_rng_int(r, 0, 2)] : 0.0f;
    c->alibi = h_rng_uniform(r) < 0.2 ? (int)h_rng_int(r, 1, 2) : 0;
    c->lse = h_rng_uniform(r) < 0.75;
    static const double sig[] = {0.5, 1.0, 2.0};
    c->q_sigma = sig[h_rng_int(r, 0, 2)];
    if (h_rng_uniform(r) < 0.3) {
        static const int64_t tq[] = {1, 4, 16}, tkv[] = {1, 5, 16, 64};
        c->tile_q = tq[h_rng_int(r, 0, 2)];
        c->tile_kv = tkv[h_rng_int(r, 0, 3)];
    }
    c->odt = (c->qdt != FA_DTYPE_F32 && h_rng_uniform(r) < 0.35) ? FA_DTYPE_F32 : c->qdt;
}

static void random_heads(icase *c, h_rng *r) {
    static const int64_t groups[] = {1, 2, 4, 8};
    static const int64_t ds[] = {8, 32, 64, 72, 80, 128};
    c->Hk = h_rng_int(r, 1, 2);
    c->Hq = c->Hk * groups[h_rng_int(r, 0, 3)];
    c->D = ds[h_rng_int(r, 0, 5)];
    c->Dv = h_rng_uniform(r) < 0.8 ? c->D : ds[h_rng_int(r, 0, 5)];
}

/* A ragged length: often 0, 1 or short, sometimes long. */
static int32_t ragged(h_rng *r, int32_t long_len) {
    const double u = h_rng_uniform(r);
    if (u < 0.12) return 0;
    if (u < 0.25) return 1;
    if (u < 0.9) return (int32_t)h_rng_int(r, 2, 24);
    return (int32_t)h_rng_int(r, long_len / 2, long_len);
}

/* ------------------------------------------------------------------ varlen */

static void test_varlen(uint64_t seed) {
    /* fixed: the lengths the brief names, under each masking form */
    static const int32_t sq_fixed[] = {0, 1, 3, 120, 2, 1, 0, 17};
    static const int32_t sk_fixed[] = {5, 1, 0, 170, 9, 1, 0, 3};
    for (int v = 0; v < 8; v++) {
        icase c;
        icase_init(&c);
        c.mode = MODE_VARLEN;
        c.B = 8, c.Hq = 4, c.Hk = 2, c.D = 64, c.Dv = 64;
        memcpy(c.sq, sq_fixed, sizeof sq_fixed);
        memcpy(c.snew, sk_fixed, sizeof sk_fixed);
        c.qdt = QDT[v % 3];
        c.odt = v == 4 ? FA_DTYPE_F32 : c.qdt;
        c.q_off = v % 2 ? 3 : 0, c.q_tail = v % 3 ? 2 : 0, c.k_off = v % 4 ? 1 : 0, c.k_tail = 5;
        switch (v) {
        case 0: break;
        case 1: c.causal = FA_CAUSAL_BOTTOM_RIGHT; break;
        case 2: c.causal = FA_CAUSAL_TOP_LEFT; break;
        case 3: c.wl = 4, c.wr = 2; break;
        case 4: c.softcap = 5.0f, c.causal = FA_CAUSAL_BOTTOM_RIGHT; break;
        case 5: c.alibi = 1; break;
        case 6: c.alibi = 2, c.causal = FA_CAUSAL_TOP_LEFT, c.wl = 30; break;
        case 7: c.lse = 0, c.scale = 0.2f, c.wl = 0, c.wr = 0; break;
        }
        run_case(&c, seed + 100 + (uint64_t)v, 2, 0, v < 3, v == 0);
    }
    /* random ragged batches */
    const int n = h_scaled(40);
    for (int k = 0; k < n; k++) {
        h_rng r;
        h_rng_seed(&r, seed * 31 + 7 * (uint64_t)k);
        icase c;
        icase_init(&c);
        c.mode = MODE_VARLEN;
        random_heads(&c, &r);
        c.qdt = QDT[k % 3];
        c.B = h_rng_int(&r, 1, MAXS);
        const int32_t long_len = c.D >= 128 ? 120 : 300;
        for (int64_t b = 0; b < c.B; b++) {
            c.sq[b] = ragged(&r, long_len);
            c.snew[b] = h_rng_uniform(&r) < 0.4 ? c.sq[b] : ragged(&r, long_len);
        }
        if (c.sq[0] + c.sq[c.B - 1] == 0) c.sq[0] = 1; /* at least one row somewhere */
        c.q_off = h_rng_uniform(&r) < 0.3 ? (int32_t)h_rng_int(&r, 1, 3) : 0;
        c.q_tail = h_rng_uniform(&r) < 0.3 ? (int32_t)h_rng_int(&r, 1, 3) : 0;
        c.k_off = h_rng_uniform(&r) < 0.3 ? (int32_t)h_rng_int(&r, 1, 3) : 0;
        c.k_tail = h_rng_uniform(&r) < 0.3 ? (int32_t)h_rng_int(&r, 1, 3) : 0;
        random_extras(&c, &r, 1);
        c.qlayout = h_rng_uniform(&r) < 0.3;
        int32_t tq = c.q_off + c.q_tail, tk = c.k_off + c.k_tail;
        for (int64_t b = 0; b < c.B; b++) tq += c.sq[b], tk += c.snew[b];
        if (tq == 0) c.q_tail = 1;
        if (tk == 0) c.k_tail = 1; /* packed tensors need >= 1 row */
        fit_budget(&c);
        run_case(&c, seed + 1000 + (uint64_t)k, 1 + (k % 2), 0, k % 5 == 0, k % 7 == 0);
    }
}

/* ------------------------------------------------------------------- caches */

/* A random cache case of the given mode; S_new equal across sequences unless packed. */
static void random_cache_case(icase *c, h_rng *r, int mode, int append, int packed_q) {
    icase_init(c);
    c->mode = mode;
    c->varlen_q = packed_q;
    random_heads(c, r);
    c->qdt = QDT[h_rng_int(r, 0, 2)];
    const double u = h_rng_uniform(r);
    c->cdt = u < 0.4 ? c->qdt : CDT[h_rng_int(r, 0, NCDT - 1)];
    c->scale_mode = dt_quant(c->cdt) ? (int)h_rng_int(r, 0, 2) : 0;
    c->B = h_rng_int(r, 1, 6);
    c->append = append;
    const int32_t long_len = c->D >= 128 ? 150 : 400;
    const int32_t sq_all = (int32_t)h_rng_int(r, 1, 8), snew_all = append ? (int32_t)h_rng_int(r, 1, 5) : 0;
    for (int64_t b = 0; b < c->B; b++) {
        c->sold[b] = ragged(r, long_len);
        if (packed_q) {
            c->sq[b] = ragged(r, 40);
            c->snew[b] = append ? (h_rng_uniform(r) < 0.6 ? c->sq[b] : ragged(r, 40)) : 0;
        } else {
            c->sq[b] = sq_all;
            c->snew[b] = snew_all;
        }
    }
    if (packed_q) {
        int32_t tq = 0, tk = 0;
        for (int64_t b = 0; b < c->B; b++) tq += c->sq[b], tk += c->snew[b];
        if (tq == 0) c->sq[0] = 1;
        if (append && tk == 0) c->snew[c->B - 1] = 1;
        c->q_off = h_rng_uniform(r) < 0.3 ? 2 : 0;
        c->q_tail = h_rng_uniform(r) < 0.3 ? 1 : 0;
        c->k_off = append && h_rng_uniform(r) < 0.3 ? 1 : 0;
        c->k_tail = append && h_rng_uniform(r) < 0.3 ? 2 : 0;
    }
    static const int64_t pss[] = {1, 3, 16, 128};
    c->page_size = pss[h_rng_int(r, 0, 3)];
    c->share = mode == MODE_PAGED && h_rng_uniform(r) < 0.4;
    c->batch_idx = mode == MODE_CONTIG && h_rng_uniform(r) < 0.5;
    c->zero_rows = append && h_rng_uniform(r) < 0.2;
    c->clayout = (int)h_rng_int(r, 0, 2);
    c->qlayout = h_rng_uniform(r) < 0.3;
    random_extras(c, r, 0);
    fit_budget(c);
}

static void test_cache_fixed(uint64_t seed) {
    /* contiguous, no append, with and without batch_idx; f16 cache under f32 q */
    for (int v = 0; v < 4; v++) {
        icase c;
        icase_init(&c);
        c.mode = MODE_CONTIG;
        c.B = 4, c.Hq = 8, c.Hk = 2, c.D = 64, c.Dv = 64;
        c.qdt = v < 2 ? FA_DTYPE_F32 : FA_DTYPE_BF16;
        c.cdt = v % 2 ? FA_DTYPE_F16 : c.qdt;
        c.batch_idx = v % 2;
        static const int32_t old[] = {37, 0, 1, 300};
        for (int b = 0; b < 4; b++) c.sq[b] = 3, c.sold[b] = old[b];
        c.causal = FA_CAUSAL_BOTTOM_RIGHT;
        run_case(&c, seed + 200 + (uint64_t)v, 2, 0, v == 0, v == 1);
    }
    /* paged: each page size, shared pages in random order, garbage in unused entries */
    static const int64_t pss[] = {1, 3, 16, 128};
    for (int v = 0; v < 11; v++) {
        icase c;
        icase_init(&c);
        c.mode = MODE_PAGED;
        c.B = 5, c.Hq = 4, c.Hk = 1, c.D = 80, c.Dv = 80;
        c.page_size = pss[v % 4];
        c.share = 1;
        c.bt_garbage = v >= 4;
        c.qdt = QDT[v % 3];
        c.cdt = v == 2 ? FA_DTYPE_F32 : v == 5 ? FA_DTYPE_I8 : v == 8 || v == 10 ? FA_DTYPE_F8E4M3 : v == 9 ? FA_DTYPE_F8E5M2 : c.qdt;
        c.scale_mode = v == 9 ? 1 : v == 10 ? 2 : 0;
        static const int32_t old[] = {290, 140, 0, 1, 260};
        for (int b = 0; b < 5; b++) c.sq[b] = 2, c.sold[b] = old[b], c.snew[b] = 2;
        c.append = v % 2 || v >= 8;
        c.causal = FA_CAUSAL_BOTTOM_RIGHT;
        c.wl = v == 3 ? 50 : -1;
        c.clayout = v % 3;
        c.qlayout = v == 6;
        run_case(&c, seed + 300 + (uint64_t)v, 2, 0, v < 2, v == 4);
    }
    /* every cache dtype under every q dtype, with append, both layouts */
    for (int qi = 0; qi < 3; qi++)
        for (int ci = 0; ci < NCDT; ci++)
            for (int paged = 0; paged < 2; paged++) {
                icase c;
                icase_init(&c);
                c.mode = paged ? MODE_PAGED : MODE_CONTIG;
                c.B = 3, c.Hq = 4, c.Hk = 2, c.D = 64, c.Dv = 64;
                c.qdt = QDT[qi], c.cdt = CDT[ci];
                c.odt = (qi + ci) % 2 ? FA_DTYPE_F32 : c.qdt;
                c.page_size = 16;
                c.append = 1;
                c.zero_rows = ci >= 3;
                c.scale_mode = ci >= 3 ? (qi + paged) % 3 : 0;
                static const int32_t old[] = {33, 0, 70};
                for (int b = 0; b < 3; b++) c.sq[b] = 4, c.sold[b] = old[b], c.snew[b] = 4;
                c.causal = FA_CAUSAL_BOTTOM_RIGHT;
                c.batch_idx = !paged && ci % 2;
                c.clayout = (qi + ci + paged) % 3;
                run_case(&c, seed + 400 + (uint64_t)(qi * 2 * NCDT + ci * 2 + paged), 2, 0, 0, 0);
            }
}

static void test_cache_random(uint64_t seed) {
    const int n = h_scaled(60);
    for (int k = 0; k < n; k++) {
        h_rng r;
        h_rng_seed(&r, seed * 17 + 11 * (uint64_t)k);
        icase c;
        const int mode = k % 2 ? MODE_PAGED : MODE_CONTIG;
        const int kind = (k / 2) % 3; /* 0 read only, 1 append, 2 packed q (+ append mostly) */
        random_cache_case(&c, &r, mode, kind == 1 || (kind == 2 && h_rng_uniform(&r) < 0.8), kind == 2);
        static const int64_t forced[] = {2, 3, 7};
        const int64_t splits = k % 4 == 3 ? forced[(k / 4) % 3] : 0;
        run_case(&c, seed + 5000 + (uint64_t)k, 1 + (k % 2), splits, k % 6 == 1, k % 9 == 0);
    }
}

/* Chunked prefill: packed q + cache + packed new rows, cu_seqlens_k == cu_seqlens_q. */
static void test_chunked_prefill(uint64_t seed) {
    for (int v = 0; v < 6; v++) {
        icase c;
        icase_init(&c);
        c.mode = v % 2 ? MODE_PAGED : MODE_CONTIG;
        c.varlen_q = 1;
        c.append = 1;
        c.B = 4, c.Hq = 8, c.Hk = 2, c.D = 64, c.Dv = 64;
        c.qdt = v < 2 ? FA_DTYPE_F32 : FA_DTYPE_BF16;
        c.cdt = v == 3 ? FA_DTYPE_I8 : v == 1 ? FA_DTYPE_F16 : v == 4 ? FA_DTYPE_F8E4M3 : v == 5 ? FA_DTYPE_F8E5M2 : c.qdt;
        c.scale_mode = v == 5;
        static const int32_t old[] = {0, 64, 17, 129}, chunk[] = {48, 16, 0, 31};
        for (int b = 0; b < 4; b++) c.sold[b] = old[b], c.sq[b] = c.snew[b] = chunk[b];
        c.causal = FA_CAUSAL_BOTTOM_RIGHT;
        c.page_size = v == 1 ? 16 : 3;
        c.batch_idx = v == 2;
        c.share = v == 1;
        run_case(&c, seed + 600 + (uint64_t)v, 2, 0, v == 0, v == 1);
    }
}

/* ------------------------------------------------------- MLA latent caches */

/*
 * MLA latent caches (v_in_k): V is the first Dv columns of K's cache rows. The oracle
 * builds explicit K and V from the latent rows it expects the cache to hold (its own
 * append) and runs the dense fp64 reference on them (compute_oracle); check_cache
 * proves the append wrote each shared row once and nothing else (the unused v buffer
 * stays as it was). DeepSeek's absorbed decode (Hq = 128, Hk = 1, D = 576, Dv = 512) in
 * every cache form and dtype, a 16-head stack (the small-row path), prefill chunks
 * (causal, packed q and new rows, packed K/V compared bitwise), random latent shapes
 * with tails, and split-KV.
 */
static void test_mla(uint64_t seed) {
    /* the DeepSeek shape: decode, one latent head, contiguous / batch_idx / paged, every cache dtype */
    for (int v = 0; v < 8; v++) {
        icase c;
        icase_init(&c);
        c.mla = 1 + v % 2;
        c.mode = v % 3 == 1 ? MODE_PAGED : MODE_CONTIG;
        c.batch_idx = v % 3 == 2;
        c.B = 2, c.Hq = v < 4 ? 128 : 16, c.Hk = 1, c.D = 576, c.Dv = 512;
        c.qdt = QDT[v % 3];
        c.cdt = CDT[v % 4];
        c.odt = v == 5 ? FA_DTYPE_F32 : c.qdt;
        c.page_size = v == 4 ? 64 : 16;
        c.append = v != 3;
        static const int32_t old[] = {150, 37};
        for (int b = 0; b < 2; b++) c.sq[b] = 1, c.snew[b] = c.append, c.sold[b] = old[b] - (v == 7) * b * 30;
        c.causal = FA_CAUSAL_BOTTOM_RIGHT;
        c.zero_rows = v == 6;
        c.clayout = v == 2 ? 2 : 0;
        run_case(&c, seed + 9000 + (uint64_t)v, 1 + v % 2, v == 1 ? 3 : 0, v % 4 == 0, v == 0);
    }
    /* prefill chunks: packed q and new rows over a cache, causal; bf16 takes the pair path */
    for (int v = 0; v < 6; v++) {
        icase c;
        icase_init(&c);
        c.mla = 1 + v % 2;
        c.mode = v % 2 ? MODE_PAGED : MODE_CONTIG;
        c.varlen_q = 1;
        c.append = 1;
        c.B = 3, c.Hq = 8, c.Hk = v == 4 ? 2 : 1, c.D = v < 3 ? 72 : 40, c.Dv = v < 3 ? 64 : 33;
        c.qdt = QDT[v % 3];
        c.cdt = v == 3 ? FA_DTYPE_I8 : v == 5 ? FA_DTYPE_F16 : c.qdt;
        static const int32_t old[] = {0, 64, 17}, chunk[] = {70, 16, 33};
        for (int b = 0; b < 3; b++) c.sold[b] = old[b], c.sq[b] = c.snew[b] = chunk[b];
        c.causal = FA_CAUSAL_BOTTOM_RIGHT;
        c.page_size = v == 1 ? 16 : 5;
        c.batch_idx = v == 2;
        c.tile_q = v == 4 ? 16 : 0;
        run_case(&c, seed + 9100 + (uint64_t)v, 2, 0, 1, v == 1);
    }
    /* random latent shapes (tails in D and Dv), forms, dtypes, splits */
    static const int64_t dims[][2] = {{24, 24}, {33, 17}, {72, 64}, {96, 1}, {40, 0}, {130, 128}};
    const int n = h_scaled(24);
    for (int k = 0; k < n; k++) {
        h_rng r;
        h_rng_seed(&r, seed * 29 + 7 * (uint64_t)k);
        icase c;
        const int mode = k % 2 ? MODE_PAGED : MODE_CONTIG, kind = (k / 2) % 3;
        random_cache_case(&c, &r, mode, kind == 1 || (kind == 2 && h_rng_uniform(&r) < 0.8), kind == 2);
        c.mla = 1 + (int)h_rng_int(&r, 0, 1);
        const int di = (int)h_rng_int(&r, 0, 5);
        c.D = dims[di][0], c.Dv = dims[di][1];
        fit_budget(&c);
        static const int64_t forced[] = {2, 5};
        run_case(&c, seed + 9200 + (uint64_t)k, 1 + (k % 2), k % 3 == 2 ? forced[(k / 3) % 2] : 0, k % 4 == 1, 0);
    }
}

/*
 * The new rows' dtype (the header's contract): new k and v rows may each be f32, f16
 * or bf16 whatever q's dtype, the cache's and each other's; each is rounded (int8:
 * quantised) into the cache's dtype once, and the call attends to what the cache then
 * holds (check_cache compares the cache with the test's own rounding of the new rows,
 * the oracle reads the expected cache). Every (k, v) pair into every cache dtype, q of
 * another dtype than k, contiguous and paged, decode and prefill chunks; and a latent
 * cache fed rows of another dtype.
 */
static void test_new_row_dtypes(uint64_t seed) {
    int k = 0;
    for (int ki = 0; ki < 3; ki++)
        for (int vi = 0; vi < 3; vi++)
            for (int ci = 0; ci < 4; ci++, k++) {
                icase c;
                icase_init(&c);
                c.mode = k % 2 ? MODE_PAGED : MODE_CONTIG;
                c.varlen_q = k % 3 == 2;
                c.append = 1;
                c.new_dt = 1;
                c.kdt = QDT[ki], c.vdt = QDT[vi], c.cdt = CDT[ci];
                c.qdt = QDT[(ki + 1 + k % 2) % 3]; /* never k's */
                c.odt = k % 5 == 0 ? FA_DTYPE_F32 : c.qdt;
                c.B = 3, c.Hq = 4, c.Hk = 2, c.D = 40, c.Dv = 24;
                c.page_size = 8;
                c.zero_rows = ci == 3 && k % 2;
                static const int32_t old[] = {20, 0, 45};
                for (int b = 0; b < 3; b++) c.sq[b] = c.snew[b] = k % 3 == 2 ? 9 + 3 * b : 2, c.sold[b] = old[b];
                c.causal = FA_CAUSAL_BOTTOM_RIGHT;
                c.mla = k % 7 == 3 ? 1 : 0;
                run_case(&c, seed + 9400 + (uint64_t)k, 2, 0, k % 6 == 0, 0);
            }
}

/* ------------------------------------------------------ decoding on tiles */

/*
 * Decoding on the tile unit (algo_flash.c, decode_tiles): bf16 q over a bf16 cache whose
 * kv head holds at least 32 query rows (group x new rows; at most 256) runs the group as
 * one tile problem, unpacked, key tiles of 256. MLA-shaped latent caches with small D
 * (tails: D 40, Dv 33), GQA groups with a few new rows each, at the threshold (32 rows),
 * just below it (31), and at 128 and 256 rows (one more new row: 320, not taken);
 * contiguous and paged caches (pages of 5 and 16 rows: tiles gathered across pages, and
 * of 300: a tile inside one page read in place), appends, packed q, causal and window
 * bands, split-KV forced and planned (a 4500-key cache: chunks of at least 2048 keys on
 * the route), 1 and 2 threads; each against the fp64 oracle. On the tile tables the
 * tiles and splits the call reports say the route ran.
 */
static void test_decode_tiles(uint64_t seed) {
    const int tiles = strncmp(fa_context_isa(g_ctx), "amx", 3) == 0;
    static const struct {
        int64_t hq, hk, sq, d, dv;
        int mla;
    } shapes[] = {
        {32, 1, 1, 72, 64, 1}, {32, 1, 1, 40, 33, 2}, {16, 2, 4, 64, 64, 0}, {31, 1, 1, 72, 64, 1},
        {128, 1, 1, 64, 48, 2}, {64, 1, 4, 40, 40, 1}, {64, 1, 5, 40, 40, 0}, {8, 1, 4, 48, 40, 0},
    };
    const int ns = (int)(sizeof shapes / sizeof shapes[0]);
    for (int v = 0; v < 2 * ns; v++) {
        const int k = v % ns;
        icase c;
        icase_init(&c);
        c.mla = shapes[k].mla;
        c.mode = v % 3 == 0 ? MODE_CONTIG : MODE_PAGED;
        c.page_size = v % 3 == 1 ? 5 : v % 3 == 2 && v >= ns ? 300 : 16;
        c.batch_idx = v == 5;
        c.B = 2, c.Hq = shapes[k].hq, c.Hk = shapes[k].hk, c.D = shapes[k].d, c.Dv = shapes[k].dv;
        c.qdt = c.cdt = FA_DTYPE_BF16;
        c.odt = v % 4 == 3 ? FA_DTYPE_F32 : FA_DTYPE_BF16;
        c.append = v % 5 != 2;
        c.varlen_q = v % 7 == 4;
        static const int32_t old[] = {600, 37};
        for (int b = 0; b < 2; b++) {
            c.sq[b] = (int32_t)shapes[k].sq;
            c.snew[b] = c.append ? c.sq[b] : 0;
            c.sold[b] = old[b] - (v >= ns) * b * 30;
        }
        if (v < 2) c.sold[0] = 4500; /* planned split-KV on the route: 2 chunks of sequence 0 */
        c.causal = v % 2 ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
        if (v == 9) c.wl = 100, c.wr = 0;
        const int64_t rows = c.Hq / c.Hk * shapes[k].sq;
        static const int64_t forced[] = {0, 2, 5};
        const int64_t splits = forced[(v / 2) % 3];
        run_case(&c, seed + 9700 + (uint64_t)v, 1 + v % 2, splits, v % 4 == 0, 0);
        if (!tiles || rows < 32 || rows > 256) continue;
        /* the same call again, its tiles read right after it (run_case's oracle runs last) */
        h_rng r;
        h_rng_seed(&r, seed + 9700 + (uint64_t)v);
        iprob p;
        iprob_build(&p, &c, &r);
        int64_t tq = -1, tkv = -1;
        const fa_status st = iprob_run(g_ctx, &p, FA_ALGO_FLASH, 1 + v % 2, splits);
        fa_context_get(g_ctx, FA_PARAM_LAST_TILE_Q, &tq);
        fa_context_get(g_ctx, FA_PARAM_LAST_TILE_KV, &tkv);
        h_case("decode on tiles: Hq=%lld Hk=%lld Sq=%lld on %s", (long long)c.Hq, (long long)c.Hk,
               (long long)shapes[k].sq, fa_context_isa(g_ctx));
        const int64_t want_splits = splits ? splits : v < 2 ? 2 : 1;
        CHECK(st == FA_OK && tq == rows && tkv == 256 && p.last_packed == 0 && p.last_splits == want_splits,
              "status %d, tiles %lld x %lld, %lld units packed, %lld splits; want %lld x 256, none, %lld", (int)st,
              (long long)tq, (long long)tkv, (long long)p.last_packed, (long long)p.last_splits, (long long)rows,
              (long long)want_splits);
        iprob_free(&p);
    }
}

/* ------------------------------------------------------------- mixed batches */

/* A mixed case's output and lse bytes, copied (the caller frees them). */
static void save_out(const iprob *p, unsigned char **o, unsigned char **l) {
    *o = malloc(p->o_bytes), *l = malloc(p->lse_bytes);
    memcpy(*o, p->a.o.data, p->o_bytes);
    memcpy(*l, p->lse_t.data, p->lse_bytes);
}

static int same_out(const iprob *p, const unsigned char *o, const unsigned char *l) {
    return memcmp(o, p->a.o.data, p->o_bytes) == 0 && memcmp(l, p->lse_t.data, p->lse_bytes) == 0;
}

/*
 * The same work as the mixed call in two calls, the chunks (sequences 0 .. nc-1)
 * then the decodes, each on its share of cu_seqlens, seqlens, the block table and
 * ALiBi, into p's o and lse (the cache restored first, so both append alike).
 */
static fa_status run_separately(iprob *p, int64_t nc) {
    for (int t = 0; t < p->ncache; t++) memcpy(p->cache[t].data, p->snap[t], p->cbytes[t]);
    memset(p->a.o.data, SENTINEL, p->o_bytes);
    memset(p->lse_t.data, SENTINEL, p->lse_bytes);
    fa_status st = FA_OK;
    int32_t rows[MAXS]; /* a contiguous cache's rows of the sequences */
    for (int64_t b = 0; b < p->c.B; b++) rows[b] = p->kc.batch_idx ? p->bidx[b] : (int32_t)b;
    for (int part = 0; part < 2 && st == FA_OK; part++) {
        const int64_t b0 = part ? nc : 0, n = part ? p->c.B - nc : nc;
        fa_forward_args a = p->a;
        fa_kv_cache kc = p->kc;
        if (!kc.block_table) kc.batch_idx = rows + b0;
        a.num_seqs = n;
        a.cu_seqlens_q = p->cu_q + b0;
        if (a.cu_seqlens_k) a.cu_seqlens_k = p->cu_k + b0;
        kc.seqlens = p->seqlens + b0;
        if (kc.block_table) kc.block_table = p->bt + b0 * kc.max_pages;
        if (a.alibi_slopes) a.alibi_slopes += b0 * a.alibi_stride_b;
        a.kv_cache = &kc;
        st = h_run(g_ctx, FA_ALGO_FLASH, 2, &a);
    }
    return st;
}

/*
 * Mixed batches, as a chunked-prefill server sends them: a few prefill chunks
 * (wide tiles) and many one-row decodes (the small-row path) over one cache, each
 * sequence appending its new rows. Against the oracle; bitwise the same on 1, 2 and
 * 3 threads; and, with the tiles and the split count fixed (the plan is then the
 * same for every sequence whatever shares its call), bitwise the same as the chunks
 * and the decodes in two calls.
 */
static void test_mixed(uint64_t seed) {
    for (int v = 0; v < 6; v++) {
        h_rng r;
        h_rng_seed(&r, seed * 19 + 3 * (uint64_t)v);
        icase c;
        icase_init(&c);
        c.mode = v == 5 ? MODE_CONTIG : MODE_PAGED;
        c.varlen_q = 1;
        c.append = v != 3;
        c.B = 10, c.Hq = 8, c.Hk = 2, c.D = 64, c.Dv = 64;
        c.qdt = QDT[v % 3];
        c.cdt = v == 1 ? FA_DTYPE_F16 : v == 2 ? FA_DTYPE_I8 : v == 4 ? FA_DTYPE_BF16 : c.qdt;
        c.page_size = v % 2 ? 16 : 3;
        c.share = v == 4;
        c.causal = FA_CAUSAL_BOTTOM_RIGHT;
        c.alibi = v == 3 ? 2 : 0;
        c.wl = v == 4 ? 70 : -1;
        const int64_t nc = v == 0 ? 1 : v == 5 ? 3 : 2; /* chunks first, then decodes */
        for (int64_t b = 0; b < c.B; b++) {
            c.sq[b] = b < nc ? (int32_t)h_rng_int(&r, 33, 90) : 1;
            c.snew[b] = c.append ? c.sq[b] : 0;
            c.sold[b] = (int32_t)h_rng_int(&r, b < nc ? 0 : 1, 260);
        }
        iprob p;
        iprob_build(&p, &c, &r);
        g_cases++;
        unsigned char *o1 = NULL, *l1 = NULL;
        for (int64_t threads = 1; threads <= 3; threads++) {
            h_case("mixed %s | seed=%llu threads=%lld", p.desc, (unsigned long long)seed, (long long)threads);
            fa_status st = iprob_run(g_ctx, &p, FA_ALGO_FLASH, threads, 0);
            if (!CHECK(st == FA_OK, "status %d (%s): %s", (int)st, fa_status_string(st), fa_context_error(g_ctx)))
                break;
            if (threads == 1) {
                check_cache(&p);
                check_unowned(&p);
                check_numbers(g_ctx, &p);
                save_out(&p, &o1, &l1);
            } else {
                CHECK(same_out(&p, o1, l1), "%lld threads differ bitwise from 1", (long long)threads);
            }
        }
        free(o1), free(l1);
        /* fixed tiles (at most every sequence's lengths) and one split: mixed == separate */
        p.c.tile_q = 16, p.c.tile_kv = 16;
        h_case("mixed %s | seed=%llu vs separate calls", p.desc, (unsigned long long)seed);
        fa_status st = iprob_run(g_ctx, &p, FA_ALGO_FLASH, 2, 1);
        if (CHECK(st == FA_OK, "status %d: %s", (int)st, fa_context_error(g_ctx))) {
            save_out(&p, &o1, &l1);
            st = run_separately(&p, nc);
            if (CHECK(st == FA_OK, "separate calls: status %d: %s", (int)st, fa_context_error(g_ctx))) {
                check_cache(&p);
                CHECK(same_out(&p, o1, l1), "the mixed call and the two separate calls differ bitwise");
            }
            free(o1), free(l1);
        }
        h_set_tiles(g_ctx, 0, 0);
        fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, 0);
        iprob_free(&p);
    }
}

/* ------------------------------------------------------------- left padding */

/* Copies row (i0, i1) of cache tensor `from` to row (j0, j1) of `to`, every head and
 * element (int8 as bytes, floats exactly: same dtype). */
static void copy_cache_row(const fa_tensor *from, int64_t i0, int64_t i1, const fa_tensor *to, int64_t j0,
                           int64_t j1) {
    for (int64_t h = 0; h < from->shape[2]; h++)
        for (int64_t d = 0; d < from->shape[3]; d++) {
            if (from->dtype == FA_DTYPE_I8) *i8_at(to, j0, j1, h, d) = *i8_at(from, i0, i1, h, d);
            else h_set(to, j0, j1, h, d, h_get(from, i0, i1, h, d));
        }
}

/*
 * fa_kv_cache.leftpad: a call over a cache whose every sequence is moved right by
 * pad[b] rows (NaN before, leftpad = pad, seqlens grown by pad) must give the bits of
 * the same call unpadded, which is first checked against the oracle, and append to
 * the moved rows; the padding stays untouched. Then the refusals.
 */
static void test_leftpad(uint64_t seed) {
    for (int v = 0; v < 6; v++) {
        h_rng r;
        h_rng_seed(&r, seed * 23 + 5 * (uint64_t)v);
        icase c;
        icase_init(&c);
        c.mode = MODE_CONTIG;
        c.varlen_q = v >= 4;
        c.append = v % 2 == 0 || v == 5;
        c.B = 4, c.Hq = 4, c.Hk = 2, c.D = 64, c.Dv = 64;
        c.qdt = QDT[v % 3];
        c.cdt = v == 1 ? FA_DTYPE_F16 : v == 3 ? FA_DTYPE_I8 : c.qdt;
        c.batch_idx = v == 2 || v == 5;
        c.causal = v == 3 ? FA_CAUSAL_NONE : FA_CAUSAL_BOTTOM_RIGHT;
        c.wl = v == 4 ? 20 : -1;
        c.alibi = v == 5 ? 1 : 0;
        static const int32_t old[] = {37, 0, 1, 150};
        for (int b = 0; b < 4; b++) {
            c.sq[b] = c.varlen_q ? (int32_t)h_rng_int(&r, b == 0, 9) : 3;
            c.sold[b] = old[b];
            c.snew[b] = c.append ? (c.varlen_q ? (int32_t)h_rng_int(&r, 1, 4) : 3) : 0;
        }
        if (!c.append && c.sold[1] == 0) c.sold[1] = 2;
        iprob p;
        iprob_build(&p, &c, &r);
        g_cases++;
        h_case("leftpad %s | seed=%llu, unpadded", p.desc, (unsigned long long)seed);
        fa_status st = iprob_run(g_ctx, &p, FA_ALGO_FLASH, 2, 0);
        if (!CHECK(st == FA_OK, "status %d: %s", (int)st, fa_context_error(g_ctx))) {
            iprob_free(&p);
            continue;
        }
        check_cache(&p);
        check_numbers(g_ctx, &p);
        unsigned char *o1, *l1;
        save_out(&p, &o1, &l1);
        /* the moved cache: rows of cache row br land pad[b] rows later */
        int32_t pad[MAXS], seqlens[MAXS], max_pad = 0;
        for (int64_t b = 0; b < c.B; b++) {
            pad[b] = (int32_t)h_rng_int(&r, 0, 6);
            max_pad = pad[b] > max_pad ? pad[b] : max_pad;
            seqlens[b] = p.seqlens[b] + pad[b];
        }
        fa_tensor moved[4];
        size_t mbytes[4];
        const int64_t d0 = p.cache[0].shape[0], d1 = p.cache[0].shape[1] + max_pad;
        for (int t = 0; t < p.ncache; t++) {
            moved[t] = t_alloc_layout(p.cache[t].dtype, d0, d1, c.Hk, t < 2 ? (t ? c.Dv : c.D) : 1, 0, 0, &mbytes[t]);
            memset(moved[t].data, 0xff, mbytes[t]); /* NaN (int8: -1 with NaN scales) */
        }
        for (int64_t b = 0; b < c.B; b++) { /* sequence b's cache row, restored to before the call */
            const int64_t row = c.batch_idx ? p.bidx[b] : b;
            for (int t = 0; t < p.ncache; t++) {
                fa_tensor before = p.cache[t];
                before.data = p.snap[t];
                for (int64_t j = 0; j < p.cache[0].shape[1]; j++)
                    copy_cache_row(&before, row, j, &moved[t], row, j + pad[b]);
            }
        }
        unsigned char *moved_snap[4];
        for (int t = 0; t < p.ncache; t++) moved_snap[t] = malloc(mbytes[t]), memcpy(moved_snap[t], moved[t].data, mbytes[t]);
        fa_kv_cache kc = p.kc;
        kc.k = moved[0], kc.v = moved[1];
        if (p.ncache == 4) kc.k_scale = moved[2], kc.v_scale = moved[3];
        kc.seqlens = seqlens;
        kc.leftpad = pad;
        fa_forward_args a = p.a;
        a.kv_cache = &kc;
        memset(p.a.o.data, SENTINEL, p.o_bytes);
        memset(p.lse_t.data, SENTINEL, p.lse_bytes);
        h_case("leftpad %s | seed=%llu, moved by up to %d rows", p.desc, (unsigned long long)seed, max_pad);
        st = h_run(g_ctx, FA_ALGO_FLASH, 2, &a);
        if (CHECK(st == FA_OK, "status %d: %s", (int)st, fa_context_error(g_ctx))) {
            CHECK(same_out(&p, o1, l1), "the left-padded call differs bitwise from the unpadded one");
            int same = 1, pad_kept = 1;
            for (int64_t b = 0; b < c.B; b++) {
                const int64_t row = c.batch_idx ? p.bidx[b] : b;
                for (int t = 0; t < p.ncache; t++) {
                    fa_tensor after = moved[t], kept = moved[t];
                    kept.data = moved_snap[t];
                    for (int64_t j = 0; j < pad[b]; j++)
                        for (int64_t h = 0; h < c.Hk; h++)
                            pad_kept &= memcmp((char *)after.data + h_offset(&after, row, j, h, 0) * dt_bytes(after.dtype),
                                               (char *)kept.data + h_offset(&kept, row, j, h, 0) * dt_bytes(kept.dtype),
                                               dt_bytes(after.dtype) * (size_t)after.shape[3]) == 0;
                    for (int64_t j = 0; j < p.cache[0].shape[1]; j++)
                        for (int64_t h = 0; h < c.Hk; h++)
                            for (int64_t d = 0; d < moved[t].shape[3]; d++)
                                same &= after.dtype == FA_DTYPE_I8
                                            ? *i8_at(&after, row, j + pad[b], h, d) == *i8_at(&p.cache[t], row, j, h, d)
                                            : h_get(&after, row, j + pad[b], h, d) == h_get(&p.cache[t], row, j, h, d) ||
                                                  (isnan(h_get(&after, row, j + pad[b], h, d)) &&
                                                   isnan(h_get(&p.cache[t], row, j, h, d)));
                }
            }
            CHECK(same, "the left-padded cache after the append differs from the unpadded one, moved");
            CHECK(pad_kept, "a padding row before leftpad was written");
        }
        /* refusals, nothing written: leftpad beyond seqlens, negative, with a block table */
        for (int bad = 0; bad < 3; bad++) {
            int32_t lp[MAXS];
            memcpy(lp, pad, sizeof lp);
            if (bad == 0) lp[c.B - 1] = seqlens[c.B - 1] + 1;
            if (bad == 1) lp[0] = -1;
            fa_kv_cache kb = kc;
            kb.leftpad = lp;
            int32_t table[MAXS] = {0};
            if (bad == 2) kb.block_table = table, kb.max_pages = 1, kb.batch_idx = NULL;
            for (int t = 0; t < p.ncache; t++) memcpy(moved[t].data, moved_snap[t], mbytes[t]);
            memset(p.a.o.data, SENTINEL, p.o_bytes);
            memset(p.lse_t.data, SENTINEL, p.lse_bytes);
            a.kv_cache = &kb;
            h_case("leftpad %s | refusal %d", p.desc, bad);
            st = h_run(g_ctx, FA_ALGO_FLASH, 2, &a);
            const fa_status want = bad == 2 ? FA_ERR_INVALID_ARGUMENT : FA_ERR_OUT_OF_RANGE;
            CHECK(st == want, "status %d (%s), want %d: %s", (int)st, fa_status_string(st), (int)want,
                  fa_context_error(g_ctx));
            CHECK(bad == 2 || strstr(fa_context_error(g_ctx), "leftpad") != NULL, "message: %s", fa_context_error(g_ctx));
            int untouched = all_bytes(p.a.o.data, p.o_bytes, SENTINEL) && all_bytes(p.lse_t.data, p.lse_bytes, SENTINEL);
            for (int t = 0; t < p.ncache; t++) untouched &= memcmp(moved[t].data, moved_snap[t], mbytes[t]) == 0;
            CHECK(untouched, "a refused call wrote o, lse or the cache");
        }
        for (int t = 0; t < p.ncache; t++) free(moved[t].data), free(moved_snap[t]);
        free(o1), free(l1);
        iprob_free(&p);
    }
}

/* ------------------------------------------------------------- decode sweep */

static void test_decode(uint64_t seed) {
    static const int64_t ds[] = {64, 128, 72};
    static const int64_t groups[] = {1, 4, 8};
    int k = 0;
    const int reps = h_test_scale() < 1.0 ? 1 : 2;
    for (int di = 0; di < 3; di++)
        for (int gi = 0; gi < 3; gi++)
            for (int qi = 0; qi < 3; qi++)
                for (int rep = 0; rep < reps; rep++, k++) {
                    h_rng r;
                    h_rng_seed(&r, seed * 13 + 5 * (uint64_t)k);
                    icase c;
                    icase_init(&c);
                    c.mode = h_rng_uniform(&r) < 0.5 ? MODE_PAGED : MODE_CONTIG;
                    c.D = c.Dv = ds[di];
                    c.Hk = h_rng_int(&r, 1, 2);
                    c.Hq = c.Hk * groups[gi];
                    c.qdt = QDT[qi];
                    c.cdt = h_rng_uniform(&r) < 0.5 ? c.qdt : CDT[h_rng_int(&r, 0, NCDT - 1)];
                    c.scale_mode = dt_quant(c.cdt) ? (int)h_rng_int(&r, 0, 2) : 0;
                    c.odt = h_rng_uniform(&r) < 0.3 ? FA_DTYPE_F32 : c.qdt;
                    c.B = h_rng_int(&r, 1, 3);
                    const int32_t sq = (int32_t)(1 + (k % 16));
                    c.append = h_rng_uniform(&r) < 0.6;
                    for (int64_t b = 0; b < c.B; b++) {
                        c.sq[b] = sq;
                        c.snew[b] = c.append ? sq : 0;
                        c.sold[b] = (int32_t)h_rng_int(&r, 0, c.D >= 128 ? 200 : 350);
                    }
                    if (!c.append && c.sold[0] == 0) c.sold[0] = 1;
                    static const int64_t pss[] = {1, 3, 16, 128};
                    c.page_size = pss[h_rng_int(&r, 0, 3)];
                    c.batch_idx = c.mode == MODE_CONTIG && h_rng_uniform(&r) < 0.3;
                    c.share = c.mode == MODE_PAGED && h_rng_uniform(&r) < 0.3;
                    c.causal = h_rng_uniform(&r) < 0.8 ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
                    c.lse = h_rng_uniform(&r) < 0.7;
                    c.clayout = (int)h_rng_int(&r, 0, 2);
                    if (h_rng_uniform(&r) < 0.15) c.softcap = 20.0f;
                    if (h_rng_uniform(&r) < 0.15) c.wl = h_rng_int(&r, 0, 64);
                    if (h_rng_uniform(&r) < 0.15) c.alibi = (int)h_rng_int(&r, 1, 2);
                    fit_budget(&c);
                    run_case(&c, seed + 7000 + (uint64_t)k, 1, 0, 1, 0);
                }
}

/* ----------------------------------------------------------------- split-KV */

static void test_splits(uint64_t seed) {
    /* one long, one short, one empty sequence; decode with GQA */
    for (int v = 0; v < 3; v++) {
        icase c;
        icase_init(&c);
        c.mode = v == 1 ? MODE_PAGED : v == 2 ? MODE_VARLEN : MODE_CONTIG;
        c.B = 3, c.Hq = 8, c.Hk = 2, c.D = 128, c.Dv = 128;
        c.qdt = v == 1 ? FA_DTYPE_BF16 : FA_DTYPE_F32;
        c.cdt = v == 0 ? FA_DTYPE_F16 : v == 1 ? FA_DTYPE_I8 : c.qdt;
        c.page_size = 16;
        static const int32_t old[] = {1100, 37, 0};
        if (c.mode == MODE_VARLEN) {
            static const int32_t sq[] = {5, 1, 2}, sk[] = {1100, 0, 37};
            memcpy(c.sq, sq, sizeof sq), memcpy(c.snew, sk, sizeof sk);
        } else {
            c.append = 1;
            for (int b = 0; b < 3; b++) c.sq[b] = 1, c.snew[b] = 1, c.sold[b] = old[b];
        }
        c.causal = FA_CAUSAL_BOTTOM_RIGHT;
        h_rng r;
        h_rng_seed(&r, seed + 800 + (uint64_t)v);
        iprob p;
        iprob_build(&p, &c, &r);
        static const int64_t splits[] = {1, 2, 3, 7, 64, 256, 0};
        int64_t max_sk = 0;
        for (int b = 0; b < 3; b++) {
            const int64_t sk = c.mode == MODE_VARLEN ? c.snew[b] : c.sold[b] + c.snew[b];
            max_sk = sk > max_sk ? sk : max_sk;
        }
        for (size_t s = 0; s < sizeof splits / sizeof splits[0]; s++) {
            unsigned char *o1 = malloc(p.o_bytes), *l1 = malloc(p.lse_bytes);
            int64_t last1 = -1;
            for (int64_t t = 1; t <= 2; t++) {
                h_case("split-KV: %s | splits=%lld threads=%lld", p.desc, (long long)splits[s], (long long)t);
                g_cases++;
                const fa_status st = iprob_run(g_ctx, &p, FA_ALGO_FLASH, t, splits[s]);
                if (!CHECK(st == FA_OK, "status %d (%s): %s", (int)st, fa_status_string(st), fa_context_error(g_ctx)))
                    break;
                if (t == 1) {
                    check_cache(&p);
                    check_numbers(g_ctx, &p);
                    memcpy(o1, p.a.o.data, p.o_bytes), memcpy(l1, p.lse_t.data, p.lse_bytes);
                    last1 = p.last_splits;
                    if (splits[s] > 0 && splits[s] * 16 <= max_sk)
                        CHECK(p.last_splits == splits[s], "LAST_KV_SPLITS %lld, forced %lld (longest sequence %lld keys)",
                              (long long)p.last_splits, (long long)splits[s], (long long)max_sk);
                    else if (splits[s] > 0)
                        CHECK(p.last_splits >= 1 && p.last_splits <= splits[s],
                              "LAST_KV_SPLITS %lld outside [1, forced %lld]", (long long)p.last_splits,
                              (long long)splits[s]);
                    else
                        CHECK(p.last_splits >= 1 && p.last_splits <= 64, "LAST_KV_SPLITS %lld (planned) outside [1, 64]",
                              (long long)p.last_splits);
                } else {
                    CHECK(memcmp(o1, p.a.o.data, p.o_bytes) == 0 && memcmp(l1, p.lse_t.data, p.lse_bytes) == 0,
                          "threads 1 and 2 differ bitwise with splits %lld", (long long)splits[s]);
                    CHECK(last1 == p.last_splits, "LAST_KV_SPLITS %lld with 1 thread, %lld with 2", (long long)last1,
                          (long long)p.last_splits);
                }
            }
            free(o1), free(l1);
        }
        iprob_free(&p);
    }

    /* the planned split count (fa_forward's comment): min(64, ceil(32 / tasks), Sk / 512);
     * decoding (Sq = 1, heads stacked, small-row path) makes one task per sequence, all
     * its heads together (these head counts are far below the scratch budget) */
    static const struct {
        int64_t B, Hk;
        int32_t sk;
        int64_t want;
    } plans[] = {{1, 1, 4096, 8}, {4, 2, 4096, 8}, {1, 1, 700, 1}, {2, 1, 2048, 4}};
    for (size_t k = 0; k < sizeof plans / sizeof plans[0]; k++) {
        icase c;
        icase_init(&c);
        c.mode = MODE_CONTIG;
        c.B = plans[k].B, c.Hk = plans[k].Hk, c.Hq = 4 * plans[k].Hk, c.D = c.Dv = 64;
        c.qdt = c.cdt = FA_DTYPE_F16;
        for (int64_t b = 0; b < c.B; b++) c.sq[b] = 1, c.sold[b] = plans[k].sk;
        c.causal = FA_CAUSAL_BOTTOM_RIGHT;
        h_rng r;
        h_rng_seed(&r, seed + 900 + k);
        iprob p;
        iprob_build(&p, &c, &r);
        h_case("planned splits: %s", p.desc);
        g_cases++;
        fa_status st = iprob_run(g_ctx, &p, FA_ALGO_AUTO, 2, 0);
        if (CHECK(st == FA_OK, "status %d: %s", (int)st, fa_context_error(g_ctx))) {
            CHECK(p.last_splits == plans[k].want,
                  "LAST_KV_SPLITS %lld, want min(64, ceil(32 / %lld tasks), %d / 512) = %lld", (long long)p.last_splits,
                  (long long)c.B, plans[k].sk, (long long)plans[k].want);
            if (k == 0) check_numbers(g_ctx, &p);
        }
        iprob_free(&p);
    }

    /* forced splits on a plain dense call: the same result as the reference */
    {
        h_rng r;
        h_rng_seed(&r, seed + 950);
        const h_dims d = {2, 3, 900, 4, 2, 64, 64};
        h_problem pr;
        h_problem_alloc(&pr, d, FA_DTYPE_F32, FA_DTYPE_F32);
        h_fill_normal(&pr.args.q, &r, 1.0), h_fill_normal(&pr.args.k, &r, 1.0), h_fill_normal(&pr.args.v, &r, 1.0);
        pr.args.causal = FA_CAUSAL_BOTTOM_RIGHT;
        fa_forward_args ra = pr.args;
        ra.o = h_alloc(FA_DTYPE_F32, d.B, d.Sq, d.Hq, d.Dv);
        ra.lse = h_alloc(FA_DTYPE_F32, d.B, d.Hq, d.Sq, 1);
        fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, 0);
        h_set_tiles(g_ctx, 0, 0);
        fa_status st = h_run(g_ctx, FA_ALGO_REFERENCE, 1, &ra);
        CHECK(st == FA_OK, "reference: status %d", (int)st);
        const int64_t no = h_numel(&ra.o);
        double *os = malloc(sizeof(double) * (size_t)no), *ref = malloc(sizeof(double) * (size_t)no);
        naive_forward(&pr.args, NAIVE_SAME_PRECISION, os, NULL, NULL);
        double nerr = 0.0, omax = 0.0;
        for (int64_t e = 0; e < no; e++) {
            ref[e] = h_get(&ra.o, 0, 0, 0, e);
            nerr = fmax(nerr, fabs(os[e] - ref[e]));
            omax = fmax(omax, fabs(ref[e]));
        }
        const double tol = 2.0 * nerr + h_prop_ulps(FA_DTYPE_F32) * FLT_EPSILON * fmax(1.0, omax);
        for (int64_t s = 1; s <= 7; s += 2) {
            h_case("dense call (%s, causal) with KV_SPLITS=%lld", h_dims_str(&d), (long long)s);
            g_cases++;
            fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, s);
            h_poison_outputs(&pr.args);
            st = h_run(g_ctx, FA_ALGO_FLASH, 2, &pr.args);
            if (!CHECK(st == FA_OK, "status %d: %s", (int)st, fa_context_error(g_ctx))) continue;
            double err = 0.0, lerr = 0.0;
            for (int64_t e = 0; e < no; e++) {
                const double g = fabs(h_get(&pr.args.o, 0, 0, 0, e) - ref[e]);
                err = fmax(err, isnan(g) ? INFINITY : g);
            }
            for (int64_t e = 0; e < h_numel(&ra.lse); e++) {
                const double g = fabs(h_get(&pr.args.lse, 0, 0, 0, e) - h_get(&ra.lse, 0, 0, 0, e));
                lerr = fmax(lerr, isnan(g) ? INFINITY : g);
            }
            CHECK(err <= tol, "o max err %.3g > tol %.3g", err, tol);
            CHECK(lerr <= 64 * FLT_EPSILON * 10.0, "lse max err %.3g", lerr);
        }
        fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, 0);
        free(os), free(ref), free(ra.o.data), free(ra.lse.data);
        h_problem_free(&pr);
    }

    /* bounds of the new parameters */
    h_case("FA_PARAM_KV_SPLITS / LAST_KV_SPLITS bounds");
    int64_t lo = -1, hi = -1;
    CHECK(fa_param_bounds(FA_PARAM_KV_SPLITS, &lo, &hi) == FA_OK && lo == 0 && hi == 256, "KV_SPLITS bounds [%lld, %lld]",
          (long long)lo, (long long)hi);
    CHECK(fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, 257) == FA_ERR_INVALID_ARGUMENT, "KV_SPLITS 257 accepted");
    CHECK(fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, -1) == FA_ERR_INVALID_ARGUMENT, "KV_SPLITS -1 accepted");
    CHECK(fa_context_set(g_ctx, FA_PARAM_LAST_KV_SPLITS, 1) == FA_ERR_INVALID_ARGUMENT, "LAST_KV_SPLITS is writable");
    fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, 0);
}

/* fa_forward_args.kv_splits: this call's split-KV count, the very bits of the context's
 * FA_PARAM_KV_SPLITS set to it, winning over that setting and leaving it as it was;
 * outside 0..256 refused before anything is written. */
static void test_call_splits(uint64_t seed) {
    icase c;
    icase_init(&c);
    c.mode = MODE_CONTIG;
    c.B = 3, c.Hq = 8, c.Hk = 2, c.D = 64, c.Dv = 64;
    c.qdt = FA_DTYPE_F32, c.cdt = FA_DTYPE_F16;
    c.append = 1;
    static const int32_t old[] = {900, 37, 0};
    for (int b = 0; b < 3; b++) c.sq[b] = 1, c.snew[b] = 1, c.sold[b] = old[b];
    c.causal = FA_CAUSAL_BOTTOM_RIGHT;
    h_rng r;
    h_rng_seed(&r, seed + 850);
    iprob p;
    iprob_build(&p, &c, &r);
    unsigned char *o1 = malloc(p.o_bytes), *l1 = malloc(p.lse_bytes);
    static const int64_t splits[] = {1, 2, 7, 64};
    for (size_t s = 0; s < sizeof splits / sizeof splits[0]; s++) {
        h_case("kv_splits = %lld per call: %s", (long long)splits[s], p.desc);
        g_cases++;
        p.a.kv_splits = 0;
        fa_status st = iprob_run(g_ctx, &p, FA_ALGO_FLASH, 2, splits[s]);
        if (!CHECK(st == FA_OK, "context KV_SPLITS %lld: %s", (long long)splits[s], fa_context_error(g_ctx))) break;
        check_numbers(g_ctx, &p);
        memcpy(o1, p.a.o.data, p.o_bytes), memcpy(l1, p.lse_t.data, p.lse_bytes);
        const int64_t last1 = p.last_splits;
        for (int64_t ctx_splits = 0; ctx_splits <= 3; ctx_splits += 3) {
            p.a.kv_splits = splits[s];
            st = iprob_run(g_ctx, &p, FA_ALGO_FLASH, 2, ctx_splits);
            if (!CHECK(st == FA_OK, "kv_splits %lld: %s", (long long)splits[s], fa_context_error(g_ctx))) continue;
            check_cache(&p);
            CHECK(memcmp(o1, p.a.o.data, p.o_bytes) == 0 && memcmp(l1, p.lse_t.data, p.lse_bytes) == 0,
                  "kv_splits %lld (context %lld) differs bitwise from the context's KV_SPLITS %lld",
                  (long long)splits[s], (long long)ctx_splits, (long long)splits[s]);
            CHECK(p.last_splits == last1, "LAST_KV_SPLITS %lld, with the context's setting %lld",
                  (long long)p.last_splits, (long long)last1);
            int64_t kept = -1;
            fa_context_get(g_ctx, FA_PARAM_KV_SPLITS, &kept);
            CHECK(kept == ctx_splits, "the call changed the context's KV_SPLITS to %lld", (long long)kept);
        }
    }
    static const int64_t bad[] = {-1, 257, INT64_MAX, INT64_MIN};
    for (size_t s = 0; s < sizeof bad / sizeof bad[0]; s++) {
        h_case("kv_splits = %lld refused", (long long)bad[s]);
        p.a.kv_splits = bad[s];
        CHECK(fa_forward_check(g_ctx, &p.a) == FA_ERR_INVALID_ARGUMENT, "fa_forward_check accepted it");
        const fa_status st = iprob_run(g_ctx, &p, FA_ALGO_FLASH, 2, 0);
        CHECK(st == FA_ERR_INVALID_ARGUMENT && strstr(fa_context_error(g_ctx), "kv_splits"), "status %d: %s", (int)st,
              fa_context_error(g_ctx));
        const unsigned char *ob = p.a.o.data;
        int untouched = 1;
        for (size_t e = 0; e < p.o_bytes; e++) untouched &= ob[e] == SENTINEL;
        for (int t = 0; t < p.ncache; t++) untouched &= memcmp(p.cache[t].data, p.snap[t], p.cbytes[t]) == 0;
        CHECK(untouched, "a refused kv_splits wrote o or the cache");
    }
    p.a.kv_splits = 0;
    fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, 0);
    free(o1), free(l1);
    iprob_free(&p);
}

/* ------------------------------------------------------------------- merge */

/* A (B, S, H, Dv) tensor; layout 0 BSND, 1 BNSD, 2 BSND with padded rows (pad elements). */
static fa_tensor o_view(fa_dtype dt, int64_t B, int64_t S, int64_t H, int64_t Dv, int layout, int64_t pad,
                        size_t *bytes) {
    fa_tensor t;
    if (layout == 1) {
        t = h_alloc(dt, B, H, S, Dv);
        const int64_t st[4] = {t.stride[0], t.stride[2], t.stride[1], t.stride[3]};
        t.shape[1] = S, t.shape[2] = H;
        memcpy(t.stride, st, sizeof st);
    } else if (layout == 2) {
        t = h_alloc(dt, B, S, H, Dv + pad);
        t.shape[3] = Dv;
    } else {
        t = h_alloc(dt, B, S, H, Dv);
    }
    *bytes = (size_t)(B * S * H * (Dv + (layout == 2 ? pad : 0))) * h_dtype_bytes(dt);
    return t;
}

/* The merge formula in double. */
static void merge_oracle(int n, const fa_tensor *op, const fa_tensor *lp, int64_t B, int64_t S, int64_t H, int64_t Dv,
                         double *o, double *lse) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++) {
                double m = -INFINITY;
                for (int i = 0; i < n; i++) m = fmax(m, h_get(&lp[i], b, h, s, 0));
                double *orow = o + ((b * S + s) * H + h) * Dv;
                double *l = lse + (b * H + h) * S + s;
                if (m == -INFINITY) {
                    for (int64_t e = 0; e < Dv; e++) orow[e] = 0.0;
                    *l = -INFINITY;
                    continue;
                }
                double sum = 0.0;
                for (int i = 0; i < n; i++) sum += exp(h_get(&lp[i], b, h, s, 0) - m);
                *l = m + log(sum);
                for (int64_t e = 0; e < Dv; e++) {
                    double acc = 0.0;
                    for (int i = 0; i < n; i++) {
                        const double li = h_get(&lp[i], b, h, s, 0);
                        if (li != -INFINITY) acc += exp(li - *l) * h_get(&op[i], b, s, h, e);
                    }
                    orow[e] = acc;
                }
            }
}

/* Compares o (B, S, H, Dv) and lse (B, H, S, 1) with expected doubles. */
static void compare_merged(const fa_tensor *o, const fa_tensor *lse, const double *want, const double *lwant,
                           double otol_rel, double otol_abs, const char *what) {
    const int64_t B = o->shape[0], S = o->shape[1], H = o->shape[2], Dv = o->shape[3];
    double err = 0.0, lerr = 0.0, omax = 0.0;
    int64_t infs = 0, at = -1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++) {
                for (int64_t e = 0; e < Dv; e++) {
                    const int64_t idx = ((b * S + s) * H + h) * Dv + e;
                    double d = fabs(h_get(o, b, s, h, e) - want[idx]);
                    if (isnan(d)) d = INFINITY;
                    if (d > err) err = d, at = idx;
                    omax = fmax(omax, fabs(want[idx]));
                }
                if (lse && lse->data) {
                    const double g = h_get(lse, b, h, s, 0), w = lwant[(b * H + h) * S + s];
                    const int gi = isinf(g) && g < 0, wi = isinf(w) && w < 0;
                    if (gi || wi) {
                        infs += gi != wi;
                        continue;
                    }
                    double d = fabs(g - w) / fmax(1.0, fabs(w));
                    if (isnan(d)) d = INFINITY;
                    lerr = fmax(lerr, d);
                }
            }
    const double tol = otol_rel * fmax(1.0, omax) + otol_abs;
    CHECK(err <= tol, "%s: o max err %.3g > tol %.3g at flat %lld", what, err, tol, (long long)at);
    CHECK(lerr <= 32 * FLT_EPSILON && infs == 0, "%s: lse max rel err %.3g, %lld -inf mismatches", what, lerr,
          (long long)infs);
}

static void test_merge_formula(uint64_t seed) {
    h_rng r;
    h_rng_seed(&r, seed + 1200);
    const int64_t B = 2, S = 3, H = 4, Dv = 40;
    static const int ns[] = {1, 2, 3, 5};
    for (int v = 0; v < 16; v++) {
        const int n = ns[v % 4];
        fa_tensor op[5], lp[5];
        for (int i = 0; i < n; i++) {
            size_t nb;
            op[i] = o_view(QDT[(v + i) % 3], B, S, H, Dv, (v + i) % 3, 3, &nb);
            lp[i] = h_alloc(FA_DTYPE_F32, B, H, S, 1);
            h_fill_normal(&op[i], &r, 1.0);
        }
        /* lse: ordinary, far apart, huge (exp would overflow), and -inf sides */
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t s = 0; s < S; s++) {
                    const int64_t row = (b * H + h) * S + s;
                    const double base = row % 4 == 1 ? 900.0 : row % 4 == 2 ? -700.0 : 0.0;
                    for (int i = 0; i < n; i++) {
                        double l = base + h_rng_range(&r, -6.0, 6.0);
                        if (row % 5 == 3 && i == 0) l = -INFINITY;                  /* one empty side */
                        if (row % 7 == 6) l = -INFINITY;                            /* all sides empty */
                        if (row % 11 == 4 && i == n - 1) l = base + 80.0;            /* one side dominates */
                        h_set(&lp[i], b, h, s, 0, l);
                        if (l == -INFINITY) /* garbage o under an empty side: weight must be exactly 0 */
                            for (int64_t e = 0; e < Dv; e++) h_set(&op[i], b, s, h, e, 1000.0 + (double)e);
                    }
                }
        const fa_dtype odt = QDT[(v / 4) % 3];
        size_t o_nb;
        fa_tensor o = o_view(odt, B, S, H, Dv, v % 3, 2, &o_nb), lse = h_alloc(FA_DTYPE_F32, B, H, S, 1);
        memset(o.data, SENTINEL, o_nb);
        memset(lse.data, SENTINEL, t_nbytes(&lse));
        double *want = malloc(sizeof(double) * (size_t)(B * S * H * Dv)), *lwant = malloc(sizeof(double) * (size_t)(B * S * H));
        merge_oracle(n, op, lp, B, S, H, Dv, want, lwant);
        h_case("fa_merge_states formula: n=%d out=%s layout=%d (lse offsets 0, 900, -700; -inf sides)", n,
               h_dtype_str(odt), v % 3);
        const int with_lse = v % 5 != 4;
        fa_status st = fa_merge_states(g_ctx, n, op, lp, &o, with_lse ? &lse : NULL);
        if (CHECK(st == FA_OK, "status %d (%s): %s", (int)st, fa_status_string(st), fa_context_error(g_ctx))) {
            /* parts are rounded already: the merge adds f32 arithmetic and one output rounding */
            compare_merged(&o, with_lse ? &lse : NULL, want, lwant, h_eps(odt) + 16 * FLT_EPSILON, 0.0, "merge");
            if (v % 3 == 2) { /* padding between rows untouched */
                int ok = 1;
                for (int64_t row = 0; row < B * S * H; row++)
                    ok &= all_bytes((char *)o.data + (row * (Dv + 2) + Dv) * (int64_t)h_dtype_bytes(odt),
                                    2 * h_dtype_bytes(odt), SENTINEL);
                CHECK(ok, "merge wrote into the padding between rows of a strided o");
            }
            if (!with_lse) CHECK(all_bytes(lse.data, t_nbytes(&lse), SENTINEL), "lse written though not given");
            if (n == 1 && odt == op[0].dtype) { /* one part: an exact copy */
                int same = 1;
                for (int64_t b = 0; b < B; b++)
                    for (int64_t s = 0; s < S; s++)
                        for (int64_t h = 0; h < H; h++) {
                            if (h_get(&lp[0], b, h, s, 0) == -INFINITY) continue;
                            for (int64_t e = 0; e < Dv; e++) same &= h_bits(&o, b, s, h, e) == h_bits(&op[0], b, s, h, e);
                            if (with_lse) same &= h_bits(&lse, b, h, s, 0) == h_bits(&lp[0], b, h, s, 0);
                        }
                CHECK(same, "n = 1 with the part's dtype is not a bitwise copy of the part");
            }
        }
        /* in place: o and lse are part 0's tensors */
        {
            fa_tensor io = op[0], il = lp[0];
            h_case("fa_merge_states in place (o = part 0): n=%d part0=%s", n, h_dtype_str(io.dtype));
            st = fa_merge_states(g_ctx, n, op, lp, &io, &il);
            if (CHECK(st == FA_OK, "status %d: %s", (int)st, fa_context_error(g_ctx)))
                compare_merged(&io, &il, want, lwant, h_eps(io.dtype) + 16 * FLT_EPSILON, 0.0, "merge in place");
        }
        free(want), free(lwant), free(o.data), free(lse.data);
        for (int i = 0; i < n; i++) free(op[i].data), free(lp[i].data);
    }
}

/* A mask view of keys [j0, j0 + len) of a (B, Hq, Sq, Sk) mask. */
static fa_tensor key_slice(const fa_tensor *t, int axis, int64_t j0, int64_t len) {
    fa_tensor v = *t;
    v.data = (char *)t->data + j0 * t->stride[axis] * (int64_t)h_dtype_bytes(t->dtype);
    v.shape[axis] = len;
    return v;
}

static void test_merge_attention(uint64_t seed) {
    h_rng r;
    h_rng_seed(&r, seed + 1300);
    const h_dims d = {2, 6, 41, 4, 2, 64, 48};
    for (int v = 0; v < 6; v++) {
        const fa_dtype dt = QDT[v % 3];
        h_problem p;
        h_problem_alloc(&p, d, dt, FA_DTYPE_F32);
        h_fill_normal(&p.args.q, &r, 1.0), h_fill_normal(&p.args.k, &r, 1.0), h_fill_normal(&p.args.v, &r, 1.0);
        p.args.softcap = v == 1 ? 8.0f : 0.0f;
        /* a mask: row 1 sees no key of the second part, row 4 sees no key at all */
        fa_tensor mask = h_alloc(FA_DTYPE_BOOL, d.B, d.Hq, d.Sq, d.Sk);
        const int64_t cut1 = 17, cut2 = v < 3 ? d.Sk : 30; /* two parts, or three */
        for (int64_t e = 0; e < h_numel(&mask); e++) {
            const int64_t j = e % d.Sk, i = (e / d.Sk) % d.Sq;
            unsigned char keep = h_rng_uniform(&r) < 0.7;
            if (i == 1 && j >= cut1 && j < cut2) keep = 0;
            if (i == 4) keep = 0;
            ((unsigned char *)mask.data)[e] = keep;
        }
        p.args.mask = mask;
        const int nparts = cut2 < d.Sk ? 3 : 2;
        const int64_t j0s[3] = {0, cut1, cut2}, j1s[3] = {cut1, cut2, d.Sk};

        /* the full attention, fp64 reference */
        fa_forward_args fa = p.args;
        fa.o = h_alloc(FA_DTYPE_F32, d.B, d.Sq, d.Hq, d.Dv), fa.lse = h_alloc(FA_DTYPE_F32, d.B, d.Hq, d.Sq, 1);
        fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, 0);
        h_set_tiles(g_ctx, 0, 0);
        CHECK(h_run(g_ctx, FA_ALGO_REFERENCE, 1, &fa) == FA_OK, "full reference failed");
        const int64_t no = h_numel(&fa.o), nl = h_numel(&fa.lse);
        double *want = malloc(sizeof(double) * (size_t)no), *lwant = malloc(sizeof(double) * (size_t)nl);
        for (int64_t e = 0; e < no; e++) want[e] = h_get(&fa.o, 0, 0, 0, e);
        for (int64_t e = 0; e < nl; e++) lwant[e] = h_get(&fa.lse, 0, 0, 0, e);

        for (int algo = 0; algo < 2; algo++) {
            /* partials over key subsets: reference (f32 o) or flash (o in q's dtype) */
            const fa_algo al = algo ? FA_ALGO_FLASH : FA_ALGO_REFERENCE;
            fa_tensor op[3], lp[3];
            double part_err = 0.0, part_lerr = 0.0;
            for (int i = 0; i < nparts; i++) {
                fa_forward_args pa = p.args;
                const int64_t len = j1s[i] - j0s[i];
                pa.k = key_slice(&p.args.k, 1, j0s[i], len);
                pa.v = key_slice(&p.args.v, 1, j0s[i], len);
                pa.mask = key_slice(&mask, 3, j0s[i], len);
                op[i] = h_alloc(algo ? dt : FA_DTYPE_F32, d.B, d.Sq, d.Hq, d.Dv);
                lp[i] = h_alloc(FA_DTYPE_F32, d.B, d.Hq, d.Sq, 1);
                pa.o = op[i], pa.lse = lp[i];
                h_case("merge of attention over key parts: part %d [%lld, %lld) algo=%s dtype=%s", i,
                       (long long)j0s[i], (long long)j1s[i], h_algo_str(al), h_dtype_str(dt));
                CHECK(h_run(g_ctx, al, 2, &pa) == FA_OK, "partial call failed: %s", fa_context_error(g_ctx));
                if (algo) { /* how far the flash partial is from the fp64 partial */
                    fa_forward_args ra = pa;
                    ra.o = h_alloc(FA_DTYPE_F32, d.B, d.Sq, d.Hq, d.Dv), ra.lse = h_alloc(FA_DTYPE_F32, d.B, d.Hq, d.Sq, 1);
                    h_run(g_ctx, FA_ALGO_REFERENCE, 1, &ra);
                    for (int64_t e = 0; e < no; e++) part_err = fmax(part_err, fabs(h_get(&op[i], 0, 0, 0, e) - h_get(&ra.o, 0, 0, 0, e)));
                    for (int64_t e = 0; e < nl; e++) {
                        const double a = h_get(&lp[i], 0, 0, 0, e), b = h_get(&ra.lse, 0, 0, 0, e);
                        if (isfinite(a) && isfinite(b)) part_lerr = fmax(part_lerr, fabs(a - b));
                    }
                    free(ra.o.data), free(ra.lse.data);
                }
            }
            h_case("merge of attention over %d key parts (algo=%s, q %s): equals attention over all keys", nparts,
                   h_algo_str(al), h_dtype_str(dt));
            fa_tensor o = h_alloc(algo ? dt : FA_DTYPE_F32, d.B, d.Sq, d.Hq, d.Dv), lse = h_alloc(FA_DTYPE_F32, d.B, d.Hq, d.Sq, 1);
            const fa_status st = fa_merge_states(g_ctx, nparts, op, lp, &o, &lse);
            if (CHECK(st == FA_OK, "status %d: %s", (int)st, fa_context_error(g_ctx))) {
                /* a convex combination: the parts' error, their lse error through the weights, f32
                 * arithmetic and the output rounding */
                double omax = 0.0;
                for (int64_t e = 0; e < no; e++) omax = fmax(omax, fabs(want[e]));
                const double abs_tol = part_err + 2.0 * part_lerr * fmax(1.0, omax) * 4.0;
                compare_merged(&o, &lse, want, lwant, h_eps(o.dtype) + 16 * FLT_EPSILON, abs_tol,
                               "merged parts vs full attention");
                /* row 4 (no key anywhere) is o = 0, lse = -inf exactly */
                int ok = 1;
                for (int64_t b = 0; b < d.B; b++)
                    for (int64_t h = 0; h < d.Hq; h++) {
                        ok &= isinf(h_get(&lse, b, h, 4, 0)) && h_get(&lse, b, h, 4, 0) < 0;
                        for (int64_t e = 0; e < d.Dv; e++) ok &= h_get(&o, b, 4, h, e) == 0.0;
                    }
                CHECK(ok, "a row empty on every side is not o = 0, lse = -inf");
            }
            free(o.data), free(lse.data);
            for (int i = 0; i < nparts; i++) free(op[i].data), free(lp[i].data);
        }
        free(want), free(lwant), free(fa.o.data), free(fa.lse.data), free(mask.data);
        p.args.mask.data = NULL;
        h_problem_free(&p);
    }
}

static void test_merge_errors(void) {
    const int64_t B = 1, S = 2, H = 2, Dv = 8;
    fa_tensor op[2] = {h_alloc(FA_DTYPE_F32, B, S, H, Dv), h_alloc(FA_DTYPE_F16, B, S, H, Dv)};
    fa_tensor lp[2] = {h_alloc(FA_DTYPE_F32, B, H, S, 1), h_alloc(FA_DTYPE_F32, B, H, S, 1)};
    fa_tensor o = h_alloc(FA_DTYPE_F32, B, S, H, Dv), lse = h_alloc(FA_DTYPE_F32, B, H, S, 1);
    h_case("fa_merge_states valid base call");
    CHECK(fa_merge_states(g_ctx, 2, op, lp, &o, &lse) == FA_OK, "base call failed: %s", fa_context_error(g_ctx));
    struct {
        const char *name;
        fa_status want;
    } cases[] = {
        {"n = 0", FA_ERR_INVALID_ARGUMENT},          {"n = -1", FA_ERR_INVALID_ARGUMENT},
        {"ctx NULL", FA_ERR_NULL_CONTEXT},           {"o_parts NULL", FA_ERR_NULL_POINTER},
        {"lse_parts NULL", FA_ERR_NULL_POINTER},     {"o NULL", FA_ERR_NULL_POINTER},
        {"o.data NULL", FA_ERR_NULL_POINTER},        {"o_parts[1].data NULL", FA_ERR_NULL_POINTER},
        {"lse_parts[1].data NULL", FA_ERR_NULL_POINTER}, {"part 1 Dv + 1", FA_ERR_SHAPE_MISMATCH},
        {"part 1 S - 1", FA_ERR_SHAPE_MISMATCH},     {"lse part 1 H + 1", FA_ERR_SHAPE_MISMATCH},
        {"lse part 0 last dim 2", FA_ERR_SHAPE_MISMATCH}, {"lse out S + 1", FA_ERR_SHAPE_MISMATCH},
        {"lse part 1 f16", FA_ERR_DTYPE},            {"lse out f16", FA_ERR_DTYPE},
        {"o bool", FA_ERR_DTYPE},                    {"o i8", FA_ERR_DTYPE},
        {"part 0 i8", FA_ERR_DTYPE},                 {"o B 0", FA_ERR_SHAPE_MISMATCH},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        fa_tensor p2[2] = {op[0], op[1]}, l2[2] = {lp[0], lp[1]}, o2 = o, lse2 = lse;
        int n = 2;
        fa_context *ctx = g_ctx;
        const fa_tensor *pp = p2, *lpp = l2;
        fa_tensor *po = &o2;
        switch (k) {
        case 0: n = 0; break;
        case 1: n = -1; break;
        case 2: ctx = NULL; break;
        case 3: pp = NULL; break;
        case 4: lpp = NULL; break;
        case 5: po = NULL; break;
        case 6: o2.data = NULL; break;
        case 7: p2[1].data = NULL; break;
        case 8: l2[1].data = NULL; break;
        case 9: p2[1].shape[3] += 1; break;
        case 10: p2[1].shape[1] -= 1; break;
        case 11: l2[1].shape[1] += 1; break;
        case 12: l2[0].shape[3] = 2; break;
        case 13: lse2.shape[2] += 1; break;
        case 14: l2[1].dtype = FA_DTYPE_F16; break;
        case 15: lse2.dtype = FA_DTYPE_F16; break;
        case 16: o2.dtype = FA_DTYPE_BOOL; break;
        case 17: o2.dtype = FA_DTYPE_I8; break;
        case 18: p2[0].dtype = FA_DTYPE_I8; break;
        case 19: o2.shape[0] = 0; break;
        }
        h_case("fa_merge_states misuse: %s", cases[k].name);
        memset(o.data, SENTINEL, t_nbytes(&o));
        memset(lse.data, SENTINEL, t_nbytes(&lse));
        const fa_status st = fa_merge_states(ctx, n, pp, lpp, po, &lse2);
        CHECK(st == cases[k].want, "status %d (%s), want %d (%s)", (int)st, fa_status_string(st), (int)cases[k].want,
              fa_status_string(cases[k].want));
        CHECK(all_bytes(o.data, t_nbytes(&o), SENTINEL) && all_bytes(lse.data, t_nbytes(&lse), SENTINEL),
              "a failing merge wrote o or lse");
        if (ctx) CHECK(fa_context_error(ctx)[0] != '\0', "fa_context_error empty after a failed merge");
    }
    for (int i = 0; i < 2; i++) free(op[i].data), free(lp[i].data);
    free(o.data), free(lse.data);
}

/* ------------------------------------------------------------------- errors */

/* The base for misuse: 3 sequences appending 2 rows each, the last one is where things break. */
static void error_base(icase *c, int mode, fa_dtype cdt, int packed) {
    icase_init(c);
    c->mode = mode;
    c->varlen_q = packed;
    c->B = 3, c->Hq = 4, c->Hk = 2, c->D = 16, c->Dv = 16;
    c->cdt = cdt;
    c->append = 1;
    c->page_size = 4;
    static const int32_t old[] = {5, 9, 6};
    for (int b = 0; b < 3; b++) c->sq[b] = 2, c->snew[b] = 2, c->sold[b] = old[b];
    c->causal = FA_CAUSAL_BOTTOM_RIGHT;
}

/* The call must fail with `want`, leave o, lse and the cache byte-identical. */
static void expect_fail(iprob *p, const fa_forward_args *a, const char *name, fa_status want) {
    h_case("misuse: %s (%s)", name, p->desc);
    for (int t = 0; t < p->ncache; t++) memcpy(p->cache[t].data, p->snap[t], p->cbytes[t]);
    memset(p->a.o.data, SENTINEL, p->o_bytes);
    memset(p->lse_t.data, SENTINEL, p->lse_bytes);
    fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, 0);
    h_set_tiles(g_ctx, 0, 0);
    const fa_status st = h_run(g_ctx, FA_ALGO_AUTO, 2, a);
    CHECK(st == want, "status %d (%s), want %d (%s); error text: \"%s\"", (int)st, fa_status_string(st), (int)want,
          fa_status_string(want), fa_context_error(g_ctx));
    CHECK(all_bytes(p->a.o.data, p->o_bytes, SENTINEL) && all_bytes(p->lse_t.data, p->lse_bytes, SENTINEL),
          "a failing call wrote o or lse");
    int same = 1;
    for (int t = 0; t < p->ncache; t++) same &= memcmp(p->cache[t].data, p->snap[t], p->cbytes[t]) == 0;
    CHECK(same, "a failing call modified the cache");
    CHECK(st == FA_OK || fa_context_error(g_ctx)[0] != '\0', "fa_context_error is empty after a failure");
}

static void expect_ok(iprob *p, const char *name) {
    h_case("valid base for misuse: %s (%s)", name, p->desc);
    const fa_status st = iprob_run(g_ctx, p, FA_ALGO_AUTO, 2, 0);
    if (CHECK(st == FA_OK, "the valid base call fails: status %d (%s): %s", (int)st, fa_status_string(st),
              fa_context_error(g_ctx))) {
        int64_t algo = -1;
        CHECK(fa_context_get(g_ctx, FA_PARAM_LAST_ALGO, &algo) == FA_OK && algo == FA_ALGO_FLASH,
              "LAST_ALGO after an AUTO inference call is %lld, want FLASH", (long long)algo);
        check_cache(p);
        check_numbers(g_ctx, p);
    }
}

static void test_errors(uint64_t seed) {
    h_rng r;
    icase c;
    iprob p;

    /* ---- contiguous, f16 cache, not packed */
    error_base(&c, MODE_CONTIG, FA_DTYPE_F16, 0);
    c.batch_idx = 1;
    h_rng_seed(&r, seed + 1500);
    iprob_build(&p, &c, &r);
    expect_ok(&p, "contiguous");
    {
        fa_forward_args a = p.a;
        fa_kv_cache kc = p.kc;
        int32_t sl[MAXS], bi[MAXS];
        memcpy(sl, p.seqlens, sizeof sl), memcpy(bi, p.bidx, sizeof bi);
        a.kv_cache = &kc;
        kc.seqlens = sl, kc.batch_idx = bi;
        const int64_t smax = p.cache[0].shape[1];

        sl[2] = (int32_t)(smax - 1); /* + 2 new rows */
        expect_fail(&p, &a, "seqlens[2] + S_new = S_max + 1", FA_ERR_OUT_OF_RANGE);
        sl[2] = (int32_t)(smax - 2);
        h_case("seqlens[2] + S_new = S_max exactly is fine");
        {
            const fa_status st = h_run(g_ctx, FA_ALGO_AUTO, 2, &a);
            CHECK(st == FA_OK, "a cache filled to S_max exactly is refused: status %d: %s", (int)st,
                  fa_context_error(g_ctx));
            for (int t = 0; t < p.ncache; t++) memcpy(p.cache[t].data, p.snap[t], p.cbytes[t]);
        }
        memcpy(sl, p.seqlens, sizeof sl);
        sl[2] = -1;
        expect_fail(&p, &a, "seqlens[2] = -1", FA_ERR_OUT_OF_RANGE);
        sl[2] = INT32_MIN;
        expect_fail(&p, &a, "seqlens[2] = INT32_MIN", FA_ERR_OUT_OF_RANGE);
        sl[2] = INT32_MAX;
        expect_fail(&p, &a, "seqlens[2] = INT32_MAX", FA_ERR_OUT_OF_RANGE);
        memcpy(sl, p.seqlens, sizeof sl);

        bi[2] = (int32_t)p.cache[0].shape[0];
        expect_fail(&p, &a, "batch_idx[2] = B_cache", FA_ERR_OUT_OF_RANGE);
        bi[2] = -1;
        expect_fail(&p, &a, "batch_idx[2] = -1", FA_ERR_OUT_OF_RANGE);
        bi[2] = bi[0];
        expect_fail(&p, &a, "batch_idx[2] = batch_idx[0] with appends (two rows into one slot)", FA_ERR_INVALID_ARGUMENT);
        memcpy(bi, p.bidx, sizeof bi);

        kc.seqlens = NULL;
        expect_fail(&p, &a, "seqlens NULL", FA_ERR_NULL_POINTER);
        kc.seqlens = sl;
        kc.k.data = NULL;
        expect_fail(&p, &a, "cache k.data NULL", FA_ERR_NULL_POINTER);
        kc = p.kc, kc.seqlens = sl, kc.batch_idx = bi;
        kc.v.dtype = FA_DTYPE_BF16;
        expect_fail(&p, &a, "cache v dtype != k dtype", FA_ERR_DTYPE);
        kc.v.dtype = kc.k.dtype = FA_DTYPE_BOOL;
        expect_fail(&p, &a, "cache dtype bool", FA_ERR_DTYPE);
        kc = p.kc, kc.seqlens = sl, kc.batch_idx = bi;
        kc.k.shape[3] = kc.v.shape[3] = 8; /* D, Dv 8 vs q's 16 */
        expect_fail(&p, &a, "cache D != q D", FA_ERR_SHAPE_MISMATCH);
        kc = p.kc, kc.seqlens = sl, kc.batch_idx = bi;
        kc.v.shape[3] = 8;
        expect_fail(&p, &a, "cache Dv != o Dv", FA_ERR_SHAPE_MISMATCH);
        kc = p.kc, kc.seqlens = sl, kc.batch_idx = bi;
        kc.k.shape[2] = kc.v.shape[2] = 1; /* Hk 1 vs the new rows' 2 */
        expect_fail(&p, &a, "cache Hk != new rows' Hk", FA_ERR_SHAPE_MISMATCH);
        kc = p.kc, kc.seqlens = sl, kc.batch_idx = bi;
        kc.v.shape[1] -= 1;
        expect_fail(&p, &a, "cache v S_max != k S_max", FA_ERR_SHAPE_MISMATCH);
        kc = p.kc, kc.seqlens = sl, kc.batch_idx = bi;
        kc.block_table = bi, kc.max_pages = 1; /* batch_idx with a block table */
        expect_fail(&p, &a, "batch_idx with a paged cache", FA_ERR_INVALID_ARGUMENT);
        kc = p.kc, kc.seqlens = sl, kc.batch_idx = bi;

        fa_tensor bias = h_alloc(FA_DTYPE_F32, 1, 1, 1, 1);
        fa_tensor mask = h_alloc(FA_DTYPE_BOOL, 1, 1, 1, 1);
        a.bias = bias;
        expect_fail(&p, &a, "bias with a cache", FA_ERR_UNSUPPORTED);
        a.bias.data = NULL, a.mask = mask;
        expect_fail(&p, &a, "mask with a cache", FA_ERR_UNSUPPORTED);
        a.mask.data = NULL;
        free(bias.data), free(mask.data);

        fa_tensor v_new = a.v;
        a.v.data = NULL;
        expect_fail(&p, &a, "new k without new v", FA_ERR_NULL_POINTER);
        a.v = v_new;
        a.k.shape[2] = 1;
        expect_fail(&p, &a, "new k Hk 1 vs cache 2", FA_ERR_SHAPE_MISMATCH);
        a.k.shape[2] = 2, a.k.shape[0] = 2;
        expect_fail(&p, &a, "new k batch 2 vs q 3", FA_ERR_SHAPE_MISMATCH);
        a.k.shape[0] = 3, a.v.shape[1] = 1;
        expect_fail(&p, &a, "new v rows 1 vs new k rows 2", FA_ERR_SHAPE_MISMATCH);
        a = p.a, a.kv_cache = &kc;
        a.q.shape[2] = a.o.shape[2] = a.lse.shape[1] = 3;
        expect_fail(&p, &a, "Hq 3 vs cache Hk 2", FA_ERR_HEAD_RATIO);
        a = p.a, a.kv_cache = &kc;
        a.o.dtype = FA_DTYPE_BF16;
        expect_fail(&p, &a, "o bf16 with q f32", FA_ERR_DTYPE);
        a = p.a, a.kv_cache = &kc;
        a.lse.shape[2] += 1;
        expect_fail(&p, &a, "lse Sq + 1", FA_ERR_SHAPE_MISMATCH);
        a = p.a, a.kv_cache = &kc;

        /* inference forms run on flash only */
        h_case("misuse: STANDARD and REFERENCE on a cache call");
        static const fa_algo others[] = {FA_ALGO_STANDARD, FA_ALGO_REFERENCE};
        for (int k = 0; k < 2; k++) {
            for (int t = 0; t < p.ncache; t++) memcpy(p.cache[t].data, p.snap[t], p.cbytes[t]);
            memset(p.a.o.data, SENTINEL, p.o_bytes), memset(p.lse_t.data, SENTINEL, p.lse_bytes);
            const fa_status st = h_run(g_ctx, others[k], 2, &a);
            CHECK(st == FA_ERR_UNSUPPORTED, "algo %s: status %d (%s), want UNSUPPORTED", h_algo_str(others[k]), (int)st,
                  fa_status_string(st));
            CHECK(all_bytes(p.a.o.data, p.o_bytes, SENTINEL) && all_bytes(p.lse_t.data, p.lse_bytes, SENTINEL),
                  "refused call wrote o/lse");
            int same = 1;
            for (int t = 0; t < p.ncache; t++) same &= memcmp(p.cache[t].data, p.snap[t], p.cbytes[t]) == 0;
            CHECK(same, "refused call changed the cache");
        }
    }
    iprob_free(&p);

    /* ---- contiguous without batch_idx: more sequences than cache rows; duplicate batch_idx
     * without an append is fine */
    error_base(&c, MODE_CONTIG, FA_DTYPE_F32, 0);
    h_rng_seed(&r, seed + 1501);
    iprob_build(&p, &c, &r);
    expect_ok(&p, "contiguous, no batch_idx");
    {
        fa_forward_args a = p.a;
        fa_kv_cache kc = p.kc;
        a.kv_cache = &kc;
        kc.k.shape[0] = kc.v.shape[0] = 2;
        expect_fail(&p, &a, "3 sequences, 2 cache rows, no batch_idx", FA_ERR_SHAPE_MISMATCH);
    }
    iprob_free(&p);
    {
        error_base(&c, MODE_CONTIG, FA_DTYPE_F32, 0);
        c.append = 0;
        for (int b = 0; b < 3; b++) c.snew[b] = 0;
        c.batch_idx = 1;
        h_rng_seed(&r, seed + 1502);
        iprob_build(&p, &c, &r);
        p.bidx[2] = p.bidx[0]; /* two sequences read one cache row: fine without appends */
        p.c.sold[2] = p.c.sold[0];
        p.seqlens[2] = p.seqlens[0];
        h_case("duplicate batch_idx without appends is accepted");
        const fa_status st = iprob_run(g_ctx, &p, FA_ALGO_AUTO, 2, 0);
        if (CHECK(st == FA_OK, "status %d (%s): %s", (int)st, fa_status_string(st), fa_context_error(g_ctx))) {
            check_cache(&p);
            check_numbers(g_ctx, &p);
        }
        iprob_free(&p);
    }

    /* ---- paged, int8 cache, packed q */
    error_base(&c, MODE_PAGED, FA_DTYPE_I8, 1);
    h_rng_seed(&r, seed + 1503);
    iprob_build(&p, &c, &r);
    expect_ok(&p, "paged int8 packed");
    {
        fa_forward_args a = p.a;
        fa_kv_cache kc = p.kc;
        const int64_t mp = p.kc.max_pages;
        int32_t *bt = malloc(sizeof(int32_t) * (size_t)(3 * mp));
        int32_t sl[MAXS], cuq[MAXS + 1], cuk[MAXS + 1];
        memcpy(bt, p.bt, sizeof(int32_t) * (size_t)(3 * mp));
        memcpy(sl, p.seqlens, sizeof sl), memcpy(cuq, p.cu_q, sizeof cuq), memcpy(cuk, p.cu_k, sizeof cuk);
        a.kv_cache = &kc;
        kc.block_table = bt, kc.seqlens = sl;
        a.cu_seqlens_q = cuq, a.cu_seqlens_k = cuk;
        const int64_t used2 = (c.sold[2] + c.snew[2] + c.page_size - 1) / c.page_size;

        sl[2] = (int32_t)(mp * c.page_size - 1);
        expect_fail(&p, &a, "seqlens[2] + S_new > max_pages * page_size", FA_ERR_OUT_OF_RANGE);
        memcpy(sl, p.seqlens, sizeof sl);
        bt[2 * mp + used2 - 1] = -1;
        expect_fail(&p, &a, "a used page id -1", FA_ERR_OUT_OF_RANGE);
        bt[2 * mp + used2 - 1] = (int32_t)p.num_pages;
        expect_fail(&p, &a, "a used page id = num_pages", FA_ERR_OUT_OF_RANGE);
        bt[2 * mp] = INT32_MAX;
        bt[2 * mp + used2 - 1] = p.bt[2 * mp + used2 - 1];
        expect_fail(&p, &a, "page id INT32_MAX in the first page", FA_ERR_OUT_OF_RANGE);
        memcpy(bt, p.bt, sizeof(int32_t) * (size_t)(3 * mp));
        /* sequence 2's last page is sequence 0's: their new rows land in one slot (row 5 % 4 = 1 of the
         * second page for sequence 0 and row 6 % 4 = 2 for sequence 2; make the rows match) */
        {
            int32_t sl2[MAXS];
            memcpy(sl2, p.seqlens, sizeof sl2);
            sl2[2] = sl2[0]; /* both append at rows 5, 6: page 1, rows 1, 2 */
            kc.seqlens = sl2;
            bt[2 * mp + 1] = bt[0 * mp + 1];
            expect_fail(&p, &a, "a shared page written twice by two appends", FA_ERR_INVALID_ARGUMENT);
            kc.seqlens = sl;
            memcpy(bt, p.bt, sizeof(int32_t) * (size_t)(3 * mp));
        }
        kc.k_scale.data = NULL;
        expect_fail(&p, &a, "int8 cache without k_scale", FA_ERR_NULL_POINTER);
        kc.k_scale = p.kc.k_scale, kc.v_scale.data = NULL;
        expect_fail(&p, &a, "int8 cache without v_scale", FA_ERR_NULL_POINTER);
        kc.v_scale = p.kc.v_scale, kc.k_scale.shape[3] = 2;
        expect_fail(&p, &a, "k_scale last dim 2", FA_ERR_SHAPE_MISMATCH);
        kc.k_scale = p.kc.k_scale, kc.v_scale.shape[2] = 1;
        expect_fail(&p, &a, "v_scale Hk 1 (cache Hk 2)", FA_ERR_SHAPE_MISMATCH);
        kc.v_scale = p.kc.v_scale, kc.k_scale.shape[1] += 1;
        expect_fail(&p, &a, "k_scale page_size + 1", FA_ERR_SHAPE_MISMATCH);
        kc.k_scale = p.kc.k_scale, kc.k_scale.dtype = FA_DTYPE_F16;
        expect_fail(&p, &a, "k_scale f16", FA_ERR_DTYPE);
        kc.k_scale = p.kc.k_scale;
        kc.max_pages = 0;
        expect_fail(&p, &a, "max_pages 0", FA_ERR_INVALID_DIM);
        kc.max_pages = mp;

        cuq[2] = cuq[1] - 1;
        expect_fail(&p, &a, "cu_seqlens_q not non-decreasing", FA_ERR_OUT_OF_RANGE);
        memcpy(cuq, p.cu_q, sizeof cuq);
        cuq[3] = (int32_t)p.total_q + 1;
        expect_fail(&p, &a, "cu_seqlens_q[B] past the packed rows", FA_ERR_OUT_OF_RANGE);
        memcpy(cuq, p.cu_q, sizeof cuq);
        cuq[0] = -1;
        expect_fail(&p, &a, "cu_seqlens_q[0] = -1", FA_ERR_OUT_OF_RANGE);
        memcpy(cuq, p.cu_q, sizeof cuq);
        cuk[1] = cuk[2] + 1;
        expect_fail(&p, &a, "cu_seqlens_k not non-decreasing", FA_ERR_OUT_OF_RANGE);
        memcpy(cuk, p.cu_k, sizeof cuk);
        cuk[3] = (int32_t)p.total_k + 1;
        expect_fail(&p, &a, "cu_seqlens_k[B] past the new rows", FA_ERR_OUT_OF_RANGE);
        memcpy(cuk, p.cu_k, sizeof cuk);
        a.cu_seqlens_k = NULL;
        expect_fail(&p, &a, "packed q + new rows without cu_seqlens_k", FA_ERR_NULL_POINTER);
        a.cu_seqlens_k = cuk;
        a.num_seqs = (int64_t)INT32_MAX + 1; /* num_seqs 0 is a legal no-op (tests/test_regress.c) */
        expect_fail(&p, &a, "num_seqs 2^31", FA_ERR_INVALID_DIM);
        a.num_seqs = -2;
        expect_fail(&p, &a, "num_seqs -2", FA_ERR_INVALID_DIM);
        a.num_seqs = 3;
        a.q.shape[0] = a.o.shape[0] = 2;
        expect_fail(&p, &a, "packed q with batch dim 2", FA_ERR_SHAPE_MISMATCH);
        a.q.shape[0] = a.o.shape[0] = 1;
        a.lse.shape[2] -= 1;
        expect_fail(&p, &a, "lse rows != packed q rows", FA_ERR_SHAPE_MISMATCH);
        a.lse = p.a.lse;
        a.k.data = a.v.data = NULL; /* no new rows, yet cu_seqlens_k */
        expect_fail(&p, &a, "cu_seqlens_k with a cache but no new rows", FA_ERR_INVALID_ARGUMENT);
        a = p.a, a.kv_cache = &kc, a.cu_seqlens_q = cuq, a.cu_seqlens_k = cuk;
        fa_tensor mask = h_alloc(FA_DTYPE_BOOL, 1, 1, 1, 1);
        a.mask = mask;
        expect_fail(&p, &a, "mask with paged cache + packed q", FA_ERR_UNSUPPORTED);
        a.mask.data = NULL;
        free(mask.data);
        free(bt);
    }
    iprob_free(&p);

    /* ---- varlen without a cache */
    {
        icase v;
        icase_init(&v);
        v.mode = MODE_VARLEN;
        v.B = 3, v.Hq = 4, v.Hk = 2, v.D = 16, v.Dv = 16;
        static const int32_t sq[] = {2, 0, 3}, sk[] = {4, 1, 2};
        memcpy(v.sq, sq, sizeof sq), memcpy(v.snew, sk, sizeof sk);
        h_rng_seed(&r, seed + 1504);
        iprob_build(&p, &v, &r);
        expect_ok(&p, "varlen");
        fa_forward_args a = p.a;
        int32_t cuq[MAXS + 1], cuk[MAXS + 1];
        memcpy(cuq, p.cu_q, sizeof cuq), memcpy(cuk, p.cu_k, sizeof cuk);
        a.cu_seqlens_q = cuq, a.cu_seqlens_k = cuk;
        cuk[1] = 5, cuk[2] = 4;
        expect_fail(&p, &a, "varlen cu_seqlens_k decreasing", FA_ERR_OUT_OF_RANGE);
        memcpy(cuk, p.cu_k, sizeof cuk);
        cuk[3] = (int32_t)p.total_k + 1;
        expect_fail(&p, &a, "varlen cu_seqlens_k[B] past k", FA_ERR_OUT_OF_RANGE);
        memcpy(cuk, p.cu_k, sizeof cuk);
        cuq[3] = (int32_t)p.total_q + 1;
        expect_fail(&p, &a, "varlen cu_seqlens_q[B] past q", FA_ERR_OUT_OF_RANGE);
        memcpy(cuq, p.cu_q, sizeof cuq);
        a.cu_seqlens_k = NULL;
        expect_fail(&p, &a, "varlen without cu_seqlens_k", FA_ERR_NULL_POINTER);
        a.cu_seqlens_k = cuk, a.cu_seqlens_q = NULL;
        expect_fail(&p, &a, "cu_seqlens_k without cu_seqlens_q (no cache)", FA_ERR_NULL_POINTER);
        a.cu_seqlens_q = cuq;
        a.k.shape[0] = a.v.shape[0] = 2;
        expect_fail(&p, &a, "varlen k with batch dim 2", FA_ERR_SHAPE_MISMATCH);
        a.k.shape[0] = a.v.shape[0] = 1;
        a.k.dtype = a.v.dtype = FA_DTYPE_F16;
        expect_fail(&p, &a, "varlen k f16 with q f32", FA_ERR_DTYPE);
        a.k.dtype = a.v.dtype = FA_DTYPE_F32;
        fa_tensor bias = h_alloc(FA_DTYPE_F32, 1, 1, 1, 1);
        a.bias = bias;
        expect_fail(&p, &a, "bias with varlen", FA_ERR_UNSUPPORTED);
        a.bias.data = NULL;
        free(bias.data);
        for (int k = 0; k < 2; k++) {
            const fa_algo al = k ? FA_ALGO_REFERENCE : FA_ALGO_STANDARD;
            h_case("misuse: %s on a varlen call", h_algo_str(al));
            memset(p.a.o.data, SENTINEL, p.o_bytes), memset(p.lse_t.data, SENTINEL, p.lse_bytes);
            const fa_status st = h_run(g_ctx, al, 1, &a);
            CHECK(st == FA_ERR_UNSUPPORTED, "status %d (%s), want UNSUPPORTED", (int)st, fa_status_string(st));
            CHECK(all_bytes(p.a.o.data, p.o_bytes, SENTINEL), "refused call wrote o");
        }
        iprob_free(&p);
    }
}

/* ------------------------------------------------------------ int8 details */

/* The quantisation rule itself, on rows whose answer is known: a zero row (scale 0, q 0),
 * a row with an exact maximum (q = +-127 there), and a row whose values are exact
 * multiples of its scale. */
static void test_int8_rows(uint64_t seed) {
    icase c;
    icase_init(&c);
    c.mode = MODE_CONTIG;
    c.B = 1, c.Hq = 1, c.Hk = 1, c.D = 8, c.Dv = 8;
    c.cdt = FA_DTYPE_I8;
    c.append = 1;
    c.sq[0] = 1, c.snew[0] = 3, c.sold[0] = 2;
    h_rng r;
    h_rng_seed(&r, seed + 1600);
    iprob p;
    iprob_build(&p, &c, &r);
    /* new rows: 0 all zero; 1 = 127 * (1, -1, 0.5, ..)/..; 2 = multiples of 0.25 with max 31.75 */
    for (int64_t d = 0; d < 8; d++) {
        h_set(&p.a.k, 0, 0, 0, d, 0.0), h_set(&p.a.v, 0, 0, 0, d, 0.0);
        h_set(&p.a.k, 0, 1, 0, d, d == 3 ? -2.5 : 2.5 * (double)(d - 4) / 8.0);
        h_set(&p.a.v, 0, 1, 0, d, d == 0 ? 3.0 : -1.0);
        h_set(&p.a.k, 0, 2, 0, d, 0.25 * (double)(127 - 10 * d));
        h_set(&p.a.v, 0, 2, 0, d, -0.25 * (double)(127 - 3 * d));
    }
    iprob_expect(&p);
    h_case("int8 append of known rows");
    const fa_status st = iprob_run(g_ctx, &p, FA_ALGO_FLASH, 1, 0);
    if (CHECK(st == FA_OK, "status %d (%s): %s", (int)st, fa_status_string(st), fa_context_error(g_ctx))) {
        const fa_tensor *k = &p.cache[0], *v = &p.cache[1], *ks = &p.cache[2], *vs = &p.cache[3];
        int zero_ok = h_get(ks, 0, 2, 0, 0) == 0.0 && h_get(vs, 0, 2, 0, 0) == 0.0;
        for (int64_t d = 0; d < 8; d++) zero_ok &= *i8_at(k, 0, 2, 0, d) == 0 && *i8_at(v, 0, 2, 0, d) == 0;
        CHECK(zero_ok, "an all-zero row must store scale 0 and q 0 (scale %g)", h_get(ks, 0, 2, 0, 0));
        CHECK(h_get(ks, 0, 3, 0, 0) == (double)(2.5f / 127.0f) && *i8_at(k, 0, 3, 0, 3) == -127 &&
                  h_get(vs, 0, 3, 0, 0) == (double)(3.0f / 127.0f) && *i8_at(v, 0, 3, 0, 0) == 127,
              "max|x| must map to +-127 with scale max|x| / 127: k scale %.9g q %d, v scale %.9g q %d",
              h_get(ks, 0, 3, 0, 0), *i8_at(k, 0, 3, 0, 3), h_get(vs, 0, 3, 0, 0), *i8_at(v, 0, 3, 0, 0));
        int mult_ok = h_get(ks, 0, 4, 0, 0) == (double)(31.75f / 127.0f);
        for (int64_t d = 0; d < 8; d++)
            mult_ok &= *i8_at(k, 0, 4, 0, d) == 127 - 10 * d && *i8_at(v, 0, 4, 0, d) == -(127 - 3 * d);
        CHECK(mult_ok, "exact multiples of the scale (0.25 * n) must quantise to n");
        check_cache(&p);
        check_numbers(g_ctx, &p);
    }
    iprob_free(&p);
}

/*
 * fp8 appends of known rows. Shared scale 1 (one per tensor): the stored code is the
 * rounding of x itself, checked against codes written out here from the formats (ties
 * to even, saturation where IEEE would give inf, subnormals and their ties, -0, NaN,
 * inf) and against the test's own quantiser (check_cache). Then per-row scales: a zero
 * row stores scale 0 and zeros, max|x| maps to the largest code; numbers checked.
 */
static void test_fp8_rows(uint64_t seed) {
    static const double e4m3_x[2][8] = {{1.0625, 1.1875, 500.0, -1e30, 0x1p-10, 0x3p-10, 464.0, 0.0},
                                         {NAN, INFINITY, -INFINITY, -0.0, 0x1p-9, 0x7p-9, 0xfp-10, 240.5}};
    static const uint8_t e4m3_q[2][8] = {{0x38, 0x3a, 0x7e, 0xfe, 0x00, 0x02, 0x7e, 0x00},
                                         {0x7f, 0x7f, 0xff, 0x80, 0x01, 0x07, 0x08, 0x77}};
    static const double e5m2_x[2][8] = {{1.125, 1.375, 1e6, -60000.0, 0x1p-17, 0x3p-17, 61440.0, 0.0},
                                         {NAN, INFINITY, -INFINITY, -0.0, 0x1p-16, 0x3p-16, 0x7p-17, 0.3}};
    static const uint8_t e5m2_q[2][8] = {{0x3c, 0x3e, 0x7b, 0xfb, 0x00, 0x02, 0x7b, 0x00},
                                         {0x7f, 0x7c, 0xfc, 0x80, 0x01, 0x03, 0x04, 0x35}};
    for (int f = 0; f < 2; f++) {
        const fa_dtype dt = f ? FA_DTYPE_F8E5M2 : FA_DTYPE_F8E4M3;
        icase c;
        icase_init(&c);
        c.mode = MODE_CONTIG;
        c.B = 1, c.Hq = 1, c.Hk = 1, c.D = 8, c.Dv = 8;
        c.cdt = dt;
        c.scale_mode = 2;
        c.append = 1;
        c.sq[0] = 1, c.snew[0] = 2, c.sold[0] = 2;
        h_rng r;
        h_rng_seed(&r, seed + 1700 + (uint64_t)f);
        iprob p;
        iprob_build(&p, &c, &r);
        for (int t = 2; t < 4; t++) ((float *)p.cache[t].data)[0] = ((float *)p.snap[t])[0] = 1.0f;
        for (int64_t t = 0; t < 2; t++)
            for (int64_t d = 0; d < 8; d++) {
                h_set(&p.a.k, 0, t, 0, d, f ? e5m2_x[t][d] : e4m3_x[t][d]);
                h_set(&p.a.v, 0, t, 0, d, -(f ? e5m2_x[t][d] : e4m3_x[t][d]));
            }
        iprob_expect(&p);
        h_case("%s append of known values with a shared scale 1", dt_str(dt));
        const fa_status st = iprob_run(g_ctx, &p, FA_ALGO_FLASH, 1, 0);
        if (CHECK(st == FA_OK, "status %d (%s): %s", (int)st, fa_status_string(st), fa_context_error(g_ctx))) {
            int bad = 0, bt = -1, bd = -1;
            for (int64_t t = 0; t < 2; t++)
                for (int64_t d = 0; d < 8; d++) {
                    const uint8_t want = f ? e5m2_q[t][d] : e4m3_q[t][d];
                    const uint8_t gk = *(uint8_t *)i8_at(&p.cache[0], 0, 2 + t, 0, d);
                    const uint8_t gv = *(uint8_t *)i8_at(&p.cache[1], 0, 2 + t, 0, d);
                    /* v = -x: the same code with the sign flipped (NaN: any sign) */
                    const int vok = (want & 0x7f) == 0x7f ? (gv & 0x7f) == 0x7f : gv == (uint8_t)(want ^ 0x80);
                    if ((gk != want || !vok) && bad++ == 0) bt = (int)t, bd = (int)d;
                }
            CHECK(bad == 0, "%d stored codes differ from the format's rounding; first x = %g: k code 0x%02x, want 0x%02x",
                  bad, bt >= 0 ? (f ? e5m2_x[bt][bd] : e4m3_x[bt][bd]) : 0.0,
                  bt >= 0 ? *(uint8_t *)i8_at(&p.cache[0], 0, 2 + bt, 0, bd) : 0,
                  bt >= 0 ? (f ? e5m2_q[bt][bd] : e4m3_q[bt][bd]) : 0);
            CHECK(((float *)p.cache[2].data)[0] == 1.0f && ((float *)p.cache[3].data)[0] == 1.0f,
                  "a shared scale must never be written");
            check_cache(&p);
        }
        iprob_free(&p);

        /* per-row scales: row 0 all zero, row 1 with max|x| at one element */
        c.scale_mode = 0;
        c.snew[0] = 3;
        h_rng_seed(&r, seed + 1710 + (uint64_t)f);
        iprob_build(&p, &c, &r);
        for (int64_t d = 0; d < 8; d++) {
            h_set(&p.a.k, 0, 0, 0, d, 0.0), h_set(&p.a.v, 0, 0, 0, d, 0.0);
            h_set(&p.a.k, 0, 1, 0, d, d == 3 ? -2.5 : 0.25 * (double)(d - 4));
            h_set(&p.a.v, 0, 1, 0, d, d == 0 ? 3.0 : -0.5);
        }
        iprob_expect(&p);
        h_case("%s append with per-row scales: zero rows, max|x| to the largest code", dt_str(dt));
        const fa_status st2 = iprob_run(g_ctx, &p, FA_ALGO_FLASH, 1, 0);
        if (CHECK(st2 == FA_OK, "status %d (%s): %s", (int)st2, fa_status_string(st2), fa_context_error(g_ctx))) {
            const fa_tensor *k = &p.cache[0], *v = &p.cache[1], *ks = &p.cache[2], *vs = &p.cache[3];
            const float fmax = dt_qmax(dt);
            const uint8_t top = f ? 0x7b : 0x7e;
            int zero_ok = h_get(ks, 0, 2, 0, 0) == 0.0 && h_get(vs, 0, 2, 0, 0) == 0.0;
            for (int64_t d = 0; d < 8; d++)
                zero_ok &= *(uint8_t *)i8_at(k, 0, 2, 0, d) == 0 && *(uint8_t *)i8_at(v, 0, 2, 0, d) == 0;
            CHECK(zero_ok, "an all-zero row must store scale 0 and code 0 (scale %g)", h_get(ks, 0, 2, 0, 0));
            CHECK(h_get(ks, 0, 3, 0, 0) == (double)(2.5f / fmax) && *(uint8_t *)i8_at(k, 0, 3, 0, 3) == (0x80 | top) &&
                      h_get(vs, 0, 3, 0, 0) == (double)(3.0f / fmax) && *(uint8_t *)i8_at(v, 0, 3, 0, 0) == top,
                  "max|x| must map to the largest code with scale max|x| / %g: k scale %.9g code 0x%02x", (double)fmax,
                  h_get(ks, 0, 3, 0, 0), *(uint8_t *)i8_at(k, 0, 3, 0, 3));
            check_cache(&p);
            check_numbers(g_ctx, &p);
        }
        iprob_free(&p);
    }
}

/*
 * Misuse of fp8 caches: a named status, nothing written (expect_fail). fp8 is a cache
 * dtype only: q, o, new rows and dense k/v refuse it.
 */
static void test_fp8_errors(uint64_t seed) {
    icase c;
    iprob p;
    h_rng r;
    error_base(&c, MODE_CONTIG, FA_DTYPE_F8E4M3, 0);
    h_rng_seed(&r, seed + 1720);
    iprob_build(&p, &c, &r);
    expect_ok(&p, "contiguous f8e4m3");
    {
        fa_forward_args a = p.a;
        fa_kv_cache kc = p.kc;
        a.kv_cache = &kc;
        kc.k_scale.data = NULL;
        expect_fail(&p, &a, "f8e4m3 cache without k_scale", FA_ERR_NULL_POINTER);
        kc.k_scale = p.kc.k_scale, kc.v_scale.data = NULL;
        expect_fail(&p, &a, "f8e4m3 cache without v_scale", FA_ERR_NULL_POINTER);
        kc.v_scale = p.kc.v_scale, kc.v.dtype = FA_DTYPE_F8E5M2;
        expect_fail(&p, &a, "k f8e4m3, v f8e5m2", FA_ERR_DTYPE);
        kc.v = p.kc.v, kc.k_scale.stride[2] = 0;
        expect_fail(&p, &a, "per-token k_scale broadcast over heads, with an append", FA_ERR_INVALID_ARGUMENT);
        kc.k_scale = p.kc.k_scale, kc.v_scale.stride[0] = 0;
        expect_fail(&p, &a, "per-token v_scale broadcast over cache rows, with an append", FA_ERR_INVALID_ARGUMENT);
        kc.v_scale = p.kc.v_scale;
        fa_tensor nk = a.k;
        a.k.dtype = FA_DTYPE_F8E4M3;
        expect_fail(&p, &a, "new k rows in f8e4m3", FA_ERR_DTYPE);
        a.k = nk, a.q.dtype = FA_DTYPE_F8E5M2;
        expect_fail(&p, &a, "q in f8e5m2", FA_ERR_DTYPE);
        a.q = p.a.q, a.o.dtype = FA_DTYPE_F8E4M3;
        expect_fail(&p, &a, "o in f8e4m3", FA_ERR_DTYPE);
        a.o = p.a.o;
        fa_kv_cache kf = p.kc;
        kf.k.dtype = kf.v.dtype = FA_DTYPE_I8; /* the same bytes, read as int8: scales fine */
        a.kv_cache = &kf;
        h_case("the same cache read as int8 is valid");
        CHECK(fa_forward_check(g_ctx, &a) == FA_OK, "%s", fa_context_error(g_ctx));
        kf.k.dtype = kf.v.dtype = FA_DTYPE_BF16; /* a float cache of half the rows, with scales */
        kf.k.shape[1] /= 2, kf.v.shape[1] /= 2;
        kf.k_scale.shape[1] /= 2, kf.v_scale.shape[1] /= 2;
        expect_fail(&p, &a, "scales on a bf16 cache", FA_ERR_INVALID_ARGUMENT);
        /* dense attention with fp8 k, v */
        fa_forward_args d = p.a;
        d.kv_cache = NULL;
        d.k = p.kc.k, d.v = p.kc.v;
        d.k.shape[0] = d.v.shape[0] = 1;
        d.q.shape[0] = d.o.shape[0] = 1;
        expect_fail(&p, &d, "dense f8e4m3 k and v (no cache)", FA_ERR_DTYPE);
    }
    iprob_free(&p);
}

/* ------------------------------------------------------- NaN isolation, ABI */

/*
 * A NaN in one cached key makes exactly the rows that read it NaN (its sequence's query
 * heads on that kv head); every other row is bitwise what it is without the NaN (same
 * shapes, so the same plan).
 */
static void test_nan_isolation(uint64_t seed) {
    for (int v = 0; v < 2; v++) {
        icase c;
        icase_init(&c);
        c.mode = v ? MODE_PAGED : MODE_CONTIG;
        c.B = 3, c.Hq = 4, c.Hk = 2, c.D = 32, c.Dv = 32;
        c.page_size = 4;
        for (int b = 0; b < 3; b++) c.sq[b] = 2, c.sold[b] = 10 + b;
        c.causal = FA_CAUSAL_BOTTOM_RIGHT;
        iprob p, q;
        h_rng r;
        h_rng_seed(&r, seed + 1700 + (uint64_t)v);
        iprob_build(&p, &c, &r);
        h_rng_seed(&r, seed + 1700 + (uint64_t)v);
        iprob_build(&q, &c, &r);
        int64_t i0, i1;
        slot_of(&p, 1, 3, &i0, &i1); /* key 3 of sequence 1, kv head 0: read by both its rows */
        h_set(&p.cache[0], i0, i1, 0, 5, NAN);
        memcpy(p.snap[0], p.cache[0].data, p.cbytes[0]);
        memcpy(p.expect[0], p.cache[0].data, p.cbytes[0]);
        h_case("NaN in key 3 of sequence 1, kv head 0 (%s)", p.desc);
        g_cases++;
        fa_status st = iprob_run(g_ctx, &p, FA_ALGO_FLASH, 2, 0);
        fa_status st2 = iprob_run(g_ctx, &q, FA_ALGO_FLASH, 2, 0);
        if (!CHECK(st == FA_OK && st2 == FA_OK, "status %d / %d: %s", (int)st, (int)st2, fa_context_error(g_ctx))) {
            iprob_free(&p), iprob_free(&q);
            continue;
        }
        int nan_ok = 1, same = 1;
        for (int64_t b = 0; b < 3; b++)
            for (int64_t i = 0; i < 2; i++)
                for (int64_t h = 0; h < 4; h++) {
                    const int hit = b == 1 && h / 2 == 0;
                    for (int64_t e = 0; e < 32; e++) {
                        if (hit) nan_ok &= isnan(h_get(&p.a.o, b, i, h, e));
                        else same &= h_bits(&p.a.o, b, i, h, e) == h_bits(&q.a.o, b, i, h, e);
                    }
                    if (hit) nan_ok &= isnan(h_get(&p.lse_t, b, h, i, 0));
                    else same &= h_bits(&p.lse_t, b, h, i, 0) == h_bits(&q.lse_t, b, h, i, 0);
                }
        CHECK(nan_ok, "rows reading the NaN key are not all NaN (o and lse)");
        CHECK(same, "rows not reading the NaN key differ from the run without it");
        iprob_free(&p), iprob_free(&q);
    }
}

/*
 * A caller compiled before the inference fields passes struct_size = offsetof(cu_seqlens_q):
 * whatever lies in those fields must not be read; the call is the plain dense one.
 */
static void test_old_struct(uint64_t seed) {
    h_rng r;
    h_rng_seed(&r, seed + 1800);
    const h_dims d = {2, 3, 20, 4, 2, 32, 32};
    h_problem p;
    h_problem_alloc(&p, d, FA_DTYPE_F32, FA_DTYPE_F32);
    h_fill_normal(&p.args.q, &r, 1.0), h_fill_normal(&p.args.k, &r, 1.0), h_fill_normal(&p.args.v, &r, 1.0);
    p.args.causal = FA_CAUSAL_BOTTOM_RIGHT;
    fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, 0);
    h_set_tiles(g_ctx, 0, 0);
    h_case("old struct_size = offsetof(cu_seqlens_q) with garbage in the inference fields");
    fa_status st = h_run(g_ctx, FA_ALGO_FLASH, 2, &p.args);
    CHECK(st == FA_OK, "plain call: status %d", (int)st);
    const size_t ob = t_nbytes(&p.args.o);
    unsigned char *o1 = malloc(ob);
    memcpy(o1, p.args.o.data, ob);
    static const int32_t junk[] = {7, -3, 1 << 30, -1};
    fa_kv_cache junk_cache;
    memset(&junk_cache, 0xff, sizeof junk_cache);
    fa_forward_args old = p.args;
    old.struct_size = offsetof(fa_forward_args, cu_seqlens_q);
    old.cu_seqlens_q = junk, old.cu_seqlens_k = junk, old.num_seqs = -5, old.kv_cache = &junk_cache;
    memset(p.args.o.data, SENTINEL, ob);
    st = h_run(g_ctx, FA_ALGO_FLASH, 2, &old);
    CHECK(st == FA_OK && memcmp(o1, p.args.o.data, ob) == 0,
          "status %d (%s): an old-size call must ignore cu_seqlens/num_seqs/kv_cache and equal the plain call", (int)st,
          fa_status_string(st));
    free(o1);
    h_problem_free(&p);
}

/* Misuse of a latent cache: each refused with its status, nothing written. */
static void test_mla_errors(uint64_t seed) {
    for (int form = 0; form < 2; form++) {
        icase c;
        error_base(&c, form ? MODE_PAGED : MODE_CONTIG, form ? FA_DTYPE_I8 : FA_DTYPE_BF16, form);
        c.mla = 2;
        c.D = 24, c.Dv = 16;
        h_rng r;
        h_rng_seed(&r, seed + 9300 + (uint64_t)form);
        iprob p;
        iprob_build(&p, &c, &r);
        expect_ok(&p, form ? "paged int8 latent cache, packed rows" : "latent cache");
        fa_forward_args a = p.a;
        fa_kv_cache kc = p.kc;
        a.kv_cache = &kc;

        kc.v.shape[3] = 25; /* Dv > D */
        a.v.shape[3] = 25;
        expect_fail(&p, &a, "latent Dv > D", FA_ERR_SHAPE_MISMATCH);
        a = p.a, kc = p.kc, a.kv_cache = &kc;
        kc.v = (fa_tensor){0}, a.v = (fa_tensor){0}; /* Dv from o; o too wide */
        a.o.shape[3] = 25;
        expect_fail(&p, &a, "latent, empty v, o's Dv > D", FA_ERR_SHAPE_MISMATCH);
        a = p.a, kc = p.kc, a.kv_cache = &kc;
        kc.v = p.cache[1]; /* a tensor of its own */
        expect_fail(&p, &a, "latent v that is not K's view", FA_ERR_INVALID_ARGUMENT);
        kc.v = p.kc.v;
        kc.v.stride[1] += 1;
        expect_fail(&p, &a, "latent v with other strides", FA_ERR_INVALID_ARGUMENT);
        kc.v = p.kc.v;
        kc.v.data = (char *)kc.v.data + 1;
        expect_fail(&p, &a, "latent v one byte into K", FA_ERR_INVALID_ARGUMENT);
        kc.v = p.kc.v;
        kc.v.dtype = FA_DTYPE_F16;
        expect_fail(&p, &a, "latent v of another dtype", FA_ERR_INVALID_ARGUMENT);
        a = p.a, kc = p.kc, a.kv_cache = &kc;
        a.v = p.v_own; /* new v rows of their own */
        expect_fail(&p, &a, "latent new v that is not the new k's view", FA_ERR_INVALID_ARGUMENT);
        a = p.a;
        a.k = (fa_tensor){0};
        a.cu_seqlens_k = NULL;
        expect_fail(&p, &a, "latent new v without new k", FA_ERR_INVALID_ARGUMENT);
        a = p.a, kc = p.kc, a.kv_cache = &kc;
        kc.v_in_k = 2;
        expect_fail(&p, &a, "v_in_k = 2", FA_ERR_INVALID_ARGUMENT);
        kc.v_in_k = -1;
        expect_fail(&p, &a, "v_in_k = -1", FA_ERR_INVALID_ARGUMENT);
        kc = p.kc;
        if (form) {
            kc.v_scale = p.cache[3]; /* scales of their own */
            expect_fail(&p, &a, "latent int8 v_scale that is not k_scale", FA_ERR_INVALID_ARGUMENT);
            kc.v_scale = (fa_tensor){0};
            kc.k_scale = (fa_tensor){0};
            expect_fail(&p, &a, "latent int8 without scales", FA_ERR_NULL_POINTER);
        }
        iprob_free(&p);
    }
}

int main(void) {
    uint64_t seed = h_env_u64("FA_TEST_SEED", 4242);
    h_case("fa_context_create");
    const fa_status st = h_context_create(&g_ctx);
    if (!CHECK(st == FA_OK && g_ctx, "status %d (%s)", (int)st, fa_status_string(st))) return h_summary();
    if (h_test_scale() < 1.0 && !getenv("FA_TEST_SEED")) {
        /* fewer random cases per path (sanitizers): each path draws different ones, so the
         * matrix as a whole still sees many (test_property does the same with its rounds) */
        for (const char *c = fa_context_isa(g_ctx); *c; c++) seed = seed * 131 + (unsigned char)*c;
        printf("FA_TEST_SCALE=%g: a share of the random cases, seed %llu for this path\n", h_test_scale(),
               (unsigned long long)seed);
    }

    test_varlen(seed);
    test_cache_fixed(seed);
    test_chunked_prefill(seed);
    test_mixed(seed);
    test_leftpad(seed);
    test_cache_random(seed);
    test_decode(seed);
    test_splits(seed);
    test_call_splits(seed);
    test_mla(seed);
    test_decode_tiles(seed);
    test_new_row_dtypes(seed);
    test_int8_rows(seed);
    test_fp8_rows(seed);
    test_fp8_errors(seed);
    test_merge_formula(seed);
    test_merge_attention(seed);
    test_merge_errors();
    test_errors(seed);
    test_mla_errors(seed);
    test_nan_isolation(seed);
    test_old_struct(seed);

    fa_context_free(g_ctx);
    h_case("packed K/V compared with unpacked");
    CHECK(g_pack_packed > 0, "none of the %lld cases compared packed K/V", (long long)g_pack_compared);
    printf("%lld cases bitwise against K/V packed the other way, %lld of them with packed K/V\n",
           (long long)g_pack_compared, (long long)g_pack_packed);
    printf("%lld inference cases (%lld refusals by standard/reference checked); worst o err/tol (q f32 f16 bf16): "
           "%.3f %.3f %.3f\n",
           (long long)g_cases, (long long)g_refused_checked, g_worst[0], g_worst[1], g_worst[2]);
    static const char *const qname[3] = {"i8", "f8e4m3", "f8e5m2"};
    for (int qi = 0; qi < 3; qi++)
        printf("%s caches against the f32 reference on dequantised values: max |o - o_ref| (err/tol) with o f32 %.3g "
               "(%.3f), f16 %.3g (%.3f), bf16 %.3g (%.3f)\n",
               qname[qi], g_q_max_err[qi][0], g_q_worst[qi][0], g_q_max_err[qi][1], g_q_worst[qi][1],
               g_q_max_err[qi][2], g_q_worst[qi][2]);
    printf("%lld appended int8 elements one step off at a rounding tie\n", (long long)g_i8_ties);
    return h_summary();
}
