/* AVX-512 VNNI versions of the decode kernels (four weight rows against one
 * activation row, or up to eight: small batches) for Q8_0, Q4_0 and Q5_0: two rows
 * per 512-bit register, each half
 * doing exactly what vec_dot_*_q8_0_avx2 does for its row (same int32 lanes, same
 * scale products, same float steps, same final sum), so every output is bit-equal
 * to the one-row kernel's and to ggml's. Picked at run time (dispatch.c, through
 * quants_x86.c's table) where the CPU has AVX-512 F/BW/VL/DQ and VNNI and the
 * quant level allows it.
 */
#include "cpu/quants/x86/x86_impl.h"

#include <string.h>

#if GR_X86

/* signed x signed int8, 64 lanes -> 16 int32 lanes of 4-product sums, as the AVX2
 * kernels' sign trick (gr_dot_i8) gives them (|x| unsigned times y with x's sign, the
 * wrap-around of -(-128) included) */
GR_VNNI static inline __m512i gr_dot_i8_x2(__m512i x, __m512i y) {
    const __m512i zero = _mm512_setzero_si512();
    const __m512i sy = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), zero, y);
    return _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(x), sy);
}

/* 32 bytes of row a in the low half, of row b in the high half */
GR_VNNI static inline __m512i gr_pair32(const void *a, const void *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

/* The pairs below unpack in AVX-512 what gr_nibbles32 and gr_q5_codes32 give: two
 * rows' nibbles in one 512-bit shift, the fifth bits by one mask move. Measured
 * faster in the decode kernels (bench/kernels.c, Q4_0 and Q5_0, one thread: about
 * 9.3 against 8.5 and 8.5 against 7.6 GB/s). */

/* two Q4_0 blocks' nibbles: row a's 32 values in the low half (low nibbles first,
 * then high, as gr_nibbles32 puts them), row b's in the high half */
GR_VNNI static inline __m512i gr_pair_q4u(const uint8_t *a /* (16,) */, const uint8_t *b /* (16,) */) {
    const __m256i t = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                              _mm_loadu_si128((const __m128i *)b), 1);
    const __m512i dup = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), _mm512_castsi256_si512(t));
    return _mm512_and_si512(_mm512_srlv_epi64(dup, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0x0f));
}

/* the same codes minus 8 */
GR_VNNI static inline __m512i gr_pair_q4(const uint8_t *a, const uint8_t *b) {
    return _mm512_sub_epi8(gr_pair_q4u(a, b), _mm512_set1_epi8(8));
}

/* a Q5_0 block's 32 codes 0..31, as gr_q5_codes32 */
GR_VNNI static inline __m256i gr_q5_codes_vnni(const uint8_t *qh /* (4,) */, const uint8_t *qs /* (16,) */) {
    uint32_t bits;
    memcpy(&bits, qh, 4);
    return _mm256_or_si256(gr_nibbles32(qs), _mm256_maskz_mov_epi8((__mmask32)bits, _mm256_set1_epi8(0x10)));
}

/* two Q5_0 blocks' codes minus 16, row a's in the low half */
GR_VNNI static inline __m512i gr_pair_q5(const uint8_t *a /* qh (4,), then qs (16,) */, const uint8_t *b) {
    const __m512i c = _mm512_inserti64x4(_mm512_castsi256_si512(gr_q5_codes_vnni(a, a + 4)),
                                         gr_q5_codes_vnni(b, b + 4), 1);
    return _mm512_sub_epi8(c, _mm512_set1_epi8(16));
}

GR_VNNI static inline void gr_finish4(float *s, __m512 a01, __m512 a23) {
    s[0] = gr_hsum_ps8(_mm512_castps512_ps256(a01));
    s[1] = gr_hsum_ps8(_mm512_extractf32x8_ps(a01, 1));
    s[2] = gr_hsum_ps8(_mm512_castps512_ps256(a23));
    s[3] = gr_hsum_ps8(_mm512_extractf32x8_ps(a23, 1));
}

