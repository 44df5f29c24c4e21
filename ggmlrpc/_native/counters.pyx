# cython: language_level=3, boundscheck=False, wraparound=False
"""Per-connection command counters for the server's metrics (ggmlrpc.metrics).

``CommandCounters.dispatch`` stands in for a session's dispatch: it reads the
monotonic clock around the real one and adds the command to plain C arrays. Only
the connection's own thread writes them; a scrape copies them with snapshot()
and may see them a command behind, which counters allow. The pure-Python twin is
ggmlrpc.metrics.PyCommandCounters; the tests run the same cases on both.
"""
from libc.stdint cimport uint64_t
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

cdef enum:
    MAX_COMMANDS = 32
    MAX_BUCKETS = 32    # latency bounds + the +Inf bucket


cdef inline uint64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <uint64_t>ts.tv_sec * 1000000000ULL + <uint64_t>ts.tv_nsec


cdef class CommandCounters:
    cdef object _dispatch
    cdef int n_commands
    cdef int n_bounds
    cdef uint64_t header                             # request header bytes
    cdef uint64_t bounds[MAX_BUCKETS]                # ns, ascending
    cdef uint64_t count[MAX_COMMANDS]
    cdef uint64_t rx[MAX_COMMANDS]                   # request bytes, header included
    cdef uint64_t ns[MAX_COMMANDS]                   # handling time
    cdef uint64_t hist[MAX_COMMANDS * MAX_BUCKETS]   # (command, bucket); bucket i: ns <= bounds[i]

    def __cinit__(self, dispatch, int n_commands, bounds_ns, int header_size):
        cdef int i
        if not 0 < n_commands <= MAX_COMMANDS:
            raise ValueError(f"{n_commands} commands (at most {MAX_COMMANDS})")
        if not 0 < len(bounds_ns) < MAX_BUCKETS:
            raise ValueError(f"{len(bounds_ns)} latency bounds (at most {MAX_BUCKETS - 1})")
        self._dispatch = dispatch
        self.n_commands = n_commands
        self.n_bounds = len(bounds_ns)
        self.header = header_size
        for i in range(self.n_bounds):
            self.bounds[i] = bounds_ns[i]
        for i in range(MAX_COMMANDS):
            self.count[i] = 0
            self.rx[i] = 0
            self.ns[i] = 0
        for i in range(MAX_COMMANDS * MAX_BUCKETS):
            self.hist[i] = 0

    def dispatch(self, cmd, size):
        """Run the wrapped dispatch(cmd, size) and count it once it returns."""
        cdef uint64_t t0 = _now_ns()
        cdef uint64_t dt
        cdef int c, b
        self._dispatch(cmd, size)
        dt = _now_ns() - t0
        c = cmd
        if c < 0 or c >= self.n_commands:
            return
        b = 0
        while b < self.n_bounds and dt > self.bounds[b]:
            b += 1
        self.count[c] += 1
        self.rx[c] += self.header + <uint64_t>size
        self.ns[c] += dt
        self.hist[c * (self.n_bounds + 1) + b] += 1

    def snapshot(self):
        """(count, request bytes, ns, hist) as lists; hist is per command n_bounds + 1
        buckets, not cumulative."""
        cdef int c, nb = self.n_bounds + 1
        return ([self.count[c] for c in range(self.n_commands)],
                [self.rx[c] for c in range(self.n_commands)],
                [self.ns[c] for c in range(self.n_commands)],
                [self.hist[c] for c in range(self.n_commands * nb)])
