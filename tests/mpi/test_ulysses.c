/*
 * test_ulysses.c: Ulysses attention over MPI (fa_ulysses_forward / _backward,
 * include/flashattn_mpi.h), run by ctest as `mpirun --oversubscribe -np N
 * test_ulysses` for N = 1, 2, 4.
 *
 * Every rank builds the same full problem from one seed, takes its rows by the
 * header's sharding rule (restated here, not the library's helpers), runs Ulysses,
 * and compares its rows of o, lse, dq, dk, dv and the whole dsinks with one
 * process's fa_forward / fa_backward on the full tensors, restricted to those rows:
 * each head of a Ulysses call is one core call over the whole sequence, as in one
 * process, so they must agree bit for bit. The matrix: both shardings, causal both
 * ways and not, windows, ALiBi, softcap, sinks, GQA, f32 and bf16 inputs, f32
 * outputs, gradients in o's dtype (f32 or bf16), BNSD shards, unequal shard lengths,
 * B = 2. Then the agreement: heads not divisible by the ranks, dropout, ranks that
 * disagree, and a core failure on one rank (the fault hook) give every rank the same
 * status and leave the outputs untouched.
 */
#include <mpi.h>

#include "flashattn_mpi.h"
#include "harness.h"
#include "ring_internal.h" /* the fault hook only: ring_fault_step */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static fa_context *g_ctx;
static int g_rank, g_P;

typedef struct ucase {
    const char *name;
    fa_ring_sharding sharding;
    fa_causal causal;
    int64_t wl, wr;
    int alibi, softcap, sinks, bnsd, unequal;
    int64_t B, S, hq, hk, D, Dv; /* S: rows per rank; hq, hk: heads per rank */
    fa_dtype dt, odt;
} ucase;

static int64_t rows_of_rank(const ucase *c, int r)
{
    const int64_t s = c->unequal ? c->S + 2 * r : c->S;
    return c->sharding == FA_RING_ZIGZAG ? 2 * ((s + 1) / 2) : s;
}

/* Global position of local row i of rank r, by the header's sharding rule. */
static int64_t position(const ucase *c, int r, int64_t i)
{
    int64_t p = 0;
    if (c->sharding == FA_RING_CONTIGUOUS) {
        for (int x = 0; x < r; x++) p += rows_of_rank(c, x);
        return p + i;
    }
    const int64_t half = rows_of_rank(c, r) / 2;
    if (i < half) {
        for (int x = 0; x < r; x++) p += rows_of_rank(c, x) / 2;
        return p + i;
    }
    for (int x = 0; x < g_P; x++) p += rows_of_rank(c, x) / 2; /* every first chunk */
    for (int x = g_P - 1; x > r; x--) p += rows_of_rank(c, x) / 2;
    return p + (i - half);
}

static fa_tensor tensor(const ucase *c, fa_dtype dt, int64_t B, int64_t S, int64_t H, int64_t X)
{
    fa_tensor t = h_alloc(dt, B, S, H, X);
    return c->bnsd ? fa_tensor_make(t.data, dt, FA_LAYOUT_BNSD, B, S, H, X) : t;
}

/* My rows of full (seq axis `ax`: 1, or 2 for lse) against local: copied into it
 * (take), or the elements that differ counted (NaN equals NaN). */
static int64_t my_rows(const ucase *c, const fa_tensor *full, const fa_tensor *local, int ax, int take)
{
    int64_t n = 0;
    for (int64_t b = 0; b < local->shape[0]; b++)
        for (int64_t i = 0; i < local->shape[1]; i++)
            for (int64_t j = 0; j < local->shape[2]; j++)
                for (int64_t x = 0; x < local->shape[3]; x++) {
                    const int64_t g = position(c, g_rank, ax == 1 ? i : j);
                    const double want = ax == 1 ? h_get(full, b, g, j, x) : h_get(full, b, i, g, x);
                    if (take) {
                        h_set(local, b, i, j, x, want);
                        continue;
                    }
                    const double got = h_get(local, b, i, j, x);
                    n += !(got == want || (isnan(got) && isnan(want)));
                }
    return n;
}

static void take(const ucase *c, const fa_tensor *full, const fa_tensor *local, int ax)
{
    my_rows(c, full, local, ax, 1);
}

