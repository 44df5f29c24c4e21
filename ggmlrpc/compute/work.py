"""How much work a graph asks for, and the limit a server puts on it.

A tensor's bytes are bounded by the buffers a client allocated, but not its
logical shape: with stride 0 a few bytes stand for 2^63 elements, and a node over
them would keep the executor's threads busy for years. So before a graph is
planned its work is estimated from shapes and op params alone (every element of
every tensor visited once, times the inner loop of the ops that have one: the K
of a matrix product, the taps of a convolution or a pool, the keys of an
attention...) and compared with a budget proportional to the memory that backs
the graph (the distinct buffers it touches): `per_byte` units of work per byte,
never less than FLOOR.

The unit is one multiply-add of a Q8_0 matrix product; a product with another
weight type costs its weight in matmul_cost.WEIGHTS per multiply-add (measured by
bench/calibrate_work.py: the IQ1..IQ3 kernels take a hundred times longer per
multiply-add than Q8_0's); other vectorized inner loops (attention, convolutions) cost 1; an element visited by a plain loop costs ELEM_COST
units and a row ROW_COST (a row of one element costs about as much as a
hundred products: the per-row setup dominates). A llama.cpp prompt graph does
about n_tokens multiply-adds per weight, and little else: a few thousand units per
byte of quantized weights for a 512..2048-token batch of the fast types, a few hundred
thousand for the IQ1..IQ3 types, whose kernels cost a hundred times more per
multiply-add. The server's default (DEFAULT_PER_BYTE) passes a 7B model's
2,048-token prompt graph in every weight type with a margin (a graph ggml's CPU
backend computes for a real model is never refused), and bounds a hostile graph to
seconds of one core per MiB it touches; what keeps such a graph from holding the
other clients is that graphs take turns on a device (compute/cpu.py's Turns).
"""
from __future__ import annotations

from .. import ggml
from ..errors import ValidationError
from ..protocol import checked
from ..ggml import GGMLOp as Op
from .matmul_cost import WEIGHTS

DEFAULT_PER_BYTE = 1 << 20   # --max-graph-work: work per byte the graph's nodes use
FLOOR = 1 << 32              # what any graph may do, whatever its buffers
ELEM_COST = 16               # per element of each tensor, and per step of a scalar loop
ROW_COST = 256               # per row of each tensor
QUANTIZE_COST = 32           # per element written in a quantized type (block searches), x ELEM_COST
# Logical elements of one tensor of a graph, a bound apart from the work limit: 2^48
# is some 10^5 times the largest tensors of today's models (a 128k-token embedding
# table of width 16384 has 2^31 elements; the KQ scores of 512 tokens over a 128k
# context and 128 heads 2^33), so it refuses nothing ggml's CPU backend would
# compute in practice, and it keeps every size computed from a shape far from 2^64.
MAX_ELEMENTS = 1 << 48


def _n(t) -> int:
    if t is None:
        return 0
    return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]


def _rows(t) -> int:
    return 0 if t is None else t.ne[1] * t.ne[2] * t.ne[3]


def _ne(t, i) -> int:
    return 1 if t is None else max(1, t.ne[i])


def matmul_weight(t: int) -> float:
    """Cost of one multiply-add of a product whose weights are of type t (unknown: the
    dearest)."""
    return WEIGHTS.get(ggml.type_name(t), _DEAREST)


_DEAREST = max(WEIGHTS.values())


def _p(node, i) -> int:
    return max(1, abs(node.op_params[i]))


def _src(srcs, i):
    return srcs[i] if i < len(srcs) else None


def node_work(node, srcs) -> int:
    """Estimated work of one node (srcs: its sources, None where absent)."""
    tensors = [node] + [s for s in srcs if s is not None]
    base = sum(ELEM_COST * _n(t) + ROW_COST * _rows(t) for t in tensors)
    if ggml.is_quantized(node.type):
        base += QUANTIZE_COST * ELEM_COST * _n(node)
    return base + _inner(node, srcs)


