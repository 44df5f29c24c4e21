"""CPU graph executor.

``compile(graph)`` turns a validated graph into a plan and ``run(plan)`` executes it.

Compiling checks every runnable node against the rules of its op (types, shapes,
op_params; ggml's CPU backend asserts these and would abort), picks a kernel and
resolves each tensor to a host address inside the buffer the graph validation
approved. The result is a flat array of C node records (ggmlrpc._native.executor)
that one C call runs on the device's thread pool with the GIL released.

An op or type combination without a kernel raises UnsupportedError naming it:
llama.cpp's client assumes every op is supported, so the server must close the
connection rather than compute something wrong. A run that fails (a GET_ROWS
index out of range) raises ValidationError; nothing is read or written out of
bounds before that.
"""
from __future__ import annotations

import array
import collections
import os
import threading

from .. import ggml
from ..devices.base import available_memory
from ..graph import NodeNames
from ..errors import ConnectionLost, DeviceError, UnsupportedError, ValidationError
from ..ops.base import no_empty_sources
from . import cpu_rules, work

# the most scratch memory one graph may ask for (a hostile shape could ask for more);
# also never more than half of what the host has available
MAX_SCRATCH = 4 << 30


# ops that ggml computes with an empty source (llama.cpp's test-backend-ops has such
# cases: no rows to set, a convolution over nothing; a model joins an empty cache to
# its new tokens); their rules and kernels loop
# zero times over the empty dimension. Other ops with an empty source are refused.
EMPTY_SOURCES_OK = frozenset({ggml.GGMLOp.SET_ROWS, ggml.GGMLOp.CONV_3D, ggml.GGMLOp.CONCAT})


class CpuPlan:
    """A compiled graph: the native plan (it holds what its addresses point into) and
    its nodes' names; nothing of the graph it was made from."""

    def __init__(self, native, names, keep=None):
        self.native = native
        self.names = names      # plan index -> "name (op)" for error messages (graph.NodeNames)
        self.keep = keep        # what its extension nodes point at (ggmlrpc.peers)

    def __len__(self):
        return len(self.native)

    @property
    def scratch_bytes(self) -> int:
        """The plan's scratch memory, held while the plan is stored."""
        return self.native.wsize

    @property
    def held_bytes(self) -> int:
        """Everything the stored plan holds: scratch, node records, names."""
        return self.native.wsize + self.native.record_bytes + self.names.nbytes


def _native():
    from .._native import executor
    return executor


def cancel_token():
    """A token for CpuExecutor.run: set() from another thread stops the run."""
    return _native().CancelToken()


def select_kernel_family(env=os.environ) -> str:
    """GGMLRPC_KERNELS names the ggml build whose results the executor reproduces bit for
    bit ("x86-avx2", "x86-avx512", "x86-avx512-bf16", "x86-avx512-fp16", each with "-zen" for a
    build GCC tuned for AMD Zen); unset, it is the one a native llama.cpp build on this CPU
    is. Returns the family in use."""
    ex = _native()
    name = env.get("GGMLRPC_KERNELS") or None
    try:
        ex.set_kernel_family(name)
    except ValueError as e:
        raise DeviceError(f"GGMLRPC_KERNELS: {e}") from None
    return ex.kernel_family()


class Turns:
    """Round robin over the runs that share a device's thread pool: a run holds the
    pool for one turn; when another run is waiting, the holder's token is asked to
    yield (it stops at the next node end or work chunk inside a long node, once it
    has held the pool for SLICE seconds) and it queues again behind the waiters. A run alone on the device is never interrupted. `interleave` False
    makes each run hold the pool to its end instead (for measuring the difference)."""

    interleave = True
    SLICE = 0.01   # a turn's least length: fewer switches, each costs a wake-up

    def __init__(self):
        self._cv = threading.Condition()
        self._queue = collections.deque()   # tokens waiting for a turn, in order
        self._holder = None

    def take(self, token) -> None:
        with self._cv:
            self._queue.append(token)
            if self._holder is not None and self.interleave:
                self._holder.request_yield()
            while self._holder is not None or self._queue[0] is not token:
                self._cv.wait()
            self._queue.popleft()
            self._holder = token
            if self._queue and self.interleave:
                token.request_yield()

    def give(self, token) -> None:
        with self._cv:
            token.clear_yield()
            self._holder = None
            self._cv.notify_all()


