/*
 * avx2vnni_table.c: the "avx2vnni" table: avx2's, plus the int8 decode kernels of
 * avx2vnni_kernels.c (AVX-VNNI's vpdpbusd, VEX form), for CPUs that have AVX2 and
 * AVX-VNNI but no AVX-512 (Intel client chips since Alder Lake). Built without the ISA's
 * flags, as the registry builds every table on any x86 CPU.
 */
#include "avx2_kernels.h"
#include "../cpu_features.h"

FA_KERNELS_ISA(avx2);
FA_KERNELS_ISA(avx2vnni);

/* AVX-VNNI: CPUID 7.1 EAX bit 4 (avx2's predicate covers the rest). */
int fa_kernels_runs_avx2vnni(const fa_cpu *c, const char **why)
{
    if (!fa_cpu_bit(c->leaf7s1_eax, 4)) {
        *why = "this CPU has no AVX-VNNI (CPUID 7.1 EAX bit 4)";
        return 0;
    }
    return 1;
}

void fa_kernels_init_avx2vnni(fa_kernels *k)
{
    fa_kernels_init_avx2(k);
    k->name = "avx2vnni";
    k->parent = "avx2";
    k->flags |= FA_KERNELS_I8_DOT;
    k->qk_small_i8 = fa_avx2vnni_qk_small_i8;
    k->pv_small_i8 = fa_avx2vnni_pv_small_i8;
}
