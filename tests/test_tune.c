/*
 * test_tune.c: the tune file, from outside. The test writes the files itself, in the
 * format docs/tool.md documents ("The tune file"), and points FLASHATTN_TUNE_FILE at them:
 * a tuned entry changes the tiles a later call on a new context plans (FA_PARAM_LAST_TILE_Q
 * / _KV), results still match the reference algorithm and stay bitwise the same for any
 * thread count, an explicit tile setting wins over the entry, the file is read once per
 * context, and entries apply only to their own shape class, CPU and ISA path. Damaged
 * files (garbage, truncated lines, huge or negative numbers, another version, a 1 MiB
 * line, ...) are survived: calls succeed with the heuristic tiles. The verbose trace
 * says where the tiles came from, and what the file gave, once per context.
 * fa_tune, the sweep that writes the file: the entry it saves is read back here as
 * text in the documented format, other lines are kept, a file that is not a tune file
 * is refused untouched, misuse leaves the result untouched and the context's settings
 * come back.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>

#include "harness.h"

static char g_dir[256], g_path[512];
static char g_cpu[80];
static char g_isa[32];
static h_rng g_rng;
static h_problem g_p;
static float *g_ref;   /* o of the reference algorithm on g_p */
static int64_t g_hq, g_hkv; /* the heuristic tiles of g_p */
static int64_t g_tq, g_tkv; /* the tiles the test's entries ask for: differ from the heuristic */

static void write_bytes(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!CHECK(f != NULL, "cannot write %s", path)) return;
    CHECK(fwrite(data, 1, len, f) == len, "short write to %s", path);
    fclose(f);
}

static void write_text(const char *text) { write_bytes(g_path, text, strlen(text)); }

/* One entry line (with its newline) for g_p's shape class unless the caller changes it. */
static void entry(char *buf, size_t n, const char *isa, const char *dtype, int64_t sk, int64_t rows, int masked,
                  int64_t tq, int64_t tkv, const char *cpu)
{
    snprintf(buf, n, "isa=%s dtype=%s d=%lld dv=%lld sk=%lld rows=%lld masked=%d tile_q=%lld tile_kv=%lld cpu=%s\n",
             isa, dtype, (long long)g_p.dims.D, (long long)g_p.dims.Dv, (long long)sk, (long long)rows, masked,
             (long long)tq, (long long)tkv, cpu);
}

/* g_p's own entry asking for (tq, tkv). */
static void our_entry(char *buf, size_t n, int64_t tq, int64_t tkv)
{
    entry(buf, n, g_isa, "f32", 256, 256, 0, tq, tkv, g_cpu);
}

/* Runs flash on a context (a new one when ctx is NULL) with `threads`; the tiles it
 * planned into *tq, *tkv and o into `out` (when non-NULL). The call's status. */
static fa_status run_flash(fa_context *ctx, const fa_forward_args *a, int64_t threads, int64_t *tq, int64_t *tkv,
                           float *out)
{
    fa_context *own = NULL;
    if (!ctx) {
        fa_status st = fa_context_create(&own);
        if (st != FA_OK) return st;
        ctx = own;
    }
    memset(a->o.data, 0xff, (size_t)h_numel(&a->o) * 4); /* NaN: a call that writes nothing shows */
    fa_status st = h_run(ctx, FA_ALGO_FLASH, threads, a);
    *tq = *tkv = -1;
    if (st == FA_OK) {
        fa_context_get(ctx, FA_PARAM_LAST_TILE_Q, tq);
        fa_context_get(ctx, FA_PARAM_LAST_TILE_KV, tkv);
        if (out) memcpy(out, a->o.data, (size_t)h_numel(&a->o) * 4);
    }
    fa_context_free(own);
    return st;
}

/* A new context on the current file plans the heuristic tiles and the call succeeds. */
static void expect_heuristic(const char *what)
{
    h_case("%s: heuristic tiles", what);
    int64_t tq, tkv;
    const fa_status st = run_flash(NULL, &g_p.args, 2, &tq, &tkv, NULL);
    CHECK(st == FA_OK, "status %d (%s)", (int)st, fa_status_string(st));
    CHECK(tq == g_hq && tkv == g_hkv, "tiles %lldx%lld, expected the heuristic %lldx%lld", (long long)tq,
          (long long)tkv, (long long)g_hq, (long long)g_hkv);
}

static void expect_tuned(const char *what)
{
    h_case("%s: tuned tiles", what);
    int64_t tq, tkv;
    const fa_status st = run_flash(NULL, &g_p.args, 2, &tq, &tkv, NULL);
    CHECK(st == FA_OK, "status %d (%s)", (int)st, fa_status_string(st));
    CHECK(tq == g_tq && tkv == g_tkv, "tiles %lldx%lld, expected the tuned %lldx%lld", (long long)tq,
          (long long)tkv, (long long)g_tq, (long long)g_tkv);
}

static double max_diff(const float *a, const float *b, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = a[i] > b[i] ? (double)a[i] - b[i] : (double)b[i] - a[i];
        if (!(d <= m)) m = d; /* NaN wins */
    }
    return m;
}

