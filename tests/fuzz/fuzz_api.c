/*
 * fuzz_api.c: a libFuzzer target over the whole public API (issue 8).
 *
 * The input is a little program: byte 0 picks an entry point (dense fa_forward, varlen,
 * a contiguous, paged or int8 KV cache with or without an append, fa_merge_states, or
 * the small calls: settings, bounds, names, tensor makers, probe misuse), the rest
 * decode every field: dims (small, zero, negative or one of a table of huge values),
 * per-tensor layouts (row-major, head-major, reversed, padded, negated, zero, raw or
 * huge strides, shapes that disagree), dtypes and enum values (valid or not), scale,
 * softcap, windows up to INT64_MAX, q_start/k_start, ALiBi, bias/mask broadcasts,
 * struct_size, cu_seqlens, seqlens, batch_idx, block tables, thread counts and tiles.
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
    case FA_DTYPE_I8: return 1;
    default: return 4; /* an invalid dtype the library must refuse: any buffer will do */
    }
}

static void store_value(void *p, fa_dtype dt, double x) {
    switch (dt) {
    case FA_DTYPE_F16: { uint16_t h = h_f32_to_f16((float)x); memcpy(p, &h, 2); break; }
    case FA_DTYPE_BF16: { uint16_t h = h_f32_to_bf16((float)x); memcpy(p, &h, 2); break; }
    case FA_DTYPE_BOOL: *(uint8_t *)p = x != 0.0; break;
    case FA_DTYPE_I8: *(int8_t *)p = (int8_t)x; break;
    default: { float f = (float)x; memcpy(p, &f, 4); break; }
    }
}

static double load_value(const void *p, fa_dtype dt) {
    switch (dt) {
    case FA_DTYPE_F16: { uint16_t h; memcpy(&h, p, 2); return h_f16_to_f32(h); }
    case FA_DTYPE_BF16: { uint16_t h; memcpy(&h, p, 2); return h_bf16_to_f32(h); }
    case FA_DTYPE_BOOL: return *(const uint8_t *)p != 0;
    case FA_DTYPE_I8: return *(const int8_t *)p;
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
        const i128 span = (i128)(t->shape[d] - 1) * t->stride[d];
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
    if (fa_context_set(g_ctx, FA_PARAM_TILE_Q, tq) != FA_OK || fa_context_set(g_ctx, FA_PARAM_TILE_KV, tk) != FA_OK ||
        fa_context_set(g_ctx, FA_PARAM_KV_SPLITS, splits) != FA_OK || fa_context_set(g_ctx, FA_PARAM_BF16_DOT, dot) != FA_OK)
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
    (void)group;
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
                    h_set(&mask, b, h, i, j, keep);
                    h_set(&bias, b, h, i, j, x);
                }
    na.mask = mask, na.bias = bias;
    na.alibi_slopes = NULL, na.causal = FA_CAUSAL_NONE, na.window_left = na.window_right = -1;
    na.q_start = na.k_start = 0;
    na.o = *o_got;
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
                    const double r = h_get(o_ref, b, i, h, e);
                    omax = fmax(omax, fabs(r));
                    if (naive_ok) naive_o = fmax(naive_o, fabs(os[((b * Sq + i) * Hq + h) * Dv + e] - r));
                }
            }
    const double otol = 2.0 * naive_o + h_prop_ulps(o_got->dtype) * h_eps(o_got->dtype) * fmax(1.0, omax);
    const double ltol = 2.0 * naive_l + h_prop_lse_ulps() * FLT_EPSILON * fmax(1.0, lmax);
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
                for (int64_t e = 0; e < Dv; e++) {
                    const double g = h_get(o_got, b, i, h, e), w = h_get(o_ref, b, i, h, e);
                    if (!(fabs(g - w) <= otol))
                        FINDING("%s: o(b %lld, i %lld, h %lld, e %lld) = %.9g, reference %.9g (tol %.3g, naive err "
                                "%.3g)", what, (long long)b, (long long)i, (long long)h, (long long)e, g, w, otol, naive_o);
                }
            }
    free(os), free(ls), free(mask.data), free(bias.data);
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

