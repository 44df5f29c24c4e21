/* Shape ops: REPEAT, REPEAT_BACK, CONCAT, PAD, ROLL, ARANGE, TRI, FILL,
 * DIAG_MASK, DIAG.
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

/* ---- shape ops ----------------------------------------------------------------- */

/* dst = src0 tiled to dst's shape (byte copies of elements of size es) */
void gr_k_repeat(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    const int64_t es = n->iparams[0];
    const int64_t ne00 = s->ne[0];
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i1, i2, i3;
        gr_row_index(d, ir, &i1, &i2, &i3);
        const char *x = gr_at(s, 0, i1 % s->ne[1], i2 % s->ne[2], i3 % s->ne[3]);
        char *y = gr_at(d, 0, i1, i2, i3);
        for (int64_t r = 0; r < d->ne[0]; r += ne00) memmove(y + r * es, x, (size_t)(ne00 * es));
    }
}

/* dst (small) = sum of the blocks of src0 that repeat it, in ggml's loop order */
void gr_k_repeat_back(gr_job *job, int phase) {
    (void)phase;
    if (job->ith != 0) return;
    GR_NODE_LOCALS(job);
    const int64_t ne0 = d->ne[0], ne1 = d->ne[1], ne2 = d->ne[2], ne3 = d->ne[3];
    const int64_t nr0 = s->ne[0] / ne0, nr1 = s->ne[1] / ne1, nr2 = s->ne[2] / ne2, nr3 = s->ne[3] / ne3;
    for (int64_t k3 = 0; k3 < ne3; k3++)
        for (int64_t k2 = 0; k2 < ne2; k2++)
            for (int64_t k1 = 0; k1 < ne1; k1++) memset(gr_at(d, 0, k1, k2, k3), 0, (size_t)ne0 * 4);
    for (int64_t i3 = 0; i3 < nr3; i3++)
        for (int64_t k3 = 0; k3 < ne3; k3++)
            for (int64_t i2 = 0; i2 < nr2; i2++)
                for (int64_t k2 = 0; k2 < ne2; k2++)
                    for (int64_t i1 = 0; i1 < nr1; i1++)
                        for (int64_t k1 = 0; k1 < ne1; k1++)
                            for (int64_t i0 = 0; i0 < nr0; i0++) {
                                float *y = (float *)gr_at(d, 0, k1, k2, k3);
                                const float *x = (const float *)gr_at(s, i0 * ne0, i1 * ne1 + k1,
                                                                      i2 * ne2 + k2, i3 * ne3 + k3);
                                for (int64_t i = 0; i < ne0; i++) y[i] += x[i];
                            }
}

/* Row ir of d joined from a's and b's elements one at a time, through every stride
   (ggml's path for 1-, 2- and 4-byte types, whose rows need not be packed). */
static void concat_strided(const gr_tensor *a, const gr_tensor *b, const gr_tensor *d, int dim,
                           size_t ts, const int64_t i[4]) {
    for (int64_t i0 = 0; i0 < d->ne[0]; i0++) {
        int64_t j[4] = {i0, i[1], i[2], i[3]};
        const gr_tensor *s = a;
        if (j[dim] >= a->ne[dim]) {
            j[dim] -= a->ne[dim];
            s = b;
        }
        memcpy(gr_at(d, i0, i[1], i[2], i[3]), gr_at(s, j[0], j[1], j[2], j[3]), ts);
    }
}

/* dst = src0 and src1 joined along dimension op_params[0] (rows copied as bytes when
   all three have packed rows, else element by element) */
void gr_k_concat(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *a = &n->src[0], *b = &n->src[1], *d = &n->dst;
    const int dim = n->op_params[0];
    const int64_t ts = n->iparams[0], bs = n->iparams[1];   /* type size, block size */
    const int packed = bs > 1 || (a->nb[0] == ts && b->nb[0] == ts && d->nb[0] == ts);
#define ROW_BYTES(ne) ((size_t)((ne) / bs * ts))
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i[4];
        i[1] = ir % d->ne[1];
        i[2] = (ir / d->ne[1]) % d->ne[2];
        i[3] = ir / (d->ne[1] * d->ne[2]);
        char *y = gr_at(d, 0, i[1], i[2], i[3]);
        if (!packed) {
            concat_strided(a, b, d, dim, (size_t)ts, i);
        } else if (dim == 0) {
            memmove(y, gr_at(a, 0, i[1], i[2], i[3]), ROW_BYTES(a->ne[0]));
            memmove(y + ROW_BYTES(a->ne[0]), gr_at(b, 0, i[1], i[2], i[3]), ROW_BYTES(b->ne[0]));
        } else if (i[dim] < a->ne[dim]) {
            memmove(y, gr_at(a, 0, i[1], i[2], i[3]), ROW_BYTES(d->ne[0]));
        } else {
            i[dim] -= a->ne[dim];
            memmove(y, gr_at(b, 0, i[1], i[2], i[3]), ROW_BYTES(d->ne[0]));
        }
    }
#undef ROW_BYTES
}

static inline int64_t wrap(int64_t i, int64_t n) { return ((i % n) + n) % n; }

