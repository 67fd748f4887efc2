/*
 * algo_flash.c: FlashAttention forward on the CPU. Q is cut into blocks of br
 * rows and K/V into tiles of bc rows (sizes from plan.c); for one Q block the
 * loop walks the K/V tiles its rows can see, keeping a bc x br score tile in
 * cache and never materialising S or P. The softmax is online: each row keeps
 * its running max m and sum l, and the output accumulator is rescaled by
 * exp(m_old - m_new) whenever m grows (inside the pv kernel). Extra memory is a
 * few tiles per thread, plus (where it pays) packed K/V: each (sequence, kv head)
 * converted, gathered or paired once into the kernels' layout for all the query
 * blocks that read it, in waves through two buffers of bounded size (kv.h; the
 * waves' steps are tasks.c's; a long unit goes in key chunks, its tasks in steps
 * that keep their online softmax state in a state slot between chunks).
 *
 * Work is split into tasks handed out by an atomic counter, most expensive first
 * (causal blocks and ragged sequences differ in cost), so threads finish together.
 * A task is (sequence, query heads, q block, key chunk):
 *  - each sequence is a view of its own (fa_seq_view: its lengths and tensors, the
 *    call's fields beside it in job->p), so varlen batches and KV caches run this
 *    same loop;
 *  - query heads that share a kv head are stacked into one task when the q block
 *    is short (decoding), so K and V stream once per kv head, not once per head;
 *  - stacks of at most FA_SMALL_ROWS rows take the small-row kernels, which run
 *    vectors along the head dim instead of along (mostly padding) rows;
 *  - when there are too few tasks for the threads, keys are split into chunks
 *    whose partial (o, lse) are merged afterwards (split-KV; tasks.c, plan_splits).
 * A task's arithmetic does not depend on which thread runs it, and the split
 * plan depends only on shapes, so results are bitwise identical for any thread
 * count. The plan (tasks and steps) is tasks.c's, K/V rows are reached through
 * kv.h; this file runs the steps: the forward loops, a pack step, the merge.
 *
 * Comments number the steps of the computation as docs/semantics.md, section 3:
 * 1 scores, 2-5 softcap, bias, ALiBi and masks, 6-7 the (online) softmax, 8 dropout,
 * 9 the output.
 */
#include "algos.h"
#include "workspace.h"
#include "arith.h"
#include "convert.h"
#include "kv.h"
#include "tasks.h"
#include "threadpool.h"
#include "tune.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


typedef struct wide_path wide_path;
typedef struct wide_task wide_task;

/* The K of the int8 routes with K once per call (wide_path's keys): every key of each
 * (sequence, kv head) smoothed, quantised and packed once per call (q8_keys_worker), in key
 * slots: (b, hk)'s keys from slot off[b] + hk * (FA_RUP16(Sk_b) + 16), 16-key blocks
 * aligned, 16 spare slots for a tile's readable tail. The fused forward (fwd_i8,
 * flash_task_i8) reads K's codes as kt's blocks, qk_i8 (flash_task_i8p) as rows k8 with
 * their sums. */
typedef struct {
    uint32_t *kt;   /* Q8_KEYS_KT: FA_KT_QUADS(D) dwords per key slot, fa_pack_kt_i8's blocks */
    int8_t *k8;     /* Q8_KEYS_ROWS: fa_q8_ld(D) codes per key slot (zero from D on) */
    int32_t *ksum;  /* Q8_KEYS_ROWS: each slot's code sum (qk_i8's ksum) */
    uint32_t *vp;   /* V as pairs of key slots (pack_pairs_bf16), fa_packed_ld(Dv) dwords each */
    float *ks;      /* one scale per key slot */
    float *kbar;    /* (B, Hk, D) the mean key (docs/semantics.md, 11), where smooth */
    int32_t *smooth; /* (B, Hk) */
    int64_t *off;   /* (B) */
} q8_keys;

typedef struct {
    const fa_problem *p;
    const fa_kernels *kern;
    fa_plan plan;
    const wide_path *path; /* the wide tasks' operand path (wide_paths), chosen once (wide_path_of) */
    int bf16_dot;       /* bf16 inputs multiplied as bf16 pairs by the ISA */
    int fused;          /* the bf16 pair tiles (or f32 as bf16 products) take the table's fused forward (fwd_bf16) */
    int decode_tiles;   /* decoding on the tile unit: a kv head's group in one task (decode_tiles) */
    int mm_terms;       /* f32 inputs as bf16 products (FA_PARAM_F32_MATMUL): 3 bf16x3, 1 bf16, 0 ieee */
    int64_t ldacc;
    int64_t lds;        /* small-row score tiles: round_up(bc, FA_ROW_ALIGN) */
    int small;          /* the kernels have the small-row path and tiles fit it */
    int64_t stacks_max; /* small-row path: head stacks one task may hold */
    int small_ahead;    /* small-row path: prefetch the next stack's rows (small_prefetch_ahead) */
    int digits;         /* small-row path, int8 K/V: FA_PARAM_QUANT_MATMUL's int8 digits (1 i8, 2 i8x2) where
                         * the table has the kernels, else 0 (exact) */
    int wide_digits;    /* the wide path, float or int8 K: the same (wide_q8), else 0 */
    q8_keys keys;       /* the fused int8 route's K, once per call (wide_path's keys) */
    fa_task *items;     /* tasks, most expensive first */
    int64_t n_items;
    int64_t *merges;    /* indices into items of split 0 of every split unit */
    int64_t n_merges;
    float *slots;       /* partial results: slot_floats each */
    int64_t slot_floats;
    int64_t slot_lse;   /* offset of the lse values in a slot */
    char *workspace;
    int64_t per_thread; /* bytes */
    /* the steps (tasks.h): the tasks, and where K/V are packed (kv.h) the packs of
     * the units they share, in waves through two buffers */
    fa_steps steps;
    atomic_llong pack_ns; /* thread time in pack steps, for FA_PARAM_LAST_KV_PACK_US */
    atomic_llong next;    /* the next split unit to merge */
    fa_phases *phases;    /* the verbose trace's profile (algos.h): S, X, P, M */
} flash_job;

typedef struct {
    float *q;        /* (br, D)      Q rows as f32, when they are not f32 already */
    float *qt;       /* (D, br_pad)  Q block transposed and scaled; small path: (stack, rows, D) scaled */
    float *k;        /* (bc, D)      K rows as f32, when needed */
    float *v;        /* (bc, Dv)     V rows as f32, when needed */
    float *st;       /* (bc, br_pad) scores, then probabilities; small path (rows, lds) */
    float *acc;      /* (br, ldacc)  unnormalised output; small path: (stack, FA_SMALL_ROWS, ldacc) */
    float *m, *l, *alpha; /* (br_pad); small path: (stack, FA_ROW_ALIGN) */
    int32_t *lo, *hi;     /* (br_pad) tile-relative band of each row */
    const void **kp, **vp; /* (bc) small path: K/V row pointers */
    float *ks, *vs;        /* (bc) small path: their int8 scales */
    int8_t *q8;            /* small path, int8 products: (stack, FA_SMALL_ROWS, digits, fa_q8_ld(D)) Q codes */
    float *q8s;            /* (stack, FA_SMALL_ROWS) their scales */
    /* the wide path's int8 products only (wide_q8): Q codes (br_pad, digits, ldq8), their
     * scales and smoothing terms (br_pad), K codes (bc, ldq8), the smoothing mean (D),
     * row-major scores (br_pad, lds); K codes have two spare rows (a digit pair's scratch) */
    int8_t *wq8, *wk8;
    float *wq8s, *wqc, *wkbar, *wst, *wy; /* wy: one key row, smoothed (D) */
    double *wsum;                         /* (D) kbar's sums */
    int64_t *bms;          /* the block mask's statuses of a tile's kv blocks (fa_bmask_scratch) */
    /* bf16 dot-product path only (and f32 as bf16 products: q16, k16, v16 then hold
     * the split rows, below) */
    uint16_t *q16, *qt2, *k16, *v16;
    uint32_t *v_pairs, *pv_scratch; /* a V tile as row pairs when not packed; P pairs */
    /* the fused forward only: Q rows zero-padded (bp, FA_RUP32(D)), a K tile as K^T pairs
     * when it is not packed where it starts (kernels.h's blocks), the kernel's scratch */
    uint16_t *qa;
    uint32_t *kt;
    void *fwd_scratch;
    uint32_t *qt4; /* qk_i8's route only: the Q block's codes as Q^T quads (FA_QT4_QUADS(D), br_pad) */
    /* f32 as bf16 products only: one row's bf16 high part, and its residual in f32 */
    uint16_t *row16;
    float *rowf;
} flash_scratch;

/*
 * The operand paths of the wide tasks, one per job (wide_path_of): how Q, K and V meet
 * the kernels in steps 1 and 9. bf16: bf16 q and K/V rows the pair kernels read (dense or
 * contiguous caches; not pages, not codes) as bf16 pairs (FA_PARAM_BF16_DOT), the fused
 * kernel a variant of it; split: f32 as bf16 products (FA_PARAM_F32_MATMUL); f32:
 * everything else, rows widened to f32; q8 and i8: int8 products (FA_PARAM_QUANT_MATMUL)
 * on the small-row kernels or the fused forward, each a task loop of its own (row-major
 * scores, q and K quantised once), reading K and V where they are. A new operand path is
 * one row here.
 */
struct wide_path {
    /* a task loop of its own (never packed, a task's only step); NULL: flash_task's
     * tile loop with the three hooks below */
    void (*task)(const flash_job *job, const flash_scratch *sc, const fa_view *s, const fa_task *it);
    void (*q_rows)(const flash_job *job, const flash_scratch *sc, wide_task *w);
    const float *(*scores)(const flash_job *job, const flash_scratch *sc, wide_task *w, int64_t j0, int64_t cols,
                           int64_t *ldv);
    void (*pv)(const flash_job *job, const flash_scratch *sc, const wide_task *w, int64_t j0, int64_t cols,
               int partial, const float *v, int64_t ldv);
    int pairs; /* reads the bf16 or split packing (kv.h), not the f32 one */
    int trims; /* takes a band's diagonal tiles in row blocks (wide_trimmed) */
    int fuses; /* has the fused forward (fwd_bf16) as a variant, where the job allows it */
    int keys;  /* K quantised and packed once per call (q8_keys_worker) in the form Q8_KEYS_*, or 0 */
};

enum { Q8_KEYS_KT = 1, Q8_KEYS_ROWS = 2 }; /* wide_path's keys: fwd_i8's blocks (and its scratch), qk_i8's rows */

static int64_t round16(int64_t x) { return fa_round_up(x, FA_ROW_ALIGN); }

/* The per-thread scratch as one table (fa_ws_layout): its size with base == NULL,
 * its slices from base otherwise; -1 when a size overflows (D, Dv are user sizes). */
static int64_t scratch_layout(const flash_job *job, flash_scratch *sc, char *base)
{
    const int64_t D = job->p->D, Dv = job->p->Dv, br = job->plan.br, bc = job->plan.bc, bp = job->plan.br_pad;
    const int64_t b16 = job->bf16_dot || job->mm_terms;
    /* f32 as bf16 products: T = mm_terms terms side by side along each reduction
     * (kv.h, fa_split_row); P - bf16(P) follows P in the score tile */
    const int64_t T = job->mm_terms > 0 ? job->mm_terms : 1, mm = job->mm_terms > 0;
    const int64_t T2 = T > 2 ? 2 : T; /* V and P: hi and lo */
    const int64_t row_max = D > Dv ? (D > bp ? D : bp) : (Dv > bp ? Dv : bp);
    const int64_t st_floats = T2 * bc * bp > FA_SMALL_ROWS * job->lds ? T2 * bc * bp : FA_SMALL_ROWS * job->lds;
    /* the small-row path keeps the state of up to stacks_max stacks of <= FA_SMALL_ROWS rows */
    const int64_t sm = job->stacks_max, state = bp > sm * FA_ROW_ALIGN ? bp : sm * FA_ROW_ALIGN;
    const int64_t acc_rows = br > sm * FA_SMALL_ROWS ? br : sm * FA_SMALL_ROWS;
    const int64_t qt_rows = bp > sm * FA_SMALL_ROWS ? bp : sm * FA_SMALL_ROWS;
    flash_scratch unused;
    if (!sc) sc = &unused;
    /* br, bc, bp and sm are bounded by the plan (<= 2^16); D, Dv are not, so every
     * product with them is checked */
    const fa_ws_part parts[] = {
        {(void **)&sc->q, fa_bytes3(br, D, 4)},
        {(void **)&sc->qt, fa_bytes3(qt_rows, D, 4)},
        {(void **)&sc->k, fa_bytes3(bc, D, 4)},
        {(void **)&sc->v, fa_bytes3(bc, Dv, 4)},
        {(void **)&sc->st, st_floats * 4},
        {(void **)&sc->acc, fa_bytes3(acc_rows, job->ldacc, 4)},
        {(void **)&sc->m, state * 4},
        {(void **)&sc->l, state * 4},
        {(void **)&sc->alpha, state * 4},
        {(void **)&sc->lo, bp * 4},
        {(void **)&sc->hi, bp * 4},
        {(void **)&sc->kp, bc * (int64_t)sizeof(void *)},
        {(void **)&sc->vp, bc * (int64_t)sizeof(void *)},
        {(void **)&sc->ks, bc * 4},
        {(void **)&sc->vs, bc * 4},
        {(void **)&sc->q8, fa_bytes3(qt_rows * job->digits, fa_q8_ld(D), 1)},
        {(void **)&sc->q8s, job->digits ? qt_rows * 4 : 0},
        {(void **)&sc->wq8, job->wide_digits ? fa_bytes3(bp * 2, fa_q8_ld(2 * D), 1) : 0},
        {(void **)&sc->wk8, job->wide_digits ? fa_bytes3(bc + 2, fa_q8_ld(2 * D), 1) : 0},
        {(void **)&sc->wy, job->wide_digits ? fa_bytes3(D, 4, 1) : 0},
        {(void **)&sc->wsum, job->wide_digits ? fa_bytes3(D, 8, 1) : 0},
        {(void **)&sc->wq8s, job->wide_digits ? bp * 4 : 0},
        {(void **)&sc->wqc, job->wide_digits ? bp * 4 : 0},
        {(void **)&sc->wkbar, job->wide_digits ? fa_bytes3(D, 4, 1) : 0},
        {(void **)&sc->wst, job->wide_digits ? fa_bytes3(bp, job->lds, 4) : 0},
        {(void **)&sc->bms, fa_bmask_scratch(job->p, bc) * 8},
        {(void **)&sc->q16, b16 ? fa_bytes3(mm ? T * bp : br, D, 2) : 0},
        {(void **)&sc->qt2, b16 ? fa_bytes3((T * D + 1) / 2 * 2, bp, 2) : 0},
        /* a pack step may take one row more than a tile (kv.h: its rows start even) */
        {(void **)&sc->k16, b16 || job->wide_digits ? fa_bytes3(T * (bc + 1), D, 2) : 0}, /* int8: kbar's bf16 rows */
        {(void **)&sc->v16, b16 ? fa_bytes3(T2 * (bc + 1), Dv, 2) : 0},
        {(void **)&sc->v_pairs, b16 ? fa_bytes3(T2 * ((bc + 2) / 2), fa_packed_ld(Dv), 4) : 0},
        {(void **)&sc->pv_scratch, b16 ? 4 * FA_PV_BF16_SCRATCH(bp, bc, Dv) : 0},
        /* (f32 as bf16 products: rows of T * D) */
        {(void **)&sc->qa, job->fused ? fa_bytes3(bp, FA_RUP32(T * D), 2) : 0},
        {(void **)&sc->kt, job->fused || job->path->keys == Q8_KEYS_KT ? fa_bytes3((bc + 15) / 16, 16 * FA_KT_PAIRS(T * D), 4) : 0},
        {(void **)&sc->fwd_scratch, job->fused || job->path->keys == Q8_KEYS_KT ? FA_FWD_BF16_SCRATCH(bc, Dv) : 0},
        {(void **)&sc->qt4, job->path->keys == Q8_KEYS_ROWS ? fa_bytes3(FA_QT4_QUADS(D), bp, 4) : 0},
        {(void **)&sc->row16, mm ? fa_bytes3(row_max, 2, 1) : 0},
        {(void **)&sc->rowf, mm ? fa_bytes3(row_max, 8, 1) : 0},
    };
    return fa_ws_layout(parts, sizeof parts / sizeof parts[0], base);
}

