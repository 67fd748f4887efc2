/*
 * algo_flash_bwd.c: the FlashAttention backward on the CPU, the mirror of
 * algo_flash.c. It never holds an N x N matrix: for each tile it recomputes the
 * scores S from q and k and the probabilities P from the forward's lse, then
 * takes the five products of the backward on the same transposed tiles the
 * forward uses (kernels.h):
 *
 *   forward                               backward (this file)
 *   1. S^T  = K (scale Q)^T      qk       dP^T = V dO^T                 qk
 *   3. masks, softcap, bias      finish   dS^T = P^T (dP^T - D)         ds, then x (1 - tanh^2) for softcap
 *   4. P^T  = exp(S^T - m)       softmax  P^T  = exp(S^T - lse)         softmax with m = lse
 *   8. dropout: P *= keep/pk              dP *= keep/pk, P~ = P keep/pk
 *   5. O   += P V                pv       dV  += P~^T dO                stx
 *                                         dK  += scale dS^T Q           stx
 *                                         dQ  += scale dS K             pv
 * with D_i = dot(dO_i, o_i), one number per row, computed first.
 *
 * The loop is K-outer: a task is one (sequence, kv head); it walks the key tiles,
 * keeping dK and dV of the tile in cache, and for each tile only the query blocks
 * of the group's heads that see it (fa_key_block_rows, the planner's inverse
 * question). dQ of the task's heads accumulates in the caller's dq when that is
 * f32 with rows the kernels can write whole (no extra memory), else in a per-thread
 * f32 buffer; either way the task owns those rows alone. No two tasks write the same output row, and a task's
 * arithmetic is the same whichever thread runs it, so the gradients are bitwise
 * the same for any thread count and any run.
 */
#include "internal.h"
#include "alloc.h"
#include "convert.h"
#include "kv.h"
#include "tasks.h"
#include "threadpool.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t b, hk;
    int64_t cost; /* kept (i, j) pairs times heads */
} bwd_task;

typedef struct {
    const fa_problem *p;
    const fa_grads *g;
    const fa_kernels *kern;
    int64_t br, bc, bp;     /* query rows and keys per tile; the panels' leading dim */
    int64_t ldd, lddv;      /* D, Dv rounded up to FA_ROW_ALIGN: accumulator rows */
    int64_t sq_max;         /* the longest sequence's query rows: the dq buffer's */
    int dq_in_place;        /* dQ accumulates in the caller's f32 dq itself (dq_direct) */
    int b16;                /* bf16 q, k, v, dO multiplied as bf16 pairs (the forward's rule) */
    const float *dvec;      /* (B or 1, Hq, Sq) D_i = dot(dO_i, o_i), laid out as lse */
    int64_t dvec_sb, dvec_sh; /* its strides (b, h); i is contiguous */
    bwd_task *tasks;
    int64_t n_tasks;
    char *workspace;
    int64_t per_thread;
    atomic_llong next;
} bwd_job;

typedef struct {
    float *k, *v;       /* (bc, D), (bc, Dv) K, V rows as f32 when they are not */
    float *q;           /* (br, D)   Q rows as f32 (natural, unscaled), when they are not */
    float *qt;          /* (D, bp)   Q block transposed and scaled */
    float *dout;        /* (br, Dv)  dO rows as f32 */
    float *dot;         /* (Dv, bp)  dO block transposed */
    float *st;          /* (bc, bp)  S^T, then P^T, then P~^T */
    float *dpt;         /* (bc, bp)  dP^T, then dS^T */
    float *xt;          /* (bc, bp)  softcap only: scale * q.k before the softcap */
    float *m, *l, *alpha, *dv_rows; /* (bp) lse of the rows, scratch, scratch, D_i */
    int32_t *lo, *hi;   /* (bp) tile-relative band */
    float *dk, *dv;     /* (bc, ldd), (bc, lddv) the key tile's dK, dV */
    float *dq;          /* (group, sq_max, ldd) the task's dQ */
    /* bf16 pair path only: the same operands kept as bf16, their pair panels, and the
     * kernels' repacking scratch */
    uint16_t *q16, *do16, *k16, *v16, *qt2, *dot2, *pair_scratch;
} bwd_scratch;

