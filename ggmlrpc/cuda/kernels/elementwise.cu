// elementwise.cu: ADD/SUB/MUL/DIV with broadcasting, ADD_ID, SCALE, the unary ops,
// the GLU ops, CONCAT and REPEAT (all F32). One thread per output element with a
// grid-stride loop, so any grid covers any shape.
#include "common.cuh"

// ids as ggml's enums: GGML_OP_ADD.. are mapped to these by the launcher
#define GR_BIN_ADD 0
#define GR_BIN_SUB 1
#define GR_BIN_MUL 2
#define GR_BIN_DIV 3

// dst: (ne3, ne2, ne1, ne0) f32 contiguous
// src0: same shape, byte strides nb01..nb03 (elements contiguous)
// src1: (ne13, ne12, ne11, ne10), each dim dividing src0's, byte strides nb11..nb13
extern "C" __global__ void binary_f32(int op, float *__restrict__ dst, const char *__restrict__ src0,
                                      const char *__restrict__ src1, int ne0, int ne1, int ne2, int ne3,
                                      long long nb01, long long nb02, long long nb03, int ne10, int ne11,
                                      int ne12, int ne13, long long nb11, long long nb12, long long nb13) {
    const long long n = (long long)ne0 * ne1 * ne2 * ne3;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int i0 = i % ne0, i1 = i / ne0 % ne1, i2 = i / ((long long)ne0 * ne1) % ne2,
                  i3 = i / ((long long)ne0 * ne1 * ne2);
        const float a = *(const float *)(src0 + i1 * nb01 + i2 * nb02 + i3 * nb03 + 4ll * i0);
        const float b = *(const float *)(src1 + (i1 % ne11) * nb11 + (i2 % ne12) * nb12 + (i3 % ne13) * nb13 +
                                         4ll * (i0 % ne10));
        float r;
        switch (op) {
        case GR_BIN_ADD: r = a + b; break;
        case GR_BIN_SUB: r = a - b; break;
        case GR_BIN_MUL: r = a * b; break;
        default: r = a / b; break;
        }
        dst[i] = r;
    }
}

// ADD_ID: dst[t][e][:] = a[t][e][:] + b[ids[t][e]][:]
// dst, a: (n_tokens, n_used, ne0) contiguous; b: (n_expert, ne0); ids: (n_tokens, n_used) i32
extern "C" __global__ void add_id_f32(float *__restrict__ dst, const float *__restrict__ a,
                                      const float *__restrict__ b, const int *__restrict__ ids, int ne0,
                                      int n_used, int n_tokens) {
    const int row = blockIdx.x;  // t * n_used + e
    if (row >= n_used * n_tokens) return;
    const float *br = b + (long long)ids[row] * ne0;
    for (int i = threadIdx.x; i < ne0; i += blockDim.x) dst[(long long)row * ne0 + i] = a[(long long)row * ne0 + i] + br[i];
}

// dst, x: (n,) contiguous
extern "C" __global__ void scale_f32(float *__restrict__ dst, const float *__restrict__ x, float s, float b,
                                     long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] = x[i] * s + b;
}

static __device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
static __device__ __forceinline__ float gelu_tanh(float x) {
    const float c = 0.79788456080286535588f;  // sqrt(2/pi)
    return 0.5f * x * (1.0f + tanhf(c * x * (1.0f + 0.044715f * x * x)));
}
static __device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f)); }
static __device__ __forceinline__ float gelu_quick(float x) { return x * sigmoidf(1.702f * x); }

// op: ggml's GGML_UNARY_OP_* value; p: XIELU's (alpha_n, alpha_p, beta, eps) as ggml stores them
static __device__ float unary(int op, float x, const float *p) {
    switch (op) {
    case 0: return fabsf(x);                                   // ABS
    case 1: return (float)((x > 0.f) - (x < 0.f));             // SGN
    case 2: return -x;                                         // NEG
    case 3: return x > 0.f ? 1.f : 0.f;                        // STEP
    case 4: return tanhf(x);                                   // TANH
    case 5: return x > 0.f ? x : expm1f(x);                    // ELU
    case 6: return x > 0.f ? x : 0.f;                          // RELU
    case 7: return sigmoidf(x);                                // SIGMOID
    case 8: return gelu_tanh(x);                               // GELU
    case 9: return gelu_quick(x);                              // GELU_QUICK
    case 10: return x * sigmoidf(x);                           // SILU
    case 11: return x * fminf(1.f, fmaxf(0.f, (x + 3.f) / 6.f));  // HARDSWISH
    case 12: return fminf(1.f, fmaxf(0.f, (x + 3.f) / 6.f));   // HARDSIGMOID
    case 13: return expf(x);                                   // EXP
    case 14: return expm1f(x);                                 // EXPM1
    case 15: return x > 20.f ? x : log1pf(expf(x));            // SOFTPLUS
    case 16: return gelu_erf(x);                               // GELU_ERF
    case 17:                                                   // XIELU
        return x > 0.f ? p[1] * x * x + p[2] * x : (expm1f(fminf(x, p[3])) - x) * p[0] + p[2] * x;
    case 18: return floorf(x);                                 // FLOOR
    case 19: return ceilf(x);                                  // CEIL
    case 20: return roundf(x);                                 // ROUND
    case 21: return truncf(x);                                 // TRUNC
    default: return __int_as_float(0x7fc00000);                // not supported: NaN
    }
}

