/*
 * kv.c: K/V row access for every form (see kv.h): dense, packed, contiguous or
 * paged cache, int8. Where a cache row lives is cache.h's fa_cache_slot.
 */
#include "kv.h"
#include "arith.h"
#include "convert.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

int fa_kv_type(fa_dtype d)
{
    switch (d) {
    case FA_DTYPE_F16: return FA_KV_F16;
    case FA_DTYPE_BF16: return FA_KV_BF16;
    case FA_DTYPE_I8: return FA_KV_I8;
    case FA_DTYPE_F8E4M3: return FA_KV_F8E4M3;
    case FA_DTYPE_F8E5M2: return FA_KV_F8E5M2;
    default: return FA_KV_F32;
    }
}

/* A dense fp8 row as f32: its codes as binary16 bits (half.h; E4M3 as value / 256,
 * folded into the scale), widened by the ISA's f16 converter, then scaled: the same
 * values as the portable conversion, at the converter's speed. */
static void fp8_row_to_f32(const fa_kernels *kern, const uint8_t *row, fa_dtype dt, float scale, int64_t n,
                           float *out)
{
    enum { CHUNK = 256 };
    uint16_t h[CHUNK];
    const float s = dt == FA_DTYPE_F8E4M3 ? scale * FA_E4M3_F16_UNIT : scale;
    for (int64_t e0 = 0; e0 < n; e0 += CHUNK) {
        const int64_t m = n - e0 < CHUNK ? n - e0 : CHUNK;
        if (dt == FA_DTYPE_F8E4M3)
            for (int64_t e = 0; e < m; e++) h[e] = fa_e4m3_to_f16_bits(row[e0 + e]);
        else
            for (int64_t e = 0; e < m; e++) h[e] = fa_e5m2_to_f16_bits(row[e0 + e]);
        kern->f16_to_f32(h, out + e0, m);
        for (int64_t e = 0; e < m; e++) out[e0 + e] *= s;
    }
}

/* One K/V row of n elements (inner stride sd) as f32: the ISA's converters where
 * they apply, the portable ones otherwise. */
static void row_to_f32(const fa_kernels *kern, const void *row, fa_dtype dt, int64_t sd, float scale, int64_t n,
                       float *out)
{
    if (sd == 1 && dt == FA_DTYPE_F16)
        kern->f16_to_f32(row, out, n);
    else if (sd == 1 && dt == FA_DTYPE_BF16)
        kern->bf16_to_f32(row, out, n);
    else if (sd == 1 && (dt == FA_DTYPE_F8E4M3 || dt == FA_DTYPE_F8E5M2))
        fp8_row_to_f32(kern, row, dt, scale, n, out);
    else
        fa_row_to_f32(row, dt, sd, scale, n, out);
}

/* Rows one by one through the slot rule, each converted with its scale: pages that a
 * tile crosses, and codes (whose scales differ by row). */
static const float *tile_f32_rows(const fa_problem *p, const fa_view *s, int which, const fa_kernels *kern, int64_t j0,
                                  int64_t cols, int64_t hk, int64_t dim, float *scratch, int64_t *ld)
{
    const fa_tensor *t = which ? &s->v : &s->k;
    *ld = dim;
    for (int64_t c = 0; c < cols; c++) {
        float scale;
        const void *row = fa_kv_row(p, s, which, j0 + c, hk, &scale);
        row_to_f32(kern, row, t->dtype, t->stride[3], scale, dim, scratch + c * dim);
    }
    return scratch;
}

/* Dense float rows: one strided block from row j0. */
static const float *tile_f32_dense(const fa_problem *p, const fa_view *s, int which, const fa_kernels *kern,
                                   int64_t j0, int64_t cols, int64_t hk, int64_t dim, float *scratch, int64_t *ld)
{
    (void)p;
    return fa_rows_f32(which ? &s->v : &s->k, kern, 0, j0, cols, hk, dim, scratch, ld);
}

