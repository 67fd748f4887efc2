/*
 * convert.c: panel packing between users' tensors of any dtype and fp32. The
 * scalar f16/bf16 conversions are kernels/half.h's (exact, no F16C); the hot
 * row conversions go through the kernel table's converters, and so does the
 * split of f32 rows into bf16 terms (f32 as bf16 products).
 */
#include "convert.h"

void fa_row_to_f32(const void *row, fa_dtype dtype, int64_t sd, float scale, int64_t n, float *out)
{
    switch (dtype) {
    case FA_DTYPE_F32:
        if (sd == 1) {
            memcpy(out, row, (size_t)n * sizeof *out);
        } else {
            for (int64_t e = 0; e < n; e++) out[e] = ((const float *)row)[e * sd];
        }
        break;
    case FA_DTYPE_F16:
        for (int64_t e = 0; e < n; e++) out[e] = fa_f16_to_f32(((const uint16_t *)row)[e * sd]);
        break;
    case FA_DTYPE_BF16:
        for (int64_t e = 0; e < n; e++) out[e] = fa_bf16_to_f32(((const uint16_t *)row)[e * sd]);
        break;
    case FA_DTYPE_I8:
        for (int64_t e = 0; e < n; e++) out[e] = scale * (float)((const int8_t *)row)[e * sd];
        break;
    case FA_DTYPE_F8E4M3:
        for (int64_t e = 0; e < n; e++) out[e] = scale * fa_e4m3_to_f32(((const uint8_t *)row)[e * sd]);
        break;
    case FA_DTYPE_F8E5M2:
        for (int64_t e = 0; e < n; e++) out[e] = scale * fa_e5m2_to_f32(((const uint8_t *)row)[e * sd]);
        break;
    default:
        for (int64_t e = 0; e < n; e++) out[e] = 0.0f;
        break;
    }
}

void fa_pack_rows(const fa_tensor *t, const fa_kernels *kern, int64_t b, int64_t s0, int64_t rows, int64_t h,
                  int64_t cols, float *dst, int64_t ld)
{
    void (*cvt)(const uint16_t *, float *, int64_t) = NULL;
    if (kern && t->stride[3] == 1)
        cvt = t->dtype == FA_DTYPE_F16 ? kern->f16_to_f32 : t->dtype == FA_DTYPE_BF16 ? kern->bf16_to_f32 : NULL;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t base = b * t->stride[0] + (s0 + r) * t->stride[1] + h * t->stride[2];
        const char *row = (const char *)t->data + base * (int64_t)fa_dtype_size(t->dtype);
        if (cvt) cvt((const uint16_t *)row, dst + r * ld, cols);
        else fa_row_to_f32(row, t->dtype, t->stride[3], 1.0f, cols, dst + r * ld);
    }
}

/* One row of n to a 16-bit dtype: the table's converter on a dense row, else the
 * scalar one of half.h, which rounds the same way. */
static void store_half(uint16_t *out, int64_t sd, const float *in, int64_t n,
                       void (*dense)(const float *, uint16_t *, int64_t), uint16_t (*one)(float))
{
    if (sd == 1) dense(in, out, n);
    else
        for (int64_t c = 0; c < n; c++) out[c * sd] = one(in[c]);
}

void fa_store_rows(const fa_tensor *t, const fa_kernels *kern, int64_t b, int64_t s0, int64_t rows, int64_t h,
                   int64_t cols, const float *src, int64_t ld)
{
    const int64_t sd = t->stride[3];
    for (int64_t r = 0; r < rows; r++) {
        int64_t base = b * t->stride[0] + (s0 + r) * t->stride[1] + h * t->stride[2];
        const float *in = src + r * ld;
        switch (t->dtype) {
        case FA_DTYPE_F32: {
            float *out = (float *)t->data + base;
            if (sd == 1) memcpy(out, in, (size_t)cols * sizeof *out);
            else
                for (int64_t c = 0; c < cols; c++) out[c * sd] = in[c];
            break;
        }
        case FA_DTYPE_F16:
            store_half((uint16_t *)t->data + base, sd, in, cols, kern->f32_to_f16, fa_f32_to_f16);
            break;
        case FA_DTYPE_BF16:
            store_half((uint16_t *)t->data + base, sd, in, cols, kern->f32_to_bf16, fa_f32_to_bf16);
            break;
        default:
            break;
        }
    }
}

const float *fa_rows_f32(const fa_tensor *t, const fa_kernels *kern, int64_t b, int64_t s0, int64_t rows,
                         int64_t h, int64_t cols, float *scratch, int64_t *ld)
{
    const int64_t base = b * t->stride[0] + s0 * t->stride[1] + h * t->stride[2];
    if (t->stride[3] == 1 && t->dtype == FA_DTYPE_F32) {
        *ld = t->stride[1];
        return (const float *)t->data + base;
    }
    *ld = cols;
    fa_pack_rows(t, kern, b, s0, rows, h, cols, scratch, cols);
    return scratch;
}

const uint16_t *fa_rows_u16(const fa_tensor *t, int64_t b, int64_t s0, int64_t rows, int64_t h, int64_t cols,
                            uint16_t *scratch, int64_t *ld)
{
    const int64_t base = b * t->stride[0] + s0 * t->stride[1] + h * t->stride[2];
    const uint16_t *src = (const uint16_t *)t->data + base;
    if (t->stride[3] == 1) {
        *ld = t->stride[1];
        return src;
    }
    *ld = cols;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) scratch[r * cols + c] = src[r * t->stride[1] + c * t->stride[3]];
    return scratch;
}

int fa_rows_finite16(const uint16_t *x, int64_t ld, int64_t rows, int64_t cols, uint16_t exp_mask)
{
    uint32_t bad = 0; /* no early exit, so the loop vectorises */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) bad |= (x[r * ld + c] & exp_mask) == exp_mask;
    return !bad;
}

int fa_rows_finite(const float *x, int64_t ld, int64_t rows, int64_t cols)
{
    uint32_t bad = 0; /* no early exit, so the loop vectorises */
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * ld;
        for (int64_t c = 0; c < cols; c++) {
            uint32_t bits;
            memcpy(&bits, &row[c], sizeof bits);
            bad |= (bits & 0x7f800000u) == 0x7f800000u;
        }
    }
    return !bad;
}

/* ------------------------------------------------- f32 as bf16 products (convert.h) */

void fa_split_f32(const fa_kernels *kern, const float *x, int64_t n, uint16_t *hi, float *res)
{
    kern->f32_to_bf16(x, hi, n);
    kern->bf16_to_f32(hi, res, n);
    for (int64_t i = 0; i < n; i++) {
        const float d = x[i] - res[i];
        res[i] = d - d == 0.0f ? d : 0.0f;
    }
}

void fa_split_row(const fa_kernels *kern, int T, int lo_first, const float *x, int64_t n, uint16_t *dst, float *tmp)
{
    fa_split_f32(kern, x, n, dst, tmp);
    if (T == 1) return;
    kern->f32_to_bf16(tmp, dst + (lo_first ? n : 2 * n), n);
    memcpy(dst + (lo_first ? 2 * n : n), dst, (size_t)n * sizeof *dst);
}

void fa_split_vrows(const fa_kernels *kern, int T, const float *v, int64_t ldv, int64_t cols, int64_t dv,
                    uint16_t *hi, uint16_t *lo, float *tmp)
{
    for (int64_t c = 0; c < cols; c++) {
        fa_split_f32(kern, v + c * ldv, dv, hi + c * dv, tmp);
        if (T == 3) kern->f32_to_bf16(tmp, lo + c * dv, dv);
    }
}
