/*
 * convert.h: moving data between users' strided tensors of any dtype and the
 * fp32 panels the kernels work on. All offsets are 64-bit.
 */
#ifndef FA_CONVERT_H
#define FA_CONVERT_H

#include "flashattn.h"
#include "kernels/half.h" /* fa_f16_to_f32, fa_f32_to_f16, fa_bf16_to_f32, fa_f32_to_bf16 */
#include "kernels/kernels.h"

#include <stdint.h>
#include <string.h>

/* Element (i0, i1, i2, i3) of t as f32 (bool gives 0 or 1). */
static inline float fa_load(const fa_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    int64_t off = i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2] + i3 * t->stride[3];
    switch (t->dtype) {
    case FA_DTYPE_F32: return ((const float *)t->data)[off];
    case FA_DTYPE_F16: return fa_f16_to_f32(((const uint16_t *)t->data)[off]);
    case FA_DTYPE_BF16: return fa_bf16_to_f32(((const uint16_t *)t->data)[off]);
    case FA_DTYPE_BOOL: return ((const unsigned char *)t->data)[off] ? 1.0f : 0.0f;
    case FA_DTYPE_I8: return (float)((const signed char *)t->data)[off];
    case FA_DTYPE_F8E4M3: return fa_e4m3_to_f32(((const uint8_t *)t->data)[off]);
    case FA_DTYPE_F8E5M2: return fa_e5m2_to_f32(((const uint8_t *)t->data)[off]);
    }
    return 0.0f;
}

/* n elements of one row of any dtype (inner stride sd) as f32; i8 and fp8 values
 * are multiplied by scale (the row's dequantisation scale), other dtypes ignore it. */
void fa_row_to_f32(const void *row, fa_dtype dtype, int64_t sd, float scale, int64_t n, float *out);

/* Rows s0 .. s0+rows-1 of (b, :, h, 0..cols-1) as f32, written to dst[r*ld + c]
 * (always a copy). kern: its row converters for f16/bf16 rows of unit stride (the same
 * bits as half.h's); NULL: half.h's scalar ones. */
void fa_pack_rows(const fa_tensor *t, const fa_kernels *kern, int64_t b, int64_t s0, int64_t rows, int64_t h,
                  int64_t cols, float *dst, int64_t ld);
/*
 * The same rows as f32 for a kernel: a pointer into the tensor itself when it is
 * f32 with unit stride along the last axis (no copy at all), otherwise converted
 * into scratch (rows * cols floats) with the ISA's row converters. *ld receives
 * the distance between rows in floats.
 */
const float *fa_rows_f32(const fa_tensor *t, const fa_kernels *kern, int64_t b, int64_t s0, int64_t rows,
                         int64_t h, int64_t cols, float *scratch, int64_t *ld);

/* The same for 16-bit data kept as it is (the bf16 dot-product path): a pointer
 * into the tensor when its inner stride is 1, else gathered into scratch. */
const uint16_t *fa_rows_u16(const fa_tensor *t, int64_t b, int64_t s0, int64_t rows, int64_t h, int64_t cols,
                            uint16_t *scratch, int64_t *ld);

/* 1 when no element of the rows x cols block is inf or NaN: decides whether a
 * vector pv (which multiplies masked p = 0 by v) may run on a V tile. */
int fa_rows_finite(const float *x, int64_t ld, int64_t rows, int64_t cols);
/* The same for f16 (exp_mask 0x7c00) or bf16 (0x7f80) data kept as it is. */
int fa_rows_finite16(const uint16_t *x, int64_t ld, int64_t rows, int64_t cols, uint16_t exp_mask);

/* The inverse of pack_rows for an output tensor: rounds to its dtype (with kern's
 * row converters where the row is contiguous; the bits are the same either way). */
void fa_store_rows(const fa_tensor *t, const fa_kernels *kern, int64_t b, int64_t s0, int64_t rows, int64_t h,
                   int64_t cols, const float *src, int64_t ld);

#endif
