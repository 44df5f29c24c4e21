# cython: language_level=3, boundscheck=False, wraparound=False
"""Native codec and socket loops: the hot path of the server and the client.

The functions mirror ``ggmlrpc.protocol.PurePythonCodec``; the tests run the same
cases against both. Socket loops release the GIL and move bytes straight between
the kernel and their destination memory.
"""
from cpython.buffer cimport (PyBUF_SIMPLE, PyBUF_WRITABLE, PyObject_GetBuffer, PyBuffer_Release,
                             Py_buffer)
from libc.errno cimport EAGAIN, EINTR, errno
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from posix.uio cimport iovec
from libc.string cimport memcpy, memmove, memset
from libc.stdlib cimport free, malloc
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.pyport cimport PY_SSIZE_T_MAX

from ggmlrpc._native.rpc cimport *

from ggmlrpc import ggml
from ggmlrpc.errors import ConnectionLost, ProtocolError, RpcTimeout, ValidationError
from ggmlrpc.protocol import (CMD_COUNT, MAX_GRAPH_NODES, MAX_GRAPH_TENSORS, REQUEST_SIZE,
                              RpcTensor, TENSOR_SIZE)

import os

assert sizeof(rpc_tensor) == 296
assert CMD_COUNT == RPC_CMD_COUNT

# payload size of each fixed-size request; _VARIABLE marks SET_TENSOR and GRAPH_COMPUTE
cdef uint64_t _VARIABLE = 0xFFFFFFFFFFFFFFFF
cdef uint64_t _fixed_size[RPC_CMD_COUNT]
for _cmd, _n in REQUEST_SIZE.items():
    _fixed_size[_cmd] = _n if _n is not None else _VARIABLE


cdef object _tensor_from_c(const rpc_tensor *t):
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


cdef int _tensor_to_c(object o, rpc_tensor *t) except -1:
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
    cdef readonly uint64_t buffer
    cdef readonly uint64_t data
    cdef public uint64_t nbytes
    cdef bytes _name

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
        return _tensor_from_c(&t)

    def encode_tensor(self, t):
        cdef rpc_tensor c
        _tensor_to_c(t, &c)
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
            tensors.append(_tensor_from_c(&t))
            off += 296
            if (i & 1023) == 1023:
                _yield_gil()
        return device, nodes, tensors

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


cdef class HostMemory:
    """Zero-filled host memory of a fixed size: an anonymous mapping (page aligned), or
    64-byte aligned heap memory for small sizes (no mapping each; csrc/rpc.h).

    Exposes the buffer protocol so numpy and memoryview can read and write it.
    The mapping lives as long as this object and every view of it.
    """
    cdef void *ptr
    cdef readonly size_t size
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __cinit__(self, size_t size):
        self.size = size
        self.ptr = NULL
        if size:
            with nogil:
                self.ptr = ggmlrpc_host_alloc(size)
            if self.ptr == NULL:
                raise MemoryError(f"cannot map {size} bytes")

    def __dealloc__(self):
        if self.ptr != NULL:
            ggmlrpc_host_free(self.ptr, self.size)
            self.ptr = NULL

    @property
    def addr(self):
        return <uintptr_t>self.ptr

    def __getbuffer__(self, Py_buffer *view, int flags):
        self.shape[0] = self.size
        self.strides[0] = 1
        view.buf = self.ptr
        view.obj = self
        view.len = self.size
        view.readonly = 0
        view.itemsize = 1
        view.format = "B"
        view.ndim = 1
        view.shape = self.shape
        view.strides = self.strides
        view.suboffsets = NULL
        view.internal = NULL

    def __releasebuffer__(self, Py_buffer *view):
        pass

    def fill(self, size_t offset, size_t n, int value):
        if offset > self.size or n > self.size - offset:
            raise ValidationError("fill outside the memory")
        if n:
            with nogil:
                memset(<uint8_t *>self.ptr + offset, value, n)

    def copy_from(self, size_t offset, HostMemory src, size_t src_offset, size_t n):
        if offset > self.size or n > self.size - offset:
            raise ValidationError("copy destination outside the memory")
        if src_offset > src.size or n > src.size - src_offset:
            raise ValidationError("copy source outside the memory")
        if n:
            with nogil:
                memmove(<uint8_t *>self.ptr + offset, <uint8_t *>src.ptr + src_offset, n)

    def write(self, size_t offset, data):
        cdef const uint8_t[::1] view = data
        cdef size_t n = view.shape[0]
        if offset > self.size or n > self.size - offset:
            raise ValidationError("write outside the memory")
        if n:
            with nogil:
                memcpy(<uint8_t *>self.ptr + offset, &view[0], n)

    def recv_into(self, int fd, size_t offset, size_t n, int timeout_ms=-1):
        """Receive exactly n bytes from fd straight into [offset, offset + n)."""
        if offset > self.size or n > self.size - offset:
            raise ValidationError("receive outside the memory")
        _check(_recv(fd, <uint8_t *>self.ptr + offset, n, timeout_ms), "recv")

    def send_from(self, int fd, bytes header, size_t offset, size_t n, int timeout_ms=-1):
        """Send header then bytes [offset, offset + n) in one writev."""
        if offset > self.size or n > self.size - offset:
            raise ValidationError("send outside the memory")
        cdef const char *h = header
        cdef size_t hn = len(header)
        cdef int r
        with nogil:
            r = ggmlrpc_send2(fd, h, hn, <uint8_t *>self.ptr + offset, n, timeout_ms)
        _check(r, "send")

    def fnv1a(self, size_t offset, size_t n):
        if offset > self.size or n > self.size - offset:
            raise ValidationError("hash outside the memory")
        cdef uint64_t h = GR_FNV_OFFSET
        if n:
            with nogil:
                h = ggmlrpc_fnv1a(<uint8_t *>self.ptr + offset, n, h)
        return h


