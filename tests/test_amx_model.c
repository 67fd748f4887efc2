/*
 * test_amx_model.c: the software model of the AMX tiles (src/kernels/amx/amx_model.c)
 * against the Intel SDM and, where this CPU has AMX, against the tiles themselves.
 *
 *   config_*      every configuration LDTILECFG refuses (each fault bit), palette 0,
 *                 STTILECFG, use before configuration and after release, operand
 *                 checks of TDPBF16PS; a refused call changes nothing
 *   dp_*          TDPBF16PS on hand-computed values (the expected bits are written
 *                 out here, never computed by the model)
 *   memory_*      TILELOADD/TILESTORED round trips with odd and negative strides, the
 *                 zeroing outside the configured shape, state cleared by release
 *   threads       two threads with their own configurations at once
 *   fast path     TDPBF16PS (exact double arithmetic where the inputs are finite) against
 *                 the model's integer-only fa_tm_fma32 in the SDM's order, bit for bit,
 *                 on random, edge, near-FTZ, near-overflow and exponent-gap inputs
 *   hardware      random and edge inputs through the real instructions and the model,
 *                 bit for bit (x86-64 with AMX only; otherwise says why, counts nothing)
 *   int8          TDPBSSD/TDPBSUD/TDPBUSD/TDPBUUD on hand-computed values (sign
 *                 extension, wrap-around modulo 2^32) and on random ones against a
 *                 transcription in int64 here, their operand checks; with --int8-hw
 *                 only: the four on the tiles against the model, bit for bit (exit 77
 *                 where the CPU, the OS or the build has no AMX-INT8)
 *
 * The program links amx_model.c alone (not the library), so it stands apart from the
 * kernels. It keeps its own CHECK and prints "N passed, N failed" as harness.h does.
 * Tile layout in every TDPBF16PS case: tmm0 = C (M x 4N bytes), tmm1 = A (M x 4K),
 * tmm2 = B (K x 4N), B's row k holding the bf16 pairs (B[2k][n], B[2k+1][n]).
 */
#include <fenv.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amx_model.h"
#if defined(FA_AMX_HW_PROBE)
#include "amx_hw_probe.h"
#endif

static long g_passed, g_failed;
static const char *g_case = "";

static int check(int ok, int line, const char *expr, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#include <stdarg.h>
static int check(int ok, int line, const char *expr, const char *fmt, ...)
{
    if (ok) {
        g_passed++;
        return 1;
    }
    if (++g_failed <= 100) {
        va_list ap;
        va_start(ap, fmt);
        printf("FAIL test_amx_model.c:%d: %s\n  case: %s\n  ", line, expr, g_case);
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
        fflush(stdout);
    }
    return 0;
}
#define CHECK(cond, ...) check((cond) ? 1 : 0, __LINE__, #cond, __VA_ARGS__)

/* ------------------------------------------------------------- helpers */

static void cfg_set(fa_tilecfg *cfg, int t, int rows, int colsb)
{
    cfg->rows[t] = (uint8_t)rows;
    cfg->colsb[t] = (uint16_t)colsb;
}

/* C = tmm0 (M x 4N), A = tmm1 (M x 4K), B = tmm2 (K x 4N) */
static fa_tilecfg dp_cfg(int M, int K, int N)
{
    fa_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    cfg_set(&cfg, 0, M, 4 * N);
    cfg_set(&cfg, 1, M, 4 * K);
    cfg_set(&cfg, 2, K, 4 * N);
    return cfg;
}

/* The model's TDPBF16PS on row-major buffers (strides 64 bytes). */
static void model_dp(const fa_tilecfg *cfg, void *c, const void *a, const void *b)
{
    fa_tm_loadconfig(cfg);
    fa_tm_loadd(0, c, 64);
    fa_tm_loadd(1, a, 64);
    fa_tm_loadd(2, b, 64);
    fa_tm_dpbf16ps(0, 1, 2);
    fa_tm_stored(0, c, 64);
    fa_tm_release();
}

/* One output element: c += sum_k a[2k] b[2k] + a[2k+1] b[2k+1], K pairs, bits in and out. */
static uint32_t dp1(uint32_t c, int K, const uint16_t *a, const uint16_t *b)
{
    uint32_t cb[16][16] = {{0}};
    uint16_t ab[16][32] = {{0}}, bb[16][32] = {{0}};
    cb[0][0] = c;
    for (int k = 0; k < K; k++) {
        ab[0][2 * k] = a[2 * k], ab[0][2 * k + 1] = a[2 * k + 1];
        bb[k][0] = b[2 * k], bb[k][1] = b[2 * k + 1];
    }
    const fa_tilecfg cfg = dp_cfg(1, K, 1);
    fa_tm_clear_faults();
    model_dp(&cfg, cb, ab, bb);
    CHECK(fa_tm_faults() == 0, "faults %#x", fa_tm_faults());
    return cb[0][0];
}

static int all_bytes(const void *p, size_t n, unsigned char v)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != v) return 0;
    return 1;
}

/* ------------------------------------------------------- configuration */

/* A refused LDTILECFG sets `bit` and leaves the previous state (config and data) alone. */
static void expect_refused(const fa_tilecfg *bad, unsigned bit, const char *what)
{
    g_case = what;
    fa_tilecfg good = dp_cfg(3, 5, 7);
    uint8_t fill[16][64], before[1024], after[1024], scfg[64], scfg2[64];
    memset(fill, 0x5a, sizeof fill);
    fa_tm_loadconfig(&good);
    fa_tm_loadd(1, fill, 64);
    fa_tm_peek(1, before);
    fa_tm_storeconfig(scfg);
    fa_tm_clear_faults();
    fa_tm_loadconfig(bad);
    CHECK(fa_tm_faults() == bit, "%s: faults %#x, want %#x", what, fa_tm_faults(), bit);
    fa_tm_storeconfig(scfg2);
    fa_tm_peek(1, after);
    CHECK(fa_tm_configured() && !memcmp(scfg, scfg2, 64) && !memcmp(before, after, 1024),
          "%s: state changed by a refused ldtilecfg", what);
    /* and from the unconfigured state it stays unconfigured */
    fa_tm_release();
    fa_tm_clear_faults();
    fa_tm_loadconfig(bad);
    CHECK(fa_tm_faults() == bit && !fa_tm_configured(), "%s (unconfigured): faults %#x configured %d", what,
          fa_tm_faults(), fa_tm_configured());
    fa_tm_clear_faults();
}

