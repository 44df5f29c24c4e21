/* Convolutions done directly (CONV_2D, CONV_3D, CONV_2D_DW, CONV_TRANSPOSE_1D/2D)
 * and the unfold/fold helpers around them (IM2COL_3D, COL2IM_1D, IM2COL_BACK,
 * POOL_2D_BACK). Same conventions as every ops file: the planner checked types,
 * shapes and layouts, kernels stay inside each tensor's ne/nb, and every sum
 * follows ggml's CPU backend (ops.cpp) term for term.
 */
#include "common/checked.h"
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu/job.h"
#include "cpu/kernels.h"

static inline float ld_f(int32_t type, const char *p) {
    if (type == GR_TYPE_F16) {
        uint16_t h;
        memcpy(&h, p, 2);
        return gr_fp16_to_fp32(h);
    }
    if (type == GR_TYPE_BF16) {
        uint16_t h;
        memcpy(&h, p, 2);
        return gr_bf16_to_fp32(h);
    }
    float f;
    memcpy(&f, p, 4);
    return f;
}

static inline void st_f(int32_t type, char *p, float v) {
    if (type == GR_TYPE_F16) {
        const uint16_t h = gr_fp32_to_fp16(v);
        memcpy(p, &h, 2);
    } else if (type == GR_TYPE_BF16) {
        const uint16_t h = gr_fp32_to_bf16(v);
        memcpy(p, &h, 2);
    } else {
        memcpy(p, &v, 4);
    }
}

/* ---- CONV_2D / CONV_3D ------------------------------------------------------------ */

/* The geometry of a direct convolution, 2-D seen as 3-D with depth 1. */
typedef struct {
    int64_t KW, KH, KD, C, OC, N, W, H, D, OW, OH, OD;
    int64_t s[3], p[3], dl[3];
    int64_t sn[5], dn[5];   /* byte strides: x, y, z, channel, batch (src) / out channel (dst) */
} conv_geom;

static conv_geom conv_geometry(const gr_node *n) {
    const gr_tensor *k = &n->src[0], *x = &n->src[1], *d = &n->dst;
    conv_geom g;
    const int three = n->sub == GR_V_CONV_CONV_3D;
    g.KW = k->ne[0]; g.KH = k->ne[1];
    g.W = x->ne[0]; g.H = x->ne[1];
    g.OW = d->ne[0]; g.OH = d->ne[1];
    if (three) {
        const int32_t *op = n->op_params;
        g.KD = k->ne[2]; g.D = x->ne[2]; g.OD = d->ne[2];
        g.C = op[9]; g.N = op[10]; g.OC = op[11];
        for (int i = 0; i < 3; i++) { g.s[i] = op[i]; g.p[i] = op[3 + i]; g.dl[i] = op[6 + i]; }
        const int64_t sn[5] = { x->nb[0], x->nb[1], x->nb[2], x->nb[3], g.C * x->nb[3] };
        const int64_t dn[5] = { d->nb[0], d->nb[1], d->nb[2], d->nb[3], g.OC * d->nb[3] };
        memcpy(g.sn, sn, sizeof sn);
        memcpy(g.dn, dn, sizeof dn);
    } else {
        const int32_t *op = n->op_params;
        g.KD = 1; g.D = 1; g.OD = 1;
        g.C = x->ne[2]; g.N = x->ne[3]; g.OC = k->ne[3];
        g.s[0] = op[0]; g.s[1] = op[1]; g.p[0] = op[2]; g.p[1] = op[3]; g.dl[0] = op[4]; g.dl[1] = op[5];
        g.s[2] = 1; g.p[2] = 0; g.dl[2] = 1;
        const int64_t sn[5] = { x->nb[0], x->nb[1], 0, x->nb[2], x->nb[3] };
        const int64_t dn[5] = { d->nb[0], d->nb[1], 0, d->nb[2], d->nb[3] };
        memcpy(g.sn, sn, sizeof sn);
        memcpy(g.dn, dn, sizeof dn);
    }
    return g;
}

/* One patch (the kernel's window at output position p) as a row of the kernel
 * type, in the kernel's element order (channel, z, y, x). */
