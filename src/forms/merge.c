/*
 * merge.c: merging partial attention results over disjoint key sets
 * (docs/semantics.md, section 8, merging). Split-KV decoding merges its chunks
 * with fa_merge_rows; fa_merge_states offers the same formula to callers that
 * split keys themselves (across machines, ring attention, a cache plus new rows).
 */
#include "checks.h"
#include "workspace.h"
#include "arith.h"
#include "convert.h"
#include "threadpool.h"

#include <math.h>
#include <stdatomic.h>

void fa_merge_rows(int n, const float *const *o, const float *lse, int64_t dv, float *out, float *lse_out)
{
    /* lse = m + log(sum exp(lse_i - m)) with m the largest side: no overflow, and
     * an empty side (-inf) gets weight exactly 0 */
    float m = -INFINITY;
    int nan = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(lse[i])) nan = 1;
        else if (lse[i] > m) m = lse[i];
    }
    if (nan) {
        for (int64_t e = 0; e < dv; e++) out[e] = NAN;
        *lse_out = NAN;
        return;
    }
    if (m == -INFINITY) {
        for (int64_t e = 0; e < dv; e++) out[e] = 0.0f;
        *lse_out = -INFINITY;
        return;
    }
    /* the total stays in double: rounded to float first, it would shift every
     * weight by up to ulp(|lse|) relative, which at |lse| ~ 1000 is 1e-4 */
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)lse[i] - m);
    const double total = m + log(sum);
    for (int64_t e = 0; e < dv; e++) out[e] = 0.0f;
    for (int i = 0; i < n; i++) {
        if (lse[i] == -INFINITY) continue;
        const float w = (float)exp((double)lse[i] - total);
        for (int64_t e = 0; e < dv; e++) out[e] += w * o[i][e];
    }
    *lse_out = (float)total;
}

float fa_row_norm(float m, float l, float sink, float *lse)
{
    if (isnan(sink)) {
        *lse = NAN;
        return NAN;
    }
    if (m == -INFINITY) { /* kept nothing: o = 0; the lse is the sink's alone */
        *lse = sink;
        return 0.0f;
    }
    if (sink == -INFINITY) {
        *lse = m + logf(l);
        return 1.0f / l;
    }
    /* the sink is one more term exp(sink - top) of the sum, measured from the larger
     * of the two maxima so that neither exponent overflows */
    const float top = sink > m ? sink : m;
    const float a = expf(m - top), sum = l * a + expf(sink - top);
    *lse = top + logf(sum);
    return a / sum;
}

/* The rows of one call, shared by its threads: each takes blocks of rows from `next`. */
typedef struct {
    int n;
    const fa_tensor *o_parts, *lse_parts;
    const fa_tensor *o, *lse; /* lse NULL: not wanted */
    const fa_kernels *kern;   /* the context's row converters */
    int64_t S, H, Dv, rows;   /* rows = B * S * H */
    char *workspace;
    int64_t per_thread;       /* bytes */
    atomic_llong next;
} merge_job;

enum { MERGE_BLOCK = 64 }; /* rows a thread takes at once */

typedef struct {
    const float **ptrs; /* (n) the parts' rows */
    float *rows;        /* (n, Dv) */
    float *merged;      /* (Dv) */
    float *lses;        /* (n) */
} merge_scratch;

static int64_t merge_layout(const merge_job *job, merge_scratch *sc, char *base)
{
    const fa_ws_part parts[] = {
        {(void **)&sc->ptrs, fa_bytes3(job->n, (int64_t)sizeof(float *), 1)},
        {(void **)&sc->rows, fa_bytes3(job->n, job->Dv, 4)},
        {(void **)&sc->merged, fa_bytes3(job->Dv, 4, 1)},
        {(void **)&sc->lses, fa_bytes3(job->n, 4, 1)},
    };
    return fa_ws_layout(parts, sizeof parts / sizeof parts[0], base);
}

static void merge_worker(void *arg, int ith, int nth)
{
    (void)nth;
    merge_job *job = arg;
    merge_scratch sc;
    merge_layout(job, &sc, job->workspace + (int64_t)ith * job->per_thread);
    const int n = job->n;
    const int64_t Dv = job->Dv;
    for (int i = 0; i < n; i++) sc.ptrs[i] = sc.rows + (int64_t)i * Dv;
    for (int64_t r0; (r0 = atomic_fetch_add(&job->next, MERGE_BLOCK)) < job->rows;) {
        const int64_t r1 = r0 + MERGE_BLOCK < job->rows ? r0 + MERGE_BLOCK : job->rows;
        for (int64_t r = r0; r < r1; r++) {
            const int64_t h = r % job->H, s = r / job->H % job->S, b = r / job->H / job->S;
            /* read every part's row before writing: o may be one of the parts */
            for (int i = 0; i < n; i++) {
                fa_pack_rows(&job->o_parts[i], job->kern, b, s, 1, h, Dv, sc.rows + (int64_t)i * Dv, Dv);
                sc.lses[i] = fa_load(&job->lse_parts[i], b, h, s, 0);
            }
            float l;
            fa_merge_rows(n, sc.ptrs, sc.lses, Dv, sc.merged, &l);
            fa_store_rows(job->o, job->kern, b, s, 1, h, Dv, sc.merged, Dv);
            if (job->lse)
                ((float *)job->lse->data)[b * job->lse->stride[0] + h * job->lse->stride[1] + s * job->lse->stride[2]] = l;
        }
    }
}

