/* Recurrent kernels: state-space models (SSM_CONV, SSM_SCAN for Mamba 1/2) and
 * linear attention (RWKV 6/7, gated linear attention, the gated delta rule) with
 * the triangular solve their chunked forms use. Same conventions as
 * every ops file: the planner checked types and shapes, sums follow ggml's CPU
 * backend, fused where its x86 build fuses.
 */
#include "common/checked.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu/job.h"
#include "cpu/kernels.h"

/* ---- state-space models ------------------------------------------------------------ */

/* Depthwise causal convolution over a sliding window (Mamba's conv1d, LFM2's
 * short conv): dst[i1, t, s] = sum over k of src0[t + k, i1, s] * src1[k, i1].
 *   src0: (d_conv - 1 + n_t, d_inner, n_s) F32 rows contiguous; src1: (d_conv, d_inner) F32 */
void gr_k_ssm_conv(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *sx = &n->src[0], *c = &n->src[1], *d = &n->dst;
    const int64_t nc = c->ne[0], nr = sx->ne[1], n_t = d->ne[1], n_s = d->ne[2];
    int64_t r0, r1;
    gr_range(nr, job->ith, job->nth, &r0, &r1);
    for (int64_t i3 = 0; i3 < n_s; i3++)
        for (int64_t i2 = 0; i2 < n_t; i2++)
            for (int64_t i1 = r0; i1 < r1; i1++) {
                const float *s = (const float *)(sx->data + i1 * sx->nb[1] + i2 * sx->nb[0] + i3 * sx->nb[2]);
                const float *w = (const float *)(c->data + i1 * c->nb[1]);
                const float sum = gr_dot_seq(nc, s, w);
                memcpy(d->data + i1 * d->nb[0] + i2 * d->nb[1] + i3 * d->nb[2], &sum, 4);
            }
}

static inline float softplus(float x) { return x > 20.0f ? x : logf(1 + expf(x)); }

/* Selective scan (Mamba 1 and 2). dst holds y (dim, n_head, n_t, n_s) followed by
 * the final states, K snapshots of them (op_params[0]) for each sequence.
 *   src0 s: (d_state, dim, n_head, >= n_s) initial states, ids[i] picks sequence i's
 *   src1 x: (dim, n_head, n_t, n_s); src2 dt: (n_head, n_t, n_s); src3 A: (1 | d_state, n_head)
 *   src4 B, src5 C: (d_state, n_group, n_t, n_s); src6 ids: (n_s) I32 */
