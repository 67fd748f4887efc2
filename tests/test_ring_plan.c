/*
 * test_ring_plan.c: the public rule queries against brute force written here from the
 * documents, not from the library:
 *  1. fa_forward_band: each row's [lo, hi] against the keys docs/semantics.md's band
 *     keeps, pair by pair (causal both ways, windows, q_start/k_start, Sq != Sk,
 *     varlen per sequence); the band is one interval; misuse statuses;
 *  2. the ring planner: fa_ring_placement covers the sequence once, in the header's
 *     order; every (query, key) pair the whole sequence's band keeps is computed by
 *     exactly one piece of one step of one rank, and no other pair is, with each
 *     piece's placement (q_start, k_start, causal) keeping exactly the global pairs
 *     of its rows and keys and its kept count theirs; diagonal pieces hold each row
 *     once; row pieces as many as asked; fa_ring_split's cut; whole shards;
 *  3. the agreement: descriptors that agree, one that fails, fields that differ;
 *     fa_ring_check's verdicts; misuse statuses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static fa_context *g_ctx;
static h_rng g_rng;
static float g_never[1];

/* Whether a call keeps key j for query row i (docs/semantics.md, sections 3-4). */
static int call_keeps(fa_causal causal, int64_t wl, int64_t wr, int64_t qs, int64_t ks, int64_t sq, int64_t sk,
                      int64_t i, int64_t j)
{
    const int64_t tl = i + qs - ks, diag = tl + sk - sq;
    if (causal == FA_CAUSAL_BOTTOM_RIGHT && j > diag) return 0;
    if (causal == FA_CAUSAL_TOP_LEFT && j > tl) return 0;
    if (wl >= 0 && diag - j > wl) return 0;
    if (wr >= 0 && j - diag > wr) return 0;
    return 1;
}

static int64_t rand_window(void)
{
    const int64_t k = h_rng_int(&g_rng, 0, 3);
    return k == 0 ? -1 : k == 1 ? h_rng_int(&g_rng, 0, 3) : h_rng_int(&g_rng, 0, 12);
}

/* ------------------------------------------------------------------ band */

static void check_rows(const fa_forward_args *a, int64_t seq, int64_t sq, int64_t sk)
{
    for (int64_t i = 0; i < sq; i++) {
        int64_t lo = -7, hi = -7, first = -1, last = -2, count = 0;
        const fa_status st = fa_forward_band(g_ctx, a, seq, i, &lo, &hi);
        if (!CHECK(st == FA_OK, "row %lld: %s", (long long)i, fa_context_error(g_ctx))) return;
        for (int64_t j = 0; j < sk; j++)
            if (call_keeps(a->causal, a->window_left, a->window_right, a->q_start, a->k_start, sq, sk, i, j)) {
                if (first < 0) first = j;
                last = j;
                count++;
            }
        CHECK(count == 0 || count == last - first + 1, "row %lld: the kept keys are not one interval", (long long)i);
        if (count == 0)
            CHECK(lo > hi, "row %lld keeps nothing, but the band is [%lld, %lld]", (long long)i, (long long)lo,
                  (long long)hi);
        else
            CHECK(lo == first && hi == last, "row %lld: band [%lld, %lld], brute force [%lld, %lld]", (long long)i,
                  (long long)lo, (long long)hi, (long long)first, (long long)last);
    }
}

