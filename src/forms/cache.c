/*
 * cache.c: the KV cache (see cache.h): validation of fa_kv_cache and of the new
 * rows a call appends, each sequence's view of the cache, and the append itself.
 *
 * Every check runs in fa_cache_validate, before anything is written: lengths, page
 * ids, batch_idx and slot collisions. forward.c then runs fa_cache_append before it
 * dispatches to an algorithm, and fa_cache_append_undo if the algorithm fails, so a
 * failed call leaves the cache as it was.
 */
#include "cache.h"
#include "arith.h"
#include "checks.h"
#include "context.h"
#include "convert.h"
#include "alloc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void fa_cache_view(const fa_problem *p, int64_t b, const fa_seq *q, fa_view *s)
{
    if (p->block_table) {
        s->k = p->kc;
        s->v = p->vc;
        s->pages = p->block_table + b * p->max_pages;
        return; /* k_scale, v_scale index pages as they are */
    }
    /* keys 0 .. Sk-1 are rows of one cache row, from q's (fa_cache_seq_slot of key 0) */
    s->k = fa_seq_tensor(&p->kc, q->kb, q->k0, s->Sk);
    s->v = fa_seq_tensor(&p->vc, q->kb, q->k0, s->Sk);
    if (p->quant) {
        s->k_scale = fa_seq_tensor(&p->k_scale, q->kb, q->k0, s->Sk);
        s->v_scale = fa_seq_tensor(&p->v_scale, q->kb, q->k0, s->Sk);
    }
}

/* ------------------------------------------------------------- validation */

/* Fields up to and including max_pages are required of every caller. */
#define FA_KV_CACHE_MIN_SIZE (offsetof(fa_kv_cache, max_pages) + sizeof(int64_t))

/* 1 when v is exactly the view of k's first dv columns: k's data, dtype, first
 * three dims and strides (an MLA latent cache's V, docs/semantics.md, section 8). */
static int is_k_view(const fa_tensor *v, const fa_tensor *k, int64_t dv)
{
    if (v->data != k->data || v->dtype != k->dtype || v->shape[3] != dv) return 0;
    for (int d = 0; d < 4; d++)
        if ((d < 3 && v->shape[d] != k->shape[d]) || v->stride[d] != k->stride[d]) return 0;
    return 1;
}

/* A quantised cache's scales: f32 (.., .., Hk, 1), one per (token, kv head), or shared
 * by a broadcast (the token stride 0, as the caller gave it: canonical views also zero
 * the stride of an axis of extent 1); a latent cache's V shares K's (v_scale empty or
 * k_scale itself). */
static fa_status check_scales(fa_context *ctx, const fa_kv_cache *c, fa_problem *p)
{
    fa_status st;
    const int shared = p->v_in_k && (!c->v_scale.data || is_k_view(&c->v_scale, &c->k_scale, 1));
    if (p->v_in_k && !shared)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_cache->v_in_k: a quantised latent cache's V shares K's scales; "
                                                     "v_scale must be empty or k_scale itself");
    if (!c->k_scale.data || (!shared && !c->v_scale.data))
        return fa_fail(ctx, FA_ERR_NULL_POINTER, "a %s cache needs k_scale and v_scale", fa_dtype_name(c->k.dtype));
    const fa_tensor *vs = shared ? &c->k_scale : &c->v_scale;
    if (c->k_scale.dtype != FA_DTYPE_F32 || vs->dtype != FA_DTYPE_F32)
        return fa_fail(ctx, FA_ERR_DTYPE, "k_scale and v_scale must be f32");
    if ((st = fa_check_tensor(ctx, "kv_cache->k_scale", &c->k_scale)) != FA_OK) return st;
    if ((st = fa_check_tensor(ctx, "kv_cache->v_scale", vs)) != FA_OK) return st;
    if ((st = fa_check_shape(ctx, "kv_cache->k_scale", &c->k_scale, c->k.shape[0], c->k.shape[1], p->Hk, 1)) != FA_OK ||
        (st = fa_check_shape(ctx, "kv_cache->v_scale", vs, c->k.shape[0], c->k.shape[1], p->Hk, 1)) != FA_OK)
        return st;
    p->quant = 1;
    p->scale_shared[0] = c->k_scale.stride[1] == 0;
    p->scale_shared[1] = vs->stride[1] == 0;
    p->k_scale = fa_tensor_canonical(c->k_scale);
    p->v_scale = fa_tensor_canonical(*vs);
    return FA_OK;
}

