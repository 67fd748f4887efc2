/*
 * algo_reference.c: the oracle. Plain loops over (b, h, i, j) that read like
 * docs/semantics.md and accumulate in double; single-threaded and O(Sk) memory.
 * Every faster path is judged against this, so it stays simple to check by eye.
 */
#include "algos.h"
#include "workspace.h"
#include "arith.h"
#include "convert.h"
#include "alloc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Steps 1-5 for row i of (b, h): s[j] the final score, -inf where removed; x[j]
 * (when x is not NULL) scale * q.k before the softcap. Returns the row's max
 * (NaN if a score is NaN). Forward and backward both read the scores from here. */
static double score_row(const fa_problem *p, int64_t b, int64_t h, int64_t i, double *s, double *x)
{
    const int64_t hk = h / p->group, diag = fa_diag(p, &p->view, i);
    int64_t lo, hi;
    fa_row_band(p, &p->view, i, &lo, &hi);
    double m = -INFINITY;
    for (int64_t j = 0; j < p->Sk; j++) {
        int keep = j >= lo && j <= hi;
        if (p->has_mask && fa_load(&p->mask, b, h, i, j) == 0.0f) keep = 0;
        if (keep && p->bm.on && !fa_bmask_keeps(p, &p->view, b, h, i, j)) keep = 0;
        if (!keep) {
            s[j] = -INFINITY;
            continue;
        }
        double dot = 0.0;
        for (int64_t d = 0; d < p->D; d++)
            dot += (double)fa_load(&p->q, b, i, h, d) * (double)fa_load(&p->k, b, j, hk, d);
        double v = (double)p->scale * dot;
        if (x) x[j] = v;
        if (p->softcap > 0.0f) v = p->softcap * tanh(v / p->softcap);
        if (p->has_bias) v += fa_load(&p->bias, b, h, i, j);
        if (p->alibi) v += -(double)p->alibi[b * p->alibi_stride_b + h] * (double)llabs(diag - j);
        s[j] = v;
        if (isnan(v) || v > m) m = v; /* a NaN score makes the row NaN */
    }
    return m;
}

/* Step 6 for row i of head h, whose scores s (-inf where removed) have the max m:
 * lse = log(sum_j exp(s_j) + exp(sink)), the sink one more term with no value; an
 * empty row's is the sink's alone (-inf without one). */
static double row_lse(const fa_problem *p, int64_t h, double m, const double *s)
{
    const double sink = fa_sink(p, h);
    if (m == -INFINITY) return sink;
    const double top = sink > m ? sink : m;
    double sum = sink == -INFINITY ? 0.0 : exp(sink - top);
    for (int64_t j = 0; j < p->Sk; j++) sum += exp(s[j] - top);
    return top + log(sum);
}

