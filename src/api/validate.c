/*
 * validate.c: turns a caller's fa_forward_args into an fa_problem, or says
 * precisely what is wrong. Every check happens here, before any algorithm runs,
 * so a rejected call never writes to its outputs.
 */
#include "checks.h"
#include "kv.h"
#include "alloc.h"
#include "arith.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* Fields up to and including window_right are required of every caller. */
#define FA_ARGS_MIN_SIZE (offsetof(fa_forward_args, window_right) + sizeof(int64_t))

/* A validated call keeps its fields where its problem can read them (fa_problem.args),
 * its K/V source, which every view of it inherits, and an inference form its sequence
 * table (fa_problem.seqs), in the context's buffer, which grows to the largest B seen. */
static fa_status keep_args(fa_context *ctx, const fa_forward_args *a, fa_problem *p)
{
    ctx->call_args = *a;
    p->args = &ctx->call_args;
    p->kv = fa_kv_source_of(p);
    if (!fa_problem_is_form(p)) return FA_OK;
    if (p->B > ctx->seqs_cap) {
        const int64_t bytes = fa_bytes3(p->B, (int64_t)sizeof(fa_seq), 1);
        fa_seq *t = bytes < 0 ? NULL : fa_malloc(bytes);
        if (!t)
            return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "cannot allocate the table of %lld sequences", (long long)p->B);
        fa_free(ctx->seqs);
        ctx->seqs = t;
        ctx->seqs_cap = p->B;
    }
    fa_seq_table_fill(p, ctx->seqs);
    p->seqs = ctx->seqs;
    return FA_OK;
}