static void conv_patch(const conv_geom *g, const char *src, int64_t p, int32_t type, char *row) {
    const int64_t plane = g->OW * g->OH, vol = plane * g->OD;
    const int64_t b = p / vol, r = p % vol;
    const int64_t oz = r / plane, oy = (r % plane) / g->OW, ox = r % g->OW;
    const size_t ts = type == GR_TYPE_F32 ? 4 : 2;
    int64_t e = 0;
    for (int64_t c = 0; c < g->C; c++)
        for (int64_t kz = 0; kz < g->KD; kz++)
            for (int64_t ky = 0; ky < g->KH; ky++)
                for (int64_t kx = 0; kx < g->KW; kx++, e++) {
                    const int64_t sz = oz * g->s[2] + kz * g->dl[2] - g->p[2];
                    const int64_t sy = oy * g->s[1] + ky * g->dl[1] - g->p[1];
                    const int64_t sx = ox * g->s[0] + kx * g->dl[0] - g->p[0];
                    float v = 0.0f;
                    if (sz >= 0 && sz < g->D && sy >= 0 && sy < g->H && sx >= 0 && sx < g->W)
                        memcpy(&v, src + sx * g->sn[0] + sy * g->sn[1] + sz * g->sn[2] + c * g->sn[3] + b * g->sn[4], 4);
                    st_f(type, row + (size_t)e * ts, v);
                }
}

static inline float *conv_out(const conv_geom *g, char *dst, int64_t p, int64_t oc) {
    const int64_t plane = g->OW * g->OH, vol = plane * g->OD;
    const int64_t b = p / vol, r = p % vol;
    const int64_t oz = r / plane, oy = (r % plane) / g->OW, ox = r % g->OW;
    return (float *)(dst + ox * g->dn[0] + oy * g->dn[1] + oz * g->dn[2] + oc * g->dn[3] + b * g->dn[4]);
}

/* ggml unfolds patches in batches and multiplies each batch with its matrix
 * product, whose summation order depends on the batch having two patches or
 * more (iparams[1]: the product's GEMM order applies at all). Every
 * output is one dot product of a patch with a kernel row, so threads take runs
 * of patches, unfold a tile's worth (gr_vec.tile_cols) at a time into their
 * scratch and write the outputs
 * straight to dst, each patch with the order its ggml batch would give it.
 *   src0: kernel (KW, KH, C, OC) / (KW, KH, KD, C*OC) F32/F16 contiguous
 *   src1: input (W, H, C, N) / (W, H, D, C*N) F32; dst F32 */
void gr_k_conv(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const conv_geom g = conv_geometry(n);
    const int32_t type = n->src[0].type;
    const int f16 = type == GR_TYPE_F16;
    const size_t ts = f16 ? 2 : 4;
    const int64_t K = g.KW * g.KH * g.KD * g.C;
    const int64_t total = g.OW * g.OH * g.OD * g.N;
    /* ggml's batch: as many patches and their outputs as its work buffer holds,
     * 16 MiB plus a cache line per thread when the convolution needs the most */
    const int64_t space = K * (int64_t)ts + g.OC * 4;
    int64_t ppb = ((int64_t)(16 << 20) + 64 * job->nth) / space;
    if (ppb > 8) ppb = ppb / 8 * 8;
    if (ppb < 1) ppb = 1;
    const int gemm = (int)n->iparams[1];
    char *rows = (char *)gr_thread_f32(job, (K * GR_TILE_COLS_MAX * (int64_t)ts + 3) / 4);
    const char *knl = n->src[0].data;
    int64_t p0, p1;
    gr_range(total, job->ith, job->nth, &p0, &p1);
    const int TC = gr_vec.tile_cols;
    for (int64_t p = p0; p < p1; p += TC) {
        const int64_t np = p1 - p < TC ? p1 - p : TC;
        int ord[GR_TILE_COLS_MAX], all = np == TC;
        for (int64_t j = 0; j < np; j++) {
            const int64_t q = p + j, start = q / ppb * ppb;
            const int64_t in_batch = total - start < ppb ? total - start : ppb;
            ord[j] = gemm && in_batch >= 2;
            all = all && ord[j];
            conv_patch(&g, n->src[1].data, q, type, rows + (size_t)j * (size_t)K * ts);
        }
        if (all) {   /* TC patches in ggml's GEMM order: one tile per four output channels */
            const char *act[GR_TILE_COLS_MAX];
            for (int j = 0; j < TC; j++) act[j] = rows + (size_t)j * (size_t)K * ts;
            for (int64_t oc = 0; oc < g.OC; oc += 4) {
                const char *w[4];
                for (int i = 0; i < 4; i++) w[i] = knl + (size_t)(oc + i < g.OC ? oc + i : oc) * (size_t)K * ts;
                float t[4 * GR_TILE_COLS_MAX];
                if (f16) gr_vec.tile_f16_gemm(K, (const uint16_t *const *)w, (const uint16_t *const *)act, t);
                else gr_vec.tile_f32_gemm(K, (const float *const *)w, (const float *const *)act, t);
                for (int64_t j = 0; j < TC; j++)
                    for (int i = 0; i < 4 && oc + i < g.OC; i++) *conv_out(&g, n->dst.data, p + j, oc + i) = t[j * 4 + i];
            }
            continue;
        }
        for (int64_t j = 0; j < np; j++) {
            const char *a = rows + (size_t)j * (size_t)K * ts;
            for (int64_t oc = 0; oc < g.OC; oc++) {
                const char *w = knl + (size_t)oc * (size_t)K * ts;
                float v;
                if (f16) v = (ord[j] ? gr_vec.dot_f16_gemm : gr_vec.dot_f16)(K, (const uint16_t *)w, (const uint16_t *)a);
                else v = (ord[j] ? gr_vec.dot_f32_gemm : gr_vec.dot_f32)(K, (const float *)w, (const float *)a);
                *conv_out(&g, n->dst.data, p + j, oc) = v;
            }
        }
    }
}

