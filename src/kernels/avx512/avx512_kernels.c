/*
 * avx512_kernels.c: the AVX-512 fp32 micro-kernels of the "avx512" table
 * (avx512_table.c), which "avx512bf16" inherits. The layouts are those of kernels.h:
 * a zmm runs along 16 query rows r in qt and st, and along 16 value columns e
 * in v and acc, so no kernel ever transposes a tile it reads in its loop.
 *
 * Register blocks (32 zmm):
 *   qk  64 rows (4 zmm of a qt row) x 6 key columns: 24 accumulators over the
 *       whole d loop; per x, 4 loads of qt and 6 broadcasts of K feed 24 FMAs.
 *   pv  6 rows (broadcast p = st[c][r]) x 64 e (4 zmm of a V row): the same
 *       24-accumulator shape over every column c, the alpha rescale fused into
 *       the load of acc.
 *   stx (backward) 6 acc rows c (broadcast st[c][r]) x 64 e (4 zmm of an x row):
 *       pv with the tile's axes swapped, 24 accumulators over 128 rows r.
 * All three keep the operand they reuse across the inner blocks near (qk: a 64-row
 * x 128-x slice of qt, 32 KB; pv: a 128-c x 64-e slice of V, stx: a 128-r x 64-e slice of x, 32 KB), so a large
 * planned tile does not turn their loads into L2 misses. Counts that 6 does not
 * divide are covered by 6-wide then 5-wide blocks (exact for every count >= 20);
 * the last e or x vector of a row uses masked loads/stores, never reading past
 * a row's end. Nothing here assumes a tile size.
 *
 * Every register-blocked body is an always-inline function whose block sizes
 * are parameters; each size combination is instantiated in a function of its
 * own (qk_panel4 ...) or in a loop of its own, never as two arms of one branch:
 * clang merges such calls into one with runtime sizes, and the accumulators
 * then live in memory.
 */
#include "avx512_internal.h"

#include <math.h>

#define MIN64(a, b) ((a) < (b) ? (a) : (b))

/* ------------------------------------------------------------------ pack_qt */

void fa_avx512_pack_qt(int64_t rows, int64_t d, const float *q, int64_t ldq, float scale, float *qt,
                       int64_t ldqt)
{
    const __m512 s = _mm512_set1_ps(scale);
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
        const int64_t nr = MIN64(16, rows - r0);
        for (int64_t x0 = 0; x0 < d; x0 += 16) {
            const int64_t nx = MIN64(16, d - x0);
            const __mmask16 kx = fa_avx512_head_mask(nx);
            __m512 t[16];
            for (int i = 0; i < 16; i++)
                t[i] = i < nr ? _mm512_maskz_loadu_ps(kx, q + (r0 + i) * ldq + x0) : _mm512_setzero_ps();
            fa_avx512_transpose16(t);
            for (int64_t i = 0; i < nx; i++) _mm512_store_ps(qt + (x0 + i) * ldqt + r0, _mm512_mul_ps(t[i], s));
        }
    }
}

/* ----------------------------------------------------------------------- qk */

enum { QK_NV = 4, QK_NC = 6, QK_DCHUNK = 128, QK_CGROUP = 48 };

/*
 * st[c][16i..] (+)= sum_x qt[x][16i..] * k[c][x] for i < nv, c < valid <= nc.
 * A padded tile (valid < nc, only when fewer than 20 columns remain) still runs
 * nc columns, the missing ones repeating the last real column, never stored.
 * With accumulate, st holds the sum over the previous x chunk and the sum
 * continues, so chunking d keeps the rounding order. Meanwhile the npf K rows
 * at kn (the next tile) are prefetched, one line per row every 16 x: K rows of
 * a BSND tensor are a page apart, where the hardware prefetchers see one short
 * stream per page and give up.
 */
FA_AVX512_INLINE void qk_tile(const int nv, const int nc, int64_t valid, int accumulate, int64_t d, const float *qt,
                              int64_t ldqt, const float *k, int64_t ldk, float *st, int64_t ldst, const float *kn,
                              int64_t npf)
{
    __m512 acc[QK_NC][QK_NV];
    const float *kc[QK_NC];
    FA_AVX512_UNROLL
    for (int j = 0; j < nc; j++) {
        kc[j] = k + MIN64(j, valid - 1) * ldk;
        FA_AVX512_UNROLL
        for (int i = 0; i < nv; i++)
            acc[j][i] = accumulate && j < valid ? _mm512_load_ps(st + j * ldst + 16 * i) : _mm512_setzero_ps();
    }
    for (int64_t x0 = 0; x0 < d; x0 += 16) {
        for (int64_t j = 0; j < npf; j++) _mm_prefetch((const char *)(kn + j * ldk + x0), _MM_HINT_T0);
        const int64_t xe = MIN64(x0 + 16, d);
        for (int64_t x = x0; x < xe; x++) {
            const float *qx = qt + x * ldqt;
            __m512 qv[QK_NV];
            FA_AVX512_UNROLL
            for (int i = 0; i < nv; i++) qv[i] = _mm512_load_ps(qx + 16 * i);
            FA_AVX512_UNROLL
            for (int j = 0; j < nc; j++) {
                const __m512 kb = _mm512_set1_ps(kc[j][x]);
                FA_AVX512_UNROLL
                for (int i = 0; i < nv; i++) acc[j][i] = _mm512_fmadd_ps(qv[i], kb, acc[j][i]);
            }
        }
    }
    FA_AVX512_UNROLL
    for (int j = 0; j < nc; j++) {
        if (j >= valid) break;
        FA_AVX512_UNROLL
        for (int i = 0; i < nv; i++) _mm512_store_ps(st + j * ldst + 16 * i, acc[j][i]);
    }
}

typedef struct {
    int accumulate;
    int64_t cols, d;
    int64_t cols_after; /* columns that exist from k on (>= cols): how far prefetching may look */
    const float *qt;
    int64_t ldqt;
    const float *k;
    int64_t ldk;
    float *st;
    int64_t ldst;
} qk_args;

/* One 16*nv-row panel of qt against a->cols columns: 6-column tiles, then
 * 5-column ones. */
FA_AVX512_INLINE void qk_panel(const int nv, const qk_args *a)
{
    const int64_t c6 = fa_avx512_split65(a->cols);
    for (int64_t c = 0; c < c6; c += QK_NC) {
        const float *kc = a->k + c * a->ldk;
        const int64_t npf = MIN64(QK_NC, a->cols_after - c - QK_NC);
        qk_tile(nv, QK_NC, MIN64(QK_NC, c6 - c), a->accumulate, a->d, a->qt, a->ldqt, kc, a->ldk,
                a->st + c * a->ldst, a->ldst, kc + QK_NC * a->ldk, npf > 0 ? npf : 0);
    }
    for (int64_t c = c6; c < a->cols; c += QK_NC - 1) {
        const float *kc = a->k + c * a->ldk;
        const int64_t npf = MIN64(QK_NC - 1, a->cols_after - c - (QK_NC - 1));
        qk_tile(nv, QK_NC - 1, QK_NC - 1, a->accumulate, a->d, a->qt, a->ldqt, kc, a->ldk, a->st + c * a->ldst,
                a->ldst, kc + (QK_NC - 1) * a->ldk, npf > 0 ? npf : 0);
    }
}

/* One function per panel height (see the top of the file). */
static void qk_panel4(const qk_args *a) { qk_panel(4, a); }
static void qk_panel3(const qk_args *a) { qk_panel(3, a); }
static void qk_panel2(const qk_args *a) { qk_panel(2, a); }
static void qk_panel1(const qk_args *a) { qk_panel(1, a); }

void fa_avx512_qk_64x6(int64_t rows, int64_t cols, int64_t d, const float *qt, int64_t ldqt, const float *k,
                  int64_t ldk, float *st, int64_t ldst)
{
    static void (*const panel[QK_NV + 1])(const qk_args *) = {NULL, qk_panel1, qk_panel2, qk_panel3, qk_panel4};
    const int64_t nvec = (rows + 15) / 16;
    /*
     * 128 x at a time; within that, groups of 48 columns, and within a group
     * every 64-row panel. A panel's qt slice (32 KB) is reused by the 8 tiles
     * of a group from L1, and a group's K rows by every panel from L1/L2 even
     * when the rows are a page apart, which a whole tile's K would not be
     * (with each panel walking all of a tile's columns, a K row stride of a
     * page or more evicts them). The last group takes the remainder
     * whole when it is short, so the 6/5 split stays exact.
     */
    for (int64_t x0 = 0; x0 < d; x0 += QK_DCHUNK) {
        const int64_t dd = MIN64(QK_DCHUNK, d - x0);
        for (int64_t c0 = 0, cg; c0 < cols; c0 += cg) {
            cg = cols - c0 < QK_CGROUP + 20 ? cols - c0 : QK_CGROUP;
            for (int64_t v0 = 0; v0 < nvec; v0 += QK_NV) {
                const qk_args a = {x0 > 0, cg, dd, cols - c0, qt + x0 * ldqt + 16 * v0, ldqt,
                                   k + c0 * ldk + x0, ldk, st + c0 * ldst + 16 * v0, ldst};
                panel[MIN64(QK_NV, nvec - v0)](&a);
            }
        }
    }
}

/* ------------------------------------------------------------------ softmax */

/* Lanes r (of 16 * nv rows starting at the pointers) whose band holds column c. */
FA_AVX512_INLINE __mmask16 band(__m512i lo, __m512i hi, __m512i c)
{
    return _mm512_cmple_epi32_mask(lo, c) & _mm512_cmpge_epi32_mask(hi, c);
}

