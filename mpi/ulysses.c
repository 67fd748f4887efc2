/*
 * ulysses.c: Ulysses attention over MPI (include/flashattn_mpi.h, docs/mpi.md): an
 * all-to-all turns this rank's rows of every head into the whole sequence of its
 * group of heads, one core call runs there, and an all-to-all brings the outputs
 * back to the rank's rows. The checks and the agreement are the ring's (ring.c);
 * where each rank's rows sit in the sequence is the core's ring planner's.
 *
 * Legend: P ranks, r this rank, S_y rows of rank y, N = sum S_y, H heads of a
 * tensor, h = H / P the heads of one group (rank x holds heads [x h, x h + h)), X
 * the last dim. Wire format: rank y's block for rank x is (B, S_y, h, X) contiguous.
 * lse (B, H, S, 1) is moved as its (B, S, H, 1) view, so one exchange moves both.
 */
#include "ring_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

enum { ULYSSES_AGREE = 8 }; /* in the agreed value: a Ulysses call, which a ring call must not meet */

/* t's heads [h0, h0 + nh). */
static fa_tensor heads_of(const fa_tensor *t, int64_t h0, int64_t nh)
{
    fa_tensor v = *t;
    if (v.data) v.data = (char *)t->data + h0 * t->stride[2] * (int64_t)fa_dtype_size(t->dtype);
    v.shape[2] = nh;
    return v;
}

/* lse (B, H, S, 1) as (B, S, H, 1): the same elements, axes 1 and 2 swapped. */
static fa_tensor seq_major(const fa_tensor *lse)
{
    fa_tensor v = *lse;
    v.shape[1] = lse->shape[2], v.shape[2] = lse->shape[1];
    v.stride[1] = lse->stride[2], v.stride[2] = lse->stride[1];
    return v;
}

/* dst <- src, two (B, S, H, X) views of one dtype with any strides. */
static void copy_view(const fa_tensor *dst, const fa_tensor *src)
{
    const int64_t es = (int64_t)fa_dtype_size(src->dtype), X = src->shape[3];
    for (int64_t b = 0; b < src->shape[0]; b++)
        for (int64_t s = 0; s < src->shape[1]; s++)
            for (int64_t h = 0; h < src->shape[2]; h++) {
                const char *f = (const char *)src->data + (b * src->stride[0] + s * src->stride[1] + h * src->stride[2]) * es;
                char *t = (char *)dst->data + (b * dst->stride[0] + s * dst->stride[1] + h * dst->stride[2]) * es;
                if (src->stride[3] == 1 && dst->stride[3] == 1) memcpy(t, f, (size_t)(X * es));
                else
                    for (int64_t x = 0; x < X; x++) memcpy(t + x * dst->stride[3] * es, f + x * src->stride[3] * es, (size_t)es);
            }
}

/* One Ulysses call's exchanges: every rank's segments and the all-to-all buffers. */
typedef struct ulysses {
    ring_call rc;
    int64_t N, hq, hk;      /* the sequence, this rank's query and kv heads */
    fa_ring_segment (*seg)[2];
    int *nseg;
    int *scount, *sdispl, *rcount, *rdispl;
    char *send, *recv;      /* each `wire` bytes */
    int64_t wire;
} ulysses;

/* The exchanges' buffers, for the widest tensor of B rows, X = max(D, Dv), in f32 or
 * wider, through MPI's int counts; every rank's segments by the core's placement. */
