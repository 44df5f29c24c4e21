/* FLASH_ATTN_EXT.
 *
 * FLASH_ATTN_EXT has ggml's two numerics: per query row with Q rounded to the
 * K type's vec_dot type and an F16 accumulator for F16 V (the "one chunk"
 * path), and, for 64 query rows or more with F32/F16 K and V, tiles of 64x64
 * computed in F32 (the "tiled" path). Rows are independent in both, so the
 * split between threads does not change any result.
 */
#include "common/checked.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu/job.h"
#include "common/rpc.h"
#include "cpu/kernels.h"
#include "cpu/simd.h"

/* ---- FLASH_ATTN_EXT ---------------------------------------------------------- */

#define FA_TQ 64   /* query rows per tile */
#define FA_TK 64   /* keys per tile */
#define FA_TG 4    /* query tiles of one head that share each key tile's conversion */

/* How many query tiles go together: FA_TG while their queries and VKQ take 4 MiB a
 * thread at most, else one, so that no head size needs more scratch than one tile
 * a thread did (a graph that ran before is never refused for its scratch). */
static inline int64_t fa_tiled_group(int64_t DK, int64_t DV) {
    return (DK + DV) * FA_TQ * FA_TG * (int64_t)sizeof(float) <= ((int64_t)4 << 20) ? FA_TG : 1;
}

/* per-thread floats of the tiled path: the group's queries and VKQ, one tile's KQ
 * and mask, a key tile's V and K transposed, one key row */
static inline int64_t fa_tiled_floats(int64_t DK, int64_t DV) {
    return fa_tiled_group(DK, DV) * FA_TQ * (DK + DV) + 2 * FA_TQ * FA_TK + FA_TK * DV + FA_TK * DK + DK;
}

/* node iparams: [0] vec_dot type of K, [1] path: GR_FA_ROWS, GR_FA_TILED or GR_FA_SPLIT */

/* per-thread floats of the row path: VKQ (DV), V or the F16 VKQ (DV), Q converted;
 * or of the heads path (fa_heads): VKQ (DV), then GR_FA_HEADS queries and VKQs in F16 */
static inline int64_t fa_row_floats(int64_t DK, int64_t DV) {
    const int64_t row = DK + 2 * DV + 16 + DK / 4, heads = DV + GR_FA_HEADS / 2 * (DK + DV) + 16;
    return row > heads ? row : heads;
}

size_t gr_ws_flash_attn(const gr_node *n, int nth) {
    const int64_t DK = n->src[1].ne[0], DV = n->src[2].ne[0];
    /* DK, DV < 2^32 (u32 on the wire): these per-thread counts fit in 64 bits */
    int64_t per;
    if (n->iparams[1] == GR_FA_TILED) per = fa_tiled_floats(DK, DV);
    else per = fa_row_floats(DK, DV);
    size_t total = gr_sz_mul3(gr_sz(nth), gr_sz(per + 16), sizeof(float));
    if (n->iparams[1] == GR_FA_SPLIT)   /* (M, S, VKQ) per head and chunk */
        total = gr_sz_add(total, gr_sz_mul(gr_sz_mul3(gr_sz(n->src[0].ne[2]), gr_sz(nth), gr_sz(2 + DV)), sizeof(float)));
    return total;
}

typedef struct {
    const gr_tensor *q, *k, *v, *mask, *sinks, *dst;
    int64_t DK, DV, rk2, rk3, rv2, rv3;
    float scale, max_bias, softcap;
} fa_ctx;

static void fa_setup(const gr_node *n, fa_ctx *c) {
    c->q = &n->src[0];
    c->k = &n->src[1];
    c->v = &n->src[2];
    c->mask = n->n_src > 3 && n->src[3].data ? &n->src[3] : NULL;
    c->sinks = n->n_src > 4 && n->src[4].data ? &n->src[4] : NULL;
    c->dst = &n->dst;
    c->DK = c->k->ne[0];
    c->DV = c->v->ne[0];
    c->rk2 = c->q->ne[2] / c->k->ne[2];
    c->rk3 = c->q->ne[3] / c->k->ne[3];
    c->rv2 = c->q->ne[2] / c->v->ne[2];
    c->rv3 = c->q->ne[3] / c->v->ne[3];
    memcpy(&c->scale, &n->op_params[0], 4);
    memcpy(&c->max_bias, &n->op_params[1], 4);
    memcpy(&c->softcap, &n->op_params[2], 4);
    if (c->softcap != 0.0f) c->scale /= c->softcap;
}

