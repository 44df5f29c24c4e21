/* The AVX2 + FMA + F16C versions of the quant kernels (ggml keeps its own in
 * arch/x86): compiled with target attributes and picked at run time by dispatch.c
 * where the CPU has them (simd.h's probe), through the table at the end of this
 * file. Each computes the bits of its portable twin in quants.c, which the tests
 * compare it against.
 */
#include "cpu/quants/quants_impl.h"
#include "cpu/quants/x86/x86_impl.h"

#include <string.h>

#if GR_X86

/* signed int8 x signed int8, 32 lanes -> 8 int32 lanes of 4-product sums
 * (the sign of x moves onto y so that PMADDUBSW sees |x| unsigned) */
GR_AVX2 static inline __m256i gr_dot_i8(__m256i x, __m256i y) {
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* two int16 scales, one per 128-bit half (16 elements each of a 32-byte
 * PMADDUBSW), or the same one twice */
GR_AVX2 static inline __m256i gr_scales16(int lo, int hi) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)lo)),
                                   _mm_set1_epi16((short)hi), 1);
}

GR_AVX2 void gr_f16_to_f32_row_f16c(const void *vx /* (n,) f16 */, float *y /* (n,) */, int64_t n) {
    const uint16_t *x = vx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    }
    for (; i < n; i++) {
        y[i] = _cvtsh_ss(x[i]);
    }
}

GR_AVX2 void gr_f32_to_f16_row_f16c(const float *x /* (n,) */, void *vy /* (n,) f16 */, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(y + i), h);
    }
    for (; i < n; i++) {
        y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
    }
}

GR_AVX2 void gr_bf16_to_f32_row_avx2(const void *vx /* (n,) bf16 */, float *y /* (n,) */, int64_t n) {
    const uint16_t *x = vx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; i++) {
        y[i] = gr_bf16_to_fp32(x[i]);
    }
}

/* one Q8_0/Q8_1 block the way ggml's AVX quantizer computes it (same lane
 * order as gr_amax32_lanes/gr_q8_block_x86, which it must equal bit for bit) */
GR_AVX2 static inline float gr_q8_block_avx2(const float *x /* (32,) */, int8_t *qs /* (32,) */,
                                             int32_t *sum) {
    __m256 v0 = _mm256_loadu_ps(x);
    __m256 v1 = _mm256_loadu_ps(x + 8);
    __m256 v2 = _mm256_loadu_ps(x + 16);
    __m256 v3 = _mm256_loadu_ps(x + 24);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_andnot_ps(sign, v0);
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v1));
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v2));
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v3));
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);

    const float d = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    const int rn = _MM_FROUND_TO_NEAREST_INT;
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, id), rn));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, id), rn));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, id), rn));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, id), rn));
    *sum = gr_hsum_epi32x8(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));

    /* the packs work per 128-bit lane: dwords come out as 0 4 1 5 2 6 3 7 */
    const __m256i w01 = _mm256_packs_epi32(i0, i1);
    const __m256i w23 = _mm256_packs_epi32(i2, i3);
    const __m256i b = _mm256_packs_epi16(w01, w23);
    const __m256i q = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)qs, q);
    return d;
}

GR_AVX2 void quantize_row_q8_0_avx2(const float *x /* (n,) */, void *vy /* (n/32,) blocks */, int64_t n) {
    gr_q8_0_row(x, vy, n, gr_q8_block_avx2);
}

GR_AVX2 void quantize_row_q8_1_avx2(const float *x /* (n,) */, void *vy /* (n/32,) blocks */, int64_t n) {
    gr_q8_1_row(x, vy, n, gr_q8_block_avx2);
}

/* Q8_K as quantize_row_q8_K: the first element of the largest magnitude (a NaN
 * never wins, as fabsf(NaN) > amax is false), the codes by the same magic-number
 * rounding and clamp, int8 as the cast keeps them, bsums of the stored codes */
GR_AVX2 void quantize_row_q8_K_avx2(const float *x /* (n,) */, void *vy /* (n/256,) blocks */, int64_t n) {
    block_q8_K *y = vy;
    const __m256 nosign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t i = 0; i < n / GR_QK_K; i++, x += GR_QK_K) {
        __m256 am = _mm256_setzero_ps();
        for (int j = 0; j < GR_QK_K; j += 8) {
            const __m256 a = _mm256_and_ps(nosign, _mm256_loadu_ps(x + j));
            am = _mm256_blendv_ps(am, a, _mm256_cmp_ps(a, am, _CMP_GT_OQ));
        }
        float lanes[8], amax = 0.0f;
        _mm256_storeu_ps(lanes, am);
        for (int k = 0; k < 8; k++) amax = lanes[k] > amax ? lanes[k] : amax;
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        int first = 0;
        for (int j = 0; j < GR_QK_K; j += 8) {
            const __m256 a = _mm256_and_ps(nosign, _mm256_loadu_ps(x + j));
            const int m = _mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (m) {
                first = j + __builtin_ctz((unsigned)m);
                break;
            }
        }
        const float iscale = -127.0f / x[first];
        const __m256 is = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.0f);
        const __m256i mant = _mm256_set1_epi32(0x7fffff), half = _mm256_set1_epi32(0x400000), top = _mm256_set1_epi32(127);
        for (int g = 0; g < 16; g++) {
            __m256i v[2];
            for (int h = 0; h < 2; h++) {
                const __m256 t = _mm256_add_ps(_mm256_mul_ps(is, _mm256_loadu_ps(x + 16 * g + 8 * h)), magic);
                const __m256i c = _mm256_min_epi32(_mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(t), mant), half), top);
                v[h] = _mm256_srai_epi32(_mm256_slli_epi32(c, 24), 24);   /* the int8 the cast keeps */
            }
            const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(v[0], v[1]), 0xD8);
            _mm_storeu_si128((__m128i *)(y[i].qs + 16 * g),
                             _mm_packs_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1)));
            const __m256i s8 = _mm256_add_epi32(v[0], v[1]);
            __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
            s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
            s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
            y[i].bsums[g] = (int16_t)_mm_cvtsi128_si32(s);
        }
        y[i].d = 1.0f / iscale;
    }
}

/* F32/F16: four 8-lane FMA accumulators over steps of 32, reduced pairwise,
 * then the tail; F16 keeps the tail in double like ggml */
GR_AVX2 static inline float gr_reduce4_ps8(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 a = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
}

GR_AVX2 void vec_dot_f32_f32_avx2(int64_t n, float *s, const void *vx /* (n,) f32 */,
                                         const void *vy /* (n,) f32 */) {
    const float *x = vx, *y = vy;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const int64_t np = n & ~(int64_t)31;
    for (int64_t i = 0; i < np; i += 32) {
        for (int j = 0; j < 4; j++) {
            acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * j), _mm256_loadu_ps(y + i + 8 * j), acc[j]);
        }
    }
    float sum = gr_reduce4_ps8(acc[0], acc[1], acc[2], acc[3]);
    for (int64_t i = np; i < n; i++) {
        sum += x[i] * y[i];
    }
    *s = sum;
}

GR_AVX2 void vec_dot_f16_f16_avx2(int64_t n, float *s, const void *vx /* (n,) f16 */,
                                         const void *vy /* (n,) f16 */) {
    const uint16_t *x = vx, *y = vy;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const int64_t np = n & ~(int64_t)31;
    for (int64_t i = 0; i < np; i += 32) {
        for (int j = 0; j < 4; j++) {
            const __m256 ax = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i + 8 * j)));
            const __m256 ay = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i + 8 * j)));
            acc[j] = _mm256_fmadd_ps(ax, ay, acc[j]);
        }
    }
    double sum = gr_reduce4_ps8(acc[0], acc[1], acc[2], acc[3]);
    for (int64_t i = np; i < n; i++) {
        sum += (double)(_cvtsh_ss(x[i]) * _cvtsh_ss(y[i]));
    }
    *s = (float)sum;
}

/* BF16: ggml multiplies and adds separately here (no FMA) */
GR_AVX2 static inline __m256 gr_load_bf16x8(const uint16_t *p /* (8,) */) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

