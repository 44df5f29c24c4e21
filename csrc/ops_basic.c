/* Element-wise, copy, row-index, normalization, softmax and rope kernels.
 *
 * Shapes and types were checked by the compiler (ggmlrpc/compute/cpu.py); a
 * kernel only walks each tensor inside its own ne/nb, so it stays inside the
 * memory the graph validation approved. Rows are split between threads with
 * gr_range(). Arithmetic follows ggml's CPU backend (ops.cpp, vec.h): the same
 * rounding points (F16 stores, double sums where ggml sums in double) and the
 * same fused multiply-adds where ggml's x86 build fuses.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "exec_impl.h"

/* ---- DUP / CPY / CONT ---------------------------------------------------- */

/* Copy src into dst element by element in logical (row-major) order; the two
 * may differ in shape and strides but hold the same number of elements.
 * Same types copy bytes; F32/F16/BF16/I32 convert through float.
 *   src: (ne00, ne01, ne02, ne03), dst: (ne0, ne1, ne2, ne3), same nelements */
/* node iparams: [0] element size for same-type copies, [1] bytes of a row for
 * same-shape block copies (quantized), [2] DUP_* mode, [3] block size when
 * quantized data of one type changes shape (whole blocks are the elements then) */
enum { DUP_PLAIN = 0, DUP_FROM_Q = 1, DUP_TO_Q = 2, DUP_FROM_Q_BLOCKS = 3 };

/* Quantized src0 into an F32 dst of another shape (ggml's dup_from_q): block k of
 * src0 in logical order dequantizes to dst elements k*qk .. k*qk+qk-1, which lie in
 * one dst row (ne0 % qk == 0) or run on in a contiguous dst; qk = iparams[3].
 *   src0: (ne00, ne01, ne02, ne03) blocks of qk, dst: F32 of the same element count */
static void dup_from_q_blocks(gr_job *job) {
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
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
    if (n->iparams[2] == DUP_FROM_Q_BLOCKS) {
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

    if (n->iparams[2] == DUP_FROM_Q) {          /* quantized rows -> F32 rows, same shape */
        ggmlrpc_to_float_fn to_float = ggmlrpc_get_to_float((uint32_t)src->type);
        for (int64_t ir = r0; ir < r1; ir++) to_float(gr_row(src, ir), (float *)gr_row(dst, ir), ne00);
        return;
    }
    if (n->iparams[2] == DUP_TO_Q) {            /* rows -> consecutive quantized rows of a contiguous dst */
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

/* ---- unary functions ------------------------------------------------------ */

static const float GELU_COEF_A = 0.044715f;
static const float GELU_QUICK_COEF = -1.702f;
static const float SQRT_2_OVER_PI = 0.79788456080286535587989211986876f;
static const float SQRT_2_INV = 0.70710678118654752440084436210484f;

/* as ggml's x86 build computes it: the compiler contracts 1 + A*x*x into one
 * fused multiply-add (the rest has no product added to anything) */
static inline float gelu_f32(float x) {
    return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * x * fmaf(GELU_COEF_A * x, x, 1.0f)));
}
static inline float gelu_quick_f32(float x) { return x * (1.0f / (1.0f + expf(GELU_QUICK_COEF * x))); }
static inline float round_f16(float x) { return gr_fp16_to_fp32(gr_fp32_to_fp16(x)); }

/* ggml evaluates GELU on F32 through a table indexed by the F16 input, so the
 * input and the result are both rounded to F16 (inputs beyond +-10 excepted). */
static inline float gelu_tab(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return round_f16(gelu_f32(round_f16(x)));
}
static inline float gelu_quick_tab(float x) { return round_f16(gelu_quick_f32(round_f16(x))); }
static inline float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * SQRT_2_INV)); }

/* y[i] = f(x[i]) for n floats; f16 says the data came from F16 (ggml skips the
 * F32 table paths there: its F16 tables give the same F16 result). */
