/*
 * ring.c: ring attention over MPI (include/flashattn_mpi.h, docs/mpi.md), and the
 * checks and agreement Ulysses (ulysses.c) shares. Every rule of the ring (where the
 * rows sit, the pieces of a step, their placement and kept pairs, the descriptor and
 * its verdict) is the core's ring planner's (fa_ring_*); this file moves the bytes.
 *
 * One call runs in four passes, the same on every rank:
 *   1. local checks of the arguments, without communication;
 *   2. the agreement: one MPI_Allgather of a fixed descriptor per rank, from which
 *      every rank derives the same verdict (and the shard lengths of all), then the
 *      buffers, then one MPI_Allreduce that agrees on whether they could be had;
 *   3. the ring, P steps: at step s rank r holds the k/v shard of rank r - s; it
 *      posts the next shard's MPI_Irecv and its own MPI_Isend first, then runs the
 *      local attention on the shard at hand in query-row pieces with MPI_Testall
 *      between them (Open MPI moves a large message only while MPI is entered);
 *      a core failure is recorded and the ring still completes, so nobody waits;
 *   4. the statuses of the ring agreed (MPI_Allgather), then the outputs written.
 *
 * Forward: the partial (o, lse) of every step are merged into f32 accumulators
 * with fa_merge_states, in ring order, so the result is bitwise reproducible.
 * Backward: each step runs fa_backward on (local q, visiting k/v) with the forward's
 * GLOBAL o and lse of the local queries: P_ij = exp(s_ij - lse_i) and
 * dot(dO_i, o_i) are then those of the whole sequence, so the step's dq, dk, dv are
 * exactly its terms of the full sums. dq sums locally in f32; the dk/dv terms add
 * into f32 accumulators that travel the ring one step behind their k/v shard and
 * come back to its owner after P steps; the owner computes the second half of its
 * own shard's step meanwhile, so that last hop is hidden as well.
 *
 * Legend: P ranks, r this rank, B batch, Hq/Hk heads, D/Dv head dims, S_r rows of
 * rank r, Sl = S_r, Smax the longest shard. Buffers: kv (B, S, Hk, D) then
 * (B, S, Hk, Dv) in the input dtype; accumulators the same in f32.
 */
#include "ring_internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ring_fault_step = -1;

/* ------------------------------------------------------------ transfers */

/* MPI counts are int: a buffer goes as messages of at most 1 GiB. */
#define RING_CHUNK ((int64_t)1 << 30)
enum { RING_MAX_CHUNKS = 32, RING_TAG_KV = 1, RING_TAG_ACC = 2 };

typedef struct xfer {
    MPI_Request req[4 * RING_MAX_CHUNKS];
    int n;
} xfer;

static void xfer_post(xfer *x, int send, void *buf, int64_t bytes, int peer, int tag, MPI_Comm comm)
{
    int64_t off = 0;
    int c = 0;
    do { /* a zero-byte buffer is still one message: both sides stay in step */
        const int64_t n = bytes - off > RING_CHUNK ? RING_CHUNK : bytes - off;
        MPI_Request *r = &x->req[x->n++];
        if (send) MPI_Isend((char *)buf + off, (int)n, MPI_BYTE, peer, tag + 8 * c, comm, r);
        else MPI_Irecv((char *)buf + off, (int)n, MPI_BYTE, peer, tag + 8 * c, comm, r);
        off += n;
        c++;
    } while (off < bytes);
}

/* 1 when every request of x has completed (or x is empty). */
static int xfer_test(xfer *x)
{
    if (x->n == 0) return 1;
    int done = 0;
    MPI_Testall(x->n, x->req, &done, MPI_STATUSES_IGNORE);
    if (done) x->n = 0;
    return done;
}

static void xfer_wait(xfer *x)
{
    if (x->n) MPI_Waitall(x->n, x->req, MPI_STATUSES_IGNORE);
    x->n = 0;
}

/* -------------------------------------------------------- one ring call */


fa_status ring_call_fail(ring_call *rc, fa_status st, int step, const char *what)
{
    if (rc->st == FA_OK) {
        rc->st = st;
        snprintf(rc->msg, sizeof rc->msg, "rank %d, ring step %d: %s: %s", rc->rank, step, what,
                 fa_context_error(rc->ctx));
    }
    return st;
}

/* A failure the core found, reported with the core's own message. */
fa_status ring_core_fail(fa_status st, fa_context *ctx)
{
    return ring_fail(st, "%s", fa_context_error(ctx));
}

static int mul_ok(int64_t *acc, int64_t x)
{
    if (x < 0) return 0;
    if (x != 0 && *acc > INT64_MAX / x) return 0;
    *acc *= x;
    return 1;
}

/* What has no meaning for a sequence the ring shards, refused with its reason. */
static fa_status check_ring_fields(const ring_call *rc, const fa_forward_args *a)
{
    const char *by = rc->driver;
    if (a->bias.data) return ring_fail(FA_ERR_UNSUPPORTED, "bias tensors are not supported by %s", by);
    if (a->mask.data) return ring_fail(FA_ERR_UNSUPPORTED, "mask tensors are not supported by %s", by);
    if (a->cu_seqlens_q || a->cu_seqlens_k)
        return ring_fail(FA_ERR_UNSUPPORTED, "variable-length (cu_seqlens) calls are not supported by %s", by);
    if (a->kv_cache) return ring_fail(FA_ERR_UNSUPPORTED, "KV caches are not supported by %s", by);
    /* a block mask numbers the whole sequence's blocks, a shard's call its own */
    if (a->block_mask) return ring_fail(FA_ERR_UNSUPPORTED, "block masks are not supported by %s", by);
    if (a->dropout_mask.data)
        return ring_fail(FA_ERR_UNSUPPORTED, "dropout_mask is not supported by %s", by);
    if (a->q_start || a->k_start)
        return ring_fail(FA_ERR_UNSUPPORTED, "q_start/k_start are set by the ring from the sharding; pass 0");
    return FA_OK;
}

