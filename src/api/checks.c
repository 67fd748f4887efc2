/*
 * checks.c: the checks every entry point shares, beneath the dense validator
 * (validate.c), the inference forms (sequences.c, cache.c) and the merge
 * (merge.c). Each check is written once, with one message.
 *
 * The size rule, which every check here serves: every product or sum of
 * user-given sizes, strides, offsets and windows is either checked with
 * fa_mul_ok / fa_add_ok or proven in range before anything uses it.
 *  - A tensor's dims are >= 0, its element count fits in int64, and its byte
 *    extent (the largest |offset| reachable, plus one element) fits in ptrdiff_t.
 *  - The work B*Hq*Sq*Sk*(D+Dv) fits in int64: a call whose loops could not
 *    even be counted is refused, not started.
 *  - Head dims D, Dv are at most FA_DIM_MAX (2^40): any product of a head dim with
 *    a tile size or a small count then fits, and no machine holds such a row anyway.
 *  - Positions q_start + Sq and k_start + Sk are at most FA_POSITION_MAX (2^60),
 *    so the diagonal (problem.h, fa_diag) lies within +-2^62.
 *  - A window side of FA_WINDOW_HUGE (2^62) or more covers every position
 *    difference: it is clamped to "unbounded" here, so that diag +- window can
 *    never overflow in fa_row_band.
 * After these checks the core may compute any index of the form
 * b*stride[0] + s*stride[1] + h*stride[2] + d*stride[3] for in-range
 * coordinates, and any diag +- window, without overflow.
 */
#include "checks.h"
#include "alloc.h"
#include "arith.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#define FA_STRUCT_MAX_SIZE 4096 /* a struct_size beyond this is garbage, not a future header */

fa_status fa_read_struct(fa_context *ctx, const char *name, const void *user, size_t user_size, void *dst,
                         size_t lib_size, size_t min_size)
{
    if (user_size < min_size || user_size > FA_STRUCT_MAX_SIZE)
        return fa_fail(ctx, FA_ERR_STRUCT_SIZE,
                       "%s->struct_size is %zu; initialise it with its _INIT macro (this library's is %zu)", name,
                       user_size, lib_size);
    /* dst holds the defaults: fields the caller's header lacked keep them */
    memcpy(dst, user, user_size < lib_size ? user_size : lib_size);
    *(size_t *)dst = lib_size;
    /* fields of a newer header that this library does not know must be "off" */
    for (size_t off = lib_size; off < user_size; off++)
        if (((const unsigned char *)user)[off] != 0)
            return fa_fail(ctx, FA_ERR_STRUCT_SIZE, "%s sets a field at byte %zu that this library (%s) does not know",
                           name, off, fa_version_string());
    return FA_OK;
}

fa_status fa_struct_read(fa_context *ctx, const char *name, const void *user, void *dst, size_t lib_size,
                         size_t min_size)
{
    if (ctx && !fa_context_enter(ctx)) return FA_ERR_BUSY;
    if (!name) name = "a struct";
    fa_status st;
    if (!user || !dst)
        st = fa_fail(ctx, FA_ERR_NULL_POINTER, "%s is NULL", user ? "the destination" : name);
    else if (lib_size < sizeof(size_t) || min_size > lib_size)
        st = fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: lib_size %zu and min_size %zu describe no struct", name,
                     lib_size, min_size);
    else
        st = fa_read_struct(ctx, name, user, *(const size_t *)user, dst, lib_size, min_size);
    if (ctx) fa_context_leave(ctx);
    return st;
}

int64_t fa_tensor_count(const fa_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < 4; d++)
        if (!fa_mul_ok(n, t->shape[d], &n)) return -1;
    return n;
}

