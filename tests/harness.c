/*
 * harness.c: the shared test helpers. Nothing here calls into the library except to
 * run a forward call (h_run) and to initialise args; number conversions, element access
 * and the RNG are our own so that a bug in the library cannot hide in the harness.
 */
#include "harness.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ RNG */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void h_rng_seed(h_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256** */
uint64_t h_rng_next(h_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double h_rng_uniform(h_rng *r) { return (double)(h_rng_next(r) >> 11) * 0x1.0p-53; }

double h_rng_range(h_rng *r, double lo, double hi) { return lo + (hi - lo) * h_rng_uniform(r); }

int64_t h_rng_int(h_rng *r, int64_t lo, int64_t hi) {
    uint64_t span = (uint64_t)(hi - lo) + 1u;
    return lo + (int64_t)(h_rng_next(r) % span);
}

double h_rng_normal(h_rng *r) {
    /* Box-Muller; u1 in (0, 1] so log is finite. */
    double u1 = 1.0 - h_rng_uniform(r);
    double u2 = h_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t h_env_u64(const char *name, uint64_t fallback) {
    const char *s = getenv(name);
    if (!s || !*s) return fallback;
    return strtoull(s, NULL, 0);
}

/* ------------------------------------------------------- number formats */

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

uint16_t h_f32_to_f16(float x) {
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (a >= 0x38800000u) {                                  /* normal in f16: >= 2^-14 */
        uint32_t h = (a >> 13) - (112u << 10);               /* rebias 127 -> 15 */
        uint32_t rest = a & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    if (a < 0x33000000u) return sign; /* <= 2^-25 (the tie goes to even 0) */
    /* Subnormal: value / 2^-24 = m * 2^(e - 126), rounded to nearest even. */
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t n = m >> shift;
    uint32_t rest = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (n & 1u))) n++;
    return (uint16_t)(sign | n);
}

float h_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        /* zero or subnormal: m * 2^-24, exact in float */
        float v = (float)m * 0x1.0p-24f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t h_f32_to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    uint32_t lsb = (u >> 16) & 1u;
    return (uint16_t)((u + 0x7fffu + lsb) >> 16);
}

float h_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

/* The fp8 formats from their definitions (OCP 8-bit floating point): sign, then
 * ebits of exponent with bias 2^(ebits-1) - 1, then mbits of mantissa. E4M3 ("fn")
 * has no inf, and only S.1111.111 is NaN; E5M2 has IEEE's inf and NaN. */
double h_fp8_to_double(unsigned b, fa_dtype dtype) {
    const int e4m3 = dtype == FA_DTYPE_F8E4M3, ebits = e4m3 ? 4 : 5, mbits = e4m3 ? 3 : 2;
    const int bias = (1 << (ebits - 1)) - 1, emax = (1 << ebits) - 1;
    const int e = (int)(b >> mbits) & emax, m = (int)b & ((1 << mbits) - 1);
    double v;
    if (e4m3 && e == emax && m == (1 << mbits) - 1) v = NAN;
    else if (!e4m3 && e == emax) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp(m, 1 - bias - mbits);      /* subnormal */
    else v = ldexp(1.0 + ldexp(m, -mbits), e - bias);
    return (b & 0x80u) ? -v : v;
}

unsigned h_fp8_from_double(double x, fa_dtype dtype) {
    const unsigned sign = signbit(x) ? 0x80u : 0u;
    if (isnan(x)) return sign | 0x7fu;
    if (isinf(x)) return sign | (dtype == FA_DTYPE_F8E4M3 ? 0x7fu : 0x7cu);
    /* the nearest finite code (ties to the even code); past the largest, the largest.
     * The positive codes' values increase with the code: bisect for lo <= |x| < hi */
    const double a = fabs(x);
    const unsigned top = dtype == FA_DTYPE_F8E4M3 ? 0x7eu : 0x7bu; /* the largest finite */
    if (a >= h_fp8_to_double(top, dtype)) return sign | top;
    unsigned lo = 0, hi = top;
    while (hi - lo > 1) {
        const unsigned mid = (lo + hi) / 2;
        if (h_fp8_to_double(mid, dtype) <= a) lo = mid;
        else hi = mid;
    }
    const double dlo = a - h_fp8_to_double(lo, dtype), dhi = h_fp8_to_double(hi, dtype) - a;
    return sign | (dlo < dhi || (dlo == dhi && !(lo & 1u)) ? lo : hi);
}

