/*
 * avx512bf16_kernels.c: what the "avx512bf16" table (avx512bf16_table.c)
 * adds to the fp32 kernels it inherits from "avx512": the bf16 dot-product
 * path (vdpbf16ps: a zmm lane accumulates a0*b0 + a1*b1 of two bf16 pairs in
 * fp32, twice the FLOPs of an fp32 FMA per instruction). Whether that is faster depends on the core: on the
 * Xeon (Sapphire/Emerald Rapids) this was written on, vdpbf16ps issues once per
 * two cycles against two FMAs per cycle, so the pair path peaks at half the
 * fp32 rate (probe_bf16 vs probe_fma tell, per machine). The kernels reach
 * 90-98% of probe_bf16. A pair must run along the reduction index, so:
 *   qk_bf16  reduces over x: the Q panel is packed as (x, x+1) pairs per row r
 *            (pack_qt_bf16), and K's natural rows already hold (x, x+1) pairs,
 *            broadcast as one dword. No K repacking at all.
 *   pv_bf16  reduces over c: P is rounded to bf16 and paired (c, c+1) per row,
 *            and V is repacked as (c, c+1) pairs per column e, both in scratch.
 * Register blocks, tails and the one-instantiation-per-function rule are those
 * of the fp32 kernels (qk 64 rows x 6 columns, pv 6 rows x 64 e, 24
 * accumulators; 5-wide blocks cover the remainders). Odd d and odd cols pair
 * the last element with 0.
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

enum { PVB_NR = 6, PVB_NV = 4, PVB_PCHUNK = 128 /* pairs: a 64-e slice of the V pairs is 32 KB */ };

/* acc[j][16i..] = alpha[j] * acc[j][16i..] + sum_p dot(pp[p][j], vp[p][16i..]) for
 * j < valid <= nr (a padded tile as in avx512_kernels.c's pv_tile), i < nv:
 * pp holds (p[2p][r], p[2p+1][r]) dwords, vp (v[2p][e], v[2p+1][e]); vp is
 * zero-padded to whole vectors, so only acc's last vector may need the mask. */
