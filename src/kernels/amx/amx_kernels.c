/*
 * amx_kernels.c: the bf16 products on tiles, written once against amx_tile.h and
 * compiled twice: with FA_AMX_HW (amx_hw.c: Intel's intrinsics, the "amx" table) and
 * without (the software model of amx_model.c, the "amx-model" table, built with no
 * ISA flags so it runs and is tested on any x86-64). Contracts: kernels.h.
 *
 * One tile configuration for every kernel, loaded once per thread by thread_begin
 * (ldtilecfg per call costs more than a small product): palette 1, all eight tiles
 * 16 rows x 64 bytes. Blocks smaller than a tile are zero-padded copies in scratch,
 * so the unit never reads past a caller's buffer and a K/V/x element beyond d, cols
 * or rows (garbage, NaN) never meets a product. Register use, the same 2 x 2 block
 * in every kernel (four loads feed four products):
 *   tiles 0..3  C: fp32 16 x 16 accumulators, block (i, j) = tile 2i + j
 *   tiles 4, 5  A: 16 rows x 32 bf16 (the reduction runs along the row)
 *   tiles 6, 7  B: 16 pair rows x 16 dwords (pairs along the reduction)
 *
 *   qk_bf16   S^T[c][r] = K[c][.] . Q^T[.][r]: A = 16 K rows (natural layout), B = 16
 *             pair rows of qt2 (already the B layout); scale applied to the stored
 *             fp32 sums, as the contract says. Q^T's tiles of a 32-row block are
 *             reloaded from L1 while K streams.
 *   pv_bf16   acc[r][e] += P[r][.] . V[.][e]: A = P, which st holds transposed, so
 *             P is rounded to bf16 and transposed into scratch once per call; B = V
 *             pairs as given. acc is scaled by alpha on the vector side, loaded into
 *             tiles once, accumulated over every column of the call, stored once.
 *   stx_bf16  acc[c][e] += st[c][.] . x[.][e]: A = st rows rounded to bf16 (their
 *             natural layout), B = x as row pairs (packed here).
 * Glue (rounding, pairing, copies) is plain C the compiler vectorises under the
 * hardware build's AVX-512 flags; only P's transpose has an intrinsic form there.
 */
#include "amx_tile.h"
#if defined(FA_AMX_HW)
#include "../avx512/avx512_internal.h"
#endif
#include "../half.h"
#include "../kernels.h"

#include <string.h>

/* Tile numbers: macros, not enum constants (gcc's intrinsics paste them into the
 * instruction's text, after macro expansion). */
#define TC0 0
#define TC1 1
#define TC2 2
#define TC3 3
#define TA0 4
#define TA1 5
#define TB0 6
#define TB1 7

#define MIN64(a, b) ((a) < (b) ? (a) : (b))
#define R16(x) (((x) + 15) / 16 * 16)
#define R32(x) (((x) + 31) / 32 * 32)
#define ALIGN64(p) ((void *)(((uintptr_t)(p) + 63) & ~(uintptr_t)63))

/* The entry points (the table file, built without flags, puts them in its table). */
void FA_AMX_FN(thread_begin)(void);
void FA_AMX_FN(thread_end)(void);
int FA_AMX_FN(tile_configured)(void);
double FA_AMX_FN(probe_tile)(int64_t iters);
void FA_AMX_FN(qk_bf16)(int64_t rows, int64_t cols, int64_t d, const uint16_t *qt2, int64_t ldqt2, const uint16_t *k,
                        int64_t ldk, float scale, float *st, int64_t ldst);
void FA_AMX_FN(pv_bf16)(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const uint32_t *vp,
                        int64_t ldvp, const float *alpha, float *acc, int64_t ldacc, void *scratch);
void FA_AMX_FN(stx_bf16)(int64_t rows, int64_t cols, int64_t n, const float *st, int64_t ldst, const uint16_t *x,
                         int64_t ldx, float *acc, int64_t ldacc, void *scratch);

/* ------------------------------------------------------------ the thread's tiles */

/* A constant in memory: gcc does not see ldtilecfg read its operand, and drops the
 * stores that would fill a configuration built on the stack. */
static _Alignas(64) const fa_tilecfg g_tiles = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

void FA_AMX_FN(thread_begin)(void) { FA_TILE_CONFIG(&g_tiles); }

void FA_AMX_FN(thread_end)(void) { FA_TILE_RELEASE(); }

