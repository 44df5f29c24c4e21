/* The AVX2 helpers the x86 kernels share (quants_x86.c, the AVX-512 VNNI
 * kernels of quants_vnni.c and matmul/x86/tiled_x86.c, which may call them:
 * their targets include AVX2), and the x86 quant kernels dispatch.c's table
 * (quants_x86.c) names.
 */
#ifndef GGMLRPC_CPU_QUANTS_X86_IMPL_H
#define GGMLRPC_CPU_QUANTS_X86_IMPL_H

#include <string.h>

#include "cpu/quants/quants_impl.h"

#if GR_X86

/* the AVX-512 VNNI kernels' target (quants_vnni.c, and the 32-register builds of
 * AVX2 kernels in quants_x86.c) */
#define GR_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

/* the eight int32 lanes' sum (exact: any order) */
GR_AVX2 static inline int32_t gr_hsum_epi32x8(__m256i v) {
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    r = _mm_add_epi32(r, _mm_unpackhi_epi64(r, r));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(r);
}

/* ggml's hsum_float_8: the two halves, then the pairs, then the last two */
GR_AVX2 static inline float gr_hsum_ps8(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* 16 bytes of packed nibbles -> 32 bytes in 0..15: low nibbles first, then high */
GR_AVX2 static inline __m256i gr_nibbles32(const uint8_t *p /* (16,) */) {
    const __m128i t = _mm_loadu_si128((const __m128i *)p);
    const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0f));
}

/* 32 bits -> 32 bytes, 0xff where the bit is set (bit j -> byte j) */
GR_AVX2 static inline __m256i gr_bits_to_bytes32(const uint8_t *p /* (4,) */) {
    uint32_t b;
    memcpy(&b, p, sizeof b);
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)b), pick);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* Q5_0/Q5_1 codes 0..31: nibbles with bit 4 from qh */
GR_AVX2 static inline __m256i gr_q5_codes32(const uint8_t *qh /* (4,) */, const uint8_t *qs /* (16,) */) {
    const __m256i hi = _mm256_and_si256(gr_bits_to_bytes32(qh), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(gr_nibbles32(qs), hi);
}

/* 16-level formats: PSHUFB looks the 4-bit codes up in the level table */
GR_AVX2 static inline __m256i gr_lut_nibbles32(const uint8_t *qs /* (16,) */, __m256i lut) {
    return _mm256_shuffle_epi8(lut, gr_nibbles32(qs));
}

GR_AVX2 static inline __m256i gr_lut_load(const int8_t *levels /* (16,) */) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)levels));
}

