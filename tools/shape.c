/*
 * shape.c: shape flags -> cli_shape, and random inputs for that shape.
 *
 * Flags take their value either as the next argument or after '='
 * (`--seq 512`, `--seq=512`); numbers are parsed strictly, so `--seq 12x` or
 * `--seq ''` is a usage error rather than a silent 12 or 0.
 */
#define _POSIX_C_SOURCE 200809L

#include "shape.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

cli_shape cli_shape_defaults(void)
{
    cli_shape s;
    memset(&s, 0, sizeof s);
    s.batch = 1;
    s.heads = 32;
    s.kv_heads = 0; /* = heads */
    s.seq = 2048;
    s.seq_kv = 0;   /* = seq */
    s.dim = 128;
    s.dim_v = 0;    /* = dim */
    s.dtype = FA_DTYPE_F32;
    s.causal = FA_CAUSAL_NONE;
    s.window_left = FA_WINDOW_UNBOUNDED;
    s.window_right = FA_WINDOW_UNBOUNDED;
    s.threads = 0;
    s.algo = FA_ALGO_AUTO;
    s.algo_given = 0;
    s.tile_q = 0;   /* = planned */
    s.tile_kv = 0;
    s.runs = 5;
    s.runs_given = 0;
    s.seed = 42;
    s.dropout = 0.0;
    s.quant_matmul = -1; /* the context's own */
    return s;
}

/* ---------------------------------------------------------- parsing helpers */

int cli_parse_i64(const char *text, int64_t *out)
{
    if (text == NULL || *text == '\0')
        return -1;
    if (!(*text == '-' || *text == '+' || (*text >= '0' && *text <= '9')))
        return -1; /* strtoll would skip leading blanks */
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0')
        return -1;
    *out = (int64_t)v;
    return 0;
}

/* A flag's word and the value it stands for. */
typedef struct named {
    const char *name;
    int value;
} named;

/* When text (NULL: none) is one of the n names, its value in *out and 1; else 0. */
static int named_value(const char *text, const named *t, size_t n, int *out)
{
    for (size_t k = 0; text && k < n; k++)
        if (strcmp(text, t[k].name) == 0) {
            *out = t[k].value;
            return 1;
        }
    return 0;
}

static void bad_value(const char *verb, const char *flag, const char *value, const char *want)
{
    if (value == NULL)
        fprintf(stderr, "flashattn %s: %s needs a value (%s)\n", verb, flag, want);
    else
        fprintf(stderr, "flashattn %s: bad value '%s' for %s (want %s)\n", verb, value, flag,
                want);
    fprintf(stderr, "Run 'flashattn %s --help' for the flags.\n", verb);
}

int cli_take_value(const char *name, int argc, char **argv, int *i, const char **value)
{
    const char *arg = argv[*i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0)
        return 0;
    if (arg[n] == '=') {
        *value = arg + n + 1;
        return 1;
    }
    if (arg[n] != '\0')
        return 0; /* a longer flag that shares the prefix, e.g. --seq-kv vs --seq */
    *value = (*i + 1 < argc) ? argv[++*i] : NULL;
    return 1;
}

/* A number flag with an inclusive lower bound. */
static int number_flag(const char *verb, const char *flag, const char *value,
                       int64_t lo, const char *want, int64_t *out)
{
    int64_t v;
    if (cli_parse_i64(value, &v) != 0 || v < lo) {
        bad_value(verb, flag, value, want);
        return -1;
    }
    *out = v;
    return 0;
}

/* ---------------------------------------------------------------- the flags */