static int64_t scratch_layout(const bwd_job *job, bwd_scratch *sc, char *base)
{
    const fa_problem *p = job->p;
    const int64_t D = p->D, Dv = p->Dv, br = job->br, bc = job->bc, bp = job->bp;
    bwd_scratch unused;
    if (!sc) sc = &unused;
    const fa_ws_part parts[] = {
        {(void **)&sc->k, fa_bytes3(bc, D, 4)},          {(void **)&sc->v, fa_bytes3(bc, Dv, 4)},
        {(void **)&sc->q, fa_bytes3(br, D, 4)},          {(void **)&sc->qt, fa_bytes3(D, bp, 4)},
        {(void **)&sc->dout, fa_bytes3(br, Dv, 4)},      {(void **)&sc->dot, fa_bytes3(Dv, bp, 4)},
        {(void **)&sc->st, fa_bytes3(bc, bp, 4)},        {(void **)&sc->dpt, fa_bytes3(bc, bp, 4)},
        {(void **)&sc->xt, p->softcap > 0.0f ? fa_bytes3(bc, bp, 4) : 0},
        {(void **)&sc->m, bp * 4},                       {(void **)&sc->l, bp * 4},
        {(void **)&sc->alpha, bp * 4},                   {(void **)&sc->dv_rows, bp * 4},
        {(void **)&sc->lo, bp * 4},                      {(void **)&sc->hi, bp * 4},
        {(void **)&sc->dk, fa_bytes3(bc, job->ldd, 4)},  {(void **)&sc->dv, fa_bytes3(bc, job->lddv, 4)},
        {(void **)&sc->dq, job->g->has_dq && !job->dq_in_place ? fa_bytes3(p->group * job->sq_max, job->ldd, 4) : 0},
        {(void **)&sc->q16, job->b16 ? fa_bytes3(br, D, 2) : 0},
        {(void **)&sc->do16, job->b16 ? fa_bytes3(br, Dv, 2) : 0},
        {(void **)&sc->k16, job->b16 ? fa_bytes3(bc, D, 2) : 0},
        {(void **)&sc->v16, job->b16 ? fa_bytes3(bc, Dv, 2) : 0},
        {(void **)&sc->qt2, job->b16 ? fa_bytes3((D + 1) / 2, 2 * bp, 2) : 0},
        {(void **)&sc->dot2, job->b16 ? fa_bytes3((Dv + 1) / 2, 2 * bp, 2) : 0},
        /* the larger of pv_bf16's ((bc+1)(D+32) + (bc+1) bp) and stx_bf16's needs */
        {(void **)&sc->pair_scratch,
         job->b16 ? 2 * ((bc + 1) * ((D > Dv ? D : Dv) + 32 + bp) + FA_STX_BF16_SCRATCH(br, bc, (D > Dv ? D : Dv), bp)) : 0},
    };
    return fa_ws_layout(parts, sizeof parts / sizeof parts[0], base);
}

/* Whether dQ can accumulate in the caller's dq: f32, unit inner stride, and every
 * row a whole number of aligned vectors with nothing of another head's in its
 * padding (D a multiple of FA_ROW_ALIGN), as the pv kernel writes acc rows. */
static int dq_direct(const fa_problem *p, const fa_grads *g)
{
    const fa_tensor *t = &g->dq;
    if (!g->has_dq || t->dtype != FA_DTYPE_F32 || t->stride[3] != 1 || p->D % FA_ROW_ALIGN != 0) return 0;
    for (int d = 0; d < 3; d++)
        if (t->stride[d] % FA_ROW_ALIGN != 0 || t->stride[d] < 0) return 0;
    /* sequences of a varlen batch start at any row: still a multiple of the row stride */
    return (uintptr_t)t->data % FA_CACHE_LINE == 0;
}

