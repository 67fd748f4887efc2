/*
 * neon_kernels.c: the AArch64 Advanced SIMD (NEON) micro-kernels, 4 floats per
 * vector, 32 vector registers. Base ARMv8-A only (no fp16 arithmetic, no bf16
 * dot products), so the table runs on every aarch64 CPU.
 *
 * Register blocks (acc = accumulators kept in registers for a whole loop):
 *   qk  4 key columns x 16 query rows (16 acc); x unrolled by 4, K read as
 *       vectors along x and broadcast by lane (fmla by element)
 *   pv  12 query rows x 8 output columns (24 acc); P read as vectors along r
 *       and broadcast by lane, V rows read as vectors along e
 *   softmax  8 query rows (2 vectors) at a time, running max and sum in registers
 *   stx (backward)  8 acc rows c x 8 e (16 acc); st read as vectors along r and
 *       broadcast by lane, x rows read as vectors along e
 *   ds (backward)  16 rows (4 vectors of dvec) walked down the columns
 * Remainders (rows, cols, d, dv not multiples of the block) fall to smaller
 * blocks, then to scalar tails; k and v may have any leading dimension.
 *
 * exp: range reduction x = n ln2 + r with |r| <= ln2/2 (Cody-Waite, two fused
 * steps), exp(r) = 1 + r + r^2 P(r) with P a degree-4 least-squares fit (0.05 ulp
 * truncation error), and 2^n applied in two halves so that subnormal results are
 * rounded once and x <= -104 (and -inf) gives exactly 0. Over every float in
 * [-88, 0] (1.12e9 of them): at most 1.04 ulp from the exact value
 * (double exp), at most 1 ulp from glibc's expf (equal for 99.2%); NaN gives NaN,
 * x > 88.73 gives +inf.
 */
#include "neon_kernels.h"

#include <arm_neon.h>
#include <math.h>
#include <string.h>

/* The block helpers take their block shape as arguments and must be inlined
 * into each caller, where the shape is a constant: only then are their loops
 * unrolled and their accumulator arrays kept in registers. */
#if defined(__GNUC__)
#define NEON_BLOCK static inline __attribute__((always_inline))
#else
#define NEON_BLOCK static inline
#endif

static int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

/* ------------------------------------------------------------------ exp */

NEON_BLOCK float32x4_t exp_f32x4(float32x4_t x)
{
    const float32x4_t one = vdupq_n_f32(1.0f);
    /* FMAX/FMIN propagate NaN; below -104 the result rounds to 0 anyway, so the
     * clamp only keeps n in range (and maps -inf to 0). */
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-104.0f)), vdupq_n_f32(89.0f));
    const float32x4_t z = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(0x1.715476p+0f))); /* round(x / ln2) */
    const int32x4_t n = vcvtq_s32_f32(z);
    float32x4_t r = vfmaq_f32(x, z, vdupq_n_f32(-0x1.62e430p-1f)); /* ln2 high part */
    r = vfmaq_f32(r, z, vdupq_n_f32(0x1.05c610p-29f));             /* minus ln2 low part */
    float32x4_t p = vdupq_n_f32(0x1.6d9904p-10f);
    p = vfmaq_f32(vdupq_n_f32(0x1.123d88p-7f), p, r);
    p = vfmaq_f32(vdupq_n_f32(0x1.55547cp-5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(0x1.55548cp-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    const float32x4_t y = vaddq_f32(vfmaq_f32(r, p, vmulq_f32(r, r)), one); /* exp(r) in [0.7, 1.42] */
    /* times 2^n = 2^n1 * 2^n2, n1 = floor(n/2), both halves in [-75, 64] for n in
     * [-150, 128]: y * 2^n1 is exact (an exponent add), the final multiply rounds
     * once, also into the subnormals */
    const int32x4_t n1 = vshrq_n_s32(n, 1), n2 = vsubq_s32(n, n1);
    const float32x4_t y1 = vreinterpretq_f32_s32(vaddq_s32(vreinterpretq_s32_f32(y), vshlq_n_s32(n1, 23)));
    const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, vdupq_n_s32(127)), 23));
    return vmulq_f32(y1, s2);
}

/* ------------------------------------------------------------------ pack_qt */

void fa_neon_pack_qt(int64_t rows, int64_t d, const float *q, int64_t ldq, float scale, float *qt,
                         int64_t ldqt)
{
    const int64_t r4 = rows / 4 * 4, padded = round_up(rows, FA_ROW_ALIGN);
    const float32x4_t vs = vdupq_n_f32(scale);
    for (int64_t r = 0; r < r4; r += 4) {
        const float *q0 = q + r * ldq, *q1 = q0 + ldq, *q2 = q1 + ldq, *q3 = q2 + ldq;
        float *dst = qt + r;
        int64_t x = 0;
        for (; x + 4 <= d; x += 4) { /* 4x4 transpose: two rounds of trn */
            const float32x4_t a0 = vld1q_f32(q0 + x), a1 = vld1q_f32(q1 + x);
            const float32x4_t a2 = vld1q_f32(q2 + x), a3 = vld1q_f32(q3 + x);
            const float64x2_t t0 = vreinterpretq_f64_f32(vtrn1q_f32(a0, a1));
            const float64x2_t t1 = vreinterpretq_f64_f32(vtrn2q_f32(a0, a1));
            const float64x2_t t2 = vreinterpretq_f64_f32(vtrn1q_f32(a2, a3));
            const float64x2_t t3 = vreinterpretq_f64_f32(vtrn2q_f32(a2, a3));
            vst1q_f32(dst + (x + 0) * ldqt, vmulq_f32(vreinterpretq_f32_f64(vtrn1q_f64(t0, t2)), vs));
            vst1q_f32(dst + (x + 1) * ldqt, vmulq_f32(vreinterpretq_f32_f64(vtrn1q_f64(t1, t3)), vs));
            vst1q_f32(dst + (x + 2) * ldqt, vmulq_f32(vreinterpretq_f32_f64(vtrn2q_f64(t0, t2)), vs));
            vst1q_f32(dst + (x + 3) * ldqt, vmulq_f32(vreinterpretq_f32_f64(vtrn2q_f64(t1, t3)), vs));
        }
        for (; x < d; x++) {
            float *dx = dst + x * ldqt;
            dx[0] = scale * q0[x];
            dx[1] = scale * q1[x];
            dx[2] = scale * q2[x];
            dx[3] = scale * q3[x];
        }
    }
    /* the last 0-3 rows, then zeros up to the row padding */
    const int64_t pad4 = round_up(rows, 4);
    for (int64_t x = 0; x < d; x++) {
        float *dx = qt + x * ldqt;
        int64_t r = r4;
        for (; r < rows; r++) dx[r] = scale * q[r * ldq + x];
        for (; r < pad4; r++) dx[r] = 0.0f;
        for (; r < padded; r += 4) vst1q_f32(dx + r, vdupq_n_f32(0.0f));
    }
}

