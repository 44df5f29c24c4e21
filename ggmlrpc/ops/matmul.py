"""Matrix products: MUL_MAT (and its Hadamard hint), MUL_MAT_ID (mixture of
experts), OUT_PROD."""
from __future__ import annotations

from .. import ggml
from ..ggml import GGMLOp as Op
from .base import accept, invalid, need_rows, sources, ts


def is_hadamard(node) -> bool:
    """MUL_MAT whose src0 the client marked a Hadamard matrix: ggml's CPU backend
    runs a fast Walsh-Hadamard transform of src1's rows instead of the product."""
    return node.op_params[1] == ggml.MUL_MAT_HINT_SRC0_IS_HADAMARD


def mul_mat(node, srcs, admit=accept):
    if is_hadamard(node):
        return hadamard(node, srcs, admit)
    return product(node, srcs, admit)


def product(node, srcs, admit=accept):
    """src0 (K, M, ne2, ne3) times src1 (K, N, ne2', ne3') -> (M, N, ne2', ne3'), src0
    broadcast over src1's dims 2 and 3."""
    w, x = sources(node, srcs, 2)
    admit(node, srcs)
    if w.ne[0] != x.ne[0]:
        raise invalid(node, srcs, "inner dimensions differ")
    if (node.ne[0] != w.ne[1] or node.ne[1] != x.ne[1] or node.ne[2] != x.ne[2]
            or node.ne[3] != x.ne[3]):
        raise invalid(node, srcs, "result shape is not (src0.ne1, src1.ne1, src1.ne2, src1.ne3)")
    if x.ne[2] % w.ne[2] or x.ne[3] % w.ne[3]:
        raise invalid(node, srcs, "src0 does not broadcast over src1")
    _unpermuted(node, srcs, w, x)
    return [w, x]


def _unpermuted(node, srcs, w, x):
    need_rows(node, srcs, w, x, node)
    if w.nb[0] != ts(w) or x.nb[0] != ts(x) or node.nb[0] != ts(node):
        raise invalid(node, srcs, "permuted or transposed operands")


def hadamard(node, srcs, admit=accept):
    """src0 an (n, n) Hadamard matrix (not read), n a power of two; the result has
    src1's shape."""
    w, x = sources(node, srcs, 2)
    admit(node, srcs)
    n = x.ne[0]
    if n & (n - 1) or w.ne[0] != n or w.ne[1] != n or tuple(node.ne) != tuple(x.ne):
        raise invalid(node, srcs, "a Hadamard product needs a power-of-two (n, n) src0")
    need_rows(node, srcs, x, node)
    return [w, x]


def mul_mat_id(node, srcs, admit=accept):
    """Experts (K, M, n_as) times activations (K, n_used or 1, tokens) for the experts
    that ids (n_used, tokens) select -> (M, n_used, tokens)."""
    w, x, sel = sources(node, srcs, 3)
    admit(node, srcs)
    K, M = w.ne[0], w.ne[1]
    n_used, T_ = sel.ne[0], sel.ne[1]
    if (w.ne[3] != 1 or x.ne[3] != 1 or sel.ne[2] != 1 or sel.ne[3] != 1 or x.ne[0] != K
            or sel.ne[1] != x.ne[2] or n_used % x.ne[1] or tuple(node.ne) != (M, n_used, T_, 1)):
        raise invalid(node, srcs, "shapes of experts, activations, ids and result do not agree")
    _unpermuted(node, srcs, w, x)
    return [w, x, sel]


def out_prod(node, srcs, admit=accept):
    """src0 (m, k, ne2, ne3) and src1 (n, k, ne2', ne3') -> (m, n, ne2', ne3')."""
    a, b = sources(node, srcs, 2)
    admit(node, srcs)
    if (a.ne[1] != b.ne[1] or b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3]
            or tuple(node.ne) != (a.ne[0], b.ne[0], b.ne[2], b.ne[3])):
        raise invalid(node, srcs, "shapes do not agree")
    if a.type != ggml.GGMLType.F32 and (a.ne[2] != b.ne[2] or a.ne[3] != b.ne[3]):
        raise invalid(node, srcs, "F16 and quantized src0 do not broadcast")
    need_rows(node, srcs, a, node)
    return [a, b]


CHECKS = {
    Op.MUL_MAT: mul_mat,
    Op.MUL_MAT_ID: mul_mat_id,
    Op.OUT_PROD: out_prod,
}
