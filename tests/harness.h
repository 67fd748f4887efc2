/*
 * harness.h: what every test program shares, written independently of the library.
 *
 * A deterministic RNG (xoshiro256** seeded by splitmix64), f16/bf16 round-to-nearest-even
 * conversions of our own, element access through fa_tensor views, contiguous problem
 * set-up, the tolerances (one table, with reasons) and a CHECK macro that counts results
 * and prints the failing case. Every program ends with h_summary(), which prints the line
 * "N passed, N failed" and gives main its exit code.
 *
 * Legend: B batch, Sq/Sk query/key length, Hq/Hk query/kv heads, D q/k head dim,
 * Dv v/o head dim; q, k, v, o are (B, S, H, dim), bias/mask (B, Hq, Sq, Sk), lse (B, Hq, Sq, 1).
 */
#ifndef FA_TEST_HARNESS_H
#define FA_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"

/* ------------------------------------------------------------------ RNG */

typedef struct h_rng {
    uint64_t s[4];
} h_rng;

void h_rng_seed(h_rng *r, uint64_t seed);
uint64_t h_rng_next(h_rng *r);
double h_rng_uniform(h_rng *r);                      /* [0, 1) */
double h_rng_range(h_rng *r, double lo, double hi);  /* [lo, hi) */
int64_t h_rng_int(h_rng *r, int64_t lo, int64_t hi); /* [lo, hi], inclusive */
double h_rng_normal(h_rng *r);                       /* N(0, 1) */

/* A seed from the environment variable `name` if set, else `fallback`. */
uint64_t h_env_u64(const char *name, uint64_t fallback);

/* ------------------------------------------------------- number formats */

uint16_t h_f32_to_f16(float x);  /* round to nearest even, overflow to inf, NaN stays NaN */
float h_f16_to_f32(uint16_t h);
uint16_t h_f32_to_bf16(float x); /* round to nearest even */
float h_bf16_to_f32(uint16_t h);
/* FA_DTYPE_F8E4M3 / F8E5M2 code b as its value, from the formats' definitions (not the
 * library's); and x as the nearest code, ties to even, finite values saturating to the
 * largest, NaN to NaN, inf to E5M2's inf or E4M3's NaN (found by search over the codes). */
double h_fp8_to_double(unsigned b, fa_dtype dtype);
unsigned h_fp8_from_double(double x, fa_dtype dtype);
/* x rounded to float and then to dtype (identity for F32 beyond the float rounding). */
double h_round(double x, fa_dtype dtype);
/* Spacing of the dtype's numbers at 1.0: 2^-23, 2^-10, 2^-7. */
double h_eps(fa_dtype dtype);
size_t h_dtype_bytes(fa_dtype dtype);
const char *h_dtype_str(fa_dtype dtype);
const char *h_algo_str(fa_algo algo);
/* The NaN sentinel's bit pattern for a dtype (for padding input views). */
void h_store_nan(void *p, fa_dtype dtype);

/* ------------------------------------------------------- tensor access */

/* Element (i0, i1, i2, i3) of t as a double (bool: 0 or 1). */
double h_get(const fa_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3);
/* Stores x rounded to t's dtype (bool: x != 0). */
void h_set(const fa_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, double x);
/* Element offset (in elements) of (i0..i3); 64-bit. */
int64_t h_offset(const fa_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3);
/* The bytes of one element, for bitwise comparisons. */
uint32_t h_bits(const fa_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3);
int64_t h_numel(const fa_tensor *t);

/* A zero-filled row-major tensor of shape (d0, d1, d2, d3); free t.data with free(). */
fa_tensor h_alloc(fa_dtype dtype, int64_t d0, int64_t d1, int64_t d2, int64_t d3);
/* Sets every element of t to x. */
void h_fill(const fa_tensor *t, double x);
/* Normal(0, sigma) values, rounded to the dtype. */
void h_fill_normal(const fa_tensor *t, h_rng *r, double sigma);
/* Copies logical elements of src into dst (same shape, any strides, any dtypes). */
void h_copy(const fa_tensor *dst, const fa_tensor *src);
/* A contiguous tensor's bytes; a private copy of them (same shape and strides, free its
 * data); whether two such tensors hold the same bytes (bitwise equal results). */
size_t h_nbytes(const fa_tensor *t);
fa_tensor h_clone(const fa_tensor *t);
int h_same_bytes(const fa_tensor *a, const fa_tensor *b);

/* ---------------------------------------------------- a contiguous problem */

