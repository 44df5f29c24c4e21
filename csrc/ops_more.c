/* Kernels beyond the llama graph: reductions, shape ops, masks, sorting, MoE
 * (MUL_MAT_ID, ADD_ID), OUT_PROD, the Hadamard transform, encoder ops (IM2COL,
 * pooling, UPSCALE...), Segment Anything's window ops, DeepSeek V4's indexer and
 * hyper-connections, and ADD on quantized data. Same conventions as ops_basic.c: the
 * compiler checked types and shapes, kernels stay inside each tensor's ne/nb,
 * arithmetic follows ggml's CPU backend (ops.cpp).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exec_impl.h"

static inline float param_f32(const gr_node *n, int i) {
    float f;
    memcpy(&f, &n->op_params[i], 4);
    return f;
}

/* ---- ACC / SET ------------------------------------------------------------- */

/* dst = src0, then the view of dst given by op_params (nb1, nb2, nb3, offset)
 * gets src1 added (ACC) or written (SET). Phase 0 copies, phase 1 updates.
 *   src0, dst: contiguous, same shape; src1: (ne10.., rows contiguous) */
static void acc_set(gr_job *job, int phase, int set) {
    const gr_node *n = job->node;
    const gr_tensor *s0 = &n->src[0], *s1 = &n->src[1], *d = &n->dst;
    const int64_t nb1 = n->op_params[0], nb2 = n->op_params[1], nb3 = n->op_params[2];
    const int64_t offset = n->op_params[3];
    const int inplace = n->op_params[4];
    const int64_t es = n->iparams[0];   /* element size (4) */
    if (phase == 0) {
        if (inplace || s0->data == d->data) return;
        int64_t r0, r1;
        gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
        for (int64_t ir = r0; ir < r1; ir++) memmove(gr_row(d, ir), gr_row(s0, ir), (size_t)(d->ne[0] * es));
        return;
    }
    const int64_t nc = s1->ne[0];
    int64_t r0, r1;
    gr_range(gr_nrows(s1), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t i1 = ir % s1->ne[1];
        const int64_t i2 = (ir / s1->ne[1]) % s1->ne[2];
        const int64_t i3 = ir / (s1->ne[1] * s1->ne[2]);
        char *y = d->data + offset + i1 * nb1 + i2 * nb2 + i3 * nb3;
        const char *x = s0->data + offset + i1 * nb1 + i2 * nb2 + i3 * nb3;
        const char *v = gr_row(s1, ir);
        if (set) {
            memmove(y, v, (size_t)(nc * es));
        } else {
            float *yf = (float *)y;
            const float *xf = (const float *)x, *vf = (const float *)v;
            for (int64_t i = 0; i < nc; i++) yf[i] = xf[i] + vf[i];
        }
    }
}

static void k_acc(gr_job *job, int phase) { acc_set(job, phase, 0); }
static void k_set(gr_job *job, int phase) { acc_set(job, phase, 1); }

/* ---- reductions -------------------------------------------------------------- */

/* dst (scalar) = sum of all of src0: F32 rows summed in double and the row sums
 * added in double; F16/BF16 in float, as ggml. One thread. */