static inline float fa_slope(const fa_ctx *c, uint32_t h) {
    if (!(c->max_bias > 0.0f)) return 1.0f;
    const uint32_t n_head = (uint32_t)c->q->ne[2];
    const uint32_t n_head_log2 = 1u << (uint32_t)floor(log2((double)n_head));
    const float m0 = powf(2.0f, -(c->max_bias) / n_head_log2);
    const float m1 = powf(2.0f, -(c->max_bias / 2.0f) / n_head_log2);
    return h < n_head_log2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n_head_log2) + 1));
}

static inline const uint16_t *fa_mask_row(const fa_ctx *c, int64_t iq1, int64_t iq2, int64_t iq3) {
    if (!c->mask) return NULL;
    const gr_tensor *m = c->mask;
    return (const uint16_t *)(m->data + iq1 * m->nb[1] + (iq2 % m->ne[2]) * m->nb[2] + (iq3 % m->ne[3]) * m->nb[3]);
}

/* output row for query (iq1, head iq2, iq3): dst is (DV, heads, queries, ne3) */
static inline float *fa_out(const fa_ctx *c, int64_t iq1, int64_t iq2, int64_t iq3) {
    const gr_tensor *d = c->dst;
    return (float *)(d->data + iq2 * d->nb[1] + iq1 * d->nb[2] + iq3 * d->nb[3]);
}

/* fold head h's sink into the running (M, S, vkq) */
static void fa_sink(const fa_ctx *c, float *vkq, float *M, float *S, int64_t h) {
    float s;
    memcpy(&s, c->sinks->data + h * c->sinks->nb[0], 4);
    float ms = 1.0f, vs = 1.0f;
    if (s > *M) {
        ms = expf(*M - s);
        *M = s;
        for (int64_t d = 0; d < c->DV; d++) vkq[d] *= ms;
    } else {
        vs = expf(s - *M);
    }
    *S = fmaf(*S, ms, vs);
}

static void fa_finish(const fa_ctx *c, float *vkq, float M, float S, int64_t h, float *out) {
    if (c->sinks) fa_sink(c, vkq, &M, &S, h);
    const float S_inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int64_t d = 0; d < c->DV; d++) out[d] = vkq[d] * S_inv;
}

/* the first key and value rows of query row ir's head */
static inline void fa_kv_rows(const fa_ctx *c, int64_t ir, const char **k, const char **v) {
    const int64_t neq1 = c->q->ne[1], neq2 = c->q->ne[2];
    const int64_t iq3 = ir / (neq2 * neq1), iq2 = (ir - iq3 * neq2 * neq1) / neq1;
    *k = c->k->data + (iq2 / c->rk2) * c->k->nb[2] + (iq3 / c->rk3) * c->k->nb[3];
    *v = c->v->data + (iq2 / c->rv2) * c->v->nb[2] + (iq3 / c->rv3) * c->v->nb[3];
}

/* One key's online-softmax step on an F16 VKQ, with score s: the running maximum M
 * and sum S, VKQ scaled where the maximum moved, then the value row vd added */
static inline void fa_step_f16(int64_t DV, uint16_t *vkq, const uint16_t *vd, float s, float *M, float *S) {
    const float Mold = *M;
    float ms = 1.0f, vs = 1.0f;
    if (s > Mold) {
        *M = s;
        ms = expf(Mold - s);
        gr_vec.scale_f16(DV, vkq, ms);
    } else {
        vs = expf(s - Mold);
    }
    gr_vec.mad_f16(DV, vkq, vd, vs);
    *S = fmaf(*S, ms, vs);
}

/* One query row ir over keys [ic0, ic1) with an online softmax. With `partial`
 * the unnormalized (M, S, VKQ) go there (the split path), else the output row.
 * next >= 0: a row this thread takes later, the same query's next head, whose
 * key and value rows at this row's unmasked keys are prefetched on the way. A
 * head's rows lie a whole cache row (every head's) apart, and with several
 * sequences in the cache a query's keys are every few rows: no stride the hardware
 * prefetcher follows, so after the weights had pushed the cache out each key
 * waited on memory (measured: a decode step of two sequences' attention over a
 * cold cache, 3x the time over a warm one). */