static void test_band_dense(void)
{
    for (int round = 0; round < h_scaled(300); round++) {
        const int64_t sq = h_rng_int(&g_rng, 1, 24), sk = h_rng_int(&g_rng, 0, 24);
        fa_forward_args a = FA_FORWARD_ARGS_INIT;
        a.q = fa_tensor_make(g_never, FA_DTYPE_F32, FA_LAYOUT_BSND, 2, sq, 1, 1);
        a.k = fa_tensor_make(g_never, FA_DTYPE_F32, FA_LAYOUT_BSND, 2, sk, 1, 1);
        a.v = a.k;
        a.o = a.q;
        a.causal = (fa_causal)h_rng_int(&g_rng, 0, 2);
        a.window_left = rand_window();
        a.window_right = rand_window();
        if (h_rng_int(&g_rng, 0, 1)) a.q_start = h_rng_int(&g_rng, 0, 30), a.k_start = h_rng_int(&g_rng, 0, 30);
        h_case("band dense Sq %lld Sk %lld causal %d window (%lld, %lld) starts (%lld, %lld)", (long long)sq,
               (long long)sk, (int)a.causal, (long long)a.window_left, (long long)a.window_right,
               (long long)a.q_start, (long long)a.k_start);
        check_rows(&a, h_rng_int(&g_rng, 0, 1), sq, sk);
    }
    h_case("band misuse");
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = fa_tensor_make(g_never, FA_DTYPE_F32, FA_LAYOUT_BSND, 2, 4, 1, 1);
    a.k = a.v = a.o = a.q;
    int64_t lo = 0, hi = 0;
    CHECK(fa_forward_band(g_ctx, &a, 2, 0, &lo, &hi) == FA_ERR_OUT_OF_RANGE, "sequence 2 of 2");
    CHECK(fa_forward_band(g_ctx, &a, 0, 4, &lo, &hi) == FA_ERR_OUT_OF_RANGE, "row 4 of 4");
    CHECK(fa_forward_band(g_ctx, &a, 0, -1, &lo, &hi) == FA_ERR_OUT_OF_RANGE, "row -1");
    CHECK(fa_forward_band(g_ctx, &a, 0, 0, NULL, &hi) == FA_ERR_NULL_POINTER, "lo NULL");
    CHECK(fa_forward_band(NULL, &a, 0, 0, &lo, &hi) == FA_ERR_NULL_CONTEXT, "no context");
    a.window_left = -3;
    CHECK(fa_forward_band(g_ctx, &a, 0, 0, &lo, &hi) == FA_ERR_INVALID_ARGUMENT && fa_context_error(g_ctx)[0],
          "a window the core refuses: its status and message");
}

static void test_band_varlen(void)
{
    for (int round = 0; round < h_scaled(60); round++) {
        enum { NSEQ = 4 };
        int32_t cu_q[NSEQ + 1] = {0}, cu_k[NSEQ + 1] = {0};
        for (int b = 0; b < NSEQ; b++) {
            cu_q[b + 1] = cu_q[b] + (int32_t)h_rng_int(&g_rng, 0, 9);
            cu_k[b + 1] = cu_k[b] + (int32_t)h_rng_int(&g_rng, 0, 9);
        }
        fa_forward_args a = FA_FORWARD_ARGS_INIT;
        a.q = fa_tensor_make(g_never, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, cu_q[NSEQ], 1, 1);
        a.k = fa_tensor_make(g_never, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, cu_k[NSEQ], 1, 1);
        a.v = a.k;
        a.o = a.q;
        a.cu_seqlens_q = cu_q;
        a.cu_seqlens_k = cu_k;
        a.num_seqs = NSEQ;
        a.causal = (fa_causal)h_rng_int(&g_rng, 0, 2);
        a.window_left = rand_window();
        a.window_right = rand_window();
        h_case("band varlen round %d causal %d window (%lld, %lld)", round, (int)a.causal, (long long)a.window_left,
               (long long)a.window_right);
        for (int b = 0; b < NSEQ; b++) check_rows(&a, b, cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]);
        int64_t lo, hi;
        CHECK(fa_forward_band(g_ctx, &a, NSEQ, 0, &lo, &hi) == FA_ERR_OUT_OF_RANGE, "sequence past the last");
    }
}

/* ------------------------------------------------------------ the planner */

typedef struct ring_case {
    int P;
    int64_t S[6];
    fa_ring_sharding sharding;
    int causal;      /* the global rule: j <= i */
    int64_t wl, wr;  /* global window: i - wl <= j <= i + wr */
    int alibi, dropout, pieces, whole;
} ring_case;

/* Whether the whole sequence keeps key position j for query position i. */
static int global_keeps(const ring_case *c, int64_t i, int64_t j)
{
    if (c->causal && j > i) return 0;
    if (c->wl >= 0 && i - j > c->wl) return 0;
    if (c->wr >= 0 && j - i > c->wr) return 0;
    return 1;
}

/* Global position of local row i of rank r, from the header's definition. */
static int64_t global_pos(const ring_case *c, int r, int64_t i)
{
    int64_t before = 0;
    if (c->sharding == FA_RING_CONTIGUOUS) {
        for (int x = 0; x < r; x++) before += c->S[x];
        return before + i;
    }
    const int64_t half = c->S[r] / 2;
    if (i < half) {
        for (int x = 0; x < r; x++) before += c->S[x] / 2;
        return before + i;
    }
    for (int x = 0; x < c->P; x++) before += c->S[x] / 2;
    for (int x = c->P - 1; x > r; x--) before += c->S[x] / 2;
    return before + i - half;
}