/* 0. D_i = dot(dO_i, o_i) for every row: what the softmax's backward subtracts. */
static void compute_dvec(const fa_problem *p, const fa_grads *g, float *dvec, int64_t sb, int64_t sh, float *rowa,
                         float *rowb)
{
    for (int64_t b = 0; b < p->B; b++) {
        fa_problem s;
        fa_grads gs;
        fa_seq_view(p, b, &s);
        fa_seq_grads(p, g, b, &gs);
        for (int64_t h = 0; h < p->Hq; h++)
            for (int64_t i = 0; i < s.Sq; i++) {
                fa_pack_rows(&gs.dout, 0, i, 1, h, p->Dv, rowa, p->Dv);
                fa_pack_rows(&s.o, 0, i, 1, h, p->Dv, rowb, p->Dv);
                double d = 0.0; /* in double: D_i is a difference's subtrahend for every column */
                for (int64_t e = 0; e < p->Dv; e++) d += (double)rowa[e] * (double)rowb[e];
                const int64_t row = p->cu_q ? p->cu_q[b] + i : i;
                dvec[(p->cu_q ? 0 : b) * sb + h * sh + row] = (float)d;
            }
    }
}

/* Rows i0 .. i0+n-1 of head h: Q (natural and transposed-scaled), dO (both), the
 * forward's lse, and D_i. Q and dO are f32 rows wherever the tensors are. */
static void load_rows(const bwd_job *job, const bwd_scratch *sc, const fa_problem *s, const fa_grads *gs, int64_t b,
                      int64_t h, int64_t i0, int64_t n, const float **q, int64_t *ldq, const float **dout,
                      int64_t *lddo)
{
    const fa_problem *p = job->p;
    const fa_kernels *kern = job->kern;
    if (job->b16) { /* as bf16 rows and pair panels; qk_bf16 applies the scale itself */
        const uint16_t *q16 = fa_rows_u16(&s->q, 0, i0, n, h, p->D, sc->q16, ldq);
        kern->pack_qt_bf16(n, p->D, q16, *ldq, sc->qt2, 2 * job->bp);
        const uint16_t *d16 = fa_rows_u16(&gs->dout, 0, i0, n, h, p->Dv, sc->do16, lddo);
        if (p->Dv > 0) kern->pack_qt_bf16(n, p->Dv, d16, *lddo, sc->dot2, 2 * job->bp);
        *q = (const float *)q16; /* typed by job->b16 */
        *dout = (const float *)d16;
    } else {
        *q = fa_rows_f32(&s->q, kern, 0, i0, n, h, p->D, sc->q, ldq);
        kern->pack_qt(n, p->D, *q, *ldq, p->scale, sc->qt, job->bp);
        *dout = fa_rows_f32(&gs->dout, kern, 0, i0, n, h, p->Dv, sc->dout, lddo);
        if (p->Dv > 0) kern->pack_qt(n, p->Dv, *dout, *lddo, 1.0f, sc->dot, job->bp);
    }
    const float *lse = s->lse.data;
    const int64_t row0 = p->cu_q ? p->cu_q[b] : 0;
    const float *dv = job->dvec + (p->cu_q ? 0 : b) * job->dvec_sb + h * job->dvec_sh + row0;
    for (int64_t r = 0; r < job->bp; r++) {
        sc->m[r] = r < n ? lse[h * s->lse.stride[1] + (i0 + r) * s->lse.stride[2]] : -INFINITY;
        sc->l[r] = 0.0f; /* the softmax step's running sum: unused here */
        sc->dv_rows[r] = r < n ? dv[i0 + r] : 0.0f;
    }
}

