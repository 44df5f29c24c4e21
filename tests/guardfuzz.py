"""Guard-page fuzzer of the CPU planner and executor (used by tests/unit/test_guard_fuzz.py
and bench/fuzz.py).

Each graph is one compute node: a seed from tests/data/fuzz_seeds.json (nodes the op
tests run; scripts/fuzz_seeds.py records them) with its types, ne, nb and op_params
mutated; or, in a `chains` run, two or three such nodes tied together (Chain): a later
node reads an earlier one's output as it is or through a VIEW of its own shape, or
writes its own output partly over an earlier one's. Every tensor gets a slot of its own: SLOT bytes of read-write memory between
two PROT_NONE pages, and lies flush against one of them, its last byte before the
upper guard page or its first byte right after the lower one. The graph goes through
the server's own validation (graph.build_graph, with a session whose buffers are these
slots) and the planner (CpuExecutor.compile); what they reject is counted and
dropped, what they accept is run. A kernel that touches a byte outside the extent the
planner approved hits a guard page, and the child process running the graphs dies
of SIGSEGV (the plans' scratch memory lies against a guard page too, through
executor.set_scratch_guard); CANARY bytes on the other side of each tensor, checked after the run,
catch a stray write there. Graphs over a small work budget (ggmlrpc.compute.work)
are refused as the server would refuse them, so that every graph is quick and a
graph still running after HANG_S seconds is reported as a hang.

Graph i of a run is made from random.Random(f"{seed}:{i}") alone, so the parent,
which reads the index of the graph in progress from shared memory, can rebuild and
print the graph a child died on (or hung in): op, types, ne, nb, op_params and which
end of its slot each tensor lies against. `replay(seed, i)` runs that graph again in
the calling process.
"""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import random
import signal
import struct
import time
from dataclasses import dataclass
from pathlib import Path

SEEDS = Path(__file__).resolve().parent / "data" / "fuzz_seeds.json"
PAGE = mmap.PAGESIZE
SLOT = 1 << 20             # read-write bytes per tensor slot; larger tensors are not run
N_SLOTS = 8                # the node and up to seven sources
WORK_PER_BYTE = 64         # the fuzzer's graph work limit (ggmlrpc.compute.work) per byte of its
WORK_FLOOR = 1 << 22       # slots, and at least this: keeps every graph quick
THREADS = (1, 2, 3)        # executor threads, one picked per graph (row splits that do not divide)
BIG_WORK = 1 << 38         # big runs: one dim past 2^31 over stride 0, seconds per graph
BIG_NE = ((1 << 31) - 1, 1 << 31, (1 << 31) + 1, (1 << 32) - 1)
HANG_S = 30.0              # a graph running this long is reported as a hang
CANARY = 4096              # bytes beside each tensor on its open side, checked after each run
EXIT_CANARY = 71           # a child's exit status when a run wrote beside a tensor

U32_EDGES = (0, 1, 2, 3, 7, 31, 32, 33, 255, 256, 257, 4095, 4096, 65535, 65536,
             (1 << 31) - 1, 1 << 31, (1 << 32) - 1)
I32_EDGES = (0, 1, -1, 2, -2, 3, 4, 8, 16, 31, 32, 64, 1000, 1 << 20, (1 << 31) - 1, -(1 << 31))
F32_EDGES = (0.0, -0.0, 1.0, -1.0, 0.5, 1e-6, 1e30, -1e30, float("inf"), float("-inf"), float("nan"))


