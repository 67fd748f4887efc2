/*
 * cmd_tune.c: `flashattn tune`: times flash over a grid of tile sizes on one
 * shape (FA_PARAM_TILE_Q x FA_PARAM_TILE_KV) and prints the pairs fastest
 * first, the best one, and how the library's heuristic plan (both set to 0)
 * compares. The best pair is saved in the tune file (README.md, "The tune
 * file"; src/tune.h), which the library reads for later calls of the same shape
 * class on this CPU and ISA path. The file is this program's to write and the
 * library's to read: the tool knows its format only from the documentation, as
 * any user editing the file would.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "flashattn.h"
#include "measure.h"
#include "shape.h"

int cmd_tune(int argc, char **argv);

static const int64_t tile_qs[] = {16, 32, 64, 128, 256};
static const int64_t tile_kvs[] = {32, 64, 128, 256, 512};
enum {
    N_TQ = sizeof tile_qs / sizeof tile_qs[0],
    N_TKV = sizeof tile_kvs / sizeof tile_kvs[0],
    MAX_PAIRS = N_TQ * N_TKV + 1, /* + the planned pair */
    TUNE_DEFAULT_RUNS = 3         /* 26 configurations: keep the default sweep in minutes */
};

static void tune_usage(FILE *f)
{
    cli_shape d = cli_shape_defaults();
    d.runs = TUNE_DEFAULT_RUNS;
    d.algo = FA_ALGO_FLASH;
    fprintf(f, "usage: flashattn tune [--no-save] [shape flags]\n\n"
               "Times flash with tile_q in {16,32,64,128,256} x tile_kv in {32,64,128,256,512}\n"
               "(query rows x key/value rows per tile) and with the library's planned tiles;\n"
               "each: one warm-up, then --runs timed runs (default %d), median. Prints the\n"
               "configurations fastest first, the best pair and the planned pair's time.\n"
               "Tiles are shown as the library used them (FA_PARAM_LAST_TILE_Q/_KV): a tile\n"
               "larger than the sequence is clamped to it, and a pair that ends up the same\n"
               "as one already timed is listed once. --tile-q or --tile-kv pins that side of\n"
               "the grid. Flash only: --algo other than flash is an error. \"planned\" is\n"
               "the library's heuristic: an existing tune file is not read while tuning.\n\n"
               "The best pair is saved in the tune file, replacing the entry of the same\n"
               "CPU, ISA path, dtype, head dims, length buckets and masking and keeping the\n"
               "others: $FLASHATTN_TUNE_FILE, else $XDG_CACHE_HOME/flashattn/tune.txt, else\n"
               "$HOME/.cache/flashattn/tune.txt (FLASHATTN_TUNE_FILE= empty turns tuned\n"
               "tiles off). Later contexts use it for calls of that class at any thread\n"
               "count. --no-save only prints. Progress goes to stderr on a terminal.\n\n",
            TUNE_DEFAULT_RUNS);
    cli_shape_usage(f, &d);
}

typedef struct tune_pair {
    cli_timing t;
    int planned;            /* ran with both tiles 0 */
    int64_t asked_q, asked_kv; /* the tiles set (0 = planned): what the tune file saves, since
                                  a tile clamped to this sequence is clamped to each length
                                  of its bucket too */
} tune_pair;

static int by_time(const void *a, const void *b)
{
    const tune_pair *x = a, *y = b;
    if (x->t.oom != y->t.oom)
        return x->t.oom - y->t.oom; /* out of memory sorts last */
    return (x->t.median_s > y->t.median_s) - (x->t.median_s < y->t.median_s);
}

/* Times flash with the given tiles into *p. 0, or -1 on a library error (reported). */
static int time_pair(fa_context *ctx, const cli_shape *s, const fa_forward_args *args,
                     double *times, int64_t tq, int64_t tkv, tune_pair *p)
{
    fa_status st = fa_context_set(ctx, FA_PARAM_TILE_Q, tq);
    if (st == FA_OK)
        st = fa_context_set(ctx, FA_PARAM_TILE_KV, tkv);
    if (st != FA_OK) {
        fprintf(stderr, "flashattn tune: setting tiles %lldx%lld: %s: %s\n", (long long)tq,
                (long long)tkv, fa_status_string(st), fa_context_error(ctx));
        return -1;
    }
    p->planned = tq == 0 && tkv == 0;
    p->asked_q = tq;
    p->asked_kv = tkv;
    return cli_time_algo(ctx, s, FA_ALGO_FLASH, args, times, NULL, &p->t, "tune");
}

