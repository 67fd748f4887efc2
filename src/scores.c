/*
 * scores.c: everything between the scaled dot product and the softmax that
 * is not a plain band, in the order docs/semantics.md gives: softcap, additive bias,
 * ALiBi, then the masks (boolean mask, causal, window). Written once for every
 * algorithm; it works on score tiles of either orientation (see kernels.h). The
 * scale is already in the scores: the Q panel is packed pre-scaled.
 */
#include "problem.h"
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

/* Sum of max(0, s*i + t) over i in [x0, x1), s in {-1, 0, 1}: an arithmetic series
 * cut where it turns non-positive. The sum is a count of kept pairs (at most
 * Sq*Sk, within int64 by checks.c), and so is every partial product below. */
static int64_t sum_positive(int s, int64_t t, int64_t x0, int64_t x1)
{
    if (s == 0) return t > 0 && x1 > x0 ? t * (x1 - x0) : 0;
    if (s > 0 && x0 < 1 - t) x0 = 1 - t;  /* i + t >= 1 */
    if (s < 0 && x1 > t) x1 = t;          /* t - i >= 1 */
    if (x0 >= x1) return 0;
    const int64_t n = x1 - x0, f = s > 0 ? x0 + t : t - x0, l = s > 0 ? x1 - 1 + t : t - (x1 - 1);
    /* f + l is even when n is odd (steps of one) */
    return n % 2 == 0 ? n / 2 * (f + l) : n * ((f + l) / 2);
}

int64_t fa_kept_pairs(const fa_problem *p, int64_t i0, int64_t i1, int64_t j0, int64_t j1)
{
    /* Row i keeps [max(J0, i + A), min(J1, i + H)]: the key range, clipped by two
     * lines of slope one (fa_row_band's ends: the window's left side at A, the least
     * of the right side and the causal diagonals at H; absent sides never bind). */
    const int64_t J0 = j0 > 0 ? j0 : 0, J1 = j1 - 1 < p->Sk - 1 ? j1 - 1 : p->Sk - 1;
    if (i0 >= i1 || J0 > J1) return 0;
    const int64_t c = fa_diag(p, 0), ct = fa_diag_top_left(p, 0);
    const int has_a = p->window_left >= 0;
    const int64_t A = has_a ? c - p->window_left : 0;
    int has_h = 0;
    int64_t H = 0;
    if (p->window_right >= 0) H = c + p->window_right, has_h = 1;
    if (p->causal == FA_CAUSAL_BOTTOM_RIGHT && (!has_h || c < H)) H = c, has_h = 1;
    if (p->causal == FA_CAUSAL_TOP_LEFT && (!has_h || ct < H)) H = ct, has_h = 1;
    /* rows [pa, i1) have lo on the line; rows [i0, qh) have hi on it (compared
     * before subtracting, so no difference of far-apart values is formed) */
    int64_t pa = i1, qh = i0;
    if (has_a) pa = A >= J0 - i0 ? i0 : A < J0 - (i1 - 1) ? i1 : J0 - A;
    if (has_h) qh = H <= J1 - (i1 - 1) ? i1 : H > J1 - i0 ? i0 : J1 - H + 1;
    const int64_t cut[4] = {i0, pa < qh ? pa : qh, pa < qh ? qh : pa, i1};
    int64_t kept = 0;
    for (int k = 0; k < 3; k++) {
        if (cut[k] >= cut[k + 1]) continue;
        const int la = cut[k] >= pa, lh = cut[k] < qh;
        kept += sum_positive(lh - la, (lh ? H : J1) - (la ? A : J0) + 1, cut[k], cut[k + 1]);
    }
    return kept;
}