fa_status fa_run_reference(fa_context *ctx, const fa_problem *p, fa_run_info *info)
{
    double *s, *o;
    float *o32;
    const fa_ws_part parts[] = {
        {(void **)&s, fa_bytes3(p->Sk, 8, 1)},   /* (Sk) scores of one row */
        {(void **)&o, fa_bytes3(p->Dv, 8, 1)},   /* (Dv) its output */
        {(void **)&o32, fa_bytes3(p->Dv, 4, 1)}, /* (Dv) the row rounded for the store */
    };
    const int64_t bytes = fa_ws_layout(parts, sizeof parts / sizeof parts[0], NULL);
    if (bytes < 0) return fa_fail(ctx, FA_ERR_OVERFLOW, "reference: workspace size overflows");
    char *ws = fa_malloc(bytes);
    if (!ws) return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "reference: cannot allocate %lld bytes", (long long)bytes);
    fa_ws_layout(parts, sizeof parts / sizeof parts[0], ws);

    for (int64_t b = 0; b < p->B; b++)
    for (int64_t h = 0; h < p->Hq; h++)
    for (int64_t i = 0; i < p->Sq; i++) {
        const int64_t hk = h / p->group;
        /* 1-5: scores, with dropped (masked) columns marked -inf */
        const double m = score_row(p, b, h, i, s, NULL);

        /* 6-9: lse, probabilities, output; an empty row gives o = 0, lse = the sink or -inf */
        const double lse = row_lse(p, h, m, s);
        for (int64_t e = 0; e < p->Dv; e++) o[e] = 0.0;
        if (m != -INFINITY) {
            for (int64_t j = 0; j < p->Sk; j++) {
                if (s[j] == -INFINITY) continue; /* dropped: v_j is never read */
                double pij = exp(s[j] - lse);
                if (p->drop.on) /* step 8: after the softmax; lse stays the undropped row's */
                    pij *= fa_dropout_keep(&p->drop, b, h, p->Hq, p->q_start + i, p->k_start + j) ? (double)p->drop.scale : 0.0;
                for (int64_t e = 0; e < p->Dv; e++) o[e] += pij * (double)fa_load(&p->v, b, j, hk, e);
            }
        }
        for (int64_t e = 0; e < p->Dv; e++) o32[e] = (float)o[e];
        fa_store_rows(&p->o, &fa_kernels_ref, b, i, 1, h, p->Dv, o32, p->Dv);
        if (p->has_lse) {
            float *l = p->lse.data;
            l[b * p->lse.stride[0] + h * p->lse.stride[1] + i * p->lse.stride[2]] = (float)lse;
        }
    }
    fa_free(ws);
    info->extra_bytes = bytes;
    info->threads = 1;
    info->path = "f64";
    return FA_OK;
}

/*
 * The backward oracle: the gradients of the forward above, in double, written as its
 * mirror. Every row recomputes its scores and probabilities from q and k (it does not
 * trust the o and lse it was given), so it is the exact gradient of the math. Per
 * sequence, dk and dv accumulate over every query head of a group in double.
 */
