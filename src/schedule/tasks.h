/*
 * tasks.h: every schedule of the tiled loops, so that the algorithm files only run
 * steps. It owns:
 *   - the forward's tasks: a validated problem cut into (sequence, query block,
 *     query heads, key chunk), each with a cost, most expensive first so that
 *     threads taking them from an atomic counter finish together;
 *   - the forward's steps when K/V are packed: pack steps and task steps in waves
 *     through two buffers, a long unit in key chunks whose readers go in groups
 *     that keep their online softmax state between chunks, the steps' hand-out
 *     order and their waits (fa_steps);
 *   - the backward's tasks: fused (sequence, kv head) walks, or the two-pass
 *     schedule's key tiles and query blocks (fa_bwd_tasks_*);
 *   - the two band questions a tiled loop asks: which key columns a block of query
 *     rows sees (query-outer loops), and which query rows see a block of keys
 *     (key-outer loops, as the backward's).
 * Both task lists are ordered by one rule (most expensive first, then by position).
 * No plan depends on the thread count, so the order of every floating-point
 * operation is a function of the shapes alone; only the packing's wave sizes and
 * reader groups and the backward's choice of schedule read it, and none changes a bit
 * (a chunked task still walks its key tiles, planned from the shapes, in order).
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
    int64_t split_keys;  /* planned split-KV: the fewest keys per chunk; 0 = the default (tasks.c) */
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
 * chunk, cut to the block mask's listed blocks (empty when *lo > *hi). */
void fa_task_columns(const fa_problem *p, const fa_view *s, const fa_task *t, int64_t i0, int64_t n, int64_t *lo,
                     int64_t *hi);
/* The inverse: the query rows [*ilo, *ihi] of s (empty when *ilo > *ihi) whose band
 * meets keys j0 .. j1. Exact for band-shaped masks, since both band ends grow with i. */
void fa_key_block_rows(const fa_problem *p, const fa_view *s, int64_t j0, int64_t j1, int64_t *ilo, int64_t *ihi);

/* ------------------------------------------------ the forward's steps */

/*
 * One step of a forward run, as fa_steps_at describes it. A task step runs
 * tasks[task]: wave < 0 whole, on the caller's K/V; else on the piece of a unit in
 * slot `slot` of its wave's buffer, whose first key is key0, running the key tiles
 * of the task that start in [j0, j0 + cols). A pack step (task < 0) writes keys
 * j0 .. j0+cols-1 of unit (b, hk) into that slot, key j at row j - key0.
 * A task step with state >= 0 is one of several of its task (a chunked unit): its
 * online softmax state (m, l, the accumulator) lives in state slot `state` between
 * them; `begin` clears it, `end` normalises and stores the rows.
 */
typedef struct fa_step {
    int64_t task;
    int32_t wave, slot;
    int32_t b, hk;
    int64_t j0, cols, key0;
    int32_t state;         /* -1: the task's only step, state in the thread's scratch */
    int16_t begin, end;
    int64_t piece;         /* planning and waits only */
} fa_step;

/* What the packing of a forward may do. */
typedef struct fa_pack_rules {
    int form;        /* fa_kv_packing_form: 1 bf16, 0 f32, FA_KV_FORM_SPLIT(T) split */
    int mode;        /* FA_PARAM_KV_PACK: 2 packs every unit two tasks share */
    int threads;     /* threads that will take the steps */
    int64_t br, bc;  /* query rows per block, keys per tile */
    int64_t state_bytes; /* one task's online softmax state (a chunked unit's readers) */
    int64_t unit_max;    /* bytes above which a unit is chunked; 0: FA_PACK_UNIT_MAX */
} fa_pack_rules;

/* A unit up to this size is packed whole, a larger one in key chunks of about half
 * (f32, D = Dv = 128: units of more than 2048 keys, chunks of 1024 - bc keys). */
#define FA_PACK_UNIT_MAX ((int64_t)2 << 20)

/*
 * A piece: what one wave slot holds. A unit of at most unit_max bytes is one piece,
 * all its keys, read by all its tasks. A longer one is cut twice: its readers (in the
 * tasks' order) into as few groups of at most `group` tasks as hold them (sizes
 * within one of each other), and its keys into chunks of
 * chunk_keys, a multiple of the pack step (so of bc); a piece is then (group, chunk),
 * read by each task of the group for its tiles that start in the chunk, and holds
 * the chunk's keys and the bc after them (a tile may run past the chunk's end).
 * A group's pieces are its chunks from the first any of its tasks reaches to the last.
 * A ranged unit (a block mask's, each task's tiles within a slot: count_readers in
 * tasks.c) is cut by its readers instead: runs of them in the tasks' order, each one
 * piece (group -1) of the keys its tasks' tiles cover, each reader one step on it.
 */
typedef struct fa_piece {
    int64_t unit;          /* b * Hk + hk */
    int64_t c0, c1, k1;    /* tile starts [c0, c1); keys packed [c0, k1) */
    int64_t first, n;      /* its readers: order[first .. first + n) */
    int64_t group;         /* its group (chunked units), -1 for a whole unit */
    int64_t packs;         /* its pack steps */
    int32_t wave, slot;
    int16_t begin, end;    /* first, last piece of its group */
} fa_piece;

