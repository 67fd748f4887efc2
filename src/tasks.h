/*
 * tasks.h: every schedule of the tiled loops, so that the algorithm files only run
 * steps. It owns:
 *   - the forward's tasks: a validated problem cut into (sequence, query block,
 *     query heads, key chunk), each with a cost, most expensive first so that
 *     threads taking them from an atomic counter finish together;
 *   - the forward's steps when K/V are packed: pack steps and task steps in waves
 *     through two buffers, their hand-out order and their waits (fa_steps);
 *   - the backward's tasks: fused (sequence, kv head) walks, or the two-pass
 *     schedule's key tiles and query blocks (fa_bwd_tasks_*);
 *   - the two band questions a tiled loop asks: which key columns a block of query
 *     rows sees (query-outer loops), and which query rows see a block of keys
 *     (key-outer loops, as the backward's).
 * Both task lists are ordered by one rule (most expensive first, then by position).
 * No plan depends on the thread count, so the order of every floating-point
 * operation is a function of the shapes alone; only the packing's wave sizes and the
 * backward's choice of schedule read it, and neither changes a bit.
 */
#ifndef FA_TASKS_H
#define FA_TASKS_H

#include "algos.h"
#include "kv.h"

#include <stdatomic.h>

/* One task. */
typedef struct fa_task {
    int32_t b, qb;       /* sequence, q block */
    int32_t h0, ng;      /* first query head, heads stacked */
    int32_t nkv;         /* stacks in the task (small-row path): heads h0 .. h0 + nkv*ng - 1; 0 = wide path */
    int32_t split, nsplit;
    int64_t slot;        /* first partial-result slot of this (b, qb, h0) when nsplit > 1 */
    int64_t cost;        /* kept (i, j) pairs */
} fa_task;

/* What the loop that runs the tasks can do, which shapes the plan. */
typedef struct fa_task_rules {
    int64_t br;          /* query rows per block (fa_plan.br) */
    int small;           /* the small-row kernels apply (tiles fit them) */
    int64_t stacks_max;  /* small-row path: head stacks one task may hold */
    int64_t kv_splits;   /* 0 = planned split-KV, else forced chunks per sequence */
} fa_task_rules;

/* The sizes of a plan, known before the tasks are written. */
typedef struct fa_task_counts {
    int64_t tasks;       /* tasks in all */
    int64_t units;       /* (b, qb, h0) units, each split into nsplit tasks */
    int64_t slots;       /* partial-result slots the split units need */
    int64_t max_split;   /* most chunks of any sequence */
    int64_t max_rows;    /* most query rows one task holds */
} fa_task_counts;

/* Counts the plan. Split-KV engages below SPLIT_TASKS_WANTED unsplit units. */
void fa_tasks_count(const fa_problem *p, const fa_task_rules *rules, fa_task_counts *counts);
/* Writes counts->tasks tasks, most expensive first. */
void fa_tasks_fill(const fa_problem *p, const fa_task_rules *rules, const fa_task_counts *counts, fa_task *tasks);

/* The merge pass of split-KV: writes the indices of split 0 of every split unit
 * (room for counts->units), in the tasks' order; returns how many. */
int64_t fa_tasks_merges(const fa_task *tasks, int64_t n_tasks, int64_t *merges);

/* Keys [*ca, *cb) of chunk `split` of `nsplit` over sk keys. */
void fa_chunk_range(int64_t sk, int64_t split, int64_t nsplit, int64_t *ca, int64_t *cb);
/* The keys [*lo, *hi] rows i0 .. i0+n-1 of sequence view s keep within the task's
 * chunk (empty when *lo > *hi). */
void fa_task_columns(const fa_problem *s, const fa_task *t, int64_t i0, int64_t n, int64_t *lo, int64_t *hi);
/* The inverse: the query rows [*ilo, *ihi] of s (empty when *ilo > *ihi) whose band
 * meets keys j0 .. j1. Exact for band-shaped masks, since both band ends grow with i. */
void fa_key_block_rows(const fa_problem *s, int64_t j0, int64_t j1, int64_t *ilo, int64_t *ihi);

/* ------------------------------------------------ the forward's steps */

/*
 * One step of a forward run: a task step runs tasks[task] (wave < 0: on the
 * caller's K/V; else on the unit in slot `slot` of its wave's buffer); a pack step
 * (task < 0) writes keys j0 .. j0+cols-1 of unit (b, hk) into slot `slot` of wave
 * `wave`'s buffer.
 */
typedef struct fa_step {
    int64_t task;
    int32_t wave, slot;
    int32_t b, hk;
    int64_t j0, cols;
} fa_step;