def _f32(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


@dataclass
class Case:
    """One fuzz graph: tensors[0] is the node, the rest its sources (None: absent)."""

    op: int
    tensors: list            # [type, [ne]*4, [nb]*4] or None
    op_params: list
    at_end: list             # per tensor: flush against the upper guard page (else the lower)
    fill: int                # data fill seed
    threads: int = 2         # executor threads

    def describe(self) -> str:
        from ggmlrpc import ggml

        def one(t, end):
            if t is None:
                return "-"
            return (f"{ggml.type_name(t[0])} ne={tuple(t[1])} nb={tuple(t[2])} "
                    f"{'end' if end else 'start'}-flush")
        lines = [f"op {ggml.op_name(self.op)} op_params={tuple(self.op_params)} threads={self.threads}",
                 f"  dst:  {one(self.tensors[0], self.at_end[0])}"]
        lines += [f"  src{i}: {one(t, self.at_end[i + 1])}" for i, t in enumerate(self.tensors[1:])]
        return "\n".join(lines)


LINKS = ("reuse", "view", "inplace")
MAX_CHAIN = 3              # nodes of a multi-node graph
MUTATIONS = (0, 1, 1, 1, 2, 2, 3, 4)    # how many per node, one picked per node
CHAIN_MUTATIONS = (0, 0, 1, 1, 2)       # fewer in a chain, so that more chains pass all their rules


@dataclass
class Chain:
    """A multi-node fuzz graph: the nodes of `cases` in order, tied by `links`, each
    (j, s, i, kind, at): node j's source s (1..) or, for "inplace", its destination
    takes node i's output (i < j). "reuse": the source is node i itself; "view": a VIEW
    of node i (its own type and shape) starting `at` bytes into node i's output;
    "inplace": node j writes into node i's slot, `at` bytes from node i's output
    (partial overlaps of a later node's destination with an earlier one's)."""

    cases: list
    links: list
    threads: int = 2

    def describe(self) -> str:
        out = []
        for j, c in enumerate(self.cases):
            out.append(f"node {j}: " + c.describe().replace("\n", "\n  "))
        out += [f"link: node {j} {'dst' if s == 0 else f'src{s - 1}'} <- node {i} ({kind}, at {at})"
                for j, s, i, kind, at in self.links]
        return "\n".join(out)


def load_seeds() -> list[dict]:
    return json.loads(SEEDS.read_text())


def _contig(typ, ne):
    from ggmlrpc import ggml
    ts, bs = ggml.type_size(typ), ggml.blck_size(typ)
    nb0 = ts
    nb1 = nb0 * (ne[0] // bs) if bs else nb0 * ne[0]
    # strides past 32 bits wrap, as they would in the wire's uint32 fields
    return [x & 0xFFFFFFFF for x in (nb0, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2])]


def _u32(x: int) -> int:
    return max(0, min(int(x), (1 << 32) - 1))


def _i32(x: int) -> int:
    return (int(x) + (1 << 31)) % (1 << 32) - (1 << 31)


class Mutator:
    """Seeds grouped by op; make(seed, i) is graph i of a run (deterministic)."""

    def __init__(self, seeds: list[dict], ops=None, big: bool = False):
        """big: every graph also gets one dimension past 2^31 (stride 0 where the
        layout allows), for the 32-bit overflows of index arithmetic."""
        from ggmlrpc import ggml
        self.ggml = ggml
        self.big = big
        by_op: dict[int, list] = {}
        for s in seeds:
            if ops is None or s["op"] in ops:
                by_op.setdefault(s["op"], []).append(s)
        self.ops = sorted(by_op)
        self.by_op = by_op
        self.types = [t for t in range(ggml.TYPE_COUNT) if ggml.blck_size(t)]

    def make(self, seed: int, i: int) -> Case:
        return self._case(random.Random(f"{seed}:{i}"))

    def make_chain(self, seed: int, i: int) -> Chain:
        """Graph i of a multi-node run: two or three mutated nodes, each later one tied to
        an earlier one's output by one link (deterministic, like make)."""
        from ggmlrpc import ggml
        r = random.Random(f"{seed}:chain:{i}")
        cases = [self._case(r, CHAIN_MUTATIONS) for _ in range(r.choice((2, 2, MAX_CHAIN)))]
        links = []
        for j in range(1, len(cases)):
            i_ = r.randrange(j)
            kind = r.choice(LINKS)
            srcs = [k for k, t in enumerate(cases[j].tensors) if k and t is not None]
            if kind != "inplace" and not srcs:
                kind = "inplace"
            s = 0 if kind == "inplace" else r.choice(srcs)
            dst = cases[i_].tensors[0]
            n = ggml.nbytes(dst[0], dst[1], dst[2]) if ggml.blck_size(dst[0]) else 0
            at = r.choice((0, 0, n // 2, max(0, n - 1), r.randrange(0, max(1, n))))
            links.append((j, s, i_, kind, at))
        return Chain(cases, links, r.choice(THREADS))

    def _case(self, r, mutations=MUTATIONS) -> Case:
        op = r.choice(self.ops)
        s = r.choice(self.by_op[op])
        ts = [[s["dst"][0], list(s["dst"][1]), list(s["dst"][2])]]
        ts += [None if t is None else [t[0], list(t[1]), list(t[2])] for t in s["srcs"]]
        params = list(s["op_params"])
        n_mut = r.choice(mutations)
        for _ in range(n_mut):
            self._mutate(r, ts, params)
        if self.big:
            self._huge(r, ts)
        at_end = [r.random() < 0.5 for _ in ts]
        return Case(op, ts, params, at_end, r.randrange(1 << 30), r.choice(THREADS))

    def _huge(self, r, ts):
        live = [t for t in ts if t is not None]
        t = r.choice(live)
        d = r.randrange(1, 4) if r.random() < 0.5 else 0
        # the other dims of the group down to 1 (rows kept), so that the work fits BIG_WORK
        for e in range(4):
            if e != d and r.random() < 0.8:
                old = t[1][e]
                for u in live:
                    if u[1][e] == old and (e or self.ggml.blck_size(u[0]) == 1):
                        u[1][e] = 1
                        u[2] = _contig(u[0], u[1])
        old, new = t[1][d], r.choice(BIG_NE)
        for u in live:
            if u[1][d] == old:
                u[1][d] = new
                if d or self.ggml.blck_size(u[0]) == 1:
                    u[2][d] = 0

    def _mutate(self, r, ts, params):
        ggml = self.ggml
        live = [t for t in ts if t is not None]
        kind = r.choice(("ne", "ne", "ne_all", "ne_all", "nb", "nb", "type", "type", "type_all", "blocks",
                         "param", "param", "param_f32", "drop_src", "contig"))
        t = r.choice(live)
        if kind in ("ne", "ne_all"):
            d = r.randrange(4)
            old = t[1][d]
            new = r.choice((old + 1, max(1, old - 1), old * 2, max(1, old // 2), 1,
                            r.randrange(1, 70), r.choice(U32_EDGES), old * r.randrange(2, 5)))
            new = _u32(new)
            # ne_all: the same change in every tensor whose dim d agreed, so that rules
            # comparing shapes still pass and the kernels run on it
            group = [u for u in live if u[1][d] == old] if kind == "ne_all" else [t]
            keep_strides = r.random() < 0.3
            for u in group:
                u[1][d] = new
                if not keep_strides:
                    u[2] = _contig(u[0], u[1])
        elif kind == "nb":
            d = r.randrange(4)
            k = r.randrange(6)
            if k == 0:
                t[2][d] = 0                                   # stride 0: broadcast
            elif k == 1:
                a, b = r.sample(range(4), 2)                   # permuted
                t[2][a], t[2][b] = t[2][b], t[2][a]
                t[1][a], t[1][b] = t[1][b], t[1][a]
            elif k == 2:
                t[2][d] *= 2                                  # non-contiguous rows
            elif k == 3:
                t[2][d] += ggml.type_size(t[0]) or 1           # padded
            elif k == 4:
                t[2][d] = max(0, t[2][d] - (ggml.type_size(t[0]) or 1))  # overlapping
            else:
                t[2][d] = r.choice(U32_EDGES)
            t[2][d] = _u32(t[2][d])
        elif kind == "type":
            t[0] = r.choice(self.types)
            bs = ggml.blck_size(t[0])
            if t[1][0] % bs:
                t[1][0] = max(bs, t[1][0] // bs * bs)
            if r.random() < 0.8:
                t[2] = _contig(t[0], t[1])
        elif kind == "type_all":
            # every tensor of one type to another (F32 graphs in F16, BF16, a quant type...)
            old, new = t[0], r.choice(self.types)
            bs = ggml.blck_size(new)
            for u in live:
                if u[0] == old and u[1][0] % bs == 0:
                    u[0] = new
                    u[2] = _contig(new, u[1])
        elif kind == "blocks":
            # a row length of whole quant blocks in every tensor that shared it, so that
            # quantized types get past the block rule
            old = t[1][0]
            new = r.choice((32, 64, 128, 256, 512, 768))
            for u in live:
                if u[1][0] == old:
                    u[1][0] = new
                    u[2] = _contig(u[0], u[1])
        elif kind == "param":
            j = r.randrange(16) if r.random() < 0.5 else r.randrange(4)
            params[j] = _i32(r.choice(I32_EDGES + (r.randrange(-8, 64), params[j] + 1, params[j] - 1)))
        elif kind == "param_f32":
            params[r.randrange(8)] = _f32(r.choice(F32_EDGES))
        elif kind == "drop_src":
            if len(ts) > 1:
                j = r.randrange(1, len(ts))
                if r.random() < 0.5:
                    ts[j] = None
                else:
                    ts.pop(j)
        elif kind == "contig":
            t[2] = _contig(t[0], t[1])


# -- memory -----------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


class _Slot:
    """SLOT read-write bytes between two PROT_NONE pages."""

    def __init__(self):
        self.map = mmap.mmap(-1, SLOT + 2 * PAGE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        for guard in (base, base + PAGE + SLOT):
            if _libc.mprotect(guard, PAGE, 0) != 0:
                raise OSError(ctypes.get_errno(), "mprotect")
        self.addr = base + PAGE       # first read-write byte
        self.size = SLOT

    def host_address(self):           # the buffer contract the CPU executor reads
        return self.addr, self


class _Buffer:
    __slots__ = ("handle", "base", "size", "mem")

    def __init__(self, handle, slot):
        self.handle, self.base, self.size, self.mem = handle, slot.addr, SLOT, slot


class _Session:
    """What graph.build_graph needs of a session: a codec and its buffers."""

    def __init__(self, slots):
        from ggmlrpc import protocol
        self.codec = protocol.codec()
        self.buffers = {i + 1: _Buffer(i + 1, s) for i, s in enumerate(slots)}

    def buffer(self, handle):
        return self.buffers[handle]


class CanaryError(Exception):
    """A run changed bytes next to a tensor (outside every extent the planner approved)."""


class Runner:
    """Builds, validates, plans and runs cases in this process."""

    def __init__(self, n_threads: int | None = None, work_per_byte: int = WORK_PER_BYTE,
                 work_floor: int = WORK_FLOOR):
        """n_threads: every graph on that many threads (None: the case's own)."""
        import numpy as np

        from ggmlrpc.compute.cpu import CpuExecutor
        self.np = np
        self.slots = [_Slot() for _ in range(N_SLOTS * MAX_CHAIN)]
        self.session = _Session(self.slots)
        self.n_threads = n_threads
        self.executors = {n: CpuExecutor(n) for n in ({n_threads} if n_threads else set(THREADS))}
        self.work_per_byte = work_per_byte
        self.work_floor = work_floor
        self.counts = dict.fromkeys(_KINDS, 0)

    def layout(self, case):
        """(chain, tensors): the graph's tensors as (id, (type, ne, nb), slot, start,
        (node index, case) for a node else None, a node's source ids, view_src), or None
        when one does not fit its slot. A Case's tensor k lies in slot k, against its
        upper or lower guard page; in a Chain node j's tensors take slots N_SLOTS * j + k,
        and its links place tensors inside earlier nodes' slots instead."""
        from ggmlrpc import ggml
        chain = case if isinstance(case, Chain) else Chain([case], [], case.threads)
        placed = {}   # (node, tensor index) -> [id, layout, slot, start]
        for j, c in enumerate(chain.cases):
            for k, t in enumerate(c.tensors):
                if t is None:
                    continue
                n = ggml.nbytes(t[0], t[1], t[2]) if ggml.blck_size(t[0]) else 0
                if n > SLOT:
                    return None
                placed[j, k] = [1 + N_SLOTS * j + k, t, N_SLOTS * j + k, SLOT - n if c.at_end[k] else 0, 0]
        for j, s, i, kind, at in chain.links:
            if (j, s) not in placed or (i, 0) not in placed:
                continue
            _, dst, slot, start, _ = placed[i, 0]
            if kind == "reuse":
                placed[j, s] = [placed[i, 0][0], dst, slot, start, 0]
                continue
            t = placed[j, s][1]
            n = ggml.nbytes(t[0], t[1], t[2])
            at = min(start + at, SLOT - n)
            placed[j, s] = [placed[j, s][0], t, slot, at, placed[i, 0][0] if kind == "view" else 0]
            if kind == "view" and at < start:
                placed[j, s][4] = 0      # a view starts inside what it views
        out = []
        for j, c in enumerate(chain.cases):
            srcs = [placed[j, k][0] if (j, k) in placed else 0 for k in range(1, len(c.tensors))]
            for k in range(len(c.tensors)):
                if (j, k) in placed:
                    tid, t, slot, start, view_src = placed[j, k]
                    out.append((tid, t, slot, start, (j, c) if k == 0 else None,
                                srcs if k == 0 else None, view_src))
        return chain, out

    def build(self, case):
        """The validated Graph of a case or chain, or None when it is too big for the slots."""
        from ggmlrpc import ggml, protocol
        from ggmlrpc.graph import build_graph
        got = self.layout(case)
        if got is None:
            return None
        chain, tensors = got
        rpc, seen, node_ids = [], set(), []
        for tid, (typ, ne, nb), slot, start, node, srcs, view_src in tensors:
            if tid in seen:
                continue
            seen.add(tid)
            data = self.slots[slot].addr + start
            if node is not None:
                j, c = node
                node_ids.append(tid)
                rpc.append(protocol.RpcTensor(
                    id=tid, type=typ, buffer=slot + 1, ne=tuple(ne), nb=tuple(nb), op=c.op,
                    op_params=tuple(c.op_params), flags=ggml.TensorFlag.COMPUTE, data=data,
                    src=tuple(srcs) + (0,) * (protocol.MAX_SRC - len(srcs)), name=b"n%d" % j))
            else:
                view = dict(op=ggml.GGMLOp.VIEW, view_src=view_src,
                            view_offs=data - self.slots[slot].addr) if view_src else {}
                rpc.append(protocol.RpcTensor(id=tid, type=typ, buffer=slot + 1, ne=tuple(ne),
                                              nb=tuple(nb), data=data, name=b"t%d" % tid, **view))
        return build_graph(self.session, 0, node_ids, rpc)

    def fill(self, case):
        """Sources get fresh bytes; index-like integer sources small values, so that
        lookups (GET_ROWS, SET_ROWS, MUL_MAT_ID...) reach their kernels."""
        from ggmlrpc import ggml
        np = self.np
        chain, tensors = self.layout(case)
        rng = np.random.default_rng(chain.cases[0].fill)
        for tid, (typ, ne, nb), slot, start, node, _, _ in tensors:
            if node is not None:
                continue
            n = ggml.nbytes(typ, ne, nb)
            view = np.frombuffer(self.slots[slot].map, dtype=np.uint8, count=n, offset=PAGE + start)
            if typ in (ggml.GGMLType.I32, ggml.GGMLType.I64) and rng.random() < 0.9:
                w = ggml.type_size(typ)
                m = n // w
                vals = rng.integers(0, max(1, min(ne)) + (rng.random() < 0.2), size=m)
                view[:m * w] = vals.astype(np.int32 if w == 4 else np.int64).view(np.uint8)
            elif rng.random() < 0.5:
                view[:] = rng.integers(0, 256, size=n, dtype=np.uint8)
            else:   # well-behaved floats in the bytes (most types read them as something sane)
                m = n // 4
                view[:m * 4] = rng.standard_normal(m, dtype=np.float32).view(np.uint8)

    def _canaries(self, case):
        """The CANARY bytes of each used slot beside the hull of the tensors in it, on the
        sides away from its guard pages, where a stray write would not fault."""
        from ggmlrpc import ggml
        np = self.np
        hull = {}
        for _, (typ, ne, nb), slot, start, *_ in self.layout(case)[1]:
            n = ggml.nbytes(typ, ne, nb)
            lo, hi = hull.get(slot, (start, start + n))
            hull[slot] = (min(lo, start), max(hi, start + n))
        out = []
        for slot, (lo, hi) in hull.items():
            for a, b in ((max(0, lo - CANARY), lo), (hi, min(SLOT, hi + CANARY))):
                if b > a:
                    out.append(np.frombuffer(self.slots[slot].map, dtype=np.uint8, count=b - a,
                                             offset=PAGE + a))
        return out

    def run(self, case) -> str:
        """'run', 'rejected' (by validation or the planner), 'over_work' (by the work
        limit), 'too_big' (for the slots) or 'run_error' (a run-time check stopped it)."""
        from ggmlrpc.compute import work
        from ggmlrpc.errors import ConnectionLost, DeviceError, UnsupportedError, ValidationError
        try:
            graph = self.build(case)
            if graph is None:
                return self._count("too_big")
            try:
                work.check_graph(graph, self.work_per_byte, self.work_floor)
            except ValidationError:
                return self._count("over_work")
            executor = self.executors[self.n_threads or case.threads]
            plan = executor.compile(graph)
        except (ValidationError, UnsupportedError):
            return self._count("rejected")
        self.fill(case)
        canaries = self._canaries(case)
        for c in canaries:
            c[:] = 0xA5
        try:
            executor.run(plan)
        except (ValidationError, DeviceError, ConnectionLost):
            return self._count("run_error")
        if any((c != 0xA5).any() for c in canaries):
            raise CanaryError("a kernel wrote beside a tensor")
        return self._count("run")

    def _count(self, what):
        self.counts[what] += 1
        return what


# -- forked runs ---------------------------------------------------------------------------

_KINDS = ("run", "rejected", "over_work", "too_big", "run_error")

@dataclass
class Failure:
    index: int
    what: str           # "signal N (NAME)", "exit N", "hang"
    case: Case

    def __str__(self):
        return f"graph {self.index}: {self.what}\n{self.case.describe()}"


def _child(seed, start, stop, progress, n_threads, ops, work_per_byte, big, chains):
    """Run graphs start..stop-1; progress[0] = graph in progress, then counts."""
    import faulthandler
    faulthandler.disable()   # the parent reports a fault with the graph's reproducer
    try:
        _guard_scratch()
        mut = Mutator(load_seeds(), ops, big)
        runner = Runner(n_threads, work_per_byte, BIG_WORK if big else WORK_FLOOR)
        for i in range(start, stop):
            struct.pack_into("<q", progress, 0, i)
            runner.run(mut.make_chain(seed, i) if chains else mut.make(seed, i))
            struct.pack_into("<5q", progress, 8, *(runner.counts[k] for k in _KINDS))
        struct.pack_into("<q", progress, 0, stop)
        os._exit(0)
    except CanaryError:
        os._exit(EXIT_CANARY)
    except BaseException:
        import traceback
        traceback.print_exc()
        os._exit(70)


def fuzz(seed: int, n: int, start: int = 0, n_threads: int | None = None, ops=None, hang_s: float = HANG_S,
         work_per_byte: int = WORK_PER_BYTE, on_failure=None, stop_at_failure=True, deadline=None,
         chunk: int = 50_000, on_chunk=None, big: bool = False, chains: bool = False):
    """Run graphs start..start+n-1 (multi-node ones, Mutator.make_chain, with `chains`) in forked children of at most `chunk` graphs each. A
    child that dies or hangs is recorded as a Failure and, unless stop_at_failure, a new
    child goes on after that graph; past `deadline` (time.monotonic()) the run stops
    early. on_chunk(counts) after each child. Returns (counts, failures)."""
    # the children fork with the package loaded: a reinstall during a long run changes nothing
    from ggmlrpc import graph, protocol  # noqa: F401
    from ggmlrpc.compute import cpu, cpu_rules, work  # noqa: F401
    from ggmlrpc.devices import cpu as _device  # noqa: F401
    cpu._native()
    counts = dict.fromkeys(_KINDS, 0)
    failures = []
    mut = None
    i, end = start, start + n
    while i < end and (deadline is None or time.monotonic() < deadline):
        stop = min(end, i + chunk)
        progress = mmap.mmap(-1, 64)
        struct.pack_into("<q", progress, 0, i)
        pid = os.fork()
        if pid == 0:
            _child(seed, i, stop, progress, n_threads, ops, work_per_byte, big, chains)
        last, since = i, time.monotonic()
        status = None
        while True:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                break
            cur = struct.unpack_from("<q", progress, 0)[0]
            now = time.monotonic()
            if cur != last:
                last, since = cur, now
            elif now - since > hang_s or (deadline is not None and now > deadline):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status = "hang" if now - since > hang_s else "deadline"
                break
            time.sleep(0.02)
        cur = struct.unpack_from("<q", progress, 0)[0]
        got = struct.unpack_from("<5q", progress, 8)
        for k, v in zip(_KINDS, got):
            counts[k] += v
        progress.close()
        if status == "deadline":
            break
        if on_chunk:
            on_chunk(dict(counts, graphs=sum(counts[k] for k in _KINDS)))
        if status != "hang" and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            i = stop
            continue
        if status == "hang":
            what = "hang"
        elif os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            what = f"signal {sig} ({signal.Signals(sig).name})"
        elif os.WEXITSTATUS(status) == EXIT_CANARY:
            what = "wrote beside a tensor (canary bytes changed)"
        else:
            what = f"exit {os.WEXITSTATUS(status)}"
        mut = mut or Mutator(load_seeds(), ops, big)
        f = Failure(cur, what, mut.make_chain(seed, cur) if chains else mut.make(seed, cur))
        failures.append(f)
        if on_failure:
            on_failure(f)
        if stop_at_failure:
            break
        i = cur + 1
    counts["graphs"] = sum(counts[k] for k in _KINDS)
    return counts, failures


def _guard_scratch():
    """Plans made from now on in this process put their scratch memory against a guard page."""
    from ggmlrpc.compute import cpu
    guard = getattr(cpu._native(), "set_scratch_guard", None)
    if guard is not None:
        guard(True)


def replay(seed: int, i: int, n_threads: int | None = None, ops=None, work_per_byte: int = WORK_PER_BYTE,
           big: bool = False, chains: bool = False) -> str:
    """Graph i of run `seed` (of multi-node graphs with `chains`), in this process (a
    fault kills the caller)."""
    mut = Mutator(load_seeds(), ops, big)
    case = mut.make_chain(seed, i) if chains else mut.make(seed, i)
    print(case.describe(), flush=True)
    _guard_scratch()
    return Runner(n_threads, work_per_byte, BIG_WORK if big else WORK_FLOOR).run(case)
