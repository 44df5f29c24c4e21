/* Encoder ops of vision and audio models: IM2COL, POOL_1D / POOL_2D, UPSCALE,
 * PAD_REFLECT_1D, TIMESTEP_EMBEDDING, and Segment Anything's window ops (WIN_PART,
 * WIN_UNPART, GET_REL_POS, ADD_REL_POS).
 * Same conventions as every ops file: the planner (ggmlrpc/compute/) checked types
 * and shapes, a kernel only walks each tensor inside its own ne/nb, rows are split
 * between threads with gr_range(), and arithmetic follows ggml's CPU backend
 * (ops.cpp, vec.h): the same rounding points and the same fused multiply-adds
 * where ggml's x86 build fuses.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/job.h"
#include "cpu/kernels.h"

/* ---- encoder ops (vision and audio) ---------------------------------------------- */

/* Unfold image patches for a convolution as a matrix product:
 *   src1 image: (IW, IH, IC, N) (2-D) or (IW, IC, N) (1-D), planes contiguous
 *   dst: (IC*KH*KW, OW, OH, N) (2-D) or (IC*KW, OW, N) (1-D), contiguous F32/F16
 *   op_params: s0, s1, p0, p1, d0, d1, is_2D; src0 (the kernel) gives KW, KH */
void gr_k_im2col(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *k = &n->src[0], *img = &n->src[1], *d = &n->dst;
    const int32_t *p = n->op_params;
    const int is2d = p[6] == 1;
    const int64_t N = is2d ? img->ne[3] : img->ne[2], IC = is2d ? img->ne[2] : img->ne[1];
    const int64_t IH = is2d ? img->ne[1] : 1, IW = img->ne[0];
    const int64_t KH = is2d ? k->ne[1] : 1, KW = k->ne[0];
    const int64_t OH = is2d ? d->ne[2] : 1, OW = d->ne[1];
    const int64_t ofs0 = is2d ? img->nb[3] : img->nb[2], ofs1 = is2d ? img->nb[2] : img->nb[1];
    const int f16 = d->type == GR_TYPE_F16;
    for (int64_t in = 0; in < N; in++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++)
                for (int64_t ic = job->ith; ic < IC; ic += job->nth) {
                    const int64_t base = (in * OH * OW + oh * OW + ow) * (IC * KH * KW) + ic * KH * KW;
                    const char *src = img->data + in * ofs0 + ic * ofs1;
                    for (int64_t kh = 0; kh < KH; kh++)
                        for (int64_t kw = 0; kw < KW; kw++) {
                            const int64_t iw = ow * p[0] + kw * p[4] - p[2];
                            const int64_t ih = oh * p[1] + kh * p[5] - p[3];
                            float v = 0.0f;
                            if (ih >= 0 && ih < IH && iw >= 0 && iw < IW)
                                gr_load_f32(img->type, src + (ih * IW + iw) * img->nb[0], 0, &v, 1);
                            if (f16) {
                                const uint16_t h = gr_fp32_to_fp16(v);
                                memcpy(d->data + (base + kh * KW + kw) * 2, &h, 2);
                            } else {
                                memcpy(d->data + (base + kh * KW + kw) * 4, &v, 4);
                            }
                        }
                }
}

enum { POOL_MAX = 0, POOL_AVG = 1 };

/* POOL_1D: op_params op, k0, s0, p0; average over the taps inside the row */
void gr_k_pool_1d(gr_job *job, int phase) {
    (void)phase;
    if (job->ith != 0) return;
    GR_NODE_LOCALS(job);
    const int op = n->op_params[0], k = n->op_params[1], st = n->op_params[2], pd = n->op_params[3];
    const int64_t IW = s->ne[0], OW = d->ne[0];
    for (int64_t ir = 0; ir < gr_nrows(s); ir++) {
        const char *row = gr_row(s, ir);
        float *out = (float *)gr_row(d, ir);
        for (int64_t ow = 0; ow < OW; ow++) {
            float res = op == POOL_AVG ? 0.0f : -FLT_MAX;
            int count = 0;
            for (int ki = 0; ki < k; ki++) {
                const int64_t j = ow * st - pd + ki;
                if (j < 0 || j >= IW) continue;
                float v;
                gr_load_f32(s->type, row + j * s->nb[0], 0, &v, 1);
                res = op == POOL_AVG ? res + v : (v > res ? v : res);
                count++;
            }
            if (op == POOL_AVG) res = count > 0 ? res / count : 0.0f;
            out[ow] = res;
        }
    }
}

