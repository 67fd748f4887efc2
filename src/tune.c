/*
 * tune.c: reads the tune file (format in tune.h and README.md) into a table of
 * this CPU's and ISA's entries, once per context, and finds a call's entry.
 * Only libc: the file is untrusted input, so every line is read into a bounded
 * buffer, every number is checked digit by digit, and any doubt drops the line
 * (or, for the header, the file). Nothing here can fail a call or print.
 */
#include "tune.h"
#include "cpu.h"
#include "alloc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Lines are short (the CPU model is at most 48 characters); anything longer is not ours. */
enum { TUNE_LINE_MAX = 512, TUNE_PATH_MAX = 4096 };
/* Reading stops here: a tune file is a few KiB, a bigger one is not worth the time. */
#define TUNE_FILE_MAX ((int64_t)16 << 20)
/* A tuned pair is used only if its tiles fit this (Q panel, K/V tile, score tile):
 * a hand-edited file must not make a call allocate gigabytes or run out of memory. */
#define TUNE_TILE_BYTES_MAX ((int64_t)64 << 20)
#define TUNE_DIM_MAX ((int64_t)1 << 31)

typedef struct tune_entry {
    fa_dtype dtype;
    int64_t d, dv, sk, rows;
    int masked;
    int64_t tile_q, tile_kv;
} tune_entry;

struct fa_tune_table {
    int64_t n, cap;
    tune_entry *e;
};

int64_t fa_tune_bucket(int64_t n)
{
    int64_t b = 1;
    while (b < n && b < ((int64_t)1 << 62)) b <<= 1;
    return b;
}

void fa_tune_free(fa_tune_table *t)
{
    if (!t) return;
    fa_free(t->e);
    fa_free(t);
}

static int is_blank(int c) { return c == ' ' || c == '\t' || c == '\r'; }

/* Strict decimal: digits only (no sign, no blanks), value <= max. 0 or -1. */
static int parse_u64(const char *s, size_t len, int64_t max, int64_t *out)
{
    if (len == 0 || len > 19) return -1;
    int64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        const int64_t digit = s[i] - '0';
        if (v > (max - digit) / 10) return -1;
        v = v * 10 + digit;
    }
    *out = v;
    return 0;
}

static int parse_dtype(const char *s, size_t len, fa_dtype *out)
{
    static const struct { const char *name; fa_dtype dtype; } names[] = {
        {"f32", FA_DTYPE_F32}, {"f16", FA_DTYPE_F16}, {"bf16", FA_DTYPE_BF16}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i].name) == len && memcmp(names[i].name, s, len) == 0) {
            *out = names[i].dtype;
            return 0;
        }
    return -1;
}

/* Whether the text s[0..len) equals `model` once blanks are collapsed (model is
 * fa_cpu_model(): trimmed, single spaces). */
static int same_model(const char *s, size_t len, const char *model)
{
    size_t i = 0;
    while (i < len && is_blank(s[i])) i++;
    while (len > i && is_blank(s[len - 1])) len--;
    for (; i < len; model++) {
        if (is_blank(s[i])) {
            if (*model != ' ') return 0;
            while (i < len && is_blank(s[i])) i++;
        } else {
            if (*model != s[i]) return 0;
            i++;
        }
    }
    return *model == '\0';
}

/* What one line is. */
enum { LINE_SKIP, LINE_BAD, LINE_OTHER, LINE_OURS };

enum { F_ISA, F_DTYPE, F_D, F_DV, F_SK, F_ROWS, F_MASKED, F_TQ, F_TKV, F_CPU, F_COUNT };
static const char *const field_names[F_COUNT] = {"isa", "dtype", "d", "dv", "sk", "rows",
                                                 "masked", "tile_q", "tile_kv", "cpu"};

/* Parses one NUL-free line (no newline) into *e; LINE_OURS when it is an entry of
 * this cpu and isa, LINE_OTHER for a valid entry of another, LINE_SKIP for a blank
 * or comment line, LINE_BAD for anything else. */
