/*
 * fuzz_api.c: a libFuzzer target over the whole public API (issue 8).
 *
 * The input is a little program: byte 0 picks an entry point (dense fa_forward, varlen,
 * a contiguous, paged or int8 KV cache with or without an append, an MLA latent cache
 * (v_in_k: V as K's first Dv columns, valid views and ones that are not), fa_merge_states, or
 * the small calls: settings, bounds, names, tensor makers, probe misuse), the rest
 * decode every field: dims (small, zero, negative or one of a table of huge values),
 * per-tensor layouts (row-major, head-major, reversed, padded, negated, zero, raw or
 * huge strides, shapes that disagree), dtypes and enum values (valid or not), scale,
 * softcap, windows up to INT64_MAX, q_start/k_start, ALiBi, bias/mask broadcasts, block masks,
 * struct_size, cu_seqlens, seqlens, batch_idx, leftpad, block tables, thread counts and tiles.
 * A byte stream that runs out reads as zeros, so every input is a valid program.
 *
 * Memory: every tensor gets a buffer of exactly the bytes its shape and strides claim
 * (from the lowest to the highest element offset), so any access outside is an ASan
 * report. Inputs whose buffers would exceed MAX_TENSOR_BYTES / MAX_TOTAL_BYTES are
 * skipped; a call whose claimed work fits in 64 bits but exceeds MAX_WORK is skipped
 * too (it is legal and merely slow), while one whose sizes do not fit in 64 bits is
 * made (huge shapes over zero strides need a tiny buffer) and must fail.
 *
 * Oracles:
 *  - a failed call leaves every output and cache byte as it was;
 *  - no call writes its inputs;
 *  - a successful dense call matches FA_ALGO_REFERENCE on the same inputs within
 *    docs/semantics.md's rule (2x the naive same-precision error plus a few ulps; the
 *    naive attention of tests/naive.c gets positions and ALiBi folded into an explicit
 *    mask and bias); varlen and cached calls are checked the same way per sequence on
 *    dense copies the fuzzer gathers itself (after checking the appended cache rows
 *    and that no other cache byte changed); fa_merge_states against its formula;
 *  - flash with 1 and 2 threads is bitwise identical.
 * A violation aborts (a libFuzzer finding) after printing what differed.
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "harness.h"
#include "naive.h"

#define MAX_TENSOR_BYTES ((int64_t)2 << 20)
#define MAX_TOTAL_BYTES ((int64_t)6 << 20)
#define MAX_WORK ((int64_t)1 << 20)
#define MAX_SEQS 8
#define SENTINEL 0xa5

__extension__ typedef __int128 i128;

/* ------------------------------------------------------------ the reader */

typedef struct reader {
    const uint8_t *p;
    size_t n, at;
} reader;

static uint8_t u8(reader *r) { return r->at < r->n ? r->p[r->at++] : 0; }
static uint64_t u64(reader *r) {
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x |= (uint64_t)u8(r) << (8 * i);
    return x;
}

static const int64_t SPECIAL[16] = {0, -1, (int64_t)1 << 16, (int64_t)1 << 31, (int64_t)1 << 32, 3037000500LL,
                                    (int64_t)1 << 56, (int64_t)3 << 55, (int64_t)1 << 59, (int64_t)1 << 62,
                                    INT64_MAX, INT64_MIN, (int64_t)1 << 20, 1000, 513, -5};

/* A dim: mostly 0..max, 1 in 16 a special value. */
static int64_t rd_dim(reader *r, int max) {
    const uint8_t b = u8(r);
    if (b >= 0xF0) return SPECIAL[b & 15];
    return b % (max + 1);
}

static int64_t rd_window(reader *r) {
    static const int64_t W[16] = {-1, -1, -1, 0, 1, 2, 3, 7, INT64_MAX, INT64_MAX - 1, (int64_t)1 << 61,
                                  (int64_t)1 << 62, -2, INT64_MIN, 5, 16};
    return W[u8(r) & 15];
}

static int64_t rd_position(reader *r) {
    static const int64_t P[8] = {0, 0, 0, 1, 5, (int64_t)1 << 60, ((int64_t)1 << 60) + 1, -1};
    const uint8_t b = u8(r);
    if (b < 0xC0) return P[b & 7];
    return (int64_t)(b & 63);
}

/* A dtype for attention data: mostly f32/f16/bf16, sometimes anything. */
static fa_dtype rd_float_dtype(reader *r) {
    const uint8_t b = u8(r);
    if (b < 0xF0) return (fa_dtype)(b % 3);
    static const int bad[4] = {3, 4, 5, -1};
    return (fa_dtype)bad[b & 3];
}

/* ------------------------------------------------------------ values */

static uint64_t g_rng;
static double rnd(void) { /* uniform [0, 1) */
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}
static double rnorm(void) { return (rnd() + rnd() + rnd() - 1.5) * 2.0; }

static size_t esize(fa_dtype dt) {
    switch (dt) {
    case FA_DTYPE_F32: return 4;
    case FA_DTYPE_F16:
    case FA_DTYPE_BF16: return 2;
    case FA_DTYPE_BOOL:
    case FA_DTYPE_I8:
    case FA_DTYPE_F8E4M3:
    case FA_DTYPE_F8E5M2: return 1;
    default: return 4; /* an invalid dtype the library must refuse: any buffer will do */
    }
}

static void store_value(void *p, fa_dtype dt, double x) {
    switch (dt) {
    case FA_DTYPE_F16: { uint16_t h = h_f32_to_f16((float)x); memcpy(p, &h, 2); break; }
    case FA_DTYPE_BF16: { uint16_t h = h_f32_to_bf16((float)x); memcpy(p, &h, 2); break; }
    case FA_DTYPE_BOOL: *(uint8_t *)p = x != 0.0; break;
    case FA_DTYPE_I8: *(int8_t *)p = (int8_t)x; break;
    case FA_DTYPE_F8E4M3:
    case FA_DTYPE_F8E5M2: *(uint8_t *)p = (uint8_t)h_fp8_from_double(x, dt); break;
    default: { float f = (float)x; memcpy(p, &f, 4); break; }
    }
}

static double load_value(const void *p, fa_dtype dt) {
    switch (dt) {
    case FA_DTYPE_F16: { uint16_t h; memcpy(&h, p, 2); return h_f16_to_f32(h); }
    case FA_DTYPE_BF16: { uint16_t h; memcpy(&h, p, 2); return h_bf16_to_f32(h); }
    case FA_DTYPE_BOOL: return *(const uint8_t *)p != 0;
    case FA_DTYPE_I8: return *(const int8_t *)p;
    case FA_DTYPE_F8E4M3:
    case FA_DTYPE_F8E5M2: return h_fp8_to_double(*(const uint8_t *)p, dt);
    default: { float f; memcpy(&f, p, 4); return f; }
    }
}

/* ------------------------------------------------------------ tensors */

enum { KIND_INPUT = 0, KIND_OUTPUT = 1, KIND_CACHE = 2 };

typedef struct ften {
    fa_tensor t;
    unsigned char *base; /* the allocation: exactly `bytes` */
    int64_t bytes;
    unsigned char *before; /* its bytes before the call */
    int kind;
    int overlap;         /* two logical elements may share memory */
    int wanted_shape[4];
} ften;

#define MAX_TENSORS 40
typedef struct world {
    ften t[MAX_TENSORS];
    int n;
    int64_t total;
    int skip; /* too big to allocate */
} world;

static fa_tensor *g_dummy_tensor;

/* Offsets of the lowest and highest element, in elements; 0 elements when a dim is <= 0. */
static int extent(const fa_tensor *t, i128 *lo, i128 *hi) {
    *lo = *hi = 0;
    for (int d = 0; d < 4; d++) {
        if (t->shape[d] <= 0) return 0;
        /* held to +-2^100: four such spans cannot overflow i128, and any of them is far
         * beyond the largest buffer the fuzzer makes */
        const i128 cap = (i128)1 << 100;
        i128 span = (i128)(t->shape[d] - 1) * t->stride[d];
        if (span > cap) span = cap;
        if (span < -cap) span = -cap;
        if (span < 0) *lo += span;
        else *hi += span;
    }
    return 1;
}

/*
 * Builds a (d0, d1, d2, d3) tensor of dtype in a layout read from r, with a buffer of
 * exactly its extent. Outputs get the sentinel, inputs and caches random values
 * (sigma), bool 0/1, int8 -127..127.
 */
static fa_tensor *make(world *w, reader *r, fa_dtype dt, int64_t d0, int64_t d1, int64_t d2, int64_t d3, int kind,
                       double sigma) {
    if (w->n == MAX_TENSORS) {
        w->skip = 1;
        return g_dummy_tensor;
    }
    ften *f = &w->t[w->n++];
    memset(f, 0, sizeof *f);
    f->kind = kind;
    fa_tensor *t = &f->t;
    t->dtype = dt;
    t->shape[0] = d0, t->shape[1] = d1, t->shape[2] = d2, t->shape[3] = d3;
    const uint8_t L = u8(r);
    /* the memory order of the axes, innermost last */
    int order[4] = {0, 1, 2, 3};
    int64_t pad = 0;
    switch (L & 3) {
    case 1: order[1] = 2, order[2] = 1; break;
    case 2: order[0] = 3, order[1] = 2, order[2] = 1, order[3] = 0; break;
    case 3: pad = ((L >> 2) & 3) + 1; break;
    default: break;
    }
    uint64_t acc = 1; /* wrapping on purpose: huge shapes give strides the library must refuse */
    for (int k = 3; k >= 0; k--) {
        const int ax = order[k];
        t->stride[ax] = (int64_t)acc;
        uint64_t len = (uint64_t)(t->shape[ax] > 0 ? t->shape[ax] : 1);
        if (k == 3) len += (uint64_t)pad;
        acc *= len;
    }
    if (L & 0x10) { /* walk one axis backwards */
        const int ax = (L >> 5) & 3;
        if (t->stride[ax] != INT64_MIN) t->stride[ax] = -t->stride[ax];
    }
    if (L & 0x80) {
        const uint8_t W = u8(r);
        const int ax = W & 3;
        switch ((W >> 2) & 7) {
        case 0: t->stride[ax] = 0; break;
        case 1: t->stride[ax] = SPECIAL[u8(r) & 15]; break;
        case 2: t->stride[ax] = (int8_t)u8(r); break;
        case 3: t->shape[ax] = rd_dim(r, 9); break;
        case 4: t->stride[ax] = INT64_MAX; break;
        case 5: t->stride[ax] = INT64_MIN; break;
        case 6: t->stride[ax] = (int64_t)u64(r); break;
        default: memset(t->stride, 0, sizeof t->stride); break;
        }
        f->overlap = 1;
    }
    i128 lo, hi;
    const int nonempty = extent(t, &lo, &hi);
    const i128 elems = nonempty ? hi - lo + 1 : 0;
    const i128 bytes = elems > MAX_TENSOR_BYTES ? (i128)MAX_TENSOR_BYTES + 1 : elems * (i128)esize(dt);
    if (bytes > MAX_TENSOR_BYTES || w->total + (int64_t)bytes > MAX_TOTAL_BYTES) {
        w->skip = 1;
        f->bytes = 0;
        f->base = NULL;
        t->data = NULL;
        w->n--;
        return g_dummy_tensor;
    }
    f->bytes = (int64_t)bytes;
    w->total += f->bytes;
    f->base = malloc((size_t)f->bytes);
    if (!f->base) f->base = malloc(1);
    t->data = nonempty ? f->base - (int64_t)lo * (int64_t)esize(dt) : f->base;
    const int64_t n = f->bytes / (int64_t)esize(dt);
    for (int64_t e = 0; e < n; e++) {
        unsigned char *p = f->base + e * (int64_t)esize(dt);
        if (kind == KIND_OUTPUT) memset(p, SENTINEL, esize(dt));
        else if (dt == FA_DTYPE_BOOL) *p = rnd() < 0.8;
        else if (dt == FA_DTYPE_I8) *(int8_t *)p = (int8_t)(rnd() * 255.0 - 127.0);
        else store_value(p, dt, sigma * rnorm());
    }
    return t;
}

static void world_free(world *w) {
    for (int i = 0; i < w->n; i++) free(w->t[i].base), free(w->t[i].before);
    w->n = 0;
}

static void snapshot(world *w) {
    for (int i = 0; i < w->n; i++) {
        ften *f = &w->t[i];
        free(f->before);
        f->before = malloc((size_t)f->bytes + 1);
        memcpy(f->before, f->base, (size_t)f->bytes);
    }
}

static ften *find(world *w, const fa_tensor *t) {
    for (int i = 0; i < w->n; i++)
        if (&w->t[i].t == t) return &w->t[i];
    return NULL;
}

/* Element (i0, i1, i2, i3) of t: its byte address. */
static unsigned char *at(const fa_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return (unsigned char *)t->data +
           (i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2] + i3 * t->stride[3]) * (int64_t)esize(t->dtype);
}

#define FINDING(...)                                                                                             \
    do {                                                                                                         \
        fprintf(stderr, "fuzz_api finding: " __VA_ARGS__);                                                      \
        fputc('\n', stderr);                                                                                     \
        abort();                                                                                                 \
    } while (0)

/* Tensors of these kinds must hold their bytes from before the call. */
static void expect_unchanged(world *w, int kinds_mask, const char *when, fa_status st) {
    for (int i = 0; i < w->n; i++) {
        ften *f = &w->t[i];
        if (!((kinds_mask >> f->kind) & 1)) continue;
        if (memcmp(f->before, f->base, (size_t)f->bytes) != 0)
            FINDING("%s (status %s): tensor %d (kind %d, shape %lld,%lld,%lld,%lld) changed", when,
                    fa_status_string(st), i, f->kind, (long long)f->t.shape[0], (long long)f->t.shape[1],
                    (long long)f->t.shape[2], (long long)f->t.shape[3]);
    }
}

static fa_status check_first(world *w, const fa_forward_args *seen, const char *what);
static void check_agrees(fa_status sc, fa_status st, const char *what);

/* ------------------------------------------------------------ sizes */

/* a * b in int64, or -1 when it does not fit (both >= 0). */
static int64_t mul_or_neg(int64_t a, int64_t b) {
    int64_t out;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &out)) return -1;
    return out;
}

/* a + b for sizes: -1 when either is negative or the sum does not fit. */
static int64_t add_or_neg(int64_t a, int64_t b) {
    int64_t out;
    if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &out)) return -1;
    return out;
}

/* The product of a tensor's dims; -1 when it does not fit; 0 with a dim <= 0. */
static int64_t numel(const fa_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < 4; d++) {
        if (t->shape[d] <= 0) return 0;
    }
    for (int d = 0; d < 4 && n >= 0; d++) n = mul_or_neg(n, t->shape[d]);
    return n;
}

/* Whether a count is legal but too much work for a fuzzer (fits in 64 bits, > MAX_WORK). */
static int too_slow(int64_t count) { return count > MAX_WORK; }

/* ------------------------------------------------------------ contexts */

static fa_context *g_ctx, *g_ref;
/* FUZZ_API_VERBOSE=1: one line per call on stderr, to see what a seed reaches. */
static int g_verbose;
static void trace(const char *what, fa_status st) {
    if (g_verbose) fprintf(stderr, "fuzz_api: %s -> %s %s\n", what, fa_status_string(st), st ? fa_context_error(g_ctx) : "");
}