/* An MLA latent cache's V (v_in_k): c->v empty (Dv = o's head dim) or exactly the
 * view of K's first Dv columns, Dv <= D; p->vc becomes that view of p->kc. */
static fa_status check_latent(fa_context *ctx, const fa_kv_cache *c, const fa_forward_args *a, fa_problem *p)
{
    const int64_t dv = c->v.data ? c->v.shape[3] : a->o.shape[3];
    if (dv < 0 || dv > p->D)
        return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH,
                       "kv_cache->v_in_k: a V alias that does not fit inside K's rows: Dv = %lld (%s) but K's rows "
                       "hold D = %lld columns",
                       (long long)dv, c->v.data ? "kv_cache->v.shape[3]" : "o's head dim", (long long)p->D);
    if (c->v.data && !is_k_view(&c->v, &c->k, dv))
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                       "kv_cache->v_in_k: a V alias that does not fit inside K's rows: kv_cache->v must be empty or the "
                       "view of K's first Dv columns (k's data, dtype, first three dims and strides)");
    p->v_in_k = 1;
    p->Dv = dv;
    p->vc = p->kc;
    p->vc.shape[3] = dv;
    p->vc = fa_tensor_canonical(p->vc);
    return FA_OK;
}

/* The cache's k and v (and scales): dtypes and shapes; fills p's Hk, D, Dv. */
static fa_status check_storage(fa_context *ctx, const fa_kv_cache *c, const fa_forward_args *a, fa_problem *p)
{
    fa_status st;
    if (c->v_in_k != 0 && c->v_in_k != 1)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_cache->v_in_k is %d; it must be 0 or 1", c->v_in_k);
    const fa_tensor *v = c->v_in_k ? &c->k : &c->v; /* a latent cache's V is checked as K's view */
    if ((st = fa_check_data(ctx, "kv_cache->k", &c->k)) != FA_OK ||
        (st = fa_check_data(ctx, "kv_cache->v", v)) != FA_OK)
        return st;
    if (!c->seqlens) return fa_fail(ctx, FA_ERR_NULL_POINTER, "kv_cache->seqlens is NULL");
    if (c->k.dtype != v->dtype || !(fa_dtype_is_float(c->k.dtype) || fa_dtype_is_quant(c->k.dtype)))
        return fa_fail(ctx, FA_ERR_DTYPE,
                       "the cache's k and v must share one dtype of f32, f16, bf16, i8, f8e4m3, f8e5m2; got %s, %s",
                       fa_dtype_name(c->k.dtype), fa_dtype_name(v->dtype));
    if ((st = fa_check_tensor(ctx, "kv_cache->k", &c->k)) != FA_OK) return st;
    if ((st = fa_check_tensor(ctx, "kv_cache->v", v)) != FA_OK) return st;
    p->kc = fa_tensor_canonical(c->k);
    p->vc = fa_tensor_canonical(c->v);
    p->Hk = c->k.shape[2];
    p->D = c->k.shape[3];
    p->Dv = c->v.shape[3];
    if (c->v_in_k) {
        if ((st = check_latent(ctx, c, a, p)) != FA_OK) return st;
    } else if ((st = fa_check_shape(ctx, "kv_cache->v", &c->v, c->k.shape[0], c->k.shape[1], p->Hk, -1)) != FA_OK) {
        return st;
    }
    if (fa_dtype_is_quant(c->k.dtype)) return check_scales(ctx, c, p);
    if (c->k_scale.data || c->v_scale.data)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                       "k_scale and v_scale belong to i8 and fp8 caches only; this one is %s",
                       fa_dtype_name(c->k.dtype));
    return FA_OK;
}

