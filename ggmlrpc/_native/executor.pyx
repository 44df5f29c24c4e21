# cython: language_level=3, boundscheck=False, wraparound=False
"""The native side of the CPU executor: node records in C memory, run without the GIL.

ggmlrpc.compute.cpu decides what each node does (kernel, variant, checked shapes
and resolved addresses); this module packs those decisions into the flat gr_node
array of csrc/exec.h, sizes the scratch memory once, keeps every host mapping the
plan points into alive, and runs the array on a thread pool with the GIL
released.
"""
from libc.stdint cimport int32_t, int64_t, uint32_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memset
from posix.mman cimport MAP_ANONYMOUS, MAP_FAILED, MAP_PRIVATE, PROT_NONE, PROT_READ, PROT_WRITE, mmap, mprotect, munmap
from posix.stdlib cimport posix_memalign

from ggmlrpc._native.exec cimport *

# Error codes of ggmlrpc_exec_run (csrc/exec.h, enum gr_exec_error).
EXEC_EINDEX = 1
EXEC_EINTERNAL = 2
EXEC_ENOMEM = 3
EXEC_ECANCELED = 4


cdef class CancelToken:
    """A flag a running plan reads at the end of every node phase: set() from another
    thread stops the run there (Plan.run raises ExecError with EXEC_ECANCELED)."""
    cdef int flag

    def set(self):
        self.flag = 1

    def clear(self):
        self.flag = 0

    def is_set(self):
        return self.flag != 0
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

# kernel ids (enum gr_kernel), by name
KERNEL = dict(
    NOP=GR_K_NOP, DUP=GR_K_DUP, BINARY=GR_K_BINARY, UNARY=GR_K_UNARY, GLU=GR_K_GLU,
    SCALE=GR_K_SCALE, GET_ROWS=GR_K_GET_ROWS, SET_ROWS=GR_K_SET_ROWS, RMS_NORM=GR_K_RMS_NORM,
    NORM=GR_K_NORM, GROUP_NORM=GR_K_GROUP_NORM, SOFT_MAX=GR_K_SOFT_MAX,
    ROPE=GR_K_ROPE, MUL_MAT=GR_K_MUL_MAT, FLASH_ATTN=GR_K_FLASH_ATTN,
    ACC=GR_K_ACC, SUM=GR_K_SUM, SUM_ROWS=GR_K_SUM_ROWS,
    CUMSUM=GR_K_CUMSUM, ARGMAX=GR_K_ARGMAX, REPEAT=GR_K_REPEAT, CONCAT=GR_K_CONCAT, PAD=GR_K_PAD,
    ARANGE=GR_K_ARANGE, TRI=GR_K_TRI, FILL=GR_K_FILL, DIAG_MASK=GR_K_DIAG_MASK,
    ARGSORT=GR_K_ARGSORT, MUL_MAT_ID=GR_K_MUL_MAT_ID, ADD_ID=GR_K_ADD_ID,
    OUT_PROD=GR_K_OUT_PROD, COUNT_EQUAL=GR_K_COUNT_EQUAL, SET=GR_K_SET, DIAG=GR_K_DIAG,
    REPEAT_BACK=GR_K_REPEAT_BACK, FWHT=GR_K_FWHT, SSM_CONV=GR_K_SSM_CONV, SSM_SCAN=GR_K_SSM_SCAN,
    IM2COL=GR_K_IM2COL, POOL_1D=GR_K_POOL_1D, POOL_2D=GR_K_POOL_2D, UPSCALE=GR_K_UPSCALE, ROLL=GR_K_ROLL,
    PAD_REFLECT_1D=GR_K_PAD_REFLECT_1D, TIMESTEP_EMBEDDING=GR_K_TIMESTEP_EMBEDDING,
    RWKV_WKV6=GR_K_RWKV_WKV6, RWKV_WKV7=GR_K_RWKV_WKV7, SOLVE_TRI=GR_K_SOLVE_TRI,
    GATED_DELTA_NET=GR_K_GATED_DELTA_NET, GET_ROWS_BACK=GR_K_GET_ROWS_BACK,
    SOFT_MAX_BACK=GR_K_SOFT_MAX_BACK, RMS_NORM_BACK=GR_K_RMS_NORM_BACK, CROSS_ENTROPY=GR_K_CROSS_ENTROPY,
    OPT_STEP=GR_K_OPT_STEP, WIN_PART=GR_K_WIN_PART, GET_REL_POS=GR_K_GET_REL_POS,
    ADD_REL_POS=GR_K_ADD_REL_POS, CONV=GR_K_CONV, CONV_2D_DW=GR_K_CONV_2D_DW,
    CONV_TRANSPOSE=GR_K_CONV_TRANSPOSE, IM2COL_3D=GR_K_IM2COL_3D, COL2IM_1D=GR_K_COL2IM_1D,
    IM2COL_BACK=GR_K_IM2COL_BACK, POOL_2D_BACK=GR_K_POOL_2D_BACK, LIGHTNING_INDEXER=GR_K_LIGHTNING_INDEXER,
    DSV4_HC_COMB=GR_K_DSV4_HC_COMB, DSV4_HC_PRE=GR_K_DSV4_HC_PRE, DSV4_HC_POST=GR_K_DSV4_HC_POST, ADD_Q=GR_K_ADD_Q)

