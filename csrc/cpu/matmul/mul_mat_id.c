/* MUL_MAT_ID: the experts of a mixture-of-experts layer, each routed row
 * multiplied by the weights its ids select.
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

#define MMID_CH GR_MM_CHUNK_ROWS   /* weight rows per chunk of an expert's run */

/* dst[:, e, t] = src0[:, :, ids[e, t]] @ src1[:, e % ne11, t]; phase 0 converts src1
 * to the vec_dot type (iparams as MUL_MAT) and groups the routed rows by expert.
 * ggml's vec_dot order throughout, but for K-quant experts with 8 routed rows or
 * more: ggml's tiled order. Quantized experts go one by one, each weight row
 * dotted with all the expert's rows while it is in cache.
 *   src0: (K, M, n_as); src1: (K, ne11, T); ids: (n_used, T) I32; dst: (M, n_used, T) */
void gr_k_mul_mat_id(gr_job *job, int phase) {
    const gr_node *n = job->node;
    const gr_tensor *w = &n->src[0], *x = &n->src[1], *ids = &n->src[2], *d = &n->dst;
    const int32_t vdt = (int32_t)n->iparams[0];
    const size_t row_size = (size_t)n->iparams[2];
    const int64_t K = w->ne[0], M = w->ne[1], n_as = w->ne[2];
    const int conv = x->type != vdt;
    /* rows routed to each expert, where each expert's run of (slot + n_used *
     * token) starts in `pairs` */
    const gr_mm_scratch L = gr_mm_scratch_layout(n, job->nth);
    int64_t *counts = (int64_t *)(job->wdata + L.index), *starts = counts + n_as;
    int64_t *pairs = (int64_t *)(job->wdata + L.pairs);
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
    char *mem = tiled_type ? job->wdata + L.threads + (size_t)job->ith * L.per_thread : NULL;
    /* K-panel kernel on the routed rows where they are, if the plan made room */
    const int kp = tiled_type && L.kpanel && gr_mm_scratch_has(n, L.threads + (size_t)job->nth * L.per_thread);
    const int64_t nb = K / 256;
    char *krows = kp ? mem + L.krows : NULL;
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
