/*
 * amx_tile.h: the tile interface the AMX kernels (amx_kernels.c) are written
 * against, and its two back-ends. amx_kernels.c is compiled twice:
 *
 *   FA_AMX_HW defined   the hardware: Intel's intrinsics (-mamx-tile -mamx-bf16 -mamx-int8 and
 *                       the AVX-512 flags); symbols fa_amx_<name>, table "amx";
 *   otherwise           the model (amx_model.c): one thread's tile state and the
 *                       instructions in portable C, built with no ISA flags, so the
 *                       same kernels run and are tested on every machine; symbols
 *                       fa_amxm_<name>, table "amx-model".
 *
 * Tile numbers are compile-time constants (the instructions take immediates),
 * so kernels name them with literal ints or enum constants, never variables.
 *
 * The configuration block is the 64 bytes ldtilecfg reads (Intel SDM, vol. 1,
 * ch. 18, palette 1): byte 0 the palette, byte 1 start_row, bytes 16..47 colsb[16]
 * (bytes per row of each tile), bytes 48..63 rows[16].
 */
#ifndef FA_KERNELS_AMX_TILE_H
#define FA_KERNELS_AMX_TILE_H

#include <stddef.h>
#include <stdint.h>

typedef struct fa_tilecfg {
    uint8_t palette;   /* 1: 8 tiles of at most 16 rows x 64 bytes; 0 releases */
    uint8_t start_row; /* 0 (restart point of an interrupted load/store) */
    uint8_t reserved[14];
    uint16_t colsb[16]; /* bytes per row of tile i (only 0..7 exist in palette 1) */
    uint8_t rows[16];   /* rows of tile i */
} fa_tilecfg;

_Static_assert(sizeof(fa_tilecfg) == 64, "ldtilecfg reads 64 bytes");

enum { FA_TILE_MAX_ROWS = 16, FA_TILE_MAX_COLSB = 64, FA_TILE_COUNT = 8 };

/* What the model records instead of faulting (bits of fa_tm_faults()). */
enum {
    FA_TM_FAULT_UNCONFIGURED = 1u << 0, /* a tile instruction before ldtilecfg (or after release) */
    FA_TM_FAULT_PALETTE = 1u << 1,      /* ldtilecfg with a palette other than 0 or 1 */
    FA_TM_FAULT_CONFIG = 1u << 2,       /* rows > 16, colsb > 64, colsb not a multiple of 4 where the
                                           SDM requires, start_row != 0, reserved bytes set */
    FA_TM_FAULT_SHAPE = 1u << 3,        /* tile product (tdpbf16ps, tdpb[su][su]d) operands that do not
                                           chain, or an unconfigured tile */
    FA_TM_FAULT_TILE = 1u << 4          /* a tile number outside 0..7 */
};

/* The model's entry points (amx_model.c): each acts on the calling thread's own
 * tile state; a call the hardware would fault on changes nothing and sets a bit in
 * the thread's fault flags; nothing ever aborts or prints. */
void fa_tm_loadconfig(const void *cfg64);
void fa_tm_storeconfig(void *cfg64); /* all zero when unconfigured, as the hardware stores */
void fa_tm_release(void);
void fa_tm_zero(int t);
void fa_tm_loadd(int t, const void *base, size_t stride_bytes);
void fa_tm_stored(int t, void *base, size_t stride_bytes);
void fa_tm_dpbf16ps(int c, int a, int b);
/* AMX-INT8: C (int32) += A (bytes) . B (bytes, k-quads), A then B signed (s) or
 * unsigned (u), wrapping modulo 2^32; the operand rules of tdpbf16ps. */
void fa_tm_dpbssd(int c, int a, int b);
void fa_tm_dpbsud(int c, int a, int b);
void fa_tm_dpbusd(int c, int a, int b);
void fa_tm_dpbuud(int c, int a, int b);
unsigned fa_tm_faults(void);    /* this thread's fault bits since the last clear */
void fa_tm_clear_faults(void);
int fa_tm_configured(void);     /* 1 while this thread holds a tile configuration */

/* The kernels' tile numbers (amx_kernels.c, amx_bwd.c): macros, not enum constants
 * (gcc's intrinsics paste them into the instruction's text, after macro expansion). */
#define TC0 0
#define TC1 1
#define TC2 2
#define TC3 3
#define TA0 4
#define TA1 5
#define TB0 6
#define TB1 7
/* a scratch pointer rounded up to the 64 bytes a tile row load wants */
#define ALIGN64(p) ((void *)(((uintptr_t)(p) + 63) & ~(uintptr_t)63))

/* The mask of lanes [a, z] of the 16 columns from column c0 (any a, z): a band's keys in
 * one 16-key group of a score row. */
static inline uint16_t fa_tile_lanes(int64_t a, int64_t z, int64_t c0)
{
    int64_t lo = a - c0, hi = z - c0 + 1;
    lo = lo < 0 ? 0 : lo > 16 ? 16 : lo;
    hi = hi < 0 ? 0 : hi > 16 ? 16 : hi;
    return hi <= lo ? 0 : (uint16_t)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

#if defined(FA_AMX_HW)
#include <immintrin.h>
#define FA_TILE_CONFIG(cfg) _tile_loadconfig(cfg)
#define FA_TILE_STORECONFIG(cfg) _tile_storeconfig(cfg)
#define FA_TILE_RELEASE() _tile_release()
#define FA_TILE_ZERO(t) _tile_zero(t)
#define FA_TILE_LOAD(t, base, stride) _tile_loadd(t, base, stride)
#define FA_TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define FA_TILE_DPBF16(c, a, b) _tile_dpbf16ps(c, a, b)
#define FA_TILE_DPBSSD(c, a, b) _tile_dpbssd(c, a, b) /* -mamx-int8 */
#define FA_TILE_DPBSUD(c, a, b) _tile_dpbsud(c, a, b)
#define FA_TILE_DPBUSD(c, a, b) _tile_dpbusd(c, a, b)
#define FA_TILE_DPBUUD(c, a, b) _tile_dpbuud(c, a, b)
#define FA_AMX_FN(name) fa_amx_##name
#else
#define FA_TILE_CONFIG(cfg) fa_tm_loadconfig(cfg)
#define FA_TILE_STORECONFIG(cfg) fa_tm_storeconfig(cfg)
#define FA_TILE_RELEASE() fa_tm_release()
#define FA_TILE_ZERO(t) fa_tm_zero(t)
#define FA_TILE_LOAD(t, base, stride) fa_tm_loadd(t, base, (size_t)(stride))
#define FA_TILE_STORE(t, base, stride) fa_tm_stored(t, base, (size_t)(stride))
#define FA_TILE_DPBF16(c, a, b) fa_tm_dpbf16ps(c, a, b)
#define FA_TILE_DPBSSD(c, a, b) fa_tm_dpbssd(c, a, b)
#define FA_TILE_DPBSUD(c, a, b) fa_tm_dpbsud(c, a, b)
#define FA_TILE_DPBUSD(c, a, b) fa_tm_dpbusd(c, a, b)
#define FA_TILE_DPBUUD(c, a, b) fa_tm_dpbuud(c, a, b)
#define FA_AMX_FN(name) fa_amxm_##name
#endif

#endif