/* ------------------------------------------------------------------ qk */

/*
 * st[c][r] for nc (1 or 4) key columns and nv (1 or 4) vectors of query rows.
 * Called with constant nc, nv so that the compiler unrolls the loops and keeps
 * acc in registers. Per 4 steps of x: one K vector per column (4 x values,
 * broadcast by lane) and 4 Q^T vectors per x.
 */
#define QK_LANE(L)                                                                            \
    do {                                                                                      \
        const float *qx_ = qt + (x + (L)) * ldqt;                                             \
        float32x4_t q_[4];                                                                    \
        for (int j_ = 0; j_ < nv; j_++) q_[j_] = vld1q_f32(qx_ + 4 * j_);                     \
        for (int c_ = 0; c_ < nc; c_++)                                                       \
            for (int j_ = 0; j_ < nv; j_++)                                                   \
                acc[c_][j_] = vfmaq_laneq_f32(acc[c_][j_], q_[j_], kv[c_], (L));              \
    } while (0)

NEON_BLOCK void qk_tile(const int nc, const int nv, int64_t d, const float *qt, int64_t ldqt,
                           const float *k, int64_t ldk, float *st, int64_t ldst)
{
    float32x4_t acc[4][4];
    const float *kc[4];
    for (int c = 0; c < nc; c++) {
        kc[c] = k + c * ldk;
        for (int j = 0; j < nv; j++) acc[c][j] = vdupq_n_f32(0.0f);
    }
    int64_t x = 0;
    for (; x + 4 <= d; x += 4) {
        float32x4_t kv[4];
        for (int c = 0; c < nc; c++) kv[c] = vld1q_f32(kc[c] + x);
        QK_LANE(0);
        QK_LANE(1);
        QK_LANE(2);
        QK_LANE(3);
    }
    for (; x < d; x++) {
        const float *qx = qt + x * ldqt;
        float32x4_t q[4];
        for (int j = 0; j < nv; j++) q[j] = vld1q_f32(qx + 4 * j);
        for (int c = 0; c < nc; c++)
            for (int j = 0; j < nv; j++) acc[c][j] = vfmaq_n_f32(acc[c][j], q[j], kc[c][x]);
    }
    for (int c = 0; c < nc; c++)
        for (int j = 0; j < nv; j++) vst1q_f32(st + c * ldst + 4 * j, acc[c][j]);
}
#undef QK_LANE

void fa_neon_qk_16x4(int64_t rows, int64_t cols, int64_t d, const float *qt, int64_t ldqt, const float *k,
                    int64_t ldk, float *st, int64_t ldst)
{
    /* whole vectors up to nr (the padding rows of qt are 0); the rest of the row
     * padding of st gets the zeros those rows would sum to, as the other tables give */
    const int64_t nr = round_up(rows, 4), padded = round_up(rows, FA_ROW_ALIGN);
    if (nr < padded)
        for (int64_t c = 0; c < cols; c++)
            for (int64_t r = nr; r < padded; r += 4) vst1q_f32(st + c * ldst + r, vdupq_n_f32(0.0f));
    int64_t r = 0;
    for (; r + 16 <= nr; r += 16) {
        int64_t c = 0;
        for (; c + 4 <= cols; c += 4) qk_tile(4, 4, d, qt + r, ldqt, k + c * ldk, ldk, st + c * ldst + r, ldst);
        for (; c < cols; c++) qk_tile(1, 4, d, qt + r, ldqt, k + c * ldk, ldk, st + c * ldst + r, ldst);
    }
    for (; r < nr; r += 4) {
        int64_t c = 0;
        for (; c + 4 <= cols; c += 4) qk_tile(4, 1, d, qt + r, ldqt, k + c * ldk, ldk, st + c * ldst + r, ldst);
        for (; c < cols; c++) qk_tile(1, 1, d, qt + r, ldqt, k + c * ldk, ldk, st + c * ldst + r, ldst);
    }
}

/* ------------------------------------------------------------------ softmax */

/*
 * The online-softmax step for nq (1 or 2) whole vectors of rows; m, l, alpha,
 * lo, hi hold 4*nq entries. Pass 1 takes the tile maximum over kept columns
 * (two partial maxima per vector for latency; max is exact in any order), pass 2
 * writes p and adds it to l in column order, as the reference does.
 */
NEON_BLOCK void softmax_quads(const int nq, int64_t cols, float *st, int64_t ldst, const int32_t *lo,
                                 const int32_t *hi, float *m, float *l, float *alpha)
{
    const float32x4_t ninf = vdupq_n_f32(-INFINITY), one = vdupq_n_f32(1.0f);
    float32x4_t mx[2], mx2[2], mnew[2], lv[2];
    int32x4_t vlo[2], vhi[2];
    uint32x4_t live[2];
    for (int q = 0; q < nq; q++) mx[q] = mx2[q] = ninf;

    if (!lo) {
        int64_t c = 0;
        for (; c + 2 <= cols; c += 2) {
            const float *s0 = st + c * ldst, *s1 = s0 + ldst;
            for (int q = 0; q < nq; q++) {
                mx[q] = vmaxq_f32(mx[q], vld1q_f32(s0 + 4 * q));
                mx2[q] = vmaxq_f32(mx2[q], vld1q_f32(s1 + 4 * q));
            }
        }
        if (c < cols)
            for (int q = 0; q < nq; q++) mx[q] = vmaxq_f32(mx[q], vld1q_f32(st + c * ldst + 4 * q));
    } else {
        for (int q = 0; q < nq; q++) {
            vlo[q] = vld1q_s32(lo + 4 * q);
            vhi[q] = vld1q_s32(hi + 4 * q);
        }
        int32x4_t cv = vdupq_n_s32(0);
        for (int64_t c = 0; c < cols; c++) {
            const float *sc = st + c * ldst;
            for (int q = 0; q < nq; q++) {
                const uint32x4_t keep = vandq_u32(vcgeq_s32(cv, vlo[q]), vcleq_s32(cv, vhi[q]));
                mx[q] = vmaxq_f32(mx[q], vbslq_f32(keep, vld1q_f32(sc + 4 * q), ninf));
            }
            cv = vaddq_s32(cv, vdupq_n_s32(1));
        }
    }

    for (int q = 0; q < nq; q++) {
        const float32x4_t mold = vld1q_f32(m + 4 * q);
        mnew[q] = vmaxq_f32(mold, vmaxq_f32(mx[q], mx2[q]));
        live[q] = vmvnq_u32(vceqq_f32(mnew[q], ninf)); /* something kept (NaN counts) */
        const float32x4_t a = vbslq_f32(live[q], exp_f32x4(vsubq_f32(mold, mnew[q])), one);
        vst1q_f32(alpha + 4 * q, a);
        vst1q_f32(m + 4 * q, mnew[q]);
        lv[q] = vmulq_f32(vld1q_f32(l + 4 * q), a);
    }

    if (!lo) {
        for (int64_t c = 0; c < cols; c++) {
            float *sc = st + c * ldst;
            for (int q = 0; q < nq; q++) {
                const float32x4_t e = exp_f32x4(vsubq_f32(vld1q_f32(sc + 4 * q), mnew[q]));
                const float32x4_t p = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(e), live[q]));
                lv[q] = vaddq_f32(lv[q], p);
                vst1q_f32(sc + 4 * q, p);
            }
        }
    } else {
        int32x4_t cv = vdupq_n_s32(0);
        for (int64_t c = 0; c < cols; c++) {
            float *sc = st + c * ldst;
            for (int q = 0; q < nq; q++) {
                const uint32x4_t keep =
                    vandq_u32(live[q], vandq_u32(vcgeq_s32(cv, vlo[q]), vcleq_s32(cv, vhi[q])));
                const float32x4_t e = exp_f32x4(vsubq_f32(vld1q_f32(sc + 4 * q), mnew[q]));
                const float32x4_t p = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(e), keep));
                lv[q] = vaddq_f32(lv[q], p);
                vst1q_f32(sc + 4 * q, p);
            }
            cv = vaddq_s32(cv, vdupq_n_s32(1));
        }
    }
    for (int q = 0; q < nq; q++) vst1q_f32(l + 4 * q, lv[q]);
}

