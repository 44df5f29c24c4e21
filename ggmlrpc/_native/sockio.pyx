# cython: language_level=3, boundscheck=False, wraparound=False
"""Socket loops: the hot path of the server and the client. They release the GIL and
move bytes straight between the kernel and their destination memory."""
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyObject_GetBuffer, PyBuffer_Release, Py_buffer
from libc.errno cimport EAGAIN, EINTR, errno
from libc.stdint cimport int64_t, uint8_t, uint64_t
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from posix.uio cimport iovec
from libc.string cimport memcpy, memmove, memset
from libc.stdlib cimport free, malloc
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.pyport cimport PY_SSIZE_T_MAX

from ggmlrpc._native.rpc cimport *

from ggmlrpc.errors import ConnectionLost, RpcTimeout

import os


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


cdef int recv_all(int fd, void *dst, size_t n, int timeout_ms) noexcept:
    cdef int r
    with nogil:
        r = ggmlrpc_recv_all(fd, dst, n, timeout_ms)
    return r


cdef int check_io(int r, str what) except -1:
    if r == 0:
        return 0
    if r == -2:
        raise ConnectionLost("connection closed by peer")
    if r == -3:
        raise RpcTimeout(f"{what} timed out")
    raise ConnectionLost(f"{what} failed: {os.strerror(errno)}")


def recv_into(int fd, buf, int timeout_ms=-1):
    """Fill a writable buffer (bytearray, numpy array, memoryview) completely."""
    cdef Py_buffer pb
    PyObject_GetBuffer(buf, &pb, PyBUF_WRITABLE)
    try:
        if pb.len:
            check_io(recv_all(fd, pb.buf, pb.len, timeout_ms), "recv")
    finally:
        PyBuffer_Release(&pb)


def send_all(int fd, data, int timeout_ms=-1):
    cdef const uint8_t[::1] view = data
    cdef size_t n = view.shape[0]
    cdef int r = 0
    if n:
        with nogil:
            r = ggmlrpc_send_all(fd, &view[0], n, timeout_ms)
    check_io(r, "send")


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
            check_io(r, "recv")
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
        check_io(r, "recv")
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
                check_io(r, "recv")
            else:
                check_io(recv_all(fd, dst + k, n - k, timeout_ms), "recv")
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
        if head[0] < RPC_CMD_COUNT and gr_commands[head[0]].request >= 0 \
                and <uint64_t>gr_commands[head[0]].request == size:
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
            check_io(r, "recv")


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
    check_io(r, "send")


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
    check_io(r, "send")
