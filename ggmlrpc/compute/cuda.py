"""CUDA graph executor.

``compile(graph)`` checks every runnable node against ggml's rules (ggmlrpc.ops)
and the CUDA kernels' own limits (compute/cuda_rules), resolves each tensor to a
device address (its buffer's allocation plus the offset) and records a flat list
of launches: one or more kernel launches per node, with every argument already
typed, plus the scratch memory some of them need (activations quantized to q8_1,
long-row argsort, packed copies of strided sources a kernel reads densely). ``run``
replays the list in order on the default stream and waits for it.

The kernels and the driver are parameters: on a GPU they are PyCUDA's (the
device's compiled `Kernels` and `pycuda.driver`); the tests pass the SIMT emulator
and a driver over host memory, and run the same launches on the CPU.

As on the CPU, an op or type combination without a CUDA kernel raises
UnsupportedError naming it, and the server closes the connection.
"""
from __future__ import annotations

import contextlib

import numpy as np

from .. import ggml
from ..cuda import Kernels
from ..errors import ConnectionLost, DeviceError, UnsupportedError, ValidationError
from ..ggml import GGMLType as T
from ..graph import NodeNames
from ..ops.base import contiguous, nelements, no_empty_sources, ts
from . import work

# the most scratch memory one graph may ask for (a hostile shape could ask for more)
MAX_SCRATCH = 4 << 30
SCRATCH_ALIGN = 256
FLOAT_TYPES = (T.F32, T.F16, T.BF16)


class CudaPlan:
    """A compiled graph: its launches (callables), their node names and the scratch
    allocations they write into (freed with the plan)."""

    def __init__(self, steps, names, scratch, scratch_bytes, err=None):
        self.err = err              # device i32 where index checks report (node index + 1), or None
        self.steps = steps          # [(node index, callable)]
        self.names = names          # node index -> "name (op)"
        self._scratch = scratch     # device allocations, kept alive by the plan
        self.scratch_bytes = scratch_bytes

    def __len__(self):
        return len(self.names)

    @property
    def held_bytes(self) -> int:
        """What the stored plan holds: its scratch, and about STEP_BYTES per launch."""
        return self.scratch_bytes + STEP_BYTES * len(self.steps) + self.names.nbytes


# host memory of one launch of a plan (its closure, arguments and list entry)
STEP_BYTES = 512


