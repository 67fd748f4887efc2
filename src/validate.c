/*
 * validate.c: turns a caller's fa_forward_args into an fa_problem, or says
 * precisely what is wrong. Every check happens here, before any algorithm runs,
 * so a rejected call never writes to its outputs.
 */
#include "internal.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* Fields up to and including window_right are required of every caller. */
#define FA_ARGS_MIN_SIZE (offsetof(fa_forward_args, window_right) + sizeof(int64_t))
/* A struct_size beyond this is garbage, not a future header. */
#define FA_ARGS_MAX_SIZE 4096

/* The largest element offset |sum (shape-1)*stride| must fit, in bytes, in ptrdiff_t. */
static fa_status check_extent(fa_context *ctx, const char *name, const fa_tensor *t)
{
    int64_t span = 0;
    for (int d = 0; d < 4; d++) {
        int64_t st = t->stride[d];
        if (st == INT64_MIN) return fa_fail(ctx, FA_ERR_OVERFLOW, "%s.stride[%d] overflows", name, d);
        int64_t term;
        if (!fa_mul_ok(t->shape[d] - 1, st < 0 ? -st : st, &term) || !fa_add_ok(span, term, &span))
            return fa_fail(ctx, FA_ERR_OVERFLOW, "%s: shape times strides overflows 64 bits", name);
    }
    int64_t bytes;
    if (!fa_mul_ok(span + 1, (int64_t)fa_dtype_size(t->dtype), &bytes) || (uint64_t)bytes > (uint64_t)PTRDIFF_MAX)
        return fa_fail(ctx, FA_ERR_OVERFLOW, "%s: its byte extent overflows", name);
    return FA_OK;
}

fa_status fa_check_dims(fa_context *ctx, const char *name, const fa_tensor *t)
{
    for (int d = 0; d < 4; d++)
        if (t->shape[d] <= 0)
            return fa_fail(ctx, FA_ERR_INVALID_DIM, "%s.shape[%d] is %lld; every dimension must be >= 1",
                           name, d, (long long)t->shape[d]);
    return check_extent(ctx, name, t);
}

/* bias and mask: each dim equals the target or is 1 (then its stride is ignored). */
static fa_status check_broadcast(fa_context *ctx, const char *name, const fa_tensor *t, const int64_t want[4],
                                 fa_tensor *out)
{
    static const char *dim_names[4] = {"B", "Hq", "Sq", "Sk"};
    *out = *t;
    for (int d = 0; d < 4; d++) {
        if (t->shape[d] == want[d]) continue;
        if (t->shape[d] == 1) {
            out->stride[d] = 0;
            continue;
        }
        return fa_fail(ctx, FA_ERR_BROADCAST, "%s.shape[%d] is %lld; it must be 1 or %s = %lld", name, d,
                       (long long)t->shape[d], dim_names[d], (long long)want[d]);
    }
    return fa_check_dims(ctx, name, t);
}

/* scale, softcap, causal, window, ALiBi: the same for every form. p->scale keeps the
 * caller's value (0 = default), resolved once D is known. */
static fa_status validate_scalars(fa_context *ctx, const fa_forward_args *ap, fa_problem *p)
{
    const fa_forward_args a = *ap;
    if (!isfinite(a.scale))
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "scale must be finite (0 = 1/sqrt(D)); got %g", (double)a.scale);
    if (!isfinite(a.softcap) || a.softcap < 0.0f)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "softcap must be finite and >= 0 (0 = off); got %g",
                       (double)a.softcap);
    if (a.causal != FA_CAUSAL_NONE && a.causal != FA_CAUSAL_BOTTOM_RIGHT && a.causal != FA_CAUSAL_TOP_LEFT)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "causal = %d is not an fa_causal value", (int)a.causal);
    if (a.window_left < -1 || a.window_right < -1)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "window (%lld, %lld): each side must be >= 0 or -1 (unbounded)",
                       (long long)a.window_left, (long long)a.window_right);
    if (a.alibi_slopes && a.alibi_stride_b < 0)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "alibi_stride_b must be >= 0; got %lld",
                       (long long)a.alibi_stride_b);

    p->scale = a.scale;
    p->softcap = a.softcap;
    p->causal = a.causal;
    p->window_left = a.window_left;
    p->window_right = a.window_right;
    p->alibi = a.alibi_slopes;
    p->alibi_stride_b = a.alibi_slopes ? a.alibi_stride_b : 0;
    return FA_OK;
}