static fa_status merge_states(fa_context *ctx, int n, const fa_tensor *o_parts, const fa_tensor *lse_parts,
                              fa_tensor *o, fa_tensor *lse)
{
    if (n < 1) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "n is %d; merging needs at least one part", n);
    if (n > 4096) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "n is %d; at most 4096 parts", n);
    if (!o_parts || !lse_parts || !o) return fa_fail(ctx, FA_ERR_NULL_POINTER, "o_parts, lse_parts and o are required");
    fa_status st;
    if ((st = fa_check_data(ctx, "o", o)) != FA_OK) return st;
    if (!fa_dtype_is_float(o->dtype)) return fa_fail(ctx, FA_ERR_DTYPE, "o.dtype (%s) must be f32, f16 or bf16", fa_dtype_name(o->dtype));
    if ((st = fa_check_tensor(ctx, "o", o)) != FA_OK) return st;
    const int64_t B = o->shape[0], S = o->shape[1], H = o->shape[2], Dv = o->shape[3];
    const int has_lse = lse && lse->data;
    if (has_lse && (st = fa_check_lse(ctx, lse, B, H, S)) != FA_OK) return st;
    for (int i = 0; i < n; i++) {
        const fa_tensor *a = &o_parts[i], *l = &lse_parts[i];
        if ((st = fa_check_data(ctx, "o_parts[i]", a)) != FA_OK || (st = fa_check_data(ctx, "lse_parts[i]", l)) != FA_OK)
            return st;
        if (!fa_dtype_is_float(a->dtype)) return fa_fail(ctx, FA_ERR_DTYPE, "part %d: o dtype (%s) must be f32, f16 or bf16", i, fa_dtype_name(a->dtype));
        if ((st = fa_check_tensor(ctx, "o_parts[i]", a)) != FA_OK) return st;
        for (int d = 0; d < 4; d++)
            if (a->shape[d] != o->shape[d])
                return fa_fail(ctx, FA_ERR_SHAPE_MISMATCH, "part %d: o.shape[%d] is %lld but the output's is %lld", i, d,
                               (long long)a->shape[d], (long long)o->shape[d]);
        if ((st = fa_check_lse(ctx, l, B, H, S)) != FA_OK) return st;
    }

    merge_job job = {.n = n, .S = S, .H = H, .Dv = Dv, .kern = ctx->kernels};
    job.rows = fa_bytes3(B, S, H); /* the lse of part 0 has B*H*S elements: no overflow */
    if (job.rows == 0) return FA_OK;
    /* canonical copies (checks.h): the rows read and written are the caller's */
    const fa_tensor oc = fa_tensor_canonical(*o), lc = has_lse ? fa_tensor_canonical(*lse) : *o;
    job.o = &oc;
    job.lse = has_lse ? &lc : NULL;
    job.per_thread = merge_layout(&job, &(merge_scratch){0}, NULL);
    const int nth = job.rows / MERGE_BLOCK + 1 < ctx->threads ? (int)(job.rows / MERGE_BLOCK + 1) : ctx->threads;
    /* the per-thread scratch, then the parts and their lse in canonical form too */
    char *scratch;
    fa_tensor *parts;
    const fa_ws_part ws_parts[] = {
        {(void **)&scratch, job.per_thread < 0 ? -1 : fa_bytes3(job.per_thread, nth, 1)},
        {(void **)&parts, fa_bytes3(2 * (int64_t)n, (int64_t)sizeof(fa_tensor), 1)},
    };
    const int64_t bytes = fa_ws_layout(ws_parts, 2, NULL);
    if (bytes < 0) return fa_fail(ctx, FA_ERR_OVERFLOW, "merge workspace overflows");
    char *ws = fa_context_workspace(ctx, bytes);
    if (!ws) return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "cannot allocate the merge workspace");
    fa_ws_layout(ws_parts, 2, ws);
    for (int i = 0; i < n; i++) {
        parts[i] = fa_tensor_canonical(o_parts[i]);
        parts[n + i] = fa_tensor_canonical(lse_parts[i]);
    }
    job.o_parts = parts;
    job.lse_parts = parts + n;
    job.workspace = scratch;
    atomic_init(&job.next, 0);
    fa_pool_run(ctx->pool, nth, merge_worker, &job);
    fa_context_workspace_done(ctx, ws);
    return FA_OK;
}

fa_status fa_merge_states(fa_context *ctx, int n, const fa_tensor *o_parts, const fa_tensor *lse_parts, fa_tensor *o,
                          fa_tensor *lse)
{
    if (!ctx) return FA_ERR_NULL_CONTEXT;
    if (!fa_context_enter(ctx)) return FA_ERR_BUSY;
    const fa_status st = merge_states(ctx, n, o_parts, lse_parts, o, lse);
    fa_context_leave(ctx);
    return st;
}
