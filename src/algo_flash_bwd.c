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
 * f32 buffer; either way the task owns those rows alone.
 *
 * Too few such tasks for the threads (one sequence of an MQA model) and the loop
 * runs in two passes instead, as one pool of finer tasks: pass 1 a key tile of a
 * kv head (its dK, dV), pass 2 a query block of a query head (its dQ, recomputing
 * the block's tiles in the fused walk's order). Each gradient's arithmetic is the
 * same in both schedules, and no two tasks write the same output row, so the
 * gradients are bitwise the same for either schedule, any thread count and any run.
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

typedef enum { BWD_FUSED, BWD_KEY_TILE, BWD_QUERY_BLOCK } bwd_task_kind;

typedef struct {
    int32_t b, head; /* sequence; kv head (fused, key tile) or query head (query block) */
    int32_t kind;    /* bwd_task_kind */
    int64_t start;   /* first key (key tile) or query row (query block) */
    int64_t cost;    /* about the kept (i, j) pairs times heads */
} bwd_task;

typedef struct {
    const fa_problem *p;
    const fa_grads *g;
    const fa_kernels *kern;
    int64_t br, bc, bp;     /* query rows and keys per tile; the panels' leading dim */
    int64_t ldd, lddv;      /* D, Dv rounded up to FA_ROW_ALIGN: accumulator rows */
    int64_t sq_max;         /* the longest sequence's query rows: the dq buffer's */
    int dq_in_place;        /* dQ accumulates in the caller's f32 dq itself (dq_direct) */
    int two_pass;           /* pass 1 tasks are key tiles (dK, dV), pass 2 query blocks (dQ) */
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
    uint32_t *k_pairs;  /* (ceil(bc/2), fa_packed_ld(D)) the key tile as row pairs, for dQ += dS K */
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
        {(void **)&sc->dq, !job->g->has_dq || job->dq_in_place ? 0
                           : job->two_pass                    ? fa_bytes3(br, job->ldd, 4)
                                                              : fa_bytes3(p->group * job->sq_max, job->ldd, 4)},
        {(void **)&sc->q16, job->b16 ? fa_bytes3(br, D, 2) : 0},
        {(void **)&sc->do16, job->b16 ? fa_bytes3(br, Dv, 2) : 0},
        {(void **)&sc->k16, job->b16 ? fa_bytes3(bc, D, 2) : 0},
        {(void **)&sc->v16, job->b16 ? fa_bytes3(bc, Dv, 2) : 0},
        {(void **)&sc->qt2, job->b16 ? fa_bytes3((D + 1) / 2, 2 * bp, 2) : 0},
        {(void **)&sc->dot2, job->b16 ? fa_bytes3((Dv + 1) / 2, 2 * bp, 2) : 0},
        /* room for pv_bf16's needs or stx_bf16's */
        {(void **)&sc->pair_scratch,
         job->b16 ? 4 * FA_PV_BF16_SCRATCH(bp, bc, D) + 2 * FA_STX_BF16_SCRATCH(br, bc, (D > Dv ? D : Dv), bp) : 0},
        {(void **)&sc->k_pairs, job->b16 ? fa_bytes3((bc + 1) / 2, fa_packed_ld(D), 4) : 0},
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

/* A key tile's K and V rows, as the products take them. */
typedef struct {
    const float *k, *v;
    const uint16_t *k16, *v16;
    const uint32_t *k_pairs; /* bf16 with dQ: K as row pairs, packed once for every query block */
    int64_t ldk, ldv, ldkp;
    int kv_finite;
} bwd_tile;

static void load_tile(const bwd_job *job, const bwd_scratch *sc, const fa_problem *s, int64_t hk, int64_t j0,
                      int64_t cols, bwd_tile *t)
{
    const int64_t D = job->p->D, Dv = job->p->Dv;
    memset(t, 0, sizeof *t);
    if (job->b16) {
        t->k16 = fa_rows_u16(&s->k, 0, j0, cols, hk, D, sc->k16, &t->ldk);
        t->v16 = fa_rows_u16(&s->v, 0, j0, cols, hk, Dv, sc->v16, &t->ldv);
        t->kv_finite = fa_rows_finite16(t->k16, t->ldk, cols, D, 0x7f80u);
        if (job->g->has_dq) {
            t->ldkp = fa_packed_ld(D);
            job->kern->pack_pairs_bf16(cols, D, t->k16, t->ldk, sc->k_pairs, t->ldkp);
            t->k_pairs = sc->k_pairs;
        }
    } else {
        t->k = fa_kv_tile_f32(s, 0, job->kern, j0, cols, hk, D, sc->k, &t->ldk);
        t->v = fa_kv_tile_f32(s, 1, job->kern, j0, cols, hk, Dv, sc->v, &t->ldv);
        t->kv_finite = fa_rows_finite(t->k, t->ldk, cols, D);
    }
}

/*
 * One (query block, key tile) pair of head h: the whole backward of the tile, with
 * dK and dV of the tile accumulated in sc->dk, sc->dv when kv is set, and dQ of the
 * block in dq_rows (ld ldq_acc) when that is not NULL. The arithmetic of each
 * gradient does not depend on which others are asked for, so the fused loop and
 * the two-pass one (dK, dV first, then dQ) give the same bits.
 */
static void bwd_block(const bwd_job *job, const bwd_scratch *sc, const fa_problem *s, const fa_grads *gs, int64_t b,
                      int64_t h, int64_t i0, int64_t n, int64_t j0, int64_t cols, const bwd_tile *t, int kv,
                      float *dq_rows, int64_t ldq_acc)
{
    const fa_problem *p = job->p;
    const fa_kernels *kern = job->kern;
    const int64_t D = p->D, Dv = p->Dv, bp = job->bp;
    const int elementwise = fa_problem_has_elementwise(s);
    const float *q, *dout;
    int64_t ldq, lddo;
    load_rows(job, sc, s, gs, b, h, i0, n, &q, &ldq, &dout, &lddo);

    /* forward 1-3: S^T, then its masks and modifiers (x kept for the softcap) */
    if (job->b16)
        kern->qk_bf16(n, cols, D, sc->qt2, 2 * bp, t->k16, t->ldk, p->scale, sc->st, bp);
    else
        kern->qk(n, cols, D, sc->qt, bp, t->k, t->ldk, sc->st, bp);
    if (p->softcap > 0.0f) memcpy(sc->xt, sc->st, (size_t)(cols * bp) * sizeof(float));
    if (elementwise) fa_scores_finish(s, 0, h, i0, n, j0, cols, sc->st, bp, 1);
    const int32_t *tlo = NULL, *thi = NULL;
    const int partial = elementwise || !fa_tile_band(s, i0, n, j0, cols, sc->lo, sc->hi);
    if (partial && !elementwise) tlo = sc->lo, thi = sc->hi;

    /* forward 4 recomputed: P^T = exp(S^T - lse) (the softmax step with m = lse,
     * which is the row's final max-and-sum in one number) */
    kern->softmax(n, cols, sc->st, bp, tlo, thi, sc->m, sc->l, sc->alpha);

    /* backward of 5 and 8: dP^T = V dO^T, times the dropout factor (Dv = 0:
     * there is no output, so dP = 0; the kernels need a depth >= 1) */
    if (Dv == 0)
        memset(sc->dpt, 0, (size_t)(cols * bp) * sizeof(float));
    else if (job->b16)
        kern->qk_bf16(n, cols, Dv, sc->dot2, 2 * bp, t->v16, t->ldv, 1.0f, sc->dpt, bp);
    else
        kern->qk(n, cols, Dv, sc->dot, bp, t->v, t->ldv, sc->dpt, bp);
    if (s->drop.on) fa_dropout_tile_t(&s->drop, b, h, p->Hq, s->q_start + i0, n, s->k_start + j0, cols, sc->dpt, bp);

    /* backward of 4 (the softmax): dS = P (dP - D); of 2 (softcap): x (1 - tanh^2) */
    kern->ds(n, cols, sc->st, bp, sc->dpt, bp, sc->dv_rows);
    if (p->softcap > 0.0f)
        for (int64_t c = 0; c < cols; c++)
            for (int64_t r = 0; r < n; r++) {
                const float th = tanhf(sc->xt[c * bp + r] / p->softcap);
                sc->dpt[c * bp + r] *= 1.0f - th * th;
            }

    /* backward of 5: dV += P~^T dO, with P~ the dropped probabilities */
    const int want_dv = kv && gs->has_dv, want_dk = kv && gs->has_dk;
    if (s->drop.on && want_dv)
        fa_dropout_tile_t(&s->drop, b, h, p->Hq, s->q_start + i0, n, s->k_start + j0, cols, sc->st, bp);
    /* a vector kernel multiplies p = 0 by x too: masked rows that are not
     * finite take the reference kernels, which skip zeros */
    const fa_kernels *kq = partial && !t->kv_finite ? &fa_kernels_ref : kern;
    if (job->b16) {
        /* the pair kernels round P~ and dS to bf16, as a naive bf16 backward does */
        const uint16_t *q16 = (const uint16_t *)q, *d16 = (const uint16_t *)dout;
        const fa_kernels *kx = (want_dv || want_dk) && partial &&
                                       !(fa_rows_finite16(d16, lddo, n, Dv, 0x7f80u) &&
                                         fa_rows_finite16(q16, ldq, n, D, 0x7f80u))
                                   ? &fa_kernels_ref
                                   : kern;
        if (want_dv) kx->stx_bf16(n, cols, Dv, sc->st, bp, d16, lddo, sc->dv, job->lddv, sc->pair_scratch);
        if (want_dk) kx->stx_bf16(n, cols, D, sc->dpt, bp, q16, ldq, sc->dk, job->ldd, sc->pair_scratch);
        if (dq_rows) kq->pv_bf16(n, cols, D, sc->dpt, bp, t->k_pairs, t->ldkp, NULL, dq_rows, ldq_acc, sc->pair_scratch);
        return;
    }
    const fa_kernels *kx = (want_dv || want_dk) && partial &&
                                   !(fa_rows_finite(dout, lddo, n, Dv) && fa_rows_finite(q, ldq, n, D))
                               ? &fa_kernels_ref
                               : kern;
    if (want_dv) kx->stx(n, cols, Dv, sc->st, bp, dout, lddo, sc->dv, job->lddv);
    /* backward of 1, S = scale Q K^T: dK += dS^T Q (scale applied once, at the store) */
    if (want_dk) kx->stx(n, cols, D, sc->dpt, bp, q, ldq, sc->dk, job->ldd);
    /* ... and dQ += dS K */
    if (dq_rows) kq->pv(n, cols, D, sc->dpt, bp, t->k, t->ldk, NULL, dq_rows, ldq_acc);
}

/* Key tile j0 of kv head hk: dK, dV from every query block of the group that sees
 * it, then stored (dK scaled once here); dQ of those blocks into dq (NULL: not
 * here), head h's rows at dq + (h - h0) * hstride + row * ldq_acc. */
static void key_tile_run(const bwd_job *job, const bwd_scratch *sc, const fa_problem *s, const fa_grads *gs,
                         int64_t b, int64_t hk, int64_t j0, float *dq, int64_t ldq_acc, int64_t hstride)
{
    const fa_problem *p = job->p;
    const int64_t D = p->D, Dv = p->Dv, br = job->br, h0 = hk * p->group;
    const int64_t cols = s->Sk - j0 < job->bc ? s->Sk - j0 : job->bc;
    const int kv = gs->has_dk || gs->has_dv;
    int64_t ilo, ihi;
    memset(sc->dk, 0, (size_t)(cols * job->ldd) * sizeof(float));
    memset(sc->dv, 0, (size_t)(cols * job->lddv) * sizeof(float));
    fa_key_block_rows(s, j0, j0 + cols - 1, &ilo, &ihi);
    if (ilo <= ihi && (kv || dq)) {
        bwd_tile t;
        load_tile(job, sc, s, hk, j0, cols, &t);
        /* query blocks aligned to br from row 0, as the forward cuts them */
        for (int64_t h = h0; h < h0 + p->group; h++)
            for (int64_t i0 = ilo / br * br; i0 <= ihi; i0 += br) {
                const int64_t n = s->Sq - i0 < br ? s->Sq - i0 : br;
                bwd_block(job, sc, s, gs, b, h, i0, n, j0, cols, &t, kv, dq ? dq + (h - h0) * hstride + i0 * ldq_acc : NULL,
                          ldq_acc);
            }
    }
    /* the key tile's gradients are whole: every query row that sees it has run */
    if (gs->has_dk) {
        for (int64_t c = 0; c < cols; c++)
            for (int64_t x = 0; x < D; x++) sc->dk[c * job->ldd + x] *= p->scale;
        fa_store_rows(&gs->dk, job->kern, 0, j0, cols, hk, D, sc->dk, job->ldd);
    }
    if (gs->has_dv) fa_store_rows(&gs->dv, job->kern, 0, j0, cols, hk, Dv, sc->dv, job->lddv);
}

/* Where head h's dQ rows accumulate: the caller's f32 dq itself, or scratch. */
static float *dq_target(const bwd_job *job, const bwd_scratch *sc, const fa_grads *gs, int64_t h, int64_t *ldq_acc,
                        int64_t *hstride, int64_t sq)
{
    if (job->dq_in_place) {
        *ldq_acc = gs->dq.stride[1];
        *hstride = gs->dq.stride[2];
        return (float *)gs->dq.data + h * gs->dq.stride[2];
    }
    *ldq_acc = job->ldd;
    *hstride = sq * job->ldd;
    return sc->dq;
}

/* n dQ rows of `heads` heads from dq: zeroed before (scratch rows with their
 * padding, which the kernels may touch), scaled and stored after. */
static void dq_rows_clear(const bwd_job *job, float *dq, int64_t ldq_acc, int64_t hstride, int64_t heads, int64_t n)
{
    const int64_t width = job->dq_in_place ? job->p->D : job->ldd;
    for (int64_t g = 0; g < heads; g++)
        for (int64_t i = 0; i < n; i++) memset(dq + g * hstride + i * ldq_acc, 0, (size_t)width * sizeof(float));
}

static void dq_rows_finish(const bwd_job *job, const fa_grads *gs, float *dq, int64_t ldq_acc, int64_t hstride,
                           int64_t h0, int64_t heads, int64_t i0, int64_t n)
{
    const int64_t D = job->p->D;
    for (int64_t g = 0; g < heads; g++) {
        float *rows = dq + g * hstride;
        for (int64_t i = 0; i < n; i++)
            for (int64_t x = 0; x < D; x++) rows[i * ldq_acc + x] *= job->p->scale;
        if (!job->dq_in_place) fa_store_rows(&gs->dq, job->kern, 0, i0, n, h0 + g, D, rows, job->ldd);
    }
}

/*
 * One task. The fused schedule's task is (sequence b, kv head hk): every key tile,
 * with dQ of the group's heads accumulating over the walk. The two-pass schedule,
 * for too few such tasks to fill the threads, has finer ones whose outputs are
 * disjoint: pass 1 is one key tile of hk (dK, dV), pass 2 one query block of query
 * head `head` (dQ), which recomputes the block's tiles (S, P, dP, dS) in the same
 * order as the fused walk and so accumulates dQ bit for bit as it does.
 */
static void bwd_task_run(const bwd_job *job, const bwd_scratch *sc, const bwd_task *t)
{
    const fa_problem *p = job->p;
    fa_problem s;
    fa_grads gs;
    fa_seq_view(p, t->b, &s);
    fa_seq_grads(p, job->g, t->b, &gs);
    int64_t ldq_acc = 0, hstride = 0;
    if (t->kind == BWD_FUSED) {
        const int64_t h0 = (int64_t)t->head * p->group;
        float *dq = gs.has_dq ? dq_target(job, sc, &gs, h0, &ldq_acc, &hstride, s.Sq) : NULL;
        if (dq) dq_rows_clear(job, dq, ldq_acc, hstride, p->group, s.Sq);
        for (int64_t j0 = 0; j0 < s.Sk; j0 += job->bc) key_tile_run(job, sc, &s, &gs, t->b, t->head, j0, dq, ldq_acc, hstride);
        if (dq) dq_rows_finish(job, &gs, dq, ldq_acc, hstride, h0, p->group, 0, s.Sq);
    } else if (t->kind == BWD_KEY_TILE) {
        key_tile_run(job, sc, &s, &gs, t->b, t->head, t->start, NULL, 0, 0);
    } else { /* BWD_QUERY_BLOCK: dQ of rows start .. start+n-1 of head `head` */
        const int64_t h = t->head, i0 = t->start, n = s.Sq - i0 < job->br ? s.Sq - i0 : job->br;
        float *dq = dq_target(job, sc, &gs, h, &ldq_acc, &hstride, s.Sq);
        if (job->dq_in_place) dq += i0 * ldq_acc; /* scratch holds only this block's rows */
        dq_rows_clear(job, dq, ldq_acc, hstride, 1, n);
        for (int64_t j0 = 0; j0 < s.Sk; j0 += job->bc) {
            const int64_t cols = s.Sk - j0 < job->bc ? s.Sk - j0 : job->bc;
            int64_t ilo, ihi;
            fa_key_block_rows(&s, j0, j0 + cols - 1, &ilo, &ihi);
            if (ilo > ihi || i0 > ihi || i0 + job->br <= ilo) continue; /* the fused walk's test */
            bwd_tile kt;
            load_tile(job, sc, &s, h / p->group, j0, cols, &kt);
            bwd_block(job, sc, &s, &gs, t->b, h, i0, n, j0, cols, &kt, 0, dq, ldq_acc);
        }
        dq_rows_finish(job, &gs, dq, ldq_acc, hstride, h, 1, i0, n);
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
    if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
    if (x->b != y->b) return x->b < y->b ? -1 : 1;
    if (x->head != y->head) return x->head < y->head ? -1 : 1;
    return (x->start > y->start) - (x->start < y->start);
}

/* Sequence b's kept (i, j) pairs, for rows [i0, i1) and keys [j0, j1): exact for the
 * whole sequence, about right for a block (the band's mean width at its two ends). */
static int64_t kept_pairs(const fa_problem *s, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int exact)
{
    int64_t cost = 0;
    if (exact) return fa_kept_pairs(s, i0, i1, j0, j1);
    for (int e = 0; e < 2; e++) {
        int64_t lo, hi;
        fa_row_band(s, e ? i1 - 1 : i0, &lo, &hi);
        lo = lo > j0 ? lo : j0, hi = hi < j1 - 1 ? hi : j1 - 1;
        if (hi >= lo) cost += hi - lo + 1;
    }
    return cost / 2 * (i1 - i0);
}

/*
 * Whether the two-pass schedule finishes first. The fused one has B * Hk tasks;
 * when they cannot keep the threads busy (one MQA or GQA sequence on more cores
 * than kv heads), pass 1's key tiles and pass 2's query blocks can, although pass 2
 * recomputes S, P, dP and dS: 7 products instead of 5 when dQ and dK or dV are all
 * asked for, and no more work when only one side is. The fused schedule's time is
 * estimated by its tasks' costs (equal within a sequence): at least the largest, the
 * mean load and ceil(n / threads) of the smallest.
 */
static int two_pass_pays(int threads, int64_t n, double total, double max_cost, double min_cost, int kv, int dq)
{
    if (threads <= 1 || n <= 0) return 0;
    double fused = total / threads;
    if (max_cost > fused) fused = max_cost;
    const double rounds = (double)((n + threads - 1) / threads) * min_cost;
    if (rounds > fused) fused = rounds;
    const double two_pass = (kv && dq ? 7.0 / 5.0 : 1.0) * total / threads;
    return two_pass < 0.95 * fused; /* a clear gain only: the finer tasks cost a little more */
}

/* Fills job->tasks with the two-pass tasks (n1 key tiles, then n2 query blocks). */
static void fill_two_pass(bwd_job *job, int kv, int dq)
{
    const fa_problem *p = job->p;
    int64_t t = 0;
    for (int64_t b = 0; b < p->B; b++) {
        fa_problem s;
        fa_seq_view(p, b, &s);
        if (kv)
            for (int64_t j0 = 0; j0 < s.Sk; j0 += job->bc) {
                const int64_t j1 = s.Sk - j0 < job->bc ? s.Sk : j0 + job->bc;
                int64_t ilo, ihi;
                fa_key_block_rows(&s, j0, j1 - 1, &ilo, &ihi);
                const int64_t c = ilo <= ihi ? kept_pairs(&s, ilo, ihi + 1, j0, j1, 0) : 0;
                for (int64_t hk = 0; hk < p->Hk; hk++)
                    job->tasks[t++] = (bwd_task){(int32_t)b, (int32_t)hk, BWD_KEY_TILE, j0, 4 * c * p->group + 1};
            }
        if (dq)
            for (int64_t i0 = 0; i0 < s.Sq; i0 += job->br) {
                const int64_t i1 = s.Sq - i0 < job->br ? s.Sq : i0 + job->br;
                const int64_t c = s.Sk > 0 ? kept_pairs(&s, i0, i1, 0, s.Sk, 0) : 0;
                for (int64_t h = 0; h < p->Hq; h++)
                    job->tasks[t++] = (bwd_task){(int32_t)b, (int32_t)h, BWD_QUERY_BLOCK, i0, 3 * c + 1};
            }
    }
    job->n_tasks = t;
}

fa_status fa_backward_tiled(fa_context *ctx, const fa_problem *p, const fa_grads *g, int64_t br, int64_t bc,
                            int two_pass_ok, fa_run_info *info)
{
    bwd_job job = {.p = p, .g = g, .kern = ctx->kernels, .br = br, .bc = bc};
    if (p->B > INT32_MAX || p->Hq > INT32_MAX)
        return fa_fail(ctx, FA_ERR_OVERFLOW, "backward: B = %lld or Hq = %lld exceeds the task index range",
                       (long long)p->B, (long long)p->Hq);
    job.bp = fa_panel_ld(job.br);
    job.ldd = fa_round_up(p->D, FA_ROW_ALIGN); /* D, Dv <= FA_DIM_MAX */
    job.lddv = fa_round_up(p->Dv, FA_ROW_ALIGN);
    job.dq_in_place = dq_direct(p, g);
    /* bf16 pairs where the forward takes them (fa_bf16_dot_active), with dO in bf16 too */
    job.b16 = p->dtype == FA_DTYPE_BF16 && g->dout.dtype == FA_DTYPE_BF16 && fa_bf16_dot_active(ctx);

    /* The fused schedule's tasks: (sequence, kv head); only sequences with both rows
     * and keys have work, but every (b, hk) is a task so that the empty ones write
     * their zeros. The two-pass schedule's: every key tile and every query block,
     * empty ones included for the same reason. */
    const int kv = g->has_dk || g->has_dv, dq = g->has_dq;
    int64_t n_fused, n_split = 0, tiles = 0, blocks = 0;
    double total = 0.0, max_cost = 0.0, min_cost = -1.0;
    if (!fa_mul_ok(p->B, p->Hk, &n_fused)) return fa_fail(ctx, FA_ERR_OVERFLOW, "backward: B * Hk overflows");
    for (int64_t b = 0; b < p->B; b++) {
        fa_problem s;
        fa_seq_view(p, b, &s);
        if (s.Sq > job.sq_max) job.sq_max = s.Sq;
        tiles += (s.Sk + bc - 1) / bc, blocks += (s.Sq + br - 1) / br; /* <= the packed lengths */
        const double c = (double)kept_pairs(&s, 0, s.Sq, 0, s.Sk, 1) * (double)p->group + 1.0;
        total += c * (double)p->Hk;
        if (c > max_cost) max_cost = c;
        if (min_cost < 0.0 || c < min_cost) min_cost = c;
    }
    int64_t n1 = 0, n2 = 0;
    job.two_pass = two_pass_ok && two_pass_pays(ctx->threads, n_fused, total, max_cost, min_cost, kv, dq) &&
                   fa_mul_ok(kv ? tiles : 0, p->Hk, &n1) && fa_mul_ok(dq ? blocks : 0, p->Hq, &n2) &&
                   fa_add_ok(n1, n2, &n_split);
    const int64_t n_tasks = job.two_pass ? n_split : n_fused;
    job.per_thread = scratch_layout(&job, NULL, NULL);
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
    if (job.two_pass) {
        fill_two_pass(&job, kv, dq);
    } else {
        for (int64_t b = 0, t = 0; b < p->B; b++) {
            fa_problem s;
            fa_seq_view(p, b, &s);
            const int64_t cost = kept_pairs(&s, 0, s.Sq, 0, s.Sk, 1) * p->group + 1;
            for (int64_t hk = 0; hk < p->Hk; hk++, t++)
                job.tasks[t] = (bwd_task){(int32_t)b, (int32_t)hk, BWD_FUSED, 0, cost};
        }
        job.n_tasks = n_fused;
    }
    qsort(job.tasks, (size_t)job.n_tasks, sizeof *job.tasks, by_cost_desc);
    atomic_init(&job.next, 0);
    if (job.n_tasks > 0) fa_pool_run(ctx->pool, nth, bwd_worker, &job);
    fa_context_workspace_done(ctx, ws);
    info->extra_bytes = bytes;
    info->br = job.br;
    info->bc = job.bc;
    info->threads = nth;
    info->path = job.b16 ? "bf16-dot" : "f32";
    info->backward_passes = two_pass_ok ? 1 + job.two_pass : 0;
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
    return fa_backward_tiled(ctx, p, g, plan.br < 128 ? plan.br : 128, plan.bc < 128 ? plan.bc : 128, 1, info);
}