/* Settings from the input; invalid ones must fail and change nothing. */
static int64_t apply_settings(reader *r, fa_algo *algo) {
    const uint8_t s = u8(r);
    const int64_t threads = 1 + (s & 1);
    static const fa_algo algos[4] = {FA_ALGO_FLASH, FA_ALGO_AUTO, FA_ALGO_FLASH, FA_ALGO_STANDARD};
    *algo = algos[(s >> 1) & 3];
    if (fa_context_set(g_ctx, FA_PARAM_THREADS, threads) != FA_OK) FINDING("set THREADS %lld", (long long)threads);
    if (fa_context_set(g_ctx, FA_PARAM_ALGO, *algo) != FA_OK) FINDING("set ALGO");
    int64_t tq = 0, tk = 0, splits = 0, dot = 0;
    if (s & 8) {
        static const int64_t T[8] = {0, 1, 2, 3, 8, 16, 17, 64};
        tq = T[u8(r) & 7], tk = T[u8(r) & 7];
    }
    if (s & 16) splits = u8(r) % 9;
    if (s & 32) dot = u8(r) % 3;
    /* packed K/V forced wherever shared (2) or left to auto (0); from the settings
     * byte itself, so that older inputs keep their meaning byte for byte */
    const int64_t pack = s & 128 ? 2 : 0;
    if (fa_context_set(g_ctx, FA_PARAM_TILE_Q, tq) != FA_OK || fa_context_set(g_ctx, FA_PARAM_TILE_KV, tk) != FA_OK ||
        fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, splits) != FA_OK || fa_context_set(g_ctx, FA_PARAM_BF16_DOT, dot) != FA_OK ||
        fa_context_set(g_ctx, FA_PARAM_KV_PACK, pack) != FA_OK)
        FINDING("a valid setting was refused: %s", fa_context_error(g_ctx));
    if (s & 64) { /* invalid settings: refused, nothing changes */
        static const int64_t bad[4] = {-1, 1025, INT64_MAX, INT64_MIN};
        const int64_t v = bad[u8(r) & 3];
        const fa_param params[4] = {FA_PARAM_THREADS, FA_PARAM_TILE_Q, FA_PARAM_KV_SPLITS, (fa_param)u8(r)};
        const fa_param prm = params[u8(r) & 3];
        if (prm == FA_PARAM_VERBOSE) return threads; /* would print; not an error either way */
        int64_t lo, hi;
        const int known = fa_param_bounds(prm, &lo, &hi) == FA_OK;
        if (prm == FA_PARAM_THREADS && v > 2) return threads; /* legal up to 1024, but slow */
        const fa_status st = fa_context_set(g_ctx, prm, v);
        if (st == FA_OK && (!known || v < lo || v > hi || prm >= FA_PARAM_LAST_ALGO))
            FINDING("fa_context_set(%d, %lld) accepted an out-of-range value", (int)prm, (long long)v);
        fa_context_set(g_ctx, FA_PARAM_THREADS, threads);
    }
    return threads;
}

/* ------------------------------------------------------------ dropout */

/* Philox4x32-10 as docs/semantics.md section 6 spells it, written here from the text
 * so that the dropout_mask the library returns is checked against an independent copy. */
static void philox(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3], k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        if (round) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
        const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0, c1 = (uint32_t)p1, c2 = n2, c3 = (uint32_t)p0;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* The keep bit of element (b, h, i, j) (i, j positions) of a call with dropout_p > 0. */
static int keep_bit(const fa_forward_args *a, int64_t b, int64_t h, int64_t Hq, int64_t i, int64_t j) {
    const uint32_t c[4] = {(uint32_t)(j / 4), (uint32_t)i, (uint32_t)(b * Hq + h), a->dropout_offset};
    const uint32_t k[2] = {(uint32_t)a->dropout_seed, (uint32_t)(a->dropout_seed >> 32)};
    uint32_t out[4];
    philox(c, k, out);
    const double t = floor((1.0 - (double)a->dropout_p) * 4294967296.0);
    return (double)out[j % 4] < t;
}

/* The table's known answers, once: a harness whose generator is wrong would report the
 * library for its own mistake. */
static void philox_self_test(void) {
    static const uint32_t C[3][4] = {{0, 0, 0, 0}, {~0u, ~0u, ~0u, ~0u}, {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}};
    static const uint32_t K[3][2] = {{0, 0}, {~0u, ~0u}, {0xa4093822, 0x299f31d0}};
    static const uint32_t O[3][4] = {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
                                     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
                                     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}};
    for (int t = 0; t < 3; t++) {
        uint32_t out[4];
        philox(C[t], K[t], out);
        if (memcmp(out, O[t], sizeof out) != 0) {
            fprintf(stderr, "fuzz_api: the harness's Philox fails known answer %d\n", t);
            abort();
        }
    }
}

/*
 * The dropout fields of a call from one byte (0 = off), read at the END of a branch's
 * program so that the seeds written before dropout existed keep their meaning. Bits
 * 0-3 pick dropout_p (valid, or one the library must refuse: negative, 1, NaN, inf),
 * 0x10 a full 64-bit seed, 0x20 a full offset; 0x40 and 0x80 are the caller's (the
 * dropout_mask output and its misuse). Returns the byte.
 */
static uint8_t rd_dropout(reader *r, fa_forward_args *a) {
    const uint8_t d = u8(r);
    if (!d) return 0;
    static const float P[16] = {0.0f, 0.1f, 0.5f, 0.9f, 0.999f, 1e-7f, 0.2f, 0.75f,
                                -0.1f, 1.0f, NAN, INFINITY, -0.0f, 0x1.fffffep-1f, -INFINITY, 1.5f};
    a->dropout_p = P[d & 15];
    a->dropout_seed = (d & 0x10) ? u64(r) : (uint64_t)u8(r) * 0x9E3779B97F4A7C15ull;
    a->dropout_offset = (d & 0x20) ? (uint32_t)u64(r) : u8(r);
    return d;
}

/*
 * The sinks of a call from one byte (0 = none), read at the very END of a branch's
 * program so that the seeds written before sinks existed keep their meaning. With
 * 0 < Hq <= 64 (the caller provides Hq floats) the call gets Hq logits from a table:
 * bit 0x80 reads one byte per head, which may pick NaN or +inf; otherwise finite ones
 * and -inf (no sink). Returns SINKS_INF when one is +inf (the call must be refused),
 * SINKS_NAN when one is NaN (no accuracy oracle), ORed with SINKS_ON when given.
 */
enum { SINKS_ON = 1, SINKS_INF = 2, SINKS_NAN = 4 };
static int rd_sinks(reader *r, fa_forward_args *a, int64_t Hq, float *buf) {
    const uint8_t s = u8(r);
    if (!s || Hq <= 0 || Hq > 64) return 0;
    static const float V[16] = {0.0f, 1.0f, -1.0f, 3.0f, 10.0f, 40.0f, -INFINITY, -5.0f,
                                0.5f, 100.0f, -100.0f, 2.0f, 88.0f, -0.0f, NAN, INFINITY};
    int flags = SINKS_ON;
    for (int64_t h = 0; h < Hq; h++) {
        buf[h] = V[(s & 0x80) ? (u8(r) & 15) : (uint8_t)((s + 3 * h) % 14)];
        if (buf[h] == INFINITY) flags |= SINKS_INF;
        if (isnan(buf[h])) flags |= SINKS_NAN;
    }
    a->sinks = buf;
    return flags;
}

/*
 * The options fa_forward_args gained after the decoders above were written (its OPTION
 * fields after sinks), from the library's description of its table (fa_args_field), read
 * at the very end of a branch's program, after the sinks (and the dense branch's block mask): one byte, 0 = none (a seed that
 * ends before reads zeros: the defaults), else one more byte per such field picking a
 * value of its type: the default, small ones, edges, and ones the library must refuse.
 * So a new option is fuzzed with no line here; the oracles are those of every call (a
 * success matches the reference algorithm run with the same options, 1 and 2 threads
 * agree bitwise, a failure writes nothing).
 */
static void rd_new_options(reader *r, fa_forward_args *a) {
    if (!u8(r)) return;
    static const int64_t I[16] = {0, 1, 2, 3, 4, 7, 16, 255, 256, 257, -1, -2, INT32_MAX, INT32_MIN, INT64_MAX, 64};
    static const float F[16] = {0.0f, 1.0f, 0.5f, 2.0f, -1.0f, 1e-3f, 1e3f, 0.25f,
                                -0.0f, 0.99f, 1.0f, 3.0f, 1e30f, NAN, INFINITY, -INFINITY};
    for (int i = 0;; i++) {
        fa_field f = FA_FIELD_INIT;
        if (fa_args_field(FA_ARGS_FORWARD, i, &f) != FA_OK) break;
        if (f.role != FA_ROLE_OPTION || f.offset <= offsetof(fa_forward_args, sinks)) continue;
        const uint8_t b = u8(r);
        char *at = (char *)a + f.offset;
        const int64_t v = b & 16 ? (int64_t)f.default_value : I[b & 15];
        const float x = b & 16 ? (float)f.default_value : F[b & 15];
        const int32_t v32 = (int32_t)v;
        const uint32_t u32 = (uint32_t)v;
        switch (f.type) {
        case FA_FIELD_F32: memcpy(at, &x, sizeof x); break;
        case FA_FIELD_I32: memcpy(at, &v32, sizeof v32); break;
        case FA_FIELD_U32: memcpy(at, &u32, sizeof u32); break;
        case FA_FIELD_I64: case FA_FIELD_U64: memcpy(at, &v, sizeof v); break;
        default: break;
        }
    }
}

/*
 * A block mask (fa_block_mask, docs/semantics.md "Block mask") from one byte and what it
 * asks for, read at the very END of the dense branch (after the sinks), so older seeds
 * keep their meaning. 0 = none. Bits 0, 1: a mask row per batch row, per head (else
 * broadcast); bits 2-4 one spoilt field (a q_blocks, index, element-mask number or
 * offset out of range, a duplicate, a batch or struct_size no library accepts), each
 * making `bad`; then block sizes, the share of blocks kept and of element masks. Its
 * arrays have exactly the entries the mask claims, so a read past them is an ASan
 * report. Shapes beyond the fuzzer's budget give no mask.
 */
typedef struct fz_bmask {
    fa_block_mask m;
    int64_t *off, *part;
    int32_t *idx;
    uint8_t *bits;
    int bad;
} fz_bmask;

/* The last call's, freed when the next one is read (so every return of a branch
 * leaves it reachable, not leaked). */
static fz_bmask g_bmask;

static int rd_block_mask(reader *r, fa_forward_args *a, fz_bmask *f) {
    free(f->off), free(f->part), free(f->idx), free(f->bits);
    memset(f, 0, sizeof *f);
    const uint8_t c = u8(r);
    const int64_t B = a->q.shape[0], Sq = a->q.shape[1], Hq = a->q.shape[2], Sk = a->k.shape[1];
    if (!c || B < 0 || B > 8 || Hq < 0 || Hq > 16 || Sq < 0 || Sq > 64 || Sk < 0 || Sk > 128) return 0;
    const int64_t bq = 1 + u8(r) % 24, bk = 1 + u8(r) % 40, batch = (c & 1) ? B : 1, heads = (c & 2) ? Hq : 1;
    const double keep = (double)u8(r) / 255.0, partial = (double)u8(r) / 255.0;
    const int64_t nqb = (Sq + bq - 1) / bq, nkb = (Sk + bk - 1) / bk, rows = batch * heads * nqb, rb = (bk + 7) / 8;
    if (rows * nkb > 4096) return 0;
    f->off = malloc(sizeof(int64_t) * (size_t)(rows + 1));
    f->idx = malloc(sizeof(int32_t) * (size_t)(rows * nkb + 1));
    f->part = malloc(sizeof(int64_t) * (size_t)(rows * nkb + 1));
    int64_t n = 0, np = 0;
    f->off[0] = 0;
    for (int64_t row = 0; row < rows; row++) {
        for (int64_t kb = nkb - 1; kb >= 0; kb--) /* descending: any order is legal */
            if (rnd() < keep) f->idx[n] = (int32_t)kb, f->part[n++] = rnd() < partial ? np++ : -1;
        f->off[row + 1] = n;
    }
    f->bits = malloc((size_t)(np * bq * rb + 1));
    for (int64_t e = 0; e < np * bq * rb; e++) f->bits[e] = (uint8_t)(rnd() * 256.0);
    fa_block_mask_init(&f->m);
    f->m.block_q = bq, f->m.block_k = bk, f->m.batch = batch, f->m.heads = heads, f->m.q_blocks = nqb;
    f->m.offsets = f->off, f->m.kv_blocks = f->idx, f->m.partial = f->part, f->m.bits = f->bits, f->m.n_partial = np;
    switch ((c >> 2) & 7) {
    case 1: f->m.q_blocks = nqb + 1, f->bad = 1; break;
    case 2: if (n > 0) f->idx[n - 1] = (int32_t)nkb, f->bad = 1; break;
    case 3: /* a row with two entries lists its first kv block twice */
        for (int64_t row = 0; row < rows && !f->bad; row++)
            if (f->off[row + 1] - f->off[row] >= 2) f->idx[f->off[row] + 1] = f->idx[f->off[row]], f->bad = 1;
        break;
    case 4: if (n > 0) f->part[0] = np, f->bad = 1; break;
    case 5: if (rows > 0) f->off[0] = 1, f->bad = 1; break;
    case 6: f->m.struct_size = 8, f->bad = 1; break;
    case 7: if (B != 0) f->m.batch = B + 1, f->bad = 1; break; /* neither 1 nor B */
    default: break;
    }
    a->block_mask = &f->m;
    return 1;
}

/* The fuzzer's own reading of a block mask: does it keep (i, j) of (b, h)? */
static int bmask_keeps(const fa_block_mask *m, int64_t b, int64_t h, int64_t i, int64_t j) {
    const int64_t row = ((m->batch > 1 ? b : 0) * m->heads + (m->heads > 1 ? h : 0)) * m->q_blocks + i / m->block_q;
    for (int64_t e = m->offsets[row]; e < m->offsets[row + 1]; e++) {
        if (m->kv_blocks[e] != j / m->block_k) continue;
        if (!m->partial || m->partial[e] < 0) return 1;
        const int64_t rb = (m->block_k + 7) / 8, x = j % m->block_k;
        return (m->bits[(m->partial[e] * m->block_q + i % m->block_q) * rb + x / 8] >> (x % 8)) & 1;
    }
    return 0;
}

static int dropout_valid(float p) { return p >= 0.0f && p < 1.0f; }
static int dropout_on(float p) { return p != 0.0f; } /* NaN counts: the library must look at it */

/* ------------------------------------------------------------ the accuracy rule */

/* Row kept under causal and window masking, with positions (fa_forward_args). */
static int kept(const fa_forward_args *a, int64_t Sq, int64_t Sk, int64_t i, int64_t j) {
    const int64_t off = a->q_start - a->k_start; /* both in [0, 2^60] */
    const int64_t diag = i + off + Sk - Sq;
    if (a->causal == FA_CAUSAL_BOTTOM_RIGHT && j > diag) return 0;
    if (a->causal == FA_CAUSAL_TOP_LEFT && j > i + off) return 0;
    if (a->window_left >= 0 && a->window_left < ((int64_t)1 << 61) && j < diag - a->window_left) return 0;
    if (a->window_right >= 0 && a->window_right < ((int64_t)1 << 61) && j > diag + a->window_right) return 0;
    return 1;
}

