/* The AVX2 + FMA + F16C and AVX-512 versions of the vector primitives (vec.h),
 * compiled with target attributes and put in place by gr_vec_x86 (at the end) where
 * the CPU has them (simd.h's probe). Each gives the bits of its portable twin in vec.c.
 */
#include "cpu/exec.h"   /* the families (GR_FAMILY_*) */
#include "cpu/vec_impl.h"

#if GR_X86

/* ---- AVX2 + FMA + F16C -------------------------------------------------- */
#define GR_AVX2 __attribute__((target("avx2,fma,f16c")))

GR_AVX2 static inline __m256 load_h8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

GR_AVX2 static inline float reduce_4x8_avx(__m256 a[4]) {
    a[0] = _mm256_add_ps(a[0], a[2]);
    a[1] = _mm256_add_ps(a[1], a[3]);
    a[0] = _mm256_add_ps(a[0], a[1]);
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(a[0]), _mm256_extractf128_ps(a[0], 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
}

GR_AVX2 static inline float hsum_8_avx(__m256 a) {
    __m128 t = _mm_add_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
}

GR_AVX2 static float dot_f32_avx(int64_t n, const float *x, const float *y) {
    const int64_t np = n & ~(int64_t)31;
    __m256 acc[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps() };
    for (int64_t i = 0; i < np; i += 32)
        for (int j = 0; j < 4; j++)
            acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + j * 8), _mm256_loadu_ps(y + i + j * 8), acc[j]);
    return leftovers_f32(reduce_4x8_avx(acc), np, n, x, y);
}

GR_AVX2 static float dot_f32_gemm_avx(int64_t n, const float *x, const float *y) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc);
    return hsum_8_avx(acc);
}

/* tinyBLAS's BF16 order without BF16 products: the values widened to F32 */
GR_AVX2 static void dot_bf16_gemm_avx(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        const __m256i a = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
        const __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(y + i)));
        acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(a, 16)),
                              _mm256_castsi256_ps(_mm256_slli_epi32(b, 16)), acc);
    }
    *s = hsum_8_avx(acc);
}

GR_AVX2 static float dot_f16_avx(int64_t n, const uint16_t *x, const uint16_t *y) {
    const int64_t np = n & ~(int64_t)31;
    __m256 acc[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps() };
    for (int64_t i = 0; i < np; i += 32)
        for (int j = 0; j < 4; j++)
            acc[j] = _mm256_fmadd_ps(load_h8(x + i + j * 8), load_h8(y + i + j * 8), acc[j]);
    double s = reduce_4x8_avx(acc);
    for (int64_t i = np; i < n; i++) s += (double)(gr_fp16_to_fp32(x[i]) * gr_fp16_to_fp32(y[i]));
    return (float)s;
}

GR_AVX2 static float dot_f16_gemm_avx(int64_t n, const uint16_t *x, const uint16_t *y) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(load_h8(x + i), load_h8(y + i), acc);
    return hsum_8_avx(acc);
}

/* 4 weight rows x 2 activation rows: eight accumulators, each summing its own
 * products in the same order as dot_*_x8_avx */
GR_AVX2 static void tile_f32_gemm_avx(int64_t K, const float *const w[4], const float *const *x, float *out /* (8,) */) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    for (int64_t k = 0; k < K; k += 8) {
        const __m256 x0 = _mm256_loadu_ps(x[0] + k), x1 = _mm256_loadu_ps(x[1] + k);
        const __m256 w0 = _mm256_loadu_ps(w[0] + k), w1 = _mm256_loadu_ps(w[1] + k);
        const __m256 w2 = _mm256_loadu_ps(w[2] + k), w3 = _mm256_loadu_ps(w[3] + k);
        a00 = _mm256_fmadd_ps(w0, x0, a00); a01 = _mm256_fmadd_ps(w1, x0, a01);
        a02 = _mm256_fmadd_ps(w2, x0, a02); a03 = _mm256_fmadd_ps(w3, x0, a03);
        a10 = _mm256_fmadd_ps(w0, x1, a10); a11 = _mm256_fmadd_ps(w1, x1, a11);
        a12 = _mm256_fmadd_ps(w2, x1, a12); a13 = _mm256_fmadd_ps(w3, x1, a13);
    }
    out[0] = hsum_8_avx(a00); out[1] = hsum_8_avx(a01); out[2] = hsum_8_avx(a02); out[3] = hsum_8_avx(a03);
    out[4] = hsum_8_avx(a10); out[5] = hsum_8_avx(a11); out[6] = hsum_8_avx(a12); out[7] = hsum_8_avx(a13);
}

