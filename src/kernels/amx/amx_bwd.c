/*
 * amx_bwd.c: the fused bf16 backward tile (kernels.h, bwd_bf16) on the tile unit,
 * written once against amx_tile.h and compiled twice as amx_kernels.c is: with
 * FA_AMX_HW (amx_bwd_hw.c, the "amx" table) and without (the software model, the
 * "amx-model" table). It shares amx_kernels.c's tile configuration (tiles_ensure).
 *
 * Every product is a row-major tile product C += A B, A as 16 rows of 32 bf16 along
 * the reduction, B as 16 pair rows of 16 dwords, in the same 2 x 2 register block as
 * amx_kernels.c (tiles 0..3 C, 4, 5 A, 6, 7 B):
 *   S    = Q K^T       A = Q rows, B = K^T (pack_kt_bf16's 1 KB blocks)
 *   dP   = dO V^T      A = dO rows, B = V^T (the same blocks)
 *   (vectors) P = exp(S scale - lse), dS = P (dP - D), each written as bf16 twice: dS
 *        row-major (dQ's A operand), and P, dS as pairs of query rows (the B operand
 *        of the transposed products below), two rows at a time, so no tile is transposed
 *   dQ  += dS K        A = dS rows, B = K as key pairs
 *   dV^T += dO^T P     A = dO^T (packed once per query block), B = P pairs
 *   dK^T += Q^T dS     A = Q^T, B = dS pairs
 * The two builds' vector steps compute the same bits: each lane as the named instruction
 * does (vfmadd, vmaxps, vrndscaleps, vscalefps, vcvtne2ps2bf16).
 */
#include "amx_tile.h"
#if defined(FA_AMX_HW)
#include "../avx512/avx512_internal.h"
#endif
#include "../half.h"
#include "../kernels.h"

#include <math.h>
#include <string.h>


#define BWD_LOG2E 1.44269504088896341f
#define BWD_TLO (-127.0f) /* 2^t below 2^-126: a subnormal, which bf16's conversion makes 0 */
/* 2^f on [-1/2, 1/2]: Taylor to degree 6 (relative error below 2^-23) */
#define BWD_E0 1.0f
#define BWD_E1 0.693147180559945f
#define BWD_E2 0.240226506959101f
#define BWD_E3 0.0555041086648216f
#define BWD_E4 0.00961812910762848f
#define BWD_E5 0.00133335581464284f
#define BWD_E6 0.000154035303933816f

void FA_AMX_FN(tiles_ensure)(void);
void FA_AMX_FN(bwd_bf16)(const fa_bwd_tile *t);

#if defined(FA_AMX_HW)
void fa_amx_pack_t_bf16(int64_t rows, int64_t len, const uint16_t *src, int64_t ld, uint16_t *dst, int64_t lddst);

/* pack_t_bf16 (kernels.h) in blocks of 32 rows x 32 columns: two 16 x 16 dword transposes
 * (dwords = column pairs), then each pair's low and high words gathered into the two
 * columns' rows. Only the hardware table takes it; the model keeps the reference's. */
void fa_amx_pack_t_bf16(int64_t rows, int64_t len, const uint16_t *src, int64_t ld, uint16_t *dst, int64_t lddst)
{
    uint16_t lo[32], hi[32];
    for (int i = 0; i < 32; i++) {
        lo[i] = (uint16_t)(i < 16 ? 2 * i : 32 + 2 * (i - 16));
        hi[i] = (uint16_t)(lo[i] + 1);
    }
    const __m512i ilo = _mm512_loadu_si512(lo), ihi = _mm512_loadu_si512(hi);
    const int64_t rp = FA_RUP32(rows);
    for (int64_t x0 = 0; x0 < len; x0 += 32) {
        const int64_t nx = len - x0 < 32 ? len - x0 : 32;
        const __mmask32 m = nx >= 32 ? ~(__mmask32)0 : ((__mmask32)1 << nx) - 1;
        for (int64_t r0 = 0; r0 < rp; r0 += 32) {
            __m512 a[16], b[16];
            for (int i = 0; i < 16; i++) {
                const int64_t ra = r0 + i, rb = r0 + 16 + i;
                a[i] = ra < rows ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, src + ra * ld + x0)) : _mm512_setzero_ps();
                b[i] = rb < rows ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, src + rb * ld + x0)) : _mm512_setzero_ps();
            }
            fa_avx512_transpose16(a);
            fa_avx512_transpose16(b);
            for (int64_t p = 0; p < 16 && 2 * p < nx; p++) {
                const __m512i pa = _mm512_castps_si512(a[p]), pb = _mm512_castps_si512(b[p]);
                _mm512_storeu_si512((void *)(dst + (x0 + 2 * p) * lddst + r0), _mm512_permutex2var_epi16(pa, ilo, pb));
                if (2 * p + 1 < nx)
                    _mm512_storeu_si512((void *)(dst + (x0 + 2 * p + 1) * lddst + r0),
                                        _mm512_permutex2var_epi16(pa, ihi, pb));
            }
        }
    }
}
#endif

