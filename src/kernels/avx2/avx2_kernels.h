/*
 * avx2_kernels.h: the entry points of avx2_kernels.c (built with -mavx2 -mfma
 * -mf16c), for avx2_table.c (built without them) to put in the table. Plain C
 * types only: nothing here needs the ISA's flags. Contracts: kernels.h.
 */
#ifndef FA_AVX2_KERNELS_H
#define FA_AVX2_KERNELS_H

#include "../kernels.h"

void fa_avx2_pack_qt(int64_t rows, int64_t d, const float *q, int64_t ldq, float scale, float *qt, int64_t ldqt);
/* register block 16 rows (2 ymm along r) x 6 key columns */
void fa_avx2_qk_16x6(int64_t rows, int64_t cols, int64_t d, const float *qt, int64_t ldqt, const float *k,
                     int64_t ldk, float *st, int64_t ldst);
void fa_avx2_softmax(int64_t rows, int64_t cols, float *st, int64_t ldst, const int32_t *lo, const int32_t *hi,
                     float *m, float *l, float *alpha);
/* register block 3 rows x 32 output columns (4 ymm along e) */
void fa_avx2_pv_3x32(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const float *v,
                     int64_t ldv, const float *alpha, float *acc, int64_t ldacc);
/* The backward's (kernels.h: ds, stx). ds: 64 rows (8 ymm of dvec) per pass over the columns. */
void fa_avx2_ds(int64_t rows, int64_t cols, const float *st, int64_t ldst, float *dp, int64_t lddp,
                const float *dvec);
/* register block 3 acc rows c x 32 columns e (4 ymm of an x row) */
void fa_avx2_stx_3x32(int64_t rows, int64_t cols, int64_t n, const float *st, int64_t ldst, const float *x,
                      int64_t ldx, float *acc, int64_t ldacc);
void fa_avx2_f16_to_f32(const uint16_t *src, float *dst, int64_t n);
void fa_avx2_bf16_to_f32(const uint16_t *src, float *dst, int64_t n);
void fa_avx2_f32_to_f16(const float *src, uint16_t *dst, int64_t n);
void fa_avx2_f32_to_bf16(const float *src, uint16_t *dst, int64_t n);
void fa_avx2_qk_small(int64_t rows, int64_t cols, int64_t d, const float *q, int64_t ldq, const void *const *krow,
                      int kv, const float *kscale, float *s, int64_t lds);
void fa_avx2_softmax_small(int64_t rows, int64_t cols, float *s, int64_t lds, const int32_t *lo, const int32_t *hi,
                           float *m, float *l, float *alpha);
void fa_avx2_pv_small(int64_t rows, int64_t cols, int64_t dv, const float *s, int64_t lds, const void *const *vrow,
                      int kv, const float *vscale, const float *alpha, float *acc, int64_t ldacc);
double fa_avx2_probe_fma(int64_t iters);

/* avx2vnni_kernels.c (AVX-VNNI; the "avx2vnni" table): kernels.h's qk_small_i8, pv_small_i8. */
void fa_avx2vnni_qk_small_i8(int64_t rows, int64_t cols, int64_t d, int digits, const int8_t *q8, int64_t ldq8,
                             const float *qscale, const void *const *krow, const float *kscale, float *s, int64_t lds);
void fa_avx2vnni_pv_small_i8(int64_t rows, int64_t cols, int64_t dv, int digits, const float *s, int64_t lds,
                             const void *const *vrow, const float *vscale, const float *alpha, float *acc,
                             int64_t ldacc);

#endif