GR_AVX2 static void tile_f16_gemm_avx(int64_t K, const uint16_t *const w[4], const uint16_t *const *x,
                                      float *out /* (8,) */) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    for (int64_t k = 0; k < K; k += 8) {
        const __m256 x0 = load_h8(x[0] + k), x1 = load_h8(x[1] + k);
        const __m256 w0 = load_h8(w[0] + k), w1 = load_h8(w[1] + k);
        const __m256 w2 = load_h8(w[2] + k), w3 = load_h8(w[3] + k);
        a00 = _mm256_fmadd_ps(w0, x0, a00); a01 = _mm256_fmadd_ps(w1, x0, a01);
        a02 = _mm256_fmadd_ps(w2, x0, a02); a03 = _mm256_fmadd_ps(w3, x0, a03);
        a10 = _mm256_fmadd_ps(w0, x1, a10); a11 = _mm256_fmadd_ps(w1, x1, a11);
        a12 = _mm256_fmadd_ps(w2, x1, a12); a13 = _mm256_fmadd_ps(w3, x1, a13);
    }
    out[0] = hsum_8_avx(a00); out[1] = hsum_8_avx(a01); out[2] = hsum_8_avx(a02); out[3] = hsum_8_avx(a03);
    out[4] = hsum_8_avx(a10); out[5] = hsum_8_avx(a11); out[6] = hsum_8_avx(a12); out[7] = hsum_8_avx(a13);
}

/* rm rows x rn*8 columns of C held in registers over the whole k loop; inlined
 * with constant rm, rn so that the loops unroll */
GR_AVX2 static inline __attribute__((always_inline)) void gemm_tile_avx(int rm, int rn, int64_t K, int64_t N, float *C,
                                                                        const float *A, const float *B) {
    __m256 acc[6][2];
    for (int i = 0; i < rm; i++)
        for (int r = 0; r < rn; r++) acc[i][r] = _mm256_loadu_ps(C + i * N + r * 8);
    for (int64_t k = 0; k < K; k++) {
        __m256 b[2];
        for (int r = 0; r < rn; r++) b[r] = _mm256_loadu_ps(B + k * N + r * 8);
        for (int i = 0; i < rm; i++) {
            const __m256 a = _mm256_broadcast_ss(A + i * K + k);
            for (int r = 0; r < rn; r++) acc[i][r] = _mm256_fmadd_ps(a, b[r], acc[i][r]);
        }
    }
    for (int i = 0; i < rm; i++)
        for (int r = 0; r < rn; r++) _mm256_storeu_ps(C + i * N + r * 8, acc[i][r]);
}

GR_AVX2 static void gemm_f32_avx(int64_t M, int64_t K, int64_t N, float *C /* (M, N) */, const float *A /* (M, K) */,
                                 const float *B /* (K, N) */) {
    int64_t i = 0;
    for (; i < M; i += 6) {
        const int rm = M - i < 6 ? (int)(M - i) : 6;
        float *c = C + i * N;
        const float *a = A + i * K;
        int64_t j = 0;
        for (; j + 16 <= N; j += 16) {
            if (rm == 6) gemm_tile_avx(6, 2, K, N, c + j, a, B + j);
            else for (int r = 0; r < rm; r++) gemm_tile_avx(1, 2, K, N, c + r * N + j, a + r * K, B + j);
        }
        for (; j + 8 <= N; j += 8) {
            if (rm == 6) gemm_tile_avx(6, 1, K, N, c + j, a, B + j);
            else for (int r = 0; r < rm; r++) gemm_tile_avx(1, 1, K, N, c + r * N + j, a + r * K, B + j);
        }
        for (; j < N; j++)
            for (int r = 0; r < rm; r++) {
                float s = c[r * N + j];
                for (int64_t k = 0; k < K; k++) s = fmaf(a[r * K + k], B[k * N + j], s);
                c[r * N + j] = s;
            }
    }
}

/* the same steps; fmaf becomes one instruction here instead of a libm call */
GR_AVX2 static void rope_rotate_avx(int32_t type, char *dst, const char *src, int64_t np, int64_t istep, int64_t joff,
                                    const float *cs /* (2 np,) cos, sin */) {
    GR_ROPE_ROTATE_BODY
}

GR_AVX2 static void fp16_to_fp32_avx(int64_t n, const uint16_t *x, float *y) {
    int64_t i = 0;
    for (; i + 7 < n; i += 8) _mm256_storeu_ps(y + i, load_h8(x + i));
    for (; i < n; i++) y[i] = gr_fp16_to_fp32(x[i]);
}

GR_AVX2 static void fp32_to_fp16_avx(int64_t n, const float *x, uint16_t *y) {
    int64_t i = 0;
    for (; i + 7 < n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), 0));
    for (; i < n; i++) y[i] = gr_fp32_to_fp16(x[i]);
}

