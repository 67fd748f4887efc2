/*
 * test_regress.c: one named check per defect of issue 8, each on the exact input the
 * issue describes, and the zero-length shapes of docs/semantics.md (the header's rules).
 *
 *   regress_1_flash_workspace_wrap   (1, 1, 1, D) zero-stride q, k, v, o, D from 1.5*2^56
 *                                     to INT64_MAX: the flash workspace size used to wrap
 *   regress_2_element_count          B = Sq = Sk = H = D = 2^16 zero strides: 2^64 logical
 *                                     elements; used to be accepted and never return
 *   regress_3_standard_tasks         standard with B * Hq = 2^64 and 3037000500^2
 *   regress_4_window_int64max        windows near INT64_MAX are unbounded, not empty
 *   regress_5_varlen_empty_trailing  an empty trailing sequence with a huge stride on the
 *                                     size-1 seq axis (UB only: the ASan+UBSan build sees it)
 *   regress_6_extent_span_max        span exactly INT64_MAX: (2,1,1,1), stride INT64_MAX
 *   regress_7_merge_alignment        n = 2, Dv = 1 and n = 4, Dv = 55 (UBSan's alignment
 *                                     check sees the misaligned pointer array)
 *   zero_dense / zero_varlen / zero_cache / zero_merge: the zero-length rules.
 *
 * Every failing call must leave o, lse (and cache bytes) as they were. A call that
 * hangs is stopped by an alarm with the name of the check, rather than by ctest.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

enum { SENTINEL = 0xa5 };
static const fa_algo ALGOS[] = {FA_ALGO_FLASH, FA_ALGO_STANDARD, FA_ALGO_REFERENCE};
static fa_context *g_ctx;
static const char *volatile g_check = "start";

/* ------------------------------------------------------------ helpers */

static void on_alarm(int sig) {
    (void)sig;
    const char *pre = "test_regress: a call did not return within the alarm: ";
    ssize_t w = write(2, pre, strlen(pre));
    w = write(2, g_check, strlen(g_check));
    w = write(2, "\n", 1);
    (void)w;
    _exit(1);
}

/* Starts a named check with a fresh alarm (sanitizers are slow: generous). */
static void begin(const char *name) {
    g_check = name;
    h_case("%s", name);
    alarm(120);
}

static int all_bytes(const void *p, size_t n, unsigned char value) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != value) return 0;
    return 1;
}

/* A view of `elems` elements of buf with the given shape and all strides 0. */
static fa_tensor broadcast(void *buf, fa_dtype dt, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    fa_tensor t;
    memset(&t, 0, sizeof t);
    t.data = buf;
    t.dtype = dt;
    t.shape[0] = d0, t.shape[1] = d1, t.shape[2] = d2, t.shape[3] = d3;
    return t;
}

static fa_status run(fa_algo algo, int64_t threads, const fa_forward_args *a) {
    return h_run(g_ctx, algo, threads, a);
}

static int status_in(fa_status st, fa_status a, fa_status b) { return st == a || st == b; }

/* Max |got - want| over a dense tensor pair of equal shape; NaN counts as infinite. */
static double max_diff(const fa_tensor *got, const fa_tensor *want) {
    double m = 0.0;
    for (int64_t a = 0; a < got->shape[0]; a++)
        for (int64_t b = 0; b < got->shape[1]; b++)
            for (int64_t c = 0; c < got->shape[2]; c++)
                for (int64_t d = 0; d < got->shape[3]; d++) {
                    const double x = h_get(got, a, b, c, d), y = h_get(want, a, b, c, d);
                    if (x == y) continue; /* also -inf == -inf */
                    double e = fabs(x - y);
                    if (isnan(e)) e = INFINITY;
                    if (e > m) m = e;
                }
    return m;
}

static double max_abs_t(const fa_tensor *t) {
    double m = 0.0;
    for (int64_t e = 0; e < h_numel(t); e++) m = fmax(m, fabs(h_get(t, 0, 0, 0, e)));
    return m;
}

/* A small random contiguous problem. */
static void make_problem(h_problem *p, h_rng *r, h_dims d) {
    h_problem_alloc(p, d, FA_DTYPE_F32, FA_DTYPE_F32);
    h_fill_normal(&p->args.q, r, 1.0);
    h_fill_normal(&p->args.k, r, 1.0);
    h_fill_normal(&p->args.v, r, 1.0);
}

/* f32 flash/standard against the f32 reference on the same small inputs (D <= 16,
 * Sk <= 16): a few ulps of summation noise, far below the O(1) error of a wrong band. */
#define SMALL_TOL 2e-5

/* --------------------------------------------------------- defect 1 */

static void regress_1_flash_workspace_wrap(void) {
    begin("regress_1_flash_workspace_wrap");
    const int64_t Ds[] = {(int64_t)3 << 55, (int64_t)1 << 57, (int64_t)1 << 58, (int64_t)1 << 59,
                          (int64_t)1 << 60, (int64_t)1 << 61, (int64_t)1 << 62, INT64_MAX - 1, INT64_MAX};
    const fa_algo algos[] = {FA_ALGO_FLASH, FA_ALGO_AUTO, FA_ALGO_STANDARD};
    float buf[4];
    for (size_t i = 0; i < sizeof Ds / sizeof Ds[0]; i++)
        for (size_t al = 0; al < sizeof algos / sizeof algos[0]; al++)
            for (int64_t threads = 1; threads <= 2; threads++) {
                const int64_t D = Ds[i];
                h_case("regress_1 D=%lld algo=%s threads=%lld", (long long)D, h_algo_str(algos[al]),
                       (long long)threads);
                memset(buf, SENTINEL, sizeof buf);
                float o[2];
                memset(o, SENTINEL, sizeof o);
                fa_forward_args a = FA_FORWARD_ARGS_INIT;
                a.q = broadcast(buf, FA_DTYPE_F32, 1, 1, 1, D);
                a.k = broadcast(buf + 1, FA_DTYPE_F32, 1, 1, 1, D);
                a.v = broadcast(buf + 2, FA_DTYPE_F32, 1, 1, 1, D);
                a.o = broadcast(o, FA_DTYPE_F32, 1, 1, 1, D);
                const fa_status st = run(algos[al], threads, &a);
                /* D + Dv = 2D overflows from 2^62 on: the work rule says OVERFLOW; below,
                 * a workspace of ~100 D bytes cannot exist: OVERFLOW or OUT_OF_MEMORY */
                if (D >= ((int64_t)1 << 62))
                    CHECK(st == FA_ERR_OVERFLOW, "D=%lld: status %s (%s), expected OVERFLOW", (long long)D,
                          fa_status_string(st), fa_context_error(g_ctx));
                else
                    CHECK(status_in(st, FA_ERR_OVERFLOW, FA_ERR_OUT_OF_MEMORY),
                          "D=%lld: status %s (%s), expected OVERFLOW or OUT_OF_MEMORY", (long long)D,
                          fa_status_string(st), fa_context_error(g_ctx));
                CHECK(all_bytes(o, sizeof o, SENTINEL), "D=%lld: a failed call wrote o", (long long)D);
            }
}

/* --------------------------------------------------------- defect 2 */

