"""A GRAPH_COMPUTE payload, deserialized and validated against a session's buffers.

Rules (docs/protocol.md, "The graph payload"): every id a node, source or view
names exists in the tensor list, wherever it stands (as llama.cpp resolves ids), and
no tensor depends on itself through sources and view sources (no cycles; ggml_cast's
CPY, whose src[1] is the node itself, is none); node ids are nonzero; each tensor passes the shape checks (a block type's
nb[0] is its block size, ggml's layout rule, so that its byte extent is what the
kernels touch); a tensor with
data has a live buffer of this connection and lies inside it; a view lies inside
the buffer of what it views; no op outside ggml's range and no custom ops, whose
parameters are function pointers of the client process.

graph_from_payload validates a payload in place and returns a FlatGraph (the
server's and LocalBackend's form: the payload's records, no Python object per
tensor); Graph is the same interface over RpcTensor objects, for tests and tools
that build graphs by hand.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import ggml
from .errors import ProtocolError, ValidationError
from .peers import OP_GATHER
from .protocol import (MAX_SRC, TENSOR_SIZE, RpcTensor, encode_graph, graph_layout,
                       graph_tensors)


@dataclass
class Placement:
    """Where a tensor's bytes live: a buffer of the session and the offset into it."""

    buffer: object  # ServerBuffer
    offset: int


@dataclass
class Graph:
    """A graph of RpcTensor objects (not validated: see graph_from_payload)."""

    device: int
    nodes: list[RpcTensor]
    tensors: dict[int, RpcTensor]
    placement: dict[int, Placement] = field(default_factory=dict)

    def runnable(self) -> list[RpcTensor]:
        """The nodes a ggml backend runs: compute flag, not a view op, no empty dim."""
        return [n for n in self.nodes
                if n.flags & ggml.TensorFlag.COMPUTE
                and n.op not in ggml.VIEW_OPS
                and all(n.ne)]

    def sources(self, node: RpcTensor) -> list[RpcTensor | None]:
        """A node's sources as tensors (None for an absent one), trailing absent ones dropped."""
        srcs = [self.tensors[s] if s else None for s in node.src]
        while srcs and srcs[-1] is None:
            srcs.pop()
        return srcs


# an rpc_tensor as a numpy record (docs/protocol.md): the payload's tensors are read
# in place, field by field, with no Python object per tensor
TENSOR_DTYPE = np.dtype({
    "names": ["id", "type", "buffer", "ne", "nb", "op", "op_params", "flags", "src",
              "view_src", "view_offs", "data", "name", "use_count"],
    "formats": ["<u8", "<u4", "<u8", ("<u4", 4), ("<u4", 4), "<u4", ("<i4", 16), "<i4",
                ("<u8", MAX_SRC), "<u8", "<u8", "<u8", "S64", "<i4"],
    "offsets": [0, 8, 12, 20, 36, 52, 56, 120, 124, 204, 212, 220, 228, 292],
    "itemsize": TENSOR_SIZE})

_BLCK = np.array([ggml.blck_size(t) for t in range(256)], np.uint64)
_TSIZE = np.array([ggml.type_size(t) for t in range(256)], np.uint64)
_FORBIDDEN = np.array(sorted(ggml.FORBIDDEN_OPS), np.uint32)
_VIEW_OPS = np.array(sorted(ggml.VIEW_OPS), np.uint32)
_CPY = int(ggml.GGMLOp.CPY)
_COMPUTE = int(ggml.TensorFlag.COMPUTE)

# bytes of transient memory per payload byte while a graph is decoded and compiled
# (the payload itself, the id index, the source table): charged to the connection
DECODE_FACTOR = 2


class _Placements:
    """graph.placement of a FlatGraph: .get(id) -> Placement or None, made on demand."""

    def __init__(self, graph: "FlatGraph"):
        self._g = graph

    def get(self, tid: int, default=None):
        g = self._g
        r = g.row(tid)
        if r < 0:
            return default
        h = int(g.rows["buffer"][r])
        if not h:
            return default
        buf = g.buffers[h]
        return Placement(buf, int(g.rows["data"][r]) - buf.base)

    def __getitem__(self, tid: int) -> Placement:
        p = self.get(tid)
        if p is None:
            raise KeyError(tid)
        return p


