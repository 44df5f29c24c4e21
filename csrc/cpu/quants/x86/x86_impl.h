/* The AVX2 helpers the x86 quant kernels share (quants_x86.c and the AVX-512
 * VNNI kernels of quants_vnni.c, which may call them: their targets include
 * AVX2). Internal to csrc/cpu/quants/x86/.
 */
#ifndef GGMLRPC_CPU_QUANTS_X86_IMPL_H
#define GGMLRPC_CPU_QUANTS_X86_IMPL_H

#include <string.h>

#include "cpu/quants/quants_impl.h"

#if GR_X86

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

#endif

#endif
