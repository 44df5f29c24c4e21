"""A small ggml-style graph builder: functions named after ggml's that take and return
`client.Tensor` records, infer the result's shape and type, pack the op parameters
as ggml does, and check what ggml asserts (so a wrong graph fails here, in the
builder, with a message, instead of on a server).

    x   = inputs.new(GGMLType.F32, (n_embd, n_tokens), "x")
    cur = mul(rms_norm(x, 1e-5), w_norm)
    q   = reshape(mul_mat(wq, cur), (head_dim, n_head, n_tokens))
    g = Graph(); g.expand(mul_mat(w_out, cur), output=True)
    alloc = Allocator(); size = alloc.plan(g); alloc.place(buffer); rb.graph_compute(g.nodes)

Views (view, reshape, permute, transpose) keep ggml's bookkeeping: `view_src` is
the tensor that owns the bytes and `view_offs` the byte offset into it, so they
need no memory of their own. `Allocator` gives every other node of a graph an
offset in one compute buffer, reusing memory once a tensor's last user has run
(a first-fit version of ggml-alloc), and resolves the views' addresses after.
"""
from __future__ import annotations

import math
import struct
from typing import Sequence

from . import ggml
from .client import RemoteBuffer, Tensor
from .ggml import GGMLGluOp, GGMLOp, GGMLType, GGMLUnaryOp, TensorFlag


def f32_bits(x: float) -> int:
    """A float op parameter as ggml stores it (its bits in an int32 slot)."""
    return struct.unpack("<i", struct.pack("<f", x))[0]


def _ne4(ne: Sequence[int]) -> tuple[int, int, int, int]:
    return tuple(int(x) for x in ne) + (1,) * (4 - len(ne))


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise ValueError(what)


def _node(op: int, type: int, ne, *src: Tensor | None, params: Sequence[int] = (),
          name: str = "") -> Tensor:
    return Tensor(type, _ne4(ne), op=op, src=src, op_params=params, name=name,
                  flags=TensorFlag.COMPUTE)


def _can_repeat(b: Tensor, a: Tensor) -> bool:
    return all(a.ne[i] % b.ne[i] == 0 for i in range(4))


def is_contiguous(t: Tensor) -> bool:
    return tuple(t.nb) == ggml.contiguous_strides(t.type, t.ne)


def _root(t: Tensor) -> tuple[Tensor, int]:
    return (t.view_src, t.view_offs) if t.view_src is not None else (t, 0)


# -- views -------------------------------------------------------------------

def view(a: Tensor, ne: Sequence[int], nb: Sequence[int] | None = None, offset: int = 0,
         name: str = "", op: int = GGMLOp.VIEW, params: Sequence[int] | None = None) -> Tensor:
    """ggml_view_4d: `ne` elements of `a`'s memory with strides `nb` (contiguous by
    default) from byte `offset`."""
    ne = _ne4(ne)
    nb = tuple(nb) if nb is not None else ggml.contiguous_strides(a.type, ne)
    if len(nb) < 4:
        nb = tuple(nb) + (nb[-1] * ne[len(nb) - 1],) * (4 - len(nb))
    root, offs = _root(a)
    t = Tensor(a.type, ne, nb=nb, op=op, src=[a],
               op_params=[offset] if params is None else params, view_src=root,
               view_offs=offs + offset, name=name or f"{a.name} (view)", flags=TensorFlag.COMPUTE)
    _check(ggml.nbytes(a.type, ne, nb) + offset <= ggml.nbytes(a.type, a.ne, a.nb)
           or root is not a, f"view of {a.name!r} runs past its end")
    return t


def reshape(a: Tensor, ne: Sequence[int], name: str = "") -> Tensor:
    ne = _ne4(ne)
    _check(is_contiguous(a), f"reshape of non-contiguous {a.name!r}")
    _check(math.prod(ne) == math.prod(a.ne), f"reshape {a.ne} -> {ne} changes the element count")
    return view(a, ne, offset=0, name=name or f"{a.name} (reshaped)", op=GGMLOp.RESHAPE, params=())


