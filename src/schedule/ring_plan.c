/*
 * ring_plan.c: the ring planner (include/flashattn.h): where each rank's rows sit in
 * the whole sequence, which core calls each ring step makes, how they are placed
 * (q_start, k_start, causal) and what they keep, and what the ranks must agree on.
 * No transport: libflashattn_mpi (mpi/ring.c) and flashattn.torch.distributed ask
 * these rules and move the bytes. The kept pairs and the limits of a call are the
 * core's own (fa_forward_work, fa_forward_check), asked on calls that read no data.
 *
 * Legend: P ranks, r a rank, S_r its shard's rows, N = sum S_r; a segment is a run of
 * a shard's rows contiguous in the sequence (fa_ring_segment).
 */
#include "context.h"

#include <stddef.h>
#include <string.h>

#define RING_PIECES_MAX 1024

/* The plan as the library reads it (struct_size rule), with the options it derives
 * from the calls: what every rule below looks at. */
typedef struct ring_rules {
    fa_ring_plan pl;
    fa_forward_args call;  /* the calls' options (zeroed when plan->call is NULL) */
    int causal;            /* either alignment: over one sequence both keep j <= i */
    int64_t wl, wr;        /* the window sides as the ring places them (window_side) */
    int band_offsets;      /* a window or ALiBi: offsets follow the bottom-right rule */
    int dropout;
    int pieces;            /* resolved */
} ring_rules;

/* A window side that reaches past every position a ring can place (FA_POSITION_MAX)
 * bounds nothing, as -1 does, and needs no bottom-right offsets. Whether a side is
 * valid at all is the core's to say, on the calls. */
static int64_t window_side(int64_t w)
{
    return w < 0 || w >= FA_POSITION_MAX ? -1 : w;
}

static void derive_rules(ring_rules *r)
{
    const fa_forward_args *a = &r->call;
    r->causal = a->causal != FA_CAUSAL_NONE;
    r->wl = window_side(a->window_left);
    r->wr = window_side(a->window_right);
    r->band_offsets = r->wl >= 0 || r->wr >= 0 || a->alibi_slopes != NULL;
    r->dropout = a->dropout_p > 0.0f;
    /* the core's band rules and its dropout counter need different offsets unless
     * every call has Sq = Sk: then the blocks stay whole */
    r->pieces = r->band_offsets && r->dropout ? 1 : (r->pl.pieces ? r->pl.pieces : 1);
}

/* Reads and checks the plan; need_lengths / need_call: what the caller's query reads.
 * ctx may be NULL (no message) where no core call follows: the placement. */
static fa_status read_plan(fa_context *ctx, const fa_ring_plan *plan, int need_lengths, int need_call, ring_rules *r)
{
    memset(r, 0, sizeof *r);
    fa_ring_plan init = FA_RING_PLAN_INIT;
    r->pl = init;
    fa_status st = fa_struct_read(ctx, "plan", plan, &r->pl, sizeof r->pl, offsetof(fa_ring_plan, pieces));
    if (st != FA_OK) return st;
    const fa_ring_plan *p = &r->pl;
    if (p->nranks < 1 || p->rank < 0 || p->rank >= p->nranks)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "plan: rank %d of %d ranks", p->rank, p->nranks);
    if (p->sharding != FA_RING_CONTIGUOUS && p->sharding != FA_RING_ZIGZAG)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "plan->sharding %d is not a fa_ring_sharding", (int)p->sharding);
    if (p->pieces < 0 || p->pieces > RING_PIECES_MAX)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "plan->pieces %d is not in 0..%d", p->pieces, RING_PIECES_MAX);
    if (need_lengths) {
        if (!p->lengths) return fa_fail(ctx, FA_ERR_NULL_POINTER, "plan->lengths is NULL");
        int64_t n = 0;
        for (int x = 0; x < p->nranks; x++) {
            const int64_t s = p->lengths[x];
            if (s < 0) return fa_fail(ctx, FA_ERR_INVALID_DIM, "plan->lengths[%d] is %lld", x, (long long)s);
            if (p->sharding == FA_RING_ZIGZAG && s % 2)
                return fa_fail(ctx, FA_ERR_INVALID_DIM, "zig-zag sharding needs even shard lengths: lengths[%d] is %lld",
                               x, (long long)s);
            if (s > FA_POSITION_MAX - n)
                return fa_fail(ctx, FA_ERR_OVERFLOW, "the shards' lengths sum beyond FA_POSITION_MAX");
            n += s;
        }
    }
    if (need_call) {
        if (!p->call) return fa_fail(ctx, FA_ERR_NULL_POINTER, "plan->call is NULL");
        fa_forward_args a = FA_FORWARD_ARGS_INIT;
        r->call = a;
        if ((st = fa_struct_read(ctx, "plan->call", p->call, &r->call, sizeof r->call, sizeof(size_t))) != FA_OK)
            return st;
    }
    derive_rules(r);
    return FA_OK;
}

