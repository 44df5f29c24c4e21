/* MUL_MAT.
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
 * one-column kernel. On AVX-512 VNNI CPUs the K-quants take sixteen weight rows
 * at a time instead (gr_wpanel_*: one row per int32 lane, the columns read in
 * place), with the same float steps per output, and Q8_0/Q4_0/Q5_0/IQ4_NL take
 * column panels (ggmlrpc_cpanel_*: sixteen columns a register, two weight rows at
 * a time).
 * Decode-sized products take four weight rows at a time against a column
 * (ggmlrpc_get_vec_dot_rows4), fetching the weights ahead of use; small batches (2
 * to 7 columns, and Q8_0/Q4_0/Q5_0 up to GR_MM_SMALL_BATCH - 1 on AVX-512 VNNI) four
 * weight rows against up to eight columns (ggmlrpc_get_vec_dot_4xn), each weight
 * block unpacked once for them (on AVX-512 VNNI in its offset form, with the
 * activations' lane sums kept in scratch: ggmlrpc_get_vec_dot_4xn_sums). Weight rows go to threads in chunks handed out one
 * at a time.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu/job.h"
#include "cpu/kernels.h"
#include "cpu/matmul/matmul.h"
#include "cpu/simd.h"      /* gr_prefetch_block_ahead */
#include "common/rpc.h"   /* ggmlrpc_blck_size, ggmlrpc_row_size */

/* node iparams: [0] vec_dot type, [1] summation order (GR_MM_* of names.def:
 * vec_dot, prompt-time GEMM, tiled K-quant, IQ4_NL's one-accumulator GEMM through
 * ggmlrpc_get_vec_dot_gemm), [2] bytes of one converted src1 row.
 * Scratch: gr_mm_scratch (matmul.h). */

/* What every strategy of one node's phase 1 needs. */
typedef struct {
    const gr_node *n;
    const gr_tensor *s0, *s1, *d;   /* weights (K, M, ne02, ne03), activations (K, N, ne12, ne13), dst */
    gr_mm_scratch L;
    int64_t K, M, N, ne12, ne13;
    int64_t r2, r3;                 /* src1 batches per src0 batch */
    int64_t nr0, nr1;               /* weight rows, activation columns over all batches */
    size_t row_size;                /* bytes of one converted src1 row */
    int conv;                       /* src1 was converted into scratch */
    ggmlrpc_vec_dot_fn qdot;
    float (*dot32)(int64_t, const float *, const float *);
    float (*dot16)(int64_t, const uint16_t *, const uint16_t *);
    /* looked up once a node (mm_kernels), not for every block of rows */
    const int32_t *sums;                 /* the activation sums kept in scratch (mm_sums) */
    ggmlrpc_vec_dot_sums_fn qdots;       /* Q4_0's one-column kernel with those sums */
    ggmlrpc_vec_dot_rows4_fn qrows4;     /* four weight rows, one column, where qdot is vec_dot */
    ggmlrpc_vec_dot_4xn_fn tile;         /* small batches, where qdot is vec_dot */
    ggmlrpc_vec_dot_4xn_sums_fn tile_s;  /* their offset form, where the sums were kept for it */
    size_t wrow;                         /* bytes of a weight row (fetched ahead on a block's first column) */
} mm_ctx;

/* activation column c (over all batches): converted in scratch or read in place */
static inline const char *mm_act(const gr_job *job, const mm_ctx *c, int64_t col) {
    const int64_t i11 = col % c->N, i12 = (col / c->N) % c->ne12, i13 = col / (c->N * c->ne12);
    return c->conv ? job->wdata + (size_t)col * c->row_size
                   : c->s1->data + i11 * c->s1->nb[1] + i12 * c->s1->nb[2] + i13 * c->s1->nb[3];
}

/* the activation lane sums, where this run keeps them and the plan made room
 * for them (the quant level, and with it whether a node keeps them, can be switched
 * between planning and running) */