typedef struct {
    int64_t rows_left, cols;
    float *st;
    int64_t ldst;
    const int32_t *lo, *hi;
    float *m, *l, *alpha;
} softmax_args;

/*
 * The online-softmax step for up to 4 vectors of rows (rows_left of them real):
 * pass 1 finds the tile maximum over kept columns, pass 2 writes p and sums it.
 * The sum starts from l*alpha and adds p column by column, the reference's order,
 * so l differs from it only through exp.
 */
FA_AVX512_INLINE void softmax_panel(const int nv, const softmax_args *a)
{
    const int64_t rows_left = a->rows_left, cols = a->cols, ldst = a->ldst;
    const int32_t *lo = a->lo, *hi = a->hi;
    float *st = a->st, *m = a->m, *l = a->l, *alpha = a->alpha;
    __mmask16 kr[4], ord[4];
    __m512i vlo[4], vhi[4];
    __m512 mx[4], msub[4], sum[4];
    FA_AVX512_UNROLL
    for (int i = 0; i < nv; i++) {
        kr[i] = fa_avx512_head_mask(rows_left - 16 * i);
        mx[i] = _mm512_set1_ps(-INFINITY);
        ord[i] = 0xFFFF;
        if (lo) {
            vlo[i] = _mm512_maskz_loadu_epi32(kr[i], lo + 16 * i);
            vhi[i] = _mm512_maskz_loadu_epi32(kr[i], hi + 16 * i);
        }
    }

    /* 1. the tile's row maxima over kept columns. vmaxps drops a NaN in its
     * first operand (it returns the second when either is NaN), so NaN is
     * tracked apart, in ord[i] = "every kept score so far was ordered"; and
     * max(x, mx) keeps the earlier of two equal values, as the reference's
     * strict > does (visible only as the sign of a zero maximum). */
    if (lo) {
        for (int64_t c = 0; c < cols; c++) {
            const float *sc = st + c * ldst;
            const __m512i cv = _mm512_set1_epi32((int32_t)c);
            FA_AVX512_UNROLL
            for (int i = 0; i < nv; i++) {
                const __m512 x = _mm512_load_ps(sc + 16 * i);
                const __mmask16 kept = band(vlo[i], vhi[i], cv);
                mx[i] = _mm512_mask_max_ps(mx[i], kept, x, mx[i]);
                ord[i] &= (__mmask16)~_mm512_mask_cmp_ps_mask(kept, x, x, _CMP_UNORD_Q);
            }
        }
    } else {
        for (int64_t c = 0; c < cols; c++) {
            const float *sc = st + c * ldst;
            FA_AVX512_UNROLL
            for (int i = 0; i < nv; i++) {
                const __m512 x = _mm512_load_ps(sc + 16 * i);
                mx[i] = _mm512_max_ps(x, mx[i]);
                ord[i] = _mm512_mask_cmp_ps_mask(ord[i], x, x, _CMP_ORD_Q);
            }
        }
    }

    /* 2. m_new, alpha, and l*alpha; a row with nothing kept yet (m_new = -inf)
     * gets alpha = 1 and subtracts 0, so its -inf scores give exp(-inf) = 0
     * instead of exp(-inf - -inf) = NaN */
    FA_AVX512_UNROLL
    for (int i = 0; i < nv; i++) {
        const __m512 mold = _mm512_maskz_loadu_ps(kr[i], m + 16 * i);
        const __m512 tmax = _mm512_mask_mov_ps(mx[i], (__mmask16)~ord[i], _mm512_set1_ps(NAN));
        /* m_new = max(m_old, tile max), NaN if either is: vmaxps keeps m_old on ties */
        const __m512 mnew = _mm512_mask_mov_ps(_mm512_max_ps(tmax, mold),
                                               _mm512_cmp_ps_mask(tmax, mold, _CMP_UNORD_Q), _mm512_set1_ps(NAN));
        const __mmask16 none = _mm512_cmp_ps_mask(mnew, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
        const __m512 al = _mm512_mask_mov_ps(fa_avx512_exp(_mm512_sub_ps(mold, mnew)), none, _mm512_set1_ps(1.0f));
        msub[i] = _mm512_mask_mov_ps(mnew, none, _mm512_setzero_ps());
        sum[i] = _mm512_mul_ps(_mm512_maskz_loadu_ps(kr[i], l + 16 * i), al);
        _mm512_mask_storeu_ps(m + 16 * i, kr[i], mnew);
        _mm512_mask_storeu_ps(alpha + 16 * i, kr[i], al);
    }

    /* 3. p = exp(s - m_new) where kept, else 0 */
    if (lo) {
        for (int64_t c = 0; c < cols; c++) {
            float *sc = st + c * ldst;
            const __m512i cv = _mm512_set1_epi32((int32_t)c);
            FA_AVX512_UNROLL
            for (int i = 0; i < nv; i++) {
                const __m512 x = _mm512_sub_ps(_mm512_load_ps(sc + 16 * i), msub[i]);
                const __m512 p = _mm512_maskz_mov_ps(band(vlo[i], vhi[i], cv), fa_avx512_exp(x));
                _mm512_store_ps(sc + 16 * i, p);
                sum[i] = _mm512_add_ps(sum[i], p);
            }
        }
    } else {
        for (int64_t c = 0; c < cols; c++) {
            float *sc = st + c * ldst;
            FA_AVX512_UNROLL
            for (int i = 0; i < nv; i++) {
                const __m512 p = fa_avx512_exp(_mm512_sub_ps(_mm512_load_ps(sc + 16 * i), msub[i]));
                _mm512_store_ps(sc + 16 * i, p);
                sum[i] = _mm512_add_ps(sum[i], p);
            }
        }
    }
    FA_AVX512_UNROLL
    for (int i = 0; i < nv; i++) _mm512_mask_storeu_ps(l + 16 * i, kr[i], sum[i]);
}

/* One function per panel height (see the top of the file). */
static void softmax_panel4(const softmax_args *a) { softmax_panel(4, a); }
static void softmax_panel3(const softmax_args *a) { softmax_panel(3, a); }
static void softmax_panel2(const softmax_args *a) { softmax_panel(2, a); }
static void softmax_panel1(const softmax_args *a) { softmax_panel(1, a); }

void fa_avx512_softmax(int64_t rows, int64_t cols, float *st, int64_t ldst, const int32_t *lo, const int32_t *hi,
                       float *m, float *l, float *alpha)
{
    static void (*const panel[5])(const softmax_args *) = {NULL, softmax_panel1, softmax_panel2, softmax_panel3,
                                                           softmax_panel4};
    /* 64 rows per pass: four independent max/sum chains, and a 256-byte
     * contiguous run of st per column */
    for (int64_t r0 = 0; r0 < rows; r0 += 64) {
        const int64_t left = rows - r0;
        const softmax_args a = {left, cols, st + r0, ldst, lo ? lo + r0 : NULL, lo ? hi + r0 : NULL,
                                m + r0, l + r0, alpha + r0};
        panel[MIN64(4, (left + 15) / 16)](&a);
    }
}

/* ----------------------------------------------------------------------- pv */

enum { SX_NR = 6, SX_NV = 4, PV_CCHUNK = 128, STX_RCHUNK = 128 };

/*
 * pv and stx (backward) are one tile: acc[j][16i..] = alpha[j] * acc[j][16i..] +
 * sum_k s(j, k) * x[k][16i..] for j < valid <= nr, i < nv, s(j, k) = s[j*sj + k*sk];
 * with masked, the last vector of a row is masked by tail (alpha NULL: no rescale).
 *   pv:  j a row r, k a column c: s(r, c) = st[c][r] (sj 1, sk ldst), x = V.
 *   stx: j a column c, k a row r: s(c, r) = st[c][r] (sj ldst, sk 1), no alpha.
 * sx_panel passes each one's strides and alpha as constants, so each instance
 * compiles to a kernel of its own. A padded tile runs nr rows too, the missing
 * ones repeating the last real row, never loaded or stored (see qk_tile).
 */
FA_AVX512_INLINE void sx_tile(const int nr, const int nv, const int masked, __mmask16 tail, int64_t valid,
                              int64_t n, const float *s, const int64_t sj, const int64_t sk, const float *x,
                              int64_t ldx, const float *alpha, float *acc, int64_t ldacc)
{
    __m512 a[SX_NR][SX_NV];
    const float *sr[SX_NR];
    FA_AVX512_UNROLL
    for (int j = 0; j < nr; j++) {
        sr[j] = s + MIN64(j, valid - 1) * sj;
        float *aj = acc + j * ldacc;
        const __m512 al = _mm512_set1_ps(alpha && j < valid ? alpha[j] : 1.0f);
        FA_AVX512_UNROLL
        for (int i = 0; i < nv; i++) {
            if (j >= valid) a[j][i] = _mm512_setzero_ps();
            else if (masked && i == nv - 1) a[j][i] = _mm512_maskz_loadu_ps(tail, aj + 16 * i);
            else a[j][i] = _mm512_loadu_ps(aj + 16 * i);
            if (alpha) a[j][i] = _mm512_mul_ps(a[j][i], al);
        }
    }
    for (int64_t k = 0; k < n; k++) {
        const float *xk = x + k * ldx;
        const int64_t sc = k * sk;
        __m512 xv[SX_NV];
        FA_AVX512_UNROLL
        for (int i = 0; i < nv; i++)
            xv[i] = masked && i == nv - 1 ? _mm512_maskz_loadu_ps(tail, xk + 16 * i) : _mm512_loadu_ps(xk + 16 * i);
        FA_AVX512_UNROLL
        for (int j = 0; j < nr; j++) {
            const __m512 p = _mm512_set1_ps(sr[j][sc]);
            FA_AVX512_UNROLL
            for (int i = 0; i < nv; i++) a[j][i] = _mm512_fmadd_ps(p, xv[i], a[j][i]);
        }
    }
    FA_AVX512_UNROLL
    for (int j = 0; j < nr; j++) {
        if (j >= valid) break;
        float *aj = acc + j * ldacc;
        FA_AVX512_UNROLL
        for (int i = 0; i < nv; i++) {
            if (masked && i == nv - 1) _mm512_mask_storeu_ps(aj + 16 * i, tail, a[j][i]);
            else _mm512_storeu_ps(aj + 16 * i, a[j][i]);
        }
    }
}

typedef struct {
    __mmask16 tail;  /* the last vector's lanes, when masked */
    int64_t rows, n; /* the acc rows j, and the k summed over */
    const float *st;
    int64_t ldst;
    int by_row; /* 1: st[j][k] (stx), 0: st[k][j] (pv) */
    const float *x;
    int64_t ldx;
    const float *alpha; /* NULL: no rescale */
    float *acc;
    int64_t ldacc;
} sx_args;

/* Every row j against one 16*nv-wide slice of x: 6-row tiles, then 5-row ones
 * (see qk_panel). */
FA_AVX512_INLINE void sx_panel(const int nv, const int masked, const int by_row, const sx_args *a)
{
    const int64_t sj = by_row ? a->ldst : 1, sk = by_row ? 1 : a->ldst;
    const int64_t r6 = fa_avx512_split65(a->rows);
    for (int64_t r = 0; r < r6; r += SX_NR)
        sx_tile(SX_NR, nv, masked, a->tail, MIN64(SX_NR, r6 - r), a->n, a->st + r * sj, sj, sk, a->x, a->ldx,
                !by_row && a->alpha ? a->alpha + r : NULL, a->acc + r * a->ldacc, a->ldacc);
    for (int64_t r = r6; r < a->rows; r += SX_NR - 1)
        sx_tile(SX_NR - 1, nv, masked, a->tail, SX_NR - 1, a->n, a->st + r * sj, sj, sk, a->x, a->ldx,
                !by_row && a->alpha ? a->alpha + r : NULL, a->acc + r * a->ldacc, a->ldacc);
}

/* One function per block width (see the top of the file), each holding pv's and
 * stx's instances, never merged (their strides differ, not their blocks). Whole
 * vectors get masked = 0, which compiles to plain loads and stores: masked ones
 * cost time in pv. */
static void sx_panel4(const sx_args *a) { a->by_row ? sx_panel(4, 0, 1, a) : sx_panel(4, 0, 0, a); }
static void sx_panel3(const sx_args *a) { a->by_row ? sx_panel(3, 0, 1, a) : sx_panel(3, 0, 0, a); }
static void sx_panel2(const sx_args *a) { a->by_row ? sx_panel(2, 0, 1, a) : sx_panel(2, 0, 0, a); }
static void sx_panel1(const sx_args *a) { a->by_row ? sx_panel(1, 0, 1, a) : sx_panel(1, 0, 0, a); }
static void sx_panel4m(const sx_args *a) { a->by_row ? sx_panel(4, 1, 1, a) : sx_panel(4, 1, 0, a); }
static void sx_panel3m(const sx_args *a) { a->by_row ? sx_panel(3, 1, 1, a) : sx_panel(3, 1, 0, a); }
static void sx_panel2m(const sx_args *a) { a->by_row ? sx_panel(2, 1, 1, a) : sx_panel(2, 1, 0, a); }
static void sx_panel1m(const sx_args *a) { a->by_row ? sx_panel(1, 1, 1, a) : sx_panel(1, 1, 0, a); }

/* One e-block (16*nv <= 64 wide, its last vector masked by a->tail) of every row. */
static void sx_slice(int64_t nv, const sx_args *a)
{
    static void (*const whole[SX_NV + 1])(const sx_args *) = {NULL, sx_panel1, sx_panel2, sx_panel3, sx_panel4};
    static void (*const part[SX_NV + 1])(const sx_args *) = {NULL, sx_panel1m, sx_panel2m, sx_panel3m, sx_panel4m};
    (a->tail == 0xFFFF ? whole : part)[nv](a);
}

/* pv's slice: every row over cc columns. */
static void pv_slice(int64_t nv, __mmask16 tail, int64_t rows, int64_t cc, const float *sc, int64_t ldst,
                     const float *vp, int64_t ldv, const float *al, float *ap, int64_t ldacc)
{
    const sx_args a = {tail, rows, cc, sc, ldst, 0, vp, ldv, al, ap, ldacc};
    sx_slice(nv, &a);
}

/*
 * V rows a page or more apart, or a multiple of 1 KB apart, fall into a few L1
 * (and L2) sets and each needs its own TLB entry, so the slice the row blocks
 * reuse is evicted before its reuse (the 16 KB row stride of a BSND tensor with
 * 32 heads is such a case). Such slices are first copied to a contiguous buffer
 * (32 KB of stack), which gets most of the loss back: the copy waits on L3 once
 * per row and slice, a cost the rows share. A caller that packs V rows densely
 * avoids both.
 */
static void pv_copying(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const float *v,
                       int64_t ldv, const float *alpha, float *acc, int64_t ldacc)
{
    _Alignas(64) float buf[PV_CCHUNK * 16 * SX_NV]; /* (PV_CCHUNK, 64) */
    for (int64_t c0 = 0; c0 < cols; c0 += PV_CCHUNK) {
        const int64_t cc = MIN64(PV_CCHUNK, cols - c0);
        const float *al = c0 == 0 ? alpha : NULL;
        const float *sc = st + c0 * ldst;
        for (int64_t e0 = 0; e0 < dv; e0 += 16 * SX_NV) {
            const int64_t ne = MIN64(16 * SX_NV, dv - e0), nv = (ne + 15) / 16;
            const __mmask16 tail = fa_avx512_head_mask(ne - 16 * (nv - 1));
            for (int64_t c = 0; c < cc; c++) {
                const float *vr = v + (c0 + c) * ldv + e0;
                for (int64_t i = 0; i < nv; i++)
                    _mm512_store_ps(buf + c * 16 * SX_NV + 16 * i,
                                    _mm512_maskz_loadu_ps(i == nv - 1 ? tail : (__mmask16)0xFFFF, vr + 16 * i));
            }
            pv_slice(nv, tail, rows, cc, sc, ldst, buf, 16 * SX_NV, al, acc + e0, ldacc);
        }
    }
}

void fa_avx512_pv_6x64(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const float *v,
                  int64_t ldv, const float *alpha, float *acc, int64_t ldacc)
{
    if (rows > 2 * SX_NR && fa_rows_scattered(ldv * (int64_t)sizeof(float))) {
        pv_copying(rows, cols, dv, st, ldst, v, ldv, alpha, acc, ldacc);
        return;
    }
    /* 128 columns at a time, so the 32 KB V slice the row blocks share stays
     * near (shorter chunks reload acc more often than they gain); acc is
     * rescaled by alpha only in the first chunk */
    for (int64_t c0 = 0; c0 < cols; c0 += PV_CCHUNK) {
        const int64_t cc = MIN64(PV_CCHUNK, cols - c0);
        const float *al = c0 == 0 ? alpha : NULL;
        const float *sc = st + c0 * ldst, *vc = v + c0 * ldv;
        for (int64_t e0 = 0; e0 < dv; e0 += 16 * SX_NV) {
            const int64_t ne = MIN64(16 * SX_NV, dv - e0), nv = (ne + 15) / 16;
            pv_slice(nv, fa_avx512_head_mask(ne - 16 * (nv - 1)), rows, cc, sc, ldst, vc + e0, ldv, al, acc + e0,
                     ldacc);
        }
    }
}

/* ---------------------------------------------------------------- backward */

/*
 * ds: p * (dp - dvec), 4 vectors (64 rows) of dvec held over every column, then
 * single vectors: round_up(rows, 16) is a whole number of them. Masked p = 0 must
 * give 0 whatever dp is (inf - dvec times 0 would be NaN), so the product is
 * zero-masked by p != 0; the unordered compare keeps NaN p in the product, where
 * it stays NaN.
 */
FA_AVX512_INLINE void ds_strip(const int nv, int64_t cols, const float *st, int64_t ldst, float *dp, int64_t lddp,
                               const float *dvec)
{
    __m512 dv[4];
    FA_AVX512_UNROLL
    for (int i = 0; i < nv; i++) dv[i] = _mm512_loadu_ps(dvec + 16 * i); /* dvec: no alignment promised */
    for (int64_t c = 0; c < cols; c++) {
        const float *pc = st + c * ldst;
        float *dc = dp + c * lddp;
        FA_AVX512_UNROLL
        for (int i = 0; i < nv; i++) {
            const __m512 p = _mm512_load_ps(pc + 16 * i);
            const __mmask16 kept = _mm512_cmp_ps_mask(p, _mm512_setzero_ps(), _CMP_NEQ_UQ);
            const __m512 diff = _mm512_sub_ps(_mm512_load_ps(dc + 16 * i), dv[i]);
            _mm512_store_ps(dc + 16 * i, _mm512_maskz_mul_ps(kept, p, diff));
        }
    }
}

void fa_avx512_ds(int64_t rows, int64_t cols, const float *st, int64_t ldst, float *dp, int64_t lddp,
                  const float *dvec)
{
    const int64_t rp = (rows + 15) / 16 * 16;
    int64_t r = 0;
    for (; r + 64 <= rp; r += 64) ds_strip(4, cols, st + r, ldst, dp + r, lddp, dvec + r);
    for (; r < rp; r += 16) ds_strip(1, cols, st + r, ldst, dp + r, lddp, dvec + r);
}

/*
 * stx: acc[c][e] += sum_r st[c][r] x[r][e]. pv's block with the roles of the
 * tile's two axes swapped: 6 acc rows c (broadcasts st[c][r], from 6 rows of st
 * walked along r) x 64 e (4 zmm of an x row, loaded once per r for all 6), 24
 * accumulators over a chunk of rows. The chunk, 128 rows of a 64-wide slice of x
 * (32 KB), is what every c block reuses, as pv's V slice. Column counts go in
 * 6-blocks then 5-blocks (fa_avx512_split65), a padded block repeating its last
 * real row of st, never storing it: sx_tile with the strides of st swapped.
 */
static void stx_slice(int64_t nv, __mmask16 tail, int64_t rows, int64_t cols, const float *st, int64_t ldst,
                      const float *x, int64_t ldx, float *acc, int64_t ldacc)
{
    const sx_args a = {tail, cols, rows, st, ldst, 1, x, ldx, NULL, acc, ldacc};
    sx_slice(nv, &a);
}

/* x rows of a user tensor (Q, dO) are often 4 KB or more apart: the slice the c
 * blocks share is then copied first, for fa_rows_scattered's reason (kernels.h). */
void fa_avx512_stx_6x64(int64_t rows, int64_t cols, int64_t n, const float *st, int64_t ldst, const float *x,
                        int64_t ldx, float *acc, int64_t ldacc)
{
    _Alignas(64) float buf[STX_RCHUNK * 16 * SX_NV]; /* (STX_RCHUNK, 64) */
    const int copy = cols > 2 * SX_NR && fa_rows_scattered(ldx * (int64_t)sizeof(float));
    for (int64_t r0 = 0; r0 < rows; r0 += STX_RCHUNK) {
        const int64_t rr = MIN64(STX_RCHUNK, rows - r0);
        for (int64_t e0 = 0; e0 < n; e0 += 16 * SX_NV) {
            const int64_t ne = MIN64(16 * SX_NV, n - e0), nv = (ne + 15) / 16;
            const __mmask16 tail = fa_avx512_head_mask(ne - 16 * (nv - 1));
            const float *xs = x + r0 * ldx + e0;
            int64_t lds = ldx;
            if (copy) {
                for (int64_t r = 0; r < rr; r++)
                    for (int64_t i = 0; i < nv; i++)
                        _mm512_store_ps(buf + r * 16 * SX_NV + 16 * i,
                                        _mm512_maskz_loadu_ps(i == nv - 1 ? tail : (__mmask16)0xFFFF,
                                                              xs + r * ldx + 16 * i));
                xs = buf;
                lds = 16 * SX_NV;
            }
            stx_slice(nv, tail, rr, cols, st + r0, ldst, xs, lds, acc + e0, ldacc);
        }
    }
}

/* -------------------------------------------------------------- conversions */

/* bf16 is the top half of an f32: widen and shift, exact (NaN stays NaN). */
FA_AVX512_INLINE __m512 bf16x16_to_f32(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* n f16 (vcvtph2ps) or bf16 values to f32, the tail masked; bf16 a constant. */
FA_AVX512_INLINE void half_to_f32(const int bf16, const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i h = _mm256_loadu_si256((const __m256i *)(src + i));
        _mm512_storeu_ps(dst + i, bf16 ? bf16x16_to_f32(h) : _mm512_cvtph_ps(h));
    }
    if (i < n) {
        const __mmask16 k = fa_avx512_head_mask(n - i);
        const __m256i h = _mm256_maskz_loadu_epi16(k, src + i);
        _mm512_mask_storeu_ps(dst + i, k, bf16 ? bf16x16_to_f32(h) : _mm512_cvtph_ps(h));
    }
}

void fa_avx512_f16_to_f32(const uint16_t *src, float *dst, int64_t n) { half_to_f32(0, src, dst, n); }

void fa_avx512_bf16_to_f32(const uint16_t *src, float *dst, int64_t n) { half_to_f32(1, src, dst, n); }

/* sum_rows_bf16 (kernels.h): 128 channels at a time in 16 accumulators of 8 doubles, the
 * rows streamed through them in order, so each channel's additions are the reference's
 * (the widening bf16 -> f32 -> double is exact). */
void fa_avx512_sum_rows_bf16(int64_t rows, int64_t d, const uint16_t *x, int64_t ld, double *sum)
{
    for (int64_t e0 = 0; e0 < d; e0 += 128) {
        __mmask8 m[16];
        __m512d acc[16];
        for (int g = 0; g < 16; g++) {
            const int64_t left = d - e0 - 8 * g;
            m[g] = left >= 8 ? (__mmask8)0xff : left > 0 ? (__mmask8)((1u << left) - 1u) : 0;
            acc[g] = _mm512_maskz_loadu_pd(m[g], sum + e0 + 8 * g);
        }
        for (int64_t r = 0; r < rows; r++) {
            const uint16_t *row = x + r * ld + e0;
            /* rows ld apart (a head's keys in a dense tensor: a page or more) defeat the
             * hardware prefetcher, so fetch a few rows ahead */
            if (r + 8 < rows)
                for (int64_t b = 0; b < 256 && e0 + b / 2 < d; b += 64)
                    _mm_prefetch((const char *)(row + 8 * ld) + b, _MM_HINT_T0);
            for (int g = 0; g < 16; g++) {
                const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_maskz_loadu_epi16(m[g], row + 8 * g)), 16);
                acc[g] = _mm512_add_pd(acc[g], _mm512_cvtps_pd(_mm256_castsi256_ps(w)));
            }
        }
        for (int g = 0; g < 16; g++) _mm512_mask_storeu_pd(sum + e0 + 8 * g, m[g], acc[g]);
    }
}

