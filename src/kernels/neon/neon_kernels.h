/*
 * neon_kernels.h: the entry points of neon_kernels.c, for neon_table.c to put
 * in the table. Plain C types only. Contracts: kernels.h.
 */
#ifndef FA_NEON_KERNELS_H
#define FA_NEON_KERNELS_H

#include "../kernels.h"

void fa_neon_pack_qt(int64_t rows, int64_t d, const float *q, int64_t ldq, float scale, float *qt, int64_t ldqt);
/* register block 16 rows (4 vectors along r) x 4 key columns */
void fa_neon_qk_16x4(int64_t rows, int64_t cols, int64_t d, const float *qt, int64_t ldqt, const float *k,
                     int64_t ldk, float *st, int64_t ldst);
void fa_neon_softmax(int64_t rows, int64_t cols, float *st, int64_t ldst, const int32_t *lo, const int32_t *hi,
                     float *m, float *l, float *alpha);
/* register block 12 rows (3 vectors of p) x 8 output columns (2 vectors along e) */
void fa_neon_pv_12x8(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const float *v,
                     int64_t ldv, const float *alpha, float *acc, int64_t ldacc);
void fa_neon_f16_to_f32(const uint16_t *src, float *dst, int64_t n);
void fa_neon_bf16_to_f32(const uint16_t *src, float *dst, int64_t n);
void fa_neon_qk_small(int64_t rows, int64_t cols, int64_t d, const float *q, int64_t ldq, const void *const *krow,
                      int kv, const float *kscale, float *s, int64_t lds);
void fa_neon_softmax_small(int64_t rows, int64_t cols, float *s, int64_t lds, const int32_t *lo, const int32_t *hi,
                           float *m, float *l, float *alpha);
void fa_neon_pv_small(int64_t rows, int64_t cols, int64_t dv, const float *s, int64_t lds, const void *const *vrow,
                      int kv, const float *vscale, const float *alpha, float *acc, int64_t ldacc);
double fa_neon_probe_fma(int64_t iters);

#endif