/* ------------------------------------------------------------ placement */

static int layout_of(const ring_rules *r, int rank, fa_ring_segment seg[2])
{
    const int P = r->pl.nranks;
    const int64_t *S = r->pl.lengths;
    if (r->pl.sharding == FA_RING_CONTIGUOUS) {
        int64_t pos = 0;
        for (int x = 0; x < rank; x++) pos += S[x];
        seg[0] = (fa_ring_segment){pos, S[rank], 0};
        return 1;
    }
    /* zig-zag: the global order of the 2P chunks is rank 0's first, 1's first, ...,
     * P-1's first, P-1's second, ..., 0's second; chunk lengths S_x / 2 */
    int64_t first = 0, second = 0;
    for (int x = 0; x < rank; x++) first += S[x] / 2;
    for (int x = 0; x < P; x++) second += S[x] / 2;
    for (int x = P - 1; x > rank; x--) second += S[x] / 2;
    const int64_t c = S[rank] / 2;
    seg[0] = (fa_ring_segment){first, c, 0};
    seg[1] = (fa_ring_segment){second, c, c};
    return 2;
}

fa_status fa_ring_placement(fa_context *ctx, const fa_ring_plan *plan, int rank, fa_ring_segment seg[2], int *count)
{
    ring_rules r;
    fa_status st = read_plan(ctx, plan, 1, 0, &r);
    if (st != FA_OK) return st;
    if (!seg || !count) return fa_fail(ctx, FA_ERR_NULL_POINTER, "seg or count is NULL");
    if (rank < 0 || rank >= r.pl.nranks)
        return fa_fail(ctx, FA_ERR_OUT_OF_RANGE, "rank %d of %d ranks", rank, r.pl.nranks);
    *count = layout_of(&r, rank, seg);
    return FA_OK;
}

/* -------------------------------------------------------------- pieces */

/* The offsets and causal rule of a call on `rows` query rows at global q_pos and
 * `keys` keys at k_pos: the global positions with top-left causal (the band and
 * the dropout counter read them); with a window or ALiBi, which measure from the
 * bottom-right diagonal, offsets whose difference is shifted by keys - rows
 * (docs/semantics.md section 4; with rows = keys, as dropout then requires, they
 * are the positions again). */
static void place(const ring_rules *r, fa_ring_piece *pc)
{
    if (!r->band_offsets) {
        pc->q_start = pc->q_pos;
        pc->k_start = pc->k_pos;
        pc->causal = r->causal ? FA_CAUSAL_TOP_LEFT : FA_CAUSAL_NONE;
        return;
    }
    int64_t qs = pc->q_pos - (pc->keys - pc->rows), ks = pc->k_pos;
    if (qs < 0) ks -= qs, qs = 0;
    pc->q_start = qs;
    pc->k_start = ks;
    pc->causal = r->causal ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
}

/* Places pc and counts its kept pairs: the core's count of the call place() makes,
 * one (batch, head) of width one on data it never reads. */
static fa_status place_and_count(fa_context *ctx, const ring_rules *r, fa_ring_piece *pc)
{
    static float never_read[1];
    place(r, pc);
    pc->kept = 0;
    if (pc->rows <= 0 || pc->keys <= 0) return FA_OK;
    fa_forward_args c = FA_FORWARD_ARGS_INIT; /* the band's fields: causal, window, offsets */
    c.q = fa_tensor_make(never_read, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, pc->rows, 1, 1);
    c.k = fa_tensor_make(never_read, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, pc->keys, 1, 1);
    c.v = c.k;
    c.o = c.q;
    c.causal = pc->causal;
    c.window_left = r->call.window_left;
    c.window_right = r->call.window_right;
    c.q_start = pc->q_start;
    c.k_start = pc->k_start;
    fa_work w = FA_WORK_INIT;
    const fa_status st = fa_forward_work(ctx, &c, &w);
    pc->kept = w.pairs;
    return st;
}

