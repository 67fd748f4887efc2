/*
 * avx2vnni_kernels.c: FA_PARAM_QUANT_MATMUL's decode kernels (kernels.h: qk_small_i8,
 * pv_small_i8; docs/semantics.md, section 11) on AVX-VNNI, the VEX form of vpdpbusd that
 * client CPUs without AVX-512 have (Alder Lake and later). The same algorithms as
 * avx512vnni_kernels.c on 256-bit vectors (8 keys per qk pass, 32 e per P.V block), with
 * the changes AVX2 forces: no byte-masked loads (a row's last partial vector goes
 * through a zeroed buffer), 16 vector registers (P.V takes up to four rows x 16 e at a time). Built with
 * the avx2 flags and -mavxvnni; the "avx2vnni" table's predicate asks for AVX-VNNI.
 * The bits are the reference's (kernels.h's contract; test_kernels checks them).
 */
#include "avx2_kernels.h"
#include "../i8_rows.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define AV_INLINE static inline __attribute__((always_inline))

/* AV_EBIG_LD: the rows of the sum and interleave buffers a cache line more than a
 * multiple of 1 KB apart, so they do not fall into a few L1 sets */
enum { AV_PF = 32, AV_CHUNK = 32, AV_EBIG = 512, AV_EBIG_LD = AV_EBIG + 16 };

/* 32 bytes of row at x: whole, or the n < 32 there and zeros */
AV_INLINE __m256i load_part(const int8_t *row, int64_t n)
{
    if (n >= 32) return _mm256_loadu_si256((const __m256i *)row);
    _Alignas(32) int8_t buf[32] = {0};
    memcpy(buf, row, (size_t)n);
    return _mm256_load_si256((const __m256i *)buf);
}

/* In-place 8 x 8 transpose of dwords. */
AV_INLINE void transpose8(__m256i t[8])
{
    __m256i a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        a[i] = _mm256_unpacklo_epi32(t[i], t[i + 1]);
        a[i + 1] = _mm256_unpackhi_epi32(t[i], t[i + 1]);
    }
    for (int g = 0; g < 2; g++)
        for (int h = 0; h < 2; h++) {
            b[4 * g + 2 * h] = _mm256_unpacklo_epi64(a[4 * g + h], a[4 * g + 2 + h]);
            b[4 * g + 2 * h + 1] = _mm256_unpackhi_epi64(a[4 * g + h], a[4 * g + 2 + h]);
        }
    for (int j = 0; j < 4; j++) {
        t[j] = _mm256_permute2x128_si256(b[j], b[4 + j], 0x20);
        t[4 + j] = _mm256_permute2x128_si256(b[j], b[4 + j], 0x31);
    }
}

AV_INLINE void qk_body(const int R, const int T, int64_t cols, int64_t d, const int8_t *q8, int64_t ldq8,
                       const float *qscale, const void *const *krow, const float *kscale, float *s, int64_t lds)
{
    const int64_t nv = (d + 31) / 32;
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    __m256i corr[FA_SMALL_ROWS][2];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            int32_t sum = 0;
            for (int64_t x = 0; x < d; x++) sum += q8[(r * T + t) * ldq8 + x];
            corr[r][t] = _mm256_set1_epi32(128 * sum);
        }
    _Alignas(32) __m256i kt[8];
    for (int64_t c0 = 0; c0 < cols; c0 += 8) {
        const int64_t nc = cols - c0 < 8 ? cols - c0 : 8;
        for (int64_t c = c0 + AV_PF; c < c0 + AV_PF + 8 && c < cols; c++)
            for (int64_t x = 0; x < d; x += 64) _mm_prefetch((const char *)krow[c] + x, _MM_HINT_T0);
        __m256i acc[FA_SMALL_ROWS][2];
        for (int r = 0; r < R; r++)
            for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_si256();
        for (int64_t v = 0; v < nv; v++) {
            __m256i t8[8];
            for (int64_t c = 0; c < 8; c++)
                t8[c] = c < nc ? load_part((const int8_t *)krow[c0 + c] + 32 * v, d - 32 * v) : _mm256_setzero_si256();
            transpose8(t8);
            for (int j = 0; j < 8; j++) _mm256_store_si256(&kt[j], _mm256_xor_si256(t8[j], flip));
            for (int j = 0; j < 8; j++) {
                const __m256i ku = _mm256_load_si256(&kt[j]);
                for (int r = 0; r < R; r++)
                    for (int t = 0; t < T; t++) {
                        int32_t qd;
                        memcpy(&qd, q8 + (r * T + t) * ldq8 + 32 * v + 4 * j, 4);
                        acc[r][t] = _mm256_dpbusd_avx_epi32(acc[r][t], ku, _mm256_set1_epi32(qd));
                    }
            }
        }
        _Alignas(32) float ksb[8] = {0};
        memcpy(ksb, kscale + c0, (size_t)nc * sizeof(float));
        const __m256 ks = _mm256_load_ps(ksb);
        for (int r = 0; r < R; r++) {
            __m256 dot = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[r][0], corr[r][0]));
            if (T == 2)
                dot = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[r][1], corr[r][1])),
                                      _mm256_set1_ps(0x1p-8f), dot);
            _mm256_store_ps(s + r * lds + c0, _mm256_mul_ps(dot, _mm256_mul_ps(_mm256_set1_ps(qscale[r]), ks)));
        }
    }
}

