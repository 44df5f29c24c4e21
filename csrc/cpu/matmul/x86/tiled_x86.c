/* The AVX2 and AVX-512 VNNI kernels of the tiled K-quant order (tiled.c, whose
 * portable code gives the same bits): the block sums and the dot of one decoded
 * row, the K panels (eight activation rows per weight row) and the weight panels
 * (sixteen weight rows per activation row), compiled with target attributes and
 * used where gr_tiled_init found the CPU has them.
 */
#include <string.h>

#include "cpu/matmul/tiled_impl.h"
#include "cpu/quants/x86/x86_impl.h"

#if GR_X86

static int kpanel_vnni;   /* the K panels' AVX-512 VNNI kernel */

int gr_tiled_x86_init(int use_simd, int family) {
    /* the integer sums of AVX-512 VNNI: any grouping gives the same bits, but the
     * AVX2 family keeps its own kernels, to be tested against these */
    const unsigned vnni = GR_CPU_AVX512 | GR_CPU_AVX512_VNNI;
    kpanel_vnni = use_simd && family != GR_FAMILY_AVX2 && (gr_cpu_features() & vnni) == vnni;
    return kpanel_vnni;
}

GR_AVX2 static void block_sums_avx2(const int8_t *w, const int8_t *q, const int16_t *sc, const int16_t *mn,
                                    const int16_t *bsums, int32_t *s1, int32_t *s2) {
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 8; c++) {
        const __m256i wv = _mm256_loadu_si256((const __m256i *)(w + 32 * c));
        const __m256i qv = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
        /* |w| * (q with w's sign): pair sums stay within int16 as |w|, |q| <= 127 */
        const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(qv, wv));
        const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[2 * c + 1]), _mm_set1_epi16(sc[2 * c]));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scv));
    }
    *s1 = gr_hsum_epi32x8(acc);
    *s2 = gr_hsum_epi32x8(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)mn),
                                            _mm256_loadu_si256((const __m256i *)bsums)));
}

/* gr_tiled_dot_row's steps with the AVX2 sums inlined and fmaf one instruction */
GR_AVX2 float gr_tiled_dot_row_x86(const gr_tiled_row *r, const void *act) {
    GR_TILED_DOT_BODY(block_sums_avx2)
}

/* ---- K panels (layout in tiled_impl.h) ---------------------------------------- */
/* the 256 codes of one block (w + bias, the same values the dec_* functions
 * give minus their bias) with AVX2, 32 at a time */
#define KP_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define KP_STORE(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#define KP_BITS(v, sh, m) _mm256_and_si256(_mm256_srli_epi16(v, sh), _mm256_set1_epi8(m))

__attribute__((target("avx2"))) static void kp_codes_avx2(int32_t type, const void *blk /* one block */,
                                                          uint8_t *u /* (256,) */) {
    switch (type) {
    case GR_TYPE_Q4_K: {
        const block_q4_K *x = blk;
        for (int j = 0; j < 4; j++) {
            const __m256i q = KP_LOAD(x->qs + 32 * j);
            KP_STORE(u + 64 * j, KP_BITS(q, 0, 0xF));
            KP_STORE(u + 64 * j + 32, KP_BITS(q, 4, 0xF));
        }
        return;
    }
    case GR_TYPE_Q5_K: {
        const block_q5_K *x = blk;
        const __m256i qh = KP_LOAD(x->qh);
        for (int j = 0; j < 4; j++) {
            const __m256i q = KP_LOAD(x->qs + 32 * j);
            const __m256i h0 = _mm256_slli_epi16(KP_BITS(qh, 2 * j, 1), 4), h1 = _mm256_slli_epi16(KP_BITS(qh, 2 * j + 1, 1), 4);
            KP_STORE(u + 64 * j, _mm256_or_si256(KP_BITS(q, 0, 0xF), h0));
            KP_STORE(u + 64 * j + 32, _mm256_or_si256(KP_BITS(q, 4, 0xF), h1));
        }
        return;
    }
    case GR_TYPE_Q6_K: {
        const block_q6_K *x = blk;
        for (int half = 0; half < 2; half++) {
            const __m256i qh = KP_LOAD(x->qh + 32 * half);
            for (int quarter = 0; quarter < 4; quarter++) {
                const __m256i lq = KP_LOAD(x->ql + 64 * half + 32 * (quarter & 1));
                const __m256i lo = KP_BITS(lq, quarter < 2 ? 0 : 4, 0xF);
                const __m256i hi = _mm256_slli_epi16(KP_BITS(qh, 2 * quarter, 3), 4);
                KP_STORE(u + 128 * half + 32 * quarter, _mm256_or_si256(lo, hi));
            }
        }
        return;
    }
    case GR_TYPE_Q3_K: {
        const block_q3_K *x = blk;
        const __m256i hm = KP_LOAD(x->hmask);
        for (int half = 0; half < 2; half++) {
            const __m256i q = KP_LOAD(x->qs + 32 * half);
            for (int group = 0; group < 4; group++) {
                const __m256i hi = _mm256_slli_epi16(KP_BITS(hm, 4 * half + group, 1), 2);
                KP_STORE(u + 128 * half + 32 * group, _mm256_or_si256(KP_BITS(q, 2 * group, 3), hi));
            }
        }
        return;
    }
    case GR_TYPE_Q2_K: {
        const block_q2_K *x = blk;
        for (int half = 0; half < 2; half++) {
            const __m256i q = KP_LOAD(x->qs + 32 * half);
            for (int group = 0; group < 4; group++) KP_STORE(u + 128 * half + 32 * group, KP_BITS(q, 2 * group, 3));
        }
        return;
    }
    case GR_TYPE_IQ4_XS: {   /* the signed levels themselves (no bias) */
        const block_iq4_xs *x = blk;
        const __m128i lut = _mm_loadu_si128((const __m128i *)kvalues_iq4nl);
        for (int sb = 0; sb < 8; sb++) {
            const __m128i q = _mm_loadu_si128((const __m128i *)(x->qs + 16 * sb));
            const __m128i m = _mm_set1_epi8(0xF);
            _mm_storeu_si128((__m128i *)(u + 32 * sb), _mm_shuffle_epi8(lut, _mm_and_si128(q, m)));
            _mm_storeu_si128((__m128i *)(u + 32 * sb + 16), _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), m)));
        }
        return;
    }
    default:
        return;
    }
}