void fa_neon_softmax(int64_t rows, int64_t cols, float *st, int64_t ldst, const int32_t *lo,
                         const int32_t *hi, float *m, float *l, float *alpha)
{
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8)
        softmax_quads(2, cols, st + r, ldst, lo ? lo + r : NULL, lo ? hi + r : NULL, m + r, l + r, alpha + r);
    for (; r + 4 <= rows; r += 4)
        softmax_quads(1, cols, st + r, ldst, lo ? lo + r : NULL, lo ? hi + r : NULL, m + r, l + r, alpha + r);
    if (r == rows) return;
    /* 1-3 rows left: st has padding rows that make a whole vector, the per-row
     * arrays need not; stage them. The spare lanes start with nothing kept
     * (m = -inf, empty band) and are dropped; their st entries are padding. */
    const int64_t n = rows - r;
    float m4[4], l4[4], a4[4];
    int32_t lo4[4], hi4[4];
    for (int64_t i = 0; i < 4; i++) {
        m4[i] = i < n ? m[r + i] : -INFINITY;
        l4[i] = i < n ? l[r + i] : 0.0f;
        lo4[i] = i < n && lo ? lo[r + i] : 1;
        hi4[i] = i < n && lo ? hi[r + i] : 0;
    }
    softmax_quads(1, cols, st + r, ldst, lo ? lo4 : NULL, lo ? hi4 : NULL, m4, l4, a4);
    for (int64_t i = 0; i < n; i++) {
        m[r + i] = m4[i];
        l[r + i] = l4[i];
        alpha[r + i] = a4[i];
    }
}

/* ------------------------------------------------------------------ pv */

/*
 * acc rows for nq (1 or 3) vectors of rows and nv (1, 2 or 4) vectors of
 * output columns: acc = a * acc + sum_c p[c][r] v[c][e], p broadcast by lane.
 */
NEON_BLOCK void pv_tile(const int nq, const int nv, int64_t cols, const float *st, int64_t ldst,
                           const float *v, int64_t ldv, const float *a, float *acc, int64_t ldacc)
{
    float32x4_t t[12][4];
    for (int i = 0; i < 4 * nq; i++)
        for (int j = 0; j < nv; j++) t[i][j] = vmulq_n_f32(vld1q_f32(acc + i * ldacc + 4 * j), a[i]);
    for (int64_t c = 0; c < cols; c++) {
        const float *sc = st + c * ldst, *vc = v + c * ldv;
        float32x4_t w[4];
        for (int j = 0; j < nv; j++) w[j] = vld1q_f32(vc + 4 * j);
        for (int q = 0; q < nq; q++) {
            const float32x4_t p = vld1q_f32(sc + 4 * q);
            for (int j = 0; j < nv; j++) {
                t[4 * q + 0][j] = vfmaq_laneq_f32(t[4 * q + 0][j], w[j], p, 0);
                t[4 * q + 1][j] = vfmaq_laneq_f32(t[4 * q + 1][j], w[j], p, 1);
                t[4 * q + 2][j] = vfmaq_laneq_f32(t[4 * q + 2][j], w[j], p, 2);
                t[4 * q + 3][j] = vfmaq_laneq_f32(t[4 * q + 3][j], w[j], p, 3);
            }
        }
    }
    for (int i = 0; i < 4 * nq; i++)
        for (int j = 0; j < nv; j++) vst1q_f32(acc + i * ldacc + 4 * j, t[i][j]);
}

/* One output column e for nq vectors of rows: vectors along r, v[c][e] broadcast. */
NEON_BLOCK void pv_column(const int nq, int64_t cols, const float *st, int64_t ldst, const float *v,
                             int64_t ldv, const float *a, float *acc, int64_t ldacc)
{
    float32x4_t t[3];
    for (int q = 0; q < nq; q++) {
        float col[4];
        for (int i = 0; i < 4; i++) col[i] = acc[(4 * q + i) * ldacc] * a[4 * q + i];
        t[q] = vld1q_f32(col);
    }
    for (int64_t c = 0; c < cols; c++) {
        const float w = v[c * ldv];
        for (int q = 0; q < nq; q++) t[q] = vfmaq_n_f32(t[q], vld1q_f32(st + c * ldst + 4 * q), w);
    }
    for (int q = 0; q < nq; q++) {
        float col[4];
        vst1q_f32(col, t[q]);
        for (int i = 0; i < 4; i++) acc[(4 * q + i) * ldacc] = col[i];
    }
}

NEON_BLOCK void pv_quads(const int nq, int64_t cols, int64_t dv, const float *st, int64_t ldst,
                            const float *v, int64_t ldv, const float *alpha, float *acc, int64_t ldacc)
{
    float a[12];
    for (int i = 0; i < 4 * nq; i++) a[i] = alpha ? alpha[i] : 1.0f;
    const int wide = nq == 1 ? 4 : 2; /* 16 or 24 accumulators */
    int64_t e = 0;
    for (; e + 4 * wide <= dv; e += 4 * wide) {
        if (wide == 4) pv_tile(nq, 4, cols, st, ldst, v + e, ldv, a, acc + e, ldacc);
        else pv_tile(nq, 2, cols, st, ldst, v + e, ldv, a, acc + e, ldacc);
    }
    for (; e + 4 <= dv; e += 4) pv_tile(nq, 1, cols, st, ldst, v + e, ldv, a, acc + e, ldacc);
    for (; e < dv; e++) pv_column(nq, cols, st, ldst, v + e, ldv, a, acc + e, ldacc);
}