/* ---- the x86 kernels (quants_x86.c, quants_vnni.c), picked by gr_arch_kernels_of */
GR_AVX2 void gr_bf16_to_f32_row_avx2(const void *vx /* (n,) bf16 */, float *y /* (n,) */, int64_t n);
GR_AVX2 void gr_f16_to_f32_row_f16c(const void *vx /* (n,) f16 */, float *y /* (n,) */, int64_t n);
GR_AVX2 void gr_f32_to_f16_row_f16c(const float *x /* (n,) */, void *vy /* (n,) f16 */, int64_t n);
GR_AVX2 void panel_dot_iq4_nl_avx2(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) iq4_nl */, const void *panel /* (n/32,) panel blocks */);
GR_AVX2 void panel_dot_q4_0_avx2(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) q4_0 */, const void *panel /* (n/32,) panel blocks */);
GR_AVX2 void panel_dot_q4_1_avx2(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) q4_1 */, const void *panel /* (n/32,) panel blocks */);
GR_AVX2 void panel_dot_q5_0_avx2(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) q5_0 */, const void *panel /* (n/32,) panel blocks */);
GR_AVX2 void panel_dot_q5_1_avx2(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) q5_1 */, const void *panel /* (n/32,) panel blocks */);
GR_AVX2 void panel_dot_q8_0_avx2(int64_t n, float *s /* (8,) */, const void *vx /* (n/32,) q8_0 */, const void *panel /* (n/32,) panel blocks */);
GR_AVX2 void q4_0_act_sums_avx2(const void *vy /* (nb,) q8_0 */, int32_t *sums /* (nb, 8) */, int64_t nb);
GR_AVX2 void quantize_row_q8_0_avx2(const float *x /* (n,) */, void *vy /* (n/32,) blocks */, int64_t n);
GR_AVX2 void quantize_row_q8_K_avx2(const float *x /* (n,) */, void *vy /* (n/256,) blocks */, int64_t n);
GR_AVX2 void quantize_row_q8_1_avx2(const float *x /* (n,) */, void *vy /* (n/32,) blocks */, int64_t n);
GR_AVX2 void vec_dot_bf16_bf16_avx2(int64_t n, float *s, const void *vx /* (n,) bf16 */, const void *vy /* (n,) bf16 */);
GR_AVX2 void vec_dot_f16_f16_avx2(int64_t n, float *s, const void *vx /* (n,) f16 */, const void *vy /* (n,) f16 */);
GR_AVX2 void vec_dot_f32_f32_avx2(int64_t n, float *s, const void *vx /* (n,) f32 */, const void *vy /* (n,) f32 */);
GR_AVX2 void vec_dot_iq4_nl_q8_0_avx2(int64_t n, float *s, const void *vx /* (n/32,) iq4_nl */, const void *vy /* (n/32,) q8_0 */);
GR_AVX2 void vec_dot_iq4_nl_q8_0_seq_avx2(int64_t n, float *s, const void *vx /* (n/32,) iq4_nl */, const void *vy /* (n/32,) q8_0 */);
GR_AVX2 void vec_dot_iq4_xs_q8_K_avx2(int64_t n, float *s, const void *vx /* (n/256,) iq4_xs */, const void *vy /* (n/256,) q8_K */);
GR_AVX2 void vec_dot_mxfp4_q8_0_avx2(int64_t n, float *s, const void *vx /* (n/32,) mxfp4 */, const void *vy /* (n/32,) q8_0 */);
GR_AVX2 void vec_dot_q2_K_q8_K_avx2(int64_t n, float *s, const void *vx /* (n/256,) q2_K */, const void *vy /* (n/256,) q8_K */);
GR_AVX2 void vec_dot_q3_K_q8_K_avx2(int64_t n, float *s, const void *vx /* (n/256,) q3_K */, const void *vy /* (n/256,) q8_K */);
GR_AVX2 void vec_dot_q4_0_q8_0_avx2(int64_t n, float *s, const void *vx /* (n/32,) q4_0 */, const void *vy /* (n/32,) q8_0 */);
GR_AVX2 void vec_dot_q4_0_q8_0_sums_avx2(int64_t n, float *s, const void *vx /* (n/32,) q4_0 */, const void *vy /* (n/32,) q8_0 */, const int32_t *sums);
GR_AVX2 void vec_dot_q4_1_q8_1_avx2(int64_t n, float *s, const void *vx /* (n/32,) q4_1 */, const void *vy /* (n/32,) q8_1 */);
GR_AVX2 void vec_dot_q4_K_q8_K_avx2(int64_t n, float *s, const void *vx /* (n/256,) q4_K */, const void *vy /* (n/256,) q8_K */);
GR_AVX2 void vec_dot_rows4_q4_K_q8_K_avx2(int64_t n, float *s /* (4,) */, const void *const vx[4], const void *vy);
GR_AVX2 void vec_dot_rows4_q6_K_q8_K_avx2(int64_t n, float *s /* (4,) */, const void *const vx[4], const void *vy);
GR_AVX2 void vec_dot_rows4_q8_0_q8_0_avx2(int64_t n, float *s /* (4,) */, const void *const vx[4], const void *vy);
GR_AVX2 void vec_dot_q5_0_q8_0_avx2(int64_t n, float *s, const void *vx /* (n/32,) q5_0 */, const void *vy /* (n/32,) q8_0 */);
GR_AVX2 void vec_dot_q5_1_q8_1_avx2(int64_t n, float *s, const void *vx /* (n/32,) q5_1 */, const void *vy /* (n/32,) q8_1 */);
GR_AVX2 void vec_dot_q5_K_q8_K_avx2(int64_t n, float *s, const void *vx /* (n/256,) q5_K */, const void *vy /* (n/256,) q8_K */);
GR_AVX2 void vec_dot_q6_K_q8_K_avx2(int64_t n, float *s, const void *vx /* (n/256,) q6_K */, const void *vy /* (n/256,) q8_K */);
GR_AVX2 void vec_dot_q8_0_q8_0_avx2(int64_t n, float *s, const void *vx /* (n/32,) q8_0 */, const void *vy /* (n/32,) q8_0 */);
GR_AVX2 void vec_dot_4xn_q8_0_q8_0_avx2(int64_t n, float *s, const void *const vx[4], const void *const vy[8], int ncols);
GR_AVX2 void vec_dot_4xn_q4_0_q8_0_avx2(int64_t n, float *s, const void *const vx[4], const void *const vy[8], int ncols);
GR_AVX2 void vec_dot_4xn_q4_K_q8_K_avx2(int64_t n, float *s, const void *const vx[4], const void *const vy[8], int ncols);
GR_AVX2 void vec_dot_4xn_q6_K_q8_K_avx2(int64_t n, float *s, const void *const vx[4], const void *const vy[8], int ncols);
GR_VNNI void vec_dot_4xn_q4_K_q8_K_vnni(int64_t n, float *s, const void *const vx[4], const void *const vy[8], int ncols);
GR_AVX2 void vec_dot_4xn_q5_K_q8_K_avx2(int64_t n, float *s, const void *const vx[4], const void *const vy[8], int ncols);
GR_VNNI void vec_dot_4xn_q5_K_q8_K_vnni(int64_t n, float *s, const void *const vx[4], const void *const vy[8], int ncols);
GR_VNNI void vec_dot_4xn_q6_K_q8_K_vnni(int64_t n, float *s, const void *const vx[4], const void *const vy[8], int ncols);
void vec_dot_4xn_q8_0_q8_0_vnni(int64_t n, float *s, const void *const vx[4], const void *const vy[8], int ncols);
void vec_dot_4xn_q4_0_q8_0_vnni(int64_t n, float *s, const void *const vx[4], const void *const vy[8], int ncols);
void vec_dot_4xn_q5_0_q8_0_vnni(int64_t n, float *s, const void *const vx[4], const void *const vy[8], int ncols);
void vec_dot_4xn_sums_q8_0_q8_0_vnni(int64_t n, float *s, const void *const vx[4], const void *const vy[8],
                                     const int32_t *const sums[8], int ncols);