/* Paged float rows: one strided block where the tile lies in one page, else row by row. */
static const float *tile_f32_paged(const fa_problem *p, const fa_view *s, int which, const fa_kernels *kern, int64_t j0,
                                   int64_t cols, int64_t hk, int64_t dim, float *scratch, int64_t *ld)
{
    if (!fa_cache_one_block(s->pages, p->page_size, j0, cols))
        return tile_f32_rows(p, s, which, kern, j0, cols, hk, dim, scratch, ld);
    const fa_slot at = fa_cache_slot(s->pages, p->page_size, 0, j0);
    return fa_rows_f32(which ? &s->v : &s->k, kern, at.blk, at.row, cols, hk, dim, scratch, ld);
}

/* Rows evenly spaced from row j0 (a dense view), their scales too when scaled. */
static void row_ptrs_dense(const fa_problem *p, const fa_view *s, int which, int64_t j0, int64_t cols, int64_t hk,
                           const void **ptr, float *scale)
{
    const fa_tensor *t = which ? &s->v : &s->k;
    const char *row = fa_kv_row(p, s, which, j0, hk, NULL);
    const int64_t step = t->stride[1] * (int64_t)fa_dtype_size(t->dtype);
    for (int64_t c = 0; c < cols; c++) ptr[c] = row + c * step;
    if (!p->kv->scaled) return;
    const fa_tensor *st = which ? &s->v_scale : &s->k_scale;
    const float *sc = (const float *)st->data + j0 * st->stride[1] + hk * st->stride[2];
    for (int64_t c = 0; c < cols; c++) scale[c] = sc[c * st->stride[1]];
}

/* Rows (and scales) one by one through the block table. */
static void row_ptrs_paged(const fa_problem *p, const fa_view *s, int which, int64_t j0, int64_t cols, int64_t hk,
                           const void **ptr, float *scale)
{
    for (int64_t c = 0; c < cols; c++) ptr[c] = fa_kv_row(p, s, which, j0 + c, hk, &scale[c]);
}

static const uint16_t *tile_u16_dense(const fa_problem *p, const fa_view *s, int which, int64_t j0, int64_t cols,
                                      int64_t hk, int64_t dim, uint16_t *scratch, int64_t *ld)
{
    (void)p;
    return fa_rows_u16(which ? &s->v : &s->k, 0, j0, cols, hk, dim, scratch, ld);
}

/* A page pool's bf16 rows: in place where the tile lies in one page and the rows have a
 * unit inner stride, else copied row by row (element by element across a stride). */
static const uint16_t *tile_u16_paged(const fa_problem *p, const fa_view *s, int which, int64_t j0, int64_t cols,
                                      int64_t hk, int64_t dim, uint16_t *scratch, int64_t *ld)
{
    const int64_t step = (which ? &s->v : &s->k)->stride[3];
    if (step == 1 && fa_cache_one_block(s->pages, p->page_size, j0, cols)) {
        *ld = (which ? &s->v : &s->k)->stride[1];
        return fa_kv_row(p, s, which, j0, hk, NULL);
    }
    *ld = dim;
    for (int64_t c = 0; c < cols; c++) {
        const uint16_t *row = fa_kv_row(p, s, which, j0 + c, hk, NULL);
        if (step == 1) memcpy(scratch + c * dim, row, (size_t)dim * sizeof *scratch);
        else
            for (int64_t e = 0; e < dim; e++) scratch[c * dim + e] = row[e * step];
    }
    return scratch;
}

enum { KV_DENSE, KV_PAGED, KV_SCALED, KV_SCALED_PAGED };
static const fa_kv_source kv_sources[] = {
    [KV_DENSE] = {"dense", 0, row_ptrs_dense, tile_f32_dense, tile_u16_dense},
    [KV_PAGED] = {"paged", 0, row_ptrs_paged, tile_f32_paged, tile_u16_paged},
    [KV_SCALED] = {"scaled", 1, row_ptrs_dense, tile_f32_rows, NULL},
    [KV_SCALED_PAGED] = {"scaled-paged", 1, row_ptrs_paged, tile_f32_rows, NULL},
};

