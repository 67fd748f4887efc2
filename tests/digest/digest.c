/*
 * digest.c: a fixed matrix of calls through the public header, one hash of every
 * output byte per case, so that a restructuring can show every output unchanged, bit
 * for bit, against an older build (scripts/digest.sh builds this file against each
 * tree's own header and library and compares the lines).
 *
 *   digest [--threads 1,2,3] [--filter SUBSTRING]
 *
 * prints "isa=<path>" and then per thread count and case "t=<n> <case> <hash>" (the
 * FNV-1a hash of the case's outputs: o, lse, dropout mask, gradients, dsinks, a KV
 * cache after its append) or "t=<n> <case> status=<s>". FLASHATTN_ARCH and the other
 * FLASHATTN_* variables choose the path, as for any caller. Inputs come from a fixed
 * generator of bit patterns, so they need no conversion code and are the same for
 * every build. Forms an older header lacks (block masks) are left out by #ifdef;
 * settings an older library lacks print their status. Not a test: it checks nothing
 * itself, the comparison of two builds' lines is the check.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"

/* The matrix below overrides a base shape's fields case by case, on purpose. */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Woverride-init"
#endif

/* Settings by number, so this file builds against headers that predate their names. */
enum {
    P_THREADS = 1, P_ALGO = 2, P_KV_SPLITS = 7, P_KV_PACK = 8, P_F32_MATMUL = 9, P_QUANT_MATMUL = 10
};

/* ------------------------------------------------------------ inputs */

static uint64_t rng;

static uint32_t next32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* A value in about [-1, 1) as bits of `dtype`: f32, f16, bf16 normals of exponent
 * -6..-1, int8 codes in [-127, 127], fp8 codes without NaN. */
static void fill(void *p, fa_dtype dtype, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t r = next32();
        uint32_t sign = r & 1, e = 1 + (r >> 1) % 6, m = r >> 4;
        switch (dtype) {
        case FA_DTYPE_F32: {
            uint32_t b = sign << 31 | (127 - e) << 23 | (m & 0x7fffff);
            memcpy((float *)p + i, &b, 4);
            break;
        }
        case FA_DTYPE_F16: ((uint16_t *)p)[i] = (uint16_t)(sign << 15 | (15 - e) << 10 | (m & 0x3ff)); break;
        case FA_DTYPE_BF16: ((uint16_t *)p)[i] = (uint16_t)(sign << 15 | (127 - e) << 7 | (m & 0x7f)); break;
        case FA_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)((int)(m % 255) - 127); break;
        case FA_DTYPE_F8E4M3: ((uint8_t *)p)[i] = (uint8_t)(sign << 7 | (m % 0x70)); break;
        case FA_DTYPE_F8E5M2: ((uint8_t *)p)[i] = (uint8_t)(sign << 7 | (m % 0x78)); break;
        default: ((uint8_t *)p)[i] = (uint8_t)(m % 5 != 0); break; /* bool: 4 in 5 kept */
        }
    }
}

/* Every buffer of a case, freed together. */
#define MAX_BUFS 64
static void *bufs[MAX_BUFS];
static size_t buf_bytes[MAX_BUFS];
static int nbufs;

static void *alloc_buf(size_t bytes)
{
    if (nbufs == MAX_BUFS) {
        fprintf(stderr, "digest: too many buffers\n");
        exit(2);
    }
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "digest: out of memory\n");
        exit(2);
    }
    bufs[nbufs] = p;
    buf_bytes[nbufs++] = bytes;
    return p;
}

static void free_bufs(void)
{
    for (int i = 0; i < nbufs; i++) free(bufs[i]);
    nbufs = 0;
}

static void *random_buf(fa_dtype dtype, size_t n)
{
    void *p = alloc_buf(n * fa_dtype_size(dtype));
    fill(p, dtype, n);
    return p;
}

/* An output buffer, filled with a pattern the call must overwrite where it writes. */
static void *out_buf(fa_dtype dtype, size_t n)
{
    size_t bytes = n * fa_dtype_size(dtype);
    void *p = alloc_buf(bytes);
    memset(p, 0x5a, bytes);
    return p;
}

static fa_tensor tensor(void *data, fa_dtype dtype, fa_layout layout, int64_t b, int64_t s, int64_t h, int64_t d)
{
    return fa_tensor_make(data, dtype, layout, b, s, h, d);
}

/* ------------------------------------------------------------ the hash */

static uint64_t hash;

static void hash_bytes(const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) hash = (hash ^ c[i]) * 0x100000001b3ull;
}