int cli_shape_flag(cli_shape *s, int argc, char **argv, int *i, const char *verb)
{
    /* The integer flags are a table so that a new dimension is one line. */
    struct {
        const char *name;
        int64_t *field;
        int64_t lo;
        const char *want;
        int *given; /* set to 1 when the flag is seen, or NULL */
    } nums[] = {
        {"--batch", &s->batch, 1, "an integer >= 1", NULL},
        {"--heads", &s->heads, 1, "an integer >= 1", NULL},
        {"--kv-heads", &s->kv_heads, 1, "an integer >= 1 dividing --heads", NULL},
        {"--seq", &s->seq, 1, "an integer >= 1", NULL},
        {"--seq-kv", &s->seq_kv, 1, "an integer >= 1", NULL},
        {"--dim", &s->dim, 1, "an integer >= 1", NULL},
        {"--dim-v", &s->dim_v, 1, "an integer >= 1", NULL},
        {"--threads", &s->threads, 0, "an integer >= 0; 0 = all CPUs", NULL},
        {"--tile-q", &s->tile_q, 0, "an integer >= 0; 0 = planned", NULL},
        {"--tile-kv", &s->tile_kv, 0, "an integer >= 0; 0 = planned", NULL},
        {"--kv-pack", &s->kv_pack, 0, "0 (auto), 1 (never) or 2 (always)", NULL},
        {"--runs", &s->runs, 1, "an integer >= 1", &s->runs_given},
        {"--seed", &s->seed, 0, "an integer >= 0", NULL},
    };
    const char *value = NULL;

    for (size_t n = 0; n < sizeof nums / sizeof nums[0]; n++) {
        if (cli_take_value(nums[n].name, argc, argv, i, &value)) {
            if (number_flag(verb, nums[n].name, value, nums[n].lo, nums[n].want,
                            nums[n].field) != 0)
                return -1;
            if (nums[n].given)
                *nums[n].given = 1;
            return 1;
        }
    }

    if (cli_take_value("--dtype", argc, argv, i, &value)) {
        static const named dtypes[] = {{"f32", FA_DTYPE_F32}, {"f16", FA_DTYPE_F16}, {"bf16", FA_DTYPE_BF16}};
        int v;
        if (!named_value(value, dtypes, sizeof dtypes / sizeof dtypes[0], &v)) {
            bad_value(verb, "--dtype", value, "f32, f16 or bf16");
            return -1;
        }
        s->dtype = (fa_dtype)v;
        return 1;
    }

    if (cli_take_value("--quant-matmul", argc, argv, i, &value)) {
        static const named modes[] = {{"exact", 0}, {"i8", 1}, {"i8x2", 2}};
        if (!named_value(value, modes, sizeof modes / sizeof modes[0], &s->quant_matmul)) {
            bad_value(verb, "--quant-matmul", value, "exact, i8 or i8x2");
            return -1;
        }
        return 1;
    }

    if (cli_take_value("--algo", argc, argv, i, &value)) {
        static const named algos[] = {
            {"auto", FA_ALGO_AUTO}, {"flash", FA_ALGO_FLASH}, {"standard", FA_ALGO_STANDARD},
            {"reference", FA_ALGO_REFERENCE}};
        int v;
        if (!named_value(value, algos, sizeof algos / sizeof algos[0], &v)) {
            bad_value(verb, "--algo", value, "auto, flash, standard or reference");
            return -1;
        }
        s->algo = (fa_algo)v;
        s->algo_given = 1;
        return 1;
    }

    /* --causal alone is a switch, so its alignment only comes after '=':
     * `--causal top-left` would otherwise be ambiguous with a positional. */
    const char *arg = argv[*i];
    if (strcmp(arg, "--causal") == 0) {
        s->causal = FA_CAUSAL_BOTTOM_RIGHT;
        return 1;
    }
    if (strncmp(arg, "--causal=", 9) == 0) {
        static const named aligns[] = {
            {"bottom-right", FA_CAUSAL_BOTTOM_RIGHT}, {"top-left", FA_CAUSAL_TOP_LEFT}, {"none", FA_CAUSAL_NONE}};
        int v;
        if (!named_value(arg + 9, aligns, sizeof aligns / sizeof aligns[0], &v)) {
            bad_value(verb, "--causal", arg + 9, "bottom-right, top-left or none");
            return -1;
        }
        s->causal = (fa_causal)v;
        return 1;
    }

    if (cli_take_value("--dropout", argc, argv, i, &value)) {
        /* strtod alone would take " 0.1", "0.1x" or "nan"; the library refuses
         * anything outside [0, 1), so that is a usage error here already. */
        char *end = NULL;
        double p = -1.0;
        if (value && ((*value >= '0' && *value <= '9') || *value == '.')) {
            errno = 0;
            p = strtod(value, &end);
            if (errno != 0 || end == value || *end != '\0')
                p = -1.0;
        }
        if (!(p >= 0.0 && p < 1.0) || (float)p >= 1.0f) {
            bad_value(verb, "--dropout", value, "a probability P, 0 <= P < 1");
            return -1;
        }
        s->dropout = p;
        return 1;
    }

    if (cli_take_value("--window", argc, argv, i, &value)) {
        const char *want = "L,R with each -1 (unbounded) or >= 0";
        const char *comma = value ? strchr(value, ',') : NULL;
        if (comma == NULL || (size_t)(comma - value) >= 32) {
            bad_value(verb, "--window", value, want);
            return -1;
        }
        char left[32];
        memcpy(left, value, (size_t)(comma - value));
        left[comma - value] = '\0';
        int64_t l, r;
        if (cli_parse_i64(left, &l) != 0 || cli_parse_i64(comma + 1, &r) != 0 || l < -1 || r < -1) {
            bad_value(verb, "--window", value, want);
            return -1;
        }
        s->window_left = l;
        s->window_right = r;
        return 1;
    }
    return 0;
}

