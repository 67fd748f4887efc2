/*
 * avx512vnni_kernels.c: FA_PARAM_QUANT_MATMUL's decode kernels (kernels.h: qk_small_i8,
 * pv_small_i8, in one or two digits; docs/semantics.md, section 11) on AVX-512-VNNI's vpdpbusd, which adds to
 * each int32 lane the four products of an unsigned byte quad and a signed one. Built
 * with the avx512bf16 table's flags and -mavx512vnni: every CPU with AVX512_BF16 has
 * VNNI, and that table's predicate asks for both.
 *
 *   qk_small_i8  16 keys at a time, lanes along keys: each 64-byte vector of their K
 *                rows is transposed as dwords (fa_avx512_transpose16), so vector j holds
 *                bytes 4j..4j+3 of every key, and one vpdpbusd per query row and digit
 *                takes it with that row's four q bytes broadcast; the 16 sums of a row
 *                come out in one vector (no horizontal adds). vpdpbusd multiplies
 *                unsigned by signed bytes, and both q and K are signed, so K goes in as
 *                k + 128 (a byte's top bit flipped, exact for every int8) and 128 * sum_x
 *                q8[r][x] comes off each sum (int32 arithmetic wraps, so an intermediate
 *                may pass 2^31 for large d; the result is exact). The transpose (4 shuffles
 *                per key and 64 bytes) is shared by the rows; it replaced per-(row, key)
 *                accumulators summed by an add tree, which cost ~3 uops per score.
 *   qk_i8_64x6   the wide tiles' step 1 (kernels.h's qk_i8), qk_bf16's register block on
 *                codes: vectors of 16 query rows of Q^T quads (q + 128, the unsigned
 *                operand), each key's dword of four codes broadcast (the signed one), 64
 *                rows x 6 keys of int32 accumulators, each starting at -128 * ksum[c].
 *   pv_small_i8  the reduction runs along keys, so V is taken four keys at a time and
 *                byte-interleaved (vpunpck: each dword holds the four keys' bytes of one
 *                e), into a buffer of 32 keys (8 quads) x dv that stays in L1; then each
 *                (row, e) int32 accumulator takes one vpdpbusd per quad with the row's
 *                four u8 weights broadcast. The interleave leaves e permuted within each
 *                64-byte block (dword j of lane L of vector k holds e = 16 L + 4 k + j);
 *                the sums are put back in order (a 4 x 4 transpose of 128-bit lanes) when
 *                they are scaled into acc. Two digits run the dot products twice over the
 *                same K vectors and the same interleaved V.
 * Both give the reference's bits: the integer sums are exact and the f32 steps are the
 * contract's, in its order (vcvtps2dq rounds to nearest even, as nearbyintf does in the
 * default rounding mode the library runs in).
 */
#include "avx512_internal.h"
#include "../i8_rows.h"

#include <math.h>
#include <string.h>

/* PV_EBIG_LD: the rows of the sum and interleave buffers a cache line more than a
 * multiple of 1 KB apart, so they do not fall into a few L1 sets */
enum { I8_PF = 32, PV_CHUNK = 32, PV_PF = 2 * PV_CHUNK, PV_EBIG = 512, PV_EBIG_LD = PV_EBIG + 16 };

/* ------------------------------------------------------------------- q . k */

/* acc + the dot products of u8 and s8 quads: vpdpbusd with its accumulator tied to the
 * output. GCC's builtin (12) leaves the accumulator untied, and in a block of 24 of them
 * the copies and spills it then makes outnumber the products. */
FA_AVX512_INLINE __m512i dpbusd_tied(__m512i acc, __m512i u8, __m512i s8)
{
#if defined(__GNUC__) && !defined(__clang__)
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8));
    return acc;
#else
    return _mm512_dpbusd_epi32(acc, u8, s8);
#endif
}