/* The band of a tile for the softmax kernel, for ng stacked heads of n rows each
 * (the same rows i0.. for every head): returns 1 when the tile is partly masked;
 * *tlo, *thi are then the per-row bounds, or NULL where element-wise rules (which
 * wrote -inf into the scores themselves) leave every column to the kernel. */
static int stacked_band(const fa_problem *p, const fa_view *s, int elementwise, int64_t i0, int64_t n, int64_t ng,
                        int64_t j0, int64_t cols, int32_t *lo, int32_t *hi, const int32_t **tlo, const int32_t **thi)
{
    *tlo = *thi = NULL;
    if (elementwise) return 1;
    if (fa_tile_band(p, s, i0, n, j0, cols, lo, hi)) return 0;
    for (int64_t g = 1; g < ng; g++) {
        memcpy(lo + g * n, lo, (size_t)n * sizeof *lo);
        memcpy(hi + g * n, hi, (size_t)n * sizeof *hi);
    }
    *tlo = lo;
    *thi = hi;
    return 1;
}

/* A block-masked tile whose kept pairs are one run of columns per row (a causal
 * diagonal block, a document's edge): the runs as the softmax kernel's bounds, cut
 * by the band's (*tlo != NULL), so no -inf is written and exponentiated, and the
 * trimmed path may take it as it takes the band; 1 then. Else 0, and the band's
 * bounds as they were. */
static int bmask_bounds(const fa_problem *p, const fa_view *s, const flash_scratch *sc, int64_t i0, int64_t n,
                        int64_t ng, int64_t h0, int64_t j0, int64_t cols, const int32_t **tlo, const int32_t **thi)
{
    const int band = *tlo != NULL;
    for (int64_t g = 0; g < ng; g++)
        if (!fa_bmask_runs(p, s, 0, h0 + g, i0, n, j0, cols, band, sc->lo + g * n, sc->hi + g * n, sc->bms)) {
            if (band) stacked_band(p, s, 0, i0, n, ng, j0, cols, sc->lo, sc->hi, tlo, thi);
            return 0;
        }
    *tlo = sc->lo;
    *thi = sc->hi;
    return 1;
}

/* A tile under a boolean mask (the only element-wise rule: fused_mask) whose kept
 * pairs are one run of columns per row of every stacked head: the runs, cut by the
 * band, as the fused kernel's bounds in sc->lo, sc->hi, and 1; *keeps: 0 when no row
 * keeps a pair, 1 when some do, 2 when every row keeps every column (no bounds then).
 * Else 0: the careful path applies the mask score by score. */
static int mask_bounds(const fa_problem *p, const fa_view *s, const flash_scratch *sc, int64_t i0, int64_t n,
                       int64_t ng, int64_t h0, int64_t j0, int64_t cols, int *keeps)
{
    const int band = !fa_tile_band(p, s, i0, n, j0, cols, sc->lo, sc->hi);
    for (int64_t g = 1; band && g < ng; g++) {
        memcpy(sc->lo + g * n, sc->lo, (size_t)n * sizeof *sc->lo);
        memcpy(sc->hi + g * n, sc->hi, (size_t)n * sizeof *sc->hi);
    }
    for (int64_t g = 0; g < ng; g++)
        if (!fa_mask_runs(s, 0, h0 + g, i0, n, j0, cols, band, sc->lo + g * n, sc->hi + g * n)) return 0;
    int some = 0, all = 1;
    for (int64_t r = 0; r < n * ng; r++) {
        some |= sc->lo[r] <= sc->hi[r];
        all &= sc->lo[r] == 0 && sc->hi[r] == cols - 1;
    }
    *keeps = all ? 2 : some;
    return 1;
}

/* A boolean mask is the call's only element-wise rule: the fused forward takes its
 * tiles by their runs (mask_bounds). */
static int fused_mask(const fa_problem *p)
{
    return p->has_mask && !p->has_bias && !p->alibi && !(p->softcap > 0.0f);
}

/* Normalises one stack's rows (ng heads from h0, n rows each, from i0); a row that
 * kept nothing is 0 with lse = -inf. A key chunk's result goes to its slot for the
 * merge, a whole row straight to o, its head's sink then added (fa_row_norm; a key
 * chunk's rows take theirs after the merge, so it enters once). slot_row0: the
 * stack's first row in the slot. */
static void finish_rows(const flash_job *job, const fa_view *s, const fa_task *it, int64_t h0, int64_t i0,
                        int64_t n, int64_t ng, const float *m, const float *l, float *acc, int64_t slot_row0)
{
    const fa_problem *p = job->p;
    const int64_t Dv = p->Dv, ldacc = job->ldacc, rows = n * ng;
    float *slot = it->nsplit > 1 ? job->slots + (it->slot + it->split) * job->slot_floats : NULL;
    for (int64_t r = 0; r < rows; r++) {
        float *ar = acc + r * ldacc;
        float lse;
        const float f = fa_row_norm(m[r], l[r], slot ? -INFINITY : fa_sink(p, h0 + r / n), &lse);
        if (m[r] == -INFINITY)
            memset(ar, 0, (size_t)Dv * sizeof *ar);
        else
            for (int64_t e = 0; e < Dv; e++) ar[e] *= f;
        if (slot) {
            memcpy(slot + (slot_row0 + r) * ldacc, ar, (size_t)Dv * sizeof *ar);
            slot[job->slot_lse + slot_row0 + r] = lse;
        } else if (p->has_lse) {
            float *out = s->lse.data;
            out[(h0 + r / n) * s->lse.stride[1] + (i0 + r % n) * s->lse.stride[2]] = lse;
        }
    }
    if (!slot)
        for (int64_t g = 0; g < ng; g++) fa_store_rows(&s->o, job->kern, 0, i0, n, h0 + g, Dv, acc + g * n * ldacc, ldacc);
}

/*
 * Small-row path (decoding): nkv stacks of <= FA_SMALL_ROWS rows, each its own
 * online softmax state, walk the keys together, tile by tile, stack by stack. In
 * the usual (B, S, H, D) cache layout the kv heads of one key sit side by side, so
 * a tile of all heads is one contiguous stretch of memory, which main memory
 * streams far better than one head's rows a whole row of heads apart.
 */
/* What the block mask leaves of one small-row stack's tile (heads h0 .. h0+ng-1, n
 * rows each): 0 nothing, 1 every pair, 2 some (some head's); with `st`, it removes
 * the pairs it does not keep from the stack's (rows, lds) scores. */
static int small_bmask(const fa_problem *p, const fa_view *s, const flash_scratch *sc, int64_t h0, int64_t ng,
                       int64_t i0, int64_t n, int64_t j0, int64_t cols, float *st, int64_t lds)
{
    int any = 0, bits = 0;
    for (int64_t g = 0; g < ng; g++) {
        const int kind = fa_bmask_tile(p, s, 0, h0 + g, i0, n, j0, cols, sc->bms);
        any |= kind != 0;
        bits |= kind != 1; /* a head it removes the tile for, among others it does not */
        if (st && kind != 1) fa_bmask_apply(p, s, 0, h0 + g, i0, n, j0, cols, st + g * n * lds, 1, lds, sc->bms);
    }
    return !any ? 0 : bits ? 2 : 1;
}

/* The first SMALL_PF_ROWS rows from key j0 of kv head hk's K (which 0) or V (1) towards
 * L1: the kernels prefetch each row a few keys ahead of its use, so the first rows of
 * every call would arrive with the whole memory latency; issued one call early they do
 * not. A hint only (rows past hi are left alone). */
/* SMALL_QK_PIECE: a multiple of 16 keys, so every piece's scores start 64-byte aligned */
enum { SMALL_PF_ROWS = 32, SMALL_QK_PIECE = 64 };
#define SMALL_AHEAD_BYTES ((int64_t)32 << 20)
static void small_prefetch_start(const fa_problem *p, const fa_view *s, int which, int64_t j0, int64_t hi, int64_t hk,
                                 int64_t dim)
{
    const fa_tensor *t = which ? &s->v : &s->k;
    if (t->stride[3] != 1) return;
    const int64_t bytes = dim * (int64_t)fa_dtype_size(t->dtype);
    for (int64_t j = j0; j <= hi && j < j0 + SMALL_PF_ROWS; j++) {
        const char *row = fa_kv_row(p, s, which, j, hk, NULL);
        const char *end = row + bytes;
        for (const char *b = (const char *)((uintptr_t)row & ~(uintptr_t)63); b < end; b += 64) __builtin_prefetch(b, 0, 3);
    }
}

/* Before stack k's P V on the tile at j0: the next call's first keys, the next stack's
 * (when it reads another kv head) or the next tile's. */
static void small_prefetch_next(const flash_job *job, const fa_view *s, const fa_task *it, int64_t k, int64_t j0,
                                int64_t hi)
{
    const int64_t group = job->p->group, ng = it->ng, h0 = it->h0 + k * ng, hk = h0 / group;
    const int last = k + 1 == it->nkv;
    const int64_t hn = last ? it->h0 / group : (h0 + ng) / group, jn = last ? j0 + job->plan.bc : j0;
    if ((!last && hn != hk) || (last && jn <= hi)) small_prefetch_start(job->p, s, 0, jn, hi, hn, job->p->D);
}

/* The rows after stack k's on the tile at j0: the next stack's (another kv head's, of
 * the same tile), or after the last stack the first one's of the next tile; kv head *hn,
 * keys *jn .. *jn + *nn - 1. 0 when there are none, or when the next stack reads stack
 * k's kv head, whose rows stack k brings in itself. */
static int small_next(const flash_job *job, const fa_task *it, int64_t k, int64_t j0, int64_t hi, int64_t *hn,
                      int64_t *jn, int64_t *nn)
{
    const int64_t group = job->p->group, ng = it->ng, hk = (it->h0 + k * ng) / group;
    const int last = k + 1 == it->nkv;
    *hn = last ? it->h0 / group : (it->h0 + (k + 1) * ng) / group;
    *jn = last ? j0 + job->plan.bc : j0;
    if ((!last && *hn == hk) || *jn > hi) return 0;
    *nn = *jn + job->plan.bc <= hi + 1 ? job->plan.bc : hi + 1 - *jn;
    return 1;
}

/* While stack k computes on the tile at j0: small_next's K rows, and V's unless `v` is 0
 * (a kernel that prefetches them itself, fa_rows_ahead), towards L2; the share
 * [c, c + cc) / cols of them, so that the pieces of stack k's QK issue them in step with
 * its compute. The kernels' own prefetches (towards L1, a few rows ahead) then find them
 * in L2, not in DRAM: one stack ahead keeps misses in flight while the compute runs,
 * where the kernels alone keep only a few rows' worth. Farther ahead evicts what is
 * still to be used; L1 has too few miss buffers for a stack's worth. A hint only. */
static void small_prefetch_ahead(const flash_job *job, const fa_view *s, const fa_task *it, int64_t k, int64_t j0,
                                 int64_t hi, int64_t c, int64_t cc, int64_t cols, int v)
{
    const fa_problem *p = job->p;
    int64_t hn, jn, nn;
    if (!job->small_ahead || !small_next(job, it, k, j0, hi, &hn, &jn, &nn)) return;
    for (int which = 0; which < 1 + v; which++) {
        const fa_tensor *t = which ? &s->v : &s->k;
        if (t->stride[3] != 1 || (which && p->v_in_k)) continue;
        const int64_t bytes = (which ? p->Dv : p->D) * (int64_t)fa_dtype_size(t->dtype);
        const int64_t ja = jn + c * nn / cols, jb = jn + (c + cc) * nn / cols;
        if (ja >= jb) continue;
        /* evenly spaced rows (one cache row or page) step by the row stride */
        const int64_t step =
            fa_cache_one_block(s->pages, p->page_size, ja, jb - ja) ? t->stride[1] * (int64_t)fa_dtype_size(t->dtype) : 0;
        const char *row = fa_kv_row(p, s, which, ja, hn, NULL);
        for (int64_t j = ja; j < jb; j++, row += step) {
            if (!step) row = fa_kv_row(p, s, which, j, hn, NULL);
            for (const char *b = (const char *)((uintptr_t)row & ~(uintptr_t)63); b < row + bytes; b += 64)
                __builtin_prefetch(b, 0, 2);
        }
    }
}


/* The next stack's V rows (small_next's) for pv_small_i8 to prefetch in step with its
 * loop, in *ahead over the caller's nvp and nvs; NULL where there are none to take. */
static const fa_rows_ahead *small_v_ahead(const flash_job *job, const fa_view *s, const fa_task *it, int64_t k,
                                          int64_t j0, int64_t hi, const void **nvp, float *nvs, fa_rows_ahead *ahead)
{
    const fa_problem *p = job->p;
    int64_t hn, jn, nn;
    if (!job->small_ahead || p->v_in_k || s->v.stride[3] != 1 || !small_next(job, it, k, j0, hi, &hn, &jn, &nn))
        return NULL;
    fa_kv_row_ptrs(p, s, 1, jn, nn, hn, nvp, nvs);
    *ahead = (fa_rows_ahead){nvp, nn, p->Dv * (int64_t)fa_dtype_size(s->v.dtype)};
    return ahead;
}

/* A small-row tile's K and V rows: pointers, and their scales where the cache is
 * quantised (NULL otherwise, as the kernels take it). A latent V's rows and scales are
 * K's: read once, and P V finds them in cache after Q K. */
typedef struct {
    const void *const *k, *const *v;
    const float *ks, *vs;
} small_rows;

/* Keys j0 .. j0+cols-1 of kv head hk in sc's row pointers and scales, rows of a
 * non-unit inner stride gathered (the path depends on shapes only, never on strides:
 * layouts give identical bits). */
static small_rows small_kv_rows(const flash_job *job, const flash_scratch *sc, const fa_view *s, int64_t j0,
                                int64_t cols, int64_t hk)
{
    const fa_problem *p = job->p;
    fa_kv_row_ptrs(p, s, 0, j0, cols, hk, sc->kp, sc->ks);
    if (s->k.stride[3] != 1) fa_kv_gather_strided(&s->k, sc->kp, cols, p->D, sc->k);
    if (!p->v_in_k) {
        fa_kv_row_ptrs(p, s, 1, j0, cols, hk, sc->vp, sc->vs);
        if (s->v.stride[3] != 1) fa_kv_gather_strided(&s->v, sc->vp, cols, p->Dv, sc->v);
    }
    const float *vs = p->v_in_k ? sc->ks : sc->vs;
    return (small_rows){sc->kp, p->v_in_k ? sc->kp : sc->vp, p->quant ? sc->ks : NULL, p->quant ? vs : NULL};
}

