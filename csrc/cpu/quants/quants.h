/* ggml's quantized formats: fp16/bf16 conversion, row (de)quantization and the
 * quantized dot products that GET_ROWS, CPY/SET_ROWS and MUL_MAT run on the CPU.
 * Plain C: no Python.h.
 *
 * Every function here is thread-safe, allocates nothing and works on one row or
 * one chunk of a row: `n` counts elements and must be a multiple of the type's
 * block size (ggmlrpc_blck_size in rpc.h), which the executor checks once when it
 * plans a node. Pointers need no alignment beyond that of their element type
 * (blocks are byte arrays; every SIMD load is unaligned).
 *
 * Numerics follow ggml's CPU backend as built for an x86-64 host with AVX2/F16C:
 *  - quantize_row (from_float) is bit-exact with what that backend writes, which
 *    for Q8_0 and Q8_1 is its AVX path (multiplier 127/amax, round half to even),
 *    not ggml-quants.c's reference (1/d, round half away from zero) that gguf-py
 *    mirrors; quantize_row_ref gives the latter;
 *  - fp16 conversion behaves like the F16C instructions everywhere, NaNs included
 *    (they come out quiet with their top payload bits kept), whether or not this
 *    build or this CPU has F16C;
 *  - vec_dot: the AVX2 kernels (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 *    Q2_K..Q6_K, IQ4_NL, IQ4_XS, MXFP4) sum in the lane order of ggml's AVX2
 *    kernels and give the same floats as a native AVX2 ggml build; the portable
 *    kernels (and the other types) sum per block in ggml's generic order and
 *    agree to float rounding. ggml's tinyBLAS path (MUL_MAT with 2+ activation
 *    columns) sums Q4_0/Q5_0/Q8_0/IQ4_NL in one accumulator, blocks in order
 *    (ggmlrpc_get_vec_dot_gemm), and F32/F16/BF16 in orders of its own (the
 *    executor mirrors F32/F16); ggml on AVX-512 hosts sums in other orders
 *    again: those agree to float rounding.
 */
#ifndef GGMLRPC_QUANTS_H
#define GGMLRPC_QUANTS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ggml_type ids (docs/protocol.md, "Tensor types") used by this library. */
enum gr_type {
    GR_TYPE_F32 = 0,
    GR_TYPE_F16 = 1,
    GR_TYPE_Q4_0 = 2,
    GR_TYPE_Q4_1 = 3,
    GR_TYPE_Q5_0 = 6,
    GR_TYPE_Q5_1 = 7,
    GR_TYPE_Q8_0 = 8,
    GR_TYPE_Q8_1 = 9,
    GR_TYPE_Q2_K = 10,
    GR_TYPE_Q3_K = 11,
    GR_TYPE_Q4_K = 12,
    GR_TYPE_Q5_K = 13,
    GR_TYPE_Q6_K = 14,
    GR_TYPE_Q8_K = 15,
    GR_TYPE_IQ2_XXS = 16,
    GR_TYPE_IQ2_XS = 17,
    GR_TYPE_IQ3_XXS = 18,
    GR_TYPE_IQ1_S = 19,
    GR_TYPE_IQ4_NL = 20,
    GR_TYPE_IQ3_S = 21,
    GR_TYPE_IQ2_S = 22,
    GR_TYPE_IQ4_XS = 23,
    GR_TYPE_IQ1_M = 29,
    GR_TYPE_BF16 = 30,
    GR_TYPE_TQ1_0 = 34,
    GR_TYPE_TQ2_0 = 35,
    GR_TYPE_MXFP4 = 39,
    GR_TYPE_NVFP4 = 40,
    GR_TYPE_Q1_0 = 41,
    GR_TYPE_Q2_0 = 42,
};

#define GR_QK_K 256   /* elements per K-quant super-block */

/* ---- block layouts (ggml-common.h); all sizes pinned in quants.c ---------- */

typedef uint16_t gr_fp16_t;   /* IEEE binary16 bits */
typedef uint16_t gr_bf16_t;   /* bfloat16 bits */

