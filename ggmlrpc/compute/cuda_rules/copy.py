"""CUDA kernels of DUP, CONT, CPY (between F32/F16/BF16 at any strides; F32 rows to and
from quant blocks), GET_ROWS, SET_ROWS, REPEAT and CONCAT."""
from __future__ import annotations

from ... import ggml
from ...cuda import ops
from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import copy as rules
from ...ops.base import accept, contiguous, nrows, rows_contiguous
from ..cuda import FLOAT_TYPES, Builder, dense_nb, row_stride
from .base import f32_only, need_types, unsupported


def rule_dup(node, srcs, b: Builder):
    s, = rules.dup(node, srcs, accept)
    if s.type in FLOAT_TYPES and node.type in FLOAT_TYPES:
        _copy_scalar(node, srcs, s, b)
    elif s.type == T.F32 and node.type in ops.STORE_TYPES:
        _copy_rows(node, srcs, s, b, ops.cpy_to_blocks, node.type)
    elif node.type == T.F32 and s.type in ops.TYPES and ggml.is_quantized(s.type):
        _copy_rows(node, srcs, s, b, ops.cpy_from_blocks, s.type)
    elif s.type == node.type and contiguous(s) and contiguous(node):
        _copy_bytes(node, srcs, s, b)     # same type, both packed: the bytes in order (I32...)
    else:
        need_types(node, srcs, False)


def _copy_scalar(node, srcs, s, b):
    """Element order is what CPY keeps: walk the shape of the strided side, the packed
    side at dense strides over that shape."""
    if tuple(s.ne) == tuple(node.ne):
        ne, snb, dnb = tuple(s.ne), tuple(s.nb), tuple(node.nb)
    elif contiguous(node):
        ne, snb, dnb = tuple(s.ne), tuple(s.nb), dense_nb(node.type, s.ne)
    elif contiguous(s):
        ne, snb, dnb = tuple(node.ne), dense_nb(s.type, node.ne), tuple(node.nb)
    else:
        raise unsupported(node, srcs, "between two strided tensors of different shapes")
    b.launch(ops.cpy_scalar, b.ptr(node), node.type, dnb, b.ptr(s), s.type, snb, ne)


def _copy_bytes(node, srcs, s, b):
    if ggml.type_size(s.type) not in (4, 2):
        raise unsupported(node, srcs, f"for {ggml.type_name(s.type)}")
    # reinterpret as F32 / F16 elements of the same size: a bit-exact copy
    as_type = T.F32 if ggml.type_size(s.type) == 4 else T.F16
    n = s.ne[0] * s.ne[1] * s.ne[2] * s.ne[3]
    b.launch(ops.cpy_scalar, b.ptr(node), as_type, dense_nb(as_type, (n, 1, 1, 1)), b.ptr(s), as_type,
             dense_nb(as_type, (n, 1, 1, 1)), (n, 1, 1, 1))


def _copy_rows(node, srcs, s, b, launcher, qtype):
    """F32 rows into rows of quant blocks or back: both sides rows of ne0 at one stride."""
    if s.ne[0] != node.ne[0] or s.ne[0] % ggml.blck_size(qtype):
        raise unsupported(node, srcs, "with rows that differ in length or are not whole blocks")
    if not (rows_contiguous(s) and rows_contiguous(node)):
        raise unsupported(node, srcs, "with strided rows")
    ls, ld = row_stride(s), row_stride(node)
    if ls is None or ld is None:
        raise unsupported(node, srcs, "with rows at uneven strides")
    # row_stride counts units of type_size: elements, or blocks of a quant type
    b.launch(launcher, qtype, b.ptr(node), b.ptr(s), s.ne[0], nrows(s), ls * ggml.type_size(s.type),
             ld * ggml.type_size(node.type))


def _get_rows_types(node, srcs):
    a, idx = srcs
    need_types(node, srcs, a.type in ops.TYPES and idx.type == T.I32 and node.type == T.F32)


def rule_get_rows(node, srcs, b: Builder):
    a, idx = rules.get_rows(node, srcs, _get_rows_types)
    if not contiguous(idx):
        raise unsupported(node, srcs, "with strided indices")
    dst, finish = b.out(node)
    b.launch(ops.get_rows, a.type, dst, b.ptr(a), b.ptr(idx), a.ne[0], tuple(idx.ne[:3]), tuple(a.nb),
             n_rows=a.ne[1], **b.error_flag())
    finish()


def _set_rows_types(node, srcs):
    a, idx = srcs[0], srcs[1]
    need_types(node, srcs, a.type == T.F32 and idx.type in (T.I64, T.I32) and node.type in ops.STORE_TYPES)


def rule_set_rows(node, srcs, b: Builder):
    a, idx = rules.set_rows(node, srcs, _set_rows_types)
    if not contiguous(idx):
        raise unsupported(node, srcs, "with strided indices")
    if node.ne[0] % ggml.blck_size(node.type):
        raise unsupported(node, srcs, "with rows that are not whole blocks")
    b.launch(ops.set_rows, node.type, b.ptr(node), tuple(node.nb), b.packed(a), tuple(a.ne), b.ptr(idx),
             tuple(idx.ne[:3]), idx.type == T.I32, n_rows=node.ne[1], **b.error_flag())


def rule_repeat(node, srcs, b: Builder):
    s, = rules.repeat(node, srcs, f32_only)
    dst, finish = b.out(node)
    b.launch(ops.repeat, dst, b.packed(s), tuple(node.ne), tuple(s.ne))
    finish()


def rule_concat(node, srcs, b: Builder):
    x, y = rules.concat(node, srcs, f32_only)
    dst, finish = b.out(node)
    b.launch(ops.concat, dst, b.packed(x), b.packed(y), tuple(x.ne), tuple(y.ne), node.op_params[0])
    finish()


RULES = {
    **dict.fromkeys((Op.DUP, Op.CONT, Op.CPY), rule_dup),
    Op.GET_ROWS: rule_get_rows,
    Op.SET_ROWS: rule_set_rows,
    Op.REPEAT: rule_repeat,
    Op.CONCAT: rule_concat,
}