fa_status fa_run_reference_backward(fa_context *ctx, const fa_problem *p, const fa_grads *g, fa_run_info *info)
{
    const int64_t D = p->D, Dv = p->Dv;
    double *s, *x, *pr, *dp, *dq, *dk, *dv, *dsink;
    float *row32;
    const fa_ws_part parts[] = {
        {(void **)&s, fa_bytes3(p->Sk, 8, 1)},        /* (Sk) scores of one row */
        {(void **)&x, fa_bytes3(p->Sk, 8, 1)},        /* (Sk) scale * q.k before softcap */
        {(void **)&pr, fa_bytes3(p->Sk, 8, 1)},       /* (Sk) probabilities */
        {(void **)&dp, fa_bytes3(p->Sk, 8, 1)},       /* (Sk) dO_i . v_j */
        {(void **)&dq, fa_bytes3(D, 8, 1)},           /* (D) one row of dq */
        {(void **)&dk, fa_bytes3(p->Sk * p->Hk, D, 8)},  /* (Sk, Hk, D) */
        {(void **)&dv, fa_bytes3(p->Sk * p->Hk, Dv, 8)}, /* (Sk, Hk, Dv) */
        {(void **)&row32, fa_bytes3(D > Dv ? D : Dv, 4, 1)}, /* a row rounded for the store */
        {(void **)&dsink, fa_bytes3(p->Hq, 8, 1)},    /* (Hq) */
    };
    const int64_t bytes = fa_ws_layout(parts, sizeof parts / sizeof parts[0], NULL);
    if (bytes < 0) return fa_fail(ctx, FA_ERR_OVERFLOW, "reference backward: workspace size overflows");
    char *ws = fa_malloc(bytes);
    if (!ws) return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "reference backward: cannot allocate %lld bytes", (long long)bytes);
    fa_ws_layout(parts, sizeof parts / sizeof parts[0], ws);

    for (int64_t h = 0; h < p->Hq; h++) dsink[h] = 0.0;
    for (int64_t b = 0; b < p->B; b++) {
        memset(dk, 0, (size_t)(p->Sk * p->Hk * D) * sizeof *dk);
        memset(dv, 0, (size_t)(p->Sk * p->Hk * Dv) * sizeof *dv);
        for (int64_t h = 0; h < p->Hq; h++)
        for (int64_t i = 0; i < p->Sq; i++) {
            const int64_t hk = h / p->group;
            /* forward 1-5: scores (x keeps scale * q.k for the softcap's derivative) */
            const double m = score_row(p, b, h, i, s, x);
            /* forward 6-8: p_ij (undropped), and the dropout factor z_ij apart */
            const double lse = row_lse(p, h, m, s);
            /* backward of 9, o_i = sum_j p_ij z_ij v_j: dv_j += p_ij z_ij dO_i, and
             * dp_ij = z_ij (dO_i . v_j) */
            double rowdot = 0.0; /* sum_j p_ij dp_ij = dO_i . o_i */
            for (int64_t j = 0; j < p->Sk; j++) {
                pr[j] = dp[j] = 0.0;
                if (s[j] == -INFINITY) continue;
                const double z = p->drop.on ? (fa_dropout_keep(&p->drop, b, h, p->Hq, p->q_start + i, p->k_start + j)
                                                   ? (double)p->drop.scale : 0.0)
                                            : 1.0;
                pr[j] = exp(s[j] - lse);
                double d = 0.0;
                for (int64_t e = 0; e < Dv; e++)
                    d += (double)fa_load(&g->dout, b, i, h, e) * (double)fa_load(&p->v, b, j, hk, e);
                dp[j] = z * d;
                rowdot += pr[j] * dp[j];
                for (int64_t e = 0; e < Dv; e++)
                    dv[(j * p->Hk + hk) * Dv + e] += pr[j] * z * (double)fa_load(&g->dout, b, i, h, e);
            }
            /* backward of 6-7 for the sink, a column of the softmax with no value (its
             * dp is 0): dsink_h += p_sink (0 - sum_k p_ik dp_ik), p_sink = exp(sink - lse) */
            if (fa_sink(p, h) != -INFINITY && m != -INFINITY) dsink[h] -= exp((double)fa_sink(p, h) - lse) * rowdot;
            /* backward of 7, the softmax: ds_ij = p_ij (dp_ij - sum_k p_ik dp_ik); of 2, the
             * softcap: times 1 - tanh^2(x/c); bias and ALiBi pass ds through unchanged */
            for (int64_t d = 0; d < D; d++) dq[d] = 0.0;
            for (int64_t j = 0; j < p->Sk; j++) {
                if (pr[j] == 0.0 && !isnan(pr[j])) continue;
                double ds = pr[j] * (dp[j] - rowdot);
                if (p->softcap > 0.0f) {
                    const double t = tanh(x[j] / p->softcap);
                    ds *= 1.0 - t * t;
                }
                /* backward of 1, s = scale q.k */
                for (int64_t d = 0; d < D; d++) {
                    dq[d] += (double)p->scale * ds * (double)fa_load(&p->k, b, j, hk, d);
                    dk[(j * p->Hk + hk) * D + d] += (double)p->scale * ds * (double)fa_load(&p->q, b, i, h, d);
                }
            }
            if (g->has_dq) {
                for (int64_t d = 0; d < D; d++) row32[d] = (float)dq[d];
                fa_store_rows(&g->dq, &fa_kernels_ref, b, i, 1, h, D, row32, D);
            }
        }
        for (int64_t j = 0; j < p->Sk; j++)
            for (int64_t hk = 0; hk < p->Hk; hk++) {
                if (g->has_dk) {
                    for (int64_t d = 0; d < D; d++) row32[d] = (float)dk[(j * p->Hk + hk) * D + d];
                    fa_store_rows(&g->dk, &fa_kernels_ref, b, j, 1, hk, D, row32, D);
                }
                if (g->has_dv) {
                    for (int64_t e = 0; e < Dv; e++) row32[e] = (float)dv[(j * p->Hk + hk) * Dv + e];
                    fa_store_rows(&g->dv, &fa_kernels_ref, b, j, 1, hk, Dv, row32, Dv);
                }
            }
    }
    if (g->dsinks)
        for (int64_t h = 0; h < p->Hq; h++) g->dsinks[h] = (float)dsink[h];
    fa_free(ws);
    info->extra_bytes = bytes;
    info->threads = 1;
    info->path = "f64";
    return FA_OK;
}
