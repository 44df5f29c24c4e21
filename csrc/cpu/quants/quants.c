/* ggml's quantized formats on the CPU: conversion to and from float, and the dot
 * products of MUL_MAT. See quants.h for the contract; the semantics (block
 * layouts, scales, rounding) are ggml's, the code is ours.
 *
 * Layout of this file: helpers; fp16/bf16 rows; dequantize (to_float); quantize
 * (from_float); scalar dot products; AVX2 kernels; dispatch tables.
 */
#include "cpu/quants/quants.h"
#include "common/fp16.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "cpu/simd.h"

#if GR_X86
#define GR_HAVE_X86 1
/* kernels compiled for AVX2/FMA/F16C and picked at run time: the build itself
 * stays baseline x86-64 */
#define GR_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define GR_HAVE_X86 0
#endif

#define GR_QK 32   /* elements per block of the 32-wide formats */

_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 size");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 size");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");
_Static_assert(sizeof(block_q8_1) == 36, "block_q8_1 size");
_Static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4 size");
_Static_assert(sizeof(block_nvfp4) == 36, "block_nvfp4 size");
_Static_assert(sizeof(block_q1_0) == 18, "block_q1_0 size");
_Static_assert(sizeof(block_q2_0) == 18, "block_q2_0 size");
_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K size");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K size");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K size");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K size");
_Static_assert(sizeof(block_q8_K) == 292, "block_q8_K size");
_Static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl size");
_Static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs size");
_Static_assert(sizeof(block_tq1_0) == 54, "block_tq1_0 size");
_Static_assert(sizeof(block_tq2_0) == 66, "block_tq2_0 size");

/* ------------------------------------------------------------------------- */
/* helpers                                                                    */
/* ------------------------------------------------------------------------- */

/* The 16 levels of IQ4_NL/IQ4_XS (a non-uniform 4-bit grid, ascending). */
static const int8_t kvalues_iq4nl[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};

/* E2M1 values times two, shared by MXFP4 and NVFP4 (index bit 3 is the sign). */
static const int8_t kvalues_fp4[16] = {
    0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
};

/* float -> int32 the way CVTTSS2SI does it: truncation toward zero, and
 * INT32_MIN for NaN or out of range. ggml's `(int8_t)(v)` casts compile to
 * this on x86, followed by keeping the low byte. */
static inline int32_t gr_cvtt_i32(float v) {
    if (v >= -2147483648.0f && v < 2147483648.0f) {
        return (int32_t)v;
    }
    return INT32_MIN;
}

/* float -> int32 like CVTPS2DQ in the default rounding mode (nearest even),
 * INT32_MIN for NaN or out of range */
static inline int32_t gr_cvtn_i32(float v) {
    if (v >= -2147483648.0f && v < 2147483648.0f) {
        return (int32_t)__builtin_rintf(v);
    }
    return INT32_MIN;
}

/* low byte of an int32, as a signed byte */
static inline int8_t gr_low_i8(int32_t v) {
    return (int8_t)(uint8_t)((uint32_t)v & 0xffu);
}

/* signed saturation to int8 (PACKSSDW then PACKSSWB) */
static inline int8_t gr_sat_i8(int32_t v) {
    return (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v);
}

/* MAXPS semantics: the second operand unless the first is strictly greater
 * (so a NaN in either position yields the second operand) */
static inline float gr_maxps(float a, float b) {
    return a > b ? a : b;
}

/* max |x[j]| over 32 floats, reduced in the lane order of ggml's AVX Q8_0/Q8_1
 * quantizer (four 8-lane MAXPS, then halves, pairs, neighbours), so that NaNs
 * propagate exactly as there */
static float gr_amax32_lanes(const float *x /* (32,) */) {
    float m[8];
    for (int l = 0; l < 8; l++) {
        m[l] = fabsf(x[l]);
    }
    for (int r = 1; r < 4; r++) {
        for (int l = 0; l < 8; l++) {
            m[l] = gr_maxps(m[l], fabsf(x[8 * r + l]));
        }
    }
    float h[4];
    for (int l = 0; l < 4; l++) {
        h[l] = gr_maxps(m[4 + l], m[l]);
    }
    const float p0 = gr_maxps(h[0], h[2]);
    const float p1 = gr_maxps(h[1], h[3]);
    return gr_maxps(p0, p1);
}

/* E8M0 exponent byte -> 2^(e-128), i.e. half the block scale: MXFP4 levels are
 * stored doubled */
static inline float gr_e8m0_half(uint8_t e) {
    return gr_bits_f32(e < 2 ? (0x00200000u << e) : ((uint32_t)(e - 1) << 23));
}

/* UE4M3 scale byte (bias 7, no sign) -> scale/2 (NVFP4 levels are doubled);
 * 0 and 0x7f (NaN) read as 0 */
static inline float gr_ue4m3_half(uint8_t v) {
    if (v == 0 || v == 0x7f) {
        return 0.0f;
    }
    const int exp = (v >> 3) & 0xf;
    const int man = v & 7;
    /* subnormal man*2^-9, normal (8+man)*2^(exp-10); both exact */
    const float raw = exp == 0 ? (float)man * 0x1p-9f
                               : (float)(8 + man) * gr_bits_f32((uint32_t)(exp - 10 + 127) << 23);
    return raw * 0.5f;
}

/* 12 bytes of Q4_K/Q5_K scales -> 8 six-bit scales and 8 six-bit mins:
 * bytes 0-3 hold scales 0-3 (+ top bits of scales 4-7), bytes 4-7 mins 0-3
 * (+ top bits of mins 4-7), bytes 8-11 the low nibbles of scales/mins 4-7 */
static inline void gr_k4_scales(const uint8_t *q /* (12,) */, uint8_t *sc /* (8,) */,
                                uint8_t *mn /* (8,) */) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        mn[j] = q[j + 4] & 63;
        sc[j + 4] = (uint8_t)((q[j + 8] & 0xf) | ((q[j] >> 6) << 4));
        mn[j + 4] = (uint8_t)((q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4));
    }
}

/* 12 bytes of Q3_K scales -> 16 signed scales (six bits, bias 32): low nibbles
 * in bytes 0-7 (scales 0-7 low, 8-15 high nibble), top two bits in bytes 8-11 */
