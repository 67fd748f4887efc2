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
/* The FLOPs of a tile's products for fa_phase_flops: `dim` (2 D for the scores, 2 Dv
 * for P V) per pair of its `rows` rows and `cols` columns that the rows' bands
 * [tlo[r], thi[r]] keep (tlo NULL: every pair); 0 with the profile off, so the loops
 * pay nothing. */
static inline int64_t fa_tile_flops(const fa_phases *ph, int64_t dim, int64_t rows, int64_t cols, const int32_t *tlo,
                                    const int32_t *thi)
{
    if (!ph->on) return 0;
    int64_t pairs = rows * cols;
    if (tlo) {
        pairs = 0;
        for (int64_t r = 0; r < rows; r++) {
            const int64_t a = tlo[r] < 0 ? 0 : tlo[r], z = thi[r] >= cols ? cols - 1 : thi[r];
            pairs += z >= a ? z - a + 1 : 0;
        }
    }
    return dim * pairs;
}
/* The phases' microseconds into us[FA_PHASES_MAX], their FLOPs into flop[FA_PHASES_MAX]. */
void fa_phases_read(const fa_phases *ph, int64_t *us, int64_t *flop);

#endif
