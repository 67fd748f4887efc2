/*
 * cmd_info.c: `flashattn info`: what this library and this machine will run:
 * version, detected CPU features, the kernel path a context picks (after any
 * FLASHATTN_ARCH override), every path of the build with why one does not run here,
 * and the thread count.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "shape.h"

int cmd_info(int argc, char **argv);

static void info_usage(FILE *f)
{
    fprintf(f, "usage: flashattn info\n\n"
               "Prints the library version, the CPU features it detected, the kernel path\n"
               "a new context runs (FLASHATTN_ARCH=<path> forces one; an unavailable path\n"
               "is an error, exit 1) and its thread count.\n");
}

int cmd_info(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            info_usage(stdout);
            return CLI_EXIT_OK;
        }
        return cli_unknown_arg("info", argv[i], info_usage);
    }

    const char *arch = getenv("FLASHATTN_ARCH");
    printf("version       %s (built against header %d.%d.%d)\n", fa_version_string(),
           FA_VERSION_MAJOR, FA_VERSION_MINOR, FA_VERSION_PATCH);
    printf("cpu features  %s\n", fa_cpu_features());

    /* The kernel path is chosen when a context is made, so a bad FLASHATTN_ARCH
     * shows up here; report it rather than print a path that will not run. */
    fa_context *ctx = NULL;
    fa_status st = fa_context_create(&ctx);
    if (st != FA_OK) {
        fprintf(stderr, "flashattn info: cannot create a context: %s", fa_status_string(st));
        if (arch && *arch)
            fprintf(stderr, " (FLASHATTN_ARCH=%s)", arch);
        fprintf(stderr, "\n");
        return CLI_EXIT_FAIL;
    }
    printf("kernel path   %s%s%s%s\n", fa_context_isa(ctx), arch && *arch ? " (FLASHATTN_ARCH=" : "",
           arch && *arch ? arch : "", arch && *arch ? ")" : "");

    int64_t threads = 0, lo = 0, hi = 0;
    st = fa_context_get(ctx, FA_PARAM_THREADS, &threads);
    if (st != FA_OK) {
        fprintf(stderr, "flashattn info: reading the thread count: %s: %s\n", fa_status_string(st),
                fa_context_error(ctx));
        fa_context_free(ctx);
        return CLI_EXIT_FAIL;
    }
    if (threads == 0)
        printf("threads       0 = auto: %lld (online CPUs)\n", (long long)cli_resolved_threads(0));
    else
        printf("threads       %lld\n", (long long)threads);
    if (fa_param_bounds(FA_PARAM_THREADS, &lo, &hi) == FA_OK)
        printf("thread range  %lld..%lld\n", (long long)lo, (long long)hi);
    /* every path of this build, and why a path does not run here (e.g. the OS refused AMX) */
    const char *name = NULL, *why = NULL;
    for (int i = 0, runs; (runs = fa_isa_info(i, &name, &why)) >= 0; i++)
        printf("%-13s %s%s%s\n", i == 0 ? "paths" : "", name, runs ? "" : ": unavailable, ", runs ? "" : why);
    printf("algorithms    %s %s %s %s\n", fa_algo_name(FA_ALGO_AUTO), fa_algo_name(FA_ALGO_FLASH),
           fa_algo_name(FA_ALGO_STANDARD), fa_algo_name(FA_ALGO_REFERENCE));
    fa_context_free(ctx);
    return CLI_EXIT_OK;
}
