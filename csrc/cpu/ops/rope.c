/* Rotary position embeddings: ROPE and its backward (all ggml modes).
 * Same conventions as every ops file: the planner (ggmlrpc/compute/) checked types
 * and shapes, a kernel only walks each tensor inside its own ne/nb, rows are split
 * between threads with gr_range(), and arithmetic follows ggml's CPU backend
 * (ops.cpp, vec.h): the same rounding points and the same fused multiply-adds
 * where ggml's x86 build fuses.
 */
#include "common/checked.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu/job.h"
#include "cpu/kernels.h"

/* ---- ROPE ---------------------------------------------------------------------- */

static float rope_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return n_dims * logf(n_ctx_orig / (n_rot * 2 * (float)M_PI)) / (2 * logf(base));
}

static inline void rope_yarn(float theta_extrap, float freq_scale, const float corr[2], int64_t i0,
                             float ext_factor, float mscale, float *c, float *s) {
    const float theta_interp = freq_scale * theta_extrap;
    float theta = theta_interp;
    if (ext_factor != 0.0f) {
        const float y = (i0 / 2 - corr[0]) / fmaxf(0.001f, corr[1] - corr[0]);
        const float ramp_mix = (1 - fminf(1, fmaxf(0, y))) * ext_factor;
        theta = fmaf(theta_interp, 1 - ramp_mix, theta_extrap * ramp_mix);
        mscale *= fmaf(0.1f, logf(1.0f / freq_scale), 1.0f);
    }
    *c = cosf(theta) * mscale;
    *s = sinf(theta) * mscale;
}

enum { ROPE_NEOX = 2, ROPE_MROPE = 8, ROPE_VISION = 24, ROPE_IMROPE = 40 };

/* cos/sin pairs for one position (or four, for multi-section rope) */
static void rope_cache(const gr_node *n, const float *pos4, float freq_scale, const float *ff,
                       const float corr[2], int64_t ne0, float ext_factor, float attn_factor,
                       float theta_scale, float *cache) {
    const int mode = n->op_params[2];
    const int *sections = &n->op_params[11];
    if (!(mode & ROPE_MROPE)) {
        float theta = pos4[0];
        for (int64_t i0 = 0; i0 < ne0; i0 += 2) {
            const float f = ff ? ff[i0 / 2] : 1.0f;
            rope_yarn(theta / f, freq_scale, corr, i0, ext_factor, attn_factor, &cache[i0], &cache[i0 + 1]);
            theta *= theta_scale;
        }
        return;
    }
    const int is_imrope = mode == ROPE_IMROPE, indep = mode == ROPE_VISION;
    float tt = pos4[0], th = pos4[1], tw = pos4[2], te = pos4[3];
    const int sect_dims = sections[0] + sections[1] + sections[2] + sections[3];
    const int sec_w = sections[1] + sections[0];
    const int sec_e = sections[2] + sec_w;
    for (int64_t i0 = 0; i0 < ne0; i0 += 2) {
        const float f = ff ? ff[i0 / 2] : 1.0f;
        const int sector = (int)((i0 / 2) % sect_dims);
        if (indep) {
            if (sector == 0) tt = pos4[0];
            else if (sector == sections[0]) th = pos4[1];
            else if (sector == sec_w) tw = pos4[2];
            else if (sector == sec_e) te = pos4[3];
        }
        float theta = tt;
        if (is_imrope) {
            if (sector % 3 == 1 && sector < 3 * sections[1]) theta = th;
            else if (sector % 3 == 2 && sector < 3 * sections[2]) theta = tw;
            else if (sector % 3 == 0 && sector < 3 * sections[0]) theta = tt;
            else theta = te;
        } else {
            if (sector >= sections[0] && sector < sec_w) theta = th;
            else if (sector >= sec_w && sector < sec_w + sections[2]) theta = tw;
            else if (sector >= sec_w + sections[2]) theta = te;
        }
        rope_yarn(theta / f, freq_scale, corr, i0, ext_factor, attn_factor, &cache[i0], &cache[i0 + 1]);
        tt *= theta_scale;
        tw *= theta_scale;
        th *= theta_scale;
        te *= theta_scale;
    }
}