/* Paged (block_table, max_pages, page_size) or contiguous (batch_idx); p's capacity. */
static fa_status check_layout(fa_context *ctx, const fa_kv_cache *c, fa_problem *p)
{
    p->cache = 1;
    p->seqlens = c->seqlens;
    if (!c->block_table) {
        p->batch_idx = c->batch_idx;
        p->leftpad = c->leftpad;
        p->capacity = c->k.shape[1];
        return FA_OK;
    }
    if (c->batch_idx || c->leftpad)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s is for contiguous caches; a paged cache maps "
                                                     "sequences to pages with block_table",
                       c->batch_idx ? "batch_idx" : "leftpad");
    if (c->max_pages < 1)
        return fa_fail(ctx, FA_ERR_INVALID_DIM, "kv_cache->max_pages is %lld; it must be >= 1",
                       (long long)c->max_pages);
    if (c->k.shape[1] < 1)
        return fa_fail(ctx, FA_ERR_INVALID_DIM,
                       "a paged cache's page_size (kv_cache->k.shape[1]) is 0; it must be >= 1");
    int64_t entries; /* the block table holds B rows of max_pages ids */
    if (!fa_mul_ok(p->B, c->max_pages, &entries))
        return fa_fail(ctx, FA_ERR_OVERFLOW, "the block table's B * max_pages = %lld * %lld entries overflow 64 bits",
                       (long long)p->B, (long long)c->max_pages);
    p->block_table = c->block_table;
    p->max_pages = c->max_pages;
    p->page_size = c->k.shape[1];
    if (!fa_mul_ok(c->max_pages, p->page_size, &p->capacity) || p->capacity > INT32_MAX) p->capacity = INT32_MAX;
    return FA_OK;
}

/* A latent cache's new rows: v empty or the view of the new k's first Dv columns;
 * p->v becomes that view of p->k. */
static fa_status check_new_latent(fa_context *ctx, const fa_forward_args *a, fa_problem *p)
{
    if (a->v.data && !is_k_view(&a->v, &a->k, p->Dv))
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                       "kv_cache->v_in_k: a V alias that does not fit inside K's rows: the new v must be empty or the "
                       "view of the new k's first Dv = %lld columns (k's data, dtype, first three dims and strides)",
                       (long long)p->Dv);
    p->v = p->k;
    p->v.shape[3] = p->Dv;
    p->v = fa_tensor_canonical(p->v);
    return FA_OK;
}

/* The new k, v rows, dense (B, S_new, ..) or packed by cu_seqlens_k, if any: each of
 * f32, f16, bf16, whatever q's and the other's dtype (rounded to the cache's on append). */
