/* Copies: DUP / CPY / CONT with type conversion, GET_ROWS / SET_ROWS, and
 * ACC / SET (a view of dst written from src1).
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

/* ---- DUP / CPY / CONT ---------------------------------------------------- */

/* Copy src into dst element by element in logical (row-major) order; the two
 * may differ in shape and strides but hold the same number of elements.
 * Same types copy bytes; F32/F16/BF16/I32 convert through float.
 *   src: (ne00, ne01, ne02, ne03), dst: (ne0, ne1, ne2, ne3), same nelements */
/* node iparams: [0] element size for same-type copies, [1] bytes of a row for
 * same-shape block copies (quantized), [2] DUP_* mode, [3] block size when
 * quantized data of one type changes shape (whole blocks are the elements then) */

/* Quantized src0 into an F32 dst of another shape (ggml's dup_from_q): block k of
 * src0 in logical order dequantizes to dst elements k*qk .. k*qk+qk-1, which lie in
 * one dst row (ne0 % qk == 0) or run on in a contiguous dst; qk = iparams[3].
 *   src0: (ne00, ne01, ne02, ne03) blocks of qk, dst: F32 of the same element count */
static void dup_from_q_blocks(gr_job *job) {
    GR_NODE_LOCALS(job);
    const int64_t qk = n->iparams[3];
    const int64_t nblocks = s->ne[0] * s->ne[1] * s->ne[2] * s->ne[3] / qk;
    ggmlrpc_to_float_fn to_float = ggmlrpc_get_to_float((uint32_t)s->type);
    int64_t b0, b1;
    gr_range(nblocks, job->ith, job->nth, &b0, &b1);
    for (int64_t b = b0; b < b1; b++) {
        const int64_t i = b * qk;
        int64_t r = i / s->ne[0];
        const char *x = s->data + (i % s->ne[0]) / qk * s->nb[0] + (r % s->ne[1]) * s->nb[1] +
                        (r / s->ne[1] % s->ne[2]) * s->nb[2] + (r / s->ne[1] / s->ne[2]) * s->nb[3];
        r = i / d->ne[0];
        char *y = d->data + (i % d->ne[0]) * d->nb[0] + (r % d->ne[1]) * d->nb[1] +
                  (r / d->ne[1] % d->ne[2]) * d->nb[2] + (r / d->ne[1] / d->ne[2]) * d->nb[3];
        to_float(x, (float *)y, qk);
    }
}

void gr_k_dup(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    if (n->iparams[2] == GR_DUP_FROM_Q_BLOCKS) {
        dup_from_q_blocks(job);
        return;
    }
    const gr_tensor *src = &n->src[0];
    const gr_tensor *dst = &n->dst;
    gr_tensor src_blocks, dst_blocks;
    if (n->iparams[3] > 1) {
        src_blocks = *src;
        dst_blocks = *dst;
        src_blocks.ne[0] /= n->iparams[3];
        dst_blocks.ne[0] /= n->iparams[3];
        src = &src_blocks;
        dst = &dst_blocks;
    }
    const int64_t ne00 = src->ne[0];
    const int64_t nr = gr_nrows(src);
    int64_t r0, r1;
    gr_range(nr, job->ith, job->nth, &r0, &r1);
    if (r0 >= r1) return;
    float *fbuf = gr_thread_f32(job, ne00);

    if (n->iparams[2] == GR_DUP_FROM_Q) {          /* quantized rows -> F32 rows, same shape */
        ggmlrpc_to_float_fn to_float = ggmlrpc_get_to_float((uint32_t)src->type);
        for (int64_t ir = r0; ir < r1; ir++) to_float(gr_row(src, ir), (float *)gr_row(dst, ir), ne00);
        return;
    }
    if (n->iparams[2] == GR_DUP_TO_Q) {            /* rows -> consecutive quantized rows of a contiguous dst */
        ggmlrpc_from_float_fn from_float = ggmlrpc_get_from_float((uint32_t)dst->type);
        const size_t rs = (size_t)n->iparams[1];
        for (int64_t ir = r0; ir < r1; ir++) {
            gr_load_f32(src->type, gr_row(src, ir), src->nb[0], fbuf, ne00);
            from_float(fbuf, dst->data + (size_t)ir * rs, ne00);
        }
        return;
    }
    if (n->iparams[1]) {                         /* same-type rows of whole blocks */
        for (int64_t ir = r0; ir < r1; ir++) memmove(gr_row(dst, ir), gr_row(src, ir), (size_t)n->iparams[1]);
        return;
    }

    const int same_type = src->type == dst->type;
    const size_t ts = (size_t)n->iparams[0];          /* element size when same_type */
    const int same_shape = src->ne[0] == dst->ne[0] && src->ne[1] == dst->ne[1] &&
                           src->ne[2] == dst->ne[2] && src->ne[3] == dst->ne[3];
    float *buf = fbuf;

    if (same_shape) {
        for (int64_t ir = r0; ir < r1; ir++) {
            const char *s = gr_row(src, ir);
            char *d = gr_row(dst, ir);
            if (same_type) {
                if (src->nb[0] == (int64_t)ts && dst->nb[0] == (int64_t)ts) {
                    memmove(d, s, (size_t)ne00 * ts);
                } else {
                    for (int64_t i = 0; i < ne00; i++) memmove(d + i * dst->nb[0], s + i * src->nb[0], ts);
                }
            } else {
                gr_load_f32(src->type, s, src->nb[0], buf, ne00);
                gr_store_f32(dst->type, d, dst->nb[0], buf, ne00);
            }
        }
        return;
    }

    /* different shapes: walk dst with its own counters from the flat index */
    int64_t flat = r0 * ne00;
    int64_t d0 = flat % dst->ne[0];
    int64_t d1 = (flat / dst->ne[0]) % dst->ne[1];
    int64_t d2 = (flat / (dst->ne[0] * dst->ne[1])) % dst->ne[2];
    int64_t d3 = flat / (dst->ne[0] * dst->ne[1] * dst->ne[2]);
    for (int64_t ir = r0; ir < r1; ir++) {
        const char *s = gr_row(src, ir);
        if (!same_type) gr_load_f32(src->type, s, src->nb[0], buf, ne00);
        for (int64_t i = 0; i < ne00; i++) {
            char *d = gr_at(dst, d0, d1, d2, d3);
            if (same_type) memmove(d, s + i * src->nb[0], ts);
            else gr_store_f32(dst->type, d, dst->nb[0], &buf[i], 1);
            if (++d0 == dst->ne[0]) {
                d0 = 0;
                if (++d1 == dst->ne[1]) {
                    d1 = 0;
                    if (++d2 == dst->ne[2]) {
                        d2 = 0;
                        ++d3;
                    }
                }
            }
        }
    }
}