static void plan_of(const ring_case *c, int rank, const fa_forward_args *call, fa_ring_plan *pl)
{
    fa_ring_plan init = FA_RING_PLAN_INIT;
    *pl = init;
    pl->nranks = c->P;
    pl->rank = rank;
    pl->lengths = c->S;
    pl->sharding = c->sharding;
    pl->call = call;
    pl->pieces = c->pieces;
    pl->whole_shards = c->whole;
}

static void check_placement(const ring_case *c, const fa_ring_plan *pl, int64_t N)
{
    char *seen = calloc((size_t)N + 1, 1);
    for (int r = 0; r < c->P; r++) {
        fa_ring_segment seg[2];
        int n = 0;
        if (!CHECK(fa_ring_placement(NULL, pl, r, seg, &n) == FA_OK, "placement of rank %d", r)) break;
        CHECK(n == (c->sharding == FA_RING_ZIGZAG ? 2 : 1), "rank %d: %d segments", r, n);
        int64_t rows = 0;
        for (int k = 0; k < n; k++) {
            CHECK(seg[k].off == rows, "rank %d segment %d starts at row %lld", r, k, (long long)seg[k].off);
            for (int64_t i = 0; i < seg[k].len; i++) {
                const int64_t p = seg[k].pos + i;
                CHECK(p == global_pos(c, r, rows + i), "rank %d row %lld at %lld, the header says %lld", r,
                      (long long)(rows + i), (long long)p, (long long)global_pos(c, r, rows + i));
                if (p >= 0 && p < N) seen[p]++;
            }
            rows += seg[k].len;
        }
        CHECK(rows == c->S[r], "rank %d: its segments hold %lld rows, not %lld", r, (long long)rows,
              (long long)c->S[r]);
    }
    for (int64_t p = 0; p < N; p++) CHECK(seen[p] == 1, "position %lld is held %d times", (long long)p, seen[p]);
    free(seen);
}

/* A piece's call keeps exactly the global pairs of its rows and keys (when positions
 * are read), and its count is theirs; marks them in `hits` (N x N). */
static void check_piece(const ring_case *c, int r, int src, const fa_ring_piece *pc, int reads_positions,
                        int64_t N, int *hits)
{
    int64_t kept = 0, mismatched = 0;
    for (int64_t i = 0; i < pc->rows; i++)
        for (int64_t j = 0; j < pc->keys; j++) {
            const int64_t gi = global_pos(c, r, pc->q_row + i), gj = global_pos(c, src, pc->k_row + j);
            const int call = call_keeps(pc->causal, c->wl, c->wr, pc->q_start, pc->k_start, pc->rows, pc->keys, i, j);
            const int whole = global_keeps(c, gi, gj);
            kept += call;
            if (call != whole) mismatched++;
            if (call && gi >= 0 && gi < N && gj >= 0 && gj < N) hits[gi * N + gj]++;
        }
    CHECK(mismatched == 0, "rank %d piece rows %lld+%lld keys %lld+%lld: %lld pairs differ from the whole's", r,
          (long long)pc->q_row, (long long)pc->rows, (long long)pc->k_row, (long long)pc->keys,
          (long long)mismatched);
    CHECK(pc->kept == kept, "piece kept %lld, brute force %lld", (long long)pc->kept, (long long)kept);
    if (reads_positions)
        CHECK(pc->q_pos == global_pos(c, r, pc->q_row) && pc->k_pos == global_pos(c, src, pc->k_row),
              "piece positions (%lld, %lld)", (long long)pc->q_pos, (long long)pc->k_pos);
}