static void fa_row(const gr_node *n, gr_job *job, const fa_ctx *c, int64_t ir, int64_t ic0, int64_t ic1,
                   float *partial, int64_t next) {
    const int64_t DK = c->DK, DV = c->DV;
    const int64_t neq1 = c->q->ne[1], neq2 = c->q->ne[2];
    const int32_t vdt = (int32_t)n->iparams[0];
    const int32_t kt = c->k->type, vt = c->v->type;
    float *VKQ32 = gr_thread_f32(job, fa_row_floats(DK, DV));
    float *V32 = VKQ32 + DV;
    uint16_t *VKQ16 = (uint16_t *)(VKQ32 + DV);
    void *Q_q = VKQ32 + 2 * DV;
    ggmlrpc_vec_dot_fn qdot = NULL;
    ggmlrpc_from_float_fn q_from = NULL;
    ggmlrpc_to_float_fn v_to_float = NULL;
    if (kt != GR_TYPE_F32 && kt != GR_TYPE_F16) {
        qdot = ggmlrpc_get_vec_dot((uint32_t)kt);
        q_from = ggmlrpc_get_from_float((uint32_t)vdt);
    }
    if (vt != GR_TYPE_F32 && vt != GR_TYPE_F16) v_to_float = ggmlrpc_get_to_float((uint32_t)vt);

    const int64_t iq3 = ir / (neq2 * neq1);
    const int64_t iq2 = (ir - iq3 * neq2 * neq1) / neq1;
    const int64_t iq1 = ir - iq3 * neq2 * neq1 - iq2 * neq1;
    const float slope = fa_slope(c, (uint32_t)iq2);
    float S = 0.0f, M = -INFINITY;
    if (vt == GR_TYPE_F16) memset(VKQ16, 0, (size_t)DV * 2);
    else memset(VKQ32, 0, (size_t)DV * 4);
    const uint16_t *mp = fa_mask_row(c, iq1, iq2, iq3);
    const int64_t ik2 = iq2 / c->rk2, ik3 = iq3 / c->rk3;
    const int64_t iv2 = iq2 / c->rv2, iv3 = iq3 / c->rv3;
    const float *pq = (const float *)(c->q->data + iq1 * c->q->nb[1] + iq2 * c->q->nb[2] + iq3 * c->q->nb[3]);
    if (vdt == GR_TYPE_F32) memcpy(Q_q, pq, (size_t)DK * 4);
    else if (vdt == GR_TYPE_F16) gr_vec.fp32_to_fp16(DK, pq, (uint16_t *)Q_q);
    else q_from(pq, Q_q, DK);

    const char *k_next = NULL, *v_next = NULL;
    size_t k_bytes = 0, v_bytes = 0;
    if (next >= 0) {
        fa_kv_rows(c, next, &k_next, &v_next);
        k_bytes = ggmlrpc_row_size((uint32_t)kt, DK), v_bytes = ggmlrpc_row_size((uint32_t)vt, DV);
    }
    int fast = 0;    /* the family's register-held loop, the same steps */
    if (kt == GR_TYPE_F16 && vt == GR_TYPE_F16 && vdt == GR_TYPE_F16 && c->softcap == 0.0f && gr_vec.fa_keys_f16) {
        const gr_fa_keys a = {.k = c->k->data + ik2 * c->k->nb[2] + ik3 * c->k->nb[3],
                              .v = c->v->data + iv2 * c->v->nb[2] + iv3 * c->v->nb[3],
                              .k_stride = (size_t)c->k->nb[1], .v_stride = (size_t)c->v->nb[1], .mask = mp,
                              .q = (const uint16_t *)Q_q, .k_next = k_next, .v_next = v_next,
                              .DK = DK, .DV = DV, .ic0 = ic0, .ic1 = ic1, .slope = slope, .scale = c->scale};
        fast = gr_vec.fa_keys_f16(&a, &M, &S, VKQ16);
    }
    const int inf_skips = mp && slope > 0.0f;
    for (int64_t ic = ic0; !fast && ic < ic1; ic++) {
        if (inf_skips && mp[ic] == GR_F16_NEG_INF) continue;
        const float mv = mp ? slope * gr_fp16_to_fp32(mp[ic]) : 0.0f;
        if (mv == -INFINITY) continue;
        if (k_next) {
            gr_prefetch_lines(k_next + ic * c->k->nb[1], k_bytes);
            gr_prefetch_lines(v_next + ic * c->v->nb[1], v_bytes);
        }
        const char *kd = c->k->data + ic * c->k->nb[1] + ik2 * c->k->nb[2] + ik3 * c->k->nb[3];
        float s;
        if (kt == GR_TYPE_F16) s = gr_vec.dot_f16(DK, (const uint16_t *)kd, (const uint16_t *)Q_q);
        else if (kt == GR_TYPE_F32) s = gr_vec.dot_f32(DK, (const float *)kd, (const float *)Q_q);
        else qdot(DK, &s, kd, Q_q);
        s = s * c->scale;
        if (c->softcap != 0.0f) s = c->softcap * tanhf(s);
        s += mv;
        const char *vd = c->v->data + ic * c->v->nb[1] + iv2 * c->v->nb[2] + iv3 * c->v->nb[3];
        if (vt == GR_TYPE_F16) {
            fa_step_f16(DV, VKQ16, (const uint16_t *)vd, s, &M, &S);
            continue;
        }
        const float Mold = M;
        float ms = 1.0f, vs = 1.0f;
        if (s > M) {
            M = s;
            ms = expf(Mold - M);
            for (int64_t d = 0; d < DV; d++) VKQ32[d] *= ms;
        } else {
            vs = expf(s - M);
        }
        if (vt == GR_TYPE_F32) {
            gr_vec.mad_f32(DV, VKQ32, (const float *)vd, vs);
        } else {
            v_to_float(vd, V32, DV);
            gr_vec.mad_f32(DV, VKQ32, V32, vs);
        }
        S = fmaf(S, ms, vs);
    }
    if (vt == GR_TYPE_F16) gr_vec.fp16_to_fp32(DV, VKQ16, VKQ32);
    if (!partial) {
        fa_finish(c, VKQ32, M, S, iq2, fa_out(c, iq1, iq2, iq3));
        return;
    }
    if (c->sinks && ic0 == 0) fa_sink(c, VKQ32, &M, &S, iq2);
    partial[0] = M;
    partial[1] = S;
    memcpy(partial + 2, VKQ32, (size_t)DV * 4);
}

