"""Ops that move or generate elements: DUP, CONT, CPY, GET_ROWS, SET_ROWS, REPEAT,
REPEAT_BACK, CONCAT, PAD, PAD_REFLECT_1D, ROLL, ACC, SET, ARANGE, TRI, DIAG,
TIMESTEP_EMBEDDING."""
from __future__ import annotations

import math

from .. import ggml
from ..ggml import GGMLOp as Op
from .base import (
    accept,
    blck,
    can_repeat,
    contiguous,
    f32_param,
    invalid,
    need_rows,
    nelements,
    one_source,
    same_shape,
    sources,
)


def dup(node, srcs, admit=accept):
    """src0 copied into the node in element order (CPY's src1 is the destination
    tensor itself and is not read). How rows and blocks must lie depends on the
    conversion: the backend checks that with its choice of path."""
    s = sources(node, srcs, 2 if node.op == Op.CPY else 1)[0]
    if nelements(s) != nelements(node):
        raise invalid(node, srcs, "element counts differ")
    admit(node, srcs)
    return [s]


def get_rows(node, srcs, admit=accept):
    """Rows of src0 (n, rows, ne2, ne3) picked by I32 indices (idx, ne2, ne3)."""
    a, idx = sources(node, srcs, 2)
    admit(node, srcs)
    if (node.ne[0] != a.ne[0] or node.ne[1] != idx.ne[0] or node.ne[2] != idx.ne[1]
            or node.ne[3] != idx.ne[2] or idx.ne[3] != 1):
        raise invalid(node, srcs, "result shape does not match the indices")
    if a.ne[2] != idx.ne[1] or a.ne[3] != idx.ne[2]:
        raise invalid(node, srcs, "src0 and the indices differ in dims 2 and 3")
    need_rows(node, srcs, a, node)
    return [a, idx]


def set_rows(node, srcs, admit=accept):
    """Rows of src0 written into the result at indices (rows, ne2', ne3') that
    broadcast over src0's dims 2 and 3; an optional third source is not read."""
    a, idx, _ = sources(node, srcs, 2, optional=1)
    admit(node, srcs)
    if node.ne[0] != a.ne[0] or node.ne[2] != a.ne[2] or node.ne[3] != a.ne[3]:
        raise invalid(node, srcs, "src0 and the result differ in shape")
    if (idx.ne[0] != a.ne[1] or idx.ne[3] != 1 or not idx.ne[1] or not idx.ne[2]
            or a.ne[2] % idx.ne[1] or a.ne[3] % idx.ne[2]):
        raise invalid(node, srcs, "indices do not match src0")
    need_rows(node, srcs, a, node)
    return [a, idx]


def repeat(node, srcs, admit=accept):
    s, = sources(node, srcs, 1)
    admit(node, srcs)
    if not can_repeat(s, node):
        raise invalid(node, srcs, "the source does not repeat to the result")
    need_rows(node, srcs, s, node)
    return [s]


def repeat_back(node, srcs, admit=accept):
    s = one_source(node, srcs, admit, same=False)
    if not can_repeat(node, s):
        raise invalid(node, srcs, "the result does not repeat to the source")
    return [s]


T = ggml.GGMLType
STRIDED_CONCAT = frozenset((T.F32, T.F16, T.BF16, T.I8, T.I16, T.I32))


def concat(node, srcs, admit=accept):
    """op_params[0]: the dimension. F32, F16, BF16, I8, I16 and I32 are read and
    written through every stride (ggml's element-wise paths); other types need
    packed rows."""
    a, b = sources(node, srcs, 2)
    dim = node.op_params[0]
    admit(node, srcs)
    if not 0 <= dim < 4:
        raise invalid(node, srcs, f"dimension {dim}")
    if dim == 0 and (a.ne[0] % blck(a) or b.ne[0] % blck(b)):
        raise invalid(node, srcs, "rows of whole blocks are concatenated")
    for i in range(4):
        want = a.ne[i] + b.ne[i] if i == dim else a.ne[i]
        if node.ne[i] != want or (i != dim and b.ne[i] != a.ne[i]):
            raise invalid(node, srcs, "shapes do not concatenate")
    if a.type not in STRIDED_CONCAT:
        need_rows(node, srcs, a, b, node)
    return [a, b]


