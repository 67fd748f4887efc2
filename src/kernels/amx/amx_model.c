/*
 * amx_model.c: the AMX tiles in portable C11, the back-end amx_kernels.c runs on
 * where there is no AMX (and under valgrind, sanitizers, qemu). It owns one
 * thread's tile state (palette, shapes, 8 tiles of 16 x 64 bytes, fault bits) and
 * the instructions of amx_tile.h, written from the Intel SDM's pseudo-code:
 *
 *   LDTILECFG   palette 0 releases; palette 1 checks the SDM's #GP conditions
 *               (reserved bytes, rows <= 16, colsb <= 64, rows and colsb both zero
 *               or both non-zero) and zeroes all tile data; the model also refuses
 *               start_row != 0, which the SDM accepts as a restart point and no
 *               kernel has reason to set.
 *   TILELOADD / TILESTORED / TILEZERO   the configured rows x colsb; a load zeroes
 *               the rest of each row and the rows past `rows`.
 *   TDPBF16PS   the SDM's order exactly: per row m, two fp32 partial sums per
 *               output column (the even and the odd products of the pairs), each
 *               an FMA per k; then even + odd, then C + that (three roundings);
 *               DAZ on every input, FTZ on every result, nearest even.
 *   TDPBSSD, TDPBSUD, TDPBUSD, TDPBUUD   C (int32) += the four byte products of each
 *               k-quad, A's bytes signed (S) or unsigned (U), then B's; integer
 *               arithmetic modulo 2^32 (the SDM's sums wrap, nothing saturates or
 *               flags), so the order of the additions cannot matter.
 *
 * A call the hardware would fault on (#GP, #UD) changes nothing and sets a bit of
 * fa_tm_faults(). Nothing aborts or prints; nothing is shared between threads.
 *
 * The bits never depend on the compiler's FP environment, on contraction, x87 excess
 * precision, MXCSR (rounding mode, FTZ, DAZ) or the target's own denormal and NaN
 * rules, so x86-64 and aarch64 give the same tiles. Two paths give the same bits:
 *
 *   fa_tm_fma32   integer-only soft float, every case (NaN, inf, overflow); the
 *                 reference, and TDPBF16PS's path for a row that meets a NaN or an
 *                 inf or overflows.
 *   add_round     the fast path for finite rows: double arithmetic that is exact
 *                 (proof at add_round), rounded to fp32 in integer arithmetic, so no
 *                 FP rounding mode, contraction or flush mode is ever consulted.
 */
#include "amx_model.h"

#include <string.h>

/* Nothing below rounds in floating point (every double operation is exact), so
 * contraction could not change a bit; clang is told anyway (gcc rejects the pragma
 * under -Werror and contracts nothing across statements in ISO C mode). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

typedef struct tm_state {
    int configured;
    uint8_t rows[FA_TILE_COUNT];
    uint16_t colsb[FA_TILE_COUNT];
    uint8_t data[FA_TILE_COUNT][FA_TILE_MAX_ROWS][FA_TILE_MAX_COLSB];
    unsigned faults;
} tm_state;

static _Thread_local tm_state tm;

/* ------------------------------------------------------------ fp32 arithmetic */

#define F32_QNAN_INDEFINITE UINT32_C(0xffc00000) /* x86's default NaN */
#define F32_QUIET UINT32_C(0x00400000)

static int f32_is_nan(uint32_t x) { return (x & 0x7f800000u) == 0x7f800000u && (x & 0x007fffffu); }
static int f32_is_inf(uint32_t x) { return (x & 0x7fffffffu) == 0x7f800000u; }

static int log2_u64(uint64_t x) /* x != 0 */
{
    int n = 0;
    while (x >>= 1) n++;
    return n;
}

/* A finite nonzero value as sig * 2^exp, sig's leading 1 at bit 61 (so a sum of
 * two fits in 63 bits, and 37+ zero bits below a 24-bit significand keep the
 * alignment below exact until the sticky bit). */
typedef struct xnum {
    uint32_t sign;
    int32_t exp;
    uint64_t sig;
} xnum;

