/*
 * kernels.h: the micro-kernel table. Each ISA directory under src/kernels/
 * fills one fa_kernels; only its kernel files are compiled with ISA flags. The core
 * (tile loops, masking, the online-softmax bookkeeping around the kernels,
 * threading) calls through this table and never sees an intrinsic. Adding an
 * ISA = a directory with its kernels, its table's init function and run-time
 * predicate (FA_KERNELS_ISA below), one row in registry.c and one CMake line.
 *
 * Tables inherit, as BLIS's contexts do: each ISA's init function starts from
 * its parent's table (ref -> avx2 -> avx512 -> avx512bf16 -> amx; avx2 -> avx2vnni; ref -> neon;
 * ref -> amx-model, the tile kernels on a software model of the tiles) and
 * overrides what it has, so NO entry is ever NULL and the core never checks
 * one. What an entry's presence used to say ("this ISA has a native bf16 dot
 * product") is said by `flags` instead. The init functions live in
 * <isa>_table.c files built WITHOUT the ISA's flags: the registry builds every
 * table on any CPU (to list them), and only the kernels themselves may use the
 * ISA's instructions.
 *
 * Tile layouts. A tile pairs a block of query rows r (0 <= r < rows) with a
 * block of key columns c (0 <= c < cols). Scores are kept TRANSPOSED, st[c][r],
 * so a SIMD vector runs along query rows: the per-row running max and sum, and
 * the mask bounds, are then plain vertical vector operations, and K and V are
 * read in their natural row layout (no per-tile transpose):
 *
 *   qt  [x][r]  x < D    Q block transposed and pre-multiplied by the scale   ld = ldqt
 *   k   [c][x]           K rows as the user stores them (or converted to f32) ld = ldk
 *   st  [c][r]           scores, then probabilities, in place                   ld = ldst
 *   v   [c][e]  e < Dv   V rows                                                 ld = ldv
 *   acc [r][e]           unnormalised output rows                               ld = ldacc
 *   m, l, alpha  [r]     running max, running sum, last rescale factor
 *
 * qt, st and acc are 64-byte aligned; ldqt, ldst and ldacc are multiples of
 * FA_ROW_ALIGN floats. Padding (rows <= r < round_up(rows, FA_ROW_ALIGN) in qt
 * and st, dv <= e < ldacc in acc) may be read and written freely, so kernels can
 * use whole vectors. k and v point into the caller's tensors when those are f32
 * with unit inner stride: no alignment, and ldk/ldv may be any value (even 0 or
 * negative). Any rows >= 1, cols >= 1, d >= 1, dv >= 1 must work.
 * Leading dimensions count elements (floats, or uint16 for bf16 data).
 */
#ifndef FA_KERNELS_H
#define FA_KERNELS_H

#include "flashattn.h"
#include "half.h" /* FA_E4M3_F16_UNIT */

#include <math.h>

#include <stddef.h>
#include <stdint.h>

/* Row-block granularity of every panel: the widest vector (16 floats), so every
 * ISA works on whole vectors along r. A table's row_align divides it. */
#define FA_ROW_ALIGN 16

/* Scratch of the bf16 pair kernels, the one rule every caller allocates by (a bound
 * for every table's kernels: avx512bf16's repack their operands, amx's also keep
 * zero-padded copies of partial tiles). Round-ups: */
#define FA_RUP16(x) (((x) + 15) / 16 * 16)
#define FA_RUP32(x) (((x) + 31) / 32 * 32)

/* uint16 of scratch stx_bf16 needs: x as row pairs, st in bf16, a partial acc block. */
#define FA_STX_BF16_SCRATCH(rows, cols, n, ldst)                                                                  \
    ((FA_RUP32(rows) + 32) * (FA_RUP16(n) + 32) + (FA_RUP16(cols) + 1) * ((ldst) + FA_RUP32(rows) + 34) + 96)

/* dwords of scratch pv_bf16 needs: P as bf16 pairs (or transposed), the last partial
 * chunk of V pairs, a partial acc block. */
#define FA_PV_BF16_SCRATCH(rows, cols, dv) (FA_RUP16(rows) * (FA_RUP32(cols) + 32) / 2 + 32 * FA_RUP16(dv) + 48)

/* Rows this many bytes apart (a page or more, or a multiple of 1 KB) fall into a
 * few cache sets and each needs its own TLB entry, so a kernel's reuse of a tile
 * of them misses (avx512_kernels.c, pv_copying); the core packs such rows. */
static inline int fa_rows_scattered(int64_t row_bytes)
{
    const int64_t b = row_bytes < 0 ? -row_bytes : row_bytes;
    return b >= 4096 || (b >= 1024 && b % 1024 == 0);
}

/* The row distance of packed rows of len 4-byte elements (f32, or bf16 pairs):
 * whole vectors, and never a multiple of 1 KB, whose rows would fall into a few
 * cache sets (the kernels walk a column slice down many rows). */
static inline int64_t fa_packed_ld(int64_t len)
{
    const int64_t ld = (len + FA_ROW_ALIGN - 1) / FA_ROW_ALIGN * FA_ROW_ALIGN;
    return ld % 256 == 0 ? ld + FA_ROW_ALIGN : ld;
}

/* Rows the small-row (decode) kernels take at most, and columns per call. */
#define FA_SMALL_ROWS 8
#define FA_SMALL_COLS 512

/* Element types of K/V rows in the small-row kernels. */
enum { FA_KV_F32 = 0, FA_KV_F16 = 1, FA_KV_BF16 = 2, FA_KV_I8 = 3, FA_KV_F8E4M3 = 4, FA_KV_F8E5M2 = 5, FA_KV_TYPES = 6 };

/* The element types stored as codes whose rows come with a scale (kscale, vscale):
 * element = scale * code. */
static inline int fa_kv_scaled(int kv)
{
    return kv == FA_KV_I8 || kv == FA_KV_F8E4M3 || kv == FA_KV_F8E5M2;
}