static void hash_tensor(const fa_tensor *t)
{
    if (!t->data) return;
    size_t n = fa_dtype_size(t->dtype);
    for (int d = 0; d < 4; d++) n *= (size_t)t->shape[d];
    hash_bytes(t->data, n); /* every tensor here is contiguous in its own order */
}

/* ------------------------------------------------------------ a case */

typedef struct spec {
    const char *name;
    fa_dtype dtype, odtype;          /* q, k, v; o (0 = q's) */
    int64_t B, Sq, Sk, Hq, Hk, D, Dv;
    fa_layout layout;
    fa_causal causal;
    int64_t wl, wr;                  /* windows; both 0 = unbounded */
    float softcap, dropout;
    int alibi, bias, mask, sinks, lse;
    int varlen;                      /* 1: three packed sequences of lengths below */
    int cache;                       /* 0 none, 1 contiguous, 2 paged */
    fa_dtype cache_dtype;
    int latent, leftpad, batch_idx;  /* MLA v_in_k; leftpad; batch_idx (contiguous) */
    int64_t snew;                    /* new rows appended to the cache */
    int backward;
    int block_mask;                  /* 1 random blocks; N > 1: N documents of 128-row blocks */
    int algo;                        /* 0 auto */
    int64_t kv_splits, kv_pack, f32_matmul, quant_matmul; /* context settings; 0 = leave */
    int64_t call_splits;             /* fa_forward_args.kv_splits (headers with the field table) */
} spec;

static const int64_t vq[3] = {37, 1, 70}, vk[3] = {50, 64, 70};

static int64_t window(int64_t w)
{
    return w ? w : FA_WINDOW_UNBOUNDED;
}

#ifdef FA_BLOCK_MASK_INIT
/* Blocks of 16 rows by 32 keys, about half kept, a third of those partial. */
static fa_block_mask *make_block_mask(const spec *s, int64_t Sq, int64_t Sk)
{
    fa_block_mask *m = alloc_buf(sizeof *m);
    fa_block_mask init = FA_BLOCK_MASK_INIT;
    *m = init;
    m->block_q = 16;
    m->block_k = 32;
    m->q_blocks = (Sq + 15) / 16;
    m->heads = s->Hq;
    if (s->block_mask > 1) { /* documents: a long unit read in pieces of its readers' keys */
        m->block_q = m->block_k = 128;
        m->q_blocks = (Sq + 127) / 128;
        const int64_t nb = (Sk + 127) / 128, per = (nb + s->block_mask - 1) / s->block_mask, rows = m->heads * m->q_blocks;
        int64_t *off = alloc_buf((size_t)(rows + 1) * sizeof *off), e = 0;
        int32_t *idx = alloc_buf((size_t)(rows * per + 1) * sizeof *idx);
        for (int64_t r = 0; r < rows; r++) {
            off[r] = e;
            const int64_t d0 = r % m->q_blocks / per * per;
            for (int64_t j = d0; j < d0 + per && j < nb; j++) idx[e++] = (int32_t)j;
        }
        off[rows] = e;
        m->offsets = off;
        m->kv_blocks = idx;
        return m;
    }
    int64_t kb = (Sk + 31) / 32, rows = m->heads * m->q_blocks;
    int64_t *off = alloc_buf((size_t)(rows + 1) * sizeof *off);
    int32_t *idx = alloc_buf((size_t)(rows * kb + 1) * sizeof *idx);
    int64_t *part = alloc_buf((size_t)(rows * kb + 1) * sizeof *part);
    m->n_partial = 3;
    uint8_t *bits = alloc_buf((size_t)(m->n_partial * 16 * 4));
    fill(bits, FA_DTYPE_BOOL, (size_t)(m->n_partial * 16 * 4));
    for (int64_t i = 0; i < m->n_partial * 16 * 4; i++) bits[i] = (uint8_t)next32();
    int64_t e = 0;
    for (int64_t r = 0; r < rows; r++) {
        off[r] = e;
        for (int64_t j = kb - 1; j >= 0; j--) { /* any order: descending */
            uint32_t x = next32();
            if (x % 2) continue;
            idx[e] = (int32_t)j;
            part[e++] = x % 3 == 0 ? (int64_t)(x >> 8) % m->n_partial : -1;
        }
    }
    off[rows] = e;
    m->offsets = off;
    m->kv_blocks = idx;
    m->partial = part;
    m->bits = bits;
    return m;
}
#endif