/*
 * How far a dense call's opted-in low-precision products move its scores (*qerr) and
 * its o (*f_round, beside what the scores' move does to o): zero for exact products.
 * A bound, not a draw; judge_dense widens the forward's tolerances by it and
 * judge_backward the gradients', which read that forward's o and lse.
 * int8 products (the call's quant_matmul, else the context's; docs/semantics.md, 11):
 * q's codes err by sa / 2 (one digit) or sa / 512 (two) per element, sa = max|x| / 127
 * (x = scale q), and a smoothed key's y = k - kbar (|y| <= 2 max|k|) likewise, so every
 * score moves by at most qerr = D (eq max|y~| + max|x| ey); each p by a factor within
 * exp(+-2 qerr), o by (exp(4 qerr) - 1) max|v|, the lse by qerr.
 * f32 products as bf16 (the call's f32_matmul, else the context's; docs/semantics.md,
 * 5): bf16 (2) rounds q and k to 8 bits (u = 2^-8 each) and P and V likewise, bf16x3
 * (1) leaves 2^-16 of each and drops lo.lo: every score moves by at most
 * D max|x| max|k| 3u, o by 2u max|v| besides.
 */
static void products_err(const fa_forward_args *a, double scale_abs, double vmax, double *qerr, double *f_round) {
    const int64_t Sq = a->q.shape[1], Hq = a->q.shape[2], Sk = a->k.shape[1];
    int64_t qm = a->quant_matmul;
    if (qm < 0 && fa_context_get(g_ctx, FA_PARAM_QUANT_MATMUL, &qm) != FA_OK) qm = 0;
    int64_t fm = a->f32_matmul;
    if (fm < 0 && fa_context_get(g_ctx, FA_PARAM_F32_MATMUL, &fm) != FA_OK) fm = 0;
    if (a->q.dtype != FA_DTYPE_F32) fm = 0;
    *qerr = 0.0, *f_round = 0.0;
    if (qm <= 0 && fm <= 0) return;
    double qmax = 0.0, kmax = 0.0;
    for (int64_t b = 0; b < a->q.shape[0]; b++)
        for (int64_t i = 0; i < Sq; i++)
            for (int64_t h = 0; h < Hq; h++)
                for (int64_t e = 0; e < a->q.shape[3]; e++) qmax = fmax(qmax, fabs(h_get(&a->q, b, i, h, e)));
    for (int64_t b = 0; b < a->k.shape[0]; b++)
        for (int64_t j = 0; j < Sk; j++)
            for (int64_t h = 0; h < a->k.shape[2]; h++)
                for (int64_t e = 0; e < a->k.shape[3]; e++) kmax = fmax(kmax, fabs(h_get(&a->k, b, j, h, e)));
    const double unit = qm == 2 ? 1.0 / 65024.0 : 1.0 / 254.0, x = scale_abs * qmax, y = 2.0 * kmax;
    if (qm > 0) *qerr = (double)a->q.shape[3] * (x * unit * y * (1.0 + 2.0 * unit) + x * y * unit) * 1.01;
    if (fm > 0) {
        const double u = fm == 2 ? 0x1p-8 : 0x1p-16;
        *qerr += (double)a->q.shape[3] * x * kmax * 3.0 * u * 1.01;
        *f_round = 2.0 * u * vmax * 1.01;
    }
}

/*
 * o_got (any float dtype, B, Sq, Hq, Dv) and lse_got against the reference's f32 o_ref
 * and lse_ref, with the tolerance from naive same-precision attention on the same
 * inputs (positions and ALiBi folded into an explicit mask and bias, which naive.c
 * understands). a is a dense call (B >= 0 sequences of equal lengths).
 */
static void judge_dense(const fa_forward_args *a, const fa_tensor *o_got, const fa_tensor *lse_got,
                        const fa_tensor *o_ref, const fa_tensor *lse_ref, const char *what) {
    const int64_t B = a->q.shape[0], Sq = a->q.shape[1], Hq = a->q.shape[2], Sk = a->k.shape[1], Dv = a->v.shape[3];
    if (B == 0 || Sq == 0 || Hq == 0) return; /* no rows (and B may be 2^59) */
    const int64_t rows = mul_or_neg(mul_or_neg(B, Sq), Hq);
    if (rows < 0 || rows > MAX_WORK || mul_or_neg(rows, Sk) < 0 || mul_or_neg(rows, Sk) > MAX_WORK ||
        mul_or_neg(rows, Dv) < 0 || mul_or_neg(rows, Dv) > 8 * MAX_WORK)
        return; /* more rows than the fuzzer checks (a no-op over huge dims, say) */
    const int64_t n_o = B * Sq * Hq * Dv, n_l = B * Hq * Sq, n_s = B * Hq * Sq * Sk;
    /* the naive's view of the call */
    fa_forward_args na = *a;
    fa_tensor mask = h_alloc(FA_DTYPE_BOOL, B, Hq, Sq, Sk), bias = h_alloc(FA_DTYPE_F32, B, Hq, Sq, Sk);
    const int64_t group = a->k.shape[2] > 0 ? Hq / a->k.shape[2] : 1;
    double smag = 0.0; /* max over kept pairs of |scale| sum_e |q_e k_e| + |bias + ALiBi| */
    /* the scale the call uses: 0 asks for 1/sqrt(D) */
    const double scale_abs = a->scale != 0.0f ? fabs((double)a->scale) : 1.0 / sqrt((double)a->q.shape[3]);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Sq; i++)
                for (int64_t j = 0; j < Sk; j++) {
                    int keep = kept(a, Sq, Sk, i, j);
                    double x = 0.0;
                    if (a->mask.data) {
                        const fa_tensor *m = &a->mask;
                        keep &= h_get(m, m->shape[0] == 1 ? 0 : b, m->shape[1] == 1 ? 0 : h, m->shape[2] == 1 ? 0 : i,
                                      m->shape[3] == 1 ? 0 : j) != 0.0;
                    }
                    if (a->block_mask) keep &= bmask_keeps(a->block_mask, b, h, i, j);
                    if (a->bias.data) {
                        const fa_tensor *t = &a->bias;
                        x += h_get(t, t->shape[0] == 1 ? 0 : b, t->shape[1] == 1 ? 0 : h, t->shape[2] == 1 ? 0 : i,
                                   t->shape[3] == 1 ? 0 : j);
                    }
                    if (a->alibi_slopes) {
                        const double slope = a->alibi_slopes[b * a->alibi_stride_b + h];
                        const int64_t diag = i + a->q_start - a->k_start + Sk - Sq;
                        x += -slope * (double)llabs(diag - j);
                    }
                    if (keep) {
                        double dot_abs = 0.0;
                        for (int64_t e = 0; e < a->q.shape[3]; e++)
                            dot_abs += fabs(h_get(&a->q, b, i, h, e) * h_get(&a->k, b, j, h / group, e));
                        smag = fmax(smag, scale_abs * dot_abs + fabs(x));
                    }
                    h_set(&mask, b, h, i, j, keep);
                    h_set(&bias, b, h, i, j, x);
                }
    na.mask = mask, na.bias = bias, na.block_mask = NULL;
    na.alibi_slopes = NULL, na.causal = FA_CAUSAL_NONE, na.window_left = na.window_right = -1;
    na.q_start = na.k_start = 0;
    na.o = *o_got;
    /*
     * Dropout: the naive has none, so its error is measured on the undropped call
     * against the reference's undropped o (ref0), and the whole tolerance is scaled by
     * 1 / pk: o_i = sum_j p_ij m_ij v_j with m_ij in {0, 1/pk}, so every rounding error
     * of the undropped sum (of P, of the products, of the output) grows by at most 1/pk.
     */
    const int drop = a->dropout_p > 0.0f;
    const double drop_gain = drop ? 1.0 / (1.0 - (double)a->dropout_p) : 1.0;
    fa_tensor o_ref0 = *o_ref;
    if (drop) {
        fa_forward_args r0 = *a;
        r0.dropout_p = 0.0f, r0.dropout_mask.data = NULL;
        r0.o = h_alloc(FA_DTYPE_F32, B, Sq, Hq, Dv);
        r0.lse = h_alloc(FA_DTYPE_F32, B, Hq, Sq, 1);
        if (fa_forward(g_ref, &r0) != FA_OK) FINDING("%s: the reference refused the undropped call: %s", what, fa_context_error(g_ref));
        free(r0.lse.data);
        o_ref0 = r0.o;
        na.dropout_p = 0.0f, na.dropout_mask.data = NULL;
    }
    double *os = malloc(sizeof(double) * (size_t)(n_o + 1)), *ls = malloc(sizeof(double) * (size_t)(n_l + 1));
    const int naive_ok = n_s > 0 && naive_forward(&na, NAIVE_SAME_PRECISION, os, ls, NULL) == 0;
    double omax = 0.0, lmax = 0.0, naive_o = 0.0, naive_l = 0.0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Sq; i++)
            for (int64_t h = 0; h < Hq; h++) {
                const double lr = h_get(lse_ref, b, h, i, 0);
                if (isfinite(lr)) lmax = fmax(lmax, fabs(lr));
                if (naive_ok && isfinite(lr) && isfinite(ls[(b * Hq + h) * Sq + i]))
                    naive_l = fmax(naive_l, fabs(ls[(b * Hq + h) * Sq + i] - lr));
                for (int64_t e = 0; e < Dv; e++) {
                    const double r = h_get(o_ref, b, i, h, e), r0 = h_get(&o_ref0, b, i, h, e);
                    omax = fmax(omax, fabs(r));
                    if (naive_ok) naive_o = fmax(naive_o, fabs(os[((b * Sq + i) * Hq + h) * Dv + e] - r0));
                }
            }
    /* the naive's error is one draw, not a bound: its roundings can cancel in the full
     * sum and not in the dropped one, so dropout adds 2 ulps of the input dtype at the
     * output's scale (a wrong keep bit moves o by p_ij v_j / pk; the bits themselves
     * are checked exactly through dropout_mask) */
    /* bf16 inputs: the bf16-pair path rounds the unnormalised P to bf16 before P V and
     * the naive rounds the normalised one, so their rounding errors are two unrelated
     * draws and one may cancel where the other does not (a few keys, o a near-zero
     * mean of v). Both are bounded by u * sum_j p_ij |v_j| <= u * max|v| for P, and as
     * much again for the normaliser, so 2u * max|v| = h_eps(bf16) * max|v| is allowed
     * beside the naive's draw: a bound, not a second draw. */
    /* Scores: each fp32 score carries a rounding error of a few ulps of the magnitude of
     * its terms (smag), and so does the row max, so every p_ij = exp(s_ij - m_i) has a
     * relative error up to about 4 FLT_EPSILON smag, which moves o by at most that times
     * max|v| / pk. With large scores (scale 3, a bias) and a peaked row this is no longer
     * small, and it need not cancel: dropping the dominant key leaves o a sum of tiny
     * p_ij whose relative errors survive in full, while the undropped naive's draw, where
     * o is close to that key's v, shows none of it. A bound, not a draw, as p_round. */
    double vmax = 0.0;
    for (int64_t b = 0; b < a->v.shape[0]; b++)
        for (int64_t j = 0; j < Sk; j++)
            for (int64_t h = 0; h < a->v.shape[2]; h++)
                for (int64_t e = 0; e < Dv; e++) vmax = fmax(vmax, fabs(h_get(&a->v, b, j, h, e)));
    const double p_round = a->q.dtype == FA_DTYPE_BF16 ? h_eps(FA_DTYPE_BF16) * vmax : 0.0;
    const double s_round = 4.0 * FLT_EPSILON * smag * vmax;
    double qerr, f_round;
    products_err(a, scale_abs, vmax, &qerr, &f_round);
    const double q_round = qerr > 0.0 ? expm1(fmin(4.0 * qerr, 700.0)) * vmax : 0.0;
    const double otol =
        drop_gain * (2.0 * naive_o + p_round + s_round + q_round + f_round +
                     h_prop_ulps(o_got->dtype) * h_eps(o_got->dtype) * fmax(1.0, omax)) +
        (drop ? 2.0 * drop_gain * h_eps(a->q.dtype) * fmax(1.0, omax) : 0.0);
    /* a 16-bit o cannot hold what a near-1 dropout_p scales it to (1/pk up to 2^24) */
    const int o_check = !(drop && o_got->dtype != FA_DTYPE_F32 && drop_gain > 1e3);
    const double ltol = 2.0 * naive_l + 2.0 * qerr + h_prop_lse_ulps() * FLT_EPSILON * fmax(1.0, lmax);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Sq; i++)
            for (int64_t h = 0; h < Hq; h++) {
                if (lse_got && lse_got->data) {
                    const double g = h_get(lse_got, b, h, i, 0), w = h_get(lse_ref, b, h, i, 0);
                    const int gi = isinf(g) && g < 0, wi = isinf(w) && w < 0;
                    if (gi != wi || (!gi && !(fabs(g - w) <= ltol)))
                        FINDING("%s: lse(b %lld, h %lld, i %lld) = %.9g, reference %.9g (tol %.3g)", what, (long long)b,
                                (long long)h, (long long)i, g, w, ltol);
                }
                for (int64_t e = 0; e < Dv && o_check; e++) {
                    const double g = h_get(o_got, b, i, h, e), w = h_get(o_ref, b, i, h, e);
                    if (!(fabs(g - w) <= otol))
                        FINDING("%s: o(b %lld, i %lld, h %lld, e %lld) = %.9g, reference %.9g (tol %.3g, naive err "
                                "%.3g)", what, (long long)b, (long long)i, (long long)h, (long long)e, g, w, otol, naive_o);
                }
            }
    free(os), free(ls), free(mask.data), free(bias.data);
    if (drop) free(o_ref0.data);
}

/* Whether every value a call reads is finite (else only crashes and determinism count). */
static int all_finite(world *w) {
    for (int i = 0; i < w->n; i++) {
        const ften *f = &w->t[i];
        if (f->kind == KIND_OUTPUT) continue;
        const fa_dtype dt = f->t.dtype;
        if (dt != FA_DTYPE_F32 && dt != FA_DTYPE_F16 && dt != FA_DTYPE_BF16) continue;
        for (int64_t e = 0; e < f->bytes / (int64_t)esize(dt); e++)
            if (!isfinite(load_value(f->base + e * (int64_t)esize(dt), dt))) return 0;
    }
    return 1;
}

/* ------------------------------------------------------------ struct_size */

/* The args as the call sees them: a full struct, a shorter one (an older caller) or a
 * longer one with zero or non-zero tail bytes (a newer caller). */
typedef struct big_args {
    union {
        fa_forward_args a;
        max_align_t align;
        unsigned char bytes[sizeof(fa_forward_args) + 64];
    } u;
} big_args;

static fa_forward_args *dress(reader *r, const fa_forward_args *a, big_args *out, int *tail_bad) {
    memset(out, 0, sizeof *out);
    out->u.a = *a;
    *tail_bad = 0;
    const uint8_t b = u8(r);
    if (b < 0xE0) return &out->u.a;
    /* 0xE8, 0xE9: callers from before dropout, or before its mask */
    if (b == 0xE8 || b == 0xE9) {
        out->u.a.struct_size = b == 0xE8 ? offsetof(fa_forward_args, dropout_p) : offsetof(fa_forward_args, dropout_mask);
        return &out->u.a;
    }
    switch (b & 7) {
    case 0: out->u.a.struct_size = offsetof(fa_forward_args, q_start); break;
    case 1: out->u.a.struct_size = offsetof(fa_forward_args, kv_cache); break;
    case 2: out->u.a.struct_size = sizeof(fa_forward_args) + 16; break;
    case 3:
        out->u.a.struct_size = sizeof(fa_forward_args) + 16;
        out->u.bytes[sizeof(fa_forward_args) + (u8(r) & 15)] = 1;
        *tail_bad = 1;
        break;
    case 4: out->u.a.struct_size = 0; break;
    case 5: out->u.a.struct_size = (size_t)u8(r); break;
    case 6: out->u.a.struct_size = (size_t)-1; break;
    default: out->u.a.struct_size = offsetof(fa_forward_args, window_right) + 8; break;
    }
    return &out->u.a;
}