static inline int64_t fa_kv_elem_bytes(int kv)
{
    return kv == FA_KV_F32 ? 4 : kv == FA_KV_F16 || kv == FA_KV_BF16 ? 2 : 1;
}

/* What the vector loaders' elements of type kv fall short of the code's value by, a
 * power of two they fold into the row scales (exact): E4M3 widens through binary16
 * as value / 256 (half.h's fa_e4m3_to_f16_bits); every other type loads as itself. */
static inline float fa_kv_load_unit(int kv)
{
    return kv == FA_KV_F8E4M3 ? FA_E4M3_F16_UNIT : 1.0f;
}

/* A micro-kernel's register block: the accumulators it keeps in registers, as
 * rows (query rows r) x cols (key columns c for qk, output columns e for pv).
 * 1 x 1: no register block (the reference). */
typedef struct fa_kernel_block {
    int32_t rows, cols;
} fa_kernel_block;

/* fa_kernels.flags: what the table's kernels are, beyond being there. */
enum {
    /* qk_bf16/pv_bf16 multiply bf16 pairs natively (e.g. vdpbf16ps); without it they
     * are the reference's scalar ones, correct but never worth choosing. */
    FA_KERNELS_BF16_DOT = 1u << 0,
    /* qk_small/softmax_small/pv_small are this table's way to run <= FA_SMALL_ROWS
     * rows: the core takes the small-row path only when set. A table that replaces
     * the wide kernels but inherits slower small ones should clear it. */
    FA_KERNELS_SMALL_ROWS = 1u << 1,
    /* the bf16 pair kernels are faster than widening to fp32 on every CPU that runs the
     * table (a tile unit), so bf16 inputs take them without asking the CPU
     * (fa_bf16_dot_active in plan_inputs.c); without it only CPUs that issue the table's dot
     * product at the FMA rate do (fa_cpu.bf16_dot_fast) */
    FA_KERNELS_BF16_DOT_FAST = 1u << 2,
    /* a tile unit: thread_begin/thread_end configure and release it, probe_tile measures it */
    FA_KERNELS_TILES = 1u << 3,
    /* never chosen automatically, only by FLASHATTN_ARCH (a model of hardware, for tests) */
    FA_KERNELS_EXPLICIT = 1u << 4,
    /* qk_small_i8/pv_small_i8 are this table's own: integer dot products (AVX-512-VNNI), or
     * the reference itself. FA_PARAM_QUANT_MATMUL takes them only where this is set; a table
     * that inherits the reference's scalar ones clears it (there the mode computes exactly,
     * as the contract allows). */
    FA_KERNELS_I8_DOT = 1u << 5,
    /* fwd_bf16 is this table's own fused forward (row-major tiles, no transpose of P),
     * faster than the qk_bf16 / softmax / pv_bf16 loop: the core takes it for the wide
     * bf16 tiles it can (plain keys and band masks, no element-wise rules, no dropout).
     * Without it the table's fwd_bf16 is the reference's, correct but never chosen. */
    FA_KERNELS_FWD_BF16 = 1u << 6,
    /* bwd_bf16 is this table's own fused backward tile (row-major tiles, every product
     * on the tile unit): the core takes it for the bf16 pair tiles it can (plain keys and
     * band masks, no element-wise rules, no softcap, no dropout). Without it the table's
     * bwd_bf16 is the reference's, correct but never chosen. */
    FA_KERNELS_BWD_BF16 = 1u << 7,
    /* fwd_i8 is this table's own fused forward on int8 Q K^T codes (the tile unit's int8
     * products, fwd_bf16's softmax and P V): FA_PARAM_QUANT_MATMUL's wide bf16 tiles take it
     * where fwd_bf16 would be taken. Without it the table's fwd_i8 is the reference's,
     * correct but never chosen. */
    FA_KERNELS_FWD_I8 = 1u << 8,
    /* qk_i8 is this table's own (integer dot products on vectors along rows): FA_PARAM_QUANT_MATMUL's
     * wide bf16 tiles take it for step 1 and the bf16 path's kernels for steps 6 to 9 (docs/semantics.md,
     * 11), where no fused int8 forward (FA_KERNELS_FWD_I8) is taken. Without it the table's qk_i8 is the
     * reference's, correct but never chosen. */
    FA_KERNELS_QK_I8 = 1u << 9,
};

/* The head dims up to which FA_PARAM_QUANT_MATMUL applies: int32 sums of D products of
 * int8 codes (and of codes + 128, 255 * 127 * D) stay below 2^31 (docs/semantics.md, 11). */
#define FA_QUANT_D_MAX 65536

/* pv_small_i8 quantises a row's weights only when their maximum is at least this: above
 * it 255 / wmax is finite (docs/semantics.md, 11); below, the row is computed exactly. */
#define FA_PV_I8_WMIN 0x1p-100f

/* The q8 rows of qk_small_i8: codes padded with zeros to whole 64-byte vectors. */
static inline int64_t fa_q8_ld(int64_t d) { return (d + 63) / 64 * 64; }

/* K as the B operand of Q K^T on pairs along d (pack_kt_bf16), in blocks of 16 keys,
 * each block FA_KT_PAIRS(d) pair rows of 16 dwords (whole chunks of 32 d: the rows past
 * ceil(d/2) are zero), so that one B tile is 1 KB of contiguous memory. */
#define FA_KT_PAIRS(d) FA_RUP16(((d) + 1) / 2)
/* dwords of K^T for keys [0, n) (whole blocks) */
#define FA_KT_DWORDS(n, d) ((((n) + 15) / 16) * 16 * FA_KT_PAIRS(d))

/* K codes as the B operand of int8 Q K^T (fwd_i8), in blocks of 16 keys: each block
 * FA_KT_QUADS(d) rows of 16 dwords, dword p of key c its codes 4p .. 4p+3 (whole chunks of
 * 64 d, zero past d), so that one B tile is 1 KB of contiguous memory, as K^T pairs are. */