/* the 8-lane exp; lane for lane the same arithmetic as expf_lane() */
GR_AVX2 static inline __m256 expf_avx(__m256 x) {
    const __m256 shift = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shift);
    const __m256 n = _mm256_sub_ps(z, shift);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
    const __m256 absn = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 big = _mm256_cmp_ps(absn, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    const __m256 normal = _mm256_fmadd_ps(j, k, k);
    if (!_mm256_movemask_ps(big)) return normal;
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 huge = _mm256_cmp_ps(absn, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    const __m256 scaled = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
    const __m256 r = _mm256_blendv_ps(normal, scaled, big);
    return _mm256_blendv_ps(r, _mm256_mul_ps(s1, s1), huge);
}

GR_AVX2 static double soft_max_avx(int64_t n, float *y, const float *x, float max) {
    double sum = 0.0;
    int64_t i = 0;
    const __m256 vmax = _mm256_set1_ps(max);
    for (; i + 7 < n; i += 8) {
        const __m256 v = expf_avx(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
        _mm256_storeu_ps(y + i, v);
        sum += (double)hsum_8_avx(v);
    }
    for (; i < n; i++) {
        const float v = expf(x[i] - max);
        sum += (double)v;
        y[i] = v;
    }
    return sum;
}

GR_AVX2 static inline __m256 silu_avx8(__m256 x) {
    const __m256 e = expf_avx(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

GR_AVX2 static void silu_avx(int64_t n, float *y, const float *x) {
    int64_t i = 0;
    for (; i + 7 < n; i += 8) _mm256_storeu_ps(y + i, silu_avx8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i]));
}

GR_AVX2 static void swiglu_avx(int64_t n, float *y, const float *x, const float *g) {
    int64_t i = 0;
    for (; i + 7 < n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(silu_avx8(_mm256_loadu_ps(x + i)), _mm256_loadu_ps(g + i)));
    for (; i < n; i++) y[i] = (x[i] / (1.0f + expf(-x[i]))) * g[i];
}

GR_AVX2 static void mad_f32_avx(int64_t n, float *y, const float *x, float v) {
    int64_t i = 0;
    const __m256 vv = _mm256_set1_ps(v);
    for (; i + 7 < n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(_mm256_loadu_ps(x + i), vv, _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(x[i], v, y[i]);
}

GR_AVX2 static void mad_f16_avx(int64_t n, uint16_t *y, const uint16_t *x, float v) {
    int64_t i = 0;
    const __m256 vv = _mm256_set1_ps(v);
    for (; i + 7 < n; i += 8) {
        const __m256 r = _mm256_fmadd_ps(load_h8(x + i), vv, load_h8(y + i));
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(r, 0));
    }
    for (; i < n; i++) y[i] = gr_fp32_to_fp16(fmaf(gr_fp16_to_fp32(x[i]), v, gr_fp16_to_fp32(y[i])));
}

/* y *= v as ggml's F16C build scales (the F32 product of each element, rounded to
 * F16 to nearest even): flash attention's F16 accumulator where the running maximum
 * moves */
GR_AVX2 static void scale_f16_avx(int64_t n, uint16_t *y, float v) {
    int64_t i = 0;
    const __m256 vv = _mm256_set1_ps(v);
    for (; i + 7 < n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_mul_ps(load_h8(y + i), vv), 0));
    for (; i < n; i++) y[i] = gr_fp32_to_fp16(gr_fp16_to_fp32(y[i]) * v);
}
/* ---- AVX-512 (F, DQ, BW, VL) and AVX512-FP16 --------------------------- */

#define GR_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")))
#define GR_AVX512FP16 __attribute__((target("avx512fp16,avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")))

/* hsum_16's order in registers (written out rather than left to a compiler's
 * _mm512_reduce_add_ps, whose order is the compiler's choice) */
GR_AVX512 static inline float hsum_16_avx512(__m512 a) {
    const __m256 t8 = _mm256_add_ps(_mm512_extractf32x8_ps(a, 1), _mm512_castps512_ps256(a));
    const __m128 t4 = _mm_add_ps(_mm256_extractf128_ps(t8, 1), _mm256_castps256_ps128(t8));
    const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
}

GR_AVX512 static inline __m512 load_h16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

GR_AVX512 static inline float reduce_4x16_avx512(__m512 a[4]) {
    a[0] = _mm512_add_ps(a[0], a[2]);
    a[1] = _mm512_add_ps(a[1], a[3]);
    return hsum_16_avx512(_mm512_add_ps(a[0], a[1]));
}

GR_AVX512 static float dot_f32_avx512(int64_t n, const float *x, const float *y) {
    const int64_t np = n & ~(int64_t)63;
    __m512 acc[4] = { _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps() };
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++)
            acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + j * 16), _mm512_loadu_ps(y + i + j * 16), acc[j]);
    return leftovers_f32(reduce_4x16_avx512(acc), np, n, x, y);
}

GR_AVX512 static float dot_f32_gemm_avx512(int64_t n, const float *x, const float *y) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc);
    return hsum_16_avx512(acc);
}

GR_AVX512 static void dot_bf16_gemm_avx512(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + i)));
        const __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(y + i)));
        acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(a, 16)),
                              _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)), acc);
    }
    *s = hsum_16_avx512(acc);
}

GR_AVX512 static float dot_f16_avx512(int64_t n, const uint16_t *x, const uint16_t *y) {
    const int64_t np = n & ~(int64_t)63;
    __m512 acc[4] = { _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps() };
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++)
            acc[j] = _mm512_fmadd_ps(load_h16(x + i + j * 16), load_h16(y + i + j * 16), acc[j]);
    double s = reduce_4x16_avx512(acc);
    for (int64_t i = np; i < n; i++) s += (double)(gr_fp16_to_fp32(x[i]) * gr_fp16_to_fp32(y[i]));
    return (float)s;
}

GR_AVX512 static float dot_f16_gemm_avx512(int64_t n, const uint16_t *x, const uint16_t *y) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) acc = _mm512_fmadd_ps(load_h16(x + i), load_h16(y + i), acc);
    return hsum_16_avx512(acc);
}

/* 4 weight rows x 6 activation rows (tinyBLAS's tile on 32 registers), each output
 * its own accumulator summed as dot_*_gemm_avx512 sums it; inlined with the loader
 * so that the 24 accumulators stay in registers */
