/*
 * bench_profile.h: `bench --profile`, the library's phase profile of a call: the
 * forward's (cmd_bench.c) or the backward's (bench_backward.c). BENCH_PROFILE_CALLS
 * calls more after the timed ones, with FA_PARAM_PROFILE on (so the timed calls run with
 * the phase clocks off); the one of the shortest wall time (the least disturbed on a
 * shared machine) gives its wall time and the phase read-outs (FA_PARAM_LAST_PHASE_US
 * and _FLOP), printed as thread time, shares of threads x wall, and each phase's
 * products per thread as % of the probed peak per thread.
 */
#ifndef FLASHATTN_TOOLS_BENCH_PROFILE_H
#define FLASHATTN_TOOLS_BENCH_PROFILE_H

#include "flashattn.h"
#include "measure.h"

#include <stdint.h>
#include <stdio.h>

enum { BENCH_PROFILE_CALLS = 3 };

typedef struct bench_profile {
    int ran, backward; /* backward: the phases are the backward's (profile.h's second list) */
    double wall_s;
    int64_t threads, pack_us;
    int64_t us[FA_PHASES], flop[FA_PHASES];
} bench_profile;

/* One profiled call: fa_forward(fwd), or with bwd fa_backward(bwd) (whose fwd has run,
 * so its o and lse are there); kept in pr when it is the fastest so far. 0, or -1 with
 * a message on stderr. */
int bench_profile_call(fa_context *ctx, const fa_forward_args *fwd, const fa_backward_args *bwd, bench_profile *pr);

/* The JSON fields (,"profile_wall_ms":.. ,"phase_<name>_{ms,share,gflop,pct_peak}"..). */
void bench_profile_json(FILE *f, const bench_profile *pr, const cli_peak *peak);

/* The "# flash profile" lines. */
void bench_profile_text(const bench_profile *pr, const cli_peak *peak);

#endif /* FLASHATTN_TOOLS_BENCH_PROFILE_H */