/* A single row (the last 1-3 rows of a block): p broadcast from a scalar. */
static void pv_row(int64_t cols, int64_t dv, const float *st, int64_t ldst, const float *v, int64_t ldv,
                   float a, float *acc)
{
    int64_t e = 0;
    for (; e + 16 <= dv; e += 16) {
        float32x4_t t[4];
        for (int j = 0; j < 4; j++) t[j] = vmulq_n_f32(vld1q_f32(acc + e + 4 * j), a);
        for (int64_t c = 0; c < cols; c++) {
            const float w = st[c * ldst];
            const float *vc = v + c * ldv + e;
            for (int j = 0; j < 4; j++) t[j] = vfmaq_n_f32(t[j], vld1q_f32(vc + 4 * j), w);
        }
        for (int j = 0; j < 4; j++) vst1q_f32(acc + e + 4 * j, t[j]);
    }
    for (; e + 4 <= dv; e += 4) {
        float32x4_t t = vmulq_n_f32(vld1q_f32(acc + e), a);
        for (int64_t c = 0; c < cols; c++) t = vfmaq_n_f32(t, vld1q_f32(v + c * ldv + e), st[c * ldst]);
        vst1q_f32(acc + e, t);
    }
    for (; e < dv; e++) {
        float t = acc[e] * a;
        for (int64_t c = 0; c < cols; c++) t = fmaf(st[c * ldst], v[c * ldv + e], t);
        acc[e] = t;
    }
}

void fa_neon_pv_12x8(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const float *v,
                    int64_t ldv, const float *alpha, float *acc, int64_t ldacc)
{
    int64_t r = 0;
    for (; r + 12 <= rows; r += 12)
        pv_quads(3, cols, dv, st + r, ldst, v, ldv, alpha ? alpha + r : NULL, acc + r * ldacc, ldacc);
    for (; r + 4 <= rows; r += 4)
        pv_quads(1, cols, dv, st + r, ldst, v, ldv, alpha ? alpha + r : NULL, acc + r * ldacc, ldacc);
    for (; r < rows; r++) pv_row(cols, dv, st + r, ldst, v, ldv, alpha ? alpha[r] : 1.0f, acc + r * ldacc);
}

/* ------------------------------------------------------------------ backward */

/*
 * ds: p * (dp - dvec), 16 rows (4 vectors of dvec) held over every column;
 * round_up(rows, 16) is a whole number of such strips. A masked p = 0 gives 0
 * whatever dp is: the product's bits are cleared where p == 0 (a NaN p compares
 * unequal, so it stays in the product, NaN).
 */
void fa_neon_ds(int64_t rows, int64_t cols, const float *st, int64_t ldst, float *dp, int64_t lddp,
                const float *dvec)
{
    const int64_t rp = round_up(rows, FA_ROW_ALIGN);
    const float32x4_t zero = vdupq_n_f32(0.0f);
    for (int64_t r = 0; r < rp; r += 16) {
        float32x4_t dv[4];
        for (int i = 0; i < 4; i++) dv[i] = vld1q_f32(dvec + r + 4 * i);
        for (int64_t c = 0; c < cols; c++) {
            const float *pc = st + c * ldst + r;
            float *dc = dp + c * lddp + r;
            for (int i = 0; i < 4; i++) {
                const float32x4_t p = vld1q_f32(pc + 4 * i);
                const float32x4_t prod = vmulq_f32(p, vsubq_f32(vld1q_f32(dc + 4 * i), dv[i]));
                const uint32x4_t masked = vceqq_f32(p, zero);
                vst1q_f32(dc + 4 * i, vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(prod), masked)));
            }
        }
    }
}

/*
 * stx: acc[c][e] += sum_r st[c][r] x[r][e]. Block: nc (8, 4 or 1) acc rows c x nv
 * (2 or 1) vectors of e; st is read as vectors along r (4 rows of one column c)
 * and broadcast by lane, each x row read as vectors along e once for all nc:
 * 8 x 8 keeps 16 accumulators, 8 st vectors and 2 x vectors in registers. The
 * last rows % 4 rows broadcast st from scalars.
 */
NEON_BLOCK void stx_tile(const int nc, const int nv, int64_t rows, const float *st, int64_t ldst, const float *x,
                         int64_t ldx, float *acc, int64_t ldacc)
{
    float32x4_t t[8][2];
    for (int j = 0; j < nc; j++)
        for (int i = 0; i < nv; i++) t[j][i] = vld1q_f32(acc + j * ldacc + 4 * i);
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        float32x4_t s[8];
        for (int j = 0; j < nc; j++) s[j] = vld1q_f32(st + j * ldst + r);
        float32x4_t w[2];
        for (int i = 0; i < nv; i++) w[i] = vld1q_f32(x + r * ldx + 4 * i);
        for (int j = 0; j < nc; j++)
            for (int i = 0; i < nv; i++) t[j][i] = vfmaq_laneq_f32(t[j][i], w[i], s[j], 0);
        for (int i = 0; i < nv; i++) w[i] = vld1q_f32(x + (r + 1) * ldx + 4 * i);
        for (int j = 0; j < nc; j++)
            for (int i = 0; i < nv; i++) t[j][i] = vfmaq_laneq_f32(t[j][i], w[i], s[j], 1);
        for (int i = 0; i < nv; i++) w[i] = vld1q_f32(x + (r + 2) * ldx + 4 * i);
        for (int j = 0; j < nc; j++)
            for (int i = 0; i < nv; i++) t[j][i] = vfmaq_laneq_f32(t[j][i], w[i], s[j], 2);
        for (int i = 0; i < nv; i++) w[i] = vld1q_f32(x + (r + 3) * ldx + 4 * i);
        for (int j = 0; j < nc; j++)
            for (int i = 0; i < nv; i++) t[j][i] = vfmaq_laneq_f32(t[j][i], w[i], s[j], 3);
    }
    for (; r < rows; r++) {
        float32x4_t w[2];
        for (int i = 0; i < nv; i++) w[i] = vld1q_f32(x + r * ldx + 4 * i);
        for (int j = 0; j < nc; j++)
            for (int i = 0; i < nv; i++) t[j][i] = vfmaq_n_f32(t[j][i], w[i], st[j * ldst + r]);
    }
    for (int j = 0; j < nc; j++)
        for (int i = 0; i < nv; i++) vst1q_f32(acc + j * ldacc + 4 * i, t[j][i]);
}

/* nc acc rows over every e: 8-wide blocks, a 4-wide one, then scalar columns. */
NEON_BLOCK void stx_rows(const int nc, int64_t rows, int64_t n, const float *st, int64_t ldst, const float *x,
                         int64_t ldx, float *acc, int64_t ldacc)
{
    int64_t e = 0;
    for (; e + 8 <= n; e += 8) stx_tile(nc, 2, rows, st, ldst, x + e, ldx, acc + e, ldacc);
    for (; e + 4 <= n; e += 4) stx_tile(nc, 1, rows, st, ldst, x + e, ldx, acc + e, ldacc);
    for (; e < n; e++)
        for (int j = 0; j < nc; j++) {
            float t = acc[j * ldacc + e];
            for (int64_t r = 0; r < rows; r++) t = fmaf(st[j * ldst + r], x[r * ldx + e], t);
            acc[j * ldacc + e] = t;
        }
}