static int same_tiles(const tune_pair *a, const tune_pair *b)
{
    return a->t.tile_q == b->t.tile_q && a->t.tile_kv == b->t.tile_kv;
}

enum { TUNE_COLS = 6 };

static void print_results(const cli_shape *s, const char *isa, tune_pair *pairs, int n)
{
    const double flops = cli_flops(s);
    const tune_pair *planned = NULL;
    for (int i = 0; i < n; i++)
        if (pairs[i].planned)
            planned = &pairs[i];
    /* Sorting moves the planned entry: remember its time first. */
    const double planned_s = planned && !planned->t.oom ? planned->t.median_s : NAN;
    const int64_t planned_q = planned ? planned->t.tile_q : 0;
    const int64_t planned_kv = planned ? planned->t.tile_kv : 0;
    qsort(pairs, (size_t)n, sizeof *pairs, by_time);

    char shape[256];
    cli_shape_describe(s, shape, sizeof shape);
    printf("# flashattn %s tune: flash, %s %s, isa %s, %lld thread%s; median of %lld runs after "
           "1 warm-up per pair\n",
           fa_version_string(), fa_dtype_name(s->dtype), shape, isa,
           (long long)pairs[0].t.threads, pairs[0].t.threads == 1 ? "" : "s", (long long)s->runs);

    static const char *const head[TUNE_COLS] = {"rank", "tiles", "median ms", "GFLOP/s",
                                                "vs planned", "note"};
    static const int right[TUNE_COLS] = {1, 1, 1, 1, 1, 0};
    char *cells = calloc((size_t)n * TUNE_COLS, CLI_CELL);
    if (!cells) {
        fprintf(stderr, "flashattn tune: out of memory\n");
        return;
    }
    for (int r = 0; r < n; r++) {
        const cli_timing *t = &pairs[r].t;
        char *row[TUNE_COLS];
        for (int c = 0; c < TUNE_COLS; c++)
            row[c] = cells + ((size_t)r * TUNE_COLS + (size_t)c) * CLI_CELL;
        snprintf(row[0], CLI_CELL, "%d", r + 1);
        snprintf(row[1], CLI_CELL, "%lldx%lld", (long long)t->tile_q, (long long)t->tile_kv);
        if (t->oom) {
            snprintf(row[2], CLI_CELL, "out of memory");
            snprintf(row[3], CLI_CELL, "-");
            snprintf(row[4], CLI_CELL, "-");
        } else {
            snprintf(row[2], CLI_CELL, "%.3f", t->median_s * 1e3);
            snprintf(row[3], CLI_CELL, "%.2f", flops / t->median_s * 1e-9);
            if (isfinite(planned_s))
                snprintf(row[4], CLI_CELL, "%.2fx", planned_s / t->median_s);
            else
                snprintf(row[4], CLI_CELL, "-");
        }
        snprintf(row[5], CLI_CELL, "%s", pairs[r].planned ? "planned" : "");
    }
    cli_print_table(stdout, TUNE_COLS, head, right, n, cells);
    free(cells);

    const cli_timing *best = &pairs[0].t;
    if (isfinite(planned_s))
        printf("planned %lldx%lld: %.3f ms\n", (long long)planned_q, (long long)planned_kv,
               planned_s * 1e3);
    if (best->oom) {
        printf("best: none ran (out of memory)\n");
    } else {
        printf("best %lldx%lld: %.3f ms", (long long)best->tile_q, (long long)best->tile_kv,
               best->median_s * 1e3);
        if (isfinite(planned_s))
            printf(", %.2fx the planned tiles' speed", planned_s / best->median_s);
        printf(" (--tile-q %lld --tile-kv %lld)\n", (long long)best->tile_q,
               (long long)best->tile_kv);
    }
}

/* ---------------------------------------------------------------- the tune file */

#define TUNE_HEADER "flashattn-tune 1"
/* The library uses an entry only within these (README.md): saving one beyond
 * them would write a line it skips. */
#define TUNE_TILE_BYTES_MAX ((int64_t)64 << 20)

/* The CPU model as the library keys it: the CPUID brand string on x86, MIDR_EL1 on
 * aarch64 (as the kernel shows it), else "unknown"; blanks trimmed and collapsed. */
