/* The CPU graph executor: a flat array of node records run by a team of threads.
 *
 * Cython (ggmlrpc/_native/executor.pyx) turns a validated graph into gr_node
 * records: kernel id, resolved host addresses, ne/nb, op params and the scratch
 * each node needs. ggmlrpc_exec_run() runs the whole array on a thread pool:
 * every thread walks the same nodes, splits each node's rows by its index, and
 * all threads meet at a barrier after every phase of every node. No Python, no
 * allocation and no locks on that path.
 *
 * Errors found while running (a GET_ROWS index out of range...) stop the run at
 * the next barrier; the first one is reported as code + node index + message.
 * Kernels check such data before touching memory, so a failed run never reads or
 * writes outside the tensors the compiler validated. Plain C: no Python.h.
 */
#ifndef GGMLRPC_EXEC_H
#define GGMLRPC_EXEC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GR_EXEC_MAX_SRC 7   /* SSM_SCAN: s, x, dt, A, B, C, ids */
#define GR_EXEC_MAX_THREADS 512

/* One tensor as a kernel sees it: a resolved address and ggml's ne/nb. */
typedef struct gr_tensor {
    char *data;        /* host address of element (0,0,0,0); NULL for an absent source */
    int32_t type;      /* ggml_type */
    int32_t pad_;
    int64_t ne[4];     /* elements per dimension */
    int64_t nb[4];     /* strides in bytes */
} gr_tensor;

/* Kernels. The compiler (Python) picks one per node after checking types and
 * shapes; `sub` selects a variant inside a kernel (which binary op, which unary
 * op, the vec_dot type of a matmul...). */
enum gr_kernel {
    GR_K_NOP = 0,
    GR_K_DUP,            /* DUP / CPY / CONT: element order copy with type conversion */
    GR_K_BINARY,         /* ADD / SUB / MUL / DIV with src1 broadcast; sub = enum gr_binop */
    GR_K_UNARY,          /* UNARY, SQR, SQRT, LOG, SIN, COS, LEAKY_RELU...; sub = enum gr_unop */
    GR_K_GLU,            /* sub = ggml_glu_op */
    GR_K_SCALE,          /* y = x*s + b */
    GR_K_GET_ROWS,
    GR_K_SET_ROWS,
    GR_K_RMS_NORM,       /* sub 1: L2_NORM */
    GR_K_NORM,
    GR_K_GROUP_NORM,
    GR_K_SOFT_MAX,
    GR_K_ROPE,
    GR_K_MUL_MAT,        /* sub = vec_dot type (phase 0 converts src1 into scratch) */
    GR_K_FLASH_ATTN,
    GR_K_ACC,
    GR_K_SUM,
    GR_K_SUM_ROWS,       /* sub 1: MEAN */
    GR_K_CUMSUM,
    GR_K_ARGMAX,
    GR_K_REPEAT,
    GR_K_CONCAT,
    GR_K_PAD,
    GR_K_ARANGE,
    GR_K_TRI,
    GR_K_FILL,
    GR_K_DIAG_MASK,      /* sub 0: -inf, 1: zero */
    GR_K_ARGSORT,        /* sub 1: TOP_K */
    GR_K_MUL_MAT_ID,
    GR_K_ADD_ID,
    GR_K_OUT_PROD,
    GR_K_COUNT_EQUAL,
    GR_K_SET,
    GR_K_DIAG,
    GR_K_REPEAT_BACK,
    GR_K_FWHT,           /* MUL_MAT with the Hadamard hint: src0 is ignored */
    GR_K_SSM_CONV,
    GR_K_SSM_SCAN,
    GR_K_IM2COL,
    GR_K_POOL_1D,
    GR_K_POOL_2D,
    GR_K_UPSCALE,
    GR_K_ROLL,
    GR_K_PAD_REFLECT_1D,
    GR_K_TIMESTEP_EMBEDDING,
    GR_K_RWKV_WKV6,      /* sub 0: RWKV_WKV6, 1: GATED_LINEAR_ATTN */
    GR_K_RWKV_WKV7,
    GR_K_SOLVE_TRI,
    GR_K_GATED_DELTA_NET,
    GR_K_GET_ROWS_BACK,
    GR_K_SOFT_MAX_BACK,
    GR_K_RMS_NORM_BACK,
    GR_K_CROSS_ENTROPY,  /* sub 0: CROSS_ENTROPY_LOSS, 1: its _BACK */
    GR_K_OPT_STEP,       /* sub 0: OPT_STEP_ADAMW, 1: OPT_STEP_SGD */
    GR_K_WIN_PART,       /* sub 0: WIN_PART, 1: WIN_UNPART */
    GR_K_GET_REL_POS,
    GR_K_ADD_REL_POS,
    GR_K_CONV,           /* sub 0: CONV_2D, 1: CONV_3D; iparams[1]: GEMM order possible */
    GR_K_CONV_2D_DW,
    GR_K_CONV_TRANSPOSE, /* sub 0: 1-D, 1: 2-D */
    GR_K_IM2COL_3D,
    GR_K_COL2IM_1D,
    GR_K_IM2COL_BACK,
    GR_K_POOL_2D_BACK,
    GR_K_LIGHTNING_INDEXER,
    GR_K_DSV4_HC_COMB,
    GR_K_DSV4_HC_PRE,
    GR_K_DSV4_HC_POST,
    GR_K_ADD_Q,          /* sub 0: ADD, 1: ADD1, on quantized src0 */
    GR_K_COUNT
};