class FlatGraph:
    """A validated graph kept as the payload's own records plus a sorted id index:
    RpcTensor objects are made only for the runnable nodes and their sources, when
    runnable() and sources() first hand them out, so a graph of half a million
    tensors that nothing computes costs a few arrays, not millions of Python objects.
    Offers Graph's interface to the executors; release() frees the objects in steps."""

    def __init__(self, codec, device: int, rows, offset: int, payload, nbytes, uid, urow,
                 node_rows, buffers):
        self.codec = codec
        self.device = device
        self.rows = rows            # TENSOR_DTYPE records, a view of the payload
        self.offset = offset        # of rows[0] in the payload
        self.payload = payload
        self.nbytes = nbytes        # ggml_nbytes per row (first occurrences)
        self.uid = uid              # the distinct ids, sorted
        self.urow = urow            # the row of each one's first occurrence
        self.node_rows = node_rows  # the row of each node, in graph order
        self.buffers = buffers      # handle -> ServerBuffer, every buffer a tensor names
        # the rows of the runnable nodes and of their sources, by id, looked up in one
        # pass (a dict of ints only: nothing the cyclic collector visits)
        run = self.runnable_rows()
        self._run = run.tolist()
        self._objs = {}             # row -> RpcTensor, for the runnable nodes and their sources
        want = np.concatenate([rows["id"][run], rows["src"][run].ravel(), rows["view_src"][run]])
        want = np.unique(want[want != 0])
        i = np.minimum(np.searchsorted(uid, want), max(len(uid) - 1, 0))
        hit = uid[i] == want if len(uid) else np.zeros(0, bool)
        self._rows = dict(zip(want[hit].tolist(), urow[i[hit]].tolist()))

    @property
    def placement(self) -> _Placements:
        # made per use, not kept: a kept one would be a reference cycle, and the graph's
        # arrays (the payload with them) would wait for the cyclic collector
        return _Placements(self)

    @property
    def n_nodes(self) -> int:
        return len(self.node_rows)

    def row(self, tid: int) -> int:
        """The row of id tid (its first occurrence), -1 when absent."""
        r = self._rows.get(tid)
        if r is not None:
            return r
        i = int(np.searchsorted(self.uid, tid))
        return int(self.urow[i]) if i < len(self.uid) and int(self.uid[i]) == tid else -1

    def tensor(self, r: int) -> RpcTensor:
        """Row r as an RpcTensor, made on first use and kept until release()."""
        t = self._objs.get(r)
        if t is None:
            t = self.codec.decode_tensor(self.payload, self.offset + TENSOR_SIZE * r)
            t.nbytes = int(self.nbytes[r])
            self._objs[r] = t
        return t

    def release(self, step: int = 4096) -> None:
        """Drop the tensors made so far, a step at a time: a loop in Python, which other
        threads interrupt, rather than one dict freed under the interpreter lock."""
        objs = self._objs
        while objs:
            for _ in range(min(step, len(objs))):
                objs.popitem()

    def runnable_rows(self):
        """Rows of the nodes a ggml backend runs: compute flag, not a view op, no empty dim."""
        nr = self.node_rows
        rows = self.rows
        keep = ((rows["flags"][nr] & _COMPUTE) != 0) & ~np.isin(rows["op"][nr], _VIEW_OPS) \
            & (rows["ne"][nr] != 0).all(axis=1)
        return nr[keep]

    def runnable(self):
        """The runnable nodes as RpcTensors, made on first use."""
        for r in self._run:
            yield self.tensor(r)

    def sources(self, node: RpcTensor) -> list[RpcTensor | None]:
        srcs = [self.tensor(self.row(s)) if s else None for s in node.src]
        while srcs and srcs[-1] is None:
            srcs.pop()
        return srcs