static void flash_task_small(const flash_job *job, const flash_scratch *sc, const fa_view *s, const fa_task *it)
{
    const fa_problem *p = job->p;
    const fa_kernels *kern = job->kern;
    const int64_t D = p->D, Dv = p->Dv, ldacc = job->ldacc, lds = job->lds;
    const int64_t i0 = (int64_t)it->qb * job->plan.br;
    const int64_t n = s->Sq - i0 < job->plan.br ? s->Sq - i0 : job->plan.br;
    const int64_t ng = it->ng, rows = n * ng, nkv = it->nkv;
    const int elementwise = fa_problem_has_elementwise(p);
    const int kvt = fa_kv_type(s->k.dtype);
    /* FA_PARAM_QUANT_MATMUL (docs/semantics.md, 11): both products on int8 digits */
    const int q8 = kvt == FA_KV_I8 ? job->digits : 0;
    const int64_t ldq8 = fa_q8_ld(D);
    /* stack k: heads h0 + k*ng .., state at these offsets */
#define STACK_Q(k) (sc->qt + (k) * FA_SMALL_ROWS * D)
#define STACK_Q8(k) (sc->q8 + (k) * FA_SMALL_ROWS * q8 * ldq8)
#define STACK_ACC(k) (sc->acc + (k) * FA_SMALL_ROWS * ldacc)
#define STACK_M(k) (sc->m + (k) * FA_ROW_ALIGN)
#define STACK_L(k) (sc->l + (k) * FA_ROW_ALIGN)
#define STACK_ALPHA(k) (sc->alpha + (k) * FA_ROW_ALIGN)
    for (int64_t k = 0; k < nkv; k++) {
        const int64_t h0 = it->h0 + k * ng;
        for (int64_t g = 0; g < ng; g++) {
            int64_t ldq;
            const float *q = fa_rows_f32(&s->q, kern, 0, i0, n, h0 + g, D, sc->q, &ldq);
            for (int64_t r = 0; r < n; r++)
                for (int64_t x = 0; x < D; x++) STACK_Q(k)[(g * n + r) * D + x] = p->scale * q[r * ldq + x];
        }
        for (int64_t r = 0; q8 && r < rows; r++)
            sc->q8s[k * FA_SMALL_ROWS + r] = kern->quant_row_i8(STACK_Q(k) + r * D, D, q8, STACK_Q8(k) + r * q8 * ldq8);
        for (int64_t r = 0; r < rows; r++) {
            STACK_M(k)[r] = -INFINITY;
            STACK_L(k)[r] = 0.0f;
        }
        memset(STACK_ACC(k), 0, (size_t)(rows * ldacc) * sizeof(float));
    }

    int64_t lo, hi;
    fa_task_columns(p, s, it, i0, n, &lo, &hi);
    for (int64_t j0 = lo; j0 <= hi; j0 += job->plan.bc) {
        const int64_t cols = hi - j0 + 1 < job->plan.bc ? hi - j0 + 1 : job->plan.bc;
        /* a band-only tile passes its bounds to the kernel, the same for every head */
        const int32_t *tlo, *thi;
        const int partial = stacked_band(p, s, elementwise, i0, n, ng, j0, cols, sc->lo, sc->hi, &tlo, &thi);
        small_rows kv = {0};
        for (int64_t k = 0; k < nkv; k++) {
            const int64_t h0 = it->h0 + k * ng, hk = h0 / p->group;
            if (k == 0 || hk != (h0 - ng) / p->group) kv = small_kv_rows(job, sc, s, j0, cols, hk);
            const int bm = p->bm.on ? small_bmask(p, s, sc, h0, ng, i0, n, j0, cols, NULL, lds) : 1;
            if (bm == 0) continue; /* the block mask removes the tile for the whole stack */
            if (Dv > 0 && !p->v_in_k) small_prefetch_start(p, s, 1, j0, hi, hk, Dv);
            double t0 = fa_phase_start(job->phases);
            /* QK in pieces with the next stack's prefetches between them (one without): a
             * score depends on its own key only, so the pieces give the whole call's bits */
            const int64_t piece = job->small_ahead ? SMALL_QK_PIECE : cols;
            for (int64_t c = 0; c < cols; c += piece) {
                const int64_t cc = cols - c < piece ? cols - c : piece;
                const float *ks = kv.ks ? kv.ks + c : NULL;
                if (q8)
                    kern->qk_small_i8(rows, cc, D, q8, STACK_Q8(k), ldq8, sc->q8s + k * FA_SMALL_ROWS, kv.k + c, ks,
                                      sc->st + c, lds);
                else
                    kern->qk_small(rows, cc, D, STACK_Q(k), D, kv.k + c, kvt, ks, sc->st + c, lds);
                small_prefetch_ahead(job, s, it, k, j0, hi, c, cc, cols, !q8);
            }
            t0 = fa_phase_mark(job->phases, FA_PH_S, t0);
            fa_phase_flops(job->phases, FA_PH_S, fa_tile_flops(job->phases, 2 * D, rows, cols, tlo, thi));
            if (elementwise)
                for (int64_t g = 0; g < ng; g++)
                    fa_scores_finish(p, s, 0, h0 + g, i0, n, j0, cols, sc->st + g * n * lds, 1, lds);
            if (bm == 2) small_bmask(p, s, sc, h0, ng, i0, n, j0, cols, sc->st, lds);
            kern->softmax_small(rows, cols, sc->st, lds, tlo, thi, STACK_M(k), STACK_L(k), STACK_ALPHA(k));
            t0 = fa_phase_mark(job->phases, FA_PH_X, t0);
            small_prefetch_next(job, s, it, k, j0, hi);
            /* a vector kernel multiplies a masked p = 0 by v too: a NaN/inf in a masked V
             * row would leak into rows that never see it, so such tiles take the
             * reference kernel, which skips p == 0 */
            const int careful = (partial || bm == 2) && !fa_kv_rows_finite(kv.v, kvt, kv.vs, cols, Dv);
            const fa_kernels *pk = careful ? &fa_kernels_ref : kern;
            if (Dv > 0 && q8) {
                const void *nvp[FA_SMALL_COLS];
                float nvs[FA_SMALL_COLS];
                fa_rows_ahead ahead;
                pk->pv_small_i8(rows, cols, Dv, q8, sc->st, lds, kv.v, kv.vs, STACK_ALPHA(k), STACK_ACC(k), ldacc,
                                small_v_ahead(job, s, it, k, j0, hi, nvp, nvs, &ahead));
            } else if (Dv > 0) /* Dv = 0: the lse is all there is to compute */
                pk->pv_small(rows, cols, Dv, sc->st, lds, kv.v, kvt, kv.vs, STACK_ALPHA(k), STACK_ACC(k), ldacc);
            fa_phase_mark(job->phases, FA_PH_P, t0);
            fa_phase_flops(job->phases, FA_PH_P, fa_tile_flops(job->phases, 2 * Dv, rows, cols, tlo, thi));
        }
    }
    for (int64_t k = 0; k < nkv; k++)
        finish_rows(job, s, it, it->h0 + k * ng, i0, n, ng, STACK_M(k), STACK_L(k), STACK_ACC(k), k * rows);
#undef STACK_Q
#undef STACK_Q8
#undef STACK_ACC
#undef STACK_M
#undef STACK_L
#undef STACK_ALPHA
}

/* kbar: the mean of every key of s's kv head hk, into sc->wkbar (sums in sc->wsum, each
 * channel's in key order); whether it is finite (else no smoothing). bf16 K rows are
 * summed by the table's sum_rows_bf16 as they are stored rather than through an f32
 * tile (the same bits: the widening is exact). */
static int q8_key_mean(const flash_job *job, const flash_scratch *sc, const fa_view *s, int64_t hk)
{
    const fa_problem *p = job->p;
    const fa_kernels *kern = job->kern;
    const int64_t D = job->p->D;
    const int bf16 = s->k.dtype == FA_DTYPE_BF16 && p->kv->tile_u16;
    double *sum = sc->wsum;
    for (int64_t x = 0; x < D; x++) sum[x] = 0.0;
    for (int64_t j0 = 0; j0 < s->Sk; j0 += job->plan.bc) {
        const int64_t cols = s->Sk - j0 < job->plan.bc ? s->Sk - j0 : job->plan.bc;
        int64_t ldk;
        if (bf16) {
            const uint16_t *k16 = fa_kv_tile_u16(p, s, 0, j0, cols, hk, D, sc->k16, &ldk);
            kern->sum_rows_bf16(cols, D, k16, ldk, sum);
            continue;
        }
        const float *k = fa_kv_tile_f32(p, s, 0, kern, j0, cols, hk, D, sc->k, &ldk);
        for (int64_t c = 0; c < cols; c++)
            for (int64_t x = 0; x < D; x++) sum[x] += k[c * ldk + x];
    }
    int smooth = 1;
    for (int64_t x = 0; x < D; x++) sc->wkbar[x] = (float)(sum[x] / (double)s->Sk);
    for (int64_t x = 0; x < D; x++) smooth &= isfinite(sc->wkbar[x]);
    return smooth;
}

/* flash_task_q8's q rows i0..i0+n of heads h0..h0+ng: x = scale q (sc->qt), its codes
 * (digit rows of ld8; kd, K's digits) and scale, c = x . kbar when smooth */
static void q8_quantise_q(const flash_job *job, const flash_scratch *sc, const fa_view *s, int64_t i0, int64_t n,
                          int64_t ng, int64_t h0, int smooth, int kd, int64_t ld8)
{
    const fa_problem *p = job->p;
    const int64_t D = p->D, ldd = fa_q8_ld(D);
    const int digits = job->wide_digits;
    for (int64_t g = 0; g < ng; g++) {
        int64_t ldq;
        const float *q = fa_rows_f32(&s->q, job->kern, 0, i0, n, h0 + g, D, sc->q, &ldq);
        float *const x0 = sc->qt + g * n * D;
        for (int64_t r = 0; r < n; r++)
            for (int64_t e = 0; e < D; e++) x0[r * D + e] = p->scale * q[r * ldq + e];
        if (smooth)
            job->kern->dot_rows_f64(n, D, x0, D, sc->wkbar, sc->wqc + g * n);
        else
            for (int64_t r = 0; r < n; r++) sc->wqc[g * n + r] = 0.0f;
        for (int64_t r = 0; r < n; r++) {
            const int64_t row = g * n + r;
            float *x = sc->qt + row * D;
            int8_t *q8 = sc->wq8 + row * digits * ld8;
            if (kd == 1) {
                sc->wq8s[row] = job->kern->quant_row_i8(x, D, digits, q8);
                continue;
            }
            int8_t *tmp = sc->wk8 + job->plan.bc * ld8; /* the spare K row */
            sc->wq8s[row] = job->kern->quant_row_i8(x, D, 2, tmp);
            memset(q8, 0, (size_t)(2 * ld8));
            memcpy(q8, tmp, (size_t)D);                  /* [a | 0] */
            memcpy(q8 + ld8, tmp + ldd, (size_t)D);      /* [b | a] */
            memcpy(q8 + ld8 + D, tmp, (size_t)D);
        }
    }
}

/*
 * The wide path on int8 products (FA_PARAM_QUANT_MATMUL; docs/semantics.md, 11, "Keys the
 * library quantises"): q rows quantised once per task, each key tile's rows smoothed by
 * the (sequence, kv head)'s mean and quantised (float K) or taken as stored (an int8
 * cache), scores row-major, and the task's rows run in stacks of FA_SMALL_ROWS through
 * the small-row kernels (qk_small_i8, softmax_small, and pv_small on float V, exact, or
 * pv_small_i8 on an int8 cache's). With two digits over float K, K's second digit rides
 * along the reduction: K rows [kh | kl], q's digit rows [a | 0] and [b | a], so
 * qk_small_i8's A and B are the contract's. A task's only step (wide_q8 jobs pack no K/V).
 */
static void flash_task_q8(const flash_job *job, const flash_scratch *sc, const fa_view *s, const fa_task *it)
{
    const fa_problem *p = job->p;
    const fa_kernels *kern = job->kern;
    const int64_t D = p->D, Dv = p->Dv, ldacc = job->ldacc, lds = job->lds;
    const int64_t i0 = (int64_t)it->qb * job->plan.br, ng = it->ng, h0 = it->h0, hk = h0 / p->group;
    const int64_t n = s->Sq - i0 < job->plan.br ? s->Sq - i0 : job->plan.br, rows = n * ng;
    const int kvt = fa_kv_type(s->k.dtype), cache8 = kvt == FA_KV_I8, digits = job->wide_digits;
    const int kd = cache8 ? 1 : digits;                   /* K's digits */
    const int64_t dk = kd == 2 ? 2 * D : D, ld8 = fa_q8_ld(dk), ldd = fa_q8_ld(D);
    const int elementwise = fa_problem_has_elementwise(p);
    /* kbar over every key of the (sequence, kv head); none for an int8 cache, or where
     * it is not finite */
    const double tq = fa_phase_start(job->phases);
    const int smooth = !cache8 && q8_key_mean(job, sc, s, hk);
    q8_quantise_q(job, sc, s, i0, n, ng, h0, smooth, kd, ld8);
    for (int64_t r = 0; r < rows; r++) {
        sc->m[r] = -INFINITY;
        sc->l[r] = 0.0f;
    }
    memset(sc->acc, 0, (size_t)(rows * ldacc) * sizeof(float));
    fa_phase_mark(job->phases, FA_PH_X, tq); /* the task's prologue: kbar and q's codes */

    int64_t lo, hi;
    fa_task_columns(p, s, it, i0, n, &lo, &hi);
    const void *const *vrow = sc->vp;
    const int vkt = fa_kv_type(s->v.dtype);
    for (int64_t j0 = lo; j0 <= hi; j0 += job->plan.bc) {
        const int64_t cols = hi - j0 + 1 < job->plan.bc ? hi - j0 + 1 : job->plan.bc;
        const int32_t *tlo, *thi;
        const int partial = stacked_band(p, s, elementwise, i0, n, ng, j0, cols, sc->lo, sc->hi, &tlo, &thi);
        double t0 = fa_phase_start(job->phases);
        /* V rows (a latent V's view: K's own rows, read before K is requantised below) */
        fa_kv_row_ptrs(p, s, 1, j0, cols, hk, sc->vp, sc->vs);
        if (s->v.stride[3] != 1) fa_kv_gather_strided(&s->v, sc->vp, cols, Dv, sc->v);
        /* 1. K codes: an int8 cache's rows, or the tile smoothed and quantised */
        if (cache8) {
            fa_kv_row_ptrs(p, s, 0, j0, cols, hk, sc->kp, sc->ks);
            if (s->k.stride[3] != 1) fa_kv_gather_strided(&s->k, sc->kp, cols, D, sc->k);
        } else {
            int64_t ldk;
            const float *k = fa_kv_tile_f32(p, s, 0, kern, j0, cols, hk, D, sc->k, &ldk);
            float *y = sc->wy;
            int8_t *tmp = sc->wk8 + job->plan.bc * ld8;
            for (int64_t c = 0; c < cols; c++) {
                for (int64_t e = 0; e < D; e++) y[e] = smooth ? k[c * ldk + e] - sc->wkbar[e] : k[c * ldk + e];
                int8_t *k8 = sc->wk8 + c * ld8;
                sc->ks[c] = kern->quant_row_i8(y, D, kd, kd == 2 ? tmp : k8);
                if (kd == 2) memcpy(k8, tmp, (size_t)D), memcpy(k8 + D, tmp + ldd, (size_t)D); /* [kh | kl] */
                sc->kp[c] = k8;
            }
        }
        for (int64_t r0 = 0; r0 < rows; r0 += FA_SMALL_ROWS) {
            const int64_t nr = rows - r0 < FA_SMALL_ROWS ? rows - r0 : FA_SMALL_ROWS;
            kern->qk_small_i8(nr, cols, dk, digits, sc->wq8 + r0 * digits * ld8, ld8, sc->wq8s + r0, sc->kp, sc->ks,
                              sc->wst + r0 * lds, lds);
        }
        if (smooth)
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++) sc->wst[r * lds + c] += sc->wqc[r];
        t0 = fa_phase_mark(job->phases, FA_PH_S, t0);
        fa_phase_flops(job->phases, FA_PH_S, fa_tile_flops(job->phases, 2 * D, rows, cols, tlo, thi));
        /* 2-5 */
        if (elementwise)
            for (int64_t g = 0; g < ng; g++)
                fa_scores_finish(p, s, 0, h0 + g, i0, n, j0, cols, sc->wst + g * n * lds, 1, lds);
        /* 6-7, then 9, stack by stack (their state copied to aligned rows, as the kernels take it) */
        const float *vscale = p->quant ? sc->vs : NULL;
        const fa_kernels *pk =
            partial && kern != &fa_kernels_ref && !fa_kv_rows_finite(vrow, vkt, vscale, cols, Dv) ? &fa_kernels_ref : kern;
        for (int64_t r0 = 0; r0 < rows; r0 += FA_SMALL_ROWS) {
            const int64_t nr = rows - r0 < FA_SMALL_ROWS ? rows - r0 : FA_SMALL_ROWS;
            _Alignas(64) float m[FA_ROW_ALIGN], l[FA_ROW_ALIGN], alpha[FA_ROW_ALIGN];
            memcpy(m, sc->m + r0, (size_t)nr * sizeof *m);
            memcpy(l, sc->l + r0, (size_t)nr * sizeof *l);
            float *st = sc->wst + r0 * lds, *acc = sc->acc + r0 * ldacc;
            kern->softmax_small(nr, cols, st, lds, tlo ? tlo + r0 : NULL, thi ? thi + r0 : NULL, m, l, alpha);
            memcpy(sc->m + r0, m, (size_t)nr * sizeof *m);
            memcpy(sc->l + r0, l, (size_t)nr * sizeof *l);
            if (Dv > 0 && cache8)
                pk->pv_small_i8(nr, cols, Dv, digits, st, lds, vrow, vscale, alpha, acc, ldacc, NULL);
            else if (Dv > 0)
                pk->pv_small(nr, cols, Dv, st, lds, vrow, vkt, vscale, alpha, acc, ldacc);
        }
        fa_phase_mark(job->phases, FA_PH_P, t0);
        fa_phase_flops(job->phases, FA_PH_P, fa_tile_flops(job->phases, 2 * Dv, rows, cols, tlo, thi));
    }
    finish_rows(job, s, it, h0, i0, n, ng, sc->m, sc->l, sc->acc, 0);
}

