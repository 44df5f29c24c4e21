// rows.cu: GET_ROWS (every type -> F32), SET_ROWS (F32 -> F32/F16/BF16/Q4_0/Q4_1/
// Q5_0/Q5_1/Q8_0), CPY/DUP/CONT between F32/F16/BF16 with any strides, F32 rows
// into quant blocks and quant rows back to F32.
#include "common.cuh"

// ---- GET_ROWS ----
// dst: (ne12, ne11, ne10, ne00) f32 contiguous
// src: rows of ne00 elements of type T; byte strides nb01 (row), nb02, nb03
// ids: (ne12, ne11, ne10) i32 contiguous; row ids[i12][i11][i10] of slice (i12, i11)
// n_rows: rows per slice of src; an id outside [0, n_rows) is skipped and, when err is
// not null, reported by storing err_code there (the executor fails the graph)
template <class T>
static __device__ void get_rows(float *__restrict__ dst, const char *__restrict__ src, const int *__restrict__ ids,
                                int ne00, int ne10, int ne11, long long nb01, long long nb02, long long nb03,
                                int n_rows, int *err, int err_code) {
    const int r = blockIdx.x;  // (i12 * ne11 + i11) * ne10 + i10
    const int i11 = r / ne10 % ne11, i12 = r / (ne10 * ne11);
    if (ids[r] < 0 || ids[r] >= n_rows) {
        if (err && threadIdx.x == 0) *err = err_code;
        return;
    }
    const char *row = src + ids[r] * nb01 + i11 * nb02 + i12 * nb03;
    for (int i = threadIdx.x; i < ne00; i += blockDim.x) dst[(long long)r * ne00 + i] = row_get<T>(row, i);
}

#define GR_GET_ROWS(name, T)                                                                                  \
    extern "C" __global__ void get_rows_##name(float *dst, const char *src, const int *ids, int ne00, int ne10, \
                                               int ne11, long long nb01, long long nb02, long long nb03,        \
                                               int n_rows, int *err, int err_code) {                            \
        get_rows<T>(dst, src, ids, ne00, ne10, ne11, nb01, nb02, nb03, n_rows, err, err_code);                 \
    }
GR_ALL_TYPES(GR_GET_ROWS)

// ---- quantizers: one block of qk floats into one block, as ggml's reference code ----
static __device__ void quantize_block(const float *x, float *y) { *y = *x; }
static __device__ void quantize_block(const float *x, __half *y) { *y = __float2half(*x); }
static __device__ void quantize_block(const float *x, uint16_t *y) { *y = f32_to_bf16(*x); }

static __device__ void quantize_block(const float *x, block_q8_0 *y) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
    y->d = __float2half(d);
    for (int j = 0; j < QK8_0; j++) y->qs[j] = (int8_t)roundf(x[j] * id);
}

// the value of largest magnitude, sign kept (the first of equals)
static __device__ float signed_absmax(const float *x, int n) {
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < n; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            mx = x[j];
        }
    return mx;
}

static __device__ void quantize_block(const float *x, block_q4_0 *y) {
    const float d = signed_absmax(x, 32) / -8.0f, id = d ? 1.0f / d : 0.0f;
    y->d = __float2half(d);
    for (int j = 0; j < 16; j++) {
        const int a = min(15, (int)(int8_t)(x[j] * id + 8.5f)), b = min(15, (int)(int8_t)(x[j + 16] * id + 8.5f));
        y->qs[j] = (uint8_t)(a | b << 4);
    }
}

static __device__ void quantize_block(const float *x, block_q5_0 *y) {
    const float d = signed_absmax(x, 32) / -16.0f, id = d ? 1.0f / d : 0.0f;
    y->d = __float2half(d);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        const int a = min(31, (int)(int8_t)(x[j] * id + 16.5f)), b = min(31, (int)(int8_t)(x[j + 16] * id + 16.5f));
        y->qs[j] = (uint8_t)((a & 0xf) | (b & 0xf) << 4);
        qh |= (uint32_t)(a >> 4) << j | (uint32_t)(b >> 4) << (j + 16);
    }
    for (int i = 0; i < 4; i++) y->qh[i] = (uint8_t)(qh >> (8 * i));
}

template <class B> static __device__ void quantize_min_block(const float *x, B *y, int nmax, uint32_t *qh) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
    }
    const float d = (hi - lo) / nmax, id = d ? 1.0f / d : 0.0f;
    y->d = __float2half(d);
    y->m = __float2half(lo);
    *qh = 0;
    for (int j = 0; j < 16; j++) {
        const int a = min(nmax, (int)(uint8_t)((x[j] - lo) * id + 0.5f));
        const int b = min(nmax, (int)(uint8_t)((x[j + 16] - lo) * id + 0.5f));
        y->qs[j] = (uint8_t)((a & 0xf) | (b & 0xf) << 4);
        *qh |= (uint32_t)(a >> 4) << j | (uint32_t)(b >> 4) << (j + 16);
    }
}
static __device__ void quantize_block(const float *x, block_q4_1 *y) {
    uint32_t qh;
    quantize_min_block(x, y, 15, &qh);
}
static __device__ void quantize_block(const float *x, block_q5_1 *y) {
    uint32_t qh;
    quantize_min_block(x, y, 31, &qh);
    for (int i = 0; i < 4; i++) y->qh[i] = (uint8_t)(qh >> (8 * i));
}

