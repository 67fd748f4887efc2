/*
 * kv.h: reading K and V rows, wherever they live: a dense tensor, a packed
 * varlen batch, a contiguous or paged KV cache, int8 with per-row scales. Every
 * tiled loop reaches K/V through these, so the loops stay as they are when a cache
 * form is added: cache.h places key j (fa_cache_slot), this file reads the row there.
 */
#ifndef FA_KV_H
#define FA_KV_H

#include "cache.h"

/*
 * A K/V source: how a sequence view reaches its key and value rows. One per storage
 * form (dense rows, paged blocks, quantised codes with scales, dense or paged), chosen
 * once per call by validation (fa_kv_source_of) and carried in fa_problem.kv by every
 * view, so that the tiled loops ask the source and never test the form. A latent V
 * (v_in_k) is no source of its own: its view is K's first Dv columns in K's source.
 * which: K (0) or V (1); rows are keys j0 .. j0+cols-1 of kv head hk.
 */
struct fa_kv_source {
    const char *name;
    int scaled; /* rows are int8 or fp8 codes, each with a scale (fa_dtype_is_quant) */
    /* pointers to the rows, and their scales (scaled sources only; others leave them) */
    void (*row_ptrs)(const fa_problem *p, const fa_view *s, int which, int64_t j0, int64_t cols, int64_t hk,
                     const void **ptr, float *scale);
    /* the rows as f32, dim floats each (see fa_kv_tile_f32) */
    const float *(*tile_f32)(const fa_problem *p, const fa_view *s, int which, const fa_kernels *kern, int64_t j0,
                             int64_t cols, int64_t hk, int64_t dim, float *scratch, int64_t *ld);
    /* the rows as bf16 for the pair kernels, in place where they are evenly spaced, else
     * gathered into scratch (cols * dim), dim apart; *ld in elements. Float sources of
     * bf16 rows only; NULL for codes. */
    const uint16_t *(*tile_u16)(const fa_problem *p, const fa_view *s, int which, int64_t j0, int64_t cols, int64_t hk,
                                int64_t dim, uint16_t *scratch, int64_t *ld);
};
/* The source of problem p's K/V views: paged when it has a block table, scaled when
 * its cache is quantised, else dense. */
const fa_kv_source *fa_kv_source_of(const fa_problem *p);

/* K (which = 0) or V (1) row j of kv head hk in a dense or per-sequence view, and its
 * int8 scale (1 when not quantised; scale may be NULL). */
static inline const void *fa_kv_row(const fa_problem *p, const fa_view *s, int which, int64_t j, int64_t hk,
                                    float *scale)
{
    const fa_tensor *t = which ? &s->v : &s->k;
    const fa_slot at = fa_cache_slot(s->pages, p->page_size, 0, j); /* a view's rows start at block 0 */
    const int64_t off = at.blk * t->stride[0] + at.row * t->stride[1] + hk * t->stride[2];
    if (scale) {
        const fa_tensor *st = which ? &s->v_scale : &s->k_scale;
        *scale = p->quant
                     ? ((const float *)st->data)[at.blk * st->stride[0] + at.row * st->stride[1] + hk * st->stride[2]]
                     : 1.0f;
    }
    return (const char *)t->data + off * (int64_t)fa_dtype_size(t->dtype);
}

/* The small-row kernels' element type (FA_KV_*) of a dtype. */
int fa_kv_type(fa_dtype d);

/* K (which 0) or V (1) rows j0 .. j0+cols-1 of kv head hk as f32 for the wide kernels:
 * zero-copy where the rows are f32 and evenly spaced, else converted into scratch
 * (cols * dim floats). *ld receives the row distance in floats. */
static inline const float *fa_kv_tile_f32(const fa_problem *p, const fa_view *s, int which, const fa_kernels *kern,
                                          int64_t j0, int64_t cols, int64_t hk, int64_t dim, float *scratch,
                                          int64_t *ld)
{
    return p->kv->tile_f32(p, s, which, kern, j0, cols, hk, dim, scratch, ld);
}

/* Pointers to K (which 0) or V (1) rows j0 .. j0+cols-1 of kv head hk, and their
 * int8 scales, for the small-row kernels. */
static inline void fa_kv_row_ptrs(const fa_problem *p, const fa_view *s, int which, int64_t j0, int64_t cols,
                                  int64_t hk, const void **ptr, float *scale)
{
    p->kv->row_ptrs(p, s, which, j0, cols, hk, ptr, scale);
}

/* ... as bf16 rows for the pair kernels (the source's tile_u16). */
static inline const uint16_t *fa_kv_tile_u16(const fa_problem *p, const fa_view *s, int which, int64_t j0, int64_t cols,
                                             int64_t hk, int64_t dim, uint16_t *scratch, int64_t *ld)
{
    return p->kv->tile_u16(p, s, which, j0, cols, hk, dim, scratch, ld);
}

/* Rows with a non-unit inner stride copied, element for element in their own
 * dtype, into dst (untyped: any K/V dtype; room for cols * dim floats); ptr is
 * repointed at the copies. */
