/*
 * test_planner.c: the task planner (src/schedule/tasks.c) against brute force.
 *
 *  - fa_key_block_rows (which query rows see a key block: the question a
 *    key-outer backward loop asks) and fa_task_columns (which keys a row block
 *    sees) equal a scan of fa_row_band over every row, for random lengths,
 *    causal alignments, windows and position offsets;
 *  - a plan covers every (sequence, query row, head, key) of the problem exactly
 *    once across its tasks and key chunks, with and without split-KV, on the wide
 *    and on the small-row path;
 *  - the forward's steps with packed K/V (fa_steps_*): every task runs all its tiles
 *    once, in order, also where long units go in key chunks (a small unit_max) and a
 *    task in several steps; every unit enough tasks read is packed, each task step
 *    reads keys packed in its slot, each wait points to earlier steps, the
 *    order is the one tasks.h documents, and one thread taking the steps in order
 *    gets them all without waiting on anything undone;
 *  - the backward's tasks (fa_bwd_tasks_*): the fused schedule has one task per
 *    (sequence, kv head), the two-pass one every key tile and query block once, both
 *    ordered most expensive first;
 *  - the tile plan (fa_plan_from) of the fused forward: keys that fit one tile take
 *    one, causal or not, with query blocks as tall as leave 16 tasks; longer keys and
 *    windows plan as a trimmed loop does; tuned and set tiles still win;
 *  - the tile plan under a block mask (fa_bmask_plan_tiles): a causal staircase of
 *    blocks (diagonal blocks partial, each row one run) takes tiles of several blocks
 *    where the loop trims them (fused, trimmed) and the blocks themselves where it does
 *    not (plain), as does a staircase whose diagonal rows are not runs or scattered
 *    blocks; a mask of every block takes whole tiles on every loop.
 * Internal functions: this program links the library's objects and sees src/.
 */
#include "harness.h"
#include "problem.h"
#include "workspace.h"
#include "arith.h"
#include "tasks.h"
#include "plan.h"

#include <stdlib.h>
#include <string.h>

static void random_band(h_rng *r, fa_problem *p)
{
    memset(p, 0, sizeof *p);
    p->B = 1;
    p->Sq = h_rng_int(r, 1, 70);
    p->Sk = h_rng_int(r, 1, 70);
    p->causal = (fa_causal)h_rng_int(r, 0, 2);
    p->window_left = h_rng_int(r, 0, 2) == 0 ? h_rng_int(r, 0, 20) : -1;
    p->window_right = h_rng_int(r, 0, 2) == 0 ? h_rng_int(r, 0, 20) : -1;
    p->q_start = h_rng_int(r, 0, 3) == 0 ? h_rng_int(r, 0, 50) : 0;
    p->k_start = h_rng_int(r, 0, 3) == 0 ? h_rng_int(r, 0, 50) : 0;
}

static int row_sees(const fa_problem *p, int64_t i, int64_t j0, int64_t j1)
{
    int64_t lo, hi;
    fa_row_band(p, &p->view, i, &lo, &hi);
    if (lo < j0) lo = j0;
    if (hi > j1) hi = j1;
    return lo <= hi;
}

static void test_band_questions(h_rng *r)
{
    for (int t = 0; t < h_scaled(3000); t++) {
        fa_problem p;
        random_band(r, &p);
        const int64_t j0 = h_rng_int(r, 0, p.Sk - 1), j1 = h_rng_int(r, j0, p.Sk - 1);
        int64_t want_lo = p.Sq, want_hi = -1;
        for (int64_t i = 0; i < p.Sq; i++)
            if (row_sees(&p, i, j0, j1)) {
                if (want_lo == p.Sq) want_lo = i;
                want_hi = i;
            }
        int64_t ilo, ihi;
        fa_key_block_rows(&p, &p.view, j0, j1, &ilo, &ihi);
        h_case("key block [%lld, %lld] Sq=%lld Sk=%lld causal=%d window=(%lld,%lld) pos=(%lld,%lld)", (long long)j0,
               (long long)j1, (long long)p.Sq, (long long)p.Sk, (int)p.causal, (long long)p.window_left,
               (long long)p.window_right, (long long)p.q_start, (long long)p.k_start);
        if (want_hi < 0)
            CHECK(ilo > ihi, "no row sees the block, got rows [%lld, %lld]", (long long)ilo, (long long)ihi);
        else
            CHECK(ilo == want_lo && ihi == want_hi, "rows [%lld, %lld], want [%lld, %lld]", (long long)ilo,
                  (long long)ihi, (long long)want_lo, (long long)want_hi);
        /* every row strictly between sees the block too: the band is convex in i */
        for (int64_t i = want_lo; i <= want_hi; i++)
            CHECK(row_sees(&p, i, j0, j1), "row %lld inside [%lld, %lld] sees nothing", (long long)i,
                  (long long)want_lo, (long long)want_hi);

        /* the forward question: keys a row block sees, within a chunk */
        const int64_t i0 = h_rng_int(r, 0, p.Sq - 1), n = h_rng_int(r, 1, p.Sq - i0);
        const fa_task task = {.split = 0, .nsplit = 1};
        int64_t lo, hi;
        fa_task_columns(&p, &p.view, &task, i0, n, &lo, &hi);
        int64_t wlo = p.Sk, whi = -1;
        for (int64_t i = i0; i < i0 + n; i++) {
            int64_t a, b;
            fa_row_band(&p, &p.view, i, &a, &b);
            if (a > b) continue;
            if (a < wlo) wlo = a;
            if (b > whi) whi = b;
        }
        /* fa_task_columns may be wider than the union (it reads the end rows only),
         * never narrower */
        if (whi >= 0) CHECK(lo <= wlo && hi >= whi, "columns [%lld, %lld] miss [%lld, %lld]", (long long)lo,
                            (long long)hi, (long long)wlo, (long long)whi);
    }
}

