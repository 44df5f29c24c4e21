/* F32 -> K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): ggml's reference quantizers,
 * which its CPU from_float calls (the importance-weighted variants are for model
 * files, not for SET_ROWS/CPY).
 *
 * Each 256-element super-block is cut into 16 or 32-element groups. A group gets
 * a scale (and for Q2_K/Q4_K/Q5_K a minimum) from a small search that minimises a
 * weighted squared (Q2_K: absolute) error; the group scales are then quantized
 * against the block's largest one, and the elements are quantized once more with
 * the scales as stored. The searches are ggml's (make_qx_quants, make_q3_quants,
 * make_qkx2_quants), with the same float operations in the same order, so the
 * bytes come out equal to ggml's. Built with -ffp-contract=off like ggml-base.
 */
#include "cpu/quants/quants.h"
#include "common/fp16.h"

#include <math.h>
#include <string.h>

#define GROUP_MAX_EPS 1e-15f

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Symmetric levels -nmax..nmax-1 for n values (returned in L as level + nmax) and
 * their scale. rmse_type 1: weights x^2, and 18 nearby scales tried. */
/* The element of largest magnitude (the first of equal ones); *amax gets |it|. */
static float max_by_abs(int n, const float *x /* (n,) */, float *amax) {
    float max = 0.0f;
    *amax = 0.0f;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > *amax) {
            *amax = ax;
            max = x[i];
        }
    }
    return max;
}

/* Levels l = round(iscale*x) in -nmax..nmax-1 (stored as l + offset where L is
 * given) and the x^2-weighted sums sum(w x l), sum(w l l). */
static void sym_levels(int n, int nmax, const float *x /* (n,) */, float iscale, int8_t *L /* (n,) or NULL */,
                       int offset, float *sumlx, float *suml2) {
    *sumlx = *suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        const int l = clampi(gr_nearest_int(iscale * x[i]), -nmax, nmax - 1);
        if (L) L[i] = (int8_t)(l + offset);
        const float w = x[i] * x[i];
        *sumlx += w * x[i] * l;
        *suml2 += w * l * l;
    }
}

/* The first guess of both searches: levels of the scale -max/nmax. Returns 0 (L
 * zeroed) for an all-zero group, else 1 with *max, the levels and their sums. */
static int sym_first_guess(int n, int nmax, const float *x /* (n,) */, int8_t *L /* (n,) */, int offset,
                           float *max, float *sumlx, float *suml2) {
    float amax;
    *max = max_by_abs(n, x, &amax);
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0;
    }
    sym_levels(n, nmax, x, -nmax / *max, L, offset, sumlx, suml2);
    return 1;
}

