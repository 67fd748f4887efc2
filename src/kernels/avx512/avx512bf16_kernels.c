/*
 * avx512bf16_kernels.c: what the "avx512bf16" table (avx512bf16_table.c)
 * adds to the fp32 kernels it inherits from "avx512": the bf16 dot-product
 * path (vdpbf16ps: a zmm lane accumulates a0*b0 + a1*b1 of two bf16 pairs in
 * fp32, twice the FLOPs of an fp32 FMA per instruction). Whether that is faster
 * depends on the core: on Intel Sapphire/Emerald Rapids vdpbf16ps issues once per
 * two cycles against two FMAs per cycle, so the pair path peaks at half the
 * fp32 rate (probe_bf16 vs probe_fma tell, per machine). A pair must run along
 * the reduction index, so:
 *   qk_bf16  reduces over x: the Q panel is packed as (x, x+1) pairs per row r
 *            (pack_qt_bf16), and K's natural rows already hold (x, x+1) pairs,
 *            broadcast as one dword. No K repacking at all.
 *   pv_bf16  reduces over c: P is rounded to bf16 and paired (c, c+1) per row,
 *            and V is repacked as (c, c+1) pairs per column e, both in scratch.
 *   stx_bf16 (backward) reduces over r: st's rows already run along r, so
 *            rounding them to bf16 pairs them (r, r+1) in place; x is repacked
 *            as (r, r+1) pairs per column e, as V for pv_bf16, in scratch.
 * Register blocks, tails and the one-instantiation-per-function rule are those
 * of the fp32 kernels (qk 64 rows x 6 columns, pv and stx 6 rows x 64 e, 24
 * accumulators; 5-wide blocks cover the remainders). Odd d, odd cols (pv) and
 * odd rows (stx) pair the last element with 0.
 */
#include "avx512_internal.h"

#include <string.h>

#define MIN64(a, b) ((a) < (b) ? (a) : (b))

/* The low n bits of a 32-lane mask, n in 0..32. */
static inline __mmask32 head_mask32(int64_t n)
{
    return n >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << n) - 1u);
}

/* One dword of bf16 data at any 2-byte alignment. */
static inline int32_t load_pair(const uint16_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* ------------------------------------------------------------ row pairs */

/* kernels.h's pack_pairs_bf16: word 2e of a dword row from row 2p, word 2e+1 from
 * row 2p+1; the masked loads supply the zeros past len and of a missing partner. */
enum { PACK_AHEAD = 8 };

void fa_avx512bf16_pack_pairs(int64_t nrows, int64_t len, const uint16_t *src, int64_t ld, uint32_t *dst, int64_t ld32)
{
    const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                            37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
    const int64_t np = (nrows + 1) / 2;
    for (int64_t p = 0; p < np; p++) {
        const int has1 = 2 * p + 1 < nrows;
        const uint16_t *s0 = src + 2 * p * ld, *s1 = has1 ? s0 + ld : s0;
        uint32_t *d = dst + p * ld32;
        /* the rows PACK_AHEAD pairs on asked for now (V rows from L3 or memory, a page
         * apart each in (B, S, H, D), which no hardware stream covers) */
        if (2 * (p + PACK_AHEAD) + 1 < nrows)
            for (int64_t e = 0; e < len; e += 32) {
                _mm_prefetch((const char *)(s0 + 2 * PACK_AHEAD * ld + e), _MM_HINT_T0);
                _mm_prefetch((const char *)(s0 + (2 * PACK_AHEAD + 1) * ld + e), _MM_HINT_T0);
            }
        for (int64_t e = 0; e < ld32; e += 32) {
            const __mmask32 ke = e < len ? head_mask32(len - e) : 0; /* ld32 may run past len */
            const __m512i a = _mm512_maskz_loadu_epi16(ke, s0 + e);
            const __m512i b = has1 ? _mm512_maskz_loadu_epi16(ke, s1 + e) : _mm512_setzero_si512();
            _mm512_store_si512(d + e, _mm512_permutex2var_epi16(a, lo_idx, b));
            if (e + 16 < ld32) _mm512_store_si512(d + e + 16, _mm512_permutex2var_epi16(a, hi_idx, b));
        }
    }
}

/* ------------------------------------------------------------- pack_qt_bf16 */

/* qt2 viewed as dwords is the transpose of q viewed as dwords: dword (x/2, r) is
 * the pair q[r][x], q[r][x+1]. So the fp32 16x16 transpose does it, on rows
 * loaded with a 16-bit mask (which also supplies the zero of an odd d). */
void fa_avx512bf16_pack_qt(int64_t rows, int64_t d, const uint16_t *q, int64_t ldq, uint16_t *qt2,
                               int64_t ldqt2)
{
    const int64_t pairs = (d + 1) / 2, ld32 = ldqt2 / 2;
    uint32_t *dst = (uint32_t *)(void *)qt2;
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
        const int64_t nr = MIN64(16, rows - r0);
        for (int64_t x0 = 0; x0 < pairs; x0 += 16) {
            const __mmask32 kx = head_mask32(d - 2 * x0);
            __m512 t[16];
            for (int i = 0; i < 16; i++)
                t[i] = i < nr ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(kx, q + (r0 + i) * ldq + 2 * x0))
                              : _mm512_setzero_ps();
            fa_avx512_transpose16(t);
            const int64_t np = MIN64(16, pairs - x0);
            for (int64_t i = 0; i < np; i++) _mm512_store_si512(dst + (x0 + i) * ld32 + r0, _mm512_castps_si512(t[i]));
        }
    }
}

