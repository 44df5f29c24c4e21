# cython: language_level=3, boundscheck=False, wraparound=False
"""The native side of the CPU executor: node records in C memory, run without the GIL.

ggmlrpc.compute.cpu decides what each node does (kernel, variant, checked shapes
and resolved addresses); this module packs those decisions into the flat gr_node
array of csrc/cpu/exec.h, sizes the scratch memory once, keeps every host mapping the
plan points into alive, and runs the array on a thread pool with the GIL
released.
"""
from libc.stdint cimport int32_t, int64_t, uint32_t, uintptr_t
from libc.stdlib cimport free, realloc
from libc.string cimport memset
from posix.mman cimport MAP_ANONYMOUS, MAP_FAILED, MAP_PRIVATE, PROT_NONE, PROT_READ, PROT_WRITE, mmap, mprotect, munmap
from posix.stdlib cimport posix_memalign

from ggmlrpc._native.exec cimport *


cdef dict _named_ints():
    """{group: {name: value}}, and {group: {scope: {name: value}}} for the scoped groups
    (VARIANT, CONST), read from the C tables (csrc/cpu/kernels.def, names.def)."""
    cdef const gr_named_int *row = ggmlrpc_exec_names
    cdef dict out = {}
    while row.group != NULL:
        group = row.group.decode()
        name = row.name.decode()
        if row.scope != NULL:
            out.setdefault(group, {}).setdefault(row.scope.decode(), {})[name] = row.value
        else:
            out.setdefault(group, {})[name] = row.value
        row += 1
    return out


_NAMED = _named_ints()
# kernel ids (enum gr_kernel), by name: KERNEL["MUL_MAT"]
KERNEL = _NAMED["KERNEL"]
# named values of gr_node.sub per kernel: VARIANT["RMS_NORM"]["L2_NORM"]
VARIANT = _NAMED["VARIANT"]
# BINARY's sub (enum gr_binop) and UNARY's (enum gr_unop: the 22 ggml_unary_op values
# are their own ids, the ops of their own in ggml follow)
BINOP = _NAMED["BINOP"]
UNOP = _NAMED["UNOP"]
# the ggml x86 builds whose summation orders the executor reproduces, by Python name
FAMILY = _NAMED["FAMILY"]
# error codes of ggmlrpc_exec_run (enum gr_exec_error)
EXEC_ERROR = _NAMED["EXEC_ERROR"]
# modes a plan writes into gr_node.iparams: CONST["MM_ORDER"]["TILED"]
CONST = _NAMED["CONST"]
EXEC_EINDEX = EXEC_ERROR["EINDEX"]
EXEC_EINTERNAL = EXEC_ERROR["EINTERNAL"]
EXEC_ENOMEM = EXEC_ERROR["ENOMEM"]
EXEC_ECANCELED = EXEC_ERROR["ECANCELED"]
EXEC_EYIELD = EXEC_ERROR["EYIELD"]
EXEC_EPEER = EXEC_ERROR["EPEER"]


cdef class PeerLinks:
    """The C side of a peer group (csrc/cpu/peers.h): its rank, the socket of each
    other rank, and its exchange count. PEER_GATHER nodes point at `address`; a plan
    that holds them must keep this object alive. The sockets stay the caller's."""
    cdef gr_peers g

    def __cinit__(self, int rank, fds, int timeout_ms, int spin_us):
        if not 2 <= len(fds) <= GR_PEERS_MAX or not 0 <= rank < len(fds):
            raise ValueError(f"a peer group of {len(fds)} ranks (2..{GR_PEERS_MAX}), rank {rank}")
        memset(&self.g, 0, sizeof(gr_peers))
        for i, fd in enumerate(fds):
            self.g.fds[i] = -1 if i == rank else fd
        self.g.timeout_ms, self.g.spin_us = timeout_ms, spin_us

    @property
    def address(self):
        return <uintptr_t>&self.g

    @property
    def exchanges(self):
        return self.g.tag

    @property
    def seconds(self):
        """Time spent in exchanges: copies, sends and waits for the other ranks."""
        return self.g.ns / 1e9

    def fail(self):
        """Every later exchange fails at once (the links are closing)."""
        self.g.failed = 1


cdef class CancelToken:
    """Flags a running plan reads before every work chunk and at the end of every node
    phase: set() from another thread stops the run there (Plan.run raises ExecError
    with EXEC_ECANCELED); request_yield() stops it after the node in progress (Plan.run
    returns where to resume)."""
    cdef int flag

    def set(self):
        self.flag |= 1

    def clear(self):
        self.flag = 0

    def is_set(self):
        return (self.flag & 1) != 0

    def request_yield(self):
        self.flag |= 2

    def clear_yield(self):
        self.flag &= ~2


MAX_SRC = GR_EXEC_MAX_SRC