static int32_t *mm_sums(const gr_job *job, const gr_mm_scratch *L) {
    const uint32_t t = (uint32_t)job->node->src[0].type;
    const int has = L->q4_sums == GR_SUMS_Q4_0 ? ggmlrpc_get_vec_dot_q4_0_sums() != NULL
                    : L->q4_sums == GR_SUMS_4XN ? ggmlrpc_get_vec_dot_4xn_sums(t) != NULL : 0;
    return has && gr_mm_scratch_has(job->node, L->sums + L->sums_bytes) ? (int32_t *)(job->wdata + L->sums) : NULL;
}

/* the sums of nb converted activation blocks q */
static inline void mm_put_sums(const gr_job *job, const gr_mm_scratch *L, const char *q, int32_t *sums, int64_t nb) {
    if (L->q4_sums == GR_SUMS_Q4_0) ggmlrpc_q4_0_act_sums(q, sums, nb);
    else ggmlrpc_4xn_act_sums((uint32_t)job->node->src[0].type, q, sums, nb);
}

/* whether this run takes column panels (Q8_0/Q4_0/Q5_0/IQ4_NL prompts on AVX-512
 * VNNI): the layout has them, the plan made room for them and the kernels run at
 * this level */
static int mm_cpanels(const gr_job *job, const gr_mm_scratch *L) {
    return L->cpanel && gr_mm_scratch_has(job->node, L->threads + (size_t)job->nth * L->per_thread) &&
           ggmlrpc_cpanel_available((uint32_t)job->node->src[0].type);
}

/* column panel `group` (over all src1 batches) of a node with K-wide rows */
static char *mm_cpanel_at(const gr_job *job, const gr_mm_scratch *L, int64_t K, int64_t group) {
    return job->wdata + L->panels + (size_t)group * (size_t)(K / 32) * GGMLRPC_CPANEL_BYTES;
}

/* ---- phase 0: src1 into the vec_dot type, sums and panels ------------------- */

static void mm_convert(gr_job *job, const gr_mm_scratch *L) {
    const gr_node *n = job->node;
    const gr_tensor *s0 = &n->src[0], *s1 = &n->src[1];
    const int32_t vdt = (int32_t)n->iparams[0];
    const size_t row_size = (size_t)n->iparams[2];
    const int64_t K = s0->ne[0], N = s1->ne[1];
    if (job->ith == 0) gr_chunk_set(job, job->nth);   /* chunks 0..nth-1 go to threads 0..nth-1 */
    if (s1->type == vdt) return;
    int32_t *sums = mm_sums(job, L);
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
            if (sums) mm_put_sums(job, L, q, sums + (ir * nb + k0) * gr_sums_stride(L->q4_sums), k1 - k0);
        }
        return;
    }
    /* panels only where the plan made room for them (the SIMD level can be
     * switched between planning and running) */
    const int cp = mm_cpanels(job, L);
    const size_t pb = !cp && !L->kpanel && L->panel_block && gr_mm_scratch_has(n, L->panels_end) ? L->panel_block : 0;
    /* the weight-panel path reads the converted rows themselves */
    const int kp = L->kpanel && gr_mm_scratch_has(n, L->threads + (size_t)job->nth * L->per_thread) &&
                   !gr_wpanel_available(s0->type);
    for (int64_t ir = r0; ir < r1; ir++) {
        const char *src = gr_row(s1, ir);
        char *dst = job->wdata + (size_t)ir * row_size;
        gr_mm_convert_row(vdt, s1, src, dst, K, from_float);
        if (sums) mm_put_sums(job, L, dst, sums + ir * (K / 32) * gr_sums_stride(L->q4_sums), K / 32);
        if (cp) {   /* lane i11 % COLS of its batch's column panel i11 / COLS */
            const int64_t i11 = ir % N, COLS = GGMLRPC_CPANEL_COLS;
            char *pan = mm_cpanel_at(job, L, K, (ir / N) * gr_cpanel_groups(N) + i11 / COLS);
            ggmlrpc_cpanel_put((uint32_t)s0->type, dst, K / 32, pan, (int)(i11 % COLS));
            if (i11 == N - 1 && N % COLS) ggmlrpc_cpanel_clear(pan, K / 32, (int)(N % COLS));
            continue;
        }
        const int64_t i11 = ir % N, G = N / 8;
        if ((pb || kp) && i11 < G * 8) {   /* lane i11 % 8 of its batch's panel i11 / 8 */
            const size_t group = (size_t)((ir / N) * G + i11 / 8);
            if (pb)
                ggmlrpc_panel_put((uint32_t)s0->type, dst, K / 32,
                                  job->wdata + L->panels + group * (size_t)(K / 32) * pb, (int)(i11 % 8));
            else
                gr_kpanel_put(dst, K / 256, job->wdata + L->panels + group * (size_t)(K / 256) * GR_KPANEL_BYTES,
                              (int)(i11 % 8));
        }
    }
}