fa_status fa_check_tensor(fa_context *ctx, const char *name, const fa_tensor *t)
{
    int empty = 0;
    for (int d = 0; d < 4; d++) {
        if (t->shape[d] < 0)
            return fa_fail(ctx, FA_ERR_INVALID_DIM, "%s.shape[%d] is %lld; dimensions must be >= 0", name, d,
                           (long long)t->shape[d]);
        empty |= t->shape[d] == 0;
    }
    if (empty) return FA_OK; /* no element is ever addressed: strides are never used */
    if (fa_tensor_count(t) < 0)
        return fa_fail(ctx, FA_ERR_OVERFLOW, "%s: its element count overflows 64 bits", name);
    /* the extent: |sum (shape-1)*stride| at most, plus the element itself, in bytes */
    int64_t span = 0;
    for (int d = 0; d < 4; d++) {
        const int64_t st = t->stride[d];
        if (st == INT64_MIN) return fa_fail(ctx, FA_ERR_OVERFLOW, "%s.stride[%d] overflows", name, d);
        int64_t term;
        if (!fa_mul_ok(t->shape[d] - 1, st < 0 ? -st : st, &term) || !fa_add_ok(span, term, &span))
            return fa_fail(ctx, FA_ERR_OVERFLOW, "%s: shape times strides overflows 64 bits", name);
    }
    const int64_t es = (int64_t)fa_dtype_size(t->dtype);
    int64_t bytes;
    if (!fa_mul_ok(span, es, &bytes) || !fa_add_ok(bytes, es, &bytes) || (uint64_t)bytes > (uint64_t)PTRDIFF_MAX)
        return fa_fail(ctx, FA_ERR_OVERFLOW, "%s: its byte extent overflows", name);
    return FA_OK;
}

fa_tensor fa_tensor_canonical(fa_tensor t)
{
    int empty = 0;
    for (int d = 0; d < 4; d++) empty |= t.shape[d] == 0;
    for (int d = 0; d < 4; d++)
        if (empty || t.shape[d] == 1) t.stride[d] = 0;
    return t;
}

fa_status fa_check_data(fa_context *ctx, const char *name, const fa_tensor *t)
{
    if (!t->data && fa_tensor_count(t) != 0) return fa_fail(ctx, FA_ERR_NULL_POINTER, "%s.data is NULL", name);
    return FA_OK;
}

fa_status fa_check_shape(fa_context *ctx, const char *name, const fa_tensor *t, int64_t d0, int64_t d1, int64_t d2,
                         int64_t d3)
{
    const int64_t want[4] = {d0, d1, d2, d3};
    for (int d = 0; d < 4; d++)
        if (want[d] >= 0 && t->shape[d] != want[d])
            return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH, "%s.shape[%d] is %lld; it must be %lld", name, d,
                           (long long)t->shape[d], (long long)want[d]);
    return FA_OK;
}

fa_status fa_check_broadcast(fa_context *ctx, const char *name, const fa_tensor *t, const int64_t want[4],
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
    *out = fa_tensor_canonical(*out);
    return fa_check_tensor(ctx, name, t);
}

fa_status fa_check_cu(fa_context *ctx, const char *name, const int32_t *cu, int64_t n, int64_t len)
{
    if (cu[0] < 0) return fa_fail(ctx, FA_ERR_OUT_OF_RANGE, "%s[0] is %d; it must be >= 0", name, cu[0]);
    for (int64_t b = 0; b < n; b++)
        if (cu[b + 1] < cu[b])
            return fa_fail(ctx, FA_ERR_OUT_OF_RANGE, "%s is not non-decreasing: [%lld] = %d > [%lld] = %d", name,
                           (long long)b, cu[b], (long long)b + 1, cu[b + 1]);
    if (cu[n] > len)
        return fa_fail(ctx, FA_ERR_OUT_OF_RANGE, "%s[%lld] = %d is past the %lld packed rows", name, (long long)n,
                       cu[n], (long long)len);
    return FA_OK;
}