void vec_dot_4xn_sums_q4_0_q8_0_vnni(int64_t n, float *s, const void *const vx[4], const void *const vy[8],
                                     const int32_t *const sums[8], int ncols);
void vec_dot_4xn_sums_q5_0_q8_0_vnni(int64_t n, float *s, const void *const vx[4], const void *const vy[8],
                                     const int32_t *const sums[8], int ncols);
void act_sums_4xn_q8_0_vnni(const void *vy, int32_t *sums, int64_t nb);
void act_sums_4xn_q4_0_vnni(const void *vy, int32_t *sums, int64_t nb);
void act_sums_4xn_q5_0_vnni(const void *vy, int32_t *sums, int64_t nb);
void vec_dot_rows4_q8_0_q8_0_vnni(int64_t n, float *s /* (4,) */, const void *const vx[4], const void *vy);
void gr_cpanel_decode_vnni(uint32_t type, const void *w_row, int64_t nb, void *row);
void gr_cpanel_dot_q8_0_vnni(int64_t nb, const void *row_a, const void *row_b, const void *panel, float *s);
void gr_cpanel_dot_q4_0_vnni(int64_t nb, const void *row_a, const void *row_b, const void *panel, float *s);
void gr_cpanel_dot_q5_0_vnni(int64_t nb, const void *row_a, const void *row_b, const void *panel, float *s);
void vec_dot_rows4_q5_0_q8_0_vnni(int64_t n, float *s /* (4,) */, const void *const vx[4], const void *vy);
void vec_dot_rows4_q4_0_q8_0_vnni(int64_t n, float *s /* (4,) */, const void *const vx[4], const void *vy);
#endif

#endif
