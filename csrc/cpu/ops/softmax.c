/* SOFT_MAX with its mask, ALiBi slopes and attention sinks.
 * Same conventions as every ops file: the planner (ggmlrpc/compute/) checked types
 * and shapes, a kernel only walks each tensor inside its own ne/nb, rows are split
 * between threads with gr_range(), and arithmetic follows ggml's CPU backend
 * (ops.cpp, vec.h): the same rounding points and the same fused multiply-adds
 * where ggml's x86 build fuses.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu/job.h"
#include "cpu/kernels.h"

/* ---- SOFT_MAX ------------------------------------------------------------------ */

static inline float alibi_slope(float max_bias, uint32_t n_head, uint32_t h) {
    if (!(max_bias > 0.0f)) return 1.0f;
    const uint32_t n_head_log2 = 1u << (uint32_t)floor(log2((double)n_head));
    const float m0 = powf(2.0f, -(max_bias) / n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / n_head_log2);
    return h < n_head_log2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n_head_log2) + 1));
}

/* dst = softmax(src0*scale + slope*mask) per row, with optional sinks.
 *   src0, dst: (ne00, ne01, ne02 heads, ne03); mask: (>= ne00, >= ne01, ne12 | ne02, ne13 | ne03)
 *   F16/F32; sinks: (ne02) F32 */
void gr_k_soft_max(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    const gr_tensor *m = n->n_src > 1 && n->src[1].data ? &n->src[1] : NULL;
    const gr_tensor *sk = n->n_src > 2 && n->src[2].data ? &n->src[2] : NULL;
    float scale, max_bias;
    memcpy(&scale, &n->op_params[0], 4);
    memcpy(&max_bias, &n->op_params[1], 4);
    const int64_t ne00 = s->ne[0];
    float *wp = gr_thread_f32(job, ne00);
    int64_t r0, r1;
    gr_range(gr_nrows(s), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i1, i2, i3;
        gr_row_index(s, ir, &i1, &i2, &i3);
        const float slope = alibi_slope(max_bias, (uint32_t)s->ne[2], (uint32_t)i2);
        const float *sp = (const float *)gr_at(s, 0, i1, i2, i3);
        float *dp = (float *)gr_at(d, 0, i1, i2, i3);
        for (int64_t i = 0; i < ne00; i++) wp[i] = sp[i] * scale;
        if (m) {
            const char *mp = gr_at(m, 0, i1, i2 % m->ne[2], i3 % m->ne[3]);
            if (m->type == GR_TYPE_F16) {
                const uint16_t *mh = (const uint16_t *)mp;
                for (int64_t i = 0; i < ne00; i++) wp[i] = fmaf(slope, gr_fp16_to_fp32(mh[i]), wp[i]);
            } else {
                const float *mf = (const float *)mp;
                for (int64_t i = 0; i < ne00; i++) wp[i] = fmaf(slope, mf[i], wp[i]);
            }
        }
        float max = -INFINITY;
        for (int64_t i = 0; i < ne00; i++) max = max > wp[i] ? max : wp[i];
        float sink = 0.0f;
        if (sk) {
            memcpy(&sink, sk->data + i2 * sk->nb[0], 4);
            if (sink > max) max = sink;
        }
        double sum = gr_vec.soft_max(ne00, dp, wp, max);
        if (sk) sum += (double)expf(sink - max);
        const float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < ne00; i++) dp[i] *= inv;
    }
}