static void regress_2_element_count(void) {
    begin("regress_2_element_count");
    const int64_t N = (int64_t)1 << 16;
    float buf[4], o[2], lse[2];
    memset(buf, 0, sizeof buf);
    /* {B, Sq, Sk, Hq, D}: the 2^16 each; then work overflowing while every tensor fits */
    const int64_t shapes[][5] = {{N, N, N, N, N}, {1024, (int64_t)1 << 20, (int64_t)1 << 20, 1024, 4},
                                 {1, (int64_t)1 << 32, (int64_t)1 << 32, 1, 1 << 30}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t al = 0; al < sizeof ALGOS / sizeof ALGOS[0]; al++)
            for (int with_lse = 0; with_lse < 2; with_lse++) {
                const int64_t *d = shapes[s];
                h_case("regress_2 B=%lld Sq=%lld Sk=%lld H=%lld D=%lld algo=%s lse=%d", (long long)d[0],
                       (long long)d[1], (long long)d[2], (long long)d[3], (long long)d[4],
                       h_algo_str(ALGOS[al]), with_lse);
                memset(o, SENTINEL, sizeof o);
                memset(lse, SENTINEL, sizeof lse);
                fa_forward_args a = FA_FORWARD_ARGS_INIT;
                a.q = broadcast(buf, FA_DTYPE_F32, d[0], d[1], d[3], d[4]);
                a.k = broadcast(buf + 1, FA_DTYPE_F32, d[0], d[2], d[3], d[4]);
                a.v = broadcast(buf + 2, FA_DTYPE_F32, d[0], d[2], d[3], d[4]);
                a.o = broadcast(o, FA_DTYPE_F32, d[0], d[1], d[3], d[4]);
                if (with_lse) a.lse = broadcast(lse, FA_DTYPE_F32, d[0], d[3], d[1], 1);
                const fa_status st = run(ALGOS[al], 1, &a);
                CHECK(st == FA_ERR_OVERFLOW, "status %s (%s), expected OVERFLOW", fa_status_string(st),
                      fa_context_error(g_ctx));
                CHECK(all_bytes(o, sizeof o, SENTINEL) && all_bytes(lse, sizeof lse, SENTINEL),
                      "a failed call wrote o or lse");
            }
}

/* --------------------------------------------------------- defect 3 */

static void regress_3_standard_tasks(void) {
    begin("regress_3_standard_tasks");
    const int64_t BH[] = {(int64_t)1 << 32, 3037000500LL, (int64_t)1 << 62};
    float buf[4], o[2];
    memset(buf, 0, sizeof buf);
    for (size_t i = 0; i < sizeof BH / sizeof BH[0]; i++)
        for (size_t al = 0; al < sizeof ALGOS / sizeof ALGOS[0]; al++)
            for (int64_t threads = 1; threads <= 2; threads++) {
                const int64_t n = BH[i];
                h_case("regress_3 B=Hq=%lld algo=%s threads=%lld", (long long)n, h_algo_str(ALGOS[al]),
                       (long long)threads);
                memset(o, SENTINEL, sizeof o);
                fa_forward_args a = FA_FORWARD_ARGS_INIT;
                a.q = broadcast(buf, FA_DTYPE_F32, n, 1, n, 1);
                a.k = broadcast(buf + 1, FA_DTYPE_F32, n, 1, n, 1);
                a.v = broadcast(buf + 2, FA_DTYPE_F32, n, 1, n, 1);
                a.o = broadcast(o, FA_DTYPE_F32, n, 1, n, 1);
                const fa_status st = run(ALGOS[al], threads, &a);
                CHECK(st == FA_ERR_OVERFLOW, "status %s (%s), expected OVERFLOW", fa_status_string(st),
                      fa_context_error(g_ctx));
                CHECK(all_bytes(o, sizeof o, SENTINEL), "a failed call wrote o");
            }
}

/* --------------------------------------------------------- defect 4 */

/* A window side this wide covers every position difference: the same as -1. */
static int64_t unbounded_side(int64_t w) { return w >= ((int64_t)1 << 61) ? -1 : w; }

static void regress_4_window_int64max(void) {
    begin("regress_4_window_int64max");
    const int64_t M = INT64_MAX;
    const int64_t windows[][2] = {{-1, M},     {M, -1},         {M, M},
                                  {M, 0},      {0, M},          {M - 1, M - 1},
                                  {(int64_t)1 << 61, (int64_t)1 << 61}, {(int64_t)1 << 62, 2}, {3, (int64_t)1 << 62}};
    const int64_t sizes[][2] = {{5, 7}, {7, 5}, {1, 9}, {9, 1}, {6, 6}};
    const fa_causal causals[] = {FA_CAUSAL_NONE, FA_CAUSAL_BOTTOM_RIGHT, FA_CAUSAL_TOP_LEFT};
    h_rng r;
    h_rng_seed(&r, h_env_u64("FA_TEST_SEED", 8004));
    for (size_t sz = 0; sz < sizeof sizes / sizeof sizes[0]; sz++)
        for (int extras = 0; extras < 2; extras++) {
            h_dims d = {2, sizes[sz][0], sizes[sz][1], 2, 1, 16, 8};
            h_problem p;
            make_problem(&p, &r, d);
            float slopes[2] = {0.25f, 0.5f};
            if (extras) { /* the element-wise path as well as the band-only one */
                p.args.softcap = 3.0f;
                p.args.alibi_slopes = slopes;
            }
            fa_tensor o_ref = h_alloc(FA_DTYPE_F32, d.B, d.Sq, d.Hq, d.Dv);
            fa_tensor lse_ref = h_alloc(FA_DTYPE_F32, d.B, d.Hq, d.Sq, 1);
            for (size_t c = 0; c < sizeof causals / sizeof causals[0]; c++)
                for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++) {
                    /* the expected result: the reference with each huge side made -1 */
                    fa_forward_args ra = p.args;
                    ra.o = o_ref, ra.lse = lse_ref;
                    ra.causal = causals[c];
                    ra.window_left = unbounded_side(windows[w][0]);
                    ra.window_right = unbounded_side(windows[w][1]);
                    fa_status st = run(FA_ALGO_REFERENCE, 1, &ra);
                    if (!CHECK(st == FA_OK, "reference (unbounded) failed: %s", fa_context_error(g_ctx))) continue;
                    for (size_t al = 0; al < sizeof ALGOS / sizeof ALGOS[0]; al++) {
                        h_case("regress_4 Sq=%lld Sk=%lld causal=%d window=(%lld, %lld) extras=%d algo=%s",
                               (long long)d.Sq, (long long)d.Sk, (int)causals[c], (long long)windows[w][0],
                               (long long)windows[w][1], extras, h_algo_str(ALGOS[al]));
                        fa_forward_args a = p.args;
                        a.causal = causals[c];
                        a.window_left = windows[w][0];
                        a.window_right = windows[w][1];
                        h_poison_outputs(&a);
                        st = run(ALGOS[al], 2, &a);
                        if (!CHECK(st == FA_OK, "status %s (%s)", fa_status_string(st), fa_context_error(g_ctx)))
                            continue;
                        const double tol = SMALL_TOL * fmax(1.0, max_abs_t(&o_ref));
                        const double eo = max_diff(&a.o, &o_ref), el = max_diff(&a.lse, &lse_ref);
                        CHECK(eo <= tol, "o differs from the unbounded result by %.3g (tol %.3g)", eo, tol);
                        CHECK(el <= SMALL_TOL * fmax(1.0, max_abs_t(&lse_ref)),
                              "lse differs from the unbounded result by %.3g", el);
                    }
                }
            free(o_ref.data);
            free(lse_ref.data);
            h_problem_free(&p);
        }
}

