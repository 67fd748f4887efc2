/*
 * algo_flash_bwd.c: the FlashAttention backward on the CPU, the mirror of
 * algo_flash.c. It never holds an N x N matrix: for each tile it recomputes the
 * scores S from q and k and the probabilities P from the forward's lse, then
 * takes the five products of the backward on the same transposed tiles the
 * forward uses (kernels.h). Steps are numbered as in docs/semantics.md, section 3:
 *
 *   forward step                             backward (this file)
 *   1.   S^T  = K (scale Q)^T      qk        dP^T = V dO^T (of 9)           qk
 *   2-5. softcap, bias, ALiBi,     finish    dS^T = P^T (dP^T - D) (of 7)   ds, then x (1 - tanh^2) (of 2)
 *        masks
 *   6-7. P^T  = exp(S^T - m)       softmax   P^T  = exp(S^T - lse)          softmax with m = lse
 *   8.   dropout: P *= keep/pk               dP *= keep/pk, P~ = P keep/pk
 *   9.   O   += P V                pv        dV  += P~^T dO (of 9)          stx
 *                                            dK  += scale dS^T Q (of 1)     stx
 *                                            dQ  += scale dS K (of 1)       pv
 * with D_i = dot(dO_i, o_i), one number per row, computed first.
 *
 * On a table with its own fused tile (FA_KERNELS_BWD_BF16: amx, amx-model), bf16 pairs
 * without element-wise rules, softcap or dropout run each (query block, key tile) pair
 * as one call, bwd_bf16 (kernels.h): the same steps on row-major tiles, dK and dV kept
 * transposed per key tile (added into dk, dv when the tile is done), Q^T and dO^T packed
 * once per query block. A pair it cannot take (a block mask that is not one run of keys
 * per row, masked keys with non-finite K, Q or dO) runs on the kernels above instead.
 *
 * The loop is K-outer: a task is one (sequence, kv head); it walks the key tiles in
 * groups of BWD_GROUP_MAX, keeping dK and dV of the group's tiles in cache, and for
 * each group only the query blocks of the group's heads that see one of its tiles
 * (fa_key_block_rows, the planner's inverse question), whose rows are loaded once
 * for all of them. dQ of the task's heads accumulates in the caller's dq when that
 * is f32 with rows the kernels can write whole and reuse (no extra memory), else in
 * a per-thread f32 buffer; either way the task owns those rows alone.
 *
 * Too few such tasks for the threads (one sequence of an MQA model) and the loop
 * runs in two passes instead, as one pool of finer tasks: pass 1 a key tile of a
 * kv head (its dK, dV), pass 2 a query block of a query head (its dQ, recomputing
 * the block's tiles in the fused walk's order). Each gradient's arithmetic is the
 * same in both schedules, and no two tasks write the same output row, so the
 * gradients are bitwise the same for either schedule, any thread count and any run.
 * Which schedule runs, and its tasks in order, are tasks.c's (fa_bwd_tasks_count,
 * fa_bwd_tasks_fill); this file runs a task.
 */
#include "algos.h"
#include "workspace.h"
#include "arith.h"
#include "alloc.h"
#include "convert.h"
#include "kv.h"
#include "tasks.h"
#include "threadpool.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* Key tiles a query block's rows are loaded for at once in the fused walk: its Q and
 * dO (gathered, transposed, scaled) serve that many tiles (kernels.h's products run
 * per tile, as before, so the bits do not change). */
enum { BWD_GROUP_MAX = 4 };

typedef struct bwd_path bwd_path;

typedef struct {
    const fa_problem *p;
    const fa_grads *g;
    const fa_kernels *kern;
    const bwd_path *path;   /* the products' operand path (bwd_paths), chosen once per job */
    int64_t br, bc, bp;     /* query rows and keys per tile; the panels' leading dim */
    int64_t ldd, lddv;      /* D, Dv rounded up to FA_ROW_ALIGN: accumulator rows */
    int64_t sq_max;         /* the longest sequence's query rows: the dq buffer's */
    int64_t group_tiles;    /* key tiles per step of the fused walk, 1 .. BWD_GROUP_MAX */
    int dq_in_place;        /* dQ accumulates in the caller's f32 dq itself (dq_direct) */
    int two_pass;           /* pass 1 tasks are key tiles (dK, dV), pass 2 query blocks (dQ) */
    int b16;                /* bf16 q, k, v, dO multiplied as bf16 pairs (the forward's rule) */
    int tiles;              /* b16 pairs take the table's fused tile (bwd_bf16) where they can */
    int kv_pack;            /* f32 path: each key tile's K, V rows copied to kv_layout's rows first */
    fa_kv_packing kv_layout; /* f32 rows fa_packed_ld apart, one unit of bc keys */
    const float *dvec;      /* (B or 1, Hq, Sq) D_i = dot(dO_i, o_i), laid out as lse */
    int64_t dvec_sb, dvec_sh; /* its strides (b, h); i is contiguous */
    fa_phases *phases;      /* the verbose trace's profile (profile.h): S, X, dP, dS, dV, dK, dQ */
    fa_bwd_task *tasks;     /* tasks.c's, most expensive first */
    int64_t n_tasks;
    char *workspace;
    int64_t per_thread;
    atomic_llong next;
} bwd_job;

/* One key tile's operands and gradients, as the products take them. */
typedef struct {
    float *k, *v;       /* (bc, D), (bc, Dv) K, V rows as f32 when they are not */
    char *kv;           /* kv_pack: K, V rows as job->kv_layout lays them out */
    uint16_t *k16, *v16; /* bf16 pair path: (bc, D), (bc, Dv) K, V rows as bf16 */
    uint32_t *k_pairs;  /* (ceil(bc/2), fa_packed_ld(D)) bf16 pair path: K as row pairs, for dQ += dS K */
    float *dk, *dv;     /* (bc, ldd), (bc, lddv) the key tile's dK, dV */
    /* the fused tile (job->tiles): K^T, V^T blocks, K pairs to whole 32 keys, dK^T, dV^T */
    uint32_t *kt, *vt, *kp;
    float *dkt, *dvt;
} bwd_tile_scratch;

typedef struct {
    float *q;           /* (br, D)   Q rows as f32 (natural, unscaled), when they are not */
    float *qt;          /* (D, bp)   Q block transposed and scaled */
    float *dout;        /* (br, Dv)  dO rows as f32 */
    float *dot;         /* (Dv, bp)  dO block transposed */
    float *st;          /* (bc, bp)  S^T, then P^T, then P~^T */
    float *dpt;         /* (bc, bp)  dP^T, then dS^T */
    float *xt;          /* (bc, bp)  softcap only: scale * q.k before the softcap */
    float *lse, *m, *l, *alpha, *dv_rows; /* (bp) lse of the rows, softmax's m, scratch, scratch, D_i */
    int32_t *lo, *hi;   /* (bp) tile-relative band */
    int64_t *bms;       /* the block mask's statuses of a tile's kv blocks (fa_bmask_scratch) */
    float *dq;          /* (group, sq_max, ldd) the task's dQ */
    /* bf16 pair path only: the same operands kept as bf16, their pair panels, and the
     * kernels' repacking scratch */
    uint16_t *q16, *do16, *qt2, *dot2, *pair_scratch;
    /* the fused tile only: Q, dO rows zero-padded, Q^T, dO^T, the kernel's scratch */
    uint16_t *qpad, *dopad, *qT, *doT;
    void *tile_scratch;
    bwd_tile_scratch tile[BWD_GROUP_MAX]; /* group_tiles of them */
} bwd_scratch;