typedef struct h_dims {
    int64_t B, Sq, Sk, Hq, Hk, D, Dv;
} h_dims;

/*
 * q, k, v (dtype) and o (out_dtype) in BSND, lse f32 (B, Hq, Sq, 1), all contiguous and
 * zero-filled; args initialised with FA_FORWARD_ARGS_INIT and pointing at them. The
 * optional bias/mask/slopes are the caller's; h_problem_free frees only what it made.
 */
typedef struct h_problem {
    h_dims dims;
    fa_dtype dtype, out_dtype;
    fa_forward_args args;
} h_problem;

void h_problem_alloc(h_problem *p, h_dims dims, fa_dtype dtype, fa_dtype out_dtype);
void h_problem_free(h_problem *p);
/* Fills o and lse with a value no correct call writes (so "0 exactly" is a real check). */
void h_poison_outputs(const fa_forward_args *args);
/* Sets algo and threads on ctx and runs the forward call. */
fa_status h_run(fa_context *ctx, fa_algo algo, int64_t threads, const fa_forward_args *args);
const char *h_dims_str(const h_dims *d); /* static buffer: "B=.. Sq=.. ..." */
/* Forces flash's tile sizes (0, 0 = planned from the caches, the default). */
fa_status h_set_tiles(fa_context *ctx, int64_t tile_q, int64_t tile_kv);

/* ------------------------------------------------------------ tolerances */

/*
 * All tolerances live here.
 *
 * Known answers (expected values in closed form): the library accumulates in fp32 and
 * rounds once to the output dtype, but any path may also round S and P to the input
 * dtype (eager PyTorch does; so do bf16 dot-product kernels, whose P @ V takes bf16 P),
 * which costs up to ~2 ulps of the input dtype even when o is f32. So f16/bf16 inputs
 * allow 4 ulps of the input dtype; f32 allows 16 ulps, since expf/tanhf/logf in the
 * library and our double closed forms differ by a few ulps and sums of up to a few
 * hundred terms add a few more.
 *
 * Random properties (docs/semantics.md, FlashAttention's rule): error against the fp64
 * reference <= 2 * error of the naive same-precision attention + h_prop_ulps(out) ulps
 * of the output dtype (scaled by max(1, max|o_ref|)). The ulp term covers cases where
 * the naive error happens to be 0 (e.g. Sk = 1) and f32's summation-order noise.
 */
double h_ka_tol(fa_dtype in_dtype, fa_dtype out_dtype); /* relative, known answers on o */
double h_ka_lse_tol(fa_dtype in_dtype);   /* relative, for known answers on lse */
double h_prop_ulps(fa_dtype out_dtype);   /* ulps of out dtype added to 2x naive error */
double h_prop_lse_ulps(void);             /* ulps of fp32 added for lse */

/* ------------------------------------------------------- context, scale */

/* Exit code that ctest reports as "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt). */
#define H_SKIP 77

/*
 * Creates the context a test program runs on and prints "flashattn <version>, isa <path>".
 * When FLASHATTN_ARCH names a path this CPU (or build) lacks, fa_context_create reports
 * FA_ERR_ISA_UNAVAILABLE: then this prints why and exits with H_SKIP, so the ISA matrix
 * shows the path as skipped rather than passed or failed. Any other status is returned
 * for the caller to CHECK.
 */
fa_status h_context_create(fa_context **ctx);

/*
 * Fraction of the random cases to run, in (0, 1]: FA_TEST_SCALE from the environment if
 * set, else the value the build compiled in (FA_TEST_SCALE, see tests/CMakeLists.txt:
 * 1 for Release, less under the sanitizers, which run every ISA but fewer cases).
 */
double h_test_scale(void);
/* max(1, round(n * h_test_scale())). */
int h_scaled(int n);

/* ----------------------------------------------------------- reporting */

/* Describes the case now running; printed with every failure until changed, and at once
 * when FA_TEST_VERBOSE=1 (so a crash or a sanitizer abort can be placed). */
void h_case(const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

int h_check(int ok, const char *file, int line, const char *expr, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

/* CHECK(cond, "printf format", args...): counts a pass or prints and counts a failure. */
#define CHECK(cond, ...) h_check((cond) ? 1 : 0, __FILE__, __LINE__, #cond, __VA_ARGS__)

/* Prints "N passed, N failed" on its own line; returns main's exit code. */
int h_summary(void);
int64_t h_failures(void);

#endif /* FA_TEST_HARNESS_H */
