/*
 * shape.h: what the `check`, `bench` and `tune` verbs share: the shape flags,
 * parsed into one struct, a context set up from them, and random q/k/v inputs
 * built from them.
 *
 * The tool sees the library only through include/flashattn.h, so the f16/bf16
 * conversions it needs to make inputs and read outputs live here too.
 */
#ifndef FLASHATTN_TOOLS_SHAPE_H
#define FLASHATTN_TOOLS_SHAPE_H

#include <stdint.h>
#include <stdio.h>

#include "flashattn.h"

/* Exit statuses shared by every verb. */
enum { CLI_EXIT_OK = 0, CLI_EXIT_FAIL = 1, CLI_EXIT_USAGE = 2 };

/*
 * One attention problem plus how to run it. kv_heads, seq_kv and dim_v are 0
 * until cli_shape_finish() resolves them, so "not given" and "given equal to
 * heads/seq/dim" are the same thing afterwards.
 */
typedef struct cli_shape {
    int64_t batch, heads, kv_heads, seq, seq_kv, dim, dim_v;
    fa_dtype dtype;
    fa_causal causal;
    int64_t window_left, window_right; /* FA_WINDOW_UNBOUNDED or >= 0 */
    int64_t threads;                   /* 0 = one per online CPU */
    fa_algo algo;
    int algo_given;                    /* --algo was on the command line */
    int64_t tile_q, tile_kv;           /* flash tile sizes; 0 = the library's plan */
    int64_t kv_pack;                   /* FA_PARAM_KV_PACK: 0 auto, 1 never, 2 always */
    int quant_matmul;                  /* FA_PARAM_QUANT_MATMUL (0 exact, 1 i8, 2 i8x2); -1: the
                                          context's own (FLASHATTN_QUANT_MATMUL) */
    int64_t runs;
    int runs_given;                    /* --runs was on the command line */
    int64_t seed;                      /* of the random inputs, and the dropout seed */
    double dropout;                    /* --dropout: dropout_p in [0, 1), 0 = off */
} cli_shape;

/* The LLaMA-7B attention shape: B=1, H=32, S=2048, D=128, f32, all CPUs, 5 runs. */
cli_shape cli_shape_defaults(void);

/*
 * Tries argv[*i] as a shape flag. Returns 1 when it was one (and *i moved past
 * any separate value), 0 when it is not a shape flag, -1 when it is one with a
 * bad value (a message naming `verb` is already on stderr).
 */
int cli_shape_flag(cli_shape *s, int argc, char **argv, int *i, const char *verb);

/* arg asks for a verb's help: --help or -h. */
int cli_is_help(const char *arg);

/* "flashattn <verb>: unknown argument 'arg'" and the verb's usage on stderr;
 * returns CLI_EXIT_USAGE. */
int cli_unknown_arg(const char *verb, const char *arg, void (*usage)(FILE *f));

/* A verb's own switches (flags without a value), each setting its int to 1. */
typedef struct cli_switch {
    const char *flag;
    int *on;
} cli_switch;

/* When arg is one of the n switches, sets it and returns 1; else 0. */
int cli_switch_flag(const char *arg, const cli_switch *sw, int n);

/* Resolves the defaults that follow other flags and checks the flags together. 0 or -1. */
int cli_shape_finish(cli_shape *s, const char *verb);

/* The shape flags and their defaults in `d`, for a verb's --help. */
void cli_shape_usage(FILE *f, const cli_shape *d);

/* "B=1 Hq=32 Hk=32 Sq=2048 Sk=2048 D=128 Dv=128" plus causal/window/dropout when set. */
void cli_shape_describe(const cli_shape *s, char *buf, size_t n);

const char *cli_causal_name(fa_causal c); /* "none", "bottom-right", "top-left" */

/* Threads a setting of `threads` means: 0 resolves to the online CPU count. */
int64_t cli_resolved_threads(int64_t threads);

/*
 * A new context with the shape's threads and tile sizes applied. 0, or -1 with
 * a message naming `verb` on stderr (then *out is NULL).
 */
int cli_context_make(const cli_shape *s, const char *verb, fa_context **out);

/* ------------------------------------------------- flags of a single verb */

/* The shape flags' value syntax, for a verb's own flags: if argv[*i] is `name`
 * or `name=...`, returns 1 with *value the text after '=' or the next argument
 * (advancing *i), NULL when it is missing; 0 when argv[*i] is another flag. */
