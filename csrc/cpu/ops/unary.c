/* Element-wise float functions (UNARY, SQR, SQRT, LOG, SIN, COS, LEAKY_RELU,
 * CLAMP), the gated linear units (GLU) and SCALE.
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
    GR_NODE_LOCALS(job);
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
        case GR_V_GLU_SILU_BACK: /* not a GLU op in ggml: src0 the gradient, src1 x */
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
    GR_NODE_LOCALS(job);
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
