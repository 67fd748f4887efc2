/*
 * flashattn.h: the one public header of libflashattn.
 *
 * Exact attention (FlashAttention-style tiling with the online softmax) on CPUs.
 * The math every call computes is fixed by docs/semantics.md; this header fixes
 * the C interface to it.
 *
 * Stability: everything here is stable within a major version. Structs that a
 * caller fills (fa_forward_args) begin with `struct_size` and only ever grow at
 * the end, so a program compiled against an older header keeps working with a
 * newer library: the library reads `struct_size` bytes and gives every field
 * beyond them its default. Settings on a context are (fa_param, value) pairs with
 * queryable bounds, so new settings never change the ABI.
 *
 * Errors: every call returns an fa_status. No call aborts, exits or prints (the
 * only output is the opt-in FLASHATTN_VERBOSE trace). A call that fails leaves
 * its outputs untouched; fa_context_error() says in words what was wrong.
 *
 * Threads: a context is used by one caller thread at a time. A call that finds
 * its context in use by another thread (fa_forward, fa_backward, fa_merge_states,
 * fa_context_set, fa_context_set_parallel, fa_probe) returns FA_ERR_BUSY and
 * touches nothing, not even the context's error message. Different contexts are
 * fully independent.
 *
 * Sizes: every product and sum of the sizes, strides, offsets and windows a
 * caller gives is checked before use. The element count of each tensor and the
 * work B*Hq*Sq*Sk*(D+Dv) must fit in int64 (else FA_ERR_OVERFLOW); a window
 * wider than any position difference means "unbounded".
 *
 * Empty shapes are legal, as PyTorch and FlashAttention accept them: B = 0,
 * Sq = 0 or Hq = 0 (with any Hk >= 0) is a successful no-op; Sk = 0 gives every
 * row o = 0 and lse = -inf; Dv = 0 gives an empty o and still the lse. D = 0 is
 * refused (FA_ERR_INVALID_DIM): there are no scores to speak of, and the
 * default scale 1/sqrt(D) has no value. Hk = 0 with Hq > 0 is refused too.
 *
 * The contract for what every call computes is docs/semantics.md.
 */
#ifndef FLASHATTN_H
#define FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(FLASHATTN_SHARED_BUILD)
#define FA_API __declspec(dllexport)
#elif defined(__GNUC__) || defined(__clang__)
#define FA_API __attribute__((visibility("default")))
#else
#define FA_API
#endif

/* ---------------------------------------------------------------- version */

#define FA_VERSION_MAJOR 0
#define FA_VERSION_MINOR 1
#define FA_VERSION_PATCH 0
#define FA_VERSION_NUMBER (FA_VERSION_MAJOR * 10000 + FA_VERSION_MINOR * 100 + FA_VERSION_PATCH)

/* The version the library was built as; compare with FA_VERSION_NUMBER. */
FA_API unsigned fa_version_number(void);
FA_API const char *fa_version_string(void); /* "MAJOR.MINOR.PATCH" */

/* ----------------------------------------------------------------- status */

typedef enum fa_status {
    FA_OK = 0,
    FA_ERR_NULL_CONTEXT = 1,      /* the context argument is NULL */
    FA_ERR_NULL_POINTER = 2,      /* a required pointer (args, q, k, v, o data) is NULL */
    FA_ERR_STRUCT_SIZE = 3,       /* struct_size misses required fields, or a newer caller set fields this library lacks */
    FA_ERR_INVALID_DIM = 4,       /* a dimension is negative, or zero where it has no meaning (see "Empty shapes") */
    FA_ERR_SHAPE_MISMATCH = 5,    /* tensors disagree on B, S, H or D */
    FA_ERR_HEAD_RATIO = 6,        /* Hq is not a multiple of Hk */
    FA_ERR_DTYPE = 7,             /* mixed or unsupported dtypes */
    FA_ERR_OVERFLOW = 8,          /* a size or byte offset does not fit in 64 bits */
    FA_ERR_BROADCAST = 9,         /* bias or mask does not broadcast to [B, Hq, Sq, Sk] */
    FA_ERR_INVALID_ARGUMENT = 10, /* a bad scalar: scale, softcap, window, enum value */
    FA_ERR_UNSUPPORTED = 11,      /* the chosen algorithm cannot run this call */
    FA_ERR_OUT_OF_MEMORY = 12,    /* a workspace could not be allocated */
    FA_ERR_THREADS = 13,          /* worker threads could not be started */
    FA_ERR_ISA_UNAVAILABLE = 14,  /* FLASHATTN_ARCH names a path this CPU or build lacks */
    FA_ERR_OUT_OF_RANGE = 15,     /* an index or length points outside its tensor: KV cache overflow, a bad
                                     page id or batch_idx, cu_seqlens not non-decreasing within the packed length */
    FA_ERR_BUSY = 16,             /* the context is in use by another thread; nothing was touched */
    FA_ERR_IO = 17                /* fa_tune: the tune file could not be read, replaced or written */
} fa_status;

/* A fixed description of a status code; never NULL. */
FA_API const char *fa_status_string(fa_status status);

/* ------------------------------------------------------------------ dtype */

typedef enum fa_dtype {
    FA_DTYPE_F32 = 0,
    FA_DTYPE_F16 = 1,  /* IEEE binary16 */
    FA_DTYPE_BF16 = 2, /* bfloat16 */
    FA_DTYPE_BOOL = 3, /* 1 byte, non-zero = true; only for fa_forward_args.mask */
    FA_DTYPE_I8 = 4,   /* signed 8-bit with f32 scales (per (token, kv head) or shared); only for KV caches */
    FA_DTYPE_F8E4M3 = 5, /* OCP FP8 E4M3 ("fn": bias 7, no inf, NaN = S.1111.111, max 448), with f32
                            scales as i8 has; only for KV caches */
    FA_DTYPE_F8E5M2 = 6  /* OCP FP8 E5M2 (bias 15, IEEE-like inf and NaN, max 57344), with f32 scales
                            as i8 has; only for KV caches */
} fa_dtype;

FA_API size_t fa_dtype_size(fa_dtype dtype); /* bytes per element; 0 if unknown */
FA_API const char *fa_dtype_name(fa_dtype dtype);

/* ----------------------------------------------------------------- tensor */

/*
 * A view of 4-d data: element (i0, i1, i2, i3) lives at
 *   (char *)data + (i0*stride[0] + i1*stride[1] + i2*stride[2] + i3*stride[3]) * fa_dtype_size(dtype).
 * Strides count elements, may be any value (0 broadcasts, negative walks backwards),
 * and are combined in 64-bit arithmetic.
 *
 * q, k, v and o always have the logical order (batch, seq, head, dim); the memory
 * layout is only the strides. fa_tensor_make() builds the named layouts.
 */
typedef struct fa_tensor {
    void *data;
    fa_dtype dtype;
    int64_t shape[4];
    int64_t stride[4];
} fa_tensor;

typedef enum fa_layout {
    FA_LAYOUT_BSND = 0, /* [B, S, N, D] contiguous: FlashAttention's */
    FA_LAYOUT_BNSD = 1, /* [B, N, S, D] contiguous: PyTorch's */
    FA_LAYOUT_BSH = 2,  /* [B, S, N*D]: the same strides as BSND */
    FA_LAYOUT_SBH = 3   /* [S, B, N*D] */
} fa_layout;

/* A (batch, seq, head, dim) view of `data` stored in `layout`. */
FA_API fa_tensor fa_tensor_make(void *data, fa_dtype dtype, fa_layout layout,
                                int64_t batch, int64_t seq, int64_t heads, int64_t dim);
/* A plain row-major 4-d view: for bias, mask and lse. */
FA_API fa_tensor fa_tensor_contiguous(void *data, fa_dtype dtype,
                                      int64_t d0, int64_t d1, int64_t d2, int64_t d3);

/* ---------------------------------------------------------------- context */

typedef struct fa_context fa_context;

typedef enum fa_algo {
    FA_ALGO_AUTO = 0,      /* flash whenever flash supports the call (today: always) */
    FA_ALGO_FLASH = 1,     /* tiled, online softmax, O(N) memory */
    FA_ALGO_STANDARD = 2,  /* materialises S and P per head, like eager PyTorch: the baseline */
    FA_ALGO_REFERENCE = 3  /* plain loops in double: the oracle; slow, single-threaded */
} fa_algo;

/*
 * Settings and read-outs of a context. Read-only ones (marked) fail with
 * FA_ERR_INVALID_ARGUMENT on fa_context_set.
 */