/* The KV cache of a case: per batch row `have` rows before the append. */
static fa_kv_cache *make_cache(const spec *s, const int32_t *have, int64_t smax)
{
    fa_kv_cache *c = alloc_buf(sizeof *c);
    fa_kv_cache init = FA_KV_CACHE_INIT;
    *c = init;
    int64_t B = s->B, Hk = s->Hk, rows_b = smax, nb = B;
    int64_t page = 16, max_pages = (smax + page - 1) / page;
    if (s->cache == 2) { /* paged: a pool of pages in shuffled order, one spare */
        nb = B * max_pages + 1;
        rows_b = page;
        int32_t *table = alloc_buf((size_t)(B * max_pages) * sizeof *table);
        for (int64_t i = 0; i < B * max_pages; i++) table[i] = (int32_t)((i * 7 + 3) % (B * max_pages + 1));
        c->block_table = table;
        c->max_pages = max_pages;
    }
    if (s->batch_idx) { /* cache rows in reverse, one spare */
        nb = B + 1;
        int32_t *bi = alloc_buf((size_t)B * sizeof *bi);
        for (int64_t b = 0; b < B; b++) bi[b] = (int32_t)(B - b);
        c->batch_idx = bi;
    }
    fa_dtype cd = s->cache_dtype;
    c->k = tensor(random_buf(cd, (size_t)(nb * rows_b * Hk * s->D)), cd, FA_LAYOUT_BSND, nb, rows_b, Hk, s->D);
    if (s->latent)
        c->v_in_k = 1;
    else
        c->v = tensor(random_buf(cd, (size_t)(nb * rows_b * Hk * s->Dv)), cd, FA_LAYOUT_BSND, nb, rows_b, Hk, s->Dv);
    if (cd == FA_DTYPE_I8 || cd == FA_DTYPE_F8E4M3 || cd == FA_DTYPE_F8E5M2) {
        size_t n = (size_t)(nb * rows_b * Hk);
        float *ks = alloc_buf(n * 4), *vs = alloc_buf(n * 4);
        for (size_t i = 0; i < n; i++) {
            ks[i] = 0.002f + (float)(next32() % 1000) * 1e-5f;
            vs[i] = 0.003f + (float)(next32() % 1000) * 1e-5f;
        }
        c->k_scale = fa_tensor_contiguous(ks, FA_DTYPE_F32, nb, rows_b, Hk, 1);
        if (!s->latent) c->v_scale = fa_tensor_contiguous(vs, FA_DTYPE_F32, nb, rows_b, Hk, 1);
    }
    int32_t *sl = alloc_buf((size_t)B * sizeof *sl);
    memcpy(sl, have, (size_t)B * sizeof *sl);
    c->seqlens = sl;
    if (s->leftpad) {
        int32_t *lp = alloc_buf((size_t)B * sizeof *lp);
        for (int64_t b = 0; b < B; b++) lp[b] = have[b] / 3;
        c->leftpad = lp;
    }
    return c;
}

static void hash_cache(const fa_kv_cache *c)
{
    hash_tensor(&c->k);
    hash_tensor(&c->v);
    hash_tensor(&c->k_scale);
    hash_tensor(&c->v_scale);
}

static int set(fa_context *ctx, int param, int64_t value)
{
    return value ? (int)fa_context_set(ctx, (fa_param)param, value) : 0;
}

