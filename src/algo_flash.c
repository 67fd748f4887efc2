/*
 * algo_flash.c: FlashAttention forward on the CPU. Q is cut into blocks of br
 * rows and K/V into tiles of bc rows (sizes from plan.c); for one Q block the
 * loop walks the K/V tiles its rows can see, keeping a bc x br score tile in
 * cache and never materialising S or P. The softmax is online: each row keeps
 * its running max m and sum l, and the output accumulator is rescaled by
 * exp(m_old - m_new) whenever m grows (inside the pv kernel). Extra memory is a
 * few tiles per thread, independent of the sequence length.
 *
 * Work is split into tasks (b, h, q block) handed out by an atomic counter,
 * most expensive q blocks first (causal and windowed blocks differ in cost), so
 * threads finish together. A task's arithmetic does not depend on which thread
 * runs it, so results are bitwise identical for any thread count.
 */
#include "internal.h"
#include "convert.h"
#include "threadpool.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const fa_problem *p;
    const fa_kernels *kern;
    fa_plan plan;
    int bf16_dot;       /* bf16 inputs multiplied as bf16 pairs by the ISA */
    int64_t ldacc;
    int64_t q_blocks;   /* per (b, h) */
    int64_t *order;     /* (q_blocks) q block indices, most kept pairs first */
    char *workspace;
    int64_t per_thread; /* bytes */
    atomic_llong next;
} flash_job;

typedef struct {
    float *q;        /* (br, D)      Q rows as f32, when they are not f32 already */
    float *qt;       /* (D, br_pad)  Q block transposed and scaled */
    float *k;        /* (bc, D)      K rows as f32, when needed */
    float *v;        /* (bc, Dv)     V rows as f32, when needed */
    float *st;       /* (bc, br_pad) scores, then probabilities */
    float *acc;      /* (br, ldacc)  unnormalised output */
    float *m, *l, *alpha; /* (br_pad) */
    int32_t *lo, *hi;     /* (br_pad) tile-relative band of each row */
    /* bf16 dot-product path only */
    uint16_t *q16, *qt2, *k16, *v16, *pv_scratch;
} flash_scratch;

/* Lays the scratch out from base, each slice on its own cache lines, and returns
 * its size in bytes; with base == NULL only the size. */
static int64_t scratch_layout(const flash_job *job, flash_scratch *sc, char *base)
{
    const int64_t D = job->p->D, Dv = job->p->Dv, br = job->plan.br, bc = job->plan.bc, bp = job->plan.br_pad;
    const int64_t b16 = job->bf16_dot;
    flash_scratch unused;
    if (!sc) sc = &unused;
    struct { void **slot; int64_t bytes; } parts[] = {
        {(void **)&sc->q, b16 ? 0 : br * D * 4},
        {(void **)&sc->qt, b16 ? 0 : D * bp * 4},
        {(void **)&sc->k, b16 ? 0 : bc * D * 4},
        {(void **)&sc->v, bc * Dv * 4}, /* bf16 path: the careful fallback widens a V tile here */
        {(void **)&sc->st, bc * bp * 4},
        {(void **)&sc->acc, br * job->ldacc * 4},
        {(void **)&sc->m, bp * 4},
        {(void **)&sc->l, bp * 4},
        {(void **)&sc->alpha, bp * 4},
        {(void **)&sc->lo, bp * 4},
        {(void **)&sc->hi, bp * 4},
        {(void **)&sc->q16, b16 ? br * D * 2 : 0},
        {(void **)&sc->qt2, b16 ? (D + 1) / 2 * 2 * bp * 2 : 0},
        {(void **)&sc->k16, b16 ? bc * D * 2 : 0},
        {(void **)&sc->v16, b16 ? bc * Dv * 2 : 0},
        {(void **)&sc->pv_scratch, b16 ? ((bc + 1) * (Dv + 32) + (bc + 1) * bp) * 2 : 0},
    };
    int64_t off = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        *parts[i].slot = base && parts[i].bytes ? base + off : NULL;
        off += (parts[i].bytes + FA_CACHE_LINE - 1) / FA_CACHE_LINE * FA_CACHE_LINE;
    }
    return off;
}