void fa_neon_stx_8x8(int64_t rows, int64_t cols, int64_t n, const float *st, int64_t ldst, const float *x,
                     int64_t ldx, float *acc, int64_t ldacc)
{
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) stx_rows(8, rows, n, st + c * ldst, ldst, x, ldx, acc + c * ldacc, ldacc);
    for (; c + 4 <= cols; c += 4) stx_rows(4, rows, n, st + c * ldst, ldst, x, ldx, acc + c * ldacc, ldacc);
    for (; c < cols; c++) stx_rows(1, rows, n, st + c * ldst, ldst, x, ldx, acc + c * ldacc, ldacc);
}

/* ------------------------------------------------------------------ conversions */

void fa_neon_f16_to_f32(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(src + i));
        vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(h)));
        vst1q_f32(dst + i + 4, vcvt_high_f32_f16(h));
    }
    for (; i < n; i += 4) { /* tail through a zero-padded vector: same conversion, no overread */
        uint16_t h[4] = {0, 0, 0, 0};
        float f[4];
        const int64_t k = n - i < 4 ? n - i : 4;
        for (int64_t j = 0; j < k; j++) h[j] = src[i + j];
        vst1q_f32(f, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h))));
        for (int64_t j = 0; j < k; j++) dst[i + j] = f[j];
    }
}

void fa_neon_bf16_to_f32(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint16x8_t h = vld1q_u16(src + i);
        vst1q_f32(dst + i, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)));
        vst1q_f32(dst + i + 4, vreinterpretq_f32_u32(vshll_high_n_u16(h, 16)));
    }
    for (; i < n; i++) {
        const uint32_t bits = (uint32_t)src[i] << 16;
        memcpy(dst + i, &bits, sizeof bits);
    }
}

/* ------------------------------------------------------------------ small-row (decode) */

/*
 * Decoding: at most 8 query rows, scores row-major s[r][c], K/V rows of type kv
 * reached through pointers (kernels.h). K/V elements are widened to f32 in
 * registers as they are loaded (f16: FCVTL, bf16: a 16-bit shift, int8: SXTL
 * twice and SCVTF), 8 at a time, each once per register block and used by every
 * query row of the block; nothing converted goes back to memory. Blocks:
 *   qk_small  g rows x nc key columns of partial dot products along d (g = 1..4:
 *             nc = 8, 8, 4, 4; 8 to 16 accumulators), reduced by pairwise adds
 *             into one vector of column sums per row; 5..8 rows run as two row
 *             groups over the same 8 key columns, whose K rows are then in L1;
 *   softmax_small  one row at a time, vectors along c;
 *   pv_small  all rows x nv vectors along e (nv = 8, 8, 4, 4, 2, 2, 2, 2; 8 to 16
 *             accumulators), p transposed per chunk of 64 columns into pt[c][r]
 *             (times the V row scale for i8, fp8) and broadcast by lane.
 * K/V rows are prefetched SMALL_PF columns ahead as in the AVX2 table (not tuned
 * here: no aarch64 hardware to time on).
 * Tails: the last d % 8 (dv % 8) elements are done as the row's last 8, the
 * ones done before zeroed (in q and K; in V, with alpha 1); rows shorter than 8
 * go through kv_load8_part. A last, partial tile of key columns repeats the
 * last K row and stores only the columns below cols.
 */

#if defined(__GNUC__)
#define NEON_PREFETCH(p) __builtin_prefetch((p), 0, 3)
#else
#define NEON_PREFETCH(p) ((void)(p))
#endif

enum {
    SMALL_PF = 32, /* K/V rows are prefetched this many columns ahead */
    PVS_CC = 64    /* key columns per pv_small chunk */
};

/* 8 fp8 codes as binary16 bits: E5M2 is the binary16's top byte; E4M3 gives value /
 * 256 (half.h's fa_e4m3_to_f16_bits): t = the sign-extended byte << 7 puts the sign
 * in bits 15 and 14 and exponent and mantissa in binary16's fields (subnormals
 * included); bit 14 must become "NaN code" (all of 0x3f80 set, then exponent 31).
 * t + 0x80 carries into bit 14 exactly for the NaN codes, so bit 14 of
 * t ^ (t + 0x80) is that flag: t ^ ((t + 0x80) & 0x4000). */
NEON_BLOCK uint16x8_t fp8x8_to_f16(const int kv, const uint8_t *p)
{
    if (kv == FA_KV_F8E5M2) return vshll_n_u8(vld1_u8(p), 8);
    const uint16x8_t t = vreinterpretq_u16_s16(vshlq_n_s16(vmovl_s8(vld1_s8((const int8_t *)p)), 7));
    return veorq_u16(t, vandq_u16(vaddq_u16(t, vdupq_n_u16(0x80)), vdupq_n_u16(0x4000)));
}

/* 8 consecutive elements of a K/V row from x on, as floats (unscaled: the int8
 * code; fp8 as its value / fa_kv_load_unit). */
NEON_BLOCK float32x4x2_t kv_load8(const int kv, const void *row, int64_t x)
{
    float32x4x2_t r;
    if (kv == FA_KV_F16 || kv == FA_KV_F8E4M3 || kv == FA_KV_F8E5M2) {
        const float16x8_t h = vreinterpretq_f16_u16(kv == FA_KV_F16 ? vld1q_u16((const uint16_t *)row + x)
                                                                    : fp8x8_to_f16(kv, (const uint8_t *)row + x));
        r.val[0] = vcvt_f32_f16(vget_low_f16(h));
        r.val[1] = vcvt_high_f32_f16(h);
    } else if (kv == FA_KV_BF16) {
        const uint16x8_t h = vld1q_u16((const uint16_t *)row + x);
        r.val[0] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
        r.val[1] = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
    } else if (kv == FA_KV_I8) {
        const int16x8_t w = vmovl_s8(vld1_s8((const int8_t *)row + x));
        r.val[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w)));
        r.val[1] = vcvtq_f32_s32(vmovl_high_s16(w));
    } else {
        r.val[0] = vld1q_f32((const float *)row + x);
        r.val[1] = vld1q_f32((const float *)row + x + 4);
    }
    return r;
}

static int64_t kv_size(int kv) { return fa_kv_elem_bytes(kv); }

