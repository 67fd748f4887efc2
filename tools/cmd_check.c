/*
 * cmd_check.c: `flashattn check`: runs one algorithm on random inputs and
 * compares its output and LSE with FA_ALGO_REFERENCE (plain loops in double)
 * on the very same inputs; with --backward, also the gradients dq, dk, dv of
 * the backward that follows each forward. A quick "is this build/CPU
 * computing the right thing" test; the thorough accuracy tests live in tests/.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "flashattn.h"
#include "shape.h"

int cmd_check(int argc, char **argv);

/* The reference is single-threaded fp64, so check defaults to a shape it
 * finishes in well under a second instead of bench's LLaMA-7B shape. */
static cli_shape check_defaults(void)
{
    cli_shape s = cli_shape_defaults();
    s.heads = 4;
    s.seq = 256;
    s.dim = 64;
    s.algo = FA_ALGO_FLASH;
    return s;
}

static void check_usage(FILE *f)
{
    cli_shape d = check_defaults();
    fprintf(f, "usage: flashattn check [--backward] [shape flags]\n\n"
               "Runs --algo (default flash) on random inputs, with o in --dtype, and compares\n"
               "o and the LSE with the fp64 reference (o in f32). Prints the largest errors and\n"
               "PASS or FAIL; exit status 1 on FAIL. Tolerance on max|o - o_ref| and on\n"
               "max|lse - lse_ref|, each times max(1, largest |reference value|):\n"
               "f32 1e-4, f16 2e-3, bf16 1.6e-2.\n"
               "  --backward         also run each algorithm's backward on the same random\n"
               "                     dO (in --dtype; dq, dk, dv in --dtype, the reference's\n"
               "                     in f32) and compare dq, dk, dv. Tolerance on max|dx - dx_ref|,\n"
               "                     times the largest |dx_ref|: f32 1e-4, f16 4e-3 (4 ulps\n"
               "                     of f16 at 1.0), bf16 3.2e-2 (4 ulps of bf16).\n"
               "  --dropout P        (a shape flag) dropout on both sides, the same mask:\n"
               "                     seed --seed, offset 0\n"
               "The defaults are small (B=1 H=4 S=256 D=64) because the reference is slow;\n"
               "--runs is accepted and ignored.\n\n");
    cli_shape_usage(f, &d);
}

/*
 * Why these tolerances. Every algorithm accumulates in fp32 on the same
 * (already rounded) inputs as the reference, so what separates them is:
 *  - f32: fp32 accumulation and exp() over a few thousand terms: around 1e-6
 *    relative in practice; 1e-4 leaves room for long rows and still catches
 *    any real bug (a wrong mask column or tile edge is off by ~1e-2 or more).
 *  - f16: o is rounded to f16 (half an ulp at 1.0 is 2^-11 = 4.9e-4), and a
 *    kernel may round P to f16 before P*V as GPU FlashAttention does; 2e-3 is
 *    two f16 ulps at 1.0.
 *  - bf16: the same with an 8-bit significand: half an ulp at 1.0 is 2^-8 =
 *    3.9e-3; 1.6e-2 is two bf16 ulps at 1.0.
 * Outputs are convex combinations of v rows in [-1, 1), so |o| <= 1 and the
 * max(1, |ref|) factor only matters for the LSE, which grows like log(Sk).
 */
static double tolerance(fa_dtype dtype)
{
    switch (dtype) {
    case FA_DTYPE_F32: return 1e-4;
    case FA_DTYPE_F16: return 2e-3;
    case FA_DTYPE_BF16: return 1.6e-2;
    case FA_DTYPE_I8: /* only for KV caches, which check does not build */
    case FA_DTYPE_F8E4M3:
    case FA_DTYPE_F8E5M2:
    case FA_DTYPE_BOOL: break;
    }
    return 0.0;
}

/*
 * Gradients, relative to the largest |reference gradient| (they scale with
 * 1/sqrt(D) and with Sk, so an absolute bound would not fit every shape):
 *  - f32: the same fp32 accumulation argument as the forward: 1e-4.
 *  - f16, bf16: dq, dk, dv are rounded to the dtype (half an ulp) on top of
 *    o, whose rounding enters every ds through dot(dO_i, o_i), and the kernels
 *    may round P and dS to the dtype before their products, as the forward
 *    rounds P; 4 ulps at 1.0 covers the sum: f16 4 * 2^-10, bf16 4 * 2^-7.
 */