/* the scale, min and bias vectors of one decoded block */
__attribute__((target("avx2"))) static void kp_vectors_avx2(const int16_t sc[16], const int16_t mn[16], int has_min,
                                                            int bias, char *o) {
    for (int c = 0; c < 8; c++) {
        KP_STORE(o + KR_SCV + 32 * c, _mm256_set_m128i(_mm_set1_epi16(sc[2 * c + 1]), _mm_set1_epi16(sc[2 * c])));
        if (has_min)
            KP_STORE(o + KR_MNP + 32 * c, _mm256_set1_epi32((int32_t)((uint32_t)(uint16_t)mn[2 * c + 1] << 16 |
                                                                       (uint16_t)mn[2 * c])));
        if (bias) {
            const int16_t b0 = (int16_t)(-bias * sc[2 * c]), b1 = (int16_t)(-bias * sc[2 * c + 1]);
            KP_STORE(o + KR_BSP + 32 * c, _mm256_set1_epi32((int32_t)((uint32_t)(uint16_t)b1 << 16 | (uint16_t)b0)));
        }
    }
    if (has_min) KP_STORE(o + KR_MN16, KP_LOAD(mn));
    if (bias) KP_STORE(o + KR_BS16, _mm256_mullo_epi16(KP_LOAD(sc), _mm256_set1_epi16((short)-bias)));
}

/* the signed values of dec_*: codes minus the format's bias */
__attribute__((target("avx2"))) void gr_tiled_codes_x86(int32_t type, const void *blk, int8_t *w) {
    kp_codes_avx2(type, blk, (uint8_t *)w);
    const int bias = kpanel_bias(type);
    if (bias)
        for (int c = 0; c < 8; c++) KP_STORE(w + 32 * c, _mm256_sub_epi8(KP_LOAD(w + 32 * c), _mm256_set1_epi8((char)bias)));
}

void gr_kpanel_block_x86(int32_t type, const void *blk, const int16_t sc[16], const int16_t mn[16], int has_min,
                         char *o) {
    kp_codes_avx2(type, blk, (uint8_t *)o);
    kp_vectors_avx2(sc, mn, has_min, kpanel_bias(type), o);   /* the min and bias vectors only where read */
}
#undef KP_LOAD
#undef KP_STORE
#undef KP_BITS

/* the eight int32 vectors' sums, one per lane (integer: any order is exact) */
__attribute__((target("avx2"))) static inline __m256i kp_reduce8(__m256i a0, __m256i a1, __m256i a2, __m256i a3,
                                                                 __m256i a4, __m256i a5, __m256i a6, __m256i a7) {
    const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(a4, a5), _mm256_hadd_epi32(a6, a7));
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
}

#define KP_EACH(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

/* a0..a7 += the integer sums of block w's 256 codes with the eight columns'
 * Q8_K values, KP_QLOAD(t, c) loading column t's 32 values of chunk c: no sign steps
 * for the unsigned codes, the sign trick for IQ4_XS's levels */
#define KP_INT_SUMS()                                                                                   \
    if (!sign) {                                                                                         \
        for (int c = 0; c < 8; c++) {                                                                    \
            const __m256i u = _mm256_loadu_si256((const __m256i *)(w + 32 * c));                         \
            const __m256i sv = _mm256_loadu_si256((const __m256i *)(w + KR_SCV + 32 * c));               \
            KP_EACH(KP_STEP_U)                                                                           \
        }                                                                                                \
    } else {                                                                                             \
        for (int c = 0; c < 8; c++) {                                                                    \
            const __m256i v = _mm256_loadu_si256((const __m256i *)(w + 32 * c));                         \
            const __m256i av = _mm256_sign_epi8(v, v);                                                   \
            const __m256i sv = _mm256_loadu_si256((const __m256i *)(w + KR_SCV + 32 * c));               \
            KP_EACH(KP_STEP_S)                                                                           \
        }                                                                                                \
    }
#define KP_STEP_U(t) a##t = _mm256_add_epi32(a##t, _mm256_madd_epi16(_mm256_maddubs_epi16(u, KP_QLOAD(t, c)), sv));
#define KP_STEP_S(t) \
    a##t = _mm256_add_epi32(a##t, _mm256_madd_epi16(_mm256_maddubs_epi16(av, _mm256_sign_epi8(KP_QLOAD(t, c), v)), sv));

/* The rest of one block for the eight columns of a panel, from the codes' integer
 * sums s1: the bias term (codes stored with a bias), then the float steps
 *     r = d * s1;  r = fma(-dmin, s2, r);  acc = fma(r, d8, acc)   per output */
__attribute__((target("avx2,fma"))) static inline __m256 kp_block_finish(__m256i s1, const char *w, const char *p,
                                                                         float d, float dmin, int has_min, int bias,
                                                                         __m256 acc) {
    if (bias)
        for (int k = 0; k < 8; k++)
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(p + KP_PAIRS + 32 * k)),
                                                        _mm256_loadu_si256((const __m256i *)(w + KR_BSP + 32 * k))));
    __m256 r = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s1));
    if (has_min) {
        __m256i s2 = _mm256_setzero_si256();
        for (int k = 0; k < 8; k++)
            s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(p + KP_PAIRS + 32 * k)),
                                                        _mm256_loadu_si256((const __m256i *)(w + KR_MNP + 32 * k))));
        r = _mm256_fnmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(s2), r);
    }
    return _mm256_fmadd_ps(r, _mm256_loadu_ps((const float *)(p + KP_D)), acc);
}