/* Pass 1 for the forward's arguments (also run by the backward on its fwd). */
fa_status ring_check_forward(ring_call *rc, fa_context *ctx, const fa_ring_args *ring,
                               const fa_forward_args *local)
{
    if (!ctx) return ring_fail(FA_ERR_NULL_CONTEXT, "the context is NULL");
    if (!ring || !local) return ring_fail(FA_ERR_NULL_POINTER, "%s is NULL", ring ? "the forward args" : "ring");
    /* both structs are read by the core's struct_size rule; fa_forward_check below
     * holds the caller's fa_forward_args to the core's minimum */
    fa_ring_args rg = FA_RING_ARGS_INIT;
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    fa_status st;
    if ((st = fa_struct_read(ctx, "ring", ring, &rg, sizeof rg, offsetof(fa_ring_args, pieces))) != FA_OK ||
        (st = fa_struct_read(ctx, "args", local, &a, sizeof a, sizeof(size_t))) != FA_OK)
        return ring_core_fail(st, ctx);
    if (rg.sharding != FA_RING_CONTIGUOUS && rg.sharding != FA_RING_ZIGZAG)
        return ring_fail(FA_ERR_INVALID_ARGUMENT, "ring->sharding %d is not a fa_ring_sharding", (int)rg.sharding);
    if (rg.pieces < 0 || rg.pieces > 1024)
        return ring_fail(FA_ERR_INVALID_ARGUMENT, "ring->pieces %d is not in 0..1024", rg.pieces);
    if (rg.stats && rg.stats->struct_size != sizeof(fa_ring_stats))
        return ring_fail(FA_ERR_STRUCT_SIZE, "stats->struct_size %zu is not %zu", rg.stats->struct_size,
                         sizeof(fa_ring_stats));
    if ((st = check_ring_fields(rc, &a)) != FA_OK) return st;
    /* the call itself is the core's to judge: dtypes, shapes, extents, data, scalars */
    if ((st = fa_forward_check(ctx, local)) != FA_OK) return ring_core_fail(st, ctx);
    const int64_t B = a.q.shape[0], Sl = a.q.shape[1], Hq = a.q.shape[2], D = a.q.shape[3];
    const int64_t Hk = a.k.shape[2], Dv = a.v.shape[3];
    if (a.k.shape[1] != Sl)
        return ring_fail(FA_ERR_SHAPE_MISMATCH, "k has %lld rows and q %lld: a rank holds one shard of the sequence",
                         (long long)a.k.shape[1], (long long)Sl);
    if (rg.sharding == FA_RING_ZIGZAG && Sl % 2)
        return ring_fail(FA_ERR_INVALID_DIM, "zig-zag sharding needs an even shard length, not %lld", (long long)Sl);
    /* buffer sizes: the f32 accumulators of the widest tensors must fit */
    int64_t n = 16;
    if (!mul_ok(&n, B) || !mul_ok(&n, Sl) || !mul_ok(&n, Hq > Hk ? Hq : Hk) || !mul_ok(&n, D + Dv))
        return ring_fail(FA_ERR_OVERFLOW, "the shard's buffers do not fit in 64 bits");
    rc->ctx = ctx;
    rc->a = a;
    rc->pieces = rg.pieces ? rg.pieces : 4;
    rc->stats = rg.stats;
    rc->plan.sharding = rg.sharding;
    rc->plan.pieces = rc->pieces;
    rc->B = B, rc->Sl = Sl, rc->Hq = Hq, rc->Hk = Hk, rc->D = D, rc->Dv = Dv;
    rc->dt = a.q.dtype;
    rc->es = (int64_t)fa_dtype_size(a.q.dtype);
    return FA_OK;
}

/* The opening of every ring call: a clean error, and this rank's place in the
 * communicator (the one check that cannot be agreed on: a null communicator). */
fa_status ring_begin(ring_call *rc, MPI_Comm comm, const char *driver)
{
    ring_clear_error();
    memset(rc, 0, sizeof *rc);
    rc->driver = driver;
    if (comm == MPI_COMM_NULL) return ring_fail(FA_ERR_INVALID_ARGUMENT, "the communicator is MPI_COMM_NULL");
    MPI_Comm_size(comm, &rc->P);
    MPI_Comm_rank(comm, &rc->rank);
    const fa_ring_plan init = FA_RING_PLAN_INIT;
    rc->plan = init;
    rc->plan.nranks = rc->P;
    rc->plan.rank = rc->rank;
    rc->plan.call = &rc->a;
    return FA_OK;
}

/* The verdict's words: the lowest failing rank's status (this rank's own message is
 * already recorded), or the field two ranks disagree on. */
static fa_status verdict_fail(const ring_call *rc, const int64_t *all, fa_status st, int who, int field)
{
    if (field < 0) return who == rc->rank ? st : ring_fail(st, "rank %d refused its arguments: %s", who,
                                                           fa_status_string(st));
    return ring_fail(st, "ranks 0 and %d disagree on %s (%lld vs %lld)", who, fa_ring_agreement_name(field),
                     (long long)all[field], (long long)all[who * FA_RING_AGREE_FIELDS + field]);
}

/* Pass 2: every rank derives the same verdict from everybody's descriptor (the core's
 * ring planner reads them), then the core judges the ring as a whole. */