#define GR_TILE_GEMM_AVX512(LOAD)                                                                  \
    __m512 acc[6][4];                                                                              \
    for (int j = 0; j < 6; j++)                                                                    \
        for (int i = 0; i < 4; i++) acc[j][i] = _mm512_setzero_ps();                               \
    for (int64_t k = 0; k < K; k += 16) {                                                          \
        const __m512 w0 = LOAD(w[0] + k), w1 = LOAD(w[1] + k);                                     \
        const __m512 w2 = LOAD(w[2] + k), w3 = LOAD(w[3] + k);                                     \
        for (int j = 0; j < 6; j++) {                                                              \
            const __m512 xj = LOAD(x[j] + k);                                                      \
            acc[j][0] = _mm512_fmadd_ps(w0, xj, acc[j][0]);                                        \
            acc[j][1] = _mm512_fmadd_ps(w1, xj, acc[j][1]);                                        \
            acc[j][2] = _mm512_fmadd_ps(w2, xj, acc[j][2]);                                        \
            acc[j][3] = _mm512_fmadd_ps(w3, xj, acc[j][3]);                                        \
        }                                                                                          \
    }                                                                                              \
    for (int j = 0; j < 6; j++)                                                                    \
        for (int i = 0; i < 4; i++) out[j * 4 + i] = hsum_16_avx512(acc[j][i]);

GR_AVX512 static void tile_f32_gemm_avx512(int64_t K, const float *const w[4], const float *const *x,
                                          float *out /* (24,) */) {
    GR_TILE_GEMM_AVX512(_mm512_loadu_ps)
}

GR_AVX512 static void tile_f16_gemm_avx512(int64_t K, const uint16_t *const w[4], const uint16_t *const *x,
                                          float *out /* (24,) */) {
    GR_TILE_GEMM_AVX512(load_h16)
}

/* the 16-lane exp; lane for lane the same arithmetic as expf_lane16() */
GR_AVX512 static inline __m512 expf_avx512(__m512 x) {
    const __m512 shift = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), shift);
    const __m512 n = _mm512_sub_ps(z, shift);
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                      _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __mmask16 d = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
                        _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
        u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
    const __m512 r = _mm512_scalef_ps(j, n);
    if (!d) return r;
    const __m512 alt = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ),
                                            _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
    return _mm512_mask_blend_ps(d, r, alt);
}

GR_AVX512 static double soft_max_avx512(int64_t n, float *y, const float *x, float max) {
    double sum = 0.0;
    int64_t i = 0;
    const __m512 vmax = _mm512_set1_ps(max);
    for (; i + 15 < n; i += 16) {
        const __m512 v = expf_avx512(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmax));
        _mm512_storeu_ps(y + i, v);
        sum += (double)hsum_16_avx512(v);
    }
    for (; i < n; i++) {
        const float v = expf(x[i] - max);
        sum += (double)v;
        y[i] = v;
    }
    return sum;
}

GR_AVX512 static inline __m512 silu_avx512_16(__m512 x) {
    const __m512 e = expf_avx512(_mm512_sub_ps(_mm512_setzero_ps(), x));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

GR_AVX512 static void silu_avx512(int64_t n, float *y, const float *x) {
    int64_t i = 0;
    for (; i + 15 < n; i += 16) _mm512_storeu_ps(y + i, silu_avx512_16(_mm512_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i]));
}

GR_AVX512 static void swiglu_avx512(int64_t n, float *y, const float *x, const float *g) {
    int64_t i = 0;
    for (; i + 15 < n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_mul_ps(silu_avx512_16(_mm512_loadu_ps(x + i)), _mm512_loadu_ps(g + i)));
    for (; i < n; i++) y[i] = (x[i] / (1.0f + expf(-x[i]))) * g[i];
}

/* F16 vectors in half precision, blocks of 128; the rest as the AVX2 build does */
GR_AVX512FP16 static void mad_f16_avx512fp16(int64_t n, uint16_t *y, const uint16_t *x, float v) {
    const int64_t np = n & ~(int64_t)127;
    const __m512h hv = _mm512_set1_ph((_Float16)v);
    for (int64_t i = 0; i < np; i += 32)
        _mm512_storeu_ph(y + i, _mm512_fmadd_ph(_mm512_loadu_ph(x + i), hv, _mm512_loadu_ph(y + i)));
    mad_f16_avx(n - np, y + np, x + np, v);
}

/* ---- flash attention's keys loop (gr_vec_ops.fa_keys_f16) -------------------
 * VKQ held in registers for DV of 64, 128 or 256, as F32 values that are F16
 * numbers (each step rounds through F16: mad_f16_avx's and scale_f16_avx's
 * steps); the scores of a block of keys computed first, then the
 * running maximum's chain over them. */
#define GR_FA_ROUND16(x) _mm512_cvtph_ps(_mm512_cvtps_ph((x), 0))

#define GR_FA_BLOCK 16

/* the query as F32 for fa_dot (qf: GR_FA_QF floats), once a row; 0 where DK is
 * not a multiple of 64 up to GR_FA_QF (dot_f16_avx512 then serves) */