/* dot_rows_f64 (kernels.h): a row per double lane, 16 rows at a time in two chains, each
 * lane's sum in the reference's order (16 rows' 16 elements loaded and transposed, the
 * elements past the last 16 gathered; the products are exact, so the fma rounds as the
 * reference's addition does); the rows left, and rows too far apart for 32-bit gather
 * offsets, as the reference sums them. */
void fa_avx512_dot_rows_f64(int64_t rows, int64_t d, const float *x, int64_t ldx, const float *y, float *out)
{
    int64_t r = 0;
    if (ldx <= INT32_MAX / 64) {
        const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)ldx));
        for (; r + 16 <= rows; r += 16) {
            const float *x0 = x + r * ldx, *x1 = x0 + 8 * ldx;
            __m512d c0 = _mm512_setzero_pd(), c1 = _mm512_setzero_pd();
            int64_t e = 0;
            for (; e + 16 <= d; e += 16) {
                __m512 t[16];
                for (int i = 0; i < 16; i++) t[i] = _mm512_loadu_ps(x0 + i * ldx + e);
                fa_avx512_transpose16(t);
                for (int j = 0; j < 16; j++) {
                    const __m512d ye = _mm512_set1_pd((double)y[e + j]);
                    c0 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(t[j])), ye, c0);
                    c1 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(t[j]), 1))),
                                         ye, c1);
                }
            }
            for (; e < d; e++) {
                const __m512d ye = _mm512_set1_pd((double)y[e]);
                c0 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_i32gather_ps(x0 + e, idx, 4)), ye, c0);
                c1 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_i32gather_ps(x1 + e, idx, 4)), ye, c1);
            }
            _mm256_storeu_ps(out + r, _mm512_cvtpd_ps(c0));
            _mm256_storeu_ps(out + r + 8, _mm512_cvtpd_ps(c1));
        }
    }
    for (; r < rows; r++) {
        double c = 0.0;
        for (int64_t e = 0; e < d; e++) c += (double)x[r * ldx + e] * (double)y[e];
        out[r] = (float)c;
    }
}