class CpuExecutor:
    def __init__(self, n_threads: int):
        self.n_threads = max(1, int(n_threads))
        self._pool = None
        self._lock = threading.Lock()
        self.turns = Turns()

    @property
    def pool(self):
        with self._lock:
            if self._pool is None:
                self._pool = _native().Pool(self.n_threads)
            return self._pool

    def compile(self, graph, max_work: int | None = None, ext_rules=None) -> CpuPlan:
        """max_work: the work limit per byte of buffers (compute.work); None: none.
        ext_rules: the rules of the extension ops the connection negotiated
        (ggmlrpc.peers), which the plan keeps (their nodes point into what they hold)."""
        ex = _native()
        work.check_graph(graph, max_work)
        keep = {}
        names, ops = bytearray(), array.array("I")
        rules = {**cpu_rules.RULES, **ext_rules} if ext_rules else cpu_rules.RULES

        def records():
            # one node at a time: the plan packs each record as it comes
            for node in graph.runnable():
                srcs = graph.sources(node)
                rule = rules.get(node.op)
                if rule is None:
                    raise cpu_rules.unsupported(node, srcs)
                no_empty_sources(node, srcs, EMPTY_SOURCES_OK)
                spec = rule(node, srcs)
                dst = _resolve(graph, node, keep)
                used = [_resolve(graph, s, keep) if s is not None else None for s in spec.srcs]
                op_params = tuple(node.op_params) + (0,) * (16 - len(node.op_params))
                yield (spec.kernel, spec.sub, len(ops), op_params, spec.iparams, dst, used)
                names.extend(node.name[:64].ljust(64, b"\0"))
                ops.append(node.op)

        limit = min(MAX_SCRATCH, available_memory() // 2)
        try:
            native = ex.Plan(records(), self.n_threads, keep, limit)
        except MemoryError as e:
            raise ValidationError(f"graph rejected: {e}") from None
        return CpuPlan(native, NodeNames.packed(names, ops), ext_rules)

    def run(self, plan: CpuPlan, cancel=None) -> None:
        """Run a plan, taking turns node by node with the plans other threads run on
        this executor meanwhile (Turns); a CancelToken (cancel_token()) set meanwhile
        stops it at the next work chunk or node phase and raises ConnectionLost."""
        ex = _native()
        cancel = cancel if cancel is not None else cancel_token()
        pool = self.pool
        start, resume = 0, False
        try:
            while start is not None:
                self.turns.take(cancel)
                try:
                    start = plan.native.run(pool, cancel, start, self.turns.SLICE, resume)
                    resume = True
                finally:
                    self.turns.give(cancel)
        except ex.ExecError as e:
            where = plan.names[e.node] if 0 <= e.node < len(plan.names) else "?"
            if e.code == ex.EXEC_ECANCELED:
                raise ConnectionLost(f"graph stopped at node {where}: its client went away "
                                     "or the server is closing") from None
            if e.code == ex.EXEC_EPEER:
                raise ConnectionLost(f"node {where}: {e}") from None
            if e.code == ex.EXEC_EINDEX:
                raise ValidationError(f"node {where}: {e}") from None
            raise DeviceError(f"node {where}: {e}") from None


def _resolve(graph, t, keep):
    """(host address, type, ne, nb) of a tensor the graph placed in a host buffer."""
    p = graph.placement.get(t.id)
    if p is None:
        raise ValidationError(f"tensor {t.name_str!r} of a computed node has no buffer on this server")
    mem = p.buffer.mem
    found = mem.host_address() if mem is not None else None
    if found is None:
        raise UnsupportedError(f"tensor {t.name_str!r} is not in host memory")
    addr, host = found
    keep[id(host)] = host
    return (addr + p.offset, t.type, tuple(t.ne), tuple(t.nb))