/* --------------------------------------------------------- defect 5 */

/* A (d0, d1, d2, d3) contiguous tensor whose seq axis (axis `ax`) has size 1 and
 * stride `huge`: legal, as the stride of a size-1 axis is never used. */
static fa_tensor huge_seq_stride(fa_dtype dt, int64_t d0, int64_t d2, int64_t d3, int ax, int64_t huge, h_rng *r) {
    fa_tensor t = ax == 1 ? h_alloc(dt, d0, 1, d2, d3) : h_alloc(dt, d0, d2, 1, d3);
    if (r) h_fill_normal(&t, r, 1.0);
    t.stride[ax] = huge;
    return t;
}

static void regress_5_varlen_empty_trailing(void) {
    begin("regress_5_varlen_empty_trailing");
    const int64_t H = 2, D = 8;
    const int64_t huges[] = {INT64_MAX / 2, INT64_MAX, INT64_MIN + 1, (int64_t)1 << 61};
    /* cu arrays over one packed row: the empty sequences come after it (cu[b] == 1 ==
     * the packed length), before it, and on both sides */
    const int32_t cus[][4] = {{0, 1, 1, 1}, {0, 0, 1, 1}, {0, 0, 0, 1}, {0}};
    const int64_t nseqs[] = {2, 3, 3, 0}; /* the last: the same tensors in a dense call */
    h_rng r;
    h_rng_seed(&r, 8005);
    for (size_t hi = 0; hi < sizeof huges / sizeof huges[0]; hi++)
        for (size_t ci = 0; ci < sizeof cus / sizeof cus[0]; ci++) {
            const int64_t huge = huges[hi];
            h_case("regress_5 stride=%lld cu=%d,%d,%d,%d", (long long)huge, cus[ci][0], cus[ci][1], cus[ci][2],
                   cus[ci][3]);
            fa_forward_args a = FA_FORWARD_ARGS_INIT;
            a.q = huge_seq_stride(FA_DTYPE_F32, 1, H, D, 1, huge, &r);
            a.k = huge_seq_stride(FA_DTYPE_F32, 1, H, D, 1, huge, &r);
            a.v = huge_seq_stride(FA_DTYPE_F32, 1, H, D, 1, huge, &r);
            a.o = huge_seq_stride(FA_DTYPE_F32, 1, H, D, 1, huge, NULL);
            a.lse = huge_seq_stride(FA_DTYPE_F32, 1, H, 1, 2, huge, NULL); /* (1, H, 1, 1), seq = axis 2 */
            if (nseqs[ci]) {
                a.cu_seqlens_q = cus[ci];
                a.cu_seqlens_k = cus[ci];
                a.num_seqs = nseqs[ci];
            }
            a.causal = FA_CAUSAL_BOTTOM_RIGHT;
            h_poison_outputs(&a);
            const fa_status st = run(FA_ALGO_FLASH, 2, &a);
            if (CHECK(st == FA_OK, "status %s (%s)", fa_status_string(st), fa_context_error(g_ctx))) {
                /* one query, one key: p = 1, o = v, lse = scale * q.k */
                double eo = 0.0, el = 0.0;
                for (int64_t h = 0; h < H; h++) {
                    double dot = 0.0;
                    for (int64_t e = 0; e < D; e++) {
                        eo = fmax(eo, fabs(h_get(&a.o, 0, 0, h, e) - h_get(&a.v, 0, 0, h, e)));
                        dot += h_get(&a.q, 0, 0, h, e) * h_get(&a.k, 0, 0, h, e);
                    }
                    el = fmax(el, fabs(h_get(&a.lse, 0, h, 0, 0) - dot / sqrt((double)D)));
                }
                CHECK(eo <= 1e-6 && el <= 1e-5, "o err %.3g, lse err %.3g", eo, el);
            }
            free(a.q.data), free(a.k.data), free(a.v.data), free(a.o.data), free(a.lse.data);
        }

    /* the same packed q with a contiguous KV cache: sequence 1 is empty on the q side */
    for (size_t hi = 0; hi < sizeof huges / sizeof huges[0]; hi++) {
        h_case("regress_5 kv cache, q stride=%lld", (long long)huges[hi]);
        const int32_t cu_q[3] = {0, 1, 1}, seqlens[2] = {3, 2};
        fa_tensor kc = h_alloc(FA_DTYPE_F32, 2, 4, H, D), vc = h_alloc(FA_DTYPE_F32, 2, 4, H, D);
        h_fill_normal(&kc, &r, 1.0);
        h_fill_normal(&vc, &r, 1.0);
        fa_kv_cache cache = FA_KV_CACHE_INIT;
        cache.k = kc, cache.v = vc, cache.seqlens = seqlens;
        fa_forward_args a = FA_FORWARD_ARGS_INIT;
        a.q = huge_seq_stride(FA_DTYPE_F32, 1, H, D, 1, huges[hi], &r);
        a.o = huge_seq_stride(FA_DTYPE_F32, 1, H, D, 1, huges[hi], NULL);
        a.lse = huge_seq_stride(FA_DTYPE_F32, 1, H, 1, 2, huges[hi], NULL);
        a.cu_seqlens_q = cu_q;
        a.num_seqs = 2;
        a.kv_cache = &cache;
        h_poison_outputs(&a);
        fa_status st = run(FA_ALGO_FLASH, 1, &a);
        if (CHECK(st == FA_OK, "status %s (%s)", fa_status_string(st), fa_context_error(g_ctx))) {
            /* sequence 0 against the reference over cache row 0's 3 keys */
            fa_forward_args ra = FA_FORWARD_ARGS_INIT;
            ra.q = a.q;
            ra.k = kc, ra.v = vc;
            ra.k.shape[0] = ra.v.shape[0] = 1;
            ra.k.shape[1] = ra.v.shape[1] = 3;
            ra.o = h_alloc(FA_DTYPE_F32, 1, 1, H, D);
            st = run(FA_ALGO_REFERENCE, 1, &ra);
            CHECK(st == FA_OK && max_diff(&a.o, &ra.o) <= SMALL_TOL, "sequence 0 differs from the reference");
            free(ra.o.data);
        }
        free(kc.data), free(vc.data), free(a.q.data), free(a.o.data), free(a.lse.data);
    }
}

/* --------------------------------------------------------- defect 6 */