static void test_tuned_entry(void)
{
    const int64_t n = h_numel(&g_p.args.o);
    float *o1 = malloc((size_t)n * 4), *o2 = malloc((size_t)n * 4);
    if (!CHECK(o1 && o2, "out of memory")) goto done;
    char line[512], other[512], text[2048];

    /* a context that planned before the file existed keeps its (empty) reading */
    h_case("read once per context");
    unlink(g_path);
    fa_context *early = NULL;
    CHECK(fa_context_create(&early) == FA_OK, "fa_context_create");
    int64_t tq, tkv;
    CHECK(run_flash(early, &g_p.args, 2, &tq, &tkv, NULL) == FA_OK && tq == g_hq && tkv == g_hkv,
          "early context: tiles %lldx%lld", (long long)tq, (long long)tkv);

    /* comments, blank lines and another CPU's entry of the same class around ours */
    our_entry(line, sizeof line, g_tq, g_tkv);
    entry(other, sizeof other, g_isa, "f32", 256, 256, 0, 16, 16, "Some Other CPU @ 1.00GHz");
    snprintf(text, sizeof text, "flashattn-tune 1\n# a comment\n\n   # an indented comment\n%s%s", other, line);
    write_text(text);
    expect_tuned("a tuned entry");

    h_case("read once per context");
    CHECK(run_flash(early, &g_p.args, 2, &tq, &tkv, NULL) == FA_OK && tq == g_hq && tkv == g_hkv,
          "a context that read no file before the file existed planned %lldx%lld", (long long)tq, (long long)tkv);
    fa_context_free(early);

    h_case("tuned tiles: results");
    fa_context *ctx = NULL;
    CHECK(fa_context_create(&ctx) == FA_OK, "fa_context_create");
    if (!ctx) goto done;
    CHECK(run_flash(ctx, &g_p.args, 1, &tq, &tkv, o1) == FA_OK && tq == g_tq && tkv == g_tkv,
          "1 thread: tiles %lldx%lld", (long long)tq, (long long)tkv);
    const double err = max_diff(o1, g_ref, n);
    CHECK(err <= 1e-4, "tuned flash vs reference: max |o - o_ref| = %g", err);
    /* the file is not read again: deleting it changes nothing for this context */
    unlink(g_path);
    CHECK(run_flash(ctx, &g_p.args, 2, &tq, &tkv, o2) == FA_OK && tq == g_tq && tkv == g_tkv,
          "2 threads, file deleted: tiles %lldx%lld", (long long)tq, (long long)tkv);
    CHECK(memcmp(o1, o2, (size_t)n * 4) == 0, "tuned tiles: 1 and 2 threads differ bitwise");

    /* an explicit setting wins over the entry, side by side */
    h_case("override wins over tuned");
    fa_context_set(ctx, FA_PARAM_TILE_Q, 16);
    CHECK(run_flash(ctx, &g_p.args, 2, &tq, &tkv, NULL) == FA_OK && tq == 16 && tkv == g_tkv,
          "tile_q=16 set: tiles %lldx%lld, expected 16x%lld", (long long)tq, (long long)tkv, (long long)g_tkv);
    fa_context_set(ctx, FA_PARAM_TILE_KV, 80);
    CHECK(run_flash(ctx, &g_p.args, 2, &tq, &tkv, NULL) == FA_OK && tq == 16 && tkv == 80,
          "both set: tiles %lldx%lld, expected 16x80", (long long)tq, (long long)tkv);
    fa_context_set(ctx, FA_PARAM_TILE_Q, 0);
    fa_context_set(ctx, FA_PARAM_TILE_KV, 0);
    CHECK(run_flash(ctx, &g_p.args, 2, &tq, &tkv, NULL) == FA_OK && tq == g_tq && tkv == g_tkv,
          "settings back to 0: tiles %lldx%lld", (long long)tq, (long long)tkv);
    fa_context_free(ctx);

    /* CRLF line ends are read too */
    snprintf(text, sizeof text, "flashattn-tune 1\r\n%.*s\r\n", (int)strlen(line) - 1, line);
    write_text(text);
    expect_tuned("CRLF line ends");

done:
    free(o1);
    free(o2);
}

/* The entry applies to its own shape class only: the length buckets, masking. */
static void test_shape_class(void)
{
    char line[512];
    our_entry(line, sizeof line, g_tq, g_tkv);
    char text[2048];
    snprintf(text, sizeof text, "flashattn-tune 1\n%s", line);
    write_text(text);
    fa_forward_args a = g_p.args;
    int64_t tq, tkv;

    h_case("same buckets: Sk = 200, Sq = 129 (both round up to 256)");
    a.k.shape[1] = a.v.shape[1] = 200;
    a.q.shape[1] = a.o.shape[1] = a.lse.shape[2] = 129;
    CHECK(run_flash(NULL, &a, 2, &tq, &tkv, NULL) == FA_OK && tq == g_tq && tkv == g_tkv, "tiles %lldx%lld",
          (long long)tq, (long long)tkv);

    h_case("another Sk bucket: Sk = 128");
    a = g_p.args;
    a.k.shape[1] = a.v.shape[1] = 128;
    CHECK(run_flash(NULL, &a, 2, &tq, &tkv, NULL) == FA_OK && !(tq == g_tq && tkv == g_tkv), "tiles %lldx%lld",
          (long long)tq, (long long)tkv);

    h_case("another rows bucket: Sq = 128");
    a = g_p.args;
    a.q.shape[1] = a.o.shape[1] = a.lse.shape[2] = 128;
    CHECK(run_flash(NULL, &a, 2, &tq, &tkv, NULL) == FA_OK && !(tq == g_tq && tkv == g_tkv), "tiles %lldx%lld",
          (long long)tq, (long long)tkv);

    h_case("masked: causal has no entry");
    a = g_p.args;
    a.causal = FA_CAUSAL_BOTTOM_RIGHT;
    CHECK(run_flash(NULL, &a, 2, &tq, &tkv, NULL) == FA_OK && !(tq == g_tq && tkv == g_tkv), "tiles %lldx%lld",
          (long long)tq, (long long)tkv);
    char masked[512];
    entry(masked, sizeof masked, g_isa, "f32", 256, 256, 1, 32, 32, g_cpu);
    snprintf(text, sizeof text, "flashattn-tune 1\n%s%s", line, masked);
    write_text(text);
    h_case("masked: its own entry");
    CHECK(run_flash(NULL, &a, 2, &tq, &tkv, NULL) == FA_OK && tq == 32 && tkv == 32, "tiles %lldx%lld",
          (long long)tq, (long long)tkv);
    a.causal = FA_CAUSAL_NONE;
    a.window_left = 8;
    CHECK(run_flash(NULL, &a, 2, &tq, &tkv, NULL) == FA_OK && tq == 32 && tkv == 32, "window: tiles %lldx%lld",
          (long long)tq, (long long)tkv);
}

