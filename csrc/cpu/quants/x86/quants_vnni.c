/* AVX-512 VNNI versions of the decode kernels (four weight rows against one
 * activation row) for Q8_0 and Q4_0: two rows per 512-bit register, each half
 * doing exactly what vec_dot_*_q8_0_avx2 does for its row (same int32 lanes, same
 * scale products, same float steps, same final sum), so every output is bit-equal
 * to the one-row kernel's and to ggml's. Picked at run time (quants.c) where the
 * CPU has AVX-512 F/BW/VL/DQ and VNNI and the quant level allows it.
 */
#include "cpu/quants/quants_impl.h"

#include <string.h>

#if GR_X86

#define GR_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

GR_VNNI static inline float gr_hsum_ps8_vnni(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* signed x signed int8, 64 lanes -> 16 int32 lanes of 4-product sums, as the AVX2
 * kernels' sign trick gives them (|x| unsigned times y with x's sign, the
 * wrap-around of -(-128) included) */
GR_VNNI static inline __m512i gr_dot_i8_x2(__m512i x, __m512i y) {
    const __m512i zero = _mm512_setzero_si512();
    const __m512i sy = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), zero, y);
    return _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(x), sy);
}

/* the four rows' scale products dx[r] * dy, rows 0 and 1 (r01) and 2 and 3 (r23)
 * each spread over the eight lanes of its half */
GR_VNNI static inline void gr_scales4(gr_fp16_t d0, gr_fp16_t d1, gr_fp16_t d2, gr_fp16_t d3, gr_fp16_t dy,
                                      __m512 *r01, __m512 *r23) {
    __m128i h = _mm_cvtsi32_si128(d0);
    h = _mm_insert_epi16(h, d1, 1);
    h = _mm_insert_epi16(h, d2, 2);
    h = _mm_insert_epi16(h, d3, 3);
    const __m128i hy = _mm_set1_epi16((short)dy);
    const __m512 d = _mm512_castps128_ps512(_mm_mul_ps(_mm_cvtph_ps(h), _mm_cvtph_ps(hy)));
    *r01 = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), d);
    *r23 = _mm512_permutexvar_ps(_mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3), d);
}

/* 32 bytes of row a in the low half, of row b in the high half */
GR_VNNI static inline __m512i gr_pair32(const void *a, const void *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

/* two Q4_0 blocks' codes minus 8: row a's 32 values in the low half (low nibbles
 * first, then high, as gr_nibbles32 puts them), row b's in the high half */
GR_VNNI static inline __m512i gr_pair_q4(const uint8_t *a /* (16,) */, const uint8_t *b /* (16,) */) {
    const __m256i t = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                              _mm_loadu_si128((const __m128i *)b), 1);
    const __m512i dup = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), _mm512_castsi256_si512(t));
    const __m512i nib = _mm512_and_si512(_mm512_srlv_epi64(dup, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)),
                                         _mm512_set1_epi8(0x0f));
    return _mm512_sub_epi8(nib, _mm512_set1_epi8(8));
}

GR_VNNI static inline void gr_finish4(float *s, __m512 a01, __m512 a23) {
    s[0] = gr_hsum_ps8_vnni(_mm512_castps512_ps256(a01));
    s[1] = gr_hsum_ps8_vnni(_mm512_extractf32x8_ps(a01, 1));
    s[2] = gr_hsum_ps8_vnni(_mm512_castps512_ps256(a23));
    s[3] = gr_hsum_ps8_vnni(_mm512_extractf32x8_ps(a23, 1));
}

GR_VNNI static inline gr_fp16_t gr_f16_at(const uint8_t *p) {
    gr_fp16_t h;
    memcpy(&h, p, sizeof h);
    return h;
}

/* both block types are an f16 scale followed by the codes: bs bytes a block, Q4_0's
 * codes as nibbles (q4) */
GR_VNNI static inline __attribute__((always_inline)) void gr_rows4_q0(int64_t n, float *s /* (4,) */,
                                                                      const void *const vx[4], const void *vy,
                                                                      size_t bs, int q4) {
    const uint8_t *x0 = vx[0], *x1 = vx[1], *x2 = vx[2], *x3 = vx[3];
    const block_q8_0 *y = vy;
    __m512 a01 = _mm512_setzero_ps(), a23 = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK; i++) {
        const size_t o = (size_t)i * bs;
        gr_prefetch_ahead(x0 + o);
        gr_prefetch_ahead(x1 + o);
        gr_prefetch_ahead(x2 + o);
        gr_prefetch_ahead(x3 + o);
        __m512 d01, d23;
        gr_scales4(gr_f16_at(x0 + o), gr_f16_at(x1 + o), gr_f16_at(x2 + o), gr_f16_at(x3 + o), y[i].d, &d01, &d23);
        const __m512i qy = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)y[i].qs));
        const __m512i q01 = q4 ? gr_pair_q4(x0 + o + 2, x1 + o + 2) : gr_pair32(x0 + o + 2, x1 + o + 2);
        const __m512i q23 = q4 ? gr_pair_q4(x2 + o + 2, x3 + o + 2) : gr_pair32(x2 + o + 2, x3 + o + 2);
        a01 = _mm512_fmadd_ps(d01, _mm512_cvtepi32_ps(gr_dot_i8_x2(q01, qy)), a01);
        a23 = _mm512_fmadd_ps(d23, _mm512_cvtepi32_ps(gr_dot_i8_x2(q23, qy)), a23);
    }
    gr_finish4(s, a01, a23);
}

