/*
 * avx2_kernels.c: the micro-kernels for x86 CPUs with AVX2, FMA and F16C (no
 * AVX-512 anywhere in this file; it is the table for Haswell .. Alder Lake class
 * machines). One ymm vector holds 8 floats; with 16 ymm registers the blocks are
 *   qk  16 rows (2 vectors along r) x 6 key columns = 12 accumulators, K values
 *       broadcast from K rows read in place, the next pass's rows prefetched;
 *   pv  3 rows x 32 output columns (4 vectors along e) = 12 accumulators, P values
 *       broadcast from st in place, the alpha rescale applied when the
 *       accumulators are loaded; each 128 x 32 strip of V copied once to a
 *       contiguous panel that every row block then streams;
 *   softmax  16 rows (2 vectors along r) walked down the columns twice (max, exp);
 *   stx (backward)  3 acc rows c x 32 e (4 vectors along e) = 12 accumulators, st
 *       broadcast, x copied to contiguous zero-padded panels first;
 *   ds (backward)  64 rows (8 vectors of dvec) walked down the columns.
 * Semantics follow ref_kernels.c exactly; results differ only by rounding (FMA,
 * and exp below). Nothing here reads beyond what kernels.h allows: tails along
 * d, dv and rows use masked loads/stores or scalar code.
 */
#include "avx2_kernels.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#if defined(__GNUC__)
#define AVX2_INLINE static inline __attribute__((always_inline))
#else
#define AVX2_INLINE static inline
#endif

/* The register blocks below are arrays indexed by loops with constant trip
 * counts; unless those loops are unrolled completely the arrays live in memory,
 * and GCC unrolls them fully by itself at -O3 only: hence the pragma, which holds
 * at -O2 (RelWithDebInfo) too. clang needs its own spelling (see avx512_internal.h). */
#if defined(__clang__)
#define AVX2_UNROLL _Pragma("clang loop unroll(full)")
#else
#define AVX2_UNROLL _Pragma("GCC unroll 16")
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
 * Software prefetch of the rows the next pass of a kernel reads (nrows rows of n
 * floats, ld apart), spread over the current pass in equal steps: a K/V tile
 * usually comes from L3 (the packed K/V of a long unit outgrows L2), and the
 * hardware prefetchers start too late on rows that a pass reads in a burst.
 */
typedef struct pf_stream {
    uintptr_t base; /* an address, not a pointer: the rows may lie outside any object */
    int64_t ld, lines_per_row, total, next;
} pf_stream;

static pf_stream pf_rows(const float *base, int64_t nrows, int64_t n, int64_t ld)
{
    const int64_t lines = (4 * n + 63) / 64 + 1; /* +1: rows need not start a line */
    return (pf_stream){(uintptr_t)base, 4 * ld, lines, nrows > 0 ? nrows * lines : 0, 0};
}