fa_status fa_validate_forward(fa_context *ctx, const fa_forward_args *user, fa_problem *p)
{
    if (!user) return fa_fail(ctx, FA_ERR_NULL_POINTER, "args is NULL");
    fa_forward_args a;
    fa_forward_args_init(&a);
    fa_status st = fa_read_struct(ctx, "args", user, user->struct_size, &a, sizeof a, FA_ARGS_MIN_SIZE);
    if (st != FA_OK) return st;

    if ((st = fa_check_data(ctx, "q", &a.q)) != FA_OK || (st = fa_check_data(ctx, "o", &a.o)) != FA_OK) return st;
    if (!fa_dtype_is_float(a.q.dtype))
        return fa_fail(ctx, FA_ERR_DTYPE, "q.dtype (%s) must be f32, f16 or bf16", fa_dtype_name(a.q.dtype));
    if (a.o.dtype != a.q.dtype && a.o.dtype != FA_DTYPE_F32)
        return fa_fail(ctx, FA_ERR_DTYPE, "o.dtype (%s) must be q's dtype (%s) or f32", fa_dtype_name(a.o.dtype),
                       fa_dtype_name(a.q.dtype));
    if (a.kv_cache || a.cu_seqlens_q || a.cu_seqlens_k) {
        if (a.dropout_mask.data)
            return fa_fail(ctx, FA_ERR_UNSUPPORTED, "dropout_mask is for dense calls: its (B, Hq, Sq, Sk) shape has "
                                                    "no meaning when lengths differ");
        if (a.kv_cache && a.dropout_p > 0.0f)
            return fa_fail(ctx, FA_ERR_UNSUPPORTED, "dropout is for training; a KV cache is for inference");
        if (a.bias.data || a.mask.data)
            return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                           "bias and mask are not accepted with a KV cache or variable lengths (their [.., Sq, Sk] "
                           "shape has no meaning when lengths differ); use causal, window, softcap or ALiBi");
        memset(p, 0, sizeof *p);
        if ((st = fa_check_tensor(ctx, "q", &a.q)) != FA_OK) return st;
        if ((st = fa_check_tensor(ctx, "o", &a.o)) != FA_OK) return st;
        if ((st = fa_check_scalars(ctx, &a, p)) != FA_OK) return st;
        if ((st = fa_validate_forms(ctx, &a, p)) != FA_OK) return st;
        if ((st = fa_check_sinks(ctx, &a, p)) != FA_OK) return st;
        if ((st = fa_check_extents(ctx, p)) != FA_OK) return st;
        if ((st = fa_check_block_mask(ctx, &a, p)) != FA_OK) return st;
        return keep_args(ctx, &a, p);
    }

    if ((st = fa_check_kv_inputs(ctx, &a.q, &a.k, &a.v)) != FA_OK) return st;
    if (a.bias.data && !fa_dtype_is_float(a.bias.dtype))
        return fa_fail(ctx, FA_ERR_DTYPE, "bias.dtype (%s) must be f32, f16 or bf16", fa_dtype_name(a.bias.dtype));
    if (a.mask.data && a.mask.dtype != FA_DTYPE_BOOL)
        return fa_fail(ctx, FA_ERR_DTYPE, "mask.dtype (%s) must be bool", fa_dtype_name(a.mask.dtype));

    if ((st = fa_check_tensor(ctx, "q", &a.q)) != FA_OK) return st;
    if ((st = fa_check_tensor(ctx, "o", &a.o)) != FA_OK) return st;

    memset(p, 0, sizeof *p);
    p->B = a.q.shape[0];
    p->Sq = a.q.shape[1];
    p->Hq = a.q.shape[2];
    p->D = a.q.shape[3];
    p->Sk = a.k.shape[1];
    p->Hk = a.k.shape[2];
    p->Dv = a.v.shape[3];

    if (a.k.shape[0] != p->B || a.v.shape[0] != p->B)
        return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH, "batch sizes differ: q %lld, k %lld, v %lld", (long long)p->B,
                       (long long)a.k.shape[0], (long long)a.v.shape[0]);
    if (a.v.shape[1] != p->Sk || a.v.shape[2] != p->Hk)
        return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH, "k is (Sk %lld, Hk %lld) but v is (%lld, %lld)", (long long)p->Sk,
                       (long long)p->Hk, (long long)a.v.shape[1], (long long)a.v.shape[2]);
    if (a.o.shape[0] != p->B || a.o.shape[1] != p->Sq || a.o.shape[2] != p->Hq || a.o.shape[3] != p->Dv)
        return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH, "o is (%lld, %lld, %lld, %lld); it must be (B, Sq, Hq, Dv) = (%lld, %lld, %lld, %lld)",
                       (long long)a.o.shape[0], (long long)a.o.shape[1], (long long)a.o.shape[2],
                       (long long)a.o.shape[3], (long long)p->B, (long long)p->Sq, (long long)p->Hq, (long long)p->Dv);
    if ((st = fa_check_heads(ctx, p->D, a.k.shape[3], p->Hq, p->Hk)) != FA_OK) return st;
    if (a.lse.data && (st = fa_check_lse(ctx, &a.lse, p->B, p->Hq, p->Sq)) != FA_OK) return st;
    const int64_t want[4] = {p->B, p->Hq, p->Sq, p->Sk};
    if (a.bias.data && (st = fa_check_broadcast(ctx, "bias", &a.bias, want, &p->bias)) != FA_OK) return st;
    if (a.mask.data && (st = fa_check_broadcast(ctx, "mask", &a.mask, want, &p->mask)) != FA_OK) return st;

    if (a.dropout_mask.data) {
        if (a.dropout_mask.dtype != FA_DTYPE_BOOL)
            return fa_fail(ctx, FA_ERR_DTYPE, "dropout_mask.dtype (%s) must be bool", fa_dtype_name(a.dropout_mask.dtype));
        if ((st = fa_check_tensor(ctx, "dropout_mask", &a.dropout_mask)) != FA_OK ||
            (st = fa_check_shape(ctx, "dropout_mask", &a.dropout_mask, p->B, p->Hq, p->Sq, p->Sk)) != FA_OK)
            return st;
        p->has_drop_mask = 1;
        p->drop_mask = fa_tensor_canonical(a.dropout_mask);
    }
    if ((st = fa_check_scalars(ctx, &a, p)) != FA_OK) return st;
    if ((st = fa_check_sinks(ctx, &a, p)) != FA_OK) return st;
    if ((st = fa_check_extents(ctx, p)) != FA_OK) return st;
    if ((st = fa_check_block_mask(ctx, &a, p)) != FA_OK) return st;

    p->group = p->Hk > 0 ? p->Hq / p->Hk : 0;
    p->dtype = a.q.dtype;
    p->q = fa_tensor_canonical(a.q);
    p->k = fa_tensor_canonical(a.k);
    p->v = fa_tensor_canonical(a.v);
    p->o = fa_tensor_canonical(a.o);
    p->has_lse = a.lse.data != NULL;
    p->lse = fa_tensor_canonical(a.lse);
    p->scale = a.scale != 0.0f ? a.scale : (float)(1.0 / sqrt((double)p->D));
    p->has_bias = a.bias.data != NULL;
    p->has_mask = a.mask.data != NULL;
    return keep_args(ctx, &a, p);
}