static void unary_row(int op, const int32_t *p, int64_t n, float *y, const float *x, int f16) {
    float fp1, fp2, fp3, fp4;
    switch (op) {
    case GR_UN_ABS: for (int64_t i = 0; i < n; i++) y[i] = fabsf(x[i]); return;
    case GR_UN_SGN: for (int64_t i = 0; i < n; i++) y[i] = (x[i] > 0.f) ? 1.f : ((x[i] < 0.f) ? -1.f : 0.f); return;
    case GR_UN_NEG: for (int64_t i = 0; i < n; i++) y[i] = -x[i]; return;
    case GR_UN_STEP: for (int64_t i = 0; i < n; i++) y[i] = (x[i] > 0.f) ? 1.f : 0.f; return;
    case GR_UN_TANH: for (int64_t i = 0; i < n; i++) y[i] = tanhf(x[i]); return;
    case GR_UN_ELU: for (int64_t i = 0; i < n; i++) y[i] = (x[i] > 0.f) ? x[i] : expm1f(x[i]); return;
    case GR_UN_RELU: for (int64_t i = 0; i < n; i++) y[i] = (x[i] > 0.f) ? x[i] : 0.f; return;
    case GR_UN_SIGMOID: for (int64_t i = 0; i < n; i++) y[i] = 1.f / (1.f + expf(-x[i])); return;
    case GR_UN_GELU:
        if (f16) for (int64_t i = 0; i < n; i++) y[i] = gelu_f32(x[i]);
        else for (int64_t i = 0; i < n; i++) y[i] = gelu_tab(x[i]);
        return;
    case GR_UN_GELU_QUICK:
        if (f16) for (int64_t i = 0; i < n; i++) y[i] = gelu_quick_f32(x[i]);
        else for (int64_t i = 0; i < n; i++) y[i] = gelu_quick_tab(x[i]);
        return;
    case GR_UN_SILU:
        if (f16) for (int64_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i]));
        else gr_vec.silu(n, y, x);
        return;
    case GR_UN_HARDSWISH:
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * fminf(1.0f, fmaxf(0.0f, (x[i] + 3.0f) / 6.0f));
        return;
    case GR_UN_HARDSIGMOID:
        for (int64_t i = 0; i < n; i++) y[i] = fminf(1.0f, fmaxf(0.0f, (x[i] + 3.0f) / 6.0f));
        return;
    case GR_UN_EXP: for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]); return;
    case GR_UN_EXPM1: for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]) - 1.0f; return;
    case GR_UN_SOFTPLUS:
        for (int64_t i = 0; i < n; i++) y[i] = (x[i] > 20.0f) ? x[i] : logf(1.0f + expf(x[i]));
        return;
    case GR_UN_GELU_ERF: for (int64_t i = 0; i < n; i++) y[i] = gelu_erf(x[i]); return;
    case GR_UN_XIELU:
        /* op_params: [1] alpha_n, [2] alpha_p, [3] beta, [4] eps */
        memcpy(&fp1, &p[1], 4); memcpy(&fp2, &p[2], 4); memcpy(&fp3, &p[3], 4); memcpy(&fp4, &p[4], 4);
        for (int64_t i = 0; i < n; i++) {
            const float v = x[i];
            y[i] = v > 0.0f ? fp2 * v * v + fp3 * v : (expm1f(fminf(v, fp4)) - v) * fp1 + fp3 * v;
        }
        return;
    case GR_UN_FLOOR: for (int64_t i = 0; i < n; i++) y[i] = floorf(x[i]); return;
    case GR_UN_CEIL: for (int64_t i = 0; i < n; i++) y[i] = ceilf(x[i]); return;
    case GR_UN_ROUND: for (int64_t i = 0; i < n; i++) y[i] = roundf(x[i]); return;
    case GR_UN_TRUNC: for (int64_t i = 0; i < n; i++) y[i] = truncf(x[i]); return;
    case GR_UN_SQR: for (int64_t i = 0; i < n; i++) y[i] = x[i] * x[i]; return;
    case GR_UN_SQRT: for (int64_t i = 0; i < n; i++) y[i] = sqrtf(x[i]); return;
    case GR_UN_LOG: for (int64_t i = 0; i < n; i++) y[i] = logf(x[i]); return;
    case GR_UN_SIN: for (int64_t i = 0; i < n; i++) y[i] = sinf(x[i]); return;
    case GR_UN_COS: for (int64_t i = 0; i < n; i++) y[i] = cosf(x[i]); return;
    case GR_UN_CLAMP:   /* op_params: [0] min, [1] max */
        memcpy(&fp1, &p[0], 4);
        memcpy(&fp2, &p[1], 4);
        for (int64_t i = 0; i < n; i++) {
            const float v = x[i] < fp2 ? x[i] : fp2;
            y[i] = v > fp1 ? v : fp1;
        }
        return;
    case GR_UN_LEAKY_RELU:
        memcpy(&fp1, &p[0], 4);
        for (int64_t i = 0; i < n; i++) y[i] = ((x[i] > 0.f) ? x[i] : 0.f) + fp1 * ((x[i] < 0.0f) ? x[i] : 0.f);
        return;
    default:
        for (int64_t i = 0; i < n; i++) y[i] = x[i];
    }
}

