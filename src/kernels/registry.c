/*
 * registry.c: every micro-kernel table built into this library, best first,
 * each with the CPU features it needs. A new ISA adds one row here (guarded by
 * the macro its CMake rule defines) and nothing else in the core.
 */
#include "../cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const fa_kernels *table;
    int (*runs_on)(const fa_cpu *cpu);
} fa_kernel_entry;

static int always(const fa_cpu *cpu) { (void)cpu; return 1; }
#if defined(FA_BUILD_AVX512)
static int has_avx512(const fa_cpu *c) { return c->avx512f && c->avx512dq && c->avx512bw && c->avx512vl && c->fma && c->f16c; }
#endif
#if defined(FA_BUILD_AVX512BF16)
static int has_avx512bf16(const fa_cpu *c) { return has_avx512(c) && c->avx512bf16; }
#endif
#if defined(FA_BUILD_AVX2)
static int has_avx2(const fa_cpu *c) { return c->avx2 && c->fma && c->f16c; }
#endif
#if defined(FA_BUILD_NEON)
static int has_neon(const fa_cpu *c) { return c->neon; }
#endif

static const fa_kernel_entry g_entries[] = {
#if defined(FA_BUILD_AVX512BF16)
    {&fa_kernels_avx512bf16, has_avx512bf16},
#endif
#if defined(FA_BUILD_AVX512)
    {&fa_kernels_avx512, has_avx512},
#endif
#if defined(FA_BUILD_AVX2)
    {&fa_kernels_avx2, has_avx2},
#endif
#if defined(FA_BUILD_NEON)
    {&fa_kernels_neon, has_neon},
#endif
    {&fa_kernels_ref, always},
};

#define FA_N_ENTRIES (sizeof g_entries / sizeof g_entries[0])

fa_status fa_kernels_select(const fa_kernels **out, char *msg, size_t msg_size)
{
    const fa_cpu *cpu = fa_cpu_get();
    const char *want = getenv("FLASHATTN_ARCH");
    if (want && *want) {
        for (size_t i = 0; i < FA_N_ENTRIES; i++) {
            if (strcmp(want, g_entries[i].table->name) != 0) continue;
            if (!g_entries[i].runs_on(cpu)) {
                snprintf(msg, msg_size, "FLASHATTN_ARCH=%s: this CPU lacks the instructions it needs (has: %s)",
                         want, fa_cpu_features());
                return FA_ERR_ISA_UNAVAILABLE;
            }
            *out = g_entries[i].table;
            return FA_OK;
        }
        size_t len = (size_t)snprintf(msg, msg_size, "FLASHATTN_ARCH=%s is not a path this build has; known:", want);
        for (size_t i = 0; i < FA_N_ENTRIES && len < msg_size; i++)
            len += (size_t)snprintf(msg + len, msg_size - len, " %s", g_entries[i].table->name);
        return FA_ERR_ISA_UNAVAILABLE;
    }
    for (size_t i = 0; i < FA_N_ENTRIES; i++) {
        if (g_entries[i].runs_on(cpu)) {
            *out = g_entries[i].table;
            return FA_OK;
        }
    }
    snprintf(msg, msg_size, "no micro-kernel table runs on this CPU");
    return FA_ERR_ISA_UNAVAILABLE;
}

int fa_kernels_count(void) { return (int)FA_N_ENTRIES; }

const fa_kernels *fa_kernels_at(int index, int *runs_here)
{
    if (index < 0 || index >= (int)FA_N_ENTRIES) return NULL;
    if (runs_here) *runs_here = g_entries[index].runs_on(fa_cpu_get());
    return g_entries[index].table;
}