/* ---- phase 1 strategies ---------------------------------------------------- */

/* outputs [ib, ie) x columns [b0, b1) of a quantized type by its 4xn kernel (small
 * batches): four weight rows against up to GGMLRPC_4XN_COLS columns of one src1
 * batch at a time, the column groups of a row quad one after another while its
 * weights are in cache; a short last quad repeats its first row (outputs not
 * written) */
static void mm_4xn(const gr_job *job, const mm_ctx *cx, ggmlrpc_vec_dot_4xn_fn tile,
                   ggmlrpc_vec_dot_4xn_sums_fn tile_s, const int32_t *sums, int64_t ib, int64_t ie,
                   int64_t b0, int64_t b1) {
    const gr_tensor *s0 = cx->s0, *d = cx->d;
    const int64_t N = cx->N, ne12 = cx->ne12;
    for (int64_t i01 = ib; i01 < ie; i01 += 4) {
        const int rows = ie - i01 < 4 ? (int)(ie - i01) : 4;
        for (int64_t c = b0; c < b1;) {
            const int64_t i11 = c % N, i12 = (c / N) % ne12, i13 = c / (N * ne12);
            const int64_t left = (b1 < c - i11 + N ? b1 : c - i11 + N) - c;   /* in this batch */
            const int nc = left < GGMLRPC_4XN_COLS ? (int)left : GGMLRPC_4XN_COLS;
            const char *w = s0->data + (i12 / cx->r2) * s0->nb[2] + (i13 / cx->r3) * s0->nb[3];
            const void *wr[4], *act[GGMLRPC_4XN_COLS];
            const int32_t *sp[GGMLRPC_4XN_COLS];
            for (int r = 0; r < 4; r++) wr[r] = w + (i01 + (r < rows ? r : 0)) * s0->nb[1];
            for (int j = 0; j < nc; j++) act[j] = mm_act(job, cx, c + j);
            float v[4 * GGMLRPC_4XN_COLS];
            if (tile_s) {
                for (int j = 0; j < nc; j++) sp[j] = sums + (c + j) * (cx->K / 32) * GGMLRPC_4XN_SUMS;
                tile_s(cx->K, v, wr, act, sp, nc);
            } else {
                tile(cx->K, v, wr, act, nc);
            }
            for (int j = 0; j < nc; j++) {
                float *out = (float *)(d->data + (i11 + j) * d->nb[1] + i12 * d->nb[2] + i13 * d->nb[3]);
                for (int r = 0; r < rows; r++) out[i01 + r] = v[4 * j + r];
            }
            c += nc;
        }
    }
}

/* the node's kernels of mm_rows: the row and small-batch kernels where qdot is the
 * type's vec_dot (not a GEMM order), Q4_0's with its lane sums where kept */
static void mm_kernels(const gr_job *job, mm_ctx *cx) {
    const uint32_t t = (uint32_t)cx->s0->type;
    const int vec_dot = cx->qdot && cx->qdot == ggmlrpc_get_vec_dot(t);
    cx->sums = mm_sums(job, &cx->L);
    cx->qdots = cx->sums && cx->L.q4_sums == GR_SUMS_Q4_0 ? ggmlrpc_get_vec_dot_q4_0_sums() : NULL;
    cx->qrows4 = !cx->qdots && vec_dot ? ggmlrpc_get_vec_dot_rows4(t) : NULL;
    cx->tile = vec_dot ? ggmlrpc_get_vec_dot_4xn(t) : NULL;
    cx->tile_s = cx->tile && cx->sums && cx->L.q4_sums == GR_SUMS_4XN ? ggmlrpc_get_vec_dot_4xn_sums(t) : NULL;
    cx->wrow = ggmlrpc_row_size(t, cx->K);
}

