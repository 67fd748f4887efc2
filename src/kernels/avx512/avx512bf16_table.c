/*
 * avx512bf16_table.c: the "avx512bf16" table: avx512's, plus the native bf16
 * pair kernels of avx512bf16_kernels.c (vdpbf16ps). Built without the ISA's
 * flags, as the registry builds every table on any x86 CPU.
 */
#include "avx512_kernels.h"
#include "../cpu_features.h"

FA_KERNELS_ISA(avx512);
FA_KERNELS_ISA(avx512bf16);

/* AVX512_BF16 (CPUID 7.1 EAX bit 5); avx512's predicate covers the rest. */
int fa_kernels_runs_avx512bf16(const fa_cpu *c, const char **why)
{
    (void)why;
    return fa_cpu_os_zmm(c) && fa_cpu_bit(c->leaf7s1_eax, 5);
}

void fa_kernels_init_avx512bf16(fa_kernels *k)
{
    fa_kernels_init_avx512(k);
    k->name = "avx512bf16";
    k->parent = "avx512";
    k->flags |= FA_KERNELS_BF16_DOT;
    k->pack_qt_bf16 = fa_avx512bf16_pack_qt;
    k->qk_bf16 = fa_avx512bf16_qk_64x6;
    k->pack_pairs_bf16 = fa_avx512bf16_pack_pairs;
    k->pv_bf16 = fa_avx512bf16_pv_6x64;
    k->stx_bf16 = fa_avx512bf16_stx_6x64;
    k->probe_bf16 = fa_avx512bf16_probe;
}