/* Whether the calling thread holds a tile configuration (tests: none after a call). */
int FA_AMX_FN(tile_configured)(void)
{
    _Alignas(64) fa_tilecfg cfg;
    memset(&cfg, 0xff, sizeof cfg);
    FA_TILE_STORECONFIG(&cfg);
    return cfg.palette != 0;
}

/* ------------------------------------------------------------------- glue */

/* fa_f32_to_bf16 (half.h) in a form that vectorises: nearest even, NaN quieted. */
static inline uint16_t round_bf16(uint32_t u)
{
    const uint32_t rn = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rn);
}

/* dst[i] = bf16(src[i]) for i < n, 0 for n <= i < len. */
static void round_row(const float *restrict src, int64_t n, uint16_t *restrict dst, int64_t len)
{
    const uint32_t *s = (const void *)src;
    for (int64_t i = 0; i < n; i++) dst[i] = round_bf16(s[i]);
    for (int64_t i = n; i < len; i++) dst[i] = 0;
}

/* 16 dwords (32 bf16) from src, zero-filled past n bf16. */
static void copy_row64(uint16_t *restrict dst, const uint16_t *restrict src, int64_t n)
{
    if (n >= 32) {
        memcpy(dst, src, 64);
        return;
    }
    memcpy(dst, src, (size_t)n * 2);
    memset(dst + n, 0, (size_t)(32 - n) * 2);
}

/* ---------------------------------------------------------------- qk_bf16 */

/* dst[c][0..16) = scale * src[c][0..16) for c < n (src == dst allowed: one row at a time). */
static void scale_rows(int64_t n, const float *src, int64_t lds, float scale, float *dst, int64_t ldd)
{
    for (int64_t c = 0; c < n; c++) {
        float row[16];
        memcpy(row, src + c * lds, sizeof row);
        for (int r = 0; r < 16; r++) row[r] *= scale;
        memcpy(dst + c * ldd, row, sizeof row);
    }
}

/*
 * st[c][r] = scale * sum_x q[r][x] k[c][x] for c < cols, r < round16(rows). Per
 * 32-row block (two B tiles) and 32-column block (two A tiles), the 2 x 2 C tiles run
 * over d in 32-element chunks. A chunk of K comes from the caller's rows when all 16
 * rows exist, the chunk lies inside d and ldk > 0 (the tile's stride); otherwise from
 * a zero-padded copy. Q^T's last chunk, when ceil(d/2) is not a multiple of 16, is
 * copied once per row block; a column block past cols stores through a buffer.
 */
