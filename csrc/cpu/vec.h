/* The vector primitives of a kernel family (vec.c): ggml's summation orders at
 * its register width, SIMD where the CPU has it, portable twins with the same bits
 * everywhere. gr_vec holds the set in use (simd.h's switch fills it in). */
#ifndef GGMLRPC_CPU_VEC_H
#define GGMLRPC_CPU_VEC_H

#include <math.h>
#include <stdint.h>

#define GR_TILE_COLS_MAX 6

/* -inf as F16 bits: a key masked with it is skipped without converting the mask
 * where the slope is positive (slope * -inf is -inf) */
#define GR_F16_NEG_INF 0xFC00

/* flash attention's loop over the keys of one query row (fa_keys_f16) */
typedef struct {
    const char *k, *v;            /* the first key's and value's row of the head */
    size_t k_stride, v_stride;    /* bytes from one key (value) row to the next */
    const uint16_t *mask;         /* F16, one per key, or NULL */
    const uint16_t *q;            /* the query in F16 (DK) */
    const char *k_next, *v_next;  /* the next row's first key and value rows, or NULL (prefetched) */
    int64_t DK, DV, ic0, ic1;
    float slope, scale;
} gr_fa_keys;

/* flash attention over several heads of one query row at once, keys outer
 * (fa_heads_f16): every key's row of all heads is read once, one after the other */
#define GR_FA_HEADS 16     /* heads of one call at most */
typedef struct {
    const char *k, *v;            /* key 0's row of kv head 0 */
    size_t k_stride, v_stride;    /* bytes from one key (value) row to the next */
    size_t k_head, v_head;        /* bytes from one kv head's row to the next */
    int64_t h0, H, rk, rv;        /* query heads h0 .. h0 + H; query heads per kv head */
    const uint16_t *mask;         /* F16, one per key (the same for every head), or NULL */
    const uint16_t *q;            /* the H queries in F16, DK apart */
    int64_t DK, DV, ic0, ic1;
    float scale;                  /* the slope is 1 */
} gr_fa_heads;

typedef struct gr_vec_ops {
    int lanes;     /* 8 or 16: the family's vector width in floats */
    int fma_chains;   /* the build fuses ggml's scalar multiply-add chains (not tuned for Zen) */
    /* ggml_vec_dot_f32's order: four accumulators of `lanes` over blocks of 4*lanes */
    float (*dot_f32)(int64_t n, const float *x, const float *y);
    /* the prompt-time GEMM's (tinyBLAS's) order: one accumulator of `lanes` (n % lanes == 0) */
    float (*dot_f32_gemm)(int64_t n, const float *x, const float *y);
    float (*dot_f16)(int64_t n, const uint16_t *x, const uint16_t *y);
    float (*dot_f16_gemm)(int64_t n, const uint16_t *x, const uint16_t *y);
    void (*fp16_to_fp32)(int64_t n, const uint16_t *x, float *y);
    void (*fp32_to_fp16)(int64_t n, const float *x, uint16_t *y);
    /* y = exp(x - max) with ggml's vector exp; returns the sum (as ggml adds it) */
    double (*soft_max)(int64_t n, float *y, const float *x, float max);
    void (*silu)(int64_t n, float *y, const float *x);
    void (*swiglu)(int64_t n, float *y, const float *x, const float *g);
    void (*mad_f32)(int64_t n, float *y, const float *x, float v);   /* y += x*v (fused) */
    void (*mad_f16)(int64_t n, uint16_t *y, const uint16_t *x, float v);
    void (*scale_f16)(int64_t n, uint16_t *y, float v);                /* y *= v */
    /* out[j*4 + i] = dot_*_gemm(w[i], x[j]) for i < 4, j < tile_cols at once (K % lanes
     * == 0): 4 x 2 tiles on AVX2's 16 registers, 4 x 6 on AVX-512's 32 (tinyBLAS's) */
    int tile_cols;
    void (*tile_f32_gemm)(int64_t K, const float *const w[4], const float *const *x, float *out);
    void (*tile_f16_gemm)(int64_t K, const uint16_t *const w[4], const uint16_t *const *x, float *out);
    /* C (M x N) += A (M x K) B (K x N), rows packed: every entry of C one
     * sequential fused sum over k from its old value (ggml's simd_gemm) */
    void (*gemm_f32)(int64_t M, int64_t K, int64_t N, float *C, const float *A, const float *B);
    /* BF16 products with the signature of a vec_dot: ggml_vec_dot_bf16's order in the
     * AVX512-BF16 families (two VDPBF16PS accumulators over blocks of 64; NULL
     * elsewhere: the vec_dot of the type table serves), and tinyBLAS's in every family
     * (one accumulator: VDPBF16PS steps of 32 in the AVX512-BF16 families, n % 32 ==
     * 0; else FMAs on the values widened to F32, n % lanes == 0) */
    void (*dot_bf16)(int64_t n, float *s, const void *x, const void *y);
    void (*dot_bf16_gemm)(int64_t n, float *s, const void *x, const void *y);
    /* ROPE's rotation of np pairs (x[p*istep], x[p*istep + joff]) of an F32 or F16
     * row by (cos, sin) = (cs[2p], cs[2p+1]), fused as ggml's x86 build computes it */
    void (*rope_rotate)(int32_t type, char *dst, const char *src, int64_t np, int64_t istep, int64_t joff,
                        const float *cs);
    /* flash attention's steps for keys [ic0, ic1) of one query row, F16 keys and values,
     * no soft-cap (flash_attn.c's fa_row: the dot product, the running maximum M and
     * sum S, VKQ scaled and accumulated in F16 by scale_f16/mad_f16), with VKQ in
     * registers, the scores of a block of keys first: the same bits. Returns 0 where
     * it does not take this DV (fa_row's loop then serves); NULL in families without
     * one. */
    int (*fa_keys_f16)(const gr_fa_keys *a, float *M, float *S, uint16_t *vkq);
    /* fa_keys_f16's steps for H heads of one query row (M, S: H each; vkq: H rows of
     * DV), each head's the same bits; the keys outer, so that each key's row of every
     * head is read once and in order. Returns 0, touching nothing, where it does not
     * take these sizes; NULL in families without one. */
    int (*fa_heads_f16)(const gr_fa_heads *a, float *M, float *S, uint16_t *vkq);
} gr_vec_ops;

extern gr_vec_ops gr_vec;
/* the primitives of `family` (enum gr_family), SIMD where the CPU has it and use_simd
 * is set, else the portable twins; returns whether SIMD kernels were chosen (called by
 * the switch of simd.h only) */
int gr_vec_init(int family, int use_simd);
/* sum + a*b in a scalar loop of ggml's that GCC fuses unless it tunes for Zen
 * (compiled code, read off generic, Intel- and Zen-tuned builds) */
static inline float gr_family_madd(float sum, float a, float b) {
    return gr_vec.fma_chains ? fmaf(a, b, sum) : sum + a * b;
}

/* ggml_vec_dot_f32's reduction of four partial sums of the family's width
 * (acc[j][l], l < gr_vec.lanes): pairwise, then across the lanes */
float gr_vec_reduce4(float acc[4][16]);

/* ggml's vector exp (max error ~1.5 ulp) for one float, the exact twin of the
 * 8-lane version, so that scalar and SIMD paths agree bit for bit. */
float gr_expf_vec1(float x);

/* A short dot product as GCC compiles ggml's plain loop `sum += x[i]*y[i]` for
 * x86: groups of four rounded products added in order, the rest fused. */
float gr_dot_seq(int64_t n, const float *x, const float *y);

#endif
