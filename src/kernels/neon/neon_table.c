/*
 * neon_table.c: the "neon" table: the reference's, with every fp32 kernel
 * replaced by neon_kernels.c's (base ARMv8-A has no bf16 dot product, so the
 * bf16 pair kernels stay the reference's). Kept apart from the kernels like
 * every ISA's table, although NEON needs no extra flags.
 */
#include "neon_kernels.h"
#include "../cpu_features.h"

FA_KERNELS_ISA(neon);

#ifndef FA_HWCAP_ASIMD
#define FA_HWCAP_ASIMD (1u << 1) /* Linux's HWCAP_ASIMD (cpu.c gives macOS's answer in this form) */
#endif

/* Advanced SIMD. */
int fa_kernels_runs_neon(const fa_cpu *c, const char **why)
{
    (void)why;
    return (c->hwcap & FA_HWCAP_ASIMD) != 0;
}

void fa_kernels_init_neon(fa_kernels *k)
{
    FA_KERNELS_VECTOR(k, neon, ref, 16, 4, 12, 8, stx_8x8, 0);
}
