/*
 * test_api.c: the contract of the C interface around the math. Every misuse returns
 * its own status on every algorithm, writes nothing to o or lse (both are filled with a
 * sentinel pattern and compared byte for byte afterwards) and leaves a non-empty
 * fa_context_error(). Also: context settings and their bounds, read-only read-outs,
 * status strings, versions, the args initialiser, and ABI growth (a caller compiled
 * against an older, shorter fa_forward_args).
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static const fa_algo ALGOS[] = {FA_ALGO_REFERENCE, FA_ALGO_FLASH, FA_ALGO_STANDARD};
enum { SENTINEL = 0xa5 };

static fa_context *g_ctx;
static h_rng g_rng;
static h_problem g_p; /* a valid call: every misuse case starts from a copy of g_p.args */
static size_t g_o_bytes, g_lse_bytes;

static int all_bytes(const void *p, size_t n, unsigned char value) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != value) return 0;
    return 1;
}

static void poison(void) {
    memset(g_p.args.o.data, SENTINEL, g_o_bytes);
    memset(g_p.args.lse.data, SENTINEL, g_lse_bytes);
}

static int outputs_untouched(void) {
    return all_bytes(g_p.args.o.data, g_o_bytes, SENTINEL) &&
           all_bytes(g_p.args.lse.data, g_lse_bytes, SENTINEL);
}

/* fa_forward(ctx, a) must fail with `want` on every algorithm and write nothing. */
static void expect_forward(const char *name, fa_context *ctx, const fa_forward_args *a, fa_status want) {
    for (size_t al = 0; al < sizeof ALGOS / sizeof ALGOS[0]; al++) {
        h_case("%s (algo=%s)", name, h_algo_str(ALGOS[al]));
        fa_context_set(g_ctx, FA_PARAM_ALGO, ALGOS[al]);
        fa_context_set(g_ctx, FA_PARAM_THREADS, 2);
        poison();
        const fa_status st = fa_forward(ctx, a);
        CHECK(st == want, "status %d (%s), expected %d (%s); error text: \"%s\"", (int)st,
              fa_status_string(st), (int)want, fa_status_string(want),
              ctx ? fa_context_error(ctx) : "(no context)");
        CHECK(outputs_untouched(), "a failing call wrote to o or lse");
        if (ctx) {
            const char *err = fa_context_error(ctx);
            CHECK(err && err[0] != '\0', "fa_context_error is empty after a failure");
        }
        /* validation alone gives the same verdict, by the same code */
        const fa_status chk = fa_forward_check(ctx, a);
        CHECK(chk == want, "fa_forward_check: status %d (%s), fa_forward's %d", (int)chk, fa_status_string(chk),
              (int)want);
        CHECK(outputs_untouched(), "fa_forward_check wrote to o or lse");
    }
}

/* ------------------------------------------------------------- forward misuse */

static void test_null(void) {
    fa_forward_args a = g_p.args;
    expect_forward("args NULL", g_ctx, NULL, FA_ERR_NULL_POINTER);
    expect_forward("context NULL", NULL, &a, FA_ERR_NULL_CONTEXT);
    a.q.data = NULL;
    expect_forward("q.data NULL", g_ctx, &a, FA_ERR_NULL_POINTER);
    a = g_p.args, a.k.data = NULL;
    expect_forward("k.data NULL", g_ctx, &a, FA_ERR_NULL_POINTER);
    a = g_p.args, a.v.data = NULL;
    expect_forward("v.data NULL", g_ctx, &a, FA_ERR_NULL_POINTER);
    a = g_p.args, a.o.data = NULL;
    expect_forward("o.data NULL", g_ctx, &a, FA_ERR_NULL_POINTER);
}

static void test_struct_size(void) {
    fa_forward_args a = g_p.args;
    a.struct_size = 0;
    expect_forward("struct_size 0", g_ctx, &a, FA_ERR_STRUCT_SIZE);
    a.struct_size = sizeof(size_t);
    expect_forward("struct_size 8", g_ctx, &a, FA_ERR_STRUCT_SIZE);
    a.struct_size = offsetof(fa_forward_args, q) + sizeof(fa_tensor);
    expect_forward("struct_size covering only q", g_ctx, &a, FA_ERR_STRUCT_SIZE);
}

/* The tensors (and their axes) that carry one named dimension. */
typedef struct dim_use {
    const char *name;
    int n;
    struct {
        int tensor; /* 0 q, 1 k, 2 v, 3 o, 4 lse */
        int axis;
    } at[5];
} dim_use;