#define GR_FA_QF 256
GR_AVX512 static inline int fa_query_f32(const gr_fa_keys *a, float *qf) {
    if (a->DK % 64 || a->DK > GR_FA_QF) return 0;
    for (int64_t i = 0; i < a->DK; i += 16) _mm512_storeu_ps(qf + i, load_h16(a->q + i));
    return 1;
}

/* dot_f16_avx512 of a key row and the query converted once (fa_query_f32): the
 * same products in the same sums, inlined into the scores' loop */
GR_AVX512 static inline __attribute__((always_inline)) float fa_dot(const uint16_t *k, const float *qf, int64_t DK) {
    __m512 acc[4] = { _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps() };
    for (int64_t i = 0; i < DK; i += 64)
        for (int j = 0; j < 4; j++)
            acc[j] = _mm512_fmadd_ps(load_h16(k + i + j * 16), _mm512_loadu_ps(qf + i + j * 16), acc[j]);
    return reduce_4x16_avx512(acc);
}

/* the keys of [i0, i1) (GR_FA_BLOCK at most) as bits, less those masked with -inf
 * (GR_F16_NEG_INF) where the block is whole: one compare for 16 (NULL mask: all) */
GR_AVX512 static inline uint32_t fa_live(const uint16_t *mask, int64_t i0, int64_t i1) {
    uint32_t live = (1u << (i1 - i0)) - 1;
    if (mask && i1 - i0 == GR_FA_BLOCK)
        live &= ~(uint32_t)_mm256_cmpeq_epi16_mask(_mm256_loadu_si256((const __m256i *)(mask + i0)),
                                                   _mm256_set1_epi16((short)GR_F16_NEG_INF));
    return live;
}

/* the scores of the unmasked keys of [i0, i0 + GR_FA_BLOCK) and where they are, as
 * fa_row computes them (dot, times the scale, plus the slope times the mask);
 * returns how many (computed ahead of the running maximum's chain). qf: the query
 * as F32 (fa_query_f32), or NULL */
GR_AVX512 static inline int fa_scores(const gr_fa_keys *a, const float *qf, int64_t i0, float *sc, int64_t *at) {
    const int64_t i1 = i0 + GR_FA_BLOCK < a->ic1 ? i0 + GR_FA_BLOCK : a->ic1;
    int nb = 0;
    /* the keys masked with -inf (GR_F16_NEG_INF) in one compare: with a positive
     * slope their mv is -inf, so they are skipped as below (a query of one sequence
     * among several sees mostly such keys, and converting each took longer than the
     * keys it keeps); the others take the key's steps */
    for (uint32_t live = fa_live(a->slope > 0.0f ? a->mask : NULL, i0, i1); live; live &= live - 1) {
        const int64_t ic = i0 + __builtin_ctz(live);
        const float mv = a->mask ? a->slope * gr_fp16_to_fp32(a->mask[ic]) : 0.0f;
        if (mv == -INFINITY) continue;
        if (a->k_next) {
            gr_prefetch_lines(a->k_next + ic * a->k_stride, 2 * (size_t)a->DK);
            gr_prefetch_lines(a->v_next + ic * a->v_stride, 2 * (size_t)a->DV);
        }
        const uint16_t *kd = (const uint16_t *)(a->k + ic * a->k_stride);
        float s = qf ? fa_dot(kd, qf, a->DK) : dot_f16_avx512(a->DK, kd, a->q);
        s = s * a->scale;
        s += mv;
        sc[nb] = s;
        at[nb++] = ic;
    }
    return nb;
}

/* A row's steps over a chunk of its unmasked keys, in two passes with the same
 * arithmetic as one: first the running maximum m and sum s_sum with the factors of
 * each step (VKQ's ms where the maximum moved, the value's vs; expf is a call, and
 * a call in the second pass would put VKQ's registers through memory at every key),
 * then VKQ scaled and accumulated, every element as mad_f16_avx and the portable
 * scale_f16 step it. VKQ holds F16 values, so a step whose ms is exactly 1 scales
 * nothing and is skipped. */
GR_AVX512 static inline void fa_factors(const float *sc, int n, float *m, float *s_sum, float *ms, float *vs) {
    for (int t = 0; t < n; t++) {
        const float s = sc[t], mold = *m;
        float a = 1.0f, b = 1.0f;
        if (s > mold) {
            *m = s;
            a = expf(mold - s);
        } else {
            b = expf(s - mold);
        }
        *s_sum = fmaf(*s_sum, a, b);
        ms[t] = a, vs[t] = b;
    }
}

GR_AVX512 static inline __attribute__((always_inline)) void
fa_value(const gr_fa_keys *a, __m512 *facc, int64_t ic, float ms, float vs, const int64_t NF) {
    if (ms != 1.0f) {
        const __m512 fm = _mm512_set1_ps(ms);
        _Pragma("GCC unroll 16") for (int j = 0; j < NF; j++) facc[j] = GR_FA_ROUND16(_mm512_mul_ps(facc[j], fm));
    }
    const uint16_t *vd = (const uint16_t *)(a->v + ic * a->v_stride);
    const __m512 fv = _mm512_set1_ps(vs);
    _Pragma("GCC unroll 16") for (int j = 0; j < NF; j++)
        facc[j] = GR_FA_ROUND16(_mm512_fmadd_ps(load_h16(vd + 16 * j), fv, facc[j]));
}