size_t gr_ws_conv(const gr_node *n, int nth) {
    const gr_tensor *k = &n->src[0];
    const int64_t K = gr_nelements(k) / (n->sub == GR_V_CONV_CONV_3D ? n->op_params[11] : k->ne[3]);
    const size_t ts = k->type == GR_TYPE_F16 ? 2 : 4;
    return gr_sz_mul(gr_sz(nth), gr_sz_add(gr_sz_mul3(gr_sz(K), GR_TILE_COLS_MAX, ts), 16 * 4 + 4));
}

/* ---- CONV_2D_DW ------------------------------------------------------------------ */

/* Depthwise: out(x, y, c, b) = sum over the window of k(kx, ky, c) * in(...), one
 * fused multiply-add per term in (ky, kx) order, terms outside the input left
 * out. Strides cover both of ggml's layouts (WHCN and channels innermost).
 *   src0: kernel (KW, KH, 1, C) F32/F16; src1: (W, H, C, N) F32; dst (OW, OH, C, N) F32 */
void gr_k_conv_2d_dw(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *k = &n->src[0], *x = &n->src[1], *d = &n->dst;
    const int32_t *op = n->op_params;
    const int64_t KW = k->ne[0], KH = k->ne[1], W = x->ne[0], H = x->ne[1];
    const int64_t OW = d->ne[0], OH = d->ne[1], C = d->ne[2];
    int64_t r0, r1;
    gr_range(OH * C * d->ne[3], job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t oy = ir % OH, c = (ir / OH) % C, b = ir / (OH * C);
        for (int64_t ox = 0; ox < OW; ox++) {
            float sum = 0.0f;
            for (int64_t ky = 0; ky < KH; ky++) {
                const int64_t sy = oy * op[1] + ky * op[5] - op[3];
                if (sy < 0 || sy >= H) continue;
                for (int64_t kx = 0; kx < KW; kx++) {
                    const int64_t sx = ox * op[0] + kx * op[4] - op[2];
                    if (sx < 0 || sx >= W) continue;
                    float xv;
                    memcpy(&xv, gr_at(x, sx, sy, c, b), 4);
                    sum = fmaf(ld_f(k->type, gr_at(k, kx, ky, 0, c)), xv, sum);
                }
            }
            memcpy(gr_at(d, ox, oy, c, b), &sum, 4);
        }
    }
}

/* ---- CONV_TRANSPOSE_1D / CONV_TRANSPOSE_2D --------------------------------------- */

