/*
 * problem.h: a call as every algorithm receives it: the validated problem (dense,
 * or a varlen/cached form of sequences viewed as dense ones), its gradients, and the
 * rules on it written once: the diagonals and bands of the masks, the count of kept
 * pairs, the element-wise score rules, and the validation that builds it.
 *
 * Dimension legend used across src/:
 *   B batch, Sq/Sk query/key length, Hq/Hk query/kv heads, D q/k head dim,
 *   Dv v/o head dim, i query row, j key column, r/c row/column inside a tile.
 */
#ifndef FA_PROBLEM_H
#define FA_PROBLEM_H

#include "flashattn.h"
#include "dropout.h"

#include <math.h>
#include <stdint.h>

/*
 * A validated block mask (docs/semantics.md, "Block mask"; checks.c builds it). Mask
 * row of (b, h, qb) is the view's bm_row0 + b * row_b + h * row_h + qb: the strides are
 * 0 where the caller's mask broadcasts, and a sequence view (fa_seq_view) moves bm_row0
 * to its sequence, so that views index it with b = 0 as they do every tensor.
 */
typedef struct fa_bmask {
    int on;
    int64_t bq, bk;           /* rows per q block, keys per kv block */
    int64_t nqb, nkb;         /* q blocks per (b, h) row; kv blocks of the longest sequence */
    int64_t row_b, row_h;
    const int64_t *offsets;   /* mask row r's entries: offsets[r] .. offsets[r+1]-1 */
    const int32_t *idx;       /* an entry's kv block */
    const int64_t *partial;   /* an entry's element mask, -1 full; NULL: all full */
    const uint8_t *bits;
    int64_t row_bytes;        /* ceil(bk / 8): one row of an element mask */
    int64_t block_bytes;      /* bq * row_bytes: one element mask */
} fa_bmask;

/* Statuses of a kv block for one mask row (fa_bmask_status): absent, full, else the
 * element mask's number. */
enum { FA_BM_ABSENT = -2, FA_BM_FULL = -1 };

typedef struct fa_kv_source fa_kv_source; /* src/forms/kv.h */

/* One sequence of an inference form as validation finds it once (fa_seq_table_fill):
 * its lengths and where its rows start, from which fa_seq_view cuts its views. */
typedef struct fa_seq {
    int64_t Sq, Sk; /* query rows; keys after any append */
    int64_t qb, q0; /* q, o, lse: batch index and first row */
    int64_t kb, k0; /* packed k, v: batch index and first row; a contiguous cache: cache row and
                       first row (scales too); a paged cache: unused (its block_table row) */
} fa_seq;

/*
 * A view: the part of a problem that differs between a call and each of its sequences
 * (lengths, tensors, the cache's rows), and nothing else. The call's own view (its
 * whole tensors, B sequences of the longest lengths) is the leading part of fa_problem;
 * fa_seq_view() cuts sequence b's into an fa_view of its own (B = 1, tensors at the
 * sequence's rows), and the tiled loops, the K/V sources and the rules take the call
 * (everything else: masks, scalars, dtypes, the cache's layout) and a view apart, so a
 * sequence costs a view and never a copy of the call. The fields are written once,
 * here, for both the struct and fa_problem's union (its fields read as p->Sq, ...).
 */
#define FA_VIEW_FIELDS                                                                                               \
    int64_t B, Sq, Sk;                                                                                               \
    fa_tensor q, k, v, o;       /* (B, S, H, D) views; a paged view's k, v: the page pool */                         \
    fa_tensor lse;              /* (B, Hq, Sq, 1) f32 */                                                             \
    fa_tensor bias, mask;       /* broadcast dims have stride 0 */                                                   \
    const float *alibi;         /* NULL = off */                                                                     \
    int64_t alibi_stride_b;                                                                                          \
    fa_tensor k_scale, v_scale; /* a quantised cache's scales (quant) */                                             \
    const int32_t *pages;       /* in a paged per-sequence view: its block_table row */                              \
    int64_t bm_row0;            /* the block mask's row of (b = 0, h = 0, qb = 0) (fa_bmask) */