static void test_config(void)
{
    fa_tilecfg bad;
    char name[128];

    for (int p = 2; p < 256; p += (p < 8 ? 1 : 61)) {
        bad = dp_cfg(1, 1, 1);
        bad.palette = (uint8_t)p;
        snprintf(name, sizeof name, "palette %d", p);
        expect_refused(&bad, FA_TM_FAULT_PALETTE, name);
    }
    bad = dp_cfg(1, 1, 1);
    bad.start_row = 1;
    expect_refused(&bad, FA_TM_FAULT_CONFIG, "start_row 1");
    for (int i = 0; i < 14; i++) {
        bad = dp_cfg(1, 1, 1);
        bad.reserved[i] = 0x80;
        snprintf(name, sizeof name, "reserved byte %d", i + 2);
        expect_refused(&bad, FA_TM_FAULT_CONFIG, name);
    }
    /* per tile: rows > 16, colsb > 64, one of the two zero; tiles 8..15 any shape at all
     * (their bytes are reserved in palette 1) */
    const int shapes[5][2] = {{17, 64}, {16, 65}, {0, 64}, {1, 0}, {1, 4}};
    for (int t = 0; t < 16; t++)
        for (int i = 0; i < (t < 8 ? 4 : 5); i++) {
            bad = dp_cfg(1, 1, 1);
            cfg_set(&bad, t, shapes[i][0], shapes[i][1]);
            snprintf(name, sizeof name, "tile %d rows %d colsb %d", t, shapes[i][0], shapes[i][1]);
            expect_refused(&bad, FA_TM_FAULT_CONFIG, name);
        }
    bad = dp_cfg(1, 1, 1);
    bad.colsb[3] = 0x0100; /* 256: only the high byte set */
    expect_refused(&bad, FA_TM_FAULT_CONFIG, "colsb 256");

    /* palette 0 releases whatever else the block holds (the SDM reads nothing more) */
    g_case = "palette 0";
    fa_tilecfg c = dp_cfg(2, 2, 2);
    fa_tm_loadconfig(&c);
    memset(&bad, 0xff, sizeof bad);
    bad.palette = 0;
    fa_tm_clear_faults();
    fa_tm_loadconfig(&bad);
    uint8_t s[64], z[64] = {0};
    fa_tm_storeconfig(s);
    CHECK(fa_tm_faults() == 0 && !fa_tm_configured() && !memcmp(s, z, 64), "faults %#x configured %d",
          fa_tm_faults(), fa_tm_configured());

    /* STTILECFG: the block back, byte for byte; all zeros when unconfigured */
    g_case = "sttilecfg";
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) cfg_set(&c, t, 16 - t, 64 - 4 * t - (t & 1));
    fa_tm_loadconfig(&c);
    memset(s, 0xee, sizeof s);
    fa_tm_storeconfig(s);
    CHECK(fa_tm_configured() && !memcmp(s, &c, 64), "stored config differs");
    fa_tm_release();
    memset(s, 0xee, sizeof s);
    fa_tm_storeconfig(s);
    CHECK(!memcmp(s, z, 64), "unconfigured sttilecfg not zero");
    CHECK(fa_tm_faults() == 0, "faults %#x", fa_tm_faults());

    /* every instruction before configuration, and after release: fault, nothing touched */
    for (int phase = 0; phase < 2; phase++) {
        g_case = phase ? "after release" : "before configuration";
        if (phase) {
            c = dp_cfg(4, 4, 4);
            fa_tm_loadconfig(&c);
            fa_tm_release();
        }
        uint8_t mem[16][64];
        memset(mem, 0x33, sizeof mem);
        const unsigned ops = 4;
        for (unsigned op = 0; op < ops; op++) {
            fa_tm_clear_faults();
            if (op == 0) fa_tm_zero(0);
            if (op == 1) fa_tm_loadd(0, mem, 64);
            if (op == 2) fa_tm_stored(0, mem, 64);
            if (op == 3) fa_tm_dpbf16ps(0, 1, 2);
            CHECK(fa_tm_faults() == FA_TM_FAULT_UNCONFIGURED && !fa_tm_configured(), "op %u: faults %#x", op,
                  fa_tm_faults());
        }
        CHECK(all_bytes(mem, sizeof mem, 0x33), "memory written while unconfigured");
    }
    fa_tm_clear_faults();

    /* tile numbers outside 0..7, and tiles the configuration leaves out */
    g_case = "tile numbers";
    c = dp_cfg(2, 2, 2); /* tiles 3..7 not configured */
    fa_tm_loadconfig(&c);
    uint8_t mem[16][64];
    memset(mem, 0x44, sizeof mem);
    const int bad_t[] = {-1, 8, 15, 1000};
    for (size_t i = 0; i < sizeof bad_t / sizeof bad_t[0]; i++) {
        const int t = bad_t[i];
        fa_tm_clear_faults();
        fa_tm_zero(t);
        fa_tm_loadd(t, mem, 64);
        fa_tm_stored(t, mem, 64);
        CHECK(fa_tm_faults() == FA_TM_FAULT_TILE, "tile %d: faults %#x", t, fa_tm_faults());
        fa_tm_clear_faults();
        fa_tm_dpbf16ps(0, 1, t);
        CHECK(fa_tm_faults() == FA_TM_FAULT_TILE, "dp tile %d: faults %#x", t, fa_tm_faults());
    }
    for (int t = 3; t < 8; t++) {
        fa_tm_clear_faults();
        fa_tm_zero(t);
        fa_tm_loadd(t, mem, 64);
        fa_tm_stored(t, mem, 64);
        CHECK(fa_tm_faults() == FA_TM_FAULT_SHAPE, "unconfigured tile %d: faults %#x", t, fa_tm_faults());
        fa_tm_clear_faults();
        fa_tm_dpbf16ps(t, 1, 2);
        CHECK(fa_tm_faults() == FA_TM_FAULT_SHAPE, "dp into unconfigured tile %d: faults %#x", t, fa_tm_faults());
    }
    CHECK(all_bytes(mem, sizeof mem, 0x44), "memory written by a refused store");

    /* TILELOADD/TILESTORED: colsb must be whole dwords */
    g_case = "colsb not a multiple of 4";
    memset(&c, 0, sizeof c);
    c.palette = 1;
    cfg_set(&c, 0, 2, 6);
    fa_tm_loadconfig(&c);
    fa_tm_clear_faults();
    fa_tm_loadd(0, mem, 64);
    CHECK(fa_tm_faults() == FA_TM_FAULT_CONFIG, "load: faults %#x", fa_tm_faults());
    fa_tm_clear_faults();
    fa_tm_stored(0, mem, 64);
    CHECK(fa_tm_faults() == FA_TM_FAULT_CONFIG && all_bytes(mem, sizeof mem, 0x44), "store: faults %#x",
          fa_tm_faults());
    fa_tm_clear_faults();
    fa_tm_zero(0); /* TILEZERO has no such rule */
    CHECK(fa_tm_faults() == 0, "zero: faults %#x", fa_tm_faults());

    /* TDPBF16PS operand checks: each one alone, and the result tile left alone */
    struct {
        int rc, cc, ra, ca, rb, cb;
        int c, a, b;
        unsigned bit;
        const char *what;
    } dp[] = {
        {4, 16, 4, 24, 6, 16, 0, 1, 2, 0, "a legal shape (M 4, K 6, N 4)"},
        {4, 16, 5, 24, 6, 16, 0, 1, 2, FA_TM_FAULT_SHAPE, "rows(A) != rows(C)"},
        {4, 16, 4, 24, 6, 20, 0, 1, 2, FA_TM_FAULT_SHAPE, "colsb(B) != colsb(C)"},
        {4, 16, 4, 24, 5, 16, 0, 1, 2, FA_TM_FAULT_SHAPE, "rows(B) != colsb(A)/4"},
        {4, 18, 4, 24, 6, 18, 0, 1, 2, FA_TM_FAULT_CONFIG, "colsb(C) = 18"},
        {4, 16, 4, 26, 6, 16, 0, 1, 2, FA_TM_FAULT_CONFIG, "colsb(A) = 26"},
        {4, 16, 4, 16, 4, 16, 0, 0, 2, FA_TM_FAULT_SHAPE, "c == a"},
        {4, 16, 4, 16, 4, 16, 0, 1, 0, FA_TM_FAULT_SHAPE, "c == b"},
        {4, 16, 4, 16, 4, 16, 0, 1, 1, FA_TM_FAULT_SHAPE, "a == b"},
    };
    for (size_t i = 0; i < sizeof dp / sizeof dp[0]; i++) {
        g_case = dp[i].what;
        memset(&c, 0, sizeof c);
        c.palette = 1;
        cfg_set(&c, 0, dp[i].rc, dp[i].cc);
        cfg_set(&c, 1, dp[i].ra, dp[i].ca);
        cfg_set(&c, 2, dp[i].rb, dp[i].cb);
        fa_tm_loadconfig(&c);
        fa_tm_clear_faults();
        uint8_t ones[16][64], before[1024], after[1024];
        for (int r = 0; r < 16; r++)
            for (int j = 0; j < 64; j += 2) ones[r][j] = 0x80, ones[r][j + 1] = 0x3f; /* bf16 1.0 */
        if (dp[i].cc % 4 == 0) fa_tm_loadd(0, ones, 64);
        if (dp[i].ca % 4 == 0) fa_tm_loadd(1, ones, 64);
        fa_tm_loadd(2, ones, 64);
        fa_tm_peek(dp[i].c, before);
        fa_tm_dpbf16ps(dp[i].c, dp[i].a, dp[i].b);
        fa_tm_peek(dp[i].c, after);
        CHECK(fa_tm_faults() == dp[i].bit, "faults %#x want %#x", fa_tm_faults(), dp[i].bit);
        if (dp[i].bit) CHECK(!memcmp(before, after, 1024), "refused tdpbf16ps changed tile %d", dp[i].c);
        fa_tm_release();
    }
    fa_tm_clear_faults();
}