static const dim_use DIMS[] = {
    {"B", 5, {{0, 0}, {1, 0}, {2, 0}, {3, 0}, {4, 0}}},
    {"Sq", 3, {{0, 1}, {3, 1}, {4, 2}}},
    {"Sk", 2, {{1, 1}, {2, 1}}},
    {"Hq", 3, {{0, 2}, {3, 2}, {4, 1}}},
    {"Hk", 2, {{1, 2}, {2, 2}}},
    {"D", 2, {{0, 3}, {1, 3}}},
    {"Dv", 2, {{2, 3}, {3, 3}}},
};

static fa_tensor *tensor_of(fa_forward_args *a, int which) {
    fa_tensor *ts[5] = {&a->q, &a->k, &a->v, &a->o, &a->lse};
    return ts[which];
}

static void set_dim(fa_forward_args *a, const dim_use *du, int64_t value) {
    for (int u = 0; u < du->n; u++) tensor_of(a, du->at[u].tensor)->shape[du->at[u].axis] = value;
}

static void test_dims(void) {
    /* zero dims are legal (empty shapes, tests/test_regress.c), except D = 0 */
    const int64_t bad[] = {-1, INT64_MIN};
    for (size_t t = 0; t < sizeof DIMS / sizeof DIMS[0]; t++)
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            fa_forward_args a = g_p.args;
            set_dim(&a, &DIMS[t], bad[b]);
            char name[64];
            snprintf(name, sizeof name, "%s = %lld everywhere", DIMS[t].name, (long long)bad[b]);
            expect_forward(name, g_ctx, &a, FA_ERR_INVALID_DIM);
        }
    for (size_t t = 0; t < sizeof DIMS / sizeof DIMS[0]; t++) {
        if (strcmp(DIMS[t].name, "D") != 0) continue;
        fa_forward_args a = g_p.args;
        set_dim(&a, &DIMS[t], 0);
        expect_forward("D = 0 everywhere", g_ctx, &a, FA_ERR_INVALID_DIM);
    }
}