static const fa_forward_args *dress(reader *r, const fa_forward_args *a, big_args *out, int *tail_bad) {
    memset(out, 0, sizeof *out);
    out->u.a = *a;
    *tail_bad = 0;
    const uint8_t b = u8(r);
    if (b < 0xE0) return &out->u.a;
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
                         (a.bias.data && too_slow(numel(&a.bias))) || (a.mask.data && too_slow(numel(&a.mask))))) {
        world_free(&w);
        return;
    }
    big_args big;
    int tail_bad;
    const fa_forward_args *seen = dress(r, &a, &big, &tail_bad);
    const int finite = all_finite(&w);
    snapshot(&w);
    const fa_status st = fa_forward(g_ctx, seen);
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
    /* the oracle's outputs from the shapes the library saw (rows and Dv bounded above) */
    ra.o = h_alloc(FA_DTYPE_F32, a.q.shape[0], a.q.shape[1], a.q.shape[2], a.v.shape[3]);
    ra.lse = h_alloc(FA_DTYPE_F32, a.q.shape[0], a.q.shape[2], a.q.shape[1], 1);
    const fa_status rs = fa_forward(g_ref, &ra);
    if (rs != FA_OK) FINDING("dense: %s succeeded but the reference says %s (%s)", fa_algo_name(algo), fa_status_string(rs),
                             fa_context_error(g_ref));
    const fa_forward_args ea = effective(seen);
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
    const fa_forward_args *seen = dress(r, &a, &big, &tail_bad);
    const int finite = all_finite(&w);
    snapshot(&w);
    const fa_status st = fa_forward(g_ctx, seen);
    trace("varlen", st);
    expect_unchanged(&w, 1 << KIND_INPUT, "varlen", st);
    if (st != FA_OK) {
        expect_unchanged(&w, 1 << KIND_OUTPUT, "a failed varlen call", st);
        world_free(&w);
        return;
    }
    if (tail_bad) FINDING("varlen: a non-zero byte beyond the struct was accepted");
    if (find(&w, o)->overlap || find(&w, lse)->overlap || !finite) {
        world_free(&w);
        return;
    }
    /* each sequence against the reference on its dense views */
    const fa_forward_args ea = effective(seen);
    for (int64_t b = 0; b < ea.num_seqs; b++) {
        const int64_t q0 = cu_q[b], sq = cu_q[b + 1] - q0, k0 = cu_k[b], sk = cu_k[b + 1] - k0;
        if (sq == 0) continue;
        fa_forward_args ra = ea;
        ra.cu_seqlens_q = ra.cu_seqlens_k = NULL, ra.num_seqs = 0;
        ra.q = rows_view(&ea.q, q0, sq), ra.k = rows_view(&ea.k, k0, sk), ra.v = rows_view(&ea.v, k0, sk);
        if (ra.alibi_slopes) ra.alibi_slopes += b * ra.alibi_stride_b, ra.alibi_stride_b = 0;
        fa_tensor go = rows_view(&ea.o, q0, sq), gl = ea.lse;
        gl.data = (float *)ea.lse.data + q0 * ea.lse.stride[2], gl.shape[2] = sq;
        ra.o = h_alloc(FA_DTYPE_F32, 1, sq, Hq, Dv);
        ra.lse = h_alloc(FA_DTYPE_F32, 1, Hq, sq, 1);
        const fa_status rs = fa_forward(g_ref, &ra);
        if (rs != FA_OK) FINDING("varlen: sequence %lld refused by the reference: %s", (long long)b, fa_context_error(g_ref));
        fa_forward_args ja = ra;
        ja.o = go;
        judge_dense(&ja, &go, &gl, &ra.o, &ra.lse, "varlen");
        free(ra.o.data), free(ra.lse.data);
    }
    /* rows no sequence owns keep their sentinel: checked by the snapshot for o past cu[n] */
    again_bitwise(&w, seen, threads, "varlen");
    world_free(&w);
}