# -- deadlines ---------------------------------------------------------------------
# A timeout_ms bounds each wait for the socket; a deadline (CLOCK_MONOTONIC
# nanoseconds, as time.monotonic_ns() reads it; 0 = none) bounds a whole exchange,
# so that a peer that trickles one byte at a time cannot stretch it.

cdef extern from "<poll.h>" nogil:
    cdef struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    enum:
        POLLOUT

cdef extern from "<sys/socket.h>" nogil:
    cdef struct msghdr:
        iovec *msg_iov
        size_t msg_iovlen
    ssize_t sendmsg(int fd, const msghdr *msg, int flags)
    enum:
        MSG_NOSIGNAL
        MSG_DONTWAIT


cdef inline int64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef inline int _left_ms(int64_t deadline_ns) noexcept nogil:
    """Milliseconds (at least 1) until the deadline, or -1 once it has passed."""
    cdef int64_t left = deadline_ns - _now_ns()
    if left <= 0:
        return -1
    left = (left + 999999) // 1000000
    return <int>left if left < 0x7FFFFFFF else 0x7FFFFFFF


cdef int _recv_by(int fd, uint8_t *dst, size_t n, int64_t deadline_ns) noexcept nogil:
    """Exactly n bytes before the deadline; 0, -2 closed, -3 timed out, -1 error."""
    cdef size_t got
    cdef int r, ms
    while n:
        ms = _left_ms(deadline_ns)
        if ms < 0:
            return -3
        got = 0
        r = ggmlrpc_recv_some(fd, dst, n, 1, ms, &got)
        if r:
            return r
        dst += got
        n -= got
    return 0


cdef int _sendv_by(int fd, iovec *iov, int n, int64_t deadline_ns) noexcept nogil:
    """Send every iovec before the deadline (the iovecs are consumed)."""
    cdef msghdr msg
    cdef pollfd p
    cdef int idx = 0, ms, w
    cdef ssize_t r
    cdef size_t left
    while idx < n:
        if iov[idx].iov_len == 0:
            idx += 1
            continue
        ms = _left_ms(deadline_ns)
        if ms < 0:
            return -3
        p.fd = fd
        p.events = POLLOUT
        p.revents = 0
        w = poll(&p, 1, ms)
        if w == 0:
            return -3
        if w < 0:
            if errno == EINTR:
                continue
            return -1
        memset(&msg, 0, sizeof(msg))
        msg.msg_iov = &iov[idx]
        msg.msg_iovlen = <size_t>(n - idx)
        r = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT)
        if r < 0:
            if errno == EINTR or errno == EAGAIN:  # EWOULDBLOCK == EAGAIN on Linux
                continue
            return -1
        left = <size_t>r
        while idx < n and left >= iov[idx].iov_len:
            left -= iov[idx].iov_len
            iov[idx].iov_len = 0
            idx += 1
        if idx < n:
            iov[idx].iov_base = <uint8_t *>iov[idx].iov_base + left
            iov[idx].iov_len -= left
    return 0


cdef int _sendv(int fd, const void **bufs, size_t *lens, int n, int timeout_ms,
                int64_t deadline_ns) noexcept nogil:
    cdef iovec iov[GR_SENDV_MAX]
    cdef int i
    if deadline_ns == 0:
        return ggmlrpc_sendv(fd, bufs, lens, n, timeout_ms)
    for i in range(n):
        iov[i].iov_base = <void *>bufs[i]
        iov[i].iov_len = lens[i]
    return _sendv_by(fd, iov, n, deadline_ns)