static void test_shape_mismatch(void) {
    static const struct {
        const char *name;
        int tensor, axis;
        int64_t delta;
    } cases[] = {
        {"k batch", 1, 0, 1},    {"v batch", 2, 0, -1},  {"o batch", 3, 0, 1},   {"v seq != k seq", 2, 1, 1},
        {"k D != q D", 1, 3, 1}, {"o seq != q seq", 3, 1, -1}, {"o Dv != v Dv", 3, 3, 1},
        {"o heads != q heads", 3, 2, -2}, {"v heads != k heads", 2, 2, -1}, {"lse seq", 4, 2, 1},
        {"lse heads", 4, 1, -1}, {"lse batch", 4, 0, 1}, {"lse last dim 2", 4, 3, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fa_forward_args a = g_p.args;
        tensor_of(&a, cases[c].tensor)->shape[cases[c].axis] += cases[c].delta;
        expect_forward(cases[c].name, g_ctx, &a, FA_ERR_SHAPE_MISMATCH);
    }
}

static void test_head_ratio(void) {
    /* g_p: Hq = 4, Hk = 2 */
    fa_forward_args a = g_p.args;
    a.q.shape[2] = a.o.shape[2] = a.lse.shape[1] = 3;
    expect_forward("Hq=3, Hk=2", g_ctx, &a, FA_ERR_HEAD_RATIO);
    a = g_p.args;
    a.k.shape[2] = a.v.shape[2] = 3;
    expect_forward("Hq=4, Hk=3", g_ctx, &a, FA_ERR_HEAD_RATIO);
    a = g_p.args;
    a.k.shape[2] = a.v.shape[2] = 8;
    expect_forward("Hq=4, Hk=8", g_ctx, &a, FA_ERR_HEAD_RATIO);
}

static void test_dtypes(void) {
    fa_forward_args a = g_p.args;
    a.k.dtype = FA_DTYPE_F16;
    expect_forward("k f16, q f32", g_ctx, &a, FA_ERR_DTYPE);
    a = g_p.args, a.v.dtype = FA_DTYPE_BF16;
    expect_forward("v bf16, q f32", g_ctx, &a, FA_ERR_DTYPE);
    a = g_p.args, a.q.dtype = a.k.dtype = a.v.dtype = FA_DTYPE_BOOL;
    expect_forward("q, k, v bool", g_ctx, &a, FA_ERR_DTYPE);
    a = g_p.args, a.q.dtype = a.k.dtype = a.v.dtype = FA_DTYPE_F16, a.o.dtype = FA_DTYPE_BF16;
    expect_forward("q f16, o bf16 (a third dtype)", g_ctx, &a, FA_ERR_DTYPE);
    a = g_p.args, a.q.dtype = a.k.dtype = a.v.dtype = FA_DTYPE_BF16, a.o.dtype = FA_DTYPE_F16;
    expect_forward("q bf16, o f16 (a third dtype)", g_ctx, &a, FA_ERR_DTYPE);
    a = g_p.args, a.o.dtype = FA_DTYPE_F16;
    expect_forward("q f32, o f16", g_ctx, &a, FA_ERR_DTYPE);
    a = g_p.args, a.o.dtype = FA_DTYPE_BOOL;
    expect_forward("o bool", g_ctx, &a, FA_ERR_DTYPE);
    a = g_p.args, a.lse.dtype = FA_DTYPE_F16;
    expect_forward("lse f16", g_ctx, &a, FA_ERR_DTYPE);
    a = g_p.args, a.q.dtype = a.k.dtype = a.v.dtype = a.o.dtype = (fa_dtype)7;
    expect_forward("unknown dtype 7", g_ctx, &a, FA_ERR_DTYPE);

    fa_tensor bias = h_alloc(FA_DTYPE_BOOL, 1, 1, g_p.dims.Sq, g_p.dims.Sk);
    a = g_p.args, a.bias = bias;
    expect_forward("bias bool", g_ctx, &a, FA_ERR_DTYPE);
    free(bias.data);
    fa_tensor mask = h_alloc(FA_DTYPE_F32, 1, 1, g_p.dims.Sq, g_p.dims.Sk);
    a = g_p.args, a.mask = mask;
    expect_forward("mask f32", g_ctx, &a, FA_ERR_DTYPE);
    free(mask.data);
}

static void test_overflow(void) {
    fa_forward_args a = g_p.args;
    a.q.stride[0] = INT64_MAX / 2; /* elements fit, bytes do not */
    expect_forward("q batch stride INT64_MAX/2 (bytes overflow)", g_ctx, &a, FA_ERR_OVERFLOW);
    a = g_p.args, a.k.stride[1] = INT64_MAX / 4; /* 6 * stride overflows even in elements */
    expect_forward("k seq stride INT64_MAX/4", g_ctx, &a, FA_ERR_OVERFLOW);
    a = g_p.args, a.v.stride[3] = INT64_MIN / 8;
    expect_forward("v dim stride INT64_MIN/8", g_ctx, &a, FA_ERR_OVERFLOW);
    a = g_p.args, a.o.stride[2] = INT64_MAX / 8;
    expect_forward("o head stride INT64_MAX/8", g_ctx, &a, FA_ERR_OVERFLOW);
    a = g_p.args, a.lse.stride[2] = INT64_MAX / 3;
    expect_forward("lse seq stride INT64_MAX/3", g_ctx, &a, FA_ERR_OVERFLOW);

    a = g_p.args;
    set_dim(&a, &DIMS[0], (int64_t)1 << 62);
    expect_forward("B = 2^62 with dense strides", g_ctx, &a, FA_ERR_OVERFLOW);
    a = g_p.args;
    set_dim(&a, &DIMS[5], (int64_t)1 << 62);
    expect_forward("D = 2^62 (bytes overflow)", g_ctx, &a, FA_ERR_OVERFLOW);

    fa_tensor bias = h_alloc(FA_DTYPE_F32, 1, 1, g_p.dims.Sq, g_p.dims.Sk);
    a = g_p.args, a.bias = bias;
    a.bias.stride[2] = INT64_MAX / 2;
    expect_forward("bias stride INT64_MAX/2", g_ctx, &a, FA_ERR_OVERFLOW);
    free(bias.data);
}

static void test_broadcast(void) {
    const h_dims *d = &g_p.dims;
    static const struct {
        const char *name;
        int is_mask;
        int64_t shape[4]; /* -1: the full size */
    } cases[] = {
        {"bias batch 3 (B=2)", 0, {3, -1, -1, -1}},
        {"bias heads Hk (Hq=4, Hk=2)", 0, {1, 2, 1, 1}},
        {"bias Sq+1", 0, {1, 1, 6, -1}},
        {"bias Sk-1", 0, {1, 1, 1, 6}},
        {"mask Sk 2", 1, {1, 1, -1, 2}},
        {"mask heads 3", 1, {-1, 3, -1, -1}},
    };
    const int64_t full[4] = {d->B, d->Hq, d->Sq, d->Sk};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t s[4];
        for (int ax = 0; ax < 4; ax++) s[ax] = cases[c].shape[ax] < 0 ? full[ax] : cases[c].shape[ax];
        fa_tensor t = h_alloc(cases[c].is_mask ? FA_DTYPE_BOOL : FA_DTYPE_F32, s[0], s[1], s[2], s[3]);
        fa_forward_args a = g_p.args;
        if (cases[c].is_mask) a.mask = t;
        else a.bias = t;
        expect_forward(cases[c].name, g_ctx, &a, FA_ERR_BROADCAST);
        free(t.data);
    }
}