/* One task: every key tile of kv head hk of sequence b, and for each the query
 * blocks of the group that see it. */
static void bwd_task_run(const bwd_job *job, const bwd_scratch *sc, const bwd_task *t)
{
    const fa_problem *p = job->p;
    const fa_kernels *kern = job->kern;
    fa_problem s;
    fa_grads gs;
    fa_seq_view(p, t->b, &s);
    fa_seq_grads(p, job->g, t->b, &gs);
    const int64_t D = p->D, Dv = p->Dv, bp = job->bp, br = job->br, hk = t->hk, h0 = hk * p->group;
    const int elementwise = fa_problem_has_elementwise(&s);
    /* dQ rows of head h: (row, x) at dq_row(h) + row * ldq_acc */
    float *dq_base = NULL;
    int64_t ldq_acc = job->ldd, hstride = s.Sq * job->ldd;
    if (gs.has_dq && job->dq_in_place) {
        dq_base = (float *)gs.dq.data + h0 * gs.dq.stride[2];
        ldq_acc = gs.dq.stride[1];
        hstride = gs.dq.stride[2];
        for (int64_t g = 0; g < p->group; g++)
            for (int64_t i = 0; i < s.Sq; i++) memset(dq_base + g * hstride + i * ldq_acc, 0, (size_t)D * sizeof(float));
    } else if (gs.has_dq) {
        dq_base = sc->dq;
        memset(sc->dq, 0, (size_t)(p->group * s.Sq * job->ldd) * sizeof(float));
    }

    for (int64_t j0 = 0; j0 < s.Sk; j0 += job->bc) {
        const int64_t cols = s.Sk - j0 < job->bc ? s.Sk - j0 : job->bc;
        int64_t ldk, ldv, ilo, ihi;
        memset(sc->dk, 0, (size_t)(cols * job->ldd) * sizeof(float));
        memset(sc->dv, 0, (size_t)(cols * job->lddv) * sizeof(float));
        fa_key_block_rows(&s, j0, j0 + cols - 1, &ilo, &ihi);
        if (ilo <= ihi) {
            const float *k = NULL, *v = NULL;
            const uint16_t *k16 = NULL, *v16 = NULL;
            int kv_finite;
            if (job->b16) {
                k16 = fa_rows_u16(&s.k, 0, j0, cols, hk, D, sc->k16, &ldk);
                v16 = fa_rows_u16(&s.v, 0, j0, cols, hk, Dv, sc->v16, &ldv);
                kv_finite = fa_rows_finite16(k16, ldk, cols, D, 0x7f80u);
            } else {
                k = fa_kv_tile_f32(&s, 0, kern, j0, cols, hk, D, sc->k, &ldk);
                v = fa_kv_tile_f32(&s, 1, kern, j0, cols, hk, Dv, sc->v, &ldv);
                kv_finite = fa_rows_finite(k, ldk, cols, D);
            }
            /* query blocks aligned to br from row 0, as the forward cuts them */
            for (int64_t h = h0; h < h0 + p->group; h++)
                for (int64_t i0 = ilo / br * br; i0 <= ihi; i0 += br) {
                    const int64_t n = s.Sq - i0 < br ? s.Sq - i0 : br;
                    const float *q, *dout;
                    int64_t ldq, lddo;
                    load_rows(job, sc, &s, &gs, t->b, h, i0, n, &q, &ldq, &dout, &lddo);

                    /* forward 1-3: S^T, then its masks and modifiers (x kept for the softcap) */
                    if (job->b16)
                        kern->qk_bf16(n, cols, D, sc->qt2, 2 * bp, k16, ldk, p->scale, sc->st, bp);
                    else
                        kern->qk(n, cols, D, sc->qt, bp, k, ldk, sc->st, bp);
                    if (p->softcap > 0.0f) memcpy(sc->xt, sc->st, (size_t)(cols * bp) * sizeof(float));
                    if (elementwise) fa_scores_finish(&s, 0, h, i0, n, j0, cols, sc->st, bp, 1);
                    const int32_t *tlo = NULL, *thi = NULL;
                    const int partial = elementwise || !fa_tile_band(&s, i0, n, j0, cols, sc->lo, sc->hi);
                    if (partial && !elementwise) tlo = sc->lo, thi = sc->hi;

                    /* forward 4 recomputed: P^T = exp(S^T - lse) (the softmax step with m = lse,
                     * which is the row's final max-and-sum in one number) */
                    kern->softmax(n, cols, sc->st, bp, tlo, thi, sc->m, sc->l, sc->alpha);

                    /* backward of 5 and 8: dP^T = V dO^T, times the dropout factor (Dv = 0:
                     * there is no output, so dP = 0; the kernels need a depth >= 1) */
                    if (Dv == 0)
                        memset(sc->dpt, 0, (size_t)(cols * bp) * sizeof(float));
                    else if (job->b16)
                        kern->qk_bf16(n, cols, Dv, sc->dot2, 2 * bp, v16, ldv, 1.0f, sc->dpt, bp);
                    else
                        kern->qk(n, cols, Dv, sc->dot, bp, v, ldv, sc->dpt, bp);
                    if (s.drop.on)
                        fa_dropout_tile_t(&s.drop, t->b, h, p->Hq, s.q_start + i0, n, s.k_start + j0, cols, sc->dpt, bp);

                    /* backward of 4 (the softmax): dS = P (dP - D); of 2 (softcap): x (1 - tanh^2) */
                    kern->ds(n, cols, sc->st, bp, sc->dpt, bp, sc->dv_rows);
                    if (p->softcap > 0.0f)
                        for (int64_t c = 0; c < cols; c++)
                            for (int64_t r = 0; r < n; r++) {
                                const float th = tanhf(sc->xt[c * bp + r] / p->softcap);
                                sc->dpt[c * bp + r] *= 1.0f - th * th;
                            }

                    /* backward of 5: dV += P~^T dO, with P~ the dropped probabilities */
                    if (s.drop.on)
                        fa_dropout_tile_t(&s.drop, t->b, h, p->Hq, s.q_start + i0, n, s.k_start + j0, cols, sc->st, bp);
                    /* a vector kernel multiplies p = 0 by x too: masked rows that are not
                     * finite take the reference kernels, which skip zeros */
                    float *dq_rows = gs.has_dq ? dq_base + (h - h0) * hstride + i0 * ldq_acc : NULL;
                    if (job->b16) {
                        /* the pair kernels round P~ and dS to bf16, as a naive bf16 backward does */
                        const uint16_t *q16 = (const uint16_t *)q, *d16 = (const uint16_t *)dout;
                        const fa_kernels *kx = partial && !(fa_rows_finite16(d16, lddo, n, Dv, 0x7f80u) &&
                                                            fa_rows_finite16(q16, ldq, n, D, 0x7f80u))
                                                   ? &fa_kernels_ref
                                                   : kern;
                        if (gs.has_dv)
                            kx->stx_bf16(n, cols, Dv, sc->st, bp, d16, lddo, sc->dv, job->lddv, sc->pair_scratch);
                        if (gs.has_dk)
                            kx->stx_bf16(n, cols, D, sc->dpt, bp, q16, ldq, sc->dk, job->ldd, sc->pair_scratch);
                        if (gs.has_dq)
                            (partial && !kv_finite ? &fa_kernels_ref : kern)
                                ->pv_bf16(n, cols, D, sc->dpt, bp, k16, ldk, NULL, dq_rows, ldq_acc, sc->pair_scratch);
                        continue;
                    }
                    const fa_kernels *kx = partial && !(fa_rows_finite(dout, lddo, n, Dv) && fa_rows_finite(q, ldq, n, D))
                                               ? &fa_kernels_ref
                                               : kern;
                    if (gs.has_dv) kx->stx(n, cols, Dv, sc->st, bp, dout, lddo, sc->dv, job->lddv);
                    /* backward of 1, S = scale Q K^T: dK += dS^T Q (scale applied once, at the store) */
                    if (gs.has_dk) kx->stx(n, cols, D, sc->dpt, bp, q, ldq, sc->dk, job->ldd);
                    /* ... and dQ += dS K */
                    if (gs.has_dq)
                        (partial && !kv_finite ? &fa_kernels_ref : kern)
                            ->pv(n, cols, D, sc->dpt, bp, k, ldk, NULL, dq_rows, ldq_acc);
                }
        }
        /* the key tile's gradients are whole: every query row that sees it has run */
        if (gs.has_dk) {
            for (int64_t c = 0; c < cols; c++)
                for (int64_t x = 0; x < D; x++) sc->dk[c * job->ldd + x] *= p->scale;
            fa_store_rows(&gs.dk, 0, j0, cols, hk, D, sc->dk, job->ldd);
        }
        if (gs.has_dv) fa_store_rows(&gs.dv, 0, j0, cols, hk, Dv, sc->dv, job->lddv);
    }
    if (gs.has_dq)
        for (int64_t g = 0; g < p->group; g++) {
            float *dq = dq_base + g * hstride;
            for (int64_t i = 0; i < s.Sq; i++)
                for (int64_t x = 0; x < D; x++) dq[i * ldq_acc + x] *= p->scale;
            if (!job->dq_in_place) fa_store_rows(&gs.dq, 0, 0, s.Sq, h0 + g, D, dq, job->ldd);
        }
}