/* A wide task's fixed facts, shared by its steps below. */
struct wide_task {
    const fa_view *s;    /* its sequence's view (B = 1; the call is job->p) */
    int64_t i0, n;       /* first row and rows per head */
    int64_t ng, rows;    /* heads stacked from h0, and so rows n * ng */
    int64_t h0, hk;
    const char *unit;    /* its K/V packed (kv.h), or NULL: the caller's tensors */
    int64_t key0;        /* the unit's first key (a chunk of a long unit, tasks.h) */
    const uint16_t *k16; /* the bf16 path: the tile's K rows as step 1 read them, ldk16 apart; a */
    int64_t ldk16;       /* latent V (v_in_k) is their first Dv columns */
    const uint16_t *qa;  /* the fused forward: Q rows as its kernel reads them, ldqa apart */
    int64_t ldqa;
};

/* The fused forward's Q: rows bf16 in whole tiles (FA_RUP32(D) columns, FA_RUP16(rows)
 * rows): the rows where they are when they are whole tiles already, else copied and
 * zero-padded. */
static void fused_q(const flash_scratch *sc, wide_task *w, const uint16_t *q, int64_t ldq, int64_t rows, int64_t D)
{
    const int64_t ld = FA_RUP32(D);
    if (D == ld && rows % 16 == 0) {
        w->qa = q;
        w->ldqa = ldq;
        return;
    }
    w->qa = sc->qa;
    w->ldqa = ld;
    for (int64_t r = 0; r < FA_RUP16(rows); r++) {
        uint16_t *dst = sc->qa + r * ld;
        if (r < rows) {
            memcpy(dst, q + r * ldq, (size_t)D * sizeof *dst);
            memset(dst + D, 0, (size_t)(ld - D) * sizeof *dst);
        } else {
            memset(dst, 0, (size_t)ld * sizeof *dst);
        }
    }
}

/* One stacked head's n rows of D elements (es bytes), ldq apart at q, to dst one after
 * another, unless the row reader left them there already. */
static void stack_rows(void *dst, const void *q, int64_t ldq, int64_t n, int64_t D, size_t es)
{
    if (q == dst) return;
    const int64_t e = (int64_t)es; /* signed: ldq may be negative (a reversed tensor) */
    for (int64_t r = 0; r < n; r++) memcpy((char *)dst + r * D * e, (const char *)q + r * ldq * e, (size_t)(D * e));
}

/* The Q rows of the stacked heads h0 .. h0+ng as one block of w->rows rows, bf16 as
 * stored or f32: a single head's where the row reader leaves them (*ldq apart), else
 * each head's n rows one after another in buf (D apart). */
static const void *stacked_q(const flash_job *job, const wide_task *w, void *buf, int bf16, int64_t *ldq)
{
    const fa_view *s = w->s;
    const fa_problem *p = job->p;
    const int64_t D = p->D, n = w->n;
    const size_t es = bf16 ? sizeof(uint16_t) : sizeof(float);
    for (int64_t g = 0; g < w->ng; g++) {
        void *dst = (char *)buf + g * n * D * (int64_t)es;
        const void *q = bf16 ? (const void *)fa_rows_u16(&s->q, 0, w->i0, n, w->h0 + g, D, dst, ldq)
                             : (const void *)fa_rows_f32(&s->q, job->kern, 0, w->i0, n, w->h0 + g, D, dst, ldq);
        if (w->ng == 1) return q;
        stack_rows(dst, q, *ldq, n, D, es); /* an MLA or GQA group on one K */
    }
    *ldq = D;
    return buf;
}

/* Before step 1, on the bf16 path: the Q rows of every stacked head as bf16, as Q^T
 * pairs (qk_bf16 scales) or the fused kernel's rows. */
static void q_rows_bf16(const flash_job *job, const flash_scratch *sc, wide_task *w)
{
    const int64_t D = job->p->D;
    int64_t ldq;
    const uint16_t *q = stacked_q(job, w, sc->q16, 1, &ldq);
    if (job->fused) fused_q(sc, w, q, ldq, w->rows, D);
    else job->kern->pack_qt_bf16(w->rows, D, q, ldq, sc->qt2, 2 * job->plan.br_pad);
}

/* ... on the split path: each f32 row as mm_terms bf16 terms, unscaled (qk_bf16 scales),
 * as Q^T pairs or the fused kernel's rows. */
static void q_rows_split(const flash_job *job, const flash_scratch *sc, wide_task *w)
{
    const fa_view *s = w->s;
    const fa_problem *p = job->p;
    const fa_kernels *kern = job->kern;
    const int64_t D = p->D, bp = job->plan.br_pad, n = w->n, TD = job->mm_terms * D;
    int64_t ldq;
    for (int64_t g = 0; g < w->ng; g++) {
        const float *q = fa_rows_f32(&s->q, kern, 0, w->i0, n, w->h0 + g, D, sc->q, &ldq);
        /* q's rows are a head's stride apart, as the split pack's are (convert.h) */
        for (int64_t r = 0; r < n; r++) {
            if (r + FA_SPLIT_PREFETCH_ROWS < n) fa_prefetch_row(q + (r + FA_SPLIT_PREFETCH_ROWS) * ldq, D * 4);
            fa_split_row(kern, job->mm_terms, 0, q + r * ldq, D, sc->q16 + (g * n + r) * TD, sc->rowf);
        }
    }
    if (job->fused) fused_q(sc, w, sc->q16, TD, w->rows, TD);
    else kern->pack_qt_bf16(w->rows, TD, sc->q16, TD, sc->qt2, 2 * bp);
}

/* ... on the f32 path: transposed and scaled. */
static void q_rows_f32(const flash_job *job, const flash_scratch *sc, wide_task *w)
{
    int64_t ldq;
    const float *q = stacked_q(job, w, sc->q, 0, &ldq);
    job->kern->pack_qt(w->rows, job->p->D, q, ldq, job->p->scale, sc->qt, job->plan.br_pad);
}

/* The f32 K and V rows of keys j0 .. j0+cols-1: packed in the unit, in place, or
 * converted into sc->k, sc->v. Returns K (*ldk apart); V in *v (*ldv apart). */
static const float *wide_kv_f32(const flash_job *job, const flash_scratch *sc, const wide_task *w, int64_t j0,
                                int64_t cols, int64_t *ldk, const float **v, int64_t *ldv)
{
    const fa_view *s = w->s;
    const fa_problem *p = job->p;
    const fa_kv_packing *pk = &job->steps.pack;
    if (w->unit) {
        *ldk = pk->ldk;
        *ldv = pk->ldv;
        *v = (const float *)(w->unit + pk->v_offset) + (j0 - w->key0) * *ldv;
        return (const float *)w->unit + (j0 - w->key0) * *ldk;
    }
    const float *k = fa_kv_tile_f32(p, s, 0, job->kern, j0, cols, w->hk, p->D, sc->k, ldk);
    /* a latent V is the K tile's first Dv columns: read and converted once */
    *v = p->v_in_k ? (*ldv = *ldk, k) : fa_kv_tile_f32(p, s, 1, job->kern, j0, cols, w->hk, p->Dv, sc->v, ldv);
    return k;
}

/* Step 1 for keys j0 .. j0+cols-1, on each path: scaled scores S^T = K (scale Q)^T into
 * sc->st. Returns the tile's V rows as f32 (*ldv apart) where step 1 read them, else NULL
 * (the bf16 path; the split path's packed V waits for step 9). */
static const float *scores_bf16(const flash_job *job, const flash_scratch *sc, wide_task *w, int64_t j0,
                                int64_t cols, int64_t *ldv)
{
    const fa_view *s = w->s;
    const fa_problem *p = job->p;
    const fa_kv_packing *pk = &job->steps.pack;
    const int64_t D = p->D, bp = job->plan.br_pad;
    int64_t ldk;
    (void)ldv;
    const uint16_t *k = w->unit ? (const uint16_t *)w->unit + (j0 - w->key0) * (ldk = pk->ldk)
                                : fa_kv_tile_u16(p, s, 0, j0, cols, w->hk, D, sc->k16, &ldk);
    job->kern->qk_bf16(w->rows, cols, D, sc->qt2, 2 * bp, k, ldk, p->scale, sc->st, bp);
    w->k16 = k;
    w->ldk16 = ldk;
    return NULL;
}

static const float *scores_split(const flash_job *job, const flash_scratch *sc, wide_task *w, int64_t j0,
                                 int64_t cols, int64_t *ldv)
{
    const fa_kernels *kern = job->kern;
    const fa_kv_packing *pk = &job->steps.pack;
    const int64_t D = job->p->D, bp = job->plan.br_pad, TD = job->mm_terms * D;
    int64_t ldk;
    if (w->unit) { /* the split form: V waits for step 9 */
        kern->qk_bf16(w->rows, cols, TD, sc->qt2, 2 * bp, (const uint16_t *)w->unit + (j0 - w->key0) * pk->ldk, pk->ldk,
                      job->p->scale, sc->st, bp);
        return NULL;
    }
    const float *v;
    const float *k = wide_kv_f32(job, sc, w, j0, cols, &ldk, &v, ldv);
    for (int64_t c = 0; c < cols; c++) fa_split_row(kern, job->mm_terms, 1, k + c * ldk, D, sc->k16 + c * TD, sc->rowf);
    kern->qk_bf16(w->rows, cols, TD, sc->qt2, 2 * bp, sc->k16, TD, job->p->scale, sc->st, bp);
    return v;
}

static const float *scores_f32(const flash_job *job, const flash_scratch *sc, wide_task *w, int64_t j0,
                               int64_t cols, int64_t *ldv)
{
    const int64_t bp = job->plan.br_pad;
    int64_t ldk;
    const float *v;
    const float *k = wide_kv_f32(job, sc, w, j0, cols, &ldk, &v, ldv);
    job->kern->qk(w->rows, cols, job->p->D, sc->qt, bp, k, ldk, sc->st, bp);
    return v;
}

/* The V pairs of the tile at key j0: the unit's where they start there (an even key),
 * else the natural rows v16 (ldv apart) paired into scratch. */
static const uint32_t *tile_pairs(const flash_job *job, const flash_scratch *sc, const wide_task *w, int64_t j0,
                                  int64_t cols, const uint16_t *v16, int64_t ldv, int64_t *ldvp)
{
    const fa_kv_packing *pk = &job->steps.pack;
    if (w->unit && !(j0 & 1)) {
        *ldvp = pk->ldv;
        return (const uint32_t *)(w->unit + pk->v_offset) + (j0 - w->key0) / 2 * pk->ldv;
    }
    *ldvp = fa_packed_ld(job->p->Dv);
    job->kern->pack_pairs_bf16(cols, job->p->Dv, v16, ldv, sc->v_pairs, *ldvp);
    return sc->v_pairs;
}

/* Step 9 on the bf16 path: acc = alpha * acc + P V with V as bf16 row pairs. A vector
 * kernel multiplies a masked p = 0 by v too, so a NaN/inf in a masked V row would leak
 * into rows that never see it; a partial tile with one takes the reference kernel,
 * which skips p == 0. */
static void wide_pv_bf16(const flash_job *job, const flash_scratch *sc, const wide_task *w, int64_t j0, int64_t cols,
                         int partial, const float *v_f32, int64_t ldv_f32)
{
    const fa_kernels *kern = job->kern;
    (void)v_f32, (void)ldv_f32;
    const int64_t Dv = job->p->Dv, bp = job->plan.br_pad;
    /* the natural rows only where they are needed: a partial tile's check, or
     * pairs of a tile at an odd key (a window's or a chunk's first) */
    const uint16_t *v16 = NULL;
    int64_t ldv = 0;
    if (job->p->v_in_k) { /* a latent V: the K rows step 1 read (packed or not), not read again */
        v16 = w->k16;
        ldv = w->ldk16;
    } else if (!w->unit || partial || (j0 & 1)) {
        v16 = fa_kv_tile_u16(job->p, w->s, 1, j0, cols, w->hk, Dv, sc->v16, &ldv);
    }
    if (!partial || fa_rows_finite16(v16, ldv, cols, Dv, 0x7f80u)) {
        int64_t ldvp;
        const uint32_t *vp = tile_pairs(job, sc, w, j0, cols, v16, ldv, &ldvp);
        kern->pv_bf16(w->rows, cols, Dv, sc->st, bp, vp, ldvp, sc->alpha, sc->acc, job->ldacc, sc->pv_scratch);
        return;
    }
    /* rare: widen the tile and take the careful path */
    for (int64_t c = 0; c < cols; c++) kern->bf16_to_f32(v16 + c * ldv, sc->v + c * Dv, Dv);
    fa_kernels_ref.pv(w->rows, cols, Dv, sc->st, bp, sc->v, Dv, sc->alpha, sc->acc, job->ldacc);
}

