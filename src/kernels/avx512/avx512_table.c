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
    FA_KERNELS_VECTOR(k, avx512, avx2, 64, 6, 6, 64, stx_6x64, 1);
    k->sum_rows_bf16 = fa_avx512_sum_rows_bf16;
    k->dot_rows_f64 = fa_avx512_dot_rows_f64;
}
