"""Segment Anything's window and relative-position ops: WIN_PART, WIN_UNPART,
GET_REL_POS, ADD_REL_POS."""
from __future__ import annotations

from ..ggml import GGMLOp as Op
from .base import accept, contiguous, invalid, one_source, same_shape, sources


def win_part(node, srcs, admit=accept):
    """WIN_PART op_params: npx, npy, w (windows across, down, their size);
    WIN_UNPART: w."""
    s = one_source(node, srcs, admit, same=False)
    if node.op == Op.WIN_PART:
        npx, npy, w = node.op_params[:3]
        ok = (w > 0 and npx > 0 and npy > 0 and s.ne[3] == 1
              and tuple(node.ne) == (s.ne[0], w, w, npx * npy))
    else:
        w = node.op_params[0]
        ok = (w > 0 and node.ne[3] == 1 and node.ne[0] == s.ne[0] and s.ne[1] == w and s.ne[2] == w
              and s.ne[3] >= -(-node.ne[1] // w) * -(-node.ne[2] // w))
    if not ok:
        raise invalid(node, srcs, "window shapes do not agree")
    if not (contiguous(s) and contiguous(node)):
        raise invalid(node, srcs, "source and result must be contiguous")
    return [s]


def get_rel_pos(node, srcs, admit=accept):
    s, = sources(node, srcs, 1)
    admit(node, srcs)
    ok = (node.ne[1] == node.ne[2] and s.ne[1] == 2 * node.ne[1] - 1 and s.ne[0] == node.ne[0]
          and node.ne[3] == 1 and contiguous(s) and contiguous(node))
    if not ok:
        raise invalid(node, srcs, "a (C, 2n - 1) table and a (C, n, n) result are needed")
    return [s]


def add_rel_pos(node, srcs, admit=accept):
    a, pw, ph = sources(node, srcs, 3)
    admit(node, srcs)
    ok = (same_shape(pw, ph) and same_shape(a, node) and all(contiguous(t) for t in (a, pw, ph, node))
          and pw.ne[3] == a.ne[2] and pw.ne[0] * pw.ne[0] == a.ne[0] and pw.ne[1] * pw.ne[2] == a.ne[1])
    if not ok:
        raise invalid(node, srcs, "shapes of attention and position terms do not agree")
    return [a, pw, ph]


CHECKS = {
    Op.WIN_PART: win_part,
    Op.WIN_UNPART: win_part,
    Op.GET_REL_POS: get_rel_pos,
    Op.ADD_REL_POS: add_rel_pos,
}
