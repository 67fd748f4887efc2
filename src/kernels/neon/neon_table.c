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
    fa_kernels_init_ref(k);
    k->name = "neon";
    k->parent = "ref";
    k->flags |= FA_KERNELS_SMALL_ROWS;
    k->flags &= ~(unsigned)FA_KERNELS_I8_DOT; /* the reference's scalar int8 kernels: never worth choosing */
    k->qk_block = (fa_kernel_block){16, 4};
    k->pv_block = (fa_kernel_block){12, 8};
    k->pack_qt = fa_neon_pack_qt;
    k->qk = fa_neon_qk_16x4;
    k->softmax = fa_neon_softmax;
    k->pv = fa_neon_pv_12x8;
    k->ds = fa_neon_ds;
    k->stx = fa_neon_stx_8x8;
    k->f16_to_f32 = fa_neon_f16_to_f32;
    k->bf16_to_f32 = fa_neon_bf16_to_f32;
    k->qk_small = fa_neon_qk_small;
    k->softmax_small = fa_neon_softmax_small;
    k->pv_small = fa_neon_pv_small;
    k->probe_fma = fa_neon_probe_fma;
}
