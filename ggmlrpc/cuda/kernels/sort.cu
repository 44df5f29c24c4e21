// sort.cu: ARGSORT (ascending or descending) and TOP_K of F32 rows: a bitonic sort
// of indices in shared memory, one block of ncols_pad (a power of two, <= 1024)
// threads per row.
#include "common.cuh"

// dst: (nrows, k) i32, the first k indices of the sorted row; x: rows of ncols at stride ldx
// order: 0 ascending, 1 descending (GGML_SORT_ORDER_*)
extern "C" __global__ void argsort_f32(int *__restrict__ dst, const float *__restrict__ x, int ncols, int ncols_pad,
                                       long long ldx, int order, int k) {
    GR_DYNAMIC_SHARED(int, idx);
    const int t = threadIdx.x;
    const float *xr = x + blockIdx.x * ldx;
    idx[t] = t;
    __syncthreads();
    for (int size = 2; size <= ncols_pad; size <<= 1) {
        for (int stride = size / 2; stride > 0; stride >>= 1) {
            const int o = t ^ stride;
            if (o > t) {
                const int a = idx[t], b = idx[o];
                // padding sorts last; otherwise by value in the requested order
                bool a_after_b;
                if (a >= ncols || b >= ncols) a_after_b = a >= ncols && b < ncols;
                else a_after_b = order == 0 ? xr[a] > xr[b] : xr[a] < xr[b];
                const bool up = (t & size) == 0;
                if (a_after_b == up) {
                    idx[t] = b;
                    idx[o] = a;
                }
            }
            __syncthreads();
        }
    }
    if (t < k) dst[(long long)blockIdx.x * k + t] = idx[t];
}
