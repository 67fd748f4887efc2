/*
 * test_planner.c: the task planner (src/tasks.c) against brute force.
 *
 *  - fa_key_block_rows (which query rows see a key block: the question a
 *    key-outer backward loop asks) and fa_task_columns (which keys a row block
 *    sees) equal a scan of fa_row_band over every row, for random lengths,
 *    causal alignments, windows and position offsets;
 *  - a plan covers every (sequence, query row, head, key) of the problem exactly
 *    once across its tasks and key chunks, with and without split-KV, on the wide
 *    and on the small-row path.
 * Internal functions: this program links the library's objects and sees src/.
 */
#include "harness.h"
#include "internal.h"
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

int main(void)
{
    h_rng r;
    h_rng_seed(&r, h_env_u64("FA_TEST_SEED", 91));
    test_band_questions(&r);
    test_plan_coverage(&r);
    return h_summary();
}
