/*
 * avx2_kernels.c: the micro-kernels for x86 CPUs with AVX2, FMA and F16C (no
 * AVX-512 anywhere in this file; it is the table for Haswell .. Alder Lake class
 * machines). One ymm vector holds 8 floats; with 16 ymm registers the blocks are
 *   qk  16 rows (2 vectors along r) x 6 key columns = 12 accumulators, K values
 *       broadcast from K rows read in place;
 *   pv  3 rows x 32 output columns (4 vectors along e) = 12 accumulators, P values
 *       broadcast, the alpha rescale applied when the accumulators are loaded;
 *       V (and P for large ldst) copied to small contiguous panels first;
 *   softmax  16 rows (2 vectors along r) walked down the columns twice (max, exp).
 * Semantics follow ref_kernels.c exactly; results differ only by rounding (FMA,
 * and exp below). Nothing here reads beyond what kernels.h allows: tails along
 * d, dv and rows use masked loads/stores or scalar code.
 */
#include "../kernels.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#if defined(__GNUC__)
#define AVX2_INLINE static inline __attribute__((always_inline))
#else
#define AVX2_INLINE static inline
#endif

static int64_t round_rows(int64_t rows)
{
    return (rows + FA_ROW_ALIGN - 1) / FA_ROW_ALIGN * FA_ROW_ALIGN;
}

/* Lanes i < n set (n in 0..8). */
AVX2_INLINE __m256i lanes_below(int64_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/*
 * exp(x) for 8 floats. n = round(x / ln 2), r = x - n ln 2 (Cody-Waite, two
 * FMAs, |r| <= ln2/2), exp(r) = 1 + r(1 + r q(r)) with q a degree-4 fit of
 * (e^r - 1 - r) / r^2 at Chebyshev nodes (approximation error < 1.1e-8 relative),
 * then 2^n built in the exponent field.
 * Accuracy, measured over every float x in [-87.33, 0] (results >= FLT_MIN):
 * at most 1 ulp from glibc's expf (99.5% bitwise equal) and at most 0.95 ulp
 * from the exact value. Below, the result is p * 2^-126 (a subnormal, absolute
 * error < 2^-149 + 1e-7 * 2^-126) down to x = -87.68, then exactly 0 (absolute
 * error < 8.4e-39; expf gives subnormals down to -103.97): so exp(-inf) = 0.
 * NaN gives NaN; positive x is accurate up to 88.37, +inf beyond (the softmax
 * only passes x > 0 in lanes it masks to 0).
 */
AVX2_INLINE __m256 exp_ps(__m256 x)
{
    /* max(lo, x) / min(hi, x) return x when x is NaN, so NaN flows through */
    x = _mm256_max_ps(_mm256_set1_ps(-88.0f), x);
    x = _mm256_min_ps(_mm256_set1_ps(88.7228394f), x);
    /* 1.5 * 2^23 + 127: adding it rounds x*log2(e) to an integer n held in the low
     * mantissa bits as n + 127, ready to be shifted into the exponent field */
    const __m256 shift = _mm256_set1_ps(12583039.0f);
    const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269502f), shift);
    const __m256 n = _mm256_sub_ps(t, shift);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x); /* exact */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-06f), r);
    __m256 q = _mm256_fmadd_ps(_mm256_set1_ps(1.39261759e-03f), r, _mm256_set1_ps(8.36317334e-03f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(4.16665562e-02f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.66665778e-01f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0.5f));
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 p = _mm256_fmadd_ps(q, r, one);
    p = _mm256_fmadd_ps(p, r, one);
    /* n in [-127, 128]: 2^n, with n = -127 giving +0 and n = 128 giving +inf */
    const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t), 23));
    return _mm256_mul_ps(p, scale);
}

/* ------------------------------------------------------------------ pack_qt */