/* ----------------------------------------------------- TDPBF16PS by hand */

/* bf16 bit patterns used below */
enum {
    B_1 = 0x3f80, B_2 = 0x4000, B_3 = 0x4040, B_4 = 0x4080, B_5 = 0x40a0, B_M1 = 0xbf80,
    B_2M24 = 0x3380, /* 2^-24 */
    B_2M63 = 0x2000, B_2M64 = 0x1f80, B_2M70 = 0x1c80, B_M2M70 = 0x9c80,
    B_2M126 = 0x0080, B_M2M26 = 0xb280,
    B_DEN = 0x0001,   /* the smallest bf16 denormal, 2^-133 */
    B_2P100 = 0x7180, /* 2^100 */
    B_2P127 = 0x7f00, B_INF = 0x7f80, B_MINF = 0xff80, B_QNAN = 0x7fc1, B_SNAN = 0x7f81, B_0 = 0x0000,
};

typedef struct dp_case {
    const char *what;
    uint32_t c;
    int K;
    uint16_t a[4], b[4];
    uint32_t want;
} dp_case;

static const dp_case cases[] = {
    /* 1 + 2*4 + 3*5 = 24 */
    {"exact sum", 0x3f800000u, 1, {B_2, B_3}, {B_4, B_5}, 0x41c00000u},
    /* 1 + (2*4 + 3*5) + (1*1 + -1*1) = 24 over two pairs */
    {"exact sum, K 2", 0x3f800000u, 2, {B_2, B_3, B_1, B_M1}, {B_4, B_5, B_1, B_1}, 0x41c00000u},
    /* C = 1, products 2^-24 and 2^-24. The SDM adds the pair first (2^-23, exact),
     * then C: 1 + 2^-23 = 0x3f800001. Adding each product to C in turn (the
     * intrinsics guide's older pseudo-code) would tie twice and stay at 1.0. */
    {"pair summed before C", 0x3f800000u, 1, {B_2M24, B_2M24}, {B_1, B_1}, 0x3f800001u},
    /* The even lane accumulates over k on its own: even = 1 + 2^-24 -> 1 (tie to
     * even), odd = 2^-24 + 2^-24 = 2^-23, even + odd = 1 + 2^-23. */
    {"lanes accumulate over k apart", 0x00000000u, 2, {B_1, B_2M24, B_2M24, B_2M24}, {B_1, B_1, B_1, B_1},
     0x3f800001u},
    /* FMA in the lane: even = 2^-126 (k 0) + 2^-127 (k 1, exact in the FMA although
     * a denormal as an fp32 product) = 1.5 * 2^-126. Unfused with FTZ: 2^-126. */
    {"fused product below 2^-126", 0x00000000u, 2, {B_2M63, B_0, B_2M64, B_0}, {B_2M63, B_0, B_2M63, B_0},
     0x00c00000u},
    /* Tininess after rounding: even = 2^-126 - 2^-152, rounded to 24 bits with an
     * unbounded exponent = 2^-126, normal, so kept (x86 detects tininess after
     * rounding); before-rounding detection would flush it to 0. */
    {"tiny before rounding, normal after", 0x00000000u, 2, {B_2M63, B_0, B_2M126, B_0},
     {B_2M63, B_0, B_M2M26, B_0}, 0x00800000u},
    /* bf16 denormal input read as zero: 2^-133 * 2^100 would be 2^-33 */
    {"denormal bf16 in A", 0x00000000u, 1, {B_DEN, B_0}, {B_2P100, B_0}, 0x00000000u},
    {"denormal bf16 in B", 0x3f800000u, 1, {B_2P100, B_0}, {B_0, B_DEN}, 0x3f800000u},
    /* denormal fp32 C read as zero */
    {"denormal C", 0x00000001u, 1, {B_0, B_0}, {B_0, B_0}, 0x00000000u},
    {"denormal -C", 0x807fffffu, 1, {B_0, B_0}, {B_0, B_0}, 0x00000000u},
    /* denormal results flushed: 2^-70 * 2^-70 = 2^-140 */
    {"denormal product flushed", 0x00000000u, 1, {B_2M70, B_0}, {B_2M70, B_0}, 0x00000000u},
    {"negative denormal product flushed", 0x00000000u, 1, {B_M2M70, B_0}, {B_2M70, B_0}, 0x00000000u},
    /* C + t denormal: 1.5*2^-126 - 2^-126 = 2^-127, flushed */
    {"denormal C + t flushed", 0x00c00000u, 1, {B_2M63, B_0}, {0xa000 /* -2^-63 */, B_0}, 0x00000000u},
    /* -0 accumulators: temp starts at +0, so C = -0 plus zero products is +0 */
    {"-0 C", 0x80000000u, 1, {B_0, B_0}, {B_0, B_0}, 0x00000000u},
    {"exact cancellation", 0x3f800000u, 1, {B_M1, B_0}, {B_1, B_0}, 0x00000000u},
    /* infinities */
    {"inf", 0x3f800000u, 1, {B_INF, B_0}, {B_1, B_0}, 0x7f800000u},
    {"-inf", 0x3f800000u, 1, {B_1, B_INF}, {B_0, B_M1}, 0xff800000u},
    {"inf C", 0x7f800000u, 1, {B_1, B_1}, {B_1, B_1}, 0x7f800000u},
    {"overflow 2^127 * 2^127", 0x00000000u, 1, {B_2P127, B_0}, {B_2P127, B_0}, 0x7f800000u},
    /* invalid: the x86 default NaN, 0xffc00000 */
    {"inf * 0", 0x3f800000u, 1, {B_INF, B_0}, {B_0, B_0}, 0xffc00000u},
    {"inf - inf across the pair", 0x00000000u, 1, {B_INF, B_MINF}, {B_1, B_1}, 0xffc00000u},
    {"inf C - inf", 0xff800000u, 1, {B_INF, B_0}, {B_1, B_0}, 0xffc00000u},
    /* NaNs: the first NaN met, quieted (a quiet NaN keeps its payload) */
    {"qNaN in A", 0x3f800000u, 1, {B_QNAN, B_0}, {B_1, B_0}, 0x7fc10000u},
    {"sNaN in B, quieted", 0x3f800000u, 1, {B_1, B_0}, {B_SNAN, B_0}, 0x7fc10000u},
    {"qNaN C", 0x7fc00123u, 1, {B_1, B_0}, {B_1, B_0}, 0x7fc00123u},
    {"NaN * 0", 0x00000000u, 1, {B_QNAN, B_0}, {B_0, B_0}, 0x7fc10000u},
};

