// softmax.cu: SOFT_MAX with scale, an optional mask (F32 or F16, broadcast over heads
// and sequences), ALiBi slopes (max_bias > 0) and optional per-head sinks.
// One block per row, three passes over the row (max, exp and sum, normalise).
#include "common.cuh"

// dst: (nrows, ncols) contiguous; x: rows at element stride ldx, ordered (i3, i2, i1)
//      with i1 < ne01, i2 < ne02 (the head)
// mask: (ne13, ne12, ne11, ncols) contiguous or null; row i1 of slice (i3 % ne13, i2 % ne12)
// sinks: (ne02,) or null
extern "C" __global__ void soft_max_f32(float *__restrict__ dst, const float *__restrict__ x, const void *mask,
                                        const float *__restrict__ sinks, int ncols, long long ldx, int ne01,
                                        int ne02, int ne11, int ne12, int ne13, int mask_f16, float scale,
                                        float max_bias, float m0, float m1, int n_head_log2) {
    __shared__ float scratch[32];
    const int row = blockIdx.x;
    const int i1 = row % ne01, i2 = row / ne01 % ne02, i3 = row / (ne01 * ne02);
    const float *xr = x + row * ldx;
    float *dr = dst + (long long)row * ncols;
    const long long mrow = ((long long)((i3 % ne13) * ne12 + i2 % ne12) * ne11 + i1) * ncols;
    const float *mf = mask && !mask_f16 ? (const float *)mask + mrow : nullptr;
    const __half *mh = mask && mask_f16 ? (const __half *)mask + mrow : nullptr;
    float slope = 1.0f;
    if (max_bias > 0.0f)
        slope = i2 < n_head_log2 ? powf(m0, i2 + 1) : powf(m1, 2 * (i2 - n_head_log2) + 1);

    float mx = -INFINITY;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const float m = mf ? mf[i] : mh ? __half2float(mh[i]) : 0.0f;
        const float v = xr[i] * scale + slope * m;
        dr[i] = v;
        mx = fmaxf(mx, v);
    }
    const float sink = sinks ? sinks[i2] : -INFINITY;
    mx = fmaxf(block_max(mx, scratch), sink);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const float e = expf(dr[i] - mx);
        dr[i] = e;
        sum += e;
    }
    sum = block_sum(sum, scratch) + (sinks ? expf(sink - mx) : 0.0f);
    const float inv = 1.0f / sum;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) dr[i] *= inv;
}