/* Runs case s on ctx; returns the status, the hash in `hash`. */
static int run(fa_context *ctx, const spec *s)
{
    fa_dtype dt = s->dtype, odt = s->odtype ? s->odtype : s->dtype;
    int64_t B = s->B, Sq = s->Sq, Sk = s->Sk, Hq = s->Hq, Hk = s->Hk, D = s->D, Dv = s->Dv;
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    int st;
    hash = 0xcbf29ce484222325ull;
    rng = 0x9e3779b97f4a7c15ull;
    for (const char *c = s->name; *c; c++) rng = (rng ^ (unsigned char)*c) * 0x100000001b3ull | 1;
    int64_t qB = B, qS = Sq, kS = Sk;
    int32_t *cuq = NULL, *cuk = NULL;
    if (s->varlen) {
        cuq = alloc_buf(4 * 4);
        cuk = alloc_buf(4 * 4);
        for (int i = 0; i < 3; i++) {
            cuq[i + 1] = cuq[i] + (int32_t)(s->cache ? s->snew : vq[i]);
            cuk[i + 1] = cuk[i] + (int32_t)(s->cache ? s->snew : vk[i]);
        }
        qB = 1;
        qS = cuq[3];
        kS = cuk[3];
        B = 3;
        a.cu_seqlens_q = cuq;
        a.cu_seqlens_k = cuk;
        a.num_seqs = 3;
    }
    if (s->cache && !s->varlen) kS = s->snew;
    a.q = tensor(random_buf(dt, (size_t)(qB * qS * Hq * D)), dt, s->layout, qB, qS, Hq, D);
    if (kS) {
        int64_t kB = s->varlen ? 1 : B;
        a.k = tensor(random_buf(dt, (size_t)(kB * kS * Hk * D)), dt, s->layout, kB, kS, Hk, D);
        if (!s->latent)
            a.v = tensor(random_buf(dt, (size_t)(kB * kS * Hk * Dv)), dt, s->layout, kB, kS, Hk, Dv);
    }
    a.o = tensor(out_buf(odt, (size_t)(qB * qS * Hq * Dv)), odt, s->layout, qB, qS, Hq, Dv);
    if (s->lse || s->backward)
        a.lse = fa_tensor_contiguous(out_buf(FA_DTYPE_F32, (size_t)(qB * Hq * qS)), FA_DTYPE_F32, qB, Hq, qS, 1);
    a.causal = s->causal;
    a.window_left = window(s->wl);
    a.window_right = window(s->wr);
    a.softcap = s->softcap;
    if (s->alibi) {
        float *sl = alloc_buf((size_t)Hq * 4);
        for (int64_t h = 0; h < Hq; h++) sl[h] = 0.5f / (float)(h + 1);
        a.alibi_slopes = sl;
    }
    if (s->bias) a.bias = fa_tensor_contiguous(random_buf(FA_DTYPE_F32, (size_t)(Hq * Sq * Sk)), FA_DTYPE_F32, 1, Hq, Sq, Sk);
    if (s->mask) a.mask = fa_tensor_contiguous(random_buf(FA_DTYPE_BOOL, (size_t)(B * Sq * Sk)), FA_DTYPE_BOOL, B, 1, Sq, Sk);
    if (s->dropout > 0) {
        a.dropout_p = s->dropout;
        a.dropout_seed = 0x1234567890abcdefull;
        a.dropout_offset = 17;
        if (!s->varlen && !s->backward)
            a.dropout_mask = fa_tensor_contiguous(out_buf(FA_DTYPE_BOOL, (size_t)(B * Hq * Sq * Sk)), FA_DTYPE_BOOL,
                                                  B, Hq, Sq, Sk);
    }
    if (s->sinks) {
        float *sk = alloc_buf((size_t)Hq * 4);
        for (int64_t h = 0; h < Hq; h++) sk[h] = (h % 3 == 2) ? -1.0f / 0.0f : 0.25f * (float)h - 0.5f;
        a.sinks = sk;
    }
#ifdef FA_FORWARD_FIELDS
    a.kv_splits = s->call_splits;
#else
    if (s->call_splits) return -1;
#endif
    fa_kv_cache *cache = NULL;
    if (s->cache) {
        int32_t have[8];
        for (int64_t b = 0; b < B; b++) have[b] = (int32_t)(s->Sk - 13 * b);
        cache = make_cache(s, have, s->Sk + s->snew + 5);
        a.kv_cache = cache;
    }
#ifdef FA_BLOCK_MASK_INIT
    if (s->block_mask) a.block_mask = make_block_mask(s, s->varlen ? 70 : Sq, s->varlen ? 70 : Sk + (s->cache ? s->snew : 0));
#else
    if (s->block_mask) return -1;
#endif
    if ((st = set(ctx, P_ALGO, s->algo)) || (st = set(ctx, P_KV_SPLITS, s->kv_splits)) ||
        (st = set(ctx, P_KV_PACK, s->kv_pack)) || (st = set(ctx, P_F32_MATMUL, s->f32_matmul)) ||
        (st = set(ctx, P_QUANT_MATMUL, s->quant_matmul)))
        return st;
    st = (int)fa_forward(ctx, &a);
    if (st) return st;
    hash_tensor(&a.o);
    hash_tensor(&a.lse);
    hash_tensor(&a.dropout_mask);
    if (cache) hash_cache(cache);
    if (s->backward) {
        fa_backward_args g = FA_BACKWARD_ARGS_INIT;
        int64_t kB = s->varlen ? 1 : B;
        g.fwd = &a;
        g.do_ = tensor(random_buf(dt, (size_t)(qB * qS * Hq * Dv)), dt, s->layout, qB, qS, Hq, Dv);
        g.dq = tensor(out_buf(odt, (size_t)(qB * qS * Hq * D)), odt, s->layout, qB, qS, Hq, D);
        g.dk = tensor(out_buf(odt, (size_t)(kB * kS * Hk * D)), odt, s->layout, kB, kS, Hk, D);
        g.dv = tensor(out_buf(odt, (size_t)(kB * kS * Hk * Dv)), odt, s->layout, kB, kS, Hk, Dv);
        if (s->sinks) g.dsinks = out_buf(FA_DTYPE_F32, (size_t)Hq);
        st = (int)fa_backward(ctx, &g);
        if (st) return st;
        hash_tensor(&g.dq);
        hash_tensor(&g.dk);
        hash_tensor(&g.dv);
        if (g.dsinks) hash_bytes(g.dsinks, (size_t)Hq * 4);
    }
    return 0;
}

