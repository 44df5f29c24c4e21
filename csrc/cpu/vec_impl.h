/* What the portable vector primitives (vec.c) and their x86 versions
 * (x86/vec_x86.c) share: ggml's vector exp per lane, the dot product tail, the
 * 16-lane sum, ROPE's rotation of a pair and one VDPBF16PS lane. Internal to
 * csrc/cpu/; static inline, so both sides compile the same code.
 */
#ifndef GGMLRPC_CPU_VEC_IMPL_H
#define GGMLRPC_CPU_VEC_IMPL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/fp16.h"
#include "cpu/quants/quants.h"
#include "cpu/simd.h"
#include "cpu/vec.h"

/* exp(x) = 2^n * (1 + p(b)) with n = round(x / ln 2), b = x - n ln 2 (ln 2
 * split in a high and a low part), p a degree-5 polynomial; lanes whose |n|
 * exceeds 126 rescale in two steps so that the result under/overflows
 * gracefully. The constants are those of the 8-lane version in ggml. */
static inline float expf_lane(float x) {
    const float shift = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, shift);
    const float n = z - shift;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const uint32_t e = gr_f32_bits(z) << 23;
    const float k = gr_bits_f32(e + gr_f32_bits(1.0f));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                              fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                         u, 0x1.ffffecp-1f * b);
    if (!(fabsf(n) > 126.0f)) return fmaf(j, k, k);
    const uint32_t g = (n <= 0.0f) ? 0x82000000u : 0u;
    const float s1 = gr_bits_f32(g + 0x7f000000u);
    const float s2 = gr_bits_f32(e - g);
    if (fabsf(n) > 192.0f) return s1 * s1;
    return fmaf(s2, j, s2) * s1;
}

/* The 16-lane exp of ggml's AVX-512 build: the same reduction and polynomial, but
 * 1 + p(b) is formed with one more fused step and scaled by 2^n with VSCALEFPS (one
 * rounding, gradual underflow); |n| > 192 gives +inf or 0. */
static inline float expf_lane16(float x) {
    const float shift = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, shift);
    const float n = z - shift;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                              fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                         u, fmaf(0x1.ffffecp-1f, b, 1.0f));
    if (n != n) return n;
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
    return ldexpf(j, (int)n);
}

/* The tail of ggml_vec_dot_f32 after its 32-element blocks, as GCC compiles it for
 * the x86 build we match: whole groups of four as rounded products added in
 * order, the last one to three elements with fused multiply-adds. */
static inline float leftovers_f32(float s, int64_t i, int64_t n, const float *x, const float *y) {
    if (n - i >= 4)
        for (; i + 3 < n; i += 4)
            for (int k = 0; k < 4; k++) {
                const float p = x[i + k] * y[i + k];
                s += p;
            }
    for (; i < n; i++) s = fmaf(x[i], y[i], s);
    return s;
}

/* one 16-lane accumulator as GCC's _mm512_reduce_add_ps sums it (ggml's AVX-512
 * reductions and tinyBLAS's hsum): high half onto low half twice, then (0+2)+(1+3) */
static inline float hsum_16(const float a[16]) {
    float t8[8], t4[4];
    for (int l = 0; l < 8; l++) t8[l] = a[l + 8] + a[l];
    for (int l = 0; l < 4; l++) t4[l] = t8[l + 4] + t8[l];
    return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

static inline void rope_pair(int32_t type, char *dst, const char *src, int64_t i, int64_t j, float c, float s) {
    float x0, x1;
    if (type == GR_TYPE_F32) {
        memcpy(&x0, src + 4 * i, 4);
        memcpy(&x1, src + 4 * j, 4);
    } else {
        uint16_t h0, h1;
        memcpy(&h0, src + 2 * i, 2);
        memcpy(&h1, src + 2 * j, 2);
        x0 = gr_fp16_to_fp32(h0);
        x1 = gr_fp16_to_fp32(h1);
    }
    const float y0 = fmaf(x0, c, -(x1 * s));
    const float y1 = fmaf(x0, s, x1 * c);
    if (type == GR_TYPE_F32) {
        memcpy(dst + 4 * i, &y0, 4);
        memcpy(dst + 4 * j, &y1, 4);
    } else {
        const uint16_t h0 = gr_fp32_to_fp16(y0), h1 = gr_fp32_to_fp16(y1);
        memcpy(dst + 2 * i, &h0, 2);
        memcpy(dst + 2 * j, &h1, 2);
    }
}

#define GR_ROPE_ROTATE_BODY                                                                      \
    for (int64_t p = 0; p < np; p++) rope_pair(type, dst, src, p * istep, p * istep + joff, cs[2 * p], cs[2 * p + 1]);

/* VDPBF16PS, one lane: the products of the odd BF16 pair, then of the even one, each
 * added to acc with one rounding; denormal inputs (acc too) read as zero, denormal
 * results are flushed to zero (checked against the instruction) */
static inline float daz_f32(float f) { return (gr_f32_bits(f) & 0x7f800000u) ? f : gr_bits_f32(gr_f32_bits(f) & 0x80000000u); }

static inline float bf16_f32(uint16_t h) { return gr_bits_f32((uint32_t)h << 16); }

static inline float dpbf16_lane(float acc, const uint16_t *a /* (2,) */, const uint16_t *b /* (2,) */) {
    acc = daz_f32(fmaf(daz_f32(bf16_f32(a[1])), daz_f32(bf16_f32(b[1])), daz_f32(acc)));
    return daz_f32(fmaf(daz_f32(bf16_f32(a[0])), daz_f32(bf16_f32(b[0])), acc));
}

/* ---- the x86 primitives (x86/vec_x86.c) ----------------------------------- */
#if GR_X86
/* *v holds family's portable set: put the x86 primitives in their place where
 * use_simd and the CPU has family's instructions; 1 if it did */
int gr_vec_x86(int family, int use_simd, struct gr_vec_ops *v);
#else
/* the fallback (as ggml's arch-fallback.h): the portable set stays */
static inline int gr_vec_x86(int family, int use_simd, struct gr_vec_ops *v) {
    (void)family; (void)use_simd; (void)v;
    return 0;
}
#endif

#endif
