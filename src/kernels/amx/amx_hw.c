/*
 * amx_hw.c: amx_kernels.c on the hardware tile unit (the "amx" table). Its own file
 * because CMake compiles a source once per target: this one gets -DFA_AMX_HW and the
 * AMX and AVX-512 flags, amx_kernels.c itself none (the "amx-model" table).
 */
#define FA_AMX_HW 1
#include "amx_kernels.c"
