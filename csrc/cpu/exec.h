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

/* Kernels (kernels.def). The compiler (Python) picks one per node after checking
 * types and shapes; `sub` selects a variant inside a kernel (which binary op, which
 * unary op, RMS_NORM or L2_NORM...: GR_V_* below). */
enum gr_kernel {
#define GR_KERNEL(NAME, fn, phases, wsize) GR_K_##NAME,
#include "cpu/kernels.def"
    GR_K_COUNT
};

/* gr_node.sub of kernels with variants: GR_V_<KERNEL>_<NAME> */
enum gr_variant {
#define GR_VARIANT(KERNEL, NAME, value) GR_V_##KERNEL##_##NAME = value,
#include "cpu/kernels.def"
};

enum gr_binop {
#define GR_BINOP(NAME, value) GR_BIN_##NAME = value,
#include "cpu/names.def"
};

/* Element-wise float functions; the first 22 are ggml_unary_op in order. */
enum gr_unop {
#define GR_UNOP(NAME, value) GR_UN_##NAME = value,
#include "cpu/names.def"
};

/* The ggml x86 builds whose summation orders the kernels reproduce. */
enum gr_family {
#define GR_FAMILY(NAME, value, py) GR_FAMILY_##NAME = value,
#include "cpu/names.def"
};

/* Modes a planner writes into gr_node.iparams (DUP, MUL_MAT, FLASH_ATTN). */
enum gr_const {
#define GR_CONST(GROUP, NAME, cname, value) cname = value,
#include "cpu/names.def"
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
#define GR_EXEC_ERROR(NAME, value) GR_EXEC_##NAME = value,
#include "cpu/names.def"
};

typedef struct gr_exec_status {
    int32_t code;             /* enum gr_exec_error */
    int32_t node;             /* gr_node.index of the failing node, -1 if none */
    char msg[240];
} gr_exec_status;

typedef struct gr_pool gr_pool;

/* The bits of a run's cancel word. */
enum { GR_STOP_CANCEL = 1, GR_STOP_YIELD = 2 };

/* A pool of n_threads - 1 workers (the caller is thread 0). NULL on failure. */
gr_pool *ggmlrpc_pool_new(int n_threads);
void ggmlrpc_pool_free(gr_pool *pool);
int ggmlrpc_pool_threads(const gr_pool *pool);

/* Where a run resumes: set node (phase 0, mid 0) before the first call; a run that
 * yields fills it in. A yield comes after a node, or inside a long node between its
 * work chunks (mid: the phase's shared chunk counter and every thread's position in
 * its own rows are kept here), so the rest of the node is the same chunks computed
 * the same way. slice_ns: a yield request is honoured only once the run has held the
 * pool that long (0: at once). */
typedef struct {
    int node, phase, mid;
    int64_t chunk;
    int64_t slice_ns;
    int64_t cursor[GR_EXEC_MAX_THREADS];
} gr_resume;

/* Run nodes from at->node on with the pool's threads. wdata is scratch of wsize bytes
 * (at least the largest node->wsize; 64-byte aligned): the plan's own, untouched by
 * other runs while this one is paused. Runs are serialized per
 * pool. cancel (may be NULL) is read before every work chunk and at the end of
 * every node phase: once GR_STOP_CANCEL is set the run stops there with
 * GR_EXEC_ECANCELED (a client that went away, a server shutting down); once
 * GR_STOP_YIELD is set it stops at the next node end or work chunk with
 * GR_EXEC_EYIELD and *at where to resume (another run waits for the pool). Returns 0,
 * or an enum gr_exec_error with *status filled in. */
int ggmlrpc_exec_run(gr_pool *pool, const gr_node *nodes, int n_nodes,
                     void *wdata, size_t wsize, gr_exec_status *status, const volatile int *cancel,
                     gr_resume *at);

/* Scratch bytes a node needs with n_threads threads (0 when it needs none).
 * The compiler calls this after filling in the node. */
size_t ggmlrpc_exec_wsize(const gr_node *node, int n_threads);

/* Every named integer the Python planner shares with the kernels, generated from
 * kernels.def and names.def, ended by a row whose group is NULL. group: "KERNEL",
 * "VARIANT", "BINOP", "UNOP", "FAMILY", "EXEC_ERROR" or "CONST"; scope: the kernel
 * of a VARIANT row, the group of a CONST row, NULL elsewhere. */
typedef struct gr_named_int {
    const char *group;
    const char *scope;
    const char *name;
    int32_t value;
} gr_named_int;
extern const gr_named_int ggmlrpc_exec_names[];

/* 1 when SIMD kernels of the current family are in use on this CPU, 0 for the
 * portable twins. */
int ggmlrpc_exec_simd_level(void);
/* Force the portable kernels (tests compare both paths); returns the old level. */
int ggmlrpc_exec_set_simd(int enable);
/* The ggml x86 build whose summation orders the kernels reproduce (enum gr_family,
 * names.def: 1 AVX2, 2 AVX-512, 3 AVX-512 with BF16 products, 4 also with FP16
 * arithmetic); by default the one a native build on this CPU is. set_family(0)
 * restores that; both return the old one. */
int ggmlrpc_exec_family(void);
int ggmlrpc_exec_set_family(int family);
/* Whether that build was tuned for AMD Zen (GCC keeps its scalar multiply-add chains
 * unfused there, fuses them under generic and Intel tunings); by default whether this
 * CPU is a Zen. set_zen(-1) restores that; both return the old one. */
int ggmlrpc_exec_zen(void);
int ggmlrpc_exec_set_zen(int zen);
/* the family's vector width in floats (8 or 16): ggml's prompt-time GEMM needs K % lanes == 0 */
int ggmlrpc_exec_vec_lanes(void);

#ifdef __cplusplus
}
#endif
#endif