GR_VNNI static inline gr_fp16_t gr_f16_at(const uint8_t *p) {
    gr_fp16_t h;
    memcpy(&h, p, sizeof h);
    return h;
}

/* the four weight rows' blocks at a, b, c, d (each an f16 scale first): their
 * blocks fetched ahead, rows 0 and 1's scales on the two halves of *d01 (eight
 * lanes each), rows 2 and 3's on *d23 */
GR_VNNI static inline void gr_4xn_scales(const uint8_t *a, const uint8_t *b, const uint8_t *c, const uint8_t *d,
                                         __m512 *d01, __m512 *d23) {
    gr_prefetch_ahead_l2(a);
    gr_prefetch_ahead_l2(b);
    gr_prefetch_ahead_l2(c);
    gr_prefetch_ahead_l2(d);
    __m128i h = _mm_cvtsi32_si128(gr_f16_at(a));
    h = _mm_insert_epi16(h, gr_f16_at(b), 1);
    h = _mm_insert_epi16(h, gr_f16_at(c), 2);
    h = _mm_insert_epi16(h, gr_f16_at(d), 3);
    const __m512 dx = _mm512_castps128_ps512(_mm_cvtph_ps(h));
    *d01 = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), dx);
    *d23 = _mm512_permutexvar_ps(_mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3), dx);
}

/* Four weight rows against NC (up to 8) activation rows: each weight block loaded and
 * unpacked once for the NC columns, every output on its own eight lanes with the
 * steps of vec_dot_*_q8_0_avx2 for its row and column. The three block types are an
 * f16 scale followed by the codes: bs bytes a block; kind 0 Q8_0, 1 Q4_0, 2 Q5_0 */
GR_VNNI static inline __attribute__((always_inline)) void gr_4xn_q0(int64_t n, float *s /* (4 * NC,) */,
                                                                    const void *const vx[4], const void *const vy[8],
                                                                    size_t bs, int kind, int NC) {
    const uint8_t *x0 = vx[0], *x1 = vx[1], *x2 = vx[2], *x3 = vx[3];
    const block_q8_0 *y[8];
    for (int c = 0; c < 8; c++) y[c] = vy[c < NC ? c : 0];
    const __m512i zero = _mm512_setzero_si512();
    __m512 a01[8], a23[8];
    for (int c = 0; c < NC; c++) a01[c] = a23[c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK; i++) {
        const size_t o = (size_t)i * bs;
        __m512 dx01, dx23;
        gr_4xn_scales(x0 + o, x1 + o, x2 + o, x3 + o, &dx01, &dx23);
#define GR_4XN_PAIR(a, b) (kind == 1 ? gr_pair_q4(a + o + 2, b + o + 2) \
                           : kind == 2 ? gr_pair_q5(a + o + 2, b + o + 2) : gr_pair32(a + o + 2, b + o + 2))
        const __m512i q01 = GR_4XN_PAIR(x0, x1), q23 = GR_4XN_PAIR(x2, x3);
#undef GR_4XN_PAIR
        /* gr_dot_i8_x2 with the weights' part done once */
        const __mmask64 m01 = _mm512_movepi8_mask(q01), m23 = _mm512_movepi8_mask(q23);
        const __m512i u01 = _mm512_abs_epi8(q01), u23 = _mm512_abs_epi8(q23);
        for (int c = 0; c < NC; c++) {
            const __m512 dy = _mm512_set1_ps(_cvtsh_ss(y[c][i].d));
            const __m512i qy = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)y[c][i].qs));
            const __m512i p01 = _mm512_dpbusd_epi32(zero, u01, _mm512_mask_sub_epi8(qy, m01, zero, qy));
            const __m512i p23 = _mm512_dpbusd_epi32(zero, u23, _mm512_mask_sub_epi8(qy, m23, zero, qy));
            a01[c] = _mm512_fmadd_ps(_mm512_mul_ps(dx01, dy), _mm512_cvtepi32_ps(p01), a01[c]);
            a23[c] = _mm512_fmadd_ps(_mm512_mul_ps(dx23, dy), _mm512_cvtepi32_ps(p23), a23[c]);
        }
    }
    for (int c = 0; c < NC; c++) gr_finish4(s + 4 * c, a01[c], a23[c]);
}