/* | d f16 | qs u8[16] |: x[j] = d*((qs[j]&15)-8), x[j+16] = d*((qs[j]>>4)-8) */
typedef struct { gr_fp16_t d; uint8_t qs[16]; } block_q4_0;
/* | d f16 | m f16 | qs u8[16] |: x = d*q + m */
typedef struct { gr_fp16_t d; gr_fp16_t m; uint8_t qs[16]; } block_q4_1;
/* | d f16 | qh u8[4] | qs u8[16] |: bit j of qh is the 5th bit of element j */
typedef struct { gr_fp16_t d; uint8_t qh[4]; uint8_t qs[16]; } block_q5_0;
typedef struct { gr_fp16_t d; gr_fp16_t m; uint8_t qh[4]; uint8_t qs[16]; } block_q5_1;
/* | d f16 | qs i8[32] | */
typedef struct { gr_fp16_t d; int8_t qs[32]; } block_q8_0;
/* | d f16 | s f16 = d*sum(qs) | qs i8[32] | */
typedef struct { gr_fp16_t d; gr_fp16_t s; int8_t qs[32]; } block_q8_1;
/* | e u8 (E8M0) | qs u8[16] (E2M1 indices) | */
typedef struct { uint8_t e; uint8_t qs[16]; } block_mxfp4;
/* | d u8[4] (UE4M3, one per 16 elements) | qs u8[32] (E2M1 indices) | */
typedef struct { uint8_t d[4]; uint8_t qs[32]; } block_nvfp4;
/* | d f16 | qs u8[16] |: bit j set -> +d, clear -> -d (128 elements) */
typedef struct { gr_fp16_t d; uint8_t qs[16]; } block_q1_0;
/* | d f16 | qs u8[16] |: 2-bit codes {0,1,2,3} -> {-1,0,1,2} * d (64 elements) */
typedef struct { gr_fp16_t d; uint8_t qs[16]; } block_q2_0;
/* | scales u8[16] (4-bit scale | 4-bit min) | qs u8[64] | d f16 | dmin f16 | */
typedef struct { uint8_t scales[16]; uint8_t qs[64]; gr_fp16_t d; gr_fp16_t dmin; } block_q2_K;
/* | hmask u8[32] | qs u8[64] | scales u8[12] (16 six-bit) | d f16 | */
typedef struct { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; gr_fp16_t d; } block_q3_K;
/* | d f16 | dmin f16 | scales u8[12] (8 six-bit scales, 8 six-bit mins) | qs u8[128] | */
typedef struct { gr_fp16_t d; gr_fp16_t dmin; uint8_t scales[12]; uint8_t qs[128]; } block_q4_K;
/* | d f16 | dmin f16 | scales u8[12] | qh u8[32] | qs u8[128] | */
typedef struct { gr_fp16_t d; gr_fp16_t dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } block_q5_K;
/* | ql u8[128] | qh u8[64] | scales i8[16] | d f16 | */
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; gr_fp16_t d; } block_q6_K;
/* | d f32 | qs i8[256] | bsums i16[16] (sums of 16 qs) | */
typedef struct { float d; int8_t qs[256]; int16_t bsums[16]; } block_q8_K;
/* | d f16 | qs u8[16] |: x = d * kvalues_iq4nl[q] */
typedef struct { gr_fp16_t d; uint8_t qs[16]; } block_iq4_nl;
/* | d f16 | scales_h u16 | scales_l u8[4] | qs u8[128] | (8 six-bit scales - 32) */
typedef struct { gr_fp16_t d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; } block_iq4_xs;
/* | qs u8[48] (5 trits a byte) | qh u8[4] (4 trits a byte) | d f16 | */
typedef struct { uint8_t qs[48]; uint8_t qh[4]; gr_fp16_t d; } block_tq1_0;
/* | qs u8[64] (2-bit codes - 1) | d f16 | */
typedef struct { uint8_t qs[64]; gr_fp16_t d; } block_tq2_0;

/* grid IQ formats (quants_iq.c): lattice indices, sign bits and sub-block scales */
typedef struct { gr_fp16_t d; uint16_t qs[32]; } block_iq2_xxs;
typedef struct { gr_fp16_t d; uint16_t qs[32]; uint8_t scales[8]; } block_iq2_xs;
typedef struct { gr_fp16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t scales[8]; } block_iq2_s;
typedef struct { gr_fp16_t d; uint8_t qs[96]; } block_iq3_xxs;
typedef struct { gr_fp16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t signs[32]; uint8_t scales[4]; } block_iq3_s;
typedef struct { gr_fp16_t d; uint8_t qs[32]; uint16_t qh[8]; } block_iq1_s;
typedef struct { uint8_t qs[32]; uint8_t qh[16]; uint8_t scales[8]; } block_iq1_m;