static void test_invalid_scalars(void) {
    fa_forward_args a = g_p.args;
    a.scale = NAN;
    expect_forward("scale NaN", g_ctx, &a, FA_ERR_INVALID_ARGUMENT);
    a.scale = INFINITY;
    expect_forward("scale +inf", g_ctx, &a, FA_ERR_INVALID_ARGUMENT);
    a.scale = -INFINITY;
    expect_forward("scale -inf", g_ctx, &a, FA_ERR_INVALID_ARGUMENT);
    a = g_p.args, a.softcap = -1.0f;
    expect_forward("softcap -1", g_ctx, &a, FA_ERR_INVALID_ARGUMENT);
    a.softcap = NAN;
    expect_forward("softcap NaN", g_ctx, &a, FA_ERR_INVALID_ARGUMENT);
    a = g_p.args, a.window_left = -2;
    expect_forward("window_left -2", g_ctx, &a, FA_ERR_INVALID_ARGUMENT);
    a = g_p.args, a.window_right = -3;
    expect_forward("window_right -3", g_ctx, &a, FA_ERR_INVALID_ARGUMENT);
    a = g_p.args, a.window_left = INT64_MIN;
    expect_forward("window_left INT64_MIN", g_ctx, &a, FA_ERR_INVALID_ARGUMENT);
    a = g_p.args, a.causal = (fa_causal)3;
    expect_forward("causal 3", g_ctx, &a, FA_ERR_INVALID_ARGUMENT);
    a = g_p.args, a.causal = (fa_causal)-1;
    expect_forward("causal -1", g_ctx, &a, FA_ERR_INVALID_ARGUMENT);
}

/* ------------------------------------------------------------ context API */

