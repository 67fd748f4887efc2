/*
 * plan.h: the tile plan of the flash loop (src/schedule/plan.c). The planner is a function of
 * the problem and its inputs alone: the kernel table's blocking, the tiles a tune
 * entry gives the call's shape class and the context's tile settings, all passed
 * in (src/schedule/plan_inputs.c gathers them from a context); it reads no file and no context.
 */
#ifndef FA_PLAN_H
#define FA_PLAN_H

#include "kernels/kernels.h"
#include "problem.h"

#include <stdint.h>

/* Where a plan's tile sizes came from (fa_plan.src_q, src_kv; the verbose trace). */
enum { FA_TILES_HEURISTIC = 0, FA_TILES_TUNED = 1, FA_TILES_OVERRIDE = 2 };

static inline const char *fa_tiles_source_name(int src)
{
    return src == FA_TILES_TUNED ? "tuned" : src == FA_TILES_OVERRIDE ? "override" : "heuristic";
}

/* Tile sizes for the flash loop. */
typedef struct fa_plan {
    int64_t br, bc;  /* query rows and key columns per tile */
    int64_t br_pad;  /* leading dimension of the Q panel and score tile: fa_panel_ld(br) */
    int src_q, src_kv; /* where br and bc came from: FA_TILES_* */
} fa_plan;

/* What the planner takes besides the problem. */
typedef struct fa_plan_inputs {
    const fa_kernels *kernels; /* its row alignment and qk register block */
    int64_t tuned_q, tuned_kv; /* a tune entry's tiles for the call's shape class; 0: none */
    int64_t set_q, set_kv;     /* FA_PARAM_TILE_Q / _KV; 0: planned */
} fa_plan_inputs;

/* Whether p has a causal mask or a window (the planner's and the tune key's "masked"). */
int fa_plan_masked(const fa_problem *p);

/* How the caller runs a plan's tiles (fa_plan_from's `loop`): FA_PLAN_TRIMMED cuts a
 * causal band's diagonal tiles to the columns its rows keep (algo_flash.c,
 * wide_trimmed), so large tiles waste nothing there; FA_PLAN_FUSED is the fused bf16
 * forward (kernels.h, fwd_bf16), which skips the blocks of a tile its rows' bands
 * leave out as trimming does, and walks a tile strip by strip, so that a block of
 * queries over keys that fit one tile keeps nothing in cache between tiles. */
enum { FA_PLAN_PLAIN = 0, FA_PLAN_TRIMMED = 1, FA_PLAN_FUSED = 2 };

/* The plan of p: the heuristic, replaced by the tuned tiles when there are, each side
 * overridden by its setting. */
void fa_plan_from(const fa_plan_inputs *in, const fa_problem *p, int loop, fa_plan *plan);

/* Leading dimension for panels of `rows` query rows: a multiple of FA_ROW_ALIGN
 * that avoids L1 set aliasing. */
int64_t fa_panel_ld(int64_t rows);
int64_t fa_l2_bytes(void);

#endif