static fa_status check_new_rows(fa_context *ctx, const fa_forward_args *a, fa_problem *p)
{
    fa_status st;
    p->append = a->k.data || a->v.data;
    if (!p->append) {
        if (a->cu_seqlens_k)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                           "with a KV cache, cu_seqlens_k describes new k, v rows; none given");
        return FA_OK;
    }
    if (p->v_in_k && !a->k.data)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_cache->v_in_k: new v rows without new k rows; a latent "
                                                     "cache's V is K's first Dv columns, so give k (v empty)");
    const fa_tensor *v = p->v_in_k ? &a->k : &a->v; /* a latent cache's new v is checked as k's view */
    if ((st = fa_check_data(ctx, "k", &a->k)) != FA_OK || (st = fa_check_data(ctx, "v", v)) != FA_OK) return st;
    if (!fa_dtype_is_float(a->k.dtype) || !fa_dtype_is_float(v->dtype))
        return fa_fail(ctx, FA_ERR_DTYPE, "new k, v rows must be f32, f16 or bf16; got %s, %s",
                       fa_dtype_name(a->k.dtype), fa_dtype_name(v->dtype));
    if ((st = fa_check_tensor(ctx, "k", &a->k)) != FA_OK) return st;
    if ((st = fa_check_tensor(ctx, "v", v)) != FA_OK) return st;
    if (p->varlen && !a->cu_seqlens_k)
        return fa_fail(ctx, FA_ERR_NULL_POINTER, "packed q with new k, v rows needs cu_seqlens_k to split them");
    const int64_t batch = a->cu_seqlens_k ? 1 : p->B;
    if ((st = fa_check_shape(ctx, "k", &a->k, batch, -1, p->Hk, p->D)) != FA_OK) return st;
    if (!p->v_in_k && (st = fa_check_shape(ctx, "v", &a->v, batch, a->k.shape[1], p->Hk, p->Dv)) != FA_OK) return st;
    if (a->cu_seqlens_k) {
        if ((st = fa_check_cu(ctx, "cu_seqlens_k", a->cu_seqlens_k, p->B, a->k.shape[1])) != FA_OK) return st;
        p->cu_k = a->cu_seqlens_k;
    }
    p->k = fa_tensor_canonical(a->k);
    p->v = fa_tensor_canonical(a->v);
    return p->v_in_k ? check_new_latent(ctx, a, p) : FA_OK;
}

/* Every sequence's length, cache row and pages, against a cache of b_cache rows or pages. */
static fa_status check_sequences(fa_context *ctx, const fa_problem *p, int64_t b_cache)
{
    for (int64_t b = 0; b < p->B; b++) {
        const int64_t len = p->seqlens[b], add = fa_cache_new_rows(p, b);
        if (len < 0)
            return fa_fail(ctx, FA_ERR_OUT_OF_RANGE, "kv_cache->seqlens[%lld] is %lld; it must be >= 0", (long long)b,
                           (long long)len);
        if (p->leftpad && (p->leftpad[b] < 0 || p->leftpad[b] > len))
            return fa_fail(ctx, FA_ERR_OUT_OF_RANGE, "kv_cache->leftpad[%lld] = %d is outside [0, seqlens[%lld] = %lld]",
                           (long long)b, p->leftpad[b], (long long)b, (long long)len);
        if (len + add > p->capacity)
            return fa_fail(ctx, FA_ERR_OUT_OF_RANGE,
                           "sequence %lld: %lld cached + %lld new rows overflow the cache's %lld rows", (long long)b,
                           (long long)len, (long long)add, (long long)p->capacity);
        if (p->batch_idx && (p->batch_idx[b] < 0 || p->batch_idx[b] >= b_cache))
            return fa_fail(ctx, FA_ERR_OUT_OF_RANGE, "kv_cache->batch_idx[%lld] = %d is outside [0, %lld)",
                           (long long)b, p->batch_idx[b], (long long)b_cache);
        if (!p->block_table && !p->batch_idx && b >= b_cache)
            return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH, "the cache holds %lld sequences but the batch has %lld",
                           (long long)b_cache, (long long)p->B);
        if (!p->block_table) continue;
        const int64_t used = (len + add + p->page_size - 1) / p->page_size;
        for (int64_t g = 0; g < used; g++) {
            const int32_t id = p->block_table[b * p->max_pages + g];
            if (id < 0 || id >= b_cache)
                return fa_fail(ctx, FA_ERR_OUT_OF_RANGE, "block_table[%lld][%lld] = %d is not a page id in [0, %lld)",
                               (long long)b, (long long)g, id, (long long)b_cache);
        }
    }
    return FA_OK;
}

