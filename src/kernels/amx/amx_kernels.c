/*
 * amx_kernels.c: the bf16 products on tiles, written once against amx_tile.h and
 * compiled twice: with FA_AMX_HW (amx_hw.c: Intel's intrinsics, the "amx" table) and
 * without (the software model of amx_model.c, the "amx-model" table, built with no
 * ISA flags so it runs and is tested on any x86-64). Contracts: kernels.h.
 *
 * One tile configuration for every kernel, loaded once per job and thread by the first
 * tile kernel (ldtilecfg per call costs more than a small product), released by
 * thread_end: palette 1, all eight tiles
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
 *             fp32 sums, as the contract says. Rows run in groups of QK_GROUP blocks
 *             whose Q^T stays in L1 while each pair of K column blocks meets all of them.
 *   pv_bf16   acc[r][e] += P[r][.] . V[.][e]: A = P, which st holds transposed, so
 *             P is rounded to bf16 (as vcvtne2ps2bf16 does) and transposed into scratch
 *             a strip of 32 rows at a time, the next strip's blocks interleaved with the
 *             current strip's products; B = V pairs as given. acc is scaled by alpha on
 *             the vector side, loaded into tiles once, accumulated over every column of
 *             the call, stored once.
 *   fwd_bf16  the fused forward's tile (below): S = Q K^T row-major, softmax, P V.
 *   stx_bf16  acc[c][e] += st[c][.] . x[.][e]: A = st rows rounded to bf16 (their
 *             natural layout), B = x as row pairs (packed here).
 * Glue (rounding, pairing, copies) is plain C the compiler vectorises under the
 * hardware build's AVX-512 flags; P's transpose, the fused forward's softmax rows and
 * max, and K^T's transposes have intrinsic forms there, whose plain C forms in the model
 * compute the same bits.
 */
#include "amx_tile.h"
#if defined(FA_AMX_HW)
#include "../avx512/avx512_internal.h"
#endif
#include "../half.h"
#include "../kernels.h"

#include <math.h>
#include <string.h>

#ifndef QK_GROUP
#define QK_GROUP 4 /* row blocks of 16 per group in qk_bf16 */
#endif
#define MIN64(a, b) ((a) < (b) ? (a) : (b))

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

/* Configured lazily, by the first tile kernel of a job: a job without one (the small-row
 * decode path, the vector kernels) then runs exactly as the parent table's, with no tile
 * state for the OS to save at each context switch. thread_end releases what was taken. */
static _Thread_local int g_configured;

static inline void tiles_on(void)
{
    if (!g_configured) {
        FA_TILE_CONFIG(&g_tiles);
        g_configured = 1;
    }
}

void FA_AMX_FN(thread_begin)(void) {}

void FA_AMX_FN(thread_end)(void)
{
    if (g_configured) {
        FA_TILE_RELEASE();
        g_configured = 0;
    }
}

/* The configuration for the kernels of other files (amx_bwd.c), with the same lazy rule. */
void FA_AMX_FN(tiles_ensure)(void);
void FA_AMX_FN(tiles_ensure)(void) { tiles_on(); }

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
/* P's conversion in pv_bf16: vcvtne2ps2bf16's convert_fp32_to_bfloat16 (Intel SDM), which
 * the hardware build issues and the model follows bit for bit: zero and subnormal inputs
 * give a zero of their sign, a NaN its high word with the quiet bit set, anything else
 * (inf included) rounds to nearest even. Differs from round_bf16 only on subnormals,
 * which the tile unit's products treat as zero either way (DAZ on bf16 inputs) except
 * where rounding would lift one to the smallest normal. */
static inline uint16_t cvtne_bf16(uint32_t u)
{
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

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
    tiles_on();
    _Alignas(64) uint16_t kbuf[2][16 * 32];
    _Alignas(64) uint32_t qbuf[QK_GROUP][16 * 16];
    _Alignas(64) float sbuf[16 * 16];
    const uint32_t *qt = (const void *)qt2;
    const int64_t ld32 = ldqt2 / 2, pairs = (d + 1) / 2, nxc = (d + 31) / 32, full_q = pairs / 16;
    const int64_t nrb = (rows + 15) / 16, ncb = (cols + 15) / 16;
    const int k_direct = ldk > 0;
    /* row groups of QK_GROUP blocks: the group's Q^T stays in L1 while each pair of K
     * column blocks is loaded from L2 once and meets every row block of the group */
    for (int64_t g0 = 0; g0 < nrb; g0 += QK_GROUP) {
        const int64_t g1 = MIN64(nrb, g0 + QK_GROUP);
        if (full_q < nxc) /* Q^T's last chunk of pairs, zero-padded */
            for (int64_t b = g0; b < g1; b++)
                for (int64_t p = 0; p < 16; p++) {
                    if (16 * full_q + p < pairs) memcpy(qbuf[b - g0] + 16 * p, qt + (16 * full_q + p) * ld32 + 16 * b, 64);
                    else memset(qbuf[b - g0] + 16 * p, 0, 64);
                }
        for (int64_t cb = 0; cb < ncb; cb += 2) {
            const int two_c = cb + 1 < ncb;
            const int direct = k_direct && 16 * (cb + 1 + two_c) <= cols && d % 32 == 0;
            for (int64_t rb = g0; rb < g1; rb += 2) {
                const int two_r = rb + 1 < g1;
                FA_TILE_ZERO(TC0);
                if (two_r) FA_TILE_ZERO(TC1);
                if (two_c) FA_TILE_ZERO(TC2);
                if (two_c && two_r) FA_TILE_ZERO(TC3);
                for (int64_t xc = 0; xc < nxc; xc++) {
                    const int64_t x0 = 32 * xc, nx = d - x0;
                    const void *a[2];
                    int64_t lda = 2 * ldk;
                    if (direct) {
                        a[0] = k + 16 * cb * ldk + x0;
                        a[1] = k + 16 * (cb + 1) * ldk + x0;
                    } else {
                        for (int i = 0; i < 1 + two_c; i++) {
                            const int64_t c0 = 16 * (cb + i);
                            for (int64_t c = 0; c < 16; c++) {
                                if (c0 + c < cols) copy_row64(kbuf[i] + 32 * c, k + (c0 + c) * ldk + x0, nx);
                                else memset(kbuf[i] + 32 * c, 0, 64);
                            }
                            a[i] = kbuf[i];
                        }
                        lda = 64;
                    }
                    const uint32_t *b0, *b1;
                    int64_t ldb;
                    if (xc < full_q) {
                        b0 = qt + 16 * xc * ld32 + 16 * rb;
                        b1 = b0 + 16;
                        ldb = 4 * ld32;
                    } else {
                        b0 = qbuf[rb - g0];
                        b1 = qbuf[rb + 1 - g0];
                        ldb = 64;
                    }
                    /* loads interleaved with the products that need them */
                    FA_TILE_LOAD(TA0, a[0], lda);
                    FA_TILE_LOAD(TB0, b0, ldb);
                    FA_TILE_DPBF16(TC0, TA0, TB0);
                    if (two_r) {
                        FA_TILE_LOAD(TB1, b1, ldb);
                        FA_TILE_DPBF16(TC1, TA0, TB1);
                    }
                    if (two_c) {
                        FA_TILE_LOAD(TA1, a[1], lda);
                        FA_TILE_DPBF16(TC2, TA1, TB0);
                        if (two_r) FA_TILE_DPBF16(TC3, TA1, TB1);
                    }
                }
                /* store C (i, j) = columns of block cb + i, rows of block rb + j, then scale */
                for (int i = 0; i < 1 + two_c; i++)
                    for (int j = 0; j < 1 + two_r; j++) {
                        const int64_t c0 = 16 * (cb + i), nc = MIN64(16, cols - c0);
                        float *dst = st + c0 * ldst + 16 * (rb + j);
                        const int t = 2 * i + j;
                        if (t == 0) FA_TILE_STORE(TC0, sbuf, 64);
                        else if (t == 1) FA_TILE_STORE(TC1, sbuf, 64);
                        else if (t == 2) FA_TILE_STORE(TC2, sbuf, 64);
                        else FA_TILE_STORE(TC3, sbuf, 64);
                        scale_rows(nc, sbuf, 16, scale, dst, ldst);
                    }
            }
        }
    }
}

