/* MUL_MAT and FLASH_ATTN_EXT.
 *
 * MUL_MAT follows ggml's CPU backend: activations (src1) are converted to the
 * weight type's vec_dot type first (F32 -> F16 for F16 weights, -> Q8_0 for
 * Q4_0/Q8_0 weights...), then every output is one dot product of a weight row
 * with an activation row. F32/F16 dot products use one of two summation orders,
 * picked by the compiler exactly where ggml picks them: its prompt-time GEMM
 * (one 8-lane accumulator) or its vec_dot (four 8-lane accumulators). Quantized
 * products sum as vec_dot does, except IQ4_NL from 2 columns on (tinyBLAS's one
 * accumulator) and the K-quants from 8 columns on (ggml's tiled order).
 *
 * Speed comes from doing each output's steps for several columns at once:
 * runs of eight columns are also written as panels (ggmlrpc_panel_* for the
 * Q4/Q5/Q8 and IQ4_NL formats, gr_kpanel_* for the K-quants), so that a weight
 * row is unpacked once for the eight; every output stays bit-equal to its
 * one-column kernel. Weight rows go to threads in chunks handed out one at a
 * time.
 *
 * FLASH_ATTN_EXT has ggml's two numerics: per query row with Q rounded to the
 * K type's vec_dot type and an F16 accumulator for F16 V (the "one chunk"
 * path), and, for 64 query rows or more with F32/F16 K and V, tiles of 64x64
 * computed in F32 (the "tiled" path). Rows are independent in both, so the
 * split between threads does not change any result.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "exec_impl.h"
#include "rpc.h"   /* ggmlrpc_blck_size */

/* ---- MUL_MAT --------------------------------------------------------------- */

/* node iparams: [0] vec_dot type, [1] summation order (MM_VEC_DOT, MM_GEMM,
 * MM_TILED, MM_Q0_GEMM: IQ4_NL weights, 2+ columns, tinyBLAS's one accumulator
 * per output, ggmlrpc_get_vec_dot_gemm), [2] bytes of one converted src1 row */
enum { MM_VEC_DOT = 0, MM_GEMM = 1, MM_TILED = 2, MM_Q0_GEMM = 3 };

/* converted src1 rows, then (MUL_MAT_ID) one row count per expert */
/* Q4_0 weights, activations converted here to Q8_0 (so never holding -128
 * unless the input is not finite), one dot product per output: the activation
 * rows' per-block lane sums follow them in the scratch (ggmlrpc_q4_0_act_sums) */
static int mm_q4_sums(const gr_node *n) {
    return n->kernel == GR_K_MUL_MAT && n->src[0].type == GR_TYPE_Q4_0 && n->iparams[0] == GR_TYPE_Q8_0 &&
           n->src[1].type != GR_TYPE_Q8_0 && n->iparams[1] == MM_VEC_DOT;
}

static inline size_t mm_conv_bytes(const gr_node *n) {
    const gr_tensor *s1 = &n->src[1];
    const size_t conv = s1->type == n->iparams[0] ? 0 : (size_t)n->iparams[2] * (size_t)gr_nrows(s1);
    return (conv + 63) & ~(size_t)63;
}

static inline size_t mm_sums_bytes(const gr_node *n) {
    return mm_q4_sums(n) ? (size_t)gr_nrows(&n->src[1]) * (size_t)(n->src[0].ne[0] / 32) * 32 : 0;
}

/* Prompt-sized Q8_0/Q4_0 products: every run of eight columns of one src1 batch
 * is also written as a panel (ggmlrpc_panel_*), after the converted rows and
 * the sums; bytes of one panel block, or 0 where the node takes no panels */
static size_t mm_panel_kind(const gr_node *n) {
    const int32_t vdt = (int32_t)n->iparams[0];
    if (n->kernel != GR_K_MUL_MAT || (vdt != GR_TYPE_Q8_0 && vdt != GR_TYPE_Q8_1) || n->src[1].type == vdt ||
        n->src[1].ne[1] < 8)
        return 0;
    /* panels sum in one accumulator: vec_dot's order for Q4_0/Q8_0, only the
     * GEMM order for IQ4_NL */
    if (n->iparams[1] != (n->src[0].type == GR_TYPE_IQ4_NL ? MM_Q0_GEMM : MM_VEC_DOT)) return 0;
    return ggmlrpc_panel_bytes((uint32_t)n->src[0].type);
}

static inline size_t mm_panel_offset(const gr_node *n) {
    return (mm_conv_bytes(n) + mm_sums_bytes(n) + 63) & ~(size_t)63;
}

/* runs of eight columns of one src1 batch: the panels a node writes */
static inline size_t mm_groups(const gr_node *n) {
    const gr_tensor *s1 = &n->src[1];
    return (size_t)(s1->ne[1] / 8) * (size_t)(s1->ne[2] * s1->ne[3]);
}

static inline size_t mm_panel_end(const gr_node *n, size_t pb) {
    return mm_panel_offset(n) + mm_groups(n) * (size_t)(n->src[0].ne[0] / 32) * pb;
}

/* at run time: panels only where the plan made room for them (the SIMD level
 * can be switched between planning and running) */
static size_t mm_panel(const gr_node *n) {
    const size_t pb = mm_panel_kind(n);
    return pb && n->wsize >= mm_panel_end(n, pb) ? pb : 0;
}

/* K-quant weights (ggml's tiled order), 8+ columns converted here to Q8_K: the
 * same panels (gr_kpanel_*) after the converted rows, then per thread a chunk of
 * KP_CH weight rows in kernel layout */
#define KP_CH 16
static int mm_kpanel_kind(const gr_node *n) {
    return n->kernel == GR_K_MUL_MAT && n->iparams[1] == MM_TILED && n->iparams[0] == GR_TYPE_Q8_K &&
           n->src[1].type != GR_TYPE_Q8_K && n->src[1].ne[1] >= 8 && gr_kpanel_available(n->src[0].type);
}

