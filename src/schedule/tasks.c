/*
 * tasks.c: see tasks.h. Every schedule of the tiled loops: the forward's tasks
 * (the split-KV rule and the head stacking here are the ones the header documents
 * next to fa_merge_states), the forward's steps through the waves of packed K/V,
 * and the backward's tasks, fused or two-pass. One ordering rule serves both task
 * lists (cost_then_keys).
 */
#include "tasks.h"
#include "workspace.h"
#include "arith.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

void fa_chunk_range(int64_t sk, int64_t split, int64_t nsplit, int64_t *ca, int64_t *cb)
{
    /* sk * split fits: sk <= 2^60 and split <= FA_MAX_KV_SPLITS (checks.c) */
    *ca = sk * split / nsplit;
    *cb = sk * (split + 1) / nsplit;
}

void fa_task_columns(const fa_problem *p, const fa_view *s, const fa_task *t, int64_t i0, int64_t n, int64_t *lo,
                     int64_t *hi)
{
    /* the band ends are monotone in i, so tiles outside the first row's lo and the
     * last row's hi are never touched */
    int64_t unused, ca, cb;
    fa_row_band(p, s, i0, lo, &unused);
    fa_row_band(p, s, i0 + n - 1, &unused, hi);
    fa_chunk_range(s->Sk, t->split, t->nsplit, &ca, &cb);
    if (*lo < ca) *lo = ca;
    if (*hi > cb - 1) *hi = cb - 1;
    /* a block mask's tasks walk from their first listed block to their last */
    if (p->bm.on) fa_bmask_columns(p, s, t->h0, (int64_t)t->ng * (t->nkv > 0 ? t->nkv : 1), i0, i0 + n, lo, hi);
}