/* a*b into *out unless it leaves int64; the buffers are indexed in 64 bits. */
static int mul_ok(int64_t a, int64_t b, int64_t *out)
{
    if (a != 0 && b > INT64_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

static int elems_ok(int64_t a, int64_t b, int64_t c, int64_t d, int64_t *out)
{
    int64_t ab, abc;
    return mul_ok(a, b, &ab) && mul_ok(ab, c, &abc) && mul_ok(abc, d, out) &&
           (uint64_t)*out <= (uint64_t)(SIZE_MAX / 8);
}

int cli_unknown_arg(const char *verb, const char *arg, void (*usage)(FILE *f))
{
    fprintf(stderr, "flashattn %s: unknown argument '%s'\n\n", verb, arg);
    usage(stderr);
    return CLI_EXIT_USAGE;
}

int cli_is_help(const char *arg)
{
    return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0;
}

int cli_switch_flag(const char *arg, const cli_switch *sw, int n)
{
    for (int k = 0; k < n; k++)
        if (strcmp(arg, sw[k].flag) == 0) {
            *sw[k].on = 1;
            return 1;
        }
    return 0;
}

/* The shape's flags that are context settings: checked against the library's
 * bounds by cli_shape_finish, set by cli_context_make. */
enum { SHAPE_SETTINGS = 4 };
typedef struct shape_setting {
    fa_param param;
    const char *flag; /* the CLI flag */
    const char *what; /* the setting, in messages */
    int64_t value;
} shape_setting;

static void shape_settings(const cli_shape *s, shape_setting out[SHAPE_SETTINGS])
{
    const shape_setting all[SHAPE_SETTINGS] = {
        {FA_PARAM_THREADS, "--threads", "threads", s->threads},
        {FA_PARAM_TILE_Q, "--tile-q", "tile_q", s->tile_q},
        {FA_PARAM_TILE_KV, "--tile-kv", "tile_kv", s->tile_kv},
        {FA_PARAM_KV_PACK, "--kv-pack", "kv_pack", s->kv_pack},
    };
    memcpy(out, all, sizeof all);
}

int cli_shape_finish(cli_shape *s, const char *verb)
{
    if (s->kv_heads == 0)
        s->kv_heads = s->heads;
    if (s->seq_kv == 0)
        s->seq_kv = s->seq;
    if (s->dim_v == 0)
        s->dim_v = s->dim;
    if (s->heads % s->kv_heads != 0) {
        fprintf(stderr, "flashattn %s: --heads %lld is not a multiple of --kv-heads %lld\n",
                verb, (long long)s->heads, (long long)s->kv_heads);
        return -1;
    }
    /* The library's own bounds, so a bad value is a usage error, not a failed run. */
    shape_setting bounded[SHAPE_SETTINGS];
    shape_settings(s, bounded);
    for (size_t n = 0; n < SHAPE_SETTINGS; n++) {
        int64_t lo, hi;
        if (fa_param_bounds(bounded[n].param, &lo, &hi) == FA_OK &&
            (bounded[n].value < lo || bounded[n].value > hi)) {
            fprintf(stderr, "flashattn %s: %s %lld is outside the library's range %lld..%lld\n",
                    verb, bounded[n].flag, (long long)bounded[n].value, (long long)lo,
                    (long long)hi);
            return -1;
        }
    }
    int64_t e;
    if (!elems_ok(s->batch, s->seq, s->heads, s->dim, &e) ||
        !elems_ok(s->batch, s->seq_kv, s->kv_heads, s->dim, &e) ||
        !elems_ok(s->batch, s->seq_kv, s->kv_heads, s->dim_v, &e) ||
        !elems_ok(s->batch, s->seq, s->heads, s->dim_v, &e)) {
        fprintf(stderr, "flashattn %s: the shape is too large to address\n", verb);
        return -1;
    }
    return 0;
}

static const char *algo_flag_name(fa_algo a)
{
    switch (a) {
    case FA_ALGO_AUTO: return "auto";
    case FA_ALGO_FLASH: return "flash";
    case FA_ALGO_STANDARD: return "standard";
    case FA_ALGO_REFERENCE: return "reference";
    }
    return "?";
}

static const char *dtype_flag_name(fa_dtype d)
{
    switch (d) {
    case FA_DTYPE_F32: return "f32";
    case FA_DTYPE_F16: return "f16";
    case FA_DTYPE_BF16: return "bf16";
    case FA_DTYPE_I8: return "i8";
    case FA_DTYPE_F8E4M3: return "f8e4m3";
    case FA_DTYPE_F8E5M2: return "f8e5m2";
    case FA_DTYPE_BOOL: break;
    }
    return "?";
}

void cli_shape_usage(FILE *f, const cli_shape *d)
{
    fprintf(f,
            "Shape flags (value as the next argument or after '='):\n"
            "  --batch N          batch size B                        [%lld]\n"
            "  --heads N          query heads Hq                      [%lld]\n"
            "  --kv-heads N       key/value heads Hk, divides Hq      [= heads]\n"
            "  --seq N            query length Sq                     [%lld]\n"
            "  --seq-kv N         key/value length Sk                 [= seq]\n"
            "  --dim N            head dim D of q and k               [%lld]\n"
            "  --dim-v N          head dim Dv of v and o              [= dim]\n"
            "  --dtype T          f32 | f16 | bf16                    [%s]\n"
            "  --causal           causal mask, bottom-right aligned (keep j <= i + Sk - Sq)\n"
            "  --causal=A         A = bottom-right | top-left (keep j <= i) | none\n"
            "  --window L,R       sliding window, -1 = unbounded, bottom-right aligned\n"
            "  --threads N        worker threads, 0 = all CPUs        [%lld]\n"
            "  --algo A           auto | flash | standard | reference [%s]\n"
            "  --tile-q N         flash Q tile rows, 0 = planned      [%lld]\n"
            "  --tile-kv N        flash K/V tile rows, 0 = planned    [%lld]\n"
            "  --kv-pack M        flash forward: pack each (sequence, kv head)'s K/V once,\n"
            "                     0 = where it pays, 1 = never, 2 = always [0]\n"
            "  --quant-matmul M   exact | i8 | i8x2: products on int8 codes (decoding over\n"
            "                     int8 caches; docs/semantics.md, 11) [FLASHATTN_QUANT_MATMUL]\n"
            "  --runs N           timed runs                          [%lld]\n"
            "  --seed N           seed of the random inputs and the dropout mask [%lld]\n"
            "  --dropout P        dropout probability in [0, 1), offset 0  [0]\n",
            (long long)d->batch, (long long)d->heads, (long long)d->seq, (long long)d->dim,
            dtype_flag_name(d->dtype), (long long)d->threads, algo_flag_name(d->algo),
            (long long)d->tile_q, (long long)d->tile_kv, (long long)d->runs, (long long)d->seed);
}

const char *cli_causal_name(fa_causal c)
{
    switch (c) {
    case FA_CAUSAL_NONE: return "none";
    case FA_CAUSAL_BOTTOM_RIGHT: return "bottom-right";
    case FA_CAUSAL_TOP_LEFT: return "top-left";
    }
    return "?";
}

void cli_shape_describe(const cli_shape *s, char *buf, size_t n)
{
    int w = snprintf(buf, n, "B=%lld Hq=%lld Hk=%lld Sq=%lld Sk=%lld D=%lld Dv=%lld",
                     (long long)s->batch, (long long)s->heads, (long long)s->kv_heads,
                     (long long)s->seq, (long long)s->seq_kv, (long long)s->dim,
                     (long long)s->dim_v);
    if (w < 0 || (size_t)w >= n)
        return;
    if (s->causal != FA_CAUSAL_NONE) {
        int c = snprintf(buf + w, n - (size_t)w, " causal=%s", cli_causal_name(s->causal));
        if (c < 0 || (size_t)c >= n - (size_t)w)
            return;
        w += c;
    }
    if (s->window_left != FA_WINDOW_UNBOUNDED || s->window_right != FA_WINDOW_UNBOUNDED) {
        int c = snprintf(buf + w, n - (size_t)w, " window=%lld,%lld", (long long)s->window_left,
                         (long long)s->window_right);
        if (c < 0 || (size_t)c >= n - (size_t)w)
            return;
        w += c;
    }
    if (s->dropout > 0.0)
        snprintf(buf + w, n - (size_t)w, " dropout=%g", s->dropout);
}

int64_t cli_resolved_threads(int64_t threads)
{
    if (threads > 0)
        return threads;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int64_t)n : 1;
}

int cli_context_make(const cli_shape *s, const char *verb, fa_context **out)
{
    *out = NULL;
    fa_context *ctx = NULL;
    fa_status st = fa_context_create(&ctx);
    if (st != FA_OK) {
        fprintf(stderr, "flashattn %s: cannot create a context: %s\n", verb, fa_status_string(st));
        return -1;
    }
    shape_setting settings[SHAPE_SETTINGS];
    shape_settings(s, settings);
    for (size_t n = 0; n < SHAPE_SETTINGS; n++) {
        st = fa_context_set(ctx, settings[n].param, settings[n].value);
        if (st != FA_OK) {
            fprintf(stderr, "flashattn %s: setting %s: %s: %s\n", verb, settings[n].what,
                    fa_status_string(st), fa_context_error(ctx));
            fa_context_free(ctx);
            return -1;
        }
    }
    if (s->quant_matmul >= 0 && (st = fa_context_set(ctx, FA_PARAM_QUANT_MATMUL, s->quant_matmul)) != FA_OK) {
        fprintf(stderr, "flashattn %s: setting quant_matmul: %s: %s\n", verb, fa_status_string(st),
                fa_context_error(ctx));
        fa_context_free(ctx);
        return -1;
    }
    *out = ctx;
    return 0;
}

int cli_parse_i64_list(const char *text, int64_t lo, int64_t *out, int max)
{
    if (text == NULL || *text == '\0')
        return -1;
    int n = 0;
    for (const char *p = text;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        int64_t v;
        if (len == 0 || len >= sizeof item || n >= max)
            return -1;
        memcpy(item, p, len);
        item[len] = '\0';
        if (cli_parse_i64(item, &v) != 0 || v < lo)
            return -1;
        out[n++] = v;
        if (!comma)
            return n;
        p = comma + 1;
    }
}

/* --------------------------------------------------------- f16 and bf16 */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t cli_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) /* inf, or NaN kept quiet with its top payload bits */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x0200u | ((ax >> 13) & 0x3ffu) : 0u));
    if (ax >= 0x477ff000u) /* >= 65520, halfway past the largest finite 65504: ties go to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: an f16 subnormal, counted in units of 2^-24 */
        if (ax <= 0x33000000u) /* <= 2^-25, at most half a unit: rounds to (even) zero */
            return sign;
        uint32_t exp = ax >> 23;
        uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - exp; /* value / 2^-24 = mant * 2^(exp - 126) */
        uint32_t r = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u)))
            r++; /* may carry into the smallest normal, whose encoding is the same */
        return (uint16_t)(sign | r);
    }
    /* Normal: rebias the exponent (127 -> 15) and drop 13 mantissa bits. */
    uint32_t h = (ax - 0x38000000u) >> 13;
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is the correct next binade */
    return (uint16_t)(sign | h);
}