/* ---------------------------------------------------------- the 2 x 2 block */

/* One reduction step of the 2 x 2 block: C(i, j) += A_i . B_j for i < 1 + two_a,
 * j < 1 + two_b (C(i, j) = tile 2i + j), the loads interleaved with the products that
 * need them. Strides in bytes. The products are bf16 pairs into fp32 (tdpbf16ps), or
 * with i8 signed int8 quads into int32 (tdpbssd): the same tile shapes. */
#define FA_TILE_DP(i8, c, a, b)                        \
    do {                                               \
        if (i8) FA_TILE_DPBSSD(c, a, b);               \
        else FA_TILE_DPBF16(c, a, b);                  \
    } while (0)
static inline void step_2x2(const void *a0, const void *a1, size_t lda, const void *b0, const void *b1, size_t ldb,
                            int two_a, int two_b, int i8)
{
    FA_TILE_LOAD(TA0, a0, lda);
    FA_TILE_LOAD(TB0, b0, ldb);
    FA_TILE_DP(i8, TC0, TA0, TB0);
    if (two_b) {
        FA_TILE_LOAD(TB1, b1, ldb);
        FA_TILE_DP(i8, TC1, TA0, TB1);
    }
    if (two_a) {
        FA_TILE_LOAD(TA1, a1, lda);
        FA_TILE_DP(i8, TC2, TA1, TB0);
        if (two_b) FA_TILE_DP(i8, TC3, TA1, TB1);
    }
}

/* C(i, j) += A_i . B_j on the tiles loaded (i < 1 + two_i, j < 1 + two_j) */
static inline void dp_2x2(int two_i, int two_j)
{
    FA_TILE_DPBF16(TC0, TA0, TB0);
    if (two_j) FA_TILE_DPBF16(TC1, TA0, TB1);
    if (two_i) FA_TILE_DPBF16(TC2, TA1, TB0);
    if (two_i && two_j) FA_TILE_DPBF16(TC3, TA1, TB1);
}

/*
 * C(i, j) += sum over chunks k < nk of A_i[k] . B_j[k], for i < 1 + two_i, j < 1 + two_j,
 * with C loaded once and stored once: C(i, j) at c[i] + 16j (ldc[i] floats per row),
 * A_i[k] at a[i] + 32k (lda uint16 per row), B_j[k] at b + 16k ldb + 16j (ldb dwords
 * per pair row) for k < nfull, and at btail + 16j (ldt) for the one chunk after them.
 * pv_bf16 (i: rows, j: e) and stx_bf16 (i: key columns, j: e) both accumulate so.
 * mul_2x2_terms with blo (fwd_bf16's bf16x3 mode): each chunk adds A.Blo, A.B, then
 * Alo.B, Blo and Alo laid out as B and A (btail_lo the tail's).
 */
static void mul_2x2_terms(int two_i, int two_j, float *const c[2], const int64_t ldc[2], const uint16_t *const a[2],
                          const uint16_t *const alo[2], int64_t lda, const uint32_t *b, const uint32_t *blo, int64_t ldb,
                          int64_t nfull, const uint32_t *btail, const uint32_t *btail_lo, int64_t ldt, int64_t nk)
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
        if (blo) {
            /* the bf16x3 terms in the order a.blo, a.b, alo.b, in which each
             * operand is loaded once: the 8 tile registers hold no second copy */
            const uint32_t *bl = k < nfull ? blo + 16 * k * ldb : btail_lo;
            FA_TILE_LOAD(TB0, bl, 4 * ldk);
            if (two_j) FA_TILE_LOAD(TB1, bl + 16, 4 * ldk);
            dp_2x2(two_i, two_j);
        }
        FA_TILE_LOAD(TB0, bk, 4 * ldk);
        if (two_j) FA_TILE_LOAD(TB1, bk + 16, 4 * ldk);
        dp_2x2(two_i, two_j);
        if (!blo) continue;
        FA_TILE_LOAD(TA0, alo[0] + 32 * k, 2 * lda);
        if (two_i) FA_TILE_LOAD(TA1, alo[1] + 32 * k, 2 * lda);
        dp_2x2(two_i, two_j);
    }
    FA_TILE_STORE(TC0, c[0], 4 * ldc[0]);
    if (two_j) FA_TILE_STORE(TC1, c[0] + 16, 4 * ldc[0]);
    if (two_i) FA_TILE_STORE(TC2, c[1], 4 * ldc[1]);
    if (two_i && two_j) FA_TILE_STORE(TC3, c[1] + 16, 4 * ldc[1]);
}

static void mul_2x2(int two_i, int two_j, float *const c[2], const int64_t ldc[2], const uint16_t *const a[2],
                    int64_t lda, const uint32_t *b, int64_t ldb, int64_t nfull, const uint32_t *btail, int64_t ldt,
                    int64_t nk)
{
    mul_2x2_terms(two_i, two_j, c, ldc, a, NULL, lda, b, NULL, ldb, nfull, btail, NULL, ldt, nk);
}

/* ---------------------------------------------------------------- pv_bf16 */

/* P's row stride in the transposed copy (uint16): whole 64-byte chunks, never a
 * multiple of 256 bytes (rows that far apart share a few L1 sets). */
static int64_t pt_ld(int64_t cols)
{
    const int64_t ld = FA_RUP32(cols);
    return ld % 128 == 0 ? ld + 32 : ld;
}

/* One block of P in bf16: pt[r][c0 + i] = bf16(st[c0 + i][r]) for r < 16, i < 32 (st
 * already offset to the block's first row), zero for c0 + i >= cols; the conversion is
 * vcvtne2ps2bf16's (cvtne_bf16). st's padding rows are converted too: they only reach
 * acc rows that are never stored. */