/* Whether fa_heads may take the node's rows: F16 keys and values, F16 queries, no
 * soft-cap, a slope of 1 (no ALiBi) and one mask row for every head. */
static int fa_heads_ok(const gr_node *n, const fa_ctx *c) {
    return c->k->type == GR_TYPE_F16 && c->v->type == GR_TYPE_F16 &&
           n->iparams[0] == GR_TYPE_F16 && c->softcap == 0.0f && !(c->max_bias > 0.0f) &&
           (!c->mask || c->mask->ne[2] == 1);
}

#define FA_HEADS_CHUNK 32    /* keys whose scores go first in fa_heads_keys */

/* fa_heads' keys loop in any family: fa_row's steps for each head with the family's
 * primitives (dot_f16, scale_f16, mad_f16), the keys outer: a chunk's scores of every
 * head first (each key's row of all heads read once), then key by key each head's
 * running maximum, sum and VKQ. The same steps in the same order per head as fa_row,
 * so the same bits. */
static void fa_heads_keys(const gr_fa_heads *a, float *M, float *S, uint16_t *vkq) {
    const int64_t H = a->H, DK = a->DK, DV = a->DV;
    float sc[GR_FA_HEADS][FA_HEADS_CHUNK];
    int64_t at[FA_HEADS_CHUNK];
    const char *kh[GR_FA_HEADS], *vh[GR_FA_HEADS];
    for (int64_t h = 0; h < H; h++) {
        kh[h] = a->k + (size_t)((a->h0 + h) / a->rk) * a->k_head;
        vh[h] = a->v + (size_t)((a->h0 + h) / a->rv) * a->v_head;
    }
    for (int64_t ic = a->ic0; ic < a->ic1;) {
        int n = 0;
        for (; ic < a->ic1 && n < FA_HEADS_CHUNK; ic++) {
            if (a->mask && a->mask[ic] == GR_F16_NEG_INF) continue;
            const float mv = a->mask ? gr_fp16_to_fp32(a->mask[ic]) : 0.0f;
            if (mv == -INFINITY) continue;
            for (int64_t h = 0; h < H; h++) {
                float sk = gr_vec.dot_f16(DK, (const uint16_t *)(kh[h] + ic * a->k_stride), a->q + h * DK);
                sk = sk * a->scale;
                sk += mv;
                sc[h][n] = sk;
            }
            at[n++] = ic;
        }
        for (int t = 0; t < n; t++)
            for (int64_t h = 0; h < H; h++)
                fa_step_f16(DV, vkq + h * DV, (const uint16_t *)(vh[h] + at[t] * a->v_stride), sc[h][t], &M[h], &S[h]);
    }
}

/* fa_row for heads h0 .. h0 + H (H <= GR_FA_HEADS) of query row (iq1, iq3) at once,
 * over keys [ic0, ic1), through gr_vec.fa_heads_f16: the keys outer, so that each
 * key's row of every head is read once, in order. A head at a time, each key cost
 * a row's few lines a whole cache row apart, which no prefetcher follows (measured:
 * 40-60 ns a key and head once the weights had pushed the cache out, 19 warm).
 * The same steps for each head, so the same bits. With `partials` each head's
 * unnormalized (M, S, VKQ) goes to partials + h * pstride, else its output row.
 * Families without a fa_heads_f16 for these sizes take fa_heads_keys. */