static int64_t differ(const ucase *c, const fa_tensor *full, const fa_tensor *local, int ax)
{
    return my_rows(c, full, local, ax, 0);
}

static const float g_slopes[16] = {0.05f, 0.1f, 0.15f, 0.2f, 0.25f, 0.3f, 0.35f, 0.4f,
                                   0.45f, 0.5f, 0.55f, 0.6f, 0.65f, 0.7f, 0.75f, 0.8f};
static const float g_sinks[16] = {0.7f, -INFINITY, 2.5f, -1.0f, 0.25f, 1.5f, -0.5f, 3.0f,
                                  0.7f, -INFINITY, 2.5f, -1.0f, 0.25f, 1.5f, -0.5f, 3.0f};

static void options(const ucase *c, fa_forward_args *a)
{
    a->causal = c->causal;
    a->window_left = c->wl;
    a->window_right = c->wr;
    if (c->alibi) a->alibi_slopes = g_slopes;
    if (c->softcap) a->softcap = 4.0f;
    if (c->sinks) a->sinks = g_sinks;
}

static void run_case(const ucase *c)
{
    h_case("%s, %d ranks", c->name, g_P);
    const int64_t B = c->B, Hq = c->hq * g_P, Hk = c->hk * g_P, D = c->D, Dv = c->Dv, Sl = rows_of_rank(c, g_rank);
    int64_t N = 0;
    for (int x = 0; x < g_P; x++) N += rows_of_rank(c, x);
    h_rng rng;
    h_rng_seed(&rng, 4242 + (uint64_t)N);
    /* one process on the whole sequence */
    fa_forward_args fa = FA_FORWARD_ARGS_INIT;
    fa.q = h_alloc(c->dt, B, N, Hq, D), fa.k = h_alloc(c->dt, B, N, Hk, D), fa.v = h_alloc(c->dt, B, N, Hk, Dv);
    fa.o = h_alloc(c->odt, B, N, Hq, Dv), fa.lse = h_alloc(FA_DTYPE_F32, B, Hq, N, 1);
    fa_tensor dO = h_alloc(c->dt, B, N, Hq, Dv);
    h_fill_normal(&fa.q, &rng, 1.0), h_fill_normal(&fa.k, &rng, 1.0), h_fill_normal(&fa.v, &rng, 1.0);
    h_fill_normal(&dO, &rng, 1.0);
    options(c, &fa);
    fa_backward_args fg = FA_BACKWARD_ARGS_INIT;
    float dsinks_full[16] = {0}, dsinks[16];
    fg.fwd = &fa, fg.do_ = dO;
    fg.dq = h_alloc(c->odt, B, N, Hq, D), fg.dk = h_alloc(c->odt, B, N, Hk, D); /* gradients in o's dtype */
    fg.dv = h_alloc(c->odt, B, N, Hk, Dv);
    if (c->sinks) fg.dsinks = dsinks_full;
    fa_status st = fa_forward(g_ctx, &fa);
    if (st == FA_OK) st = fa_backward(g_ctx, &fg);
    CHECK(st == FA_OK, "%s: one process: %s", c->name, fa_context_error(g_ctx));
    /* this rank's shards */
    fa_forward_args la = FA_FORWARD_ARGS_INIT;
    la.q = tensor(c, c->dt, B, Sl, Hq, D), la.k = tensor(c, c->dt, B, Sl, Hk, D), la.v = tensor(c, c->dt, B, Sl, Hk, Dv);
    la.o = tensor(c, c->odt, B, Sl, Hq, Dv), la.lse = h_alloc(FA_DTYPE_F32, B, Hq, Sl, 1);
    take(c, &fa.q, &la.q, 1), take(c, &fa.k, &la.k, 1), take(c, &fa.v, &la.v, 1);
    options(c, &la);
    fa_tensor ldo = tensor(c, c->dt, B, Sl, Hq, Dv);
    take(c, &dO, &ldo, 1);
    fa_ring_args ring = FA_RING_ARGS_INIT;
    ring.sharding = c->sharding;
    st = fa_ulysses_forward(g_ctx, MPI_COMM_WORLD, &ring, &la);
    CHECK(st == FA_OK, "%s: fa_ulysses_forward: %s: %s", c->name, fa_status_string(st), fa_ring_error());
    CHECK(differ(c, &fa.o, &la.o, 1) == 0, "%s: o differs from one process's", c->name);
    CHECK(differ(c, &fa.lse, &la.lse, 2) == 0, "%s: lse differs from one process's", c->name);
    fa_backward_args lg = FA_BACKWARD_ARGS_INIT;
    lg.fwd = &la, lg.do_ = ldo;
    lg.dq = tensor(c, c->odt, B, Sl, Hq, D), lg.dk = tensor(c, c->odt, B, Sl, Hk, D);
    lg.dv = tensor(c, c->odt, B, Sl, Hk, Dv);
    if (c->sinks) lg.dsinks = dsinks;
    st = fa_ulysses_backward(g_ctx, MPI_COMM_WORLD, &ring, &lg);
    CHECK(st == FA_OK, "%s: fa_ulysses_backward: %s: %s", c->name, fa_status_string(st), fa_ring_error());
    CHECK(differ(c, &fg.dq, &lg.dq, 1) == 0, "%s: dq differs from one process's", c->name);
    CHECK(differ(c, &fg.dk, &lg.dk, 1) == 0, "%s: dk differs from one process's", c->name);
    CHECK(differ(c, &fg.dv, &lg.dv, 1) == 0, "%s: dv differs from one process's", c->name);
    if (c->sinks) CHECK(memcmp(dsinks, dsinks_full, sizeof(float) * (size_t)Hq) == 0, "%s: dsinks differ", c->name);
    fa_tensor all[] = {fa.q, fa.k, fa.v, fa.o, fa.lse, dO, fg.dq, fg.dk, fg.dv, la.q, la.k, la.v, la.o, la.lse, ldo,
                       lg.dq, lg.dk, lg.dv};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) free(all[k].data);
}

