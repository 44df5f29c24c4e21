// matmul.cu: MUL_MAT and MUL_MAT_ID.  dst[z][c][r] = sum_k W[mat][r][k] * X[z][c][k]
//   W: weights, rows of ncols (K) elements of type T, byte strides w_row, w_mat
//   X: activations f32, columns of K at float strides x_col, x_mat
//   dst: f32, columns of nrows (N) at float strides d_col, d_mat
//   plain: mat = z / r2 (ggml's broadcast of W over batches)
//   ID:    mat = ids[z * ids_ld + c], and X's column is c % ne11 (z is the token)
// Strategies (the launcher picks one):
//   mul_mat_vec_q_<T>: decode, quant W. X first quantized to q8_1 blocks, then per
//     32-value sub-block an int8 dot product with __dp4a, scaled per group of 16.
//   mul_mat_vec_<T>:   decode, any W: dequantize W on the fly, f32 dot products.
//   mul_mat_tiled_<T>: prompts: 32x32 output tiles, W dequantized into shared memory,
//     tensor cores (TF32) from sm_80 on, FMAs elsewhere.
#include "common.cuh"

#define GR_MMV_WARPS 4  // weight rows (one per warp) per block of the mat-vec kernels
#define GR_TILE 32
#define GR_TILE_THREADS 16  // 16x16 threads, 2x2 outputs each

// ---- activations to q8_1 ----
// x: columns of ncols f32 at float strides x_col, x_mat (column r = z * ncols_y + c)
// y: (nz, ncols_y, ncols_pad / 32) q8_1 blocks, zero past ncols
extern "C" __global__ void quantize_q8_1(block_q8_1 *__restrict__ y, const float *__restrict__ x, int ncols,
                                         int ncols_pad, int ncols_y, long long x_col, long long x_mat) {
    const int nb = ncols_pad / QK8_1;
    const int ib = blockIdx.x * blockDim.y + threadIdx.y, r = blockIdx.y, lane = threadIdx.x;
    if (ib >= nb) return;  // whole warps leave together
    const float *xr = x + (r / ncols_y) * x_mat + (r % ncols_y) * x_col;
    const int i = ib * QK8_1 + lane;
    const float v = i < ncols ? xr[i] : 0.0f;
    const float amax = warp_max(fabsf(v)), sum = warp_sum(v);
    const float d = amax / 127.0f;
    block_q8_1 *b = y + (long long)r * nb + ib;
    b->qs[lane] = amax == 0.0f ? 0 : (int8_t)roundf(v / d);
    if (lane == 0) b->ds = __floats2half2_rn(d, sum);
}

struct mm_args {  // where one warp's row, matrix and column are
    const char *w;
    long long y_off, d_off;
};

static __device__ __forceinline__ mm_args mm_locate(const char *W, const int *ids, int row, int c, int z,
                                                    long long w_row, long long w_mat, long long y_col,
                                                    long long y_mat, long long d_col, long long d_mat, int r2,
                                                    int ne11, int ids_ld) {
    const int mat = ids ? ids[(long long)z * ids_ld + c] : z / r2;
    const int yc = ids ? c % ne11 : c;
    mm_args a;
    a.w = W + mat * w_mat + row * w_row;
    a.y_off = z * y_mat + yc * y_col;
    a.d_off = z * d_mat + c * d_col + row;
    return a;
}

// ---- MMVQ: quant W x q8_1 X with dp4a ----
// Y: q8_1 blocks, columns at block strides y_col, y_mat. A block handles columns
// [c0, c0 + cols_per_block) with c0 = blockIdx.y * cols_per_block (plain: up to
// GR_MMVQ_COLS columns, so each weight is read once for all of them; ID: one).
#define GR_MMVQ_COLS 8
template <class T>
static __device__ void mul_mat_vec_q(const char *__restrict__ W, const block_q8_1 *__restrict__ Y,
                                     float *__restrict__ dst, const int *__restrict__ ids, int ncols, int nrows,
                                     int ncols_y, int cols_per_block, long long w_row, long long w_mat,
                                     long long y_col, long long y_mat, long long d_col, long long d_mat, int r2,
                                     int ne11, int ids_ld) {
    const int row = blockIdx.x * blockDim.y + threadIdx.y, lane = threadIdx.x;
    if (row >= nrows) return;  // whole warps leave together
    const int c0 = blockIdx.y * cols_per_block, nc = min(cols_per_block, ncols_y - c0);
    const mm_args a = mm_locate(W, ids, row, c0, blockIdx.z, w_row, w_mat, y_col, y_mat, d_col, d_mat, r2, ne11,
                                ids_ld);
    const typename T::block *wb = (const typename T::block *)a.w;
    const block_q8_1 *yb = Y + a.y_off;
    constexpr int spb = T::qk / 32;  // 32-value sub-blocks per block
    float acc[GR_MMVQ_COLS];
#pragma unroll
    for (int c = 0; c < GR_MMVQ_COLS; c++) acc[c] = 0.0f;
    for (int s = lane; s < ncols / 32; s += GR_WARP) {
        const typename T::block *b = wb + s / spb;
        const int j0 = 32 * (s % spb);
        int q[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int j = j0 + 4 * i;
            q[i] = (T::q(b, j) & 0xff) | (T::q(b, j + 1) & 0xff) << 8 | (T::q(b, j + 2) & 0xff) << 16 |
                   (int)((unsigned)(T::q(b, j + 3) & 0xff) << 24);
        }
        const float2 s0 = T::sm(b, j0 / 16), s1 = T::sm(b, j0 / 16 + 1);
#pragma unroll
        for (int c = 0; c < GR_MMVQ_COLS; c++) {
            if (c >= nc) break;
            const block_q8_1 *y = yb + c * y_col + s;
            const int *yq = (const int *)y->qs;
            int dot[2] = {0, 0}, ysum[2] = {0, 0};
#pragma unroll
            for (int i = 0; i < 8; i++) {
                dot[i / 4] = __dp4a(q[i], yq[i], dot[i / 4]);
                ysum[i / 4] = __dp4a(0x01010101, yq[i], ysum[i / 4]);
            }
            acc[c] += __low2float(y->ds) * (s0.x * dot[0] - s0.y * ysum[0] + s1.x * dot[1] - s1.y * ysum[1]);
        }
    }
#pragma unroll
    for (int c = 0; c < GR_MMVQ_COLS; c++) {
        if (c >= nc) break;  // the same for the whole warp
        const float v = warp_sum(acc[c]);
        if (lane == 0) dst[a.d_off + c * d_col] = v;
    }
}

