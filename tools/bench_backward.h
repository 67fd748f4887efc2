/*
 * bench_backward.h: `flashattn bench --backward`, the training side of bench:
 * the backward alone (after one untimed forward with an lse) and the training
 * step (forward then backward, timed together), for flash against standard,
 * on one shape or over --seqs. cmd_bench.c parses the flags and hands the
 * shapes here.
 *
 * FLOPs: the backward is credited 2.5x the forward's 2*(D+Dv) per kept pair
 * (fa_forward_work's backward_flops), a step 3.5x, times B*Hq.
 */
#ifndef FLASHATTN_TOOLS_BENCH_BACKWARD_H
#define FLASHATTN_TOOLS_BENCH_BACKWARD_H

#include "flashattn.h"
#include "measure.h"
#include "shape.h"

/* One shape: flash and standard (or only --algo), a "backward" and a
 * "fwd+bwd" row each; with profile, the flash backward's phases (bench_profile.h).
 * A CLI_EXIT_* status. */
int bench_backward(fa_context *ctx, const cli_shape *s, int json, const cli_peak *peak,
                   cli_flush *flush, int profile);

/* --seqs: shapes[0..n) (Sq = Sk = N each), flash against standard backward,
 * one table row (or JSON object) per N. A CLI_EXIT_* status. */
int bench_backward_seqs(fa_context *ctx, const cli_shape *shapes, int n, int json,
                        const cli_peak *peak, cli_flush *flush);

#endif /* FLASHATTN_TOOLS_BENCH_BACKWARD_H */