/* What the packing of a forward may do. */
typedef struct fa_pack_rules {
    int form;        /* fa_kv_packing_form: 1 bf16, 0 f32, FA_KV_FORM_SPLIT(T) split */
    int mode;        /* FA_PARAM_KV_PACK: 2 packs every unit two tasks share */
    int threads;     /* threads that will take the steps */
    int64_t bc;      /* keys per tile */
} fa_pack_rules;

/*
 * The steps of a forward run and their hand-out. Without packing (steps == NULL)
 * step t is task t on the caller's K/V. With packing, the plan is
 *   the unpacked tasks, in the tasks' order; then for each wave w: the pack steps
 *   of its units (units in the order the tasks first reach them, keys ascending in
 *   tiles of bc, made even in the bf16 form), then its tasks, in the tasks' order;
 * and a task step waits for every pack step of its wave, a pack step of wave w for
 * every task step of wave w - 2 (the last to use its buffer). Packing one wave thus
 * overlaps the tail of the one before.
 */
typedef struct fa_steps {
    const fa_task *tasks;
    int64_t n_tasks;
    fa_kv_packing pack;    /* a unit's layout (bf16 form or f32) */
    fa_step *steps;        /* NULL: nothing packed */
    int64_t n_steps;
    char *buf[2];          /* the wave buffers: wave w uses buf[w & 1] */
    int64_t wave_units;    /* units per wave */
    int64_t waves, packed, unpacked, pack_steps; /* packed units; tasks reading none; pack steps in all */
    int64_t *wave_packs, *wave_tasks;            /* per wave: its pack and task steps in all */
    atomic_llong *packs_done, *tasks_done;       /* per wave: those done so far */
    int64_t *wave_cursor, *unit_of_order;        /* planning only */
    atomic_llong next;     /* the next step to hand out */
} fa_steps;

/* Steps that run the tasks in order, nothing packed. */
void fa_steps_init(fa_steps *st, const fa_task *tasks, int64_t n_tasks);
/* Plans the packing of p's K/V for st's tasks: which units enough tasks read, and
 * the waves. units: (p->B * p->Hk) scratch that fa_steps_fill reads next. Returns the
 * bytes fa_steps_fill needs (0: nothing to pack, st stays unpacked), -1 on overflow. */
int64_t fa_steps_plan(fa_steps *st, const fa_problem *p, const fa_pack_rules *rules, int64_t *units);
/* Lays the planned steps, wave buffers and counters out in ws and writes the steps. */
void fa_steps_fill(fa_steps *st, const fa_problem *p, const fa_pack_rules *rules, const int64_t *units, char *ws);
/* Hands out the next step in order and returns once what it waits for is done;
 * 0 when no step is left. */
int fa_steps_take(fa_steps *st, fa_step *step);
/* Marks a taken step done (for the steps that wait on it). */
void fa_steps_done(fa_steps *st, const fa_step *step);
/* The packed unit a step writes or reads, NULL for a task on the caller's K/V. */
static inline char *fa_steps_unit(const fa_steps *st, const fa_step *step)
{
    return step->wave < 0 ? NULL : st->buf[step->wave & 1] + step->slot * st->pack.unit_bytes;
}

/* ------------------------------------------------ the backward's tasks */

typedef enum { FA_BWD_FUSED, FA_BWD_KEY_TILE, FA_BWD_QUERY_BLOCK } fa_bwd_kind;

/* One backward task. Fused: every key tile of kv head `head`, dQ of its group over
 * the walk. Two-pass: a key tile from key `start` of kv head `head` (dK, dV), or a
 * query block from row `start` of query head `head` (dQ). */
typedef struct fa_bwd_task {
    int32_t b, head; /* sequence; kv head (fused, key tile) or query head (query block) */
    int32_t kind;    /* fa_bwd_kind */
    int64_t start;   /* first key (key tile) or query row (query block) */
    int64_t cost;    /* about the kept (i, j) pairs times heads */
} fa_bwd_task;

typedef struct fa_bwd_rules {
    int64_t br, bc;  /* query rows and keys per tile */
    int threads;
    int two_pass_ok; /* the two-pass schedule may be chosen */
    int kv, dq;      /* dK or dV asked for; dQ asked for */
} fa_bwd_rules;

typedef struct fa_bwd_counts {
    int64_t tasks;
    int two_pass;    /* the two-pass schedule was chosen */
    int64_t sq_max;  /* the longest sequence's query rows */
} fa_bwd_counts;

/* Chooses the schedule and counts its tasks; 0 when B * Hk overflows. */
int fa_bwd_tasks_count(const fa_problem *p, const fa_bwd_rules *rules, fa_bwd_counts *counts);
/* Writes counts->tasks tasks, most expensive first. */
void fa_bwd_tasks_fill(const fa_problem *p, const fa_bwd_rules *rules, const fa_bwd_counts *counts,
                       fa_bwd_task *tasks);

#endif
