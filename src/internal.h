/*
 * internal.h: what the portable core shares between its files: the context,
 * the validated problem every algorithm receives, and error reporting.
 * Nothing here knows an ISA; micro-kernels are reached through fa_kernels.
 *
 * Dimension legend used across src/:
 *   B batch, Sq/Sk query/key length, Hq/Hk query/kv heads, D q/k head dim,
 *   Dv v/o head dim, i query row, j key column, r/c row/column inside a tile.
 */
#ifndef FA_INTERNAL_H
#define FA_INTERNAL_H

#include "flashattn.h"
#include "kernels/kernels.h"
#include "dropout.h"

#include <stdatomic.h>
#include <stdint.h>

typedef struct fa_pool fa_pool;

/* A tune file entry's shape class (src/tune.h); the CPU and ISA are the context's. */
typedef struct fa_tune_key {
    fa_dtype dtype;
    int64_t d, dv, sk, rows; /* sk, rows: the length buckets */
    int masked;              /* a causal mask or a window */
} fa_tune_key;

struct fa_context {
    int64_t threads_setting; /* as set: 0 = one per online CPU */
    int threads;             /* resolved, >= 1 */
    fa_algo algo;
    fa_pool *pool;           /* threads - 1 workers; NULL when threads == 1 */
    const fa_kernels *kernels;
    int64_t tile_q, tile_kv; /* 0 = planned */
    int verbose;             /* FLASHATTN_VERBOSE: one line per call on stderr */
    int bf16_dot;            /* FA_PARAM_BF16_DOT: 0 auto, 1 on, 2 off */
    fa_algo last_algo;
    int64_t last_extra_bytes;
    int64_t last_tile_q, last_tile_kv, last_threads;
    int64_t kv_splits;       /* FA_PARAM_KV_SPLITS: 0 = planned */
    int kv_pack;             /* FA_PARAM_KV_PACK: 0 auto, 1 never, 2 wherever shared */
    void *ws_kept[2];        /* fa_context_workspace: buffers kept between calls, per slot */
    int64_t ws_kept_bytes[2];
    int64_t last_kv_splits;
    int64_t last_backward_passes;
    int64_t last_kv_packed, last_kv_pack_us;
    atomic_int busy;         /* 1 while a call runs on this context (fa_context_enter) */
    char error[320];

    /* Tuned tiles (src/tune.c): the tune file is read once, at the first planned
     * flash call; that call's verbose trace carries tune_note (what was read, or
     * why the file was ignored). Freed in fa_context_free. */
    int tune_read;               /* the file was looked at, whatever it held */
    struct fa_tune_table *tune;  /* this CPU's and ISA's entries; NULL: none */
    int tune_note_due;           /* the last plan read the file: trace the note */
    int tile_src_q, tile_src_kv; /* where the last plan's tiles came from: FA_TILES_* */
    int tune_off;                /* fa_tune is sweeping: plans ignore tuned tiles */
    fa_tune_key tune_class;      /* the shape class the last plan that asked for tuned tiles was of */
    char tune_note[512];
};

/* One caller at a time: a call that finds the context taken returns FA_ERR_BUSY
 * and touches nothing. fa_context_enter also clears the error message. */
int fa_context_enter(fa_context *ctx);
void fa_context_leave(fa_context *ctx);

/*
 * A call after validation: dimensions pulled out of the tensors, defaults
 * resolved, and broadcast dimensions of bias/mask given stride 0 so that every
 * algorithm indexes them as full [B, Hq, Sq, Sk] tensors.
 */
