/*
 * amx_bwd_hw.c: amx_bwd.c on the hardware tile unit (the "amx" table), its own file
 * for the reason amx_hw.c is: CMake compiles a source once per target.
 */
#define FA_AMX_HW 1
#include "amx_bwd.c"