GR_VNNI void vec_dot_rows4_q8_0_q8_0_vnni(int64_t n, float *s /* (4,) */, const void *const vx[4],
                                          const void *vy /* (n/32,) q8_0 */) {
    gr_4xn_q0(n, s, vx, (const void *const[8]){vy}, sizeof(block_q8_0), 0, 1);
}

GR_VNNI void vec_dot_rows4_q4_0_q8_0_vnni(int64_t n, float *s /* (4,) */, const void *const vx[4],
                                          const void *vy /* (n/32,) q8_0 */) {
    gr_4xn_q0(n, s, vx, (const void *const[8]){vy}, sizeof(block_q4_0), 1, 1);
}

GR_VNNI void vec_dot_rows4_q5_0_q8_0_vnni(int64_t n, float *s /* (4,) */, const void *const vx[4],
                                          const void *vy /* (n/32,) q8_0 */) {
    gr_4xn_q0(n, s, vx, (const void *const[8]){vy}, sizeof(block_q5_0), 2, 1);
}

/* one instance per column count, the count a constant in each: CASE(NC) a case */
#define GR_4XN_SWITCH(CASE)                                                              \
    switch (ncols) { CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) }
#define GR_4XN_CASE(NC) \
    case NC: gr_4xn_q0(n, s, vx, vy, bs, kd, NC); break;
#define GR_4XN_Q0(name, block, kind)                                                                      \
    GR_VNNI void name(int64_t n, float *s, const void *const vx[4], const void *const vy[8], int ncols) { \
        const size_t bs = sizeof(block);                                                                  \
        const int kd = kind;                                                                              \
        GR_4XN_SWITCH(GR_4XN_CASE)                                                                        \
    }
GR_4XN_Q0(vec_dot_4xn_q8_0_q8_0_vnni, block_q8_0, 0)
GR_4XN_Q0(vec_dot_4xn_q4_0_q8_0_vnni, block_q4_0, 1)
GR_4XN_Q0(vec_dot_4xn_q5_0_q8_0_vnni, block_q5_0, 2)
#undef GR_4XN_Q0
#undef GR_4XN_CASE

/* ---- small batches with the codes' offset moved out (ggmlrpc_vec_dot_4xn_sums) ----
 * Per lane, sum((u - off) * y) = sum(u * y) - off * sum(y) with u the unsigned
 * codes (Q8_0's plus 128, Q4_0's nibbles, Q5_0's five-bit codes) and off 128, 8 or
 * 16: VPDPBUSD takes u as it is and starts from -off * sum(y), which depends on the
 * activation block only and is computed once per activation row. The int32 lanes
 * are those of gr_4xn_q0's sign trick wherever y holds no -128 (there that trick
 * wraps); such blocks are marked and take gr_4xn_q0's steps. The float steps are
 * gr_4xn_q0's, so every output is bit-equal to it. */
#define GR_4XN_MARK INT32_MIN

GR_VNNI static inline void gr_act_sums_4xn(const void *vy, int32_t *sums, int64_t nb, int off) {
    const block_q8_0 *y = vy;
    const __m256i m = _mm256_set1_epi8((char)off);   /* unsigned to PMADDUBSW: 128 stays 128 */
    for (int64_t i = 0; i < nb; i++) {
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        /* off * y in pairs (|off * 2 * 127| < 2^15 for off <= 128), then in fours */
        __m256i v = _mm256_madd_epi16(_mm256_maddubs_epi16(m, qy), _mm256_set1_epi16(1));
        v = _mm256_sub_epi32(_mm256_setzero_si256(), v);
        if (_mm256_movemask_epi8(_mm256_cmpeq_epi8(qy, _mm256_set1_epi8(-128))))
            v = _mm256_set1_epi32(GR_4XN_MARK);
        _mm256_storeu_si256((__m256i *)(sums + GGMLRPC_4XN_SUMS * i), v);
        const float d = _cvtsh_ss(y[i].d);    /* the block's scale, converted once for every weight row */
        memcpy(sums + GGMLRPC_4XN_SUMS * i + 8, &d, sizeof d);
    }
}