static inline void gr_k3_scales(const uint8_t *q /* (12,) */, int8_t *sc /* (16,) */) {
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? (q[j] & 0xf) : (q[j - 8] >> 4);
        const int hi = (q[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        sc[j] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

/* IQ4_XS: six-bit scale of sub-block ib (0..7), minus its bias */
static inline int gr_iq4xs_scale(const block_iq4_xs *b, int ib) {
    const int lo = (b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf;
    const int hi = (b->scales_h >> (2 * ib)) & 3;
    return (lo | (hi << 4)) - 32;
}

/* ------------------------------------------------------------------------- */
/* fp16 / bf16                                                                */
/* ------------------------------------------------------------------------- */

float ggmlrpc_fp16_to_fp32(gr_fp16_t h) { return gr_fp16_to_fp32(h); }
gr_fp16_t ggmlrpc_fp32_to_fp16(float f) { return gr_fp32_to_fp16(f); }
float ggmlrpc_bf16_to_fp32(gr_bf16_t h) { return gr_bf16_to_fp32(h); }
gr_bf16_t ggmlrpc_fp32_to_bf16(float f) { return gr_fp32_to_bf16(f); }

static void gr_f16_to_f32_row(const void *vx /* (n,) f16 */, float *y /* (n,) */, int64_t n) {
    const uint16_t *x = vx;
    for (int64_t i = 0; i < n; i++) {
        y[i] = gr_fp16_to_fp32(x[i]);
    }
}

static void gr_f32_to_f16_row(const float *x /* (n,) */, void *vy /* (n,) f16 */, int64_t n) {
    uint16_t *y = vy;
    for (int64_t i = 0; i < n; i++) {
        y[i] = gr_fp32_to_fp16(x[i]);
    }
}

static void gr_bf16_to_f32_row(const void *vx /* (n,) bf16 */, float *y /* (n,) */, int64_t n) {
    const uint16_t *x = vx;
    for (int64_t i = 0; i < n; i++) {
        y[i] = gr_bf16_to_fp32(x[i]);
    }
}

static void gr_f32_to_bf16_row(const float *x /* (n,) */, void *vy /* (n,) bf16 */, int64_t n) {
    uint16_t *y = vy;
    for (int64_t i = 0; i < n; i++) {
        y[i] = gr_fp32_to_bf16(x[i]);
    }
}

static void gr_f32_copy_row(const void *vx /* (n,) f32 */, float *y /* (n,) */, int64_t n) {
    memcpy(y, vx, (size_t)n * sizeof(float));
}

static void gr_f32_store_row(const float *x /* (n,) */, void *vy /* (n,) f32 */, int64_t n) {
    memcpy(vy, x, (size_t)n * sizeof(float));
}

/* ------------------------------------------------------------------------- */
/* unpacking: blocks -> small integer codes                                   */
/* ------------------------------------------------------------------------- */
/* The portable kernels unpack a block into int8 codes with plain loops (which
 * compilers vectorize) and then sum products of small integers. */

/* 16 bytes of nibbles -> 32 codes: low nibbles are elements 0-15, high 16-31 */
static inline void gr_unpack_nibbles(const uint8_t *qs /* (16,) */, int8_t *c /* (32,) */) {
    for (int j = 0; j < 16; j++) {
        c[j] = (int8_t)(qs[j] & 0xf);
        c[j + 16] = (int8_t)(qs[j] >> 4);
    }
}

/* Q5_0/Q5_1: nibbles plus bit j of qh as bit 4 of element j (codes 0..31) */
static inline void gr_unpack_q5(const uint8_t *qh4 /* (4,) */, const uint8_t *qs /* (16,) */,
                          int8_t *c /* (32,) */) {
    uint32_t qh;
    memcpy(&qh, qh4, sizeof qh);
    gr_unpack_nibbles(qs, c);
    for (int j = 0; j < 32; j++) {
        c[j] = (int8_t)(c[j] | (int8_t)(((qh >> j) & 1u) << 4));
    }
}

/* 2-bit fields of 64 bytes -> 256 codes 0..3 (Q2_K, low bits of Q3_K, TQ2_0):
 * element 128h + 32p + l is bits 2p..2p+1 of qs[32h + l] */
static inline void gr_unpack_2bit(const uint8_t *qs /* (64,) */, int8_t *a /* (256,) */) {
    for (int h = 0; h < 2; h++) {
        for (int p = 0; p < 4; p++) {
            for (int l = 0; l < 32; l++) {
                a[128 * h + 32 * p + l] = (int8_t)((qs[32 * h + l] >> (2 * p)) & 3);
            }
        }
    }
}

/* Q3_K codes -4..3: the 2-bit field minus 4 where bit 4h+p of hmask[l] is clear */
static inline void gr_unpack_q3_K(const block_q3_K *b, int8_t *a /* (256,) */) {
    gr_unpack_2bit(b->qs, a);
    for (int hp = 0; hp < 8; hp++) {
        for (int l = 0; l < 32; l++) {
            a[32 * hp + l] = (int8_t)(a[32 * hp + l] - (((b->hmask[l] >> hp) & 1) ? 0 : 4));
        }
    }
}

/* Q4_K codes 0..15: chunk c of 64 elements is the low then the high nibbles of
 * qs[32c .. 32c+31] (sub-blocks 2c and 2c+1) */
static inline void gr_unpack_q4_K(const uint8_t *qs /* (128,) */, int8_t *a /* (256,) */) {
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) {
            a[64 * c + l] = (int8_t)(qs[32 * c + l] & 0xf);
            a[64 * c + 32 + l] = (int8_t)(qs[32 * c + l] >> 4);
        }
    }
}

/* Q5_K codes 0..31: Q4_K's plus bit sb of qh[l] as 16 (sb = sub-block) */
static inline void gr_unpack_q5_K(const block_q5_K *b, int8_t *a /* (256,) */) {
    gr_unpack_q4_K(b->qs, a);
    for (int sb = 0; sb < 8; sb++) {
        for (int l = 0; l < 32; l++) {
            a[32 * sb + l] = (int8_t)(a[32 * sb + l] | (((b->qh[l] >> sb) & 1) << 4));
        }
    }
}

/* Q6_K codes -32..31: element 128h + 32k + l is a nibble of ql[64h + l + 32(k%2)]
 * (low for k < 2) with bits 2k..2k+1 of qh[32h + l] on top */
static inline void gr_unpack_q6_K(const block_q6_K *b, int8_t *a /* (256,) */) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        int8_t *o = a + 128 * h;
        for (int l = 0; l < 32; l++) {
            o[l] = (int8_t)(((ql[l] & 0xf) | ((qh[l] & 3) << 4)) - 32);
            o[l + 32] = (int8_t)(((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32);
            o[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

/* TQ1_0 codes 0..2: five base-3 digits per qs byte, four per qh byte, stored as
 * a fixed-point fraction: digit k is the top base-3 digit of byte*3^k mod 256 */
static inline void gr_unpack_tq1(const block_tq1_0 *b, int8_t *a /* (256,) */) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    for (int k = 0; k < 5; k++) {
        for (int m = 0; m < 32; m++) {
            a[32 * k + m] = (int8_t)(((uint8_t)(b->qs[m] * pow3[k]) * 3) >> 8);
        }
        for (int m = 0; m < 16; m++) {
            a[160 + 16 * k + m] = (int8_t)(((uint8_t)(b->qs[32 + m] * pow3[k]) * 3) >> 8);
        }
    }
    for (int k = 0; k < 4; k++) {
        for (int m = 0; m < 4; m++) {
            a[240 + 4 * k + m] = (int8_t)(((uint8_t)(b->qh[m] * pow3[k]) * 3) >> 8);
        }
    }
}

/* sum of n products of small integers */
static inline int gr_sum_i8(const int8_t *a /* (n,) */, const int8_t *b /* (n,) */, int n) {
    int s = 0;
    for (int j = 0; j < n; j++) {
        s += a[j] * b[j];
    }
    return s;
}


/* ------------------------------------------------------------------------- */
/* dequantize: block rows -> float                                            */
/* ------------------------------------------------------------------------- */

static void dequantize_row_q4_0(const void *vx /* (n/32,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_q4_0 *x = vx;
    int8_t c[GR_QK];
    for (int64_t i = 0; i < n / GR_QK; i++, y += GR_QK) {
        const float d = gr_fp16_to_fp32(x[i].d);
        gr_unpack_nibbles(x[i].qs, c);
        for (int j = 0; j < GR_QK; j++) {
            y[j] = (float)(c[j] - 8) * d;
        }
    }
}

static void dequantize_row_q4_1(const void *vx /* (n/32,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_q4_1 *x = vx;
    int8_t c[GR_QK];
    for (int64_t i = 0; i < n / GR_QK; i++, y += GR_QK) {
        const float d = gr_fp16_to_fp32(x[i].d);
        const float m = gr_fp16_to_fp32(x[i].m);
        gr_unpack_nibbles(x[i].qs, c);
        for (int j = 0; j < GR_QK; j++) {
            y[j] = (float)c[j] * d + m;
        }
    }
}

static void dequantize_row_q5_0(const void *vx /* (n/32,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_q5_0 *x = vx;
    int8_t c[GR_QK];
    for (int64_t i = 0; i < n / GR_QK; i++, y += GR_QK) {
        const float d = gr_fp16_to_fp32(x[i].d);
        gr_unpack_q5(x[i].qh, x[i].qs, c);
        for (int j = 0; j < GR_QK; j++) {
            y[j] = (float)(c[j] - 16) * d;
        }
    }
}

static void dequantize_row_q5_1(const void *vx /* (n/32,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_q5_1 *x = vx;
    int8_t c[GR_QK];
    for (int64_t i = 0; i < n / GR_QK; i++, y += GR_QK) {
        const float d = gr_fp16_to_fp32(x[i].d);
        const float m = gr_fp16_to_fp32(x[i].m);
        gr_unpack_q5(x[i].qh, x[i].qs, c);
        for (int j = 0; j < GR_QK; j++) {
            y[j] = (float)c[j] * d + m;
        }
    }
}

static void dequantize_row_q8_0(const void *vx /* (n/32,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_q8_0 *x = vx;
    for (int64_t i = 0; i < n / GR_QK; i++, y += GR_QK) {
        const float d = gr_fp16_to_fp32(x[i].d);
        for (int j = 0; j < GR_QK; j++) {
            y[j] = (float)x[i].qs[j] * d;
        }
    }
}

static void dequantize_row_q8_K(const void *vx /* (n/256,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_q8_K *x = vx;
    for (int64_t i = 0; i < n / GR_QK_K; i++, y += GR_QK_K) {
        for (int j = 0; j < GR_QK_K; j++) {
            y[j] = x[i].d * (float)x[i].qs[j];
        }
    }
}

/* 16-level formats with one float scale per 32 elements (IQ4_NL, MXFP4, the
 * sub-blocks of IQ4_XS) */
static inline void gr_dequant_lut32(const uint8_t *qs /* (16,) */, const int8_t *lut /* (16,) */,
                                    float d, float *y /* (32,) */) {
    for (int j = 0; j < 16; j++) {
        y[j] = (float)lut[qs[j] & 0xf] * d;
        y[j + 16] = (float)lut[qs[j] >> 4] * d;
    }
}

static void dequantize_row_iq4_nl(const void *vx /* (n/32,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_iq4_nl *x = vx;
    for (int64_t i = 0; i < n / GR_QK; i++, y += GR_QK) {
        gr_dequant_lut32(x[i].qs, kvalues_iq4nl, gr_fp16_to_fp32(x[i].d), y);
    }
}

static void dequantize_row_mxfp4(const void *vx /* (n/32,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_mxfp4 *x = vx;
    for (int64_t i = 0; i < n / GR_QK; i++, y += GR_QK) {
        gr_dequant_lut32(x[i].qs, kvalues_fp4, gr_e8m0_half(x[i].e), y);
    }
}

static void dequantize_row_nvfp4(const void *vx /* (n/64,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_nvfp4 *x = vx;
    for (int64_t i = 0; i < n / 64; i++) {
        for (int s = 0; s < 4; s++, y += 16) {
            const float d = gr_ue4m3_half(x[i].d[s]);
            const uint8_t *qs = x[i].qs + 8 * s;
            for (int j = 0; j < 8; j++) {
                y[j] = (float)kvalues_fp4[qs[j] & 0xf] * d;
                y[j + 8] = (float)kvalues_fp4[qs[j] >> 4] * d;
            }
        }
    }
}

static void dequantize_row_iq4_xs(const void *vx /* (n/256,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_iq4_xs *x = vx;
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const float d = gr_fp16_to_fp32(x[i].d);
        for (int ib = 0; ib < 8; ib++, y += 32) {
            gr_dequant_lut32(x[i].qs + 16 * ib, kvalues_iq4nl, d * (float)gr_iq4xs_scale(&x[i], ib), y);
        }
    }
}

static void dequantize_row_q1_0(const void *vx /* (n/128,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_q1_0 *x = vx;
    for (int64_t i = 0; i < n / 128; i++, y += 128) {
        const float d = gr_fp16_to_fp32(x[i].d);
        for (int j = 0; j < 128; j++) {
            y[j] = ((x[i].qs[j / 8] >> (j % 8)) & 1) ? d : -d;
        }
    }
}

static void dequantize_row_q2_0(const void *vx /* (n/64,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_q2_0 *x = vx;
    for (int64_t i = 0; i < n / 64; i++, y += 64) {
        const float d = gr_fp16_to_fp32(x[i].d);
        for (int j = 0; j < 64; j++) {
            const int q = (x[i].qs[j / 4] >> (2 * (j % 4))) & 3;
            y[j] = (float)(q - 1) * d;
        }
    }
}

/* K-quants with a scale and a min per group: y = (d*scale) * code - dmin*min */
static inline void gr_dequant_groups(const int8_t *a /* (256,) */, int group, const float *dl /* (256/group,) */,
                               const float *ml /* (256/group,) or NULL */, float *y /* (256,) */) {
    for (int e = 0; e < GR_QK_K; e++) {
        y[e] = ml ? dl[e / group] * (float)a[e] - ml[e / group] : dl[e / group] * (float)a[e];
    }
}

static void dequantize_row_q2_K(const void *vx /* (n/256,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_q2_K *x = vx;
    int8_t a[GR_QK_K];
    float dl[16], ml[16];
    for (int64_t i = 0; i < n / GR_QK_K; i++, y += GR_QK_K) {
        const float d = gr_fp16_to_fp32(x[i].d);
        const float dmin = gr_fp16_to_fp32(x[i].dmin);
        for (int g = 0; g < 16; g++) {
            dl[g] = d * (float)(x[i].scales[g] & 0xf);
            ml[g] = dmin * (float)(x[i].scales[g] >> 4);
        }
        gr_unpack_2bit(x[i].qs, a);
        gr_dequant_groups(a, 16, dl, ml, y);
    }
}

static void dequantize_row_q3_K(const void *vx /* (n/256,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_q3_K *x = vx;
    int8_t a[GR_QK_K], sc[16];
    float dl[16];
    for (int64_t i = 0; i < n / GR_QK_K; i++, y += GR_QK_K) {
        const float d = gr_fp16_to_fp32(x[i].d);
        gr_k3_scales(x[i].scales, sc);
        for (int g = 0; g < 16; g++) {
            dl[g] = d * (float)sc[g];
        }
        gr_unpack_q3_K(&x[i], a);
        gr_dequant_groups(a, 16, dl, NULL, y);
    }
}

/* Q4_K and Q5_K: 8 sub-blocks of 32 with six-bit scales and mins */
static inline void gr_k4_group_scales(gr_fp16_t dh, gr_fp16_t dminh, const uint8_t *scales /* (12,) */,
                                float *dl /* (8,) */, float *ml /* (8,) */) {
    uint8_t sc[8], mn[8];
    const float d = gr_fp16_to_fp32(dh);
    const float dmin = gr_fp16_to_fp32(dminh);
    gr_k4_scales(scales, sc, mn);
    for (int s = 0; s < 8; s++) {
        dl[s] = d * (float)sc[s];
        ml[s] = dmin * (float)mn[s];
    }
}

static void dequantize_row_q4_K(const void *vx /* (n/256,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_q4_K *x = vx;
    int8_t a[GR_QK_K];
    float dl[8], ml[8];
    for (int64_t i = 0; i < n / GR_QK_K; i++, y += GR_QK_K) {
        gr_k4_group_scales(x[i].d, x[i].dmin, x[i].scales, dl, ml);
        gr_unpack_q4_K(x[i].qs, a);
        gr_dequant_groups(a, 32, dl, ml, y);
    }
}

static void dequantize_row_q5_K(const void *vx /* (n/256,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_q5_K *x = vx;
    int8_t a[GR_QK_K];
    float dl[8], ml[8];
    for (int64_t i = 0; i < n / GR_QK_K; i++, y += GR_QK_K) {
        gr_k4_group_scales(x[i].d, x[i].dmin, x[i].scales, dl, ml);
        gr_unpack_q5_K(&x[i], a);
        gr_dequant_groups(a, 32, dl, ml, y);
    }
}

static void dequantize_row_q6_K(const void *vx /* (n/256,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_q6_K *x = vx;
    int8_t a[GR_QK_K];
    float dl[16];
    for (int64_t i = 0; i < n / GR_QK_K; i++, y += GR_QK_K) {
        const float d = gr_fp16_to_fp32(x[i].d);
        for (int g = 0; g < 16; g++) {
            dl[g] = d * (float)x[i].scales[g];
        }
        gr_unpack_q6_K(&x[i], a);
        gr_dequant_groups(a, 16, dl, NULL, y);
    }
}

/* ternary formats: y = (code - 1) * d */
static void dequantize_row_tq1_0(const void *vx /* (n/256,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_tq1_0 *x = vx;
    int8_t a[GR_QK_K];
    for (int64_t i = 0; i < n / GR_QK_K; i++, y += GR_QK_K) {
        const float d = gr_fp16_to_fp32(x[i].d);
        gr_unpack_tq1(&x[i], a);
        for (int e = 0; e < GR_QK_K; e++) {
            y[e] = (float)(a[e] - 1) * d;
        }
    }
}

static void dequantize_row_tq2_0(const void *vx /* (n/256,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_tq2_0 *x = vx;
    int8_t a[GR_QK_K];
    for (int64_t i = 0; i < n / GR_QK_K; i++, y += GR_QK_K) {
        const float d = gr_fp16_to_fp32(x[i].d);
        gr_unpack_2bit(x[i].qs, a);
        for (int e = 0; e < GR_QK_K; e++) {
            y[e] = (float)(a[e] - 1) * d;
        }
    }
}

/* ------------------------------------------------------------------------- */
/* quantize: float -> block rows (ggml's CPU from_float)                      */
/* ------------------------------------------------------------------------- */

/* Q4_0/Q5_0: the scale is the element of largest magnitude (first one on ties)
 * over -2^(bits-1), so that element lands exactly on the lowest level */
static inline float gr_signed_absmax(const float *x /* (32,) */) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < GR_QK; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static inline void gr_minmax(const float *x /* (32,) */, float *min, float *max) {
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < GR_QK; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *min = lo;
    *max = hi;
}

static void quantize_row_q4_0(const float *x /* (n,) */, void *vy /* (n/32,) blocks */, int64_t n) {
    block_q4_0 *y = vy;
    for (int64_t i = 0; i < n / GR_QK; i++, x += GR_QK) {
        const float d = gr_signed_absmax(x) / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = gr_fp32_to_fp16(d);
        for (int j = 0; j < 16; j++) {
            /* ggml truncates q + 8.5 through an int8 cast: round half up, then clamp */
            const int8_t a = gr_low_i8(gr_cvtt_i32(x[j] * id + 8.5f));
            const int8_t b = gr_low_i8(gr_cvtt_i32(x[j + 16] * id + 8.5f));
            const uint8_t qa = (uint8_t)(a < 15 ? a : 15);
            const uint8_t qb = (uint8_t)(b < 15 ? b : 15);
            y[i].qs[j] = (uint8_t)(qa | (qb << 4));
        }
    }
}

static void quantize_row_q4_1(const float *x /* (n,) */, void *vy /* (n/32,) blocks */, int64_t n) {
    block_q4_1 *y = vy;
    for (int64_t i = 0; i < n / GR_QK; i++, x += GR_QK) {
        float min, max;
        gr_minmax(x, &min, &max);
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = gr_fp32_to_fp16(d);
        y[i].m = gr_fp32_to_fp16(min);
        for (int j = 0; j < 16; j++) {
            const int8_t a = gr_low_i8(gr_cvtt_i32((x[j] - min) * id + 0.5f));
            const int8_t b = gr_low_i8(gr_cvtt_i32((x[j + 16] - min) * id + 0.5f));
            const uint8_t qa = (uint8_t)(a < 15 ? a : 15);
            const uint8_t qb = (uint8_t)(b < 15 ? b : 15);
            y[i].qs[j] = (uint8_t)(qa | (qb << 4));
        }
    }
}

/* pack 32 five-bit codes: low nibbles pairwise into qs, bit 4 into qh */
static inline void gr_pack_q5(const uint8_t *c /* (32,) */, uint8_t *qh4 /* (4,) */,
                              uint8_t *qs /* (16,) */) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((c[j] & 0xf) | ((c[j + 16] & 0xf) << 4));
        qh |= (uint32_t)((c[j] >> 4) & 1) << j;
        qh |= (uint32_t)((c[j + 16] >> 4) & 1) << (j + 16);
    }
    memcpy(qh4, &qh, sizeof qh);
}

static void quantize_row_q5_0(const float *x /* (n,) */, void *vy /* (n/32,) blocks */, int64_t n) {
    block_q5_0 *y = vy;
    uint8_t c[GR_QK];
    for (int64_t i = 0; i < n / GR_QK; i++, x += GR_QK) {
        const float d = gr_signed_absmax(x) / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = gr_fp32_to_fp16(d);
        for (int j = 0; j < GR_QK; j++) {
            const int8_t q = gr_low_i8(gr_cvtt_i32(x[j] * id + 16.5f));
            c[j] = (uint8_t)(q < 31 ? q : 31);
        }
        gr_pack_q5(c, y[i].qh, y[i].qs);
    }
}

static void quantize_row_q5_1(const float *x /* (n,) */, void *vy /* (n/32,) blocks */, int64_t n) {
    block_q5_1 *y = vy;
    uint8_t c[GR_QK];
    for (int64_t i = 0; i < n / GR_QK; i++, x += GR_QK) {
        float min, max;
        gr_minmax(x, &min, &max);
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = gr_fp32_to_fp16(d);
        y[i].m = gr_fp32_to_fp16(min);
        for (int j = 0; j < GR_QK; j++) {
            /* no clamp here in ggml: the cast keeps the low byte */
            c[j] = (uint8_t)gr_cvtt_i32((x[j] - min) * id + 0.5f);
        }
        gr_pack_q5(c, y[i].qh, y[i].qs);
    }
}

/* Q8_0/Q8_1 as ggml's AVX quantizer: d = amax/127 and q = rint(x * (127/amax)),
 * with CVTPS2DQ + saturating packs for whatever is out of range. Returns d;
 * *sum gets the wrapped int32 sum of the unsaturated codes (Q8_1 stores
 * d times it). */
static inline float gr_q8_block_x86(const float *x /* (32,) */, int8_t *qs /* (32,) */, int32_t *sum) {
    const float amax = gr_amax32_lanes(x);
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    uint32_t acc = 0;
    for (int j = 0; j < GR_QK; j++) {
        const int32_t v = gr_cvtn_i32(x[j] * id);
        qs[j] = gr_sat_i8(v);
        acc += (uint32_t)v;
    }
    *sum = (int32_t)acc;
    return d;
}

/* Q8_0 and Q8_1 rows from a block quantizer that returns d and the code sum */
typedef float (*gr_q8_block_fn)(const float *x /* (32,) */, int8_t *qs /* (32,) */, int32_t *sum);

static inline void gr_q8_0_row(const float *x /* (n,) */, void *vy /* (n/32,) blocks */, int64_t n,
                               gr_q8_block_fn block) {
    block_q8_0 *y = vy;
    int32_t sum;
    for (int64_t i = 0; i < n / GR_QK; i++, x += GR_QK) {
        y[i].d = gr_fp32_to_fp16(block(x, y[i].qs, &sum));
    }
}

static inline void gr_q8_1_row(const float *x /* (n,) */, void *vy /* (n/32,) blocks */, int64_t n,
                               gr_q8_block_fn block) {
    block_q8_1 *y = vy;
    int32_t sum;
    for (int64_t i = 0; i < n / GR_QK; i++, x += GR_QK) {
        const float d = block(x, y[i].qs, &sum);
        y[i].d = gr_fp32_to_fp16(d);
        y[i].s = gr_fp32_to_fp16(d * (float)sum);
    }
}

static void quantize_row_q8_0(const float *x /* (n,) */, void *vy /* (n/32,) blocks */, int64_t n) {
    gr_q8_0_row(x, vy, n, gr_q8_block_x86);
}

static void quantize_row_q8_1(const float *x /* (n,) */, void *vy /* (n/32,) blocks */, int64_t n) {
    gr_q8_1_row(x, vy, n, gr_q8_block_x86);
}

/* Q8_0/Q8_1 as ggml-quants.c's reference (and gguf-py): id = 1/d and rounding
 * half away from zero. ggml's CPU backend runs this only where it has no SIMD
 * quantizer; kept for comparison with gguf-py. */
static inline float gr_q8_block_ref(const float *x /* (32,) */, int8_t *qs /* (32,) */, int32_t *sum) {
    float amax = 0.0f;
    for (int j = 0; j < GR_QK; j++) {
        amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t acc = 0;
    for (int j = 0; j < GR_QK; j++) {
        qs[j] = gr_low_i8(gr_cvtt_i32(roundf(x[j] * id)));
        acc += qs[j];
    }
    *sum = acc;
    return d;
}

static void quantize_row_q8_0_ref(const float *x /* (n,) */, void *vy /* (n/32,) blocks */, int64_t n) {
    gr_q8_0_row(x, vy, n, gr_q8_block_ref);
}

static void quantize_row_q8_1_ref(const float *x /* (n,) */, void *vy /* (n/32,) blocks */, int64_t n) {
    gr_q8_1_row(x, vy, n, gr_q8_block_ref);
}

/* Q8_K (the K-quants' activations): scale from the signed element of largest
 * magnitude, -127/max, so that element maps to -127; float d = 1/scale; bsums
 * are sums of 16 codes. ggml leaves bsums of an all-zero block unwritten; we
 * write zeros. */
static void quantize_row_q8_K(const float *x /* (n,) */, void *vy /* (n/256,) blocks */, int64_t n) {
    block_q8_K *y = vy;
    for (int64_t i = 0; i < n / GR_QK_K; i++, x += GR_QK_K) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < GR_QK_K; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < GR_QK_K; j++) {
            const int v = gr_nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) {
                s += y[i].qs[16 * g + j];
            }
            y[i].bsums[g] = (int16_t)s;
        }
        y[i].d = 1.0f / iscale;
    }
}

/* index of the IQ4_NL level nearest to v: the bracketing pair, then the closer
 * one (the upper on a tie, and the top one for NaN) */
static inline int gr_iq4nl_index(float v) {
    if (v <= (float)kvalues_iq4nl[0]) return 0;
    if (v >= (float)kvalues_iq4nl[15]) return 15;
    int hi = 1;
    while (hi < 15 && !(v < (float)kvalues_iq4nl[hi])) {
        hi++;
    }
    return v - (float)kvalues_iq4nl[hi - 1] < (float)kvalues_iq4nl[hi] - v ? hi - 1 : hi;
}

/* IQ4_NL as ggml's from_float (no importance weights, no scale search): the
 * first guess max/-127 picks the levels, then d is the weighted least-squares
 * scale for them with weights x^2. A block with amax < 1e-15 gets d = 0 and,
 * as in ggml, keeps the previous block's codes (zeros for the first block of a
 * call; ggml has stack garbage there). */
static void quantize_row_iq4_nl(const float *x /* (n,) */, void *vy /* (n/32,) blocks */, int64_t n) {
    block_iq4_nl *y = vy;
    uint8_t L[GR_QK] = {0};
    for (int64_t i = 0; i < n / GR_QK; i++, x += GR_QK) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < GR_QK; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        float d = 0.0f;
        if (!(amax < 1e-15f)) {
            const float id = 1.0f / (max / (float)kvalues_iq4nl[0]);
            float sumqx = 0.0f, sumq2 = 0.0f;
            for (int j = 0; j < GR_QK; j++) {
                const int l = gr_iq4nl_index(id * x[j]);
                const float q = (float)kvalues_iq4nl[l];
                const float w = x[j] * x[j];
                L[j] = (uint8_t)l;
                sumqx += w * q * x[j];
                sumq2 += w * q * q;
            }
            d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
        }
        y[i].d = gr_fp32_to_fp16(d);
        for (int j = 0; j < 16; j++) {
            y[i].qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
        }
    }
}

/* IQ4_XS as ggml's from_float (quantize_iq4_xs without importance weights):
 * per 32 the IQ4_NL levels of the guess -max/-127, then the weighted (x^2)
 * least-squares scale of the best of 15 guesses around it; the 8 scales are
 * quantized to 6 bits against the largest and the elements once more with the
 * scales as stored. */
static void quantize_row_iq4_xs(const float *x /* (n,) */, void *vy /* (n/256,) blocks */, int64_t n) {
    block_iq4_xs *y = vy;
    const float v0 = (float)kvalues_iq4nl[0];
    uint8_t L[GR_QK_K];
    float scales[8];
    for (int64_t i = 0; i < n / GR_QK_K; i++, x += GR_QK_K) {
        float max_scale = 0.0f, amax_scale = 0.0f;
        for (int ib = 0; ib < 8; ib++) {
            const float *xb = x + 32 * ib;
            float amax = 0.0f, max = 0.0f;
            for (int j = 0; j < 32; j++) {
                if (fabsf(xb[j]) > amax) {
                    amax = fabsf(xb[j]);
                    max = xb[j];
                }
            }
            scales[ib] = 0.0f;
            if (amax < 1e-15f) continue;
            float d = -max / v0;
            float id = 1 / d;
            float sumqx = 0.0f, sumq2 = 0.0f;
            for (int j = 0; j < 32; j++) {
                const float q = (float)kvalues_iq4nl[gr_iq4nl_index(id * xb[j])];
                const float w = xb[j] * xb[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            d = sumq2 > 0 ? sumqx / sumq2 : 0.0f;
            float best = d * sumqx;
            for (int itry = -7; itry <= 7; itry++) {
                id = (itry + v0) / max;
                sumqx = sumq2 = 0.0f;
                for (int j = 0; j < 32; j++) {
                    const float q = (float)kvalues_iq4nl[gr_iq4nl_index(id * xb[j])];
                    const float w = xb[j] * xb[j];
                    sumqx += w * q * xb[j];
                    sumq2 += w * q * q;
                }
                if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                    d = sumqx / sumq2;
                    best = d * sumqx;
                }
            }
            scales[ib] = d;
            if (fabsf(d) > amax_scale) {
                amax_scale = fabsf(d);
                max_scale = d;
            }
        }
        const float d = -max_scale / 32;
        const float id = d ? 1 / d : 0.0f;
        y[i].d = gr_fp32_to_fp16(d);
        y[i].scales_h = 0;
        for (int ib = 0; ib < 8; ib++) {
            int l = gr_nearest_int(id * scales[ib]);
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            const float dl = d * l;
            const float idl = dl ? 1 / dl : 0.0f;
            for (int j = 0; j < 32; j++) L[32 * ib + j] = (uint8_t)gr_iq4nl_index(idl * x[32 * ib + j]);
            l += 32;
            if (ib % 2 == 0) y[i].scales_l[ib / 2] = (uint8_t)(l & 0xf);
            else y[i].scales_l[ib / 2] |= (uint8_t)((l & 0xf) << 4);
            y[i].scales_h |= (uint16_t)((l >> 4) << (2 * ib));
        }
        for (int ib = 0; ib < 8; ib++)
            for (int j = 0; j < 16; j++)
                y[i].qs[16 * ib + j] = (uint8_t)(L[32 * ib + j] | (L[32 * ib + 16 + j] << 4));
    }
}

/* index of the E2M1 level nearest x at half-scale d (the first on ties) */
static uint8_t fp4_nearest(float x, float d) {
    int best = 0;
    float best_err = fabsf((float)kvalues_fp4[0] * d - x);
    for (int l = 1; l < 16; l++) {
        const float err = fabsf((float)kvalues_fp4[l] * d - x);
        if (err < best_err) {
            best = l;
            best_err = err;
        }
    }
    return (uint8_t)best;
}

/* MXFP4: shared exponent floor(log2 amax) - 2 (so amax lands in the top
 * levels), each element to the nearest level (first on ties) */
static void quantize_row_mxfp4(const float *x /* (n,) */, void *vy /* (n/32,) blocks */, int64_t n) {
    block_mxfp4 *y = vy;
    uint8_t c[GR_QK];
    for (int64_t i = 0; i < n / GR_QK; i++, x += GR_QK) {
        float amax = 0.0f;
        for (int j = 0; j < GR_QK; j++) {
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        }
        const uint8_t e = amax > 0.0f
            ? (uint8_t)gr_cvtt_i32(floorf(log2f(amax)) - 2.0f + 127.0f) : 0;
        const float d = gr_e8m0_half(e);
        for (int j = 0; j < GR_QK; j++) c[j] = fp4_nearest(x[j], d);
        y[i].e = e;
        for (int j = 0; j < 16; j++) {
            y[i].qs[j] = (uint8_t)(c[j] | (c[j + 16] << 4));
        }
    }
}

/* float -> UE4M3 byte as ggml rounds it: clamp to 448, round the mantissa on its
 * first dropped bit, subnormals (x < 2^-6) to man*2^-9 rounding half up */
static uint8_t gr_fp32_to_ue4m3(float x) {
    if (!(x > 0.0f)) return 0;
    if (x > 448.0f) x = 448.0f;
    const uint32_t bits = gr_f32_bits(x);
    int e = (int)((bits >> 23) & 0xff) - 127 + 7;
    if (e <= 0) {
        const int man = (int)(x * 512.0f + 0.5f);
        return man < 1 ? 0 : (uint8_t)(man > 7 ? 7 : man);
    }
    int man = (int)((bits >> 20) & 7) + (int)((bits >> 19) & 1);
    if (man > 7) {
        man = 0;
        e++;
    }
    return e >= 15 ? 0x7e : (uint8_t)((e << 3) | man);
}

/* NVFP4: per 16 elements a UE4M3 scale amax/6 (6 is the largest E2M1 level),
 * each element to the nearest level (first on ties), low nibbles the first 8 */
static void quantize_row_nvfp4(const float *x /* (n,) */, void *vy /* (n/64,) blocks */, int64_t n) {
    block_nvfp4 *y = vy;
    for (int64_t i = 0; i < n / 64; i++) {
        for (int sb = 0; sb < 4; sb++, x += 16) {
            float amax = 0.0f;
            for (int j = 0; j < 16; j++) {
                if (amax < fabsf(x[j])) amax = fabsf(x[j]);
            }
            const uint8_t ue = gr_fp32_to_ue4m3(amax / 6.0f);
            const float d = gr_ue4m3_half(ue);
            y[i].d[sb] = ue;
            for (int j = 0; j < 8; j++)
                y[i].qs[8 * sb + j] = (uint8_t)(fp4_nearest(x[j], d) | (fp4_nearest(x[j + 8], d) << 4));
        }
    }
}

/* Q1_0: scale = mean |x| of the 128, one bit per element: set where x >= 0 */
static void quantize_row_q1_0(const float *x /* (n,) */, void *vy /* (n/128,) blocks */, int64_t n) {
    block_q1_0 *y = vy;
    for (int64_t i = 0; i < n / 128; i++, x += 128) {
        float sum_abs = 0.0f;
        for (int j = 0; j < 128; j++) sum_abs += fabsf(x[j]);
        y[i].d = gr_fp32_to_fp16(sum_abs / 128);
        memset(y[i].qs, 0, sizeof y[i].qs);
        for (int j = 0; j < 128; j++) {
            if (x[j] >= 0.0f) y[i].qs[j / 8] |= (uint8_t)(1 << (j % 8));
        }
    }
}

/* Q2_0: scale = max |x| of the 64, codes round(x/scale) + 1 clamped to 0..3 */
static void quantize_row_q2_0(const float *x /* (n,) */, void *vy /* (n/64,) blocks */, int64_t n) {
    block_q2_0 *y = vy;
    for (int64_t i = 0; i < n / 64; i++, x += 64) {
        float amax = 0.0f;
        for (int j = 0; j < 64; j++) {
            if (fabsf(x[j]) > amax) amax = fabsf(x[j]);
        }
        const float id = amax > 0.0f ? 1.0f / amax : 0.0f;
        y[i].d = gr_fp32_to_fp16(amax);
        memset(y[i].qs, 0, sizeof y[i].qs);
        for (int j = 0; j < 64; j++) {
            int q = (int)roundf(x[j] * id) + 1;
            q = q < 0 ? 0 : q > 3 ? 3 : q;
            y[i].qs[j / 4] |= (uint8_t)(q << (2 * (j % 4)));
        }
    }
}

/* the ternary formats: amax of the 256 as scale, trits round(x/amax) + 1 */
static float ternary_inv_scale(const float *x /* (256,) */, gr_fp16_t *d) {
    float amax = 0.0f;
    for (int j = 0; j < GR_QK_K; j++) amax = fmaxf(amax, fabsf(x[j]));
    *d = gr_fp32_to_fp16(amax);
    return amax != 0.0f ? 1.0f / amax : 0.0f;
}

static inline int trit(float x, float id) { return (int)lroundf(x * id) + 1; }

/* TQ1_0: five trits a byte (base 3, first trit most significant), stored as
 * ceil(v * 256 / 243) so that the trits come out of the top of v * 3^k; the
 * bytes of qs take elements m + 32n (then m + 16n for the last 16 bytes), the
 * 4 of qh elements j + 4m with a fifth zero trit */
static void tq1_0_pack5(const float *x /* (5*span,) */, uint8_t *qs /* (span,) */, int span, float id) {
    for (int m = 0; m < span; m++) {
        int q = 0;
        for (int t = 0; t < 5; t++) q = q * 3 + trit(x[m + t * span], id);
        qs[m] = (uint8_t)((q * 256 + 242) / 243);
    }
}

static void quantize_row_tq1_0(const float *x /* (n,) */, void *vy /* (n/256,) blocks */, int64_t n) {
    block_tq1_0 *y = vy;
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const float id = ternary_inv_scale(x, &y[i].d);
        tq1_0_pack5(x, y[i].qs, 32, id);
        tq1_0_pack5(x + 160, y[i].qs + 32, 16, id);
        x += 240;
        for (int j = 0; j < 4; j++) {
            int q = 0;
            for (int m = 0; m < 4; m++) q = q * 3 + trit(x[j + 4 * m], id);
            y[i].qh[j] = (uint8_t)((q * 3 * 256 + 242) / 243);
        }
        x += 16;
    }
}

/* TQ2_0: four 2-bit codes a byte, byte m of each 32 holding elements m + 32n */
static void quantize_row_tq2_0(const float *x /* (n,) */, void *vy /* (n/256,) blocks */, int64_t n) {
    block_tq2_0 *y = vy;
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const float id = ternary_inv_scale(x, &y[i].d);
        for (int j = 0; j < 64; j += 32, x += 128) {
            for (int m = 0; m < 32; m++) {
                int q = 0;
                for (int t = 0; t < 4; t++) q += (trit(x[m + 32 * t], id) & 3) << (2 * t);
                y[i].qs[j + m] = (uint8_t)q;
            }
        }
    }
}

/* ------------------------------------------------------------------------- */
/* dot products, portable C                                                   */
/* ------------------------------------------------------------------------- */
/* Each sums exact integer products per block (per group for K-quants) and
 * accumulates the scaled block sums in float, as ggml's kernels do. */

static void vec_dot_f32_f32(int64_t n, float *s, const void *vx /* (n,) f32 */,
                            const void *vy /* (n,) f32 */) {
    const float *x = vx, *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        sum += (double)(x[i] * y[i]);
    }
    *s = (float)sum;
}

static void vec_dot_f16_f16(int64_t n, float *s, const void *vx /* (n,) f16 */,
                            const void *vy /* (n,) f16 */) {
    const uint16_t *x = vx, *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        sum += (double)(gr_fp16_to_fp32(x[i]) * gr_fp16_to_fp32(y[i]));
    }
    *s = (float)sum;
}

static void vec_dot_bf16_bf16(int64_t n, float *s, const void *vx /* (n,) bf16 */,
                              const void *vy /* (n,) bf16 */) {
    const uint16_t *x = vx, *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        sum += (double)(gr_bf16_to_fp32(x[i]) * gr_bf16_to_fp32(y[i]));
    }
    *s = (float)sum;
}

static void vec_dot_q4_0_q8_0(int64_t n, float *s, const void *vx /* (n/32,) q4_0 */,
                              const void *vy /* (n/32,) q8_0 */) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    int8_t c[GR_QK];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / GR_QK; i++) {
        gr_unpack_nibbles(x[i].qs, c);
        int isum = 0;
        for (int j = 0; j < GR_QK; j++) {
            isum += (c[j] - 8) * y[i].qs[j];
        }
        sum += (float)isum * (gr_fp16_to_fp32(x[i].d) * gr_fp16_to_fp32(y[i].d));
    }
    *s = sum;
}