fa_status fa_check_kv_inputs(fa_context *ctx, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v)
{
    fa_status st;
    if ((st = fa_check_data(ctx, "k", k)) != FA_OK || (st = fa_check_data(ctx, "v", v)) != FA_OK) return st;
    if (k->dtype != q->dtype || v->dtype != q->dtype)
        return fa_fail(ctx, FA_ERR_DTYPE, "q, k, v must share one dtype; got %s, %s, %s", fa_dtype_name(q->dtype),
                       fa_dtype_name(k->dtype), fa_dtype_name(v->dtype));
    if ((st = fa_check_tensor(ctx, "k", k)) != FA_OK) return st;
    return fa_check_tensor(ctx, "v", v);
}

fa_status fa_check_heads(fa_context *ctx, int64_t D, int64_t kD, int64_t Hq, int64_t Hk)
{
    if (kD != D)
        return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH, "head dims differ: q has D = %lld, k has %lld", (long long)D,
                       (long long)kD);
    if (D == 0)
        return fa_fail(ctx, FA_ERR_INVALID_DIM, "D = 0: q and k have no features, so there are no scores (and the "
                                                "default scale 1/sqrt(D) has no value)");
    if (Hk == 0 && Hq > 0)
        return fa_fail(ctx, FA_ERR_INVALID_DIM, "Hk = 0 but Hq = %lld: query heads need kv heads to read",
                       (long long)Hq);
    if (Hk > 0 && Hq % Hk != 0)
        return fa_fail(ctx, FA_ERR_HEAD_RATIO, "Hq = %lld is not a multiple of Hk = %lld", (long long)Hq,
                       (long long)Hk);
    return FA_OK;
}

fa_status fa_check_lse(fa_context *ctx, const fa_tensor *lse, int64_t B, int64_t H, int64_t S)
{
    if (lse->dtype != FA_DTYPE_F32)
        return fa_fail(ctx, FA_ERR_DTYPE, "lse.dtype (%s) must be f32", fa_dtype_name(lse->dtype));
    fa_status st;
    if ((st = fa_check_tensor(ctx, "lse", lse)) != FA_OK) return st;
    if (lse->shape[0] != B || lse->shape[1] != H || lse->shape[2] != S || lse->shape[3] != 1)
        return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH, "lse is (%lld, %lld, %lld, %lld); it must be (B, H, S, 1) = (%lld, %lld, %lld, 1)",
                       (long long)lse->shape[0], (long long)lse->shape[1], (long long)lse->shape[2],
                       (long long)lse->shape[3], (long long)B, (long long)H, (long long)S);
    return FA_OK;
}

/* A window side the caller gave, as the band uses it: FA_WINDOW_HUGE or more reaches
 * every key from every row, which is what "unbounded" (-1) says. */
static int64_t clamp_window(int64_t w) { return w >= FA_WINDOW_HUGE ? FA_WINDOW_UNBOUNDED : w; }