/*
 * C += A B (zero: C = A B) over mb x nb blocks of 16 x 16: C block (i, j) at
 * c + 16 i ldc + 16 j (floats), except the last row block at ctail (ldtail) when that is
 * not NULL; A block (i, k) at a + 16 i lda + 32 k (uint16); B block (k, j) at
 * b + k bk + j bj, its pair rows ldb dwords apart; nk chunks of 32 along the reduction.
 */
static void tile_gemm(int64_t mb, int64_t nb, float *c, int64_t ldc, float *ctail, int64_t ldtail, int zero,
                      const uint16_t *a, int64_t lda, const uint32_t *b, int64_t bk, int64_t bj, int64_t ldb, int64_t nk)
{
    for (int64_t i = 0; i < mb; i += 2) {
        const int two_i = i + 1 < mb;
        float *ci[2];
        int64_t ldi[2];
        for (int u = 0; u < 2; u++) {
            const int tail = ctail && i + u == mb - 1;
            ci[u] = tail ? ctail : c + 16 * (i + u) * ldc;
            ldi[u] = tail ? ldtail : ldc;
        }
        const uint16_t *a0 = a + 16 * i * lda, *a1 = a0 + 16 * lda;
        for (int64_t j = 0; j < nb; j += 2) {
            const int two_j = j + 1 < nb;
            float *c0 = ci[0] + 16 * j, *c1 = ci[1] + 16 * j;
            if (zero) {
                FA_TILE_ZERO(TC0);
                if (two_j) FA_TILE_ZERO(TC1);
                if (two_i) FA_TILE_ZERO(TC2);
                if (two_i && two_j) FA_TILE_ZERO(TC3);
            } else {
                FA_TILE_LOAD(TC0, c0, 4 * ldi[0]);
                if (two_j) FA_TILE_LOAD(TC1, c0 + 16, 4 * ldi[0]);
                if (two_i) FA_TILE_LOAD(TC2, c1, 4 * ldi[1]);
                if (two_i && two_j) FA_TILE_LOAD(TC3, c1 + 16, 4 * ldi[1]);
            }
            const uint32_t *bj0 = b + j * bj;
            for (int64_t k = 0; k < nk; k++) {
                FA_TILE_LOAD(TA0, a0 + 32 * k, 2 * lda);
                FA_TILE_LOAD(TB0, bj0 + k * bk, 4 * ldb);
                FA_TILE_DPBF16(TC0, TA0, TB0);
                if (two_j) {
                    FA_TILE_LOAD(TB1, bj0 + k * bk + bj, 4 * ldb);
                    FA_TILE_DPBF16(TC1, TA0, TB1);
                }
                if (two_i) {
                    FA_TILE_LOAD(TA1, a1 + 32 * k, 2 * lda);
                    FA_TILE_DPBF16(TC2, TA1, TB0);
                    if (two_j) FA_TILE_DPBF16(TC3, TA1, TB1);
                }
            }
            FA_TILE_STORE(TC0, c0, 4 * ldi[0]);
            if (two_j) FA_TILE_STORE(TC1, c0 + 16, 4 * ldi[0]);
            if (two_i) FA_TILE_STORE(TC2, c1, 4 * ldi[1]);
            if (two_i && two_j) FA_TILE_STORE(TC3, c1 + 16, 4 * ldi[1]);
        }
    }
}

/* Where the vector step of one row pair writes: P and dS pairs (ldw dwords), dS rows (ldb uint16). */
typedef struct {
    const float *S, *dP;
    int64_t ldS;
    uint32_t *Pp, *dSp;
    uint16_t *dSb;
    int64_t ldb;
} bwd_rowbufs;

#if !defined(FA_AMX_HW)
/* vcvtne2ps2bf16's convert_fp32_to_bfloat16 (Intel SDM): zero and subnormal inputs give a
 * zero of their sign, a NaN its high word with the quiet bit set, else nearest even. */