GR_AVX2 void vec_dot_bf16_bf16_avx2(int64_t n, float *s, const void *vx /* (n,) bf16 */,
                                           const void *vy /* (n,) bf16 */) {
    const uint16_t *x = vx, *y = vy;
    __m256 c[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        for (int j = 0; j < 4; j++) {
            c[j] = _mm256_add_ps(_mm256_mul_ps(gr_load_bf16x8(x + i + 8 * j), gr_load_bf16x8(y + i + 8 * j)), c[j]);
        }
    }
    double sum = gr_hsum_ps8(_mm256_add_ps(_mm256_add_ps(c[0], c[2]), _mm256_add_ps(c[1], c[3])));
    for (; i < n; i++) {
        sum += (double)(gr_bf16_to_fp32(x[i]) * gr_bf16_to_fp32(y[i]));
    }
    *s = (float)sum;
}

/* fp16 -> fp32 by table in the Q4/Q5/Q8 block kernels, as ggml's x86 build
 * converts block scales: on CPUs where VCVTPH2PS is slow (Zen 1: ~12% of the
 * Q4_0 kernel) two loads are cheaper; same values (gr_fp16_to_fp32 is F16C's
 * conversion, NaNs included). Filled when the library loads. */
static float gr_f16_tab[1 << 16];

__attribute__((constructor)) static void gr_f16_tab_init(void) {
    for (uint32_t h = 0; h < (1u << 16); h++) gr_f16_tab[h] = gr_fp16_to_fp32((uint16_t)h);
}

#define GR_F16(h) gr_f16_tab[(uint16_t)(h)]

GR_AVX2 void vec_dot_q4_0_q8_0_avx2(int64_t n, float *s, const void *vx /* (n/32,) q4_0 */,
                                           const void *vy /* (n/32,) q8_0 */) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK; i++) {
        const __m256 d = _mm256_set1_ps(GR_F16(x[i].d) * GR_F16(y[i].d));
        const __m256i qx = _mm256_sub_epi8(gr_nibbles32(x[i].qs), _mm256_set1_epi8(8));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(gr_dot_i8(qx, qy)), acc);
    }
    *s = gr_hsum_ps8(acc);
}

GR_AVX2 void vec_dot_q8_0_q8_0_avx2(int64_t n, float *s, const void *vx /* (n/32,) q8_0 */,
                                           const void *vy /* (n/32,) q8_0 */) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK; i++) {
        const __m256 d = _mm256_set1_ps(GR_F16(x[i].d) * GR_F16(y[i].d));
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(gr_dot_i8(qx, qy)), acc);
    }
    *s = gr_hsum_ps8(acc);
}

/* Q4_0 x Q8_0 with the offset moved out of the inner loop: per lane,
 * sum((x - 8) * y) = sum(x * y) - 8 * sum(y), x in 0..15 unsigned, so PMADDUBSW
 * takes the nibbles as they are (no sign juggling) and 8 * sum(y) per lane is
 * computed once per activation row (it is shared by every weight row). The int32
 * lanes equal those of vec_dot_q4_0_q8_0_avx2 exactly, except where y holds -128
 * (that kernel's sign trick overflows there): such blocks are marked and take
 * that kernel's steps. */
#define GR_Q4S_MARK INT32_MIN

GR_AVX2 void q4_0_act_sums_avx2(const void *vy /* (nb,) q8_0 */, int32_t *sums /* (nb, 8) */, int64_t nb) {
    const block_q8_0 *y = vy;
    for (int64_t i = 0; i < nb; i++) {
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        __m256i v = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(8), qy), _mm256_set1_epi16(1));
        if (_mm256_movemask_epi8(_mm256_cmpeq_epi8(qy, _mm256_set1_epi8(-128))))
            v = _mm256_set1_epi32(GR_Q4S_MARK);
        _mm256_storeu_si256((__m256i *)(sums + 8 * i), v);
    }
}

GR_AVX2 void vec_dot_q4_0_q8_0_sums_avx2(int64_t n, float *s, const void *vx /* (n/32,) q4_0 */,
                                                const void *vy /* (n/32,) q8_0 */, const int32_t *sums) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK; i++) {
        const __m256 d = _mm256_set1_ps(GR_F16(x[i].d) * GR_F16(y[i].d));
        const __m256i qx = gr_nibbles32(x[i].qs);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        __m256i p;
        if (sums[8 * i] != GR_Q4S_MARK)
            p = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(qx, qy), _mm256_set1_epi16(1)),
                                 _mm256_loadu_si256((const __m256i *)(sums + 8 * i)));
        else
            p = gr_dot_i8(_mm256_sub_epi8(qx, _mm256_set1_epi8(8)), qy);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
    }
    *s = gr_hsum_ps8(acc);
}

/* d[j] = dx * d_act[j] for the eight lanes, as vec_dot computes each */
GR_AVX2 static inline void gr_panel_scales(float dx, const uint8_t *p, float dp[8]) {
    _mm256_store_ps(dp, _mm256_mul_ps(_mm256_set1_ps(dx), _mm256_loadu_ps((const float *)p)));
}

/* The eight accumulators are named variables, not an array: GCC keeps an
 * array of them in memory and stores all eight on every block. STEP(j, q) adds
 * lane j's int32 lanes q (as floats, scaled) to acc##j. */
#define GR_PANEL_ACC8                                                                    \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0, acc4 = acc0, \
           acc5 = acc0, acc6 = acc0, acc7 = acc0
#define GR_PANEL_FMA(j, f) acc##j = _mm256_fmadd_ps(_mm256_broadcast_ss(dp + (j)), (f), acc##j)
#define GR_PANEL_EACH(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
/* four lanes at a time, the integer steps of the four before their float steps
 * (a little faster than lane after lane on Zen 1): I(j) gives lane j's int32
 * lanes, F(j, v) their floats */
#define GR_PANEL_QUAD(a, b, c, d, I, F)                                  \
    {                                                                   \
        const __m256i va = I(a), vb = I(b), vc = I(c), vd = I(d);       \
        GR_PANEL_FMA(a, F(a, va)); GR_PANEL_FMA(b, F(b, vb));           \
        GR_PANEL_FMA(c, F(c, vc)); GR_PANEL_FMA(d, F(d, vd));           \
    }
#define GR_PANEL_STAGED(I, F) GR_PANEL_QUAD(0, 1, 2, 3, I, F) GR_PANEL_QUAD(4, 5, 6, 7, I, F)
/* unsigned codes qx against lane j's q8 (no sign steps): the int32 lane sums */
#define GR_PANEL_U8_INT(j) \
    _mm256_madd_epi16(_mm256_maddubs_epi16(qx, _mm256_loadu_si256((const __m256i *)(p + 32 + 32 * (j)))), _mm256_set1_epi16(1))

/* s[j] = gr_hsum_ps8(acc_j) for the eight at once, the same additions in the
 * same order per output: (v0+v4)+(v2+v6) and (v1+v5)+(v3+v7), then their sum */
GR_AVX2 static inline void gr_hsum8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5,
                                      __m256 a6, __m256 a7, float *s) {
#define GR_HALVES(x, y) _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x31), _mm256_permute2f128_ps(x, y, 0x20))
    const __m256 t01 = GR_HALVES(a0, a1), t23 = GR_HALVES(a2, a3);   /* r_j[k] = v_k + v_(k+4) */
    const __m256 t45 = GR_HALVES(a4, a5), t67 = GR_HALVES(a6, a7);
#undef GR_HALVES
    const __m256 u0 = _mm256_add_ps(_mm256_shuffle_ps(t01, t23, 0x44), _mm256_shuffle_ps(t01, t23, 0xEE));
    const __m256 u1 = _mm256_add_ps(_mm256_shuffle_ps(t45, t67, 0x44), _mm256_shuffle_ps(t45, t67, 0xEE));
    const __m256 h = _mm256_hadd_ps(u0, u1);   /* s0 s2 s4 s6 | s1 s3 s5 s7 */
    _mm256_storeu_ps(s, _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}
#define GR_PANEL_STORE8 gr_hsum8x8(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, s)

/* lane j's int32 lanes by the sign trick, as floats */
GR_AVX2 static inline __m256 gr_panel_sign_lane(__m256i qx, const uint8_t *p, int j) {
    return _mm256_cvtepi32_ps(gr_dot_i8(qx, _mm256_loadu_si256((const __m256i *)(p + 32 + 32 * j))));
}

GR_AVX2 void panel_dot_q8_0_avx2(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) q8_0 */,
                                        const void *panel /* (n/32,) panel blocks */) {
    const block_q8_0 *x = vx;
    const uint8_t *p = panel;
    GR_PANEL_ACC8;
    float dp[8] __attribute__((aligned(32)));
    for (int64_t i = 0; i < n / GR_QK; i++, p += GR_PANEL_Q8) {
        gr_panel_scales(GR_F16(x[i].d), p, dp);
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
#define Q8_INT(j) gr_dot_i8(qx, _mm256_loadu_si256((const __m256i *)(p + 32 + 32 * (j))))
#define Q8_FLT(j, v) _mm256_cvtepi32_ps(v)
        GR_PANEL_STAGED(Q8_INT, Q8_FLT)
    }
    GR_PANEL_STORE8;
}