typedef struct fa_problem {
    int64_t B, Hq, Hk, Sq, Sk, D, Dv;
    int64_t group;            /* Hq / Hk: query heads per kv head */
    fa_dtype dtype;           /* of q, k, v */
    fa_tensor q, k, v, o;     /* (B, S, H, D) views */
    int has_lse;
    fa_tensor lse;            /* (B, Hq, Sq, 1) f32 */
    float scale;              /* resolved: never 0 by default */
    float softcap;            /* 0 = off */
    fa_causal causal;
    int64_t window_left, window_right; /* -1 = unbounded; clamped (checks.c) so diag +- window fits */
    int64_t q_start, k_start; /* positions of query row 0 and key 0 (fa_diag) */
    const float *alibi;       /* NULL = off */
    int64_t alibi_stride_b;
    int has_bias, has_mask;
    fa_tensor bias, mask;     /* broadcast dims have stride 0 */
    fa_dropout drop;          /* drop.on = 0: no dropout */
    int has_drop_mask;        /* write the keep bits to drop_mask (B, Hq, Sq, Sk) */
    fa_tensor drop_mask;

    /*
     * Inference forms (src/sequences.c; the cache fields are src/cache.c's). Sequences
     * may differ in length: B, Sq and Sk above are then the count and the longest
     * lengths (for planning), and fa_seq_view() gives each sequence as a dense problem
     * of its own (B = 1) whose tensors are views into the packed or cached data. A
     * paged view keeps the page pool in k, v and reaches row j through `pages`.
     */
    int varlen;               /* q, o (and k, v without a cache) packed by cu_q / cu_k */
    const int32_t *cu_q, *cu_k;
    int cache;                /* keys and values come from kc, vc */
    fa_tensor kc, vc;         /* the cache: (B_cache, S_max, ..) or pages (P, page_size, ..) */
    int quant;                /* FA_DTYPE_I8 cache: k_scale, v_scale hold its scales */
    fa_tensor k_scale, v_scale;
    const int32_t *seqlens, *batch_idx, *block_table;
    int64_t max_pages, page_size; /* page_size 0 = contiguous */
    int64_t capacity;         /* rows a sequence may hold */
    int append;               /* k, v hold new rows to append (dense: S_new = k.shape[1]) */
    const int32_t *pages;     /* in a paged per-sequence view: its block_table row */
} fa_problem;

/* The gradients of a backward call: dout is read, the others written when has_*.
 * Dense or packed like the problem they go with (dq, dout like q; dk, dv like k). */
typedef struct fa_grads {
    fa_tensor dout, dq, dk, dv;
    int has_dq, has_dk, has_dv;
} fa_grads;
/* Sequence b's gradients as B = 1 views, as fa_seq_view does for the problem. */
void fa_seq_grads(const fa_problem *p, const fa_grads *g, int64_t b, fa_grads *out);

/* Sequence b's query and key lengths (keys after any append). */
void fa_seq_lengths(const fa_problem *p, int64_t b, int64_t *sq, int64_t *sk);
/* Sequence b as a dense B = 1 problem (see above). */
void fa_seq_view(const fa_problem *p, int64_t b, fa_problem *out);
/* t with its batch axis fixed at b and its seq axis starting at s0: a (1, len, .., ..) view. */
fa_tensor fa_seq_tensor(const fa_tensor *t, int64_t b, int64_t s0, int64_t len);
/* Checks of the varlen and cache fields of a call; p already holds q, o, lse and
 * the scalars. Fills the rest of p. */
fa_status fa_validate_forms(fa_context *ctx, const fa_forward_args *a, fa_problem *p);
/* Whether p is an inference form: only flash runs those. */
static inline int fa_problem_is_form(const fa_problem *p) { return p->varlen || p->cache; }

/* Merges n partial rows (o_i normalised, lse_i natural log) into out and *lse_out:
 * docs/semantics.md's formula, shared by split-KV and fa_merge_states. */
void fa_merge_rows(int n, const float *const *o, const float *lse, int64_t dv, float *out, float *lse_out);

/* f32, f16 or bf16: the dtypes of attention data (not bool, not i8). */
static inline int fa_dtype_is_float(fa_dtype d)
{
    return d == FA_DTYPE_F32 || d == FA_DTYPE_F16 || d == FA_DTYPE_BF16;
}