static void test_context_params(void) {
    fa_context *ctx = NULL;
    h_case("context defaults");
    CHECK(fa_context_create(&ctx) == FA_OK && ctx, "fa_context_create failed");
    if (!ctx) return;
    int64_t v = -99;
    CHECK(fa_context_get(ctx, FA_PARAM_THREADS, &v) == FA_OK && v == 0, "default THREADS %lld, want 0", (long long)v);
    CHECK(fa_context_get(ctx, FA_PARAM_ALGO, &v) == FA_OK && v == FA_ALGO_AUTO, "default ALGO %lld", (long long)v);
    const char *isa = fa_context_isa(ctx);
    CHECK(isa && isa[0], "fa_context_isa is NULL or empty");
    CHECK(fa_cpu_features() != NULL, "fa_cpu_features is NULL");

    h_case("fa_param_bounds");
    int64_t lo = -7, hi = -7;
    CHECK(fa_param_bounds(FA_PARAM_ALGO, &lo, &hi) == FA_OK && lo == FA_ALGO_AUTO && hi == FA_ALGO_REFERENCE,
          "ALGO bounds [%lld, %lld]", (long long)lo, (long long)hi);
    CHECK(fa_param_bounds(FA_PARAM_THREADS, &lo, &hi) == FA_OK && lo == 0 && hi >= 3,
          "THREADS bounds [%lld, %lld], want lo 0 and hi >= 3", (long long)lo, (long long)hi);
    const int64_t threads_hi = hi;
    CHECK(fa_param_bounds((fa_param)999, &lo, &hi) == FA_ERR_INVALID_ARGUMENT, "bounds of param 999");
    CHECK(fa_param_bounds(FA_PARAM_THREADS, NULL, &hi) == FA_ERR_NULL_POINTER, "bounds with lo NULL");
    CHECK(fa_param_bounds(FA_PARAM_THREADS, &lo, NULL) == FA_ERR_NULL_POINTER, "bounds with hi NULL");

    /* every settable parameter: bounds exist, both ends are accepted, one past is not */
    static const struct {
        const char *name;
        fa_param p;
        int64_t dflt;
    } settable[] = {
        {"THREADS", FA_PARAM_THREADS, 0}, {"ALGO", FA_PARAM_ALGO, FA_ALGO_AUTO},
        {"TILE_Q", FA_PARAM_TILE_Q, 0},   {"TILE_KV", FA_PARAM_TILE_KV, 0},
        {"VERBOSE", FA_PARAM_VERBOSE, -1}, /* default comes from the environment */
    };
    for (size_t c = 0; c < sizeof settable / sizeof settable[0]; c++) {
        h_case("bounds of %s", settable[c].name);
        int64_t before = 0, plo = 0, phi = 0;
        CHECK(fa_context_get(ctx, settable[c].p, &before) == FA_OK, "get failed");
        if (!CHECK(fa_param_bounds(settable[c].p, &plo, &phi) == FA_OK && plo <= phi,
                   "fa_param_bounds failed or empty: [%lld, %lld]", (long long)plo, (long long)phi))
            continue;
        if (settable[c].dflt >= 0)
            CHECK(before == settable[c].dflt, "default %lld, want %lld", (long long)before,
                  (long long)settable[c].dflt);
        CHECK(before >= plo && before <= phi, "default %lld outside [%lld, %lld]", (long long)before,
              (long long)plo, (long long)phi);
        CHECK(fa_context_set(ctx, settable[c].p, plo) == FA_OK, "lo %lld rejected", (long long)plo);
        CHECK(fa_context_set(ctx, settable[c].p, phi) == FA_OK, "hi %lld rejected", (long long)phi);
        CHECK(fa_context_get(ctx, settable[c].p, &v) == FA_OK && v == phi, "get after set hi: %lld", (long long)v);
        if (plo > INT64_MIN)
            CHECK(fa_context_set(ctx, settable[c].p, plo - 1) == FA_ERR_INVALID_ARGUMENT, "lo - 1 accepted");
        if (phi < INT64_MAX)
            CHECK(fa_context_set(ctx, settable[c].p, phi + 1) == FA_ERR_INVALID_ARGUMENT, "hi + 1 accepted");
        CHECK(fa_context_get(ctx, settable[c].p, &v) == FA_OK && v == phi, "a rejected set changed it to %lld",
              (long long)v);
        CHECK(fa_context_set(ctx, settable[c].p, before) == FA_OK, "restoring %lld failed", (long long)before);
    }

    h_case("fa_context_set: bounds are inclusive");
    CHECK(fa_context_set(ctx, FA_PARAM_THREADS, threads_hi) == FA_OK, "THREADS = hi rejected");
    CHECK(fa_context_set(ctx, FA_PARAM_THREADS, 0) == FA_OK, "THREADS = 0 rejected");
    CHECK(fa_context_set(ctx, FA_PARAM_ALGO, FA_ALGO_REFERENCE) == FA_OK, "ALGO = REFERENCE rejected");
    CHECK(fa_context_set(ctx, FA_PARAM_ALGO, FA_ALGO_AUTO) == FA_OK, "ALGO = AUTO rejected");
    CHECK(fa_context_set(ctx, FA_PARAM_ALGO, FA_ALGO_STANDARD) == FA_OK, "ALGO = STANDARD rejected");

    static const struct {
        const char *name;
        fa_param p;
        int64_t value;
    } bad[] = {
        {"ALGO 4", FA_PARAM_ALGO, 4},
        {"ALGO -1", FA_PARAM_ALGO, -1},
        {"THREADS -1", FA_PARAM_THREADS, -1},
        {"THREADS INT64_MIN", FA_PARAM_THREADS, INT64_MIN},
        {"read-only LAST_ALGO", FA_PARAM_LAST_ALGO, FA_ALGO_FLASH},
        {"read-only LAST_EXTRA_BYTES", FA_PARAM_LAST_EXTRA_BYTES, 0},
        {"unknown param 999", (fa_param)999, 1},
        {"unknown param 0", (fa_param)0, 1},
    };
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        h_case("fa_context_set %s", bad[c].name);
        CHECK(fa_context_set(ctx, bad[c].p, bad[c].value) == FA_ERR_INVALID_ARGUMENT, "not rejected");
        const char *err = fa_context_error(ctx);
        CHECK(err && err[0], "fa_context_error empty after a rejected set");
        CHECK(fa_context_get(ctx, FA_PARAM_ALGO, &v) == FA_OK && v == FA_ALGO_STANDARD,
              "ALGO changed to %lld by a rejected set", (long long)v);
    }
    h_case("fa_context_set THREADS hi+1");
    if (threads_hi < INT64_MAX)
        CHECK(fa_context_set(ctx, FA_PARAM_THREADS, threads_hi + 1) == FA_ERR_INVALID_ARGUMENT,
              "THREADS = %lld (hi + 1) accepted", (long long)(threads_hi + 1));
    CHECK(fa_context_get(ctx, FA_PARAM_THREADS, &v) == FA_OK && v == 0, "THREADS changed to %lld", (long long)v);

    h_case("fa_context_get misuse");
    CHECK(fa_context_get(ctx, FA_PARAM_ALGO, NULL) == FA_ERR_NULL_POINTER, "value NULL");
    CHECK(fa_context_get(ctx, (fa_param)999, &v) == FA_ERR_INVALID_ARGUMENT, "param 999");
    CHECK(fa_context_get(NULL, FA_PARAM_ALGO, &v) == FA_ERR_NULL_CONTEXT, "context NULL");
    CHECK(fa_context_set(NULL, FA_PARAM_ALGO, 1) == FA_ERR_NULL_CONTEXT, "set on NULL context");
    fa_context_free(ctx);

    h_case("fa_context_create(NULL), fa_context_free(NULL)");
    CHECK(fa_context_create(NULL) == FA_ERR_NULL_POINTER, "fa_context_create(NULL)");
    fa_context_free(NULL);
    CHECK(1, "fa_context_free(NULL) returned");
}

