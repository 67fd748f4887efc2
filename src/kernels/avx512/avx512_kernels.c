/*
 * avx512_kernels.c: the AVX-512 fp32 micro-kernels (table "avx512"), and the
 * ones the "avx512bf16" table reuses. The layouts are those of kernels.h:
 * a zmm runs along 16 query rows r in qt and st, and along 16 value columns e
 * in v and acc, so no kernel ever transposes a tile it reads in its loop.
 *
 * Register blocks (32 zmm):
 *   qk  64 rows (4 zmm of a qt row) x 6 key columns: 24 accumulators over the
 *       whole d loop; per x, 4 loads of qt and 6 broadcasts of K feed 24 FMAs.
 *   pv  6 rows (broadcast p = st[c][r]) x 64 e (4 zmm of a V row): the same
 *       24-accumulator shape over every column c, the alpha rescale fused into
 *       the load of acc.
 * Both keep the operand they reuse across the inner blocks near (qk: a 64-row
 * x 128-x slice of qt, 32 KB; pv: a 128-c x 64-e slice of V, 32 KB), so a large
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
 * stream per page and give up (measured: +6% on qk with a 16 KB row stride).
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

void fa_avx512_qk(int64_t rows, int64_t cols, int64_t d, const float *qt, int64_t ldqt, const float *k,
                  int64_t ldk, float *st, int64_t ldst)
{
    static void (*const panel[QK_NV + 1])(const qk_args *) = {NULL, qk_panel1, qk_panel2, qk_panel3, qk_panel4};
    const int64_t nvec = (rows + 15) / 16;
    /*
     * 128 x at a time; within that, groups of 48 columns, and within a group
     * every 64-row panel. A panel's qt slice (32 KB) is reused by the 8 tiles
     * of a group from L1, and a group's K rows by every panel from L1/L2 even
     * when the rows are a page apart, which a whole tile's K would not be
     * (measured: qk at 82% of peak with an 8 KB K row stride and 256 rows when
     * each panel walked all 512 columns). The last group takes the remainder
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

enum { PV_NR = 6, PV_NV = 4, PV_CCHUNK = 128 };

/*
 * acc[j][16i..] = alpha[j] * acc[j][16i..] + sum_c st[c][j] * v[c][16i..] for
 * j < valid <= nr, i < nv; with masked, the last vector of a row is masked by
 * tail (alpha NULL: no rescale). A padded tile runs nr rows too, the missing
 * ones repeating the last real row, never loaded or stored (see qk_tile).
 */