#define FA_KT_QUADS(d) FA_RUP16(((d) + 3) / 4)

/*
 * qk_i8's Q operand, transposed as qk's and qk_bf16's are (vectors along rows): Q^T quads,
 * qt4[p * ldqt4 + r] = the dword of the u8 bytes q8[r][4p + b] + 128 (b = 0..3, lowest
 * byte first; codes past d count as 0) for p < FA_QT4_QUADS(d) and r < round_up(rows,
 * FA_ROW_ALIGN) (padding rows as codes 0); ldqt4 a multiple of FA_ROW_ALIGN, 64-byte aligned.
 * The +128 makes q the unsigned operand of vpdpbusd; K's code sums take it off again.
 */
#define FA_QT4_QUADS(d) (((d) + 3) / 4)
void fa_pack_qt_u8(int64_t rows, int64_t d, const int8_t *q8, int64_t ldq8, uint32_t *qt4, int64_t ldqt4);

/* bytes of scratch fwd_bf16 needs for a tile of cols keys (any table, either mode). */
#define FA_FWD_BF16_SCRATCH(cols, dv)                                                                             \
    (64 * 10 + 2 * 32 * 64 * 4 + 2 * 32 * (FA_RUP32(cols) + 32) * 2 + 32 * 16 * 4 + 32 * 4 * 2 +                  \
     3 * 16 * FA_RUP16(dv) * 4)

/*
 * One key tile of the fused bf16 forward (fwd_bf16): scores row-major, P written as
 * row-major bf16, which is already the A operand of P V. For r < rows, c < cols,
 * kept(c) = lo == NULL || (lo[r] <= c && c <= hi[r]) (tile-relative, as softmax's):
 *   s[r][c] = scale * sum_x q[r][x] k_c[x]     (bf16 products, fp32 sums)
 *   m[r]    moves to the max over kept s only when some kept s exceeds it by more than
 *           FA_FWD_LAZY_LOG2 / log2(e) (lazy rescale; exact, since acc and l then use
 *           the same m): m_new, alpha = exp(m_old - m_new), l and acc scaled by alpha
 *   e       = exp(s - m) to about 2^-22 relative (fp32), 0 for masked columns (and
 *             where exp(s - m) < 2^-125: below fp32's resolution of l, which holds a
 *             term >= 1); l[r] += sum of e (so lse = m + log l is fp32-accurate);
 *   p       = e rounded to bf16 (as vcvtne2ps2bf16); acc[r][e] += sum_c p v_c[e];
 *   bf16x3 mode (vlo != NULL; f32 as bf16 products, util/convert.h): v = vh + vl, V's
 *           hi pairs in vp and its lo pairs in vlo; pl = bf16(e - p) (exact difference,
 *           then rounded as p is) and acc[r][e] += sum_c p vh + p vl + pl vh, the three
 *           terms of one 32-key chunk in that order (fp32 sums); l stays the sum of e.
 * With nothing kept yet m stays -inf and p = 0; a NaN score makes its row NaN.
 *   q    rows of bf16, ldq apart (any alignment), zero-padded to FA_RUP32(d) columns and
 *        FA_RUP16(rows) rows
 *   kt   K^T pairs from key 0 of the tile (pack_kt_bf16's blocks); the keys of its last
 *        block past cols must be readable (any values: masked)
 *   vp   V as key pairs from key 0 of the tile (pack_pairs_bf16), ldvp >= FA_RUP16(dv),
 *        zero past dv; rows past cols are never read; vlo the same for V's lo parts, or
 *        NULL (the plain mode)
 *   acc  rows, ldacc apart (ldacc >= FA_RUP16(dv)); only rows < rows are touched
 *   scratch  FA_FWD_BF16_SCRATCH(cols, dv) bytes, 64-byte aligned
 * Like pv_bf16, the tile products multiply a masked p = 0 by v: the core hands over
 * partly masked tiles only when their V rows are finite.
 */
#define FA_FWD_LAZY_LOG2 8.0f
/*
 * fwd_i8: the same tile with the scores of int8 codes (docs/semantics.md, 11, one digit),
 * all else as fwd_bf16 with scale 1 (the softmax scale is in q's codes; t->bf16 unread):
 *   s[r][c] = float(A) * (qs[r] * ks[c]) (+ qc[r] where qc is not NULL), each step
 *             rounded to nearest as written, A = sum_{x < d} q8[r][x] kcode_c[x] (int32),
 *   q8   rows of int8 codes, ldq8 bytes apart, zero from d to fa_q8_ld(d) and in the rows
 *        rows .. FA_RUP16(rows)
 *   kt   K codes from key 0 of the tile as FA_KT_QUADS blocks; the keys of its last block
 *        past cols readable (any values: masked); ks readable for FA_RUP16(cols) keys
 * So a score is qk_small_i8's with one digit, bit for bit (plus qc[r], one f32 add).
 */
typedef struct fa_fwd_tile {
    int64_t rows, cols, d, dv;
    struct { /* fwd_bf16's scores (and its bf16x3 mode's V lo pairs); fwd_i8 leaves it 0 */
        const uint16_t *q;
        int64_t ldq;
        float scale;
        const uint32_t *vlo;
    } bf16;
    struct { /* fwd_i8's scores: Q codes, their scales and smoothing terms, K's scales */
        const int8_t *q8;
        int64_t ldq8;
        const float *qs, *qc, *ks;
    } i8;
    /* both: K^T (pairs or codes), V pairs, the band, the softmax state and the output */
    const uint32_t *kt;
    const uint32_t *vp;
    int64_t ldvp;
    const int32_t *lo, *hi;
    float *m, *l, *acc;
    int64_t ldacc;
    void *scratch;
} fa_fwd_tile;

/* bytes of scratch bwd_bf16 needs for a tile of rows x cols (any table) */
#define FA_BWD_BF16_SCRATCH(rows, cols, d)                                                                        \
    (3 * FA_RUP32(rows) * (FA_RUP16(cols) + 16) * 4 + FA_RUP32(rows) * FA_RUP32(cols) * 2 + 16 * FA_RUP16(d) * 4 + \
     64 * 8)