__attribute__((target("avx2,fma"))) static void kpanel_dot_avx2(int32_t type, int64_t nb, const void *krow,
                                                                const float *d, const float *dmin,
                                                                const void *panel, float out[8]) {
    int has_min;
    gr_tiled_block(type, &has_min);
    const int bias = kpanel_bias(type), sign = type == GR_TYPE_IQ4_XS;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *w = (const char *)krow + (size_t)b * GR_KROW_BYTES;
        const char *p = (const char *)panel + (size_t)b * GR_KPANEL_BYTES;
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
#define KP_QLOAD(t, c) _mm256_loadu_si256((const __m256i *)(p + 256 * (t) + 32 * (c)))
        KP_INT_SUMS()
#undef KP_QLOAD
        acc = kp_block_finish(kp_reduce8(a0, a1, a2, a3, a4, a5, a6, a7), w, p, d[b], dmin[b], has_min, bias, acc);
    }
    _mm256_storeu_ps(out, acc);
}

/* kpanel_dot_avx2 with 512-bit integer steps: two 32-value chunks of a column per
 * PMADDUBSW and the scale step fused into VPDPWSSD. Only the integer sums are
 * grouped otherwise (exact in any order); the float steps are the same ones, so the
 * results are the same bits. The shared helpers inline here as AVX2 code. */
__attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")))
static void kpanel_dot_avx512(int32_t type, int64_t nb, const void *krow, const float *d, const float *dmin,
                              const void *panel, float out[8]) {
    int has_min;
    gr_tiled_block(type, &has_min);
    const int bias = kpanel_bias(type), sign = type == GR_TYPE_IQ4_XS;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *w = (const char *)krow + (size_t)b * GR_KROW_BYTES;
        const char *p = (const char *)panel + (size_t)b * GR_KPANEL_BYTES;
        __m512i z[8];
        for (int t = 0; t < 8; t++) z[t] = _mm512_setzero_si512();
        for (int c = 0; c < 8; c += 2) {
            __m512i u = _mm512_loadu_si512((const void *)(w + 32 * c));
            const __m512i sv = _mm512_loadu_si512((const void *)(w + KR_SCV + 32 * c));
            const __mmask64 neg = sign ? _mm512_movepi8_mask(u) : 0;
            if (sign) u = _mm512_abs_epi8(u);   /* |v| unsigned, v's sign moved onto q */
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                __m512i q = _mm512_loadu_si512((const void *)(p + 256 * t + 32 * c));
                if (sign) q = _mm512_mask_sub_epi8(q, neg, _mm512_setzero_si512(), q);
                z[t] = _mm512_dpwssd_epi32(z[t], _mm512_maddubs_epi16(u, q), sv);
            }
        }
        __m256i a[8];
        for (int t = 0; t < 8; t++)
            a[t] = _mm256_add_epi32(_mm512_castsi512_si256(z[t]), _mm512_extracti64x4_epi64(z[t], 1));
        acc = kp_block_finish(kp_reduce8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]), w, p, d[b], dmin[b],
                              has_min, bias, acc);
    }
    _mm256_storeu_ps(out, acc);
}

__attribute__((target("avx2,fma"))) static void kpanel_dot_rows_avx2(int32_t type, int64_t nb, const void *krow,
                                                                     const float *d, const float *dmin,
                                                                     const void *const act[8], float out[8]) {
    int has_min;
    gr_tiled_block(type, &has_min);
    const int bias = kpanel_bias(type), sign = type == GR_TYPE_IQ4_XS;
    const block_q8_K *y[8];
    for (int t = 0; t < 8; t++) y[t] = act[t];
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *w = (const char *)krow + (size_t)b * GR_KROW_BYTES;
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
#define KP_QLOAD(t, c) _mm256_loadu_si256((const __m256i *)(y[t][b].qs + 32 * (c)))
        KP_INT_SUMS()
#undef KP_QLOAD
#define KR_BSUMS(t) _mm256_loadu_si256((const __m256i *)y[t][b].bsums)
        if (bias) {   /* -bias * sum over groups of sc * bsums, per row */
            const __m256i bv = _mm256_loadu_si256((const __m256i *)(w + KR_BS16));
#define KR_BIAS(t) a##t = _mm256_add_epi32(a##t, _mm256_madd_epi16(bv, KR_BSUMS(t)));
            KP_EACH(KR_BIAS)
#undef KR_BIAS
        }
        __m256 r = _mm256_mul_ps(_mm256_set1_ps(d[b]), _mm256_cvtepi32_ps(kp_reduce8(a0, a1, a2, a3, a4, a5, a6, a7)));
        if (has_min) {
            const __m256i mv = _mm256_loadu_si256((const __m256i *)(w + KR_MN16));
            const __m256i s2 = kp_reduce8(_mm256_madd_epi16(mv, KR_BSUMS(0)), _mm256_madd_epi16(mv, KR_BSUMS(1)),
                                          _mm256_madd_epi16(mv, KR_BSUMS(2)), _mm256_madd_epi16(mv, KR_BSUMS(3)),
                                          _mm256_madd_epi16(mv, KR_BSUMS(4)), _mm256_madd_epi16(mv, KR_BSUMS(5)),
                                          _mm256_madd_epi16(mv, KR_BSUMS(6)), _mm256_madd_epi16(mv, KR_BSUMS(7)));
            r = _mm256_fnmadd_ps(_mm256_set1_ps(dmin[b]), _mm256_cvtepi32_ps(s2), r);
        }
#undef KR_BSUMS
        const __m256 d8 = _mm256_setr_ps(y[0][b].d, y[1][b].d, y[2][b].d, y[3][b].d, y[4][b].d, y[5][b].d,
                                         y[6][b].d, y[7][b].d);
        acc = _mm256_fmadd_ps(r, d8, acc);
    }
    _mm256_storeu_ps(out, acc);
}