static inline void p_block(int64_t c0, int64_t cols, const float *st, int64_t ldst, uint16_t *pt, int64_t ldpt)
{
#if defined(FA_AMX_HW)
    /* vcvtne2ps2bf16 rounds columns c, c+1 into one vector (words 0..15, 16..31), a word
     * permute pairs them into dwords along r, and the 16 x 16 dword transpose turns
     * those into P's rows */
    const __m512i il = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                        21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512 t[16];
    for (int p = 0; p < 16; p++) {
        const int64_t c = c0 + 2 * p;
        const __m512 lo = c < cols ? _mm512_load_ps(st + c * ldst) : _mm512_setzero_ps();
        const __m512 hi = c + 1 < cols ? _mm512_load_ps(st + (c + 1) * ldst) : _mm512_setzero_ps();
        /* dword r: low word bf16(st[c][r]), high word bf16(st[c+1][r]) */
        t[p] = _mm512_castsi512_ps(_mm512_permutexvar_epi16(il, (__m512i)_mm512_cvtne2ps_pbh(hi, lo)));
    }
    fa_avx512_transpose16(t);
    for (int r = 0; r < 16; r++) _mm512_store_ps((float *)(void *)(pt + r * ldpt + c0), t[r]);
#else
    uint16_t blk[32][16];
    for (int i = 0; i < 32; i++) {
        const uint32_t *src = (const void *)(st + (c0 + i) * ldst);
        for (int r = 0; r < 16; r++) blk[i][r] = c0 + i < cols ? cvtne_bf16(src[r]) : 0;
    }
    for (int r = 0; r < 16; r++)
        for (int i = 0; i < 32; i++) pt[r * ldpt + c0 + i] = blk[i][r];
#endif
}

/* P's blocks of one strip of 32 rows (16 in a last strip of 16 or fewer), in the order
 * the pipeline of pv_bf16 converts them: block b = (row half b / ncc, chunk b % ncc). */
static inline void p_strip_block(int64_t b, int64_t ncc, int64_t r0, int64_t cols, const float *st, int64_t ldst,
                                 uint16_t *buf, int64_t ldpt)
{
    const int64_t h = b / ncc, c0 = 32 * (b % ncc);
    p_block(c0, cols, st + r0 + 16 * h, ldst, buf + 16 * h * ldpt, ldpt);
}

/*
 * Scratch (dwords, each part 64-byte aligned), within FA_PV_BF16_SCRATCH(rows, cols, dv):
 *   pt    two strips of P in bf16, [32][pt_ld(cols)] uint16 each (the second only
 *         when rows > 32, and then round16(rows) >= 32 + the rows it holds)
 *   vtail [16][round16(dv)]                     the last, partial 32-key chunk of V pairs,
 *                                               zero past cols (an odd cols' partner too)
 *   atail [16][round16(dv)] fp32                the last, partial 16-row block of acc
 *
 * A software pipeline: while the tiles multiply one strip of 32 rows of P, the vector
 * unit converts and transposes the next strip's blocks into the other buffer, a block
 * after every few chunks of products, so the transposes hide behind the tile unit's
 * latency instead of running before it.
 */