/*
 * One (query block, key tile) pair of the fused bf16 backward (bwd_bf16), every
 * product on row-major tiles; dK and dV accumulate TRANSPOSED, so that no score tile is
 * ever transposed (the query block's Q^T and dO^T are packed once for every tile it
 * meets, the key tile's dK^T, dV^T turned once when the tile is done). For r < rows,
 * c < cols, kept(c) = lo == NULL || (lo[r] <= c && c <= hi[r]) (tile-relative):
 *   s[r][c]  = sum_x q[r][x] k_c[x]                    (bf16 products, fp32 sums)
 *   p        = kept && lse[r] != -inf ? exp(scale s - lse[r]) : 0   (fp32, to a few ulps
 *              of 2^-23 relative), pb = bf16(p) as vcvtne2ps2bf16 rounds
 *   dp[r][c] = sum_e dout[r][e] v_c[e]
 *   ds       = kept ? p (dp - dvec[r]) : 0 (fp32), dsb = bf16(ds) likewise
 *   dq[r][x]  += sum_c dsb[r][c] k_c[x]     (dq != NULL)
 *   dvt[e][c] += sum_r pb[r][c] dout[r][e]  (dvt != NULL)
 *   dkt[x][c] += sum_r dsb[r][c] q[r][x]    (dkt != NULL)
 * each sum over its whole reduction in index order of 32-wide chunks, as the tile unit
 * takes them, so the bits of one output never depend on which others are asked for.
 *   q, dout  bf16 rows ldq, lddo apart, zero from d (dv) to FA_RUP32(d) (FA_RUP32(dv)),
 *            FA_RUP16(rows) rows (any finite values in the padding rows)
 *   qt, dot  Q^T, dO^T: qt[x][r] = q[r][x], FA_RUP16(d) rows ldqt apart, zero for
 *            rows <= r < FA_RUP32(rows) (dot likewise with dv)
 *   kt, vt   K^T, V^T as pack_kt_bf16's blocks from key 0 of the tile (of d, dv); the keys
 *            of the last block past cols must be finite
 *   kp       K as key pairs (pack_pairs_bf16), ldkp >= FA_RUP16(d), FA_RUP32(cols) / 2 pair
 *            rows, zero past cols and past d
 *   dq       rows lddq apart (>= FA_RUP16(d)), its padding columns may be written
 *   dkt, dvt FA_RUP16(d) (FA_RUP16(dv)) rows of lddkt (lddvt >= FA_RUP16(cols)) floats;
 *            padding may be written
 *   scratch  FA_BWD_BF16_SCRATCH(rows, cols, d) bytes, 64-byte aligned
 * A masked pair's p = ds = 0 meets k, q and dout in the products: the core hands over
 * partly masked tiles only when those are finite.
 */
typedef struct fa_bwd_tile {
    int64_t rows, cols, d, dv;
    const uint16_t *q, *dout, *qt, *dot;
    int64_t ldq, lddo, ldqt, lddot;
    const uint32_t *kt, *vt, *kp;
    int64_t ldkp;
    float scale;
    const float *lse, *dvec;
    const int32_t *lo, *hi;
    float *dq, *dkt, *dvt;
    int64_t lddq, lddkt, lddvt;
    void *scratch;
} fa_bwd_tile;

/*
 * The kernels' signatures, one type each: the fields of fa_kernels below are pointers
 * to them (their contracts are there), and an ISA's header declares its kernels with
 * them (`fa_qk_fn fa_avx2_qk_16x6;`), so a signature is written once.
 */
typedef void fa_pack_qt_fn(int64_t rows, int64_t d, const float *q, int64_t ldq, float scale, float *qt,
                           int64_t ldqt);
typedef void fa_qk_fn(int64_t rows, int64_t cols, int64_t d, const float *qt, int64_t ldqt, const float *k,
                      int64_t ldk, float *st, int64_t ldst);
/* softmax and softmax_small */
typedef void fa_softmax_fn(int64_t rows, int64_t cols, float *st, int64_t ldst, const int32_t *lo,
                           const int32_t *hi, float *m, float *l, float *alpha);
typedef void fa_pv_fn(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const float *v,
                      int64_t ldv, const float *alpha, float *acc, int64_t ldacc);
typedef void fa_ds_fn(int64_t rows, int64_t cols, const float *st, int64_t ldst, float *dp, int64_t lddp,
                      const float *dvec);
typedef void fa_stx_fn(int64_t rows, int64_t cols, int64_t n, const float *st, int64_t ldst, const float *x,
                       int64_t ldx, float *acc, int64_t ldacc);
/* f16_to_f32 and bf16_to_f32; f32_to_f16 and f32_to_bf16 */
typedef void fa_to_f32_fn(const uint16_t *src, float *dst, int64_t n);
typedef void fa_from_f32_fn(const float *src, uint16_t *dst, int64_t n);
typedef void fa_pack_qt_bf16_fn(int64_t rows, int64_t d, const uint16_t *q, int64_t ldq, uint16_t *qt2,
                                int64_t ldqt2);
typedef void fa_qk_bf16_fn(int64_t rows, int64_t cols, int64_t d, const uint16_t *qt2, int64_t ldqt2,
                           const uint16_t *k, int64_t ldk, float scale, float *st, int64_t ldst);
typedef void fa_pack_pairs_bf16_fn(int64_t nrows, int64_t len, const uint16_t *src, int64_t ld, uint32_t *dst,
                                   int64_t ld32);
typedef void fa_pv_bf16_fn(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst,
                           const uint32_t *vp, int64_t ldvp, const float *alpha, float *acc, int64_t ldacc,
                           void *scratch);
typedef void fa_stx_bf16_fn(int64_t rows, int64_t cols, int64_t n, const float *st, int64_t ldst,
                            const uint16_t *x, int64_t ldx, float *acc, int64_t ldacc, void *scratch);