enum gr_binop { GR_BIN_ADD = 0, GR_BIN_SUB, GR_BIN_MUL, GR_BIN_DIV };

/* Element-wise float functions; the first 22 are ggml_unary_op in order. */
enum gr_unop {
    GR_UN_ABS = 0, GR_UN_SGN, GR_UN_NEG, GR_UN_STEP, GR_UN_TANH, GR_UN_ELU, GR_UN_RELU,
    GR_UN_SIGMOID, GR_UN_GELU, GR_UN_GELU_QUICK, GR_UN_SILU, GR_UN_HARDSWISH,
    GR_UN_HARDSIGMOID, GR_UN_EXP, GR_UN_EXPM1, GR_UN_SOFTPLUS, GR_UN_GELU_ERF, GR_UN_XIELU,
    GR_UN_FLOOR, GR_UN_CEIL, GR_UN_ROUND, GR_UN_TRUNC,
    /* ops of their own in ggml */
    GR_UN_SQR = 32, GR_UN_SQRT, GR_UN_LOG, GR_UN_SIN, GR_UN_COS, GR_UN_LEAKY_RELU, GR_UN_CLAMP
};

typedef struct gr_node {
    int32_t kernel;               /* enum gr_kernel */
    int32_t sub;                  /* kernel variant */
    int32_t index;                /* position in the graph's node list (for errors) */
    int32_t n_src;
    int32_t op_params[16];        /* as on the wire */
    int64_t iparams[4];           /* values the compiler derived (kernel-specific) */
    gr_tensor dst;
    gr_tensor src[GR_EXEC_MAX_SRC];
    size_t wsize;                 /* scratch bytes this node uses (all threads together) */
} gr_node;

/* Run errors. */
enum gr_exec_error {
    GR_EXEC_OK = 0,
    GR_EXEC_EINDEX = 1,      /* a row index out of range (GET_ROWS, SET_ROWS, MUL_MAT_ID...) */
    GR_EXEC_EINTERNAL = 2,   /* a kernel met a state the compiler should have rejected */
    GR_EXEC_ENOMEM = 3,
    GR_EXEC_ECANCELED = 4,   /* *cancel was set: the run stopped after the node phase in progress */
};

typedef struct gr_exec_status {
    int32_t code;             /* enum gr_exec_error */
    int32_t node;             /* gr_node.index of the failing node, -1 if none */
    char msg[240];
} gr_exec_status;

typedef struct gr_pool gr_pool;

/* A pool of n_threads - 1 workers (the caller is thread 0). NULL on failure. */
gr_pool *ggmlrpc_pool_new(int n_threads);
void ggmlrpc_pool_free(gr_pool *pool);
int ggmlrpc_pool_threads(const gr_pool *pool);

/* Run nodes[0..n_nodes) with the pool's threads. wdata is scratch of wsize bytes
 * (at least the largest node->wsize; 64-byte aligned). Runs are serialized per
 * pool. cancel (may be NULL) is read at the end of every node phase: once it is
 * nonzero the run stops there with GR_EXEC_ECANCELED (a client that went away, a
 * server shutting down). Returns 0, or an enum gr_exec_error with *status filled in. */
int ggmlrpc_exec_run(gr_pool *pool, const gr_node *nodes, int n_nodes,
                     void *wdata, size_t wsize, gr_exec_status *status, const volatile int *cancel);

/* Scratch bytes a node needs with n_threads threads (0 when it needs none).
 * The compiler calls this after filling in the node. */
size_t ggmlrpc_exec_wsize(const gr_node *node, int n_threads);

/* 1 when SIMD kernels of the current family are in use on this CPU, 0 for the
 * portable twins. */
int ggmlrpc_exec_simd_level(void);
/* Force the portable kernels (tests compare both paths); returns the old level. */
int ggmlrpc_exec_set_simd(int enable);
/* The ggml x86 build whose summation orders the kernels reproduce (GR_FAMILY_* in
 * exec_impl.h: 1 AVX2, 2 AVX-512, 3 AVX-512 with BF16 products, 4 also with FP16
 * arithmetic); by default the one a native build on this CPU is. set_family(0)
 * restores that; both return the old one. */
int ggmlrpc_exec_family(void);
int ggmlrpc_exec_set_family(int family);
/* the family's vector width in floats (8 or 16): ggml's prompt-time GEMM needs K % lanes == 0 */
int ggmlrpc_exec_vec_lanes(void);

#ifdef __cplusplus
}
#endif
#endif