void FA_AMX_FN(pv_bf16)(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const uint32_t *vp,
                        int64_t ldvp, const float *alpha, float *acc, int64_t ldacc, void *scratch)
{
    tiles_on();
    const int64_t ldpt = pt_ld(cols), rp = FA_RUP16(rows), ep = FA_RUP16(dv), np = (cols + 1) / 2;
    const int64_t nrb = rp / 16, neb = ep / 16, full_c = cols / 32, ncc = (cols + 31) / 32;
    uint16_t *const pt = scratch;
    uint16_t *const buf[2] = {pt, pt + 32 * ldpt};
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
    /* 2. the partial key chunk of V, zero-padded; the first strip of P */
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
    for (int64_t b = 0; b < MIN64(2, nrb) * ncc; b++) p_strip_block(b, ncc, 0, cols, st, ldst, buf[0], ldpt);
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
    const int64_t groups = (neb + 1) / 2 * ncc; /* chunks of products per strip */
    for (int64_t rb = 0; rb < nrb; rb += 2) {
        const int two_r = rb + 1 < nrb;
        const uint16_t *const cur = buf[(rb / 2) & 1];
        uint16_t *const next = buf[(rb / 2 + 1) & 1];
        const int64_t nblocks = rb + 2 < nrb ? MIN64(2, nrb - rb - 2) * ncc : 0; /* the next strip's */
        int64_t done = 0, g = 0;
        float *ab[2] = {acc, acc};
        int64_t lda[2] = {ldacc, ldacc};
        for (int i = 0; i < 1 + two_r; i++) {
            const int tail = rb + i == nrb - 1 && tail_rows < 16;
            ab[i] = tail ? atail : acc + 16 * (rb + i) * ldacc;
            lda[i] = tail ? ep : ldacc;
        }
        const uint16_t *pa[2] = {cur, cur + 16 * two_r * ldpt};
        for (int64_t eb = 0; eb < neb; eb += 2) {
            const int two_e = eb + 1 < neb;
            float *c0 = ab[0] + 16 * eb, *c1 = ab[1] + 16 * eb;
            FA_TILE_LOAD(TC0, c0, 4 * lda[0]);
            if (two_e) FA_TILE_LOAD(TC1, c0 + 16, 4 * lda[0]);
            if (two_r) FA_TILE_LOAD(TC2, c1, 4 * lda[1]);
            if (two_r && two_e) FA_TILE_LOAD(TC3, c1 + 16, 4 * lda[1]);
            for (int64_t k = 0; k < ncc; k++, g++) {
                const uint32_t *bk = k < full_c ? vp + 16 * k * ldvp + 16 * eb : vtail + 16 * eb;
                const int64_t ldb = k < full_c ? ldvp : ep;
                step_2x2(pa[0] + 32 * k, pa[1] + 32 * k, (size_t)(2 * ldpt), bk, bk + 16, (size_t)(4 * ldb), two_r, two_e, 0);
                /* the next strip's share of blocks so far, while the products run */
                for (const int64_t due = (g + 1) * nblocks / groups; done < due; done++)
                    p_strip_block(done, ncc, 16 * (rb + 2), cols, st, ldst, next, ldpt);
            }
            FA_TILE_STORE(TC0, c0, 4 * lda[0]);
            if (two_e) FA_TILE_STORE(TC1, c0 + 16, 4 * lda[0]);
            if (two_r) FA_TILE_STORE(TC2, c1, 4 * lda[1]);
            if (two_r && two_e) FA_TILE_STORE(TC3, c1 + 16, 4 * lda[1]);
        }
        for (; done < nblocks; done++) p_strip_block(done, ncc, 16 * (rb + 2), cols, st, ldst, next, ldpt);
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
    tiles_on();
    const int64_t rq = FA_RUP32(rows), ep = FA_RUP16(n), cp = FA_RUP16(cols), npr = rq / 2;
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
    tiles_on();
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

/* --------------------------------------------------------------- fwd_bf16 */

/*
 * The fused forward on one key tile (kernels.h, fa_fwd_tile), in strips of 32 query
 * rows (two A tiles). Per strip, blocks of FWD_BLOCK keys:
 *   S = Q K^T   A = Q rows (the strip's, natural layout), B = K^T pairs (1 KB blocks);
 *               2 x 2 C tiles per 32 keys, stored row-major into S (fp32, unscaled); the
 *               next block's steps run between this block's softmax rows, into the
 *               other of two score buffers, so the tile unit works while the vectors do;
 *   softmax     row by row on 16-lane vectors: t = S * scale log2(e) - m log2(e); while
 *               every kept t <= FA_FWD_LAZY_LOG2 the running max stays (lazy rescale),
 *               else the row's max moves (fwd_row_max) and the strip's pending P V is
 *               flushed before acc takes the rescale; p = 2^t by a degree-5 polynomial
 *               (minimax on [-1/2, 1/2], 2^-22.6 relative with fp32 coefficients, so
 *               that l, and lse from it, are as accurate as the unfused path's), 0
 *               exactly for masked lanes and t <= FWD_TLO, rounded to bf16 straight
 *               into P's row (vcvtne2ps2bf16); the row's sum is taken from the fp32
 *               values, in 16 lanes until the tile ends;
 *   acc += P V  A = P rows as written, B = V pairs as given: no transpose. Deferred
 *               over blocks until a rescale or the tile's end (the products are the
 *               same fp32 sums in the same order: C round-trips through memory exactly).
 * Blocks outside every row's band of the strip are skipped (their p are 0 and V is
 * finite, so they would add exactly nothing).
 */
#define FWD_BLOCK 64
#define FWD_LOG2E 1.44269504088896341f
/* 2^f on [-1/2, 1/2], degree 5, minimax in relative error (Remez; 2^-22.6 as fp32) */
#define FWD_E0 1.00000012f
#define FWD_E1 0.693146944f
#define FWD_E2 0.240221202f
#define FWD_E3 0.0555071309f
#define FWD_E4 0.00967554096f
#define FWD_E5 0.00132764725f
/* p = 0 for t <= FWD_TLO (and masked lanes, whose t is -inf): the others are normal
 * floats (>= 2^-125.5), never subnormals, and the dropped terms are below 2^-125 of l,
 * which holds at least one p >= 1 */
#define FWD_TLO (-125.0f)

void FA_AMX_FN(fwd_bf16)(const fa_fwd_tile *t);
void FA_AMX_FN(fwd_i8)(const fa_fwd_tile *t);

#if defined(FA_AMX_HW)
void fa_amx_pack_kt_bf16(int64_t cols, int64_t d, const uint16_t *k, int64_t ldk, uint32_t *kt, int64_t j0);

/* pack_kt_bf16 (kernels.h): whole blocks of 16 keys as 16 x 16 dword transposes (a
 * block's K rows, 32 d at a time, masked past d), the keys of partial blocks one by one.
 * Only the hardware table takes it; the model inherits the reference's (the same bits). */
void fa_amx_pack_kt_bf16(int64_t cols, int64_t d, const uint16_t *k, int64_t ldk, uint32_t *kt, int64_t j0)
{
    const int64_t np = FA_KT_PAIRS(d);
    for (int64_t c = 0; c < cols;) {
        const int64_t j = j0 + c;
        uint32_t *blk = kt + j / 16 * 16 * np;
        if (j % 16 == 0 && c + 16 <= cols) {
            /* the next block's K rows asked for now: they come from L3 or memory, in
             * (B, S, H, D) a page apart each, which no hardware stream covers */
            for (int64_t i = c + 16; i < c + 32 && i < cols; i++)
                for (int64_t x = 0; x < d; x += 32) _mm_prefetch((const char *)(k + i * ldk + x), _MM_HINT_T0);
            for (int64_t g = 0; g < np / 16; g++) {
                const int64_t x0 = 32 * g, nx = d - x0;
                const __mmask32 m = nx >= 32 ? ~(__mmask32)0 : ((__mmask32)1 << nx) - 1;
                __m512 t[16];
                for (int i = 0; i < 16; i++)
                    t[i] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, k + (c + i) * ldk + x0));
                fa_avx512_transpose16(t);
                for (int p = 0; p < 16; p++) _mm512_storeu_ps((float *)(blk + 16 * (16 * g + p)), t[p]);
            }
            c += 16;
            continue;
        }
        for (int64_t p = 0; p < np; p++) {
            const uint32_t lo = 2 * p < d ? k[c * ldk + 2 * p] : 0;
            const uint32_t hi = 2 * p + 1 < d ? k[c * ldk + 2 * p + 1] : 0;
            blk[16 * p + j % 16] = lo | hi << 16;
        }
        c++;
    }
}
#endif

/*
 * The softmax of one row of a block: nv <= 4 vectors of 16 scores s (raw dot products),
 * keep[v] the lanes kept. t = s c - mlog (masked: -inf). With `check`, returns 1 and
 * writes nothing when a kept t exceeds FA_FWD_LAZY_LOG2; else writes P's 16 * nv
 * (rounded up to 32) bf16 values, adds their fp32 values before rounding to the lane
 * sums lsum, and returns 0; with pl (the bf16x3 mode) also the residuals bf16(e - p)
 * into pl's 16 * nv. The two builds below compute the same bits: each lane as
 * the named instruction does (vfmadd, vcmpps, vmaxps's "a > b ? a : b", vrndscaleps in
 * the current rounding mode, vscalefps, vcvtne2ps2bf16, vaddps).
 */
#if defined(FA_AMX_HW)
/* nv a constant in each caller below, so that the loops unroll and t, e stay in registers */
static inline __attribute__((always_inline)) int fwd_row_n(const float *s, const int nv, const uint16_t *keep, float c,
                                                           float mlog, int check, uint16_t *p, uint16_t *pl,
                                                           float *lsum)
{
    const __m512 vc = _mm512_set1_ps(c), vm = _mm512_set1_ps(-mlog), ninf = _mm512_set1_ps(-INFINITY);
    __m512 t[4];
    __mmask16 over = 0;
    for (int v = 0; v < nv; v++) {
        t[v] = _mm512_fmadd_ps(_mm512_loadu_ps(s + 16 * v), vc, vm);
        if (keep[v] != 0xffffu) t[v] = _mm512_mask_blend_ps(keep[v], ninf, t[v]);
        over |= _mm512_cmp_ps_mask(t[v], _mm512_set1_ps(FA_FWD_LAZY_LOG2), _CMP_GT_OQ);
    }
    if (check && over) return 1;
    const __m512 lo = _mm512_set1_ps(FWD_TLO);
    __m512 e[4], sum = _mm512_loadu_ps(lsum);
    for (int v = 0; v < nv; v++) {
        const __mmask16 live = _mm512_cmp_ps_mask(t[v], lo, _CMP_NLE_UQ); /* t > FWD_TLO, or NaN */
        const __m512 x = _mm512_max_ps(lo, t[v]);
        const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_CUR_DIRECTION | _MM_FROUND_NO_EXC);
        const __m512 f = _mm512_sub_ps(x, n);
        __m512 q = _mm512_fmadd_ps(_mm512_set1_ps(FWD_E5), f, _mm512_set1_ps(FWD_E4));
        q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(FWD_E3));
        q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(FWD_E2));
        q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(FWD_E1));
        q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(FWD_E0));
        e[v] = _mm512_maskz_scalef_ps(live, q, n);
        sum = _mm512_add_ps(sum, e[v]);
    }
    for (int v = 0; v < nv; v += 2) {
        const __m512 hi = v + 1 < nv ? e[v + 1] : _mm512_setzero_ps();
        const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(hi, e[v]);
        _mm512_storeu_si512((void *)(p + 16 * v), w);
        if (!pl) continue;
        /* e - p is exact in fp32: p back from its bf16 words, by a shift */
        const __m512 p0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(w)), 16));
        const __m512 p1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(w, 1)), 16));
        _mm512_storeu_si512((void *)(pl + 16 * v),
                            (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(hi, p1), _mm512_sub_ps(e[v], p0)));
    }
    _mm512_storeu_ps(lsum, sum);
    return 0;
}

