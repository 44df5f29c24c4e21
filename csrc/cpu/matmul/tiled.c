/* Dot products of K-quant (and IQ4_XS) weight rows with Q8_K activations in the
 * order of ggml's tiled prompt-time GEMM (ggml-cpu/tiled), which its CPU backend
 * uses for these types when 8 or more activation rows are multiplied at once.
 *
 * Per 256-element block everything integer is exact: s1 = sum over sub-blocks of
 * scale * sum(value * q8), and for formats with minimums s2 = sum of min * sum(q8).
 * The float steps, in this order, decide the result:
 *     r   = d * s1;  r = fma(-dmin, s2, r)   (formats with minimums)
 *     acc = fma(r, d8, acc)                  (blocks in order, acc from 0)
 * which differs from the one-row vec_dot kernels only in rounding, so a model
 * gives llama.cpp's exact logits only if prompts take this path here too.
 *
 * A weight row is decoded once (gr_tiled_decode) into signed 8-bit values with
 * per-16 scales and minimums; its dot products with every activation row then
 * need only integer multiply-adds (AVX2 where the CPU has it).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cpu/job.h"
#include "cpu/kernels.h"
#include "cpu/matmul/tiled_impl.h"

/* One block decoded: w[256] signed values (|w| <= 127), sc/mn per 16 elements
 * (a 32-element sub-block's scale repeated), d and dmin; w NULL: all but w. */
typedef struct {
    int8_t *w;
    int16_t *sc, *mn;
    float *d, *dmin;
} kdec;

static void dec_q4_K(const void *blk, kdec o) {
    const block_q4_K *x = blk;
    *o.d = gr_fp16_to_fp32(x->d);
    *o.dmin = gr_fp16_to_fp32(x->dmin);
    uint8_t sc[8], m[8];
    gr_k4_scales(x->scales, sc, m);
    for (int s = 0; s < 8; s++) {
        o.sc[2 * s] = o.sc[2 * s + 1] = sc[s];
        o.mn[2 * s] = o.mn[2 * s + 1] = m[s];
        const uint8_t *qs = x->qs + 32 * (s / 2);
        for (int l = 0; l < 32 && o.w; l++) o.w[32 * s + l] = (int8_t)((s & 1) ? qs[l] >> 4 : qs[l] & 0xF);
    }
}

static void dec_q5_K(const void *blk, kdec o) {
    const block_q5_K *x = blk;
    *o.d = gr_fp16_to_fp32(x->d);
    *o.dmin = gr_fp16_to_fp32(x->dmin);
    uint8_t sc[8], m[8];
    gr_k4_scales(x->scales, sc, m);
    for (int s = 0; s < 8; s++) {
        o.sc[2 * s] = o.sc[2 * s + 1] = sc[s];
        o.mn[2 * s] = o.mn[2 * s + 1] = m[s];
        const uint8_t *qs = x->qs + 32 * (s / 2);
        for (int l = 0; l < 32 && o.w; l++) {
            const int lo = (s & 1) ? qs[l] >> 4 : qs[l] & 0xF;
            o.w[32 * s + l] = (int8_t)(lo | ((x->qh[l] >> s) & 1) << 4);
        }
    }
}

static void dec_q6_K(const void *blk, kdec o) {
    const block_q6_K *x = blk;
    *o.d = gr_fp16_to_fp32(x->d);
    *o.dmin = 0.0f;
    for (int e = 0; e < 256 && o.w; e++) {
        const int half = e >> 7, el = e & 127, quarter = el >> 5, l = el & 31;
        const uint8_t lq = x->ql[64 * half + 32 * (quarter & 1) + l];
        const int lo = quarter < 2 ? lq & 0xF : lq >> 4;
        const int hi = (x->qh[32 * half + l] >> (2 * quarter)) & 3;
        o.w[e] = (int8_t)((lo | hi << 4) - 32);
    }
    for (int s = 0; s < 16; s++) {
        o.sc[s] = x->scales[s];
        o.mn[s] = 0;
    }
}

static void dec_q3_K(const void *blk, kdec o) {
    const block_q3_K *x = blk;
    *o.d = gr_fp16_to_fp32(x->d);
    *o.dmin = 0.0f;
    int8_t scales[16];
    gr_k3_scales(x->scales, scales);
    for (int e = 0; e < 256 && o.w; e++) {
        const int half = e >> 7, el = e & 127, group = el >> 5, l = el & 31;
        const int low = (x->qs[32 * half + l] >> (2 * group)) & 3;
        const int high = (x->hmask[l] >> (4 * half + group)) & 1;
        o.w[e] = (int8_t)((low | high << 2) - 4);
    }
    for (int s = 0; s < 16; s++) {
        o.sc[s] = scales[s];
        o.mn[s] = 0;
    }
}