GR_VNNI void act_sums_4xn_q8_0_vnni(const void *vy, int32_t *sums, int64_t nb) { gr_act_sums_4xn(vy, sums, nb, 128); }
GR_VNNI void act_sums_4xn_q4_0_vnni(const void *vy, int32_t *sums, int64_t nb) { gr_act_sums_4xn(vy, sums, nb, 8); }
GR_VNNI void act_sums_4xn_q5_0_vnni(const void *vy, int32_t *sums, int64_t nb) { gr_act_sums_4xn(vy, sums, nb, 16); }

GR_VNNI static inline __attribute__((always_inline)) void gr_4xn_q0_sums(int64_t n, float *s, const void *const vx[4],
                                                                         const void *const vy[8],
                                                                         const int32_t *const vs[8], size_t bs,
                                                                         int kind, int NC) {
    const uint8_t *x0 = vx[0], *x1 = vx[1], *x2 = vx[2], *x3 = vx[3];
    const block_q8_0 *y[8];
    const int32_t *sm[8];
    for (int c = 0; c < 8; c++) y[c] = vy[c < NC ? c : 0], sm[c] = vs[c < NC ? c : 0];
    const __m512i off = _mm512_set1_epi8((char)(kind == 0 ? 128 : kind == 1 ? 8 : 16));
    __m512 a01[8], a23[8];
    for (int c = 0; c < NC; c++) a01[c] = a23[c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / GR_QK; i++) {
        const size_t o = (size_t)i * bs;
        __m512 dx01, dx23;
        gr_4xn_scales(x0 + o, x1 + o, x2 + o, x3 + o, &dx01, &dx23);
#define GR_4XN_UPAIR(a, b) (kind == 1 ? gr_pair_q4u(a + o + 2, b + o + 2)                                 \
                            : kind == 2 ? _mm512_add_epi8(gr_pair_q5(a + o + 2, b + o + 2), off)           \
                                        : _mm512_xor_si512(gr_pair32(a + o + 2, b + o + 2), off))
        const __m512i u01 = GR_4XN_UPAIR(x0, x1), u23 = GR_4XN_UPAIR(x2, x3);
#undef GR_4XN_UPAIR
        for (int c = 0; c < NC; c++) {
            const int32_t *e = sm[c] + GGMLRPC_4XN_SUMS * i;
            const __m512 dy = _mm512_castsi512_ps(_mm512_set1_epi32(e[8]));    /* its f32 scale */
            const __m512i qy = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)y[c][i].qs));
            __m512i p01, p23;
            if (e[0] != GR_4XN_MARK) {
                const __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)e));
                p01 = _mm512_dpbusd_epi32(b, u01, qy);
                p23 = _mm512_dpbusd_epi32(b, u23, qy);
            } else {   /* gr_4xn_q0's sign trick on the signed codes */
                p01 = gr_dot_i8_x2(_mm512_sub_epi8(u01, off), qy);
                p23 = gr_dot_i8_x2(_mm512_sub_epi8(u23, off), qy);
            }
            a01[c] = _mm512_fmadd_ps(_mm512_mul_ps(dx01, dy), _mm512_cvtepi32_ps(p01), a01[c]);
            a23[c] = _mm512_fmadd_ps(_mm512_mul_ps(dx23, dy), _mm512_cvtepi32_ps(p23), a23[c]);
        }
    }
    for (int c = 0; c < NC; c++) gr_finish4(s + 4 * c, a01[c], a23[c]);
}

#define GR_4XN_CASE(NC) \
    case NC: gr_4xn_q0_sums(n, s, vx, vy, vs, bs, kd, NC); break;