#define GR_FA_CHUNK 256     /* keys whose scores and factors go first (a multiple of GR_FA_BLOCK) */

/* the unmasked keys of [c0, min(c0 + GR_FA_CHUNK, ic1)): their scores, where they
 * are, and their factors (fa_factors); returns how many */
GR_AVX512 static inline int fa_chunk(const gr_fa_keys *a, const float *qf, int64_t c0, float *m, float *s_sum,
                                     float *sc, int64_t *at, float *ms, float *vs) {
    const int64_t c1 = c0 + GR_FA_CHUNK < a->ic1 ? c0 + GR_FA_CHUNK : a->ic1;
    int n = 0;
    for (int64_t i0 = c0; i0 < c1; i0 += GR_FA_BLOCK) n += fa_scores(a, qf, i0, sc + n, at + n);
    fa_factors(sc, n, m, s_sum, ms, vs);
    return n;
}

/* the F32-held form */
GR_AVX512 static inline __attribute__((always_inline)) void
fa_keys_f32_dv(const gr_fa_keys *a, float *M, float *S, uint16_t *vkq, const int64_t DV) {
    const int64_t NF = DV / 16;
    __m512 facc[DV / 16];
    _Pragma("GCC unroll 16") for (int j = 0; j < NF; j++) facc[j] = load_h16(vkq + 16 * j);
    float m = *M, s_sum = *S;
    float sc[GR_FA_CHUNK], ms[GR_FA_CHUNK], vs[GR_FA_CHUNK], qbuf[GR_FA_QF];
    int64_t at[GR_FA_CHUNK];
    const float *qf = fa_query_f32(a, qbuf) ? qbuf : NULL;
    for (int64_t c0 = a->ic0; c0 < a->ic1; c0 += GR_FA_CHUNK) {
        const int n = fa_chunk(a, qf, c0, &m, &s_sum, sc, at, ms, vs);
        for (int t = 0; t < n; t++) fa_value(a, facc, at[t], ms[t], vs[t], NF);
    }
    _Pragma("GCC unroll 16") for (int j = 0; j < NF; j++)
        _mm256_storeu_si256((__m256i *)(vkq + 16 * j), _mm512_cvtps_ph(facc[j], 0));
    *M = m, *S = s_sum;
}

GR_AVX512 static int fa_keys_f16_avx512(const gr_fa_keys *a, float *M, float *S, uint16_t *vkq) {
    switch (a->DV) {
    case 64: fa_keys_f32_dv(a, M, S, vkq, 64); return 1;
    case 128: fa_keys_f32_dv(a, M, S, vkq, 128); return 1;
    case 256: fa_keys_f32_dv(a, M, S, vkq, 256); return 1;
    default: return 0;
    }
}

/* fa_keys_f32_dv over H heads of one query row, keys outer: a chunk's live keys
 * found once (the mask is every head's), then for each key the scores of every
 * head (each key's rows of all heads lie side by side: one stream through the
 * cache where a head at a time took a row's few lines a whole row apart), the
 * factors head by head, and the values key by key, every head's VKQ (F32 values
 * that are F16 numbers) in memory. Each head gets the same steps in the same
 * order as fa_keys_f32_dv. */
#define GR_FA_HCHUNK 64
#define GR_FA_PF 4          /* live keys ahead (measured: 2-8 alike, none 25% slower) */