const fa_kv_source *fa_kv_source_of(const fa_problem *p)
{
    return &kv_sources[(p->block_table ? KV_PAGED : KV_DENSE) + (p->quant ? KV_SCALED : 0)];
}

void fa_kv_gather_strided(const fa_tensor *t, const void **ptr, int64_t cols, int64_t dim, void *dst)
{
    const int64_t es = (int64_t)fa_dtype_size(t->dtype), sd = t->stride[3];
    for (int64_t c = 0; c < cols; c++) {
        const char *src = ptr[c];
        char *out = (char *)dst + c * dim * es;
        for (int64_t e = 0; e < dim; e++) memcpy(out + e * es, src + e * sd * es, (size_t)es);
        ptr[c] = out;
    }
}

/* 1 when no code of the fp8 row is inf or NaN: E4M3's NaN has all of 0x7f set,
 * E5M2's inf and NaN all of 0x7c (the exponent). */
static int fp8_row_finite(const void *row, int64_t dim, unsigned mask)
{
    uint32_t bad = 0; /* no early exit, so the loop vectorises */
    for (int64_t e = 0; e < dim; e++) bad |= (((const uint8_t *)row)[e] & mask) == mask;
    return !bad;
}

int fa_kv_rows_finite(const void *const *rows, int kv, const float *scales, int64_t cols, int64_t dim)
{
    uint32_t bad = 0;
    for (int64_t c = 0; c < cols; c++) {
        if (fa_kv_scaled(kv)) {
            bad |= !isfinite(scales[c]);
            if (kv != FA_KV_I8) bad |= !fp8_row_finite(rows[c], dim, kv == FA_KV_F8E4M3 ? 0x7fu : 0x7cu);
        } else if (kv == FA_KV_F32) {
            bad |= !fa_rows_finite(rows[c], 0, 1, dim);
        } else {
            bad |= !fa_rows_finite16(rows[c], 0, 1, dim, kv == FA_KV_F16 ? 0x7c00u : 0x7f80u);
        }
    }
    return !bad;
}

int fa_kv_packing_form(const fa_problem *p, int bf16_dot, int mm_terms, int mode)
{
    if (mode == 1) return -1;
    /* f32 split into bf16 terms: a tile would be split again for every query block */
    if (mm_terms > 0 && p->dtype == FA_DTYPE_F32) return FA_KV_FORM_SPLIT(mm_terms);
    /* what the kernels read: a cached call's cache, never its new rows (any float dtype) */
    const fa_tensor *t[2] = {p->cache ? &p->kc : &p->k, p->cache ? &p->vc : &p->v};
    const int paged = p->pages || p->block_table;
    const int bf16 = bf16_dot && !paged && !p->quant && p->q.dtype == FA_DTYPE_BF16 &&
                     t[0]->dtype == FA_DTYPE_BF16 && t[1]->dtype == FA_DTYPE_BF16;
    if (bf16 || mode == 2) return bf16; /* pv_bf16 would pair V for every tile */
    if (paged || p->quant) return 0;
    for (int i = 0; i < 2; i++)
        if (t[i]->dtype != FA_DTYPE_F32 || t[i]->stride[3] != 1 ||
            fa_rows_scattered(t[i]->stride[1] * (int64_t)fa_dtype_size(t[i]->dtype)))
            return 0;
    return -1; /* dense f32 rows: the kernels read them in place as well as packed */
}

