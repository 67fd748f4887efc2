/*
 * arith.h: checked 64-bit arithmetic on sizes, the one way the core multiplies and
 * adds user-given sizes (every product is checked: docs/semantics.md, "Sizes").
 * A leaf: includes nothing of the core.
 */
#ifndef FA_ARITH_H
#define FA_ARITH_H

#include <stdint.h>

/* Checked 64-bit arithmetic: return 0 on overflow. */
static inline int fa_mul_ok(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline int fa_add_ok(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

/* x rounded up to a multiple of m (x >= 0, m >= 1; the caller keeps x + m in range). */
static inline int64_t fa_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* a * b * c bytes, or -1 when a product overflows or a factor is negative. */
static inline int64_t fa_bytes3(int64_t a, int64_t b, int64_t c)
{
    int64_t ab, abc;
    if (a < 0 || b < 0 || c < 0 || !fa_mul_ok(a, b, &ab) || !fa_mul_ok(ab, c, &abc)) return -1;
    return abc;
}

#endif