/* fa_merge_states over three parts. */
static int run_merge(fa_context *ctx)
{
    hash = 0xcbf29ce484222325ull;
    rng = 77;
    fa_tensor o[3], l[3];
    for (int i = 0; i < 3; i++) {
        o[i] = tensor(random_buf(FA_DTYPE_F32, 2 * 33 * 4 * 48), FA_DTYPE_F32, FA_LAYOUT_BSND, 2, 33, 4, 48);
        float *ls = random_buf(FA_DTYPE_F32, 2 * 4 * 33);
        for (int j = 0; j < 2 * 4 * 33; j++) ls[j] *= 8.0f;
        ls[i * 5] = -1.0f / 0.0f;
        l[i] = fa_tensor_contiguous(ls, FA_DTYPE_F32, 2, 4, 33, 1);
    }
    fa_tensor out = tensor(out_buf(FA_DTYPE_BF16, 2 * 33 * 4 * 48), FA_DTYPE_BF16, FA_LAYOUT_BSND, 2, 33, 4, 48);
    fa_tensor lse = fa_tensor_contiguous(out_buf(FA_DTYPE_F32, 2 * 4 * 33), FA_DTYPE_F32, 2, 4, 33, 1);
    int st = (int)fa_merge_states(ctx, 3, o, l, &out, &lse);
    if (st) return st;
    hash_tensor(&out);
    hash_tensor(&lse);
    return 0;
}

/* ------------------------------------------------------------ the matrix */

#define F32 FA_DTYPE_F32
#define F16 FA_DTYPE_F16
#define BF16 FA_DTYPE_BF16
#define BR FA_CAUSAL_BOTTOM_RIGHT
#define TL FA_CAUSAL_TOP_LEFT
/* dense shape: B=2 Sq=67 Sk=131 Hq=4 Hk=2 D=Dv=64 */
#define DENSE(dt) .dtype = dt, .B = 2, .Sq = 67, .Sk = 131, .Hq = 4, .Hk = 2, .D = 64, .Dv = 64, .lse = 1
/* decode: B=3, one row, Hq=8 over Hk=2, D=Dv=64, a cache of ~Sk rows */
#define DECODE(dt, cd) .dtype = dt, .B = 3, .Sq = 1, .Sk = 300, .Hq = 8, .Hk = 2, .D = 64, .Dv = 64, .lse = 1, \
                       .cache = 1, .cache_dtype = cd, .snew = 1