void FA_AMX_FN(qk_bf16)(int64_t rows, int64_t cols, int64_t d, const uint16_t *qt2, int64_t ldqt2, const uint16_t *k,
                        int64_t ldk, float scale, float *st, int64_t ldst)
{
    _Alignas(64) uint16_t kbuf[2][16 * 32];
    _Alignas(64) uint32_t qbuf[2][16 * 16];
    _Alignas(64) float sbuf[16 * 16];
    const uint32_t *qt = (const void *)qt2;
    const int64_t ld32 = ldqt2 / 2, pairs = (d + 1) / 2, nxc = (d + 31) / 32, full_q = pairs / 16;
    const int64_t nrb = (rows + 15) / 16, ncb = (cols + 15) / 16;
    const int k_direct = ldk > 0;
    for (int64_t rb = 0; rb < nrb; rb += 2) {
        const int two_r = rb + 1 < nrb;
        if (full_q < nxc) /* Q^T's last chunk of pairs, zero-padded */
            for (int i = 0; i < 1 + two_r; i++)
                for (int64_t p = 0; p < 16; p++) {
                    if (16 * full_q + p < pairs) memcpy(qbuf[i] + 16 * p, qt + (16 * full_q + p) * ld32 + 16 * (rb + i), 64);
                    else memset(qbuf[i] + 16 * p, 0, 64);
                }
        for (int64_t cb = 0; cb < ncb; cb += 2) {
            const int two_c = cb + 1 < ncb;
            FA_TILE_ZERO(TC0);
            if (two_r) FA_TILE_ZERO(TC1);
            if (two_c) FA_TILE_ZERO(TC2);
            if (two_c && two_r) FA_TILE_ZERO(TC3);
            for (int64_t xc = 0; xc < nxc; xc++) {
                const int64_t x0 = 32 * xc, nx = d - x0;
                for (int i = 0; i < 1 + two_c; i++) {
                    const int64_t c0 = 16 * (cb + i);
                    const void *a;
                    int64_t lda;
                    if (k_direct && nx >= 32 && c0 + 16 <= cols) {
                        a = k + c0 * ldk + x0;
                        lda = 2 * ldk;
                    } else {
                        for (int64_t c = 0; c < 16; c++) {
                            if (c0 + c < cols) copy_row64(kbuf[i] + 32 * c, k + (c0 + c) * ldk + x0, nx);
                            else memset(kbuf[i] + 32 * c, 0, 64);
                        }
                        a = kbuf[i];
                        lda = 64;
                    }
                    if (i == 0) FA_TILE_LOAD(TA0, a, lda);
                    else FA_TILE_LOAD(TA1, a, lda);
                }
                if (xc < full_q) {
                    FA_TILE_LOAD(TB0, qt + 16 * xc * ld32 + 16 * rb, 4 * ld32);
                    if (two_r) FA_TILE_LOAD(TB1, qt + 16 * xc * ld32 + 16 * (rb + 1), 4 * ld32);
                } else {
                    FA_TILE_LOAD(TB0, qbuf[0], 64);
                    if (two_r) FA_TILE_LOAD(TB1, qbuf[1], 64);
                }
                FA_TILE_DPBF16(TC0, TA0, TB0);
                if (two_r) FA_TILE_DPBF16(TC1, TA0, TB1);
                if (two_c) FA_TILE_DPBF16(TC2, TA1, TB0);
                if (two_c && two_r) FA_TILE_DPBF16(TC3, TA1, TB1);
            }
            /* store C (i, j) = columns of block cb + i, rows of block rb + j, then scale */
            for (int i = 0; i < 1 + two_c; i++)
                for (int j = 0; j < 1 + two_r; j++) {
                    const int64_t c0 = 16 * (cb + i), nc = MIN64(16, cols - c0);
                    float *dst = st + c0 * ldst + 16 * (rb + j);
                    const int direct = nc == 16;
                    float *out = direct ? dst : sbuf;
                    const int64_t ldo = direct ? ldst : 16;
                    const int t = 2 * i + j;
                    if (t == 0) FA_TILE_STORE(TC0, out, 4 * ldo);
                    else if (t == 1) FA_TILE_STORE(TC1, out, 4 * ldo);
                    else if (t == 2) FA_TILE_STORE(TC2, out, 4 * ldo);
                    else FA_TILE_STORE(TC3, out, 4 * ldo);
                    scale_rows(nc, out, ldo, scale, dst, ldst);
                }
        }
    }
}

/* ---------------------------------------------------------- the 2 x 2 block */

/*
 * C(i, j) += sum over chunks k < nk of A_i[k] . B_j[k], for i < 1 + two_i, j < 1 + two_j,
 * with C loaded once and stored once: C(i, j) at c[i] + 16j (ldc[i] floats per row),
 * A_i[k] at a[i] + 32k (lda uint16 per row), B_j[k] at b + 16k ldb + 16j (ldb dwords
 * per pair row) for k < nfull, and at btail + 16j (ldt) for the one chunk after them.
 * pv_bf16 (i: rows, j: e) and stx_bf16 (i: key columns, j: e) both accumulate so.
 */
static void mul_2x2(int two_i, int two_j, float *const c[2], const int64_t ldc[2], const uint16_t *const a[2],
                    int64_t lda, const uint32_t *b, int64_t ldb, int64_t nfull, const uint32_t *btail, int64_t ldt,
                    int64_t nk)
{
    FA_TILE_LOAD(TC0, c[0], 4 * ldc[0]);
    if (two_j) FA_TILE_LOAD(TC1, c[0] + 16, 4 * ldc[0]);
    if (two_i) FA_TILE_LOAD(TC2, c[1], 4 * ldc[1]);
    if (two_i && two_j) FA_TILE_LOAD(TC3, c[1] + 16, 4 * ldc[1]);
    for (int64_t k = 0; k < nk; k++) {
        FA_TILE_LOAD(TA0, a[0] + 32 * k, 2 * lda);
        if (two_i) FA_TILE_LOAD(TA1, a[1] + 32 * k, 2 * lda);
        const uint32_t *bk = k < nfull ? b + 16 * k * ldb : btail;
        const int64_t ldk = k < nfull ? ldb : ldt;
        FA_TILE_LOAD(TB0, bk, 4 * ldk);
        if (two_j) FA_TILE_LOAD(TB1, bk + 16, 4 * ldk);
        FA_TILE_DPBF16(TC0, TA0, TB0);
        if (two_j) FA_TILE_DPBF16(TC1, TA0, TB1);
        if (two_i) FA_TILE_DPBF16(TC2, TA1, TB0);
        if (two_i && two_j) FA_TILE_DPBF16(TC3, TA1, TB1);
    }
    FA_TILE_STORE(TC0, c[0], 4 * ldc[0]);
    if (two_j) FA_TILE_STORE(TC1, c[0] + 16, 4 * ldc[0]);
    if (two_i) FA_TILE_STORE(TC2, c[1], 4 * ldc[1]);
    if (two_i && two_j) FA_TILE_STORE(TC3, c[1] + 16, 4 * ldc[1]);
}

