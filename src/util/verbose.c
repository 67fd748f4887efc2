/*
 * verbose.c: FLASHATTN_VERBOSE=1 prints one line per call on stderr, after the
 * convention of oneDNN's ONEDNN_VERBOSE: comma-separated, a fixed prefix, the
 * algorithm that ran (and, for a fallback, why), the ISA path, shape, dtypes,
 * masks, tiles (and where they came from), threads and the time. It is the only
 * output the library ever makes, and only when asked: it lets a user confirm that
 * the fused kernel ran, and whether a tune file was read.
 */
#include "algos.h"
#include "threadpool.h"

#include <stdio.h>

static const char *causal_name(fa_causal c)
{
    return c == FA_CAUSAL_BOTTOM_RIGHT ? "bottom-right" : c == FA_CAUSAL_TOP_LEFT ? "top-left" : "none";
}

void fa_verbose_exec(const fa_context *ctx, const fa_problem *p, fa_algo ran, const char *fallback,
                     const fa_run_info *info, double ms)
{
    char algo[160], form[32], tiles[640], phases[160];
    snprintf(form, sizeof form, "%s%s%s", p->varlen ? "varlen" : "dense",
             p->cache ? (p->block_table ? "+paged" : "+cache") : "", p->append ? "+append" : "");
    if (fallback)
        snprintf(algo, sizeof algo, "%s(fallback:%s)", fa_algo_name(ran), fallback);
    else
        snprintf(algo, sizeof algo, "%s(%s)", fa_algo_name(ran), ctx->set.algo == FA_ALGO_AUTO ? "auto" : "forced");
    /* where the tiles came from, one word per side when the sides differ
     * ("override/tuned": tile_q set, tile_kv tuned); and once per context, what
     * the tune file gave */
    const int sq = ctx->tune.tile_src_q, skv = ctx->tune.tile_src_kv;
    if (info->br == 0)
        snprintf(tiles, sizeof tiles, "0x0");
    else
        snprintf(tiles, sizeof tiles, "%lldx%lld (%s%s%s)%s%s", (long long)info->br, (long long)info->bc,
                 fa_tiles_source_name(sq), sq == skv ? "" : "/", sq == skv ? "" : fa_tiles_source_name(skv),
                 ctx->tune.note_due ? ",tune:" : "", ctx->tune.note_due ? ctx->tune.note : "");
    /* the tiled loop's phase profile (profile.h), when it keeps one: the thread CPU time
     * (all threads) of the forward's S:X:P:M or the backward's S:X:dP:dS:dV:dK:dQ */
    const int64_t *ph = info->phase_us;
    const int nph = info->backward ? FA_PH_BWD : FA_PH_FWD;
    int64_t any = 0;
    for (int i = 0; i < nph; i++) any += ph[i];
    int len = snprintf(phases, sizeof phases, "-");
    for (int i = 0; any > 0 && i < nph; i++)
        len = i ? len + snprintf(phases + len, sizeof phases - (size_t)len, ":%.3f", (double)ph[i] * 1e-3)
                : snprintf(phases, sizeof phases, "%.3f", (double)ph[i] * 1e-3);
    if (any > 0) snprintf(phases + len, sizeof phases - (size_t)len, "ms");
    fprintf(stderr,
            "flashattn_verbose,%s,%s,isa:%s,path:%s,dtype:%s,out:%s,B:%lld,Hq:%lld,Hk:%lld,Sq:%lld,Sk:%lld,"
            "D:%lld,Dv:%lld,causal:%s,window:%lld:%lld,softcap:%g,alibi:%d,bias:%d,mask:%d,lse:%d,dropout:%g,"
            "form:%s,kv:%s,splits:%lld,packed:%lld:%.3fms,passes:%d,phases:%s,tiles:%s,threads:%d,pool:%s,extra_bytes:%lld,%.3f\n",
            info->backward ? "backward" : "exec", algo, ctx->kernels->name, info->path, fa_dtype_name(p->dtype), fa_dtype_name(p->o.dtype),
            (long long)p->B, (long long)p->Hq, (long long)p->Hk, (long long)p->Sq, (long long)p->Sk,
            (long long)p->D, (long long)p->Dv, causal_name(p->causal), (long long)p->window_left,
            (long long)p->window_right, (double)p->softcap, p->alibi != NULL, p->has_bias, p->has_mask,
            p->has_lse, p->drop.on ? 1.0 - 1.0 / (double)p->drop.scale : 0.0, form, fa_dtype_name(p->cache ? p->kc.dtype : p->k.dtype), (long long)info->kv_splits,
            (long long)info->kv_packed, (double)info->kv_pack_us * 1e-3, (int)info->backward_passes, phases, tiles, (int)info->threads,
            fa_pool_kind_name((int)info->pool), (long long)info->extra_bytes, ms);
}

void fa_verbose_error(const fa_context *ctx, fa_status st)
{
    fprintf(stderr, "flashattn_verbose,error,%s,%s\n", fa_status_string(st), ctx->error);
}