float cli_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)mant * 0x1p-24f; /* exact: mant < 2^10 */
        return sign ? -v : v;
    }
    if (exp == 31)
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t cli_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it NaN even if the payload is low */
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u); /* overflow to inf is the right rounding */
    return (uint16_t)(x >> 16);
}

float cli_bf16_to_f32(uint16_t b)
{
    return bits_f32((uint32_t)b << 16);
}

double cli_load(const void *data, fa_dtype dtype, int64_t i)
{
    switch (dtype) {
    case FA_DTYPE_F32: return ((const float *)data)[i];
    case FA_DTYPE_F16: return cli_f16_to_f32(((const uint16_t *)data)[i]);
    case FA_DTYPE_BF16: return cli_bf16_to_f32(((const uint16_t *)data)[i]);
    case FA_DTYPE_BOOL: return ((const unsigned char *)data)[i] != 0;
    case FA_DTYPE_I8: return ((const int8_t *)data)[i];
    case FA_DTYPE_F8E4M3: /* KV caches only: the CLI never loads them */
    case FA_DTYPE_F8E5M2: break;
    }
    return NAN;
}

/* ---------------------------------------------------------------- buffers */

void *cli_alloc(int64_t elems, size_t elem_size)
{
    if (elems <= 0 || elem_size == 0 || (uint64_t)elems > (SIZE_MAX - 64) / elem_size)
        return NULL;
    /* aligned_alloc wants a multiple of the alignment; 64 keeps rows cache-line
     * aligned like a framework's allocator would, so timings are not skewed. */
    size_t bytes = ((size_t)elems * elem_size + 63u) & ~(size_t)63u;
    void *p = aligned_alloc(64, bytes);
    if (p)
        memset(p, 0, bytes); /* also faults the pages in before anything is timed */
    return p;
}