static void k_sum(gr_job *job, int phase) {
    (void)phase;
    if (job->ith != 0) return;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
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
static void k_sum_rows(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    const int64_t ne0 = s->ne[0];
    int64_t r0, r1;
    gr_range(gr_nrows(s), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const float *x = (const float *)gr_row(s, ir);
        double sum = 0.0;
        for (int64_t i = 0; i < ne0; i++) sum += (double)x[i];
        float r = (float)sum;
        if (n->sub) r /= (float)ne0;
        memcpy(gr_row(d, ir), &r, 4);
    }
}

static void k_cumsum(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
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
static void k_argmax(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
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
static void k_count_equal(gr_job *job, int phase) {
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

/* ---- shape ops ----------------------------------------------------------------- */

/* dst = src0 tiled to dst's shape (byte copies of elements of size es) */
static void k_repeat(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    const int64_t es = n->iparams[0];
    const int64_t ne00 = s->ne[0];
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t i1 = ir % d->ne[1];
        const int64_t i2 = (ir / d->ne[1]) % d->ne[2];
        const int64_t i3 = ir / (d->ne[1] * d->ne[2]);
        const char *x = gr_at(s, 0, i1 % s->ne[1], i2 % s->ne[2], i3 % s->ne[3]);
        char *y = gr_at(d, 0, i1, i2, i3);
        for (int64_t r = 0; r < d->ne[0]; r += ne00) memmove(y + r * es, x, (size_t)(ne00 * es));
    }
}

/* dst (small) = sum of the blocks of src0 that repeat it, in ggml's loop order */
static void k_repeat_back(gr_job *job, int phase) {
    (void)phase;
    if (job->ith != 0) return;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
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

/* dst = src0 and src1 joined along dimension op_params[0] (rows copied as bytes) */
static void k_concat(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *a = &n->src[0], *b = &n->src[1], *d = &n->dst;
    const int dim = n->op_params[0];
    const int64_t ts = n->iparams[0], bs = n->iparams[1];   /* type size, block size */
#define ROW_BYTES(ne) ((size_t)((ne) / bs * ts))
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i[4];
        i[1] = ir % d->ne[1];
        i[2] = (ir / d->ne[1]) % d->ne[2];
        i[3] = ir / (d->ne[1] * d->ne[2]);
        char *y = gr_at(d, 0, i[1], i[2], i[3]);
        if (dim == 0) {
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
static void k_pad(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    const int32_t *p = n->op_params;
    const int circular = p[8];
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t i1 = ir % d->ne[1];
        const int64_t i2 = (ir / d->ne[1]) % d->ne[2];
        const int64_t i3 = ir / (d->ne[1] * d->ne[2]);
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
static void k_arange(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const float start = param_f32(n, 0), step = param_f32(n, 2);
    float *y = (float *)n->dst.data;
    const int64_t steps = n->dst.ne[0];
    for (int64_t i = job->ith; i < steps; i += job->nth) y[i] = fmaf(step, (float)i, start);
}

/* keep one triangle of each matrix (op_params[0]: 0 upper+diag, 1 upper, 2 lower+diag, 3 lower) */
static void k_tri(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
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
static void k_fill(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *d = &n->dst;
    const float c = param_f32(n, 0);
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
static void k_diag_mask(gr_job *job, int phase) {
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    if (phase == 0) {
        if (s->data == d->data) return;
        int64_t r0, r1;
        gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
        for (int64_t ir = r0; ir < r1; ir++) memmove(gr_row(d, ir), gr_row(s, ir), (size_t)d->ne[0] * 4);
        return;
    }
    const int64_t n_past = n->op_params[0];
    const float value = n->sub ? 0.0f : -INFINITY;
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
static void k_diag(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
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

/* ---- sorting ----------------------------------------------------------------------- */

/* stable merge sort of indices by value (desc != 0: largest first) */
static void sort_idx(int32_t *idx, int32_t *tmp, int64_t n, const float *v, int desc) {
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            const int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi) {
                const float x = v[idx[a]], y = v[idx[b]];
                const int take_b = desc ? y > x : y < x;
                tmp[k++] = take_b ? idx[b++] : idx[a++];
            }
            while (a < mid) tmp[k++] = idx[a++];
            while (b < hi) tmp[k++] = idx[b++];
        }
        memcpy(idx, tmp, (size_t)n * 4);
    }
}

/* ARGSORT (sub 0: whole rows, order op_params[0]) and TOP_K (sub 1: the dst.ne0
 * largest, in decreasing order with the first two swapped, as ggml returns them) */
static void k_argsort(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    const int64_t ne00 = s->ne[0];
    int32_t *idx = (int32_t *)gr_thread_f32(job, 2 * ne00 + 16);
    int32_t *tmp = idx + ne00 + 8;
    const int top_k = n->sub;
    const int desc = top_k ? 1 : n->op_params[0] == 1;
    int64_t r0, r1;
    gr_range(gr_nrows(s), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const float *x = (const float *)gr_row(s, ir);
        for (int64_t j = 0; j < ne00; j++) idx[j] = (int32_t)j;
        sort_idx(idx, tmp, ne00, x, desc);
        const int64_t k = d->ne[0];
        if (top_k && k > 1) {
            const int32_t t = idx[0];
            idx[0] = idx[1];
            idx[1] = t;
        }
        memcpy(gr_row(d, ir), idx, (size_t)k * 4);
    }
}

/* ---- MoE and outer product ----------------------------------------------------------- */

#define MMID_CH 16   /* weight rows per chunk of an expert's run */

static int mmid_kpanel_kind(const gr_node *n) {
    return n->iparams[1] && gr_kpanel_available(n->src[0].type) && n->iparams[0] == GR_TYPE_Q8_K;
}

size_t gr_mmid_thread_bytes(const gr_node *n) {
    const int64_t K = n->src[0].ne[0];
    size_t b = (gr_tiled_row_bytes(K) + 63) & ~(size_t)63;
    if (mmid_kpanel_kind(n)) b += (size_t)MMID_CH * (size_t)(K / 256) * (GR_KROW_BYTES + 8);
    return (b + 63) & ~(size_t)63;
}

size_t gr_mmid_index_bytes(const gr_node *n) {
    const size_t n_as = (size_t)n->src[0].ne[2], pairs = (size_t)(n->src[2].ne[0] * n->src[2].ne[1]);
    return ((2 * n_as * sizeof(int64_t) + 63) & ~(size_t)63) + ((pairs * sizeof(int64_t) + 63) & ~(size_t)63);
}

/* dst[:, e, t] = src0[:, :, ids[e, t]] @ src1[:, e % ne11, t]; phase 0 converts src1
 * to the vec_dot type (iparams as MUL_MAT) and groups the routed rows by expert.
 * ggml's vec_dot order throughout, but for K-quant experts with 8 routed rows or
 * more: ggml's tiled order. Quantized experts go one by one, each weight row
 * dotted with all the expert's rows while it is in cache.
 *   src0: (K, M, n_as); src1: (K, ne11, T); ids: (n_used, T) I32; dst: (M, n_used, T) */
static void k_mul_mat_id(gr_job *job, int phase) {
    const gr_node *n = job->node;
    const gr_tensor *w = &n->src[0], *x = &n->src[1], *ids = &n->src[2], *d = &n->dst;
    const int32_t vdt = (int32_t)n->iparams[0];
    const size_t row_size = (size_t)n->iparams[2];
    const int64_t K = w->ne[0], M = w->ne[1], n_as = w->ne[2];
    const int conv = x->type != vdt;
    /* rows routed to each expert, where each expert's run of (slot + n_used *
     * token) starts in `pairs` */
    const size_t conv_bytes = ((conv ? row_size * (size_t)gr_nrows(x) : 0) + 63) & ~(size_t)63;
    int64_t *counts = (int64_t *)(job->wdata + conv_bytes), *starts = counts + n_as;
    int64_t *pairs = (int64_t *)(job->wdata + conv_bytes + (((size_t)n_as * 16 + 63) & ~(size_t)63));
    const int64_t n_used = ids->ne[0], T = ids->ne[1];
    if (phase == 0) {
        if (job->ith == 0) {
            gr_chunk_set(job, job->nth);
            memset(counts, 0, (size_t)n_as * sizeof(int64_t));
            for (int64_t t = 0; t < T; t++)
                for (int64_t e = 0; e < n_used; e++) {
                    int32_t a;
                    memcpy(&a, ids->data + e * ids->nb[0] + t * ids->nb[1], 4);
                    if (a >= 0 && a < n_as) counts[a]++;
                }
            int64_t at = 0;
            for (int64_t a = 0; a < n_as; a++) {
                starts[a] = at;
                at += counts[a];
            }
            for (int64_t t = 0; t < T; t++)
                for (int64_t e = 0; e < n_used; e++) {
                    int32_t a;
                    memcpy(&a, ids->data + e * ids->nb[0] + t * ids->nb[1], 4);
                    if (a >= 0 && a < n_as) pairs[starts[a]++] = e + n_used * t;
                }
            for (int64_t a = 0; a < n_as; a++) starts[a] -= counts[a];
        }
        if (!conv) return;
        int64_t r0, r1;
        gr_range(gr_nrows(x), job->ith, job->nth, &r0, &r1);
        ggmlrpc_from_float_fn from_float = NULL;
        if (vdt != GR_TYPE_F32 && vdt != GR_TYPE_F16) from_float = ggmlrpc_get_from_float((uint32_t)vdt);
        for (int64_t ir = r0; ir < r1; ir++) {
            const char *src = gr_row(x, ir);
            char *dst = job->wdata + (size_t)ir * row_size;
            if (vdt == GR_TYPE_F32) gr_load_f32(x->type, src, x->nb[0], (float *)dst, K);
            else if (vdt == GR_TYPE_F16) gr_vec.fp32_to_fp16(K, (const float *)src, (uint16_t *)dst);
            else from_float((const float *)src, dst, K);
        }
        return;
    }
    ggmlrpc_vec_dot_fn qdot = NULL;
    if (w->type != GR_TYPE_F32 && w->type != GR_TYPE_F16) qdot = ggmlrpc_get_vec_dot((uint32_t)w->type);
    const int64_t ne11 = x->ne[1];
    const int tiled_type = n->iparams[1] != 0;
    const size_t threads_at = (conv_bytes + gr_mmid_index_bytes(n) + 63) & ~(size_t)63;
    char *mem = tiled_type ? job->wdata + threads_at + (size_t)job->ith * gr_mmid_thread_bytes(n) : NULL;
    /* K-panel kernel on the routed rows where they are, if the plan made room */
    const int kp = tiled_type && mmid_kpanel_kind(n) &&
                   n->wsize >= threads_at + (size_t)job->nth * gr_mmid_thread_bytes(n);
    const int64_t nb = K / 256;
    char *krows = kp ? mem + ((gr_tiled_row_bytes(K) + 63) & ~(size_t)63) : NULL;
    float *kd = kp ? (float *)(krows + (size_t)MMID_CH * (size_t)nb * GR_KROW_BYTES) : NULL;
    float *kdm = kp ? kd + MMID_CH * nb : NULL;
    const int quant = w->type != GR_TYPE_F32 && w->type != GR_TYPE_F16;
    if (quant) {
        /* expert by expert: chunks of an expert's weight rows handed out one at a
         * time, each row (decoded once, for K-quant experts with 8+ routed rows)
         * dotted with every routed row while it is in cache */
        const ggmlrpc_vec_dot_x4_fn qdot4 = conv ? ggmlrpc_get_vec_dot_x4((uint32_t)w->type) : NULL;
        const int64_t nch = (M + MMID_CH - 1) / MMID_CH;
        int64_t total = 0;
        for (int64_t a = 0; a < n_as; a++) total += counts[a] > 0 ? nch : 0;
        int64_t a = 0, before = 0;   /* items of the experts before a */
        for (int64_t it = job->ith; it < total; it = gr_chunk_next(job)) {
            while (counts[a] == 0 || it >= before + nch) {
                if (counts[a] > 0) before += nch;
                a++;
            }
            const int64_t ib = (it - before) * MMID_CH, ie = ib + MMID_CH < M ? ib + MMID_CH : M;
#define MMID_ACT(pr) (conv ? job->wdata + (size_t)((pr) % n_used % ne11 + (pr) / n_used * ne11) * row_size \
                           : x->data + (pr) % n_used % ne11 * x->nb[1] + (pr) / n_used * x->nb[2])
#define MMID_OUT(pr) ((float *)(d->data + (pr) % n_used * d->nb[1] + (pr) / n_used * d->nb[2]))
            if (!(tiled_type && counts[a] >= 8)) {   /* ggml's vec_dot order: one product each */
                for (int64_t i01 = ib; i01 < ie; i01++) {
                    const char *wr = w->data + a * w->nb[2] + i01 * w->nb[1];
                    int64_t k = starts[a];
                    for (; qdot4 && k + 4 <= starts[a] + counts[a]; k += 4) {
                        const void *act[4] = { MMID_ACT(pairs[k]), MMID_ACT(pairs[k + 1]), MMID_ACT(pairs[k + 2]),
                                               MMID_ACT(pairs[k + 3]) };
                        float v[4];
                        qdot4(K, v, wr, act);
                        for (int j = 0; j < 4; j++) MMID_OUT(pairs[k + j])[i01] = v[j];
                    }
                    for (; k < starts[a] + counts[a]; k++) qdot(K, &MMID_OUT(pairs[k])[i01], wr, MMID_ACT(pairs[k]));
                }
                continue;
            }
            if (kp) {   /* eight routed rows at a time; a short last group repeats its first row */
                for (int64_t i01 = ib; i01 < ie; i01++)
                    gr_kpanel_decode(w->type, nb, w->data + a * w->nb[2] + i01 * w->nb[1],
                                     krows + (size_t)(i01 - ib) * nb * GR_KROW_BYTES, kd + (i01 - ib) * nb,
                                     kdm + (i01 - ib) * nb);
                for (int64_t k0 = starts[a]; k0 < starts[a] + counts[a]; k0 += 8) {
                    const int64_t cnt = starts[a] + counts[a] - k0 < 8 ? starts[a] + counts[a] - k0 : 8;
                    const void *act[8];
                    float *outs[8];
                    for (int j = 0; j < 8; j++) {
                        const int64_t pr = pairs[k0 + (j < cnt ? j : 0)];
                        act[j] = MMID_ACT(pr);
                        outs[j] = MMID_OUT(pr);
                    }
                    for (int64_t i01 = ib; i01 < ie; i01++) {
                        float v[8];
                        gr_kpanel_dot_rows(w->type, nb, krows + (size_t)(i01 - ib) * nb * GR_KROW_BYTES,
                                           kd + (i01 - ib) * nb, kdm + (i01 - ib) * nb, act, v);
                        for (int64_t j = 0; j < cnt; j++) outs[j][i01] = v[j];
                    }
                }
                continue;
            }
            for (int64_t i01 = ib; i01 < ie; i01++) {
                const gr_tiled_row row = gr_tiled_decode(w->type, K, w->data + a * w->nb[2] + i01 * w->nb[1], mem);
                for (int64_t k = starts[a]; k < starts[a] + counts[a]; k++)
                    MMID_OUT(pairs[k])[i01] = gr_tiled_dot_row(&row, MMID_ACT(pairs[k]));
            }
        }
    }
#undef MMID_ACT
#undef MMID_OUT
    /* every (slot, token): the expert id checked; F32/F16 experts computed here */
    int64_t r0, r1;
    gr_range(n_used * T, job->ith, job->nth, &r0, &r1);
    for (int64_t p = r0; p < r1; p++) {
        const int64_t e = p % n_used, t = p / n_used;
        int32_t a;
        memcpy(&a, ids->data + e * ids->nb[0] + t * ids->nb[1], 4);
        if (a < 0 || a >= n_as) {
            gr_fail(job, GR_EXEC_EINDEX, "MUL_MAT_ID expert %d out of range [0, %lld)", a, (long long)n_as);
            return;
        }
        if (quant) continue;   /* done above */
        const int64_t i11 = e % ne11;
        const char *act = conv ? job->wdata + (size_t)(i11 + t * ne11) * row_size
                               : x->data + i11 * x->nb[1] + t * x->nb[2];
        const char *wa = w->data + a * w->nb[2];
        float *out = (float *)(d->data + e * d->nb[1] + t * d->nb[2]);
        for (int64_t i01 = 0; i01 < M; i01++) {
            const char *wr = wa + i01 * w->nb[1];
            out[i01] = w->type == GR_TYPE_F32 ? gr_vec.dot_f32(K, (const float *)wr, (const float *)act)
                                              : gr_vec.dot_f16(K, (const uint16_t *)wr, (const uint16_t *)act);
        }
    }
}

/* dst[:, i1, i2] = src0[:, i1, i2] + src1[:, ids[i1, i2]]
 *   src0, dst: (ne0, ne1, ne2) F32; src1: (ne0, ne11) F32; ids: (ne1, ne2) I32 */
static void k_add_id(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *a = &n->src[0], *b = &n->src[1], *ids = &n->src[2], *d = &n->dst;
    int64_t r0, r1;
    gr_range(gr_nrows(a), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t i1 = ir % a->ne[1];
        const int64_t i2 = (ir / a->ne[1]) % a->ne[2];
        const int64_t i3 = ir / (a->ne[1] * a->ne[2]);
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
static void k_out_prod(gr_job *job, int phase) {
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
static void k_fwht(gr_job *job, int phase) {
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


/* ---- encoder ops (vision and audio) ---------------------------------------------- */

/* Unfold image patches for a convolution as a matrix product:
 *   src1 image: (IW, IH, IC, N) (2-D) or (IW, IC, N) (1-D), planes contiguous
 *   dst: (IC*KH*KW, OW, OH, N) (2-D) or (IC*KW, OW, N) (1-D), contiguous F32/F16
 *   op_params: s0, s1, p0, p1, d0, d1, is_2D; src0 (the kernel) gives KW, KH */
static void k_im2col(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *k = &n->src[0], *img = &n->src[1], *d = &n->dst;
    const int32_t *p = n->op_params;
    const int is2d = p[6] == 1;
    const int64_t N = is2d ? img->ne[3] : img->ne[2], IC = is2d ? img->ne[2] : img->ne[1];
    const int64_t IH = is2d ? img->ne[1] : 1, IW = img->ne[0];
    const int64_t KH = is2d ? k->ne[1] : 1, KW = k->ne[0];
    const int64_t OH = is2d ? d->ne[2] : 1, OW = d->ne[1];
    const int64_t ofs0 = is2d ? img->nb[3] : img->nb[2], ofs1 = is2d ? img->nb[2] : img->nb[1];
    const int f16 = d->type == GR_TYPE_F16;
    for (int64_t in = 0; in < N; in++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++)
                for (int64_t ic = job->ith; ic < IC; ic += job->nth) {
                    const int64_t base = (in * OH * OW + oh * OW + ow) * (IC * KH * KW) + ic * KH * KW;
                    const char *src = img->data + in * ofs0 + ic * ofs1;
                    for (int64_t kh = 0; kh < KH; kh++)
                        for (int64_t kw = 0; kw < KW; kw++) {
                            const int64_t iw = ow * p[0] + kw * p[4] - p[2];
                            const int64_t ih = oh * p[1] + kh * p[5] - p[3];
                            float v = 0.0f;
                            if (ih >= 0 && ih < IH && iw >= 0 && iw < IW)
                                gr_load_f32(img->type, src + (ih * IW + iw) * img->nb[0], 0, &v, 1);
                            if (f16) {
                                const uint16_t h = gr_fp32_to_fp16(v);
                                memcpy(d->data + (base + kh * KW + kw) * 2, &h, 2);
                            } else {
                                memcpy(d->data + (base + kh * KW + kw) * 4, &v, 4);
                            }
                        }
                }
}

enum { POOL_MAX = 0, POOL_AVG = 1 };

/* POOL_1D: op_params op, k0, s0, p0; average over the taps inside the row */
static void k_pool_1d(gr_job *job, int phase) {
    (void)phase;
    if (job->ith != 0) return;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    const int op = n->op_params[0], k = n->op_params[1], st = n->op_params[2], pd = n->op_params[3];
    const int64_t IW = s->ne[0], OW = d->ne[0];
    for (int64_t ir = 0; ir < gr_nrows(s); ir++) {
        const char *row = gr_row(s, ir);
        float *out = (float *)gr_row(d, ir);
        for (int64_t ow = 0; ow < OW; ow++) {
            float res = op == POOL_AVG ? 0.0f : -FLT_MAX;
            int count = 0;
            for (int ki = 0; ki < k; ki++) {
                const int64_t j = ow * st - pd + ki;
                if (j < 0 || j >= IW) continue;
                float v;
                gr_load_f32(s->type, row + j * s->nb[0], 0, &v, 1);
                res = op == POOL_AVG ? res + v : (v > res ? v : res);
                count++;
            }
            if (op == POOL_AVG) res = count > 0 ? res / count : 0.0f;
            out[ow] = res;
        }
    }
}

/* POOL_2D: op_params op, k0, k1, s0, s1, p0, p1; average over the whole window */
static void k_pool_2d(gr_job *job, int phase) {
    (void)phase;
    if (job->ith != 0) return;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    const int32_t *p = n->op_params;
    const int op = p[0], k0 = p[1], k1 = p[2], s0 = p[3], s1 = p[4], p0 = p[5], p1 = p[6];
    for (int64_t i3 = 0; i3 < d->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < d->ne[2]; i2++)
            for (int64_t oy = 0; oy < d->ne[1]; oy++) {
                float *out = (float *)gr_at(d, 0, oy, i2, i3);
                for (int64_t ox = 0; ox < d->ne[0]; ox++) {
                    float res = op == POOL_AVG ? 0.0f : -FLT_MAX;
                    const int64_t ix = ox * s0 - p0, iy = oy * s1 - p1;
                    for (int ky = 0; ky < k1; ky++) {
                        if (iy + ky < 0 || iy + ky >= s->ne[1]) continue;
                        for (int kx = 0; kx < k0; kx++) {
                            const int64_t j = ix + kx;
                            if (j < 0 || j >= s->ne[0]) continue;
                            float v;
                            gr_load_f32(s->type, gr_at(s, j, iy + ky, i2, i3), 0, &v, 1);
                            res = op == POOL_AVG ? res + v : (v > res ? v : res);
                        }
                    }
                    if (op == POOL_AVG) res /= k0 * k1;
                    out[ox] = res;
                }
            }
}

static inline int64_t clampi(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }
static inline float src_f(const gr_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    float v;
    memcpy(&v, gr_at(t, i0, i1, i2, i3), 4);
    return v;
}

/* bicubic convolution weights, alpha = -0.75 (PyTorch's), with the fused steps and
 * the order of terms the reference build computes them in */
static inline float cubic1(float x) { return fmaf(fmaf(1.25f, x, -2.25f) * x, x, 1.0f); }
static inline float cubic2(float x) { return fmaf(fmaf(fmaf(-0.75f, x, 3.75f), x, -6.0f), x, 3.0f); }
static inline float bicubic(float p0, float p1, float p2, float p3, float x) {
    const float w0 = cubic2(x + 1), w1 = cubic1(x + 0), w2 = cubic1(1 - x), w3 = cubic2(2 - x);
    return fmaf(p3, w3, fmaf(p2, w2, fmaf(p0, w0, p1 * w1)));
}

/* Resample to dst's shape: nearest, bilinear (optionally antialiased), bicubic;
 * op_params[0]: mode | flags (256 align corners, 512 antialias). F32. */
static void k_upscale(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    const int64_t ne00 = s->ne[0], ne01 = s->ne[1];
    float sf0 = (float)d->ne[0] / ne00, sf1 = (float)d->ne[1] / ne01;
    const float sf2 = (float)d->ne[2] / s->ne[2], sf3 = (float)d->ne[3] / s->ne[3];
    const int flags = n->op_params[0], mode = flags & 0xFF;
    float off = 0.5f;
    if (flags & 256) {
        off = 0.0f;
        if (d->ne[0] > 1 && ne00 > 1) sf0 = (float)(d->ne[0] - 1) / (ne00 - 1);
        if (d->ne[1] > 1 && ne01 > 1) sf1 = (float)(d->ne[1] - 1) / (ne01 - 1);
    }
    for (int64_t i3 = 0; i3 < d->ne[3]; i3++) {
        const int64_t i03 = clampi((int64_t)(i3 / sf3), 0, s->ne[3] - 1);
        for (int64_t i2 = job->ith; i2 < d->ne[2]; i2 += job->nth) {
            const int64_t i02 = clampi((int64_t)(i2 / sf2), 0, s->ne[2] - 1);
            for (int64_t i1 = 0; i1 < d->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < d->ne[0]; i0++) {
                    float val;
                    if (mode == 0) {
                        val = src_f(s, clampi((int64_t)(i0 / sf0), 0, ne00 - 1),
                                    clampi((int64_t)(i1 / sf1), 0, ne01 - 1), i02, i03);
                    } else if (mode == 1 && (flags & 512)) {
                        const float sup1 = fmaxf(1.0f, 1.0f / sf1), inv1 = 1.0f / sup1;
                        const float sup0 = fmaxf(1.0f, 1.0f / sf0), inv0 = 1.0f / sup0;
                        const float y = ((float)i1 + off) / sf1, x = ((float)i0 + off) / sf0;
                        int64_t x_min = (int64_t)(x - sup0 + off), x_max = (int64_t)(x + sup0 + off);
                        int64_t y_min = (int64_t)(y - sup1 + off), y_max = (int64_t)(y + sup1 + off);
                        x_min = x_min < 0 ? 0 : x_min;
                        y_min = y_min < 0 ? 0 : y_min;
                        x_max = x_max > ne00 ? ne00 : x_max;
                        y_max = y_max > ne01 ? ne01 : y_max;
                        float acc = 0.0f, total = 0.0f;
                        for (int64_t sy = y_min; sy < y_max; sy++) {
                            const float wy = fmaxf(1.0f - fabsf((sy - y + off) * inv1), 0.0f);
                            for (int64_t sx = x_min; sx < x_max; sx++) {
                                const float wx = fmaxf(1.0f - fabsf((sx - x + off) * inv0), 0.0f);
                                const float w = wx * wy;
                                if (w <= 0.0f) continue;
                                acc = fmaf(src_f(s, sx, sy, i02, i03), w, acc);
                                total += w;
                            }
                        }
                        val = total > 0.0f ? acc / total : acc;
                    } else if (mode == 1) {
                        const float y = ((float)i1 + off) / sf1 - off, x = ((float)i0 + off) / sf0 - off;
                        int64_t y0 = (int64_t)floorf(y), x0 = (int64_t)floorf(x);
                        const int64_t y1 = clampi(y0 + 1, 0, ne01 - 1), x1 = clampi(x0 + 1, 0, ne00 - 1);
                        y0 = clampi(y0, 0, ne01 - 1);
                        x0 = clampi(x0, 0, ne00 - 1);
                        const float dy = fmaxf(0.0f, fminf(y - (float)y0, 1.0f));
                        const float dx = fmaxf(0.0f, fminf(x - (float)x0, 1.0f));
                        const float a = src_f(s, x0, y0, i02, i03), b = src_f(s, x1, y0, i02, i03);
                        const float c = src_f(s, x0, y1, i02, i03), e = src_f(s, x1, y1, i02, i03);
                        /* the reference build sums the second term first, then fuses the rest in order */
                        val = fmaf(e * dx, dy, fmaf(c * (1 - dx), dy, fmaf(a * (1 - dx), 1 - dy, b * dx * (1 - dy))));
                    } else {
                        const float y = ((float)i1 + off) / sf1 - off, x = ((float)i0 + off) / sf0 - off;
                        const int64_t y0 = (int64_t)floorf(y), x0 = (int64_t)floorf(x);
                        const float dy = y - (float)y0, dx = x - (float)x0;
                        float rows[4];
                        for (int r = 0; r < 4; r++) {
                            const int64_t yy = clampi(y0 - 1 + r, 0, ne01 - 1);
                            float px[4];
                            for (int c = 0; c < 4; c++) px[c] = src_f(s, clampi(x0 - 1 + c, 0, ne00 - 1), yy, i02, i03);
                            rows[r] = bicubic(px[0], px[1], px[2], px[3], dx);
                        }
                        val = bicubic(rows[0], rows[1], rows[2], rows[3], dy);
                    }
                    memcpy(gr_at(d, i0, i1, i2, i3), &val, 4);
                }
        }
    }
}

/* dst = src0 rolled by op_params[0..3] along each dimension (|shift| < ne) */
static void k_roll(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    const int32_t *sh = n->op_params;
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t i1 = ir % d->ne[1], i2 = (ir / d->ne[1]) % d->ne[2], i3 = ir / (d->ne[1] * d->ne[2]);
        const char *x = gr_at(s, 0, wrap(i1 - sh[1], s->ne[1]), wrap(i2 - sh[2], s->ne[2]), wrap(i3 - sh[3], s->ne[3]));
        float *y = (float *)gr_at(d, 0, i1, i2, i3);
        const int64_t first = wrap(-sh[0], s->ne[0]), cnt = s->ne[0] - first;
        memcpy(y, x + first * 4, (size_t)cnt * 4);
        memcpy(y + cnt, x, (size_t)first * 4);
    }
}

/* dst row = src0 row with p0 / p1 mirrored elements added on the left / right */
static void k_pad_reflect_1d(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    const int64_t p0 = n->op_params[0], p1 = n->op_params[1], ne0 = d->ne[0];
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        float *y = (float *)gr_row(d, ir);
        memcpy(y + p0, gr_row(s, ir), (size_t)s->ne[0] * 4);
        for (int64_t i = 1; i <= p0; i++) y[p0 - i] = y[p0 + i];
        for (int64_t i = 1; i <= p1; i++) y[ne0 - p1 - 1 + i] = y[ne0 - p1 - 1 - i];
    }
}

/* sinusoidal embeddings of timesteps: dst (dim, n) from src0 (n) */
static void k_timestep_embedding(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    const int dim = n->op_params[0], max_period = n->op_params[1], half = dim / 2;
    for (int64_t i = 0; i < s->ne[0]; i++) {
        float *e = (float *)(d->data + i * d->nb[1]);
        float t;
        memcpy(&t, s->data + i * s->nb[0], 4);
        for (int64_t j = job->ith; j < half; j += job->nth) {
            const float freq = expf(-logf((float)max_period) * j / half);
            const float arg = t * freq;
            e[j] = cosf(arg);
            e[j + half] = sinf(arg);
        }
        if (dim % 2 != 0 && job->ith == 0) e[2 * half] = 0.0f;
    }
}

/* ---- Segment Anything's windowed attention helpers ---------------------------------- */

/* sub 0 WIN_PART: src0 (C, W, H) -> dst (C, w, w, npx*npy), windows of w x w
 *   positions, zero past the edges; op_params npx, npy, w.
 * sub 1 WIN_UNPART: src0 (C, w, w, >= windows) -> dst (C, W, H); op_params w.
 * Both contiguous F32; threads split dst rows (C floats each). */
static void k_win_part(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    const int64_t C = d->ne[0], row = C * 4;
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t i1 = ir % d->ne[1], i2 = (ir / d->ne[1]) % d->ne[2], i3 = ir / (d->ne[1] * d->ne[2]);
        char *out = d->data + ir * row;
        if (n->sub == 0) {
            const int64_t npx = n->op_params[0], w = n->op_params[2];
            const int64_t y = (i3 / npx) * w + i2, x = (i3 % npx) * w + i1;
            if (y >= s->ne[2] || x >= s->ne[1]) memset(out, 0, (size_t)row);
            else memcpy(out, s->data + (y * s->ne[1] + x) * row, (size_t)row);
        } else {
            const int64_t w = n->op_params[0], npx = (d->ne[1] + w - 1) / w;
            const int64_t win = (i2 / w) * npx + i1 / w;
            memcpy(out, s->data + ((win * s->ne[2] + i2 % w) * s->ne[1] + i1 % w) * row, (size_t)row);
        }
    }
}

/* Relative position table: dst[i2][i1] = src0 row (ne1 - 1 - i1 + i2), 16-bit
 * values copied as they are. src0 (C, 2*ne1 - 1) and dst (C, ne1, ne1) contiguous. */
static void k_get_rel_pos(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    const int64_t w = d->ne[1], row = d->ne[0] * 2;
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t i1 = ir % w, i2 = ir / w;
        memcpy(d->data + ir * row, s->data + (w - i1 - 1 + i2) * row, (size_t)row);
    }
}

/* dst = src0 (phase 0, unless in place), then for every row p of the position
 * terms pw, ph (W, H, heads...) the (W, W) block p of dst gets ph[p][a] added to
 * its row a and pw[p][b] to its column b, in ggml's order (the term whose index
 * comes first in ggml's loop is added first). All contiguous F32; threads split
 * the blocks in phase 1. */
static void k_add_rel_pos(gr_job *job, int phase) {
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    if (phase == 0) {
        if (d->data != s->data) {
            const int64_t total = gr_nelements(d) * 4;
            int64_t b0, b1;
            gr_range(total, job->ith, job->nth, &b0, &b1);
            memcpy(d->data + b0, s->data + b0, (size_t)(b1 - b0));
        }
        return;
    }
    const float *pw = (const float *)n->src[1].data, *ph = (const float *)n->src[2].data;
    const int64_t W = n->src[1].ne[0], rows = gr_nelements(&n->src[1]) / W;
    float *out = (float *)d->data;
    int64_t r0, r1;
    gr_range(rows, job->ith, job->nth, &r0, &r1);
    for (int64_t p = r0; p < r1; p++) {
        float *blk = out + p * W * W;
        for (int64_t a = 0; a < W; a++)
            for (int64_t b = 0; b < W; b++) {
                const float h = ph[p * W + a], v = pw[p * W + b];
                float *e = &blk[a * W + b];
                if (a <= b) *e = (*e + h) + v;
                else *e = (*e + v) + h;
            }
    }
}

/* ---- DeepSeek V4: lightning indexer and hyper-connection mixing -------------------- */

/* dst[s][t][j] = sum over heads h of max(q[s][t][h] . k[s][j], 0) * w[s][t][h], plus
 * the F16 mask; K rows (any type with a float conversion) converted per thread.
 *   q (E, heads, T, S) F32; k (E, 1, n_kv, S); w (heads, T, 1, S) F32;
 *   mask (n_kv, T, 1, S') F16, S % S' == 0; dst (n_kv, T, 1, S) F32; rows contiguous */
static void k_lightning_indexer(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *q = &n->src[0], *k = &n->src[1], *w = &n->src[2], *m = &n->src[3], *d = &n->dst;
    const int64_t E = q->ne[0], H = q->ne[1], T = q->ne[2], S = q->ne[3], n_kv = k->ne[2];
    float *kf = gr_thread_f32(job, E);
    ggmlrpc_to_float_fn to_float = NULL;
    if (k->type != GR_TYPE_F32 && k->type != GR_TYPE_F16 && k->type != GR_TYPE_BF16)
        to_float = ggmlrpc_get_to_float((uint32_t)k->type);
    int64_t j0, j1;
    gr_range(n_kv, job->ith, job->nth, &j0, &j1);
    for (int64_t s = 0; s < S; s++)
        for (int64_t t = 0; t < T; t++) {
            const float *wr = (const float *)gr_at(w, 0, t, 0, s);
            const char *mr = gr_at(m, 0, t, 0, s % m->ne[3]);
            float *out = (float *)gr_at(d, 0, t, 0, s);
            for (int64_t j = j0; j < j1; j++) {
                const char *kr = gr_at(k, 0, 0, j, s);
                const float *kv = kf;
                if (k->type == GR_TYPE_F32) kv = (const float *)kr;
                else if (to_float) to_float(kr, kf, E);
                else gr_load_f32(k->type, kr, k->nb[0], kf, E);
                float score = 0.0f;
                for (int64_t h = 0; h < H; h++) {
                    const float qk = gr_vec.dot_f32(E, (const float *)gr_at(q, 0, h, t, s), kv);
                    score = gr_family_madd(score, qk > 0.0f ? qk : 0.0f, wr[h]);
                }
                uint16_t mh;
                memcpy(&mh, mr + j * 2, 2);
                out[j] = score + gr_fp16_to_fp32(mh);
            }
        }
}

/* Hyper-connection weights, 4 streams: per token a 4x4 softmax over each source's
 * row of mixes*scale[2] + base (columns 8..23), then eps, then n_iter rounds of
 * Sinkhorn normalization (columns first, then rows and columns).
 *   mixes (24, T), scale (>= 3), base (24) F32; dst (4, 4, T) F32;
 *   op_params: eps (f32), n_iter */
static void k_dsv4_hc_comb(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *mx = &n->src[0], *sc = &n->src[1], *bs = &n->src[2], *d = &n->dst;
    const float eps = param_f32(n, 0);
    const int32_t n_iter = n->op_params[1];
    float scale;
    memcpy(&scale, sc->data + 2 * sc->nb[0], 4);
    int64_t t0, t1;
    gr_range(mx->ne[1], job->ith, job->nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        float c[16];
        for (int src = 0; src < 4; src++) {
            float mxv = -INFINITY, sum = 0.0f;
            for (int dst = 0; dst < 4; dst++) {
                const int i = dst + 4 * src;
                float xv, bv;
                memcpy(&xv, gr_at(mx, 8 + i, t, 0, 0), 4);
                memcpy(&bv, bs->data + (8 + i) * bs->nb[0], 4);
                c[i] = fmaf(xv, scale, bv);
                mxv = mxv > c[i] ? mxv : c[i];
            }
            for (int dst = 0; dst < 4; dst++) {
                c[dst + 4 * src] = expf(c[dst + 4 * src] - mxv);
                sum += c[dst + 4 * src];
            }
            const float inv = 1.0f / sum;
            for (int dst = 0; dst < 4; dst++) c[dst + 4 * src] = fmaf(c[dst + 4 * src], inv, eps);
        }
        for (int32_t it = 0; it < n_iter; it++) {
            if (it > 0)
                for (int src = 0; src < 4; src++) {   /* rows: one source's weights */
                    float sum = eps;
                    for (int dst = 0; dst < 4; dst++) sum += c[dst + 4 * src];
                    const float inv = 1.0f / sum;
                    for (int dst = 0; dst < 4; dst++) c[dst + 4 * src] *= inv;
                }
            for (int dst = 0; dst < 4; dst++) {       /* columns */
                float sum = eps;
                for (int src = 0; src < 4; src++) sum += c[dst + 4 * src];
                const float inv = 1.0f / sum;
                for (int src = 0; src < 4; src++) c[dst + 4 * src] *= inv;
            }
        }
        for (int src = 0; src < 4; src++)
            for (int dst = 0; dst < 4; dst++) memcpy(gr_at(d, dst, src, t, 0), &c[dst + 4 * src], 4);
    }
}

/* Hyper-connection input: dst(i, t) = scale * sum over streams h of x(i, h, t) * w,
 * w = weights(h, t), or sigmoid(gate(i, h, t)) when gated (op_params[1]).
 *   x (E, hc, T) F32; weights (hc, T) or (E, hc, T) F32; dst (E, T) F32 */
static void k_dsv4_hc_pre(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *x = &n->src[0], *w = &n->src[1], *d = &n->dst;
    const int64_t E = x->ne[0], hc = x->ne[1];
    const float scale = param_f32(n, 0);
    const int gated = n->op_params[1] != 0;
    int64_t r0, r1;
    gr_range(E * x->ne[2], job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t i = ir % E, t = ir / E;
        float sum = 0.0f;
        for (int64_t h = 0; h < hc; h++) {
            float xv, wv;
            memcpy(&xv, gr_at(x, i, h, t, 0), 4);
            if (gated) {
                float gv;
                memcpy(&gv, gr_at(w, i, h, t, 0), 4);
                wv = 1.0f / (1.0f + expf(-gv));
            } else {
                memcpy(&wv, gr_at(w, h, t, 0, 0), 4);
            }
            sum = gr_family_madd(sum, xv, wv);
        }
        const float v = scale * sum;
        memcpy(gr_at(d, i, t, 0, 0), &v, 4);
    }
}

/* Hyper-connection output: dst(i, j, t) = x(i, t) * post(j, t) + sum over streams h
 * of residual(i, h, t) * comb(j, h, t), or + residual(i, j, t) without comb.
 *   x (E, T), residual (E, hc, T), post (hc, T), comb (hc, hc, T) F32; dst (E, hc, T) */
static void k_dsv4_hc_post(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *x = &n->src[0], *r = &n->src[1], *p = &n->src[2], *d = &n->dst;
    const gr_tensor *cb = n->n_src > 3 ? &n->src[3] : NULL;
    const int64_t E = x->ne[0], hc = r->ne[1];
    int64_t r0, r1;
    gr_range(E * hc * x->ne[1], job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t i = ir % E, j = (ir / E) % hc, t = ir / (E * hc);
        float xv, pv, sum;
        memcpy(&xv, gr_at(x, i, t, 0, 0), 4);
        memcpy(&pv, gr_at(p, j, t, 0, 0), 4);
        if (cb) {
            sum = xv * pv;
            for (int64_t h = 0; h < hc; h++) {
                float rv, cv;
                memcpy(&rv, gr_at(r, i, h, t, 0), 4);
                memcpy(&cv, gr_at(cb, j, h, t, 0), 4);
                sum = gr_family_madd(sum, rv, cv);
            }
        } else {
            float rv;
            memcpy(&rv, gr_at(r, i, j, t, 0), 4);
            sum = xv * pv + rv;
        }
        memcpy(gr_at(d, i, j, t, 0), &sum, 4);
    }
}

/* ---- ADD / ADD1 on quantized data ------------------------------------------------- */

/* Per row: dequantize src0, add src1's F32 row (sub 0, same shape) or the scalar
 * src1 (sub 1), quantize into dst (src0's type) or store F32.
 * src0 rows contiguous; src1 rows contiguous F32. */
static void k_add_q(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *a = &n->src[0], *b = &n->src[1], *d = &n->dst;
    const int64_t nc = a->ne[0];
    float *row = gr_thread_f32(job, nc);
    const ggmlrpc_to_float_fn to_float = ggmlrpc_get_to_float((uint32_t)a->type);
    const ggmlrpc_from_float_fn from_float = d->type == GR_TYPE_F32 ? NULL : ggmlrpc_get_from_float((uint32_t)d->type);
    float v = 0.0f;
    if (n->sub == 1) memcpy(&v, b->data, 4);
    int64_t r0, r1;
    gr_range(gr_nrows(a), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        to_float(gr_row(a, ir), row, nc);
        if (n->sub == 1) {
            for (int64_t i = 0; i < nc; i++) row[i] += v;
        } else {
            const float *y = (const float *)gr_row(b, ir);
            for (int64_t i = 0; i < nc; i++) row[i] += y[i];
        }
        if (from_float) from_float(row, gr_row(d, ir), nc);
        else memcpy(gr_row(d, ir), row, (size_t)nc * 4);
    }
}

void gr_register_more_kernels(void (*set)(int, gr_kernel_fn, int)) {
    set(GR_K_FWHT, k_fwht, 1);
    set(GR_K_IM2COL, k_im2col, 1);
    set(GR_K_POOL_1D, k_pool_1d, 1);
    set(GR_K_POOL_2D, k_pool_2d, 1);
    set(GR_K_UPSCALE, k_upscale, 1);
    set(GR_K_ROLL, k_roll, 1);
    set(GR_K_PAD_REFLECT_1D, k_pad_reflect_1d, 1);
    set(GR_K_TIMESTEP_EMBEDDING, k_timestep_embedding, 1);
    set(GR_K_WIN_PART, k_win_part, 1);
    set(GR_K_GET_REL_POS, k_get_rel_pos, 1);
    set(GR_K_ADD_REL_POS, k_add_rel_pos, 2);
    set(GR_K_LIGHTNING_INDEXER, k_lightning_indexer, 1);
    set(GR_K_DSV4_HC_COMB, k_dsv4_hc_comb, 1);
    set(GR_K_DSV4_HC_PRE, k_dsv4_hc_pre, 1);
    set(GR_K_DSV4_HC_POST, k_dsv4_hc_post, 1);
    set(GR_K_ADD_Q, k_add_q, 1);
    set(GR_K_ACC, k_acc, 2);
    set(GR_K_SET, k_set, 2);
    set(GR_K_SUM, k_sum, 1);
    set(GR_K_SUM_ROWS, k_sum_rows, 1);
    set(GR_K_CUMSUM, k_cumsum, 1);
    set(GR_K_ARGMAX, k_argmax, 1);
    set(GR_K_COUNT_EQUAL, k_count_equal, 2);
    set(GR_K_REPEAT, k_repeat, 1);
    set(GR_K_REPEAT_BACK, k_repeat_back, 1);
    set(GR_K_CONCAT, k_concat, 1);
    set(GR_K_PAD, k_pad, 1);
    set(GR_K_ARANGE, k_arange, 1);
    set(GR_K_TRI, k_tri, 1);
    set(GR_K_FILL, k_fill, 1);
    set(GR_K_DIAG_MASK, k_diag_mask, 2);
    set(GR_K_DIAG, k_diag, 1);
    set(GR_K_ARGSORT, k_argsort, 1);
    set(GR_K_MUL_MAT_ID, k_mul_mat_id, 2);
    set(GR_K_ADD_ID, k_add_id, 1);
    set(GR_K_OUT_PROD, k_out_prod, 1);
}
