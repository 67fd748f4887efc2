/*
 * plan.c: tile sizes for the flash loop, from the cache sizes of this machine,
 * the head dims and the number of tasks the threads need. The goal: the Q panel
 * and the output accumulator of a block (reused across every K/V tile) plus one
 * K/V tile and its score tile stay within a share of the per-core L2, while there
 * are enough (b, h, q-block) tasks to keep threads busy to the end.
 * The plan never depends on the thread count: tile sizes decide the order of
 * floating-point operations, and results must be bitwise the same for any
 * number of threads. A tuned entry for the call's shape class (the tune file,
 * src/schedule/tune.c) replaces the heuristic; a context setting (FA_PARAM_TILE_Q /
 * FA_PARAM_TILE_KV) overrides either size over both. Both come in as inputs
 * (plan.h): the planner reads no file and no context.
 */
#include "plan.h"
#include "arith.h"

#include <unistd.h>

static int64_t cache_bytes(int name, int64_t fallback)
{
#if defined(_SC_LEVEL2_CACHE_SIZE)
    long v = sysconf(name);
    if (v > 0) return v;
#else
    (void)name;
#endif
    return fallback;
}

int64_t fa_l2_bytes(void)
{
#if defined(_SC_LEVEL2_CACHE_SIZE)
    return cache_bytes(_SC_LEVEL2_CACHE_SIZE, 1 << 20);
#else
    return cache_bytes(0, 1 << 20);
#endif
}


int fa_plan_masked(const fa_problem *p)
{
    return p->causal != FA_CAUSAL_NONE || p->window_left >= 0 || p->window_right >= 0;
}

/* The fused forward's keys in one tile: up to this many keys (a short call, a chunk of
 * chunked prefill) take one tile (K^T and V pairs of bf16: 256 KiB at D = Dv = 128),
 * and their query blocks grow to as many rows, as long as tasks_wanted remain: with
 * one key tile a block's Q and accumulator are used once each, strip by strip, so a
 * taller block costs no cache, while every extra tile boundary and every block's
 * packed K/V shared between blocks do cost (the unit's K^T and V pairs come back
 * from L3 for the second block of a 512-key sequence). */
enum { FUSED_ONE_TILE = 512 };

void fa_plan_from(const fa_plan_inputs *in, const fa_problem *p, int loop, fa_plan *plan)
{
    const int trimmed = loop != FA_PLAN_PLAIN;
    const int64_t budget = fa_l2_bytes() / 2; /* leave the rest to K/V rows streaming through */
    const int64_t D = p->D, Dv = p->Dv;
    /* the table's preferred blocking (kernels.h): its row alignment is the floor for
     * huge heads, its qk register block one for every shape */
    const fa_kernels *kern = in->kernels;
    const int64_t row_align = kern->row_align;
    /* enough tasks for 4 threads x 4 each; a constant, not ctx->threads (see above).
     * br stays >= br_min unless Sq itself is shorter: one register block of the
     * table's qk, and at least 64 rows, below which blocks re-read K/V more often
     * than they gain in balance (64 is also the tallest block today, avx512's). */
    const int64_t tasks_wanted = 16, reread_rows = 64;
    const int64_t qk_rows = fa_round_up(kern->qk_block.rows > 0 ? kern->qk_block.rows : 1, row_align);
    const int64_t br_min = qk_rows > reread_rows ? qk_rows : reread_rows;

    /* br: the largest block whose Q panel + accumulator fit a third of the budget,
     * while leaving tasks_wanted tasks when the shape allows it */
    int64_t br = 256;
    while (br > br_min && (br * (D + Dv) * 4 > budget / 3 ||
                           p->B * p->Hq * ((p->Sq + br - 1) / br) < tasks_wanted))
        br /= 2;
    while (br > row_align && br * (D + Dv) * 4 > budget / 3) br /= 2; /* huge heads */
    /* bc: the largest K/V tile whose rows plus its score tile fit the rest */
    int64_t bc = 512;
    while (bc > 16 && bc * (D + Dv + br) * 4 > budget - br * (D + Dv) * 4) bc /= 2;

    /* Causal and window masks leave partly masked tiles along the band's edges, whose
     * masked half is computed and discarded: keep tiles a small fraction of the
     * lengths so that waste stays small. A trimmed causal band computes no masked
     * half, and there large tiles win (bench/README.md, "Kernel and plan notes"). */
    const int masked = fa_plan_masked(p);
    const int windowed = p->window_left >= 0 || p->window_right >= 0;
    if (masked && (!trimmed || windowed)) {
        while (br > br_min && br > p->Sq / 8) br /= 2;
        while (bc > 64 && bc > p->Sk / 4) bc /= 2;
    }

    if (loop == FA_PLAN_FUSED && p->Sk <= FUSED_ONE_TILE && !windowed) {
        bc = FUSED_ONE_TILE;
        while (br < FUSED_ONE_TILE && br < p->Sq && p->B * p->Hq * ((p->Sq + 2 * br - 1) / (2 * br)) >= tasks_wanted)
            br *= 2;
    }

    plan->src_q = plan->src_kv = FA_TILES_HEURISTIC;
    if (in->tuned_q > 0 && in->tuned_kv > 0) {
        br = in->tuned_q;
        bc = in->tuned_kv;
        plan->src_q = plan->src_kv = FA_TILES_TUNED;
    }
    if (in->set_q > 0) {
        br = in->set_q;
        plan->src_q = FA_TILES_OVERRIDE;
    }
    if (in->set_kv > 0) {
        bc = in->set_kv;
        plan->src_kv = FA_TILES_OVERRIDE;
    }
    /* tiles inside the block mask's blocks, so that a skipped block is never computed,
     * or of whole blocks where that computes little more (or the loop trims it away) */
    fa_bmask_plan_tiles(p, loop, &br, &bc);
    plan->br = br < p->Sq ? br : p->Sq;
    plan->bc = bc < p->Sk ? bc : p->Sk;
    plan->br_pad = fa_panel_ld(plan->br);
}

int64_t fa_panel_ld(int64_t rows)
{
    /* A row stride that is a multiple of 256 bytes maps the rows of qt and st onto a
     * few L1 sets, and they evict each other; one extra vector breaks the pattern. */
    int64_t ld = fa_round_up(rows, FA_ROW_ALIGN);
    return ld % 64 == 0 ? ld + FA_ROW_ALIGN : ld;
}
