/*
 * bench_modes.c: `flashattn bench --decode` and `flashattn bench --varlen`
 * (see bench_modes.h and bench/README.md).
 *
 * Both count FLOPs as the rest of bench does, with fa_forward_work on the very call
 * they time (docs/semantics.md section 9): 2*(D+Dv) per (i, j) pair the masks keep,
 * times Hq, summed over the sequences at their own lengths. Decode is
 * also judged by bandwidth: the bytes of K and V (and int8 scales) that the
 * call must read, i.e. the cached rows some query row can see, over the time,
 * against the streaming read bandwidth fa_probe measures on the same threads.
 */
#include "bench_modes.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_profile.h"
#include "measure.h"
#include "traffic.h"

/* Bench's usual runs for a decode call; varlen calls are whole prefills
 * (seconds each at the defaults), so they default to fewer, like --seqs. */
enum { VARLEN_DEFAULT_RUNS = 3, VARLEN_LIST_MAX = 1024 };

void bench_mode_defaults(bench_mode_opts *o)
{
    memset(o, 0, sizeof *o);
    o->q_rows = 1;
    o->cache_lo = o->cache_hi = 16384;
    o->page_size = 0;
    o->kv_dtype = FA_DTYPE_F16;
    o->chunks = 4;
    o->chunk_len = 512;
    o->decodes = 60;
}

void bench_mode_free(bench_mode_opts *o)
{
    free(o->varlen);
    o->varlen = NULL;
    o->n_varlen = 0;
}

/* ------------------------------------------------------------ flag parsing */

static void bad(const char *flag, const char *value, const char *want)
{
    if (value == NULL)
        fprintf(stderr, "flashattn bench: %s needs a value (%s)\n", flag, want);
    else
        fprintf(stderr, "flashattn bench: bad value '%s' for %s (want %s)\n", value, flag, want);
    fprintf(stderr, "Run 'flashattn bench --help' for the flags.\n");
}

/* An integer flag `name` in lo..hi into *out (`want` says so when it is not): 1 taken,
 * -1 bad (said on stderr), 0 when argv[*i] is another flag. */
static int take_int(const char *name, int64_t lo, int64_t hi, const char *want, int argc, char **argv, int *i,
                    int64_t *out)
{
    const char *value = NULL;
    if (!cli_take_value(name, argc, argv, i, &value)) return 0;
    if (cli_parse_i64(value, out) != 0 || *out < lo || *out > hi) {
        bad(name, value, want);
        return -1;
    }
    return 1;
}

/* "A<sep>B" into two integers; 0 or -1. */
static int parse_pair(const char *text, char sep, int64_t *a, int64_t *b)
{
    const char *mid = text ? strchr(text, sep) : NULL;
    char left[32];
    if (mid == NULL || mid == text || (size_t)(mid - text) >= sizeof left)
        return -1;
    memcpy(left, text, (size_t)(mid - text));
    left[mid - text] = '\0';
    return cli_parse_i64(left, a) == 0 && cli_parse_i64(mid + 1, b) == 0 ? 0 : -1;
}

/* N or LO:HI, 1 <= LO <= HI <= INT32_MAX (the library's seqlens are int32). */
static int parse_range(const char *text, int64_t *lo, int64_t *hi)
{
    if (text && strchr(text, ':')) {
        if (parse_pair(text, ':', lo, hi) != 0)
            return -1;
    } else if (cli_parse_i64(text, lo) == 0) {
        *hi = *lo;
    } else {
        return -1;
    }
    return *lo >= 1 && *hi >= *lo && *hi <= INT32_MAX ? 0 : -1;
}

/* N:LO-HI (a generator, expanded once the seed is known), or a comma list. */
static int parse_varlen(const char *text, bench_mode_opts *o)
{
    free(o->varlen);
    o->varlen = NULL;
    o->n_varlen = o->gen_n = 0;
    const char *colon = text ? strchr(text, ':') : NULL;
    if (colon) {
        char count[32];
        int64_t n, lo, hi;
        if (colon == text || (size_t)(colon - text) >= sizeof count)
            return -1;
        memcpy(count, text, (size_t)(colon - text));
        count[colon - text] = '\0';
        if (cli_parse_i64(count, &n) != 0 || n < 1 || n > BENCH_MAX_SEQS ||
            parse_pair(colon + 1, '-', &lo, &hi) != 0 || lo < 1 || hi < lo || hi > INT32_MAX)
            return -1;
        o->gen_n = n;
        o->gen_lo = lo;
        o->gen_hi = hi;
        return 0;
    }
    int64_t list[VARLEN_LIST_MAX];
    int k = cli_parse_i64_list(text, 1, list, VARLEN_LIST_MAX);
    if (k < 1)
        return -1;
    for (int i = 0; i < k; i++)
        if (list[i] > INT32_MAX)
            return -1;
    o->varlen = malloc((size_t)k * sizeof *o->varlen);
    if (!o->varlen)
        return -1;
    memcpy(o->varlen, list, (size_t)k * sizeof *list);
    o->n_varlen = k;
    return 0;
}

int bench_mode_flag(bench_mode_opts *o, int argc, char **argv, int *i)
{
    const char *value = NULL;
    if (strcmp(argv[*i], "--decode") == 0) {
        o->decode = 1;
        return 1;
    }
    if (strcmp(argv[*i], "--mla") == 0) {
        o->mla = 1;
        o->decode_flag_seen = 1;
        return 1;
    }
    if (strcmp(argv[*i], "--warm") == 0) {
        o->warm = 1;
        o->decode_flag_seen = 1;
        return 1;
    }
    int r = take_int("--q-rows", 1, INT32_MAX, "an integer >= 1", argc, argv, i, &o->q_rows);
    if (r != 0) {
        o->decode_flag_seen = 1;
        return r;
    }
    if (cli_take_value("--cache-len", argc, argv, i, &value) ||
        cli_take_value("--cache-lens", argc, argv, i, &value)) {
        o->decode_flag_seen = 1;
        if (parse_range(value, &o->cache_lo, &o->cache_hi) != 0) {
            bad("--cache-len", value, "N or LO:HI with 1 <= LO <= HI < 2^31");
            return -1;
        }
        o->cache_len_given = 1;
        return 1;
    }
    if ((r = take_int("--page-size", 0, INT32_MAX, "an integer >= 0; 0 = contiguous", argc, argv, i,
                      &o->page_size)) != 0) {
        o->decode_flag_seen = 1;
        if (r > 0) o->page_size_given = 1;
        return r;
    }
    if (cli_take_value("--kv-dtype", argc, argv, i, &value)) {
        o->decode_flag_seen = 1;
        static const struct { const char *name; fa_dtype dtype; } names[] = {
            {"f32", FA_DTYPE_F32}, {"f16", FA_DTYPE_F16}, {"bf16", FA_DTYPE_BF16},
            {"i8", FA_DTYPE_I8},   {"int8", FA_DTYPE_I8}, {"f8e4m3", FA_DTYPE_F8E4M3}, {"f8e5m2", FA_DTYPE_F8E5M2},
        };
        for (size_t n = 0; value && n < sizeof names / sizeof names[0]; n++)
            if (strcmp(value, names[n].name) == 0) {
                o->kv_dtype = names[n].dtype;
                return 1;
            }
        bad("--kv-dtype", value, "f32 | f16 | bf16 | i8 | f8e4m3 | f8e5m2");
        return -1;
    }
    {
        int64_t lo = 0, hi = 256;
        fa_param_bounds(FA_PARAM_KV_SPLITS, &lo, &hi);
        char want[64];
        snprintf(want, sizeof want, "an integer %lld..%lld; 0 = planned", (long long)lo, (long long)hi);
        if ((r = take_int("--kv-splits", lo, hi, want, argc, argv, i, &o->kv_splits)) != 0) {
            if (r > 0) o->kv_splits_given = 1;
            return r;
        }
    }
    if (strcmp(argv[*i], "--mixed") == 0) {
        o->mixed = 1;
        return 1;
    }
    {
        static const char *const names[] = {"--chunks", "--chunk-len", "--decodes"};
        int64_t *const fields[] = {&o->chunks, &o->chunk_len, &o->decodes};
        for (int n = 0; n < 3; n++)
            if ((r = take_int(names[n], 0, 65536, "an integer 0..65536", argc, argv, i, fields[n])) != 0) {
                o->mixed_flag_seen = 1;
                return r;
            }
    }
    if (cli_take_value("--varlen", argc, argv, i, &value)) {
        o->varlen_given = 1;
        if (parse_varlen(value, o) != 0) {
            bad("--varlen", value,
                "L,L,... (at most 1024) or N:LO-HI with 1 <= LO <= HI < 2^31, N <= 65536");
            return -1;
        }
        return 1;
    }
    return 0;
}