/* dst = f(src0), same shape; rows contiguous in dim 0. */
void gr_k_unary(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    const int64_t ne0 = d->ne[0];
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    float *x = gr_thread_f32(job, 2 * ne0 + 16);
    float *y = x + ne0 + 16;
    for (int64_t ir = r0; ir < r1; ir++) {
        gr_load_f32(s->type, gr_row(s, ir), s->nb[0], x, ne0);
        unary_row(n->sub, n->op_params, ne0, y, x, s->type != GR_TYPE_F32);
        gr_store_f32(d->type, gr_row(d, ir), d->nb[0], y, ne0);
    }
}

/* ---- GLU ------------------------------------------------------------------ */

/* dst = f(a) * b, where a and b are src0 and src1 or the two halves of src0
 * (op_params[1] swaps the halves).
 *   src0: (nc or 2*nc, rows), src1: (nc, rows) or none, dst: (nc, rows) */
void gr_k_glu(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s0 = &n->src[0], *s1 = n->n_src > 1 ? &n->src[1] : NULL, *d = &n->dst;
    const int64_t nc = d->ne[0];
    const int swapped = n->op_params[1];
    float alpha, limit;
    memcpy(&alpha, &n->op_params[2], 4);
    memcpy(&limit, &n->op_params[3], 4);
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    float *xa = gr_thread_f32(job, 3 * nc + 32);
    float *xb = xa + nc + 16;
    float *y = xb + nc + 16;
    const int f16 = s0->type == GR_TYPE_F16, bf16 = s0->type == GR_TYPE_BF16;
    for (int64_t ir = r0; ir < r1; ir++) {
        const char *p0 = gr_row(s0, ir);
        const char *pa, *pb;
        int32_t tb = s0->type;
        if (s1) {
            pa = p0;
            pb = gr_row(s1, ir);
            tb = s1->type;
        } else {
            const int64_t half = nc * s0->nb[0];
            pa = p0 + (swapped ? half : 0);
            pb = p0 + (swapped ? 0 : half);
        }
        gr_load_f32(s0->type, pa, s0->nb[0], xa, nc);
        gr_load_f32(tb, pb, s1 ? s1->nb[0] : s0->nb[0], xb, nc);
        switch (n->sub) {
        case 0: /* REGLU */
            for (int64_t i = 0; i < nc; i++) y[i] = xa[i] > 0.0f ? xa[i] * xb[i] : 0.0f;
            break;
        case 1: /* GEGLU: F16 data goes through ggml's F16 table, F32 too within +-10; BF16 exact */
            if (bf16) {
                for (int64_t i = 0; i < nc; i++) y[i] = gelu_f32(xa[i]) * xb[i];
            } else if (f16) {
                for (int64_t i = 0; i < nc; i++) y[i] = round_f16(gelu_f32(xa[i])) * xb[i];
            } else {
                for (int64_t i = 0; i < nc; i++)
                    y[i] = xa[i] <= -10.0f ? 0.0f : xa[i] >= 10.0f ? xa[i] * xb[i] : gelu_tab(xa[i]) * xb[i];
            }
            break;
        case 2: /* SWIGLU */
            if (f16 || bf16) for (int64_t i = 0; i < nc; i++) y[i] = (xa[i] / (1.0f + expf(-xa[i]))) * xb[i];
            else gr_vec.swiglu(nc, y, xa, xb);
            break;
        case 3: /* SWIGLU_OAI: x clamped above, g clamped both ways, g + 1 */
            for (int64_t i = 0; i < nc; i++) {
                const float x = fminf(xa[i], limit);
                const float g = fmaxf(fminf(xb[i], limit), -limit);
                const float out_glu = x / (1.0f + expf(alpha * (-x)));
                y[i] = out_glu * (g + 1.0f);
            }
            break;
        case 4: /* GEGLU_ERF */
            for (int64_t i = 0; i < nc; i++) y[i] = gelu_erf(xa[i]) * xb[i];
            break;
        case 5: /* GEGLU_QUICK: through the F16 table for F16 and F32 data alike; BF16 exact */
            if (bf16) for (int64_t i = 0; i < nc; i++) y[i] = gelu_quick_f32(xa[i]) * xb[i];
            else if (f16) for (int64_t i = 0; i < nc; i++) y[i] = round_f16(gelu_quick_f32(xa[i])) * xb[i];
            else for (int64_t i = 0; i < nc; i++) y[i] = gelu_quick_tab(xa[i]) * xb[i];
            break;
        case 7: /* SILU_BACK (not a GLU op in ggml): src0 the gradient, src1 x */
            for (int64_t i = 0; i < nc; i++) {
                const float s = 1.0f / (1.0f + expf(-xb[i]));
                y[i] = (xa[i] * s) * fmaf(xb[i], 1.0f - s, 1.0f);
            }
            break;
        default: /* SWIGLU_CLAMP: silu(min(x, limit)) * clamp(g, -limit, limit) */
            for (int64_t i = 0; i < nc; i++) {
                const float x = fminf(xa[i], limit);
                const float g = fmaxf(fminf(xb[i], limit), -limit);
                y[i] = (x / (1.0f + expf(-x))) * g;
            }
            break;
        }
        gr_store_f32(d->type, gr_row(d, ir), d->nb[0], y, nc);
    }
}

