/*
 * amx_hw_probe.c: the real tile instructions for test_amx_model, the only file of
 * it built with -mamx-tile -mamx-bf16 -mamx-int8 (x86-64 only). amx_hw_available() must say
 * yes before anything else here runs: it checks CPUID, XCR0 and asks Linux for the
 * tile data permission.
 */
#define _GNU_SOURCE /* syscall */
#include "amx_hw_probe.h"

#include <cpuid.h>
#include <immintrin.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

enum { ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

int amx_hw_available(char *why, size_t n)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        snprintf(why, n, "CPUID leaf 7 missing");
        return 0;
    }
    if (!(d & (1u << 24)) || !(d & (1u << 22))) {
        snprintf(why, n, "CPUID says no AMX-TILE/AMX-BF16 (leaf 7 EDX = %#x)", d);
        return 0;
    }
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) {
        snprintf(why, n, "no OSXSAVE, cannot read XCR0");
        return 0;
    }
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) {
        snprintf(why, n, "XCR0 = %#x lacks bits 17/18 (the OS does not enable the tiles)", lo);
        return 0;
    }
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        snprintf(why, n, "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) refused");
        return 0;
    }
    snprintf(why, n, "AMX-TILE and AMX-BF16, XCR0 tiles on, permission granted");
    return 1;
}

int amx_hw_int8_available(char *why, size_t n)
{
    if (!amx_hw_available(why, n)) return 0;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 25))) {
        snprintf(why, n, "CPUID says no AMX-INT8 (leaf 7 EDX = %#x)", d);
        return 0;
    }
    snprintf(why, n, "AMX-INT8, XCR0 tiles on, permission granted");
    return 1;
}

void amx_hw_dpbxxd(int variant, const void *cfg64, void *c, size_t ldc, const void *a, size_t lda, const void *b,
                   size_t ldb)
{
    _tile_loadconfig(cfg64);
    _tile_loadd(0, c, ldc);
    _tile_loadd(1, a, lda);
    _tile_loadd(2, b, ldb);
    switch (variant) { /* the tile numbers are immediates */
    case 0: _tile_dpbssd(0, 1, 2); break;
    case 1: _tile_dpbsud(0, 1, 2); break;
    case 2: _tile_dpbusd(0, 1, 2); break;
    default: _tile_dpbuud(0, 1, 2); break;
    }
    _tile_stored(0, c, ldc);
    _tile_release();
}

/* tmm0 = C, tmm1 = A, tmm2 = B, as the model's tests lay them out */
void amx_hw_dpbf16ps(const void *cfg64, void *c, size_t ldc, const void *a, size_t lda, const void *b,
                     size_t ldb)
{
    _tile_loadconfig(cfg64);
    _tile_loadd(0, c, ldc);
    _tile_loadd(1, a, lda);
    _tile_loadd(2, b, ldb);
    _tile_dpbf16ps(0, 1, 2);
    _tile_stored(0, c, ldc);
    _tile_release();
}

int amx_hw_try_config(const void *cfg64, int action, void *stored_cfg64)
{
    int fds[2];
    fflush(NULL); /* or the child may write the parent's buffered output again */
    if (pipe(fds) != 0) return -1;
    const pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]), close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        /* a fault must kill the child quietly (not through a sanitizer's handler) */
        signal(SIGSEGV, SIG_DFL), signal(SIGILL, SIG_DFL), signal(SIGBUS, SIG_DFL);
        static unsigned char buf[16 * 64];
        unsigned char out[64];
        _tile_loadconfig(cfg64);
        if (action == AMX_TRY_LOAD) _tile_loadd(0, buf, 64);
        if (action == AMX_TRY_STORE) _tile_stored(0, buf, 64);
        if (action == AMX_TRY_ZERO) _tile_zero(0);
        if (action == AMX_TRY_DP) _tile_dpbf16ps(0, 1, 2);
        _tile_storeconfig(out);
        _tile_release();
        ssize_t w = write(fds[1], out, 64);
        _exit(w == 64 ? 0 : 3);
    }
    close(fds[1]);
    unsigned char out[64];
    ssize_t got = 0, r;
    while (got < 64 && (r = read(fds[0], out + got, (size_t)(64 - got))) > 0) got += r;
    close(fds[0]);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    if (WIFSIGNALED(status)) return 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || got != 64) return -1;
    if (stored_cfg64) memcpy(stored_cfg64, out, 64);
    return 1;
}