class NodeNames:
    """"name (op)" of each node of a plan, for error messages, kept in two arrays."""

    def __init__(self, names, ops):
        self._names = np.asarray(names, "S64")
        self._ops = np.asarray(ops, np.uint32)

    def __len__(self) -> int:
        return len(self._names)

    def __getitem__(self, i: int) -> str:
        name = bytes(self._names[i]).split(b"\0", 1)[0].decode("utf-8", "replace")
        return f"{name!r} ({ggml.op_name(int(self._ops[i]))})"

    @property
    def nbytes(self) -> int:
        return self._names.nbytes + self._ops.nbytes

    @classmethod
    def packed(cls, names: bytearray, ops) -> "NodeNames":
        """From 64 bytes of name per node, one after the other, and an array of ops."""
        return cls(np.frombuffer(bytes(names), "S64"), np.frombuffer(ops, np.uint32).copy())

    @classmethod
    def of(cls, nodes) -> "NodeNames":
        names, ops = bytearray(), []
        for n in nodes:
            names += n.name[:64].ljust(64, b"\0")
            ops.append(n.op)
        return cls.packed(names, np.array(ops, np.uint32))


def build_graph(session, device: int, node_ids: list[int], tensors: list[RpcTensor]) -> FlatGraph:
    """Validate a decoded graph for `session` (see graph_from_payload)."""
    return graph_from_payload(session, encode_graph(device, node_ids, tensors))