void bench_mode_usage(FILE *f)
{
    fprintf(f,
            "Decoding (--decode): q (B, --q-rows, Hq, D) in --dtype against a KV cache built\n"
            "once from random values; Hk defaults to 8 here. Reports the median latency, the\n"
            "K/V bytes the call must read (cached rows any query row sees x Hk x (D+Dv) x\n"
            "element size, + 8 bytes of int8 scales per row and kv head) per second, that as\n"
            "%% of the streaming read bandwidth fa_probe measures on the same threads,\n"
            "GFLOP/s and %% of the fp32 FMA peak, and the KV splits that ran.\n"
            "  --decode           decoding mode\n"
            "  --q-rows N         query rows per sequence                [1]\n"
            "  --cache-len N      cached keys per sequence               [16384]\n"
            "  --cache-len LO:HI  ragged: B lengths evenly spaced over LO..HI, in an order\n"
            "                     shuffled by --seed (--cache-lens is the same flag)\n"
            "  --page-size N      0 = one contiguous (B, max len, Hk, D) cache; N > 0 = a\n"
            "                     pool of N-row pages in a shuffled order [0]\n"
            "  --kv-dtype T       f32 | f16 | bf16 | i8 | f8e4m3 | f8e5m2 (int8 and fp8\n"
            "                     with an f32 scale per row and kv head) [f16]\n"
            "  --kv-splits N      force FA_PARAM_KV_SPLITS; 0 = planned  [0]\n"
            "  --mla              DeepSeek V2/V3's absorbed MLA decode: Hq = 128, Hk = 1,\n"
            "                     D = 576, Dv = 512 (these override --heads, --kv-heads,\n"
            "                     --dim, --dim-v), one latent cache whose V is the first\n"
            "                     Dv columns of K's rows (fa_kv_cache.v_in_k); GB/s counts\n"
            "                     each latent row (D values, + 4 B of int8 scale) once\n"
            "  --warm             no flush: repeated calls may find K/V in the last-level\n"
            "                     cache. By default each timed call follows an untimed read\n"
            "                     of twice the LLC (--cold=BYTES sets the amount), so K/V\n"
            "                     come from main memory, as in a model whose other layers'\n"
            "                     caches pass through in between\n"
            "Variable length (--varlen): packed prefill with cu_seqlens (q, k, v in --dtype,\n"
            "Sq = Sk per sequence; --causal is per sequence), then one dense batch of the same\n"
            "work: B = the number of sequences, all of the one length whose kept (i, j) pairs,\n"
            "times B, come closest to the varlen call's; prints both GFLOP/s and their ratio.\n"
            "--runs defaults to %d here.\n"
            "  --varlen L,L,...   the sequence lengths (at most %d)\n"
            "  --varlen N:LO-HI   N lengths evenly spaced over LO..HI, shuffled by --seed\n"
            "Mixed batch (--mixed): one serving step of chunked prefill, timed three ways,\n"
            "interleaved run by run (--runs defaults to %d): one call with q packed by\n"
            "cu_seqlens_q (the chunks, then one row per decoding sequence); the same work\n"
            "as two calls (a varlen prefill of the chunks, then a decode batch); and one call\n"
            "per sequence. Every sequence holds --cache-len keys in one paged cache\n"
            "(--page-size, default 16, pages shuffled; --kv-dtype, default f16), a chunk's\n"
            "rows being the last of its keys (causal bottom-right); q in --dtype; Hk\n"
            "defaults to 8. Prints the medians, their ratios and whether the outputs agree.\n"
            "  --mixed            mixed-batch mode\n"
            "  --chunks N         prefill chunks                         [4]\n"
            "  --chunk-len N      query rows per chunk                   [512]\n"
            "  --decodes N        decoding sequences (one row each)      [60]\n"
            "  --cache-len N      cached keys per sequence               [4096]\n\n",
            VARLEN_DEFAULT_RUNS, VARLEN_LIST_MAX, VARLEN_DEFAULT_RUNS + 2);
}

/* ------------------------------------------------------------ shared bits */

/* splitmix64: small, seedable and the same everywhere. */
static uint64_t mix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* n lengths evenly spaced over [lo, hi] (both ends included; n = 1: the middle),
 * then shuffled (Fisher-Yates) by seed: deterministic, and a ragged batch whose
 * long sequences are not all at one end. */
static void spread_lengths(int64_t lo, int64_t hi, int64_t n, int64_t seed, int64_t *out)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = n == 1 ? lo + (hi - lo) / 2
                        : lo + ((hi - lo) * 2 * i + (n - 1)) / (2 * (n - 1));
    uint64_t st = (uint64_t)seed * 0x2545f4914f6cdd1dull ^ 0x6c656e73ull;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(mix64(&st) % (uint64_t)(i + 1));
        int64_t t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
}