FA_AVX512_INLINE void pvb_tile(const int nr, const int nv, const int masked, __mmask16 tail, int64_t valid,
                               int64_t np, const uint32_t *pp, int64_t ldp, const uint32_t *vp, int64_t ldvp,
                               const float *alpha, float *acc, int64_t ldacc)
{
    __m512 a[PVB_NR][PVB_NV];
    const uint32_t *pr[PVB_NR];
    FA_AVX512_UNROLL
    for (int j = 0; j < nr; j++) {
        pr[j] = pp + MIN64(j, valid - 1);
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
        const uint32_t *vr = vp + p * ldvp;
        const int64_t po = p * ldp;
        __m512i vv[PVB_NV];
        FA_AVX512_UNROLL
        for (int i = 0; i < nv; i++) vv[i] = _mm512_load_si512(vr + 16 * i);
        FA_AVX512_UNROLL
        for (int j = 0; j < nr; j++) {
            const __m512i pb = _mm512_set1_epi32((int32_t)pr[j][po]);
            FA_AVX512_UNROLL
            for (int i = 0; i < nv; i++) a[j][i] = _mm512_dpbf16_ps(a[j][i], (__m512bh)pb, (__m512bh)vv[i]);
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
    int64_t rows, np;
    const uint32_t *pp;
    int64_t ldp;
    const uint32_t *vp;
    int64_t ldvp;
    const float *alpha;
    float *acc;
    int64_t ldacc;
} pvb_args;

/* 6-row tiles, then 5-row ones (see avx512_kernels.c's qk_panel) */
FA_AVX512_INLINE void pvb_panel(const int nv, const int masked, const pvb_args *a)
{
    const int64_t r6 = fa_avx512_split65(a->rows);
    for (int64_t r = 0; r < r6; r += PVB_NR)
        pvb_tile(PVB_NR, nv, masked, a->tail, MIN64(PVB_NR, r6 - r), a->np, a->pp + r, a->ldp, a->vp, a->ldvp,
                 a->alpha ? a->alpha + r : NULL, a->acc + r * a->ldacc, a->ldacc);
    for (int64_t r = r6; r < a->rows; r += PVB_NR - 1)
        pvb_tile(PVB_NR - 1, nv, masked, a->tail, PVB_NR - 1, a->np, a->pp + r, a->ldp, a->vp, a->ldvp,
                 a->alpha ? a->alpha + r : NULL, a->acc + r * a->ldacc, a->ldacc);
}

/* One function per block width; whole vectors unmasked (see avx512_kernels.c's pv_panel4). */
static void pvb_panel4(const pvb_args *a) { pvb_panel(4, 0, a); }
static void pvb_panel3(const pvb_args *a) { pvb_panel(3, 0, a); }
static void pvb_panel2(const pvb_args *a) { pvb_panel(2, 0, a); }
static void pvb_panel1(const pvb_args *a) { pvb_panel(1, 0, a); }
static void pvb_panel4m(const pvb_args *a) { pvb_panel(4, 1, a); }
static void pvb_panel3m(const pvb_args *a) { pvb_panel(3, 1, a); }
static void pvb_panel2m(const pvb_args *a) { pvb_panel(2, 1, a); }
static void pvb_panel1m(const pvb_args *a) { pvb_panel(1, 1, a); }

/*
 * Scratch layout (dwords, 64-byte aligned pieces), np = ceil(cols / 2):
 *   vp  [np][round16(dv)]    V pairs, e padded with zeros to whole vectors
 *   pp  [np][round16(rows)]  P pairs
 * = 2*np*round16(dv) + 2*np*round16(rows) uint16 <= (cols+1)*(dv+32) + (cols+1)*ldst.
 */
void fa_avx512bf16_pv_6x64(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const uint16_t *v,
                          int64_t ldv, const float *alpha, float *acc, int64_t ldacc, void *scratch)
{
    const int64_t np = (cols + 1) / 2, ldvp = (dv + 15) / 16 * 16, ldp = (rows + 15) / 16 * 16;
    uint32_t *vp = scratch, *pp = vp + np * ldvp;

    /* 1. V pairs: word 2e of a dword row from V row 2p, word 2e+1 from row 2p+1
     * (zero past cols and past dv, from the masked loads) */
    const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                            37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
    for (int64_t p = 0; p < np; p++) {
        const int has1 = 2 * p + 1 < cols;
        const uint16_t *v0 = v + 2 * p * ldv, *v1 = has1 ? v0 + ldv : v0;
        uint32_t *dst = vp + p * ldvp;
        for (int64_t e = 0; e < ldvp; e += 32) {
            const __mmask32 ke = head_mask32(dv - e);
            const __m512i a = _mm512_maskz_loadu_epi16(ke, v0 + e);
            const __m512i b = has1 ? _mm512_maskz_loadu_epi16(ke, v1 + e) : _mm512_setzero_si512();
            _mm512_store_si512(dst + e, _mm512_permutex2var_epi16(a, lo_idx, b));
            if (e + 16 < ldvp) _mm512_store_si512(dst + e + 16, _mm512_permutex2var_epi16(a, hi_idx, b));
        }
    }

    /* 2. P pairs, rounded to nearest-even bf16 (st's padding rows are converted
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

    /* 3. acc = alpha * acc + P V, 128 pairs at a time (see avx512_kernels.c's pv) */
    static void (*const whole[PVB_NV + 1])(const pvb_args *) = {NULL, pvb_panel1, pvb_panel2, pvb_panel3, pvb_panel4};
    static void (*const part[PVB_NV + 1])(const pvb_args *) = {NULL, pvb_panel1m, pvb_panel2m, pvb_panel3m,
                                                               pvb_panel4m};
    for (int64_t p0 = 0; p0 < np; p0 += PVB_PCHUNK) {
        const int64_t n = MIN64(PVB_PCHUNK, np - p0);
        const float *al = p0 == 0 ? alpha : NULL;
        for (int64_t e0 = 0; e0 < dv; e0 += 16 * PVB_NV) {
            const int64_t ne = MIN64(16 * PVB_NV, dv - e0), nv = (ne + 15) / 16;
            const __mmask16 tail = fa_avx512_head_mask(ne - 16 * (nv - 1));
            const pvb_args a = {tail, rows, n, pp + p0 * ldp, ldp, vp + p0 * ldvp + e0, ldvp, al, acc + e0, ldacc};
            (tail == 0xFFFF ? whole : part)[nv](&a);
        }
    }
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