static void tune_cpu_model(char *buf, size_t n)
{
    char raw[64] = {0};
#if defined(__x86_64__) || defined(__i386__)
    unsigned r[12] = {0};
    if (__get_cpuid_max(0x80000000u, NULL) >= 0x80000004u) {
        for (unsigned k = 0; k < 3; k++)
            __cpuid(0x80000002u + k, r[4 * k], r[4 * k + 1], r[4 * k + 2], r[4 * k + 3]);
        memcpy(raw, r, sizeof r);
    }
#elif defined(__aarch64__) && defined(__linux__)
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/regs/identification/midr_el1", "r");
    if (f) {
        if (!fgets(raw, sizeof raw, f))
            raw[0] = '\0';
        fclose(f);
    }
#endif
    raw[sizeof raw - 1] = '\0';
    size_t len = 0;
    for (const char *c = raw; *c && len + 1 < n; c++) {
        if (*c == ' ' || *c == '\t' || *c == '\n' || *c == '\r') {
            if (len > 0 && buf[len - 1] != ' ')
                buf[len++] = ' ';
        } else {
            buf[len++] = *c > ' ' && *c < 127 ? *c : '?';
        }
    }
    while (len > 0 && buf[len - 1] == ' ')
        len--;
    buf[len] = '\0';
    if (len == 0)
        snprintf(buf, n, "unknown");
}

/* The file's path, as the library finds it. 1 with the path in buf, 0 when tuned
 * tiles are off (FLASHATTN_TUNE_FILE empty), -1 when there is no location. */
static int tune_file_path(char *buf, size_t n)
{
    const char *env = getenv("FLASHATTN_TUNE_FILE");
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int w;
    if (env && !*env)
        return 0;
    if (env)
        w = snprintf(buf, n, "%s", env);
    else if (xdg && xdg[0] == '/')
        w = snprintf(buf, n, "%s/flashattn/tune.txt", xdg);
    else if (home && *home)
        w = snprintf(buf, n, "%s/.cache/flashattn/tune.txt", home);
    else
        return -1;
    return w > 0 && (size_t)w < n ? 1 : -1;
}

/* An entry's key, every field as canonical text, for comparing lines. */
typedef struct tune_key {
    char isa[32], dtype[8], cpu[80];
    int64_t d, dv, sk, rows, masked;
} tune_key;

static int tune_key_equal(const tune_key *a, const tune_key *b)
{
    return strcmp(a->isa, b->isa) == 0 && strcmp(a->dtype, b->dtype) == 0 && strcmp(a->cpu, b->cpu) == 0 &&
           a->d == b->d && a->dv == b->dv && a->sk == b->sk && a->rows == b->rows && a->masked == b->masked;
}

/* The key of an entry line (format: src/tune.h): 0, or -1 when the line is not a
 * whole entry. Checks the syntax only; the library checks the values when it reads. */
static int tune_parse_key(const char *line, tune_key *k)
{
    static const char *const names[] = {"isa", "dtype", "d", "dv", "sk", "rows", "masked", "tile_q",
                                        "tile_kv", "cpu"};
    enum { N_FIELDS = sizeof names / sizeof names[0] };
    int seen[N_FIELDS] = {0};
    int64_t *nums[N_FIELDS] = {NULL, NULL, &k->d, &k->dv, &k->sk, &k->rows, &k->masked, NULL, NULL, NULL};
    int64_t tile;
    memset(k, 0, sizeof *k);
    const char *c = line;
    while (*c == ' ' || *c == '\t')
        c++;
    while (*c && *c != '\n') {
        const char *eq = c;
        while (*eq && *eq != '=' && *eq != ' ' && *eq != '\t' && *eq != '\n')
            eq++;
        if (*eq != '=')
            return -1;
        int f = -1;
        for (int i = 0; i < N_FIELDS && f < 0; i++)
            if (strlen(names[i]) == (size_t)(eq - c) && strncmp(names[i], c, (size_t)(eq - c)) == 0)
                f = i;
        if (f < 0 || seen[f])
            return -1;
        seen[f] = 1;
        const char *v = eq + 1, *end = v;
        if (strcmp(names[f], "cpu") == 0) {
            /* the model runs to the end of the line: collapse its blanks as the library does */
            size_t len = 0;
            for (; *end && *end != '\n'; end++) {
                const int blank = *end == ' ' || *end == '\t' || *end == '\r';
                if (len + 1 >= sizeof k->cpu)
                    return -1;
                if (!blank)
                    k->cpu[len++] = *end;
                else if (len > 0 && k->cpu[len - 1] != ' ')
                    k->cpu[len++] = ' ';
            }
            while (len > 0 && k->cpu[len - 1] == ' ')
                len--;
            k->cpu[len] = '\0';
            if (len == 0)
                return -1;
        } else {
            while (*end && *end != ' ' && *end != '\t' && *end != '\n' && *end != '\r')
                end++;
            char text[32];
            const size_t len = (size_t)(end - v);
            if (len == 0 || len >= sizeof text)
                return -1;
            memcpy(text, v, len);
            text[len] = '\0';
            if (f == 0 || f == 1) {
                if (len >= (f == 0 ? sizeof k->isa : sizeof k->dtype))
                    return -1;
                strcpy(f == 0 ? k->isa : k->dtype, text);
            } else if (cli_parse_i64(text, nums[f] ? nums[f] : &tile) != 0 || text[0] == '-' || text[0] == '+') {
                return -1;
            }
        }
        c = end;
        while (*c == ' ' || *c == '\t' || *c == '\r')
            c++;
    }
    for (int i = 0; i < N_FIELDS; i++)
        if (!seen[i])
            return -1;
    return 0;
}