_Static_assert(FA_SMALL_ROWS == 8, "i8_rows.h makes one function per row count 1..8");
FA_I8_QK_ENTRY(qk_body, fa_avx2vnni_qk_small_i8)

/* ------------------------------------------------------------------- p . v */

/* isum[r][e] += sum over nq quads of u[r][quad] . vp[quad][e] for R rows, e < ne (a
 * multiple of 32), NV vectors of e at a time (R * NV <= 8 accumulators of 16 registers). */
AV_INLINE void pv_rows(const int R, const int NV, int64_t nq, int64_t ne, const uint8_t *u, int64_t ldu,
                       const int32_t *vp, int64_t ldvp, int32_t *isum, int64_t ldis)
{
    for (int64_t e = 0; e < ne; e += 8 * NV) {
        __m256i acc[4][4];
        for (int r = 0; r < R; r++)
            for (int k = 0; k < NV; k++) acc[r][k] = _mm256_load_si256((const __m256i *)(isum + r * ldis + e + 8 * k));
        for (int64_t qd = 0; qd < nq; qd++) {
            const int32_t *vq = vp + qd * ldvp + e;
            __m256i v[4];
            for (int k = 0; k < NV; k++) v[k] = _mm256_load_si256((const __m256i *)(vq + 8 * k));
            for (int r = 0; r < R; r++) {
                int32_t w;
                memcpy(&w, u + r * ldu + 4 * qd, 4);
                const __m256i b = _mm256_set1_epi32(w);
                for (int k = 0; k < NV; k++) acc[r][k] = _mm256_dpbusd_avx_epi32(acc[r][k], b, v[k]);
            }
        }
        for (int r = 0; r < R; r++)
            for (int k = 0; k < NV; k++) _mm256_store_si256((__m256i *)(isum + r * ldis + e + 8 * k), acc[r][k]);
    }
}

static void pv_group(int rows, int64_t nq, int64_t ne, const uint8_t *u, int64_t ldu, const int32_t *vp,
                     int64_t ldvp, int32_t *isum, int64_t ldis)
{
    switch (rows) {
    case 1: pv_rows(1, 4, nq, ne, u, ldu, vp, ldvp, isum, ldis); break;
    case 2: pv_rows(2, 4, nq, ne, u, ldu, vp, ldvp, isum, ldis); break;
    case 3: pv_rows(3, 2, nq, ne, u, ldu, vp, ldvp, isum, ldis); break;
    default: pv_rows(4, 2, nq, ne, u, ldu, vp, ldvp, isum, ldis); break;
    }
}

/* 8 int32 in [0, 255] as bytes at p */
AV_INLINE void store_u8x8(uint8_t *p, __m256i y)
{
    const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(y, y), _mm256_setzero_si256());
    const uint32_t lo = (uint32_t)_mm_cvtsi128_si32(_mm256_castsi256_si128(b));
    const uint32_t hi = (uint32_t)_mm_cvtsi128_si32(_mm256_extracti128_si256(b, 1));
    memcpy(p, &lo, 4), memcpy(p + 4, &hi, 4);
}

enum { PV_QUANT = 0, PV_ZERO = 1, PV_EXACT = 2 };
enum { PV_LDU = FA_SMALL_COLS + 64 };

/* One row of the weights, w = p * vs, checked: its kind, and for a PV_QUANT row its u8
 * digits u0 (u1 the second's) and scale *ps; u0 and u1 are zeroed first, so zero past cols */
