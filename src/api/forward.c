/*
 * forward.c: fa_forward: validate, pick the algorithm (entry.c's table), append a
 * cached call's new rows, run the algorithm, record what ran; fa_forward_check and
 * fa_forward_work stop after the first two steps, so what they accept is what
 * fa_forward accepts.
 */
#include "entry.h"
#include "cache.h"
#include "convert.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* A dense call with no keys: every row keeps nothing, so o = 0 and lse = -inf, or
 * the head's sink (docs/semantics.md, empty rows), whichever algorithm was asked for. */
static void write_empty_rows(const fa_problem *p)
{
    static const float zeros[256];
    /* the loops run over elements of o or lse only: with Dv = 0 and no lse there are
     * none, however large B * Hq * Sq is */
    if (p->Dv == 0 && !p->has_lse) return;
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < p->Hq; h++) {
            for (int64_t e0 = 0; e0 < p->Dv; e0 += 256) {
                fa_tensor o = p->o; /* columns e0 .. of every row */
                o.data = (char *)o.data + e0 * o.stride[3] * (int64_t)fa_dtype_size(o.dtype);
                for (int64_t i = 0; i < p->Sq; i++)
                    fa_store_rows(&o, &fa_kernels_ref, b, i, 1, h, p->Dv - e0 < 256 ? p->Dv - e0 : 256, zeros, 0);
            }
            if (p->has_lse)
                for (int64_t i = 0; i < p->Sq; i++)
                    ((float *)p->lse.data)[b * p->lse.stride[0] + h * p->lse.stride[1] + i * p->lse.stride[2]] =
                        fa_sink(p, h);
        }
}

/* The keep bits of every (b, h, i, j), for a caller that asked for them (tests). */
static void write_dropout_mask(const fa_problem *p)
{
    uint8_t keep[256];
    const fa_tensor *t = &p->drop_mask;
    for (int d = 0; d < 4; d++)
        if (t->shape[d] == 0) return; /* no elements, however many rows */
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < p->Hq; h++)
            for (int64_t i = 0; i < p->Sq; i++)
                for (int64_t j0 = 0; j0 < p->Sk; j0 += 256) {
                    const int64_t n = p->Sk - j0 < 256 ? p->Sk - j0 : 256;
                    if (p->drop.on)
                        fa_dropout_row(&p->drop, b, h, p->Hq, p->q_start + i, p->k_start + j0, n, keep);
                    else
                        memset(keep, 1, (size_t)n);
                    unsigned char *row = (unsigned char *)t->data + b * t->stride[0] + h * t->stride[1] + i * t->stride[2];
                    for (int64_t c = 0; c < n; c++) row[(j0 + c) * t->stride[3]] = keep[c];
                }
}

/* Runs e on p. A cached call's new rows go into the cache first (algorithms read
 * them there); if the algorithm then fails, what they replaced is put back, so a
 * failed call leaves the cache as it was. */
static fa_status run_appending(fa_context *ctx, const fa_algo_entry *e, const fa_problem *p, fa_run_info *info)
{
    if (!p->append) return e->run(ctx, p, info);
    fa_cache_undo undo;
    fa_status st = fa_cache_append(ctx, p, &undo);
    if (st != FA_OK) return st;
    if ((st = e->run(ctx, p, info)) != FA_OK)
        fa_cache_append_undo(p, &undo);
    else
        info->extra_bytes += undo.bytes;
    fa_cache_append_end(&undo);
    return st;
}

/* Everything fa_forward decides before it runs: validation, then the algorithm
 * (whose support is part of validity). fa_forward_check and fa_forward_work stop
 * here, so what they accept is what fa_forward accepts. */
static fa_status prepare_forward(fa_context *ctx, const fa_forward_args *args, fa_problem *p,
                                 const fa_algo_entry **e, const char **fallback)
{
    fa_status st = fa_validate_forward(ctx, args, p);
    if (st != FA_OK) return st;
    *e = fa_algo_choose(ctx, p, fallback, &st);
    return *e ? FA_OK : st;
}

fa_status fa_forward_entered(fa_context *ctx, const fa_forward_args *args)
{
    fa_problem p;
    const char *fallback = NULL;
    const fa_algo_entry *e;
    fa_status st = prepare_forward(ctx, args, &p, &e, &fallback);
    if (st != FA_OK) return st;

    fa_run_info info = {.threads = 1, .path = ""};
    const double t0 = ctx->set.verbose ? fa_now_s() : 0.0;
    if (!fa_problem_is_form(&p) && (p.B == 0 || p.Sq == 0 || p.Hq == 0)) {
        info.path = "empty"; /* nothing to compute or write */
    } else if (!fa_problem_is_form(&p) && p.Sk == 0) {
        write_empty_rows(&p);
        info.path = "empty";
    } else if ((st = run_appending(ctx, e, &p, &info)) != FA_OK) {
        return st;
    }
    if (p.has_drop_mask) write_dropout_mask(&p);
    fa_run_record(ctx, &p, e, fallback, &info, t0);
    return FA_OK;
}

/* The bodies of the public calls below, for fa_guarded_call. */
static fa_status forward_call(fa_context *ctx, const void *args, void *out)
{
    (void)out;
    return fa_forward_entered(ctx, args);
}

static fa_status forward_check_call(fa_context *ctx, const void *args, void *out)
{
    (void)out;
    fa_problem p;
    const fa_algo_entry *e;
    const char *fallback = NULL;
    return prepare_forward(ctx, args, &p, &e, &fallback);
}

fa_status fa_forward(fa_context *ctx, const fa_forward_args *args)
{
    return fa_guarded_call(ctx, forward_call, args, NULL, 1);
}