/* The split V pairs of the tile at key j0 (hi returned, lo in *vlo for T = 3): the
 * unit's (v NULL: the tile starts at an even key of it), else the tile's f32 rows v
 * split and paired into scratch. */
static const uint32_t *split_v_pairs(const flash_job *job, const flash_scratch *sc, const wide_task *w, int64_t j0,
                                     int64_t cols, const float *v, int64_t ldv, const uint32_t **vlo, int64_t *ldvp)
{
    const fa_kernels *kern = job->kern;
    const fa_kv_packing *pk = &job->steps.pack;
    const int64_t Dv = job->p->Dv;
    if (!v) {
        *ldvp = pk->ldv;
        *vlo = (const uint32_t *)(w->unit + pk->vlo_offset) + (j0 - w->key0) / 2 * *ldvp;
        return (const uint32_t *)(w->unit + pk->v_offset) + (j0 - w->key0) / 2 * *ldvp;
    }
    *ldvp = fa_packed_ld(Dv);
    uint32_t *hi = sc->v_pairs, *lo = sc->v_pairs + (cols + 1) / 2 * *ldvp;
    fa_split_vrows(kern, job->mm_terms, v, ldv, cols, Dv, sc->v16, sc->v16 + cols * Dv, sc->rowf);
    kern->pack_pairs_bf16(cols, Dv, sc->v16, Dv, hi, *ldvp);
    if (job->mm_terms == 3) kern->pack_pairs_bf16(cols, Dv, sc->v16 + cols * Dv, Dv, lo, *ldvp);
    *vlo = lo;
    return hi;
}

/* Step 9 of f32 as bf16 products (kv.h, fa_split_f32): acc = alpha * acc + P Vhi,
 * then (T = 3) + (P - bf16(P)) Vhi + P Vlo, pv_bf16 rounding P to bf16; V's hi and lo
 * rows as pairs, packed or split here. v: the tile's f32 V rows, or NULL (packed). A
 * partial tile with a NaN/inf V row takes the reference kernel (see wide_pv_bf16). */