fa_status ring_agree(ring_call *rc, MPI_Comm comm, fa_status local_st, int64_t grads)
{
    int64_t desc[FA_RING_AGREE_FIELDS];
    fa_ring_describe(&rc->plan, local_st, grads, desc);
    int64_t *all = malloc(sizeof(int64_t) * FA_RING_AGREE_FIELDS * (size_t)rc->P);
    int64_t *S = malloc(sizeof(int64_t) * (size_t)rc->P);
    int bad = !all || !S;
    /* a rank without memory for the agreement still agrees: it reports OOM */
    int bad_any = 0;
    MPI_Allreduce(&bad, &bad_any, 1, MPI_INT, MPI_MAX, comm);
    if (bad_any) {
        free(all), free(S);
        return ring_fail(FA_ERR_OUT_OF_MEMORY, "a rank could not allocate the agreement's few bytes");
    }
    MPI_Allgather(desc, FA_RING_AGREE_FIELDS, MPI_INT64_T, all, FA_RING_AGREE_FIELDS, MPI_INT64_T, comm);
    int who = -1, field = -1;
    fa_status st = fa_ring_verdict(rc->P, all, &who, &field);
    if (st != FA_OK) st = verdict_fail(rc, all, st, who, field);
    if (st == FA_OK) {
        for (int x = 0; x < rc->P; x++) {
            S[x] = all[x * FA_RING_AGREE_FIELDS + FA_RING_AGREE_S_LOCAL];
            if (S[x] > rc->Smax) rc->Smax = S[x];
        }
        rc->plan.lengths = S;
        if ((st = fa_ring_check(rc->ctx, &rc->plan)) != FA_OK) ring_core_fail(st, rc->ctx);
    }
    free(all);
    if (st != FA_OK) {
        free(S);
        rc->plan.lengths = NULL;
        return st;
    }
    rc->S = S;
    return FA_OK;
}

/* Agrees on a flag every rank computed itself (1 = failed). */
int ring_any(int flag, MPI_Comm comm)
{
    int any = 0;
    MPI_Allreduce(&flag, &any, 1, MPI_INT, MPI_MAX, comm);
    return any;
}

/* Pass 4: the first failing rank's status, on every rank (two collectives and
 * no allocation, so it cannot itself fail on one rank only). */
fa_status ring_agree_end(ring_call *rc)
{
    int key = rc->st != FA_OK ? rc->rank : rc->P, first = rc->P, status = (int)rc->st;
    MPI_Allreduce(&key, &first, 1, MPI_INT, MPI_MIN, rc->comm);
    if (first == rc->P) return FA_OK;
    MPI_Bcast(&status, 1, MPI_INT, first, rc->comm);
    if (first == rc->rank) return ring_fail((fa_status)status, "%s", rc->msg);
    return ring_fail((fa_status)status, "rank %d failed inside the ring: %s", first, fa_status_string((fa_status)status));
}

/* ------------------------------------------------------------ tensors */

/* Rows [r0, r0 + n) of a tensor along axis `ax`. */
fa_tensor ring_rows(const fa_tensor *t, int ax, int64_t r0, int64_t n)
{
    fa_tensor v = *t;
    if (v.data) v.data = (char *)t->data + r0 * t->stride[ax] * (int64_t)fa_dtype_size(t->dtype);
    v.shape[ax] = n;
    return v;
}

/* Copies a (B, S, H, X) tensor of any strides into a contiguous BSND buffer. */
static void pack(char *dst, const fa_tensor *t, int64_t es)
{
    const int64_t B = t->shape[0], S = t->shape[1], H = t->shape[2], X = t->shape[3];
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++) {
                const char *src = (const char *)t->data + (b * t->stride[0] + s * t->stride[1] + h * t->stride[2]) * es;
                if (t->stride[3] == 1) {
                    memcpy(dst, src, (size_t)(X * es));
                    dst += X * es;
                } else
                    for (int64_t x = 0; x < X; x++, dst += es) memcpy(dst, src + x * t->stride[3] * es, (size_t)es);
            }
}

/* dst rows [off, off + n) of (B, S, W) += src (B, n, W) (both contiguous). */
static void add_rows(float *dst, int64_t S, int64_t off, const float *src, int64_t n, int64_t B, int64_t W)
{
    for (int64_t b = 0; b < B; b++) {
        float *d = dst + (b * S + off) * W;
        const float *s = src + b * n * W;
        for (int64_t k = 0; k < n * W; k++) d[k] += s[k];
    }
}

/* The k and v views of a travelling buffer holding the shard of S rows. */
static fa_tensor kv_view(const ring_call *rc, void *buf, int64_t S, int which_v, fa_dtype dt, int64_t es)
{
    char *base = buf;
    if (which_v) base += rc->B * S * rc->Hk * rc->D * es;
    return fa_tensor_make(base, dt, FA_LAYOUT_BSND, rc->B, S, rc->Hk, which_v ? rc->Dv : rc->D);
}

static int64_t kv_elems(const ring_call *rc, int64_t S)
{
    return rc->B * S * rc->Hk * (rc->D + rc->Dv);
}

/* The pieces of step s, their kept pairs summed into *kept: the core's ring planner.
 * The agreement checked the ring as a whole, so this cannot fail; if it did, the
 * failure is recorded and the step computes nothing. */
static int step_pieces(ring_call *rc, int s, fa_ring_piece *out, int64_t *kept)
{
    int np = 0;
    *kept = 0;
    const fa_status st = fa_ring_step(rc->ctx, &rc->plan, s, out, 4 * rc->pieces, &np);
    if (st != FA_OK) {
        ring_call_fail(rc, st, s, "fa_ring_step");
        return 0;
    }
    for (int p = 0; p < np; p++) *kept += out[p].kept;
    return np;
}

/* The call of piece pc: the local call's options, pc's placement. */
static fa_forward_args piece_call(const ring_call *rc, const fa_ring_piece *pc)
{
    fa_forward_args c = rc->a;
    c.q_start = pc->q_start;
    c.k_start = pc->k_start;
    c.causal = pc->causal;
    return c;
}

fa_ring_stats *ring_stats_of(ring_call *rc)
{
    return rc->stats ? rc->stats : &rc->local_stats;
}

static void stats_begin(ring_call *rc)
{
    fa_ring_stats *s = ring_stats_of(rc);
    double *sc = s->step_compute_seconds, *sw = s->step_wait_seconds;
    const int64_t cap = s->step_capacity;
    memset(s, 0, sizeof *s);
    s->struct_size = sizeof *s;
    s->step_compute_seconds = sc, s->step_wait_seconds = sw, s->step_capacity = cap;
    s->steps = rc->P;
    for (int64_t k = 0; k < cap; k++) {
        if (sc) sc[k] = 0.0;
        if (sw) sw[k] = 0.0;
    }
}