/* Q4_K: the min term goes to a 4-lane accumulator (pairs of sub-blocks), the
 * scale term to an 8-lane one, as in ggml's AVX2 kernel. The 6-bit scales and
 * mins are unpacked with word masks into one vector (scales in the low half,
 * mins in the high half, as int16) and each sub-block's scale is broadcast with
 * a byte shuffle: integer work only, so the sums are those of the scalar unpack.
 * The masks work on the first two words side by side in one 64-bit word, which
 * goes into the vector with one shuffle: the four 32-bit inserts it replaces cost
 * a K-quant small batch a tenth of its time (Zen 4 class, one thread, in cache:
 * Q4_K two columns 10.6 -> 9.5 ns a block and row, one 7.9 -> 6.9, four 16.4 ->
 * 15.6; AVX2 build 13.4 -> 12.6, 9.0 -> 7.9, 21.3 -> 20.1). */
GR_AVX2 static inline __m256i gr_q4K_scales_mins(const uint8_t *q /* (12,) */) {
    uint64_t a;
    uint32_t w2;
    memcpy(&a, q, 8);
    memcpy(&w2, q + 8, 4);
    const uint64_t m6 = 0x3f3f3f3f3f3f3f3full, m4 = 0x0f0f0f0f0f0f0f0full, m2 = 0x0303030303030303ull;
    /* byte by byte, words 0 and 1 side by side: (sc_lo, mn_lo) and (sc_hi, mn_hi) */
    const uint64_t lo = a & m6;
    const uint64_t hi = ((w2 | ((uint64_t)(w2 >> 4) << 32)) & m4) | (((a >> 6) & m2) << 4);
    /* (sc_lo, mn_lo, sc_hi, mn_hi) as dwords, then (sc_lo, sc_hi, mn_lo, mn_hi) */
    return _mm256_cvtepu8_epi16(_mm_shuffle_epi32(_mm_set_epi64x((long long)hi, (long long)lo), 0xD8));
}

/* int16 element k of each 128-bit half broadcast over that half */
#define GR_BCAST16(k) _mm256_set1_epi16((short)(((2 * (k) + 1) << 8) | (2 * (k))))

/* one block: the scale term's int32 lanes; *mins the min term's four int32 lanes */
GR_AVX2 static inline __attribute__((always_inline)) __m256i
gr_q4K_block(const block_q4_K *x, const block_q8_K *y, __m128i q8s, __m128i *mins) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i ms = gr_q4K_scales_mins(x->scales);
    *mins = _mm_madd_epi16(_mm256_extracti128_si256(ms, 1), q8s);
    const __m256i sc = _mm256_permute2x128_si256(ms, ms, 0x00);   /* the scales in both halves */
    const uint8_t *q4 = x->qs;
    const int8_t *q8 = y->qs;
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++, q4 += 32, q8 += 64) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)q4);
        const __m256i lo = _mm256_and_si256(bits, m4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q8));
        const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_shuffle_epi8(sc, GR_BCAST16(2 * j)), pl));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_shuffle_epi8(sc, GR_BCAST16(2 * j + 1)), ph));
    }
    return sumi;
}

/* sums of 32 q8 per sub-block, two sub-blocks a lane */
GR_AVX2 static inline __m128i gr_q8K_pair_sums(const block_q8_K *y) {
    const __m256i bsums = _mm256_loadu_si256((const __m256i *)y->bsums);
    return _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
}

GR_AVX2 static inline float gr_q4K_finish(__m256 acc, __m128 acc_m) {
    acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    return gr_hsum_ps8(acc) + _mm_cvtss_f32(acc_m);
}

GR_AVX2 void vec_dot_q4_K_q8_K_avx2(int64_t n, float *s, const void *vx /* (n/256,) q4_K */,
                                           const void *vy /* (n/256,) q8_K */) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    __m256 acc = _mm256_setzero_ps();
    __m128 acc_m = _mm_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const float d = y[i].d * _cvtsh_ss(x[i].d);
        const float dmin = -y[i].d * _cvtsh_ss(x[i].dmin);
        __m128i mins;
        const __m256i sumi = gr_q4K_block(&x[i], &y[i], gr_q8K_pair_sums(&y[i]), &mins);
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mins), acc_m);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = gr_q4K_finish(acc, acc_m);
}

/* Four weight rows against one activation row (decode): each output summed
 * exactly as vec_dot_q4_K_q8_K_avx2 sums it, the four chains interleaved */
GR_AVX2 void vec_dot_rows4_q4_K_q8_K_avx2(int64_t n, float *s /* (4,) */, const void *const vx[4],
                                          const void *vy /* (n/256,) q8_K */) {
    const block_q4_K *x[4] = {vx[0], vx[1], vx[2], vx[3]};
    const block_q8_K *y = vy;
    __m256 acc[4];
    __m128 acc_m[4];
    for (int r = 0; r < 4; r++) {
        acc[r] = _mm256_setzero_ps();
        acc_m[r] = _mm_setzero_ps();
    }
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const __m128i q8s = gr_q8K_pair_sums(&y[i]);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            gr_prefetch_block_ahead_l2(&x[r][i], sizeof(block_q4_K));
            const float d = y[i].d * _cvtsh_ss(x[r][i].d);
            const float dmin = -y[i].d * _cvtsh_ss(x[r][i].dmin);
            __m128i mins;
            const __m256i sumi = gr_q4K_block(&x[r][i], &y[i], q8s, &mins);
            acc_m[r] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mins), acc_m[r]);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[r]);
        }
    }
    for (int r = 0; r < 4; r++) s[r] = gr_q4K_finish(acc[r], acc_m[r]);
}

/* Q8_0, four weight rows against one activation row, as vec_dot_q8_0_q8_0_avx2 */
GR_AVX2 void vec_dot_rows4_q8_0_q8_0_avx2(int64_t n, float *s /* (4,) */, const void *const vx[4],
                                          const void *vy /* (n/32,) q8_0 */) {
    const block_q8_0 *x[4] = {vx[0], vx[1], vx[2], vx[3]};
    const block_q8_0 *y = vy;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < n / GR_QK; i++) {
        const float dy = GR_F16(y[i].d);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            gr_prefetch_ahead_l2(&x[r][i]);
            const __m256 d = _mm256_set1_ps(GR_F16(x[r][i].d) * dy);
            const __m256i qx = _mm256_loadu_si256((const __m256i *)x[r][i].qs);
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(gr_dot_i8(qx, qy)), acc[r]);
        }
    }
    for (int r = 0; r < 4; r++) s[r] = gr_hsum_ps8(acc[r]);
}

