/* What the matmul files share (csrc/cpu/matmul/): ggml's tiled K-quant order and
 * the K panels (tiled.c), and the scratch layout of MUL_MAT and MUL_MAT_ID
 * (scratch.c). Internal to csrc/cpu/.
 */
#ifndef GGMLRPC_CPU_MATMUL_H
#define GGMLRPC_CPU_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/job.h"

/* ggml's tiled K-quant GEMM order (tiled.c): Q2_K..Q6_K and IQ4_XS weights
 * with Q8_K activations, for 8 or more activation rows. A weight row is decoded
 * once into gr_tiled_row_bytes(K) of scratch, then dotted with many rows. */
typedef struct {
    int8_t *w;            /* K signed values */
    int16_t *sc, *mn;     /* K/16 scales and minimums */
    float *d, *dmin;      /* K/256 block scales */
    int64_t K;
    int has_min;
} gr_tiled_row;

size_t gr_tiled_row_bytes(int64_t K);
gr_tiled_row gr_tiled_decode(int32_t type, int64_t K, const void *w_row, void *mem);
float gr_tiled_dot_row(const gr_tiled_row *r, const void *act);   /* act: K/256 Q8_K blocks */
void gr_tiled_init(int use_simd, int family);   /* family: enum gr_family */
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

/* The same outputs on AVX-512 VNNI CPUs ("weight panels", tiled.c): a chunk of up
 * to 16 weight rows decoded side by side, one row per int32 lane (gr_wpanel_decode,
 * GR_WPANEL_BYTES per block), then dotted with Q8_K activation rows read where they
 * are, sixteen outputs of a column at a time (gr_wpanel_gemm), each bit-equal to
 * gr_tiled_dot_row's. gr_wpanel_available: 0 where the kernel is missing or off. */
#define GR_WPANEL_BYTES 6272   /* per block: codes (16 x 256), scales (16 x 64), bias and min pairs
                                  (2 x 512), d and dmin (2 x 64) */
int gr_wpanel_available(int32_t type);
void gr_wpanel_decode(int32_t type, int64_t nb, const void *w0, size_t row_stride, int rows, void *panel);
void gr_wpanel_gemm(int32_t type, int64_t nb, const void *panel, const void *act0, size_t act_stride,
                    int64_t ncols, float *out0, size_t out_stride, int rows);

/* Q8_0/Q4_0/Q5_0 products of fewer columns than this take the 4xn kernels
 * (ggmlrpc_vec_dot_4xn) on AVX-512 VNNI CPUs, not column panels: faster there
 * (4096 x 11264 Q8_0, 8 columns, one thread: about 12 ms against 16 to 19 ms; the
 * panels cost the same from 8 to 16 columns). */
#define GR_MM_SMALL_BATCH 12

/* Weight rows per chunk a thread decodes into K-panel layout (MUL_MAT) or takes of
 * an expert's run (MUL_MAT_ID). */
#define GR_MM_CHUNK_ROWS 16

/* The activation sums a MUL_MAT node keeps: Q4_0's one-column kernel's
 * (ggmlrpc_q4_0_act_sums), or the small-batch kernel's (ggmlrpc_4xn_act_sums). */
#define GR_SUMS_Q4_0 1
#define GR_SUMS_4XN 2

/* int32 slots per activation block of a kind's sums: Q4_0's eight lane sums; the
 * small batches' lane sums and the block's f32 scale (GGMLRPC_4XN_SUMS) */
static inline int64_t gr_sums_stride(int kind) { return kind == GR_SUMS_4XN ? GGMLRPC_4XN_SUMS : 8; }

/* The scratch of a MUL_MAT or MUL_MAT_ID node, one layout for both (offsets in
 * bytes from wdata, each part 64-byte aligned):
 *
 *   [0, conv)                   src1 rows converted to the vec_dot type
 *                               (iparams[2] bytes each; 0 when already that type)
 *   [sums, +sums_bytes)         MUL_MAT, Q4_0 x Q8_0 in vec_dot order, or
 *                               Q8_0/Q4_0/Q5_0 small batches (AVX-512 VNNI): the
 *                               activation rows' per-block lane sums
 *   [panels, panels_end)        runs of eight columns as panels: panel_block bytes
 *                               per block (ggmlrpc_panel_bytes, or GR_KPANEL_BYTES
 *                               for the K-quants; 0: no panels); or, with cpanel,
 *                               each src1 batch's columns in column panels of
 *                               sixteen (GGMLRPC_CPANEL_BYTES a block)
 *   [index, +index_bytes)       MUL_MAT_ID: rows per expert and where each
 *                               expert's run starts (2 n_as int64), then at
 *                               `pairs` the (slot, token) pairs grouped by expert
 *   [threads, +nth*per_thread)  per thread: a decoded weight row (tiled order),
 *                               and at `krows` inside it a chunk of weight rows
 *                               in K-panel layout (MUL_MAT with K panels: only
 *                               the chunk; with column panels: the chunk's rows
 *                               decoded, ggmlrpc_cpanel_row_bytes each)
 *   [tiled, +nth*tiled_bytes)   MUL_MAT in tiled order without K panels: a
 *                               decoded weight row per thread, after the
 *                               converted rows
 *
 * The kinds depend on the SIMD kernels in use, which can change between planning
 * and running: a kernel takes a part only where the node's wsize holds it
 * (gr_mm_scratch_has). */
typedef struct gr_mm_scratch {
    size_t conv;
    int q4_sums;              /* MUL_MAT keeps activation sums: GR_SUMS_* (0: none) */
    size_t sums, sums_bytes;
    size_t panel_block;       /* 0: no panels */
    int kpanel;               /* the panels are K panels (and threads hold K-panel rows) */
    int cpanel;               /* the panels are column panels (and threads hold decoded rows) */
    size_t panels, panels_end;
    size_t index, pairs, index_bytes;
    size_t threads, per_thread, krows;
    size_t tiled, tiled_bytes;
    size_t total;             /* the node's wsize */
} gr_mm_scratch;

/* column panels a src1 batch of n columns takes (the last one short where
 * GGMLRPC_CPANEL_COLS does not divide n) */
static inline int64_t gr_cpanel_groups(int64_t n) { return (n + GGMLRPC_CPANEL_COLS - 1) / GGMLRPC_CPANEL_COLS; }

/* the layout of node n (MUL_MAT or MUL_MAT_ID) with nth threads */
gr_mm_scratch gr_mm_scratch_layout(const gr_node *n, int nth);

/* one src1 row (K floats-like elements) into the vec_dot type vdt at dst */
static inline void gr_mm_convert_row(int32_t vdt, const gr_tensor *s1, const char *src, char *dst, int64_t K,
                                     ggmlrpc_from_float_fn from_float) {
    if (vdt == GR_TYPE_F32) gr_load_f32(s1->type, src, s1->nb[0], (float *)dst, K);
    else if (vdt == GR_TYPE_F16) gr_vec.fp32_to_fp16(K, (const float *)src, (uint16_t *)dst);
    else from_float((const float *)src, dst, K);
}

/* whether the node's scratch holds the layout's end `end` (planned with it) */
static inline int gr_mm_scratch_has(const gr_node *n, size_t end) { return n->wsize >= end; }

#endif
