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
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import ggml
from .errors import ValidationError
from .protocol import RpcTensor


@dataclass
class Placement:
    """Where a tensor's bytes live: a buffer of the session and the offset into it."""

    buffer: object  # ServerBuffer
    offset: int


@dataclass
class Graph:
    device: int
    nodes: list[RpcTensor]
    tensors: dict[int, RpcTensor]
    placement: dict[int, Placement] = field(default_factory=dict)

    def buffers(self) -> set[int]:
        """Handles of every buffer the graph touches (a free of one drops the graph)."""
        return {p.buffer.handle for p in self.placement.values()}

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


def build_graph(session, device: int, node_ids: list[int], tensors: list[RpcTensor]) -> Graph:
    """Validate a decoded graph for `session`; raises ValidationError on any violation."""
    codec = session.codec
    by_id: dict[int, RpcTensor] = {}
    placement: dict[int, Placement] = {}
    for t in tensors:
        if t.id == 0:
            raise ValidationError("graph tensor with id 0")
        if t.id in by_id:  # duplicates: the first wins, as in llama.cpp
            continue
        if t.op >= ggml.OP_COUNT:
            raise ValidationError(f"tensor {t.name_str!r}: invalid op {t.op}")
        if t.op in ggml.FORBIDDEN_OPS:
            raise ValidationError(f"tensor {t.name_str!r}: {ggml.op_name(t.op)} is not allowed over RPC")
        codec.check_tensor_shape(t)
        if ggml.blck_size(t.type) > 1 and all(t.ne) and t.nb[0] != ggml.type_size(t.type):
            # ggml's layout rule for block types, on which its byte extent (ggml_nbytes)
            # rests: with another nb[0] the kernels would touch bytes past that extent
            raise ValidationError(f"tensor {t.name_str!r}: nb[0] of a block type must be its block's "
                                  f"size ({ggml.type_size(t.type)} bytes), not {t.nb[0]}")
        if t.buffer:
            buf = session.buffer(t.buffer)
            if not codec.range_inside(t.data, t.nbytes, buf.base, buf.size):
                raise ValidationError(f"tensor {t.name_str!r} lies outside its buffer")
            placement[t.id] = Placement(buf, t.data - buf.base)
        elif t.data:
            raise ValidationError(f"tensor {t.name_str!r} has data but no buffer")
        by_id[t.id] = t
    for t in by_id.values():
        for s in t.src:
            if s and s not in by_id:
                raise ValidationError(f"tensor {t.name_str!r} names source id {s:#x} that is not in the tensor list")
        if t.view_src:
            if t.view_src not in by_id:
                raise ValidationError(f"tensor {t.name_str!r} views id {t.view_src:#x} that is not in the tensor list")
            vs = placement.get(t.view_src)
            mine = placement.get(t.id)
            if vs is not None and (mine is None or mine.buffer is not vs.buffer):
                raise ValidationError(f"view {t.name_str!r} is not inside the buffer of its source")
    _refuse_cycles(by_id)
    nodes = []
    for nid in node_ids:
        if nid == 0:
            raise ValidationError("graph node id 0")
        node = by_id.get(nid)
        if node is None:
            raise ValidationError(f"graph node id {nid:#x} is not in the tensor list")
        nodes.append(node)
    return Graph(device, nodes, by_id, placement)


def _refuse_cycles(by_id: dict[int, RpcTensor]) -> None:
    """Raise if a tensor depends on itself through its sources and view source
    (an iterative depth-first search: a graph may hold half a million tensors)."""
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    for root in by_id:
        if root in state:
            continue
        state[root] = 1
        stack = [(root, iter(_deps(by_id[root])))]
        while stack:
            tid, deps = stack[-1]
            for d in deps:
                seen = state.get(d)
                if seen == 1:
                    raise ValidationError(f"tensor {by_id[d].name_str!r} depends on itself (a cycle in the graph)")
                if seen is None:
                    state[d] = 1
                    stack.append((d, iter(_deps(by_id[d]))))
                    break
            else:
                state[tid] = 2
                stack.pop()


def _deps(t: RpcTensor) -> list[int]:
    """The ids t depends on. A CPY's src[1] is its destination, not read: ggml_cast
    makes it the node itself, which is no cycle."""
    srcs = [s for i, s in enumerate(t.src) if s and not (i == 1 and s == t.id and t.op == ggml.GGMLOp.CPY)]
    return [*srcs, t.view_src] if t.view_src else srcs