static const spec cases[] = {
    {"fwd_f32", DENSE(F32)},
    {"fwd_bf16", DENSE(BF16)},
    {"fwd_f16", DENSE(F16)},
    {"fwd_bf16_out_f32", DENSE(BF16), .odtype = F32},
    {"fwd_f32_bnsd", DENSE(F32), .layout = FA_LAYOUT_BNSD},
    {"fwd_f32_d128_dv64", .dtype = F32, .B = 1, .Sq = 300, .Sk = 300, .Hq = 2, .Hk = 2, .D = 128, .Dv = 64, .lse = 1},
    {"fwd_bf16_d128_causal", .dtype = BF16, .B = 1, .Sq = 300, .Sk = 300, .Hq = 2, .Hk = 2, .D = 128, .Dv = 128,
     .lse = 1, .causal = BR},
    {"fwd_bf16_512_d128", .dtype = BF16, .B = 1, .Sq = 512, .Sk = 512, .Hq = 2, .Hk = 1, .D = 128, .Dv = 128, .lse = 1},
    {"fwd_f32_d80", .dtype = F32, .B = 1, .Sq = 45, .Sk = 77, .Hq = 3, .Hk = 1, .D = 80, .Dv = 80, .lse = 1},
    {"fwd_f32_causal_br", DENSE(F32), .causal = BR},
    {"fwd_bf16_causal_tl", DENSE(BF16), .causal = TL},
    {"fwd_f16_causal_br", DENSE(F16), .causal = BR},
    {"fwd_f32_window_softcap", DENSE(F32), .wl = 17, .wr = 5, .softcap = 30.0f},
    {"fwd_bf16_window_softcap", DENSE(BF16), .wl = 40, .wr = 0, .softcap = 20.0f, .causal = BR},
    {"fwd_f32_alibi", DENSE(F32), .alibi = 1, .causal = BR},
    {"fwd_bf16_alibi", DENSE(BF16), .alibi = 1},
    {"fwd_f32_bias", DENSE(F32), .bias = 1},
    {"fwd_bf16_bias", DENSE(BF16), .bias = 1},
    {"fwd_f32_mask", DENSE(F32), .mask = 1},
    {"fwd_f16_mask", DENSE(F16), .mask = 1},
    {"fwd_f32_dropout", DENSE(F32), .dropout = 0.15f},
    {"fwd_bf16_dropout_causal", DENSE(BF16), .dropout = 0.1f, .causal = BR},
    {"fwd_f32_sinks", DENSE(F32), .sinks = 1},
    {"fwd_bf16_sinks_window", DENSE(BF16), .sinks = 1, .wl = 20, .wr = 20},
    {"fwd_f32_mqa", DENSE(F32), .Hq = 8, .Hk = 1},
    {"fwd_bf16_mqa", DENSE(BF16), .Hq = 8, .Hk = 1, .causal = BR},
    {"fwd_f32_splitkv4", DENSE(F32), .kv_splits = 4},
    {"fwd_bf16_call_splits3", DENSE(BF16), .call_splits = 3, .causal = BR},
    {"fwd_f32_call_splits2_over_ctx5", DENSE(F32), .call_splits = 2, .kv_splits = 5},
    {"fwd_f32_pack_always", DENSE(F32), .kv_pack = 2},
    {"fwd_bf16_pack_never", DENSE(BF16), .kv_pack = 1},
    {"fwd_f32_bf16x3", DENSE(F32), .f32_matmul = 1},
    {"fwd_f32_bf16mm", DENSE(F32), .f32_matmul = 2, .causal = BR},
    {"fwd_f32_bf16x3_pack", DENSE(F32), .f32_matmul = 1, .kv_pack = 2, .causal = BR},
    {"fwd_f32_bf16mm_pack_mqa", DENSE(F32), .f32_matmul = 2, .kv_pack = 2, .Hq = 8, .Hk = 1},
    {"fwd_bf16_pack_always_gqa", DENSE(BF16), .kv_pack = 2, .Hq = 8, .Hk = 2, .wl = 30, .wr = 30},
    {"fwd_f32_300_trim_causal", .dtype = F32, .B = 1, .Sq = 300, .Sk = 300, .Hq = 2, .Hk = 1, .D = 64, .Dv = 64,
     .lse = 1, .causal = BR},
    {"fwd_f32_standard", DENSE(F32), .algo = FA_ALGO_STANDARD, .causal = BR},
    {"fwd_bf16_standard", DENSE(BF16), .algo = FA_ALGO_STANDARD, .softcap = 10.0f},
    {"varlen_f32", DENSE(F32), .varlen = 1},
    {"varlen_bf16_causal", DENSE(BF16), .varlen = 1, .causal = BR},
    {"varlen_f16_window_alibi", DENSE(F16), .varlen = 1, .wl = 10, .wr = 3, .alibi = 1},
    {"varlen_f32_sinks_split", DENSE(F32), .varlen = 1, .sinks = 1, .kv_splits = 3},
    {"cache_f32", DECODE(F32, F32)},
    {"cache_bf16", DECODE(BF16, BF16)},
    {"cache_f16_in_bf16", DECODE(F16, BF16)},
    {"cache_bf16_prefill_causal", DECODE(BF16, BF16), .Sq = 20, .snew = 20, .causal = BR},
    {"cache_paged_bf16_prefill", DECODE(BF16, BF16), .cache = 2, .Sq = 40, .snew = 40, .causal = BR},
    {"cache_i8_bf16_prefill", DECODE(BF16, FA_DTYPE_I8), .Sq = 40, .snew = 40, .causal = BR},
    {"cache_f16_cache_bf16_q_prefill", DECODE(BF16, F16), .Sq = 24, .snew = 24},
    {"cache_mla_latent_prefill", .dtype = BF16, .B = 2, .Sq = 32, .Sk = 200, .Hq = 4, .Hk = 1, .D = 96, .Dv = 64,
     .lse = 1, .cache = 1, .cache_dtype = BF16, .snew = 32, .latent = 1, .causal = BR},
    {"cache_f32_batch_idx", DECODE(F32, F32), .batch_idx = 1},
    {"cache_bf16_leftpad", DECODE(BF16, BF16), .leftpad = 1, .alibi = 1},
    {"cache_paged_f32", DECODE(F32, F32), .cache = 2},
    {"cache_paged_bf16_window", DECODE(BF16, BF16), .cache = 2, .wl = 100, .wr = 0, .causal = BR},
    {"cache_paged_varlen", DECODE(BF16, BF16), .cache = 2, .varlen = 1, .snew = 2, .Sq = 2, .causal = BR},
    {"cache_i8", DECODE(F32, FA_DTYPE_I8)},
    {"cache_i8_paged_bf16", DECODE(BF16, FA_DTYPE_I8), .cache = 2},
    {"cache_i8_quant_i8", DECODE(BF16, FA_DTYPE_I8), .quant_matmul = 1},
    /* int8 QK^T over float keys the library smooths and quantises (the fused kernel's
     * prologue on amx and amx-model, flash_task_q8's elsewhere) */
    {"fwd_bf16_512_d128_quant_i8", .dtype = BF16, .B = 1, .Sq = 512, .Sk = 512, .Hq = 2, .Hk = 1, .D = 128,
     .Dv = 128, .lse = 1, .causal = BR, .quant_matmul = 1},
    {"fwd_bf16_quant_i8_gqa_window", DENSE(BF16), .Hq = 8, .Hk = 2, .wl = 30, .wr = 30, .quant_matmul = 1},
    {"varlen_bf16_quant_i8", DENSE(BF16), .varlen = 1, .causal = BR, .quant_matmul = 1},
    {"cache_bf16_prefill_quant_i8", DECODE(BF16, BF16), .Sq = 40, .snew = 40, .causal = BR, .quant_matmul = 1},
    {"cache_mla_latent_prefill_quant_i8", .dtype = BF16, .B = 2, .Sq = 32, .Sk = 200, .Hq = 4, .Hk = 1, .D = 96,
     .Dv = 64, .lse = 1, .cache = 1, .cache_dtype = BF16, .snew = 32, .latent = 1, .causal = BR, .quant_matmul = 1},
    {"fwd_f32_quant_i8x2", DENSE(F32), .quant_matmul = 2},
    {"cache_i8_quant_i8x2", DECODE(F32, FA_DTYPE_I8), .quant_matmul = 2},
    {"cache_fp8_e4m3", DECODE(BF16, FA_DTYPE_F8E4M3)},
    {"cache_fp8_e5m2", DECODE(F32, FA_DTYPE_F8E5M2), .cache = 2},
    {"cache_mla_latent", .dtype = BF16, .B = 2, .Sq = 1, .Sk = 200, .Hq = 16, .Hk = 1, .D = 96, .Dv = 64, .lse = 1,
     .cache = 1, .cache_dtype = BF16, .snew = 1, .latent = 1},
    /* a large d: the fused kernel's strips of several 32-row sub-strips */
    {"cache_mla_latent_d576", .dtype = BF16, .B = 1, .Sq = 1, .Sk = 300, .Hq = 128, .Hk = 1, .D = 576, .Dv = 512,
     .lse = 1, .cache = 1, .cache_dtype = BF16, .snew = 1, .latent = 1},
    {"cache_mla_latent_d576_prefill", .dtype = BF16, .B = 1, .Sq = 2, .Sk = 200, .Hq = 50, .Hk = 1, .D = 576,
     .Dv = 512, .lse = 1, .cache = 1, .cache_dtype = BF16, .snew = 2, .latent = 1, .causal = BR},
    {"fwd_bf16_d320_causal", .dtype = BF16, .B = 1, .Sq = 300, .Sk = 300, .Hq = 1, .Hk = 1, .D = 320, .Dv = 256,
     .lse = 1, .causal = BR},
    {"cache_mla_latent_paged_i8", .dtype = BF16, .B = 2, .Sq = 1, .Sk = 200, .Hq = 16, .Hk = 1, .D = 96, .Dv = 64,
     .lse = 1, .cache = 2, .cache_dtype = FA_DTYPE_I8, .snew = 1, .latent = 1},
    {"cache_long_split_planned", DECODE(BF16, BF16), .Sk = 2100, .B = 1},
    {"cache_call_splits7", DECODE(BF16, BF16), .call_splits = 7},
    {"cache_splitkv5_sinks", DECODE(F32, F32), .kv_splits = 5, .sinks = 1},
    {"bwd_f32", DENSE(F32), .backward = 1},
    {"bwd_bf16_causal", DENSE(BF16), .backward = 1, .causal = BR},
    {"bwd_f16_window_softcap", DENSE(F16), .backward = 1, .wl = 30, .wr = 2, .softcap = 25.0f},
    {"bwd_f32_dropout", DENSE(F32), .backward = 1, .dropout = 0.2f},
    {"bwd_bf16_dropout_sinks", DENSE(BF16), .backward = 1, .dropout = 0.1f, .sinks = 1, .causal = BR},
    {"bwd_f32_sinks_alibi", DENSE(F32), .backward = 1, .sinks = 1, .alibi = 1},
    {"bwd_f32_bias_mask", DENSE(F32), .backward = 1, .bias = 1, .mask = 1},
    {"bwd_f32_mqa", DENSE(F32), .backward = 1, .Hq = 8, .Hk = 1},
    {"bwd_varlen_bf16", DENSE(BF16), .backward = 1, .varlen = 1, .causal = BR},
    {"bwd_f32_d128", .dtype = F32, .B = 1, .Sq = 300, .Sk = 300, .Hq = 2, .Hk = 1, .D = 128, .Dv = 128,
     .backward = 1, .causal = BR},
    {"bwd_bf16_standard", DENSE(BF16), .backward = 1, .algo = FA_ALGO_STANDARD},
    {"bmask_f32", DENSE(F32), .block_mask = 1},
    {"bmask_bf16_causal", DENSE(BF16), .block_mask = 1, .causal = BR},
    {"bmask_varlen_f32", DENSE(F32), .block_mask = 1, .varlen = 1},
    {"bmask_cache_bf16", DECODE(BF16, BF16), .block_mask = 1, .Sq = 4, .snew = 4},
    {"bmask_bwd_f32", DENSE(F32), .block_mask = 1, .backward = 1},
    /* a unit over the packing's size (FA_PACK_UNIT_MAX) whose tasks each read a document */
    {"bmask_docs_f32", .dtype = F32, .B = 1, .Sq = 4096, .Sk = 4096, .Hq = 1, .Hk = 1, .D = 128, .Dv = 128,
     .lse = 1, .block_mask = 8, .kv_pack = 2}, /* dense f32 rows: packed when asked */
    {"bmask_docs_bf16", .dtype = BF16, .B = 1, .Sq = 8192, .Sk = 8192, .Hq = 1, .Hk = 1, .D = 128, .Dv = 128,
     .lse = 1, .block_mask = 16},
    {"bmask_bwd_bf16_sinks", DENSE(BF16), .block_mask = 1, .backward = 1, .sinks = 1},
};