static int64_t scratch_layout(const bwd_job *job, bwd_scratch *sc, char *base)
{
    const fa_problem *p = job->p;
    const int64_t D = p->D, Dv = p->Dv, br = job->br, bc = job->bc, bp = job->bp;
    bwd_scratch unused;
    if (!sc) sc = &unused;
    enum { ROW_PARTS = 26, TILE_PARTS = 13 };
    const int tl = job->tiles;
    const int64_t br16 = FA_RUP16(br), ldt = FA_RUP32(br), lddt = FA_RUP16(bc) + 16;
    fa_ws_part parts[ROW_PARTS + TILE_PARTS * BWD_GROUP_MAX] = {
        {(void **)&sc->q, fa_bytes3(br, D, 4)},          {(void **)&sc->qt, fa_bytes3(D, bp, 4)},
        {(void **)&sc->dout, fa_bytes3(br, Dv, 4)},      {(void **)&sc->dot, fa_bytes3(Dv, bp, 4)},
        {(void **)&sc->st, fa_bytes3(bc, bp, 4)},        {(void **)&sc->dpt, fa_bytes3(bc, bp, 4)},
        {(void **)&sc->xt, p->softcap > 0.0f ? fa_bytes3(bc, bp, 4) : 0},
        {(void **)&sc->lse, bp * 4},                     {(void **)&sc->m, bp * 4},
        {(void **)&sc->l, bp * 4},                       {(void **)&sc->alpha, bp * 4},
        {(void **)&sc->dv_rows, bp * 4},                 {(void **)&sc->lo, bp * 4},
        {(void **)&sc->hi, bp * 4},                      {(void **)&sc->bms, fa_bmask_scratch(p, bc) * 8},
        {(void **)&sc->dq, !job->g->has_dq || job->dq_in_place ? 0
                           : job->two_pass                    ? fa_bytes3(br, job->ldd, 4)
                                                              : fa_bytes3(p->group * job->sq_max, job->ldd, 4)},
        {(void **)&sc->q16, job->b16 ? fa_bytes3(br, D, 2) : 0},
        {(void **)&sc->do16, job->b16 ? fa_bytes3(br, Dv, 2) : 0},
        {(void **)&sc->qt2, job->b16 ? fa_bytes3((D + 1) / 2, 2 * bp, 2) : 0},
        {(void **)&sc->dot2, job->b16 ? fa_bytes3((Dv + 1) / 2, 2 * bp, 2) : 0},
        /* room for pv_bf16's needs or stx_bf16's */
        {(void **)&sc->pair_scratch,
         job->b16 ? 4 * FA_PV_BF16_SCRATCH(bp, bc, D) + 2 * FA_STX_BF16_SCRATCH(br, bc, (D > Dv ? D : Dv), bp) : 0},
        {(void **)&sc->qpad, tl ? fa_bytes3(br16, FA_RUP32(D), 2) : 0},
        {(void **)&sc->dopad, tl ? fa_bytes3(br16, FA_RUP32(Dv), 2) : 0},
        {(void **)&sc->qT, tl ? fa_bytes3(FA_RUP16(D), ldt, 2) : 0},
        {(void **)&sc->doT, tl ? fa_bytes3(FA_RUP16(Dv), ldt, 2) : 0},
        {(void **)&sc->tile_scratch, tl ? FA_BWD_BF16_SCRATCH(br, bc, D) : 0},
    };
    size_t n = ROW_PARTS;
    for (int64_t i = 0; i < job->group_tiles; i++) {
        bwd_tile_scratch *t = &sc->tile[i];
        const fa_ws_part tile[TILE_PARTS] = {
            {(void **)&t->k, job->kv_pack || job->b16 ? 0 : fa_bytes3(bc, D, 4)},
            {(void **)&t->v, job->kv_pack || job->b16 ? 0 : fa_bytes3(bc, Dv, 4)},
            {(void **)&t->kv, job->kv_pack ? job->kv_layout.unit_bytes : 0},
            {(void **)&t->k16, job->b16 ? fa_bytes3(bc, D, 2) : 0},
            {(void **)&t->v16, job->b16 ? fa_bytes3(bc, Dv, 2) : 0},
            {(void **)&t->k_pairs, job->b16 ? fa_bytes3((bc + 1) / 2, fa_packed_ld(D), 4) : 0},
            {(void **)&t->dk, fa_bytes3(bc, job->ldd, 4)},
            {(void **)&t->dv, fa_bytes3(bc, job->lddv, 4)},
            {(void **)&t->kt, tl ? fa_bytes3(FA_KT_DWORDS(bc, D), 4, 1) : 0},
            {(void **)&t->vt, tl ? fa_bytes3(FA_KT_DWORDS(bc, Dv), 4, 1) : 0},
            {(void **)&t->kp, tl ? fa_bytes3(FA_RUP32(bc) / 2, fa_packed_ld(D), 4) : 0},
            {(void **)&t->dkt, tl ? fa_bytes3(FA_RUP16(D), lddt, 4) : 0},
            {(void **)&t->dvt, tl ? fa_bytes3(FA_RUP16(Dv), lddt, 4) : 0},
        };
        for (int j = 0; j < TILE_PARTS; j++) parts[n++] = tile[j];
    }
    return fa_ws_layout(parts, n, base);
}

/* Whether dQ can accumulate in the caller's dq: f32, unit inner stride, and every
 * row a whole number of aligned vectors with nothing of another head's in its
 * padding (D a multiple of FA_ROW_ALIGN), as the pv kernel writes acc rows. Rows
 * far apart (a page or more, or a multiple of 1 KB: the heads of a (B, S, H, D)
 * dq) accumulate in scratch instead: the walk revisits all of a head's rows for
 * every key tile, and such rows share a few cache sets and each its own TLB entry. */
static int dq_direct(const fa_problem *p, const fa_grads *g)
{
    const fa_tensor *t = &g->dq;
    if (!g->has_dq || t->dtype != FA_DTYPE_F32 || t->stride[3] != 1 || p->D % FA_ROW_ALIGN != 0) return 0;
    if (fa_rows_scattered(t->stride[1] * (int64_t)sizeof(float))) return 0;
    for (int d = 0; d < 3; d++)
        if (t->stride[d] % FA_ROW_ALIGN != 0 || t->stride[d] < 0) return 0;
    /* sequences of a varlen batch start at any row: still a multiple of the row stride */
    return (uintptr_t)t->data % FA_CACHE_LINE == 0;
}

/* Before the tiles: D_i = dot(dO_i, o_i) for every row, what the backward of step 7
 * (the softmax) subtracts; and the sinks' gradient, the backward of step 6 for the
 * sink's column, which has no value (dp = 0): dsink_h = -sum_{b,i} exp(sink_h - lse_i) D_i.
 * The threads take whole heads, and each head's sum runs in one fixed order (b, i),
 * so no thread count moves its bits. */
typedef struct {
    const fa_problem *p;
    const fa_kernels *kern;
    const fa_grads *g;
    float *dvec;
    int64_t sb, sh;
    float *rows;   /* (threads, 2, Dv) scratch: a dO row and an o row as f32 */
    atomic_llong next;
} dvec_job;

