/*
 * scores.c: everything between the scaled dot product and the softmax that
 * is not a plain band, in the order docs/semantics.md gives: softcap, additive bias,
 * ALiBi, then the masks (boolean mask, causal, window). Written once for every
 * algorithm; it works on score tiles of either orientation (see kernels.h). The
 * scale is already in the scores: the Q panel is packed pre-scaled.
 */
#include "internal.h"
#include "convert.h"

#include <math.h>
#include <stdlib.h>

void fa_scores_finish(const fa_problem *p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                      int64_t j0, int64_t cols, float *st, int64_t ldc, int64_t ldr)
{
    const float cap = p->softcap;
    const float slope = p->alibi ? p->alibi[b * p->alibi_stride_b + h] : 0.0f;

    /* c outer, r inner: st is walked along its rows, which matters when it is the
     * standard algorithm's whole Sk x Sq matrix */
    for (int64_t c = 0; c < cols; c++) {
        const int64_t j = j0 + c;
        float *sc = st + c * ldc;
        for (int64_t r = 0; r < rows; r++) {
            const int64_t i = i0 + r;
            int64_t lo, hi;
            fa_row_band(p, i, &lo, &hi);
            if (j < lo || j > hi || (p->has_mask && fa_load(&p->mask, b, h, i, j) == 0.0f)) {
                sc[r * ldr] = -INFINITY;
                continue;
            }
            float x = sc[r * ldr];
            if (cap > 0.0f) x = cap * tanhf(x / cap);
            if (p->has_bias) x += fa_load(&p->bias, b, h, i, j);
            if (p->alibi) x -= slope * (float)llabs(fa_diag(p, i) - j);
            sc[r * ldr] = x;
        }
    }
}

/* Tile-relative band per row for the softmax kernel: lo[r] >= 0, hi[r] <= cols-1,
 * lo[r] > hi[r] for a row that keeps nothing here. Returns 1 when every row keeps
 * every column, so no bounds are needed at all. */
int fa_tile_band(const fa_problem *p, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                 int32_t *lo, int32_t *hi)
{
    int64_t first_lo, first_hi, last_lo, last_hi;
    fa_row_band(p, i0, &first_lo, &first_hi);
    fa_row_band(p, i0 + rows - 1, &last_lo, &last_hi);
    /* both ends grow with i: the last row has the largest lo, the first the smallest hi */
    if (last_lo <= j0 && first_hi >= j0 + cols - 1) return 1;
    for (int64_t r = 0; r < rows; r++) {
        int64_t a, z;
        fa_row_band(p, i0 + r, &a, &z);
        a -= j0;
        z -= j0;
        if (a < 0) a = 0;
        if (z > cols - 1) z = cols - 1;
        if (a > cols) a = cols;
        if (z < -1) z = -1;
        lo[r] = (int32_t)a;
        hi[r] = (int32_t)z;
    }
    return 0;
}
