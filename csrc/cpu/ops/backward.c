/* Training kernels: the backward ops ggml's optimizer graphs use (GET_ROWS_BACK,
 * SOFT_MAX_BACK, RMS_NORM_BACK, CROSS_ENTROPY_LOSS and its gradient) and the
 * optimizer steps (OPT_STEP_ADAMW, OPT_STEP_SGD). Same conventions as
 * every ops file: the planner checked types and shapes, arithmetic follows ggml's
 * CPU backend, fused where its x86 build fuses.
 */
#include "common/checked.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu/job.h"
#include "cpu/kernels.h"

/* Gradient of GET_ROWS: dst (nc, n_rows) zeroed, then row ids[i] += src0 row i, in
 * order of i. Threads split the columns; every thread checks every id.
 *   src0: (nc, >= n_ids) F32/F16; src1: ids I32 contiguous; dst contiguous F32 */
void gr_k_get_rows_back(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *g = &n->src[0], *ids = &n->src[1], *d = &n->dst;
    const int64_t nc = d->ne[0], n_ids = gr_nelements(ids), n_rows = d->ne[1];
    int64_t c0, c1;
    gr_range(nc, job->ith, job->nth, &c0, &c1);
    for (int64_t r = 0; r < n_rows; r++) memset(d->data + r * d->nb[1] + c0 * 4, 0, (size_t)(c1 - c0) * 4);
    for (int64_t i = 0; i < n_ids; i++) {
        int32_t r;
        memcpy(&r, ids->data + i * 4, 4);
        if (r < 0 || r >= n_rows) {
            gr_fail(job, GR_EXEC_EINDEX, "GET_ROWS_BACK index %d out of range [0, %lld)", r, (long long)n_rows);
            return;
        }
        float *y = (float *)(d->data + r * d->nb[1]);
        const char *x = g->data + i * g->nb[1];
        for (int64_t j = c0; j < c1; j++) {
            float v;
            if (g->type == GR_TYPE_F16) {
                uint16_t h;
                memcpy(&h, x + j * 2, 2);
                v = gr_fp16_to_fp32(h);
            } else {
                memcpy(&v, x + j * 4, 4);
            }
            y[j] += v;
        }
    }
}

/* dx = (dy - y.dy) * y * scale per row (ggml's dot order).
 *   src0 dy, src1 y, dst: same shape, contiguous F32; op_params[0] scale */
void gr_k_soft_max_back(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *dy = &n->src[0], *y = &n->src[1], *d = &n->dst;
    const int64_t nc = d->ne[0];
    const float scale = gr_param_f32(n, 0);
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const float *pdy = (const float *)gr_row(dy, ir), *py = (const float *)gr_row(y, ir);
        float *dx = (float *)gr_row(d, ir);
        const float dot = gr_vec.dot_f32(nc, py, pdy);
        for (int64_t i = 0; i < nc; i++) dx[i] = ((pdy[i] + -dot) * py[i]) * scale;
    }
}

/* Gradient of RMS_NORM: with sums of x*x and x*dz in double,
 * dx = (dz + x * (-sum_xdz / (sum_xx + eps*n))) / sqrt(sum_xx/n + eps).
 *   src0 dz, src1 x, dst: same shape, rows contiguous F32; op_params[0] eps */
void gr_k_rms_norm_back(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *dz = &n->src[0], *x = &n->src[1], *d = &n->dst;
    const int64_t nc = d->ne[0];
    const float eps = gr_param_f32(n, 0);
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const float *pz = (const float *)gr_row(dz, ir), *px = (const float *)gr_row(x, ir);
        float *dx = (float *)gr_row(d, ir);
        double sum_xx = 0.0, sum_xdz = 0.0;
        for (int64_t i = 0; i < nc; i++) {
            sum_xx += (double)(px[i] * px[i]);
            sum_xdz += (double)(px[i] * pz[i]);
        }
        const float mean_eps = (float)sum_xx / (float)nc + eps;
        const float sum_eps = (float)sum_xx + eps * (float)nc;
        const float rrms = 1.0f / sqrtf(mean_eps);
        const float scale_x = (float)(-sum_xdz) / sum_eps;
        for (int64_t i = 0; i < nc; i++) dx[i] = fmaf(px[i], scale_x, pz[i]) * rrms;
    }
}

static inline float row_max(int64_t n, const float *x) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = m > x[i] ? m : x[i];
    return m;
}

/* sub 0 CROSS_ENTROPY_LOSS: dst[0] = -sum over rows of sum(log_softmax(a) * b) / rows.
 *   ggml sums each thread's share of rows in float, then the threads' sums in
 *   double: phase 0 fills one float per thread in the scratch, phase 1 adds them.
 *   src0 logits, src1 labels: same shape, rows contiguous F32.
 * sub 1 CROSS_ENTROPY_LOSS_BACK: dst = (softmax(a) - b) * grad[0] / rows.
 *   src0 grad (scalar), src1 logits, src2 labels, dst: contiguous F32 */