/* f32 -> f16 by vcvtps2ph, round to nearest even: half.h's rounding, overflow and
 * NaN bits (sign, quiet bit, the payload's top ten bits) exactly. */
void fa_avx512_f32_to_f16(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        const __mmask16 k = fa_avx512_head_mask(n - i);
        _mm256_mask_storeu_epi16(dst + i, k,
                                 _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, src + i),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
}

/* f32 -> bf16 exactly as half.h rounds it: the high halves of the rounded dwords. */
FA_AVX512_INLINE __m256i f32x16_to_bf16(__m512 v)
{
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(fa_avx512_round_bf16_hi(v), 16));
}

void fa_avx512_f32_to_bf16(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(dst + i), f32x16_to_bf16(_mm512_loadu_ps(src + i)));
    if (i < n) {
        const __mmask16 k = fa_avx512_head_mask(n - i);
        _mm256_mask_storeu_epi16(dst + i, k, f32x16_to_bf16(_mm512_maskz_loadu_ps(k, src + i)));
    }
}

/* ------------------------------------------------------ small-row (decode) path */

/*
 * Decoding attends a few query rows (rows <= FA_SMALL_ROWS: the GQA heads of one
 * or a few tokens) to a long cache of f32, f16, bf16, int8 or fp8 K/V rows, each
 * reached through its own pointer. The work is a stream over K and V, so each
 * K/V vector is loaded and widened to f32 in a register once per call and then
 * feeds one FMA per query row; nothing widened is ever stored. Vectors run along
 * the head dim (x, e) and the scores are row-major, s[r][c]:
 *
 *   qk_small  a block of NC columns x R rows of accumulators along x
 *             (R * NC <= 16), each K vector feeding R FMAs. The 16 lanes of each
 *             accumulator are summed by a transposing add tree (sum_pair,
 *             sum_quad, sum_16) that leaves s[r][c0..c0+15] in one vector: one
 *             aligned store per row and 16 columns, the padding columns of the
 *             last block written with junk (kernels.h allows it). Per output the
 *             tree costs ~3 uops, against d/16 FMAs.
 *   softmax_small  per row, vectors along c; the band as a lane mask.
 *   pv_small  R rows x NV vectors of e as accumulators (R * NV <= 16), each V
 *             vector feeding R FMAs with p broadcast; the e that the multiples
 *             of 16 * NV leave run one (masked) vector at a time.
 *
 * Widening costs two uops per 16 elements on the FMA ports (vcvtph2ps; vpmovsxbd
 * + vcvtdq2ps) against R FMAs, so it, not the FMAs, bounds rows = 1..2. At rows =
 * 4, D = Dv = 128, a key of f16 or int8 is 64 FMAs and 16 conversions (48 cycles
 * on the two ports) plus ~11 uops of add tree. bf16 is cheaper: a 64-byte load of
 * 32 elements splits into the even ones (dword << 16) and the odd ones (dword &
 * 0xffff0000), one uop per 16 (KV_BF16P). qk_small then runs x
 * in that order (q is permuted to match when it is copied), pv_small keeps its
 * accumulators as even and odd e and interleaves them when storing.
 *
 * Both matrix kernels prefetch the rows SK_PF columns ahead: a paged cache's
 * rows are a page apart or scattered, where the hardware prefetchers see no
 * stream; it pays when K/V come from DRAM and costs a little when they sit in L2
 * (bench/README.md, "Kernel and plan notes"). R, NC,
 * NV and the element type are compile-time constants of one function each (see
 * the top of the file): 8 row counts x 4 types (bf16 only as KV_BF16P, but for
 * pv_small's remainder).
 */
