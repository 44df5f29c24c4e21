// common.cuh: what every kernel file shares: warp/block reductions, dynamic
// shared memory, ggml's quant block layouts and one element-wise dequantizer per
// type. The same text compiles under nvcc (PyCUDA, a real device) and under the
// host compiler with the SIMT emulator of the tests (SIMT_EMULATOR defined).
#pragma once
#ifndef SIMT_EMULATOR
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif
#include <stdint.h>

#define GR_WARP 32
#define GR_FULL_MASK 0xffffffffu

// dynamic shared memory (the launch's `shared=` bytes) as a T pointer
#ifdef SIMT_EMULATOR
#define GR_DYNAMIC_SHARED(T, name) T *name = (T *)simt_dynamic_shared()
#else
#define GR_DYNAMIC_SHARED(T, name)                                \
    extern __shared__ __align__(16) unsigned char gr_dyn_smem_[]; \
    T *name = (T *)gr_dyn_smem_
#endif

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(GR_FULL_MASK, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(GR_FULL_MASK, v, o));
    return v;
}

// Sum (max) over a 1-D block whose size is a multiple of 32; every thread gets it.
// scratch: 32 floats of __shared__ memory, free again when this returns.
template <bool is_max> static __device__ __forceinline__ float block_reduce(float v, float *scratch) {
    const int lane = threadIdx.x % GR_WARP, warp = threadIdx.x / GR_WARP;
    v = is_max ? warp_max(v) : warp_sum(v);
    if (blockDim.x == GR_WARP) return v;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / GR_WARP) ? scratch[lane] : (is_max ? -INFINITY : 0.0f);
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();
    return v;
}
static __device__ __forceinline__ float block_sum(float v, float *scratch) { return block_reduce<false>(v, scratch); }
static __device__ __forceinline__ float block_max(float v, float *scratch) { return block_reduce<true>(v, scratch); }

static __device__ __forceinline__ float bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// round to nearest even, NaN kept quiet: ggml's fp32 -> bf16
static __device__ __forceinline__ uint16_t f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