static float make_qx_quants(int n, int nmax, const float *x /* (n,) */, int8_t *L /* (n,) */) {
    float max, sumlx, suml2;
    if (!sym_first_guess(n, nmax, x, L, nmax, &max, &sumlx, &suml2)) return 0.0f;
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        const float iscale = -(nmax + 0.1f * is) / max;
        sym_levels(n, nmax, x, iscale, NULL, 0, &sumlx, &suml2);
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            sym_levels(n, nmax, x, iscale, L, nmax, &sumlx, &suml2);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q3_K's group search: start from the levels of -max/nmax, then up to 5 passes
 * that move one level at a time where that lowers the x^2-weighted error. */
static float make_q3_quants(int n, int nmax, const float *x /* (n,) */, int8_t *L /* (n,) */) {
    float max, sumlx, suml2;
    if (!sym_first_guess(n, nmax, x, L, 0, &max, &sumlx, &suml2)) return 0.0f;
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                const int new_l = clampi(gr_nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Asymmetric levels 0..nmax with a minimum: x ~ scale*L - the_min. The start is
 * the min/max range; nstep+1 more ranges (rmin + rdelta*is) get a least-squares
 * scale and minimum each, and the one of least weighted error (|.| when use_mad)
 * is kept. */
static float make_qkx2_quants(int n, int nmax, const float *x /* (n,) */, const float *weights /* (n,) */,
                              uint8_t *L /* (n,) */, float *the_min, uint8_t *Laux /* (n,) */, float rmin,
                              float rdelta, int nstep, int use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.0f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0.0f;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(gr_nearest_int(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < n; i++) {
            const int l = clampi(gr_nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0.0f;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* four 2-bit codes a byte: byte l of each 32 holds elements l, l+32, l+64, l+96 */
static void pack_2bit(const uint8_t *L /* (256,) */, uint8_t *qs /* (64,) */) {
    for (int j = 0; j < GR_QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

void gr_quantize_row_q2_K(const float *x /* (n,) */, void *vy /* (n/256,) blocks */, int64_t n) {
    block_q2_K *y = vy;
    uint8_t L[GR_QK_K], Laux[16];
    float weights[16], mins[16], scales[16];
    const float q4scale = 15.0f;
    for (int64_t i = 0; i < n / GR_QK_K; i++, x += GR_QK_K) {
        float max_scale = 0.0f, max_min = 0.0f;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, 1);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < 16; j++) y[i].scales[j] = (uint8_t)gr_nearest_int(iscale * scales[j]);
            y[i].d = gr_fp32_to_fp16(max_scale / q4scale);
        } else {
            memset(y[i].scales, 0, 16);
            y[i].d = gr_fp32_to_fp16(0.0f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < 16; j++) y[i].scales[j] |= (uint8_t)(gr_nearest_int(iscale * mins[j]) << 4);
            y[i].dmin = gr_fp32_to_fp16(max_min / q4scale);
        } else {
            y[i].dmin = gr_fp32_to_fp16(0.0f);
        }
        for (int j = 0; j < 16; j++) {
            const float d = gr_fp16_to_fp32(y[i].d) * (y[i].scales[j] & 0xf);
            if (!d) continue;
            const float dm = gr_fp16_to_fp32(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ii++)
                L[16 * j + ii] = (uint8_t)clampi(gr_nearest_int((x[16 * j + ii] + dm) / d), 0, 3);
        }
        pack_2bit(L, y[i].qs);
    }
}

/* six-bit group scale j of Q3_K (low nibbles in bytes 0-7, two high bits in 8-11), minus 32 */
static inline int q3_K_scale(const uint8_t *scales /* (12,) */, int j) {
    const int lo = j < 8 ? scales[j] & 0xf : scales[j - 8] >> 4;
    return (lo | (((scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
}

void gr_quantize_row_q3_K(const float *x /* (n,) */, void *vy /* (n/256,) blocks */, int64_t n) {
    block_q3_K *y = vy;
    int8_t L[GR_QK_K];
    float scales[16];
    for (int64_t i = 0; i < n / GR_QK_K; i++, x += GR_QK_K) {
        for (int j = 0; j < 16; j++) scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
        float amax;
        const float max_scale = max_by_abs(16, scales, &amax);
        memset(y[i].scales, 0, 12);
        if (max_scale) {
            const float iscale = -32.0f / max_scale;
            for (int j = 0; j < 16; j++) {
                const int l = clampi((int8_t)gr_nearest_int(iscale * scales[j]), -32, 31) + 32;
                if (j < 8) y[i].scales[j] = (uint8_t)(l & 0xf);
                else y[i].scales[j - 8] |= (uint8_t)((l & 0xf) << 4);
                y[i].scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            y[i].d = gr_fp32_to_fp16(1 / iscale);
        } else {
            y[i].d = gr_fp32_to_fp16(0.0f);
        }
        for (int j = 0; j < 16; j++) {
            const float d = gr_fp16_to_fp32(y[i].d) * q3_K_scale(y[i].scales, j);
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++)
                L[16 * j + ii] = (int8_t)(clampi(gr_nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
        }
        /* the third bit of element j goes to bit j/32 of hmask[j%32] */
        memset(y[i].hmask, 0, 32);
        uint8_t low[GR_QK_K];
        for (int j = 0; j < GR_QK_K; j++) {
            low[j] = (uint8_t)(L[j] & 3);
            if (L[j] > 3) y[i].hmask[j % 32] |= (uint8_t)(1 << (j / 32));
        }
        pack_2bit(low, y[i].qs);
    }
}

/* Q4_K/Q5_K: 8 groups of 32 with scale and minimum from make_qkx2_quants
 * (weights av|x| + |x|), both quantized to 6 bits against the largest; nmax 15
 * or 31. L gets the final levels. */
static void q45_K_groups(const float *x /* (256,) */, int nmax, float rmin, int nstep, uint8_t *scales12 /* (12,) */,
                         gr_fp16_t *d_out, gr_fp16_t *dmin_out, uint8_t *L /* (256,) */) {
    uint8_t Laux[32];
    float weights[32], mins[8], scales[8];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0.0f;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, 0);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)gr_nearest_int(inv_scale * scales[j]);
        lm[j] = (uint8_t)gr_nearest_int(inv_min * mins[j]);
        if (ls[j] > 63) ls[j] = 63;
        if (lm[j] > 63) lm[j] = 63;
    }
    /* bytes 0-3 scales 0-3, 4-7 mins 0-3 (their top two bits hold the high bits
     * of scales/mins 4-7), 8-11 the low nibbles of scales and mins 4-7 */
    for (int j = 0; j < 4; j++) {
        scales12[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
        scales12[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
        scales12[j + 8] = (uint8_t)((ls[j + 4] & 0xf) | ((lm[j + 4] & 0xf) << 4));
    }
    *d_out = gr_fp32_to_fp16(max_scale / 63.0f);
    *dmin_out = gr_fp32_to_fp16(max_min / 63.0f);
    for (int j = 0; j < 8; j++) {
        const float d = gr_fp16_to_fp32(*d_out) * ls[j];
        if (!d) continue;
        const float dm = gr_fp16_to_fp32(*dmin_out) * lm[j];
        for (int ii = 0; ii < 32; ii++)
            L[32 * j + ii] = (uint8_t)clampi(gr_nearest_int((x[32 * j + ii] + dm) / d), 0, nmax);
    }
}

void gr_quantize_row_q4_K(const float *x /* (n,) */, void *vy /* (n/256,) blocks */, int64_t n) {
    block_q4_K *y = vy;
    uint8_t L[GR_QK_K];
    for (int64_t i = 0; i < n / GR_QK_K; i++, x += GR_QK_K) {
        q45_K_groups(x, 15, -1.0f, 20, y[i].scales, &y[i].d, &y[i].dmin, L);
        /* byte l of each 32: elements l (low nibble) and l+32 of a 64 */
        for (int j = 0; j < GR_QK_K; j += 64)
            for (int l = 0; l < 32; l++) y[i].qs[j / 2 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

void gr_quantize_row_q5_K(const float *x /* (n,) */, void *vy /* (n/256,) blocks */, int64_t n) {
    block_q5_K *y = vy;
    uint8_t L[GR_QK_K];
    for (int64_t i = 0; i < n / GR_QK_K; i++, x += GR_QK_K) {
        q45_K_groups(x, 31, -0.5f, 15, y[i].scales, &y[i].d, &y[i].dmin, L);
        /* as Q4_K, the fifth bits of the k-th 64 in bits 2k, 2k+1 of qh */
        memset(y[i].qh, 0, 32);
        for (int j = 0, k = 0; j < GR_QK_K; j += 64, k++)
            for (int l = 0; l < 32; l++) {
                const int l1 = L[j + l], l2 = L[j + l + 32];
                y[i].qh[l] |= (uint8_t)(((l1 >> 4) << (2 * k)) | ((l2 >> 4) << (2 * k + 1)));
                y[i].qs[j / 2 + l] = (uint8_t)((l1 & 15) | ((l2 & 15) << 4));
            }
    }
}

void gr_quantize_row_q6_K(const float *x /* (n,) */, void *vy /* (n/256,) blocks */, int64_t n) {
    block_q6_K *y = vy;
    int8_t L[GR_QK_K];
    float scales[16];
    for (int64_t i = 0; i < n / GR_QK_K; i++, x += GR_QK_K) {
        for (int ib = 0; ib < 16; ib++) scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
        float max_abs_scale;
        const float max_scale = max_by_abs(16, scales, &max_abs_scale);
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -128.0f / max_scale;
        y[i].d = gr_fp32_to_fp16(1 / iscale);
        for (int ib = 0; ib < 16; ib++) {
            const int s = gr_nearest_int(iscale * scales[ib]);
            y[i].scales[ib] = (int8_t)(s < 127 ? s : 127);
        }
        for (int j = 0; j < 16; j++) {
            const float d = gr_fp16_to_fp32(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++)
                L[16 * j + ii] = (int8_t)(clampi(gr_nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
        }
        /* per 128: ql low nibbles of l, l+32 (with l+64, l+96 in the high nibbles),
         * qh the two high bits of l, l+32, l+64, l+96 */
        for (int j = 0; j < GR_QK_K; j += 128) {
            uint8_t *ql = y[i].ql + j / 2, *qh = y[i].qh + j / 4;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((L[j + l] & 0xf) | ((L[j + l + 64] & 0xf) << 4));
                ql[l + 32] = (uint8_t)((L[j + l + 32] & 0xf) | ((L[j + l + 96] & 0xf) << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                  ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}