/* In-register 8x8 transpose: row i of the input becomes column i of the output. */
AVX2_INLINE void transpose8(__m256 v[8])
{
    __m256 a0 = _mm256_unpacklo_ps(v[0], v[1]), a1 = _mm256_unpackhi_ps(v[0], v[1]);
    __m256 a2 = _mm256_unpacklo_ps(v[2], v[3]), a3 = _mm256_unpackhi_ps(v[2], v[3]);
    __m256 a4 = _mm256_unpacklo_ps(v[4], v[5]), a5 = _mm256_unpackhi_ps(v[4], v[5]);
    __m256 a6 = _mm256_unpacklo_ps(v[6], v[7]), a7 = _mm256_unpackhi_ps(v[6], v[7]);
    __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xEE);
    __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xEE);
    __m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xEE);
    __m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xEE);
    v[0] = _mm256_permute2f128_ps(b0, b4, 0x20);
    v[1] = _mm256_permute2f128_ps(b1, b5, 0x20);
    v[2] = _mm256_permute2f128_ps(b2, b6, 0x20);
    v[3] = _mm256_permute2f128_ps(b3, b7, 0x20);
    v[4] = _mm256_permute2f128_ps(b0, b4, 0x31);
    v[5] = _mm256_permute2f128_ps(b1, b5, 0x31);
    v[6] = _mm256_permute2f128_ps(b2, b6, 0x31);
    v[7] = _mm256_permute2f128_ps(b3, b7, 0x31);
}

static void avx2_pack_qt(int64_t rows, int64_t d, const float *q, int64_t ldq, float scale, float *qt,
                         int64_t ldqt)
{
    const int64_t padded = round_rows(rows);
    const __m256 vs = _mm256_set1_ps(scale);
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8) {
        const float *q0 = q + r * ldq;
        int64_t x = 0;
        for (; x + 8 <= d; x += 8) {
            __m256 v[8];
            for (int i = 0; i < 8; i++) v[i] = _mm256_loadu_ps(q0 + i * ldq + x);
            transpose8(v);
            for (int i = 0; i < 8; i++) _mm256_storeu_ps(qt + (x + i) * ldqt + r, _mm256_mul_ps(vs, v[i]));
        }
        for (; x < d; x++)
            for (int64_t i = 0; i < 8; i++) qt[x * ldqt + r + i] = scale * q0[i * ldq + x];
    }
    for (int64_t x = 0; x < d; x++) {
        float *dst = qt + x * ldqt;
        for (int64_t i = r; i < rows; i++) dst[i] = scale * q[i * ldq + x];
        for (int64_t i = rows; i < padded; i++) dst[i] = 0.0f;
    }
}

/* ----------------------------------------------------------------------- qk */

enum {
    QK_NC = 6,   /* key columns per register block */
    QK_XC = 128, /* d values per pass */
    QK_CC = 48   /* key columns per pass (8 register blocks) */
};

/*
 * out[j][0..15] (+)= sum over x < nx of qp[x * qld + 0..15] * kp[j * kld + x] for
 * j < nc: up to 12 accumulators. nc is a constant at every call site, so the
 * arrays live in registers.
 */
AVX2_INLINE void qk_block(int nc, int64_t nx, const float *qp, int64_t qld, const float *kp, int64_t kld,
                          float *out, int64_t ldo, int first)
{
    __m256 a0[QK_NC], a1[QK_NC];
    for (int j = 0; j < nc; j++) {
        a0[j] = first ? _mm256_setzero_ps() : _mm256_load_ps(out + j * ldo);
        a1[j] = first ? _mm256_setzero_ps() : _mm256_load_ps(out + j * ldo + 8);
    }
    for (int64_t x = 0; x < nx; x++) {
        const __m256 q0 = _mm256_load_ps(qp + x * qld), q1 = _mm256_load_ps(qp + x * qld + 8);
        for (int j = 0; j < nc; j++) {
            const __m256 b = _mm256_broadcast_ss(kp + j * kld + x);
            a0[j] = _mm256_fmadd_ps(q0, b, a0[j]);
            a1[j] = _mm256_fmadd_ps(q1, b, a1[j]);
        }
    }
    for (int j = 0; j < nc; j++) {
        _mm256_store_ps(out + j * ldo, a0[j]);
        _mm256_store_ps(out + j * ldo + 8, a1[j]);
    }
}

