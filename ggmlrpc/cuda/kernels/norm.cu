// norm.cu: RMS_NORM, NORM, L2_NORM over rows. One block per row; the block size is
// a multiple of 32 (32 for short rows, more for long ones).
#include "common.cuh"

#define GR_NORM_RMS 0
#define GR_NORM_MEAN_VAR 1
#define GR_NORM_L2 2

// dst: (nrows, ncols) contiguous; x: nrows rows of ncols at element stride ldx
extern "C" __global__ void norm_f32(int kind, float *__restrict__ dst, const float *__restrict__ x, int ncols,
                                    long long ldx, float eps) {
    __shared__ float scratch[32];
    const float *xr = x + blockIdx.x * ldx;
    float *dr = dst + (long long)blockIdx.x * ncols;
    float mean = 0.0f;
    if (kind == GR_NORM_MEAN_VAR) {
        float s = 0.0f;
        for (int i = threadIdx.x; i < ncols; i += blockDim.x) s += xr[i];
        mean = block_sum(s, scratch) / ncols;
    }
    float s2 = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const float v = xr[i] - mean;
        s2 += v * v;
    }
    s2 = block_sum(s2, scratch);
    const float scale = kind == GR_NORM_L2 ? 1.0f / fmaxf(sqrtf(s2), eps) : rsqrtf(s2 / ncols + eps);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) dr[i] = (xr[i] - mean) * scale;
}

// SUM_ROWS (mean == 0) and MEAN (mean == 1): dst (nrows,); x: rows of ncols at stride ldx
extern "C" __global__ void row_sum_f32(int mean, float *__restrict__ dst, const float *__restrict__ x, int ncols,
                                       long long ldx) {
    __shared__ float scratch[32];
    const float *xr = x + blockIdx.x * ldx;
    float s = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) s += xr[i];
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) dst[blockIdx.x] = mean ? s / ncols : s;
}