/* Every (b, head, row, key) kept by the band is covered exactly once by the plan. */
static void test_plan_coverage(h_rng *r)
{
    for (int t = 0; t < h_scaled(60); t++) {
        fa_problem p;
        random_band(r, &p);
        p.Hk = h_rng_int(r, 1, 3);
        p.group = h_rng_int(r, 1, 4);
        p.Hq = p.Hk * p.group;
        p.D = p.Dv = 8;
        p.Sq = h_rng_int(r, 1, 40);
        p.Sk = h_rng_int(r, 1, 3000);
        static float dummy[4]; /* views are taken, never read */
        p.q.data = p.k.data = p.v.data = p.o.data = dummy;
        p.k.shape[1] = p.Sk;
        p.q.shape[1] = p.Sq;
        const fa_task_rules rules = {.br = h_rng_int(r, 0, 1) ? 16 : 64, .small = (int)h_rng_int(r, 0, 1),
                                     .stacks_max = h_rng_int(r, 1, 6), .kv_splits = h_rng_int(r, 0, 1) ? 0 : h_rng_int(r, 1, 9)};
        fa_task_counts counts;
        fa_tasks_count(&p, &rules, &counts);
        fa_task *tasks = malloc((size_t)counts.tasks * sizeof *tasks);
        fa_tasks_fill(&p, &rules, &counts, tasks);
        /* coverage count per (head, row, key) */
        unsigned char *seen = calloc((size_t)(p.Hq * p.Sq * p.Sk), 1);
        for (int64_t k = 0; k < counts.tasks; k++) {
            const fa_task *tk = &tasks[k];
            const int64_t i0 = (int64_t)tk->qb * rules.br, n = p.Sq - i0 < rules.br ? p.Sq - i0 : rules.br;
            const int64_t heads = tk->nkv > 0 ? (int64_t)tk->nkv * tk->ng : tk->ng;
            int64_t ca, cb;
            fa_chunk_range(p.Sk, tk->split, tk->nsplit, &ca, &cb);
            for (int64_t h = tk->h0; h < tk->h0 + heads; h++)
                for (int64_t i = i0; i < i0 + n; i++) {
                    int64_t lo, hi;
                    fa_row_band(&p, &p.view, i, &lo, &hi);
                    for (int64_t j = lo > ca ? lo : ca; j <= hi && j < cb; j++) seen[(h * p.Sq + i) * p.Sk + j]++;
                }
        }
        int64_t bad = 0;
        for (int64_t h = 0; h < p.Hq; h++)
            for (int64_t i = 0; i < p.Sq; i++) {
                int64_t lo, hi;
                fa_row_band(&p, &p.view, i, &lo, &hi);
                for (int64_t j = 0; j < p.Sk; j++) bad += seen[(h * p.Sq + i) * p.Sk + j] != (j >= lo && j <= hi);
            }
        h_case("plan Hq=%lld group=%lld Sq=%lld Sk=%lld br=%lld small=%d splits=%lld", (long long)p.Hq,
               (long long)p.group, (long long)p.Sq, (long long)p.Sk, (long long)rules.br, rules.small,
               (long long)rules.kv_splits);
        CHECK(bad == 0, "%lld (head, row, key) triples covered other than once", (long long)bad);
        for (int64_t k = 1; k < counts.tasks; k++)
            CHECK(tasks[k - 1].cost >= tasks[k].cost, "tasks not ordered by cost at %lld", (long long)k);
        free(seen);
        free(tasks);
    }
}

/* A batch of 1-3 packed sequences of their own lengths (a varlen problem; sequences
 * may be empty), with a random band and heads. cuq, cuk: room for 4 entries each. */