static double grad_tolerance(fa_dtype dtype)
{
    switch (dtype) {
    case FA_DTYPE_F32: return 1e-4;
    case FA_DTYPE_F16: return 4.0 * 0x1p-10;
    case FA_DTYPE_BF16: return 4.0 * 0x1p-7;
    case FA_DTYPE_I8:
    case FA_DTYPE_F8E4M3:
    case FA_DTYPE_F8E5M2:
    case FA_DTYPE_BOOL: break;
    }
    return 0.0;
}

/*
 * Largest |x - ref| over n elements, and the largest finite |ref| in *ref_max.
 * Equal infinities (an empty row's LSE is -inf in both) count as no error;
 * a NaN or an infinity on one side only counts as an infinite error.
 */
static double max_error(const void *x, fa_dtype x_dtype, const float *ref, int64_t n,
                        double *ref_max)
{
    double worst = 0.0, big = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double a = cli_load(x, x_dtype, i), r = ref[i];
        double e = (a == r) ? 0.0 : fabs(a - r);
        if (isnan(e) || isinf(e))
            e = INFINITY;
        if (e > worst)
            worst = e;
        if (isfinite(r) && fabs(r) > big)
            big = fabs(r);
    }
    *ref_max = big;
    return worst;
}

static int run(fa_context *ctx, fa_algo algo, const fa_forward_args *args,
               const fa_backward_args *bwd, double *seconds, double *bwd_seconds)
{
    fa_status st = fa_context_set(ctx, FA_PARAM_ALGO, algo);
    const char *what = "forward";
    if (st == FA_OK) {
        double t0 = cli_now();
        st = fa_forward(ctx, args);
        *seconds = cli_now() - t0;
    }
    if (st == FA_OK && bwd) {
        what = "backward";
        double t0 = cli_now();
        st = fa_backward(ctx, bwd);
        *bwd_seconds = cli_now() - t0;
    }
    if (st != FA_OK) {
        fprintf(stderr, "flashattn check: %s %s failed: %s: %s\n", fa_algo_name(algo), what,
                fa_status_string(st), fa_context_error(ctx));
        return -1;
    }
    return 0;
}

/* One "max |x - x_ref|" line; 1 when within the tolerance. */
static int report(const char *name, const void *x, fa_dtype dtype, const float *ref,
                  int64_t n, double tol, int relative_to_max)
{
    double big;
    double err = max_error(x, dtype, ref, n, &big);
    char label[32];
    snprintf(label, sizeof label, "max |%s - %s_ref|", name, name);
    if (relative_to_max) {
        /* an all-zero reference (every row masked) leaves no room at all: the
         * gradients of nothing are exactly 0 */
        double limit = tol * big;
        printf("  %-19s %.3e  (tolerance %.3e = %.3g x max|%s_ref| %.3e)\n", label, err, limit,
               tol, name, big);
        return err <= limit;
    }
    double limit = tol * (big > 1.0 ? big : 1.0);
    printf("  %-19s %.3e  (tolerance %.3e)\n", label, err, limit);
    return err <= limit;
}