typedef enum fa_param {
    FA_PARAM_THREADS = 1,          /* worker threads incl. the caller; 0 = one per online CPU (default) */
    FA_PARAM_ALGO = 2,             /* an fa_algo; default FA_ALGO_AUTO */
    FA_PARAM_TILE_Q = 3,           /* flash query rows per tile; 0 = planned from the caches (default) */
    FA_PARAM_TILE_KV = 4,          /* flash key/value rows per tile; 0 = planned (default) */
    FA_PARAM_VERBOSE = 5,          /* 1 = one line per call on stderr; default from FLASHATTN_VERBOSE */
    FA_PARAM_BF16_DOT = 6,         /* bf16 inputs as bf16-pair dot products where the path has them:
                                      0 = auto (where they outrun fp32 FMA), 1 = on, 2 = off;
                                      default from FLASHATTN_BF16_DOT */
    FA_PARAM_KV_SPLITS = 7,        /* split-KV: chunks each sequence's keys are cut into, each chunk a
                                      task whose partial (o, lse) are merged exactly;
                                      0 = planned (default: see fa_forward), 1..256 = forced */
    FA_PARAM_KV_PACK = 8,          /* flash forward: copy each (sequence, kv head)'s K and V once into
                                      dense rows in the kernels' layout, shared by all its query blocks:
                                      0 = auto (where conversion, strides or bf16 pairing would otherwise
                                      be redone per query block, for enough of them; default), 1 = never,
                                      2 = wherever a (sequence, kv head) has two or more wide tasks.
                                      Same bits either way (docs/semantics.md, "Packed K/V") */
    FA_PARAM_F32_MATMUL = 9,       /* f32 q/k/v, flash forward's wide path, on a table with bf16 dot
                                      products (else ignored): 0 = ieee (fp32 FMA; default),
                                      1 = bf16x3 (each operand split into bf16 hi + lo, three products:
                                      hi.hi + hi.lo + lo.hi; ~fp32 accuracy), 2 = bf16 (one product of
                                      the bf16-rounded operands); never the default. Default from
                                      FLASHATTN_F32_MATMUL=ieee|bf16x3|bf16 (docs/semantics.md, 5);
                                      fa_forward_args.f32_matmul overrides it per call */
    FA_PARAM_QUANT_MATMUL = 10,    /* forward products on int8 codes (docs/semantics.md, 11): 0 = exact
                                      (default), 1 = i8 (q.k as int8 x int8, P.V as u8 P x int8 V, int32
                                      sums), 2 = i8x2 (the same with two int8 digits per q and P value,
                                      ~100x more accurate); never the default; taken by prefill (float
                                      K/V, int8 caches) and by decoding over int8 caches on tables with
                                      integer dot products, elsewhere ignored; fa_forward_args.
                                      quant_matmul overrides it per call; fa_backward refuses a
                                      call whose mode is not 0. Default from
                                      FLASHATTN_QUANT_MATMUL=exact|i8|i8x2 */
    FA_PARAM_BF16_FUSED = 11,      /* bf16 flash forward on a table with a fused tile kernel (amx,
                                      amx-model; else ignored): 1 = the fused kernel (row-major
                                      scores, P as bf16, lazy rescale) where it applies (default),
                                      0 = the per-tile kernels (docs/semantics.md, 5, "Fused bf16
                                      forward"). Default 1 unless FLASHATTN_BF16_FUSED=0 */
    FA_PARAM_PROFILE = 12,         /* 1 = time the phases of the flash loops (the FA_PARAM_LAST_PHASE_*
                                      read-outs) without the verbose trace's line; 0 = off (default:
                                      nothing is timed unless FLASHATTN_VERBOSE is on) */
    FA_PARAM_LAST_ALGO = 100,      /* read-only: the fa_algo the last successful call ran */
    FA_PARAM_LAST_EXTRA_BYTES = 101, /* read-only: peak bytes the last successful call allocated */
    FA_PARAM_LAST_TILE_Q = 102,    /* read-only: query rows per tile the last flash call used (0 otherwise) */
    FA_PARAM_LAST_TILE_KV = 103,   /* read-only: key/value rows per tile it used (0 otherwise) */
    FA_PARAM_LAST_THREADS = 104,   /* read-only: threads the last call ran on */
    FA_PARAM_BF16_DOT_ACTIVE = 105, /* read-only: 1 if bf16 inputs take the bf16 dot-product path now */
    FA_PARAM_LAST_KV_SPLITS = 106, /* read-only: the most chunks any sequence's keys were split into last call */
    FA_PARAM_LAST_BACKWARD_PASSES = 107, /* read-only: how the last flash backward ran: 1 = one fused walk
                                      per (sequence, kv head), 2 = two passes of finer tasks (key tiles
                                      for dK and dV, query blocks for dQ), taken when the fused walks
                                      are too few for the threads; same bits either way; 0 otherwise */
    FA_PARAM_LAST_KV_PACKED = 108, /* read-only: (sequence, kv head) units whose K/V the last flash
                                      forward packed (FA_PARAM_KV_PACK); 0 otherwise */
    FA_PARAM_LAST_KV_PACK_US = 109, /* read-only: microseconds the last flash forward's threads spent
                                      packing K/V, summed over the threads; 0 otherwise */
    FA_PARAM_LAST_POOL = 110,      /* read-only: where the last successful call's parallel work ran:
                                      0 = the context's own threads, 1 = the host's parallel-for
                                      (fa_context_set_parallel), 2 = the host's, but its parallel-for
                                      failed (returned nonzero or left a share) and the calling thread
                                      ran the shares it left: the results are complete all the same */
    /* read-only, with FA_PARAM_PROFILE or FA_PARAM_VERBOSE on: the last flash call's phase k
     * (k < FA_PHASES) at FA_PARAM_LAST_PHASE_US + k, its thread CPU time in microseconds summed
     * over the threads, and at FA_PARAM_LAST_PHASE_FLOP + k the FLOPs of the products that ran
     * in it (2 D per kept (i, j) pair and head for Q K^T, 2 Dv for P V; the fused bf16 kernel's
     * both in P, where they interleave with the softmax). The forward's phases are S, X, P, M
     * (scores, masks and softmax, P V, the merge of split-KV chunks), the backward's S, X,
     * dP, dS, dV, dK, dQ (docs/usage.md, FLASHATTN_VERBOSE; the fused bf16 tile's all in S); 0 for
     * other calls */
    FA_PARAM_LAST_PHASE_US = 120,
    FA_PARAM_LAST_PHASE_FLOP = 130
} fa_param;

/* The phases FA_PARAM_LAST_PHASE_US / _FLOP count. */
#define FA_PHASES 7

/* *out receives a new context, or NULL on failure. */
FA_API fa_status fa_context_create(fa_context **out);
/* Joins the worker threads and frees the context; NULL is fine. */
FA_API void fa_context_free(fa_context *ctx);
FA_API fa_status fa_context_set(fa_context *ctx, fa_param param, int64_t value);
FA_API fa_status fa_context_get(const fa_context *ctx, fa_param param, int64_t *value);
/* The values fa_context_set accepts for `param`, inclusive. */
FA_API fa_status fa_param_bounds(fa_param param, int64_t *lo, int64_t *hi);
/* What the last failed call on ctx found wrong, in words; "" after a success. */
FA_API const char *fa_context_error(const fa_context *ctx);
/* The micro-kernel path this context runs: "ref", "avx2", "avx512", "avx512bf16",
 * "amx" or "neon" (or "amx-model", only by name); the best the CPU has, or the one
 * FLASHATTN_ARCH names. */
FA_API const char *fa_context_isa(const fa_context *ctx);
/* The kernel paths this build has, best first: for index 0, 1, ... their name and
 * whether this machine runs them (1, or 0 with *why saying why not; "" when it runs);
 * -1 past the last. name and why may be NULL; the strings are static. */
FA_API int fa_isa_info(int index, const char **name, const char **why);

/*
 * The host's threads. By default a context runs its parallel work on worker threads
 * of its own (FA_PARAM_THREADS of them, the caller included). A program that has a
 * thread pool already (an OpenMP runtime, oneDNN's threadpool, pthreadpool) can have
 * the library run on it instead, so that two pools never take turns on the same
 * cores: fa_context_set_parallel(ctx, fn, user) installs a parallel-for, and the
 * context's own worker threads are joined.
 *
 * The library calls fn(user, nth, task, task_arg) on the calling thread, with
 * 2 <= nth <= FA_PARAM_THREADS (a job of one share runs on the calling thread
 * directly). fn must call task(task_arg, ith, nth) once for each ith in [0, nth),
 * in any order, on any threads, at the same time or one after another (a loop on
 * the calling thread is a valid fn), and return 0 once every one of them has
 * returned. The shares split their work through shared counters, so a share may
 * find nothing left; no share waits for a share that has not started, so fewer
 * host threads than shares cannot deadlock. Whichever thread runs a share, the
 * library sets up and releases its per-thread state (AMX tiles) around it.
 *
 * Results are bitwise the same as on the own pool at the same FA_PARAM_THREADS,
 * and as at any other thread count (docs/semantics.md, "The host's threads"): which thread
 * runs which share never shows in the outputs. FA_PARAM_THREADS keeps its meaning
 * (the shares a job is cut into; 0 = one per online CPU): set it to the host
 * pool's size.
 *
 * A fn that returns nonzero, returns with a share not run, or calls task for a
 * share twice or outside [0, nth) (or with another nth) has failed: the stray calls
 * run nothing, the calling thread runs every share left, the call still completes
 * with the same bits, and FA_PARAM_LAST_POOL says 2.
 *
 * fn = NULL returns to the context's own threads (FA_PARAM_THREADS of them). On
 * failure (FA_ERR_THREADS: they could not be started) the context keeps its
 * previous pool. Like fa_context_set, it returns FA_ERR_BUSY while a call runs
 * on ctx (another thread's, or the one whose parallel-for is calling), and touches
 * nothing then. fn and user must stay
 * valid until replaced or the context is freed. This function and
 * FA_PARAM_LAST_POOL were appended to the API; callers that never use them run
 * exactly as before.
 */