/* ggml first lays the kernel out with input channels innermost and the input
 * with channels innermost (rounded to F16 for an F16 kernel) in the scratch
 * (phase 0), then scatters one dot product over the input channels per
 * (input position, kernel tap) into dst, in its loop order (phase 1).
 * 1-D: src0 kernel (K, Cout, Cin) F32/F16, src1 (L, Cin) F32, dst (L', Cout) F32;
 * 2-D: src0 kernel (KW, KH, Cout, Cin), src1 (W, H, Cin, N), dst (W', H', Cout, N).
 * op_params[0]: the stride. dst contiguous. */
void gr_k_conv_transpose(gr_job *job, int phase) {
    const gr_node *n = job->node;
    const gr_tensor *k = &n->src[0], *x = &n->src[1], *d = &n->dst;
    const int two = n->sub == GR_V_CONV_TRANSPOSE_CONV_TRANSPOSE_2D;
    const int f16 = k->type == GR_TYPE_F16;
    const size_t ts = f16 ? 2 : 4;
    /* kernel taps (KW x KH), output channels, input channels */
    const int64_t KW = k->ne[0], KH = two ? k->ne[1] : 1;
    const int64_t Cout = two ? k->ne[2] : k->ne[1], Cin = two ? k->ne[3] : k->ne[2];
    const int64_t W = x->ne[0], H = two ? x->ne[1] : 1, N = two ? x->ne[3] : 1;
    const int64_t nk = KW * KH * Cout * Cin;
    char *wk = job->wdata, *wx = job->wdata + (size_t)nk * ts;
    const int64_t stride = n->op_params[0];
    if (phase == 0) {
        int64_t r0, r1;
        gr_range(Cout * Cin, job->ith, job->nth, &r0, &r1);
        for (int64_t ir = r0; ir < r1; ir++) {   /* (o, i) -> wk[o][ky][kx][i] */
            const int64_t o = ir % Cout, i = ir / Cout;
            for (int64_t ky = 0; ky < KH; ky++)
                for (int64_t kx = 0; kx < KW; kx++) {
                    const char *s = two ? gr_at(k, kx, ky, o, i) : gr_at(k, kx, o, i, 0);
                    memcpy(wk + (size_t)(((o * KH + ky) * KW + kx) * Cin + i) * ts, s, ts);
                }
        }
        gr_range(Cin * N, job->ith, job->nth, &r0, &r1);
        for (int64_t ir = r0; ir < r1; ir++) {   /* (i, b) -> wx[b][y][x][i] */
            const int64_t i = ir % Cin, b = ir / Cin;
            for (int64_t y = 0; y < H; y++)
                for (int64_t xx = 0; xx < W; xx++) {
                    float v;
                    memcpy(&v, two ? gr_at(x, xx, y, i, b) : gr_at(x, xx, i, 0, 0), 4);
                    st_f(k->type, wx + (size_t)(((b * H + y) * W + xx) * Cin + i) * ts, v);
                }
        }
        return;
    }
    const int64_t OW = d->ne[0];
    int64_t r0, r1;
    gr_range(Cout, job->ith, job->nth, &r0, &r1);
    for (int64_t o = r0; o < r1; o++)
        for (int64_t b = 0; b < N; b++) {
            float *out = (float *)(two ? gr_at(d, 0, 0, o, b) : gr_at(d, 0, o, 0, 0));
            memset(out, 0, (size_t)(OW * (two ? d->ne[1] : 1)) * 4);
            for (int64_t y = 0; y < H; y++)
                for (int64_t xx = 0; xx < W; xx++) {
                    const char *a = wx + (size_t)(((b * H + y) * W + xx) * Cin) * ts;
                    for (int64_t ky = 0; ky < KH; ky++)
                        for (int64_t kx = 0; kx < KW; kx++) {
                            const char *w = wk + (size_t)(((o * KH + ky) * KW + kx) * Cin) * ts;
                            const float v = f16 ? gr_vec.dot_f16(Cin, (const uint16_t *)a, (const uint16_t *)w)
                                                : gr_vec.dot_f32(Cin, (const float *)a, (const float *)w);
                            out[(y * stride + ky) * OW + xx * stride + kx] += v;
                        }
                }
        }
}

size_t gr_ws_conv_transpose(const gr_node *n, int nth) {
    (void)nth;
    const size_t ts = n->src[0].type == GR_TYPE_F16 ? 2 : 4;
    return gr_sz_add(gr_sz_mul(gr_sz_add(gr_sz(gr_nelements(&n->src[0])), gr_sz(gr_nelements(&n->src[1]))), ts), 64);
}