static void fa_heads(gr_job *job, const fa_ctx *c, int64_t iq1, int64_t iq3, int64_t h0, int64_t H,
                    int64_t ic0, int64_t ic1, float *partials, int64_t pstride) {
    const int64_t DK = c->DK, DV = c->DV;
    float *VKQ32 = gr_thread_f32(job, fa_row_floats(DK, DV));
    uint16_t *Q16 = (uint16_t *)(VKQ32 + DV);
    uint16_t *VKQ16 = Q16 + GR_FA_HEADS * DK;
    float M[GR_FA_HEADS], S[GR_FA_HEADS];
    for (int64_t h = 0; h < H; h++) {
        const float *pq = (const float *)(c->q->data + iq1 * c->q->nb[1] + (h0 + h) * c->q->nb[2] +
                                          iq3 * c->q->nb[3]);
        gr_vec.fp32_to_fp16(DK, pq, Q16 + h * DK);
        M[h] = -INFINITY, S[h] = 0.0f;
    }
    memset(VKQ16, 0, (size_t)(H * DV) * 2);
    const gr_fa_heads a = {.k = c->k->data + (iq3 / c->rk3) * c->k->nb[3],
                           .v = c->v->data + (iq3 / c->rv3) * c->v->nb[3],
                           .k_stride = (size_t)c->k->nb[1], .v_stride = (size_t)c->v->nb[1],
                           .k_head = (size_t)c->k->nb[2], .v_head = (size_t)c->v->nb[2],
                           .h0 = h0, .H = H, .rk = c->rk2, .rv = c->rv2, .mask = fa_mask_row(c, iq1, 0, iq3),
                           .q = Q16, .DK = DK, .DV = DV, .ic0 = ic0, .ic1 = ic1, .scale = c->scale};
    if (!gr_vec.fa_heads_f16 || !gr_vec.fa_heads_f16(&a, M, S, VKQ16)) fa_heads_keys(&a, M, S, VKQ16);
    for (int64_t h = 0; h < H; h++) {
        gr_vec.fp16_to_fp32(DV, VKQ16 + h * DV, VKQ32);
        if (!partials) {
            fa_finish(c, VKQ32, M[h], S[h], h0 + h, fa_out(c, iq1, h0 + h, iq3));
            continue;
        }
        float *p = partials + h * pstride;
        if (c->sinks && ic0 == 0) fa_sink(c, VKQ32, &M[h], &S[h], h0 + h);
        p[0] = M[h];
        p[1] = S[h];
        memcpy(p + 2, VKQ32, (size_t)DV * 4);
    }
}

/* The row path with fa_heads: the rows numbered head first (w = head + heads *
 * (query + queries * iq3)), so that a thread's rows are whole runs of one query's
 * heads; rows are independent, so the numbering changes no result. */
static void fa_rows_heads(gr_job *job, const fa_ctx *c, int64_t r0, int64_t r1) {
    const int64_t neq1 = c->q->ne[1], neq2 = c->q->ne[2];
    for (int64_t w = gr_rows_from(job, r0), H; !gr_rows_pause(job, w) && w < r1; w += H) {
        const int64_t h = w % neq2, iq1 = w / neq2 % neq1, iq3 = w / (neq2 * neq1);
        H = neq2 - h < GR_FA_HEADS ? neq2 - h : GR_FA_HEADS;
        if (H > r1 - w) H = r1 - w;
        fa_heads(job, c, iq1, iq3, h, H, 0, c->k->ne[1], NULL, 0);
    }
}

/* Decode with a long cache (one query, 512 keys or more): the keys are cut into
 * one chunk per thread, every head gets partial (M, S, VKQ) per chunk, and after
 * a barrier the partials are merged per head. The cut follows the thread count,
 * as in ggml, so results match a ggml backend run with as many threads. */
static void fa_split(const gr_node *n, gr_job *job, const fa_ctx *c, int phase) {
    const int64_t DK = c->DK, DV = c->DV, nek1 = c->k->ne[1], heads = c->q->ne[2];
    const int nth = job->nth;
    const int64_t chunk = (nek1 + nth - 1) / nth;
    const int64_t psize = 2 + DV;
    float *partials = (float *)job->wdata + (size_t)nth * (size_t)(fa_row_floats(DK, DV) + 16);
    if (phase == 0) {
        const int64_t ic0 = job->ith * chunk;
        const int64_t ic1 = ic0 + chunk < nek1 ? ic0 + chunk : nek1;
        int64_t h = 0;
        if (ic0 < nek1 && fa_heads_ok(n, c))
            for (int64_t H; h < heads; h += H) {
                H = heads - h < GR_FA_HEADS ? heads - h : GR_FA_HEADS;
                fa_heads(job, c, 0, 0, h, H, ic0, ic1, partials + (h * nth + job->ith) * psize, nth * psize);
            }
        for (; h < heads; h++) {
            float *p = partials + (h * nth + job->ith) * psize;
            if (ic0 < nek1) {
                fa_row(n, job, c, h, ic0, ic1, p, h + 1 < heads ? h + 1 : -1);
            } else {
                p[0] = -INFINITY;
                p[1] = 0.0f;
            }
        }
        return;
    }
    float *vkq = gr_thread_f32(job, fa_row_floats(DK, DV));
    for (int64_t h = job->ith; h < heads; h += nth) {
        float M = -INFINITY, S = 0.0f;
        memset(vkq, 0, (size_t)DV * 4);
        for (int64_t k = 0; k < nth; k++) {
            if (k * chunk >= nek1) continue;
            const float *p = partials + (h * nth + k) * psize;
            if (p[1] == 0.0f) continue;
            const float Mn = fmaxf(M, p[0]);
            const float so = expf(M - Mn), sn = expf(p[0] - Mn);
            for (int64_t d = 0; d < DV; d++) vkq[d] = fmaf(vkq[d], so, p[2 + d] * sn);
            S = fmaf(S, so, p[1] * sn);
            M = Mn;
        }
        if (S != 0.0f) {
            const float inv = 1.0f / S;
            for (int64_t d = 0; d < DV; d++) vkq[d] *= inv;
        }
        memcpy(fa_out(c, 0, h, 0), vkq, (size_t)DV * 4);
    }
}

