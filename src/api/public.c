/*
 * public.c: the small public helpers that need no context: versions, the names of
 * statuses, dtypes and algorithms, tensor views (the argument structs' initialisers
 * are fields.c's).
 */
#include "flashattn.h"
#include "arith.h"

#include <stdint.h>
#include <string.h>

#define FA_STR2(x) #x
#define FA_STR(x) FA_STR2(x)

unsigned fa_version_number(void) { return FA_VERSION_NUMBER; }

const char *fa_version_string(void)
{
    return FA_STR(FA_VERSION_MAJOR) "." FA_STR(FA_VERSION_MINOR) "." FA_STR(FA_VERSION_PATCH);
}

const char *fa_status_string(fa_status status)
{
    switch (status) {
    case FA_OK: return "ok";
    case FA_ERR_NULL_CONTEXT: return "the context is NULL";
    case FA_ERR_NULL_POINTER: return "a required pointer is NULL";
    case FA_ERR_STRUCT_SIZE: return "the argument struct's struct_size is not one this library knows";
    case FA_ERR_INVALID_DIM: return "a dimension is negative, or zero where it has no meaning";
    case FA_ERR_SHAPE_MISMATCH: return "tensor shapes do not agree";
    case FA_ERR_HEAD_RATIO: return "query heads are not a multiple of key/value heads";
    case FA_ERR_DTYPE: return "unsupported or mixed dtypes";
    case FA_ERR_OVERFLOW: return "a size or offset overflows 64 bits";
    case FA_ERR_BROADCAST: return "bias or mask does not broadcast to [B, Hq, Sq, Sk]";
    case FA_ERR_INVALID_ARGUMENT: return "invalid argument value";
    case FA_ERR_UNSUPPORTED: return "not supported by the chosen algorithm or instruction-set path";
    case FA_ERR_OUT_OF_MEMORY: return "out of memory";
    case FA_ERR_THREADS: return "worker threads could not be started";
    case FA_ERR_ISA_UNAVAILABLE: return "the requested instruction-set path is not available";
    case FA_ERR_OUT_OF_RANGE: return "an index or length is out of range";
    case FA_ERR_BUSY: return "the context is in use by another thread";
    case FA_ERR_IO: return "the tune file could not be read or written";
    }
    return "unknown status code";
}

size_t fa_dtype_size(fa_dtype dtype)
{
    switch (dtype) {
    case FA_DTYPE_F32: return 4;
    case FA_DTYPE_F16: return 2;
    case FA_DTYPE_BF16: return 2;
    case FA_DTYPE_BOOL: return 1;
    case FA_DTYPE_I8: return 1;
    case FA_DTYPE_F8E4M3: return 1;
    case FA_DTYPE_F8E5M2: return 1;
    }
    return 0;
}

const char *fa_dtype_name(fa_dtype dtype)
{
    switch (dtype) {
    case FA_DTYPE_F32: return "f32";
    case FA_DTYPE_F16: return "f16";
    case FA_DTYPE_BF16: return "bf16";
    case FA_DTYPE_BOOL: return "bool";
    case FA_DTYPE_I8: return "i8";
    case FA_DTYPE_F8E4M3: return "f8e4m3";
    case FA_DTYPE_F8E5M2: return "f8e5m2";
    }
    return "unknown";
}

const char *fa_algo_name(fa_algo algo)
{
    switch (algo) {
    case FA_ALGO_AUTO: return "auto";
    case FA_ALGO_FLASH: return "flash";
    case FA_ALGO_STANDARD: return "standard";
    case FA_ALGO_REFERENCE: return "reference";
    }
    return "unknown";
}

/* x * y, or INT64_MAX when the product does not fit: a stride that no valid tensor
 * has, since a tensor whose strides overflow has an element count that does too,
 * which every call refuses (FA_ERR_OVERFLOW). Negative dims are refused as well. */
static int64_t stride_mul(int64_t x, int64_t y)
{
    int64_t r;
    return fa_mul_ok(x, y, &r) ? r : INT64_MAX;
}

/* A dense view of shape (d0, d1, d2, d3): d3 innermost (stride 1), then the dims
 * o1, o2, o3 from inner to outer, each stride the product of the ones inside it. */
static fa_tensor tensor_dense(void *data, fa_dtype dtype, int64_t d0, int64_t d1, int64_t d2, int64_t d3, int o1,
                              int o2, int o3)
{
    fa_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.shape[0] = d0;
    t.shape[1] = d1;
    t.shape[2] = d2;
    t.shape[3] = d3;
    t.stride[3] = 1;
    t.stride[o1] = d3;
    t.stride[o2] = stride_mul(t.shape[o1], d3);
    t.stride[o3] = stride_mul(t.shape[o2], t.stride[o2]);
    return t;
}

fa_tensor fa_tensor_make(void *data, fa_dtype dtype, fa_layout layout,
                         int64_t batch, int64_t seq, int64_t heads, int64_t dim)
{
    /* Logical order is always (b, s, n, d); only the strides differ. */
    switch (layout) {
    case FA_LAYOUT_BNSD:
        return tensor_dense(data, dtype, batch, seq, heads, dim, 1, 2, 0);
    case FA_LAYOUT_SBH:
        return tensor_dense(data, dtype, batch, seq, heads, dim, 2, 0, 1);
    case FA_LAYOUT_BSND:
    case FA_LAYOUT_BSH:
    default:
        return tensor_dense(data, dtype, batch, seq, heads, dim, 2, 1, 0);
    }
}

fa_tensor fa_tensor_contiguous(void *data, fa_dtype dtype, int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    return tensor_dense(data, dtype, d0, d1, d2, d3, 2, 1, 0);
}

void fa_block_mask_init(fa_block_mask *mask)
{
    if (!mask) return;
    fa_block_mask init = FA_BLOCK_MASK_INIT;
    *mask = init;
}