static void dvec_worker(void *arg, int ith, int nth)
{
    (void)nth;
    dvec_job *job = arg;
    const fa_problem *p = job->p;
    float *rowa = job->rows + (int64_t)ith * 2 * p->Dv, *rowb = rowa + p->Dv;
    for (int64_t h; (h = atomic_fetch_add(&job->next, 1)) < p->Hq;) {
        double sum = 0.0;
        for (int64_t b = 0; b < p->B; b++) {
            fa_view s;
            fa_grads gs;
            fa_seq_view(p, b, &s);
            fa_seq_grads(p, job->g, b, &gs);
            for (int64_t i = 0; i < s.Sq; i++) {
                double d = 0.0; /* in double: D_i is a difference's subtrahend for every column */
                if (p->Dv > 0) { /* Dv = 0: no output, D_i = 0 (and no rows to read) */
                    fa_pack_rows(&gs.dout, job->kern, 0, i, 1, h, p->Dv, rowa, p->Dv);
                    fa_pack_rows(&s.o, job->kern, 0, i, 1, h, p->Dv, rowb, p->Dv);
                    for (int64_t e = 0; e < p->Dv; e++) d += (double)rowa[e] * (double)rowb[e];
                }
                const int64_t row = p->cu_q ? p->cu_q[b] + i : i;
                job->dvec[(p->cu_q ? 0 : b) * job->sb + h * job->sh + row] = (float)d;
                const float sink = fa_sink(p, h), lse = ((const float *)s.lse.data)[h * s.lse.stride[1] + i * s.lse.stride[2]];
                if (job->g->dsinks && sink != -INFINITY) sum -= exp((double)sink - lse) * d;
            }
        }
        if (job->g->dsinks) job->g->dsinks[h] = (float)sum;
    }
}

static void compute_dvec(fa_context *ctx, dvec_job *job)
{
    const int64_t hq = job->p->Hq;
    atomic_init(&job->next, 0);
    fa_pool_run(ctx->pool, ctx->threads < hq ? ctx->threads : (int)(hq > 0 ? hq : 1), dvec_worker, job);
}

/* A query block's Q and dO rows (natural, unscaled), as the products take them: f32
 * rows, or bf16 rows on the pair path (job->b16), the other pair NULL. */
typedef struct {
    const float *q, *dout;
    const uint16_t *q16, *do16;
    int64_t ldq, lddo;
    /* the fused tile (job->tiles): its A operands, whether the rows are finite, and
     * whether the pair panels of the other kernels are packed yet (only for a tile that
     * falls back to them) */
    const uint16_t *qa, *doa;
    int64_t ldqa, lddoa;
    int finite, panels; /* finite: -1 not known yet */
} bwd_rows;

/* n rows of bf16 as a tile's A operand: in place where the kernel can read them whole
 * (len a multiple of 32, n of 16, rows close together), else zero-padded into pad. */
static const uint16_t *tile_rows(const uint16_t *rows, int64_t ld, int64_t n, int64_t len, uint16_t *pad,
                                 int64_t *lda)
{
    if (len % 32 == 0 && n % 16 == 0 && !fa_rows_scattered(ld * 2)) {
        *lda = ld;
        return rows;
    }
    const int64_t w = FA_RUP32(len);
    for (int64_t r = 0; r < FA_RUP16(n); r++) {
        if (r < n) memcpy(pad + r * w, rows + r * ld, (size_t)len * 2);
        memset(pad + r * w + (r < n ? len : 0), 0, (size_t)(r < n ? w - len : w) * 2);
    }
    *lda = w;
    return pad;
}

/* The pair panels qt2, dot2 of the other bf16 kernels, packed once a tile needs them. */
static void rows_panels(const bwd_job *job, const bwd_scratch *sc, int64_t n, bwd_rows *rw)
{
    if (rw->panels) return;
    rw->panels = 1;
    job->kern->pack_qt_bf16(n, job->p->D, rw->q16, rw->ldq, sc->qt2, 2 * job->bp);
    if (job->p->Dv > 0) job->kern->pack_qt_bf16(n, job->p->Dv, rw->do16, rw->lddo, sc->dot2, 2 * job->bp);
}

/* Rows i0 .. i0+n-1 of head h of t as f32 rows: in place where they are f32 and
 * close together, else in scratch (ld len). Rows far apart (fa_rows_scattered: the
 * heads of a (B, S, H, D) tensor) are gathered once here rather than read by each of
 * the transposes and stx's panels, since such rows share a few cache sets and miss. */
static const float *block_rows(const fa_kernels *kern, const fa_tensor *t, int64_t i0, int64_t n, int64_t h,
                               int64_t len, float *scratch, int64_t *ld)
{
    const float *rows = fa_rows_f32(t, kern, 0, i0, n, h, len, scratch, ld);
    if (rows == scratch || !fa_rows_scattered(*ld * (int64_t)sizeof(float))) return rows;
    for (int64_t r = 0; r < n; r++) memcpy(scratch + r * len, rows + r * *ld, (size_t)len * sizeof(float));
    *ld = len;
    return scratch;
}

/* Rows i0 .. i0+n-1 of head h as the bf16 path takes them: bf16 rows and pair panels
 * (qk_bf16 applies the scale itself). */
static void rows_bf16(const bwd_job *job, const bwd_scratch *sc, const fa_view *s, const fa_grads *gs, int64_t h,
                      int64_t i0, int64_t n, bwd_rows *rw)
{
    const fa_problem *p = job->p;
    rw->q16 = fa_rows_u16(&s->q, 0, i0, n, h, p->D, sc->q16, &rw->ldq);
    rw->do16 = fa_rows_u16(&gs->dout, 0, i0, n, h, p->Dv, sc->do16, &rw->lddo);
    rows_panels(job, sc, n, rw);
}

/* ... the fused tile's (bwd_bf16): bf16 rows as its A tiles, Q^T and dO^T (FA_RUP32(br)
 * apart); the pair panels only where a pair falls back (rows_panels). */
static void rows_tiles(const bwd_job *job, const bwd_scratch *sc, const fa_view *s, const fa_grads *gs, int64_t h,
                       int64_t i0, int64_t n, bwd_rows *rw)
{
    const fa_problem *p = job->p;
    const fa_kernels *kern = job->kern;
    const int64_t ldt = FA_RUP32(job->br);
    rw->q16 = fa_rows_u16(&s->q, 0, i0, n, h, p->D, sc->q16, &rw->ldq);
    rw->do16 = fa_rows_u16(&gs->dout, 0, i0, n, h, p->Dv, sc->do16, &rw->lddo);
    rw->qa = tile_rows(rw->q16, rw->ldq, n, p->D, sc->qpad, &rw->ldqa);
    rw->doa = tile_rows(rw->do16, rw->lddo, n, p->Dv, sc->dopad, &rw->lddoa);
    kern->pack_t_bf16(n, p->D, rw->q16, rw->ldq, sc->qT, ldt);
    kern->pack_t_bf16(n, p->Dv, rw->do16, rw->lddo, sc->doT, ldt);
    rw->finite = -1; /* asked only by a tile with masked keys */
}