GR_AVX512 static inline __attribute__((always_inline)) void
fa_heads_dv(const gr_fa_heads *a, float *M, float *S, uint16_t *vkq, const int64_t DV) {
    const int64_t H = a->H, DK = a->DK, NF = DV / 16;
    float qf[GR_FA_HEADS * GR_FA_QF], acc[GR_FA_HEADS * 256];
    float sc[GR_FA_HEADS][GR_FA_HCHUNK], ms[GR_FA_HEADS][GR_FA_HCHUNK], vs[GR_FA_HEADS][GR_FA_HCHUNK];
    int64_t at[GR_FA_HCHUNK];
    const char *kh[GR_FA_HEADS], *vh[GR_FA_HEADS];
    float m[GR_FA_HEADS], s_sum[GR_FA_HEADS];
    for (int64_t h = 0; h < H; h++) {
        for (int64_t i = 0; i < DK; i += 16) _mm512_storeu_ps(qf + h * DK + i, load_h16(a->q + h * DK + i));
        for (int64_t j = 0; j < NF; j++) _mm512_storeu_ps(acc + h * DV + 16 * j, load_h16(vkq + h * DV + 16 * j));
        kh[h] = a->k + (size_t)((a->h0 + h) / a->rk) * a->k_head;
        vh[h] = a->v + (size_t)((a->h0 + h) / a->rv) * a->v_head;
        m[h] = M[h], s_sum[h] = S[h];
    }
    /* the bytes of a key's rows of these heads, from kh[0] (vh[0]) on */
    const size_t kspan = (size_t)((a->h0 + H - 1) / a->rk - a->h0 / a->rk) * a->k_head + 2 * (size_t)DK;
    const size_t vspan = (size_t)((a->h0 + H - 1) / a->rv - a->h0 / a->rv) * a->v_head + 2 * (size_t)DV;
    for (int64_t c0 = a->ic0; c0 < a->ic1; c0 += GR_FA_HCHUNK) {
        const int64_t c1 = c0 + GR_FA_HCHUNK < a->ic1 ? c0 + GR_FA_HCHUNK : a->ic1;
        int n = 0;
        for (int64_t i0 = c0; i0 < c1; i0 += GR_FA_BLOCK) {
            const int64_t i1 = i0 + GR_FA_BLOCK < c1 ? i0 + GR_FA_BLOCK : c1;
            for (uint32_t live = fa_live(a->mask, i0, i1); live; live &= live - 1) {
                const int64_t ic = i0 + __builtin_ctz(live);
                if (a->mask && gr_fp16_to_fp32(a->mask[ic]) == -INFINITY) continue;
                at[n++] = ic;
            }
        }
        /* the values' rows go to the second level here, for the pass after the
         * factors; where the live keys are not side by side (other sequences' cells
         * between them: the hardware prefetchers then fetch rows never read, and stop
         * at every page), the keys' and values' rows GR_FA_PF live keys ahead too */
        if (n > GR_FA_PF && at[GR_FA_PF] != at[0] + GR_FA_PF)
            for (int t = 0; t < GR_FA_PF; t++) gr_prefetch_lines(kh[0] + at[t] * a->k_stride, kspan);
        for (int t = 0; t < n; t++) {
            const int64_t ic = at[t];
            if (t + GR_FA_PF < n && at[t + GR_FA_PF] != ic + GR_FA_PF)
                gr_prefetch_lines(kh[0] + at[t + GR_FA_PF] * a->k_stride, kspan);
            for (size_t o = 0; o < vspan; o += 64) _mm_prefetch(vh[0] + ic * a->v_stride + o, _MM_HINT_T1);
            const float mv = a->mask ? gr_fp16_to_fp32(a->mask[ic]) : 0.0f;
            for (int64_t h = 0; h < H; h++) {
                float sk = fa_dot((const uint16_t *)(kh[h] + ic * a->k_stride), qf + h * DK, DK);
                sk = sk * a->scale;
                sk += mv;
                sc[h][t] = sk;
            }
        }
        for (int64_t h = 0; h < H; h++) fa_factors(sc[h], n, &m[h], &s_sum[h], ms[h], vs[h]);
        for (int t = 0; t < n; t++) {
            const int64_t ic = at[t];
            if (t + GR_FA_PF < n && at[t + GR_FA_PF] != ic + GR_FA_PF)
                gr_prefetch_lines(vh[0] + at[t + GR_FA_PF] * a->v_stride, vspan);
            for (int64_t h = 0; h < H; h++) {
                float *ah = acc + h * DV;
                const uint16_t *vd = (const uint16_t *)(vh[h] + ic * a->v_stride);
                const float fms = ms[h][t];
                const __m512 fv = _mm512_set1_ps(vs[h][t]);
                if (fms != 1.0f) {
                    const __m512 fm = _mm512_set1_ps(fms);
                    _Pragma("GCC unroll 16") for (int j = 0; j < NF; j++)
                        _mm512_storeu_ps(ah + 16 * j, GR_FA_ROUND16(_mm512_mul_ps(_mm512_loadu_ps(ah + 16 * j), fm)));
                }
                _Pragma("GCC unroll 16") for (int j = 0; j < NF; j++)
                    _mm512_storeu_ps(ah + 16 * j, GR_FA_ROUND16(_mm512_fmadd_ps(load_h16(vd + 16 * j), fv,
                                                                                _mm512_loadu_ps(ah + 16 * j))));
            }
        }
    }
    for (int64_t h = 0; h < H; h++) {
        for (int64_t j = 0; j < NF; j++)
            _mm256_storeu_si256((__m256i *)(vkq + h * DV + 16 * j), _mm512_cvtps_ph(_mm512_loadu_ps(acc + h * DV + 16 * j), 0));
        M[h] = m[h], S[h] = s_sum[h];
    }
}

GR_AVX512 static int fa_heads_f16_avx512(const gr_fa_heads *a, float *M, float *S, uint16_t *vkq) {
    if (a->H < 1 || a->H > GR_FA_HEADS || a->DK % 64 || a->DK > GR_FA_QF) return 0;
    switch (a->DV) {
    case 64: fa_heads_dv(a, M, S, vkq, 64); return 1;
    case 128: fa_heads_dv(a, M, S, vkq, 128); return 1;
    case 256: fa_heads_dv(a, M, S, vkq, 256); return 1;
    default: return 0;
    }
}

GR_AVX512FP16 static int fa_heads_f16_avx512fp16(const gr_fa_heads *a, float *M, float *S, uint16_t *vkq) {
    /* fa_keys_f16_avx512fp16's rule: DV 64 only */
    if (a->DV != 64 || a->H < 1 || a->H > GR_FA_HEADS || a->DK % 64 || a->DK > GR_FA_QF) return 0;
    fa_heads_dv(a, M, S, vkq, 64);
    return 1;
}

GR_AVX512FP16 static int fa_keys_f16_avx512fp16(const gr_fa_keys *a, float *M, float *S, uint16_t *vkq) {
    /* under 128 no F16 block (mad_f16_avx's steps); F16 blocks (measured no faster
     * held in registers than through mad_f16_avx512fp16) take fa_row's loop */
    if (a->DV != 64) return 0;
    fa_keys_f32_dv(a, M, S, vkq, 64);
    return 1;
}

