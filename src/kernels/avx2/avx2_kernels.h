/*
 * avx2_kernels.h: the entry points of avx2_kernels.c (built with -mavx2 -mfma
 * -mf16c), for avx2_table.c (built without them) to put in the table. Plain C
 * types only: nothing here needs the ISA's flags. Contracts: kernels.h.
 */
#ifndef FA_AVX2_KERNELS_H
#define FA_AVX2_KERNELS_H

#include "../kernels.h"

fa_pack_qt_fn fa_avx2_pack_qt;
/* register block 16 rows (2 ymm along r) x 6 key columns */
fa_qk_fn fa_avx2_qk_16x6;
fa_softmax_fn fa_avx2_softmax;
/* register block 3 rows x 32 output columns (4 ymm along e) */
fa_pv_fn fa_avx2_pv_3x32;
/* The backward's (kernels.h: ds, stx). ds: 64 rows (8 ymm of dvec) per pass over the columns. */
fa_ds_fn fa_avx2_ds;
/* register block 3 acc rows c x 32 columns e (4 ymm of an x row) */
fa_stx_fn fa_avx2_stx_3x32;
fa_to_f32_fn fa_avx2_f16_to_f32;
fa_to_f32_fn fa_avx2_bf16_to_f32;
fa_from_f32_fn fa_avx2_f32_to_f16;
fa_from_f32_fn fa_avx2_f32_to_bf16;
fa_qk_small_fn fa_avx2_qk_small;
fa_softmax_fn fa_avx2_softmax_small;
fa_pv_small_fn fa_avx2_pv_small;
fa_probe_fn fa_avx2_probe_fma;

/* avx2vnni_kernels.c (AVX-VNNI; the "avx2vnni" table): kernels.h's qk_small_i8, pv_small_i8. */
void fa_avx2vnni_qk_small_i8(int64_t rows, int64_t cols, int64_t d, int digits, const int8_t *q8, int64_t ldq8,
                             const float *qscale, const void *const *krow, const float *kscale, float *s, int64_t lds);
void fa_avx2vnni_pv_small_i8(int64_t rows, int64_t cols, int64_t dv, int digits, const float *s, int64_t lds,
                             const void *const *vrow, const float *vscale, const float *alpha, float *acc,
                             int64_t ldacc, const fa_rows_ahead *ahead);

#endif