def graph_from_payload(session, payload) -> FlatGraph:
    """Validate a GRAPH_COMPUTE payload for `session`; raises ProtocolError on a bad
    layout, ValidationError on any rule of the module's docstring."""
    codec = session.codec
    size = len(payload)
    if size < 8:
        raise ProtocolError("graph payload shorter than 8 bytes")
    device, n_nodes = graph_layout(size, bytes(payload[:8]))
    node_ids = np.frombuffer(payload, "<u8", n_nodes, 8)
    if len(np.unique(node_ids)) != n_nodes:
        raise ValidationError("graph lists a node id more than once")
    off, n_tensors = graph_tensors(payload, n_nodes)
    rows = np.ndarray((n_tensors,), TENSOR_DTYPE, payload, off)

    def name(r) -> str:
        return bytes(rows["name"][r]).split(b"\0", 1)[0].decode("utf-8", "replace")

    def first_bad(mask, where):
        """The first row of `where` (rows, in list order) whose mask is set, or None."""
        i = np.flatnonzero(mask)
        return int(where[i[0]]) if len(i) else None

    ids = rows["id"]
    if n_tensors and not ids.all():
        raise ValidationError("graph tensor with id 0")
    order = np.argsort(ids, kind="stable")
    sid = ids[order]
    first = np.ones(n_tensors, bool)
    first[1:] = sid[1:] != sid[:-1]
    uid, urow = sid[first], order[first]     # duplicates: the first wins, as in llama.cpp
    del order, sid, first
    keep = np.sort(urow)                      # the rows that count, in list order
    op = rows["op"][keep]
    bad_op = op >= ggml.OP_COUNT
    if getattr(session, "group", None) is not None:   # the peer extension's op (ggmlrpc.peers)
        bad_op &= op != OP_GATHER
    r = first_bad(bad_op, keep)
    if r is not None:
        raise ValidationError(f"tensor {name(r)!r}: invalid op {int(rows['op'][r])}")
    r = first_bad(np.isin(op, _FORBIDDEN), keep)
    if r is not None:
        raise ValidationError(f"tensor {name(r)!r}: {ggml.op_name(int(rows['op'][r]))} is not "
                              "allowed over RPC")
    del op
    nbytes = np.zeros(n_tensors, np.uint64)
    r = codec.check_shapes(payload, off, keep, nbytes)
    if r >= 0:
        codec.check_tensor_shape(codec.decode_tensor(payload, off + TENSOR_SIZE * r))
        raise ValidationError("tensor shape check failed")  # not reached: the line above raises
    typ = rows["type"][keep]
    ne = rows["ne"][keep]
    nb0 = rows["nb"][keep][:, 0]
    r = first_bad((_BLCK[typ] > 1) & (ne != 0).all(axis=1) & (nb0 != _TSIZE[typ]), keep)
    if r is not None:
        # ggml's layout rule for block types, on which its byte extent (ggml_nbytes)
        # rests: with another nb[0] the kernels would touch bytes past that extent
        t = int(rows["type"][r])
        raise ValidationError(f"tensor {name(r)!r}: nb[0] of a block type must be its block's "
                              f"size ({ggml.type_size(t)} bytes), not {int(rows['nb'][r][0])}")
    del typ, ne, nb0
    buf = rows["buffer"][keep]
    data = rows["data"][keep]
    r = first_bad((buf == 0) & (data != 0), keep)
    if r is not None:
        raise ValidationError(f"tensor {name(r)!r} has data but no buffer")
    handles = np.unique(buf[buf != 0])
    buffers = {int(h): session.buffer(int(h)) for h in handles.tolist()}
    if len(handles):
        at = np.searchsorted(handles, buf)
        at[buf == 0] = 0
        base = np.array([buffers[int(h)].base for h in handles.tolist()], np.uint64)[at]
        bsize = np.array([buffers[int(h)].size for h in handles.tolist()], np.uint64)[at]
        d = data - base
        inside = (data >= base) & (d <= bsize) & (nbytes[keep] <= bsize - d)
        r = first_bad((buf != 0) & ~inside, keep)
        if r is not None:
            raise ValidationError(f"tensor {name(r)!r} lies outside its buffer")
        del at, base, bsize, d, inside
    del data

    def lookup(want):
        """Rows of the ids in `want` (-1 for 0), and a mask of the nonzero ones absent."""
        i = np.minimum(np.searchsorted(uid, want), max(len(uid) - 1, 0))
        found = (uid[i] == want) if len(uid) else np.zeros(want.shape, bool)
        return np.where(found, urow[i] if len(uid) else -1, -1), (want != 0) & ~found

    src = rows["src"][keep]
    src_rows, missing = lookup(src)
    bad = missing.any(axis=1)
    r = first_bad(bad, keep)
    if r is not None:
        s = int(src[np.flatnonzero(bad)[0]][missing[np.flatnonzero(bad)[0]]][0])
        raise ValidationError(f"tensor {name(r)!r} names source id {s:#x} that is not in the tensor list")
    del missing, bad
    vs = rows["view_src"][keep]
    vs_rows, missing = lookup(vs)
    r = first_bad(missing, keep)
    if r is not None:
        raise ValidationError(f"tensor {name(r)!r} views id {int(rows['view_src'][r]):#x} that "
                              "is not in the tensor list")
    vs_buf = np.where(vs_rows >= 0, rows["buffer"][np.maximum(vs_rows, 0)], 0)
    r = first_bad((vs_buf != 0) & (vs_buf != buf), keep)
    if r is not None:
        raise ValidationError(f"view {name(r)!r} is not inside the buffer of its source")
    del vs, vs_buf, buf
    # the dependency table, in positions of `keep`: a CPY's src[1] is its destination,
    # not read (ggml_cast makes it the node itself, which is no cycle)
    pos = np.full(n_tensors, -1, np.int32)
    pos[keep] = np.arange(len(keep), dtype=np.int32)
    deps = np.empty((len(keep), MAX_SRC + 1), np.int32)
    deps[:, :MAX_SRC] = np.where(src_rows >= 0, pos[np.maximum(src_rows, 0)], -1)
    deps[:, MAX_SRC] = np.where(vs_rows >= 0, pos[np.maximum(vs_rows, 0)], -1)
    self_cpy = (rows["op"][keep] == _CPY) & (src[:, 1] == rows["id"][keep])
    deps[self_cpy, 1] = -1
    del src, src_rows, vs_rows, self_cpy
    c = codec.find_cycle(deps)
    del deps, pos
    if c >= 0:
        raise ValidationError(f"tensor {name(int(keep[c]))!r} depends on itself (a cycle in the graph)")
    if n_nodes and not node_ids.all():
        raise ValidationError("graph node id 0")
    node_rows, missing = lookup(node_ids)
    if missing.any():
        nid = int(node_ids[np.flatnonzero(missing)[0]])
        raise ValidationError(f"graph node id {nid:#x} is not in the tensor list")
    return FlatGraph(codec, device, rows, off, payload, nbytes, uid, urow.astype(np.int64),
                     node_rows.astype(np.int64), buffers)