/* ... the f32 path: f32 rows, Q transposed and scaled, dO transposed. */
static void rows_f32(const bwd_job *job, const bwd_scratch *sc, const fa_view *s, const fa_grads *gs, int64_t h,
                     int64_t i0, int64_t n, bwd_rows *rw)
{
    const fa_problem *p = job->p;
    const fa_kernels *kern = job->kern;
    rw->q = block_rows(kern, &s->q, i0, n, h, p->D, sc->q, &rw->ldq);
    kern->pack_qt(n, p->D, rw->q, rw->ldq, p->scale, sc->qt, job->bp);
    rw->dout = block_rows(kern, &gs->dout, i0, n, h, p->Dv, sc->dout, &rw->lddo);
    if (p->Dv > 0) kern->pack_qt(n, p->Dv, rw->dout, rw->lddo, 1.0f, sc->dot, job->bp);
}

/* A key tile's K and V rows, as the products take them, and where its dK, dV sum. */
typedef struct {
    const float *k, *v;
    const uint16_t *k16, *v16;
    const uint32_t *k_pairs; /* bf16 with dQ: K as row pairs, packed once for every query block */
    int64_t ldk, ldv, ldkp;
    int kv_finite;           /* -1: not known yet (tile_kv_finite) */
    int64_t cols;
    int fell_back;           /* the fused tile: a pair ran on the other kernels, into dk, dv */
    float *dk, *dv;          /* (cols, ldd), (cols, lddv) */
    const uint32_t *kt, *vt; /* the fused tile's K^T, V^T; its dK^T, dV^T */
    float *dkt, *dvt;
} bwd_tile;

/* A key tile's rows on the bf16 path: bf16 rows, and K as row pairs for dQ. */
static void tile_bf16(const bwd_job *job, const bwd_tile_scratch *sc, const fa_view *s, int64_t hk, int64_t j0,
                      int64_t cols, bwd_tile *t)
{
    const int64_t D = job->p->D, Dv = job->p->Dv;
    t->k16 = fa_rows_u16(&s->k, 0, j0, cols, hk, D, sc->k16, &t->ldk);
    t->v16 = fa_rows_u16(&s->v, 0, j0, cols, hk, Dv, sc->v16, &t->ldv);
    t->kv_finite = fa_rows_finite16(t->k16, t->ldk, cols, D, 0x7f80u);
    if (job->g->has_dq) {
        t->ldkp = fa_packed_ld(D);
        job->kern->pack_pairs_bf16(cols, D, t->k16, t->ldk, sc->k_pairs, t->ldkp);
        t->k_pairs = sc->k_pairs;
    }
}

/* ... on the fused tile's path: K^T, V^T blocks (the last one's missing keys 0), and K
 * pairs to 32 keys for dQ (the other kernels' too, should a pair fall back). */
static void tile_tiles(const bwd_job *job, const bwd_tile_scratch *sc, const fa_view *s, int64_t hk, int64_t j0,
                       int64_t cols, bwd_tile *t)
{
    const int64_t D = job->p->D, Dv = job->p->Dv;
    t->k16 = fa_rows_u16(&s->k, 0, j0, cols, hk, D, sc->k16, &t->ldk);
    t->v16 = fa_rows_u16(&s->v, 0, j0, cols, hk, Dv, sc->v16, &t->ldv);
    t->kv_finite = -1; /* asked only for a pair with masked keys (tile_kv_finite) */
    const int64_t cp = FA_RUP16(cols);
    if (cp > cols) {
        memset(sc->kt + (cp - 16) * FA_KT_PAIRS(D), 0, (size_t)(16 * FA_KT_PAIRS(D)) * 4);
        memset(sc->vt + (cp - 16) * FA_KT_PAIRS(Dv), 0, (size_t)(16 * FA_KT_PAIRS(Dv)) * 4);
    }
    job->kern->pack_kt_bf16(cols, D, t->k16, t->ldk, sc->kt, 0);
    job->kern->pack_kt_bf16(cols, Dv, t->v16, t->ldv, sc->vt, 0);
    t->ldkp = fa_packed_ld(D);
    if (job->g->has_dq) {
        job->kern->pack_pairs_bf16(cols, D, t->k16, t->ldk, sc->kp, t->ldkp);
        const int64_t done = (cols + 1) / 2;
        memset(sc->kp + done * t->ldkp, 0, (size_t)((FA_RUP32(cols) / 2 - done) * t->ldkp) * 4);
    }
    t->k_pairs = sc->kp;
    t->kt = sc->kt, t->vt = sc->vt, t->dkt = sc->dkt, t->dvt = sc->dvt;
}

/* ... on the f32 path: packed (job->kv_pack), in place or converted. */
static void tile_f32(const bwd_job *job, const bwd_tile_scratch *sc, const fa_view *s, int64_t hk, int64_t j0,
                     int64_t cols, bwd_tile *t)
{
    const fa_problem *p = job->p;
    const int64_t D = job->p->D, Dv = job->p->Dv;
    if (job->kv_pack) {
        fa_kv_pack_rows(p, s, job->kern, &job->kv_layout, hk, j0, cols, j0, sc->kv, NULL, NULL, NULL);
        t->k = (const float *)sc->kv;
        t->v = (const float *)(sc->kv + job->kv_layout.v_offset);
        t->ldk = job->kv_layout.ldk;
        t->ldv = job->kv_layout.ldv;
        t->kv_finite = fa_rows_finite(t->k, t->ldk, cols, D);
    } else {
        t->k = fa_kv_tile_f32(p, s, 0, job->kern, j0, cols, hk, D, sc->k, &t->ldk);
        t->v = fa_kv_tile_f32(p, s, 1, job->kern, j0, cols, hk, Dv, sc->v, &t->ldv);
        t->kv_finite = fa_rows_finite(t->k, t->ldk, cols, D);
    }
}

/* What the gradient products of one (query block, key tile) pair take (bwd_block). */
typedef struct {
    const bwd_rows *rw;
    const bwd_tile *t;
    int64_t n, cols;
    int want_dv, want_dk;
    const fa_kernels *kq, *kx; /* dQ's kernels, and dK's and dV's (bwd_block: the careful ones where needed) */
    float *dq_rows;
    int64_t ldq_acc;
} bwd_grads_in;

/* S^T = K (scale Q)^T, and dP^T = V dO^T, on each path. */
static void scores_bf16(const bwd_job *job, const bwd_scratch *sc, const bwd_tile *t, int64_t n, int64_t cols)
{
    job->kern->qk_bf16(n, cols, job->p->D, sc->qt2, 2 * job->bp, t->k16, t->ldk, job->p->scale, sc->st, job->bp);
}

static void scores_f32(const bwd_job *job, const bwd_scratch *sc, const bwd_tile *t, int64_t n, int64_t cols)
{
    job->kern->qk(n, cols, job->p->D, sc->qt, job->bp, t->k, t->ldk, sc->st, job->bp);
}

static void dp_bf16(const bwd_job *job, const bwd_scratch *sc, const bwd_tile *t, int64_t n, int64_t cols)
{
    job->kern->qk_bf16(n, cols, job->p->Dv, sc->dot2, 2 * job->bp, t->v16, t->ldv, 1.0f, sc->dpt, job->bp);
}

static void dp_f32(const bwd_job *job, const bwd_scratch *sc, const bwd_tile *t, int64_t n, int64_t cols)
{
    job->kern->qk(n, cols, job->p->Dv, sc->dot, job->bp, t->v, t->ldv, sc->dpt, job->bp);
}

/* Whether the block's Q and dO rows are finite, on each path (bwd_block's choice of
 * careful kernels). */