static xnum xnum_make(uint32_t sign, uint64_t sig, int32_t exp)
{
    const int s = 61 - log2_u64(sig);
    xnum r = {sign, exp - s, sig << s};
    return r;
}

/*
 * a * b + c with one rounding: nearest even, in an unbounded exponent range; a
 * result below 2^-126 after that rounding (x86's tininess after rounding) is
 * flushed to zero; denormal inputs read as zero.
 * Specials: a NaN input gives the first NaN of (a, b, c), quieted; inf * 0 and
 * inf - inf give the x86 default NaN 0xffc00000; exact cancellation gives +0; a
 * sum of zeros is -0 only when both are -0.
 */
uint32_t fa_tm_fma32(uint32_t a, uint32_t b, uint32_t c)
{
    if (f32_is_nan(a)) return a | F32_QUIET;
    if (f32_is_nan(b)) return b | F32_QUIET;
    if (f32_is_nan(c)) return c | F32_QUIET;
    /* DAZ: a zero exponent field is a zero of its sign */
    if (!(a & 0x7f800000u)) a &= 0x80000000u;
    if (!(b & 0x7f800000u)) b &= 0x80000000u;
    if (!(c & 0x7f800000u)) c &= 0x80000000u;

    const uint32_t sp = (a ^ b) & 0x80000000u, sc = c & 0x80000000u;
    const int pzero = !(a & 0x7fffffffu) || !(b & 0x7fffffffu);
    const int pinf = f32_is_inf(a) || f32_is_inf(b);
    if (pinf) {
        if (pzero) return F32_QNAN_INDEFINITE;
        if (f32_is_inf(c) && sc != sp) return F32_QNAN_INDEFINITE;
        return sp | 0x7f800000u;
    }
    if (f32_is_inf(c)) return c;
    const int czero = !(c & 0x7fffffffu);
    if (pzero) return czero ? (sp & sc) : c;

    const uint32_t ea = (a >> 23) & 0xff, eb = (b >> 23) & 0xff;
    const uint64_t ma = (a & 0x7fffffu) | 0x800000u, mb = (b & 0x7fffffu) | 0x800000u;
    /* value = M * 2^(E - 150) for a normal fp32 */
    const xnum p = xnum_make(sp, ma * mb, (int32_t)ea + (int32_t)eb - 300);

    uint32_t sign;
    uint64_t r;
    int32_t exp;
    if (czero) {
        sign = p.sign, r = p.sig, exp = p.exp;
    } else {
        const uint32_t ec = (c >> 23) & 0xff;
        const xnum q = xnum_make(sc, (c & 0x7fffffu) | 0x800000u, (int32_t)ec - 150);
        const int p_big = p.exp > q.exp || (p.exp == q.exp && p.sig >= q.sig);
        const xnum big = p_big ? p : q, small = p_big ? q : p;
        const int32_t d = big.exp - small.exp;
        const uint64_t s = d >= 63 ? 1u : (small.sig >> d) | ((small.sig & ((UINT64_C(1) << d) - 1)) != 0);
        sign = big.sign, exp = big.exp;
        r = big.sign == small.sign ? big.sig + s : big.sig - s;
        if (!r) return 0; /* exact cancellation: +0 when rounding to nearest */
    }

    /* round r * 2^exp to 24 bits */
    const int lead = log2_u64(r);
    int32_t x = lead + exp; /* the result's binary exponent */
    uint64_t m;
    if (lead > 23) {
        const int sh = lead - 23;
        const uint64_t rem = r & ((UINT64_C(1) << sh) - 1), half = UINT64_C(1) << (sh - 1);
        m = r >> sh;
        if (rem > half || (rem == half && (m & 1))) m++;
        if (m >> 24) m >>= 1, x++;
    } else {
        m = r << (23 - lead);
    }
    if (x < -126) return sign;                /* FTZ */
    if (x > 127) return sign | 0x7f800000u;   /* overflow, nearest even */
    return sign | ((uint32_t)(x + 127) << 23) | (uint32_t)(m & 0x7fffffu);
}