/* Entries of another CPU, ISA path, dtype or head dims are not this call's. */
static void test_foreign(void)
{
    char a[512], b[512], c[512], text[2048];
    entry(a, sizeof a, g_isa, "f32", 256, 256, 0, g_tq, g_tkv, "Some Other CPU @ 1.00GHz");
    entry(b, sizeof b, strcmp(g_isa, "ref") == 0 ? "avx2" : "ref", "f32", 256, 256, 0, g_tq, g_tkv, g_cpu);
    entry(c, sizeof c, g_isa, "bf16", 256, 256, 0, g_tq, g_tkv, g_cpu);
    snprintf(text, sizeof text, "flashattn-tune 1\n%s%s%s", a, b, c);
    write_text(text);
    expect_heuristic("another CPU, another ISA, another dtype");
    snprintf(text, sizeof text,
             "flashattn-tune 1\nisa=%s dtype=f32 d=32 dv=64 sk=256 rows=256 masked=0 tile_q=%lld tile_kv=%lld cpu=%s\n",
             g_isa, (long long)g_tq, (long long)g_tkv, g_cpu);
    write_text(text);
    expect_heuristic("another head dim");
}

static void test_damaged(void)
{
    char line[512], text[4096];
    our_entry(line, sizeof line, g_tq, g_tkv);
    const size_t line_len = strlen(line);

    h_case("no file");
    unlink(g_path);
    expect_heuristic("no file");
    setenv("FLASHATTN_TUNE_FILE", "", 1);
    expect_heuristic("FLASHATTN_TUNE_FILE empty");
    setenv("FLASHATTN_TUNE_FILE", g_dir, 1);
    expect_heuristic("a directory");
    setenv("FLASHATTN_TUNE_FILE", g_path, 1);

    write_text("");
    expect_heuristic("an empty file");

    unsigned char junk[4096];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)h_rng_next(&g_rng);
    write_bytes(g_path, junk, sizeof junk);
    expect_heuristic("garbage bytes");
    memcpy(junk, "flashattn-tune 1\n", 17);
    write_bytes(g_path, junk, sizeof junk);
    expect_heuristic("header, then garbage bytes");

    /* a valid line with a NUL byte in it */
    snprintf(text, sizeof text, "flashattn-tune 1\n%s", line);
    const size_t tl = strlen(text);
    text[tl - 5] = '\0';
    write_bytes(g_path, text, tl);
    expect_heuristic("a NUL byte inside the entry");

    /* the entry cut off anywhere, even just before its newline */
    static const size_t cuts[] = {1, 5, 20, 60, 80};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0] + 2; k++) {
        const size_t cut = k < sizeof cuts / sizeof cuts[0] ? cuts[k] : line_len - 1 - (k - sizeof cuts / sizeof cuts[0]);
        if (cut >= line_len) continue;
        snprintf(text, sizeof text, "flashattn-tune 1\n%.*s", (int)cut, line);
        write_text(text);
        char what[64];
        snprintf(what, sizeof what, "entry cut at byte %zu of %zu", cut, line_len);
        expect_heuristic(what);
    }

    /* bad values, one line each, nothing valid around them */
    const char *bad_values[] = {
        "tile_q=99999999999999999999999999 tile_kv=48",
        "tile_q=32 tile_kv=18446744073709551617",
        "tile_q=9223372036854775807 tile_kv=9223372036854775807",
        "tile_q=-32 tile_kv=48",
        "tile_q=32 tile_kv=-48",
        "tile_q=+32 tile_kv=48",
        "tile_q=0 tile_kv=48",
        "tile_q=32 tile_kv=0",
        "tile_q=5000 tile_kv=48",
        "tile_q=4096 tile_kv=65536",   /* within the settings' bounds, but 1 GiB of tiles */
        "tile_q=32.5 tile_kv=48",
        "tile_q=0x20 tile_kv=48",
        "tile_q= tile_kv=48",
        "tile_q=32 tile_q=32 tile_kv=48", /* repeated */
        "tile_kv=48",                    /* missing */
        "tile_q=32 tile_kv=48 speed=fast", /* unknown field */
    };
    for (size_t k = 0; k < sizeof bad_values / sizeof bad_values[0]; k++) {
        snprintf(text, sizeof text, "flashattn-tune 1\nisa=%s dtype=f32 d=64 dv=64 sk=256 rows=256 masked=0 %s cpu=%s\n",
                 g_isa, bad_values[k], g_cpu);
        write_text(text);
        expect_heuristic(bad_values[k]);
    }
    const char *bad_keys[] = {
        "d=-64 dv=64 sk=256 rows=256 masked=0",
        "d=64 dv=64 sk=300 rows=256 masked=0",  /* not a power of two */
        "d=64 dv=64 sk=256 rows=256 masked=2",
        "d=64 dv=64 sk=256 rows=256 masked=-1",
        "d=64 dv=64 sk=18446744073709551616 rows=256 masked=0",
        "d=0 dv=64 sk=256 rows=256 masked=0",
    };
    for (size_t k = 0; k < sizeof bad_keys / sizeof bad_keys[0]; k++) {
        snprintf(text, sizeof text, "flashattn-tune 1\nisa=%s dtype=f32 %s tile_q=%lld tile_kv=%lld cpu=%s\n", g_isa,
                 bad_keys[k], (long long)g_tq, (long long)g_tkv, g_cpu);
        write_text(text);
        expect_heuristic(bad_keys[k]);
    }
    snprintf(text, sizeof text, "flashattn-tune 1\nisa=%s dtype=f64 d=64 dv=64 sk=256 rows=256 masked=0 tile_q=%lld tile_kv=%lld cpu=%s\n",
             g_isa, (long long)g_tq, (long long)g_tkv, g_cpu);
    write_text(text);
    expect_heuristic("dtype=f64");

    /* headers: a valid entry under a wrong one is not read */
    const char *headers[] = {"flashattn-tune 2\n", "flashattn-tune 0\n", "flashattn-tune\n", "flashattn-tune 1x\n",
                             "flashattn-tune 10\n", "# flashattn-tune 1\n", "", "FLASHATTN-TUNE 1\n", "flashattn-tune 1"};
    for (size_t k = 0; k < sizeof headers / sizeof headers[0]; k++) {
        snprintf(text, sizeof text, "%s%s", headers[k], line);
        write_text(text);
        char what[64];
        snprintf(what, sizeof what, "header '%.*s'", (int)strcspn(headers[k], "\n"), headers[k]);
        expect_heuristic(what);
    }

    /* a 1 MiB line: alone it is survived; a valid entry after it is still read */
    const size_t mib = (size_t)1 << 20;
    char *big = malloc(mib + 2 * sizeof line + 32);
    if (!CHECK(big != NULL, "out of memory")) return;
    size_t len = (size_t)snprintf(big, 32, "flashattn-tune 1\n");
    memset(big + len, 'x', mib);
    len += mib;
    big[len++] = '\n';
    write_bytes(g_path, big, len);
    expect_heuristic("a 1 MiB line");
    /* an entry whose cpu= runs on for a MiB of blanks: too long, not this CPU's */
    len = (size_t)snprintf(big, 2 * sizeof line, "flashattn-tune 1\n%.*s", (int)line_len - 1, line);
    memset(big + len, ' ', mib);
    len += mib;
    big[len++] = '\n';
    write_bytes(g_path, big, len);
    expect_heuristic("an entry padded to 1 MiB");
    len = (size_t)snprintf(big, 32, "flashattn-tune 1\n");
    memset(big + len, 'x', mib);
    len += mib;
    big[len++] = '\n';
    memcpy(big + len, line, line_len);
    len += line_len;
    write_bytes(g_path, big, len);
    expect_tuned("a valid entry after a 1 MiB line");
    free(big);
}

