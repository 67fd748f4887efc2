/*
 * avx512_kernels.h: the entry points of avx512_kernels.c and avx512bf16_kernels.c
 * (built with the AVX-512 flags), for the table files (built without them) to
 * put in the "avx512" and "avx512bf16" tables. Plain C types only: nothing here
 * needs the ISA's flags. Contracts: kernels.h.
 */
#ifndef FA_AVX512_KERNELS_H
#define FA_AVX512_KERNELS_H

#include "../kernels.h"

fa_pack_qt_fn fa_avx512_pack_qt;
/* register block 64 rows (4 zmm along r) x 6 key columns */
fa_qk_fn fa_avx512_qk_64x6;
fa_softmax_fn fa_avx512_softmax;
/* register block 6 rows x 64 output columns (4 zmm along e) */
fa_pv_fn fa_avx512_pv_6x64;
/* The backward's (kernels.h: ds, stx). ds: 64 rows (4 zmm of dvec) per pass over the columns. */
fa_ds_fn fa_avx512_ds;
/* register block 6 acc rows c x 64 columns e (4 zmm of an x row) */
fa_stx_fn fa_avx512_stx_6x64;
fa_to_f32_fn fa_avx512_f16_to_f32;
fa_to_f32_fn fa_avx512_bf16_to_f32;
void fa_avx512_sum_rows_bf16(int64_t rows, int64_t d, const uint16_t *x, int64_t ld, double *sum);
void fa_avx512_dot_rows_f64(int64_t rows, int64_t d, const float *x, int64_t ldx, const float *y, float *out);
fa_from_f32_fn fa_avx512_f32_to_f16;
fa_from_f32_fn fa_avx512_f32_to_bf16;
fa_probe_fn fa_avx512_probe_fma;
/* The small-row (decode) path, kernels.h's qk_small, softmax_small, pv_small. */
fa_qk_small_fn fa_avx512_qk_small;
fa_softmax_fn fa_avx512_softmax_small;
fa_pv_small_fn fa_avx512_pv_small;

/* The bf16 pair path (avx512bf16_kernels.c, vdpbf16ps); register blocks as the fp32 qk and pv. */
fa_pack_qt_bf16_fn fa_avx512bf16_pack_qt;
fa_qk_bf16_fn fa_avx512bf16_qk_64x6;
fa_pack_pairs_bf16_fn fa_avx512bf16_pack_pairs;
fa_pv_bf16_fn fa_avx512bf16_pv_6x64;
/* the backward's stx on bf16 x: register block 6 acc rows c x 64 columns e, as the fp32 stx */
fa_stx_bf16_fn fa_avx512bf16_stx_6x64;
fa_probe_fn fa_avx512bf16_probe;

/* avx512vnni_kernels.c (vpdpbusd; in the avx512bf16 table): kernels.h's qk_small_i8, pv_small_i8, quant_row_i8, qk_i8. */
float fa_avx512vnni_quant_row_i8(const float *x, int64_t n, int digits, int8_t *code);
void fa_avx512vnni_qk_small_i8(int64_t rows, int64_t cols, int64_t d, int digits, const int8_t *q8, int64_t ldq8,
                               const float *qscale, const void *const *krow, const float *kscale, float *s,
                               int64_t lds);
void fa_avx512vnni_qk_i8_64x6(int64_t rows, int64_t cols, int64_t d, const uint32_t *qt4, int64_t ldqt4,
                              const float *qs, const float *qc, const int8_t *k8, int64_t ldk8, const float *ks,
                              const int32_t *ksum, float *st, int64_t ldst);
void fa_avx512vnni_pv_small_i8(int64_t rows, int64_t cols, int64_t dv, int digits, const float *s, int64_t lds,
                               const void *const *vrow, const float *vscale, const float *alpha, float *acc,
                               int64_t ldacc, const fa_rows_ahead *ahead);

#endif
