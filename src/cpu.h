/*
 * cpu.h: what the CPU can do (the fa_cpu struct lives in the kernels' leaf
 * header, which the registry reads), detected once by cpu.c, and the choice of
 * micro-kernel table made from it (fa_kernels_select, in kernels.h).
 */
#ifndef FA_CPU_H
#define FA_CPU_H

#include "kernels/cpu_features.h"
#include "kernels/kernels.h"

/* The CPU model that keys tuned tiles (src/tune.c): x86 the CPUID brand string,
 * aarch64 MIDR_EL1 as the kernel shows it ("0x...."), macOS the brand string,
 * else "unknown"; blanks trimmed and runs of them made one space. Detected once,
 * then constant. */
const char *fa_cpu_model(void);

#endif
