/*
 * algos.h: the algorithms forward.c's table dispatches to (each runs a validated
 * problem and fills the run's fa_run_info), and the tile plan of the tiled ones.
 */
#ifndef FA_ALGOS_H
#define FA_ALGOS_H

#include "context.h"
#include "plan.h"
#include "problem.h"

/* The plan of p with ctx's inputs (src/plan_inputs.c): its kernel table, its tuned
 * tiles for p's shape class and its tile settings, fed to fa_plan_from (plan.h).
 * Not const: it records, for fa_tune and the verbose trace, the shape class and
 * where the tiles came from. trimmed: as fa_plan_from's. */
void fa_plan_tiles(fa_context *ctx, const fa_problem *p, int trimmed, fa_plan *plan);
/* Whether bf16 inputs are multiplied as bf16 pairs on this context: the path must
 * have the kernels, and they must outrun fp32 FMA on this CPU (auto) or be forced. */
int fa_bf16_dot_active(const fa_context *ctx);
/* Reads ctx's tuned tiles from the tune file (src/plan_inputs.c): when the context
 * is made, and again after fa_tune saved an entry. Its note goes into the trace of
 * the next plan that asks for tuned tiles. */
void fa_context_read_tune(fa_context *ctx);

/* Algorithms: each runs a validated problem and fills info; the backward of each
 * differentiates its own forward (forward.c's table holds both). */
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
/* fa_forward on a context the caller has entered (fa_tune's runs). */
fa_status fa_forward_run(fa_context *ctx, const fa_forward_args *args);


/*
 * The phase profile of the FLASHATTN_VERBOSE trace (verbose.c prints it): the thread
 * CPU time of each phase of a tiled loop, summed over the threads, so that a thread
 * waiting for a core is charged to nothing. Off, nothing is timed and fa_phase_mark
 * returns 0. The phases follow docs/semantics.md's steps, the backward's numbered as
 * algo_flash_bwd.c's table:
 *   forward   S (1, scores), X (2-8, masks, softmax, dropout), P (9, P V), M (merge of split-KV chunks);
 *   backward  S (1-5, scores again), X (6-7, P again), dP (of 9), dS (of 7 and 2), dV (of 9),
 *             dK (of 1), dQ (of 1).
 */
enum { FA_PH_S, FA_PH_X, FA_PH_P, FA_PH_M, FA_PH_FWD };
enum { FA_PH_BS, FA_PH_BX, FA_PH_DP, FA_PH_DS, FA_PH_DV, FA_PH_DK, FA_PH_DQ, FA_PH_BWD };
typedef struct fa_phases {
    int on;
    _Atomic long long ns[FA_PHASES_MAX];
} fa_phases;
void fa_phases_init(fa_phases *ph, int on);
/* The thread's CPU clock when on (the start of a phase), else 0. */
double fa_phase_start(const fa_phases *ph);
/* Charges the time since t0 to the phase; returns the clock (the next phase's start). */
double fa_phase_mark(fa_phases *ph, int phase, double t0);
void fa_phases_read(const fa_phases *ph, int64_t *us);

/* FLASHATTN_VERBOSE lines on stderr (src/verbose.c). */
void fa_verbose_exec(const fa_context *ctx, const fa_problem *p, fa_algo ran, const char *fallback,
                     const fa_run_info *info, double ms);
void fa_verbose_error(const fa_context *ctx, fa_status st);

#endif
