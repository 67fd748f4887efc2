/*
 * fields.c: the argument structs' initialisers and the library's description of them
 * (fa_args_field), both from the header's field tables, and the compile-time proof that each table lists
 * its struct's members: the same members, in the same order, at the same offsets.
 */
#include "flashattn.h"

#include <stddef.h>
#include <string.h>

/* A struct laid out from a table alone: if it has the real struct's size and every
 * member sits at the real member's offset with the real member's size, the table
 * holds the struct's members in order (an unlisted member would move what follows
 * it or the struct's end). */
#define MIRROR_MEMBER(name, key, ctype, type, role, def, doc) ctype name;
struct forward_mirror { FA_FORWARD_FIELDS(MIRROR_MEMBER) };
struct backward_mirror { FA_BACKWARD_FIELDS(MIRROR_MEMBER) };
struct kv_cache_mirror { FA_KV_CACHE_FIELDS(MIRROR_MEMBER) };

#define SAME_MEMBER(S, M, name)                                                                           \
    _Static_assert(offsetof(S, name) == offsetof(M, name) && sizeof(((S *)0)->name) == sizeof(((M *)0)->name), \
                   #S "." "member out of step with its table");
#define CHECK_FWD(name, key, ctype, type, role, def, doc) SAME_MEMBER(fa_forward_args, struct forward_mirror, name)
#define CHECK_BWD(name, key, ctype, type, role, def, doc) SAME_MEMBER(fa_backward_args, struct backward_mirror, name)
#define CHECK_KV(name, key, ctype, type, role, def, doc) SAME_MEMBER(fa_kv_cache, struct kv_cache_mirror, name)
FA_FORWARD_FIELDS(CHECK_FWD)
FA_BACKWARD_FIELDS(CHECK_BWD)
FA_KV_CACHE_FIELDS(CHECK_KV)
_Static_assert(sizeof(fa_forward_args) == sizeof(struct forward_mirror), "fa_forward_args: a member missing from its table");
_Static_assert(sizeof(fa_backward_args) == sizeof(struct backward_mirror), "fa_backward_args: a member missing from its table");
_Static_assert(sizeof(fa_kv_cache) == sizeof(struct kv_cache_mirror), "fa_kv_cache: a member missing from its table");
/* A member hidden in the padding a mirror leaves (an int after a float, before an
 * int64) moves no offset; the INIT macros, positional from the tables, then fall one
 * initialiser short of the struct, which the compiler reports (an extra row is an
 * excess initialiser, an error in any case). */
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wmissing-field-initializers"
#endif
static const fa_forward_args forward_init = FA_FORWARD_ARGS_INIT;
static const fa_backward_args backward_init = FA_BACKWARD_ARGS_INIT;
static const fa_kv_cache kv_cache_init = FA_KV_CACHE_INIT;
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif
/* I32 rows may be enums: the description promises 4 bytes */
_Static_assert(sizeof(fa_causal) == 4, "fa_causal is not 4 bytes");

#define ROW(S, name, key, ctype, type, role, def, doc)                                                        \
    {sizeof(fa_field), #name, key, #ctype, doc, offsetof(S, name), sizeof(((S *)0)->name), FA_FIELD_##type,   \
     FA_ROLE_##role, (double)(def)},
#define ROW_FWD(...) ROW(fa_forward_args, __VA_ARGS__)
#define ROW_BWD(...) ROW(fa_backward_args, __VA_ARGS__)
#define ROW_KV(...) ROW(fa_kv_cache, __VA_ARGS__)
static const fa_field forward_fields[] = {FA_FORWARD_FIELDS(ROW_FWD)};
static const fa_field backward_fields[] = {FA_BACKWARD_FIELDS(ROW_BWD)};
static const fa_field kv_cache_fields[] = {FA_KV_CACHE_FIELDS(ROW_KV)};

fa_status fa_args_field(fa_args_kind kind, int index, fa_field *out)
{
    const fa_field *rows;
    int n;
    switch (kind) {
    case FA_ARGS_FORWARD: rows = forward_fields, n = (int)(sizeof forward_fields / sizeof *rows); break;
    case FA_ARGS_BACKWARD: rows = backward_fields, n = (int)(sizeof backward_fields / sizeof *rows); break;
    case FA_ARGS_KV_CACHE: rows = kv_cache_fields, n = (int)(sizeof kv_cache_fields / sizeof *rows); break;
    default: return FA_ERR_INVALID_ARGUMENT;
    }
    if (!out) return FA_ERR_NULL_POINTER;
    if (index < 0 || index >= n) return FA_ERR_OUT_OF_RANGE;
    /* an output: the caller's struct_size bytes are written, an older caller's struct being shorter */
    if (out->struct_size < sizeof(size_t) || out->struct_size > ((size_t)1 << 20)) return FA_ERR_STRUCT_SIZE;
    const size_t n_out = out->struct_size < sizeof(fa_field) ? out->struct_size : sizeof(fa_field);
    fa_field f = rows[index];
    f.struct_size = n_out;
    memcpy(out, &f, n_out);
    return FA_OK;
}

void fa_forward_args_init(fa_forward_args *args)
{
    if (args) *args = forward_init;
}

void fa_backward_args_init(fa_backward_args *args)
{
    if (args) *args = backward_init;
}

void fa_kv_cache_init(fa_kv_cache *cache)
{
    if (cache) *cache = kv_cache_init;
}
