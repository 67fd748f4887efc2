/*
 * cpu.c: CPU feature detection. x86 asks CPUID for the instructions and XGETBV
 * for whether the OS saves the wider registers (an AVX-512 CPU under an OS that
 * does not save ZMM state must not run AVX-512 code). aarch64 asks the kernel's
 * hwcaps on Linux, and sysctl on macOS. Detection runs once; the result never
 * changes. The model name (for the tune file's key) comes from the CPUID brand
 * string, the kernel's MIDR, or sysctl's machdep.cpu.brand_string.
 */
#if defined(__APPLE__)
/* sysctlbyname is not POSIX: the build's _POSIX_C_SOURCE would hide it. */
#define _DARWIN_C_SOURCE 1
#endif
#include "cpu.h"
#include "flashattn.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect(fa_cpu *c)
{
    unsigned a, b, cx, d;
    if (!__get_cpuid(1, &a, &b, &cx, &d)) return;
    c->sse2 = (d >> 26) & 1;
    int osxsave = (cx >> 27) & 1;
    uint64_t xcr0 = osxsave ? read_xcr0() : 0;
    int ymm_ok = (xcr0 & 0x6) == 0x6;      /* XMM and YMM state */
    int zmm_ok = ymm_ok && (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM_Hi256, Hi16_ZMM */
    c->avx = ymm_ok && ((cx >> 28) & 1);
    c->fma = c->avx && ((cx >> 12) & 1);
    c->f16c = c->avx && ((cx >> 29) & 1);
    if (__get_cpuid_max(0, NULL) < 7) return;
    __cpuid_count(7, 0, a, b, cx, d);
    c->avx2 = c->avx && ((b >> 5) & 1);
    c->avx512f = zmm_ok && ((b >> 16) & 1);
    c->avx512dq = c->avx512f && ((b >> 17) & 1);
    c->avx512bw = c->avx512f && ((b >> 30) & 1);
    c->avx512vl = c->avx512f && ((b >> 31) & 1);
    c->avx512fp16 = c->avx512f && ((d >> 23) & 1);
    __cpuid_count(7, 1, a, b, cx, d);
    c->avx512bf16 = c->avx512f && ((a >> 5) & 1);
    unsigned vendor[3];
    __cpuid(0, a, vendor[0], vendor[2], vendor[1]);
    c->bf16_dot_fast = c->avx512bf16 && memcmp(vendor, "AuthenticAMD", 12) == 0;
}

static void read_model(char *buf, size_t n)
{
    unsigned r[12] = {0};
    if ((unsigned)__get_cpuid_max(0x80000000u, NULL) < 0x80000004u) return;
    for (unsigned k = 0; k < 3; k++)
        __cpuid(0x80000002u + k, r[4 * k], r[4 * k + 1], r[4 * k + 2], r[4 * k + 3]);
    size_t len = sizeof r < n - 1 ? sizeof r : n - 1;
    memcpy(buf, r, len);
    buf[len] = '\0';
}
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
#ifndef HWCAP_ASIMDHP
#define HWCAP_ASIMDHP (1 << 10)
#endif
#ifndef HWCAP2_BF16
#define HWCAP2_BF16 (1 << 14)
#endif
static void detect(fa_cpu *c)
{
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    c->neon = (hw & HWCAP_ASIMD) != 0;
    c->asimdhp = (hw & HWCAP_ASIMDHP) != 0;
    c->bf16 = (hw2 & HWCAP2_BF16) != 0;
}

static void read_model(char *buf, size_t n)
{
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/regs/identification/midr_el1", "r");
    if (!f) return;
    if (!fgets(buf, (int)n, f)) buf[0] = '\0';
    fclose(f);
}
#elif (defined(__aarch64__) || defined(__arm64__)) && defined(__APPLE__)
#include <sys/sysctl.h>
/* A hw.optional flag: 1 when the key exists and is non-zero (older macOS lacks the FEAT_ keys). */
static int sysctl_flag(const char *name)
{
    int v = 0;
    size_t len = sizeof v;
    return sysctlbyname(name, &v, &len, NULL, 0) == 0 && v != 0;
}
static void detect(fa_cpu *c)
{
    c->neon = 1; /* Advanced SIMD is architecturally present on every arm64 Mac */
    c->asimdhp = sysctl_flag("hw.optional.arm.FEAT_FP16") || sysctl_flag("hw.optional.neon_fp16");
    c->bf16 = sysctl_flag("hw.optional.arm.FEAT_BF16");
}

static void read_model(char *buf, size_t n)
{
    size_t len = n;
    if (sysctlbyname("machdep.cpu.brand_string", buf, &len, NULL, 0) != 0) buf[0] = '\0';
    buf[n - 1] = '\0';
}
#else
static void detect(fa_cpu *c) { (void)c; }
static void read_model(char *buf, size_t n) { (void)buf; (void)n; }
#endif

static fa_cpu g_cpu;
static char g_features[160];
static char g_model[64];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* g_model as fa_cpu_model() promises: printable, blanks trimmed and collapsed. */
static void normalise_model(void)
{
    char raw[sizeof g_model];
    memcpy(raw, g_model, sizeof raw);
    raw[sizeof raw - 1] = '\0';
    size_t len = 0;
    for (const char *c = raw; *c; c++) {
        const int blank = *c == ' ' || *c == '\t' || *c == '\n' || *c == '\r';
        if (blank) {
            if (len > 0 && g_model[len - 1] != ' ') g_model[len++] = ' ';
        } else {
            g_model[len++] = *c > ' ' && *c < 127 ? *c : '?';
        }
    }
    while (len > 0 && g_model[len - 1] == ' ') len--;
    g_model[len] = '\0';
    if (len == 0) snprintf(g_model, sizeof g_model, "unknown");
}

static void detect_once(void)
{
    detect(&g_cpu);
    read_model(g_model, sizeof g_model);
    normalise_model();
    struct { unsigned on; const char *name; } list[] = {
        {g_cpu.sse2, "sse2"}, {g_cpu.avx, "avx"}, {g_cpu.avx2, "avx2"}, {g_cpu.fma, "fma"},
        {g_cpu.f16c, "f16c"}, {g_cpu.avx512f, "avx512f"}, {g_cpu.avx512dq, "avx512dq"}, {g_cpu.avx512bw, "avx512bw"},
        {g_cpu.avx512vl, "avx512vl"}, {g_cpu.avx512bf16, "avx512bf16"},
        {g_cpu.avx512fp16, "avx512fp16"}, {g_cpu.neon, "neon"}, {g_cpu.asimdhp, "asimdhp"},
        {g_cpu.bf16, "bf16"},
    };
    size_t len = 0;
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) {
        if (!list[i].on) continue;
        int n = snprintf(g_features + len, sizeof g_features - len, "%s%s", len ? " " : "", list[i].name);
        if (n < 0 || (size_t)n >= sizeof g_features - len) break;
        len += (size_t)n;
    }
}

const fa_cpu *fa_cpu_get(void)
{
    pthread_once(&g_once, detect_once);
    return &g_cpu;
}

const char *fa_cpu_model(void)
{
    fa_cpu_get();
    return g_model;
}

const char *fa_cpu_features(void)
{
    fa_cpu_get();
    return g_features;
}
