/*
 * naive.c: attention the slow, obvious way, one (b, h, i) row at a time, numbered like
 * the steps of docs/semantics.md. Shares nothing with the library but the header's types.
 *
 * One code path serves both precisions: every arithmetic result passes through fl(),
 * which is the identity in fp64 mode and a rounding to float in same-precision mode.
 * Rounding a double result of one +, -, *, / on floats to float gives exactly the float
 * operation's result (53 >= 2*24 + 2 bits), so this is true fp32 arithmetic, not an
 * approximation of it. Stage ends pass through rd_in()/rd_out(), which round to the
 * input/output dtype in same-precision mode.
 */
#include "naive.h"

#include <math.h>
#include <stdlib.h>

#include "harness.h"

typedef struct prec {
    int same;        /* 1: same-precision mode */
    fa_dtype in_dt;  /* dtype of q, k, v */
    fa_dtype out_dt; /* dtype of o */
} prec;

static double fl(const prec *pr, double x) { return pr->same ? (double)(float)x : x; }
static double rd_in(const prec *pr, double x) { return pr->same ? h_round(x, pr->in_dt) : x; }
static double rd_out(const prec *pr, double x) { return pr->same ? h_round(x, pr->out_dt) : x; }

int naive_kept_by_position(const fa_forward_args *args, int64_t Sq, int64_t Sk, int64_t i,
                           int64_t j) {
    const int64_t diag = i + Sk - Sq; /* the bottom-right aligned diagonal */
    if (args->causal == FA_CAUSAL_BOTTOM_RIGHT && j > diag) return 0;
    if (args->causal == FA_CAUSAL_TOP_LEFT && j > i) return 0;
    if (args->window_left >= 0 && j < diag - args->window_left) return 0;
    if (args->window_right >= 0 && j > diag + args->window_right) return 0;
    return 1;
}

/* A (B|1, Hq|1, Sq|1, Sk|1) tensor read at (b, h, i, j), size-1 dims broadcast. */
static double broadcast_get(const fa_tensor *t, int64_t b, int64_t h, int64_t i, int64_t j) {
    return h_get(t, t->shape[0] == 1 ? 0 : b, t->shape[1] == 1 ? 0 : h,
                 t->shape[2] == 1 ? 0 : i, t->shape[3] == 1 ? 0 : j);
}