static void random_batch(h_rng *r, fa_problem *p, int32_t *cuq, int32_t *cuk, int64_t sq_max, int64_t sk_max)
{
    random_band(r, p);
    p->B = h_rng_int(r, 1, 3);
    p->Hk = h_rng_int(r, 1, 3);
    p->group = h_rng_int(r, 1, 4);
    p->Hq = p->Hk * p->group;
    p->D = p->Dv = 64 * h_rng_int(r, 1, 2);
    cuq[0] = cuk[0] = 0;
    for (int64_t b = 0; b < p->B; b++) {
        cuq[b + 1] = cuq[b] + (int32_t)h_rng_int(r, h_rng_int(r, 0, 3) == 0 ? 0 : 1, sq_max);
        cuk[b + 1] = cuk[b] + (int32_t)h_rng_int(r, 1, sk_max);
    }
    p->varlen = 1;
    p->cu_q = cuq;
    p->cu_k = cuk;
    static float dummy[4]; /* views are taken, never read */
    p->q.data = p->k.data = p->v.data = p->o.data = dummy;
    p->q.shape[1] = cuq[p->B];
    p->k.shape[1] = cuk[p->B];
    static fa_seq seqs[3]; /* the sequence table validation would build (one problem at a time) */
    fa_seq_table_fill(p, seqs);
    p->seqs = seqs;
}

/* The packing unit of a task, as tasks.h's rule reads: -1 for a small-row task (a
 * stacked task reads its unit's packed K/V in every form, bf16 pairs included). */
static int64_t unit_of(const fa_problem *p, const fa_task *t)
{
    if (t->nkv > 0) return -1;
    return (int64_t)t->b * p->Hk + t->h0 / p->group;
}

/* What a wave slot holds, as the pack steps so far wrote it. */
typedef struct {
    int64_t unit, key0, next, wave;
} slot_fill;

/* The steps of a packed forward, taken in order by one thread, against the rule of
 * tasks.h: each step's waits are on steps already done; unpacked tasks first; a
 * pack step continues its slot's keys, a piece's keys from its first; a task step
 * reads its own unit in its wave's slot with every key its tiles need packed, runs
 * the tiles that start in its range, those after its previous step's, in order
 * (begin on the first, end on the last that ran them all); a chunked task holds a
 * state slot no other task holds while it runs; every task runs all its tiles once;
 * packable units are packed; the wave buffers and slots stay within their bounds. */