void gr_k_cross_entropy(gr_job *job, int phase) {
    const gr_node *n = job->node;
    const gr_tensor *d = &n->dst;
    const int back = n->sub == GR_V_CROSS_ENTROPY_CROSS_ENTROPY_LOSS_BACK;
    const gr_tensor *a = &n->src[back ? 1 : 0], *b = &n->src[back ? 2 : 1];
    const int64_t nc = a->ne[0], nr = gr_nrows(a);
    float *sums = (float *)job->wdata;
    if (phase == 1) {
        if (!back && job->ith == 0) {
            double s = 0.0;
            for (int i = 0; i < job->nth; i++) s += (double)sums[i];
            const float loss = (float)s * (-1.0f / (float)nr);
            memcpy(d->data, &loss, 4);
        }
        return;
    }
    float grad = 0.0f;
    if (back) memcpy(&grad, n->src[0].data, 4);
    const float d_by_nr = grad / (float)nr;
    float *st = gr_thread_f32(job, nc) + (back ? 0 : job->nth + 16);
    float sum_thread = 0.0f;
    int64_t r0, r1;
    gr_range(nr, job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const float *pa = (const float *)gr_row(a, ir), *pb = (const float *)gr_row(b, ir);
        const float max = row_max(nc, pa);
        if (back) {
            float *ds = (float *)gr_row(d, ir);
            const double sum = gr_vec.soft_max(nc, ds, pa, max);
            const float inv = (float)(1.0 / sum);
            for (int64_t i = 0; i < nc; i++) ds[i] = ((ds[i] * inv) - pb[i]) * d_by_nr;
            continue;
        }
        double sum = 0.0;
        for (int64_t i = 0; i < nc; i++) {
            st[i] = pa[i] - max;
            sum += (double)expf(st[i]);
        }
        const float neg_log_sum = (float)-(double)logf((float)sum);
        double s = 0.0;
        for (int64_t i = 0; i < nc; i++) s += (double)((st[i] + neg_log_sum) * pb[i]);
        sum_thread += (float)s;
    }
    if (!back) sums[job->ith] = sum_thread;
}

/* Optimizer steps, in place on the weights (src0) and, for AdamW, the moments.
 * sub 0 OPT_STEP_ADAMW: src0 w, src1 grad, src2 m, src3 v (same shape, rows
 *   contiguous F32), src4 params (alpha, beta1, beta2, eps, wd, beta1h, beta2h)
 * sub 1 OPT_STEP_SGD: src0 w, src1 grad, src2 params (alpha, wd) */
void gr_k_opt_step(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const int sgd = n->sub == GR_V_OPT_STEP_OPT_STEP_SGD;
    const gr_tensor *W = &n->src[0], *G = &n->src[1];
    float p[7];
    memcpy(p, n->src[sgd ? 2 : 4].data, (sgd ? 2 : 7) * 4);
    const float alpha = p[0];
    const float keep = fmaf(-alpha, sgd ? p[1] : p[4], 1.0f);
    const int64_t nc = W->ne[0];
    int64_t r0, r1;
    gr_range(gr_nrows(W), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        float *w = (float *)gr_row(W, ir);
        const float *g = (const float *)gr_row(G, ir);
        if (sgd) {
            for (int64_t i = 0; i < nc; i++) w[i] = fmaf(w[i], keep, -(alpha * g[i]));
            continue;
        }
        float *m = (float *)gr_row(&n->src[2], ir), *v = (float *)gr_row(&n->src[3], ir);
        const float beta1 = p[1], beta2 = p[2], eps = p[3], beta1h = p[5], beta2h = p[6];
        for (int64_t i = 0; i < nc; i++) {
            m[i] = fmaf(m[i], beta1, g[i] * (1.0f - beta1));
            v[i] = fmaf(v[i], beta2, (g[i] * g[i]) * (1.0f - beta2));
            const float mh = m[i] * beta1h;
            const float vh = sqrtf(v[i] * beta2h) + eps;
            w[i] = fmaf(w[i], keep, -((alpha * mh) / vh));
        }
    }
}

/* per-thread sums, then a row of floats per thread */
size_t gr_ws_cross_entropy(const gr_node *n, int nth) {
    const int64_t ne00 = n->src[0].ne[0];
    return gr_sz_add((size_t)(nth + 16) * sizeof(float), gr_sz_mul3(gr_sz(nth), gr_sz_add(gr_sz(ne00), 16), sizeof(float)));
}