/* The n (1..7) elements from x on, zero in the other lanes; reads nothing past them. */
NEON_BLOCK float32x4x2_t kv_load8_part(const int kv, const void *row, int64_t x, int64_t n)
{
    float tmp[8] = {0}; /* 32 bytes: room for 8 elements of any type */
    const int64_t es = kv_size(kv);
    memcpy(tmp, (const char *)row + x * es, (size_t)(n * es));
    return kv_load8(kv, tmp, 0);
}

/* Ask for the cache lines of K/V rows c0 .. c1-1 (`bytes` each). */
NEON_BLOCK void prefetch_rows(const void *const *row, int64_t c0, int64_t c1, int64_t bytes)
{
    for (int64_t c = c0; c < c1; c++) {
        const char *p = (const char *)row[c];
        for (int64_t b = 0; b < bytes; b += 64) NEON_PREFETCH(p + b);
        NEON_PREFETCH(p + bytes - 1);
    }
}

/*
 * s[i][j] = sum_x q[i][x] * k_j[x] (times ks[j] for the scaled types) for i < nr, j < nc,
 * stored for j < nst (the tile's columns below cols). The d % 8 values past the
 * last 8 are done as one more step: K's last 8 elements times qtail, q's last 8,
 * with the ones already done zeroed in both (for d < 8: q and K zero-padded).
 */
NEON_BLOCK void qks_tile(const int kv, const int nr, const int nc, int64_t nst, int64_t d, const float *q,
                         int64_t ldq, const float *qtail, const void *const *kp, const float *ks, float *s,
                         int64_t lds)
{
    float32x4_t acc[4][8];
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nc; j++) acc[i][j] = vdupq_n_f32(0.0f);
    const int64_t d8 = d & ~(int64_t)7;
    for (int64_t x = 0; x < d8; x += 8) {
        float32x4_t q0[4], q1[4];
        for (int i = 0; i < nr; i++) {
            q0[i] = vld1q_f32(q + i * ldq + x);
            q1[i] = vld1q_f32(q + i * ldq + x + 4);
        }
        for (int j = 0; j < nc; j++) {
            const float32x4x2_t k = kv_load8(kv, kp[j], x);
            for (int i = 0; i < nr; i++) {
                acc[i][j] = vfmaq_f32(acc[i][j], q0[i], k.val[0]);
                acc[i][j] = vfmaq_f32(acc[i][j], q1[i], k.val[1]);
            }
        }
    }
    if (d8 < d) {
        float32x4x2_t kt[8];
        /* the lanes done already are zero in qtail and in K (an infinite K times 0 would be NaN) */
        const int32_t i4[4] = {0, 1, 2, 3};
        const int32x4_t lane = vld1q_s32(i4), first = vdupq_n_s32(8 - (int32_t)(d - d8));
        const uint32x4_t keep0 = vcgeq_s32(lane, first), keep1 = vcgeq_s32(vaddq_s32(lane, vdupq_n_s32(4)), first);
        for (int j = 0; j < nc; j++) {
            if (d >= 8) {
                kt[j] = kv_load8(kv, kp[j], d - 8);
                kt[j].val[0] = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(kt[j].val[0]), keep0));
                kt[j].val[1] = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(kt[j].val[1]), keep1));
            } else {
                kt[j] = kv_load8_part(kv, kp[j], 0, d);
            }
        }
        for (int i = 0; i < nr; i++) {
            const float32x4_t q0 = vld1q_f32(qtail + 8 * i), q1 = vld1q_f32(qtail + 8 * i + 4);
            for (int j = 0; j < nc; j++) {
                acc[i][j] = vfmaq_f32(acc[i][j], q0, kt[j].val[0]);
                acc[i][j] = vfmaq_f32(acc[i][j], q1, kt[j].val[1]);
            }
        }
    }
    for (int i = 0; i < nr; i++) {
        float *si = s + i * lds;
        for (int j0 = 0; j0 < nc; j0 += 4) {
            float32x4_t h = vpaddq_f32(vpaddq_f32(acc[i][j0], acc[i][j0 + 1]), vpaddq_f32(acc[i][j0 + 2], acc[i][j0 + 3]));
            if (fa_kv_scaled(kv)) h = vmulq_f32(h, vld1q_f32(ks + j0));
            const int64_t n = nst - j0; /* columns of these 4 below cols */
            if (n >= 4) {
                vst1q_f32(si + j0, h);
            } else {
                if (n >= 1) vst1q_lane_f32(si + j0, h, 0);
                if (n >= 2) vst1q_lane_f32(si + j0 + 1, h, 1);
                if (n >= 3) vst1q_lane_f32(si + j0 + 2, h, 2);
            }
        }
    }
}

/* Rows r0 .. r0+g of one block of 8 key columns, `valid` of them < cols; the
 * first row group prefetches the rows SMALL_PF columns on (npf of them exist). */
NEON_BLOCK void qks_group(const int kv, const int g, int64_t valid, int64_t d, const float *q, int64_t ldq,
                          const float *qtail, const void *const *kp, const float *ks, float *s, int64_t lds,
                          const void *const *pf, int64_t npf, int64_t bytes)
{
    const int nc = g <= 2 ? 8 : 4;
    for (int j = 0; j < 8 && j < valid; j += nc) {
        prefetch_rows(pf, j < npf ? j : npf, j + nc < npf ? j + nc : npf, bytes);
        qks_tile(kv, g, nc, valid - j < nc ? valid - j : nc, d, q, ldq, qtail, kp + j, ks + j, s + j, lds);
    }
}

