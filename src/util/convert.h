/*
 * convert.h: moving data between users' strided tensors of any dtype and the
 * fp32 panels the kernels work on, and the split of f32 operands into bf16 terms
 * (FA_PARAM_F32_MATMUL). All offsets are 64-bit.
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

/*
 * f32 as bf16 products (FA_PARAM_F32_MATMUL). Each f32 operand x is split into
 * hi = bf16(x) and lo = bf16(x - hi) (x - hi is exact in f32), and a product of two
 * f32 vectors becomes one bf16 pair product over T times their length, the terms
 * side by side along the reduction:
 *   bf16x3 (T = 3): Q rows [hi | hi | lo] . K rows [hi | lo | hi]
 *                   = Qhi.Khi + Qhi.Klo + Qlo.Khi;
 *                   P.V as three pv_bf16 calls (which round P to bf16 themselves):
 *                   P.Vhi (with alpha), then (P - bf16(P)).Vhi and P.Vlo added
 *                   = Phi.Vhi + Plo.Vhi + Phi.Vlo;
 *   bf16    (T = 1): Qhi.Khi and Phi.Vhi.
 * Only lo.lo is left out: |x - hi - lo| <= 2^-18 |x|, so each bf16x3 product is
 * within about 3 * 2^-18 < 2^-16 of the exact one (bf16: 2 * 2^-9 = 2^-8), summed in
 * fp32. NaN stays NaN (its lo is 0); an inf operand's lo is 0, and 0 * inf makes
 * the product NaN where ieee's is +-inf.
 *
 * fa_split_f32: hi = bf16(x) (nearest even), res = x - hi in f32 (0 where x or hi
 * is not finite). fa_split_row: one row of n as T * n bf16, [hi | hi | lo]
 * (lo_first 0, a Q row) or [hi | lo | hi] (lo_first 1, a K row); T = 1: [hi]; tmp
 * holds n floats. fa_split_vrows: V rows' hi parts into hi, and for T = 3 their lo
 * parts into lo (both ld dv); tmp dv floats.
 */
void fa_split_f32(const fa_kernels *kern, const float *x, int64_t n, uint16_t *hi, float *res);
/* The split pack (kv.c) reads f32 rows one at a time, a head's stride (a page or
 * more) apart: beyond the hardware prefetchers, so it fetches a few rows ahead with
 * this (bytes from p, into every cache level; a hint, nothing where the compiler has
 * none). */
static inline void fa_prefetch_row(const void *p, int64_t bytes)
{
#if defined(__GNUC__) || defined(__clang__)
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch((const char *)p + b, 0, 3);
#else
    (void)p, (void)bytes;
#endif
}
enum { FA_SPLIT_PREFETCH_ROWS = 4 }; /* rows ahead */
void fa_split_row(const fa_kernels *kern, int T, int lo_first, const float *x, int64_t n, uint16_t *dst, float *tmp);
void fa_split_vrows(const fa_kernels *kern, int T, const float *v, int64_t ldv, int64_t cols, int64_t dv,
                    uint16_t *hi, uint16_t *lo, float *tmp);

#endif