static int cmp_i64(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Two new rows must not land in one slot (sequences may share cache rows or pages). */
static fa_status check_slots(fa_context *ctx, const fa_problem *p)
{
    int64_t total = 0;
    for (int64_t b = 0; b < p->B; b++)
        if (!fa_add_ok(total, fa_cache_new_rows(p, b), &total))
            return fa_fail(ctx, FA_ERR_OVERFLOW, "the number of new rows overflows 64 bits");
    if (total <= 1) return FA_OK;
    int64_t *slots = fa_calloc(total, (int64_t)sizeof *slots);
    if (!slots) return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "cannot allocate the append check");
    const int64_t slot_rows = p->block_table ? p->page_size : p->capacity; /* rows per cache row or page */
    int64_t n = 0;
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t t = 0; t < fa_cache_new_rows(p, b); t++) {
            const fa_slot at = fa_cache_seq_slot(p, b, fa_cache_old_keys(p, b) + t);
            slots[n++] = at.blk * slot_rows + at.row;
        }
    qsort(slots, (size_t)n, sizeof *slots, cmp_i64);
    int64_t dup = -1;
    for (int64_t i = 1; i < n && dup < 0; i++)
        if (slots[i] == slots[i - 1]) dup = slots[i];
    fa_free(slots);
    if (dup < 0) return FA_OK;
    return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                   "two new rows would be written to the same cache slot (%s %lld, row %lld): "
                   "sequences share a cache row or page they both append to",
                   p->block_table ? "page" : "cache row", (long long)(dup / slot_rows), (long long)(dup % slot_rows));
}

/* An append writes per-row scales (token stride not 0) one per (token, kv head)
 * slot: a scale tensor that broadcasts over cache rows or heads would have several
 * rows write one scale, and all but the last read the wrong one. */
static fa_status check_scale_writes(fa_context *ctx, const fa_problem *p)
{
    for (int which = 0; which < 2; which++) {
        const fa_tensor *sc = which ? &p->v_scale : &p->k_scale;
        if (!p->quant || p->scale_shared[which]) continue;
        if ((sc->stride[0] == 0 && sc->shape[0] > 1) || (sc->stride[2] == 0 && sc->shape[2] > 1))
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                           "kv_cache->%s has a token stride, so an append writes one scale per (token, kv head), "
                           "but it broadcasts over %s (stride 0): give it token stride 0 to share the scale",
                           which ? "v_scale" : "k_scale", sc->stride[0] == 0 && sc->shape[0] > 1 ? "cache rows" : "heads");
    }
    return FA_OK;
}

fa_status fa_cache_validate(fa_context *ctx, const fa_forward_args *a, fa_problem *p)
{
    fa_kv_cache cache;
    fa_kv_cache_init(&cache);
    fa_status st = fa_read_struct(ctx, "kv_cache", a->kv_cache, a->kv_cache->struct_size, &cache, sizeof cache,
                                  FA_KV_CACHE_MIN_SIZE);
    if (st != FA_OK) return st;
    if ((st = check_storage(ctx, &cache, a, p)) != FA_OK) return st;
    if ((st = check_layout(ctx, &cache, p)) != FA_OK) return st;
    if ((st = check_new_rows(ctx, a, p)) != FA_OK) return st;
    if (p->append && (st = check_scale_writes(ctx, p)) != FA_OK) return st;
    /* lengths, indices and pages, all before anything is written */
    if ((st = check_sequences(ctx, p, cache.k.shape[0])) != FA_OK) return st;
    return p->append ? check_slots(ctx, p) : FA_OK;
}

/* ------------------------------------------------------------------ append */

/* The largest code magnitude of a quantised dtype: a row's scale is max|x| / this. */
static float quant_max(fa_dtype d)
{
    return d == FA_DTYPE_F8E4M3 ? FA_F8E4M3_MAX : d == FA_DTYPE_F8E5M2 ? FA_F8E5M2_MAX : 127.0f;
}

/* y = x * (1 / scale) as a code of dtype d: nearest, ties to even, saturating (int8
 * to [-127, 127]; half.h's fp8 rules). */