typedef void fa_qk_small_fn(int64_t rows, int64_t cols, int64_t d, const float *q, int64_t ldq,
                            const void *const *krow, int kv, const float *kscale, float *s, int64_t lds);
typedef void fa_pv_small_fn(int64_t rows, int64_t cols, int64_t dv, const float *s, int64_t lds,
                            const void *const *vrow, int kv, const float *vscale, const float *alpha, float *acc,
                            int64_t ldacc);
/* probe_fma, probe_bf16, probe_tile: FLOPs done in `iters` iterations */
typedef double fa_probe_fn(int64_t iters);

/* Rows another call will read next (the decode loop's next stack's V rows, `bytes`
 * each), which a kernel taking them prefetches towards L2 in step with its own loop:
 * the misses stay in flight while it computes instead of coming as a burst before it. */
typedef struct fa_rows_ahead {
    const void *const *row;
    int64_t n, bytes;
} fa_rows_ahead;

typedef struct fa_kernels {
    const char *name;   /* what FLASHATTN_ARCH and fa_context_isa() call it */
    const char *parent; /* the name of the table this one starts from; NULL for ref, the root */
    unsigned flags;     /* FA_KERNELS_* */

    /* Preferred blocking, read by the planner (plan.c): row tiles are at least one
     * qk register block tall where the heads allow, and never finer than row_align
     * (a divisor of FA_ROW_ALIGN, which stays the padding of every panel). */
    int32_t row_align;
    fa_kernel_block qk_block, pv_block;

    /* qt[x][r] = scale * q[r][x] for r < rows; zero for rows <= r < round_up(rows, FA_ROW_ALIGN). */
    fa_pack_qt_fn *pack_qt;

    /* st[c][r] = sum_x qt[x][r] * k[c][x] for c < cols and r < round_up(rows, FA_ROW_ALIGN)
     * (the padding rows come out 0 for finite k, from the zero padding of qt). */
    fa_qk_fn *qk;

    /*
     * One online-softmax step over a tile, per row r < rows:
     *   kept(c)  = lo == NULL || (lo[r] <= c && c <= hi[r])   (tile-relative band)
     *   m_new    = max(m[r], max over kept c of st[c][r])      (NaN-propagating)
     *   if m_new == -inf:  p = 0 everywhere, alpha[r] = 1      (nothing kept yet)
     *   else:              p = exp(st - m_new) for kept c, 0 otherwise;
     *                      alpha[r] = exp(m[r] - m_new);  l[r] = l[r]*alpha[r] + sum_c p
     *   m[r] = m_new; st[c][r] = p.
     * exp must be accurate to a few ulps (see the ISA's own note) and exp(-inf) = 0.
     */
    fa_softmax_fn *softmax;

    /* acc[r][e] = alpha[r] * acc[r][e] + sum_c st[c][r] * v[c][e], for r < rows, e < dv.
     * alpha == NULL means 1. */
    fa_pv_fn *pv;

    /*
     * The backward's own kernels (algo_flash_bwd.c), on the same transposed tiles.
     * The backward's other products are the forward's kernels: S^T = qk(Q, K) and
     * dP^T = qk(dO, V) with the transposed panels pack_qt makes, P^T = softmax with
     * m = lse, and dQ += dS K = pv(dS^T, K).
     *
     * ds: the softmax's backward, in place over dp:
     *   dp[c][r] = st[c][r] * (dp[c][r] - dvec[r])   for c < cols, r < round_up(rows, FA_ROW_ALIGN)
     *   (st holds P, dp holds dP = dO . v_c; dvec[r] = dot(dO_r, o_r), padded with 0.
     *   dp and st are 64-byte aligned with ld a multiple of FA_ROW_ALIGN; padding rows
     *   of st are 0, so they come out 0.) A masked p = 0 gives ds = 0 even where dp is
     *   not finite: NaN only from a NaN p or a NaN dvec, as the math says.
     *
     * stx: the products with a transposed tile, acc[c][e] += sum_{r < rows} st[c][r] * x[r][e]
     *   for c < cols, e < n: dV += P^T dO (x = dO rows) and dK += dS^T Q (x = Q rows).
     *   x: f32 rows, any ld, no alignment; acc: 64-byte aligned, ldacc a multiple of
     *   FA_ROW_ALIGN, its padding columns n <= e < ldacc may be written. Like pv, a
     *   vector stx may multiply st = 0 by x; the core takes the reference's stx (which
     *   skips st == 0) for tiles whose x is not finite.
     */
    fa_ds_fn *ds;
    fa_stx_fn *stx;

    /* Row conversions used when packing f16/bf16 tensors into fp32 panels. */
    fa_to_f32_fn *f16_to_f32;
    fa_to_f32_fn *bf16_to_f32;
    /* The other way, for f16/bf16 outputs: each element exactly as half.h's
     * fa_f32_to_f16 / fa_f32_to_bf16 rounds it (nearest even, overflow to inf, the
     * same quiet NaN bits), so the bits never depend on the ISA. */
    fa_from_f32_fn *f32_to_f16;
    fa_from_f32_fn *f32_to_bf16;

    /*
     * The bf16 dot-product path (native where flags has FA_KERNELS_BF16_DOT; the
     * reference's scalar form elsewhere): bf16 q, k, v are multiplied as bf16
     * pairs with fp32 accumulation instead of being widened to f32 first. A bf16
     * product is exact in fp32, so only the accumulation rounds.
     *   qt2  Q block as bf16 pairs: qt2[(x/2)*ldqt2 + 2*r + (x&1)] = q[r][x], ldqt2 = 2*ldqt
     *        (uint16 units), x padded to even with zeros, rows padded with zeros;
     *        NOT pre-scaled (bf16 rounding of q*scale would add error): qk_bf16 scales.
     *   k    bf16 K rows, natural layout, ldk in uint16 units.
     *   vp   V as row pairs (pack_pairs_bf16's layout), ldvp dwords: pv_bf16 reduces
     *        along keys, so the two keys of a bf16 pair must sit in one dword. The
     *        core packs V once per (sequence, kv head) and shares it across query
     *        blocks, or per tile into scratch; the backward packs each K tile once
     *        for all the query blocks that meet it. A tile matrix unit (AMX) takes
     *        the same layout as its B operand.
     *   pv_bf16 rounds P to bf16 (nearest even) and pairs it in `scratch`, which
     *        holds at least FA_PV_BF16_SCRATCH(rows, cols, dv) dwords (64-byte aligned).
     *        A table may round as vcvtne2ps2bf16 does (avx512bf16, amx, amx-model):
     *        fp32 subnormals become a zero of their sign first (the bf16 products treat
     *        bf16 subnormals as zero anyway; only the largest ones, which nearest even
     *        would lift to the smallest normal, 2^-126, contribute differently).
     *
     * pack_pairs_bf16: dst[p][e] = the dword (src[2p][e], src[2p+1][e]) (low word
     *   from row 2p) for p < ceil(nrows / 2) and e < ld32, zero for e >= len and for
     *   the missing partner of an odd nrows. src: any ld (uint16), no alignment;
     *   dst 64-byte aligned, ld32 a multiple of FA_ROW_ALIGN and >= len. The pair
     *   layout of pv_bf16's V and of stx_bf16's x, whose reductions run along rows.
     */
    fa_pack_qt_bf16_fn *pack_qt_bf16;
    fa_qk_bf16_fn *qk_bf16;
    fa_pack_pairs_bf16_fn *pack_pairs_bf16;
    fa_pv_bf16_fn *pv_bf16;
    /* The backward's stx on bf16 data: acc[c][e] += sum_{r < rows} bf16(st[c][r]) * x[r][e],
     * st rounded to bf16 (nearest even) as a naive bf16 backward rounds P and dS, x bf16
     * rows (ldx in uint16 units, any value), fp32 accumulation; acc as in stx. scratch
     * holds at least FA_STX_BF16_SCRATCH(rows, cols, n, ldst) uint16, 64-byte aligned. */
    fa_stx_bf16_fn *stx_bf16;
    /* pack_kt_bf16: for keys j = j0 + c, c < cols: kt[(j / 16) * 16 P + 16 p + j % 16] = the
     * dword (k[c][2p], k[c][2p+1]) (low word x = 2p) for p < P = FA_KT_PAIRS(d), zero where
     * x >= d; other keys' dwords untouched. k any ld (uint16); j0 >= 0 any. fwd_bf16: above. */
    void (*pack_kt_bf16)(int64_t cols, int64_t d, const uint16_t *k, int64_t ldk, uint32_t *kt, int64_t j0);
    void (*fwd_bf16)(const fa_fwd_tile *t);
    void (*fwd_i8)(const fa_fwd_tile *t); /* above, fa_fwd_tile */
    /*
     * qk_i8: step 1 of FA_PARAM_QUANT_MATMUL's i8 mode on the transposed tiles (docs/semantics.md,
     * 11, one digit), for c < cols and r < round_up(rows, FA_ROW_ALIGN):
     *   st[c][r] = float(A) * (qs[r] * ks[c]) (+ qc[r] where qc is not NULL), each step rounded
     *              to nearest as written, A = sum_{x < d} q8[r][x] k8[c][x] (exact int32)
     *   qt4      Q codes as Q^T quads (fa_pack_qt_u8); qs, qc read for round_up(rows, 16) rows
     *   k8       K codes, rows ldk8 bytes apart (any alignment), zero from d to round_up(d, 4)
     *   ksum[c]  sum_x k8[c][x] (what q's +128 adds, 128 ksum[c], comes off A with it)
     * So a score is qk_small_i8's with one digit, bit for bit (plus qc[r], one f32 add).
     */
    void (*qk_i8)(int64_t rows, int64_t cols, int64_t d, const uint32_t *qt4, int64_t ldqt4, const float *qs,
                  const float *qc, const int8_t *k8, int64_t ldk8, const float *ks, const int32_t *ksum, float *st,
                  int64_t ldst);
    /* pack_t_bf16: dst[x][r] = src[r][x] for x < len, r < rows, zero for rows <= r <
     * FA_RUP32(rows) (the rows x of dst, lddst >= FA_RUP32(rows) uint16 apart; src any ld).
     * bwd_bf16's Q^T and dO^T. bwd_bf16: above. */
    void (*pack_t_bf16)(int64_t rows, int64_t len, const uint16_t *src, int64_t ld, uint16_t *dst, int64_t lddst);
    void (*bwd_bf16)(const fa_bwd_tile *t);

    /*
     * Small-row path (decoding): for rows <= FA_SMALL_ROWS query rows (a few GQA
     * heads of one or a few tokens) vectors along r would be mostly padding, so
     * these kernels run vectors along the head dim and keep scores ROW-major:
     *
     *   q     [r][x]  f32, already multiplied by the softmax scale, ld ldq
     *   krow  [c] -> k_c: d elements of type kv (contiguous), one pointer per column,
     *                so contiguous, paged and packed caches look alike
     *   kscale[c]     the scaled types only (fa_kv_scaled: i8, fp8; else NULL):
 *                 k_c[x] = kscale[c] * code (an int8, or half.h's fp8 value)
     *   s     [r][c]  scores, then probabilities, in place; ld lds (multiple of FA_ROW_ALIGN)
     *   vrow, vscale  the same for V (dv elements per row)
     *   acc   [r][e]  as in pv; m, l, alpha as in softmax
     *
     * s and acc are 64-byte aligned, lds and ldacc multiples of FA_ROW_ALIGN; padding
     * columns cols <= c < round_up(cols, FA_ROW_ALIGN) of s may be written freely. Rows
     * of K/V need no alignment. Any 1 <= rows <= FA_SMALL_ROWS, cols >= 1 (up to
     * FA_SMALL_COLS), d >= 1, dv >= 1.
     *
     * softmax_small is softmax on the transposed layout: the same contract, with
     * st[c][r] read as s[r][c] (lo, hi tile-relative, NULL = all kept).
     * pv_small: acc[r][e] = alpha[r] * acc[r][e] + sum_c s[r][c] * v_c[e] (alpha NULL = 1),
     * Like pv, a vector pv_small may multiply a masked p = 0 by v_c; the core checks
     * partly masked tiles for non-finite V and then calls the reference table's
     * pv_small, which skips p == 0 terms. The core takes this path only where
     * flags has FA_KERNELS_SMALL_ROWS; elsewhere it uses the wide kernels.
     */
    fa_qk_small_fn *qk_small;
    fa_softmax_fn *softmax_small;
    fa_pv_small_fn *pv_small;

    /*
     * FA_PARAM_QUANT_MATMUL's decode kernels over int8 K/V rows (docs/semantics.md, 11), in
     * `digits` = 1 or 2 int8 digits per operand (the second in units of 2^-8 of the first):
     *
     *   qk_small_i8: with A = sum_{x < d} q8[r][0][x] * k_c[x] and B the same of digit 1
     *     (exact int32 sums, d <= FA_QUANT_D_MAX), for r < rows, c < cols:
     *       s[r][c] = D * (qscale[r] * kscale[c]),  D = float(A) (one digit) or
     *                 fma(float(B), 2^-8, float(A)) (two)
     *     every step rounded to nearest as written, so every table gives the same bits.
     *     q8: digit t of row r at q8 + (r * digits + t) * ldq8, fa_q8_ld(d) codes each (ldq8
     *     a multiple of 64, 64-byte aligned), zero from d on, as fa_quant_row_i8 writes them;
     *     krow, kscale, s and lds as qk_small's.
     *   pv_small_i8: per row r, w_c = s[r][c] * vscale[c], wmax = max_c w_c, ps = wmax / 255,
     *     y_c = w_c * (255 / wmax) as u8 digits (fa_u8_digits: H_c, and L_c in 2^-8), and
     *       acc[r][e] = fma(ps, D, alpha[r] * acc[r][e])   (e < dv), D as above of
     *     H = sum_c H_c * v_c[e], L = sum_c L_c * v_c[e] (alpha NULL = 1). A row with wmax = 0
     *     only scales. A row whose w_c are not all finite and >= 0, or whose wmax is below
     *     FA_PV_I8_WMIN (where 255 / wmax would lose range), is computed by the reference's
     *     pv_small (f32, p = 0 skipped), so non-finite values propagate as the exact mode's
     *     do. Any 1 <= rows <= FA_SMALL_ROWS, cols <= FA_SMALL_COLS. `ahead` (NULL: none):
     *     rows the kernel prefetches while it runs, a hint that changes no output.
     */
    void (*qk_small_i8)(int64_t rows, int64_t cols, int64_t d, int digits, const int8_t *q8, int64_t ldq8,
                        const float *qscale, const void *const *krow, const float *kscale, float *s, int64_t lds);
    void (*pv_small_i8)(int64_t rows, int64_t cols, int64_t dv, int digits, const float *s, int64_t lds,
                        const void *const *vrow, const float *vscale, const float *alpha, float *acc,
                        int64_t ldacc, const fa_rows_ahead *ahead);
    /* quant_row_i8: fa_quant_row_i8 (below) on the table's vectors, the same bits (the
     * wide int8 path quantises every q row and key with it). */
    float (*quant_row_i8)(const float *x, int64_t n, int digits, int8_t *code);
    /* sum_rows_bf16: for e < d, sum[e] += the bf16 x[r * ld + e] widened, r = 0 .. rows-1
     * in that order, each addition in double (the int8 path's mean key; docs/semantics.md,
     * 11): the order per channel is the contract's, so every table gives the same bits.
     * sum[e] for e >= d is not touched. */
    void (*sum_rows_bf16)(int64_t rows, int64_t d, const uint16_t *x, int64_t ld, double *sum);
    /* dot_rows_f64: out[r] = the f32 rounding of sum_e x[r * ldx + e] * y[e] for r < rows,
     * each product exact in double and added in double in the order e = 0 .. d-1 from 0
     * (the int8 path's c_i; docs/semantics.md, 11): every table gives the same bits. */
    void (*dot_rows_f64)(int64_t rows, int64_t d, const float *x, int64_t ldx, const float *y, float *out);

    /* Peak probes: run `iters` iterations of an unrolled, dependency-free loop of
     * the ISA's widest FMA (and bf16 dot product) and return the number of FLOPs
     * done; the core times them. probe_bf16 measures a native bf16 dot product
     * only where flags has FA_KERNELS_BF16_DOT (the reference's is scalar C). */
    fa_probe_fn *probe_fma;
    fa_probe_fn *probe_bf16;
    /* The tile unit's bf16 product (flags has FA_KERNELS_TILES; elsewhere the
     * reference's, which does nothing and returns 0). Runs between thread_begin and
     * thread_end, as every kernel of a tile table does. */
    fa_probe_fn *probe_tile;

    /*
     * Run by every thread around its share of each job (the pool calls them on
     * the caller's thread and each worker's, also with one thread), so that an ISA
     * with per-thread state, such as tile registers, can set it up and release it
     * before control returns to the user. No-ops in the reference.
     */
    void (*thread_begin)(void);
    void (*thread_end)(void);
} fa_kernels;