double h_round(double x, fa_dtype dtype) {
    float f = (float)x;
    switch (dtype) {
    case FA_DTYPE_F16: return h_f16_to_f32(h_f32_to_f16(f));
    case FA_DTYPE_BF16: return h_bf16_to_f32(h_f32_to_bf16(f));
    default: return f;
    }
}

double h_eps(fa_dtype dtype) {
    switch (dtype) {
    case FA_DTYPE_F16: return 0x1.0p-10;
    case FA_DTYPE_BF16: return 0x1.0p-7;
    default: return 0x1.0p-23;
    }
}

size_t h_dtype_bytes(fa_dtype dtype) {
    switch (dtype) {
    case FA_DTYPE_F32: return 4;
    case FA_DTYPE_F16:
    case FA_DTYPE_BF16: return 2;
    case FA_DTYPE_BOOL:
    case FA_DTYPE_I8:
    case FA_DTYPE_F8E4M3:
    case FA_DTYPE_F8E5M2: return 1;
    }
    return 0;
}

/* The library's names, so that a case line says what its messages say. */
const char *h_dtype_str(fa_dtype dtype) { return fa_dtype_name(dtype); }

const char *h_algo_str(fa_algo algo) { return fa_algo_name(algo); }

void h_store_nan(void *p, fa_dtype dtype) {
    switch (dtype) {
    case FA_DTYPE_F32: {
        uint32_t u = 0x7fc00000u;
        memcpy(p, &u, 4);
        break;
    }
    case FA_DTYPE_F16: {
        uint16_t u = 0x7e00u;
        memcpy(p, &u, 2);
        break;
    }
    case FA_DTYPE_BF16: {
        uint16_t u = 0x7fc0u;
        memcpy(p, &u, 2);
        break;
    }
    case FA_DTYPE_BOOL:
    case FA_DTYPE_I8: { /* no NaN in these: 0 */
        unsigned char c = 0;
        memcpy(p, &c, 1);
        break;
    }
    case FA_DTYPE_F8E4M3:
    case FA_DTYPE_F8E5M2: *(unsigned char *)p = 0x7fu; break; /* a NaN in both */
    }
}

/* ------------------------------------------------------- tensor access */

int64_t h_offset(const fa_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2] + i3 * t->stride[3];
}

static char *elem_ptr(const fa_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return (char *)t->data + h_offset(t, i0, i1, i2, i3) * (int64_t)h_dtype_bytes(t->dtype);
}

