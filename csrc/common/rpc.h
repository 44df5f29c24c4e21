/* Wire layouts of ggml's RPC protocol v7.0.0 and the checks every server applies
 * to them. Plain C: no Python.h. All integers little endian, all structs packed.
 */
#ifndef GGMLRPC_RPC_H
#define GGMLRPC_RPC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GR_PROTO_MAJOR 7
#define GR_PROTO_MINOR 0
#define GR_PROTO_PATCH 0

#define GR_MAX_DIMS 4
#define GR_MAX_SRC 10
#define GR_MAX_OP_PARAMS 64
#define GR_MAX_NAME 64
#define GR_CONN_CAPS_SIZE 24
#define GR_TYPE_COUNT 43
#define GR_OP_COUNT 101

/* enum gr_cmd: RPC_CMD_<NAME> = id for each row of commands.def, then RPC_CMD_COUNT */
#define GR_CMD(NAME, id, request, response) RPC_CMD_##NAME = id,
enum gr_cmd {
#include "common/commands.def"
    RPC_CMD_COUNT,
};
#undef GR_CMD

#pragma pack(push, 1)

/* rpc_tensor, 296 bytes
 *
 *   0 id u64 | 8 type u32 | 12 buffer u64 | 20 ne u32[4] | 36 nb u32[4] | 52 op u32
 *  56 op_params i32[16] | 120 flags i32 | 124 src u64[10] | 204 view_src u64
 * 212 view_offs u64 | 220 data u64 | 228 name char[64] | 292 use_count i32
 */
typedef struct rpc_tensor {
    uint64_t id;
    uint32_t type;
    uint64_t buffer;
    uint32_t ne[GR_MAX_DIMS];
    uint32_t nb[GR_MAX_DIMS];
    uint32_t op;
    int32_t op_params[GR_MAX_OP_PARAMS / 4];
    int32_t flags;
    uint64_t src[GR_MAX_SRC];
    uint64_t view_src;
    uint64_t view_offs;
    uint64_t data;
    char name[GR_MAX_NAME];
    int32_t use_count;
} rpc_tensor;

/* | cmd u8 | size u64 | */
typedef struct rpc_msg_header {
    uint8_t cmd;
    uint64_t size;
} rpc_msg_header;

typedef struct rpc_msg_hello_req { uint8_t conn_caps[GR_CONN_CAPS_SIZE]; } rpc_msg_hello_req;
typedef struct rpc_msg_hello_rsp {
    uint8_t major, minor, patch, pad;
    uint8_t conn_caps[GR_CONN_CAPS_SIZE];
} rpc_msg_hello_rsp;
typedef struct rpc_msg_alloc_buffer_req { uint32_t device; uint64_t size; } rpc_msg_alloc_buffer_req;
typedef struct rpc_msg_alloc_buffer_rsp { uint64_t remote_ptr; uint64_t remote_size; } rpc_msg_alloc_buffer_rsp;
typedef struct rpc_msg_device_req { uint32_t device; } rpc_msg_device_req;
typedef struct rpc_msg_u64_rsp { uint64_t value; } rpc_msg_u64_rsp;
typedef struct rpc_msg_buffer_req { uint64_t remote_ptr; } rpc_msg_buffer_req;
typedef struct rpc_msg_buffer_clear_req { uint64_t remote_ptr; uint8_t value; } rpc_msg_buffer_clear_req;
/* SET_TENSOR header; the data follows */
typedef struct rpc_msg_set_tensor_hdr { rpc_tensor tensor; uint8_t cache_flag; uint64_t offset; } rpc_msg_set_tensor_hdr;
typedef struct rpc_msg_set_tensor_hash_req { rpc_tensor tensor; uint64_t offset; uint64_t hash; } rpc_msg_set_tensor_hash_req;
typedef struct rpc_msg_get_tensor_req { rpc_tensor tensor; uint64_t offset; uint64_t size; } rpc_msg_get_tensor_req;
typedef struct rpc_msg_copy_tensor_req { rpc_tensor src; rpc_tensor dst; } rpc_msg_copy_tensor_req;
typedef struct rpc_msg_get_device_memory_rsp { uint64_t free_mem; uint64_t total_mem; } rpc_msg_get_device_memory_rsp;
typedef struct rpc_msg_get_alloc_size_req { uint32_t device; rpc_tensor tensor; rpc_tensor srcs[GR_MAX_SRC]; } rpc_msg_get_alloc_size_req;
typedef struct rpc_msg_memset_tensor_req { rpc_tensor tensor; uint64_t offset; uint64_t size; uint8_t value; } rpc_msg_memset_tensor_req;

#pragma pack(pop)

