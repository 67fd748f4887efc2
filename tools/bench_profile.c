/*
 * bench_profile.c: `bench --profile` (see bench_profile.h).
 */
#include "bench_profile.h"

#include <math.h>

/* The phases as FA_PARAM_LAST_PHASE_US + k numbers them (src/util/profile.h). */
enum { FWD_PHASES = 4, BWD_PHASES = 7 };
static const char *const fwd_phase[FWD_PHASES] = {"S", "X", "P", "M"};
static const char *const bwd_phase[BWD_PHASES] = {"S", "X", "dP", "dS", "dV", "dK", "dQ"};

static int n_phases(const bench_profile *pr) { return pr->backward ? BWD_PHASES : FWD_PHASES; }
static const char *phase_name(const bench_profile *pr, int k) { return pr->backward ? bwd_phase[k] : fwd_phase[k]; }

int bench_profile_call(fa_context *ctx, const fa_forward_args *fwd, const fa_backward_args *bwd, bench_profile *pr)
{
    fa_status st = fa_context_set(ctx, FA_PARAM_ALGO, FA_ALGO_FLASH);
    if (st == FA_OK)
        st = fa_context_set(ctx, FA_PARAM_PROFILE, 1);
    const double t0 = cli_now();
    if (st == FA_OK)
        st = bwd ? fa_backward(ctx, bwd) : fa_forward(ctx, fwd);
    const double wall_s = cli_now() - t0;
    fa_context_set(ctx, FA_PARAM_PROFILE, 0);
    if (st == FA_OK && pr->ran && wall_s >= pr->wall_s)
        return 0; /* an earlier call was less disturbed */
    pr->wall_s = wall_s;
    if (st != FA_OK) {
        fprintf(stderr, "bench: the --profile call failed: %s\n", fa_context_error(ctx));
        return -1;
    }
    for (int k = 0; k < FA_PHASES; k++) {
        fa_context_get(ctx, (fa_param)(FA_PARAM_LAST_PHASE_US + k), &pr->us[k]);
        fa_context_get(ctx, (fa_param)(FA_PARAM_LAST_PHASE_FLOP + k), &pr->flop[k]);
    }
    fa_context_get(ctx, FA_PARAM_LAST_THREADS, &pr->threads);
    pr->pack_us = 0; /* the K/V packing is the forward's */
    if (!bwd)
        fa_context_get(ctx, FA_PARAM_LAST_KV_PACK_US, &pr->pack_us);
    pr->backward = bwd != NULL;
    pr->ran = 1;
    return 0;
}

/* A phase's share of the call's threads x wall time, and its products' rate per thread
 * against the probed peak's per-thread share (NAN where it ran none, or no peak). */
static double profile_share(const bench_profile *pr, int64_t us)
{
    const double cap = (double)pr->threads * pr->wall_s;
    return cap > 0 ? 100.0 * (double)us * 1e-6 / cap : NAN;
}

static double profile_pct_peak(const bench_profile *pr, int k, const cli_peak *peak)
{
    if (pr->flop[k] <= 0 || pr->us[k] <= 0 || !peak || peak->gflops <= 0 || pr->threads <= 0)
        return NAN;
    const double per_thread = (double)pr->flop[k] / ((double)pr->us[k] * 1e-6) * 1e-9;
    return 100.0 * per_thread / (peak->gflops / (double)pr->threads);
}

/* What the phases and the packing leave of threads x wall: waits, the threads' start,
 * the plan, Q's and the output's conversion outside the phases. */
static int64_t profile_rest_us(const bench_profile *pr)
{
    int64_t used = pr->pack_us;
    for (int k = 0; k < n_phases(pr); k++)
        used += pr->us[k];
    return (int64_t)((double)pr->threads * pr->wall_s * 1e6) - used;
}

void bench_profile_json(FILE *f, const bench_profile *pr, const cli_peak *peak)
{
    fputs(",\"profile_wall_ms\":", f);
    cli_json_number(f, pr->wall_s * 1e3);
    for (int k = 0; k < n_phases(pr); k++) {
        fprintf(f, ",\"phase_%s_ms\":", phase_name(pr, k));
        cli_json_number(f, (double)pr->us[k] * 1e-3);
        fprintf(f, ",\"phase_%s_share\":", phase_name(pr, k));
        cli_json_number(f, profile_share(pr, pr->us[k]));
        fprintf(f, ",\"phase_%s_gflop\":", phase_name(pr, k));
        cli_json_number(f, (double)pr->flop[k] * 1e-9);
        fprintf(f, ",\"phase_%s_pct_peak\":", phase_name(pr, k));
        cli_json_number(f, profile_pct_peak(pr, k, peak));
    }
    fputs(",\"phase_pack_ms\":", f);
    cli_json_number(f, (double)pr->pack_us * 1e-3);
    fputs(",\"phase_pack_share\":", f);
    cli_json_number(f, profile_share(pr, pr->pack_us));
    fputs(",\"phase_rest_ms\":", f);
    cli_json_number(f, (double)profile_rest_us(pr) * 1e-3);
    fputs(",\"phase_rest_share\":", f);
    cli_json_number(f, profile_share(pr, profile_rest_us(pr)));
}

void bench_profile_text(const bench_profile *pr, const cli_peak *peak)
{
    printf("# flash %sprofile (the fastest of %d more calls, %lld threads x %.3f ms; thread time, share of that; "
           "the phases' products as %% of the %s peak per thread):\n",
           pr->backward ? "backward " : "", BENCH_PROFILE_CALLS, (long long)pr->threads, pr->wall_s * 1e3,
           peak && peak->gflops > 0 ? peak->kind : "(unprobed)");
    for (int k = 0; k < n_phases(pr); k++) {
        printf("#   %-4s %9.3f ms %5.1f%%", phase_name(pr, k), (double)pr->us[k] * 1e-3, profile_share(pr, pr->us[k]));
        const double pct = profile_pct_peak(pr, k, peak);
        if (pr->flop[k] > 0)
            printf("  %.4g GFLOP, %.1f GFLOP/s per thread", (double)pr->flop[k] * 1e-9,
                   (double)pr->flop[k] / ((double)pr->us[k] * 1e-6 > 0 ? (double)pr->us[k] * 1e-6 : NAN) * 1e-9);
        if (pct == pct)
            printf(", %.1f%% of peak", pct);
        printf("\n");
    }
    if (!pr->backward)
        printf("#   %-4s %9.3f ms %5.1f%%\n", "pack", (double)pr->pack_us * 1e-3, profile_share(pr, pr->pack_us));
    printf("#   %-4s %9.3f ms %5.1f%%  (waits, the threads' start, the rest)\n", "rest",
           (double)profile_rest_us(pr) * 1e-3, profile_share(pr, profile_rest_us(pr)));
}