/* Issues the prefetches of step `step` of `steps`. */
AVX2_INLINE void pf_step(pf_stream *ps, int64_t step, int64_t steps)
{
    const int64_t end = ps->total * (step + 1) / steps;
    for (; ps->next < end; ps->next++) {
        const int64_t row = ps->next / ps->lines_per_row, line = ps->next % ps->lines_per_row;
        const uintptr_t at = ps->base + (uintptr_t)(row * ps->ld) + (uintptr_t)(64 * line);
        _mm_prefetch((const char *)at, _MM_HINT_T1);
    }
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
 * NaN gives NaN; positive x is accurate up to 88.37 and meaningless beyond: the
 * softmaxes pass x > 0 only in lanes they mask to 0, so there is no upper clamp
 * (one op fewer of the ~16 per vector).
 */
AVX2_INLINE __m256 exp_ps(__m256 x)
{
    /* max(lo, x) / min(hi, x) return x when x is NaN, so NaN flows through */
    x = _mm256_max_ps(_mm256_set1_ps(-88.0f), x);
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

void fa_avx2_pack_qt(int64_t rows, int64_t d, const float *q, int64_t ldq, float scale, float *qt,
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
    QK_CC = 24   /* key columns per pass (4 register blocks) */
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
    AVX2_UNROLL
    for (int j = 0; j < nc; j++) {
        a0[j] = first ? _mm256_setzero_ps() : _mm256_load_ps(out + j * ldo);
        a1[j] = first ? _mm256_setzero_ps() : _mm256_load_ps(out + j * ldo + 8);
    }
    for (int64_t x = 0; x < nx; x++) {
        const __m256 q0 = _mm256_load_ps(qp + x * qld), q1 = _mm256_load_ps(qp + x * qld + 8);
        AVX2_UNROLL
        for (int j = 0; j < nc; j++) {
            const __m256 b = _mm256_broadcast_ss(kp + j * kld + x);
            a0[j] = _mm256_fmadd_ps(q0, b, a0[j]);
            a1[j] = _mm256_fmadd_ps(q1, b, a1[j]);
        }
    }
    AVX2_UNROLL
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
    AVX2_UNROLL
    for (int i = 0; i < nr; i++)
        AVX2_UNROLL
        for (int j = 0; j < 4; j++) a[i][j] = _mm256_setzero_ps();
    int64_t x = 0;
    for (; x + 8 <= nx; x += 8)
        AVX2_UNROLL
        for (int j = 0; j < 4; j++) {
            const __m256 kv = _mm256_loadu_ps(kc[j] + x);
            AVX2_UNROLL
            for (int i = 0; i < nr; i++) a[i][j] = _mm256_fmadd_ps(_mm256_load_ps(qr + i * qld + x), kv, a[i][j]);
        }
    if (x < nx)
        AVX2_UNROLL
        for (int j = 0; j < 4; j++) {
            const __m256 kv = _mm256_maskload_ps(kc[j] + x, tail);
            AVX2_UNROLL
            for (int i = 0; i < nr; i++) a[i][j] = _mm256_fmadd_ps(_mm256_load_ps(qr + i * qld + x), kv, a[i][j]);
        }
    AVX2_UNROLL
    for (int i = 0; i < nr; i++) {
        /* the 4 horizontal sums as one vector (j = 0..3) */
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[i][0], a[i][1]), _mm256_hadd_ps(a[i][2], a[i][3]));
        float v4[4];
        _mm_storeu_ps(v4, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
        AVX2_UNROLL
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
 * Loops: d in passes of 128, key columns in passes of 24 (their K rows, 12 KiB at
 * d = 128, stay in L1 while every 16-row block of Q goes by), then 16-row blocks,
 * then 6-column register blocks. K is read in place, and so is Q: a 16 x 128
 * block of qt (8 KiB) is reused by the 4 column blocks of a pass. 12 + 8 KiB
 * leave room in a 32 KiB L1 (Zen 2/3, Intel client cores); passes of 48
 * columns do not (their K rows and the Q block overflow it). Only a qt whose rows
 * are a multiple of 256 bytes apart is first copied to a contiguous panel: its
 * column slice would fall onto a quarter of the L1 sets or fewer and evict itself
 * (the core's panels never are: fa_panel_ld), and a copy of every block costs more
 * than it saves. While a pass runs, the K rows of the next one are prefetched into
 * L2, spread over its row blocks, because a long unit's K tiles come from L3. K is
 * read in place rather than packed into [x][6] micro-panels (BLIS's B panel): the
 * packing costs what it saves here (bench/README.md, "Kernel and plan notes").
 */
void fa_avx2_qk_16x6(int64_t rows, int64_t cols, int64_t d, const float *qt, int64_t ldqt, const float *k,
                    int64_t ldk, float *st, int64_t ldst)
{
    if (rows <= QK_DOT_ROWS) {
        qk_dot(rows, cols, d, qt, ldqt, k, ldk, st, ldst);
        return;
    }
    _Alignas(64) float panel[QK_XC * 16]; /* (QK_XC, 16) */
    const int64_t padded = round_rows(rows);
    const int copy = ldqt % 64 == 0;
    for (int64_t x0 = 0; x0 < d; x0 += QK_XC) {
        const int64_t nx = d - x0 < QK_XC ? d - x0 : QK_XC;
        const int first = x0 == 0;
        for (int64_t c0 = 0; c0 < cols; c0 += QK_CC) {
            const int64_t ncc = cols - c0 < QK_CC ? cols - c0 : QK_CC;
            const float *kc = k + c0 * ldk + x0;
            const int64_t nxt = cols - c0 - ncc < QK_CC ? cols - c0 - ncc : QK_CC;
            pf_stream ps = pf_rows(nxt > 0 ? k + (c0 + ncc) * ldk + x0 : k, nxt, nx, ldk);
            for (int64_t r0 = 0; r0 < padded; r0 += 16) {
                pf_step(&ps, r0 / 16, padded / 16);
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
    AVX2_UNROLL
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
        AVX2_UNROLL
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
    AVX2_UNROLL
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
        AVX2_UNROLL
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
    AVX2_UNROLL
    for (int v = 0; v < nv; v++) _mm256_maskstore_ps(l + 8 * v, lane[v], lv[v]);
}

void fa_avx2_softmax(int64_t rows, int64_t cols, float *st, int64_t ldst, const int32_t *lo,
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
    PV_NR = 3,         /* rows per register block */
    PV_NV = 4,         /* vectors along e per register block */
    PV_EB = 8 * PV_NV, /* e values per register block, the width of a V panel */
    PV_CC = 128        /* key columns per pass: a V panel of PV_CC x PV_EB is 16 KiB */
};

/*
 * The register block of pv and stx: for i < nr,
 *   acc[i][0..8nv) = (alpha ? alpha[i] : 1) * acc[i][..] + sum over k < nk of w[k * wk + i * wi] * x[k * ldx + ..],
 * the sum over k in order, as in the reference. pv: w = P^T (st[c][r], wk = ldst,
 * wi = 1), x = V rows, i = query rows; stx: w = st rows (wk = 1, wi = ldst), x = the
 * x strip, i = acc rows c, alpha NULL. acc is read and written in whole vectors: its
 * rows are aligned and its padding (ldacc a multiple of 16) is free to use. With
 * `masked`, x's last vector goes through `tail` (x read in place); a panel's zero
 * padding needs no mask.
 */
AVX2_INLINE void wx_block(const int nr, const int nv, const int masked, __m256i tail, int64_t nk, const float *w,
                          int64_t wk, int64_t wi, const float *x, int64_t ldx, const float *alpha, float *acc,
                          int64_t ldacc)
{
    __m256 a[PV_NR][PV_NV];
    AVX2_UNROLL
    for (int i = 0; i < nr; i++) {
        const float *ai = acc + i * ldacc;
        AVX2_UNROLL
        for (int j = 0; j < nv; j++) a[i][j] = _mm256_loadu_ps(ai + 8 * j);
        if (alpha) {
            const __m256 s = _mm256_broadcast_ss(alpha + i);
            AVX2_UNROLL
            for (int j = 0; j < nv; j++) a[i][j] = _mm256_mul_ps(a[i][j], s);
        }
    }
    for (int64_t k = 0; k < nk; k++) {
        __m256 wb[PV_NR];
        AVX2_UNROLL
        for (int i = 0; i < nr; i++) wb[i] = _mm256_broadcast_ss(w + k * wk + i * wi);
        AVX2_UNROLL
        for (int j = 0; j < nv; j++) {
            const float *xj = x + k * ldx + 8 * j;
            const __m256 xv = masked && j == nv - 1 ? _mm256_maskload_ps(xj, tail) : _mm256_loadu_ps(xj);
            AVX2_UNROLL
            for (int i = 0; i < nr; i++) a[i][j] = _mm256_fmadd_ps(wb[i], xv, a[i][j]);
        }
    }
    AVX2_UNROLL
    for (int i = 0; i < nr; i++)
        AVX2_UNROLL
        for (int j = 0; j < nv; j++) _mm256_storeu_ps(acc + i * ldacc + 8 * j, a[i][j]);
}

/* All rows against one V panel (nc x PV_EB, 8nv columns of it used): 3-row
 * blocks, then 2-row ones for what is left; one 1-row block (a third of the
 * FMAs per load) only when rows is 1. The planner's row counts are multiples
 * of 16, 3k + 1: their last 4 rows go as 2 + 2. */
AVX2_INLINE void pv_rows(const int nv, int64_t rows, int64_t nc, const float *p, int64_t ldp, const float *vp,
                         const float *alpha, float *acc, int64_t ldacc)
{
    const __m256i none = _mm256_setzero_si256();
    const int64_t r3 = rows % 3 == 1 && rows >= 4 ? rows - 4 : rows - rows % 3;
    int64_t r = 0;
    for (; r < r3; r += PV_NR)
        wx_block(PV_NR, nv, 0, none, nc, p + r, ldp, 1, vp, PV_EB, alpha ? alpha + r : NULL, acc + r * ldacc, ldacc);
    for (; r + 2 <= rows; r += 2)
        wx_block(2, nv, 0, none, nc, p + r, ldp, 1, vp, PV_EB, alpha ? alpha + r : NULL, acc + r * ldacc, ldacc);
    if (r < rows) wx_block(1, nv, 0, none, nc, p + r, ldp, 1, vp, PV_EB, alpha ? alpha + r : NULL, acc + r * ldacc, ldacc);
}

static void pv_rows4(int64_t rows, int64_t nc, const float *p, int64_t ldp, const float *vp, const float *alpha,
                     float *acc, int64_t ldacc)
{
    pv_rows(4, rows, nc, p, ldp, vp, alpha, acc, ldacc);
}

static void pv_rows_part(int nv, int64_t rows, int64_t nc, const float *p, int64_t ldp, const float *vp,
                         const float *alpha, float *acc, int64_t ldacc)
{
    switch (nv) {
    case 1: pv_rows(1, rows, nc, p, ldp, vp, alpha, acc, ldacc); break;
    case 2: pv_rows(2, rows, nc, p, ldp, vp, alpha, acc, ldacc); break;
    default: pv_rows(3, rows, nc, p, ldp, vp, alpha, acc, ldacc); break;
    }
}

/* At most 3 rows (decoding): V is used once, so it is read in place, its last vector masked. */
static void pv_few(int nr, int nv, __m256i tail, int64_t nc, const float *p, int64_t ldp, const float *v,
                   int64_t ldv, const float *alpha, float *acc, int64_t ldacc)
{
    switch (nr * 10 + nv) {
    case 11: wx_block(1, 1, 1, tail, nc, p, ldp, 1, v, ldv, alpha, acc, ldacc); break;
    case 12: wx_block(1, 2, 1, tail, nc, p, ldp, 1, v, ldv, alpha, acc, ldacc); break;
    case 13: wx_block(1, 3, 1, tail, nc, p, ldp, 1, v, ldv, alpha, acc, ldacc); break;
    case 14: wx_block(1, 4, 1, tail, nc, p, ldp, 1, v, ldv, alpha, acc, ldacc); break;
    case 21: wx_block(2, 1, 1, tail, nc, p, ldp, 1, v, ldv, alpha, acc, ldacc); break;
    case 22: wx_block(2, 2, 1, tail, nc, p, ldp, 1, v, ldv, alpha, acc, ldacc); break;
    case 23: wx_block(2, 3, 1, tail, nc, p, ldp, 1, v, ldv, alpha, acc, ldacc); break;
    case 24: wx_block(2, 4, 1, tail, nc, p, ldp, 1, v, ldv, alpha, acc, ldacc); break;
    case 31: wx_block(3, 1, 1, tail, nc, p, ldp, 1, v, ldv, alpha, acc, ldacc); break;
    case 32: wx_block(3, 2, 1, tail, nc, p, ldp, 1, v, ldv, alpha, acc, ldacc); break;
    case 33: wx_block(3, 3, 1, tail, nc, p, ldp, 1, v, ldv, alpha, acc, ldacc); break;
    default: wx_block(3, 4, 1, tail, nc, p, ldp, 1, v, ldv, alpha, acc, ldacc); break;
    }
}

/*
 * Loops: key columns in passes of PV_CC, 32-wide strips of e, then every row in
 * 3-row register blocks. Each strip of V is copied once per pass into a
 * contiguous PV_CC x 32 panel (16 KiB, zero-padded past dv), which all the row
 * blocks then stream: read in place, a 128-byte slice of rows 512 bytes or more
 * apart would use a quarter of the L1 sets or less and miss. P is broadcast in
 * place, st[c][r..r+2]: a row block walks one cache line per column, shared by
 * the blocks of the same 16 rows. Only acc rows cross passes (loaded and stored
 * once per pass); alpha is applied on the first. The sum over c runs in order,
 * as in the reference. Variants that gained nothing (copying each V row whole
 * into all strip panels at once, each row block walking every strip so that its P
 * columns are fetched once, prefetching the next strip's V rows) are in
 * bench/README.md, "Kernel and plan notes".
 */
void fa_avx2_pv_3x32(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const float *v,
                     int64_t ldv, const float *alpha, float *acc, int64_t ldacc)
{
    _Alignas(64) float vp[PV_CC * PV_EB]; /* (PV_CC, PV_EB) V strip */
    for (int64_t c0 = 0; c0 < cols; c0 += PV_CC) {
        const int64_t nc = cols - c0 < PV_CC ? cols - c0 : PV_CC;
        const float *pc = st + c0 * ldst, *vc = v + c0 * ldv;
        const float *al = c0 == 0 ? alpha : NULL;
        for (int64_t e0 = 0; e0 < dv; e0 += PV_EB) {
            const int64_t ne = dv - e0 < PV_EB ? dv - e0 : PV_EB;
            const int nv = (int)((ne + 7) / 8);
            if (rows <= PV_NR) {
                pv_few((int)rows, nv, lanes_below(ne - 8 * (nv - 1)), nc, pc, ldst, vc + e0, ldv, al, acc + e0, ldacc);
                continue;
            }
            if (ne == PV_EB) {
                for (int64_t c = 0; c < nc; c++) {
                    const float *src = vc + c * ldv + e0;
                    float *dst = vp + c * PV_EB;
                    for (int j = 0; j < PV_NV; j++) _mm256_store_ps(dst + 8 * j, _mm256_loadu_ps(src + 8 * j));
                }
                pv_rows4(rows, nc, pc, ldst, vp, al, acc + e0, ldacc);
            } else {
                for (int64_t c = 0; c < nc; c++) {
                    const float *src = vc + c * ldv + e0;
                    float *dst = vp + c * PV_EB;
                    for (int j = 0; j < nv; j++)
                        _mm256_store_ps(dst + 8 * j, _mm256_maskload_ps(src + 8 * j, lanes_below(ne - 8 * j)));
                }
                if (nv == PV_NV) pv_rows4(rows, nc, pc, ldst, vp, al, acc + e0, ldacc);
                else pv_rows_part(nv, rows, nc, pc, ldst, vp, al, acc + e0, ldacc);
            }
        }
    }
}

/* ----------------------------------------------------------------- backward */

/*
 * ds: p * (dp - dvec) over round_up(rows, 16) rows, nv vectors of dvec (8 per 64
 * rows, else 2 per 16) held over every column. A masked p = 0 gives 0 whatever
 * dp is: the product is and-ed with p != 0 (unordered, so a NaN p stays NaN).
 */
AVX2_INLINE void ds_strip(const int nv, int64_t cols, const float *st, int64_t ldst, float *dp, int64_t lddp,
                          const float *dvec)
{
    __m256 dv[8];
    for (int i = 0; i < nv; i++) dv[i] = _mm256_loadu_ps(dvec + 8 * i); /* dvec: no alignment promised */
    for (int64_t c = 0; c < cols; c++) {
        const float *pc = st + c * ldst;
        float *dc = dp + c * lddp;
        for (int i = 0; i < nv; i++) {
            const __m256 p = _mm256_load_ps(pc + 8 * i);
            const __m256 kept = _mm256_cmp_ps(p, _mm256_setzero_ps(), _CMP_NEQ_UQ);
            const __m256 prod = _mm256_mul_ps(p, _mm256_sub_ps(_mm256_load_ps(dc + 8 * i), dv[i]));
            _mm256_store_ps(dc + 8 * i, _mm256_and_ps(kept, prod));
        }
    }
}

void fa_avx2_ds(int64_t rows, int64_t cols, const float *st, int64_t ldst, float *dp, int64_t lddp,
                const float *dvec)
{
    const int64_t rp = round_rows(rows);
    int64_t r = 0;
    for (; r + 64 <= rp; r += 64) ds_strip(8, cols, st + r, ldst, dp + r, lddp, dvec + r);
    for (; r < rp; r += 16) ds_strip(2, cols, st + r, ldst, dp + r, lddp, dvec + r);
}

/*
 * stx: acc[c][e] += sum_r st[c][r] x[r][e], pv's 3 x 32 block with the tile's axes
 * swapped: 3 acc rows c (st[c][r] broadcast from 3 rows of st, walked along r) x
 * 32 e (4 ymm of an x row), 12 accumulators over 128 rows. Each 128 x 32 strip of x
 * is copied to a contiguous panel first (16 KiB, zero-padded past n), which every
 * block of 3 columns then reads: x rows are user rows (Q, dO), often a multiple of
 * 4 KiB apart, and the padding spares the blocks masked loads. acc's padding
 * columns (n <= e < ldacc, ldacc a multiple of 16) may be written, so its last
 * vector is read and written whole.
 */
enum {
    STX_NC = 3,         /* acc rows c per register block */
    STX_NV = 4,         /* vectors along e per register block */
    STX_EB = 8 * STX_NV, /* e values per register block */
    STX_RC = 128        /* rows r per pass */
};

/* Every block but the full 3 x 4 one, each shape its own inlined copy. */
static void stx_edge(int nc, int nv, int64_t rows, const float *st, int64_t ldst, const float *xp, float *acc,
                     int64_t ldacc)
{
    const __m256i none = _mm256_setzero_si256();
    switch (nc * 10 + nv) {
    case 11: wx_block(1, 1, 0, none, rows, st, 1, ldst, xp, STX_EB, NULL, acc, ldacc); break;
    case 12: wx_block(1, 2, 0, none, rows, st, 1, ldst, xp, STX_EB, NULL, acc, ldacc); break;
    case 13: wx_block(1, 3, 0, none, rows, st, 1, ldst, xp, STX_EB, NULL, acc, ldacc); break;
    case 14: wx_block(1, 4, 0, none, rows, st, 1, ldst, xp, STX_EB, NULL, acc, ldacc); break;
    case 21: wx_block(2, 1, 0, none, rows, st, 1, ldst, xp, STX_EB, NULL, acc, ldacc); break;
    case 22: wx_block(2, 2, 0, none, rows, st, 1, ldst, xp, STX_EB, NULL, acc, ldacc); break;
    case 23: wx_block(2, 3, 0, none, rows, st, 1, ldst, xp, STX_EB, NULL, acc, ldacc); break;
    case 24: wx_block(2, 4, 0, none, rows, st, 1, ldst, xp, STX_EB, NULL, acc, ldacc); break;
    case 31: wx_block(3, 1, 0, none, rows, st, 1, ldst, xp, STX_EB, NULL, acc, ldacc); break;
    case 32: wx_block(3, 2, 0, none, rows, st, 1, ldst, xp, STX_EB, NULL, acc, ldacc); break;
    default: wx_block(3, 3, 0, none, rows, st, 1, ldst, xp, STX_EB, NULL, acc, ldacc); break;
    }
}

void fa_avx2_stx_3x32(int64_t rows, int64_t cols, int64_t n, const float *st, int64_t ldst, const float *x,
                      int64_t ldx, float *acc, int64_t ldacc)
{
    _Alignas(64) float xp[STX_RC * STX_EB]; /* (STX_RC, STX_EB) x strip */
    const __m256i none = _mm256_setzero_si256();
    for (int64_t r0 = 0; r0 < rows; r0 += STX_RC) {
        const int64_t rr = rows - r0 < STX_RC ? rows - r0 : STX_RC;
        for (int64_t e0 = 0; e0 < n; e0 += STX_EB) {
            const int64_t ne = n - e0 < STX_EB ? n - e0 : STX_EB;
            const int nv = (int)((ne + 7) / 8);
            for (int64_t r = 0; r < rr; r++) {
                const float *src = x + (r0 + r) * ldx + e0;
                float *dst = xp + r * STX_EB;
                if (ne == STX_EB) {
                    for (int j = 0; j < STX_NV; j++) _mm256_store_ps(dst + 8 * j, _mm256_loadu_ps(src + 8 * j));
                } else {
                    for (int j = 0; j < STX_NV; j++)
                        _mm256_store_ps(dst + 8 * j, _mm256_maskload_ps(src + 8 * j, lanes_below(ne - 8 * j)));
                }
            }
            const float *sc = st + r0;
            float *ac = acc + e0;
            /* 3-column blocks, then 2-column ones (pv_rows: a count 3k + 1 ends in 2 + 2) */
            const int64_t c3 = cols % 3 == 1 && cols >= 4 ? cols - 4 : cols - cols % 3;
            int64_t c = 0;
            if (nv == STX_NV)
                for (; c < c3; c += STX_NC)
                    wx_block(STX_NC, STX_NV, 0, none, rr, sc + c * ldst, 1, ldst, xp, STX_EB, NULL, ac + c * ldacc, ldacc);
            for (; c < c3; c += STX_NC) stx_edge(STX_NC, nv, rr, sc + c * ldst, ldst, xp, ac + c * ldacc, ldacc);
            for (; c < cols; c += 2) {
                const int nc = cols - c < 2 ? 1 : 2;
                stx_edge(nc, nv, rr, sc + c * ldst, ldst, xp, ac + c * ldacc, ldacc);
            }
        }
    }
}

/* -------------------------------------------------------------- conversions */

void fa_avx2_f16_to_f32(const uint16_t *src, float *dst, int64_t n)
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

void fa_avx2_bf16_to_f32(const uint16_t *src, float *dst, int64_t n)
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

/* f16 and bf16 outputs (o, and dq/dk/dv): half.h's rounding exactly, eight at a time
 * rather than the reference's scalar loops. vcvtps2ph rounds to nearest even and keeps a NaN's sign, quiet bit and top payload
 * bits as fa_f32_to_f16 does (the avx512 table relies on the same). */
AVX2_INLINE __m128i f32x8_to_f16(__m256 v)
{
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* fa_f32_to_bf16 on eight floats: the dwords rounded to nearest even on the low 16
 * bits (a NaN quieted instead), their high halves packed. */
AVX2_INLINE __m128i f32x8_to_bf16(__m256 v)
{
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rn = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
    const __m256i nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    const __m256i r = _mm256_srli_epi32(_mm256_blendv_epi8(rn, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), nan), 16);
    /* packus works within 128-bit lanes: the two halves are then in place */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* n floats to a 16-bit dtype, eight at a time, the tail through a masked load. */
AVX2_INLINE void f32_to_half(const int bf16, const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(src + i);
        _mm_storeu_si128((__m128i *)(dst + i), bf16 ? f32x8_to_bf16(v) : f32x8_to_f16(v));
    }
    if (i < n) {
        uint16_t tmp[8];
        const __m256 v = _mm256_maskload_ps(src + i, lanes_below(n - i));
        _mm_storeu_si128((__m128i *)tmp, bf16 ? f32x8_to_bf16(v) : f32x8_to_f16(v));
        memcpy(dst + i, tmp, (size_t)(n - i) * sizeof *tmp);
    }
}

void fa_avx2_f32_to_f16(const float *src, uint16_t *dst, int64_t n) { f32_to_half(0, src, dst, n); }

void fa_avx2_f32_to_bf16(const float *src, uint16_t *dst, int64_t n) { f32_to_half(1, src, dst, n); }

/* ------------------------------------------------------- small-row (decode) */

/*
 * Decoding: at most 8 query rows, scores row-major s[r][c], K/V rows of type kv
 * reached through pointers (kernels.h). K/V elements are widened to f32 in
 * registers as they are loaded, each K/V vector once per register block, and
 * used by every query row of the block; nothing converted goes back to memory.
 * Blocks (16 ymm):
 *   qk_small  g rows x nc key columns of partial dot products along d (g = 1..4
 *             rows: nc = 8, 4, 4, 3), reduced by hadd trees into one vector of
 *             column sums per row; key columns in blocks of 24; 5..8 rows run as
 *             two row groups over the same block, whose K rows are then in L1;
 *   softmax_small  one row at a time, vectors along c;
 *   pv_small  all rows x nv vectors along e (nv = 4, 4, 3, 2, 2, 2, 2, 1 for
 *             1..8 rows), columns in chunks of 64 so the V rows of a chunk stay
 *             in L1 while the e blocks go by.
 * Decoding streams K and V from memory once, so both kernels prefetch the rows
 * SMALL_PF columns ahead (K row by row before each tile, V the same e range as
 * the current block), spread over the work rather than in bursts, which pays when
 * the cache comes from DRAM and costs nothing when it sits in L3. Only the first SMALL_PF rows of a call
 * rely on the hardware prefetchers.
 * Tails: the last d % 8 (dv % 8) elements are done as the row's last whole
 * vector, the lanes done before zeroed (in q and K; in V, with alpha 1); rows
 * shorter than 8 go through kv_load_part. A last, partial tile of key columns
 * repeats the last K row and stores only the columns below cols.
 */

/* 8 E4M3 codes as binary16 of value / 256 (half.h's fa_e4m3_to_f16_bits): t = the
 * sign-extended byte << 7 puts the sign in bits 15 and 14 and exponent and mantissa
 * in binary16's fields (subnormals included); bit 14 must become "NaN code" (all of
 * 0x3f80 set, then exponent 31). t + 0x80 carries into bit 14 exactly for the NaN
 * codes, so bit 14 of t ^ (t + 0x80) is that flag: t ^ ((t + 0x80) & 0x4000). */
AVX2_INLINE __m128i e4m3x8_to_f16(__m128i b)
{
    const __m128i t = _mm_slli_epi16(_mm_cvtepi8_epi16(b), 7);
    const __m128i u = _mm_add_epi16(t, _mm_set1_epi16(0x80));
    return _mm_xor_si128(t, _mm_and_si128(u, _mm_set1_epi16(0x4000)));
}

/* 8 consecutive elements of a K/V row from x on, as floats (unscaled: the int8 code;
 * fp8 as its value / fa_kv_load_unit). */
AVX2_INLINE __m256 kv_load8(const int kv, const void *row, int64_t x)
{
    switch (kv) {
    case FA_KV_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + x)));
    case FA_KV_BF16: return bf16x8_to_f32((const uint16_t *)row + x);
    case FA_KV_I8:
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)row + x))));
    case FA_KV_F8E4M3: return _mm256_cvtph_ps(e4m3x8_to_f16(_mm_loadl_epi64((const __m128i *)((const uint8_t *)row + x))));
    case FA_KV_F8E5M2: /* the byte is the top of the binary16 */
        return _mm256_cvtph_ps(
            _mm_unpacklo_epi8(_mm_setzero_si128(), _mm_loadl_epi64((const __m128i *)((const uint8_t *)row + x))));
    default: return _mm256_loadu_ps((const float *)row + x);
    }
}

