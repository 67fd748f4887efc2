/*
 * avx512_internal.h: the intrinsic helpers the two AVX-512 kernel files share
 * (masks, the 6/5 split, the 16x16 transpose, the vector exp). Only files built
 * with the AVX-512 flags include it; the "avx512bf16" table inherits the fp32
 * kernels of "avx512" instead of compiling a second copy. The entry points are
 * declared in avx512_kernels.h (all the table files see); the functions are
 * hidden by the library's default visibility.
 */
#ifndef FA_AVX512_INTERNAL_H
#define FA_AVX512_INTERNAL_H

#include "avx512_kernels.h"

#include <immintrin.h>
#include <stdint.h>

/* Force the register-blocked bodies to be specialised for their constant block
 * sizes: the accumulator arrays only live in registers once every loop over
 * them is unrolled with a constant bound. */
#define FA_AVX512_INLINE static inline __attribute__((always_inline))
/* ... and unroll those loops completely. clang needs its own spelling: with
 * "GCC unroll" it keeps the arrays in memory. */
#if defined(__clang__)
#define FA_AVX512_UNROLL _Pragma("clang loop unroll(full)")
#else
#define FA_AVX512_UNROLL _Pragma("GCC unroll 16")
#endif

/* The low n bits set, n in 0..16: the mask of a vector's first n lanes. */
FA_AVX512_INLINE __mmask16 fa_avx512_head_mask(int64_t n)
{
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

/*
 * Splits n rows (or columns) into tiles of 6 and then of 5, which covers every
 * n >= 20 (and 5, 6, 10..12, 15..18) exactly; otherwise the last 6-tile is a
 * padded one. Returns how many of the n the 6-tiles cover (they come first);
 * 5-tiles cover the rest.
 */
FA_AVX512_INLINE int64_t fa_avx512_split65(int64_t n)
{
    const int64_t fives = 5 * (n % 6) % 6; /* 5 * fives == n (mod 6) */
    return 5 * fives <= n ? n - 5 * fives : n;
}

/* In-place 16x16 transpose of 32-bit lanes (floats, or bf16 pairs): 16 unpacks
 * of 32-bit, 16 of 64-bit, 32 128-bit lane shuffles. */
FA_AVX512_INLINE void fa_avx512_transpose16(__m512 t[16])
{
    __m512 a[16];
    for (int i = 0; i < 16; i += 2) {
        a[i] = _mm512_unpacklo_ps(t[i], t[i + 1]);     /* lane L: r0[4L] r1[4L] r0[4L+1] r1[4L+1] */
        a[i + 1] = _mm512_unpackhi_ps(t[i], t[i + 1]); /* lane L: r0[4L+2] r1[4L+2] r0[4L+3] r1[4L+3] */
    }
    __m512 b[16]; /* b[4g+j], lane L: column 4L+j of rows 4g..4g+3 */
    for (int g = 0; g < 4; g++) {
        const __m512d lo01 = _mm512_castps_pd(a[4 * g]), hi01 = _mm512_castps_pd(a[4 * g + 1]);
        const __m512d lo23 = _mm512_castps_pd(a[4 * g + 2]), hi23 = _mm512_castps_pd(a[4 * g + 3]);
        b[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo01, lo23));
        b[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo01, lo23));
        b[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi01, hi23));
        b[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi01, hi23));
    }
    for (int j = 0; j < 4; j++) {
        const __m512 c01 = _mm512_shuffle_f32x4(b[j], b[4 + j], 0x44);      /* b0 L0 L1, b1 L0 L1 */
        const __m512 c23 = _mm512_shuffle_f32x4(b[8 + j], b[12 + j], 0x44); /* b2 L0 L1, b3 L0 L1 */
        const __m512 e01 = _mm512_shuffle_f32x4(b[j], b[4 + j], 0xEE);      /* b0 L2 L3, b1 L2 L3 */
        const __m512 e23 = _mm512_shuffle_f32x4(b[8 + j], b[12 + j], 0xEE);
        t[j] = _mm512_shuffle_f32x4(c01, c23, 0x88);
        t[4 + j] = _mm512_shuffle_f32x4(c01, c23, 0xDD);
        t[8 + j] = _mm512_shuffle_f32x4(e01, e23, 0x88);
        t[12 + j] = _mm512_shuffle_f32x4(e01, e23, 0xDD);
    }
}

/*
 * exp(x) for x in [-inf, 0] or NaN, the only arguments the online softmax makes
 * (s - m_new and m_old - m_new, with m_new >= both):
 *   x = n ln2 + r, n = round(x / ln2), |r| <= ln2/2, with ln2 split in two
 *   (Cody-Waite; the second FMA recovers the low bits of n*ln2 exactly enough);
 *   e^r by a degree-6 polynomial, a minimax fit for relative error on
 *   [-ln2/2, ln2/2] (fit error 1.9e-9 = 0.03 ulp, so rounding in the Horner
 *   steps dominates); 2^n applied by vscalefps, which is exact for normal
 *   results and rounds once into the subnormal range.
 * Against glibc's expf over every float in [-88, 0]: max error 1 ulp for normal
 * results; results below
 * FLT_MIN are subnormals within 1 ulp (of the subnormal spacing).
 * x is clamped at -104 from below, so exp(-inf) and everything under
 * -103.97 (where expf rounds to 0) is exactly +0; the clamp's operand order
 * lets NaN through (vmaxps returns its second operand when either is NaN),
 * and NaN then propagates to NaN. Positive x overflows to +inf via scalef,
 * but x > 0 never occurs here.
 */
FA_AVX512_INLINE __m512 fa_avx512_exp(__m512 x)
{
    /* 1.5 * 2^23: adding it rounds |t| < 2^22 to an integer in the low mantissa bits */
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    /* x <= -104 (a masked score's -inf among them) gives +0 below, through an
     * underflowing vscalefps that takes a microcode assist: those lanes are left out of
     * it and zeroed instead, the same bits (NaN lanes stay in) */
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-104.0f), _CMP_LE_OQ);
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
    const __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic);
    const __m512 n = _mm512_sub_ps(t, magic);
    /* ln2 = hi + lo, hi = 0x1.62e4p-1 with 16 significant bits: n*hi is exact for
     * |n| <= 150 and x - n*hi is then exact too; lo only perturbs the small r */
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-06f), r);
    __m512 p = _mm512_set1_ps(1.383684576e-03f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.374815807e-03f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.166822508e-02f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.666641980e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.999999106e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps((__mmask16)~tiny, p, n);
}

/* Dwords whose high word is fa_f32_to_bf16 of each lane (half.h), bit for bit: round
 * to nearest even by integer addition, a NaN quieted instead. Not vcvtne2ps2bf16,
 * which would flush subnormal inputs to zero, where the reference rounds them. */
FA_AVX512_INLINE __m512i fa_avx512_round_bf16_hi(__m512 v)
{
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rn = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_or_epi32(rn, nan, u, _mm512_set1_epi32(0x00400000));
}

#endif