static void test_dp(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        g_case = cases[i].what;
        const uint32_t got = dp1(cases[i].c, cases[i].K, cases[i].a, cases[i].b);
        CHECK(got == cases[i].want, "%s: got %#010x want %#010x", cases[i].what, got, cases[i].want);
    }

    /* A full 16 x 16 x 32 product of small integers: every element exact. */
    g_case = "16x16x32 integers";
    static uint16_t a[16][32], b[16][32];
    static float c[16][16];
    int ai[16][32], bi[32][16];
    for (int m = 0; m < 16; m++)
        for (int x = 0; x < 32; x++) ai[m][x] = (m * 7 + x * 3) % 11 - 5;
    for (int x = 0; x < 32; x++)
        for (int n = 0; n < 16; n++) bi[x][n] = (x * 5 + n) % 9 - 4;
    for (int m = 0; m < 16; m++)
        for (int x = 0; x < 32; x++) {
            const float f = (float)ai[m][x];
            uint32_t u;
            memcpy(&u, &f, 4);
            a[m][x] = (uint16_t)(u >> 16);
        }
    for (int x = 0; x < 32; x++)
        for (int n = 0; n < 16; n++) {
            const float f = (float)bi[x][n];
            uint32_t u;
            memcpy(&u, &f, 4);
            b[x / 2][2 * n + (x & 1)] = (uint16_t)(u >> 16);
        }
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) c[m][n] = (float)(m - n);
    const fa_tilecfg cfg = dp_cfg(16, 16, 16);
    model_dp(&cfg, c, a, b);
    int bad = 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            int want = m - n;
            for (int x = 0; x < 32; x++) want += ai[m][x] * bi[x][n];
            bad += c[m][n] != (float)want;
        }
    CHECK(bad == 0, "%d of 256 elements wrong", bad);
}

/* ---------------------------------------------------------------- int8 */

static uint64_t rnd(void);

static const char *const dp8_names[4] = {"tdpbssd", "tdpbsud", "tdpbusd", "tdpbuud"};

/* The model's variant v (0 ssd, 1 sud, 2 usd, 3 uud) on row-major buffers (strides 64). */
static void model_dp8(int v, const fa_tilecfg *cfg, void *c, const void *a, const void *b)
{
    fa_tm_loadconfig(cfg);
    fa_tm_loadd(0, c, 64);
    fa_tm_loadd(1, a, 64);
    fa_tm_loadd(2, b, 64);
    if (v == 0) fa_tm_dpbssd(0, 1, 2);
    if (v == 1) fa_tm_dpbsud(0, 1, 2);
    if (v == 2) fa_tm_dpbusd(0, 1, 2);
    if (v == 3) fa_tm_dpbuud(0, 1, 2);
    fa_tm_stored(0, c, 64);
    fa_tm_release();
}

/* The SDM's sum for element (m, n), written here in int64 and reduced modulo 2^32. */
static uint32_t dp8_want(int v, uint32_t c, int K, uint8_t a[16][64], int m, uint8_t b[16][64], int n)
{
    int64_t sum = 0;
    for (int k = 0; k < K; k++)
        for (int i = 0; i < 4; i++) {
            const int64_t x = v < 2 ? (int8_t)a[m][4 * k + i] : a[m][4 * k + i];
            const int64_t y = v % 2 == 0 ? (int8_t)b[k][4 * n + i] : b[k][4 * n + i];
            sum += x * y;
        }
    return (uint32_t)((uint64_t)c + (uint64_t)sum);
}

static void test_int8(void)
{
    /* One k-quad, bytes (0x80, 0x7f, 0xff, 0x02) . (0x80, 0x80, 0xff, 0x03), by hand:
     *   ssd: (-128)(-128) + 127(-128) + (-1)(-1) + 2*3 = 16384 - 16256 + 1 + 6 = 135
     *   sud: (-128)128 + 127*128 + (-1)255 + 6 = -16384 + 16256 - 255 + 6 = -377
     *   usd: 128(-128) + 127(-128) + 255(-1) + 6 = -16384 - 16256 - 255 + 6 = -32889
     *   uud: 128*128 + 127*128 + 255*255 + 6 = 16384 + 16256 + 65025 + 6 = 97671 */
    static const int32_t want1[4] = {135, -377, -32889, 97671};
    static uint8_t a[16][64], b[16][64];
    static uint32_t c[16][16];
    for (int v = 0; v < 4; v++) {
        g_case = dp8_names[v];
        memset(a, 0, sizeof a), memset(b, 0, sizeof b), memset(c, 0, sizeof c);
        a[0][0] = 0x80, a[0][1] = 0x7f, a[0][2] = 0xff, a[0][3] = 0x02;
        b[0][0] = 0x80, b[0][1] = 0x80, b[0][2] = 0xff, b[0][3] = 0x03;
        c[0][0] = 1000;
        fa_tm_clear_faults();
        const fa_tilecfg cfg = dp_cfg(1, 1, 1);
        model_dp8(v, &cfg, c, a, b);
        CHECK(fa_tm_faults() == 0 && c[0][0] == (uint32_t)(1000 + want1[v]), "%s: got %d want %d (faults %#x)",
              dp8_names[v], (int32_t)c[0][0], 1000 + want1[v], fa_tm_faults());
        /* wrap-around: C = INT32_MAX plus 135 (ssd) wraps to INT32_MIN + 134, nothing saturates */
        c[0][0] = 0x7fffffffu;
        model_dp8(v, &cfg, c, a, b);
        CHECK(c[0][0] == (uint32_t)(0x7fffffffu + (uint32_t)want1[v]), "%s wrap: got %#x", dp8_names[v], c[0][0]);
    }
    /* the largest sums: 16 quads of 0x80 * 0x80 (ssd 16384 each, 64 products = 2^20) into
     * C = 2^31 - 2^20: exactly 2^31, read as INT32_MIN */
    g_case = "tdpbssd full K to 2^31";
    memset(a, 0x80, sizeof a), memset(b, 0x80, sizeof b), memset(c, 0, sizeof c);
    c[3][5] = 0x7ff00000u;
    const fa_tilecfg full = dp_cfg(16, 16, 16);
    model_dp8(0, &full, c, a, b);
    CHECK(c[3][5] == 0x80000000u && c[0][0] == 0x00100000u, "got %#x and %#x", c[3][5], c[0][0]);

    /* random shapes and bytes against the int64 transcription, every element; the C
     * values are random too, so the sums wrap often */
    for (int v = 0; v < 4; v++) {
        g_case = dp8_names[v];
        int bad = 0;
        for (int it = 0; it < 60; it++) {
            const int M = 1 + (int)(rnd() % 16), K = 1 + (int)(rnd() % 16), N = 1 + (int)(rnd() % 16);
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 64; j++) a[i][j] = (uint8_t)rnd(), b[i][j] = (uint8_t)rnd();
            static uint32_t c0[16][16];
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 16; j++) c0[i][j] = (uint32_t)rnd();
            memcpy(c, c0, sizeof c);
            const fa_tilecfg cfg = dp_cfg(M, K, N);
            fa_tm_clear_faults();
            model_dp8(v, &cfg, c, a, b);
            bad += fa_tm_faults() != 0;
            for (int m = 0; m < 16; m++)
                for (int n = 0; n < 16; n++)
                    bad += c[m][n] != (m < M && n < N ? dp8_want(v, c0[m][n], K, a, m, b, n) : c0[m][n]); /* outside: not stored */
        }
        CHECK(bad == 0, "%s: %d elements (or faults) wrong over 60 random products", dp8_names[v], bad);
    }

    /* operands that do not chain: refused, C unchanged */
    g_case = "tdpbssd operand checks";
    fa_tilecfg bad = dp_cfg(4, 4, 4);
    cfg_set(&bad, 2, 3, 16); /* B has 3 rows, A's colsb / 4 is 4 */
    fa_tm_clear_faults();
    fa_tm_loadconfig(&bad);
    static uint32_t cc[16][16];
    for (int i = 0; i < 16; i++) cc[0][i] = 0x5a5a5a5au;
    fa_tm_loadd(0, cc, 64);
    fa_tm_dpbssd(0, 1, 2);
    CHECK(fa_tm_faults() == FA_TM_FAULT_SHAPE, "faults %#x", fa_tm_faults());
    fa_tm_clear_faults();
    fa_tm_dpbuud(0, 0, 2); /* C == A */
    CHECK(fa_tm_faults() == FA_TM_FAULT_SHAPE, "C == A: faults %#x", fa_tm_faults());
    memset(cc, 0, sizeof cc);
    fa_tm_stored(0, cc, 64);
    CHECK(cc[0][0] == 0x5a5a5a5au && cc[0][3] == 0x5a5a5a5au, "C changed: %#x", cc[0][0]);
    fa_tm_release();
    fa_tm_clear_faults();
    fa_tm_dpbsud(0, 1, 2);
    CHECK(fa_tm_faults() == FA_TM_FAULT_UNCONFIGURED, "unconfigured: faults %#x", fa_tm_faults());
    fa_tm_clear_faults();
}