typedef void (*fa_parallel_task)(void *task_arg, int ith, int nth);
typedef int (*fa_parallel_fn)(void *user, int nth, fa_parallel_task task, void *task_arg);
FA_API fa_status fa_context_set_parallel(fa_context *ctx, fa_parallel_fn fn, void *user);
/* The CPU features the library detected, space separated, e.g. "sse2 avx2 fma f16c". */
FA_API const char *fa_cpu_features(void);
/* The CPU model that keys the tune file's entries: x86 the CPUID brand string, aarch64
 * MIDR_EL1 as the kernel shows it ("0x...."), macOS the brand string, else "unknown";
 * printable, blanks trimmed and runs of them made one space. Detected once. */
FA_API const char *fa_cpu_model(void);
FA_API const char *fa_algo_name(fa_algo algo);

typedef enum fa_probe_kind {
    FA_PROBE_FMA_PEAK = 1, /* GFLOP/s of the path's widest fp32 FMA, on the context's threads */
    FA_PROBE_BF16_PEAK = 2, /* GFLOP/s of its bf16 dot product (FA_ERR_UNSUPPORTED where it has none) */
    FA_PROBE_READ_BW = 3,   /* GB/s (1e9 bytes) of streaming reads from main memory, on the context's threads */
    FA_PROBE_TILE_PEAK = 4  /* GFLOP/s of the path's tile unit (bf16, e.g. AMX); FA_ERR_UNSUPPORTED where it has none */
} fa_probe_kind;

/* Measures the machine (about 0.1-0.5 s) so that benchmarks can report % of peak. */
FA_API fa_status fa_probe(fa_context *ctx, fa_probe_kind kind, double *value);

/* ---------------------------------------------------------------- forward */

typedef enum fa_causal {
    FA_CAUSAL_NONE = 0,
    FA_CAUSAL_BOTTOM_RIGHT = 1, /* keep j <= i + Sk - Sq (FlashAttention 2.1+) */
    FA_CAUSAL_TOP_LEFT = 2      /* keep j <= i (PyTorch is_causal) */
} fa_causal;

#define FA_WINDOW_UNBOUNDED (-1)

/*
 * Everything one forward call needs. Initialise with FA_FORWARD_ARGS_INIT (or
 * fa_forward_args_init()), then set what you use; untouched fields mean "off".
 * An optional tensor is absent when its data pointer is NULL.
 *
 *   B = batch, Sq/Sk = query/key length, Hq/Hk = query/kv heads, D = q/k head dim,
 *   Dv = v/o head dim. Query head h reads kv head h / (Hq/Hk): MHA, GQA, MQA.
 *
 * Adding a form (dropout, ...) appends fields after the last one below, each of
 * which defaults to "off" when zero, and bumps nothing else; the library tells old
 * callers apart by struct_size.
 *
 * The backward pass is its own call, fa_backward(ctx, const fa_backward_args *),
 * whose struct begins with struct_size and refers to the forward's arguments BY
 * POINTER (`const fa_forward_args *fwd`: the same q, k, v, o, lse, masks and
 * options the forward was called with), so that both structs keep growing
 * independently.
 */
typedef struct fa_forward_args {
    size_t struct_size;   /* sizeof(fa_forward_args) as the caller compiled it */

    fa_tensor q;          /* (B, Sq, Hq, D)  f32 | f16 | bf16 */
    fa_tensor k;          /* (B, Sk, Hk, D)  same dtype as q; new cache rows: any of f32, f16, bf16 (kv_cache) */
    fa_tensor v;          /* (B, Sk, Hk, Dv) same dtype as q; new cache rows: any of f32, f16, bf16 (kv_cache) */
    fa_tensor o;          /* (B, Sq, Hq, Dv) output: q's dtype or f32 */
    fa_tensor lse;        /* optional output (B, Hq, Sq, 1) f32: natural-log sum-exp, -inf (or the sink) for empty rows */

    float scale;          /* 0 = 1/sqrt(D); otherwise any finite value */
    float softcap;        /* 0 = off; > 0: s = softcap * tanh(s / softcap) */
    fa_causal causal;
    int64_t window_left;  /* FA_WINDOW_UNBOUNDED or >= 0; bottom-right aligned */
    int64_t window_right; /* FA_WINDOW_UNBOUNDED or >= 0 */

    const float *alibi_slopes; /* optional: s += -slope * |i + Sk - Sq - j| */
    int64_t alibi_stride_b;    /* slope(b, h) = alibi_slopes[b * alibi_stride_b + h]: 0 for [Hq], Hq for [B, Hq] */

    fa_tensor bias;       /* optional additive, f32 | f16 | bf16, shape (B|1, Hq|1, Sq|1, Sk|1) */
    fa_tensor mask;       /* optional FA_DTYPE_BOOL, same broadcast; true = attend (PyTorch's convention) */

    /* ---- variable length (FlashAttention's varlen): sequences packed along the seq axis.
     * With cu_seqlens_q set, q and o are (1, total_q, H, D) and sequence b owns rows
     * cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1; lse is (1, Hq, total_q, 1). k and v are
     * packed the same way by cu_seqlens_k (without a KV cache: required; with one:
     * they are the new rows, see kv_cache). Both arrays have num_seqs + 1 int32
     * entries, non-decreasing, from >= 0 to at most the packed length. Causal
     * alignment, window and ALiBi apply per sequence; bias and mask are not accepted. */
    const int32_t *cu_seqlens_q;
    const int32_t *cu_seqlens_k;
    int64_t num_seqs;     /* B for varlen calls */

    /* ---- KV cache: when set, keys and values come from the cache (see fa_kv_cache);
     * k and v, if their data is non-NULL, are NEW rows (B, S_new, Hk, D), or packed by
     * cu_seqlens_k, appended in place at cache->seqlens[b] before attending, so that
     * sequence b attends to seqlens[b] + S_new keys (causal: bottom-right over them).
     * New rows may be f32, f16 or bf16 whatever q's and the cache's dtypes (k and v
     * may differ too): each is rounded to the cache's dtype as fa_kv_cache says, and
     * the call attends to the values the cache then holds. With cache->v_in_k, v is
     * empty or the view of k's first Dv columns. The cache is not modified when the
     * call fails. bias and mask are not accepted. */
    const struct fa_kv_cache *kv_cache;

    /* ---- positions, for a shard of a longer sequence (ring attention, chunked
     * prefill): query row i sits at position q_start + i, key j at k_start + j, each
     * in [0, 2^60]. The diagonal every band-shaped rule measures from is
     *   diag(i) = i + q_start - k_start  (+ Sk - Sq when aligned bottom-right),
     * so causal bottom-right keeps j <= diag(i), top-left keeps j <= i + q_start - k_start,
     * windows keep diag(i) - left <= j <= diag(i) + right and ALiBi adds
     * -slope * |diag(i) - j|. For equal-length shards of one self-attention sequence,
     * pass the shards' global starts; the general rule for any shard is in
     * docs/semantics.md, section 4. q_start + Sq and k_start + Sk stay within 2^60
     * (else FA_ERR_OVERFLOW). Per sequence for varlen and cached calls. */
    int64_t q_start;
    int64_t k_start;

    /* ---- dropout (training; docs/semantics.md, section 6): p_ij *= keep_ij / (1 - dropout_p)
     * after the softmax, with keep_ij drawn by Philox4x32-10 from (seed, offset) and the
     * element's (b, h, i, j), so the mask is the same for any tiling, thread count or ISA;
     * i and j are positions (q_start + i, k_start + j), so shards of one sequence draw the
     * mask of the whole. The lse stays that of the undropped row. Not with a KV cache. */
    float dropout_p;          /* [0, 1); 0 = off */
    uint32_t dropout_offset;  /* the caller's call counter: a new one per layer and step */
    uint64_t dropout_seed;
    /* optional output, for tests (it costs O(Sq*Sk)): (B, Hq, Sq, Sk) FA_DTYPE_BOOL, 1 = kept,
     * for every (b, h, i, j) whether masked or not; dense calls only */
    fa_tensor dropout_mask;

    /* ---- attention sinks (gpt-oss; docs/semantics.md, section 3, step 6): one learnable
     * logit per query head, the same for every batch row and sequence. Row i of head h
     * gets one more term in its softmax normaliser and no value:
     *   lse_i = log(sum_j exp(s_ij) + exp(sinks[h])),  o_i = sum_j exp(s_ij - lse_i) v_j.
     * A raw logit: no scale, softcap or ALiBi; never dropped. A row that keeps no key
     * gives o = 0, lse = sinks[h]. NULL = off; else the caller provides Hq floats;
     * -inf = no sink for that head; NaN makes the head's lse NaN, and o of every row that
     * keeps a key; +inf is refused
     * (FA_ERR_INVALID_ARGUMENT). Every algorithm and form; split-KV adds it once. */
    const float *sinks;

    /* ---- split-KV for this call (flash-attn's num_splits; docs/semantics.md, section 8):
     * 1..256 cuts each sequence's keys into that many chunks, as FA_PARAM_KV_SPLITS does
     * for every call of a context; 0 (default) leaves it to the context's setting (itself
     * 0 = planned from the shapes). Other values: FA_ERR_INVALID_ARGUMENT. */
    int64_t kv_splits;

    /* ---- block mask (FlexAttention's BlockMask; docs/semantics.md, "Block mask"): the
     * kv blocks each q block visits, each whole or with an element mask of its own.
     * NULL = none. Dense and varlen calls, forward and backward; KV caches (a decoding
     * step's tree mask: kv blocks count the keys after the append). Combines with every
     * other mask: a pair is kept iff all keep it. */
    const struct fa_block_mask *block_mask;

    /* ---- quantised products for this call (docs/semantics.md, section 11): -1 (default)
     * = the context's FA_PARAM_QUANT_MATMUL; 0 exact, 1 i8, 2 i8x2 = that mode for this
     * call alone, whatever the context's. fa_backward refuses fwd args whose mode (this,
     * or the context's where this is -1) is not 0. Other values: FA_ERR_INVALID_ARGUMENT. */
    int32_t quant_matmul;

    /* ---- f32 as bf16 products for this call (docs/semantics.md, section 5): -1 (default)
     * = the context's FA_PARAM_F32_MATMUL; 0 ieee, 1 bf16x3, 2 bf16 = that mode for this
     * call alone. Other values: FA_ERR_INVALID_ARGUMENT. */
    int32_t f32_matmul;
} fa_forward_args;

