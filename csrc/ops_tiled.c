/* Dot products of K-quant (and IQ4_XS) weight rows with Q8_K activations in the
 * order of ggml's tiled prompt-time GEMM (ggml-cpu/tiled), which its CPU backend
 * uses for these types when 8 or more activation rows are multiplied at once.
 *
 * Per 256-element block everything integer is exact: s1 = sum over sub-blocks of
 * scale * sum(code * q8), and for formats with minimums s2 = sum of min * sum(q8).
 * The float steps, in this order, decide the result:
 *     r   = d * s1;  r = fma(-dmin, s2, r)   (formats with minimums)
 *     acc = fma(r, d8, acc)                  (blocks in order, acc from 0)
 * which differs from the one-row vec_dot kernels only in rounding, so a model
 * gives llama.cpp's exact logits only if prompts take this path here too.
 */
#include <stdint.h>
#include <string.h>

#include "exec_impl.h"

static const int8_t IQ4NL_VALUES[16] = { -127, -104, -83, -65, -49, -35, -22, -10,
                                         1, 13, 25, 38, 53, 69, 89, 113 };

/* sum of q8 over elements [e0, e0 + n), from the Q8_K per-16 sums */
static inline int32_t q8_sum(const block_q8_K *y, int e0, int n) {
    int32_t s = 0;
    for (int k = e0 / 16; k < (e0 + n) / 16; k++) s += y->bsums[k];
    return s;
}