static inline size_t mm_kpanel_threads(const gr_node *n) {   /* offset of the per-thread part */
    const size_t panels = mm_groups(n) * (size_t)(n->src[0].ne[0] / 256) * GR_KPANEL_BYTES;
    return (mm_conv_bytes(n) + panels + 63) & ~(size_t)63;
}

static inline size_t mm_kpanel_per_thread(const gr_node *n) {
    const int64_t nb = n->src[0].ne[0] / 256;
    return ((size_t)KP_CH * (size_t)nb * (GR_KROW_BYTES + 8) + 63) & ~(size_t)63;
}

static int mm_kpanel(const gr_node *n, int nth) {
    return mm_kpanel_kind(n) && n->wsize >= mm_kpanel_threads(n) + (size_t)nth * mm_kpanel_per_thread(n);
}

size_t gr_wsize_mul_mat(const gr_node *n, int nth) {
    const gr_tensor *s1 = &n->src[1];
    if (mm_kpanel_kind(n)) return mm_kpanel_threads(n) + (size_t)nth * mm_kpanel_per_thread(n) + 64;
    size_t conv = mm_conv_bytes(n);
    conv += mm_sums_bytes(n);
    if (mm_panel_kind(n)) conv = mm_panel_end(n, mm_panel_kind(n));
    if (n->kernel == GR_K_MUL_MAT_ID) {
        conv += gr_mmid_index_bytes(n);
        if (n->iparams[1] == MM_TILED) conv = ((conv + 63) & ~(size_t)63) + (size_t)nth * gr_mmid_thread_bytes(n);
    } else if (n->iparams[1] == MM_TILED) {
        conv += (size_t)nth * gr_tiled_row_bytes(n->src[0].ne[0]);
    }
    return conv + 64;
}

/* this thread's decoded-row scratch, after `used` bytes of shared scratch */
void *gr_tiled_scratch(const gr_job *job, size_t used) {
    used = (used + 63) & ~(size_t)63;
    return job->wdata + used + (size_t)job->ith * gr_tiled_row_bytes(job->node->src[0].ne[0]);
}

static void mm_rows(gr_job *job, int64_t a0, int64_t a1, int64_t b0, int64_t b1, ggmlrpc_vec_dot_fn qdot,
                    float (*dot32)(int64_t, const float *, const float *),
                    float (*dot16)(int64_t, const uint16_t *, const uint16_t *), int conv);

/* Convert src1 rows into wdata (phase 0), then dot products (phase 1).
 *   src0: (K, M, ne02, ne03) weights, rows contiguous
 *   src1: (K, N, ne12, ne13), ne12 % ne02 == 0, ne13 % ne03 == 0
 *   dst:  (M, N, ne12, ne13) F32 */
