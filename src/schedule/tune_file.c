/*
 * tune_file.c: the tune file (format in tune.h and docs/tool.md), its only home:
 * where it is, the reader that turns it into a table of this CPU's and ISA's
 * entries (once per context) and finds a call's entry, and the writer fa_tune
 * saves through. It knows no context: its words go into the caller's buffers. The file is untrusted input, so every line is read into a
 * bounded buffer, every number is checked digit by digit, and any doubt drops
 * the line (or, for the header, the file). Reading never fails a call and
 * nothing here prints; the writer reports on the context.
 */
#include "tune.h"
#include "cpu.h"
#include "alloc.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FA_TUNE_HEADER "flashattn-tune"
#define FA_TUNE_VERSION 1

/* Lines are short (the CPU model is at most 48 characters); anything longer is not ours. */
enum { TUNE_LINE_MAX = 512, TUNE_PATH_MAX = 4096 };
/* Reading stops here: a tune file is a few KiB, a bigger one is not worth the time. */
#define TUNE_FILE_MAX ((int64_t)16 << 20)
/* A tuned pair is used only if its tiles fit this (Q panel, K/V tile, score tile):
 * a hand-edited file must not make a call allocate gigabytes or run out of memory. */
#define TUNE_TILE_BYTES_MAX ((int64_t)64 << 20)
#define TUNE_DIM_MAX ((int64_t)1 << 31)