/* The largest of a tile row's FA_TK scores, as the fold m = m > x ? m : x from
 * -inf gives it, in eight independent runs (one run is a chain of dependent
 * compares, which took as long as the tile's products). Without NaN the two differ
 * at most in the sign of a zero maximum, which no result sees (it is only
 * subtracted from the scores and compared); a row with a NaN takes the fold. */
static inline float fa_row_max(const float *row) {
    float m[8];
    int nan = 0;
    for (int j = 0; j < 8; j++) m[j] = -INFINITY;
    for (int64_t k = 0; k < FA_TK; k += 8)
        for (int j = 0; j < 8; j++) {
            const float x = row[k + j];
            nan |= x != x;
            m[j] = m[j] > x ? m[j] : x;
        }
    float r = -INFINITY;
    if (nan) {
        for (int64_t k = 0; k < FA_TK; k++) r = r > row[k] ? r : row[k];
        return r;
    }
    for (int j = 0; j < 8; j++) r = r > m[j] ? r : m[j];
    return r;
}

/* A tile's mask in F32 (times the slope; keys past kv -inf) for query rows
 * iq1 .. iq1 + rows over keys [ic, ic + kv); 0 when every entry is -inf (the tile
 * is skipped). With a slope of 1 (no ALiBi) that shows in the F16 bits, -inf
 * being one pattern, and a dead tile is not converted. The next tile's `next`
 * entries of each row are fetched ahead: the rows are a whole row of keys apart,
 * more streams than a prefetcher follows (without it, each tile waited on its mask
 * rows about as long as its two products took). */
static int fa_tile_mask(const fa_ctx *c, int64_t iq1, int64_t iq2, int64_t iq3, int64_t rows, int64_t ic,
                        int64_t kv, int64_t next, float slope, float *mask32) {
    int live = 0;
    if (next > 0)
        for (int64_t t = 0; t < rows; t++)
            gr_prefetch_lines(fa_mask_row(c, iq1 + t, iq2, iq3) + ic + kv, (size_t)next * 2);
    if (slope == 1.0f) {
        for (int64_t t = 0; t < rows && !live; t++) {
            const uint16_t *mr = fa_mask_row(c, iq1 + t, iq2, iq3) + ic;
            for (int64_t k = 0; k < kv; k++) live |= mr[k] != GR_F16_NEG_INF;
        }
        if (!live) return 0;
    }
    for (int64_t t = 0; t < rows; t++) {
        float *m = mask32 + t * FA_TK;
        gr_vec.fp16_to_fp32(kv, fa_mask_row(c, iq1 + t, iq2, iq3) + ic, m);
        if (slope != 1.0f)
            for (int64_t k = 0; k < kv; k++) {
                m[k] *= slope;
                live |= m[k] != -INFINITY;
            }
        for (int64_t k = kv; k < FA_TK; k++) m[k] = -INFINITY;
    }
    return live;
}