/* The portable scalar table, the root every other table starts from: always
 * present, the baseline the others are tested against, and the careful kernels
 * (its pv skips p == 0) the core falls back to on non-finite V. */
extern const fa_kernels fa_kernels_ref;

/* One row of n floats as int8 digits by the rule of docs/semantics.md, section 11 (the
 * first digit is the cache's code, section 8): returns scale = max|x| / 127 and writes
 * digit 0, code[x] = y = x * (1 / scale) rounded to nearest even and clamped to
 * [-127, 127], and with digits = 2 at code + fa_q8_ld(n) digit 1, (y - digit 0) * 256
 * rounded and clamped likewise; each digit row zero from n to fa_q8_ld(n). A zero row has
 * scale 0; a row holding NaN or inf gets a NaN scale and codes 0. */
float fa_quant_row_i8(const float *x, int64_t n, int digits, int8_t *code);
/* fwd_i8's K operand: for keys j = j0 + c, c < cols, the dword FA_KT_QUADS's block layout
 * puts at kt[(j / 16) * 16 Q + 16 p + j % 16] (Q = FA_KT_QUADS(d)): codes 4p .. 4p+3 of
 * k8[c * ldk8 ..] (lowest byte first), zero where 4p + b >= d; other keys untouched. */
void fa_pack_kt_i8(int64_t cols, int64_t d, const int8_t *k8, int64_t ldk8, uint32_t *kt, int64_t j0);