class Builder:
    """What a rule needs while one graph compiles: device addresses of tensors,
    scratch memory, and the list of launches it appends to."""

    def __init__(self, executor, graph):
        self.ex = executor
        self.k = executor.kernels
        self.graph = graph
        self.steps = []
        self.scratch = []
        self.scratch_bytes = 0
        self.node_index = 0
        self.err = None

    # ---- addresses ----

    def ptr(self, t, offset: int = 0):
        """The device address of tensor t (plus offset bytes), as a kernel argument."""
        p = self.graph.placement.get(t.id)
        if p is None:
            raise ValidationError(f"tensor {t.name_str!r} of a computed node has no buffer on this server")
        mem = p.buffer.mem
        base = mem.device_address(self.ex.device) if mem is not None else None
        if base is None:
            raise UnsupportedError(f"tensor {t.name_str!r} is not in this CUDA device's memory")
        return np.intp(base + p.offset + offset)

    def alloc(self, nbytes: int):
        """Scratch device memory of nbytes for this plan."""
        nbytes = max(SCRATCH_ALIGN, -(-nbytes // SCRATCH_ALIGN) * SCRATCH_ALIGN)
        if self.scratch_bytes + nbytes > MAX_SCRATCH:
            raise ValidationError(f"graph rejected: more than {MAX_SCRATCH} bytes of scratch memory")
        try:
            a = self.ex.mem_alloc(nbytes)
        except Exception as e:  # the driver's MemoryError
            raise ValidationError(f"graph rejected: no device memory for {nbytes} bytes of scratch ({e})") from None
        self.scratch.append(a)
        self.scratch_bytes += nbytes
        return np.intp(int(a))

    def error_flag(self) -> dict:
        """Keyword arguments for a launcher that checks indices: the plan's device flag
        and this node's code (its index + 1), which run() turns into ValidationError."""
        if self.err is None:
            self.err = self.alloc(4)
        return {"err": self.err, "err_code": self.node_index + 1}

    # ---- launches ----

    def launch(self, fn, *args, **kw):
        """Record `fn(kernels, *args, **kw)` (a launcher of ggmlrpc.cuda.ops)."""
        k = self.k
        self.steps.append((self.node_index, lambda: fn(k, *args, **kw)))

    # ---- layouts the kernels want ----

    def packed(self, t, type_=None, ne=None):
        """The address of t's elements (the first ne of each dim, default all) packed
        densely as type_ (default t's type): t itself when it already is, else a copy
        into scratch made by a launch recorded now."""
        type_ = t.type if type_ is None else type_
        ne = tuple(t.ne) if ne is None else tuple(ne)
        if type_ == t.type and ne == tuple(t.ne) and contiguous(t):
            return self.ptr(t)
        if t.type not in FLOAT_TYPES or type_ not in FLOAT_TYPES:
            raise UnsupportedError(f"tensor {t.name_str!r} ({ggml.type_name(t.type)}) would need a packed "
                                   f"{ggml.type_name(type_)} copy, which the CUDA executor cannot make")
        from ..cuda import ops
        n = int(np.prod(ne))
        dst = self.alloc(n * ggml.type_size(type_))
        self.launch(ops.cpy_scalar, dst, type_, dense_nb(type_, ne), self.ptr(t), t.type, tuple(t.nb), ne)
        return dst

    def out(self, node):
        """(address, finish) for a kernel that writes node densely: node itself when it
        is contiguous (finish does nothing), else scratch that finish() copies into
        node's strides."""
        if contiguous(node):
            return self.ptr(node), _nothing
        if node.type not in FLOAT_TYPES:
            raise UnsupportedError(f"node {node.name_str!r}: a strided {ggml.type_name(node.type)} result")
        from ..cuda import ops
        tmp = self.alloc(nelements(node) * ts(node))

        def finish():
            self.launch(ops.cpy_scalar, self.ptr(node), node.type, tuple(node.nb), tmp, node.type,
                        dense_nb(node.type, node.ne), tuple(node.ne))
        return tmp, finish


def _nothing():
    pass


def dense_nb(type_, ne) -> tuple:
    """Byte strides of a packed tensor of scalar type_ and shape ne."""
    s = ggml.type_size(type_)
    nb = [s]
    for n in ne[:3]:
        nb.append(nb[-1] * n)
    return tuple(nb)


def row_stride(t):
    """The stride between consecutive rows, in units of type_size (elements; blocks of a
    quant type), when all rows of t (dims 1..3) lie at one stride (a kernel that walks
    rows at `ldx`), else None."""
    stride = None
    expect = None
    for i in (1, 2, 3):
        if t.ne[i] == 1:
            continue
        if expect is not None and t.nb[i] != expect:
            return None
        if stride is None:
            stride = t.nb[i]
        expect = t.nb[i] * t.ne[i]
    if stride is None:
        return t.ne[0] // ggml.blck_size(t.type)
    return stride // ts(t) if stride % ts(t) == 0 else None


class CudaExecutor:
    """Compiles graphs into launch lists and runs them, for one device.

    kernels: a ggmlrpc.cuda.Kernels (PyCUDA's on a GPU, the emulator's in tests), or a
    function returning one, called at the first compile;
    driver: pycuda.driver or a stand-in with mem_alloc and Context.synchronize;
    context: a context-manager factory making the device current; device: the
    CudaDevice whose buffers the graphs use."""

    def __init__(self, kernels, driver, context=contextlib.nullcontext, device=None):
        self._kernels = kernels
        self.driver = driver
        self.context = context
        self.device = device

    @property
    def kernels(self):
        if not isinstance(self._kernels, Kernels):
            self._kernels = self._kernels()
        return self._kernels

    def mem_alloc(self, nbytes: int):
        return self.driver.mem_alloc(nbytes)

    def compile(self, graph, max_work: int | None = None) -> CudaPlan:
        """max_work: the work limit per byte of buffers (compute.work); None: none."""
        from . import cuda_rules  # its rules import Builder from here

        work.check_graph(graph, max_work)
        names, ops = bytearray(), []
        with self.context():
            b = Builder(self, graph)
            try:
                for node in graph.runnable():
                    srcs = graph.sources(node)
                    rule = cuda_rules.RULES.get(node.op)
                    if rule is None:
                        raise cuda_rules.unsupported(node, srcs)
                    no_empty_sources(node, srcs)
                    b.node_index = len(ops)
                    names.extend(node.name[:64].ljust(64, b"\0"))
                    ops.append(node.op)
                    rule(node, srcs, b)
            except BaseException:
                for a in b.scratch:
                    a.free()
                raise
        return CudaPlan(b.steps, NodeNames.packed(names, np.array(ops, np.uint32)), b.scratch,
                        b.scratch_bytes, b.err)

    def run(self, plan: CudaPlan, cancel=None) -> None:
        """Launch a plan's kernels in order and wait for them; a cancel token set
        meanwhile stops it between nodes and raises ConnectionLost."""
        with self.context():
            last = -1
            i = -1
            try:
                if plan.err is not None:
                    self.driver.memset_d8(int(plan.err), 0, 4)
                for i, step in plan.steps:
                    if i != last:
                        if cancel is not None and cancel.is_set():
                            raise ConnectionLost(f"graph stopped at node {plan.names[i]}: its client went "
                                                 "away or the server is closing")
                        last = i
                    step()
                sync = getattr(getattr(self.driver, "Context", None), "synchronize", None)
                if sync is not None:
                    sync()
                if plan.err is not None:
                    code = np.zeros(1, np.int32)
                    self.driver.memcpy_dtoh(code, int(plan.err))
                    if code[0]:
                        i = int(code[0]) - 1
                        raise ValidationError(f"node {plan.names[i]}: a row index is out of range")
            except (ConnectionLost, UnsupportedError, ValidationError):
                raise
            except Exception as e:  # a launch the driver refused, a kernel fault
                where = plan.names[i] if 0 <= i < len(plan.names) else "?"
                raise DeviceError(f"node {where}: {e}") from None