/* ---- IM2COL_3D, COL2IM_1D, IM2COL_BACK, POOL_2D_BACK ------------------------------- */

/* src1 (IW, IH, ID, IC*N) F32 -> dst (IC*KD*KH*KW, OW, OH, OD*N) F32/F16 contiguous;
 * src0 (the kernel) gives KW, KH, KD; op_params s0..2, p0..2, d0..2, IC */
void gr_k_im2col_3d(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *k = &n->src[0], *x = &n->src[1], *d = &n->dst;
    const int32_t *op = n->op_params;
    const int64_t IC = op[9], KW = k->ne[0], KH = k->ne[1], KD = k->ne[2];
    const int64_t IW = x->ne[0], IH = x->ne[1], ID = x->ne[2], N = x->ne[3] / IC;
    const int64_t OW = d->ne[1], OH = d->ne[2], OD = d->ne[3] / N;
    const size_t ts = d->type == GR_TYPE_F16 ? 2 : 4;
    const int64_t row = IC * KD * KH * KW;
    int64_t r0, r1;
    gr_range(OW * OH * OD * N, job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t ow = ir % OW, oh = (ir / OW) % OH, od = (ir / (OW * OH)) % OD, b = ir / (OW * OH * OD);
        char *out = d->data + (size_t)ir * (size_t)row * ts;
        int64_t e = 0;
        for (int64_t c = 0; c < IC; c++)
            for (int64_t kd = 0; kd < KD; kd++)
                for (int64_t kh = 0; kh < KH; kh++)
                    for (int64_t kw = 0; kw < KW; kw++, e++) {
                        const int64_t iw = ow * op[0] + kw * op[6] - op[3];
                        const int64_t ih = oh * op[1] + kh * op[7] - op[4];
                        const int64_t id = od * op[2] + kd * op[8] - op[5];
                        float v = 0.0f;
                        if (id >= 0 && id < ID && ih >= 0 && ih < IH && iw >= 0 && iw < IW)
                            memcpy(&v, gr_at(x, iw, ih, id, b * IC + c), 4);
                        st_f(d->type, out + (size_t)e * ts, v);
                    }
    }
}

/* Overlap-add of columns: src0 (K*OC, T_in) -> dst (T_out, OC), same type
 * (F32/F16/BF16), both contiguous; sums in F32 in order of t_in.
 * op_params: s0, OC, p0 (the crop at each end) */
void gr_k_col2im_1d(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    const int64_t s0 = n->op_params[0], OC = n->op_params[1], p0 = n->op_params[2];
    const int64_t KOC = s->ne[0], T_in = s->ne[1], K = KOC / OC, T_out = d->ne[0];
    const size_t ts = s->type == GR_TYPE_F32 ? 4 : 2;
    int64_t t0, t1;
    gr_range(T_out, job->ith, job->nth, &t0, &t1);
    for (int64_t oc = 0; oc < OC; oc++)
        for (int64_t t = t0; t < t1; t++) {
            const int64_t ta = t + p0;
            int64_t lo = (ta - K + 1 + s0 - 1) / s0, hi = ta / s0;
            if (lo < 0) lo = 0;
            if (hi >= T_in) hi = T_in - 1;
            float sum = 0.0f;
            for (int64_t ti = lo; ti <= hi; ti++) {
                const int64_t kk = ta - ti * s0;
                if (kk >= 0 && kk < K) sum += ld_f(s->type, s->data + (size_t)(oc * K + kk + ti * KOC) * ts);
            }
            st_f(d->type, d->data + (size_t)(t + oc * T_out) * ts, sum);
        }
}

/* Gradient of IM2COL: every input position sums the patch entries that copied
 * it, in kernel-tap order. src0 (IC*KH*KW, OW, OH, N) F32 contiguous (1-D: OH = 1,
 * N in dim 2); src1 the kernel (only KW, KH); dst (IW, IH, IC, N) F32 contiguous
 * (1-D: (IW, IC, N)). op_params s0, s1, p0, p1, d0, d1, is_2D */