/* The args with every field a short struct_size leaves out at its default. */
static fa_forward_args effective(const fa_forward_args *seen) {
    fa_forward_args e = FA_FORWARD_ARGS_INIT;
    size_t n = seen->struct_size < sizeof e ? seen->struct_size : sizeof e;
    memcpy(&e, seen, n);
    e.struct_size = sizeof e;
    return e;
}

/* ------------------------------------------------------------ dense */

static void fuzz_dense(reader *r) {
    world w;
    memset(&w, 0, sizeof w);
    fa_algo algo;
    const int64_t threads = apply_settings(r, &algo);
    const int64_t B = rd_dim(r, 3), Sq = rd_dim(r, 20), Sk = rd_dim(r, 40), Hk = rd_dim(r, 3);
    const int64_t group = rd_dim(r, 4), D = rd_dim(r, 80), Dv = rd_dim(r, 72);
    const int64_t Hq = mul_or_neg(Hk, group) < 0 ? Hk : Hk * group;
    const fa_dtype dt = rd_float_dtype(r);
    const uint8_t dts = u8(r);
    const fa_dtype odt = (dts & 1) ? FA_DTYPE_F32 : (dts & 0x80) ? rd_float_dtype(r) : dt;
    const fa_dtype kdt = (dts & 0x40) ? rd_float_dtype(r) : dt;
    const double sigma = (double)(1 + (u8(r) & 3)) * 0.5;
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = *make(&w, r, dt, B, Sq, Hq, D, KIND_INPUT, sigma);
    a.k = *make(&w, r, kdt, B, Sk, Hk, D, KIND_INPUT, 1.0);
    a.v = *make(&w, r, kdt, B, Sk, Hk, Dv, KIND_INPUT, 1.0);
    fa_tensor *o = make(&w, r, odt, B, Sq, Hq, Dv, KIND_OUTPUT, 0);
    a.o = *o;
    const uint8_t opt = u8(r);
    fa_tensor *lse = NULL;
    if (opt & 1) lse = make(&w, r, FA_DTYPE_F32, B, Hq, Sq, 1, KIND_OUTPUT, 0), a.lse = *lse;
    if (opt & 2) { /* bias: each dim full or 1 */
        const uint8_t m = u8(r);
        a.bias = *make(&w, r, (m & 16) ? rd_float_dtype(r) : dt, (m & 1) ? 1 : B, (m & 2) ? 1 : Hq, (m & 4) ? 1 : Sq,
                       (m & 8) ? 1 : Sk, KIND_INPUT, 1.0);
    }
    if (opt & 4) {
        const uint8_t m = u8(r);
        a.mask = *make(&w, r, (m & 16) ? (fa_dtype)(u8(r) % 6) : FA_DTYPE_BOOL, (m & 1) ? 1 : B, (m & 2) ? 1 : Hq,
                       (m & 4) ? 1 : Sq, (m & 8) ? 1 : Sk, KIND_INPUT, 1.0);
    }
    float slopes[64];
    if (opt & 8) { /* ALiBi [Hq] or [B, Hq], within its 64 floats or refused by size */
        const int per_batch = u8(r) & 1;
        const int64_t need = per_batch ? mul_or_neg(B, Hq) : Hq;
        if (need < 0 || need > 64) {
            world_free(&w);
            return;
        }
        for (int s = 0; s < 64; s++) slopes[s] = (float)rnd();
        a.alibi_slopes = slopes;
        a.alibi_stride_b = per_batch ? Hq : 0;
        if (u8(r) >= 0xF0) a.alibi_stride_b = -1;
    }
    if (opt & 16) {
        static const float S[8] = {0.0f, 0.5f, 1.0f, -1.0f, 0.01f, 3.0f, NAN, INFINITY};
        a.scale = S[u8(r) & 7];
    }
    if (opt & 32) {
        static const float C[8] = {0.0f, 1.0f, 5.0f, 30.0f, -1.0f, NAN, INFINITY, 0.001f};
        a.softcap = C[u8(r) & 7];
    }
    if (opt & 64) {
        const uint8_t c = u8(r);
        a.causal = c < 0xF0 ? (fa_causal)(c % 3) : (fa_causal)(c & 1 ? 3 : -1);
        a.window_left = rd_window(r), a.window_right = rd_window(r);
    }
    if (opt & 128) a.q_start = rd_position(r), a.k_start = rd_position(r);
    /* the struct as the call sees it, then dropout (read last: older seeds end before it) */
    big_args big;
    int tail_bad;
    fa_forward_args *seen = dress(r, &a, &big, &tail_bad);
    const uint8_t dd = rd_dropout(r, &a);
    fa_tensor *dmask = NULL;
    if (dd & 0x40) { /* the dropout_mask output; with 0x80 a wrong dtype or shape (via the layout) */
        const fa_dtype mdt = (dd & 0x80) && (u8(r) & 1) ? rd_float_dtype(r) : FA_DTYPE_BOOL;
        dmask = make(&w, r, mdt, B, Hq, Sq, Sk, KIND_OUTPUT, 0);
        a.dropout_mask = *dmask;
    }
    seen->dropout_p = a.dropout_p, seen->dropout_seed = a.dropout_seed, seen->dropout_offset = a.dropout_offset;
    seen->dropout_mask = a.dropout_mask;
    float sink_buf[64];
    const int sinks = rd_sinks(r, &a, a.q.shape[2], sink_buf);
    seen->sinks = a.sinks;
    rd_block_mask(r, &a, &g_bmask);
    seen->block_mask = a.block_mask;
    rd_new_options(r, seen);
    if (w.skip) {
        world_free(&w);
        return;
    }
    /* legal but slow: skip */
    /* from the shapes the library sees (a layout may have overridden a dim) */
    const int64_t nq = numel(&a.q), nk = numel(&a.k), nv = numel(&a.v), no = numel(&a.o);
    int64_t work = mul_or_neg(mul_or_neg(mul_or_neg(a.q.shape[0], a.q.shape[2]), mul_or_neg(a.q.shape[1], a.k.shape[1])),
                              add_or_neg(a.q.shape[3], a.v.shape[3]));
    if (nq == 0 || nk == 0) work = 0;
    int overflowing = nq < 0 || nk < 0 || nv < 0 || no < 0 || work < 0 || (D > 0 && Dv > 0 && add_or_neg(D, Dv) < 0);
    if (!overflowing && (too_slow(nq) || too_slow(nk) || too_slow(nv) || too_slow(no) || too_slow(work) ||
                         (a.bias.data && too_slow(numel(&a.bias))) || (a.mask.data && too_slow(numel(&a.mask))) ||
                         (dmask && too_slow(numel(dmask))))) {
        world_free(&w);
        return;
    }
    const fa_forward_args eff = effective(seen);
    const int finite = all_finite(&w) && !(eff.sinks && (sinks & SINKS_NAN));
    snapshot(&w);
    const fa_status sc = check_first(&w, seen, "dense check");
    const fa_status st = fa_forward(g_ctx, seen);
    check_agrees(sc, st, "dense");
    trace("dense", st);
    if (g_verbose)
        fprintf(stderr, "fuzz_api: q (%lld %lld %lld %lld) k (%lld %lld %lld %lld) v dim %lld\n", (long long)a.q.shape[0],
                (long long)a.q.shape[1], (long long)a.q.shape[2], (long long)a.q.shape[3], (long long)a.k.shape[0],
                (long long)a.k.shape[1], (long long)a.k.shape[2], (long long)a.k.shape[3], (long long)a.v.shape[3]);
    expect_unchanged(&w, 1 << KIND_INPUT, "dense", st);
    if (st != FA_OK) {
        expect_unchanged(&w, 1 << KIND_OUTPUT, "a failed dense call", st);
        if (fa_context_error(g_ctx)[0] == '\0') FINDING("dense: status %s with no message", fa_status_string(st));
        world_free(&w);
        return;
    }
    if (overflowing) FINDING("dense: sizes beyond 64 bits were accepted");
    if (tail_bad) FINDING("dense: a non-zero byte beyond the struct was accepted");
    if (!dropout_valid(eff.dropout_p)) FINDING("dense: dropout_p %g was accepted", (double)eff.dropout_p);
    if (eff.sinks && (sinks & SINKS_INF)) FINDING("dense: a +inf sink was accepted");
    if (eff.block_mask && g_bmask.bad) FINDING("dense: a spoilt block mask was accepted");
    if (eff.dropout_mask.data && numel(&eff.dropout_mask) > 0 && !find(&w, dmask)->overlap) {
        /* every keep bit, masked or not (an empty mask has none, however many rows) */
        const fa_tensor *m = &eff.dropout_mask;
        for (int64_t b = 0; b < m->shape[0]; b++)
            for (int64_t h = 0; h < m->shape[1]; h++)
                for (int64_t i = 0; i < m->shape[2]; i++)
                    for (int64_t j = 0; j < m->shape[3]; j++) {
                        const int want = eff.dropout_p > 0.0f ? keep_bit(&eff, b, h, m->shape[1], eff.q_start + i, eff.k_start + j) : 1;
                        const uint8_t got = *at(m, b, h, i, j);
                        if (got != want)
                            FINDING("dense: dropout_mask(%lld, %lld, %lld, %lld) = %u, Philox says %d (p %g)", (long long)b,
                                    (long long)h, (long long)i, (long long)j, got, want, (double)eff.dropout_p);
                    }
    }
    const ften *fo = find(&w, o);
    if (fo->overlap || (lse && find(&w, lse)->overlap)) { /* self-overlapping outputs: no oracle */
        world_free(&w);
        return;
    }
    /* the reference on the same inputs, into dense f32 outputs */
    const int64_t rows = mul_or_neg(mul_or_neg(a.q.shape[0], a.q.shape[1]), a.q.shape[2]);
    if (rows <= 0 || rows > MAX_WORK || mul_or_neg(rows, a.v.shape[3]) < 0 || mul_or_neg(rows, a.v.shape[3]) > 8 * MAX_WORK) {
        /* no rows: nothing to compare (and the other dims may be huge) */
        world_free(&w);
        return;
    }
    fa_forward_args ra = effective(seen);
    ra.dropout_mask.data = NULL; /* checked above; the reference must not write the caller's buffer */
    /* the oracle's outputs from the shapes the library saw (rows and Dv bounded above) */
    ra.o = h_alloc(FA_DTYPE_F32, a.q.shape[0], a.q.shape[1], a.q.shape[2], a.v.shape[3]);
    ra.lse = h_alloc(FA_DTYPE_F32, a.q.shape[0], a.q.shape[2], a.q.shape[1], 1);
    const fa_status rs = fa_forward(g_ref, &ra);
    if (rs != FA_OK) FINDING("dense: %s succeeded but the reference says %s (%s)", fa_algo_name(algo), fa_status_string(rs),
                             fa_context_error(g_ref));
    fa_forward_args ea = effective(seen);
    ea.dropout_mask.data = NULL;
    if (finite) judge_dense(&ea, o, ea.lse.data ? &ea.lse : NULL, &ra.o, &ra.lse, "dense");
    /* determinism across thread counts */
    if (algo != FA_ALGO_STANDARD) {
        unsigned char *first_o = malloc((size_t)fo->bytes + 1), *first_l = NULL;
        memcpy(first_o, fo->base, (size_t)fo->bytes);
        if (lse) first_l = malloc((size_t)find(&w, lse)->bytes + 1), memcpy(first_l, find(&w, lse)->base, (size_t)find(&w, lse)->bytes);
        fa_context_set(g_ctx, FA_PARAM_THREADS, 3 - threads);
        const fa_status st2 = fa_forward(g_ctx, seen);
        if (st2 != FA_OK) FINDING("dense: the same call with %lld threads failed: %s", (long long)(3 - threads), fa_status_string(st2));
        if (memcmp(first_o, fo->base, (size_t)fo->bytes) != 0 ||
            (lse && memcmp(first_l, find(&w, lse)->base, (size_t)find(&w, lse)->bytes) != 0))
            FINDING("dense: 1 and 2 threads are not bitwise identical");
        free(first_o), free(first_l);
    }
    free(ra.o.data), free(ra.lse.data);
    world_free(&w);
}

/* ------------------------------------------------------------ varlen and caches */

/* cu arrays of n + 1 entries over `total` rows: mostly valid (with empty sequences),
 * sometimes decreasing, negative or past the end. Returns the packed length. */
static int64_t rd_cu(reader *r, int32_t *cu, int64_t n, int max_len) {
    cu[0] = 0;
    for (int64_t b = 0; b < n; b++) cu[b + 1] = cu[b] + (int32_t)(u8(r) % (max_len + 1)); /* <= 8 * 255 */
    const uint8_t bad = u8(r);
    if (bad >= 0xF0) {
        static const int32_t V[4] = {-1, INT32_MAX, INT32_MIN, 3};
        cu[bad % (n + 1)] = V[(bad >> 2) & 3];
    }
    int64_t total = cu[n] > 0 && cu[n] < 4096 ? cu[n] : 0;
    if (u8(r) >= 0xF8) total = total > 0 ? total - 1 : 0; /* one short: must be OUT_OF_RANGE */
    return total;
}

/* Checks OK outputs of an inference call for finiteness (finite inputs only) and runs
 * it again with the other thread count: o, lse and the cache must come out bitwise the
 * same (a repeated append writes the same rows into the same slots). */
static void again_bitwise(world *w, const fa_forward_args *seen, int64_t threads, const char *what) {
    unsigned char *copy[MAX_TENSORS] = {0};
    for (int i = 0; i < w->n; i++)
        if (w->t[i].kind != KIND_INPUT) {
            copy[i] = malloc((size_t)w->t[i].bytes + 1);
            memcpy(copy[i], w->t[i].base, (size_t)w->t[i].bytes);
        }
    fa_context_set(g_ctx, FA_PARAM_THREADS, 3 - threads);
    const fa_status st = fa_forward(g_ctx, seen);
    if (st != FA_OK) FINDING("%s: the same call again failed: %s", what, fa_status_string(st));
    for (int i = 0; i < w->n; i++)
        if (copy[i]) {
            if (memcmp(copy[i], w->t[i].base, (size_t)w->t[i].bytes) != 0 && !w->t[i].overlap)
                FINDING("%s: the same call with %lld threads gave other bytes in tensor %d", what,
                        (long long)(3 - threads), i);
            free(copy[i]);
        }
}

/* Sequence b's rows of a packed (1, total, ..) tensor as a dense view. */
static fa_tensor rows_view(const fa_tensor *t, int64_t s0, int64_t len) {
    fa_tensor v = *t;
    /* an empty view (or tensor) keeps the base: its strides were never proven in range */
    if (len > 0 && t->shape[0] > 0 && t->shape[2] > 0 && t->shape[3] > 0)
        v.data = (char *)t->data + s0 * t->stride[1] * (int64_t)esize(t->dtype);
    v.shape[1] = len;
    return v;
}

/* t (batch 1) as nb identical batches. */
static fa_tensor bcast(const fa_tensor *t, int64_t nb) {
    fa_tensor v = *t;
    v.shape[0] = nb;
    v.stride[0] = 0;
    return v;
}

/* The last batch of a dense tensor, as a batch-1 view. */
static fa_tensor last_batch(const fa_tensor *t) {
    fa_tensor v = *t;
    v.data = (char *)t->data + (t->shape[0] - 1) * t->stride[0] * (int64_t)esize(t->dtype);
    v.shape[0] = 1;
    return v;
}