static void dec_q2_K(const void *blk, kdec o) {
    const block_q2_K *x = blk;
    *o.d = gr_fp16_to_fp32(x->d);
    *o.dmin = gr_fp16_to_fp32(x->dmin);
    for (int e = 0; e < 256 && o.w; e++) {
        const int half = e >> 7, el = e & 127;
        o.w[e] = (int8_t)((x->qs[32 * half + (el & 31)] >> (2 * (el >> 5))) & 3);
    }
    for (int s = 0; s < 16; s++) {
        o.sc[s] = (int16_t)(x->scales[s] & 0xF);
        o.mn[s] = (int16_t)(x->scales[s] >> 4);
    }
}

static void dec_iq4_xs(const void *blk, kdec o) {
    const block_iq4_xs *x = blk;
    *o.d = gr_fp16_to_fp32(x->d);
    *o.dmin = 0.0f;
    for (int s = 0; s < 8; s++) {
        o.sc[2 * s] = o.sc[2 * s + 1] = (int16_t)gr_iq4xs_scale(x, s);
        o.mn[2 * s] = o.mn[2 * s + 1] = 0;
        const uint8_t *qs = x->qs + 16 * s;
        for (int l = 0; l < 16 && o.w; l++) {
            o.w[32 * s + l] = kvalues_iq4nl[qs[l] & 0xF];
            o.w[32 * s + 16 + l] = kvalues_iq4nl[qs[l] >> 4];
        }
    }
}

typedef void (*kdec_fn)(const void *blk, kdec o);

static kdec_fn decoder_for(int32_t type, size_t *bsize, int *has_min) {
    *bsize = gr_tiled_block(type, has_min);
    switch (type) {
    case GR_TYPE_Q2_K: return dec_q2_K;
    case GR_TYPE_Q3_K: return dec_q3_K;
    case GR_TYPE_Q4_K: return dec_q4_K;
    case GR_TYPE_Q5_K: return dec_q5_K;
    case GR_TYPE_Q6_K: return dec_q6_K;
    case GR_TYPE_IQ4_XS: return dec_iq4_xs;
    default: return NULL;
    }
}

size_t gr_tiled_row_bytes(int64_t K) {
    /* w (K), sc and mn (K/16 each, int16), d and dmin (K/256 each, float), has_min */
    return (size_t)K + (size_t)(K / 16) * 4 + (size_t)(K / 256) * 8 + 64;
}

static inline gr_tiled_row row_view(void *mem, int64_t K) {
    char *p = mem;
    gr_tiled_row r;
    r.w = (int8_t *)p;
    r.sc = (int16_t *)(p + K);
    r.mn = r.sc + K / 16;
    r.d = (float *)(r.mn + K / 16);
    r.dmin = r.d + K / 256;
    r.K = K;
    r.has_min = 0;
    return r;
}

static int kpanel_simd = 0;   /* the AVX2 K-panel kernels and unpackers (x86/) are in use */
static int wpanel_simd = 0;   /* the AVX-512 VNNI weight panels (x86/) are in use */

gr_tiled_row gr_tiled_decode(int32_t type, int64_t K, const void *w_row, void *mem) {
    size_t bsize;
    int has_min;
    const kdec_fn fn = decoder_for(type, &bsize, &has_min);
    gr_tiled_row r = row_view(mem, K);
    r.has_min = has_min;
    for (int64_t b = 0; b < K / 256; b++) {
        const char *blk = (const char *)w_row + (size_t)b * bsize;
        if (kpanel_simd) {   /* the same values, unpacked with AVX2 */
            fn(blk, (kdec){ NULL, r.sc + 16 * b, r.mn + 16 * b, r.d + b, r.dmin + b });
            gr_tiled_codes_x86(type, blk, r.w + 256 * b);
        } else {
            fn(blk, (kdec){ r.w + 256 * b, r.sc + 16 * b, r.mn + 16 * b, r.d + b, r.dmin + b });
        }
    }
    return r;
}

/* The exact integers of one block: s1 = sum over groups of 16 of sc * (w . q),
 * s2 = sum of mn * (sum of q). */
