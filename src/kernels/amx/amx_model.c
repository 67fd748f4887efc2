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
 *
 * A call the hardware would fault on (#GP, #UD) changes nothing and sets a bit of
 * fa_tm_faults(). Nothing aborts or prints; nothing is shared between threads.
 *
 * The arithmetic is integer-only (fma32 below): the bits never depend on the
 * compiler's FP environment, on contraction, x87 excess precision, MXCSR or the
 * target's own denormal and NaN rules, so x86-64 and aarch64 give the same tiles.
 */
#include "amx_model.h"

#include <string.h>

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

void fa_tm_dpbf16ps(int c, int a, int b)
{
    if (!tile_ok(c) || !tile_ok(a) || !tile_ok(b)) return;
    /* the SDM's #UD list for TDPBF16PS (exception class AMX-E4) */
    if (c == a || c == b || a == b || tm.rows[a] != tm.rows[c] || tm.colsb[b] != tm.colsb[c] ||
        tm.rows[b] != tm.colsb[a] / 4) {
        tm.faults |= FA_TM_FAULT_SHAPE;
        return;
    }
    if (tm.colsb[a] % 4 || tm.colsb[b] % 4 || tm.colsb[c] % 4) {
        tm.faults |= FA_TM_FAULT_CONFIG;
        return;
    }
    const int M = tm.rows[c], K = tm.colsb[a] / 4, N = tm.colsb[c] / 4;
    for (int m = 0; m < M; m++) {
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
        memset(&tm.data[c][m][4 * N], 0, FA_TILE_MAX_COLSB - 4 * (size_t)N); /* write_row_and_zero */
    }
    for (int m = M; m < FA_TILE_MAX_ROWS; m++) memset(tm.data[c][m], 0, FA_TILE_MAX_COLSB); /* zero_upper_rows */
}

unsigned fa_tm_faults(void) { return tm.faults; }

void fa_tm_clear_faults(void) { tm.faults = 0; }

int fa_tm_configured(void) { return tm.configured; }

int fa_tm_peek(int t, uint8_t out[FA_TILE_MAX_ROWS * FA_TILE_MAX_COLSB])
{
    if (t < 0 || t >= FA_TILE_COUNT) return 0;
    memcpy(out, tm.data[t], sizeof tm.data[t]);
    return 1;
}