/* The n (1..8) elements from x on, zero in the other lanes; reads nothing past them. */
AVX2_INLINE __m256 kv_load_part(const int kv, const void *row, int64_t x, int64_t n)
{
    if (kv == FA_KV_F32) return _mm256_maskload_ps((const float *)row + x, lanes_below(n));
    _Alignas(16) uint16_t tmp[8] = {0}; /* 16 bytes: 8 halves, or 8 bytes */
    const int64_t esz = fa_kv_elem_bytes(kv);
    memcpy(tmp, (const char *)row + x * esz, (size_t)(n * esz));
    return kv_load8(kv, tmp, 0);
}

/* Ask for the cache lines of K/V rows c0 .. c1-1 (row bytes each): rows reached
 * through pointers may be anywhere, so the hardware prefetchers may not follow. */
AVX2_INLINE void prefetch_rows(const void *const *row, int64_t c0, int64_t c1, int64_t bytes)
{
    for (int64_t c = c0; c < c1; c++) {
        const char *p = (const char *)row[c];
        for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
        _mm_prefetch(p + bytes - 1, _MM_HINT_T0);
    }
}

/* Sums of a0..a3 in lanes 0..3. */
AVX2_INLINE __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/*
 * s[i][j] = sum_x q[i][x] * k_j[x] (times ks[j] for the scaled types) for i < nr, j < nc,
 * stored for j < nst (the tile's columns below cols). The d % 8 values past the
 * last whole vector are done as one more vector: K's last 8 elements times qtail,
 * q's last 8, with the lanes already done zeroed in both (for d < 8: q and K
 * zero-padded).
 */
