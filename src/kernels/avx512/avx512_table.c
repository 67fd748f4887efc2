/*
 * avx512_table.c: the "avx512" table: avx2's, with every fp32 kernel replaced
 * by avx512_kernels.c's. Built without the ISA's flags, as the registry builds
 * every table on any x86 CPU.
 */
#include "avx512_kernels.h"
#include "../cpu_features.h"

FA_KERNELS_ISA(avx2);
FA_KERNELS_ISA(avx512);

/* AVX-512 F, DQ, BW, VL with the OS's ZMM state, FMA and F16C. */
int fa_kernels_runs_avx512(const fa_cpu *c, const char **why)
{
    (void)why;
    return fa_cpu_os_zmm(c) && fa_cpu_avx_fma_f16c(c) && fa_cpu_bit(c->leaf7_ebx, 16) &&
           fa_cpu_bit(c->leaf7_ebx, 17) && fa_cpu_bit(c->leaf7_ebx, 30) && fa_cpu_bit(c->leaf7_ebx, 31);
}

void fa_kernels_init_avx512(fa_kernels *k)
{
    fa_kernels_init_avx2(k);
    k->name = "avx512";
    k->parent = "avx2";
    k->flags |= FA_KERNELS_SMALL_ROWS;
    k->qk_block = (fa_kernel_block){64, 6};
    k->pv_block = (fa_kernel_block){6, 64};
    k->pack_qt = fa_avx512_pack_qt;
    k->qk = fa_avx512_qk_64x6;
    k->softmax = fa_avx512_softmax;
    k->pv = fa_avx512_pv_6x64;
    k->ds = fa_avx512_ds;
    k->stx = fa_avx512_stx_6x64;
    k->f16_to_f32 = fa_avx512_f16_to_f32;
    k->bf16_to_f32 = fa_avx512_bf16_to_f32;
    k->f32_to_f16 = fa_avx512_f32_to_f16;
    k->f32_to_bf16 = fa_avx512_f32_to_bf16;
    k->qk_small = fa_avx512_qk_small;
    k->softmax_small = fa_avx512_softmax_small;
    k->pv_small = fa_avx512_pv_small;
    k->probe_fma = fa_avx512_probe_fma;
}