static void fuzz_varlen(reader *r) {
    world w;
    memset(&w, 0, sizeof w);
    fa_algo algo;
    const int64_t threads = apply_settings(r, &algo);
    if (fa_context_set(g_ctx, FA_PARAM_ALGO, FA_ALGO_AUTO) != FA_OK) FINDING("set ALGO");
    const int64_t n = u8(r) % (MAX_SEQS + 1);
    int32_t cu_q[MAX_SEQS + 1], cu_k[MAX_SEQS + 1];
    const int64_t tq = rd_cu(r, cu_q, n, 9), tk = rd_cu(r, cu_k, n, 20);
    const int64_t Hk = 1 + (u8(r) & 1), Hq = Hk * (1 + (u8(r) & 3)), D = rd_dim(r, 70), Dv = rd_dim(r, 40);
    const fa_dtype dt = rd_float_dtype(r);
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = *make(&w, r, dt, 1, tq, Hq, D, KIND_INPUT, 1.0);
    a.k = *make(&w, r, dt, 1, tk, Hk, D, KIND_INPUT, 1.0);
    a.v = *make(&w, r, dt, 1, tk, Hk, Dv, KIND_INPUT, 1.0);
    fa_tensor *o = make(&w, r, (u8(r) & 1) ? FA_DTYPE_F32 : dt, 1, tq, Hq, Dv, KIND_OUTPUT, 0);
    fa_tensor *lse = make(&w, r, FA_DTYPE_F32, 1, Hq, tq, 1, KIND_OUTPUT, 0);
    a.o = *o, a.lse = *lse;
    a.cu_seqlens_q = cu_q, a.cu_seqlens_k = cu_k;
    a.num_seqs = (u8(r) >= 0xF8) ? -1 : n;
    const uint8_t opt = u8(r);
    if (opt & 1) a.causal = (fa_causal)(u8(r) % 3);
    if (opt & 2) a.window_left = rd_window(r), a.window_right = rd_window(r);
    if (opt & 4) a.softcap = 2.0f;
    if (opt & 8) a.q_start = rd_position(r), a.k_start = rd_position(r);
    float slopes[64];
    for (int s = 0; s < 64; s++) slopes[s] = (float)rnd();
    if (opt & 16) a.alibi_slopes = slopes, a.alibi_stride_b = (opt & 32) ? Hq : 0;
    if (opt & 64) a.cu_seqlens_k = NULL;
    const int64_t dsum = add_or_neg(a.q.shape[3], a.v.shape[3]);
    const int64_t work = mul_or_neg(mul_or_neg(a.q.shape[1], a.k.shape[1]), mul_or_neg(a.q.shape[2], dsum ? dsum : 1));
    if (w.skip || work < 0 || work > MAX_WORK * 4) {
        world_free(&w);
        return;
    }
    big_args big;
    int tail_bad;
    fa_forward_args *seen = dress(r, &a, &big, &tail_bad);
    const uint8_t dd = rd_dropout(r, &a);
    if (dd & 0x40) { /* a dropout_mask: dense calls only, so refused */
        fa_tensor *m = make(&w, r, FA_DTYPE_BOOL, 1, Hq, tq, tk, KIND_OUTPUT, 0);
        a.dropout_mask = *m;
        if (w.skip) {
            world_free(&w);
            return;
        }
    }
    seen->dropout_p = a.dropout_p, seen->dropout_seed = a.dropout_seed, seen->dropout_offset = a.dropout_offset;
    seen->dropout_mask = a.dropout_mask;
    float sink_buf[64];
    const int sinks = rd_sinks(r, &a, a.q.shape[2], sink_buf);
    seen->sinks = a.sinks;
    rd_new_options(r, seen);
    const int finite = all_finite(&w) && !(effective(seen).sinks && (sinks & SINKS_NAN));
    snapshot(&w);
    const fa_status sc = check_first(&w, seen, "varlen check");
    const fa_status st = fa_forward(g_ctx, seen);
    check_agrees(sc, st, "varlen");
    trace("varlen", st);
    if (g_verbose) fprintf(stderr, "fuzz_api: varlen dropout p %g, struct %zu\n", (double)seen->dropout_p, seen->struct_size);
    expect_unchanged(&w, 1 << KIND_INPUT, "varlen", st);
    if (st != FA_OK) {
        expect_unchanged(&w, 1 << KIND_OUTPUT, "a failed varlen call", st);
        if (fa_context_error(g_ctx)[0] == '\0') FINDING("varlen: status %s with no message", fa_status_string(st));
        world_free(&w);
        return;
    }
    if (tail_bad) FINDING("varlen: a non-zero byte beyond the struct was accepted");
    {
        const fa_forward_args e = effective(seen);
        if (!dropout_valid(e.dropout_p)) FINDING("varlen: dropout_p %g was accepted", (double)e.dropout_p);
        if (e.dropout_mask.data) FINDING("varlen: a dropout_mask was accepted");
        if (e.sinks && (sinks & SINKS_INF)) FINDING("varlen: a +inf sink was accepted");
    }
    if (find(&w, o)->overlap || find(&w, lse)->overlap || !finite) {
        world_free(&w);
        return;
    }
    /* each sequence against the reference on its dense views */
    const fa_forward_args ea = effective(seen);
    for (int64_t b = 0; b < ea.num_seqs; b++) {
        const int64_t q0 = cu_q[b], sq = cu_q[b + 1] - q0, k0 = cu_k[b], sk = cu_k[b + 1] - k0;
        if (sq == 0) continue;
        fa_forward_args ja = ea;
        ja.cu_seqlens_q = ja.cu_seqlens_k = NULL, ja.num_seqs = 0;
        ja.q = rows_view(&ea.q, q0, sq), ja.k = rows_view(&ea.k, k0, sk), ja.v = rows_view(&ea.v, k0, sk);
        if (ja.alibi_slopes) ja.alibi_slopes += b * ja.alibi_stride_b, ja.alibi_stride_b = 0;
        fa_tensor go = rows_view(&ea.o, q0, sq), gl = ea.lse;
        gl.data = (float *)ea.lse.data + q0 * ea.lse.stride[2], gl.shape[2] = sq;
        ja.o = go, ja.lse = gl;
        /* dropout draws sequence b's mask with batch index b: the reference sees the
         * sequence as batch b of b + 1 identical ones (batch stride 0) */
        const int64_t nb = ea.dropout_p > 0.0f ? b + 1 : 1;
        fa_forward_args ra = ja;
        ra.q = bcast(&ja.q, nb), ra.k = bcast(&ja.k, nb), ra.v = bcast(&ja.v, nb);
        ra.o = h_alloc(FA_DTYPE_F32, nb, sq, Hq, Dv);
        ra.lse = h_alloc(FA_DTYPE_F32, nb, Hq, sq, 1);
        const fa_status rs = fa_forward(g_ref, &ra);
        if (rs != FA_OK) FINDING("varlen: sequence %lld refused by the reference: %s", (long long)b, fa_context_error(g_ref));
        const fa_tensor ro = last_batch(&ra.o), rl = last_batch(&ra.lse);
        judge_dense(&ja, &go, &gl, &ro, &rl, "varlen");
        free(ra.o.data), free(ra.lse.data);
    }
    /* rows no sequence owns keep their sentinel: checked by the snapshot for o past cu[n] */
    again_bitwise(&w, seen, threads, "varlen");
    world_free(&w);
}

static void fuzz_cache(reader *r, int paged) {
    world w;
    memset(&w, 0, sizeof w);
    fa_algo algo;
    const int64_t threads = apply_settings(r, &algo);
    if (fa_context_set(g_ctx, FA_PARAM_ALGO, FA_ALGO_AUTO) != FA_OK) FINDING("set ALGO");
    const int64_t B = u8(r) % (MAX_SEQS / 2 + 1), Sq = rd_dim(r, 6), Snew = (u8(r) & 3) ? u8(r) % 4 : 0;
    const int64_t Hk = 1 + (u8(r) & 1), Hq = Hk * (1 + (u8(r) & 3)), D = rd_dim(r, 70), Dv = rd_dim(r, 40);
    const int64_t slots0 = paged ? rd_dim(r, 12) : (B + (u8(r) & 1)), slots1 = paged ? rd_dim(r, 9) : rd_dim(r, 48);
    const fa_dtype qdt = rd_float_dtype(r);
    const uint8_t cd = u8(r);
    /* cd & 3: f32, f16, bf16, or quantised: i8, or (cd & 0x0c) f8e4m3 / f8e5m2 */
    const fa_dtype cdt = (cd & 3) != 3 ? (fa_dtype)(cd & 3)
                         : (cd & 0x0c) == 0x04 ? FA_DTYPE_F8E4M3
                         : (cd & 0x0c) == 0x08 ? FA_DTYPE_F8E5M2 : FA_DTYPE_I8;
    const int quant = (cd & 3) == 3;
    fa_kv_cache c = FA_KV_CACHE_INIT;
    /* the cache may be any layout when nothing is appended; appends need distinct slots */
    fa_tensor *kt = make(&w, r, cdt, slots0, slots1, Hk, D, KIND_CACHE, 1.0);
    fa_tensor *vt = make(&w, r, cdt, slots0, slots1, Hk, Dv, KIND_CACHE, 1.0);
    fa_tensor *kst = NULL, *vst = NULL;
    c.k = *kt, c.v = *vt;
    if (quant || (cd & 0x80)) {
        kst = make(&w, r, FA_DTYPE_F32, slots0, slots1, Hk, 1, KIND_CACHE, 0.05);
        vst = make(&w, r, FA_DTYPE_F32, slots0, slots1, Hk, 1, KIND_CACHE, 0.05);
        c.k_scale = *kst, c.v_scale = *vst;
    }
    int32_t seqlens[MAX_SEQS], batch_idx[MAX_SEQS], table[MAX_SEQS * 4];
    for (int64_t b = 0; b < MAX_SEQS; b++) {
        const uint8_t s = u8(r);
        seqlens[b] = s < 0xF8 ? (int32_t)(s % 40) : (s & 1 ? -1 : INT32_MAX);
        batch_idx[b] = (int32_t)(u8(r) % (slots0 > 0 && slots0 < 16 ? slots0 + 1 : 4)) - (s == 0xF7);
    }
    for (int p = 0; p < MAX_SEQS * 4; p++) table[p] = (int32_t)(u8(r) % 14) - 1;
    c.seqlens = (cd & 0x40) && u8(r) >= 0xF0 ? NULL : seqlens;
    if (paged) c.block_table = table, c.max_pages = rd_dim(r, 4);
    else if (cd & 0x20) c.batch_idx = batch_idx;
    if (u8(r) >= 0xF8) c.struct_size = (size_t)u8(r);
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = *make(&w, r, qdt, B, Sq, Hq, D, KIND_INPUT, 1.0);
    fa_tensor *o = make(&w, r, (u8(r) & 1) ? FA_DTYPE_F32 : qdt, B, Sq, Hq, Dv, KIND_OUTPUT, 0);
    fa_tensor *lse = make(&w, r, FA_DTYPE_F32, B, Hq, Sq, 1, KIND_OUTPUT, 0);
    a.o = *o, a.lse = *lse;
    const int append = Snew > 0 || (cd & 0x10);
    if (append) {
        a.k = *make(&w, r, rd_float_dtype(r), B, Snew, Hk, D, KIND_INPUT, 1.0);
        a.v = *make(&w, r, rd_float_dtype(r), B, Snew, Hk, Dv, KIND_INPUT, 1.0);
    }
    a.kv_cache = &c;
    const uint8_t opt = u8(r);
    if (opt & 1) a.causal = (fa_causal)(u8(r) % 3);
    if (opt & 2) a.window_left = rd_window(r), a.window_right = rd_window(r);
    if (opt & 4) a.q_start = rd_position(r), a.k_start = rd_position(r);
    if (opt & 8) a.softcap = 3.0f;
    /* dropout is for training: with a cache any dropout_p but 0, and any dropout_mask,
     * must be refused */
    const uint8_t dd = rd_dropout(r, &a);
    if (dd & 0x40) a.dropout_mask = *make(&w, r, FA_DTYPE_BOOL, B, Hq, Sq, 1, KIND_OUTPUT, 0);
    /* an MLA latent cache (v_in_k): 1 on; 0x80 a value other than 0 and 1; 2 the cache's
     * v as K's view (else empty), 4 the new v as the new k's view (else empty), 8
     * v_scale as k_scale (else empty), 0x10 a v that is not K's view (refused) */
    const uint8_t mla = u8(r);
    if (mla & 0x81) {
        c.v_in_k = mla & 0x80 ? 2 + (mla & 1) : 1;
        fa_tensor kview = c.k, nview = a.k;
        kview.shape[3] = Dv, nview.shape[3] = Dv;
        c.v = mla & 0x10 ? *vt : mla & 2 ? kview : (fa_tensor){0};
        if (append) a.v = mla & 4 ? nview : (fa_tensor){0};
        if (kst) c.v_scale = mla & 8 ? c.k_scale : (fa_tensor){0};
    }
    const int latent = c.v_in_k != 0;
    /* leftpad: mostly within [0, seqlens[b]], now and then outside it; with a block
     * table always refused. Read last, so the bytes before keep their meaning. */
    int32_t leftpad[MAX_SEQS];
    if (u8(r) >= 0xC0) {
        for (int64_t b = 0; b < MAX_SEQS; b++) {
            const uint8_t x = u8(r);
            const int32_t n = seqlens[b] >= 0 && seqlens[b] < 40 ? seqlens[b] : 0;
            leftpad[b] = x >= 0xFC ? (x & 1 ? -1 : n + 1) : (int32_t)(x % (n + 1));
        }
        c.leftpad = leftpad;
    }
    const int64_t cap = mul_or_neg(c.k.shape[1], paged ? c.max_pages : 1);
    const int64_t dsum = add_or_neg(c.k.shape[3], c.v.shape[3]);
    const int64_t work = mul_or_neg(mul_or_neg(mul_or_neg(a.q.shape[0], a.q.shape[1]), mul_or_neg(a.q.shape[2], dsum ? dsum : 1)),
                                    add_or_neg(cap, append ? a.k.shape[1] : 0));
    /* the block table holds B * max_pages ids: a claim beyond the buffer is the fuzzer's
     * own mistake (skip it), one beyond 64 bits the library must refuse (keep it) */
    const int64_t table_entries = paged ? mul_or_neg(B, c.max_pages) : 0;
    const int table_short = paged && table_entries > (int64_t)(sizeof table / sizeof table[0]);
    /* seqlens and batch_idx hold MAX_SEQS entries, the block table MAX_SEQS * 4: a
     * batch beyond them (a dim make() changed) would have the library read past the
     * fuzzer's own arrays, which the contract sizes by the batch */
    const int arrays_short = a.q.shape[0] > MAX_SEQS && (c.seqlens || c.batch_idx || c.block_table || c.leftpad);
    if (w.skip || table_short || arrays_short || (work >= 0 && work > MAX_WORK) || numel(&c.k) > MAX_WORK ||
        numel(&c.v) > MAX_WORK) {
        world_free(&w);
        return;
    }
    /* an append into self-overlapping cache memory has no defined result: skip (a
     * scale tensor with token stride 0 is shared: read, never written) */
    for (int i = 0; i < w.n; i++)
        if (append && w.t[i].kind == KIND_CACHE && w.t[i].overlap &&
            !((&w.t[i].t == kst || &w.t[i].t == vst) && w.t[i].t.stride[1] == 0)) {
            world_free(&w);
            return;
        }
    float sink_buf[64];
    const int sinks = rd_sinks(r, &a, a.q.shape[2], sink_buf);
    rd_new_options(r, &a);
    const int inputs_finite = all_finite(&w), finite = inputs_finite && !(sinks & SINKS_NAN);
    snapshot(&w);
    const fa_status sc = check_first(&w, &a, "cache check");
    const fa_status st = fa_forward(g_ctx, &a);
    check_agrees(sc, st, "cache");
    trace(paged ? "paged cache" : "cache", st);
    expect_unchanged(&w, 1 << KIND_INPUT, "cache", st);
    if (st == FA_OK && (dropout_on(a.dropout_p) || a.dropout_mask.data))
        FINDING("cache: dropout (p %g, mask %s) was accepted with a KV cache", (double)a.dropout_p,
                a.dropout_mask.data ? "given" : "absent");
    if (st == FA_OK && (sinks & SINKS_INF)) FINDING("cache: a +inf sink was accepted");
    if (st != FA_OK) {
        if (fa_context_error(g_ctx)[0] == '\0') FINDING("cache: status %s with no message", fa_status_string(st));
        expect_unchanged(&w, (1 << KIND_OUTPUT) | (1 << KIND_CACHE), "a failed cache call", st);
        world_free(&w);
        return;
    }
    /* appended rows hold the new values (float caches: rounded; int8: within half a
     * step of their scale; fp8: the code harness.c rounds x * (1 / scale) to, in f32, with
     * the row's scale max|x| / FMAX, or the stored one where the scale tensor's token
     * stride is 0); then every other cache byte must be as before. The
     * geometry is the call's, which the library checked, not the one planned above:
     * make() may have changed a dim of q, k and v alike (a batch of 0 is a no-op that
     * appends nothing, a fuzzer finding) */
    const int64_t Bc = a.q.shape[0], Sn = append ? a.k.shape[1] : 0, Hkc = a.k.shape[2];
    for (int64_t b = 0; b < Bc && Sn > 0; b++)
        for (int64_t t = 0; t < Sn; t++) {
            const int64_t j = seqlens[b] + t;
            int64_t blk = paged ? table[b * c.max_pages + j / slots1] : (c.batch_idx ? batch_idx[b] : b);
            const int64_t row = paged ? j % slots1 : j;
            for (int64_t h = 0; h < Hkc; h++)
                for (int which = 0; which < 2 - latent; which++) { /* a latent V is checked as K's row */
                    const fa_tensor *ct = which ? &c.v : &c.k, *nt = which ? &a.v : &a.k;
                    const fa_tensor *sc = which ? &c.v_scale : &c.k_scale;
                    const int64_t dim = nt->shape[3];
                    double amax = 0.0;
                    for (int64_t e = 0; e < dim; e++) amax = fmax(amax, fabs(load_value(at(nt, b, t, h, e), nt->dtype)));
                    const int shared = quant && sc->stride[1] == 0;
                    const double qmax = cdt == FA_DTYPE_F8E4M3 ? 448.0 : cdt == FA_DTYPE_F8E5M2 ? 57344.0 : 127.0;
                    const double scale = quant ? load_value(at(sc, blk, row, h, 0), FA_DTYPE_F32) : 1.0;
                    if (quant && !shared && fabs(scale - amax / qmax) > 1e-6 * amax + 1e-30)
                        FINDING("cache: %s scale %.9g for max %.9g", cdt == FA_DTYPE_I8 ? "int8" : "fp8", scale, amax);
                    for (int64_t e = 0; e < dim; e++) {
                        const double x = load_value(at(nt, b, t, h, e), nt->dtype);
                        const double got = load_value(at(ct, blk, row, h, e), cdt) * scale;
                        const float y = (float)x * (scale > 0.0 ? 1.0f / (float)scale : 0.0f);
                        const double want = cdt == FA_DTYPE_I8 ? (shared ? fmin(127.0, fmax(-127.0, nearbyint(y))) * scale : x)
                                            : quant ? h_fp8_to_double(h_fp8_from_double(y, cdt), cdt) * scale
                                                    : h_round(x, cdt);
                        const double tol = cdt == FA_DTYPE_I8 && !shared ? 0.5 * scale * (1 + 1e-3) + 1e-30 : 0.0;
                        if (inputs_finite && !(fabs(got - want) <= tol))
                            FINDING("cache: appended %s row (b %lld, t %lld, h %lld, e %lld) holds %.9g, not %.9g",
                                    which ? "v" : "k", (long long)b, (long long)t, (long long)h, (long long)e, got, want);
                    }
                    /* mark these bytes as expected to change */
                    ften *fc = find(&w, which ? vt : kt);
                    for (int64_t e = 0; e < dim; e++) {
                        const unsigned char *p = at(ct, blk, row, h, e);
                        memcpy(fc->before + (p - fc->base), p, esize(cdt));
                    }
                    if (quant && !shared) {
                        ften *fs = find(&w, which ? vst : kst);
                        const unsigned char *p = at(sc, blk, row, h, 0);
                        memcpy(fs->before + (p - fs->base), p, 4);
                    }
                }
        }
    expect_unchanged(&w, 1 << KIND_CACHE, "cache bytes outside the appended rows", st);
    if (finite && !find(&w, o)->overlap)
        for (int64_t e = 0; e < find(&w, o)->bytes / (int64_t)esize(o->dtype); e++)
            if (!isfinite(load_value(find(&w, o)->base + e * (int64_t)esize(o->dtype), o->dtype)))
                FINDING("cache: a non-finite output from finite inputs");
    again_bitwise(&w, &a, threads, "cache");
    world_free(&w);
}