typedef struct tune_entry {
    fa_tune_key k;
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

/* The tiles a reader uses (and the writer saves): tile_q <= 4096, tile_kv <= 65536 (the
 * settings' bounds), their working set within TUNE_TILE_BYTES_MAX. Dims below 2^31. */
static int tiles_ok(const tune_entry *e)
{
    if (e->tile_q < 1 || e->tile_q > 4096 || e->tile_kv < 1 || e->tile_kv > 65536) return 0;
    /* tiles bounded above and dims below 2^31: no overflow */
    const int64_t tile_bytes =
        4 * ((e->tile_q + e->tile_kv) * (e->k.d + e->k.dv) + e->tile_q * e->tile_kv);
    return tile_bytes <= TUNE_TILE_BYTES_MAX;
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
    fa_tune_key *k = &e->k;
    if (parse_dtype(val[F_DTYPE], vlen[F_DTYPE], &k->dtype) != 0 ||
        parse_u64(val[F_D], vlen[F_D], TUNE_DIM_MAX, &k->d) != 0 || k->d < 1 ||
        parse_u64(val[F_DV], vlen[F_DV], TUNE_DIM_MAX, &k->dv) != 0 ||
        parse_u64(val[F_SK], vlen[F_SK], (int64_t)1 << 62, &k->sk) != 0 || fa_tune_bucket(k->sk) != k->sk ||
        parse_u64(val[F_ROWS], vlen[F_ROWS], (int64_t)1 << 62, &k->rows) != 0 ||
        fa_tune_bucket(k->rows) != k->rows ||
        parse_u64(val[F_MASKED], vlen[F_MASKED], 1, &masked) != 0 ||
        parse_u64(val[F_TQ], vlen[F_TQ], INT64_MAX, &e->tile_q) != 0 ||
        parse_u64(val[F_TKV], vlen[F_TKV], INT64_MAX, &e->tile_kv) != 0 || vlen[F_ISA] == 0 || vlen[F_CPU] == 0)
        return LINE_BAD;
    k->masked = (int)masked;
    if (!tiles_ok(e)) return LINE_BAD;
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

/* Reads the first line and whether it is the version line. 1 yes, 0 no; then `why`
 * says what the line was instead. */
static int read_header(FILE *f, int64_t *total, char *why, size_t why_size)
{
    char line[TUNE_LINE_MAX], header[32];
    size_t len = 0;
    snprintf(header, sizeof header, "%s %d", FA_TUNE_HEADER, FA_TUNE_VERSION);
    const int got = read_line(f, line, sizeof line, &len, total);
    while (len > 0 && is_blank(line[len - 1])) line[--len] = '\0';
    if (got == 1 && strcmp(line, header) == 0) return 1;
    const size_t hl = strlen(FA_TUNE_HEADER);
    if (got == 1 && strncmp(line, FA_TUNE_HEADER " ", hl + 1) == 0)
        snprintf(why, why_size, "version '%.16s', this library reads %d", line + hl + 1, FA_TUNE_VERSION);
    else
        snprintf(why, why_size, "no '%s' header (%s)", header, ferror(f) ? strerror(errno) : "not a tune file");
    return 0;
}

/* The file's entries for cpu and isa, or NULL; either way `note` says what happened. */
static fa_tune_table *tune_read_file(const char *path, const char *cpu, const char *isa, char *note, size_t note_size)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(note, note_size, "ignored %.240s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char line[TUNE_LINE_MAX], why[96];
    size_t len = 0;
    int64_t total = 0, bad = 0, other = 0, dropped = 0;
    if (!read_header(f, &total, why, sizeof why)) {
        snprintf(note, note_size, "ignored %.240s: %s", path, why);
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

/* $FLASHATTN_TUNE_FILE, else $XDG_CACHE_HOME/flashattn/tune.txt (an absolute
 * XDG_CACHE_HOME only, as the XDG spec says), else $HOME/.cache/flashattn/tune.txt. */
int fa_tune_path(char *buf, size_t n, char *note, size_t note_size)
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

static int same_key(const fa_tune_key *a, const fa_tune_key *b)
{
    return a->dtype == b->dtype && a->d == b->d && a->dv == b->dv && a->sk == b->sk && a->rows == b->rows &&
           a->masked == b->masked;
}

fa_tune_key fa_tune_key_of(const fa_problem *p, int masked)
{
    return (fa_tune_key){.dtype = p->dtype, .d = p->D, .dv = p->Dv, .sk = fa_tune_bucket(p->Sk),
                         .rows = fa_tune_bucket(p->Sq), .masked = masked};
}

fa_tune_table *fa_tune_read(const char *isa, char *note, size_t note_size)
{
    char path[TUNE_PATH_MAX];
    if (!fa_tune_path(path, sizeof path, note, note_size)) return NULL;
    return tune_read_file(path, fa_cpu_model(), isa, note, note_size);
}

int fa_tune_find(const fa_tune_table *t, const fa_tune_key *k, int64_t *tile_q, int64_t *tile_kv)
{
    for (int64_t i = 0; t && i < t->n; i++) {
        const tune_entry *e = &t->e[i];
        if (same_key(&e->k, k)) {
            *tile_q = e->tile_q;
            *tile_kv = e->tile_kv;
            return 1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- the writer */

void fa_tune_key_text(const char *isa, const fa_tune_key *k, char *buf, size_t n)
{
    snprintf(buf, n, "isa=%s dtype=%s d=%lld dv=%lld sk=%lld rows=%lld masked=%d", isa, fa_dtype_name(k->dtype),
             (long long)k->d, (long long)k->dv, (long long)k->sk, (long long)k->rows, k->masked);
}

/* The writer's failures: FA_ERR_IO with the reason in msg (the caller's context's
 * error message). */
static fa_status io_fail(char *msg, size_t msg_size, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static fa_status io_fail(char *msg, size_t msg_size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, msg_size, fmt, ap);
    va_end(ap);
    return FA_ERR_IO;
}

static fa_status not_a_tune_file(char *msg, size_t msg_size, const char *path, const char *why)
{
    return io_fail(msg, msg_size,
                   "%.200s is not a version %d tune file (%s); not replacing it: delete it or choose another path",
                   path, FA_TUNE_VERSION, why);
}

fa_status fa_tune_file_check(const char *path, char *msg, size_t msg_size)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT ? FA_OK : io_fail(msg, msg_size, "cannot read %.200s: %s", path, strerror(errno));
    char why[96];
    int64_t total = 0;
    const int ok = read_header(f, &total, why, sizeof why);
    fclose(f);
    return ok ? FA_OK : not_a_tune_file(msg, msg_size, path, why);
}

/* mkdir -p of the directory that holds `path`. 0 or -1 (errno set). */
static int make_parents(const char *path)
{
    char dir[TUNE_PATH_MAX];
    const size_t len = strlen(path);
    if (len >= sizeof dir) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(dir, path, len + 1);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = '\0';
    for (char *c = dir + 1;; c++) {
        if (*c != '/' && *c != '\0') continue;
        const char was = *c;
        *c = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) return -1;
        *c = was;
        if (was == '\0') return 0;
    }
}

/* Copies the lines of `old` (after its version line) that stay: entries of other keys,
 * CPUs or ISAs. Comments and blank lines go (the writer's own come first); lines that
 * are not entries are counted in *dropped. */
static void copy_entries(FILE *old, FILE *out, const char *isa, const fa_tune_key *k, int64_t *dropped)
{
    char line[TUNE_LINE_MAX];
    size_t len = 0;
    int64_t total = 0;
    int r;
    while ((r = read_line(old, line, sizeof line, &len, &total)) != 0) {
        tune_entry e;
        const int kind = r == 1 ? parse_line(line, len, fa_cpu_model(), isa, &e) : LINE_BAD;
        if (kind == LINE_BAD) ++*dropped;
        else if (kind == LINE_OTHER || (kind == LINE_OURS && !same_key(&e.k, k))) fprintf(out, "%s\n", line);
    }
    if (total > TUNE_FILE_MAX) ++*dropped; /* what lies beyond is dropped with it */
}

/* The new file's contents into out: the version line, a few comments, the kept
 * entries of old (may be NULL) and the new entry. 0, or -1 on a write error. */
static int write_file(FILE *old, FILE *out, const char *isa, const tune_entry *e, int64_t *dropped)
{
    char key[256];
    fa_tune_key_text(isa, &e->k, key, sizeof key);
    fprintf(out, "%s %d\n"
                 "# flashattn tuned tile sizes, written by fa_tune (`flashattn tune`) and read by the\n"
                 "# library (docs/tool.md, \"The tune file\"). One entry a line, cpu= last; delete the file\n"
                 "# to go back to the library's heuristic tiles.\n",
            FA_TUNE_HEADER, FA_TUNE_VERSION);
    if (old) copy_entries(old, out, isa, &e->k, dropped);
    fprintf(out, "%s tile_q=%lld tile_kv=%lld cpu=%s\n", key, (long long)e->tile_q, (long long)e->tile_kv,
            fa_cpu_model());
    return ferror(out) || (old && ferror(old)) ? -1 : 0;
}

fa_status fa_tune_save(const char *path, const char *isa, const fa_tune_key *k, int64_t tq, int64_t tkv,
                       int64_t *dropped, char *msg, size_t msg_size)
{
    const tune_entry e = {.k = *k, .tile_q = tq, .tile_kv = tkv};
    *dropped = 0;
    if (!tiles_ok(&e))
        return io_fail(msg, msg_size, "not saved: %lldx%lld tiles are beyond what the tune file allows",
                       (long long)tq, (long long)tkv);
    char tmp[TUNE_PATH_MAX + 16];
    if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= (int)sizeof tmp)
        return io_fail(msg, msg_size, "the tune file's path is too long");
    FILE *old = fopen(path, "r");
    if (!old && errno != ENOENT) return io_fail(msg, msg_size, "cannot read %.200s: %s", path, strerror(errno));
    char why[96];
    int64_t total = 0;
    if (old && !read_header(old, &total, why, sizeof why)) {
        fclose(old);
        return not_a_tune_file(msg, msg_size, path, why);
    }
    int fd = -1;
    FILE *out = NULL;
    if (make_parents(path) != 0 || (fd = mkstemp(tmp)) < 0 || !(out = fdopen(fd, "w"))) {
        const fa_status st = io_fail(msg, msg_size, "cannot write next to %.200s: %s", path, strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
        if (old) fclose(old);
        return st;
    }
    fchmod(fd, 0644); /* a cache, not a secret: mkstemp made it 0600 */
    const int failed = write_file(old, out, isa, &e, dropped) != 0 || fflush(out) != 0 ||
                       fsync(fd) != 0;
    if (old) fclose(old);
    if (fclose(out) != 0 || failed || rename(tmp, path) != 0) {
        const fa_status st = io_fail(msg, msg_size, "cannot write %.200s: %s", path, strerror(errno));
        unlink(tmp);
        return st;
    }
    return FA_OK;
}
