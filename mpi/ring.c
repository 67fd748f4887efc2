/*
 * ring.c: ring attention over MPI (include/flashattn_mpi.h, docs/mpi.md).
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

typedef struct ring_call {
    fa_context *ctx;
    int P, rank, prev, next;
    MPI_Comm comm; /* our duplicate of the caller's */
    fa_forward_args a; /* the local forward arguments, struct_size normalised */
    fa_backward_args g; /* the backward's (backward only) */
    fa_ring_sharding sharding;
    int pieces;
    int band_offsets;  /* window or ALiBi: offsets follow the bottom-right rule */
    int causal;        /* either alignment: over the whole sequence both keep j <= i */
    int64_t window_left, window_right; /* as the ranks agree on them (window_side) */
    int64_t B, Hq, Hk, D, Dv, Sl, Smax;
    fa_dtype dt;
    int64_t es;
    int64_t *S;        /* (P) shard lengths */
    ring_layout mine;
    fa_ring_stats *stats, local_stats;
    fa_status st;      /* the first failure inside the ring */
    char msg[400];
} ring_call;

static fa_status call_fail(ring_call *rc, fa_status st, int step, const char *what)
{
    if (rc->st == FA_OK) {
        rc->st = st;
        snprintf(rc->msg, sizeof rc->msg, "rank %d, ring step %d: %s: %s", rc->rank, step, what,
                 fa_context_error(rc->ctx));
    }
    return st;
}

/* The descriptor each rank contributes to the agreement: the shapes and the ring's
 * own settings, then one slot per row of the header's field table (FA_FORWARD_FIELDS):
 * every OPTION by its value, every optional input (ALiBi, sinks; the ring refuses the
 * others) by its presence, so a field added to the table is agreed on here unasked. */
enum { D_STATUS, D_B, D_S, D_HQ, D_HK, D_D, D_DV, D_DTYPE, D_SHARDING, D_PIECES, D_GRADS, D_FIELDS };
#define D_ROW(name, key, ctype, type, role, def, doc) +1
enum { D_COUNT = D_FIELDS FA_FORWARD_FIELDS(D_ROW) };
#undef D_ROW
#define D_ROW(name, key, ctype, type, role, def, doc) #name,
static const char *const desc_name[D_COUNT] = {"status", "B", "S_local", "Hq", "Hk", "D", "Dv", "dtype", "sharding",
                                               "pieces", "gradients", FA_FORWARD_FIELDS(D_ROW)};
#undef D_ROW
/* what a disagreement on a field is: the fields that every rank must share */
static fa_status desc_mismatch(int f)
{
    switch (f) {
    case D_B: case D_HQ: case D_HK: case D_D: case D_DV: return FA_ERR_SHAPE_MISMATCH;
    case D_DTYPE: return FA_ERR_DTYPE;
    case D_S: case D_STATUS: return FA_OK; /* lengths may differ; statuses are read first */
    default: return FA_ERR_INVALID_ARGUMENT;
    }
}

/* A field's slot: an option's bits (zero-extended), an optional input's presence. */
static int64_t field_slot(const fa_forward_args *a, size_t offset, fa_field_type type, fa_field_role role)
{
    const char *at = (const char *)a + offset;
    int64_t v = 0;
    if (role == FA_ROLE_OPTION) {
        uint32_t u32;
        switch (type) {
        case FA_FIELD_F32: case FA_FIELD_I32: case FA_FIELD_U32: memcpy(&u32, at, 4), v = (int64_t)u32; break;
        case FA_FIELD_I64: case FA_FIELD_U64: memcpy(&v, at, 8); break;
        default: break;
        }
    } else if (role == FA_ROLE_INPUT && type == FA_FIELD_PTR) {
        const void *p;
        memcpy(&p, at, sizeof p);
        v = p != NULL;
    } else if (role == FA_ROLE_INPUT && type == FA_FIELD_TENSOR) {
        fa_tensor t;
        memcpy(&t, at, sizeof t);
        v = t.data != NULL;
    }
    return v;
}

/* A window side as the ranks agree on it: a side that reaches past every position
 * the ring can place (FA_POSITION_MAX) bounds nothing, as -1 does, and needs no
 * bottom-right offsets. Whether a side is valid at all is the core's to say. */
static int64_t window_side(int64_t w)
{
    return w < 0 || w >= FA_POSITION_MAX ? -1 : w;
}

/* A failure the core found, reported with the core's own message. */
static fa_status core_fail(fa_status st, fa_context *ctx)
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