static void wide_pv_split(const flash_job *job, const flash_scratch *sc, const wide_task *w, int64_t j0, int64_t cols,
                          int partial, const float *v, int64_t ldv)
{
    const fa_kernels *kern = job->kern;
    const int64_t Dv = job->p->Dv, bp = job->plan.br_pad, ldacc = job->ldacc;
    const int T = job->mm_terms;
    const int packed = w->unit && !(j0 & 1);
    if (!v && (!packed || partial)) v = fa_kv_tile_f32(job->p, w->s, 1, kern, j0, cols, w->hk, Dv, sc->v, &ldv);
    if (partial && !fa_rows_finite(v, ldv, cols, Dv)) {
        fa_kernels_ref.pv(w->rows, cols, Dv, sc->st, bp, v, ldv, sc->alpha, sc->acc, ldacc);
        return;
    }
    const uint32_t *vlo;
    int64_t ldvp;
    const uint32_t *vhi = split_v_pairs(job, sc, w, j0, cols, packed ? NULL : v, ldv, &vlo, &ldvp);
    kern->pv_bf16(w->rows, cols, Dv, sc->st, bp, vhi, ldvp, sc->alpha, sc->acc, ldacc, sc->pv_scratch);
    if (T == 1) return;
    float *res = sc->st + cols * bp; /* P - bf16(P), bf16(P) rounded as pv_bf16 rounds it: nearest even */
    for (int64_t i = 0; i < cols * bp; i++) {
        const float p = sc->st[i];
        uint32_t x;
        memcpy(&x, &p, sizeof x);
        x = (x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u;
        float h;
        memcpy(&h, &x, sizeof h);
        res[i] = p - h;
    }
    kern->pv_bf16(w->rows, cols, Dv, res, bp, vhi, ldvp, NULL, sc->acc, ldacc, sc->pv_scratch);
    kern->pv_bf16(w->rows, cols, Dv, sc->st, bp, vlo, ldvp, NULL, sc->acc, ldacc, sc->pv_scratch);
}

/* Step 9 on the f32 path: acc = alpha * acc + P V; a partial tile with a NaN/inf V row
 * takes the reference kernel (see wide_pv_bf16). */
static void wide_pv_f32(const flash_job *job, const flash_scratch *sc, const wide_task *w, int64_t j0, int64_t cols,
                        int partial, const float *v, int64_t ldv)
{
    const fa_kernels *kern = job->kern;
    const int64_t Dv = job->p->Dv, bp = job->plan.br_pad, ldacc = job->ldacc;
    (void)j0;
    if (partial && kern != &fa_kernels_ref && !fa_rows_finite(v, ldv, cols, Dv))
        fa_kernels_ref.pv(w->rows, cols, Dv, sc->st, bp, v, ldv, sc->alpha, sc->acc, ldacc);
    else
        kern->pv(w->rows, cols, Dv, sc->st, bp, v, ldv, sc->alpha, sc->acc, ldacc);
}

/* Rows per block of a trimmed tile (wide_trimmed): a multiple of every table's row
 * block, and tall enough that a block still reuses each K and V row many times. */
enum { TRIM_ROWS = 64 };

/* Steps 1, 6-7 and 9 of a tile the band cuts (causal: the diagonal tile), in blocks of
 * TRIM_ROWS rows, each block's kernels stopping at the last column one of its rows
 * keeps: the masked triangle beyond it is neither computed nor read. Every kernel
 * works row by row, and the columns a block skips hold p = 0 for all its rows (which
 * add exactly nothing to l and acc), so the results are bitwise those of the whole
 * tile. A block gets at least 16 rows (the small-row forms of some qk sum in
 * another order), and at least one column. t0: the phase clock (algos.h), returned
 * advanced past the tile. */
static double wide_trimmed(const flash_job *job, const flash_scratch *sc, const wide_task *w, int64_t j0,
                           int64_t cols, const int32_t *lo, const int32_t *hi, double t0)
{
    const fa_kernels *kern = job->kern;
    const int64_t D = job->p->D, Dv = job->p->Dv, bp = job->plan.br_pad, ldacc = job->ldacc, rows = w->rows;
    int64_t ldk, ldv;
    const float *v;
    const float *k = wide_kv_f32(job, sc, w, j0, cols, &ldk, &v, &ldv);
    t0 = fa_phase_mark(job->phases, FA_PH_S, t0); /* the tile's K and V rows: step 1's reads */
    int64_t used = 1; /* the columns any block reads: V rows beyond them are never touched */
    for (int64_t r = 0; r < rows; r++) used = hi[r] + 1 > used ? hi[r] + 1 : used;
    const int careful = kern != &fa_kernels_ref && !fa_rows_finite(v, ldv, used, Dv);
    for (int64_t r0 = 0; r0 < rows;) {
        const int64_t nr = rows - r0 - TRIM_ROWS < 16 ? rows - r0 : TRIM_ROWS;
        int64_t nc = 1;
        for (int64_t r = r0; r < r0 + nr; r++) nc = hi[r] + 1 > nc ? hi[r] + 1 : nc;
        /* 1. scaled scores */
        kern->qk(nr, nc, D, sc->qt + r0, bp, k, ldk, sc->st + r0, bp);
        t0 = fa_phase_mark(job->phases, FA_PH_S, t0);
        /* 6-7. online softmax */
        kern->softmax(nr, nc, sc->st + r0, bp, lo + r0, hi + r0, sc->m + r0, sc->l + r0, sc->alpha + r0);
        t0 = fa_phase_mark(job->phases, FA_PH_X, t0);
        /* 9. acc = alpha * acc + P V (the reference kernel where a V row is not finite) */
        const fa_kernels *pvk = careful ? &fa_kernels_ref : kern;
        pvk->pv(nr, nc, Dv, sc->st + r0, bp, v, ldv, sc->alpha + r0, sc->acc + r0 * ldacc, ldacc);
        t0 = fa_phase_mark(job->phases, FA_PH_P, t0);
        r0 += nr;
    }
    return t0;
}

/* 1 when the values of keys 0 .. cols-1 in V pairs (pack_pairs_bf16's layout) are all
 * finite: exactly those keys, so the answer is the same packed or not. */
static int pairs_finite(const uint32_t *vp, int64_t ldvp, int64_t cols, int64_t dv)
{
    if (!fa_rows_finite16((const uint16_t *)vp, 2 * ldvp, cols / 2, 2 * dv, 0x7f80u)) return 0;
    if (!(cols & 1)) return 1;
    const uint32_t *last = vp + cols / 2 * ldvp;
    uint32_t bad = 0;
    for (int64_t e = 0; e < dv; e++) bad |= (last[e] & 0x7f80u) == 0x7f80u;
    return !bad;
}

/* The fused forward's operands on the split path (f32 as bf16 products): K^T of the
 * split K rows and V's split pairs (lo: T = 3), each from the unit where the tile starts
 * on one of its blocks (K) or an even key (V), else split and packed here. Returns 0
 * for a partly masked tile with a NaN/inf V row (see wide_fused). */
static int fused_split_kv(const flash_job *job, const flash_scratch *sc, const wide_task *w, int64_t j0,
                          int64_t cols, int partial, const uint32_t **kt, const uint32_t **vp, const uint32_t **vlo,
                          int64_t *ldvp)
{
    const fa_problem *p = job->p;
    const fa_kernels *kern = job->kern;
    const int64_t TD = job->mm_terms * p->D;
    const int unit_k = w->unit && (j0 - w->key0) % 16 == 0, unit_v = w->unit && !(j0 & 1);
    const float *k = NULL, *v = NULL;
    int64_t ldk = 0, ldv = 0;
    if (!unit_k || !unit_v) {
        wide_task wn = *w;
        wn.unit = NULL; /* the caller's rows as f32: the unit holds the split form */
        k = wide_kv_f32(job, sc, &wn, j0, cols, &ldk, &v, &ldv);
    }
    *vp = split_v_pairs(job, sc, w, j0, cols, unit_v ? NULL : v, ldv, vlo, ldvp);
    if (job->mm_terms == 1) *vlo = NULL;
    /* V's hi parts are finite where V is (or where V is near FLT_MAX, which rounds to
     * inf: the careful path then, correct as well) */
    if (partial && !pairs_finite(*vp, *ldvp, cols, p->Dv)) return 0;
    if (unit_k) {
        *kt = (const uint32_t *)w->unit + (j0 - w->key0) / 16 * job->steps.pack.ldk;
        return 1;
    }
    for (int64_t c = 0; c < cols; c++)
        fa_split_row(kern, job->mm_terms, 1, k + c * ldk, p->D, sc->k16 + c * TD, sc->rowf);
    kern->pack_kt_bf16(cols, TD, sc->k16, TD, sc->kt, 0);
    *kt = sc->kt;
    return 1;
}

/* Steps 1, 6-7 and 9 of a tile in the fused forward (kernels.h, fwd_bf16): K^T and V
 * pairs from the unit (kv.h's K^T form) or packed here. Returns 0, having done nothing,
 * for a partly masked tile with a NaN/inf V row (a masked p = 0 would meet it; the
 * caller takes the careful path). t0: the phase clock, returned advanced. */
static int wide_fused(const flash_job *job, const flash_scratch *sc, const wide_task *w, int64_t j0, int64_t cols,
                      int partial, const int32_t *tlo, const int32_t *thi, double *t0)
{
    const fa_view *s = w->s;
    const fa_problem *p = job->p;
    const fa_kernels *kern = job->kern;
    const fa_kv_packing *pk = &job->steps.pack;
    const int64_t D = p->D, Dv = p->Dv;
    const uint16_t *k16 = NULL, *v = NULL;
    int64_t ldk = 0, ldv = 0, ldvp;
    const uint32_t *vp, *vlo = NULL, *kt = sc->kt;
    if (job->mm_terms) {
        if (!fused_split_kv(job, sc, w, j0, cols, partial, &kt, &vp, &vlo, &ldvp)) return 0;
        goto run;
    }
    if (!w->unit || (j0 & 1)) { /* V rows to pair (a latent V: the K rows, read once for both) */
        if (p->v_in_k) v = k16 = fa_kv_tile_u16(p, s, 0, j0, cols, w->hk, D, sc->k16, &ldk), ldv = ldk;
        else v = fa_kv_tile_u16(p, s, 1, j0, cols, w->hk, Dv, sc->v16, &ldv);
    }
    vp = tile_pairs(job, sc, w, j0, cols, v, ldv, &ldvp);
    if (partial && !pairs_finite(vp, ldvp, cols, Dv)) return 0;
    if (w->unit && (j0 - w->key0) % 16 == 0) { /* a tile from a block's start (a window's may not be) */
        kt = (const uint32_t *)w->unit + (j0 - w->key0) / 16 * pk->ldk;
    } else {
        if (!k16) k16 = fa_kv_tile_u16(p, s, 0, j0, cols, w->hk, D, sc->k16, &ldk);
        kern->pack_kt_bf16(cols, D, k16, ldk, sc->kt, 0);
    }
run:
    *t0 = fa_phase_mark(job->phases, FA_PH_S, *t0);
    const fa_fwd_tile t = {.rows = w->rows, .cols = cols, .d = (job->mm_terms ? job->mm_terms : 1) * D, .dv = Dv,
                           .bf16 = {.q = w->qa, .ldq = w->ldqa, .scale = p->scale, .vlo = vlo}, .kt = kt, .vp = vp,
                           .ldvp = ldvp, .lo = tlo, .hi = thi,
                           .m = sc->m, .l = sc->l, .acc = sc->acc, .ldacc = job->ldacc, .scratch = sc->fwd_scratch};
    kern->fwd_bf16(&t);
    *t0 = fa_phase_mark(job->phases, FA_PH_P, *t0);
    /* both products, interleaved with the softmax in the one call: all in P */
    fa_phase_flops(job->phases, FA_PH_P, fa_tile_flops(job->phases, 2 * (D + Dv), w->rows, cols, tlo, thi));
    return 1;
}

/* ---------------------------------------------- int8 products on the fused forward */

/* The key slots of q8_keys: their count (base NULL) or the parts laid out from base;
 * -1 when a size overflows. */
static int64_t q8_keys_layout(const fa_problem *p, int form, q8_keys *k, char *base)
{
    int64_t slots = 0;
    for (int64_t b = 0; b < p->B; b++) {
        fa_view s;
        fa_seq_view(p, b, &s);
        int64_t n;
        if (!fa_mul_ok(FA_RUP16(s.Sk) + 16, p->Hk, &n) || slots > INT64_MAX / 2 - n) return -1;
        slots += n;
    }
    const fa_ws_part parts[] = {
        {(void **)&k->kt, form == Q8_KEYS_KT ? fa_bytes3(slots, 4 * FA_KT_QUADS(p->D), 1) : 0},
        {(void **)&k->k8, form == Q8_KEYS_ROWS ? fa_bytes3(slots, fa_q8_ld(p->D), 1) : 0},
        {(void **)&k->ksum, form == Q8_KEYS_ROWS ? fa_bytes3(slots, 4, 1) : 0},
        {(void **)&k->vp, fa_bytes3(slots / 2, fa_packed_ld(p->Dv), 4)},
        {(void **)&k->ks, fa_bytes3(slots, 4, 1)},
        {(void **)&k->kbar, fa_bytes3(p->B * p->Hk, p->D, 4)},
        {(void **)&k->smooth, fa_bytes3(p->B, p->Hk, 4)},
        {(void **)&k->off, fa_bytes3(p->B, 8, 1)},
    };
    const int64_t bytes = fa_ws_layout(parts, sizeof parts / sizeof parts[0], base);
    for (int64_t b = 0, at = 0; base && b < p->B; b++) {
        fa_view s;
        fa_seq_view(p, b, &s);
        k->off[b] = at;
        at += (FA_RUP16(s.Sk) + 16) * p->Hk;
    }
    return bytes;
}

/* The sum of a key's n codes (qk_i8's ksum): exact in int32 (127 n < 2^31). */
static int32_t q8_code_sum(const int8_t *k8, int64_t n)
{
    int32_t sum = 0;
    for (int64_t x = 0; x < n; x++) sum += k8[x];
    return sum;
}

/* q8_keys for each (sequence, kv head) a thread takes: kbar (flash_task_q8's), then each
 * key smoothed and quantised as flash_task_q8 quantises it, and packed (or, as rows, kept
 * where quantise_row writes it, with its code sum); V's pairs. */
static void q8_keys_worker(void *arg, int ith, int nth)
{
    (void)nth;
    flash_job *job = arg;
    const fa_problem *p = job->p;
    const int64_t D = p->D, ld8 = fa_q8_ld(D), nq = FA_KT_QUADS(D), ldvp = fa_packed_ld(p->Dv);
    const int rows = job->path->keys == Q8_KEYS_ROWS;
    flash_scratch sc;
    scratch_layout(job, &sc, job->workspace + (int64_t)ith * job->per_thread);
    const double t0 = fa_phase_start(job->phases);
    for (int64_t u; (u = atomic_fetch_add(&job->next, 1)) < p->B * p->Hk;) {
        const int64_t b = u / p->Hk, hk = u % p->Hk;
        fa_view s;
        fa_seq_view(p, b, &s);
        const int64_t slot0 = job->keys.off[b] + hk * (FA_RUP16(s.Sk) + 16);
        const int smooth = s.Sk > 0 && q8_key_mean(job, &sc, &s, hk);
        job->keys.smooth[u] = smooth;
        memcpy(job->keys.kbar + u * D, sc.wkbar, (size_t)D * sizeof(float));
        for (int64_t j0 = 0; j0 < s.Sk; j0 += job->plan.bc) {
            const int64_t cols = s.Sk - j0 < job->plan.bc ? s.Sk - j0 : job->plan.bc;
            int64_t ldk;
            const float *k = fa_kv_tile_f32(p, &s, 0, job->kern, j0, cols, hk, D, sc.k, &ldk);
            for (int64_t c = 0; c < cols; c++) {
                const int64_t j = slot0 + j0 + c;
                int8_t *k8 = rows ? job->keys.k8 + j * ld8 : sc.wk8;
                for (int64_t e = 0; e < D; e++) sc.wy[e] = smooth ? k[c * ldk + e] - sc.wkbar[e] : k[c * ldk + e];
                job->keys.ks[j] = job->kern->quant_row_i8(sc.wy, D, 1, k8);
                if (rows) job->keys.ksum[j] = q8_code_sum(k8, D);
                else fa_pack_kt_i8(1, D, k8, ld8, job->keys.kt + slot0 * nq, j0 + c);
            }
            int64_t ldv;
            const uint16_t *v = fa_kv_tile_u16(p, &s, 1, j0, cols, hk, p->Dv, sc.v16, &ldv);
            job->kern->pack_pairs_bf16(cols, p->Dv, v, ldv, job->keys.vp + (slot0 + j0) / 2 * ldvp, ldvp);
        }
        /* the spare slots: zero codes and scales (read, never kept) */
        memset(sc.wk8, 0, (size_t)ld8);
        for (int64_t j = s.Sk; j < FA_RUP16(s.Sk) + 16; j++) {
            job->keys.ks[slot0 + j] = 0.0f;
            if (rows) {
                memset(job->keys.k8 + (slot0 + j) * ld8, 0, (size_t)ld8);
                job->keys.ksum[slot0 + j] = 0;
            } else {
                fa_pack_kt_i8(1, D, sc.wk8, ld8, job->keys.kt + slot0 * nq, j);
            }
        }
    }
    fa_phase_mark(job->phases, FA_PH_X, t0);
}

/* A tile's K codes from key j of the packed blocks kt0 when j starts no block (a window's
 * or a chunk's first tile), into sc->kt from its block start. */
static const uint32_t *q8_tile_kt(const flash_scratch *sc, const uint32_t *kt0, int64_t nq, int64_t j, int64_t cols)
{
    if (j % 16 == 0) return kt0 + j * nq;
    for (int64_t c = 0; c < cols; c++)
        for (int64_t x = 0; x < nq; x++)
            sc->kt[c / 16 * 16 * nq + 16 * x + c % 16] = kt0[(j + c) / 16 * 16 * nq + 16 * x + (j + c) % 16];
    return sc->kt;
}

/* The prologue of a task on q8_keys (flash_task_i8, flash_task_i8p), n rows per head: its
 * unit's kbar, q's codes (q8_quantise_q, one digit), the softmax state and accumulator
 * cleared. Returns whether the unit's K is smoothed; *slot0: the unit's first key slot. */
static int q8_keys_task_begin(const flash_job *job, const flash_scratch *sc, const fa_view *s, const fa_task *it,
                              int64_t n, int64_t *slot0)
{
    const fa_problem *p = job->p;
    const int64_t D = p->D, i0 = (int64_t)it->qb * job->plan.br, hk = it->h0 / p->group, rows = n * it->ng;
    const int64_t u = (int64_t)it->b * p->Hk + hk;
    *slot0 = job->keys.off[it->b] + hk * (FA_RUP16(s->Sk) + 16);
    const int smooth = job->keys.smooth[u];
    memcpy(sc->wkbar, job->keys.kbar + u * D, (size_t)D * sizeof(float));
    q8_quantise_q(job, sc, s, i0, n, it->ng, it->h0, smooth, 1, fa_q8_ld(D));
    for (int64_t r = 0; r < rows; r++) {
        sc->m[r] = -INFINITY;
        sc->l[r] = 0.0f;
    }
    memset(sc->acc, 0, (size_t)(rows * job->ldacc) * sizeof(float));
    return smooth;
}

/*
 * The wide path on int8 products with the table's fused forward (fwd_i8): flash_task_q8's
 * q codes and kbar, K's codes and V's pairs from q8_keys, and each tile's scores, softmax and P V in
 * one kernel call, P V on bf16 V as the fused bf16 forward does (docs/semantics.md, 5
 * and 11). A partly masked tile with a non-finite V row takes the reference's fwd_i8,
 * which never reads a masked key's V. A task's only step.
 */
static void flash_task_i8(const flash_job *job, const flash_scratch *sc, const fa_view *s, const fa_task *it)
{
    const fa_problem *p = job->p;
    const fa_kernels *kern = job->kern;
    const int64_t D = p->D, Dv = p->Dv, ld8 = fa_q8_ld(D), nq = FA_KT_QUADS(D);
    const int64_t i0 = (int64_t)it->qb * job->plan.br, ng = it->ng, h0 = it->h0, hk = h0 / p->group;
    const int64_t n = s->Sq - i0 < job->plan.br ? s->Sq - i0 : job->plan.br, rows = n * ng;
    const double tq = fa_phase_start(job->phases);
    int64_t slot0;
    const int smooth = q8_keys_task_begin(job, sc, s, it, n, &slot0);
    memset(sc->wq8 + rows * ld8, 0, (size_t)((FA_RUP16(rows) - rows) * ld8)); /* whole A tiles */
    double t0 = fa_phase_mark(job->phases, FA_PH_X, tq);

    int64_t lo, hi;
    fa_task_columns(p, s, it, i0, n, &lo, &hi);
    for (int64_t j0 = lo; j0 <= hi; j0 += job->plan.bc) {
        const int64_t cols = hi - j0 + 1 < job->plan.bc ? hi - j0 + 1 : job->plan.bc;
        const int32_t *tlo, *thi;
        const int partial = stacked_band(p, s, 0, i0, n, ng, j0, cols, sc->lo, sc->hi, &tlo, &thi);
        const int64_t ldvp = fa_packed_ld(Dv);
        const uint32_t *vp = job->keys.vp + (slot0 + j0) / 2 * ldvp;
        if (j0 & 1) { /* pairs from an odd key (a window's or a chunk's first tile) */
            int64_t ldv;
            const uint16_t *v = fa_kv_tile_u16(p, s, 1, j0, cols, hk, Dv, sc->v16, &ldv);
            kern->pack_pairs_bf16(cols, Dv, v, ldv, sc->v_pairs, ldvp);
            vp = sc->v_pairs;
        }
        const fa_kernels *fk = partial && !pairs_finite(vp, ldvp, cols, Dv) ? &fa_kernels_ref : kern;
        const fa_fwd_tile t = {.rows = rows, .cols = cols, .d = D, .dv = Dv,
                               .i8 = {.q8 = sc->wq8, .ldq8 = ld8, .qs = sc->wq8s, .qc = smooth ? sc->wqc : NULL,
                                      .ks = job->keys.ks + slot0 + j0},
                               .kt = q8_tile_kt(sc, job->keys.kt + slot0 * nq, nq, j0, cols), .vp = vp,
                               .ldvp = ldvp, .lo = tlo, .hi = thi, .m = sc->m, .l = sc->l, .acc = sc->acc,
                               .ldacc = job->ldacc, .scratch = sc->fwd_scratch};
        t0 = fa_phase_mark(job->phases, FA_PH_S, t0);
        fk->fwd_i8(&t);
        t0 = fa_phase_mark(job->phases, FA_PH_P, t0);
    }
    finish_rows(job, s, it, h0, i0, n, ng, sc->m, sc->l, sc->acc, 0);
}

/*
 * The wide path on int8 products on the vector units (qk_i8; docs/semantics.md, 11): q's
 * codes as flash_task_q8's, once per task, as Q^T quads; K's codes, sums and V's pairs from
 * q8_keys; step 1 by qk_i8 into the transposed score tile, then steps 2 to 9 as the bf16
 * path takes them (fa_scores_finish, softmax, pv_bf16 on V's pairs: P rounded to bf16). A
 * partly masked tile with a non-finite V row takes the reference's pv on V widened (see
 * wide_pv_bf16). A task's only step.
 */
static void flash_task_i8p(const flash_job *job, const flash_scratch *sc, const fa_view *s, const fa_task *it)
{
    const fa_problem *p = job->p;
    const fa_kernels *kern = job->kern;
    const int64_t D = p->D, Dv = p->Dv, ld8 = fa_q8_ld(D), bp = job->plan.br_pad, ldvp = fa_packed_ld(Dv);
    const int64_t i0 = (int64_t)it->qb * job->plan.br, ng = it->ng, h0 = it->h0, hk = h0 / p->group;
    const int64_t n = s->Sq - i0 < job->plan.br ? s->Sq - i0 : job->plan.br, rows = n * ng;
    const int elementwise = fa_problem_has_elementwise(p);
    const double tq = fa_phase_start(job->phases);
    int64_t slot0;
    const int smooth = q8_keys_task_begin(job, sc, s, it, n, &slot0);
    for (int64_t r = rows; r < round16(rows); r++) sc->wq8s[r] = sc->wqc[r] = 0.0f; /* qk_i8 reads whole row blocks */
    fa_pack_qt_u8(rows, D, sc->wq8, ld8, sc->qt4, bp);
    double t0 = fa_phase_mark(job->phases, FA_PH_X, tq);

    int64_t lo, hi;
    fa_task_columns(p, s, it, i0, n, &lo, &hi);
    for (int64_t j0 = lo; j0 <= hi; j0 += job->plan.bc) {
        const int64_t cols = hi - j0 + 1 < job->plan.bc ? hi - j0 + 1 : job->plan.bc, j = slot0 + j0;
        const int32_t *tlo, *thi;
        const int partial = stacked_band(p, s, elementwise, i0, n, ng, j0, cols, sc->lo, sc->hi, &tlo, &thi);
        /* 1. scores (the softmax scale is in q's codes) */
        kern->qk_i8(rows, cols, D, sc->qt4, bp, sc->wq8s, smooth ? sc->wqc : NULL, job->keys.k8 + j * ld8, ld8,
                    job->keys.ks + j, job->keys.ksum + j, sc->st, bp);
        t0 = fa_phase_mark(job->phases, FA_PH_S, t0);
        fa_phase_flops(job->phases, FA_PH_S, fa_tile_flops(job->phases, 2 * D, rows, cols, tlo, thi));
        /* 2-5. softcap, bias, ALiBi and masks, head by head */
        if (elementwise)
            for (int64_t g = 0; g < ng; g++) fa_scores_finish(p, s, 0, h0 + g, i0, n, j0, cols, sc->st + g * n, bp, 1);
        /* 6-7. online softmax */
        kern->softmax(rows, cols, sc->st, bp, tlo, thi, sc->m, sc->l, sc->alpha);
        t0 = fa_phase_mark(job->phases, FA_PH_X, t0);
        if (Dv == 0) continue; /* the lse is all there is to compute */
        /* 9. acc = alpha * acc + P V, V's pairs from q8_keys (from an odd key: paired here) */
        const uint32_t *vp = job->keys.vp + j / 2 * ldvp;
        const uint16_t *v16 = NULL;
        int64_t ldv = 0;
        if (j0 & 1) {
            v16 = fa_kv_tile_u16(p, s, 1, j0, cols, hk, Dv, sc->v16, &ldv);
            kern->pack_pairs_bf16(cols, Dv, v16, ldv, sc->v_pairs, ldvp);
            vp = sc->v_pairs;
        }
        if (!partial || pairs_finite(vp, ldvp, cols, Dv)) {
            kern->pv_bf16(rows, cols, Dv, sc->st, bp, vp, ldvp, sc->alpha, sc->acc, job->ldacc, sc->pv_scratch);
        } else { /* rare: widen the tile and take the careful path */
            if (!v16) v16 = fa_kv_tile_u16(p, s, 1, j0, cols, hk, Dv, sc->v16, &ldv);
            for (int64_t c = 0; c < cols; c++) kern->bf16_to_f32(v16 + c * ldv, sc->v + c * Dv, Dv);
            fa_kernels_ref.pv(rows, cols, Dv, sc->st, bp, sc->v, Dv, sc->alpha, sc->acc, job->ldacc);
        }
        t0 = fa_phase_mark(job->phases, FA_PH_P, t0);
        fa_phase_flops(job->phases, FA_PH_P, fa_tile_flops(job->phases, 2 * Dv, rows, cols, tlo, thi));
    }
    finish_rows(job, s, it, h0, i0, n, ng, sc->m, sc->l, sc->acc, 0);
}

/* Whether the wide tasks' rows are bf16 pairs (the bf16 path): bf16 q and K/V rows the
 * pair kernels read (no codes; pages only where pages_ok: the decode-tile route, the
 * int8 route's V). */
static int bf16_rows(const fa_problem *p, const flash_job *job, int pages_ok)
{
    const fa_dtype kv = p->cache ? p->kc.dtype : p->k.dtype;
    return job->bf16_dot && (!p->block_table || pages_ok) && !p->quant && kv == FA_DTYPE_BF16 &&
           p->dtype == FA_DTYPE_BF16;
}

/* Whether the wide int8 tasks take the fused forward: one digit over float bf16 K/V (the
 * library quantises K; V stays bf16), on a table with fwd_i8, where the bf16 forward
 * would be fused (no element-wise rule, no dropout; wide_q8 excludes block masks). */
static int wide_fused_i8(const fa_context *ctx, const fa_problem *p, const flash_job *job)
{
    return job->wide_digits == 1 && job->fused && (ctx->kernels->flags & FA_KERNELS_FWD_I8) && bf16_rows(p, job, 1);
}

/* Whether the wide int8 tasks take qk_i8 and the bf16 path's steps 6 to 9: one digit over
 * float bf16 K/V, on a table with qk_i8 of its own, where the fused forward is not taken. */
static int wide_i8_pairs(const fa_context *ctx, const fa_problem *p, const flash_job *job)
{
    return job->wide_digits == 1 && (ctx->kernels->flags & FA_KERNELS_QK_I8) && bf16_rows(p, job, 1);
}

enum { WIDE_F32, WIDE_BF16, WIDE_SPLIT, WIDE_Q8, WIDE_I8, WIDE_I8P };
static const wide_path wide_paths[] = {
    [WIDE_F32] = {NULL, q_rows_f32, scores_f32, wide_pv_f32, 0, 1, 0, 0},
    [WIDE_BF16] = {NULL, q_rows_bf16, scores_bf16, wide_pv_bf16, 1, 0, 1, 0},
    [WIDE_SPLIT] = {NULL, q_rows_split, scores_split, wide_pv_split, 1, 0, 1, 0},
    [WIDE_Q8] = {flash_task_q8, NULL, NULL, NULL, 0, 0, 0, 0},
    [WIDE_I8] = {flash_task_i8, NULL, NULL, NULL, 0, 0, 0, Q8_KEYS_KT},
    [WIDE_I8P] = {flash_task_i8p, NULL, NULL, NULL, 0, 0, 0, Q8_KEYS_ROWS},
};

/* Before step 1: the Q rows of every stacked head in the path's form; with `clear`,
 * the softmax state and the accumulator cleared (a task's first step). */
static void wide_begin(const flash_job *job, const flash_scratch *sc, wide_task *w, int clear)
{
    job->path->q_rows(job, sc, w);
    if (!clear) return;
    for (int64_t r = 0; r < w->rows; r++) {
        sc->m[r] = -INFINITY;
        sc->l[r] = 0.0f;
    }
    memset(sc->acc, 0, (size_t)(w->rows * job->ldacc) * sizeof(float));
}

/* The block mask over a tile's stacked heads h0..h0+ng: whether any head keeps some of it,
 * and in *bits whether some head's blocks are not all full (element work); 1, 0 without a mask */
static int stacked_bmask(const fa_problem *p, const fa_view *s, const flash_scratch *sc, int64_t i0, int64_t n,
                         int64_t ng, int64_t h0, int64_t j0, int64_t cols, int *bits)
{
    int any = !p->bm.on;
    *bits = 0;
    for (int64_t g = 0; p->bm.on && g < ng; g++) {
        const int kind = fa_bmask_tile(p, s, 0, h0 + g, i0, n, j0, cols, sc->bms);
        any |= kind != 0;
        *bits |= kind != 1;
    }
    return any;
}

/* The wide path: one stack of rows, vectors along rows (kernels.h), for the task
 * step `step` (tasks.h): its K/V packed in `unit` (kv.h), or NULL to read them from the
 * caller's tensors; its tiles those starting in [step->j0, step->j0 + step->cols);
 * its online softmax state in `state` between the steps of a chunked unit's task
 * (NULL: the task's only step, state in the thread's scratch). */
/* The fused kernel's try at one tile of flash_task: 1 when it ran the tile (or a boolean
 * mask's runs keep nothing of it), else 0, with w reading K and V in place and Q^T packed
 * for the careful path (element bits left, a row that is no run, a partly masked tile
 * with a NaN/inf V row). */
static int fused_tile(const flash_job *job, const flash_scratch *sc, wide_task *w, const char *unit0, int64_t j0,
                      int64_t cols, int partial, const int32_t *tlo, const int32_t *thi, int bm_bits, double *t0,
                      int *qt2_ready)
{
    const fa_view *s = w->s;
    const fa_problem *p = job->p;
    w->unit = unit0;
    if (!bm_bits && !p->has_mask && wide_fused(job, sc, w, j0, cols, partial, tlo, thi, t0)) return 1;
    int keeps = 1;
    if (!bm_bits && p->has_mask && mask_bounds(p, s, sc, w->i0, w->n, w->ng, w->h0, j0, cols, &keeps)) {
        if (!keeps) return 1; /* the kernel would leave the state as it is */
        const int some = keeps == 1;
        if (wide_fused(job, sc, w, j0, cols, some, some ? sc->lo : NULL, some ? sc->hi : NULL, t0)) return 1;
    }
    w->unit = NULL; /* the careful path reads K and V where they are (a K^T unit has no K rows) */
    if (!*qt2_ready) { /* its Q^T pairs, from the fused kernel's Q rows */
        const int64_t TD = (job->mm_terms ? job->mm_terms : 1) * job->p->D;
        job->kern->pack_qt_bf16(w->rows, TD, w->qa, w->ldqa, sc->qt2, 2 * job->plan.br_pad);
        *qt2_ready = 1;
    }
    return 0;
}

static void flash_task(const flash_job *job, const flash_scratch *sc0, const fa_task *it, const fa_step *step,
                       const char *unit, char *state)
{
    const fa_problem *p = job->p;
    const fa_kernels *kern = job->kern;
    fa_view s; /* this sequence's view (B = 1) */
    fa_seq_view(p, it->b, &s);
    if (it->nkv > 0) { /* never packed: one step */
        flash_task_small(job, sc0, &s, it);
        return;
    }
    if (job->path->task) { /* a path with a task loop of its own: never packed, one step */
        job->path->task(job, sc0, &s, it);
        return;
    }
    const int64_t Dv = p->Dv, bp = job->plan.br_pad, ldacc = job->ldacc;
    wide_task w = {.s = &s, .i0 = (int64_t)it->qb * job->plan.br, .ng = it->ng, .h0 = it->h0,
                   .hk = it->h0 / p->group, .unit = unit, .key0 = step->key0};
    flash_scratch scs = *sc0, *sc = &scs;
    if (state) { /* acc (br, ldacc), m (br_pad), l (br_pad): state_bytes in fa_run_flash */
        sc->acc = (float *)state;
        sc->m = sc->acc + job->plan.br * ldacc;
        sc->l = sc->m + bp;
    }
    w.n = s.Sq - w.i0 < job->plan.br ? s.Sq - w.i0 : job->plan.br;
    w.rows = w.n * w.ng;
    if (unit && job->steps.pack.bf16 != job->path->pairs) w.unit = NULL; /* a task off the pack's path (another dtype) reads in place */
    const int elementwise = fa_problem_has_elementwise(p);
    const int fused = job->fused; /* flash_plan cleared it off the bf16 and split paths */
    const int64_t i0 = w.i0, n = w.n, ng = w.ng, rows = w.rows, h0 = w.h0;
    wide_begin(job, sc, &w, step->begin);
    const char *const unit0 = w.unit;
    int qt2_ready = !fused; /* the fused path packs Q^T only for a tile that needs the careful path */

    /* the tiles of the whole task start at lo, lo + bc, ..; this step runs those that
     * start in its range, so its steps together run them all in the same order */
    int64_t lo, hi;
    fa_task_columns(p, &s, it, i0, n, &lo, &hi);
    const int64_t bc = job->plan.bc, ta = step->j0, tb = step->j0 + step->cols;
    const int64_t first = ta > lo ? lo + (ta - lo + bc - 1) / bc * bc : lo;
    double t0 = fa_phase_start(job->phases);
    for (int64_t j0 = first; j0 <= hi && j0 < tb; j0 += bc) {
        const int64_t cols = hi - j0 + 1 < bc ? hi - j0 + 1 : bc;
        int64_t ldv = 0;
        /* the block mask: a tile it removes for every stacked head is skipped, a tile
         * inside full blocks takes no element work (bm_bits: some head's does) */
        int bm_bits;
        if (!stacked_bmask(p, &s, sc, i0, n, ng, h0, j0, cols, &bm_bits)) continue;
        /* the band of the tile (from positions only): a band-only tile passes its bounds
         * to the kernels (the same for every stacked head) */
        const int32_t *tlo, *thi;
        int partial = stacked_band(p, &s, elementwise, i0, n, ng, j0, cols, sc->lo, sc->hi, &tlo, &thi) || bm_bits;
        if (bm_bits && !elementwise && bmask_bounds(p, &s, sc, i0, n, ng, h0, j0, cols, &tlo, &thi))
            bm_bits = 0; /* its runs are the tile's bounds now */
        if (fused && fused_tile(job, sc, &w, unit0, j0, cols, partial, tlo, thi, bm_bits, &t0, &qt2_ready)) continue;
        /* trimmed where the band ends inside the tile for its first rows (a window's
         * left edge alone leaves nothing to trim) */
        const int64_t pair_flops = fa_tile_flops(job->phases, 2, rows, cols, tlo, thi); /* 2 per pair and dim */
        if (tlo && thi[0] + 1 < cols && !bm_bits && job->path->trims && !p->drop.on && Dv > 0 && rows > TRIM_ROWS) {
            t0 = wide_trimmed(job, sc, &w, j0, cols, tlo, thi, t0);
            fa_phase_flops(job->phases, FA_PH_S, pair_flops * p->D);
            fa_phase_flops(job->phases, FA_PH_P, pair_flops * Dv);
            continue;
        }
        /* 1. scaled scores */
        const float *v = job->path->scores(job, sc, &w, j0, cols, &ldv);
        t0 = fa_phase_mark(job->phases, FA_PH_S, t0);
        fa_phase_flops(job->phases, FA_PH_S, pair_flops * p->D);

        /* 2-5. softcap, bias, ALiBi and masks, head by head */
        if (elementwise)
            for (int64_t g = 0; g < ng; g++) fa_scores_finish(p, &s, 0, h0 + g, i0, n, j0, cols, sc->st + g * n, bp, 1);
        if (bm_bits)
            for (int64_t g = 0; g < ng; g++)
                fa_bmask_apply(p, &s, 0, h0 + g, i0, n, j0, cols, sc->st + g * n, bp, 1, sc->bms);

        /* 6-7. online softmax: new max, P = exp(S - m), alpha = exp(m_old - m_new) */
        kern->softmax(rows, cols, sc->st, bp, tlo, thi, sc->m, sc->l, sc->alpha);
        /* 8. dropout scales P after the running sum took it: the lse stays the undropped row's */
        if (p->drop.on)
            for (int64_t g = 0; g < ng; g++)
                fa_dropout_tile_t(&p->drop, it->b, h0 + g, p->Hq, p->q_start + i0, n, p->k_start + j0, cols,
                                  sc->st + g * n, bp);
        t0 = fa_phase_mark(job->phases, FA_PH_X, t0);

        if (Dv == 0) continue; /* the lse is all there is to compute */
        /* 9. acc = alpha * acc + P V */
        job->path->pv(job, sc, &w, j0, cols, partial, v, ldv);
        t0 = fa_phase_mark(job->phases, FA_PH_P, t0);
        fa_phase_flops(job->phases, FA_PH_P, pair_flops * Dv);
    }
    /* 6-7 completed: P normalised by the row's sum, lse = m + log l */
    if (step->end) finish_rows(job, &s, it, h0, i0, n, ng, sc->m, sc->l, sc->acc, 0);
}

/* Merges the key chunks of one split unit into o and lse. */
static void merge_unit(const flash_job *job, const flash_scratch *sc, const fa_task *it)
{
    const fa_problem *p = job->p;
    fa_view s;
    fa_seq_view(p, it->b, &s);
    const int64_t ldacc = job->ldacc, i0 = (int64_t)it->qb * job->plan.br;
    const int64_t n = s.Sq - i0 < job->plan.br ? s.Sq - i0 : job->plan.br;
    const float *parts[FA_MAX_KV_SPLITS];
    float lses[FA_MAX_KV_SPLITS];
    const int64_t stacks = it->nkv > 0 ? it->nkv : 1;
    for (int64_t r = 0; r < n * it->ng * stacks; r++) {
        for (int k = 0; k < it->nsplit; k++) {
            const float *slot = job->slots + (it->slot + k) * job->slot_floats;
            parts[k] = slot + r * ldacc;
            lses[k] = slot[job->slot_lse + r];
        }
        float lse;
        fa_merge_rows(it->nsplit, parts, lses, p->Dv, sc->acc, &lse);
        const int64_t h = it->h0 + r / n, i = i0 + r % n;
        if (p->sinks) { /* the row is whole now: its sink enters here, once (fa_row_norm) */
            const float merged = lse, f = fa_row_norm(merged, 1.0f, fa_sink(p, h), &lse);
            if (merged != -INFINITY) /* an empty row stays 0 */
                for (int64_t e = 0; e < p->Dv; e++) sc->acc[e] *= f;
        }
        fa_store_rows(&s.o, job->kern, 0, i, 1, h, p->Dv, sc->acc, ldacc);
        if (p->has_lse) ((float *)s.lse.data)[h * s.lse.stride[1] + i * s.lse.stride[2]] = lse;
    }
}

static void flash_worker(void *arg, int ith, int nth)
{
    (void)nth;
    flash_job *job = arg;
    flash_scratch sc;
    scratch_layout(job, &sc, job->workspace + (int64_t)ith * job->per_thread);
    /* fa_steps_take hands the steps out in order and returns once the step's waits are over */
    for (fa_step st; fa_steps_take(&job->steps, &st);) {
        char *unit = fa_steps_unit(&job->steps, &st);
        if (st.task >= 0) {
            flash_task(job, &sc, &job->items[st.task], &st, unit, fa_steps_state(&job->steps, &st));
        } else {
            const double t0 = fa_now_s();
            fa_view s;
            fa_seq_view(job->p, st.b, &s);
            fa_kv_pack_rows(job->p, &s, job->kern, &job->steps.pack, st.hk, st.j0, st.cols, st.key0, unit, sc.k16,
                            sc.v16, sc.rowf);
            atomic_fetch_add_explicit(&job->pack_ns, (long long)((fa_now_s() - t0) * 1e9), memory_order_relaxed);
        }
        fa_steps_done(&job->steps, &st);
    }
}

static void merge_worker(void *arg, int ith, int nth)
{
    (void)nth;
    flash_job *job = arg;
    flash_scratch sc;
    scratch_layout(job, &sc, job->workspace + (int64_t)ith * job->per_thread);
    const double t0 = fa_phase_start(job->phases);
    for (int64_t t; (t = atomic_fetch_add(&job->next, 1)) < job->n_merges;)
        merge_unit(job, &sc, &job->items[job->merges[t]]);
    fa_phase_mark(job->phases, FA_PH_M, t0);
}

/*
 * Decoding on the tile unit: the query rows of a decoding step that share a kv head
 * (its group's heads times the new rows; an MLA latent head's 128 heads) are the rows
 * of one tile problem, so each K tile (a latent V: the same rows) is read once for all
 * of them and both products run on tiles. Taken where the stack fills two row tiles
 * (DECODE_TILE_ROWS_MIN rows; shorter stacks stay on the small-row kernels, which read
 * K once per kv head too) and fits one task's block (DECODE_TILE_ROWS_MAX): the
 * block is the whole stack, key tiles DECODE_TILE_KEYS unless tuned or set, and
 * nothing is packed, since one task reads each key (split-KV gives the threads work).
 */
enum { DECODE_TILE_ROWS_MIN = 32, DECODE_TILE_ROWS_MAX = 256, DECODE_TILE_KEYS = 256 };
/* Planned split-KV on this route: chunks of at least this many keys. A chunk's partial
 * result is its rows x Dv floats, written and then merged; for a tall stack (128 rows
 * of Dv 512: 256 KiB) over the 1024-key chunks that 32 splits of 32K keys make, that is
 * a fifth of the K bytes the chunk reads, twice over. */
enum { DECODE_TILE_SPLIT_KEYS = 2048 };

static int decode_tiles(const fa_context *ctx, const fa_problem *p, const flash_job *job)
{
    const fa_tensor *k = p->cache ? &p->kc : &p->k, *v = p->cache ? &p->vc : &p->v;
    int64_t rows;
    /* the bf16 path's rows, pages allowed */
    if (!(ctx->kernels->flags & FA_KERNELS_TILES) || !bf16_rows(p, job, 1) || p->drop.on || p->bm.on ||
        p->quant_matmul || p->group < 2 || !fa_mul_ok(p->Sq, p->group, &rows))
        return 0;
    /* a page pool's rows are taken whole where they lie (kv.h, fa_kv_tile_u16) */
    if (p->block_table && (k->stride[3] != 1 || v->stride[3] != 1)) return 0;
    return rows >= DECODE_TILE_ROWS_MIN && rows <= DECODE_TILE_ROWS_MAX;
}

static void decode_tiles_plan(const fa_problem *p, flash_job *job)
{
    if (job->plan.src_q == FA_TILES_HEURISTIC) {
        job->plan.br = p->Sq * p->group; /* decode_tiles checked the product */
        job->plan.br_pad = fa_panel_ld(job->plan.br);
    }
    if (job->plan.src_kv == FA_TILES_HEURISTIC) job->plan.bc = p->Sk < DECODE_TILE_KEYS ? p->Sk : DECODE_TILE_KEYS;
}

/* The wide tasks' int8 digits (flash_task_q8) where the call's mode asks for them and
 * the table has the kernels, else 0: float K or an int8 cache, no dropout (its bits
 * are the wide loop's), no block mask, key tiles the small-row kernels take, and sums
 * that fit int32 (K's second digit doubles the reduction). */
static int wide_q8(const fa_context *ctx, const fa_problem *p, const flash_job *job)
{
    if (!p->quant_matmul || !(ctx->kernels->flags & FA_KERNELS_I8_DOT) || !(ctx->kernels->flags & FA_KERNELS_SMALL_ROWS))
        return 0;
    if (p->drop.on || p->bm.on || job->plan.bc > FA_SMALL_COLS) return 0;
    if (p->quant && p->kc.dtype != FA_DTYPE_I8) return 0;
    const int64_t d_max = p->quant || p->quant_matmul == 1 ? FA_QUANT_D_MAX : FA_QUANT_D_MAX / 2;
    return p->D <= d_max ? p->quant_matmul : 0;
}

/* The wide tasks' operand path, chosen once per job: int8 products where wide_q8 grants
 * them (the fused forward's route where wide_fused_i8 does), bf16 pairs where q and the
 * K/V rows the kernels read are bf16 rows they pair (no pages but on the decode-tile
 * route, no codes), else f32 as bf16 products where set, else f32. */
static const wide_path *wide_path_of(const fa_context *ctx, const fa_problem *p, const flash_job *job)
{
    if (job->wide_digits)
        return &wide_paths[wide_fused_i8(ctx, p, job) ? WIDE_I8 : wide_i8_pairs(ctx, p, job) ? WIDE_I8P : WIDE_Q8];
    if (bf16_rows(p, job, job->decode_tiles)) return &wide_paths[WIDE_BF16];
    return &wide_paths[job->mm_terms ? WIDE_SPLIT : WIDE_F32];
}

/* The job's tiles, paths and per-thread scratch, from the shapes and the context. */
static void flash_plan(fa_context *ctx, const fa_problem *p, flash_job *job)
{
    /* plan for the rows a task holds: a short q block stacks the heads of its group */
    fa_problem plan_p = *p;
    if (plan_p.Sq < 1) plan_p.Sq = 1;
    if (!fa_mul_ok(plan_p.Sq, p->group > 0 ? p->group : 1, &plan_p.Sq)) plan_p.Sq = INT64_MAX / 2;
    if (plan_p.Sk < 1) plan_p.Sk = 1;
    /* bf16 dot products only where they are faster than widening to fp32 (auto), or forced */
    job->bf16_dot = p->dtype == FA_DTYPE_BF16 && fa_bf16_dot_active(ctx);
    /* the table's fused forward, for what it takes: no element-wise rule (softcap, bias,
     * ALiBi) and no dropout, which act on scores or P between its steps; a boolean mask
     * alone it takes by its runs, tile by tile (mask_bounds; bf16 inputs only) */
    /* f32 as bf16 products: opt-in, and only where the table multiplies bf16 natively */
    job->mm_terms = 0;
    if (p->dtype == FA_DTYPE_F32 && (ctx->kernels->flags & FA_KERNELS_BF16_DOT))
        job->mm_terms = p->f32_matmul == FA_F32_MATMUL_BF16X3 ? 3 : p->f32_matmul == FA_F32_MATMUL_BF16 ? 1 : 0;
    /* (f32 as bf16 products too: its mode, kernels.h) */
    job->fused = ctx->set.bf16_fused && (job->bf16_dot || job->mm_terms) && (ctx->kernels->flags & FA_KERNELS_FWD_BF16) &&
                 (!fa_problem_has_elementwise(p) || (fused_mask(p) && !job->mm_terms)) && !p->drop.on;
    /* the f32 path trims a band's diagonal tiles (wide_trimmed), the fused kernel on bf16
     * rows skips what a band leaves of a tile's blocks (int8 products may take its tasks:
     * wide_q8; the bf16x3 mode keeps the plain tiles it was measured on) */
    const int loop = job->fused && bf16_rows(p, job, 0) && !p->quant_matmul ? FA_PLAN_FUSED
                     : !job->bf16_dot && !job->mm_terms && !p->drop.on  ? FA_PLAN_TRIMMED
                                                                        : FA_PLAN_PLAIN;
    fa_plan_tiles(ctx, &plan_p, loop, &job->plan);
    job->decode_tiles = decode_tiles(ctx, p, job);
    if (job->decode_tiles) decode_tiles_plan(p, job);
    job->ldacc = round16(p->Dv); /* Dv <= FA_DIM_MAX (checks.c): no overflow here or below */
    job->lds = round16(job->plan.bc);
    /* decoding takes no dropout: the small-row loop leaves it to the wide one */
    job->small = (ctx->kernels->flags & FA_KERNELS_SMALL_ROWS) && job->plan.bc <= FA_SMALL_COLS && !p->drop.on;
    /* int8 products: opt-in, int8 caches, where the table has its own kernels (tasks on
     * other key types ignore it) */
    job->digits = job->small && p->quant && (ctx->kernels->flags & FA_KERNELS_I8_DOT) && p->D <= FA_QUANT_D_MAX
                      ? p->quant_matmul
                      : 0;
    job->wide_digits = wide_q8(ctx, p, job);
    job->path = wide_path_of(ctx, p, job);
    /* the fused kernel is a variant of the bf16 and split paths: a call whose rows take
     * another one (pages, codes, int8 products) never runs it, so it neither reserves its
     * scratch nor reports it */
    job->fused = job->fused && job->path->fuses;
    /* stacks one small-row task may hold: their Q rows, accumulators and softmax
     * state within 256 KiB, a share of L2 */
    job->stacks_max = (256 << 10) / ((FA_SMALL_ROWS * (job->ldacc + p->D) + 3 * FA_ROW_ALIGN) * 4);
    if (job->stacks_max > p->Hq) job->stacks_max = p->Hq;
    if (job->stacks_max < 1) job->stacks_max = 1;
    /* K/V beyond SMALL_AHEAD_BYTES (more than the L3 share of a few cores) come from
     * DRAM, where the next stack's prefetches hide latency; smaller ones may be cached,
     * where the hints only cost issue slots. A size rule: the L3 size a VM reports can
     * be the host's. */
    const fa_tensor *kt = p->cache ? &p->kc : &p->k, *vt = p->cache ? &p->vc : &p->v;
    const int64_t kv_bytes =
        p->B * p->Sk * p->Hk * (p->D * (int64_t)fa_dtype_size(kt->dtype) + p->Dv * (int64_t)fa_dtype_size(vt->dtype));
    job->small_ahead = kv_bytes > SMALL_AHEAD_BYTES;
    job->per_thread = scratch_layout(job, NULL, NULL);
}

/* The verbose trace's name of the path the job's tasks take: the wide tasks' operand
 * path (wide_paths, the fused kernel a variant of bf16 and split), or int8 products where
 * the small-row tasks take them (digits) on an f32 job; never a path the job only could
 * have taken (bf16 q over pages or codes runs the f32 one). */
static const char *path_name(const flash_job *job)
{
    const int digits = job->wide_digits ? job->wide_digits : job->digits;
    if (job->path == &wide_paths[WIDE_I8]) return "i8-fused";
    if (job->path == &wide_paths[WIDE_I8P]) return "i8-pairs";
    if (job->path == &wide_paths[WIDE_BF16]) return job->fused ? "bf16-fused" : "bf16-dot";
    if (job->path == &wide_paths[WIDE_SPLIT])
        return job->mm_terms == 3 ? (job->fused ? "bf16x3-fused" : "bf16x3") : job->fused ? "bf16-of-f32-fused" : "bf16-of-f32";
    return digits == 2 ? "i8x2" : digits == 1 ? "i8" : "f32";
}

fa_status fa_run_flash(fa_context *ctx, const fa_problem *p, fa_run_info *info)
{
    flash_job job = {.p = p, .kern = ctx->kernels};
    if (p->B > INT32_MAX || p->Hq > INT32_MAX)
        return fa_fail(ctx, FA_ERR_OVERFLOW, "flash: B = %lld or Hq = %lld exceeds the task index range",
                       (long long)p->B, (long long)p->Hq);
    flash_plan(ctx, p, &job);

    const fa_task_rules rules = {.br = job.plan.br, .small = job.small, .stacks_max = job.stacks_max,
                                 .split_keys = job.decode_tiles ? DECODE_TILE_SPLIT_KEYS : 0,
                                 .kv_splits = p->args->kv_splits ? p->args->kv_splits : ctx->set.kv_splits};
    fa_task_counts counts;
    fa_tasks_count(p, &rules, &counts);
    const int nth = ctx->threads < counts.tasks ? ctx->threads : (int)(counts.tasks > 0 ? counts.tasks : 1);

    /* workspace: per-thread scratch, the tasks, split units, partial slots */
    job.slot_lse = counts.max_rows * job.ldacc; /* the most rows a task holds */
    job.slot_floats = job.slot_lse + round16(counts.max_rows);
    char *scratch, *keys;
    int64_t *merges, *units;
    /* packed K/V are planned from the tasks, into a second workspace; here only the
     * per-unit counts that plan needs */
    int form = fa_kv_packing_form(p, job.bf16_dot, job.mm_terms, ctx->set.kv_pack);
    if (job.path->task) form = -1; /* a task loop of its own reads K and V where they are */
    if (form == 1 && job.fused) form = FA_KV_FORM_KT; /* the fused kernel reads K^T */
    if (form == FA_KV_FORM_SPLIT(job.mm_terms) && job.mm_terms && job.fused) form = FA_KV_FORM_KT_SPLIT(job.mm_terms);
    if (job.decode_tiles && ctx->set.kv_pack != 2) form = -1; /* unless asked to pack always */
    const fa_ws_part parts[] = {
        {(void **)&scratch, job.per_thread < 0 ? -1 : fa_bytes3(job.per_thread, nth, 1)},
        {(void **)&job.items, fa_bytes3(counts.tasks, (int64_t)sizeof(fa_task), 1)},
        {(void **)&merges, fa_bytes3(counts.units, (int64_t)sizeof(int64_t), 1)},
        {(void **)&job.slots, fa_bytes3(counts.slots, job.slot_floats, 4)},
        {(void **)&units, form < 0 ? 0 : fa_bytes3(p->B, p->Hk, 7 * 8)},
        {(void **)&keys, job.path->keys ? q8_keys_layout(p, job.path->keys, &job.keys, NULL) : 0},
    };
    const int64_t bytes = fa_ws_layout(parts, sizeof parts / sizeof parts[0], NULL);
    if (bytes < 0) return fa_fail(ctx, FA_ERR_OVERFLOW, "flash: the workspace size overflows 64 bits");
    char *ws = fa_context_workspace(ctx, bytes);
    if (!ws)
        return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flash: cannot allocate %lld bytes of workspace", (long long)bytes);
    fa_ws_layout(parts, sizeof parts / sizeof parts[0], ws);
    if (job.path->keys) q8_keys_layout(p, job.path->keys, &job.keys, keys);
    job.workspace = scratch;
    job.merges = merges;

    fa_tasks_fill(p, &rules, &counts, job.items);
    job.n_items = counts.tasks;
    job.n_merges = fa_tasks_merges(job.items, job.n_items, job.merges);

    fa_steps_init(&job.steps, job.items, job.n_items);
    /* a chunked unit's task keeps acc (br, ldacc), m and l (br_pad) between its steps */
    const fa_pack_rules pack_rules = {.form = form, .mode = ctx->set.kv_pack, .threads = nth, .br = job.plan.br,
                                      .bc = job.plan.bc,
                                      .state_bytes = (job.plan.br * job.ldacc + 2 * job.plan.br_pad) * 4,
                                      /* f32 as bf16 products: a chunked unit's every step splits its Q rows again */
                                      .unit_max = form > FA_KV_FORM_KT ? 2 * FA_PACK_UNIT_MAX : 0};
    char *ws2 = NULL;
    const int64_t bytes2 = form < 0 ? 0 : fa_steps_plan(&job.steps, p, &pack_rules, units);
    if (bytes2 < 0 || (bytes2 > 0 && !(ws2 = fa_context_workspace_slot(ctx, 1, bytes2)))) {
        fa_context_workspace_done(ctx, ws);
        return bytes2 < 0 ? fa_fail(ctx, FA_ERR_OVERFLOW, "flash: the packed K/V size overflows 64 bits")
                          : fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flash: cannot allocate %lld bytes for packed K/V",
                                    (long long)bytes2);
    }
    if (ws2) fa_steps_fill(&job.steps, p, &pack_rules, units, ws2);

    atomic_init(&job.pack_ns, 0);
    fa_phases phases;
    fa_phases_init(&phases, ctx->set.verbose || ctx->set.profile);
    job.phases = &phases;
    atomic_init(&job.next, 0);
    if (job.path->keys && job.n_items > 0) fa_pool_run(ctx->pool, nth, q8_keys_worker, &job);
    if (job.n_items > 0) fa_pool_run(ctx->pool, nth, flash_worker, &job);
    atomic_init(&job.next, 0);
    if (job.n_merges > 0) fa_pool_run(ctx->pool, nth, merge_worker, &job);
    fa_phases_read(&phases, info->phase_us, info->phase_flop);
    /* sequences with no query rows have nothing to write; rows with no keys were
     * written by their tasks (o = 0, lse = -inf) */
    fa_context_workspace_done(ctx, ws);
    if (ws2) fa_context_workspace_done(ctx, ws2);
    info->extra_bytes = bytes + bytes2;
    info->kv_packed = job.steps.packed;
    info->kv_pack_us = atomic_load(&job.pack_ns) / 1000;
    info->br = job.plan.br;
    info->bc = job.plan.bc;
    info->threads = nth;
    info->path = path_name(&job);
    info->kv_splits = counts.max_split;
    return FA_OK;
}
