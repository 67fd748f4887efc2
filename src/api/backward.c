/*
 * backward.c: fa_backward: validate (the forward's arguments as fa_forward does, then
 * the gradients), pick the algorithm (entry.c's table: each algorithm's backward
 * differentiates its own forward), run it, record what ran; fa_backward_check stops
 * after the first two steps.
 */
#include "entry.h"
#include "convert.h"

/* Writes zeros over a whole gradient tensor (the gradient of nothing). */
static void write_zeros(const fa_tensor *t)
{
    static const float zeros[256];
    for (int d = 0; d < 4; d++)
        if (t->shape[d] == 0) return; /* no elements, however many rows */
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t s = 0; s < t->shape[1]; s++)
            for (int64_t h = 0; h < t->shape[2]; h++)
                for (int64_t e0 = 0; e0 < t->shape[3]; e0 += 256) {
                    fa_tensor v = *t;
                    v.data = (char *)v.data + e0 * v.stride[3] * (int64_t)fa_dtype_size(v.dtype);
                    fa_store_rows(&v, &fa_kernels_ref, b, s, 1, h, t->shape[3] - e0 < 256 ? t->shape[3] - e0 : 256, zeros, 0);
                }
}

/* fa_backward's decisions before it runs, as forward.c's prepare_forward. */
static fa_status prepare_backward(fa_context *ctx, const fa_backward_args *args, fa_problem *p, fa_grads *g,
                                  const fa_algo_entry **e, const char **fallback)
{
    fa_status st = fa_validate_backward(ctx, args, p, g);
    if (st != FA_OK) return st;
    *e = fa_algo_choose(ctx, p, fallback, &st);
    return *e ? FA_OK : st;
}

/* The bodies of the public calls below, for fa_guarded_call. */
static fa_status backward_call(fa_context *ctx, const void *args, void *out)
{
    (void)out;
    fa_problem p;
    fa_grads g;
    const char *fallback = NULL;
    const fa_algo_entry *e;
    fa_status st = prepare_backward(ctx, args, &p, &g, &e, &fallback);
    if (st != FA_OK) return st;

    fa_run_info info = {.threads = 1, .path = ""};
    const double t0 = ctx->set.verbose ? fa_now_s() : 0.0;
    if (!fa_problem_is_form(&p) && (p.B == 0 || p.Sq == 0 || p.Hq == 0 || p.Sk == 0)) {
        /* no (i, j) pair at all: every gradient is zero */
        if (g.has_dq) write_zeros(&g.dq);
        if (g.has_dk) write_zeros(&g.dk);
        if (g.has_dv) write_zeros(&g.dv);
        for (int64_t h = 0; g.dsinks && h < p.Hq; h++) g.dsinks[h] = 0.0f;
        info.path = "empty";
    } else if ((st = e->run_backward(ctx, &p, &g, &info)) != FA_OK) {
        return st;
    }
    info.backward = 1;
    fa_run_record(ctx, &p, e, fallback, &info, t0);
    return FA_OK;
}

static fa_status backward_check_call(fa_context *ctx, const void *args, void *out)
{
    (void)out;
    fa_problem p;
    fa_grads g;
    const fa_algo_entry *e;
    const char *fallback = NULL;
    return prepare_backward(ctx, args, &p, &g, &e, &fallback);
}

fa_status fa_backward(fa_context *ctx, const fa_backward_args *args)
{
    return fa_guarded_call(ctx, backward_call, args, NULL, 1);
}

fa_status fa_backward_check(fa_context *ctx, const fa_backward_args *args)
{
    return fa_guarded_call(ctx, backward_check_call, args, NULL, 0);
}