FA_AVX512_INLINE void pv_tile(const int nr, const int nv, const int masked, __mmask16 tail, int64_t valid,
                              int64_t cols, const float *st, int64_t ldst, const float *v, int64_t ldv,
                              const float *alpha, float *acc, int64_t ldacc)
{
    __m512 a[PV_NR][PV_NV];
    const float *sr[PV_NR];
    FA_AVX512_UNROLL
    for (int j = 0; j < nr; j++) {
        sr[j] = st + MIN64(j, valid - 1);
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
    for (int64_t c = 0; c < cols; c++) {
        const float *vc = v + c * ldv;
        const int64_t sc = c * ldst;
        __m512 vv[PV_NV];
        FA_AVX512_UNROLL
        for (int i = 0; i < nv; i++)
            vv[i] = masked && i == nv - 1 ? _mm512_maskz_loadu_ps(tail, vc + 16 * i) : _mm512_loadu_ps(vc + 16 * i);
        FA_AVX512_UNROLL
        for (int j = 0; j < nr; j++) {
            const __m512 p = _mm512_set1_ps(sr[j][sc]);
            FA_AVX512_UNROLL
            for (int i = 0; i < nv; i++) a[j][i] = _mm512_fmadd_ps(p, vv[i], a[j][i]);
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
    __mmask16 tail; /* the last vector's lanes, when masked */
    int64_t rows, cols;
    const float *st;
    int64_t ldst;
    const float *v;
    int64_t ldv;
    const float *alpha; /* NULL: no rescale */
    float *acc;
    int64_t ldacc;
} pv_args;

/* Every row against one 16*nv-wide slice of V: 6-row tiles, then 5-row ones
 * (see qk_panel). */
FA_AVX512_INLINE void pv_panel(const int nv, const int masked, const pv_args *a)
{
    const int64_t r6 = fa_avx512_split65(a->rows);
    for (int64_t r = 0; r < r6; r += PV_NR)
        pv_tile(PV_NR, nv, masked, a->tail, MIN64(PV_NR, r6 - r), a->cols, a->st + r, a->ldst, a->v, a->ldv,
                a->alpha ? a->alpha + r : NULL, a->acc + r * a->ldacc, a->ldacc);
    for (int64_t r = r6; r < a->rows; r += PV_NR - 1)
        pv_tile(PV_NR - 1, nv, masked, a->tail, PV_NR - 1, a->cols, a->st + r, a->ldst, a->v, a->ldv,
                a->alpha ? a->alpha + r : NULL, a->acc + r * a->ldacc, a->ldacc);
}

/* One function per block width (see the top of the file). Whole vectors get
 * masked = 0, which compiles to plain loads and stores: masked ones cost a
 * measurable 3% here. */
static void pv_panel4(const pv_args *a) { pv_panel(4, 0, a); }
static void pv_panel3(const pv_args *a) { pv_panel(3, 0, a); }
static void pv_panel2(const pv_args *a) { pv_panel(2, 0, a); }
static void pv_panel1(const pv_args *a) { pv_panel(1, 0, a); }
static void pv_panel4m(const pv_args *a) { pv_panel(4, 1, a); }
static void pv_panel3m(const pv_args *a) { pv_panel(3, 1, a); }
static void pv_panel2m(const pv_args *a) { pv_panel(2, 1, a); }
static void pv_panel1m(const pv_args *a) { pv_panel(1, 1, a); }

/* One e-block (16*nv <= 64 wide, its last vector masked by tail) of every row
 * over cc columns. */
static void pv_slice(int64_t nv, __mmask16 tail, int64_t rows, int64_t cc, const float *sc, int64_t ldst,
                     const float *vp, int64_t ldv, const float *al, float *ap, int64_t ldacc)
{
    static void (*const whole[PV_NV + 1])(const pv_args *) = {NULL, pv_panel1, pv_panel2, pv_panel3, pv_panel4};
    static void (*const part[PV_NV + 1])(const pv_args *) = {NULL, pv_panel1m, pv_panel2m, pv_panel3m, pv_panel4m};
    const pv_args a = {tail, rows, cc, sc, ldst, vp, ldv, al, ap, ldacc};
    (tail == 0xFFFF ? whole : part)[nv](&a);
}

/*
 * V rows a page or more apart, or a multiple of 1 KB apart, fall into a few L1
 * (and L2) sets and each needs its own TLB entry, so the slice the row blocks
 * reuse is evicted before its reuse: measured, pv drops from 95% to 65% of peak
 * with the 16 KB row stride of a BSND tensor with 32 heads. Such slices are
 * first copied to a contiguous buffer (32 KB of stack), which brings pv back to
 * 79% at 64 rows and 87% at 256: the copy waits on L3 once per row and slice,
 * a cost the rows share. A caller that packs V rows densely avoids both.
 */
static int pv_v_scattered(int64_t ldv)
{
    const int64_t bytes = (ldv < 0 ? -ldv : ldv) * (int64_t)sizeof(float);
    return bytes >= 4096 || (bytes >= 1024 && bytes % 1024 == 0);
}

static void pv_copying(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const float *v,
                       int64_t ldv, const float *alpha, float *acc, int64_t ldacc)
{
    _Alignas(64) float buf[PV_CCHUNK * 16 * PV_NV]; /* (PV_CCHUNK, 64) */
    for (int64_t c0 = 0; c0 < cols; c0 += PV_CCHUNK) {
        const int64_t cc = MIN64(PV_CCHUNK, cols - c0);
        const float *al = c0 == 0 ? alpha : NULL;
        const float *sc = st + c0 * ldst;
        for (int64_t e0 = 0; e0 < dv; e0 += 16 * PV_NV) {
            const int64_t ne = MIN64(16 * PV_NV, dv - e0), nv = (ne + 15) / 16;
            const __mmask16 tail = fa_avx512_head_mask(ne - 16 * (nv - 1));
            for (int64_t c = 0; c < cc; c++) {
                const float *vr = v + (c0 + c) * ldv + e0;
                for (int64_t i = 0; i < nv; i++)
                    _mm512_store_ps(buf + c * 16 * PV_NV + 16 * i,
                                    _mm512_maskz_loadu_ps(i == nv - 1 ? tail : (__mmask16)0xFFFF, vr + 16 * i));
            }
            pv_slice(nv, tail, rows, cc, sc, ldst, buf, 16 * PV_NV, al, acc + e0, ldacc);
        }
    }
}

void fa_avx512_pv(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const float *v,
                  int64_t ldv, const float *alpha, float *acc, int64_t ldacc)
{
    if (rows > 2 * PV_NR && pv_v_scattered(ldv)) {
        pv_copying(rows, cols, dv, st, ldst, v, ldv, alpha, acc, ldacc);
        return;
    }
    /* 128 columns at a time, so the 32 KB V slice the row blocks share stays
     * near (measured: 128..256 is the plateau, 64 already loses 5%); acc is
     * rescaled by alpha only in the first chunk */
    for (int64_t c0 = 0; c0 < cols; c0 += PV_CCHUNK) {
        const int64_t cc = MIN64(PV_CCHUNK, cols - c0);
        const float *al = c0 == 0 ? alpha : NULL;
        const float *sc = st + c0 * ldst, *vc = v + c0 * ldv;
        for (int64_t e0 = 0; e0 < dv; e0 += 16 * PV_NV) {
            const int64_t ne = MIN64(16 * PV_NV, dv - e0), nv = (ne + 15) / 16;
            pv_slice(nv, fa_avx512_head_mask(ne - 16 * (nv - 1)), rows, cc, sc, ldst, vc + e0, ldv, al, acc + e0,
                     ldacc);
        }
    }
}

/* -------------------------------------------------------------- conversions */

void fa_avx512_f16_to_f32(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    if (i < n) {
        const __mmask16 k = fa_avx512_head_mask(n - i);
        _mm512_mask_storeu_ps(dst + i, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, src + i)));
    }
}

/* bf16 is the top half of an f32: widen and shift, exact (NaN stays NaN). */
FA_AVX512_INLINE __m512 bf16x16_to_f32(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

void fa_avx512_bf16_to_f32(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, bf16x16_to_f32(_mm256_loadu_si256((const __m256i *)(src + i))));
    if (i < n) {
        const __mmask16 k = fa_avx512_head_mask(n - i);
        _mm512_mask_storeu_ps(dst + i, k, bf16x16_to_f32(_mm256_maskz_loadu_epi16(k, src + i)));
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

const fa_kernels fa_kernels_avx512 = {
    .name = "avx512",
    .pack_qt = fa_avx512_pack_qt,
    .qk = fa_avx512_qk,
    .softmax = fa_avx512_softmax,
    .pv = fa_avx512_pv,
    .f16_to_f32 = fa_avx512_f16_to_f32,
    .bf16_to_f32 = fa_avx512_bf16_to_f32,
    .probe_fma = fa_avx512_probe_fma,
};