GR_AVX2 void vec_dot_q5_K_q8_K_avx2(int64_t n, float *s, const void *vx /* (n/256,) q5_K */,
                                           const void *vy /* (n/256,) q8_K */) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc = _mm256_setzero_ps();
    float acc_m = 0.0f;
    uint8_t sc[8], mn[8];
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const float d = y[i].d * _cvtsh_ss(x[i].d);
        const float dmin = -y[i].d * _cvtsh_ss(x[i].dmin);
        gr_k4_scales(x[i].scales, sc, mn);
        /* fused, as ggml's `summs += dmin * isum` compiles for x86 (contracted) */
        acc_m = fmaf(dmin, (float)gr_k4_minsum(mn, y[i].bsums), acc_m);

        const uint8_t *q5 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++, q5 += 32, q8 += 64) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)q5);
            /* bit 2j of qh[l] is the 5th bit of the low nibble, bit 2j+1 of the high */
            const __m256i hl = _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j), _mm256_set1_epi8(1));
            const __m256i hh = _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j + 1), _mm256_set1_epi8(1));
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(bits, m4), _mm256_slli_epi16(hl, 4));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4),
                                               _mm256_slli_epi16(hh, 4));
            const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q8));
            const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * j]), pl));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * j + 1]), ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = gr_hsum_ps8(acc) + acc_m;
}

/* Q6_K: the 128 codes 0..63 of half a block, 32 per vector (low nibbles of ql[0..31],
 * of ql[32..63], then their high nibbles, each with two bits of qh) */
GR_AVX2 static inline __attribute__((always_inline)) void gr_q6K_codes(const uint8_t *ql /* (64,) */,
                                                                       const uint8_t *qh /* (32,) */, __m256i q[4]) {
    const __m256i m3 = _mm256_set1_epi8(3), m15 = _mm256_set1_epi8(15);
    const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    const __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m15), _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m15),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m3), 4));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m15),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m3), 4));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m15),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m3), 4));
}

/* Q6_K: the unsigned codes 0..63 go through PMADDUBSW; the bias of 32 comes
 * off at the end as 32 * sum(scale * bsum). One block's int32 lanes: */
GR_AVX2 static inline __attribute__((always_inline)) __m256i
gr_q6K_block(const block_q6_K *x, const block_q8_K *y, __m256i bsums) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    const __m256i bias = _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 5);
    const uint8_t *ql = x->ql;
    const uint8_t *qh = x->qh;
    const int8_t *q8 = y->qs;
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++, ql += 64, qh += 32, q8 += 128) {
        /* this half's eight scales in both 128-bit lanes; pair k is picked with a shuffle */
        const __m256i sch = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11)
                              : _mm256_permute2x128_si256(sc16, sc16, 0x00);
        __m256i q[4];
        gr_q6K_codes(ql, qh, q);
        for (int k = 0; k < 4; k++) {
            const __m256i p16 = _mm256_maddubs_epi16(q[k], _mm256_loadu_si256((const __m256i *)(q8 + 32 * k)));
            const __m256i pick = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_set1_epi16((short)(((4 * k + 1) << 8) | (4 * k)))),
                _mm_set1_epi16((short)(((4 * k + 3) << 8) | (4 * k + 2))), 1);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_shuffle_epi8(sch, pick), p16));
        }
    }
    return _mm256_sub_epi32(sumi, bias);
}

GR_AVX2 void vec_dot_q6_K_q8_K_avx2(int64_t n, float *s, const void *vx /* (n/256,) q6_K */,
                                           const void *vy /* (n/256,) q8_K */) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const float d = y[i].d * _cvtsh_ss(x[i].d);
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        const __m256i sumi = gr_q6K_block(&x[i], &y[i], bsums);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = gr_hsum_ps8(acc);
}

/* Four weight rows against one activation row, each as vec_dot_q6_K_q8_K_avx2 */
GR_AVX2 void vec_dot_rows4_q6_K_q8_K_avx2(int64_t n, float *s /* (4,) */, const void *const vx[4],
                                          const void *vy /* (n/256,) q8_K */) {
    const block_q6_K *x[4] = {vx[0], vx[1], vx[2], vx[3]};
    const block_q8_K *y = vy;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            gr_prefetch_block_ahead_l2(&x[r][i], sizeof(block_q6_K));
            const float d = y[i].d * _cvtsh_ss(x[r][i].d);
            const __m256i sumi = gr_q6K_block(&x[r][i], &y[i], bsums);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[r]);
        }
    }
    for (int r = 0; r < 4; r++) s[r] = gr_hsum_ps8(acc[r]);
}

/* Small batches (ggmlrpc_vec_dot_4xn): four weight rows one after another, each
 * against NC activation rows, its blocks unpacked once for the NC and fetched ahead;
 * every output with its own accumulators and the steps of the type's vec_dot. The
 * bodies are built twice: for AVX2, and for AVX-512 VNNI CPUs (32 registers; VPDPWSSD in the
 * K-quants). */

/* Q8_0 (kind 0) and Q4_0 (kind 1): an f16 scale, then the codes */
GR_AVX2 static inline __attribute__((always_inline)) void gr_1xn_q0(int64_t n, float *s /* (NC,) stride 4 */,
                                                                    const uint8_t *x, const void *const yv[8], int NC,
                                                                    size_t bs, int kind) {
    const block_q8_0 *y[8] = {yv[0], yv[1], yv[2], yv[3], yv[4], yv[5], yv[6], yv[7]};
    __m256 acc[8];
    for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK; i++, x += bs) {
        gr_prefetch_ahead(x);
        gr_fp16_t h;
        memcpy(&h, x, sizeof h);
        const float dx = GR_F16(h);
        const __m256i qx = kind == 1 ? _mm256_sub_epi8(gr_nibbles32(x + 2), _mm256_set1_epi8(8))
                                     : _mm256_loadu_si256((const __m256i *)(x + 2));
        for (int c = 0; c < NC; c++) {
            const __m256 d = _mm256_set1_ps(dx * GR_F16(y[c][i].d));
            const __m256i qy = _mm256_loadu_si256((const __m256i *)y[c][i].qs);
            acc[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(gr_dot_i8(qx, qy)), acc[c]);
        }
    }
    for (int c = 0; c < NC; c++) s[4 * c] = gr_hsum_ps8(acc[c]);
}

/* acc + the pair sums of a * b (PMADDWD, then PADDD; one VPDPWSSD on AVX-512 VNNI:
 * the same int32 lanes, wrap-around included) */
typedef __m256i (*gr_madd_acc_fn)(__m256i acc, __m256i a, __m256i b);

GR_AVX2 static inline __m256i gr_madd_acc_avx2(__m256i acc, __m256i a, __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}

GR_VNNI static inline __m256i gr_madd_acc_vnni(__m256i acc, __m256i a, __m256i b) {
    return _mm256_dpwssd_epi32(acc, a, b);
}

/* With one or two columns, Q4_K's and Q6_K's integer sums of a block go in two
 * accumulators a column (added at the block's end: int32 sums, the same bits),
 * halving the chain of multiply-adds each waits on; with more columns the
 * columns' chains overlap anyway. Zen 4 class, one thread, ns a block and row,
 * in cache: Q4_K one column 8.7 -> 7.9, two 11.2 -> 10.4, four 16.4 either way;
 * Q6_K 8.4 -> 7.9, 9.9 -> 9.8; from memory (75 MB) Q4_K two columns 12.0 ->
 * 11.8. Q5_K gained nothing and keeps one chain. AVX2's madd-then-add chain has
 * one-cycle adds: no change there. */
#define GR_K_TWO_CHAINS(NC) ((NC) <= 2)