/* The last, partial column block: nc in 1..5. */
static void qk_block_edge(int nc, int64_t nx, const float *qp, int64_t qld, const float *kp, int64_t kld,
                          float *out, int64_t ldo, int first)
{
    switch (nc) {
    case 1: qk_block(1, nx, qp, qld, kp, kld, out, ldo, first); break;
    case 2: qk_block(2, nx, qp, qld, kp, kld, out, ldo, first); break;
    case 3: qk_block(3, nx, qp, qld, kp, kld, out, ldo, first); break;
    case 4: qk_block(4, nx, qp, qld, kp, kld, out, ldo, first); break;
    default: qk_block(5, nx, qp, qld, kp, kld, out, ldo, first); break;
    }
}

/*
 * Few rows (decoding): the 16-row block would be mostly padding, so dot products
 * along x instead: out[j][i] (+)= sum_x qr[i][x] kc[j][x] for nr rows (1..3) and 4
 * key rows kc[j], 12 accumulators at most. qr holds the Q rows contiguous and
 * zero-padded to a multiple of 8; the last K vector is masked by `tail`.
 */
AVX2_INLINE void qk_dot_block(int nr, int64_t nx, const float *qr, int64_t qld, const float *const kc[4],
                              __m256i tail, float *out, int64_t ldo, int first)
{
    __m256 a[3][4];
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < 4; j++) a[i][j] = _mm256_setzero_ps();
    int64_t x = 0;
    for (; x + 8 <= nx; x += 8)
        for (int j = 0; j < 4; j++) {
            const __m256 kv = _mm256_loadu_ps(kc[j] + x);
            for (int i = 0; i < nr; i++) a[i][j] = _mm256_fmadd_ps(_mm256_load_ps(qr + i * qld + x), kv, a[i][j]);
        }
    if (x < nx)
        for (int j = 0; j < 4; j++) {
            const __m256 kv = _mm256_maskload_ps(kc[j] + x, tail);
            for (int i = 0; i < nr; i++) a[i][j] = _mm256_fmadd_ps(_mm256_load_ps(qr + i * qld + x), kv, a[i][j]);
        }
    for (int i = 0; i < nr; i++) {
        /* the 4 horizontal sums as one vector (j = 0..3) */
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[i][0], a[i][1]), _mm256_hadd_ps(a[i][2], a[i][3]));
        float v4[4];
        _mm_storeu_ps(v4, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
        for (int j = 0; j < 4; j++) out[j * ldo + i] = first ? v4[j] : out[j * ldo + i] + v4[j];
    }
}

enum { QK_DOT_ROWS = 9 }; /* at most this many rows take the dot-product form */

static void qk_dot(int64_t rows, int64_t cols, int64_t d, const float *qt, int64_t ldqt, const float *k,
                   int64_t ldk, float *st, int64_t ldst)
{
    _Alignas(64) float qr[QK_DOT_ROWS * QK_XC]; /* (rows, QK_XC) Q rows, zero past d */
    float part[4 * 3];                          /* (4, 3) a partial column group */
    for (int64_t x0 = 0; x0 < d; x0 += QK_XC) {
        const int64_t nx = d - x0 < QK_XC ? d - x0 : QK_XC;
        const int first = x0 == 0;
        const __m256i tail = lanes_below(nx % 8);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t x = 0; x < nx; x++) qr[r * QK_XC + x] = qt[(x0 + x) * ldqt + r];
            for (int64_t x = nx; x < (nx + 7) / 8 * 8; x++) qr[r * QK_XC + x] = 0.0f;
        }
        for (int64_t c = 0; c < cols; c += 4) {
            const int64_t nc = cols - c < 4 ? cols - c : 4;
            const float *kc[4];
            for (int64_t j = 0; j < 4; j++) kc[j] = k + (c + (j < nc ? j : nc - 1)) * ldk + x0; /* repeat the last */
            for (int64_t r = 0; r < rows; r += 3) {
                const int nr = rows - r < 3 ? (int)(rows - r) : 3;
                const float *qp = qr + r * QK_XC;
                float *out = nc == 4 ? st + c * ldst + r : part;
                const int64_t ldo = nc == 4 ? ldst : 3;
                const int fresh = nc == 4 ? first : 1;
                if (nr == 1) qk_dot_block(1, nx, qp, QK_XC, kc, tail, out, ldo, fresh);
                else if (nr == 2) qk_dot_block(2, nx, qp, QK_XC, kc, tail, out, ldo, fresh);
                else qk_dot_block(3, nx, qp, QK_XC, kc, tail, out, ldo, fresh);
                if (nc < 4)
                    for (int64_t j = 0; j < nc; j++)
                        for (int i = 0; i < nr; i++) {
                            float *o = st + (c + j) * ldst + r + i;
                            *o = first ? part[j * 3 + i] : *o + part[j * 3 + i];
                        }
            }
        }
    }
    /* the padding rows, as the block form leaves them: zero (q is zero there) */
    const int64_t padded = round_rows(rows);
    for (int64_t c = 0; c < cols; c++)
        for (int64_t r = rows; r < padded; r++) st[c * ldst + r] = 0.0f;
}