/* Fields up to and including dv are required of every caller. */
#define FA_BWD_ARGS_MIN_SIZE (offsetof(fa_backward_args, dv) + sizeof(fa_tensor))

/* A gradient tensor: the shape of `like`, in dtype `dt` or f32. */
static fa_status check_grad(fa_context *ctx, const char *name, const fa_tensor *t, const fa_tensor *like, fa_dtype dt)
{
    fa_status st;
    if (t->dtype != dt && t->dtype != FA_DTYPE_F32)
        return fa_fail(ctx, FA_ERR_DTYPE, "%s.dtype (%s) must be %s or f32", name, fa_dtype_name(t->dtype),
                       fa_dtype_name(dt));
    if ((st = fa_check_tensor(ctx, name, t)) != FA_OK) return st;
    for (int d = 0; d < 4; d++)
        if (t->shape[d] != like->shape[d])
            return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH, "%s.shape[%d] is %lld; it must be %lld, as the tensor it differentiates",
                           name, d, (long long)t->shape[d], (long long)like->shape[d]);
    return FA_OK;
}

fa_status fa_validate_backward(fa_context *ctx, const fa_backward_args *user, fa_problem *p, fa_grads *g)
{
    if (!user) return fa_fail(ctx, FA_ERR_NULL_POINTER, "args is NULL");
    fa_backward_args a;
    fa_backward_args_init(&a);
    fa_status st = fa_read_struct(ctx, "args", user, user->struct_size, &a, sizeof a, FA_BWD_ARGS_MIN_SIZE);
    if (st != FA_OK) return st;
    if (!a.fwd) return fa_fail(ctx, FA_ERR_NULL_POINTER, "args->fwd is NULL: the backward needs the forward's arguments");
    if (a.fwd->struct_size >= offsetof(fa_forward_args, kv_cache) + sizeof(void *) && a.fwd->kv_cache)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "a KV cache is for inference; the backward has no gradient for it");
    if ((st = fa_validate_forward(ctx, a.fwd, p)) != FA_OK) return st;
    if (p->quant_matmul != FA_QUANT_MATMUL_EXACT)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "the backward is exact; the call's quantised products (quant_matmul "
                       "or FA_PARAM_QUANT_MATMUL) are %d (for inference): set them to 0 for training", p->quant_matmul);
    if (!p->has_lse)
        return fa_fail(ctx, FA_ERR_NULL_POINTER, "fwd->lse.data is NULL: the backward recomputes P from the forward's lse");
    if ((st = fa_check_data(ctx, "do_", &a.do_)) != FA_OK) return st;
    if (!fa_dtype_is_float(a.do_.dtype)) return fa_fail(ctx, FA_ERR_DTYPE, "do_.dtype (%s) must be f32, f16 or bf16", fa_dtype_name(a.do_.dtype));
    if ((st = check_grad(ctx, "do_", &a.do_, &p->o, a.do_.dtype)) != FA_OK) return st;
    memset(g, 0, sizeof *g);
    g->has_dq = a.dq.data != NULL;
    g->has_dk = a.dk.data != NULL;
    g->has_dv = a.dv.data != NULL;
    if (g->has_dq && (st = check_grad(ctx, "dq", &a.dq, &p->q, p->dtype)) != FA_OK) return st;
    if (g->has_dk && (st = check_grad(ctx, "dk", &a.dk, &p->k, p->dtype)) != FA_OK) return st;
    if (g->has_dv && (st = check_grad(ctx, "dv", &a.dv, &p->v, p->dtype)) != FA_OK) return st;
    g->dsinks = a.dsinks;
    g->dout = fa_tensor_canonical(a.do_);
    g->dq = fa_tensor_canonical(a.dq);
    g->dk = fa_tensor_canonical(a.dk);
    g->dv = fa_tensor_canonical(a.dv);
    return FA_OK;
}