/* ---------------------------------------------------------------- pv_bf16 */

/* P's row stride in the transposed copy (uint16): whole 64-byte chunks, never a
 * multiple of 256 bytes (rows that far apart share a few L1 sets). */
static int64_t pt_ld(int64_t cols)
{
    const int64_t ld = R32(cols);
    return ld % 128 == 0 ? ld + 32 : ld;
}

/* pt[r][c] = bf16(st[c][r]) for r < round16(rows), c < round32(cols); zero for c >= cols.
 * st's padding rows are converted too: they only reach acc rows that are never stored. */
static void transpose_p(int64_t rows, int64_t cols, const float *st, int64_t ldst, uint16_t *pt, int64_t ldpt)
{
    const int64_t rp = R16(rows), cp = R32(cols);
#if defined(FA_AMX_HW)
    /* 32 columns x 16 rows at a time: pair columns (c, c+1) into dwords along r, then
     * transpose the 16 x 16 dwords, whose rows are then P's rows in bf16 */
    for (int64_t r0 = 0; r0 < rp; r0 += 16)
        for (int64_t c0 = 0; c0 < cp; c0 += 32) {
            __m512 t[16];
            for (int p = 0; p < 16; p++) {
                const int64_t c = c0 + 2 * p;
                const __m512i lo = c < cols ? fa_avx512_round_bf16_hi(_mm512_load_ps(st + c * ldst + r0))
                                            : _mm512_setzero_si512();
                const __m512i hi = c + 1 < cols ? fa_avx512_round_bf16_hi(_mm512_load_ps(st + (c + 1) * ldst + r0))
                                                : _mm512_setzero_si512();
                /* dword r: low word bf16(st[c][r]), high word bf16(st[c+1][r]) */
                t[p] = _mm512_castsi512_ps(_mm512_or_si512(_mm512_srli_epi32(lo, 16),
                                                           _mm512_and_si512(hi, _mm512_set1_epi32((int)0xffff0000u))));
            }
            fa_avx512_transpose16(t);
            for (int r = 0; r < 16; r++) _mm512_store_ps((float *)(void *)(pt + (r0 + r) * ldpt + c0), t[r]);
        }
#else
    for (int64_t r0 = 0; r0 < rp; r0 += 16)
        for (int64_t c0 = 0; c0 < cp; c0 += 32) {
            uint16_t blk[32][16];
            for (int i = 0; i < 32; i++) {
                if (c0 + i < cols) round_row(st + (c0 + i) * ldst + r0, 16, blk[i], 16);
                else memset(blk[i], 0, sizeof blk[i]);
            }
            for (int r = 0; r < 16; r++)
                for (int i = 0; i < 32; i++) pt[(r0 + r) * ldpt + c0 + i] = blk[i][r];
        }
#endif
}

/*
 * Scratch (dwords, each part 64-byte aligned), within FA_PV_BF16_SCRATCH(rows, cols, dv):
 *   pt    [round16(rows)][pt_ld(cols)] uint16   P transposed, bf16
 *   vtail [16][round16(dv)]                     the last, partial 32-key chunk of V pairs,
 *                                               zero past cols (an odd cols' partner too)
 *   atail [16][round16(dv)] fp32                the last, partial 16-row block of acc
 */