static void block_sums_c(const int8_t *w, const int8_t *q, const int16_t *sc, const int16_t *mn,
                         const int16_t *bsums, int32_t *s1, int32_t *s2) {
    int32_t a = 0, b = 0;
    for (int g = 0; g < 16; g++) {
        int32_t dot = 0;
        for (int k = 0; k < 16; k++) dot += (int32_t)w[16 * g + k] * q[16 * g + k];
        a += sc[g] * dot;
        b += mn[g] * bsums[g];
    }
    *s1 = a;
    *s2 = b;
}

void gr_tiled_init(int use_simd, int family) {
    kpanel_simd = GR_X86 && use_simd;
    wpanel_simd = gr_tiled_x86_init(use_simd, family);
}

/*   act: K / 256 Q8_K blocks */
float gr_tiled_dot_row(const gr_tiled_row *r, const void *act) {
    if (kpanel_simd) return gr_tiled_dot_row_x86(r, act);
    GR_TILED_DOT_BODY(block_sums_c)
}

/* ---- K panels (layout in tiled_impl.h; the kernels in x86/tiled_x86.c) -------- */
int gr_kpanel_available(int32_t type) {
    size_t bs;
    int hm;
    return kpanel_simd && decoder_for(type, &bs, &hm) != NULL;
}

void gr_kpanel_put(const void *q8k_row /* (nb,) q8_K */, int64_t nb, void *panel /* (nb, GR_KPANEL_BYTES) */,
                   int lane) {
    const block_q8_K *y = q8k_row;
    for (int64_t b = 0; b < nb; b++) {
        char *p = (char *)panel + (size_t)b * GR_KPANEL_BYTES;
        memcpy(p + 256 * lane, y[b].qs, 256);
        int16_t *pairs = (int16_t *)(p + KP_PAIRS);
        for (int k = 0; k < 8; k++) {
            pairs[16 * k + 2 * lane] = y[b].bsums[2 * k];
            pairs[16 * k + 2 * lane + 1] = y[b].bsums[2 * k + 1];
        }
        memcpy(p + KP_D + 4 * lane, &y[b].d, 4);
    }
}

void gr_kpanel_decode(int32_t type, int64_t nb, const void *w_row /* (nb,) blocks */,
                      void *krow /* (nb, GR_KROW_BYTES) */, float *d /* (nb,) */, float *dmin /* (nb,) */) {
    size_t bsize;
    int has_min;
    const kdec_fn fn = decoder_for(type, &bsize, &has_min);
    int16_t sc[16], mn[16];
    for (int64_t b = 0; b < nb; b++) {
        const char *blk = (const char *)w_row + (size_t)b * bsize;
        fn(blk, (kdec){ NULL, sc, mn, d + b, dmin + b });   /* scales only */
        gr_kpanel_block_x86(type, blk, sc, mn, has_min, (char *)krow + (size_t)b * GR_KROW_BYTES);
    }
}

/* ---- weight panels (x86/tiled_x86.c) ------------------------------------------ */
int gr_wpanel_available(int32_t type) {
    size_t bs;
    int hm;
    return wpanel_simd && decoder_for(type, &bs, &hm) != NULL;
}

#if !GR_X86
/* the fallback where there is no x86/: never called, the *_available say 0 */
void gr_kpanel_dot_rows(int32_t type, int64_t nb, const void *krow, const float *d, const float *dmin,
                        const void *const act[8], float out[8]) {
    (void)type; (void)nb; (void)krow; (void)d; (void)dmin; (void)act; (void)out;
}

void gr_kpanel_dot(int32_t type, int64_t nb, const void *krow, const float *d, const float *dmin,
                   const void *panel, float out[8]) {
    (void)type; (void)nb; (void)krow; (void)d; (void)dmin; (void)panel; (void)out;
}

void gr_wpanel_decode(int32_t type, int64_t nb, const void *w0, size_t row_stride, int rows, void *panel) {
    (void)type; (void)nb; (void)w0; (void)row_stride; (void)rows; (void)panel;
}

void gr_wpanel_gemm(int32_t type, int64_t nb, const void *panel, const void *act0, size_t act_stride,
                    int64_t ncols, float *out0, size_t out_stride, int rows) {
    (void)type; (void)nb; (void)panel; (void)act0; (void)act_stride; (void)ncols; (void)out0; (void)out_stride;
    (void)rows;
}
#endif