static inline uint16_t bwd_cvtne(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* vscalefps on an integral n: x 2^n, rounded as a multiply would be */
static float bwd_scalef(float x, float n)
{
    if (x != x || n != n) return x + n;
    if (n > 300.0f) n = 300.0f;
    if (n < -300.0f) n = -300.0f;
    return ldexpf(x, (int)n);
}
#endif

/*
 * Rows r, r + 1 (r even) of the tile's P and dS, columns [0, ncv * 16): row r + u keeps
 * columns [a[u], z[u]] (empty for a row past rows or with lse = -inf).
 */
static void bwd_pair(const bwd_rowbufs *w, int64_t r, int64_t ncv, const int64_t a[2], const int64_t z[2], float c2,
                     const float mlog[2], const float dvec[2])
{
    for (int64_t v = 0; v < ncv; v++) {
        const uint16_t kp[2] = {fa_tile_lanes(a[0], z[0], 16 * v), fa_tile_lanes(a[1], z[1], 16 * v)};
#if defined(FA_AMX_HW)
        __m512 e[2], ds[2];
        for (int u = 0; u < 2; u++) {
            const float *s = w->S + (r + u) * w->ldS + 16 * v, *dp = w->dP + (r + u) * w->ldS + 16 * v;
            const __m512 t = _mm512_fmadd_ps(_mm512_loadu_ps(s), _mm512_set1_ps(c2), _mm512_set1_ps(-mlog[u]));
            const __m512 x = _mm512_max_ps(_mm512_set1_ps(BWD_TLO), t);
            const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_CUR_DIRECTION | _MM_FROUND_NO_EXC);
            const __m512 f = _mm512_sub_ps(x, n);
            __m512 q = _mm512_fmadd_ps(_mm512_set1_ps(BWD_E6), f, _mm512_set1_ps(BWD_E5));
            q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(BWD_E4));
            q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(BWD_E3));
            q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(BWD_E2));
            q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(BWD_E1));
            q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(BWD_E0));
            e[u] = _mm512_maskz_mov_ps(kp[u], _mm512_scalef_ps(q, n));
            ds[u] = _mm512_maskz_mul_ps(kp[u], e[u], _mm512_sub_ps(_mm512_loadu_ps(dp), _mm512_set1_ps(dvec[u])));
        }
        /* [row r | row r+1] as bf16, then interleaved into pairs of rows */
        const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                             6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        const __m512i pb = (__m512i)_mm512_cvtne2ps_pbh(e[1], e[0]);
        const __m512i db = (__m512i)_mm512_cvtne2ps_pbh(ds[1], ds[0]);
        _mm512_storeu_si512((void *)(w->Pp + (r / 2) * w->ldS + 16 * v), _mm512_permutexvar_epi16(idx, pb));
        _mm512_storeu_si512((void *)(w->dSp + (r / 2) * w->ldS + 16 * v), _mm512_permutexvar_epi16(idx, db));
        _mm256_storeu_si256((void *)(w->dSb + r * w->ldb + 16 * v), _mm512_castsi512_si256(db));
        _mm256_storeu_si256((void *)(w->dSb + (r + 1) * w->ldb + 16 * v), _mm512_extracti64x4_epi64(db, 1));
#else
        uint16_t pb[2][16], db[2][16];
        for (int u = 0; u < 2; u++)
            for (int i = 0; i < 16; i++) {
                if (!((kp[u] >> i) & 1u)) {
                    pb[u][i] = db[u][i] = 0;
                    continue;
                }
                const float s = w->S[(r + u) * w->ldS + 16 * v + i], dp = w->dP[(r + u) * w->ldS + 16 * v + i];
                const float t = fmaf(s, c2, -mlog[u]);
                const float x = BWD_TLO > t ? BWD_TLO : t;
                const float n = rintf(x), f = x - n;
                float q = fmaf(BWD_E6, f, BWD_E5);
                q = fmaf(q, f, BWD_E4);
                q = fmaf(q, f, BWD_E3);
                q = fmaf(q, f, BWD_E2);
                q = fmaf(q, f, BWD_E1);
                q = fmaf(q, f, BWD_E0);
                const float e = bwd_scalef(q, n);
                const float diff = dp - dvec[u];
                pb[u][i] = bwd_cvtne(e);
                db[u][i] = bwd_cvtne(e * diff);
            }
        for (int i = 0; i < 16; i++) {
            w->Pp[(r / 2) * w->ldS + 16 * v + i] = (uint32_t)pb[0][i] | (uint32_t)pb[1][i] << 16;
            w->dSp[(r / 2) * w->ldS + 16 * v + i] = (uint32_t)db[0][i] | (uint32_t)db[1][i] << 16;
        }
        memcpy(w->dSb + r * w->ldb + 16 * v, db[0], sizeof db[0]);
        memcpy(w->dSb + (r + 1) * w->ldb + 16 * v, db[1], sizeof db[1]);