FA_AVX512_INLINE void qk_i8_body(const int R, const int T, int64_t cols, int64_t d, const int8_t *q8, int64_t ldq8,
                                 const float *qscale, const void *const *krow, const float *kscale, float *s,
                                 int64_t lds)
{
    const int64_t nv = fa_q8_ld(d) / 64;
    const __mmask64 tail = d % 64 ? (__mmask64)((UINT64_C(1) << (d % 64)) - 1) : ~(__mmask64)0;
    const __m512i flip = _mm512_set1_epi8((char)0x80), ones = _mm512_set1_epi8(1);
    /* 128 * sum_x of each digit row: what k + 128 adds */
    __m512i corr[FA_SMALL_ROWS][2];
    FA_AVX512_UNROLL
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            const int8_t *qr = q8 + (r * T + t) * ldq8;
            __m512i z = _mm512_setzero_si512();
            for (int64_t v = 0; v < nv; v++) z = _mm512_dpbusd_epi32(z, ones, _mm512_load_si512(qr + 64 * v));
            corr[r][t] = _mm512_set1_epi32(128 * _mm512_reduce_add_epi32(z));
        }
    _Alignas(64) __m512i kt[16];
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
        const int64_t nc = cols - c0 < 16 ? cols - c0 : 16;
        for (int64_t c = c0 + I8_PF; c < c0 + I8_PF + 16 && c < cols; c++)
            for (int64_t x = 0; x < d; x += 64) _mm_prefetch((const char *)krow[c] + x, _MM_HINT_T0);
        __m512i acc[FA_SMALL_ROWS][2];
        FA_AVX512_UNROLL
        for (int r = 0; r < R; r++)
            for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_si512();
        for (int64_t v = 0; v < nv; v++) {
            /* 16 keys' 64-byte vectors transposed as dwords: kt[j] lane c = bytes 4j..4j+3 of key c,
             * flipped to k + 128 (keys past cols read as zero: they add 128 * q, which corr takes off) */
            const __mmask64 m = v + 1 < nv ? ~(__mmask64)0 : tail;
            __m512 t16[16];
            if (nc == 16 && v + 1 < nv)
                for (int64_t c = 0; c < 16; c++) t16[c] = _mm512_loadu_ps((const int8_t *)krow[c0 + c] + 64 * v);
            else
                for (int64_t c = 0; c < 16; c++)
                    t16[c] = _mm512_castsi512_ps(c < nc ? _mm512_maskz_loadu_epi8(m, (const int8_t *)krow[c0 + c] + 64 * v)
                                                        : _mm512_setzero_si512());
            fa_avx512_transpose16(t16);
            for (int jj = 0; jj < 16; jj++) _mm512_store_si512(&kt[jj], _mm512_xor_si512(_mm512_castps_si512(t16[jj]), flip));
            for (int jj = 0; jj < 16; jj++) {
                const __m512i ku = _mm512_load_si512(&kt[jj]);
                FA_AVX512_UNROLL
                for (int r = 0; r < R; r++)
                    for (int t = 0; t < T; t++) {
                        int32_t qd;
                        memcpy(&qd, q8 + (r * T + t) * ldq8 + 64 * v + 4 * jj, 4);
                        acc[r][t] = dpbusd_tied(acc[r][t], ku, _mm512_set1_epi32(qd));
                    }
            }
        }
        const __mmask16 mk = fa_avx512_head_mask(nc);
        const __m512 ks = _mm512_maskz_loadu_ps(mk, kscale + c0);
        FA_AVX512_UNROLL
        for (int r = 0; r < R; r++) {
            __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][0], corr[r][0]));
            if (T == 2)
                dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][1], corr[r][1])),
                                      _mm512_set1_ps(0x1p-8f), dot);
            const __m512 sc = _mm512_mul_ps(_mm512_set1_ps(qscale[r]), ks);
            _mm512_store_ps(s + r * lds + c0, _mm512_mul_ps(dot, sc));
        }
    }
}

_Static_assert(FA_SMALL_ROWS == 8, "i8_rows.h makes one function per row count 1..8");
FA_I8_QK_ENTRY(qk_i8_body, fa_avx512vnni_qk_small_i8)

/* -------------------------------------------------------- q . k, wide tiles */

enum { QKI_NV = 4, QKI_NC = 6 };

#define MIN64(a, b) ((a) < (b) ? (a) : (b))

/* st[c][16i..] = the scores of keys c < valid <= nc (a padded tile repeats its last key
 * and never stores it) for row vectors i < nv, over the nq quads of d. */