static void stats_step(ring_call *rc, int s, double compute, double wait)
{
    fa_ring_stats *st = ring_stats_of(rc);
    st->compute_seconds += compute;
    st->wait_seconds += wait;
    if (s < st->step_capacity) {
        if (st->step_compute_seconds) st->step_compute_seconds[s] = compute;
        if (st->step_wait_seconds) st->step_wait_seconds[s] = wait;
    }
}

/* Progresses the step's transfers before a piece, counting what the test reads. */
static double progress(ring_call *rc, xfer *const *xs, int nx)
{
    fa_ring_stats *st = ring_stats_of(rc);
    const double t0 = MPI_Wtime();
    int pending = 0;
    for (int k = 0; k < nx; k++)
        if (xs[k]->n) {
            st->tests++;
            if (!xfer_test(xs[k])) pending = 1;
        }
    if (pending) st->pieces_in_flight++;
    const double dt = MPI_Wtime() - t0;
    st->test_seconds += dt;
    return dt;
}

/* ------------------------------------------------------------- forward */

/* The sinks as one more partial state of every local row: o = 0 and lse = sink_h.
 * Merged with the ring's state it is the sink rule of docs/semantics.md (step 6): the
 * normaliser gains exp(sink_h), and the sink carries no value. o: (B, Sl, Hq, Dv),
 * lse: (B, Hq, Sl), both contiguous f32. */
static void sink_state(const ring_call *rc, float *o, float *lse)
{
    memset(o, 0, sizeof(float) * (size_t)(rc->B * rc->Sl * rc->Hq * rc->Dv));
    for (int64_t b = 0; b < rc->B; b++)
        for (int64_t h = 0; h < rc->Hq; h++)
            for (int64_t i = 0; i < rc->Sl; i++) lse[(b * rc->Hq + h) * rc->Sl + i] = rc->a.sinks[h];
}

/* The forward's buffers: the two travelling k/v shards (each for the longest shard),
 * the f32 accumulators of this rank's rows and one piece's partial (o, lse). */
typedef struct fwd_bufs {
    char *kv[2];
    float *o_acc, *o_part, *lse_acc, *lse_part;
    fa_ring_piece *pcs;
    fa_tensor acc_o, part_o, acc_l, part_l;
} fwd_bufs;

static void fwd_free(fwd_bufs *f)
{
    free(f->kv[0]), free(f->kv[1]), free(f->o_acc), free(f->o_part), free(f->lse_acc), free(f->lse_part);
    free(f->pcs);
}

/* Allocates on every rank and agrees on whether all could (on the caller's comm). */
static fa_status fwd_alloc(ring_call *rc, MPI_Comm comm, fwd_bufs *f)
{
    const int P = rc->P;
    const int64_t B = rc->B, Sl = rc->Sl, Hq = rc->Hq, Dv = rc->Dv;
    const int64_t kv_bytes = kv_elems(rc, rc->Smax) * rc->es, acc_n = B * Sl * Hq * Dv, lse_n = B * Hq * Sl;
    memset(f, 0, sizeof *f);
    f->kv[0] = malloc((size_t)kv_bytes + 64);
    f->kv[1] = P > 1 ? malloc((size_t)kv_bytes + 64) : NULL;
    f->o_acc = malloc(sizeof(float) * (size_t)(acc_n + 1)), f->o_part = malloc(sizeof(float) * (size_t)(acc_n + 1));
    f->lse_acc = malloc(sizeof(float) * (size_t)(lse_n + 1)), f->lse_part = malloc(sizeof(float) * (size_t)(lse_n + 1));
    f->pcs = malloc(sizeof(fa_ring_piece) * (size_t)(4 * rc->pieces));
    const int oom = !f->kv[0] || (P > 1 && !f->kv[1]) || !f->o_acc || !f->o_part || !f->lse_acc || !f->lse_part ||
                    !f->pcs || kv_bytes > RING_CHUNK * RING_MAX_CHUNKS;
    if (ring_any(oom, comm)) {
        fwd_free(f);
        return ring_fail(kv_bytes > RING_CHUNK * RING_MAX_CHUNKS ? FA_ERR_OVERFLOW : FA_ERR_OUT_OF_MEMORY,
                         "a rank could not allocate the ring's buffers");
    }
    /* accumulators: lse -inf and o 0 are "nothing yet", which a merge leaves exact */
    for (int64_t k = 0; k < acc_n; k++) f->o_acc[k] = 0.0f;
    for (int64_t k = 0; k < lse_n; k++) f->lse_acc[k] = -INFINITY;
    f->acc_o = fa_tensor_make(f->o_acc, FA_DTYPE_F32, FA_LAYOUT_BSND, B, Sl, Hq, Dv);
    f->part_o = fa_tensor_make(f->o_part, FA_DTYPE_F32, FA_LAYOUT_BSND, B, Sl, Hq, Dv);
    f->acc_l = fa_tensor_contiguous(f->lse_acc, FA_DTYPE_F32, B, Hq, Sl, 1);
    f->part_l = fa_tensor_contiguous(f->lse_part, FA_DTYPE_F32, B, Hq, Sl, 1);
    return FA_OK;
}

/* Step s: posts the next shard's transfer, computes the pieces against the shard at
 * hand (rank r - s's) and merges each piece's partial into the accumulators. */