/* stderr goes to the file at path between trace_begin (0: it could not) and trace_end;
 * trace_lines reads back up to max of its lines and returns how many. */
static int trace_begin(const char *path, int *saved, FILE **t)
{
    fflush(stderr);
    *saved = dup(2);
    *t = fopen(path, "w");
    if (*saved < 0 || !*t) return 0;
    dup2(fileno(*t), 2);
    return 1;
}

static void trace_end(int saved, FILE *t)
{
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fclose(t);
}

static int trace_lines(const char *path, char (*lines)[2048], int max)
{
    FILE *r = fopen(path, "r");
    if (!r) return -1;
    int n = 0;
    while (n < max && fgets(lines[n], sizeof lines[n], r)) n++;
    fclose(r);
    return n;
}

/* The verbose trace splits a flash call's CPU time into phases: a decode-sized call
 * (one query row x a GQA group of 4, the small-row path, keys split into 2 chunks)
 * and a prefill call (the wide path) into S:X:P:M, all >= 0 with the scores and P V
 * present (and the merge, for the split call); a backward into S:X:dP:dS:dV:dK:dQ,
 * every product present. */
static void test_verbose_phases(void)
{
    h_case("verbose trace: the phases of decode, prefill and backward");
    char trace[512];
    snprintf(trace, sizeof trace, "%s/phases.txt", g_dir);
    h_problem dec;
    const h_dims d = {.B = 1, .Sq = 1, .Sk = 1500, .Hq = 8, .Hk = 2, .D = 64, .Dv = 64};
    h_problem_alloc(&dec, d, FA_DTYPE_F32, FA_DTYPE_F32);
    h_rng rng;
    h_rng_seed(&rng, 7);
    h_fill_normal(&dec.args.q, &rng, 1.0);
    h_fill_normal(&dec.args.k, &rng, 1.0);
    h_fill_normal(&dec.args.v, &rng, 1.0);
    int saved;
    FILE *t;
    if (!CHECK(trace_begin(trace, &saved, &t), "cannot redirect stderr")) return;
    /* the backward's dO and gradients, f32, for g_p */
    const h_dims gd = g_p.dims;
    const int64_t nq = gd.B * gd.Sq * gd.Hq, nk = gd.B * gd.Sk * gd.Hk;
    float *dout = calloc((size_t)(nq * gd.Dv), 4), *dq = calloc((size_t)(nq * gd.D), 4);
    float *dk = calloc((size_t)(nk * gd.D), 4), *dv = calloc((size_t)(nk * gd.Dv), 4);
    fa_backward_args b = FA_BACKWARD_ARGS_INIT;
    b.fwd = &g_p.args;
    b.do_ = fa_tensor_make(dout, FA_DTYPE_F32, FA_LAYOUT_BSND, gd.B, gd.Sq, gd.Hq, gd.Dv);
    b.dq = fa_tensor_make(dq, FA_DTYPE_F32, FA_LAYOUT_BSND, gd.B, gd.Sq, gd.Hq, gd.D);
    b.dk = fa_tensor_make(dk, FA_DTYPE_F32, FA_LAYOUT_BSND, gd.B, gd.Sk, gd.Hk, gd.D);
    b.dv = fa_tensor_make(dv, FA_DTYPE_F32, FA_LAYOUT_BSND, gd.B, gd.Sk, gd.Hk, gd.Dv);
    if (dout) h_fill_normal(&b.do_, &rng, 1.0);
    fa_context *ctx = NULL;
    fa_status st[3] = {FA_ERR_INVALID_ARGUMENT, FA_ERR_INVALID_ARGUMENT, FA_ERR_INVALID_ARGUMENT};
    if (fa_context_create(&ctx) == FA_OK && dout && dq && dk && dv) {
        fa_context_set(ctx, FA_PARAM_VERBOSE, 1);
        fa_context_set(ctx, FA_PARAM_KV_SPLITS, 2);
        st[0] = h_run(ctx, FA_ALGO_FLASH, 2, &dec.args);
        fa_context_set(ctx, FA_PARAM_KV_SPLITS, 0);
        st[1] = h_run(ctx, FA_ALGO_FLASH, 2, &g_p.args);
        st[2] = fa_backward(ctx, &b);
    }
    fa_context_free(ctx);
    trace_end(saved, t);
    h_problem_free(&dec);
    free(dout), free(dq), free(dk), free(dv);
    CHECK(st[0] == FA_OK && st[1] == FA_OK && st[2] == FA_OK, "the calls failed: %s, %s, %s",
          fa_status_string(st[0]), fa_status_string(st[1]), fa_status_string(st[2]));
    char lines[3][2048] = {{0}};
    const int n = trace_lines(trace, lines, 3);
    unlink(trace);
    if (!CHECK(n == 3, "%d trace lines, expected 3", n)) return;
    for (int i = 0; i < 2; i++) {
        const char *ph = strstr(lines[i], ",phases:");
        double sc = -1, sm = -1, pv = -1, mg = -1;
        CHECK(ph && sscanf(ph, ",phases:%lf:%lf:%lf:%lfms,", &sc, &sm, &pv, &mg) == 4, "%s: no phases in %s",
              i ? "prefill" : "decode", lines[i]);
        CHECK(sc > 0 && sm >= 0 && pv > 0 && (i ? mg == 0 : mg > 0),
              "%s phases %g %g %g %g: scores, P V (and the merge of a split call) must take time",
              i ? "prefill" : "decode", sc, sm, pv, mg);
    }
    const char *ph = strstr(lines[2], ",phases:");
    double x[7] = {-1, -1, -1, -1, -1, -1, -1};
    CHECK(strncmp(lines[2], "flashattn_verbose,backward,", 27) == 0 && ph &&
              sscanf(ph, ",phases:%lf:%lf:%lf:%lf:%lf:%lf:%lfms,", &x[0], &x[1], &x[2], &x[3], &x[4], &x[5],
                     &x[6]) == 7,
          "backward: no 7 phases in %s", lines[2]);
    CHECK(x[0] > 0 && x[1] >= 0 && x[2] > 0 && x[3] >= 0 && x[4] > 0 && x[5] > 0 && x[6] > 0,
          "backward phases %g %g %g %g %g %g %g: S, dP, dV, dK and dQ must take time", x[0], x[1], x[2], x[3], x[4],
          x[5], x[6]);
}