static void vec_dot_q4_1_q8_1(int64_t n, float *s, const void *vx /* (n/32,) q4_1 */,
                              const void *vy /* (n/32,) q8_1 */) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    int8_t c[GR_QK];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / GR_QK; i++) {
        gr_unpack_nibbles(x[i].qs, c);
        const int isum = gr_sum_i8(c, y[i].qs, GR_QK);
        /* the min times the activation block's stored d*sum(q) */
        sum += (gr_fp16_to_fp32(x[i].d) * gr_fp16_to_fp32(y[i].d)) * (float)isum
             + gr_fp16_to_fp32(x[i].m) * gr_fp16_to_fp32(y[i].s);
    }
    *s = sum;
}

static void vec_dot_q5_0_q8_0(int64_t n, float *s, const void *vx /* (n/32,) q5_0 */,
                              const void *vy /* (n/32,) q8_0 */) {
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    int8_t c[GR_QK];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / GR_QK; i++) {
        gr_unpack_q5(x[i].qh, x[i].qs, c);
        for (int j = 0; j < GR_QK; j++) {
            c[j] = (int8_t)(c[j] - 16);
        }
        const int isum = gr_sum_i8(c, y[i].qs, GR_QK);
        sum += (gr_fp16_to_fp32(x[i].d) * gr_fp16_to_fp32(y[i].d)) * (float)isum;
    }
    *s = sum;
}