static void fwd_step(ring_call *rc, fwd_bufs *f, int s, xfer *x)
{
    const int P = rc->P, src = (rc->rank - s + P) % P, nsrc = (rc->rank - s - 1 + 2 * P) % P;
    const int64_t es = rc->es;
    fa_ring_stats *stats = ring_stats_of(rc);
    char *cur = f->kv[s % 2];
    /* the next shard moves while this one computes: posted before any piece */
    if (s < P - 1) {
        xfer_post(x, 0, f->kv[(s + 1) % 2], kv_elems(rc, rc->S[nsrc]) * es, rc->prev, RING_TAG_KV, rc->comm);
        xfer_post(x, 1, cur, kv_elems(rc, rc->S[src]) * es, rc->next, RING_TAG_KV, rc->comm);
        stats->bytes_sent += kv_elems(rc, rc->S[src]) * es;
    }
    int64_t kept = 0;
    const int np = step_pieces(rc, s, f->pcs, &kept);
    const fa_tensor kt = kv_view(rc, cur, rc->S[src], 0, rc->dt, es), vt = kv_view(rc, cur, rc->S[src], 1, rc->dt, es);
    const double tc = MPI_Wtime();
    /* the hook the tests read: was the next shard already on its way? */
    if (x->n > 0) stats->steps_prefetched++;
    double tested = 0.0;
    xfer *xs[1] = {x};
    for (int p = 0; p < np && rc->st == FA_OK; p++) {
        tested += progress(rc, xs, 1);
        const fa_ring_piece *pc = &f->pcs[p];
        fa_forward_args c = piece_call(rc, pc);
        c.sinks = NULL; /* a partial without them: the sink enters once, after the ring */
        c.q = ring_rows(&rc->a.q, 1, pc->q_row, pc->rows);
        c.k = ring_rows(&kt, 1, pc->k_row, pc->keys);
        c.v = ring_rows(&vt, 1, pc->k_row, pc->keys);
        c.o = ring_rows(&f->part_o, 1, pc->q_row, pc->rows);
        c.lse = ring_rows(&f->part_l, 2, pc->q_row, pc->rows);
        fa_status st = s == ring_fault_step ? FA_ERR_OUT_OF_MEMORY : fa_forward(rc->ctx, &c);
        stats->core_calls++;
        if (st != FA_OK) {
            ring_call_fail(rc, st, s, "fa_forward");
            break;
        }
        fa_tensor ov[2] = {ring_rows(&f->acc_o, 1, pc->q_row, pc->rows), c.o};
        fa_tensor lv[2] = {ring_rows(&f->acc_l, 2, pc->q_row, pc->rows), c.lse};
        st = fa_merge_states(rc->ctx, 2, ov, lv, &ov[0], &lv[0]);
        if (st != FA_OK) ring_call_fail(rc, st, s, "fa_merge_states");
    }
    stats->kept_pairs += kept;
    stats->steps_computed += np > 0;
    const double tw = MPI_Wtime();
    xfer_wait(x);
    stats_step(rc, s, tw - tc - tested, MPI_Wtime() - tw);
}

/* Pass 4: the ring's statuses agreed, then o (and lse) written by one exact merge,
 * which rounds o once to its dtype; with sinks, their state is its second part. */
static fa_status fwd_write(ring_call *rc, fwd_bufs *f)
{
    fa_status st = ring_agree_end(rc);
    if (st != FA_OK) return st;
    const fa_tensor ov[2] = {f->acc_o, f->part_o}, lv[2] = {f->acc_l, f->part_l};
    if (rc->a.sinks) sink_state(rc, f->o_part, f->lse_part);
    fa_tensor lse_out = rc->a.lse;
    st = fa_merge_states(rc->ctx, rc->a.sinks ? 2 : 1, ov, lv, &rc->a.o, &lse_out);
    if (st != FA_OK) ring_fail(st, "writing o: %s", fa_context_error(rc->ctx));
    return st;
}

fa_status fa_ring_forward(fa_context *ctx, MPI_Comm comm, const fa_ring_args *ring, const fa_forward_args *local)
{
    const double t0 = MPI_Wtime();
    ring_call rc;
    if (ring_begin(&rc, comm, "ring attention") != FA_OK) return FA_ERR_INVALID_ARGUMENT;
    fa_status st = ring_check_forward(&rc, ctx, ring, local);
    if ((st = ring_agree(&rc, comm, st, 0)) != FA_OK) return st;
    fwd_bufs f;
    if ((st = fwd_alloc(&rc, comm, &f)) != FA_OK) {
        free(rc.S);
        return st;
    }
    MPI_Comm_dup(comm, &rc.comm); /* our messages never meet the caller's */
    rc.prev = (rc.rank + rc.P - 1) % rc.P;
    rc.next = (rc.rank + 1) % rc.P;
    stats_begin(&rc);
    pack(f.kv[0], &rc.a.k, rc.es);
    pack(f.kv[0] + rc.B * rc.Sl * rc.Hk * rc.D * rc.es, &rc.a.v, rc.es);
    xfer x = {.n = 0};
    for (int s = 0; s < rc.P; s++) fwd_step(&rc, &f, s, &x);
    st = fwd_write(&rc, &f);
    MPI_Comm_free(&rc.comm);
    fwd_free(&f);
    free(rc.S);
    ring_stats_of(&rc)->total_seconds = MPI_Wtime() - t0;
    return st;
}

/* ------------------------------------------------------------ backward */

fa_status ring_check_backward(ring_call *rc, fa_context *ctx, const fa_ring_args *ring,
                                const fa_backward_args *local, int64_t *grads)
{
    *grads = 0;
    if (!local) return ring_fail(FA_ERR_NULL_POINTER, "the backward args are NULL");
    fa_backward_args g = FA_BACKWARD_ARGS_INIT;
    fa_status st = fa_struct_read(ctx, "args", local, &g, sizeof g, sizeof(size_t));
    if (st != FA_OK) return ring_core_fail(st, ctx);
    if (!g.fwd) return ring_fail(FA_ERR_NULL_POINTER, "args->fwd is NULL: the backward needs the forward's arguments");
    if ((st = ring_check_forward(rc, ctx, ring, g.fwd)) != FA_OK) return st;
    if (g.dsinks && rc->Hq > INT_MAX) /* MPI counts are ints */
        return ring_fail(FA_ERR_OVERFLOW, "%lld heads of dsinks do not fit an MPI count", (long long)rc->Hq);
    /* lse, o, do_ and the gradients: the core's backward checks (the global lse of
     * the local rows is the one the ring needs) */
    if ((st = fa_backward_check(ctx, local)) != FA_OK) return ring_core_fail(st, ctx);
    rc->g = g;
    rc->g.struct_size = sizeof g;
    rc->g.fwd = &rc->a;
    *grads = (g.dk.data ? 1 : 0) | (g.dv.data ? 2 : 0) | (g.dsinks ? 4 : 0); /* 4: a collective at the end */
    return FA_OK;
}