/* ---------------------------------------------------------------- memory */

static void test_memory(void)
{
    g_case = "load/store round trip, strides";
    fa_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    const int shapes[8][2] = {{16, 64}, {1, 4}, {3, 12}, {16, 4}, {7, 60}, {2, 64}, {16, 36}, {5, 8}};
    for (int t = 0; t < 8; t++) cfg_set(&cfg, t, shapes[t][0], shapes[t][1]);
    fa_tm_loadconfig(&cfg);
    static uint8_t src[4096], dst[4096];
    for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(i * 131 + 7);
    const size_t strides[] = {64, 100, 67, 200};
    for (int t = 0; t < 8; t++)
        for (size_t si = 0; si < sizeof strides / sizeof strides[0]; si++) {
            const int R = shapes[t][0], CB = shapes[t][1];
            const size_t ls = strides[si], ss = strides[(si + 1) % 4];
            fa_tm_clear_faults();
            fa_tm_loadd(t, src + 3, ls);
            uint8_t raw[16][64];
            fa_tm_peek(t, (uint8_t *)raw);
            int bad = 0;
            for (int r = 0; r < 16; r++)
                for (int j = 0; j < 64; j++)
                    bad += raw[r][j] != (r < R && j < CB ? src[3 + (size_t)r * ls + (size_t)j] : 0);
            CHECK(bad == 0, "tile %d stride %zu: %d bytes wrong after load (beyond colsb/rows must be 0)", t, ls,
                  bad);
            memset(dst, 0xa5, sizeof dst);
            fa_tm_stored(t, dst + 1, ss);
            bad = 0;
            for (size_t i = 0; i < sizeof dst; i++) {
                const size_t off = i - 1;
                const int in = i >= 1 && (int)(off / ss) < R && (int)(off % ss) < CB;
                bad += dst[i] != (in ? src[3 + (off / ss) * ls + off % ss] : 0xa5);
            }
            CHECK(bad == 0 && fa_tm_faults() == 0, "tile %d strides %zu/%zu: %d bytes wrong after store", t, ls,
                  ss, bad);
        }

    g_case = "negative stride";
    fa_tm_clear_faults();
    fa_tm_loadd(0, src + 15 * 64, (size_t)-64); /* rows bottom up */
    memset(dst, 0, sizeof dst);
    fa_tm_stored(0, dst, 64);
    int bad = 0;
    for (int r = 0; r < 16; r++) bad += memcmp(dst + r * 64, src + (15 - r) * 64, 64) != 0;
    CHECK(bad == 0 && fa_tm_faults() == 0, "%d rows wrong", bad);

    g_case = "tilezero";
    fa_tm_zero(0);
    uint8_t raw[1024];
    fa_tm_peek(0, raw);
    CHECK(all_bytes(raw, 1024, 0), "tile 0 not zero");

    g_case = "ldtilecfg zeroes, release clears";
    fa_tm_loadd(6, src, 64);
    fa_tm_loadconfig(&cfg); /* a new (here the same) configuration zeroes every tile */
    int nonzero = 0;
    for (int t = 0; t < 8; t++) fa_tm_peek(t, raw), nonzero += !all_bytes(raw, 1024, 0);
    CHECK(nonzero == 0, "%d tiles not zero after ldtilecfg", nonzero);
    fa_tm_loadd(6, src, 64);
    fa_tm_release();
    nonzero = 0;
    for (int t = 0; t < 8; t++) fa_tm_peek(t, raw), nonzero += !all_bytes(raw, 1024, 0);
    uint8_t s[64];
    fa_tm_storeconfig(s);
    CHECK(nonzero == 0 && !fa_tm_configured() && all_bytes(s, 64, 0), "state left after release");

    g_case = "tdpbf16ps zeroes C outside its shape";
    fa_tilecfg d = dp_cfg(2, 1, 1);
    uint32_t cc[16][16], aa[16][16], bb[16][16];
    memset(cc, 0, sizeof cc), memset(aa, 0, sizeof aa), memset(bb, 0, sizeof bb);
    fa_tm_loadconfig(&d);
    fa_tm_loadd(0, cc, 64);
    fa_tm_dpbf16ps(0, 1, 2);
    fa_tm_peek(0, raw);
    CHECK(all_bytes(raw, 1024, 0) && fa_tm_faults() == 0, "C tile not zero beyond 2 x 4 bytes");
    fa_tm_release();
}

/* --------------------------------------------------------------- threads */

typedef struct thread_arg {
    int id, rounds, bad;
    unsigned faults_seen;
} thread_arg;

static void *thread_main(void *p)
{
    thread_arg *t = p;
    /* thread 0: M 16, K 16, N 16 of ones; thread 1: M 3, K 5, N 2 of twos, plus a fault */
    const int M = t->id ? 3 : 16, K = t->id ? 5 : 16, N = t->id ? 2 : 16;
    const uint16_t v = t->id ? 0x4000 : 0x3f80;
    const float want = (float)(2 * K) * (t->id ? 4.0f : 1.0f) * (float)t->rounds;
    uint16_t a[16][32], b[16][32];
    float c[16][16];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 32; j++) a[i][j] = b[i][j] = v;
    memset(c, 0, sizeof c);
    const fa_tilecfg cfg = dp_cfg(M, K, N);
    fa_tm_loadconfig(&cfg);
    fa_tm_loadd(0, c, 64);
    for (int r = 0; r < t->rounds; r++) {
        fa_tm_loadd(1, a, 64);
        fa_tm_loadd(2, b, 64);
        fa_tm_dpbf16ps(0, 1, 2);
        if (t->id) fa_tm_zero(5); /* not configured here: a fault of this thread alone */
    }
    fa_tm_stored(0, c, 64);
    uint8_t s[64];
    fa_tm_storeconfig(s);
    t->bad += memcmp(s, &cfg, 64) != 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) t->bad += c[m][n] != (m < M && n < N ? want : 0.0f);
    t->faults_seen = fa_tm_faults();
    fa_tm_release();
    return NULL;
}