static void vec_dot_q5_1_q8_1(int64_t n, float *s, const void *vx /* (n/32,) q5_1 */,
                              const void *vy /* (n/32,) q8_1 */) {
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    int8_t c[GR_QK];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / GR_QK; i++) {
        gr_unpack_q5(x[i].qh, x[i].qs, c);
        const int isum = gr_sum_i8(c, y[i].qs, GR_QK);
        sum += (gr_fp16_to_fp32(x[i].d) * gr_fp16_to_fp32(y[i].d)) * (float)isum
             + gr_fp16_to_fp32(x[i].m) * gr_fp16_to_fp32(y[i].s);
    }
    *s = sum;
}

static void vec_dot_q8_0_q8_0(int64_t n, float *s, const void *vx /* (n/32,) q8_0 */,
                              const void *vy /* (n/32,) q8_0 */) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / GR_QK; i++) {
        const int isum = gr_sum_i8(x[i].qs, y[i].qs, GR_QK);
        sum += (float)isum * (gr_fp16_to_fp32(x[i].d) * gr_fp16_to_fp32(y[i].d));
    }
    *s = sum;
}

/* sum over 32 elements of lut[code] * q8, codes packed as in Q4_0 */
static inline int gr_dot_lut32(const uint8_t *qs /* (16,) */, const int8_t *lut /* (16,) */,
                               const int8_t *q8 /* (32,) */) {
    int a = 0, b = 0;
    for (int j = 0; j < 16; j++) {
        a += lut[qs[j] & 0xf] * q8[j];
        b += lut[qs[j] >> 4] * q8[j + 16];
    }
    return a + b;
}

/* IQ4_NL and MXFP4 blocks: a scale (f16, or an E8M0 byte when e8m0) then 16
 * bytes of 4-bit codes into a level table */
static inline float gr_lut_block_scale(const uint8_t *b /* block */, int e8m0) {
    if (e8m0) return gr_e8m0_half(b[0]);
    uint16_t h;
    memcpy(&h, b, sizeof h);
    return gr_fp16_to_fp32(h);
}

static inline float gr_dot_lut_row_c(int64_t nb, const uint8_t *x /* (nb,) blocks */, int e8m0,
                                     const block_q8_0 *y /* (nb,) */, const int8_t *levels /* (16,) */) {
    const size_t stride = e8m0 ? sizeof(block_mxfp4) : sizeof(block_iq4_nl);
    const size_t qoff = e8m0 ? 1 : 2;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++, x += stride) {
        const float d = gr_fp16_to_fp32(y[i].d) * gr_lut_block_scale(x, e8m0);
        sum += d * (float)gr_dot_lut32(x + qoff, levels, y[i].qs);
    }
    return sum;
}

static void vec_dot_iq4_nl_q8_0(int64_t n, float *s, const void *vx /* (n/32,) iq4_nl */,
                                const void *vy /* (n/32,) q8_0 */) {
    *s = gr_dot_lut_row_c(n / GR_QK, vx, 0, vy, kvalues_iq4nl);
}

static void vec_dot_mxfp4_q8_0(int64_t n, float *s, const void *vx /* (n/32,) mxfp4 */,
                               const void *vy /* (n/32,) q8_0 */) {
    *s = gr_dot_lut_row_c(n / GR_QK, vx, 1, vy, kvalues_fp4);
}

/* NVFP4: a 64-element block spans two Q8_0 blocks, one scale per 16 */
static void vec_dot_nvfp4_q8_0(int64_t n, float *s, const void *vx /* (n/64,) nvfp4 */,
                               const void *vy /* (n/32,) q8_0 */) {
    const block_nvfp4 *x = vx;
    const block_q8_0 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / 64; i++) {
        for (int sb = 0; sb < 4; sb++) {
            const block_q8_0 *yb = &y[2 * i + sb / 2];
            const int8_t *q8 = yb->qs + 16 * (sb % 2);
            const uint8_t *qs = x[i].qs + 8 * sb;
            int isum = 0;
            for (int j = 0; j < 8; j++) {
                isum += kvalues_fp4[qs[j] & 0xf] * q8[j];
                isum += kvalues_fp4[qs[j] >> 4] * q8[j + 8];
            }
            sum += gr_fp16_to_fp32(yb->d) * gr_ue4m3_half(x[i].d[sb]) * (float)isum;
        }
    }
    *s = sum;
}

/* Q1_0: 128 elements (4 Q8_0 blocks), +q8 where the bit is set, -q8 where not */
static void vec_dot_q1_0_q8_0(int64_t n, float *s, const void *vx /* (n/128,) q1_0 */,
                              const void *vy /* (n/32,) q8_0 */) {
    const block_q1_0 *x = vx;
    const block_q8_0 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / 128; i++) {
        float bsum = 0.0f;
        for (int k = 0; k < 4; k++) {
            const block_q8_0 *yb = &y[4 * i + k];
            int isum = 0;
            for (int j = 0; j < GR_QK; j++) {
                const int e = 32 * k + j;
                isum += ((x[i].qs[e / 8] >> (e % 8)) & 1) ? yb->qs[j] : -yb->qs[j];
            }
            bsum += gr_fp16_to_fp32(yb->d) * (float)isum;
        }
        sum += gr_fp16_to_fp32(x[i].d) * bsum;
    }
    *s = sum;
}

/* Q2_0: 64 elements (2 Q8_0 blocks) of codes {0..3} -> {-1..2} */
static void vec_dot_q2_0_q8_0(int64_t n, float *s, const void *vx /* (n/64,) q2_0 */,
                              const void *vy /* (n/32,) q8_0 */) {
    const block_q2_0 *x = vx;
    const block_q8_0 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / 64; i++) {
        float bsum = 0.0f;
        for (int k = 0; k < 2; k++) {
            const block_q8_0 *yb = &y[2 * i + k];
            int isum = 0;
            for (int j = 0; j < GR_QK; j++) {
                const int e = 32 * k + j;
                isum += (((x[i].qs[e / 4] >> (2 * (e % 4))) & 3) - 1) * yb->qs[j];
            }
            bsum += gr_fp16_to_fp32(yb->d) * (float)isum;
        }
        sum += gr_fp16_to_fp32(x[i].d) * bsum;
    }
    *s = sum;
}

/* K-quants: the min terms use the activation's bsums (sums of 16 codes), so
 * only the scale terms touch every element */
static void vec_dot_q2_K_q8_K(int64_t n, float *s, const void *vx /* (n/256,) q2_K */,
                              const void *vy /* (n/256,) q8_K */) {
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    int8_t a[GR_QK_K];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        gr_unpack_2bit(x[i].qs, a);
        int summ = 0, isum = 0;
        for (int g = 0; g < 16; g++) {
            summ += y[i].bsums[g] * (x[i].scales[g] >> 4);
            isum += (x[i].scales[g] & 0xf) * gr_sum_i8(a + 16 * g, y[i].qs + 16 * g, 16);
        }
        const float dall = y[i].d * gr_fp16_to_fp32(x[i].d);
        const float dmin = y[i].d * gr_fp16_to_fp32(x[i].dmin);
        sum += dall * (float)isum - dmin * (float)summ;
    }
    *s = sum;
}

static void vec_dot_q3_K_q8_K(int64_t n, float *s, const void *vx /* (n/256,) q3_K */,
                              const void *vy /* (n/256,) q8_K */) {
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    int8_t a[GR_QK_K], sc[16];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        gr_k3_scales(x[i].scales, sc);
        gr_unpack_q3_K(&x[i], a);
        int isum = 0;
        for (int g = 0; g < 16; g++) {
            isum += sc[g] * gr_sum_i8(a + 16 * g, y[i].qs + 16 * g, 16);
        }
        sum += (gr_fp16_to_fp32(x[i].d) * y[i].d) * (float)isum;
    }
    *s = sum;
}

/* Q4_K/Q5_K min term: sum over sub-blocks of min * (sum of its 32 q8) */
static inline int gr_k4_minsum(const uint8_t *mn /* (8,) */, const int16_t *bsums /* (16,) */) {
    int summ = 0;
    for (int sb = 0; sb < 8; sb++) {
        summ += mn[sb] * (bsums[2 * sb] + bsums[2 * sb + 1]);
    }
    return summ;
}

/* Q4_K/Q5_K once unpacked: 8 sub-blocks of 32 codes */
static inline float gr_dot_k4(const uint8_t *scales /* (12,) */, gr_fp16_t dh, gr_fp16_t dminh,
                        const int8_t *a /* (256,) */, const block_q8_K *y) {
    uint8_t sc[8], mn[8];
    gr_k4_scales(scales, sc, mn);
    int isum = 0;
    for (int sb = 0; sb < 8; sb++) {
        isum += sc[sb] * gr_sum_i8(a + 32 * sb, y->qs + 32 * sb, 32);
    }
    return (gr_fp16_to_fp32(dh) * y->d) * (float)isum
         - (gr_fp16_to_fp32(dminh) * y->d) * (float)gr_k4_minsum(mn, y->bsums);
}