/* ------------------------------------------------------------ backward */

/* The backward args as the call sees them (struct_size variants, as dress() for the forward). */
typedef struct big_bwd {
    union {
        fa_backward_args a;
        max_align_t align;
        unsigned char bytes[sizeof(fa_backward_args) + 64];
    } u;
} big_bwd;

/* The iterations of a loop nest over t's dims (an empty dim still costs its outer
 * loops): MAX_WORK + 1 when beyond. */
static int64_t loops(const fa_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < 4; d++) {
        n = mul_or_neg(n, t->shape[d] > 0 ? t->shape[d] : 1);
        if (n < 0 || n > MAX_WORK) return MAX_WORK + 1;
    }
    return n;
}

/* max |x| over a tensor's elements (only called on bounded, finite-checked tensors). */
static double max_abs(const fa_tensor *t) {
    double m = 0.0;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t d = 0; d < t->shape[3]; d++) m = fmax(m, fabs(h_get(t, a, b, c, d)));
    return m;
}

/*
 * One gradient against the reference's. The rule:
 *   |g - r| <= rel * (max|r| + 1e-3) + abs_term
 * rel is 1e-3 for f32 inputs and 5e-2 for f16/bf16: the flash backward sums in fp32
 * over at most a few hundred terms (errors ~1e-6 relative) but, on 16-bit inputs, may
 * round P and dS to bf16 for the products (2^-8) and its output to a 16-bit dtype, so
 * a few percent of the largest gradient covers those roundings with margin while a
 * wrong mask, scale, head mapping or a missed tile is off by O(1).
 * abs_term covers what the relative term cannot: the library takes D_i = dot(dO_i, o_i)
 * from the forward's ROUNDED o, while the reference recomputes it exactly; where dq or
 * dk is ~0 in exact arithmetic (one key kept: ds = p (dp - D) = 0) that rounding
 * survives alone. Its size is derived in fuzz_backward.
 */
static void judge_grad(const char *name, const fa_tensor *got, const fa_tensor *ref, double rel, double abs_term,
                       const char *what) {
    const double tol = rel * (max_abs(ref) + 1e-3) + abs_term;
    if (g_verbose) fprintf(stderr, "fuzz_api: %s: %s against the reference, tol %.3g\n", what, name, tol);
    for (int64_t a = 0; a < ref->shape[0]; a++)
        for (int64_t b = 0; b < ref->shape[1]; b++)
            for (int64_t c = 0; c < ref->shape[2]; c++)
                for (int64_t d = 0; d < ref->shape[3]; d++) {
                    const double g = h_get(got, a, b, c, d), w = h_get(ref, a, b, c, d);
                    if (!(fabs(g - w) <= tol))
                        FINDING("%s: %s(%lld, %lld, %lld, %lld) = %.9g, reference %.9g (tol %.3g)", what, name,
                                (long long)a, (long long)b, (long long)c, (long long)d, g, w, tol);
                }
}

/*
 * The reference backward of one dense call `f` (its o and lse the library's forward
 * outputs; the reference recomputes from q, k, v and dO), against the library's
 * gradients gq, gk, gv (NULL: not computed). nb > 1: f is batch 1 and the reference
 * runs it as the last of nb identical batches (dropout's batch index, for varlen).
 */
static void judge_backward(const fa_forward_args *f, const fa_tensor *dout, const fa_tensor *gq, const fa_tensor *gk,
                           const fa_tensor *gv, int64_t nb, const char *what) {
    fa_forward_args rf = *f;
    rf.dropout_mask.data = NULL;
    fa_backward_args rb = FA_BACKWARD_ARGS_INIT;
    rb.fwd = &rf;
    rb.do_ = *dout;
    if (nb > 1) {
        rf.q = bcast(&f->q, nb), rf.k = bcast(&f->k, nb), rf.v = bcast(&f->v, nb), rf.o = bcast(&f->o, nb);
        rf.lse = bcast(&f->lse, nb), rb.do_ = bcast(dout, nb);
    }
    rb.dq = h_alloc(FA_DTYPE_F32, rf.q.shape[0], rf.q.shape[1], rf.q.shape[2], rf.q.shape[3]);
    rb.dk = h_alloc(FA_DTYPE_F32, rf.k.shape[0], rf.k.shape[1], rf.k.shape[2], rf.k.shape[3]);
    rb.dv = h_alloc(FA_DTYPE_F32, rf.v.shape[0], rf.v.shape[1], rf.v.shape[2], rf.v.shape[3]);
    const fa_status rs = fa_backward(g_ref, &rb);
    if (rs != FA_OK) FINDING("%s: the backward succeeded but the reference says %s (%s)", what, fa_status_string(rs),
                             fa_context_error(g_ref));
    const fa_tensor rq = nb > 1 ? last_batch(&rb.dq) : rb.dq, rk = nb > 1 ? last_batch(&rb.dk) : rb.dk,
                    rv = nb > 1 ? last_batch(&rb.dv) : rb.dv;
    /* the tolerance's parts (see judge_grad) */
    const fa_dtype dt = f->q.dtype;
    const double rel = dt == FA_DTYPE_F32 ? 1e-3 : 5e-2;
    const int64_t B = f->q.shape[0], Sq = f->q.shape[1], Hq = f->q.shape[2], Hk = f->k.shape[2], Dv = f->v.shape[3];
    const double scale = f->scale != 0.0f ? fabs((double)f->scale) : 1.0 / sqrt((double)f->q.shape[3]);
    /* E bounds the error of D_i: o rounded to its dtype (half an ulp; h_eps is a whole
     * one) on top of the forward's own fp32 error, weighted by |dO|. On 16-bit inputs
     * the forward may also have rounded P to bf16 before P V (the bf16-pair path), so
     * o carries the input dtype's rounding even when it is stored in f32; and the
     * backward's pair path rounds dS (and P~) to bf16, which leaves eps * sum_j |ds_ij|
     * where the exact sum cancels (equal keys), with sum_j |ds_ij| <= gain * sum_e
     * |dO_ie| (max|v| + |o_ie|). The naive bf16 backward of the accuracy rule has
     * both errors. */
    const int narrow = dt != FA_DTYPE_F32;
    const double eps_o = fmax(h_eps(f->o.dtype), narrow ? h_eps(dt) : 0.0) + 1e-6;
    const double gain = f->dropout_p > 0.0f && f->dropout_p < 1.0f ? 1.0 / (1.0 - (double)f->dropout_p) : 1.0;
    const double vmax = narrow ? max_abs(&f->v) : 0.0;
    /* A forward with opted-in low-precision products (products_err) hands the backward
     * an o and lse within their own, wider tolerances, and the backward reads both while
     * the reference recomputes them: measure how far they are from the reference
     * forward's (dl_i, do_i) and carry that through. Each recomputed p_ij =
     * exp(s_ij - lse_i) is off by a factor within exp(+-dl_i) (dp_i = expm1(dl_i)
     * relative), which moves ds_ij = p_ij (dp_ij - D_i) by dp_i p_ij |dp_ij - D_i| and dv
     * by dp_i times its terms; D_i moves by sum_e |dO_ie| do_ie. */
    const double vabs = max_abs(&f->v);
    double qerr, f_round;
    products_err(f, scale, vabs, &qerr, &f_round);
    double *dl = calloc((size_t)(B * Hq * Sq + 1), sizeof(double)), dp_max = 0.0;
    double *dO_err = calloc((size_t)(B * Hq * Sq + 1), sizeof(double));
    if (qerr > 0.0 || f_round > 0.0) {
        fa_forward_args r2 = rf;
        r2.o = h_alloc(FA_DTYPE_F32, rf.o.shape[0], rf.o.shape[1], rf.o.shape[2], rf.o.shape[3]);
        r2.lse = h_alloc(FA_DTYPE_F32, rf.lse.shape[0], rf.lse.shape[1], rf.lse.shape[2], rf.lse.shape[3]);
        if (fa_forward(g_ref, &r2) != FA_OK) FINDING("%s: the reference refused the forward: %s", what, fa_context_error(g_ref));
        const fa_tensor ro = nb > 1 ? last_batch(&r2.o) : r2.o, rl = nb > 1 ? last_batch(&r2.lse) : r2.lse;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < Sq; i++)
                for (int64_t h = 0; h < Hq; h++) {
                    const int64_t r = (b * Hq + h) * Sq + i;
                    const double g = h_get(&f->lse, b, h, i, 0), w = h_get(&rl, b, h, i, 0);
                    dl[r] = isfinite(g) && isfinite(w) ? expm1(fmin(fabs(g - w), 700.0)) : 0.0;
                    dp_max = fmax(dp_max, dl[r]);
                    for (int64_t e = 0; e < Dv; e++)
                        dO_err[r] += fabs(h_get(dout, b, i, h, e)) * fabs(h_get(&f->o, b, i, h, e) - h_get(&ro, b, i, h, e));
                }
        free(r2.o.data), free(r2.lse.data);
    }
    double E = 0.0, dmax = 0.0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Sq; i++)
            for (int64_t h = 0; h < Hq; h++) {
                double s = 0.0, ds = 0.0, ds_all = 0.0;
                for (int64_t e = 0; e < Dv; e++) {
                    const double g = fabs(h_get(dout, b, i, h, e)), o = fabs(h_get(&f->o, b, i, h, e));
                    s += g * o;
                    ds += g * (vmax * gain + o);
                    ds_all += g * (vabs * gain + o);
                    dmax = fmax(dmax, g);
                }
                const int64_t r = (b * Hq + h) * Sq + i;
                E = fmax(E, eps_o * s + (narrow ? h_eps(dt) * ds : 0.0) + dl[r] * ds_all + dO_err[r]);
            }
    /* dq_i = scale sum_j p_ij dz_ij k_j with sum_j p_ij <= 1 and |1 - tanh^2| <= 1;
     * dk_j sums over the Sq rows of each of the group's Hq / Hk heads, each p_ij <= 1 */
    const double group = Hk > 0 ? (double)(Hq / Hk) : 1.0;
    const double abs_q = 2.0 * scale * E * max_abs(&f->k);
    const double abs_k = 2.0 * scale * E * max_abs(&f->q) * (double)Sq * group;
    if (gq) judge_grad("dq", gq, &rq, rel, abs_q, what);
    if (gk) judge_grad("dk", gk, &rk, rel, abs_k, what);
    const double abs_v = 2.0 * dp_max * gain * dmax * (double)Sq * group;
    if (gv) judge_grad("dv", gv, &rv, rel, abs_v, what);
    free(rb.dq.data), free(rb.dk.data), free(rb.dv.data), free(dl), free(dO_err);
}