cdef int _recv(int fd, void *dst, size_t n, int timeout_ms) noexcept:
    cdef int r
    with nogil:
        r = ggmlrpc_recv_all(fd, dst, n, timeout_ms)
    return r


cdef int _check(int r, str what) except -1:
    if r == 0:
        return 0
    if r == -2:
        raise ConnectionLost("connection closed by peer")
    if r == -3:
        raise RpcTimeout(f"{what} timed out")
    raise ConnectionLost(f"{what} failed: {os.strerror(errno)}")


def recv_exact(int fd, size_t n, int timeout_ms=-1):
    """Receive exactly n bytes into a new bytearray."""
    out = bytearray(n)
    cdef uint8_t[::1] view
    if n:
        view = out
        _check(_recv(fd, &view[0], n, timeout_ms), "recv")
    return out


def recv_into(int fd, buf, int timeout_ms=-1):
    """Fill a writable buffer (bytearray, numpy array, memoryview) completely."""
    cdef Py_buffer pb
    PyObject_GetBuffer(buf, &pb, PyBUF_WRITABLE)
    try:
        if pb.len:
            _check(_recv(fd, pb.buf, pb.len, timeout_ms), "recv")
    finally:
        PyBuffer_Release(&pb)


def send_all(int fd, data, int timeout_ms=-1):
    cdef const uint8_t[::1] view = data
    cdef size_t n = view.shape[0]
    cdef int r = 0
    if n:
        with nogil:
            r = ggmlrpc_send_all(fd, &view[0], n, timeout_ms)
    _check(r, "send")


def send2(int fd, a, b, int timeout_ms=-1):
    """Send two byte strings as one writev (header + payload)."""
    cdef const uint8_t[::1] va = a
    cdef const uint8_t[::1] vb = b
    cdef const void *pa = &va[0] if va.shape[0] else NULL
    cdef const void *pb = &vb[0] if vb.shape[0] else NULL
    cdef size_t na = va.shape[0], nb = vb.shape[0]
    cdef int r
    with nogil:
        r = ggmlrpc_send2(fd, pa, na, pb, nb, timeout_ms)
    _check(r, "send")


def discard(int fd, uint64_t n, int timeout_ms=-1):
    cdef int r
    with nogil:
        r = ggmlrpc_discard(fd, n, timeout_ms)
    _check(r, "recv")