static void test_readouts(void) {
    int64_t v = -1;
    fa_context *ctx = NULL;
    h_case("LAST_ALGO and LAST_EXTRA_BYTES");
    if (!CHECK(fa_context_create(&ctx) == FA_OK, "create")) return;
    fa_status st = fa_forward(ctx, &g_p.args); /* AUTO, default threads */
    CHECK(st == FA_OK, "AUTO call: status %d: %s", (int)st, fa_context_error(ctx));
    CHECK(fa_context_get(ctx, FA_PARAM_LAST_ALGO, &v) == FA_OK && v == FA_ALGO_FLASH,
          "LAST_ALGO after AUTO is %lld, want FLASH", (long long)v);
    const char *err = fa_context_error(ctx);
    CHECK(err && err[0] == '\0', "fa_context_error after success is \"%s\", want \"\"", err ? err : "(null)");

    st = h_run(ctx, FA_ALGO_STANDARD, 1, &g_p.args);
    CHECK(st == FA_OK, "STANDARD call: status %d", (int)st);
    CHECK(fa_context_get(ctx, FA_PARAM_LAST_ALGO, &v) == FA_OK && v == FA_ALGO_STANDARD,
          "LAST_ALGO after STANDARD is %lld", (long long)v);
    CHECK(fa_context_get(ctx, FA_PARAM_LAST_EXTRA_BYTES, &v) == FA_OK && v > 0,
          "LAST_EXTRA_BYTES after STANDARD is %lld, want > 0", (long long)v);

    /* a failing call changes neither read-out (they describe the last successful call) */
    fa_forward_args bad = g_p.args;
    bad.scale = NAN;
    CHECK(h_run(ctx, FA_ALGO_FLASH, 1, &bad) == FA_ERR_INVALID_ARGUMENT, "NaN scale accepted");
    CHECK(fa_context_get(ctx, FA_PARAM_LAST_ALGO, &v) == FA_OK && v == FA_ALGO_STANDARD,
          "LAST_ALGO after a failed FLASH call is %lld, want STANDARD", (long long)v);

    /* and the context still works, and clears its error text */
    st = h_run(ctx, FA_ALGO_REFERENCE, 1, &g_p.args);
    CHECK(st == FA_OK, "REFERENCE call after a failure: status %d", (int)st);
    CHECK(fa_context_get(ctx, FA_PARAM_LAST_ALGO, &v) == FA_OK && v == FA_ALGO_REFERENCE,
          "LAST_ALGO after REFERENCE is %lld", (long long)v);
    err = fa_context_error(ctx);
    CHECK(err && err[0] == '\0', "fa_context_error not cleared by a success: \"%s\"", err ? err : "(null)");
    fa_context_free(ctx);
}