/* POOL_2D: op_params op, k0, k1, s0, s1, p0, p1; average over the whole window */
void gr_k_pool_2d(gr_job *job, int phase) {
    (void)phase;
    if (job->ith != 0) return;
    GR_NODE_LOCALS(job);
    const int32_t *p = n->op_params;
    const int op = p[0], k0 = p[1], k1 = p[2], s0 = p[3], s1 = p[4], p0 = p[5], p1 = p[6];
    for (int64_t i3 = 0; i3 < d->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < d->ne[2]; i2++)
            for (int64_t oy = 0; oy < d->ne[1]; oy++) {
                float *out = (float *)gr_at(d, 0, oy, i2, i3);
                for (int64_t ox = 0; ox < d->ne[0]; ox++) {
                    float res = op == POOL_AVG ? 0.0f : -FLT_MAX;
                    const int64_t ix = ox * s0 - p0, iy = oy * s1 - p1;
                    for (int ky = 0; ky < k1; ky++) {
                        if (iy + ky < 0 || iy + ky >= s->ne[1]) continue;
                        for (int kx = 0; kx < k0; kx++) {
                            const int64_t j = ix + kx;
                            if (j < 0 || j >= s->ne[0]) continue;
                            float v;
                            gr_load_f32(s->type, gr_at(s, j, iy + ky, i2, i3), 0, &v, 1);
                            res = op == POOL_AVG ? res + v : (v > res ? v : res);
                        }
                    }
                    if (op == POOL_AVG) res /= k0 * k1;
                    out[ox] = res;
                }
            }
}

static inline int64_t clampi(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }
static inline float src_f(const gr_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    float v;
    memcpy(&v, gr_at(t, i0, i1, i2, i3), 4);
    return v;
}

/* bicubic convolution weights, alpha = -0.75 (PyTorch's), with the fused steps and
 * the order of terms the reference build computes them in */
static inline float cubic1(float x) { return fmaf(fmaf(1.25f, x, -2.25f) * x, x, 1.0f); }
static inline float cubic2(float x) { return fmaf(fmaf(fmaf(-0.75f, x, 3.75f), x, -6.0f), x, 3.0f); }
static inline float bicubic(float p0, float p1, float p2, float p3, float x) {
    const float w0 = cubic2(x + 1), w1 = cubic1(x + 0), w2 = cubic1(1 - x), w3 = cubic2(2 - x);
    return fmaf(p3, w3, fmaf(p2, w2, fmaf(p0, w0, p1 * w1)));
}

/* Resample to dst's shape: nearest, bilinear (optionally antialiased), bicubic;
 * op_params[0]: mode | flags (256 align corners, 512 antialias). F32. */