void cli_free(void *p)
{
    free(p);
}

/* splitmix64: tiny, seedable, and the same numbers on every platform. */
static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1) with 24 random bits, so every value is exact in f32. */
static void fill_random(void *data, fa_dtype dtype, int64_t n, uint64_t seed)
{
    uint64_t state = seed;
    for (int64_t i = 0; i < n; i++) {
        int64_t r = (int64_t)(splitmix64(&state) >> 40) - ((int64_t)1 << 23);
        float x = (float)r * 0x1p-23f;
        switch (dtype) {
        case FA_DTYPE_F32: ((float *)data)[i] = x; break;
        case FA_DTYPE_F16: ((uint16_t *)data)[i] = cli_f32_to_f16(x); break;
        case FA_DTYPE_BF16: ((uint16_t *)data)[i] = cli_f32_to_bf16(x); break;
        case FA_DTYPE_I8: ((int8_t *)data)[i] = (int8_t)(r >> 16); break; /* [-128, 127] */
        case FA_DTYPE_F8E4M3:
        case FA_DTYPE_F8E5M2: ((uint8_t *)data)[i] = (uint8_t)((r >> 16) & 0xbf); break; /* |value| < 2 */
        case FA_DTYPE_BOOL: break;
        }
    }
}

int cli_inputs_make(const cli_shape *s, cli_inputs *in)
{
    memset(in, 0, sizeof *in);
    size_t es = fa_dtype_size(s->dtype);
    int64_t nq = s->batch * s->seq * s->heads * s->dim; /* sizes checked by cli_shape_finish */
    int64_t nk = s->batch * s->seq_kv * s->kv_heads * s->dim;
    int64_t nv = s->batch * s->seq_kv * s->kv_heads * s->dim_v;
    in->o_elems = s->batch * s->seq * s->heads * s->dim_v;
    in->lse_elems = s->batch * s->heads * s->seq;
    in->q = cli_alloc(nq, es);
    in->k = cli_alloc(nk, es);
    in->v = cli_alloc(nv, es);
    if (!in->q || !in->k || !in->v) {
        fprintf(stderr, "flashattn: out of memory allocating q, k, v (%.1f MiB)\n",
                (double)(nq + nk + nv) * (double)es / (1024.0 * 1024.0));
        cli_inputs_free(in);
        return -1;
    }
    /* Distinct streams per tensor, so q, k and v are not copies of each other. */
    uint64_t seed = (uint64_t)s->seed * 0x2545f4914f6cdd1dull;
    fill_random(in->q, s->dtype, nq, seed ^ 0x71ull);
    fill_random(in->k, s->dtype, nk, seed ^ 0x6bull);
    fill_random(in->v, s->dtype, nv, seed ^ 0x76ull);
    return 0;
}

