/*
 * main.c: the `flashattn` command: finds the verb and hands it the rest of argv.
 *
 * Every verb lives in its own tools/cmd_<verb>.c as `int cmd_<verb>(argc, argv)`
 * (argv[0] is the verb's name; it returns the exit status: 0 ok, 1 failure,
 * 2 usage) and answers --help itself. Adding a verb is that file, one line in
 * tools/CMakeLists.txt and one entry in the table below.
 */
#include <stdio.h>
#include <string.h>

#include "flashattn.h"
#include "shape.h"

typedef int verb_fn(int argc, char **argv);

verb_fn cmd_info;
verb_fn cmd_check;
verb_fn cmd_bench;
verb_fn cmd_tune;
static verb_fn cmd_help;

static const struct verb {
    const char *name;
    verb_fn *run;
    const char *help;
} verbs[] = {
    {"info", cmd_info, "library version, CPU features, kernel path and threads"},
    {"check", cmd_check, "compare an algorithm with the fp64 reference on random inputs"},
    {"bench", cmd_bench, "time flash, standard and reference attention (--json for machines)"},
    {"tune", cmd_tune, "time flash over a grid of tile sizes and show the best pair"},
    {"help", cmd_help, "this list, or `help VERB` for a verb's flags"},
};
enum { VERB_COUNT = sizeof verbs / sizeof verbs[0] };

static const struct verb *find_verb(const char *name)
{
    for (int i = 0; i < VERB_COUNT; i++)
        if (strcmp(verbs[i].name, name) == 0)
            return &verbs[i];
    return NULL;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: flashattn VERB [flags]\n\nverbs:\n");
    for (int i = 0; i < VERB_COUNT; i++)
        fprintf(f, "  %-7s %s\n", verbs[i].name, verbs[i].help);
    fprintf(f, "\nRun 'flashattn VERB --help' for a verb's flags. Exit status: 0 ok, "
               "1 failure, 2 bad usage.\n");
}

static int cmd_help(int argc, char **argv)
{
    if (argc < 2) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    const struct verb *v = find_verb(argv[1]);
    if (v == NULL || v->run == cmd_help) {
        if (v == NULL)
            fprintf(stderr, "flashattn help: unknown verb '%s'\n\n", argv[1]);
        usage(v == NULL ? stderr : stdout);
        return v == NULL ? CLI_EXIT_USAGE : CLI_EXIT_OK;
    }
    char flag[] = "--help";
    char *sub[] = {argv[1], flag, NULL};
    return v->run(2, sub);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("flashattn %s\n", fa_version_string());
        return CLI_EXIT_OK;
    }
    const struct verb *v = find_verb(argv[1]);
    if (v == NULL) {
        fprintf(stderr, "flashattn: unknown verb '%s'\n\n", argv[1]);
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    return v->run(argc - 1, argv + 1);
}