AVX2_INLINE void qks_tile(const int kv, const int nr, const int nc, int64_t nst, int64_t d, const float *q,
                          int64_t ldq, const float *qtail, const void *const *kp, const float *ks, float *s,
                          int64_t lds)
{
    __m256 acc[4][8];
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nc; j++) acc[i][j] = _mm256_setzero_ps();
    const int64_t d8 = d & ~(int64_t)7;
    for (int64_t x = 0; x < d8; x += 8) {
        __m256 qv[4];
        for (int i = 0; i < nr; i++) qv[i] = _mm256_loadu_ps(q + i * ldq + x);
        for (int j = 0; j < nc; j++) {
            const __m256 k = kv_load8(kv, kp[j], x);
            for (int i = 0; i < nr; i++) acc[i][j] = _mm256_fmadd_ps(qv[i], k, acc[i][j]);
        }
    }
    if (d8 < d) { /* K's last 8 elements (all of it, zero-padded, when d < 8) against qtail */
        __m256 kt[8], qv[4];
        /* the lanes done already are zero in qtail and in K (an infinite K times 0 would be NaN) */
        const __m256 keep = _mm256_castsi256_ps(
            _mm256_cmpgt_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(7 - (int)(d - d8))));
        for (int j = 0; j < nc; j++)
            kt[j] = d >= 8 ? _mm256_and_ps(kv_load8(kv, kp[j], d - 8), keep) : kv_load_part(kv, kp[j], 0, d);
        for (int i = 0; i < nr; i++) qv[i] = _mm256_load_ps(qtail + 8 * i);
        for (int j = 0; j < nc; j++)
            for (int i = 0; i < nr; i++) acc[i][j] = _mm256_fmadd_ps(qv[i], kt[j], acc[i][j]);
    }
    const __m256 z = _mm256_setzero_ps();
    for (int i = 0; i < nr; i++) {
        float *si = s + i * lds;
        for (int j = nc; j < 8; j++) acc[i][j] = z;
        if (nc == 8) {
            const __m128 lo4 = hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
            const __m128 hi4 = hsum4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
            __m256 h = _mm256_insertf128_ps(_mm256_castps128_ps256(lo4), hi4, 1);
            if (fa_kv_scaled(kv)) h = _mm256_mul_ps(h, _mm256_loadu_ps(ks));
            if (nst == 8) _mm256_storeu_ps(si, h);
            else _mm256_maskstore_ps(si, lanes_below(nst), h);
        } else {
            __m128 h = hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
            if (fa_kv_scaled(kv)) h = _mm_mul_ps(h, _mm_loadu_ps(ks)); /* ks has 8 entries from the block start */
            if (nc == 4 && nst == 4) _mm_storeu_ps(si, h);
            else _mm_maskstore_ps(si, _mm256_castsi256_si128(lanes_below(nst < nc ? nst : nc)), h);
        }
    }
}