/* The verbose trace's path: is the path the call ran. bf16 q over a paged bf16 cache or
 * an int8 cache runs the wide f32 path (the pair kernels and the fused kernel read
 * neither pages nor codes), so it says f32 on every table, bf16 dot products and
 * the fused kernel active or not; the same call over dense bf16 K/V says bf16-* where
 * the context's bf16 dot products are active, else f32. */
static void test_verbose_paths(void)
{
    h_case("verbose trace: the path of bf16 calls over pages and int8 codes");
    enum { SQ = 64, SK = 128, H = 2, D = 64, PAGE = 32 };
    char trace[512];
    snprintf(trace, sizeof trace, "%s/paths.txt", g_dir);
    uint16_t *q = calloc(SQ * H * D, 2), *o = calloc(SQ * H * D, 2), *kv16 = calloc(2 * SK * H * D, 2);
    int8_t *kv8 = calloc(2 * SK * H * D, 1);
    float *scales = malloc(2 * SK * H * sizeof *scales);
    if (!CHECK(q && o && kv16 && kv8 && scales, "out of memory")) {
        free(q), free(o), free(kv16), free(kv8), free(scales);
        return;
    }
    for (int64_t i = 0; i < 2 * SK * H; i++) scales[i] = 0.01f;
    static const int32_t seqlens[1] = {SK}, pages[SK / PAGE] = {2, 0, 3, 1};
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = fa_tensor_make(q, FA_DTYPE_BF16, FA_LAYOUT_BSND, 1, SQ, H, D);
    a.o = fa_tensor_make(o, FA_DTYPE_BF16, FA_LAYOUT_BSND, 1, SQ, H, D);
    fa_kv_cache paged = FA_KV_CACHE_INIT, coded = FA_KV_CACHE_INIT;
    paged.k = fa_tensor_make(kv16, FA_DTYPE_BF16, FA_LAYOUT_BSND, SK / PAGE, PAGE, H, D);
    paged.v = fa_tensor_make(kv16 + SK * H * D, FA_DTYPE_BF16, FA_LAYOUT_BSND, SK / PAGE, PAGE, H, D);
    paged.seqlens = seqlens;
    paged.block_table = pages;
    paged.max_pages = SK / PAGE;
    coded.k = fa_tensor_make(kv8, FA_DTYPE_I8, FA_LAYOUT_BSND, 1, SK, H, D);
    coded.v = fa_tensor_make(kv8 + SK * H * D, FA_DTYPE_I8, FA_LAYOUT_BSND, 1, SK, H, D);
    coded.k_scale = fa_tensor_make(scales, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, SK, H, 1);
    coded.v_scale = fa_tensor_make(scales + SK * H, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, SK, H, 1);
    coded.seqlens = seqlens;
    const fa_tensor dense_k = fa_tensor_make(kv16, FA_DTYPE_BF16, FA_LAYOUT_BSND, 1, SK, H, D),
                    dense_v = fa_tensor_make(kv16 + SK * H * D, FA_DTYPE_BF16, FA_LAYOUT_BSND, 1, SK, H, D);
    const fa_kv_cache *caches[3] = {NULL, &paged, &coded};
    static const char *const what[3] = {"dense bf16 K/V", "a paged bf16 cache", "an int8 cache"};
    int saved;
    FILE *t;
    const int traced = trace_begin(trace, &saved, &t);
    fa_context *ctx = NULL;
    fa_status st[3] = {FA_ERR_INVALID_ARGUMENT, FA_ERR_INVALID_ARGUMENT, FA_ERR_INVALID_ARGUMENT};
    int64_t active = -1;
    if (traced && fa_context_create(&ctx) == FA_OK) {
        fa_context_set(ctx, FA_PARAM_VERBOSE, 1);
        fa_context_set(ctx, FA_PARAM_QUANT_MATMUL, 0);
        fa_context_get(ctx, FA_PARAM_BF16_DOT_ACTIVE, &active);
        for (int c = 0; c < 3; c++) {
            a.k = c ? (fa_tensor){0} : dense_k;
            a.v = c ? (fa_tensor){0} : dense_v;
            a.kv_cache = caches[c];
            st[c] = h_run(ctx, FA_ALGO_FLASH, 2, &a);
        }
    }
    fa_context_free(ctx);
    if (traced) trace_end(saved, t);
    free(q), free(o), free(kv16), free(kv8), free(scales);
    char lines[3][2048] = {{0}};
    const int n = traced ? trace_lines(trace, lines, 3) : -1;
    unlink(trace);
    if (!CHECK(n == 3 && active >= 0, "%d trace lines, expected 3 (bf16 dot active: %lld)", n, (long long)active))
        return;
    for (int c = 0; c < 3; c++) {
        const char *at = strstr(lines[c], ",path:");
        char path[32] = "";
        if (at) sscanf(at, ",path:%31[^,]", path);
        const int ok = c == 0 && active ? strncmp(path, "bf16-", 5) == 0 : strcmp(path, "f32") == 0;
        CHECK(st[c] == FA_OK && ok, "%s (bf16 dot %s): status %s, path '%s'", what[c], active ? "active" : "off",
              fa_status_string(st[c]), path);
    }
}