enum { SK_PF = 32, QS_QMAX = 512, PS_CB = 128 };

/* The internal type after kernels.h's: bf16 as even/odd pairs (see above). */
enum { KV_BF16P = FA_KV_TYPES, KV_TYPES = FA_KV_TYPES + 1 };

FA_AVX512_INLINE int64_t kv_bytes(const int kv)
{
    return kv == KV_BF16P ? 2 : fa_kv_elem_bytes(kv);
}

/* 16 E4M3 codes as binary16 of value / 256 (half.h's fa_e4m3_to_f16_bits), in four
 * uops: t = the sign-extended byte << 7 puts the sign in bits 15 and 14 and exponent
 * and mantissa in binary16's fields (subnormals included); bit 14 must become "NaN
 * code" (all of 0x3f80 set, then exponent 31). t + 0x80 carries into bit 14 exactly
 * for the NaN codes, so bit 14 of t ^ (t + 0x80) is that flag: one ternary logic
 * op puts it in place, t ^ ((t + 0x80) & 0x4000). */
FA_AVX512_INLINE __m256i e4m3x16_to_f16(__m128i b)
{
    const __m256i t = _mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7);
    const __m256i u = _mm256_add_epi16(t, _mm256_set1_epi16(0x80));
    return _mm256_ternarylogic_epi32(t, u, _mm256_set1_epi16(0x4000), 0x78); /* a ^ (b & c) */
}

/* 32 E4M3 codes as f32 of value / 256, the first 16 in *lo: e4m3x16_to_f16's steps on
 * all 32 at once in a 512-bit vector (the same bits, fewer uops per element) */
FA_AVX512_INLINE void e4m3x32_to_f32(__m256i b, __m512 *lo, __m512 *hi)
{
    const __m512i t = _mm512_slli_epi16(_mm512_cvtepi8_epi16(b), 7);
    const __m512i u = _mm512_add_epi16(t, _mm512_set1_epi16(0x80));
    const __m512i h = _mm512_ternarylogic_epi32(t, u, _mm512_set1_epi16(0x4000), 0x78); /* a ^ (b & c) */
    *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

/* Elements x..x+15 of a K/V row of type kv (not KV_BF16P), as f32 (unscaled: the
 * int8 code; fp8 as its value / fa_kv_load_unit); masked: only the lanes in k are
 * read, the others are 0. */
FA_AVX512_INLINE __m512 kv_load(const int kv, const int masked, __mmask16 k, const void *row, int64_t x)
{
    if (kv == FA_KV_F8E4M3 || kv == FA_KV_F8E5M2) {
        const uint8_t *p = (const uint8_t *)row + x;
        const __m128i b = masked ? _mm_maskz_loadu_epi8(k, p) : _mm_loadu_si128((const __m128i *)p);
        if (kv == FA_KV_F8E4M3) return _mm512_cvtph_ps(e4m3x16_to_f16(b));
        /* E5M2: each byte the top of a binary16. The 16 bytes in both 128-bit lanes (a
         * broadcast load: no ALU uop) and one byte shuffle (zeros below) */
        const __m256i hi = _mm256_setr_epi8(-1, 0, -1, 1, -1, 2, -1, 3, -1, 4, -1, 5, -1, 6, -1, 7, -1, 8, -1, 9, -1,
                                            10, -1, 11, -1, 12, -1, 13, -1, 14, -1, 15);
        return _mm512_cvtph_ps(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(b), hi));
    }
    if (kv == FA_KV_F16) {
        const uint16_t *p = (const uint16_t *)row + x;
        return _mm512_cvtph_ps(masked ? _mm256_maskz_loadu_epi16(k, p) : _mm256_loadu_si256((const __m256i *)p));
    }
    if (kv == FA_KV_BF16) {
        const uint16_t *p = (const uint16_t *)row + x;
        return bf16x16_to_f32(masked ? _mm256_maskz_loadu_epi16(k, p) : _mm256_loadu_si256((const __m256i *)p));
    }
    if (kv == FA_KV_I8) {
        const int8_t *p = (const int8_t *)row + x;
        return _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(masked ? _mm_maskz_loadu_epi8(k, p) : _mm_loadu_si128((const __m128i *)p)));
    }
    const float *p = (const float *)row + x;
    return masked ? _mm512_maskz_loadu_ps(k, p) : _mm512_loadu_ps(p);
}

/* bf16 elements x..x+31 of a row as f32: *even = elements x, x+2, ..., *odd =
 * x+1, x+3, ... (exact, as bf16x16_to_f32); masked: only the elements in k are read. */
FA_AVX512_INLINE void bf16_pairs(const int masked, __mmask32 k, const void *row, int64_t x, __m512 *even, __m512 *odd)
{
    const uint16_t *p = (const uint16_t *)row + x;
    const __m512i raw = masked ? _mm512_maskz_loadu_epi16(k, p) : _mm512_loadu_si512(p);
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32((int32_t)0xFFFF0000u)));
}

/* Lanes picking the even (then odd) elements of the 32 floats a:b, and lanes
 * interleaving two vectors of 16 back (lo: elements 0..15, hi: 16..31). */
static const int32_t SK_EVEN[16] = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
static const int32_t SK_ODD[16] = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
static const int32_t SK_ZIP_LO[16] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
static const int32_t SK_ZIP_HI[16] = {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

/* Brings the n >= 1 bytes at p towards L1: one prefetch per line they touch. */
FA_AVX512_INLINE void prefetch_bytes(const void *p, int64_t n)
{
    const char *b = (const char *)p;
    const int64_t lines = ((int64_t)((uintptr_t)b & 63) + n + 63) / 64;
    for (int64_t i = 0; i < lines; i++) _mm_prefetch(b + 64 * i, _MM_HINT_T0);
}

/*
 * The transposing add tree, 16 accumulators a_0..a_15 -> one vector whose lane j
 * is the sum of a_j's lanes. Step 1 on a_j, a_j+1: 128-bit lane L holds
 * [a_j[4L]+a_j[4L+2], a_j+1[4L]+a_j+1[4L+2], a_j[4L+1]+a_j[4L+3], a_j+1[...]].
 */
FA_AVX512_INLINE __m512 sum_pair(__m512 a, __m512 b)
{
    return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
}

/* Step 2 on the pairs (a_j, a_j+1), (a_j+2, a_j+3): lane L = [the sums of lane L of a_j..a_j+3] */
FA_AVX512_INLINE __m512 sum_quad(__m512 x, __m512 y)
{
    const __m512d a = _mm512_castps_pd(x), b = _mm512_castps_pd(y);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
}

/* Steps 3 and 4 on the quads of a_0..3, a_4..7, a_8..11, a_12..15: the 16 sums in order */
FA_AVX512_INLINE __m512 sum_16(__m512 v0, __m512 v1, __m512 v2, __m512 v3)
{
    const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, 0x44), _mm512_shuffle_f32x4(v0, v1, 0xEE));
    const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, 0x44), _mm512_shuffle_f32x4(v2, v3, 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xDD));
}

typedef struct {
    int64_t cols, d;
    int64_t x0;        /* the chunk of x: k_c[x0 .. x0 + d) */
    int first, last;   /* first: store s, else add to it; last: then apply kscale */
    const float *q;    /* the chunk, aligned, zero-padded to a multiple of 32; KV_BF16P: per 32 x the evens, then the odds */
    int64_t ldq;
    const void *const *krow;
    const float *kscale; /* the scaled types (i8, fp8) only; NULL = 1 */
    float *s;
    int64_t lds;
} qks_args;

