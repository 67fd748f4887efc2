/*
 * scores.c: everything between the scaled dot product and the softmax that
 * is not a plain band, in the order docs/semantics.md gives: softcap, additive bias,
 * ALiBi, then the masks (boolean mask, causal, window). Written once for every
 * algorithm; it works on score tiles of either orientation (see kernels.h). The
 * scale is already in the scores: the Q panel is packed pre-scaled.
 */
#include "problem.h"
#include "plan.h"
#include "convert.h"
#include "arith.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void fa_scores_finish(const fa_problem *p, const fa_view *v, int64_t b, int64_t h, int64_t i0, int64_t rows,
                      int64_t j0, int64_t cols, float *st, int64_t ldc, int64_t ldr)
{
    const float cap = p->softcap;
    const float slope = v->alibi ? v->alibi[b * v->alibi_stride_b + h] : 0.0f;

    /* c outer, r inner: st is walked along its rows, which matters when it is the
     * standard algorithm's whole Sk x Sq matrix */
    if (p->has_mask && !(cap > 0.0f) && !p->has_bias && !p->alibi) { /* a boolean mask alone: its bytes read */
        const fa_tensor *m = &v->mask;
        const unsigned char *mb = (const unsigned char *)m->data + b * m->stride[0] + h * m->stride[1];
        const int banded = p->causal != FA_CAUSAL_NONE || p->window_left >= 0 || p->window_right >= 0;
        for (int64_t c = 0; c < cols; c++) {
            const int64_t j = j0 + c;
            const unsigned char *mc = mb + j * m->stride[3] + i0 * m->stride[2];
            float *sc = st + c * ldc;
            for (int64_t r = 0; r < rows; r++) { /* no branch on a random mask's bit */
                int64_t lo = 0, hi = v->Sk - 1;
                if (banded) fa_row_band(p, v, i0 + r, &lo, &hi);
                const uint32_t keep = (uint32_t)0 - (uint32_t)((j >= lo) & (j <= hi) & (mc[r * m->stride[2]] != 0));
                uint32_t x;
                memcpy(&x, sc + r * ldr, 4);
                x = (x & keep) | (0xff800000u & ~keep); /* -inf where dropped */
                memcpy(sc + r * ldr, &x, 4);
            }
        }
        return;
    }
    for (int64_t c = 0; c < cols; c++) {
        const int64_t j = j0 + c;
        float *sc = st + c * ldc;
        for (int64_t r = 0; r < rows; r++) {
            const int64_t i = i0 + r;
            int64_t lo, hi;
            fa_row_band(p, v, i, &lo, &hi);
            if (j < lo || j > hi || (p->has_mask && fa_load(&v->mask, b, h, i, j) == 0.0f)) {
                sc[r * ldr] = -INFINITY;
                continue;
            }
            float x = sc[r * ldr];
            if (cap > 0.0f) x = cap * tanhf(x / cap);
            if (p->has_bias) x += fa_load(&v->bias, b, h, i, j);
            if (v->alibi) x -= slope * (float)llabs(fa_diag(p, v, i) - j);
            sc[r * ldr] = x;
        }
    }
}

/* A row's kept columns (first, last, count) as its tile-relative bounds *lo, *hi
 * (lo > hi: nothing kept; lo <= cols, hi >= -1), cut by the band's *lo, *hi with
 * `band`; 0 when they are not one run. Shared by fa_mask_runs and fa_bmask_runs. */
static int run_bounds(int64_t first, int64_t last, int64_t count, int64_t cols, int band, int32_t *lo, int32_t *hi)
{
    if (count > 0 && count != last - first + 1) return 0; /* not one run */
    int64_t a = count > 0 ? first : cols, z = count > 0 ? last : -1;
    if (band) {
        a = *lo > a ? *lo : a;
        z = *hi < z ? *hi : z;
    }
    *lo = (int32_t)a;
    *hi = (int32_t)z;
    return 1;
}

/* One row's kept columns [0, n) of a boolean mask row (inner stride sd), folded into
 * its run: first, last, count. Contiguous rows 8 bytes at a time where the words are
 * little-endian (a byte's high bit set in `nz` when the byte is not 0: true, as
 * fa_load reads it). */
