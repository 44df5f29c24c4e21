# Declarations of csrc/rpc.h for Cython.
from libc.stdint cimport uint8_t, uint32_t, int32_t, uint64_t, int64_t

cdef extern from "rpc.h" nogil:
    ctypedef struct rpc_tensor:
        uint64_t id
        uint32_t type
        uint64_t buffer
        uint32_t ne[4]
        uint32_t nb[4]
        uint32_t op
        int32_t op_params[16]
        int32_t flags
        uint64_t src[10]
        uint64_t view_src
        uint64_t view_offs
        uint64_t data
        char name[64]
        int32_t use_count

    enum:
        GR_OK
        GR_ERR_TYPE
        GR_ERR_BLOCK
        GR_ERR_OVERFLOW
        GR_ERR_RANGE
        GR_ERR_DATA_NO_BUF
        GR_FNV_OFFSET

    int64_t ggmlrpc_blck_size(uint32_t type)
    size_t ggmlrpc_type_size(uint32_t type)
    uint64_t ggmlrpc_nbytes(uint32_t type, const uint32_t ne[4], const uint32_t nb[4], int *overflow)
    int ggmlrpc_tensor_check_shape(const rpc_tensor *t, uint64_t *nbytes)
    int ggmlrpc_range_inside(uint64_t data, uint64_t nbytes, uint64_t base, uint64_t size)
    uint64_t ggmlrpc_fnv1a(const uint8_t *data, size_t len, uint64_t hash)
    int ggmlrpc_recv_all(int fd, void *dst, size_t n, int timeout_ms)
    int ggmlrpc_send_all(int fd, const void *src, size_t n, int timeout_ms)
    int ggmlrpc_send2(int fd, const void *a, size_t na, const void *b, size_t nb, int timeout_ms)
    int ggmlrpc_discard(int fd, uint64_t n, int timeout_ms)
    void *ggmlrpc_host_alloc(size_t size)
    void ggmlrpc_host_free(void *ptr, size_t size)