/* ---- SCALE ---------------------------------------------------------------- */

/* dst = src0*s + b (fused when b != 0, as ggml's vector path); BF16 rows are
 * computed in float (fused, as ggml's compiled scalar loop) and rounded back.
 *   src0, dst: (ne0, rows), F32 or BF16, same type */
void gr_k_scale(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    float sc, b;
    memcpy(&sc, &n->op_params[0], 4);
    memcpy(&b, &n->op_params[1], 4);
    const int64_t ne0 = d->ne[0];
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    if (s->type == GR_TYPE_BF16) {
        for (int64_t ir = r0; ir < r1; ir++) {
            const uint16_t *x = (const uint16_t *)gr_row(s, ir);
            uint16_t *y = (uint16_t *)gr_row(d, ir);
            for (int64_t i = 0; i < ne0; i++) y[i] = gr_fp32_to_bf16(fmaf(sc, gr_bf16_to_fp32(x[i]), b));
        }
        return;
    }
    for (int64_t ir = r0; ir < r1; ir++) {
        const float *x = (const float *)gr_row(s, ir);
        float *y = (float *)gr_row(d, ir);
        if (b == 0.0f) for (int64_t i = 0; i < ne0; i++) y[i] = x[i] * sc;
        else for (int64_t i = 0; i < ne0; i++) y[i] = fmaf(x[i], sc, b);
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

/* ---- norms ------------------------------------------------------------------ */

/* RMS_NORM (sub 0): y = x / sqrt(mean(x^2) + eps); L2_NORM (sub 1):
 * y = x / max(sqrt(sum(x^2)), eps). Per row; the sum of squares is kept in
 * double with each square rounded to float first, as ggml does. L2_NORM also
 * takes rows with element strides (permuted views); RMS_NORM needs packed rows.
 *   src0, dst: (ne0, rows) F32 */
void gr_k_rms_norm(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    float eps;
    memcpy(&eps, &n->op_params[0], 4);
    const int64_t ne0 = s->ne[0];
    int64_t r0, r1;
    gr_range(gr_nrows(s), job->ith, job->nth, &r0, &r1);
    const int packed = s->nb[0] == 4 && d->nb[0] == 4;
    for (int64_t ir = r0; ir < r1; ir++) {
        if (!packed) {      /* L2_NORM of a strided row */
            const char *x = gr_row(s, ir);
            char *y = gr_row(d, ir);
            double sum = 0.0;
            for (int64_t i = 0; i < ne0; i++) {
                const float xi = *(const float *)(x + i * s->nb[0]);
                sum += (double)(xi * xi);
            }
            const float scale = 1.0f / fmaxf(sqrtf((float)sum), eps);
            for (int64_t i = 0; i < ne0; i++)
                *(float *)(y + i * d->nb[0]) = *(const float *)(x + i * s->nb[0]) * scale;
            continue;
        }
        const float *x = (const float *)gr_row(s, ir);
        float *y = (float *)gr_row(d, ir);
        double sum = 0.0;
        for (int64_t i = 0; i < ne0; i++) sum += (double)(x[i] * x[i]);
        const float scale = n->sub ? 1.0f / fmaxf(sqrtf((float)sum), eps)
                                   : 1.0f / sqrtf((float)(sum / ne0) + eps);
        for (int64_t i = 0; i < ne0; i++) y[i] = x[i] * scale;
    }
}

/* Strided rows (permuted views): ggml sums the row and the centred squares in
 * float, one element after another (the squares fused into the sum). */
static void norm_row_strided(const gr_tensor *s, const gr_tensor *d, int64_t ir, float eps) {
    const int64_t ne0 = s->ne[0];
    const char *x = gr_row(s, ir);
    char *y = gr_row(d, ir);
    float sum = 0.0f;
    for (int64_t i = 0; i < ne0; i++) sum += *(const float *)(x + i * s->nb[0]);
    const float mean = sum / ne0;
    float variance = 0.0f;
    for (int64_t i = 0; i < ne0; i++) {
        const float v = *(const float *)(x + i * s->nb[0]) - mean;
        *(float *)(y + i * d->nb[0]) = v;
        variance = fmaf(v, v, variance);
    }
    variance /= ne0;
    const float scale = 1.0f / sqrtf(variance + eps);
    for (int64_t i = 0; i < ne0; i++) *(float *)(y + i * d->nb[0]) *= scale;
}

/* y = (x - mean) / sqrt(var + eps) per row
 *   src0, dst: (ne0, rows) F32 */
void gr_k_norm(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    float eps;
    memcpy(&eps, &n->op_params[0], 4);
    const int64_t ne0 = s->ne[0];
    int64_t r0, r1;
    gr_range(gr_nrows(s), job->ith, job->nth, &r0, &r1);
    if (s->nb[0] != 4 || d->nb[0] != 4) {
        for (int64_t ir = r0; ir < r1; ir++) norm_row_strided(s, d, ir, eps);
        return;
    }
    for (int64_t ir = r0; ir < r1; ir++) {
        const float *x = (const float *)gr_row(s, ir);
        float *y = (float *)gr_row(d, ir);
        double sum = 0.0;
        for (int64_t i = 0; i < ne0; i++) sum += (double)x[i];
        const float mean = (float)((float)sum / ne0);
        /* centred squares: 8-lane partial sums reduced like ggml's vector path */
        double var = 0.0;
        int64_t i = 0;
        for (; i + 7 < ne0; i += 8) {
            float v[8], t[4];
            for (int l = 0; l < 8; l++) {
                y[i + l] = x[i + l] - mean;
                v[l] = y[i + l] * y[i + l];
            }
            for (int l = 0; l < 4; l++) t[l] = v[l + 4] + v[l];
            var += (double)((t[0] + t[2]) + (t[1] + t[3]));
        }
        for (; i < ne0; i++) {
            const float v = x[i] - mean;
            y[i] = v;
            var += (double)(v * v);
        }
        const float variance = (float)(var / ne0);
        const float scale = 1.0f / sqrtf(variance + eps);
        for (int64_t k = 0; k < ne0; k++) y[k] *= scale;
    }
}

/* Normalize groups of channels (dim 2): n_groups = op_params[0], eps = op_params[1].
 *   src0, dst: (ne0, ne1, ne2 channels, ne3); contiguous */
void gr_k_group_norm(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    const int n_groups = n->op_params[0];
    float eps;
    memcpy(&eps, &n->op_params[1], 4);
    const int64_t ne0 = s->ne[0], ne1 = s->ne[1], ne2 = s->ne[2], ne3 = s->ne[3];
    const int64_t n_channels = ne2;
    const int64_t per_group = (n_channels + n_groups - 1) / n_groups;
    /* groups past the last channel are empty: stop there, not after n_groups (up to 2^31) */
    for (int64_t g = job->ith; g < n_groups && g * per_group < n_channels; g += job->nth) {
        const int64_t start = g * per_group;
        int64_t end = start + per_group;
        if (end > n_channels) end = n_channels;
        const int64_t step = end - start;
        if (step <= 0) continue;
        for (int64_t i3 = 0; i3 < ne3; i3++) {
            double sum = 0.0;
            for (int64_t i2 = start; i2 < end; i2++)
                for (int64_t i1 = 0; i1 < ne1; i1++) {
                    const float *x = (const float *)gr_at(s, 0, i1, i2, i3);
                    double sumr = 0.0;
                    for (int64_t i0 = 0; i0 < ne0; i0++) sumr += (double)x[i0];
                    sum += sumr;
                }
            const float mean = (float)(sum / (double)(ne0 * ne1 * step));
            double sum2 = 0.0;
            for (int64_t i2 = start; i2 < end; i2++)
                for (int64_t i1 = 0; i1 < ne1; i1++) {
                    const float *x = (const float *)gr_at(s, 0, i1, i2, i3);
                    float *y = (float *)gr_at(d, 0, i1, i2, i3);
                    double sumr = 0.0;
                    for (int64_t i0 = 0; i0 < ne0; i0++) {
                        const float v = x[i0] - mean;
                        y[i0] = v;
                        sumr += (double)(v * v);
                    }
                    sum2 += sumr;
                }
            const float variance = (float)(sum2 / (double)(ne0 * ne1 * step));
            const float scale = 1.0f / sqrtf(variance + eps);
            for (int64_t i2 = start; i2 < end; i2++)
                for (int64_t i1 = 0; i1 < ne1; i1++) {
                    float *y = (float *)gr_at(d, 0, i1, i2, i3);
                    for (int64_t i0 = 0; i0 < ne0; i0++) y[i0] *= scale;
                }
        }
    }
}

/* ---- SOFT_MAX ------------------------------------------------------------------ */

static inline float alibi_slope(float max_bias, uint32_t n_head, uint32_t h) {
    if (!(max_bias > 0.0f)) return 1.0f;
    const uint32_t n_head_log2 = 1u << (uint32_t)floor(log2((double)n_head));
    const float m0 = powf(2.0f, -(max_bias) / n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / n_head_log2);
    return h < n_head_log2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n_head_log2) + 1));
}

