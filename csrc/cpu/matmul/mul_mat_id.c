/* MUL_MAT_ID: the experts of a mixture-of-experts layer, each routed row
 * multiplied by the weights its ids select.
 *
 * Same conventions as every ops file: the planner (ggmlrpc/compute/) checked types
 * and shapes, a kernel only walks each tensor inside its own ne/nb, rows are split
 * between threads with gr_range(), and arithmetic follows ggml's CPU backend
 * (ops.cpp, vec.h): the same rounding points and the same fused multiply-adds
 * where ggml's x86 build fuses.
 */
#include <stdint.h>
#include <string.h>

#include "cpu/job.h"
#include "cpu/kernels.h"
#include "cpu/matmul/matmul.h"
#include "cpu/simd.h"      /* gr_prefetch_block_ahead */
#include "common/rpc.h"   /* ggmlrpc_row_size */

#define MMID_CH GR_MM_CHUNK_ROWS   /* weight rows per chunk of an expert's run */

/* One node's phase 1: the experts' routing (counts, starts, pairs: which
 * (slot + n_used * token) rows each expert takes, grouped by expert) and where
 * the activations are. */
typedef struct {
    const gr_tensor *w, *x, *ids, *d;
    int64_t K, M, n_as, n_used, T, ne11;
    size_t row_size;
    int conv;                      /* src1 was converted into scratch */
    const int64_t *counts, *starts, *pairs;
    ggmlrpc_vec_dot_fn qdot;
} mmid_ctx;

/* the activation row and the output row of routed pair pr */
static inline const char *mmid_act(const gr_job *job, const mmid_ctx *c, int64_t pr) {
    return c->conv ? job->wdata + (size_t)(pr % c->n_used % c->ne11 + pr / c->n_used * c->ne11) * c->row_size
                   : c->x->data + pr % c->n_used % c->ne11 * c->x->nb[1] + pr / c->n_used * c->x->nb[2];
}

static inline float *mmid_out(const mmid_ctx *c, int64_t pr) {
    return (float *)(c->d->data + pr % c->n_used * c->d->nb[1] + pr / c->n_used * c->d->nb[2]);
}

/* ---- phase 0 --------------------------------------------------------------- */

/* thread 0: the routed rows grouped by expert (ids out of range are skipped here
 * and reported in phase 1) */