enum {
    QKS_SB = 24,  /* key columns per qk_small block: a multiple of every tile width */
    SMALL_PF = 32 /* K/V rows are prefetched this many columns ahead */
};

/* Rows r0 .. r0+g of one block of QKS_SB key columns, `valid` of them < cols. */
AVX2_INLINE void qks_group(const int kv, const int g, int64_t valid, int64_t d, const float *q, int64_t ldq,
                           const float *qtail, const void *const *kp, const float *ks, float *s, int64_t lds,
                           const void *const *pf, int64_t npf, int64_t bytes)
{
    const int nc = g == 1 ? 8 : g == 4 ? 3 : 4; /* 8, 8, 12, 12 accumulators */
    for (int j = 0; j < QKS_SB && j < valid; j += nc) {
        prefetch_rows(pf, j < npf ? j : npf, j + nc < npf ? j + nc : npf, bytes);
        qks_tile(kv, g, nc, valid - j < nc ? valid - j : nc, d, q, ldq, qtail, kp + j, ks + j, s + j, lds);
    }
}

AVX2_INLINE void qk_small_kv(const int kv, int64_t rows, int64_t cols, int64_t d, const float *q, int64_t ldq,
                             const void *const *krow, const float *kscale, float *s, int64_t lds)
{
    _Alignas(32) float qtail[FA_SMALL_ROWS * 8];
    const int64_t d8 = d & ~(int64_t)7;
    const int64_t t0 = d >= 8 ? d - 8 : 0; /* qtail[r][x] is q[r][t0 + x] where t0 + x >= d8 */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t x = 0; x < 8; x++) qtail[8 * r + x] = t0 + x >= d8 && t0 + x < d ? q[r * ldq + t0 + x] : 0.0f;
    /* two row groups beyond 4 rows: 3+2, 3+3, 4+3, 4+4 */
    const int g0 = rows <= 4 ? (int)rows : (int)(rows + 1) / 2, g1 = (int)rows - g0;
    const int64_t bytes = d * fa_kv_elem_bytes(kv);
    const float unit = fa_kv_load_unit(kv);
    for (int64_t c0 = 0; c0 < cols; c0 += QKS_SB) {
        const int64_t valid = cols - c0 < QKS_SB ? cols - c0 : QKS_SB;
        const void *kp[QKS_SB];
        _Alignas(32) float ks[QKS_SB + 8]; /* zero past the valid columns (a tile reads up to 8) */
        for (int64_t j = 0; j < QKS_SB; j++) {
            const int64_t c = c0 + (j < valid ? j : valid - 1);
            kp[j] = krow[c];
        }
        if (fa_kv_scaled(kv)) /* unit is a power of two: scale * unit is exact */
            for (int64_t j = 0; j < QKS_SB + 8; j++) ks[j] = j < valid ? kscale[c0 + j] * unit : 0.0f;
        const int64_t pf0 = c0 + SMALL_PF, npf0 = cols - pf0 < 0 ? 0 : cols - pf0 < QKS_SB ? cols - pf0 : QKS_SB;
        for (int part = 0; part < 2; part++) {
            const int g = part ? g1 : g0;
            const int64_t r0 = part ? g0 : 0;
            const float *qr = q + r0 * ldq, *qt = qtail + 8 * r0;
            float *sr = s + r0 * lds + c0;
            const int64_t npf = part ? 0 : npf0; /* the first row group prefetches */
            switch (g) {
            case 1: qks_group(kv, 1, valid, d, qr, ldq, qt, kp, ks, sr, lds, krow + pf0, npf, bytes); break;
            case 2: qks_group(kv, 2, valid, d, qr, ldq, qt, kp, ks, sr, lds, krow + pf0, npf, bytes); break;
            case 3: qks_group(kv, 3, valid, d, qr, ldq, qt, kp, ks, sr, lds, krow + pf0, npf, bytes); break;
            case 4: qks_group(kv, 4, valid, d, qr, ldq, qt, kp, ks, sr, lds, krow + pf0, npf, bytes); break;
            default: break;
            }
        }
    }
}

