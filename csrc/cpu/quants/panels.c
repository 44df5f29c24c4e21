/* The activation panels of the prompt kernels (quants.h): eight Q8_0/Q8_1 rows
 * block by block for the AVX2 panel kernels, sixteen Q8_0 rows lane by lane for
 * the AVX-512 VNNI column panels. Their layouts are in quants_impl.h; which
 * kernel reads them, dispatch.c decides.
 */
#include "cpu/quants/quants_impl.h"

size_t ggmlrpc_panel_bytes(uint32_t weight_type) {
    if (ggmlrpc_get_panel_dot(weight_type) == NULL) return 0;
    if (weight_type == GR_TYPE_Q8_0 || weight_type == GR_TYPE_IQ4_NL) return GR_PANEL_Q8;
    if (weight_type == GR_TYPE_Q4_0 || weight_type == GR_TYPE_Q5_0) return GR_PANEL_Q4;
    if (weight_type == GR_TYPE_Q4_1 || weight_type == GR_TYPE_Q5_1) return GR_PANEL_Q81;
    return 0;
}

/* t[m]: the sum of a Q8_0 block's codes 4m..4m+3 (the int32 lane m of the x86
 * kernels); returns 1 where a code is -128 (the sign trick wraps there) */
static uint8_t gr_q8_lane_sums(const block_q8_0 *y, int32_t t[8]) {
    uint8_t mark = 0;
    for (int m = 0; m < 8; m++) {
        t[m] = 0;
        for (int k = 0; k < 4; k++) {
            t[m] += y->qs[4 * m + k];
            mark |= y->qs[4 * m + k] == -128;
        }
    }
    return mark;
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
        int32_t t[8];
        p[GR_PANEL_Q8 + 8 * 32 + lane] = gr_q8_lane_sums(&y[i], t);
        for (int m = 0; m < 8; m++) {
            const float f = 8.0f * (float)t[m];
            memcpy(p + GR_PANEL_Q8 + 32 * lane + 4 * m, &f, 4);
        }
    }
}

void ggmlrpc_cpanel_decode(uint32_t weight_type, const void *w_row, int64_t nb, void *row) {
    gr_arch_cpanel_decode(weight_type, w_row, nb, row);
}

int ggmlrpc_cpanel_available(uint32_t weight_type) {
    return ggmlrpc_get_cpanel_dot(weight_type) != NULL;
}

size_t ggmlrpc_cpanel_row_bytes(int64_t nb) {
    return ((size_t)nb * 36 + 63) & ~(size_t)63;   /* 32 codes and a float a block */
}

void ggmlrpc_cpanel_put(uint32_t weight_type, const void *act /* (nb,) q8_0 */, int64_t nb, void *panel,
                        int lane) {
    const block_q8_0 *y = act;
    const int32_t c = weight_type == GR_TYPE_Q8_0 || weight_type == GR_TYPE_IQ4_NL ? 128
                      : weight_type == GR_TYPE_Q5_0                                  ? 16
                                                                                     : 8;
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *p = (uint8_t *)panel + (size_t)i * GGMLRPC_CPANEL_BYTES;
        const float d = gr_fp16_to_fp32(y[i].d);
        memcpy(p + 4 * lane, &d, 4);
        int32_t t[8];
        p[GR_CPANEL_MARK + lane] = gr_q8_lane_sums(&y[i], t);
        for (int m = 0; m < 8; m++) {
            const int32_t bias = -c * t[m];
            memcpy(p + GR_CPANEL_Y + 64 * m + 4 * lane, y[i].qs + 4 * m, 4);
            memcpy(p + GR_CPANEL_BIAS + 64 * m + 4 * lane, &bias, 4);
        }
    }
}

void ggmlrpc_cpanel_clear(void *panel, int64_t nb, int from) {
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *p = (uint8_t *)panel + (size_t)i * GGMLRPC_CPANEL_BYTES;
        for (int lane = from; lane < GGMLRPC_CPANEL_COLS; lane++) {
            memset(p + 4 * lane, 0, 4);
            for (int m = 0; m < 8; m++) {
                memset(p + GR_CPANEL_Y + 64 * m + 4 * lane, 0, 4);
                memset(p + GR_CPANEL_BIAS + 64 * m + 4 * lane, 0, 4);
            }
            p[GR_CPANEL_MARK + lane] = 0;
        }
    }
}