void cli_inputs_free(cli_inputs *in)
{
    cli_free(in->q);
    cli_free(in->k);
    cli_free(in->v);
    in->q = in->k = in->v = NULL;
}

fa_forward_args cli_forward_args(const cli_shape *s, const cli_inputs *in,
                                 void *o, fa_dtype o_dtype, float *lse)
{
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = fa_tensor_make(in->q, s->dtype, FA_LAYOUT_BSND, s->batch, s->seq, s->heads, s->dim);
    a.k = fa_tensor_make(in->k, s->dtype, FA_LAYOUT_BSND, s->batch, s->seq_kv, s->kv_heads, s->dim);
    a.v = fa_tensor_make(in->v, s->dtype, FA_LAYOUT_BSND, s->batch, s->seq_kv, s->kv_heads,
                         s->dim_v);
    a.o = fa_tensor_make(o, o_dtype, FA_LAYOUT_BSND, s->batch, s->seq, s->heads, s->dim_v);
    if (lse)
        a.lse = fa_tensor_contiguous(lse, FA_DTYPE_F32, s->batch, s->heads, s->seq, 1);
    a.causal = s->causal;
    a.window_left = s->window_left;
    a.window_right = s->window_right;
    a.dropout_p = (float)s->dropout;
    a.dropout_seed = (uint64_t)s->seed;
    a.dropout_offset = 0;
    return a;
}

