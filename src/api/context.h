/*
 * context.h: the lasting state of the library: a context's settings (one table,
 * FA_SETTINGS), what its last successful call ran (fa_run_info, whose read-outs are
 * one table, FA_READOUTS), its tuned-tile state (tune.c), its threads and kernel
 * table, its kept workspaces and its error message. A new setting or read-out is a
 * row here, its enum value in flashattn.h, and the code that uses or fills it.
 */
#ifndef FA_CONTEXT_H
#define FA_CONTEXT_H

#include "flashattn.h"
#include "kernels/kernels.h"
#include "tune.h"

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#define FA_MAX_KV_SPLITS 256

typedef struct fa_pool fa_pool;

/*
 * The settings of fa_context_set, one row each: (param, field of fa_settings, lo, hi).
 * context.c's bounds, set and get are this table; FA_PARAM_THREADS also restarts
 * the pool.
 */
#define FA_SETTINGS(X)                                                                         \
    X(FA_PARAM_THREADS, threads, 0, 1024)         /* as set: 0 = one per online CPU */       \
    X(FA_PARAM_ALGO, algo, FA_ALGO_AUTO, FA_ALGO_REFERENCE)                                  \
    X(FA_PARAM_TILE_Q, tile_q, 0, 4096)           /* 0 = planned */                          \
    X(FA_PARAM_TILE_KV, tile_kv, 0, 65536)        /* 0 = planned */                          \
    X(FA_PARAM_VERBOSE, verbose, 0, 1)            /* FLASHATTN_VERBOSE: a line per call */   \
    X(FA_PARAM_BF16_DOT, bf16_dot, 0, 2)          /* 0 auto, 1 on, 2 off */                  \
    X(FA_PARAM_KV_SPLITS, kv_splits, 0, FA_MAX_KV_SPLITS) /* 0 = planned */                  \
    X(FA_PARAM_KV_PACK, kv_pack, 0, 2)            /* 0 auto, 1 never, 2 wherever shared */ \
    X(FA_PARAM_F32_MATMUL, f32_matmul, 0, 2)      /* FA_F32_MATMUL_*: 0 ieee, 1 bf16x3, 2 bf16 */ \
    X(FA_PARAM_QUANT_MATMUL, quant_matmul, 0, 2)  /* FA_QUANT_MATMUL_*: 0 exact, 1 i8, 2 i8x2 */ \
    X(FA_PARAM_BF16_FUSED, bf16_fused, 0, 1)      /* FLASHATTN_BF16_FUSED=0 turns the fused bf16 tiles off */ \
    X(FA_PARAM_PROFILE, profile, 0, 1)            /* time the phases without the trace */

/* FA_PARAM_F32_MATMUL's values. */
enum { FA_F32_MATMUL_IEEE = 0, FA_F32_MATMUL_BF16X3 = 1, FA_F32_MATMUL_BF16 = 2 };

/* FA_PARAM_QUANT_MATMUL's values (docs/semantics.md, 11): the int8 digits of each operand. */
enum { FA_QUANT_MATMUL_EXACT = 0, FA_QUANT_MATMUL_I8 = 1, FA_QUANT_MATMUL_I8X2 = 2 };

typedef struct fa_settings {
#define FA_SETTING_FIELD(param, field, lo, hi) int64_t field;
    FA_SETTINGS(FA_SETTING_FIELD)
#undef FA_SETTING_FIELD
} fa_settings;

/*
 * The read-only FA_PARAM_LAST_* read-outs, one row each: (param, field of fa_run_info,
 * lo, hi). An algorithm fills its run's fa_run_info; entry.c keeps a successful
 * call's as ctx->last, and fa_context_get reads this table. A new counter: its enum
 * value in flashattn.h, a row here, and the algorithm that fills it.
 */