#define GR_STORE_TYPES(X) \
    X(f32, tr_f32) X(f16, tr_f16) X(bf16, tr_bf16) X(q4_0, tr_q4_0) X(q4_1, tr_q4_1) X(q5_0, tr_q5_0) X(q5_1, tr_q5_1) X(q8_0, tr_q8_0)

// ---- SET_ROWS ----
// src: (ne03, ne02, ne01, ne00) f32 contiguous
// ids: (ne12, ne11, ne01) i64 (ids_i32 == 0) or i32, contiguous; slice (i03 % ne12, i02 % ne11)
// dst: rows of ne00 elements of type T at byte strides nb1, nb2, nb3
template <class T>
static __device__ void set_rows(char *__restrict__ dst, const float *__restrict__ src, const void *__restrict__ ids,
                                int ids_i32, int ne00, int ne01, int ne02, int ne03, int ne11, int ne12,
                                long long nb1, long long nb2, long long nb3, long long n_rows, int *err,
                                int err_code) {
    const int bpr = ne00 / T::qk;  // blocks per row
    const long long n = (long long)bpr * ne01 * ne02 * ne03;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int ib = i % bpr;
        const long long r = i / bpr;
        const int i01 = r % ne01, i02 = r / ne01 % ne02, i03 = r / ((long long)ne01 * ne02);
        const long long k = ((long long)(i03 % ne12) * ne11 + i02 % ne11) * ne01 + i01;
        const long long row = ids_i32 ? ((const int *)ids)[k] : ((const long long *)ids)[k];
        if (row < 0 || row >= n_rows) {  // never write outside dst: report instead
            if (err) *err = err_code;
            continue;
        }
        typename T::block *out = (typename T::block *)(dst + row * nb1 + i02 * nb2 + i03 * nb3) + ib;
        quantize_block(src + r * ne00 + (long long)ib * T::qk, out);
    }
}

#define GR_SET_ROWS(name, T)                                                                                   \
    extern "C" __global__ void set_rows_##name(char *dst, const float *src, const void *ids, int ids_i32,      \
                                               int ne00, int ne01, int ne02, int ne03, int ne11, int ne12,      \
                                               long long nb1, long long nb2, long long nb3, long long n_rows,   \
                                               int *err, int err_code) {                                        \
        set_rows<T>(dst, src, ids, ids_i32, ne00, ne01, ne02, ne03, ne11, ne12, nb1, nb2, nb3, n_rows, err,    \
                    err_code);                                                                                  \
    }
GR_STORE_TYPES(GR_SET_ROWS)

// ---- CPY between scalar types (0 F32, 1 F16, 2 BF16), any strides ----
// src, dst: (ne3, ne2, ne1, ne0) with byte strides s0..s3 and d0..d3
static __device__ float load_scalar(const char *p, int type) {
    return type == 0 ? *(const float *)p : type == 1 ? __half2float(*(const __half *)p) : bf16_to_f32(*(const uint16_t *)p);
}
extern "C" __global__ void cpy_scalar(char *__restrict__ dst, int dtype, const char *__restrict__ src, int stype,
                                      int ne0, int ne1, int ne2, int ne3, long long s0, long long s1, long long s2,
                                      long long s3, long long d0, long long d1, long long d2, long long d3) {
    const long long n = (long long)ne0 * ne1 * ne2 * ne3;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long i0 = i % ne0, i1 = i / ne0 % ne1, i2 = i / ((long long)ne0 * ne1) % ne2,
                        i3 = i / ((long long)ne0 * ne1 * ne2);
        const float v = load_scalar(src + i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3, stype);
        char *o = dst + i0 * d0 + i1 * d1 + i2 * d2 + i3 * d3;
        if (dtype == 0) *(float *)o = v;
        else if (dtype == 1) *(__half *)o = __float2half(v);
        else *(uint16_t *)o = f32_to_bf16(v);
    }
}

// ---- CPY F32 rows -> quant blocks and quant rows -> F32 ----
// src: nrows rows of ne00 f32 at byte stride ls; dst: nrows rows of blocks at byte stride ld
#define GR_CPY_TO(name, T)                                                                                     \
    extern "C" __global__ void quantize_rows_##name(char *dst, const char *src, int ne00, int nrows, long long ls,    \
                                              long long ld) {                                                   \
        const int bpr = ne00 / T::qk;                                                                           \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (long long)bpr * nrows;       \
             i += (long long)gridDim.x * blockDim.x) {                                                          \
            const long long r = i / bpr;                                                                        \
            const int ib = i % bpr;                                                                             \
            quantize_block((const float *)(src + r * ls) + (long long)ib * T::qk,                               \
                           (typename T::block *)(dst + r * ld) + ib);                                           \
        }                                                                                                       \
    }
GR_STORE_TYPES(GR_CPY_TO)

#define GR_CPY_FROM(name, T)                                                                                   \
    extern "C" __global__ void dequantize_rows_##name(char *dst, const char *src, int ne00, int nrows, long long ls,  \
                                                long long ld) {                                                 \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (long long)ne00 * nrows;      \
             i += (long long)gridDim.x * blockDim.x)                                                            \
            ((float *)(dst + i / ne00 * ld))[i % ne00] = row_get<T>(src + i / ne00 * ls, i % ne00);            \
    }
GR_ALL_TYPES(GR_CPY_FROM)