static void mask_row_run(const unsigned char *row, int64_t sd, int64_t n, int64_t *first, int64_t *last, int64_t *count)
{
    int64_t c = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ /* byte c + k in bits 8k .. 8k+7 */
    if (sd == 1)
        for (; c + 8 <= n; c += 8) {
            uint64_t w;
            memcpy(&w, row + c, 8);
            const uint64_t lo7 = 0x7f7f7f7f7f7f7f7full, nz = (((w & lo7) + lo7) | w) & ~lo7;
            if (!nz) continue;
            if (*first < 0) *first = c + __builtin_ctzll(nz) / 8;
            *last = c + (63 - __builtin_clzll(nz)) / 8;
            *count += __builtin_popcountll(nz);
        }
#endif
    for (; c < n; c++)
        if (row[c * sd]) {
            if (*first < 0) *first = c;
            *last = c;
            ++*count;
        }
}

int fa_mask_runs(const fa_view *v, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                 int band, int32_t *lo, int32_t *hi)
{
    const fa_tensor *m = &v->mask;
    for (int64_t r = 0; r < rows; r++) {
        const unsigned char *row = (const unsigned char *)m->data + b * m->stride[0] + h * m->stride[1] +
                                   (i0 + r) * m->stride[2] + j0 * m->stride[3];
        int64_t first = -1, last = -1, count = 0;
        mask_row_run(row, m->stride[3], cols, &first, &last, &count);
        if (!run_bounds(first, last, count, cols, band, lo + r, hi + r)) return 0;
    }
    return 1;
}

/* Tile-relative band per row for the softmax kernel: lo[r] >= 0, hi[r] <= cols-1,
 * lo[r] > hi[r] for a row that keeps nothing here. Returns 1 when every row keeps
 * every column, so no bounds are needed at all. */