int naive_forward(const fa_forward_args *args, naive_mode mode, double *o, double *lse,
                  double *max_abs_score) {
    const fa_tensor *q = &args->q, *k = &args->k, *v = &args->v;
    const int64_t B = q->shape[0], Sq = q->shape[1], Hq = q->shape[2], D = q->shape[3];
    const int64_t Sk = k->shape[1], Hk = k->shape[2], Dv = v->shape[3];
    if (k->shape[0] != B || v->shape[0] != B || v->shape[1] != Sk || v->shape[2] != Hk ||
        k->shape[3] != D || Hk <= 0 || Hq % Hk != 0)
        return -1;
    const int64_t group = Hq / Hk;
    const prec pr = {mode == NAIVE_SAME_PRECISION, q->dtype, args->o.dtype};
    const prec *P = &pr;

    double scale = args->scale != 0.0f ? (double)args->scale : 1.0 / sqrt((double)D);
    scale = fl(P, scale);
    const double cap = args->softcap;

    double *kd = malloc(sizeof(double) * (size_t)(Sk * D));   /* (Sk, D) of one kv head */
    double *vd = malloc(sizeof(double) * (size_t)(Sk * Dv));  /* (Sk, Dv) */
    double *qd = malloc(sizeof(double) * (size_t)D);          /* (D) */
    double *s = malloc(sizeof(double) * (size_t)Sk);          /* (Sk) scores */
    double *e = malloc(sizeof(double) * (size_t)Sk);          /* (Sk) exp / probabilities */
    unsigned char *kept = malloc((size_t)Sk);                 /* (Sk) */
    if (!kd || !vd || !qd || !s || !e || !kept) {
        free(kd), free(vd), free(qd), free(s), free(e), free(kept);
        return -1;
    }

    double smax = 0.0;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t hk = h / group;
            for (int64_t j = 0; j < Sk; j++) {
                for (int64_t d = 0; d < D; d++) kd[j * D + d] = h_get(k, b, j, hk, d);
                for (int64_t d = 0; d < Dv; d++) vd[j * Dv + d] = h_get(v, b, j, hk, d);
            }
            for (int64_t i = 0; i < Sq; i++) {
                for (int64_t d = 0; d < D; d++) qd[d] = h_get(q, b, i, h, d);
                double *orow = o + ((b * Sq + i) * Hq + h) * Dv;
                double *lse_i = lse ? lse + (b * Hq + h) * Sq + i : NULL;

                /* 5. which (i, j) survive: causal, window, boolean mask */
                int64_t nkept = 0;
                for (int64_t j = 0; j < Sk; j++) {
                    int keep = naive_kept_by_position(args, Sq, Sk, i, j);
                    if (keep && args->mask.data) keep = broadcast_get(&args->mask, b, h, i, j) != 0.0;
                    kept[j] = (unsigned char)keep;
                    nkept += keep;
                }

                /* 1-4. scores of the kept pairs */
                int any_nan = 0;
                double m = -INFINITY;
                for (int64_t j = 0; j < Sk; j++) {
                    if (!kept[j]) continue;
                    double acc = 0.0;
                    for (int64_t d = 0; d < D; d++) acc = fl(P, acc + fl(P, qd[d] * kd[j * D + d]));
                    double sj = rd_in(P, fl(P, scale * acc));
                    if (fabs(sj) > smax) smax = fabs(sj);
                    if (cap > 0.0) sj = rd_in(P, fl(P, cap * fl(P, tanh(fl(P, sj / cap)))));
                    if (args->bias.data) sj = rd_in(P, fl(P, sj + broadcast_get(&args->bias, b, h, i, j)));
                    if (args->alibi_slopes) {
                        const double slope = args->alibi_slopes[b * args->alibi_stride_b + h];
                        const int64_t dist = llabs(i + Sk - Sq - j);
                        sj = rd_in(P, fl(P, sj - fl(P, slope * (double)dist)));
                    }
                    s[j] = sj;
                    if (isnan(sj)) any_nan = 1;
                    if (sj > m) m = sj;
                }

                /* the sink: one more logit in the softmax, raw (no scale, softcap or
                 * ALiBi), with no value; -inf is none */
                const double sink = args->sinks ? (double)args->sinks[h] : -INFINITY;
                if (any_nan) { /* NaN in what this row reads: the row is NaN */
                    for (int64_t d = 0; d < Dv; d++) orow[d] = NAN;
                    if (lse_i) *lse_i = NAN;
                    continue;
                }
                if (nkept == 0 || m == -INFINITY) { /* nothing kept: o = 0, lse = the sink (-inf) */
                    for (int64_t d = 0; d < Dv; d++) orow[d] = 0.0;
                    if (lse_i) *lse_i = sink;
                    continue;
                }

                /* 6-7. softmax over the kept j and the sink, from the larger maximum */
                if (sink > m) m = sink;
                double sum = sink == -INFINITY ? 0.0 : fl(P, exp(fl(P, sink - m)));
                if (isnan(sink)) sum = NAN;
                for (int64_t j = 0; j < Sk; j++) {
                    if (!kept[j]) continue;
                    e[j] = fl(P, exp(fl(P, s[j] - m)));
                    sum = fl(P, sum + e[j]);
                }
                if (lse_i) *lse_i = fl(P, m + fl(P, log(sum)));
                for (int64_t j = 0; j < Sk; j++)
                    if (kept[j]) e[j] = rd_in(P, fl(P, e[j] / sum));

                /* 9. o_i = sum_j p_ij v_j over kept j only (a masked NaN v_j must not leak) */
                for (int64_t d = 0; d < Dv; d++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < Sk; j++)
                        if (kept[j]) acc = fl(P, acc + fl(P, e[j] * vd[j * Dv + d]));
                    orow[d] = rd_out(P, acc);
                }
            }
        }
    }
    free(kd), free(vd), free(qd), free(s), free(e), free(kept);
    if (max_abs_score) *max_abs_score = smax;
    return 0;
}