/* dst = softmax(src0*scale + slope*mask) per row, with optional sinks.
 *   src0, dst: (ne00, ne01, ne02 heads, ne03); mask: (>= ne00, >= ne01, ne12 | ne02, ne13 | ne03)
 *   F16/F32; sinks: (ne02) F32 */
void gr_k_soft_max(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    const gr_tensor *m = n->n_src > 1 && n->src[1].data ? &n->src[1] : NULL;
    const gr_tensor *sk = n->n_src > 2 && n->src[2].data ? &n->src[2] : NULL;
    float scale, max_bias;
    memcpy(&scale, &n->op_params[0], 4);
    memcpy(&max_bias, &n->op_params[1], 4);
    const int64_t ne00 = s->ne[0];
    float *wp = gr_thread_f32(job, ne00);
    int64_t r0, r1;
    gr_range(gr_nrows(s), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t i1 = ir % s->ne[1];
        const int64_t i2 = (ir / s->ne[1]) % s->ne[2];
        const int64_t i3 = ir / (s->ne[1] * s->ne[2]);
        const float slope = alibi_slope(max_bias, (uint32_t)s->ne[2], (uint32_t)i2);
        const float *sp = (const float *)gr_at(s, 0, i1, i2, i3);
        float *dp = (float *)gr_at(d, 0, i1, i2, i3);
        for (int64_t i = 0; i < ne00; i++) wp[i] = sp[i] * scale;
        if (m) {
            const char *mp = gr_at(m, 0, i1, i2 % m->ne[2], i3 % m->ne[3]);
            if (m->type == GR_TYPE_F16) {
                const uint16_t *mh = (const uint16_t *)mp;
                for (int64_t i = 0; i < ne00; i++) wp[i] = fmaf(slope, gr_fp16_to_fp32(mh[i]), wp[i]);
            } else {
                const float *mf = (const float *)mp;
                for (int64_t i = 0; i < ne00; i++) wp[i] = fmaf(slope, mf[i], wp[i]);
            }
        }
        float max = -INFINITY;
        for (int64_t i = 0; i < ne00; i++) max = max > wp[i] ? max : wp[i];
        float sink = 0.0f;
        if (sk) {
            memcpy(&sink, sk->data + i2 * sk->nb[0], 4);
            if (sink > max) max = sink;
        }
        double sum = gr_vec.soft_max(ne00, dp, wp, max);
        if (sk) sum += (double)expf(sink - max);
        const float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < ne00; i++) dp[i] *= inv;
    }
}