/* Keeps v in a register. Without it GCC folds a load that feeds several FMAs
 * into each of them as a memory operand, and qk_small at rows = 8 turns
 * load-bound (18 loads per 16 FMAs). */
#define SK_IN_REG(v) __asm__("" : "+v"(v))

/*
 * acc[r][j] += q[r][x..] * k_j[x..] for the step of x at x (KV_BF16P: 32, else
 * 16; masked by tail). The vectors reused across the step stay in registers: the
 * R (KV_BF16P: 2R) q vectors, with the columns outermost, or for KV_BF16P with
 * R > NC the 2NC K vectors, with the rows outermost (2R + R*NC would not fit).
 */
FA_AVX512_INLINE void qks_step(const int kv, const int R, const int NC, const int masked, __mmask32 tail,
                               const float *q, int64_t ldq, const char *const kc[], int64_t x,
                               __m512 acc[FA_SMALL_ROWS][16])
{
    if (kv == KV_BF16P && R > NC) {
        __m512 ke[16], ko[16];
        FA_AVX512_UNROLL
        for (int j = 0; j < NC; j++) {
            bf16_pairs(masked, tail, kc[j], x, &ke[j], &ko[j]);
            SK_IN_REG(ke[j]);
            SK_IN_REG(ko[j]);
        }
        FA_AVX512_UNROLL
        for (int r = 0; r < R; r++) {
            __m512 qe = _mm512_load_ps(q + r * ldq + x), qo = _mm512_load_ps(q + r * ldq + x + 16);
            SK_IN_REG(qe);
            SK_IN_REG(qo);
            FA_AVX512_UNROLL
            for (int j = 0; j < NC; j++)
                acc[r][j] = _mm512_fmadd_ps(qo, ko[j], _mm512_fmadd_ps(qe, ke[j], acc[r][j]));
        }
        return;
    }
    if (kv == KV_BF16P) {
        __m512 qe[FA_SMALL_ROWS], qo[FA_SMALL_ROWS];
        FA_AVX512_UNROLL
        for (int r = 0; r < R; r++) {
            qe[r] = _mm512_load_ps(q + r * ldq + x), qo[r] = _mm512_load_ps(q + r * ldq + x + 16);
            SK_IN_REG(qe[r]);
            SK_IN_REG(qo[r]);
        }
        FA_AVX512_UNROLL
        for (int j = 0; j < NC; j++) {
            __m512 ke, ko;
            bf16_pairs(masked, tail, kc[j], x, &ke, &ko);
            FA_AVX512_UNROLL
            for (int r = 0; r < R; r++) acc[r][j] = _mm512_fmadd_ps(qo[r], ko, _mm512_fmadd_ps(qe[r], ke, acc[r][j]));
        }
        return;
    }
    __m512 qv[FA_SMALL_ROWS];
    FA_AVX512_UNROLL
    for (int r = 0; r < R; r++) {
        qv[r] = _mm512_load_ps(q + r * ldq + x); /* zero past d */
        SK_IN_REG(qv[r]);
    }
    if (kv == FA_KV_F8E4M3 && !masked) { /* two columns' codes converted together (NC is even) */
        FA_AVX512_UNROLL
        for (int j = 0; j < NC; j += 2) {
            const __m128i b0 = _mm_loadu_si128((const __m128i *)((const uint8_t *)kc[j] + x));
            const __m128i b1 = _mm_loadu_si128((const __m128i *)((const uint8_t *)kc[j + 1] + x));
            __m512 k0, k1;
            e4m3x32_to_f32(_mm256_inserti128_si256(_mm256_castsi128_si256(b0), b1, 1), &k0, &k1);
            FA_AVX512_UNROLL
            for (int r = 0; r < R; r++) {
                acc[r][j] = _mm512_fmadd_ps(qv[r], k0, acc[r][j]);
                acc[r][j + 1] = _mm512_fmadd_ps(qv[r], k1, acc[r][j + 1]);
            }
        }
        return;
    }
    FA_AVX512_UNROLL
    for (int j = 0; j < NC; j++) {
        const __m512 kx = kv_load(kv, masked, (__mmask16)tail, kc[j], x);
        FA_AVX512_UNROLL
        for (int r = 0; r < R; r++) acc[r][j] = _mm512_fmadd_ps(qv[r], kx, acc[r][j]);
    }
}

/*
 * s[r][c] (+)= sum_x q[r][x] * k_c[x0 + x] for r < R, x < d (then times kscale[c]):
 * blocks of 16 columns, each in sub-blocks of NC (even, dividing 16), whose R x NC
 * accumulators run over all of d and then go through step 1 of the tree into
 * part[r]; steps 2-4 follow per 16 columns. A sub-block past cols repeats the
 * last column; the pairs a short last block never reaches are zeroed. Both only
 * feed padding.
 */
FA_AVX512_INLINE void qks_body(const int kv, const int R, const int NC, const qks_args *a)
{
    const int64_t step = kv == KV_BF16P ? 32 : 16;
    const int64_t cols = a->cols, d = a->d, ldq = a->ldq, dfull = d - d % step, row_bytes = d * kv_bytes(kv);
    const __mmask32 tail = (__mmask32)((1ull << (d - dfull)) - 1u);
    const int64_t off = a->x0 * kv_bytes(kv);
    const float *q = a->q;
    _Alignas(64) float part[FA_SMALL_ROWS][8][16];
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
        const int64_t cend = MIN64(c0 + 16, cols);
        for (int64_t cb = c0; cb < cend; cb += NC) {
            const char *kc[16];
            FA_AVX512_UNROLL
            for (int j = 0; j < NC; j++) {
                kc[j] = (const char *)a->krow[MIN64(cb + j, cols - 1)] + off;
                if (cb + SK_PF + j < cols) prefetch_bytes((const char *)a->krow[cb + SK_PF + j] + off, row_bytes);
            }
            __m512 acc[FA_SMALL_ROWS][16];
            FA_AVX512_UNROLL
            for (int r = 0; r < R; r++)
                FA_AVX512_UNROLL
                for (int j = 0; j < NC; j++) acc[r][j] = _mm512_setzero_ps();
            for (int64_t x = 0; x < dfull; x += step) qks_step(kv, R, NC, 0, 0, q, ldq, kc, x, acc);
            if (tail) qks_step(kv, R, NC, 1, tail, q, ldq, kc, dfull, acc);
            FA_AVX512_UNROLL
            for (int r = 0; r < R; r++)
                FA_AVX512_UNROLL
                for (int j = 0; j < NC; j += 2)
                    _mm512_store_ps(part[r][(cb - c0 + j) / 2], sum_pair(acc[r][j], acc[r][j + 1]));
        }
        if (cend - c0 < 16)
            for (int64_t pr = (cend - c0 + NC - 1) / NC * NC / 2; pr < 8; pr++)
                FA_AVX512_UNROLL
                for (int r = 0; r < R; r++) _mm512_store_ps(part[r][pr], _mm512_setzero_ps());
        const int scaled = fa_kv_scaled(kv) && a->last; /* kscale NULL: 1 (E4M3 still needs its unit) */
        const __m512 ks = !scaled     ? _mm512_setzero_ps()
                          : a->kscale ? _mm512_mul_ps(_mm512_maskz_loadu_ps(fa_avx512_head_mask(cols - c0), a->kscale + c0),
                                                      _mm512_set1_ps(fa_kv_load_unit(kv))) /* a power of two: exact */
                                      : _mm512_set1_ps(fa_kv_load_unit(kv));
        FA_AVX512_UNROLL
        for (int r = 0; r < R; r++) {
            const float *pr = part[r][0];
            __m512 v = sum_16(sum_quad(_mm512_load_ps(pr), _mm512_load_ps(pr + 16)),
                              sum_quad(_mm512_load_ps(pr + 32), _mm512_load_ps(pr + 48)),
                              sum_quad(_mm512_load_ps(pr + 64), _mm512_load_ps(pr + 80)),
                              sum_quad(_mm512_load_ps(pr + 96), _mm512_load_ps(pr + 112)));
            float *sr = a->s + r * a->lds + c0;
            if (!a->first) v = _mm512_add_ps(v, _mm512_load_ps(sr));
            if (scaled) v = _mm512_mul_ps(v, ks);
            _mm512_store_ps(sr, v);
        }
    }
}

/* One function per (type, rows) (see the top of the file); NC = 16 / R, even. */
#define QKS_DEF(kv, R, NC)                                                                                              \
    static void qks_##kv##_##R(const qks_args *a) { qks_body(kv, R, NC, a); }
#define SK_DEF_ROWS(DEF, kv)                                                                                            \
    DEF(kv, 1, 8) DEF(kv, 2, 8) DEF(kv, 3, 4) DEF(kv, 4, 4) DEF(kv, 5, 2) DEF(kv, 6, 2) DEF(kv, 7, 2) DEF(kv, 8, 2)