/* mkdir -p of the directory that holds `path`. 0 or -1 (errno set). */
static int tune_make_parents(const char *path)
{
    char dir[4096];
    const size_t len = strlen(path);
    if (len >= sizeof dir)
        return -1;
    memcpy(dir, path, len + 1);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = '\0';
    for (char *c = dir + 1;; c++) {
        if (*c == '/' || *c == '\0') {
            const char was = *c;
            *c = '\0';
            if (mkdir(dir, 0755) != 0 && errno != EEXIST)
                return -1;
            *c = was;
            if (was == '\0')
                return 0;
        }
    }
}

/*
 * Writes `entry` (one line, with its newline) for key k into the file at path:
 * the entries of other keys are kept, one of the same key is replaced, lines that
 * are not entries are dropped (and counted on stderr). The new file is written
 * next to the old one and renamed over it, so a reader sees the old file or the
 * new one, never half of one. A file that is not a version-1 tune file is left
 * alone (it may be something else that FLASHATTN_TUNE_FILE points at by mistake).
 * 0 or -1 (reported).
 */
static int tune_save(const char *path, const tune_key *k, const char *entry)
{
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= (int)sizeof tmp) {
        fprintf(stderr, "flashattn tune: %s: path too long\n", path);
        return -1;
    }
    FILE *old = fopen(path, "r");
    if (!old && errno != ENOENT) {
        fprintf(stderr, "flashattn tune: cannot read %s: %s\n", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    if (old) {
        ssize_t got = getline(&line, &cap, old);
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r' || line[got - 1] == ' '))
            line[--got] = '\0';
        if (got < 0 || strcmp(line, TUNE_HEADER) != 0) {
            fprintf(stderr,
                    "flashattn tune: %s is not a version 1 tune file (its first line is not '%s'); not "
                    "replacing it: delete it or set FLASHATTN_TUNE_FILE to another path\n",
                    path, TUNE_HEADER);
            free(line);
            fclose(old);
            return -1;
        }
    }
    int fd = -1;
    FILE *out = NULL;
    if (tune_make_parents(path) != 0 || (fd = mkstemp(tmp)) < 0 || !(out = fdopen(fd, "w"))) {
        fprintf(stderr, "flashattn tune: cannot write next to %s: %s\n", path, strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
        free(line);
        if (old)
            fclose(old);
        return -1;
    }
    fchmod(fd, 0644); /* a cache, not a secret: mkstemp made it 0600 */
    fprintf(out, "%s\n"
                 "# flashattn tuned tile sizes, written by `flashattn tune` and read by the library\n"
                 "# (README.md, \"The tune file\"). One entry a line, cpu= last; delete the file to\n"
                 "# go back to the library's heuristic tiles.\n",
            TUNE_HEADER);
    int64_t dropped = 0;
    ssize_t got;
    while (old && (got = getline(&line, &cap, old)) >= 0) {
        tune_key other;
        const char *c = line;
        while (*c == ' ' || *c == '\t' || *c == '\r')
            c++;
        if (*c == '\0' || *c == '\n' || *c == '#')
            continue; /* comments are the header's, written above */
        if (got == 0 || line[got - 1] != '\n' || (size_t)got != strlen(line) || tune_parse_key(line, &other) != 0) {
            dropped++;
            continue;
        }
        if (!tune_key_equal(&other, k))
            fputs(line, out);
    }
    fputs(entry, out);
    free(line);
    const int read_failed = old && ferror(old);
    if (old)
        fclose(old);
    const int failed = read_failed || fflush(out) != 0 || fsync(fd) != 0;
    if (fclose(out) != 0 || failed || rename(tmp, path) != 0) {
        fprintf(stderr, "flashattn tune: cannot write %s: %s\n", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    if (dropped > 0)
        fprintf(stderr, "flashattn tune: dropped %lld line%s of %s that %s not tune entries\n", (long long)dropped,
                dropped == 1 ? "" : "s", path, dropped == 1 ? "was" : "were");
    return 0;
}

static int64_t tune_bucket(int64_t n)
{
    int64_t b = 1;
    while (b < n && b < ((int64_t)1 << 62))
        b <<= 1;
    return b;
}

/* Saves the best pair for the shape class of s on this CPU and `isa`; prints where. */
static int tune_save_best(const cli_shape *s, const char *isa, const char *path, const tune_pair *best)
{
    tune_key k;
    memset(&k, 0, sizeof k);
    tune_cpu_model(k.cpu, sizeof k.cpu);
    snprintf(k.isa, sizeof k.isa, "%s", isa);
    snprintf(k.dtype, sizeof k.dtype, "%s", fa_dtype_name(s->dtype));
    /* the planner's view (src/tune.h): rows a task holds = Sq x the query heads per kv head */
    const int64_t group = s->heads / s->kv_heads;
    const int64_t sq = s->seq > 0 ? s->seq : 1, sk = s->seq_kv > 0 ? s->seq_kv : 1;
    k.d = s->dim;
    k.dv = s->dim_v;
    k.sk = tune_bucket(sk);
    k.rows = sq > INT64_MAX / group ? tune_bucket(INT64_MAX / 2) : tune_bucket(sq * group);
    k.masked = s->causal != FA_CAUSAL_NONE || s->window_left >= 0 || s->window_right >= 0;
    const int64_t tq = best->asked_q > 0 ? best->asked_q : best->t.tile_q;
    const int64_t tkv = best->asked_kv > 0 ? best->asked_kv : best->t.tile_kv;
    double bytes = 4.0 * ((double)(tq + tkv) * (double)(s->dim + s->dim_v) + (double)tq * (double)tkv);
    if (tq < 1 || tq > 4096 || tkv < 1 || tkv > 65536 || bytes > (double)TUNE_TILE_BYTES_MAX) {
        fprintf(stderr, "flashattn tune: not saved: %lldx%lld tiles are beyond what the tune file allows\n",
                (long long)tq, (long long)tkv);
        return -1;
    }
    char key[256], entry[512];
    snprintf(key, sizeof key, "isa=%s dtype=%s d=%lld dv=%lld sk=%lld rows=%lld masked=%lld", k.isa, k.dtype,
             (long long)k.d, (long long)k.dv, (long long)k.sk, (long long)k.rows, (long long)k.masked);
    snprintf(entry, sizeof entry, "%s tile_q=%lld tile_kv=%lld cpu=%s\n", key, (long long)tq, (long long)tkv,
             k.cpu);
    if (tune_save(path, &k, entry) != 0)
        return -1;
    printf("saved %lldx%lld", (long long)tq, (long long)tkv);
    if (tq != best->t.tile_q || tkv != best->t.tile_kv)
        printf(" (ran as %lldx%lld: clamped to this shape)", (long long)best->t.tile_q, (long long)best->t.tile_kv);
    printf(" to %s for %s cpu=%s\n", path, key, k.cpu);
    return 0;
}

/* "[12/26] 64x128 ..." on stderr while sweeping, when it is a terminal. */
static void tune_progress(int done, int total, int64_t tq, int64_t tkv)
{
    if (tq == 0 && tkv == 0)
        fprintf(stderr, "\r[%d/%d] planned ...     ", done, total);
    else
        fprintf(stderr, "\r[%d/%d] %lldx%lld ...     ", done, total, (long long)tq, (long long)tkv);
    fflush(stderr);
}

int cmd_tune(int argc, char **argv)
{
    cli_shape s = cli_shape_defaults();
    int save = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            tune_usage(stdout);
            return CLI_EXIT_OK;
        }
        if (strcmp(argv[i], "--no-save") == 0) {
            save = 0;
            continue;
        }
        int r = cli_shape_flag(&s, argc, argv, &i, "tune");
        if (r < 0)
            return CLI_EXIT_USAGE;
        if (r == 0) {
            fprintf(stderr, "flashattn tune: unknown argument '%s'\n\n", argv[i]);
            tune_usage(stderr);
            return CLI_EXIT_USAGE;
        }
    }
    if (s.algo_given && s.algo != FA_ALGO_FLASH) {
        fprintf(stderr, "flashattn tune: tiles are flash's; --algo %s cannot be tuned\n",
                fa_algo_name(s.algo));
        return CLI_EXIT_USAGE;
    }
    if (!s.runs_given)
        s.runs = TUNE_DEFAULT_RUNS;
    if (cli_shape_finish(&s, "tune") != 0)
        return CLI_EXIT_USAGE;

    /* Where to save, found before the library is told not to read the file: the
     * planned pair is then always the heuristic, not an entry saved earlier. */
    char path[4096];
    if (save) {
        const int where = tune_file_path(path, sizeof path);
        if (where == 0)
            fprintf(stderr, "flashattn tune: FLASHATTN_TUNE_FILE is empty (tuned tiles off): not saving\n");
        else if (where < 0)
            fprintf(stderr, "flashattn tune: no place for the tune file (set FLASHATTN_TUNE_FILE or HOME): "
                            "not saving\n");
        save = where > 0;
    }
    if (setenv("FLASHATTN_TUNE_FILE", "", 1) != 0) {
        fprintf(stderr, "flashattn tune: cannot set FLASHATTN_TUNE_FILE: %s\n", strerror(errno));
        return CLI_EXIT_FAIL;
    }

    /* The grid, or one side of it pinned; the context starts on the plan. */
    const int64_t pin_q = s.tile_q, pin_kv = s.tile_kv;
    s.tile_q = s.tile_kv = 0;
    const int progress = isatty(STDERR_FILENO);
    const int total = 1 + (pin_q > 0 ? 1 : N_TQ) * (pin_kv > 0 ? 1 : N_TKV);
    int done = 0;

    int status = CLI_EXIT_FAIL;
    fa_context *ctx = NULL;
    cli_inputs in = {0};
    void *o = NULL;
    double *times = NULL;
    tune_pair pairs[MAX_PAIRS];
    int n = 0;

    if (cli_context_make(&s, "tune", &ctx) != 0)
        return CLI_EXIT_FAIL;
    if (cli_inputs_make(&s, &in) != 0)
        goto done;
    o = cli_alloc(in.o_elems, fa_dtype_size(s.dtype));
    times = cli_alloc(s.runs, sizeof *times);
    if (!o || !times) {
        fprintf(stderr, "flashattn tune: out of memory allocating the output\n");
        goto done;
    }
    fa_forward_args args = cli_forward_args(&s, &in, o, s.dtype, NULL);

    /* The plan first, so a grid pair the library would have chosen anyway is
     * shown as the planned one rather than twice. */
    if (progress)
        tune_progress(++done, total, 0, 0);
    if (time_pair(ctx, &s, &args, times, 0, 0, &pairs[n]) != 0)
        goto done;
    n++;
    for (int a = 0; a < N_TQ; a++) {
        for (int b = 0; b < N_TKV; b++) {
            const int64_t tq = pin_q > 0 ? pin_q : tile_qs[a];
            const int64_t tkv = pin_kv > 0 ? pin_kv : tile_kvs[b];
            if ((pin_q > 0 && a > 0) || (pin_kv > 0 && b > 0))
                continue; /* a pinned side runs once */
            if (progress)
                tune_progress(++done, total, tq, tkv);
            if (time_pair(ctx, &s, &args, times, tq, tkv, &pairs[n]) != 0)
                goto done;
            int dup = 0;
            for (int k = 0; k < n && !dup; k++)
                dup = !pairs[n].t.oom && same_tiles(&pairs[k], &pairs[n]);
            if (!dup)
                n++;
        }
    }
    if (progress)
        fprintf(stderr, "\r%*s\r", 40, "");
    done = 0; /* the progress line is gone */
    print_results(&s, fa_context_isa(ctx), pairs, n); /* sorts: pairs[0] is the best */
    status = CLI_EXIT_OK;
    if (save && !pairs[0].t.oom && tune_save_best(&s, fa_context_isa(ctx), path, &pairs[0]) != 0)
        status = CLI_EXIT_FAIL;

done:
    if (progress && done > 0)
        fprintf(stderr, "\n"); /* a sweep cut short: keep its last progress line */
    cli_free(times);
    cli_free(o);
    cli_inputs_free(&in);
    fa_context_free(ctx);
    return status;
}
