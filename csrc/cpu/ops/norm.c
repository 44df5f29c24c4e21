/* Row normalizations: RMS_NORM (and L2_NORM), NORM, GROUP_NORM.
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
#include "cpu/vec.h"        /* gr_family_madd */

/* ---- norms ------------------------------------------------------------------ */

/* RMS_NORM (sub 0): y = x / sqrt(mean(x^2) + eps); L2_NORM (sub 1):
 * y = x / max(sqrt(sum(x^2)), eps). Per row; the sum of squares is kept in
 * double with each square rounded to float first, as ggml does. L2_NORM also
 * takes rows with element strides (permuted views); RMS_NORM needs packed rows.
 *   src0, dst: (ne0, rows) F32 */
void gr_k_rms_norm(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    float eps;
    memcpy(&eps, &n->op_params[0], 4);
    const int64_t ne0 = s->ne[0];
    int64_t r0, r1;
    gr_range(gr_nrows(s), job->ith, job->nth, &r0, &r1);
    const int packed = s->nb[0] == 4 && d->nb[0] == 4;
    for (int64_t ir = r0; ir < r1; ir++) {
        if (!packed) {      /* L2_NORM of a strided row */
            const char *x = gr_row(s, ir);
            char *y = gr_row(d, ir);
            double sum = 0.0;
            for (int64_t i = 0; i < ne0; i++) {
                const float xi = *(const float *)(x + i * s->nb[0]);
                sum += (double)(xi * xi);
            }
            const float scale = 1.0f / fmaxf(sqrtf((float)sum), eps);
            for (int64_t i = 0; i < ne0; i++)
                *(float *)(y + i * d->nb[0]) = *(const float *)(x + i * s->nb[0]) * scale;
            continue;
        }
        const float *x = (const float *)gr_row(s, ir);
        float *y = (float *)gr_row(d, ir);
        double sum = 0.0;
        for (int64_t i = 0; i < ne0; i++) sum += (double)(x[i] * x[i]);
        const float scale = n->sub != GR_V_RMS_NORM_RMS_NORM ? 1.0f / fmaxf(sqrtf((float)sum), eps)
                                   : 1.0f / sqrtf((float)(sum / ne0) + eps);
        for (int64_t i = 0; i < ne0; i++) y[i] = x[i] * scale;
    }
}

/* Strided rows (permuted views): ggml sums the row and the centred squares in
 * float, one element after another (the squares fused into the sum unless GCC
 * tuned the build for Zen). */
static void norm_row_strided(const gr_tensor *s, const gr_tensor *d, int64_t ir, float eps) {
    const int64_t ne0 = s->ne[0];
    const char *x = gr_row(s, ir);
    char *y = gr_row(d, ir);
    float sum = 0.0f;
    for (int64_t i = 0; i < ne0; i++) sum += *(const float *)(x + i * s->nb[0]);
    const float mean = sum / ne0;
    float variance = 0.0f;
    for (int64_t i = 0; i < ne0; i++) {
        const float v = *(const float *)(x + i * s->nb[0]) - mean;
        *(float *)(y + i * d->nb[0]) = v;
        variance = gr_family_madd(variance, v, v);
    }
    variance /= ne0;
    const float scale = 1.0f / sqrtf(variance + eps);
    for (int64_t i = 0; i < ne0; i++) *(float *)(y + i * d->nb[0]) *= scale;
}

/* y = (x - mean) / sqrt(var + eps) per row
 *   src0, dst: (ne0, rows) F32 */
void gr_k_norm(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    float eps;
    memcpy(&eps, &n->op_params[0], 4);
    const int64_t ne0 = s->ne[0];
    int64_t r0, r1;
    gr_range(gr_nrows(s), job->ith, job->nth, &r0, &r1);
    if (s->nb[0] != 4 || d->nb[0] != 4) {
        for (int64_t ir = r0; ir < r1; ir++) norm_row_strided(s, d, ir, eps);
        return;
    }
    for (int64_t ir = r0; ir < r1; ir++) {
        const float *x = (const float *)gr_row(s, ir);
        float *y = (float *)gr_row(d, ir);
        double sum = 0.0;
        for (int64_t i = 0; i < ne0; i++) sum += (double)x[i];
        const float mean = (float)((float)sum / ne0);
        /* centred squares: 8-lane partial sums reduced like ggml's vector path */
        double var = 0.0;
        int64_t i = 0;
        for (; i + 7 < ne0; i += 8) {
            float v[8], t[4];
            for (int l = 0; l < 8; l++) {
                y[i + l] = x[i + l] - mean;
                v[l] = y[i + l] * y[i + l];
            }
            for (int l = 0; l < 4; l++) t[l] = v[l + 4] + v[l];
            var += (double)((t[0] + t[2]) + (t[1] + t[3]));
        }
        for (; i < ne0; i++) {
            const float v = x[i] - mean;
            y[i] = v;
            var += (double)(v * v);
        }
        const float variance = (float)(var / ne0);
        const float scale = 1.0f / sqrtf(variance + eps);
        for (int64_t k = 0; k < ne0; k++) y[k] *= scale;
    }
}

/* Normalize groups of channels (dim 2): n_groups = op_params[0], eps = op_params[1].
 *   src0, dst: (ne0, ne1, ne2 channels, ne3); contiguous */
void gr_k_group_norm(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    const int n_groups = n->op_params[0];
    float eps;
    memcpy(&eps, &n->op_params[1], 4);
    const int64_t ne0 = s->ne[0], ne1 = s->ne[1], ne2 = s->ne[2], ne3 = s->ne[3];
    const int64_t n_channels = ne2;
    const int64_t per_group = (n_channels + n_groups - 1) / n_groups;
    /* groups past the last channel are empty: stop there, not after n_groups (up to 2^31) */
    for (int64_t g = job->ith; g < n_groups && g * per_group < n_channels; g += job->nth) {
        const int64_t start = g * per_group;
        int64_t end = start + per_group;
        if (end > n_channels) end = n_channels;
        const int64_t step = end - start;
        if (step <= 0) continue;
        for (int64_t i3 = 0; i3 < ne3; i3++) {
            double sum = 0.0;
            for (int64_t i2 = start; i2 < end; i2++)
                for (int64_t i1 = 0; i1 < ne1; i1++) {
                    const float *x = (const float *)gr_at(s, 0, i1, i2, i3);
                    double sumr = 0.0;
                    for (int64_t i0 = 0; i0 < ne0; i0++) sumr += (double)x[i0];
                    sum += sumr;
                }
            const float mean = (float)(sum / (double)(ne0 * ne1 * step));
            double sum2 = 0.0;
            for (int64_t i2 = start; i2 < end; i2++)
                for (int64_t i1 = 0; i1 < ne1; i1++) {
                    const float *x = (const float *)gr_at(s, 0, i1, i2, i3);
                    float *y = (float *)gr_at(d, 0, i1, i2, i3);
                    double sumr = 0.0;
                    for (int64_t i0 = 0; i0 < ne0; i0++) {
                        const float v = x[i0] - mean;
                        y[i0] = v;
                        sumr += (double)(v * v);
                    }
                    sum2 += sumr;
                }
            const float variance = (float)(sum2 / (double)(ne0 * ne1 * step));
            const float scale = 1.0f / sqrtf(variance + eps);
            for (int64_t i2 = start; i2 < end; i2++)
                for (int64_t i1 = 0; i1 < ne1; i1++) {
                    float *y = (float *)gr_at(d, 0, i1, i2, i3);
                    for (int64_t i0 = 0; i0 < ne0; i0++) y[i0] *= scale;
                }
        }
    }
}