/* Q4_K as vec_dot_q4_K_q8_K_avx2 (gr_q4K_block's steps, sub-block by sub-block) */
GR_AVX2 static inline __attribute__((always_inline)) void gr_1xn_q4K(int64_t n, float *s, const block_q4_K *x,
                                                                     const void *const yv[8], int NC,
                                                                     gr_madd_acc_fn madd_acc, const __m128i *ps) {
    const block_q8_K *y[8] = {yv[0], yv[1], yv[2], yv[3], yv[4], yv[5], yv[6], yv[7]};
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc[8];
    __m128 acc_m[8];
    for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps(), acc_m[c] = _mm_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        gr_prefetch_block_ahead(&x[i], sizeof(block_q4_K));
        const __m256i ms = gr_q4K_scales_mins(x[i].scales);
        const __m128i mn = _mm256_extracti128_si256(ms, 1);
        const __m256i sc = _mm256_permute2x128_si256(ms, ms, 0x00);
        __m256i sumi[8], sumh[8];
        for (int c = 0; c < NC; c++) sumi[c] = _mm256_setzero_si256(), sumh[c] = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * j));
            const __m256i lo = _mm256_and_si256(bits, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            const __m256i sl = _mm256_shuffle_epi8(sc, GR_BCAST16(2 * j)), sh = _mm256_shuffle_epi8(sc, GR_BCAST16(2 * j + 1));
            for (int c = 0; c < NC; c++) {
                const int8_t *q8 = y[c][i].qs + 64 * j;
                const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q8));
                const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
                if (GR_K_TWO_CHAINS(NC)) {
                    sumi[c] = madd_acc(sumi[c], sl, pl);
                    sumh[c] = madd_acc(sumh[c], sh, ph);
                } else {
                    sumi[c] = madd_acc(madd_acc(sumi[c], sl, pl), sh, ph);
                }
            }
        }
        const float xd = _cvtsh_ss(x[i].d), xdmin = _cvtsh_ss(x[i].dmin);
        for (int c = 0; c < NC; c++) {
            const float d = y[c][i].d * xd, dmin = -y[c][i].d * xdmin;
            const __m128i mins = _mm_madd_epi16(mn, ps ? ps[i * 8 + c] : gr_q8K_pair_sums(&y[c][i]));
            acc_m[c] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mins), acc_m[c]);
            if (GR_K_TWO_CHAINS(NC)) sumi[c] = _mm256_add_epi32(sumi[c], sumh[c]);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
    }
    for (int c = 0; c < NC; c++) s[4 * c] = gr_q4K_finish(acc[c], acc_m[c]);
}

/* Q6_K as vec_dot_q6_K_q8_K_avx2 (gr_q6K_block's steps) */
GR_AVX2 static inline __attribute__((always_inline)) void gr_1xn_q6K(int64_t n, float *s, const block_q6_K *x,
                                                                     const void *const yv[8], int NC,
                                                                     gr_madd_acc_fn madd_acc) {
    const block_q8_K *y[8] = {yv[0], yv[1], yv[2], yv[3], yv[4], yv[5], yv[6], yv[7]};
    __m256 acc[8];
    for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        gr_prefetch_block_ahead(&x[i], sizeof(block_q6_K));
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        __m256i sumi[8], sumh[8];
        for (int c = 0; c < NC; c++) sumi[c] = _mm256_setzero_si256(), sumh[c] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
            const __m256i sch = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11)
                                  : _mm256_permute2x128_si256(sc16, sc16, 0x00);
            __m256i q[4];
            gr_q6K_codes(ql, qh, q);
            for (int k = 0; k < 4; k++) {
                const __m256i pick = _mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_set1_epi16((short)(((4 * k + 1) << 8) | (4 * k)))),
                    _mm_set1_epi16((short)(((4 * k + 3) << 8) | (4 * k + 2))), 1);
                const __m256i sk = _mm256_shuffle_epi8(sch, pick);
                for (int c = 0; c < NC; c++) {
                    const __m256i q8 = _mm256_loadu_si256((const __m256i *)(y[c][i].qs + 128 * h + 32 * k));
                    if (GR_K_TWO_CHAINS(NC) && (k & 1))
                        sumh[c] = madd_acc(sumh[c], sk, _mm256_maddubs_epi16(q[k], q8));
                    else
                        sumi[c] = madd_acc(sumi[c], sk, _mm256_maddubs_epi16(q[k], q8));
                }
            }
        }
        const float xd = _cvtsh_ss(x[i].d);
        for (int c = 0; c < NC; c++) {
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)y[c][i].bsums);
            const __m256i bias = _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 5);
            const float d = y[c][i].d * xd;
            if (GR_K_TWO_CHAINS(NC)) sumi[c] = _mm256_add_epi32(sumi[c], sumh[c]);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[c], bias)), acc[c]);
        }
    }
    for (int c = 0; c < NC; c++) s[4 * c] = gr_hsum_ps8(acc[c]);
}

/* Q5_K as vec_dot_q5_K_q8_K_avx2 */
GR_AVX2 static inline __attribute__((always_inline)) void gr_1xn_q5K(int64_t n, float *s, const block_q5_K *x,
                                                                     const void *const yv[8], int NC,
                                                                     gr_madd_acc_fn madd_acc) {
    const block_q8_K *y[8] = {yv[0], yv[1], yv[2], yv[3], yv[4], yv[5], yv[6], yv[7]};
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    __m256 acc[8];
    float acc_m[8];
    for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps(), acc_m[c] = 0.0f;
    uint8_t sc[8], mn[8];
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        gr_prefetch_block_ahead(&x[i], sizeof(block_q5_K));
        gr_k4_scales(x[i].scales, sc, mn);
        const float xd = _cvtsh_ss(x[i].d), xdmin = _cvtsh_ss(x[i].dmin);
        for (int c = 0; c < NC; c++)   /* fused, as vec_dot_q5_K_q8_K_avx2's */
            acc_m[c] = fmaf(-y[c][i].d * xdmin, (float)gr_k4_minsum(mn, y[c][i].bsums), acc_m[c]);
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m256i sumi[8];
        for (int c = 0; c < NC; c++) sumi[c] = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * j));
            const __m256i hl = _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j), one);
            const __m256i hh = _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j + 1), one);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(bits, m4), _mm256_slli_epi16(hl, 4));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4),
                                               _mm256_slli_epi16(hh, 4));
            const __m256i sl = _mm256_set1_epi16(sc[2 * j]), sh = _mm256_set1_epi16(sc[2 * j + 1]);
            for (int c = 0; c < NC; c++) {
                const int8_t *q8 = y[c][i].qs + 64 * j;
                const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q8));
                const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
                sumi[c] = madd_acc(madd_acc(sumi[c], sl, pl), sh, ph);
            }
        }
        for (int c = 0; c < NC; c++)
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(y[c][i].d * xd), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
    }
    for (int c = 0; c < NC; c++) s[4 * c] = gr_hsum_ps8(acc[c]) + acc_m[c];
}

/* Q4_K's activation sums (gr_q8K_pair_sums of each column's blocks) once for the
 * four weight rows of a call, not once a row: `ps` for gr_1xn_q4K, on the stack for
 * rows of up to GR_Q4K_PS_BLOCKS blocks (longer ones compute them row by row). In
 * cache on a Zen 3 class CPU (AVX2, one thread, 2816 rows of 1,024), two columns:
 * 15.9 -> 14.1 ns a block and row, four 25.5 -> 23.4; the outputs are the same bits. */
#define GR_Q4K_PS_BLOCKS 64
#define GR_Q4K_PAIR_SUMS                                                                              \
    __m128i ps_buf[GR_Q4K_PS_BLOCKS * 8];                                                             \
    const __m128i *ps = NULL;                                                                         \
    if (n / GR_QK_K <= GR_Q4K_PS_BLOCKS) {                                                            \
        for (int64_t i = 0; i < n / GR_QK_K; i++)                                                     \
            for (int c = 0; c < ncols; c++) ps_buf[i * 8 + c] = gr_q8K_pair_sums((const block_q8_K *)y[c] + i); \
        ps = ps_buf;                                                                                  \
    }

/* kernel `name` for `target`: PRE (the activations' work shared by the four rows,
 * or nothing), then the four rows through ONE(n, s + r, row r, columns, NC, the
 * arguments after PRE), one instance per column count up to MAXC (more columns:
 * MAXC at a time); unused column pointers point at the first column */
#define GR_4XN_CASE(NC, MAXC, ONE, ...) \
    case NC: if (NC <= MAXC) ONE(n, s + r, vx[r], y, NC __VA_ARGS__); break;