/*
 * Loops: d in passes of 128, key columns in passes of 48 (their K rows, 24 KiB at
 * d = 128, stay in L1 while every 16-row block of Q goes by), then 16-row blocks,
 * then 6-column register blocks. K is read in place. A Q block with ldqt > 64 is
 * first copied to a contiguous 16 x 128 panel: read in place, rows 1 KiB or more
 * apart fall onto a few L1 sets and evict each other before the 8 column blocks
 * have reused them.
 */
static void avx2_qk(int64_t rows, int64_t cols, int64_t d, const float *qt, int64_t ldqt, const float *k,
                    int64_t ldk, float *st, int64_t ldst)
{
    if (rows <= QK_DOT_ROWS) {
        qk_dot(rows, cols, d, qt, ldqt, k, ldk, st, ldst);
        return;
    }
    _Alignas(64) float panel[QK_XC * 16]; /* (QK_XC, 16) */
    const int64_t padded = round_rows(rows);
    const int copy = ldqt > 64;
    for (int64_t x0 = 0; x0 < d; x0 += QK_XC) {
        const int64_t nx = d - x0 < QK_XC ? d - x0 : QK_XC;
        const int first = x0 == 0;
        for (int64_t c0 = 0; c0 < cols; c0 += QK_CC) {
            const int64_t ncc = cols - c0 < QK_CC ? cols - c0 : QK_CC;
            const float *kc = k + c0 * ldk + x0;
            for (int64_t r0 = 0; r0 < padded; r0 += 16) {
                const float *qp = qt + x0 * ldqt + r0;
                int64_t qld = ldqt;
                if (copy) {
                    for (int64_t x = 0; x < nx; x++) {
                        _mm256_store_ps(panel + 16 * x, _mm256_load_ps(qp + x * ldqt));
                        _mm256_store_ps(panel + 16 * x + 8, _mm256_load_ps(qp + x * ldqt + 8));
                    }
                    qp = panel;
                    qld = 16;
                }
                float *out = st + c0 * ldst + r0;
                int64_t c = 0;
                for (; c + QK_NC <= ncc; c += QK_NC)
                    qk_block(QK_NC, nx, qp, qld, kc + c * ldk, ldk, out + c * ldst, ldst, first);
                if (c < ncc) qk_block_edge((int)(ncc - c), nx, qp, qld, kc + c * ldk, ldk, out + c * ldst, ldst, first);
            }
        }
    }
}

/* ------------------------------------------------------------------ softmax */

/*
 * One strip of up to 16 rows (nv = 1 or 2 vectors along r), all columns.
 * Pass 1 takes the row maxima over kept columns (an unordered-compare mask keeps
 * a NaN sticky, as the reference's `|| isnan` does); pass 2 writes p and sums l in
 * column order, as the reference does.
 */