void fa_key_block_rows(const fa_problem *p, const fa_view *s, int64_t j0, int64_t j1, int64_t *ilo, int64_t *ihi)
{
    /* first row whose hi reaches j0, and last row whose lo is still <= j1: two
     * binary searches over non-decreasing band ends */
    int64_t a = 0, z = s->Sq;
    while (a < z) {
        const int64_t mid = a + (z - a) / 2;
        int64_t lo, hi;
        fa_row_band(p, s, mid, &lo, &hi);
        if (hi >= j0) z = mid;
        else a = mid + 1;
    }
    *ilo = a;
    a = 0;
    z = s->Sq;
    while (a < z) {
        const int64_t mid = a + (z - a) / 2;
        int64_t lo, hi;
        fa_row_band(p, s, mid, &lo, &hi);
        if (lo <= j1) a = mid + 1;
        else z = mid;
    }
    *ihi = a - 1;
    /* a row between them may still keep nothing (lo > hi where the band is empty) */
    while (*ilo <= *ihi) {
        int64_t lo, hi;
        fa_row_band(p, s, *ilo, &lo, &hi);
        if (lo <= hi && lo <= j1 && hi >= j0) break;
        ++*ilo;
    }
    while (*ihi >= *ilo) {
        int64_t lo, hi;
        fa_row_band(p, s, *ihi, &lo, &hi);
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

/* Chunks for a sequence of sk keys when `units` unsplit tasks exist in all, each of at
 * least min_keys keys (0: SPLIT_MIN_KEYS) unless forced. */
static int64_t plan_splits(int64_t forced, int64_t units, int64_t sk, int64_t min_keys)
{
    int64_t s;
    if (forced > 0) {
        s = forced;
    } else {
        if (units >= SPLIT_TASKS_WANTED) return 1;
        s = (SPLIT_TASKS_WANTED + units - 1) / units;
        if (s > SPLIT_MAX_AUTO) s = SPLIT_MAX_AUTO;
        const int64_t keys = min_keys > 0 ? min_keys : SPLIT_MIN_KEYS;
        if (s > sk / keys) s = sk / keys;
    }
    if (s > sk) s = sk; /* every chunk holds at least one key */
    return s < 1 ? 1 : s;
}

/* The order of every task list: most expensive first, so that threads taking tasks
 * from a counter finish together; equal costs by position (keys most significant
 * first, unique within a list), so the order never depends on qsort's. */
enum { ORDER_KEYS = 4 };
static int cost_then_keys(int64_t cx, int64_t cy, const int64_t *kx, const int64_t *ky)
{
    if (cx != cy) return cx > cy ? -1 : 1;
    for (int i = 0; i < ORDER_KEYS; i++)
        if (kx[i] != ky[i]) return kx[i] < ky[i] ? -1 : 1;
    return 0;
}

static int by_cost_desc(const void *a, const void *b)
{
    const fa_task *x = a, *y = b;
    const int64_t kx[ORDER_KEYS] = {x->b, x->qb, x->h0, x->split}, ky[ORDER_KEYS] = {y->b, y->qb, y->h0, y->split};
    return cost_then_keys(x->cost, y->cost, kx, ky);
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
        const int64_t ns = plan_splits(forced_splits, units_all, sk, r->split_keys);
        if (ns > c->max_split) c->max_split = ns;
        fa_view s;
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
                    t->cost = fa_heads_kept_pairs(p, &s, h0, ng * stacks, i0, i0 + n, ca, cb) + 1;
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

int64_t fa_tasks_merges(const fa_task *tasks, int64_t n_tasks, int64_t *merges)
{
    int64_t n = 0;
    for (int64_t t = 0; t < n_tasks; t++)
        if (tasks[t].nsplit > 1 && tasks[t].split == 0) merges[n++] = t;
    return n;
}

/* ------------------------------------------------ the forward's steps */

/* Bytes of packed units a wave holds, unless the threads need more: a few MiB,
 * so that what the running tasks read stays in cache (measured on 2 threads,
 * N = 2048..4096: 3 MiB waves were up to 6% faster than 8 MiB ones, at a third
 * of the memory). A wave of chunked pieces holds one, unless the threads need more. */
enum { PACK_WAVE_BYTES = 3 << 20 };
/* The most both wave buffers may take, with many threads to feed. */
#define PACK_MEMORY_MAX FA_WORKSPACE_KEEP
/* The state slots of a chunked unit's group of readers: 2 MiB (31 tasks of 128 rows
 * of Dv = 128), so that each chunk is packed once for 31 readers; or 2 * threads. */
#define PACK_STATE_BYTES ((int64_t)2 << 20)

void fa_steps_init(fa_steps *st, const fa_task *tasks, int64_t n_tasks)
{
    memset(st, 0, sizeof *st);
    st->tasks = tasks;
    st->n_tasks = n_tasks;
    atomic_init(&st->next, 0);
}

/* The unit (b * Hk + hk) a task's packed K/V would be, or -1 when it reads none:
 * small-row tasks read each row once anyway. */
static int64_t task_unit(const fa_problem *p, const fa_task *it)
{
    if (it->nkv > 0) return -1;
    return (int64_t)it->b * p->Hk + it->h0 / p->group;
}

/* Keys per pack step: a tile's, made even in the bf16 form (whole V pairs). */
static int64_t pack_chunk(const fa_steps *st, const fa_pack_rules *r) { return r->bc + (st->pack.bf16 ? r->bc & 1 : 0); }

/* The first and the last start of a task's key tiles (*last < 0: no tiles), as the
 * forward's loop walks them: from the band's first key in steps of bc. */
static void task_tiles(const fa_problem *p, const fa_pack_rules *r, const fa_task *t, int64_t *lo, int64_t *last)
{
    fa_view s;
    fa_seq_view(p, t->b, &s);
    const int64_t i0 = (int64_t)t->qb * r->br, n = s.Sq - i0 < r->br ? s.Sq - i0 : r->br;
    int64_t hi;
    fa_task_columns(p, &s, t, i0, n, lo, &hi);
    *last = *lo <= hi ? *lo + (hi - *lo) / r->bc * r->bc : -1;
}

/* A group of readers: its chunks [*c_lo, *c_hi] (chunk 0 when no task has tiles). */
static void group_chunks(const fa_steps *st, const fa_problem *p, const fa_pack_rules *r, const int64_t *tasks,
                         int64_t n, int64_t *c_lo, int64_t *c_hi)
{
    int64_t lo_min = INT64_MAX, last_max = -1;
    for (int64_t k = 0; k < n; k++) {
        int64_t lo, last;
        task_tiles(p, r, &st->tasks[tasks[k]], &lo, &last);
        if (last < 0) continue;
        if (lo < lo_min) lo_min = lo;
        if (last > last_max) last_max = last;
    }
    *c_lo = last_max < 0 ? 0 : lo_min / st->chunk_keys;
    *c_hi = last_max < 0 ? 0 : last_max / st->chunk_keys;
}

/* The piece of chunk c of a unit of sk keys: tile starts and keys packed. */
static void chunk_piece(const fa_steps *st, int64_t sk, int64_t c, fa_piece *pc)
{
    pc->c0 = c * st->chunk_keys;
    pc->c1 = sk - pc->c0 < st->chunk_keys ? sk : pc->c0 + st->chunk_keys;
    pc->k1 = sk - pc->c1 < st->pc ? sk : pc->c1 + st->pc; /* a tile from c1 - 1 ends before c1 + bc - 1 */
    pc->packs = (pc->k1 - pc->c0 + st->pc - 1) / st->pc;
}

/* The groups of a chunked unit's n readers: as few as hold at most `group` each, of
 * sizes within one of each other (group k: readers n * k / g .. n * (k + 1) / g - 1),
 * so that no small group packs the unit once more for a few readers. */
static int64_t groups_of(const fa_steps *st, int64_t n) { return (n + st->group - 1) / st->group; }

/* Whether a packed unit of sk keys is cut into chunks (it exceeds a slot). */
static int chunked(const fa_steps *st, int64_t sk) { return st->chunk_keys > 0 && sk > st->chunk_keys + st->pc; }

/* The keys of a chunk when units over unit_max are cut (a slot holds them and a pack
 * step more), 0 when the form has no size for them. */
static int64_t chunk_keys_of(const fa_steps *st, const fa_problem *p, const fa_pack_rules *rules)
{
    const int64_t unit_max = rules->unit_max > 0 ? rules->unit_max : FA_PACK_UNIT_MAX;
    fa_kv_packing step;
    if (!fa_kv_packing_plan(rules->form, st->pc, p->D, p->Dv, p->v_in_k, &step) || step.unit_bytes == 0) return 0;
    const int64_t steps = unit_max / 2 / step.unit_bytes - 1;
    return (steps > 1 ? steps : 1) * st->pc;
}

/* A ranged unit's piece: the keys its run of readers reads, tile starts lo .. last
 * (last < 0: no tiles), from a pack step's multiple; *fits is whether a slot of
 * slot_keys holds them. */
static void range_piece(const fa_steps *st, int64_t sk, int64_t lo, int64_t last, int64_t slot_keys, fa_piece *pc,
                        int *fits)
{
    pc->c0 = last < 0 ? 0 : lo / st->pc * st->pc;
    pc->c1 = last < 0 ? pc->c0 : last + 1;
    /* whole pack steps to the end of the tile from last (bc <= pc keys) */
    const int64_t k1 = pc->c0 + (last + 2 * st->pc - 1 - pc->c0) / st->pc * st->pc;
    pc->k1 = last < 0 ? pc->c0 : k1 < sk ? k1 : sk;
    pc->packs = (pc->k1 - pc->c0 + st->pc - 1) / st->pc;
    *fits = pc->k1 - pc->c0 <= slot_keys;
}

/* Whether a ranged unit's run of readers (tile starts *lo .. *last) takes a reader
 * whose tiles start at lo .. last: it does when a slot still holds the run's keys;
 * else the run is a piece and the reader begins the next. */
static int range_takes(const fa_steps *st, int64_t sk, int64_t slot_keys, int64_t *rlo, int64_t *rlast, int64_t lo,
                       int64_t last)
{
    int64_t nlo = *rlo, nlast = *rlast;
    if (last >= 0) {
        if (nlast < 0 || lo < nlo) nlo = lo;
        if (last > nlast) nlast = last;
    }
    fa_piece pc;
    int fits;
    range_piece(st, sk, nlo, nlast, slot_keys, &pc, &fits);
    if (!fits) return 0;
    *rlo = nlo, *rlast = nlast;
    return 1;
}

/* The packing's workspace as one table (fa_ws_layout): the wave buffers (one when
 * there is one wave), the pieces, the tasks' order, the state slots, the per-wave and
 * per-group totals and counters, and three per-unit arrays for the fill. */
typedef struct {
    int64_t *unit_of_order, *unit_first, *cursor;
} fill_scratch;

static int64_t steps_layout(fa_steps *st, fill_scratch *fs, char *base)
{
    const int64_t bufs = st->waves > 1 ? 2 : 1, slots = st->chunk_keys > 0 ? st->group : 0;
    fill_scratch unused;
    if (!fs) fs = &unused;
    const fa_ws_part parts[] = {
        {(void **)&st->buf[0], fa_bytes3(st->wave_units, st->pack.unit_bytes, 1)},
        {(void **)&st->buf[1], bufs > 1 ? fa_bytes3(st->wave_units, st->pack.unit_bytes, 1) : 0},
        {(void **)&st->pieces, fa_bytes3(st->n_pieces, (int64_t)sizeof(fa_piece), 1)},
        {(void **)&st->order, fa_bytes3(st->n_tasks, 8, 1)},
        {(void **)&st->state, fa_bytes3(slots, st->state_bytes, 1)},
        {(void **)&st->wave_start, fa_bytes3(st->waves + 1, 8, 1)},
        {(void **)&st->wave_packs, fa_bytes3(st->waves, 8, 1)},
        {(void **)&st->packs_done, fa_bytes3(st->waves, (int64_t)sizeof(atomic_llong), 1)},
        {(void **)&st->tasks_done, fa_bytes3(st->waves, (int64_t)sizeof(atomic_llong), 1)},
        {(void **)&st->group_steps, fa_bytes3(st->groups, 8, 1)},
        {(void **)&st->group_done, fa_bytes3(st->groups, (int64_t)sizeof(atomic_llong), 1)},
        {(void **)&st->slot_done, fa_bytes3(slots, (int64_t)sizeof(atomic_llong), 1)},
        {(void **)&fs->unit_of_order, fa_bytes3(st->packed, 8, 1)},
        {(void **)&fs->unit_first, fa_bytes3(st->packed, 8, 1)},
        {(void **)&fs->cursor, fa_bytes3(st->packed, 8, 1)},
    };
    return fa_ws_layout(parts, sizeof parts / sizeof parts[0], base);
}

/* Closes unit u's open group (gn[u] readers, tile starts glo[u] .. ghi[u]) in the
 * plan's counts; *task_steps grows by its task steps. */
static void close_group(fa_steps *st, int64_t sk, int64_t *gn, const int64_t *glo, const int64_t *ghi,
                        int64_t *task_steps)
{
    const int64_t c_lo = *ghi < 0 ? 0 : *glo / st->chunk_keys, c_hi = *ghi < 0 ? 0 : *ghi / st->chunk_keys;
    for (int64_t c = c_lo; c <= c_hi; c++) {
        fa_piece pc;
        chunk_piece(st, sk, c, &pc);
        st->pack_steps += pc.packs;
    }
    st->n_pieces += c_hi - c_lo + 1;
    *task_steps += *gn * (c_hi - c_lo + 1);
    st->groups++;
    *gn = 0;
}

/* Closes a ranged unit's run (tile starts *lo .. *last) in the plan's counts. */
static void close_range(fa_steps *st, int64_t sk, const int64_t *lo, const int64_t *last)
{
    fa_piece pc;
    int fits;
    range_piece(st, sk, *lo, *last, st->chunk_keys + st->pc, &pc, &fits);
    st->pack_steps += pc.packs;
    st->n_pieces++;
}

/*
 * Which units to pack, from the tasks: those enough tasks read; then their pieces.
 * On return units[u] >= 0 counts the readers of an unpacked unit and -2 - order
 * marks a packed one, order being where the tasks (most expensive first) first
 * reach it; units[nu ..] is scratch.
 */
/* The readers of each unit (units[u], and a copy in total[u]). Under a block mask a
 * task reads only its kept blocks' keys, so what decides the packing (units[u]) is
 * how often a packed key is read: the unit's keys read by its tasks (a task's kept
 * pairs per head and row, from its cost) over the keys packed, rounded up. A unit
 * packed in chunks whose tasks read less than a quarter of it each (documents) is
 * ranged (ranged[u] = 1) when each task's tiles fit a slot: its readers, in the
 * tasks' order, go in runs whose keys a slot holds, each run one piece of its keys,
 * each reader one step (so a document's keys are packed once for its tasks, and no
 * task straddles chunks, taking a step and its Q packed again per chunk). Else such
 * a unit is read in place: scattered blocks span the unit, and a key's few readers
 * find it in cache. rs: 3 * units scratch. */
static void count_readers(fa_steps *st, const fa_problem *p, const fa_pack_rules *rules, int64_t *units,
                          int64_t *total, int64_t *ranged, int64_t *rs)
{
    const int64_t nu = p->B * p->Hk;
    int64_t *rlo = rs, *rlast = rs + nu, *packed_keys = rs + 2 * nu;
    memset(units, 0, (size_t)nu * sizeof *units);
    memset(total, 0, (size_t)nu * sizeof *total);
    memset(ranged, 0, (size_t)nu * sizeof *ranged);
    for (int64_t t = 0; t < st->n_tasks; t++) {
        const fa_task *it = &st->tasks[t];
        const int64_t u = task_unit(p, it);
        if (u < 0) continue;
        total[u]++;
        if (!p->bm.on) continue;
        int64_t sq, sk;
        fa_seq_lengths(p, it->b, &sq, &sk);
        const int64_t i0 = (int64_t)it->qb * rules->br, n = sq - i0 < rules->br ? sq - i0 : rules->br;
        if (n > 0 && it->ng > 0) units[u] += (it->cost - 1) / ((int64_t)it->ng * n);
    }
    if (!p->bm.on) {
        memcpy(units, total, (size_t)nu * sizeof *units);
        return;
    }
    const int64_t unit_max = rules->unit_max > 0 ? rules->unit_max : FA_PACK_UNIT_MAX;
    const int64_t slot_keys = chunk_keys_of(st, p, rules) + st->pc;
    for (int64_t u = 0; u < nu; u++) {
        int64_t sq, sk;
        fa_seq_lengths(p, u / p->Hk, &sq, &sk);
        fa_kv_packing whole;
        const int64_t per_task = total[u] > 0 ? units[u] / total[u] : 0;
        ranged[u] = per_task < sk / 4 && fa_kv_packing_plan(rules->form, sk, p->D, p->Dv, p->v_in_k, &whole) &&
                    whole.unit_bytes > unit_max && slot_keys > st->pc;
        rlo[u] = 0, rlast[u] = -1, packed_keys[u] = 0;
    }
    /* the ranged units' runs, as count_steps and fa_steps_fill make them */
    for (int64_t t = 0; t < st->n_tasks; t++) {
        const int64_t u = task_unit(p, &st->tasks[t]);
        if (u < 0 || ranged[u] != 1) continue;
        int64_t sq, sk, lo, last;
        fa_seq_lengths(p, u / p->Hk, &sq, &sk);
        task_tiles(p, rules, &st->tasks[t], &lo, &last);
        fa_piece pc;
        int fits;
        range_piece(st, sk, lo, last, slot_keys, &pc, &fits);
        if (!fits) {
            ranged[u] = -1; /* a task's own tiles span more than a slot: in place */
            continue;
        }
        if (range_takes(st, sk, slot_keys, &rlo[u], &rlast[u], lo, last)) continue;
        range_piece(st, sk, rlo[u], rlast[u], slot_keys, &pc, &fits);
        packed_keys[u] += pc.k1 - pc.c0;
        rlo[u] = lo, rlast[u] = last;
    }
    for (int64_t u = 0; u < nu; u++) {
        int64_t sq, sk;
        fa_seq_lengths(p, u / p->Hk, &sq, &sk);
        int64_t keys = ranged[u] < 0 ? 0 : sk;
        if (ranged[u] > 0) {
            fa_piece pc;
            int fits;
            range_piece(st, sk, rlo[u], rlast[u], slot_keys, &pc, &fits);
            keys = packed_keys[u] + pc.k1 - pc.c0;
        }
        if (ranged[u] < 0) ranged[u] = 0;
        units[u] = keys == 0 ? 0 : (units[u] + keys - 1) / keys;
    }
}

/* Marks the units worth packing (units[u] = -2 - order, in the tasks' order) and
 * counts the tasks that read in place; returns the longest packed unit's keys. */
static int64_t choose_packed(fa_steps *st, const fa_problem *p, const fa_pack_rules *rules, int64_t *units)
{
    /* Below this many reading tasks a copy costs more than it saves: the packed rows
     * come back from L3, while a unit's few in-place readers find them in L2 (measured,
     * 2 threads, H = 32, D = 128, 128-row query blocks: f16 lost 5% at 3 readers and
     * won 7% at 4; bf16 pairs lost 2% at 4 and won 11% at 6). Forced packing takes
     * any shared unit. */
    /* (the split form of f32 as bf16 products, FA_PARAM_F32_MATMUL, is worth it at 2:
     * each reader would split every tile again) */
    /* (and so is the K^T form of the fused forward: each reader would transpose K again) */
    /* (a block mask's count is of reads per key (count_readers), fewer than its tasks:
     * a causal staircase's bf16 pairs win at a mean of 5; the fused forward's K^T form
     * loses at a mean under 2, counted 2: its readers transpose a tile they then find
     * in L1, while a packed tile of scattered blocks comes back from L3) */
    const int kt_bm = p->bm.on && rules->form == FA_KV_FORM_KT;
    const int64_t min_readers = rules->mode == 2 || (rules->form >= FA_KV_FORM_SPLIT(1) && !kt_bm) ? 2
                                : rules->form                                                   ? (p->bm.on ? 3 : 6)
                                                                                                 : 4;
    int64_t sk_max = 0;
    for (int64_t t = 0; t < st->n_tasks; t++) {
        const int64_t u = task_unit(p, &st->tasks[t]);
        if (u < 0 || (units[u] >= 0 && units[u] < min_readers)) {
            st->unpacked++;
            continue;
        }
        if (units[u] <= -2) continue; /* a later reader of a unit already placed */
        int64_t sq, sk;
        fa_seq_lengths(p, st->tasks[t].b, &sq, &sk);
        if (sk > sk_max) sk_max = sk;
        units[u] = -2 - st->packed++;
    }
    return sk_max;
}

/* The slots' size (st->pack, st->chunk_keys) and the readers' groups; 0 when packing
 * is off after all (no keys, or too many). */
static int plan_slots(fa_steps *st, const fa_problem *p, const fa_pack_rules *rules, int64_t sk_max)
{
    /* a unit over unit_max is cut into chunks of about half of it, each slot holding a
     * chunk and a pack step's keys more */
    const int64_t unit_max = rules->unit_max > 0 ? rules->unit_max : FA_PACK_UNIT_MAX;
    int64_t slot_keys = sk_max;
    if (!fa_kv_packing_plan(rules->form, sk_max, p->D, p->Dv, p->v_in_k, &st->pack)) return 0;
    if (st->pack.unit_bytes > unit_max) {
        st->chunk_keys = chunk_keys_of(st, p, rules);
        if (st->chunk_keys == 0) return 0;
        if (st->chunk_keys + st->pc < slot_keys) slot_keys = st->chunk_keys + st->pc;
        else st->chunk_keys = 0; /* a slot holds the longest unit after all */
    }
    if (!fa_kv_packing_plan(rules->form, slot_keys, p->D, p->Dv, p->v_in_k, &st->pack) || st->pack.unit_bytes == 0 ||
        st->pack.unit_bytes > PACK_MEMORY_MAX / 2) {
        /* no keys, or too many (even beyond int64): read in place; units[] is unread without fa_steps_fill */
        return 0;
    }
    /* a chunked unit's readers go in groups whose online softmax states fit the state
     * slots, and are enough to keep the threads busy */
    st->state_bytes = rules->state_bytes > 0 ? rules->state_bytes : 1;
    st->group = PACK_STATE_BYTES / st->state_bytes;
    if (st->group < 2 * (int64_t)rules->threads) st->group = 2 * (int64_t)rules->threads;
    if (st->group < 1) st->group = 1;
    return 1;
}

/* The pieces, their pack steps and the task steps of the packed units (a chunked
 * unit's groups in the tasks' order); returns the task steps. */
static int64_t count_steps(fa_steps *st, const fa_problem *p, const fa_pack_rules *rules, const int64_t *units,
                           const int64_t *ranged, int64_t *scratch)
{
    const int64_t nu = p->B * p->Hk;
    int64_t *gn = scratch, *glo = scratch + nu, *ghi = scratch + 2 * nu, *total = scratch + 3 * nu,
            *seen = scratch + 4 * nu;
    int64_t task_steps = 0;
    for (int64_t u = 0; u < nu; u++) gn[u] = seen[u] = 0;
    for (int64_t t = 0; t < st->n_tasks; t++) {
        const int64_t u = task_unit(p, &st->tasks[t]);
        if (u < 0 || units[u] > -2) continue;
        int64_t sq, sk;
        fa_seq_lengths(p, u / p->Hk, &sq, &sk);
        if (!chunked(st, sk)) continue;
        int64_t lo, last;
        task_tiles(p, rules, &st->tasks[t], &lo, &last);
        if (ranged[u]) { /* its runs: a piece each, a step per reader */
            if (gn[u] == 0) glo[u] = 0, ghi[u] = -1;
            if (!range_takes(st, sk, st->chunk_keys + st->pc, &glo[u], &ghi[u], lo, last)) {
                close_range(st, sk, &glo[u], &ghi[u]);
                glo[u] = 0, ghi[u] = -1; /* an empty run takes any reader of a ranged unit */
                range_takes(st, sk, st->chunk_keys + st->pc, &glo[u], &ghi[u], lo, last);
            }
            gn[u]++;
            task_steps++;
            continue;
        }
        if (gn[u] == 0) glo[u] = INT64_MAX, ghi[u] = -1;
        if (last >= 0 && lo < glo[u]) glo[u] = lo;
        if (last > ghi[u]) ghi[u] = last;
        gn[u]++;
        /* the group ends where the next begins: reader seen = n * (k + 1) / g */
        const int64_t n = total[u], g = groups_of(st, n), r = ++seen[u], k = (r * g + n - 1) / n;
        if (n * k / g == r) close_group(st, sk, &gn[u], &glo[u], &ghi[u], &task_steps);
    }
    for (int64_t u = 0; u < nu; u++) {
        if (units[u] > -2) continue;
        int64_t sq, sk;
        fa_seq_lengths(p, u / p->Hk, &sq, &sk);
        if (chunked(st, sk) && ranged[u]) {
            if (gn[u] > 0) close_range(st, sk, &glo[u], &ghi[u]);
        } else if (chunked(st, sk)) {
            if (gn[u] > 0) close_group(st, sk, &gn[u], &glo[u], &ghi[u], &task_steps);
        } else {
            st->n_pieces++;
            st->pack_steps += (sk + st->pc - 1) / st->pc;
        }
    }
    /* whole units: every reader once */
    for (int64_t t = 0; t < st->n_tasks; t++) {
        const int64_t u = task_unit(p, &st->tasks[t]);
        if (u < 0 || units[u] > -2) continue;
        int64_t sq, sk;
        fa_seq_lengths(p, u / p->Hk, &sq, &sk);
        if (!chunked(st, sk)) task_steps++;
    }
    return task_steps;
}

/* How many units a wave packs: two waves are in flight at most, so each needs tasks
 * for every thread, twice over: pieces enough for 2 * threads task steps at the mean
 * readers of a piece. */
static void plan_waves(fa_steps *st, const fa_pack_rules *rules, int64_t task_steps)
{
    st->wave_units = st->chunk_keys == 0 && st->pack.unit_bytes < PACK_WAVE_BYTES ? PACK_WAVE_BYTES / st->pack.unit_bytes : 1;
    const int64_t for_threads = (2 * rules->threads * st->n_pieces + task_steps - 1) / task_steps;
    if (st->wave_units < for_threads) st->wave_units = for_threads;
    if (st->wave_units > st->n_pieces) st->wave_units = st->n_pieces;
    if (st->wave_units > PACK_MEMORY_MAX / 2 / st->pack.unit_bytes)
        st->wave_units = PACK_MEMORY_MAX / 2 / st->pack.unit_bytes;
    st->waves = (st->n_pieces + st->wave_units - 1) / st->wave_units;
}

int64_t fa_steps_plan(fa_steps *st, const fa_problem *p, const fa_pack_rules *rules, int64_t *units)
{
    const int64_t nu = p->B * p->Hk;
    st->packed = st->unpacked = st->waves = st->pack_steps = st->n_pieces = st->groups = 0;
    st->chunk_keys = 0;
    st->hk_count = p->Hk;
    st->pack.bf16 = rules->form;
    st->pc = pack_chunk(st, rules);
    /* units[nu ..]: the ranged units, then the scratch of count_steps (gn, glo, ghi,
     * total, seen) */
    count_readers(st, p, rules, units, units + 5 * nu, units + nu, units + 2 * nu);
    const int64_t sk_max = choose_packed(st, p, rules, units);
    if (st->packed == 0) return 0;
    if (!plan_slots(st, p, rules, sk_max)) return st->packed = 0;
    const int64_t task_steps = count_steps(st, p, rules, units, units + nu, units + 2 * nu);
    plan_waves(st, rules, task_steps);
    st->n_steps = st->unpacked + st->pack_steps + task_steps;
    return steps_layout(st, NULL, NULL);
}

/* Writes the tasks' order, the pieces and the waves' bounds in the order tasks.h
 * states (why no step waits forever: see there). */
void fa_steps_fill(fa_steps *st, const fa_problem *p, const fa_pack_rules *rules, const int64_t *units, char *ws)
{
    fill_scratch fs;
    const int64_t wu = st->wave_units;
    steps_layout(st, &fs, ws);
    for (int64_t w = 0; w < st->waves; w++) {
        atomic_init(&st->packs_done[w], 0);
        atomic_init(&st->tasks_done[w], 0);
    }
    for (int64_t g = 0; g < st->groups; g++) atomic_init(&st->group_done[g], 0);
    for (int64_t k = 0; st->chunk_keys > 0 && k < st->group; k++) atomic_init(&st->slot_done[k], 0);
    /* the order: unpacked tasks, then each packed unit's readers, units in packing order */
    for (int64_t o = 0; o < st->packed; o++) fs.unit_first[o] = 0;
    for (int64_t u = 0; u < p->B * p->Hk; u++)
        if (units[u] <= -2) fs.unit_of_order[-2 - units[u]] = u;
    int64_t upos = 0;
    for (int64_t t = 0; t < st->n_tasks; t++) {
        const int64_t u = task_unit(p, &st->tasks[t]);
        if (u >= 0 && units[u] <= -2) fs.unit_first[-2 - units[u]]++;
        else st->order[upos++] = t;
    }
    for (int64_t o = 0, pos = st->unpacked; o < st->packed; o++) {
        const int64_t n = fs.unit_first[o];
        fs.unit_first[o] = fs.cursor[o] = pos;
        pos += n;
    }
    for (int64_t t = 0; t < st->n_tasks; t++) {
        const int64_t u = task_unit(p, &st->tasks[t]);
        if (u >= 0 && units[u] <= -2) st->order[fs.cursor[-2 - units[u]]++] = t;
    }
    /* the pieces: a whole unit, or per group of readers its chunks */
    int64_t i = 0, g = 0;
    for (int64_t o = 0; o < st->packed; o++) {
        const int64_t u = fs.unit_of_order[o], first = fs.unit_first[o], n = fs.cursor[o] - first;
        int64_t sq, sk;
        fa_seq_lengths(p, u / p->Hk, &sq, &sk);
        if (!chunked(st, sk)) {
            st->pieces[i++] = (fa_piece){.unit = u, .c0 = 0, .c1 = sk, .k1 = sk, .first = first, .n = n,
                                         .group = -1, .packs = (sk + st->pc - 1) / st->pc, .begin = 1, .end = 1};
            continue;
        }
        if (units[p->B * p->Hk + u]) { /* ranged: a piece per run of its readers */
            const int64_t slot_keys = st->chunk_keys + st->pc;
            int64_t lo0 = 0, last0 = -1, k0 = 0;
            for (int64_t k = 0; k <= n; k++) {
                int64_t lo = 0, last = -1;
                if (k < n) task_tiles(p, rules, &st->tasks[st->order[first + k]], &lo, &last);
                if (k < n && range_takes(st, sk, slot_keys, &lo0, &last0, lo, last)) continue; /* an empty run takes any */
                fa_piece *pc = &st->pieces[i++];
                int fits;
                *pc = (fa_piece){.unit = u, .first = first + k0, .n = k - k0, .group = -1, .begin = 1, .end = 1};
                range_piece(st, sk, lo0, last0, slot_keys, pc, &fits);
                lo0 = 0, last0 = -1, k0 = k;
                range_takes(st, sk, slot_keys, &lo0, &last0, lo, last);
            }
            continue;
        }
        for (int64_t k = 0, ng = groups_of(st, n); k < ng; k++, g++) {
            const int64_t g0 = n * k / ng, gk = n * (k + 1) / ng - g0;
            int64_t c_lo, c_hi;
            group_chunks(st, p, rules, st->order + first + g0, gk, &c_lo, &c_hi);
            for (int64_t c = c_lo; c <= c_hi; c++, i++) {
                fa_piece *pc = &st->pieces[i];
                *pc = (fa_piece){.unit = u, .first = first + g0, .n = gk, .group = g, .begin = c == c_lo,
                                 .end = c == c_hi};
                chunk_piece(st, sk, c, pc);
            }
            st->group_steps[g] = gk * (c_hi - c_lo + 1);
        }
    }
    /* the waves: wu pieces each, packs first */
    int64_t pos = st->unpacked;
    for (int64_t w = 0; w < st->waves; w++) {
        int64_t packs = 0, tasks = 0;
        for (int64_t k = w * wu; k < st->n_pieces && k < (w + 1) * wu; k++) {
            st->pieces[k].wave = (int32_t)w;
            st->pieces[k].slot = (int32_t)(k - w * wu);
            packs += st->pieces[k].packs;
            tasks += st->pieces[k].n;
        }
        st->wave_start[w] = pos;
        st->wave_packs[w] = packs;
        pos += packs + tasks;
    }
    st->wave_start[st->waves] = pos; /* == st->n_steps */
}

void fa_steps_at(const fa_steps *st, int64_t t, fa_step *step)
{
    /* a task on the caller's K/V: all its tiles in one step */
    *step = (fa_step){.task = t, .wave = -1, .slot = -1, .cols = INT64_MAX, .state = -1, .begin = 1, .end = 1,
                      .piece = -1};
    if (!st->pieces) return;
    if (t < st->unpacked) {
        step->task = st->order[t];
        return;
    }
    int64_t a = 0, z = st->waves - 1; /* the last wave starting at or before t */
    while (a < z) {
        const int64_t mid = a + (z - a + 1) / 2;
        if (st->wave_start[mid] <= t) a = mid;
        else z = mid - 1;
    }
    int64_t off = t - st->wave_start[a], i = a * st->wave_units;
    const fa_piece *pc;
    if (off < st->wave_packs[a]) {
        while (off >= st->pieces[i].packs) off -= st->pieces[i++].packs;
        pc = &st->pieces[i];
        step->task = -1;
        step->j0 = pc->c0 + off * st->pc;
        step->cols = pc->k1 - step->j0 < st->pc ? pc->k1 - step->j0 : st->pc;
    } else {
        off -= st->wave_packs[a];
        while (off >= st->pieces[i].n) off -= st->pieces[i++].n;
        pc = &st->pieces[i];
        step->task = st->order[pc->first + off];
        step->j0 = pc->c0;
        step->cols = pc->c1 - pc->c0;
        step->state = pc->group >= 0 ? (int32_t)off : -1;
        step->begin = pc->begin;
        step->end = pc->end;
    }
    step->wave = pc->wave;
    step->slot = pc->slot;
    step->b = (int32_t)(pc->unit / st->hk_count);
    step->hk = (int32_t)(pc->unit % st->hk_count);
    step->key0 = pc->c0;
    step->piece = i;
}

/* The task steps of wave w in all. */
static int64_t wave_tasks(const fa_steps *st, int64_t w)
{
    return st->wave_start[w + 1] - st->wave_start[w] - st->wave_packs[w];
}

int fa_steps_ready(fa_steps *st, const fa_step *step)
{
    const int64_t w = step->wave;
    if (w < 0) return 1;
    if (step->task < 0)
        return w < 2 || atomic_load_explicit(&st->tasks_done[w - 2], memory_order_acquire) >= wave_tasks(st, w - 2);
    if (atomic_load_explicit(&st->packs_done[w], memory_order_acquire) < st->wave_packs[w]) return 0;
    if (step->state < 0) return 1;
    if (!step->begin) /* its task's previous step, on the piece before */
        return atomic_load_explicit(&st->slot_done[step->state], memory_order_acquire) >= step->piece;
    const int64_t g = st->pieces[step->piece].group; /* the group before, all of it */
    return g == 0 || atomic_load_explicit(&st->group_done[g - 1], memory_order_acquire) >= st->group_steps[g - 1];
}

int fa_steps_take(fa_steps *st, fa_step *step)
{
    const int64_t t = atomic_fetch_add(&st->next, 1);
    if (t >= (st->pieces ? st->n_steps : st->n_tasks)) return 0;
    fa_steps_at(st, t, step);
    /* a short spin, then yielding, which an oversubscribed machine needs (the awaited
     * step may be on a descheduled thread) */
    for (int spins = 0; !fa_steps_ready(st, step); spins++)
        if (spins >= 64) sched_yield();
    return 1;
}

void fa_steps_done(fa_steps *st, const fa_step *step)
{
    if (step->wave < 0) return;
    if (step->task < 0) {
        atomic_fetch_add_explicit(&st->packs_done[step->wave], 1, memory_order_release);
        return;
    }
    if (step->state >= 0) {
        atomic_store_explicit(&st->slot_done[step->state], step->piece + 1, memory_order_release);
        atomic_fetch_add_explicit(&st->group_done[st->pieces[step->piece].group], 1, memory_order_release);
    }
    atomic_fetch_add_explicit(&st->tasks_done[step->wave], 1, memory_order_release);
}

/* ------------------------------------------------ the backward's tasks */

/* Sequence b's kept (i, j) pairs, for rows [i0, i1) and keys [j0, j1): exact for the
 * whole sequence, about right for a block (the band's mean width at its two ends). */
static int64_t kept_pairs(const fa_problem *p, const fa_view *s, int64_t i0, int64_t i1, int64_t j0, int64_t j1,
                          int exact)
{
    int64_t cost = 0;
    if (exact) return fa_kept_pairs(p, s, i0, i1, j0, j1);
    for (int e = 0; e < 2; e++) {
        int64_t lo, hi;
        fa_row_band(p, s, e ? i1 - 1 : i0, &lo, &hi);
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

/* A fused task's cost: the kept pairs of the (sequence, kv head)'s group of heads. */
static int64_t fused_cost(const fa_problem *p, const fa_view *s, int64_t hk)
{
    if (!p->bm.on) return kept_pairs(p, s, 0, s->Sq, 0, s->Sk, 1) * p->group + 1;
    return fa_heads_kept_pairs(p, s, hk * p->group, p->group, 0, s->Sq, 0, s->Sk) + 1;
}

int fa_bwd_tasks_count(const fa_problem *p, const fa_bwd_rules *r, fa_bwd_counts *c)
{
    /* The fused schedule's tasks: (sequence, kv head); only sequences with both rows
     * and keys have work, but every (b, hk) is a task so that the empty ones write
     * their zeros. The two-pass schedule's: every key tile and every query block,
     * empty ones included for the same reason. */
    int64_t n_fused, n_split = 0, tiles = 0, blocks = 0;
    double total = 0.0, max_cost = 0.0, min_cost = -1.0;
    memset(c, 0, sizeof *c);
    if (!fa_mul_ok(p->B, p->Hk, &n_fused)) return 0;
    for (int64_t b = 0; b < p->B; b++) {
        fa_view s;
        fa_seq_view(p, b, &s);
        if (s.Sq > c->sq_max) c->sq_max = s.Sq;
        tiles += (s.Sk + r->bc - 1) / r->bc, blocks += (s.Sq + r->br - 1) / r->br; /* <= the packed lengths */
        for (int64_t hk = 0; hk < p->Hk; hk++) { /* alike but under a block mask of its own per head */
            const double cost = (double)fused_cost(p, &s, hk);
            total += cost;
            if (cost > max_cost) max_cost = cost;
            if (min_cost < 0.0 || cost < min_cost) min_cost = cost;
            if (!p->bm.on) {
                total += cost * (double)(p->Hk - 1);
                break;
            }
        }
    }
    int64_t n1 = 0, n2 = 0;
    c->two_pass = r->two_pass_ok && two_pass_pays(r->threads, n_fused, total, max_cost, min_cost, r->kv, r->dq) &&
                  fa_mul_ok(r->kv ? tiles : 0, p->Hk, &n1) && fa_mul_ok(r->dq ? blocks : 0, p->Hq, &n2) &&
                  fa_add_ok(n1, n2, &n_split);
    c->tasks = c->two_pass ? n_split : n_fused;
    return 1;
}

/* The two-pass tasks (key tiles, then query blocks, per sequence); returns how many. */
static int64_t fill_two_pass(const fa_problem *p, const fa_bwd_rules *r, fa_bwd_task *tasks)
{
    int64_t t = 0;
    for (int64_t b = 0; b < p->B; b++) {
        fa_view s;
        fa_seq_view(p, b, &s);
        if (r->kv)
            for (int64_t j0 = 0; j0 < s.Sk; j0 += r->bc) {
                const int64_t j1 = s.Sk - j0 < r->bc ? s.Sk : j0 + r->bc;
                int64_t ilo, ihi;
                fa_key_block_rows(p, &s, j0, j1 - 1, &ilo, &ihi);
                const int64_t c = ilo <= ihi ? kept_pairs(p, &s, ilo, ihi + 1, j0, j1, 0) * p->group : 0;
                for (int64_t hk = 0; hk < p->Hk; hk++) {
                    const int64_t ch = p->bm.on && ilo <= ihi
                                           ? fa_heads_kept_pairs(p, &s, hk * p->group, p->group, ilo, ihi + 1, j0, j1)
                                           : c;
                    tasks[t++] = (fa_bwd_task){(int32_t)b, (int32_t)hk, FA_BWD_KEY_TILE, j0, 4 * ch + 1};
                }
            }
        if (r->dq)
            for (int64_t i0 = 0; i0 < s.Sq; i0 += r->br) {
                const int64_t i1 = s.Sq - i0 < r->br ? s.Sq : i0 + r->br;
                const int64_t c = s.Sk > 0 ? kept_pairs(p, &s, i0, i1, 0, s.Sk, 0) : 0;
                for (int64_t h = 0; h < p->Hq; h++) {
                    const int64_t ch = p->bm.on && s.Sk > 0 ? fa_heads_kept_pairs(p, &s, h, 1, i0, i1, 0, s.Sk) : c;
                    tasks[t++] = (fa_bwd_task){(int32_t)b, (int32_t)h, FA_BWD_QUERY_BLOCK, i0, 3 * ch + 1};
                }
            }
    }
    return t;
}

static int bwd_by_cost_desc(const void *a, const void *b)
{
    const fa_bwd_task *x = a, *y = b;
    const int64_t kx[ORDER_KEYS] = {x->kind, x->b, x->head, x->start}, ky[ORDER_KEYS] = {y->kind, y->b, y->head, y->start};
    return cost_then_keys(x->cost, y->cost, kx, ky);
}

void fa_bwd_tasks_fill(const fa_problem *p, const fa_bwd_rules *r, const fa_bwd_counts *c, fa_bwd_task *tasks)
{
    int64_t n = 0;
    if (c->two_pass) {
        n = fill_two_pass(p, r, tasks);
    } else {
        for (int64_t b = 0; b < p->B; b++) {
            fa_view s;
            fa_seq_view(p, b, &s);
            for (int64_t hk = 0; hk < p->Hk; hk++, n++)
                tasks[n] = (fa_bwd_task){(int32_t)b, (int32_t)hk, FA_BWD_FUSED, 0, fused_cost(p, &s, hk)};
        }
    }
    /* n equals c->tasks: the same walks as fa_bwd_tasks_count's */
    qsort(tasks, (size_t)n, sizeof *tasks, bwd_by_cost_desc);
}