# element-wise functions that are ops of their own in ggml (enum gr_unop; the
# 22 ggml_unary_op values are their own ids)
UNOP = dict(SQR=GR_UN_SQR, SQRT=GR_UN_SQRT, LOG=GR_UN_LOG, SIN=GR_UN_SIN, COS=GR_UN_COS,
            LEAKY_RELU=GR_UN_LEAKY_RELU, CLAMP=GR_UN_CLAMP)


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
    cdef list keep

    def __cinit__(self, list records, int n_threads, list keep, size_t max_scratch=0):
        cdef int i, j
        cdef gr_node *node
        cdef size_t w
        self.nodes = NULL
        self.wdata = NULL
        self.wmap = NULL
        self.keep = keep
        self.n_threads = n_threads
        self.n_nodes = len(records)
        if self.n_nodes:
            self.nodes = <gr_node *>calloc(self.n_nodes, sizeof(gr_node))
            if self.nodes == NULL:
                raise MemoryError("cannot allocate the node records")
        self.wsize = 0
        for i in range(self.n_nodes):
            kernel, sub, index, op_params, iparams, dst, srcs = records[i]
            node = &self.nodes[i]
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

    def run(self, Pool pool, CancelToken cancel=None):
        """Run every node; raises ExecError when a node fails (nothing ran out of bounds)
        or when `cancel` was set during the run."""
        cdef gr_exec_status st
        cdef int rc
        cdef const int *flag = &cancel.flag if cancel is not None else NULL
        if pool.n_threads != self.n_threads:
            raise ValueError(f"plan made for {self.n_threads} threads, pool has {pool.n_threads}")
        with nogil:
            rc = ggmlrpc_exec_run(pool.pool, self.nodes, self.n_nodes, self.wdata, self.wsize, &st, flag)
        if rc:
            raise ExecError(st.code, st.node, st.msg.decode("utf-8", "replace"))


def simd_level():
    """1 when SIMD kernels (AVX2/FMA/F16C, or AVX-512 for the AVX-512 families) run, 0
    for the portable twins."""
    return ggmlrpc_exec_simd_level()


def set_simd(bint enable):
    """Use the SIMD kernels (when the CPU has them) or the portable twins; returns the old level."""
    return ggmlrpc_exec_set_simd(enable)


# the ggml x86 builds whose summation orders the executor reproduces (csrc/exec_impl.h)
FAMILIES = {"x86-avx2": 1, "x86-avx512": 2, "x86-avx512-bf16": 3, "x86-avx512-fp16": 4}
_FAMILY_NAMES = {v: k for k, v in FAMILIES.items()}


def kernel_family():
    """The ggml build whose results the kernels reproduce bit for bit: "x86-avx2",
    "x86-avx512", "x86-avx512-bf16" or "x86-avx512-fp16" (which has BF16 too); by default
    the one a native build on this CPU is."""
    return _FAMILY_NAMES[ggmlrpc_exec_family()]


def set_kernel_family(name):
    """Reproduce another family (None: this CPU's native one); returns the old name. Not
    while graphs run. A family whose SIMD this CPU lacks runs on the portable twins."""
    if name is not None and name not in FAMILIES:
        raise ValueError(f"unknown kernel family {name!r}; known: {', '.join(FAMILIES)}")
    return _FAMILY_NAMES[ggmlrpc_exec_set_family(FAMILIES[name] if name else 0)]


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