static uint32_t f32_add(uint32_t x, uint32_t y) { return fa_tm_fma32(x, 0x3f800000u, y); }

/* ------------------------------------------------------------------ tile state */

static int tile_ok(int t)
{
    if (!tm.configured) {
        tm.faults |= FA_TM_FAULT_UNCONFIGURED;
        return 0;
    }
    if (t < 0 || t >= FA_TILE_COUNT) {
        tm.faults |= FA_TM_FAULT_TILE;
        return 0;
    }
    if (!tm.rows[t]) { /* a tile the configuration left out (rows = colsb = 0) */
        tm.faults |= FA_TM_FAULT_SHAPE;
        return 0;
    }
    return 1;
}

void fa_tm_loadconfig(const void *cfg64)
{
    uint8_t b[64];
    memcpy(b, cfg64, 64);
    if (b[0] == 0) { /* the INIT state: nothing else is read */
        fa_tm_release();
        return;
    }
    if (b[0] != 1) {
        tm.faults |= FA_TM_FAULT_PALETTE;
        return;
    }
    int bad = b[1] != 0; /* start_row: see the top of the file */
    for (int i = 2; i < 16; i++) bad |= b[i] != 0;
    uint8_t rows[FA_TILE_COUNT];
    uint16_t colsb[FA_TILE_COUNT];
    for (int t = 0; t < 16; t++) {
        const uint16_t cb = (uint16_t)(b[16 + 2 * t] | (b[17 + 2 * t] << 8));
        const uint8_t r = b[48 + t];
        if (t >= FA_TILE_COUNT) {
            bad |= cb != 0 || r != 0; /* reserved bytes in palette 1 */
            continue;
        }
        bad |= cb > FA_TILE_MAX_COLSB || r > FA_TILE_MAX_ROWS || (cb == 0) != (r == 0);
        rows[t] = r, colsb[t] = cb;
    }
    if (bad) {
        tm.faults |= FA_TM_FAULT_CONFIG;
        return;
    }
    memset(tm.data, 0, sizeof tm.data);
    memcpy(tm.rows, rows, sizeof rows);
    memcpy(tm.colsb, colsb, sizeof colsb);
    tm.configured = 1;
}

void fa_tm_storeconfig(void *cfg64)
{
    uint8_t b[64] = {0};
    if (tm.configured) {
        b[0] = 1;
        for (int t = 0; t < FA_TILE_COUNT; t++) {
            b[16 + 2 * t] = (uint8_t)(tm.colsb[t] & 0xff);
            b[17 + 2 * t] = (uint8_t)(tm.colsb[t] >> 8);
            b[48 + t] = tm.rows[t];
        }
    }
    memcpy(cfg64, b, 64);
}

void fa_tm_release(void)
{
    const unsigned faults = tm.faults;
    memset(&tm, 0, sizeof tm);
    tm.faults = faults;
}

void fa_tm_zero(int t)
{
    if (!tile_ok(t)) return;
    memset(tm.data[t], 0, sizeof tm.data[t]);
}

/* Row r's address: the hardware adds a 64-bit stride register, so a "negative"
 * stride (passed through size_t) wraps as it does there, without pointer UB. */
static uintptr_t row_addr(const void *base, size_t stride, int r)
{
    return (uintptr_t)base + (uintptr_t)stride * (uintptr_t)r;
}

void fa_tm_loadd(int t, const void *base, size_t stride_bytes)
{
    if (!tile_ok(t)) return;
    if (tm.colsb[t] % 4) { /* TILELOADD: #UD on a colsb that is not whole dwords */
        tm.faults |= FA_TM_FAULT_CONFIG;
        return;
    }
    memset(tm.data[t], 0, sizeof tm.data[t]);
    for (int r = 0; r < tm.rows[t]; r++)
        memcpy(tm.data[t][r], (const void *)row_addr(base, stride_bytes, r), tm.colsb[t]);
}

