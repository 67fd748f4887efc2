/*
 * tasks.c: see tasks.h. The split-KV rule and the head stacking here are the
 * ones the header documents next to fa_merge_states.
 */
#include "tasks.h"

#include <stdlib.h>

void fa_chunk_range(int64_t sk, int64_t split, int64_t nsplit, int64_t *ca, int64_t *cb)
{
    /* sk * split fits: sk <= 2^60 and split <= FA_MAX_KV_SPLITS (checks.c) */
    *ca = sk * split / nsplit;
    *cb = sk * (split + 1) / nsplit;
}

void fa_task_columns(const fa_problem *s, const fa_task *t, int64_t i0, int64_t n, int64_t *lo, int64_t *hi)
{
    /* the band ends are monotone in i, so tiles outside the first row's lo and the
     * last row's hi are never touched */
    int64_t unused, ca, cb;
    fa_row_band(s, i0, lo, &unused);
    fa_row_band(s, i0 + n - 1, &unused, hi);
    fa_chunk_range(s->Sk, t->split, t->nsplit, &ca, &cb);
    if (*lo < ca) *lo = ca;
    if (*hi > cb - 1) *hi = cb - 1;
}

void fa_key_block_rows(const fa_problem *s, int64_t j0, int64_t j1, int64_t *ilo, int64_t *ihi)
{
    /* first row whose hi reaches j0, and last row whose lo is still <= j1: two
     * binary searches over non-decreasing band ends */
    int64_t a = 0, z = s->Sq;
    while (a < z) {
        const int64_t mid = a + (z - a) / 2;
        int64_t lo, hi;
        fa_row_band(s, mid, &lo, &hi);
        if (hi >= j0) z = mid;
        else a = mid + 1;
    }
    *ilo = a;
    a = 0;
    z = s->Sq;
    while (a < z) {
        const int64_t mid = a + (z - a) / 2;
        int64_t lo, hi;
        fa_row_band(s, mid, &lo, &hi);
        if (lo <= j1) a = mid + 1;
        else z = mid;
    }
    *ihi = a - 1;
    /* a row between them may still keep nothing (lo > hi where the band is empty) */
    while (*ilo <= *ihi) {
        int64_t lo, hi;
        fa_row_band(s, *ilo, &lo, &hi);
        if (lo <= hi && lo <= j1 && hi >= j0) break;
        ++*ilo;
    }
    while (*ihi >= *ilo) {
        int64_t lo, hi;
        fa_row_band(s, *ihi, &lo, &hi);
        if (lo <= hi && lo <= j1 && hi >= j0) break;
        --*ihi;
    }
}

/* Query heads stacked per task for a sequence of sq query rows: as many of the
 * group as fit one q block (a divisor of the group, so every task is alike). */
static int64_t stack_heads(const fa_problem *p, int64_t sq, int64_t br)
{
    if (sq >= br) return 1;
    int64_t ng = 1;
    for (int64_t g = 1; g <= p->group; g++)
        if (p->group % g == 0 && g * sq <= br) ng = g;
    return ng;
}

/* Split-KV: tasks wanted before keys are split. A constant, never the thread
 * count, so the plan (and the rounding of the merge) is the same on any machine
 * with the same shapes; 32 keeps 2-16 threads busy to the end. */
enum { SPLIT_TASKS_WANTED = 32, SPLIT_MAX_AUTO = 64, SPLIT_MIN_KEYS = 512 };

/* Chunks for a sequence of sk keys when `units` unsplit tasks exist in all. */
static int64_t plan_splits(int64_t forced, int64_t units, int64_t sk)
{
    int64_t s;
    if (forced > 0) {
        s = forced;
    } else {
        if (units >= SPLIT_TASKS_WANTED) return 1;
        s = (SPLIT_TASKS_WANTED + units - 1) / units;
        if (s > SPLIT_MAX_AUTO) s = SPLIT_MAX_AUTO;
        if (s > sk / SPLIT_MIN_KEYS) s = sk / SPLIT_MIN_KEYS;
    }
    if (s > sk) s = sk; /* every chunk holds at least one key */
    return s < 1 ? 1 : s;
}

/* Kept (i, j) pairs of rows i0 .. i0+n-1 within keys [ca, cb), from the band alone. */
static int64_t block_cost(const fa_problem *s, int64_t i0, int64_t n, int64_t ca, int64_t cb)
{
    return fa_kept_pairs(s, i0, i0 + n, ca, cb);
}