void gr_k_upscale(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    const int64_t ne00 = s->ne[0], ne01 = s->ne[1];
    float sf0 = (float)d->ne[0] / ne00, sf1 = (float)d->ne[1] / ne01;
    const float sf2 = (float)d->ne[2] / s->ne[2], sf3 = (float)d->ne[3] / s->ne[3];
    const int flags = n->op_params[0], mode = flags & 0xFF;
    float off = 0.5f;
    if (flags & 256) {
        off = 0.0f;
        if (d->ne[0] > 1 && ne00 > 1) sf0 = (float)(d->ne[0] - 1) / (ne00 - 1);
        if (d->ne[1] > 1 && ne01 > 1) sf1 = (float)(d->ne[1] - 1) / (ne01 - 1);
    }
    for (int64_t i3 = 0; i3 < d->ne[3]; i3++) {
        const int64_t i03 = clampi((int64_t)(i3 / sf3), 0, s->ne[3] - 1);
        for (int64_t i2 = job->ith; i2 < d->ne[2]; i2 += job->nth) {
            const int64_t i02 = clampi((int64_t)(i2 / sf2), 0, s->ne[2] - 1);
            for (int64_t i1 = 0; i1 < d->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < d->ne[0]; i0++) {
                    float val;
                    if (mode == 0) {
                        val = src_f(s, clampi((int64_t)(i0 / sf0), 0, ne00 - 1),
                                    clampi((int64_t)(i1 / sf1), 0, ne01 - 1), i02, i03);
                    } else if (mode == 1 && (flags & 512)) {
                        const float sup1 = fmaxf(1.0f, 1.0f / sf1), inv1 = 1.0f / sup1;
                        const float sup0 = fmaxf(1.0f, 1.0f / sf0), inv0 = 1.0f / sup0;
                        const float y = ((float)i1 + off) / sf1, x = ((float)i0 + off) / sf0;
                        int64_t x_min = (int64_t)(x - sup0 + off), x_max = (int64_t)(x + sup0 + off);
                        int64_t y_min = (int64_t)(y - sup1 + off), y_max = (int64_t)(y + sup1 + off);
                        x_min = x_min < 0 ? 0 : x_min;
                        y_min = y_min < 0 ? 0 : y_min;
                        x_max = x_max > ne00 ? ne00 : x_max;
                        y_max = y_max > ne01 ? ne01 : y_max;
                        float acc = 0.0f, total = 0.0f;
                        for (int64_t sy = y_min; sy < y_max; sy++) {
                            const float wy = fmaxf(1.0f - fabsf((sy - y + off) * inv1), 0.0f);
                            for (int64_t sx = x_min; sx < x_max; sx++) {
                                const float wx = fmaxf(1.0f - fabsf((sx - x + off) * inv0), 0.0f);
                                const float w = wx * wy;
                                if (w <= 0.0f) continue;
                                acc = fmaf(src_f(s, sx, sy, i02, i03), w, acc);
                                total += w;
                            }
                        }
                        val = total > 0.0f ? acc / total : acc;
                    } else if (mode == 1) {
                        const float y = ((float)i1 + off) / sf1 - off, x = ((float)i0 + off) / sf0 - off;
                        int64_t y0 = (int64_t)floorf(y), x0 = (int64_t)floorf(x);
                        const int64_t y1 = clampi(y0 + 1, 0, ne01 - 1), x1 = clampi(x0 + 1, 0, ne00 - 1);
                        y0 = clampi(y0, 0, ne01 - 1);
                        x0 = clampi(x0, 0, ne00 - 1);
                        const float dy = fmaxf(0.0f, fminf(y - (float)y0, 1.0f));
                        const float dx = fmaxf(0.0f, fminf(x - (float)x0, 1.0f));
                        const float a = src_f(s, x0, y0, i02, i03), b = src_f(s, x1, y0, i02, i03);
                        const float c = src_f(s, x0, y1, i02, i03), e = src_f(s, x1, y1, i02, i03);
                        /* the reference build sums the second term first, then fuses the rest in order */
                        val = fmaf(e * dx, dy, fmaf(c * (1 - dx), dy, fmaf(a * (1 - dx), 1 - dy, b * dx * (1 - dy))));
                    } else {
                        const float y = ((float)i1 + off) / sf1 - off, x = ((float)i0 + off) / sf0 - off;
                        const int64_t y0 = (int64_t)floorf(y), x0 = (int64_t)floorf(x);
                        const float dy = y - (float)y0, dx = x - (float)x0;
                        float rows[4];
                        for (int r = 0; r < 4; r++) {
                            const int64_t yy = clampi(y0 - 1 + r, 0, ne01 - 1);
                            float px[4];
                            for (int c = 0; c < 4; c++) px[c] = src_f(s, clampi(x0 - 1 + c, 0, ne00 - 1), yy, i02, i03);
                            rows[r] = bicubic(px[0], px[1], px[2], px[3], dx);
                        }
                        val = bicubic(rows[0], rows[1], rows[2], rows[3], dy);
                    }
                    memcpy(gr_at(d, i0, i1, i2, i3), &val, 4);
                }
        }
    }
}

/* dst row = src0 row with p0 / p1 mirrored elements added on the left / right */
void gr_k_pad_reflect_1d(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    const int64_t p0 = n->op_params[0], p1 = n->op_params[1], ne0 = d->ne[0];
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        float *y = (float *)gr_row(d, ir);
        memcpy(y + p0, gr_row(s, ir), (size_t)s->ne[0] * 4);
        for (int64_t i = 1; i <= p0; i++) y[p0 - i] = y[p0 + i];
        for (int64_t i = 1; i <= p1; i++) y[ne0 - p1 - 1 + i] = y[ne0 - p1 - 1 - i];
    }
}