def pad(node, srcs, admit=accept):
    """op_params[0..7]: padding before and after each dimension; the source is read
    through its strides."""
    s = one_source(node, srcs, admit, same=False, rows=False)
    p = node.op_params
    if any(x < 0 for x in p[:8]) or any(node.ne[i] != s.ne[i] + p[2 * i] + p[2 * i + 1] for i in range(4)):
        raise invalid(node, srcs, "padding does not match the shapes")
    return [s]


def pad_reflect_1d(node, srcs, admit=accept):
    s = one_source(node, srcs, admit, same=False)
    p0, p1 = node.op_params[:2]
    if (not 0 <= p0 < s.ne[0] or not 0 <= p1 < s.ne[0] or node.ne[0] != s.ne[0] + p0 + p1
            or tuple(node.ne[1:]) != tuple(s.ne[1:])):
        raise invalid(node, srcs, "reflection padding")
    return [s]


def roll(node, srcs, admit=accept):
    s = one_source(node, srcs, admit)
    if any(abs(node.op_params[i]) >= s.ne[i] for i in range(4)):
        raise invalid(node, srcs, "a shift is not smaller than its dimension")
    return [s]


def acc_set(node, srcs, admit=accept):
    """ACC / SET: src1 added to / written into a strided view of a copy of src0;
    op_params: the view's nb1, nb2, nb3 and offset in bytes."""
    a, b = sources(node, srcs, 2)
    admit(node, srcs)
    if not same_shape(a, node) or not contiguous(a) or not contiguous(node):
        raise invalid(node, srcs, "src0 and the result must be contiguous and of one shape")
    need_rows(node, srcs, b)
    nb1, nb2, nb3, offset = node.op_params[:4]
    if min(nb1, nb2, nb3, offset) < 0:
        raise invalid(node, srcs, "negative view strides or offset")
    es = ggml.type_size(node.type)
    last = offset + (b.ne[0] - 1) * es + (b.ne[1] - 1) * nb1 + (b.ne[2] - 1) * nb2 + (b.ne[3] - 1) * nb3
    if last + es > ggml.nbytes(node.type, node.ne, node.nb):
        raise invalid(node, srcs, "the view lies outside the result")
    return [a, b]


def arange(node, srcs, admit=accept):
    """op_params: start, stop, step (floats); ceil((stop - start) / step) elements,
    computed in F32 as ggml does."""
    import numpy as np
    sources(node, srcs, 0)
    start, stop, step = (np.float32(f32_param(node, i)) for i in range(3))
    admit(node, srcs)
    with np.errstate(all="ignore"):
        q = np.float32((stop - start) / step)
    if not np.isfinite(q) or math.ceil(q) != nelements(node):
        raise invalid(node, srcs, "the element count does not match start, stop and step")
    return []


def tri(node, srcs, admit=accept):
    """op_params[0]: the ggml_tri_type."""
    s = one_source(node, srcs, admit)
    if not contiguous(s) or not 0 <= node.op_params[0] < ggml.TRI_TYPE_COUNT:
        raise invalid(node, srcs, "layout or triangle type")
    return [s]


def diag(node, srcs, admit=accept):
    s = one_source(node, srcs, admit, same=False)
    if s.ne[1] != 1 or tuple(node.ne) != (s.ne[0], s.ne[0], s.ne[2], s.ne[3]):
        raise invalid(node, srcs, "diag makes (n, n) matrices of (n, 1) rows")
    return [s]


def timestep_embedding(node, srcs, admit=accept):
    """op_params: dim, max_period; one row of dim values per timestep."""
    s, = sources(node, srcs, 1)
    admit(node, srcs)
    dim = node.op_params[0]
    if dim <= 0 or node.op_params[1] <= 0 or tuple(node.ne) != (dim, s.ne[0], 1, 1) or node.nb[0] != 4:
        raise invalid(node, srcs, "embedding shape")
    return [s]


CHECKS = {
    Op.DUP: dup,
    Op.CONT: dup,
    Op.CPY: dup,
    Op.GET_ROWS: get_rows,
    Op.SET_ROWS: set_rows,
    Op.REPEAT: repeat,
    Op.REPEAT_BACK: repeat_back,
    Op.CONCAT: concat,
    Op.PAD: pad,
    Op.PAD_REFLECT_1D: pad_reflect_1d,
    Op.ROLL: roll,
    Op.ACC: acc_set,
    Op.SET: acc_set,
    Op.ARANGE: arange,
    Op.TRI: tri,
    Op.DIAG: diag,
    Op.TIMESTEP_EMBEDDING: timestep_embedding,
}