static int rows_finite_bf16(const bwd_rows *rw, int64_t n, int64_t D, int64_t Dv)
{
    return fa_rows_finite16(rw->do16, rw->lddo, n, Dv, 0x7f80u) && fa_rows_finite16(rw->q16, rw->ldq, n, D, 0x7f80u);
}

static int rows_finite_f32(const bwd_rows *rw, int64_t n, int64_t D, int64_t Dv)
{
    return fa_rows_finite(rw->dout, rw->lddo, n, Dv) && fa_rows_finite(rw->q, rw->ldq, n, D);
}

/* The gradients' products: dV += P~^T dO, dK += dS^T Q, dQ += dS K. On the bf16 path
 * the pair kernels round P~ and dS to bf16, as a naive bf16 backward does. */
static void grads_bf16(const bwd_job *job, const bwd_scratch *sc, const bwd_grads_in *in, double t0)
{
    const bwd_rows rw = *in->rw;
    const bwd_tile *t = in->t;
    const fa_kernels *kq = in->kq, *kx = in->kx;
    const int64_t D = job->p->D, Dv = job->p->Dv, bp = job->bp, n = in->n, cols = in->cols;
    if (in->want_dv) kx->stx_bf16(n, cols, Dv, sc->st, bp, rw.do16, rw.lddo, t->dv, job->lddv, sc->pair_scratch);
    t0 = fa_phase_mark(job->phases, FA_PH_DV, t0);
    if (in->want_dk) kx->stx_bf16(n, cols, D, sc->dpt, bp, rw.q16, rw.ldq, t->dk, job->ldd, sc->pair_scratch);
    t0 = fa_phase_mark(job->phases, FA_PH_DK, t0);
    if (in->dq_rows)
        kq->pv_bf16(n, cols, D, sc->dpt, bp, t->k_pairs, t->ldkp, NULL, in->dq_rows, in->ldq_acc, sc->pair_scratch);
    fa_phase_mark(job->phases, FA_PH_DQ, t0);
}

static void grads_f32(const bwd_job *job, const bwd_scratch *sc, const bwd_grads_in *in, double t0)
{
    const bwd_rows rw = *in->rw;
    const bwd_tile *t = in->t;
    const fa_kernels *kq = in->kq, *kx = in->kx;
    const int64_t D = job->p->D, Dv = job->p->Dv, bp = job->bp, n = in->n, cols = in->cols;
    if (in->want_dv) kx->stx(n, cols, Dv, sc->st, bp, rw.dout, rw.lddo, t->dv, job->lddv);
    t0 = fa_phase_mark(job->phases, FA_PH_DV, t0);
    /* backward of 1, S = scale Q K^T: dK += dS^T Q (scale applied once, at the store) */
    if (in->want_dk) kx->stx(n, cols, D, sc->dpt, bp, rw.q, rw.ldq, t->dk, job->ldd);
    t0 = fa_phase_mark(job->phases, FA_PH_DK, t0);
    /* ... and dQ += dS K */
    if (in->dq_rows) kq->pv(n, cols, D, sc->dpt, bp, t->k, t->ldk, NULL, in->dq_rows, in->ldq_acc);
    fa_phase_mark(job->phases, FA_PH_DQ, t0);
}

/*
 * The backward's operand paths, one per job (fa_backward_tiled): the table's fused tile
 * (bwd_bf16) where it has one and the job has no element-wise score rule, bf16 pairs
 * where the forward takes them with dO in bf16 too, else f32 rows. Each gives the
 * block's rows, a key tile's rows, S^T, dP^T and the gradients' products.
 */
struct bwd_path {
    void (*rows)(const bwd_job *job, const bwd_scratch *sc, const fa_view *s, const fa_grads *gs, int64_t h,
                 int64_t i0, int64_t n, bwd_rows *rw);
    void (*tile)(const bwd_job *job, const bwd_tile_scratch *sc, const fa_view *s, int64_t hk, int64_t j0,
                 int64_t cols, bwd_tile *t);
    void (*scores)(const bwd_job *job, const bwd_scratch *sc, const bwd_tile *t, int64_t n, int64_t cols);
    void (*dp)(const bwd_job *job, const bwd_scratch *sc, const bwd_tile *t, int64_t n, int64_t cols);
    int (*rows_finite)(const bwd_rows *rw, int64_t n, int64_t D, int64_t Dv);
    void (*grads)(const bwd_job *job, const bwd_scratch *sc, const bwd_grads_in *in, double t0);
};
enum { BWD_F32, BWD_BF16, BWD_TILES };
static const bwd_path bwd_paths[] = {
    [BWD_F32] = {rows_f32, tile_f32, scores_f32, dp_f32, rows_finite_f32, grads_f32},
    [BWD_BF16] = {rows_bf16, tile_bf16, scores_bf16, dp_bf16, rows_finite_bf16, grads_bf16},
    /* the fused tile (bwd_block_tiles); a pair it does not take runs the bf16 row's products */
    [BWD_TILES] = {rows_tiles, tile_tiles, scores_bf16, dp_bf16, rows_finite_bf16, grads_bf16},
};

/* Rows i0 .. i0+n-1 of head h: Q (natural and transposed-scaled), dO (both), the
 * forward's lse, and D_i, for every key tile that sees the block. */
static void load_rows(const bwd_job *job, const bwd_scratch *sc, const fa_view *s, const fa_grads *gs, int64_t b,
                      int64_t h, int64_t i0, int64_t n, bwd_rows *rw)
{
    const fa_problem *p = job->p;
    memset(rw, 0, sizeof *rw);
    job->path->rows(job, sc, s, gs, h, i0, n, rw);
    const float *lse = s->lse.data;
    const int64_t row0 = p->cu_q ? p->cu_q[b] : 0;
    const float *dv = job->dvec + (p->cu_q ? 0 : b) * job->dvec_sb + h * job->dvec_sh + row0;
    for (int64_t r = 0; r < job->bp; r++) {
        sc->lse[r] = r < n ? lse[h * s->lse.stride[1] + (i0 + r) * s->lse.stride[2]] : -INFINITY;
        sc->dv_rows[r] = r < n ? dv[i0 + r] : 0.0f;
    }
}

static void load_tile(const bwd_job *job, const bwd_tile_scratch *sc, const fa_view *s, int64_t hk, int64_t j0,
                      int64_t cols, bwd_tile *t)
{
    memset(t, 0, sizeof *t);
    t->dk = sc->dk;
    t->dv = sc->dv;
    t->cols = cols;
    job->path->tile(job, sc, s, hk, j0, cols, t);
}

/*
 * One (query block, key tile) pair of head h, the block's rows loaded (load_rows):
 * the whole backward of the tile, with dK and dV of the tile accumulated in t->dk,
 * t->dv when kv is set, and dQ of the block in dq_rows (ld ldq_acc) when that is not
 * NULL. The arithmetic of each gradient does not depend on which others are asked
 * for, nor on how many tiles the rows serve, so the fused loop and the two-pass one
 * (dK, dV first, then dQ) give the same bits.
 */
/*
 * The pair on the table's fused tile (bwd_bf16), when it can take it: plain keys or a
 * band, or a block mask whose kept keys are one run per row (the forward's rule), and,
 * where keys are masked, finite K, Q and dO (the tile products multiply a masked p = 0
 * by them). Returns 0, having done nothing, for the other kernels to run the pair.
 */