/* ---- scalar conversions (F16C semantics; round to nearest even) ----------- */

float ggmlrpc_fp16_to_fp32(gr_fp16_t h);
gr_fp16_t ggmlrpc_fp32_to_fp16(float f);
float ggmlrpc_bf16_to_fp32(gr_bf16_t h);
gr_bf16_t ggmlrpc_fp32_to_bf16(float f);   /* ggml: nearest even; NaN -> quiet NaN */

/* ---- rows ---------------------------------------------------------------- */

/* Function shapes the executor can resolve once per node. */
typedef void (*ggmlrpc_to_float_fn)(const void *src, float *dst, int64_t n);
typedef void (*ggmlrpc_from_float_fn)(const float *src, void *dst, int64_t n);
/* *s = dot(w_row, act_row) over n elements; w_row holds n/blck(weight) blocks,
 * act_row n/blck(vec_dot_type) blocks. */
typedef void (*ggmlrpc_vec_dot_fn)(int64_t n, float *s, const void *w_row, const void *act_row);

/* NULL for a type this library cannot convert. The returned kernels use the
 * best SIMD path this CPU has (see ggmlrpc_quants_simd). */
ggmlrpc_to_float_fn ggmlrpc_get_to_float(uint32_t type);
ggmlrpc_from_float_fn ggmlrpc_get_from_float(uint32_t type);
ggmlrpc_vec_dot_fn ggmlrpc_get_vec_dot(uint32_t weight_type);
/* Four weight rows against one activation row (decode), each output summed as the
 * type's vec_dot sums it; NULL where there is none. */
typedef void (*ggmlrpc_vec_dot_rows4_fn)(int64_t n, float *s, const void *const w_rows[4], const void *act_row);
ggmlrpc_vec_dot_rows4_fn ggmlrpc_get_vec_dot_rows4(uint32_t weight_type);
/* Four weight rows against ncols (1 to 8) activation rows (small batches):
 * s[4 * j + r] = dot(w_rows[r], act_rows[j]), each output summed as the type's
 * vec_dot sums it, every weight block loaded and unpacked once for the columns (or
 * for four of them at a time, where the kernel's registers hold no more); NULL
 * where there is none. */
#define GGMLRPC_4XN_COLS 8
typedef void (*ggmlrpc_vec_dot_4xn_fn)(int64_t n, float *s, const void *const w_rows[4],
                                       const void *const act_rows[GGMLRPC_4XN_COLS], int ncols);
ggmlrpc_vec_dot_4xn_fn ggmlrpc_get_vec_dot_4xn(uint32_t weight_type);
/* Q4_0 weights against a Q8_0 activation row whose per-block lane sums
 * (8 int32 per block, ggmlrpc_q4_0_act_sums) were computed once: bit-equal to
 * the Q4_0 vec_dot, fewer steps per weight block. NULL / -1 without AVX2. */
typedef void (*ggmlrpc_vec_dot_sums_fn)(int64_t n, float *s, const void *w_row, const void *act_row,
                                        const int32_t *sums);
ggmlrpc_vec_dot_sums_fn ggmlrpc_get_vec_dot_q4_0_sums(void);
int ggmlrpc_q4_0_act_sums(const void *act_blocks, int32_t *sums, int64_t nb);
/* The small-batch kernel of Q8_0, Q4_0 and Q5_0 weights with the codes' offset
 * (128, 8, 16) moved out of the inner loop: the weight codes go in unsigned, and
 * each activation block's per-lane sums times minus the offset (ggmlrpc_4xn_act_sums,
 * once per activation row: GGMLRPC_4XN_SUMS int32 per block, the eight sums and then
 * the block's scale as f32, so that no weight row converts it again) start each
 * lane's sum. Bit-equal
 * to ggmlrpc_get_vec_dot_4xn's kernel: blocks holding -128 (marked) take its steps.
 * NULL / 0 where there is none. */