fa_status fa_check_scalars(fa_context *ctx, const fa_forward_args *a, fa_problem *p)
{
    if (!isfinite(a->scale))
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "scale must be finite (0 = 1/sqrt(D)); got %g", (double)a->scale);
    if (!isfinite(a->softcap) || a->softcap < 0.0f)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "softcap must be finite and >= 0 (0 = off); got %g",
                       (double)a->softcap);
    if (a->causal != FA_CAUSAL_NONE && a->causal != FA_CAUSAL_BOTTOM_RIGHT && a->causal != FA_CAUSAL_TOP_LEFT)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "causal = %d is not an fa_causal value", (int)a->causal);
    if (a->window_left < -1 || a->window_right < -1)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "window (%lld, %lld): each side must be >= 0 or -1 (unbounded)",
                       (long long)a->window_left, (long long)a->window_right);
    if (a->alibi_slopes && a->alibi_stride_b < 0)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "alibi_stride_b must be >= 0; got %lld",
                       (long long)a->alibi_stride_b);
    if (!(a->dropout_p >= 0.0f && a->dropout_p < 1.0f))
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "dropout_p must lie in [0, 1); got %g", (double)a->dropout_p);
    if (a->q_start < 0 || a->q_start > FA_POSITION_MAX || a->k_start < 0 || a->k_start > FA_POSITION_MAX)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "q_start = %lld, k_start = %lld: positions lie in [0, 2^60]",
                       (long long)a->q_start, (long long)a->k_start);
    if (a->kv_splits < 0 || a->kv_splits > FA_MAX_KV_SPLITS)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_splits = %lld: 0 (the context's) or 1..%d",
                       (long long)a->kv_splits, FA_MAX_KV_SPLITS);
    if (a->quant_matmul < -1 || a->quant_matmul > FA_QUANT_MATMUL_I8X2)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "quant_matmul = %d: -1 (the context's), 0 exact, 1 i8 or 2 i8x2",
                       (int)a->quant_matmul);
    if (a->f32_matmul < -1 || a->f32_matmul > FA_F32_MATMUL_BF16)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "f32_matmul = %d: -1 (the context's), 0 ieee, 1 bf16x3 or 2 bf16",
                       (int)a->f32_matmul);

    p->scale = a->scale;
    p->softcap = a->softcap;
    p->causal = a->causal;
    p->window_left = clamp_window(a->window_left);
    p->window_right = clamp_window(a->window_right);
    p->alibi = a->alibi_slopes;
    p->alibi_stride_b = a->alibi_slopes ? a->alibi_stride_b : 0;
    p->q_start = a->q_start;
    p->k_start = a->k_start;
    p->quant_matmul = a->quant_matmul >= 0 ? (int)a->quant_matmul : (int)ctx->set.quant_matmul;
    p->f32_matmul = a->f32_matmul >= 0 ? (int)a->f32_matmul : (int)ctx->set.f32_matmul;
    fa_dropout_init(&p->drop, a->dropout_p, a->dropout_seed, a->dropout_offset);
    return FA_OK;
}

fa_status fa_check_sinks(fa_context *ctx, const fa_forward_args *a, fa_problem *p)
{
    p->sinks = a->sinks;
    /* the caller provides Hq of them: read only when given; +inf would take the whole
     * softmax and leave o = 0 * (inf - inf) undefined, so it is refused */
    for (int64_t h = 0; a->sinks && h < p->Hq; h++)
        if (a->sinks[h] == INFINITY)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "sinks[%lld] is +inf; a sink is a finite logit, -inf (none) or NaN",
                           (long long)h);
    return FA_OK;
}

fa_status fa_check_extents(fa_context *ctx, const fa_problem *p)
{
    /* positions: the longest sequences (p->Sq, p->Sk hold them for every form) */
    if (p->Sq > FA_POSITION_MAX - p->q_start || p->Sk > FA_POSITION_MAX - p->k_start)
        return fa_fail(ctx, FA_ERR_OVERFLOW, "positions q_start + Sq = %lld + %lld or k_start + Sk = %lld + %lld exceed 2^60",
                       (long long)p->q_start, (long long)p->Sq, (long long)p->k_start, (long long)p->Sk);
    if (p->D > FA_DIM_MAX || p->Dv > FA_DIM_MAX)
        return fa_fail(ctx, FA_ERR_OVERFLOW, "head dims D = %lld, Dv = %lld: at most 2^40 (no workspace holds a row of more)",
                       (long long)p->D, (long long)p->Dv);
    int64_t work = 1, dsum;
    if (!fa_add_ok(p->D, p->Dv, &dsum)) return fa_fail(ctx, FA_ERR_OVERFLOW, "D + Dv overflows 64 bits");
    const int64_t dims[5] = {p->B, p->Hq, p->Sq, p->Sk, dsum};
    for (int d = 0; d < 5; d++)
        if (!fa_mul_ok(work, dims[d], &work))
            return fa_fail(ctx, FA_ERR_OVERFLOW,
                           "the work B*Hq*Sq*Sk*(D+Dv) = %lld*%lld*%lld*%lld*%lld overflows 64 bits", (long long)p->B,
                           (long long)p->Hq, (long long)p->Sq, (long long)p->Sk, (long long)dsum);
    return FA_OK;
}

/* ------------------------------------------------------------ block mask */