#define GR_4XN(target, name, MAXC, ONE, PRE, ...)                                                        \
    target void name(int64_t n, float *s, const void *const vx[4], const void *const vy[8], int ncols) { \
        if (MAXC < GGMLRPC_4XN_COLS && ncols > MAXC) {                                                  \
            name(n, s, vx, vy, MAXC);                                                                    \
            const void *rest[GGMLRPC_4XN_COLS];                                                          \
            for (int j = 0; j < GGMLRPC_4XN_COLS; j++) rest[j] = vy[j + MAXC < ncols ? j + MAXC : 0];    \
            name(n, s + 4 * MAXC, vx, rest, ncols - MAXC);                                               \
            return;                                                                                      \
        }                                                                                                \
        const void *y[8];                                                                                \
        for (int j = 0; j < 8; j++) y[j] = vy[j < ncols ? j : 0];                                        \
        PRE                                                                                              \
        for (int r = 0; r < 4; r++) {                                                                    \
            switch (ncols) {                                                                             \
            GR_4XN_CASE(1, MAXC, ONE, __VA_ARGS__) GR_4XN_CASE(2, MAXC, ONE, __VA_ARGS__)                \
            GR_4XN_CASE(3, MAXC, ONE, __VA_ARGS__) GR_4XN_CASE(4, MAXC, ONE, __VA_ARGS__)                \
            GR_4XN_CASE(5, MAXC, ONE, __VA_ARGS__) GR_4XN_CASE(6, MAXC, ONE, __VA_ARGS__)                \
            GR_4XN_CASE(7, MAXC, ONE, __VA_ARGS__) GR_4XN_CASE(8, MAXC, ONE, __VA_ARGS__)                \
            }                                                                                            \
        }                                                                                                \
    }
GR_4XN(GR_AVX2, vec_dot_4xn_q8_0_q8_0_avx2, 4, gr_1xn_q0, , , sizeof(block_q8_0), 0)
GR_4XN(GR_AVX2, vec_dot_4xn_q4_0_q8_0_avx2, 4, gr_1xn_q0, , , sizeof(block_q4_0), 1)
GR_4XN(GR_AVX2, vec_dot_4xn_q4_K_q8_K_avx2, 4, gr_1xn_q4K, GR_Q4K_PAIR_SUMS, , gr_madd_acc_avx2, ps)
GR_4XN(GR_AVX2, vec_dot_4xn_q6_K_q8_K_avx2, 4, gr_1xn_q6K, , , gr_madd_acc_avx2)
GR_4XN(GR_VNNI, vec_dot_4xn_q4_K_q8_K_vnni, 8, gr_1xn_q4K, GR_Q4K_PAIR_SUMS, , gr_madd_acc_vnni, ps)
GR_4XN(GR_VNNI, vec_dot_4xn_q6_K_q8_K_vnni, 8, gr_1xn_q6K, , , gr_madd_acc_vnni)
GR_4XN(GR_AVX2, vec_dot_4xn_q5_K_q8_K_avx2, 4, gr_1xn_q5K, , , gr_madd_acc_avx2)
GR_4XN(GR_VNNI, vec_dot_4xn_q5_K_q8_K_vnni, 8, gr_1xn_q5K, , , gr_madd_acc_vnni)
#undef GR_4XN_CASE
#undef GR_4XN
#undef GR_Q4K_PAIR_SUMS

/* unsigned codes x signed q8 -> 8 int32 lanes as float */
GR_AVX2 static inline __m256 gr_dot_u8_ps(__m256i qx, __m256i qy) {
    const __m256i p16 = _mm256_maddubs_epi16(qx, qy);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

/* Q4_0 and Q5_0: unsigned codes c (nibbles, or nibbles and the fifth bit) and
 * the weight is c - off; maddubs(c, qs) - t (t = off * lane sums, kept in the
 * panel for off = 8 and doubled for 16, exactly) replaces the sign trick on
 * c - off, which blocks holding -128 still take (the panel marks them) */
GR_AVX2 static inline __attribute__((always_inline)) void gr_panel_dot_off(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) blocks */,
                                                                           const void *panel /* (n/32,) */, int q5) {
    const uint8_t *x = vx;
    const size_t bsize = q5 ? sizeof(block_q5_0) : sizeof(block_q4_0);
    const uint8_t *p = panel;
    GR_PANEL_ACC8;
    float dp[8] __attribute__((aligned(32)));
    for (int64_t i = 0; i < n / GR_QK; i++, p += GR_PANEL_Q4, x += bsize) {
        gr_fp16_t dx;
        memcpy(&dx, x, 2);
        gr_panel_scales(GR_F16(dx), p, dp);
        const __m256i qx = q5 ? gr_q5_codes32(((const block_q5_0 *)x)->qh, ((const block_q5_0 *)x)->qs)
                              : gr_nibbles32(((const block_q4_0 *)x)->qs);
        uint64_t marks;
        memcpy(&marks, p + GR_PANEL_Q8 + 8 * 32, 8);
        if (__builtin_expect(marks == 0, 1)) {
#define OFF_T(j) _mm256_loadu_ps((const float *)(p + GR_PANEL_Q8 + 32 * (j)))
#define OFF_FLT(j, v) _mm256_sub_ps(_mm256_cvtepi32_ps(v), q5 ? _mm256_add_ps(OFF_T(j), OFF_T(j)) : OFF_T(j))
            GR_PANEL_STAGED(GR_PANEL_U8_INT, OFF_FLT)
#undef OFF_T
#undef OFF_FLT
        } else {
            const __m256i qs = _mm256_sub_epi8(qx, _mm256_set1_epi8(q5 ? 16 : 8));
#define OFF_SIGN_STEP(j) GR_PANEL_FMA(j, gr_panel_sign_lane(qs, p, j));
            GR_PANEL_EACH(OFF_SIGN_STEP)
#undef OFF_SIGN_STEP
        }
    }
    GR_PANEL_STORE8;
}

GR_AVX2 void panel_dot_q4_0_avx2(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) q4_0 */,
                                        const void *panel /* (n/32,) panel blocks */) {
    gr_panel_dot_off(n, s, vx, panel, 0);
}

GR_AVX2 void panel_dot_q5_0_avx2(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) q5_0 */,
                                        const void *panel /* (n/32,) panel blocks */) {
    gr_panel_dot_off(n, s, vx, panel, 1);
}


/* Q4_1/Q5_1: the min term m * s (s = the activation's d*sum(q)) is summed
 * apart in float, as ggml's AVX2 kernels do */
GR_AVX2 void vec_dot_q4_1_q8_1_avx2(int64_t n, float *s, const void *vx /* (n/32,) q4_1 */,
                                           const void *vy /* (n/32,) q8_1 */) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t i = 0; i < n / GR_QK; i++) {
        summs += GR_F16(x[i].m) * GR_F16(y[i].s);
        const __m256 d = _mm256_set1_ps(GR_F16(x[i].d) * GR_F16(y[i].d));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, gr_dot_u8_ps(gr_nibbles32(x[i].qs), qy), acc);
    }
    *s = gr_hsum_ps8(acc) + summs;
}

/* Q4_1/Q5_1 against eight Q8_1 rows: the vec_dot steps per output, the minimum
 * terms (summs += m * s, rounded product then sum) eight at a time */
GR_AVX2 static inline __attribute__((always_inline)) void gr_panel_dot_min(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) blocks */,
                                                                           const void *panel /* (n/32,) */, int q5) {
    const uint8_t *x = vx;
    const size_t bsize = q5 ? sizeof(block_q5_1) : sizeof(block_q4_1);
    const uint8_t *p = panel;
    GR_PANEL_ACC8;
    __m256 summs = _mm256_setzero_ps();
    float dp[8] __attribute__((aligned(32)));
    for (int64_t i = 0; i < n / GR_QK; i++, p += GR_PANEL_Q81, x += bsize) {
        gr_fp16_t dx, mx;
        memcpy(&dx, x, 2);
        memcpy(&mx, x + 2, 2);
        summs = _mm256_add_ps(summs, _mm256_mul_ps(_mm256_set1_ps(GR_F16(mx)),
                                                   _mm256_loadu_ps((const float *)(p + GR_PANEL_Q8))));
        gr_panel_scales(GR_F16(dx), p, dp);
        const __m256i qx = q5 ? gr_q5_codes32(((const block_q5_1 *)x)->qh, ((const block_q5_1 *)x)->qs)
                              : gr_nibbles32(((const block_q4_1 *)x)->qs);
#define MIN_FLT(j, v) _mm256_cvtepi32_ps(v)
        GR_PANEL_STAGED(GR_PANEL_U8_INT, MIN_FLT)
#undef MIN_FLT
    }
    GR_PANEL_STORE8;
    _mm256_storeu_ps(s, _mm256_add_ps(_mm256_loadu_ps(s), summs));   /* hsum(acc) + summs */
}