static int parse_threads(const char *s, int *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        out[n++] = atoi(s);
        while (*s && *s != ',') s++;
        if (*s == ',') s++;
    }
    return n;
}

int main(int argc, char **argv)
{
    int threads[8] = {1, 2, 3}, nt = 3;
    const char *filter = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            nt = parse_threads(argv[++i], threads, 8);
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc)
            filter = argv[++i];
        else {
            fprintf(stderr, "usage: digest [--threads 1,2,3] [--filter SUBSTRING]\n");
            return 2;
        }
    }
    fa_context *ctx = NULL;
    fa_status cs = fa_context_create(&ctx);
    if (cs != FA_OK) {
        printf("isa=unavailable status=%d\n", (int)cs);
        return 0;
    }
    printf("isa=%s\n", fa_context_isa(ctx));
    fa_context_free(ctx);
    for (int t = 0; t < nt; t++) {
        for (size_t c = 0; c <= sizeof cases / sizeof cases[0]; c++) {
            const char *name = c < sizeof cases / sizeof cases[0] ? cases[c].name : "merge_states";
            if (filter && !strstr(name, filter)) continue;
            /* a fresh context per case: settings never leak into the next */
            if (fa_context_create(&ctx) != FA_OK || fa_context_set(ctx, (fa_param)P_THREADS, threads[t]) != FA_OK) {
                fprintf(stderr, "digest: no context\n");
                return 2;
            }
            int st = c < sizeof cases / sizeof cases[0] ? run(ctx, &cases[c]) : run_merge(ctx);
            if (st == -1)
                printf("t=%d %s absent\n", threads[t], name);
            else if (st)
                printf("t=%d %s status=%d\n", threads[t], name, st);
            else
                printf("t=%d %s %016llx\n", threads[t], name, (unsigned long long)hash);
            fflush(stdout);
            fa_context_free(ctx);
            free_bufs();
        }
    }
    return 0;
}
