/*
 * sequences.c: the inference forms (docs/semantics.md, section 8): variable-
 * length batches, contiguous and paged KV caches, int8 caches, and appending new
 * rows to a cache. They all reduce to one idea: each sequence is a dense B = 1
 * problem of its own lengths whose tensors are views into the packed or cached
 * data (fa_seq_view), so the flash engine, the masks and the band logic see the
 * shapes they always saw. Only a paged cache needs more than a view: its rows are
 * found through the block table (fa_kv_row in internal.h).
 *
 * Every check runs in fa_validate_forms, before anything is written, including the
 * append into the cache (fa_cache_append), which cannot fail after it.
 */
#include "checks.h"
#include "convert.h"
#include "alloc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int64_t span(const int32_t *cu, int64_t b) { return (int64_t)cu[b + 1] - cu[b]; }

/* New rows sequence b appends (0 without an append). */
static int64_t new_rows(const fa_problem *p, int64_t b)
{
    if (!p->append) return 0;
    return p->cu_k ? span(p->cu_k, b) : p->k.shape[1];
}

void fa_seq_lengths(const fa_problem *p, int64_t b, int64_t *sq, int64_t *sk)
{
    *sq = p->cu_q ? span(p->cu_q, b) : p->q.shape[1];
    if (p->cache)
        *sk = p->seqlens[b] + new_rows(p, b);
    else
        *sk = p->cu_k ? span(p->cu_k, b) : p->k.shape[1];
}

/* t with its batch axis fixed at b and its seq axis starting at s0: a (1, .., .., ..) view.
 * An empty view keeps t's base: its first row may lie one past the tensor (an empty
 * trailing sequence), where the offset was never proven in range and no row is read. */
static fa_tensor shifted(const fa_tensor *t, int64_t b, int64_t s0, int64_t len)
{
    fa_tensor v = *t;
    if (len > 0) {
        const int64_t off = b * t->stride[0] + s0 * t->stride[1]; /* an element of t: in range (checks.c) */
        v.data = (char *)t->data + off * (int64_t)fa_dtype_size(t->dtype);
    }
    v.shape[0] = 1;
    v.shape[1] = len;
    return v;
}

void fa_seq_view(const fa_problem *p, int64_t b, fa_problem *s)
{
    *s = *p;
    fa_seq_lengths(p, b, &s->Sq, &s->Sk);
    s->B = 1;
    const int64_t qb = p->cu_q ? 0 : b, q0 = p->cu_q ? p->cu_q[b] : 0;
    s->q = shifted(&p->q, qb, q0, s->Sq);
    s->o = shifted(&p->o, qb, q0, s->Sq);
    if (p->has_lse && s->Sq > 0) { /* (B, Hq, Sq, 1): its seq axis is axis 2 */
        s->lse.data = (float *)p->lse.data + qb * p->lse.stride[0] + q0 * p->lse.stride[2];
        s->lse.shape[0] = 1;
        s->lse.shape[2] = s->Sq;
    }
    if (p->alibi) {
        s->alibi = p->alibi + b * p->alibi_stride_b;
        s->alibi_stride_b = 0;
    }
    if (p->has_bias) s->bias = shifted(&p->bias, b, 0, p->bias.shape[1]); /* dense calls only */
    if (p->has_mask) s->mask = shifted(&p->mask, b, 0, p->mask.shape[1]);
    s->varlen = 0;
    s->cu_q = s->cu_k = NULL;
    if (!p->cache) {
        const int64_t kb = p->cu_k ? 0 : b, k0 = p->cu_k ? p->cu_k[b] : 0;
        s->k = shifted(&p->k, kb, k0, s->Sk);
        s->v = shifted(&p->v, kb, k0, s->Sk);
        return;
    }
    /* from here on k, v (and the scales) are the cache, seen from this sequence */
    s->append = 0;
    s->cache = 0;
    if (p->block_table) {
        s->k = p->kc;
        s->v = p->vc;
        s->pages = p->block_table + b * p->max_pages;
        return; /* k_scale, v_scale index pages as they are */
    }
    const int64_t row = p->batch_idx ? p->batch_idx[b] : b;
    s->k = shifted(&p->kc, row, 0, s->Sk);
    s->v = shifted(&p->vc, row, 0, s->Sk);
    if (p->quant) {
        s->k_scale = shifted(&p->k_scale, row, 0, s->Sk);
        s->v_scale = shifted(&p->v_scale, row, 0, s->Sk);
    }
}