/* ------------------------------------------------------------------ qk_bf16 */

enum { QKB_NV = 4, QKB_NC = 6, QKB_PCHUNK = 128 /* pairs: a 64-row slice of qt2 is 32 KB */ };

/*
 * st[c][16i..] (+)= sum over pairs of qt pair-rows . K pairs, for i < nv,
 * c < valid <= nc (a padded tile as in avx512_kernels.c's qk_tile). The pair
 * index p runs over [0, np) of this chunk; with odd_tail the last pair of K is
 * the single element k[c][2*np] with a zero partner (never reading past the
 * row). first: start from 0, else from st; last: scale before storing.
 */
FA_AVX512_INLINE void qkb_tile(const int nv, const int nc, int64_t valid, int first, int last, int64_t np,
                               int odd_tail, const uint32_t *qt, int64_t ld32, const uint16_t *k, int64_t ldk,
                               float scale, float *st, int64_t ldst)
{
    __m512 acc[QKB_NC][QKB_NV];
    const uint16_t *kc[QKB_NC];
    FA_AVX512_UNROLL
    for (int j = 0; j < nc; j++) {
        kc[j] = k + MIN64(j, valid - 1) * ldk;
        FA_AVX512_UNROLL
        for (int i = 0; i < nv; i++)
            acc[j][i] = first || j >= valid ? _mm512_setzero_ps() : _mm512_load_ps(st + j * ldst + 16 * i);
    }
    for (int64_t p = 0; p < np; p++) {
        const uint32_t *qp = qt + p * ld32;
        __m512i qv[QKB_NV];
        FA_AVX512_UNROLL
        for (int i = 0; i < nv; i++) qv[i] = _mm512_load_si512(qp + 16 * i);
        FA_AVX512_UNROLL
        for (int j = 0; j < nc; j++) {
            const __m512i kb = _mm512_set1_epi32(load_pair(kc[j] + 2 * p));
            FA_AVX512_UNROLL
            for (int i = 0; i < nv; i++) acc[j][i] = _mm512_dpbf16_ps(acc[j][i], (__m512bh)qv[i], (__m512bh)kb);
        }
    }
    if (odd_tail) {
        const uint32_t *qp = qt + np * ld32;
        FA_AVX512_UNROLL
        for (int j = 0; j < nc; j++) {
            const __m512i kb = _mm512_set1_epi32((int32_t)kc[j][2 * np]);
            FA_AVX512_UNROLL
            for (int i = 0; i < nv; i++)
                acc[j][i] = _mm512_dpbf16_ps(acc[j][i], (__m512bh)_mm512_load_si512(qp + 16 * i), (__m512bh)kb);
        }
    }
    const __m512 s = _mm512_set1_ps(scale);
    FA_AVX512_UNROLL
    for (int j = 0; j < nc; j++) {
        if (j >= valid) break;
        FA_AVX512_UNROLL
        for (int i = 0; i < nv; i++)
            _mm512_store_ps(st + j * ldst + 16 * i, last ? _mm512_mul_ps(acc[j][i], s) : acc[j][i]);
    }
}