int fa_kv_packing_plan(int form, int64_t sk, int64_t D, int64_t Dv, int v_in_k, fa_kv_packing *pk)
{
    pk->bf16 = form != 0;
    pk->kt = form >= FA_KV_FORM_KT;
    pk->terms = pk->kt ? form - FA_KV_FORM_KT : form >= FA_KV_FORM_SPLIT(1) ? form - 1 : 0;
    int64_t kb, vb;
    if (pk->kt) { /* D <= FA_DIM_MAX: the pair rows do not overflow */
        pk->ldk = 16 * FA_KT_PAIRS((pk->terms ? pk->terms : 1) * D); /* dwords per block of 16 keys */
        pk->ldv = fa_packed_ld(Dv);
        kb = fa_bytes3((sk + 15) / 16, pk->ldk, 4);
        vb = fa_bytes3((sk + 1) / 2, pk->ldv, 4);
        if (pk->terms == 3 && vb >= 0) vb = vb > INT64_MAX / 2 ? -1 : 2 * vb; /* hi, then lo */
    } else if (pk->terms) { /* D, Dv <= FA_DIM_MAX: T * D does not overflow */
        pk->ldk = 2 * fa_packed_ld((pk->terms * D + 1) / 2);
        pk->ldv = fa_packed_ld(Dv);
        kb = fa_bytes3(sk, pk->ldk, 2);
        vb = fa_bytes3((sk + 1) / 2, pk->ldv, 4);
        if (pk->terms == 3 && vb >= 0) vb = vb > INT64_MAX / 2 ? -1 : 2 * vb; /* hi, then lo */
    } else if (form) {
        pk->ldk = 2 * fa_packed_ld((D + 1) / 2);
        pk->ldv = fa_packed_ld(Dv);
        kb = fa_bytes3(sk, pk->ldk, 2);
        vb = fa_bytes3((sk + 1) / 2, pk->ldv, 4);
    } else {
        pk->ldk = fa_packed_ld(D);
        pk->ldv = v_in_k ? pk->ldk : fa_packed_ld(Dv);
        kb = fa_bytes3(sk, pk->ldk, 4);
        vb = v_in_k ? 0 : fa_bytes3(sk, pk->ldv, 4); /* a latent V is the packed K rows' first Dv floats */
    }
    /* every row is a multiple of 64 bytes, so both parts are too */
    if (kb < 0 || vb < 0 || kb > INT64_MAX - vb) return 0;
    pk->v_offset = v_in_k && !form ? 0 : kb; /* the f32 form's latent V: K's rows */
    pk->vlo_offset = kb + vb / 2;
    pk->unit_bytes = kb + vb;
    return 1;
}

/* Row j of K (which 0) or V (1) fetched ahead (convert.h, fa_prefetch_row). */
static void prefetch_row(const fa_problem *p, const fa_view *s, int which, int64_t j, int64_t hk, int64_t bytes)
{
    float scale;
    fa_prefetch_row(fa_kv_row(p, s, which, j, hk, &scale), bytes);
}