void gr_k_mul_mat(gr_job *job, int phase) {
    const gr_node *n = job->node;
    const gr_tensor *s0 = &n->src[0], *s1 = &n->src[1], *d = &n->dst;
    const int32_t vdt = (int32_t)n->iparams[0];
    const int order = (int)n->iparams[1];
    const size_t row_size = (size_t)n->iparams[2];
    const int64_t K = s0->ne[0], M = s0->ne[1];
    const int64_t N = s1->ne[1], ne12 = s1->ne[2], ne13 = s1->ne[3];
    const int conv = s1->type != vdt;

    if (phase == 0) {
        if (job->ith == 0) gr_chunk_set(job, job->nth);   /* chunks 0..nth-1 go to threads 0..nth-1 */
        if (!conv) return;
        int32_t *sums = mm_q4_sums(n) && ggmlrpc_get_vec_dot_q4_0_sums()
                            ? (int32_t *)(job->wdata + mm_conv_bytes(n)) : NULL;
        int64_t r0, r1;
        gr_range(gr_nrows(s1), job->ith, job->nth, &r0, &r1);
        ggmlrpc_from_float_fn from_float = NULL;
        if (vdt != GR_TYPE_F32 && vdt != GR_TYPE_F16) from_float = ggmlrpc_get_from_float((uint32_t)vdt);
        if (from_float && gr_nrows(s1) < job->nth) {
            /* fewer rows than threads (decode): every thread quantizes a run of
             * whole blocks of each row; blocks are quantized independently */
            const int64_t bs = ggmlrpc_blck_size((uint32_t)vdt), nb = K / bs;
            const size_t bb = row_size / (size_t)nb;
            int64_t k0, k1;
            gr_range(nb, job->ith, job->nth, &k0, &k1);
            for (int64_t ir = 0; ir < gr_nrows(s1) && k0 < k1; ir++) {
                char *q = job->wdata + (size_t)ir * row_size + (size_t)k0 * bb;
                from_float((const float *)gr_row(s1, ir) + k0 * bs, q, (k1 - k0) * bs);
                if (sums) ggmlrpc_q4_0_act_sums(q, sums + (ir * nb + k0) * 8, k1 - k0);
            }
            return;
        }
        const size_t pb = mm_panel(n);
        const int kp = mm_kpanel(n, job->nth);
        for (int64_t ir = r0; ir < r1; ir++) {
            const char *src = gr_row(s1, ir);
            char *dst = job->wdata + (size_t)ir * row_size;
            if (vdt == GR_TYPE_F32) gr_load_f32(s1->type, src, s1->nb[0], (float *)dst, K);
            else if (vdt == GR_TYPE_F16) gr_vec.fp32_to_fp16(K, (const float *)src, (uint16_t *)dst);
            else from_float((const float *)src, dst, K);
            if (sums) ggmlrpc_q4_0_act_sums(dst, sums + ir * (K / 32) * 8, K / 32);
            const int64_t i11 = ir % N, G = N / 8;
            if ((pb || kp) && i11 < G * 8) {   /* lane i11 % 8 of its batch's panel i11 / 8 */
                const size_t group = (size_t)((ir / N) * G + i11 / 8);
                if (pb)
                    ggmlrpc_panel_put((uint32_t)s0->type, dst, K / 32,
                                      job->wdata + mm_panel_offset(n) + group * (size_t)(K / 32) * pb, (int)(i11 % 8));
                else
                    gr_kpanel_put(dst, K / 256, job->wdata + mm_conv_bytes(n) + group * (size_t)(K / 256) * GR_KPANEL_BYTES,
                                  (int)(i11 % 8));
            }
        }
        return;
    }

    const int64_t r2 = ne12 / s0->ne[2], r3 = ne13 / s0->ne[3];
    const int64_t nr0 = M, nr1 = N * ne12 * ne13;
    /* split the larger side between threads */
    int64_t a0 = 0, a1 = nr0, b0 = 0, b1 = nr1;
    if (nr0 >= nr1) gr_range(nr0, job->ith, job->nth, &a0, &a1);
    else gr_range(nr1, job->ith, job->nth, &b0, &b1);

    float (*dot32)(int64_t, const float *, const float *) = order == MM_GEMM ? gr_vec.dot_f32_gemm : gr_vec.dot_f32;
    float (*dot16)(int64_t, const uint16_t *, const uint16_t *) = order == MM_GEMM ? gr_vec.dot_f16_gemm : gr_vec.dot_f16;
    ggmlrpc_vec_dot_fn qdot = NULL;
    if (s0->type != GR_TYPE_F32 && s0->type != GR_TYPE_F16)
        qdot = order == MM_Q0_GEMM ? ggmlrpc_get_vec_dot_gemm((uint32_t)s0->type) : ggmlrpc_get_vec_dot((uint32_t)s0->type);
    if (s0->type == GR_TYPE_BF16 && gr_vec.dot_bf16)   /* an AVX512-BF16 build's products */
        qdot = order == MM_GEMM ? gr_vec.dot_bf16_gemm : gr_vec.dot_bf16;

    if (order == MM_TILED && mm_kpanel(n, job->nth)) {
        /* chunks of KP_CH weight rows handed out one at a time, decoded once per
         * src1 batch, each row against every panel of eight columns and the
         * columns left over */
        const int64_t nb = K / 256, G = N / 8;
        const char *panels = job->wdata + mm_conv_bytes(n);
        char *krows = job->wdata + mm_kpanel_threads(n) + (size_t)job->ith * mm_kpanel_per_thread(n);
        float *dd = (float *)(krows + (size_t)KP_CH * (size_t)nb * GR_KROW_BYTES), *dm = dd + KP_CH * nb;
        const int64_t nch = (nr0 + KP_CH - 1) / KP_CH;
        for (int64_t ch = job->ith; ch < nch; ch = gr_chunk_next(job)) {
            const int64_t ib = ch * KP_CH, ie = ib + KP_CH < nr0 ? ib + KP_CH : nr0;
            for (int64_t sl = 0; sl < ne12 * ne13; sl++) {
                const int64_t i12 = sl % ne12, i13 = sl / ne12;
                const char *w = s0->data + (i12 / r2) * s0->nb[2] + (i13 / r3) * s0->nb[3];
                for (int64_t i01 = ib; i01 < ie; i01++)
                    gr_kpanel_decode(s0->type, nb, w + i01 * s0->nb[1], krows + (size_t)(i01 - ib) * nb * GR_KROW_BYTES,
                                     dd + (i01 - ib) * nb, dm + (i01 - ib) * nb);
                for (int64_t g = 0; g < G; g++) {
                    const char *pan = panels + (size_t)(sl * G + g) * (size_t)nb * GR_KPANEL_BYTES;
                    float *out[8];
                    for (int j = 0; j < 8; j++)
                        out[j] = (float *)(d->data + (8 * g + j) * d->nb[1] + i12 * d->nb[2] + i13 * d->nb[3]);
                    for (int64_t i01 = ib; i01 < ie; i01++) {
                        float v[8];
                        gr_kpanel_dot(s0->type, nb, krows + (size_t)(i01 - ib) * nb * GR_KROW_BYTES, dd + (i01 - ib) * nb,
                                      dm + (i01 - ib) * nb, pan, v);
                        for (int j = 0; j < 8; j++) out[j][i01] = v[j];
                    }
                }
                if (G * 8 < N) {   /* the columns left over, read in place, the last repeated */
                    const void *act[8];
                    float *out[8];
                    for (int j = 0; j < 8; j++) {
                        const int64_t i11 = G * 8 + j < N ? G * 8 + j : N - 1;
                        act[j] = job->wdata + (size_t)(sl * N + i11) * row_size;
                        out[j] = (float *)(d->data + i11 * d->nb[1] + i12 * d->nb[2] + i13 * d->nb[3]);
                    }
                    for (int64_t i01 = ib; i01 < ie; i01++) {
                        float v[8];
                        gr_kpanel_dot_rows(s0->type, nb, krows + (size_t)(i01 - ib) * nb * GR_KROW_BYTES, dd + (i01 - ib) * nb,
                                           dm + (i01 - ib) * nb, act, v);
                        for (int64_t j = 0; j < N - G * 8; j++) out[j][i01] = v[j];
                    }
                }
            }
        }
        return;
    }

    if (order == MM_TILED) {
        /* decode each weight row once per src0 batch, then dot it with every column */
        void *mem = gr_tiled_scratch(job, conv ? row_size * (size_t)gr_nrows(s1) : 0);
        for (int64_t i01 = a0; i01 < a1; i01++) {
            int64_t cur = -1;
            gr_tiled_row row;
            for (int64_t c = b0; c < b1; c++) {
                const int64_t i11 = c % N, i12 = (c / N) % ne12, i13 = c / (N * ne12);
                const int64_t i02 = i12 / r2, i03 = i13 / r3, key = i03 * s0->ne[2] + i02;
                if (key != cur) {
                    row = gr_tiled_decode(s0->type, K, s0->data + i01 * s0->nb[1] + i02 * s0->nb[2] + i03 * s0->nb[3], mem);
                    cur = key;
                }
                const char *act = conv ? job->wdata + (size_t)c * row_size
                                       : s1->data + i11 * s1->nb[1] + i12 * s1->nb[2] + i13 * s1->nb[3];
                float *out = (float *)(d->data + i11 * d->nb[1] + i12 * d->nb[2] + i13 * d->nb[3]);
                out[i01] = gr_tiled_dot_row(&row, act);
            }
        }
        return;
    }

    if (order == MM_GEMM && (s0->type == GR_TYPE_F32 || s0->type == GR_TYPE_F16)) {
        /* tiles of 4 weight rows x TC activation rows sharing the same src0 batch (a
         * short tile repeats its first column) */
        const int f16 = s0->type == GR_TYPE_F16;
        const int TC = gr_vec.tile_cols;
        const int64_t RB = 64;   /* weight rows kept in cache while every column passes */
        for (int64_t rb = a0; rb < a1; rb += RB) {
        const int64_t re = rb + RB < a1 ? rb + RB : a1;
        for (int64_t c = b0; c < b1;) {
            const int64_t i12 = (c / N) % ne12, i13 = c / (N * ne12);
            const int64_t batch_end = (c / N + 1) * N;     /* the tile's columns in one batch */
            int64_t ce = c + TC < b1 ? c + TC : b1;
            if (ce > batch_end) ce = batch_end;
            const char *wb = s0->data + (i12 / r2) * s0->nb[2] + (i13 / r3) * s0->nb[3];
            const char *act[GR_TILE_COLS_MAX];
            float *out[GR_TILE_COLS_MAX];
            for (int64_t j = 0; j < TC; j++) {
                const int64_t cc = c + j < ce ? c + j : c, i11 = cc % N;
                act[j] = conv ? job->wdata + (size_t)cc * row_size
                              : s1->data + i11 * s1->nb[1] + i12 * s1->nb[2] + i13 * s1->nb[3];
                out[j] = (float *)(d->data + i11 * d->nb[1] + i12 * d->nb[2] + i13 * d->nb[3]);
            }
            for (int64_t i01 = rb; i01 < re; i01 += 4) {
                const char *w[4];
                for (int i = 0; i < 4; i++) w[i] = wb + (i01 + i < re ? i01 + i : i01) * s0->nb[1];
                float t[4 * GR_TILE_COLS_MAX];
                if (f16) gr_vec.tile_f16_gemm(K, (const uint16_t *const *)w, (const uint16_t *const *)act, t);
                else gr_vec.tile_f32_gemm(K, (const float *const *)w, (const float *const *)act, t);
                for (int64_t j = 0; j < ce - c; j++)
                    for (int i = 0; i < 4 && i01 + i < re; i++) out[j][i01 + i] = t[j * 4 + i];
            }
            c = ce;
        }
        }
        return;
    }

    const size_t pb = mm_panel(n);
    if (pb) {
        /* prompts: chunks of 16 weight rows handed out one at a time, each
         * against every panel of eight columns, the columns left over one by one */
        const int64_t nb = K / 32, G = N / 8, CH = 16;
        const ggmlrpc_panel_dot_fn pdot = ggmlrpc_get_panel_dot((uint32_t)s0->type);
        const char *panels = job->wdata + mm_panel_offset(n);
        const int64_t nch = (nr0 + CH - 1) / CH;
        for (int64_t ch = job->ith; ch < nch; ch = gr_chunk_next(job)) {
            const int64_t ib = ch * CH, ie = ib + CH < nr0 ? ib + CH : nr0;
            for (int64_t sl = 0; sl < ne12 * ne13; sl++) {
                const int64_t i12 = sl % ne12, i13 = sl / ne12;
                const char *w = s0->data + (i12 / r2) * s0->nb[2] + (i13 / r3) * s0->nb[3];
                for (int64_t g = 0; g < G; g++) {
                    const char *pan = panels + (size_t)(sl * G + g) * (size_t)nb * pb;
                    float *out[8];
                    for (int j = 0; j < 8; j++)
                        out[j] = (float *)(d->data + (8 * g + j) * d->nb[1] + i12 * d->nb[2] + i13 * d->nb[3]);
                    for (int64_t i01 = ib; i01 < ie; i01++) {
                        float v[8];
                        pdot(K, v, w + i01 * s0->nb[1], pan);
                        for (int j = 0; j < 8; j++) out[j][i01] = v[j];
                    }
                }
                if (G * 8 < N) mm_rows(job, ib, ie, sl * N + G * 8, (sl + 1) * N, qdot, dot32, dot16, conv);
            }
        }
        return;
    }

    /* few activation columns (decode): weight rows in chunks of 64 (16 with 2+
     * columns) handed out one at a time, so that a thread slowed down (by
     * another process on its core) leaves its share to the others instead of
     * holding every thread at the barrier; as ggml's mul_mat chunks */
    const int64_t CH = nr1 == 1 ? 64 : 16;
    if (nr1 < 8 && nr0 >= 4 * job->nth * CH) {
        b0 = 0;
        b1 = nr1;
        const int64_t nch = (nr0 + CH - 1) / CH;
        for (int64_t ch = job->ith; ch < nch; ch = gr_chunk_next(job)) {
            a0 = ch * CH;
            a1 = a0 + CH < nr0 ? a0 + CH : nr0;
            mm_rows(job, a0, a1, b0, b1, qdot, dot32, dot16, conv);
        }
        return;
    }
    mm_rows(job, a0, a1, b0, b1, qdot, dot32, dot16, conv);
}