static void test_threads(void)
{
    g_case = "two threads";
    thread_arg args[2] = {{0, 200, 0, 0}, {1, 200, 0, 0}};
    pthread_t th[2];
    int started = 0;
    for (int i = 0; i < 2; i++) started += pthread_create(&th[i], NULL, thread_main, &args[i]) == 0;
    CHECK(started == 2, "pthread_create failed");
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    CHECK(args[0].bad == 0 && args[1].bad == 0, "wrong results: %d, %d", args[0].bad, args[1].bad);
    CHECK(args[0].faults_seen == 0 && args[1].faults_seen == FA_TM_FAULT_SHAPE, "faults %#x, %#x",
          args[0].faults_seen, args[1].faults_seen);
    CHECK(!fa_tm_configured() && fa_tm_faults() == 0, "the main thread's state changed");
}

/* ------------------------------------------------- random and edge inputs */

static uint64_t g_rng = 0x9e3779b97f4a7c15u;
static uint64_t rnd(void)
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1); /* nearest even; inputs here are finite */
    return (uint16_t)(u >> 16);
}

static float gauss(void)
{
    float s = 0;
    for (int i = 0; i < 12; i++) s += (float)(rnd() >> 40) / (float)(1 << 24);
    return s - 6.0f;
}

static const uint16_t edge16[] = {0x0000, 0x8000, 0x0001, 0x807f, 0x0080, 0x8080, 0x3f80, 0xbf80, 0x3380,
                                  0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0x2000, 0x1f80,
                                  0xb280, 0x1c80, 0x7f00, 0x4b80, 0xcb80, 0x3400};
static const uint32_t edge32[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00800000u,
                                  0x3f800000u, 0xbf800000u, 0x7f7fffffu, 0x7f800000u, 0xff800000u,
                                  0x7fc00000u, 0x7fa00001u, 0x4b800000u, 0x00c00000u};

static float ldexpf_(float f, int e)
{
    while (e > 0) f *= 2.0f, e--;
    while (e < 0) f *= 0.5f, e++;
    return f;
}

/* kind 0: N(0,1); 1: N(0,1) times 2^[-40, 40]; 2: values near cancellation; 3: edges;
 * the boundaries of the model's fast path (amx_model.c, add_round):
 * 4: products and sums near 2^-126 (FTZ after rounding, tiny before but normal after),
 *    with zeros and denormals among them;
 * 5: products and C near 2^128 (overflow, rows redone on the integer path), and
 *    FLT_MAX;
 * 6: few significant bits over 2^[-30, 30] (products, C 2^[-40, 40]): exact ties, powers
 *    of two, exponent gaps on both sides of the fast path's 26. */
enum { KINDS = 7 };

static uint16_t gen16(int kind)
{
    const uint16_t sign = (uint16_t)((rnd() & 1) << 15);
    if (kind == 4) {
        if (rnd() % 8 == 0) return (uint16_t)(sign | (rnd() % 2 ? 0x0000 : 0x0001 + rnd() % 0x7f));
        return (uint16_t)(sign | (127 - 63 + (int)(rnd() % 7) - 3) << 7 | (uint16_t)(rnd() & 0x7f));
    }
    if (kind == 5) {
        if (rnd() % 8 == 0) return (uint16_t)(sign | 0x7f7f);
        return (uint16_t)(sign | (127 + 63 + (int)(rnd() % 3) - 1) << 7 | (uint16_t)(rnd() & 0x7f));
    }
    if (kind == 6) return (uint16_t)(sign | (127 + (int)(rnd() % 61) - 30) << 7 | (uint16_t)((rnd() % 8) << 4));
    if (kind == 3 && rnd() % 3 == 0) return edge16[rnd() % (sizeof edge16 / sizeof edge16[0])];
    float f = gauss();
    if (kind == 1) f = ldexpf_(f, (int)(rnd() % 81) - 40);
    if (kind == 2) f = (rnd() & 1) ? 1.0f + f * 0.01f : -1.0f - f * 0.01f;
    return bf16_of(f);
}

static uint32_t gen32(int kind)
{
    const uint32_t sign = (uint32_t)(rnd() & 1) << 31;
    if (kind == 4) {
        const unsigned r = (unsigned)(rnd() % 8);
        if (r == 0) return sign;
        if (r == 1) return sign | (uint32_t)(1 + rnd() % 0x7fffff); /* denormal, read as zero */
        return sign | (uint32_t)(1 + rnd() % 4) << 23 | (uint32_t)(rnd() & 0x7fffff);
    }
    if (kind == 5) {
        if (rnd() % 8 == 0) return sign | 0x7f7fffffu;
        return sign | (uint32_t)(250 + rnd() % 5) << 23 | (uint32_t)(rnd() & 0x7fffff);
    }
    if (kind == 6) {
        const uint32_t m = rnd() % 3 == 0 ? 0 : rnd() % 2 ? 1 : (uint32_t)(rnd() & 0x7fffff);
        return sign | (uint32_t)(127 + (int)(rnd() % 81) - 40) << 23 | m;
    }
    if (kind == 3 && rnd() % 3 == 0) return edge32[rnd() % (sizeof edge32 / sizeof edge32[0])];
    float f = gauss() * (kind == 2 ? 8.0f : 1.0f);
    if (kind == 1) f = ldexpf_(f, (int)(rnd() % 81) - 40);
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static int is_nan32(uint32_t x) { return (x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu); }

/* TDPBF16PS's element (m, n) as the SDM writes it, on fa_tm_fma32 alone (the model's
 * integer-only soft float): two lanes accumulated over k, even + odd, then C + that. */
static uint32_t sdm_fma32(uint32_t c, int K, uint16_t a[16][32], int m, uint16_t b[16][32], int n)
{
    uint32_t even = 0, odd = 0;
    for (int k = 0; k < K; k++) {
        even = fa_tm_fma32((uint32_t)a[m][2 * k] << 16, (uint32_t)b[k][2 * n] << 16, even);
        odd = fa_tm_fma32((uint32_t)a[m][2 * k + 1] << 16, (uint32_t)b[k][2 * n + 1] << 16, odd);
    }
    return fa_tm_fma32(c, 0x3f800000u, fa_tm_fma32(even, 0x3f800000u, odd));
}

/* The tiles' fast path (exact double arithmetic, rows with inf/NaN or an overflow
 * redone in integers) against the integer-only soft float, bit for bit, NaN payloads
 * included, on every kind of input: runs everywhere, hardware or not. `mode` names the
 * rounding mode the FPU is in meanwhile: the model must not depend on it. */
static void test_fast_path(const char *mode)
{
    g_case = mode;
    long elems = 0, bad = 0, zeros = 0, infs = 0, nans = 0;
    int printed = 0;
    for (int kind = 0; kind < KINDS; kind++)
        for (int it = 0; it < 200; it++) {
            const int M = it < 40 ? 16 : 1 + (int)(rnd() % 16), K = it < 40 ? 16 : 1 + (int)(rnd() % 16),
                      N = it < 40 ? 16 : 1 + (int)(rnd() % 16);
            const fa_tilecfg cfg = dp_cfg(M, K, N);
            static uint16_t a[16][32], b[16][32];
            static uint32_t c0[16][16], cm[16][16];
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 32; j++) a[i][j] = gen16(kind), b[i][j] = gen16(kind);
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 16; j++) c0[i][j] = gen32(kind);
            memcpy(cm, c0, sizeof cm);
            fa_tm_clear_faults();
            model_dp(&cfg, cm, a, b);
            CHECK(fa_tm_faults() == 0, "model faults %#x", fa_tm_faults());
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) {
                    const uint32_t want = sdm_fma32(c0[m][n], K, a, m, b, n), got = cm[m][n];
                    elems++;
                    zeros += !(want & 0x7fffffffu), infs += (want & 0x7fffffffu) == 0x7f800000u;
                    nans += is_nan32(want);
                    if (got == want) continue;
                    bad++;
                    if (printed++ < 12)
                        printf("  differ: kind %d M %d K %d N %d at (%d,%d): C %#010x tiles %#010x fma32 %#010x\n",
                               kind, M, K, N, m, n, c0[m][n], got, want);
                }
        }
    printf("fast path vs integer soft float, %s: %ld elements (%ld zeros, %ld infinities, %ld NaNs), %ld differ\n",
           mode, elems, zeros, infs, nans, bad);
    CHECK(bad == 0, "%ld of %ld elements differ from fa_tm_fma32", bad, elems);
}