void FA_AMX_FN(pv_bf16)(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const uint32_t *vp,
                        int64_t ldvp, const float *alpha, float *acc, int64_t ldacc, void *scratch)
{
    const int64_t ldpt = pt_ld(cols), rp = R16(rows), ep = R16(dv), np = (cols + 1) / 2;
    const int64_t nrb = rp / 16, neb = ep / 16, full_c = cols / 32, ncc = (cols + 31) / 32;
    uint16_t *pt = scratch;
    uint32_t *vtail = ALIGN64(pt + rp * ldpt);
    float *atail = ALIGN64(vtail + 16 * ep);

    /* 1. acc *= alpha (the tiles then only add) */
    if (alpha)
        for (int64_t r = 0; r < rows; r++) {
            const float al = alpha[r];
            if (al == 1.0f) continue;
            float *a = acc + r * ldacc;
            for (int64_t e = 0; e < dv; e++) a[e] *= al;
        }
    /* 2. P^T -> P in bf16; the partial key chunk of V, zero-padded */
    transpose_p(rows, cols, st, ldst, pt, ldpt);
    if (full_c < ncc)
        for (int64_t p = 0; p < 16; p++) {
            const int64_t pr = 16 * full_c + p;
            uint32_t *dst = vtail + p * ep;
            if (pr < np) {
                memcpy(dst, vp + pr * ldvp, (size_t)ep * 4);
                if (2 * pr + 1 == cols) /* the missing partner of an odd cols */
                    for (int64_t e = 0; e < ep; e++) dst[e] &= 0xffffu;
            } else {
                memset(dst, 0, (size_t)ep * 4);
            }
        }
    /* the last row block runs on a copy when it is partial */
    const int64_t tail_rows = rows - 16 * (nrb - 1);
    if (tail_rows < 16) {
        for (int64_t r = 0; r < 16; r++) {
            float *dst = atail + r * ep;
            if (r < tail_rows) {
                memcpy(dst, acc + (16 * (nrb - 1) + r) * ldacc, (size_t)dv * 4);
                memset(dst + dv, 0, (size_t)(ep - dv) * 4);
            } else {
                memset(dst, 0, (size_t)ep * 4);
            }
        }
    }

    /* 3. acc += P V: C (i, j) = rows of block rb + i, columns of block eb + j */
    for (int64_t rb = 0; rb < nrb; rb += 2) {
        const int two_r = rb + 1 < nrb;
        float *ab[2] = {acc, acc};
        int64_t lda[2] = {ldacc, ldacc};
        for (int i = 0; i < 1 + two_r; i++) {
            const int tail = rb + i == nrb - 1 && tail_rows < 16;
            ab[i] = tail ? atail : acc + 16 * (rb + i) * ldacc;
            lda[i] = tail ? ep : ldacc;
        }
        const uint16_t *pa[2] = {pt + 16 * rb * ldpt, pt + 16 * (rb + two_r) * ldpt};
        for (int64_t eb = 0; eb < neb; eb += 2) {
            float *c[2] = {ab[0] + 16 * eb, ab[1] + 16 * eb};
            mul_2x2(two_r, eb + 1 < neb, c, lda, pa, ldpt, vp + 16 * eb, ldvp, full_c, vtail + 16 * eb, ep, ncc);
        }
    }
    if (tail_rows < 16)
        for (int64_t r = 0; r < tail_rows; r++)
            memcpy(acc + (16 * (nrb - 1) + r) * ldacc, atail + r * ep, (size_t)dv * 4);
}

/* --------------------------------------------------------------- stx_bf16 */

/*
 * Scratch (uint16, each part 64-byte aligned), within FA_STX_BF16_SCRATCH(rows, cols, n, ldst):
 *   xp    [round32(rows)/2][round16(n)] dwords  x as row pairs, zero past rows and n
 *   sb    [round16(cols)][round32(rows)] uint16  st rounded to bf16, zero past rows and cols
 *   atail [16][round16(n)] fp32                  the last, partial 16-row block of acc
 */