/*
 * The call's fields: one row per field of fa_forward_args, in the struct's order,
 *   X(name, key, ctype, TYPE, ROLE, default, doc)
 * name: the member; key: its keyword in keyword APIs (Python: flash-attn's names);
 * ctype: its C type; TYPE: an fa_field_type without FA_FIELD_; ROLE: an fa_field_role
 * without FA_ROLE_; default: its value in FA_FORWARD_ARGS_INIT (tensors: absent); doc:
 * one line. Everything that lists the fields derives from this table: the INIT macro
 * below, fa_args_field() (the library's description of itself, for other languages),
 * the Python binding's keywords and options object, the torch ops' schemas, the MPI
 * ring's agreement and the fuzz target. tests/test_fields.c fails when the struct above
 * and the table disagree. A new field is one member appended to the struct and one row
 * appended here.
 */
#define FA_FORWARD_FIELDS(X)                                                                                      \
    X(struct_size, "struct_size", size_t, SIZE, HEADER, sizeof(fa_forward_args),                                  \
      "sizeof(fa_forward_args) as the caller compiled it")                                                        \
    X(q, "q", fa_tensor, TENSOR, INPUT, 0, "(B, Sq, Hq, D) queries, f32 | f16 | bf16")                            \
    X(k, "k", fa_tensor, TENSOR, INPUT, 0, "(B, Sk, Hk, D) keys, q's dtype; with a KV cache the new rows")         \
    X(v, "v", fa_tensor, TENSOR, INPUT, 0, "(B, Sk, Hk, Dv) values, q's dtype; with a KV cache the new rows")      \
    X(o, "out", fa_tensor, TENSOR, OUTPUT, 0, "(B, Sq, Hq, Dv) output, q's dtype or f32")                          \
    X(lse, "softmax_lse", fa_tensor, TENSOR, OUTPUT, 0, "optional (B, Hq, Sq, 1) f32 output: each row's log-sum-exp") \
    X(scale, "scale", float, F32, OPTION, 0, "score scale; 0 = 1/sqrt(D)")                                        \
    X(softcap, "softcap", float, F32, OPTION, 0, "0 = off; > 0: s = softcap * tanh(s / softcap)")                  \
    X(causal, "causal", fa_causal, I32, OPTION, FA_CAUSAL_NONE, "an fa_causal: 0 none, 1 bottom-right, 2 top-left") \
    X(window_left, "window_left", int64_t, I64, OPTION, FA_WINDOW_UNBOUNDED,                                      \
      "keys kept before the diagonal; -1 = unbounded")                                                            \
    X(window_right, "window_right", int64_t, I64, OPTION, FA_WINDOW_UNBOUNDED,                                    \
      "keys kept after the diagonal; -1 = unbounded")                                                             \
    X(alibi_slopes, "alibi_slopes", const float *, PTR, INPUT, 0,                                                 \
      "optional [Hq] or [B, Hq] f32 ALiBi slopes: s += -slope * |diag(i) - j|")                                   \
    X(alibi_stride_b, "alibi_stride_b", int64_t, I64, DERIVED, 0, "slopes per batch row: 0 for [Hq], Hq for [B, Hq]") \
    X(bias, "bias", fa_tensor, TENSOR, INPUT, 0, "optional additive bias, broadcast to (B, Hq, Sq, Sk)")          \
    X(mask, "mask", fa_tensor, TENSOR, INPUT, 0, "optional bool mask, broadcast likewise; true = attend")         \
    X(cu_seqlens_q, "cu_seqlens_q", const int32_t *, PTR, INPUT, 0, "varlen: [num_seqs + 1] query row offsets")    \
    X(cu_seqlens_k, "cu_seqlens_k", const int32_t *, PTR, INPUT, 0, "varlen: [num_seqs + 1] key row offsets")      \
    X(num_seqs, "num_seqs", int64_t, I64, DERIVED, 0, "varlen: the number of sequences")                          \
    X(kv_cache, "kv_cache", const struct fa_kv_cache *, PTR, FORM, 0, "optional KV cache the keys come from")     \
    X(q_start, "q_start", int64_t, I64, OPTION, 0, "position of query row 0 (a shard, a prefill chunk)")          \
    X(k_start, "k_start", int64_t, I64, OPTION, 0, "position of key row 0")                                       \
    X(dropout_p, "dropout_p", float, F32, OPTION, 0, "dropout probability in [0, 1); 0 = off")                    \
    X(dropout_offset, "dropout_offset", uint32_t, U32, OPTION, 0, "dropout: the caller's call counter")           \
    X(dropout_seed, "dropout_seed", uint64_t, U64, OPTION, 0, "dropout: the Philox seed")                         \
    X(dropout_mask, "dropout_mask", fa_tensor, TENSOR, OUTPUT, 0, "optional (B, Hq, Sq, Sk) bool output: kept = 1") \
    X(sinks, "sinks", const float *, PTR, INPUT, 0, "optional [Hq] f32 attention-sink logits")                \
    X(kv_splits, "kv_splits", int64_t, I64, OPTION, 0, "split-KV chunks per sequence, 1..256; 0 = the context's") \
    X(block_mask, "block_mask", const struct fa_block_mask *, PTR, FORM, 0,                                       \
      "optional block mask: the kv blocks each q block visits, whole or with element bits")                        \
    X(quant_matmul, "quant_matmul", int32_t, I32, OPTION, -1,                                                     \
      "int8 products for this call: -1 = the context's FA_PARAM_QUANT_MATMUL, 0 exact, 1 i8, 2 i8x2")          \
    X(f32_matmul, "f32_matmul", int32_t, I32, OPTION, -1,                                                         \
      "f32 as bf16 products for this call: -1 = the context's FA_PARAM_F32_MATMUL, 0 ieee, 1 bf16x3, 2 bf16")

/* The initialisers the tables give: an absent tensor for TENSOR rows, else the default. */
#define FA_FIELD_INIT_(name, key, ctype, type, role, def, doc) FA_FIELD_INIT_##type(def),
#define FA_FIELD_INIT_TENSOR(def) {0}
#define FA_FIELD_INIT_SIZE(def) def
#define FA_FIELD_INIT_F32(def) def
#define FA_FIELD_INIT_I32(def) def
#define FA_FIELD_INIT_I64(def) def
#define FA_FIELD_INIT_U32(def) def
#define FA_FIELD_INIT_U64(def) def
#define FA_FIELD_INIT_PTR(def) def

#define FA_FORWARD_ARGS_INIT {FA_FORWARD_FIELDS(FA_FIELD_INIT_)}

/* The largest position q_start + Sq or k_start + Sk may reach. */
#define FA_POSITION_MAX ((int64_t)1 << 60)