static int tile_kv_finite(const bwd_job *job, bwd_tile *t)
{
    if (t->kv_finite < 0) t->kv_finite = fa_rows_finite16(t->k16, t->ldk, t->cols, job->p->D, 0x7f80u);
    return t->kv_finite;
}

static int bwd_block_tiles(const bwd_job *job, const bwd_scratch *sc, const fa_view *s, const fa_grads *gs,
                           int64_t h, int64_t i0, int64_t n, int64_t j0, int64_t cols, bwd_rows *rw,
                           bwd_tile *t, int kv, float *dq_rows, int64_t ldq_acc)
{
    const fa_problem *p = job->p;
    int band = !fa_tile_band(p, s, i0, n, j0, cols, sc->lo, sc->hi);
    if (p->bm.on && fa_bmask_tile(p, s, 0, h, i0, n, j0, cols, sc->bms) != 1) {
        if (!fa_bmask_runs(p, s, 0, h, i0, n, j0, cols, band, sc->lo, sc->hi, sc->bms)) return 0;
        band = 1;
    }
    if (band && rw->finite < 0)
        rw->finite = fa_rows_finite16(rw->q16, rw->ldq, n, p->D, 0x7f80u) &&
                     fa_rows_finite16(rw->do16, rw->lddo, n, p->Dv, 0x7f80u);
    if (band && !(tile_kv_finite(job, t) && rw->finite)) return 0;
    double t0 = fa_phase_start(job->phases);
    const fa_bwd_tile bt = {
        .rows = n, .cols = cols, .d = p->D, .dv = p->Dv,
        .q = rw->qa, .dout = rw->doa, .qt = sc->qT, .dot = sc->doT,
        .ldq = rw->ldqa, .lddo = rw->lddoa, .ldqt = FA_RUP32(job->br), .lddot = FA_RUP32(job->br),
        .kt = t->kt, .vt = t->vt, .kp = t->k_pairs, .ldkp = t->ldkp,
        .scale = p->scale, .lse = sc->lse, .dvec = sc->dv_rows,
        .lo = band ? sc->lo : NULL, .hi = band ? sc->hi : NULL,
        .dq = dq_rows, .dkt = kv && gs->has_dk ? t->dkt : NULL, .dvt = kv && gs->has_dv ? t->dvt : NULL,
        .lddq = ldq_acc, .lddkt = FA_RUP16(job->bc) + 16, .lddvt = FA_RUP16(job->bc) + 16,
        .scratch = sc->tile_scratch,
    };
    job->kern->bwd_bf16(&bt);
    fa_phase_mark(job->phases, FA_PH_BS, t0); /* the whole tile: S, P, dP, dS and the three products */
    const int64_t dims = p->D * (1 + (dq_rows != NULL) + (bt.dkt != NULL)) + p->Dv * (1 + (bt.dvt != NULL));
    fa_phase_flops(job->phases, FA_PH_BS, fa_tile_flops(job->phases, 2 * dims, n, cols, bt.lo, bt.hi));
    return 1;
}

static void bwd_block(const bwd_job *job, const bwd_scratch *sc, const fa_view *s, const fa_grads *gs, int64_t b,
                      int64_t h, int64_t i0, int64_t n, int64_t j0, int64_t cols, bwd_rows *rwp,
                      bwd_tile *t, int kv, float *dq_rows, int64_t ldq_acc)
{
    if (job->tiles) {
        if (bwd_block_tiles(job, sc, s, gs, h, i0, n, j0, cols, rwp, t, kv, dq_rows, ldq_acc)) return;
        rows_panels(job, sc, n, rwp);
        tile_kv_finite(job, t);
        if (!t->fell_back) { /* the other kernels accumulate dK, dV from 0 */
            memset(t->dk, 0, (size_t)(t->cols * job->ldd) * sizeof(float));
            memset(t->dv, 0, (size_t)(t->cols * job->lddv) * sizeof(float));
            t->fell_back = 1;
        }
    }
    const fa_problem *p = job->p;
    const fa_kernels *kern = job->kern;
    const int64_t Dv = p->Dv, bp = job->bp;
    const int elementwise = fa_problem_has_elementwise(p);
    const bwd_rows rw = *rwp;
    /* the softmax step below runs with m = lse and may move m: each tile starts anew */
    memcpy(sc->m, sc->lse, (size_t)bp * sizeof(float));
    memset(sc->l, 0, (size_t)bp * sizeof(float)); /* the softmax step's running sum: unused here */
    double t0 = fa_phase_start(job->phases);

    /* forward 1-5: S^T, then softcap, bias, ALiBi and masks (x kept for the softcap) */
    job->path->scores(job, sc, t, n, cols);
    if (p->softcap > 0.0f) memcpy(sc->xt, sc->st, (size_t)(cols * bp) * sizeof(float));
    if (elementwise) fa_scores_finish(p, s, 0, h, i0, n, j0, cols, sc->st, bp, 1);
    /* the block mask where the pair's kv blocks are not all full: one run of keys per
     * row goes to the softmax as bounds (as the forward's, algo_flash.c), else its
     * bits become -inf */
    int bm_bits = p->bm.on && fa_bmask_tile(p, s, 0, h, i0, n, j0, cols, sc->bms) != 1;
    const int32_t *tlo = NULL, *thi = NULL;
    int band = !elementwise && !fa_tile_band(p, s, i0, n, j0, cols, sc->lo, sc->hi);
    if (bm_bits && !elementwise) {
        if (fa_bmask_runs(p, s, 0, h, i0, n, j0, cols, band, sc->lo, sc->hi, sc->bms))
            bm_bits = 0, band = 1;
        else if (band)
            fa_tile_band(p, s, i0, n, j0, cols, sc->lo, sc->hi);
    }
    if (bm_bits) fa_bmask_apply(p, s, 0, h, i0, n, j0, cols, sc->st, bp, 1, sc->bms);
    if (band) tlo = sc->lo, thi = sc->hi;
    const int partial = elementwise || band || bm_bits;
    t0 = fa_phase_mark(job->phases, FA_PH_BS, t0);

    /* forward 6-7 recomputed: P^T = exp(S^T - lse) (the softmax step with m = lse,
     * which is the row's final max-and-sum in one number) */
    kern->softmax(n, cols, sc->st, bp, tlo, thi, sc->m, sc->l, sc->alpha);
    t0 = fa_phase_mark(job->phases, FA_PH_BX, t0);

    /* backward of 9 and 8: dP^T = V dO^T, times the dropout factor (Dv = 0:
     * there is no output, so dP = 0; the kernels need a depth >= 1) */
    if (Dv == 0)
        memset(sc->dpt, 0, (size_t)(cols * bp) * sizeof(float));
    else
        job->path->dp(job, sc, t, n, cols);
    if (p->drop.on) fa_dropout_tile_t(&p->drop, b, h, p->Hq, p->q_start + i0, n, p->k_start + j0, cols, sc->dpt, bp);
    t0 = fa_phase_mark(job->phases, FA_PH_DP, t0);

    /* backward of 7 (the softmax): dS = P (dP - D); of 2 (softcap): x (1 - tanh^2) */
    kern->ds(n, cols, sc->st, bp, sc->dpt, bp, sc->dv_rows);
    if (p->softcap > 0.0f)
        for (int64_t c = 0; c < cols; c++)
            for (int64_t r = 0; r < n; r++) {
                const float th = tanhf(sc->xt[c * bp + r] / p->softcap);
                sc->dpt[c * bp + r] *= 1.0f - th * th;
            }
    t0 = fa_phase_mark(job->phases, FA_PH_DS, t0);

    /* backward of 9: dV += P~^T dO, with P~ the dropped probabilities */
    const int want_dv = kv && gs->has_dv, want_dk = kv && gs->has_dk;
    if (p->drop.on && want_dv)
        fa_dropout_tile_t(&p->drop, b, h, p->Hq, p->q_start + i0, n, p->k_start + j0, cols, sc->st, bp);
    /* a vector kernel multiplies p = 0 by x too: masked rows that are not
     * finite take the reference kernels, which skip zeros */
    const fa_kernels *kq = partial && !t->kv_finite ? &fa_kernels_ref : kern;
    const fa_kernels *kx =
        (want_dv || want_dk) && partial && !job->path->rows_finite(&rw, n, p->D, Dv) ? &fa_kernels_ref : kern;
    const bwd_grads_in in = {.rw = &rw, .t = t, .n = n, .cols = cols, .want_dv = want_dv, .want_dk = want_dk,
                             .kq = kq, .kx = kx, .dq_rows = dq_rows, .ldq_acc = ldq_acc};
    job->path->grads(job, sc, &in, t0);
    /* the products' FLOPs by phase: 2 per kept pair and dimension of each product */
    const int64_t pair2 = fa_tile_flops(job->phases, 2, n, cols, tlo, thi);
    fa_phase_flops(job->phases, FA_PH_BS, pair2 * p->D);
    fa_phase_flops(job->phases, FA_PH_DP, pair2 * Dv);
    if (want_dv) fa_phase_flops(job->phases, FA_PH_DV, pair2 * Dv);
    if (want_dk) fa_phase_flops(job->phases, FA_PH_DK, pair2 * p->D);
    if (dq_rows) fa_phase_flops(job->phases, FA_PH_DQ, pair2 * p->D);
}