NEON_BLOCK void qk_small_kv(const int kv, int64_t rows, int64_t cols, int64_t d, const float *q, int64_t ldq,
                            const void *const *krow, const float *kscale, float *s, int64_t lds)
{
    float qtail[FA_SMALL_ROWS * 8];
    const int64_t d8 = d & ~(int64_t)7;
    const int64_t t0 = d >= 8 ? d - 8 : 0; /* qtail[r][x] is q[r][t0 + x] where t0 + x >= d8 */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t x = 0; x < 8; x++) qtail[8 * r + x] = t0 + x >= d8 && t0 + x < d ? q[r * ldq + t0 + x] : 0.0f;
    /* two row groups beyond 4 rows: 3+2, 3+3, 4+3, 4+4 */
    const int g0 = rows <= 4 ? (int)rows : (int)(rows + 1) / 2, g1 = (int)rows - g0;
    const int64_t bytes = d * kv_size(kv);
    for (int64_t c0 = 0; c0 < cols; c0 += 8) {
        const int64_t valid = cols - c0 < 8 ? cols - c0 : 8;
        const void *kp[8];
        float ks[8];
        for (int64_t j = 0; j < 8; j++) {
            const int64_t c = c0 + (j < valid ? j : valid - 1);
            kp[j] = krow[c];
            ks[j] = fa_kv_scaled(kv) && j < valid ? kscale[c] * fa_kv_load_unit(kv) : 0.0f; /* unit: exact */
        }
        const int64_t pf0 = c0 + SMALL_PF, npf0 = cols - pf0 < 0 ? 0 : cols - pf0 < 8 ? cols - pf0 : 8;
        for (int part = 0; part < 2; part++) {
            const int g = part ? g1 : g0;
            const int64_t r0 = part ? g0 : 0, npf = part ? 0 : npf0;
            const float *qr = q + r0 * ldq, *qt = qtail + 8 * r0;
            float *sr = s + r0 * lds + c0;
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

void fa_neon_qk_small(int64_t rows, int64_t cols, int64_t d, const float *q, int64_t ldq,
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

/*
 * softmax's rules on s[r][c]: pass 1 takes each row's maximum over its band
 * [a, z] (lanes outside it set to -inf; FMAX and FMAXV propagate NaN, as the
 * reference's `|| isnan` does), then m, alpha and l for all rows in two
 * vectors, as fa_neon_softmax does; pass 2 writes p (zero outside the band, in s's
 * padding too) and sums it.
 */
void fa_neon_softmax_small(int64_t rows, int64_t cols, float *s, int64_t lds, const int32_t *lo,
                               const int32_t *hi, float *m, float *l, float *alpha)
{
    const float32x4_t ninf = vdupq_n_f32(-INFINITY), zero = vdupq_n_f32(0.0f);
    const int32_t idx4[4] = {0, 1, 2, 3};
    const int32x4_t idx = vld1q_s32(idx4);
    float tmax[8], mold[8], lold[8], mnew[8], lsc[8], al[8];
    int64_t band[FA_SMALL_ROWS][2];
    for (int64_t r = 0; r < 8; r++) {
        tmax[r] = -INFINITY;
        mold[r] = r < rows ? m[r] : -INFINITY;
        lold[r] = r < rows ? l[r] : 0.0f;
    }
    for (int64_t r = 0; r < rows; r++) {
        const float *sr = s + r * lds;
        const int64_t a = lo && lo[r] > 0 ? lo[r] : 0, z = hi && hi[r] < cols - 1 ? hi[r] : cols - 1;
        band[r][0] = a;
        band[r][1] = z;
        if (a > z) continue;
        const int32x4_t va = vdupq_n_s32((int32_t)a), vz = vdupq_n_s32((int32_t)z);
        float32x4_t mx = ninf, mx2 = ninf;
        int64_t c0 = a & ~(int64_t)3;
        if (c0 < a || c0 + 3 > z) { /* the first vector, partly outside the band */
            const int32x4_t c = vaddq_s32(vdupq_n_s32((int32_t)c0), idx);
            const uint32x4_t keep = vandq_u32(vcgeq_s32(c, va), vcleq_s32(c, vz));
            mx = vbslq_f32(keep, vld1q_f32(sr + c0), ninf);
            c0 += 4;
        }
        for (; c0 + 8 <= z + 1; c0 += 8) {
            mx = vmaxq_f32(mx, vld1q_f32(sr + c0));
            mx2 = vmaxq_f32(mx2, vld1q_f32(sr + c0 + 4));
        }
        for (; c0 <= z; c0 += 4) {
            const int32x4_t c = vaddq_s32(vdupq_n_s32((int32_t)c0), idx);
            mx = vmaxq_f32(mx, vbslq_f32(vcleq_s32(c, vz), vld1q_f32(sr + c0), ninf));
        }
        tmax[r] = vmaxvq_f32(vmaxq_f32(mx, mx2));
    }

    /* m_new, alpha and l * alpha for all rows, two vectors */
    for (int h = 0; h < 8; h += 4) {
        const float32x4_t mo = vld1q_f32(mold + h);
        const float32x4_t mn = vmaxq_f32(mo, vld1q_f32(tmax + h)); /* NaN if either is */
        const uint32x4_t live = vmvnq_u32(vceqq_f32(mn, ninf));
        const float32x4_t a = vbslq_f32(live, exp_f32x4(vsubq_f32(mo, mn)), vdupq_n_f32(1.0f));
        vst1q_f32(mnew + h, mn);
        vst1q_f32(al + h, a);
        vst1q_f32(lsc + h, vmulq_f32(vld1q_f32(lold + h), a));
    }

    for (int64_t r = 0; r < rows; r++) {
        float *sr = s + r * lds;
        const int64_t a = band[r][0], z = band[r][1];
        m[r] = mnew[r];
        alpha[r] = al[r];
        if (mnew[r] == -INFINITY || a > z) { /* nothing kept */
            for (int64_t c0 = 0; c0 < cols; c0 += 4) vst1q_f32(sr + c0, zero);
            l[r] = lsc[r];
            continue;
        }
        const float32x4_t mv = vdupq_n_f32(mnew[r]);
        const int32x4_t va = vdupq_n_s32((int32_t)a), vz = vdupq_n_s32((int32_t)z);
        float32x4_t sum = zero, sum2 = zero;
        int64_t c0 = 0;
        for (; c0 + 3 < a; c0 += 4) vst1q_f32(sr + c0, zero);
        if (c0 < a || c0 + 3 > z) { /* the first vector, partly outside the band */
            const int32x4_t c = vaddq_s32(vdupq_n_s32((int32_t)c0), idx);
            const uint32x4_t keep = vandq_u32(vcgeq_s32(c, va), vcleq_s32(c, vz));
            const float32x4_t e = exp_f32x4(vsubq_f32(vld1q_f32(sr + c0), mv));
            const float32x4_t p = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(e), keep));
            sum = vaddq_f32(sum, p);
            vst1q_f32(sr + c0, p);
            c0 += 4;
        }
        for (; c0 + 8 <= z + 1; c0 += 8) {
            const float32x4_t p0 = exp_f32x4(vsubq_f32(vld1q_f32(sr + c0), mv));
            const float32x4_t p1 = exp_f32x4(vsubq_f32(vld1q_f32(sr + c0 + 4), mv));
            sum = vaddq_f32(sum, p0);
            sum2 = vaddq_f32(sum2, p1);
            vst1q_f32(sr + c0, p0);
            vst1q_f32(sr + c0 + 4, p1);
        }
        for (; c0 <= z; c0 += 4) {
            const int32x4_t c = vaddq_s32(vdupq_n_s32((int32_t)c0), idx);
            const float32x4_t e = exp_f32x4(vsubq_f32(vld1q_f32(sr + c0), mv));
            const float32x4_t p = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(e), vcleq_s32(c, vz)));
            sum = vaddq_f32(sum, p);
            vst1q_f32(sr + c0, p);
        }
        for (; c0 < cols; c0 += 4) vst1q_f32(sr + c0, zero);
        l[r] = lsc[r] + vaddvq_f32(vaddq_f32(sum, sum2));
    }
}

/* The p broadcast for row I of a pv_small tile: lane I % 4 of pq[I / 4]. */
#define PVS_ROW(I)                                                                            \
    do {                                                                                      \
        if (nr > (I))                                                                         \
            for (int j = 0; j < nv; j++) a[I][j] = vfmaq_laneq_f32(a[I][j], vv[j], pq[(I) / 4], (I) % 4); \
    } while (0)