/*
 * A KV cache (FlashAttention's flash_attn_with_kvcache, vLLM's paged cache).
 *
 * Contiguous (block_table == NULL): k, v are (B_cache, S_max, Hk, D / Dv); batch row b
 *   uses cache row batch_idx ? batch_idx[b] : b.
 * Paged (block_table != NULL): k, v are pools (num_pages, page_size, Hk, D / Dv) of
 *   pages of any page_size >= 1; key j of sequence b is row j % page_size of page
 *   block_table[b * max_pages + j / page_size]. Pages may be shared by sequences.
 *
 * dtype: f32, f16, bf16 (need not match q's), or a quantised one: FA_DTYPE_I8,
 *   FA_DTYPE_F8E4M3 or FA_DTYPE_F8E5M2, which need k_scale and v_scale: f32
 *   (.., .., Hk, 1) with the same first three dims as k, v; the value is scale * code
 *   (the int8, or the fp8 number). A scale tensor may broadcast: stride[1] == 0 makes
 *   one scale shared by a cache row's or page's tokens (stride[0] == stride[2] == 0 as
 *   well: one per tensor). Appending to a quantised cache: where a scale tensor's
 *   stride[1] is 0 the new rows are quantised with the stored scale, which is never
 *   written; otherwise each new (token, head) row gets its own scale, max|x| / FMAX
 *   (127 for i8, 448 for E4M3, 57344 for E5M2; an all-zero row gets 0), stored in its
 *   slot. Codes are x * (1 / scale) (0 for a scale <= 0) rounded to nearest, ties to even, saturating
 *   (i8 to [-127, 127], fp8 finite values to +-FMAX; fp8 subnormals as the format
 *   has them; NaN stays NaN, and E5M2 keeps +-inf, E4M3 makes it NaN; a per-row
 *   scale of a row holding NaN or inf is NaN or inf). Appending to a
 *   float cache rounds to its dtype.
 *   New rows (fa_forward_args.k, .v) may be f32, f16 or bf16, each whatever
 *   q's dtype and the other's: they are converted exactly to f32 and then rounded
 *   (to nearest even) or quantised into the cache's dtype, once.
 * MLA latent cache (v_in_k = 1; DeepSeek V2/V3's absorbed decoding, e.g. Hk = 1,
 *   D = 576, Dv = 512): V is the first Dv <= D columns of K's rows, not a tensor of
 *   its own. v is then either empty (data NULL: Dv is o's head dim) or exactly that
 *   view: k's data, dtype, first three dims and strides, shape[3] = Dv. Likewise the
 *   new rows' v is empty or the view of the new k's first Dv columns (v alone is
 *   refused). An append writes each shared row once, as K's row; a quantised latent
 *   cache has one scale per (token, kv head), k_scale, which V shares: v_scale is
 *   empty or k_scale itself, and a per-row scale is max|x| / FMAX over all D columns.
 *   Every cache form (contiguous, batch_idx, paged, varlen, split-KV, quantised) takes it.
 *   A V alias that does not fit inside K's rows is refused before anything is
 *   written: Dv > D is FA_ERR_SHAPE_MISMATCH; a v, new v or v_scale that is not the
 *   view of K's (other data, dtype or strides), or v_in_k not 0 or 1, is
 *   FA_ERR_INVALID_ARGUMENT.
 * Errors, all caught before anything is written: FA_ERR_OUT_OF_RANGE for
 *   seqlens[b] < 0, seqlens[b] + S_new beyond S_max (or max_pages * page_size), a
 *   page id outside [0, num_pages) among the pages a sequence uses, a batch_idx
 *   outside [0, B_cache), a leftpad[b] outside [0, seqlens[b]], and bad cu_seqlens;
 *   FA_ERR_INVALID_ARGUMENT for two
 *   appended rows landing in the same cache slot, and batch_idx or leftpad with a
 *   block table;
 *   FA_ERR_NULL_POINTER for a missing seqlens or scales of a quantised cache; FA_ERR_SHAPE_MISMATCH
 *   for a batch larger than the cache without batch_idx, or shapes that disagree;
 *   FA_ERR_UNSUPPORTED for bias or mask; FA_ERR_STRUCT_SIZE for a struct_size that
 *   is not one this library knows (initialise with FA_KV_CACHE_INIT).
 */
typedef struct fa_kv_cache {
    size_t struct_size;          /* sizeof(fa_kv_cache) as the caller compiled it */
    fa_tensor k, v;
    fa_tensor k_scale, v_scale;  /* quantised (i8, fp8) caches only */
    const int32_t *seqlens;      /* [B] valid rows per sequence before the append; required */
    const int32_t *batch_idx;    /* [B] optional, contiguous caches only */
    const int32_t *block_table;  /* [B * max_pages] page ids; NULL = contiguous */
    int64_t max_pages;           /* entries per block_table row */
    int v_in_k;                  /* 1: V is the first Dv columns of K's rows (MLA latent cache, above); 0 default */
    /* [B] optional, contiguous caches only (FlashAttention's cache_leftpad): sequence b's
     * keys start at row leftpad[b] of its cache row; the rows before it are padding,
     * never read. seqlens[b] still counts from the cache row's start (the new rows go to
     * row seqlens[b]), so the sequence holds seqlens[b] - leftpad[b] keys before the
     * append, and every rule (causal alignment, windows, ALiBi) sees only those:
     * key j of the sequence is row leftpad[b] + j. 0 <= leftpad[b] <= seqlens[b], else
     * FA_ERR_OUT_OF_RANGE; with a block table FA_ERR_INVALID_ARGUMENT. */
    const int32_t *leftpad;
} fa_kv_cache;

/* fa_kv_cache's fields, as FA_FORWARD_FIELDS. */
#define FA_KV_CACHE_FIELDS(X)                                                                                     \
    X(struct_size, "struct_size", size_t, SIZE, HEADER, sizeof(fa_kv_cache), "sizeof(fa_kv_cache) as the caller compiled it") \
    X(k, "k_cache", fa_tensor, TENSOR, INOUT, 0, "(B_cache, S_max, Hk, D) or paged (pages, page_size, Hk, D) keys") \
    X(v, "v_cache", fa_tensor, TENSOR, INOUT, 0, "the values, as k with Dv")                                     \
    X(k_scale, "k_scale", fa_tensor, TENSOR, INOUT, 0, "quantised caches: (.., .., Hk, 1) f32 key scales")        \
    X(v_scale, "v_scale", fa_tensor, TENSOR, INOUT, 0, "quantised caches: (.., .., Hk, 1) f32 value scales")      \
    X(seqlens, "cache_seqlens", const int32_t *, PTR, INPUT, 0, "[B] valid rows per sequence before the append")  \
    X(batch_idx, "cache_batch_idx", const int32_t *, PTR, INPUT, 0, "optional [B] cache row of each sequence")    \
    X(block_table, "block_table", const int32_t *, PTR, INPUT, 0, "optional [B, max_pages] page ids (paged)")     \
    X(max_pages, "max_pages", int64_t, I64, DERIVED, 0, "entries per block_table row")                          \
    X(v_in_k, "v_in_k", int, I32, OPTION, 0, "1: V is the first Dv columns of K's rows (MLA latent cache)")       \
    X(leftpad, "cache_leftpad", const int32_t *, PTR, INPUT, 0, "optional [B] first key row of each sequence")

#define FA_KV_CACHE_INIT {FA_KV_CACHE_FIELDS(FA_FIELD_INIT_)}
FA_API void fa_kv_cache_init(fa_kv_cache *cache);

/*
 * A block mask (docs/semantics.md, "Block mask"; FlexAttention's BlockMask). Query rows
 * are cut into q blocks of block_q rows (q block qb holds rows qb*block_q ..), keys into
 * kv blocks of block_k keys, from each sequence's first row and key. For every
 * (batch row, head, q block) -- a mask row, numbered
 *   r = (b * heads + h) * q_blocks + qb   (b = 0 when batch == 1, h = 0 when heads == 1)
 * -- kv_blocks[offsets[r] .. offsets[r+1]-1] lists the kv blocks its rows may attend to,
 * in any order, each at most once; every other kv block is removed for those rows. An
 * entry e is full (partial == NULL or partial[e] == -1: every pair of the block kept) or
 * partial (partial[e] = p >= 0: element mask number p of `bits` decides each pair). A
 * row with no entry keeps no key (o = 0, lse = -inf or the sink).
 *
 * Element mask p is block_q rows of ceil(block_k / 8) bytes, at
 *   bits + p * block_q * ceil(block_k / 8);
 * pair (row r, key c) of the block (0 <= r < block_q, 0 <= c < block_k) is bit (c % 8)
 * (value 1 << (c % 8)) of byte r * ceil(block_k / 8) + c / 8, 1 = keep (numpy's
 * packbits(..., bitorder="little") of each row). Bits past the last row or key of a
 * sequence are ignored. Element masks may be shared by any number of entries.
 *
 * Broadcast: batch is 1 or B (num_seqs in a varlen call), heads 1 or Hq (query heads:
 * under GQA each query head has its own rows). q_blocks = ceil(Sq / block_q), Sq the
 * longest sequence's; a kv block index lies in [0, ceil(Sk / block_k)), Sk the longest
 * sequence's, keys after a cache append (a block past a shorter sequence's keys holds
 * none of them).
 *
 * Checked before anything is written: block_q, block_k in [1, 2^31), n_partial >= 0
 * (else FA_ERR_INVALID_ARGUMENT); batch, heads (FA_ERR_BROADCAST); q_blocks
 * (FA_ERR_SHAPE_MISMATCH); offsets NULL, kv_blocks NULL with entries, bits NULL with
 * n_partial > 0 (FA_ERR_NULL_POINTER); offsets[0] != 0 or decreasing, an index out of
 * range, partial[e] outside [-1, n_partial) (FA_ERR_OUT_OF_RANGE); a kv block listed
 * twice in one mask row (FA_ERR_INVALID_ARGUMENT); struct_size (FA_ERR_STRUCT_SIZE).
 */