static int fwd_row(const float *s, int nv, const uint16_t *keep, float c, float mlog, int check, uint16_t *p,
                   uint16_t *pl, float *lsum)
{
    switch (nv) {
    case 4: return fwd_row_n(s, 4, keep, c, mlog, check, p, pl, lsum);
    case 3: return fwd_row_n(s, 3, keep, c, mlog, check, p, pl, lsum);
    case 2: return fwd_row_n(s, 2, keep, c, mlog, check, p, pl, lsum);
    default: return fwd_row_n(s, 1, keep, c, mlog, check, p, pl, lsum);
    }
}
#else
/* vscalefps on an integral n: x 2^n, rounded as a multiply would be */
static float scalef1(float x, float n)
{
    if (x != x || n != n) return x + n;
    if (n > 300.0f) n = 300.0f;
    if (n < -300.0f) n = -300.0f;
    return ldexpf(x, (int)n);
}

/* bf16 words of x and of its residual x - bf16(x) (exact in fp32), as vcvtne2ps2bf16 */
static void cvtne_split(float x, uint16_t *hi, uint16_t *lo)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    *hi = cvtne_bf16(u);
    const uint32_t h = (uint32_t)*hi << 16;
    float hf;
    memcpy(&hf, &h, 4);
    const float r = x - hf;
    memcpy(&u, &r, 4);
    *lo = cvtne_bf16(u);
}

static int fwd_row(const float *s, int nv, const uint16_t *keep, float c, float mlog, int check, uint16_t *p,
                   uint16_t *pl, float *lsum)
{
    float t[4][16];
    int over = 0;
    for (int v = 0; v < nv; v++)
        for (int i = 0; i < 16; i++) {
            const float x = fmaf(s[16 * v + i], c, -mlog);
            t[v][i] = (keep[v] >> i) & 1u ? x : -INFINITY;
            over |= t[v][i] > FA_FWD_LAZY_LOG2;
        }
    if (check && over) return 1;
    float e[4][16];
    for (int v = 0; v < nv; v++)
        for (int i = 0; i < 16; i++) {
            const float x = FWD_TLO > t[v][i] ? FWD_TLO : t[v][i];
            const float n = rintf(x), f = x - n;
            float q = fmaf(FWD_E5, f, FWD_E4);
            q = fmaf(q, f, FWD_E3);
            q = fmaf(q, f, FWD_E2);
            q = fmaf(q, f, FWD_E1);
            q = fmaf(q, f, FWD_E0);
            e[v][i] = t[v][i] <= FWD_TLO ? 0.0f : scalef1(q, n); /* NaN stays */
            lsum[i] += e[v][i];
        }
    for (int v = 0; v < nv; v += 2) {
        uint16_t w[32], wl[32];
        for (int i = 0; i < 16; i++) {
            cvtne_split(e[v][i], &w[i], &wl[i]);
            cvtne_split(v + 1 < nv ? e[v + 1][i] : 0.0f, &w[16 + i], &wl[16 + i]);
        }
        memcpy(p + 16 * v, w, sizeof w);
        if (pl) memcpy(pl + 16 * v, wl, sizeof wl);
    }
    return 0;
}
#endif

/* The row's max over its kept columns of the block (scores scaled as the contract says:
 * max(s) * scale, or min(s) * scale for a negative scale, which is the max of the
 * products exactly), NaN if a kept one is NaN; -inf when none is kept. Per lane as
 * vmaxps / vminps do ("a > b ? a : b"), then the lanes in one fixed order. */
static float fwd_row_max(const float *s, int nv, const uint16_t *keep, float scale)
{
    float hi[16], lo[16];
    int nan = 0;
#if defined(FA_AMX_HW)
    __m512 vh = _mm512_set1_ps(-INFINITY), vl = _mm512_set1_ps(INFINITY);
    for (int v = 0; v < nv; v++) {
        const __m512 x = _mm512_loadu_ps(s + 16 * v);
        vh = _mm512_mask_max_ps(vh, keep[v], x, vh);
        vl = _mm512_mask_min_ps(vl, keep[v], x, vl);
        nan |= _mm512_mask_cmp_ps_mask(keep[v], x, x, _CMP_UNORD_Q) != 0;
    }
    if (nan) return NAN;
    /* the lanes as the loop below pairs them: lane i < w takes max(lane i + w, lane i) */
    vh = _mm512_max_ps(_mm512_shuffle_f32x4(vh, vh, _MM_SHUFFLE(1, 0, 3, 2)), vh);
    vl = _mm512_min_ps(_mm512_shuffle_f32x4(vl, vl, _MM_SHUFFLE(1, 0, 3, 2)), vl);
    vh = _mm512_max_ps(_mm512_shuffle_f32x4(vh, vh, _MM_SHUFFLE(2, 3, 0, 1)), vh);
    vl = _mm512_min_ps(_mm512_shuffle_f32x4(vl, vl, _MM_SHUFFLE(2, 3, 0, 1)), vl);
    vh = _mm512_max_ps(_mm512_permute_ps(vh, _MM_SHUFFLE(1, 0, 3, 2)), vh);
    vl = _mm512_min_ps(_mm512_permute_ps(vl, _MM_SHUFFLE(1, 0, 3, 2)), vl);
    vh = _mm512_max_ps(_mm512_permute_ps(vh, _MM_SHUFFLE(2, 3, 0, 1)), vh);
    vl = _mm512_min_ps(_mm512_permute_ps(vl, _MM_SHUFFLE(2, 3, 0, 1)), vl);
    hi[0] = _mm512_cvtss_f32(vh);
    lo[0] = _mm512_cvtss_f32(vl);
#else
    for (int i = 0; i < 16; i++) hi[i] = -INFINITY, lo[i] = INFINITY;
    for (int v = 0; v < nv; v++)
        for (int i = 0; i < 16; i++) {
            if (!((keep[v] >> i) & 1u)) continue;
            const float x = s[16 * v + i];
            hi[i] = x > hi[i] ? x : hi[i];
            lo[i] = x < lo[i] ? x : lo[i];
            nan |= x != x;
        }
    if (nan) return NAN;
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) {
            hi[i] = hi[i + w] > hi[i] ? hi[i + w] : hi[i];
            lo[i] = lo[i + w] < lo[i] ? lo[i + w] : lo[i];
        }