AVX2_INLINE void softmax_strip(int nv, const int64_t nrow[2], int64_t cols, float *st, int64_t ldst,
                               const int32_t *lo, const int32_t *hi, float *m, float *l, float *alpha)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256i lane[2], vlo[2], vhi[2];
    __m256 mx[2], unord[2], dead[2];
    for (int v = 0; v < nv; v++) {
        lane[v] = lanes_below(nrow[v]);
        if (lo) {
            vlo[v] = _mm256_maskload_epi32((const int *)lo + 8 * v, lane[v]);
            vhi[v] = _mm256_maskload_epi32((const int *)hi + 8 * v, lane[v]);
        }
        mx[v] = ninf;
        unord[v] = _mm256_setzero_ps();
    }

    /* pass 1: tile maxima */
    for (int64_t c = 0; c < cols; c++) {
        const float *sc = st + c * ldst;
        const __m256i vc = _mm256_set1_epi32((int)c);
        for (int v = 0; v < nv; v++) {
            __m256 s = _mm256_load_ps(sc + 8 * v);
            if (lo) {
                const __m256i out = _mm256_or_si256(_mm256_cmpgt_epi32(vlo[v], vc), _mm256_cmpgt_epi32(vc, vhi[v]));
                s = _mm256_blendv_ps(s, ninf, _mm256_castsi256_ps(out));
            }
            unord[v] = _mm256_or_ps(unord[v], _mm256_cmp_ps(s, s, _CMP_UNORD_Q));
            mx[v] = _mm256_max_ps(mx[v], s);
        }
    }

    /* new maxima, rescale factors, and which rows keep anything at all */
    __m256 mnew[2], lv[2];
    int all_live = 1;
    for (int v = 0; v < nv; v++) {
        const __m256 tmax = _mm256_blendv_ps(mx[v], _mm256_set1_ps(NAN), unord[v]);
        const __m256 mold = _mm256_maskload_ps(m + 8 * v, lane[v]);
        const __m256 grow = _mm256_or_ps(_mm256_cmp_ps(tmax, mold, _CMP_GT_OQ), unord[v]);
        mnew[v] = _mm256_blendv_ps(mold, tmax, grow);
        dead[v] = _mm256_cmp_ps(mnew[v], ninf, _CMP_EQ_OQ);
        const __m256 a = _mm256_blendv_ps(exp_ps(_mm256_sub_ps(mold, mnew[v])), _mm256_set1_ps(1.0f), dead[v]);
        lv[v] = _mm256_mul_ps(_mm256_maskload_ps(l + 8 * v, lane[v]), a);
        _mm256_maskstore_ps(alpha + 8 * v, lane[v], a);
        _mm256_maskstore_ps(m + 8 * v, lane[v], mnew[v]);
        /* a dead row keeps nothing: fold it into the band, or remember to mask it */
        if (lo) vlo[v] = _mm256_blendv_epi8(vlo[v], _mm256_set1_epi32(INT32_MAX), _mm256_castps_si256(dead[v]));
        else if (_mm256_movemask_ps(_mm256_and_ps(dead[v], _mm256_castsi256_ps(lane[v])))) all_live = 0;
    }

    /* pass 2: p = exp(s - m_new) where kept, else 0 */
    for (int64_t c = 0; c < cols; c++) {
        float *sc = st + c * ldst;
        const __m256i vc = _mm256_set1_epi32((int)c);
        for (int v = 0; v < nv; v++) {
            __m256 p = exp_ps(_mm256_sub_ps(_mm256_load_ps(sc + 8 * v), mnew[v]));
            if (lo) {
                const __m256i out = _mm256_or_si256(_mm256_cmpgt_epi32(vlo[v], vc), _mm256_cmpgt_epi32(vc, vhi[v]));
                p = _mm256_andnot_ps(_mm256_castsi256_ps(out), p);
            } else if (!all_live) {
                p = _mm256_andnot_ps(dead[v], p);
            }
            lv[v] = _mm256_add_ps(lv[v], p);
            _mm256_store_ps(sc + 8 * v, p);
        }
    }
    for (int v = 0; v < nv; v++) _mm256_maskstore_ps(l + 8 * v, lane[v], lv[v]);
}

static void avx2_softmax(int64_t rows, int64_t cols, float *st, int64_t ldst, const int32_t *lo,
                         const int32_t *hi, float *m, float *l, float *alpha)
{
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
        const int64_t left = rows - r0;
        const int64_t nrow[2] = {left < 8 ? left : 8, left < 16 ? left - 8 : 8};
        const int32_t *blo = lo ? lo + r0 : NULL, *bhi = hi ? hi + r0 : NULL;
        if (left > 8)
            softmax_strip(2, nrow, cols, st + r0, ldst, blo, bhi, m + r0, l + r0, alpha + r0);
        else
            softmax_strip(1, nrow, cols, st + r0, ldst, blo, bhi, m + r0, l + r0, alpha + r0);
    }
}