GR_VNNI void vec_dot_rows4_q8_0_q8_0_vnni(int64_t n, float *s /* (4,) */, const void *const vx[4],
                                          const void *vy /* (n/32,) q8_0 */) {
    gr_rows4_q0(n, s, vx, vy, sizeof(block_q8_0), 0);
}

GR_VNNI void vec_dot_rows4_q4_0_q8_0_vnni(int64_t n, float *s /* (4,) */, const void *const vx[4],
                                          const void *vy /* (n/32,) q8_0 */) {
    gr_rows4_q0(n, s, vx, vy, sizeof(block_q4_0), 1);
}

/* Two weight rows against a panel of eight activation columns (ggmlrpc_panel_put's
 * layout: the eight columns' float scales, then each column's 32 codes, pb bytes a
 * block): the sixteen outputs, s[j] row a's and s[8 + j] row b's for column j, each
 * summed as vec_dot sums it. One register per column: row a's eight lanes in the
 * low half, row b's in the high half. */
#define GR_PANEL2_COLUMN(j)                                                                             \
    {                                                                                                   \
        const __m512i y = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + 32 + 32 * (j)))); \
        const __m512i iv = _mm512_dpbusd_epi32(zero, ax, _mm512_mask_sub_epi8(y, neg, zero, y));        \
        float dy;                                                                                       \
        memcpy(&dy, p + 4 * (j), 4);                                                                    \
        acc##j = _mm512_fmadd_ps(_mm512_mul_ps(dx, _mm512_set1_ps(dy)), _mm512_cvtepi32_ps(iv), acc##j); \
    }
#define GR_PANEL2_EACH(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

GR_VNNI static inline __attribute__((always_inline)) void gr_panel2_q0(int64_t n, float *s /* (16,) */,
                                                                       const uint8_t *xa, const uint8_t *xb,
                                                                       const uint8_t *panel, size_t bs, size_t pb,
                                                                       int q4) {
    const __m512i zero = _mm512_setzero_si512();
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0, acc4 = acc0, acc5 = acc0,
           acc6 = acc0, acc7 = acc0;
    for (int64_t i = 0; i < n / GR_QK; i++) {
        const size_t o = (size_t)i * bs;
        const uint8_t *p = panel + (size_t)i * pb;
        const __m512 dx = _mm512_insertf32x8(_mm512_set1_ps(_cvtsh_ss(gr_f16_at(xa + o))),
                                             _mm256_set1_ps(_cvtsh_ss(gr_f16_at(xb + o))), 1);
        const __m512i x = q4 ? gr_pair_q4(xa + o + 2, xb + o + 2) : gr_pair32(xa + o + 2, xb + o + 2);
        const __m512i ax = _mm512_abs_epi8(x);
        const __mmask64 neg = _mm512_movepi8_mask(x);
        GR_PANEL2_EACH(GR_PANEL2_COLUMN)
    }
#define GR_PANEL2_OUT(j)                                                 \
    s[j] = gr_hsum_ps8_vnni(_mm512_castps512_ps256(acc##j));             \
    s[8 + j] = gr_hsum_ps8_vnni(_mm512_extractf32x8_ps(acc##j, 1));
    GR_PANEL2_EACH(GR_PANEL2_OUT)
#undef GR_PANEL2_OUT
}

GR_VNNI void panel_dot2_q8_0_vnni(int64_t n, float *s /* (16,) */, const void *wa, const void *wb,
                                  const void *panel) {
    gr_panel2_q0(n, s, wa, wb, panel, sizeof(block_q8_0), GR_PANEL_Q8, 0);
}

GR_VNNI void panel_dot2_q4_0_vnni(int64_t n, float *s /* (16,) */, const void *wa, const void *wb,
                                  const void *panel) {
    gr_panel2_q0(n, s, wa, wb, panel, sizeof(block_q4_0), GR_PANEL_Q4, 1);
}

#endif
