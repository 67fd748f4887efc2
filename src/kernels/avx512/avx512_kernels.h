/*
 * avx512_kernels.h: the entry points of avx512_kernels.c and avx512bf16_kernels.c
 * (built with the AVX-512 flags), for the table files (built without them) to
 * put in the "avx512" and "avx512bf16" tables. Plain C types only: nothing here
 * needs the ISA's flags. Contracts: kernels.h.
 */
#ifndef FA_AVX512_KERNELS_H
#define FA_AVX512_KERNELS_H

#include "../kernels.h"

void fa_avx512_pack_qt(int64_t rows, int64_t d, const float *q, int64_t ldq, float scale, float *qt,
                       int64_t ldqt);
/* register block 64 rows (4 zmm along r) x 6 key columns */
void fa_avx512_qk_64x6(int64_t rows, int64_t cols, int64_t d, const float *qt, int64_t ldqt, const float *k,
                       int64_t ldk, float *st, int64_t ldst);
void fa_avx512_softmax(int64_t rows, int64_t cols, float *st, int64_t ldst, const int32_t *lo,
                       const int32_t *hi, float *m, float *l, float *alpha);
/* register block 6 rows x 64 output columns (4 zmm along e) */
void fa_avx512_pv_6x64(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const float *v,
                       int64_t ldv, const float *alpha, float *acc, int64_t ldacc);
/* The backward's (kernels.h: ds, stx). ds: 64 rows (4 zmm of dvec) per pass over the columns. */
void fa_avx512_ds(int64_t rows, int64_t cols, const float *st, int64_t ldst, float *dp, int64_t lddp,
                  const float *dvec);
/* register block 6 acc rows c x 64 columns e (4 zmm of an x row) */
void fa_avx512_stx_6x64(int64_t rows, int64_t cols, int64_t n, const float *st, int64_t ldst, const float *x,
                        int64_t ldx, float *acc, int64_t ldacc);
void fa_avx512_f16_to_f32(const uint16_t *src, float *dst, int64_t n);
void fa_avx512_bf16_to_f32(const uint16_t *src, float *dst, int64_t n);
void fa_avx512_f32_to_f16(const float *src, uint16_t *dst, int64_t n);
void fa_avx512_f32_to_bf16(const float *src, uint16_t *dst, int64_t n);
double fa_avx512_probe_fma(int64_t iters);
/* The small-row (decode) path, kernels.h's qk_small, softmax_small, pv_small. */
void fa_avx512_qk_small(int64_t rows, int64_t cols, int64_t d, const float *q, int64_t ldq, const void *const *krow,
                        int kv, const float *kscale, float *s, int64_t lds);
void fa_avx512_softmax_small(int64_t rows, int64_t cols, float *s, int64_t lds, const int32_t *lo, const int32_t *hi,
                             float *m, float *l, float *alpha);
void fa_avx512_pv_small(int64_t rows, int64_t cols, int64_t dv, const float *s, int64_t lds, const void *const *vrow,
                        int kv, const float *vscale, const float *alpha, float *acc, int64_t ldacc);

/* The bf16 pair path (avx512bf16_kernels.c, vdpbf16ps); register blocks as the fp32 qk and pv. */
void fa_avx512bf16_pack_qt(int64_t rows, int64_t d, const uint16_t *q, int64_t ldq, uint16_t *qt2, int64_t ldqt2);
void fa_avx512bf16_qk_64x6(int64_t rows, int64_t cols, int64_t d, const uint16_t *qt2, int64_t ldqt2,
                           const uint16_t *k, int64_t ldk, float scale, float *st, int64_t ldst);
void fa_avx512bf16_pack_pairs(int64_t nrows, int64_t len, const uint16_t *src, int64_t ld, uint32_t *dst,
                              int64_t ld32);
void fa_avx512bf16_pv_6x64(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const uint32_t *vp,
                           int64_t ldvp, const float *alpha, float *acc, int64_t ldacc, void *scratch);
/* the backward's stx on bf16 x: register block 6 acc rows c x 64 columns e, as the fp32 stx */
void fa_avx512bf16_stx_6x64(int64_t rows, int64_t cols, int64_t n, const float *st, int64_t ldst, const uint16_t *x,
                            int64_t ldx, float *acc, int64_t ldacc, void *scratch);
double fa_avx512bf16_probe(int64_t iters);

/* avx512vnni_kernels.c (vpdpbusd; in the avx512bf16 table): kernels.h's qk_small_i8, pv_small_i8. */
void fa_avx512vnni_qk_small_i8(int64_t rows, int64_t cols, int64_t d, int digits, const int8_t *q8, int64_t ldq8,
                               const float *qscale, const void *const *krow, const float *kscale, float *s,
                               int64_t lds);
void fa_avx512vnni_pv_small_i8(int64_t rows, int64_t cols, int64_t dv, int digits, const float *s, int64_t lds,
                               const void *const *vrow, const float *vscale, const float *alpha, float *acc,
                               int64_t ldacc);

#endif