void fa_kv_pack_rows(const fa_problem *p, const fa_view *s, const fa_kernels *kern, const fa_kv_packing *pk, int64_t hk,
                     int64_t j0, int64_t cols, int64_t key0, char *unit, uint16_t *k16, uint16_t *v16, float *tmp)
{
    const int64_t D = p->D, Dv = p->Dv;
    if (pk->terms) { /* any source: rows to f32 one by one, then split */
        const int T = pk->terms;
        /* the K^T split form: the split rows into k16 (T * D apart), then transposed */
        const int64_t ldkd = pk->kt ? T * D : pk->ldk;
        uint16_t *kd = pk->kt ? k16 : (uint16_t *)unit + (j0 - key0) * pk->ldk;
        const int64_t dmax = D > Dv ? D : Dv;
        const int64_t kbytes = D * (int64_t)fa_dtype_size(s->k.dtype), vbytes = Dv * (int64_t)fa_dtype_size(s->v.dtype);
        for (int64_t c = 0; c < cols; c++) {
            float scale;
            if (c + FA_SPLIT_PREFETCH_ROWS < cols) prefetch_row(p, s, 0, j0 + c + FA_SPLIT_PREFETCH_ROWS, hk, kbytes);
            const void *row = fa_kv_row(p, s, 0, j0 + c, hk, &scale);
            row_to_f32(kern, row, s->k.dtype, s->k.stride[3], scale, D, tmp);
            fa_split_row(kern, T, 1, tmp, D, kd + c * ldkd, tmp + dmax);
            memset(kd + c * ldkd + T * D, 0, (size_t)(ldkd - T * D) * sizeof *kd);
            /* a latent V: the same converted row's first Dv values, not read again */
            if (p->v_in_k) fa_split_vrows(kern, T, tmp, Dv, 1, Dv, v16 + c * Dv, v16 + (cols + c) * Dv, tmp + dmax);
        }
        uint16_t *lo = v16 + cols * Dv;
        for (int64_t c = 0; c < cols && !p->v_in_k; c++) {
            float scale;
            if (c + FA_SPLIT_PREFETCH_ROWS < cols) prefetch_row(p, s, 1, j0 + c + FA_SPLIT_PREFETCH_ROWS, hk, vbytes);
            const void *row = fa_kv_row(p, s, 1, j0 + c, hk, &scale);
            row_to_f32(kern, row, s->v.dtype, s->v.stride[3], scale, Dv, tmp);
            fa_split_vrows(kern, T, tmp, Dv, 1, Dv, v16 + c * Dv, lo + c * Dv, tmp + dmax);
        }
        kern->pack_pairs_bf16(cols, Dv, v16, Dv, (uint32_t *)(unit + pk->v_offset) + (j0 - key0) / 2 * pk->ldv, pk->ldv);
        if (T == 3)
            kern->pack_pairs_bf16(cols, Dv, lo, Dv, (uint32_t *)(unit + pk->vlo_offset) + (j0 - key0) / 2 * pk->ldv, pk->ldv);
        if (pk->kt) kern->pack_kt_bf16(cols, T * D, kd, ldkd, (uint32_t *)unit, j0 - key0);
        return;
    }
    if (pk->kt) { /* dense bf16 as the bf16 form; K transposed into pairs along D */
        int64_t ld;
        const uint16_t *k = fa_rows_u16(&s->k, 0, j0, cols, hk, D, k16, &ld);
        kern->pack_kt_bf16(cols, D, k, ld, (uint32_t *)unit, j0 - key0);
        /* a latent V pairs the K rows just read, not the source again */
        const uint16_t *v = p->v_in_k ? k : fa_rows_u16(&s->v, 0, j0, cols, hk, Dv, v16, &ld);
        kern->pack_pairs_bf16(cols, Dv, v, ld, (uint32_t *)(unit + pk->v_offset) + (j0 - key0) / 2 * pk->ldv,
                              pk->ldv);
        return;
    }
    if (pk->bf16) { /* dense bf16 tensors only (no pages, no int8): rows evenly spaced */
        int64_t ld;
        const uint16_t *k = fa_rows_u16(&s->k, 0, j0, cols, hk, D, k16, &ld);
        uint16_t *kd = (uint16_t *)unit + (j0 - key0) * pk->ldk;
        for (int64_t c = 0; c < cols; c++) {
            memcpy(kd + c * pk->ldk, k + c * ld, (size_t)D * sizeof *kd);
            memset(kd + c * pk->ldk + D, 0, (size_t)(pk->ldk - D) * sizeof *kd);
        }
        /* a latent V pairs the packed K rows' first Dv columns, not the source again */
        const uint16_t *v = p->v_in_k ? kd : fa_rows_u16(&s->v, 0, j0, cols, hk, Dv, v16, &ld);
        if (p->v_in_k) ld = pk->ldk;
        kern->pack_pairs_bf16(cols, Dv, v, ld, (uint32_t *)(unit + pk->v_offset) + (j0 - key0) / 2 * pk->ldv,
                              pk->ldv);
        return;
    }
    for (int which = 0; which < 2 - p->v_in_k; which++) { /* a latent V views the packed K rows */
        const fa_tensor *t = which ? &s->v : &s->k;
        const int64_t dim = which ? Dv : D, ldp = which ? pk->ldv : pk->ldk;
        float *dst = (float *)(unit + (which ? pk->v_offset : 0)) + (j0 - key0) * ldp;
        for (int64_t c = 0; c < cols; c++) {
            float scale;
            const void *row = fa_kv_row(p, s, which, j0 + c, hk, &scale);
            row_to_f32(kern, row, t->dtype, t->stride[3], scale, dim, dst + c * ldp);
        }
    }
}