int bench_mode_finish(bench_mode_opts *o, cli_shape *s, int seq_given)
{
    if (o->decode + o->varlen_given + o->mixed > 1) {
        fprintf(stderr, "flashattn bench: --decode, --varlen and --mixed are separate modes; pick one\n");
        return -1;
    }
    if (!o->decode && o->decode_flag_seen && !(o->mixed && !o->warm && !o->mla && o->q_rows == 1)) {
        fprintf(stderr, "flashattn bench: --q-rows, --cache-len, --page-size, --kv-dtype, --mla and "
                        "--warm need --decode (--cache-len, --page-size and --kv-dtype also go with --mixed)\n");
        return -1;
    }
    if (!o->mixed && o->mixed_flag_seen) {
        fprintf(stderr, "flashattn bench: --chunks, --chunk-len and --decodes need --mixed\n");
        return -1;
    }
    if (o->mixed) {
        if (seq_given) {
            fprintf(stderr, "flashattn bench: --seq and --seq-kv do not apply with --mixed (use "
                            "--chunk-len and --cache-len)\n");
            return -1;
        }
        if (o->cache_lo != o->cache_hi) {
            fprintf(stderr, "flashattn bench: --mixed takes one --cache-len N\n");
            return -1;
        }
        if (!o->cache_len_given)
            o->cache_lo = o->cache_hi = 4096;
        if (!o->page_size_given)
            o->page_size = 16;
        if (o->chunks + o->decodes < 1 || (o->chunks > 0 && o->chunk_len < 1)) {
            fprintf(stderr, "flashattn bench: --mixed needs a sequence: --chunks with --chunk-len >= 1, "
                            "or --decodes\n");
            return -1;
        }
        if (o->chunk_len > o->cache_lo) {
            fprintf(stderr, "flashattn bench: --chunk-len %lld exceeds --cache-len %lld: a chunk's "
                            "rows are the last of its cached keys\n", (long long)o->chunk_len,
                    (long long)o->cache_lo);
            return -1;
        }
        if (s->kv_heads == 0)
            s->kv_heads = s->heads % 8 == 0 ? 8 : s->heads;
        if (!s->runs_given)
            s->runs = VARLEN_DEFAULT_RUNS + 2;
    }
    if ((o->decode || o->varlen_given) && seq_given) {
        fprintf(stderr, "flashattn bench: --seq and --seq-kv do not apply with %s\n",
                o->decode ? "--decode (use --q-rows and --cache-len)"
                          : "--varlen (the lengths come from its list)");
        return -1;
    }
    if (o->mla) { /* DeepSeek V2/V3: 128 query heads on one latent head of 576 = 512 + 64 rope */
        s->heads = 128;
        s->kv_heads = 1;
        s->dim = 576;
        s->dim_v = 512;
    }
    if (o->decode && s->kv_heads == 0)
        s->kv_heads = s->heads % 8 == 0 ? 8 : s->heads;
    if (o->varlen_given) {
        if (o->gen_n > 0) {
            o->varlen = malloc((size_t)o->gen_n * sizeof *o->varlen);
            if (!o->varlen) {
                fprintf(stderr, "flashattn bench: out of memory\n");
                return -1;
            }
            spread_lengths(o->gen_lo, o->gen_hi, o->gen_n, s->seed, o->varlen);
            o->n_varlen = o->gen_n;
        }
        int64_t total = 0;
        for (int64_t b = 0; b < o->n_varlen; b++)
            total += o->varlen[b];
        if (total > INT32_MAX) {
            fprintf(stderr, "flashattn bench: --varlen: %lld tokens in all; cu_seqlens are int32\n",
                    (long long)total);
            return -1;
        }
        if (!s->runs_given)
            s->runs = VARLEN_DEFAULT_RUNS;
    }
    return 0;
}

/* int8 and fp8: one byte per element, with f32 scales per row and kv head. */
static int kv_quant(fa_dtype d)
{
    return d == FA_DTYPE_I8 || d == FA_DTYPE_F8E4M3 || d == FA_DTYPE_F8E5M2;
}

/* Bytes of one element of a cache dtype (the quantised ones are one byte even
 * where an older library does not know them). */
static size_t kv_elem_size(fa_dtype d)
{
    return kv_quant(d) ? 1 : fa_dtype_size(d);
}

static const char *kv_dtype_name(fa_dtype d)
{
    return fa_dtype_name(d);
}

/* Random values: uniform multiples of 1/1024 in [-1, 1) (exact in f16, rounded
 * in bf16), or int8 in [-127, 127], or fp8 codes with bit 6 clear (|value| < 2 in
 * both formats, never inf or NaN); a table makes the 16-bit ones cheap, since
 * a ragged batch of caches can be a gigabyte. */
void bench_fill_values(void *data, fa_dtype dtype, int64_t n, uint64_t seed)
{
    static uint16_t f16[2048], bf16[2048];
    if (f16[0] == 0) {
        for (int k = 0; k < 2048; k++) {
            float x = (float)(k - 1024) / 1024.0f;
            f16[k] = cli_f32_to_f16(x);
            bf16[k] = cli_f32_to_bf16(x);
        }
    }
    uint64_t st = seed;
    for (int64_t i = 0; i < n;) {
        uint64_t r = mix64(&st);
        for (int part = 0; part < 4 && i < n; part++, i++) {
            unsigned k = (unsigned)(r >> (16 * part)) & 2047u;
            switch (dtype) {
            case FA_DTYPE_F32: ((float *)data)[i] = (float)((int)k - 1024) / 1024.0f; break;
            case FA_DTYPE_F16: ((uint16_t *)data)[i] = f16[k]; break;
            case FA_DTYPE_BF16: ((uint16_t *)data)[i] = bf16[k]; break;
            case FA_DTYPE_I8: ((int8_t *)data)[i] = (int8_t)((int)(k % 255u) - 127); break;
            case FA_DTYPE_F8E4M3:
            case FA_DTYPE_F8E5M2: ((uint8_t *)data)[i] = (uint8_t)(k & 0xbfu); break;
            case FA_DTYPE_BOOL: break;
            }
        }
    }
}

/* int8 scales: (0.5 .. 1.5) / 127, so that scale * int8 spans about [-1, 1]. */
static void fill_scales(float *data, int64_t n, uint64_t seed)
{
    uint64_t st = seed;
    for (int64_t i = 0; i < n; i++)
        data[i] = (0.5f + (float)(mix64(&st) >> 40) * 0x1p-24f) / 127.0f;
}

/* a * b * c * d elements fit in memory terms (no int64 overflow, < 2^60). */
static int elems(int64_t a, int64_t b, int64_t c, int64_t d, int64_t *out)
{
    const int64_t cap = (int64_t)1 << 60;
    if (a > cap / b || a * b > cap / c || a * b * c > cap / d)
        return -1;
    *out = a * b * c * d;
    return 0;
}

/* The JSON fields every object of these modes has after "mode". */
static void json_common(FILE *f, const char *isa, const cli_shape *s)
{
    fputs(",\"isa\":", f);
    cli_json_string(f, isa);
    fputs(",\"dtype\":", f);
    cli_json_string(f, fa_dtype_name(s->dtype));
    fprintf(f, ",\"Hq\":%lld,\"Hk\":%lld,\"D\":%lld,\"Dv\":%lld", (long long)s->heads,
            (long long)s->kv_heads, (long long)s->dim, (long long)s->dim_v);
    fputs(",\"causal\":", f);
    cli_json_string(f, cli_causal_name(s->causal));
    fprintf(f, ",\"window_left\":%lld,\"window_right\":%lld", (long long)s->window_left,
            (long long)s->window_right);
}