static float *aligned_floats(int64_t n)
{
    return aligned_alloc(64, ((size_t)n * sizeof(float) + 64) / 64 * 64);
}

/* Writes an f32 (B, S, H, X) buffer into `out` (f32 or q's dtype): fa_merge_states
 * of one part with lse 0 is an exact copy rounded once to out's dtype. */
static fa_status write_f32(fa_context *ctx, float *buf, int64_t B, int64_t S, int64_t H, int64_t X, const float *zeros,
                           const fa_tensor *out)
{
    if (!out->data) return FA_OK;
    const fa_tensor src = fa_tensor_make(buf, FA_DTYPE_F32, FA_LAYOUT_BSND, B, S, H, X);
    const fa_tensor z = fa_tensor_contiguous((void *)zeros, FA_DTYPE_F32, B, H, S, 1);
    fa_tensor dst = *out, none = {0};
    return fa_merge_states(ctx, 1, &src, &z, &dst, &none);
}

/* The backward's buffers: the travelling k/v shards and dK/dV accumulators, a
 * step's dK/dV terms (tmp), the own shard's second half (own, with its pieces in
 * late), the pieces' f32 gradients and what they sum into. */
typedef struct bwd_bufs {
    int want_dq, travel, defer, want_dsinks;
    char *kv[2];
    float *acc[2], *tmp, *own;
    float *dq_acc, *dq_piece, *dkv_piece, *zeros;
    fa_ring_piece *pcs, *late;
    int nlate;
    float *dsink_piece;  /* (Hq) one piece's dsinks, or NULL: not wanted */
    double *dsink_acc;   /* (Hq) this rank's sum of them, then (P x Hq) every rank's */
} bwd_bufs;

static void bwd_free(bwd_bufs *b)
{
    free(b->kv[0]), free(b->kv[1]), free(b->acc[0]), free(b->acc[1]), free(b->tmp), free(b->dkv_piece);
    free(b->dq_acc), free(b->dq_piece), free(b->zeros), free(b->pcs), free(b->own), free(b->late);
    free(b->dsink_acc), free(b->dsink_piece);
}

/* Allocates on every rank and agrees on whether all could (on the caller's comm). */
static fa_status bwd_alloc(ring_call *rc, MPI_Comm comm, int64_t grads, bwd_bufs *b)
{
    const int P = rc->P;
    const int64_t B = rc->B, Sl = rc->Sl, Hq = rc->Hq, D = rc->D;
    const int64_t kv_bytes = kv_elems(rc, rc->Smax) * rc->es, acc_n = kv_elems(rc, rc->Smax), dq_n = B * Sl * Hq * D;
    memset(b, 0, sizeof *b);
    b->travel = (grads & 3) != 0; /* dk/dv accumulators travel only when wanted */
    b->want_dq = rc->g.dq.data != NULL;
    b->defer = b->travel && P > 1; /* the own shard's second half, computed while its accumulators come home */
    b->want_dsinks = rc->g.dsinks != NULL;
    b->kv[0] = malloc((size_t)kv_bytes + 64);
    b->kv[1] = P > 1 ? malloc((size_t)kv_bytes + 64) : NULL;
    for (int k = 0; k < 2 && b->travel; k++)
        b->acc[k] = k == 0 || P > 1 ? malloc(sizeof(float) * (size_t)(acc_n + 1)) : NULL;
    b->tmp = b->travel ? malloc(sizeof(float) * (size_t)(acc_n + 1)) : NULL;
    b->own = b->defer ? calloc((size_t)(kv_elems(rc, Sl) + 1), sizeof(float)) : NULL;
    b->late = malloc(sizeof(fa_ring_piece) * (size_t)(4 * rc->pieces));
    /* 64-byte aligned: the core's backward then accumulates dq in it directly */
    b->dkv_piece = b->travel ? aligned_floats(acc_n) : NULL;
    b->dq_acc = b->want_dq ? calloc((size_t)(dq_n + 1), sizeof(float)) : NULL;
    b->dq_piece = b->want_dq ? aligned_floats(dq_n) : NULL;
    b->zeros = calloc((size_t)(B * Hq * Sl + 1), sizeof(float));
    b->pcs = malloc(sizeof(fa_ring_piece) * (size_t)(4 * rc->pieces));
    b->dsink_acc = b->want_dsinks ? calloc((size_t)(Hq * (P + 1)), sizeof(double)) : NULL;
    b->dsink_piece = b->want_dsinks ? malloc(sizeof(float) * (size_t)Hq) : NULL;
    const int too_big = acc_n * 4 > RING_CHUNK * RING_MAX_CHUNKS;
    const int oom = !b->kv[0] || (P > 1 && !b->kv[1]) ||
                    (b->travel && (!b->acc[0] || (P > 1 && !b->acc[1]) || !b->tmp || !b->dkv_piece)) ||
                    (b->want_dq && (!b->dq_acc || !b->dq_piece)) || !b->zeros || !b->pcs || !b->late ||
                    (b->defer && !b->own) || (b->want_dsinks && (!b->dsink_acc || !b->dsink_piece)) || too_big;
    if (!ring_any(oom, comm)) return FA_OK;
    bwd_free(b);
    return ring_fail(too_big ? FA_ERR_OVERFLOW : FA_ERR_OUT_OF_MEMORY, "a rank could not allocate the ring's buffers");
}

/* Runs pieces [from, to) of a step against the keys kt, vt (a shard of Ss rows):
 * dq adds into dq_acc, dk/dv into `into` (laid out (B, Ss, Hk, D) then
 * (B, Ss, Hk, Dv)). Returns the seconds spent progressing transfers. */