/* row ic of head (i2, i3) of the keys or values t */
static inline const char *fa_cell(const gr_tensor *t, int64_t ic, int64_t i2, int64_t i3) {
    return t->data + ic * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

/* The key tile [ic, ic + kv) of head (i2, i3) in F32 and transposed: K32 is (DK,
 * FA_TK), keys past kv zero columns (Krow: one row's scratch). The next tile's n
 * key rows are fetched ahead. */
static void fa_tile_keys(const fa_ctx *c, int64_t i2, int64_t i3, int64_t ic, int64_t kv, int64_t n,
                         float *K32, float *Krow) {
    const int64_t DK = c->DK;
    for (int64_t k = 0; k < n; k++) gr_prefetch_lines(fa_cell(c->k, ic + kv + k, i2, i3), (size_t)(DK * c->k->nb[0]));
    for (int64_t k = 0; k < FA_TK; k++) {
        if (k < kv) {
            gr_load_f32(c->k->type, fa_cell(c->k, ic + k, i2, i3), c->k->nb[0], Krow, DK);
            for (int64_t e = 0; e < DK; e++) K32[e * FA_TK + k] = Krow[e];
        } else {
            for (int64_t e = 0; e < DK; e++) K32[e * FA_TK + k] = 0.0f;
        }
    }
}

/* The value tile [ic, ic + kv) of head (i2, i3) in F32: V32 is (FA_TK, DV), rows
 * past kv zero. The next tile's n value rows are fetched ahead. */
static void fa_tile_values(const fa_ctx *c, int64_t i2, int64_t i3, int64_t ic, int64_t kv, int64_t n, float *V32) {
    const int64_t DV = c->DV;
    for (int64_t k = 0; k < n; k++) gr_prefetch_lines(fa_cell(c->v, ic + kv + k, i2, i3), (size_t)(DV * c->v->nb[0]));
    for (int64_t k = 0; k < FA_TK; k++) {
        if (k < kv) gr_load_f32(c->v->type, fa_cell(c->v, ic + k, i2, i3), c->v->nb[0], V32 + k * DV, DV);
        else memset(V32 + k * DV, 0, (size_t)DV * 4);
    }
}

/* Query rows in tiles of up to 64 (never crossing a head), keys in tiles of 64,
 * everything in F32 with sequential fused sums, as ggml's tiled path. Up to FA_TG
 * query tiles of one head go together: each key tile's keys and values are
 * converted (and the keys transposed) once for all of them, not once a query tile
 * (a 512-token micro-batch has eight tiles a head). Each query row gets the same
 * steps in the same order either way, so the same bits. */
static void fa_tiled(gr_job *job, const fa_ctx *c, int64_t r0, int64_t r1) {
    const int64_t DK = c->DK, DV = c->DV;
    const int64_t neq1 = c->q->ne[1], neq2 = c->q->ne[2];
    const int64_t nek1 = c->k->ne[1];
    const int64_t group = fa_tiled_group(DK, DV);
    float *base = gr_thread_f32(job, fa_tiled_floats(DK, DV));
    float *Qf = base;                             /* group x (FA_TQ, DK) */
    float *VKQ = Qf + group * FA_TQ * DK;         /* group x (FA_TQ, DV) */
    float *KQ = VKQ + group * FA_TQ * DV;         /* (FA_TQ, FA_TK) */
    float *mask32 = KQ + FA_TQ * FA_TK;           /* (FA_TQ, FA_TK) */
    float *V32 = mask32 + FA_TQ * FA_TK;          /* (FA_TK, DV) */
    float *K32 = V32 + FA_TK * DV;                /* (DK, FA_TK): K transposed */
    float *Krow = K32 + FA_TK * DK;               /* (DK) */
    float S[FA_TG * FA_TQ], M[FA_TG * FA_TQ];
    int skip[FA_TQ];

    int64_t ir = gr_rows_from(job, r0);
    while (!gr_rows_pause(job, ir) && ir < r1) {   /* a turn may end between groups of tiles */
        const int64_t iq3 = ir / (neq2 * neq1);
        const int64_t iq2 = (ir - iq3 * neq2 * neq1) / neq1;
        const int64_t iq1 = ir - iq3 * neq2 * neq1 - iq2 * neq1;
        int64_t rows = group * FA_TQ;    /* this group's rows: one head's */
        if (r1 - ir < rows) rows = r1 - ir;
        if (neq1 - iq1 < rows) rows = neq1 - iq1;
        const int64_t tiles = (rows + FA_TQ - 1) / FA_TQ;
        const float slope = fa_slope(c, (uint32_t)iq2);
        const int64_t ik2 = iq2 / c->rk2, ik3 = iq3 / c->rk3;
        const int64_t iv2 = iq2 / c->rv2, iv3 = iq3 / c->rv3;
        for (int64_t t = 0; t < tiles * FA_TQ; t++) {
            S[t] = 0.0f;
            M[t] = -INFINITY;
            if (t < rows) {
                const char *pq = c->q->data + (iq1 + t) * c->q->nb[1] + iq2 * c->q->nb[2] + iq3 * c->q->nb[3];
                memcpy(Qf + t * DK, pq, (size_t)DK * 4);
            } else {
                memset(Qf + t * DK, 0, (size_t)DK * 4);
            }
        }
        memset(VKQ, 0, sizeof(float) * (size_t)(tiles * FA_TQ * DV));
        for (int64_t ic = 0; ic < nek1; ic += FA_TK) {
            const int64_t kv = nek1 - ic < FA_TK ? nek1 - ic : FA_TK;
            const int64_t kv_next = nek1 - ic - kv < FA_TK ? nek1 - ic - kv : FA_TK;
            int have_k = 0, have_v = 0;    /* this key tile converted yet */
            for (int64_t j = 0; j < tiles; j++) {
                const int64_t q0 = j * FA_TQ;                 /* the tile's first row in the group */
                const int64_t trows = rows - q0 < FA_TQ ? rows - q0 : FA_TQ;
                float *Sj = S + q0, *Mj = M + q0, *Qj = Qf + q0 * DK, *VKQj = VKQ + q0 * DV;
                if (c->mask && !fa_tile_mask(c, iq1 + q0, iq2, iq3, trows, ic, kv, kv_next, slope, mask32)) continue;
                if (!have_k) {
                    fa_tile_keys(c, ik2, ik3, ic, kv, kv_next, K32, Krow);
                    have_k = 1;
                }
                /* KQ = Q K^T, each entry one sequential fused sum over DK (rows past
                 * `trows` are padding: ggml computes them, nothing reads them) */
                memset(KQ, 0, sizeof(float) * (size_t)trows * FA_TK);
                gr_vec.gemm_f32(trows, DK, FA_TK, KQ, Qj, K32);
                for (int64_t i = 0; i < trows * FA_TK; i++) KQ[i] *= c->scale;
                if (c->softcap != 0.0f)
                    for (int64_t i = 0; i < trows * FA_TK; i++) KQ[i] = tanhf(KQ[i]) * c->softcap;
                if (kv < FA_TK)
                    for (int64_t t = 0; t < trows; t++)
                        for (int64_t k = kv; k < FA_TK; k++) KQ[t * FA_TK + k] = -INFINITY;
                if (c->mask)
                    for (int64_t i = 0; i < trows * FA_TK; i++) KQ[i] += mask32[i];
                for (int64_t t = 0; t < trows; t++) {
                    float *row = KQ + t * FA_TK;
                    const float tmax = fa_row_max(row);
                    skip[t] = tmax == -INFINITY;
                    if (skip[t]) continue;
                    const float Mold = Mj[t];
                    const float Mnew = fmaxf(Mold, tmax);
                    if (Mnew > Mold) {
                        const float ms = expf(Mold - Mnew);
                        for (int64_t d = 0; d < DV; d++) VKQj[t * DV + d] *= ms;
                        Sj[t] *= ms;
                    }
                    Mj[t] = Mnew;
                    Sj[t] = (float)((double)Sj[t] + gr_vec.soft_max(FA_TK, row, row, Mnew));
                }
                if (!have_v) {
                    fa_tile_values(c, iv2, iv3, ic, kv, kv_next, V32);
                    have_v = 1;
                }
                for (int64_t t = 0; t < trows; t++)
                    if (skip[t]) memset(KQ + t * FA_TK, 0, sizeof(float) * FA_TK);
                /* VKQ += softmax(KQ) V, sequential fused sums over the keys */
                gr_vec.gemm_f32(trows, FA_TK, DV, VKQj, KQ, V32);
            }
        }
        for (int64_t t = 0; t < rows; t++)
            fa_finish(c, VKQ + t * DV, M[t], S[t], iq2, fa_out(c, iq1 + t, iq2, iq3));
        ir += rows;
    }
}

/*   q: (DK, queries, heads, ne3) F32; k: (DK, keys, kv_heads, ne3k); v: (DV, keys, kv_heads, ne3v)
 *   mask: (keys, >= queries, 1 | heads, 1 | ne3) F16 or absent; sinks: (heads) F32 or absent
 *   dst: (DV, heads, queries, ne3) F32. Two phases: the split path merges in the second. */
void gr_k_flash_attn(gr_job *job, int phase) {
    const gr_node *n = job->node;
    fa_ctx c;
    fa_setup(n, &c);
    if (n->iparams[1] == GR_FA_SPLIT) {
        fa_split(n, job, &c, phase);
        return;
    }
    if (phase) return;
    const int64_t nr = c.q->ne[1] * c.q->ne[2] * c.q->ne[3];
    int64_t r0, r1;
    gr_range(nr, job->ith, job->nth, &r0, &r1);
    if (r0 >= r1) return;
    if (n->iparams[1] == GR_FA_TILED) fa_tiled(job, &c, r0, r1);
    else if (fa_heads_ok(n, &c)) fa_rows_heads(job, &c, r0, r1);
    else for (int64_t ir = gr_rows_from(job, r0); !gr_rows_pause(job, ir) && ir < r1; ir++)
        fa_row(n, job, &c, ir, 0, c.k->ne[1], NULL, ir + c.q->ne[1] < r1 ? ir + c.q->ne[1] : -1);
}