// dst, x: (n,) contiguous
extern "C" __global__ void unary_f32(int op, float *__restrict__ dst, const float *__restrict__ x, long long n,
                                     float p0, float p1, float p2, float p3) {
    const float p[4] = {p0, p1, p2, p3};
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] = unary(op, x[i], p);
}

// GLU: dst[r][i] = act(a[r][i]) * b[r][i]
// dst: (nrows, nc) contiguous; a, b: rows of nc at element strides lda, ldb (the launcher
// points them at the two halves of one tensor, swapped or not, or at two tensors)
// op: ggml's GGML_GLU_OP_* value; alpha, limit: SWIGLU_OAI's parameters (limit: SWIGLU_CLAMP's)
extern "C" __global__ void glu_f32(int op, float *__restrict__ dst, const float *__restrict__ a,
                                   const float *__restrict__ b, int nc, int nrows, long long lda, long long ldb,
                                   float alpha, float limit) {
    const long long n = (long long)nc * nrows;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / nc, c = i % nc;
        float x = a[r * lda + c], y = b[r * ldb + c], g;
        switch (op) {
        case 0: g = x > 0.f ? x : 0.f; break;   // REGLU
        case 1: g = gelu_tanh(x); break;        // GEGLU
        case 2: g = x * sigmoidf(x); break;     // SWIGLU
        case 3:                                 // SWIGLU_OAI
            x = fminf(x, limit);
            y = fmaxf(fminf(y, limit), -limit);
            g = x / (1.0f + expf(-alpha * x));
            y += 1.0f;
            break;
        case 4: g = gelu_erf(x); break;         // GEGLU_ERF
        case 5: g = gelu_quick(x); break;       // GEGLU_QUICK
        case 6:                                 // SWIGLU_CLAMP
            x = fminf(x, limit);
            y = fmaxf(fminf(y, limit), -limit);
            g = x * sigmoidf(x);
            break;
        default: g = __int_as_float(0x7fc00000); break;
        }
        dst[i] = g * y;
    }
}

// CONCAT along `dim`: dst (ne3, ne2, ne1, ne0) contiguous; src0 (a3, a2, a1, a0) and src1
// contiguous, equal to dst's shape except along dim, where a[dim] + b[dim] == ne[dim]
extern "C" __global__ void concat_f32(float *__restrict__ dst, const float *__restrict__ src0,
                                      const float *__restrict__ src1, int dim, int ne0, int ne1, int ne2,
                                      int ne3, int a0, int a1, int a2, int a3) {
    const long long n = (long long)ne0 * ne1 * ne2 * ne3;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        int idx[4] = {(int)(i % ne0), (int)(i / ne0 % ne1), (int)(i / ((long long)ne0 * ne1) % ne2),
                      (int)(i / ((long long)ne0 * ne1 * ne2))};
        int s[4] = {a0, a1, a2, a3};
        const float *src = src0;
        if (idx[dim] >= s[dim]) {
            idx[dim] -= s[dim];
            int ne[4] = {ne0, ne1, ne2, ne3};
            s[0] = ne0; s[1] = ne1; s[2] = ne2; s[3] = ne3;
            s[dim] = ne[dim] - (dim == 0 ? a0 : dim == 1 ? a1 : dim == 2 ? a2 : a3);
            src = src1;
        }
        dst[i] = src[((long long)(idx[3] * s[2] + idx[2]) * s[1] + idx[1]) * s[0] + idx[0]];
    }
}

// REPEAT: dst (ne3, ne2, ne1, ne0) contiguous; src (s3, s2, s1, s0) contiguous, s[k] dividing ne[k]
extern "C" __global__ void repeat_f32(float *__restrict__ dst, const float *__restrict__ src, int ne0, int ne1,
                                      int ne2, int ne3, int s0, int s1, int s2, int s3) {
    const long long n = (long long)ne0 * ne1 * ne2 * ne3;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int i0 = i % ne0, i1 = i / ne0 % ne1, i2 = i / ((long long)ne0 * ne1) % ne2,
                  i3 = i / ((long long)ne0 * ne1 * ne2);
        dst[i] = src[((long long)((i3 % s3) * s2 + i2 % s2) * s1 + i1 % s1) * s0 + i0 % s0];
    }
}

// The element-wise ops that are ops of their own in ggml (not GGML_OP_UNARY).
// op: ggml's GGML_OP_* value; p0, p1: CLAMP's bounds, LEAKY_RELU's slope
// dst, x: (n,) contiguous
extern "C" __global__ void math_f32(int op, float *__restrict__ dst, const float *__restrict__ x, long long n,
                                    float p0, float p1) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float v = x[i];
        float r;
        switch (op) {
        case 9: r = v * v; break;                        // SQR
        case 10: r = sqrtf(v); break;                    // SQRT
        case 11: r = logf(v); break;                     // LOG
        case 12: r = sinf(v); break;                     // SIN
        case 13: r = cosf(v); break;                     // COS
        case 50: r = fminf(fmaxf(v, p0), p1); break;     // CLAMP
        case 71: r = v > 0.f ? v : p0 * v; break;        // LEAKY_RELU
        default: r = __int_as_float(0x7fc00000); break;  // not supported: NaN
        }
        dst[i] = r;
    }
}
