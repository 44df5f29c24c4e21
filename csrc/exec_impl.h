/* What the CPU kernels share: the job a thread runs, row splitting, F16/BF16
 * conversion and the vector primitives chosen at run time (AVX2/FMA/F16C or the
 * portable twins in exec_vec.c). Internal to csrc/: not part of the exported API.
 */
#ifndef GGMLRPC_EXEC_IMPL_H
#define GGMLRPC_EXEC_IMPL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "exec.h"
#include "fp16.h"
#include "quants.h"

/* ggml_type ids that quants.h leaves out */
enum { GR_T_I8 = 24, GR_T_I16 = 25, GR_T_I32 = 26, GR_T_I64 = 27, GR_T_F64 = 28 };

typedef struct gr_run gr_run;

/* One thread's view of one node. */
typedef struct gr_job {
    const gr_node *node;
    int ith, nth;        /* this thread, number of threads */
    char *wdata;         /* scratch shared by all threads of the node */
    size_t wsize;
    gr_run *run;
    int epoch;           /* barriers this thread has passed (where a failure stops) */
} gr_job;

typedef void (*gr_kernel_fn)(gr_job *job, int phase);

/* Report a run error; the first one wins and the run stops at the next barrier. */
void gr_fail(gr_job *job, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A counter shared by the threads of a run, for work handed out in chunks: one
 * thread sets it before a barrier, every thread takes chunks after it (relaxed:
 * the barrier orders the set before the takes). */
/* 64 bits: a node can have more than 2^31 chunks (MUL_MAT_ID's experts x row chunks) */
void gr_chunk_set(gr_job *job, int64_t value);
int64_t gr_chunk_next(gr_job *job);   /* returns the counter, then adds 1 */

/* Rows [*r0, *r1) of n for thread ith of nth: contiguous, nearly equal shares. */
static inline void gr_range(int64_t n, int ith, int nth, int64_t *r0, int64_t *r1) {
    const int64_t dr = (n + nth - 1) / nth;
    int64_t a = dr * ith;
    if (a > n) a = n;
    int64_t b = a + dr;
    if (b > n) b = n;
    *r0 = a;
    *r1 = b;
}

static inline int64_t gr_nrows(const gr_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }
static inline int64_t gr_nelements(const gr_tensor *t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

/* Address of row ir (flattened over dims 1..3) of t. */
static inline char *gr_row(const gr_tensor *t, int64_t ir) {
    const int64_t i1 = ir % t->ne[1];
    const int64_t i2 = (ir / t->ne[1]) % t->ne[2];
    const int64_t i3 = ir / (t->ne[1] * t->ne[2]);
    return t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

static inline char *gr_at(const gr_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return t->data + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

/* Per-thread float scratch of n floats (plus a cache line of slack) at wdata. */
static inline float *gr_thread_f32(const gr_job *job, int64_t n) {
    return (float *)job->wdata + (size_t)job->ith * (size_t)(n + 16);
}

/* ---- rows as floats --------------------------------------------------- */

/* Read n elements (stride `stride` bytes) of a float-like type as floats. */
static inline void gr_load_f32(int32_t type, const char *src, int64_t stride, float *dst, int64_t n);
/* Write n floats as `type` (F32, F16, BF16, I32) with element stride `stride`. */
static inline void gr_store_f32(int32_t type, char *dst, int64_t stride, const float *src, int64_t n);

/* ---- vector primitives (exec_vec.c) ----------------------------------- */

/* The ggml x86 build whose summation orders the primitives reproduce. ggml's vector
 * code is written for its register width: an AVX2 build sums in 8-lane partial sums,
 * an AVX-512 build in 16-lane ones (and exp, tinyBLAS and the horizontal sums
 * follow); with AVX512-BF16 it multiplies BF16 pairs with VDPBF16PS, and with
 * AVX512-FP16 (CPUs that have it have BF16 too) it also scales and accumulates F16
 * vectors in half precision. A family's portable twins compute the same bits on any
 * CPU. */
enum {
    GR_FAMILY_AVX2 = 1,
    GR_FAMILY_AVX512 = 2,
    GR_FAMILY_AVX512_BF16 = 3,
    GR_FAMILY_AVX512_FP16 = 4,
};

#define GR_TILE_COLS_MAX 6

typedef struct gr_vec_ops {
    int lanes;     /* 8 or 16: the family's vector width in floats */
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
    /* BF16 products of the AVX512-BF16 families (NULL elsewhere: the vec_dot of the
     * type table serves), with the signature of a vec_dot: ggml_vec_dot_bf16's order
     * (two VDPBF16PS accumulators over blocks of 64) and tinyBLAS's (one, n % 32 == 0) */
    void (*dot_bf16)(int64_t n, float *s, const void *x, const void *y);
    void (*dot_bf16_gemm)(int64_t n, float *s, const void *x, const void *y);
    /* ROPE's rotation of np pairs (x[p*istep], x[p*istep + joff]) of an F32 or F16
     * row by (cos, sin) = (cs[2p], cs[2p+1]), fused as ggml's x86 build computes it */
    void (*rope_rotate)(int32_t type, char *dst, const char *src, int64_t np, int64_t istep, int64_t joff,
                        const float *cs);
} gr_vec_ops;

extern gr_vec_ops gr_vec;
/* the primitives of `family`, SIMD where the CPU has it and use_simd is set, else the
 * portable twins; returns whether SIMD kernels were chosen */
int gr_vec_init(int family, int use_simd);
/* sum + a*b in a scalar loop of ggml's that GCC leaves unfused in its AVX2 build and
 * fuses in its AVX-512 one (compiled code, read off each build) */
static inline float gr_family_madd(float sum, float a, float b) {
    return gr_vec.lanes == 16 ? fmaf(a, b, sum) : sum + a * b;
}

/* ggml_vec_dot_f32's reduction of four partial sums of the family's width
 * (acc[j][l], l < gr_vec.lanes): pairwise, then across the lanes */
float gr_vec_reduce4(float acc[4][16]);
/* the family a native ggml build on this CPU uses */
int gr_vec_native_family(void);
int gr_vec_simd_available(void);

/* ggml's vector exp (max error ~1.5 ulp) for one float, the exact twin of the
 * 8-lane version, so that scalar and SIMD paths agree bit for bit. */
float gr_expf_vec1(float x);

/* A short dot product as GCC compiles ggml's plain loop `sum += x[i]*y[i]` for
 * x86: groups of four rounded products added in order, the rest fused. */
float gr_dot_seq(int64_t n, const float *x, const float *y);

/* ---- inline definitions ----------------------------------------------- */

static inline void gr_load_f32(int32_t type, const char *src, int64_t stride, float *dst, int64_t n) {
    switch (type) {
    case GR_TYPE_F32:
        if (stride == 4) { memcpy(dst, src, (size_t)n * 4); return; }
        for (int64_t i = 0; i < n; i++) memcpy(&dst[i], src + i * stride, 4);
        return;
    case GR_TYPE_F16:
        if (stride == 2) { gr_vec.fp16_to_fp32(n, (const uint16_t *)src, dst); return; }
        for (int64_t i = 0; i < n; i++) {
            uint16_t h; memcpy(&h, src + i * stride, 2); dst[i] = gr_fp16_to_fp32(h);
        }
        return;
    case GR_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h; memcpy(&h, src + i * stride, 2); dst[i] = gr_bf16_to_fp32(h);
        }
        return;
    case GR_T_I32:
        for (int64_t i = 0; i < n; i++) {
            int32_t v; memcpy(&v, src + i * stride, 4); dst[i] = (float)v;
        }
        return;
    default:
        for (int64_t i = 0; i < n; i++) dst[i] = 0.0f;
    }
}

static inline void gr_store_f32(int32_t type, char *dst, int64_t stride, const float *src, int64_t n) {
    switch (type) {
    case GR_TYPE_F32:
        if (stride == 4) { memmove(dst, src, (size_t)n * 4); return; }
        for (int64_t i = 0; i < n; i++) memcpy(dst + i * stride, &src[i], 4);
        return;
    case GR_TYPE_F16:
        if (stride == 2) { gr_vec.fp32_to_fp16(n, src, (uint16_t *)dst); return; }
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = gr_fp32_to_fp16(src[i]); memcpy(dst + i * stride, &h, 2);
        }
        return;
    case GR_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = gr_fp32_to_bf16(src[i]); memcpy(dst + i * stride, &h, 2);
        }
        return;
    case GR_T_I32:
        for (int64_t i = 0; i < n; i++) {
            int32_t v = (int32_t)src[i]; memcpy(dst + i * stride, &v, 4);
        }
        return;
    default:
        return;
    }
}

/* Kernel entry points, one per enum gr_kernel (ops_*.c). */
void gr_k_dup(gr_job *job, int phase);
void gr_k_binary(gr_job *job, int phase);
void gr_k_unary(gr_job *job, int phase);
void gr_k_glu(gr_job *job, int phase);
void gr_k_scale(gr_job *job, int phase);
void gr_k_get_rows(gr_job *job, int phase);
void gr_k_set_rows(gr_job *job, int phase);
void gr_k_rms_norm(gr_job *job, int phase);
void gr_k_norm(gr_job *job, int phase);
void gr_k_group_norm(gr_job *job, int phase);
void gr_k_soft_max(gr_job *job, int phase);
void gr_k_rope(gr_job *job, int phase);
void gr_k_mul_mat(gr_job *job, int phase);
void gr_k_flash_attn(gr_job *job, int phase);

/* ggml's tiled K-quant GEMM order (ops_tiled.c): Q2_K..Q6_K and IQ4_XS weights
 * with Q8_K activations, for 8 or more activation rows. A weight row is decoded
 * once into gr_tiled_row_bytes(K) of scratch, then dotted with many rows. */
typedef struct {
    int8_t *w;            /* K signed values */
    int16_t *sc, *mn;     /* K/16 scales and minimums */
    float *d, *dmin;      /* K/256 block scales */
    int64_t K;
    int has_min;
} gr_tiled_row;

int gr_tiled_supported(int32_t type);
size_t gr_tiled_row_bytes(int64_t K);
gr_tiled_row gr_tiled_decode(int32_t type, int64_t K, const void *w_row, void *mem);
float gr_tiled_dot_row(const gr_tiled_row *r, const void *act);   /* act: K/256 Q8_K blocks */
void gr_tiled_init(int use_simd);
void *gr_tiled_scratch(const gr_job *job, size_t used);
/* MUL_MAT_ID's routing index after its converted rows: rows per expert, where
 * each expert's run starts, and the (slot, token) pairs grouped by expert */
size_t gr_mmid_index_bytes(const gr_node *n);
/* MUL_MAT_ID with K-quant experts: per-thread scratch after the index (one
 * decoded row, and with SIMD kernels a chunk of rows in K-panel layout) */
size_t gr_mmid_thread_bytes(const gr_node *n);

/* The same sums for runs of eight activation rows at once ("K panels", AVX2):
 * the eight rows' Q8_K blocks interleaved per block (gr_kpanel_put), weight
 * rows decoded into unsigned codes with ready-made scale vectors
 * (gr_kpanel_decode, GR_KROW_BYTES per block plus two floats), and
 * gr_kpanel_dot giving the eight outputs of one weight row, each bit-equal to
 * gr_tiled_dot_row's. gr_kpanel_available: 0 where the kernel is missing. */
#define GR_KPANEL_BYTES 2368   /* per block: q8 (8 x 256), bsum pairs (256), d (8 x f32), pad */
#define GR_KROW_BYTES 1088     /* per block: codes (256), scale, min and bias vectors (3 x 256), mins and
                                  biases per 16 (2 x 32) */
int gr_kpanel_available(int32_t type);
void gr_kpanel_put(const void *q8k_row, int64_t nb, void *panel, int lane);
void gr_kpanel_decode(int32_t type, int64_t nb, const void *w_row, void *krow, float *d, float *dmin);
void gr_kpanel_dot(int32_t type, int64_t nb, const void *krow, const float *d, const float *dmin,
                   const void *panel, float out[8]);
/* the same eight outputs against eight Q8_K rows read where they are (no panel) */
void gr_kpanel_dot_rows(int32_t type, int64_t nb, const void *krow, const float *d, const float *dmin,
                        const void *const act[8], float out[8]);

/* Scratch needs, per kernel. */
size_t gr_wsize_mul_mat(const gr_node *n, int nth);
size_t gr_wsize_flash_attn(const gr_node *n, int nth);
size_t gr_wsize_conv(const gr_node *n, int nth);
size_t gr_wsize_conv_transpose(const gr_node *n);

#endif