static fa_status ulysses_alloc(ulysses *u, MPI_Comm comm)
{
    ring_call *rc = &u->rc;
    const int P = rc->P;
    int64_t X = rc->D > rc->Dv ? rc->D : rc->Dv, rows = 0;
    for (int y = 0; y < P; y++) rows += rc->S[y];
    u->N = rows;
    u->hq = rc->Hq / P, u->hk = rc->Hk / P;
    /* in double first: a product past int64 is past MPI's counts as well */
    const double wire = (double)rc->B * (double)(rows > rc->Sl * P ? rows : rc->Sl * P) * (double)u->hq *
                        (double)(X > 1 ? X : 1) * 4.0;
    const int too_big = wire > (double)INT_MAX;
    u->wire = too_big ? 0 : (int64_t)wire;
    u->seg = malloc(sizeof *u->seg * (size_t)P);
    u->nseg = malloc(sizeof(int) * (size_t)P);
    u->scount = malloc(sizeof(int) * 4 * (size_t)P);
    u->sdispl = u->scount ? u->scount + P : NULL, u->rcount = u->scount ? u->scount + 2 * P : NULL;
    u->rdispl = u->scount ? u->scount + 3 * P : NULL;
    u->send = malloc((size_t)u->wire + 64), u->recv = malloc((size_t)u->wire + 64);
    int bad = !u->seg || !u->nseg || !u->scount || !u->send || !u->recv;
    for (int y = 0; !bad && y < P; y++)
        bad = fa_ring_placement(rc->ctx, &rc->plan, y, u->seg[y], &u->nseg[y]) != FA_OK;
    if (!ring_any(bad || too_big, comm)) return FA_OK;
    return ring_fail(too_big ? FA_ERR_OVERFLOW : FA_ERR_OUT_OF_MEMORY,
                     too_big ? "an exchange of over 2 GiB on a rank (MPI's int counts)"
                             : "a rank could not allocate the exchanges' buffers");
}

static void ulysses_free(ulysses *u)
{
    free(u->seg), free(u->nseg), free(u->scount), free(u->send), free(u->recv), free(u->rc.S);
}

/* Rank y's block of nh heads, S_y rows, X wide, es bytes: its bytes. */
static int64_t block_bytes(const ulysses *u, int y, int64_t nh, int64_t X, int64_t es)
{
    return u->rc.B * u->rc.S[y] * nh * X * es;
}

static void alltoall(ulysses *u)
{
    MPI_Alltoallv(u->send, u->scount, u->sdispl, MPI_BYTE, u->recv, u->rcount, u->rdispl, MPI_BYTE, u->rc.comm);
}

/* Sequence shards to head groups: t (B, S_r, H, X), this rank's rows of every head,
 * into full (B, N, H / P, X) contiguous, the whole sequence of this rank's heads. */
static void to_heads(ulysses *u, const fa_tensor *t, void *full)
{
    const ring_call *rc = &u->rc;
    const int P = rc->P;
    const int64_t B = rc->B, nh = t->shape[2] / P, X = t->shape[3], es = (int64_t)fa_dtype_size(t->dtype);
    int64_t off = 0;
    for (int x = 0; x < P; x++) { /* block x: heads [x nh, + nh) of all my rows */
        const fa_tensor blk = fa_tensor_make(u->send + off, t->dtype, FA_LAYOUT_BSND, B, rc->Sl, nh, X);
        const fa_tensor mine = heads_of(t, x * nh, nh);
        copy_view(&blk, &mine);
        u->scount[x] = (int)block_bytes(u, rc->rank, nh, X, es), u->sdispl[x] = (int)off;
        off += u->scount[x];
    }
    off = 0;
    for (int y = 0; y < P; y++)
        u->rcount[y] = (int)block_bytes(u, y, nh, X, es), u->rdispl[y] = (int)off, off += u->rcount[y];
    alltoall(u);
    const fa_tensor whole = fa_tensor_make(full, t->dtype, FA_LAYOUT_BSND, B, u->N, nh, X);
    for (int y = 0; y < P; y++) { /* rank y's rows to their positions */
        const fa_tensor blk = fa_tensor_make(u->recv + u->rdispl[y], t->dtype, FA_LAYOUT_BSND, B, rc->S[y], nh, X);
        for (int k = 0; k < u->nseg[y]; k++) {
            const fa_ring_segment *sg = &u->seg[y][k];
            const fa_tensor dst = ring_rows(&whole, 1, sg->pos, sg->len), src = ring_rows(&blk, 1, sg->off, sg->len);
            copy_view(&dst, &src);
        }
    }
}