void gr_k_ssm_scan(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *S = &n->src[0], *X = &n->src[1], *DT = &n->src[2], *A = &n->src[3];
    const gr_tensor *B = &n->src[4], *C = &n->src[5], *IDS = &n->src[6], *d = &n->dst;
    const int64_t nc = S->ne[0], nr = S->ne[1], nh = X->ne[1], ng = B->ne[1];
    const int64_t nt = X->ne[2], ns = X->ne[3];
    const int64_t K = n->op_params[0];
    const int64_t s_off = gr_nelements(X) * 4;
    const int64_t state_bytes = S->nb[3];
    const float *a = (const float *)A->data;
    int64_t h0, h1;
    gr_range(nh, job->ith, job->nth, &h0, &h1);
    for (int64_t i3 = 0; i3 < ns; i3++) {
        int32_t id;
        memcpy(&id, IDS->data + i3 * IDS->nb[0], 4);
        if (id < 0 || id >= S->ne[3]) {
            gr_fail(job, GR_EXEC_EINDEX, "SSM_SCAN state %d out of range [0, %lld)", id, (long long)S->ne[3]);
            return;
        }
        const float *s0 = (const float *)(S->data + id * state_bytes);
        float *s = (float *)(d->data + s_off + i3 * state_bytes);
        for (int64_t i2 = 0; i2 < nt; i2++) {
            const float *x = (const float *)(X->data + i2 * X->nb[2] + i3 * X->nb[3]);
            const float *dt = (const float *)(DT->data + i2 * DT->nb[1] + i3 * DT->nb[2]);
            const float *b = (const float *)(B->data + i2 * B->nb[2] + i3 * B->nb[3]);
            const float *cc = (const float *)(C->data + i2 * C->nb[2] + i3 * C->nb[3]);
            float *y = (float *)(d->data + (i2 * nh * nr + i3 * nt * nh * nr) * 4);
            for (int64_t h = h0; h < h1; h++) {
                const float dt_sp = softplus(dt[h]);
                const int64_t g = h / (nh / ng);
                const float dA = A->ne[0] == 1 ? expf(dt_sp * a[h]) : 0.0f;
                for (int64_t i1 = 0; i1 < nr; i1++) {
                    const int64_t ii = i1 + h * nr;
                    const float x_dt = x[ii] * dt_sp;
                    float sum = 0.0f;
                    int64_t i0 = 0;
                    if (A->ne[0] == 1) {
                        /* ggml's vector loop: products rounded, added, one fused sum per
                         * lane in four accumulators of the family's width, reduced like
                         * its dot product */
                        const int L = gr_vec.lanes;
                        const int64_t np = nc & ~(int64_t)(4 * L - 1);
                        float acc[4][16] = {{0}};
                        for (; i0 < np; i0 += 4 * L)
                            for (int j = 0; j < 4; j++)
                                for (int l = 0; l < L; l++) {
                                    const int64_t e = i0 + L * j + l;
                                    const float st = fmaf(s0[e + ii * nc], dA, b[e + g * nc] * x_dt);
                                    acc[j][l] = fmaf(st, cc[e + g * nc], acc[j][l]);
                                    s[e + ii * nc] = st;
                                }
                        if (np) sum = gr_vec_reduce4(acc);
                        for (; i0 < nc; i0++) {
                            const float st = fmaf(s0[i0 + ii * nc], dA, b[i0 + g * nc] * x_dt);
                            sum = fmaf(st, cc[i0 + g * nc], sum);
                            s[i0 + ii * nc] = st;
                        }
                    } else {
                        for (; i0 < nc; i0++) {
                            const float st = fmaf(s0[i0 + ii * nc], expf(dt_sp * a[i0 + h * nc]), b[i0 + g * nc] * x_dt);
                            sum = fmaf(st, cc[i0 + g * nc], sum);
                            s[i0 + ii * nc] = st;
                        }
                    }
                    y[ii] = sum;
                }
            }
            const int64_t slot = nt - 1 - i2;
            if (K > 1 && slot > 0 && slot < K) {
                char *snap = d->data + s_off + (slot * ns + i3) * state_bytes;
                for (int64_t h = h0; h < h1; h++)
                    memcpy(snap + h * S->nb[2], (char *)s + h * S->nb[2], (size_t)S->nb[2]);
            }
            s0 = s;
        }
    }
}

/* ---- linear-attention recurrences (RWKV 6/7, GLA, gated delta net) ---------------- */

/* dst holds the outputs (S*H, T) followed by the final states (S, S, H, n_seqs);
 * a sequence's first token reads its state from the state source, the rest read
 * the state the previous token left in dst. Heads are independent: threads split
 * them. All sources contiguous F32, T a multiple of n_seqs (checked by the planner).
 *   sub 0 RWKV_WKV6: k, v, r, time_first (S, H), time_decay, state
 *   sub 1 GATED_LINEAR_ATTN: k, v, q, g, state; op_params[0] = scale */
void gr_k_rwkv_wkv6(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const int gla = n->sub == GR_V_RWKV_WKV6_GATED_LINEAR_ATTN;
    const int64_t S = n->src[0].ne[0], H = n->src[0].ne[1], T = n->src[0].ne[2], C = S * H;
    const gr_tensor *st = &n->src[gla ? 4 : 5];
    const int64_t per_seq = T / st->ne[1];
    const float *k = (const float *)n->src[0].data, *v = (const float *)n->src[1].data;
    const float *r = (const float *)n->src[2].data, *tf = (const float *)n->src[3].data;
    const float *td = gla ? NULL : (const float *)n->src[4].data;
    const float scale = gla ? gr_param_f32(n, 0) : 0.0f;
    float *out = (float *)n->dst.data, *state = out + C * T;
    int64_t h0, h1;
    gr_range(H, job->ith, job->nth, &h0, &h1);
    for (int64_t t = 0; t < T; t++) {
        const int64_t seq_off = S * C * (t / per_seq);
        float *cur = state + seq_off;
        const float *prev = t % per_seq ? cur : (const float *)st->data + seq_off;
        for (int64_t h = h0; h < h1; h++) {
            const int64_t th = t * C + h * S;
            float *o = out + th;
            memset(o, 0, (size_t)S * 4);
            for (int64_t i = 0; i < S; i++) {
                const float kk = k[th + i];
                const float *p = prev + h * S * S + i * S;
                float *c = cur + h * S * S + i * S;
                if (gla) {
                    const float q = r[th + i] * scale, g = tf[th + i];
                    for (int64_t j = 0; j < S; j++) {
                        const float temp = fmaf(p[j], g, v[th + j] * kk);
                        o[j] = fmaf(temp, q, o[j]);
                        c[j] = temp;
                    }
                } else {
                    const float rr = r[th + i], first = tf[h * S + i], decay = td[th + i];
                    for (int64_t j = 0; j < S; j++) {
                        const float kv = v[th + j] * kk, pj = p[j];
                        o[j] = fmaf(fmaf(kv, first, pj), rr, o[j]);
                        c[j] = fmaf(pj, decay, kv);
                    }
                }
            }
        }
    }
}

