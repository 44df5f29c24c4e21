# Declarations of csrc/exec.h (and the few quants.h queries the planner needs).
from libc.stdint cimport int32_t, int64_t, uint32_t

cdef extern from "exec.h" nogil:
    enum:
        GR_EXEC_MAX_SRC
        GR_EXEC_MAX_THREADS

    enum gr_kernel:
        GR_K_NOP, GR_K_DUP, GR_K_BINARY, GR_K_UNARY, GR_K_GLU, GR_K_SCALE, GR_K_GET_ROWS,
        GR_K_SET_ROWS, GR_K_RMS_NORM, GR_K_NORM, GR_K_GROUP_NORM, GR_K_SOFT_MAX,
        GR_K_ROPE, GR_K_MUL_MAT, GR_K_FLASH_ATTN, GR_K_ACC, GR_K_SUM,
        GR_K_SUM_ROWS, GR_K_CUMSUM, GR_K_ARGMAX, GR_K_REPEAT, GR_K_CONCAT, GR_K_PAD,
        GR_K_ARANGE, GR_K_TRI, GR_K_FILL, GR_K_DIAG_MASK, GR_K_ARGSORT,
        GR_K_MUL_MAT_ID, GR_K_ADD_ID, GR_K_OUT_PROD, GR_K_COUNT_EQUAL, GR_K_SET, GR_K_DIAG,
        GR_K_REPEAT_BACK, GR_K_FWHT, GR_K_SSM_CONV, GR_K_SSM_SCAN, GR_K_IM2COL, GR_K_POOL_1D,
        GR_K_POOL_2D, GR_K_UPSCALE, GR_K_ROLL, GR_K_PAD_REFLECT_1D, GR_K_TIMESTEP_EMBEDDING,
        GR_K_RWKV_WKV6, GR_K_RWKV_WKV7, GR_K_SOLVE_TRI, GR_K_GATED_DELTA_NET,
        GR_K_GET_ROWS_BACK, GR_K_SOFT_MAX_BACK, GR_K_RMS_NORM_BACK, GR_K_CROSS_ENTROPY, GR_K_OPT_STEP,
        GR_K_WIN_PART, GR_K_GET_REL_POS, GR_K_ADD_REL_POS, GR_K_CONV, GR_K_CONV_2D_DW,
        GR_K_CONV_TRANSPOSE, GR_K_IM2COL_3D, GR_K_COL2IM_1D, GR_K_IM2COL_BACK, GR_K_POOL_2D_BACK,
        GR_K_LIGHTNING_INDEXER, GR_K_DSV4_HC_COMB, GR_K_DSV4_HC_PRE, GR_K_DSV4_HC_POST, GR_K_ADD_Q, GR_K_COUNT

    enum gr_unop:
        GR_UN_SQR, GR_UN_SQRT, GR_UN_LOG, GR_UN_SIN, GR_UN_COS, GR_UN_LEAKY_RELU, GR_UN_CLAMP

    ctypedef struct gr_tensor:
        char *data
        int32_t type
        int64_t ne[4]
        int64_t nb[4]

    ctypedef struct gr_node:
        int32_t kernel
        int32_t sub
        int32_t index
        int32_t n_src
        int32_t op_params[16]
        int64_t iparams[4]
        gr_tensor dst
        gr_tensor src[7]
        size_t wsize

    ctypedef struct gr_exec_status:
        int32_t code
        int32_t node
        char msg[240]

    ctypedef struct gr_pool:
        pass

    gr_pool *ggmlrpc_pool_new(int n_threads)
    void ggmlrpc_pool_free(gr_pool *pool)
    int ggmlrpc_pool_threads(const gr_pool *pool)
    int ggmlrpc_exec_run(gr_pool *pool, const gr_node *nodes, int n_nodes,
                         void *wdata, size_t wsize, gr_exec_status *status, const int *cancel)
    size_t ggmlrpc_exec_wsize(const gr_node *node, int n_threads)
    int ggmlrpc_exec_simd_level()
    int ggmlrpc_exec_set_simd(int enable)
    int ggmlrpc_exec_family()
    int ggmlrpc_exec_set_family(int family)
    int ggmlrpc_exec_vec_lanes()

cdef extern from "quants.h" nogil:
    ctypedef void (*ggmlrpc_to_float_fn)(const void *src, float *dst, int64_t n)
    ctypedef void (*ggmlrpc_from_float_fn)(const float *src, void *dst, int64_t n)
    ctypedef void (*ggmlrpc_vec_dot_fn)(int64_t n, float *s, const void *w_row, const void *act_row)
    ggmlrpc_to_float_fn ggmlrpc_get_to_float(uint32_t type)
    ggmlrpc_from_float_fn ggmlrpc_get_from_float(uint32_t type)
    ggmlrpc_vec_dot_fn ggmlrpc_get_vec_dot(uint32_t weight_type)
    int ggmlrpc_vec_dot_type(uint32_t weight_type)
