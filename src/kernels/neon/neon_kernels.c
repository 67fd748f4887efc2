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
 * Remainders (rows, cols, d, dv not multiples of the block) fall to smaller
 * blocks, then to scalar tails; k and v may have any leading dimension.
 *
 * exp: range reduction x = n ln2 + r with |r| <= ln2/2 (Cody-Waite, two fused
 * steps), exp(r) = 1 + r + r^2 P(r) with P a degree-4 least-squares fit (0.05 ulp
 * truncation error), and 2^n applied in two halves so that subnormal results are
 * rounded once and x <= -104 (and -inf) gives exactly 0. Measured under qemu over
 * every float in [-88, 0] (1.12e9 of them): at most 1.04 ulp from the exact value
 * (double exp), at most 1 ulp from glibc's expf (equal for 99.2%); NaN gives NaN,
 * x > 88.73 gives +inf.
 */
#include "../kernels.h"

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

static void neon_pack_qt(int64_t rows, int64_t d, const float *q, int64_t ldq, float scale, float *qt,
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

static void neon_qk(int64_t rows, int64_t cols, int64_t d, const float *qt, int64_t ldqt, const float *k,
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

static void neon_softmax(int64_t rows, int64_t cols, float *st, int64_t ldst, const int32_t *lo,
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

static void neon_pv(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const float *v,
                    int64_t ldv, const float *alpha, float *acc, int64_t ldacc)
{
    int64_t r = 0;
    for (; r + 12 <= rows; r += 12)
        pv_quads(3, cols, dv, st + r, ldst, v, ldv, alpha ? alpha + r : NULL, acc + r * ldacc, ldacc);
    for (; r + 4 <= rows; r += 4)
        pv_quads(1, cols, dv, st + r, ldst, v, ldv, alpha ? alpha + r : NULL, acc + r * ldacc, ldacc);
    for (; r < rows; r++) pv_row(cols, dv, st + r, ldst, v, ldv, alpha ? alpha[r] : 1.0f, acc + r * ldacc);
}

/* ------------------------------------------------------------------ conversions */

static void neon_f16_to_f32(const uint16_t *src, float *dst, int64_t n)
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

static void neon_bf16_to_f32(const uint16_t *src, float *dst, int64_t n)
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

/* ------------------------------------------------------------------ probe */

/* 16 independent FMA chains: enough for 4 FMA pipes with 4-cycle latency. */
static double neon_probe_fma(int64_t iters)
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

const fa_kernels fa_kernels_neon = {
    .name = "neon",
    .pack_qt = neon_pack_qt,
    .qk = neon_qk,
    .softmax = neon_softmax,
    .pv = neon_pv,
    .f16_to_f32 = neon_f16_to_f32,
    .bf16_to_f32 = neon_bf16_to_f32,
    .probe_fma = neon_probe_fma,
};