/* outputs [a0, a1) x columns [b0, b1), one dot product each (vec_dot's order, or
 * the GEMM's for F32/F16 with dot32/dot16 set so); by the type's 4xn kernel where it
 * has one (2+ columns, or one without a rows4 kernel) */
static void mm_rows(gr_job *job, const mm_ctx *cx, int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
    const gr_tensor *s0 = cx->s0, *s1 = cx->s1, *d = cx->d;
    const size_t row_size = cx->row_size;
    const int64_t K = cx->K, N = cx->N, ne12 = cx->ne12, r2 = cx->r2, r3 = cx->r3;
    const int conv = cx->conv;
    const ggmlrpc_vec_dot_fn qdot = cx->qdot;
    const int32_t *sums = cx->sums;
    const ggmlrpc_vec_dot_sums_fn qdots = cx->qdots;
    const ggmlrpc_vec_dot_rows4_fn qrows4 = cx->qrows4;
    /* the 4xn kernel for 2+ columns, or for one where the type has no rows4 kernel
     * (nor Q4_0's lane sums) */
    const ggmlrpc_vec_dot_4xn_fn tile = b1 - b0 >= 2 || (!qrows4 && !qdots) ? cx->tile : NULL;
    const ggmlrpc_vec_dot_4xn_sums_fn tile_s = tile ? cx->tile_s : NULL;
    const int64_t BLK = 16;
    const size_t wrow = cx->wrow;
    for (int64_t ib = a0; ib < a1; ib += BLK) {
        const int64_t ie = ib + BLK < a1 ? ib + BLK : a1;
        if (tile) {
            if (gr_canceled(job)) return;
            mm_4xn(job, cx, tile, tile_s, sums, ib, ie, b0, b1);
            continue;
        }
        for (int64_t c = b0; c < b1; c++) {
            if (((c - b0) & 63) == 0 && gr_canceled(job)) return;
            const int64_t i11 = c % N;
            const int64_t i12 = (c / N) % ne12;
            const int64_t i13 = c / (N * ne12);
            const char *act = conv ? job->wdata + (size_t)c * row_size
                                   : s1->data + i11 * s1->nb[1] + i12 * s1->nb[2] + i13 * s1->nb[3];
            const char *w = s0->data + (i12 / r2) * s0->nb[2] + (i13 / r3) * s0->nb[3];
            float *out = (float *)(d->data + i11 * d->nb[1] + i12 * d->nb[2] + i13 * d->nb[3]);
            int64_t i01 = ib;
            for (; qrows4 && i01 + 4 <= ie; i01 += 4) {
                const void *wr[4] = {w + i01 * s0->nb[1], w + (i01 + 1) * s0->nb[1],
                                     w + (i01 + 2) * s0->nb[1], w + (i01 + 3) * s0->nb[1]};
                qrows4(K, out + i01, wr, act);
            }
            for (; i01 < ie; i01++) {
                const char *wr = w + i01 * s0->nb[1];
                if (c == b0) gr_prefetch_block_ahead(wr, wrow);
                float v;
                if (s0->type == GR_TYPE_F32) v = cx->dot32(K, (const float *)wr, (const float *)act);
                else if (s0->type == GR_TYPE_F16) v = cx->dot16(K, (const uint16_t *)wr, (const uint16_t *)act);
                else if (qdots) qdots(K, &v, wr, act, sums + c * (K / 32) * gr_sums_stride(GR_SUMS_Q4_0));
                else qdot(K, &v, wr, act);
                out[i01] = v;
            }
        }
    }
}

/* mm_rows over a thread's whole share, its blocks of 16 weight rows one call each
 * (the same blocks as one call makes), so that the run may yield between them */
static void mm_rows_share(gr_job *job, const mm_ctx *cx, int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
    for (int64_t ib = gr_rows_from(job, a0); !gr_rows_pause(job, ib) && ib < a1; ib += 16)
        mm_rows(job, cx, ib, ib + 16 < a1 ? ib + 16 : a1, b0, b1);
}