static void check_steps(const fa_problem *p, const fa_task *tasks, int64_t n_tasks, const fa_pack_rules *pr,
                        fa_steps *st, int64_t *chunked_runs)
{
    const int64_t nu = p->B * p->Hk, pc = pr->bc + (pr->form ? pr->bc & 1 : 0);
    int64_t *readers = calloc((size_t)nu, sizeof *readers), *packed_u = calloc((size_t)nu, sizeof *packed_u);
    int64_t *cursor = malloc((size_t)n_tasks * sizeof *cursor), *ends = calloc((size_t)n_tasks, sizeof *ends);
    int64_t *last_piece_task = malloc((size_t)(st->n_pieces + 1) * sizeof *last_piece_task);
    const int64_t nslots = 2 * (st->wave_units > 0 ? st->wave_units : 1);
    slot_fill *fill = malloc((size_t)nslots * sizeof *fill);
    int64_t *owner = malloc((size_t)(st->group > 0 ? st->group : 1) * sizeof *owner);
    for (int64_t t = 0; t < n_tasks; t++) {
        const int64_t u = unit_of(p, &tasks[t]);
        if (u >= 0) readers[u]++;
        cursor[t] = -1;
    }
    for (int64_t i = 0; i <= st->n_pieces; i++) last_piece_task[i] = -1;
    for (int64_t i = 0; i < nslots; i++) fill[i] = (slot_fill){-1, -1, -1, -1};
    for (int64_t k = 0; k < st->group; k++) owner[k] = -1;
    const int64_t min_readers = pr->mode == 2 ? 2 : pr->form ? 6 : 4;
    int64_t bad_wait = 0, bad_order = 0, bad_pack = 0, bad_read = 0, bad_tiles = 0, bad_state = 0, chunked = 0;
    int64_t seen_packed = 0;
    for (int64_t t = 0; t < st->n_steps; t++) {
        fa_step s;
        fa_steps_at(st, t, &s);
        bad_wait += !fa_steps_ready(st, &s);
        if (s.wave < 0) {
            /* an unpacked task: all its tiles, before any packed step */
            const int64_t u = unit_of(p, &tasks[s.task]);
            bad_order += seen_packed || (u >= 0 && readers[u] >= min_readers) || !s.begin || !s.end || s.state >= 0 ||
                         s.j0 != 0 || s.cols != INT64_MAX;
            ends[s.task]++;
            fa_steps_done(st, &s);
            continue;
        }
        seen_packed = 1;
        slot_fill *f = &fill[(s.wave & 1) * st->wave_units + s.slot];
        const int64_t u = (int64_t)s.b * p->Hk + s.hk;
        int64_t sq, sk;
        fa_seq_lengths(p, s.b, &sq, &sk);
        if (s.task < 0) {
            if (s.j0 == s.key0) *f = (slot_fill){u, s.key0, s.key0, s.wave}, packed_u[u] = 1;
            bad_pack += f->unit != u || f->key0 != s.key0 || f->wave != s.wave || s.j0 != f->next ||
                        s.cols != (sk - s.j0 < pc ? sk - s.j0 : pc) || (pr->form && (s.key0 & 1));
            f->next = s.j0 + s.cols;
            bad_pack += st->chunk_keys > 0 && f->next - f->key0 > st->chunk_keys + pc; /* within its slot */
            fa_steps_done(st, &s);
            continue;
        }
        const fa_task *it = &tasks[s.task];
        bad_read += unit_of(p, it) != u || f->unit != u || f->key0 != s.key0 || f->wave != s.wave;
        /* readers of a piece in the tasks' order */
        bad_order += last_piece_task[s.piece] >= s.task;
        last_piece_task[s.piece] = s.task;
        fa_view v;
        fa_seq_view(p, it->b, &v);
        const int64_t i0 = (int64_t)it->qb * pr->br, n = v.Sq - i0 < pr->br ? v.Sq - i0 : pr->br;
        int64_t lo, hi;
        fa_task_columns(p, &v, it, i0, n, &lo, &hi);
        const int first = cursor[s.task] < 0;
        if (first) cursor[s.task] = lo;
        bad_tiles += s.begin != first || ends[s.task] > 0;
        /* the tiles before j0 ran in earlier steps: the cursor is at the first tile from j0 */
        bad_tiles += cursor[s.task] <= hi && cursor[s.task] < s.j0;
        for (; cursor[s.task] <= hi && cursor[s.task] < s.j0 + s.cols; cursor[s.task] += pr->bc) {
            const int64_t end = hi < cursor[s.task] + pr->bc - 1 ? hi : cursor[s.task] + pr->bc - 1;
            bad_read += cursor[s.task] < f->key0 || end >= f->next;
        }
        if (s.end) {
            bad_tiles += cursor[s.task] <= hi;
            ends[s.task]++;
        }
        if (s.state >= 0) {
            chunked = 1;
            bad_state += s.state >= st->group || (s.begin ? owner[s.state] != -1 : owner[s.state] != s.task);
            owner[s.state] = s.end ? -1 : s.task;
        } else {
            bad_state += !s.begin || !s.end;
        }
        fa_steps_done(st, &s);
    }
    CHECK(bad_wait == 0, "%lld steps wait on steps not done before them", (long long)bad_wait);
    CHECK(bad_order == 0, "%lld steps out of the documented order", (long long)bad_order);
    CHECK(bad_pack == 0 && bad_read == 0, "%lld pack steps wrong, %lld task steps read keys not packed in their slot",
          (long long)bad_pack, (long long)bad_read);
    CHECK(bad_tiles == 0 && bad_state == 0, "%lld task steps miss, repeat or reorder tiles; %lld misuse state slots",
          (long long)bad_tiles, (long long)bad_state);
    int64_t bad = 0, packed = 0;
    for (int64_t t = 0; t < n_tasks; t++) bad += ends[t] != 1;
    for (int64_t u = 0; u < nu; u++) {
        packed += packed_u[u];
        bad += !packed_u[u] && readers[u] >= min_readers; /* packable but not packed */
    }
    CHECK(bad == 0 && packed == st->packed, "%lld units or tasks wrong, %lld of %lld units packed", (long long)bad,
          (long long)packed, (long long)st->packed);
    const int64_t unit_max = pr->unit_max > 0 ? pr->unit_max : FA_PACK_UNIT_MAX;
    CHECK(st->wave_units == 1 || 2 * st->wave_units * st->pack.unit_bytes <= FA_WORKSPACE_KEEP,
          "two waves of %lld slots of %lld bytes exceed the bound", (long long)st->wave_units,
          (long long)st->pack.unit_bytes);
    /* a slot holds a chunk and a pack step more: two pack steps at least */
    CHECK(st->chunk_keys == 0 || (st->chunk_keys % pc == 0 && (st->pack.unit_bytes <= unit_max || st->chunk_keys == pc)),
          "chunks of %lld keys (pack steps of %lld) in slots of %lld bytes over %lld", (long long)st->chunk_keys,
          (long long)pc, (long long)st->pack.unit_bytes, (long long)unit_max);
    *chunked_runs += chunked;
    free(readers), free(packed_u), free(cursor), free(ends), free(last_piece_task), free(fill), free(owner);
}