FA_AVX512_INLINE void qki_tile(const int nv, const int nc, int64_t valid, int64_t nq, const uint32_t *qt, int64_t ld32,
                               const int8_t *k, int64_t ldk, const float *qs, const float *qc, const float *ks,
                               const int32_t *ksum, float *st, int64_t ldst)
{
    __m512i acc[QKI_NC][QKI_NV];
    const int8_t *kc[QKI_NC];
    FA_AVX512_UNROLL
    for (int j = 0; j < nc; j++) {
        const int64_t c = MIN64(j, valid - 1);
        kc[j] = k + c * ldk;
        /* the sums start at -128 ksum: what q's +128 adds (int32 wraps, the end is exact) */
        const __m512i corr = _mm512_set1_epi32((int32_t)(-128 * (int64_t)ksum[c]));
        FA_AVX512_UNROLL
        for (int i = 0; i < nv; i++) acc[j][i] = corr;
    }
    for (int64_t p = 0; p < nq; p++) {
        const uint32_t *qp = qt + p * ld32;
        __m512i qv[QKI_NV];
        FA_AVX512_UNROLL
        for (int i = 0; i < nv; i++) qv[i] = _mm512_load_si512(qp + 16 * i);
        FA_AVX512_UNROLL
        for (int j = 0; j < nc; j++) {
            int32_t w;
            memcpy(&w, kc[j] + 4 * p, sizeof w);
            const __m512i kb = _mm512_set1_epi32(w);
            FA_AVX512_UNROLL
            for (int i = 0; i < nv; i++) acc[j][i] = dpbusd_tied(acc[j][i], qv[i], kb);
        }
    }
    __m512 qsv[QKI_NV], qcv[QKI_NV];
    FA_AVX512_UNROLL
    for (int i = 0; i < nv; i++) {
        qsv[i] = _mm512_load_ps(qs + 16 * i);
        qcv[i] = qc ? _mm512_load_ps(qc + 16 * i) : _mm512_setzero_ps();
    }
    FA_AVX512_UNROLL
    for (int j = 0; j < nc; j++) {
        if (j >= valid) break;
        const __m512 kv = _mm512_set1_ps(ks[j]);
        FA_AVX512_UNROLL
        for (int i = 0; i < nv; i++) {
            const __m512 dot = _mm512_cvtepi32_ps(acc[j][i]);
            __m512 sv = _mm512_mul_ps(dot, _mm512_mul_ps(qsv[i], kv));
            if (qc) sv = _mm512_add_ps(sv, qcv[i]);
            _mm512_store_ps(st + j * ldst + 16 * i, sv);
        }
    }
}

typedef struct {
    int64_t nq, cols;
    const uint32_t *qt;
    int64_t ld32;
    const int8_t *k;
    int64_t ldk;
    const float *qs, *qc, *ks;
    const int32_t *ksum;
    float *st;
    int64_t ldst;
} qki_args;

/* 6-key tiles, then 5-key ones (fa_avx512_split65) */
FA_AVX512_INLINE void qki_panel(const int nv, const qki_args *a)
{
    const int64_t c6 = fa_avx512_split65(a->cols);
    for (int64_t c = 0; c < c6; c += QKI_NC)
        qki_tile(nv, QKI_NC, MIN64(QKI_NC, c6 - c), a->nq, a->qt, a->ld32, a->k + c * a->ldk, a->ldk, a->qs, a->qc,
                 a->ks + c, a->ksum + c, a->st + c * a->ldst, a->ldst);
    for (int64_t c = c6; c < a->cols; c += QKI_NC - 1)
        qki_tile(nv, QKI_NC - 1, QKI_NC - 1, a->nq, a->qt, a->ld32, a->k + c * a->ldk, a->ldk, a->qs, a->qc,
                 a->ks + c, a->ksum + c, a->st + c * a->ldst, a->ldst);
}

/* One function per panel height, as the other register-blocked kernels. */
static void qki_panel4(const qki_args *a) { qki_panel(4, a); }
static void qki_panel3(const qki_args *a) { qki_panel(3, a); }
static void qki_panel2(const qki_args *a) { qki_panel(2, a); }
static void qki_panel1(const qki_args *a) { qki_panel(1, a); }

