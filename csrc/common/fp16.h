/* Inline half-precision conversions for kernels that convert one value at a time.
 * Plain C: no Python.h.
 *
 * Results are those of the x86 F16C instructions (VCVTPS2PH with round to nearest
 * even, VCVTPH2PS), which is what ggml's CPU backend uses on the hosts we match:
 * exact for every finite value and infinity; a NaN comes out quiet (top mantissa
 * bit set) with its top payload bits and sign kept. ggml's portable C conversion
 * differs only in NaN payloads. bf16 follows ggml_compute_fp32_to_bf16: round to
 * nearest even, NaN forced quiet.
 */
#ifndef GGMLRPC_FP16_H
#define GGMLRPC_FP16_H

#include <stdint.h>
#include <string.h>

static inline uint32_t gr_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float gr_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even for |v| < 2^22: adding 1.5*2^23 leaves round(v) in the
 * low mantissa bits. ggml's K-quant code rounds this way. */
static inline int gr_nearest_int(float v) {
    const float t = v + 12582912.0f;
    return (int)(gr_f32_bits(t) & 0x7fffffu) - 0x400000;
}

static inline float gr_fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) {
        /* inf, or NaN made quiet like VCVTPH2PS does */
        return gr_bits_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0));
    }
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 is exact in binary32 */
        const float v = (float)man * 0x1p-24f;
        return gr_bits_f32(sign | gr_f32_bits(v));
    }
    return gr_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t gr_fp32_to_fp16(float f) {
    const uint32_t x = gr_f32_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {
        /* NaN: quiet, keep the top 9 payload bits */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    }
    if (ax >= 0x477ff000u) {
        /* >= 65520 (half way between 65504 and 2^16, ties go to the even 2^16) */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (ax >= 0x38800000u) {
        /* normal half: rebias the exponent (127 -> 15) and round 23 -> 10 bits */
        uint32_t r = ax - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    /* subnormal half (or zero): adding 0.5 leaves exactly the bits of units of
     * 2^-24 in the mantissa, rounded to nearest even by the FPU; a carry into
     * 0x400 is the smallest normal, which is the right encoding */
    const float t = gr_bits_f32(ax) + 0.5f;
    return (uint16_t)(sign | (gr_f32_bits(t) - 0x3f000000u));
}

static inline float gr_bf16_to_fp32(uint16_t h) {
    return gr_bits_f32((uint32_t)h << 16);
}

static inline uint16_t gr_fp32_to_bf16(float f) {
    const uint32_t x = gr_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((x >> 16) | 0x40u);
    }
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

#endif /* GGMLRPC_FP16_H */