def permute(a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int, name: str = "") -> Tensor:
    """ggml_permute: source dim i goes to position axis_i."""
    axes = (axis0, axis1, axis2, axis3)
    _check(sorted(axes) == [0, 1, 2, 3], f"permute axes {axes} are not a permutation")
    ne, nb = [0] * 4, [0] * 4
    for i, ax in enumerate(axes):
        ne[ax], nb[ax] = a.ne[i], a.nb[i]
    return view(a, ne, nb, 0, name or f"{a.name} (permuted)", GGMLOp.PERMUTE, axes)


def transpose(a: Tensor, name: str = "") -> Tensor:
    ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])
    nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
    return view(a, ne, nb, 0, name or f"{a.name} (transposed)", GGMLOp.TRANSPOSE, ())


# -- compute -----------------------------------------------------------------

def mul_mat(a: Tensor, b: Tensor, name: str = "", prec_f32: bool = False) -> Tensor:
    """a (K, M, ...) x b (K, N, ...) -> (M, N, ...) F32; b's batch dims broadcast a's."""
    _check(a.ne[0] == b.ne[0], f"mul_mat: {a.name!r} has {a.ne[0]} columns, {b.name!r} {b.ne[0]}")
    _check(b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0, "mul_mat: batch dims do not broadcast")
    _check(not ggml.is_quantized(b.type), "mul_mat: the second operand cannot be quantized")
    return _node(GGMLOp.MUL_MAT, GGMLType.F32, (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), a, b,
                 params=[10] if prec_f32 else (), name=name)


def _binary(op: int, a: Tensor, b: Tensor, name: str) -> Tensor:
    _check(_can_repeat(b, a), f"{ggml.op_name(op)}: {b.ne} does not broadcast to {a.ne}")
    return _node(op, a.type, a.ne, a, b, name=name)