/* -------------------------------------------------------------- hardware */

#if defined(FA_AMX_HW_PROBE)

/* ulps between two non-NaN fp32 (as ordered integers) */
static uint64_t ulps(uint32_t x, uint32_t y)
{
    const int64_t ix = (x & 0x80000000u) ? -(int64_t)(x & 0x7fffffffu) : (int64_t)x;
    const int64_t iy = (y & 0x80000000u) ? -(int64_t)(y & 0x7fffffffu) : (int64_t)y;
    return (uint64_t)(ix > iy ? ix - iy : iy - ix);
}

/* Other orders one might read into the SDM, to say which the hardware follows:
 * 1: C += a0*b0 (fused), C += a1*b1 (fused), per k (the intrinsics guide's text);
 * 2: C += (a0*b0 + a1*b1) per k, the pair rounded once then added. */
static uint32_t variant(int v, uint32_t c, int K, uint16_t a[16][32], int m, uint16_t b[16][32], int n)
{
    for (int k = 0; k < K; k++) {
        const uint32_t a0 = (uint32_t)a[m][2 * k] << 16, a1 = (uint32_t)a[m][2 * k + 1] << 16;
        const uint32_t b0 = (uint32_t)b[k][2 * n] << 16, b1 = (uint32_t)b[k][2 * n + 1] << 16;
        if (v == 1) {
            c = fa_tm_fma32(a0, b0, c);
            c = fa_tm_fma32(a1, b1, c);
        } else {
            const uint32_t pair = fa_tm_fma32(a1, b1, fa_tm_fma32(a0, b0, 0));
            c = fa_tm_fma32(c, 0x3f800000u, pair);
        }
    }
    return c;
}

static void test_hardware(void)
{
    char why[160];
    if (!amx_hw_available(why, sizeof why)) {
        printf("hardware comparison skipped: %s\n", why);
        return;
    }
    printf("hardware comparison: %s\n", why);

    /* LDTILECFG and the tile instructions on configurations the model refuses */
    g_case = "hardware faults";
    struct {
        const char *what;
        int action, set; /* set: which field to spoil */
        int model_refuses;
    } probes[] = {
        {"legal config", AMX_TRY_CONFIG, 0, 0},  {"palette 2", AMX_TRY_CONFIG, 1, 1},
        {"reserved byte 5", AMX_TRY_CONFIG, 2, 1}, {"rows 17", AMX_TRY_CONFIG, 3, 1},
        {"colsb 65", AMX_TRY_CONFIG, 4, 1},      {"rows 0, colsb 16", AMX_TRY_CONFIG, 5, 1},
        {"tile 9 configured", AMX_TRY_CONFIG, 6, 1}, {"start_row 1", AMX_TRY_CONFIG, 7, 1},
        {"tileloadd, colsb 6", AMX_TRY_LOAD, 8, 1}, {"tilestored, colsb 6", AMX_TRY_STORE, 8, 1},
        {"tilezero, colsb 6", AMX_TRY_ZERO, 8, 0}, {"tileloadd, unconfigured tile 0", AMX_TRY_LOAD, 9, 1},
        {"tdpbf16ps, rows(B) != colsb(A)/4", AMX_TRY_DP, 10, 1}, {"tdpbf16ps, legal", AMX_TRY_DP, 0, 0},
    };
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        fa_tilecfg c = dp_cfg(4, 4, 4);
        switch (probes[i].set) {
        case 1: c.palette = 2; break;
        case 2: c.reserved[3] = 1; break;
        case 3: c.rows[0] = 17; break;
        case 4: c.colsb[0] = 65; break;
        case 5: c.rows[0] = 0; break;
        case 6: cfg_set(&c, 9, 1, 4); break;
        case 7: c.start_row = 1; break;
        case 8: c.colsb[0] = 6; break;
        case 9: cfg_set(&c, 0, 0, 0); break;
        case 10: c.rows[2] = 3; break;
        }
        uint8_t stored[64];
        const int hw = amx_hw_try_config(&c, probes[i].action, stored);
        fa_tm_clear_faults();
        fa_tm_loadconfig(&c);
        if (probes[i].action == AMX_TRY_LOAD || probes[i].action == AMX_TRY_STORE) {
            static uint8_t buf[1024];
            if (probes[i].action == AMX_TRY_LOAD) fa_tm_loadd(0, buf, 64);
            else fa_tm_stored(0, buf, 64);
        }
        if (probes[i].action == AMX_TRY_ZERO) fa_tm_zero(0);
        if (probes[i].action == AMX_TRY_DP) fa_tm_dpbf16ps(0, 1, 2);
        const int model = fa_tm_faults() == 0;
        fa_tm_release();
        fa_tm_clear_faults();
        if (hw < 0) {
            printf("  %-36s probe failed\n", probes[i].what);
            continue;
        }
        printf("  %-36s hardware %-8s model %s%s\n", probes[i].what, hw ? "runs" : "faults",
               model ? "runs" : "faults",
               hw == model ? "" : probes[i].set == 7 ? "   (the model is stricter here by design)" : "   (differ)");
        if (hw && probes[i].set == 7)
            printf("    hardware sttilecfg after it: start_row %u\n", (unsigned)stored[1]);
        /* the model may be stricter than the SDM on start_row, by design; nowhere else */
        if (probes[i].set != 7) CHECK(hw == model, "%s: hardware %s, model %s", probes[i].what,
                                      hw ? "runs" : "faults", model ? "runs" : "faults");
    }

    /* the hand-computed cases of test_dp, on the tiles themselves */
    g_case = "hand-computed cases on the hardware";
    int hand_bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        static uint32_t c[16][16];
        static uint16_t a[16][32], b[16][32];
        memset(c, 0, sizeof c), memset(a, 0, sizeof a), memset(b, 0, sizeof b);
        c[0][0] = cases[i].c;
        for (int k = 0; k < cases[i].K; k++) {
            a[0][2 * k] = cases[i].a[2 * k], a[0][2 * k + 1] = cases[i].a[2 * k + 1];
            b[k][0] = cases[i].b[2 * k], b[k][1] = cases[i].b[2 * k + 1];
        }
        const fa_tilecfg cfg = dp_cfg(1, cases[i].K, 1);
        amx_hw_dpbf16ps(&cfg, c, 64, a, 64, b, 64);
        hand_bad += c[0][0] != cases[i].want;
        CHECK(c[0][0] == cases[i].want, "%s: hardware %#010x, written-out answer (and model) %#010x", cases[i].what,
              c[0][0], cases[i].want);
    }
    printf("hand-computed cases on the hardware: %zu of %zu as written\n",
           sizeof cases / sizeof cases[0] - (size_t)hand_bad, sizeof cases / sizeof cases[0]);

    /* TDPBF16PS, random and edge inputs */
    const int kinds = KINDS, per_kind = 150;
    long elems = 0, same = 0, nan_payload = 0, nan_mismatch = 0, other = 0, vmatch[3] = {0, 0, 0};
    uint64_t worst = 0;
    int printed = 0;
    for (int kind = 0; kind < kinds; kind++)
        for (int it = 0; it < per_kind; it++) {
            const int M = 1 + (int)(rnd() % 16), K = it < 20 ? 16 : 1 + (int)(rnd() % 16),
                      N = 1 + (int)(rnd() % 16);
            const fa_tilecfg cfg = dp_cfg(M, K, N);
            static uint16_t a[16][32], b[16][32];
            static uint32_t c0[16][16], ch[16][16], cm[16][16];
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 32; j++) a[i][j] = gen16(kind), b[i][j] = gen16(kind);
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 16; j++) c0[i][j] = gen32(kind);
            memcpy(ch, c0, sizeof ch), memcpy(cm, c0, sizeof cm);
            amx_hw_dpbf16ps(&cfg, ch, 64, a, 64, b, 64);
            fa_tm_clear_faults();
            model_dp(&cfg, cm, a, b);
            CHECK(fa_tm_faults() == 0, "model faults %#x", fa_tm_faults());
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) {
                    const uint32_t h = ch[m][n], x = cm[m][n];
                    elems++;
                    for (int v = 0; v < 3; v++) {
                        const uint32_t y = v == 0 ? x : variant(v, c0[m][n], K, a, m, b, n);
                        vmatch[v] += y == h || (is_nan32(y) && is_nan32(h));
                    }
                    if (h == x) {
                        same++;
                        continue;
                    }
                    if (is_nan32(h) && is_nan32(x)) {
                        nan_payload++;
                        continue;
                    }
                    if (is_nan32(h) != is_nan32(x)) nan_mismatch++;
                    else {
                        other++;
                        const uint64_t u = ulps(h, x);
                        if (u > worst) worst = u;
                    }
                    if (printed++ < 12)
                        printf("  differ: kind %d M %d K %d N %d at (%d,%d): C %#010x hardware %#010x model %#010x\n",
                               kind, M, K, N, m, n, c0[m][n], h, x);
                }
        }
    printf("hardware vs model: %ld elements, %ld bitwise equal, %ld NaN with another payload, %ld NaN on one "
           "side only, %ld other (worst %llu ulps)\n",
           elems, same, nan_payload, nan_mismatch, other, (unsigned long long)worst);
    printf("orders matching the hardware (NaN = NaN): SDM two lanes %ld, C += each product %ld, C += rounded "
           "pair %ld of %ld\n",
           vmatch[0], vmatch[1], vmatch[2], elems);
    g_case = "hardware vs model";
    CHECK(nan_mismatch == 0 && other == 0, "%ld NaN mismatches, %ld numeric differences (worst %llu ulps)",
          nan_mismatch, other, (unsigned long long)worst);
}