static double bwd_pieces(ring_call *rc, const fa_ring_piece *pcs, int from, int to, const fa_tensor *kt,
                         const fa_tensor *vt, int64_t Ss, float *into, const bwd_bufs *sc, xfer *const *xs, int step)
{
    const int64_t B = rc->B, Sl = rc->Sl, Hq = rc->Hq, Hk = rc->Hk, D = rc->D, Dv = rc->Dv;
    double tested = 0.0;
    for (int p = from; p < to && rc->st == FA_OK; p++) {
        tested += progress(rc, xs, 3);
        const fa_ring_piece *pc = &pcs[p];
        const int64_t row = pc->q_row, n = pc->rows, koff = pc->k_row, klen = pc->keys;
        fa_forward_args c = piece_call(rc, pc);
        c.q = ring_rows(&rc->a.q, 1, row, n);
        c.k = ring_rows(kt, 1, koff, klen);
        c.v = ring_rows(vt, 1, koff, klen);
        c.o = ring_rows(&rc->a.o, 1, row, n); /* the global o and lse of these rows */
        c.lse = ring_rows(&rc->a.lse, 2, row, n);
        fa_backward_args g = FA_BACKWARD_ARGS_INIT;
        g.fwd = &c;
        g.do_ = ring_rows(&rc->g.do_, 1, row, n);
        /* the sink term of each local row once: in the diagonal pieces of step 0 */
        const int sink_rows = sc->dsink_piece && pc->diagonal;
        if (sink_rows) g.dsinks = sc->dsink_piece;
        /* the pieces' gradients land in f32 scratch laid out like the shard */
        if (sc->want_dq) g.dq = fa_tensor_make(sc->dq_piece, FA_DTYPE_F32, FA_LAYOUT_BSND, B, n, Hq, D);
        if (sc->travel) {
            g.dk = fa_tensor_make(sc->dkv_piece, FA_DTYPE_F32, FA_LAYOUT_BSND, B, klen, Hk, D);
            g.dv = fa_tensor_make(sc->dkv_piece + B * klen * Hk * D, FA_DTYPE_F32, FA_LAYOUT_BSND, B, klen, Hk, Dv);
        }
        const fa_status st = step == ring_fault_step ? FA_ERR_OUT_OF_MEMORY : fa_backward(rc->ctx, &g);
        ring_stats_of(rc)->core_calls++;
        if (st != FA_OK) {
            ring_call_fail(rc, st, step, "fa_backward");
            break;
        }
        if (sc->want_dq) add_rows(sc->dq_acc, Sl, row, sc->dq_piece, n, B, Hq * D);
        for (int64_t h = 0; sink_rows && h < Hq; h++) sc->dsink_acc[h] += sc->dsink_piece[h];
        if (sc->travel) {
            add_rows(into, Ss, koff, sc->dkv_piece, klen, B, Hk * D);
            add_rows(into + B * Ss * Hk * D, Ss, koff, sc->dkv_piece + B * klen * Hk * D, klen, B, Hk * Dv);
        }
    }
    return tested;
}

/* Step s's dK/dV terms (tmp) into the visiting shard's accumulator, which came from
 * the rank before (or starts here at step 0), and on to the next rank. Returns the
 * seconds spent waiting; *compute gains the adding. */
static double bwd_pass_acc(ring_call *rc, bwd_bufs *b, int s, int64_t nk, xfer *xin, xfer *xout, double *compute)
{
    float *a_cur = b->acc[s % 2];
    const double tw = MPI_Wtime();
    xfer_wait(xin); /* exposed: this step's accumulator had to be here */
    const double ta = MPI_Wtime();
    double wait = ta - tw;
    if (s == 0) memcpy(a_cur, b->tmp, sizeof(float) * (size_t)nk);
    else
        for (int64_t k = 0; k < nk; k++) a_cur[k] += b->tmp[k];
    const double tb = MPI_Wtime();
    *compute += tb - ta;
    xfer_wait(xout); /* last step's send, before its buffer is received into */
    if (rc->P > 1) {
        xfer_post(xout, 1, a_cur, nk * 4, rc->next, RING_TAG_ACC, rc->comm);
        ring_stats_of(rc)->bytes_sent += nk * 4;
    }
    return wait + MPI_Wtime() - tb;
}

/* Step s of the backward ring: the k/v transfers and the accumulator's arrival
 * posted, the step's pieces run (the own step's second half deferred), the
 * accumulator passed on. xs: the k/v, incoming and outgoing accumulator transfers. */
static void bwd_step(ring_call *rc, bwd_bufs *b, int s, xfer *const *xs)
{
    const int P = rc->P, src = (rc->rank - s + P) % P, nsrc = (rc->rank - s - 1 + 2 * P) % P;
    const int64_t Ss = rc->S[src], nk = kv_elems(rc, Ss), es = rc->es;
    fa_ring_stats *stats = ring_stats_of(rc);
    xfer *xkv = xs[0], *xin = xs[1], *xout = xs[2];
    char *cur = b->kv[s % 2];
    if (s < P - 1) {
        xfer_post(xkv, 0, b->kv[(s + 1) % 2], kv_elems(rc, rc->S[nsrc]) * es, rc->prev, RING_TAG_KV, rc->comm);
        xfer_post(xkv, 1, cur, nk * es, rc->next, RING_TAG_KV, rc->comm);
        stats->bytes_sent += nk * es;
    }
    /* this step's accumulator comes from the rank that held the shard last step */
    if (b->travel && s > 0) xfer_post(xin, 0, b->acc[s % 2], nk * 4, rc->prev, RING_TAG_ACC, rc->comm);
    int64_t kept = 0;
    const int np = step_pieces(rc, s, b->pcs, &kept);
    const fa_tensor kt = kv_view(rc, cur, Ss, 0, rc->dt, es), vt = kv_view(rc, cur, Ss, 1, rc->dt, es);
    const double tc = MPI_Wtime();
    if (b->travel) memset(b->tmp, 0, sizeof(float) * (size_t)nk);
    if (xkv->n > 0) stats->steps_prefetched++;
    /* the own shard's step is split by kept pairs: its first half now (it hides the
     * first transfer), the rest after the ring (it hides the accumulators' way home) */
    int run = np;
    if (s == 0 && b->defer) {
        run = fa_ring_split(b->pcs, np);
        for (int p = run; p < np; p++) b->late[b->nlate++] = b->pcs[p];
    }
    const double tested = bwd_pieces(rc, b->pcs, 0, run, &kt, &vt, Ss, b->tmp, b, xs, s);
    stats->kept_pairs += kept;
    stats->steps_computed += np > 0;
    double compute = MPI_Wtime() - tc - tested, wait = 0.0;
    if (b->travel) wait += bwd_pass_acc(rc, b, s, nk, xin, xout, &compute);
    const double tk = MPI_Wtime();
    xfer_wait(xkv);
    wait += MPI_Wtime() - tk;
    stats_step(rc, s, compute, wait);
}