static void regress_6_extent_span_max(void) {
    begin("regress_6_extent_span_max");
    const int64_t spans[] = {INT64_MAX, -INT64_MAX};
    /* B = 2, everything else 1: every tensor of the call is (2, 1, 1, 1) */
    for (size_t si = 0; si < 2; si++)
        for (int which = 0; which < 7; which++)
            for (size_t al = 0; al < sizeof ALGOS / sizeof ALGOS[0]; al++) {
                static const char *names[7] = {"q", "k", "v", "o", "lse", "bias", "mask"};
                h_case("regress_6 %s.stride[0]=%lld algo=%s", names[which], (long long)spans[si],
                       h_algo_str(ALGOS[al]));
                h_problem p;
                h_dims d = {2, 1, 1, 1, 1, 1, 1};
                h_problem_alloc(&p, d, FA_DTYPE_F32, FA_DTYPE_F32);
                fa_forward_args a = p.args;
                fa_tensor bias = h_alloc(FA_DTYPE_F32, 2, 1, 1, 1), mask = h_alloc(FA_DTYPE_BOOL, 2, 1, 1, 1);
                if (which == 5) a.bias = bias;
                if (which == 6) a.mask = mask;
                fa_tensor *ts[7] = {&a.q, &a.k, &a.v, &a.o, &a.lse, &a.bias, &a.mask};
                ts[which]->stride[0] = spans[si];
                memset(p.args.o.data, SENTINEL, 8);
                memset(p.args.lse.data, SENTINEL, 8);
                const fa_status st = run(ALGOS[al], 1, &a);
                CHECK(st == FA_ERR_OVERFLOW, "status %s (%s), expected OVERFLOW", fa_status_string(st),
                      fa_context_error(g_ctx));
                CHECK(all_bytes(p.args.o.data, 8, SENTINEL) && all_bytes(p.args.lse.data, 8, SENTINEL),
                      "a failed call wrote o or lse");
                free(bias.data), free(mask.data);
                h_problem_free(&p);
            }

    /* the same span in a KV cache tensor and in fa_merge_states' tensors */
    for (size_t si = 0; si < 2; si++) {
        h_case("regress_6 kv_cache->k.stride[0]=%lld", (long long)spans[si]);
        const int32_t seqlens[2] = {1, 1};
        fa_tensor kc = h_alloc(FA_DTYPE_F32, 2, 1, 1, 1), vc = h_alloc(FA_DTYPE_F32, 2, 1, 1, 1);
        fa_tensor q = h_alloc(FA_DTYPE_F32, 2, 1, 1, 1), o = h_alloc(FA_DTYPE_F32, 2, 1, 1, 1);
        memset(o.data, SENTINEL, 8);
        unsigned char kc_bytes[8];
        memcpy(kc_bytes, kc.data, 8);
        kc.stride[0] = spans[si];
        fa_kv_cache cache = FA_KV_CACHE_INIT;
        cache.k = kc, cache.v = vc, cache.seqlens = seqlens;
        fa_forward_args a = FA_FORWARD_ARGS_INIT;
        a.q = q, a.o = o, a.kv_cache = &cache;
        fa_status st = run(FA_ALGO_FLASH, 1, &a);
        CHECK(st == FA_ERR_OVERFLOW, "status %s (%s), expected OVERFLOW", fa_status_string(st),
              fa_context_error(g_ctx));
        CHECK(all_bytes(o.data, 8, SENTINEL) && memcmp(kc_bytes, kc.data, 8) == 0, "a failed call wrote o or the cache");
        free(kc.data), free(vc.data), free(q.data), free(o.data);

        for (int which = 0; which < 4; which++) {
            h_case("regress_6 merge tensor %d stride[0]=%lld", which, (long long)spans[si]);
            fa_tensor parts[2] = {h_alloc(FA_DTYPE_F32, 2, 1, 1, 1), h_alloc(FA_DTYPE_F32, 2, 1, 1, 1)};
            fa_tensor lses[2] = {h_alloc(FA_DTYPE_F32, 2, 1, 1, 1), h_alloc(FA_DTYPE_F32, 2, 1, 1, 1)};
            fa_tensor mo = h_alloc(FA_DTYPE_F32, 2, 1, 1, 1), ml = h_alloc(FA_DTYPE_F32, 2, 1, 1, 1);
            memset(mo.data, SENTINEL, 8);
            memset(ml.data, SENTINEL, 8);
            fa_tensor *ts[4] = {&parts[1], &lses[0], &mo, &ml};
            void *keep = ts[which]->data;
            ts[which]->stride[0] = spans[si];
            st = fa_merge_states(g_ctx, 2, parts, lses, &mo, &ml);
            CHECK(st == FA_ERR_OVERFLOW, "status %s (%s), expected OVERFLOW", fa_status_string(st),
                  fa_context_error(g_ctx));
            CHECK(all_bytes(mo.data, 8, SENTINEL) && all_bytes(ml.data, 8, SENTINEL), "a failed merge wrote o or lse");
            (void)keep;
            free(parts[0].data), free(parts[1].data), free(lses[0].data), free(lses[1].data);
            free(mo.data), free(ml.data);
        }
    }
}

/* --------------------------------------------------------- defect 7 */

/* fa_merge_states on n random parts, checked against the formula in double. */
static void merge_check(h_rng *r, int n, int64_t B, int64_t S, int64_t H, int64_t Dv, fa_dtype odt) {
    fa_tensor *op = calloc((size_t)n, sizeof *op), *lp = calloc((size_t)n, sizeof *lp);
    for (int i = 0; i < n; i++) {
        op[i] = h_alloc(FA_DTYPE_F32, B, S, H, Dv);
        lp[i] = h_alloc(FA_DTYPE_F32, B, H, S, 1);
        h_fill_normal(&op[i], r, 1.0);
        h_fill_normal(&lp[i], r, 3.0);
    }
    if (n > 1) h_set(&lp[1], 0, 0, 0, 0, -INFINITY); /* an empty side */
    fa_tensor o = h_alloc(odt, B, S, H, Dv), lse = h_alloc(FA_DTYPE_F32, B, H, S, 1);
    const fa_status st = fa_merge_states(g_ctx, n, op, lp, &o, &lse);
    if (CHECK(st == FA_OK, "merge n=%d Dv=%lld: status %s (%s)", n, (long long)Dv, fa_status_string(st),
              fa_context_error(g_ctx))) {
        double eo = 0.0, el = 0.0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t h = 0; h < H; h++) {
                    double m = -INFINITY, sum = 0.0;
                    for (int i = 0; i < n; i++) m = fmax(m, h_get(&lp[i], b, h, s, 0));
                    for (int i = 0; i < n; i++) sum += exp(h_get(&lp[i], b, h, s, 0) - m);
                    const double total = m + log(sum);
                    el = fmax(el, fabs(h_get(&lse, b, h, s, 0) - total) / fmax(1.0, fabs(total)));
                    for (int64_t e = 0; e < Dv; e++) {
                        double acc = 0.0;
                        for (int i = 0; i < n; i++) {
                            const double li = h_get(&lp[i], b, h, s, 0);
                            if (li != -INFINITY) acc += exp(li - total) * h_get(&op[i], b, s, h, e);
                        }
                        eo = fmax(eo, fabs(h_get(&o, b, s, h, e) - acc));
                    }
                }
        const double otol = odt == FA_DTYPE_F32 ? 1e-5 : 4 * h_eps(odt) * 4;
        CHECK(eo <= otol && el <= 1e-6, "merge n=%d Dv=%lld: o err %.3g, lse err %.3g", n, (long long)Dv, eo, el);
    }
    for (int i = 0; i < n; i++) free(op[i].data), free(lp[i].data);
    free(op), free(lp), free(o.data), free(lse.data);
}

static void regress_7_merge_alignment(void) {
    begin("regress_7_merge_alignment");
    h_rng r;
    h_rng_seed(&r, 8007);
    /* (n + 1) * Dv + 2n odd: the pointer array used to start 4 bytes off 8 */
    const int cases[][2] = {{2, 1}, {4, 55}, {1, 1}, {3, 3}, {6, 1}, {5, 17}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        h_case("regress_7 n=%d Dv=%d", cases[c][0], cases[c][1]);
        merge_check(&r, cases[c][0], 2, 3, 2, cases[c][1], FA_DTYPE_F32);
        merge_check(&r, cases[c][0], 1, 2, 1, cases[c][1], FA_DTYPE_BF16);
    }
}