void fa_avx512vnni_qk_i8_64x6(int64_t rows, int64_t cols, int64_t d, const uint32_t *qt4, int64_t ldqt4,
                              const float *qs, const float *qc, const int8_t *k8, int64_t ldk8, const float *ks,
                              const int32_t *ksum, float *st, int64_t ldst)
{
    static void (*const panel[QKI_NV + 1])(const qki_args *) = {NULL, qki_panel1, qki_panel2, qki_panel3,
                                                                qki_panel4};
    const int64_t nvec = (rows + 15) / 16;
    for (int64_t v0 = 0; v0 < nvec; v0 += QKI_NV) {
        const int64_t nv = MIN64(QKI_NV, nvec - v0);
        const qki_args a = {FA_QT4_QUADS(d), cols, qt4 + 16 * v0, ldqt4, k8, ldk8, qs + 16 * v0,
                            qc ? qc + 16 * v0 : NULL, ks, ksum, st + 16 * v0, ldst};
        panel[nv](&a);
    }
}

/* ------------------------------------------------------------------- p . v */

/* Four keys' 64-byte V vectors at e0 (zero past dv, and for keys past cols: v == NULL)
 * byte-interleaved into four dword vectors: out[k] lane L dword j = the four keys' e =
 * e0 + 16 L + 4 k + j. */
FA_AVX512_INLINE void interleave4(const int8_t *const v[4], int64_t e0, __mmask64 m, __m512i out[4])
{
    __m512i x[4];
    for (int i = 0; i < 4; i++) x[i] = v[i] ? _mm512_maskz_loadu_epi8(m, v[i] + e0) : _mm512_setzero_si512();
    const __m512i t0 = _mm512_unpacklo_epi8(x[0], x[1]), t1 = _mm512_unpackhi_epi8(x[0], x[1]);
    const __m512i t2 = _mm512_unpacklo_epi8(x[2], x[3]), t3 = _mm512_unpackhi_epi8(x[2], x[3]);
    out[0] = _mm512_unpacklo_epi16(t0, t2);
    out[1] = _mm512_unpackhi_epi16(t0, t2);
    out[2] = _mm512_unpacklo_epi16(t1, t3);
    out[3] = _mm512_unpackhi_epi16(t1, t3);
}

/* isum[r][e] += sum over the nq quads of u[r][quad] . vp[quad][e] for R rows, e < ne (a
 * multiple of 64), 4 vectors of e at a time in registers. */
FA_AVX512_INLINE void pv_i8_rows(const int R, int64_t nq, int64_t ne, const uint8_t *u, int64_t ldu,
                                 const int32_t *vp, int64_t ldvp, int32_t *isum, int64_t ldis)
{
    for (int64_t e = 0; e < ne; e += 64) {
        __m512i acc[4][4];
        FA_AVX512_UNROLL
        for (int r = 0; r < R; r++)
            for (int k = 0; k < 4; k++) acc[r][k] = _mm512_load_si512(isum + r * ldis + e + 16 * k);
        for (int64_t qd = 0; qd < nq; qd++) {
            const int32_t *vq = vp + qd * ldvp + e;
            const __m512i v0 = _mm512_load_si512(vq), v1 = _mm512_load_si512(vq + 16);
            const __m512i v2 = _mm512_load_si512(vq + 32), v3 = _mm512_load_si512(vq + 48);
            FA_AVX512_UNROLL
            for (int r = 0; r < R; r++) {
                int32_t w;
                memcpy(&w, u + r * ldu + 4 * qd, 4);
                const __m512i b = _mm512_set1_epi32(w);
                acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], b, v0);
                acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], b, v1);
                acc[r][2] = _mm512_dpbusd_epi32(acc[r][2], b, v2);
                acc[r][3] = _mm512_dpbusd_epi32(acc[r][3], b, v3);
            }
        }
        FA_AVX512_UNROLL
        for (int r = 0; r < R; r++)
            for (int k = 0; k < 4; k++) _mm512_store_si512(isum + r * ldis + e + 16 * k, acc[r][k]);
    }
}

static void pv_i8_group(int rows, int64_t nq, int64_t ne, const uint8_t *u, int64_t ldu, const int32_t *vp,
                        int64_t ldvp, int32_t *isum, int64_t ldis)
{
    switch (rows) {
    case 1: pv_i8_rows(1, nq, ne, u, ldu, vp, ldvp, isum, ldis); break;
    case 2: pv_i8_rows(2, nq, ne, u, ldu, vp, ldvp, isum, ldis); break;
    case 3: pv_i8_rows(3, nq, ne, u, ldu, vp, ldvp, isum, ldis); break;
    default: pv_i8_rows(4, nq, ne, u, ldu, vp, ldvp, isum, ldis); break;
    }
}

