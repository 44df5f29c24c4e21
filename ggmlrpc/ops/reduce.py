"""Reductions: SUM (to a scalar), SUM_ROWS and MEAN (one value per row), CUMSUM,
ARGMAX, COUNT_EQUAL."""
from __future__ import annotations

from ..ggml import GGMLOp as Op
from .base import (
    accept,
    invalid,
    need_rows,
    nelements,
    one_source,
    same_shape,
    sources,
    ts,
)


def sum_all(node, srcs, admit=accept):
    s, = sources(node, srcs, 1)
    admit(node, srcs)
    if nelements(node) != 1:
        raise invalid(node, srcs, "the result is not a scalar")
    # ggml sums ne0 packed elements from each row's start whatever nb[0] is (a
    # permuted view is summed over other elements than its own), which stays inside
    # the tensor's extent while nb[0] >= the type size
    if s.nb[0] < ts(s):
        need_rows(node, srcs, s)
    return [s]


def sum_rows(node, srcs, admit=accept):
    s = one_source(node, srcs, admit, same=False)
    if tuple(node.ne) != (1,) + tuple(s.ne[1:]):
        raise invalid(node, srcs, "the result is not one value per row")
    return [s]


def cumsum(node, srcs, admit=accept):
    return [one_source(node, srcs, admit)]


def argmax(node, srcs, admit=accept):
    s, = sources(node, srcs, 1)
    admit(node, srcs)
    if s.ne[2] != 1 or s.ne[3] != 1 or tuple(node.ne) != (s.ne[1], 1, 1, 1):
        raise invalid(node, srcs, "argmax of a matrix gives one index per row")
    need_rows(node, srcs, s)
    return [s]


def count_equal(node, srcs, admit=accept):
    a, b = sources(node, srcs, 2)
    admit(node, srcs)
    if not same_shape(a, b) or nelements(node) != 1:
        raise invalid(node, srcs, "sources differ in shape or the result is not a scalar")
    return [a, b]


CHECKS = {
    Op.SUM: sum_all,
    Op.SUM_ROWS: sum_rows,
    Op.MEAN: sum_rows,
    Op.CUMSUM: cumsum,
    Op.ARGMAX: argmax,
    Op.COUNT_EQUAL: count_equal,
}
