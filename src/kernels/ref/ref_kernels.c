/*
 * ref_kernels.c: the portable micro-kernels. Plain C, no intrinsics; the hot
 * loops are axpy updates along the contiguous index (no reductions), so a
 * compiler can vectorise them without -ffast-math reassociation. exp is libm's
 * expf (correctly rounded in glibc). Every ISA table is tested against this one,
 * and its pv is the careful one the core falls back to when a masked V row
 * holds a NaN (it skips p == 0 terms, so a masked row never reads v).
 */
#include "../kernels.h"
#include "../../convert.h"

#include <math.h>

static int64_t round_rows(int64_t rows)
{
    return (rows + FA_ROW_ALIGN - 1) / FA_ROW_ALIGN * FA_ROW_ALIGN;
}

static void ref_pack_qt(int64_t rows, int64_t d, const float *q, int64_t ldq, float scale,
                        float *qt, int64_t ldqt)
{
    const int64_t padded = round_rows(rows);
    for (int64_t x = 0; x < d; x++) {
        float *dst = qt + x * ldqt;
        for (int64_t r = 0; r < rows; r++) dst[r] = scale * q[r * ldq + x];
        for (int64_t r = rows; r < padded; r++) dst[r] = 0.0f;
    }
}

static void ref_qk(int64_t rows, int64_t cols, int64_t d, const float *qt, int64_t ldqt,
                   const float *k, int64_t ldk, float *st, int64_t ldst)
{
    const int64_t padded = round_rows(rows);
    for (int64_t c = 0; c < cols; c++) {
        float *sc = st + c * ldst;
        const float *kc = k + c * ldk;
        for (int64_t r = 0; r < padded; r++) sc[r] = 0.0f;
        for (int64_t x = 0; x < d; x++) {
            const float kx = kc[x];
            const float *qx = qt + x * ldqt;
            for (int64_t r = 0; r < padded; r++) sc[r] += kx * qx[r];
        }
    }
}

/* Walks st row by row (c outer, r inner) so the memory access stays contiguous
 * even for the standard algorithm's Sk x Sq matrix. */
static void ref_softmax(int64_t rows, int64_t cols, float *st, int64_t ldst, const int32_t *lo,
                        const int32_t *hi, float *m, float *l, float *alpha)
{
    /* the tile's row maxima, over kept columns, collected in alpha */
    for (int64_t r = 0; r < rows; r++) alpha[r] = -INFINITY;
    for (int64_t c = 0; c < cols; c++) {
        const float *sc = st + c * ldst;
        for (int64_t r = 0; r < rows; r++) {
            if (lo && (c < lo[r] || c > hi[r])) continue;
            if (sc[r] > alpha[r] || isnan(sc[r])) alpha[r] = sc[r]; /* once NaN it sticks */
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const float m_new = (alpha[r] > m[r] || isnan(alpha[r])) ? alpha[r] : m[r];
        alpha[r] = m_new == -INFINITY ? 1.0f : expf(m[r] - m_new);
        l[r] *= alpha[r];
        m[r] = m_new;
    }
    for (int64_t c = 0; c < cols; c++) {
        float *sc = st + c * ldst;
        for (int64_t r = 0; r < rows; r++) {
            const int kept = m[r] != -INFINITY && (!lo || (c >= lo[r] && c <= hi[r]));
            sc[r] = kept ? expf(sc[r] - m[r]) : 0.0f;
            l[r] += sc[r];
        }
    }
}

static void ref_pv(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst,
                   const float *v, int64_t ldv, const float *alpha, float *acc, int64_t ldacc)
{
    if (alpha)
        for (int64_t r = 0; r < rows; r++)
            if (alpha[r] != 1.0f)
                for (int64_t e = 0; e < dv; e++) acc[r * ldacc + e] *= alpha[r];
    for (int64_t c = 0; c < cols; c++) { /* c outer: st is read along its rows */
        const float *sc = st + c * ldst, *vc = v + c * ldv;
        for (int64_t r = 0; r < rows; r++) {
            const float w = sc[r];
            if (w == 0.0f) continue; /* masked (or underflowed): never read v */
            float *ar = acc + r * ldacc;
            for (int64_t e = 0; e < dv; e++) ar[e] += w * vc[e];
        }
    }
}

static void ref_f16_to_f32(const uint16_t *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = fa_f16_to_f32(src[i]);
}

static void ref_bf16_to_f32(const uint16_t *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = fa_bf16_to_f32(src[i]);
}

/* Eight independent multiply-add chains: what plain C reaches without SIMD flags. */
static double ref_probe_fma(int64_t iters)
{
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const float x = 0.999999f, y = 1e-7f;
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < 8; j++) a[j] = a[j] * x + y;
    volatile float sink = a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
    (void)sink;
    return 2.0 * 8.0 * (double)iters;
}

const fa_kernels fa_kernels_ref = {
    .name = "ref",
    .pack_qt = ref_pack_qt,
    .qk = ref_qk,
    .softmax = ref_softmax,
    .pv = ref_pv,
    .f16_to_f32 = ref_f16_to_f32,
    .bf16_to_f32 = ref_bf16_to_f32,
    .probe_fma = ref_probe_fma,
};