static void vec_dot_q4_K_q8_K(int64_t n, float *s, const void *vx /* (n/256,) q4_K */,
                              const void *vy /* (n/256,) q8_K */) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    int8_t a[GR_QK_K];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        gr_unpack_q4_K(x[i].qs, a);
        sum += gr_dot_k4(x[i].scales, x[i].d, x[i].dmin, a, &y[i]);
    }
    *s = sum;
}

static void vec_dot_q5_K_q8_K(int64_t n, float *s, const void *vx /* (n/256,) q5_K */,
                              const void *vy /* (n/256,) q8_K */) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    int8_t a[GR_QK_K];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        gr_unpack_q5_K(&x[i], a);
        sum += gr_dot_k4(x[i].scales, x[i].d, x[i].dmin, a, &y[i]);
    }
    *s = sum;
}

static void vec_dot_q6_K_q8_K(int64_t n, float *s, const void *vx /* (n/256,) q6_K */,
                              const void *vy /* (n/256,) q8_K */) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    int8_t a[GR_QK_K];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        gr_unpack_q6_K(&x[i], a);
        int isum = 0;
        for (int g = 0; g < 16; g++) {
            isum += x[i].scales[g] * gr_sum_i8(a + 16 * g, y[i].qs + 16 * g, 16);
        }
        sum += (gr_fp16_to_fp32(x[i].d) * y[i].d) * (float)isum;
    }
    *s = sum;
}

static void vec_dot_iq4_xs_q8_K(int64_t n, float *s, const void *vx /* (n/256,) iq4_xs */,
                                const void *vy /* (n/256,) q8_K */) {
    const block_iq4_xs *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const float d = gr_fp16_to_fp32(x[i].d) * y[i].d;
        for (int ib = 0; ib < 8; ib++) {
            const int isum = gr_dot_lut32(x[i].qs + 16 * ib, kvalues_iq4nl, y[i].qs + 32 * ib);
            sum += (d * (float)gr_iq4xs_scale(&x[i], ib)) * (float)isum;
        }
    }
    *s = sum;
}

/* ternary: sum((code - 1) * q8) */
static void vec_dot_tq1_0_q8_K(int64_t n, float *s, const void *vx /* (n/256,) tq1_0 */,
                               const void *vy /* (n/256,) q8_K */) {
    const block_tq1_0 *x = vx;
    const block_q8_K *y = vy;
    int8_t a[GR_QK_K];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        gr_unpack_tq1(&x[i], a);
        for (int e = 0; e < GR_QK_K; e++) {
            a[e] = (int8_t)(a[e] - 1);
        }
        sum += (float)gr_sum_i8(a, y[i].qs, GR_QK_K) * (gr_fp16_to_fp32(x[i].d) * y[i].d);
    }
    *s = sum;
}

static void vec_dot_tq2_0_q8_K(int64_t n, float *s, const void *vx /* (n/256,) tq2_0 */,
                               const void *vy /* (n/256,) q8_K */) {
    const block_tq2_0 *x = vx;
    const block_q8_K *y = vy;
    int8_t a[GR_QK_K];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        gr_unpack_2bit(x[i].qs, a);
        for (int e = 0; e < GR_QK_K; e++) {
            a[e] = (int8_t)(a[e] - 1);
        }
        sum += (float)gr_sum_i8(a, y[i].qs, GR_QK_K) * (y[i].d * gr_fp16_to_fp32(x[i].d));
    }
    *s = sum;
}

/* ---- prompt-time panels (ggmlrpc_panel_*) ----------------------------------
 * One panel block, eight activation rows (lanes) j:
 *   f32 d[8] | i8 qs[8][32] | Q4_0, Q5_0: f32 t8[8][8] | u8 mark[8] | pad
 * t8[j][m] = 8 * (sum of qs[j][4m..4m+3]): the -8 offset of Q4_0 weights per
 * int32 lane, as a float (exact: |16 * 4 * 128| < 2^24; Q5_0's -16 doubles it),
 * so that the kernel takes maddubs(codes, qs) - t8 instead of the sign trick
 * on codes - 8.
 * mark[j] = 1 where qs[j] holds -128 (only from non-finite activations): the
 * sign trick overflows there, so that block takes the sign trick's steps for
 * all eight lanes, and stays bit-equal to ggml. */
#define GR_PANEL_Q8 (32 + 8 * 32)
#define GR_PANEL_Q4 (GR_PANEL_Q8 + 8 * 32 + 32)
/* Q4_1, Q5_1 (Q8_1 activations): f32 d[8] | i8 qs[8][32] | f32 s[8] (Q8_1's d * sum) */
#define GR_PANEL_Q81 (GR_PANEL_Q8 + 32)

/* ------------------------------------------------------------------------- */
/* AVX2 + FMA + F16C kernels                                                  */
/* ------------------------------------------------------------------------- */
#if GR_HAVE_X86

GR_AVX2 static inline float gr_hsum_ps8(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

GR_AVX2 static inline int32_t gr_hsum_epi32x8(__m256i v) {
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    r = _mm_add_epi32(r, _mm_unpackhi_epi64(r, r));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(r);
}

/* 16 bytes of packed nibbles -> 32 bytes in 0..15: low nibbles first, then high */
GR_AVX2 static inline __m256i gr_nibbles32(const uint8_t *p /* (16,) */) {
    const __m128i t = _mm_loadu_si128((const __m128i *)p);
    const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0f));
}

/* signed int8 x signed int8, 32 lanes -> 8 int32 lanes of 4-product sums
 * (the sign of x moves onto y so that PMADDUBSW sees |x| unsigned) */
GR_AVX2 static inline __m256i gr_dot_i8(__m256i x, __m256i y) {
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* two int16 scales, one per 128-bit half (16 elements each of a 32-byte
 * PMADDUBSW), or the same one twice */
GR_AVX2 static inline __m256i gr_scales16(int lo, int hi) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)lo)),
                                   _mm_set1_epi16((short)hi), 1);
}

GR_AVX2 static void gr_f16_to_f32_row_f16c(const void *vx /* (n,) f16 */, float *y /* (n,) */, int64_t n) {
    const uint16_t *x = vx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    }
    for (; i < n; i++) {
        y[i] = _cvtsh_ss(x[i]);
    }
}

GR_AVX2 static void gr_f32_to_f16_row_f16c(const float *x /* (n,) */, void *vy /* (n,) f16 */, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(y + i), h);
    }
    for (; i < n; i++) {
        y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
    }
}

GR_AVX2 static void gr_bf16_to_f32_row_avx2(const void *vx /* (n,) bf16 */, float *y /* (n,) */, int64_t n) {
    const uint16_t *x = vx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; i++) {
        y[i] = gr_bf16_to_fp32(x[i]);
    }
}

/* one Q8_0/Q8_1 block the way ggml's AVX quantizer computes it (same lane
 * order as gr_amax32_lanes/gr_q8_block_x86, which it must equal bit for bit) */
GR_AVX2 static inline float gr_q8_block_avx2(const float *x /* (32,) */, int8_t *qs /* (32,) */,
                                             int32_t *sum) {
    __m256 v0 = _mm256_loadu_ps(x);
    __m256 v1 = _mm256_loadu_ps(x + 8);
    __m256 v2 = _mm256_loadu_ps(x + 16);
    __m256 v3 = _mm256_loadu_ps(x + 24);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_andnot_ps(sign, v0);
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v1));
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v2));
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v3));
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);

    const float d = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    const int rn = _MM_FROUND_TO_NEAREST_INT;
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, id), rn));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, id), rn));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, id), rn));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, id), rn));
    *sum = gr_hsum_epi32x8(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));

    /* the packs work per 128-bit lane: dwords come out as 0 4 1 5 2 6 3 7 */
    const __m256i w01 = _mm256_packs_epi32(i0, i1);
    const __m256i w23 = _mm256_packs_epi32(i2, i3);
    const __m256i b = _mm256_packs_epi16(w01, w23);
    const __m256i q = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)qs, q);
    return d;
}

GR_AVX2 static void quantize_row_q8_0_avx2(const float *x /* (n,) */, void *vy /* (n/32,) blocks */, int64_t n) {
    gr_q8_0_row(x, vy, n, gr_q8_block_avx2);
}

GR_AVX2 static void quantize_row_q8_1_avx2(const float *x /* (n,) */, void *vy /* (n/32,) blocks */, int64_t n) {
    gr_q8_1_row(x, vy, n, gr_q8_block_avx2);
}

/* F32/F16: four 8-lane FMA accumulators over steps of 32, reduced pairwise,
 * then the tail; F16 keeps the tail in double like ggml */
GR_AVX2 static inline float gr_reduce4_ps8(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 a = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
}

GR_AVX2 static void vec_dot_f32_f32_avx2(int64_t n, float *s, const void *vx /* (n,) f32 */,
                                         const void *vy /* (n,) f32 */) {
    const float *x = vx, *y = vy;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const int64_t np = n & ~(int64_t)31;
    for (int64_t i = 0; i < np; i += 32) {
        for (int j = 0; j < 4; j++) {
            acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * j), _mm256_loadu_ps(y + i + 8 * j), acc[j]);
        }
    }
    float sum = gr_reduce4_ps8(acc[0], acc[1], acc[2], acc[3]);
    for (int64_t i = np; i < n; i++) {
        sum += x[i] * y[i];
    }
    *s = sum;
}

GR_AVX2 static void vec_dot_f16_f16_avx2(int64_t n, float *s, const void *vx /* (n,) f16 */,
                                         const void *vy /* (n,) f16 */) {
    const uint16_t *x = vx, *y = vy;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const int64_t np = n & ~(int64_t)31;
    for (int64_t i = 0; i < np; i += 32) {
        for (int j = 0; j < 4; j++) {
            const __m256 ax = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i + 8 * j)));
            const __m256 ay = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i + 8 * j)));
            acc[j] = _mm256_fmadd_ps(ax, ay, acc[j]);
        }
    }
    double sum = gr_reduce4_ps8(acc[0], acc[1], acc[2], acc[3]);
    for (int64_t i = np; i < n; i++) {
        sum += (double)(_cvtsh_ss(x[i]) * _cvtsh_ss(y[i]));
    }
    *s = (float)sum;
}

/* BF16: ggml multiplies and adds separately here (no FMA) */
GR_AVX2 static inline __m256 gr_load_bf16x8(const uint16_t *p /* (8,) */) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

GR_AVX2 static void vec_dot_bf16_bf16_avx2(int64_t n, float *s, const void *vx /* (n,) bf16 */,
                                           const void *vy /* (n,) bf16 */) {
    const uint16_t *x = vx, *y = vy;
    __m256 c[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        for (int j = 0; j < 4; j++) {
            c[j] = _mm256_add_ps(_mm256_mul_ps(gr_load_bf16x8(x + i + 8 * j), gr_load_bf16x8(y + i + 8 * j)), c[j]);
        }
    }
    double sum = gr_hsum_ps8(_mm256_add_ps(_mm256_add_ps(c[0], c[2]), _mm256_add_ps(c[1], c[3])));
    for (; i < n; i++) {
        sum += (double)(gr_bf16_to_fp32(x[i]) * gr_bf16_to_fp32(y[i]));
    }
    *s = (float)sum;
}

/* fp16 -> fp32 by table in the Q4/Q5/Q8 block kernels, as ggml's x86 build
 * converts block scales: on CPUs where VCVTPH2PS is slow (Zen 1: ~12% of the
 * Q4_0 kernel) two loads are cheaper; same values (gr_fp16_to_fp32 is F16C's
 * conversion, NaNs included). Filled when the library loads. */
static float gr_f16_tab[1 << 16];

__attribute__((constructor)) static void gr_f16_tab_init(void) {
    for (uint32_t h = 0; h < (1u << 16); h++) gr_f16_tab[h] = gr_fp16_to_fp32((uint16_t)h);
}

#define GR_F16(h) gr_f16_tab[(uint16_t)(h)]

GR_AVX2 static void vec_dot_q4_0_q8_0_avx2(int64_t n, float *s, const void *vx /* (n/32,) q4_0 */,
                                           const void *vy /* (n/32,) q8_0 */) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK; i++) {
        const __m256 d = _mm256_set1_ps(GR_F16(x[i].d) * GR_F16(y[i].d));
        const __m256i qx = _mm256_sub_epi8(gr_nibbles32(x[i].qs), _mm256_set1_epi8(8));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(gr_dot_i8(qx, qy)), acc);
    }
    *s = gr_hsum_ps8(acc);
}

GR_AVX2 static void vec_dot_q8_0_q8_0_avx2(int64_t n, float *s, const void *vx /* (n/32,) q8_0 */,
                                           const void *vy /* (n/32,) q8_0 */) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK; i++) {
        const __m256 d = _mm256_set1_ps(GR_F16(x[i].d) * GR_F16(y[i].d));
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(gr_dot_i8(qx, qy)), acc);
    }
    *s = gr_hsum_ps8(acc);
}

/* One weight row against four activation rows: every output is summed exactly
 * as vec_dot_q4_0_q8_0_avx2 / vec_dot_q8_0_q8_0_avx2 sum it (own accumulator,
 * same steps), the weight block is loaded and unpacked once for the four. */
GR_AVX2 static void vec_dot_x4_q4_0_q8_0_avx2(int64_t n, float *s /* (4,) */, const void *vx /* (n/32,) q4_0 */,
                                              const void *const vy[4] /* (n/32,) q8_0 each */) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y[4] = {vy[0], vy[1], vy[2], vy[3]};
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < n / GR_QK; i++) {
        const float dx = GR_F16(x[i].d);
        const __m256i qx = _mm256_sub_epi8(gr_nibbles32(x[i].qs), _mm256_set1_epi8(8));
        for (int j = 0; j < 4; j++) {
            const __m256 d = _mm256_set1_ps(dx * GR_F16(y[j][i].d));
            const __m256i qy = _mm256_loadu_si256((const __m256i *)y[j][i].qs);
            acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(gr_dot_i8(qx, qy)), acc[j]);
        }
    }
    for (int j = 0; j < 4; j++) s[j] = gr_hsum_ps8(acc[j]);
}