cdef class RecvBuffer:
    """Read-ahead for one socket.

    Small messages arrive whole (a request header with its payload, a response
    size with its answer): one recv takes them together instead of one recv per
    field. Bulk payloads bypass it: what is already buffered is copied out and the
    rest goes from the kernel straight into its destination. Everything read from
    the socket must go through the same RecvBuffer, or buffered bytes are lost.
    """
    cdef uint8_t *buf
    cdef size_t cap
    cdef size_t start   # buf[start:end] holds received, unread bytes
    cdef size_t end
    cdef public int64_t deadline_ns  # 0: waits bounded by timeout_ms only

    def __cinit__(self, size_t capacity=65536):
        self.buf = <uint8_t *>malloc(capacity)
        if self.buf == NULL:
            raise MemoryError()
        self.cap = capacity
        self.start = self.end = 0
        self.deadline_ns = 0

    def __dealloc__(self):
        free(self.buf)

    @property
    def pending(self):
        """Bytes received and not read yet."""
        return self.end - self.start

    cdef int _fill(self, int fd, size_t n, int timeout_ms) except -1:
        """Make at least n <= cap bytes pending."""
        cdef size_t have = self.end - self.start
        cdef size_t got = 0
        cdef int r = 0, ms
        cdef int64_t deadline = self.deadline_ns
        if have >= n:
            return 0
        if self.cap - self.start < n:
            memmove(self.buf, self.buf + self.start, have)
            self.start, self.end = 0, have
        if deadline == 0:
            with nogil:
                r = ggmlrpc_recv_some(fd, self.buf + self.end, self.cap - self.end, n - have,
                                      timeout_ms, &got)
            _check(r, "recv")
            self.end += got
            return 0
        with nogil:
            while self.end - self.start < n:
                ms = _left_ms(deadline)
                if ms < 0:
                    r = -3
                    break
                got = 0
                r = ggmlrpc_recv_some(fd, self.buf + self.end, self.cap - self.end, 1, ms, &got)
                if r:
                    break
                self.end += got
        _check(r, "recv")
        return 0

    cdef int _read(self, int fd, uint8_t *dst, size_t n, int timeout_ms) except -1:
        """Exactly n bytes into dst: small reads through the buffer, large ones
        from what is buffered and then straight from the socket."""
        cdef size_t k
        cdef int r
        if n <= self.cap:
            self._fill(fd, n, timeout_ms)
            memcpy(dst, self.buf + self.start, n)
            self.start += n
        else:
            k = self.end - self.start
            memcpy(dst, self.buf + self.start, k)
            self.start += k
            if self.deadline_ns:
                with nogil:
                    r = _recv_by(fd, dst + k, n - k, self.deadline_ns)
                _check(r, "recv")
            else:
                _check(_recv(fd, dst + k, n - k, timeout_ms), "recv")
        if self.start == self.end:
            self.start = self.end = 0
        return 0

    def read(self, int fd, size_t n, int timeout_ms=-1):
        """Exactly n bytes as a new bytearray."""
        if n > <size_t>PY_SSIZE_T_MAX:
            raise MemoryError(f"cannot receive {n} bytes")
        out = PyByteArray_FromStringAndSize(NULL, n)
        if n:
            self._read(fd, <uint8_t *>PyByteArray_AS_STRING(out), n, timeout_ms)
        return out

    def read_into(self, int fd, buf, int timeout_ms=-1):
        """Fill a writable buffer (bytearray, numpy array, memoryview) completely."""
        cdef Py_buffer pb
        PyObject_GetBuffer(buf, &pb, PyBUF_WRITABLE)
        try:
            if pb.len:
                self._read(fd, <uint8_t *>pb.buf, pb.len, timeout_ms)
        finally:
            PyBuffer_Release(&pb)

    def read_request(self, int fd, int timeout_ms=-1):
        """A request's | cmd u8 | size u64 | and, when the command has a fixed payload
        size and `size` is it, the payload too: (cmd, size, payload or None)."""
        cdef uint8_t head[9]
        cdef uint64_t size
        self._read(fd, head, 9, timeout_ms)
        memcpy(&size, head + 1, 8)
        payload = None
        if head[0] < RPC_CMD_COUNT and _fixed_size[head[0]] == size and size != _VARIABLE:
            payload = PyByteArray_FromStringAndSize(NULL, size)
            if size:
                self._read(fd, <uint8_t *>PyByteArray_AS_STRING(payload), size, timeout_ms)
        return head[0], size, payload

    def take(self, size_t n):
        """Up to n of the pending bytes, without touching the socket."""
        cdef size_t k = min(n, self.end - self.start)
        out = PyBytes_FromStringAndSize(<char *>self.buf + self.start, k)
        self.start += k
        if self.start == self.end:
            self.start = self.end = 0
        return out

    def discard(self, int fd, uint64_t n, int timeout_ms=-1):
        cdef size_t k = <size_t>min(n, <uint64_t>(self.end - self.start))
        cdef int r = 0
        self.start += k
        if self.start == self.end:
            self.start = self.end = 0
        if n > k:
            with nogil:
                r = ggmlrpc_discard(fd, n - k, timeout_ms)
            _check(r, "recv")


def sendv(int fd, parts, int timeout_ms=-1, int64_t deadline_ns=0):
    """Send up to GR_SENDV_MAX byte strings as one message (one sendmsg when the
    socket takes it all), so a request never leaves as several small segments."""
    cdef Py_buffer pbs[GR_SENDV_MAX]
    cdef const void *bufs[GR_SENDV_MAX]
    cdef size_t lens[GR_SENDV_MAX]
    cdef int n = len(parts), got = 0, r = 0, i
    if n > GR_SENDV_MAX:
        raise ValueError(f"at most {GR_SENDV_MAX} parts, got {n}")
    try:
        for i in range(n):
            PyObject_GetBuffer(parts[i], &pbs[i], PyBUF_SIMPLE)
            got += 1
            bufs[i] = pbs[i].buf
            lens[i] = pbs[i].len
        with nogil:
            r = _sendv(fd, bufs, lens, n, timeout_ms, deadline_ns)
    finally:
        for i in range(got):
            PyBuffer_Release(&pbs[i])
    _check(r, "send")


def send_sized(int fd, payload, int timeout_ms=-1, int64_t deadline_ns=0):
    """A response, | size u64 | payload |, in one writev."""
    cdef Py_buffer pb
    cdef uint64_t n
    cdef int r
    cdef const void *bufs[2]
    cdef size_t lens[2]
    PyObject_GetBuffer(payload, &pb, PyBUF_SIMPLE)
    try:
        n = pb.len
        bufs[0] = &n
        lens[0] = 8
        bufs[1] = pb.buf
        lens[1] = pb.len
        with nogil:
            r = _sendv(fd, bufs, lens, 2, timeout_ms, deadline_ns)
    finally:
        PyBuffer_Release(&pb)
    _check(r, "send")


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