/* y in [0, 255] (pv_small_i8's weights) as u8 digits: one, y rounded to nearest even; two,
 * floor(y) and (y - floor(y)) * 256 rounded to nearest even, clamped to 255 (y - floor(y)
 * is exact). */
static inline void fa_u8_digits(float y, int digits, uint8_t *hi, uint8_t *lo)
{
    if (digits == 1) {
        const float h = nearbyintf(y);
        *hi = (uint8_t)(h > 255.0f ? 255.0f : h);
        *lo = 0;
        return;
    }
    const float h = floorf(y), l = nearbyintf((y - h) * 256.0f);
    *hi = (uint8_t)(h > 255.0f ? 255.0f : h);
    *lo = (uint8_t)(l > 255.0f ? 255.0f : l);
}

/*
 * Table builders: each copies its parent's table into k (by calling the parent's
 * init first) and overrides its own entries. Each but ref exists only when its
 * directory was built (see CMakeLists.txt); the registry calls them, once.
 */
void fa_kernels_init_ref(fa_kernels *k);

/*
 * What an ISA directory defines next to its table (in <isa>_table.c, built without
 * the ISA's flags), declared where it is used (the table file itself, a child's
 * table file, registry.c) by FA_KERNELS_ISA(isa):
 *   fa_kernels_init_<isa>(k)      the table builder above;
 *   fa_kernels_runs_<isa>(cpu, why)  1 when this CPU (and OS) run the instructions the
 *                                 table adds to its parent's, from the raw registers of
 *                                 cpu_features.h; else 0, and *why may say why (a static
 *                                 string; `flashattn info` prints it).
 */
