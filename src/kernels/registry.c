/*
 * registry.c: every micro-kernel table built into this library, best first,
 * each with the CPU features it adds to its parent's. The tables are built
 * once, on first use, by their init functions (each starts from its parent's
 * table, see kernels.h); a table runs on a CPU when its own features and its
 * parent's are there. A new ISA adds one row here (guarded by the macro its
 * CMake rule defines) and nothing else in the core.
 */
#include "cpu_features.h"
#include "kernels.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    void (*init)(fa_kernels *k);       /* NULL: the root, fa_kernels_ref itself */
    int (*needs)(const fa_cpu *cpu); /* the features this table adds to its parent's */
} fa_kernel_row;

static int needs_nothing(const fa_cpu *cpu) { (void)cpu; return 1; }
#if defined(FA_BUILD_AVX512)
static int needs_avx512(const fa_cpu *c)
{
    return c->avx512f && c->avx512dq && c->avx512bw && c->avx512vl && c->fma && c->f16c;
}
#endif
#if defined(FA_BUILD_AVX512BF16)
static int needs_avx512bf16(const fa_cpu *c) { return c->avx512bf16; }
#endif
#if defined(FA_BUILD_AVX2)
static int needs_avx2(const fa_cpu *c) { return c->avx2 && c->fma && c->f16c; }
#endif
#if defined(FA_BUILD_NEON)
static int needs_neon(const fa_cpu *c) { return c->neon; }
#endif

static const fa_kernel_row g_rows[] = {
#if defined(FA_BUILD_AVX512BF16)
    {fa_kernels_init_avx512bf16, needs_avx512bf16},
#endif
#if defined(FA_BUILD_AVX512)
    {fa_kernels_init_avx512, needs_avx512},
#endif
#if defined(FA_BUILD_AVX2)
    {fa_kernels_init_avx2, needs_avx2},
#endif
#if defined(FA_BUILD_NEON)
    {fa_kernels_init_neon, needs_neon},
#endif
    {NULL, needs_nothing},
};

#define FA_N_ROWS ((int)(sizeof g_rows / sizeof g_rows[0]))

static fa_kernels g_built[FA_N_ROWS];       /* the tables the init functions fill */
static const fa_kernels *g_table[FA_N_ROWS]; /* row i's table: g_built[i], or fa_kernels_ref */
static int g_runs[FA_N_ROWS];                /* whether this CPU runs row i */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void build_once(void)
{
    const fa_cpu *cpu = fa_cpu_get();
    for (int i = 0; i < FA_N_ROWS; i++) {
        if (g_rows[i].init) {
            g_rows[i].init(&g_built[i]);
            g_table[i] = &g_built[i];
        } else {
            g_table[i] = &fa_kernels_ref;
        }
    }
    /* Best first puts every parent after its children: settle the rows from the end. */
    for (int i = FA_N_ROWS - 1; i >= 0; i--) {
        int parent_runs = g_table[i]->parent == NULL;
        for (int j = i + 1; j < FA_N_ROWS && !parent_runs; j++)
            if (strcmp(g_table[j]->name, g_table[i]->parent) == 0) parent_runs = g_runs[j];
        g_runs[i] = parent_runs && g_rows[i].needs(cpu);
    }
}

static void build(void) { pthread_once(&g_once, build_once); }

fa_status fa_kernels_select(const fa_kernels **out, char *msg, size_t msg_size)
{
    build();
    const char *want = getenv("FLASHATTN_ARCH");
    if (want && *want) {
        for (int i = 0; i < FA_N_ROWS; i++) {
            if (strcmp(want, g_table[i]->name) != 0) continue;
            if (!g_runs[i]) {
                snprintf(msg, msg_size, "FLASHATTN_ARCH=%s: this CPU lacks the instructions it needs (has: %s)",
                         want, fa_cpu_features());
                return FA_ERR_ISA_UNAVAILABLE;
            }
            *out = g_table[i];
            return FA_OK;
        }
        size_t len = (size_t)snprintf(msg, msg_size, "FLASHATTN_ARCH=%s is not a path this build has; known:", want);
        for (int i = 0; i < FA_N_ROWS && len < msg_size; i++)
            len += (size_t)snprintf(msg + len, msg_size - len, " %s", g_table[i]->name);
        return FA_ERR_ISA_UNAVAILABLE;
    }
    for (int i = 0; i < FA_N_ROWS; i++) {
        if (g_runs[i]) {
            *out = g_table[i];
            return FA_OK;
        }
    }
    snprintf(msg, msg_size, "no micro-kernel table runs on this CPU");
    return FA_ERR_ISA_UNAVAILABLE;
}

int fa_kernels_count(void) { return FA_N_ROWS; }

const fa_kernels *fa_kernels_at(int index, int *runs_here)
{
    if (index < 0 || index >= FA_N_ROWS) return NULL;
    build();
    if (runs_here) *runs_here = g_runs[index];
    return g_table[index];
}
