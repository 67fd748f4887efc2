/*
 * neon_kernels.h: the entry points of neon_kernels.c, for neon_table.c to put
 * in the table. Plain C types only. Contracts: kernels.h.
 */
#ifndef FA_NEON_KERNELS_H
#define FA_NEON_KERNELS_H

#include "../kernels.h"

fa_pack_qt_fn fa_neon_pack_qt;
/* register block 16 rows (4 vectors along r) x 4 key columns */
fa_qk_fn fa_neon_qk_16x4;
fa_softmax_fn fa_neon_softmax;
/* register block 12 rows (3 vectors of p) x 8 output columns (2 vectors along e) */
fa_pv_fn fa_neon_pv_12x8;
/* The backward's (kernels.h: ds, stx). */
fa_ds_fn fa_neon_ds;
/* register block 8 acc rows c x 8 columns e (2 vectors of an x row) */
fa_stx_fn fa_neon_stx_8x8;
fa_to_f32_fn fa_neon_f16_to_f32;
fa_to_f32_fn fa_neon_bf16_to_f32;
fa_qk_small_fn fa_neon_qk_small;
fa_softmax_fn fa_neon_softmax_small;
fa_pv_small_fn fa_neon_pv_small;
fa_probe_fn fa_neon_probe_fma;

#endif
