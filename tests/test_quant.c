/*
 * test_quant.c: FA_PARAM_QUANT_MATMUL, the forward's products on int8 codes
 * (docs/semantics.md, section 11).
 *
 *   setting   default 0, bounds, read back; fa_backward refuses a context with it on
 *             (and fa_backward_check says the same), writing nothing
 */
#include "harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static fa_context *g_ctx;

static void test_setting(void)
{
    h_case("setting");
    int64_t v = -1;
    CHECK(fa_context_get(g_ctx, FA_PARAM_QUANT_MATMUL, &v) == FA_OK && v == 0, "default %lld", (long long)v);
    CHECK(fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, 3) == FA_ERR_INVALID_ARGUMENT, "3 accepted");
    CHECK(fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, -1) == FA_ERR_INVALID_ARGUMENT, "-1 accepted");
    for (int64_t m = 0; m <= 2; m++) {
        CHECK(fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, m) == FA_OK, "set %lld", (long long)m);
        CHECK(fa_context_get(g_ctx, FA_PARAM_QUANT_MATMUL, &v) == FA_OK && v == m, "got %lld", (long long)v);
    }

    /* the backward is refused with the mode on, before it writes anything */
    h_case("backward refused");
    const h_dims d = {1, 8, 8, 2, 2, 16, 16};
    h_problem p;
    h_problem_alloc(&p, d, FA_DTYPE_F32, FA_DTYPE_F32);
    h_rng r;
    h_rng_seed(&r, 7);
    h_fill_normal(&p.args.q, &r, 1.0), h_fill_normal(&p.args.k, &r, 1.0), h_fill_normal(&p.args.v, &r, 1.0);
    fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, 0);
    CHECK(h_run(g_ctx, FA_ALGO_AUTO, 1, &p.args) == FA_OK, "forward: %s", fa_context_error(g_ctx));
    fa_tensor dout = h_alloc(FA_DTYPE_F32, 1, 8, 2, 16), dq = h_alloc(FA_DTYPE_F32, 1, 8, 2, 16);
    h_fill_normal(&dout, &r, 1.0);
    h_fill(&dq, 12345.0);
    fa_backward_args b;
    fa_backward_args_init(&b);
    b.fwd = &p.args;
    b.do_ = dout;
    b.dq = dq;
    for (int64_t m = 1; m <= 2; m++) {
        fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, m);
        const fa_status st = fa_backward(g_ctx, &b), sc = fa_backward_check(g_ctx, &b);
        CHECK(st == FA_ERR_UNSUPPORTED && sc == st, "mode %lld: backward %d, check %d", (long long)m, st, sc);
        CHECK(strstr(fa_context_error(g_ctx), "FA_PARAM_QUANT_MATMUL") != NULL, "message: %s", fa_context_error(g_ctx));
        int untouched = 1;
        for (int64_t e = 0; e < h_numel(&dq); e++) untouched &= ((float *)dq.data)[e] == 12345.0f;
        CHECK(untouched, "mode %lld: dq written", (long long)m);
    }
    fa_context_set(g_ctx, FA_PARAM_QUANT_MATMUL, 0);
    CHECK(fa_backward(g_ctx, &b) == FA_OK, "exact backward: %s", fa_context_error(g_ctx));
    free(dout.data), free(dq.data);
    h_problem_free(&p);
}

int main(void)
{
    CHECK(h_context_create(&g_ctx) == FA_OK, "context");
    if (!g_ctx) return h_summary();
    test_setting();
    fa_context_free(g_ctx);
    return h_summary();
}