void gr_kpanel_dot_rows(int32_t type, int64_t nb, const void *krow /* (nb, GR_KROW_BYTES) */,
                        const float *d /* (nb,) */, const float *dmin /* (nb,) */,
                        const void *const act[8] /* (nb,) q8_K each */, float out[8]) {
    kpanel_dot_rows_avx2(type, nb, krow, d, dmin, act, out);
}

void gr_kpanel_dot(int32_t type, int64_t nb, const void *krow /* (nb, GR_KROW_BYTES) */,
                   const float *d /* (nb,) */, const float *dmin /* (nb,) */,
                   const void *panel /* (nb, GR_KPANEL_BYTES) */, float out[8]) {
    if (kpanel_vnni)
        kpanel_dot_avx512(type, nb, krow, d, dmin, panel, out);
    else
        kpanel_dot_avx2(type, nb, krow, d, dmin, panel, out);
}

/* ---- weight panels (AVX-512 VNNI) -------------------------------------------
 * Sixteen weight rows side by side, one per int32 lane, so that one VPDPBUSD
 * multiplies four consecutive codes of each of the sixteen rows with the same four
 * Q8_K values of one activation row (broadcast from where the row lies: no
 * activation panels). Per 256-element block of a chunk of up to 16 rows r:
 *   u8  codes[64][16][4]   group g, row r: codes of elements 4g..4g+3 (w + bias)
 *   i32 sc[16][16]         scale of group-of-16 j of row r (32-element sub-blocks
 *                          read only even j); Q2_K, Q3_K, Q4_K: sc[8][16] instead,
 *                          the int16 pair (sc[2k], sc[2k+1]) (see WP_GEMM_FN's PK)
 *   i32 bp[8][16]          row r: the int16 pair (-bias sc[2k], -bias sc[2k+1])
 *   i32 mp[8][16]          row r: the int16 pair (mn[2k], mn[2k+1])
 *   f32 d[16], dmin[16]    (bp, mp and dmin written only for the types that read them)
 * bias: 4 for Q3_K, 32 for Q6_K, 128 for IQ4_XS (its signed levels made unsigned),
 * 0 otherwise. Per activation row t the exact integers are then
 *   s1 = sum over sub-blocks of sc * (sum of dpbusd(codes, q))   (VPMULLD per sub-block)
 *      + sum_k dpwssd(bp_k, (bsums[2k], bsums[2k+1]))
 *   s2 = sum_k dpwssd(mp_k, (bsums[2k], bsums[2k+1]))
 * and the float steps per output are those of kp_block_finish, sixteen rows at a
 * time: r = d * s1; r = fma(-dmin, s2, r); acc = fma(r, d8, acc). Lanes past a
 * short chunk repeat its last row and are never stored. Both parts of a block are
 * decoded straight from the sixteen rows' bytes, transposed as dwords
 * (wp_codes16, wp_scales16). */
#define WP_SC 4096
#define WP_BP 5120
#define WP_MP 5632
#define WP_D 6144
#define WP_DM 6208
_Static_assert(WP_DM + 64 == GR_WPANEL_BYTES, "weight panel block layout");

#define WP_TARGET __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

/* in[r] (16 int32 each) -> out[j] lane r = in[r] lane j */
WP_TARGET static inline void wp_transpose16(const __m512i in[16], __m512i out[16]) {
    __m512i a[16], b[16];
    for (int i = 0; i < 8; i++) {
        a[2 * i] = _mm512_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
    }
    /* b[4i + c], 128-bit lane L: rows 4i..4i+3 of column 4L + c */
    for (int i = 0; i < 4; i++) {
        b[4 * i + 0] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
        b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
    for (int c = 0; c < 4; c++) {
        const __m512i p0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x44), p1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xEE);
        const __m512i q0 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x44), q1 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xEE);
        out[c] = _mm512_shuffle_i32x4(p0, q0, 0x88);
        out[4 + c] = _mm512_shuffle_i32x4(p0, q0, 0xDD);
        out[8 + c] = _mm512_shuffle_i32x4(p1, q1, 0x88);
        out[12 + c] = _mm512_shuffle_i32x4(p1, q1, 0xDD);
    }
}

/* D[k] lane r = dword k of the 16 bytes at off in the block of row min(r, rows - 1),
 * bytes past the block (of bsize bytes) read as zeros */
WP_TARGET static inline void wp_dwords16(const char *w0, size_t row_stride, int rows, size_t off, size_t bsize,
                                         __m512i D[4]) {
    const __mmask16 m = (__mmask16)(off + 16 <= bsize ? 0xFFFFu : (1u << (bsize - off)) - 1u);
#define WP_L(r) _mm_maskz_loadu_epi8(m, w0 + (size_t)((r) < rows ? (r) : rows - 1) * row_stride + off)
    __m512i X[4];   /* X[q] 128-bit lane i: row 4i + q */
    for (int q = 0; q < 4; q++)
        X[q] = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(WP_L(q)), WP_L(4 + q), 1),
                                                     WP_L(8 + q), 2), WP_L(12 + q), 3);