/* Pass 1 for the forward's arguments (also run by the backward on its fwd). */
static fa_status check_forward(ring_call *rc, fa_context *ctx, const fa_ring_args *ring,
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
        return core_fail(st, ctx);
    if (rg.sharding != FA_RING_CONTIGUOUS && rg.sharding != FA_RING_ZIGZAG)
        return ring_fail(FA_ERR_INVALID_ARGUMENT, "ring->sharding %d is not a fa_ring_sharding", (int)rg.sharding);
    if (rg.pieces < 0 || rg.pieces > 1024)
        return ring_fail(FA_ERR_INVALID_ARGUMENT, "ring->pieces %d is not in 0..1024", rg.pieces);
    if (rg.stats && rg.stats->struct_size != sizeof(fa_ring_stats))
        return ring_fail(FA_ERR_STRUCT_SIZE, "stats->struct_size %zu is not %zu", rg.stats->struct_size,
                         sizeof(fa_ring_stats));
    /* what has no meaning for a sequence the ring shards */
    if (a.bias.data) return ring_fail(FA_ERR_UNSUPPORTED, "bias tensors are not supported by ring attention");
    if (a.mask.data) return ring_fail(FA_ERR_UNSUPPORTED, "mask tensors are not supported by ring attention");
    if (a.cu_seqlens_q || a.cu_seqlens_k)
        return ring_fail(FA_ERR_UNSUPPORTED, "variable-length (cu_seqlens) calls are not supported by ring attention");
    if (a.kv_cache) return ring_fail(FA_ERR_UNSUPPORTED, "KV caches are not supported by ring attention");
    if (a.dropout_mask.data)
        return ring_fail(FA_ERR_UNSUPPORTED, "dropout_mask is not supported by ring attention");
    if (a.q_start || a.k_start)
        return ring_fail(FA_ERR_UNSUPPORTED, "q_start/k_start are set by the ring from the sharding; pass 0");
    /* the call itself is the core's to judge: dtypes, shapes, extents, data, scalars */
    if ((st = fa_forward_check(ctx, local)) != FA_OK) return core_fail(st, ctx);
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
    rc->sharding = rg.sharding;
    rc->pieces = rg.pieces ? rg.pieces : 4;
    rc->stats = rg.stats;
    rc->causal = a.causal != FA_CAUSAL_NONE;
    rc->window_left = window_side(a.window_left);
    rc->window_right = window_side(a.window_right);
    rc->band_offsets = rc->window_left >= 0 || rc->window_right >= 0 || a.alibi_slopes != NULL;
    rc->B = B, rc->Sl = Sl, rc->Hq = Hq, rc->Hk = Hk, rc->D = D, rc->Dv = Dv;
    rc->dt = a.q.dtype;
    rc->es = (int64_t)fa_dtype_size(a.q.dtype);
    return FA_OK;
}