typedef struct fa_view {
    FA_VIEW_FIELDS
} fa_view;

/*
 * A call after validation: dimensions pulled out of the tensors, defaults
 * resolved, and broadcast dimensions of bias/mask given stride 0 so that every
 * algorithm indexes them as full [B, Hq, Sq, Sk] tensors.
 */
typedef struct fa_problem {
    union {
        fa_view view; /* the call's own view: &p->view where a rule takes one */
        struct {
            FA_VIEW_FIELDS
        };
    };
    int64_t Hq, Hk, D, Dv;
    int64_t group;            /* Hq / Hk: query heads per kv head */
    fa_dtype dtype;           /* of q, k, v */
    int has_lse;
    float scale;              /* resolved: never 0 by default */
    float softcap;            /* 0 = off */
    fa_causal causal;
    int64_t window_left, window_right; /* -1 = unbounded; clamped (checks.c) so diag +- window fits */
    int64_t q_start, k_start; /* positions of query row 0 and key 0 (fa_diag) */
    int has_bias, has_mask;   /* bias, mask (the view's) are given */
    fa_dropout drop;          /* drop.on = 0: no dropout */
    int has_drop_mask;        /* write the keep bits to drop_mask (B, Hq, Sq, Sk) */
    fa_tensor drop_mask;
    const float *sinks;       /* (Hq) sink logits; NULL = none (fa_sink) */
    /* The call's fields as the caller gave them, at this library's size (defaults past the
     * caller's struct_size), valid while the call runs: an option the algorithms read as
     * given (kv_splits) is read here, checked by checks.c, and needs no field of its own
     * above. Views share it; a view's own lengths and tensors are the fields above. */
    const fa_forward_args *args;
    int quant_matmul;         /* the call's FA_PARAM_QUANT_MATMUL mode: its field, else the context's */
    int f32_matmul;           /* the call's FA_PARAM_F32_MATMUL mode: likewise */
    fa_bmask bm;              /* the block mask; bm.on = 0: none */

    /*
     * Inference forms (src/forms/sequences.c; the cache fields are src/forms/cache.c's). Sequences
     * may differ in length: B, Sq and Sk above are then the count and the longest
     * lengths (for planning), each sequence's own are the table `seqs` (fa_seq_at), and
     * fa_seq_view() gives each sequence's view (fa_view, B = 1) whose tensors are views
     * into the packed or cached data, cut at the table's rows; the loops take it beside
     * the call, whose fields here stay the call's. A paged view keeps the page pool in
     * k, v and reaches row j through its `pages`.
     */
    int varlen;               /* q, o (and k, v without a cache) packed by cu_q / cu_k */
    const int32_t *cu_q, *cu_k;
    int cache;                /* keys and values come from kc, vc */
    fa_tensor kc, vc;         /* the cache: (B_cache, S_max, ..) or pages (P, page_size, ..) */
    int quant;                /* a quantised cache (fa_dtype_is_quant): the views' k_scale, v_scale hold its scales */
    const int32_t *seqlens, *batch_idx, *block_table;
    int64_t max_pages, page_size; /* page_size 0 = contiguous */
    int64_t capacity;         /* rows a sequence may hold */
    int append;               /* k, v hold new rows to append (dense: S_new = k.shape[1]) */
    int v_in_k;               /* MLA latent cache: vc, v (and v_scale) are views of the first Dv
                                 columns of kc, k (k_scale): V row j IS K row j, read and written once */
    const int32_t *leftpad;   /* contiguous caches: sequence b's key 0 is row leftpad[b] */
    int scale_shared[2];      /* k_scale (0), v_scale (1) given with token stride 0: shared by rows, never
                                 written by an append (docs/semantics.md, section 8, "Cache dtypes") */
    const fa_kv_source *kv;   /* how views reach their K/V rows (kv.h), chosen once by validation */
    const fa_seq *seqs;       /* an inference form's sequences [B] (fa_seq_at), built once by
                                 validation; NULL for a dense batch, B alike */
} fa_problem;