/* outputs [a0, a1) x columns [b0, b1), one dot product each (MM_VEC_DOT) */
static void mm_rows(gr_job *job, int64_t a0, int64_t a1, int64_t b0, int64_t b1, ggmlrpc_vec_dot_fn qdot,
                    float (*dot32)(int64_t, const float *, const float *),
                    float (*dot16)(int64_t, const uint16_t *, const uint16_t *), int conv) {
    const gr_node *n = job->node;
    const gr_tensor *s0 = &n->src[0], *s1 = &n->src[1], *d = &n->dst;
    const size_t row_size = (size_t)n->iparams[2];
    const int64_t K = s0->ne[0];
    const int64_t N = s1->ne[1], ne12 = s1->ne[2];
    const int64_t r2 = ne12 / s0->ne[2], r3 = s1->ne[3] / s0->ne[3];
    const ggmlrpc_vec_dot_sums_fn qdots = mm_q4_sums(n) ? ggmlrpc_get_vec_dot_q4_0_sums() : NULL;
    const int32_t *sums = qdots ? (const int32_t *)(job->wdata + mm_conv_bytes(n)) : NULL;
    /* one weight row against four activation rows of one batch at a time */
    const ggmlrpc_vec_dot_x4_fn qdot4 = conv && b1 - b0 >= 4 ? ggmlrpc_get_vec_dot_x4((uint32_t)s0->type) : NULL;
    const int64_t BLK = 16;
    for (int64_t ib = a0; ib < a1; ib += BLK) {
        const int64_t ie = ib + BLK < a1 ? ib + BLK : a1;
        int64_t c = b0;
        for (; qdot4 && c + 4 <= b1; c += 4) {
            if (c / N != (c + 3) / N) break;   /* a batch boundary: the rest one by one */
            const int64_t i11 = c % N, i12 = (c / N) % ne12, i13 = c / (N * ne12);
            const void *act[4];
            float *out[4];
            for (int j = 0; j < 4; j++) {
                act[j] = job->wdata + (size_t)(c + j) * row_size;
                out[j] = (float *)(d->data + (i11 + j) * d->nb[1] + i12 * d->nb[2] + i13 * d->nb[3]);
            }
            const char *w = s0->data + (i12 / r2) * s0->nb[2] + (i13 / r3) * s0->nb[3];
            for (int64_t i01 = ib; i01 < ie; i01++) {
                float v[4];
                qdot4(K, v, w + i01 * s0->nb[1], act);
                for (int j = 0; j < 4; j++) out[j][i01] = v[j];
            }
        }
        for (; c < b1; c++) {
            const int64_t i11 = c % N;
            const int64_t i12 = (c / N) % ne12;
            const int64_t i13 = c / (N * ne12);
            const char *act = conv ? job->wdata + (size_t)c * row_size
                                   : s1->data + i11 * s1->nb[1] + i12 * s1->nb[2] + i13 * s1->nb[3];
            const char *w = s0->data + (i12 / r2) * s0->nb[2] + (i13 / r3) * s0->nb[3];
            float *out = (float *)(d->data + i11 * d->nb[1] + i12 * d->nb[2] + i13 * d->nb[3]);
            for (int64_t i01 = ib; i01 < ie; i01++) {
                const char *wr = w + i01 * s0->nb[1];
                float v;
                if (s0->type == GR_TYPE_F32) v = dot32(K, (const float *)wr, (const float *)act);
                else if (s0->type == GR_TYPE_F16) v = dot16(K, (const uint16_t *)wr, (const uint16_t *)act);
                else if (qdots) qdots(K, &v, wr, act, sums + c * (K / 32) * 8);
                else qdot(K, &v, wr, act);
                out[i01] = v;
            }
        }
    }
}