void FA_AMX_FN(stx_bf16)(int64_t rows, int64_t cols, int64_t n, const float *st, int64_t ldst, const uint16_t *x,
                         int64_t ldx, float *acc, int64_t ldacc, void *scratch)
{
    const int64_t rq = R32(rows), ep = R16(n), cp = R16(cols), npr = rq / 2;
    const int64_t ncb = cp / 16, neb = ep / 16, nrc = rq / 32;
    uint32_t *xp = scratch;
    uint16_t *sb = ALIGN64(xp + npr * ep);
    float *atail = ALIGN64(sb + cp * rq);

    /* 1. x pairs: dword (x[2p][e], x[2p+1][e]) */
    for (int64_t p = 0; p < npr; p++) {
        uint32_t *dst = xp + p * ep;
        const int64_t r = 2 * p;
        if (r + 1 < rows) {
            const uint16_t *s0 = x + r * ldx, *s1 = s0 + ldx;
            for (int64_t e = 0; e < n; e++) dst[e] = (uint32_t)s0[e] | (uint32_t)s1[e] << 16;
        } else if (r < rows) {
            const uint16_t *s0 = x + r * ldx;
            for (int64_t e = 0; e < n; e++) dst[e] = s0[e];
        } else {
            memset(dst, 0, (size_t)n * 4);
        }
        memset(dst + n, 0, (size_t)(ep - n) * 4);
    }
    /* 2. st in bf16, its own layout */
    for (int64_t c = 0; c < cp; c++) {
        if (c < cols) round_row(st + c * ldst, rows, sb + c * rq, rq);
        else memset(sb + c * rq, 0, (size_t)rq * 2);
    }
    const int64_t tail_cols = cols - 16 * (ncb - 1);
    if (tail_cols < 16)
        for (int64_t c = 0; c < 16; c++) {
            float *dst = atail + c * ep;
            if (c < tail_cols) {
                memcpy(dst, acc + (16 * (ncb - 1) + c) * ldacc, (size_t)n * 4);
                memset(dst + n, 0, (size_t)(ep - n) * 4);
            } else {
                memset(dst, 0, (size_t)ep * 4);
            }
        }

    /* 3. acc += st x: C (i, j) = columns of block cb + i, e of block eb + j */
    for (int64_t cb = 0; cb < ncb; cb += 2) {
        const int two_c = cb + 1 < ncb;
        float *ab[2] = {acc, acc};
        int64_t lda[2] = {ldacc, ldacc};
        for (int i = 0; i < 1 + two_c; i++) {
            const int tail = cb + i == ncb - 1 && tail_cols < 16;
            ab[i] = tail ? atail : acc + 16 * (cb + i) * ldacc;
            lda[i] = tail ? ep : ldacc;
        }
        const uint16_t *sa[2] = {sb + 16 * cb * rq, sb + 16 * (cb + two_c) * rq};
        for (int64_t eb = 0; eb < neb; eb += 2) {
            float *c[2] = {ab[0] + 16 * eb, ab[1] + 16 * eb};
            mul_2x2(two_c, eb + 1 < neb, c, lda, sa, rq, xp + 16 * eb, ep, nrc, NULL, 0, nrc);
        }
    }
    if (tail_cols < 16)
        for (int64_t c = 0; c < tail_cols; c++)
            memcpy(acc + (16 * (ncb - 1) + c) * ldacc, atail + c * ep, (size_t)n * 4);
}

/* ------------------------------------------------------------------ probe */

/* Six independent accumulator tiles (tdpbf16ps's latency is several times its issue
 * interval), 16 x 16 x 32 x 2 = 16384 FLOPs each; zero operands (the unit's rate does
 * not depend on the data). */
double FA_AMX_FN(probe_tile)(int64_t iters)
{
    static _Alignas(64) const uint16_t zeros[16 * 32];
    _Alignas(64) float sink[16 * 16];
    FA_TILE_ZERO(0);
    FA_TILE_ZERO(1);
    FA_TILE_ZERO(2);
    FA_TILE_ZERO(3);
    FA_TILE_ZERO(4);
    FA_TILE_ZERO(5);
    FA_TILE_LOAD(6, zeros, 64);
    FA_TILE_LOAD(7, zeros, 64);
    for (int64_t i = 0; i < iters; i++) {
        FA_TILE_DPBF16(0, 6, 7);
        FA_TILE_DPBF16(1, 6, 7);
        FA_TILE_DPBF16(2, 6, 7);
        FA_TILE_DPBF16(3, 6, 7);
        FA_TILE_DPBF16(4, 6, 7);
        FA_TILE_DPBF16(5, 6, 7);
    }
    FA_TILE_STORE(0, sink, 64);
    volatile float keep = sink[0];
    (void)keep;
    return (double)iters * 6.0 * 16384.0;
}