GR_AVX2 static void vec_dot_x4_q8_0_q8_0_avx2(int64_t n, float *s /* (4,) */, const void *vx /* (n/32,) q8_0 */,
                                              const void *const vy[4] /* (n/32,) q8_0 each */) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y[4] = {vy[0], vy[1], vy[2], vy[3]};
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < n / GR_QK; i++) {
        const float dx = GR_F16(x[i].d);
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        for (int j = 0; j < 4; j++) {
            const __m256 d = _mm256_set1_ps(dx * GR_F16(y[j][i].d));
            const __m256i qy = _mm256_loadu_si256((const __m256i *)y[j][i].qs);
            acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(gr_dot_i8(qx, qy)), acc[j]);
        }
    }
    for (int j = 0; j < 4; j++) s[j] = gr_hsum_ps8(acc[j]);
}

/* Q4_0 x Q8_0 with the offset moved out of the inner loop: per lane,
 * sum((x - 8) * y) = sum(x * y) - 8 * sum(y), x in 0..15 unsigned, so PMADDUBSW
 * takes the nibbles as they are (no sign juggling) and 8 * sum(y) per lane is
 * computed once per activation row (it is shared by every weight row). The int32
 * lanes equal those of vec_dot_q4_0_q8_0_avx2 exactly, except where y holds -128
 * (that kernel's sign trick overflows there): such blocks are marked and take
 * that kernel's steps. */
#define GR_Q4S_MARK INT32_MIN

GR_AVX2 static void q4_0_act_sums_avx2(const void *vy /* (nb,) q8_0 */, int32_t *sums /* (nb, 8) */, int64_t nb) {
    const block_q8_0 *y = vy;
    for (int64_t i = 0; i < nb; i++) {
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        __m256i v = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(8), qy), _mm256_set1_epi16(1));
        if (_mm256_movemask_epi8(_mm256_cmpeq_epi8(qy, _mm256_set1_epi8(-128))))
            v = _mm256_set1_epi32(GR_Q4S_MARK);
        _mm256_storeu_si256((__m256i *)(sums + 8 * i), v);
    }
}

GR_AVX2 static void vec_dot_q4_0_q8_0_sums_avx2(int64_t n, float *s, const void *vx /* (n/32,) q4_0 */,
                                                const void *vy /* (n/32,) q8_0 */, const int32_t *sums) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK; i++) {
        const __m256 d = _mm256_set1_ps(GR_F16(x[i].d) * GR_F16(y[i].d));
        const __m256i qx = gr_nibbles32(x[i].qs);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        __m256i p;
        if (sums[8 * i] != GR_Q4S_MARK)
            p = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(qx, qy), _mm256_set1_epi16(1)),
                                 _mm256_loadu_si256((const __m256i *)(sums + 8 * i)));
        else
            p = gr_dot_i8(_mm256_sub_epi8(qx, _mm256_set1_epi8(8)), qy);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
    }
    *s = gr_hsum_ps8(acc);
}

/* d[j] = dx * d_act[j] for the eight lanes, as vec_dot computes each */
GR_AVX2 static inline void gr_panel_scales(float dx, const uint8_t *p, float dp[8]) {
    _mm256_store_ps(dp, _mm256_mul_ps(_mm256_set1_ps(dx), _mm256_loadu_ps((const float *)p)));
}

/* The eight accumulators are named variables, not an array: GCC keeps an
 * array of them in memory and stores all eight on every block. STEP(j, q) adds
 * lane j's int32 lanes q (as floats, scaled) to acc##j. */
#define GR_PANEL_ACC8                                                                    \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0, acc4 = acc0, \
           acc5 = acc0, acc6 = acc0, acc7 = acc0
#define GR_PANEL_FMA(j, f) acc##j = _mm256_fmadd_ps(_mm256_broadcast_ss(dp + (j)), (f), acc##j)
#define GR_PANEL_EACH(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
/* four lanes at a time, the integer steps of the four before their float steps
 * (a little faster than lane after lane on Zen 1): I(j) gives lane j's int32
 * lanes, F(j, v) their floats */
#define GR_PANEL_QUAD(a, b, c, d, I, F)                                  \
    {                                                                   \
        const __m256i va = I(a), vb = I(b), vc = I(c), vd = I(d);       \
        GR_PANEL_FMA(a, F(a, va)); GR_PANEL_FMA(b, F(b, vb));           \
        GR_PANEL_FMA(c, F(c, vc)); GR_PANEL_FMA(d, F(d, vd));           \
    }
#define GR_PANEL_STAGED(I, F) GR_PANEL_QUAD(0, 1, 2, 3, I, F) GR_PANEL_QUAD(4, 5, 6, 7, I, F)
/* unsigned codes qx against lane j's q8 (no sign steps): the int32 lane sums */
#define GR_PANEL_U8_INT(j) \
    _mm256_madd_epi16(_mm256_maddubs_epi16(qx, _mm256_loadu_si256((const __m256i *)(p + 32 + 32 * (j)))), _mm256_set1_epi16(1))

/* s[j] = gr_hsum_ps8(acc_j) for the eight at once, the same additions in the
 * same order per output: (v0+v4)+(v2+v6) and (v1+v5)+(v3+v7), then their sum */
GR_AVX2 static inline void gr_hsum8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5,
                                      __m256 a6, __m256 a7, float *s) {
#define GR_HALVES(x, y) _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x31), _mm256_permute2f128_ps(x, y, 0x20))
    const __m256 t01 = GR_HALVES(a0, a1), t23 = GR_HALVES(a2, a3);   /* r_j[k] = v_k + v_(k+4) */
    const __m256 t45 = GR_HALVES(a4, a5), t67 = GR_HALVES(a6, a7);
#undef GR_HALVES
    const __m256 u0 = _mm256_add_ps(_mm256_shuffle_ps(t01, t23, 0x44), _mm256_shuffle_ps(t01, t23, 0xEE));
    const __m256 u1 = _mm256_add_ps(_mm256_shuffle_ps(t45, t67, 0x44), _mm256_shuffle_ps(t45, t67, 0xEE));
    const __m256 h = _mm256_hadd_ps(u0, u1);   /* s0 s2 s4 s6 | s1 s3 s5 s7 */
    _mm256_storeu_ps(s, _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}
#define GR_PANEL_STORE8 gr_hsum8x8(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, s)

/* lane j's int32 lanes by the sign trick, as floats */
GR_AVX2 static inline __m256 gr_panel_sign_lane(__m256i qx, const uint8_t *p, int j) {
    return _mm256_cvtepi32_ps(gr_dot_i8(qx, _mm256_loadu_si256((const __m256i *)(p + 32 + 32 * j))));
}

GR_AVX2 static void panel_dot_q8_0_avx2(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) q8_0 */,
                                        const void *panel /* (n/32,) panel blocks */) {
    const block_q8_0 *x = vx;
    const uint8_t *p = panel;
    GR_PANEL_ACC8;
    float dp[8] __attribute__((aligned(32)));
    for (int64_t i = 0; i < n / GR_QK; i++, p += GR_PANEL_Q8) {
        gr_panel_scales(GR_F16(x[i].d), p, dp);
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
#define Q8_INT(j) gr_dot_i8(qx, _mm256_loadu_si256((const __m256i *)(p + 32 + 32 * (j))))
#define Q8_FLT(j, v) _mm256_cvtepi32_ps(v)
        GR_PANEL_STAGED(Q8_INT, Q8_FLT)
    }
    GR_PANEL_STORE8;
}

/* Q4_K: the min term goes to a 4-lane accumulator (pairs of sub-blocks), the
 * scale term to an 8-lane one, as in ggml's AVX2 kernel */
GR_AVX2 static void vec_dot_q4_K_q8_K_avx2(int64_t n, float *s, const void *vx /* (n/256,) q4_K */,
                                           const void *vy /* (n/256,) q8_K */) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc = _mm256_setzero_ps();
    __m128 acc_m = _mm_setzero_ps();
    uint8_t sc[8], mn[8];
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const float d = y[i].d * _cvtsh_ss(x[i].d);
        const float dmin = -y[i].d * _cvtsh_ss(x[i].dmin);
        gr_k4_scales(x[i].scales, sc, mn);

        /* sums of 32 q8 per sub-block, times the mins, two sub-blocks a lane */
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        const __m128i q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
        const __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(_mm_madd_epi16(mins, q8s)), acc_m);

        const uint8_t *q4 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++, q4 += 32, q8 += 64) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)q4);
            const __m256i lo = _mm256_and_si256(bits, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q8));
            const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * j]), pl));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * j + 1]), ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    *s = gr_hsum_ps8(acc) + _mm_cvtss_f32(acc_m);
}

GR_AVX2 static void vec_dot_q5_K_q8_K_avx2(int64_t n, float *s, const void *vx /* (n/256,) q5_K */,
                                           const void *vy /* (n/256,) q8_K */) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc = _mm256_setzero_ps();
    float acc_m = 0.0f;
    uint8_t sc[8], mn[8];
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const float d = y[i].d * _cvtsh_ss(x[i].d);
        const float dmin = -y[i].d * _cvtsh_ss(x[i].dmin);
        gr_k4_scales(x[i].scales, sc, mn);
        /* fused, as ggml's `summs += dmin * isum` compiles for x86 (contracted) */
        acc_m = fmaf(dmin, (float)gr_k4_minsum(mn, y[i].bsums), acc_m);

        const uint8_t *q5 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++, q5 += 32, q8 += 64) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)q5);
            /* bit 2j of qh[l] is the 5th bit of the low nibble, bit 2j+1 of the high */
            const __m256i hl = _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j), _mm256_set1_epi8(1));
            const __m256i hh = _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j + 1), _mm256_set1_epi8(1));
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(bits, m4), _mm256_slli_epi16(hl, 4));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4),
                                               _mm256_slli_epi16(hh, 4));
            const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q8));
            const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * j]), pl));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * j + 1]), ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = gr_hsum_ps8(acc) + acc_m;
}

/* Q6_K: the unsigned codes 0..63 go through PMADDUBSW; the bias of 32 comes
 * off at the end as 32 * sum(scale * bsum) */
GR_AVX2 static void vec_dot_q6_K_q8_K_avx2(int64_t n, float *s, const void *vx /* (n/256,) q6_K */,
                                           const void *vy /* (n/256,) q8_K */) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i m15 = _mm256_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const float d = y[i].d * _cvtsh_ss(x[i].d);
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        const __m256i bias = _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 5);

        const uint8_t *ql = x[i].ql;
        const uint8_t *qh = x[i].qh;
        const int8_t *q8 = y[i].qs;
        const int8_t *sc = x[i].scales;
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, q8 += 128, sc += 8) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m15), _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m15),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m3), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m15),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m3), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m15),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m3), 4));
            for (int k = 0; k < 4; k++) {
                const __m256i p16 = _mm256_maddubs_epi16(q[k], _mm256_loadu_si256((const __m256i *)(q8 + 32 * k)));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(gr_scales16(sc[2 * k], sc[2 * k + 1]), p16));
            }
        }
        sumi = _mm256_sub_epi32(sumi, bias);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = gr_hsum_ps8(acc);
}

/* 32 bits -> 32 bytes, 0xff where the bit is set (bit j -> byte j) */
GR_AVX2 static inline __m256i gr_bits_to_bytes32(const uint8_t *p /* (4,) */) {
    uint32_t b;
    memcpy(&b, p, sizeof b);
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)b), pick);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* unsigned codes x signed q8 -> 8 int32 lanes as float */
GR_AVX2 static inline __m256 gr_dot_u8_ps(__m256i qx, __m256i qy) {
    const __m256i p16 = _mm256_maddubs_epi16(qx, qy);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

/* Q5_0/Q5_1 codes 0..31: nibbles with bit 4 from qh */
GR_AVX2 static inline __m256i gr_q5_codes32(const uint8_t *qh /* (4,) */, const uint8_t *qs /* (16,) */) {
    const __m256i hi = _mm256_and_si256(gr_bits_to_bytes32(qh), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(gr_nibbles32(qs), hi);
}

/* Q4_0 and Q5_0: unsigned codes c (nibbles, or nibbles and the fifth bit) and
 * the weight is c - off; maddubs(c, qs) - t (t = off * lane sums, kept in the
 * panel for off = 8 and doubled for 16, exactly) replaces the sign trick on
 * c - off, which blocks holding -128 still take (the panel marks them) */
GR_AVX2 static inline __attribute__((always_inline)) void gr_panel_dot_off(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) blocks */,
                                                                           const void *panel /* (n/32,) */, int q5) {
    const uint8_t *x = vx;
    const size_t bsize = q5 ? sizeof(block_q5_0) : sizeof(block_q4_0);
    const uint8_t *p = panel;
    GR_PANEL_ACC8;
    float dp[8] __attribute__((aligned(32)));
    for (int64_t i = 0; i < n / GR_QK; i++, p += GR_PANEL_Q4, x += bsize) {
        gr_fp16_t dx;
        memcpy(&dx, x, 2);
        gr_panel_scales(GR_F16(dx), p, dp);
        const __m256i qx = q5 ? gr_q5_codes32(((const block_q5_0 *)x)->qh, ((const block_q5_0 *)x)->qs)
                              : gr_nibbles32(((const block_q4_0 *)x)->qs);
        uint64_t marks;
        memcpy(&marks, p + GR_PANEL_Q8 + 8 * 32, 8);
        if (__builtin_expect(marks == 0, 1)) {
#define OFF_T(j) _mm256_loadu_ps((const float *)(p + GR_PANEL_Q8 + 32 * (j)))
#define OFF_FLT(j, v) _mm256_sub_ps(_mm256_cvtepi32_ps(v), q5 ? _mm256_add_ps(OFF_T(j), OFF_T(j)) : OFF_T(j))
            GR_PANEL_STAGED(GR_PANEL_U8_INT, OFF_FLT)
#undef OFF_T
#undef OFF_FLT
        } else {
            const __m256i qs = _mm256_sub_epi8(qx, _mm256_set1_epi8(q5 ? 16 : 8));
#define OFF_SIGN_STEP(j) GR_PANEL_FMA(j, gr_panel_sign_lane(qs, p, j));
            GR_PANEL_EACH(OFF_SIGN_STEP)
#undef OFF_SIGN_STEP
        }
    }
    GR_PANEL_STORE8;
}

GR_AVX2 static void panel_dot_q4_0_avx2(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) q4_0 */,
                                        const void *panel /* (n/32,) panel blocks */) {
    gr_panel_dot_off(n, s, vx, panel, 0);
}

GR_AVX2 static void panel_dot_q5_0_avx2(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) q5_0 */,
                                        const void *panel /* (n/32,) panel blocks */) {
    gr_panel_dot_off(n, s, vx, panel, 1);
}


/* Q4_1/Q5_1: the min term m * s (s = the activation's d*sum(q)) is summed
 * apart in float, as ggml's AVX2 kernels do */
