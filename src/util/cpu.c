/*
 * cpu.c: CPU feature detection. x86 reads the CPUID leaves the tables need (1, 7.0,
 * 7.1, the vendor) and XCR0 through XGETBV, which says what register state the OS
 * saves (an AVX-512 CPU under an OS that does not save ZMM state must not run
 * AVX-512 code); aarch64 the kernel's hwcaps on Linux, and sysctl on macOS. They
 * are handed to the tables raw: each ISA's predicate (fa_kernels_runs_<isa>, in its
 * directory) decides from them. Detection runs once; the result never changes.
 * The model name (for the tune file's key) comes from the CPUID brand string, the
 * kernel's MIDR, or sysctl's machdep.cpu.brand_string.
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

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif
/* aarch64's hwcap bits (Linux's values; macOS's sysctl answers are put in the same form) */
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
#ifndef HWCAP_ASIMDHP
#define HWCAP_ASIMDHP (1 << 10)
#endif
#ifndef HWCAP2_BF16
#define HWCAP2_BF16 (1 << 14)
#endif

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
    unsigned a, b, cx, d, vendor[3];
    if (!__get_cpuid(1, &a, &b, &cx, &d)) return;
    c->leaf1_ecx = cx;
    c->leaf1_edx = d;
    c->xcr0 = (cx >> 27) & 1 ? read_xcr0() : 0; /* OSXSAVE */
    __cpuid(0, a, vendor[0], vendor[2], vendor[1]);
    memcpy(c->vendor, vendor, 12);
    if (__get_cpuid_max(0, NULL) < 7) return;
    __cpuid_count(7, 0, a, b, cx, d);
    c->leaf7_ebx = b;
    c->leaf7_ecx = cx;
    c->leaf7_edx = d;
    __cpuid_count(7, 1, a, b, cx, d);
    c->leaf7s1_eax = a;
    c->leaf7s1_edx = d;
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
static void detect(fa_cpu *c)
{
    c->hwcap = getauxval(AT_HWCAP);
    c->hwcap2 = getauxval(AT_HWCAP2);
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
/* the Linux hwcap bits, so that the tables read one form */
static void detect(fa_cpu *c)
{
    c->hwcap = HWCAP_ASIMD; /* Advanced SIMD is architecturally present on every arm64 Mac */
    if (sysctl_flag("hw.optional.arm.FEAT_FP16") || sysctl_flag("hw.optional.neon_fp16")) c->hwcap |= HWCAP_ASIMDHP;
    if (sysctl_flag("hw.optional.arm.FEAT_BF16")) c->hwcap2 |= HWCAP2_BF16;
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
    /* the features as the vector tables see them: each only with the OS's support */
    const fa_cpu *c = &g_cpu;
    const int avx = fa_cpu_os_ymm(c) && fa_cpu_bit(c->leaf1_ecx, 28);
    const int avx512f = fa_cpu_os_zmm(c) && fa_cpu_bit(c->leaf7_ebx, 16);
    const int avx512bf16 = avx512f && fa_cpu_bit(c->leaf7s1_eax, 5);
    g_cpu.bf16_dot_fast = avx512bf16 && strcmp(c->vendor, "AuthenticAMD") == 0;
    struct { int on; const char *name; } list[] = {
        {fa_cpu_bit(c->leaf1_edx, 26), "sse2"}, {avx, "avx"}, {avx && fa_cpu_bit(c->leaf7_ebx, 5), "avx2"},
        {avx && fa_cpu_bit(c->leaf1_ecx, 12), "fma"}, {avx && fa_cpu_bit(c->leaf1_ecx, 29), "f16c"},
        {avx512f, "avx512f"}, {avx512f && fa_cpu_bit(c->leaf7_ebx, 17), "avx512dq"},
        {avx512f && fa_cpu_bit(c->leaf7_ebx, 30), "avx512bw"}, {avx512f && fa_cpu_bit(c->leaf7_ebx, 31), "avx512vl"},
        {avx512bf16, "avx512bf16"}, {avx512f && fa_cpu_bit(c->leaf7_edx, 23), "avx512fp16"},
        {(c->hwcap & HWCAP_ASIMD) != 0, "neon"}, {(c->hwcap & HWCAP_ASIMDHP) != 0, "asimdhp"},
        {(c->hwcap2 & HWCAP2_BF16) != 0, "bf16"},
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