static void test_strings_versions(void) {
    h_case("fa_status_string");
    const char *seen[FA_ERR_ISA_UNAVAILABLE + 1];
    for (int s = FA_OK; s <= FA_ERR_ISA_UNAVAILABLE; s++) {
        seen[s] = fa_status_string((fa_status)s);
        CHECK(seen[s] && seen[s][0], "status %d: NULL or empty string", s);
        for (int t = 0; t < s && seen[s]; t++)
            CHECK(seen[t] && strcmp(seen[s], seen[t]) != 0, "statuses %d and %d share \"%s\"", t, s, seen[s]);
    }
    CHECK(fa_status_string((fa_status)999) != NULL, "unknown status gives NULL");
    CHECK(fa_status_string((fa_status)-1) != NULL, "status -1 gives NULL");

    h_case("versions");
    CHECK(fa_version_number() == FA_VERSION_NUMBER, "fa_version_number %u, header %d", fa_version_number(),
          FA_VERSION_NUMBER);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", FA_VERSION_MAJOR, FA_VERSION_MINOR, FA_VERSION_PATCH);
    const char *vs = fa_version_string();
    CHECK(vs && strcmp(vs, want) == 0, "fa_version_string \"%s\", want \"%s\"", vs ? vs : "(null)", want);

    h_case("dtype and algo names");
    CHECK(fa_dtype_size(FA_DTYPE_F32) == 4 && fa_dtype_size(FA_DTYPE_F16) == 2 &&
              fa_dtype_size(FA_DTYPE_BF16) == 2 && fa_dtype_size(FA_DTYPE_BOOL) == 1,
          "fa_dtype_size wrong");
    CHECK(fa_dtype_size((fa_dtype)42) == 0, "fa_dtype_size of an unknown dtype is not 0");
    for (int t = 0; t <= 3; t++) CHECK(fa_dtype_name((fa_dtype)t) && fa_dtype_name((fa_dtype)t)[0], "dtype %d name", t);
    CHECK(fa_dtype_name((fa_dtype)42) != NULL, "unknown dtype name NULL");
    for (int a = 0; a <= 3; a++) {
        const char *n = fa_algo_name((fa_algo)a);
        CHECK(n && n[0], "algo %d name NULL or empty", a);
        for (int b = 0; b < a; b++)
            CHECK(n && fa_algo_name((fa_algo)b) && strcmp(n, fa_algo_name((fa_algo)b)) != 0,
                  "algos %d and %d share a name", a, b);
    }
    CHECK(fa_algo_name((fa_algo)42) != NULL, "unknown algo name NULL");
}

static int tensor_eq(const fa_tensor *a, const fa_tensor *b) {
    if (a->data != b->data || a->dtype != b->dtype) return 0;
    for (int i = 0; i < 4; i++)
        if (a->shape[i] != b->shape[i] || a->stride[i] != b->stride[i]) return 0;
    return 1;
}

static void test_args_init(void) {
    h_case("fa_forward_args_init == FA_FORWARD_ARGS_INIT");
    const fa_forward_args m = FA_FORWARD_ARGS_INIT;
    fa_forward_args f;
    memset(&f, 0xff, sizeof f); /* every field must be written */
    fa_forward_args_init(&f);
    CHECK(f.struct_size == m.struct_size && m.struct_size == sizeof(fa_forward_args), "struct_size");
    CHECK(tensor_eq(&f.q, &m.q) && tensor_eq(&f.k, &m.k) && tensor_eq(&f.v, &m.v) && tensor_eq(&f.o, &m.o) &&
              tensor_eq(&f.lse, &m.lse) && tensor_eq(&f.bias, &m.bias) && tensor_eq(&f.mask, &m.mask),
          "tensor fields differ");
    CHECK(memcmp(&f.scale, &m.scale, sizeof f.scale) == 0 && memcmp(&f.softcap, &m.softcap, sizeof f.softcap) == 0,
          "scale/softcap differ");
    CHECK(f.causal == m.causal && f.causal == FA_CAUSAL_NONE, "causal");
    CHECK(f.window_left == m.window_left && f.window_right == m.window_right &&
              m.window_left == FA_WINDOW_UNBOUNDED && m.window_right == FA_WINDOW_UNBOUNDED,
          "windows");
    CHECK(f.alibi_slopes == m.alibi_slopes && f.alibi_stride_b == m.alibi_stride_b && m.alibi_slopes == NULL,
          "alibi fields");
    CHECK(m.q.data == NULL && m.bias.data == NULL && m.mask.data == NULL && m.scale == 0.0f, "macro defaults");
}

/*
 * A caller compiled before bias and mask existed passes struct_size = offsetof(bias):
 * the library must not read them. Whatever lies there (a bias of the wrong shape and an
 * all-false mask) must change nothing: o equals the call without them, bit for bit.
 */
