/*
 * amx_model.h: what the tile model (amx_model.c) offers beyond amx_tile.h, for its
 * own tests only: a view of a tile's raw 16 x 64 bytes (to see the zeroing the
 * instructions do outside the configured shape, which no instruction can read) and
 * the model's single fp32 operation. Kernels use amx_tile.h alone.
 */
#ifndef FA_KERNELS_AMX_MODEL_H
#define FA_KERNELS_AMX_MODEL_H

#include <stdint.h>

#include "amx_tile.h"

/* Copies tile t's whole storage (16 rows of 64 bytes, row-major) of the calling
 * thread into out; zeros when unconfigured. Not an instruction: no fault bits;
 * returns 0 for t outside 0..7 (out untouched), 1 otherwise. */
int fa_tm_peek(int t, uint8_t out[FA_TILE_MAX_ROWS * FA_TILE_MAX_COLSB]);

/* The one fp32 operation TDPBF16PS is made of, on bit patterns: a * b + c rounded
 * once to nearest even, fp32 denormal inputs read as zero (DAZ), a result that is
 * tiny after rounding flushed to a zero of its sign (FTZ), NaN rules as in
 * amx_model.c. fa_tm_fma32(x, 1.0f, y) is x + y. */
uint32_t fa_tm_fma32(uint32_t a, uint32_t b, uint32_t c);

#endif