/* ---- ROPE ---------------------------------------------------------------------- */

static float rope_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return n_dims * logf(n_ctx_orig / (n_rot * 2 * (float)M_PI)) / (2 * logf(base));
}

static inline void rope_yarn(float theta_extrap, float freq_scale, const float corr[2], int64_t i0,
                             float ext_factor, float mscale, float *c, float *s) {
    const float theta_interp = freq_scale * theta_extrap;
    float theta = theta_interp;
    if (ext_factor != 0.0f) {
        const float y = (i0 / 2 - corr[0]) / fmaxf(0.001f, corr[1] - corr[0]);
        const float ramp_mix = (1 - fminf(1, fmaxf(0, y))) * ext_factor;
        theta = fmaf(theta_interp, 1 - ramp_mix, theta_extrap * ramp_mix);
        mscale *= fmaf(0.1f, logf(1.0f / freq_scale), 1.0f);
    }
    *c = cosf(theta) * mscale;
    *s = sinf(theta) * mscale;
}

enum { ROPE_NEOX = 2, ROPE_MROPE = 8, ROPE_VISION = 24, ROPE_IMROPE = 40 };

/* cos/sin pairs for one position (or four, for multi-section rope) */
static void rope_cache(const gr_node *n, const float *pos4, float freq_scale, const float *ff,
                       const float corr[2], int64_t ne0, float ext_factor, float attn_factor,
                       float theta_scale, float *cache) {
    const int mode = n->op_params[2];
    const int *sections = &n->op_params[11];
    if (!(mode & ROPE_MROPE)) {
        float theta = pos4[0];
        for (int64_t i0 = 0; i0 < ne0; i0 += 2) {
            const float f = ff ? ff[i0 / 2] : 1.0f;
            rope_yarn(theta / f, freq_scale, corr, i0, ext_factor, attn_factor, &cache[i0], &cache[i0 + 1]);
            theta *= theta_scale;
        }
        return;
    }
    const int is_imrope = mode == ROPE_IMROPE, indep = mode == ROPE_VISION;
    float tt = pos4[0], th = pos4[1], tw = pos4[2], te = pos4[3];
    const int sect_dims = sections[0] + sections[1] + sections[2] + sections[3];
    const int sec_w = sections[1] + sections[0];
    const int sec_e = sections[2] + sec_w;
    for (int64_t i0 = 0; i0 < ne0; i0 += 2) {
        const float f = ff ? ff[i0 / 2] : 1.0f;
        const int sector = (int)((i0 / 2) % sect_dims);
        if (indep) {
            if (sector == 0) tt = pos4[0];
            else if (sector == sections[0]) th = pos4[1];
            else if (sector == sec_w) tw = pos4[2];
            else if (sector == sec_e) te = pos4[3];
        }
        float theta = tt;
        if (is_imrope) {
            if (sector % 3 == 1 && sector < 3 * sections[1]) theta = th;
            else if (sector % 3 == 2 && sector < 3 * sections[2]) theta = tw;
            else if (sector % 3 == 0 && sector < 3 * sections[0]) theta = tt;
            else theta = te;
        } else {
            if (sector >= sections[0] && sector < sec_w) theta = th;
            else if (sector >= sec_w && sector < sec_w + sections[2]) theta = tw;
            else if (sector >= sec_w + sections[2]) theta = te;
        }
        rope_yarn(theta / f, freq_scale, corr, i0, ext_factor, attn_factor, &cache[i0], &cache[i0 + 1]);
        tt *= theta_scale;
        tw *= theta_scale;
        th *= theta_scale;
        te *= theta_scale;
    }
}