#endif
    if (hi[0] == -INFINITY) return -INFINITY; /* nothing kept */
    return scale < 0.0f ? lo[0] * scale : hi[0] * scale;
}

/* S (32 x FWD_BLOCK fp32, row-major, unscaled) of one block, as a sequence of steps the
 * caller interleaves with the softmax of the block before: nkb <= 4 blocks of 16 keys
 * from kt (ldkt dwords per 16 keys, 1 KB per B tile), the strip's one or two A tiles. */
typedef struct {
    const char *q;   /* the strip's first A row; 64 bytes of each row per step */
    int64_t ldq, nxc, ldkt; /* ldq in bytes */
    const uint32_t *kt;
    int two_r, nkb, i8; /* i8: int8 codes, int32 sums (fwd_i8) */
    float *S;
    int step, steps; /* done so far, in all: (nkb / 2 rounded up) halves x nxc */
} fwd_qk_job;

static void fwd_qk_begin(fwd_qk_job *j, const char *q, int64_t ldq, int two_r, int64_t nxc, const uint32_t *kt,
                         int64_t ldkt, int nkb, int i8, float *S)
{
    *j = (fwd_qk_job){q, ldq, nxc, ldkt, kt, two_r, nkb, i8, S, 0, (int)((nkb + 1) / 2 * nxc)};
}

/* Runs the job's steps up to `until` (at most its steps). */
static void fwd_qk_run(fwd_qk_job *j, int until)
{
    for (; j->step < until && j->step < j->steps; j->step++) {
        const int h = (int)(j->step / j->nxc);
        const int64_t xc = j->step % j->nxc;
        const int two_c = 2 * h + 1 < j->nkb, two_r = j->two_r;
        if (xc == 0) {
            FA_TILE_ZERO(TC0);
            if (two_c) FA_TILE_ZERO(TC1);
            if (two_r) FA_TILE_ZERO(TC2);
            if (two_r && two_c) FA_TILE_ZERO(TC3);
        }
        const uint32_t *b = j->kt + 2 * h * j->ldkt + 256 * xc;
        step_2x2(j->q + 64 * xc, j->q + 16 * j->ldq + 64 * xc, (size_t)j->ldq, b, b + j->ldkt, 64, two_r, two_c, j->i8);
        if (xc == j->nxc - 1) {
            float *d = j->S + 32 * h;
            FA_TILE_STORE(TC0, d, 4 * FWD_BLOCK);
            if (two_c) FA_TILE_STORE(TC1, d + 16, 4 * FWD_BLOCK);
            if (two_r) FA_TILE_STORE(TC2, d + 16 * FWD_BLOCK, 4 * FWD_BLOCK);
            if (two_r && two_c) FA_TILE_STORE(TC3, d + 16 * FWD_BLOCK + 16, 4 * FWD_BLOCK);
        }
    }
}

/* Scratch parts of fwd_bf16 (64-byte aligned, within FA_FWD_BF16_SCRATCH), and the
 * tile's shape as its strips use it. */
typedef struct {
    float *S[2];     /* [32][FWD_BLOCK] each: the block the softmax reads, the next one's scores */
    uint16_t *P;     /* [32][ldp] */
    uint16_t *Pl;    /* [32][ldp] the bf16x3 mode's residuals of P, else NULL */
    float *L;        /* [32][16] lane sums */
    float *alpha;    /* [32] */
    float *mlog;     /* [32] */
    uint32_t *vtail; /* [16][ep] the last, partial 32-key chunk of V pairs */
    uint32_t *vtail_lo; /* [16][ep] the same of V's lo pairs (bf16x3 mode) */
    float *atail;    /* [16][ep] a partial 16-row block of acc */
    int64_t ep, ldp, nxc, full_c, ldkt;
    float scale, c2; /* the scores' scale (1 for fwd_i8, whose scores are final), scale log2(e) */
    int i8;          /* fwd_i8: S holds int32 sums, made scores row by row (fwd_i8_row) */
} fwd_scratch;

/* acc += P V over P's 32-key chunks [k0, k1) for the strip's row blocks c[0], c[1]
 * (the bf16x3 mode: + P Vlo + Pl V). */
static void fwd_pv(const fa_fwd_tile *t, const fwd_scratch *w, int two_r, int64_t k0, int64_t k1, float *const c[2],
                   const int64_t ldc[2])
{
    const int64_t neb = w->ep / 16, ldp = w->ldp, ldvp = t->ldvp;
    const uint16_t *a[2] = {w->P + 32 * k0, w->P + 16 * ldp + 32 * k0};
    /* the residual's rows (bf16x3 mode only: no offset from a NULL Pl) */
    const uint16_t *al[2] = {w->Pl ? w->Pl + 32 * k0 : NULL, w->Pl ? w->Pl + 16 * ldp + 32 * k0 : NULL};
    for (int64_t eb = 0; eb < neb; eb += 2) {
        float *cc[2] = {c[0] + 16 * eb, c[1] + 16 * eb};
        const int64_t nfull = w->full_c > k0 ? w->full_c - k0 : 0, off = 16 * k0 * ldvp + 16 * eb;
        mul_2x2_terms(two_r, eb + 1 < neb, cc, ldc, a, al, ldp, t->vp + off, t->bf16.vlo ? t->bf16.vlo + off : NULL, ldvp,
                      nfull, w->vtail + 16 * eb, w->vtail_lo + 16 * eb, w->ep, k1 - k0);
    }
}

/* One strip of up to 32 rows: its acc rows (in place, or a partial block through atail)
 * and the P columns [pend, ..) whose product is still to come. */
typedef struct {
    int64_t r0, nr;
    int two_r;
    float *c[2];
    int64_t ldc[2];
    int64_t pend;
} fwd_strip;

/* The partial key chunk after full_c whole ones of V pairs vp into tail, zero past
 * cols (a masked p = 0 must never meet garbage). */
static void fwd_vtail(const uint32_t *vp, int64_t ldvp, int64_t cols, int64_t full_c, int64_t ep, uint32_t *tail)
{
    for (int64_t p = 0; p < 16; p++) {
        const int64_t pr = 16 * full_c + p;
        uint32_t *dst = tail + p * ep;
        if (2 * pr < cols) {
            memcpy(dst, vp + pr * ldvp, (size_t)ep * 4);
            if (2 * pr + 1 == cols)
                for (int64_t e = 0; e < ep; e++) dst[e] &= 0xffffu;
        } else {
            memset(dst, 0, (size_t)ep * 4);
        }
    }
}