typedef struct fa_block_mask {
    size_t struct_size;        /* sizeof(fa_block_mask) as the caller compiled it (FA_BLOCK_MASK_INIT) */
    int64_t block_q, block_k;  /* rows per q block, keys per kv block */
    int64_t batch, heads;      /* 1 (broadcast) or B; 1 (broadcast) or Hq */
    int64_t q_blocks;          /* q blocks per (batch row, head): ceil(Sq / block_q) */
    const int64_t *offsets;    /* [batch * heads * q_blocks + 1]: mask row r's entries are offsets[r] .. offsets[r+1]-1 */
    const int32_t *kv_blocks;  /* [offsets[last]] kv block of each entry */
    const int64_t *partial;    /* [offsets[last]] -1 = full, else its element mask; NULL = every entry full */
    const uint8_t *bits;       /* n_partial element masks, layout above */
    int64_t n_partial;
} fa_block_mask;

#define FA_BLOCK_MASK_INIT {sizeof(fa_block_mask), 0, 0, 1, 1, 0, 0, 0, 0, 0, 0}
FA_API void fa_block_mask_init(fa_block_mask *mask);

/* The same defaults as FA_FORWARD_ARGS_INIT, for languages without the macro. */
FA_API void fa_forward_args_init(fa_forward_args *args);

/*
 * o = softmax(mask(scale * q k^T + ...)) v, per docs/semantics.md, with the context's
 * algorithm and threads. On failure nothing is written to o or lse.
 * o must not overlap q, k, v, bias or mask.
 */
FA_API fa_status fa_forward(fa_context *ctx, const fa_forward_args *args);

/*
 * Validation alone: the status fa_forward would return for this call on this context
 * before running anything (the same checks, by the same code, for dense calls and
 * every inference form, the algorithm's support included), with the same
 * fa_context_error message. Writes nothing: not o, lse, dropout_mask or a KV cache,
 * and no FA_PARAM_LAST_* read-out. For a caller that must agree on validity before
 * it commits (the ring in libflashattn_mpi, a binding).
 */
FA_API fa_status fa_forward_check(fa_context *ctx, const fa_forward_args *args);

/*
 * The work of a forward call (docs/semantics.md, section 9), the one FLOP rule every
 * benchmark of this project reports: 2*(D+Dv) FLOPs per (i, j) pair the causal and
 * window band keeps, summed over batch (sequences) and query heads; bias and mask
 * values, softcap and ALiBi are not counted. Varlen and KV-cache calls count each
 * sequence at its own lengths (keys after the append), q_start/k_start place the band.
 */
typedef struct fa_work {
    size_t struct_size;     /* sizeof(fa_work) as the caller compiled it */
    int64_t pairs;          /* kept (i, j) pairs, summed over batch and Hq */
    double flops;           /* the forward's: 2*(D+Dv)*pairs */
    double backward_flops;  /* the backward's credit: 2.5 * flops (five products per pair
                               against the forward's two); a training step is flops + this */
} fa_work;

#define FA_WORK_INIT {sizeof(fa_work), 0, 0.0, 0.0}

/* Fills *out for `args`, which must be a call fa_forward_check accepts (else its
 * status and message). Nothing runs and nothing is written but *out. */
FA_API fa_status fa_forward_work(fa_context *ctx, const fa_forward_args *args, fa_work *out);

/*
 * The band of one row (docs/semantics.md, sections 3 and 4): the keys query row `row`
 * of sequence `seq` may see under the call's causal, window, q_start and k_start, as
 * [*lo, *hi], key indices of that sequence (0 = its first key; a KV cache's keys
 * after the append), clamped to its keys; empty when *lo > *hi. Both ends are
 * non-decreasing in row. Bias, mask, dropout and sinks are not part of the band.
 * `args` must be a call fa_forward_check accepts (else its status and message);
 * seq in [0, B) (varlen and cache calls: the sequence, at its own lengths; dense:
 * any batch row, all alike) and row in [0, Sq of that sequence), else
 * FA_ERR_OUT_OF_RANGE. Nothing runs and nothing is written but *lo and *hi.
 */
FA_API fa_status fa_forward_band(fa_context *ctx, const fa_forward_args *args, int64_t seq, int64_t row,
                                 int64_t *lo, int64_t *hi);

/*
 * The ring planner: the rules of attention over one sequence sharded along its
 * length across P ranks (context parallelism), without any transport. Rank r holds
 * S_r rows of the sequence (sharding below); at ring step s it holds the k/v shard
 * of rank (r - s) mod P and computes its queries against it in pieces, each one core
 * call with q_start/k_start placing it in the whole sequence (docs/semantics.md
 * section 4, docs/mpi.md). libflashattn_mpi and flashattn.torch.distributed ask it
 * and only move the bytes.
 *
 * Sharding: FA_RING_CONTIGUOUS: rank r holds global rows [S_0 + .. + S_{r-1}, + S_r).
 * FA_RING_ZIGZAG: the sequence is cut into 2P chunks; rank r holds chunk r and chunk
 * 2P-1-r, each S_r / 2 rows (S_r even), in that order: causal work is then balanced.
 */
typedef enum fa_ring_sharding {
    FA_RING_CONTIGUOUS = 0,
    FA_RING_ZIGZAG = 1
} fa_ring_sharding;

typedef struct fa_ring_plan {
    size_t struct_size;          /* sizeof(fa_ring_plan) as the caller compiled it */
    int nranks;                  /* P >= 1 */
    int rank;                    /* this rank, 0..P-1 */
    const int64_t *lengths;      /* (P) every rank's shard rows S_r >= 0; zig-zag: even */
    fa_ring_sharding sharding;
    /* the calls' options, as every rank's local fa_forward_args has them: causal (either
     * alignment: over one sequence both keep j <= i), window_left/right, alibi_slopes
     * (set or not) and dropout_p (> 0 or not) decide the placement; its tensors are
     * read only by fa_ring_describe and fa_ring_check (shapes, never data) */
    const fa_forward_args *call;
    int pieces;                  /* query-row pieces each (segment, segment) block is cut into, 0..1024;
                                    0 = 1. A window or ALiBi with dropout keeps blocks whole. */
    int whole_shards;            /* 1: a step whose calls read no position (no causal, window, ALiBi or
                                    dropout) is one call on the whole shards, positions 0 */
} fa_ring_plan;

#define FA_RING_PLAN_INIT {sizeof(fa_ring_plan), 1, 0, 0, FA_RING_CONTIGUOUS, 0, 0, 0}

/* A run of a shard's rows contiguous in the whole sequence. */
typedef struct fa_ring_segment {
    int64_t pos; /* global position of its first row */
    int64_t len; /* rows */
    int64_t off; /* its first row within the shard */
} fa_ring_segment;

/* Rank `rank`'s segments: one (contiguous) or two (zig-zag: chunk rank, then chunk
 * 2P-1-rank) into seg[0 .. *count). Needs plan->lengths, not plan->call; ctx may be
 * NULL (then a failure has no message). */
FA_API fa_status fa_ring_placement(fa_context *ctx, const fa_ring_plan *plan, int rank, fa_ring_segment seg[2],
                                   int *count);

/* One core call of a ring step: this rank's query rows against the visiting shard's keys. */
typedef struct fa_ring_piece {
    int64_t q_row, rows;         /* this rank's local query rows [q_row, q_row + rows) */
    int64_t k_row, keys;         /* the visiting shard's local keys [k_row, k_row + keys) */
    int64_t q_pos, k_pos;        /* the global positions of q_row and k_row */
    int64_t q_start, k_start;    /* the call's fa_forward_args.q_start and k_start */
    fa_causal causal;            /* the call's fa_forward_args.causal */
    int64_t kept;                /* kept (query, key) pairs, per (batch, head): fa_forward_work's count */
    int diagonal;                /* 1: the keys are the rows' own segment (step 0): every local row is in
                                    one such piece, where what a row adds once is added (dsinks) */
} fa_ring_piece;

/* Step `step` (0..P-1) of plan->rank: its pieces, in the order they run, into
 * out[0 .. *count) (pieces that keep nothing are left out). At most 4 * pieces
 * (pieces 0: 4); a smaller capacity is FA_ERR_OUT_OF_RANGE with *count the number. */
FA_API fa_status fa_ring_step(fa_context *ctx, const fa_ring_plan *plan, int step, fa_ring_piece *out, int capacity,
                              int *count);

/* The call of any block: `rows` query rows at global position q_pos against `keys`
 * keys at k_pos, placed and counted as fa_ring_step's pieces are (q_row = k_row = 0,
 * diagonal 0: the caller knows where its block lies). */
FA_API fa_status fa_ring_block(fa_context *ctx, const fa_ring_plan *plan, int64_t q_pos, int64_t rows, int64_t k_pos,
                               int64_t keys, fa_ring_piece *out);