void fa_seq_grads(const fa_problem *p, const fa_grads *g, int64_t b, fa_grads *out)
{
    *out = *g;
    int64_t sq, sk;
    fa_seq_lengths(p, b, &sq, &sk);
    const int64_t qb = p->cu_q ? 0 : b, q0 = p->cu_q ? p->cu_q[b] : 0;
    const int64_t kb = p->cu_k ? 0 : b, k0 = p->cu_k ? p->cu_k[b] : 0;
    out->dout = shifted(&g->dout, qb, q0, sq);
    if (g->has_dq) out->dq = shifted(&g->dq, qb, q0, sq);
    if (g->has_dk) out->dk = shifted(&g->dk, kb, k0, sk);
    if (g->has_dv) out->dv = shifted(&g->dv, kb, k0, sk);
}

/* ------------------------------------------------------------- validation */

static int cmp_i64(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The cache slot (cache row or page, row inside it) new row t of sequence b lands in. */
static int64_t slot_of(const fa_problem *p, int64_t b, int64_t t)
{
    const int64_t j = p->seqlens[b] + t;
    if (p->block_table) return (int64_t)p->block_table[b * p->max_pages + j / p->page_size] * p->page_size + j % p->page_size;
    return (p->batch_idx ? p->batch_idx[b] : b) * p->capacity + j;
}

/* Fields up to and including max_pages are required of every caller. */
#define FA_KV_CACHE_MIN_SIZE (offsetof(fa_kv_cache, max_pages) + sizeof(int64_t))

static fa_status check_cache(fa_context *ctx, const fa_forward_args *a, fa_problem *p)
{
    fa_kv_cache cache;
    fa_kv_cache_init(&cache);
    fa_status st = fa_read_struct(ctx, "kv_cache", a->kv_cache, a->kv_cache->struct_size, &cache, sizeof cache,
                                  FA_KV_CACHE_MIN_SIZE);
    if (st != FA_OK) return st;
    const fa_kv_cache *c = &cache;
    if ((st = fa_check_data(ctx, "kv_cache->k", &c->k)) != FA_OK || (st = fa_check_data(ctx, "kv_cache->v", &c->v)) != FA_OK)
        return st;
    if (!c->seqlens) return fa_fail(ctx, FA_ERR_NULL_POINTER, "kv_cache->seqlens is NULL");
    if (c->k.dtype != c->v.dtype || !(fa_dtype_is_float(c->k.dtype) || c->k.dtype == FA_DTYPE_I8))
        return fa_fail(ctx, FA_ERR_DTYPE, "the cache's k and v must share one dtype of f32, f16, bf16, i8; got %s, %s",
                       fa_dtype_name(c->k.dtype), fa_dtype_name(c->v.dtype));
    if ((st = fa_check_tensor(ctx, "kv_cache->k", &c->k)) != FA_OK) return st;
    if ((st = fa_check_tensor(ctx, "kv_cache->v", &c->v)) != FA_OK) return st;
    p->kc = fa_tensor_canonical(c->k);
    p->vc = fa_tensor_canonical(c->v);
    p->Hk = c->k.shape[2];
    p->D = c->k.shape[3];
    p->Dv = c->v.shape[3];
    if ((st = fa_check_shape(ctx, "kv_cache->v", &c->v, c->k.shape[0], c->k.shape[1], p->Hk, -1)) != FA_OK) return st;
    if (c->k.dtype == FA_DTYPE_I8) {
        if (!c->k_scale.data || !c->v_scale.data)
            return fa_fail(ctx, FA_ERR_NULL_POINTER, "an i8 cache needs k_scale and v_scale");
        if (c->k_scale.dtype != FA_DTYPE_F32 || c->v_scale.dtype != FA_DTYPE_F32)
            return fa_fail(ctx, FA_ERR_DTYPE, "k_scale and v_scale must be f32");
        if ((st = fa_check_tensor(ctx, "kv_cache->k_scale", &c->k_scale)) != FA_OK) return st;
        if ((st = fa_check_tensor(ctx, "kv_cache->v_scale", &c->v_scale)) != FA_OK) return st;
        if ((st = fa_check_shape(ctx, "kv_cache->k_scale", &c->k_scale, c->k.shape[0], c->k.shape[1], p->Hk, 1)) != FA_OK ||
            (st = fa_check_shape(ctx, "kv_cache->v_scale", &c->v_scale, c->k.shape[0], c->k.shape[1], p->Hk, 1)) != FA_OK)
            return st;
        p->quant = 1;
        p->k_scale = fa_tensor_canonical(c->k_scale);
        p->v_scale = fa_tensor_canonical(c->v_scale);
    } else if (c->k_scale.data || c->v_scale.data) {
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "k_scale and v_scale belong to i8 caches only; this one is %s",
                       fa_dtype_name(c->k.dtype));
    }
    p->cache = 1;
    p->seqlens = c->seqlens;
    if (c->block_table) {
        if (c->batch_idx)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "batch_idx is for contiguous caches; a paged cache maps "
                                                         "sequences to pages with block_table");
        if (c->max_pages < 1)
            return fa_fail(ctx, FA_ERR_INVALID_DIM, "kv_cache->max_pages is %lld; it must be >= 1",
                           (long long)c->max_pages);
        if (c->k.shape[1] < 1)
            return fa_fail(ctx, FA_ERR_INVALID_DIM, "a paged cache's page_size (kv_cache->k.shape[1]) is 0; it must be >= 1");
        int64_t entries; /* the block table holds B rows of max_pages ids */
        if (!fa_mul_ok(p->B, c->max_pages, &entries))
            return fa_fail(ctx, FA_ERR_OVERFLOW, "the block table's B * max_pages = %lld * %lld entries overflow 64 bits",
                           (long long)p->B, (long long)c->max_pages);
        p->block_table = c->block_table;
        p->max_pages = c->max_pages;
        p->page_size = c->k.shape[1];
        if (!fa_mul_ok(c->max_pages, p->page_size, &p->capacity) || p->capacity > INT32_MAX)
            p->capacity = INT32_MAX;
    } else {
        p->batch_idx = c->batch_idx;
        p->capacity = c->k.shape[1];
    }

    /* new rows */
    p->append = a->k.data || a->v.data;
    if (p->append) {
        if ((st = fa_check_data(ctx, "k", &a->k)) != FA_OK || (st = fa_check_data(ctx, "v", &a->v)) != FA_OK) return st;
        if (!fa_dtype_is_float(a->k.dtype) || !fa_dtype_is_float(a->v.dtype))
            return fa_fail(ctx, FA_ERR_DTYPE, "new k, v rows must be f32, f16 or bf16; got %s, %s",
                           fa_dtype_name(a->k.dtype), fa_dtype_name(a->v.dtype));
        if ((st = fa_check_tensor(ctx, "k", &a->k)) != FA_OK) return st;
        if ((st = fa_check_tensor(ctx, "v", &a->v)) != FA_OK) return st;
        if (p->varlen && !a->cu_seqlens_k)
            return fa_fail(ctx, FA_ERR_NULL_POINTER, "packed q with new k, v rows needs cu_seqlens_k to split them");
        const int64_t batch = a->cu_seqlens_k ? 1 : p->B;
        if ((st = fa_check_shape(ctx, "k", &a->k, batch, -1, p->Hk, p->D)) != FA_OK) return st;
        if ((st = fa_check_shape(ctx, "v", &a->v, batch, a->k.shape[1], p->Hk, p->Dv)) != FA_OK) return st;
        if (a->cu_seqlens_k) {
            if ((st = fa_check_cu(ctx, "cu_seqlens_k", a->cu_seqlens_k, p->B, a->k.shape[1])) != FA_OK) return st;
            p->cu_k = a->cu_seqlens_k;
        }
        p->k = fa_tensor_canonical(a->k);
        p->v = fa_tensor_canonical(a->v);
    } else if (a->cu_seqlens_k) {
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "with a KV cache, cu_seqlens_k describes new k, v rows; none given");
    }

    /* lengths, indices and pages, all before anything is written */
    const int64_t b_cache = c->k.shape[0];
    for (int64_t b = 0; b < p->B; b++) {
        const int64_t len = c->seqlens[b], add = new_rows(p, b);
        if (len < 0)
            return fa_fail(ctx, FA_ERR_OUT_OF_RANGE, "kv_cache->seqlens[%lld] is %lld; it must be >= 0", (long long)b,
                           (long long)len);
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
        if (p->block_table) {
            const int64_t used = (len + add + p->page_size - 1) / p->page_size;
            for (int64_t g = 0; g < used; g++) {
                const int32_t id = p->block_table[b * p->max_pages + g];
                if (id < 0 || id >= b_cache)
                    return fa_fail(ctx, FA_ERR_OUT_OF_RANGE,
                                   "block_table[%lld][%lld] = %d is not a page id in [0, %lld)", (long long)b,
                                   (long long)g, id, (long long)b_cache);
            }
        }
    }
    if (p->append) { /* two new rows must not land in one slot */
        int64_t total = 0;
        for (int64_t b = 0; b < p->B; b++)
            if (!fa_add_ok(total, new_rows(p, b), &total))
                return fa_fail(ctx, FA_ERR_OVERFLOW, "the number of new rows overflows 64 bits");
        if (total > 1) {
            int64_t *slots = fa_calloc(total, (int64_t)sizeof *slots);
            if (!slots) return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "cannot allocate the append check");
            int64_t n = 0;
            for (int64_t b = 0; b < p->B; b++)
                for (int64_t t = 0; t < new_rows(p, b); t++) slots[n++] = slot_of(p, b, t);
            qsort(slots, (size_t)n, sizeof *slots, cmp_i64);
            int64_t dup = -1;
            const int64_t slot_rows = p->block_table ? p->page_size : p->capacity;
            for (int64_t i = 1; i < n && dup < 0; i++)
                if (slots[i] == slots[i - 1]) dup = slots[i];
            fa_free(slots);
            if (dup >= 0)
                return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                               "two new rows would be written to the same cache slot (%s %lld, row %lld): "
                               "sequences share a cache row or page they both append to",
                               p->block_table ? "page" : "cache row", (long long)(dup / slot_rows),
                               (long long)(dup % slot_rows));
        }
    }
    return FA_OK;
}