/* --------------------------------------------------------- zero-length shapes */

/* Expects a no-op success: status OK and o, lse bytes unchanged. */
static void expect_noop(const char *what, const fa_forward_args *a, size_t o_bytes, size_t lse_bytes) {
    for (size_t al = 0; al < sizeof ALGOS / sizeof ALGOS[0]; al++) {
        if ((a->cu_seqlens_q || a->kv_cache) && ALGOS[al] != FA_ALGO_FLASH) continue;
        h_case("%s algo=%s", what, h_algo_str(ALGOS[al]));
        memset(a->o.data, SENTINEL, o_bytes);
        if (a->lse.data) memset(a->lse.data, SENTINEL, lse_bytes);
        const fa_status st = run(ALGOS[al], 2, a);
        CHECK(st == FA_OK, "%s: status %s (%s), expected OK (a no-op)", what, fa_status_string(st),
              fa_context_error(g_ctx));
        CHECK(all_bytes(a->o.data, o_bytes, SENTINEL) && (!a->lse.data || all_bytes(a->lse.data, lse_bytes, SENTINEL)),
              "%s: a no-op wrote o or lse", what);
    }
}

/* Expects `want` from every algorithm and o, lse untouched. */
static void expect_fail(const char *what, const fa_forward_args *a, size_t o_bytes, size_t lse_bytes, fa_status want) {
    for (size_t al = 0; al < sizeof ALGOS / sizeof ALGOS[0]; al++) {
        h_case("%s algo=%s", what, h_algo_str(ALGOS[al]));
        memset(a->o.data, SENTINEL, o_bytes);
        if (a->lse.data) memset(a->lse.data, SENTINEL, lse_bytes);
        const fa_status st = run(ALGOS[al], 1, a);
        CHECK(st == want, "%s: status %s (%s), expected %s", what, fa_status_string(st), fa_context_error(g_ctx),
              fa_status_string(want));
        CHECK(want == FA_OK || fa_context_error(g_ctx)[0] != '\0', "%s: no error message", what);
        CHECK(all_bytes(a->o.data, o_bytes, SENTINEL) && (!a->lse.data || all_bytes(a->lse.data, lse_bytes, SENTINEL)),
              "%s: a failed call wrote o or lse", what);
    }
}

/* Every element of t satisfies pred (any strides). */
static int all_elems(const fa_tensor *t, int (*pred)(double)) {
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t d = 0; d < t->shape[3]; d++)
                    if (!pred(h_get(t, a, b, c, d))) return 0;
    return 1;
}
static int is_zero(double x) { return x == 0.0; }
static int is_minus_inf(double x) { return isinf(x) && x < 0; }

/* Every o element 0 and every lse -inf (rows with no key). */
static int empty_rows(const fa_tensor *o, const fa_tensor *lse) {
    return all_elems(o, is_zero) && (!lse || !lse->data || all_elems(lse, is_minus_inf));
}

