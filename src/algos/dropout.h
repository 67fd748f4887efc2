/*
 * dropout.h: the dropout mask of docs/semantics.md (section 6), bit for bit:
 * Philox4x32-10 keyed by the caller's seed, one counter per four key columns,
 * so the mask depends on (b, h, i, j, seed, offset) alone, never on tiling,
 * threads or ISA. Forward and backward both draw it from here.
 */
#ifndef FA_DROPOUT_H
#define FA_DROPOUT_H

#include <stdint.h>

/* One Philox4x32-10 call: counter c[4], key k[2] -> out[4]. */
void fa_philox4x32_10(const uint32_t c[4], const uint32_t k[2], uint32_t out[4]);

typedef struct fa_dropout {
    int on;               /* dropout_p > 0 */
    uint32_t key[2];      /* (seed mod 2^32, seed >> 32) */
    uint32_t offset;      /* the caller's call counter */
    uint64_t threshold;   /* keep iff word < threshold; up to 2^32 */
    float scale;          /* 1 / (1 - dropout_p) */
} fa_dropout;

void fa_dropout_init(fa_dropout *d, float dropout_p, uint64_t seed, uint32_t offset);

/* The keep bit of one element (b, h, i, j): 0 or 1. */
int fa_dropout_keep(const fa_dropout *d, int64_t b, int64_t h, int64_t Hq, int64_t i, int64_t j);

/* Keep bits of row i, columns j0 .. j0+n-1, of (b, h) with Hq heads: keep[c] = 0 or 1.
 * i and j are positions (the call's q_start/k_start added). */
void fa_dropout_row(const fa_dropout *d, int64_t b, int64_t h, int64_t Hq, int64_t i, int64_t j0, int64_t n,
                    uint8_t *keep);

/* Multiplies a transposed tile st[c][r] (rows i0.., columns j0..) by keep/pk. */
void fa_dropout_tile_t(const fa_dropout *d, int64_t b, int64_t h, int64_t Hq, int64_t i0, int64_t rows, int64_t j0,
                       int64_t cols, float *st, int64_t ldst);

#endif