double h_get(const fa_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    const char *p = elem_ptr(t, i0, i1, i2, i3);
    switch (t->dtype) {
    case FA_DTYPE_F32: {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    case FA_DTYPE_F16: {
        uint16_t h;
        memcpy(&h, p, 2);
        return h_f16_to_f32(h);
    }
    case FA_DTYPE_BF16: {
        uint16_t h;
        memcpy(&h, p, 2);
        return h_bf16_to_f32(h);
    }
    case FA_DTYPE_BOOL: return *(const unsigned char *)p ? 1.0 : 0.0;
    case FA_DTYPE_I8: return *(const signed char *)p;
    case FA_DTYPE_F8E4M3:
    case FA_DTYPE_F8E5M2: return h_fp8_to_double(*(const unsigned char *)p, t->dtype);
    }
    return NAN;
}

void h_set(const fa_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, double x) {
    char *p = elem_ptr(t, i0, i1, i2, i3);
    switch (t->dtype) {
    case FA_DTYPE_F32: {
        float f = (float)x;
        memcpy(p, &f, 4);
        break;
    }
    case FA_DTYPE_F16: {
        uint16_t h = h_f32_to_f16((float)x);
        memcpy(p, &h, 2);
        break;
    }
    case FA_DTYPE_BF16: {
        uint16_t h = h_f32_to_bf16((float)x);
        memcpy(p, &h, 2);
        break;
    }
    case FA_DTYPE_BOOL: *(unsigned char *)p = (x != 0.0) ? 1 : 0; break;
    case FA_DTYPE_I8: *(signed char *)p = (signed char)(x > 127 ? 127 : x < -128 ? -128 : x); break;
    case FA_DTYPE_F8E4M3:
    case FA_DTYPE_F8E5M2: *(unsigned char *)p = (unsigned char)h_fp8_from_double(x, t->dtype); break;
    }
}

uint32_t h_bits(const fa_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    const char *p = elem_ptr(t, i0, i1, i2, i3);
    uint32_t u = 0;
    switch (h_dtype_bytes(t->dtype)) {
    case 4: memcpy(&u, p, 4); break;
    case 2: {
        uint16_t h;
        memcpy(&h, p, 2);
        u = h;
        break;
    }
    case 1: u = *(const unsigned char *)p; break;
    default: break;
    }
    return u;
}

int64_t h_numel(const fa_tensor *t) {
    return t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
}

size_t h_nbytes(const fa_tensor *t) { return (size_t)h_numel(t) * h_dtype_bytes(t->dtype); }

fa_tensor h_clone(const fa_tensor *t) {
    fa_tensor c = *t;
    c.data = malloc(h_nbytes(t) ? h_nbytes(t) : 1);
    memcpy(c.data, t->data, h_nbytes(t));
    return c;
}

int h_same_bytes(const fa_tensor *a, const fa_tensor *b) { return memcmp(a->data, b->data, h_nbytes(a)) == 0; }

fa_tensor h_alloc(fa_dtype dtype, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    fa_tensor t;
    memset(&t, 0, sizeof t);
    int64_t n = d0 * d1 * d2 * d3;
    t.data = calloc((size_t)(n > 0 ? n : 1), h_dtype_bytes(dtype));
    if (!t.data) {
        fprintf(stderr, "harness: out of memory (%lld elements)\n", (long long)n);
        exit(2);
    }
    t.dtype = dtype;
    t.shape[0] = d0;
    t.shape[1] = d1;
    t.shape[2] = d2;
    t.shape[3] = d3;
    t.stride[3] = 1;
    t.stride[2] = d3;
    t.stride[1] = d2 * d3;
    t.stride[0] = d1 * d2 * d3;
    return t;
}

#define FOR_EACH(t, a, b, c, d)                         \
    for (int64_t a = 0; a < (t)->shape[0]; a++)         \
        for (int64_t b = 0; b < (t)->shape[1]; b++)     \
            for (int64_t c = 0; c < (t)->shape[2]; c++) \
                for (int64_t d = 0; d < (t)->shape[3]; d++)

void h_fill(const fa_tensor *t, double x) {
    FOR_EACH(t, a, b, c, d) h_set(t, a, b, c, d, x);
}

void h_fill_normal(const fa_tensor *t, h_rng *r, double sigma) {
    FOR_EACH(t, a, b, c, d) h_set(t, a, b, c, d, sigma * h_rng_normal(r));
}

void h_copy(const fa_tensor *dst, const fa_tensor *src) {
    FOR_EACH(src, a, b, c, d) h_set(dst, a, b, c, d, h_get(src, a, b, c, d));
}

/* ---------------------------------------------------- a contiguous problem */

void h_problem_alloc(h_problem *p, h_dims dims, fa_dtype dtype, fa_dtype out_dtype) {
    fa_forward_args init = FA_FORWARD_ARGS_INIT;
    memset(p, 0, sizeof *p);
    p->dims = dims;
    p->dtype = dtype;
    p->out_dtype = out_dtype;
    p->args = init;
    p->args.q = h_alloc(dtype, dims.B, dims.Sq, dims.Hq, dims.D);
    p->args.k = h_alloc(dtype, dims.B, dims.Sk, dims.Hk, dims.D);
    p->args.v = h_alloc(dtype, dims.B, dims.Sk, dims.Hk, dims.Dv);
    p->args.o = h_alloc(out_dtype, dims.B, dims.Sq, dims.Hq, dims.Dv);
    p->args.lse = h_alloc(FA_DTYPE_F32, dims.B, dims.Hq, dims.Sq, 1);
}

void h_problem_free(h_problem *p) {
    free(p->args.q.data);
    free(p->args.k.data);
    free(p->args.v.data);
    free(p->args.o.data);
    free(p->args.lse.data);
    memset(p, 0, sizeof *p);
}

void h_poison_outputs(const fa_forward_args *args) {
    h_fill(&args->o, 12345.0);
    if (args->lse.data) h_fill(&args->lse, 12345.0);
}

fa_status h_run(fa_context *ctx, fa_algo algo, int64_t threads, const fa_forward_args *args) {
    fa_status st = fa_context_set(ctx, FA_PARAM_ALGO, (int64_t)algo);
    if (st != FA_OK) return st;
    st = fa_context_set(ctx, FA_PARAM_THREADS, threads);
    if (st != FA_OK) return st;
    return fa_forward(ctx, args);
}

fa_status h_set_tiles(fa_context *ctx, int64_t tile_q, int64_t tile_kv) {
    fa_status st = fa_context_set(ctx, FA_PARAM_TILE_Q, tile_q);
    return st != FA_OK ? st : fa_context_set(ctx, FA_PARAM_TILE_KV, tile_kv);
}

const char *h_dims_str(const h_dims *d) {
    static char buf[160];
    snprintf(buf, sizeof buf, "B=%lld Sq=%lld Sk=%lld Hq=%lld Hk=%lld D=%lld Dv=%lld",
             (long long)d->B, (long long)d->Sq, (long long)d->Sk, (long long)d->Hq,
             (long long)d->Hk, (long long)d->D, (long long)d->Dv);
    return buf;
}

/* ------------------------------------------------------------ tolerances */

double h_ka_tol(fa_dtype in_dtype, fa_dtype out_dtype) {
    /* o is in_dtype or f32, so the coarser of the two is in_dtype */
    (void)out_dtype;
    return in_dtype == FA_DTYPE_F32 ? 16.0 * FLT_EPSILON : 4.0 * h_eps(in_dtype);
}

double h_ka_lse_tol(fa_dtype in_dtype) {
    /* lse is fp32, but a standard path may build it from S rounded to the input dtype. */
    return in_dtype == FA_DTYPE_F32 ? 16.0 * FLT_EPSILON : 4.0 * h_eps(in_dtype);
}

double h_prop_ulps(fa_dtype out_dtype) { return out_dtype == FA_DTYPE_F32 ? 8.0 : 2.0; }

double h_prop_lse_ulps(void) { return 16.0; }

/* ------------------------------------------------------- context, scale */

fa_status h_context_create(fa_context **ctx) {
    const fa_status st = fa_context_create(ctx);
    const char *arch = getenv("FLASHATTN_ARCH");
    if (st == FA_ERR_ISA_UNAVAILABLE && arch && *arch) {
        /* the context is gone, so its error text is too: say what we know */
        printf("SKIP: FLASHATTN_ARCH=%s: %s (this CPU has: %s)\n", arch, fa_status_string(st),
               fa_cpu_features());
        fflush(stdout);
        exit(H_SKIP);
    }
    if (st == FA_OK && *ctx) {
        printf("flashattn %s, isa %s\n", fa_version_string(), fa_context_isa(*ctx));
        fflush(stdout);
    }
    return st;
}

#ifndef FA_TEST_SCALE
#define FA_TEST_SCALE 1.0
#endif

double h_test_scale(void) {
    double s = FA_TEST_SCALE;
    const char *env = getenv("FA_TEST_SCALE");
    if (env && *env) s = strtod(env, NULL);
    if (!(s > 0.0)) s = 1.0 / 64.0; /* nonsense (or 0) still runs something */
    return s > 1.0 ? 1.0 : s;
}

int h_scaled(int n) {
    const double x = floor((double)n * h_test_scale() + 0.5);
    return x < 1.0 ? 1 : (int)x;
}

/* ----------------------------------------------------------- reporting */

static int64_t g_passed, g_failed;
static char g_case[512];
enum { MAX_PRINTED_FAILURES = 100 };

void h_case(const char *fmt, ...) {
    static int verbose = -1; /* FA_TEST_VERBOSE=1: print every case as it starts (to place a crash) */
    if (verbose < 0) verbose = h_env_u64("FA_TEST_VERBOSE", 0) != 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_case, sizeof g_case, fmt, ap);
    va_end(ap);
    if (verbose) printf("case: %s\n", g_case), fflush(stdout);
}

int h_check(int ok, const char *file, int line, const char *expr, const char *fmt, ...) {
    if (ok) {
        g_passed++;
        return 1;
    }
    g_failed++;
    if (g_failed <= MAX_PRINTED_FAILURES) {
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        printf("FAIL %s:%d: %s\n  case: %s\n  %s\n", file, line, expr, g_case, msg);
        if (g_failed == MAX_PRINTED_FAILURES) printf("(further failures counted, not printed)\n");
        fflush(stdout);
    }
    return 0;
}

int64_t h_failures(void) { return g_failed; }

int h_summary(void) {
    printf("%lld passed, %lld failed\n", (long long)g_passed, (long long)g_failed);
    fflush(stdout);
    return g_failed ? 1 : 0;
}