typedef struct {
    int first, last, odd_tail;
    int64_t np, cols;
    const uint32_t *qt;
    int64_t ld32;
    const uint16_t *k;
    int64_t ldk;
    float scale;
    float *st;
    int64_t ldst;
} qkb_args;

/* 6-column tiles, then 5-column ones (see avx512_kernels.c's qk_panel) */
FA_AVX512_INLINE void qkb_panel(const int nv, const qkb_args *a)
{
    const int64_t c6 = fa_avx512_split65(a->cols);
    for (int64_t c = 0; c < c6; c += QKB_NC)
        qkb_tile(nv, QKB_NC, MIN64(QKB_NC, c6 - c), a->first, a->last, a->np, a->odd_tail, a->qt, a->ld32,
                 a->k + c * a->ldk, a->ldk, a->scale, a->st + c * a->ldst, a->ldst);
    for (int64_t c = c6; c < a->cols; c += QKB_NC - 1)
        qkb_tile(nv, QKB_NC - 1, QKB_NC - 1, a->first, a->last, a->np, a->odd_tail, a->qt, a->ld32,
                 a->k + c * a->ldk, a->ldk, a->scale, a->st + c * a->ldst, a->ldst);
}

/* One function per panel height (see the top of avx512_kernels.c). */
static void qkb_panel4(const qkb_args *a) { qkb_panel(4, a); }
static void qkb_panel3(const qkb_args *a) { qkb_panel(3, a); }
static void qkb_panel2(const qkb_args *a) { qkb_panel(2, a); }
static void qkb_panel1(const qkb_args *a) { qkb_panel(1, a); }

void fa_avx512bf16_qk_64x6(int64_t rows, int64_t cols, int64_t d, const uint16_t *qt2, int64_t ldqt2,
                          const uint16_t *k, int64_t ldk, float scale, float *st, int64_t ldst)
{
    static void (*const panel[QKB_NV + 1])(const qkb_args *) = {NULL, qkb_panel1, qkb_panel2, qkb_panel3,
                                                                qkb_panel4};
    const int64_t nvec = (rows + 15) / 16, full = d / 2, ld32 = ldqt2 / 2;
    const uint32_t *qt = (const uint32_t *)(const void *)qt2;
    for (int64_t v0 = 0; v0 < nvec; v0 += QKB_NV) {
        const int64_t nv = MIN64(QKB_NV, nvec - v0);
        /* chunks of 128 pairs; the odd element, if any, rides with the last chunk */
        for (int64_t p0 = 0; p0 == 0 || p0 < full; p0 += QKB_PCHUNK) {
            const int last = p0 + QKB_PCHUNK >= full;
            const qkb_args a = {p0 == 0, last, last && (d & 1), MIN64(QKB_PCHUNK, full - p0), cols,
                                qt + p0 * ld32 + 16 * v0, ld32, k + 2 * p0, ldk, scale, st + 16 * v0, ldst};
            panel[nv](&a);
        }
    }
}

/* ------------------------------------------------------------------ pv_bf16 */

enum { SXB_NR = 6, SXB_NV = 4, PVB_PCHUNK = 128, STB_PCHUNK = 128 /* pairs: a 64-e slice of V or x pairs is 32 KB */ };