_Static_assert(sizeof(rpc_tensor) == 296, "rpc_tensor is 296 bytes");
_Static_assert(sizeof(rpc_msg_header) == 9, "header is 9 bytes");
_Static_assert(sizeof(rpc_msg_hello_req) == 24, "hello req");
_Static_assert(sizeof(rpc_msg_hello_rsp) == 28, "hello rsp");
_Static_assert(sizeof(rpc_msg_alloc_buffer_req) == 12, "alloc req");
_Static_assert(sizeof(rpc_msg_alloc_buffer_rsp) == 16, "alloc rsp");
_Static_assert(sizeof(rpc_msg_buffer_clear_req) == 9, "clear req");
_Static_assert(sizeof(rpc_msg_set_tensor_hdr) == 305, "set_tensor header");
_Static_assert(sizeof(rpc_msg_set_tensor_hash_req) == 312, "set_tensor_hash req");
_Static_assert(sizeof(rpc_msg_get_tensor_req) == 312, "get_tensor req");
_Static_assert(sizeof(rpc_msg_copy_tensor_req) == 592, "copy_tensor req");
_Static_assert(sizeof(rpc_msg_get_device_memory_rsp) == 16, "device memory rsp");
_Static_assert(sizeof(rpc_msg_get_alloc_size_req) == 3260, "get_alloc_size req");
_Static_assert(sizeof(rpc_msg_memset_tensor_req) == 313, "memset req");

/* Payload sizes of each command (commands.def), indexed by id. */
#define GR_SIZE_VAR (-1)   /* variable */
#define GR_SIZE_NONE (-2)  /* no response */
typedef struct gr_command {
    const char *name;
    int64_t request;
    int64_t response;
} gr_command;
extern const gr_command gr_commands[RPC_CMD_COUNT];

/* Type traits: block size (elements) and bytes per block; 0/0 for removed ids. */
int64_t ggmlrpc_blck_size(uint32_t type);
size_t ggmlrpc_type_size(uint32_t type);
/* bytes of n elements of type in one row (ggml_row_size; n a multiple of the block
 * size), 0 for a removed id */
size_t ggmlrpc_row_size(uint32_t type, int64_t n);


/* Reasons a tensor fails validation (0 = valid). */
enum gr_tensor_error {
    GR_OK = 0,
    GR_ERR_TYPE = 1,         /* type >= 43 or a removed type */
    GR_ERR_BLOCK = 2,        /* ne[0] not a multiple of the block size */
    GR_ERR_OVERFLOW = 3,     /* element count or byte size overflows */
    GR_ERR_RANGE = 4,        /* data .. data + nbytes outside [base, base + size) */
    GR_ERR_DATA_NO_BUF = 5,  /* data set but no buffer */
};

/* Shape checks that need no buffer: type, block multiple, overflow.
 * On success *nbytes holds ggml_nbytes. */
int ggmlrpc_tensor_check_shape(const rpc_tensor *t, uint64_t *nbytes);

/* data .. data + nbytes lies inside [base, base + size), overflow-safe. */
int ggmlrpc_range_inside(uint64_t data, uint64_t nbytes, uint64_t base, uint64_t size);

/* 64-bit FNV-1a, continuing from `hash` (pass GR_FNV_OFFSET to start). */
#define GR_FNV_OFFSET 0xcbf29ce484222325ULL
uint64_t ggmlrpc_fnv1a(const uint8_t *data, size_t len, uint64_t hash);

/* Socket loops. Return 0 on success, -1 on error (errno set), -2 on EOF,
 * -3 on timeout (timeout_ms < 0 waits forever). */
int ggmlrpc_recv_all(int fd, void *dst, size_t n, int timeout_ms);
int ggmlrpc_send_all(int fd, const void *src, size_t n, int timeout_ms);
/* Send two pieces as one message (header + payload) with writev. */
int ggmlrpc_send2(int fd, const void *a, size_t na, const void *b, size_t nb, int timeout_ms);
/* Send n <= GR_SENDV_MAX pieces as one message (a request's header, fields and data). */
#define GR_SENDV_MAX 8
int ggmlrpc_sendv(int fd, const void *const *bufs, const size_t *lens, int n, int timeout_ms);
/* Read and drop n bytes. */
int ggmlrpc_discard(int fd, uint64_t n, int timeout_ms);
/* Receive at least `min` and at most `cap` bytes, whatever the peer has sent
 * by then, so that one call takes a header together with the payload behind it.
 * *got holds the count on success. */
int ggmlrpc_recv_some(int fd, void *dst, size_t cap, size_t min, int timeout_ms, size_t *got);

/* Host memory for CPU buffers, zero-filled: up to GGMLRPC_HOST_SMALL bytes from the
 * heap (64-byte aligned, no mapping of its own), larger ones anonymous mappings
 * (page aligned). Free with the size it was allocated with. */
#define GGMLRPC_HOST_SMALL (64u << 10)
void *ggmlrpc_host_alloc(size_t size);
void ggmlrpc_host_free(void *ptr, size_t size);

#ifdef __cplusplus
}
#endif
#endif