static void test_steps(h_rng *r)
{
    int64_t packed_runs = 0, multi_wave = 0, chunked_runs = 0;
    for (int t = 0; t < h_scaled(300); t++) {
        fa_problem p;
        int32_t cuq[4], cuk[4];
        random_batch(r, &p, cuq, cuk, h_rng_int(r, 0, 1) ? 300 : 1200, h_rng_int(r, 0, 1) ? 200 : 6000);
        const fa_task_rules rules = {.br = h_rng_int(r, 0, 1) ? 16 : 64, .small = (int)h_rng_int(r, 0, 1),
                                     .stacks_max = h_rng_int(r, 1, 6), .kv_splits = h_rng_int(r, 0, 2) ? 0 : h_rng_int(r, 1, 4)};
        fa_task_counts counts;
        fa_tasks_count(&p, &rules, &counts);
        fa_task *tasks = malloc((size_t)(counts.tasks > 0 ? counts.tasks : 1) * sizeof *tasks);
        fa_tasks_fill(&p, &rules, &counts, tasks);
        const int64_t bcs[] = {16, 31, 64, 128};
        /* small units and states make long units chunked, in groups of a few readers */
        const int64_t unit_max = h_rng_int(r, 0, 1) ? 0 : (int64_t)16 << h_rng_int(r, 10, 17);
        const fa_pack_rules pr = {.form = (int)h_rng_int(r, 0, 1), .mode = h_rng_int(r, 0, 1) ? 2 : 0,
                                  .threads = (int)h_rng_int(r, 1, 4), .br = rules.br, .bc = bcs[h_rng_int(r, 0, 3)],
                                  .state_bytes = (int64_t)1 << h_rng_int(r, 16, 21), .unit_max = unit_max};
        fa_steps st;
        fa_steps_init(&st, tasks, counts.tasks);
        int64_t *units = malloc((size_t)(7 * p.B * p.Hk) * sizeof *units);
        const int64_t bytes = fa_steps_plan(&st, &p, &pr, units);
        h_case("steps B=%lld Hk=%lld group=%lld tasks=%lld form=%d mode=%d threads=%d br=%lld bc=%lld unit_max=%lld "
               "state=%lld",
               (long long)p.B, (long long)p.Hk, (long long)p.group, (long long)counts.tasks, pr.form, pr.mode,
               pr.threads, (long long)pr.br, (long long)pr.bc, (long long)unit_max, (long long)pr.state_bytes);
        CHECK(bytes >= 0, "the plan's size overflows");
        char *ws = NULL;
        if (bytes > 0) {
            ws = aligned_alloc(FA_CACHE_LINE, (size_t)fa_round_up(bytes, FA_CACHE_LINE));
            fa_steps_fill(&st, &p, &pr, units, ws);
            check_steps(&p, tasks, counts.tasks, &pr, &st, &chunked_runs);
            packed_runs++;
            multi_wave += st.waves > 2;
            /* the same steps again, handed out by fa_steps_take to one thread, which
             * never waits (the waits were found to point backwards) */
            fa_steps again;
            fa_steps_init(&again, tasks, counts.tasks);
            fa_steps_plan(&again, &p, &pr, units);
            fa_steps_fill(&again, &p, &pr, units, ws);
            int64_t taken = 0, bad = 0;
            for (fa_step s; fa_steps_take(&again, &s); fa_steps_done(&again, &s)) {
                fa_step want;
                fa_steps_at(&again, taken++, &want);
                bad += memcmp(&s, &want, sizeof s) != 0;
            }
            CHECK(bad == 0 && taken == again.n_steps, "one thread took %lld of %lld steps, %lld out of order",
                  (long long)taken, (long long)again.n_steps, (long long)bad);
        } else {
            CHECK(st.pieces == NULL && st.packed == 0, "nothing to pack, yet %lld units planned", (long long)st.packed);
            int64_t taken = 0, bad = 0;
            for (fa_step s; fa_steps_take(&st, &s); fa_steps_done(&st, &s)) bad += s.task != taken++ || s.wave >= 0;
            CHECK(bad == 0 && taken == counts.tasks, "unpacked steps: %lld of %lld tasks, %lld out of order",
                  (long long)taken, (long long)counts.tasks, (long long)bad);
        }
        free(ws);
        free(units);
        free(tasks);
    }
    h_case("steps: the cases");
    CHECK(packed_runs > 0 && multi_wave > 0 && chunked_runs > 0,
          "packed runs %lld, with three waves or more %lld, with chunked units %lld: the sweep misses them",
          (long long)packed_runs, (long long)multi_wave, (long long)chunked_runs);
}

