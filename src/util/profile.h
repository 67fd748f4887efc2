/*
 * profile.h: the phase profile the tiled loops keep for the FLASHATTN_VERBOSE trace
 * (src/util/profile.c; verbose.c prints it): the thread CPU time of each phase of a tiled
 * loop, summed over the threads, so that a thread waiting for a core is charged to
 * nothing. Off, nothing is timed and fa_phase_mark
 * returns 0. The phases follow docs/semantics.md's steps, the backward's numbered as
 * algo_flash_bwd.c's table:
 *   forward   S (1, scores), X (2-8, masks, softmax, dropout), P (9, P V), M (merge of split-KV chunks);
 *   backward  S (1-5, scores again), X (6-7, P again), dP (of 9), dS (of 7 and 2), dV (of 9),
 *             dK (of 1), dQ (of 1).
 */
#ifndef FA_PROFILE_H
#define FA_PROFILE_H

#include "context.h" /* FA_PHASES_MAX, fa_now_s */

#include <stdatomic.h>

enum { FA_PH_S, FA_PH_X, FA_PH_P, FA_PH_M, FA_PH_FWD };
enum { FA_PH_BS, FA_PH_BX, FA_PH_DP, FA_PH_DS, FA_PH_DV, FA_PH_DK, FA_PH_DQ, FA_PH_BWD };
typedef struct fa_phases {
    int on;
    _Atomic long long ns[FA_PHASES_MAX];
    _Atomic long long flop[FA_PHASES_MAX]; /* the products' FLOPs each phase ran (fa_phase_flops) */
} fa_phases;
void fa_phases_init(fa_phases *ph, int on);
/* The thread's CPU clock when on (the start of a phase), else 0. */
double fa_phase_start(const fa_phases *ph);
/* Charges the time since t0 to the phase; returns the clock (the next phase's start). */
double fa_phase_mark(fa_phases *ph, int phase, double t0);
/* Credits the phase with the FLOPs of products it ran (when on). */
static inline void fa_phase_flops(fa_phases *ph, int phase, int64_t flops)
{
    if (ph->on) atomic_fetch_add_explicit(&ph->flop[phase], flops, memory_order_relaxed);
}
/* The phases' microseconds into us[FA_PHASES_MAX], their FLOPs into flop[FA_PHASES_MAX]. */
void fa_phases_read(const fa_phases *ph, int64_t *us, int64_t *flop);

#endif