fa_status fa_forward_check(fa_context *ctx, const fa_forward_args *args)
{
    return fa_guarded_call(ctx, forward_check_call, args, NULL, 0);
}

/* ------------------------------------------------------------------- work */

/* The backward's FLOP credit against the forward's: five products of a kept pair's
 * rows (S, dP, dV, dQ, dK) against two (S, O), as docs/semantics.md counts them. */
#define FA_BACKWARD_FLOP_FACTOR 2.5
/* pairs and flops are required of every caller's fa_work */
#define FA_WORK_MIN_SIZE (offsetof(fa_work, flops) + sizeof(double))

/* Kept pairs of the validated call p, summed over its sequences and query heads:
 * every sequence at its own lengths (a dense batch is B alike). Within int64: at
 * most B*Hq*Sq*Sk, which checks.c bounds. */
static int64_t problem_pairs(const fa_problem *p)
{
    if (p->Hq == 0) return 0;
    fa_view s = p->view;
    if (p->bm.on) { /* the pairs it keeps: each mask row once, times the sequences or heads it serves */
        const int each = p->bm.row_b || fa_problem_is_form(p); /* sequences of their own rows or lengths */
        const int64_t nb = each ? p->B : (p->B > 0), nh = p->bm.row_h ? p->Hq : 1;
        int64_t pairs = 0;
        for (int64_t b = 0; b < nb; b++) {
            fa_seq_view(p, b, &s);
            for (int64_t h = 0; h < nh; h++) pairs += fa_bmask_kept_pairs(p, &s, 0, h, 0, s.Sq, 0, s.Sk, 1);
        }
        return pairs * (each ? 1 : p->B) * (p->bm.row_h ? 1 : p->Hq);
    }
    if (!fa_problem_is_form(p)) return p->B == 0 ? 0 : fa_kept_pairs(p, &p->view, 0, p->Sq, 0, p->Sk) * p->B * p->Hq;
    int64_t pairs = 0;
    for (int64_t b = 0; b < p->B; b++) {
        fa_seq_lengths(p, b, &s.Sq, &s.Sk);
        pairs += fa_kept_pairs(p, &s, 0, s.Sq, 0, s.Sk);
    }
    return pairs * p->Hq;
}

static fa_status forward_work_call(fa_context *ctx, const void *args, void *out_)
{
    fa_work *out = out_;
    if (!out) return fa_fail(ctx, FA_ERR_NULL_POINTER, "out is NULL");
    if (out->struct_size < FA_WORK_MIN_SIZE || out->struct_size > sizeof(fa_work) + 4096)
        return fa_fail(ctx, FA_ERR_STRUCT_SIZE, "out->struct_size is %zu; initialise it with FA_WORK_INIT (%zu)",
                       out->struct_size, sizeof(fa_work));
    fa_problem p;
    const fa_algo_entry *e;
    const char *fallback = NULL;
    const fa_status st = prepare_forward(ctx, args, &p, &e, &fallback);
    if (st != FA_OK) return st;
    fa_work w = FA_WORK_INIT;
    w.pairs = problem_pairs(&p);
    w.flops = 2.0 * (double)(p.D + p.Dv) * (double)w.pairs;
    w.backward_flops = FA_BACKWARD_FLOP_FACTOR * w.flops;
    /* the fields the caller's fa_work has, past its struct_size */
    const size_t n = out->struct_size < sizeof w ? out->struct_size : sizeof w;
    memcpy((char *)out + sizeof(size_t), (const char *)&w + sizeof(size_t), n - sizeof(size_t));
    return FA_OK;
}

fa_status fa_forward_work(fa_context *ctx, const fa_forward_args *args, fa_work *out)
{
    return fa_guarded_call(ctx, forward_work_call, args, out, 0);
}

/* fa_forward_band's question: row `row` of sequence `seq`, and where the answer goes. */
typedef struct band_query {
    int64_t seq, row;
    int64_t *lo, *hi;
} band_query;

/* The band of the validated call's row: fa_row_band at the sequence's own lengths
 * (a dense call's batch rows all have the call's). */
static fa_status forward_band_call(fa_context *ctx, const void *args, void *out)
{
    const band_query *bq = out;
    if (!bq->lo || !bq->hi) return fa_fail(ctx, FA_ERR_NULL_POINTER, "lo or hi is NULL");
    fa_problem p;
    const fa_algo_entry *e;
    const char *fallback = NULL;
    const fa_status st = prepare_forward(ctx, args, &p, &e, &fallback);
    if (st != FA_OK) return st;
    if (bq->seq < 0 || bq->seq >= p.B)
        return fa_fail(ctx, FA_ERR_OUT_OF_RANGE, "sequence %lld of a call of %lld", (long long)bq->seq, (long long)p.B);
    fa_view s = p.view; /* the band reads the view's lengths only */
    if (fa_problem_is_form(&p)) fa_seq_lengths(&p, bq->seq, &s.Sq, &s.Sk);
    if (bq->row < 0 || bq->row >= s.Sq)
        return fa_fail(ctx, FA_ERR_OUT_OF_RANGE, "row %lld of a sequence of %lld query rows", (long long)bq->row,
                       (long long)s.Sq);
    fa_row_band(&p, &s, bq->row, bq->lo, bq->hi);
    return FA_OK;
}

fa_status fa_forward_band(fa_context *ctx, const fa_forward_args *args, int64_t seq, int64_t row, int64_t *lo,
                          int64_t *hi)
{
    band_query bq = {seq, row, lo, hi};
    return fa_guarded_call(ctx, forward_band_call, args, &bq, 0);
}