fa_status fa_validate_forward(fa_context *ctx, const fa_forward_args *user, fa_problem *p)
{
    if (!user) return fa_fail(ctx, FA_ERR_NULL_POINTER, "args is NULL");
    if (user->struct_size < FA_ARGS_MIN_SIZE || user->struct_size > FA_ARGS_MAX_SIZE)
        return fa_fail(ctx, FA_ERR_STRUCT_SIZE,
                       "args->struct_size is %zu; initialise args with FA_FORWARD_ARGS_INIT (this library's is %zu)",
                       user->struct_size, sizeof(fa_forward_args));
    /* Fields the caller's header did not have take their defaults; fields a newer
     * header has and this library does not know must be zero ("off"). */
    fa_forward_args a;
    fa_forward_args_init(&a);
    size_t n = user->struct_size < sizeof a ? user->struct_size : sizeof a;
    memcpy(&a, user, n);
    a.struct_size = sizeof a;
    for (size_t off = sizeof a; off < user->struct_size; off++)
        if (((const unsigned char *)user)[off] != 0)
            return fa_fail(ctx, FA_ERR_STRUCT_SIZE,
                           "args sets a field at byte %zu that this library (%s) does not know", off,
                           fa_version_string());

    if (!a.q.data) return fa_fail(ctx, FA_ERR_NULL_POINTER, "q.data is NULL");
    if (!a.o.data) return fa_fail(ctx, FA_ERR_NULL_POINTER, "o.data is NULL");
    if (!fa_dtype_is_float(a.q.dtype))
        return fa_fail(ctx, FA_ERR_DTYPE, "q.dtype (%s) must be f32, f16 or bf16", fa_dtype_name(a.q.dtype));
    if (a.o.dtype != a.q.dtype && a.o.dtype != FA_DTYPE_F32)
        return fa_fail(ctx, FA_ERR_DTYPE, "o.dtype (%s) must be q's dtype (%s) or f32", fa_dtype_name(a.o.dtype),
                       fa_dtype_name(a.q.dtype));
    if (a.lse.data && a.lse.dtype != FA_DTYPE_F32)
        return fa_fail(ctx, FA_ERR_DTYPE, "lse.dtype (%s) must be f32", fa_dtype_name(a.lse.dtype));
    if (a.kv_cache || a.cu_seqlens_q || a.cu_seqlens_k) {
        if (a.bias.data || a.mask.data)
            return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                           "bias and mask are not accepted with a KV cache or variable lengths (their [.., Sq, Sk] "
                           "shape has no meaning when lengths differ); use causal, window, softcap or ALiBi");
        fa_status st;
        memset(p, 0, sizeof *p);
        if ((st = fa_check_dims(ctx, "q", &a.q)) != FA_OK) return st;
        if ((st = fa_check_dims(ctx, "o", &a.o)) != FA_OK) return st;
        if ((st = validate_scalars(ctx, &a, p)) != FA_OK) return st;
        return fa_validate_forms(ctx, &a, p);
    }

    if (!a.k.data) return fa_fail(ctx, FA_ERR_NULL_POINTER, "k.data is NULL");
    if (!a.v.data) return fa_fail(ctx, FA_ERR_NULL_POINTER, "v.data is NULL");
    if (a.k.dtype != a.q.dtype || a.v.dtype != a.q.dtype)
        return fa_fail(ctx, FA_ERR_DTYPE, "q, k, v must share one dtype; got %s, %s, %s", fa_dtype_name(a.q.dtype),
                       fa_dtype_name(a.k.dtype), fa_dtype_name(a.v.dtype));
    if (a.bias.data && !fa_dtype_is_float(a.bias.dtype))
        return fa_fail(ctx, FA_ERR_DTYPE, "bias.dtype (%s) must be f32, f16 or bf16", fa_dtype_name(a.bias.dtype));
    if (a.mask.data && a.mask.dtype != FA_DTYPE_BOOL)
        return fa_fail(ctx, FA_ERR_DTYPE, "mask.dtype (%s) must be bool", fa_dtype_name(a.mask.dtype));

    fa_status st;
    if ((st = fa_check_dims(ctx, "q", &a.q)) != FA_OK) return st;
    if ((st = fa_check_dims(ctx, "k", &a.k)) != FA_OK) return st;
    if ((st = fa_check_dims(ctx, "v", &a.v)) != FA_OK) return st;
    if ((st = fa_check_dims(ctx, "o", &a.o)) != FA_OK) return st;

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
    if (a.k.shape[3] != p->D)
        return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH, "head dims differ: q has D = %lld, k has %lld", (long long)p->D,
                       (long long)a.k.shape[3]);
    if (a.v.shape[1] != p->Sk || a.v.shape[2] != p->Hk)
        return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH, "k is (Sk %lld, Hk %lld) but v is (%lld, %lld)", (long long)p->Sk,
                       (long long)p->Hk, (long long)a.v.shape[1], (long long)a.v.shape[2]);
    if (a.o.shape[0] != p->B || a.o.shape[1] != p->Sq || a.o.shape[2] != p->Hq || a.o.shape[3] != p->Dv)
        return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH, "o is (%lld, %lld, %lld, %lld); it must be (B, Sq, Hq, Dv) = (%lld, %lld, %lld, %lld)",
                       (long long)a.o.shape[0], (long long)a.o.shape[1], (long long)a.o.shape[2],
                       (long long)a.o.shape[3], (long long)p->B, (long long)p->Sq, (long long)p->Hq, (long long)p->Dv);
    if (p->Hq % p->Hk != 0)
        return fa_fail(ctx, FA_ERR_HEAD_RATIO, "Hq = %lld is not a multiple of Hk = %lld", (long long)p->Hq,
                       (long long)p->Hk);
    if (a.lse.data) {
        if ((st = fa_check_dims(ctx, "lse", &a.lse)) != FA_OK) return st;
        if (a.lse.shape[0] != p->B || a.lse.shape[1] != p->Hq || a.lse.shape[2] != p->Sq || a.lse.shape[3] != 1)
            return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH, "lse is (%lld, %lld, %lld, %lld); it must be (B, Hq, Sq, 1)",
                           (long long)a.lse.shape[0], (long long)a.lse.shape[1], (long long)a.lse.shape[2],
                           (long long)a.lse.shape[3]);
    }
    const int64_t want[4] = {p->B, p->Hq, p->Sq, p->Sk};
    if (a.bias.data && (st = check_broadcast(ctx, "bias", &a.bias, want, &p->bias)) != FA_OK) return st;
    if (a.mask.data && (st = check_broadcast(ctx, "mask", &a.mask, want, &p->mask)) != FA_OK) return st;

    if ((st = validate_scalars(ctx, &a, p)) != FA_OK) return st;

    p->group = p->Hq / p->Hk;
    p->dtype = a.q.dtype;
    p->q = a.q;
    p->k = a.k;
    p->v = a.v;
    p->o = a.o;
    p->has_lse = a.lse.data != NULL;
    p->lse = a.lse;
    p->scale = a.scale != 0.0f ? a.scale : (float)(1.0 / sqrt((double)p->D));
    p->has_bias = a.bias.data != NULL;
    p->has_mask = a.mask.data != NULL;
    return FA_OK;
}