static void print_cells(int cols, const char *const *head, const int *right, int rows,
                        char cells[][CLI_CELL])
{
    cli_print_table(stdout, cols, head, right, rows, &cells[0][0]);
}

/* "256..16384" or "16384". */
static void range_text(char *buf, size_t n, int64_t lo, int64_t hi)
{
    if (lo == hi)
        snprintf(buf, n, "%lld", (long long)lo);
    else
        snprintf(buf, n, "%lld..%lld", (long long)lo, (long long)hi);
}

static int64_t last_param(fa_context *ctx, fa_param p)
{
    int64_t v = 0;
    return fa_context_get(ctx, p, &v) == FA_OK ? v : 0;
}

/* ----------------------------------------------------------------- decode */

void decode_cache_free(decode_cache *c)
{
    cli_free(c->k);
    cli_free(c->v);
    cli_free(c->k_scale);
    cli_free(c->v_scale);
    cli_free(c->seqlens);
    cli_free(c->block_table);
    memset(c, 0, sizeof *c);
}

int decode_cache_make(const cli_shape *s, const bench_mode_opts *o, const int64_t *lens,
                             decode_cache *c)
{
    memset(c, 0, sizeof *c);
    const int64_t B = s->batch, P = o->page_size;
    int64_t max_len = 0, pages = 0, max_pages = 0;
    for (int64_t b = 0; b < B; b++) {
        if (lens[b] > max_len)
            max_len = lens[b];
        if (P > 0) {
            int64_t np = (lens[b] + P - 1) / P;
            pages += np;
            if (np > max_pages)
                max_pages = np;
        }
    }
    c->rows0 = P > 0 ? pages : B;
    c->rows1 = P > 0 ? P : max_len;
    c->max_pages = max_pages;
    const size_t es = kv_elem_size(o->kv_dtype);
    int64_t nk, nv, ns;
    if (elems(c->rows0, c->rows1, s->kv_heads, s->dim, &nk) != 0 ||
        elems(c->rows0, c->rows1, s->kv_heads, s->dim_v, &nv) != 0 ||
        elems(c->rows0, c->rows1, s->kv_heads, 1, &ns) != 0 ||
        (P > 0 && (B > INT64_MAX / max_pages || pages > INT32_MAX))) {
        fprintf(stderr, "flashattn bench: the KV cache is too large to address\n");
        return -1;
    }
    if (o->mla)
        nv = 0; /* a latent cache's V is K's first Dv columns */
    c->k = cli_alloc(nk, es);
    c->v = o->mla ? NULL : cli_alloc(nv, es);
    c->seqlens = cli_alloc(B, sizeof *c->seqlens);
    if (kv_quant(o->kv_dtype)) {
        c->k_scale = cli_alloc(ns, sizeof *c->k_scale);
        c->v_scale = o->mla ? NULL : cli_alloc(ns, sizeof *c->v_scale);
    }
    if (P > 0)
        c->block_table = cli_alloc(B * max_pages, sizeof *c->block_table);
    if (!c->k || (!c->v && !o->mla) || !c->seqlens ||
        (kv_quant(o->kv_dtype) && (!c->k_scale || (!c->v_scale && !o->mla))) || (P > 0 && !c->block_table)) {
        fprintf(stderr, "flashattn bench: out of memory allocating the KV cache (%.1f MiB)\n",
                (double)(nk + nv) * (double)es / (1024.0 * 1024.0));
        decode_cache_free(c);
        return -1;
    }
    uint64_t seed = (uint64_t)s->seed * 0x2545f4914f6cdd1dull;
    bench_fill_values(c->k, o->kv_dtype, nk, seed ^ 0x6bull);
    if (c->v)
        bench_fill_values(c->v, o->kv_dtype, nv, seed ^ 0x76ull);
    if (c->k_scale)
        fill_scales(c->k_scale, ns, seed ^ 0x6b73ull);
    if (c->v_scale)
        fill_scales(c->v_scale, ns, seed ^ 0x7673ull);
    for (int64_t b = 0; b < B; b++)
        c->seqlens[b] = (int32_t)lens[b];
    if (P > 0) {
        /* Every page once, in a shuffled order: sequence b's pages are scattered
         * over the pool as a serving allocator leaves them. Unused table slots
         * (shorter sequences) stay 0, a valid page id. */
        int32_t *perm = malloc((size_t)pages * sizeof *perm);
        if (!perm) {
            fprintf(stderr, "flashattn bench: out of memory\n");
            decode_cache_free(c);
            return -1;
        }
        for (int64_t p = 0; p < pages; p++)
            perm[p] = (int32_t)p;
        uint64_t st = seed ^ 0x70616765ull;
        for (int64_t p = pages - 1; p > 0; p--) {
            int64_t j = (int64_t)(mix64(&st) % (uint64_t)(p + 1));
            int32_t t = perm[p];
            perm[p] = perm[j];
            perm[j] = t;
        }
        int64_t next = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t p = 0; p < (lens[b] + P - 1) / P; p++)
                c->block_table[b * max_pages + p] = perm[next++];
        free(perm);
    }
    fa_kv_cache *kc = &c->cache;
    fa_kv_cache_init(kc);
    kc->k = fa_tensor_make(c->k, o->kv_dtype, FA_LAYOUT_BSND, c->rows0, c->rows1, s->kv_heads,
                           s->dim);
    if (o->mla) { /* V: the view of K's first Dv columns */
        kc->v_in_k = 1;
        kc->v = kc->k;
        kc->v.shape[3] = s->dim_v;
    } else {
        kc->v = fa_tensor_make(c->v, o->kv_dtype, FA_LAYOUT_BSND, c->rows0, c->rows1, s->kv_heads,
                               s->dim_v);
    }
    if (c->k_scale)
        kc->k_scale = fa_tensor_contiguous(c->k_scale, FA_DTYPE_F32, c->rows0, c->rows1,
                                           s->kv_heads, 1);
    if (c->v_scale)
        kc->v_scale = fa_tensor_contiguous(c->v_scale, FA_DTYPE_F32, c->rows0, c->rows1,
                                           s->kv_heads, 1);
    if (o->mla && c->k_scale)
        kc->v_scale = kc->k_scale;
    kc->seqlens = c->seqlens;
    kc->block_table = c->block_table;
    kc->max_pages = P > 0 ? max_pages : 0;
    return 0;
}

/* The cached rows the call must read for one sequence: from the first key any
 * query row keeps to the last, since the bands only move right. */