/* sinusoidal embeddings of timesteps: dst (dim, n) from src0 (n) */
void gr_k_timestep_embedding(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    const int dim = n->op_params[0], max_period = n->op_params[1], half = dim / 2;
    for (int64_t i = 0; i < s->ne[0]; i++) {
        float *e = (float *)(d->data + i * d->nb[1]);
        float t;
        memcpy(&t, s->data + i * s->nb[0], 4);
        for (int64_t j = job->ith; j < half; j += job->nth) {
            const float freq = expf(-logf((float)max_period) * j / half);
            const float arg = t * freq;
            e[j] = cosf(arg);
            e[j + half] = sinf(arg);
        }
        if (dim % 2 != 0 && job->ith == 0) e[2 * half] = 0.0f;
    }
}

/* ---- Segment Anything's windowed attention helpers ---------------------------------- */

/* sub 0 WIN_PART: src0 (C, W, H) -> dst (C, w, w, npx*npy), windows of w x w
 *   positions, zero past the edges; op_params npx, npy, w.
 * sub 1 WIN_UNPART: src0 (C, w, w, >= windows) -> dst (C, W, H); op_params w.
 * Both contiguous F32; threads split dst rows (C floats each). */
void gr_k_win_part(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    const int64_t C = d->ne[0], row = C * 4;
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i1, i2, i3;
        gr_row_index(d, ir, &i1, &i2, &i3);
        char *out = d->data + ir * row;
        if (n->sub == GR_V_WIN_PART_WIN_PART) {
            const int64_t npx = n->op_params[0], w = n->op_params[2];
            const int64_t y = (i3 / npx) * w + i2, x = (i3 % npx) * w + i1;
            if (y >= s->ne[2] || x >= s->ne[1]) memset(out, 0, (size_t)row);
            else memcpy(out, s->data + (y * s->ne[1] + x) * row, (size_t)row);
        } else {
            const int64_t w = n->op_params[0], npx = (d->ne[1] + w - 1) / w;
            const int64_t win = (i2 / w) * npx + i1 / w;
            memcpy(out, s->data + ((win * s->ne[2] + i2 % w) * s->ne[1] + i1 % w) * row, (size_t)row);
        }
    }
}

/* Relative position table: dst[i2][i1] = src0 row (ne1 - 1 - i1 + i2), 16-bit
 * values copied as they are. src0 (C, 2*ne1 - 1) and dst (C, ne1, ne1) contiguous. */
void gr_k_get_rel_pos(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    const int64_t w = d->ne[1], row = d->ne[0] * 2;
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t i1 = ir % w, i2 = ir / w;
        memcpy(d->data + ir * row, s->data + (w - i1 - 1 + i2) * row, (size_t)row);
    }
}

/* dst = src0 (phase 0, unless in place), then for every row p of the position
 * terms pw, ph (W, H, heads...) the (W, W) block p of dst gets ph[p][a] added to
 * its row a and pw[p][b] to its column b, in ggml's order (the term whose index
 * comes first in ggml's loop is added first). All contiguous F32; threads split
 * the blocks in phase 1. */
void gr_k_add_rel_pos(gr_job *job, int phase) {
    GR_NODE_LOCALS(job);
    if (phase == 0) {
        if (d->data != s->data) {
            const int64_t total = gr_nelements(d) * 4;
            int64_t b0, b1;
            gr_range(total, job->ith, job->nth, &b0, &b1);
            memcpy(d->data + b0, s->data + b0, (size_t)(b1 - b0));
        }
        return;
    }
    const float *pw = (const float *)n->src[1].data, *ph = (const float *)n->src[2].data;
    const int64_t W = n->src[1].ne[0], rows = gr_nelements(&n->src[1]) / W;
    float *out = (float *)d->data;
    int64_t r0, r1;
    gr_range(rows, job->ith, job->nth, &r0, &r1);
    for (int64_t p = r0; p < r1; p++) {
        float *blk = out + p * W * W;
        for (int64_t a = 0; a < W; a++)
            for (int64_t b = 0; b < W; b++) {
                const float h = ph[p * W + a], v = pw[p * W + b];
                float *e = &blk[a * W + b];
                if (a <= b) *e = (*e + h) + v;
                else *e = (*e + v) + h;
            }
    }
}
