/*
 * algos.h: the algorithms entry.c's table dispatches to (each runs a validated
 * problem and fills the run's fa_run_info), and the tile plan of the tiled ones.
 */
#ifndef FA_ALGOS_H
#define FA_ALGOS_H

#include "context.h"
#include "plan.h"
#include "profile.h"
#include "problem.h"

/* The plan of p with ctx's inputs (src/schedule/plan_inputs.c): its kernel table, its tuned
 * tiles for p's shape class and its tile settings, fed to fa_plan_from (plan.h).
 * Not const: it records, for fa_tune and the verbose trace, the shape class and
 * where the tiles came from. loop: as fa_plan_from's (FA_PLAN_*). */
void fa_plan_tiles(fa_context *ctx, const fa_problem *p, int loop, fa_plan *plan);
/* Whether bf16 inputs are multiplied as bf16 pairs on this context: the path must
 * have the kernels, and they must outrun fp32 FMA on this CPU (auto) or be forced. */
int fa_bf16_dot_active(const fa_context *ctx);
/* Reads ctx's tuned tiles from the tune file (src/schedule/plan_inputs.c): when the context
 * is made, and again after fa_tune saved an entry. Its note goes into the trace of
 * the next plan that asks for tuned tiles. */
void fa_context_read_tune(fa_context *ctx);

/* Algorithms: each runs a validated problem and fills info; the backward of each
 * differentiates its own forward (entry.c's table holds both). */
fa_status fa_run_reference(fa_context *ctx, const fa_problem *p, fa_run_info *info);
fa_status fa_run_standard(fa_context *ctx, const fa_problem *p, fa_run_info *info);
fa_status fa_run_flash(fa_context *ctx, const fa_problem *p, fa_run_info *info);
fa_status fa_run_reference_backward(fa_context *ctx, const fa_problem *p, const fa_grads *g, fa_run_info *info);
fa_status fa_run_standard_backward(fa_context *ctx, const fa_problem *p, const fa_grads *g, fa_run_info *info);
fa_status fa_run_flash_backward(fa_context *ctx, const fa_problem *p, const fa_grads *g, fa_run_info *info);
/* The tiled backward loop (algo_flash_bwd.c) with br x bc tiles: flash plans them
 * and lets the loop run in two passes when that fills the threads better
 * (two_pass_ok); the standard algorithm takes one tile of the whole sequence, which
 * materialises S, P, dP and dS per head as eager attention does, in one pass. */
fa_status fa_backward_tiled(fa_context *ctx, const fa_problem *p, const fa_grads *g, int64_t br, int64_t bc,
                            int two_pass_ok, fa_run_info *info);


/* FLASHATTN_VERBOSE lines on stderr (src/util/verbose.c). */
void fa_verbose_exec(const fa_context *ctx, const fa_problem *p, fa_algo ran, const char *fallback,
                     const fa_run_info *info, double ms);
void fa_verbose_error(const fa_context *ctx, fa_status st);

#endif