static void test_old_struct(void) {
    const h_dims *d = &g_p.dims;
    for (size_t al = 0; al < sizeof ALGOS / sizeof ALGOS[0]; al++) {
        h_case("old struct_size = offsetof(bias), algo=%s", h_algo_str(ALGOS[al]));
        fa_tensor o_new = h_alloc(FA_DTYPE_F32, d->B, d->Sq, d->Hq, d->Dv);
        fa_forward_args a = g_p.args;
        a.o = o_new;
        fa_status st = h_run(g_ctx, ALGOS[al], 1, &a);
        CHECK(st == FA_OK, "plain call: status %d", (int)st);

        fa_tensor bias = h_alloc(FA_DTYPE_F32, 3, 7, 1, 1);      /* broadcasts nowhere */
        fa_tensor mask = h_alloc(FA_DTYPE_BOOL, 1, 1, 1, 1);     /* all false */
        fa_forward_args old = g_p.args;
        old.struct_size = offsetof(fa_forward_args, bias);
        old.bias = bias;
        old.mask = mask;
        poison();
        st = h_run(g_ctx, ALGOS[al], 1, &old);
        CHECK(st == FA_OK, "old-size call: status %d (%s): %s", (int)st, fa_status_string(st),
              fa_context_error(g_ctx));
        CHECK(st != FA_OK || memcmp(old.o.data, o_new.data, g_o_bytes) == 0,
              "old-size call read bias/mask beyond struct_size: o differs");
        free(bias.data), free(mask.data), free(o_new.data);
    }
}

/*
 * A caller compiled against a newer header passes a longer struct whose extra fields
 * are zero ("off"): the library must run it exactly like the current struct.
 */
static void test_newer_struct(void) {
    struct newer {
        fa_forward_args args;
        int64_t future_fields[4];
    } n;
    memset(&n, 0, sizeof n);
    n.args = g_p.args;
    n.args.struct_size = sizeof n;
    const h_dims *d = &g_p.dims;
    for (size_t al = 0; al < sizeof ALGOS / sizeof ALGOS[0]; al++) {
        h_case("newer struct_size = sizeof(fa_forward_args) + 32, zero tail, algo=%s", h_algo_str(ALGOS[al]));
        fa_tensor o_cur = h_alloc(FA_DTYPE_F32, d->B, d->Sq, d->Hq, d->Dv);
        fa_forward_args a = g_p.args;
        a.o = o_cur;
        fa_status st = h_run(g_ctx, ALGOS[al], 1, &a);
        CHECK(st == FA_OK, "current-size call: status %d", (int)st);
        poison();
        st = h_run(g_ctx, ALGOS[al], 1, &n.args);
        CHECK(st == FA_OK, "newer-size call: status %d (%s): %s", (int)st, fa_status_string(st),
              fa_context_error(g_ctx));
        CHECK(st != FA_OK || memcmp(n.args.o.data, o_cur.data, g_o_bytes) == 0, "newer-size call: o differs");
        free(o_cur.data);
    }
}

int main(void) {
    h_rng_seed(&g_rng, h_env_u64("FA_TEST_SEED", 99));
    h_case("setup");
    const fa_status created = h_context_create(&g_ctx);
    if (!CHECK(created == FA_OK && g_ctx, "fa_context_create: status %d (%s)", (int)created,
               fa_status_string(created)))
        return h_summary();

    const h_dims d = {2, 5, 7, 4, 2, 8, 6};
    h_problem_alloc(&g_p, d, FA_DTYPE_F32, FA_DTYPE_F32);
    h_fill_normal(&g_p.args.q, &g_rng, 1.0);
    h_fill_normal(&g_p.args.k, &g_rng, 1.0);
    h_fill_normal(&g_p.args.v, &g_rng, 1.0);
    g_o_bytes = (size_t)h_numel(&g_p.args.o) * 4;
    g_lse_bytes = (size_t)h_numel(&g_p.args.lse) * 4;

    /* the base call is valid on every algorithm, so each failure below is the misuse's */
    for (size_t al = 0; al < sizeof ALGOS / sizeof ALGOS[0]; al++) {
        h_case("valid base call, algo=%s", h_algo_str(ALGOS[al]));
        fa_status st = h_run(g_ctx, ALGOS[al], 2, &g_p.args);
        CHECK(st == FA_OK, "status %d (%s): %s", (int)st, fa_status_string(st), fa_context_error(g_ctx));
    }

    test_null();
    test_struct_size();
    test_dims();
    test_shape_mismatch();
    test_head_ratio();
    test_dtypes();
    test_overflow();
    test_broadcast();
    test_invalid_scalars();
    test_context_params();
    test_readouts();
    test_strings_versions();
    test_args_init();
    test_old_struct();
    test_newer_struct();

    h_problem_free(&g_p);
    fa_context_free(g_ctx);
    return h_summary();
}
