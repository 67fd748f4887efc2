/*
 * flashattn_mpi.h: the public header of libflashattn_mpi, ring attention (and Ulysses
 * attention, below) over MPI.
 *
 * Attention over a sequence sharded along its length across the ranks of an MPI
 * communicator, forward and backward, with the result of single-machine attention
 * over the whole sequence (docs/mpi.md). Each rank holds its shard of q, k and v;
 * the k/v shards travel around the ring (rank r sends to r+1 and receives from
 * r-1) with non-blocking MPI while the local attention on the shard at hand runs,
 * and the partial (o, lse) are merged exactly with the core's merge formula.
 *
 * The calls take the core's own argument structs, fa_forward_args and
 * fa_backward_args, describing this rank's shards: q, k, v, o (B, S_local, H, dim)
 * in any layout the core accepts, lse (B, Hq, S_local, 1). Every option of the
 * dense forward that has a meaning for a sharded sequence works: causal (either
 * alignment: for self-attention over the whole sequence they are the same), window,
 * softcap, ALiBi, scale, dropout (the mask of the whole sequence, drawn at global
 * positions), GQA/MQA (only the kv heads travel), f32/f16/bf16, f32 outputs,
 * attention sinks (sinks; the backward's dsinks summed over every rank's rows). The
 * rest is refused with FA_ERR_UNSUPPORTED: bias and mask tensors, variable length,
 * KV caches, dropout_mask, and q_start/k_start (the ring sets them). The core
 * library never links MPI; this one links the core and MPI.
 *
 * Sharding (fa_ring_args.sharding): with S_r rows on rank r,
 *   FA_RING_CONTIGUOUS: rank r holds global rows [S_0 + .. + S_{r-1}, + S_r).
 *   FA_RING_ZIGZAG: the sequence is cut into 2P chunks; rank r holds chunk r and
 *     chunk 2P-1-r, each of S_r / 2 rows (S_r must be even), in that order. Causal
 *     work is then balanced across ranks.
 * Shard lengths may differ between ranks (as varlen sequences do), with one limit:
 * a window or ALiBi with dropout needs equal shard lengths (equal chunks for
 * zig-zag), since the core's band rules and its dropout counter then need
 * different position offsets; that combination is FA_ERR_UNSUPPORTED.
 *
 * Collective calls: every rank of the communicator must call, with the same
 * options. Validity is agreed before any data moves (an MPI_Allgather of a small
 * descriptor per rank, then an MPI_Allreduce on the buffers): when any
 * rank's arguments are wrong, or the ranks disagree on B, heads, dims, dtypes or
 * options, every rank returns the same status (that of the lowest failing rank),
 * nothing is written, and no rank is left waiting. A NULL context or NULL args
 * still takes part in that agreement; only a bad communicator cannot. A failure of
 * the core inside the ring (out of memory) is agreed again at the end, so every
 * rank still returns the same status and writes nothing. MPI errors themselves use
 * the communicator's error handler (by default fatal, as MPI's is).
 *
 * Determinism: every rank merges its partial results in ring order in f32, so the
 * result is bitwise the same on every run with the same ranks and shards.
 */
#ifndef FLASHATTN_MPI_H
#define FLASHATTN_MPI_H

#include <mpi.h>

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* fa_ring_sharding, and the ring's rules (placement, pieces, agreement), are the
 * core's ring planner (flashattn.h): this library only moves the bytes. */

/*
 * What one ring call did, for tests and benchmarks (optional: fa_ring_args.stats).
 * Times are wall-clock seconds on this rank. "Exposed communication" is the time
 * spent waiting for the ring's transfers after the step's compute is done.
 */
typedef struct fa_ring_stats {
    size_t struct_size;         /* sizeof(fa_ring_stats) as the caller compiled it */
    int64_t steps;              /* ring steps: the number of ranks */
    int64_t steps_computed;     /* steps that had at least one kept (query, key) pair */
    int64_t kept_pairs;         /* kept (query position, key position) pairs computed, per (batch, head) */
    int64_t core_calls;         /* fa_forward / fa_backward calls (pieces) */
    int64_t steps_prefetched;   /* steps whose next transfer was posted before their first piece */
    int64_t pieces_in_flight;   /* pieces that started while a transfer had not completed */
    int64_t tests;              /* MPI_Testall calls between pieces (they progress the transfers) */
    int64_t bytes_sent;         /* payload bytes this rank sent */
    double compute_seconds;     /* in the core's calls and the local adds */
    double wait_seconds;        /* in MPI_Wait after each step's compute: exposed communication */
    double test_seconds;        /* in MPI_Testall between pieces (not in compute_seconds): with a
                                   shared-memory transport the receiver's copy runs here, on this core */
    double total_seconds;       /* the whole call, agreement included */
    /* optional: per-step figures, `step_capacity` entries each (data NULL: not kept) */
    double *step_compute_seconds;
    double *step_wait_seconds;
    int64_t step_capacity;
} fa_ring_stats;

