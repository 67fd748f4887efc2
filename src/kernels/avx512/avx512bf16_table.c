/*
 * avx512bf16_table.c: the "avx512bf16" table: avx512's, plus the native bf16
 * pair kernels of avx512bf16_kernels.c (vdpbf16ps) and the int8 decode kernels of
 * avx512vnni_kernels.c (vpdpbusd). Built without the ISA's
 * flags, as the registry builds every table on any x86 CPU.
 */
#include "avx512_kernels.h"
#include "../cpu_features.h"

FA_KERNELS_ISA(avx512);
FA_KERNELS_ISA(avx512bf16);

/* AVX512_BF16 (CPUID 7.1 EAX bit 5) and AVX512_VNNI (7.0 ECX bit 11; every CPU with the
 * first has the second); avx512's predicate covers the rest. */
int fa_kernels_runs_avx512bf16(const fa_cpu *c, const char **why)
{
    if (fa_cpu_os_zmm(c) && fa_cpu_bit(c->leaf7s1_eax, 5) && !fa_cpu_bit(c->leaf7_ecx, 11))
        *why = "this CPU has AVX512_BF16 but no AVX512_VNNI (CPUID 7.0 ECX bit 11)";
    return fa_cpu_os_zmm(c) && fa_cpu_bit(c->leaf7s1_eax, 5) && fa_cpu_bit(c->leaf7_ecx, 11);
}

void fa_kernels_init_avx512bf16(fa_kernels *k)
{
    fa_kernels_init_avx512(k);
    k->name = "avx512bf16";
    k->parent = "avx512";
    k->flags |= FA_KERNELS_BF16_DOT | FA_KERNELS_I8_DOT | FA_KERNELS_QK_I8;
    k->pack_qt_bf16 = fa_avx512bf16_pack_qt;
    k->qk_bf16 = fa_avx512bf16_qk_64x6;
    k->pack_pairs_bf16 = fa_avx512bf16_pack_pairs;
    k->pv_bf16 = fa_avx512bf16_pv_6x64;
    k->stx_bf16 = fa_avx512bf16_stx_6x64;
    k->probe_bf16 = fa_avx512bf16_probe;
    k->qk_small_i8 = fa_avx512vnni_qk_small_i8;
    k->pv_small_i8 = fa_avx512vnni_pv_small_i8;
    k->quant_row_i8 = fa_avx512vnni_quant_row_i8;
    k->qk_i8 = fa_avx512vnni_qk_i8_64x6;
}
