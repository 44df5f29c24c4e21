/* The scratch layout of MUL_MAT and MUL_MAT_ID (matmul.h): computed here once,
 * for the planner's wsize and for the kernels' offsets alike. */
#include "common/checked.h"
#include "cpu/job.h"
#include "cpu/kernels.h"
#include "cpu/matmul/matmul.h"

static inline size_t r64(size_t x) { return gr_sz_round(x, 64); }

/* a chunk of K-quant weight rows in kernel layout, one thread's */
static size_t krow_chunk_bytes(int64_t K) {
    return gr_sz_mul3(GR_MM_CHUNK_ROWS, gr_sz(K / 256), GR_KROW_BYTES + 8);
}

/* Q4_0 weights, activations converted here to Q8_0 (so never holding -128 unless
 * the input is not finite), one dot product per output: the activation rows'
 * per-block lane sums are kept (ggmlrpc_q4_0_act_sums), except where four weight
 * rows go at a time (AVX-512 VNNI), which needs none and is faster */
static int q4_sums_kind(const gr_node *n) {
    return n->kernel == GR_K_MUL_MAT && n->src[0].type == GR_TYPE_Q4_0 && n->iparams[0] == GR_TYPE_Q8_0 &&
           n->src[1].type != GR_TYPE_Q8_0 && n->iparams[1] == GR_MM_VEC_DOT &&
           !ggmlrpc_get_vec_dot_rows4(GR_TYPE_Q4_0);
}

/* Small batches (2 to GR_MM_SMALL_BATCH - 1 columns) of Q8_0/Q4_0/Q5_0 weights by
 * the four-row kernel, activations converted here: the per-block sums of its
 * offset form (ggmlrpc_4xn_act_sums), where this CPU has that kernel */
static int sums_4xn_kind(const gr_node *n) {
    const uint32_t t = (uint32_t)n->src[0].type;
    const int order = (int)n->iparams[1];
    return n->kernel == GR_K_MUL_MAT && n->iparams[0] == GR_TYPE_Q8_0 && n->src[1].type != GR_TYPE_Q8_0 &&
           gr_nrows(&n->src[1]) >= 2 && gr_nrows(&n->src[1]) < GR_MM_SMALL_BATCH &&
           (order == GR_MM_VEC_DOT || (order == GR_MM_Q0_GEMM && ggmlrpc_get_vec_dot_gemm(t) == ggmlrpc_get_vec_dot(t))) &&
           ggmlrpc_get_vec_dot_4xn_sums(t);
}

/* Prompt-sized Q8_0/Q4_0 products: every run of eight columns of one src1 batch
 * is also written as a panel (ggmlrpc_panel_*); bytes of one panel block, or 0
 * where the node takes no panels */
static size_t panel_kind(const gr_node *n) {
    const int32_t vdt = (int32_t)n->iparams[0];
    if (n->kernel != GR_K_MUL_MAT || (vdt != GR_TYPE_Q8_0 && vdt != GR_TYPE_Q8_1) || n->src[1].type == vdt ||
        n->src[1].ne[1] < 8)
        return 0;
    /* panels sum in one accumulator: vec_dot's order for Q4_0/Q8_0, only the
     * GEMM order for IQ4_NL */
    if (n->iparams[1] != (n->src[0].type == GR_TYPE_IQ4_NL ? GR_MM_Q0_GEMM : GR_MM_VEC_DOT)) return 0;
    /* small batches on AVX-512 VNNI: the 4xn kernels, with no panels */
    const uint32_t t = (uint32_t)n->src[0].type;
    if (n->src[1].ne[1] < GR_MM_SMALL_BATCH && ggmlrpc_cpanel_available(t) && ggmlrpc_get_vec_dot_4xn(t)) return 0;
    return ggmlrpc_panel_bytes((uint32_t)n->src[0].type);
}

/* Q8_0/Q4_0/Q5_0/IQ4_NL prompts where the column-panel kernels run (AVX-512 VNNI):
 * every src1 batch's columns as panels of sixteen (ggmlrpc_cpanel_*), then per
 * thread a chunk of decoded weight rows */
static int cpanel_kind(const gr_node *n) {
    return panel_kind(n) && ggmlrpc_cpanel_available((uint32_t)n->src[0].type);
}

/* K-quant weights (ggml's tiled order), 8+ columns converted here to Q8_K: the
 * same panels (gr_kpanel_*), then per thread a chunk of weight rows in kernel
 * layout */
static int kpanel_kind(const gr_node *n) {
    return n->kernel == GR_K_MUL_MAT && n->iparams[1] == GR_MM_TILED && n->iparams[0] == GR_TYPE_Q8_K &&
           n->src[1].type != GR_TYPE_Q8_K && n->src[1].ne[1] >= 8 && gr_kpanel_available(n->src[0].type);
}