def _inner(node, srcs) -> int:
    """The work of an op's inner loop beyond visiting its tensors."""
    d = node
    s0, s1, s2 = _src(srcs, 0), _src(srcs, 1), _src(srcs, 2)
    E = ELEM_COST
    op = node.op
    if op in (Op.MUL_MAT, Op.MUL_MAT_ID):
        return int(_n(d) * _ne(s0, 0) * matmul_weight(s0.type if s0 is not None else 0))
    if op == Op.OUT_PROD:
        return _n(d) * _ne(s0, 1)
    if op == Op.FLASH_ATTN_EXT:      # every query row against every key: convert, dot, mix
        return _rows(s0) * _ne(s1, 1) * (4 * (_ne(s0, 0) + _ne(s2, 0)) + ROW_COST // 4)
    if op == Op.LIGHTNING_INDEXER:
        return _n(s0) * _ne(s1, 2)
    if op in (Op.CONV_2D, Op.CONV_3D):   # a patch unfolded per output position, a dot per output
        K = _ne(s0, 0) * _ne(s0, 1) * _ne(s0, 2) if op == Op.CONV_2D else _n(s0) // _p(node, 11)
        oc = _ne(s0, 3) if op == Op.CONV_2D else max(1, _p(node, 11))
        return _n(d) * (K + ROW_COST) + _n(d) // oc * K * 4 * E
    if op == Op.CONV_2D_DW:
        return _n(d) * _ne(s0, 0) * _ne(s0, 1)
    if op in (Op.CONV_TRANSPOSE_1D, Op.CONV_TRANSPOSE_2D):
        cin = _ne(s0, 3 if op == Op.CONV_TRANSPOSE_2D else 2)
        return _n(s1) * (_n(s0) // cin)
    if op == Op.IM2COL_BACK:         # integer divisions per tap
        return 2 * ROW_COST * _n(d) * _ne(s1, 0) * _ne(s1, 1)
    if op == Op.COL2IM_1D:
        return E * _n(d) * min(_ne(s0, 0), _ne(s0, 1))
    if op == Op.POOL_1D:
        return E * _n(d) * _p(node, 1)
    if op == Op.POOL_2D:
        return E * _n(d) * _p(node, 1) * _p(node, 2)
    if op == Op.POOL_2D_BACK:
        return E * _n(s0) * _p(node, 1) * _p(node, 2)
    if op == Op.SSM_CONV:
        return E * _n(d) * _ne(s1, 0)
    if op == Op.SSM_SCAN:
        return E * _n(s1) * _ne(s0, 0)
    if op in (Op.RWKV_WKV6, Op.GATED_LINEAR_ATTN, Op.RWKV_WKV7, Op.GATED_DELTA_NET):
        # every token of every head updates its S x S state: src0 is (S, H, T)
        return 32 * E * _n(s0) * _ne(s0, 0)
    if op == Op.SOLVE_TRI:
        return E * _n(s1) * _ne(s0, 0)
    if op in (Op.ARGSORT, Op.TOP_K):
        return E * _n(s0) * _ne(s0, 0).bit_length()
    if op == Op.DSV4_HC_COMB:        # n_iter rounds over each token's 4 x 4 matrix
        return E * 16 * _n(d) * _p(node, 1)
    if op == Op.DSV4_HC_POST:
        return E * _n(d) * _ne(s1, 1)
    if op == Op.UPSCALE:             # up to 16 taps, more when a filter spans a shrink
        span = 1
        for i in range(2):
            span *= _ne(s0, i) // _ne(d, i) + 1
        return E * _n(d) * 16 * span
    return 0


def _nodes(graph):
    """(node, sources) of every node the executor runs."""
    for node in graph.runnable():
        yield node, graph.sources(node)


def graph_work(graph) -> int:
    return sum(node_work(node, srcs) for node, srcs in _nodes(graph))


def backing_bytes(graph) -> int:
    """Bytes the computed nodes read and write: the union, per buffer, of the byte
    ranges of every runnable node and its sources."""
    spans: dict[int, list[tuple[int, int]]] = {}
    seen = set()
    for node, srcs in _nodes(graph):
        for t in (node, *srcs):
            if t is None or t.id in seen:
                continue
            seen.add(t.id)
            p = graph.placement.get(t.id)
            if p is not None:
                n = min(ggml.nbytes(t.type, t.ne, t.nb), max(0, p.buffer.size - p.offset))
                spans.setdefault(id(p.buffer), []).append((p.offset, p.offset + n))
    total = 0
    for ranges in spans.values():
        end = 0
        for a, b in sorted(ranges):
            a = max(a, end)
            if b > a:
                total += b - a
                end = b
    return total


def check_elements(graph) -> None:
    """Every tensor a node reads or writes has at most MAX_ELEMENTS logical elements,
    whatever the work limit (--max-graph-work 0 included)."""
    for node, srcs in _nodes(graph):
        for t in (node, *srcs):
            if t is not None and _n(t) > MAX_ELEMENTS:
                checked(_n(t), f"tensor {t.name_str!r} ({ggml.op_name(node.op)} node "
                        f"{node.name_str!r}): its number of elements", MAX_ELEMENTS)


def check_graph(graph, per_byte: int | None, floor: int = FLOOR) -> int:
    """Raise ValidationError when a tensor has more than MAX_ELEMENTS elements or the
    graph's work is over max(floor, per_byte x the bytes its nodes use, backing_bytes);
    per_byte None or 0: no work limit. Returns the estimate."""
    check_elements(graph)
    if not per_byte:
        return 0
    used = backing_bytes(graph)
    limit = max(floor, per_byte * used)
    total = 0
    for node, srcs in _nodes(graph):
        total += node_work(node, srcs)
        if total > limit:
            raise ValidationError(
                f"graph rejected: its work (about {total:.3g} operations by node {node.name_str!r}, "
                f"{ggml.op_name(node.op)}) is over the limit of {limit:.3g} for the "
                f"{used} bytes its nodes read and write (--max-graph-work {per_byte})")
    return total