/* The verbose trace (stderr) says where the tiles came from, and what the file gave
 * once per context. stderr goes to a file for the calls. */
static void test_verbose(void)
{
    char line[512], text[1024], trace[512];
    our_entry(line, sizeof line, g_tq, g_tkv);
    snprintf(text, sizeof text, "flashattn-tune 1\n%s", line);
    write_text(text);
    snprintf(trace, sizeof trace, "%s/trace.txt", g_dir);

    for (int damaged = 0; damaged < 2; damaged++) {
        h_case("verbose trace, %s file", damaged ? "a damaged" : "a good");
        if (damaged) write_text("flashattn-tune 7\n");
        int saved;
        FILE *t;
        if (!CHECK(trace_begin(trace, &saved, &t), "cannot redirect stderr")) return;
        fa_context *ctx = NULL;
        int64_t tq, tkv;
        if (fa_context_create(&ctx) == FA_OK) {
            fa_context_set(ctx, FA_PARAM_VERBOSE, 1);
            run_flash(ctx, &g_p.args, 2, &tq, &tkv, NULL);
            run_flash(ctx, &g_p.args, 2, &tq, &tkv, NULL);
            fa_context_set(ctx, FA_PARAM_TILE_Q, 16);
            run_flash(ctx, &g_p.args, 2, &tq, &tkv, NULL);
            fa_context_free(ctx);
        }
        trace_end(saved, t);

        char lines[3][2048] = {{0}};
        const int n = trace_lines(trace, lines, 3);
        if (!CHECK(n == 3, "%d trace lines, expected 3", n)) return;
        char want[128];
        if (!damaged) {
            snprintf(want, sizeof want, ",tiles:%lldx%lld (tuned),tune:read ", (long long)g_tq, (long long)g_tkv);
            CHECK(strstr(lines[0], want) != NULL, "first call: no '%s' in %s", want, lines[0]);
            snprintf(want, sizeof want, ",tiles:%lldx%lld (tuned),threads:", (long long)g_tq, (long long)g_tkv);
            CHECK(strstr(lines[1], want) != NULL, "second call: no '%s' in %s", want, lines[1]);
            snprintf(want, sizeof want, ",tiles:16x%lld (override/tuned),threads:", (long long)g_tkv);
            CHECK(strstr(lines[2], want) != NULL, "override: no '%s' in %s", want, lines[2]);
        } else {
            snprintf(want, sizeof want, ",tiles:%lldx%lld (heuristic),tune:ignored ", (long long)g_hq, (long long)g_hkv);
            CHECK(strstr(lines[0], want) != NULL, "first call: no '%s' in %s", want, lines[0]);
            CHECK(strstr(lines[0], "version") != NULL, "first call does not say why: %s", lines[0]);
            snprintf(want, sizeof want, ",tiles:%lldx%lld (heuristic),threads:", (long long)g_hq, (long long)g_hkv);
            CHECK(strstr(lines[1], want) != NULL, "second call: no '%s' in %s", want, lines[1]);
            snprintf(want, sizeof want, ",tiles:16x%lld (override/heuristic),threads:", (long long)g_hkv);
            CHECK(strstr(lines[2], want) != NULL, "override: no '%s' in %s", want, lines[2]);
        }
    }
    unlink(trace);
}

