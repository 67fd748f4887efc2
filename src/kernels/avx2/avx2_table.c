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
    FA_KERNELS_VECTOR(k, avx2, ref, 16, 6, 3, 32, stx_3x32, 1);
}