/* Whether the block mask keeps a pair of the (query block, key tile) of head h (1
 * without one): a pair it removes whole is skipped, as the forward skips its tile. */
static int bmask_meets(const fa_problem *p, const fa_view *s, const bwd_scratch *sc, int64_t h, int64_t i0, int64_t n,
                       int64_t j0, int64_t cols)
{
    return !p->bm.on || fa_bmask_tile(p, s, 0, h, i0, n, j0, cols, sc->bms) != 0;
}

/* The query blocks (aligned to br from row 0, as the forward cuts them) that see key
 * tile j0: [*first, *last]; empty when *first > *last. */
static void tile_blocks(const bwd_job *job, const fa_view *s, int64_t j0, int64_t cols, int64_t *first,
                        int64_t *last)
{
    const fa_problem *p = job->p;
    int64_t ilo, ihi;
    fa_key_block_rows(p, s, j0, j0 + cols - 1, &ilo, &ihi);
    *first = ilo <= ihi ? ilo / job->br * job->br : 1;
    *last = ilo <= ihi ? ihi : 0;
}

/* The fused tile's dK^T, dV^T of a finished key tile turned into its dK, dV, or added to
 * what the pairs that fell back to the other kernels summed there. */
static void tile_grads_add(const bwd_job *job, const bwd_tile_scratch *t, int64_t cols, int fell_back)
{
    const int64_t lddt = FA_RUP16(job->bc) + 16;
    for (int g = 0; g < 2; g++) { /* in 16 x 16 blocks, which stay in L1 both ways */
        const int64_t n = g ? job->p->Dv : job->p->D, ld = g ? job->lddv : job->ldd;
        float *dst = g ? t->dv : t->dk;
        const float *src = g ? t->dvt : t->dkt;
        for (int64_t x0 = 0; x0 < n; x0 += 16)
            for (int64_t c0 = 0; c0 < cols; c0 += 16)
                for (int64_t c = c0; c < cols && c < c0 + 16; c++)
                    for (int64_t x = x0; x < n && x < x0 + 16; x++)
                        dst[c * ld + x] = (fell_back ? dst[c * ld + x] : 0.0f) + src[x * lddt + c];
    }
}

/* Key tiles j0, j0 + bc, ... (nt of them) of kv head hk: dK, dV of each from every
 * query block of the group that sees it, then stored (dK scaled once here); dQ of
 * those blocks into dq (NULL: not here), head h's rows at dq + (h - h0) * hstride +
 * row * ldq_acc. Each query block's rows are loaded once for all the tiles that
 * see it, which it meets in key order, as one tile at a time would. */
