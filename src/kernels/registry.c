/*
 * registry.c: every micro-kernel table built into this library, best first,
 * each with its run-time predicate (fa_kernels_runs_<isa>, in the ISA's own
 * directory: the features the table adds to its parent's). The tables are built
 * once, on first use, by their init functions (each starts from its parent's
 * table, see kernels.h); a table runs on a CPU when its own predicate and its
 * parent's hold. A new ISA adds one FA_ISA_ROW line here (guarded by the macro its
 * CMake rule defines) and nothing else in the core. The default choice is the first
 * table that runs and is not FA_KERNELS_EXPLICIT (a model, chosen only by name).
 */
#include "cpu_features.h"
#include "kernels.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    void (*init)(fa_kernels *k);                          /* NULL: the root, fa_kernels_ref itself */
    int (*runs)(const struct fa_cpu *cpu, const char **why); /* the features this table adds to its parent's */
} fa_kernel_row;

static int runs_ref(const struct fa_cpu *cpu, const char **why) { (void)cpu, (void)why; return 1; }

/* One row per table: declares the ISA's two functions (kernels.h) and lists them. */
#define FA_ISA_ROW(isa) {fa_kernels_init_##isa, fa_kernels_runs_##isa}
#if defined(FA_BUILD_AMX)
FA_KERNELS_ISA(amx);
#endif
#if defined(FA_BUILD_AVX512BF16)
FA_KERNELS_ISA(avx512bf16);
#endif
#if defined(FA_BUILD_AVX512)
FA_KERNELS_ISA(avx512);
#endif
#if defined(FA_BUILD_AVX2VNNI)
FA_KERNELS_ISA(avx2vnni);
#endif
#if defined(FA_BUILD_AVX2)
FA_KERNELS_ISA(avx2);
#endif
#if defined(FA_BUILD_NEON)
FA_KERNELS_ISA(neon);
#endif
#if defined(FA_BUILD_AMX_MODEL)
FA_KERNELS_ISA(amx_model);
#endif

static const fa_kernel_row g_rows[] = {
#if defined(FA_BUILD_AMX)
    FA_ISA_ROW(amx),
#endif
#if defined(FA_BUILD_AVX512BF16)
    FA_ISA_ROW(avx512bf16),
#endif
#if defined(FA_BUILD_AVX512)
    FA_ISA_ROW(avx512),
#endif
#if defined(FA_BUILD_AVX2VNNI)
    FA_ISA_ROW(avx2vnni),
#endif
#if defined(FA_BUILD_AVX2)
    FA_ISA_ROW(avx2),
#endif
#if defined(FA_BUILD_NEON)
    FA_ISA_ROW(neon),
#endif
#if defined(FA_BUILD_AMX_MODEL)
    FA_ISA_ROW(amx_model),
#endif
    {NULL, runs_ref},
};

#define FA_N_ROWS ((int)(sizeof g_rows / sizeof g_rows[0]))

static fa_kernels g_built[FA_N_ROWS];       /* the tables the init functions fill */
static const fa_kernels *g_table[FA_N_ROWS]; /* row i's table: g_built[i], or fa_kernels_ref */
static int g_runs[FA_N_ROWS];                /* whether this CPU runs row i */
static char g_why[FA_N_ROWS][160];           /* if not, why not */
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
        int parent_runs = g_table[i]->parent == NULL, parent = -1;
        for (int j = i + 1; j < FA_N_ROWS && !parent_runs && parent < 0; j++)
            if (strcmp(g_table[j]->name, g_table[i]->parent) == 0) parent_runs = g_runs[parent = j];
        const char *why = NULL;
        if (!parent_runs) {
            /* A chain of parents' reasons may not fit: its cut tail is the least telling part. */
            if (snprintf(g_why[i], sizeof g_why[i], "its parent table %s does not run here%s%s", g_table[i]->parent,
                         parent >= 0 && g_why[parent][0] ? ": " : "", parent >= 0 ? g_why[parent] : "") < 0)
                g_why[i][0] = '\0';
            continue;
        }
        g_runs[i] = g_rows[i].runs(cpu, &why);
        if (!g_runs[i])
            snprintf(g_why[i], sizeof g_why[i], "%s", why ? why : "this CPU lacks the instructions it needs");
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
                snprintf(msg, msg_size, "FLASHATTN_ARCH=%s: %s (CPU has: %s)", want, g_why[i], fa_cpu_features());
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
        if (g_runs[i] && !(g_table[i]->flags & FA_KERNELS_EXPLICIT)) {
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

const char *fa_kernels_why_not(int index)
{
    if (index < 0 || index >= FA_N_ROWS) return NULL;
    build();
    return g_why[index];
}
