// rope.cu: ROPE, normal (adjacent pairs), NEOX (pairs n_dims/2 apart) and the
// multi-section modes (MROPE, IMROPE: four position streams), with YaRN and
// optional frequency factors. One thread per pair of elements.
#include "common.cuh"

#define GR_ROPE_NEOX 2
#define GR_ROPE_MROPE 8
#define GR_ROPE_IMROPE 40

// dst: (ne2, ne1, ne0) contiguous; x: the same shape with byte strides nb1, nb2 (nb0 = 4)
// pos: (ne2,) i32, or (4, ne2) for the multi-section modes; ff: (n_dims/2,) or null
extern "C" __global__ void rope_f32(float *__restrict__ dst, const char *__restrict__ x,
                                    const int *__restrict__ pos, const float *__restrict__ ff, int ne0, int ne1,
                                    int ne2, long long nb1, long long nb2, int n_dims, int mode, float freq_base,
                                    float freq_scale, float ext_factor, float attn_factor, float corr0,
                                    float corr1, int s0, int s1, int s2, int s3) {
    const long long npairs = (long long)(ne0 / 2) * ne1 * ne2;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < npairs;
         i += (long long)gridDim.x * blockDim.x) {
        const int ip = i % (ne0 / 2), i1 = i / (ne0 / 2) % ne1, i2 = i / ((long long)(ne0 / 2) * ne1);
        const float *xr = (const float *)(x + i1 * nb1 + i2 * nb2);
        float *dr = dst + ((long long)i2 * ne1 + i1) * ne0;
        if (2 * ip >= n_dims) {
            dr[2 * ip] = xr[2 * ip];
            dr[2 * ip + 1] = xr[2 * ip + 1];
            continue;
        }
        int p = pos[i2];
        if (mode == GR_ROPE_MROPE || mode == GR_ROPE_IMROPE) {
            const int sect = s0 + s1 + s2 + s3, sector = ip % sect;
            int stream;
            if (mode == GR_ROPE_IMROPE)
                stream = sector % 3 == 0 && sector < 3 * s0 ? 0 : sector % 3 == 1 && sector < 3 * s1 ? 1
                       : sector % 3 == 2 && sector < 3 * s2 ? 2 : 3;
            else
                stream = sector < s0 ? 0 : sector < s0 + s1 ? 1 : sector < s0 + s1 + s2 ? 2 : 3;
            p = pos[i2 + stream * ne2];
        }
        const float theta_extrap = p * powf(freq_base, -2.0f * ip / n_dims) / (ff ? ff[ip] : 1.0f);
        const float theta_interp = freq_scale * theta_extrap;
        float theta = theta_interp, mscale = attn_factor;
        if (ext_factor != 0.0f) {
            const float y = (ip - corr0) / fmaxf(0.001f, corr1 - corr0);
            const float ramp = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * ext_factor;
            theta = theta_interp * (1.0f - ramp) + theta_extrap * ramp;
            mscale *= 1.0f + 0.1f * logf(1.0f / freq_scale);
        }
        const float c = cosf(theta) * mscale, s = sinf(theta) * mscale;
        const int a = mode == 0 ? 2 * ip : ip, b = mode == 0 ? 2 * ip + 1 : ip + n_dims / 2;
        const float x0 = xr[a], x1 = xr[b];
        dr[a] = x0 * c - x1 * s;
        dr[b] = x0 * s + x1 * c;
    }
}