/* Where a backward cuts its own step in two by kept pairs (the first part hides the
 * first transfer, the rest the gradients' way home): the fewest leading pieces that
 * hold at least half of the kept pairs. */
FA_API int fa_ring_split(const fa_ring_piece *pieces, int count);

/*
 * The agreement: what every rank of a ring must share before any data moves. Each
 * rank fills its descriptor (fa_ring_describe: its status, then its shapes and
 * options; only the status when it is not FA_OK), the transport gathers them rank by
 * rank (P x FA_RING_AGREE_FIELDS int64), and every rank reads the same verdict from
 * them (fa_ring_verdict). Then, with every rank's length known, fa_ring_check asks
 * the core about the ring as a whole, with the same answer on every rank.
 */
/* The descriptor: status, B, S_local, Hq, Hk, D, Dv, dtype, sharding, pieces and the
 * driver's value, then one slot per row of FA_FORWARD_FIELDS (an option by its bits,
 * an optional input by its presence), so a field added to the table is agreed on
 * without a line here. */
#define FA_RING_AGREE_ROW_(name, key, ctype, type, role, def, doc) +1
enum {
    FA_RING_AGREE_STATUS = 0,
    FA_RING_AGREE_S_LOCAL = 2,
    FA_RING_AGREE_TABLE = 11, /* the first table slot */
    FA_RING_AGREE_FIELDS = FA_RING_AGREE_TABLE FA_FORWARD_FIELDS(FA_RING_AGREE_ROW_)
};

/* `extra`: the driver's own agreed value (libflashattn_mpi: which gradients). */
FA_API void fa_ring_describe(const fa_ring_plan *plan, fa_status status, int64_t extra,
                             int64_t desc[FA_RING_AGREE_FIELDS]);
/* The field's name ("B", "window_left", ...); "" outside 0..FA_RING_AGREE_FIELDS-1. */
FA_API const char *fa_ring_agreement_name(int field);
/* FA_OK; or the status of the lowest rank that failed (*who that rank, *field -1);
 * or the status of the first field that rank *who and rank 0 differ on (*field). */
FA_API fa_status fa_ring_verdict(int nranks, const int64_t *all, int *who, int *field);
/* The ring as a whole, from agreed values only: the plan, the core's limits on the
 * longest call any rank makes (Smax rows against Smax keys at the end of the
 * sequence: positions within FA_POSITION_MAX, work within int64), and equal shard
 * lengths for a window or ALiBi with dropout (FA_ERR_UNSUPPORTED otherwise). */
FA_API fa_status fa_ring_check(fa_context *ctx, const fa_ring_plan *plan);

/* ------------------------------------------------------------------- tune */

/*
 * Tuned tile sizes. fa_tune times the flash forward of one call over a grid of
 * tile sizes (FA_PARAM_TILE_Q x FA_PARAM_TILE_KV) and over the planner's own
 * tiles, and saves the fastest pair in the tune file, keyed by the call's shape
 * class: the CPU model, the ISA path (fa_context_isa), the dtype, D, Dv, the
 * smallest powers of two at least Sk and the rows a task holds (Sq x Hq/Hk), and
 * whether a causal mask or a window is set. Every context reads that file once,
 * when it is made, and plans a matching entry's tiles instead of
 * the heuristic's (FA_PARAM_TILE_Q / _KV still win). docs/tool.md, "The tune file",
 * documents the file: its path, format (version 1) and rules.
 *
 * The call runs as given, many times: every candidate gets one warm-up and `runs`
 * timed forwards, and each writes o, lse, a dropout mask and a KV cache's appended
 * rows as fa_forward would (an append writes the same rows each time), so on
 * success they hold the last candidate's result. The sweep runs flash whatever
 * the context's algorithm, on its threads, with neither its tile settings nor the
 * tune file (the planned pair is the heuristic); the settings are restored after.
 * A context that tuned and saved reads the tune file again.
 *
 * Errors: the call is validated as fa_forward validates it; an empty call (no
 * rows or no keys: nothing to plan) is FA_ERR_INVALID_ARGUMENT. A candidate that
 * runs out of memory is recorded (ms NaN) and the sweep goes on; when none ran,
 * FA_ERR_OUT_OF_MEMORY. With `save`, an existing file that does not start with
 * the version line is refused before anything runs (FA_ERR_IO: it may be
 * something else the path points at by mistake), and so is a file that cannot be
 * written after the sweep: then, unlike every other failure, *result is filled
 * all the same (saved = 0), so the timings are not lost. The library never
 * prints: progress goes to the callback.
 */
#define FA_TUNE_MAX_TILES 16  /* candidates per side at most */
#define FA_TUNE_DEFAULT_RUNS 3

typedef struct fa_tune_options {
    size_t struct_size;     /* sizeof(fa_tune_options) as the caller compiled it */
    const int64_t *tile_qs; /* candidate query tiles, each in [1, 4096]; NULL: 16, 32, 64, 128, 256 */
    int n_tile_qs;          /* entries of tile_qs, 1..FA_TUNE_MAX_TILES */
    const int64_t *tile_kvs; /* candidate key/value tiles, each in [1, 65536]; NULL: 32, 64, 128, 256, 512 */
    int n_tile_kvs;
    int64_t runs;           /* timed runs per candidate after one warm-up, median kept; 0 = FA_TUNE_DEFAULT_RUNS */
    int save;               /* 1: save the best pair in the tune file (default); 0: only time */
    const char *path;       /* the tune file; NULL: the library's rule ($FLASHATTN_TUNE_FILE, else
                               $XDG_CACHE_HOME/flashattn/tune.txt, else $HOME/.cache/flashattn/tune.txt) */
    /* optional: called after each candidate, done of total, with its tiles as the call used
     * them (as asked when it ran out of memory; 0 x 0 asks for the planner's) and its
     * median milliseconds (NaN: out of memory). On the caller's thread. */
    void (*progress)(void *user, int done, int total, int64_t tile_q, int64_t tile_kv, double ms);
    void *user;
} fa_tune_options;

#define FA_TUNE_OPTIONS_INIT {sizeof(fa_tune_options), 0, 0, 0, 0, 0, 1, 0, 0, 0}
FA_API void fa_tune_options_init(fa_tune_options *options);

/* One timed candidate. */
typedef struct fa_tune_timing {
    int64_t tile_q, tile_kv;   /* as the call used them (FA_PARAM_LAST_TILE_Q/_KV: a tile longer than
                                  the rows or keys is cut to them); as asked when out of memory */
    int64_t asked_q, asked_kv; /* as set; 0 x 0: the planner's heuristic */
    double ms;                 /* median; NaN: out of memory */
} fa_tune_timing;

typedef struct fa_tune_result {
    size_t struct_size;        /* set by the caller: sizeof(fa_tune_result) (FA_TUNE_RESULT_INIT) */
    fa_tune_timing best;       /* the fastest */
    fa_tune_timing heuristic;  /* the planner's own tiles */
    int64_t saved_tile_q, saved_tile_kv; /* the entry's tiles: as asked (a tile cut to this call's
                                  length is cut to every length of its class too); the
                                  heuristic's as it ran */
    int64_t threads;           /* the threads the best candidate ran on */
    int64_t runs;              /* timed runs per candidate */
    int saved;                 /* 1: written to path */
    char path[4096];           /* the tune file, "" when there is none (see note) */
    char key[256];             /* the entry's shape class: "isa=.. dtype=.. d=.. dv=.. sk=.. rows=.. masked=.." */
    char cpu[64];              /* the CPU model the entry is for (its cpu= field) */
    char note[320];            /* why it was not saved, or what saving dropped; "" otherwise */
    int n_timings;             /* distinct pairs timed: a candidate that ran as an earlier one did is left out */
    fa_tune_timing timings[1 + FA_TUNE_MAX_TILES * FA_TUNE_MAX_TILES]; /* fastest first, out of memory last */
} fa_tune_result;

#define FA_TUNE_RESULT_INIT {sizeof(fa_tune_result)}

/* Sweeps, keeps the best, saves it (see above). options NULL: the defaults. */
FA_API fa_status fa_tune(fa_context *ctx, const fa_forward_args *args, const fa_tune_options *options,
                         fa_tune_result *result);

/* ---------------------------------------------------------------- backward */

/*
 * Gradients of the forward call *fwd (docs/semantics.md, section 7): given dL/do,
 * dq, dk and dv. fwd is the very struct the forward ran with: its q, k, v, its o and
 * lse OUTPUTS (both required: the backward recomputes P from q, k and lse, and
 * takes dot(dO_i, o_i)), and every option, dropout included (the same seed and offset
 * give the same mask). dq, dk, dv are optional (data NULL: not computed, and their
 * work skipped); each is written whole, in q's dtype or f32. Bias has no gradient.
 * Variable-length calls work; KV caches are FA_ERR_UNSUPPORTED. On failure nothing
 * is written to dq, dk or dv.
 *
 * Determinism: the result is bitwise the same for any thread count and any run: the
 * work is cut by shapes alone, one task per (sequence, kv head), and no two tasks
 * write the same output element. (So a call with fewer such pairs than threads, MQA
 * at B = 1, leaves threads idle.)
 *
 * Memory: a few tiles per thread and one number per query row (dot(dO_i, o_i)); dq
 * accumulates in the caller's dq when that is f32 with 64-byte aligned rows whose
 * head dim is a multiple of 16, else in an f32 buffer of Sq * D per thread.
 */
