# Declarations of csrc/cpu/exec.h (and the few quants.h queries the planner needs).
# No kernel, op or error number is copied here: executor.pyx reads them all from
# ggmlrpc_exec_names, which C generates from csrc/cpu/kernels.def and names.def.
from libc.stdint cimport int32_t, int64_t, uint32_t

cdef extern from "cpu/exec.h" nogil:
    enum:
        GR_EXEC_MAX_SRC
        GR_EXEC_MAX_THREADS

    ctypedef struct gr_named_int:
        const char *group
        const char *scope
        const char *name
        int32_t value

    const gr_named_int ggmlrpc_exec_names[]

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
        gr_tensor src[GR_EXEC_MAX_SRC]
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
    ctypedef struct gr_resume:
        int node, phase, mid
        int64_t chunk
        int64_t slice_ns
    int ggmlrpc_exec_run(gr_pool *pool, const gr_node *nodes, int n_nodes,
                         void *wdata, size_t wsize, gr_exec_status *status, const int *cancel,
                         gr_resume *at)
    size_t ggmlrpc_exec_wsize(const gr_node *node, int n_threads)
    int ggmlrpc_exec_simd_level()
    int ggmlrpc_exec_set_simd(int enable)
    int ggmlrpc_exec_family()
    int ggmlrpc_exec_set_family(int family)
    int ggmlrpc_exec_zen()
    int ggmlrpc_exec_set_zen(int zen)
    int ggmlrpc_exec_vec_lanes()

cdef extern from "cpu/quants/quants.h" nogil:
    ctypedef void (*ggmlrpc_to_float_fn)(const void *src, float *dst, int64_t n)
    ctypedef void (*ggmlrpc_from_float_fn)(const float *src, void *dst, int64_t n)
    ctypedef void (*ggmlrpc_vec_dot_fn)(int64_t n, float *s, const void *w_row, const void *act_row)
    ggmlrpc_to_float_fn ggmlrpc_get_to_float(uint32_t type)
    ggmlrpc_from_float_fn ggmlrpc_get_from_float(uint32_t type)
    ggmlrpc_vec_dot_fn ggmlrpc_get_vec_dot(uint32_t weight_type)
    int ggmlrpc_vec_dot_type(uint32_t weight_type)

cdef extern from "cpu/peers.h" nogil:
    enum:
        GR_PEERS_MAX
    ctypedef struct gr_peers:
        int32_t fds[GR_PEERS_MAX]
        uint32_t tag
        int32_t failed
        int32_t timeout_ms
        int32_t spin_us
        int64_t ns