/*
 * acc[i][e0 .. e0+4nv) = (alpha ? alpha[i] : 1) * acc + sum_c pt[c][i] v_c[..] for
 * i < nr (nv even). part 0: whole vectors. part 1 (dv >= 8, nv = 2): the last
 * npart elements of the row, as the 8 from e0 = dv - 8 with the first 8 - npart
 * (already done) left alone: V masked to 0 there, alpha 1. part 2 (dv < 8, nv =
 * 2): the whole row, zero-padded; the rest of the 8 is acc's padding.
 */
NEON_BLOCK void pvs_tile(const int kv, const int nr, const int nv, const int part, int64_t npart, int64_t nc,
                         const float *pt, const void *const *vrow, int64_t e0, const float *alpha, float *acc,
                         int64_t ldacc, int64_t npf)
{
    const int64_t es = kv_size(kv);
    const int64_t pfoff = e0 * es, pfend = pfoff + (part == 2 ? npart : 4 * nv) * es - 1;
    uint32x4_t keep[2];
    if (part == 1) {
        const int32_t i4[4] = {0, 1, 2, 3};
        const int32x4_t lane = vld1q_s32(i4), first = vdupq_n_s32(8 - (int32_t)npart);
        keep[0] = vcgeq_s32(lane, first);
        keep[1] = vcgeq_s32(vaddq_s32(lane, vdupq_n_s32(4)), first);
    }
    float32x4_t a[FA_SMALL_ROWS][8];
    for (int i = 0; i < nr; i++) {
        const float32x4_t al = vdupq_n_f32(alpha ? alpha[i] : 1.0f);
        for (int j = 0; j < nv; j++) {
            const float32x4_t aj = part == 1 ? vbslq_f32(keep[j], al, vdupq_n_f32(1.0f)) : al;
            a[i][j] = vmulq_f32(vld1q_f32(acc + i * ldacc + e0 + 4 * j), aj);
        }
    }
    for (int64_t c = 0; c < nc; c++) {
        const void *vc = vrow[c];
        if (c < npf) { /* the same e range of the row SMALL_PF columns on */
            NEON_PREFETCH((const char *)vrow[c + SMALL_PF] + pfoff);
            NEON_PREFETCH((const char *)vrow[c + SMALL_PF] + pfend);
        }
        float32x4_t vv[8], pq[2];
        for (int j = 0; j < nv; j += 2) {
            const float32x4x2_t w = part == 2 ? kv_load8_part(kv, vc, 0, npart) : kv_load8(kv, vc, e0 + 4 * j);
            vv[j] = w.val[0];
            vv[j + 1] = w.val[1];
            if (part == 1) {
                vv[j] = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(vv[j]), keep[0]));
                vv[j + 1] = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(vv[j + 1]), keep[1]));
            }
        }
        pq[0] = vld1q_f32(pt + 8 * c);
        if (nr > 4) pq[1] = vld1q_f32(pt + 8 * c + 4);
        PVS_ROW(0);
        PVS_ROW(1);
        PVS_ROW(2);
        PVS_ROW(3);
        PVS_ROW(4);
        PVS_ROW(5);
        PVS_ROW(6);
        PVS_ROW(7);
    }
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nv; j++) vst1q_f32(acc + i * ldacc + e0 + 4 * j, a[i][j]);
}
#undef PVS_ROW

NEON_BLOCK void pv_small_rows(const int kv, const int nr, int64_t cols, int64_t dv, const float *s, int64_t lds,
                              const void *const *vrow, const float *vscale, const float *alpha, float *acc,
                              int64_t ldacc)
{
    const int nv = nr <= 2 ? 8 : nr <= 4 ? 4 : 2; /* 8 to 16 accumulators */
    float pt[PVS_CC * 8];                          /* (PVS_CC, 8): p transposed, rows along lanes */
    for (int64_t c0 = 0; c0 < cols; c0 += PVS_CC) {
        const int64_t nc = cols - c0 < PVS_CC ? cols - c0 : PVS_CC;
        for (int64_t c = 0; c < nc; c++) {
            const float vs = fa_kv_scaled(kv) ? vscale[c0 + c] * fa_kv_load_unit(kv) : 1.0f; /* unit: exact */
            for (int i = 0; i < 8; i++) pt[8 * c + i] = i < nr ? s[i * lds + c0 + c] * vs : 0.0f;
        }
        const float *al = c0 == 0 ? alpha : NULL;
        const void *const *vc = vrow + c0;
        const int64_t npf = cols - c0 - SMALL_PF < 0 ? 0 : cols - c0 - SMALL_PF; /* columns with a row SMALL_PF ahead */
        int64_t e = 0;
        for (; e + 4 * nv <= dv; e += 4 * nv) {
            switch (nv) { /* nv is a constant here; the switch only makes it visible as one */
            case 2: pvs_tile(kv, nr, 2, 0, 0, nc, pt, vc, e, al, acc, ldacc, npf); break;
            case 4: pvs_tile(kv, nr, 4, 0, 0, nc, pt, vc, e, al, acc, ldacc, npf); break;
            default: pvs_tile(kv, nr, 8, 0, 0, nc, pt, vc, e, al, acc, ldacc, npf); break;
            }
        }
        if (nv > 2)
            for (; e + 8 <= dv; e += 8) pvs_tile(kv, nr, 2, 0, 0, nc, pt, vc, e, al, acc, ldacc, npf);
        if (e < dv && dv >= 8) pvs_tile(kv, nr, 2, 1, dv - e, nc, pt, vc, dv - 8, al, acc, ldacc, npf);
        else if (e < dv) pvs_tile(kv, nr, 2, 2, dv, nc, pt, vc, 0, al, acc, ldacc, npf);
    }
}

NEON_BLOCK void pv_small_kv(const int kv, int64_t rows, int64_t cols, int64_t dv, const float *s, int64_t lds,
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

void fa_neon_pv_small(int64_t rows, int64_t cols, int64_t dv, const float *s, int64_t lds,
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

/* ------------------------------------------------------------------ probe */

/* 16 independent FMA chains: enough for 4 FMA pipes with 4-cycle latency. */
double fa_neon_probe_fma(int64_t iters)
{
    float32x4_t a[16];
    for (int j = 0; j < 16; j++) a[j] = vdupq_n_f32((float)(j + 1));
    const float32x4_t x = vdupq_n_f32(0.999999f), y = vdupq_n_f32(1e-7f);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < 16; j++) a[j] = vfmaq_f32(y, a[j], x);
    float32x4_t s = a[0];
    for (int j = 1; j < 16; j++) s = vaddq_f32(s, a[j]);
    volatile float sink = vaddvq_f32(s);
    (void)sink;
    return 2.0 * 4.0 * 16.0 * (double)iters;
}