static void zero_dense(void) {
    begin("zero_dense");
    h_rng r;
    h_rng_seed(&r, 8010);
    char what[160];
    /* B = 0, Sq = 0, Hq = 0 (Hk = 1): successful no-ops, also with every option on */
    const h_dims noops[] = {{0, 3, 4, 2, 1, 8, 8}, {2, 0, 4, 2, 1, 8, 8}, {2, 3, 4, 0, 1, 8, 8},
                            {0, 0, 0, 2, 2, 8, 8}, {0, 3, 0, 2, 1, 8, 0}};
    for (size_t i = 0; i < sizeof noops / sizeof noops[0]; i++)
        for (int opts = 0; opts < 2; opts++) {
            const h_dims d = noops[i];
            h_problem p;
            make_problem(&p, &r, d);
            fa_tensor bias = h_alloc(FA_DTYPE_F32, d.B, d.Hq, d.Sq, d.Sk), mask = h_alloc(FA_DTYPE_BOOL, 1, 1, d.Sq, d.Sk);
            float slopes[4] = {0.5f, 0.5f, 0.5f, 0.5f};
            if (opts) {
                p.args.bias = bias, p.args.mask = mask, p.args.alibi_slopes = slopes;
                p.args.causal = FA_CAUSAL_BOTTOM_RIGHT, p.args.window_left = 2, p.args.softcap = 5.0f;
            }
            snprintf(what, sizeof what, "zero_dense no-op %s opts=%d", h_dims_str(&d), opts);
            expect_noop(what, &p.args, h_dtype_bytes(FA_DTYPE_F32), 4);
            free(bias.data), free(mask.data);
            h_problem_free(&p);
        }

    /* B = 0 with large other dims over zero strides: 0 elements, no work */
    {
        float buf[4], o[2], lse[2];
        memset(buf, 0, sizeof buf);
        const int64_t N = (int64_t)1 << 12;
        fa_forward_args a = FA_FORWARD_ARGS_INIT;
        a.q = broadcast(buf, FA_DTYPE_F32, 0, N, N, N);
        a.k = broadcast(buf + 1, FA_DTYPE_F32, 0, N, N, N);
        a.v = broadcast(buf + 2, FA_DTYPE_F32, 0, N, N, N);
        a.o = broadcast(o, FA_DTYPE_F32, 0, N, N, N);
        a.lse = broadcast(lse, FA_DTYPE_F32, 0, N, N, 1);
        expect_noop("zero_dense B=0 with 2^12 other dims, zero strides", &a, sizeof o, sizeof lse);
    }

    /* Sk = 0: every row o = 0, lse = -inf; with masks, bias, ALiBi and softcap too */
    const h_dims empties[] = {{2, 3, 0, 2, 1, 8, 8}, {1, 1, 0, 4, 2, 16, 5}, {1, 5, 0, 1, 1, 3, 1}};
    for (size_t i = 0; i < sizeof empties / sizeof empties[0]; i++)
        for (int opts = 0; opts < 3; opts++)
            for (size_t al = 0; al < sizeof ALGOS / sizeof ALGOS[0]; al++) {
                const h_dims d = empties[i];
                h_problem p;
                make_problem(&p, &r, d);
                fa_tensor bias = h_alloc(FA_DTYPE_F32, 1, d.Hq, d.Sq, 0), mask = h_alloc(FA_DTYPE_BOOL, d.B, 1, 1, 0);
                float slopes[4] = {0.5f, 0.5f, 0.5f, 0.5f};
                if (opts == 1) p.args.causal = FA_CAUSAL_TOP_LEFT, p.args.window_right = 1;
                if (opts == 2) {
                    p.args.bias = bias, p.args.mask = mask, p.args.alibi_slopes = slopes, p.args.softcap = 2.0f;
                    p.args.causal = FA_CAUSAL_BOTTOM_RIGHT;
                }
                h_case("zero_dense Sk=0 %s opts=%d algo=%s", h_dims_str(&d), opts, h_algo_str(ALGOS[al]));
                h_poison_outputs(&p.args);
                const fa_status st = run(ALGOS[al], 2, &p.args);
                if (CHECK(st == FA_OK, "status %s (%s)", fa_status_string(st), fa_context_error(g_ctx)))
                    CHECK(empty_rows(&p.args.o, &p.args.lse), "Sk = 0 must give o = 0 and lse = -inf");
                free(bias.data), free(mask.data);
                h_problem_free(&p);
            }

    /* Dv = 0: accepted; o is empty and lse is the lse of the same call with any Dv */
    for (size_t al = 0; al < sizeof ALGOS / sizeof ALGOS[0]; al++)
        for (int causal = 0; causal < 2; causal++) {
            const h_dims d = {2, 5, 7, 4, 2, 16, 0};
            h_problem p;
            make_problem(&p, &r, d);
            p.args.causal = causal ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
            fa_forward_args ra = p.args;
            ra.v = h_alloc(FA_DTYPE_F32, d.B, d.Sk, d.Hk, 1);
            ra.o = h_alloc(FA_DTYPE_F32, d.B, d.Sq, d.Hq, 1);
            ra.lse = h_alloc(FA_DTYPE_F32, d.B, d.Hq, d.Sq, 1);
            h_case("zero_dense Dv=0 causal=%d algo=%s", causal, h_algo_str(ALGOS[al]));
            fa_status st = run(FA_ALGO_REFERENCE, 1, &ra);
            CHECK(st == FA_OK, "reference with Dv = 1: %s", fa_context_error(g_ctx));
            memset(p.args.o.data, SENTINEL, 4); /* h_alloc's one spare element */
            h_fill(&p.args.lse, 12345.0);
            st = run(ALGOS[al], 2, &p.args);
            if (CHECK(st == FA_OK, "status %s (%s)", fa_status_string(st), fa_context_error(g_ctx))) {
                CHECK(all_bytes(p.args.o.data, 4, SENTINEL), "Dv = 0 wrote to o's data");
                CHECK(max_diff(&p.args.lse, &ra.lse) <= SMALL_TOL * fmax(1.0, max_abs_t(&ra.lse)),
                      "Dv = 0: lse differs from the lse of the same call with Dv = 1");
            }
            free(ra.v.data), free(ra.o.data), free(ra.lse.data);
            h_problem_free(&p);
        }

    /* refused: D = 0, Hk = 0 with Hq > 0, negative dims */
    struct {
        h_dims d;
        const char *name;
    } bad[] = {{{2, 3, 4, 2, 1, 0, 8}, "D=0"},    {{2, 3, 4, 2, 0, 8, 8}, "Hk=0 Hq=2"},
               {{2, 3, 0, 2, 1, 0, 8}, "D=0 Sk=0"}, {{-1, 3, 4, 2, 1, 8, 8}, "B=-1"},
               {{2, -3, 4, 2, 1, 8, 8}, "Sq=-3"},  {{2, 3, -1, 2, 1, 8, 8}, "Sk=-1"},
               {{2, 3, 4, 2, 1, 8, -1}, "Dv=-1"},  {{2, 3, 4, -2, 1, 8, 8}, "Hq=-2"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        h_dims d = bad[i].d, alloc = d;
        int64_t *dims[7] = {&alloc.B, &alloc.Sq, &alloc.Sk, &alloc.Hq, &alloc.Hk, &alloc.D, &alloc.Dv};
        for (int k = 0; k < 7; k++) if (*dims[k] < 0) *dims[k] = 1;
        h_problem p;
        make_problem(&p, &r, alloc);
        fa_forward_args a = p.args;
        a.q.shape[0] = a.k.shape[0] = a.v.shape[0] = a.o.shape[0] = a.lse.shape[0] = d.B;
        a.q.shape[1] = a.o.shape[1] = a.lse.shape[2] = d.Sq;
        a.k.shape[1] = a.v.shape[1] = d.Sk;
        a.q.shape[2] = a.o.shape[2] = a.lse.shape[1] = d.Hq;
        a.k.shape[2] = a.v.shape[2] = d.Hk;
        a.q.shape[3] = a.k.shape[3] = d.D;
        a.v.shape[3] = a.o.shape[3] = d.Dv;
        snprintf(what, sizeof what, "zero_dense refused %s", bad[i].name);
        const size_t o_bytes = (size_t)(alloc.B * alloc.Sq * alloc.Hq * (alloc.Dv ? alloc.Dv : 1)) * 4;
        const size_t lse_bytes = (size_t)(alloc.B * alloc.Hq * (alloc.Sq ? alloc.Sq : 1)) * 4;
        expect_fail(what, &a, o_bytes, lse_bytes, FA_ERR_INVALID_DIM);
        h_problem_free(&p);
    }
    /* Hq = Hk = 0: nothing to compute, or refused; never a division by zero */
    {
        h_problem p;
        make_problem(&p, &r, (h_dims){2, 3, 4, 0, 0, 8, 8});
        for (size_t al = 0; al < sizeof ALGOS / sizeof ALGOS[0]; al++) {
            h_case("zero_dense Hq=Hk=0 algo=%s", h_algo_str(ALGOS[al]));
            memset(p.args.o.data, SENTINEL, 4);
            const fa_status st = run(ALGOS[al], 1, &p.args);
            CHECK(status_in(st, FA_OK, FA_ERR_INVALID_DIM), "status %s (%s)", fa_status_string(st),
                  fa_context_error(g_ctx));
            CHECK(all_bytes(p.args.o.data, 4, SENTINEL), "Hq = Hk = 0 wrote o");
        }
        h_problem_free(&p);
    }
}

/* Sequence b of a packed (1, total, H, D) tensor as a dense (1, len, H, D) view. */
static fa_tensor seq_view(const fa_tensor *t, int64_t s0, int64_t len) {
    fa_tensor v = *t;
    v.data = (char *)t->data + s0 * t->stride[1] * (int64_t)h_dtype_bytes(t->dtype);
    v.shape[1] = len;
    return v;
}

static void zero_varlen(void) {
    begin("zero_varlen");
    h_rng r;
    h_rng_seed(&r, 8011);
    const int64_t Hq = 4, Hk = 2, D = 16, Dv = 8;
    /* num_seqs = 0: cu arrays of one entry; nothing is written, also over packed rows */
    for (int total = 0; total <= 3; total += 3) {
        const int32_t cu[1] = {0};
        fa_forward_args a = FA_FORWARD_ARGS_INIT;
        a.q = h_alloc(FA_DTYPE_F32, 1, total, Hq, D);
        a.k = h_alloc(FA_DTYPE_F32, 1, total, Hk, D);
        a.v = h_alloc(FA_DTYPE_F32, 1, total, Hk, Dv);
        a.o = h_alloc(FA_DTYPE_F32, 1, total, Hq, Dv);
        a.lse = h_alloc(FA_DTYPE_F32, 1, Hq, total, 1);
        a.cu_seqlens_q = a.cu_seqlens_k = cu;
        a.num_seqs = 0;
        char what[80];
        snprintf(what, sizeof what, "zero_varlen num_seqs=0 total=%d", total);
        const size_t ob = total ? (size_t)(total * Hq * Dv) * 4 : 4, lb = total ? (size_t)(total * Hq) * 4 : 4;
        expect_noop(what, &a, ob, lb);
        free(a.q.data), free(a.k.data), free(a.v.data), free(a.o.data), free(a.lse.data);
    }

    /* empty sequences anywhere, on either side; each sequence against a dense reference */
    const int32_t cq[][7] = {{0, 0, 3, 3, 8, 8, 9}, {0, 0, 0, 0, 0, 0, 0}, {0, 2, 2, 2, 5, 6, 6}};
    const int32_t ck[][7] = {{0, 4, 4, 9, 9, 12, 12}, {0, 1, 5, 5, 5, 6, 6}, {0, 0, 3, 3, 3, 3, 9}};
    for (size_t c = 0; c < sizeof cq / sizeof cq[0]; c++)
        for (int causal = 0; causal < 3; causal++) {
            const int64_t n = 6, tq = cq[c][n] + 1, tk = ck[c][n] + 1; /* one unowned row at the end */
            fa_forward_args a = FA_FORWARD_ARGS_INIT;
            a.q = h_alloc(FA_DTYPE_F32, 1, tq, Hq, D);
            a.k = h_alloc(FA_DTYPE_F32, 1, tk, Hk, D);
            a.v = h_alloc(FA_DTYPE_F32, 1, tk, Hk, Dv);
            a.o = h_alloc(FA_DTYPE_F32, 1, tq, Hq, Dv);
            a.lse = h_alloc(FA_DTYPE_F32, 1, Hq, tq, 1);
            h_fill_normal(&a.q, &r, 1.0), h_fill_normal(&a.k, &r, 1.0), h_fill_normal(&a.v, &r, 1.0);
            a.cu_seqlens_q = cq[c], a.cu_seqlens_k = ck[c], a.num_seqs = n;
            a.causal = (fa_causal)causal;
            h_case("zero_varlen ragged case %zu causal=%d", c, causal);
            h_poison_outputs(&a);
            fa_status st = run(FA_ALGO_FLASH, 2, &a);
            if (!CHECK(st == FA_OK, "status %s (%s)", fa_status_string(st), fa_context_error(g_ctx))) goto next;
            for (int64_t b = 0; b < n; b++) {
                const int64_t q0 = cq[c][b], sq = cq[c][b + 1] - q0, k0 = ck[c][b], sk = ck[c][b + 1] - k0;
                if (sq == 0) continue;
                fa_forward_args ra = a;
                ra.cu_seqlens_q = ra.cu_seqlens_k = NULL, ra.num_seqs = 0;
                ra.q = seq_view(&a.q, q0, sq);
                ra.k = seq_view(&a.k, k0, sk);
                ra.v = seq_view(&a.v, k0, sk);
                ra.o = h_alloc(FA_DTYPE_F32, 1, sq, Hq, Dv);
                ra.lse = h_alloc(FA_DTYPE_F32, 1, Hq, sq, 1);
                st = run(FA_ALGO_REFERENCE, 1, &ra);
                fa_tensor go = seq_view(&a.o, q0, sq), gl = a.lse;
                gl.data = (float *)a.lse.data + q0, gl.shape[2] = sq;
                if (CHECK(st == FA_OK, "reference for sequence %lld: %s", (long long)b, fa_context_error(g_ctx))) {
                    CHECK(max_diff(&go, &ra.o) <= SMALL_TOL, "sequence %lld (sq %lld, sk %lld): o differs",
                          (long long)b, (long long)sq, (long long)sk);
                    CHECK(max_diff(&gl, &ra.lse) <= SMALL_TOL * 10, "sequence %lld: lse differs", (long long)b);
                    if (sk == 0) CHECK(empty_rows(&go, &gl), "sequence %lld has no keys: o 0, lse -inf", (long long)b);
                }
                free(ra.o.data), free(ra.lse.data);
            }
            /* the unowned last packed row keeps its poison */
            for (int64_t h = 0; h < Hq; h++)
                CHECK(h_get(&a.o, 0, tq - 1, h, 0) == 12345.0 && h_get(&a.lse, 0, h, tq - 1, 0) == 12345.0,
                      "an unowned packed row was written");
        next:
            free(a.q.data), free(a.k.data), free(a.v.data), free(a.o.data), free(a.lse.data);
        }
}

static void zero_cache(void) {
    begin("zero_cache");
    h_rng r;
    h_rng_seed(&r, 8012);
    const int64_t Hq = 4, Hk = 2, D = 8, Smax = 8;
    fa_tensor kc = h_alloc(FA_DTYPE_F32, 2, Smax, Hk, D), vc = h_alloc(FA_DTYPE_F32, 2, Smax, Hk, D);
    h_fill_normal(&kc, &r, 1.0), h_fill_normal(&vc, &r, 1.0);
    const size_t cbytes = (size_t)(2 * Smax * Hk * D) * 4;
    unsigned char *k0 = malloc(cbytes), *v0 = malloc(cbytes);
    memcpy(k0, kc.data, cbytes), memcpy(v0, vc.data, cbytes);
    const int32_t seqlens[2] = {3, 0};

    /* B = 0: nothing read, nothing written */
    {
        fa_kv_cache c = FA_KV_CACHE_INIT;
        c.k = kc, c.v = vc, c.seqlens = seqlens;
        fa_forward_args a = FA_FORWARD_ARGS_INIT;
        a.q = h_alloc(FA_DTYPE_F32, 0, 1, Hq, D);
        a.o = h_alloc(FA_DTYPE_F32, 0, 1, Hq, D);
        a.lse = h_alloc(FA_DTYPE_F32, 0, Hq, 1, 1);
        a.k = h_alloc(FA_DTYPE_F32, 0, 1, Hk, D); /* B = 0 new rows too */
        a.v = h_alloc(FA_DTYPE_F32, 0, 1, Hk, D);
        a.kv_cache = &c;
        expect_noop("zero_cache B=0 with an append", &a, 4, 4);
        CHECK(memcmp(k0, kc.data, cbytes) == 0 && memcmp(v0, vc.data, cbytes) == 0, "B = 0 changed the cache");
        free(a.q.data), free(a.o.data), free(a.lse.data), free(a.k.data), free(a.v.data);
    }

    /* S_new = 0 (no append) and seqlens[1] = 0 (no keys); paged and contiguous */
    for (int paged = 0; paged < 2; paged++)
        for (int with_new = 0; with_new < 2; with_new++) {
            const int32_t table[4] = {1, 0, 0, 1}; /* page 1 for sequence 0; sequence 1 reads none */
            fa_kv_cache c = FA_KV_CACHE_INIT;
            c.k = kc, c.v = vc, c.seqlens = seqlens;
            if (paged) c.block_table = table, c.max_pages = 2;
            fa_forward_args a = FA_FORWARD_ARGS_INIT;
            a.q = h_alloc(FA_DTYPE_F32, 2, 1, Hq, D);
            h_fill_normal(&a.q, &r, 1.0);
            a.o = h_alloc(FA_DTYPE_F32, 2, 1, Hq, D);
            a.lse = h_alloc(FA_DTYPE_F32, 2, Hq, 1, 1);
            if (with_new) a.k = h_alloc(FA_DTYPE_F32, 2, 0, Hk, D), a.v = h_alloc(FA_DTYPE_F32, 2, 0, Hk, D);
            a.kv_cache = &c;
            h_case("zero_cache paged=%d S_new=0 given=%d", paged, with_new);
            h_poison_outputs(&a);
            fa_status st = run(FA_ALGO_FLASH, 2, &a);
            if (CHECK(st == FA_OK, "status %s (%s)", fa_status_string(st), fa_context_error(g_ctx))) {
                fa_forward_args ra = FA_FORWARD_ARGS_INIT;
                ra.q = a.q, ra.q.shape[0] = 1;
                ra.k = kc, ra.v = vc;
                const int64_t row = paged ? table[0] : 0;
                ra.k.data = (float *)kc.data + row * kc.stride[0], ra.v.data = (float *)vc.data + row * vc.stride[0];
                ra.k.shape[0] = ra.v.shape[0] = 1, ra.k.shape[1] = ra.v.shape[1] = seqlens[0];
                ra.o = h_alloc(FA_DTYPE_F32, 1, 1, Hq, D);
                st = run(FA_ALGO_REFERENCE, 1, &ra);
                fa_tensor o0 = a.o, o1 = a.o, l1 = a.lse;
                o0.shape[0] = 1;
                o1.shape[0] = 1, o1.data = (float *)a.o.data + a.o.stride[0];
                l1.shape[0] = 1, l1.data = (float *)a.lse.data + a.lse.stride[0];
                CHECK(st == FA_OK && max_diff(&o0, &ra.o) <= SMALL_TOL, "sequence 0 differs from the reference");
                CHECK(empty_rows(&o1, &l1), "a sequence with no keys must give o = 0, lse = -inf");
                free(ra.o.data);
            }
            CHECK(memcmp(k0, kc.data, cbytes) == 0 && memcmp(v0, vc.data, cbytes) == 0, "no append changed the cache");
            free(a.q.data), free(a.o.data), free(a.lse.data), free(a.k.data), free(a.v.data);
        }

    /* a paged pool with page_size 0 is refused */
    {
        const int32_t table[2] = {0, 1}, lens[2] = {0, 0};
        fa_kv_cache c = FA_KV_CACHE_INIT;
        c.k = kc, c.v = vc, c.seqlens = lens, c.block_table = table, c.max_pages = 1;
        c.k.shape[1] = c.v.shape[1] = 0;
        fa_forward_args a = FA_FORWARD_ARGS_INIT;
        a.q = h_alloc(FA_DTYPE_F32, 2, 1, Hq, D);
        a.o = h_alloc(FA_DTYPE_F32, 2, 1, Hq, D);
        a.kv_cache = &c;
        h_case("zero_cache page_size=0");
        memset(a.o.data, SENTINEL, (size_t)(2 * Hq * D) * 4);
        const fa_status st = run(FA_ALGO_FLASH, 1, &a);
        CHECK(st == FA_ERR_INVALID_DIM, "status %s (%s), expected INVALID_DIM", fa_status_string(st),
              fa_context_error(g_ctx));
        CHECK(all_bytes(a.o.data, (size_t)(2 * Hq * D) * 4, SENTINEL), "a failed call wrote o");
        free(a.q.data), free(a.o.data);
    }
    CHECK(memcmp(k0, kc.data, cbytes) == 0 && memcmp(v0, vc.data, cbytes) == 0, "the cache changed");
    free(k0), free(v0), free(kc.data), free(vc.data);
}

static void zero_merge(void) {
    begin("zero_merge");
    /* any zero dim: a no-op; n < 1 stays INVALID_ARGUMENT */
    const int64_t shapes[][4] = {{0, 2, 2, 4}, {2, 0, 2, 4}, {2, 2, 0, 4}, {2, 2, 2, 0}, {0, 0, 0, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t *d = shapes[s];
        h_case("zero_merge (%lld, %lld, %lld, %lld)", (long long)d[0], (long long)d[1], (long long)d[2],
               (long long)d[3]);
        fa_tensor op[2], lp[2];
        for (int i = 0; i < 2; i++) {
            op[i] = h_alloc(FA_DTYPE_F32, d[0], d[1], d[2], d[3]);
            lp[i] = h_alloc(FA_DTYPE_F32, d[0], d[2], d[1], 1);
            for (int64_t e = 0; e < h_numel(&lp[i]); e++) h_set(&lp[i], 0, 0, 0, e, 0.5 * (double)e - (double)i);
        }
        fa_tensor o = h_alloc(FA_DTYPE_F32, d[0], d[1], d[2], d[3]), lse = h_alloc(FA_DTYPE_F32, d[0], d[2], d[1], 1);
        const size_t ob = (size_t)(h_numel(&o) ? h_numel(&o) : 1) * 4, lb = (size_t)(h_numel(&lse) ? h_numel(&lse) : 1) * 4;
        memset(o.data, SENTINEL, ob), memset(lse.data, SENTINEL, lb);
        fa_status st = fa_merge_states(g_ctx, 2, op, lp, &o, &lse);
        CHECK(st == FA_OK, "status %s (%s), expected OK", fa_status_string(st), fa_context_error(g_ctx));
        CHECK(all_bytes(o.data, ob, SENTINEL), "a zero-size merge wrote o");
        if (d[3] == 0 && h_numel(&lse) > 0) {
            /* Dv = 0: o is empty; lse may be left alone or hold the merged lse */
            int ok = 1;
            for (int64_t e = 0; e < h_numel(&lse); e++) {
                const double want = log(exp(0.5 * (double)e) + exp(0.5 * (double)e - 1.0));
                const double got = h_get(&lse, 0, 0, 0, e);
                if (!all_bytes((float *)lse.data + e, 4, SENTINEL) && fabs(got - want) > 1e-5 * fmax(1.0, fabs(want)))
                    ok = 0;
            }
            CHECK(ok, "Dv = 0: lse is neither untouched nor the merged lse");
        } else {
            CHECK(all_bytes(lse.data, lb, SENTINEL), "a zero-size merge wrote lse");
        }
        for (int n = -1; n <= 0; n++) {
            memset(o.data, SENTINEL, ob);
            st = fa_merge_states(g_ctx, n, op, lp, &o, &lse);
            CHECK(st == FA_ERR_INVALID_ARGUMENT, "n = %d: status %s, expected INVALID_ARGUMENT", n, fa_status_string(st));
            CHECK(all_bytes(o.data, ob, SENTINEL), "n = %d wrote o", n);
        }
        for (int i = 0; i < 2; i++) free(op[i].data), free(lp[i].data);
        free(o.data), free(lse.data);
    }
}

int main(void) {
    static const struct {
        const char *name;
        void (*run)(void);
    } checks[] = {{"regress_1_flash_workspace_wrap", regress_1_flash_workspace_wrap},
                  {"regress_2_element_count", regress_2_element_count},
                  {"regress_3_standard_tasks", regress_3_standard_tasks},
                  {"regress_4_window_int64max", regress_4_window_int64max},
                  {"regress_5_varlen_empty_trailing", regress_5_varlen_empty_trailing},
                  {"regress_6_extent_span_max", regress_6_extent_span_max},
                  {"regress_7_merge_alignment", regress_7_merge_alignment},
                  {"zero_dense", zero_dense},
                  {"zero_varlen", zero_varlen},
                  {"zero_cache", zero_cache},
                  {"zero_merge", zero_merge}};
    /* FA_TEST_ONLY=<substring> runs the checks whose name contains it */
    const char *only = getenv("FA_TEST_ONLY");
    signal(SIGALRM, on_alarm);
    if (!CHECK(h_context_create(&g_ctx) == FA_OK, "fa_context_create failed")) return h_summary();
    for (size_t c = 0; c < sizeof checks / sizeof checks[0]; c++) {
        if (only && !strstr(checks[c].name, only)) continue;
        const int64_t before = h_failures();
        checks[c].run();
        printf("%-34s %s\n", checks[c].name, h_failures() == before ? "ok" : "FAILED");
        fflush(stdout);
    }
    alarm(0);
    fa_context_free(g_ctx);
    return h_summary();
}