#undef WP_L
    const __m512i t0 = _mm512_unpacklo_epi32(X[0], X[1]), t1 = _mm512_unpackhi_epi32(X[0], X[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(X[2], X[3]), t3 = _mm512_unpackhi_epi32(X[2], X[3]);
    D[0] = _mm512_unpacklo_epi64(t0, t2);
    D[1] = _mm512_unpackhi_epi64(t0, t2);
    D[2] = _mm512_unpacklo_epi64(t1, t3);
    D[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* the scale part of a panel block for the sixteen rows at once (every type of the
 * panels),
 * the same values as their dec_* functions; 0: another type */
WP_TARGET static int wp_scales16(int32_t type, const char *w0, size_t row_stride, size_t bsize, int rows, char *o) {
    __m512i D[4];
    const __m512i m6 = _mm512_set1_epi32(63), m4 = _mm512_set1_epi32(0xF), m2 = _mm512_set1_epi32(3);
#define WP_ST(off, v) _mm512_storeu_si512((void *)(o + (off)), v)
    if (type == GR_TYPE_Q4_K || type == GR_TYPE_Q5_K) {   /* d, dmin, scales[12] lead both blocks */
        _Static_assert(offsetof(block_q4_K, scales) == 4 && offsetof(block_q5_K, scales) == 4, "K4 scales");
        wp_dwords16(w0, row_stride, rows, 0, bsize, D);
        _mm512_storeu_ps((float *)(o + WP_D), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(D[0])));
        _mm512_storeu_ps((float *)(o + WP_DM), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(D[0], 16))));
        for (int j = 0; j < 8; j++) {
            const int sh = 8 * (j & 3);
            __m512i sc, m;
            if (j < 4) {
                sc = _mm512_and_si512(_mm512_srli_epi32(D[1], sh), m6);
                m = _mm512_and_si512(_mm512_srli_epi32(D[2], sh), m6);
            } else {
                sc = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(D[3], sh), m4),
                                     _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(D[1], sh + 6), m2), 4));
                m = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(D[3], sh + 4), m4),
                                    _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(D[2], sh + 6), m2), 4));
            }
            if (type == GR_TYPE_Q4_K) {   /* packed: (sc, sc) for the sub-block's two 16s */
                WP_ST(WP_SC + 64 * j, _mm512_or_si512(sc, _mm512_slli_epi32(sc, 16)));
            } else {
                WP_ST(WP_SC + 64 * (2 * j), sc);
                WP_ST(WP_SC + 64 * (2 * j + 1), sc);
            }
            WP_ST(WP_MP + 64 * j, _mm512_or_si512(m, _mm512_slli_epi32(m, 16)));
        }
        return 1;
    }
    if (type == GR_TYPE_Q6_K) {
        wp_dwords16(w0, row_stride, rows, offsetof(block_q6_K, scales), bsize, D);
        __m512i sc[16];
        for (int j = 0; j < 16; j++) {
            sc[j] = _mm512_srai_epi32(_mm512_slli_epi32(D[j / 4], 24 - 8 * (j % 4)), 24);
            WP_ST(WP_SC + 64 * j, sc[j]);
        }
        for (int k = 0; k < 8; k++) {   /* (-32 sc[2k], -32 sc[2k+1]) as int16 */
            const __m512i b0 = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sc[2 * k], 5));
            const __m512i b1 = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sc[2 * k + 1], 5));
            WP_ST(WP_BP + 64 * k, _mm512_or_si512(_mm512_and_si512(b0, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(b1, 16)));
        }
        uint16_t h[16];
        for (int r = 0; r < 16; r++)
            memcpy(&h[r], w0 + (size_t)(r < rows ? r : rows - 1) * row_stride + offsetof(block_q6_K, d), 2);
        _mm512_storeu_ps((float *)(o + WP_D), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)));
        return 1;
    }
    if (type == GR_TYPE_Q3_K) {   /* scales[12] (6-bit, - 32), then d: 14 bytes, the block's last */
        _Static_assert(offsetof(block_q3_K, d) == offsetof(block_q3_K, scales) + 12 && sizeof(block_q3_K) == 110,
                       "Q3_K tail");
        wp_dwords16(w0, row_stride, rows, offsetof(block_q3_K, scales), bsize, D);
        _mm512_storeu_ps((float *)(o + WP_D), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(D[3])));
        const __m512i n4b = _mm512_set1_epi32(0x0F0F0F0F), n2b = _mm512_set1_epi32(0x03030303);
        const __m512i a[4] = {   /* the unpacked scale bytes, as dec_q3_K's aux */
            _mm512_or_si512(_mm512_and_si512(D[0], n4b), _mm512_slli_epi32(_mm512_and_si512(D[2], n2b), 4)),
            _mm512_or_si512(_mm512_and_si512(D[1], n4b), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(D[2], 2), n2b), 4)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(D[0], 4), n4b),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(D[2], 4), n2b), 4)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(D[1], 4), n4b),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(D[2], 6), n2b), 4)),
        };
        __m512i sc[16];
        for (int j = 0; j < 16; j++) {
            sc[j] = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(a[j / 4], 8 * (j % 4)), m6), _mm512_set1_epi32(32));
        }
        for (int k = 0; k < 8; k++)   /* packed: (sc[2k], sc[2k+1]) as int16 */
            WP_ST(WP_SC + 64 * k, _mm512_or_si512(_mm512_and_si512(sc[2 * k], _mm512_set1_epi32(0xFFFF)),
                                                  _mm512_slli_epi32(sc[2 * k + 1], 16)));
        for (int k = 0; k < 8; k++) {   /* (-4 sc[2k], -4 sc[2k+1]) as int16 */
            const __m512i b0 = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sc[2 * k], 2));
            const __m512i b1 = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sc[2 * k + 1], 2));
            WP_ST(WP_BP + 64 * k, _mm512_or_si512(_mm512_and_si512(b0, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(b1, 16)));
        }
        return 1;
    }
    if (type == GR_TYPE_Q2_K) {   /* scales[16]: scale | min << 4 per 16 elements; d, dmin after qs */
        wp_dwords16(w0, row_stride, rows, offsetof(block_q2_K, scales), bsize, D);
        __m512i mn[16], sc[16];
        for (int j = 0; j < 16; j++) {
            sc[j] = _mm512_and_si512(_mm512_srli_epi32(D[j / 4], 8 * (j % 4)), m4);
            mn[j] = _mm512_and_si512(_mm512_srli_epi32(D[j / 4], 8 * (j % 4) + 4), m4);
        }
        for (int k = 0; k < 8; k++)   /* packed: (sc[2k], sc[2k+1]) */
            WP_ST(WP_SC + 64 * k, _mm512_or_si512(sc[2 * k], _mm512_slli_epi32(sc[2 * k + 1], 16)));
        for (int k = 0; k < 8; k++) WP_ST(WP_MP + 64 * k, _mm512_or_si512(mn[2 * k], _mm512_slli_epi32(mn[2 * k + 1], 16)));
        uint32_t h[16];   /* d | dmin << 16 */
        for (int r = 0; r < 16; r++)
            memcpy(&h[r], w0 + (size_t)(r < rows ? r : rows - 1) * row_stride + offsetof(block_q2_K, d), 4);
        const __m512i dd = _mm512_loadu_si512((const void *)h);
        _mm512_storeu_ps((float *)(o + WP_D), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
        _mm512_storeu_ps((float *)(o + WP_DM), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
        return 1;
    }
    if (type == GR_TYPE_IQ4_XS) {   /* d, scales_h, scales_l[4] */
        wp_dwords16(w0, row_stride, rows, 0, bsize, D);
        _mm512_storeu_ps((float *)(o + WP_D), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(D[0])));
        for (int sb = 0; sb < 8; sb++) {
            const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(D[1], 4 * sb), m4);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(D[0], 16 + 2 * sb), m2);
            const __m512i sc = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), _mm512_set1_epi32(32));
            WP_ST(WP_SC + 64 * (2 * sb), sc);
            WP_ST(WP_SC + 64 * (2 * sb + 1), sc);
            const __m512i b = _mm512_and_si512(_mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sc, 7)),
                                               _mm512_set1_epi32(0xFFFF));
            WP_ST(WP_BP + 64 * sb, _mm512_or_si512(b, _mm512_slli_epi32(b, 16)));   /* (-128 sc) as int16, twice */
        }
        return 1;
    }