def add(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    return _binary(GGMLOp.ADD, a, b, name)


def mul(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    return _binary(GGMLOp.MUL, a, b, name)


def div(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    return _binary(GGMLOp.DIV, a, b, name)


def repeat(a: Tensor, ne: Sequence[int], name: str = "") -> Tensor:
    """a tiled to shape ne (ggml_repeat_4d): each dimension a multiple of a's."""
    _check(all(n % m == 0 for n, m in zip(_ne4(ne), a.ne)), "repeat: shape is not a multiple of the source's")
    return _node(GGMLOp.REPEAT, a.type, ne, a, name=name)


def unary(op: int, a: Tensor, name: str = "") -> Tensor:
    """ggml_unary: GGMLUnaryOp `op` element by element."""
    return _node(GGMLOp.UNARY, a.type, a.ne, a, params=[int(op)], name=name)


def silu(a: Tensor, name: str = "") -> Tensor:
    return unary(GGMLUnaryOp.SILU, a, name)


def add_id(a: Tensor, b: Tensor, ids: Tensor, name: str = "") -> Tensor:
    """a (n, n_used, T) plus the row of b (n, n_expert) that ids (n_used, T) names."""
    _check(a.ne[0] == b.ne[0] and a.ne[1] == ids.ne[0] and a.ne[2] == ids.ne[1]
           and ids.type == GGMLType.I32, "add_id: shapes do not match")
    return _node(GGMLOp.ADD_ID, a.type, a.ne, a, b, ids, name=name)


def sum_rows(a: Tensor, name: str = "") -> Tensor:
    return _node(GGMLOp.SUM_ROWS, a.type, (1, *a.ne[1:]), a, name=name)


def clamp(a: Tensor, lo: float, hi: float, name: str = "") -> Tensor:
    return _node(GGMLOp.CLAMP, a.type, a.ne, a, params=[f32_bits(lo), f32_bits(hi)], name=name)


def mul_mat_id(experts: Tensor, b: Tensor, ids: Tensor, name: str = "") -> Tensor:
    """experts (K, M, n_expert) applied to b (K, n_b, n_tokens) as chosen by ids
    (n_used, n_tokens) I32 -> (M, n_used, n_tokens) F32."""
    _check(ids.type == GGMLType.I32 and ids.ne[2] == 1 and ids.ne[3] == 1, "mul_mat_id: ids must be 2-D I32")
    _check(experts.ne[0] == b.ne[0] and ids.ne[1] == b.ne[2] and ids.ne[0] % b.ne[1] == 0,
           "mul_mat_id: shapes do not match")
    return _node(GGMLOp.MUL_MAT_ID, GGMLType.F32, (experts.ne[1], ids.ne[0], b.ne[2], 1),
                 experts, b, ids, name=name)


def argsort(a: Tensor, descending: bool = False, name: str = "") -> Tensor:
    """Indices (I32) that sort each row of a."""
    return _node(GGMLOp.ARGSORT, GGMLType.I32, a.ne, a, params=[1 if descending else 0], name=name)


def argsort_top_k(a: Tensor, k: int, name: str = "") -> Tensor:
    """The indices of each row's k largest values, largest first (a view of argsort)."""
    _check(a.ne[0] >= k, "argsort_top_k: k larger than the row")
    s = argsort(a, True)
    return view(s, (k, *s.ne[1:]), (s.nb[0], *s.nb[1:]), 0, name=name or f"{s.name} (top {k})")


def scale(a: Tensor, s: float, bias: float = 0.0, name: str = "") -> Tensor:
    return _node(GGMLOp.SCALE, a.type, a.ne, a, params=[f32_bits(s), f32_bits(bias)], name=name)


def norm(a: Tensor, eps: float, name: str = "") -> Tensor:
    """LayerNorm without the affine part: (x - mean) / sqrt(var + eps) per row."""
    return _node(GGMLOp.NORM, a.type, a.ne, a, params=[f32_bits(eps)], name=name)


def rms_norm(a: Tensor, eps: float, name: str = "") -> Tensor:
    return _node(GGMLOp.RMS_NORM, a.type, a.ne, a, params=[f32_bits(eps)], name=name)


def cont(a: Tensor, ne: Sequence[int] | None = None, name: str = "") -> Tensor:
    ne = _ne4(ne) if ne is not None else a.ne
    _check(math.prod(ne) == math.prod(a.ne), "cont: element count changes")
    return _node(GGMLOp.CONT, a.type, ne, a, name=name or f"{a.name} (cont)")


def cpy(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    """Copy a into b's memory (converting the type): the result is a view of b."""
    _check(math.prod(a.ne) == math.prod(b.ne), "cpy: element counts differ")
    root, offs = _root(b)
    return Tensor(b.type, b.ne, nb=b.nb, op=GGMLOp.CPY, src=[a, b], view_src=root, view_offs=offs,
                  name=name or f"{b.name} (copy of {a.name})", flags=TensorFlag.COMPUTE)


def get_rows(a: Tensor, rows: Tensor, name: str = "") -> Tensor:
    """Rows `rows` (I32) of a -> (a.ne[0], len(rows), ...), F32 (I32 for I32 a)."""
    _check(rows.type == GGMLType.I32, "get_rows: row ids must be I32")
    _check(a.ne[2] == rows.ne[1] and rows.ne[3] == 1, "get_rows: batch dims differ")
    out = GGMLType.I32 if a.type == GGMLType.I32 else GGMLType.F32
    return _node(GGMLOp.GET_ROWS, out, (a.ne[0], rows.ne[0], rows.ne[1], rows.ne[2]), a, rows,
                 name=name)


def set_rows(dst: Tensor, src: Tensor, rows: Tensor, name: str = "") -> Tensor:
    """Write src's rows into dst at `rows` (I64 or I32); the result is a view of dst."""
    _check(dst.ne[0] == src.ne[0] and dst.ne[2] == src.ne[2] and dst.ne[3] == src.ne[3],
           "set_rows: row shapes differ")
    _check(src.ne[1] == rows.ne[0] and rows.ne[3] == 1, "set_rows: one index per source row")
    _check(rows.type in (GGMLType.I64, GGMLType.I32), "set_rows: indices must be I64 or I32")
    root, offs = _root(dst)
    return Tensor(dst.type, dst.ne, nb=dst.nb, op=GGMLOp.SET_ROWS, src=[src, rows, dst],
                  view_src=root, view_offs=offs, name=name or f"{dst.name} (view)",
                  flags=TensorFlag.COMPUTE)


def rope_ext(a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int, mode: int,
             n_ctx_orig: int, freq_base: float, freq_scale: float = 1.0, ext_factor: float = 0.0,
             attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0,
             name: str = "") -> Tensor:
    """Rotary embedding of a (head_dim, n_head, n_tokens) by positions `pos` (I32)."""
    _check(pos.type == GGMLType.I32 and pos.ne[0] == a.ne[2], "rope: one I32 position per token")
    params = [0, n_dims, mode, 0, n_ctx_orig] + [f32_bits(v) for v in (
        freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)]
    return _node(GGMLOp.ROPE, a.type, a.ne, a, pos, freq_factors, params=params, name=name)


def soft_max(a: Tensor, name: str = "") -> Tensor:
    return soft_max_ext(a, None, 1.0, 0.0, name=name)


def soft_max_ext(a: Tensor, mask: Tensor | None, scale: float, max_bias: float = 0.0,
                 name: str = "", sinks: Tensor | None = None) -> Tensor:
    """soft_max(a * scale + mask) per row; `sinks` (F32, one per head) adds a logit
    that takes probability but gives no value (ggml_soft_max_add_sinks)."""
    if mask is not None:
        _check(mask.ne[0] == a.ne[0] and mask.ne[1] >= a.ne[1], "soft_max: mask too small")
    if sinks is not None:
        _check(sinks.type == GGMLType.F32 and sinks.ne[0] == a.ne[2], "soft_max: one F32 sink per head")
    return _node(GGMLOp.SOFT_MAX, a.type, a.ne, a, mask, sinks,
                 params=[f32_bits(scale), f32_bits(max_bias)], name=name)


def flash_attn_ext(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
                   max_bias: float = 0.0, logit_softcap: float = 0.0, prec_f32: bool = True,
                   name: str = "", sinks: Tensor | None = None) -> Tensor:
    """q (D, n_q, H, B), k/v (D, n_kv, H_kv, B), mask F16 (n_kv, >= n_q) ->
    (Dv, H, n_q, B) F32; precision F32 as llama.cpp asks."""
    _check(q.ne[0] == k.ne[0] and k.ne[1] == v.ne[1], "flash_attn_ext: q/k/v shapes differ")
    _check(q.ne[2] % k.ne[2] == 0, "flash_attn_ext: heads do not divide")
    if mask is not None:
        _check(mask.type == GGMLType.F16 and mask.ne[0] == k.ne[1] and mask.ne[1] >= q.ne[1],
               "flash_attn_ext: mask must be F16 (n_kv, >= n_q)")
    if sinks is not None:
        _check(sinks.type == GGMLType.F32 and sinks.ne[0] == q.ne[2], "flash_attn_ext: one F32 sink per head")
    params = [f32_bits(scale), f32_bits(max_bias), f32_bits(logit_softcap), 10 if prec_f32 else 0]
    return _node(GGMLOp.FLASH_ATTN_EXT, GGMLType.F32, (v.ne[0], q.ne[2], q.ne[1], q.ne[3]),
                 q, k, v, mask, sinks, params=params, name=name)


def glu_split(op: int, a: Tensor, b: Tensor, name: str = "") -> Tensor:
    """ggml_glu_split: act(a) * b, e.g. GGMLGluOp.SWIGLU for llama's feed-forward."""
    _check(a.ne == b.ne, "glu: shapes differ")
    return _node(GGMLOp.GLU, a.type, a.ne, a, b, params=[int(op), 0], name=name)


def glu(op: int, a: Tensor, swapped: bool = False, name: str = "") -> Tensor:
    """ggml_glu on one tensor: act(first half of each row) * second half (swapped:
    the other way round)."""
    _check(a.ne[0] % 2 == 0, "glu: odd row length")
    return _node(GGMLOp.GLU, a.type, (a.ne[0] // 2, *a.ne[1:]), a, params=[int(op), int(swapped)],
                 name=name)


def swiglu_oai(a: Tensor, b: Tensor, alpha: float, limit: float, name: str = "") -> Tensor:
    """gpt-oss's clamped SwiGLU: ggml_swiglu_oai."""
    _check(a.ne == b.ne, "glu: shapes differ")
    return _node(GGMLOp.GLU, a.type, a.ne, a, b,
                 params=[int(GGMLGluOp.SWIGLU_OAI), 0, f32_bits(alpha), f32_bits(limit)], name=name)


def swiglu_split(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    return glu_split(GGMLGluOp.SWIGLU, a, b, name)


# -- memory ------------------------------------------------------------------

class Inputs:
    """Leaf tensors at fixed offsets of one buffer (inputs written before each run)."""

    def __init__(self, alignment: int = 32):
        self.alignment = alignment
        self.tensors: list[Tensor] = []
        self.size = 0

    def new(self, type: int, ne: Sequence[int], name: str) -> Tensor:
        t = Tensor(type, _ne4(ne), name=name, flags=TensorFlag.INPUT)
        t.offset = self.size
        self.size += _align(t.nbytes, self.alignment)
        self.tensors.append(t)
        return t

    def place(self, buffer: RemoteBuffer) -> None:
        for t in self.tensors:
            t.buffer, t.data = buffer, buffer.base + t.offset


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class Graph:
    """The nodes of one computation in ggml's order: `expand(t)` adds t and every
    source it needs that is not in yet, sources first (ggml_build_forward_expand).
    Expansion order is execution order, so a write (SET_ROWS into a cache) that a
    later read only reaches through memory is expanded before that read."""

    def __init__(self):
        self.tensors: list[Tensor] = []     # leaves and nodes, sources first
        self.outputs: list[Tensor] = []
        self._seen: set[int] = set()

    def expand(self, t: Tensor, output: bool = False) -> Tensor:
        stack = [(t, False)]
        while stack:
            x, ready = stack.pop()
            if x is None or (x.id in self._seen and not ready):
                continue
            if ready:
                self.tensors.append(x)
                continue
            self._seen.add(x.id)
            stack.append((x, True))
            for s in reversed([*x.src, x.view_src]):
                if s is not None and s.id not in self._seen:
                    stack.append((s, False))
        if output:
            t.flags |= TensorFlag.OUTPUT
            self.outputs.append(t)
        return t

    @property
    def nodes(self) -> list[Tensor]:
        return [t for t in self.tensors if t.op != GGMLOp.NONE]


class Allocator:
    """Offsets in one compute buffer for the nodes of a graph that own memory.

    `plan(graph)` returns the bytes needed; `place(buffer)` then sets every node's
    buffer and address (views: their root's address plus their offset). Memory of
    a tensor is reused once every node that reads it has run; the graph's outputs
    are never overwritten.
    """

    def __init__(self, alignment: int = 32):
        self.alignment = alignment
        self.offsets: dict[int, int] = {}
        self.order: list[Tensor] = []
        self.size = 0

    def plan(self, graph: Graph) -> int:
        order = self.order = graph.tensors
        owner = lambda t: t.view_src if t.view_src is not None else t  # noqa: E731
        last_use: dict[int, int] = {}
        for i, t in enumerate(order):
            for s in (*t.src, t.view_src):
                if s is not None:
                    last_use[owner(s).id] = i
        keep = {owner(t).id for t in graph.outputs}
        free: list[tuple[int, int]] = []   # (offset, size), sorted by offset
        for i, t in enumerate(order):
            if t.view_src is None and t.op != GGMLOp.NONE and t.buffer is None:
                self.offsets[t.id] = self._take(free, _align(t.nbytes, self.alignment))
            done = {owner(s).id: owner(s) for s in (*t.src, t.view_src) if s is not None}
            for s in done.values():
                if last_use.get(s.id) == i and s.id in self.offsets and s.id not in keep:
                    self._give(free, self.offsets[s.id], _align(s.nbytes, self.alignment))
        return self.size

    def _take(self, free: list[tuple[int, int]], n: int) -> int:
        for j, (off, size) in enumerate(free):
            if size >= n:
                if size == n:
                    free.pop(j)
                else:
                    free[j] = (off + n, size - n)
                return off
        if free and free[-1][0] + free[-1][1] == self.size:   # grow the free tail
            off = free.pop()[0]
            self.size = off + n
            return off
        off = self.size
        self.size += n
        return off

    def _give(self, free: list[tuple[int, int]], off: int, n: int) -> None:
        free.append((off, n))
        free.sort()
        merged: list[tuple[int, int]] = []
        for o, s in free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        free[:] = merged

    def place(self, buffer: RemoteBuffer) -> None:
        for t in self.order:
            if t.id in self.offsets:
                t.buffer, t.data = buffer, buffer.base + self.offsets[t.id]
        for t in self.order:
            if t.view_src is not None and t.view_src.buffer is not None:
                t.buffer, t.data = t.view_src.buffer, t.view_src.data + t.view_offs