#define GGMLRPC_4XN_SUMS 16  /* int32 per activation block: 8 lane sums, the f32 scale, 7 unused */
typedef void (*ggmlrpc_vec_dot_4xn_sums_fn)(int64_t n, float *s, const void *const w_rows[4],
                                            const void *const act_rows[GGMLRPC_4XN_COLS],
                                            const int32_t *const sums[GGMLRPC_4XN_COLS], int ncols);
ggmlrpc_vec_dot_4xn_sums_fn ggmlrpc_get_vec_dot_4xn_sums(uint32_t weight_type);
int ggmlrpc_4xn_act_sums(uint32_t weight_type, const void *act_blocks, int32_t *sums, int64_t nb);

/* The dot product in the order of ggml's prompt-time GEMM for Q4_0, Q5_0, Q8_0
 * and IQ4_NL weights (llamafile's tinyBLAS, 2+ activation rows): one 8-lane
 * accumulator, blocks in order. The vec_dot kernel where that is already its
 * order (all but IQ4_NL); bit-equal to ggml with AVX2 only. */
ggmlrpc_vec_dot_fn ggmlrpc_get_vec_dot_gemm(uint32_t weight_type);

/* Prompt-time panels: eight Q8_0 (Q8_1 for Q4_1/Q5_1) activation rows interleaved block by block,
 * scales already in F32, for a kernel that unpacks each weight block once for
 * the eight of them. Every output is bit-equal to ggmlrpc_get_vec_dot_gemm's.
 *   panel_bytes: bytes of one block of a panel (all eight rows), 0 where there
 *                is no panel kernel for weight_type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL with
 *                AVX2; IQ4_NL's sums in the GEMM order, see ggmlrpc_get_vec_dot_gemm);
 *   panel_put:   writes activation row `act` (nb blocks) into lane 0..7 of `panel`;
 *   panel_dot:   s[j] = dot(w_row, lane j) for j < 8 over n elements. */
typedef void (*ggmlrpc_panel_dot_fn)(int64_t n, float *s /* (8,) */, const void *w_row, const void *panel);
size_t ggmlrpc_panel_bytes(uint32_t weight_type);
void ggmlrpc_panel_put(uint32_t weight_type, const void *act, int64_t nb, void *panel, int lane);
ggmlrpc_panel_dot_fn ggmlrpc_get_panel_dot(uint32_t weight_type);
/* Column panels: Q8_0, Q4_0, Q5_0 and IQ4_NL prompts on AVX-512 VNNI (quant level
 * 2). Sixteen Q8_0 activation rows laid out lane by lane (GGMLRPC_CPANEL_BYTES a block: scales,
 * codes, the bias that lets unsigned weight codes give signed sums, -128 marks),
 * weight rows decoded once into unsigned codes and float scales
 * (ggmlrpc_cpanel_row_bytes), then two weight rows against the sixteen columns at
 * once: s[j] row a's output for column j, s[16 + j] row b's, each bit-equal to
 * vec_dot's (IQ4_NL: ggmlrpc_get_vec_dot_gemm's), and to ggml's.
 *   cpanel_available: whether the kernels run for weight_type at this level;
 *   cpanel_put:   activation row `act` (nb Q8_0 blocks) into lane 0..15 of `panel`;
 *   cpanel_clear: lanes from..15 to zero (a short last panel: outputs left unused);
 *   cpanel_decode: one weight row into `row`. */
#define GGMLRPC_CPANEL_COLS 16
#define GGMLRPC_CPANEL_BYTES 1152
typedef void (*ggmlrpc_cpanel_dot_fn)(int64_t nb, const void *row_a, const void *row_b, const void *panel,
                                      float *s /* (32,) */);
int ggmlrpc_cpanel_available(uint32_t weight_type);
size_t ggmlrpc_cpanel_row_bytes(int64_t nb);
void ggmlrpc_cpanel_put(uint32_t weight_type, const void *act, int64_t nb, void *panel, int lane);
void ggmlrpc_cpanel_clear(void *panel, int64_t nb, int from);
void ggmlrpc_cpanel_decode(uint32_t weight_type, const void *w_row, int64_t nb, void *row);
ggmlrpc_cpanel_dot_fn ggmlrpc_get_cpanel_dot(uint32_t weight_type);