/* K-quants, 8+ columns, K panels in scratch: chunks of GR_MM_CHUNK_ROWS weight
 * rows handed out one at a time, decoded once per src1 batch, each row against
 * every panel of eight columns and the columns left over */
static void mm_kpanel_gemm(gr_job *job, const mm_ctx *cx) {
    const gr_tensor *s0 = cx->s0, *d = cx->d;
    const int64_t K = cx->K, N = cx->N, ne12 = cx->ne12, ne13 = cx->ne13, nr0 = cx->nr0;
    const int64_t nb = K / 256, G = N / 8, CH = GR_MM_CHUNK_ROWS;
    const char *panels = job->wdata + cx->L.panels;
    char *krows = job->wdata + cx->L.threads + (size_t)job->ith * cx->L.per_thread;
    float *dd = (float *)(krows + (size_t)CH * (size_t)nb * GR_KROW_BYTES), *dm = dd + CH * nb;
    const int64_t nch = (nr0 + CH - 1) / CH;
    for (int64_t ch = gr_chunk_first(job); ch < nch; ch = gr_chunk_next(job)) {
        const int64_t ib = ch * CH, ie = ib + CH < nr0 ? ib + CH : nr0;
        for (int64_t sl = 0; sl < ne12 * ne13; sl++) {
            const int64_t i12 = sl % ne12, i13 = sl / ne12;
            const char *w = s0->data + (i12 / cx->r2) * s0->nb[2] + (i13 / cx->r3) * s0->nb[3];
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
                    act[j] = job->wdata + (size_t)(sl * N + i11) * cx->row_size;
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
}

/* The skeleton of the chunked prompt strategies: chunks of GR_MM_CHUNK_ROWS weight
 * rows [ib, ie) handed out one at a time; for every src1 batch (i12, i13) the
 * chunk is decoded into the thread's scratch `mem` once per src0 batch w, then
 * multiplied by the batch's columns. */
typedef struct {
    int64_t ib, ie, i12, i13, sl;   /* sl: the src1 batch's index */
    const char *w;                  /* the src0 batch */
    char *mem;
} mm_chunk;

typedef void (*mm_chunk_fn)(gr_job *job, const mm_ctx *cx, const mm_chunk *c);

static void mm_chunks(gr_job *job, const mm_ctx *cx, mm_chunk_fn decode, mm_chunk_fn gemm) {
    const gr_tensor *s0 = cx->s0;
    const int64_t CH = GR_MM_CHUNK_ROWS, nch = (cx->nr0 + CH - 1) / CH;
    mm_chunk c = {.mem = job->wdata + cx->L.threads + (size_t)job->ith * cx->L.per_thread};
    for (int64_t ch = gr_chunk_first(job); ch < nch; ch = gr_chunk_next(job)) {
        c.ib = ch * CH;
        c.ie = c.ib + CH < cx->nr0 ? c.ib + CH : cx->nr0;
        int64_t cur = -1;
        for (c.sl = 0; c.sl < cx->ne12 * cx->ne13; c.sl++) {
            c.i12 = c.sl % cx->ne12;
            c.i13 = c.sl / cx->ne12;
            const int64_t i02 = c.i12 / cx->r2, i03 = c.i13 / cx->r3, key = i03 * s0->ne[2] + i02;
            if (key != cur) {
                c.w = s0->data + i02 * s0->nb[2] + i03 * s0->nb[3];
                decode(job, cx, &c);
                cur = key;
            }
            gemm(job, cx, &c);
        }
    }
}

/* K-quants 8+ columns on AVX-512 VNNI: each chunk decoded into one weight panel,
 * then every column of the src1 batch against it */
_Static_assert(GR_MM_CHUNK_ROWS == 16, "a weight panel holds sixteen rows");
_Static_assert(GR_WPANEL_BYTES <= GR_MM_CHUNK_ROWS * (GR_KROW_BYTES + 8), "a weight panel fits a thread's K rows");

static void mm_wpanel_decode(gr_job *job, const mm_ctx *cx, const mm_chunk *c) {
    (void)job;
    gr_wpanel_decode(cx->s0->type, cx->K / 256, c->w + c->ib * cx->s0->nb[1], cx->s0->nb[1], (int)(c->ie - c->ib),
                     c->mem);
}

static void mm_wpanel_chunk(gr_job *job, const mm_ctx *cx, const mm_chunk *c) {
    const gr_tensor *d = cx->d;
    gr_wpanel_gemm(cx->s0->type, cx->K / 256, c->mem, job->wdata + (size_t)(c->sl * cx->N) * cx->row_size,
                   cx->row_size, cx->N, (float *)(d->data + c->i12 * d->nb[2] + c->i13 * d->nb[3]) + c->ib, d->nb[1],
                   (int)(c->ie - c->ib));
}

/* Q8_0/Q4_0/Q5_0/IQ4_NL prompts on AVX-512 VNNI: each chunk's rows decoded into
 * unsigned codes, then two rows at a time against every column panel of the src1
 * batch (a short last panel's unused lanes not written) */
static void mm_cpanel_decode(gr_job *job, const mm_ctx *cx, const mm_chunk *c) {
    (void)job;
    const int64_t nb = cx->K / 32;
    const size_t rb = ggmlrpc_cpanel_row_bytes(nb);
    for (int64_t i01 = c->ib; i01 < c->ie; i01++)
        ggmlrpc_cpanel_decode((uint32_t)cx->s0->type, c->w + i01 * cx->s0->nb[1], nb, c->mem + (size_t)(i01 - c->ib) * rb);
}

static void mm_cpanel_chunk(gr_job *job, const mm_ctx *cx, const mm_chunk *c) {
    const gr_tensor *d = cx->d;
    const int64_t N = cx->N, nb = cx->K / 32, G = gr_cpanel_groups(N), COLS = GGMLRPC_CPANEL_COLS;
    const size_t rb = ggmlrpc_cpanel_row_bytes(nb);
    const ggmlrpc_cpanel_dot_fn dot = ggmlrpc_get_cpanel_dot((uint32_t)cx->s0->type);
    for (int64_t g = 0; g < G; g++) {
        const char *pan = mm_cpanel_at(job, &cx->L, cx->K, c->sl * G + g);
        const int64_t cols = N - COLS * g < COLS ? N - COLS * g : COLS;
        for (int64_t i01 = c->ib; i01 < c->ie; i01 += 2) {
            const int two = i01 + 1 < c->ie;   /* an odd last row is paired with itself */
            float v[2 * GGMLRPC_CPANEL_COLS];
            dot(nb, c->mem + (size_t)(i01 - c->ib) * rb, c->mem + (size_t)(i01 + two - c->ib) * rb, pan, v);
            for (int64_t j = 0; j < cols; j++) {
                float *out = (float *)(d->data + (COLS * g + j) * d->nb[1] + c->i12 * d->nb[2] + c->i13 * d->nb[3]);
                out[i01] = v[j];
                if (two) out[i01 + 1] = v[COLS + j];
            }
        }
    }
}

/* K-quants in ggml's tiled order without panels: each weight row of [a0, a1)
 * decoded once per src0 batch, then dotted with every column of [b0, b1) */
static void mm_tiled(gr_job *job, const mm_ctx *cx, int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
    const gr_tensor *s0 = cx->s0, *d = cx->d;
    const int64_t N = cx->N, ne12 = cx->ne12;
    void *mem = job->wdata + cx->L.tiled + (size_t)job->ith * cx->L.tiled_bytes;
    for (int64_t i01 = gr_rows_from(job, a0); !gr_rows_pause(job, i01) && i01 < a1; i01++) {
        if (gr_canceled(job)) return;
        int64_t cur = -1;
        gr_tiled_row row;
        for (int64_t c = b0; c < b1; c++) {
            const int64_t i11 = c % N, i12 = (c / N) % ne12, i13 = c / (N * ne12);
            const int64_t i02 = i12 / cx->r2, i03 = i13 / cx->r3, key = i03 * s0->ne[2] + i02;
            if (key != cur) {
                row = gr_tiled_decode(s0->type, cx->K, s0->data + i01 * s0->nb[1] + i02 * s0->nb[2] + i03 * s0->nb[3], mem);
                cur = key;
            }
            float *out = (float *)(d->data + i11 * d->nb[1] + i12 * d->nb[2] + i13 * d->nb[3]);
            out[i01] = gr_tiled_dot_row(&row, mm_act(job, cx, c));
        }
    }
}

/* F32/F16 weights in the prompt-time GEMM's order: tiles of 4 weight rows x
 * tile_cols activation columns of the same src0 batch (a short tile repeats its
 * first column), weight rows in blocks kept in cache while every column passes */
static void mm_gemm_tiles(gr_job *job, const mm_ctx *cx, int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
    const gr_tensor *s0 = cx->s0, *d = cx->d;
    const int64_t K = cx->K, N = cx->N, ne12 = cx->ne12;
    const int f16 = s0->type == GR_TYPE_F16;
    const int TC = gr_vec.tile_cols;
    const int64_t RB = 64;
    for (int64_t rb = gr_rows_from(job, a0); !gr_rows_pause(job, rb) && rb < a1; rb += RB) {
        const int64_t re = rb + RB < a1 ? rb + RB : a1;
        for (int64_t c = b0; c < b1;) {
            const int64_t i12 = (c / N) % ne12, i13 = c / (N * ne12);
            const int64_t batch_end = (c / N + 1) * N;     /* the tile's columns in one batch */
            int64_t ce = c + TC < b1 ? c + TC : b1;
            if (ce > batch_end) ce = batch_end;
            const char *wb = s0->data + (i12 / cx->r2) * s0->nb[2] + (i13 / cx->r3) * s0->nb[3];
            const char *act[GR_TILE_COLS_MAX];
            float *out[GR_TILE_COLS_MAX];
            for (int64_t j = 0; j < TC; j++) {
                const int64_t cc = c + j < ce ? c + j : c, i11 = cc % N;
                act[j] = mm_act(job, cx, cc);
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
}

/* Q4/Q5/Q8/IQ4_NL prompts with panels of pb bytes a block: chunks of 16 weight
 * rows handed out one at a time, each against every panel of eight columns, the
 * columns left over one by one */
static void mm_panel_gemm(gr_job *job, const mm_ctx *cx, size_t pb) {
    const gr_tensor *s0 = cx->s0, *d = cx->d;
    const int64_t K = cx->K, N = cx->N, ne12 = cx->ne12, ne13 = cx->ne13, nr0 = cx->nr0;
    const int64_t nb = K / 32, G = N / 8, CH = 16;
    const ggmlrpc_panel_dot_fn pdot = ggmlrpc_get_panel_dot((uint32_t)s0->type);
    const char *panels = job->wdata + cx->L.panels;
    const int64_t nch = (nr0 + CH - 1) / CH;
    for (int64_t ch = gr_chunk_first(job); ch < nch; ch = gr_chunk_next(job)) {
        const int64_t ib = ch * CH, ie = ib + CH < nr0 ? ib + CH : nr0;
        for (int64_t sl = 0; sl < ne12 * ne13; sl++) {
            const int64_t i12 = sl % ne12, i13 = sl / ne12;
            const char *w = s0->data + (i12 / cx->r2) * s0->nb[2] + (i13 / cx->r3) * s0->nb[3];
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
            if (G * 8 < N) mm_rows(job, cx, ib, ie, sl * N + G * 8, (sl + 1) * N);
        }
    }
}

/* few activation columns (decode): weight rows in chunks of 64 (16 with 2+
 * columns) handed out one at a time, so that a thread slowed down (by another
 * process on its core) leaves its share to the others instead of holding every
 * thread at the barrier; as ggml's mul_mat chunks */
static void mm_matvec(gr_job *job, const mm_ctx *cx, int64_t CH) {
    const int64_t nch = (cx->nr0 + CH - 1) / CH;
    for (int64_t ch = gr_chunk_first(job); ch < nch; ch = gr_chunk_next(job)) {
        const int64_t a0 = ch * CH, a1 = a0 + CH < cx->nr0 ? a0 + CH : cx->nr0;
        mm_rows(job, cx, a0, a1, 0, cx->nr1);
    }
}

/* ---- the kernel ------------------------------------------------------------- */

/* Convert src1 rows into wdata (phase 0), then dot products (phase 1) by the
 * strategy the order, the types and the scratch allow.
 *   src0: (K, M, ne02, ne03) weights, rows contiguous
 *   src1: (K, N, ne12, ne13), ne12 % ne02 == 0, ne13 % ne03 == 0
 *   dst:  (M, N, ne12, ne13) F32 */
void gr_k_mul_mat(gr_job *job, int phase) {
    const gr_node *n = job->node;
    const gr_mm_scratch L = gr_mm_scratch_layout(n, job->nth);
    if (phase == 0) {
        mm_convert(job, &L);
        return;
    }
    const gr_tensor *s0 = &n->src[0], *s1 = &n->src[1];
    const int order = (int)n->iparams[1];
    mm_ctx cx = {
        .n = n, .s0 = s0, .s1 = s1, .d = &n->dst, .L = L,
        .K = s0->ne[0], .M = s0->ne[1], .N = s1->ne[1], .ne12 = s1->ne[2], .ne13 = s1->ne[3],
        .r2 = s1->ne[2] / s0->ne[2], .r3 = s1->ne[3] / s0->ne[3],
        .nr0 = s0->ne[1], .nr1 = s1->ne[1] * s1->ne[2] * s1->ne[3],
        .row_size = (size_t)n->iparams[2], .conv = s1->type != (int32_t)n->iparams[0],
        .dot32 = order == GR_MM_GEMM ? gr_vec.dot_f32_gemm : gr_vec.dot_f32,
        .dot16 = order == GR_MM_GEMM ? gr_vec.dot_f16_gemm : gr_vec.dot_f16,
    };
    if (s0->type != GR_TYPE_F32 && s0->type != GR_TYPE_F16)
        cx.qdot = order == GR_MM_Q0_GEMM ? ggmlrpc_get_vec_dot_gemm((uint32_t)s0->type) : ggmlrpc_get_vec_dot((uint32_t)s0->type);
    if (s0->type == GR_TYPE_BF16 && order == GR_MM_GEMM) cx.qdot = gr_vec.dot_bf16_gemm;   /* tinyBLAS */
    else if (s0->type == GR_TYPE_BF16 && gr_vec.dot_bf16) cx.qdot = gr_vec.dot_bf16;  /* an AVX512-BF16 build's */
    mm_kernels(job, &cx);

    /* the larger side split between threads */
    int64_t a0 = 0, a1 = cx.nr0, b0 = 0, b1 = cx.nr1;
    if (cx.nr0 >= cx.nr1) gr_range(cx.nr0, job->ith, job->nth, &a0, &a1);
    else gr_range(cx.nr1, job->ith, job->nth, &b0, &b1);

    const int kp = L.kpanel && gr_mm_scratch_has(n, L.threads + (size_t)job->nth * L.per_thread);
    const size_t pb = !L.kpanel && L.panel_block && gr_mm_scratch_has(n, L.panels_end) ? L.panel_block : 0;
    const int64_t CH = cx.nr1 == 1 ? 64 : 16;
    if (mm_cpanels(job, &L)) mm_chunks(job, &cx, mm_cpanel_decode, mm_cpanel_chunk);
    else if (order == GR_MM_TILED && kp && gr_wpanel_available(s0->type)) mm_chunks(job, &cx, mm_wpanel_decode, mm_wpanel_chunk);
    else if (order == GR_MM_TILED && kp) mm_kpanel_gemm(job, &cx);
    else if (order == GR_MM_TILED) mm_tiled(job, &cx, a0, a1, b0, b1);
    else if (order == GR_MM_GEMM && (s0->type == GR_TYPE_F32 || s0->type == GR_TYPE_F16)) mm_gemm_tiles(job, &cx, a0, a1, b0, b1);
    else if (pb) mm_panel_gemm(job, &cx, pb);
    else if (cx.nr1 < GR_MM_SMALL_BATCH && cx.nr0 >= 4 * job->nth * CH) mm_matvec(job, &cx, CH);
    else mm_rows_share(job, &cx, a0, a1, b0, b1);
}