static int64_t decode_rows(const cli_shape *s, int64_t q_rows, int64_t len)
{
    cli_shape one = *s;
    one.seq = q_rows;
    one.seq_kv = len;
    int64_t first = len, last = -1;
    for (int64_t i = 0; i < q_rows; i++) {
        int64_t lo, hi;
        cli_row_band(&one, i, &lo, &hi);
        if (hi >= lo) {
            if (lo < first)
                first = lo;
            if (hi > last)
                last = hi;
        }
    }
    return last >= first ? last - first + 1 : 0;
}

/* The read bandwidth, or 0 with the reason in why. */
static double measure_read_bw(fa_context *ctx, int skip, char *why, size_t n)
{
    if (skip) {
        snprintf(why, n, "not measured (--no-probe)");
        return 0.0;
    }
    double g = 0.0;
    fa_status st = fa_probe(ctx, FA_PROBE_READ_BW, &g);
    if (st != FA_OK || !(g > 0.0)) {
        snprintf(why, n, "not measured: %s",
                 st != FA_OK ? fa_context_error(ctx) : "the probe returned no rate");
        return 0.0;
    }
    return g;
}

int bench_decode(fa_context *ctx, const cli_shape *s, const bench_mode_opts *o, int json,
                 int no_probe, int64_t cold_bytes, int profile)
{
    const int64_t B = s->batch;
    int status = CLI_EXIT_FAIL;
    int64_t *lens = malloc((size_t)B * sizeof *lens);
    void *q = NULL, *out = NULL;
    double *times = NULL;
    decode_cache c;
    memset(&c, 0, sizeof c);
    cli_flush flush = {NULL, 0, 0};
    if (!lens) {
        fprintf(stderr, "flashattn bench: out of memory\n");
        return CLI_EXIT_FAIL;
    }
    spread_lengths(o->cache_lo, o->cache_hi, B, s->seed, lens);

    /* What one call must read: the cached rows (its FLOPs are the call's, below). */
    const size_t es = kv_elem_size(o->kv_dtype);
    double kv_bytes = 0.0, tokens = 0.0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t rows = decode_rows(s, o->q_rows, lens[b]);
        /* a latent row is read once for both products: D values (and one scale) */
        const int64_t width = o->mla ? s->dim : s->dim + s->dim_v, nscales = o->mla ? 1 : 2;
        double row_bytes = (double)s->kv_heads * (double)width * (double)es;
        if (kv_quant(o->kv_dtype))
            row_bytes += (double)s->kv_heads * (double)nscales * sizeof(float);
        kv_bytes += (double)rows * row_bytes;
        tokens += (double)lens[b];
    }

    char why[200] = "";
    const double read_bw = measure_read_bw(ctx, no_probe, why, sizeof why);
    /* A bf16 query over a bf16 cache multiplies bf16 pairs (on the tile unit where the
     * path has one: its peak is then the tile probe's); any other cache is widened to
     * fp32 (or read as int8 codes) against fp32 FMA's peak. */
    cli_peak peak;
    const int pairs = s->dtype == FA_DTYPE_BF16 && o->kv_dtype == FA_DTYPE_BF16;
    cli_measure_peak(ctx, pairs ? FA_DTYPE_BF16 : FA_DTYPE_F32, no_probe, &peak);

    int64_t nq, no;
    if (elems(B, o->q_rows, s->heads, s->dim, &nq) != 0 ||
        elems(B, o->q_rows, s->heads, s->dim_v, &no) != 0) {
        fprintf(stderr, "flashattn bench: the query is too large to address\n");
        goto done;
    }
    if (decode_cache_make(s, o, lens, &c) != 0)
        goto done;
    q = cli_alloc(nq, fa_dtype_size(s->dtype));
    out = cli_alloc(no, fa_dtype_size(s->dtype));
    times = cli_alloc(s->runs > 0 ? s->runs : 1, sizeof *times);
    if (!q || !out || !times) {
        fprintf(stderr, "flashattn bench: out of memory allocating q and o\n");
        goto done;
    }
    bench_fill_values(q, s->dtype, nq, (uint64_t)s->seed * 0x2545f4914f6cdd1dull ^ 0x71ull);
    if (!o->warm) {
        if (cold_bytes <= 0)
            cold_bytes = 2 * cli_llc_bytes();
        if (cli_flush_make(&flush, cold_bytes) != 0)
            goto done;
        flush.read_only = 1; /* dirty lines would be written back inside the timed call */
    }

    fa_forward_args args = FA_FORWARD_ARGS_INIT;
    args.q = fa_tensor_make(q, s->dtype, FA_LAYOUT_BSND, B, o->q_rows, s->heads, s->dim);
    args.o = fa_tensor_make(out, s->dtype, FA_LAYOUT_BSND, B, o->q_rows, s->heads, s->dim_v);
    args.causal = s->causal;
    args.window_left = s->window_left;
    args.window_right = s->window_right;
    args.kv_cache = &c.cache;
    fa_work work = FA_WORK_INIT;
    if (fa_forward_work(ctx, &args, &work) != FA_OK) {
        fprintf(stderr, "flashattn bench: %s\n", fa_context_error(ctx));
        goto done;
    }
    const double flops = work.flops;
    /* Roofline: the call takes at least max(bytes / bw, flops / peak); the
     * share of the read bandwidth that leaves is the best this call can reach. */
    double roof = NAN;
    if (read_bw > 0 && peak.gflops > 0 && kv_bytes > 0) {
        const double t_mem = kv_bytes / (read_bw * 1e9), t_fma = flops / (peak.gflops * 1e9);
        roof = 100.0 * t_mem / (t_mem > t_fma ? t_mem : t_fma);
    }

    cli_timing t;
    if (cli_time_algo(ctx, s, s->algo, &args, times, o->warm ? NULL : &flush, &t, "bench") != 0)
        goto done;
    const int64_t splits = last_param(ctx, FA_PARAM_LAST_KV_SPLITS);
    /* The profiled calls start from the timed calls' cache state: flushed unless --warm. */
    bench_profile pr = {0};
    for (int call = 0; call < BENCH_PROFILE_CALLS && profile && s->runs > 0 && t.algo == FA_ALGO_FLASH && !t.oom; call++) {
        if (!o->warm)
            cli_flush_run(&flush);
        if (bench_profile_call(ctx, &args, NULL, &pr) != 0)
            goto done;
    }
    const double gbps = t.oom ? NAN : kv_bytes / t.median_s * 1e-9;
    const double gflops = t.oom ? NAN : flops / t.median_s * 1e-9;
    const double pct = read_bw > 0 && isfinite(gbps) ? 100.0 * gbps / read_bw : NAN;
    const double pct_peak = cli_pct_peak(gflops, &peak);
    int64_t len_min = lens[0], len_max = lens[0];
    for (int64_t b = 1; b < B; b++) {
        if (lens[b] < len_min)
            len_min = lens[b];
        if (lens[b] > len_max)
            len_max = lens[b];
    }
    const char *isa = fa_context_isa(ctx);

    if (json) {
        FILE *f = stdout;
        fputs("{\"mode\":\"decode\"", f);
        json_common(f, isa, s);
        fputs(",\"kv_dtype\":", f);
        cli_json_string(f, kv_dtype_name(o->kv_dtype));
        fprintf(f, ",\"mla\":%d", o->mla);
        fprintf(f, ",\"B\":%lld,\"q_rows\":%lld,\"cache_len_min\":%lld,\"cache_len_max\":%lld"
                   ",\"cache_tokens\":%.0f,\"page_size\":%lld",
                (long long)B, (long long)o->q_rows, (long long)len_min, (long long)len_max, tokens,
                (long long)o->page_size);
        fputs(",\"algo\":", f);
        cli_json_string(f, fa_algo_name(t.algo));
        fprintf(f, ",\"threads\":%lld,\"runs\":%lld,\"cold_bytes\":%lld", (long long)t.threads,
                (long long)s->runs, (long long)(o->warm ? 0 : flush.bytes));
        fputs(",\"median_ms\":", f);
        cli_json_number(f, t.oom ? NAN : t.median_s * 1e3);
        fprintf(f, ",\"kv_bytes\":%.0f,\"gbps\":", kv_bytes);
        cli_json_number(f, gbps);
        fputs(",\"read_bw_gbps\":", f);
        cli_json_number(f, read_bw > 0 ? read_bw : NAN);
        fputs(",\"pct_read_bw\":", f);
        cli_json_number(f, pct);
        fprintf(f, ",\"flops\":%.0f", flops); /* exact: an integer below 2^53 */
        fputs(",\"gflops\":", f);
        cli_json_number(f, gflops);
        fputs(",\"peak_gflops\":", f);
        cli_json_number(f, peak.gflops > 0 ? peak.gflops : NAN);
        fputs(",\"pct_peak\":", f);
        cli_json_number(f, pct_peak);
        fputs(",\"roofline_pct_read_bw\":", f);
        cli_json_number(f, roof);
        fprintf(f, ",\"kv_splits\":%lld,\"kv_splits_forced\":", (long long)splits);
        cli_json_int(f, o->kv_splits, o->kv_splits_given && o->kv_splits > 0);
        fputs(",\"extra_bytes\":", f);
        cli_json_int(f, t.extra_bytes, !t.oom);
        if (pr.ran)
            bench_profile_json(f, &pr, &peak);
        if (t.oom)
            fputs(",\"error\":\"out of memory\"", f);
        fputs("}\n", f);
        status = CLI_EXIT_OK;
        goto done;
    }

    char lens_txt[64], cold[96] = "", kvsize[32];
    range_text(lens_txt, sizeof lens_txt, len_min, len_max);
    cli_format_bytes(kvsize, sizeof kvsize, kv_bytes);
    if (!o->warm) {
        char fb[32];
        cli_format_bytes(fb, sizeof fb, (double)flush.bytes);
        snprintf(cold, sizeof cold, "; before each, an untimed read of %s (--warm skips it)", fb);
    }
    printf("# flashattn %s bench --decode: median of %lld runs after 1 warm-up%s\n",
           fa_version_string(), (long long)s->runs, cold);
    printf("# q %s (B, %lld, Hq, D); cache %s, %s, lengths %s", fa_dtype_name(s->dtype),
           (long long)o->q_rows, kv_dtype_name(o->kv_dtype),
           o->page_size > 0 ? "paged (pages shuffled)" : "contiguous", lens_txt);
    if (len_min != len_max)
        printf(" evenly spaced over the batch, shuffled by --seed (mean %.0f)", tokens / (double)B);
    if (o->mla)
        printf("\n# MLA latent cache (--mla): V is the first Dv columns of K's rows; GB/s = latent bytes "
               "the call must read, each row once (%s: rows x Hk x D x %zu B%s) / time\n",
               kvsize, es, kv_quant(o->kv_dtype) ? " + 4 B of scale per row and head" : "");
    else
        printf("\n# GB/s = K/V bytes the call must read (%s: rows x Hk x (D+Dv) x %zu B%s) / time\n",
               kvsize, es, kv_quant(o->kv_dtype) ? " + 8 B of scales per row and head" : "");
    if (read_bw > 0)
        printf("# read bandwidth %.1f GB/s: streaming reads from main memory on %lld thread%s, "
               "measured by fa_probe\n", read_bw, (long long)cli_resolved_threads(s->threads),
               cli_resolved_threads(s->threads) == 1 ? "" : "s");
    else
        printf("# read bandwidth: %s\n", why);
    if (peak.gflops > 0)
        printf("# peak %.1f GFLOP/s: %s of the %s path, measured by fa_probe\n", peak.gflops,
               peak.kind, isa);
    else
        printf("# peak (%s): %s\n", peak.kind, peak.why);
    if (isfinite(roof))
        printf("# %.2f FLOP per K/V byte against a balance of %.2f (peak / read bandwidth): "
               "at best %.0f%% of the read bandwidth (%s-bound)\n",
               flops / kv_bytes, peak.gflops / read_bw, roof, roof < 99.5 ? "compute" : "memory");
    if (o->warm && kv_bytes < (double)cli_llc_bytes()) {
        char llc[32];
        cli_format_bytes(llc, sizeof llc, (double)cli_llc_bytes());
        printf("# --warm: K/V (%s) fit in the %s last-level cache, so %% read bw can pass 100\n",
               kvsize, llc);
    }

    enum { COLS = 14 };
    static const char *const head[COLS] = {"algo", "kv", "layout", "B", "heads", "q rows",
                                            "cache len", "threads", "splits", "median ms",
                                            "GB/s", "% read bw", "GFLOP/s", "% peak"};
    static const int right[COLS] = {0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    char cells[COLS][CLI_CELL];
    snprintf(cells[0], CLI_CELL, "%s", fa_algo_name(t.algo));
    snprintf(cells[1], CLI_CELL, "%s%s", kv_dtype_name(o->kv_dtype), o->mla ? " latent" : "");
    if (o->page_size > 0)
        snprintf(cells[2], CLI_CELL, "paged %lld", (long long)o->page_size);
    else
        snprintf(cells[2], CLI_CELL, "contiguous");
    snprintf(cells[3], CLI_CELL, "%lld", (long long)B);
    snprintf(cells[4], CLI_CELL, "%lld/%lld", (long long)s->heads, (long long)s->kv_heads);
    snprintf(cells[5], CLI_CELL, "%lld", (long long)o->q_rows);
    snprintf(cells[6], CLI_CELL, "%s", lens_txt);
    snprintf(cells[7], CLI_CELL, "%lld", (long long)t.threads);
    snprintf(cells[8], CLI_CELL, "%lld%s", (long long)splits,
             o->kv_splits_given && o->kv_splits > 0 ? " (forced)" : "");
    if (t.oom) {
        snprintf(cells[9], CLI_CELL, "out of memory");
        for (int k = 10; k < COLS; k++)
            snprintf(cells[k], CLI_CELL, "-");
    } else {
        snprintf(cells[9], CLI_CELL, "%.3f", t.median_s * 1e3);
        snprintf(cells[10], CLI_CELL, "%.1f", gbps);
        if (isfinite(pct))
            snprintf(cells[11], CLI_CELL, "%.1f", pct);
        else
            snprintf(cells[11], CLI_CELL, "-");
        snprintf(cells[12], CLI_CELL, "%.2f", gflops);
        if (isfinite(pct_peak))
            snprintf(cells[13], CLI_CELL, "%.1f", pct_peak);
        else
            snprintf(cells[13], CLI_CELL, "-");
    }
    print_cells(COLS, head, right, 1, cells);
    if (pr.ran)
        bench_profile_text(&pr, &peak);
    status = CLI_EXIT_OK;
done:
    cli_flush_free(&flush);
    cli_free(times);
    cli_free(out);
    cli_free(q);
    decode_cache_free(&c);
    free(lens);
    return status;
}

