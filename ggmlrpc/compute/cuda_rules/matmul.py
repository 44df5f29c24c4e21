"""CUDA kernels of MUL_MAT: quantized weights always through the dp4a kernel on
activations quantized to q8_1 (ggml's CPU backend quantizes activations too, so the
results agree to rounding; the tiled kernel's float activations drift by ~3e-5 NMSE
per product, 2e-4 in a model's logits); float weights through the mat-vec kernel up to
ops.MMVQ_MAX_COLS columns and the tiled kernel beyond. MUL_MAT_ID runs the mat-vec
kernels on expert ids checked and packed first (sanitize_ids). OUT_PROD has none yet."""
from __future__ import annotations

from ...cuda import ops
from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import matmul as rules
from ..cuda import Builder
from .base import need_types, unsupported


def _types(node, srcs):
    w, x = srcs
    need_types(node, srcs, w.type in ops.TYPES and x.type in (T.F32, T.F16, T.BF16) and node.type == T.F32)


def rule_mul_mat(node, srcs, b: Builder):
    if rules.is_hadamard(node):
        raise unsupported(node, srcs, "as a Hadamard transform")
    w, x = rules.product(node, srcs, _types)
    if w.type in (T.F16, T.BF16):
        # ggml's CPU rounds the activations to the weights' type first (its dot product
        # is F16 x F16): the same rounding here keeps long graphs from drifting apart
        xp, xnb = _rounded(b, x, w.type), None
    elif x.type != T.F32:
        xp, xnb = b.packed(x, T.F32), None
    else:
        xp, xnb = b.ptr(x), tuple(x.nb)
    if xnb is None:
        xnb = (4, 4 * x.ne[0], 4 * x.ne[0] * x.ne[1], 4 * x.ne[0] * x.ne[1] * x.ne[2])
    if xnb[1] % 4 or xnb[2] % 4:
        raise unsupported(node, srcs, "with activations at unaligned strides")
    dst, finish = b.out(node)
    ncols, nrows, ncols_y, nz = w.ne[0], w.ne[1], x.ne[1], x.ne[2]
    r2, r3 = x.ne[2] // w.ne[2], x.ne[3] // w.ne[3]
    strategy = "mmvq" if w.type in ops.QUANT_TYPES else ops.choose_mul_mat(w.type, ncols_y)
    q8 = b.alloc(ops.q8_1_bytes(ncols, ncols_y * nz)) if strategy == "mmvq" else None
    for i3 in range(x.ne[3]):       # the kernels cover dims 0..2; dim 3 is a loop of launches
        b.launch(ops.mul_mat, w.type, dst + i3 * 4 * nrows * ncols_y * nz, b.ptr(w, (i3 // r3) * w.nb[3]),
                 xp + i3 * xnb[3], ncols, nrows, ncols_y, nz=nz, r2=r2, w_row=w.nb[1], w_mat=w.nb[2],
                 x_col=xnb[1] // 4, x_mat=xnb[2] // 4, strategy=strategy, q8_scratch=q8)
    finish()


def _id_types(node, srcs):
    w, x, sel = srcs
    need_types(node, srcs, w.type in ops.TYPES and x.type == T.F32 and sel.type == T.I32 and node.type == T.F32)


def rule_mul_mat_id(node, srcs, b: Builder):
    w, x, sel = rules.mul_mat_id(node, srcs, _id_types)
    ncols, nrows, n_as = w.ne[0], w.ne[1], w.ne[2]
    n_used, n_tokens, ne11 = sel.ne[0], sel.ne[1], x.ne[1]
    if sel.nb[0] != 4 or sel.nb[1] % 4:
        raise unsupported(node, srcs, "with strided expert ids")
    ids = b.alloc(4 * n_used * n_tokens)
    b.launch(ops.sanitize_ids, ids, b.ptr(sel), n_used, n_tokens, sel.nb[1] // 4, n_as, **b.error_flag())
    xp = _rounded(b, x, w.type) if w.type in (T.F16, T.BF16) else b.packed(x)
    dst, finish = b.out(node)
    quant = w.type in ops.QUANT_TYPES
    q8 = b.alloc(ops.q8_1_bytes(ncols, ne11 * n_tokens)) if quant else None
    b.launch(ops.mul_mat_id, w.type, dst, b.ptr(w), xp, ids, ncols, nrows, n_used, n_tokens, ne11,
             w_row=w.nb[1], w_mat=w.nb[2], ids_ld=n_used, strategy="mmvq" if quant else "vec", q8_scratch=q8)
    finish()


def _rounded(b: Builder, x, type_):
    """x packed as F32 after a round trip through type_ (F16 or BF16)."""
    from ..cuda import dense_nb
    narrow = b.packed(x, type_)
    out = b.alloc(4 * x.ne[0] * x.ne[1] * x.ne[2] * x.ne[3])
    b.launch(ops.cpy_scalar, out, T.F32, dense_nb(T.F32, x.ne), narrow, type_, dense_nb(type_, x.ne), tuple(x.ne))
    return out


RULES = {Op.MUL_MAT: rule_mul_mat, Op.MUL_MAT_ID: rule_mul_mat_id}