/* The backward's task lists: a partition of the work, most expensive first. */
static void test_bwd_tasks(h_rng *r)
{
    int64_t two_pass_runs = 0;
    for (int t = 0; t < h_scaled(300); t++) {
        fa_problem p;
        int32_t cuq[4], cuk[4];
        random_batch(r, &p, cuq, cuk, 400, 400);
        if (h_rng_int(r, 0, 1)) p.Hk = 1, p.Hq = p.group; /* MQA: where two passes pay */
        const fa_bwd_rules rules = {.br = h_rng_int(r, 0, 1) ? 16 : 64, .bc = h_rng_int(r, 0, 1) ? 16 : 64,
                                    .threads = (int)h_rng_int(r, 1, 8), .two_pass_ok = (int)h_rng_int(r, 0, 3) > 0,
                                    .kv = (int)h_rng_int(r, 0, 3) > 0, .dq = (int)h_rng_int(r, 0, 3) > 0};
        fa_bwd_counts c;
        h_case("bwd tasks B=%lld Hq=%lld Hk=%lld br=%lld bc=%lld threads=%d ok=%d kv=%d dq=%d", (long long)p.B,
               (long long)p.Hq, (long long)p.Hk, (long long)rules.br, (long long)rules.bc, rules.threads,
               rules.two_pass_ok, rules.kv, rules.dq);
        CHECK(fa_bwd_tasks_count(&p, &rules, &c), "the count overflows");
        fa_bwd_task *tasks = malloc((size_t)(c.tasks > 0 ? c.tasks : 1) * sizeof *tasks);
        fa_bwd_tasks_fill(&p, &rules, &c, tasks);
        CHECK(!c.two_pass || (rules.two_pass_ok && rules.threads > 1), "two passes where they may not run");
        two_pass_runs += c.two_pass;
        /* expected: (kind, b, head, start) once each */
        int64_t want = 0, sq_max = 0;
        for (int64_t b = 0; b < p.B; b++) {
            int64_t sq, sk;
            fa_seq_lengths(&p, b, &sq, &sk);
            if (sq > sq_max) sq_max = sq;
            if (!c.two_pass) want += p.Hk;
            else want += (rules.kv ? (sk + rules.bc - 1) / rules.bc * p.Hk : 0) + (rules.dq ? (sq + rules.br - 1) / rules.br * p.Hq : 0);
        }
        CHECK(c.tasks == want && c.sq_max == sq_max, "%lld tasks (want %lld), sq_max %lld (want %lld)",
              (long long)c.tasks, (long long)want, (long long)c.sq_max, (long long)sq_max);
        int64_t bad = 0;
        for (int64_t k = 0; k < c.tasks; k++) {
            const fa_bwd_task *x = &tasks[k];
            int64_t sq, sk;
            fa_seq_lengths(&p, x->b, &sq, &sk);
            if (!c.two_pass) bad += x->kind != FA_BWD_FUSED || x->head >= p.Hk || x->start != 0;
            else if (x->kind == FA_BWD_KEY_TILE) bad += !rules.kv || x->head >= p.Hk || x->start % rules.bc || x->start >= sk;
            else bad += x->kind != FA_BWD_QUERY_BLOCK || !rules.dq || x->head >= p.Hq || x->start % rules.br || x->start >= sq;
            for (int64_t m = 0; m < k; m++) /* no task twice */
                bad += tasks[m].kind == x->kind && tasks[m].b == x->b && tasks[m].head == x->head && tasks[m].start == x->start;
            if (k > 0) { /* most expensive first, then by (kind, b, head, start) */
                const fa_bwd_task *y = &tasks[k - 1];
                const int64_t a[5] = {-y->cost, y->kind, y->b, y->head, y->start}, z[5] = {-x->cost, x->kind, x->b, x->head, x->start};
                int cmp = 0;
                for (int i = 0; i < 5 && cmp == 0; i++) cmp = (a[i] > z[i]) - (a[i] < z[i]);
                bad += cmp >= 0;
            }
        }
        CHECK(bad == 0, "%lld tasks out of place, repeated or out of order", (long long)bad);
        free(tasks);
    }
    h_case("bwd tasks: the cases");
    CHECK(two_pass_runs > 0, "no case took the two-pass schedule");
}