static void mmid_route(const gr_tensor *ids, int64_t n_as, int64_t *counts, int64_t *starts, int64_t *pairs) {
    const int64_t n_used = ids->ne[0], T = ids->ne[1];
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

/* ---- phase 1 strategies, per chunk [ib, ie) of expert a's weight rows -------- */

/* ggml's vec_dot order: one product per output, by the type's small-batch (4xn) or
 * four-row (rows4) kernel where it has one */
static void mmid_vec_dot(const gr_job *job, const mmid_ctx *c, int64_t a, int64_t ib, int64_t ie) {
    const int64_t k_end = c->starts[a] + c->counts[a];
    const char *wa = c->w->data + a * c->w->nb[2];
    int64_t i01 = ib;
    /* two routed rows or more (or one, where the type has no rows4 kernel): four weight
     * rows against up to GGMLRPC_4XN_COLS of them at a time (a short last quad repeats
     * its first row, outputs not written) */
    const uint32_t wt = (uint32_t)c->w->type;
    const ggmlrpc_vec_dot_4xn_fn tile =
        c->counts[a] >= 2 || !ggmlrpc_get_vec_dot_rows4(wt) ? ggmlrpc_get_vec_dot_4xn(wt) : NULL;
    for (; tile && i01 < ie; i01 += 4) {
        const int rows = ie - i01 < 4 ? (int)(ie - i01) : 4;
        const void *wr[4];
        for (int r = 0; r < 4; r++) wr[r] = wa + (i01 + (r < rows ? r : 0)) * c->w->nb[1];
        for (int64_t k = c->starts[a]; k < k_end; k += GGMLRPC_4XN_COLS) {
            const int nc = k_end - k < GGMLRPC_4XN_COLS ? (int)(k_end - k) : GGMLRPC_4XN_COLS;
            const void *act[GGMLRPC_4XN_COLS];
            for (int j = 0; j < nc; j++) act[j] = mmid_act(job, c, c->pairs[k + j]);
            float v[4 * GGMLRPC_4XN_COLS];
            tile(c->K, v, wr, act, nc);
            for (int j = 0; j < nc; j++)
                for (int r = 0; r < rows; r++) mmid_out(c, c->pairs[k + j])[i01 + r] = v[4 * j + r];
        }
    }
    /* an expert with fewer than four routed rows (decode): four of its weight rows at
     * a time against each, the weights fetched ahead of use */
    const ggmlrpc_vec_dot_rows4_fn qrows4 = c->counts[a] < 4 ? ggmlrpc_get_vec_dot_rows4((uint32_t)c->w->type) : NULL;
    for (; qrows4 && i01 + 4 <= ie; i01 += 4) {
        const void *wr[4] = {wa + i01 * c->w->nb[1], wa + (i01 + 1) * c->w->nb[1], wa + (i01 + 2) * c->w->nb[1],
                             wa + (i01 + 3) * c->w->nb[1]};
        for (int64_t k = c->starts[a]; k < k_end; k++)
            qrows4(c->K, mmid_out(c, c->pairs[k]) + i01, wr, mmid_act(job, c, c->pairs[k]));
    }
    const size_t wrow = ggmlrpc_row_size((uint32_t)c->w->type, c->K);
    for (; i01 < ie; i01++) {
        const char *wr = wa + i01 * c->w->nb[1];
        gr_prefetch_block_ahead(wr, wrow);
        for (int64_t k = c->starts[a]; k < k_end; k++) c->qdot(c->K, &mmid_out(c, c->pairs[k])[i01], wr, mmid_act(job, c, c->pairs[k]));
    }
}

/* K-quants in ggml's tiled order with the K-panel kernel on the routed rows where
 * they are: the chunk decoded into krows (with its scales kd, kdm), eight routed
 * rows at a time (a short last group repeats its first row) */
static void mmid_kpanel(const gr_job *job, const mmid_ctx *c, int64_t a, int64_t ib, int64_t ie, char *krows) {
    const int64_t nb = c->K / 256, k_end = c->starts[a] + c->counts[a];
    float *kd = (float *)(krows + (size_t)MMID_CH * (size_t)nb * GR_KROW_BYTES), *kdm = kd + MMID_CH * nb;
    for (int64_t i01 = ib; i01 < ie; i01++)
        gr_kpanel_decode(c->w->type, nb, c->w->data + a * c->w->nb[2] + i01 * c->w->nb[1],
                         krows + (size_t)(i01 - ib) * nb * GR_KROW_BYTES, kd + (i01 - ib) * nb, kdm + (i01 - ib) * nb);
    for (int64_t k0 = c->starts[a]; k0 < k_end; k0 += 8) {
        const int64_t cnt = k_end - k0 < 8 ? k_end - k0 : 8;
        const void *act[8];
        float *outs[8];
        for (int j = 0; j < 8; j++) {
            const int64_t pr = c->pairs[k0 + (j < cnt ? j : 0)];
            act[j] = mmid_act(job, c, pr);
            outs[j] = mmid_out(c, pr);
        }
        for (int64_t i01 = ib; i01 < ie; i01++) {
            float v[8];
            gr_kpanel_dot_rows(c->w->type, nb, krows + (size_t)(i01 - ib) * nb * GR_KROW_BYTES, kd + (i01 - ib) * nb,
                               kdm + (i01 - ib) * nb, act, v);
            for (int64_t j = 0; j < cnt; j++) outs[j][i01] = v[j];
        }
    }
}

/* K-quants in ggml's tiled order: each weight row decoded once into mem, then
 * dotted with every routed row */
static void mmid_tiled(const gr_job *job, const mmid_ctx *c, int64_t a, int64_t ib, int64_t ie, void *mem) {
    for (int64_t i01 = ib; i01 < ie; i01++) {
        const gr_tiled_row row = gr_tiled_decode(c->w->type, c->K, c->w->data + a * c->w->nb[2] + i01 * c->w->nb[1], mem);
        for (int64_t k = c->starts[a]; k < c->starts[a] + c->counts[a]; k++)
            mmid_out(c, c->pairs[k])[i01] = gr_tiled_dot_row(&row, mmid_act(job, c, c->pairs[k]));
    }
}

/* quantized experts, expert by expert: chunks of an expert's weight rows handed
 * out one at a time, each row (decoded once, for K-quant experts with 8+ routed
 * rows) dotted with every routed row while it is in cache */
static void mmid_quant_experts(gr_job *job, const mmid_ctx *c, const gr_mm_scratch *L, int tiled_type) {
    char *mem = tiled_type ? job->wdata + L->threads + (size_t)job->ith * L->per_thread : NULL;
    /* K-panel kernel on the routed rows where they are, if the plan made room */
    const int kp = tiled_type && L->kpanel && gr_mm_scratch_has(job->node, L->threads + (size_t)job->nth * L->per_thread);
    const int64_t nch = (c->M + MMID_CH - 1) / MMID_CH;
    int64_t total = 0;
    for (int64_t a = 0; a < c->n_as; a++) total += c->counts[a] > 0 ? nch : 0;
    int64_t a = 0, before = 0;   /* items of the experts before a */
    for (int64_t it = gr_chunk_first(job); it < total; it = gr_chunk_next(job)) {
        while (c->counts[a] == 0 || it >= before + nch) {
            if (c->counts[a] > 0) before += nch;
            a++;
        }
        const int64_t ib = (it - before) * MMID_CH, ie = ib + MMID_CH < c->M ? ib + MMID_CH : c->M;
        if (!(tiled_type && c->counts[a] >= 8)) mmid_vec_dot(job, c, a, ib, ie);
        else if (kp) mmid_kpanel(job, c, a, ib, ie, mem + L->krows);
        else mmid_tiled(job, c, a, ib, ie, mem);
    }
}

/* every (slot, token): the expert id checked; F32/F16 experts (float) computed
 * here, one vec_dot per output */
static void mmid_check_and_float(gr_job *job, const mmid_ctx *c, int float_experts) {
    int64_t r0, r1;
    gr_range(c->n_used * c->T, job->ith, job->nth, &r0, &r1);
    for (int64_t p = r0; p < r1; p++) {
        const int64_t e = p % c->n_used, t = p / c->n_used;
        int32_t a;
        memcpy(&a, c->ids->data + e * c->ids->nb[0] + t * c->ids->nb[1], 4);
        if (a < 0 || a >= c->n_as) {
            gr_fail(job, GR_EXEC_EINDEX, "MUL_MAT_ID expert %d out of range [0, %lld)", a, (long long)c->n_as);
            return;
        }
        if (!float_experts) continue;   /* done by mmid_quant_experts */
        const int64_t i11 = e % c->ne11;
        const char *act = c->conv ? job->wdata + (size_t)(i11 + t * c->ne11) * c->row_size
                                  : c->x->data + i11 * c->x->nb[1] + t * c->x->nb[2];
        const char *wa = c->w->data + a * c->w->nb[2];
        float *out = (float *)(c->d->data + e * c->d->nb[1] + t * c->d->nb[2]);
        for (int64_t i01 = 0; i01 < c->M; i01++) {
            const char *wr = wa + i01 * c->w->nb[1];
            out[i01] = c->w->type == GR_TYPE_F32 ? gr_vec.dot_f32(c->K, (const float *)wr, (const float *)act)
                                                 : gr_vec.dot_f16(c->K, (const uint16_t *)wr, (const uint16_t *)act);
        }
    }
}

/* ---- the kernel --------------------------------------------------------------- */

/* dst[:, e, t] = src0[:, :, ids[e, t]] @ src1[:, e % ne11, t]; phase 0 converts src1
 * to the vec_dot type (iparams as MUL_MAT) and groups the routed rows by expert.
 * ggml's vec_dot order throughout, but for K-quant experts with 8 routed rows or
 * more: ggml's tiled order. Quantized experts go one by one, each weight row
 * dotted with all the expert's rows while it is in cache.
 *   src0: (K, M, n_as); src1: (K, ne11, T); ids: (n_used, T) I32; dst: (M, n_used, T) */
void gr_k_mul_mat_id(gr_job *job, int phase) {
    const gr_node *n = job->node;
    const gr_tensor *w = &n->src[0], *x = &n->src[1];
    const int32_t vdt = (int32_t)n->iparams[0];
    const gr_mm_scratch L = gr_mm_scratch_layout(n, job->nth);
    int64_t *counts = (int64_t *)(job->wdata + L.index), *starts = counts + w->ne[2];
    int64_t *pairs = (int64_t *)(job->wdata + L.pairs);
    if (phase == 0) {
        if (job->ith == 0) {
            gr_chunk_set(job, job->nth);
            mmid_route(&n->src[2], w->ne[2], counts, starts, pairs);
        }
        if (x->type == vdt) return;
        int64_t r0, r1;
        gr_range(gr_nrows(x), job->ith, job->nth, &r0, &r1);
        ggmlrpc_from_float_fn from_float = NULL;
        if (vdt != GR_TYPE_F32 && vdt != GR_TYPE_F16) from_float = ggmlrpc_get_from_float((uint32_t)vdt);
        for (int64_t ir = r0; ir < r1; ir++)
            gr_mm_convert_row(vdt, x, gr_row(x, ir), job->wdata + (size_t)ir * (size_t)n->iparams[2], w->ne[0], from_float);
        return;
    }
    const mmid_ctx c = {
        .w = w, .x = x, .ids = &n->src[2], .d = &n->dst,
        .K = w->ne[0], .M = w->ne[1], .n_as = w->ne[2], .n_used = n->src[2].ne[0], .T = n->src[2].ne[1], .ne11 = x->ne[1],
        .row_size = (size_t)n->iparams[2], .conv = x->type != vdt,
        .counts = counts, .starts = starts, .pairs = pairs,
        .qdot = w->type != GR_TYPE_F32 && w->type != GR_TYPE_F16 ? ggmlrpc_get_vec_dot((uint32_t)w->type) : NULL,
    };
    const int quant = w->type != GR_TYPE_F32 && w->type != GR_TYPE_F16;
    if (quant) mmid_quant_experts(job, &c, &L, n->iparams[1] != 0);
    mmid_check_and_float(job, &c, !quant);
}