#undef WP_ST
    return 0;
}

/* T[j] lane r = dword j of the nd dwords at off in the block of row min(r, rows - 1)
 * (dwords past nd read as zeros, never past the block) */
WP_TARGET static inline void wp_dwords_t(const char *wb, size_t row_stride, int rows, size_t off, int nd,
                                         __m512i T[16]) {
    __m512i in[16];
    const __mmask16 m = (__mmask16)((1u << nd) - 1u);
    for (int r = 0; r < 16; r++)
        in[r] = _mm512_maskz_loadu_epi32(m, wb + (size_t)(r < rows ? r : rows - 1) * row_stride + off);
    wp_transpose16(in, T);
}

/* the codes part of a panel block straight from the sixteen rows' bits (every
 * type of the panels): the quant bytes transposed as dwords, so that each lane's four
 * bytes are four consecutive elements' bits; 0: another type */
WP_TARGET static int wp_codes16(int32_t type, const char *wb, size_t row_stride, int rows, char *o) {
    const __m512i n4 = _mm512_set1_epi32(0x0F0F0F0F), n2 = _mm512_set1_epi32(0x03030303),
                  n1 = _mm512_set1_epi32(0x01010101);
    __m512i A[32], H[16];
#define WP_G(g, v) _mm512_storeu_si512((void *)(o + 64 * (g)), v)
    if (type == GR_TYPE_Q4_K || type == GR_TYPE_Q5_K) {
        /* element 64j + 32h + 4i + k: nibble h of qs[32j + 4i + k] (| bit 2j + h of qh[4i + k] << 4) */
        const size_t qs = type == GR_TYPE_Q4_K ? offsetof(block_q4_K, qs) : offsetof(block_q5_K, qs);
        wp_dwords_t(wb, row_stride, rows, qs, 16, A);
        wp_dwords_t(wb, row_stride, rows, qs + 64, 16, A + 16);
        if (type == GR_TYPE_Q5_K) wp_dwords_t(wb, row_stride, rows, offsetof(block_q5_K, qh), 8, H);
        for (int j = 0; j < 4; j++)
            for (int i = 0; i < 8; i++) {
                const __m512i q = A[8 * j + i];
                __m512i lo = _mm512_and_si512(q, n4), hi = _mm512_and_si512(_mm512_srli_epi32(q, 4), n4);
                if (type == GR_TYPE_Q5_K) {
                    lo = _mm512_or_si512(lo, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(H[i], 2 * j), n1), 4));
                    hi = _mm512_or_si512(hi, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(H[i], 2 * j + 1), n1), 4));
                }
                WP_G(16 * j + i, lo);
                WP_G(16 * j + 8 + i, hi);
            }
        return 1;
    }
    if (type == GR_TYPE_Q6_K) {
        /* element 128h + 32q + 4i + k: nibble q / 2 of ql[64h + 32(q & 1) + 4i + k], bits 2q of qh[32h + 4i + k] */
        wp_dwords_t(wb, row_stride, rows, offsetof(block_q6_K, ql), 16, A);
        wp_dwords_t(wb, row_stride, rows, offsetof(block_q6_K, ql) + 64, 16, A + 16);
        wp_dwords_t(wb, row_stride, rows, offsetof(block_q6_K, qh), 16, H);
        for (int h = 0; h < 2; h++)
            for (int q = 0; q < 4; q++)
                for (int i = 0; i < 8; i++) {
                    const __m512i l = _mm512_and_si512(_mm512_srli_epi32(A[16 * h + 8 * (q & 1) + i], 4 * (q >> 1)), n4);
                    const __m512i u = _mm512_and_si512(_mm512_srli_epi32(H[8 * h + i], 2 * q), n2);
                    WP_G(32 * h + 8 * q + i, _mm512_or_si512(l, _mm512_slli_epi32(u, 4)));
                }
        return 1;
    }
    if (type == GR_TYPE_Q2_K || type == GR_TYPE_Q3_K) {
        /* element 128h + 32g + 4i + k: bits 2g of qs[32h + 4i + k] (| bit 4h + g of hmask[4i + k] << 2) */
        const size_t qs = type == GR_TYPE_Q2_K ? offsetof(block_q2_K, qs) : offsetof(block_q3_K, qs);
        wp_dwords_t(wb, row_stride, rows, qs, 16, A);
        if (type == GR_TYPE_Q3_K) wp_dwords_t(wb, row_stride, rows, offsetof(block_q3_K, hmask), 8, H);
        for (int h = 0; h < 2; h++)
            for (int g = 0; g < 4; g++)
                for (int i = 0; i < 8; i++) {
                    __m512i v = _mm512_and_si512(_mm512_srli_epi32(A[8 * h + i], 2 * g), n2);
                    if (type == GR_TYPE_Q3_K)
                        v = _mm512_or_si512(v, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(H[i], 4 * h + g), n1), 2));
                    WP_G(32 * h + 8 * g + i, v);
                }
        return 1;
    }
    if (type == GR_TYPE_IQ4_XS) {
        /* element 32s + 16h + 4i + k: level of nibble h of qs[16s + 4i + k], + 128 */
        _Alignas(16) uint8_t lut[16];
        for (int v = 0; v < 16; v++) lut[v] = (uint8_t)(kvalues_iq4nl[v] + 128);
        const __m512i lv = _mm512_broadcast_i32x4(_mm_load_si128((const __m128i *)lut));
        wp_dwords_t(wb, row_stride, rows, offsetof(block_iq4_xs, qs), 16, A);
        wp_dwords_t(wb, row_stride, rows, offsetof(block_iq4_xs, qs) + 64, 16, A + 16);
        for (int sb = 0; sb < 8; sb++)
            for (int i = 0; i < 4; i++) {
                const __m512i q = A[4 * sb + i];
                WP_G(8 * sb + i, _mm512_shuffle_epi8(lv, _mm512_and_si512(q, n4)));
                WP_G(8 * sb + 4 + i, _mm512_shuffle_epi8(lv, _mm512_and_si512(_mm512_srli_epi32(q, 4), n4)));
            }
        return 1;
    }