/* ----------------------------------------------------------------------- pv */

enum {
    PV_NR = 3,               /* rows per register block */
    PV_NV = 4,               /* vectors along e per register block */
    PV_EB = 8 * PV_NV,       /* e values per register block */
    PV_CC = 64,              /* columns per pass */
    PV_RC = 66,              /* rows per pass (a multiple of PV_NR) */
    PV_PLD = PV_RC + 14      /* P panel stride: 320 bytes, not a power of two */
};

/*
 * acc[i][0..8nv) = (alpha ? alpha[i] : 1) * acc[i][..] + sum over c < nc of pp[c * pld + i] * vp[c * vld + ..]
 * for i < nr. With `masked`, the last vector of acc and of V goes through `tail`.
 */
AVX2_INLINE void pv_block(int nr, int nv, int masked, __m256i tail, int64_t nc, const float *pp, int64_t pld,
                          const float *vp, int64_t vld, const float *alpha, float *acc, int64_t ldacc)
{
    __m256 a[PV_NR][PV_NV];
    for (int i = 0; i < nr; i++) {
        const float *ai = acc + i * ldacc;
        for (int j = 0; j < nv; j++)
            a[i][j] = masked && j == nv - 1 ? _mm256_maskload_ps(ai + 8 * j, tail) : _mm256_loadu_ps(ai + 8 * j);
        if (alpha) {
            const __m256 s = _mm256_broadcast_ss(alpha + i);
            for (int j = 0; j < nv; j++) a[i][j] = _mm256_mul_ps(a[i][j], s);
        }
    }
    for (int64_t c = 0; c < nc; c++) {
        __m256 p[PV_NR];
        for (int i = 0; i < nr; i++) p[i] = _mm256_broadcast_ss(pp + c * pld + i);
        for (int j = 0; j < nv; j++) {
            const float *vj = vp + c * vld + 8 * j;
            const __m256 vv = masked && j == nv - 1 ? _mm256_maskload_ps(vj, tail) : _mm256_loadu_ps(vj);
            for (int i = 0; i < nr; i++) a[i][j] = _mm256_fmadd_ps(p[i], vv, a[i][j]);
        }
    }
    for (int i = 0; i < nr; i++) {
        float *ai = acc + i * ldacc;
        for (int j = 0; j < nv; j++) {
            if (masked && j == nv - 1)
                _mm256_maskstore_ps(ai + 8 * j, tail, a[i][j]);
            else
                _mm256_storeu_ps(ai + 8 * j, a[i][j]);
        }
    }
}

/* Every block other than the full unmasked 3 x 4 one: fewer rows, fewer vectors;
 * the last vector always goes through the mask (all lanes when dv allows). */
static void pv_edge(int nr, int nv, __m256i tail, int64_t nc, const float *pp, int64_t pld, const float *vp,
                    int64_t vld, const float *alpha, float *acc, int64_t ldacc)
{
    switch (nr * 10 + nv) {
    case 11: pv_block(1, 1, 1, tail, nc, pp, pld, vp, vld, alpha, acc, ldacc); break;
    case 12: pv_block(1, 2, 1, tail, nc, pp, pld, vp, vld, alpha, acc, ldacc); break;
    case 13: pv_block(1, 3, 1, tail, nc, pp, pld, vp, vld, alpha, acc, ldacc); break;
    case 14: pv_block(1, 4, 1, tail, nc, pp, pld, vp, vld, alpha, acc, ldacc); break;
    case 21: pv_block(2, 1, 1, tail, nc, pp, pld, vp, vld, alpha, acc, ldacc); break;
    case 22: pv_block(2, 2, 1, tail, nc, pp, pld, vp, vld, alpha, acc, ldacc); break;
    case 23: pv_block(2, 3, 1, tail, nc, pp, pld, vp, vld, alpha, acc, ldacc); break;
    case 24: pv_block(2, 4, 1, tail, nc, pp, pld, vp, vld, alpha, acc, ldacc); break;
    case 31: pv_block(3, 1, 1, tail, nc, pp, pld, vp, vld, alpha, acc, ldacc); break;
    case 32: pv_block(3, 2, 1, tail, nc, pp, pld, vp, vld, alpha, acc, ldacc); break;
    case 33: pv_block(3, 3, 1, tail, nc, pp, pld, vp, vld, alpha, acc, ldacc); break;
    default: pv_block(3, 4, 1, tail, nc, pp, pld, vp, vld, alpha, acc, ldacc); break;
    }
}