typedef struct fa_ring_args {
    size_t struct_size;         /* sizeof(fa_ring_args) as the caller compiled it */
    fa_ring_sharding sharding;
    /* Query-row pieces each step's local compute is cut into; between pieces the
     * ring's transfers are progressed (MPI_Testall), since MPI moves a large
     * non-blocking message only while the library is entered. 0 = 4. 1..1024. */
    int pieces;
    fa_ring_stats *stats;       /* optional */
} fa_ring_args;

#define FA_RING_ARGS_INIT {sizeof(fa_ring_args), FA_RING_CONTIGUOUS, 0, 0}
#define FA_RING_STATS_INIT {sizeof(fa_ring_stats), 0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0}

/*
 * Forward: `local` is this rank's fa_forward_args (its shards of q, k, v, o, and
 * optionally lse) with the options; on success o and lse hold this rank's rows of
 * attention over the whole sequence.
 */
FA_API fa_status fa_ring_forward(fa_context *ctx, MPI_Comm comm, const fa_ring_args *ring,
                                 const fa_forward_args *local);

/*
 * Backward: `local` is this rank's fa_backward_args; local->fwd is the forward's
 * arguments as fa_ring_forward ran them, its o and lse outputs included (both
 * required). dq, dk, dv (optional, q's dtype or f32) receive this rank's rows of
 * the gradients of the whole sequence: dk and dv of this rank's keys gather the
 * contributions of every rank's queries (their f32 accumulators travel the ring
 * with the k/v shard and come back to the owner).
 */
FA_API fa_status fa_ring_backward(fa_context *ctx, MPI_Comm comm, const fa_ring_args *ring,
                                  const fa_backward_args *local);

/*
 * Ulysses attention (DeepSpeed-Ulysses): the same arguments, shards and result as
 * fa_ring_forward / fa_ring_backward (ring->sharding places the rows; ring->pieces and
 * ring->stats are not used), computed another way: an all-to-all gives every rank
 * the whole sequence for Hq / P of the query heads (and Hk / P of the kv heads), one
 * core call runs there, and an all-to-all brings o and lse (the backward: dq, dk, dv;
 * dsinks gathered whole on every rank) back to this rank's rows. Hq and Hk must be
 * multiples of the number of ranks (else FA_ERR_INVALID_ARGUMENT); dropout is refused
 * (FA_ERR_UNSUPPORTED: the core's dropout counter numbers the heads within a call).
 * Each head is computed by one call over the whole sequence, as one process would.
 * Every rank moves 2 GiB at most per exchange (MPI's int counts; FA_ERR_OVERFLOW
 * beyond). Collective, agreed and all-or-nothing as the ring calls.
 */
FA_API fa_status fa_ulysses_forward(fa_context *ctx, MPI_Comm comm, const fa_ring_args *ring,
                                    const fa_forward_args *local);
FA_API fa_status fa_ulysses_backward(fa_context *ctx, MPI_Comm comm, const fa_ring_args *ring,
                                     const fa_backward_args *local);

/* What the last failed ring or Ulysses call on this thread found wrong, in words; "" after a success. */
FA_API const char *fa_ring_error(void);

/*
 * Shard / unshard helpers: pure memory copies between a full tensor and rank
 * `rank`'s shard of it, for equal shard lengths (full length N = P * S_local, and
 * for zig-zag S_local even). `seq_axis` is the sequence axis: 1 for q, k, v, o and
 * their gradients (B, S, H, dim), 2 for lse (B, H, S, 1). Both tensors have the
 * same dtype and the same extents except along seq_axis; any strides.
 * FA_ERR_SHAPE_MISMATCH, FA_ERR_INVALID_ARGUMENT or FA_ERR_NULL_POINTER otherwise.
 */
FA_API fa_status fa_ring_shard(const fa_tensor *full, const fa_tensor *local, int seq_axis,
                               fa_ring_sharding sharding, int rank, int nranks);
FA_API fa_status fa_ring_unshard(const fa_tensor *local, const fa_tensor *full, int seq_axis,
                                 fa_ring_sharding sharding, int rank, int nranks);

/* The global position of local row i of rank `rank` (equal shard lengths S_local),
 * or -1 when i is outside [0, S_local) or the sharding is unknown. */
FA_API int64_t fa_ring_position(fa_ring_sharding sharding, int rank, int nranks, int64_t s_local, int64_t i);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_MPI_H */