/* dst = src0 with lp/rp zeros (or wrapped values, op_params[8]) around each dim */
void gr_k_pad(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    const int32_t *p = n->op_params;
    const int circular = p[8];
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i1, i2, i3;
        gr_row_index(d, ir, &i1, &i2, &i3);
        float *y = (float *)gr_at(d, 0, i1, i2, i3);
        for (int64_t i0 = 0; i0 < d->ne[0]; i0++) {
            if (circular) {
                memcpy(&y[i0], gr_at(s, wrap(i0 - p[0], s->ne[0]), wrap(i1 - p[2], s->ne[1]),
                                     wrap(i2 - p[4], s->ne[2]), wrap(i3 - p[6], s->ne[3])), 4);
            } else if (i0 >= p[0] && i0 < d->ne[0] - p[1] && i1 >= p[2] && i1 < d->ne[1] - p[3] &&
                       i2 >= p[4] && i2 < d->ne[2] - p[5] && i3 >= p[6] && i3 < d->ne[3] - p[7]) {
                memcpy(&y[i0], gr_at(s, i0 - p[0], i1 - p[2], i2 - p[4], i3 - p[6]), 4);
            } else {
                y[i0] = 0.0f;
            }
        }
    }
}

/* dst[i] = start + step*i (fused, as the reference build computes it) */
void gr_k_arange(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const float start = gr_param_f32(n, 0), step = gr_param_f32(n, 2);
    float *y = (float *)n->dst.data;
    const int64_t steps = n->dst.ne[0];
    for (int64_t i = job->ith; i < steps; i += job->nth) y[i] = fmaf(step, (float)i, start);
}

/* keep one triangle of each matrix (op_params[0]: 0 upper+diag, 1 upper, 2 lower+diag, 3 lower) */
void gr_k_tri(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    const int t = n->op_params[0];
    int64_t r0, r1;
    gr_range(gr_nrows(s), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t r = ir % s->ne[1];
        const float *x = (const float *)gr_row(s, ir);
        float *y = (float *)gr_row(d, ir);
        for (int64_t i = 0; i < d->ne[0]; i++) {
            const int keep = t == 0 ? i >= r : t == 1 ? i > r : t == 2 ? i <= r : i < r;
            y[i] = keep ? x[i] : 0.0f;
        }
    }
}

/* dst = op_params[0] everywhere (F32 or F16) */
void gr_k_fill(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *d = &n->dst;
    const float c = gr_param_f32(n, 0);
    const uint16_t h = gr_fp32_to_fp16(c);
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        char *y = gr_row(d, ir);
        for (int64_t i = 0; i < d->ne[0]; i++) {
            if (d->type == GR_TYPE_F32) memcpy(y + 4 * i, &c, 4);
            else memcpy(y + 2 * i, &h, 2);
        }
    }
}

/* dst = src0 with entries i > n_past + row set to -inf (sub 0) or 0 (sub 1).
 * Phase 0 copies when not in place. */
void gr_k_diag_mask(gr_job *job, int phase) {
    GR_NODE_LOCALS(job);
    if (phase == 0) {
        if (s->data == d->data) return;
        int64_t r0, r1;
        gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
        for (int64_t ir = r0; ir < r1; ir++) memmove(gr_row(d, ir), gr_row(s, ir), (size_t)d->ne[0] * 4);
        return;
    }
    const int64_t n_past = n->op_params[0];
    const float value = n->sub != GR_V_DIAG_MASK_DIAG_MASK_INF ? 0.0f : -INFINITY;
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t j = ir % d->ne[1];
        float *y = (float *)gr_row(d, ir);
        for (int64_t i = n_past; i < d->ne[0]; i++)
            if (i > n_past + j) y[i] = value;
    }
}

/* dst = diagonal matrices from the rows of src0: (ne0, ne0, ne2, ne3) */
void gr_k_diag(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t i1 = ir % d->ne[1];
        const int64_t i2 = (ir / d->ne[1]) % d->ne[2];
        const int64_t i3 = ir / (d->ne[1] * d->ne[2]);
        float *y = (float *)gr_at(d, 0, i1, i2, i3);
        const float *x = (const float *)gr_at(s, 0, 0, i2, i3);
        for (int64_t i = 0; i < d->ne[0]; i++) y[i] = i == i1 ? x[i1] : 0.0f;
    }
}

/* dst = src0 rolled by op_params[0..3] along each dimension (|shift| < ne) */
void gr_k_roll(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    const int32_t *sh = n->op_params;
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i1, i2, i3;
        gr_row_index(d, ir, &i1, &i2, &i3);
        const char *x = gr_at(s, 0, wrap(i1 - sh[1], s->ne[1]), wrap(i2 - sh[2], s->ne[2]), wrap(i3 - sh[3], s->ne[3]));
        float *y = (float *)gr_at(d, 0, i1, i2, i3);
        const int64_t first = wrap(-sh[0], s->ne[0]), cnt = s->ne[0] - first;
        memcpy(y, x + first * 4, (size_t)cnt * 4);
        memcpy(y + cnt, x, (size_t)first * 4);
    }
}