static void key_group_run(const bwd_job *job, const bwd_scratch *sc, const fa_view *s, const fa_grads *gs,
                          int64_t b, int64_t hk, int64_t j0, int64_t nt, float *dq, int64_t ldq_acc, int64_t hstride)
{
    const fa_problem *p = job->p;
    const int64_t D = p->D, Dv = p->Dv, br = job->br, bc = job->bc, h0 = hk * p->group;
    const int kv = gs->has_dk || gs->has_dv;
    int64_t first[BWD_GROUP_MAX], last[BWD_GROUP_MAX], cols[BWD_GROUP_MAX], lo = INT64_MAX, hi = -1;
    bwd_tile t[BWD_GROUP_MAX];
    for (int64_t k = 0; k < nt; k++) {
        const int64_t jk = j0 + k * bc;
        cols[k] = s->Sk - jk < bc ? s->Sk - jk : bc;
        t[k].fell_back = 0;
        if (!job->tiles) {
            memset(sc->tile[k].dk, 0, (size_t)(cols[k] * job->ldd) * sizeof(float));
            memset(sc->tile[k].dv, 0, (size_t)(cols[k] * job->lddv) * sizeof(float));
        } else {
            const int64_t lddt = FA_RUP16(bc) + 16;
            memset(sc->tile[k].dkt, 0, (size_t)(FA_RUP16(D) * lddt) * sizeof(float));
            memset(sc->tile[k].dvt, 0, (size_t)(FA_RUP16(Dv) * lddt) * sizeof(float));
        }
        tile_blocks(job, s, jk, cols[k], &first[k], &last[k]);
        if (!kv && !dq) last[k] = first[k] - 1;
        if (first[k] > last[k]) continue;
        load_tile(job, &sc->tile[k], s, hk, jk, cols[k], &t[k]);
        lo = first[k] < lo ? first[k] : lo;
        hi = last[k] > hi ? last[k] : hi;
    }
    for (int64_t h = h0; h < h0 + p->group; h++)
        for (int64_t i0 = lo; i0 <= hi; i0 += br) {
            const int64_t n = s->Sq - i0 < br ? s->Sq - i0 : br;
            bwd_rows rw;
            int loaded = 0;
            for (int64_t k = 0; k < nt; k++) {
                if (i0 < first[k] || i0 > last[k] || !bmask_meets(p, s, sc, h, i0, n, j0 + k * bc, cols[k])) continue;
                if (!loaded) load_rows(job, sc, s, gs, b, h, i0, n, &rw);
                loaded = 1;
                bwd_block(job, sc, s, gs, b, h, i0, n, j0 + k * bc, cols[k], &rw, &t[k], kv,
                          dq ? dq + (h - h0) * hstride + i0 * ldq_acc : NULL, ldq_acc);
            }
        }
    /* the key tiles' gradients are whole: every query row that sees them has run */
    for (int64_t k = 0; k < nt; k++) {
        float *dk = sc->tile[k].dk;
        if (job->tiles) tile_grads_add(job, &sc->tile[k], cols[k], t[k].fell_back);
        if (gs->has_dk) {
            for (int64_t c = 0; c < cols[k]; c++)
                for (int64_t x = 0; x < D; x++) dk[c * job->ldd + x] *= p->scale;
            fa_store_rows(&gs->dk, job->kern, 0, j0 + k * bc, cols[k], hk, D, dk, job->ldd);
        }
        if (gs->has_dv) fa_store_rows(&gs->dv, job->kern, 0, j0 + k * bc, cols[k], hk, Dv, sc->tile[k].dv, job->lddv);
    }
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
static void bwd_task_run(const bwd_job *job, const bwd_scratch *sc, const fa_bwd_task *t)
{
    const fa_problem *p = job->p;
    fa_view s;
    fa_grads gs;
    fa_seq_view(p, t->b, &s);
    fa_seq_grads(p, job->g, t->b, &gs);
    int64_t ldq_acc = 0, hstride = 0;
    if (t->kind == FA_BWD_FUSED) {
        const int64_t h0 = (int64_t)t->head * p->group;
        float *dq = gs.has_dq ? dq_target(job, sc, &gs, h0, &ldq_acc, &hstride, s.Sq) : NULL;
        if (dq) dq_rows_clear(job, dq, ldq_acc, hstride, p->group, s.Sq);
        const int64_t step = job->group_tiles * job->bc;
        for (int64_t j0 = 0; j0 < s.Sk; j0 += step) {
            const int64_t nt = (s.Sk - j0 < step ? s.Sk - j0 + job->bc - 1 : step) / job->bc;
            key_group_run(job, sc, &s, &gs, t->b, t->head, j0, nt, dq, ldq_acc, hstride);
        }
        if (dq) dq_rows_finish(job, &gs, dq, ldq_acc, hstride, h0, p->group, 0, s.Sq);
    } else if (t->kind == FA_BWD_KEY_TILE) {
        key_group_run(job, sc, &s, &gs, t->b, t->head, t->start, 1, NULL, 0, 0);
    } else { /* FA_BWD_QUERY_BLOCK: dQ of rows start .. start+n-1 of head `head` */
        const int64_t h = t->head, i0 = t->start, n = s.Sq - i0 < job->br ? s.Sq - i0 : job->br;
        float *dq = dq_target(job, sc, &gs, h, &ldq_acc, &hstride, s.Sq);
        if (job->dq_in_place) dq += i0 * ldq_acc; /* scratch holds only this block's rows */
        dq_rows_clear(job, dq, ldq_acc, hstride, 1, n);
        bwd_rows rw;
        int loaded = 0;
        for (int64_t j0 = 0; j0 < s.Sk; j0 += job->bc) {
            const int64_t cols = s.Sk - j0 < job->bc ? s.Sk - j0 : job->bc;
            int64_t first, last;
            tile_blocks(job, &s, j0, cols, &first, &last);
            if (i0 < first || i0 > last || !bmask_meets(p, &s, sc, h, i0, n, j0, cols))
                continue; /* the fused walk's test */
            if (!loaded) load_rows(job, sc, &s, &gs, t->b, h, i0, n, &rw);
            loaded = 1;
            bwd_tile kt;
            load_tile(job, &sc->tile[0], &s, h / p->group, j0, cols, &kt);
            bwd_block(job, sc, &s, &gs, t->b, h, i0, n, j0, cols, &rw, &kt, 0, dq, ldq_acc);
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
    /* the fused tile where the table has one, for what it computes: no element-wise
     * score rules (bias, mask, ALiBi, softcap), no dropout, an output (Dv >= 1) */
    job.tiles = job.b16 && (ctx->kernels->flags & FA_KERNELS_BWD_BF16) && !fa_problem_has_elementwise(p) &&
                !p->drop.on && p->Dv > 0;
    job.path = &bwd_paths[job.tiles ? BWD_TILES : job.b16 ? BWD_BF16 : BWD_F32];
    /* K and V as the forward packs them (kv.h) where it would: rows far apart
     * (a page, or a multiple of 1 KB) share a few cache sets and miss in qk's and
     * pv's reuse of the tile, and converted rows are copied anyway. Once per key
     * tile, for every query block of the group; the f32 products keep their bits. */
    job.kv_pack = !job.b16 && fa_kv_packing_form(p, 0, 0, 0) == 0 && fa_kv_packing_plan(0, bc, p->D, p->Dv, p->v_in_k, &job.kv_layout);

    /* the schedule (tasks.c): fused (sequence, kv head) walks, or two passes */
    const fa_bwd_rules rules = {.br = br, .bc = bc, .threads = ctx->threads, .two_pass_ok = two_pass_ok,
                                .kv = g->has_dk || g->has_dv, .dq = g->has_dq};
    fa_bwd_counts counts;
    if (!fa_bwd_tasks_count(p, &rules, &counts)) return fa_fail(ctx, FA_ERR_OVERFLOW, "backward: B * Hk overflows");
    job.two_pass = counts.two_pass;
    job.group_tiles = job.two_pass ? 1 : BWD_GROUP_MAX; /* pass 1's tasks are single tiles */
    job.sq_max = counts.sq_max;
    const int64_t n_tasks = counts.tasks;
    job.per_thread = scratch_layout(&job, NULL, NULL);
    const int nth = ctx->threads < n_tasks ? ctx->threads : (int)(n_tasks > 0 ? n_tasks : 1);
    /* D_i: laid out (B, Hq, Sq) dense, or (1, Hq, total_q) packed */
    const int64_t rows = p->cu_q ? p->q.shape[1] : p->Sq;
    job.dvec_sh = rows;
    job.dvec_sb = p->cu_q ? 0 : p->Hq * rows;
    float *dvec, *rows2;
    const fa_ws_part parts[] = {
        {(void **)&job.workspace, job.per_thread < 0 ? -1 : fa_bytes3(job.per_thread, nth, 1)},
        {(void **)&job.tasks, fa_bytes3(n_tasks, (int64_t)sizeof(fa_bwd_task), 1)},
        {(void **)&dvec, fa_bytes3(p->cu_q ? 1 : p->B, p->Hq * rows, 4)},
        {(void **)&rows2, fa_bytes3(p->Dv, 8, ctx->threads)},
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

    dvec_job dj = {.p = p, .kern = job.kern, .g = g, .dvec = dvec, .sb = job.dvec_sb, .sh = job.dvec_sh,
                   .rows = rows2};
    compute_dvec(ctx, &dj);
    fa_bwd_tasks_fill(p, &rules, &counts, job.tasks);
    job.n_tasks = n_tasks;
    atomic_init(&job.next, 0);
    fa_phases phases;
    fa_phases_init(&phases, ctx->set.verbose || ctx->set.profile);
    job.phases = &phases;
    if (job.n_tasks > 0) fa_pool_run(ctx->pool, nth, bwd_worker, &job);
    fa_phases_read(&phases, info->phase_us, info->phase_flop);
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
    fa_plan_tiles(ctx, &plan_p, 0, &plan);
    int64_t br = plan.br < 128 ? plan.br : 128, bc = plan.bc < 128 ? plan.bc : 128;
    fa_bmask_fit_tiles(p, &br, &bc); /* still inside the block mask's blocks */
    return fa_backward_tiled(ctx, p, g, br, bc, 1, info);
}