GR_AVX2 void panel_dot_q4_1_avx2(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) q4_1 */,
                                        const void *panel /* (n/32,) panel blocks */) {
    gr_panel_dot_min(n, s, vx, panel, 0);
}

GR_AVX2 void panel_dot_q5_1_avx2(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) q5_1 */,
                                        const void *panel /* (n/32,) panel blocks */) {
    gr_panel_dot_min(n, s, vx, panel, 1);
}

GR_AVX2 void vec_dot_q5_0_q8_0_avx2(int64_t n, float *s, const void *vx /* (n/32,) q5_0 */,
                                           const void *vy /* (n/32,) q8_0 */) {
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK; i++) {
        const __m256 d = _mm256_set1_ps(GR_F16(x[i].d) * GR_F16(y[i].d));
        const __m256i qx = _mm256_sub_epi8(gr_q5_codes32(x[i].qh, x[i].qs), _mm256_set1_epi8(16));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(gr_dot_i8(qx, qy)), acc);
    }
    *s = gr_hsum_ps8(acc);
}

GR_AVX2 void vec_dot_q5_1_q8_1_avx2(int64_t n, float *s, const void *vx /* (n/32,) q5_1 */,
                                           const void *vy /* (n/32,) q8_1 */) {
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t i = 0; i < n / GR_QK; i++) {
        summs += GR_F16(x[i].m) * GR_F16(y[i].s);
        const __m256 d = _mm256_set1_ps(GR_F16(x[i].d) * GR_F16(y[i].d));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, gr_dot_u8_ps(gr_q5_codes32(x[i].qh, x[i].qs), qy), acc);
    }
    *s = gr_hsum_ps8(acc) + summs;
}

/* Q2_K/Q3_K: pass p of half h is the 2-bit field p of 32 bytes; its 32
 * elements are groups 8h+2p and 8h+2p+1 (one per 128-bit half). Q2_K's min
 * term goes into the same accumulator first, as in ggml's AVX2 kernel. */
GR_AVX2 void vec_dot_q2_K_q8_K_avx2(int64_t n, float *s, const void *vx /* (n/256,) q2_K */,
                                           const void *vy /* (n/256,) q8_K */) {
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m3 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        const uint8_t *sc = x[i].scales;
        const float d = y[i].d * _cvtsh_ss(x[i].d);
        const float dmin = -y[i].d * _cvtsh_ss(x[i].dmin);
        const __m128i packed = _mm_loadu_si128((const __m128i *)sc);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0xf)));
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, bsums)), acc);

        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            for (int p = 0; p < 4; p++) {
                const int g = 8 * h + 2 * p;
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * p), m3);
                const __m256i q8 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 128 * h + 32 * p));
                const __m256i p16 = _mm256_maddubs_epi16(q, q8);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(gr_scales16(sc[g] & 0xf, sc[g + 1] & 0xf), p16));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = gr_hsum_ps8(acc);
}

GR_AVX2 void vec_dot_q3_K_q8_K_avx2(int64_t n, float *s, const void *vx /* (n/256,) q3_K */,
                                           const void *vy /* (n/256,) q8_K */) {
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i one = _mm256_set1_epi8(1);
    int8_t sc[16];
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        gr_k3_scales(x[i].scales, sc);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            for (int p = 0; p < 4; p++) {
                const int g = 8 * h + 2 * p;
                const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * p), m3);
                /* 4 off where the high bit (bit 4h+p of hmask[l]) is clear */
                const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + p), one);
                const __m256i q = _mm256_sub_epi8(lo, _mm256_slli_epi16(_mm256_xor_si256(hb, one), 2));
                const __m256i q8 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 128 * h + 32 * p));
                const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(q8, q));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(gr_scales16(sc[g], sc[g + 1]), p16));
            }
        }
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(x[i].d) * y[i].d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = gr_hsum_ps8(acc);
}

/* gr_lut_block_scale with the F16 scale through the table (same values) */
static inline float gr_lut_block_scale_tab(const uint8_t *b /* block */, int e8m0) {
    if (e8m0) return gr_e8m0_half(b[0]);
    uint16_t h;
    memcpy(&h, b, sizeof h);
    return GR_F16(h);
}

/* IQ4_NL/MXFP4 like ggml's AVX2 kernels: even and odd blocks go to two
 * accumulators; an odd last block is added in scalar float (fused or not, as the
 * build was tuned) */
GR_AVX2 static inline float gr_dot_lut_row(int64_t nb, const uint8_t *x /* (nb,) blocks */, int e8m0,
                                           const block_q8_0 *y /* (nb,) */, const int8_t *levels /* (16,) */) {
    const size_t stride = e8m0 ? sizeof(block_mxfp4) : sizeof(block_iq4_nl);
    const size_t qoff = e8m0 ? 1 : 2;
    const __m256i lut = gr_lut_load(levels);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        for (int k = 0; k < 2; k++) {
            const uint8_t *b = x + (size_t)(i + k) * stride;
            const __m256i qx = gr_lut_nibbles32(b + qoff, lut);
            const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i + k].qs);
            const __m256 d = _mm256_set1_ps(GR_F16(y[i + k].d) * gr_lut_block_scale_tab(b, e8m0));
            acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(gr_dot_i8(qx, qy)), acc[k]);
        }
    }
    float sum = gr_hsum_ps8(_mm256_add_ps(acc[0], acc[1]));
    if (i < nb) {
        const uint8_t *b = x + (size_t)i * stride;
        sum = gr_chain_madd(sum, GR_F16(y[i].d) * gr_lut_block_scale_tab(b, e8m0),
                            (float)gr_dot_lut32(b + qoff, levels, y[i].qs));
    }
    return sum;
}

GR_AVX2 void vec_dot_iq4_nl_q8_0_avx2(int64_t n, float *s, const void *vx /* (n/32,) iq4_nl */,
                                             const void *vy /* (n/32,) q8_0 */) {
    *s = gr_dot_lut_row(n / GR_QK, vx, 0, vy, kvalues_iq4nl);
}

/* IQ4_NL the way llamafile's tinyBLAS_Q0_AVX sums a product (what ggml's CPU
 * backend runs for 2+ activation rows): one accumulator, blocks in order */
GR_AVX2 void vec_dot_iq4_nl_q8_0_seq_avx2(int64_t n, float *s, const void *vx /* (n/32,) iq4_nl */,
                                                 const void *vy /* (n/32,) q8_0 */) {
    const block_iq4_nl *x = vx;
    const block_q8_0 *y = vy;
    const __m256i lut = gr_lut_load(kvalues_iq4nl);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK; i++) {
        const __m256 d = _mm256_set1_ps(GR_F16(x[i].d) * GR_F16(y[i].d));
        const __m256i qx = gr_lut_nibbles32(x[i].qs, lut);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(gr_dot_i8(qx, qy)), acc);
    }
    *s = gr_hsum_ps8(acc);
}

GR_AVX2 void panel_dot_iq4_nl_avx2(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) iq4_nl */,
                                          const void *panel /* (n/32,) panel blocks */) {
    const block_iq4_nl *x = vx;
    const uint8_t *p = panel;
    const __m256i lut = gr_lut_load(kvalues_iq4nl);
    GR_PANEL_ACC8;
    float dp[8] __attribute__((aligned(32)));
    for (int64_t i = 0; i < n / GR_QK; i++, p += GR_PANEL_Q8) {
        gr_panel_scales(GR_F16(x[i].d), p, dp);
        const __m256i qx = gr_lut_nibbles32(x[i].qs, lut);
        GR_PANEL_STAGED(Q8_INT, Q8_FLT)   /* the Q8_0 kernel's steps on the looked-up levels */
#undef Q8_INT
#undef Q8_FLT
    }
    GR_PANEL_STORE8;
}

GR_AVX2 void vec_dot_mxfp4_q8_0_avx2(int64_t n, float *s, const void *vx /* (n/32,) mxfp4 */,
                                            const void *vy /* (n/32,) q8_0 */) {
    *s = gr_dot_lut_row(n / GR_QK, vx, 1, vy, kvalues_fp4);
}