/* Fields up to and including n_partial are required of every caller's fa_block_mask. */
#define FA_BLOCK_MASK_MIN_SIZE (offsetof(fa_block_mask, n_partial) + sizeof(int64_t))
#define FA_BLOCK_SIDE_MAX ((int64_t)1 << 31)

/* Where mask row r sits, for messages: (b, h, qb). */
static void bmask_row_name(const fa_block_mask *m, int64_t r, int64_t *b, int64_t *h, int64_t *qb)
{
    *qb = m->q_blocks > 0 ? r % m->q_blocks : 0;
    r = m->q_blocks > 0 ? r / m->q_blocks : 0;
    *h = r % m->heads;
    *b = r / m->heads;
}

/* The entries of every mask row: kv block indices in range and each at most once per
 * row, element-mask numbers in range; kv_blocks non-NULL where there are entries. */
static fa_status check_bmask_entries(fa_context *ctx, const fa_block_mask *m, int64_t rows, int64_t nkb)
{
    const int64_t entries = m->offsets[rows];
    if (entries > 0 && !m->kv_blocks)
        return fa_fail(ctx, FA_ERR_NULL_POINTER, "block_mask->kv_blocks is NULL but the mask has %lld entries",
                       (long long)entries);
    /* one bit per kv block, set while a row's entries are walked and cleared after */
    uint8_t *seen = entries > 0 ? fa_calloc((nkb + 7) / 8, 1) : NULL;
    if (entries > 0 && !seen)
        return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "block_mask: cannot allocate the duplicate check (%lld bits)", (long long)nkb);
    fa_status st = FA_OK;
    for (int64_t r = 0; r < rows && st == FA_OK; r++) {
        int64_t e = m->offsets[r];
        for (; e < m->offsets[r + 1]; e++) {
            const int64_t kb = m->kv_blocks[e], pe = m->partial ? m->partial[e] : -1;
            int64_t b, h, qb;
            bmask_row_name(m, r, &b, &h, &qb);
            if (kb < 0 || kb >= nkb) {
                st = fa_fail(ctx, FA_ERR_OUT_OF_RANGE,
                             "block_mask->kv_blocks[%lld] is %lld (row b %lld, h %lld, q block %lld); it must lie in "
                             "[0, ceil(Sk / block_k)) = [0, %lld)",
                             (long long)e, (long long)kb, (long long)b, (long long)h, (long long)qb, (long long)nkb);
                break;
            }
            if (pe < -1 || pe >= m->n_partial) {
                st = fa_fail(ctx, FA_ERR_OUT_OF_RANGE,
                             "block_mask->partial[%lld] is %lld; it must be -1 (full) or lie in [0, n_partial) = [0, %lld)",
                             (long long)e, (long long)pe, (long long)m->n_partial);
                break;
            }
            if (seen[kb / 8] & (1u << (kb % 8))) {
                st = fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                             "block_mask lists kv block %lld twice in row b %lld, h %lld, q block %lld (entry %lld)",
                             (long long)kb, (long long)b, (long long)h, (long long)qb, (long long)e);
                break;
            }
            seen[kb / 8] |= (uint8_t)(1u << (kb % 8));
        }
        for (int64_t x = m->offsets[r]; x < e; x++) seen[m->kv_blocks[x] / 8] = 0; /* every entry before e is in range */
    }
    fa_free(seen);
    return st;
}

