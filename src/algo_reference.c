/*
 * algo_reference.c: the oracle. Plain loops over (b, h, i, j) that read like
 * docs/semantics.md and accumulate in double; single-threaded and O(Sk) memory.
 * Every faster path is judged against this, so it stays simple to check by eye.
 */
#include "internal.h"
#include "convert.h"
#include "alloc.h"

#include <math.h>
#include <stdlib.h>

fa_status fa_run_reference(fa_context *ctx, const fa_problem *p, fa_run_info *info)
{
    int64_t n_doubles, bytes;
    if (!fa_add_ok(p->Sk, p->Dv, &n_doubles) || !fa_mul_ok(n_doubles, (int64_t)sizeof(double), &bytes) ||
        !fa_add_ok(bytes, p->Dv * (int64_t)sizeof(float), &bytes))
        return fa_fail(ctx, FA_ERR_OVERFLOW, "reference: workspace size overflows");
    double *s = fa_malloc(bytes);  /* (Sk) scores of one row, then (Dv) its output */
    if (!s) return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "reference: cannot allocate %lld bytes", (long long)bytes);
    double *o = s + p->Sk;              /* (Dv) */
    float *o32 = (float *)(o + p->Dv);  /* (Dv) the row rounded for the store */

    for (int64_t b = 0; b < p->B; b++)
    for (int64_t h = 0; h < p->Hq; h++)
    for (int64_t i = 0; i < p->Sq; i++) {
        const int64_t hk = h / p->group;
        const int64_t diag = fa_diag(p, i);
        int64_t lo, hi;
        fa_row_band(p, i, &lo, &hi);

        /* 1-5: scores, with dropped (masked) columns marked -inf */
        double m = -INFINITY;
        for (int64_t j = 0; j < p->Sk; j++) {
            int keep = j >= lo && j <= hi;
            if (p->has_mask && fa_load(&p->mask, b, h, i, j) == 0.0f) keep = 0;
            if (!keep) {
                s[j] = -INFINITY;
                continue;
            }
            double dot = 0.0;
            for (int64_t d = 0; d < p->D; d++)
                dot += (double)fa_load(&p->q, b, i, h, d) * (double)fa_load(&p->k, b, j, hk, d);
            double x = (double)p->scale * dot;
            if (p->softcap > 0.0f) x = p->softcap * tanh(x / p->softcap);
            if (p->has_bias) x += fa_load(&p->bias, b, h, i, j);
            if (p->alibi) x += -(double)p->alibi[b * p->alibi_stride_b + h] * (double)llabs(diag - j);
            s[j] = x;
            if (isnan(x) || x > m) m = x; /* a NaN score makes the row NaN */
        }

        /* 6-9: lse, probabilities, output; an empty row gives o = 0, lse = -inf */
        double lse = -INFINITY;
        for (int64_t e = 0; e < p->Dv; e++) o[e] = 0.0;
        if (m != -INFINITY) {
            double sum = 0.0;
            for (int64_t j = 0; j < p->Sk; j++) sum += exp(s[j] - m);
            lse = m + log(sum);
            for (int64_t j = 0; j < p->Sk; j++) {
                if (s[j] == -INFINITY) continue; /* dropped: v_j is never read */
                double pij = exp(s[j] - lse);
                for (int64_t e = 0; e < p->Dv; e++) o[e] += pij * (double)fa_load(&p->v, b, j, hk, e);
            }
        }
        for (int64_t e = 0; e < p->Dv; e++) o32[e] = (float)o[e];
        fa_store_rows(&p->o, b, i, 1, h, p->Dv, o32, p->Dv);
        if (p->has_lse) {
            float *l = p->lse.data;
            l[b * p->lse.stride[0] + h * p->lse.stride[1] + i * p->lse.stride[2]] = (float)lse;
        }
    }
    fa_free(s);
    info->extra_bytes = bytes;
    info->threads = 1;
    info->path = "f64";
    return FA_OK;
}