static int parse_line(const char *line, size_t len, const char *cpu, const char *isa, tune_entry *e)
{
    while (len > 0 && is_blank(line[len - 1])) len--;
    size_t i = 0;
    while (i < len && is_blank(line[i])) i++;
    if (i == len || line[i] == '#') return LINE_SKIP;

    const char *val[F_COUNT] = {0};
    size_t vlen[F_COUNT] = {0};
    while (i < len) {
        const size_t name = i;
        while (i < len && line[i] != '=' && !is_blank(line[i])) i++;
        if (i == len || line[i] != '=') return LINE_BAD;
        int f = -1;
        for (int k = 0; k < F_COUNT && f < 0; k++)
            if (strlen(field_names[k]) == i - name && memcmp(field_names[k], line + name, i - name) == 0) f = k;
        if (f < 0 || val[f]) return LINE_BAD; /* unknown or repeated */
        const size_t start = ++i;
        if (f == F_CPU) {
            i = len; /* the model runs to the end of the line */
        } else {
            while (i < len && !is_blank(line[i])) i++;
        }
        val[f] = line + start;
        vlen[f] = i - start;
        while (i < len && is_blank(line[i])) i++;
    }
    for (int k = 0; k < F_COUNT; k++)
        if (!val[k]) return LINE_BAD;

    int64_t masked;
    if (parse_dtype(val[F_DTYPE], vlen[F_DTYPE], &e->dtype) != 0 ||
        parse_u64(val[F_D], vlen[F_D], TUNE_DIM_MAX, &e->d) != 0 || e->d < 1 ||
        parse_u64(val[F_DV], vlen[F_DV], TUNE_DIM_MAX, &e->dv) != 0 ||
        parse_u64(val[F_SK], vlen[F_SK], (int64_t)1 << 62, &e->sk) != 0 || fa_tune_bucket(e->sk) != e->sk ||
        parse_u64(val[F_ROWS], vlen[F_ROWS], (int64_t)1 << 62, &e->rows) != 0 ||
        fa_tune_bucket(e->rows) != e->rows ||
        parse_u64(val[F_MASKED], vlen[F_MASKED], 1, &masked) != 0 ||
        parse_u64(val[F_TQ], vlen[F_TQ], 4096, &e->tile_q) != 0 || e->tile_q < 1 ||
        parse_u64(val[F_TKV], vlen[F_TKV], 65536, &e->tile_kv) != 0 || e->tile_kv < 1 || vlen[F_ISA] == 0 ||
        vlen[F_CPU] == 0)
        return LINE_BAD;
    e->masked = (int)masked;
    /* tiles bounded above and dims below 2^31: no overflow */
    const int64_t tile_bytes = 4 * ((e->tile_q + e->tile_kv) * (e->d + e->dv) + e->tile_q * e->tile_kv);
    if (tile_bytes > TUNE_TILE_BYTES_MAX) return LINE_BAD;
    const int our_isa = strlen(isa) == vlen[F_ISA] && memcmp(isa, val[F_ISA], vlen[F_ISA]) == 0;
    return our_isa && same_model(val[F_CPU], vlen[F_CPU], cpu) ? LINE_OURS : LINE_OTHER;
}

/* Reads the next line into buf (NUL-terminated, without the newline). Returns 1 for
 * a whole line that fits, 2 for a line that is too long, holds a NUL byte or has
 * no newline (consumed to its end, to be skipped), 0 at the end of the file. */
static int read_line(FILE *f, char *buf, size_t cap, size_t *len, int64_t *total)
{
    size_t n = 0;
    int bad = 0, c;
    while ((c = getc(f)) != EOF) {
        if (++*total > TUNE_FILE_MAX) return 0;
        if (c == '\n') {
            buf[n < cap ? n : cap - 1] = '\0';
            *len = n;
            return bad ? 2 : 1;
        }
        if (c == '\0' || n + 1 >= cap) bad = 1;
        else buf[n++] = (char)c;
    }
    *len = n;
    buf[n] = '\0';
    return n > 0 || bad ? 2 : 0;
}

static int table_add(fa_tune_table *t, const tune_entry *e)
{
    if (t->n == t->cap) {
        const int64_t cap = t->cap ? 2 * t->cap : 16;
        if (cap > 4096) return 0; /* more entries for one CPU and ISA than any sweep makes */
        /* allocate, copy, free rather than realloc: the library's allocations all
         * pass through alloc.c, which has no realloc */
        tune_entry *grown = fa_malloc(cap * (int64_t)sizeof *grown);
        if (!grown) return 0;
        if (t->n > 0) memcpy(grown, t->e, (size_t)t->n * sizeof *grown);
        fa_free(t->e);
        t->e = grown;
        t->cap = cap;
    }
    t->e[t->n++] = *e;
    return 1;
}