/* Rotary embedding (sub: 0 forward, 1 backward = rotate by -theta).
 *   src0, dst: (ne0, heads, tokens, ne3) F32/F16; src1: positions (tokens [x4 for mrope]) I32;
 *   src2: frequency factors (>= n_dims/2) F32 or absent */
void gr_k_rope(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    const int32_t *pos = (const int32_t *)n->src[1].data;
    const float *ff = n->n_src > 2 && n->src[2].data ? (const float *)n->src[2].data : NULL;
    const int n_dims = n->op_params[1], mode = n->op_params[2], n_ctx_orig = n->op_params[4];
    const int n_offs = n->op_params[15];
    float freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow;
    memcpy(&freq_base, &n->op_params[5], 4);
    memcpy(&freq_scale, &n->op_params[6], 4);
    memcpy(&ext_factor, &n->op_params[7], 4);
    memcpy(&attn_factor, &n->op_params[8], 4);
    memcpy(&beta_fast, &n->op_params[9], 4);
    memcpy(&beta_slow, &n->op_params[10], 4);
    const float sin_sign = n->sub != GR_V_ROPE_ROPE ? -1.0f : 1.0f;
    const int64_t ne0 = d->ne[0], ne1 = d->ne[1], ne2 = d->ne[2];
    const int64_t esz = s->type == GR_TYPE_F32 ? 4 : 2;
    const float theta_scale = powf(freq_base, -2.0f / n_dims);
    float corr[2];
    {
        const float start = floorf(rope_corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base));
        const float end = ceilf(rope_corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base));
        corr[0] = fmaxf(0.0f, start);
        corr[1] = fminf((float)(n_dims - 1), end);
    }
    const int mrope = (mode & ROPE_MROPE) != 0;
    const int vision = mode == ROPE_VISION;
    float *cache = gr_thread_f32(job, ne0);
    int64_t r0, r1;
    gr_range(gr_nrows(d), job->ith, job->nth, &r0, &r1);
    int64_t last_i2 = -1;
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t i1 = ir % ne1;
        const int64_t i2 = (ir / ne1) % ne2;
        const int64_t i3 = ir / (ne1 * ne2);
        if (i2 != last_i2) {
            float p4[4] = { (float)pos[i2], 0.0f, 0.0f, 0.0f };
            if (mrope) {
                p4[1] = (float)pos[i2 + ne2];
                p4[2] = (float)pos[i2 + 2 * ne2];
                p4[3] = (float)pos[i2 + 3 * ne2];
            }
            /* ggml fills the cache for all of ne0; only the rotated pairs are read,
             * and the angles are built in order, so stopping there changes nothing */
            const int64_t nc = vision ? ne0 : n_dims;
            rope_cache(n, p4, freq_scale, ff, corr, nc, ext_factor, attn_factor, theta_scale, cache);
            for (int64_t i0 = 1; i0 < nc; i0 += 2) cache[i0] *= sin_sign;
            last_i2 = i2;
        }
        const char *src = gr_at(s, 0, i1, i2, i3);
        char *dst = gr_at(d, 0, i1, i2, i3);
        if (vision) {
            gr_vec.rope_rotate(s->type, dst, src, (ne0 + 1) / 2, 1, n_dims, cache);
            continue;
        }
        const char *so = src + n_offs * esz;
        char *dof = dst + n_offs * esz;
        if (mode == 0) gr_vec.rope_rotate(s->type, dof, so, (n_dims + 1) / 2, 2, 1, cache);
        else gr_vec.rope_rotate(s->type, dof, so, (n_dims + 1) / 2, 1, n_dims / 2, cache);
        /* channels outside [n_offs, n_offs + n_dims) pass through */
        if (src != dst) {
            if (n_offs > 0) memmove(dst, src, (size_t)(n_offs * esz));
            if (n_offs + n_dims < ne0)
                memmove(dst + (n_offs + n_dims) * esz, src + (n_offs + n_dims) * esz,
                        (size_t)((ne0 - n_offs - n_dims) * esz));
        }
    }
}

/* a row of floats per thread (the rotation cache) */
size_t gr_ws_rope(const gr_node *n, int nth) {
    return gr_sz_mul3(gr_sz(nth), gr_sz_add(gr_sz(n->dst.ne[0]), 16), sizeof(float));
}