/* ---- FLASH_ATTN_EXT ---------------------------------------------------------- */

#define FA_TQ 64   /* query rows per tile */
#define FA_TK 64   /* keys per tile */

/* node iparams: [0] vec_dot type of K, [1] path: FA_ROWS, FA_TILED or FA_SPLIT */
enum { FA_ROWS = 0, FA_TILED = 1, FA_SPLIT = 2 };

/* per-thread floats of the row path: VKQ (DV), V or the F16 VKQ (DV), Q converted */
static inline int64_t fa_row_floats(int64_t DK, int64_t DV) { return DK + 2 * DV + 16 + DK / 4; }

size_t gr_wsize_flash_attn(const gr_node *n, int nth) {
    const int64_t DK = n->src[1].ne[0], DV = n->src[2].ne[0];
    int64_t per;
    if (n->iparams[1] == FA_TILED) per = FA_TQ * DK + 2 * FA_TQ * FA_TK + FA_TQ * DV + FA_TK * DV + FA_TK * DK + DK;
    else per = fa_row_floats(DK, DV);
    size_t total = (size_t)nth * (size_t)(per + 16) * sizeof(float);
    if (n->iparams[1] == FA_SPLIT)   /* (M, S, VKQ) per head and chunk */
        total += (size_t)n->src[0].ne[2] * (size_t)nth * (size_t)(2 + DV) * sizeof(float);
    return total;
}

typedef struct {
    const gr_tensor *q, *k, *v, *mask, *sinks, *dst;
    int64_t DK, DV, rk2, rk3, rv2, rv3;
    float scale, max_bias, softcap;
} fa_ctx;

static void fa_setup(const gr_node *n, fa_ctx *c) {
    c->q = &n->src[0];
    c->k = &n->src[1];
    c->v = &n->src[2];
    c->mask = n->n_src > 3 && n->src[3].data ? &n->src[3] : NULL;
    c->sinks = n->n_src > 4 && n->src[4].data ? &n->src[4] : NULL;
    c->dst = &n->dst;
    c->DK = c->k->ne[0];
    c->DV = c->v->ne[0];
    c->rk2 = c->q->ne[2] / c->k->ne[2];
    c->rk3 = c->q->ne[3] / c->k->ne[3];
    c->rv2 = c->q->ne[2] / c->v->ne[2];
    c->rv3 = c->q->ne[3] / c->v->ne[3];
    memcpy(&c->scale, &n->op_params[0], 4);
    memcpy(&c->max_bias, &n->op_params[1], 4);
    memcpy(&c->softcap, &n->op_params[2], 4);
    if (c->softcap != 0.0f) c->scale /= c->softcap;
}