/* The scratch's parts, and the partial key chunks of V. */
static void fwd_scratch_init(const fa_fwd_tile *t, int i8, fwd_scratch *w)
{
    const int64_t cols = t->cols, ep = FA_RUP16(t->dv), ldp = pt_ld(cols);
    w->ep = ep, w->ldp = ldp, w->full_c = cols / 32, w->i8 = i8;
    w->nxc = i8 ? (t->d + 63) / 64 : (t->d + 31) / 32; /* 64 bytes of each A row per step */
    w->ldkt = 16 * (i8 ? FA_KT_QUADS(t->d) : FA_KT_PAIRS(t->d));
    w->scale = i8 ? 1.0f : t->bf16.scale;
    w->c2 = w->scale * FWD_LOG2E;
    w->S[0] = ALIGN64(t->scratch);
    w->S[1] = w->S[0] + 32 * FWD_BLOCK;
    w->P = ALIGN64(w->S[1] + 32 * FWD_BLOCK);
    w->Pl = t->bf16.vlo ? ALIGN64(w->P + 32 * ldp) : NULL;
    w->L = ALIGN64(w->P + 2 * 32 * ldp);
    w->alpha = ALIGN64(w->L + 32 * 16);
    w->mlog = ALIGN64(w->alpha + 32);
    w->vtail = ALIGN64(w->mlog + 32);
    w->vtail_lo = ALIGN64(w->vtail + 16 * ep);
    w->atail = ALIGN64(w->vtail_lo + 16 * ep);
    if (w->full_c == (cols + 31) / 32) return;
    fwd_vtail(t->vp, t->ldvp, cols, w->full_c, ep, w->vtail);
    if (t->bf16.vlo) fwd_vtail(t->bf16.vlo, t->ldvp, cols, w->full_c, ep, w->vtail_lo);
}

/* The strip's columns [*cs, *ce): the union of its rows' bands; 0 when none is kept. */
static int fwd_strip_columns(const fa_fwd_tile *t, const fwd_strip *st, int64_t *cs, int64_t *ce)
{
    const int64_t cols = t->cols;
    *cs = 0, *ce = cols;
    if (!t->lo) return 1;
    *cs = cols, *ce = 0;
    for (int64_t r = st->r0; r < st->r0 + st->nr; r++) {
        const int64_t a = t->lo[r] < 0 ? 0 : t->lo[r], z = t->hi[r] >= cols ? cols - 1 : t->hi[r];
        if (a > z) continue;
        if (a < *cs) *cs = a;
        if (z + 1 > *ce) *ce = z + 1;
    }
    return *ce > *cs;
}

/* The strip's acc rows, a partial 16-row block copied into atail (zero past dv and
 * rows), and its rows' softmax state in scratch. */
static void fwd_strip_begin(const fa_fwd_tile *t, const fwd_scratch *w, fwd_strip *st)
{
    const int64_t rows = t->rows, dv = t->dv, ep = w->ep;
    for (int i = 0; i < 2; i++) {
        const int64_t rb = st->r0 + 16 * i;
        const int tail = rb + 16 > rows;
        st->c[i] = tail ? w->atail : t->acc + rb * t->ldacc;
        st->ldc[i] = tail ? ep : t->ldacc;
        if (tail && rb < rows && (i == 0 || st->two_r))
            for (int64_t r = 0; r < 16; r++) {
                float *dst = w->atail + r * ep;
                if (rb + r < rows) {
                    memcpy(dst, t->acc + (rb + r) * t->ldacc, (size_t)dv * 4);
                    memset(dst + dv, 0, (size_t)(ep - dv) * 4);
                } else {
                    memset(dst, 0, (size_t)ep * 4);
                }
            }
    }
    for (int64_t r = 0; r < st->nr; r++) {
        w->mlog[r] = t->m[st->r0 + r] * FWD_LOG2E;
        w->alpha[r] = 1.0f;
        memset(w->L + 16 * r, 0, 64);
    }
}

/* The Q K^T job of the block at column c0 (its keys up to the tile's end) into S. */
static void fwd_qk_block(const fa_fwd_tile *t, const fwd_scratch *w, const fwd_strip *st, int64_t c0, float *S,
                         fwd_qk_job *qj)
{
    const char *q = w->i8 ? (const char *)(t->i8.q8 + st->r0 * t->i8.ldq8)
                          : (const char *)(t->bf16.q + st->r0 * t->bf16.ldq);
    fwd_qk_begin(qj, q, w->i8 ? t->i8.ldq8 : 2 * t->bf16.ldq, st->two_r, w->nxc, t->kt + c0 / 16 * w->ldkt, w->ldkt,
                 (int)((MIN64(t->cols - c0, FWD_BLOCK) + 15) / 16), w->i8, S);
}

/* fwd_i8's scores of one row of a block (kernels.h): s = float(A) * (qs * ks) (+ qc),
 * each step rounded as written (vcvtdq2ps, vmulps, vaddps), into out. */
static const float *fwd_i8_row(const fa_fwd_tile *t, const int32_t *A, int64_t row, int64_t c0, int nkb, float *out)
{
    const float qs = t->i8.qs[row], qc = t->i8.qc ? t->i8.qc[row] : 0.0f;
#if defined(FA_AMX_HW)
    const __m512 vqs = _mm512_set1_ps(qs), vqc = _mm512_set1_ps(qc);
    for (int v = 0; v < nkb; v++) {
        const __m512 sc = _mm512_mul_ps(vqs, _mm512_loadu_ps(t->i8.ks + c0 + 16 * v));
        __m512 x = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512((const void *)(A + 16 * v))), sc);
        if (t->i8.qc) x = _mm512_add_ps(x, vqc);
        _mm512_store_ps(out + 16 * v, x);
    }
#else
    for (int64_t i = 0; i < 16 * nkb; i++) {
        const float x = (float)A[i] * (qs * t->i8.ks[c0 + i]);
        out[i] = t->i8.qc ? x + qc : x;
    }
#endif
    return out;
}

/* The softmax of the strip's rows on the block at c0 (nkb groups of 16 keys, scores in
 * S), a step of the next block's Q K^T (qj) after every few rows so that the tile unit
 * runs it while the vector unit works. Returns 1 when some row's max moved on a row
 * that had one (alpha[r] != 1 then: acc waits for its rescale). */