# Tests (the guard-page fuzzer): scratch memory in its own mapping, flush (to 64
# bytes) against a PROT_NONE page, so that a kernel writing past the scratch size
# ggmlrpc_exec_wsize gave faults instead of corrupting the heap.
cdef bint _guard_scratch = False
cdef enum:
    GUARD_PAGE = 4096


def set_scratch_guard(bint enable):
    """Put the scratch memory of plans made from now on against a guard page; returns the old setting."""
    global _guard_scratch
    old = _guard_scratch
    _guard_scratch = enable
    return old


class ExecError(Exception):
    """A run stopped: code (EXEC_*), node (index in the plan's node list), message."""

    def __init__(self, code, node, message):
        super().__init__(message)
        self.code = code
        self.node = node


cdef class Pool:
    """Worker threads of one device (the caller of run() is thread 0)."""
    cdef gr_pool *pool

    def __cinit__(self, int n_threads):
        self.pool = ggmlrpc_pool_new(n_threads)
        if self.pool == NULL:
            raise MemoryError(f"cannot start {n_threads} executor threads")

    def __dealloc__(self):
        if self.pool != NULL:
            with nogil:
                ggmlrpc_pool_free(self.pool)
            self.pool = NULL

    @property
    def n_threads(self):
        return ggmlrpc_pool_threads(self.pool)


cdef int _fill_tensor(gr_tensor *t, object spec) except -1:
    """spec: (address, type, ne[4], nb[4]) or None for an absent source."""
    cdef int i
    memset(t, 0, sizeof(gr_tensor))
    if spec is None:
        return 0
    addr, typ, ne, nb = spec
    t.data = <char *><uintptr_t>addr
    t.type = typ
    for i in range(4):
        t.ne[i] = ne[i]
        t.nb[i] = nb[i]
    return 0