static void fill_desc(const ring_call *rc, fa_status st, int64_t grads, int64_t *d)
{
    memset(d, 0, sizeof(int64_t) * D_COUNT);
    d[D_STATUS] = st;
    if (st != FA_OK) return;
    d[D_B] = rc->B, d[D_S] = rc->Sl, d[D_HQ] = rc->Hq, d[D_HK] = rc->Hk, d[D_D] = rc->D, d[D_DV] = rc->Dv;
    d[D_DTYPE] = rc->dt;
    d[D_SHARDING] = rc->sharding;
    d[D_PIECES] = rc->pieces;
    d[D_GRADS] = grads;
    /* the call as the ranks agree on it: over one sequence both causal alignments keep
     * j <= i, and a window side past every position is unbounded (window_side) */
    fa_forward_args a = rc->a;
    a.causal = rc->causal ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
    a.window_left = rc->window_left, a.window_right = rc->window_right;
    int f = D_FIELDS;
#define D_ROW(name, key, ctype, type, role, def, doc) \
    d[f++] = field_slot(&a, offsetof(fa_forward_args, name), FA_FIELD_##type, FA_ROLE_##role);
    FA_FORWARD_FIELDS(D_ROW)
#undef D_ROW
}

/* The longest call any rank makes, Smax query rows against Smax keys at the end of
 * the whole sequence of N positions, checked by the core (positions within
 * FA_POSITION_MAX, the work within int64): from agreed values only, so every rank
 * reaches the same verdict. The data is never read. */
static fa_status check_longest(ring_call *rc, int64_t N)
{
    static float never_read[1];
    const int64_t B = rc->B, S = rc->Smax;
    fa_forward_args c = rc->a;
    c.q = fa_tensor_make(never_read, rc->dt, FA_LAYOUT_BSND, B, S, rc->Hq, rc->D);
    c.k = fa_tensor_make(never_read, rc->dt, FA_LAYOUT_BSND, B, S, rc->Hk, rc->D);
    c.v = fa_tensor_make(never_read, rc->dt, FA_LAYOUT_BSND, B, S, rc->Hk, rc->Dv);
    c.o = fa_tensor_make(never_read, FA_DTYPE_F32, FA_LAYOUT_BSND, B, S, rc->Hq, rc->Dv);
    c.lse = fa_tensor_contiguous(never_read, FA_DTYPE_F32, B, rc->Hq, S, 1);
    c.q_start = c.k_start = N - S;
    const fa_status st = fa_forward_check(rc->ctx, &c);
    return st == FA_OK ? FA_OK : ring_fail(st, "the ring's longest call: %s", fa_context_error(rc->ctx));
}

/* Pass 2: every rank derives the same verdict from everybody's descriptor. */
/* The opening of every ring call: a clean error, and this rank's place in the
 * communicator (the one check that cannot be agreed on: a null communicator). */
static fa_status ring_begin(ring_call *rc, MPI_Comm comm)
{
    ring_clear_error();
    memset(rc, 0, sizeof *rc);
    if (comm == MPI_COMM_NULL) return ring_fail(FA_ERR_INVALID_ARGUMENT, "the communicator is MPI_COMM_NULL");
    MPI_Comm_size(comm, &rc->P);
    MPI_Comm_rank(comm, &rc->rank);
    return FA_OK;
}

static fa_status agree(ring_call *rc, MPI_Comm comm, fa_status local_st, int64_t grads)
{
    int64_t desc[D_COUNT];
    fill_desc(rc, local_st, grads, desc);
    int64_t *all = malloc(sizeof(int64_t) * D_COUNT * (size_t)rc->P);
    int64_t *S = malloc(sizeof(int64_t) * (size_t)rc->P);
    int bad = !all || !S;
    /* a rank without memory for the agreement still agrees: it reports OOM */
    int bad_any = 0;
    MPI_Allreduce(&bad, &bad_any, 1, MPI_INT, MPI_MAX, comm);
    if (bad_any) {
        free(all), free(S);
        return ring_fail(FA_ERR_OUT_OF_MEMORY, "a rank could not allocate the agreement's few bytes");
    }
    MPI_Allgather(desc, D_COUNT, MPI_INT64_T, all, D_COUNT, MPI_INT64_T, comm);
    fa_status st = FA_OK;
    for (int x = 0; x < rc->P && st == FA_OK; x++) {
        const fa_status sx = (fa_status)all[x * D_COUNT + D_STATUS];
        if (sx == FA_OK) continue;
        st = sx;
        if (x != rc->rank) ring_fail(st, "rank %d refused its arguments: %s", x, fa_status_string(st));
    }
    for (int x = 1; x < rc->P && st == FA_OK; x++)
        for (int f = 0; f < D_COUNT && st == FA_OK; f++) {
            const fa_status m = desc_mismatch(f);
            if (m != FA_OK && all[x * D_COUNT + f] != all[f])
                st = ring_fail(m, "ranks 0 and %d disagree on %s (%lld vs %lld)", x, desc_name[f], (long long)all[f],
                               (long long)all[x * D_COUNT + f]);
        }
    if (st == FA_OK) {
        rc->Smax = 0;
        int64_t N = 0;
        for (int x = 0; x < rc->P; x++) {
            S[x] = all[x * D_COUNT + D_S];
            if (S[x] > rc->Smax) rc->Smax = S[x];
            N = N > FA_POSITION_MAX - S[x] ? FA_POSITION_MAX + 1 : N + S[x];
        }
        /* the core's limits on every call of the ring, asked of the core */
        st = check_longest(rc, N);
        /* the core's band rules and its dropout counter need different offsets
         * unless every call has Sq = Sk: equal segments and one piece */
        if (st == FA_OK && rc->band_offsets && rc->a.dropout_p > 0.0f) {
            for (int x = 1; x < rc->P; x++)
                if (S[x] != S[0])
                    st = ring_fail(FA_ERR_UNSUPPORTED, "a window or ALiBi with dropout needs equal shard lengths "
                                                       "(rank %d has %lld rows, rank 0 %lld)",
                                   x, (long long)S[x], (long long)S[0]);
            rc->pieces = 1;
        }
    }
    free(all);
    if (st != FA_OK) {
        free(S);
        return st;
    }
    rc->S = S;
    ring_layout_of(rc->sharding, rc->P, S, rc->rank, &rc->mine);
    return FA_OK;
}

/* Agrees on a flag every rank computed itself (1 = failed). */
static int any_rank(int flag, MPI_Comm comm)
{
    int any = 0;
    MPI_Allreduce(&flag, &any, 1, MPI_INT, MPI_MAX, comm);
    return any;
}

/* Pass 4: the first failing rank's status, on every rank (two collectives and
 * no allocation, so it cannot itself fail on one rank only). */
static fa_status agree_end(ring_call *rc)
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
static fa_tensor rows_of(const fa_tensor *t, int ax, int64_t r0, int64_t n)
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

/* The offsets and causal rule of a call on query rows at global qpos (n rows) and
 * keys at kpos (m rows): global positions for the top-left rule and the dropout
 * counter; the bottom-right rule's difference when a window or ALiBi needs d(i). */
static void place(const ring_call *rc, fa_forward_args *c, int64_t qpos, int64_t n, int64_t kpos, int64_t m)
{
    if (!rc->band_offsets) {
        c->q_start = qpos;
        c->k_start = kpos;
        c->causal = rc->causal ? FA_CAUSAL_TOP_LEFT : FA_CAUSAL_NONE;
        return;
    }
    int64_t qs = qpos - (m - n), ks = kpos; /* with n = m (dropout) these are the positions */
    if (qs < 0) ks -= qs, qs = 0;
    c->q_start = qs;
    c->k_start = ks;
    c->causal = rc->causal ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
}

/* The (query segment, row block, key segment) calls of one step, in a fixed order. */
typedef struct piece {
    const ring_seg *q, *k;
    int64_t r0, n, kept;
} piece;

/* Kept (query, key) pairs of one (batch, head) for query rows at global qpos (n rows)
 * against keys at kpos (m rows): the core's count of the call place() makes of them. */
static int64_t pairs_of(const ring_call *rc, int64_t qpos, int64_t n, int64_t kpos, int64_t m)
{
    static float never_read[1];
    if (n <= 0 || m <= 0) return 0;
    fa_forward_args c = rc->a; /* its scalars; one (batch, head) of width one */
    c.q = fa_tensor_make(never_read, rc->dt, FA_LAYOUT_BSND, 1, n, 1, 1);
    c.k = fa_tensor_make(never_read, rc->dt, FA_LAYOUT_BSND, 1, m, 1, 1);
    c.v = fa_tensor_make(never_read, rc->dt, FA_LAYOUT_BSND, 1, m, 1, 1);
    c.o = fa_tensor_make(never_read, rc->dt, FA_LAYOUT_BSND, 1, n, 1, 1);
    c.lse = (fa_tensor){0};
    c.alibi_slopes = NULL;
    place(rc, &c, qpos, n, kpos, m);
    fa_work w = FA_WORK_INIT;
    /* the agreement checked the longest call, so this cannot fail; if it did, the
     * piece runs and the core's own call reports why */
    return fa_forward_work(rc->ctx, &c, &w) == FA_OK ? w.pairs : 1;
}

static int step_pieces(const ring_call *rc, const ring_layout *src, piece *out, int cap, int64_t *kept_total)
{
    int np = 0;
    *kept_total = 0;
    for (int a = 0; a < rc->mine.n; a++)
        for (int b = 0; b < src->n; b++) {
            const ring_seg *qs = &rc->mine.seg[a], *ks = &src->seg[b];
            if (pairs_of(rc, qs->pos, qs->len, ks->pos, ks->len) == 0) continue;
            const int64_t blk = (qs->len + rc->pieces - 1) / rc->pieces;
            for (int64_t r0 = 0; r0 < qs->len && np < cap; r0 += blk) {
                const int64_t n = qs->len - r0 < blk ? qs->len - r0 : blk;
                const int64_t kept = pairs_of(rc, qs->pos + r0, n, ks->pos, ks->len);
                if (!kept) continue;
                out[np++] = (piece){qs, ks, r0, n, kept};
                *kept_total += kept;
            }
        }
    return np;
}

static fa_ring_stats *stats_of(ring_call *rc)
{
    return rc->stats ? rc->stats : &rc->local_stats;
}

static void stats_begin(ring_call *rc)
{
    fa_ring_stats *s = stats_of(rc);
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
    fa_ring_stats *st = stats_of(rc);
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
    fa_ring_stats *st = stats_of(rc);
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

fa_status fa_ring_forward(fa_context *ctx, MPI_Comm comm, const fa_ring_args *ring, const fa_forward_args *local)
{
    const double t0 = MPI_Wtime();
    ring_call rc;
    if (ring_begin(&rc, comm) != FA_OK) return FA_ERR_INVALID_ARGUMENT;
    fa_status st = check_forward(&rc, ctx, ring, local);
    if ((st = agree(&rc, comm, st, 0)) != FA_OK) return st;

    const int P = rc.P;
    const int64_t B = rc.B, Sl = rc.Sl, Hq = rc.Hq, Dv = rc.Dv, es = rc.es;
    const int64_t kv_bytes = kv_elems(&rc, rc.Smax) * es, acc_n = B * Sl * Hq * Dv, lse_n = B * Hq * Sl;
    char *kv[2] = {malloc((size_t)kv_bytes + 64), P > 1 ? malloc((size_t)kv_bytes + 64) : NULL};
    float *o_acc = malloc(sizeof(float) * (size_t)(acc_n + 1)), *o_part = malloc(sizeof(float) * (size_t)(acc_n + 1));
    float *lse_acc = malloc(sizeof(float) * (size_t)(lse_n + 1)), *lse_part = malloc(sizeof(float) * (size_t)(lse_n + 1));
    piece *pcs = malloc(sizeof(piece) * (size_t)(4 * rc.pieces));
    const int oom = !kv[0] || (P > 1 && !kv[1]) || !o_acc || !o_part || !lse_acc || !lse_part || !pcs ||
                    kv_bytes > RING_CHUNK * RING_MAX_CHUNKS;
    if (any_rank(oom, comm)) {
        free(kv[0]), free(kv[1]), free(o_acc), free(o_part), free(lse_acc), free(lse_part), free(pcs), free(rc.S);
        return ring_fail(kv_bytes > RING_CHUNK * RING_MAX_CHUNKS ? FA_ERR_OVERFLOW : FA_ERR_OUT_OF_MEMORY,
                         "a rank could not allocate the ring's buffers");
    }
    MPI_Comm_dup(comm, &rc.comm); /* our messages never meet the caller's */
    rc.prev = (rc.rank + P - 1) % P;
    rc.next = (rc.rank + 1) % P;
    stats_begin(&rc);
    fa_ring_stats *stats = stats_of(&rc);

    /* accumulators: lse -inf and o 0 are "nothing yet", which a merge leaves exact */
    for (int64_t k = 0; k < acc_n; k++) o_acc[k] = 0.0f;
    for (int64_t k = 0; k < lse_n; k++) lse_acc[k] = -INFINITY;
    const fa_tensor acc_o = fa_tensor_make(o_acc, FA_DTYPE_F32, FA_LAYOUT_BSND, B, Sl, Hq, Dv);
    const fa_tensor part_o = fa_tensor_make(o_part, FA_DTYPE_F32, FA_LAYOUT_BSND, B, Sl, Hq, Dv);
    const fa_tensor acc_l = fa_tensor_contiguous(lse_acc, FA_DTYPE_F32, B, Hq, Sl, 1);
    const fa_tensor part_l = fa_tensor_contiguous(lse_part, FA_DTYPE_F32, B, Hq, Sl, 1);

    pack(kv[0], &rc.a.k, es);
    pack(kv[0] + B * Sl * rc.Hk * rc.D * es, &rc.a.v, es);
    xfer x = {.n = 0};
    xfer *xs[1] = {&x};
    for (int s = 0; s < P; s++) {
        const int src = (rc.rank - s + P) % P, nsrc = (rc.rank - s - 1 + 2 * P) % P;
        char *cur = kv[s % 2];
        /* the next shard moves while this one computes: posted before any piece */
        if (s < P - 1) {
            xfer_post(&x, 0, kv[(s + 1) % 2], kv_elems(&rc, rc.S[nsrc]) * es, rc.prev, RING_TAG_KV, rc.comm);
            xfer_post(&x, 1, cur, kv_elems(&rc, rc.S[src]) * es, rc.next, RING_TAG_KV, rc.comm);
            stats->bytes_sent += kv_elems(&rc, rc.S[src]) * es;
        }
        ring_layout sl;
        ring_layout_of(rc.sharding, P, rc.S, src, &sl);
        int64_t kept = 0;
        const int np = step_pieces(&rc, &sl, pcs, 4 * rc.pieces, &kept);
        const fa_tensor kt = kv_view(&rc, cur, rc.S[src], 0, rc.dt, es), vt = kv_view(&rc, cur, rc.S[src], 1, rc.dt, es);
        const double tc = MPI_Wtime();
        /* the hook the tests read: was the next shard already on its way? */
        if (x.n > 0) stats->steps_prefetched++;
        double tested = 0.0;
        for (int p = 0; p < np && rc.st == FA_OK; p++) {
            tested += progress(&rc, xs, 1);
            const piece *pc = &pcs[p];
            const int64_t row = pc->q->off + pc->r0;
            fa_forward_args c = rc.a;
            c.sinks = NULL; /* a partial without them: the sink enters once, after the ring */
            c.q = rows_of(&rc.a.q, 1, row, pc->n);
            c.k = rows_of(&kt, 1, pc->k->off, pc->k->len);
            c.v = rows_of(&vt, 1, pc->k->off, pc->k->len);
            c.o = rows_of(&part_o, 1, row, pc->n);
            c.lse = rows_of(&part_l, 2, row, pc->n);
            place(&rc, &c, pc->q->pos + pc->r0, pc->n, pc->k->pos, pc->k->len);
            st = s == ring_fault_step ? FA_ERR_OUT_OF_MEMORY : fa_forward(ctx, &c);
            stats->core_calls++;
            if (st != FA_OK) {
                call_fail(&rc, st, s, "fa_forward");
                break;
            }
            fa_tensor ov[2] = {rows_of(&acc_o, 1, row, pc->n), c.o};
            fa_tensor lv[2] = {rows_of(&acc_l, 2, row, pc->n), c.lse};
            st = fa_merge_states(ctx, 2, ov, lv, &ov[0], &lv[0]);
            if (st != FA_OK) call_fail(&rc, st, s, "fa_merge_states");
        }
        stats->kept_pairs += kept;
        stats->steps_computed += np > 0;
        const double tw = MPI_Wtime();
        xfer_wait(&x);
        stats_step(&rc, s, tw - tc - tested, MPI_Wtime() - tw);
    }
    st = agree_end(&rc);
    if (st == FA_OK) { /* one exact merge: rounds o once to its dtype */
        const fa_tensor ov[2] = {acc_o, part_o}, lv[2] = {acc_l, part_l};
        if (rc.a.sinks) sink_state(&rc, o_part, lse_part);
        fa_tensor lse_out = rc.a.lse;
        st = fa_merge_states(ctx, rc.a.sinks ? 2 : 1, ov, lv, &rc.a.o, &lse_out);
        if (st != FA_OK) ring_fail(st, "writing o: %s", fa_context_error(ctx));
    }
    MPI_Comm_free(&rc.comm);
    free(kv[0]), free(kv[1]), free(o_acc), free(o_part), free(lse_acc), free(lse_part), free(pcs), free(rc.S);
    stats->total_seconds = MPI_Wtime() - t0;
    return st;
}

/* ------------------------------------------------------------ backward */

static fa_status check_backward(ring_call *rc, fa_context *ctx, const fa_ring_args *ring,
                                const fa_backward_args *local, int64_t *grads)
{
    *grads = 0;
    if (!local) return ring_fail(FA_ERR_NULL_POINTER, "the backward args are NULL");
    fa_backward_args g = FA_BACKWARD_ARGS_INIT;
    fa_status st = fa_struct_read(ctx, "args", local, &g, sizeof g, sizeof(size_t));
    if (st != FA_OK) return core_fail(st, ctx);
    if (!g.fwd) return ring_fail(FA_ERR_NULL_POINTER, "args->fwd is NULL: the backward needs the forward's arguments");
    if ((st = check_forward(rc, ctx, ring, g.fwd)) != FA_OK) return st;
    if (g.dsinks && rc->Hq > INT_MAX) /* MPI counts are ints */
        return ring_fail(FA_ERR_OVERFLOW, "%lld heads of dsinks do not fit an MPI count", (long long)rc->Hq);
    /* lse, o, do_ and the gradients: the core's backward checks (the global lse of
     * the local rows is the one the ring needs) */
    if ((st = fa_backward_check(ctx, local)) != FA_OK) return core_fail(st, ctx);
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

/* The backward's scratch: f32 pieces' gradients and what they sum into. */
typedef struct bwd_scratch {
    int want_dq, travel;
    float *dq_acc, *dq_piece, *dkv_piece;
    float *dsink_piece;  /* (Hq) one piece's dsinks, or NULL: not wanted */
    double *dsink_acc;   /* (Hq) this rank's sum of them */
} bwd_scratch;

/* Runs pieces [from, to) of a step against the keys kt, vt (a shard of Ss rows):
 * dq adds into dq_acc, dk/dv into `into` (laid out (B, Ss, Hk, D) then
 * (B, Ss, Hk, Dv)). Returns the seconds spent progressing transfers. */
static double bwd_pieces(ring_call *rc, const piece *pcs, int from, int to, const fa_tensor *kt, const fa_tensor *vt,
                         int64_t Ss, float *into, const bwd_scratch *sc, xfer *const *xs, int step)
{
    const int64_t B = rc->B, Sl = rc->Sl, Hq = rc->Hq, Hk = rc->Hk, D = rc->D, Dv = rc->Dv;
    double tested = 0.0;
    for (int p = from; p < to && rc->st == FA_OK; p++) {
        tested += progress(rc, xs, 3);
        const piece *pc = &pcs[p];
        const int64_t row = pc->q->off + pc->r0, koff = pc->k->off, klen = pc->k->len;
        fa_forward_args c = rc->a;
        c.q = rows_of(&rc->a.q, 1, row, pc->n);
        c.k = rows_of(kt, 1, koff, klen);
        c.v = rows_of(vt, 1, koff, klen);
        c.o = rows_of(&rc->a.o, 1, row, pc->n); /* the global o and lse of these rows */
        c.lse = rows_of(&rc->a.lse, 2, row, pc->n);
        place(rc, &c, pc->q->pos + pc->r0, pc->n, pc->k->pos, klen);
        fa_backward_args g = FA_BACKWARD_ARGS_INIT;
        g.fwd = &c;
        g.do_ = rows_of(&rc->g.do_, 1, row, pc->n);
        /* the sink term of each local row once: in the pieces of its own segment at step 0
         * (the band keeps every row's diagonal, so they cover each row exactly once) */
        const int sink_rows = sc->dsink_piece && step == 0 && pc->q->pos == pc->k->pos;
        if (sink_rows) g.dsinks = sc->dsink_piece;
        /* the pieces' gradients land in f32 scratch laid out like the shard */
        if (sc->want_dq) g.dq = fa_tensor_make(sc->dq_piece, FA_DTYPE_F32, FA_LAYOUT_BSND, B, pc->n, Hq, D);
        if (sc->travel) {
            g.dk = fa_tensor_make(sc->dkv_piece, FA_DTYPE_F32, FA_LAYOUT_BSND, B, klen, Hk, D);
            g.dv = fa_tensor_make(sc->dkv_piece + B * klen * Hk * D, FA_DTYPE_F32, FA_LAYOUT_BSND, B, klen, Hk, Dv);
        }
        const fa_status st = step == ring_fault_step ? FA_ERR_OUT_OF_MEMORY : fa_backward(rc->ctx, &g);
        stats_of(rc)->core_calls++;
        if (st != FA_OK) {
            call_fail(rc, st, step, "fa_backward");
            break;
        }
        if (sc->want_dq) add_rows(sc->dq_acc, Sl, row, sc->dq_piece, pc->n, B, Hq * D);
        for (int64_t h = 0; sink_rows && h < Hq; h++) sc->dsink_acc[h] += sc->dsink_piece[h];
        if (sc->travel) {
            add_rows(into, Ss, koff, sc->dkv_piece, klen, B, Hk * D);
            add_rows(into + B * Ss * Hk * D, Ss, koff, sc->dkv_piece + B * klen * Hk * D, klen, B, Hk * Dv);
        }
    }
    return tested;
}

fa_status fa_ring_backward(fa_context *ctx, MPI_Comm comm, const fa_ring_args *ring, const fa_backward_args *local)
{
    const double t0 = MPI_Wtime();
    ring_call rc;
    if (ring_begin(&rc, comm) != FA_OK) return FA_ERR_INVALID_ARGUMENT;
    int64_t grads = 0;
    fa_status st = check_backward(&rc, ctx, ring, local, &grads);
    if ((st = agree(&rc, comm, st, grads)) != FA_OK) return st;

    const int P = rc.P, travel = (grads & 3) != 0; /* dk/dv accumulators travel only when wanted */
    const int64_t B = rc.B, Sl = rc.Sl, Hq = rc.Hq, Hk = rc.Hk, D = rc.D, Dv = rc.Dv, es = rc.es;
    const int64_t kv_bytes = kv_elems(&rc, rc.Smax) * es, acc_n = kv_elems(&rc, rc.Smax), dq_n = B * Sl * Hq * D;
    const int want_dq = rc.g.dq.data != NULL;
    char *kv[2] = {malloc((size_t)kv_bytes + 64), P > 1 ? malloc((size_t)kv_bytes + 64) : NULL};
    float *acc[2] = {travel ? malloc(sizeof(float) * (size_t)(acc_n + 1)) : NULL,
                     travel && P > 1 ? malloc(sizeof(float) * (size_t)(acc_n + 1)) : NULL};
    float *tmp = travel ? malloc(sizeof(float) * (size_t)(acc_n + 1)) : NULL;
    /* the own shard's second half, computed while its accumulators come home */
    const int defer = travel && P > 1;
    float *own = defer ? calloc((size_t)(kv_elems(&rc, Sl) + 1), sizeof(float)) : NULL;
    piece *late = malloc(sizeof(piece) * (size_t)(4 * rc.pieces));
    int nlate = 0;
    /* 64-byte aligned: the core's backward then accumulates dq in it directly */
    float *dkv_piece = travel ? aligned_floats(acc_n) : NULL;
    float *dq_acc = want_dq ? calloc((size_t)(dq_n + 1), sizeof(float)) : NULL;
    float *dq_piece = want_dq ? aligned_floats(dq_n) : NULL;
    float *zeros = calloc((size_t)(B * Hq * Sl + 1), sizeof(float));
    piece *pcs = malloc(sizeof(piece) * (size_t)(4 * rc.pieces));
    /* dsinks: this rank's sum (Hq), then every rank's (P x Hq), and one piece's (Hq) */
    const int want_dsinks = rc.g.dsinks != NULL;
    double *dsink_acc = want_dsinks ? calloc((size_t)(Hq * (P + 1)), sizeof(double)) : NULL;
    float *dsink_piece = want_dsinks ? malloc(sizeof(float) * (size_t)Hq) : NULL;
    const int oom = !kv[0] || (P > 1 && !kv[1]) || (travel && (!acc[0] || (P > 1 && !acc[1]) || !tmp || !dkv_piece)) ||
                    (want_dq && (!dq_acc || !dq_piece)) || !zeros || !pcs || !late || (defer && !own) ||
                    (want_dsinks && (!dsink_acc || !dsink_piece)) || acc_n * 4 > RING_CHUNK * RING_MAX_CHUNKS;
    if (any_rank(oom, comm)) {
        free(kv[0]), free(kv[1]), free(acc[0]), free(acc[1]), free(tmp), free(dkv_piece), free(dq_acc), free(dq_piece);
        free(zeros), free(pcs), free(rc.S), free(own), free(late), free(dsink_acc), free(dsink_piece);
        return ring_fail(acc_n * 4 > RING_CHUNK * RING_MAX_CHUNKS ? FA_ERR_OVERFLOW : FA_ERR_OUT_OF_MEMORY,
                         "a rank could not allocate the ring's buffers");
    }
    MPI_Comm_dup(comm, &rc.comm);
    rc.prev = (rc.rank + P - 1) % P;
    rc.next = (rc.rank + 1) % P;
    stats_begin(&rc);
    fa_ring_stats *stats = stats_of(&rc);
    const bwd_scratch sc = {want_dq, travel, dq_acc, dq_piece, dkv_piece, dsink_piece, dsink_acc};

    pack(kv[0], &rc.a.k, es);
    pack(kv[0] + B * Sl * Hk * D * es, &rc.a.v, es);
    xfer xkv = {.n = 0}, xin = {.n = 0}, xout = {.n = 0};
    xfer *xs[3] = {&xkv, &xin, &xout};
    for (int s = 0; s < P; s++) {
        const int src = (rc.rank - s + P) % P, nsrc = (rc.rank - s - 1 + 2 * P) % P;
        const int64_t Ss = rc.S[src], nk = kv_elems(&rc, Ss);
        char *cur = kv[s % 2];
        float *a_cur = travel ? acc[s % 2] : NULL;
        if (s < P - 1) {
            xfer_post(&xkv, 0, kv[(s + 1) % 2], kv_elems(&rc, rc.S[nsrc]) * es, rc.prev, RING_TAG_KV, rc.comm);
            xfer_post(&xkv, 1, cur, nk * es, rc.next, RING_TAG_KV, rc.comm);
            stats->bytes_sent += nk * es;
        }
        /* this step's accumulator comes from the rank that held the shard last step */
        if (travel && s > 0) xfer_post(&xin, 0, a_cur, nk * 4, rc.prev, RING_TAG_ACC, rc.comm);
        ring_layout sl;
        ring_layout_of(rc.sharding, P, rc.S, src, &sl);
        int64_t kept = 0;
        const int np = step_pieces(&rc, &sl, pcs, 4 * rc.pieces, &kept);
        const fa_tensor kt = kv_view(&rc, cur, Ss, 0, rc.dt, es), vt = kv_view(&rc, cur, Ss, 1, rc.dt, es);
        const double tc = MPI_Wtime();
        if (travel) memset(tmp, 0, sizeof(float) * (size_t)nk);
        if (xkv.n > 0) stats->steps_prefetched++;
        /* the own shard's step is split by kept pairs: its first half now (it
         * hides the first transfer), the rest after the ring (it hides the
         * accumulators' way home) */
        int run = np;
        if (s == 0 && defer) {
            int64_t half = 0;
            run = 0;
            while (run < np && 2 * half < kept) half += pcs[run++].kept;
            for (int p = run; p < np; p++) { /* k segments of the own layout, which outlives the loop */
                late[nlate] = pcs[p];
                late[nlate++].k = &rc.mine.seg[pcs[p].k - sl.seg];
            }
        }
        const double tested = bwd_pieces(&rc, pcs, 0, run, &kt, &vt, Ss, tmp, &sc, xs, s);
        stats->kept_pairs += kept;
        stats->steps_computed += np > 0;
        const double tw = MPI_Wtime();
        double compute = tw - tc - tested, wait = 0.0;
        if (travel) {
            xfer_wait(&xin); /* exposed: this step's accumulator had to be here */
            const double ta = MPI_Wtime();
            wait += ta - tw;
            if (s == 0) memcpy(a_cur, tmp, sizeof(float) * (size_t)nk);
            else
                for (int64_t k = 0; k < nk; k++) a_cur[k] += tmp[k];
            const double tb = MPI_Wtime();
            compute += tb - ta;
            xfer_wait(&xout); /* last step's send, before its buffer is received into */
            if (P > 1) {
                xfer_post(&xout, 1, a_cur, nk * 4, rc.next, RING_TAG_ACC, rc.comm);
                stats->bytes_sent += nk * 4;
            }
            wait += MPI_Wtime() - tb;
        }
        const double tk = MPI_Wtime();
        xfer_wait(&xkv);
        wait += MPI_Wtime() - tk;
        stats_step(&rc, s, compute, wait);
    }
    /* the accumulators of this rank's own shard come home after P steps, while
     * the own shard's second half computes (on the caller's k and v: the packed
     * copy was received into long ago) */
    float *mine = travel ? acc[0] : NULL;
    if (defer) {
        mine = acc[P % 2];
        xfer_post(&xin, 0, mine, kv_elems(&rc, Sl) * 4, rc.prev, RING_TAG_ACC, rc.comm);
        const double tc = MPI_Wtime();
        const double tested = bwd_pieces(&rc, late, 0, nlate, &rc.a.k, &rc.a.v, Sl, own, &sc, xs, 0);
        const double tw = MPI_Wtime();
        xfer_wait(&xin);
        xfer_wait(&xout);
        const double wait = MPI_Wtime() - tw;
        const int64_t n = kv_elems(&rc, Sl);
        for (int64_t k = 0; k < n; k++) mine[k] += own[k];
        stats->compute_seconds += MPI_Wtime() - tc - tested - wait;
        stats->wait_seconds += wait;
        if (stats->step_capacity > 0 && stats->step_compute_seconds)
            stats->step_compute_seconds[0] += MPI_Wtime() - tc - tested - wait;
        if (stats->step_capacity > 0 && stats->step_wait_seconds) stats->step_wait_seconds[0] += wait;
    }
    st = agree_end(&rc);
    /* every rank's dsinks partials, while the status is still the one all ranks agreed on */
    double *dsink_all = dsink_acc ? dsink_acc + Hq : NULL;
    if (st == FA_OK && want_dsinks)
        MPI_Allgather(dsink_acc, (int)Hq, MPI_DOUBLE, dsink_all, (int)Hq, MPI_DOUBLE, rc.comm);
    if (st == FA_OK && want_dq) st = write_f32(ctx, dq_acc, B, Sl, Hq, D, zeros, &rc.g.dq);
    if (st == FA_OK && travel) st = write_f32(ctx, mine, B, Sl, Hk, D, zeros, &rc.g.dk);
    if (st == FA_OK && travel) st = write_f32(ctx, mine + B * Sl * Hk * D, B, Sl, Hk, Dv, zeros, &rc.g.dv);
    for (int64_t h = 0; st == FA_OK && want_dsinks && h < Hq; h++) { /* in rank order: the same bits on every rank */
        double sum = 0.0;
        for (int x = 0; x < P; x++) sum += dsink_all[x * Hq + h];
        rc.g.dsinks[h] = (float)sum;
    }
    if (st != FA_OK && rc.st == FA_OK && fa_ring_error()[0] == '\0')
        ring_fail(st, "writing the gradients: %s", fa_context_error(ctx));
    MPI_Comm_free(&rc.comm);
    free(kv[0]), free(kv[1]), free(acc[0]), free(acc[1]), free(tmp), free(dkv_piece), free(dq_acc), free(dq_piece);
    free(zeros), free(pcs), free(rc.S), free(own), free(late), free(dsink_acc), free(dsink_piece);
    stats->total_seconds = MPI_Wtime() - t0;
    return st;
}