static int quantise_p_row(int64_t cols, int digits, const float *sr, const float *vscale, uint8_t *u0, uint8_t *u1,
                          float *ps)
{
    __m256 mx = _mm256_setzero_ps();
    int bad = 0;
    for (int64_t c0 = 0; c0 < cols; c0 += 8) {
        const int64_t n = cols - c0 < 8 ? cols - c0 : 8;
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 w = _mm256_mul_ps(_mm256_maskload_ps(sr + c0, m), _mm256_maskload_ps(vscale + c0, m));
        const __m256 ok = _mm256_and_ps(_mm256_cmp_ps(w, _mm256_setzero_ps(), _CMP_GE_OQ),
                                        _mm256_cmp_ps(w, _mm256_set1_ps(INFINITY), _CMP_LT_OQ));
        bad |= _mm256_movemask_ps(_mm256_andnot_ps(ok, _mm256_castsi256_ps(m)));
        mx = _mm256_max_ps(mx, w);
    }
    const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    const __m128 m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float wmax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
    const int ok = !bad;
    const int kind = !ok || (wmax > 0.0f && wmax < FA_PV_I8_WMIN) ? PV_EXACT : wmax == 0.0f ? PV_ZERO : PV_QUANT;
    memset(u0, 0, PV_LDU), memset(u1, 0, PV_LDU);
    if (kind != PV_QUANT) return kind;
    *ps = wmax / 255.0f;
    const __m256 inv = _mm256_set1_ps(255.0f / wmax), top = _mm256_set1_ps(255.0f);
    for (int64_t c0 = 0; c0 < cols; c0 += 8) {
        const int64_t n = cols - c0 < 8 ? cols - c0 : 8;
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 y = _mm256_mul_ps(_mm256_mul_ps(_mm256_maskload_ps(sr + c0, m), _mm256_maskload_ps(vscale + c0, m)), inv);
        const __m256 h = digits == 2 ? _mm256_round_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
                                     : _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        store_u8x8(u0 + c0, _mm256_cvtps_epi32(_mm256_min_ps(h, top)));
        if (digits == 2) {
            const __m256 l = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(y, h), _mm256_set1_ps(256.0f)),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            store_u8x8(u1 + c0, _mm256_cvtps_epi32(_mm256_min_ps(l, top)));
        }
    }
    return kind;
}

/* V's keys c0.. (nq quads, zero past cols), e0..e0+ne, into vpdpbusd's layout: vp[qd] holds
 * quad qd's four keys' bytes of each e in one dword */
static void pair_v_chunk(const void *const *vrow, int64_t c0, int64_t cols, int64_t nq, int64_t e0, int64_t ne,
                         int64_t nep, int32_t (*vp)[AV_EBIG_LD])
{
    for (int64_t qd = 0; qd < nq; qd++)
        for (int64_t e = 0; e < nep; e += 32) {
            __m256i x[4];
            for (int i = 0; i < 4; i++) {
                const int64_t c = c0 + 4 * qd + i;
                x[i] = c < cols ? load_part((const int8_t *)vrow[c] + e0 + e, ne - e) : _mm256_setzero_si256();
            }
            /* lane L dword j of vector k: e = 16 L + 4 k + j, the four keys' bytes */
            const __m256i t0 = _mm256_unpacklo_epi8(x[0], x[1]), t1 = _mm256_unpackhi_epi8(x[0], x[1]);
            const __m256i t2 = _mm256_unpacklo_epi8(x[2], x[3]), t3 = _mm256_unpackhi_epi8(x[2], x[3]);
            int32_t *o = vp[qd] + e;
            _mm256_store_si256((__m256i *)o, _mm256_unpacklo_epi16(t0, t2));
            _mm256_store_si256((__m256i *)(o + 8), _mm256_unpackhi_epi16(t0, t2));
            _mm256_store_si256((__m256i *)(o + 16), _mm256_unpacklo_epi16(t1, t3));
            _mm256_store_si256((__m256i *)(o + 24), _mm256_unpackhi_epi16(t1, t3));
        }
}

/* One row's integer sums is[t] (digits of them, e permuted as pair_v_chunk leaves it) into
 * its ne accumulators: ar = fma(ps, float(sum), alpha * ar), or alpha * ar for a PV_ZERO row */
