# Socket loops (sockio.pyx), for the modules that move bytes between a socket and
# memory of their own (hostmem.pyx).

# exactly n bytes into dst, GIL released: 0, -1 error, -2 closed, -3 timed out
cdef int recv_all(int fd, void *dst, size_t n, int timeout_ms) noexcept
# raise the exception a loop's result stands for (nothing for 0)
cdef int check_io(int r, str what) except -1
