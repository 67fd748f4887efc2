/*
 * cpu.h: what the CPU can do (the fa_cpu struct lives in the kernels' leaf
 * header, which the registry reads), detected once by cpu.c, and the choice of
 * micro-kernel table made from it (fa_kernels_select, in kernels.h).
 */
#ifndef FA_CPU_H
#define FA_CPU_H

#include "kernels/cpu_features.h"
#include "kernels/kernels.h"

/* fa_cpu_model() and fa_cpu_features() are public (flashattn.h). */

#endif