#define GR_MMVQ(name, T)                                                                                       \
    extern "C" __global__ void __launch_bounds__(GR_WARP *GR_MMV_WARPS) mul_mat_vec_q_##name(                 \
        const char *W, const block_q8_1 *Y, float *dst, const int *ids, int ncols, int nrows, int ncols_y,     \
        int cols_per_block, long long w_row, long long w_mat, long long y_col, long long y_mat, long long d_col, \
        long long d_mat, int r2, int ne11, int ids_ld) {                                                        \
        mul_mat_vec_q<T>(W, Y, dst, ids, ncols, nrows, ncols_y, cols_per_block, w_row, w_mat, y_col, y_mat,     \
                         d_col, d_mat, r2, ne11, ids_ld);                                                       \
    }
GR_QUANT_TYPES(GR_MMVQ)

// ---- dequantizing mat-vec: any W x f32 X ----
template <class T>
static __device__ void mul_mat_vec(const char *__restrict__ W, const float *__restrict__ X, float *__restrict__ dst,
                                   const int *__restrict__ ids, int ncols, int nrows, long long w_row,
                                   long long w_mat, long long x_col, long long x_mat, long long d_col,
                                   long long d_mat, int r2, int ne11, int ids_ld) {
    const int row = blockIdx.x * blockDim.y + threadIdx.y, lane = threadIdx.x;
    if (row >= nrows) return;
    const mm_args a = mm_locate(W, ids, row, blockIdx.y, blockIdx.z, w_row, w_mat, x_col, x_mat, d_col, d_mat,
                                r2, ne11, ids_ld);
    const float *x = X + a.y_off;
    float acc = 0.0f;
    for (int i = lane; i < ncols; i += GR_WARP) acc += row_get<T>(a.w, i) * x[i];
    acc = warp_sum(acc);
    if (lane == 0) dst[a.d_off] = acc;
}

#define GR_MMV(name, T)                                                                                        \
    extern "C" __global__ void __launch_bounds__(GR_WARP *GR_MMV_WARPS) mul_mat_vec_##name(                   \
        const char *W, const float *X, float *dst, const int *ids, int ncols, int nrows, long long w_row,        \
        long long w_mat, long long x_col, long long x_mat, long long d_col, long long d_mat, int r2, int ne11,  \
        int ids_ld) {                                                                                           \
        mul_mat_vec<T>(W, X, dst, ids, ncols, nrows, w_row, w_mat, x_col, x_mat, d_col, d_mat, r2, ne11, ids_ld); \
    }
GR_ALL_TYPES(GR_MMV)

// ---- tiled GEMM: blockIdx.x over W rows, blockIdx.y over X columns, blockIdx.z over batches ----
// Both paths load a 32x32 tile of W (dequantized) and of X into shared memory per
// 32-wide step of k. From sm_80 on, tensor cores (TF32 wmma, f32 accumulation) do
// the products: 8 warps, warp w computes 16x16 sub-tile w % 4 over half w / 4 of
// the step, the halves summed at the end. Elsewhere (and in the emulator) each of
// 16x16 threads computes 2x2 outputs with FMAs. GR_NO_MMA forces the portable path.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(GR_NO_MMA)
#define GR_TILED_MMA 1
#include <mma.h>
#endif
#define GR_TILE_LD (GR_TILE + 4)  // row stride of the shared tiles (wmma wants a multiple of 4)

