/* What tiled.c and its x86 twin x86/tiled_x86.c share: the tiled types' block
 * facts, the float steps of one dot product, and the K panels' layout; and the
 * x86 entry points, with a fallback that does nothing where there is no x86/ (as
 * ggml's arch-fallback.h; never reached there: the *_available functions say 0).
 * Internal to csrc/cpu/matmul/.
 */
#ifndef GGMLRPC_CPU_MATMUL_TILED_IMPL_H
#define GGMLRPC_CPU_MATMUL_TILED_IMPL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu/matmul/matmul.h"
#include "cpu/quants/quants_impl.h"

/* a tiled type's block bytes and whether it has minimums; 0: not a tiled type */
static inline size_t gr_tiled_block(int32_t type, int *has_min) {
    *has_min = type == GR_TYPE_Q2_K || type == GR_TYPE_Q4_K || type == GR_TYPE_Q5_K;
    switch (type) {
    case GR_TYPE_Q2_K: return sizeof(block_q2_K);
    case GR_TYPE_Q3_K: return sizeof(block_q3_K);
    case GR_TYPE_Q4_K: return sizeof(block_q4_K);
    case GR_TYPE_Q5_K: return sizeof(block_q5_K);
    case GR_TYPE_Q6_K: return sizeof(block_q6_K);
    case GR_TYPE_IQ4_XS: return sizeof(block_iq4_xs);
    default: return 0;
    }
}

/* the float steps of gr_tiled_dot_row over the exact integers SUMS gives */
#define GR_TILED_DOT_BODY(SUMS)                                                                  \
    const block_q8_K *y = act;                                                                   \
    float acc = 0.0f;                                                                            \
    for (int64_t b = 0; b < r->K / 256; b++) {                                                   \
        int32_t s1, s2;                                                                          \
        SUMS(r->w + 256 * b, y[b].qs, r->sc + 16 * b, r->mn + 16 * b, y[b].bsums, &s1, &s2);     \
        float v = r->d[b] * (float)s1;                                                           \
        if (r->has_min) v = fmaf(-r->dmin[b], (float)s2, v);                                     \
        acc = fmaf(v, y[b].d, acc);                                                              \
    }                                                                                            \
    return acc;

/* ---- K panels ---------------------------------------------------------------
 * Activation panel, per 256-element block of eight rows t:
 *   i8 q[t][256] | i16 pairs[k][t][2] = (bsums[2k], bsums[2k+1]) of row t | f32 d[t] | pad
 * Decoded weight row, per block:
 *   u8 codes[256]                unsigned: w + bias (bias 4 for Q3_K, 32 for Q6_K,
 *                                0 otherwise; IQ4_XS keeps its signed levels)
 *   i16 scv[c][16]               chunk c of 32: (sc[2c] x 8 | sc[2c+1] x 8)
 *   i16 mnp[k][8][2]             (mn[2k], mn[2k+1]) x 8, for s2 = sum mn * bsums
 *                                (formats with minimums)
 *   i16 bsp[k][8][2]             (-bias sc[2k], -bias sc[2k+1]) x 8 (bias 4 or 32)
 *   i16 mn[16], i16 -bias sc[16] the same per 16 elements, for rows read in place
 * so that s1 = sum_c madd(maddubs(codes_c, q_c), scv_c) + sum_k madd(pairs_k, bsp_k)
 * is the same integer as sum over groups of sc * (w . q), with no sign steps
 * (codes <= 63: maddubs pairs stay within int16). IQ4_XS (levels up to 127)
 * takes the sign trick instead. */
#define KP_PAIRS 2048
#define KP_D 2304
#define KR_SCV 256
#define KR_MNP 512
#define KR_BSP 768
#define KR_MN16 1024   /* i16 mn[16] */
#define KR_BS16 1056   /* i16 -bias sc[16] */

static inline int kpanel_bias(int32_t type) {
    return type == GR_TYPE_Q3_K ? 4 : type == GR_TYPE_Q6_K ? 32 : 0;
}

#if GR_X86
/* x86/tiled_x86.c: whether the AVX-512 VNNI panels are in use (their switch) */
int gr_tiled_x86_init(int use_simd, int family);
float gr_tiled_dot_row_x86(const gr_tiled_row *r, const void *act /* (K/256,) q8_K */);
/* the signed values of one block, as tiled.c's decoders give them */
void gr_tiled_codes_x86(int32_t type, const void *blk, int8_t *w /* (256,) */);
/* one block of a decoded K-panel row: codes, and the vectors of sc and mn */
void gr_kpanel_block_x86(int32_t type, const void *blk, const int16_t sc[16], const int16_t mn[16], int has_min,
                         char *o /* (GR_KROW_BYTES,) */);
#else
static inline int gr_tiled_x86_init(int use_simd, int family) {
    (void)use_simd; (void)family;
    return 0;
}
static inline float gr_tiled_dot_row_x86(const gr_tiled_row *r, const void *act) {
    (void)r; (void)act;
    return 0.0f;
}
static inline void gr_tiled_codes_x86(int32_t type, const void *blk, int8_t *w) {
    (void)type; (void)blk; (void)w;
}
static inline void gr_kpanel_block_x86(int32_t type, const void *blk, const int16_t sc[16], const int16_t mn[16],
                                       int has_min, char *o) {
    (void)type; (void)blk; (void)sc; (void)mn; (void)has_min; (void)o;
}
#endif

#endif