void fa_avx2_qk_small(int64_t rows, int64_t cols, int64_t d, const float *q, int64_t ldq,
                          const void *const *krow, int kv, const float *kscale, float *s, int64_t lds)
{
    switch (kv) {
    case FA_KV_F16: qk_small_kv(FA_KV_F16, rows, cols, d, q, ldq, krow, kscale, s, lds); break;
    case FA_KV_BF16: qk_small_kv(FA_KV_BF16, rows, cols, d, q, ldq, krow, kscale, s, lds); break;
    case FA_KV_I8: qk_small_kv(FA_KV_I8, rows, cols, d, q, ldq, krow, kscale, s, lds); break;
    case FA_KV_F8E4M3: qk_small_kv(FA_KV_F8E4M3, rows, cols, d, q, ldq, krow, kscale, s, lds); break;
    case FA_KV_F8E5M2: qk_small_kv(FA_KV_F8E5M2, rows, cols, d, q, ldq, krow, kscale, s, lds); break;
    default: qk_small_kv(FA_KV_F32, rows, cols, d, q, ldq, krow, kscale, s, lds); break;
    }
}

/* Horizontal max / sum of 8 floats (no NaN in the max: the caller tracks those). */
AVX2_INLINE float hmax8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

AVX2_INLINE float hsum8(__m256 v)
{
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
}

/*
 * softmax's rules on s[r][c]: pass 1 takes each row's maximum over its band
 * [a, z] (8 columns at a time, lanes outside the band set to -inf, NaN tracked
 * by an unordered compare), then m, alpha and l for all rows as one vector, as
 * fa_avx2_softmax does; pass 2 writes p (zero outside the band, in s's padding too)
 * and sums it.
 */