GR_AVX2 static void vec_dot_q4_1_q8_1_avx2(int64_t n, float *s, const void *vx /* (n/32,) q4_1 */,
                                           const void *vy /* (n/32,) q8_1 */) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t i = 0; i < n / GR_QK; i++) {
        summs += GR_F16(x[i].m) * GR_F16(y[i].s);
        const __m256 d = _mm256_set1_ps(GR_F16(x[i].d) * GR_F16(y[i].d));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, gr_dot_u8_ps(gr_nibbles32(x[i].qs), qy), acc);
    }
    *s = gr_hsum_ps8(acc) + summs;
}

/* Q4_1/Q5_1 against eight Q8_1 rows: the vec_dot steps per output, the minimum
 * terms (summs += m * s, rounded product then sum) eight at a time */
GR_AVX2 static inline __attribute__((always_inline)) void gr_panel_dot_min(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) blocks */,
                                                                           const void *panel /* (n/32,) */, int q5) {
    const uint8_t *x = vx;
    const size_t bsize = q5 ? sizeof(block_q5_1) : sizeof(block_q4_1);
    const uint8_t *p = panel;
    GR_PANEL_ACC8;
    __m256 summs = _mm256_setzero_ps();
    float dp[8] __attribute__((aligned(32)));
    for (int64_t i = 0; i < n / GR_QK; i++, p += GR_PANEL_Q81, x += bsize) {
        gr_fp16_t dx, mx;
        memcpy(&dx, x, 2);
        memcpy(&mx, x + 2, 2);
        summs = _mm256_add_ps(summs, _mm256_mul_ps(_mm256_set1_ps(GR_F16(mx)),
                                                   _mm256_loadu_ps((const float *)(p + GR_PANEL_Q8))));
        gr_panel_scales(GR_F16(dx), p, dp);
        const __m256i qx = q5 ? gr_q5_codes32(((const block_q5_1 *)x)->qh, ((const block_q5_1 *)x)->qs)
                              : gr_nibbles32(((const block_q4_1 *)x)->qs);
#define MIN_FLT(j, v) _mm256_cvtepi32_ps(v)
        GR_PANEL_STAGED(GR_PANEL_U8_INT, MIN_FLT)
#undef MIN_FLT
    }
    GR_PANEL_STORE8;
    _mm256_storeu_ps(s, _mm256_add_ps(_mm256_loadu_ps(s), summs));   /* hsum(acc) + summs */
}

GR_AVX2 static void panel_dot_q4_1_avx2(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) q4_1 */,
                                        const void *panel /* (n/32,) panel blocks */) {
    gr_panel_dot_min(n, s, vx, panel, 0);
}

GR_AVX2 static void panel_dot_q5_1_avx2(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) q5_1 */,
                                        const void *panel /* (n/32,) panel blocks */) {
    gr_panel_dot_min(n, s, vx, panel, 1);
}

GR_AVX2 static void vec_dot_q5_0_q8_0_avx2(int64_t n, float *s, const void *vx /* (n/32,) q5_0 */,
                                           const void *vy /* (n/32,) q8_0 */) {
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK; i++) {
        const __m256 d = _mm256_set1_ps(GR_F16(x[i].d) * GR_F16(y[i].d));
        const __m256i qx = _mm256_sub_epi8(gr_q5_codes32(x[i].qh, x[i].qs), _mm256_set1_epi8(16));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(gr_dot_i8(qx, qy)), acc);
    }
    *s = gr_hsum_ps8(acc);
}

GR_AVX2 static void vec_dot_q5_1_q8_1_avx2(int64_t n, float *s, const void *vx /* (n/32,) q5_1 */,
                                           const void *vy /* (n/32,) q8_1 */) {
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t i = 0; i < n / GR_QK; i++) {
        summs += GR_F16(x[i].m) * GR_F16(y[i].s);
        const __m256 d = _mm256_set1_ps(GR_F16(x[i].d) * GR_F16(y[i].d));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, gr_dot_u8_ps(gr_q5_codes32(x[i].qh, x[i].qs), qy), acc);
    }
    *s = gr_hsum_ps8(acc) + summs;
}

/* Q2_K/Q3_K: pass p of half h is the 2-bit field p of 32 bytes; its 32
 * elements are groups 8h+2p and 8h+2p+1 (one per 128-bit half). Q2_K's min
 * term goes into the same accumulator first, as in ggml's AVX2 kernel. */
GR_AVX2 static void vec_dot_q2_K_q8_K_avx2(int64_t n, float *s, const void *vx /* (n/256,) q2_K */,
                                           const void *vy /* (n/256,) q8_K */) {
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m3 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const uint8_t *sc = x[i].scales;
        const float d = y[i].d * _cvtsh_ss(x[i].d);
        const float dmin = -y[i].d * _cvtsh_ss(x[i].dmin);
        const __m128i packed = _mm_loadu_si128((const __m128i *)sc);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0xf)));
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, bsums)), acc);

        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            for (int p = 0; p < 4; p++) {
                const int g = 8 * h + 2 * p;
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * p), m3);
                const __m256i q8 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 128 * h + 32 * p));
                const __m256i p16 = _mm256_maddubs_epi16(q, q8);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(gr_scales16(sc[g] & 0xf, sc[g + 1] & 0xf), p16));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = gr_hsum_ps8(acc);
}

GR_AVX2 static void vec_dot_q3_K_q8_K_avx2(int64_t n, float *s, const void *vx /* (n/256,) q3_K */,
                                           const void *vy /* (n/256,) q8_K */) {
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i one = _mm256_set1_epi8(1);
    int8_t sc[16];
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        gr_k3_scales(x[i].scales, sc);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            for (int p = 0; p < 4; p++) {
                const int g = 8 * h + 2 * p;
                const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * p), m3);
                /* 4 off where the high bit (bit 4h+p of hmask[l]) is clear */
                const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + p), one);
                const __m256i q = _mm256_sub_epi8(lo, _mm256_slli_epi16(_mm256_xor_si256(hb, one), 2));
                const __m256i q8 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 128 * h + 32 * p));
                const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(q8, q));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(gr_scales16(sc[g], sc[g + 1]), p16));
            }
        }
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(x[i].d) * y[i].d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = gr_hsum_ps8(acc);
}

/* 16-level formats: PSHUFB looks the 4-bit codes up in the level table */
GR_AVX2 static inline __m256i gr_lut_nibbles32(const uint8_t *qs /* (16,) */, __m256i lut) {
    return _mm256_shuffle_epi8(lut, gr_nibbles32(qs));
}

GR_AVX2 static inline __m256i gr_lut_load(const int8_t *levels /* (16,) */) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)levels));
}

/* gr_lut_block_scale with the F16 scale through the table (same values) */
static inline float gr_lut_block_scale_tab(const uint8_t *b /* block */, int e8m0) {
    if (e8m0) return gr_e8m0_half(b[0]);
    uint16_t h;
    memcpy(&h, b, sizeof h);
    return GR_F16(h);
}

/* IQ4_NL/MXFP4 like ggml's AVX2 kernels: even and odd blocks go to two
 * accumulators; an odd last block is added in scalar float */
GR_AVX2 static inline float gr_dot_lut_row(int64_t nb, const uint8_t *x /* (nb,) blocks */, int e8m0,
                                           const block_q8_0 *y /* (nb,) */, const int8_t *levels /* (16,) */) {
    const size_t stride = e8m0 ? sizeof(block_mxfp4) : sizeof(block_iq4_nl);
    const size_t qoff = e8m0 ? 1 : 2;
    const __m256i lut = gr_lut_load(levels);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        for (int k = 0; k < 2; k++) {
            const uint8_t *b = x + (size_t)(i + k) * stride;
            const __m256i qx = gr_lut_nibbles32(b + qoff, lut);
            const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i + k].qs);
            const __m256 d = _mm256_set1_ps(GR_F16(y[i + k].d) * gr_lut_block_scale_tab(b, e8m0));
            acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(gr_dot_i8(qx, qy)), acc[k]);
        }
    }
    float sum = gr_hsum_ps8(_mm256_add_ps(acc[0], acc[1]));
    if (i < nb) {
        const uint8_t *b = x + (size_t)i * stride;
        sum += (GR_F16(y[i].d) * gr_lut_block_scale_tab(b, e8m0)) * (float)gr_dot_lut32(b + qoff, levels, y[i].qs);
    }
    return sum;
}

GR_AVX2 static void vec_dot_iq4_nl_q8_0_avx2(int64_t n, float *s, const void *vx /* (n/32,) iq4_nl */,
                                             const void *vy /* (n/32,) q8_0 */) {
    *s = gr_dot_lut_row(n / GR_QK, vx, 0, vy, kvalues_iq4nl);
}

/* IQ4_NL the way llamafile's tinyBLAS_Q0_AVX sums a product (what ggml's CPU
 * backend runs for 2+ activation rows): one accumulator, blocks in order */
GR_AVX2 static void vec_dot_iq4_nl_q8_0_seq_avx2(int64_t n, float *s, const void *vx /* (n/32,) iq4_nl */,
                                                 const void *vy /* (n/32,) q8_0 */) {
    const block_iq4_nl *x = vx;
    const block_q8_0 *y = vy;
    const __m256i lut = gr_lut_load(kvalues_iq4nl);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK; i++) {
        const __m256 d = _mm256_set1_ps(GR_F16(x[i].d) * GR_F16(y[i].d));
        const __m256i qx = gr_lut_nibbles32(x[i].qs, lut);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(gr_dot_i8(qx, qy)), acc);
    }
    *s = gr_hsum_ps8(acc);
}

GR_AVX2 static void panel_dot_iq4_nl_avx2(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) iq4_nl */,
                                          const void *panel /* (n/32,) panel blocks */) {
    const block_iq4_nl *x = vx;
    const uint8_t *p = panel;
    const __m256i lut = gr_lut_load(kvalues_iq4nl);
    GR_PANEL_ACC8;
    float dp[8] __attribute__((aligned(32)));
    for (int64_t i = 0; i < n / GR_QK; i++, p += GR_PANEL_Q8) {
        gr_panel_scales(GR_F16(x[i].d), p, dp);
        const __m256i qx = gr_lut_nibbles32(x[i].qs, lut);
        GR_PANEL_STAGED(Q8_INT, Q8_FLT)   /* the Q8_0 kernel's steps on the looked-up levels */
#undef Q8_INT
#undef Q8_FLT
    }
    GR_PANEL_STORE8;
}

GR_AVX2 static void vec_dot_mxfp4_q8_0_avx2(int64_t n, float *s, const void *vx /* (n/32,) mxfp4 */,
                                            const void *vy /* (n/32,) q8_0 */) {
    *s = gr_dot_lut_row(n / GR_QK, vx, 1, vy, kvalues_fp4);
}

GR_AVX2 static void vec_dot_iq4_xs_q8_K_avx2(int64_t n, float *s, const void *vx /* (n/256,) iq4_xs */,
                                             const void *vy /* (n/256,) q8_K */) {
    const block_iq4_xs *x = vx;
    const block_q8_K *y = vy;
    const __m256i lut = gr_lut_load(kvalues_iq4nl);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        __m256i sumi = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const __m256i qx = gr_lut_nibbles32(x[i].qs + 16 * ib, lut);
            const __m256i qy = _mm256_loadu_si256((const __m256i *)(y[i].qs + 32 * ib));
            /* the sub-block scale goes into the pair sums' PMADDWD (the same exact
             * integers as multiplying the lane sums, without the slow VPMULLD) */
            const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, _mm256_set1_epi16((short)gr_iq4xs_scale(&x[i], ib))));
        }
        const __m256 d = _mm256_set1_ps(GR_F16(x[i].d) * y[i].d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = gr_hsum_ps8(acc);
}

#endif /* GR_HAVE_X86 */

/* ------------------------------------------------------------------------- */
/* dispatch                                                                   */
/* ------------------------------------------------------------------------- */

#define GR_NTYPES 43   /* ggml_type ids 0..42 */

typedef struct {
    int32_t blck;                       /* elements per block; 0 = not handled here */
    int32_t vec_dot_type;               /* ggml's activation type for MUL_MAT, -1 none */
    ggmlrpc_to_float_fn to_float;
    ggmlrpc_from_float_fn from_float;
    ggmlrpc_from_float_fn from_float_ref;   /* NULL: same as from_float */
    ggmlrpc_vec_dot_fn vec_dot;
} gr_qtraits;

