# Host memory (hostmem.pyx).
cdef class HostMemory:
    cdef void *ptr
    cdef readonly size_t size
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]