/* MUL_MAT_ID, K-quant experts: chunks of an expert's rows in K-panel layout */
static int mmid_kpanel_kind(const gr_node *n) {
    return n->iparams[1] && gr_kpanel_available(n->src[0].type) && n->iparams[0] == GR_TYPE_Q8_K;
}

gr_mm_scratch gr_mm_scratch_layout(const gr_node *n, int nth) {
    /* every size below comes from client shapes: checked arithmetic (common/checked.h),
     * an overflow saturates and the planner refuses the graph */
    gr_mm_scratch L = {0};
    const gr_tensor *s0 = &n->src[0], *s1 = &n->src[1];
    const int64_t K = s0->ne[0];
    const size_t T = gr_sz(nth), batches = gr_sz_mul(gr_sz(s1->ne[2]), gr_sz(s1->ne[3]));
    /* runs of eight columns of one src1 batch: the panels a node writes */
    const size_t groups = gr_sz_mul(gr_sz(s1->ne[1] / 8), batches);
    const size_t conv_rows = s1->type == n->iparams[0] ? 0 : gr_sz_mul(gr_sz(n->iparams[2]), gr_sz(gr_nrows(s1)));
    L.conv = r64(conv_rows);
    L.q4_sums = q4_sums_kind(n) ? GR_SUMS_Q4_0 : sums_4xn_kind(n) ? GR_SUMS_4XN : 0;
    L.sums = L.conv;
    L.sums_bytes = L.q4_sums ? gr_sz_mul3(gr_sz(gr_nrows(s1)), gr_sz(K / 32), 4 * (size_t)gr_sums_stride(L.q4_sums)) : 0;
    size_t end = gr_sz_add(L.conv, L.sums_bytes);
    if (n->kernel == GR_K_MUL_MAT_ID) {
        const size_t n_as = gr_sz(s0->ne[2]), pairs = gr_sz_mul(gr_sz(n->src[2].ne[0]), gr_sz(n->src[2].ne[1]));
        L.index = end;
        L.pairs = gr_sz_add(L.index, r64(gr_sz_mul3(2, n_as, sizeof(int64_t))));
        L.index_bytes = gr_sz_add(r64(gr_sz_mul3(2, n_as, sizeof(int64_t))), r64(gr_sz_mul(pairs, sizeof(int64_t))));
        L.kpanel = mmid_kpanel_kind(n);
        L.threads = r64(gr_sz_add(L.index, L.index_bytes));
        L.krows = r64(gr_tiled_row_bytes(K));
        L.per_thread = r64(gr_sz_add(L.krows, L.kpanel ? krow_chunk_bytes(K) : 0));
        end = gr_sz_add(L.index, L.index_bytes);
        if (n->iparams[1] == GR_MM_TILED) end = gr_sz_add(L.threads, gr_sz_mul(T, L.per_thread));
    } else if (kpanel_kind(n)) {
        L.kpanel = 1;
        L.panel_block = GR_KPANEL_BYTES;
        L.panels = L.conv;
        L.panels_end = gr_sz_add(L.panels, gr_sz_mul3(groups, gr_sz(K / 256), GR_KPANEL_BYTES));
        L.threads = r64(L.panels_end);
        L.per_thread = r64(krow_chunk_bytes(K));
        end = gr_sz_add(L.threads, gr_sz_mul(T, L.per_thread));
    } else if (cpanel_kind(n)) {
        L.cpanel = 1;
        L.panels = r64(end);
        L.panels_end = gr_sz_add(L.panels, gr_sz_mul(gr_sz_mul3(gr_sz(gr_cpanel_groups(s1->ne[1])), batches, gr_sz(K / 32)),
                                                     GGMLRPC_CPANEL_BYTES));
        L.threads = r64(L.panels_end);
        L.per_thread = gr_sz_mul(GR_MM_CHUNK_ROWS, ggmlrpc_cpanel_row_bytes(K / 32));
        end = gr_sz_add(L.threads, gr_sz_mul(T, L.per_thread));
    } else {
        L.panel_block = panel_kind(n);
        if (L.panel_block) {
            L.panels = r64(end);
            L.panels_end = gr_sz_add(L.panels, gr_sz_mul3(groups, gr_sz(K / 32), L.panel_block));
            end = L.panels_end;
        }
        if (n->iparams[1] == GR_MM_TILED) /* no sums, no panels here */
            end = gr_sz_add(end, gr_sz_mul(T, gr_tiled_row_bytes(K)));
    }
    if (n->kernel == GR_K_MUL_MAT && n->iparams[1] == GR_MM_TILED) {
        /* also where K panels were planned but the run has no room for them */
        L.tiled = L.conv;
        L.tiled_bytes = gr_tiled_row_bytes(K);
    }
    L.total = gr_sz_add(end, 64);
    return L;
}

size_t gr_ws_mul_mat(const gr_node *n, int nth) { return gr_mm_scratch_layout(n, nth).total; }