/* 64 sums in interleave4's order (dword j of lane L of vector k: e = 16 L + 4 k + j) as
 * floats in e order: a 4 x 4 transpose of 128-bit lanes. */
FA_AVX512_INLINE void unpermute(const int32_t *is, __m512 out[4])
{
    const __m512i A0 = _mm512_load_si512(is), A1 = _mm512_load_si512(is + 16);
    const __m512i A2 = _mm512_load_si512(is + 32), A3 = _mm512_load_si512(is + 48);
    const __m512i T0 = _mm512_shuffle_i32x4(A0, A1, 0x44), T1 = _mm512_shuffle_i32x4(A0, A1, 0xEE);
    const __m512i T2 = _mm512_shuffle_i32x4(A2, A3, 0x44), T3 = _mm512_shuffle_i32x4(A2, A3, 0xEE);
    out[0] = _mm512_cvtepi32_ps(_mm512_shuffle_i32x4(T0, T2, 0x88));
    out[1] = _mm512_cvtepi32_ps(_mm512_shuffle_i32x4(T0, T2, 0xDD));
    out[2] = _mm512_cvtepi32_ps(_mm512_shuffle_i32x4(T1, T3, 0x88));
    out[3] = _mm512_cvtepi32_ps(_mm512_shuffle_i32x4(T1, T3, 0xDD));
}

/* Row kinds of one call (kernels.h's rule) */
enum { PV_QUANT = 0, PV_ZERO = 1, PV_EXACT = 2 };
enum { PV_LDU = FA_SMALL_COLS + 64 };

/* One row of the weights: w = p * vs, checked, its kind, and for a PV_QUANT row its u8
 * codes u0 (u1 the second digit's) and scale *ps; u0 and u1 are zeroed first (zero past
 * cols, to whole quads) */
static int quantise_p_row(int64_t cols, int digits, const float *sr, const float *vscale, uint8_t *u0, uint8_t *u1,
                          float *ps)
{
    const __m512 inf = _mm512_set1_ps(INFINITY), zero = _mm512_setzero_ps();
    __m512 mx = zero;
    __mmask16 bad = 0;
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
        const __mmask16 m = fa_avx512_head_mask(cols - c0);
        const __m512 w = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, sr + c0), _mm512_maskz_loadu_ps(m, vscale + c0));
        const __mmask16 ok = _mm512_cmp_ps_mask(w, zero, _CMP_GE_OQ) & _mm512_cmp_ps_mask(w, inf, _CMP_LT_OQ);
        bad |= m & (__mmask16)~ok;
        mx = _mm512_max_ps(mx, w);
    }
    const float wmax = _mm512_reduce_max_ps(mx);
    const int kind = bad || (wmax > 0.0f && wmax < FA_PV_I8_WMIN) ? PV_EXACT : wmax == 0.0f ? PV_ZERO : PV_QUANT;
    memset(u0, 0, PV_LDU), memset(u1, 0, PV_LDU);
    if (kind != PV_QUANT) return kind;
    *ps = wmax / 255.0f;
    const __m512 inv = _mm512_set1_ps(255.0f / wmax), top = _mm512_set1_ps(255.0f);
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
        const __mmask16 m = fa_avx512_head_mask(cols - c0);
        const __m512 w = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, sr + c0), _mm512_maskz_loadu_ps(m, vscale + c0));
        const __m512 y = _mm512_mul_ps(w, inv);
        /* fa_u8_digits: nearest even (one digit), or floor and the residual's nearest in 2^-8 */
        const __m512 h = digits == 2 ? _mm512_roundscale_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
                                     : _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_store_si128((__m128i *)(u0 + c0), _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(_mm512_min_ps(h, top))));
        if (digits == 2) {
            const __m512 l = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(y, h), _mm512_set1_ps(256.0f)),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm_store_si128((__m128i *)(u1 + c0), _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(_mm512_min_ps(l, top))));
        }
    }
    return kind;
}