/*
 * pv_bf16 and stx_bf16 are one tile, avx512_kernels.c's sx_tile on pairs:
 * acc[j][16i..] = alpha[j] * acc[j][16i..] + sum_p dot(s(j, p), xp[p][16i..]) for
 * j < valid <= nr, i < nv, the dword s(j, p) = s[j*sj + p*sk] a pair of bf16.
 *   pv:  j a row r, s(r, p) = pp[p][r] = (p[2p][r], p[2p+1][r]) (sj 1, sk ldp),
 *        xp the V pairs (v[2p][e], v[2p+1][e]).
 *   stx: j a column c, s(c, p) = sp[c][p] = (st[c][2p], st[c][2p+1]) (sj ldsp, sk 1),
 *        xp the x pairs, no alpha.
 * Each caller's strides and alpha are constants in its instance. A padded tile
 * repeats its last real row j and never stores it; xp is zero-padded to whole
 * vectors, so only acc's last vector may need the mask.
 */
FA_AVX512_INLINE void sxb_tile(const int nr, const int nv, const int masked, __mmask16 tail, int64_t valid,
                               int64_t np, const uint32_t *s, const int64_t sj, const int64_t sk, const uint32_t *xp,
                               int64_t ldxp, const float *alpha, float *acc, int64_t ldacc)
{
    __m512 a[SXB_NR][SXB_NV];
    const uint32_t *sr[SXB_NR];
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
    for (int64_t p = 0; p < np; p++) {
        const uint32_t *xr = xp + p * ldxp;
        const int64_t po = p * sk;
        __m512i xv[SXB_NV];
        FA_AVX512_UNROLL
        for (int i = 0; i < nv; i++) xv[i] = _mm512_load_si512(xr + 16 * i);
        FA_AVX512_UNROLL
        for (int j = 0; j < nr; j++) {
            const __m512i sb = _mm512_set1_epi32((int32_t)sr[j][po]);
            FA_AVX512_UNROLL
            for (int i = 0; i < nv; i++) a[j][i] = _mm512_dpbf16_ps(a[j][i], (__m512bh)sb, (__m512bh)xv[i]);
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
    __mmask16 tail;
    int64_t rows, np; /* the acc rows j, and the pairs p summed over */
    const uint32_t *s;
    int64_t lds;
    int by_row; /* 1: s[j][p] (stx), 0: s[p][j] (pv) */
    const uint32_t *xp;
    int64_t ldxp;
    const float *alpha;
    float *acc;
    int64_t ldacc;
} sxb_args;

/* 6-row tiles, then 5-row ones (see avx512_kernels.c's qk_panel) */
FA_AVX512_INLINE void sxb_panel(const int nv, const int masked, const int by_row, const sxb_args *a)
{
    const int64_t sj = by_row ? a->lds : 1, sk = by_row ? 1 : a->lds;
    const int64_t r6 = fa_avx512_split65(a->rows);
    for (int64_t r = 0; r < r6; r += SXB_NR)
        sxb_tile(SXB_NR, nv, masked, a->tail, MIN64(SXB_NR, r6 - r), a->np, a->s + r * sj, sj, sk, a->xp, a->ldxp,
                 !by_row && a->alpha ? a->alpha + r : NULL, a->acc + r * a->ldacc, a->ldacc);
    for (int64_t r = r6; r < a->rows; r += SXB_NR - 1)
        sxb_tile(SXB_NR - 1, nv, masked, a->tail, SXB_NR - 1, a->np, a->s + r * sj, sj, sk, a->xp, a->ldxp,
                 !by_row && a->alpha ? a->alpha + r : NULL, a->acc + r * a->ldacc, a->ldacc);
}

/* One function per block width, each holding pv's and stx's instances; whole
 * vectors unmasked (see avx512_kernels.c's sx_panel4). */
static void sxb_panel4(const sxb_args *a) { a->by_row ? sxb_panel(4, 0, 1, a) : sxb_panel(4, 0, 0, a); }
static void sxb_panel3(const sxb_args *a) { a->by_row ? sxb_panel(3, 0, 1, a) : sxb_panel(3, 0, 0, a); }
static void sxb_panel2(const sxb_args *a) { a->by_row ? sxb_panel(2, 0, 1, a) : sxb_panel(2, 0, 0, a); }
static void sxb_panel1(const sxb_args *a) { a->by_row ? sxb_panel(1, 0, 1, a) : sxb_panel(1, 0, 0, a); }
static void sxb_panel4m(const sxb_args *a) { a->by_row ? sxb_panel(4, 1, 1, a) : sxb_panel(4, 1, 0, a); }
static void sxb_panel3m(const sxb_args *a) { a->by_row ? sxb_panel(3, 1, 1, a) : sxb_panel(3, 1, 0, a); }
static void sxb_panel2m(const sxb_args *a) { a->by_row ? sxb_panel(2, 1, 1, a) : sxb_panel(2, 1, 0, a); }
static void sxb_panel1m(const sxb_args *a) { a->by_row ? sxb_panel(1, 1, 1, a) : sxb_panel(1, 1, 0, a); }

/* acc (+)= s xp over np pairs and `rows` acc rows, per 64-wide slice of e (n wide),
 * the pairs chunked by pchunk, alpha (if any) applied in the first chunk only. */
static void sxb_run(sxb_args a, int64_t np, int64_t pchunk, int64_t n)
{
    static void (*const whole[SXB_NV + 1])(const sxb_args *) = {NULL, sxb_panel1, sxb_panel2, sxb_panel3,
                                                                sxb_panel4};
    static void (*const part[SXB_NV + 1])(const sxb_args *) = {NULL, sxb_panel1m, sxb_panel2m, sxb_panel3m,
                                                               sxb_panel4m};
    const uint32_t *s = a.s, *xp = a.xp;
    float *acc = a.acc;
    const float *alpha = a.alpha;
    const int64_t sk = a.by_row ? 1 : a.lds;
    for (int64_t p0 = 0; p0 < np; p0 += pchunk) {
        a.np = MIN64(pchunk, np - p0);
        a.alpha = p0 == 0 ? alpha : NULL;
        for (int64_t e0 = 0; e0 < n; e0 += 16 * SXB_NV) {
            const int64_t ne = MIN64(16 * SXB_NV, n - e0), nv = (ne + 15) / 16;
            a.tail = fa_avx512_head_mask(ne - 16 * (nv - 1));
            a.s = s + p0 * sk;
            a.xp = xp + p0 * a.ldxp + e0;
            a.acc = acc + e0;
            (a.tail == 0xFFFF ? whole : part)[nv](&a);
        }
    }
}

/* scratch: P as pairs, pp[np][round16(rows)] dwords, np = ceil(cols / 2). V comes
 * as pairs already (kernels.h), packed once by the caller for every query block. */
void fa_avx512bf16_pv_6x64(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const uint32_t *vp,
                          int64_t ldvp, const float *alpha, float *acc, int64_t ldacc, void *scratch)
{
    const int64_t np = (cols + 1) / 2, ldp = (rows + 15) / 16 * 16;
    uint32_t *pp = scratch;

    /* 1. P pairs, rounded to nearest-even bf16 (st's padding rows are converted
     * too, harmlessly: they are never multiplied into a real row) */
    const __m512i il_idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                            21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int64_t p = 0; p < np; p++) {
        const int has1 = 2 * p + 1 < cols;
        const float *s0 = st + 2 * p * ldst, *s1 = has1 ? s0 + ldst : s0;
        uint32_t *dst = pp + p * ldp;
        for (int64_t r = 0; r < ldp; r += 16) {
            const __m512 x0 = _mm512_load_ps(s0 + r), x1 = has1 ? _mm512_load_ps(s1 + r) : _mm512_setzero_ps();
            const __m512i two = (__m512i)_mm512_cvtne2ps_pbh(x1, x0); /* words 0..15 from x0, 16..31 from x1 */
            _mm512_store_si512(dst + r, _mm512_permutexvar_epi16(il_idx, two));
        }
    }

    /* 2. acc = alpha * acc + P V, 128 pairs at a time (see avx512_kernels.c's pv) */
    const sxb_args a = {0, rows, 0, pp, ldp, 0, vp, ldvp, alpha, acc, ldacc};
    sxb_run(a, np, PVB_PCHUNK, dv);
}

/* ----------------------------------------------------------------- stx_bf16 */

/*
 * Scratch layout (dwords), np = ceil(rows / 2):
 *   xp  [np][round16(n)]    x pairs (x[2p][e], x[2p+1][e]), e padded with zeros to
 *                           whole vectors, an odd rows' last partner a zero row
 *   sp  [cols][round8(np)]  st rounded to bf16: its rows' own memory order already
 *                           pairs (st[c][2p], st[c][2p+1]); rows <= r padded with 0
 * xp's rows are whole zmm, so sp starts 64-byte aligned too. In uint16:
 * 2*np*round16(n) <= (rows+1)*(n+15), and 2*round8(np) <= round16(rows) <= ldst, so
 * the total stays within FA_STX_BF16_SCRATCH(rows, cols, n, ldst).
 */
void fa_avx512bf16_stx_6x64(int64_t rows, int64_t cols, int64_t n, const float *st, int64_t ldst, const uint16_t *x,
                            int64_t ldx, float *acc, int64_t ldacc, void *scratch)
{
    const int64_t np = (rows + 1) / 2, ldxp = (n + 15) / 16 * 16, ldsp = (np + 7) / 8 * 8;
    uint32_t *xp = scratch, *sp = xp + np * ldxp;

    /* 1. x pairs */
    fa_avx512bf16_pack_pairs(rows, n, x, ldx, xp, ldxp);

    /* 2. st in bf16, 32 rows (16 pairs) per step: the high words of two rounded
     * vectors. Rows past `rows` load as 0 (st's padding rows may hold anything: a
     * NaN there times the zero partner row of x would still be NaN). */
    const __m512i hi_words = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29,
                                              27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    for (int64_t c = 0; c < cols; c++) {
        const float *s = st + c * ldst;
        uint16_t *d = (uint16_t *)(void *)(sp + c * ldsp);
        for (int64_t r = 0; r < 2 * ldsp; r += 32) {
            const __m512 v0 = _mm512_maskz_load_ps(fa_avx512_head_mask(rows - r), s + r);
            const __m512 v1 =
                r + 16 < rows ? _mm512_maskz_load_ps(fa_avx512_head_mask(rows - r - 16), s + r + 16) : _mm512_setzero_ps();
            const __m512i w = _mm512_permutex2var_epi16(fa_avx512_round_bf16_hi(v0), hi_words, fa_avx512_round_bf16_hi(v1));
            _mm512_mask_storeu_epi16(d + r, head_mask32(2 * ldsp - r), w);
        }
    }

    /* 3. acc += st x, 128 pairs at a time, per 64-wide slice of e */
    const sxb_args a = {0, cols, 0, sp, ldsp, 1, xp, ldxp, NULL, acc, ldacc};
    sxb_run(a, np, STB_PCHUNK, n);
}

/* -------------------------------------------------------------------- probe */

/* 16 independent vdpbf16ps chains (64 FLOPs each: 16 lanes x 2 products x 2);
 * each adds 2 * 2^-10 per step, so 1e9 steps stay far from overflow. */
double fa_avx512bf16_probe(int64_t iters)
{
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3A80); /* 2^-10 */
    const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3F80); /* 1.0 */
    volatile float seed = 1.0f; /* see fa_avx512_probe_fma */
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_set1_ps(seed + (float)i);
    for (int64_t it = 0; it < iters; it++)
        FA_AVX512_UNROLL
        for (int i = 0; i < 16; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    __m512 s = acc[0];
    for (int i = 1; i < 16; i++) s = _mm512_add_ps(s, acc[i]);
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return (double)iters * 16.0 * 64.0;
}