/* Every rank's every step: the pieces compute each kept pair once and nothing else. */
static void check_steps(const ring_case *c, const fa_forward_args *call, int64_t N)
{
    const int reads_positions = !c->whole || c->causal || c->wl >= 0 || c->wr >= 0 || c->alibi || c->dropout;
    const int band_offsets = c->wl >= 0 || c->wr >= 0 || c->alibi;
    const int per_block = band_offsets && c->dropout ? 1 : c->pieces ? c->pieces : 1;
    int *hits = calloc((size_t)(N * N) + 1, sizeof(int));
    fa_ring_piece pcs[4 * 8];
    for (int r = 0; r < c->P; r++) {
        fa_ring_plan pl;
        plan_of(c, r, call, &pl);
        int *diag = calloc((size_t)c->S[r] + 1, sizeof(int));
        for (int s = 0; s < c->P; s++) {
            const int src = (r - s + c->P) % c->P;
            int n = -1;
            const fa_status st = fa_ring_step(g_ctx, &pl, s, pcs, 4 * 8, &n);
            if (!CHECK(st == FA_OK, "rank %d step %d: %s", r, s, fa_context_error(g_ctx))) continue;
            CHECK(n <= 4 * per_block, "rank %d step %d: %d pieces for %d per block", r, s, n, per_block);
            int64_t total = 0;
            for (int p = 0; p < n; p++) {
                CHECK(pcs[p].kept > 0, "a piece that keeps nothing");
                check_piece(c, r, src, &pcs[p], reads_positions, N, hits);
                total += pcs[p].kept;
                for (int64_t i = 0; pcs[p].diagonal && i < pcs[p].rows; i++) diag[pcs[p].q_row + i]++;
                CHECK(!pcs[p].diagonal || s == 0, "a diagonal piece at step %d", s);
            }
            /* the split: the fewest leading pieces with at least half the pairs */
            const int cut = fa_ring_split(pcs, n);
            int64_t head = 0;
            for (int p = 0; p < cut; p++) head += pcs[p].kept;
            CHECK(2 * head >= total && (cut == 0 || 2 * (head - pcs[cut - 1].kept) < total),
                  "fa_ring_split cut %d of %d", cut, n);
            if (n > 1) {
                int m = -1;
                CHECK(fa_ring_step(g_ctx, &pl, s, pcs, n - 1, &m) == FA_ERR_OUT_OF_RANGE && m == n,
                      "a capacity of %d for %d pieces", n - 1, n);
            }
        }
        for (int64_t i = 0; i < c->S[r]; i++)
            CHECK(diag[i] == 1, "rank %d row %lld in %d diagonal pieces", r, (long long)i, diag[i]);
        free(diag);
    }
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < N; j++)
            CHECK(hits[i * N + j] == global_keeps(c, i, j), "pair (%lld, %lld) computed %d times", (long long)i,
                  (long long)j, hits[i * N + j]);
    free(hits);
}

static void test_planner(void)
{
    for (int round = 0; round < h_scaled(400); round++) {
        ring_case c;
        memset(&c, 0, sizeof c);
        c.P = (int)h_rng_int(&g_rng, 1, 5);
        c.sharding = h_rng_int(&g_rng, 0, 1) ? FA_RING_ZIGZAG : FA_RING_CONTIGUOUS;
        const int equal = (int)h_rng_int(&g_rng, 0, 1);
        const int64_t s0 = h_rng_int(&g_rng, 0, 5);
        int64_t N = 0;
        for (int r = 0; r < c.P; r++) {
            int64_t s = equal ? s0 : h_rng_int(&g_rng, 0, 5);
            if (c.sharding == FA_RING_ZIGZAG) s *= 2;
            c.S[r] = s;
            N += s;
        }
        c.causal = (int)h_rng_int(&g_rng, 0, 1);
        c.wl = rand_window();
        c.wr = c.causal ? (h_rng_int(&g_rng, 0, 1) ? 0 : -1) : rand_window();
        c.alibi = (int)h_rng_int(&g_rng, 0, 3) == 0;
        c.dropout = equal && h_rng_int(&g_rng, 0, 3) == 0;
        c.pieces = (int)h_rng_int(&g_rng, 0, 7);
        c.whole = (int)h_rng_int(&g_rng, 0, 1);
        static const float slopes[1] = {0.5f};
        fa_forward_args call = FA_FORWARD_ARGS_INIT;
        call.causal = c.causal ? (h_rng_int(&g_rng, 0, 1) ? FA_CAUSAL_TOP_LEFT : FA_CAUSAL_BOTTOM_RIGHT)
                               : FA_CAUSAL_NONE;
        call.window_left = c.wl;
        call.window_right = c.wr;
        call.alibi_slopes = c.alibi ? slopes : NULL;
        call.dropout_p = c.dropout ? 0.25f : 0.0f;
        h_case("planner round %d: P %d %s S0 %lld%s causal %d window (%lld, %lld) alibi %d dropout %d pieces %d "
               "whole %d",
               round, c.P, c.sharding == FA_RING_ZIGZAG ? "zig-zag" : "contiguous", (long long)c.S[0],
               equal ? "" : " (unequal)", c.causal, (long long)c.wl, (long long)c.wr, c.alibi, c.dropout, c.pieces,
               c.whole);
        fa_ring_plan pl;
        plan_of(&c, 0, &call, &pl);
        check_placement(&c, &pl, N);
        check_steps(&c, &call, N);
    }
}