/* Every rank gets `want`, and o is untouched. */
static void expect_refusal(const char *what, fa_forward_args *la, fa_status want)
{
    h_case("agreement: %s, %d ranks", what, g_P);
    h_fill(&la->o, 7.0);
    fa_ring_args ring = FA_RING_ARGS_INIT;
    const fa_status st = fa_ulysses_forward(g_ctx, MPI_COMM_WORLD, &ring, la);
    int mine = (int)st, lo = 0, hi = 0;
    MPI_Allreduce(&mine, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    CHECK(st == want && lo == hi, "%s: %s (want %s): %s", what, fa_status_string(st), fa_status_string(want),
          fa_ring_error());
    CHECK(fa_ring_error()[0] != '\0', "%s: no message", what);
    CHECK(h_get(&la->o, 0, 0, 0, 0) == 7.0, "%s: o was written", what);
}

static void test_errors(void)
{
    const int64_t S = 4, H = 2 * g_P, D = 8;
    fa_forward_args la = FA_FORWARD_ARGS_INIT;
    la.q = h_alloc(FA_DTYPE_F32, 1, S, H, D), la.k = h_alloc(FA_DTYPE_F32, 1, S, H, D);
    la.v = h_alloc(FA_DTYPE_F32, 1, S, H, D), la.o = h_alloc(FA_DTYPE_F32, 1, S, H, D);
    h_fill(&la.q, 0.5), h_fill(&la.k, 0.25), h_fill(&la.v, 1.0);
    if (g_P > 1) {
        fa_forward_args odd = la;
        odd.q.shape[2] = odd.o.shape[2] = odd.k.shape[2] = odd.v.shape[2] = H + 1;
        odd.q = h_alloc(FA_DTYPE_F32, 1, S, H + 1, D), odd.k = h_alloc(FA_DTYPE_F32, 1, S, H + 1, D);
        odd.v = h_alloc(FA_DTYPE_F32, 1, S, H + 1, D), odd.o = h_alloc(FA_DTYPE_F32, 1, S, H + 1, D);
        h_fill(&odd.q, 0.5), h_fill(&odd.k, 0.25), h_fill(&odd.v, 1.0);
        expect_refusal("heads not divisible by the ranks", &odd, FA_ERR_INVALID_ARGUMENT);
        free(odd.q.data), free(odd.k.data), free(odd.v.data), free(odd.o.data);
    }
    fa_forward_args drop = la;
    drop.dropout_p = 0.1f;
    expect_refusal("dropout", &drop, FA_ERR_UNSUPPORTED);
    /* a valid block mask of the whole local call, on the last rank: refused by all,
     * since its blocks would number a head group's sequence, not the call's */
    static const int64_t bm_offsets[2] = {0, 1};
    static const int32_t bm_kv[1] = {0};
    fa_block_mask bm = FA_BLOCK_MASK_INIT;
    bm.block_q = bm.block_k = S, bm.q_blocks = 1, bm.offsets = bm_offsets, bm.kv_blocks = bm_kv;
    fa_forward_args masked = la;
    if (g_rank == g_P - 1) masked.block_mask = &bm;
    expect_refusal("a block mask", &masked, FA_ERR_UNSUPPORTED);
    if (g_rank == g_P - 1)
        CHECK(strstr(fa_ring_error(), "block mask") != NULL && strstr(fa_ring_error(), "Ulysses") != NULL,
              "block mask: message %s", fa_ring_error());
    if (g_P > 1) {
        fa_forward_args dis = la;
        if (g_rank == g_P - 1) dis.causal = FA_CAUSAL_TOP_LEFT;
        expect_refusal("the last rank causal, the others not", &dis, FA_ERR_INVALID_ARGUMENT);
    }
    ring_fault_step = g_rank == 0 ? 0 : -1;
    expect_refusal("a core failure on rank 0", &la, FA_ERR_OUT_OF_MEMORY);
    ring_fault_step = -1;
    h_case("agreement: a good call after the refusals");
    fa_ring_args ring = FA_RING_ARGS_INIT;
    const fa_status st = fa_ulysses_forward(g_ctx, MPI_COMM_WORLD, &ring, &la);
    CHECK(st == FA_OK && fabs(h_get(&la.o, 0, 3, 0, 2) - 1.0) < 1e-6, "good call: %s (o = %g)", fa_ring_error(),
          h_get(&la.o, 0, 3, 0, 2));
    free(la.q.data), free(la.k.data), free(la.v.data), free(la.o.data);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_P);
    fa_status st = h_context_create(&g_ctx);
    CHECK(st == FA_OK, "context: %s", fa_status_string(st));
    fa_context_set(g_ctx, FA_PARAM_THREADS, 1);
    const fa_dtype F = FA_DTYPE_F32, BF = FA_DTYPE_BF16;
    const fa_causal NC = FA_CAUSAL_NONE, TL = FA_CAUSAL_TOP_LEFT, BR = FA_CAUSAL_BOTTOM_RIGHT;
    const fa_ring_sharding CT = FA_RING_CONTIGUOUS, ZZ = FA_RING_ZIGZAG;
    const ucase cases[] = {
        /* name                           shard causal wl  wr al sc sk bnsd uneq B  S  hq hk D   Dv  dt  odt */
        {"non-causal contiguous f32", CT, NC, -1, -1, 0, 0, 0, 0, 0, 2, 12, 2, 2, 16, 16, F, F},
        {"causal zig-zag f32 GQA", ZZ, TL, -1, -1, 0, 0, 0, 0, 0, 1, 12, 2, 1, 16, 16, F, F},
        {"causal bottom-right contiguous bf16, f32 out, BNSD", CT, BR, -1, -1, 0, 0, 0, 1, 0, 1, 16, 1, 1, 32, 32, BF,
         F},
        {"window+alibi+softcap zig-zag, Dv != D", ZZ, NC, 9, 4, 1, 1, 0, 0, 0, 1, 12, 2, 2, 16, 8, F, F},
        {"causal window contiguous, unequal shards", CT, TL, 6, 0, 0, 0, 0, 0, 1, 2, 5, 1, 1, 16, 16, F, F},
        {"sinks causal zig-zag bf16 GQA, unequal", ZZ, TL, -1, -1, 0, 0, 1, 0, 1, 1, 8, 2, 1, 16, 16, BF, BF},
        {"causal zig-zag f32, S_local 64", ZZ, TL, -1, -1, 0, 0, 0, 0, 0, 1, 64, 2, 1, 64, 64, F, F},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) run_case(&cases[k]);
    test_errors();
    fa_context_free(g_ctx);
    printf("rank %d of %d: ", g_rank, g_P);
    const int rc = h_summary();
    MPI_Finalize();
    return rc;
}
