/*
 * amx_hw_probe.h: the real AMX instructions for test_amx_model (amx_hw_probe.c,
 * built only on x86-64 with a compiler that takes -mamx-tile -mamx-bf16 -mamx-int8; then
 * FA_AMX_HW_PROBE is defined).
 */
#ifndef FA_TEST_AMX_HW_PROBE_H
#define FA_TEST_AMX_HW_PROBE_H

#include <stddef.h>

/* 1 when CPUID has AMX-TILE and AMX-BF16, XCR0 bits 17 and 18 are set and Linux
 * grants the tile data permission; otherwise 0. `why` says which. */
int amx_hw_available(char *why, size_t n);

/* 1 when amx_hw_available and CPUID leaf 7 EDX bit 25 (AMX-INT8) is set; `why` says which. */
int amx_hw_int8_available(char *why, size_t n);

/* The AMX-INT8 products, variant 0..3 = tdpbssd, tdpbsud, tdpbusd, tdpbuud, laid out as
 * amx_hw_dpbf16ps's. */
void amx_hw_dpbxxd(int variant, const void *cfg64, void *c, size_t ldc, const void *a, size_t lda, const void *b,
                   size_t ldb);

/* ldtilecfg(cfg64); tmm0 <- C, tmm1 <- A, tmm2 <- B; tdpbf16ps tmm0, tmm1, tmm2;
 * C <- tmm0; tilerelease. */
void amx_hw_dpbf16ps(const void *cfg64, void *c, size_t ldc, const void *a, size_t lda, const void *b,
                     size_t ldb);

/* In a forked child: ldtilecfg(cfg64), then the action on tile 0 (or tdpbf16ps
 * tmm0, tmm1, tmm2), then sttilecfg into stored_cfg64 (may be NULL). Returns 1 when
 * it ran, 0 when the child died of a signal (#GP or #UD), -1 when the probe itself
 * failed. */
enum { AMX_TRY_CONFIG = 0, AMX_TRY_LOAD = 1, AMX_TRY_STORE = 2, AMX_TRY_ZERO = 3, AMX_TRY_DP = 4 };
int amx_hw_try_config(const void *cfg64, int action, void *stored_cfg64);

#endif