void cli_timed_io_free(cli_timed_io *b)
{
    cli_free(b->times);
    cli_free(b->o);
    cli_free(b->lse);
    cli_inputs_free(&b->in);
    memset(b, 0, sizeof *b);
}

int cli_timed_io_make(const cli_shape *s, int with_lse, cli_timed_io *b)
{
    memset(b, 0, sizeof *b);
    if (cli_inputs_make(s, &b->in) != 0)
        return -1;
    b->o = cli_alloc(b->in.o_elems, fa_dtype_size(s->dtype));
    if (with_lse)
        b->lse = cli_alloc(b->in.lse_elems, sizeof(float));
    b->times = cli_alloc(s->runs > 0 ? s->runs : 1, sizeof *b->times);
    if (!b->o || (with_lse && !b->lse) || !b->times) {
        fprintf(stderr, "flashattn bench: out of memory allocating %s\n", with_lse ? "o and lse" : "the output");
        cli_timed_io_free(b);
        return -1;
    }
    return 0;
}

int cli_grads_make(const cli_shape *s, fa_dtype grad_dtype, cli_grads *g)
{
    memset(g, 0, sizeof *g);
    g->dtype = grad_dtype;
    size_t es = fa_dtype_size(s->dtype), gs = fa_dtype_size(grad_dtype);
    int64_t n_do = s->batch * s->seq * s->heads * s->dim_v; /* checked by cli_shape_finish */
    g->dq_elems = s->batch * s->seq * s->heads * s->dim;
    g->dk_elems = s->batch * s->seq_kv * s->kv_heads * s->dim;
    g->dv_elems = s->batch * s->seq_kv * s->kv_heads * s->dim_v;
    g->do_ = cli_alloc(n_do, es);
    g->dq = cli_alloc(g->dq_elems, gs);
    g->dk = cli_alloc(g->dk_elems, gs);
    g->dv = cli_alloc(g->dv_elems, gs);
    if (!g->do_ || !g->dq || !g->dk || !g->dv) {
        fprintf(stderr, "flashattn: out of memory allocating do, dq, dk, dv (%.1f MiB)\n",
                ((double)n_do * (double)es +
                 (double)(g->dq_elems + g->dk_elems + g->dv_elems) * (double)gs) /
                    (1024.0 * 1024.0));
        cli_grads_free(g);
        return -1;
    }
    fill_random(g->do_, s->dtype, n_do, ((uint64_t)s->seed * 0x2545f4914f6cdd1dull) ^ 0x64ull);
    return 0;
}

void cli_grads_free(cli_grads *g)
{
    cli_free(g->do_);
    cli_free(g->dq);
    cli_free(g->dk);
    cli_free(g->dv);
    g->do_ = g->dq = g->dk = g->dv = NULL;
}

fa_backward_args cli_backward_args(const cli_shape *s, const fa_forward_args *fwd,
                                   const cli_grads *g)
{
    fa_backward_args a = FA_BACKWARD_ARGS_INIT;
    a.fwd = fwd;
    a.do_ = fa_tensor_make(g->do_, s->dtype, FA_LAYOUT_BSND, s->batch, s->seq, s->heads,
                           s->dim_v);
    a.dq = fa_tensor_make(g->dq, g->dtype, FA_LAYOUT_BSND, s->batch, s->seq, s->heads, s->dim);
    a.dk = fa_tensor_make(g->dk, g->dtype, FA_LAYOUT_BSND, s->batch, s->seq_kv, s->kv_heads,
                          s->dim);
    a.dv = fa_tensor_make(g->dv, g->dtype, FA_LAYOUT_BSND, s->batch, s->seq_kv, s->kv_heads,
                          s->dim_v);
    return a;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double cli_cpu_seconds(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0.0;
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}