/* ---- GET_ROWS / SET_ROWS ------------------------------------------------- */

static inline int64_t read_index(const gr_tensor *t, int64_t i0, int64_t i1, int64_t i2) {
    const char *p = t->data + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2];
    if (t->type == GR_T_I64) {
        int64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* dst[:, i10, i11, i12] = src0[:, src1[i10, i11, i12], i11, i12]
 *   src0: (nc, ne01, ne11, ne12), src1: (ne10, ne11, ne12) I32, dst: (nc, ne10, ne11, ne12) */
void gr_k_get_rows(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s0 = &n->src[0], *s1 = &n->src[1], *d = &n->dst;
    const int64_t nc = s0->ne[0], ne10 = s1->ne[0], ne11 = s1->ne[1];
    const int64_t nr = ne10 * ne11 * s1->ne[2];
    ggmlrpc_to_float_fn to_float = NULL;
    if (s0->type != d->type && s0->type != GR_TYPE_F16 && s0->type != GR_TYPE_BF16)
        to_float = ggmlrpc_get_to_float((uint32_t)s0->type);
    int64_t r0, r1;
    gr_range(nr, job->ith, job->nth, &r0, &r1);
    for (int64_t i = r0; i < r1; i++) {
        const int64_t i12 = i / (ne11 * ne10);
        const int64_t i11 = (i - i12 * ne11 * ne10) / ne10;
        const int64_t i10 = i - i12 * ne11 * ne10 - i11 * ne10;
        const int64_t i01 = read_index(s1, i10, i11, i12);
        if (i01 < 0 || i01 >= s0->ne[1]) {
            gr_fail(job, GR_EXEC_EINDEX, "GET_ROWS index %lld out of range [0, %lld)",
                    (long long)i01, (long long)s0->ne[1]);
            return;
        }
        const char *src = s0->data + i01 * s0->nb[1] + i11 * s0->nb[2] + i12 * s0->nb[3];
        char *dst = d->data + i10 * d->nb[1] + i11 * d->nb[2] + i12 * d->nb[3];
        if (s0->type == d->type) memmove(dst, src, (size_t)n->iparams[0]);  /* row bytes */
        else if (to_float) to_float(src, (float *)dst, nc);                   /* quantized -> F32 */
        else gr_load_f32(s0->type, src, s0->nb[0], (float *)dst, nc);       /* F16/BF16 -> F32 */
    }
}

/* dst[:, src1[i, i02 % ne11, i03 % ne12], i02, i03] = src0[:, i, i02, i03]
 *   src0: (nc, ne01, ne02, ne03) F32/F16, src1: (ne01, ne11, ne12) I64/I32, dst: (nc, ne1, ne02, ne03) */
void gr_k_set_rows(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s0 = &n->src[0], *s1 = &n->src[1], *d = &n->dst;
    const int64_t nc = s0->ne[0];
    int64_t r0, r1;
    gr_range(s0->ne[1], job->ith, job->nth, &r0, &r1);
    float *buf = gr_thread_f32(job, nc);
    ggmlrpc_from_float_fn from_float = NULL;
    if (d->type != GR_TYPE_F32 && d->type != GR_TYPE_F16 && d->type != GR_TYPE_BF16)
        from_float = ggmlrpc_get_from_float((uint32_t)d->type);
    for (int64_t i03 = 0; i03 < s0->ne[3]; i03++)
        for (int64_t i02 = 0; i02 < s0->ne[2]; i02++)
            for (int64_t i = r0; i < r1; i++) {
                const int64_t i1 = read_index(s1, i, i02 % s1->ne[1], i03 % s1->ne[2]);
                if (i1 < 0 || i1 >= d->ne[1]) {
                    gr_fail(job, GR_EXEC_EINDEX, "SET_ROWS index %lld out of range [0, %lld)",
                            (long long)i1, (long long)d->ne[1]);
                    return;
                }
                const char *src = s0->data + i * s0->nb[1] + i02 * s0->nb[2] + i03 * s0->nb[3];
                char *dst = d->data + i1 * d->nb[1] + i02 * d->nb[2] + i03 * d->nb[3];
                if (s0->type == d->type) {
                    memmove(dst, src, (size_t)n->iparams[0]);
                } else {
                    gr_load_f32(s0->type, src, s0->nb[0], buf, nc);
                    if (from_float) from_float(buf, dst, nc);
                    else gr_store_f32(d->type, dst, d->nb[0], buf, nc);
                }
            }
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
        int64_t i1, i2, i3;
        gr_row_index(s1, ir, &i1, &i2, &i3);
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

void gr_k_acc(gr_job *job, int phase) { acc_set(job, phase, 0); }
void gr_k_set(gr_job *job, int phase) { acc_set(job, phase, 1); }