/* Records a message on ctx (when non-NULL) and returns status. */
fa_status fa_fail(fa_context *ctx, fa_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

fa_status fa_validate_forward(fa_context *ctx, const fa_forward_args *args, fa_problem *p);
/* fa_forward on a context the caller has entered (fa_tune's runs). */
fa_status fa_forward_run(fa_context *ctx, const fa_forward_args *args);

/* Per-element work needed beyond the causal/window band: bias, mask, softcap or ALiBi. */
static inline int fa_problem_has_elementwise(const fa_problem *p)
{
    return p->has_bias || p->has_mask || p->alibi != 0 || p->softcap > 0.0f;
}

/* A window side at or beyond this reaches every key from every row (positions are
 * at most FA_POSITION_MAX), so validation turns it into "unbounded". */
#define FA_WINDOW_HUGE ((int64_t)1 << 62)
/* The largest head dim D or Dv a call may have (checks.c). */
#define FA_DIM_MAX ((int64_t)1 << 40)

/* The top-left diagonal of row i: the key at the query's own position. */
static inline int64_t fa_diag_top_left(const fa_problem *p, int64_t i) { return i + p->q_start - p->k_start; }
/* The bottom-right diagonal of row i, which causal bottom-right, windows and ALiBi
 * measure from. Written here once. In range by checks.c: |diag| < 2^62. */
static inline int64_t fa_diag(const fa_problem *p, int64_t i) { return fa_diag_top_left(p, i) + (p->Sk - p->Sq); }

/*
 * The band of key columns row i keeps under causal and window masking:
 * [*lo, *hi], both clamped to [0, Sk-1]; empty when *lo > *hi. Both ends are
 * non-decreasing in i, which is what lets tile loops skip whole blocks.
 * A new band-shaped mask is added here and nowhere else.
 */
static inline void fa_row_band(const fa_problem *p, int64_t i, int64_t *lo, int64_t *hi)
{
    const int64_t diag = fa_diag(p, i);
    int64_t a = 0, b = p->Sk - 1;
    if (p->window_left >= 0 && diag - p->window_left > a) a = diag - p->window_left;
    if (p->window_right >= 0 && diag + p->window_right < b) b = diag + p->window_right;
    if (p->causal == FA_CAUSAL_BOTTOM_RIGHT && diag < b) b = diag;
    if (p->causal == FA_CAUSAL_TOP_LEFT && fa_diag_top_left(p, i) < b) b = fa_diag_top_left(p, i);
    *lo = a;
    *hi = b;
}

/* Kept (i, j) pairs of rows [i0, i1) with keys in [j0, j1) under the band above:
 * the sum of fa_row_band's widths, clipped to [j0, j1), in closed form (a few
 * steps, whatever the lengths). The one count of kept pairs: the planners' task
 * costs, fa_forward_work and (through it) the tools and the ring use it. */
int64_t fa_kept_pairs(const fa_problem *p, int64_t i0, int64_t i1, int64_t j0, int64_t j1);

/* Softcap, bias, ALiBi and every mask applied to a tile of scaled scores, element
 * (r, c) at st[c*ldc + r*ldr] (transposed tiles: ldr = 1; row-major: ldc = 1), for
 * rows i0.. and columns j0..; dropped entries become -inf.
 * Shared by flash and standard so the rules are written once (src/scores.c). */
void fa_scores_finish(const fa_problem *p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                      int64_t j0, int64_t cols, float *st, int64_t ldc, int64_t ldr);
/* The causal/window band of a tile for the softmax kernel; 1 when the tile is
 * entirely inside the band (then lo/hi are not written and not needed). */
int fa_tile_band(const fa_problem *p, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                 int32_t *lo, int32_t *hi);

/* Workspace: 64-byte aligned. Fails (NULL) rather than over-commit when bytes
 * exceed physical memory, since a successful malloc on Linux does not mean the
 * pages exist, and touching them later would kill the process. */
void *fa_workspace_alloc(int64_t bytes);
void fa_workspace_free(void *ptr);
/* The context's own workspace, kept between calls up to FA_WORKSPACE_KEEP bytes:
 * decoding calls take a millisecond or less, and fresh pages from the kernel (a
 * page fault per 4 KiB) would cost a good share of that. Release with
 * fa_context_workspace_done. */
#define FA_WORKSPACE_KEEP ((int64_t)64 << 20)
void *fa_context_workspace(fa_context *ctx, int64_t bytes);
void fa_context_workspace_done(fa_context *ctx, void *ptr);
/* The same for a second buffer a call sizes only after filling the first (slot 1:
 * the forward's packed K/V, planned from its tasks); slot 0 is fa_context_workspace's. */
void *fa_context_workspace_slot(fa_context *ctx, int slot, int64_t bytes);
#define FA_CACHE_LINE 64
#define FA_MAX_KV_SPLITS 256
/* x rounded up to a multiple of m (x >= 0, m >= 1; the caller keeps x + m in range). */
static inline int64_t fa_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/*
 * A workspace carved by one table: each part gets its own cache lines, and the same
 * table gives the total size (base == NULL) and the offsets (base != NULL), so the
 * two can never disagree. A part of bytes < 0 (an overflowed size upstream) or a
 * total beyond int64 makes fa_ws_layout return -1. A part of 0 bytes gets a valid
 * pointer it must not dereference.
 */
typedef struct fa_ws_part {
    void **slot;
    int64_t bytes;
} fa_ws_part;
int64_t fa_ws_layout(const fa_ws_part *parts, size_t n, char *base);
/* a * b * c bytes, or -1 when a product overflows or a factor is negative. */
int64_t fa_bytes3(int64_t a, int64_t b, int64_t c);

/* Tile sizes for the flash loop (src/plan.c). */
typedef struct fa_plan {
    int64_t br, bc;  /* query rows and key columns per tile */
    int64_t br_pad;  /* leading dimension of the Q panel and score tile: fa_panel_ld(br) */
} fa_plan;
/* Leading dimension for panels of `rows` query rows: a multiple of FA_ROW_ALIGN
 * that avoids L1 set aliasing. */
int64_t fa_panel_ld(int64_t rows);
/* Not const: the first plan of a context reads the tune file (src/tune.c). */
void fa_plan_tiles(fa_context *ctx, const fa_problem *p, fa_plan *plan);
/* Whether bf16 inputs are multiplied as bf16 pairs on this context: the path must
 * have the kernels, and they must outrun fp32 FMA on this CPU (auto) or be forced. */
int fa_bf16_dot_active(const fa_context *ctx);
int64_t fa_l2_bytes(void);

/* What a run allocated and chose: for FA_PARAM_LAST_EXTRA_BYTES and FLASHATTN_VERBOSE. */
typedef struct fa_run_info {
    int64_t extra_bytes;
    int64_t br, bc; /* tile sizes; 0 where the algorithm has none */
    int threads;
    const char *path; /* compute path, e.g. "f32" or "bf16-dot" */
    int64_t kv_splits; /* most key chunks of any sequence (0 where not applicable) */
    int backward;      /* a backward pass (the trace says so) */
    int backward_passes; /* flash backward: 1 fused, 2 two-pass (0 otherwise) */
    int64_t kv_packed;   /* flash forward: (sequence, kv head) units with packed K/V */
    int64_t kv_pack_us;  /* ... and the thread time spent packing them */
} fa_run_info;

/* FLASHATTN_VERBOSE lines on stderr (src/verbose.c). */
void fa_verbose_exec(const fa_context *ctx, const fa_problem *p, fa_algo ran, const char *fallback,
                     const fa_run_info *info, double ms);
void fa_verbose_error(const fa_context *ctx, fa_status st);

/* Algorithms: each runs a validated problem and fills info; the backward of each
 * differentiates its own forward (forward.c's table holds both). */
fa_status fa_run_reference(fa_context *ctx, const fa_problem *p, fa_run_info *info);
fa_status fa_run_standard(fa_context *ctx, const fa_problem *p, fa_run_info *info);
fa_status fa_run_flash(fa_context *ctx, const fa_problem *p, fa_run_info *info);
fa_status fa_run_reference_backward(fa_context *ctx, const fa_problem *p, const fa_grads *g, fa_run_info *info);
fa_status fa_run_standard_backward(fa_context *ctx, const fa_problem *p, const fa_grads *g, fa_run_info *info);
fa_status fa_run_flash_backward(fa_context *ctx, const fa_problem *p, const fa_grads *g, fa_run_info *info);
/* The tiled backward loop (algo_flash_bwd.c) with br x bc tiles: flash plans them
 * and lets the loop run in two passes when that fills the threads better
 * (two_pass_ok); the standard algorithm takes one tile of the whole sequence, which
 * materialises S, P, dP and dS per head as eager attention does, in one pass. */
fa_status fa_backward_tiled(fa_context *ctx, const fa_problem *p, const fa_grads *g, int64_t br, int64_t bc,
                            int two_pass_ok, fa_run_info *info);
/* The backward's checks: fwd as the forward validates it (p), plus lse, o and the
 * gradient tensors (g). */
fa_status fa_validate_backward(fa_context *ctx, const fa_backward_args *args, fa_problem *p, fa_grads *g);

/* Seconds on the monotonic clock. */
double fa_now_s(void);

/* Checked 64-bit arithmetic: return 0 on overflow. */
static inline int fa_mul_ok(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline int fa_add_ok(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

#endif