static inline float fa_slope(const fa_ctx *c, uint32_t h) {
    if (!(c->max_bias > 0.0f)) return 1.0f;
    const uint32_t n_head = (uint32_t)c->q->ne[2];
    const uint32_t n_head_log2 = 1u << (uint32_t)floor(log2((double)n_head));
    const float m0 = powf(2.0f, -(c->max_bias) / n_head_log2);
    const float m1 = powf(2.0f, -(c->max_bias / 2.0f) / n_head_log2);
    return h < n_head_log2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n_head_log2) + 1));
}

static inline const uint16_t *fa_mask_row(const fa_ctx *c, int64_t iq1, int64_t iq2, int64_t iq3) {
    if (!c->mask) return NULL;
    const gr_tensor *m = c->mask;
    return (const uint16_t *)(m->data + iq1 * m->nb[1] + (iq2 % m->ne[2]) * m->nb[2] + (iq3 % m->ne[3]) * m->nb[3]);
}

/* output row for query (iq1, head iq2, iq3): dst is (DV, heads, queries, ne3) */
static inline float *fa_out(const fa_ctx *c, int64_t iq1, int64_t iq2, int64_t iq3) {
    const gr_tensor *d = c->dst;
    return (float *)(d->data + iq2 * d->nb[1] + iq1 * d->nb[2] + iq3 * d->nb[3]);
}

/* fold head h's sink into the running (M, S, vkq) */
static void fa_sink(const fa_ctx *c, float *vkq, float *M, float *S, int64_t h) {
    float s;
    memcpy(&s, c->sinks->data + h * c->sinks->nb[0], 4);
    float ms = 1.0f, vs = 1.0f;
    if (s > *M) {
        ms = expf(*M - s);
        *M = s;
        for (int64_t d = 0; d < c->DV; d++) vkq[d] *= ms;
    } else {
        vs = expf(s - *M);
    }
    *S = fmaf(*S, ms, vs);
}

static void fa_finish(const fa_ctx *c, float *vkq, float M, float S, int64_t h, float *out) {
    if (c->sinks) fa_sink(c, vkq, &M, &S, h);
    const float S_inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int64_t d = 0; d < c->DV; d++) out[d] = vkq[d] * S_inv;
}

/* One query row ir over keys [ic0, ic1) with an online softmax. With `partial`
 * the unnormalized (M, S, VKQ) go there (the split path), else the output row. */
static void fa_row(const gr_node *n, gr_job *job, const fa_ctx *c, int64_t ir, int64_t ic0, int64_t ic1,
                   float *partial) {
    const int64_t DK = c->DK, DV = c->DV;
    const int64_t neq1 = c->q->ne[1], neq2 = c->q->ne[2];
    const int32_t vdt = (int32_t)n->iparams[0];
    const int32_t kt = c->k->type, vt = c->v->type;
    float *VKQ32 = gr_thread_f32(job, fa_row_floats(DK, DV));
    float *V32 = VKQ32 + DV;
    uint16_t *VKQ16 = (uint16_t *)(VKQ32 + DV);
    void *Q_q = VKQ32 + 2 * DV;
    ggmlrpc_vec_dot_fn qdot = NULL;
    ggmlrpc_from_float_fn q_from = NULL;
    ggmlrpc_to_float_fn v_to_float = NULL;
    if (kt != GR_TYPE_F32 && kt != GR_TYPE_F16) {
        qdot = ggmlrpc_get_vec_dot((uint32_t)kt);
        q_from = ggmlrpc_get_from_float((uint32_t)vdt);
    }
    if (vt != GR_TYPE_F32 && vt != GR_TYPE_F16) v_to_float = ggmlrpc_get_to_float((uint32_t)vt);

    const int64_t iq3 = ir / (neq2 * neq1);
    const int64_t iq2 = (ir - iq3 * neq2 * neq1) / neq1;
    const int64_t iq1 = ir - iq3 * neq2 * neq1 - iq2 * neq1;
    const float slope = fa_slope(c, (uint32_t)iq2);
    float S = 0.0f, M = -INFINITY;
    if (vt == GR_TYPE_F16) memset(VKQ16, 0, (size_t)DV * 2);
    else memset(VKQ32, 0, (size_t)DV * 4);
    const uint16_t *mp = fa_mask_row(c, iq1, iq2, iq3);
    const int64_t ik2 = iq2 / c->rk2, ik3 = iq3 / c->rk3;
    const int64_t iv2 = iq2 / c->rv2, iv3 = iq3 / c->rv3;
    const float *pq = (const float *)(c->q->data + iq1 * c->q->nb[1] + iq2 * c->q->nb[2] + iq3 * c->q->nb[3]);
    if (vdt == GR_TYPE_F32) memcpy(Q_q, pq, (size_t)DK * 4);
    else if (vdt == GR_TYPE_F16) gr_vec.fp32_to_fp16(DK, pq, (uint16_t *)Q_q);
    else q_from(pq, Q_q, DK);

    for (int64_t ic = ic0; ic < ic1; ic++) {
        const float mv = mp ? slope * gr_fp16_to_fp32(mp[ic]) : 0.0f;
        if (mv == -INFINITY) continue;
        const char *kd = c->k->data + ic * c->k->nb[1] + ik2 * c->k->nb[2] + ik3 * c->k->nb[3];
        float s;
        if (kt == GR_TYPE_F16) s = gr_vec.dot_f16(DK, (const uint16_t *)kd, (const uint16_t *)Q_q);
        else if (kt == GR_TYPE_F32) s = gr_vec.dot_f32(DK, (const float *)kd, (const float *)Q_q);
        else qdot(DK, &s, kd, Q_q);
        s = s * c->scale;
        if (c->softcap != 0.0f) s = c->softcap * tanhf(s);
        s += mv;
        const float Mold = M;
        float ms = 1.0f, vs = 1.0f;
        const char *vd = c->v->data + ic * c->v->nb[1] + iv2 * c->v->nb[2] + iv3 * c->v->nb[3];
        if (vt == GR_TYPE_F16) {
            if (s > M) {
                M = s;
                ms = expf(Mold - M);
                gr_vec.scale_f16(DV, VKQ16, ms);
            } else {
                vs = expf(s - M);
            }
            gr_vec.mad_f16(DV, VKQ16, (const uint16_t *)vd, vs);
        } else {
            if (s > M) {
                M = s;
                ms = expf(Mold - M);
                for (int64_t d = 0; d < DV; d++) VKQ32[d] *= ms;
            } else {
                vs = expf(s - M);
            }
            if (vt == GR_TYPE_F32) {
                gr_vec.mad_f32(DV, VKQ32, (const float *)vd, vs);
            } else {
                v_to_float(vd, V32, DV);
                gr_vec.mad_f32(DV, VKQ32, V32, vs);
            }
        }
        S = fmaf(S, ms, vs);
    }
    if (vt == GR_TYPE_F16) gr_vec.fp16_to_fp32(DV, VKQ16, VKQ32);
    if (!partial) {
        fa_finish(c, VKQ32, M, S, iq2, fa_out(c, iq1, iq2, iq3));
        return;
    }
    if (c->sinks && ic0 == 0) fa_sink(c, VKQ32, &M, &S, iq2);
    partial[0] = M;
    partial[1] = S;
    memcpy(partial + 2, VKQ32, (size_t)DV * 4);
}