typedef struct fa_backward_args {
    size_t struct_size;           /* sizeof(fa_backward_args) as the caller compiled it */
    const fa_forward_args *fwd;   /* the forward's arguments, outputs o and lse included */
    fa_tensor do_;                /* (B, Sq, Hq, Dv) dL/do, f32 or q's dtype */
    fa_tensor dq;                 /* (B, Sq, Hq, D)  optional output */
    fa_tensor dk;                 /* (B, Sk, Hk, D)  optional output, summed over the heads of a group */
    fa_tensor dv;                 /* (B, Sk, Hk, Dv) optional output, likewise */
    /* optional output: Hq f32, the gradient of fwd->sinks, written whole (zeros when
     * fwd->sinks is NULL): dsinks[h] = -sum over b, i of exp(sinks[h] - lse_i) * dot(dO_i, o_i);
     * summed in a fixed order, bitwise the same for any thread count */
    float *dsinks;
} fa_backward_args;

/* fa_backward_args' fields, as FA_FORWARD_FIELDS. */
#define FA_BACKWARD_FIELDS(X)                                                                                     \
    X(struct_size, "struct_size", size_t, SIZE, HEADER, sizeof(fa_backward_args),                                 \
      "sizeof(fa_backward_args) as the caller compiled it")                                                       \
    X(fwd, "fwd", const fa_forward_args *, PTR, FORM, 0, "the forward's arguments, its o and lse included")      \
    X(do_, "dout", fa_tensor, TENSOR, INPUT, 0, "(B, Sq, Hq, Dv) dL/do, f32 or q's dtype")                        \
    X(dq, "dq", fa_tensor, TENSOR, OUTPUT, 0, "optional (B, Sq, Hq, D) output")                                  \
    X(dk, "dk", fa_tensor, TENSOR, OUTPUT, 0, "optional (B, Sk, Hk, D) output")                                  \
    X(dv, "dv", fa_tensor, TENSOR, OUTPUT, 0, "optional (B, Sk, Hk, Dv) output")                                 \
    X(dsinks, "dsinks", float *, PTR, OUTPUT, 0, "optional [Hq] f32 output: the gradient of fwd->sinks")

#define FA_BACKWARD_ARGS_INIT {FA_BACKWARD_FIELDS(FA_FIELD_INIT_)}
FA_API void fa_backward_args_init(fa_backward_args *args);
FA_API fa_status fa_backward(fa_context *ctx, const fa_backward_args *args);
/* Validation alone, as fa_forward_check: the status fa_backward would return before
 * running (its fwd validated as fa_forward_check does), writing nothing. */
FA_API fa_status fa_backward_check(fa_context *ctx, const fa_backward_args *args);

/* ------------------------------------------------------------- self-description */

/*
 * The library's description of its argument structs, from the tables above
 * (FA_FORWARD_FIELDS, FA_BACKWARD_FIELDS, FA_KV_CACHE_FIELDS): for languages that
 * build their mirror of a struct at run time (ctypes, cffi) and for generic tools
 * (decoders, loggers). The strings are static.
 */
typedef enum fa_field_type {
    FA_FIELD_SIZE = 0,   /* size_t: struct_size */
    FA_FIELD_TENSOR = 1, /* fa_tensor; absent when its data is NULL */
    FA_FIELD_F32 = 2,    /* float */
    FA_FIELD_I32 = 3,    /* int, or an enum (4 bytes) */
    FA_FIELD_I64 = 4,    /* int64_t */
    FA_FIELD_U32 = 5,    /* uint32_t */
    FA_FIELD_U64 = 6,    /* uint64_t */
    FA_FIELD_PTR = 7     /* a pointer; absent when NULL */
} fa_field_type;

typedef enum fa_field_role {
    FA_ROLE_HEADER = 0,  /* struct_size */
    FA_ROLE_INPUT = 1,   /* data the call reads */
    FA_ROLE_OUTPUT = 2,  /* data the call writes */
    FA_ROLE_INOUT = 3,   /* data the call reads and writes (a KV cache's append) */
    FA_ROLE_OPTION = 4,  /* a scalar setting of the call */
    FA_ROLE_DERIVED = 5, /* follows from another field's extent (a binding fills it from the array) */
    FA_ROLE_FORM = 6     /* a pointer to another argument struct */
} fa_field_role;

typedef enum fa_args_kind {
    FA_ARGS_FORWARD = 0,  /* fa_forward_args */
    FA_ARGS_BACKWARD = 1, /* fa_backward_args */
    FA_ARGS_KV_CACHE = 2  /* fa_kv_cache */
} fa_args_kind;

typedef struct fa_field {
    size_t struct_size;   /* sizeof(fa_field) as the caller compiled it */
    const char *name;     /* the C member */
    const char *key;      /* its keyword in keyword APIs */
    const char *ctype;    /* its C type as the header spells it */
    const char *doc;      /* one line */
    size_t offset, size;  /* offsetof and sizeof of the member in this library */
    fa_field_type type;
    fa_field_role role;
    double default_value; /* what the INIT macro gives a scalar (struct_size: the struct's size); 0 otherwise */
} fa_field;

#define FA_FIELD_INIT {sizeof(fa_field), 0, 0, 0, 0, 0, 0, FA_FIELD_SIZE, FA_ROLE_HEADER, 0.0}

/* Field `index` (0, 1, ...) of the struct `kind`, in the struct's order, into *out
 * (its struct_size set by the caller: FA_FIELD_INIT). FA_ERR_OUT_OF_RANGE past the
 * last field, FA_ERR_INVALID_ARGUMENT for an unknown kind, FA_ERR_NULL_POINTER for a
 * NULL out, FA_ERR_STRUCT_SIZE as fa_struct_read says. */
FA_API fa_status fa_args_field(fa_args_kind kind, int index, fa_field *out);

/*
 * The rule every versioned struct of this library is read by (its struct_size first;
 * see "Stability" above), for libraries built on this one to read their own structs
 * and this library's the same way (libflashattn_mpi does). dst holds lib_size bytes
 * of defaults; `user`'s struct_size bytes are copied over them (at most lib_size), and
 * dst's struct_size becomes lib_size. FA_ERR_STRUCT_SIZE when struct_size is below
 * min_size (the fields every caller must have) or absurdly large, or when bytes
 * beyond lib_size are not zero (a newer caller's fields this reader lacks), with
 * `name` in the message on ctx (ctx may be NULL: then no message).
 */
FA_API fa_status fa_struct_read(fa_context *ctx, const char *name, const void *user, void *dst, size_t lib_size,
                                size_t min_size);

/*
 * Split-KV and decoding. fa_forward hands its threads tasks of (sequence, query
 * block, query heads, key chunk). Query heads that share a kv head are stacked
 * into one task when the query block is short, so K and V stream once per kv head.
 * When the query rows times the GQA group come to at most 16 (decoding), the heads
 * form stacks of at most 8 rows that take the small-row kernels, and one such task
 * holds every head of its sequence (up to
 * 256 KiB of state), walking the keys for all kv heads together, so that a
 * (B, S, Hk, D) cache is read as one contiguous stream. When there are fewer than
 * 32 tasks, each sequence's keys are cut into min(64, ceil(32 / tasks), Sk / 512)
 * chunks (at least 1) whose partial results are merged with fa_merge_states'
 * formula. The choice depends only on the shapes, never on the thread count, so
 * results are bitwise the same for any thread count. FA_PARAM_KV_SPLITS forces the
 * number of chunks. A mixed batch (q packed by cu_seqlens_q over a KV cache: prefill
 * chunks and one-row decodes in one call) takes the small-row path for each sequence
 * whose rows fit it and the wide one for the rest; the tiles, the split rule and the
 * cost order cover the whole call (docs/semantics.md, section 8, "Mixed batches").
 */

/*
 * Merges n >= 1 partial results over disjoint key sets (docs/semantics.md, section 8,
 * merging partial states): lse = log(sum_i exp(lse_i)), o = sum_i exp(lse_i - lse) o_i.
 * Sides with lse = -inf contribute nothing; if every side is -inf, o = 0 and
 * lse = -inf. o_parts[i] are (B, S, H, Dv) of any float dtype, lse_parts[i]
 * (B, H, S, 1) f32; o is (B, S, H, Dv) of any float dtype, lse optional (data NULL).
 * A zero B, S or H is a successful no-op; Dv = 0 merges the lse alone. Runs on the
 * context's threads.
 * o and lse may be the very tensors of one part (same data and strides); other
 * overlaps are undefined.
 */
FA_API fa_status fa_merge_states(fa_context *ctx, int n, const fa_tensor *o_parts,
                                 const fa_tensor *lse_parts, fa_tensor *o, fa_tensor *lse);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_H */