/* Head groups back to sequence shards: full (B, N, H / P, X) of this rank's heads into
 * t (B, S_r, H, X), this rank's rows of every head. */
static void to_rows(ulysses *u, const void *full, const fa_tensor *t)
{
    const ring_call *rc = &u->rc;
    const int P = rc->P;
    const int64_t B = rc->B, nh = t->shape[2] / P, X = t->shape[3], es = (int64_t)fa_dtype_size(t->dtype);
    const fa_tensor whole = fa_tensor_make((void *)full, t->dtype, FA_LAYOUT_BSND, B, u->N, nh, X);
    int64_t off = 0;
    for (int y = 0; y < P; y++) { /* block y: rank y's rows of my heads */
        const fa_tensor blk = fa_tensor_make(u->send + off, t->dtype, FA_LAYOUT_BSND, B, rc->S[y], nh, X);
        for (int k = 0; k < u->nseg[y]; k++) {
            const fa_ring_segment *sg = &u->seg[y][k];
            const fa_tensor dst = ring_rows(&blk, 1, sg->off, sg->len), src = ring_rows(&whole, 1, sg->pos, sg->len);
            copy_view(&dst, &src);
        }
        u->scount[y] = (int)block_bytes(u, y, nh, X, es), u->sdispl[y] = (int)off;
        off += u->scount[y];
    }
    off = 0;
    for (int x = 0; x < P; x++)
        u->rcount[x] = (int)block_bytes(u, rc->rank, nh, X, es), u->rdispl[x] = (int)off, off += u->rcount[x];
    alltoall(u);
    for (int x = 0; x < P; x++) {
        const fa_tensor blk = fa_tensor_make(u->recv + u->rdispl[x], t->dtype, FA_LAYOUT_BSND, B, rc->Sl, nh, X);
        const fa_tensor dst = heads_of(t, x * nh, nh);
        copy_view(&dst, &blk);
    }
}

/* What Ulysses adds to the ring's checks: heads that split into P groups, and no
 * dropout (the core's dropout counter numbers the heads within a call). */
static fa_status ulysses_check(const ring_call *rc)
{
    if (rc->Hq % rc->P || rc->Hk % rc->P)
        return ring_fail(FA_ERR_INVALID_ARGUMENT,
                         "Ulysses splits the heads across the %d ranks: Hq %lld and Hk %lld must be multiples of %d",
                         rc->P, (long long)rc->Hq, (long long)rc->Hk, rc->P);
    if (rc->a.dropout_p > 0.0f)
        return ring_fail(FA_ERR_UNSUPPORTED, "dropout is not supported by Ulysses attention (the dropout counter "
                                             "numbers the heads within a call); use the ring");
    return FA_OK;
}

/* The whole sequence of this rank's heads: the local call's options on the full
 * buffers q, k, v, o (o's dtype) and lse (B, h, N, 1) f32 stored as (B, N, h). */
static fa_forward_args group_call(const ulysses *u, void *q, void *k, void *v, void *o, float *lse)
{
    const ring_call *rc = &u->rc;
    const int64_t B = rc->B, N = u->N, h = u->hq;
    fa_forward_args c = rc->a;
    c.q = fa_tensor_make(q, rc->dt, FA_LAYOUT_BSND, B, N, h, rc->D);
    c.k = fa_tensor_make(k, rc->dt, FA_LAYOUT_BSND, B, N, u->hk, rc->D);
    c.v = fa_tensor_make(v, rc->dt, FA_LAYOUT_BSND, B, N, u->hk, rc->Dv);
    c.o = fa_tensor_make(o, rc->a.o.dtype, FA_LAYOUT_BSND, B, N, h, rc->Dv);
    const fa_tensor l = fa_tensor_make(lse, FA_DTYPE_F32, FA_LAYOUT_BSND, B, N, h, 1);
    c.lse = rc->a.lse.data ? seq_major(&l) : (fa_tensor){0};
    if (c.alibi_slopes) c.alibi_slopes += rc->rank * h;
    if (c.sinks) c.sinks += rc->rank * h;
    c.q_start = c.k_start = 0;
    return c;
}