/* The grid IQ formats (quants_iq.c), for the table of portable kernels in quants.c:
 * dequantize_row (src: n/256 blocks) and vec_dot against Q8_K activations. */
#define GR_IQ_FORMATS(X) X(iq2_xxs) X(iq2_xs) X(iq2_s) X(iq3_xxs) X(iq3_s) X(iq1_s) X(iq1_m)
#define GR_IQ_DECLARE(fmt)                                                                   \
    void gr_dequantize_row_##fmt(const void *src, float *dst, int64_t n);                   \
    void gr_vec_dot_##fmt##_q8_K(int64_t n, float *s, const void *w_row, const void *act_row);
GR_IQ_FORMATS(GR_IQ_DECLARE)
#undef GR_IQ_DECLARE

/* F32 -> K-quants (quants_k.c), ggml's reference quantizers: n/256 blocks out */
void gr_quantize_row_q2_K(const float *src, void *dst, int64_t n);
void gr_quantize_row_q3_K(const float *src, void *dst, int64_t n);
void gr_quantize_row_q4_K(const float *src, void *dst, int64_t n);
void gr_quantize_row_q5_K(const float *src, void *dst, int64_t n);
void gr_quantize_row_q6_K(const float *src, void *dst, int64_t n);

/* The same through a switch; each returns 0, or -1 when the type is not
 * supported or n is not a whole number of blocks (nothing is written then).
 *   dequantize_row: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_K, Q2_K..Q6_K,
 *                   IQ4_NL, IQ4_XS, the grid IQ types, MXFP4, NVFP4, TQ1_0, TQ2_0, Q1_0, Q2_0
 *   quantize_row:   F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q8_K, Q2_K..Q6_K,
 *                   IQ4_NL, MXFP4, NVFP4, TQ1_0, TQ2_0, Q1_0, Q2_0 (ggml's CPU from_float)
 *   quantize_row_ref: as quantize_row, but Q8_0/Q8_1 follow ggml-quants.c */
int ggmlrpc_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);
int ggmlrpc_quantize_row(uint32_t type, const float *src, void *dst, int64_t n);
int ggmlrpc_quantize_row_ref(uint32_t type, const float *src, void *dst, int64_t n);

/* The type ggml's CPU backend converts MUL_MAT activations (src1) to before the
 * dot product with a weight row of weight_type (type_traits_cpu.vec_dot_type):
 *   F32->F32, F16->F16, BF16->BF16,
 *   Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4, NVFP4, Q1_0, Q2_0 -> Q8_0,
 *   Q4_1, Q5_1 -> Q8_1,
 *   Q2_K..Q6_K, IQ4_XS, TQ1_0, TQ2_0 and the grid IQ types -> Q8_K.
 * -1 for types ggml cannot multiply (Q8_1, Q8_K, integers, unknown ids). */
int ggmlrpc_vec_dot_type(uint32_t weight_type);

/* *s = dot of one weight row with one activation row already converted to
 * ggmlrpc_vec_dot_type(weight_type). 0, or -1 (unsupported type, bad n). */
int ggmlrpc_vec_dot(uint32_t weight_type, int64_t n, float *s, const void *w_row, const void *act_row);

/* Which kernels get_* hands out: 0 portable C, 1 AVX2+FMA+F16C, 2 that and the
 * AVX-512 VNNI kernels (rows4 of Q8_0/Q4_0/Q5_0, column panels). With level < 0
 * only reports the current level; otherwise sets it (clamped to what the CPU
 * has) and returns the level in force. Process-wide: meant for tests and
 * benchmarks comparing paths, not to be flipped while kernels run. */
int ggmlrpc_quants_simd(int level);

/* Whether the vec_dot kernels fuse the multiply-adds of ggml's scalar loops (its Q2_0
 * product, the odd last block of IQ4_NL and MXFP4) as a build not tuned for AMD Zen
 * does (1, the default), or keep them unfused as a Zen-tuned one (0). Set by the
 * executor with its kernel family. */
void ggmlrpc_quants_set_fma_chains(int on);

#ifdef __cplusplus
}
#endif

#endif /* GGMLRPC_QUANTS_H */