/* ---------------------------------------------------------------- fa_tune */

static int g_progress_calls, g_progress_total, g_progress_last;

static void count_progress(void *user, int done, int total, int64_t tq, int64_t tkv, double ms)
{
    (void)tq;
    (void)tkv;
    (void)ms;
    int *calls = user;
    ++*calls;
    g_progress_total = total;
    g_progress_last = done;
}

/* The file's text, NUL-terminated, into buf; its length or -1. */
static long read_text(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    const size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return (long)n;
}

/* Sweeps g_p over two candidate pairs into *r, saving to g_path when save. */
static fa_status tune_small(fa_context *ctx, int save, fa_tune_result *r)
{
    static const int64_t qs[] = {16, 32}, kvs[] = {48};
    fa_tune_options opt = FA_TUNE_OPTIONS_INIT;
    opt.tile_qs = qs;
    opt.n_tile_qs = 2;
    opt.tile_kvs = kvs;
    opt.n_tile_kvs = 1;
    opt.runs = 1;
    opt.save = save;
    opt.path = g_path;
    opt.progress = count_progress;
    opt.user = &g_progress_calls;
    g_progress_calls = 0;
    return fa_tune(ctx, &g_p.args, &opt, r);
}

static void test_fa_tune_saves(void)
{
    fa_tune_result *r = calloc(1, sizeof *r);
    char other[512], stale[512], want[512], text[4096];
    if (!CHECK(r != NULL, "out of memory")) return;
    fa_context *ctx = NULL;
    if (!CHECK(fa_context_create(&ctx) == FA_OK, "fa_context_create")) goto done;

    /* another CPU's entry of the same class is kept; our stale entry is replaced */
    h_case("fa_tune: saves its best pair");
    entry(other, sizeof other, g_isa, "f32", 256, 256, 0, 16, 16, "Some Other CPU @ 1.00GHz");
    our_entry(stale, sizeof stale, 8, 8);
    snprintf(text, sizeof text, "flashattn-tune 1\n%s%s", other, stale);
    write_text(text);
    fa_context_set(ctx, FA_PARAM_TILE_Q, 7);
    fa_context_set(ctx, FA_PARAM_ALGO, FA_ALGO_STANDARD);
    r->struct_size = sizeof *r;
    fa_status st = tune_small(ctx, 1, r);
    if (!CHECK(st == FA_OK, "fa_tune: %s: %s", fa_status_string(st), fa_context_error(ctx))) goto done;
    CHECK(r->saved == 1 && strcmp(r->path, g_path) == 0, "saved %d to '%s'", r->saved, r->path);
    CHECK(g_progress_calls == 3 && g_progress_total == 3 && g_progress_last == 3, "progress: %d calls, %d of %d",
          g_progress_calls, g_progress_last, g_progress_total);
    CHECK(r->heuristic.asked_q == 0 && r->heuristic.tile_q == g_hq && r->heuristic.tile_kv == g_hkv,
          "heuristic %lldx%lld", (long long)r->heuristic.tile_q, (long long)r->heuristic.tile_kv);
    CHECK(r->n_timings >= 1 && r->n_timings <= 3 && r->best.ms > 0 && r->best.ms <= r->heuristic.ms,
          "%d timings, best %g ms, heuristic %g ms", r->n_timings, r->best.ms, r->heuristic.ms);
    CHECK(strcmp(r->cpu, g_cpu) == 0, "cpu '%s'", r->cpu);
    int64_t v = -1;
    CHECK(fa_context_get(ctx, FA_PARAM_TILE_Q, &v) == FA_OK && v == 7, "TILE_Q setting after tune: %lld",
          (long long)v);
    CHECK(fa_context_get(ctx, FA_PARAM_ALGO, &v) == FA_OK && v == FA_ALGO_STANDARD, "ALGO after tune: %lld",
          (long long)v);

    /* the file, read as text in the documented format */
    h_case("fa_tune: the file it wrote");
    our_entry(want, sizeof want, r->saved_tile_q, r->saved_tile_kv);
    CHECK(read_text(g_path, text, sizeof text) > 0, "cannot read %s", g_path);
    CHECK(strncmp(text, "flashattn-tune 1\n", 17) == 0, "no version line: %s", text);
    CHECK(strstr(text, want) != NULL, "no '%s' in:\n%s", want, text);
    CHECK(strstr(text, other) != NULL, "the other CPU's entry is gone:\n%s", text);
    CHECK(strstr(text, stale) == NULL || strcmp(stale, want) == 0, "the stale entry is still there:\n%s", text);
    CHECK(text[strlen(text) - 1] == '\n', "the file does not end with a newline");

    /* a new context plans the saved tiles */
    g_tq = r->saved_tile_q;
    g_tkv = r->saved_tile_kv;
    expect_tuned("fa_tune's entry");
done:
    fa_context_free(ctx);
    free(r);
}