/*
 * Loops: key columns in passes of 64, rows in passes of 66, 32-wide strips of e,
 * then 3-row register blocks. Each strip of V is copied to a contiguous 64 x 32
 * panel (8 KiB, zero-padded past dv so only acc needs masks): V rows are often a
 * multiple of 4 KiB apart (BSND tensors) and would all fall onto two L1 sets. P
 * is read in place when ldst <= 64, else copied to a 64 x 66 panel, for the
 * reason given at avx2_qk. With at most 3 rows (decoding) V is used once and is
 * read in place instead. The sum over c runs in order, pass after pass, as in the
 * reference; alpha is applied on the first pass.
 */
static void avx2_pv(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const float *v,
                    int64_t ldv, const float *alpha, float *acc, int64_t ldacc)
{
    _Alignas(64) float pp[PV_CC * PV_PLD]; /* (PV_CC, PV_PLD) P rows c, columns r */
    _Alignas(64) float vp[PV_CC * PV_EB];  /* (PV_CC, PV_EB)  V strip */
    for (int64_t c0 = 0; c0 < cols; c0 += PV_CC) {
        const int64_t nc = cols - c0 < PV_CC ? cols - c0 : PV_CC;
        for (int64_t r0 = 0; r0 < rows; r0 += PV_RC) {
            const int64_t nrr = rows - r0 < PV_RC ? rows - r0 : PV_RC;
            const float *pc = st + c0 * ldst + r0;
            int64_t pld = ldst;
            if (ldst > 64) {
                for (int64_t c = 0; c < nc; c++) memcpy(pp + c * PV_PLD, pc + c * ldst, (size_t)nrr * sizeof *pp);
                pc = pp;
                pld = PV_PLD;
            }
            const float *al = alpha && c0 == 0 ? alpha + r0 : NULL;
            for (int64_t e0 = 0; e0 < dv; e0 += PV_EB) {
                const int64_t ne = dv - e0 < PV_EB ? dv - e0 : PV_EB;
                const int nv = (int)((ne + 7) / 8);
                const __m256i tail = lanes_below(ne - 8 * (nv - 1));
                if (rows <= PV_NR) {
                    pv_edge((int)rows, nv, tail, nc, pc, pld, v + c0 * ldv + e0, ldv, al, acc + e0, ldacc);
                    continue;
                }
                for (int64_t c = 0; c < nc; c++) {
                    const float *src = v + (c0 + c) * ldv + e0;
                    float *dst = vp + c * PV_EB;
                    if (ne == PV_EB) {
                        for (int j = 0; j < PV_NV; j++) _mm256_store_ps(dst + 8 * j, _mm256_loadu_ps(src + 8 * j));
                    } else {
                        for (int j = 0; j < PV_NV; j++)
                            _mm256_store_ps(dst + 8 * j, _mm256_maskload_ps(src + 8 * j, lanes_below(ne - 8 * j)));
                    }
                }
                float *ac = acc + r0 * ldacc + e0;
                int64_t r = 0;
                if (ne == PV_EB)
                    for (; r + PV_NR <= nrr; r += PV_NR)
                        pv_block(PV_NR, PV_NV, 0, tail, nc, pc + r, pld, vp, PV_EB, al ? al + r : NULL, ac + r * ldacc, ldacc);
                for (; r < nrr; r += PV_NR) {
                    const int nr = nrr - r < PV_NR ? (int)(nrr - r) : PV_NR;
                    pv_edge(nr, nv, tail, nc, pc + r, pld, vp, PV_EB, al ? al + r : NULL, ac + r * ldacc, ldacc);
                }
            }
        }
    }
}