/* Decode with a long cache (one query, 512 keys or more): the keys are cut into
 * one chunk per thread, every head gets partial (M, S, VKQ) per chunk, and after
 * a barrier the partials are merged per head. The cut follows the thread count,
 * as in ggml, so results match a ggml backend run with as many threads. */
static void fa_split(const gr_node *n, gr_job *job, const fa_ctx *c, int phase) {
    const int64_t DK = c->DK, DV = c->DV, nek1 = c->k->ne[1], heads = c->q->ne[2];
    const int nth = job->nth;
    const int64_t chunk = (nek1 + nth - 1) / nth;
    const int64_t psize = 2 + DV;
    float *partials = (float *)job->wdata + (size_t)nth * (size_t)(fa_row_floats(DK, DV) + 16);
    if (phase == 0) {
        const int64_t ic0 = job->ith * chunk;
        const int64_t ic1 = ic0 + chunk < nek1 ? ic0 + chunk : nek1;
        for (int64_t h = 0; h < heads; h++) {
            float *p = partials + (h * nth + job->ith) * psize;
            if (ic0 < nek1) {
                fa_row(n, job, c, h, ic0, ic1, p);
            } else {
                p[0] = -INFINITY;
                p[1] = 0.0f;
            }
        }
        return;
    }
    float *vkq = gr_thread_f32(job, fa_row_floats(DK, DV));
    for (int64_t h = job->ith; h < heads; h += nth) {
        float M = -INFINITY, S = 0.0f;
        memset(vkq, 0, (size_t)DV * 4);
        for (int64_t k = 0; k < nth; k++) {
            if (k * chunk >= nek1) continue;
            const float *p = partials + (h * nth + k) * psize;
            if (p[1] == 0.0f) continue;
            const float Mn = fmaxf(M, p[0]);
            const float so = expf(M - Mn), sn = expf(p[0] - Mn);
            for (int64_t d = 0; d < DV; d++) vkq[d] = fmaf(vkq[d], so, p[2 + d] * sn);
            S = fmaf(S, so, p[1] * sn);
            M = Mn;
        }
        if (S != 0.0f) {
            const float inv = 1.0f / S;
            for (int64_t d = 0; d < DV; d++) vkq[d] *= inv;
        }
        memcpy(fa_out(c, 0, h, 0), vkq, (size_t)DV * 4);
    }
}

/* Query rows in tiles of up to 64 (never crossing a head), keys in tiles of 64,
 * everything in F32 with sequential fused sums, as ggml's tiled path. */