template <class T>
static __device__ void mul_mat_tiled(const char *__restrict__ W, const float *__restrict__ X, float *__restrict__ dst,
                                     int ncols, int nrows, int ncols_y, long long w_row, long long w_mat,
                                     long long x_col, long long x_mat, long long d_col, long long d_mat, int r2) {
    __shared__ __align__(32) float ws[GR_TILE][GR_TILE_LD];  // [W row][k]
    __shared__ __align__(32) float xs[GR_TILE][GR_TILE_LD];  // [X column][k]
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * GR_TILE_THREADS + tx;
    const int r0 = blockIdx.x * GR_TILE, c0 = blockIdx.y * GR_TILE, z = blockIdx.z;
    const char *wm = W + (z / r2) * w_mat;
    const float *xm = X + z * x_mat;
#ifdef GR_TILED_MMA
    using namespace nvcuda;
    __shared__ __align__(32) float part[2][GR_TILE][GR_TILE_LD];  // [k half][W row][X column]
    const int warp = tid / GR_WARP, sr = warp % 4 / 2, sc = warp % 2, kh = warp / 4;
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
    wmma::fill_fragment(acc, 0.0f);
#else
    float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#endif
    for (int k0 = 0; k0 < ncols; k0 += GR_TILE) {
        for (int e = tid; e < GR_TILE * GR_TILE; e += GR_TILE_THREADS * GR_TILE_THREADS) {
            const int r = e / GR_TILE, kk = e % GR_TILE, k = k0 + kk;
            ws[r][kk] = r0 + r < nrows && k < ncols ? row_get<T>(wm + (r0 + r) * w_row, k) : 0.0f;
            xs[r][kk] = c0 + r < ncols_y && k < ncols ? xm[(c0 + r) * x_col + k] : 0.0f;
        }
        __syncthreads();
#ifdef GR_TILED_MMA
#pragma unroll
        for (int kk = 16 * kh; kk < 16 * kh + 16; kk += 8) {
            wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> b;
            wmma::load_matrix_sync(a, &ws[16 * sr][kk], GR_TILE_LD);
            wmma::load_matrix_sync(b, &xs[16 * sc][kk], GR_TILE_LD);
#pragma unroll
            for (int i = 0; i < a.num_elements; i++) a.x[i] = wmma::__float_to_tf32(a.x[i]);
#pragma unroll
            for (int i = 0; i < b.num_elements; i++) b.x[i] = wmma::__float_to_tf32(b.x[i]);
            wmma::mma_sync(acc, a, b, acc);
        }
#else
#pragma unroll 8
        for (int kk = 0; kk < GR_TILE; kk++) {
            const float w0 = ws[2 * ty][kk], w1 = ws[2 * ty + 1][kk];
            const float x0 = xs[2 * tx][kk], x1 = xs[2 * tx + 1][kk];
            acc[0][0] += w0 * x0;
            acc[0][1] += w0 * x1;
            acc[1][0] += w1 * x0;
            acc[1][1] += w1 * x1;
        }
#endif
        __syncthreads();
    }
#ifdef GR_TILED_MMA
    wmma::store_matrix_sync(&part[kh][16 * sr][16 * sc], acc, GR_TILE_LD, wmma::mem_row_major);
    __syncthreads();
    for (int e = tid; e < GR_TILE * GR_TILE; e += GR_TILE_THREADS * GR_TILE_THREADS) {
        const int r = r0 + e % GR_TILE, c = c0 + e / GR_TILE;  // consecutive threads, consecutive rows
        if (r < nrows && c < ncols_y) dst[z * d_mat + c * d_col + r] = part[0][e % GR_TILE][e / GR_TILE] + part[1][e % GR_TILE][e / GR_TILE];
    }
#else
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            const int r = r0 + 2 * ty + i, c = c0 + 2 * tx + j;
            if (r < nrows && c < ncols_y) dst[z * d_mat + c * d_col + r] = acc[i][j];
        }
#endif
}

#define GR_TILED(name, T)                                                                                      \
    extern "C" __global__ void __launch_bounds__(GR_TILE_THREADS *GR_TILE_THREADS) mul_mat_tiled_##name(       \
        const char *W, const float *X, float *dst, int ncols, int nrows, int ncols_y, long long w_row,          \
        long long w_mat, long long x_col, long long x_mat, long long d_col, long long d_mat, int r2) {          \
        mul_mat_tiled<T>(W, X, dst, ncols, nrows, ncols_y, w_row, w_mat, x_col, x_mat, d_col, d_mat, r2);       \
    }
GR_ALL_TYPES(GR_TILED)

// ---- MUL_MAT_ID's expert ids, checked before any kernel trusts them ----
// ids: (n_tokens, n_used) i32 at int stride ids_ld; out: (n_tokens, n_used) i32 packed,
// each id copied, or 0 where it is outside [0, n_as), which also stores err_code at err
extern "C" __global__ void sanitize_ids(int *__restrict__ out, const int *__restrict__ ids, int n_used, int n_tokens,
                                        long long ids_ld, int n_as, int *err, int err_code) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (long long)n_used * n_tokens;
         i += (long long)gridDim.x * blockDim.x) {
        const int id = ids[i / n_used * ids_ld + i % n_used];
        const bool ok = id >= 0 && id < n_as;
        if (!ok && err) *err = err_code;
        out[i] = ok ? id : 0;
    }
}
