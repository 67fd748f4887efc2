/*
 * test_planner.c: the task planner (src/tasks.c) against brute force.
 *
 *  - fa_key_block_rows (which query rows see a key block: the question a
 *    key-outer backward loop asks) and fa_task_columns (which keys a row block
 *    sees) equal a scan of fa_row_band over every row, for random lengths,
 *    causal alignments, windows and position offsets;
 *  - a plan covers every (sequence, query row, head, key) of the problem exactly
 *    once across its tasks and key chunks, with and without split-KV, on the wide
 *    and on the small-row path;
 *  - the forward's steps with packed K/V (fa_steps_*): every task runs once, every
 *    unit enough tasks read is packed whole, each wait points to earlier steps, the
 *    order is the one tasks.h documents, and one thread taking the steps in order
 *    gets them all without waiting on anything undone;
 *  - the backward's tasks (fa_bwd_tasks_*): the fused schedule has one task per
 *    (sequence, kv head), the two-pass one every key tile and query block once, both
 *    ordered most expensive first.
 * Internal functions: this program links the library's objects and sees src/.
 */
#include "harness.h"
#include "problem.h"
#include "workspace.h"
#include "arith.h"
#include "tasks.h"

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
    fa_row_band(p, i, &lo, &hi);
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
        fa_key_block_rows(&p, j0, j1, &ilo, &ihi);
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
        fa_task_columns(&p, &task, i0, n, &lo, &hi);
        int64_t wlo = p.Sk, whi = -1;
        for (int64_t i = i0; i < i0 + n; i++) {
            int64_t a, b;
            fa_row_band(&p, i, &a, &b);
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
                    fa_row_band(&p, i, &lo, &hi);
                    for (int64_t j = lo > ca ? lo : ca; j <= hi && j < cb; j++) seen[(h * p.Sq + i) * p.Sk + j]++;
                }
        }
        int64_t bad = 0;
        for (int64_t h = 0; h < p.Hq; h++)
            for (int64_t i = 0; i < p.Sq; i++) {
                int64_t lo, hi;
                fa_row_band(&p, i, &lo, &hi);
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
}

/* The packing unit of a task, as tasks.h's rule reads: -1 for a small-row task or a
 * stacked one in the bf16 form. */
static int64_t unit_of(const fa_problem *p, const fa_task *t, int bf16)
{
    if (t->nkv > 0 || (bf16 && t->ng != 1)) return -1;
    return (int64_t)t->b * p->Hk + t->h0 / p->group;
}

/* The step list of a packed forward against the rule of tasks.h. */
static void check_steps(const fa_problem *p, const fa_task *tasks, int64_t n_tasks, const fa_pack_rules *pr,
                        fa_steps *st)
{
    const int64_t nu = p->B * p->Hk, chunk = pr->bc + (pr->form ? pr->bc & 1 : 0);
    int64_t *readers = calloc((size_t)nu, sizeof *readers), *first = malloc((size_t)nu * sizeof *first);
    int64_t *wave = malloc((size_t)nu * sizeof *wave), *slot = malloc((size_t)nu * sizeof *slot);
    int64_t *next_key = calloc((size_t)nu, sizeof *next_key), *ran = calloc((size_t)n_tasks, sizeof *ran);
    for (int64_t u = 0; u < nu; u++) first[u] = wave[u] = slot[u] = -1;
    for (int64_t t = 0; t < n_tasks; t++) {
        const int64_t u = unit_of(p, &tasks[t], pr->form);
        if (u >= 0 && readers[u]++ == 0) first[u] = t;
    }
    /* the documented order: unpacked tasks in order, then per wave its packs (units in
     * the order tasks first reach them, keys ascending), then its tasks in order */
    const int64_t min_readers = pr->mode == 2 ? 2 : pr->form ? 6 : 4;
    int64_t pos = 0, last_task = -1, bad = 0, packed = 0, prev_first = -1;
    for (; pos < st->n_steps && st->steps[pos].wave < 0; pos++) {
        const fa_step *s = &st->steps[pos];
        const int64_t u = unit_of(p, &tasks[s->task], pr->form);
        bad += s->task <= last_task || (u >= 0 && readers[u] >= min_readers);
        last_task = s->task;
        ran[s->task]++;
    }
    CHECK(bad == 0 && pos == st->unpacked, "%lld unpacked steps out of order or packable (%lld of %lld)",
          (long long)bad, (long long)pos, (long long)st->unpacked);
    int64_t last_pack_of_wave = -1, tasks_before = pos; /* step index bounds for the waits */
    int64_t *last_task_step = malloc((size_t)(st->waves > 0 ? st->waves : 1) * sizeof *last_task_step);
    for (int64_t w = 0; w < st->waves; w++) {
        for (; pos < st->n_steps && st->steps[pos].task < 0 && st->steps[pos].wave == w; pos++) {
            const fa_step *s = &st->steps[pos];
            const int64_t u = s->b * p->Hk + s->hk;
            if (s->j0 == 0) {
                bad += wave[u] >= 0 || first[u] <= prev_first || s->slot < 0 || s->slot >= st->wave_units;
                prev_first = first[u];
                wave[u] = w, slot[u] = s->slot, packed++;
            }
            int64_t sq, sk;
            fa_seq_lengths(p, s->b, &sq, &sk);
            bad += s->j0 != next_key[u] || s->cols != (sk - s->j0 < chunk ? sk - s->j0 : chunk) || slot[u] != s->slot;
            next_key[u] = s->j0 + s->cols;
            /* its wait: every task of wave w - 2 comes earlier */
            bad += w >= 2 && last_task_step[w - 2] >= pos;
            last_pack_of_wave = pos;
        }
        last_task = -1;
        for (; pos < st->n_steps && st->steps[pos].task >= 0 && st->steps[pos].wave == w; pos++) {
            const fa_step *s = &st->steps[pos];
            const int64_t u = unit_of(p, &tasks[s->task], pr->form);
            bad += s->task <= last_task || u < 0 || wave[u] != w || slot[u] != s->slot;
            bad += last_pack_of_wave >= pos; /* its wait: its wave's packs come earlier */
            last_task = s->task;
            ran[s->task]++;
        }
        last_task_step[w] = pos - 1;
    }
    (void)tasks_before;
    CHECK(bad == 0 && pos == st->n_steps, "%lld steps break the order or the waits (ended at %lld of %lld)",
          (long long)bad, (long long)pos, (long long)st->n_steps);
    for (int64_t u = 0; u < nu; u++) {
        int64_t sq, sk;
        fa_seq_lengths(p, u / p->Hk, &sq, &sk);
        if (wave[u] >= 0) bad += next_key[u] != sk;                           /* packed whole */
        else bad += readers[u] >= min_readers && st->n_steps > 0;             /* packable but not packed */
    }
    for (int64_t t = 0; t < n_tasks; t++) bad += ran[t] != 1;
    CHECK(bad == 0 && packed == st->packed, "%lld units or tasks wrong, %lld of %lld units packed", (long long)bad,
          (long long)packed, (long long)st->packed);
    CHECK(st->wave_units == 1 || 2 * st->wave_units * st->pack.unit_bytes <= FA_WORKSPACE_KEEP,
          "two waves of %lld units of %lld bytes exceed the bound", (long long)st->wave_units,
          (long long)st->pack.unit_bytes);
    /* one thread takes them all, in order, never waiting on a step not done (tried
     * only on a list whose waits were found right: a wrong one could wait forever) */
    if (bad) goto done;
    int64_t taken = 0;
    for (fa_step s; fa_steps_take(st, &s); fa_steps_done(st, &s)) {
        bad += memcmp(&s, &st->steps[taken], sizeof s) != 0;
        taken++;
    }
    CHECK(bad == 0 && taken == st->n_steps, "one thread took %lld of %lld steps, %lld out of order", (long long)taken,
          (long long)st->n_steps, (long long)bad);
done:
    free(readers), free(first), free(wave), free(slot), free(next_key), free(ran), free(last_task_step);
}