/* RWKV 7: per state row i, sa = a . row (ggml's dot order), then
 * row = row*w + v_i*k + sa*b (two fused steps) and out_i = row . r.
 *   sources r, w, k, v, a, b: (S, H, T); state (S, S, H, n_seqs) */
void gr_k_rwkv_wkv7(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const int64_t S = n->src[0].ne[0], H = n->src[0].ne[1], T = n->src[0].ne[2], C = S * H;
    const gr_tensor *st = &n->src[6];
    const int64_t per_seq = T / st->ne[1];
    const float *r = (const float *)n->src[0].data, *w = (const float *)n->src[1].data;
    const float *k = (const float *)n->src[2].data, *v = (const float *)n->src[3].data;
    const float *a = (const float *)n->src[4].data, *b = (const float *)n->src[5].data;
    float *out = (float *)n->dst.data, *state = out + C * T;
    int64_t h0, h1;
    gr_range(H, job->ith, job->nth, &h0, &h1);
    for (int64_t t = 0; t < T; t++) {
        const int64_t seq_off = S * C * (t / per_seq);
        float *cur = state + seq_off;
        const float *prev = t % per_seq ? cur : (const float *)st->data + seq_off;
        for (int64_t h = h0; h < h1; h++) {
            const int64_t th = t * C + h * S;
            for (int64_t i = 0; i < S; i++) {
                const float *p = prev + h * S * S + i * S;
                float *c = cur + h * S * S + i * S;
                const float sa = gr_vec.dot_f32(S, a + th, p), vi = v[th + i];
                for (int64_t j = 0; j < S; j++)
                    c[j] = fmaf(sa, b[th + j], fmaf(p[j], w[th + j], vi * k[th + j]));
                out[th + i] = gr_vec.dot_f32(S, c, r + th);
            }
        }
    }
}

/* Forward substitution A X = B with A lower triangular (n, n), B and X (k, n):
 * threads split the columns of all batches. All contiguous F32. */
void gr_k_solve_tri(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *A = &n->src[0], *B = &n->src[1], *d = &n->dst;
    const int64_t k = B->ne[0], nn = B->ne[1], nb = A->ne[2];
    int64_t r0, r1;
    gr_range(nb * A->ne[3] * k, job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t col = ir % k, i2 = (ir / k) % nb, i3 = ir / (k * nb);
        const float *a = (const float *)(A->data + i2 * A->nb[2] + i3 * A->nb[3]);
        const float *bb = (const float *)(B->data + i2 * B->nb[2] + i3 * B->nb[3]);
        float *x = (float *)(d->data + i2 * d->nb[2] + i3 * d->nb[3]);
        for (int64_t i = 0; i < nn; i++) {
            /* as GCC vectorizes ggml's loop: groups of rounded products (four when
             * the column is contiguous or the build is not tuned for Zen, else two)
             * added in order, the rest fused */
            const int64_t g = k == 1 || gr_vec.fma_chains ? 4 : 2;
            const float *ai = a + i * nn;
            float sum = 0.0f;
            int64_t t = 0;
            for (; t + g <= i; t += g)
                for (int64_t l = t; l < t + g; l++) sum += ai[l] * x[l * k + col];
            for (; t < i; t++) sum = fmaf(ai[t], x[t * k + col], sum);
            x[i * k + col] = (bb[i * k + col] - sum) / a[i * nn + i];
        }
    }
}