static __device__ __forceinline__ float e8m0_half_to_f32(uint8_t e) {  // 2^(e-128), exactly
    return __uint_as_float(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

// ---- ggml's block layouts (ggml-common.h), sizes pinned below ----
#define QK4_0 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256

typedef struct { __half d; uint8_t qs[QK4_0 / 2]; } block_q4_0;             // (q - 8) * d
typedef struct { __half d, m; uint8_t qs[QK4_0 / 2]; } block_q4_1;          // q * d + m
typedef struct { __half d; uint8_t qh[4]; uint8_t qs[QK4_0 / 2]; } block_q5_0;  // (q - 16) * d
typedef struct { __half d, m; uint8_t qh[4]; uint8_t qs[QK4_0 / 2]; } block_q5_1;
typedef struct { __half d; int8_t qs[QK8_0]; } block_q8_0;
typedef struct { __half2 ds; int8_t qs[QK8_1]; } block_q8_1;                // ds = (d, d * sum(qs))
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; __half d, dmin; } block_q2_K;
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; __half d; } block_q3_K;
typedef struct { __half d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { __half d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; __half d; } block_q6_K;
typedef struct { __half d; uint8_t qs[QK4_0 / 2]; } block_iq4_nl;
typedef struct { __half d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; } block_iq4_xs;
typedef struct { uint8_t e; uint8_t qs[QK4_0 / 2]; } block_mxfp4;

static_assert(sizeof(block_q4_0) == 18, "block_q4_0");
static_assert(sizeof(block_q4_1) == 20, "block_q4_1");
static_assert(sizeof(block_q5_0) == 22, "block_q5_0");
static_assert(sizeof(block_q5_1) == 24, "block_q5_1");
static_assert(sizeof(block_q8_0) == 34, "block_q8_0");
static_assert(sizeof(block_q8_1) == 36, "block_q8_1");
static_assert(sizeof(block_q2_K) == 84, "block_q2_K");
static_assert(sizeof(block_q3_K) == 110, "block_q3_K");
static_assert(sizeof(block_q4_K) == 144, "block_q4_K");
static_assert(sizeof(block_q5_K) == 176, "block_q5_K");
static_assert(sizeof(block_q6_K) == 210, "block_q6_K");
static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl");
static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs");
static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4");

__constant__ int8_t gr_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
__constant__ int8_t gr_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Nibble j (0..31) of a 16-byte run: low nibbles hold elements 0..15, high 16..31.
static __device__ __forceinline__ int nib32(const uint8_t *qs, int j) {
    return j < 16 ? qs[j] & 0xf : qs[j - 16] >> 4;
}

// 6-bit scale and min of sub-block j of a Q4_K/Q5_K block
static __device__ __forceinline__ void scale_min_k4(int j, const uint8_t *q, int &sc, int &m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// One truth per weight layout. A float type has `get(b, j)`. A quant type says
// element j of block b is  sm(b, j/16).x * q(b, j) - sm(b, j/16).y : an integer
// q (fits int8) with a scale and a min per group of 16; `get` follows from that,
// and the dp4a mat-vec (matmul.cu) uses q and sm directly.
struct tr_f32 {
    typedef float block;
    static constexpr int qk = 1;
    static __device__ __forceinline__ float get(const block *b, int) { return *b; }
};
struct tr_f16 {
    typedef __half block;
    static constexpr int qk = 1;
    static __device__ __forceinline__ float get(const block *b, int) { return __half2float(*b); }
};
struct tr_bf16 {
    typedef uint16_t block;
    static constexpr int qk = 1;
    static __device__ __forceinline__ float get(const block *b, int) { return bf16_to_f32(*b); }
};

template <class D, class B, int QK> struct quant_type {
    typedef B block;
    static constexpr int qk = QK;
    static __device__ __forceinline__ float get(const block *b, int j) {
        const float2 s = D::sm(b, j / 16);
        return s.x * D::q(b, j) - s.y;
    }
};

struct tr_q4_0 : quant_type<tr_q4_0, block_q4_0, 32> {
    static __device__ __forceinline__ int q(const block *b, int j) { return nib32(b->qs, j) - 8; }
    static __device__ __forceinline__ float2 sm(const block *b, int) { return make_float2(__half2float(b->d), 0.f); }
};
struct tr_q4_1 : quant_type<tr_q4_1, block_q4_1, 32> {
    static __device__ __forceinline__ int q(const block *b, int j) { return nib32(b->qs, j); }
    static __device__ __forceinline__ float2 sm(const block *b, int) {
        return make_float2(__half2float(b->d), -__half2float(b->m));
    }
};
static __device__ __forceinline__ int q5_value(const uint8_t *qh4, const uint8_t *qs, int j) {
    return nib32(qs, j) | (((qh4[j / 8] >> (j % 8)) & 1) << 4);
}
struct tr_q5_0 : quant_type<tr_q5_0, block_q5_0, 32> {
    static __device__ __forceinline__ int q(const block *b, int j) { return q5_value(b->qh, b->qs, j) - 16; }
    static __device__ __forceinline__ float2 sm(const block *b, int) { return make_float2(__half2float(b->d), 0.f); }
};
struct tr_q5_1 : quant_type<tr_q5_1, block_q5_1, 32> {
    static __device__ __forceinline__ int q(const block *b, int j) { return q5_value(b->qh, b->qs, j); }
    static __device__ __forceinline__ float2 sm(const block *b, int) {
        return make_float2(__half2float(b->d), -__half2float(b->m));
    }
};
struct tr_q8_0 : quant_type<tr_q8_0, block_q8_0, 32> {
    static __device__ __forceinline__ int q(const block *b, int j) { return b->qs[j]; }
    static __device__ __forceinline__ float2 sm(const block *b, int) { return make_float2(__half2float(b->d), 0.f); }
};
// K quants: element e = 128*h + 32*j + l; group g = e/16
struct tr_q2_K : quant_type<tr_q2_K, block_q2_K, QK_K> {
    static __device__ __forceinline__ int q(const block *b, int e) {
        return (b->qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
    }
    static __device__ __forceinline__ float2 sm(const block *b, int g) {
        return make_float2(__half2float(b->d) * (b->scales[g] & 0xf), __half2float(b->dmin) * (b->scales[g] >> 4));
    }
};
struct tr_q3_K : quant_type<tr_q3_K, block_q3_K, QK_K> {
    static __device__ __forceinline__ int q(const block *b, int e) {
        const int h = e / 128, j = e % 128 / 32, l = e % 32;
        return ((b->qs[32 * h + l] >> (2 * j)) & 3) - ((b->hmask[l] >> (4 * h + j)) & 1 ? 0 : 4);
    }
    static __device__ __forceinline__ float2 sm(const block *b, int g) {  // 16 six-bit scales in 12 bytes
        const int lo = g < 8 ? b->scales[g] & 0xf : b->scales[g - 8] >> 4;
        const int hi = (b->scales[8 + g % 4] >> (2 * (g / 4))) & 3;
        return make_float2(__half2float(b->d) * ((lo | hi << 4) - 32), 0.f);
    }
};
struct tr_q4_K : quant_type<tr_q4_K, block_q4_K, QK_K> {
    static __device__ __forceinline__ int q(const block *b, int e) {
        const uint8_t v = b->qs[32 * (e / 64) + e % 32];
        return e % 64 < 32 ? v & 0xf : v >> 4;
    }
    static __device__ __forceinline__ float2 sm(const block *b, int g) {
        int sc, m;
        scale_min_k4(g / 2, b->scales, sc, m);
        return make_float2(__half2float(b->d) * sc, __half2float(b->dmin) * m);
    }
};
struct tr_q5_K : quant_type<tr_q5_K, block_q5_K, QK_K> {
    static __device__ __forceinline__ int q(const block *b, int e) {
        const uint8_t v = b->qs[32 * (e / 64) + e % 32];
        return (e % 64 < 32 ? v & 0xf : v >> 4) | (((b->qh[e % 32] >> (e / 32)) & 1) << 4);
    }
    static __device__ __forceinline__ float2 sm(const block *b, int g) {
        int sc, m;
        scale_min_k4(g / 2, b->scales, sc, m);
        return make_float2(__half2float(b->d) * sc, __half2float(b->dmin) * m);
    }
};
struct tr_q6_K : quant_type<tr_q6_K, block_q6_K, QK_K> {
    static __device__ __forceinline__ int q(const block *b, int e) {
        const int h = e / 128, k = e % 128 / 32, l = e % 32;
        const uint8_t ql = b->ql[64 * h + l + 32 * (k & 1)];
        return ((k < 2 ? ql & 0xf : ql >> 4) | (((b->qh[32 * h + l] >> (2 * k)) & 3) << 4)) - 32;
    }
    static __device__ __forceinline__ float2 sm(const block *b, int g) {
        return make_float2(__half2float(b->d) * b->scales[g], 0.f);
    }
};
struct tr_iq4_nl : quant_type<tr_iq4_nl, block_iq4_nl, 32> {
    static __device__ __forceinline__ int q(const block *b, int j) { return gr_kvalues_iq4nl[nib32(b->qs, j)]; }
    static __device__ __forceinline__ float2 sm(const block *b, int) { return make_float2(__half2float(b->d), 0.f); }
};
struct tr_iq4_xs : quant_type<tr_iq4_xs, block_iq4_xs, QK_K> {
    static __device__ __forceinline__ int q(const block *b, int e) {
        return gr_kvalues_iq4nl[nib32(b->qs + 16 * (e / 32), e % 32)];
    }
    static __device__ __forceinline__ float2 sm(const block *b, int g) {
        const int ib = g / 2;
        const int ls = ((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((b->scales_h >> (2 * ib)) & 3) << 4);
        return make_float2(__half2float(b->d) * (ls - 32), 0.f);
    }
};
struct tr_mxfp4 : quant_type<tr_mxfp4, block_mxfp4, 32> {
    static __device__ __forceinline__ int q(const block *b, int j) { return gr_kvalues_mxfp4[nib32(b->qs, j)]; }
    static __device__ __forceinline__ float2 sm(const block *b, int) { return make_float2(e8m0_half_to_f32(b->e), 0.f); }
};

// Element i of a row of type T that starts at `row`.
template <class T> static __device__ __forceinline__ float row_get(const void *row, int i) {
    return T::get((const typename T::block *)row + i / T::qk, i % T::qk);
}

// Every weight type a generic kernel is instantiated for: X(suffix, traits).
#define GR_ALL_TYPES(X)                                                                              \
    X(f32, tr_f32) X(f16, tr_f16) X(bf16, tr_bf16) X(q4_0, tr_q4_0) X(q4_1, tr_q4_1) X(q5_0, tr_q5_0) \
    X(q5_1, tr_q5_1) X(q8_0, tr_q8_0) X(q2_K, tr_q2_K) X(q3_K, tr_q3_K) X(q4_K, tr_q4_K)              \
    X(q5_K, tr_q5_K) X(q6_K, tr_q6_K) X(iq4_nl, tr_iq4_nl) X(iq4_xs, tr_iq4_xs) X(mxfp4, tr_mxfp4)

// The quant types (the dp4a mat-vec is instantiated for these)
#define GR_QUANT_TYPES(X)                                                                            \
    X(q4_0, tr_q4_0) X(q4_1, tr_q4_1) X(q5_0, tr_q5_0) X(q5_1, tr_q5_1) X(q8_0, tr_q8_0)             \
    X(q2_K, tr_q2_K) X(q3_K, tr_q3_K) X(q4_K, tr_q4_K) X(q5_K, tr_q5_K) X(q6_K, tr_q6_K)             \
    X(iq4_nl, tr_iq4_nl) X(iq4_xs, tr_iq4_xs) X(mxfp4, tr_mxfp4)
