/*
 * cpu_features.h: what the CPU can do, as the registry needs it to decide which
 * tables run here. A leaf: the core's cpu.c fills the struct (detected once,
 * then constant) and defines fa_cpu_get; the kernels side only reads it.
 */
#ifndef FA_KERNELS_CPU_FEATURES_H
#define FA_KERNELS_CPU_FEATURES_H

typedef struct fa_cpu {
    /* x86: each flag means the instructions exist AND the OS saves their registers. */
    unsigned sse2 : 1, avx : 1, avx2 : 1, fma : 1, f16c : 1;
    unsigned avx512f : 1, avx512dq : 1, avx512bw : 1, avx512vl : 1, avx512bf16 : 1, avx512fp16 : 1;
    /* vdpbf16ps does more FLOPs per cycle than fp32 FMA: AMD Zen 4/5 issue it at the
     * FMA rate (2 FLOPs per pair); Intel through Emerald Rapids at half the rate
     * (measured on this project's machine: 89 vs 179 GFLOP/s per core). */
    unsigned bf16_dot_fast : 1;
    /* aarch64 */
    unsigned neon : 1, asimdhp : 1, bf16 : 1;
} fa_cpu;

/* Detected on first use (by cpu.c), then constant. */
const fa_cpu *fa_cpu_get(void);

#endif