fa_status fa_ring_block(fa_context *ctx, const fa_ring_plan *plan, int64_t q_pos, int64_t rows, int64_t k_pos,
                        int64_t keys, fa_ring_piece *out)
{
    ring_rules r;
    if (!ctx) return FA_ERR_NULL_CONTEXT;
    fa_status st = read_plan(ctx, plan, 0, 1, &r);
    if (st != FA_OK) return st;
    if (!out) return fa_fail(ctx, FA_ERR_NULL_POINTER, "out is NULL");
    if (q_pos < 0 || rows < 0 || k_pos < 0 || keys < 0)
        return fa_fail(ctx, FA_ERR_OUT_OF_RANGE, "a block at (%lld, %lld) of %lld x %lld", (long long)q_pos,
                       (long long)k_pos, (long long)rows, (long long)keys);
    fa_ring_piece pc = {0, rows, 0, keys, q_pos, k_pos, 0, 0, FA_CAUSAL_NONE, 0, 0};
    if ((st = place_and_count(ctx, &r, &pc)) == FA_OK) *out = pc;
    return st;
}

/* Appends pc when it fits; *n counts every piece, fitting or not. */
static void emit(fa_ring_piece *out, int capacity, int *n, const fa_ring_piece *pc)
{
    if (*n < capacity) out[*n] = *pc;
    (*n)++;
}

/* One (query segment, key segment) block cut into r->pieces row pieces of
 * ceil(len / pieces) rows, those that keep nothing left out; `diagonal`: the two
 * segments are one (the own shard's, at step 0). */
static fa_status block_pieces(fa_context *ctx, const ring_rules *r, const fa_ring_segment *qs, const fa_ring_segment *ks,
                              int diagonal, fa_ring_piece *out, int capacity, int *n)
{
    fa_ring_piece whole = {qs->off, qs->len, ks->off, ks->len, qs->pos, ks->pos, 0, 0, FA_CAUSAL_NONE, 0, 0};
    fa_status st = place_and_count(ctx, r, &whole);
    if (st != FA_OK || whole.kept == 0) return st;
    const int64_t blk = (qs->len + r->pieces - 1) / r->pieces;
    for (int64_t r0 = 0; r0 < qs->len; r0 += blk) {
        const int64_t rows = qs->len - r0 < blk ? qs->len - r0 : blk;
        fa_ring_piece pc = {qs->off + r0, rows, ks->off, ks->len, qs->pos + r0, ks->pos, 0, 0, FA_CAUSAL_NONE, 0, 0};
        if ((st = place_and_count(ctx, r, &pc)) != FA_OK) return st;
        pc.diagonal = diagonal;
        if (pc.kept) emit(out, capacity, n, &pc);
    }
    return FA_OK;
}

fa_status fa_ring_step(fa_context *ctx, const fa_ring_plan *plan, int step, fa_ring_piece *out, int capacity,
                       int *count)
{
    ring_rules r;
    if (!ctx) return FA_ERR_NULL_CONTEXT;
    fa_status st = read_plan(ctx, plan, 1, 1, &r);
    if (st != FA_OK) return st;
    const int P = r.pl.nranks, me = r.pl.rank;
    if (!count || (capacity > 0 && !out)) return fa_fail(ctx, FA_ERR_NULL_POINTER, "out or count is NULL");
    if (step < 0 || step >= P) return fa_fail(ctx, FA_ERR_OUT_OF_RANGE, "step %d of a ring of %d", step, P);
    const int src = (me - step + P) % P;
    const int64_t Sq = r.pl.lengths[me], Sk = r.pl.lengths[src];
    int n = 0;
    if (r.pl.whole_shards && !(r.causal || r.band_offsets || r.dropout)) {
        /* no rule reads a position: one call, whatever the segments */
        fa_ring_piece pc = {0, Sq, 0, Sk, 0, 0, 0, 0, FA_CAUSAL_NONE, 0, step == 0};
        if ((st = place_and_count(ctx, &r, &pc)) != FA_OK) return st;
        if (pc.kept) emit(out, capacity, &n, &pc);
    } else {
        fa_ring_segment mine[2], theirs[2];
        const int nm = layout_of(&r, me, mine), nt = layout_of(&r, src, theirs);
        for (int a = 0; a < nm && st == FA_OK; a++)
            for (int b = 0; b < nt && st == FA_OK; b++)
                st = block_pieces(ctx, &r, &mine[a], &theirs[b], step == 0 && a == b, out, capacity, &n);
        if (st != FA_OK) return st;
    }
    *count = n;
    if (n > capacity)
        return fa_fail(ctx, FA_ERR_OUT_OF_RANGE, "step %d has %d pieces; the capacity is %d", step, n, capacity);
    return FA_OK;
}