GR_AVX2 void vec_dot_iq4_xs_q8_K_avx2(int64_t n, float *s, const void *vx /* (n/256,) iq4_xs */,
                                             const void *vy /* (n/256,) q8_K */) {
    const block_iq4_xs *x = vx;
    const block_q8_K *y = vy;
    const __m256i lut = gr_lut_load(kvalues_iq4nl);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK_K; i++) {
        __m256i sumi = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const __m256i qx = gr_lut_nibbles32(x[i].qs + 16 * ib, lut);
            const __m256i qy = _mm256_loadu_si256((const __m256i *)(y[i].qs + 32 * ib));
            /* the sub-block scale goes into the pair sums' PMADDWD (the same exact
             * integers as multiplying the lane sums, without the slow VPMULLD) */
            const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, _mm256_set1_epi16((short)gr_iq4xs_scale(&x[i], ib))));
        }
        const __m256 d = _mm256_set1_ps(GR_F16(x[i].d) * y[i].d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = gr_hsum_ps8(acc);
}

/* ------------------------------------------------------------------------- */
/* the x86 kernels per type and level, for dispatch.c                         */
/* ------------------------------------------------------------------------- */

int gr_arch_level(void) {
    const unsigned f = gr_cpu_features(), vnni = GR_CPU_AVX512 | GR_CPU_AVX512_VNNI;
    return (f & vnni) == vnni ? 2 : (f & GR_CPU_AVX2) ? 1 : 0;
}

/* level 1: the AVX2 kernels; the rows4 ones only beside the vec_dot whose order
 * they repeat */
static const gr_arch_kernels gr_avx2[GR_NTYPES] = {
    [GR_TYPE_F32] = {.vec_dot = vec_dot_f32_f32_avx2},
    [GR_TYPE_F16] = {.to_float = gr_f16_to_f32_row_f16c, .from_float = gr_f32_to_f16_row_f16c,
                     .vec_dot = vec_dot_f16_f16_avx2},
    [GR_TYPE_BF16] = {.to_float = gr_bf16_to_f32_row_avx2, .vec_dot = vec_dot_bf16_bf16_avx2},
    [GR_TYPE_Q4_0] = {.vec_dot = vec_dot_q4_0_q8_0_avx2, .vec_dot_4xn = vec_dot_4xn_q4_0_q8_0_avx2,
                      .vec_dot_sums = vec_dot_q4_0_q8_0_sums_avx2, .act_sums = q4_0_act_sums_avx2,
                      .panel_dot = panel_dot_q4_0_avx2},
    [GR_TYPE_Q4_1] = {.vec_dot = vec_dot_q4_1_q8_1_avx2, .panel_dot = panel_dot_q4_1_avx2},
    [GR_TYPE_Q5_0] = {.vec_dot = vec_dot_q5_0_q8_0_avx2, .panel_dot = panel_dot_q5_0_avx2},
    [GR_TYPE_Q5_1] = {.vec_dot = vec_dot_q5_1_q8_1_avx2, .panel_dot = panel_dot_q5_1_avx2},
    [GR_TYPE_Q8_0] = {.from_float = quantize_row_q8_0_avx2, .vec_dot = vec_dot_q8_0_q8_0_avx2,
                      .vec_dot_rows4 = vec_dot_rows4_q8_0_q8_0_avx2, .vec_dot_4xn = vec_dot_4xn_q8_0_q8_0_avx2,
                      .panel_dot = panel_dot_q8_0_avx2},
    [GR_TYPE_Q8_1] = {.from_float = quantize_row_q8_1_avx2},
    [GR_TYPE_Q8_K] = {.from_float = quantize_row_q8_K_avx2},
    [GR_TYPE_Q2_K] = {.vec_dot = vec_dot_q2_K_q8_K_avx2},
    [GR_TYPE_Q3_K] = {.vec_dot = vec_dot_q3_K_q8_K_avx2},
    [GR_TYPE_Q4_K] = {.vec_dot = vec_dot_q4_K_q8_K_avx2, .vec_dot_rows4 = vec_dot_rows4_q4_K_q8_K_avx2,
                      .vec_dot_4xn = vec_dot_4xn_q4_K_q8_K_avx2},
    [GR_TYPE_Q5_K] = {.vec_dot = vec_dot_q5_K_q8_K_avx2, .vec_dot_4xn = vec_dot_4xn_q5_K_q8_K_avx2},
    [GR_TYPE_Q6_K] = {.vec_dot = vec_dot_q6_K_q8_K_avx2, .vec_dot_rows4 = vec_dot_rows4_q6_K_q8_K_avx2,
                      .vec_dot_4xn = vec_dot_4xn_q6_K_q8_K_avx2},
    [GR_TYPE_IQ4_NL] = {.vec_dot = vec_dot_iq4_nl_q8_0_avx2, .vec_dot_gemm = vec_dot_iq4_nl_q8_0_seq_avx2,
                        .panel_dot = panel_dot_iq4_nl_avx2},
    [GR_TYPE_IQ4_XS] = {.vec_dot = vec_dot_iq4_xs_q8_K_avx2},
    [GR_TYPE_MXFP4] = {.vec_dot = vec_dot_mxfp4_q8_0_avx2},
};

void gr_arch_kernels_of(uint32_t type, int level, gr_arch_kernels *k) {
    *k = type < GR_NTYPES ? gr_avx2[type] : (gr_arch_kernels){0};
    if (level < 2) return;
    /* level 2: the AVX-512 VNNI decode rows, small batches and column panels
     * (quants_vnni.c), the K-quants' small batches built for 32 registers */
    switch (type) {
    case GR_TYPE_Q8_0:
        k->vec_dot_rows4 = vec_dot_rows4_q8_0_q8_0_vnni, k->cpanel_dot = gr_cpanel_dot_q8_0_vnni;
        k->vec_dot_4xn = vec_dot_4xn_q8_0_q8_0_vnni;
        k->vec_dot_4xn_sums = vec_dot_4xn_sums_q8_0_q8_0_vnni, k->act_sums_4xn = act_sums_4xn_q8_0_vnni;
        break;
    case GR_TYPE_Q4_0:
        k->vec_dot_rows4 = vec_dot_rows4_q4_0_q8_0_vnni, k->cpanel_dot = gr_cpanel_dot_q4_0_vnni;
        k->vec_dot_4xn = vec_dot_4xn_q4_0_q8_0_vnni;
        k->vec_dot_4xn_sums = vec_dot_4xn_sums_q4_0_q8_0_vnni, k->act_sums_4xn = act_sums_4xn_q4_0_vnni;
        break;
    case GR_TYPE_Q5_0:
        k->vec_dot_rows4 = vec_dot_rows4_q5_0_q8_0_vnni, k->cpanel_dot = gr_cpanel_dot_q5_0_vnni;
        k->vec_dot_4xn = vec_dot_4xn_q5_0_q8_0_vnni;
        k->vec_dot_4xn_sums = vec_dot_4xn_sums_q5_0_q8_0_vnni, k->act_sums_4xn = act_sums_4xn_q5_0_vnni;
        break;
    case GR_TYPE_Q4_K:
        k->vec_dot_4xn = vec_dot_4xn_q4_K_q8_K_vnni;
        break;
    case GR_TYPE_Q6_K:
        k->vec_dot_4xn = vec_dot_4xn_q6_K_q8_K_vnni;
        break;
    case GR_TYPE_Q5_K:
        k->vec_dot_4xn = vec_dot_4xn_q5_K_q8_K_vnni;
        break;
    case GR_TYPE_IQ4_NL:
        /* its levels plus 128, as Q8_0's codes; summed as tinyBLAS sums it (the one
         * accumulator of its prompt order, which is the column panels' order) */
        k->cpanel_dot = gr_cpanel_dot_q8_0_vnni;
        break;
    }
}

void gr_arch_cpanel_decode(uint32_t type, const void *w_row, int64_t nb, void *row) {
    gr_cpanel_decode_vnni(type, w_row, nb, row);
}

#endif /* GR_X86 */
