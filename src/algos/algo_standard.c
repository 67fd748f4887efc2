/*
 * algo_standard.c: attention the way eager PyTorch computes it, kept as the
 * baseline every benchmark compares against and as a fallback. Per (b, h) it
 * materialises the whole Sk x Sq score matrix, masks it, turns it into P with a
 * full-row softmax (normalised, as torch.softmax returns it), then multiplies
 * by V. Memory is O(Sq*Sk) per thread; when that cannot be had the call fails
 * with FA_ERR_OUT_OF_MEMORY before anything is written. It runs the same
 * micro-kernels as flash, so a speed comparison measures the algorithm, not two
 * different GEMMs.
 */
#include "algos.h"
#include "workspace.h"
#include "arith.h"
#include "convert.h"
#include "threadpool.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

typedef struct {
    const fa_problem *p;
    const fa_kernels *kern;
    int64_t sq_pad;
    int64_t ldo;        /* Dv rounded up to FA_ROW_ALIGN */
    char *workspace;
    int64_t per_thread; /* bytes */
    atomic_llong next;  /* next (b, h) task */
} standard_job;

typedef struct {
    float *st;  /* (Sk, sq_pad) S^T, then P^T */
    float *qt;  /* (D, sq_pad) */
    float *q;   /* (Sq, D) f32 rows when conversion is needed */
    float *k;   /* (Sk, D) */
    float *v;   /* (Sk, Dv) */
    float *o;   /* (Sq, ldo) */
    float *m, *l, *alpha; /* (sq_pad) */
    int32_t *lo, *hi;     /* (sq_pad) each row's band, for band-only masking */
    int64_t *bms;         /* the block mask's statuses of a row of kv blocks (fa_bmask_scratch) */
} standard_scratch;

/* The scratch as one table (fa_ws_layout): its size in bytes with base == NULL, its
 * slices from base otherwise; -1 on overflow (an Sq x Sk matrix per thread). */
static int64_t scratch_layout(const standard_job *job, standard_scratch *sc, char *base)
{
    const fa_problem *p = job->p;
    const int64_t sp = job->sq_pad;
    standard_scratch unused;
    if (!sc) sc = &unused;
    const fa_ws_part parts[] = {
        {(void **)&sc->st, fa_bytes3(p->Sk, sp, 4)},    {(void **)&sc->qt, fa_bytes3(p->D, sp, 4)},
        {(void **)&sc->q, fa_bytes3(p->Sq, p->D, 4)},   {(void **)&sc->k, fa_bytes3(p->Sk, p->D, 4)},
        {(void **)&sc->v, fa_bytes3(p->Sk, p->Dv, 4)},  {(void **)&sc->o, fa_bytes3(p->Sq, job->ldo, 4)},
        {(void **)&sc->m, fa_bytes3(sp, 4, 1)},         {(void **)&sc->l, fa_bytes3(sp, 4, 1)},
        {(void **)&sc->alpha, fa_bytes3(sp, 4, 1)},     {(void **)&sc->lo, fa_bytes3(sp, 4, 1)},
        {(void **)&sc->hi, fa_bytes3(sp, 4, 1)},         {(void **)&sc->bms, fa_bytes3(fa_bmask_scratch(p, p->Sk), 8, 1)},
    };
    return fa_ws_layout(parts, sizeof parts / sizeof parts[0], base);
}

