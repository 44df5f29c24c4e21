# Declarations of csrc/common/rpc.h for Cython.
from libc.stdint cimport uint8_t, uint32_t, int32_t, uint64_t, int64_t

cdef extern from "common/rpc.h" nogil:
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

    # Request/response layouts, declared so that struct_sizes() can report them.
    ctypedef struct rpc_msg_header:
        uint8_t cmd
        uint64_t size
    ctypedef struct rpc_msg_hello_req:
        uint8_t conn_caps[24]
    ctypedef struct rpc_msg_hello_rsp:
        uint8_t major
        uint8_t minor
        uint8_t patch
        uint8_t pad
        uint8_t conn_caps[24]
    ctypedef struct rpc_msg_alloc_buffer_req:
        uint32_t device
        uint64_t size
    ctypedef struct rpc_msg_alloc_buffer_rsp:
        uint64_t remote_ptr
        uint64_t remote_size
    ctypedef struct rpc_msg_device_req:
        uint32_t device
    ctypedef struct rpc_msg_u64_rsp:
        uint64_t value
    ctypedef struct rpc_msg_buffer_req:
        uint64_t remote_ptr
    ctypedef struct rpc_msg_buffer_clear_req:
        uint64_t remote_ptr
        uint8_t value
    ctypedef struct rpc_msg_set_tensor_hdr:
        rpc_tensor tensor
        uint8_t cache_flag
        uint64_t offset
    ctypedef struct rpc_msg_set_tensor_hash_req:
        rpc_tensor tensor
        uint64_t offset
        uint64_t hash
    ctypedef struct rpc_msg_get_tensor_req:
        rpc_tensor tensor
        uint64_t offset
        uint64_t size
    ctypedef struct rpc_msg_copy_tensor_req:
        rpc_tensor src
        rpc_tensor dst
    ctypedef struct rpc_msg_get_device_memory_rsp:
        uint64_t free_mem
        uint64_t total_mem
    ctypedef struct rpc_msg_get_alloc_size_req:
        uint32_t device
        rpc_tensor tensor
        rpc_tensor srcs[10]
    ctypedef struct rpc_msg_memset_tensor_req:
        rpc_tensor tensor
        uint64_t offset
        uint64_t size
        uint8_t value

    # one row per command of csrc/common/commands.def, indexed by id
    ctypedef struct gr_command:
        const char *name
        int64_t request
        int64_t response
    const gr_command gr_commands[]

    enum:
        RPC_CMD_COUNT
        GR_SIZE_VAR
        GR_SIZE_NONE
        GR_SENDV_MAX
        GR_OK
        GR_ERR_TYPE
        GR_ERR_BLOCK
        GR_ERR_OVERFLOW
        GR_ERR_RANGE
        GR_ERR_DATA_NO_BUF

    const uint64_t GR_FNV_OFFSET

    int64_t ggmlrpc_blck_size(uint32_t type)
    size_t ggmlrpc_type_size(uint32_t type)
    int ggmlrpc_tensor_check_shape(const rpc_tensor *t, uint64_t *nbytes)
    int ggmlrpc_range_inside(uint64_t data, uint64_t nbytes, uint64_t base, uint64_t size)
    uint64_t ggmlrpc_fnv1a(const uint8_t *data, size_t len, uint64_t hash)
    int ggmlrpc_recv_all(int fd, void *dst, size_t n, int timeout_ms)
    int ggmlrpc_send_all(int fd, const void *src, size_t n, int timeout_ms)
    int ggmlrpc_send2(int fd, const void *a, size_t na, const void *b, size_t nb, int timeout_ms)
    int ggmlrpc_sendv(int fd, const void *const *bufs, const size_t *lens, int n, int timeout_ms)
    int ggmlrpc_discard(int fd, uint64_t n, int timeout_ms)
    int ggmlrpc_recv_some(int fd, void *dst, size_t cap, size_t min, int timeout_ms, size_t *got)
    void *ggmlrpc_host_alloc(size_t size)
    void ggmlrpc_host_free(void *ptr, size_t size)
