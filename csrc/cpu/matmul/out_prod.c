/* OUT_PROD (sums of outer products, the MUL_MAT gradient), ADD_ID (MoE bias
 * per expert) and FWHT (MUL_MAT with llama.cpp's Hadamard hint).
 * Same conventions as every ops file: the planner (ggmlrpc/compute/) checked types
 * and shapes, a kernel only walks each tensor inside its own ne/nb, rows are split
 * between threads with gr_range(), and arithmetic follows ggml's CPU backend
 * (ops.cpp, vec.h): the same rounding points and the same fused multiply-adds
 * where ggml's x86 build fuses.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/job.h"
#include "cpu/kernels.h"
#include "cpu/matmul/matmul.h"

/* dst[:, i1, i2] = src0[:, i1, i2] + src1[:, ids[i1, i2]]
 *   src0, dst: (ne0, ne1, ne2) F32; src1: (ne0, ne11) F32; ids: (ne1, ne2) I32 */
void gr_k_add_id(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *a = &n->src[0], *b = &n->src[1], *ids = &n->src[2], *d = &n->dst;
    int64_t r0, r1;
    gr_range(gr_nrows(a), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i1, i2, i3;
        gr_row_index(a, ir, &i1, &i2, &i3);
        int32_t k;
        memcpy(&k, ids->data + i1 * ids->nb[0] + i2 * ids->nb[1], 4);
        if (k < 0 || k >= b->ne[1]) {
            gr_fail(job, GR_EXEC_EINDEX, "ADD_ID index %d out of range [0, %lld)", k, (long long)b->ne[1]);
            return;
        }
        const float *x = (const float *)gr_at(a, 0, i1, i2, i3);
        const float *y = (const float *)(b->data + k * b->nb[1]);
        float *z = (float *)gr_at(d, 0, i1, i2, i3);
        for (int64_t i = 0; i < d->ne[0]; i++) z[i] = x[i] + y[i];
    }
}

/* dst[i0, i1] = sum over i01 of src0[i0, i01] * src1[i1, i01], one fused
 * multiply-add per term in order of i01 (per batch, src0 broadcast).
 *   src0: (ne0, n, ne02, ne03) F32/F16/quantized rows; src1: (ne1, n, ne2, ne3) F32 */
void gr_k_out_prod(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *a = &n->src[0], *b = &n->src[1], *d = &n->dst;
    const int64_t ne0 = d->ne[0], ne1 = d->ne[1], ne2 = d->ne[2], ne01 = a->ne[1];
    const int64_t dps2 = ne2 / a->ne[2], dps3 = d->ne[3] / a->ne[3];
    float *row = gr_thread_f32(job, ne0);
    ggmlrpc_to_float_fn to_float = NULL;
    if (a->type != GR_TYPE_F32 && a->type != GR_TYPE_F16) to_float = ggmlrpc_get_to_float((uint32_t)a->type);
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t i1 = ir % ne1;
        const int64_t i2 = (ir / ne1) % ne2;
        const int64_t i3 = ir / (ne1 * ne2);
        float *y = (float *)gr_at(d, 0, i1, i2, i3);
        for (int64_t i = 0; i < ne0; i++) y[i] = 0.0f;
        for (int64_t i01 = 0; i01 < ne01; i01++) {
            const char *x = gr_at(a, 0, i01, i2 / dps2, i3 / dps3);
            float v;
            memcpy(&v, gr_at(b, i1, i01, i2, i3), 4);
            const float *xf = (const float *)x;
            if (a->type == GR_TYPE_F16) {
                gr_vec.fp16_to_fp32(ne0, (const uint16_t *)x, row);
                xf = row;
            } else if (to_float) {
                to_float(x, row, ne0);
                xf = row;
            }
            for (int64_t i = 0; i < ne0; i++) y[i] = fmaf(xf[i], v, y[i]);
        }
    }
}

/* MUL_MAT whose src0 is a Hadamard matrix (llama.cpp's hint): each row of src1,
 * scaled by 1/sqrt(n), goes through the in-place Walsh-Hadamard butterflies.
 *   src1: (n, rows...) F32/F16, n a power of two; dst: (n, rows...) F32 */
void gr_k_fwht(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[1], *d = &n->dst;
    const int64_t len_n = s->ne[0];
    const float scale = 1.0f / sqrtf((float)len_n);
    int64_t r0, r1;
    gr_range(gr_nrows(s), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        float *y = (float *)gr_row(d, ir);
        gr_load_f32(s->type, gr_row(s, ir), s->nb[0], y, len_n);
        for (int64_t j = 0; j < len_n; j++) y[j] *= scale;
        for (int64_t len = 1; len < len_n; len <<= 1)
            for (int64_t i = 0; i < len_n; i += 2 * len)
                for (int64_t j = 0; j < len; j++) {
                    const float u = y[i + j], v = y[i + len + j];
                    y[i + j] = u + v;
                    y[i + len + j] = u - v;
                }
    }
}