int fa_ring_split(const fa_ring_piece *pieces, int count)
{
    int64_t total = 0, half = 0;
    for (int p = 0; pieces && p < count; p++) total += pieces[p].kept;
    int cut = 0;
    while (pieces && cut < count && 2 * half < total) half += pieces[cut++].kept;
    return cut;
}

/* ------------------------------------------------------------ agreement */

/* The descriptor's fixed fields, then one slot per row of the field table
 * (FA_FORWARD_FIELDS, from FA_RING_AGREE_TABLE on): what every rank must share, and
 * what a disagreement on each is. */
enum { D_STATUS, D_B, D_S, D_HQ, D_HK, D_D, D_DV, D_DTYPE, D_SHARDING, D_PIECES, D_EXTRA, D_TABLE };
#define D_ROW(name, key, ctype, type, role, def, doc) +1
enum { D_COUNT = D_TABLE FA_FORWARD_FIELDS(D_ROW) };
#undef D_ROW
_Static_assert(D_COUNT == (int)FA_RING_AGREE_FIELDS && D_S == (int)FA_RING_AGREE_S_LOCAL &&
                   D_TABLE == (int)FA_RING_AGREE_TABLE,
               "the descriptor's fields are the header's");

#define D_ROW(name, key, ctype, type, role, def, doc) #name,
static const char *const desc_name[D_COUNT] = {"status",  "B",        "S_local", "Hq",     "Hk",       "D",
                                               "Dv",      "dtype",    "sharding", "pieces", "gradients",
                                               FA_FORWARD_FIELDS(D_ROW)};
#undef D_ROW

static fa_status desc_mismatch(int f)
{
    switch (f) {
    case D_B: case D_HQ: case D_HK: case D_D: case D_DV: return FA_ERR_SHAPE_MISMATCH;
    case D_DTYPE: return FA_ERR_DTYPE;
    case D_S: case D_STATUS: return FA_OK; /* lengths may differ; statuses are read first */
    default: return FA_ERR_INVALID_ARGUMENT;
    }
}

/* A table row's slot: an option's bits (zero-extended), an optional input's presence;
 * outputs, forms and derived extents are not agreed on (the ring refuses the forms). */
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

const char *fa_ring_agreement_name(int field)
{
    return field >= 0 && field < D_COUNT ? desc_name[field] : "";
}