#endif
    }
}

void FA_AMX_FN(bwd_bf16)(const fa_bwd_tile *t)
{
    FA_AMX_FN(tiles_ensure)();
    const int64_t rows = t->rows, cols = t->cols, d = t->d, dv = t->dv;
    const int64_t rp = FA_RUP32(rows), mb = FA_RUP16(rows) / 16, cp = FA_RUP16(cols), cq = FA_RUP32(cols), nb = cp / 16;
    const int64_t ldS = cp + 16; /* rows of 2^k floats would share a few L1 sets */
    float *S = ALIGN64(t->scratch);
    float *dP = ALIGN64(S + rp * ldS);
    uint32_t *Pp = ALIGN64(dP + rp * ldS);
    uint32_t *dSp = ALIGN64(Pp + rp / 2 * ldS);
    uint16_t *dSb = ALIGN64(dSp + rp / 2 * ldS);
    float *tail = ALIGN64(dSb + rp * cq);

    /* S = Q K^T and dP = dO V^T, row-major fp32 */
    tile_gemm(mb, nb, S, ldS, NULL, 0, 1, t->q, t->ldq, t->kt, 256, 16 * FA_KT_PAIRS(d), 16, FA_RUP32(d) / 32);
    tile_gemm(mb, nb, dP, ldS, NULL, 0, 1, t->dout, t->lddo, t->vt, 256, 16 * FA_KT_PAIRS(dv), 16, FA_RUP32(dv) / 32);

    /* P and dS, two rows at a time; rows past `rows` and columns past cols come out 0 */
    const bwd_rowbufs w = {S, dP, ldS, Pp, dSp, dSb, cq};
    const float c2 = t->scale * BWD_LOG2E;
    for (int64_t r = 0; r < rp; r += 2) {
        int64_t a[2], z[2];
        float mlog[2], dvr[2];
        for (int u = 0; u < 2; u++) {
            const int64_t row = r + u;
            const int live = row < rows && t->lse[row] != -INFINITY;
            a[u] = !live ? 1 : t->lo ? t->lo[row] : 0;
            z[u] = !live ? 0 : t->hi && t->hi[row] < cols - 1 ? t->hi[row] : cols - 1;
            mlog[u] = live ? t->lse[row] * BWD_LOG2E : 0.0f;
            dvr[u] = live ? t->dvec[row] : 0.0f;
        }
        bwd_pair(&w, r, nb, a, z, c2, mlog, dvr);
        if (cq > cp) {
            memset(dSb + r * cq + cp, 0, (size_t)(cq - cp) * 2);
            memset(dSb + (r + 1) * cq + cp, 0, (size_t)(cq - cp) * 2);
        }
    }

    /* dQ += dS K, a partial last row block through tail */
    if (t->dq) {
        const int64_t ep = FA_RUP16(d), part = rows % 16, r0 = rows - part;
        if (part)
            for (int64_t r = 0; r < 16; r++) {
                if (r < part) memcpy(tail + r * ep, t->dq + (r0 + r) * t->lddq, (size_t)d * 4);
                else memset(tail + r * ep, 0, (size_t)d * 4);
                memset(tail + r * ep + d, 0, (size_t)(ep - d) * 4);
            }
        tile_gemm(mb, ep / 16, t->dq, t->lddq, part ? tail : NULL, ep, 0, dSb, cq, t->kp, 16 * t->ldkp, 16, t->ldkp,
                  cq / 32);
        for (int64_t r = 0; r < part; r++) memcpy(t->dq + (r0 + r) * t->lddq, tail + r * ep, (size_t)d * 4);
    }
    /* dV^T += dO^T P and dK^T += Q^T dS, over the block's rows in chunks of 32 */
    if (t->dvt)
        tile_gemm(FA_RUP16(dv) / 16, nb, t->dvt, t->lddvt, NULL, 0, 0, t->dot, t->lddot, Pp, 16 * ldS, 16, ldS, rp / 32);
    if (t->dkt)
        tile_gemm(FA_RUP16(d) / 16, nb, t->dkt, t->lddkt, NULL, 0, 0, t->qt, t->ldqt, dSp, 16 * ldS, 16, ldS, rp / 32);
}