static void fa_tiled(gr_job *job, const fa_ctx *c, int64_t r0, int64_t r1) {
    const int64_t DK = c->DK, DV = c->DV;
    const int64_t neq1 = c->q->ne[1], neq2 = c->q->ne[2];
    const int64_t nek1 = c->k->ne[1];
    const int32_t kvt = c->k->type;
    float *base = gr_thread_f32(job, FA_TQ * DK + 2 * FA_TQ * FA_TK + FA_TQ * DV + FA_TK * DV + FA_TK * DK + DK);
    float *Qf = base;                     /* (FA_TQ, DK) */
    float *KQ = Qf + FA_TQ * DK;          /* (FA_TQ, FA_TK) */
    float *mask32 = KQ + FA_TQ * FA_TK;   /* (FA_TQ, FA_TK) */
    float *VKQ = mask32 + FA_TQ * FA_TK;  /* (FA_TQ, DV) */
    float *V32 = VKQ + FA_TQ * DV;        /* (FA_TK, DV) */
    float *K32 = V32 + FA_TK * DV;        /* (DK, FA_TK): K transposed */
    float *Krow = K32 + FA_TK * DK;       /* (DK) */
    float S[FA_TQ], M[FA_TQ];
    int skip[FA_TQ];

    int64_t ir = r0;
    while (ir < r1) {
        const int64_t iq3 = ir / (neq2 * neq1);
        const int64_t iq2 = (ir - iq3 * neq2 * neq1) / neq1;
        const int64_t iq1 = ir - iq3 * neq2 * neq1 - iq2 * neq1;
        int64_t rows = FA_TQ;
        if (r1 - ir < rows) rows = r1 - ir;
        if (neq1 - iq1 < rows) rows = neq1 - iq1;
        const float slope = fa_slope(c, (uint32_t)iq2);
        const int64_t ik2 = iq2 / c->rk2, ik3 = iq3 / c->rk3;
        const int64_t iv2 = iq2 / c->rv2, iv3 = iq3 / c->rv3;
        for (int t = 0; t < FA_TQ; t++) {
            S[t] = 0.0f;
            M[t] = -INFINITY;
        }
        memset(VKQ, 0, sizeof(float) * FA_TQ * DV);
        memset(mask32, 0, sizeof(float) * FA_TQ * FA_TK);
        for (int64_t t = 0; t < FA_TQ; t++) {
            if (t < rows) {
                const char *pq = c->q->data + (iq1 + t) * c->q->nb[1] + iq2 * c->q->nb[2] + iq3 * c->q->nb[3];
                memcpy(Qf + t * DK, pq, (size_t)DK * 4);
            } else {
                memset(Qf + t * DK, 0, (size_t)DK * 4);
            }
        }
        for (int64_t ic = 0; ic < nek1; ic += FA_TK) {
            const int64_t kv = nek1 - ic < FA_TK ? nek1 - ic : FA_TK;
            if (c->mask) {
                int live = 0;   /* any entry not -inf: a tile of -inf only is skipped */
                for (int64_t t = 0; t < rows; t++) {
                    float *m = mask32 + t * FA_TK;
                    gr_vec.fp16_to_fp32(kv, fa_mask_row(c, iq1 + t, iq2, iq3) + ic, m);
                    for (int64_t k = 0; k < kv; k++) {
                        m[k] *= slope;
                        live |= m[k] != -INFINITY;
                    }
                    for (int64_t k = kv; k < FA_TK; k++) m[k] = -INFINITY;
                }
                if (!live) continue;
            }
            /* keys past kv are zero columns */
            for (int64_t k = 0; k < FA_TK; k++) {
                if (k < kv) {
                    const char *kd = c->k->data + (ic + k) * c->k->nb[1] + ik2 * c->k->nb[2] + ik3 * c->k->nb[3];
                    gr_load_f32(kvt, kd, c->k->nb[0], Krow, DK);
                    for (int64_t e = 0; e < DK; e++) K32[e * FA_TK + k] = Krow[e];
                } else {
                    for (int64_t e = 0; e < DK; e++) K32[e * FA_TK + k] = 0.0f;
                }
            }
            /* KQ = Q K^T, each entry one sequential fused sum over DK (rows past
             * `rows` are padding: ggml computes them, nothing reads them) */
            memset(KQ, 0, sizeof(float) * (size_t)rows * FA_TK);
            gr_vec.gemm_f32(rows, DK, FA_TK, KQ, Qf, K32);
            for (int64_t i = 0; i < rows * FA_TK; i++) KQ[i] *= c->scale;
            if (c->softcap != 0.0f)
                for (int64_t i = 0; i < rows * FA_TK; i++) KQ[i] = tanhf(KQ[i]) * c->softcap;
            if (kv < FA_TK)
                for (int64_t t = 0; t < rows; t++)
                    for (int64_t k = kv; k < FA_TK; k++) KQ[t * FA_TK + k] = -INFINITY;
            if (c->mask)
                for (int64_t i = 0; i < rows * FA_TK; i++) KQ[i] += mask32[i];
            for (int64_t t = 0; t < rows; t++) {
                float *row = KQ + t * FA_TK;
                float tmax = -INFINITY;
                for (int64_t k = 0; k < FA_TK; k++) tmax = tmax > row[k] ? tmax : row[k];
                skip[t] = tmax == -INFINITY;
                if (skip[t]) continue;
                const float Mold = M[t];
                const float Mnew = fmaxf(Mold, tmax);
                if (Mnew > Mold) {
                    const float ms = expf(Mold - Mnew);
                    for (int64_t d = 0; d < DV; d++) VKQ[t * DV + d] *= ms;
                    S[t] *= ms;
                }
                M[t] = Mnew;
                S[t] = (float)((double)S[t] + gr_vec.soft_max(FA_TK, row, row, Mnew));
            }
            for (int64_t k = 0; k < FA_TK; k++) {
                if (k < kv) {
                    const char *vd = c->v->data + (ic + k) * c->v->nb[1] + iv2 * c->v->nb[2] + iv3 * c->v->nb[3];
                    gr_load_f32(kvt, vd, c->v->nb[0], V32 + k * DV, DV);
                } else {
                    memset(V32 + k * DV, 0, (size_t)DV * 4);
                }
            }
            for (int64_t t = 0; t < rows; t++)
                if (skip[t]) memset(KQ + t * FA_TK, 0, sizeof(float) * FA_TK);
            /* VKQ += softmax(KQ) V, sequential fused sums over the keys */
            gr_vec.gemm_f32(rows, FA_TK, DV, VKQ, KQ, V32);
        }
        for (int64_t t = 0; t < rows; t++)
            fa_finish(c, VKQ + t * DV, M[t], S[t], iq2, fa_out(c, iq1 + t, iq2, iq3));
        ir += rows;
    }
}

/*   q: (DK, queries, heads, ne3) F32; k: (DK, keys, kv_heads, ne3k); v: (DV, keys, kv_heads, ne3v)
 *   mask: (keys, >= queries, 1 | heads, 1 | ne3) F16 or absent; sinks: (heads) F32 or absent
 *   dst: (DV, heads, queries, ne3) F32. Two phases: the split path merges in the second. */
void gr_k_flash_attn(gr_job *job, int phase) {
    const gr_node *n = job->node;
    fa_ctx c;
    fa_setup(n, &c);
    if (n->iparams[1] == FA_SPLIT) {
        fa_split(n, job, &c, phase);
        return;
    }
    if (phase) return;
    const int64_t nr = c.q->ne[1] * c.q->ne[2] * c.q->ne[3];
    int64_t r0, r1;
    gr_range(nr, job->ith, job->nth, &r0, &r1);
    if (r0 >= r1) return;
    if (n->iparams[1] == FA_TILED) fa_tiled(job, &c, r0, r1);
    else for (int64_t ir = r0; ir < r1; ir++) fa_row(n, job, &c, ir, 0, c.k->ne[1], NULL);
}
