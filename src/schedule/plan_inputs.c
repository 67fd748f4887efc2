/*
 * plan_inputs.c: what a context's calls plan with. The planner (plan.c) is a function
 * of its inputs; this file gathers them from the context: its kernel table, its
 * tuned tiles (the tune file, read when the context is made and again after fa_tune
 * saves, never by the planner) and its tile settings; and it keeps what fa_tune and
 * the verbose trace read back: the call's shape class and where its tiles came from.
 * Also the context's other per-call choice of operands: bf16 as pairs or not.
 */
#include "algos.h"
#include "cpu.h"
#include "tune.h"

void fa_context_read_tune(fa_context *ctx)
{
    fa_tune_free(ctx->tune.table);
    ctx->tune.table = fa_tune_read(ctx->kernels->name, ctx->tune.note, sizeof ctx->tune.note);
    ctx->tune.note_pending = 1;
}

void fa_plan_tiles(fa_context *ctx, const fa_problem *p, int loop, fa_plan *plan)
{
    fa_plan_inputs in = {.kernels = ctx->kernels, .set_q = ctx->set.tile_q, .set_kv = ctx->set.tile_kv};
    ctx->tune.note_due = 0;
    /* tuned tiles only matter when a side is planned; while fa_tune sweeps, none are
     * taken, but the sweep reads the shape class back */
    if (in.set_q == 0 || in.set_kv == 0) {
        ctx->tune.key = fa_tune_key_of(p, fa_plan_masked(p));
        if (!ctx->tune.off) {
            ctx->tune.note_due = ctx->tune.note_pending;
            ctx->tune.note_pending = 0;
            fa_tune_find(ctx->tune.table, &ctx->tune.key, &in.tuned_q, &in.tuned_kv);
        }
    }
    fa_plan_from(&in, p, loop, plan);
    ctx->tune.tile_src_q = plan->src_q;
    ctx->tune.tile_src_kv = plan->src_kv;
}

int fa_bf16_dot_active(const fa_context *ctx)
{
    if (!(ctx->kernels->flags & FA_KERNELS_BF16_DOT) || ctx->set.bf16_dot == 2) return 0;
    return ctx->set.bf16_dot == 1 || (ctx->kernels->flags & FA_KERNELS_BF16_DOT_FAST) || fa_cpu_get()->bf16_dot_fast;
}