/* The file's entries for cpu and isa, or NULL; either way `note` says what happened. */
static fa_tune_table *tune_read_file(const char *path, const char *cpu, const char *isa, char *note, size_t note_size)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(note, note_size, "ignored %.240s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char line[TUNE_LINE_MAX];
    size_t len = 0;
    int64_t total = 0, bad = 0, other = 0, dropped = 0;
    char header[32];
    snprintf(header, sizeof header, "%s %d", FA_TUNE_HEADER, FA_TUNE_VERSION);
    const int got = read_line(f, line, sizeof line, &len, &total);
    while (len > 0 && is_blank(line[len - 1])) line[--len] = '\0';
    if (got != 1 || strcmp(line, header) != 0) {
        const size_t hl = strlen(FA_TUNE_HEADER);
        if (got == 1 && strncmp(line, FA_TUNE_HEADER " ", hl + 1) == 0)
            snprintf(note, note_size, "ignored %.240s: version '%.16s', this library reads %d", path, line + hl + 1,
                     FA_TUNE_VERSION);
        else
            snprintf(note, note_size, "ignored %.240s: no '%s' header (%s)", path, header,
                     ferror(f) ? strerror(errno) : "not a tune file");
        fclose(f);
        return NULL;
    }
    fa_tune_table *t = fa_calloc(1, (int64_t)sizeof *t);
    if (!t) {
        fclose(f);
        snprintf(note, note_size, "ignored %.240s: out of memory", path);
        return NULL;
    }
    int r;
    while ((r = read_line(f, line, sizeof line, &len, &total)) != 0) {
        tune_entry e;
        const int kind = r == 1 ? parse_line(line, len, cpu, isa, &e) : LINE_BAD;
        if (kind == LINE_BAD) bad++;
        else if (kind == LINE_OTHER) other++;
        else if (kind == LINE_OURS && !table_add(t, &e)) dropped++;
    }
    const int failed = ferror(f) != 0, cut = total > TUNE_FILE_MAX;
    fclose(f);
    char extra[160];
    /* no commas: the note goes into the comma-separated verbose line */
    snprintf(extra, sizeof extra, "%lld for other CPUs or ISAs; %lld bad lines skipped%s%s%s", (long long)other,
             (long long)bad, dropped ? "; too many entries" : "", cut ? "; stopped at 16 MiB" : "",
             failed ? "; read error" : "");
    if (t->n == 0) {
        snprintf(note, note_size, "ignored %.240s: no entries for this CPU (%s) and isa %s; %s", path, cpu, isa, extra);
        fa_tune_free(t);
        return NULL;
    }
    snprintf(note, note_size, "read %.240s: %lld entries for this CPU and isa; %s", path, (long long)t->n, extra);
    return t;
}

/* The tune file's path: $FLASHATTN_TUNE_FILE, else $XDG_CACHE_HOME/flashattn/tune.txt
 * (an absolute XDG_CACHE_HOME only, as the XDG spec says), else
 * $HOME/.cache/flashattn/tune.txt. 0 with a note when there is none to read. */
static int tune_path(char *buf, size_t n, char *note, size_t note_size)
{
    const char *env = getenv("FLASHATTN_TUNE_FILE");
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int w;
    if (env) {
        if (!*env) {
            snprintf(note, note_size, "off (FLASHATTN_TUNE_FILE is empty)");
            return 0;
        }
        w = snprintf(buf, n, "%s", env);
    } else if (xdg && xdg[0] == '/') {
        w = snprintf(buf, n, "%s/flashattn/tune.txt", xdg);
    } else if (home && *home) {
        w = snprintf(buf, n, "%s/.cache/flashattn/tune.txt", home);
    } else {
        snprintf(note, note_size, "off (neither FLASHATTN_TUNE_FILE, XDG_CACHE_HOME nor HOME is set)");
        return 0;
    }
    if (w < 0 || (size_t)w >= n) {
        snprintf(note, note_size, "ignored: the tune file's path is too long");
        return 0;
    }
    return 1;
}

int fa_tune_lookup(fa_context *ctx, const fa_problem *p, int masked, int64_t *br, int64_t *bc)
{
    if (!ctx->tune_read) {
        char path[TUNE_PATH_MAX];
        ctx->tune_read = 1;
        ctx->tune_note_due = 1;
        if (tune_path(path, sizeof path, ctx->tune_note, sizeof ctx->tune_note))
            ctx->tune = tune_read_file(path, fa_cpu_model(), ctx->kernels->name, ctx->tune_note,
                                       sizeof ctx->tune_note);
    }
    const fa_tune_table *t = ctx->tune;
    if (!t) return 0;
    const int64_t sk = fa_tune_bucket(p->Sk), rows = fa_tune_bucket(p->Sq);
    for (int64_t i = 0; i < t->n; i++) {
        const tune_entry *e = &t->e[i];
        if (e->dtype == p->dtype && e->d == p->D && e->dv == p->Dv && e->sk == sk && e->rows == rows &&
            e->masked == masked) {
            *br = e->tile_q;
            *bc = e->tile_kv;
            return 1;
        }
    }
    return 0;
}