/* -------------------------------------------------------------- conversions */

static void avx2_f16_to_f32(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
        _mm256_storeu_ps(dst + i + 8, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i + 8))));
    }
    for (; i < n; i += 8) {
        const int64_t left = n - i < 8 ? n - i : 8;
        uint16_t tmp[8] = {0};
        memcpy(tmp, src + i, (size_t)left * sizeof *tmp);
        _mm256_maskstore_ps(dst + i, lanes_below(left), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tmp)));
    }
}

AVX2_INLINE __m256 bf16x8_to_f32(const uint16_t *src)
{
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)src));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

static void avx2_bf16_to_f32(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_ps(dst + i, bf16x8_to_f32(src + i));
        _mm256_storeu_ps(dst + i + 8, bf16x8_to_f32(src + i + 8));
    }
    for (; i < n; i += 8) {
        const int64_t left = n - i < 8 ? n - i : 8;
        uint16_t tmp[8] = {0};
        memcpy(tmp, src + i, (size_t)left * sizeof *tmp);
        _mm256_maskstore_ps(dst + i, lanes_below(left), bf16x8_to_f32(tmp));
    }
}

/* ------------------------------------------------------------------- probe */

/* 12 independent FMA chains (latency 4 x 2 ports needs >= 8); each converges to
 * c / (1 - m), so no overflow or subnormals whatever iters is. */
static double avx2_probe_fma(int64_t iters)
{
    const __m256 mul = _mm256_set1_ps(0.999f), add = _mm256_set1_ps(1e-3f);
    __m256 a0 = _mm256_set1_ps(0.10f), a1 = _mm256_set1_ps(0.11f), a2 = _mm256_set1_ps(0.12f);
    __m256 a3 = _mm256_set1_ps(0.13f), a4 = _mm256_set1_ps(0.14f), a5 = _mm256_set1_ps(0.15f);
    __m256 a6 = _mm256_set1_ps(0.16f), a7 = _mm256_set1_ps(0.17f), a8 = _mm256_set1_ps(0.18f);
    __m256 a9 = _mm256_set1_ps(0.19f), a10 = _mm256_set1_ps(0.20f), a11 = _mm256_set1_ps(0.21f);
    for (int64_t it = 0; it < iters; it++) {
        a0 = _mm256_fmadd_ps(a0, mul, add);
        a1 = _mm256_fmadd_ps(a1, mul, add);
        a2 = _mm256_fmadd_ps(a2, mul, add);
        a3 = _mm256_fmadd_ps(a3, mul, add);
        a4 = _mm256_fmadd_ps(a4, mul, add);
        a5 = _mm256_fmadd_ps(a5, mul, add);
        a6 = _mm256_fmadd_ps(a6, mul, add);
        a7 = _mm256_fmadd_ps(a7, mul, add);
        a8 = _mm256_fmadd_ps(a8, mul, add);
        a9 = _mm256_fmadd_ps(a9, mul, add);
        a10 = _mm256_fmadd_ps(a10, mul, add);
        a11 = _mm256_fmadd_ps(a11, mul, add);
    }
    /* keep the result live so the loop cannot be dropped */
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float out[8];
    _mm256_storeu_ps(out, s);
    volatile float sink = out[0] + out[7];
    (void)sink;
    return (double)iters * 12.0 * 16.0; /* 12 FMAs x 8 lanes x 2 flops */
}

const fa_kernels fa_kernels_avx2 = {
    .name = "avx2",
    .pack_qt = avx2_pack_qt,
    .qk = avx2_qk,
    .softmax = avx2_softmax,
    .pv = avx2_pv,
    .f16_to_f32 = avx2_f16_to_f32,
    .bf16_to_f32 = avx2_bf16_to_f32,
    .pack_qt_bf16 = NULL,
    .qk_bf16 = NULL,
    .pv_bf16 = NULL,
    .probe_fma = avx2_probe_fma,
    .probe_bf16 = NULL,
};