static void test_planner_misuse(void)
{
    h_case("planner misuse");
    int64_t S[3] = {4, 4, 4};
    fa_forward_args call = FA_FORWARD_ARGS_INIT;
    fa_ring_plan pl = FA_RING_PLAN_INIT;
    pl.nranks = 3, pl.rank = 1, pl.lengths = S, pl.call = &call;
    fa_ring_piece pcs[8];
    fa_ring_segment seg[2];
    int n = 0;
    CHECK(fa_ring_step(g_ctx, &pl, 3, pcs, 8, &n) == FA_ERR_OUT_OF_RANGE, "step 3 of 3");
    CHECK(fa_ring_step(NULL, &pl, 0, pcs, 8, &n) == FA_ERR_NULL_CONTEXT, "no context");
    CHECK(fa_ring_step(g_ctx, NULL, 0, pcs, 8, &n) == FA_ERR_NULL_POINTER, "no plan");
    CHECK(fa_ring_placement(g_ctx, &pl, 3, seg, &n) == FA_ERR_OUT_OF_RANGE, "rank 3 of 3");
    fa_ring_plan bad = pl;
    bad.rank = 3;
    CHECK(fa_ring_step(g_ctx, &bad, 0, pcs, 8, &n) == FA_ERR_INVALID_ARGUMENT, "plan rank 3 of 3");
    bad = pl, bad.sharding = (fa_ring_sharding)7;
    CHECK(fa_ring_placement(g_ctx, &bad, 0, seg, &n) == FA_ERR_INVALID_ARGUMENT, "sharding 7");
    bad = pl, bad.pieces = 1025;
    CHECK(fa_ring_step(g_ctx, &bad, 0, pcs, 8, &n) == FA_ERR_INVALID_ARGUMENT, "1025 pieces");
    int64_t odd[3] = {4, 3, 4};
    bad = pl, bad.lengths = odd, bad.sharding = FA_RING_ZIGZAG;
    CHECK(fa_ring_placement(g_ctx, &bad, 0, seg, &n) == FA_ERR_INVALID_DIM && fa_context_error(g_ctx)[0],
          "an odd zig-zag shard");
    bad = pl, bad.lengths = NULL;
    CHECK(fa_ring_step(g_ctx, &bad, 0, pcs, 8, &n) == FA_ERR_NULL_POINTER, "no lengths");
    bad = pl, bad.call = NULL;
    CHECK(fa_ring_step(g_ctx, &bad, 0, pcs, 8, &n) == FA_ERR_NULL_POINTER, "no call");
    bad = pl, bad.struct_size = 3;
    CHECK(fa_ring_step(g_ctx, &bad, 0, pcs, 8, &n) == FA_ERR_STRUCT_SIZE, "struct_size 3");
    fa_ring_piece one;
    CHECK(fa_ring_block(g_ctx, &pl, -1, 2, 0, 2, &one) == FA_ERR_OUT_OF_RANGE, "a block at -1");
    call.window_left = -5;
    CHECK(fa_ring_block(g_ctx, &pl, 0, 2, 0, 2, &one) == FA_ERR_INVALID_ARGUMENT, "a window the core refuses");
    CHECK(fa_ring_split(NULL, 3) == 0, "split of nothing");
}

/* ------------------------------------------------------------ agreement */