/*
 * fa_backward: a forward call built as the dense or varlen branch builds one (exact
 * extent buffers, any layout, invalid enums, every option, dropout), run with an lse
 * output; then the backward of it with dO, dq, dk, dv decoded the same way (each of dq,
 * dk, dv may be absent, of a wrong dtype or shape), under struct_size variants, a NULL
 * fwd, an fwd without lse, or one with a KV cache.
 */
static void fuzz_backward(reader *r, int varlen) {
    world w;
    memset(&w, 0, sizeof w);
    fa_algo algo;
    const int64_t threads = apply_settings(r, &algo);
    if (varlen && fa_context_set(g_ctx, FA_PARAM_ALGO, FA_ALGO_AUTO) != FA_OK) FINDING("set ALGO");
    int32_t cu_q[MAX_SEQS + 1], cu_k[MAX_SEQS + 1];
    int64_t B, Sq, Sk, Hk, Hq, D, Dv, n = 0;
    if (!varlen) {
        B = rd_dim(r, 2), Sq = rd_dim(r, 12), Sk = rd_dim(r, 24), Hk = rd_dim(r, 2);
        const int64_t group = rd_dim(r, 3);
        Hq = mul_or_neg(Hk, group) < 0 ? Hk : Hk * group;
        D = rd_dim(r, 40), Dv = rd_dim(r, 40);
    } else {
        n = u8(r) % (MAX_SEQS + 1);
        B = 1, Sq = rd_cu(r, cu_q, n, 6), Sk = rd_cu(r, cu_k, n, 12);
        Hk = 1 + (u8(r) & 1), Hq = Hk * (1 + (u8(r) & 3)), D = rd_dim(r, 40), Dv = rd_dim(r, 40);
    }
    const fa_dtype dt = rd_float_dtype(r);
    const uint8_t dts = u8(r);
    const fa_dtype odt = (dts & 1) ? FA_DTYPE_F32 : (dts & 0x80) ? rd_float_dtype(r) : dt;
    const fa_dtype kdt = (dts & 0x40) ? rd_float_dtype(r) : dt;
    const double sigma = (double)(1 + (u8(r) & 3)) * 0.5;
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = *make(&w, r, dt, B, Sq, Hq, D, KIND_INPUT, sigma);
    a.k = *make(&w, r, kdt, B, Sk, Hk, D, KIND_INPUT, 1.0);
    a.v = *make(&w, r, kdt, B, Sk, Hk, Dv, KIND_INPUT, 1.0);
    fa_tensor *o = make(&w, r, odt, B, Sq, Hq, Dv, KIND_OUTPUT, 0);
    fa_tensor *lse = make(&w, r, FA_DTYPE_F32, B, Hq, Sq, 1, KIND_OUTPUT, 0);
    a.o = *o, a.lse = *lse;
    const uint8_t opt = u8(r);
    if ((opt & 2) && !varlen) {
        const uint8_t m = u8(r);
        a.bias = *make(&w, r, (m & 16) ? rd_float_dtype(r) : dt, (m & 1) ? 1 : B, (m & 2) ? 1 : Hq, (m & 4) ? 1 : Sq,
                       (m & 8) ? 1 : Sk, KIND_INPUT, 1.0);
    }
    if ((opt & 4) && !varlen) {
        const uint8_t m = u8(r);
        a.mask = *make(&w, r, (m & 16) ? (fa_dtype)(u8(r) % 6) : FA_DTYPE_BOOL, (m & 1) ? 1 : B, (m & 2) ? 1 : Hq,
                       (m & 4) ? 1 : Sq, (m & 8) ? 1 : Sk, KIND_INPUT, 1.0);
    }
    float slopes[64];
    for (int s = 0; s < 64; s++) slopes[s] = (float)rnd();
    if (opt & 8) {
        const int per_batch = u8(r) & 1;
        const int64_t nseq = varlen ? n : B;
        const int64_t need = per_batch ? mul_or_neg(nseq, Hq) : Hq;
        if (need < 0 || need > 64) {
            world_free(&w);
            return;
        }
        a.alibi_slopes = slopes;
        a.alibi_stride_b = per_batch ? Hq : 0;
    }
    if (opt & 16) {
        static const float S[8] = {0.0f, 0.5f, 1.0f, -1.0f, 0.01f, 3.0f, NAN, INFINITY};
        a.scale = S[u8(r) & 7];
    }
    if (opt & 32) {
        static const float C[8] = {0.0f, 1.0f, 5.0f, 30.0f, -1.0f, NAN, INFINITY, 0.001f};
        a.softcap = C[u8(r) & 7];
    }
    if (opt & 64) {
        const uint8_t c = u8(r);
        a.causal = c < 0xF0 ? (fa_causal)(c % 3) : (fa_causal)(c & 1 ? 3 : -1);
        a.window_left = rd_window(r), a.window_right = rd_window(r);
    }
    if (opt & 128) a.q_start = rd_position(r), a.k_start = rd_position(r);
    if (varlen) {
        a.cu_seqlens_q = cu_q, a.cu_seqlens_k = cu_k;
        a.num_seqs = (opt & 1) ? -1 : n; /* opt & 1: a bad count, refused */
    }
    const uint8_t dd = rd_dropout(r, &a);
    fa_tensor *dmask = NULL;
    if (dd & 0x40) a.dropout_mask = *(dmask = make(&w, r, FA_DTYPE_BOOL, B, Hq, Sq, Sk, KIND_OUTPUT, 0));
    big_args big;
    int tail_bad;
    const fa_forward_args *seen = dress(r, &a, &big, &tail_bad);

    /* the backward's tensors */
    const uint8_t g = u8(r);
    const fa_dtype ddt = (g & 8) ? FA_DTYPE_F32 : (g & 0x80) ? rd_float_dtype(r) : dt;
    fa_tensor *dout = make(&w, r, ddt, B, Sq, Hq, Dv, KIND_INPUT, 1.0);
    fa_tensor *grads[3] = {NULL, NULL, NULL};
    for (int x = 0; x < 3; x++) {
        if (!((g >> x) & 1)) continue;
        const uint8_t gd = u8(r);
        const fa_dtype gdt = (gd & 3) == 0 ? dt : (gd & 3) == 1 ? FA_DTYPE_F32 : (gd & 3) == 2 ? rd_float_dtype(r) : kdt;
        /* the decoded dims, not the tensor's (a layout may have changed those): a wrong
         * shape is a case too */
        const int64_t d3 = x == 2 ? Dv : D;
        grads[x] = make(&w, r, gdt, B, x == 0 ? Sq : Sk, x == 0 ? Hq : Hk, d3, KIND_OUTPUT, 0);
    }
    const uint8_t variant = u8(r);
    /* sinks last (older seeds end before them): the forward's, and dsinks with them */
    float sink_buf[64], dsinks[64], dsinks0[64];
    const int sinks = rd_sinks(r, &a, a.q.shape[2], sink_buf);
    big.u.a.sinks = a.sinks;
    rd_new_options(r, &big.u.a);
    if (w.skip) {
        world_free(&w);
        return;
    }
    /* legal but slow: skip (from the shapes the library sees) */
    const int64_t nq = numel(&a.q), nk = numel(&a.k), nv = numel(&a.v), no = numel(&a.o);
    int64_t work = mul_or_neg(mul_or_neg(mul_or_neg(a.q.shape[0], a.q.shape[2]), mul_or_neg(a.q.shape[1], a.k.shape[1])),
                              add_or_neg(a.q.shape[3], a.v.shape[3]));
    if (nq == 0 || nk == 0) work = 0;
    const int overflowing = nq < 0 || nk < 0 || nv < 0 || no < 0 || work < 0 || (D > 0 && Dv > 0 && add_or_neg(D, Dv) < 0);
    int slow = too_slow(nq) || too_slow(nk) || too_slow(nv) || too_slow(no) || too_slow(work) ||
               (a.bias.data && too_slow(numel(&a.bias))) || (a.mask.data && too_slow(numel(&a.mask))) ||
               (dmask && too_slow(numel(dmask))) || too_slow(numel(dout));
    for (int x = 0; x < 3; x++) slow |= grads[x] && too_slow(numel(grads[x]));
    if (!overflowing && slow) {
        world_free(&w);
        return;
    }
    if (g_verbose) {
        fprintf(stderr, "fuzz_api: backward%s: B %lld Sq %lld Sk %lld Hq %lld Hk %lld D %lld Dv %lld %s, threads %lld, grads %d%d%d, p %g", varlen ? " varlen" : "", (long long)B,
                (long long)Sq, (long long)Sk, (long long)Hq, (long long)Hk, (long long)D, (long long)Dv, fa_dtype_name(dt),
                (long long)threads, !!grads[0], !!grads[1], !!grads[2], (double)a.dropout_p);
        for (int64_t b = 0; varlen && b <= n; b++) fprintf(stderr, " %s%d/%d", b ? "" : "cu ", cu_q[b], cu_k[b]);
        fputc('\n', stderr);
    }
    const int finite = all_finite(&w) && !(effective(seen).sinks && (sinks & SINKS_NAN));
    snapshot(&w);
    const fa_status sf = fa_forward(g_ctx, seen);
    trace(varlen ? "backward: varlen forward" : "backward: forward", sf);
    expect_unchanged(&w, 1 << KIND_INPUT, "backward's forward", sf);
    if (sf != FA_OK) expect_unchanged(&w, 1 << KIND_OUTPUT, "backward's failed forward", sf);
    if (sf == FA_OK && (overflowing || tail_bad || !dropout_valid(effective(seen).dropout_p)))
        FINDING("backward's forward: an invalid call was accepted (%s)", overflowing ? "sizes beyond 64 bits" : tail_bad ? "a non-zero tail" : "dropout_p");
    /* the forward's outputs are the backward's inputs */
    find(&w, o)->kind = KIND_INPUT, find(&w, lse)->kind = KIND_INPUT;
    if (dmask) find(&w, dmask)->kind = KIND_INPUT;

    fa_backward_args ba = FA_BACKWARD_ARGS_INIT;
    ba.fwd = seen;
    ba.do_ = *dout;
    if (grads[0]) ba.dq = *grads[0];
    if (grads[1]) ba.dk = *grads[1];
    if (grads[2]) ba.dv = *grads[2];
    memset(dsinks, 0x5a, sizeof dsinks);
    memcpy(dsinks0, dsinks, sizeof dsinks);
    if (sinks) ba.dsinks = dsinks;
    big_bwd bb;
    memset(&bb, 0, sizeof bb);
    bb.u.a = ba;
    fa_backward_args *bs = &bb.u.a;
    big_args alt_big = big; /* a changed copy of the forward's args, tail bytes and all */
    fa_forward_args *alt = &alt_big.u.a;
    fa_kv_cache cache = FA_KV_CACHE_INIT;
    int must_fail = sf != FA_OK;
    const char *why = sf != FA_OK ? "the forward failed" : "";
    if (variant >= 0xC0) {
        switch (variant & 7) {
        case 0: bs->fwd = NULL, must_fail = 1, why = "fwd NULL"; break;
        case 1: alt->lse.data = NULL, bs->fwd = alt, must_fail = 1, why = "lse NULL"; break;
        case 2:
            alt->kv_cache = &cache, bs->fwd = alt;
            if (seen->struct_size >= offsetof(fa_forward_args, kv_cache) + sizeof(void *)) must_fail = 1, why = "a KV cache";
            break;
        case 3: bs->struct_size = sizeof *bs + 16; break;
        case 4:
            bs->struct_size = sizeof *bs + 16;
            bb.u.bytes[sizeof *bs + (u8(r) & 15)] = 1;
            must_fail = 1, why = "a non-zero tail";
            break;
        case 5: bs->struct_size = 0, must_fail = 1, why = "struct_size 0"; break;
        case 6: bs->struct_size = offsetof(fa_backward_args, dv), must_fail = 1, why = "no dv field"; break;
        default:
            bs->struct_size = (size_t)u8(r);
            if (bs->struct_size < sizeof *bs) must_fail = 1, why = "a short struct";
            break;
        }
    }
    const fa_backward_args *bseen = &bb.u.a;
    snapshot(&w);
    const fa_status sb = fa_backward(g_ctx, bseen);
    trace(varlen ? "backward varlen" : "backward", sb);
    expect_unchanged(&w, 1 << KIND_INPUT, "backward", sb);
    if (sb != FA_OK) {
        expect_unchanged(&w, 1 << KIND_OUTPUT, "a failed backward", sb);
        if (memcmp(dsinks, dsinks0, sizeof dsinks)) FINDING("a failed backward wrote dsinks");
        if (fa_context_error(g_ctx)[0] == '\0') FINDING("backward: status %s with no message", fa_status_string(sb));
        world_free(&w);
        return;
    }
    if (must_fail) FINDING("backward: accepted with %s", why);
    const fa_forward_args *used = bseen->fwd; /* the forward args the backward read (alt or seen) */
    if (effective(used).sinks && (sinks & SINKS_INF)) FINDING("backward: a +inf sink was accepted");
    memcpy(dsinks0, dsinks, sizeof dsinks); /* the first run's, for the bitwise check below */
    /* self-overlapping outputs have no defined result; o and lse that overlap were
     * garbage to start with */
    for (int x = 0; x < 3; x++)
        if (grads[x] && find(&w, grads[x])->overlap) {
            world_free(&w);
            return;
        }
    /* determinism: the other thread count, bitwise */
    unsigned char *first[3] = {NULL, NULL, NULL};
    for (int x = 0; x < 3; x++)
        if (grads[x]) {
            const ften *fg = find(&w, grads[x]);
            first[x] = malloc((size_t)fg->bytes + 1);
            memcpy(first[x], fg->base, (size_t)fg->bytes);
        }
    fa_context_set(g_ctx, FA_PARAM_THREADS, 3 - threads);
    const fa_status sb2 = fa_backward(g_ctx, bseen);
    if (sb2 != FA_OK) FINDING("backward: the same call with %lld threads failed: %s", (long long)(3 - threads), fa_status_string(sb2));
    if (bseen->struct_size > offsetof(fa_backward_args, dsinks) && bseen->dsinks &&
        memcmp(dsinks, dsinks0, sizeof dsinks))
        FINDING("backward: dsinks differ between 1 and 2 threads");
    for (int x = 0; x < 3; x++)
        if (grads[x]) {
            const ften *fg = find(&w, grads[x]);
            if (memcmp(first[x], fg->base, (size_t)fg->bytes) != 0) {
                int64_t e = 0;
                while (first[x][e] == fg->base[e]) e++;
                FINDING("backward: d%c differs between 1 and 2 threads (algo %s) at byte %lld of %lld (%02x, then %02x); "
                        "shape %lld %lld %lld %lld, strides %lld %lld %lld %lld, dtype %s", "qkv"[x], fa_algo_name(algo),
                        (long long)e, (long long)fg->bytes, first[x][e], fg->base[e], (long long)fg->t.shape[0],
                        (long long)fg->t.shape[1], (long long)fg->t.shape[2], (long long)fg->t.shape[3],
                        (long long)fg->t.stride[0], (long long)fg->t.stride[1], (long long)fg->t.stride[2],
                        (long long)fg->t.stride[3], fa_dtype_name(fg->t.dtype));
            }
            free(first[x]);
        }
    /* the reference */
    const fa_forward_args ef = effective(seen);
    const float p = ef.dropout_p;
    if (!finite || find(&w, o)->overlap || find(&w, lse)->overlap || find(&w, dout)->overlap || work > MAX_WORK ||
        (p > 0.0f && 1.0 - (double)p < 1e-3 && dt != FA_DTYPE_F32)) { /* 16-bit o overflows under 1/pk > 1000 */
        world_free(&w);
        return;
    }
    const fa_tensor *gq = grads[0] ? &bseen->dq : NULL, *gk = grads[1] ? &bseen->dk : NULL, *gv = grads[2] ? &bseen->dv : NULL;
    /* loops over the dims of an empty tensor still cost: bound them all */
    const fa_tensor *all[8] = {&ef.q, &ef.k, &ef.v, &ef.o, &ef.lse, &bseen->do_, &ef.q, &ef.q};
    if (gq) all[6] = gq;
    if (gk) all[7] = gk;
    for (int x = 0; x < 8; x++)
        if (loops(all[x]) > MAX_WORK || (gv && loops(gv) > MAX_WORK)) {
            world_free(&w);
            return;
        }
    if (!varlen) {
        judge_backward(&ef, &bseen->do_, gq, gk, gv, 1, "backward");
        world_free(&w);
        return;
    }
    for (int64_t b = 0; b < ef.num_seqs; b++) {
        const int64_t q0 = cu_q[b], sq = cu_q[b + 1] - q0, k0 = cu_k[b], sk = cu_k[b + 1] - k0;
        fa_forward_args sa = ef;
        sa.cu_seqlens_q = sa.cu_seqlens_k = NULL, sa.num_seqs = 0;
        sa.q = rows_view(&ef.q, q0, sq), sa.k = rows_view(&ef.k, k0, sk), sa.v = rows_view(&ef.v, k0, sk);
        sa.o = rows_view(&ef.o, q0, sq);
        sa.lse = ef.lse;
        if (sq > 0) sa.lse.data = (float *)ef.lse.data + q0 * ef.lse.stride[2];
        sa.lse.shape[2] = sq;
        if (sa.alibi_slopes) sa.alibi_slopes += b * sa.alibi_stride_b, sa.alibi_stride_b = 0;
        const fa_tensor sdo = rows_view(&bseen->do_, q0, sq);
        fa_tensor vq, vk, vv;
        if (gq) vq = rows_view(gq, q0, sq);
        if (gk) vk = rows_view(gk, k0, sk);
        if (gv) vv = rows_view(gv, k0, sk);
        judge_backward(&sa, &sdo, gq ? &vq : NULL, gk ? &vk : NULL, gv ? &vv : NULL, p > 0.0f ? b + 1 : 1,
                       "varlen backward");
    }
    world_free(&w);
}

