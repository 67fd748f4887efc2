/*
 * avx2_table.c: the "avx2" table: the reference's, with every fp32 kernel
 * replaced by avx2_kernels.c's (the bf16 pair kernels stay the reference's:
 * AVX2 has no bf16 dot product). Built without the ISA's flags, as the
 * registry builds every table on any x86 CPU.
 */
#include "avx2_kernels.h"
#include "../cpu_features.h"

FA_KERNELS_ISA(avx2);

/* AVX2 with FMA and F16C (and the OS's YMM state). */
int fa_kernels_runs_avx2(const fa_cpu *c, const char **why)
{
    (void)why;
    return fa_cpu_avx_fma_f16c(c) && fa_cpu_bit(c->leaf7_ebx, 5);
}

void fa_kernels_init_avx2(fa_kernels *k)
{
    fa_kernels_init_ref(k);
    k->name = "avx2";
    k->parent = "ref";
    k->flags |= FA_KERNELS_SMALL_ROWS;
    k->flags &= ~(unsigned)FA_KERNELS_I8_DOT; /* the reference's scalar int8 kernels: never worth choosing */
    k->qk_block = (fa_kernel_block){16, 6};
    k->pv_block = (fa_kernel_block){3, 32};
    k->pack_qt = fa_avx2_pack_qt;
    k->qk = fa_avx2_qk_16x6;
    k->softmax = fa_avx2_softmax;
    k->pv = fa_avx2_pv_3x32;
    k->ds = fa_avx2_ds;
    k->stx = fa_avx2_stx_3x32;
    k->f16_to_f32 = fa_avx2_f16_to_f32;
    k->bf16_to_f32 = fa_avx2_bf16_to_f32;
    k->f32_to_f16 = fa_avx2_f32_to_f16;
    k->f32_to_bf16 = fa_avx2_f32_to_bf16;
    k->qk_small = fa_avx2_qk_small;
    k->softmax_small = fa_avx2_softmax_small;
    k->pv_small = fa_avx2_pv_small;
    k->probe_fma = fa_avx2_probe_fma;
}