/* Gated delta rule (Qwen3-Next, Kimi linear). Per (head, sequence), the state M
 * (S, S; row j is column j of the math state) evolves per token:
 *   M *= exp(g) (scalar g, or per column for a vector g), delta_j = (v_j - M_j . k)*beta,
 *   M_j += delta_j k, out_j = (M_j . q) / sqrt(S).
 * dst: outputs (S, H, T, n_seqs), then K state snapshots (slot s = s tokens back).
 *   q, k: (S, Hq|Hk, T, n_seqs / r) rows contiguous, heads taken modulo, sequences
 *   shared by ratio; v: (S, H, T, n_seqs) rows contiguous; g: (1|S, H, T, n_seqs),
 *   beta (1, H, T, n_seqs), state (S, S, H, n_seqs) contiguous.
 * Scratch: per thread S floats (+ S*S for the working state when K > 1). */
void gr_k_gated_delta_net(gr_job *job, int phase) {
    (void)phase;
    const gr_node *n = job->node;
    const gr_tensor *Q = &n->src[0], *Kt = &n->src[1], *V = &n->src[2], *G = &n->src[3], *Bt = &n->src[4];
    const gr_tensor *st = &n->src[5];
    const int64_t S = V->ne[0], H = V->ne[1], T = V->ne[2], NS = V->ne[3];
    const int64_t K = n->op_params[0];
    const int vec_g = G->ne[0] == S;
    float *delta = gr_thread_f32(job, S + (K > 1 ? S * S : 0));
    float *work = delta + S;
    float *out_base = (float *)n->dst.data, *state_base = out_base + S * H * T * NS;
    const int64_t snap = S * S * H * NS;
    const float scale = 1.0f / sqrtf((float)S);
    int64_t r0, r1;
    gr_range(H * NS, job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const int64_t h = ir % H, s = ir / H;
        const int64_t hq = h % Q->ne[1], hk = h % Kt->ne[1];
        const int64_t sq = s / (NS / Q->ne[3]), sk = s / (NS / Kt->ne[3]);
        float *M = K > 1 ? work : state_base + (s * H + h) * S * S;
        memcpy(M, st->data + s * st->nb[3] + h * st->nb[2], (size_t)(S * S) * 4);
        float *o = out_base + (s * T * H + h) * S;
        for (int64_t t = 0; t < T; t++, o += S * H) {
            const float *q = (const float *)gr_at(Q, 0, hq, t, sq);
            const float *kk = (const float *)gr_at(Kt, 0, hk, t, sk);
            const float *vv = (const float *)gr_at(V, 0, h, t, s);
            const float *g = (const float *)gr_at(G, 0, h, t, s);
            float beta;
            memcpy(&beta, gr_at(Bt, 0, h, t, s), 4);
            if (vec_g) {
                for (int64_t i = 0; i < S; i++) delta[i] = expf(g[i]);
                for (int64_t j = 0; j < S; j++)
                    for (int64_t i = 0; i < S; i++) M[j * S + i] *= delta[i];
            } else {
                const float e = expf(g[0]);
                for (int64_t i = 0; i < S * S; i++) M[i] *= e;
            }
            for (int64_t j = 0; j < S; j++) delta[j] = (vv[j] - gr_vec.dot_f32(S, M + j * S, kk)) * beta;
            for (int64_t j = 0; j < S; j++) gr_vec.mad_f32(S, M + j * S, kk, delta[j]);
            for (int64_t j = 0; j < S; j++) o[j] = gr_vec.dot_f32(S, M + j * S, q) * scale;
            const int64_t slot = T - 1 - t;
            if (K > 1 && slot < K)
                memcpy(state_base + slot * snap + (s * H + h) * S * S, M, (size_t)(S * S) * 4);
        }
    }
}

/* per thread: a row of S floats, and an S x S state when snapshots are kept (op_params[0] > 1) */
size_t gr_ws_gated_delta_net(const gr_node *n, int nth) {
    const size_t S = gr_sz(n->src[2].ne[0]);
    const size_t per = gr_sz_add(S, n->op_params[0] > 1 ? gr_sz_mul(S, S) : 0);
    return gr_sz_mul3(gr_sz(nth), gr_sz_add(per, 16), sizeof(float));
}