#undef WP_G
    return 0;
}

/* every block of a chunk of up to 16 rows (w0: the first row's blocks): the six
 * types of the panels each have both parts above */
WP_TARGET static void wpanel_decode_avx512(int32_t type, int64_t nb, const char *w0 /* (rows, nb) blocks */,
                                           size_t row_stride, int rows, char *panel /* (nb, GR_WPANEL_BYTES) */) {
    int has_min;
    const size_t bsize = gr_tiled_block(type, &has_min);
    for (int64_t b = 0; b < nb; b++) {
        char *o = panel + (size_t)b * GR_WPANEL_BYTES;
        const char *wb = w0 + (size_t)b * bsize;
        /* rows past a short chunk repeat its last row: lanes that are never stored */
        wp_codes16(type, wb, row_stride, rows, o);
        wp_scales16(type, wb, row_stride, bsize, rows, o);
    }
}

static inline int32_t wp_ld32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* activation rows per pass over a weight panel: 6 keeps Q4_K's sums in registers
 * (8 measured no faster) */
#define WP_CMAX 6

/* C activation rows y[t] (nb Q8_K blocks each) against one weight panel: acc[t]
 * lane r = output (row r, column t). GS: groups of 4 elements per scale (4 or 8). */
WP_TARGET static inline __attribute__((always_inline)) void
wp_cols(int64_t nb, const char *panel, const block_q8_K *const *y, const int C, const int GS, const int bias,
        const int has_min, const int PK, __m512 *acc) {
    /* bytes 2, 3 of each dword from bytes 0, 1 of the same dword */
    const __m512i lo_to_hi = _mm512_set4_epi32(0x0d0c0000, 0x09080000, 0x05040000, 0x01000000);
    for (int t = 0; t < C; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *p = panel + (size_t)b * GR_WPANEL_BYTES;
        __m512i s1[WP_CMAX], s2[WP_CMAX];
        for (int t = 0; t < C; t++) s1[t] = s2[t] = _mm512_setzero_si512();
        for (int k = 0; k < 8 && PK; k++) {   /* groups of 16 2k and 2k + 1 */
            __m512i ra[WP_CMAX], rb[WP_CMAX];
            for (int t = 0; t < C; t++) ra[t] = rb[t] = _mm512_setzero_si512();
            for (int gi = 0; gi < 4; gi++) {
                const int g = 8 * k + gi;
                const __m512i wa = _mm512_loadu_si512((const void *)(p + 64 * g));
                for (int t = 0; t < C; t++)
                    ra[t] = _mm512_dpbusd_epi32(ra[t], wa, _mm512_set1_epi32(wp_ld32(y[t][b].qs + 4 * g)));
                const __m512i wb = _mm512_loadu_si512((const void *)(p + 64 * (g + 4)));
                for (int t = 0; t < C; t++)
                    rb[t] = _mm512_dpbusd_epi32(rb[t], wb, _mm512_set1_epi32(wp_ld32(y[t][b].qs + 4 * (g + 4))));
            }
            /* both sums within int16: the pair (ra, rb) by one byte shuffle, times (sc[2k], sc[2k+1]) */
            const __m512i spv = _mm512_loadu_si512((const void *)(p + WP_SC + 64 * k));
            for (int t = 0; t < C; t++)
                s1[t] = _mm512_dpwssd_epi32(s1[t], _mm512_mask_shuffle_epi8(ra[t], 0xCCCCCCCCCCCCCCCCull, rb[t], lo_to_hi),
                                            spv);
        }
        for (int s = 0; s < 64 / GS && !PK; s++) {
            __m512i raw[WP_CMAX];
            for (int t = 0; t < C; t++) raw[t] = _mm512_setzero_si512();
            for (int gi = 0; gi < GS; gi++) {
                const int g = s * GS + gi;
                const __m512i wv = _mm512_loadu_si512((const void *)(p + 64 * g));
                for (int t = 0; t < C; t++)
                    raw[t] = _mm512_dpbusd_epi32(raw[t], wv, _mm512_set1_epi32(wp_ld32(y[t][b].qs + 4 * g)));
            }
            const __m512i scv = _mm512_loadu_si512((const void *)(p + WP_SC + 64 * (s * GS / 4)));
            for (int t = 0; t < C; t++) s1[t] = _mm512_add_epi32(s1[t], _mm512_mullo_epi32(raw[t], scv));
        }
        if (bias)
            for (int k = 0; k < 8; k++) {
                const __m512i bv = _mm512_loadu_si512((const void *)(p + WP_BP + 64 * k));
                for (int t = 0; t < C; t++)
                    s1[t] = _mm512_dpwssd_epi32(s1[t], bv, _mm512_set1_epi32(wp_ld32(y[t][b].bsums + 2 * k)));
            }
        if (has_min)
            for (int k = 0; k < 8; k++) {
                const __m512i mv = _mm512_loadu_si512((const void *)(p + WP_MP + 64 * k));
                for (int t = 0; t < C; t++)
                    s2[t] = _mm512_dpwssd_epi32(s2[t], mv, _mm512_set1_epi32(wp_ld32(y[t][b].bsums + 2 * k)));
            }
        const __m512 dv = _mm512_loadu_ps((const float *)(p + WP_D));
        const __m512 dmv = _mm512_loadu_ps((const float *)(p + WP_DM));
        for (int t = 0; t < C; t++) {
            __m512 r = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(s1[t]));
            if (has_min) r = _mm512_fnmadd_ps(dmv, _mm512_cvtepi32_ps(s2[t]), r);
            acc[t] = _mm512_fmadd_ps(r, _mm512_set1_ps(y[t][b].d), acc[t]);
        }
    }
}