void fa_avx2_softmax_small(int64_t rows, int64_t cols, float *s, int64_t lds, const int32_t *lo,
                               const int32_t *hi, float *m, float *l, float *alpha)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _Alignas(32) float tmax[8], mnew[8], lsc[8];
    int64_t band[FA_SMALL_ROWS][2];
    for (int64_t r = 0; r < 8; r++) tmax[r] = -INFINITY;
    for (int64_t r = 0; r < rows; r++) {
        const float *sr = s + r * lds;
        const int64_t a = lo && lo[r] > 0 ? lo[r] : 0, z = hi && hi[r] < cols - 1 ? hi[r] : cols - 1;
        band[r][0] = a;
        band[r][1] = z;
        if (a > z) continue;
        const __m256i va = _mm256_set1_epi32((int)a), vz = _mm256_set1_epi32((int)z);
        __m256 mx = ninf, unord = _mm256_setzero_ps();
        for (int64_t c0 = a & ~(int64_t)7; c0 <= z; c0 += 8) {
            __m256 v = _mm256_load_ps(sr + c0);
            if (c0 < a || c0 + 7 > z) {
                const __m256i c = _mm256_add_epi32(_mm256_set1_epi32((int)c0), idx);
                const __m256i out = _mm256_or_si256(_mm256_cmpgt_epi32(va, c), _mm256_cmpgt_epi32(c, vz));
                v = _mm256_blendv_ps(v, ninf, _mm256_castsi256_ps(out));
            }
            unord = _mm256_or_ps(unord, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            mx = _mm256_max_ps(mx, v);
        }
        tmax[r] = _mm256_movemask_ps(unord) ? NAN : hmax8(mx);
    }

    /* m_new, alpha and l * alpha for all rows at once */
    const __m256i lane = lanes_below(rows);
    const __m256 tm = _mm256_load_ps(tmax), mold = _mm256_maskload_ps(m, lane);
    const __m256 grow = _mm256_or_ps(_mm256_cmp_ps(tm, mold, _CMP_GT_OQ), _mm256_cmp_ps(tm, tm, _CMP_UNORD_Q));
    const __m256 mn = _mm256_blendv_ps(mold, tm, grow);
    const __m256 dead = _mm256_cmp_ps(mn, ninf, _CMP_EQ_OQ);
    const __m256 al = _mm256_blendv_ps(exp_ps(_mm256_sub_ps(mold, mn)), _mm256_set1_ps(1.0f), dead);
    _mm256_maskstore_ps(alpha, lane, al);
    _mm256_maskstore_ps(m, lane, mn);
    _mm256_store_ps(mnew, mn);
    _mm256_store_ps(lsc, _mm256_mul_ps(_mm256_maskload_ps(l, lane), al));

    for (int64_t r = 0; r < rows; r++) {
        float *sr = s + r * lds;
        const int64_t a = band[r][0], z = band[r][1];
        if (mnew[r] == -INFINITY || a > z) { /* nothing kept */
            for (int64_t c0 = 0; c0 < cols; c0 += 8) _mm256_store_ps(sr + c0, _mm256_setzero_ps());
            l[r] = lsc[r];
            continue;
        }
        const __m256 mv = _mm256_set1_ps(mnew[r]);
        const __m256i va = _mm256_set1_epi32((int)a), vz = _mm256_set1_epi32((int)z);
        __m256 sum = _mm256_setzero_ps();
        for (int64_t c0 = 0; c0 < cols; c0 += 8) {
            if (c0 + 7 < a || c0 > z) {
                _mm256_store_ps(sr + c0, _mm256_setzero_ps());
                continue;
            }
            __m256 p = exp_ps(_mm256_sub_ps(_mm256_load_ps(sr + c0), mv));
            if (c0 < a || c0 + 7 > z) {
                const __m256i c = _mm256_add_epi32(_mm256_set1_epi32((int)c0), idx);
                const __m256i out = _mm256_or_si256(_mm256_cmpgt_epi32(va, c), _mm256_cmpgt_epi32(c, vz));
                p = _mm256_andnot_ps(_mm256_castsi256_ps(out), p);
            }
            sum = _mm256_add_ps(sum, p);
            _mm256_store_ps(sr + c0, p);
        }
        l[r] = lsc[r] + hsum8(sum);
    }
}

enum { PVS_CC = 64 }; /* key columns per chunk */

/*
 * acc[i][e0 .. e0+8nv) = (alpha ? alpha[i] : 1) * acc + sum_c p[i][c] v_c[..] for i < nr.
 * part 0: whole vectors, acc aligned. part 1 (dv >= 8, nv = 1): the last npart
 * elements of the row, as the vector e0 = dv - 8 with its first 8 - npart lanes
 * (already done) left alone: V masked to 0 there, alpha 1. part 2 (dv < 8, nv =
 * 1): the whole row, zero-padded; the rest of the vector is acc's padding.
 */
AVX2_INLINE void pvs_tile(const int kv, const int nr, const int nv, const int part, int64_t npart, int64_t nc,
                          const float *p, int64_t ldp, const void *const *vrow, int64_t e0, const float *alpha,
                          float *acc, int64_t ldacc, int64_t npf)
{
    const int64_t es = fa_kv_elem_bytes(kv);
    const int64_t pfoff = e0 * es, pfend = pfoff + (part == 2 ? npart : 8 * nv) * es - 1;
    const __m256 keep = part == 1 ? _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                                                         _mm256_set1_epi32(7 - (int)npart)))
                                  : _mm256_setzero_ps();
    __m256 a[FA_SMALL_ROWS][4];
    for (int i = 0; i < nr; i++) {
        const float *ai = acc + i * ldacc + e0;
        for (int j = 0; j < nv; j++) a[i][j] = part == 1 ? _mm256_loadu_ps(ai) : _mm256_load_ps(ai + 8 * j);
        if (alpha) {
            __m256 al = _mm256_broadcast_ss(alpha + i);
            if (part == 1) al = _mm256_blendv_ps(_mm256_set1_ps(1.0f), al, keep);
            for (int j = 0; j < nv; j++) a[i][j] = _mm256_mul_ps(a[i][j], al);
        }
    }
    for (int64_t c = 0; c < nc; c++) {
        const void *vc = vrow[c];
        if (c < npf) { /* the same e range of the row SMALL_PF columns on */
            _mm_prefetch((const char *)vrow[c + SMALL_PF] + pfoff, _MM_HINT_T0);
            _mm_prefetch((const char *)vrow[c + SMALL_PF] + pfend, _MM_HINT_T0);
        }
        __m256 vv[4];
        for (int j = 0; j < nv; j++) {
            if (part == 2) vv[j] = kv_load_part(kv, vc, 0, npart);
            else if (part == 1) vv[j] = _mm256_and_ps(kv_load8(kv, vc, e0), keep);
            else vv[j] = kv_load8(kv, vc, e0 + 8 * j);
        }
        for (int i = 0; i < nr; i++) {
            const __m256 w = _mm256_broadcast_ss(p + i * ldp + c);
            for (int j = 0; j < nv; j++) a[i][j] = _mm256_fmadd_ps(w, vv[j], a[i][j]);
        }
    }
    for (int i = 0; i < nr; i++) {
        float *ai = acc + i * ldacc + e0;
        for (int j = 0; j < nv; j++) {
            if (part == 1) _mm256_storeu_ps(ai, a[i][j]);
            else _mm256_store_ps(ai + 8 * j, a[i][j]);
        }
    }
}