void fa_kv_gather_strided(const fa_tensor *t, const void **ptr, int64_t cols, int64_t dim, void *dst);

/*
 * Packed K/V: one (sequence, kv head)'s rows copied once into the layout the wide
 * kernels read best, and shared by every query block and head that reads them,
 * instead of converting or re-gathering them for each (query block, key tile):
 *   f32 form:  k[j][x], v[j][e] as f32 rows (any source dtype, cache, int8 scale);
 *   bf16 form: k[j][x] as bf16 rows, V as row pairs from key 0 (kernels.h's
 *              pack_pairs_bf16), which pv_bf16 (and a tile unit) multiplies;
 *   K^T form:  the bf16 form's V pairs, and K as the B operand of Q K^T on a tile
 *              unit (the fused forward, kernels.h's fwd_bf16): pack_kt_bf16's blocks
 *              of 16 keys from key0, ldk = 16 FA_KT_PAIRS(D) dwords each, so a tile
 *              reads them from block (j0 - key0) / 16 when j0 - key0 is a multiple of 16;
 *   split form (f32 as T bf16 products, FA_PARAM_F32_MATMUL, T = 3 or 1): K rows
 *              as T * D bf16, [hi | lo | hi] (T = 1: [hi]), V's hi rows as pairs from
 *              key 0 and (T = 3) after them V's lo rows as pairs (fa_split_row);
 *   K^T split form (the split form for the fused forward): the split K rows as the
 *              K^T form's blocks (depth T * D), V as the split form's.
 * Rows are fa_packed_ld apart, so the kernels get dense, cache-friendly rows
 * whatever the caller's strides. A tile at key j0 of a unit from key key0 reads
 * k + (j0 - key0) * ldk; its V pairs in the bf16 form start at pair (j0 - key0) / 2,
 * so only a tile with an even j0 uses them (key0 is even).
 */
typedef struct fa_kv_packing {
    int bf16;           /* the bf16 form, the K^T form or the split form (bf16 pairs too) */
    int kt;             /* the K^T forms (ldk: dwords per block of 16 keys) */
    int terms;          /* the split forms: T; else 0 */
    int64_t ldk, ldv;   /* f32 form: floats; bf16 form: uint16 (K), dwords (V pairs) */
    int64_t v_offset;   /* bytes from a unit's start to its V */
    int64_t vlo_offset; /* the split form, T = 3: bytes from a unit's start to V's lo pairs */
    int64_t unit_bytes; /* one unit (or chunk) of sk keys, a multiple of 64 */
} fa_kv_packing;
/* The form packing takes for problem p: 1 bf16, 0 f32, FA_KV_FORM_SPLIT(T) split,
 * -1 none. mode is FA_PARAM_KV_PACK's (0 auto: where the wide loop would otherwise
 * convert, gather, split or pair rows per tile, or read rows strided badly for the
 * caches; 1 never; 2 always); bf16_dot: bf16 inputs multiply as bf16 pairs; mm_terms:
 * f32 inputs as that many bf16 products (0: ieee). A forward whose bf16 tiles take the
 * fused kernel (kernels.h, fwd_bf16) packs the bf16 form's units as FA_KV_FORM_KT. */
#define FA_KV_FORM_SPLIT(T) (1 + (T))
#define FA_KV_FORM_KT 16
#define FA_KV_FORM_KT_SPLIT(T) (FA_KV_FORM_KT + (T))
int fa_kv_packing_form(const fa_problem *p, int bf16_dot, int mm_terms, int mode);
/* The layout of units of sk keys in that form; 0 when a size overflows. v_in_k (an
 * MLA latent cache): the f32 form packs K alone and V is its rows' first Dv floats
 * (v_offset 0, ldv = ldk); the bf16 and split forms pair V from the K rows packed or
 * converted in the same step, never reading the source twice. */
int fa_kv_packing_plan(int form, int64_t sk, int64_t D, int64_t Dv, int v_in_k, fa_kv_packing *pk);
/* Packs keys j0 .. j0+cols-1 (j0 even in the bf16 and split forms) of kv head hk of
 * sequence view s into unit, whose first key is key0 (even in the bf16 and split
 * forms; a chunk of a long unit's keys, tasks.h): key j goes to row j - key0. The
 * bf16 form may gather strided rows into k16, v16 (room for cols * D and cols * Dv
 * uint16; T times that in the split forms, which also take tmp: 2 * max(D, Dv)
 * floats, and whose K^T form splits K's rows into k16 before the transpose). */
void fa_kv_pack_rows(const fa_problem *p, const fa_view *s, const fa_kernels *kern, const fa_kv_packing *pk, int64_t hk,
                     int64_t j0, int64_t cols, int64_t key0, char *unit, uint16_t *k16, uint16_t *v16, float *tmp);

/* 1 when none of the rows (or the scales of i8 and fp8 rows) holds inf or NaN. */
int fa_kv_rows_finite(const void *const *rows, int kv, const float *scales, int64_t cols, int64_t dim);

#endif