/* The full buffers of one call: nbuf of `bytes` each, agreed on by every rank. */
static fa_status full_buffers(ulysses *u, MPI_Comm comm, char **buf, int nbuf, const int64_t *bytes)
{
    int bad = 0;
    for (int k = 0; k < nbuf; k++) bad |= !(buf[k] = malloc((size_t)bytes[k] + 64));
    if (!ring_any(bad, comm)) return FA_OK;
    for (int k = 0; k < nbuf; k++) free(buf[k]), buf[k] = NULL;
    (void)u;
    return ring_fail(FA_ERR_OUT_OF_MEMORY, "a rank could not allocate the whole sequence of its heads");
}

/* Opens a call: the ring's checks and Ulysses', the agreement, the exchanges. */
static fa_status ulysses_begin(ulysses *u, MPI_Comm comm, fa_status st, int64_t grads)
{
    if (st == FA_OK) st = ulysses_check(&u->rc);
    if ((st = ring_agree(&u->rc, comm, st, grads | ULYSSES_AGREE)) != FA_OK) return st;
    if ((st = ulysses_alloc(u, comm)) != FA_OK) {
        ulysses_free(u);
        return st;
    }
    MPI_Comm_dup(comm, &u->rc.comm);
    return FA_OK;
}

static void ulysses_end(ulysses *u, char **buf, int nbuf)
{
    for (int k = 0; k < nbuf; k++) free(buf[k]);
    MPI_Comm_free(&u->rc.comm);
    ulysses_free(u);
}

fa_status fa_ulysses_forward(fa_context *ctx, MPI_Comm comm, const fa_ring_args *ring, const fa_forward_args *local)
{
    ulysses u;
    memset(&u, 0, sizeof u);
    if (ring_begin(&u.rc, comm, "Ulysses attention") != FA_OK) return FA_ERR_INVALID_ARGUMENT;
    fa_status st = ulysses_begin(&u, comm, ring_check_forward(&u.rc, ctx, ring, local), 0);
    if (st != FA_OK) return st;
    ring_call *rc = &u.rc;
    const int64_t B = rc->B, N = u.N, es = rc->es, oes = (int64_t)fa_dtype_size(rc->a.o.dtype);
    const int64_t bytes[5] = {B * N * u.hq * rc->D * es, B * N * u.hk * rc->D * es, B * N * u.hk * rc->Dv * es,
                              B * N * u.hq * rc->Dv * oes, B * N * u.hq * 4};
    char *buf[5] = {0};
    if ((st = full_buffers(&u, comm, buf, 5, bytes)) != FA_OK) {
        ulysses_end(&u, buf, 0);
        return st;
    }
    to_heads(&u, &rc->a.q, buf[0]);
    to_heads(&u, &rc->a.k, buf[1]);
    to_heads(&u, &rc->a.v, buf[2]);
    const fa_forward_args c = group_call(&u, buf[0], buf[1], buf[2], buf[3], (float *)buf[4]);
    st = ring_fault_step == 0 ? FA_ERR_OUT_OF_MEMORY : fa_forward(ctx, &c);
    if (st != FA_OK) ring_call_fail(rc, st, 0, "fa_forward");
    if ((st = ring_agree_end(rc)) == FA_OK) { /* nothing is written before every rank's call succeeded */
        to_rows(&u, buf[3], &rc->a.o);
        if (rc->a.lse.data) {
            const fa_tensor l = seq_major(&rc->a.lse);
            to_rows(&u, buf[4], &l);
        }
    }
    ulysses_end(&u, buf, 5);
    return st;
}