static void standard_head(const standard_job *job, const standard_scratch *sc, int64_t b, int64_t h)
{
    const fa_problem *p = job->p;
    const fa_kernels *kern = job->kern;
    const int64_t Sq = p->Sq, Sk = p->Sk, D = p->D, Dv = p->Dv, hk = h / p->group, sp = job->sq_pad;
    int64_t ldq, ldk, ldv;
    const float *q = fa_rows_f32(&p->q, kern, b, 0, Sq, h, D, sc->q, &ldq);
    const float *k = fa_rows_f32(&p->k, kern, b, 0, Sk, hk, D, sc->k, &ldk);
    const float *v = fa_rows_f32(&p->v, kern, b, 0, Sk, hk, Dv, sc->v, &ldv);

    /* 1-5 (docs/semantics.md's steps). S = scale * Q K^T, then softcap, bias, ALiBi
     * and masks as one more pass (a causal/window band alone goes to the softmax as
     * bounds, as in flash) */
    kern->pack_qt(Sq, D, q, ldq, p->scale, sc->qt, sp);
    kern->qk(Sq, Sk, D, sc->qt, sp, k, ldk, sc->st, sp);
    const int32_t *lo = NULL, *hi = NULL;
    if (fa_problem_has_elementwise(p)) {
        fa_scores_finish(p, &p->view, b, h, 0, Sq, 0, Sk, sc->st, sp, 1);
    } else if (!fa_tile_band(p, &p->view, 0, Sq, 0, Sk, sc->lo, sc->hi)) {
        lo = sc->lo;
        hi = sc->hi;
    }

    if (p->bm.on) fa_bmask_apply(p, &p->view, b, h, 0, Sq, 0, Sk, sc->st, sp, 1, sc->bms);

    /* 6-7. P = softmax(S): one online step over the whole row is the exact softmax;
     * then normalise P itself, as torch.softmax does (the sink's term in the sum, by
     * the rule flash finalises its rows with; m becomes the lse) */
    for (int64_t i = 0; i < Sq; i++) {
        sc->m[i] = -INFINITY;
        sc->l[i] = 0.0f;
    }
    kern->softmax(Sq, Sk, sc->st, sp, lo, hi, sc->m, sc->l, sc->alpha);
    for (int64_t i = 0; i < Sq; i++) {
        const float f = fa_row_norm(sc->m[i], sc->l[i], fa_sink(p, h), &sc->m[i]);
        sc->alpha[i] = sc->l[i] > 0.0f ? f : 0.0f;
    }
    for (int64_t j = 0; j < Sk; j++) {
        float *row = sc->st + j * sp;
        for (int64_t i = 0; i < Sq; i++) row[i] *= sc->alpha[i];
    }
    /* 8. dropout, after the softmax: the lse stays the undropped row's */
    if (p->drop.on) fa_dropout_tile_t(&p->drop, b, h, p->Hq, p->q_start, Sq, p->k_start, Sk, sc->st, sp);
    if (p->has_lse) {
        float *out = p->lse.data;
        for (int64_t i = 0; i < Sq; i++)
            out[b * p->lse.stride[0] + h * p->lse.stride[1] + i * p->lse.stride[2]] = sc->m[i];
    }

    /* 9. O = P V (the careful reference pv when a V row is not finite: see algo_flash.c) */
    if (Dv == 0) return; /* the lse was all there was to compute */
    memset(sc->o, 0, (size_t)(Sq * job->ldo) * sizeof(float));
    (fa_rows_finite(v, ldv, Sk, Dv) ? kern->pv : fa_kernels_ref.pv)(Sq, Sk, Dv, sc->st, sp, v, ldv, NULL, sc->o, job->ldo);
    fa_store_rows(&p->o, job->kern, b, 0, Sq, h, Dv, sc->o, job->ldo);
}

static void standard_worker(void *arg, int ith, int nth)
{
    (void)nth;
    standard_job *job = arg;
    standard_scratch sc;
    scratch_layout(job, &sc, job->workspace + (int64_t)ith * job->per_thread);
    const int64_t tasks = job->p->B * job->p->Hq; /* checked in fa_run_standard */
    for (int64_t t; (t = atomic_fetch_add(&job->next, 1)) < tasks;)
        standard_head(job, &sc, t / job->p->Hq, t % job->p->Hq);
}

fa_status fa_run_standard(fa_context *ctx, const fa_problem *p, fa_run_info *info)
{
    standard_job job = {.p = p, .kern = ctx->kernels};
    job.sq_pad = fa_panel_ld(p->Sq);
    job.ldo = fa_round_up(p->Dv, FA_ROW_ALIGN);
    job.per_thread = scratch_layout(&job, NULL, NULL);
    int64_t tasks, bytes;
    if (!fa_mul_ok(p->B, p->Hq, &tasks)) /* proven in range by the work check; kept as the rule says */
        return fa_fail(ctx, FA_ERR_OVERFLOW, "standard: B * Hq overflows");
    const int nth = ctx->threads < tasks ? ctx->threads : (int)tasks;
    if (job.per_thread < 0 || !fa_mul_ok(job.per_thread, nth, &bytes))
        return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "standard: the %lld x %lld score matrix does not fit in memory",
                       (long long)p->Sq, (long long)p->Sk);
    job.workspace = fa_workspace_alloc(bytes);
    if (!job.workspace)
        return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY,
                       "standard: cannot allocate %lld bytes for %d thread(s) of %lld x %lld scores",
                       (long long)bytes, nth, (long long)p->Sq, (long long)p->Sk);
    atomic_init(&job.next, 0);
    fa_pool_run(ctx->pool, nth, standard_worker, &job);
    fa_workspace_free(job.workspace);
    info->extra_bytes = bytes;
    info->threads = nth;
    info->path = "f32";
    return FA_OK;
}

/* The eager backward: per head, the whole S, P, dP and dS materialised, then the
 * products, on the same kernels and the same loop as flash, with one tile of the
 * whole sequence. Memory O(Sq * Sk) per thread, like the forward above. */
fa_status fa_run_standard_backward(fa_context *ctx, const fa_problem *p, const fa_grads *g, fa_run_info *info)
{
    const fa_status st = fa_backward_tiled(ctx, p, g, p->Sq > 0 ? p->Sq : 1, p->Sk > 0 ? p->Sk : 1, 0, info);
    if (st == FA_OK) info->br = info->bc = 0; /* no tiles to speak of */
    return st;
}