/* ----------------------------------------------------------------- varlen */

typedef struct varlen_row {
    const char *mode;       /* "varlen" or "dense" */
    int64_t batch, seq;     /* dense: B x S; varlen: 1 x tokens */
    int64_t tokens;
    double flops;           /* fa_forward_work of the timed call */
    int64_t pairs;          /* its kept pairs, over sequences and Hq */
    cli_timing t;
} varlen_row;

static double row_gflops(const varlen_row *r)
{
    return r->t.oom ? NAN : r->flops / r->t.median_s * 1e-9;
}

/* Kept pairs of one Sq = Sk = len sequence under the shape's masks. */
static int64_t self_pairs(const cli_shape *s, int64_t len)
{
    cli_shape one = *s;
    one.seq = one.seq_kv = len;
    return cli_kept_pairs(&one);
}

/* The length L whose n * self_pairs(L) is closest to target (pairs grow with L). */
static int64_t equal_work_length(const cli_shape *s, int64_t n, double target, int64_t hi)
{
    int64_t lo = 1;
    while (lo < hi) { /* smallest L with n * pairs(L) >= target */
        int64_t mid = lo + (hi - lo) / 2;
        if ((double)n * (double)self_pairs(s, mid) >= target)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (lo > 1 && fabs((double)n * (double)self_pairs(s, lo - 1) - target) <
                      fabs((double)n * (double)self_pairs(s, lo) - target))
        lo--;
    return lo;
}

/*
 * The dense batch of the same work as `tokens` packed tokens keeping `pairs`
 * (i, j) pairs: B sequences of one length L with B*L ~ tokens and
 * B*pairs(L) ~ pairs. Matching the pairs alone (say, B = the number of
 * sequences) would leave the two calls with different token counts, and what
 * a call spends per token (masked diagonal tiles under causal, per-row softmax
 * and output work) would then move the ratio by itself: 8 causal sequences of
 * 100..3000 have the kept pairs of 8 x 1817, but 17% fewer tokens. pairs(L)/L
 * grows with L, so L comes from the pairs per token, B from the tokens, and L
 * is then refitted to the pairs for that B.
 */
static void same_work_batch(const cli_shape *s, int64_t tokens, double pairs, int64_t *batch,
                            int64_t *len)
{
    const double per_token = pairs / (double)tokens;
    int64_t lo = 1, hi = tokens;
    while (lo < hi) { /* smallest L with pairs(L) / L >= pairs per token */
        int64_t mid = lo + (hi - lo) / 2;
        if ((double)self_pairs(s, mid) / (double)mid >= per_token)
            hi = mid;
        else
            lo = mid + 1;
    }
    int64_t b = (int64_t)floor((double)tokens / (double)lo + 0.5);
    if (b < 1)
        b = 1;
    *batch = b;
    *len = equal_work_length(s, b, pairs, tokens);
}

/* r's FLOPs and kept pairs (summed over sequences and Hq): the core's count of the
 * call it times. */
static int call_work(fa_context *ctx, const fa_forward_args *args, varlen_row *r)
{
    fa_work w = FA_WORK_INIT;
    if (fa_forward_work(ctx, args, &w) != FA_OK) {
        fprintf(stderr, "flashattn bench: %s\n", fa_context_error(ctx));
        return -1;
    }
    r->flops = w.flops;
    r->pairs = w.pairs;
    return 0;
}

static int time_varlen(fa_context *ctx, const cli_shape *s, const bench_mode_opts *o,
                       varlen_row *r)
{
    cli_shape packed = *s;
    packed.batch = 1;
    packed.seq = packed.seq_kv = r->tokens;
    cli_inputs in;
    int32_t *cu = malloc((size_t)(o->n_varlen + 1) * sizeof *cu);
    if (!cu) {
        fprintf(stderr, "flashattn bench: out of memory\n");
        return -1;
    }
    if (cli_inputs_make(&packed, &in) != 0) {
        free(cu);
        return -1;
    }
    void *out = cli_alloc(in.o_elems, fa_dtype_size(s->dtype));
    double *times = cli_alloc(s->runs, sizeof *times);
    int rc = -1;
    if (!out || !times) {
        fprintf(stderr, "flashattn bench: out of memory allocating the output\n");
        goto done;
    }
    cu[0] = 0;
    for (int64_t b = 0; b < o->n_varlen; b++)
        cu[b + 1] = (int32_t)(cu[b] + o->varlen[b]);
    fa_forward_args args = cli_forward_args(&packed, &in, out, s->dtype, NULL);
    args.cu_seqlens_q = cu;
    args.cu_seqlens_k = cu;
    args.num_seqs = o->n_varlen;
    rc = call_work(ctx, &args, r);
    if (rc == 0)
        rc = cli_time_algo(ctx, s, s->algo, &args, times, NULL, &r->t, "bench");
done:
    cli_free(times);
    cli_free(out);
    cli_inputs_free(&in);
    free(cu);
    return rc;
}

static int time_dense(fa_context *ctx, const cli_shape *s, varlen_row *r)
{
    cli_shape d = *s;
    d.batch = r->batch;
    d.seq = d.seq_kv = r->seq;
    cli_inputs in;
    if (cli_inputs_make(&d, &in) != 0)
        return -1;
    void *out = cli_alloc(in.o_elems, fa_dtype_size(s->dtype));
    double *times = cli_alloc(s->runs, sizeof *times);
    int rc = -1;
    if (out && times) {
        fa_forward_args args = cli_forward_args(&d, &in, out, s->dtype, NULL);
        rc = call_work(ctx, &args, r);
        if (rc == 0)
            rc = cli_time_algo(ctx, &d, s->algo, &args, times, NULL, &r->t, "bench");
    } else {
        fprintf(stderr, "flashattn bench: out of memory allocating the output\n");
    }
    cli_free(times);
    cli_free(out);
    cli_inputs_free(&in);
    return rc;
}

static void varlen_json(const varlen_row *r, const cli_shape *s, const bench_mode_opts *o,
                        const char *isa, const cli_peak *peak, double ratio)
{
    FILE *f = stdout;
    const double gf = row_gflops(r);
    fputs("{\"mode\":", f);
    cli_json_string(f, r->mode);
    json_common(f, isa, s);
    fprintf(f, ",\"seqs\":%lld,\"B\":%lld,\"S\":%lld,\"tokens\":%lld", (long long)o->n_varlen,
            (long long)r->batch, (long long)r->seq, (long long)r->tokens);
    fputs(",\"algo\":", f);
    cli_json_string(f, fa_algo_name(r->t.algo));
    fprintf(f, ",\"threads\":%lld,\"runs\":%lld", (long long)r->t.threads, (long long)s->runs);
    fputs(",\"median_ms\":", f);
    cli_json_number(f, r->t.oom ? NAN : r->t.median_s * 1e3);
    fprintf(f, ",\"flops\":%.0f", r->flops); /* exact: an integer below 2^53 */
    fputs(",\"gflops\":", f);
    cli_json_number(f, gf);
    cli_json_peak(f, peak, cli_pct_peak(gf, peak));
    fputs(",\"tile_q\":", f);
    cli_json_int(f, r->t.tile_q, r->t.tile_q > 0);
    fputs(",\"tile_kv\":", f);
    cli_json_int(f, r->t.tile_kv, r->t.tile_kv > 0);
    fputs(",\"extra_bytes\":", f);
    cli_json_int(f, r->t.extra_bytes, !r->t.oom);
    fputs(",\"varlen_vs_dense\":", f);
    cli_json_number(f, ratio);
    if (strcmp(r->mode, "varlen") == 0) {
        fputs(",\"lengths\":[", f);
        for (int64_t b = 0; b < o->n_varlen; b++)
            fprintf(f, "%s%lld", b ? "," : "", (long long)o->varlen[b]);
        fputc(']', f);
    }
    if (r->t.oom)
        fputs(",\"error\":\"out of memory\"", f);
    fputs("}\n", f);
}

int bench_varlen(fa_context *ctx, const cli_shape *s, const bench_mode_opts *o, int json,
                 int no_probe)
{
    const int64_t n = o->n_varlen;
    int64_t tokens = 0, len_min = o->varlen[0], len_max = o->varlen[0];
    for (int64_t b = 0; b < n; b++) {
        tokens += o->varlen[b];
        if (o->varlen[b] < len_min)
            len_min = o->varlen[b];
        if (o->varlen[b] > len_max)
            len_max = o->varlen[b];
    }
    varlen_row rows[2];
    memset(rows, 0, sizeof rows);
    rows[0].mode = "varlen";
    rows[0].batch = 1;
    rows[0].seq = tokens;
    rows[0].tokens = tokens;
    rows[1].mode = "dense";

    cli_peak peak;
    cli_measure_peak(ctx, s->dtype, no_probe, &peak);
    if (time_varlen(ctx, s, o, &rows[0]) != 0)
        return CLI_EXIT_FAIL;
    /* the dense batch matches the varlen call's kept pairs per (sequence, head) */
    same_work_batch(s, tokens, s->heads > 0 ? (double)rows[0].pairs / (double)s->heads : 0.0, &rows[1].batch,
                    &rows[1].seq);
    rows[1].tokens = rows[1].batch * rows[1].seq;
    if (time_dense(ctx, s, &rows[1]) != 0)
        return CLI_EXIT_FAIL;
    const double ratio = row_gflops(&rows[0]) / row_gflops(&rows[1]);
    const char *isa = fa_context_isa(ctx);
    if (json) {
        for (int r = 0; r < 2; r++)
            varlen_json(&rows[r], s, o, isa, &peak, ratio);
        return CLI_EXIT_OK;
    }

    char shape[96];
    snprintf(shape, sizeof shape, "Hq %lld, Hk %lld, D %lld", (long long)s->heads,
             (long long)s->kv_heads, (long long)s->dim);
    if (s->dim_v != s->dim)
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), ", Dv %lld",
                 (long long)s->dim_v);
    printf("# flashattn %s bench --varlen: %s %s%s%s, median of %lld runs after 1 warm-up\n",
           fa_version_string(), fa_dtype_name(s->dtype), shape,
           s->causal != FA_CAUSAL_NONE ? ", causal=" : "",
           s->causal != FA_CAUSAL_NONE ? cli_causal_name(s->causal) : "", (long long)s->runs);
    printf("# lengths (%lld):", (long long)n);
    for (int64_t b = 0; b < n && b < 32; b++)
        printf("%s%lld", b ? "," : " ", (long long)o->varlen[b]);
    printf("%s\n", n > 32 ? ",..." : "");
    printf("# dense: the batch of equal sequences with about varlen's tokens and kept (i,j) "
           "pairs: B = %lld of %lld (%.3f x its tokens, %.4f x its FLOPs)\n",
           (long long)rows[1].batch, (long long)rows[1].seq,
           (double)rows[1].tokens / (double)rows[0].tokens, rows[1].flops / rows[0].flops);
    printf("# GFLOP/s = 2*(D+Dv)*kept(i,j)*Hq summed over sequences / time\n");
    if (peak.gflops > 0)
        printf("# peak %.1f GFLOP/s: %s of the %s path on %lld thread%s, measured by fa_probe\n",
               peak.gflops, peak.kind, isa, (long long)cli_resolved_threads(s->threads),
               cli_resolved_threads(s->threads) == 1 ? "" : "s");
    else
        printf("# peak (%s): %s\n", peak.kind, peak.why);

    enum { COLS = 10 };
    static const char *const head[COLS] = {"mode", "sequences", "tokens", "GFLOP", "tiles",
                                            "threads", "median ms", "GFLOP/s", "% peak",
                                            "extra MiB"};
    static const int right[COLS] = {0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    char cells[2 * COLS][CLI_CELL];
    for (int r = 0; r < 2; r++) {
        const varlen_row *row = &rows[r];
        char(*c)[CLI_CELL] = &cells[r * COLS];
        char lt[40];
        range_text(lt, sizeof lt, len_min, len_max);
        snprintf(c[0], CLI_CELL, "%s", row->mode);
        if (r == 0)
            snprintf(c[1], CLI_CELL, "%lld x %s packed", (long long)n, lt);
        else
            snprintf(c[1], CLI_CELL, "%lld x %lld", (long long)row->batch, (long long)row->seq);
        snprintf(c[2], CLI_CELL, "%lld", (long long)row->tokens);
        snprintf(c[3], CLI_CELL, "%.2f", row->flops * 1e-9);
        if (row->t.tile_q > 0)
            snprintf(c[4], CLI_CELL, "%lldx%lld", (long long)row->t.tile_q,
                     (long long)row->t.tile_kv);
        else
            snprintf(c[4], CLI_CELL, "-");
        snprintf(c[5], CLI_CELL, "%lld", (long long)row->t.threads);
        const double gf = row_gflops(row);
        cli_run_cells(cells[0], COLS, r, 6, &row->t, gf, cli_pct_peak(gf, &peak));
    }
    print_cells(COLS, head, right, 2, cells);
    if (isfinite(ratio))
        printf("varlen / dense GFLOP/s: %.3f\n", ratio);
    return CLI_EXIT_OK;
}