cdef class Plan:
    """Compiled node records plus what they need while they run.

    records: (kernel, sub, index, op_params[16], iparams[<=4], dst, [src...]) each;
    keep: objects owning the memory the addresses point into (held until the
    plan dies).
    """
    cdef gr_node *nodes
    cdef int n_nodes
    cdef void *wdata
    cdef void *wmap             # the scratch guard's mapping (NULL: wdata from posix_memalign)
    cdef size_t wmap_size
    cdef readonly size_t wsize
    cdef readonly int n_threads
    cdef object keep
    cdef gr_resume at           # where a yielded run goes on (node -1: none)

    def __cinit__(self, records, int n_threads, keep, size_t max_scratch=0):
        cdef int i, j
        cdef gr_node *node
        cdef gr_node *grown
        cdef size_t w
        cdef int cap = 0
        self.nodes = NULL
        self.wdata = NULL
        self.wmap = NULL
        self.keep = keep
        self.n_threads = n_threads
        self.n_nodes = 0
        self.wsize = 0
        # records may be an iterator: each one is packed as it comes, so a graph of many
        # nodes never exists as a list of Python records
        for rec in records:
            i = self.n_nodes
            if i == cap:
                cap = cap * 2 if cap else 64
                grown = <gr_node *>realloc(self.nodes, cap * sizeof(gr_node))
                if grown == NULL:
                    raise MemoryError("cannot allocate the node records")
                self.nodes = grown
            kernel, sub, index, op_params, iparams, dst, srcs = rec
            node = &self.nodes[i]
            memset(node, 0, sizeof(gr_node))
            self.n_nodes += 1
            node.kernel = kernel
            node.sub = sub
            node.index = index
            for j in range(16):
                node.op_params[j] = op_params[j]
            for j in range(len(iparams)):
                node.iparams[j] = iparams[j]
            _fill_tensor(&node.dst, dst)
            if len(srcs) > GR_EXEC_MAX_SRC:
                raise ValueError("too many sources")
            node.n_src = len(srcs)
            for j in range(len(srcs)):
                _fill_tensor(&node.src[j], srcs[j])
            w = ggmlrpc_exec_wsize(node, n_threads)
            node.wsize = w
            if w > self.wsize:
                self.wsize = w
            if (i & 1023) == 1023:
                with nogil:     # let other sessions' threads run: a Cython loop never switches
                    pass
        if cap > self.n_nodes:
            grown = <gr_node *>realloc(self.nodes, self.n_nodes * sizeof(gr_node)) if self.n_nodes else NULL
            if grown != NULL or not self.n_nodes:
                if not self.n_nodes:
                    free(self.nodes)
                self.nodes = grown
        if max_scratch and self.wsize > max_scratch:
            raise MemoryError(f"the graph needs {self.wsize} bytes of scratch memory")
        if self.wsize and _guard_scratch:
            self._map_guarded()
        elif self.wsize:
            if posix_memalign(&self.wdata, 64, self.wsize) != 0:
                self.wdata = NULL
                raise MemoryError(f"cannot allocate {self.wsize} bytes of scratch memory")

    cdef int _map_guarded(self) except -1:
        cdef size_t body = (self.wsize + GUARD_PAGE - 1) // GUARD_PAGE * GUARD_PAGE
        cdef void *m = mmap(NULL, body + GUARD_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        if m == MAP_FAILED:
            raise MemoryError(f"cannot map {self.wsize} bytes of scratch memory")
        self.wmap = m
        self.wmap_size = body + GUARD_PAGE
        if mprotect(<char *>m + body, GUARD_PAGE, PROT_NONE) != 0:
            raise OSError("mprotect of the scratch guard page failed")
        self.wdata = <void *>((<uintptr_t>m + body - self.wsize) & ~(<uintptr_t>63))
        return 0

    def __dealloc__(self):
        free(self.nodes)
        if self.wmap != NULL:
            munmap(self.wmap, self.wmap_size)
        else:
            free(self.wdata)

    def __len__(self):
        return self.n_nodes

    @property
    def record_bytes(self):
        """The C memory of the node records."""
        return self.n_nodes * sizeof(gr_node)

    def run(self, Pool pool, CancelToken cancel=None, int start=0, double slice_s=0, bint resume=False):
        """Run the nodes from `start` on; raises ExecError when a node fails (nothing ran
        out of bounds) or when `cancel` was set during the run. Returns None, or the
        node to resume from when `cancel` asked the run to yield: after a node, or
        inside a long node between its work chunks (the plan keeps where; passing the
        returned node back with `resume` goes on from there). A yield request is honoured once the
        run has held the pool for `slice_s` seconds."""
        cdef gr_exec_status st
        cdef int rc
        if not resume or start != self.at.node:
            self.at.node, self.at.phase, self.at.mid, self.at.chunk = start, 0, 0, 0
        self.at.slice_ns = <int64_t>(slice_s * 1e9)
        cdef const int *flag = &cancel.flag if cancel is not None else NULL
        if pool.n_threads != self.n_threads:
            raise ValueError(f"plan made for {self.n_threads} threads, pool has {pool.n_threads}")
        with nogil:
            rc = ggmlrpc_exec_run(pool.pool, self.nodes, self.n_nodes, self.wdata, self.wsize, &st, flag, &self.at)
        if rc == EXEC_EYIELD:
            return self.at.node
        self.at.node = -1
        if rc:
            raise ExecError(st.code, st.node, st.msg.decode("utf-8", "replace"))


def simd_level():
    """1 when SIMD kernels (AVX2/FMA/F16C, or AVX-512 for the AVX-512 families) run, 0
    for the portable twins."""
    return ggmlrpc_exec_simd_level()


def set_simd(bint enable):
    """Use the SIMD kernels (when the CPU has them) or the portable twins; returns the old level."""
    return ggmlrpc_exec_set_simd(enable)


FAMILIES = FAMILY   # the older name
_FAMILY_NAMES = {v: k for k, v in FAMILIES.items()}


ZEN = "-zen"   # a family name's suffix: the build was tuned for AMD Zen


def _family_name(int family, int zen):
    return _FAMILY_NAMES[family] + (ZEN if zen else "")


def kernel_family():
    """The ggml build whose results the kernels reproduce bit for bit: "x86-avx2",
    "x86-avx512", "x86-avx512-bf16" or "x86-avx512-fp16" (which has BF16 too), with
    "-zen" where GCC tuned it for AMD Zen (a native build on such a CPU: it keeps the
    multiply-add chains of a few scalar loops unfused that other tunings fuse); by
    default the one a native build on this CPU is."""
    return _family_name(ggmlrpc_exec_family(), ggmlrpc_exec_zen())


def set_kernel_family(name):
    """Reproduce another family (None: this CPU's native one); returns the old name. Not
    while graphs run. A family whose SIMD this CPU lacks runs on the portable twins."""
    base = name[:-len(ZEN)] if name and name.endswith(ZEN) else name
    if base is not None and base not in FAMILIES:
        known = ", ".join(f"{f}[{ZEN}]" for f in FAMILIES)
        raise ValueError(f"unknown kernel family {name!r}; known: {known}")
    old = kernel_family()
    ggmlrpc_exec_set_family(FAMILIES[base] if base else 0)
    ggmlrpc_exec_set_zen((name != base) if base else -1)
    return old


def vec_lanes():
    """The family's vector width in floats (8 or 16)."""
    return ggmlrpc_exec_vec_lanes()


def has_bf16_products():
    """Whether the family multiplies BF16 pairs as an AVX512-BF16 build does."""
    return ggmlrpc_exec_family() >= FAMILIES["x86-avx512-bf16"]


def vec_dot_type(uint32_t weight_type):
    """ggml's vec_dot type for weights of this type, or -1."""
    return ggmlrpc_vec_dot_type(weight_type)


def has_to_float(uint32_t t):
    return ggmlrpc_get_to_float(t) != NULL


def has_from_float(uint32_t t):
    return ggmlrpc_get_from_float(t) != NULL


def has_vec_dot(uint32_t t):
    return ggmlrpc_get_vec_dot(t) != NULL