/* Rotary embedding (sub: 0 forward, 1 backward = rotate by -theta).
 *   src0, dst: (ne0, heads, tokens, ne3) F32/F16; src1: positions (tokens [x4 for mrope]) I32;
 *   src2: frequency factors (>= n_dims/2) F32 or absent */
void gr_k_rope(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *s = &n->src[0], *d = &n->dst;
    const int32_t *pos = (const int32_t *)n->src[1].data;
    const float *ff = n->n_src > 2 && n->src[2].data ? (const float *)n->src[2].data : NULL;
    const int n_dims = n->op_params[1], mode = n->op_params[2], n_ctx_orig = n->op_params[4];
    const int n_offs = n->op_params[15];
    float freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow;
    memcpy(&freq_base, &n->op_params[5], 4);
    memcpy(&freq_scale, &n->op_params[6], 4);
    memcpy(&ext_factor, &n->op_params[7], 4);
    memcpy(&attn_factor, &n->op_params[8], 4);
    memcpy(&beta_fast, &n->op_params[9], 4);
    memcpy(&beta_slow, &n->op_params[10], 4);
    const float sin_sign = n->sub ? -1.0f : 1.0f;
    const int64_t ne0 = d->ne[0], ne1 = d->ne[1], ne2 = d->ne[2];
    const int64_t esz = s->type == GR_TYPE_F32 ? 4 : 2;
    const float theta_scale = powf(freq_base, -2.0f / n_dims);
    float corr[2];
    {
        const float start = floorf(rope_corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base));
        const float end = ceilf(rope_corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base));
        corr[0] = fmaxf(0.0f, start);
        corr[1] = fminf((float)(n_dims - 1), end);
    }
    const int mrope = (mode & ROPE_MROPE) != 0;
    const int vision = mode == ROPE_VISION;
    float *cache = gr_thread_f32(job, ne0);
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    int64_t last_i2 = -1;
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t i1 = ir % ne1;
        const int64_t i2 = (ir / ne1) % ne2;
        const int64_t i3 = ir / (ne1 * ne2);
        if (i2 != last_i2) {
            float p4[4] = { (float)pos[i2], 0.0f, 0.0f, 0.0f };
            if (mrope) {
                p4[1] = (float)pos[i2 + ne2];
                p4[2] = (float)pos[i2 + 2 * ne2];
                p4[3] = (float)pos[i2 + 3 * ne2];
            }
            /* ggml fills the cache for all of ne0; only the rotated pairs are read,
             * and the angles are built in order, so stopping there changes nothing */
            const int64_t nc = vision ? ne0 : n_dims;
            rope_cache(n, p4, freq_scale, ff, corr, nc, ext_factor, attn_factor, theta_scale, cache);
            for (int64_t i0 = 1; i0 < nc; i0 += 2) cache[i0] *= sin_sign;
            last_i2 = i2;
        }
        const char *src = gr_at(s, 0, i1, i2, i3);
        char *dst = gr_at(d, 0, i1, i2, i3);
        if (vision) {
            gr_vec.rope_rotate(s->type, dst, src, (ne0 + 1) / 2, 1, n_dims, cache);
            continue;
        }
        const char *so = src + n_offs * esz;
        char *dof = dst + n_offs * esz;
        if (mode == 0) gr_vec.rope_rotate(s->type, dof, so, (n_dims + 1) / 2, 2, 1, cache);
        else gr_vec.rope_rotate(s->type, dof, so, (n_dims + 1) / 2, 1, n_dims / 2, cache);
        /* channels outside [n_offs, n_offs + n_dims) pass through */
        if (src != dst) {
            if (n_offs > 0) memmove(dst, src, (size_t)(n_offs * esz));
            if (n_offs + n_dims < ne0)
                memmove(dst + (n_offs + n_dims) * esz, src + (n_offs + n_dims) * esz,
                        (size_t)((ne0 - n_offs - n_dims) * esz));
        }
    }
}