/* the 6-bit scales and mins of Q4_K / Q5_K (8 of each, 32 elements apiece) */
static inline void k4_scale_min(const uint8_t *q, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

typedef struct {
    int32_t s1, s2;
    float d, dmin;
} kblock;

/* code of element e (0..255) of each format: ggml-common.h's layouts */
static kblock blk_q4_K(const void *w, const block_q8_K *y) {
    const block_q4_K *x = w;
    kblock r = { 0, 0, gr_fp16_to_fp32(x->d), gr_fp16_to_fp32(x->dmin) };
    for (int s = 0; s < 8; s++) {
        int sc, m;
        k4_scale_min(x->scales, s, &sc, &m);
        const uint8_t *qs = x->qs + 32 * (s / 2);
        int32_t dot = 0;
        for (int l = 0; l < 32; l++) dot += (int32_t)((s & 1) ? qs[l] >> 4 : qs[l] & 0xF) * y->qs[32 * s + l];
        r.s1 += sc * dot;
        r.s2 += m * q8_sum(y, 32 * s, 32);
    }
    return r;
}

static kblock blk_q5_K(const void *w, const block_q8_K *y) {
    const block_q5_K *x = w;
    kblock r = { 0, 0, gr_fp16_to_fp32(x->d), gr_fp16_to_fp32(x->dmin) };
    for (int s = 0; s < 8; s++) {
        int sc, m;
        k4_scale_min(x->scales, s, &sc, &m);
        const uint8_t *qs = x->qs + 32 * (s / 2);
        int32_t dot = 0;
        for (int l = 0; l < 32; l++) {
            const int lo = (s & 1) ? qs[l] >> 4 : qs[l] & 0xF;
            const int hi = (x->qh[l] >> s) & 1;
            dot += (int32_t)(lo | hi << 4) * y->qs[32 * s + l];
        }
        r.s1 += sc * dot;
        r.s2 += m * q8_sum(y, 32 * s, 32);
    }
    return r;
}

static kblock blk_q6_K(const void *w, const block_q8_K *y) {
    const block_q6_K *x = w;
    kblock r = { 0, 0, gr_fp16_to_fp32(x->d), 0.0f };
    for (int s = 0; s < 16; s++) {
        int32_t dot = 0;
        for (int k = 0; k < 16; k++) {
            const int e = 16 * s + k, half = e >> 7, el = e & 127, quarter = el >> 5, l = el & 31;
            const uint8_t lq = x->ql[64 * half + 32 * (quarter & 1) + l];
            const int lo = quarter < 2 ? lq & 0xF : lq >> 4;
            const int hi = (x->qh[32 * half + l] >> (2 * quarter)) & 3;
            dot += (int32_t)((lo | hi << 4) - 32) * y->qs[e];
        }
        r.s1 += (int32_t)x->scales[s] * dot;
    }
    return r;
}

static kblock blk_q3_K(const void *w, const block_q8_K *y) {
    const block_q3_K *x = w;
    kblock r = { 0, 0, gr_fp16_to_fp32(x->d), 0.0f };
    uint32_t aux[4];
    memcpy(aux, x->scales, 12);
    const uint32_t t = aux[2];
    aux[2] = ((aux[0] >> 4) & 0x0f0f0f0fu) | (((t >> 4) & 0x03030303u) << 4);
    aux[3] = ((aux[1] >> 4) & 0x0f0f0f0fu) | (((t >> 6) & 0x03030303u) << 4);
    aux[0] = (aux[0] & 0x0f0f0f0fu) | (((t >> 0) & 0x03030303u) << 4);
    aux[1] = (aux[1] & 0x0f0f0f0fu) | (((t >> 2) & 0x03030303u) << 4);
    const int8_t *scales = (const int8_t *)aux;
    for (int s = 0; s < 16; s++) {
        int32_t dot = 0;
        for (int k = 0; k < 16; k++) {
            const int e = 16 * s + k, half = e >> 7, el = e & 127, group = el >> 5, l = el & 31;
            const int low = (x->qs[32 * half + l] >> (2 * group)) & 3;
            const int high = (x->hmask[l] >> (4 * half + group)) & 1;
            dot += (int32_t)((low | high << 2) - 4) * y->qs[e];
        }
        r.s1 += (scales[s] - 32) * dot;
    }
    return r;
}

static kblock blk_q2_K(const void *w, const block_q8_K *y) {
    const block_q2_K *x = w;
    kblock r = { 0, 0, gr_fp16_to_fp32(x->d), gr_fp16_to_fp32(x->dmin) };
    for (int s = 0; s < 16; s++) {
        int32_t dot = 0;
        for (int k = 0; k < 16; k++) {
            const int e = 16 * s + k, half = e >> 7, el = e & 127;
            const int code = (x->qs[32 * half + (el & 31)] >> (2 * (el >> 5))) & 3;
            dot += (int32_t)code * y->qs[e];
        }
        r.s1 += (int32_t)(x->scales[s] & 0xF) * dot;
        r.s2 += (int32_t)(x->scales[s] >> 4) * q8_sum(y, 16 * s, 16);
    }
    return r;
}

static kblock blk_iq4_xs(const void *w, const block_q8_K *y) {
    const block_iq4_xs *x = w;
    kblock r = { 0, 0, gr_fp16_to_fp32(x->d), 0.0f };
    for (int s = 0; s < 8; s++) {
        const int ls = ((x->scales_l[s / 2] >> 4 * (s % 2)) & 0xf) | (((x->scales_h >> 2 * s) & 3) << 4);
        const uint8_t *qs = x->qs + 16 * s;
        int32_t dot = 0;
        for (int l = 0; l < 16; l++) {
            dot += (int32_t)IQ4NL_VALUES[qs[l] & 0xF] * y->qs[32 * s + l];
            dot += (int32_t)IQ4NL_VALUES[qs[l] >> 4] * y->qs[32 * s + 16 + l];
        }
        r.s1 += (ls - 32) * dot;
    }
    return r;
}

typedef kblock (*kblock_fn)(const void *w, const block_q8_K *y);

static kblock_fn kblock_for(int32_t type, size_t *bsize, int *has_min) {
    switch (type) {
    case GR_TYPE_Q2_K: *bsize = sizeof(block_q2_K); *has_min = 1; return blk_q2_K;
    case GR_TYPE_Q3_K: *bsize = sizeof(block_q3_K); *has_min = 0; return blk_q3_K;
    case GR_TYPE_Q4_K: *bsize = sizeof(block_q4_K); *has_min = 1; return blk_q4_K;
    case GR_TYPE_Q5_K: *bsize = sizeof(block_q5_K); *has_min = 1; return blk_q5_K;
    case GR_TYPE_Q6_K: *bsize = sizeof(block_q6_K); *has_min = 0; return blk_q6_K;
    case GR_TYPE_IQ4_XS: *bsize = sizeof(block_iq4_xs); *has_min = 0; return blk_iq4_xs;
    default: return NULL;
    }
}

int gr_tiled_supported(int32_t type) {
    size_t bs;
    int hm;
    return kblock_for(type, &bs, &hm) != NULL;
}

/*   w_row: K / 256 blocks of `type`; act: K / 256 Q8_K blocks */
float gr_tiled_dot(int32_t type, int64_t K, const void *w_row, const void *act) {
    size_t bsize;
    int has_min;
    const kblock_fn fn = kblock_for(type, &bsize, &has_min);
    const block_q8_K *y = act;
    const char *x = w_row;
    float acc = 0.0f;
    for (int64_t b = 0; b < K / 256; b++) {
        const kblock k = fn(x + (size_t)b * bsize, &y[b]);
        float r = k.d * (float)k.s1;
        if (has_min) r = fmaf(-k.dmin, (float)k.s2, r);
        acc = fmaf(r, y[b].d, acc);
    }
    return acc;
}
