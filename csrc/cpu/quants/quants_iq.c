/* ggml's grid IQ formats (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S):
 * dequantization and the MUL_MAT dot product with Q8_K activations.
 *
 * Each 256-element block holds, per 8 (IQ1/IQ2) or 4 (IQ3) elements, an index into
 * a fixed lattice (iq_grids.h, generated from gguf-py's tables), sign bits (7 stored,
 * the 8th implied by even parity through gr_ksigns_iq2xs) and 3- or 4-bit sub-block
 * scales. Semantics are ggml-quants.c's; ggml has no CPU quantizer for these types
 * (its from_float is NULL), so neither do we.
 *
 * The dot product dequantizes one weight block into floats (the values are exact:
 * small integers times the sub-block scale) and sums it against the Q8_K block in
 * float. ggml's kernels sum integers per sub-block instead, so results agree to
 * float rounding, not bit for bit.
 */
#include "cpu/quants/quants.h"
#include "common/fp16.h"
#include "cpu/quants/iq_grids.h"

#include <string.h>

_Static_assert(sizeof(block_iq2_xxs) == 66, "block_iq2_xxs size");
_Static_assert(sizeof(block_iq2_xs) == 74, "block_iq2_xs size");
_Static_assert(sizeof(block_iq2_s) == 82, "block_iq2_s size");
_Static_assert(sizeof(block_iq3_xxs) == 98, "block_iq3_xxs size");
_Static_assert(sizeof(block_iq3_s) == 110, "block_iq3_s size");
_Static_assert(sizeof(block_iq1_s) == 50, "block_iq1_s size");
_Static_assert(sizeof(block_iq1_m) == 56, "block_iq1_m size");

#define IQ1S_DELTA 0.125f

/* y[0..8) = d * grid[0..8) with the sign bits of `signs` (bit j negates element j) */
static inline void put8(float *y, float d, const uint8_t *grid, uint8_t signs) {
    for (int j = 0; j < 8; j++) y[j] = d * grid[j] * ((signs >> j) & 1 ? -1.f : 1.f);
}

/* two 4-element IQ3 grid points, signs bits 0-3 for the first, 4-7 for the second */
static inline void put4x2(float *y, float d, const uint8_t *g1, const uint8_t *g2, uint8_t signs) {
    for (int j = 0; j < 4; j++) {
        y[j + 0] = d * g1[j] * ((signs >> j) & 1 ? -1.f : 1.f);
        y[j + 4] = d * g2[j] * ((signs >> (j + 4)) & 1 ? -1.f : 1.f);
    }
}

/* | d f16 | qs u16[32] |: per 32 elements two u32: four 8-bit grid indices, then
 * four 7-bit sign groups and a 4-bit scale in the top bits */