fa_status fa_ulysses_backward(fa_context *ctx, MPI_Comm comm, const fa_ring_args *ring, const fa_backward_args *local)
{
    ulysses u;
    memset(&u, 0, sizeof u);
    if (ring_begin(&u.rc, comm, "Ulysses attention") != FA_OK) return FA_ERR_INVALID_ARGUMENT;
    int64_t grads = 0;
    fa_status st = ring_check_backward(&u.rc, ctx, ring, local, &grads);
    if ((st = ulysses_begin(&u, comm, st, grads)) != FA_OK) return st;
    ring_call *rc = &u.rc;
    const fa_backward_args *g = &rc->g;
    const int64_t B = rc->B, N = u.N, hq = u.hq, hk = u.hk, D = rc->D, Dv = rc->Dv;
    const int64_t es = rc->es, oes = (int64_t)fa_dtype_size(rc->a.o.dtype), des = (int64_t)fa_dtype_size(g->do_.dtype);
    const size_t qs = (size_t)fa_dtype_size(g->dq.data ? g->dq.dtype : FA_DTYPE_F32);
    const size_t ks = (size_t)fa_dtype_size(g->dk.data ? g->dk.dtype : FA_DTYPE_F32);
    const size_t vs = (size_t)fa_dtype_size(g->dv.data ? g->dv.dtype : FA_DTYPE_F32);
    /* q k v o lse dO, then dq dk dv and this group's dsinks */
    const int64_t bytes[10] = {B * N * hq * D * es, B * N * hk * D * es, B * N * hk * Dv * es, B * N * hq * Dv * oes,
                               B * N * hq * 4, B * N * hq * Dv * des, B * N * hq * D * (int64_t)qs,
                               B * N * hk * D * (int64_t)ks, B * N * hk * Dv * (int64_t)vs, hq * 4};
    char *buf[10] = {0};
    if ((st = full_buffers(&u, comm, buf, 10, bytes)) != FA_OK) {
        ulysses_end(&u, buf, 0);
        return st;
    }
    const fa_tensor lse = seq_major(&rc->a.lse);
    to_heads(&u, &rc->a.q, buf[0]);
    to_heads(&u, &rc->a.k, buf[1]);
    to_heads(&u, &rc->a.v, buf[2]);
    to_heads(&u, &rc->a.o, buf[3]);
    to_heads(&u, &lse, buf[4]);
    to_heads(&u, &g->do_, buf[5]);
    fa_forward_args c = group_call(&u, buf[0], buf[1], buf[2], buf[3], (float *)buf[4]);
    fa_backward_args gc = FA_BACKWARD_ARGS_INIT;
    gc.fwd = &c;
    gc.do_ = fa_tensor_make(buf[5], g->do_.dtype, FA_LAYOUT_BSND, B, N, hq, Dv);
    if (g->dq.data) gc.dq = fa_tensor_make(buf[6], g->dq.dtype, FA_LAYOUT_BSND, B, N, hq, D);
    if (g->dk.data) gc.dk = fa_tensor_make(buf[7], g->dk.dtype, FA_LAYOUT_BSND, B, N, hk, D);
    if (g->dv.data) gc.dv = fa_tensor_make(buf[8], g->dv.dtype, FA_LAYOUT_BSND, B, N, hk, Dv);
    if (g->dsinks) gc.dsinks = (float *)buf[9];
    st = ring_fault_step == 0 ? FA_ERR_OUT_OF_MEMORY : fa_backward(ctx, &gc);
    if (st != FA_OK) ring_call_fail(rc, st, 0, "fa_backward");
    if ((st = ring_agree_end(rc)) == FA_OK) {
        if (g->dq.data) to_rows(&u, buf[6], &g->dq);
        if (g->dk.data) to_rows(&u, buf[7], &g->dk);
        if (g->dv.data) to_rows(&u, buf[8], &g->dv);
        /* each head's dsinks from the one rank that holds it, gathered in head order */
        if (g->dsinks) MPI_Allgather(buf[9], (int)hq, MPI_FLOAT, g->dsinks, (int)hq, MPI_FLOAT, rc->comm);
    }
    ulysses_end(&u, buf, 10);
    return st;
}
