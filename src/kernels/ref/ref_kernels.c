/*
 * ref_kernels.c: the portable micro-kernels. Plain C, no intrinsics; the hot
 * loops are axpy updates along the contiguous index (no reductions), so a
 * compiler can vectorise them without -ffast-math reassociation. exp is libm's
 * expf (correctly rounded in glibc). Every ISA table is tested against this one,
 * and its pv is the careful one the core falls back to when a masked V row
 * holds a NaN (it skips p == 0 terms, so a masked row never reads v).
 *
 * This is the root table: every other one starts from a copy of it
 * (fa_kernels_init_ref), so it fills every entry, the bf16 pair kernels
 * included (scalar, exact products, fp32 sums: correct everywhere, but not a
 * native dot product, so its flags leave FA_KERNELS_BF16_DOT clear).
 */
#include "../half.h"
#include "../kernels.h"

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

/* A float of an f32 or a bf16 array; bf16 a constant at every call, so each kernel
 * below compiles to its own plain loop. */
static inline float ref_load(const void *p, int64_t i, int bf16)
{
    return bf16 ? fa_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* st[c][r] = sum_x k[c][x] * qt[x][r] over the padded rows, x in order. The bf16
 * form reads qt as pairs (row (x/2), element 2r + (x&1)), each product exact in
 * fp32, and applies the scale last (the f32 form's qt carries it). */
static inline void ref_qk_rule(int bf16, int64_t rows, int64_t cols, int64_t d, const void *qt, int64_t ldqt,
                               const void *k, int64_t ldk, float scale, float *st, int64_t ldst)
{
    const int64_t padded = round_rows(rows), step = bf16 ? 2 : 1;
    for (int64_t c = 0; c < cols; c++) {
        float *sc = st + c * ldst;
        for (int64_t r = 0; r < padded; r++) sc[r] = 0.0f;
        for (int64_t x = 0; x < d; x++) {
            const float kx = ref_load(k, c * ldk + x, bf16);
            const int64_t qx = bf16 ? (x / 2) * ldqt + (x & 1) : x * ldqt;
            for (int64_t r = 0; r < padded; r++) sc[r] += kx * ref_load(qt, qx + step * r, bf16);
        }
        if (bf16)
            for (int64_t r = 0; r < padded; r++) sc[r] *= scale;
    }
}

static void ref_qk(int64_t rows, int64_t cols, int64_t d, const float *qt, int64_t ldqt,
                   const float *k, int64_t ldk, float *st, int64_t ldst)
{
    ref_qk_rule(0, rows, cols, d, qt, ldqt, k, ldk, 1.0f, st, ldst);
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

static void ref_ds(int64_t rows, int64_t cols, const float *st, int64_t ldst, float *dp, int64_t lddp,
                   const float *dvec)
{
    const int64_t rp = (rows + FA_ROW_ALIGN - 1) / FA_ROW_ALIGN * FA_ROW_ALIGN;
    for (int64_t c = 0; c < cols; c++) {
        const float *p = st + c * ldst;
        float *d = dp + c * lddp;
        for (int64_t r = 0; r < rp; r++) d[r] = p[r] == 0.0f ? 0.0f : p[r] * (d[r] - dvec[r]);
    }
}

static void ref_stx(int64_t rows, int64_t cols, int64_t n, const float *st, int64_t ldst, const float *x,
                    int64_t ldx, float *acc, int64_t ldacc)
{
    for (int64_t c = 0; c < cols; c++) {
        const float *sc = st + c * ldst;
        float *ac = acc + c * ldacc;
        for (int64_t r = 0; r < rows; r++) {
            const float w = sc[r];
            if (w == 0.0f) continue; /* masked (or underflowed): never read x */
            const float *xr = x + r * ldx;
            for (int64_t e = 0; e < n; e++) ac[e] += w * xr[e];
        }
    }
}

static void ref_stx_bf16(int64_t rows, int64_t cols, int64_t n, const float *st, int64_t ldst, const uint16_t *x,
                         int64_t ldx, float *acc, int64_t ldacc, void *scratch)
{
    (void)scratch;
    for (int64_t c = 0; c < cols; c++) {
        float *ac = acc + c * ldacc;
        for (int64_t r = 0; r < rows; r++) {
            const float w = fa_bf16_to_f32(fa_f32_to_bf16(st[c * ldst + r]));
            if (w == 0.0f) continue; /* masked (or underflowed): never read x */
            for (int64_t e = 0; e < n; e++) ac[e] += w * fa_bf16_to_f32(x[r * ldx + e]);
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

static void ref_f32_to_f16(const float *src, uint16_t *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = fa_f32_to_f16(src[i]);
}

static void ref_f32_to_bf16(const float *src, uint16_t *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = fa_f32_to_bf16(src[i]);
}

/* ------------------------------------------------ small-row (decode) path */

/* Element x of a K/V row of type kv (unscaled: the code's value for i8 and fp8). */
static float kv_elem(const void *row, int kv, int64_t x)
{
    switch (kv) {
    case FA_KV_F16: return fa_f16_to_f32(((const uint16_t *)row)[x]);
    case FA_KV_BF16: return fa_bf16_to_f32(((const uint16_t *)row)[x]);
    case FA_KV_I8: return (float)((const int8_t *)row)[x];
    case FA_KV_F8E4M3: return fa_e4m3_to_f32(((const uint8_t *)row)[x]);
    case FA_KV_F8E5M2: return fa_e5m2_to_f32(((const uint8_t *)row)[x]);
    default: return ((const float *)row)[x];
    }
}

static void ref_qk_small(int64_t rows, int64_t cols, int64_t d, const float *q, int64_t ldq,
                         const void *const *krow, int kv, const float *kscale, float *s, int64_t lds)
{
    for (int64_t c = 0; c < cols; c++) {
        const float ks = kscale ? kscale[c] : 1.0f;
        for (int64_t r = 0; r < rows; r++) {
            float sum = 0.0f;
            for (int64_t x = 0; x < d; x++) sum += q[r * ldq + x] * kv_elem(krow[c], kv, x);
            if (fa_kv_scaled(kv)) sum *= ks; /* the scale once per dot product, as the vector kernels do */
            s[r * lds + c] = sum;
        }
    }
}

/* The transposed softmax's rules, row by row (s[r][c] instead of st[c][r]). */
static void ref_softmax_small(int64_t rows, int64_t cols, float *s, int64_t lds, const int32_t *lo,
                              const int32_t *hi, float *m, float *l, float *alpha)
{
    for (int64_t r = 0; r < rows; r++) {
        float *sr = s + r * lds;
        /* the band clipped to the tile: the contract lets lo/hi reach past it */
        const int64_t a = lo && lo[r] > 0 ? lo[r] : 0, z = hi && hi[r] < cols - 1 ? hi[r] : cols - 1;
        float tile_max = -INFINITY;
        for (int64_t c = a; c <= z; c++)
            if (sr[c] > tile_max || isnan(sr[c])) tile_max = sr[c];
        const float m_new = (tile_max > m[r] || isnan(tile_max)) ? tile_max : m[r];
        alpha[r] = m_new == -INFINITY ? 1.0f : expf(m[r] - m_new);
        l[r] *= alpha[r];
        m[r] = m_new;
        for (int64_t c = 0; c < cols; c++) {
            const int kept = m_new != -INFINITY && c >= a && c <= z;
            sr[c] = kept ? expf(sr[c] - m_new) : 0.0f;
            l[r] += sr[c];
        }
    }
}

static void ref_pv_small(int64_t rows, int64_t cols, int64_t dv, const float *s, int64_t lds,
                         const void *const *vrow, int kv, const float *vscale, const float *alpha,
                         float *acc, int64_t ldacc)
{
    if (alpha)
        for (int64_t r = 0; r < rows; r++)
            if (alpha[r] != 1.0f)
                for (int64_t e = 0; e < dv; e++) acc[r * ldacc + e] *= alpha[r];
    for (int64_t c = 0; c < cols; c++) {
        const float vs = vscale ? vscale[c] : 1.0f;
        for (int64_t r = 0; r < rows; r++) {
            const float w = s[r * lds + c];
            if (w == 0.0f) continue; /* masked (or underflowed): never read v */
            float *ar = acc + r * ldacc;
            const float ws = fa_kv_scaled(kv) ? w * vs : w; /* the scale folded into p, as the vector kernels do */
            for (int64_t e = 0; e < dv; e++) ar[e] += ws * kv_elem(vrow[c], kv, e);
        }
    }
}

/* ------------------------------------ int8 products (FA_PARAM_QUANT_MATMUL) */

float fa_quant_row_i8(const float *x, int64_t n, int digits, int8_t *code)
{
    float amax = 0.0f;
    for (int64_t e = 0; e < n; e++) {
        const float m = fabsf(x[e]);
        if (m > amax || isnan(m)) amax = m;
    }
    const int finite = isfinite(amax);
    const float scale = finite ? amax / 127.0f : NAN;
    const float inv = finite && scale > 0.0f ? 1.0f / scale : 0.0f;
    const int64_t ld = fa_q8_ld(n);
    for (int64_t e = 0; e < ld; e++) {
        const float y = e < n && finite ? x[e] * inv : 0.0f;
        code[e] = fa_f32_to_i8(y);
        /* the second digit: the residual (exact: y is within 2^23 of an integer) in 2^-8 */
        if (digits == 2) code[ld + e] = fa_f32_to_i8((y - (float)code[e]) * 256.0f);
    }
    return scale;
}

static void ref_sum_rows_bf16(int64_t rows, int64_t d, const uint16_t *x, int64_t ld, double *sum)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t e = 0; e < d; e++) sum[e] += (double)fa_bf16_to_f32(x[r * ld + e]);
}

static void ref_dot_rows_f64(int64_t rows, int64_t d, const float *x, int64_t ldx, const float *y, float *out)
{
    for (int64_t r = 0; r < rows; r++) {
        double c = 0.0;
        for (int64_t e = 0; e < d; e++) c += (double)x[r * ldx + e] * (double)y[e];
        out[r] = (float)c;
    }
}

void fa_pack_kt_i8(int64_t cols, int64_t d, const int8_t *k8, int64_t ldk8, uint32_t *kt, int64_t j0)
{
    const int64_t nq = FA_KT_QUADS(d);
    for (int64_t c = 0; c < cols; c++) {
        const int64_t j = j0 + c;
        uint32_t *dst = kt + j / 16 * 16 * nq + j % 16;
        const uint8_t *row = (const uint8_t *)k8 + c * ldk8;
        /* the whole quads without the bound test, so the loop is four byte loads a dword */
        for (int64_t p = 0; p < d / 4; p++)
            dst[16 * p] = (uint32_t)row[4 * p] | (uint32_t)row[4 * p + 1] << 8 | (uint32_t)row[4 * p + 2] << 16 |
                          (uint32_t)row[4 * p + 3] << 24;
        for (int64_t p = d / 4; p < nq; p++) {
            uint32_t w = 0;
            for (int64_t b = 0; b < 4; b++)
                if (4 * p + b < d) w |= (uint32_t)row[4 * p + b] << 8 * b;
            dst[16 * p] = w;
        }
    }
}

void fa_pack_qt_u8(int64_t rows, int64_t d, const int8_t *q8, int64_t ldq8, uint32_t *qt4, int64_t ldqt4)
{
    const int64_t rp = round_rows(rows);
    for (int64_t p = 0; p < FA_QT4_QUADS(d); p++)
        for (int64_t r = 0; r < rp; r++) {
            /* code + 128 as a byte is the code with its top bit flipped */
            uint32_t w = 0;
            const uint8_t *c = r < rows ? (const uint8_t *)q8 + r * ldq8 + 4 * p : NULL;
            if (c && 4 * p + 4 <= d) /* four byte loads a dword (one load, where bytes are in order) */
                w = (uint32_t)c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16 | (uint32_t)c[3] << 24;
            else
                for (int64_t b = 0; c && b < 4; b++)
                    if (4 * p + b < d) w |= (uint32_t)c[b] << 8 * b;
            qt4[p * ldqt4 + r] = w ^ 0x80808080u;
        }
}

static void ref_qk_i8(int64_t rows, int64_t cols, int64_t d, const uint32_t *qt4, int64_t ldqt4, const float *qs,
                      const float *qc, const int8_t *k8, int64_t ldk8, const float *ks, const int32_t *ksum, float *st,
                      int64_t ldst)
{
    const int64_t rp = round_rows(rows);
    (void)ksum; /* the codes themselves: q's byte minus 128 */
    for (int64_t c = 0; c < cols; c++)
        for (int64_t r = 0; r < rp; r++) {
            int32_t a = 0; /* |a| <= 127^2 d < 2^31 for d <= FA_QUANT_D_MAX */
            for (int64_t x = 0; x < d; x++)
                a += ((int32_t)(qt4[x / 4 * ldqt4 + r] >> 8 * (x % 4) & 0xffu) - 128) * (int32_t)k8[c * ldk8 + x];
            const float s = (float)a * (qs[r] * ks[c]);
            st[c * ldst + r] = qc ? s + qc[r] : s;
        }
}

static void ref_qk_small_i8(int64_t rows, int64_t cols, int64_t d, int digits, const int8_t *q8, int64_t ldq8,
                            const float *qscale, const void *const *krow, const float *kscale, float *s, int64_t lds)
{
    for (int64_t c = 0; c < cols; c++) {
        const int8_t *k = krow[c];
        for (int64_t r = 0; r < rows; r++) {
            int32_t sum[2] = {0, 0}; /* |sum| <= 127^2 d < 2^31 for d <= FA_QUANT_D_MAX */
            for (int t = 0; t < digits; t++)
                for (int64_t x = 0; x < d; x++) sum[t] += (int32_t)q8[(r * digits + t) * ldq8 + x] * (int32_t)k[x];
            const float dot = digits == 2 ? fmaf((float)sum[1], 0x1p-8f, (float)sum[0]) : (float)sum[0];
            s[r * lds + c] = dot * (qscale[r] * kscale[c]);
        }
    }
}

static void ref_pv_small_i8(int64_t rows, int64_t cols, int64_t dv, int digits, const float *s, int64_t lds,
                            const void *const *vrow, const float *vscale, const float *alpha, float *acc,
                            int64_t ldacc, const fa_rows_ahead *ahead)
{
    (void)ahead; /* a hint only */
    uint8_t u[2][FA_SMALL_COLS];
    for (int64_t r = 0; r < rows; r++) {
        const float *sr = s + r * lds;
        float *ar = acc + r * ldacc;
        const float a = alpha ? alpha[r] : 1.0f;
        float wmax = 0.0f;
        int ok = 1;
        for (int64_t c = 0; c < cols; c++) {
            const float w = sr[c] * vscale[c];
            ok &= w >= 0.0f && w < INFINITY; /* false for NaN */
            if (w > wmax) wmax = w;
        }
        if (!ok || (wmax > 0.0f && wmax < FA_PV_I8_WMIN)) {
            ref_pv_small(1, cols, dv, sr, lds, vrow, FA_KV_I8, vscale, alpha ? alpha + r : NULL, ar, ldacc);
            continue;
        }
        if (wmax == 0.0f) {
            for (int64_t e = 0; e < dv; e++) ar[e] *= a;
            continue;
        }
        const float ps = wmax / 255.0f, inv = 255.0f / wmax;
        for (int64_t c = 0; c < cols; c++) {
            const float y = sr[c] * vscale[c] * inv;
            fa_u8_digits(y, digits, &u[0][c], &u[1][c]);
        }
        enum { EB = 256 };
        for (int64_t e0 = 0; e0 < dv; e0 += EB) {
            const int64_t ne = dv - e0 < EB ? dv - e0 : EB;
            int32_t sum[2][EB] = {{0}}; /* each <= 255 * 128 * FA_SMALL_COLS */
            for (int t = 0; t < digits; t++)
                for (int64_t c = 0; c < cols; c++) {
                    const int32_t uc = u[t][c];
                    const int8_t *v = (const int8_t *)vrow[c] + e0;
                    if (uc)
                        for (int64_t e = 0; e < ne; e++) sum[t][e] += uc * (int32_t)v[e];
                }
            for (int64_t e = 0; e < ne; e++) {
                const float dot = digits == 2 ? fmaf((float)sum[1][e], 0x1p-8f, (float)sum[0][e]) : (float)sum[0][e];
                ar[e0 + e] = fmaf(ps, dot, a * ar[e0 + e]);
            }
        }
    }
}

/* ------------------------------------------------ bf16 pairs (scalar) */

static void ref_pack_qt_bf16(int64_t rows, int64_t d, const uint16_t *q, int64_t ldq, uint16_t *qt2,
                             int64_t ldqt2)
{
    const int64_t padded = round_rows(rows), pairs = (d + 1) / 2;
    for (int64_t p = 0; p < pairs; p++) {
        uint16_t *dst = qt2 + p * ldqt2; /* (padded, 2): the pair (x, x+1) of each row */
        for (int64_t r = 0; r < padded; r++)
            for (int64_t j = 0; j < 2; j++) {
                const int64_t x = 2 * p + j;
                dst[2 * r + j] = r < rows && x < d ? q[r * ldq + x] : 0;
            }
    }
}

/* ref_qk on the widened pairs. */
static void ref_qk_bf16(int64_t rows, int64_t cols, int64_t d, const uint16_t *qt2, int64_t ldqt2,
                        const uint16_t *k, int64_t ldk, float scale, float *st, int64_t ldst)
{
    ref_qk_rule(1, rows, cols, d, qt2, ldqt2, k, ldk, scale, st, ldst);
}

static void ref_pack_pairs_bf16(int64_t nrows, int64_t len, const uint16_t *src, int64_t ld, uint32_t *dst,
                                int64_t ld32)
{
    for (int64_t p = 0; p < (nrows + 1) / 2; p++)
        for (int64_t e = 0; e < ld32; e++) {
            const uint32_t lo = e < len ? src[2 * p * ld + e] : 0;
            const uint32_t hi = e < len && 2 * p + 1 < nrows ? src[(2 * p + 1) * ld + e] : 0;
            dst[p * ld32 + e] = lo | hi << 16;
        }
}

/* As ref_pv, with p rounded to bf16 first (as a native kernel must, to pair it),
 * v_c[e] read from its pair. */
static void ref_pv_bf16(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst,
                        const uint32_t *vp, int64_t ldvp, const float *alpha, float *acc, int64_t ldacc,
                        void *scratch)
{
    (void)scratch; /* nothing to repack */
    if (alpha)
        for (int64_t r = 0; r < rows; r++)
            if (alpha[r] != 1.0f)
                for (int64_t e = 0; e < dv; e++) acc[r * ldacc + e] *= alpha[r];
    for (int64_t c = 0; c < cols; c++) {
        const float *sc = st + c * ldst;
        const uint32_t *pair = vp + (c / 2) * ldvp;
        const int shift = (c & 1) * 16;
        for (int64_t r = 0; r < rows; r++) {
            const float w = fa_bf16_to_f32(fa_f32_to_bf16(sc[r]));
            if (w == 0.0f) continue; /* masked (or underflowed): never read v */
            float *ar = acc + r * ldacc;
            for (int64_t e = 0; e < dv; e++) ar[e] += w * fa_bf16_to_f32((uint16_t)(pair[e] >> shift));
        }
    }
}

static void ref_pack_kt_bf16(int64_t cols, int64_t d, const uint16_t *k, int64_t ldk, uint32_t *kt, int64_t j0)
{
    const int64_t np = FA_KT_PAIRS(d);
    for (int64_t c = 0; c < cols; c++) { /* a key's row at a time: k read along its rows */
        const int64_t j = j0 + c;
        uint32_t *dst = kt + j / 16 * 16 * np + j % 16;
        for (int64_t p = 0; p < np; p++) {
            const uint32_t lo = 2 * p < d ? k[c * ldk + 2 * p] : 0;
            const uint32_t hi = 2 * p + 1 < d ? k[c * ldk + 2 * p + 1] : 0;
            dst[16 * p] = lo | hi << 16;
        }
    }
}

/* The fused forward's contract with the plain rule: m moves to the tile's max at once
 * (a rescale the contract allows, not the lazy one), glibc's expf, l from its values,
 * p rounded to nearest even for P V (and its residual, in the bf16x3 mode); sums in
 * key order. */
/* score (r, c) of fwd_bf16 (i8 = 0) or fwd_i8 (1), as kernels.h defines them */
static float ref_fwd_score(const fa_fwd_tile *t, int i8, int64_t r, int64_t c)
{
    if (i8) {
        const int8_t *q = t->i8.q8 + r * t->i8.ldq8;
        int32_t a = 0;
        for (int64_t x = 0; x < t->d; x++) {
            const uint32_t quad = t->kt[c / 16 * 16 * FA_KT_QUADS(t->d) + 16 * (x / 4) + c % 16];
            a += (int32_t)q[x] * (int32_t)(int8_t)(uint8_t)(quad >> (x & 3) * 8);
        }
        const float s = (float)a * (t->i8.qs[r] * t->i8.ks[c]);
        return t->i8.qc ? s + t->i8.qc[r] : s;
    }
    const uint16_t *q = t->bf16.q + r * t->bf16.ldq;
    float acc = 0.0f;
    for (int64_t x = 0; x < t->d; x++) {
        const uint32_t pair = t->kt[c / 16 * 16 * FA_KT_PAIRS(t->d) + 16 * (x / 2) + c % 16];
        acc += fa_bf16_to_f32(q[x]) * fa_bf16_to_f32((uint16_t)(pair >> (x & 1) * 16));
    }
    return t->bf16.scale * acc;
}

static void ref_fwd_tile(const fa_fwd_tile *t, int i8)
{
    float *s = t->scratch; /* one row's scores: cols floats, within the scratch bound */
    for (int64_t r = 0; r < t->rows; r++) {
        float mx = -INFINITY;
        for (int64_t c = 0; c < t->cols; c++) {
            s[c] = ref_fwd_score(t, i8, r, c);
            const int kept = !t->lo || (c >= t->lo[r] && c <= t->hi[r]);
            if (kept && (s[c] > mx || isnan(s[c]))) mx = s[c]; /* once NaN it sticks */
        }
        const float m_old = t->m[r], m_new = (mx > m_old || isnan(mx)) ? mx : m_old;
        const float alpha = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
        float *ar = t->acc + r * t->ldacc;
        if (alpha != 1.0f)
            for (int64_t e = 0; e < t->dv; e++) ar[e] *= alpha;
        t->l[r] *= alpha;
        t->m[r] = m_new;
        if (m_new == -INFINITY) continue;
        for (int64_t c = 0; c < t->cols; c++) {
            if (t->lo && (c < t->lo[r] || c > t->hi[r])) continue;
            const float x = expf(s[c] - m_new), w = fa_bf16_to_f32(fa_f32_to_bf16(x));
            t->l[r] += x;
            if (w == 0.0f) continue; /* never read v */
            const int64_t off = (c / 2) * t->ldvp, sh = (c & 1) * 16;
            const uint32_t *pair = t->vp + off;
            /* the bf16x3 mode: p vh + p vl + pl vh, pl = bf16(x - p) */
            const float wl = t->bf16.vlo ? fa_bf16_to_f32(fa_f32_to_bf16(x - w)) : 0.0f;
            for (int64_t e = 0; e < t->dv; e++) {
                const float vh = fa_bf16_to_f32((uint16_t)(pair[e] >> sh));
                ar[e] += w * vh;
                if (t->bf16.vlo) ar[e] += w * fa_bf16_to_f32((uint16_t)(t->bf16.vlo[off + e] >> sh)) + wl * vh;
            }
        }
    }
}

static void ref_fwd_bf16(const fa_fwd_tile *t) { ref_fwd_tile(t, 0); }
static void ref_fwd_i8(const fa_fwd_tile *t) { ref_fwd_tile(t, 1); }

static void ref_pack_t_bf16(int64_t rows, int64_t len, const uint16_t *src, int64_t ld, uint16_t *dst, int64_t lddst)
{
    const int64_t rp = FA_RUP32(rows);
    for (int64_t x = 0; x < len; x++) {
        for (int64_t r = 0; r < rows; r++) dst[x * lddst + r] = src[r * ld + x];
        for (int64_t r = rows; r < rp; r++) dst[x * lddst + r] = 0;
    }
}

/* element x of key c in pack_kt_bf16's blocks of depth d */
static float kt_elem(const uint32_t *kt, int64_t d, int64_t c, int64_t x)
{
    return fa_bf16_to_f32((uint16_t)(kt[c / 16 * 16 * FA_KT_PAIRS(d) + 16 * (x / 2) + c % 16] >> (x & 1) * 16));
}

/* The fused backward's contract in plain loops: glibc's expf, nearest even, sums in index
 * order, zero weights skipped (never reading what they would multiply). */
static void ref_bwd_bf16(const fa_bwd_tile *t)
{
    float *pb = t->scratch, *dsb = pb + t->cols; /* one row's bf16 P and dS, within the bound */
    for (int64_t r = 0; r < t->rows; r++) {
        const uint16_t *q = t->q + r * t->ldq, *dout = t->dout + r * t->lddo;
        for (int64_t c = 0; c < t->cols; c++) {
            pb[c] = dsb[c] = 0.0f;
            if ((t->lo && (c < t->lo[r] || c > t->hi[r])) || t->lse[r] == -INFINITY) continue;
            float s = 0.0f, dp = 0.0f;
            for (int64_t x = 0; x < t->d; x++) s += fa_bf16_to_f32(q[x]) * kt_elem(t->kt, t->d, c, x);
            for (int64_t e = 0; e < t->dv; e++) dp += fa_bf16_to_f32(dout[e]) * kt_elem(t->vt, t->dv, c, e);
            const float p = expf(t->scale * s - t->lse[r]);
            pb[c] = fa_bf16_to_f32(fa_f32_to_bf16(p));
            dsb[c] = fa_bf16_to_f32(fa_f32_to_bf16(p * (dp - t->dvec[r])));
        }
        if (t->dq)
            for (int64_t x = 0; x < t->d; x++) {
                float acc = t->dq[r * t->lddq + x];
                for (int64_t c = 0; c < t->cols; c++)
                    if (dsb[c] != 0.0f) acc += dsb[c] * kt_elem(t->kt, t->d, c, x);
                t->dq[r * t->lddq + x] = acc;
            }
        for (int64_t c = 0; c < t->cols; c++) {
            if (t->dvt && pb[c] != 0.0f)
                for (int64_t e = 0; e < t->dv; e++) t->dvt[e * t->lddvt + c] += pb[c] * fa_bf16_to_f32(dout[e]);
            if (t->dkt && dsb[c] != 0.0f)
                for (int64_t x = 0; x < t->d; x++) t->dkt[x * t->lddkt + c] += dsb[c] * fa_bf16_to_f32(q[x]);
        }
    }
}

/* ------------------------------------------------------------ probes */

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

/* The scalar form of a bf16 pair dot product (two widened products per step),
 * eight chains. Only there so that the entry is never NULL: fa_probe reports no
 * bf16 peak for a table without FA_KERNELS_BF16_DOT. */
static double ref_probe_bf16(int64_t iters)
{
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const float x = fa_bf16_to_f32(0x3A80), y = fa_bf16_to_f32(0x3F80); /* 2^-10, 1 */
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < 8; j++) a[j] = a[j] + x * y + x * y;
    volatile float sink = a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
    (void)sink;
    return 4.0 * 8.0 * (double)iters;
}

/* ------------------------------------------------------------ the table */

/* Plain C keeps no state in a thread. */
/* No tile unit: nothing measured (kernels.h; probe.c answers FA_ERR_UNSUPPORTED first). */
static double ref_probe_tile(int64_t iters)
{
    (void)iters;
    return 0.0;
}

static void ref_thread_begin(void) {}
static void ref_thread_end(void) {}

const fa_kernels fa_kernels_ref = {
    .name = "ref",
    .parent = NULL,
    .flags = FA_KERNELS_SMALL_ROWS | FA_KERNELS_I8_DOT,
    .row_align = FA_ROW_ALIGN,
    .qk_block = {1, 1},
    .pv_block = {1, 1},
    .pack_qt = ref_pack_qt,
    .qk = ref_qk,
    .softmax = ref_softmax,
    .pv = ref_pv,
    .ds = ref_ds,
    .stx = ref_stx,
    .f16_to_f32 = ref_f16_to_f32,
    .bf16_to_f32 = ref_bf16_to_f32,
    .f32_to_f16 = ref_f32_to_f16,
    .f32_to_bf16 = ref_f32_to_bf16,
    .pack_qt_bf16 = ref_pack_qt_bf16,
    .qk_bf16 = ref_qk_bf16,
    .pack_pairs_bf16 = ref_pack_pairs_bf16,
    .pv_bf16 = ref_pv_bf16,
    .stx_bf16 = ref_stx_bf16,
    .pack_kt_bf16 = ref_pack_kt_bf16,
    .fwd_bf16 = ref_fwd_bf16,
    .fwd_i8 = ref_fwd_i8,
    .qk_i8 = ref_qk_i8,
    .quant_row_i8 = fa_quant_row_i8,
    .sum_rows_bf16 = ref_sum_rows_bf16,
    .dot_rows_f64 = ref_dot_rows_f64,
    .pack_t_bf16 = ref_pack_t_bf16,
    .bwd_bf16 = ref_bwd_bf16,
    .qk_small = ref_qk_small,
    .softmax_small = ref_softmax_small,
    .pv_small = ref_pv_small,
    .qk_small_i8 = ref_qk_small_i8,
    .pv_small_i8 = ref_pv_small_i8,
    .probe_fma = ref_probe_fma,
    .probe_bf16 = ref_probe_bf16,
    .probe_tile = ref_probe_tile,
    .thread_begin = ref_thread_begin,
    .thread_end = ref_thread_end,
};

void fa_kernels_init_ref(fa_kernels *k) { *k = fa_kernels_ref; }