#define SK_ROW_TABLE(P, kv)                                                                                             \
    {NULL, P##_##kv##_1, P##_##kv##_2, P##_##kv##_3, P##_##kv##_4, P##_##kv##_5, P##_##kv##_6, P##_##kv##_7,          \
     P##_##kv##_8}
SK_DEF_ROWS(QKS_DEF, FA_KV_F32)
SK_DEF_ROWS(QKS_DEF, FA_KV_F16)
SK_DEF_ROWS(QKS_DEF, FA_KV_I8)
SK_DEF_ROWS(QKS_DEF, FA_KV_F8E4M3)
SK_DEF_ROWS(QKS_DEF, FA_KV_F8E5M2)
SK_DEF_ROWS(QKS_DEF, KV_BF16P)

void fa_avx512_qk_small(int64_t rows, int64_t cols, int64_t d, const float *q, int64_t ldq, const void *const *krow,
                        int kv, const float *kscale, float *s, int64_t lds)
{
    static void (*const fn[KV_TYPES][FA_SMALL_ROWS + 1])(const qks_args *) = {
        [FA_KV_F32] = SK_ROW_TABLE(qks, FA_KV_F32), [FA_KV_F16] = SK_ROW_TABLE(qks, FA_KV_F16),
        [FA_KV_I8] = SK_ROW_TABLE(qks, FA_KV_I8), [FA_KV_F8E4M3] = SK_ROW_TABLE(qks, FA_KV_F8E4M3),
        [FA_KV_F8E5M2] = SK_ROW_TABLE(qks, FA_KV_F8E5M2), [KV_BF16P] = SK_ROW_TABLE(qks, KV_BF16P)};
    const int pairs = kv == FA_KV_BF16;
    const __m512i even = _mm512_loadu_si512(SK_EVEN), odd = _mm512_loadu_si512(SK_ODD);
    /* q goes through an aligned buffer, QS_QMAX x at a time (d is rarely more:
     * the later chunks add to s), zero-padded to a multiple of 32; for the bf16
     * pairs each 32 x as its evens, then its odds */
    _Alignas(64) float qp[FA_SMALL_ROWS * QS_QMAX];
    for (int64_t x0 = 0; x0 < d; x0 += QS_QMAX) {
        const int64_t dd = MIN64(QS_QMAX, d - x0), ld = (dd + 31) & ~(int64_t)31;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t x = 0; x < ld; x += 32) {
                const float *qx = q + r * ldq + x0 + x;
                const __m512 lo = _mm512_maskz_loadu_ps(fa_avx512_head_mask(dd - x), qx);
                const __m512 hi = _mm512_maskz_loadu_ps(fa_avx512_head_mask(dd - x > 16 ? dd - x - 16 : 0), qx + 16);
                _mm512_store_ps(qp + r * ld + x, pairs ? _mm512_permutex2var_ps(lo, even, hi) : lo);
                _mm512_store_ps(qp + r * ld + x + 16, pairs ? _mm512_permutex2var_ps(lo, odd, hi) : hi);
            }
        const qks_args a = {cols, dd, x0, x0 == 0, x0 + dd == d, qp, ld, krow, fa_kv_scaled(kv) ? kscale : NULL, s, lds};
        fn[pairs ? KV_BF16P : kv][rows](&a);
    }
}

/* max(mx, x) over the lanes in k of the 16 scores at p; NaN x are left out of mx
 * (vmaxps returns its second operand when either is NaN) and flagged in *unord. */
FA_AVX512_INLINE __m512 band_max(__m512 mx, __mmask16 *unord, __mmask16 k, const float *p)
{
    const __m512 x = _mm512_load_ps(p);
    *unord |= _mm512_mask_cmp_ps_mask(k, x, x, _CMP_UNORD_Q);
    return _mm512_mask_max_ps(mx, k, x, mx);
}

/* p = exp(s - ms) over the lanes in k of the 16 scores at p, 0 elsewhere, in place; returns sum + p. */
FA_AVX512_INLINE __m512 band_exp(__m512 sum, __m512 ms, __mmask16 k, float *p)
{
    const __m512 e = _mm512_maskz_mov_ps(k, fa_avx512_exp(_mm512_sub_ps(_mm512_load_ps(p), ms)));
    _mm512_store_ps(p, e);
    return _mm512_add_ps(sum, e);
}

/*
 * softmax on s[r][c]. Per row the kept columns are [a, z] (the band clipped to
 * the tile); the 16-column chunks f = a & ~15 .. e = z & ~15 hold them, only the
 * first and the last partly (masks kf, ke; both when f == e), and the loops run
 * the chunks between unmasked. Pass 1 finds the maximum over the kept columns
 * (NaN tracked apart, as in softmax_panel; four chains); the per-row step
 * (m_new, alpha, l * alpha) runs on one vector of the rows; pass 2 writes p
 * over round_up(cols, 16), 0 outside the band, and sums it.
 */
void fa_avx512_softmax_small(int64_t rows, int64_t cols, float *s, int64_t lds, const int32_t *lo, const int32_t *hi,
                             float *m, float *l, float *alpha)
{
    _Alignas(64) float tmax[16], msub[16], lal[16];
    int64_t bf[FA_SMALL_ROWS], be[FA_SMALL_ROWS];
    __mmask16 kf[FA_SMALL_ROWS], ke[FA_SMALL_ROWS];
    for (int64_t r = 0; r < rows; r++) {
        const int64_t a = lo && lo[r] > 0 ? lo[r] : 0, z = lo && hi[r] < cols - 1 ? hi[r] : cols - 1;
        const float *sr = s + r * lds;
        __m512 mx[4];
        for (int i = 0; i < 4; i++) mx[i] = _mm512_set1_ps(-INFINITY);
        __mmask16 unord = 0;
        bf[r] = 0, be[r] = -16; /* no chunk: nothing kept */
        if (a <= z) {
            const int64_t f = a & ~(int64_t)15, e = z & ~(int64_t)15;
            bf[r] = f, be[r] = e;
            kf[r] = (__mmask16)~fa_avx512_head_mask(a - f);
            ke[r] = fa_avx512_head_mask(z - e + 1);
            if (f == e) {
                mx[0] = band_max(mx[0], &unord, kf[r] & ke[r], sr + f);
            } else {
                mx[0] = band_max(mx[0], &unord, kf[r], sr + f);
                mx[1] = band_max(mx[1], &unord, ke[r], sr + e);
                int64_t c0 = f + 16;
                for (; c0 + 64 <= e; c0 += 64)
                    for (int i = 0; i < 4; i++) mx[i] = band_max(mx[i], &unord, 0xFFFF, sr + c0 + 16 * i);
                for (; c0 < e; c0 += 16) mx[2] = band_max(mx[2], &unord, 0xFFFF, sr + c0);
            }
        }
        tmax[r] = unord ? NAN
                        : _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(mx[0], mx[1]), _mm512_max_ps(mx[2], mx[3])));
    }
    const __mmask16 kr = fa_avx512_head_mask(rows);
    const __m512 tm = _mm512_maskz_load_ps(kr, tmax), mold = _mm512_maskz_loadu_ps(kr, m);
    /* m_new = max(m_old, tile max), NaN if either is */
    const __m512 mnew = _mm512_mask_mov_ps(_mm512_max_ps(tm, mold), _mm512_cmp_ps_mask(tm, mold, _CMP_UNORD_Q),
                                           _mm512_set1_ps(NAN));
    /* nothing kept yet: alpha = 1, and s - 0 so -inf scores give exp(-inf) = 0 */
    const __mmask16 none = _mm512_cmp_ps_mask(mnew, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
    const __m512 al = _mm512_mask_mov_ps(fa_avx512_exp(_mm512_sub_ps(mold, mnew)), none, _mm512_set1_ps(1.0f));
    _mm512_store_ps(msub, _mm512_mask_mov_ps(mnew, none, _mm512_setzero_ps()));
    _mm512_store_ps(lal, _mm512_mul_ps(_mm512_maskz_loadu_ps(kr, l), al));
    _mm512_mask_storeu_ps(m, kr, mnew);
    _mm512_mask_storeu_ps(alpha, kr, al);
    for (int64_t r = 0; r < rows; r++) {
        float *sr = s + r * lds;
        const int64_t f = bf[r], e = be[r];
        const __m512 ms = _mm512_set1_ps(msub[r]);
        __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
        for (int64_t c0 = 0; c0 < f; c0 += 16) _mm512_store_ps(sr + c0, _mm512_setzero_ps());
        if (f == e) {
            sum0 = band_exp(sum0, ms, kf[r] & ke[r], sr + f);
        } else if (f < e) {
            sum0 = band_exp(sum0, ms, kf[r], sr + f);
            sum1 = band_exp(sum1, ms, ke[r], sr + e);
            int64_t c0 = f + 16;
            for (; c0 + 32 <= e; c0 += 32) {
                sum0 = band_exp(sum0, ms, 0xFFFF, sr + c0);
                sum1 = band_exp(sum1, ms, 0xFFFF, sr + c0 + 16);
            }
            if (c0 < e) sum0 = band_exp(sum0, ms, 0xFFFF, sr + c0);
        }
        for (int64_t c0 = e + 16; c0 < cols; c0 += 16) _mm512_store_ps(sr + c0, _mm512_setzero_ps());
        l[r] = lal[r] + _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
    }
}

typedef struct {
    int64_t cols, dv;
    int64_t pf_cols; /* rows that exist from vrow on: how far prefetching may look */
    const float *p;  /* p[r][c], ld ldp (vscale folded in for i8, fp8) */
    int64_t ldp;
    const void *const *vrow;
    const float *alpha; /* NULL: no rescale */
    float *acc;
    int64_t ldacc;
} pvs_args;

/*
 * acc[r][e0 + 16i ..] = alpha[r] * acc + sum_c p[r][c] * v_c[e0 + 16i ..] for r < R,
 * i < NV (with masked, the last vector masked by tail), all columns of the block.
 * KV_BF16P (NV even, never masked): accumulator 2g holds the even e of
 * e0+32g..e0+32g+31, 2g+1 the odd ones.
 */