static int8_t quant_code(fa_dtype d, float y)
{
    if (d == FA_DTYPE_F8E4M3) return (int8_t)fa_f32_to_e4m3(y);
    if (d == FA_DTYPE_F8E5M2) return (int8_t)fa_f32_to_e5m2(y);
    return fa_f32_to_i8(y);
}

/* One row x of dim values into the cache slot (at, hk): rounded to a float cache's
 * dtype, or quantised into an int8 or fp8 cache with its scale: the slot's own
 * (max|x| / FMAX, written with the row), or a shared one, read and left as it is. */
static void store_row(const fa_kernels *kern, const fa_tensor *cache, const fa_tensor *scale, int shared, fa_slot at,
                      int64_t hk, const float *x, int64_t dim)
{
    if (!fa_dtype_is_quant(cache->dtype)) {
        fa_store_rows(cache, kern, at.blk, at.row, 1, hk, dim, x, dim);
        return;
    }
    float *sp = (float *)scale->data + at.blk * scale->stride[0] + at.row * scale->stride[1] + hk * scale->stride[2];
    float s = *sp;
    if (!shared) { /* symmetric per-row quantisation: scale = max|x| / FMAX */
        float amax = 0.0f;
        for (int64_t e = 0; e < dim; e++) {
            const float m = fabsf(x[e]);
            if (m > amax || isnan(m)) amax = m;
        }
        s = amax / quant_max(cache->dtype);
    }
    const float inv = s > 0.0f ? 1.0f / s : 0.0f; /* a zero scale (a zero row) stores zeros */
    const int64_t base = at.blk * cache->stride[0] + at.row * cache->stride[1] + hk * cache->stride[2];
    for (int64_t e = 0; e < dim; e++) ((int8_t *)cache->data)[base + e * cache->stride[3]] = quant_code(cache->dtype, x[e] * inv);
    if (!shared) *sp = s;
}

/* Copies the dim elements of slot (at, hk) of t into buf (save) or back from it. */
static void keep_row(const fa_tensor *t, fa_slot at, int64_t hk, int64_t dim, char *buf, int save)
{
    const int64_t es = (int64_t)fa_dtype_size(t->dtype), step = t->stride[3] == 1 ? dim : 1;
    char *x = (char *)t->data + (at.blk * t->stride[0] + at.row * t->stride[1] + hk * t->stride[2]) * es;
    for (int64_t e = 0; e < dim; e += step) { /* a contiguous row in one copy */
        char *el = x + e * t->stride[3] * es;
        if (save)
            memcpy(buf + e * es, el, (size_t)(step * es));
        else
            memcpy(el, buf + e * es, (size_t)(step * es));
    }
}

/* Whether an append writes the scale of the K (which 0) or V (1) rows: a quantised
 * cache's own per-row scales. */
static int writes_scale(const fa_problem *p, int which)
{
    return p->quant && !p->scale_shared[which];
}

/* The bytes the K (which 0) or V (1) row of one new row and kv head replaces: the
 * row, then its scale if the append writes it. An entry of the undo copy is the K
 * part, then V; a latent cache's V is inside K's row, which is written (and kept)
 * once: no V part. */
static int64_t part_bytes(const fa_problem *p, int which)
{
    if (which && p->v_in_k) return 0;
    const fa_tensor *t = which ? &p->vc : &p->kc;
    return (which ? p->Dv : p->D) * (int64_t)fa_dtype_size(t->dtype) + (writes_scale(p, which) ? (int64_t)sizeof(float) : 0);
}

/* Saves (save = 1) the part at buf, or puts it back (scale first: the reverse of
 * saving). Returns the part's end. */