void fa_ring_describe(const fa_ring_plan *plan, fa_status status, int64_t extra, int64_t desc[FA_RING_AGREE_FIELDS])
{
    if (!desc) return;
    memset(desc, 0, sizeof(int64_t) * D_COUNT);
    /* a plan the library cannot read describes a failure: the caller checked it first */
    if (status == FA_OK && (!plan || plan->struct_size < offsetof(fa_ring_plan, pieces) || !plan->call))
        status = FA_ERR_NULL_POINTER;
    desc[D_STATUS] = status;
    if (status != FA_OK) return;
    /* the fields each caller's structs have, past them the defaults */
    ring_rules r;
    memset(&r, 0, sizeof r);
    const fa_ring_plan pinit = FA_RING_PLAN_INIT;
    const fa_forward_args ainit = FA_FORWARD_ARGS_INIT;
    r.pl = pinit;
    r.call = ainit;
    memcpy(&r.pl, plan, plan->struct_size < sizeof r.pl ? plan->struct_size : sizeof r.pl);
    memcpy(&r.call, plan->call, plan->call->struct_size < sizeof r.call ? plan->call->struct_size : sizeof r.call);
    derive_rules(&r);
    /* the call as the ranks agree on it: over one sequence both causal alignments keep
     * j <= i, and a window side past every position is unbounded (window_side) */
    fa_forward_args a = r.call;
    a.causal = r.causal ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
    a.window_left = r.wl, a.window_right = r.wr;
    desc[D_B] = a.q.shape[0], desc[D_S] = a.q.shape[1], desc[D_HQ] = a.q.shape[2], desc[D_D] = a.q.shape[3];
    desc[D_HK] = a.k.shape[2], desc[D_DV] = a.v.shape[3];
    desc[D_DTYPE] = a.q.dtype;
    desc[D_SHARDING] = r.pl.sharding;
    desc[D_PIECES] = r.pl.pieces;
    desc[D_EXTRA] = extra;
    int f = D_TABLE;
#define D_ROW(name, key, ctype, type, role, def, doc) \
    desc[f++] = field_slot(&a, offsetof(fa_forward_args, name), FA_FIELD_##type, FA_ROLE_##role);
    FA_FORWARD_FIELDS(D_ROW)
#undef D_ROW
}

fa_status fa_ring_verdict(int nranks, const int64_t *all, int *who, int *field)
{
    int w = -1, f = -1;
    fa_status st = nranks < 1 || !all ? FA_ERR_INVALID_ARGUMENT : FA_OK;
    for (int x = 0; x < nranks && st == FA_OK; x++)
        if (all[x * D_COUNT + D_STATUS] != FA_OK) st = (fa_status)all[x * D_COUNT + D_STATUS], w = x;
    for (int x = 1; x < nranks && st == FA_OK; x++)
        for (int k = 0; k < D_COUNT && st == FA_OK; k++) {
            const fa_status m = desc_mismatch(k);
            if (m != FA_OK && all[x * D_COUNT + k] != all[k]) st = m, w = x, f = k;
        }
    if (who) *who = w;
    if (field) *field = f;
    return st;
}

/* The longest call any rank makes, Smax query rows against Smax keys at the end of
 * the sequence of N positions, judged by the core. The data is never read. */
static fa_status check_longest(fa_context *ctx, const ring_rules *r, int64_t Smax, int64_t N)
{
    static float never_read[1];
    const fa_forward_args *a = &r->call;
    const int64_t B = a->q.shape[0], Hq = a->q.shape[2], Hk = a->k.shape[2], D = a->q.shape[3], Dv = a->v.shape[3];
    fa_forward_args c = r->call;
    c.struct_size = sizeof c;
    c.q = fa_tensor_make(never_read, a->q.dtype, FA_LAYOUT_BSND, B, Smax, Hq, D);
    c.k = fa_tensor_make(never_read, a->q.dtype, FA_LAYOUT_BSND, B, Smax, Hk, D);
    c.v = fa_tensor_make(never_read, a->q.dtype, FA_LAYOUT_BSND, B, Smax, Hk, Dv);
    c.o = fa_tensor_make(never_read, FA_DTYPE_F32, FA_LAYOUT_BSND, B, Smax, Hq, Dv);
    c.lse = fa_tensor_contiguous(never_read, FA_DTYPE_F32, B, Hq, Smax, 1);
    c.q_start = c.k_start = N - Smax;
    const fa_status st = fa_forward_check(ctx, &c);
    return st == FA_OK ? FA_OK : fa_fail(ctx, st, "the ring's longest call: %s", fa_context_error(ctx));
}

fa_status fa_ring_check(fa_context *ctx, const fa_ring_plan *plan)
{
    ring_rules r;
    if (!ctx) return FA_ERR_NULL_CONTEXT;
    /* lengths are checked here by their own rule, so that a sum past FA_POSITION_MAX
     * is the core's verdict on the longest call */
    fa_status st = read_plan(ctx, plan, 0, 1, &r);
    if (st != FA_OK) return st;
    if (!r.pl.lengths) return fa_fail(ctx, FA_ERR_NULL_POINTER, "plan->lengths is NULL");
    int64_t Smax = 0, N = 0;
    for (int x = 0; x < r.pl.nranks; x++) {
        const int64_t s = r.pl.lengths[x];
        if (s < 0) return fa_fail(ctx, FA_ERR_INVALID_DIM, "plan->lengths[%d] is %lld", x, (long long)s);
        if (s > Smax) Smax = s;
        N = N > FA_POSITION_MAX - s ? FA_POSITION_MAX + 1 : N + s;
    }
    if ((st = check_longest(ctx, &r, Smax, N)) != FA_OK) return st;
    if (r.band_offsets && r.dropout)
        for (int x = 1; x < r.pl.nranks; x++)
            if (r.pl.lengths[x] != r.pl.lengths[0])
                return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                               "a window or ALiBi with dropout needs equal shard lengths (rank %d has %lld rows, "
                               "rank 0 %lld)",
                               x, (long long)r.pl.lengths[x], (long long)r.pl.lengths[0]);
    return read_plan(ctx, plan, 1, 1, &r); /* zig-zag parity, as every query reads it */
}