int fa_tile_band(const fa_problem *p, const fa_view *v, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                 int32_t *lo, int32_t *hi)
{
    int64_t first_lo, first_hi, last_lo, last_hi;
    fa_row_band(p, v, i0, &first_lo, &first_hi);
    fa_row_band(p, v, i0 + rows - 1, &last_lo, &last_hi);
    /* both ends grow with i: the last row has the largest lo, the first the smallest hi */
    if (last_lo <= j0 && first_hi >= j0 + cols - 1) return 1;
    for (int64_t r = 0; r < rows; r++) {
        int64_t a, z;
        fa_row_band(p, v, i0 + r, &a, &z);
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

int64_t fa_kept_pairs(const fa_problem *p, const fa_view *v, int64_t i0, int64_t i1, int64_t j0, int64_t j1)
{
    /* Row i keeps [max(J0, i + A), min(J1, i + H)]: the key range, clipped by two
     * lines of slope one (fa_row_band's ends: the window's left side at A, the least
     * of the right side and the causal diagonals at H; absent sides never bind). */
    const int64_t J0 = j0 > 0 ? j0 : 0, J1 = j1 - 1 < v->Sk - 1 ? j1 - 1 : v->Sk - 1;
    if (i0 >= i1 || J0 > J1) return 0;
    const int64_t c = fa_diag(p, v, 0), ct = fa_diag_top_left(p, 0);
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

/* ------------------------------------------------------------ block mask */

/* Mask row (b, h, qb)'s entries [*e0, *e1) in view v (its bm_row0). */
static void bmask_row(const fa_bmask *m, const fa_view *v, int64_t b, int64_t h, int64_t qb, int64_t *e0,
                      int64_t *e1)
{
    const int64_t r = v->bm_row0 + b * m->row_b + h * m->row_h + qb;
    *e0 = m->offsets[r];
    *e1 = m->offsets[r + 1];
}

static int64_t bmask_entry(const fa_bmask *m, int64_t e) { return m->partial ? m->partial[e] : FA_BM_FULL; }

void fa_bmask_status(const fa_problem *p, const fa_view *v, int64_t b, int64_t h, int64_t qb, int64_t kb0, int64_t n,
                     int64_t *status)
{
    const fa_bmask *m = &p->bm;
    for (int64_t k = 0; k < n; k++) status[k] = FA_BM_ABSENT;
    int64_t e0, e1;
    bmask_row(m, v, b, h, qb, &e0, &e1);
    for (int64_t e = e0; e < e1; e++) {
        const int64_t kb = m->idx[e];
        if (kb >= kb0 && kb < kb0 + n) status[kb - kb0] = bmask_entry(m, e);
    }
}

/* The element mask's bit of pair (r, c) of its block. */
static int bmask_bit(const fa_bmask *m, int64_t id, int64_t r, int64_t c)
{
    return (m->bits[id * m->block_bytes + r * m->row_bytes + c / 8] >> (c % 8)) & 1;
}

/* A walk over a tile's q blocks: block qb covers the tile's rows [r0, r1), and
 * status[k] is the status of kv block kb0 + k, which covers the tile's columns
 * [kblock_start, kblock_end). Written once for fa_bmask_tile, _apply and _runs. */
typedef struct {
    const fa_problem *p;
    const fa_view *v;
    const fa_bmask *m;
    int64_t b, h, i0, rows, j0, cols, kb0, nk;
    int64_t qb, r0, r1;
    int64_t *status;
} bmask_walk;

static void walk_begin(bmask_walk *w, const fa_problem *p, const fa_view *v, int64_t b, int64_t h, int64_t i0,
                       int64_t rows, int64_t j0, int64_t cols, int64_t *status)
{
    const fa_bmask *m = &p->bm;
    *w = (bmask_walk){.p = p, .v = v, .m = m, .b = b, .h = h, .i0 = i0, .rows = rows, .j0 = j0, .cols = cols,
                      .kb0 = j0 / m->bk, .nk = (j0 + cols - 1) / m->bk - j0 / m->bk + 1, .qb = i0 / m->bq - 1,
                      .status = status};
}

/* The next q block of the tile: its rows and its kv blocks' statuses; 0 past the last. */
static int walk_next(bmask_walk *w)
{
    const fa_bmask *m = w->m;
    if (++w->qb > (w->i0 + w->rows - 1) / m->bq) return 0;
    w->r0 = w->qb * m->bq > w->i0 ? w->qb * m->bq - w->i0 : 0;
    w->r1 = (w->qb + 1) * m->bq - w->i0 < w->rows ? (w->qb + 1) * m->bq - w->i0 : w->rows;
    fa_bmask_status(w->p, w->v, w->b, w->h, w->qb, w->kb0, w->nk, w->status);
    return 1;
}

/* The tile-relative column where the walk's kv block k starts, and where it ends. */
static int64_t kblock_start(const bmask_walk *w, int64_t k)
{
    return k == 0 ? 0 : (w->kb0 + k) * w->m->bk - w->j0;
}

static int64_t kblock_end(const bmask_walk *w, int64_t k)
{
    const int64_t c = (w->kb0 + k + 1) * w->m->bk - w->j0;
    return c < w->cols ? c : w->cols;
}

/* The element-mask row of tile row r in kv block k (status s >= 0), and the
 * block column of the tile's column kblock_start(k). */
static const uint8_t *walk_bits(const bmask_walk *w, int64_t s, int64_t r)
{
    return w->m->bits + s * w->m->block_bytes + (w->i0 + r - w->qb * w->m->bq) * w->m->row_bytes;
}

static int64_t walk_x0(const bmask_walk *w, int64_t k)
{
    return w->j0 + kblock_start(w, k) - (w->kb0 + k) * w->m->bk;
}

int fa_bmask_tile(const fa_problem *p, const fa_view *v, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0,
                  int64_t cols, int64_t *status)
{
    bmask_walk w;
    walk_begin(&w, p, v, b, h, i0, rows, j0, cols, status);
    int any = 0, all = 1;
    while (walk_next(&w))
        for (int64_t k = 0; k < w.nk; k++) {
            any |= status[k] != FA_BM_ABSENT;
            all &= status[k] == FA_BM_FULL;
        }
    return !any ? 0 : all ? 1 : 2;
}

void fa_bmask_apply(const fa_problem *p, const fa_view *v, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0,
                    int64_t cols, float *st, int64_t ldc, int64_t ldr, int64_t *status)
{
    bmask_walk w;
    walk_begin(&w, p, v, b, h, i0, rows, j0, cols, status);
    while (walk_next(&w))
        for (int64_t k = 0; k < w.nk; k++) {
            const int64_t s = status[k], c1 = kblock_end(&w, k);
            if (s == FA_BM_FULL) continue;
            for (int64_t c = kblock_start(&w, k), x = walk_x0(&w, k); c < c1; c++, x++) {
                float *sc = st + c * ldc;
                if (s == FA_BM_ABSENT) {
                    for (int64_t r = w.r0; r < w.r1; r++) sc[r * ldr] = -INFINITY;
                    continue;
                }
                const uint8_t *byte = walk_bits(&w, s, w.r0) + x / 8, bit = (uint8_t)(1u << (x % 8));
                for (int64_t r = w.r0; r < w.r1; r++, byte += w.m->row_bytes)
                    if (!(*byte & bit)) sc[r * ldr] = -INFINITY;
            }
        }
}

/* One row's kept columns [c0, c1) of a kv block segment, whose element-mask row is
 * `bits` (row_bytes long) from block column x0 (NULL: full), folded into its run:
 * first, last, count. Up to 64 columns at a time. */
static void run_add(const uint8_t *bits, int64_t row_bytes, int64_t x0, int64_t c0, int64_t c1, int64_t *first,
                    int64_t *last, int64_t *count)
{
    if (!bits) {
        if (*first < 0) *first = c0;
        *last = c1 - 1;
        *count += c1 - c0;
        return;
    }
    for (int64_t c = c0, x = x0; c < c1;) {
        const int64_t at = x / 8, nb = row_bytes - at < 8 ? row_bytes - at : 8;
        uint64_t word = 0;
        for (int64_t k = 0; k < nb; k++) word |= (uint64_t)bits[at + k] << (8 * k);
        const int64_t avail = nb * 8 - x % 8, take = avail < c1 - c ? avail : c1 - c;
        word >>= x % 8;
        if (take < 64) word &= ((uint64_t)1 << take) - 1;
        if (word) {
            if (*first < 0) *first = c + __builtin_ctzll(word);
            *last = c + 63 - __builtin_clzll(word);
            *count += __builtin_popcountll(word);
        }
        c += take, x += take;
    }
}

int fa_bmask_runs(const fa_problem *p, const fa_view *v, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0,
                  int64_t cols, int band, int32_t *lo, int32_t *hi, int64_t *status)
{
    bmask_walk w;
    walk_begin(&w, p, v, b, h, i0, rows, j0, cols, status);
    while (walk_next(&w))
        for (int64_t r = w.r0; r < w.r1; r++) {
            int64_t first = -1, last = -1, count = 0;
            for (int64_t k = 0; k < w.nk; k++) {
                const int64_t s = status[k];
                if (s != FA_BM_ABSENT)
                    run_add(s >= 0 ? walk_bits(&w, s, r) : NULL, w.m->row_bytes, walk_x0(&w, k), kblock_start(&w, k),
                            kblock_end(&w, k), &first, &last, &count);
            }
            if (!run_bounds(first, last, count, cols, band, lo + r, hi + r)) return 0;
        }
    return 1;
}

int fa_bmask_keeps(const fa_problem *p, const fa_view *v, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const fa_bmask *m = &p->bm;
    int64_t e0, e1;
    bmask_row(m, v, b, h, i / m->bq, &e0, &e1);
    for (int64_t e = e0; e < e1; e++)
        if (m->idx[e] == j / m->bk) {
            const int64_t s = bmask_entry(m, e);
            return s == FA_BM_FULL || bmask_bit(m, s, i % m->bq, j % m->bk);
        }
    return 0;
}

/* Set bits of one element-mask row among its columns [c0, c1]. */
static int64_t bmask_row_bits(const fa_bmask *m, int64_t id, int64_t r, int64_t c0, int64_t c1)
{
    int64_t n = 0;
    for (int64_t c = c0; c <= c1; c++) n += bmask_bit(m, id, r, c);
    return n;
}

int64_t fa_bmask_kept_pairs(const fa_problem *p, const fa_view *v, int64_t b, int64_t h, int64_t i0, int64_t i1,
                            int64_t j0, int64_t j1, int exact)
{
    const fa_bmask *m = &p->bm;
    if (j1 > v->Sk) j1 = v->Sk;
    if (j0 < 0) j0 = 0;
    if (i1 > v->Sq) i1 = v->Sq;
    int64_t kept = 0;
    for (int64_t qb = i0 / m->bq; i0 < i1 && qb <= (i1 - 1) / m->bq; qb++) {
        const int64_t r0 = qb * m->bq > i0 ? qb * m->bq : i0, r1 = (qb + 1) * m->bq < i1 ? (qb + 1) * m->bq : i1;
        int64_t e0, e1;
        bmask_row(m, v, b, h, qb, &e0, &e1);
        for (int64_t e = e0; e < e1; e++) {
            const int64_t k0 = m->idx[e] * m->bk, c0 = k0 > j0 ? k0 : j0, c1 = k0 + m->bk < j1 ? k0 + m->bk : j1;
            if (c0 >= c1) continue;
            const int64_t s = bmask_entry(m, e);
            if (!exact || s == FA_BM_FULL) {
                kept += fa_kept_pairs(p, v, r0, r1, c0, c1);
                continue;
            }
            for (int64_t i = r0; i < r1; i++) {
                int64_t lo, hi;
                fa_row_band(p, v, i, &lo, &hi);
                if (lo < c0) lo = c0;
                if (hi > c1 - 1) hi = c1 - 1;
                if (lo <= hi) kept += bmask_row_bits(m, s, i - qb * m->bq, lo - k0, hi - k0);
            }
        }
    }
    return kept;
}

void fa_bmask_columns(const fa_problem *p, const fa_view *s, int64_t h0, int64_t nh, int64_t i0, int64_t i1,
                      int64_t *lo, int64_t *hi)
{
    const fa_bmask *m = &p->bm;
    int64_t kb_lo = INT64_MAX, kb_hi = -1;
    for (int64_t h = h0; h < h0 + nh; h++)
        for (int64_t qb = i0 / m->bq; i0 < i1 && qb <= (i1 - 1) / m->bq; qb++) {
            int64_t e0, e1;
            bmask_row(m, s, 0, h, qb, &e0, &e1);
            for (int64_t e = e0; e < e1; e++) {
                if (m->idx[e] < kb_lo) kb_lo = m->idx[e];
                if (m->idx[e] > kb_hi) kb_hi = m->idx[e];
            }
        }
    if (kb_hi < 0) {
        *hi = *lo - 1;
        return;
    }
    if (*lo < kb_lo * m->bk) *lo = kb_lo * m->bk;
    if (*hi > (kb_hi + 1) * m->bk - 1) *hi = (kb_hi + 1) * m->bk - 1;
}

int64_t fa_heads_kept_pairs(const fa_problem *p, const fa_view *s, int64_t h0, int64_t ng, int64_t i0, int64_t i1,
                            int64_t j0, int64_t j1)
{
    if (!p->bm.on) return fa_kept_pairs(p, s, i0, i1, j0, j1) * ng;
    int64_t kept = 0;
    for (int64_t h = h0; h < h0 + ng; h++) kept += fa_bmask_kept_pairs(p, s, 0, h, i0, i1, j0, j1, 0);
    return kept;
}

/* The largest divisor of n not above t (t >= 1). */
static int64_t divisor_below(int64_t n, int64_t t)
{
    if (t >= n) return n;
    for (int64_t d = t; d > 1; d--)
        if (n % d == 0) return d;
    return 1;
}

/* A tile of t (cut to len) inside blocks of n: t itself when the whole length fits one
 * block, else the largest divisor of n not above t, unless that is far shorter (a prime
 * n): then t, whose tiles cross blocks (correct, only less is skipped). */
static int64_t fit_tile(int64_t t, int64_t len, int64_t n)
{
    if ((t >= len && len <= n) || (t <= n && n % t == 0)) return t;
    const int64_t d = divisor_below(n, t);
    return d * 4 >= (t < n ? t : n) ? d : t;
}

void fa_bmask_fit_tiles(const fa_problem *p, int64_t *br, int64_t *bc)
{
    if (!p->bm.on) return;
    *br = fit_tile(*br, p->Sq, p->bm.bq);
    *bc = fit_tile(*bc, p->Sk, p->bm.bk);
}

enum { GROW_TILES_MAX = 4096 }; /* kv tiles of a mask row the count below follows */
enum { RUN_ROWS = 64 };         /* rows per fa_bmask_runs call of the count's run test */

/* One kv tile of the q tile being counted (tiled_blocks): the blocks the q tile's
 * q blocks list in it, block by block (qstamp: the q block they are of), and what
 * the tile computes when its loop trims it to the runs. */
typedef struct {
    int64_t stamp, qstamp; /* the q tile, the q block that touched it last */
    int64_t lo, hi, n;     /* the q block's first and last listed kv block in it, their count */
    int64_t trimmed;       /* blocks computed when trimmed to the runs */
    uint64_t used;         /* the kv blocks of the tile some q block lists, bit by bit */
    int64_t rows;          /* the q blocks that list some */
    int partial, runs;     /* an element mask among them; every row one run so far */
} kv_tile;

/* Whether each row of q block qb of (b, h) keeps one run of columns over kv blocks
 * [lo, hi] (fa_bmask_runs, RUN_ROWS rows at a time), within the problem's lengths
 * where the blocks reach them (a block past them: its whole size). */
static int block_runs(const fa_problem *p, int64_t b, int64_t h, int64_t qb, int64_t lo, int64_t hi, int64_t *status)
{
    const fa_bmask *m = &p->bm;
    const int64_t i0 = qb * m->bq, j0 = lo * m->bk;
    const int64_t rows = i0 < p->Sq && p->Sq - i0 < m->bq ? p->Sq - i0 : m->bq;
    const int64_t cols = j0 < p->Sk && p->Sk - j0 < (hi - lo + 1) * m->bk ? p->Sk - j0 : (hi - lo + 1) * m->bk;
    int32_t rlo[RUN_ROWS], rhi[RUN_ROWS];
    for (int64_t r = 0; r < rows; r += RUN_ROWS)
        if (!fa_bmask_runs(p, &p->view, b, h, i0 + r, rows - r < RUN_ROWS ? rows - r : RUN_ROWS, j0, cols, 0, rlo, rhi,
                           status))
            return 0;
    return 1;
}

/* The blocks that tiles of fq x fk blocks compute, over every mask row; the kv tiles
 * of a q tile start at its first listed block, as the tasks walk them
 * (fa_bmask_columns), and end at its last. A tile meeting a listed block computes all
 * of its blocks, unless the loop trims (fa_plan_from's `loop`), the pairs each of its
 * rows keeps are one run, and every q block of it lists some of its kv blocks and every
 * kv block is listed (a tile's K, V and Q are packed and walked whole, which in a
 * tile mostly left out costs about what its trimmed blocks save): then its
 * kernels compute a q block's columns from its first listed block (FA_PLAN_FUSED;
 * FA_PLAN_TRIMMED from the tile's start) to its last, and FA_PLAN_TRIMMED trims nothing
 * when its first rows' run reaches the tile's end (wide_trimmed, fwd_bf16). -1 when a
 * row has more kv tiles than the count follows, or on no memory. */
static int64_t tiled_blocks(const fa_problem *p, int64_t fq, int64_t fk, int loop)
{
    const fa_bmask *m = &p->bm;
    const int64_t nkt = (m->nkb + fk - 1) / fk;
    if (nkt > GROW_TILES_MAX) return -1;
    kv_tile *kv = malloc((size_t)nkt * sizeof *kv);
    int64_t *touched = malloc((size_t)(2 * nkt + fk + 2) * sizeof *touched);
    if (!kv || !touched) {
        free(kv);
        free(touched);
        return -1;
    }
    int64_t *in_qb = touched + nkt, *status = in_qb + nkt; /* kv tiles of the q tile, of the q block; scratch */
    int64_t stamp = 0, blocks = 0;
    for (int64_t k = 0; k < nkt; k++) kv[k].stamp = kv[k].qstamp = -1;
    for (int64_t b = 0; b < (m->row_b ? p->B : 1); b++)
        for (int64_t h = 0; h < (m->row_h ? p->Hq : 1); h++)
            for (int64_t q0 = 0; q0 < m->nqb; q0 += fq, stamp++) {
                const int64_t q1 = q0 + fq < m->nqb ? q0 + fq : m->nqb;
                int64_t first = INT64_MAX, last = -1, e0, e1, nt = 0;
                for (int64_t qb = q0; qb < q1; qb++) {
                    bmask_row(m, &p->view, b, h, qb, &e0, &e1);
                    for (int64_t e = e0; e < e1; e++) {
                        first = m->idx[e] < first ? m->idx[e] : first;
                        last = m->idx[e] > last ? m->idx[e] : last;
                    }
                }
                for (int64_t qb = q0; qb < q1; qb++) {
                    int64_t nq = 0;
                    bmask_row(m, &p->view, b, h, qb, &e0, &e1);
                    for (int64_t e = e0; e < e1; e++) {
                        const int64_t kb = m->idx[e];
                        kv_tile *t = kv + (kb - first) / fk;
                        if (t->stamp != stamp) {
                            *t = (kv_tile){.stamp = stamp, .qstamp = -1, .runs = fk <= 64};
                            touched[nt++] = t - kv;
                        }
                        if (t->qstamp != qb) {
                            t->qstamp = qb, t->lo = t->hi = kb, t->n = 0, t->partial = 0, t->rows++;
                            in_qb[nq++] = t - kv;
                        }
                        t->lo = kb < t->lo ? kb : t->lo;
                        t->hi = kb > t->hi ? kb : t->hi;
                        t->n++;
                        t->partial |= bmask_entry(m, e) != FA_BM_FULL;
                    }
                    for (int64_t k = 0; loop != FA_PLAN_PLAIN && k < nq; k++) {
                        kv_tile *t = kv + in_qb[k];
                        const int64_t start = first + in_qb[k] * fk, end = start + fk - 1;
                        if (!t->runs) continue;
                        t->runs = t->n == t->hi - t->lo + 1 &&
                                  (!t->partial || block_runs(p, b, h, qb, t->lo, t->hi, status)) &&
                                  !(loop == FA_PLAN_TRIMMED && qb == q0 && t->hi >= end);
                        t->trimmed += t->hi - (loop == FA_PLAN_FUSED ? t->lo : start) + 1;
                        for (int64_t kb = t->lo; kb <= t->hi; kb++) t->used |= (uint64_t)1 << (kb - start);
                    }
                }
                for (int64_t k = 0; k < nt; k++) {
                    const kv_tile *t = kv + touched[k];
                    const int64_t start = first + touched[k] * fk, end = start + fk - 1 < last ? start + fk - 1 : last;
                    const int whole = t->runs && t->rows == q1 - q0 && t->used == ~(uint64_t)0 >> (63 - (end - start));
                    blocks += loop != FA_PLAN_PLAIN && whole ? t->trimmed : fq * fk;
                }
            }
    free(kv);
    free(touched);
    return blocks;
}

void fa_bmask_plan_tiles(const fa_problem *p, int loop, int64_t *br, int64_t *bc)
{
    if (!p->bm.on) return;
    const fa_bmask *m = &p->bm;
    /* tiles of whole blocks, as many as the plan wants, while they compute at most
     * 1/32 more blocks than the mask lists: fewer, larger tiles where the kept blocks
     * come in aligned groups (documents, every block) or where the loop trims a tile to
     * rows' runs (a causal staircase's diagonal), the blocks themselves where they are
     * scattered (random) */
    const int64_t tq = *br < p->Sq ? *br : fa_round_up(p->Sq,
                                                       m->bq), tk = *bc < p->Sk ? *bc : fa_round_up(p->Sk, m->bk);
    int64_t fq = tq > m->bq && tq % m->bq == 0 ? tq / m->bq : 1;
    int64_t fk = tk > m->bk && tk % m->bk == 0 ? tk / m->bk : 1;
    const int64_t listed = tiled_blocks(p, 1, 1, FA_PLAN_PLAIN);
    while (listed >= 0 && fq * fk > 1) {
        const int64_t blocks = tiled_blocks(p, fq, fk, loop);
        if (blocks >= 0 && blocks - listed <= listed / 32) {
            *br = fq * m->bq;
            *bc = fk * m->bk;
            return;
        }
        if (fk >= fq) fk = fk / 2 > 1 ? fk / 2 : 1;
        else fq = fq / 2 > 1 ? fq / 2 : 1;
    }
    fa_bmask_fit_tiles(p, br, bc);
}