/* V's keys c0.. (nq quads, zero past cols), e0..e0+ne, byte-interleaved into vpdpbusd's
 * layout: vp[qd] holds quad qd's four keys' bytes of each e in one dword */
static void pair_v_chunk(const void *const *vrow, int64_t c0, int64_t cols, int64_t nq, int64_t e0, int64_t ne,
                         int64_t nep, int32_t (*vp)[PV_EBIG_LD])
{
    for (int64_t qd = 0; qd < nq; qd++) {
        const int8_t *v4[4];
        for (int i = 0; i < 4; i++) {
            const int64_t c = c0 + 4 * qd + i;
            v4[i] = c < cols ? (const int8_t *)vrow[c] + e0 : NULL;
        }
        for (int64_t e = 0; e < nep; e += 64) {
            const __mmask64 m = ne - e >= 64 ? ~(__mmask64)0 : (__mmask64)((UINT64_C(1) << (ne - e)) - 1);
            __m512i o[4];
            interleave4(v4, e, m, o);
            for (int k = 0; k < 4; k++) _mm512_store_si512(vp[qd] + e + 16 * k, o[k]);
        }
    }
}

/* One row's integer sums is_t[t] (digits of them) into its ne accumulators:
 * ar = fma(ps, float(sum), alpha * ar), the sums back in e order; alpha * ar for a PV_ZERO row */
static void add_row_sums(int64_t ne, int64_t nep, int digits, int kind, const int32_t *const is_t[2], float alpha,
                         float ps, float *ar)
{
    const __m512 a = _mm512_set1_ps(alpha), p = _mm512_set1_ps(ps);
    for (int64_t e = 0; e < nep; e += 64) {
        __m512 dot[4];
        unpermute(is_t[0] + e, dot);
        if (digits == 2) {
            __m512 lo[4];
            unpermute(is_t[1] + e, lo);
            for (int k = 0; k < 4; k++) dot[k] = _mm512_fmadd_ps(lo[k], _mm512_set1_ps(0x1p-8f), dot[k]);
        }
        for (int k = 0; k < 4; k++) {
            const int64_t eo = e + 16 * k;
            if (eo >= ne) break;
            const __mmask16 m = fa_avx512_head_mask(ne - eo);
            const __m512 x = _mm512_mul_ps(a, _mm512_maskz_loadu_ps(m, ar + eo));
            const __m512 y = kind == PV_ZERO ? x : _mm512_fmadd_ps(p, dot[k], x);
            _mm512_mask_storeu_ps(ar + eo, m, y);
        }
    }
}

