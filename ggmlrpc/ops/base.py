"""The vocabulary of the op rules: messages, shape predicates, source counts.

Every backend's rules use these, so a node is described and rejected in the same
words whichever backend looks at it.
"""
from __future__ import annotations

import importlib
import struct

from .. import ggml
from ..errors import UnsupportedError, ValidationError


def describe(node, srcs, what: str) -> str:
    types = ", ".join(ggml.type_name(s.type) if s is not None else "-" for s in srcs)
    return (f"op {ggml.op_name(node.op)} ({ggml.type_name(node.type)} <- {types or '-'}) "
            f"of node {node.name_str!r} {what}")


def invalid(node, srcs, why: str):
    """What ggml rejects (its backends assert and abort)."""
    return ValidationError(describe(node, srcs, f"is invalid: {why}"))


def no_empty_sources(node, srcs, allowed=frozenset()):
    """Refuse a node with a source that has an empty dimension, unless its op is in
    `allowed` (the ops whose rules and kernels a backend has checked with empty sources):
    a rule would divide by the empty dim, a kernel index into no bytes."""
    if node.op not in allowed and any(s is not None and not all(s.ne) for s in srcs):
        raise invalid(node, srcs, "a source has an empty dimension")


def unknown(node, srcs, what: str):
    """An op parameter naming a variant that ggml has no code for."""
    return UnsupportedError(describe(node, srcs, what))


# ---- shape predicates (ggml's names where ggml has one) -----------------------------

def ts(t) -> int:
    return ggml.type_size(t.type)


def blck(t) -> int:
    return ggml.blck_size(t.type)


def nelements(t) -> int:
    return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]


def nrows(t) -> int:
    return t.ne[1] * t.ne[2] * t.ne[3]


def row_bytes(t) -> int:
    return t.ne[0] // blck(t) * ts(t)


def rows_contiguous(t) -> bool:
    return t.nb[0] == ts(t) or t.ne[0] == blck(t)


def contiguous(t, from_dim: int = 0) -> bool:
    """ggml_is_contiguous (from_dim 0) / _1 / _2: dims above from_dim packed."""
    if not rows_contiguous(t):
        return False
    nxt = ts(t) * (t.ne[0] // blck(t))
    for i in range(1, 4):
        if i > from_dim:
            if t.ne[i] != 1 and t.nb[i] != nxt:
                return False
            nxt *= t.ne[i]
        else:
            nxt = t.ne[i] * t.nb[i]
    return True


def same_shape(a, b) -> bool:
    return tuple(a.ne) == tuple(b.ne)


def can_repeat(small, big) -> bool:
    return all(s > 0 and b % s == 0 for s, b in zip(small.ne, big.ne))


def f32_param(node, i: int) -> float:
    return struct.unpack("<f", struct.pack("<i", node.op_params[i]))[0]


def conv_out(ins, ks, s, p, d):
    """ggml_calc_conv_output_size: C's division, which truncates toward zero (a
    kernel wider than the padded input still gives one output)."""
    num = ins + 2 * p - d * (ks - 1) - 1
    return (abs(num) // s) * (1 if num >= 0 else -1) + 1


# ---- sources ------------------------------------------------------------------------

def need(node, srcs, count: int, optional: int = 0):
    if len(srcs) < count or any(s is None for s in srcs[:count]):
        raise invalid(node, srcs, f"needs {count} sources")
    if len(srcs) > count + optional:
        raise invalid(node, srcs, f"has {len(srcs)} sources (at most {count + optional})")


def sources(node, srcs, count: int, optional: int = 0) -> list:
    """The node's sources, `count` of them required and `optional` more allowed,
    padded with None to count + optional."""
    need(node, srcs, count, optional)
    missing = count + optional - len(srcs)
    return list(srcs) + [None] * missing if missing else srcs


def need_rows(node, srcs, *tensors):
    for t in tensors:
        if t is not None and not rows_contiguous(t):
            raise invalid(node, srcs, f"tensor {t.name_str!r} has non-contiguous rows (nb[0]={t.nb[0]})")


def one_source(node, srcs, admit, same: bool = True, rows: bool = True, result_rows: bool = True):
    """The one source of an op on one tensor: of the result's shape when `same`, its
    rows packed when `rows`, the result's when `result_rows`; `admit` is asked
    before any of these."""
    s, = sources(node, srcs, 1)
    admit(node, srcs)
    if same and not same_shape(s, node):
        raise invalid(node, srcs, "source and result differ in shape")
    if rows:
        need_rows(node, srcs, s)
    if result_rows:
        need_rows(node, srcs, node)
    return s


def accept(node, srcs):
    """The default admit: every type passes (for a caller that judges types
    elsewhere, or not at all)."""


# the op families, each a module of ggmlrpc.ops and one of every backend's rules
FAMILIES = ("unary", "binary", "norm", "rope", "softmax", "reduce", "sort", "copy", "matmul",
            "attention", "conv", "recurrent", "backward", "vision", "deepseek")


def by_op(package: str, table: str) -> dict:
    """The op -> rule map of a package of family modules, each holding its part in a
    dict named `table`; an op in two families is an error."""
    merged: dict = {}
    for family in FAMILIES:
        module = importlib.import_module(f"{package}.{family}")
        for op, rule in getattr(module, table).items():
            if op in merged:
                raise ImportError(f"op {op.name} has rules in two families of {package}")
            merged[op] = rule
    return merged