GR_AVX512FP16 static void scale_f16_avx512fp16(int64_t n, uint16_t *y, float v) {
    const int64_t np = n & ~(int64_t)127;
    const __m512h hv = _mm512_set1_ph((_Float16)v);
    for (int64_t i = 0; i < np; i += 32) _mm512_storeu_ph(y + i, _mm512_mul_ph(_mm512_loadu_ph(y + i), hv));
    for (int64_t i = np; i < n; i++) y[i] = gr_fp32_to_fp16(gr_fp16_to_fp32(y[i]) * v);
}
#define GR_AVX512BF16 __attribute__((target("avx512bf16,avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")))

GR_AVX512BF16 static inline __m512 dpbf16_avx512(__m512 acc, const uint16_t *a, const uint16_t *b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(a), (__m512bh)_mm512_loadu_si512(b));
}

GR_AVX512BF16 static void dot_bf16_avx512bf16(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    __m512 c1 = _mm512_setzero_ps(), c2 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        c1 = dpbf16_avx512(c1, x + i, y + i);
        c2 = dpbf16_avx512(c2, x + i + 32, y + i + 32);
    }
    double sum = (double)hsum_16_avx512(c1);
    sum += (double)hsum_16_avx512(c2);
    for (; i < n; i++) sum += (double)(bf16_f32(x[i]) * bf16_f32(y[i]));
    *s = (float)sum;
}

GR_AVX512BF16 static void dot_bf16_gemm_avx512bf16(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 32) acc = dpbf16_avx512(acc, x + i, y + i);
    *s = hsum_16_avx512(acc);
}

/* ---- the x86 set per family, for gr_vec_init ---------------------------- */
int gr_vec_x86(int family, int use_simd, gr_vec_ops *v) {
    const unsigned cpu = gr_cpu_features();
    const int bf16 = family >= GR_FAMILY_AVX512_BF16;
    if (use_simd && (cpu & GR_CPU_AVX2) && family == GR_FAMILY_AVX2) {
        v->lanes = 8;
        v->dot_f32 = dot_f32_avx, v->dot_f32_gemm = dot_f32_gemm_avx, v->dot_f16 = dot_f16_avx;
        v->dot_f16_gemm = dot_f16_gemm_avx, v->fp16_to_fp32 = fp16_to_fp32_avx, v->fp32_to_fp16 = fp32_to_fp16_avx;
        v->soft_max = soft_max_avx, v->silu = silu_avx, v->swiglu = swiglu_avx;
        v->mad_f32 = mad_f32_avx, v->mad_f16 = mad_f16_avx, v->scale_f16 = scale_f16_avx;
        v->tile_cols = 2, v->tile_f32_gemm = tile_f32_gemm_avx, v->tile_f16_gemm = tile_f16_gemm_avx;
        v->gemm_f32 = gemm_f32_avx, v->dot_bf16_gemm = dot_bf16_gemm_avx;
        v->rope_rotate = rope_rotate_avx;
        return 1;
    }
    if (use_simd && family != GR_FAMILY_AVX2 && (cpu & GR_CPU_AVX512) && (!bf16 || (cpu & GR_CPU_AVX512_BF16)) &&
        (family != GR_FAMILY_AVX512_FP16 || (cpu & GR_CPU_AVX512_FP16))) {
        /* element-wise primitives (mad, conversions, rope, the FA GEMM's per-entry sums)
         * give the same bits at either width: the AVX2 versions serve */
        const int fp16 = family == GR_FAMILY_AVX512_FP16;
        v->lanes = 16;
        v->dot_f32 = dot_f32_avx512, v->dot_f32_gemm = dot_f32_gemm_avx512, v->dot_f16 = dot_f16_avx512;
        v->dot_f16_gemm = dot_f16_gemm_avx512, v->fp16_to_fp32 = fp16_to_fp32_avx, v->fp32_to_fp16 = fp32_to_fp16_avx;
        v->soft_max = soft_max_avx512, v->silu = silu_avx512, v->swiglu = swiglu_avx512;
        v->mad_f32 = mad_f32_avx, v->mad_f16 = fp16 ? mad_f16_avx512fp16 : mad_f16_avx;
        v->scale_f16 = fp16 ? scale_f16_avx512fp16 : scale_f16_avx;
        v->fa_keys_f16 = fp16 ? fa_keys_f16_avx512fp16 : fa_keys_f16_avx512;
        v->fa_heads_f16 = fp16 ? fa_heads_f16_avx512fp16 : fa_heads_f16_avx512;
        v->tile_cols = 6, v->tile_f32_gemm = tile_f32_gemm_avx512, v->tile_f16_gemm = tile_f16_gemm_avx512;
        v->gemm_f32 = gemm_f32_avx;
        v->dot_bf16 = bf16 ? dot_bf16_avx512bf16 : NULL;
        v->dot_bf16_gemm = bf16 ? dot_bf16_gemm_avx512bf16 : dot_bf16_gemm_avx512;
        v->rope_rotate = rope_rotate_avx;
        return 1;
    }
    return 0;
}

#endif /* GR_X86 */
