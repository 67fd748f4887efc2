/*
 * test_fields.c: the field tables of include/flashattn.h (FA_FORWARD_FIELDS,
 * FA_BACKWARD_FIELDS, FA_KV_CACHE_FIELDS) against the structs they describe and
 * against the library's own description (fa_args_field): the same members in the
 * same order, at the offsets and sizes the header gives them here, with the INIT
 * macros' defaults; rows that tile their struct (a member left out of a table shows
 * as a gap); fields only ever appended after those of the releases before.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

/* The fields of each struct as released before this table existed, in order: the
 * table must begin with them (fields are only appended). */
static const char *const released_forward[] = {
    "struct_size", "q", "k", "v", "o", "lse", "scale", "softcap", "causal", "window_left", "window_right",
    "alibi_slopes", "alibi_stride_b", "bias", "mask", "cu_seqlens_q", "cu_seqlens_k", "num_seqs", "kv_cache",
    "q_start", "k_start", "dropout_p", "dropout_offset", "dropout_seed", "dropout_mask", "sinks"};
static const char *const released_backward[] = {"struct_size", "fwd", "do_", "dq", "dk", "dv", "dsinks"};
static const char *const released_kv_cache[] = {"struct_size", "k", "v", "k_scale", "v_scale", "seqlens",
                                                "batch_idx", "block_table", "max_pages", "v_in_k", "leftpad"};

/* One row as this test compiled the header. */
typedef struct row {
    const char *name, *key;
    size_t offset, size;
    fa_field_type type;
    fa_field_role role;
    double def;
} row;