int cmd_check(int argc, char **argv)
{
    cli_shape s = check_defaults();
    int backward = 0;
    const cli_switch switches[] = {{"--backward", &backward}};
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            check_usage(stdout);
            return CLI_EXIT_OK;
        }
        if (cli_switch_flag(argv[i], switches, 1))
            continue;
        int r = cli_shape_flag(&s, argc, argv, &i, "check");
        if (r < 0)
            return CLI_EXIT_USAGE;
        if (r == 0)
            return cli_unknown_arg("check", argv[i], check_usage);
    }
    if (cli_shape_finish(&s, "check") != 0)
        return CLI_EXIT_USAGE;

    int status = CLI_EXIT_FAIL;
    fa_context *ctx = NULL;
    cli_inputs in = {0};
    cli_grads g = {0}, g_ref = {0};
    void *o = NULL;
    float *lse = NULL, *o_ref = NULL, *lse_ref = NULL;

    if (cli_context_make(&s, "check", &ctx) != 0)
        return CLI_EXIT_FAIL;
    if (cli_inputs_make(&s, &in) != 0)
        goto done;
    if (backward && (cli_grads_make(&s, s.dtype, &g) != 0 ||
                     cli_grads_make(&s, FA_DTYPE_F32, &g_ref) != 0))
        goto done;
    o = cli_alloc(in.o_elems, fa_dtype_size(s.dtype));
    lse = cli_alloc(in.lse_elems, sizeof(float));
    o_ref = cli_alloc(in.o_elems, sizeof(float));
    lse_ref = cli_alloc(in.lse_elems, sizeof(float));
    if (!o || !lse || !o_ref || !lse_ref) {
        fprintf(stderr, "flashattn check: out of memory allocating outputs\n");
        goto done;
    }

    /* Each side's backward reads its own forward's o and lse, as in training:
     * the check covers the whole forward-then-backward of the algorithm. */
    fa_forward_args args = cli_forward_args(&s, &in, o, s.dtype, lse);
    fa_forward_args ref_args = cli_forward_args(&s, &in, o_ref, FA_DTYPE_F32, lse_ref);
    fa_backward_args bwd = cli_backward_args(&s, &args, &g);
    fa_backward_args ref_bwd = cli_backward_args(&s, &ref_args, &g_ref);
    double t_algo = 0, t_ref = 0, tb_algo = 0, tb_ref = 0;
    int64_t ran = s.algo, tile_q = 0, tile_kv = 0;
    if (run(ctx, s.algo, &args, backward ? &bwd : NULL, &t_algo, &tb_algo) != 0)
        goto done;
    /* Name what actually ran: --algo auto resolves to a concrete algorithm,
     * and the tiles are the library's plan unless --tile-q/--tile-kv set them
     * (with --backward: the backward's). */
    if (fa_context_get(ctx, FA_PARAM_LAST_ALGO, &ran) != FA_OK)
        ran = s.algo;
    if (fa_context_get(ctx, FA_PARAM_LAST_TILE_Q, &tile_q) != FA_OK ||
        fa_context_get(ctx, FA_PARAM_LAST_TILE_KV, &tile_kv) != FA_OK)
        tile_q = tile_kv = 0;
    if (run(ctx, FA_ALGO_REFERENCE, &ref_args, backward ? &ref_bwd : NULL, &t_ref, &tb_ref) != 0)
        goto done;

    char shape[256];
    cli_shape_describe(&s, shape, sizeof shape);
    printf("check %s%s vs reference: %s %s, isa %s, threads %lld",
           fa_algo_name((fa_algo)ran), backward ? " backward" : "", fa_dtype_name(s.dtype), shape,
           fa_context_isa(ctx), (long long)cli_resolved_threads(s.threads));
    if (tile_q > 0)
        printf(", tiles %lldx%lld", (long long)tile_q, (long long)tile_kv);
    printf("\n");
    const double tol = tolerance(s.dtype), gtol = grad_tolerance(s.dtype);
    int pass = report("o", o, s.dtype, o_ref, in.o_elems, tol, 0);
    pass &= report("lse", lse, FA_DTYPE_F32, lse_ref, in.lse_elems, tol, 0);
    if (backward) {
        pass &= report("dq", g.dq, g.dtype, g_ref.dq, g.dq_elems, gtol, 1);
        pass &= report("dk", g.dk, g.dtype, g_ref.dk, g.dk_elems, gtol, 1);
        pass &= report("dv", g.dv, g.dtype, g_ref.dv, g.dv_elems, gtol, 1);
        printf("  time %s forward %.3f ms, backward %.3f ms; reference %.3f ms, %.3f ms\n",
               fa_algo_name((fa_algo)ran), t_algo * 1e3, tb_algo * 1e3, t_ref * 1e3,
               tb_ref * 1e3);
    } else {
        printf("  time %s %.3f ms, reference %.3f ms\n", fa_algo_name((fa_algo)ran),
               t_algo * 1e3, t_ref * 1e3);
    }
    printf("%s\n", pass ? "PASS" : "FAIL");
    status = pass ? CLI_EXIT_OK : CLI_EXIT_FAIL;

done:
    cli_free(o);
    cli_free(lse);
    cli_free(o_ref);
    cli_free(lse_ref);
    cli_grads_free(&g);
    cli_grads_free(&g_ref);
    cli_inputs_free(&in);
    fa_context_free(ctx);
    return status;
}