/* The gradients of a backward call: dout is read, the others written when has_*.
 * Dense or packed like the problem they go with (dq, dout like q; dk, dv like k). */
typedef struct fa_grads {
    fa_tensor dout, dq, dk, dv;
    int has_dq, has_dk, has_dv;
    float *dsinks;            /* (Hq) the sinks' gradient, or NULL: not wanted */
} fa_grads;
/* Sequence b's gradients as B = 1 views, as fa_seq_view does for the problem. */
void fa_seq_grads(const fa_problem *p, const fa_grads *g, int64_t b, fa_grads *out);

/* Fills out[0 .. B-1] with the sequences of inference form p (its fields validated). */
void fa_seq_table_fill(const fa_problem *p, fa_seq *out);
/* Sequence b of p: its table's entry, or a dense batch's row b. */
static inline fa_seq fa_seq_at(const fa_problem *p, int64_t b)
{
    if (p->seqs) return p->seqs[b];
    return (fa_seq){p->Sq, p->Sk, b, 0, b, 0};
}
/* Sequence b's query and key lengths (keys after any append). */
static inline void fa_seq_lengths(const fa_problem *p, int64_t b, int64_t *sq, int64_t *sk)
{
    const fa_seq q = fa_seq_at(p, b);
    *sq = q.Sq;
    *sk = q.Sk;
}
/* Sequence b's view (B = 1, see above): the rules and the loops take it with p. */
void fa_seq_view(const fa_problem *p, int64_t b, fa_view *out);
/* t with its batch axis fixed at b and its seq axis starting at s0: a (1, len, .., ..)
 * view. An empty view keeps t's base: its first row may lie one past the tensor (an
 * empty trailing sequence), where the offset was never proven in range and no row is
 * read. Here, not in sequences.c, because the cache's views (cache.c) cut it too. */
static inline fa_tensor fa_seq_tensor(const fa_tensor *t, int64_t b, int64_t s0, int64_t len)
{
    fa_tensor v = *t;
    if (len > 0) {
        const int64_t off = b * t->stride[0] + s0 * t->stride[1]; /* an element of t: in range (checks.c) */
        v.data = (char *)t->data + off * (int64_t)fa_dtype_size(t->dtype);
    }
    v.shape[0] = 1;
    v.shape[1] = len;
    return v;
}
/* Checks of the varlen and cache fields of a call; p already holds q, o, lse and
 * the scalars. Fills the rest of p. */
fa_status fa_validate_forms(fa_context *ctx, const fa_forward_args *a, fa_problem *p);
/* Whether p is an inference form: only flash runs those. */
static inline int fa_problem_is_form(const fa_problem *p) { return p->varlen || p->cache; }

/* Merges n partial rows (o_i normalised, lse_i natural log) into out and *lse_out:
 * docs/semantics.md's formula, shared by split-KV and fa_merge_states. */
void fa_merge_rows(int n, const float *const *o, const float *lse, int64_t dv, float *out, float *lse_out);

/* Head h's sink logit: -inf when the call has none (docs/semantics.md, step 6). */
static inline float fa_sink(const fa_problem *p, int64_t h) { return p->sinks ? p->sinks[h] : -INFINITY; }
/* The one rule that finalises a row (steps 6-7, the sink's term included): from the
 * row's running max m (-inf: it kept nothing) and sum l over its kept keys, *lse and
 * the factor its unnormalised accumulator is multiplied by (NaN for a NaN sink; an
 * empty row's o is 0 whatever the sink, so callers leave it be). Without a sink (-inf) exactly 1/l and m + log l. A merged row
 * (normalised, with its lse) is finalised as m = lse, l = 1. */