static void flash_block(const flash_job *job, const flash_scratch *sc, int64_t b, int64_t h, int64_t qb)
{
    const fa_problem *p = job->p;
    const fa_kernels *kern = job->kern;
    const int64_t D = p->D, Dv = p->Dv, hk = h / p->group, bp = job->plan.br_pad, ldacc = job->ldacc;
    const int64_t i0 = qb * job->plan.br;
    const int64_t rows = p->Sq - i0 < job->plan.br ? p->Sq - i0 : job->plan.br;
    const int elementwise = fa_problem_has_elementwise(p);
    int64_t ldq, ldk, ldv;

    if (job->bf16_dot) {
        const uint16_t *q = fa_rows_u16(&p->q, b, i0, rows, h, D, sc->q16, &ldq);
        kern->pack_qt_bf16(rows, D, q, ldq, sc->qt2, 2 * bp);
    } else {
        const float *q = fa_rows_f32(&p->q, kern, b, i0, rows, h, D, sc->q, &ldq);
        kern->pack_qt(rows, D, q, ldq, p->scale, sc->qt, bp);
    }
    for (int64_t r = 0; r < rows; r++) {
        sc->m[r] = -INFINITY;
        sc->l[r] = 0.0f;
    }
    memset(sc->acc, 0, (size_t)(rows * ldacc) * sizeof(float));

    /* Columns any row of this block keeps: the band ends are monotone in i, so
     * K/V tiles outside [first row's lo, last row's hi] are never touched. */
    int64_t lo, hi, unused;
    fa_row_band(p, i0, &lo, &unused);
    fa_row_band(p, i0 + rows - 1, &unused, &hi);

    for (int64_t j0 = lo; j0 <= hi; j0 += job->plan.bc) {
        const int64_t cols = hi - j0 + 1 < job->plan.bc ? hi - j0 + 1 : job->plan.bc;
        const float *v = NULL;
        const uint16_t *v16 = NULL;

        /* 1. scaled scores S^T = K (scale Q)^T */
        if (job->bf16_dot) {
            const uint16_t *k = fa_rows_u16(&p->k, b, j0, cols, hk, D, sc->k16, &ldk);
            v16 = fa_rows_u16(&p->v, b, j0, cols, hk, Dv, sc->v16, &ldv);
            kern->qk_bf16(rows, cols, D, sc->qt2, 2 * bp, k, ldk, p->scale, sc->st, bp);
        } else {
            const float *k = fa_rows_f32(&p->k, kern, b, j0, cols, hk, D, sc->k, &ldk);
            v = fa_rows_f32(&p->v, kern, b, j0, cols, hk, Dv, sc->v, &ldv);
            kern->qk(rows, cols, D, sc->qt, bp, k, ldk, sc->st, bp);
        }

        /* 2. masks and score modifiers; a band-only tile passes its bounds to the kernel */
        const int32_t *tlo = NULL, *thi = NULL;
        int partial;
        if (elementwise) {
            fa_scores_finish(p, b, h, i0, rows, j0, cols, sc->st, bp);
            partial = 1;
        } else {
            partial = !fa_tile_band(p, i0, rows, j0, cols, sc->lo, sc->hi);
            if (partial) {
                tlo = sc->lo;
                thi = sc->hi;
            }
        }

        /* 3. online softmax: new max, P = exp(S - m), alpha = exp(m_old - m_new) */
        kern->softmax(rows, cols, sc->st, bp, tlo, thi, sc->m, sc->l, sc->alpha);

        /* 4. acc = alpha * acc + P V. A vector kernel multiplies a masked p = 0 by v
         * too, so a NaN/inf in a masked V row would leak into rows that never see
         * it; such tiles go through the reference kernel, which skips p == 0. */
        if (job->bf16_dot) {
            int careful = 0;
            if (partial) {
                for (int64_t c = 0; c < cols && !careful; c++)
                    for (int64_t e = 0; e < Dv && !careful; e++)
                        careful = (v16[c * ldv + e] & 0x7f80u) == 0x7f80u; /* inf or NaN */
            }
            if (!careful) {
                kern->pv_bf16(rows, cols, Dv, sc->st, bp, v16, ldv, sc->alpha, sc->acc, ldacc, sc->pv_scratch);
                continue;
            }
            /* rare: widen the tile and take the careful path */
            for (int64_t c = 0; c < cols; c++) kern->bf16_to_f32(v16 + c * ldv, sc->v + c * Dv, Dv);
            fa_kernels_ref.pv(rows, cols, Dv, sc->st, bp, sc->v, Dv, sc->alpha, sc->acc, ldacc);
            continue;
        }
        if (partial && kern != &fa_kernels_ref && !fa_rows_finite(v, ldv, cols, Dv))
            fa_kernels_ref.pv(rows, cols, Dv, sc->st, bp, v, ldv, sc->alpha, sc->acc, ldacc);
        else
            kern->pv(rows, cols, Dv, sc->st, bp, v, ldv, sc->alpha, sc->acc, ldacc);
    }

    /* 5. normalise; a row that kept nothing is 0 with lse = -inf */
    for (int64_t r = 0; r < rows; r++) {
        float *ar = sc->acc + r * ldacc;
        float lse = -INFINITY;
        if (sc->m[r] == -INFINITY) {
            memset(ar, 0, (size_t)Dv * sizeof *ar);
        } else {
            const float inv = 1.0f / sc->l[r];
            for (int64_t e = 0; e < Dv; e++) ar[e] *= inv;
            lse = sc->m[r] + logf(sc->l[r]);
        }
        if (p->has_lse) {
            float *out = p->lse.data;
            out[b * p->lse.stride[0] + h * p->lse.stride[1] + (i0 + r) * p->lse.stride[2]] = lse;
        }
    }
    fa_store_rows(&p->o, b, i0, rows, h, Dv, sc->acc, ldacc);
}