/* ------------------------------------------------------------ merge */

static void fuzz_merge(reader *r) {
    world w;
    memset(&w, 0, sizeof w);
    fa_algo algo;
    apply_settings(r, &algo);
    static const int N[8] = {1, 2, 3, 4, 2, 0, -1, 6};
    const int n = N[u8(r) & 7];
    const int64_t B = rd_dim(r, 3), S = rd_dim(r, 5), H = rd_dim(r, 3), Dv = rd_dim(r, 60);
    fa_tensor parts[6], lses[6];
    int part_overlap = 0;
    const int m = n < 1 ? 1 : n > 6 ? 6 : n;
    for (int i = 0; i < m; i++) {
        fa_tensor *pt = make(&w, r, rd_float_dtype(r), B, S, H, Dv, KIND_INPUT, 1.0);
        fa_tensor *lt = make(&w, r, (u8(r) >= 0xF8) ? FA_DTYPE_F16 : FA_DTYPE_F32, B, H, S, 1, KIND_INPUT, 3.0);
        parts[i] = *pt, lses[i] = *lt;
        if (!w.skip) part_overlap |= find(&w, pt)->overlap | find(&w, lt)->overlap;
    }
    /* some -inf sides */
    for (int i = 0; i < w.n; i++)
        if (w.t[i].t.dtype == FA_DTYPE_F32 && w.t[i].t.shape[3] == 1 && (u8(r) & 1))
            for (int64_t e = 0; e < w.t[i].bytes / 4; e += 3) store_value(w.t[i].base + e * 4, FA_DTYPE_F32, -INFINITY);
    const uint8_t opt = u8(r);
    fa_tensor o, lse;
    int in_place = (opt & 1) && n >= 1 && n <= 6, out_overlap = 0;
    if (in_place) {
        o = parts[0];
        lse = lses[0];
    } else {
        fa_tensor *ot = make(&w, r, rd_float_dtype(r), B, S, H, Dv, KIND_OUTPUT, 0);
        o = *ot;
        if (!w.skip) out_overlap |= find(&w, ot)->overlap;
        memset(&lse, 0, sizeof lse);
        if (opt & 2) {
            fa_tensor *lt = make(&w, r, FA_DTYPE_F32, B, H, S, 1, KIND_OUTPUT, 0);
            lse = *lt;
            if (!w.skip) out_overlap |= find(&w, lt)->overlap;
        }
    }
    /* the lse alone is B*S*H rows per part even when Dv = 0 leaves o empty */
    const int64_t lse_rows = mul_or_neg(mul_or_neg(B, S), H);
    if (w.skip || (numel(&o) >= 0 && mul_or_neg(numel(&o), m) > MAX_WORK) ||
        (lse_rows >= 0 && mul_or_neg(lse_rows, m) > MAX_WORK) || (n > 6)) { /* unreachable with N above; kept for a wider table */
        if (!w.skip && n > 6) { /* 4097 parts: refused before any part is read */
            const fa_status st = fa_merge_states(g_ctx, n, parts, lses, &o, &lse);
            if (st != FA_ERR_INVALID_ARGUMENT) FINDING("merge: n = %d gave %s", n, fa_status_string(st));
        }
        world_free(&w);
        return;
    }
    /* the formula in double, before the call (o may be part 0) */
    const int finite = all_finite(&w);
    int64_t rows = mul_or_neg(mul_or_neg(B, S), H);
    int shapes_ok = rows >= 0 && n >= 1 && Dv >= 0 && B >= 0 && S >= 0 && H >= 0;
    for (int i = 0; i < m && shapes_ok; i++)
        for (int d = 0; d < 4; d++)
            if (parts[i].shape[d] != (int64_t[]){B, S, H, Dv}[d] || lses[i].shape[d] != (int64_t[]){B, H, S, 1}[d] ||
                part_overlap || lses[i].dtype != FA_DTYPE_F32)
                shapes_ok = 0;
    double *want = NULL, *lwant = NULL;
    if (shapes_ok && finite && rows > 0) {
        want = calloc((size_t)(rows * Dv + 1), sizeof *want);
        lwant = calloc((size_t)(rows + 1), sizeof *lwant);
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t h = 0; h < H; h++) {
                    const int64_t row = (b * S + s) * H + h;
                    double mx = -INFINITY, sum = 0.0;
                    for (int i = 0; i < n; i++) mx = fmax(mx, h_get(&lses[i], b, h, s, 0));
                    if (mx == -INFINITY) {
                        lwant[row] = -INFINITY;
                        continue;
                    }
                    for (int i = 0; i < n; i++) sum += exp(h_get(&lses[i], b, h, s, 0) - mx);
                    lwant[row] = mx + log(sum);
                    for (int64_t e = 0; e < Dv; e++) {
                        double acc = 0.0;
                        for (int i = 0; i < n; i++) {
                            const double li = h_get(&lses[i], b, h, s, 0);
                            if (li != -INFINITY) acc += exp(li - lwant[row]) * h_get(&parts[i], b, s, h, e);
                        }
                        want[row * Dv + e] = acc;
                    }
                }
    }
    snapshot(&w);
    const fa_status st = fa_merge_states(g_ctx, n, parts, lses, &o, (opt & 4) ? NULL : &lse);
    trace("merge", st);
    if (!in_place) expect_unchanged(&w, 1 << KIND_INPUT, "merge", st);
    if (st != FA_OK) {
        expect_unchanged(&w, (1 << KIND_OUTPUT) | (1 << KIND_INPUT), "a failed merge", st);
    } else if (want && !out_overlap && !(in_place && part_overlap)) {
        const double otol = (2.0 * h_eps(o.dtype) + 1e-5);
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t h = 0; h < H; h++) {
                    const int64_t row = (b * S + s) * H + h;
                    for (int64_t e = 0; e < Dv; e++) {
                        const double g = h_get(&o, b, s, h, e), x = want[row * Dv + e];
                        if (!(fabs(g - x) <= otol * fmax(1.0, fabs(x))))
                            FINDING("merge: o(%lld, %lld, %lld, %lld) = %.9g, formula %.9g", (long long)b, (long long)s,
                                    (long long)h, (long long)e, g, x);
                    }
                    if (lse.data && !(opt & 4)) {
                        const double g = h_get(&lse, b, h, s, 0), x = lwant[row];
                        if (!((isinf(x) && g == x) || fabs(g - x) <= 32 * FLT_EPSILON * fmax(1.0, fabs(x))))
                            FINDING("merge: lse(%lld, %lld, %lld) = %.9g, formula %.9g", (long long)b, (long long)h,
                                    (long long)s, g, x);
                    }
                }
    }
    free(want), free(lwant);
    world_free(&w);
}

/* fa_forward_check and fa_forward_work are fa_forward's first half: on the world as
 * it stands (just snapshotted) they must write nothing at all, and agree with the
 * call: work only where check accepts it, with FLOPs 2*(D+Dv) per pair and the
 * backward's 2.5x. Returns check's status, for check_agrees once the call ran. */
static fa_status check_first(world *w, const fa_forward_args *seen, const char *what) {
    const fa_status sc = fa_forward_check(g_ctx, seen);
    fa_work wk = FA_WORK_INIT;
    const fa_status sw = fa_forward_work(g_ctx, seen, &wk);
    expect_unchanged(w, (1 << KIND_INPUT) | (1 << KIND_OUTPUT) | (1 << KIND_CACHE), what, sc);
    if (sw != sc) FINDING("%s: fa_forward_work says %s, fa_forward_check %s", what, fa_status_string(sw), fa_status_string(sc));
    if (sw == FA_OK) {
        const double per = 2.0 * (double)(seen->q.shape[3] + seen->o.shape[3]); /* D + Dv: o has Dv */
        if (wk.pairs < 0 || wk.flops != per * (double)wk.pairs || wk.backward_flops != 2.5 * wk.flops)
            FINDING("%s: fa_forward_work gave %lld pairs, %g flops, %g backward flops", what, (long long)wk.pairs,
                    wk.flops, wk.backward_flops);
    }
    return sc;
}

/* The call's status against check's: the same, but for what only running can find
 * (memory, threads). */
static void check_agrees(fa_status sc, fa_status st, const char *what) {
    const int run_only = st == FA_ERR_OUT_OF_MEMORY || st == FA_ERR_THREADS;
    if (sc != st && !(sc == FA_OK && run_only))
        FINDING("%s: fa_forward_check said %s, fa_forward %s", what, fa_status_string(sc), fa_status_string(st));
}

/* ------------------------------------------------------------ the small calls */

static void fuzz_misc(reader *r) {
    const int param = (int)(int8_t)u8(r) + (u8(r) & 1 ? 100 : 0);
    int64_t lo = 0, hi = 0, v = 0;
    const fa_status bs = fa_param_bounds((fa_param)param, &lo, &hi);
    if (bs == FA_OK && lo > hi) FINDING("bounds of %d: [%lld, %lld]", param, (long long)lo, (long long)hi);
    if (fa_param_bounds((fa_param)param, NULL, &hi) == FA_OK) FINDING("bounds with NULL lo");
    if (fa_context_get(g_ctx, (fa_param)param, &v) == FA_OK && bs != FA_OK) FINDING("get of unknown param %d", param);
    if (fa_context_get(g_ctx, (fa_param)param, NULL) == FA_OK) FINDING("get with NULL value");
    const int64_t val = (int64_t)u64(r);
    if (param != FA_PARAM_VERBOSE && !(param == FA_PARAM_THREADS && val > 2) &&
        !(param == FA_PARAM_TILE_KV && val > 256) && !(param == FA_PARAM_TILE_Q && val > 256)) {
        const fa_status st = fa_context_set(g_ctx, (fa_param)param, val);
        if (st == FA_OK && (bs != FA_OK || val < lo || val > hi || param >= 100))
            FINDING("set(%d, %lld) accepted", param, (long long)val);
    }
    if (fa_context_set(NULL, FA_PARAM_ALGO, 0) != FA_ERR_NULL_CONTEXT) FINDING("set on NULL");
    if (fa_forward(NULL, NULL) != FA_ERR_NULL_CONTEXT) FINDING("forward on NULL");
    if (fa_forward(g_ctx, NULL) != FA_ERR_NULL_POINTER) FINDING("forward with NULL args");
    if (fa_merge_states(NULL, 1, NULL, NULL, NULL, NULL) != FA_ERR_NULL_CONTEXT) FINDING("merge on NULL");
    double pv;
    const fa_probe_kind kind = (fa_probe_kind)(int8_t)u8(r);
    if (kind < FA_PROBE_FMA_PEAK || kind > FA_PROBE_TILE_PEAK) {
        if (fa_probe(g_ctx, kind, &pv) == FA_OK) FINDING("probe of kind %d", (int)kind);
    }
    if (fa_probe(g_ctx, FA_PROBE_FMA_PEAK, NULL) == FA_OK) FINDING("probe with NULL value");
    const int code = (int)(int8_t)u8(r);
    if (!fa_status_string((fa_status)code) || !fa_dtype_name((fa_dtype)code) || !fa_algo_name((fa_algo)code))
        FINDING("a NULL name for %d", code);
    (void)fa_dtype_size((fa_dtype)code);
    const fa_tensor t = fa_tensor_make(NULL, (fa_dtype)code, (fa_layout)(int8_t)u8(r), rd_dim(r, 9), rd_dim(r, 9),
                                       rd_dim(r, 9), rd_dim(r, 9));
    const fa_tensor t2 = fa_tensor_contiguous(NULL, (fa_dtype)code, rd_dim(r, 9), rd_dim(r, 9), rd_dim(r, 9), rd_dim(r, 9));
    (void)t, (void)t2;
    (void)fa_context_error(g_ctx), (void)fa_context_isa(g_ctx), (void)fa_cpu_features();
    (void)fa_version_string(), (void)fa_version_number();
    fa_forward_args a;
    fa_forward_args_init(&a);
    fa_forward_args_init(NULL);
    fa_kv_cache c;
    fa_kv_cache_init(&c);
    fa_kv_cache_init(NULL);
    if (a.struct_size != sizeof a || c.struct_size != sizeof c) FINDING("init structs");
    fa_context_set(g_ctx, FA_PARAM_THREADS, 1);
}

/* ------------------------------------------------------------ entry */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static fa_tensor dummy;
    if (!g_ctx) {
        if (fa_context_create(&g_ctx) != FA_OK || fa_context_create(&g_ref) != FA_OK) abort();
        fa_context_set(g_ref, FA_PARAM_THREADS, 1);
        fa_context_set(g_ref, FA_PARAM_ALGO, FA_ALGO_REFERENCE);
        g_dummy_tensor = &dummy;
        g_verbose = getenv("FUZZ_API_VERBOSE") != NULL;
        philox_self_test();
    }
    reader r = {data, size, 0};
    const uint8_t op = u8(&r);
    g_rng = u64(&r) | 1;
    memset(&dummy, 0, sizeof dummy);
    if (op == 6 || op == 7 || (op >= 0x60 && op < 0x80)) { /* kept apart: the older seeds' ops stay as they were */
        fuzz_backward(&r, op & 1);
        return 0;
    }
    switch (op % 6) {
    case 0: fuzz_dense(&r); break;
    case 1: fuzz_varlen(&r); break;
    case 2: fuzz_cache(&r, 0); break;
    case 3: fuzz_cache(&r, 1); break;
    case 4: fuzz_merge(&r); break;
    default: fuzz_misc(&r); break;
    }
    return 0;
}