#define FA_READOUTS(X)                                                                         \
    X(FA_PARAM_LAST_ALGO, algo, FA_ALGO_AUTO, FA_ALGO_REFERENCE) /* the fa_algo that ran */  \
    X(FA_PARAM_LAST_EXTRA_BYTES, extra_bytes, 0, INT64_MAX)  /* peak bytes allocated */       \
    X(FA_PARAM_LAST_TILE_Q, br, 0, INT64_MAX)          /* tile sizes; 0 where none */       \
    X(FA_PARAM_LAST_TILE_KV, bc, 0, INT64_MAX)                                               \
    X(FA_PARAM_LAST_THREADS, threads, 0, 1024)                                               \
    X(FA_PARAM_LAST_KV_SPLITS, kv_splits, 0, FA_MAX_KV_SPLITS) /* most key chunks of a sequence */ \
    X(FA_PARAM_LAST_BACKWARD_PASSES, backward_passes, 0, 2) /* flash backward: 1 fused, 2 two-pass */ \
    X(FA_PARAM_LAST_KV_PACKED, kv_packed, 0, INT64_MAX) /* (sequence, kv head) units packed */ \
    X(FA_PARAM_LAST_KV_PACK_US, kv_pack_us, 0, INT64_MAX) /* thread time spent packing them */ \
    X(FA_PARAM_LAST_POOL, pool, 0, 2) /* FA_POOL_*: own, host, host failed (forward.c's record_run) */

/* Phases of a tiled loop the verbose trace times: the forward's four, the backward's seven (profile.h). */
#define FA_PHASES_MAX FA_PHASES

/* What a run allocated and chose: the read-outs above, and for FLASHATTN_VERBOSE. */
typedef struct fa_run_info {
#define FA_READOUT_FIELD(param, field, lo, hi) int64_t field;
    FA_READOUTS(FA_READOUT_FIELD)
#undef FA_READOUT_FIELD
    const char *path; /* compute path, e.g. "f32" or "bf16-dot" */
    int backward;     /* a backward pass (the trace says so) */
    /* with FLASHATTN_VERBOSE (for its trace) or FA_PARAM_PROFILE: the tiled loop's thread
     * CPU time (all threads) by phase, profile.h's FA_PH_*, and the FLOPs of the products
     * each ran; all 0 for the loops that keep none (FA_PARAM_LAST_PHASE_US, _FLOP) */
    int64_t phase_us[FA_PHASES_MAX];
    int64_t phase_flop[FA_PHASES_MAX];
} fa_run_info;

/* Tuned tiles (src/schedule/plan_inputs.c, src/schedule/tune_file.c): the tune file is read when the
 * context is made (and again after fa_tune saves); the trace of the first plan that
 * asks for tuned tiles carries `note` (what was read, or why the file was ignored).
 * Freed in fa_context_free. */
typedef struct fa_tune_state {
    struct fa_tune_table *table; /* this CPU's and ISA's entries; NULL: none */
    int note_pending;            /* the file was read and no plan has traced the note yet */
    int note_due;                /* the last plan took the note: trace it */
    int tile_src_q, tile_src_kv; /* where the last plan's tiles came from: FA_TILES_* */
    int off;                     /* fa_tune is sweeping: plans ignore tuned tiles */
    fa_tune_key key;             /* the shape class the last plan that asked for tuned tiles was of */
    char note[512];
} fa_tune_state;

struct fa_context {
    fa_settings set;         /* as fa_context_set set them (FA_SETTINGS) */
    int threads;             /* set.threads resolved, >= 1 */
    fa_pool *pool;           /* threads - 1 workers (the pool exists for one thread too), or a host pool */
    fa_parallel_fn host;     /* fa_context_set_parallel's fn, NULL: the own workers */
    void *host_user;
    const fa_kernels *kernels;
    fa_run_info last;        /* the last successful call's (FA_READOUTS) */
    fa_tune_state tune;
    /* the call being run, as validation read it (fa_problem.args): the caller's fields at
     * this library's size; one call at a time, like everything else here */
    fa_forward_args call_args;
    struct fa_seq *seqs;     /* the call's sequence table (fa_problem.seqs), kept between calls */
    int64_t seqs_cap;        /* its entries */
    void *ws_kept[2];        /* fa_context_workspace: buffers kept between calls, per slot */
    int64_t ws_kept_bytes[2];
    atomic_int busy;         /* 1 while a call runs on this context (fa_context_enter) */
    char error[320];
};

/* One caller at a time: a call that finds the context taken returns FA_ERR_BUSY
 * and touches nothing. fa_context_enter also clears the error message. */
int fa_context_enter(fa_context *ctx);
void fa_context_leave(fa_context *ctx);

/* Records a message on ctx (when non-NULL) and returns status. */
fa_status fa_fail(fa_context *ctx, fa_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Seconds on the monotonic clock. */
static inline double fa_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}


#endif
