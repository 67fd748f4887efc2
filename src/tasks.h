/*
 * tasks.h: the task planner, shared by every tiled loop (the flash forward today;
 * a backward loop and a ring driver next). It cuts a validated problem into tasks
 * of (sequence, query block, query heads, key chunk), each with a cost, ordered
 * most expensive first so that threads taking them from an atomic counter finish
 * together; and it answers the two band questions a tiled loop asks:
 *   - which key columns a block of query rows sees (query-outer loops), and
 *   - which query rows see a block of keys (key-outer loops, as a backward has).
 * Nothing here depends on the thread count: the plan, and so the order of every
 * floating-point operation, is a function of the shapes alone.
 */
#ifndef FA_TASKS_H
#define FA_TASKS_H

#include "internal.h"

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

/* Keys [*ca, *cb) of chunk `split` of `nsplit` over sk keys. */
void fa_chunk_range(int64_t sk, int64_t split, int64_t nsplit, int64_t *ca, int64_t *cb);
/* The keys [*lo, *hi] rows i0 .. i0+n-1 of sequence view s keep within the task's
 * chunk (empty when *lo > *hi). */
void fa_task_columns(const fa_problem *s, const fa_task *t, int64_t i0, int64_t n, int64_t *lo, int64_t *hi);
/* The inverse: the query rows [*ilo, *ihi] of s (empty when *ilo > *ihi) whose band
 * meets keys j0 .. j1. Exact for band-shaped masks, since both band ends grow with i. */
void fa_key_block_rows(const fa_problem *s, int64_t j0, int64_t j1, int64_t *ilo, int64_t *ihi);

#endif