AVX2_INLINE void pv_small_rows(const int kv, const int nr, int64_t cols, int64_t dv, const float *s, int64_t lds,
                               const void *const *vrow, const float *vscale, const float *alpha, float *acc,
                               int64_t ldacc)
{
    static const int nv_for[FA_SMALL_ROWS + 1] = {0, 4, 4, 3, 2, 2, 2, 2, 1}; /* 4 to 14 accumulators */
    const int nv = nv_for[nr];
    _Alignas(64) float ps[FA_SMALL_ROWS * PVS_CC]; /* i8, fp8: p times the V row scales */
    for (int64_t c0 = 0; c0 < cols; c0 += PVS_CC) {
        const int64_t nc = cols - c0 < PVS_CC ? cols - c0 : PVS_CC;
        const float *p = s + c0;
        int64_t ldp = lds;
        if (fa_kv_scaled(kv)) {
            const float unit = fa_kv_load_unit(kv); /* a power of two: exact */
            for (int i = 0; i < nr; i++)
                for (int64_t c = 0; c < nc; c++) ps[i * PVS_CC + c] = s[i * lds + c0 + c] * (vscale[c0 + c] * unit);
            p = ps;
            ldp = PVS_CC;
        }
        const float *al = c0 == 0 ? alpha : NULL;
        const void *const *vc = vrow + c0;
        const int64_t npf = cols - c0 - SMALL_PF < 0 ? 0 : cols - c0 - SMALL_PF; /* columns with a row SMALL_PF ahead */
        int64_t e = 0;
        for (; e + 8 * nv <= dv; e += 8 * nv) {
            switch (nv) { /* nv is a constant here; the switch only makes it visible as one */
            case 1: pvs_tile(kv, nr, 1, 0, 0, nc, p, ldp, vc, e, al, acc, ldacc, npf); break;
            case 2: pvs_tile(kv, nr, 2, 0, 0, nc, p, ldp, vc, e, al, acc, ldacc, npf); break;
            case 3: pvs_tile(kv, nr, 3, 0, 0, nc, p, ldp, vc, e, al, acc, ldacc, npf); break;
            default: pvs_tile(kv, nr, 4, 0, 0, nc, p, ldp, vc, e, al, acc, ldacc, npf); break;
            }
        }
        if (nv > 1)
            for (; e + 8 <= dv; e += 8) pvs_tile(kv, nr, 1, 0, 0, nc, p, ldp, vc, e, al, acc, ldacc, npf);
        if (e < dv && dv >= 8) pvs_tile(kv, nr, 1, 1, dv - e, nc, p, ldp, vc, dv - 8, al, acc, ldacc, npf);
        else if (e < dv) pvs_tile(kv, nr, 1, 2, dv, nc, p, ldp, vc, 0, al, acc, ldacc, npf);
    }
}

AVX2_INLINE void pv_small_kv(const int kv, int64_t rows, int64_t cols, int64_t dv, const float *s, int64_t lds,
                             const void *const *vrow, const float *vscale, const float *alpha, float *acc,
                             int64_t ldacc)
{
    switch (rows) {
    case 1: pv_small_rows(kv, 1, cols, dv, s, lds, vrow, vscale, alpha, acc, ldacc); break;
    case 2: pv_small_rows(kv, 2, cols, dv, s, lds, vrow, vscale, alpha, acc, ldacc); break;
    case 3: pv_small_rows(kv, 3, cols, dv, s, lds, vrow, vscale, alpha, acc, ldacc); break;
    case 4: pv_small_rows(kv, 4, cols, dv, s, lds, vrow, vscale, alpha, acc, ldacc); break;
    case 5: pv_small_rows(kv, 5, cols, dv, s, lds, vrow, vscale, alpha, acc, ldacc); break;
    case 6: pv_small_rows(kv, 6, cols, dv, s, lds, vrow, vscale, alpha, acc, ldacc); break;
    case 7: pv_small_rows(kv, 7, cols, dv, s, lds, vrow, vscale, alpha, acc, ldacc); break;
    default: pv_small_rows(kv, 8, cols, dv, s, lds, vrow, vscale, alpha, acc, ldacc); break;
    }
}

void fa_avx2_pv_small(int64_t rows, int64_t cols, int64_t dv, const float *s, int64_t lds,
                          const void *const *vrow, int kv, const float *vscale, const float *alpha, float *acc,
                          int64_t ldacc)
{
    switch (kv) {
    case FA_KV_F16: pv_small_kv(FA_KV_F16, rows, cols, dv, s, lds, vrow, vscale, alpha, acc, ldacc); break;
    case FA_KV_BF16: pv_small_kv(FA_KV_BF16, rows, cols, dv, s, lds, vrow, vscale, alpha, acc, ldacc); break;
    case FA_KV_I8: pv_small_kv(FA_KV_I8, rows, cols, dv, s, lds, vrow, vscale, alpha, acc, ldacc); break;
    case FA_KV_F8E4M3: pv_small_kv(FA_KV_F8E4M3, rows, cols, dv, s, lds, vrow, vscale, alpha, acc, ldacc); break;
    case FA_KV_F8E5M2: pv_small_kv(FA_KV_F8E5M2, rows, cols, dv, s, lds, vrow, vscale, alpha, acc, ldacc); break;
    default: pv_small_kv(FA_KV_F32, rows, cols, dv, s, lds, vrow, vscale, alpha, acc, ldacc); break;
    }
}

/* ------------------------------------------------------------------- probe */

/* 12 independent FMA chains (latency 4 x 2 ports needs >= 8); each converges to
 * c / (1 - m), so no overflow or subnormals whatever iters is. */
double fa_avx2_probe_fma(int64_t iters)
{
    const __m256 mul = _mm256_set1_ps(0.999f), add = _mm256_set1_ps(1e-3f);
    __m256 a[12];
    AVX2_UNROLL
    for (int j = 0; j < 12; j++) a[j] = _mm256_set1_ps(0.10f + 0.01f * (float)j);
    for (int64_t it = 0; it < iters; it++) {
        AVX2_UNROLL
        for (int j = 0; j < 12; j++) a[j] = _mm256_fmadd_ps(a[j], mul, add);
    }
    /* keep the result live so the loop cannot be dropped */
    __m256 s = a[0];
    AVX2_UNROLL
    for (int j = 1; j < 12; j++) s = _mm256_add_ps(s, a[j]);
    float out[8];
    _mm256_storeu_ps(out, s);
    volatile float sink = out[0] + out[7];
    (void)sink;
    return (double)iters * 12.0 * 16.0; /* 12 FMAs x 8 lanes x 2 flops */
}
