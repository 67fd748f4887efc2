/*
 * half.h: scalar f16, bf16 and fp8 (E4M3, E5M2) <-> f32 conversions (and f32 -> int8 codes), exact and
 * portable (integer bit manipulation, no F16C or FP16 instructions). A leaf: the reference
 * kernels and the core's packing code (convert.c) both use it, so that every
 * scalar conversion in the library rounds the same way.
 */
#ifndef FA_KERNELS_HALF_H
#define FA_KERNELS_HALF_H

#include <math.h>
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

/*
 * OCP FP8, the KV cache dtypes. E4M3 ("fn"): sign, 4 exponent bits (bias 7), 3
 * mantissa bits; no inf, NaN = S.1111.111, largest 448. E5M2: sign, 5 (bias 15), 2;
 * inf and NaN as binary16 has them, largest 57344. Both have subnormals.
 */
#define FA_F8E4M3_MAX 448.0f
#define FA_F8E5M2_MAX 57344.0f

/* An E5M2 byte is the top byte of the binary16 of the same value. */
static inline uint16_t fa_e5m2_to_f16_bits(uint8_t b)
{
    return (uint16_t)(b << 8);
}

/* The binary16 of an E4M3 value divided by FA_E4M3_F16_UNIT, exactly (subnormals
 * included): E4M3's exponent and mantissa fields slot into binary16's, whose bias is
 * 8 more. t = the sign-extended byte << 7 puts them there and the sign in bits 15 and
 * 14; bit 14 must become "NaN code" (all of 0x3f80 set, then exponent 31), and
 * t + 0x80 carries into bit 14 exactly for the NaN codes, so it is bit 14 of
 * t ^ (t + 0x80). The vector loaders compute the same bits the same way. */
#define FA_E4M3_F16_UNIT 256.0f
static inline uint16_t fa_e4m3_to_f16_bits(uint8_t b)
{
    const uint16_t sx = (uint16_t)((b & 0x80u) ? (0xff00u | b) : b);
    const uint16_t t = (uint16_t)(sx << 7);
    return (uint16_t)(t ^ ((uint16_t)(t + 0x80u) & 0x4000u));
}

static inline float fa_e4m3_to_f32(uint8_t b)
{
    return fa_f16_to_f32(fa_e4m3_to_f16_bits(b)) * FA_E4M3_F16_UNIT;
}

static inline float fa_e5m2_to_f32(uint8_t b)
{
    return fa_f16_to_f32(fa_e5m2_to_f16_bits(b));
}

/* x to an fp8 of mbits mantissa bits and exponent bias `bias`: nearest, ties to even;
 * finite values beyond fmax (the largest finite, code max_code) saturate to it; NaN
 * is sign | 0x7f (a NaN in both formats); inf is inf_code (E5M2's inf, E4M3's NaN). */
static inline uint8_t fa_f32_to_f8(float x, int mbits, int bias, float fmax, uint8_t max_code, uint8_t inf_code)
{
    const uint32_t bits = fa_bits_of_f32(x), ax = bits & 0x7fffffffu;
    const uint8_t sign = (uint8_t)((bits >> 24) & 0x80u);
    if (ax > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
    if (ax == 0x7f800000u) return (uint8_t)(sign | inf_code);
    const float a = fa_f32_of_bits(ax);
    if (a >= fmax) return (uint8_t)(sign | max_code);
    if (ax < (uint32_t)(128 - bias) << 23) {
        /* below the smallest normal, 2^(1-bias): a count of subnormal steps 2^(1-bias-mbits),
         * scaled exactly and rounded by the FPU (nearest even); 2^mbits is the smallest
         * normal's code */
        const float steps = a * fa_f32_of_bits((uint32_t)(126 + bias + mbits) << 23);
        return (uint8_t)(sign | (uint8_t)nearbyintf(steps));
    }
    const int drop = 23 - mbits; /* round f32's mantissa to mbits, ties to even; a carry bumps the exponent */
    const uint32_t r = ax + ((1u << (drop - 1)) - 1u) + ((ax >> drop) & 1u);
    const uint32_t e = (r >> 23) - 127u + (uint32_t)bias;
    return (uint8_t)(sign | e << mbits | ((r >> drop) & ((1u << mbits) - 1u)));
}

/* E4M3 saturates finite values to +-448; +-inf becomes NaN (the format has no inf). */
static inline uint8_t fa_f32_to_e4m3(float x)
{
    return fa_f32_to_f8(x, 3, 7, FA_F8E4M3_MAX, 0x7e, 0x7f);
}

/* E5M2 saturates finite values to +-57344 and keeps +-inf. */
static inline uint8_t fa_f32_to_e5m2(float x)
{
    return fa_f32_to_f8(x, 2, 15, FA_F8E5M2_MAX, 0x7b, 0x7c);
}

/* An int8 code: nearest, ties to even (the default rounding mode), clamped to [-127, 127];
 * NaN gives -127 (a NaN value's scale carries the NaN). */
static inline int8_t fa_f32_to_i8(float y)
{
    float qv = nearbyintf(y);
    if (!(qv >= -127.0f)) qv = -127.0f;
    if (qv > 127.0f) qv = 127.0f;
    return (int8_t)qv;
}

#endif