int cli_take_value(const char *name, int argc, char **argv, int *i, const char **value);

/* Strict base-10 int64: the whole string, no blanks, no overflow. 0 or -1. */
int cli_parse_i64(const char *text, int64_t *out);

/* "a,b,c" of integers >= lo into out[0..max): the count, or -1 when any item is
 * not such an integer or there are more than max. */
int cli_parse_i64_list(const char *text, int64_t lo, int64_t *out, int max);

/* ------------------------------------------------------------- buffers */

/* Random q, k, v in s->dtype, BSND-contiguous, uniform in [-1, 1). */
typedef struct cli_inputs {
    void *q; /* (B, Sq, Hq, D) */
    void *k; /* (B, Sk, Hk, D) */
    void *v; /* (B, Sk, Hk, Dv) */
    int64_t o_elems;   /* B*Sq*Hq*Dv */
    int64_t lse_elems; /* B*Hq*Sq */
} cli_inputs;

/* 0, or -1 with a message on stderr (out of memory). Free with cli_inputs_free. */
int cli_inputs_make(const cli_shape *s, cli_inputs *in);
void cli_inputs_free(cli_inputs *in);

/* What a timed forward reads and writes: the inputs, o (B, Sq, Hq, Dv) in s->dtype,
 * with_lse an lse (B, Hq, Sq) f32 (else NULL), and room for s->runs times. */
typedef struct cli_timed_io {
    cli_inputs in;
    void *o;
    float *lse;
    double *times;
} cli_timed_io;

/* 0, or -1 with a message on stderr (out of memory) and nothing left allocated.
 * Free with cli_timed_io_free. */
int cli_timed_io_make(const cli_shape *s, int with_lse, cli_timed_io *b);
void cli_timed_io_free(cli_timed_io *b);

/* 64-byte aligned, zeroed storage for `elems` elements of `elem_size` bytes; NULL on failure. */
void *cli_alloc(int64_t elems, size_t elem_size);
void cli_free(void *p);

/*
 * Forward arguments over `in`: o (B, Sq, Hq, Dv) of dtype o_dtype, optional
 * lse (B, Hq, Sq, 1) f32 (NULL = not requested), and the shape's masking and
 * dropout (seeded by --seed, offset 0).
 */
fa_forward_args cli_forward_args(const cli_shape *s, const cli_inputs *in,
                                 void *o, fa_dtype o_dtype, float *lse);

/*
 * What a backward call needs beyond the forward's buffers: do_ (random, like
 * q, k and v, from its own stream, in s->dtype, so two sets made from one shape
 * hold the same do_), and zeroed dq, dk, dv in grad_dtype.
 */
typedef struct cli_grads {
    void *do_; /* (B, Sq, Hq, Dv) */
    void *dq;  /* (B, Sq, Hq, D) */
    void *dk;  /* (B, Sk, Hk, D) */
    void *dv;  /* (B, Sk, Hk, Dv) */
    fa_dtype dtype; /* of dq, dk, dv */
    int64_t dq_elems, dk_elems, dv_elems;
} cli_grads;

/* 0, or -1 with a message on stderr (out of memory). Free with cli_grads_free. */
int cli_grads_make(const cli_shape *s, fa_dtype grad_dtype, cli_grads *g);
void cli_grads_free(cli_grads *g);

/* Backward arguments for the forward *fwd (which must have had an lse) into g. */
fa_backward_args cli_backward_args(const cli_shape *s, const fa_forward_args *fwd,
                                   const cli_grads *g);

/* Element i of a buffer of `dtype` as a double. */
double cli_load(const void *data, fa_dtype dtype, int64_t i);

/* Round-to-nearest-even conversions, NaN and infinity kept. */
uint16_t cli_f32_to_f16(float f);
float cli_f16_to_f32(uint16_t h);
uint16_t cli_f32_to_bf16(float f);
float cli_bf16_to_f32(uint16_t b);

/* CLOCK_MONOTONIC in seconds. */
double cli_now(void);

/* The process's CPU seconds (user + system, every thread) so far: what a loaded
 * machine's wall time hides, the work a call does rather than the share it got. */
double cli_cpu_seconds(void);

#endif /* FLASHATTN_TOOLS_SHAPE_H */
