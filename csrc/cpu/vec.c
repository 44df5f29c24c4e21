/* Vector primitives of the CPU kernels, for each ggml x86 build we reproduce (a
 * family, names.def: AVX2, AVX-512, AVX-512 with FP16 arithmetic), in SIMD
 * versions chosen at run time (functions compiled with target attributes, so the
 * library itself still runs on any x86-64) and portable C.
 *
 * All follow the summation order of ggml's x86 kernels on purpose: dot products
 * accumulate in partial sums of the family's width in the same lane pattern and
 * are reduced in the same order, and exp uses the same algorithm, so a model gives
 * the same floats through our server as through llama.cpp's CPU backend built for
 * that family. The portable twins emulate the lanes with fmaf, so they agree with
 * the SIMD versions bit for bit (tests check this).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu/job.h"
#include "cpu/vec_impl.h"

gr_vec_ops gr_vec;

/* the family's vector width and whether its F16 vector ops round in half precision
 * (set by gr_vec_init; the portable twins read them) */
static int vec_lanes = 8;
static int vec_fp16 = 0;

/* ---- ggml's vector exp, one lane --------------------------------------- */

float gr_expf_vec1(float x) { return vec_lanes == 16 ? expf_lane16(x) : expf_lane(x); }

float gr_dot_seq(int64_t n, const float *x, const float *y) { return leftovers_f32(0.0f, 0, n, x, y); }

/* ---- portable twins ----------------------------------------------------- */

/* reduce four 8-lane accumulators as ggml does: pairwise, then halves, then
 * two horizontal adds */
static inline float reduce_4x8(float acc[4][8]) {
    float t[4];
    for (int l = 0; l < 8; l++) {
        acc[0][l] += acc[2][l];
        acc[1][l] += acc[3][l];
    }
    for (int l = 0; l < 8; l++) acc[0][l] += acc[1][l];
    for (int l = 0; l < 4; l++) t[l] = acc[0][l] + acc[0][l + 4];
    return (t[0] + t[1]) + (t[2] + t[3]);
}

/* one 8-lane accumulator: high half onto low half, then (0+2)+(1+3) */
static inline float hsum_8(const float a[8]) {
    float t[4];
    for (int l = 0; l < 4; l++) t[l] = a[l + 4] + a[l];
    return (t[0] + t[2]) + (t[1] + t[3]);
}

/* ggml_vec_dot_f32's reduction of its four accumulators: pairwise, then across lanes */
static inline float reduce_4(float acc[4][16], int L) {
    for (int l = 0; l < L; l++) {
        acc[0][l] += acc[2][l];
        acc[1][l] += acc[3][l];
    }
    for (int l = 0; l < L; l++) acc[0][l] += acc[1][l];
    if (L == 16) return hsum_16(acc[0]);
    float t[4];
    for (int l = 0; l < 4; l++) t[l] = acc[0][l] + acc[0][l + 4];
    return (t[0] + t[1]) + (t[2] + t[3]);
}

float gr_vec_reduce4(float acc[4][16]) { return reduce_4(acc, vec_lanes); }

static inline float hsum_lanes(const float *a, int L) { return L == 16 ? hsum_16(a) : hsum_8(a); }

/* The main loop of ggml_vec_dot_f32/f16 over x and y: four accumulators `acc` of
 * L lanes over the first np elements (n rounded down to 4 L), each element read
 * as AS_F32(element). Declares L, np and acc. */
#define DOT_4ACC(AS_F32)                                                                       \
    const int L = vec_lanes;                                                                   \
    const int64_t np = n & ~(int64_t)(4 * L - 1);                                              \
    float acc[4][16] = {{0}};                                                                  \
    for (int64_t i = 0; i < np; i += 4 * L)                                                    \
        for (int j = 0; j < 4; j++)                                                            \
            for (int l = 0; l < L; l++)                                                        \
                acc[j][l] = fmaf(AS_F32(x[i + j * L + l]), AS_F32(y[i + j * L + l]), acc[j][l])

#define F32_AS_F32(v) (v)

static float dot_f32_c(int64_t n, const float *x, const float *y) {
    DOT_4ACC(F32_AS_F32);
    return leftovers_f32(reduce_4(acc, L), np, n, x, y);
}

static float dot_f32_gemm_c(int64_t n, const float *x, const float *y) {
    const int L = vec_lanes;
    float acc[16] = {0};
    for (int64_t i = 0; i < n; i += L)
        for (int l = 0; l < L; l++) acc[l] = fmaf(x[i + l], y[i + l], acc[l]);
    return hsum_lanes(acc, L);
}

