# cython: language_level=3
"""Host memory for CPU buffers (csrc/common/rpc.h), with the socket transfers into
and out of it."""
from cpython.buffer cimport Py_buffer
from libc.stdint cimport uint8_t, uint64_t, uintptr_t
from libc.string cimport memcpy, memmove, memset

from ggmlrpc._native.rpc cimport *
from ggmlrpc._native.sockio cimport check_io, recv_all

from ggmlrpc.errors import ValidationError


cdef class HostMemory:
    """Zero-filled host memory of a fixed size: an anonymous mapping (page aligned), or
    64-byte aligned heap memory for small sizes (no mapping each; csrc/common/rpc.h).

    Exposes the buffer protocol so numpy and memoryview can read and write it.
    The mapping lives as long as this object and every view of it.
    """

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
        check_io(recv_all(fd, <uint8_t *>self.ptr + offset, n, timeout_ms), "recv")

    def send_from(self, int fd, bytes header, size_t offset, size_t n, int timeout_ms=-1):
        """Send header then bytes [offset, offset + n) in one writev."""
        if offset > self.size or n > self.size - offset:
            raise ValidationError("send outside the memory")
        cdef const char *h = header
        cdef size_t hn = len(header)
        cdef int r
        with nogil:
            r = ggmlrpc_send2(fd, h, hn, <uint8_t *>self.ptr + offset, n, timeout_ms)
        check_io(r, "send")

    def fnv1a(self, size_t offset, size_t n):
        if offset > self.size or n > self.size - offset:
            raise ValidationError("hash outside the memory")
        cdef uint64_t h = GR_FNV_OFFSET
        if n:
            with nogil:
                h = ggmlrpc_fnv1a(<uint8_t *>self.ptr + offset, n, h)
        return h
