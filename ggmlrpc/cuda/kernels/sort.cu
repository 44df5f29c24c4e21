// sort.cu: ARGSORT (ascending or descending) and TOP_K of F32 rows: a bitonic sort of
// indices, one block per row. Rows up to 1024 (padded to a power of two) sort in
// shared memory with a thread per element; longer rows sort in a global scratch
// row with each of 1024 threads handling several elements per step.
#include "common.cuh"

// padding sorts last; otherwise by value in the requested order (0 ascending, 1 descending)
static __device__ __forceinline__ bool sorts_after(int a, int b, const float *xr, int ncols, int order) {
    if (a >= ncols || b >= ncols) return a >= ncols && b < ncols;
    return order == 0 ? xr[a] > xr[b] : xr[a] < xr[b];
}

// idx: ncols_pad ints this block owns (shared or global)
static __device__ void bitonic_argsort(int *idx, const float *xr, int ncols, int ncols_pad, int order) {
    for (int t = threadIdx.x; t < ncols_pad; t += blockDim.x) idx[t] = t;
    __syncthreads();
    for (int size = 2; size <= ncols_pad; size <<= 1) {
        for (int stride = size / 2; stride > 0; stride >>= 1) {
            for (int t = threadIdx.x; t < ncols_pad; t += blockDim.x) {
                const int o = t ^ stride;
                if (o <= t) continue;
                const int a = idx[t], b = idx[o];
                if (sorts_after(a, b, xr, ncols, order) == ((t & size) == 0)) {
                    idx[t] = b;
                    idx[o] = a;
                }
            }
            __syncthreads();
        }
    }
}

// dst: (nrows, k) i32, the first k indices of each sorted row; x: rows of ncols at stride ldx
// shared memory: ncols_pad ints; blockDim.x == ncols_pad <= 1024
extern "C" __global__ void argsort_f32(int *__restrict__ dst, const float *__restrict__ x, int ncols, int ncols_pad,
                                       long long ldx, int order, int k) {
    GR_DYNAMIC_SHARED(int, idx);
    bitonic_argsort(idx, x + blockIdx.x * ldx, ncols, ncols_pad, order);
    for (int t = threadIdx.x; t < k; t += blockDim.x) dst[(long long)blockIdx.x * k + t] = idx[t];
}

// the same for long rows; scratch: (nrows, ncols_pad) i32
extern "C" __global__ void argsort_f32_large(int *__restrict__ dst, int *__restrict__ scratch,
                                             const float *__restrict__ x, int ncols, int ncols_pad, long long ldx,
                                             int order, int k) {
    int *idx = scratch + (long long)blockIdx.x * ncols_pad;
    bitonic_argsort(idx, x + blockIdx.x * ldx, ncols, ncols_pad, order);
    for (int t = threadIdx.x; t < k; t += blockDim.x) dst[(long long)blockIdx.x * k + t] = idx[t];
}