static float dot_f16_c(int64_t n, const uint16_t *x, const uint16_t *y) {
    DOT_4ACC(gr_fp16_to_fp32);
    double s = reduce_4(acc, L);
    for (int64_t i = np; i < n; i++) s += (double)(gr_fp16_to_fp32(x[i]) * gr_fp16_to_fp32(y[i]));
    return (float)s;
}

static float dot_f16_gemm_c(int64_t n, const uint16_t *x, const uint16_t *y) {
    const int L = vec_lanes;
    float acc[16] = {0};
    for (int64_t i = 0; i < n; i += L)
        for (int l = 0; l < L; l++)
            acc[l] = fmaf(gr_fp16_to_fp32(x[i + l]), gr_fp16_to_fp32(y[i + l]), acc[l]);
    return hsum_lanes(acc, L);
}

static void tile_f32_gemm_c(int64_t K, const float *const w[4], const float *const *x, float *out) {
    for (int j = 0; j < gr_vec.tile_cols; j++)
        for (int i = 0; i < 4; i++) out[j * 4 + i] = dot_f32_gemm_c(K, w[i], x[j]);
}

static void tile_f16_gemm_c(int64_t K, const uint16_t *const w[4], const uint16_t *const *x, float *out) {
    for (int j = 0; j < gr_vec.tile_cols; j++)
        for (int i = 0; i < 4; i++) out[j * 4 + i] = dot_f16_gemm_c(K, w[i], x[j]);
}

static void gemm_f32_c(int64_t M, int64_t K, int64_t N, float *C /* (M, N) */, const float *A /* (M, K) */,
                       const float *B /* (K, N) */) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float acc = C[i * N + j];
            for (int64_t k = 0; k < K; k++) acc = fmaf(A[i * K + k], B[k * N + j], acc);
            C[i * N + j] = acc;
        }
}

static void rope_rotate_c(int32_t type, char *dst, const char *src, int64_t np, int64_t istep, int64_t joff,
                          const float *cs /* (2 np,) cos, sin */) {
    GR_ROPE_ROTATE_BODY
}

static void fp16_to_fp32_c(int64_t n, const uint16_t *x, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] = gr_fp16_to_fp32(x[i]);
}

static void fp32_to_fp16_c(int64_t n, const float *x, uint16_t *y) {
    for (int64_t i = 0; i < n; i++) y[i] = gr_fp32_to_fp16(x[i]);
}

/* groups of the family's width take its vector exp (gr_expf_vec1), the rest libm's expf */
static double soft_max_c(int64_t n, float *y, const float *x, float max) {
    const int L = vec_lanes;
    double sum = 0.0;
    int64_t i = 0;
    for (; i + L - 1 < n; i += L) {
        float v[16];
        for (int l = 0; l < L; l++) v[l] = y[i + l] = gr_expf_vec1(x[i + l] - max);
        sum += (double)hsum_lanes(v, L);
    }
    for (; i < n; i++) {
        const float v = expf(x[i] - max);
        sum += (double)v;
        y[i] = v;
    }
    return sum;
}

static void silu_c(int64_t n, float *y, const float *x) {
    const int L = vec_lanes;
    int64_t i = 0;
    for (; i + L - 1 < n; i += L)
        for (int l = 0; l < L; l++) y[i + l] = x[i + l] / (1.0f + gr_expf_vec1(0.0f - x[i + l]));
    for (; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i]));
}

static void swiglu_c(int64_t n, float *y, const float *x, const float *g) {
    const int L = vec_lanes;
    int64_t i = 0;
    for (; i + L - 1 < n; i += L)
        for (int l = 0; l < L; l++)
            y[i + l] = (x[i + l] / (1.0f + gr_expf_vec1(0.0f - x[i + l]))) * g[i + l];
    for (; i < n; i++) y[i] = (x[i] / (1.0f + expf(-x[i]))) * g[i];
}

/* 16 lanes += 32 BF16 products */
static inline void dpbf16_c(float acc[16], const uint16_t *a /* (32,) */, const uint16_t *b /* (32,) */) {
    for (int l = 0; l < 16; l++) acc[l] = dpbf16_lane(acc[l], a + 2 * l, b + 2 * l);
}

static void dot_bf16_c(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    float c1[16] = {0}, c2[16] = {0};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        dpbf16_c(c1, x + i, y + i);
        dpbf16_c(c2, x + i + 32, y + i + 32);
    }
    double sum = (double)hsum_16(c1);
    sum += (double)hsum_16(c2);
    for (; i < n; i++) sum += (double)(bf16_f32(x[i]) * bf16_f32(y[i]));
    *s = (float)sum;
}

