/*
 * amx_table.c: the two tables of amx_kernels.c, and when each runs. Built without
 * the ISA's flags, as the registry builds every table on any x86 CPU.
 *
 *   "amx"        avx512bf16's table with the bf16 products (qk_bf16, pv_bf16, stx_bf16)
 *                and the fused forward (fwd_bf16) on the tile unit (amx_hw.c); the softmax,
 *                conversions, packing and the small-row (decode) path stay avx512bf16's
 *                vector kernels, where tiles would be mostly padding.
 *   "amx-model"  the reference's table with the same kernels on the software model of
 *                the tiles (amx_model.c): runs on any x86-64, never chosen by itself,
 *                only by FLASHATTN_ARCH=amx-model (the test suites run it everywhere).
 *
 * AMX runs when CPUID says AMX-TILE and AMX-BF16, the OS enables the tile state
 * (XCR0 bits 17 and 18), and on Linux the kernel grants this process the tile data
 * (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked once: without it the
 * first tile load faults).
 */
#if defined(__linux__)
#define _DEFAULT_SOURCE 1 /* syscall(): the build's _POSIX_C_SOURCE would hide it */
#endif
#include "../cpu_features.h"
#include "../kernels.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#if defined(__linux__)
#include <errno.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* The entry points of one build of amx_kernels.c (FA_AMX_FN: fa_amx_ or fa_amxm_). */
#define FA_AMX_DECLARE(p)                                                                                          \
    void p##thread_begin(void);                                                                                  \
    void p##thread_end(void);                                                                                    \
    double p##probe_tile(int64_t iters);                                                                         \
    void p##qk_bf16(int64_t rows, int64_t cols, int64_t d, const uint16_t *qt2, int64_t ldqt2, const uint16_t *k, \
                    int64_t ldk, float scale, float *st, int64_t ldst);                                         \
    void p##pv_bf16(int64_t rows, int64_t cols, int64_t dv, const float *st, int64_t ldst, const uint32_t *vp,    \
                    int64_t ldvp, const float *alpha, float *acc, int64_t ldacc, void *scratch);                 \
    void p##stx_bf16(int64_t rows, int64_t cols, int64_t n, const float *st, int64_t ldst, const uint16_t *x,     \
                     int64_t ldx, float *acc, int64_t ldacc, void *scratch);                                  \
    void p##fwd_bf16(const fa_fwd_tile *t);                                                                      \
    void p##fwd_i8(const fa_fwd_tile *t);                                                                        \
    void p##bwd_bf16(const fa_bwd_tile *t)

/* What every tile table sets: blocks of 32 x 32 (two tiles each way), the kernels. */
#define FA_AMX_FILL(k, p)                                                                                          \
    do {                                                                                                         \
        (k)->flags |= FA_KERNELS_BF16_DOT | FA_KERNELS_BF16_DOT_FAST | FA_KERNELS_TILES | FA_KERNELS_FWD_BF16 |    \
                      FA_KERNELS_BWD_BF16 | FA_KERNELS_FWD_I8;                                                    \
        /* int8 products take the fused forward's route (fwd_i8), not the vector qk_i8's */                    \
        (k)->flags &= ~(unsigned)FA_KERNELS_QK_I8;                                                                \
        (k)->row_align = FA_ROW_ALIGN;                                                                           \
        (k)->qk_block = (fa_kernel_block){32, 32};                                                               \
        (k)->pv_block = (fa_kernel_block){32, 32};                                                               \
        (k)->qk_bf16 = p##qk_bf16;                                                                               \
        (k)->pv_bf16 = p##pv_bf16;                                                                               \
        (k)->stx_bf16 = p##stx_bf16;                                                                             \
        (k)->fwd_bf16 = p##fwd_bf16;                                                                             \
        (k)->fwd_i8 = p##fwd_i8;                                                                                 \
        (k)->bwd_bf16 = p##bwd_bf16;                                                                             \
        (k)->probe_tile = p##probe_tile;                                                                         \
        (k)->thread_begin = p##thread_begin;                                                                     \
        (k)->thread_end = p##thread_end;                                                                         \
    } while (0)

#if defined(FA_BUILD_AMX)
FA_KERNELS_ISA(avx512bf16);
FA_KERNELS_ISA(amx);
FA_AMX_DECLARE(fa_amx_);
void fa_amx_pack_kt_bf16(int64_t cols, int64_t d, const uint16_t *k, int64_t ldk, uint32_t *kt, int64_t j0);
void fa_amx_pack_t_bf16(int64_t rows, int64_t len, const uint16_t *src, int64_t ld, uint16_t *dst, int64_t lddst);

static const char *g_refusal; /* why the OS refused the tile data; NULL when granted */
static pthread_once_t g_perm_once = PTHREAD_ONCE_INIT;

static void request_tiles(void)
{
#if defined(__linux__) && defined(SYS_arch_prctl)
    enum { ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    static char why[128];
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        snprintf(why, sizeof why, "Linux refused the AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM: %s)",
                 strerror(errno));
        g_refusal = why;
        return;
    }
    unsigned long granted = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &granted) != 0 || !((granted >> XFEATURE_XTILEDATA) & 1))
        g_refusal = "Linux did not grant the AMX tile data (ARCH_GET_XCOMP_PERM)";
#endif
}

int fa_kernels_runs_amx(const fa_cpu *c, const char **why)
{
    if (!fa_cpu_bit(c->leaf7_edx, 24) || !fa_cpu_bit(c->leaf7_edx, 22)) {
        *why = "this CPU has no AMX-TILE and AMX-BF16 (CPUID 7.0 EDX bits 24, 22)";
        return 0;
    }
    if (!fa_cpu_bit(c->xcr0, 17) || !fa_cpu_bit(c->xcr0, 18)) {
        *why = "the OS does not enable the AMX tile state (XCR0 bits 17, 18)";
        return 0;
    }
    pthread_once(&g_perm_once, request_tiles);
    if (g_refusal) {
        *why = g_refusal;
        return 0;
    }
    return 1;
}

void fa_kernels_init_amx(fa_kernels *k)
{
    fa_kernels_init_avx512bf16(k);
    k->name = "amx";
    k->parent = "avx512bf16";
    FA_AMX_FILL(k, fa_amx_);
    k->pack_kt_bf16 = fa_amx_pack_kt_bf16; /* AVX-512 transposes; the model keeps the reference's */
    k->pack_t_bf16 = fa_amx_pack_t_bf16;
}
#endif

#if defined(FA_BUILD_AMX_MODEL)
FA_KERNELS_ISA(amx_model);
FA_AMX_DECLARE(fa_amxm_);

/* Plain C: every CPU of the architecture. */
int fa_kernels_runs_amx_model(const fa_cpu *c, const char **why)
{
    (void)c, (void)why;
    return 1;
}

void fa_kernels_init_amx_model(fa_kernels *k)
{
    fa_kernels_init_ref(k);
    k->name = "amx-model";
    k->parent = "ref";
    FA_AMX_FILL(k, fa_amxm_);
    k->flags |= FA_KERNELS_EXPLICIT;
}
#endif