void gr_k_im2col_back(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *g = &n->src[0], *k = &n->src[1], *d = &n->dst;
    const int32_t *op = n->op_params;
    const int two = op[6] == 1;
    const int64_t N = two ? d->ne[3] : d->ne[2], IC = two ? d->ne[2] : d->ne[1];
    const int64_t IH = two ? d->ne[1] : 1, IW = d->ne[0];
    const int64_t KH = two ? k->ne[1] : 1, KW = k->ne[0];
    const int64_t OH = two ? g->ne[2] : 1, OW = g->ne[1];
    const float *gd = (const float *)g->data;
    float *out = (float *)d->data;
    int64_t r0, r1;
    gr_range(N * IC, job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t c = ir % IC, b = ir / IC;
        for (int64_t ih = 0; ih < IH; ih++)
            for (int64_t iw = 0; iw < IW; iw++) {
                float sum = 0.0f;
                for (int64_t kh = 0; kh < KH; kh++)
                    for (int64_t kw = 0; kw < KW; kw++) {
                        const int64_t tw = iw + op[2] - kw * op[4];
                        if (tw % op[0] != 0) continue;
                        const int64_t ow = tw / op[0];
                        int64_t oh = 0;
                        if (two) {
                            const int64_t th = ih + op[3] - kh * op[5];
                            if (th % op[1] != 0) continue;
                            oh = th / op[1];
                        }
                        if (ow < 0 || ow >= OW || oh < 0 || oh >= OH) continue;
                        sum += gd[(b * OH * OW + oh * OW + ow) * (IC * KH * KW) + c * KH * KW + kh * KW + kw];
                    }
                out[(b * IC + c) * IH * IW + ih * IW + iw] = sum;
            }
    }
}

/* Gradient of POOL_2D: each pooled gradient goes to the input that won the max
 * (the first, in window order) or is spread over the window (average), planes
 * independent. src0 (OW, OH, planes) F32, src1 the forward input and dst
 * (IW, IH, planes), all contiguous F32. op_params: op, k0, k1, s0, s1, p0, p1 */
void gr_k_pool_2d_back(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *g = &n->src[0], *f = &n->src[1], *d = &n->dst;
    const int32_t *op = n->op_params;
    const int k0 = op[1], k1 = op[2], s0 = op[3], s1 = op[4], p0 = op[5], p1 = op[6];
    const int64_t px = g->ne[0], py = g->ne[1], IW = d->ne[0], IH = d->ne[1];
    int64_t r0, r1;
    gr_range(d->ne[2] * d->ne[3], job->ith, job->nth, &r0, &r1);
    for (int64_t pl = r0; pl < r1; pl++) {
        const float *gp = (const float *)g->data + pl * px * py;
        const float *fp = (const float *)f->data + pl * IW * IH;
        float *dp = (float *)d->data + pl * IW * IH;
        memset(dp, 0, (size_t)(IW * IH) * 4);
        for (int64_t oy = 0; oy < py; oy++)
            for (int64_t ox = 0; ox < px; ox++) {
                const float grad0 = gp[oy * px + ox];
                const int64_t ix = ox * s0 - p0, iy = oy * s1 - p1;
                if (op[0] == 0) {   /* max */
                    float maxval = -FLT_MAX;
                    int64_t bx = -1, by = -1;
                    for (int64_t ky = 0; ky < k1; ky++) {
                        if (iy + ky < 0 || iy + ky >= IH) continue;
                        for (int64_t kx = 0; kx < k0; kx++) {
                            const int64_t j = ix + kx;
                            if (j < 0 || j >= IW) continue;
                            const float v = fp[(iy + ky) * IW + j];
                            if (v <= maxval) continue;
                            maxval = v;
                            bx = kx;
                            by = ky;
                        }
                    }
                    if (bx == -1 || by == -1) continue;
                    dp[(iy + by) * IW + ix + bx] += grad0;
                } else {
                    const float grad = grad0 / (float)(k0 * k1);
                    for (int64_t ky = 0; ky < k1; ky++) {
                        if (iy + ky < 0 || iy + ky >= IH) continue;
                        for (int64_t kx = 0; kx < k0; kx++) {
                            const int64_t j = ix + kx;
                            if (j < 0 || j >= IW) continue;
                            dp[(iy + ky) * IW + j] += grad;
                        }
                    }
                }
            }
    }
}