void gr_dequantize_row_iq2_xxs(const void *vx /* (n/256,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_iq2_xxs *x = vx;
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const float d = gr_fp16_to_fp32(x[i].d);
        for (int ib = 0; ib < 8; ib++) {
            uint32_t aux[2];
            memcpy(aux, x[i].qs + 4 * ib, 8);
            const uint8_t *idx = (const uint8_t *)aux;
            const float db = d * (0.5f + (aux[1] >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++, y += 8)
                put8(y, db, gr_iq2xxs_grid[idx[l]], gr_ksigns_iq2xs[(aux[1] >> (7 * l)) & 127]);
        }
    }
}

/* | d f16 | qs u16[32] (9-bit index, 7 sign bits) | scales u8[8] (two 4-bit) | */
void gr_dequantize_row_iq2_xs(const void *vx /* (n/256,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_iq2_xs *x = vx;
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const float d = gr_fp16_to_fp32(x[i].d);
        for (int ib = 0; ib < 8; ib++) {
            const float db[2] = {d * (0.5f + (x[i].scales[ib] & 0xf)) * 0.25f,
                                 d * (0.5f + (x[i].scales[ib] >> 4)) * 0.25f};
            for (int l = 0; l < 4; l++, y += 8) {
                const uint16_t q = x[i].qs[4 * ib + l];
                put8(y, db[l / 2], gr_iq2xs_grid[q & 511], gr_ksigns_iq2xs[q >> 9]);
            }
        }
    }
}

/* | d f16 | qs u8[32] | signs u8[32] | qh u8[8] (2 high index bits each) | scales u8[8] | */
void gr_dequantize_row_iq2_s(const void *vx /* (n/256,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_iq2_s *x = vx;
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const float d = gr_fp16_to_fp32(x[i].d);
        const uint8_t *qs = x[i].qs, *signs = x[i].qs + GR_QK_K / 8;
        for (int ib = 0; ib < 8; ib++, qs += 4, signs += 4) {
            const float db[2] = {d * (0.5f + (x[i].scales[ib] & 0xf)) * 0.25f,
                                 d * (0.5f + (x[i].scales[ib] >> 4)) * 0.25f};
            for (int l = 0; l < 4; l++, y += 8) {
                const int idx = qs[l] | ((x[i].qh[ib] << (8 - 2 * l)) & 0x300);
                put8(y, db[l / 2], gr_iq2s_grid[idx], signs[l]);
            }
        }
    }
}

/* | d f16 | qs u8[64] (grid indices) | u32[8] (four 7-bit sign groups, 4-bit scale) | */
void gr_dequantize_row_iq3_xxs(const void *vx /* (n/256,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_iq3_xxs *x = vx;
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const float d = gr_fp16_to_fp32(x[i].d);
        const uint8_t *qs = x[i].qs;
        for (int ib = 0; ib < 8; ib++, qs += 8) {
            uint32_t aux;
            memcpy(&aux, x[i].qs + GR_QK_K / 4 + 4 * ib, 4);
            const float db = d * (0.5f + (aux >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++, y += 8)
                put4x2(y, db, gr_iq3xxs_grid[qs[2 * l]], gr_iq3xxs_grid[qs[2 * l + 1]],
                       gr_ksigns_iq2xs[(aux >> (7 * l)) & 127]);
        }
    }
}

/* | d f16 | qs u8[64] | qh u8[8] (9th index bits) | signs u8[32] | scales u8[4] (two 4-bit) | */
void gr_dequantize_row_iq3_s(const void *vx /* (n/256,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_iq3_s *x = vx;
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const float d = gr_fp16_to_fp32(x[i].d);
        const uint8_t *qs = x[i].qs, *signs = x[i].signs;
        for (int ib = 0; ib < 8; ib++, qs += 8, signs += 4) {
            const int sc = (x[i].scales[ib / 2] >> (4 * (ib % 2))) & 0xf;
            const float db = d * (1 + 2 * sc);
            const int qh = x[i].qh[ib];
            for (int l = 0; l < 4; l++, y += 8)
                put4x2(y, db, gr_iq3s_grid[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)],
                       gr_iq3s_grid[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)], signs[l]);
        }
    }
}

/* y[0..8) = d * (grid + delta) for a ternary IQ1 grid point */
static inline void put8_iq1(float *y, float d, const int8_t *grid, float delta) {
    for (int j = 0; j < 8; j++) y[j] = d * (grid[j] + delta);
}

/* | d f16 | qs u8[32] (low index bytes) | qh u16[8] (3 high bits x4, 3-bit scale, delta sign) | */
void gr_dequantize_row_iq1_s(const void *vx /* (n/256,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_iq1_s *x = vx;
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const float d = gr_fp16_to_fp32(x[i].d);
        const uint8_t *qs = x[i].qs;
        for (int ib = 0; ib < 8; ib++, qs += 4) {
            const unsigned qh = x[i].qh[ib];
            const float dl = d * (2 * ((qh >> 12) & 7) + 1);
            const float delta = qh & 0x8000 ? -IQ1S_DELTA : IQ1S_DELTA;
            for (int l = 0; l < 4; l++, y += 8)
                put8_iq1(y, dl, gr_iq1s_grid[qs[l] | (((qh >> (3 * l)) & 7) << 8)], delta);
        }
    }
}

/* | qs u8[32] | qh u8[16] (3 high index bits + delta sign per grid point) |
 *   scales u8[8] (3-bit sub-block scales; the block's f16 scale in the top nibbles) | */
void gr_dequantize_row_iq1_m(const void *vx /* (n/256,) blocks */, float *y /* (n,) */, int64_t n) {
    const block_iq1_m *x = vx;
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        uint16_t sc[4];
        memcpy(sc, x[i].scales, 8);
        const uint16_t d16 = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                                        (sc[3] & 0xf000));
        const float d = gr_fp16_to_fp32(d16);
        const uint8_t *qs = x[i].qs, *qh = x[i].qh;
        for (int ib = 0; ib < 8; ib++, qs += 4, qh += 2) {
            const float dl[2] = {d * (2 * ((sc[ib / 2] >> (6 * (ib % 2) + 0)) & 7) + 1),
                                 d * (2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1)};
            for (int l = 0; l < 4; l++, y += 8) {
                const int h = qh[l / 2] >> (4 * (l % 2));    /* this grid point's nibble of qh */
                const int idx = qs[l] | ((h & 7) << 8);
                put8_iq1(y, dl[l / 2], gr_iq1s_grid[idx], h & 8 ? -IQ1S_DELTA : IQ1S_DELTA);
            }
        }
    }
}

/* *s = sum over blocks of d8 * dot(dequantized weight block, q8 values) */
#define GR_IQ_VEC_DOT(fmt, block_t)                                                               \
    void gr_vec_dot_##fmt##_q8_K(int64_t n, float *s, const void *vx /* (n/256,) blocks */,      \
                                 const void *vy /* (n/256,) block_q8_K */) {                      \
        const block_t *x = vx;                                                                    \
        const block_q8_K *q8 = vy;                                                                \
        float w[GR_QK_K];                                                                         \
        float sum = 0.0f;                                                                         \
        for (int64_t i = 0; i < n / GR_QK_K; i++) {                                               \
            gr_dequantize_row_##fmt(&x[i], w, GR_QK_K);                                           \
            float acc = 0.0f;                                                                     \
            for (int j = 0; j < GR_QK_K; j++) acc += w[j] * (float)q8[i].qs[j];                   \
            sum += q8[i].d * acc;                                                                 \
        }                                                                                         \
        *s = sum;                                                                                 \
    }

GR_IQ_VEC_DOT(iq2_xxs, block_iq2_xxs)
GR_IQ_VEC_DOT(iq2_xs, block_iq2_xs)
GR_IQ_VEC_DOT(iq2_s, block_iq2_s)
GR_IQ_VEC_DOT(iq3_xxs, block_iq3_xxs)
GR_IQ_VEC_DOT(iq3_s, block_iq3_s)
GR_IQ_VEC_DOT(iq1_s, block_iq1_s)
GR_IQ_VEC_DOT(iq1_m, block_iq1_m)