float fa_row_norm(float m, float l, float sink, float *lse);

/* f32, f16 or bf16: the dtypes of attention data (not bool, not i8 or fp8). */
static inline int fa_dtype_is_float(fa_dtype d)
{
    return d == FA_DTYPE_F32 || d == FA_DTYPE_F16 || d == FA_DTYPE_BF16;
}

/* i8, f8e4m3, f8e5m2: KV cache dtypes, codes times f32 scales. */
static inline int fa_dtype_is_quant(fa_dtype d)
{
    return d == FA_DTYPE_I8 || d == FA_DTYPE_F8E4M3 || d == FA_DTYPE_F8E5M2;
}

fa_status fa_validate_forward(fa_context *ctx, const fa_forward_args *args, fa_problem *p);
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
/* The bottom-right diagonal of row i of view v, which causal bottom-right, windows and
 * ALiBi measure from. Written here once. In range by checks.c: |diag| < 2^62. */
static inline int64_t fa_diag(const fa_problem *p, const fa_view *v, int64_t i)
{
    return fa_diag_top_left(p, i) + (v->Sk - v->Sq);
}

/*
 * The band of key columns row i of view v keeps under causal and window masking:
 * [*lo, *hi], both clamped to [0, Sk-1]; empty when *lo > *hi. Both ends are
 * non-decreasing in i, which is what lets tile loops skip whole blocks.
 * A new band-shaped mask is added here and nowhere else. The rules below take the
 * call p and a view v (&p->view for the call's own tensors, or a sequence's).
 */