static char *keep_part(const fa_problem *p, int which, fa_slot at, int64_t hk, char *buf, int save)
{
    if (which && p->v_in_k) return buf;
    const fa_tensor *t = which ? &p->vc : &p->kc, *sc = which ? &p->v_scale : &p->k_scale;
    const int64_t dim = which ? p->Dv : p->D, row = dim * (int64_t)fa_dtype_size(t->dtype);
    const int scaled = writes_scale(p, which);
    if (scaled && !save) keep_row(sc, at, hk, 1, buf + row, 0);
    keep_row(t, at, hk, dim, buf, save);
    if (scaled && save) keep_row(sc, at, hk, 1, buf + row, 1);
    return buf + part_bytes(p, which);
}

fa_status fa_cache_append(fa_context *ctx, const fa_problem *p, fa_cache_undo *undo)
{
    undo->saved = NULL;
    undo->bytes = 0;
    int64_t rows = 0, bytes = 0; /* the count was checked by the validation */
    for (int64_t b = 0; b < p->B; b++) rows += fa_cache_new_rows(p, b);
    if (rows == 0 || p->Hk == 0) return FA_OK;
    const int64_t row_bytes = (p->D > p->Dv ? p->D : p->Dv) * (int64_t)sizeof(float); /* the scratch row */
    const int ok = fa_mul_ok(rows, p->Hk, &bytes) && fa_mul_ok(bytes, part_bytes(p, 0) + part_bytes(p, 1), &bytes) &&
                   fa_add_ok(bytes, row_bytes, &bytes);
    char *buf = ok ? fa_malloc(bytes) : NULL;
    if (!buf)
        return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY,
                       "the append: cannot allocate a copy of the %lld cache rows it replaces", (long long)rows);
    undo->saved = buf;
    undo->bytes = bytes;
    float *row = (float *)buf;
    char *kept = buf + row_bytes;
    /* the context's row converters: a decoding call appends a row per kv head, and
     * half.h's scalar ones took a third of such a call's time at short caches */
    const fa_kernels *kern = ctx->kernels;
    for (int64_t b = 0; b < p->B; b++) {
        const int64_t add = fa_cache_new_rows(p, b);
        const int64_t sb = p->cu_k ? 0 : b, s0 = p->cu_k ? p->cu_k[b] : 0; /* new row t of sequence b */
        for (int64_t t = 0; t < add; t++) {
            const fa_slot at = fa_cache_seq_slot(p, b, fa_cache_old_keys(p, b) + t);
            for (int64_t hk = 0; hk < p->Hk; hk++) {
                fa_pack_rows(&p->k, kern, sb, s0 + t, 1, hk, p->D, row, p->D);
                kept = keep_part(p, 0, at, hk, kept, 1);
                store_row(kern, &p->kc, &p->k_scale, p->scale_shared[0], at, hk, row, p->D);
                if (p->v_in_k) continue; /* V is K's row, just written */
                fa_pack_rows(&p->v, kern, sb, s0 + t, 1, hk, p->Dv, row, p->Dv);
                kept = keep_part(p, 1, at, hk, kept, 1);
                store_row(kern, &p->vc, &p->v_scale, p->scale_shared[1], at, hk, row, p->Dv);
            }
        }
    }
    return FA_OK;
}

void fa_cache_append_undo(const fa_problem *p, const fa_cache_undo *undo)
{
    if (!undo->saved) return;
    /* backwards, the last write first: right even where the cache's k and v overlap */
    const int64_t k_part = part_bytes(p, 0), entry = k_part + part_bytes(p, 1);
    char *end = undo->saved + undo->bytes;
    for (int64_t b = p->B - 1; b >= 0; b--)
        for (int64_t t = fa_cache_new_rows(p, b) - 1; t >= 0; t--) {
            const fa_slot at = fa_cache_seq_slot(p, b, fa_cache_old_keys(p, b) + t);
            for (int64_t hk = p->Hk - 1; hk >= 0; hk--) {
                end -= entry;
                keep_part(p, 1, at, hk, end + k_part, 0);
                keep_part(p, 0, at, hk, end, 0);
            }
        }
}

void fa_cache_append_end(fa_cache_undo *undo)
{
    fa_free(undo->saved);
    undo->saved = NULL;
}