FA_AVX512_INLINE void pvs_tile(const int kv, const int R, const int NV, const int masked, __mmask16 tail, int64_t e0,
                               const pvs_args *a)
{
    const int64_t cols = a->cols, ldp = a->ldp, pf_bytes = MIN64(16 * NV, a->dv - e0) * kv_bytes(kv);
    const float *p = a->p;
    const __m512i even = _mm512_loadu_si512(SK_EVEN), odd = _mm512_loadu_si512(SK_ODD);
    __m512 acc[FA_SMALL_ROWS][8];
    FA_AVX512_UNROLL
    for (int r = 0; r < R; r++) {
        const float *ar = a->acc + r * a->ldacc + e0;
        FA_AVX512_UNROLL
        for (int i = 0; i < NV; i++) {
            if (kv == KV_BF16P)
                acc[r][i] = _mm512_permutex2var_ps(_mm512_loadu_ps(ar + 32 * (i / 2)), i % 2 ? odd : even,
                                                   _mm512_loadu_ps(ar + 32 * (i / 2) + 16));
            else if (masked && i == NV - 1)
                acc[r][i] = _mm512_maskz_loadu_ps(tail, ar + 16 * i);
            else
                acc[r][i] = _mm512_loadu_ps(ar + 16 * i);
            if (a->alpha) acc[r][i] = _mm512_mul_ps(acc[r][i], _mm512_set1_ps(a->alpha[r]));
        }
    }
    for (int64_t c = 0; c < cols; c++) {
        if (c + SK_PF < a->pf_cols)
            prefetch_bytes((const char *)a->vrow[c + SK_PF] + e0 * kv_bytes(kv), pf_bytes);
        const void *vr = a->vrow[c];
        __m512 vv[8];
        if (kv == KV_BF16P) {
            FA_AVX512_UNROLL
            for (int g = 0; g < NV / 2; g++) bf16_pairs(0, 0, vr, e0 + 32 * g, &vv[2 * g], &vv[2 * g + 1]);
        } else if (kv == FA_KV_F8E4M3 && NV % 2 == 0 && !masked) { /* 32 codes converted together */
            FA_AVX512_UNROLL
            for (int i = 0; i < NV; i += 2)
                e4m3x32_to_f32(_mm256_loadu_si256((const __m256i *)((const uint8_t *)vr + e0 + 16 * i)), &vv[i],
                               &vv[i + 1]);
        } else {
            FA_AVX512_UNROLL
            for (int i = 0; i < NV; i++) vv[i] = kv_load(kv, masked && i == NV - 1, tail, vr, e0 + 16 * i);
        }
        FA_AVX512_UNROLL
        for (int r = 0; r < R; r++) {
            const __m512 pb = _mm512_set1_ps(p[r * ldp + c]);
            FA_AVX512_UNROLL
            for (int i = 0; i < NV; i++) acc[r][i] = _mm512_fmadd_ps(pb, vv[i], acc[r][i]);
        }
    }
    const __m512i zlo = _mm512_loadu_si512(SK_ZIP_LO), zhi = _mm512_loadu_si512(SK_ZIP_HI);
    FA_AVX512_UNROLL
    for (int r = 0; r < R; r++) {
        float *ar = a->acc + r * a->ldacc + e0;
        FA_AVX512_UNROLL
        for (int i = 0; i < NV; i++) {
            if (kv == KV_BF16P)
                _mm512_storeu_ps(ar + 16 * i, _mm512_permutex2var_ps(acc[r][i & ~1], i % 2 ? zhi : zlo, acc[r][i | 1]));
            else if (masked && i == NV - 1)
                _mm512_mask_storeu_ps(ar + 16 * i, tail, acc[r][i]);
            else
                _mm512_storeu_ps(ar + 16 * i, acc[r][i]);
        }
    }
}

/* The whole 16*NV-wide slices of e, and (separately) what remains, one vector at
 * a time (for bf16 the pairs do the first, the plain type the second). */
#define PVS_DEF_MAIN(kv, R, NV)                                                                                         \
    static void pvs_##kv##_##R(const pvs_args *a)                                                                       \
    {                                                                                                                   \
        for (int64_t e0 = 0; e0 + 16 * NV <= a->dv; e0 += 16 * NV) pvs_tile(kv, R, NV, 0, 0xFFFF, e0, a);             \
    }
#define PVS_DEF_REST(kv, R, NV)                                                                                         \
    static void pvsr_##kv##_##R(const pvs_args *a)                                                                      \
    {                                                                                                                   \
        for (int64_t e0 = a->dv / (16 * NV) * (16 * NV); e0 < a->dv; e0 += 16)                                        \
            pvs_tile(kv, R, 1, 1, fa_avx512_head_mask(a->dv - e0), e0, a);                                              \
    }
#define PVS_DEF(kv, R, NV) PVS_DEF_MAIN(kv, R, NV) PVS_DEF_REST(kv, R, NV)
SK_DEF_ROWS(PVS_DEF, FA_KV_F32)
SK_DEF_ROWS(PVS_DEF, FA_KV_F16)
SK_DEF_ROWS(PVS_DEF, FA_KV_I8)
SK_DEF_ROWS(PVS_DEF, FA_KV_F8E4M3)
SK_DEF_ROWS(PVS_DEF, FA_KV_F8E5M2)
SK_DEF_ROWS(PVS_DEF_MAIN, KV_BF16P)
SK_DEF_ROWS(PVS_DEF_REST, FA_KV_BF16)

void fa_avx512_pv_small(int64_t rows, int64_t cols, int64_t dv, const float *s, int64_t lds, const void *const *vrow,
                        int kv, const float *vscale, const float *alpha, float *acc, int64_t ldacc)
{
    static void (*const fn[KV_TYPES][FA_SMALL_ROWS + 1])(const pvs_args *) = {
        [FA_KV_F32] = SK_ROW_TABLE(pvs, FA_KV_F32), [FA_KV_F16] = SK_ROW_TABLE(pvs, FA_KV_F16),
        [FA_KV_I8] = SK_ROW_TABLE(pvs, FA_KV_I8), [FA_KV_F8E4M3] = SK_ROW_TABLE(pvs, FA_KV_F8E4M3),
        [FA_KV_F8E5M2] = SK_ROW_TABLE(pvs, FA_KV_F8E5M2), [KV_BF16P] = SK_ROW_TABLE(pvs, KV_BF16P)};
    static void (*const rest[FA_KV_TYPES][FA_SMALL_ROWS + 1])(const pvs_args *) = {
        [FA_KV_F32] = SK_ROW_TABLE(pvsr, FA_KV_F32), [FA_KV_F16] = SK_ROW_TABLE(pvsr, FA_KV_F16),
        [FA_KV_BF16] = SK_ROW_TABLE(pvsr, FA_KV_BF16), [FA_KV_I8] = SK_ROW_TABLE(pvsr, FA_KV_I8),
        [FA_KV_F8E4M3] = SK_ROW_TABLE(pvsr, FA_KV_F8E4M3), [FA_KV_F8E5M2] = SK_ROW_TABLE(pvsr, FA_KV_F8E5M2)};
    _Alignas(64) float ps[FA_SMALL_ROWS * PS_CB]; /* i8, fp8: p * vscale */
    /* PS_CB columns at a time: acc is rescaled by alpha only in the first */
    for (int64_t c0 = 0; c0 < cols; c0 += PS_CB) {
        const int64_t cc = MIN64(PS_CB, cols - c0);
        pvs_args a = {cc, dv, cols - c0, s + c0, lds, vrow + c0, c0 == 0 ? alpha : NULL, acc, ldacc};
        if (fa_kv_scaled(kv)) { /* vscale NULL: 1 (E4M3 still needs its unit) */
            const __m512 unit = _mm512_set1_ps(fa_kv_load_unit(kv)); /* a power of two: exact */
            for (int64_t c = 0; c < cc; c += 16) {
                const __mmask16 k = fa_avx512_head_mask(cc - c);
                const __m512 vs = vscale ? _mm512_mul_ps(_mm512_maskz_loadu_ps(k, vscale + c0 + c), unit) : unit;
                for (int64_t r = 0; r < rows; r++)
                    _mm512_store_ps(ps + r * PS_CB + c, _mm512_mul_ps(_mm512_maskz_load_ps(k, s + r * lds + c0 + c), vs));
            }
            a.p = ps, a.ldp = PS_CB;
        }
        fn[kv == FA_KV_BF16 ? KV_BF16P : kv][rows](&a);
        rest[kv][rows](&a);
    }
}

/* -------------------------------------------------------------------- probe */

/* 16 independent FMA chains: two FMA ports x 4 cycles latency need 8, so the
 * loop is throughput-bound. a -> 0.999 a + 0.001 stays near 1 (no overflow,
 * no subnormals). The start comes through a volatile (clang otherwise folded
 * one of the chains into a constant and the probe over-counted by 1/16) and
 * the sum goes to one, so the loop cannot be dropped. */
double fa_avx512_probe_fma(int64_t iters)
{
    const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
    volatile float seed = 1.0f;
    __m512 a[16];
    for (int i = 0; i < 16; i++) a[i] = _mm512_set1_ps(seed + (float)i);
    for (int64_t it = 0; it < iters; it++)
        FA_AVX512_UNROLL
        for (int i = 0; i < 16; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    __m512 s = a[0];
    for (int i = 1; i < 16; i++) s = _mm512_add_ps(s, a[i]);
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return (double)iters * 16.0 * 16.0 * 2.0;
}