fa_status fa_validate_forms(fa_context *ctx, const fa_forward_args *a, fa_problem *p)
{
    fa_status st;
    if (a->cu_seqlens_k && !a->cu_seqlens_q && !a->kv_cache)
        return fa_fail(ctx, FA_ERR_NULL_POINTER, "cu_seqlens_k is set but cu_seqlens_q is not");
    p->varlen = a->cu_seqlens_q != NULL;
    p->Hq = a->q.shape[2];
    if (p->varlen) {
        if (a->num_seqs < 0 || a->num_seqs > INT32_MAX)
            return fa_fail(ctx, FA_ERR_INVALID_DIM, "num_seqs is %lld; it must lie in [0, 2^31)",
                           (long long)a->num_seqs);
        p->B = a->num_seqs;
        if (a->q.shape[0] != 1 || a->o.shape[0] != 1)
            return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH, "packed q and o have batch dim 1 (sequences are packed along "
                                                       "axis 1); got %lld and %lld",
                           (long long)a->q.shape[0], (long long)a->o.shape[0]);
        if ((st = fa_check_cu(ctx, "cu_seqlens_q", a->cu_seqlens_q, p->B, a->q.shape[1])) != FA_OK) return st;
        p->cu_q = a->cu_seqlens_q;
    } else {
        p->B = a->q.shape[0];
        if (p->B > INT32_MAX)
            return fa_fail(ctx, FA_ERR_INVALID_DIM, "B = %lld; a cached call takes at most 2^31 - 1 sequences",
                           (long long)p->B);
    }

    if (a->kv_cache) {
        if ((st = check_cache(ctx, a, p)) != FA_OK) return st;
    } else {
        if ((st = fa_check_kv_inputs(ctx, &a->q, &a->k, &a->v)) != FA_OK) return st;
        if (!a->cu_seqlens_k) return fa_fail(ctx, FA_ERR_NULL_POINTER, "varlen q needs cu_seqlens_k for k and v");
        p->Hk = a->k.shape[2];
        p->D = a->k.shape[3];
        p->Dv = a->v.shape[3];
        if ((st = fa_check_shape(ctx, "k", &a->k, 1, -1, -1, -1)) != FA_OK) return st;
        if ((st = fa_check_shape(ctx, "v", &a->v, 1, a->k.shape[1], p->Hk, -1)) != FA_OK) return st;
        if ((st = fa_check_cu(ctx, "cu_seqlens_k", a->cu_seqlens_k, p->B, a->k.shape[1])) != FA_OK) return st;
        p->cu_k = a->cu_seqlens_k;
        p->k = fa_tensor_canonical(a->k);
        p->v = fa_tensor_canonical(a->v);
    }

    if (a->o.shape[1] != a->q.shape[1] || a->o.shape[2] != p->Hq || a->o.shape[3] != p->Dv ||
        (!p->varlen && a->o.shape[0] != p->B))
        return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH, "o is (%lld, %lld, %lld, %lld); it must be q's (B, Sq, Hq) with Dv = %lld",
                       (long long)a->o.shape[0], (long long)a->o.shape[1], (long long)a->o.shape[2],
                       (long long)a->o.shape[3], (long long)p->Dv);
    if ((st = fa_check_heads(ctx, a->q.shape[3], p->D, p->Hq, p->Hk)) != FA_OK) return st;
    if (a->lse.data && (st = fa_check_lse(ctx, &a->lse, a->q.shape[0], p->Hq, a->q.shape[1])) != FA_OK) return st;

    p->group = p->Hk > 0 ? p->Hq / p->Hk : 0;
    p->dtype = a->q.dtype;
    p->q = fa_tensor_canonical(a->q);
    p->o = fa_tensor_canonical(a->o);
    p->has_lse = a->lse.data != NULL;
    p->lse = fa_tensor_canonical(a->lse);
    if (p->scale == 0.0f) p->scale = (float)(1.0 / sqrt((double)p->D));
    /* the longest sequence, for planning tiles */
    p->Sq = p->Sk = 0;
    for (int64_t b = 0; b < p->B; b++) {
        int64_t sq, sk;
        fa_seq_lengths(p, b, &sq, &sk);
        if (sq > p->Sq) p->Sq = sq;
        if (sk > p->Sk) p->Sk = sk;
    }
    return FA_OK;
}