static void flash_worker(void *arg, int ith, int nth)
{
    (void)nth;
    flash_job *job = arg;
    const fa_problem *p = job->p;
    flash_scratch sc;
    scratch_layout(job, &sc, job->workspace + (int64_t)ith * job->per_thread);
    const int64_t heads = p->B * p->Hq, tasks = heads * job->q_blocks;
    /* task t: the (t / heads)-th most expensive q block of head t % heads */
    for (int64_t t; (t = atomic_fetch_add(&job->next, 1)) < tasks;) {
        const int64_t bh = t % heads, qb = job->order[t / heads];
        flash_block(job, &sc, bh / p->Hq, bh % p->Hq, qb);
    }
}

/* Kept (i, j) pairs of a q block, from the band alone: its cost for ordering. */
static int64_t block_cost(const fa_problem *p, int64_t i0, int64_t rows)
{
    int64_t cost = 0;
    for (int64_t i = i0; i < i0 + rows; i++) {
        int64_t lo, hi;
        fa_row_band(p, i, &lo, &hi);
        if (hi >= lo) cost += hi - lo + 1;
    }
    return cost;
}

typedef struct {
    int64_t cost, block;
} block_rank;

static int by_cost_desc(const void *a, const void *b)
{
    const block_rank *x = a, *y = b;
    if (x->cost != y->cost) return x->cost > y->cost ? -1 : 1;
    return (x->block > y->block) - (x->block < y->block);
}

/* Fills order[] with q block indices, most kept pairs first; rank is scratch. */
static void order_blocks(const fa_problem *p, int64_t br, int64_t q_blocks, block_rank *rank, int64_t *order)
{
    for (int64_t qb = 0; qb < q_blocks; qb++) {
        const int64_t i0 = qb * br, rows = p->Sq - i0 < br ? p->Sq - i0 : br;
        rank[qb].cost = block_cost(p, i0, rows);
        rank[qb].block = qb;
    }
    qsort(rank, (size_t)q_blocks, sizeof *rank, by_cost_desc);
    for (int64_t i = 0; i < q_blocks; i++) order[i] = rank[i].block;
}

fa_status fa_run_flash(fa_context *ctx, const fa_problem *p, fa_run_info *info)
{
    flash_job job = {.p = p, .kern = ctx->kernels};
    fa_plan_tiles(ctx, p, &job.plan);
    /* bf16 dot products only where they are faster than widening to fp32 (auto), or forced */
    job.bf16_dot = p->dtype == FA_DTYPE_BF16 && fa_bf16_dot_active(ctx);
    job.ldacc = (p->Dv + FA_ROW_ALIGN - 1) / FA_ROW_ALIGN * FA_ROW_ALIGN;
    job.q_blocks = (p->Sq + job.plan.br - 1) / job.plan.br;
    /* tiles are bounded by the plan and D, Dv are dims of validated tensors: no overflow */
    job.per_thread = scratch_layout(&job, NULL, NULL);

    int64_t tasks;
    if (!fa_mul_ok(p->B * p->Hq, job.q_blocks, &tasks))
        return fa_fail(ctx, FA_ERR_OVERFLOW, "flash: task count overflows");
    const int nth = ctx->threads < tasks ? ctx->threads : (int)tasks;
    /* after the per-thread scratch: the task order, and room to rank it */
    int64_t order_bytes = job.q_blocks * (int64_t)(sizeof(int64_t) + sizeof(block_rank)), bytes;
    if (!fa_mul_ok(job.per_thread, nth, &bytes) || !fa_add_ok(bytes, order_bytes, &bytes))
        return fa_fail(ctx, FA_ERR_OVERFLOW, "flash: workspace size overflows");
    char *ws = fa_workspace_alloc(bytes);
    if (!ws)
        return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flash: cannot allocate %lld bytes of tile workspace",
                       (long long)bytes);
    job.workspace = ws;
    job.order = (int64_t *)(ws + job.per_thread * nth);
    order_blocks(p, job.plan.br, job.q_blocks, (block_rank *)(job.order + job.q_blocks), job.order);
    atomic_init(&job.next, 0);
    fa_pool_run(ctx->pool, nth, flash_worker, &job);
    fa_workspace_free(ws);
    info->extra_bytes = bytes;
    info->br = job.plan.br;
    info->bc = job.plan.bc;
    info->threads = nth;
    info->path = job.bf16_dot ? "bf16-dot" : "f32";
    return FA_OK;
}