fa_status fa_check_block_mask(fa_context *ctx, const fa_forward_args *a, fa_problem *p)
{
    memset(&p->bm, 0, sizeof p->bm);
    if (!a->block_mask) return FA_OK;
    fa_block_mask m;
    fa_block_mask_init(&m);
    fa_status st = fa_read_struct(ctx, "block_mask", a->block_mask, a->block_mask->struct_size, &m, sizeof m,
                                  FA_BLOCK_MASK_MIN_SIZE);
    if (st != FA_OK) return st;
    if (m.block_q < 1 || m.block_q >= FA_BLOCK_SIDE_MAX || m.block_k < 1 || m.block_k >= FA_BLOCK_SIDE_MAX)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "block_mask: block_q = %lld and block_k = %lld must lie in [1, 2^31)",
                       (long long)m.block_q, (long long)m.block_k);
    if (m.batch != 1 && m.batch != p->B)
        return fa_fail(ctx, FA_ERR_BROADCAST, "block_mask->batch is %lld; it must be 1 or B = %lld", (long long)m.batch,
                       (long long)p->B);
    if (m.heads != 1 && m.heads != p->Hq)
        return fa_fail(ctx, FA_ERR_BROADCAST, "block_mask->heads is %lld; it must be 1 or Hq = %lld", (long long)m.heads,
                       (long long)p->Hq);
    const int64_t nqb = (p->Sq + m.block_q - 1) / m.block_q, nkb = (p->Sk + m.block_k - 1) / m.block_k;
    if (m.q_blocks != nqb)
        return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH,
                       "block_mask->q_blocks is %lld; it must be ceil(Sq / block_q) = ceil(%lld / %lld) = %lld",
                       (long long)m.q_blocks, (long long)p->Sq, (long long)m.block_q, (long long)nqb);
    if (m.n_partial < 0)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "block_mask->n_partial is %lld; it must be >= 0", (long long)m.n_partial);
    const int64_t row_bytes = (m.block_k + 7) / 8;
    int64_t block_bytes, bits_bytes, rows;
    if (!fa_mul_ok(m.block_q, row_bytes, &block_bytes) || !fa_mul_ok(block_bytes, m.n_partial, &bits_bytes))
        return fa_fail(ctx, FA_ERR_OVERFLOW, "block_mask: %lld element masks of %lld x %lld bits overflow 64 bits",
                       (long long)m.n_partial, (long long)m.block_q, (long long)m.block_k);
    if (!fa_mul_ok(m.batch, m.heads, &rows) || !fa_mul_ok(rows, nqb, &rows) || rows == INT64_MAX)
        return fa_fail(ctx, FA_ERR_OVERFLOW, "block_mask: batch * heads * q_blocks overflows");
    if (!m.offsets) return fa_fail(ctx, FA_ERR_NULL_POINTER, "block_mask->offsets is NULL (it has %lld + 1 entries)", (long long)rows);
    if (m.n_partial > 0 && !m.bits)
        return fa_fail(ctx, FA_ERR_NULL_POINTER, "block_mask->bits is NULL but n_partial is %lld", (long long)m.n_partial);
    if (m.offsets[0] != 0)
        return fa_fail(ctx, FA_ERR_OUT_OF_RANGE, "block_mask->offsets[0] is %lld; it must be 0", (long long)m.offsets[0]);
    for (int64_t r = 0; r < rows; r++)
        if (m.offsets[r + 1] < m.offsets[r]) {
            int64_t b, h, qb;
            bmask_row_name(&m, r, &b, &h, &qb);
            return fa_fail(ctx, FA_ERR_OUT_OF_RANGE,
                           "block_mask->offsets decrease at row %lld (b %lld, h %lld, q block %lld): %lld then %lld",
                           (long long)r, (long long)b, (long long)h, (long long)qb, (long long)m.offsets[r],
                           (long long)m.offsets[r + 1]);
        }
    if ((st = check_bmask_entries(ctx, &m, rows, nkb)) != FA_OK) return st;
    fa_bmask *bm = &p->bm;
    bm->on = 1;
    bm->bq = m.block_q;
    bm->bk = m.block_k;
    bm->nqb = nqb;
    bm->nkb = nkb;
    bm->row_h = m.heads > 1 ? nqb : 0;
    bm->row_b = m.batch > 1 ? m.heads * nqb : 0;
    bm->offsets = m.offsets;
    bm->idx = m.kv_blocks;
    bm->partial = m.partial;
    bm->bits = m.bits;
    bm->row_bytes = row_bytes;
    bm->block_bytes = block_bytes;
    return FA_OK;
}
