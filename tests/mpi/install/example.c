/*
 * example.c: a user's program against an installed libflashattn_mpi, built by
 * run.sh through find_package(flashattn_mpi) and through pkg-config. Two ranks
 * run a causal zig-zag ring forward where every value row is (1 + its position),
 * so each output row is the mean of 1 + j over the keys it sees: the known answer
 * 1 + i / 2 for query position i.
 */
#include <flashattn_mpi.h>

#include <math.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, P;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    enum { S = 8, D = 4 };
    static float q[S * D], k[S * D], v[S * D], o[S * D];
    for (int i = 0; i < S; i++)
        for (int x = 0; x < D; x++) v[i * D + x] = 1.0f + (float)fa_ring_position(FA_RING_ZIGZAG, rank, P, S, i);
    fa_context *ctx = NULL;
    fa_context_create(&ctx);
    fa_context_set(ctx, FA_PARAM_THREADS, 1);
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = fa_tensor_make(q, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, S, 1, D);
    a.k = fa_tensor_make(k, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, S, 1, D);
    a.v = fa_tensor_make(v, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, S, 1, D);
    a.o = fa_tensor_make(o, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, S, 1, D);
    a.causal = FA_CAUSAL_TOP_LEFT;
    fa_ring_args ring = FA_RING_ARGS_INIT;
    ring.sharding = FA_RING_ZIGZAG;
    const fa_status st = fa_ring_forward(ctx, MPI_COMM_WORLD, &ring, &a);
    int bad = st != FA_OK;
    for (int i = 0; i < S && !bad; i++) {
        const double want = 1.0 + fa_ring_position(FA_RING_ZIGZAG, rank, P, S, i) / 2.0;
        bad |= fabs(o[i * D] - want) > 1e-5 * want;
    }
    int any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) printf("ring forward on %d ranks: %s\n", P, any ? "WRONG" : "ok");
    fa_context_free(ctx);
    MPI_Finalize();
    return any;
}