/*
 * The steps of a forward run and their hand-out. Without packing (pieces == NULL)
 * step t is task t on the caller's K/V. With packing, the steps are
 *   the unpacked tasks, in the tasks' order; then for each wave w: the pack steps of
 *   its pieces (pieces in order, keys ascending in steps of bc, made even in the bf16
 *   form), then its task steps (pieces in order, each piece's readers in the tasks'
 *   order);
 * pieces in the order: units as the tasks (most expensive first) first reach them,
 * then a unit's groups, then a group's chunks ascending. So a task of a chunked unit
 * meets its key tiles in the order of an unpacked run, and its results are the same
 * bits. The steps are described on demand (fa_steps_at), from the pieces, not listed:
 * the memory is the pieces, a unit's share of the tasks and the buffers.
 *
 * Waits: a task step waits for every pack step of its wave; a pack step of wave w for
 * every task step of wave w - 2 (the last to use its buffer); a task step of a
 * chunked unit also for its task's previous step (state slot k is its group's k-th
 * reader's, and holds the step's piece when done), and the first piece of a group for
 * every step of the group before (so the state slots are free; by induction every
 * earlier group is done). Packing one wave thus overlaps the tail of the one before.
 *
 * Why no step waits forever: steps are handed out in index order from one counter,
 * and every wait is on steps of smaller index (a wave's packs come before its tasks;
 * wave w - 2's tasks before wave w's packs; a task's previous piece is an earlier
 * piece of its group, in an earlier wave or earlier in the same wave's task steps;
 * the group before is earlier as a whole). A step of smaller index has been taken
 * already, by a thread that runs it or waits on a smaller one still; the smallest
 * step not yet done waits on nothing, so it finishes, and by induction every step
 * does, on any number of threads (one thread runs them in order without waiting).
 *
 * Memory: two wave buffers of wave_units slots (a few MiB; more only when many threads
 * need work, never more than FA_WORKSPACE_KEEP together), group state slots of
 * state_bytes (about 1 MiB, or 2 * threads tasks), and the pieces: a function of the
 * thread count, not of the sequence, but for the pieces' small records.
 */
typedef struct fa_steps {
    const fa_task *tasks;
    int64_t n_tasks;
    fa_kv_packing pack;    /* a slot's layout (bf16 form or f32) */
    fa_piece *pieces;      /* NULL: nothing packed */
    int64_t n_pieces, n_steps;
    int64_t *order;        /* the unpacked tasks, then the packed units' readers by unit */
    char *buf[2];          /* the wave buffers: wave w uses buf[w & 1] */
    int64_t wave_units;    /* slots per wave */
    int64_t chunk_keys;    /* 0: every unit whole */
    int64_t group;         /* tasks per group of a chunked unit */
    int64_t groups;        /* groups in all */
    int64_t pc;            /* keys per pack step */
    int64_t hk_count;      /* the problem's kv heads (a unit is b * hk_count + hk) */
    char *state;           /* group state slots, state_bytes each */
    int64_t state_bytes;
    int64_t waves, packed, unpacked, pack_steps; /* packed units; tasks reading none; pack steps in all */
    int64_t *wave_start;   /* per wave, and one past: its first step (its first piece: w * wave_units) */
    int64_t *wave_packs;   /* per wave: its pack steps in all (then its task steps to the next start) */
    atomic_llong *packs_done, *tasks_done;       /* per wave: those done so far */
    int64_t *group_steps;                        /* per group: its task steps in all */
    atomic_llong *group_done;                    /* per group: those done so far */
    atomic_llong *slot_done;                     /* per state slot: 1 + the piece of its last step done */
    atomic_llong next;     /* the next step to hand out */
} fa_steps;

/* Steps that run the tasks in order, nothing packed. */
void fa_steps_init(fa_steps *st, const fa_task *tasks, int64_t n_tasks);
/* Plans the packing of p's K/V for st's tasks: which units enough tasks read, the
 * pieces and the waves. units: 7 * (p->B * p->Hk) scratch that fa_steps_fill reads
 * next. Returns the bytes fa_steps_fill needs (0: nothing to pack, st stays
 * unpacked), -1 on overflow. */
int64_t fa_steps_plan(fa_steps *st, const fa_problem *p, const fa_pack_rules *rules, int64_t *units);
/* Lays the planned pieces, wave buffers, state slots and counters out in ws. */
void fa_steps_fill(fa_steps *st, const fa_problem *p, const fa_pack_rules *rules, const int64_t *units, char *ws);
/* Step t (0 <= t < n_steps, or n_tasks unpacked), without waiting. */
void fa_steps_at(const fa_steps *st, int64_t t, fa_step *step);
/* 1 when everything the step waits for is done. */
int fa_steps_ready(fa_steps *st, const fa_step *step);
/* Hands out the next step in order and returns once what it waits for is done;
 * 0 when no step is left. */
int fa_steps_take(fa_steps *st, fa_step *step);
/* Marks a taken step done (for the steps that wait on it). */
void fa_steps_done(fa_steps *st, const fa_step *step);
/* The wave slot a step writes or reads, NULL for a task on the caller's K/V. */
static inline char *fa_steps_unit(const fa_steps *st, const fa_step *step)
{
    return step->wave < 0 ? NULL : st->buf[step->wave & 1] + step->slot * st->pack.unit_bytes;
}
/* The state slot of a chunked task's step, NULL for a task's only step. */
static inline char *fa_steps_state(const fa_steps *st, const fa_step *step)
{
    return step->state < 0 ? NULL : st->state + step->state * st->state_bytes;
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
