/*
 * merge.c: merging partial attention results over disjoint key sets
 * (SEMANTICS.md, "Merging partial states"). Split-KV decoding merges its chunks
 * with fa_merge_rows; fa_merge_states offers the same formula to callers that
 * split keys themselves (across machines, ring attention, a cache plus new rows).
 */
#include "internal.h"
#include "convert.h"

#include <math.h>
#include <stdlib.h>

void fa_merge_rows(int n, const float *const *o, const float *lse, int64_t dv, float *out, float *lse_out)
{
    /* lse = m + log(sum exp(lse_i - m)) with m the largest side: no overflow, and
     * an empty side (-inf) gets weight exactly 0 */
    float m = -INFINITY;
    int nan = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(lse[i])) nan = 1;
        else if (lse[i] > m) m = lse[i];
    }
    if (nan) {
        for (int64_t e = 0; e < dv; e++) out[e] = NAN;
        *lse_out = NAN;
        return;
    }
    if (m == -INFINITY) {
        for (int64_t e = 0; e < dv; e++) out[e] = 0.0f;
        *lse_out = -INFINITY;
        return;
    }
    /* the total stays in double: rounded to float first, it would shift every
     * weight by up to ulp(|lse|) relative, which at |lse| ~ 1000 is 1e-4 */
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)lse[i] - m);
    const double total = m + log(sum);
    for (int64_t e = 0; e < dv; e++) out[e] = 0.0f;
    for (int i = 0; i < n; i++) {
        if (lse[i] == -INFINITY) continue;
        const float w = (float)exp((double)lse[i] - total);
        for (int64_t e = 0; e < dv; e++) out[e] += w * o[i][e];
    }
    *lse_out = (float)total;
}

fa_status fa_merge_states(fa_context *ctx, int n, const fa_tensor *o_parts, const fa_tensor *lse_parts, fa_tensor *o,
                          fa_tensor *lse)
{
    if (!ctx) return FA_ERR_NULL_CONTEXT;
    ctx->error[0] = '\0';
    if (n < 1) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "n is %d; merging needs at least one part", n);
    if (n > 4096) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "n is %d; at most 4096 parts", n);
    if (!o_parts || !lse_parts || !o) return fa_fail(ctx, FA_ERR_NULL_POINTER, "o_parts, lse_parts and o are required");
    if (!o->data) return fa_fail(ctx, FA_ERR_NULL_POINTER, "o.data is NULL");
    if (!fa_dtype_is_float(o->dtype)) return fa_fail(ctx, FA_ERR_DTYPE, "o.dtype (%s) must be f32, f16 or bf16", fa_dtype_name(o->dtype));
    fa_status st;
    if ((st = fa_check_dims(ctx, "o", o)) != FA_OK) return st;
    const int64_t B = o->shape[0], S = o->shape[1], H = o->shape[2], Dv = o->shape[3];
    const int has_lse = lse && lse->data;
    if (has_lse) {
        if (lse->dtype != FA_DTYPE_F32) return fa_fail(ctx, FA_ERR_DTYPE, "lse.dtype must be f32");
        if ((st = fa_check_dims(ctx, "lse", lse)) != FA_OK) return st;
        if (lse->shape[0] != B || lse->shape[1] != H || lse->shape[2] != S || lse->shape[3] != 1)
            return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH, "lse must be (B, H, S, 1) = (%lld, %lld, %lld, 1)", (long long)B,
                           (long long)H, (long long)S);
    }
    for (int i = 0; i < n; i++) {
        const fa_tensor *a = &o_parts[i], *l = &lse_parts[i];
        if (!a->data || !l->data) return fa_fail(ctx, FA_ERR_NULL_POINTER, "part %d: o or lse data is NULL", i);
        if (!fa_dtype_is_float(a->dtype)) return fa_fail(ctx, FA_ERR_DTYPE, "part %d: o dtype (%s) must be f32, f16 or bf16", i, fa_dtype_name(a->dtype));
        if (l->dtype != FA_DTYPE_F32) return fa_fail(ctx, FA_ERR_DTYPE, "part %d: lse dtype must be f32", i);
        if ((st = fa_check_dims(ctx, "o_parts[i]", a)) != FA_OK) return st;
        if ((st = fa_check_dims(ctx, "lse_parts[i]", l)) != FA_OK) return st;
        for (int d = 0; d < 4; d++)
            if (a->shape[d] != o->shape[d])
                return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH, "part %d: o.shape[%d] is %lld but the output's is %lld", i, d,
                               (long long)a->shape[d], (long long)o->shape[d]);
        if (l->shape[0] != B || l->shape[1] != H || l->shape[2] != S || l->shape[3] != 1)
            return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH, "part %d: lse must be (B, H, S, 1)", i);
    }
    /* per row: the parts' rows as f32, then the merged row; (n + 1) * Dv floats */
    int64_t floats;
    if (!fa_mul_ok((int64_t)n + 1, Dv, &floats) || !fa_add_ok(floats, 2 * (int64_t)n, &floats))
        return fa_fail(ctx, FA_ERR_OVERFLOW, "merge workspace overflows");
    float *ws = fa_workspace_alloc(floats * (int64_t)sizeof(float) + n * (int64_t)sizeof(float *));
    if (!ws) return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "cannot allocate the merge workspace");
    float *rows = ws, *merged = ws + (int64_t)n * Dv, *lses = merged + Dv;
    const float **ptrs = (const float **)(lses + 2 * (int64_t)n);
    for (int i = 0; i < n; i++) ptrs[i] = rows + (int64_t)i * Dv;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++) {
                /* read every part's row before writing: o may be one of the parts */
                for (int i = 0; i < n; i++) {
                    fa_pack_rows(&o_parts[i], b, s, 1, h, Dv, rows + (int64_t)i * Dv, Dv);
                    lses[i] = fa_load(&lse_parts[i], b, h, s, 0);
                }
                float l;
                fa_merge_rows(n, ptrs, lses, Dv, merged, &l);
                fa_store_rows(o, b, s, 1, h, Dv, merged, Dv);
                if (has_lse)
                    ((float *)lse->data)[b * lse->stride[0] + h * lse->stride[1] + s * lse->stride[2]] = l;
            }
    fa_workspace_free(ws);
    return FA_OK;
}