/* fa_plan_from's FA_PLAN_FUSED against FA_PLAN_TRIMMED on shapes where they agree or not. */
static void test_fused_plan(void)
{
    static const struct {
        int64_t b, h, sq, sk;
        fa_causal causal;
        int64_t window, br, bc; /* br, bc 0: as the trimmed loop plans */
    } cases[] = {
        {1, 32, 512, 512, FA_CAUSAL_NONE, -1, 512, 512},        /* one task per head, one tile */
        {1, 32, 512, 512, FA_CAUSAL_BOTTOM_RIGHT, -1, 512, 512},
        {1, 8, 512, 512, FA_CAUSAL_NONE, -1, 256, 512},         /* 16 tasks: blocks of 256 rows */
        {8, 32, 256, 256, FA_CAUSAL_BOTTOM_RIGHT, -1, 256, 256}, /* chunked prefill: a chunk is a task */
        {1, 32, 128, 300, FA_CAUSAL_NONE, -1, 128, 300},
        {1, 32, 2048, 2048, FA_CAUSAL_NONE, -1, 0, 0},           /* longer keys: the trimmed plan */
        {1, 32, 1024, 1024, FA_CAUSAL_BOTTOM_RIGHT, -1, 0, 0},
        {1, 32, 512, 512, FA_CAUSAL_NONE, 64, 0, 0},              /* a window: the trimmed plan */
    };
    const fa_plan_inputs in = {.kernels = &fa_kernels_ref};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        h_case("fused plan %zu: B %lld H %lld Sq %lld Sk %lld", i, (long long)cases[i].b, (long long)cases[i].h,
               (long long)cases[i].sq, (long long)cases[i].sk);
        fa_problem p;
        memset(&p, 0, sizeof p);
        p.B = cases[i].b, p.Hq = p.Hk = cases[i].h, p.group = 1, p.Sq = cases[i].sq, p.Sk = cases[i].sk;
        p.D = p.Dv = 128;
        p.causal = cases[i].causal;
        p.window_left = p.window_right = cases[i].window;
        fa_plan fused, trimmed;
        fa_plan_from(&in, &p, FA_PLAN_FUSED, &fused);
        fa_plan_from(&in, &p, FA_PLAN_TRIMMED, &trimmed);
        const int64_t br = cases[i].br ? cases[i].br : trimmed.br, bc = cases[i].bc ? cases[i].bc : trimmed.bc;
        CHECK(fused.br == br && fused.bc == bc && fused.br_pad == fa_panel_ld(br), "%lldx%lld, want %lldx%lld",
              (long long)fused.br, (long long)fused.bc, (long long)br, (long long)bc);
        const fa_plan_inputs set = {.kernels = &fa_kernels_ref, .tuned_q = 64, .tuned_kv = 128, .set_kv = 32};
        fa_plan_from(&set, &p, FA_PLAN_FUSED, &fused);
        CHECK(fused.br == 64 && fused.bc == 32 && fused.src_q == FA_TILES_TUNED && fused.src_kv == FA_TILES_OVERRIDE,
              "tuned and set: %lldx%lld", (long long)fused.br, (long long)fused.bc);
    }
}

/* A block mask of nb x nb blocks of blk (broadcast over batch and heads): "stair" keeps
 * kv blocks 0 .. qb of q block qb, the diagonal one partial with element rows
 * `diag` (c <= r, or with gaps: not runs); "scatter" one full block per row,
 * (3 qb + 1) mod nb; "all" every block, full. */
enum { BM_NB = 8, BM_BLK = 128 };
typedef struct {
    int64_t offsets[BM_NB + 1], partial[BM_NB * BM_NB];
    int32_t idx[BM_NB * BM_NB];
    uint8_t bits[BM_BLK * BM_BLK / 8];
} bm_store;

static void bm_build(bm_store *st, fa_bmask *m, const char *shape, int gaps)
{
    memset(st, 0, sizeof *st);
    int64_t n = 0;
    for (int64_t qb = 0; qb < BM_NB; qb++) {
        st->offsets[qb] = n;
        if (!strcmp(shape, "docs")) { /* documents of one block each */
            st->idx[n] = (int32_t)qb, st->partial[n++] = -1;
            continue;
        }
        if (!strcmp(shape, "scatter")) {
            st->idx[n] = (int32_t)((3 * qb + 1) % BM_NB), st->partial[n++] = -1;
            continue;
        }
        const int64_t kb1 = !strcmp(shape, "all") ? BM_NB : qb + 1;
        for (int64_t kb = 0; kb < kb1; kb++)
            st->idx[n] = (int32_t)kb, st->partial[n++] = kb == qb && !strcmp(shape, "stair") ? 0 : -1;
    }
    st->offsets[BM_NB] = n;
    for (int64_t r = 0; r < BM_BLK; r++)
        for (int64_t c = 0; c <= r; c++)
            if (!gaps || c % 3 != 1 || c == r) st->bits[r * (BM_BLK / 8) + c / 8] |= (uint8_t)(1u << (c % 8));
    *m = (fa_bmask){.on = 1, .bq = BM_BLK, .bk = BM_BLK, .nqb = BM_NB, .nkb = BM_NB, .offsets = st->offsets,
                    .idx = st->idx, .partial = st->partial, .bits = st->bits, .row_bytes = BM_BLK / 8,
                    .block_bytes = BM_BLK * BM_BLK / 8};
}

/* fa_plan_from under block masks, per loop, with tiles of 2 x 2 blocks set: what each
 * loop computes of them decides (plan.h, FA_PLAN_*). */