/* every column of [0, ncols): WP_CMAX at a time, then four, then one by one */
WP_TARGET static inline __attribute__((always_inline)) void
wp_gemm(int64_t nb, const char *panel, const char *act0, size_t act_stride, int64_t ncols, char *out0,
        size_t out_stride, int rows, const int GS, const int bias, const int has_min, const int PK) {
    const __mmask16 m = (__mmask16)((1u << rows) - 1u);
    int64_t c = 0;
#define WP_RUN(CC)                                                                                       \
    for (; c + CC <= ncols; c += CC) {                                                                   \
        const block_q8_K *y[CC];                                                                         \
        __m512 acc[CC];                                                                                  \
        for (int t = 0; t < CC; t++) y[t] = (const block_q8_K *)(act0 + (size_t)(c + t) * act_stride);   \
        wp_cols(nb, panel, y, CC, GS, bias, has_min, PK, acc);                                               \
        for (int t = 0; t < CC; t++) _mm512_mask_storeu_ps(out0 + (size_t)(c + t) * out_stride, m, acc[t]); \
    }
    WP_RUN(WP_CMAX)
    WP_RUN(4)
#undef WP_RUN
    for (; c < ncols; c++) {
        const block_q8_K *y[1] = { (const block_q8_K *)(act0 + (size_t)c * act_stride) };
        __m512 acc[1];
        wp_cols(nb, panel, y, 1, GS, bias, has_min, PK, acc);
        _mm512_mask_storeu_ps(out0 + (size_t)c * out_stride, m, acc[0]);
    }
}

/* PK: the sums of 16 codes stay within int16 (16 * 15 * 127 for Q4_K, less for
 * Q2_K and Q3_K), so two of them are scaled by one VPDPWSSD instead of two VPMULLD */
#define WP_GEMM_FN(name, GS, bias, has_min, PK)                                                              \
    WP_TARGET static void name(int64_t nb, const char *panel, const char *act0, size_t act_stride,           \
                               int64_t ncols, char *out0, size_t out_stride, int rows) {                     \
        wp_gemm(nb, panel, act0, act_stride, ncols, out0, out_stride, rows, GS, bias, has_min, PK);          \
    }
WP_GEMM_FN(wp_gemm_q2_K, 4, 0, 1, 1)
WP_GEMM_FN(wp_gemm_q3_K, 4, 4, 0, 1)
WP_GEMM_FN(wp_gemm_q4_K, 8, 0, 1, 1)
WP_GEMM_FN(wp_gemm_q5_K, 8, 0, 1, 0)
WP_GEMM_FN(wp_gemm_q6_K, 4, 32, 0, 0)
WP_GEMM_FN(wp_gemm_iq4_xs, 8, 128, 0, 0)
#undef WP_GEMM_FN

void gr_wpanel_decode(int32_t type, int64_t nb, const void *w0 /* (rows, nb) blocks, row_stride apart */,
                      size_t row_stride, int rows, void *panel /* (nb, GR_WPANEL_BYTES) */) {
    wpanel_decode_avx512(type, nb, w0, row_stride, rows, panel);
}

void gr_wpanel_gemm(int32_t type, int64_t nb, const void *panel /* (nb, GR_WPANEL_BYTES) */,
                    const void *act0 /* (ncols, nb) q8_K, act_stride bytes apart */, size_t act_stride,
                    int64_t ncols, float *out0 /* (ncols, rows), out_stride bytes apart */, size_t out_stride,
                    int rows) {
    void (*fn)(int64_t, const char *, const char *, size_t, int64_t, char *, size_t, int) = NULL;
    switch (type) {
    case GR_TYPE_Q2_K: fn = wp_gemm_q2_K; break;
    case GR_TYPE_Q3_K: fn = wp_gemm_q3_K; break;
    case GR_TYPE_Q4_K: fn = wp_gemm_q4_K; break;
    case GR_TYPE_Q5_K: fn = wp_gemm_q5_K; break;
    case GR_TYPE_Q6_K: fn = wp_gemm_q6_K; break;
    case GR_TYPE_IQ4_XS: fn = wp_gemm_iq4_xs; break;
    default: return;
    }
    fn(nb, panel, act0, act_stride, ncols, (char *)out0, out_stride, rows);
}

#endif /* GR_X86 */