static int by_cost_desc(const void *a, const void *b)
{
    const fa_task *x = a, *y = b;
    if (x->cost != y->cost) return x->cost > y->cost ? -1 : 1;
    if (x->b != y->b) return x->b < y->b ? -1 : 1;
    if (x->qb != y->qb) return x->qb < y->qb ? -1 : 1;
    if (x->h0 != y->h0) return x->h0 < y->h0 ? -1 : 1;
    return (x->split > y->split) - (x->split < y->split);
}

/* One walk over the plan: counts it, and with `out` also writes the tasks. */
static void walk(const fa_problem *p, const fa_task_rules *r, int64_t forced_splits, int64_t units_all, fa_task *out,
                 fa_task_counts *c)
{
    const int64_t br = r->br;
    c->tasks = c->units = c->slots = c->max_split = 0;
    c->max_rows = 1;
    if (p->Hq == 0) return; /* no query heads: nothing to attend */
    for (int64_t b = 0; b < p->B; b++) {
        int64_t sq, sk;
        fa_seq_lengths(p, b, &sq, &sk);
        if (sq == 0) continue;
        const int64_t qblocks = (sq + br - 1) / br, n_first = sq < br ? sq : br;
        /* Small-row path for the whole sequence when its heads stack into short
         * stacks: always when the whole group fits one stack, and up to two stacks
         * per kv head, where the wide kernels would still run mostly on padding
         * (measured: 4 query rows x group 4 as two 8-row stacks beat one 16-row
         * wide block). A task then holds several stacks (see flash_task_small). */
        const int small = r->small && n_first * p->group <= 2 * FA_SMALL_ROWS && n_first <= FA_SMALL_ROWS;
        const int64_t ng = stack_heads(p, sq, small ? FA_SMALL_ROWS : br);
        const int64_t nkv = small ? (p->Hq / ng < r->stacks_max ? p->Hq / ng : r->stacks_max) : 0;
        const int64_t step = small ? nkv * ng : ng;
        const int64_t ns = plan_splits(forced_splits, units_all, sk);
        if (ns > c->max_split) c->max_split = ns;
        fa_problem s;
        if (out) fa_seq_view(p, b, &s);
        for (int64_t qb = 0; qb < qblocks; qb++) {
            const int64_t i0 = qb * br, n = sq - i0 < br ? sq - i0 : br;
            for (int64_t h0 = 0; h0 < p->Hq; h0 += step) {
                const int64_t stacks = small ? ((p->Hq - h0) / ng < nkv ? (p->Hq - h0) / ng : nkv) : 1;
                if (n * ng * stacks > c->max_rows) c->max_rows = n * ng * stacks;
                c->units++;
                for (int64_t k = 0; k < ns; k++, c->tasks++) {
                    if (!out) continue;
                    int64_t ca, cb;
                    fa_chunk_range(sk, k, ns, &ca, &cb);
                    fa_task *t = &out[c->tasks];
                    t->b = (int32_t)b;
                    t->qb = (int32_t)qb;
                    t->h0 = (int32_t)h0;
                    t->ng = (int32_t)ng;
                    t->nkv = small ? (int32_t)stacks : 0;
                    t->split = (int32_t)k;
                    t->nsplit = (int32_t)ns;
                    t->slot = ns > 1 ? c->slots : -1;
                    t->cost = block_cost(&s, i0, n, ca, cb) * ng * stacks + 1;
                }
                if (ns > 1) c->slots += ns;
            }
        }
    }
}

void fa_tasks_count(const fa_problem *p, const fa_task_rules *rules, fa_task_counts *counts)
{
    /* units without splits first: the split rule is a function of that count */
    fa_task_counts unsplit;
    walk(p, rules, 1, 0, NULL, &unsplit);
    walk(p, rules, rules->kv_splits, unsplit.units, NULL, counts);
}

void fa_tasks_fill(const fa_problem *p, const fa_task_rules *rules, const fa_task_counts *counts, fa_task *tasks)
{
    fa_task_counts unsplit, again;
    walk(p, rules, 1, 0, NULL, &unsplit);
    walk(p, rules, rules->kv_splits, unsplit.units, tasks, &again);
    (void)counts; /* the same walk as fa_tasks_count: again equals *counts */
    qsort(tasks, (size_t)again.tasks, sizeof *tasks, by_cost_desc);
}