static void test_bmask_plan(void)
{
    static const struct {
        const char *shape;
        int gaps;
        int64_t tile[3]; /* FA_PLAN_PLAIN, _TRIMMED, _FUSED: tiles of 1 or 2 blocks a side */
    } cases[] = {
        {"stair", 0, {1, 2, 2}}, /* the trimmed loops skip the diagonal tile's upper block */
        {"stair", 1, {1, 1, 1}}, /* rows that are no runs: the diagonal tile is computed whole */
        {"scatter", 0, {1, 1, 1}},
        {"all", 0, {2, 2, 2}},
    };
    const fa_plan_inputs in = {.kernels = &fa_kernels_ref, .set_q = 2 * BM_BLK, .set_kv = 2 * BM_BLK};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int loop = FA_PLAN_PLAIN; loop <= FA_PLAN_FUSED; loop++) {
            h_case("block mask plan: %s%s, loop %d", cases[i].shape, cases[i].gaps ? " (gaps)" : "", loop);
            bm_store st;
            fa_problem p;
            memset(&p, 0, sizeof p);
            p.B = 1, p.Hq = p.Hk = 4, p.group = 1, p.Sq = p.Sk = BM_NB * BM_BLK, p.D = p.Dv = 128;
            bm_build(&st, &p.bm, cases[i].shape, cases[i].gaps);
            fa_plan plan;
            fa_plan_from(&in, &p, loop, &plan);
            const int64_t want = cases[i].tile[loop] * BM_BLK;
            CHECK(plan.br == want && plan.bc == want, "%lldx%lld, want %lldx%lld", (long long)plan.br,
                  (long long)plan.bc, (long long)want, (long long)want);
        }
}

/* The packing of a block mask's unit over unit_max whose tasks each read a part of
 * it: documents are packed, each document's keys once, each task one step on them;
 * scattered blocks, whose readers would each take keys of their own, are read in
 * place. */
static void test_bmask_pack(void)
{
    static const struct {
        const char *shape;
        int64_t br;
        int packed; /* 1: each key packed once, one step per task */
    } cases[] = {{"docs", BM_BLK / 2, 1}, {"scatter", BM_BLK, 0}}; /* 2 and 1 readers a key */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        h_case("block mask packing: %s", cases[i].shape);
        bm_store bs;
        fa_problem p;
        memset(&p, 0, sizeof p);
        p.B = 1, p.Hq = p.Hk = 2, p.group = 1, p.Sq = p.Sk = BM_NB * BM_BLK, p.D = p.Dv = 32;
        p.window_left = p.window_right = -1;
        bm_build(&bs, &p.bm, cases[i].shape, 0);
        const fa_task_rules rules = {.br = cases[i].br, .stacks_max = 1, .kv_splits = 1};
        fa_task_counts counts;
        fa_tasks_count(&p, &rules, &counts);
        fa_task *tasks = malloc((size_t)counts.tasks * sizeof *tasks);
        fa_tasks_fill(&p, &rules, &counts, tasks);
        /* f32, D = 32: 256 bytes a key; units of 1024 keys (256 KiB) over 128 KiB, cut
         * in slots of 256 keys; forced packing takes a unit two tasks share */
        const fa_pack_rules pr = {.form = 0, .mode = 2, .threads = 2, .br = cases[i].br, .bc = BM_BLK,
                                  .state_bytes = 1 << 16, .unit_max = 128 << 10};
        fa_steps st;
        fa_steps_init(&st, tasks, counts.tasks);
        int64_t *units = malloc((size_t)(7 * p.B * p.Hk) * sizeof *units);
        const int64_t bytes = fa_steps_plan(&st, &p, &pr, units);
        char *ws = bytes > 0 ? aligned_alloc(FA_CACHE_LINE, (size_t)fa_round_up(bytes, FA_CACHE_LINE)) : NULL;
        int64_t chunked_runs = 0;
        if (ws) {
            fa_steps_fill(&st, &p, &pr, units, ws);
            check_steps(&p, tasks, counts.tasks, &pr, &st, &chunked_runs);
        }
        if (cases[i].packed)
            CHECK(st.packed == p.Hk && st.chunk_keys > 0 && st.pack_steps == p.Hk * BM_NB &&
                      st.n_steps == st.pack_steps + counts.tasks && chunked_runs == 0,
                  "%lld units packed (chunks of %lld keys), %lld pack steps, %lld steps for %lld tasks, "
                  "%lld in states: want %lld, each block packed once, each task one step",
                  (long long)st.packed, (long long)st.chunk_keys, (long long)st.pack_steps, (long long)st.n_steps,
                  (long long)counts.tasks, (long long)chunked_runs, (long long)p.Hk);
        else
            CHECK(st.packed == 0, "%lld units packed, want them read in place", (long long)st.packed);
        free(ws);
        free(units);
        free(tasks);
    }
}

int main(void)
{
    h_rng r;
    h_rng_seed(&r, h_env_u64("FA_TEST_SEED", 91));
    test_band_questions(&r);
    test_plan_coverage(&r);
    test_steps(&r);
    test_bwd_tasks(&r);
    test_fused_plan();
    test_bmask_plan();
    test_bmask_pack();
    return h_summary();
}
