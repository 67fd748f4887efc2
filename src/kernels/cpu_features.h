/*
 * cpu_features.h: what the CPU says about itself, raw, as the tables' run-time
 * predicates need it. A leaf: the core's cpu.c fills the struct (detected once,
 * then constant) and defines fa_cpu_get; each ISA directory reads the bits it
 * needs in its own predicate (fa_kernels_runs_<isa>, next to its table), so a new
 * ISA adds no field here.
 */
#ifndef FA_KERNELS_CPU_FEATURES_H
#define FA_KERNELS_CPU_FEATURES_H

#include <stdint.h>

typedef struct fa_cpu {
    /* x86: CPUID registers (0 where the leaf does not exist) and XCR0 (0 without OSXSAVE) */
    uint32_t leaf1_ecx, leaf1_edx;                 /* leaf 1 */
    uint32_t leaf7_ebx, leaf7_ecx, leaf7_edx;      /* leaf 7, subleaf 0 */
    uint32_t leaf7s1_eax, leaf7s1_edx;             /* leaf 7, subleaf 1 */
    uint64_t xcr0;
    char vendor[13];                               /* "GenuineIntel", "AuthenticAMD", ... */
    /* aarch64: the kernel's AT_HWCAP / AT_HWCAP2 (macOS: the same bits, from sysctl) */
    uint64_t hwcap, hwcap2;
    /* vdpbf16ps does more FLOPs per cycle than fp32 FMA: AMD Zen 4/5 issue it at the
     * FMA rate (2 FLOPs per pair); Intel through Emerald Rapids at half the rate. */
    unsigned bf16_dot_fast : 1;
} fa_cpu;

/* Detected on first use (by cpu.c), then constant. */
const fa_cpu *fa_cpu_get(void);

/* Bit b of a register. */
static inline int fa_cpu_bit(uint64_t reg, int b) { return (int)((reg >> b) & 1u); }

/* x86: the OS saves the YMM state (OSXSAVE and XCR0 bits 1, 2) / also the AVX-512
 * state (XCR0 bits 5..7): an instruction set exists for the tables only then. */
static inline int fa_cpu_os_ymm(const fa_cpu *c) { return fa_cpu_bit(c->leaf1_ecx, 27) && (c->xcr0 & 0x6) == 0x6; }
static inline int fa_cpu_os_zmm(const fa_cpu *c) { return fa_cpu_os_ymm(c) && (c->xcr0 & 0xe0) == 0xe0; }

/* x86: AVX, FMA and F16C with the OS's support: the baseline of every x86 vector table. */
static inline int fa_cpu_avx_fma_f16c(const fa_cpu *c)
{
    return fa_cpu_os_ymm(c) && fa_cpu_bit(c->leaf1_ecx, 28) && fa_cpu_bit(c->leaf1_ecx, 12) &&
           fa_cpu_bit(c->leaf1_ecx, 29);
}

#endif
