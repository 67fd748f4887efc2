/*
 * cpu.h: what the CPU can do, detected once, and the choice of micro-kernel
 * table made from it (or forced with FLASHATTN_ARCH).
 */
#ifndef FA_CPU_H
#define FA_CPU_H

#include "flashattn.h"
#include "kernels/kernels.h"

#include <stddef.h>

struct fa_cpu {
    /* x86: each flag means the instructions exist AND the OS saves their registers. */
    unsigned sse2 : 1, avx : 1, avx2 : 1, fma : 1, f16c : 1;
    unsigned avx512f : 1, avx512dq : 1, avx512bw : 1, avx512vl : 1, avx512bf16 : 1, avx512fp16 : 1;
    /* vdpbf16ps does more FLOPs per cycle than fp32 FMA: AMD Zen 4/5 issue it at the
     * FMA rate (2 FLOPs per pair); Intel through Emerald Rapids at half the rate
     * (measured on this project's machine: 89 vs 179 GFLOP/s per core). */
    unsigned bf16_dot_fast : 1;
    /* aarch64 */
    unsigned neon : 1, asimdhp : 1, bf16 : 1;
};

/* Detected on first use, then constant. */
const fa_cpu *fa_cpu_get(void);

/* The CPU model that keys tuned tiles (src/tune.c): x86 the CPUID brand string,
 * aarch64 MIDR_EL1 as the kernel shows it ("0x...."), else "unknown"; blanks
 * trimmed and runs of them made one space. Detected once, then constant. */
const char *fa_cpu_model(void);

/* Picks the best table this CPU runs, or the one FLASHATTN_ARCH names. On
 * failure writes why into msg and returns FA_ERR_ISA_UNAVAILABLE. */
fa_status fa_kernels_select(const fa_kernels **out, char *msg, size_t msg_size);

#endif