void fa_avx512vnni_pv_small_i8(int64_t rows, int64_t cols, int64_t dv, int digits, const float *s, int64_t lds,
                               const void *const *vrow, const float *vscale, const float *alpha, float *acc,
                               int64_t ldacc, const fa_rows_ahead *ahead)
{
    _Alignas(64) uint8_t u[2][FA_SMALL_ROWS][PV_LDU]; /* the weights' digits */
    _Alignas(64) int32_t vp[PV_CHUNK / 4][PV_EBIG_LD];
    _Alignas(64) int32_t isum[2][FA_SMALL_ROWS][PV_EBIG_LD];
    float ps[FA_SMALL_ROWS];
    int kind[FA_SMALL_ROWS];

    for (int64_t r = 0; r < rows; r++)
        kind[r] = quantise_p_row(cols, digits, s + r * lds, vscale, u[0][r], u[1][r], &ps[r]);

    for (int64_t e0 = 0; e0 < dv; e0 += PV_EBIG) {
        const int64_t ne = dv - e0 < PV_EBIG ? dv - e0 : PV_EBIG, nep = (ne + 63) / 64 * 64;
        for (int t = 0; t < digits; t++)
            for (int64_t r = 0; r < rows; r++) memset(isum[t][r], 0, (size_t)nep * sizeof(int32_t));
        for (int64_t c0 = 0; c0 < cols; c0 += PV_CHUNK) {
            const int64_t nq = ((cols - c0 < PV_CHUNK ? cols - c0 : PV_CHUNK) + 3) / 4;
            /* the rows PV_PF ahead (from the first chunk, all of them up to there), as
             * qk_small_i8 prefetches K's (a stream the hardware prefetchers do not see: rows a
             * row of heads or a page apart); one chunk ahead came too late from DRAM */
            for (int64_t c = c0 ? c0 + PV_PF : PV_CHUNK; c < c0 + PV_PF + PV_CHUNK && c < cols; c++)
                for (int64_t e = 0; e < ne; e += 64) _mm_prefetch((const char *)vrow[c] + e0 + e, _MM_HINT_T0);
            /* the share of `ahead` that falls to this chunk, towards L2 (with the first e block) */
            if (ahead && e0 == 0)
                for (int64_t j = c0 * ahead->n / cols; j < (c0 + PV_CHUNK) * ahead->n / cols && j < ahead->n; j++)
                    for (const char *b = (const char *)((uintptr_t)ahead->row[j] & ~(uintptr_t)63);
                         b < (const char *)ahead->row[j] + ahead->bytes; b += 64)
                        _mm_prefetch(b, _MM_HINT_T1);
            pair_v_chunk(vrow, c0, cols, nq, e0, ne, nep, vp);
            for (int t = 0; t < digits; t++)
                for (int64_t r = 0; r < rows; r += 4)
                    pv_i8_group((int)(rows - r < 4 ? rows - r : 4), nq, nep, u[t][r] + c0, PV_LDU, vp[0], PV_EBIG_LD,
                                isum[t][r], PV_EBIG_LD);
        }
        for (int64_t r = 0; r < rows; r++) {
            if (kind[r] == PV_EXACT) continue;
            const int32_t *const is_t[2] = {isum[0][r], isum[1][r]};
            add_row_sums(ne, nep, digits, kind[r], is_t, alpha ? alpha[r] : 1.0f, ps[r], acc + r * ldacc + e0);
        }
    }
    /* the rows the contract leaves to the exact kernel */
    for (int64_t r = 0; r < rows; r++)
        if (kind[r] == PV_EXACT)
            fa_kernels_ref.pv_small(1, cols, dv, s + r * lds, lds, vrow, FA_KV_I8, vscale, alpha ? alpha + r : NULL,
                                    acc + r * ldacc, ldacc);
}

/* quant_row_i8 (kernels.h): fa_quant_row_i8's steps on 16 lanes, the same bits: the
 * max of |x| with a NaN sticky (vmaxps drops it, so a flag keeps it), y = x * inv (0
 * past n, and everywhere for a non-finite row), vrndscaleps to nearest even, then the
 * clamp to [-127, 127] in fa_f32_to_i8's order (vmaxps returns its second operand for a
 * NaN, so a NaN code is -127 there as here). */
static inline __m128i quant_codes16(__m512 y)
{
    __m512 r = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
    return _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r));
}

float fa_avx512vnni_quant_row_i8(const float *x, int64_t n, int digits, int8_t *code)
{
    const __m512 abs = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    __m512 vmax = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (int64_t e = 0; e < n; e += 16) {
        const __mmask16 m = n - e >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - e)) - 1u);
        const __m512 a = _mm512_and_ps(_mm512_maskz_loadu_ps(m, x + e), abs);
        nan |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
        vmax = _mm512_max_ps(vmax, a);
    }
    const float amax = nan ? NAN : _mm512_reduce_max_ps(vmax);
    const int finite = isfinite(amax);
    const float scale = finite ? amax / 127.0f : NAN;
    const float inv = finite && scale > 0.0f ? 1.0f / scale : 0.0f;
    const int64_t ld = fa_q8_ld(n);
    const __m512 vinv = _mm512_set1_ps(inv);
    for (int64_t e = 0; e < ld; e += 16) {
        const __mmask16 m = !finite || e >= n ? 0 : n - e >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - e)) - 1u);
        const __m512 y = _mm512_maskz_mul_ps(m, _mm512_maskz_loadu_ps(m, x + e), vinv);
        const __m128i a = quant_codes16(y);
        _mm_storeu_si128((__m128i *)(code + e), a);
        if (digits == 2) /* the residual in 2^-8 (y - a exact) */
            _mm_storeu_si128((__m128i *)(code + ld + e),
                             quant_codes16(_mm512_mul_ps(_mm512_sub_ps(y, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(a))),
                                                         _mm512_set1_ps(256.0f))));
    }
    return scale;
}