struct fa_cpu;
#define FA_KERNELS_ISA(isa)                                                                                        \
    void fa_kernels_init_##isa(fa_kernels *k);                                                                   \
    int fa_kernels_runs_##isa(const struct fa_cpu *cpu, const char **why)

/*
 * A vector table (avx2, avx512, neon): its parent's table, with the fp32 kernels of
 * fa_<isa>_*: pack_qt, softmax, ds, the converters to f32 and the small-row trio by
 * their entry's name; qk and pv by their register blocking, which the macro enters as
 * qk_block and pv_block (QR x QC: fa_avx2_qk_16x6 is {16, 6}); stx by its own name;
 * with stores = 1 also the converters from f32 (f32_to_f16, f32_to_bf16). The
 * reference's scalar int8 kernels are never worth choosing over a vector table's (a
 * child with int8 kernels of its own sets FA_KERNELS_I8_DOT again). One list, so that
 * a new fp32 entry reaches every vector table at once.
 */
#define FA_KERNELS_VECTOR(k, isa, parent_isa, QR, QC, PR, PC, stx_, stores)                                      \
    do {                                                                                                           \
        fa_kernels_init_##parent_isa(k);                                                                           \
        (k)->name = #isa;                                                                                          \
        (k)->parent = #parent_isa;                                                                                 \
        (k)->flags |= FA_KERNELS_SMALL_ROWS;                                                                       \
        (k)->flags &= ~(unsigned)FA_KERNELS_I8_DOT;                                                                \
        (k)->qk_block = (fa_kernel_block){QR, QC};                                                                 \
        (k)->pv_block = (fa_kernel_block){PR, PC};                                                                 \
        (k)->pack_qt = fa_##isa##_pack_qt;                                                                         \
        (k)->qk = fa_##isa##_qk_##QR##x##QC;                                                                       \
        (k)->softmax = fa_##isa##_softmax;                                                                         \
        (k)->pv = fa_##isa##_pv_##PR##x##PC;                                                                       \
        (k)->ds = fa_##isa##_ds;                                                                                   \
        (k)->stx = fa_##isa##_##stx_;                                                                              \
        (k)->f16_to_f32 = fa_##isa##_f16_to_f32;                                                                   \
        (k)->bf16_to_f32 = fa_##isa##_bf16_to_f32;                                                                 \
        (k)->qk_small = fa_##isa##_qk_small;                                                                       \
        (k)->softmax_small = fa_##isa##_softmax_small;                                                             \
        (k)->pv_small = fa_##isa##_pv_small;                                                                       \
        (k)->probe_fma = fa_##isa##_probe_fma;                                                                     \
        FA_KERNELS_STORES_##stores(k, isa);                                                                        \
    } while (0)
#define FA_KERNELS_STORES_0(k, isa) (void)0
#define FA_KERNELS_STORES_1(k, isa) ((k)->f32_to_f16 = fa_##isa##_f32_to_f16, (k)->f32_to_bf16 = fa_##isa##_f32_to_bf16)

/* Every table built in, best first, whether this CPU runs it, and if not why not ("" when
 * it runs) (for tests and `info`). */
int fa_kernels_count(void);
const fa_kernels *fa_kernels_at(int index, int *runs_here);
const char *fa_kernels_why_not(int index);

/* Picks the best table this CPU runs, or the one FLASHATTN_ARCH names. On
 * failure writes why into msg and returns FA_ERR_ISA_UNAVAILABLE. */
fa_status fa_kernels_select(const fa_kernels **out, char *msg, size_t msg_size);

#endif
