// flash_attn.cu: FLASH_ATTN_EXT for decoding and short prompts: one warp per
// (query, head), the K/V rows streamed once with an online softmax; K and V of one
// type (F16, BF16, F32, Q8_0, Q4_0). Mask (F16), ALiBi, logit softcap and sinks as ggml.
#include "common.cuh"

#define GR_FA_WARPS 4
// head sizes: kernels for D, Dv up to 256 and up to 576 (MLA); per lane D/32 values of q and of the output

// q: (B, H, n_q, D) f32 at float strides q_row (query), q_head, q_batch
// k: (B, H_kv, n_kv, D) of T at byte strides k_row, k_head, k_batch; v likewise with Dv
// mask: f16 rows of n_kv per query at half strides m_row, m_head, m_batch (broadcast:
//       head % m_ne2, batch % m_ne3) or null; sinks: (H,) f32 or null
// dst: (B, n_q, H, Dv) f32 contiguous (ggml's permuted result)
template <class T, int PER_LANE>
static __device__ void flash_attn_vec(float *__restrict__ dst, const float *__restrict__ q, const char *__restrict__ k,
                                      const char *__restrict__ v, const __half *__restrict__ mask,
                                      const float *__restrict__ sinks, int D, int Dv, int n_q, int H, int B, int n_kv,
                                      int H_kv, long long q_row, long long q_head, long long q_batch, long long k_row,
                                      long long k_head, long long k_batch, long long v_row, long long v_head,
                                      long long v_batch, long long m_row, long long m_head, long long m_batch,
                                      int m_ne2, int m_ne3, float scale, float max_bias, float m0, float m1,
                                      int n_head_log2, float softcap) {
    const int pair = blockIdx.x * blockDim.y + threadIdx.y, lane = threadIdx.x;
    if (pair >= n_q * H * B) return;  // whole warps leave together
    const int h = pair % H, iq = pair / H % n_q, b = pair / (H * n_q);
    const int hk = h / (H / H_kv);
    const float *qr = q + b * q_batch + h * q_head + iq * q_row;
    const char *kb = k + b * k_batch + hk * k_head, *vb = v + b * v_batch + hk * v_head;
    const __half *mr = mask ? mask + (b % m_ne3) * m_batch + (h % m_ne2) * m_head + iq * m_row : nullptr;
    float slope = 1.0f;
    if (max_bias > 0.0f) slope = h < n_head_log2 ? powf(m0, h + 1) : powf(m1, 2 * (h - n_head_log2) + 1);

    float qv[PER_LANE], acc[PER_LANE];
#pragma unroll
    for (int t = 0; t < PER_LANE; t++) {
        const int d = lane + GR_WARP * t;
        qv[t] = d < D ? qr[d] : 0.0f;
        acc[t] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j < n_kv; j++) {
        const float mv = mr ? __half2float(mr[j]) : 0.0f;
        if (mv == -INFINITY) continue;  // the same for every lane
        float s = 0.0f;
#pragma unroll
        for (int t = 0; t < PER_LANE; t++) {
            const int d = lane + GR_WARP * t;
            if (d < D) s += qv[t] * row_get<T>(kb + j * k_row, d);
        }
        s = warp_sum(s) * scale;
        if (softcap != 0.0f) s = softcap * tanhf(s / softcap);
        s += slope * mv;
        const float mn = fmaxf(m, s), c = expf(m - mn), p = expf(s - mn);
        l = l * c + p;
#pragma unroll
        for (int t = 0; t < PER_LANE; t++) {
            const int d = lane + GR_WARP * t;
            if (d < Dv) acc[t] = acc[t] * c + p * row_get<T>(vb + j * v_row, d);
        }
        m = mn;
    }
    if (sinks) {
        const float sk = sinks[h], mn = fmaxf(m, sk), c = expf(m - mn);
        l = l * c + expf(sk - mn);
#pragma unroll
        for (int t = 0; t < PER_LANE; t++) acc[t] *= c;
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float *out = dst + (((long long)b * n_q + iq) * H + h) * Dv;
#pragma unroll
    for (int t = 0; t < PER_LANE; t++) {
        const int d = lane + GR_WARP * t;
        if (d < Dv) out[d] = acc[t] * inv;
    }
}

#define GR_FA_KERNEL(name, T, maxd)                                                                            \
    extern "C" __global__ void __launch_bounds__(GR_WARP *GR_FA_WARPS) flash_attn_vec##maxd##_##name(           \
        float *dst, const float *q, const char *k, const char *v, const __half *mask, const float *sinks, int D,  \
        int Dv, int n_q, int H, int B, int n_kv, int H_kv, long long q_row, long long q_head, long long q_batch,   \
        long long k_row, long long k_head, long long k_batch, long long v_row, long long v_head,                  \
        long long v_batch, long long m_row, long long m_head, long long m_batch, int m_ne2, int m_ne3,            \
        float scale, float max_bias, float m0, float m1, int n_head_log2, float softcap) {                       \
        flash_attn_vec<T, maxd / GR_WARP>(dst, q, k, v, mask, sinks, D, Dv, n_q, H, B, n_kv, H_kv, q_row, q_head, \
                                          q_batch, k_row, k_head, k_batch, v_row, v_head, v_batch, m_row, m_head,  \
                                          m_batch, m_ne2, m_ne3, scale, max_bias, m0, m1, n_head_log2, softcap);   \
    }
#define GR_FA(name, T) GR_FA_KERNEL(name, T, 256) GR_FA_KERNEL(name, T, 576)
#define GR_FA_TYPES(X) X(f16, tr_f16) X(bf16, tr_bf16) X(f32, tr_f32) X(q8_0, tr_q8_0) X(q4_0, tr_q4_0)
GR_FA_TYPES(GR_FA)