static void dot_bf16_gemm_c(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    float acc[16] = {0};
    for (int64_t i = 0; i < n; i += 32) dpbf16_c(acc, x + i, y + i);
    *s = hsum_16(acc);
}

/* tinyBLAS without BF16 products: the values widened to F32, one accumulator of the
 * family's width (a product of two BF16 values is exact, fused or not) */
static void dot_bf16_wide_gemm_c(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    const int L = vec_lanes;
    float acc[16] = {0};
    for (int64_t i = 0; i < n; i += L)
        for (int l = 0; l < L; l++) acc[l] = fmaf(bf16_f32(x[i + l]), bf16_f32(y[i + l]), acc[l]);
    *s = hsum_lanes(acc, L);
}

/* An AVX512-FP16 build scales and accumulates F16 vectors in half precision over
 * blocks of 128 (four 32-lane registers): v rounded to F16, one rounding per
 * operation. a*b + c of F16 values is exact in double precision (22 + 11 significant
 * bits within F16's exponent range, or an overflow either way); it reaches F16 with
 * one rounding through single precision rounded to odd (13 spare bits). */
static inline uint16_t fma_h(uint16_t a, uint16_t b, uint16_t c) {
    const double d = (double)gr_fp16_to_fp32(a) * (double)gr_fp16_to_fp32(b) + (double)gr_fp16_to_fp32(c);
    float f = (float)d;
    if ((double)f != d && !(gr_f32_bits(f) & 1)) f = nextafterf(f, d > (double)f ? INFINITY : -INFINITY);
    return gr_fp32_to_fp16(f);
}

static inline int64_t f16_block_end(int64_t n) { return vec_fp16 ? n & ~(int64_t)127 : 0; }

static void mad_f32_c(int64_t n, float *y, const float *x, float v) {
    for (int64_t i = 0; i < n; i++) y[i] = fmaf(x[i], v, y[i]);
}

static void mad_f16_c(int64_t n, uint16_t *y, const uint16_t *x, float v) {
    const int64_t np = f16_block_end(n);
    const uint16_t hv = gr_fp32_to_fp16(v);
    for (int64_t i = 0; i < np; i++) y[i] = fma_h(x[i], hv, y[i]);
    for (int64_t i = np; i < n; i++)
        y[i] = gr_fp32_to_fp16(fmaf(gr_fp16_to_fp32(x[i]), v, gr_fp16_to_fp32(y[i])));
}

static void scale_f16_c(int64_t n, uint16_t *y, float v) {
    const int64_t np = f16_block_end(n);
    const uint16_t hv = gr_fp32_to_fp16(v);
    for (int64_t i = 0; i < np; i++)   /* an F16 product is exact in single precision */
        y[i] = gr_fp32_to_fp16(gr_fp16_to_fp32(y[i]) * gr_fp16_to_fp32(hv));
    for (int64_t i = np; i < n; i++) y[i] = gr_fp32_to_fp16(gr_fp16_to_fp32(y[i]) * v);
}

int gr_vec_init(int family, int use_simd) {
    if (family < GR_FAMILY_AVX2 || family > GR_FAMILY_AVX512_FP16) family = GR_FAMILY_AVX2;
    const int bf16 = family >= GR_FAMILY_AVX512_BF16;
    vec_lanes = family == GR_FAMILY_AVX2 ? 8 : 16;
    vec_fp16 = family == GR_FAMILY_AVX512_FP16;
    gr_vec_ops v = {
        .lanes = vec_lanes,
        .dot_f32 = dot_f32_c, .dot_f32_gemm = dot_f32_gemm_c, .dot_f16 = dot_f16_c, .dot_f16_gemm = dot_f16_gemm_c,
        .fp16_to_fp32 = fp16_to_fp32_c, .fp32_to_fp16 = fp32_to_fp16_c,
        .soft_max = soft_max_c, .silu = silu_c, .swiglu = swiglu_c,
        .mad_f32 = mad_f32_c, .mad_f16 = mad_f16_c, .scale_f16 = scale_f16_c,
        .tile_cols = 2, .tile_f32_gemm = tile_f32_gemm_c, .tile_f16_gemm = tile_f16_gemm_c, .gemm_f32 = gemm_f32_c,
        .dot_bf16 = bf16 ? dot_bf16_c : NULL, .dot_bf16_gemm = bf16 ? dot_bf16_gemm_c : dot_bf16_wide_gemm_c,
        .rope_rotate = rope_rotate_c,
    };
    const int simd = gr_vec_x86(family, use_simd, &v);   /* the x86 ones in their place */
    gr_vec = v;
    return simd;
}