/* Element (i0, i1, i2, i3) of t: its byte address. */
static unsigned char *at(const fa_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return (unsigned char *)t->data +
           (i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2] + i3 * t->stride[3]) * (int64_t)esize(t->dtype);
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
    const fa_dtype cdt = (cd & 3) == 3 ? FA_DTYPE_I8 : (fa_dtype)(cd & 3);
    fa_kv_cache c = FA_KV_CACHE_INIT;
    /* the cache may be any layout when nothing is appended; appends need distinct slots */
    fa_tensor *kt = make(&w, r, cdt, slots0, slots1, Hk, D, KIND_CACHE, 1.0);
    fa_tensor *vt = make(&w, r, cdt, slots0, slots1, Hk, Dv, KIND_CACHE, 1.0);
    fa_tensor *kst = NULL, *vst = NULL;
    c.k = *kt, c.v = *vt;
    if (cdt == FA_DTYPE_I8 || (cd & 0x80)) {
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
    const int64_t cap = mul_or_neg(c.k.shape[1], paged ? c.max_pages : 1);
    const int64_t dsum = add_or_neg(c.k.shape[3], c.v.shape[3]);
    const int64_t work = mul_or_neg(mul_or_neg(mul_or_neg(a.q.shape[0], a.q.shape[1]), mul_or_neg(a.q.shape[2], dsum ? dsum : 1)),
                                    add_or_neg(cap, append ? a.k.shape[1] : 0));
    /* the block table holds B * max_pages ids: a claim beyond the buffer is the fuzzer's
     * own mistake (skip it), one beyond 64 bits the library must refuse (keep it) */
    const int64_t table_entries = paged ? mul_or_neg(B, c.max_pages) : 0;
    const int table_short = paged && table_entries > (int64_t)(sizeof table / sizeof table[0]);
    if (w.skip || table_short || (work >= 0 && work > MAX_WORK) || numel(&c.k) > MAX_WORK || numel(&c.v) > MAX_WORK) {
        world_free(&w);
        return;
    }
    /* an append into self-overlapping cache memory has no defined result: skip */
    for (int i = 0; i < w.n; i++)
        if (append && w.t[i].kind == KIND_CACHE && w.t[i].overlap) {
            world_free(&w);
            return;
        }
    const int finite = all_finite(&w);
    snapshot(&w);
    const fa_status st = fa_forward(g_ctx, &a);
    trace(paged ? "paged cache" : "cache", st);
    expect_unchanged(&w, 1 << KIND_INPUT, "cache", st);
    if (st != FA_OK) {
        expect_unchanged(&w, (1 << KIND_OUTPUT) | (1 << KIND_CACHE), "a failed cache call", st);
        world_free(&w);
        return;
    }
    /* appended rows hold the new values (float caches: rounded; int8: within half a
     * step of their scale); then every other cache byte must be as before */
    for (int64_t b = 0; b < B && append && Snew > 0; b++)
        for (int64_t t = 0; t < Snew; t++) {
            const int64_t j = seqlens[b] + t;
            int64_t blk = paged ? table[b * c.max_pages + j / slots1] : (c.batch_idx ? batch_idx[b] : b);
            const int64_t row = paged ? j % slots1 : j;
            for (int64_t h = 0; h < Hk; h++)
                for (int which = 0; which < 2; which++) {
                    const fa_tensor *ct = which ? &c.v : &c.k, *nt = which ? &a.v : &a.k;
                    const fa_tensor *sc = which ? &c.v_scale : &c.k_scale;
                    const int64_t dim = which ? Dv : D;
                    double amax = 0.0;
                    for (int64_t e = 0; e < dim; e++) amax = fmax(amax, fabs(load_value(at(nt, b, t, h, e), nt->dtype)));
                    const double scale = cdt == FA_DTYPE_I8 ? load_value(at(sc, blk, row, h, 0), FA_DTYPE_F32) : 1.0;
                    if (cdt == FA_DTYPE_I8 && fabs(scale - amax / 127.0) > 1e-6 * amax + 1e-30)
                        FINDING("cache: int8 scale %.9g for max %.9g", scale, amax);
                    for (int64_t e = 0; e < dim; e++) {
                        const double x = load_value(at(nt, b, t, h, e), nt->dtype);
                        const double got = load_value(at(ct, blk, row, h, e), cdt) * scale;
                        const double want = cdt == FA_DTYPE_I8 ? x : h_round(x, cdt);
                        const double tol = cdt == FA_DTYPE_I8 ? 0.5 * scale * (1 + 1e-3) + 1e-30 : 0.0;
                        if (finite && !(fabs(got - want) <= tol))
                            FINDING("cache: appended %s row (b %lld, t %lld, h %lld, e %lld) holds %.9g, not %.9g",
                                    which ? "v" : "k", (long long)b, (long long)t, (long long)h, (long long)e, got, want);
                    }
                    /* mark these bytes as expected to change */
                    ften *fc = find(&w, which ? vt : kt);
                    for (int64_t e = 0; e < dim; e++) {
                        const unsigned char *p = at(ct, blk, row, h, e);
                        memcpy(fc->before + (p - fc->base), p, esize(cdt));
                    }
                    if (cdt == FA_DTYPE_I8) {
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
    if (w.skip || (numel(&o) >= 0 && mul_or_neg(numel(&o), m) > MAX_WORK) || (n > 6)) { /* unreachable with N above; kept for a wider table */
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
    if (kind < 1 || kind > 3) {
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
    }
    reader r = {data, size, 0};
    const uint8_t op = u8(&r);
    g_rng = u64(&r) | 1;
    memset(&dummy, 0, sizeof dummy);
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