#define GR_4XN_Q0_SUMS(name, block, kind)                                                      \
    GR_VNNI void name(int64_t n, float *s, const void *const vx[4], const void *const vy[8],  \
                      const int32_t *const vs[8], int ncols) {                                \
        const size_t bs = sizeof(block);                                                       \
        const int kd = kind;                                                                   \
        GR_4XN_SWITCH(GR_4XN_CASE)                                                             \
    }
GR_4XN_Q0_SUMS(vec_dot_4xn_sums_q8_0_q8_0_vnni, block_q8_0, 0)
GR_4XN_Q0_SUMS(vec_dot_4xn_sums_q4_0_q8_0_vnni, block_q4_0, 1)
GR_4XN_Q0_SUMS(vec_dot_4xn_sums_q5_0_q8_0_vnni, block_q5_0, 2)
#undef GR_4XN_Q0_SUMS
#undef GR_4XN_CASE
#undef GR_4XN_SWITCH

/* Column panels (quants.h, GR_CPANEL_*): one weight row against sixteen columns per
 * register, the register of partial lane m holding that lane for the sixteen
 * outputs. Each output's eight lanes take vec_dot's steps (int32 lane sums, times
 * its scale product, fused into the lane's accumulator) and the same final sum,
 * lane m of vec_dot's register being register m here. */

/* rows: Q8_0 codes or IQ4_NL levels plus 128 (unsigned), Q4_0's nibbles or Q5_0's
 * five-bit codes; then the block scales */
GR_VNNI void gr_cpanel_decode_vnni(uint32_t type, const void *w_row, int64_t nb, void *row) {
    uint8_t *u = row;
    float *dx = (float *)(u + 32 * nb);
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int64_t i = 0; i < nb; i++) {
        __m256i c;
        gr_fp16_t d;
        if (type == GR_TYPE_Q8_0) {
            const block_q8_0 *x = (const block_q8_0 *)w_row + i;
            c = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)x->qs), flip);
            d = x->d;
        } else if (type == GR_TYPE_IQ4_NL) {   /* the level plus 128 */
            const block_iq4_nl *x = (const block_iq4_nl *)w_row + i;
            c = _mm256_xor_si256(gr_lut_nibbles32(x->qs, gr_lut_load(kvalues_iq4nl)), flip);
            d = x->d;
        } else if (type == GR_TYPE_Q5_0) {
            const block_q5_0 *x = (const block_q5_0 *)w_row + i;
            c = gr_q5_codes_vnni(x->qh, x->qs);
            d = x->d;
        } else {
            const block_q4_0 *x = (const block_q4_0 *)w_row + i;
            c = gr_nibbles32(x->qs);
            d = x->d;
        }
        _mm256_storeu_si256((__m256i *)(u + 32 * i), c);
        dx[i] = _cvtsh_ss(d);
    }
}

/* lane m's int32 sums for the sixteen columns: from the bias (fast) or, for a block
 * whose activations hold -128, by the sign trick on the signed codes, wrap-around
 * included, as ggml's kernels do */
#define GR_CP_FAST(m) _mm512_dpbusd_epi32(_mm512_loadu_si512(p + GR_CPANEL_BIAS + 64 * (m)), \
                                          _mm512_set1_epi32(gr_i32_at(u + 4 * (m))), y##m)
