/*
 * sequences.c: the inference forms (docs/semantics.md, section 8) as views of
 * dense problems. Variable-length batches and KV caches reduce to one idea: each
 * sequence is a B = 1 view (fa_view) of its own lengths whose tensors are views into
 * the packed or cached data (fa_seq_view), which the flash engine, the masks and the
 * band logic take beside the call, so they see the shapes they always saw. This file validates the varlen fields,
 * finds each sequence's lengths and first rows once per call (the sequence table,
 * fa_seq_table_fill, which validation keeps in fa_problem.seqs) and cuts the views of
 * q, o, lse and packed k, v at them; the cache (its validation, its
 * per-sequence view, the slot rule, the append) is cache.c's, and a paged view's rows
 * are found through the block table by fa_kv_row (kv.h).
 */
#include "cache.h"
#include "checks.h"

#include <math.h>

static int64_t span(const int32_t *cu, int64_t b) { return (int64_t)cu[b + 1] - cu[b]; }

/* Sequence b of inference form p: the rules of its lengths and first rows, which the
 * table holds so that views and plans read them instead of deriving them again. */
static fa_seq seq_find(const fa_problem *p, int64_t b)
{
    fa_seq q = {.Sq = p->cu_q ? span(p->cu_q, b) : p->q.shape[1], .qb = p->cu_q ? 0 : b,
                .q0 = p->cu_q ? p->cu_q[b] : 0};
    if (!p->cache) {
        q.Sk = p->cu_k ? span(p->cu_k, b) : p->k.shape[1];
        q.kb = p->cu_k ? 0 : b;
        q.k0 = p->cu_k ? p->cu_k[b] : 0;
        return q;
    }
    q.Sk = fa_cache_old_keys(p, b) + fa_cache_new_rows(p, b);
    if (!p->block_table) {
        const fa_slot at = fa_cache_seq_slot(p, b, 0); /* keys 0 .. Sk-1 are rows of one cache row */
        q.kb = at.blk;
        q.k0 = at.row;
    }
    return q;
}

void fa_seq_table_fill(const fa_problem *p, fa_seq *out)
{
    for (int64_t b = 0; b < p->B; b++) out[b] = seq_find(p, b);
}

void fa_seq_view(const fa_problem *p, int64_t b, fa_view *s)
{
    const fa_seq q = fa_seq_at(p, b);
    *s = p->view;
    s->Sq = q.Sq;
    s->Sk = q.Sk;
    s->B = 1;
    s->q = fa_seq_tensor(&p->q, q.qb, q.q0, s->Sq);
    s->o = fa_seq_tensor(&p->o, q.qb, q.q0, s->Sq);
    if (p->has_lse && s->Sq > 0) { /* (B, Hq, Sq, 1): its seq axis is axis 2 */
        s->lse.data = (float *)p->lse.data + q.qb * p->lse.stride[0] + q.q0 * p->lse.stride[2];
        s->lse.shape[0] = 1;
        s->lse.shape[2] = s->Sq;
    }
    if (p->alibi) {
        s->alibi = p->alibi + b * p->alibi_stride_b;
        s->alibi_stride_b = 0;
    }
    if (p->has_bias) s->bias = fa_seq_tensor(&p->bias, b, 0, p->bias.shape[1]); /* dense calls only */
    if (p->has_mask) s->mask = fa_seq_tensor(&p->mask, b, 0, p->mask.shape[1]);
    s->bm_row0 = p->bm_row0 + b * p->bm.row_b; /* the sequence's mask rows, indexed with b = 0 */
    if (!p->cache) {
        s->k = fa_seq_tensor(&p->k, q.kb, q.k0, s->Sk);
        s->v = fa_seq_tensor(&p->v, q.kb, q.k0, s->Sk);
        return;
    }
    fa_cache_view(p, b, &q, s); /* k, v (and the scales): the cache, seen from this sequence */
}

void fa_seq_grads(const fa_problem *p, const fa_grads *g, int64_t b, fa_grads *out)
{
    const fa_seq q = fa_seq_at(p, b); /* the backward's k, v are packed or dense, never a cache */
    *out = *g;
    out->dout = fa_seq_tensor(&g->dout, q.qb, q.q0, q.Sq);
    if (g->has_dq) out->dq = fa_seq_tensor(&g->dq, q.qb, q.q0, q.Sq);
    if (g->has_dk) out->dk = fa_seq_tensor(&g->dk, q.kb, q.k0, q.Sk);
    if (g->has_dv) out->dv = fa_seq_tensor(&g->dv, q.kb, q.k0, q.Sk);
}

/* ------------------------------------------------------------- validation */

/* k and v packed by cu_seqlens_k, (1, total_k, Hk, D | Dv), as q is by cu_seqlens_q. */
static fa_status check_packed_kv(fa_context *ctx, const fa_forward_args *a, fa_problem *p)
{
    fa_status st;
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

    if ((st = a->kv_cache ? fa_cache_validate(ctx, a, p) : check_packed_kv(ctx, a, p)) != FA_OK) return st;

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
        const fa_seq q = seq_find(p, b);
        if (q.Sq > p->Sq) p->Sq = q.Sq;
        if (q.Sk > p->Sk) p->Sk = q.Sk;
    }
    return FA_OK;
}
