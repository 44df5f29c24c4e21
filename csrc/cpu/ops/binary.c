/* Element-wise binary ops: ADD / SUB / MUL / DIV with src1 broadcast, and ADD /
 * ADD1 on quantized src0.
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

/* ---- ADD / SUB / MUL / DIV ----------------------------------------------- */

static inline float binop(int op, float a, float b) {
    switch (op) {
    case GR_BIN_ADD: return a + b;
    case GR_BIN_SUB: return a - b;
    case GR_BIN_MUL: return a * b;
    default: return a / b;
    }
}

/* dst = src0 (op) src1, src1 repeated to src0's shape.
 *   src0, dst: (ne0, ne1, ne2, ne3); src1: (ne10, ne11, ne12, ne13), ne_i % ne1i == 0 */
void gr_k_binary(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *a = &n->src[0], *b = &n->src[1], *d = &n->dst;
    const int op = n->sub;
    const int64_t ne0 = d->ne[0], ne10 = b->ne[0];
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    const int all_f32 = a->type == GR_TYPE_F32 && b->type == GR_TYPE_F32 && d->type == GR_TYPE_F32 && b->nb[0] == 4;
    float *xa = gr_thread_f32(job, 3 * ne0 + 32);
    float *xb = xa + ne0 + 16;
    float *xd = xb + ne10 + 16;
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t i1 = ir % d->ne[1];
        const int64_t i2 = (ir / d->ne[1]) % d->ne[2];
        const int64_t i3 = ir / (d->ne[1] * d->ne[2]);
        const char *pa = a->data + i1 * a->nb[1] + i2 * a->nb[2] + i3 * a->nb[3];
        const char *pb = b->data + (i1 % b->ne[1]) * b->nb[1] + (i2 % b->ne[2]) * b->nb[2] +
                         (i3 % b->ne[3]) * b->nb[3];
        char *pd = d->data + i1 * d->nb[1] + i2 * d->nb[2] + i3 * d->nb[3];
        if (all_f32) {
            const float *fa = (const float *)pa, *fb = (const float *)pb;
            float *fd = (float *)pd;
            for (int64_t r = 0; r < ne0; r += ne10) {
                switch (op) {
                case GR_BIN_ADD: for (int64_t i = 0; i < ne10; i++) fd[r + i] = fa[r + i] + fb[i]; break;
                case GR_BIN_SUB: for (int64_t i = 0; i < ne10; i++) fd[r + i] = fa[r + i] - fb[i]; break;
                case GR_BIN_MUL: for (int64_t i = 0; i < ne10; i++) fd[r + i] = fa[r + i] * fb[i]; break;
                default:         for (int64_t i = 0; i < ne10; i++) fd[r + i] = fa[r + i] / fb[i]; break;
                }
            }
            continue;
        }
        gr_load_f32(a->type, pa, a->nb[0], xa, ne0);
        gr_load_f32(b->type, pb, b->nb[0], xb, ne10);
        for (int64_t i = 0; i < ne0; i++) xd[i] = binop(op, xa[i], xb[i % ne10]);
        gr_store_f32(d->type, pd, d->nb[0], xd, ne0);
    }
}

/* ---- ADD / ADD1 on quantized data ------------------------------------------------- */

/* Per row: dequantize src0, add src1's F32 row (sub 0, same shape) or the scalar
 * src1 (sub 1), quantize into dst (src0's type) or store F32.
 * src0 rows contiguous; src1 rows contiguous F32. */
void gr_k_add_q(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *a = &n->src[0], *b = &n->src[1], *d = &n->dst;
    const int64_t nc = a->ne[0];
    float *row = gr_thread_f32(job, nc);
    const ggmlrpc_to_float_fn to_float = ggmlrpc_get_to_float((uint32_t)a->type);
    const ggmlrpc_from_float_fn from_float = d->type == GR_TYPE_F32 ? NULL : ggmlrpc_get_from_float((uint32_t)d->type);
    float v = 0.0f;
    if (n->sub == GR_V_ADD_Q_ADD1) memcpy(&v, b->data, 4);
    int64_t r0, r1;
    gr_range(gr_nrows(a), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        to_float(gr_row(a, ir), row, nc);
        if (n->sub == GR_V_ADD_Q_ADD1) {
            for (int64_t i = 0; i < nc; i++) row[i] += v;
        } else {
            const float *y = (const float *)gr_row(b, ir);
            for (int64_t i = 0; i < nc; i++) row[i] += y[i];
        }
        if (from_float) from_float(row, gr_row(d, ir), nc);
        else memcpy(gr_row(d, ir), row, (size_t)nc * 4);
    }
}
