/* What the portable quant kernels (quants.c) and their x86 versions (x86/) share:
 * the bit-level helpers, the level tables, the Q8 row quantizers and the panel
 * layout (static inline, so both sides compile the same code; matmul/tiled.c
 * reuses the scale helpers); and the interface between the formats, dispatch.c
 * and the architecture's table. Internal to csrc/cpu/.
 */
#ifndef GGMLRPC_CPU_QUANTS_IMPL_H
#define GGMLRPC_CPU_QUANTS_IMPL_H

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "common/fp16.h"
#include "cpu/quants/quants.h"
#include "cpu/simd.h"

#if GR_X86
/* kernels compiled for AVX2/FMA/F16C and picked at run time: the build itself
 * stays baseline x86-64 */
#define GR_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

#define GR_QK 32   /* elements per block of the 32-wide formats */

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
/* sum + a*b of one of ggml's scalar loops, fused unless the build was tuned for Zen
 * (ggmlrpc_quants_set_fma_chains) */
extern __attribute__((visibility("hidden"))) int gr_fma_chains;
static inline float gr_chain_madd(float sum, float a, float b) {
    return __atomic_load_n(&gr_fma_chains, __ATOMIC_RELAXED) ? fmaf(a, b, sum) : sum + a * b;
}

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
static inline float gr_amax32_lanes(const float *x /* (32,) */) {
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

/* Q4_K/Q5_K min term: sum over sub-blocks of min * (sum of its 32 q8) */
static inline int gr_k4_minsum(const uint8_t *mn /* (8,) */, const int16_t *bsums /* (16,) */) {
    int summ = 0;
    for (int sb = 0; sb < 8; sb++) {
        summ += mn[sb] * (bsums[2 * sb] + bsums[2 * sb + 1]);
    }
    return summ;
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
/* column panels (quants.h): f32 d[16] | for lane m, the sixteen columns' four
 * codes of lane m (i8[8][16][4]) | for lane m, bias[16] (i32[8][16]: -c times the
 * sum of those four codes, c = 128 for Q8_0 and IQ4_NL, 8 for Q4_0 and 16 for Q5_0,
 * so that a VPDPBUSD of the weights' unsigned codes from it gives the signed sums
 * exactly) | u8 mark[16] (the column's block holds -128, as in GR_PANEL_Q4) | pad */
#define GR_CPANEL_Y 64
#define GR_CPANEL_BIAS (GR_CPANEL_Y + 8 * 64)
#define GR_CPANEL_MARK (GR_CPANEL_BIAS + 8 * 64)
_Static_assert(GR_CPANEL_MARK + 64 == GGMLRPC_CPANEL_BYTES, "column panel layout");

/* ---- the portable kernels of each format (quants.c) --------------------------- */
#define GR_NTYPES 43   /* ggml_type ids 0..42 */

typedef struct {
    int32_t blck;                       /* elements per block; 0 = not handled here */
    int32_t vec_dot_type;               /* ggml's activation type for MUL_MAT, -1 none */
    ggmlrpc_to_float_fn to_float;
    ggmlrpc_from_float_fn from_float;
    ggmlrpc_from_float_fn from_float_ref;   /* NULL: same as from_float */
    ggmlrpc_vec_dot_fn vec_dot;
} gr_qtraits;

/* type's portable kernels, NULL where the formats do not handle type */
const gr_qtraits *gr_portable(uint32_t type);

/* ---- what an architecture adds at a kernel level (dispatch.c picks) ------------ */
/* One type's architecture kernels at one level; a NULL entry keeps the portable
 * kernel (or none where there is no portable one). x86/quants_x86.c fills it. */
typedef struct {
    ggmlrpc_to_float_fn to_float;
    ggmlrpc_from_float_fn from_float;
    ggmlrpc_vec_dot_fn vec_dot;
    ggmlrpc_vec_dot_fn vec_dot_gemm;   /* the prompt order where it differs, else NULL */
    ggmlrpc_vec_dot_rows4_fn vec_dot_rows4;
    ggmlrpc_vec_dot_4xn_fn vec_dot_4xn;
    ggmlrpc_vec_dot_4xn_sums_fn vec_dot_4xn_sums;
    /* its activation sums: minus offset times each lane's sum, -128 blocks marked */
    void (*act_sums_4xn)(const void *act_blocks /* (nb,) q8_0 */, int32_t *sums /* (nb, GGMLRPC_4XN_SUMS) */, int64_t nb);
    ggmlrpc_vec_dot_sums_fn vec_dot_sums;
    void (*act_sums)(const void *act_blocks /* (nb,) q8_0 */, int32_t *sums /* (nb, 8) */, int64_t nb);
    ggmlrpc_panel_dot_fn panel_dot;
    ggmlrpc_cpanel_dot_fn cpanel_dot;
} gr_arch_kernels;

#if GR_X86
/* the highest level this CPU runs: 0 portable, 1 AVX2, 2 AVX2 and AVX-512 VNNI */
int gr_arch_level(void);
/* *k = type's kernels at level (>= 1) */
void gr_arch_kernels_of(uint32_t type, int level, gr_arch_kernels *k);
void gr_arch_cpanel_decode(uint32_t type, const void *w_row, int64_t nb, void *row);
#else
/* the fallback (as ggml's arch-fallback.h): no level above the portable kernels */
static inline int gr_arch_level(void) { return 0; }
static inline void gr_arch_kernels_of(uint32_t type, int level, gr_arch_kernels *k) {
    (void)type; (void)level;
    memset(k, 0, sizeof *k);
}
static inline void gr_arch_cpanel_decode(uint32_t type, const void *w_row, int64_t nb, void *row) {
    (void)type; (void)w_row; (void)nb; (void)row;
}
#endif

#endif
