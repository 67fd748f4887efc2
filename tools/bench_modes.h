/*
 * bench_modes.h: the serving-shaped modes of `flashattn bench`:
 *   --decode       a few query rows per sequence against a KV cache (contiguous
 *                  or paged, f32/f16/bf16/int8; --mla: an MLA latent cache), reported
 *                  as latency and as the K/V read bandwidth against the machine's
 *                  measured one;
 *   --varlen LENS  packed variable-length prefill (cu_seqlens), next to one
 *                  dense batch of the same work;
 *   --mixed        a serving step: a few prefill chunks and many decoding
 *                  sequences over one paged cache in one call, next to the same
 *                  work as separate calls (bench_mixed.c).
 * cmd_bench.c parses the shape flags and hands the rest here.
 */
#ifndef FLASHATTN_TOOLS_BENCH_MODES_H
#define FLASHATTN_TOOLS_BENCH_MODES_H

#include <stdint.h>
#include <stdio.h>

#include "flashattn.h"
#include "shape.h"

/* --varlen lists at most this many lengths; a generator N:LO-HI up to BENCH_MAX_SEQS. */
enum { BENCH_MAX_SEQS = 65536 };

typedef struct bench_mode_opts {
    int decode;               /* --decode */
    int64_t q_rows;           /* --q-rows: query rows per sequence [1] */
    int64_t cache_lo, cache_hi; /* --cache-len N (lo = hi) or LO:HI [16384] */
    int64_t page_size;        /* --page-size: 0 = contiguous [0] */
    fa_dtype kv_dtype;        /* --kv-dtype [f16] */
    int warm;                 /* --warm: no cache flush between decode calls */
    int64_t kv_splits;        /* --kv-splits: FA_PARAM_KV_SPLITS, 0 = planned */
    int kv_splits_given;
    int decode_flag_seen;     /* a decode-only flag was given (an error without --decode) */
    int mla;                  /* --mla: an MLA latent cache (fa_kv_cache.v_in_k), DeepSeek's shape */

    int varlen_given;         /* --varlen */
    int64_t *varlen;          /* its lengths (a generator's after bench_mode_finish) */
    int64_t n_varlen;
    int64_t gen_n, gen_lo, gen_hi; /* --varlen N:LO-HI, expanded by bench_mode_finish */

    int mixed;                /* --mixed: chunked prefill and decoding in one call */
    int64_t chunks, chunk_len, decodes; /* --chunks [4], --chunk-len [512], --decodes [60] */
    int cache_len_given, page_size_given;
    int mixed_flag_seen;      /* --chunks, --chunk-len or --decodes was given */
} bench_mode_opts;

void bench_mode_defaults(bench_mode_opts *o);
void bench_mode_free(bench_mode_opts *o);

/* Like cli_shape_flag: 1 = one of these flags (consumed), 0 = not one,
 * -1 = a bad value (reported on stderr). */
int bench_mode_flag(bench_mode_opts *o, int argc, char **argv, int *i);

/* The flags for `bench --help`. */
void bench_mode_usage(FILE *f);

/*
 * Checks the mode flags together with the shape and fills in mode defaults
 * (--decode: Hk = 8 unless given). `seq_given`: --seq/--seq-kv were on the
 * command line. 0, or -1 after a usage message.
 */
int bench_mode_finish(bench_mode_opts *o, cli_shape *s, int seq_given);

/* The runs, each returning a CLI_EXIT_* status. cold_bytes: --cold=BYTES or
 * 0 (decode flushes twice the last-level cache unless --warm). profile: --profile, the
 * phases of a flash call (bench_profile.h), each profiled call flushed as the timed ones. */
int bench_decode(fa_context *ctx, const cli_shape *s, const bench_mode_opts *o, int json,
                 int no_probe, int64_t cold_bytes, int profile);
int bench_varlen(fa_context *ctx, const cli_shape *s, const bench_mode_opts *o, int json,
                 int no_probe);
int bench_mixed(fa_context *ctx, const cli_shape *s, const bench_mode_opts *o, int json);

/* Shared with bench_mixed.c: random values (multiples of 1/1024 in [-1, 1), int8
 * in [-127, 127]) and a KV cache of s->batch sequences of lens[b] rows, contiguous
 * or paged (o->page_size) with its pages shuffled over the pool. */
void bench_fill_values(void *data, fa_dtype dtype, int64_t n, uint64_t seed);
typedef struct decode_cache {
    void *k, *v;
    float *k_scale, *v_scale;
    int32_t *seqlens, *block_table;
    int64_t rows0, rows1;      /* cache dims 0 and 1: (B, max len) or (pages, page size) */
    int64_t max_pages;
    fa_kv_cache cache;
} decode_cache;
int decode_cache_make(const cli_shape *s, const bench_mode_opts *o, const int64_t *lens, decode_cache *c);
void decode_cache_free(decode_cache *c);

#endif /* FLASHATTN_TOOLS_BENCH_MODES_H */