static void add_row_sums(int64_t ne, int64_t nep, int digits, int kind, const int32_t *const is_t[2], float alpha,
                         float ps, float *ar)
{
    const __m256 a = _mm256_set1_ps(alpha), p = _mm256_set1_ps(ps);
    for (int64_t e = 0; e < nep; e += 32) {
        __m256 dot[4];
        for (int t = 0; t < digits; t++) {
            const int32_t *is = is_t[t] + e;
            const __m256i A0 = _mm256_load_si256((const __m256i *)is), A1 = _mm256_load_si256((const __m256i *)(is + 8));
            const __m256i A2 = _mm256_load_si256((const __m256i *)(is + 16)), A3 = _mm256_load_si256((const __m256i *)(is + 24));
            const __m256 n[4] = {_mm256_cvtepi32_ps(_mm256_permute2x128_si256(A0, A1, 0x20)),
                                 _mm256_cvtepi32_ps(_mm256_permute2x128_si256(A2, A3, 0x20)),
                                 _mm256_cvtepi32_ps(_mm256_permute2x128_si256(A0, A1, 0x31)),
                                 _mm256_cvtepi32_ps(_mm256_permute2x128_si256(A2, A3, 0x31))};
            for (int k = 0; k < 4; k++) dot[k] = t ? _mm256_fmadd_ps(n[k], _mm256_set1_ps(0x1p-8f), dot[k]) : n[k];
        }
        for (int k = 0; k < 4; k++) {
            const int64_t eo = e + 8 * k;
            if (eo >= ne) break;
            _Alignas(32) float buf[8];
            const int64_t n = ne - eo < 8 ? ne - eo : 8;
            memcpy(buf, ar + eo, (size_t)n * 4);
            const __m256 x = _mm256_mul_ps(a, _mm256_load_ps(buf));
            _mm256_store_ps(buf, kind == PV_ZERO ? x : _mm256_fmadd_ps(p, dot[k], x));
            memcpy(ar + eo, buf, (size_t)n * 4);
        }
    }
}

void fa_avx2vnni_pv_small_i8(int64_t rows, int64_t cols, int64_t dv, int digits, const float *s, int64_t lds,
                             const void *const *vrow, const float *vscale, const float *alpha, float *acc,
                             int64_t ldacc, const fa_rows_ahead *ahead)
{
    (void)ahead; /* a hint this table leaves alone */
    _Alignas(32) uint8_t u[2][FA_SMALL_ROWS][PV_LDU];
    _Alignas(32) int32_t vp[AV_CHUNK / 4][AV_EBIG_LD];
    _Alignas(32) int32_t isum[2][FA_SMALL_ROWS][AV_EBIG_LD];
    float ps[FA_SMALL_ROWS];
    int kind[FA_SMALL_ROWS];
    for (int64_t r = 0; r < rows; r++)
        kind[r] = quantise_p_row(cols, digits, s + r * lds, vscale, u[0][r], u[1][r], &ps[r]);
    for (int64_t e0 = 0; e0 < dv; e0 += AV_EBIG) {
        const int64_t ne = dv - e0 < AV_EBIG ? dv - e0 : AV_EBIG, nep = (ne + 31) / 32 * 32;
        for (int t = 0; t < digits; t++)
            for (int64_t r = 0; r < rows; r++) memset(isum[t][r], 0, (size_t)nep * sizeof(int32_t));
        for (int64_t c0 = 0; c0 < cols; c0 += AV_CHUNK) {
            const int64_t nq = ((cols - c0 < AV_CHUNK ? cols - c0 : AV_CHUNK) + 3) / 4;
            for (int64_t c = c0 + AV_CHUNK; c < c0 + 2 * AV_CHUNK && c < cols; c++)
                for (int64_t e = 0; e < ne; e += 64) _mm_prefetch((const char *)vrow[c] + e0 + e, _MM_HINT_T0);
            pair_v_chunk(vrow, c0, cols, nq, e0, ne, nep, vp);
            for (int t = 0; t < digits; t++)
                for (int64_t r = 0; r < rows; r += 4)
                    pv_group((int)(rows - r < 4 ? rows - r : 4), nq, nep, u[t][r] + c0, PV_LDU, vp[0], AV_EBIG_LD,
                             isum[t][r], AV_EBIG_LD);
        }
        for (int64_t r = 0; r < rows; r++) {
            if (kind[r] == PV_EXACT) continue;
            const int32_t *const is_t[2] = {isum[0][r], isum[1][r]};
            add_row_sums(ne, nep, digits, kind[r], is_t, alpha ? alpha[r] : 1.0f, ps[r], acc + r * ldacc + e0);
        }
    }
    for (int64_t r = 0; r < rows; r++)
        if (kind[r] == PV_EXACT)
            fa_kernels_ref.pv_small(1, cols, dv, s + r * lds, lds, vrow, FA_KV_I8, vscale, alpha ? alpha + r : NULL,
                                    acc + r * ldacc, ldacc);
}