static void bwd_worker(void *arg, int ith, int nth)
{
    (void)nth;
    bwd_job *job = arg;
    bwd_scratch sc;
    scratch_layout(job, &sc, job->workspace + (int64_t)ith * job->per_thread);
    for (int64_t t; (t = atomic_fetch_add(&job->next, 1)) < job->n_tasks;) bwd_task_run(job, &sc, &job->tasks[t]);
}

static int by_cost_desc(const void *a, const void *b)
{
    const bwd_task *x = a, *y = b;
    if (x->cost != y->cost) return x->cost > y->cost ? -1 : 1;
    if (x->b != y->b) return x->b < y->b ? -1 : 1;
    return (x->hk > y->hk) - (x->hk < y->hk);
}

fa_status fa_backward_tiled(fa_context *ctx, const fa_problem *p, const fa_grads *g, int64_t br, int64_t bc,
                            fa_run_info *info)
{
    bwd_job job = {.p = p, .g = g, .kern = ctx->kernels, .br = br, .bc = bc};
    if (p->B > INT32_MAX || p->Hk > INT32_MAX)
        return fa_fail(ctx, FA_ERR_OVERFLOW, "backward: B = %lld or Hk = %lld exceeds the task index range",
                       (long long)p->B, (long long)p->Hk);
    job.bp = fa_panel_ld(job.br);
    job.ldd = fa_round_up(p->D, FA_ROW_ALIGN); /* D, Dv <= FA_DIM_MAX */
    job.lddv = fa_round_up(p->Dv, FA_ROW_ALIGN);
    for (int64_t b = 0; b < p->B; b++) {
        int64_t sq, sk;
        fa_seq_lengths(p, b, &sq, &sk);
        if (sq > job.sq_max) job.sq_max = sq;
    }
    job.dq_in_place = dq_direct(p, g);
    /* bf16 pairs where the forward takes them (fa_bf16_dot_active), with dO in bf16 too */
    job.b16 = p->dtype == FA_DTYPE_BF16 && g->dout.dtype == FA_DTYPE_BF16 && fa_bf16_dot_active(ctx);
    job.per_thread = scratch_layout(&job, NULL, NULL);

    /* tasks: (sequence, kv head); only sequences with both rows and keys have work,
     * but every (b, hk) is a task so that the empty ones write their zeros */
    int64_t n_tasks;
    if (!fa_mul_ok(p->B, p->Hk, &n_tasks)) return fa_fail(ctx, FA_ERR_OVERFLOW, "backward: B * Hk overflows");
    const int nth = ctx->threads < n_tasks ? ctx->threads : (int)(n_tasks > 0 ? n_tasks : 1);
    /* D_i: laid out (B, Hq, Sq) dense, or (1, Hq, total_q) packed */
    const int64_t rows = p->cu_q ? p->q.shape[1] : p->Sq;
    job.dvec_sh = rows;
    job.dvec_sb = p->cu_q ? 0 : p->Hq * rows;
    float *dvec, *rowa, *rowb;
    const fa_ws_part parts[] = {
        {(void **)&job.workspace, job.per_thread < 0 ? -1 : fa_bytes3(job.per_thread, nth, 1)},
        {(void **)&job.tasks, fa_bytes3(n_tasks, (int64_t)sizeof(bwd_task), 1)},
        {(void **)&dvec, fa_bytes3(p->cu_q ? 1 : p->B, p->Hq * rows, 4)},
        {(void **)&rowa, fa_bytes3(p->Dv, 4, 1)},
        {(void **)&rowb, fa_bytes3(p->Dv, 4, 1)},
    };
    const int64_t bytes = fa_ws_layout(parts, sizeof parts / sizeof parts[0], NULL);
    if (bytes < 0)
        return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "backward: %lld x %lld tiles do not fit in memory", (long long)br,
                       (long long)bc);
    char *ws = fa_context_workspace(ctx, bytes);
    if (!ws)
        return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "backward: cannot allocate %lld bytes of workspace for %lld x %lld tiles",
                       (long long)bytes, (long long)br, (long long)bc);
    fa_ws_layout(parts, sizeof parts / sizeof parts[0], ws);
    job.dvec = dvec;

    compute_dvec(p, g, dvec, job.dvec_sb, job.dvec_sh, rowa, rowb);
    for (int64_t b = 0, t = 0; b < p->B; b++) {
        fa_problem s;
        fa_seq_view(p, b, &s);
        int64_t cost = 0;
        for (int64_t i = 0; i < s.Sq; i++) {
            int64_t lo, hi;
            fa_row_band(&s, i, &lo, &hi);
            if (hi >= lo) cost += hi - lo + 1;
        }
        for (int64_t hk = 0; hk < p->Hk; hk++, t++)
            job.tasks[t] = (bwd_task){.b = (int32_t)b, .hk = (int32_t)hk, .cost = cost * p->group + 1};
    }
    job.n_tasks = n_tasks;
    qsort(job.tasks, (size_t)n_tasks, sizeof *job.tasks, by_cost_desc);
    atomic_init(&job.next, 0);
    if (n_tasks > 0) fa_pool_run(ctx->pool, nth, bwd_worker, &job);
    fa_context_workspace_done(ctx, ws);
    info->extra_bytes = bytes;
    info->br = job.br;
    info->bc = job.bc;
    info->threads = nth;
    info->path = job.b16 ? "bf16-dot" : "f32";
    return FA_OK;
}

fa_status fa_run_flash_backward(fa_context *ctx, const fa_problem *p, const fa_grads *g, fa_run_info *info)
{
    /* the forward's plan, with tiles held to 128: the backward keeps three score
     * tiles and the key tile's dK and dV where the forward keeps one tile */
    fa_plan plan;
    fa_problem plan_p = *p;
    if (plan_p.Sq < 1) plan_p.Sq = 1;
    if (plan_p.Sk < 1) plan_p.Sk = 1;
    fa_plan_tiles(ctx, &plan_p, &plan);
    return fa_backward_tiled(ctx, p, g, plan.br < 128 ? plan.br : 128, plan.bc < 128 ? plan.bc : 128, info);
}