static const gr_qtraits gr_traits[GR_NTYPES] = {
    [GR_TYPE_F32] = {1, GR_TYPE_F32, gr_f32_copy_row, gr_f32_store_row, NULL, vec_dot_f32_f32},
    [GR_TYPE_F16] = {1, GR_TYPE_F16, gr_f16_to_f32_row, gr_f32_to_f16_row, NULL, vec_dot_f16_f16},
    [GR_TYPE_BF16] = {1, GR_TYPE_BF16, gr_bf16_to_f32_row, gr_f32_to_bf16_row, NULL, vec_dot_bf16_bf16},
    [GR_TYPE_Q4_0] = {32, GR_TYPE_Q8_0, dequantize_row_q4_0, quantize_row_q4_0, NULL, vec_dot_q4_0_q8_0},
    [GR_TYPE_Q4_1] = {32, GR_TYPE_Q8_1, dequantize_row_q4_1, quantize_row_q4_1, NULL, vec_dot_q4_1_q8_1},
    [GR_TYPE_Q5_0] = {32, GR_TYPE_Q8_0, dequantize_row_q5_0, quantize_row_q5_0, NULL, vec_dot_q5_0_q8_0},
    [GR_TYPE_Q5_1] = {32, GR_TYPE_Q8_1, dequantize_row_q5_1, quantize_row_q5_1, NULL, vec_dot_q5_1_q8_1},
    [GR_TYPE_Q8_0] = {32, GR_TYPE_Q8_0, dequantize_row_q8_0, quantize_row_q8_0, quantize_row_q8_0_ref,
                      vec_dot_q8_0_q8_0},
    [GR_TYPE_Q8_1] = {32, -1, NULL, quantize_row_q8_1, quantize_row_q8_1_ref, NULL},
    [GR_TYPE_Q2_K] = {256, GR_TYPE_Q8_K, dequantize_row_q2_K, gr_quantize_row_q2_K, NULL, vec_dot_q2_K_q8_K},
    [GR_TYPE_Q3_K] = {256, GR_TYPE_Q8_K, dequantize_row_q3_K, gr_quantize_row_q3_K, NULL, vec_dot_q3_K_q8_K},
    [GR_TYPE_Q4_K] = {256, GR_TYPE_Q8_K, dequantize_row_q4_K, gr_quantize_row_q4_K, NULL, vec_dot_q4_K_q8_K},
    [GR_TYPE_Q5_K] = {256, GR_TYPE_Q8_K, dequantize_row_q5_K, gr_quantize_row_q5_K, NULL, vec_dot_q5_K_q8_K},
    [GR_TYPE_Q6_K] = {256, GR_TYPE_Q8_K, dequantize_row_q6_K, gr_quantize_row_q6_K, NULL, vec_dot_q6_K_q8_K},
    [GR_TYPE_Q8_K] = {256, -1, dequantize_row_q8_K, quantize_row_q8_K, NULL, NULL},
    /* the grid IQ formats (quants_iq.c); ggml has no CPU quantizer for them */
#define GR_IQ_TRAITS(fmt) {256, GR_TYPE_Q8_K, gr_dequantize_row_##fmt, NULL, NULL, gr_vec_dot_##fmt##_q8_K}
    [GR_TYPE_IQ2_XXS] = GR_IQ_TRAITS(iq2_xxs),
    [GR_TYPE_IQ2_XS] = GR_IQ_TRAITS(iq2_xs),
    [GR_TYPE_IQ3_XXS] = GR_IQ_TRAITS(iq3_xxs),
    [GR_TYPE_IQ1_S] = GR_IQ_TRAITS(iq1_s),
    [GR_TYPE_IQ3_S] = GR_IQ_TRAITS(iq3_s),
    [GR_TYPE_IQ2_S] = GR_IQ_TRAITS(iq2_s),
    [GR_TYPE_IQ1_M] = GR_IQ_TRAITS(iq1_m),
#undef GR_IQ_TRAITS
    [GR_TYPE_IQ4_NL] = {32, GR_TYPE_Q8_0, dequantize_row_iq4_nl, quantize_row_iq4_nl, NULL, vec_dot_iq4_nl_q8_0},
    [GR_TYPE_IQ4_XS] = {256, GR_TYPE_Q8_K, dequantize_row_iq4_xs, quantize_row_iq4_xs, NULL, vec_dot_iq4_xs_q8_K},
    [GR_TYPE_TQ1_0] = {256, GR_TYPE_Q8_K, dequantize_row_tq1_0, quantize_row_tq1_0, NULL, vec_dot_tq1_0_q8_K},
    [GR_TYPE_TQ2_0] = {256, GR_TYPE_Q8_K, dequantize_row_tq2_0, quantize_row_tq2_0, NULL, vec_dot_tq2_0_q8_K},
    [GR_TYPE_MXFP4] = {32, GR_TYPE_Q8_0, dequantize_row_mxfp4, quantize_row_mxfp4, NULL, vec_dot_mxfp4_q8_0},
    [GR_TYPE_NVFP4] = {64, GR_TYPE_Q8_0, dequantize_row_nvfp4, quantize_row_nvfp4, NULL, vec_dot_nvfp4_q8_0},
    [GR_TYPE_Q1_0] = {128, GR_TYPE_Q8_0, dequantize_row_q1_0, quantize_row_q1_0, NULL, vec_dot_q1_0_q8_0},
    [GR_TYPE_Q2_0] = {64, GR_TYPE_Q8_0, dequantize_row_q2_0, quantize_row_q2_0, NULL, vec_dot_q2_0_q8_0},
};

#if GR_HAVE_X86
/* the AVX2 replacements; NULL entries keep the portable kernel */
typedef struct {
    ggmlrpc_to_float_fn to_float;
    ggmlrpc_from_float_fn from_float;
    ggmlrpc_vec_dot_fn vec_dot;
} gr_simd_kernels;

static const gr_simd_kernels gr_avx2[GR_NTYPES] = {
    [GR_TYPE_F32] = {NULL, NULL, vec_dot_f32_f32_avx2},
    [GR_TYPE_F16] = {gr_f16_to_f32_row_f16c, gr_f32_to_f16_row_f16c, vec_dot_f16_f16_avx2},
    [GR_TYPE_BF16] = {gr_bf16_to_f32_row_avx2, NULL, vec_dot_bf16_bf16_avx2},
    [GR_TYPE_Q4_0] = {NULL, NULL, vec_dot_q4_0_q8_0_avx2},
    [GR_TYPE_Q4_1] = {NULL, NULL, vec_dot_q4_1_q8_1_avx2},
    [GR_TYPE_Q5_0] = {NULL, NULL, vec_dot_q5_0_q8_0_avx2},
    [GR_TYPE_Q5_1] = {NULL, NULL, vec_dot_q5_1_q8_1_avx2},
    [GR_TYPE_Q8_0] = {NULL, quantize_row_q8_0_avx2, vec_dot_q8_0_q8_0_avx2},
    [GR_TYPE_Q8_1] = {NULL, quantize_row_q8_1_avx2, NULL},
    [GR_TYPE_Q2_K] = {NULL, NULL, vec_dot_q2_K_q8_K_avx2},
    [GR_TYPE_Q3_K] = {NULL, NULL, vec_dot_q3_K_q8_K_avx2},
    [GR_TYPE_Q4_K] = {NULL, NULL, vec_dot_q4_K_q8_K_avx2},
    [GR_TYPE_Q5_K] = {NULL, NULL, vec_dot_q5_K_q8_K_avx2},
    [GR_TYPE_Q6_K] = {NULL, NULL, vec_dot_q6_K_q8_K_avx2},
    [GR_TYPE_IQ4_NL] = {NULL, NULL, vec_dot_iq4_nl_q8_0_avx2},
    [GR_TYPE_IQ4_XS] = {NULL, NULL, vec_dot_iq4_xs_q8_K_avx2},
    [GR_TYPE_MXFP4] = {NULL, NULL, vec_dot_mxfp4_q8_0_avx2},
};
#endif

/* -1 until first use, then the level in force (0 portable, 1 AVX2) */
static int gr_level = -1;

static int gr_cpu_level(void) {
    return (gr_cpu_features() & GR_CPU_AVX2) ? 1 : 0;
}

static int gr_simd_level(void) {
    int level = __atomic_load_n(&gr_level, __ATOMIC_RELAXED);
    if (level < 0) {
        /* every thread that races here computes the same value */
        level = gr_cpu_level();
        __atomic_store_n(&gr_level, level, __ATOMIC_RELAXED);
    }
    return level;
}

int ggmlrpc_quants_simd(int level) {
    if (level < 0) {
        return gr_simd_level();
    }
    const int hw = gr_cpu_level();
    const int set = level < hw ? level : hw;
    __atomic_store_n(&gr_level, set, __ATOMIC_RELAXED);
    return set;
}

static const gr_qtraits *gr_find(uint32_t type) {
    return type < GR_NTYPES && gr_traits[type].blck > 0 ? &gr_traits[type] : NULL;
}

/* the portable kernels of type, with this CPU's SIMD ones in their place */
static bool gr_resolve(uint32_t type, gr_qtraits *k) {
    const gr_qtraits *t = gr_find(type);
    if (t == NULL) return false;
    *k = *t;
#if GR_HAVE_X86
    if (gr_simd_level() >= 1) {
        const gr_simd_kernels *v = &gr_avx2[type];
        if (v->to_float) k->to_float = v->to_float;
        if (v->from_float) k->from_float = v->from_float;
        if (v->vec_dot) k->vec_dot = v->vec_dot;
    }
#endif
    return true;
}

ggmlrpc_to_float_fn ggmlrpc_get_to_float(uint32_t type) {
    gr_qtraits k;
    return gr_resolve(type, &k) ? k.to_float : NULL;
}

ggmlrpc_from_float_fn ggmlrpc_get_from_float(uint32_t type) {
    gr_qtraits k;
    return gr_resolve(type, &k) ? k.from_float : NULL;
}

int ggmlrpc_q4_0_act_sums(const void *act_blocks, int32_t *sums, int64_t nb) {
#if GR_HAVE_X86
    if (gr_simd_level() >= 1) {
        q4_0_act_sums_avx2(act_blocks, sums, nb);
        return 0;
    }
#endif
    (void)act_blocks; (void)sums; (void)nb;
    return -1;
}

ggmlrpc_vec_dot_sums_fn ggmlrpc_get_vec_dot_q4_0_sums(void) {
#if GR_HAVE_X86
    if (gr_simd_level() >= 1) return vec_dot_q4_0_q8_0_sums_avx2;
#endif
    return NULL;
}

ggmlrpc_vec_dot_x4_fn ggmlrpc_get_vec_dot_x4(uint32_t weight_type) {
#if GR_HAVE_X86
    if (gr_simd_level() >= 1) {
        if (weight_type == GR_TYPE_Q4_0) return vec_dot_x4_q4_0_q8_0_avx2;
        if (weight_type == GR_TYPE_Q8_0) return vec_dot_x4_q8_0_q8_0_avx2;
    }
#endif
    (void)weight_type;
    return NULL;
}

size_t ggmlrpc_panel_bytes(uint32_t weight_type) {
#if GR_HAVE_X86
    if (gr_simd_level() >= 1) {
        if (weight_type == GR_TYPE_Q8_0 || weight_type == GR_TYPE_IQ4_NL) return GR_PANEL_Q8;
        if (weight_type == GR_TYPE_Q4_0 || weight_type == GR_TYPE_Q5_0) return GR_PANEL_Q4;
        if (weight_type == GR_TYPE_Q4_1 || weight_type == GR_TYPE_Q5_1) return GR_PANEL_Q81;
    }
#endif
    (void)weight_type;
    return 0;
}

void ggmlrpc_panel_put(uint32_t weight_type, const void *act /* (nb,) q8_0 or q8_1 */, int64_t nb,
                       void *panel /* (nb,) panel blocks */, int lane) {
    if (weight_type == GR_TYPE_Q4_1 || weight_type == GR_TYPE_Q5_1) {   /* Q8_1 rows */
        const block_q8_1 *y = act;
        for (int64_t i = 0; i < nb; i++) {
            uint8_t *p = (uint8_t *)panel + (size_t)i * GR_PANEL_Q81;
            const float d = gr_fp16_to_fp32(y[i].d), sm = gr_fp16_to_fp32(y[i].s);
            memcpy(p + 4 * lane, &d, 4);
            memcpy(p + 32 + 32 * lane, y[i].qs, 32);
            memcpy(p + GR_PANEL_Q8 + 4 * lane, &sm, 4);
        }
        return;
    }
    const block_q8_0 *y = act;
    const int off = weight_type == GR_TYPE_Q4_0 || weight_type == GR_TYPE_Q5_0;   /* the t8 lanes too */
    const size_t pb = off ? GR_PANEL_Q4 : GR_PANEL_Q8;
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *p = (uint8_t *)panel + (size_t)i * pb;
        const float d = gr_fp16_to_fp32(y[i].d);
        memcpy(p + 4 * lane, &d, 4);
        memcpy(p + 32 + 32 * lane, y[i].qs, 32);
        if (!off) continue;
        uint8_t mark = 0;
        for (int m = 0; m < 8; m++) {
            int t = 0;
            for (int k = 0; k < 4; k++) {
                t += y[i].qs[4 * m + k];
                mark |= y[i].qs[4 * m + k] == -128;
            }
            const float f = 8.0f * (float)t;
            memcpy(p + GR_PANEL_Q8 + 32 * lane + 4 * m, &f, 4);
        }
        p[GR_PANEL_Q8 + 8 * 32 + lane] = mark;
    }
}

ggmlrpc_panel_dot_fn ggmlrpc_get_panel_dot(uint32_t weight_type) {
#if GR_HAVE_X86
    if (gr_simd_level() >= 1) {
        if (weight_type == GR_TYPE_Q4_0) return panel_dot_q4_0_avx2;
        if (weight_type == GR_TYPE_Q8_0) return panel_dot_q8_0_avx2;
        if (weight_type == GR_TYPE_IQ4_NL) return panel_dot_iq4_nl_avx2;
        if (weight_type == GR_TYPE_Q5_0) return panel_dot_q5_0_avx2;
        if (weight_type == GR_TYPE_Q4_1) return panel_dot_q4_1_avx2;
        if (weight_type == GR_TYPE_Q5_1) return panel_dot_q5_1_avx2;
    }
#endif
    (void)weight_type;
    return NULL;
}

ggmlrpc_vec_dot_fn ggmlrpc_get_vec_dot_gemm(uint32_t weight_type) {
#if GR_HAVE_X86
    if (gr_simd_level() >= 1 && weight_type == GR_TYPE_IQ4_NL) return vec_dot_iq4_nl_q8_0_seq_avx2;
#endif
    return ggmlrpc_get_vec_dot(weight_type);
}

ggmlrpc_vec_dot_fn ggmlrpc_get_vec_dot(uint32_t weight_type) {
    gr_qtraits k;
    return gr_resolve(weight_type, &k) ? k.vec_dot : NULL;
}

int ggmlrpc_vec_dot_type(uint32_t weight_type) {
    const gr_qtraits *t = gr_find(weight_type);
    return t ? t->vec_dot_type : -1;
}

static bool gr_whole_blocks(uint32_t type, int64_t n) {
    const gr_qtraits *t = gr_find(type);
    return t != NULL && n >= 0 && n % t->blck == 0;
}

int ggmlrpc_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n) {
    const ggmlrpc_to_float_fn f = ggmlrpc_get_to_float(type);
    if (f == NULL || !gr_whole_blocks(type, n)) return -1;
    f(src, dst, n);
    return 0;
}

int ggmlrpc_quantize_row(uint32_t type, const float *src, void *dst, int64_t n) {
    const ggmlrpc_from_float_fn f = ggmlrpc_get_from_float(type);
    if (f == NULL || !gr_whole_blocks(type, n)) return -1;
    f(src, dst, n);
    return 0;
}

int ggmlrpc_quantize_row_ref(uint32_t type, const float *src, void *dst, int64_t n) {
    const gr_qtraits *t = gr_find(type);
    if (t == NULL || t->from_float_ref == NULL) {
        return ggmlrpc_quantize_row(type, src, dst, n);
    }
    if (!gr_whole_blocks(type, n)) return -1;
    t->from_float_ref(src, dst, n);
    return 0;
}

int ggmlrpc_vec_dot(uint32_t weight_type, int64_t n, float *s, const void *w_row, const void *act_row) {
    const ggmlrpc_vec_dot_fn f = ggmlrpc_get_vec_dot(weight_type);
    if (f == NULL || !gr_whole_blocks(weight_type, n)) return -1;
    const int act = ggmlrpc_vec_dot_type(weight_type);
    if (act < 0 || !gr_whole_blocks((uint32_t)act, n)) return -1;
    f(n, s, w_row, act_row);
    return 0;
}