static inline void fa_row_band(const fa_problem *p, const fa_view *v, int64_t i, int64_t *lo, int64_t *hi)
{
    const int64_t diag = fa_diag(p, v, i);
    int64_t a = 0, b = v->Sk - 1;
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
int64_t fa_kept_pairs(const fa_problem *p, const fa_view *v, int64_t i0, int64_t i1, int64_t j0, int64_t j1);

/* Softcap, bias, ALiBi and every mask applied to a tile of scaled scores, element
 * (r, c) at st[c*ldc + r*ldr] (transposed tiles: ldr = 1; row-major: ldc = 1), for
 * rows i0.. and columns j0..; dropped entries become -inf.
 * Shared by flash and standard so the rules are written once (src/algos/scores.c). */
void fa_scores_finish(const fa_problem *p, const fa_view *v, int64_t b, int64_t h, int64_t i0, int64_t rows,
                      int64_t j0, int64_t cols, float *st, int64_t ldc, int64_t ldr);
/* When the pairs a boolean mask (and no other element-wise rule) keeps of every row
 * of the tile are one run of columns (block-structured, causal, document masks), the
 * runs as the softmax kernel's tile-relative bounds, and 1; with `band`, lo and hi hold
 * the band's bounds and get the intersection. 0 otherwise (lo, hi then spoilt). */
int fa_mask_runs(const fa_view *v, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                 int band, int32_t *lo, int32_t *hi);
/* The causal/window band of a tile for the softmax kernel; 1 when the tile is
 * entirely inside the band (then lo/hi are not written and not needed). */
int fa_tile_band(const fa_problem *p, const fa_view *v, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                 int32_t *lo, int32_t *hi);

/*
 * The block mask's rules (scores.c), for sequence views (b = 0) and the call's own view
 * (&p->view) alike; the mask is the call's (p->bm), its rows the view's. A tile
 * is rows i0 .. i0+rows-1 and keys j0 .. j0+cols-1 of (b, h); it may span q blocks.
 * `status` is scratch of fa_bmask_scratch(p, cols) entries.
 */
/* Entries a tile of cols keys needs in `status`: the kv blocks it can meet. */
static inline int64_t fa_bmask_scratch(const fa_problem *p, int64_t cols)
{
    return p->bm.on ? (cols + p->bm.bk - 1) / p->bm.bk + 1 : 0;
}
/* status[k] for kv blocks kb0 .. kb0+n-1 of mask row (b, h, qb): FA_BM_ABSENT,
 * FA_BM_FULL or the element mask's number. */
void fa_bmask_status(const fa_problem *p, const fa_view *v, int64_t b, int64_t h, int64_t qb, int64_t kb0, int64_t n,
                     int64_t *status);
/* What the block mask leaves of a tile: 0 nothing (skip it), 1 every pair (no element
 * work), 2 some (fa_bmask_apply). */
int fa_bmask_tile(const fa_problem *p, const fa_view *v, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0,
                  int64_t cols, int64_t *status);
/* Sets the scores of the pairs the block mask removes to -inf; layout as fa_scores_finish. */
void fa_bmask_apply(const fa_problem *p, const fa_view *v, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0,
                    int64_t cols, float *st, int64_t ldc, int64_t ldr, int64_t *status);
/* When the pairs the block mask keeps of every row of the tile are one run of columns
 * (causal, window, document and prefix masks are), the run as the softmax kernel's
 * tile-relative bounds, and 1; with `band`, lo and hi hold the band's bounds and get
 * the intersection. 0 otherwise (lo, hi then spoilt): fa_bmask_apply. */
int fa_bmask_runs(const fa_problem *p, const fa_view *v, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0,
                  int64_t cols, int band, int32_t *lo, int32_t *hi, int64_t *status);
/* Whether the block mask keeps the single pair (i, j) of (b, h): the reference's rule. */
int fa_bmask_keeps(const fa_problem *p, const fa_view *v, int64_t b, int64_t h, int64_t i, int64_t j);
/* Pairs of rows [i0, i1) and keys [j0, j1) of (b, h) that the band and the block mask
 * keep: exact (a partial block's bits counted: fa_forward_work) or by blocks (a partial
 * block as full: what the loops compute, the planners' costs). */
int64_t fa_bmask_kept_pairs(const fa_problem *p, const fa_view *v, int64_t b, int64_t h, int64_t i0, int64_t i1,
                            int64_t j0, int64_t j1, int exact);
/* Cuts the keys [*lo, *hi] of rows [i0, i1) of heads h0 .. h0+nh-1 of sequence view s
 * (b = 0) to the blocks the mask lists for them, first to last; empty (*lo > *hi) when none. */
void fa_bmask_columns(const fa_problem *p, const fa_view *s, int64_t h0, int64_t nh, int64_t i0, int64_t i1,
                      int64_t *lo, int64_t *hi);
/* The band's kept pairs of rows [i0, i1), keys [j0, j1), summed over heads h0 .. h0+ng-1
 * of sequence view s: through the block mask when there is one (by blocks), else
 * fa_kept_pairs times ng. The planners' one cost rule. */
int64_t fa_heads_kept_pairs(const fa_problem *p, const fa_view *s, int64_t h0, int64_t ng, int64_t i0, int64_t i1,
                            int64_t j0, int64_t j1);
/* The largest divisor of block not above *tile (tiles that never cross a block). */
void fa_bmask_fit_tiles(const fa_problem *p, int64_t *br, int64_t *bc);
/* The forward's tiles: whole multiples of the blocks where the mask's kept blocks
 * come in groups that such tiles cover with little more, counting what the loop
 * (fa_plan_from's, plan.h) trims of a tile whose rows keep runs; else fa_bmask_fit_tiles. */
void fa_bmask_plan_tiles(const fa_problem *p, int loop, int64_t *br, int64_t *bc);

/* The backward's checks: fwd as the forward validates it (p), plus lse, o and the
 * gradient tensors (g). */
fa_status fa_validate_backward(fa_context *ctx, const fa_backward_args *args, fa_problem *p, fa_grads *g);

#endif
