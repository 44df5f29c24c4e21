/* Reductions: SUM, SUM_ROWS (and MEAN), CUMSUM, ARGMAX, COUNT_EQUAL.
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

/* ---- reductions -------------------------------------------------------------- */

/* dst (scalar) = sum of all of src0: F32 rows summed in double and the row sums
 * added in double; F16/BF16 in float, as ggml. One thread. */
void gr_k_sum(gr_job *job, int phase) {
    (void)phase;
    if (job->ith != 0) return;
    GR_NODE_LOCALS(job);
    const int64_t ne0 = s->ne[0], nr = gr_nrows(s);
    if (s->type == GR_TYPE_F32) {
        double sum = 0.0;
        for (int64_t ir = 0; ir < nr; ir++) {
            const float *x = (const float *)gr_row(s, ir);
            double row = 0.0;
            for (int64_t i = 0; i < ne0; i++) row += (double)x[i];
            sum += row;
        }
        const float r = (float)sum;
        memcpy(d->data, &r, 4);
        return;
    }
    float sum = 0.0f;
    for (int64_t ir = 0; ir < nr; ir++) {
        const uint16_t *x = (const uint16_t *)gr_row(s, ir);
        float row = 0.0f;
        for (int64_t i = 0; i < ne0; i++)
            row += s->type == GR_TYPE_F16 ? gr_fp16_to_fp32(x[i]) : gr_bf16_to_fp32(x[i]);
        sum += row;
    }
    const uint16_t h = s->type == GR_TYPE_F16 ? gr_fp32_to_fp16(sum) : gr_fp32_to_bf16(sum);
    memcpy(d->data, &h, 2);
}

/* SUM_ROWS (sub 0) and MEAN (sub 1): dst (1, ne1, ne2, ne3) F32 */
void gr_k_sum_rows(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    const int64_t ne0 = s->ne[0];
    int64_t r0, r1;
    gr_range(gr_nrows(s), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const float *x = (const float *)gr_row(s, ir);
        double sum = 0.0;
        for (int64_t i = 0; i < ne0; i++) sum += (double)x[i];
        float r = (float)sum;
        if (n->sub != GR_V_SUM_ROWS_SUM_ROWS) r /= (float)ne0;
        memcpy(gr_row(d, ir), &r, 4);
    }
}

void gr_k_cumsum(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    const int64_t ne0 = s->ne[0];
    int64_t r0, r1;
    gr_range(gr_nrows(s), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const float *x = (const float *)gr_row(s, ir);
        float *y = (float *)gr_row(d, ir);
        float acc = 0.0f;
        for (int64_t i = 0; i < ne0; i++) {
            acc = i == 0 ? x[0] : acc + x[i];
            y[i] = acc;
        }
    }
}

/* index of the largest value per row; the last one among equals, as ggml */
void gr_k_argmax(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    const int64_t ne0 = s->ne[0];
    int64_t r0, r1;
    gr_range(s->ne[1], job->ith, job->nth, &r0, &r1);
    for (int64_t i1 = r0; i1 < r1; i1++) {
        const float *x = (const float *)(s->data + i1 * s->nb[1]);
        float max = -INFINITY;
        int32_t idx = 0;
        for (int64_t i = 0; i < ne0; i++) {
            max = max > x[i] ? max : x[i];
            if (max == x[i]) idx = (int32_t)i;
        }
        memcpy(d->data + i1 * d->nb[0], &idx, 4);
    }
}

/* number of equal I32 elements: per-thread counts, summed by thread 0 */
void gr_k_count_equal(gr_job *job, int phase) {
    const gr_node *n = job->node;
    int64_t *sums = (int64_t *)job->wdata;
    if (phase == 0) {
        const gr_tensor *a = &n->src[0], *b = &n->src[1];
        int64_t r0, r1, c = 0;
        gr_range(gr_nrows(a), job->ith, job->nth, &r0, &r1);
        for (int64_t ir = r0; ir < r1; ir++) {
            const char *pa = gr_row(a, ir), *pb = gr_row(b, ir);
            for (int64_t i = 0; i < a->ne[0]; i++) {
                int32_t va, vb;
                memcpy(&va, pa + i * a->nb[0], 4);
                memcpy(&vb, pb + i * b->nb[0], 4);
                c += va == vb;
            }
        }
        sums[job->ith * 8] = c;
        return;
    }
    if (job->ith != 0) return;
    int64_t total = 0;
    for (int t = 0; t < job->nth; t++) total += sums[t * 8];
    memcpy(n->dst.data, &total, 8);
}

/* a cache line of counts per thread */
size_t gr_ws_count_equal(const gr_node *n, int nth) {
    (void)n;
    return (size_t)nth * 64;
}