GR_VNNI static inline int32_t gr_i32_at(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* the slow blocks' lanes, out of line so that the fast path keeps its registers */
GR_VNNI __attribute__((noinline)) static void gr_cp_slow(const uint8_t *ua, const uint8_t *ub, const uint8_t *p,
                                                         char off8, __m512i la[8], __m512i lb[8]) {
    const __m512i off = _mm512_set1_epi8(off8);
    for (int m = 0; m < 8; m++) {
        const __m512i y = _mm512_loadu_si512(p + GR_CPANEL_Y + 64 * m);
        la[m] = gr_dot_i8_x2(_mm512_sub_epi8(_mm512_set1_epi32(gr_i32_at(ua + 4 * m)), off), y);
        lb[m] = gr_dot_i8_x2(_mm512_sub_epi8(_mm512_set1_epi32(gr_i32_at(ub + 4 * m)), off), y);
    }
}

#define GR_CP_EACH(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define GR_CP_STEP(m, R, LANES) R##m = _mm512_fmadd_ps(d##R, _mm512_cvtepi32_ps(LANES), R##m);
/* y loaded where it is used, so that the sixteen accumulators stay in registers */
#define GR_CP_FAST_AB(m)                                                     \
    {                                                                        \
        const __m512i y##m = _mm512_loadu_si512(p + GR_CPANEL_Y + 64 * (m)); \
        const uint8_t *u = ua;                                               \
        GR_CP_STEP(m, a, GR_CP_FAST(m))                                      \
        u = ub;                                                              \
        GR_CP_STEP(m, b, GR_CP_FAST(m))                                      \
    }
#define GR_CP_SLOW_AB(m) GR_CP_STEP(m, a, la[m]) GR_CP_STEP(m, b, lb[m])

/* vec_dot's final sum of the eight lanes, for the sixteen outputs at once */
GR_VNNI static inline __m512 gr_cp_hsum(__m512 l0, __m512 l1, __m512 l2, __m512 l3, __m512 l4, __m512 l5,
                                        __m512 l6, __m512 l7) {
    const __m512 t0 = _mm512_add_ps(l4, l0), t1 = _mm512_add_ps(l5, l1);
    const __m512 t2 = _mm512_add_ps(l6, l2), t3 = _mm512_add_ps(l7, l3);
    return _mm512_add_ps(_mm512_add_ps(t0, t2), _mm512_add_ps(t1, t3));
}

GR_VNNI static inline __attribute__((always_inline)) void gr_cpanel_dot_q0(int64_t nb, const void *row_a,
                                                                           const void *row_b, const void *panel,
                                                                           float *s, char off) {
    const uint8_t *ra = row_a, *rb = row_b;
    const float *dxa = (const float *)(ra + 32 * nb), *dxb = (const float *)(rb + 32 * nb);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0, b6 = a0, b7 = a0;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *p = (const uint8_t *)panel + (size_t)i * GGMLRPC_CPANEL_BYTES;
        const uint8_t *ua = ra + 32 * i, *ub = rb + 32 * i;
        const __m512 dy = _mm512_loadu_ps(p);
        const __m512 da = _mm512_mul_ps(_mm512_set1_ps(dxa[i]), dy), db = _mm512_mul_ps(_mm512_set1_ps(dxb[i]), dy);
        uint64_t marks[2];
        memcpy(marks, p + GR_CPANEL_MARK, 16);
        if (__builtin_expect((marks[0] | marks[1]) == 0, 1)) {
            GR_CP_EACH(GR_CP_FAST_AB)
        } else {
            __m512i la[8], lb[8];
            gr_cp_slow(ua, ub, p, off, la, lb);
            GR_CP_EACH(GR_CP_SLOW_AB)
        }
    }
    _mm512_storeu_ps(s, gr_cp_hsum(a0, a1, a2, a3, a4, a5, a6, a7));
    _mm512_storeu_ps(s + 16, gr_cp_hsum(b0, b1, b2, b3, b4, b5, b6, b7));
}

GR_VNNI void gr_cpanel_dot_q8_0_vnni(int64_t nb, const void *row_a, const void *row_b, const void *panel, float *s) {
    gr_cpanel_dot_q0(nb, row_a, row_b, panel, s, (char)0x80);
}

GR_VNNI void gr_cpanel_dot_q4_0_vnni(int64_t nb, const void *row_a, const void *row_b, const void *panel, float *s) {
    gr_cpanel_dot_q0(nb, row_a, row_b, panel, s, 8);
}

GR_VNNI void gr_cpanel_dot_q5_0_vnni(int64_t nb, const void *row_a, const void *row_b, const void *panel, float *s) {
    gr_cpanel_dot_q0(nb, row_a, row_b, panel, s, 16);
}

#endif