static int fwd_block_rows(const fa_fwd_tile *t, const fwd_scratch *w, const fwd_strip *st, const float *S,
                          int64_t c0, int nkb, fwd_qk_job *qj)
{
    const int64_t cols = t->cols;
    int rescale = 0;
    for (int64_t r = 0; r < st->nr; r++) {
        fwd_qk_run(qj, (int)((r + 1) * qj->steps / st->nr));
        const int64_t row = st->r0 + r;
        uint16_t keep[4] = {0xffffu, 0xffffu, 0xffffu, 0xffffu};
        const int64_t a = t->lo ? t->lo[row] : 0, z = t->hi ? t->hi[row] : cols - 1;
        if (a > c0 || z < c0 + 16 * nkb - 1) /* the band or the tile's end inside the block */
            for (int v = 0; v < nkb; v++) keep[v] = fa_tile_lanes(a, z < cols - 1 ? z : cols - 1, c0 + 16 * v);
        _Alignas(64) float si[FWD_BLOCK];
        const float *s = S + r * FWD_BLOCK;
        if (w->i8) s = fwd_i8_row(t, (const int32_t *)s, row, c0, nkb, si);
        uint16_t *p = w->P + r * w->ldp + c0, *pl = w->Pl ? w->Pl + r * w->ldp + c0 : NULL;
        float *L = w->L + 16 * r;
        const float m_old = t->m[row];
        if (m_old != -INFINITY && !fwd_row(s, nkb, keep, w->c2, w->mlog[r], 1, p, pl, L)) continue;
        /* the max moves (or nothing was kept before): the row's rescale */
        const float mb = fwd_row_max(s, nkb, keep, w->scale);
        const float m_new = (mb > m_old || mb != mb) ? mb : m_old;
        if (m_new == -INFINITY) { /* nothing kept yet: p = 0 (or NaN from a NaN score) */
            fwd_row(s, nkb, keep, w->c2, 0.0f, 0, p, pl, L);
            continue;
        }
        if (m_old != -INFINITY) {
            const float al = expf(m_old - m_new);
            w->alpha[r] = al;
            rescale = 1;
            t->l[row] *= al;
            for (int i = 0; i < 16; i++) L[i] *= al;
        } else {
            w->alpha[r] = 1.0f; /* acc and l are 0 */
        }
        t->m[row] = m_new;
        w->mlog[r] = m_new * FWD_LOG2E;
        fwd_row(s, nkb, keep, w->c2, w->mlog[r], 0, p, pl, L);
    }
    return rescale;
}

/* acc += P V for the strip's pending columns up to c_end (a multiple of 32, or the tile's end). */
static void fwd_strip_pv(const fa_fwd_tile *t, const fwd_scratch *w, fwd_strip *st, int64_t c_end)
{
    if (st->pend < c_end)
        fwd_pv(t, w, st->two_r, st->pend / 32, (c_end + 31) / 32, st->c, st->ldc);
    st->pend = c_end;
}

/* A rescale at the block at c0: the pending products with the old max first, then each
 * moved row's acc *= alpha. */
static void fwd_strip_rescale(const fa_fwd_tile *t, const fwd_scratch *w, fwd_strip *st, int64_t c0)
{
    fwd_strip_pv(t, w, st, c0);
    for (int64_t r = 0; r < st->nr; r++) {
        if (t->m[st->r0 + r] == -INFINITY || w->alpha[r] == 1.0f) continue;
        float *ar = st->c[r / 16] + (r % 16) * st->ldc[r / 16];
        for (int64_t e = 0; e < t->dv; e++) ar[e] *= w->alpha[r];
    }
    for (int64_t r = 0; r < st->nr; r++) w->alpha[r] = 1.0f;
}

/* The strip's end: the lane sums into l, in one fixed order, and a partial block of
 * acc back from atail. */
static void fwd_strip_end(const fa_fwd_tile *t, const fwd_scratch *w, const fwd_strip *st)
{
    for (int64_t r = 0; r < st->nr; r++) {
        const float *L = w->L + 16 * r;
        float h[8];
        for (int i = 0; i < 8; i++) h[i] = L[i] + L[i + 8];
        for (int i = 0; i < 4; i++) h[i] += h[i + 4];
        h[0] += h[2], h[1] += h[3];
        t->l[st->r0 + r] += h[0] + h[1];
    }
    for (int i = 0; i < 1 + st->two_r; i++)
        if (st->c[i] == w->atail)
            for (int64_t r = 0; r < 16 && st->r0 + 16 * i + r < t->rows; r++)
                memcpy(t->acc + (st->r0 + 16 * i + r) * t->ldacc, w->atail + r * w->ep, (size_t)t->dv * 4);
}

/* One strip over the blocks of its columns: each block's scores computed during the
 * block before's softmax, P V deferred until a rescale or the strip's end. */
static void fwd_strip_run(const fa_fwd_tile *t, const fwd_scratch *w, fwd_strip *st)
{
    const int64_t cols = t->cols;
    int64_t cs, ce;
    if (!fwd_strip_columns(t, st, &cs, &ce)) return; /* nothing kept: the state stays */
    const int64_t b0 = cs / FWD_BLOCK, b1 = (ce + FWD_BLOCK - 1) / FWD_BLOCK;
    fwd_strip_begin(t, w, st);
    st->pend = b0 * FWD_BLOCK;
    fwd_qk_job qj;
    fwd_qk_block(t, w, st, b0 * FWD_BLOCK, w->S[0], &qj);
    fwd_qk_run(&qj, qj.steps);
    for (int64_t b = b0; b < b1; b++) {
        const int64_t c0 = b * FWD_BLOCK, nc = cols - c0 < FWD_BLOCK ? cols - c0 : FWD_BLOCK;
        const float *S = w->S[(b - b0) & 1];
        if (b + 1 < b1) fwd_qk_block(t, w, st, c0 + FWD_BLOCK, w->S[(b + 1 - b0) & 1], &qj);
        else qj.steps = 0;
        const int rescale = fwd_block_rows(t, w, st, S, c0, (int)((nc + 15) / 16), &qj);
        fwd_qk_run(&qj, qj.steps); /* before any product below reuses the tiles */
        for (int64_t r = st->nr; r < (st->two_r ? 32 : 16); r++) {
            memset(w->P + r * w->ldp + c0, 0, (size_t)FA_RUP32(nc) * 2);
            if (w->Pl) memset(w->Pl + r * w->ldp + c0, 0, (size_t)FA_RUP32(nc) * 2);
        }
        if (rescale) fwd_strip_rescale(t, w, st, c0);
    }
    fwd_strip_pv(t, w, st, b1 * FWD_BLOCK < cols ? b1 * FWD_BLOCK : cols);
    fwd_strip_end(t, w, st);
}

static void fwd_tile(const fa_fwd_tile *t, int i8)
{
    tiles_on();
    fwd_scratch w;
    fwd_scratch_init(t, i8, &w);
    for (int64_t r0 = 0; r0 < t->rows; r0 += 32) {
        fwd_strip st = {.r0 = r0, .nr = t->rows - r0 < 32 ? t->rows - r0 : 32};
        st.two_r = st.nr > 16;
        fwd_strip_run(t, &w, &st);
    }
}

void FA_AMX_FN(fwd_bf16)(const fa_fwd_tile *t) { fwd_tile(t, 0); }

/* The fused forward on int8 codes (kernels.h, fwd_i8): fwd_bf16's strips, blocks and
 * softmax, with each block's Q K^T on tdpbssd and its int32 sums made scores row by row
 * just before the row's softmax. */
void FA_AMX_FN(fwd_i8)(const fa_fwd_tile *t) { fwd_tile(t, 1); }
