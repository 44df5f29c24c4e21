# cython: language_level=3, boundscheck=False, wraparound=False
"""The native codec: rpc_tensors, graphs and the shape checks in C.

The functions mirror ``ggmlrpc.protocol.PurePythonCodec``; the tests run the same
cases against both.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from cpython cimport array
import array
from libc.string cimport memcpy, memset
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_FromStringAndSize

from ggmlrpc._native.rpc cimport *

from ggmlrpc import ggml
from ggmlrpc.errors import ProtocolError, ValidationError
from ggmlrpc.protocol import MAX_GRAPH_NODES, MAX_GRAPH_TENSORS, RpcTensor

assert sizeof(rpc_tensor) == 296


cdef object tensor_from_c(const rpc_tensor *t):
    cdef Py_ssize_t n = 0
    while n < 64 and t.name[n] != 0:
        n += 1
    return RpcTensor(
        t.id, t.type, t.buffer,
        (t.ne[0], t.ne[1], t.ne[2], t.ne[3]),
        (t.nb[0], t.nb[1], t.nb[2], t.nb[3]),
        t.op, tuple([t.op_params[i] for i in range(16)]), t.flags,
        tuple([t.src[i] for i in range(10)]),
        t.view_src, t.view_offs, t.data, t.name[:n], t.use_count)


cdef int tensor_to_c(object o, rpc_tensor *t) except -1:
    cdef bytes name = o.name if isinstance(o.name, bytes) else str(o.name).encode()
    memset(t, 0, sizeof(rpc_tensor))
    t.id = o.id
    t.type = o.type
    t.buffer = o.buffer
    for i in range(4):
        t.ne[i] = o.ne[i]
        t.nb[i] = o.nb[i]
    t.op = o.op
    for i in range(16):
        t.op_params[i] = o.op_params[i]
    t.flags = o.flags
    for i in range(10):
        t.src[i] = o.src[i]
    t.view_src = o.view_src
    t.view_offs = o.view_offs
    t.data = o.data
    cdef Py_ssize_t n = min(len(name), 63)
    memcpy(t.name, <const char *>name, n)
    t.use_count = o.use_count
    return 0


cdef inline const uint8_t *_ro_ptr(const uint8_t[::1] view, Py_ssize_t offset, Py_ssize_t need) except NULL:
    if offset < 0 or view.shape[0] - offset < need:
        raise ProtocolError(f"need {need} bytes at offset {offset}, have {view.shape[0]}")
    return &view[0] + offset if view.shape[0] else NULL


def _shape_error(int err, object t):
    if err == GR_ERR_TYPE:
        return ValidationError(f"invalid tensor type {t.type}")
    if err == GR_ERR_BLOCK:
        return ValidationError(
            f"ne[0]={t.ne[0]} is not a multiple of the block size {ggml.blck_size(t.type)} "
            f"of {ggml.type_name(t.type)}")
    return ValidationError("tensor element count or byte size overflows")



cdef inline void _yield_gil():
    """A moment without the GIL inside a long loop: a loop in Cython never lets the
    interpreter switch threads, so decoding a graph of 100k tensors would hold every
    other session for its whole length; here a thread that has waited its switch
    interval takes its turn."""
    with nogil:
        pass

cdef class IoTensor:
    """The fields of a validated rpc_tensor that data commands use."""

    @property
    def name_str(self):
        return self._name.split(b"\0", 1)[0].decode("utf-8", "replace")


cdef class NativeCodec:
    """Codec functions in C (see protocol.PurePythonCodec for the contract)."""

    name = "native"

    def decode_tensor(self, buf, Py_ssize_t offset=0):
        cdef const uint8_t[::1] view = buf
        cdef rpc_tensor t
        memcpy(&t, _ro_ptr(view, offset, 296), 296)
        return tensor_from_c(&t)

    def encode_tensor(self, t):
        cdef rpc_tensor c
        tensor_to_c(t, &c)
        return (<char *>&c)[:296]

    def check_tensor_shape(self, t):
        # the check reads type, ne and nb only: convert just those (this runs for
        # every tensor of every request)
        cdef rpc_tensor c
        cdef uint64_t n = 0
        ne, nb = t.ne, t.nb
        c.type = t.type
        for i in range(4):
            c.ne[i] = ne[i]
            c.nb[i] = nb[i]
        cdef int err = ggmlrpc_tensor_check_shape(&c, &n)
        if err != GR_OK:
            raise _shape_error(err, t)
        t.nbytes = n
        return n

    def decode_checked(self, buf, Py_ssize_t offset=0):
        """Decode only what a data command needs (buffer, data, nbytes, name) after
        the shape checks; the full RpcTensor is built only for an error message."""
        cdef const rpc_tensor *t
        cdef const uint8_t[::1] view
        if type(buf) is bytearray:  # the server's requests: no memoryview to set up
            if offset < 0 or PyByteArray_GET_SIZE(buf) - offset < 296:
                raise ProtocolError(f"need 296 bytes at offset {offset}, have {len(buf)}")
            t = <const rpc_tensor *>(<const uint8_t *>PyByteArray_AS_STRING(buf) + offset)
        else:
            view = buf
            t = <const rpc_tensor *>_ro_ptr(view, offset, 296)
        cdef uint64_t n = 0
        cdef int err = ggmlrpc_tensor_check_shape(t, &n)
        if err != GR_OK:
            raise _shape_error(err, self.decode_tensor(buf, offset))
        cdef IoTensor io = IoTensor.__new__(IoTensor)
        io.buffer = t.buffer
        io.data = t.data
        io.nbytes = n
        io._name = PyBytes_FromStringAndSize(<const char *>t.name, 64)
        return io

    def decode_graph(self, buf):
        cdef const uint8_t[::1] view = buf
        cdef Py_ssize_t size = view.shape[0]
        cdef uint32_t device, n_nodes, n_tensors
        cdef uint64_t nid
        cdef rpc_tensor t
        if size < 8:
            raise ProtocolError("graph payload shorter than 8 bytes")
        memcpy(&device, &view[0], 4)
        memcpy(&n_nodes, &view[4], 4)
        if n_nodes > MAX_GRAPH_NODES:
            raise ProtocolError(f"graph of {n_nodes} nodes (at most {MAX_GRAPH_NODES})")
        if <uint64_t>size < 8 + 8 * <uint64_t>n_nodes + 4:
            raise ProtocolError(f"graph payload of {size} bytes too short for {n_nodes} nodes")
        nodes = []
        seen = set()
        cdef Py_ssize_t off = 8
        for i in range(n_nodes):
            memcpy(&nid, &view[off], 8)
            nodes.append(nid)
            seen.add(nid)
            off += 8
            if (i & 4095) == 4095:
                _yield_gil()
        if len(seen) != n_nodes:
            raise ValidationError("graph lists a node id more than once")
        memcpy(&n_tensors, &view[off], 4)
        off += 4
        if n_tensors > MAX_GRAPH_TENSORS:
            raise ProtocolError(f"graph of {n_tensors} tensors (at most {MAX_GRAPH_TENSORS})")
        if <uint64_t>size < <uint64_t>off + <uint64_t>n_tensors * 296:
            raise ProtocolError(f"graph payload of {size} bytes too short for {n_tensors} tensors")
        tensors = []
        for i in range(n_tensors):
            memcpy(&t, &view[off], 296)
            tensors.append(tensor_from_c(&t))
            off += 296
            if (i & 1023) == 1023:
                _yield_gil()
        return device, nodes, tensors

    def check_shapes(self, buf, Py_ssize_t offset, rows, nbytes):
        return check_shapes(buf, offset, rows, nbytes)

    def find_cycle(self, deps):
        return find_cycle(deps)

    def range_inside(self, uint64_t data, uint64_t size, uint64_t base, uint64_t buf_size):
        return bool(ggmlrpc_range_inside(data, size, base, buf_size))

    def fnv1a(self, data, uint64_t h=GR_FNV_OFFSET):
        cdef const uint8_t[::1] view = data
        cdef Py_ssize_t n = view.shape[0]
        if n == 0:
            return h
        with nogil:
            h = ggmlrpc_fnv1a(&view[0], n, h)
        return h


def blck_size(uint32_t t):
    return ggmlrpc_blck_size(t)


def type_size(uint32_t t):
    return ggmlrpc_type_size(t)


def struct_sizes():
    """Sizes of the C wire structs, for the tests that pin them from Python."""
    return {
        "rpc_tensor": sizeof(rpc_tensor),
        "rpc_msg_header": sizeof(rpc_msg_header),
        "rpc_msg_hello_req": sizeof(rpc_msg_hello_req),
        "rpc_msg_hello_rsp": sizeof(rpc_msg_hello_rsp),
        "rpc_msg_alloc_buffer_req": sizeof(rpc_msg_alloc_buffer_req),
        "rpc_msg_alloc_buffer_rsp": sizeof(rpc_msg_alloc_buffer_rsp),
        "rpc_msg_device_req": sizeof(rpc_msg_device_req),
        "rpc_msg_u64_rsp": sizeof(rpc_msg_u64_rsp),
        "rpc_msg_buffer_req": sizeof(rpc_msg_buffer_req),
        "rpc_msg_buffer_clear_req": sizeof(rpc_msg_buffer_clear_req),
        "rpc_msg_set_tensor_hdr": sizeof(rpc_msg_set_tensor_hdr),
        "rpc_msg_set_tensor_hash_req": sizeof(rpc_msg_set_tensor_hash_req),
        "rpc_msg_get_tensor_req": sizeof(rpc_msg_get_tensor_req),
        "rpc_msg_copy_tensor_req": sizeof(rpc_msg_copy_tensor_req),
        "rpc_msg_get_device_memory_rsp": sizeof(rpc_msg_get_device_memory_rsp),
        "rpc_msg_get_alloc_size_req": sizeof(rpc_msg_get_alloc_size_req),
        "rpc_msg_memset_tensor_req": sizeof(rpc_msg_memset_tensor_req),
    }


def check_shapes(buf, Py_ssize_t offset, const int64_t[::1] rows, uint64_t[::1] nbytes):
    """The shape checks of the graph tensors at `offset` + 296 * rows[k], their byte
    sizes written to nbytes[rows[k]]; returns the first row that fails, or -1."""
    cdef const uint8_t[::1] view = buf
    cdef Py_ssize_t k, n = rows.shape[0]
    cdef int64_t r
    cdef uint64_t size
    cdef const uint8_t *base = _ro_ptr(view, offset, 0)
    cdef Py_ssize_t have = (view.shape[0] - offset) // 296
    for k in range(n):
        r = rows[k]
        if r < 0 or r >= have or r >= nbytes.shape[0]:
            raise IndexError(f"tensor row {r} outside the graph")
    cdef int64_t bad = -1
    with nogil:
        for k in range(n):
            r = rows[k]
            size = 0
            if ggmlrpc_tensor_check_shape(<const rpc_tensor *>(base + 296 * r), &size) != GR_OK:
                bad = r
                break
            nbytes[r] = size
    return bad


def find_cycle(const int32_t[:, ::1] deps):
    """deps[i]: the rows tensor i depends on (-1: none). Returns the row of a tensor
    that depends on itself through them, or -1 (an iterative depth-first search
    without the GIL: a graph may hold half a million tensors)."""
    cdef Py_ssize_t n = deps.shape[0], width = deps.shape[1]
    cdef Py_ssize_t root, top, i, d
    cdef uint8_t[::1] state = bytearray(n)        # 1: on the current path, 2: done
    cdef int32_t[::1] stack = array.array("i", bytes(4 * n)) if n else None
    cdef int32_t[::1] next_dep = array.array("i", bytes(4 * n)) if n else None
    cdef Py_ssize_t found = -1
    with nogil:
        for root in range(n):
            if state[root]:
                continue
            state[root] = 1
            next_dep[root] = 0
            stack[0] = <int32_t>root
            top = 1
            while top and found < 0:
                i = stack[top - 1]
                if next_dep[i] == width:
                    state[i] = 2
                    top -= 1
                    continue
                d = deps[i, next_dep[i]]
                next_dep[i] += 1
                if d < 0:
                    continue
                if state[d] == 1:
                    found = d
                elif state[d] == 0:
                    state[d] = 1
                    next_dep[d] = 0
                    stack[top] = <int32_t>d
                    top += 1
            if found >= 0:
                break
    return found