static void test_fa_tune_misuse(void)
{
    fa_tune_result *r = calloc(1, sizeof *r), *before = calloc(1, sizeof *r);
    char text[4096];
    if (!CHECK(r && before, "out of memory")) goto out;
    fa_context *ctx = NULL;
    if (!CHECK(fa_context_create(&ctx) == FA_OK, "fa_context_create")) goto out;

    h_case("fa_tune: a file that is not a tune file");
    write_text("not a tune file\n");
    memset(r, 0x5a, sizeof *r);
    r->struct_size = sizeof *r;
    memcpy(before, r, sizeof *r);
    fa_status st = tune_small(ctx, 1, r);
    CHECK(st == FA_ERR_IO, "status %s", fa_status_string(st));
    CHECK(g_progress_calls == 0, "%d candidates ran", g_progress_calls);
    CHECK(memcmp(r, before, sizeof *r) == 0, "the result was written");
    CHECK(read_text(g_path, text, sizeof text) > 0 && strcmp(text, "not a tune file\n") == 0, "the file changed");
    st = tune_small(ctx, 0, r);
    CHECK(st == FA_OK && r->saved == 0, "--no-save on it: %s, saved %d", fa_status_string(st), r->saved);
    CHECK(read_text(g_path, text, sizeof text) > 0 && strcmp(text, "not a tune file\n") == 0, "the file changed");

    h_case("fa_tune: misuse leaves the result untouched");
    memcpy(r, before, sizeof *r);
    fa_forward_args bad = g_p.args;
    bad.k.shape[3] = 32; /* D of k differs from q's */
    fa_tune_options opt = FA_TUNE_OPTIONS_INIT;
    opt.save = 0;
    st = fa_tune(ctx, &bad, &opt, r);
    CHECK(st == FA_ERR_SHAPE_MISMATCH, "bad shapes: %s", fa_status_string(st));
    static const int64_t huge[] = {5000};
    opt.tile_qs = huge;
    opt.n_tile_qs = 1;
    st = fa_tune(ctx, &g_p.args, &opt, r);
    CHECK(st == FA_ERR_INVALID_ARGUMENT, "tile_q 5000: %s", fa_status_string(st));
    opt = (fa_tune_options)FA_TUNE_OPTIONS_INIT;
    opt.struct_size = 8;
    st = fa_tune(ctx, &g_p.args, &opt, r);
    CHECK(st == FA_ERR_STRUCT_SIZE, "options->struct_size 8: %s", fa_status_string(st));
    CHECK(memcmp(r, before, sizeof *r) == 0, "the result was written");
    r->struct_size = 8;
    CHECK(fa_tune(ctx, &g_p.args, NULL, r) == FA_ERR_STRUCT_SIZE, "result->struct_size 8");
    CHECK(fa_tune(ctx, &g_p.args, NULL, NULL) == FA_ERR_NULL_POINTER, "result NULL");
    CHECK(fa_tune(NULL, &g_p.args, NULL, r) == FA_ERR_NULL_CONTEXT, "ctx NULL");
    fa_forward_args empty = g_p.args;
    empty.q.shape[1] = empty.o.shape[1] = empty.lse.shape[2] = 0;
    r->struct_size = sizeof *r;
    opt = (fa_tune_options)FA_TUNE_OPTIONS_INIT;
    opt.save = 0;
    CHECK(fa_tune(ctx, &empty, &opt, r) == FA_ERR_INVALID_ARGUMENT, "an empty call");
    fa_context_free(ctx);
out:
    free(r);
    free(before);
}

int main(void)
{
    h_rng_seed(&g_rng, h_env_u64("FA_TEST_SEED", 9));
    h_case("setup");
    fa_context *ctx = NULL;
    const fa_status created = h_context_create(&ctx);
    if (!CHECK(created == FA_OK && ctx, "fa_context_create: %s", fa_status_string(created))) return h_summary();
    snprintf(g_isa, sizeof g_isa, "%s", fa_context_isa(ctx));
    /* the key's CPU model is the library's detection (fa_cpu_model), not re-derived here */
    snprintf(g_cpu, sizeof g_cpu, "%s", fa_cpu_model());
    printf("cpu model '%s'\n", g_cpu);

    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/fa_test_tune.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!CHECK(mkdtemp(g_dir) != NULL, "mkdtemp %s", g_dir)) return h_summary();
    snprintf(g_path, sizeof g_path, "%s/tune.txt", g_dir);
    setenv("FLASHATTN_TUNE_FILE", g_path, 1);

    /* B=1, Sq=Sk=256, 2 heads, D=Dv=64: rows and sk buckets 256, unmasked */
    const h_dims d = {1, 256, 256, 2, 2, 64, 64};
    h_problem_alloc(&g_p, d, FA_DTYPE_F32, FA_DTYPE_F32);
    h_fill_normal(&g_p.args.q, &g_rng, 1.0);
    h_fill_normal(&g_p.args.k, &g_rng, 1.0);
    h_fill_normal(&g_p.args.v, &g_rng, 1.0);
    const int64_t n = h_numel(&g_p.args.o);
    g_ref = malloc((size_t)n * 4);
    if (!CHECK(g_ref != NULL, "out of memory")) return h_summary();
    fa_status st = h_run(ctx, FA_ALGO_REFERENCE, 1, &g_p.args);
    CHECK(st == FA_OK, "reference: %s", fa_status_string(st));
    memcpy(g_ref, g_p.args.o.data, (size_t)n * 4);
    fa_context_free(ctx);

    unlink(g_path);
    st = run_flash(NULL, &g_p.args, 2, &g_hq, &g_hkv, NULL);
    CHECK(st == FA_OK && g_hq > 0 && g_hkv > 0, "heuristic run: %s", fa_status_string(st));
    g_tq = g_hq == 32 ? 16 : 32;
    g_tkv = g_hkv == 48 ? 80 : 48;
    printf("heuristic tiles %lldx%lld, tuned entries ask for %lldx%lld\n", (long long)g_hq, (long long)g_hkv,
           (long long)g_tq, (long long)g_tkv);

    test_tuned_entry();
    test_shape_class();
    test_foreign();
    test_damaged();
    test_verbose();
    test_verbose_phases();
    test_verbose_paths();
    test_fa_tune_saves();
    test_fa_tune_misuse();

    unlink(g_path);
    rmdir(g_dir);
    free(g_ref);
    h_problem_free(&g_p);
    return h_summary();
}
