/* ggml's quantized formats on the CPU, portable: conversion to and from float,
 * and the dot products of MUL_MAT. See quants.h for the contract; the semantics
 * (block layouts, scales, rounding) are ggml's, the code is ours.
 *
 * Layout of this file: fp16/bf16 rows; dequantize (to_float); quantize
 * (from_float); scalar dot products; the table of them per type. Beside it:
 * quants_k.c and quants_iq.c (the K-quant quantizers, the grid IQ formats),
 * dispatch.c (the kernel level: portable or x86/), panels.c (the activation
 * panels); the shared helpers are in quants_impl.h.
 */
#include "cpu/quants/quants_impl.h"

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
            bsum = gr_chain_madd(bsum, gr_fp16_to_fp32(yb->d), (float)isum);
        }
        sum = gr_chain_madd(sum, gr_fp16_to_fp32(x[i].d), bsum);
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

/* ------------------------------------------------------------------------- */
/* the portable kernels of each type (dispatch.c puts the x86 ones in place)  */
/* ------------------------------------------------------------------------- */

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

const gr_qtraits *gr_portable(uint32_t type) {
    return type < GR_NTYPES && gr_traits[type].blck > 0 ? &gr_traits[type] : NULL;
}

/* the summation order of the K-quant and IQ kernels (quants_impl.h, gr_chain_madd) */
__attribute__((visibility("hidden"))) int gr_fma_chains = 1;

void ggmlrpc_quants_set_fma_chains(int on) { __atomic_store_n(&gr_fma_chains, on != 0, __ATOMIC_RELAXED); }
