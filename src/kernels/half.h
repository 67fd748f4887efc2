/*
 * half.h: scalar f16 and bf16 <-> f32 conversions, exact and portable (integer
 * bit manipulation, no F16C or FP16 instructions). A leaf: the reference
 * kernels and the core's packing code (convert.c) both use it, so that every
 * scalar conversion in the library rounds the same way.
 */
#ifndef FA_KERNELS_HALF_H
#define FA_KERNELS_HALF_H

#include <stdint.h>
#include <string.h>

/* An f32's bits and back, through memcpy (no aliasing through pointers). */
static inline float fa_f32_of_bits(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint32_t fa_bits_of_f32(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return x;
}

static inline float fa_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1f;
    const uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13); /* inf or NaN */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        /* subnormal: value = man * 2^-24, exact in f32 */
        const float f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    return fa_f32_of_bits(bits);
}

/* Round to nearest even; overflow to inf; NaN stays NaN (quieted). */
static inline uint16_t fa_f32_to_f16(float f)
{
    const uint32_t x = fa_bits_of_f32(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); /* NaN, kept quiet */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) {
        /* result is subnormal or zero: scale so the integer part is the f16 mantissa,
         * and let the FPU's round-to-nearest-even do the rounding */
        const float af = fa_f32_of_bits(ax);
        const float scaled = af * 16777216.0f; /* 2^24: one f16 subnormal ulp becomes 1.0 */
        /* adding and subtracting 2^23 rounds to an integer under round-to-nearest-even;
         * volatile keeps the compiler from folding the pair away */
        volatile float t = scaled + 8388608.0f;
        const uint32_t m = (uint32_t)(t - 8388608.0f);
        return (uint16_t)(sign | m); /* m == 0x400 is the smallest normal: still correct bits */
    }
    const uint32_t lsb = (ax >> 13) & 1u;
    const uint32_t r = ax + 0xfffu + lsb; /* round half to even on the 13 dropped bits */
    return (uint16_t)(sign | (((r >> 13) - (112u << 10)) & 0x7fffu));
}

static inline float fa_bf16_to_f32(uint16_t h)
{
    return fa_f32_of_bits((uint32_t)h << 16);
}

/* Round to nearest even; NaN stays NaN (quieted). */
static inline uint16_t fa_f32_to_bf16(float f)
{
    const uint32_t x = fa_bits_of_f32(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    const uint32_t lsb = (x >> 16) & 1u;
    return (uint16_t)((x + 0x7fffu + lsb) >> 16);
}

#endif
