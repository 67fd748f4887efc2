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
 * fa_context_set, fa_probe) returns FA_ERR_BUSY and touches nothing, not even the
 * context's error message. Different contexts are fully independent.
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
                                      FLASHATTN_F32_MATMUL=ieee|bf16x3|bf16 (docs/semantics.md, 5) */
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
    FA_PARAM_LAST_KV_PACK_US = 109 /* read-only: microseconds the last flash forward's threads spent
                                      packing K/V, summed over the threads; 0 otherwise */
} fa_param;

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
} fa_forward_args;

#define FA_FORWARD_ARGS_INIT                                                          \
    {                                                                                 \
        sizeof(fa_forward_args), {0}, {0}, {0}, {0}, {0}, 0.0f, 0.0f, FA_CAUSAL_NONE, \
            FA_WINDOW_UNBOUNDED, FA_WINDOW_UNBOUNDED, 0, 0, {0}, {0}, 0, 0, 0, 0, 0, 0, \
            0.0f, 0, 0, {0}, 0                                                        \
    }

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

#define FA_KV_CACHE_INIT {sizeof(fa_kv_cache), {0}, {0}, {0}, {0}, 0, 0, 0, 0, 0, 0}
FA_API void fa_kv_cache_init(fa_kv_cache *cache);

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

#define FA_BACKWARD_ARGS_INIT {sizeof(fa_backward_args), 0, {0}, {0}, {0}, {0}, 0}
FA_API void fa_backward_args_init(fa_backward_args *args);
FA_API fa_status fa_backward(fa_context *ctx, const fa_backward_args *args);
/* Validation alone, as fa_forward_check: the status fa_backward would return before
 * running (its fwd validated as fa_forward_check does), writing nothing. */
FA_API fa_status fa_backward_check(fa_context *ctx, const fa_backward_args *args);

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