#define ROW(S, name, key, ctype, type, role, def, doc) \
    {#name, key, offsetof(S, name), sizeof(((S *)0)->name), FA_FIELD_##type, FA_ROLE_##role, (double)(def)},
#define ROW_FWD(...) ROW(fa_forward_args, __VA_ARGS__)
#define ROW_BWD(...) ROW(fa_backward_args, __VA_ARGS__)
#define ROW_KV(...) ROW(fa_kv_cache, __VA_ARGS__)
static const row forward_rows[] = {FA_FORWARD_FIELDS(ROW_FWD)};
static const row backward_rows[] = {FA_BACKWARD_FIELDS(ROW_BWD)};
static const row kv_cache_rows[] = {FA_KV_CACHE_FIELDS(ROW_KV)};

/* A scalar field's value at its offset, by its type. */
static double value_at(const void *s, const fa_field *f)
{
    const char *p = (const char *)s + f->offset;
    switch (f->type) {
    case FA_FIELD_SIZE: { size_t x; memcpy(&x, p, sizeof x); return (double)x; }
    case FA_FIELD_F32: { float x; memcpy(&x, p, sizeof x); return (double)x; }
    case FA_FIELD_I32: { int32_t x; memcpy(&x, p, sizeof x); return (double)x; }
    case FA_FIELD_I64: { int64_t x; memcpy(&x, p, sizeof x); return (double)x; }
    case FA_FIELD_U32: { uint32_t x; memcpy(&x, p, sizeof x); return (double)x; }
    case FA_FIELD_U64: { uint64_t x; memcpy(&x, p, sizeof x); return (double)x; }
    default: return 0.0;
    }
}

static int all_zero(const void *s, size_t off, size_t n)
{
    const unsigned char *p = (const unsigned char *)s + off;
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

static size_t type_size(fa_field_type t)
{
    switch (t) {
    case FA_FIELD_SIZE: return sizeof(size_t);
    case FA_FIELD_TENSOR: return sizeof(fa_tensor);
    case FA_FIELD_F32: case FA_FIELD_I32: case FA_FIELD_U32: return 4;
    case FA_FIELD_I64: case FA_FIELD_U64: return 8;
    case FA_FIELD_PTR: return sizeof(void *);
    }
    return 0;
}

/* kind's table against the library, the struct (size `size`), its INIT value `init`
 * and its init function's value `by_function`, and its released fields. */
static void check_kind(const char *what, fa_args_kind kind, const row *rows, int n_rows, size_t size,
                       const void *init, const void *by_function, const char *const *released, int n_released)
{
    h_case(what);
    int n = 0;
    size_t end = 0;
    for (;; n++) {
        fa_field f = FA_FIELD_INIT;
        const fa_status st = fa_args_field(kind, n, &f);
        if (st == FA_ERR_OUT_OF_RANGE) break;
        if (!CHECK(st == FA_OK, "%s: field %d: %s", what, n, fa_status_string(st))) return;
        if (!CHECK(n < n_rows, "%s: the library has more fields (%d: %s) than the header's table (%d)", what, n,
                   f.name, n_rows))
            return;
        const row *r = &rows[n];
        CHECK(f.struct_size == sizeof f && strcmp(f.name, r->name) == 0 && strcmp(f.key, r->key) == 0,
              "%s: field %d is %s (key %s) in the library, %s (key %s) in the header", what, n, f.name, f.key,
              r->name, r->key);
        CHECK(f.offset == r->offset && f.size == r->size, "%s.%s: offset %zu size %zu in the library, %zu %zu here",
              what, f.name, f.offset, f.size, r->offset, r->size);
        CHECK(f.type == r->type && f.role == r->role && f.default_value == r->def,
              "%s.%s: type/role/default %d/%d/%g in the library, %d/%d/%g here", what, f.name, (int)f.type,
              (int)f.role, f.default_value, (int)r->type, (int)r->role, r->def);
        CHECK(f.size == type_size(f.type), "%s.%s: %zu bytes for type %d", what, f.name, f.size, (int)f.type);
        CHECK(f.ctype && f.doc && f.doc[0], "%s.%s: a C type and a doc line", what, f.name);
        /* the rows tile the struct: each starts where the last ended, but for the
         * padding that aligns it (less than its own alignment, at most 8) */
        CHECK(f.offset >= end && f.offset - end < (f.size < 8 ? f.size : 8),
              "%s.%s at %zu: the row before ended at %zu (a member missing from the table?)", what, f.name, f.offset,
              end);
        end = f.offset + f.size;
        /* defaults: the INIT macro, the init function and the table agree */
        CHECK(memcmp((const char *)init + f.offset, (const char *)by_function + f.offset, f.size) == 0,
              "%s.%s: the INIT macro and the init function differ", what, f.name);
        if (f.type == FA_FIELD_TENSOR || f.type == FA_FIELD_PTR)
            CHECK(all_zero(init, f.offset, f.size) && f.default_value == 0.0, "%s.%s: not absent by default", what,
                  f.name);
        else
            CHECK(value_at(init, &f) == f.default_value, "%s.%s: INIT gives %g, the table %g", what, f.name,
                  value_at(init, &f), f.default_value);
        if (n < n_released)
            CHECK(strcmp(f.name, released[n]) == 0, "%s: field %d is %s, released as %s (fields only append)", what,
                  n, f.name, released[n]);
    }
    CHECK(n == n_rows, "%s: %d fields in the library, %d in the header's table", what, n, n_rows);
    CHECK(n >= n_released, "%s: %d fields, %d released", what, n, n_released);
    CHECK(end <= size && size - end < 8, "%s: the last row ends at %zu of %zu bytes", what, end, size);
    CHECK(rows[0].offset == 0 && strcmp(rows[0].name, "struct_size") == 0, "%s: struct_size first", what);
}

static void test_tables(void)
{
    fa_forward_args fa = FA_FORWARD_ARGS_INIT, ff;
    fa_backward_args ba = FA_BACKWARD_ARGS_INIT, bf;
    fa_kv_cache ca = FA_KV_CACHE_INIT, cf;
    memset(&ff, 0x5A, sizeof ff), memset(&bf, 0x5A, sizeof bf), memset(&cf, 0x5A, sizeof cf);
    fa_forward_args_init(&ff);
    fa_backward_args_init(&bf);
    fa_kv_cache_init(&cf);
#define N(a) (int)(sizeof(a) / sizeof((a)[0]))
    check_kind("fa_forward_args", FA_ARGS_FORWARD, forward_rows, N(forward_rows), sizeof fa, &fa, &ff,
               released_forward, N(released_forward));
    check_kind("fa_backward_args", FA_ARGS_BACKWARD, backward_rows, N(backward_rows), sizeof ba, &ba, &bf,
               released_backward, N(released_backward));
    check_kind("fa_kv_cache", FA_ARGS_KV_CACHE, kv_cache_rows, N(kv_cache_rows), sizeof ca, &ca, &cf,
               released_kv_cache, N(released_kv_cache));
}

static void test_misuse(void)
{
    h_case("misuse");
    fa_field f = FA_FIELD_INIT;
    CHECK(fa_args_field((fa_args_kind)7, 0, &f) == FA_ERR_INVALID_ARGUMENT, "an unknown kind");
    CHECK(fa_args_field(FA_ARGS_FORWARD, -1, &f) == FA_ERR_OUT_OF_RANGE, "index -1");
    CHECK(fa_args_field(FA_ARGS_FORWARD, 0, NULL) == FA_ERR_NULL_POINTER, "NULL out");
    f.struct_size = 0;
    CHECK(fa_args_field(FA_ARGS_FORWARD, 0, &f) == FA_ERR_STRUCT_SIZE, "struct_size 0");
    /* an older caller's shorter struct: only its bytes are written */
    unsigned char buf[sizeof(fa_field) + 8];
    memset(buf, 0xEE, sizeof buf);
    const size_t old = offsetof(fa_field, doc);
    memcpy(buf, &old, sizeof old);
    CHECK(fa_args_field(FA_ARGS_FORWARD, 1, (fa_field *)(void *)buf) == FA_OK, "an older fa_field");
    fa_field got;
    memcpy(&got, buf, sizeof got);
    CHECK(got.struct_size == old && strcmp(got.name, "q") == 0 && buf[old] == 0xEE && buf[sizeof buf - 1] == 0xEE,
          "an older fa_field gets its bytes alone");
}

int main(void)
{
    test_tables();
    test_misuse();
    return h_summary();
}