/* The four AMX-INT8 products on the tiles and on the model, bit for bit: random bytes,
 * random C (so sums wrap), random shapes and the edge bytes 0x00, 0x01, 0x7f, 0x80, 0xff.
 * Returns 77 when there is no AMX-INT8 to compare with. */
static int test_int8_hardware(void)
{
    char why[160];
    if (!amx_hw_int8_available(why, sizeof why)) {
        printf("AMX-INT8 hardware comparison skipped: %s\n", why);
        return 77;
    }
    printf("AMX-INT8 hardware comparison: %s\n", why);
    static const uint8_t edge[] = {0x00, 0x01, 0x7f, 0x80, 0xff, 0x81, 0xfe};
    for (int v = 0; v < 4; v++) {
        g_case = dp8_names[v];
        long elems = 0, same = 0;
        for (int it = 0; it < 200; it++) {
            const int M = it < 20 ? 16 : 1 + (int)(rnd() % 16), K = it < 20 ? 16 : 1 + (int)(rnd() % 16),
                      N = it < 20 ? 16 : 1 + (int)(rnd() % 16);
            static uint8_t a[16][64], b[16][64];
            static uint32_t c0[16][16], ch[16][16], cm[16][16];
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 64; j++) {
                    const uint64_t x = rnd();
                    a[i][j] = it % 3 == 1 ? edge[x % sizeof edge] : (uint8_t)x;
                    b[i][j] = it % 3 == 1 ? edge[(x >> 8) % sizeof edge] : (uint8_t)(x >> 16);
                }
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 16; j++) c0[i][j] = it % 5 == 0 ? 0x7fff0000u + (uint32_t)j : (uint32_t)rnd();
            memcpy(ch, c0, sizeof ch), memcpy(cm, c0, sizeof cm);
            const fa_tilecfg cfg = dp_cfg(M, K, N);
            amx_hw_dpbxxd(v, &cfg, ch, 64, a, 64, b, 64);
            fa_tm_clear_faults();
            model_dp8(v, &cfg, cm, a, b);
            CHECK(fa_tm_faults() == 0, "model faults %#x", fa_tm_faults());
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) elems++, same += ch[m][n] == cm[m][n];
            CHECK(memcmp(ch, cm, sizeof ch) == 0, "%s M %d K %d N %d: tiles and model differ", dp8_names[v], M, K,
                  N);
        }
        printf("  %s: %ld elements, %ld bitwise equal\n", dp8_names[v], elems, same);
    }
    return 0;
}

#else
static int test_int8_hardware(void)
{
    printf("AMX-INT8 hardware comparison skipped: not built with the AMX probe (needs x86-64 and a compiler "
           "taking -mamx-tile -mamx-bf16 -mamx-int8)\n");
    return 77;
}

static void test_hardware(void)
{
    printf("hardware comparison skipped: not built with the AMX probe (needs x86-64 and a compiler "
           "taking -mamx-tile -mamx-bf16)\n");
}
#endif

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--int8-hw") == 0) {
        const int skip = test_int8_hardware();
        printf("%ld passed, %ld failed\n", g_passed, g_failed);
        return skip && !g_failed ? 77 : g_failed ? 1 : 0;
    }
    test_config();
    test_dp();
    test_memory();
    test_int8();
    test_threads();
    test_fast_path("FPU rounding to nearest");
    /* the same with the FPU rounding elsewhere (the inputs differ too: gauss() rounds) */
#if defined(FE_UPWARD)
    if (fesetround(FE_UPWARD) == 0) test_fast_path("FPU rounding upward");
#endif
#if defined(FE_DOWNWARD)
    if (fesetround(FE_DOWNWARD) == 0) test_fast_path("FPU rounding downward"); /* x - x = -0 there */
#endif
#if defined(FE_TOWARDZERO)
    if (fesetround(FE_TOWARDZERO) == 0) test_fast_path("FPU rounding toward zero");
#endif
    fesetround(FE_TONEAREST);
    test_hardware();
    printf("%ld passed, %ld failed\n", g_passed, g_failed);
    fflush(stdout);
    return g_failed ? 1 : 0;
}