/* ------------------------------------------------------------------ append */

/* One row x of dim values into the cache slot (blk, row, hk): rounded to a float
 * cache's dtype, or quantised into an int8 cache with its scale. */
static void store_row(const fa_tensor *cache, const fa_tensor *scale, int64_t blk, int64_t row, int64_t hk,
                      const float *x, int64_t dim)
{
    if (cache->dtype != FA_DTYPE_I8) {
        fa_store_rows(cache, &fa_kernels_ref, blk, row, 1, hk, dim, x, dim);
        return;
    }
    /* symmetric per-row quantisation: scale = max|x| / 127, q = round(x / scale) */
    float amax = 0.0f;
    for (int64_t e = 0; e < dim; e++) {
        const float m = fabsf(x[e]);
        if (m > amax || isnan(m)) amax = m;
    }
    const float s = amax / 127.0f;
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    const int64_t base = blk * cache->stride[0] + row * cache->stride[1] + hk * cache->stride[2];
    for (int64_t e = 0; e < dim; e++) {
        float qv = nearbyintf(x[e] * inv);
        if (!(qv >= -127.0f)) qv = -127.0f; /* also NaN: its scale carries the NaN */
        if (qv > 127.0f) qv = 127.0f;
        ((int8_t *)cache->data)[base + e * cache->stride[3]] = (int8_t)qv;
    }
    ((float *)scale->data)[blk * scale->stride[0] + row * scale->stride[1] + hk * scale->stride[2]] = s;
}

void fa_cache_append(const fa_problem *p, float *row)
{    for (int64_t b = 0; b < p->B; b++) {
        const int64_t add = new_rows(p, b);
        for (int64_t t = 0; t < add; t++) {
            const int64_t j = p->seqlens[b] + t;
            int64_t blk, r;
            if (p->block_table) {
                blk = p->block_table[b * p->max_pages + j / p->page_size];
                r = j % p->page_size;
            } else {
                blk = p->batch_idx ? p->batch_idx[b] : b;
                r = j;
            }
            const int64_t sb = p->cu_k ? 0 : b, s0 = p->cu_k ? p->cu_k[b] : 0; /* new row t of sequence b */
            for (int64_t hk = 0; hk < p->Hk; hk++) {
                fa_pack_rows(&p->k, sb, s0 + t, 1, hk, p->D, row, p->D);
                store_row(&p->kc, &p->k_scale, blk, r, hk, row, p->D);
                fa_pack_rows(&p->v, sb, s0 + t, 1, hk, p->Dv, row, p->Dv);
                store_row(&p->vc, &p->v_scale, blk, r, hk, row, p->Dv);
            }
        }
    }
}
