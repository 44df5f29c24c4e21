/* DeepSeek V4's own ops: the lightning indexer (attention scores for the sparse
 * selection) and the hyper-connection mixing (DSV4_HC_COMB / PRE / POST).
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

/* ---- DeepSeek V4: lightning indexer and hyper-connection mixing -------------------- */

/* dst[s][t][j] = sum over heads h of max(q[s][t][h] . k[s][j], 0) * w[s][t][h], plus
 * the F16 mask; K rows (any type with a float conversion) converted per thread.
 *   q (E, heads, T, S) F32; k (E, 1, n_kv, S); w (heads, T, 1, S) F32;
 *   mask (n_kv, T, 1, S') F16, S % S' == 0; dst (n_kv, T, 1, S) F32; rows contiguous */
void gr_k_lightning_indexer(gr_job *job, int phase) {
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
void gr_k_dsv4_hc_comb(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *mx = &n->src[0], *sc = &n->src[1], *bs = &n->src[2], *d = &n->dst;
    const float eps = gr_param_f32(n, 0);
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
void gr_k_dsv4_hc_pre(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *x = &n->src[0], *w = &n->src[1], *d = &n->dst;
    const int64_t E = x->ne[0], hc = x->ne[1];
    const float scale = gr_param_f32(n, 0);
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
void gr_k_dsv4_hc_post(gr_job *job, int phase) {
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