void fa_tm_stored(int t, void *base, size_t stride_bytes)
{
    if (!tile_ok(t)) return;
    if (tm.colsb[t] % 4) {
        tm.faults |= FA_TM_FAULT_CONFIG;
        return;
    }
    for (int r = 0; r < tm.rows[t]; r++)
        memcpy((void *)row_addr(base, stride_bytes, r), tm.data[t][r], tm.colsb[t]);
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put32(uint8_t *p, uint32_t x)
{
    p[0] = (uint8_t)x, p[1] = (uint8_t)(x >> 8), p[2] = (uint8_t)(x >> 16), p[3] = (uint8_t)(x >> 24);
}

/* make_fp32: a bf16 is the upper half of an fp32 */
static uint32_t bf16_at(const uint8_t *p) { return ((uint32_t)p[0] | (uint32_t)p[1] << 8) << 16; }

/* ------------------------------------------------------------- the fast path */

/*
 * Values here are doubles holding either an fp32 value (24 significant bits, DAZ'd,
 * so zero or |x| in [2^-126, 2^128)) or the product of two DAZ'd bf16 values (16
 * significant bits, zero or |x| in [2^-252, 2^256)): every such product is exact in
 * double (16 <= 53 bits, exponents far inside double's range) and every nonzero one
 * is a normal double, so MXCSR/FPCR flush modes never see a denormal.
 */
#define D_SIGN UINT64_C(0x8000000000000000)

static double d_of(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static uint64_t u_of(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

/*
 * fa_tm_fma32's result for x + y (x, y as above; x is the product a * b in a lane,
 * or an fp32 value in the two final adds), returned as the double bit pattern of
 * that fp32 value; *ovf becomes nonzero when the result overflows (then the caller
 * redoes the row on the integer path, which owns inf and NaN).
 *
 * Proof of exactness. Let ex, ey be the biased double exponents (ex = 0 for a zero),
 * so a nonzero x has its leading bit at 2^(ex-1023) and, having at most 24 significant
 * bits, its lowest bit at or above 2^(ex-1023-23).
 *  - |ex - ey| <= 25, both nonzero: the exact sum's bits lie between the lowest bit
 *    of the smaller (>= 2^(min-1023-23)) and one carry above the larger
 *    (2^(max-1023+1)): at most 25 + 23 + 2 = 50 <= 53 bits, so x + y is exact in
 *    double whatever the rounding mode (and nonzero or an exact cancellation).
 *  - ex - ey >= 26 (y may be zero: ey = 0): |y| < 2^(ey-1022) <= 2^(ex-1023-25), a
 *    quarter of x's ulp at 24 bits even when x is a power of two (the ulp below it
 *    is 2^(ex-1023-24), half of it 2^(ex-1023-25)), so x + y rounds to x at 24 bits
 *    with an unbounded exponent: the result is x, then FTZ/overflow as below.
 *    Symmetrically for ey - ex >= 26. Both zero: ex = ey = 0, the first case.
 * The exact (or selected) value s is then rounded to 24 bits, nearest even, on its
 * bits: adding 2^28 - 1 + lsb to the magnitude and clearing the low 29 bits carries
 * into the exponent as it should. A rounded exponent below 2^-126 is flushed to a
 * zero of s's sign (tininess after rounding, as fa_tm_fma32). A zero s is an exact
 * cancellation (+0) or a sum of zeros (-0 only when both are -0): the sign is
 * sign(x) & sign(y) in both cases, written out rather than taken from the FPU,
 * whose rounding mode decides it. All compares are on integers; nothing depends on
 * rounding mode, flush modes, excess precision or contraction.
 */
static inline uint64_t add_round(double x, double y, uint64_t *ovf)
{
    const uint64_t xu = u_of(x), yu = u_of(y);
    const int64_t ex = (int64_t)(xu >> 52 & 0x7ff), ey = (int64_t)(yu >> 52 & 0x7ff);
    uint64_t su = u_of(x + y);
    su = ex - ey >= 26 ? xu : su;
    su = ey - ex >= 26 ? yu : su;
    const uint64_t sign = su & D_SIGN, mag = su & ~D_SIGN;
    const uint64_t r = (mag + UINT64_C(0x0fffffff) + (mag >> 29 & 1)) & ~UINT64_C(0x1fffffff);
    *ovf |= r >= ((uint64_t)(1023 + 128) << 52);
    const uint64_t zero = mag ? sign : (xu & yu & D_SIGN);
    return r < ((uint64_t)(1023 - 126) << 52) ? zero : (sign | r);
}

/* fp32 bits (DAZ applied) -> double; *special set for inf or NaN */
static double d_of_f32(uint32_t u, unsigned *special)
{
    const uint32_t e = u >> 23 & 0xff;
    *special |= e == 0xff;
    if (!e) return (u >> 31) ? -0.0 : 0.0;
    return d_of((uint64_t)(u >> 31) << 63 | (uint64_t)(e + 896) << 52 | (uint64_t)(u & 0x7fffffu) << 29);
}

/* an fp32 value as a double bit pattern (zero or in the normal range) -> fp32 bits */
static uint32_t f32_of_du(uint64_t du)
{
    const uint32_t sign = (uint32_t)(du >> 32) & 0x80000000u;
    const uint64_t mag = du & ~D_SIGN;
    if (!mag) return sign;
    return sign | (uint32_t)((mag >> 52) - 896) << 23 | (uint32_t)(mag >> 29 & 0x7fffffu);
}

/* The operand checks every tile product shares (the SDM's #UD list, exception class
 * AMX-E4): 1 when the instruction may run. */
static int dp_operands_ok(int c, int a, int b)
{
    if (!tile_ok(c) || !tile_ok(a) || !tile_ok(b)) return 0;
    if (c == a || c == b || a == b || tm.rows[a] != tm.rows[c] || tm.colsb[b] != tm.colsb[c] ||
        tm.rows[b] != tm.colsb[a] / 4) {
        tm.faults |= FA_TM_FAULT_SHAPE;
        return 0;
    }
    if (tm.colsb[a] % 4 || tm.colsb[b] % 4 || tm.colsb[c] % 4) {
        tm.faults |= FA_TM_FAULT_CONFIG;
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------ TDPBF16PS */

/* Row m on the integer path: the SDM's pseudo-code as written. */
static void dp_row_slow(int c, int a, int b, int m, int K, int N)
{
    uint32_t temp[2 * FA_TILE_MAX_COLSB / 4] = {0};
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) {
            temp[2 * n] = fa_tm_fma32(bf16_at(&tm.data[a][m][4 * k]), bf16_at(&tm.data[b][k][4 * n]), temp[2 * n]);
            temp[2 * n + 1] =
                fa_tm_fma32(bf16_at(&tm.data[a][m][4 * k + 2]), bf16_at(&tm.data[b][k][4 * n + 2]), temp[2 * n + 1]);
        }
    for (int n = 0; n < N; n++) {
        const uint32_t t = f32_add(temp[2 * n], temp[2 * n + 1]);
        put32(&tm.data[c][m][4 * n], f32_add(get32(&tm.data[c][m][4 * n]), t));
    }
}

void fa_tm_dpbf16ps(int c, int a, int b)
{
    if (!dp_operands_ok(c, a, b)) return;
    enum { KM = FA_TILE_MAX_COLSB / 4, NM = FA_TILE_MAX_COLSB / 4 };
    const int M = tm.rows[c], K = tm.colsb[a] / 4, N = tm.colsb[c] / 4;
    /* B once per instruction, DAZ'd, as doubles: bd[lane][k][n] */
    double bd[2][KM][NM];
    unsigned b_special = 0;
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) {
            bd[0][k][n] = d_of_f32(bf16_at(&tm.data[b][k][4 * n]), &b_special);
            bd[1][k][n] = d_of_f32(bf16_at(&tm.data[b][k][4 * n + 2]), &b_special);
        }
    for (int m = 0; m < M; m++) {
        double ad[2][KM], cd[NM];
        unsigned special = b_special;
        for (int k = 0; k < K; k++) {
            ad[0][k] = d_of_f32(bf16_at(&tm.data[a][m][4 * k]), &special);
            ad[1][k] = d_of_f32(bf16_at(&tm.data[a][m][4 * k + 2]), &special);
        }
        for (int n = 0; n < N; n++) cd[n] = d_of_f32(get32(&tm.data[c][m][4 * n]), &special);
        uint64_t ovf = 0;
        if (!special) {
            double te[NM] = {0}, to[NM] = {0}; /* the even and odd lanes, +0 to start */
            for (int k = 0; k < K; k++) {
                const double a0 = ad[0][k], a1 = ad[1][k];
                for (int n = 0; n < N; n++) {
                    te[n] = d_of(add_round(a0 * bd[0][k][n], te[n], &ovf));
                    to[n] = d_of(add_round(a1 * bd[1][k][n], to[n], &ovf));
                }
            }
            uint64_t out[NM];
            for (int n = 0; n < N; n++) out[n] = add_round(cd[n], d_of(add_round(te[n], to[n], &ovf)), &ovf);
            if (!ovf)
                for (int n = 0; n < N; n++) put32(&tm.data[c][m][4 * n], f32_of_du(out[n]));
        }
        if (special || ovf) dp_row_slow(c, a, b, m, K, N);
        memset(&tm.data[c][m][4 * N], 0, FA_TILE_MAX_COLSB - 4 * (size_t)N); /* write_row_and_zero */
    }
    for (int m = M; m < FA_TILE_MAX_ROWS; m++) memset(tm.data[c][m], 0, FA_TILE_MAX_COLSB); /* zero_upper_rows */
}

/* ------------------------------------------------------- TDPB[SU][SU]D */

/* A byte as the SDM's SignExtend (signed) or ZeroExtend, as a 32-bit value. */
static uint32_t byte_ext(uint8_t x, int sign) { return sign ? (uint32_t)(int32_t)(int8_t)x : (uint32_t)x; }

/* The SDM's DPBD pseudo-code: for m < rows(A), k < colsb(A)/4, n < colsb(C)/4,
 * C[m][n] += A[m].byte[4k+i] * B[k].byte[4n+i] for i < 4, each extended as the
 * mnemonic says, in uint32 arithmetic (wrap-around); then the rows' unused bytes and
 * the rows past M zeroed, as every tile product writes its destination. */
static void dp_int8(int c, int a, int b, int sa, int sb)
{
    if (!dp_operands_ok(c, a, b)) return;
    const int M = tm.rows[c], K = tm.colsb[a] / 4, N = tm.colsb[c] / 4;
    for (int m = 0; m < M; m++) {
        for (int n = 0; n < N; n++) {
            uint32_t acc = get32(&tm.data[c][m][4 * n]);
            for (int k = 0; k < K; k++)
                for (int i = 0; i < 4; i++)
                    acc += byte_ext(tm.data[a][m][4 * k + i], sa) * byte_ext(tm.data[b][k][4 * n + i], sb);
            put32(&tm.data[c][m][4 * n], acc);
        }
        memset(&tm.data[c][m][4 * N], 0, FA_TILE_MAX_COLSB - 4 * (size_t)N);
    }
    for (int m = M; m < FA_TILE_MAX_ROWS; m++) memset(tm.data[c][m], 0, FA_TILE_MAX_COLSB);
}

void fa_tm_dpbssd(int c, int a, int b) { dp_int8(c, a, b, 1, 1); }
void fa_tm_dpbsud(int c, int a, int b) { dp_int8(c, a, b, 1, 0); }
void fa_tm_dpbusd(int c, int a, int b) { dp_int8(c, a, b, 0, 1); }
void fa_tm_dpbuud(int c, int a, int b) { dp_int8(c, a, b, 0, 0); }

unsigned fa_tm_faults(void) { return tm.faults; }

void fa_tm_clear_faults(void) { tm.faults = 0; }

int fa_tm_configured(void) { return tm.configured; }

int fa_tm_peek(int t, uint8_t out[FA_TILE_MAX_ROWS * FA_TILE_MAX_COLSB])
{
    if (t < 0 || t >= FA_TILE_COUNT) return 0;
    memcpy(out, tm.data[t], sizeof tm.data[t]);
    return 1;
}