static void test_agreement(void)
{
    h_case("agreement");
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = fa_tensor_make(g_never, FA_DTYPE_BF16, FA_LAYOUT_BSND, 2, 8, 4, 16);
    a.k = fa_tensor_make(g_never, FA_DTYPE_BF16, FA_LAYOUT_BSND, 2, 8, 2, 16);
    a.v = fa_tensor_make(g_never, FA_DTYPE_BF16, FA_LAYOUT_BSND, 2, 8, 2, 8);
    a.o = fa_tensor_make(g_never, FA_DTYPE_BF16, FA_LAYOUT_BSND, 2, 8, 4, 8);
    a.causal = FA_CAUSAL_TOP_LEFT;
    fa_ring_plan pl = FA_RING_PLAN_INIT;
    pl.nranks = 3, pl.call = &a, pl.sharding = FA_RING_ZIGZAG, pl.pieces = 4;
    enum { F = FA_RING_AGREE_FIELDS };
    int64_t all[3 * F];
    for (int r = 0; r < 3; r++) fa_ring_describe(&pl, FA_OK, 5, all + r * F);
    CHECK(all[FA_RING_AGREE_S_LOCAL] == 8 && all[FA_RING_AGREE_STATUS] == FA_OK, "the descriptor's S_local");
    int who = 9, field = 9;
    CHECK(fa_ring_verdict(3, all, &who, &field) == FA_OK && who == -1 && field == -1, "three alike agree");
    all[2 * F + FA_RING_AGREE_S_LOCAL] = 6;
    CHECK(fa_ring_verdict(3, all, &who, &field) == FA_OK, "shard lengths may differ");
    /* a bottom-right rank agrees with top-left ones: over one sequence they are one rule */
    a.causal = FA_CAUSAL_BOTTOM_RIGHT;
    fa_ring_describe(&pl, FA_OK, 5, all + F);
    CHECK(fa_ring_verdict(3, all, &who, &field) == FA_OK, "either causal alignment");
    a.window_left = 3;
    fa_ring_describe(&pl, FA_OK, 5, all + F);
    CHECK(fa_ring_verdict(3, all, &who, &field) == FA_ERR_INVALID_ARGUMENT && who == 1 &&
              strcmp(fa_ring_agreement_name(field), "window_left") == 0,
          "a window on rank 1 only: who %d field %d", who, field);
    a.window_left = -1;
    a.q.shape[2] = 8;
    fa_ring_describe(&pl, FA_OK, 5, all + F);
    CHECK(fa_ring_verdict(3, all, &who, &field) == FA_ERR_SHAPE_MISMATCH && who == 1 &&
              strcmp(fa_ring_agreement_name(field), "Hq") == 0,
          "heads on rank 1");
    a.q.shape[2] = 4;
    fa_ring_describe(&pl, FA_OK, 5, all + F);
    fa_ring_describe(&pl, FA_OK, 1, all + 2 * F);
    CHECK(fa_ring_verdict(3, all, &who, &field) == FA_ERR_INVALID_ARGUMENT && who == 2 &&
              strcmp(fa_ring_agreement_name(field), "gradients") == 0,
          "the driver's own value on rank 2");
    fa_ring_describe(&pl, FA_ERR_DTYPE, 5, all + 2 * F);
    fa_ring_describe(&pl, FA_ERR_NULL_CONTEXT, 5, all + F);
    CHECK(fa_ring_verdict(3, all, &who, &field) == FA_ERR_NULL_CONTEXT && who == 1 && field == -1,
          "the lowest failing rank's status");
    CHECK(fa_ring_agreement_name(F)[0] == '\0' && fa_ring_agreement_name(-1)[0] == '\0', "names out of range");

    h_case("fa_ring_check");
    int64_t S[3] = {8, 8, 8};
    pl.lengths = S;
    a.q.shape[2] = 4;
    CHECK(fa_ring_check(g_ctx, &pl) == FA_OK, "a good ring: %s", fa_context_error(g_ctx));
    static const float slopes[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    a.alibi_slopes = slopes;
    a.dropout_p = 0.1f;
    CHECK(fa_ring_check(g_ctx, &pl) == FA_OK, "ALiBi with dropout, equal lengths");
    S[1] = 6;
    CHECK(fa_ring_check(g_ctx, &pl) == FA_ERR_UNSUPPORTED, "ALiBi with dropout, unequal lengths");
    a.alibi_slopes = NULL;
    CHECK(fa_ring_check(g_ctx, &pl) == FA_OK, "dropout alone, unequal lengths");
    S[1] = 7;
    CHECK(fa_ring_check(g_ctx, &pl) == FA_ERR_INVALID_DIM, "an odd zig-zag shard");
    S[1] = FA_POSITION_MAX / 2 + 2, S[2] = FA_POSITION_MAX / 2;
    pl.sharding = FA_RING_CONTIGUOUS;
    CHECK(fa_ring_check(g_ctx, &pl) != FA_OK && fa_context_error(g_ctx)[0], "a sequence past FA_POSITION_MAX: %s",
          fa_context_error(g_ctx));
}

int main(void)
{
    h_rng_seed(&g_rng, h_env_u64("FA_TEST_SEED", 31));
    h_case("setup");
    const fa_status created = h_context_create(&g_ctx);
    if (!CHECK(created == FA_OK && g_ctx, "fa_context_create: %s", fa_status_string(created))) return h_summary();
    test_band_dense();
    test_band_varlen();
    test_planner();
    test_planner_misuse();
    test_agreement();
    fa_context_free(g_ctx);
    return h_summary();
}