static void test_steps(h_rng *r)
{
    int64_t packed_runs = 0, multi_wave = 0;
    for (int t = 0; t < h_scaled(300); t++) {
        fa_problem p;
        int32_t cuq[4], cuk[4];
        random_batch(r, &p, cuq, cuk, 300, h_rng_int(r, 0, 1) ? 200 : 6000);
        const fa_task_rules rules = {.br = h_rng_int(r, 0, 1) ? 16 : 64, .small = (int)h_rng_int(r, 0, 1),
                                     .stacks_max = h_rng_int(r, 1, 6), .kv_splits = h_rng_int(r, 0, 2) ? 0 : h_rng_int(r, 1, 4)};
        fa_task_counts counts;
        fa_tasks_count(&p, &rules, &counts);
        fa_task *tasks = malloc((size_t)(counts.tasks > 0 ? counts.tasks : 1) * sizeof *tasks);
        fa_tasks_fill(&p, &rules, &counts, tasks);
        const int64_t bcs[] = {16, 31, 64, 128};
        const fa_pack_rules pr = {.form = (int)h_rng_int(r, 0, 1), .mode = h_rng_int(r, 0, 1) ? 2 : 0,
                                  .threads = (int)h_rng_int(r, 1, 4), .bc = bcs[h_rng_int(r, 0, 3)]};
        fa_steps st;
        fa_steps_init(&st, tasks, counts.tasks);
        int64_t *units = malloc((size_t)(p.B * p.Hk) * sizeof *units);
        const int64_t bytes = fa_steps_plan(&st, &p, &pr, units);
        h_case("steps B=%lld Hk=%lld group=%lld tasks=%lld form=%d mode=%d threads=%d bc=%lld", (long long)p.B,
               (long long)p.Hk, (long long)p.group, (long long)counts.tasks, pr.form, pr.mode, pr.threads,
               (long long)pr.bc);
        CHECK(bytes >= 0, "the plan's size overflows");
        char *ws = NULL;
        if (bytes > 0) {
            ws = aligned_alloc(FA_CACHE_LINE, (size_t)fa_round_up(bytes, FA_CACHE_LINE));
            fa_steps_fill(&st, &p, &pr, units, ws);
            check_steps(&p, tasks, counts.tasks, &pr, &st);
            packed_runs++;
            multi_wave += st.waves > 2;
        } else {
            CHECK(st.steps == NULL && st.packed == 0, "nothing to pack, yet %lld units planned", (long long)st.packed);
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
    CHECK(packed_runs > 0 && multi_wave > 0, "packed runs %lld, with three waves or more %lld: the sweep misses them",
          (long long)packed_runs, (long long)multi_wave);
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

int main(void)
{
    h_rng r;
    h_rng_seed(&r, h_env_u64("FA_TEST_SEED", 91));
    test_band_questions(&r);
    test_plan_coverage(&r);
    test_steps(&r);
    test_bwd_tasks(&r);
    return h_summary();
}