/* After the ring: the own shard's accumulators come home while the own shard's
 * second half computes (on the caller's k and v: the packed copy was received into
 * long ago). Returns the accumulators of this rank's keys (NULL: none travel). */
static float *bwd_own_rest(ring_call *rc, bwd_bufs *b, xfer *const *xs)
{
    if (!b->defer) return b->travel ? b->acc[0] : NULL;
    fa_ring_stats *stats = ring_stats_of(rc);
    float *mine = b->acc[rc->P % 2];
    const int64_t n = kv_elems(rc, rc->Sl);
    xfer_post(xs[1], 0, mine, n * 4, rc->prev, RING_TAG_ACC, rc->comm);
    const double tc = MPI_Wtime();
    const double tested = bwd_pieces(rc, b->late, 0, b->nlate, &rc->a.k, &rc->a.v, rc->Sl, b->own, b, xs, 0);
    const double tw = MPI_Wtime();
    xfer_wait(xs[1]);
    xfer_wait(xs[2]);
    const double wait = MPI_Wtime() - tw;
    for (int64_t k = 0; k < n; k++) mine[k] += b->own[k];
    stats->compute_seconds += MPI_Wtime() - tc - tested - wait;
    stats->wait_seconds += wait;
    if (stats->step_capacity > 0 && stats->step_compute_seconds)
        stats->step_compute_seconds[0] += MPI_Wtime() - tc - tested - wait;
    if (stats->step_capacity > 0 && stats->step_wait_seconds) stats->step_wait_seconds[0] += wait;
    return mine;
}

/* Pass 4: the ring's statuses agreed; every rank's dsinks partials gathered while
 * that status is the one all ranks share; then the gradients written. */
static fa_status bwd_write(ring_call *rc, bwd_bufs *b, const float *mine)
{
    const int64_t B = rc->B, Sl = rc->Sl, Hq = rc->Hq, Hk = rc->Hk, D = rc->D, Dv = rc->Dv;
    fa_context *ctx = rc->ctx;
    fa_status st = ring_agree_end(rc);
    double *dsink_all = b->dsink_acc ? b->dsink_acc + Hq : NULL;
    if (st == FA_OK && b->want_dsinks)
        MPI_Allgather(b->dsink_acc, (int)Hq, MPI_DOUBLE, dsink_all, (int)Hq, MPI_DOUBLE, rc->comm);
    if (st == FA_OK && b->want_dq) st = write_f32(ctx, b->dq_acc, B, Sl, Hq, D, b->zeros, &rc->g.dq);
    if (st == FA_OK && b->travel) st = write_f32(ctx, (float *)mine, B, Sl, Hk, D, b->zeros, &rc->g.dk);
    if (st == FA_OK && b->travel)
        st = write_f32(ctx, (float *)mine + B * Sl * Hk * D, B, Sl, Hk, Dv, b->zeros, &rc->g.dv);
    for (int64_t h = 0; st == FA_OK && b->want_dsinks && h < Hq; h++) { /* in rank order: the same bits on every rank */
        double sum = 0.0;
        for (int x = 0; x < rc->P; x++) sum += dsink_all[x * Hq + h];
        rc->g.dsinks[h] = (float)sum;
    }
    if (st != FA_OK && rc->st == FA_OK && fa_ring_error()[0] == '\0')
        ring_fail(st, "writing the gradients: %s", fa_context_error(ctx));
    return st;
}

fa_status fa_ring_backward(fa_context *ctx, MPI_Comm comm, const fa_ring_args *ring, const fa_backward_args *local)
{
    const double t0 = MPI_Wtime();
    ring_call rc;
    if (ring_begin(&rc, comm, "ring attention") != FA_OK) return FA_ERR_INVALID_ARGUMENT;
    int64_t grads = 0;
    fa_status st = ring_check_backward(&rc, ctx, ring, local, &grads);
    if ((st = ring_agree(&rc, comm, st, grads)) != FA_OK) return st;
    bwd_bufs b;
    if ((st = bwd_alloc(&rc, comm, grads, &b)) != FA_OK) {
        free(rc.S);
        return st;
    }
    MPI_Comm_dup(comm, &rc.comm);
    rc.prev = (rc.rank + rc.P - 1) % rc.P;
    rc.next = (rc.rank + 1) % rc.P;
    stats_begin(&rc);
    pack(b.kv[0], &rc.a.k, rc.es);
    pack(b.kv[0] + rc.B * rc.Sl * rc.Hk * rc.D * rc.es, &rc.a.v, rc.es);
    xfer xkv = {.n = 0}, xin = {.n = 0}, xout = {.n = 0};
    xfer *xs[3] = {&xkv, &xin, &xout};
    for (int s = 0; s < rc.P; s++) bwd_step(&rc, &b, s, xs);
    const float *mine = bwd_own_rest(&rc, &b, xs);
    st = bwd_write(&rc, &b, mine);
    MPI_Comm_free(&rc.comm);
    bwd_free(&b);
    free(rc.S);
    ring_stats_of(&rc)->total_seconds = MPI_Wtime() - t0;
    return st;
}
