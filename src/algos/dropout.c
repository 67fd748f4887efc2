/*
 * dropout.c: see dropout.h. The generator follows Salmon et al. (SC'11) as
 * docs/semantics.md fixes it; the known-answer vectors there are tested in
 * tests/test_dropout.c against an implementation of the test's own.
 */
#include "dropout.h"

#include <math.h>

void fa_philox4x32_10(const uint32_t c_in[4], const uint32_t k_in[2], uint32_t out[4])
{
    uint32_t c0 = c_in[0], c1 = c_in[1], c2 = c_in[2], c3 = c_in[3], k0 = k_in[0], k1 = k_in[1];
    for (int round = 0; round < 10; round++) {
        if (round > 0) { /* the key is bumped before rounds 2 to 10 */
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

void fa_dropout_init(fa_dropout *d, float dropout_p, uint64_t seed, uint32_t offset)
{
    d->on = dropout_p > 0.0f;
    d->key[0] = (uint32_t)seed;
    d->key[1] = (uint32_t)(seed >> 32);
    d->offset = offset;
    const double pk = 1.0 - (double)dropout_p;
    d->threshold = (uint64_t)floor(pk * 4294967296.0);
    d->scale = d->on ? (float)(1.0 / pk) : 1.0f;
}

int fa_dropout_keep(const fa_dropout *d, int64_t b, int64_t h, int64_t Hq, int64_t i, int64_t j)
{
    uint8_t keep;
    fa_dropout_row(d, b, h, Hq, i, j, 1, &keep);
    return keep;
}

void fa_dropout_row(const fa_dropout *d, int64_t b, int64_t h, int64_t Hq, int64_t i, int64_t j0, int64_t n,
                    uint8_t *keep)
{
    const uint32_t c1 = (uint32_t)i, c2 = (uint32_t)(b * Hq + h); /* mod 2^32, as the rule says */
    uint32_t words[4];
    int64_t have = -1; /* the counter block words[] holds */
    for (int64_t c = 0; c < n; c++) {
        const int64_t j = j0 + c;
        if (j / 4 != have) {
            have = j / 4;
            const uint32_t ctr[4] = {(uint32_t)have, c1, c2, d->offset};
            fa_philox4x32_10(ctr, d->key, words);
        }
        keep[c] = (uint64_t)words[j % 4] < d->threshold;
    }
}

void fa_dropout_tile_t(const fa_dropout *d, int64_t b, int64_t h, int64_t Hq, int64_t i0, int64_t rows, int64_t j0,
                       int64_t cols, float *st, int64_t ldst)
{
    uint8_t keep[256];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c0 = 0; c0 < cols; c0 += 256) {
            const int64_t n = cols - c0 < 256 ? cols - c0 : 256;
            fa_dropout_row(d, b, h, Hq, i0 + r, j0 + c0, n, keep);
            for (int64_t c = 0; c < n; c++) st[(c0 + c) * ldst + r] *= keep[c] ? d->scale : 0.0f;
        }
}
