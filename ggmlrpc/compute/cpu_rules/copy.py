"""CPU kernels of the ops that move or generate elements. DUP / CONT / CPY choose a
path of the DUP kernel by the conversion (bytes, F32/F16/BF16/I32 conversions,
dequantizing, quantizing), and with it the layout that path needs."""
from __future__ import annotations

from ... import ggml
from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import copy as rules
from ...ops.base import blck, contiguous, invalid, need_rows, row_bytes, same_shape, ts
from .base import Spec, f32_only, need_quant, need_types, simple, unsupported
from .kernels import ids, path

_CONVERTIBLE = (T.F32, T.F16, T.BF16)


def _dup_path(node, srcs, s):
    """iparams of the DUP kernel: (element or block size, row bytes, path, block size)."""
    st, dt = s.type, node.type
    if ggml.is_quantized(st) or ggml.is_quantized(dt):
        if st == dt:
            # whole blocks: rows of the same shape copied as bytes, else block by
            # block in logical order (rows of whole blocks on both sides)
            need_rows(node, srcs, s, node)
            if same_shape(s, node):
                return (ts(s), row_bytes(s), path("DUP", "PLAIN"))
            if s.ne[0] % blck(s) or node.ne[0] % blck(node):
                raise invalid(node, srcs, "rows are not whole blocks")
            return (ts(s), 0, path("DUP", "PLAIN"), blck(s))
        if dt == T.F32:     # ggml dequantizes only to F32
            need_quant(node, srcs, s, to_float=True)
            need_rows(node, srcs, s, node)
            if same_shape(s, node):
                return (4, 0, path("DUP", "FROM_Q"))
            # another shape: block by block; a block must not straddle two result rows
            # unless the result is contiguous (ggml's dup_from_q asserts the same)
            if node.ne[0] % blck(s) and not contiguous(node):
                raise invalid(node, srcs, "dequantized blocks would straddle rows of the result")
            return (4, 0, path("DUP", "FROM_Q_BLOCKS"), blck(s))
        if st in _CONVERTIBLE:      # quantized rows of src0's row length into a contiguous result
            need_quant(node, srcs, node, from_float=True)
            if not contiguous(node) or s.ne[0] % blck(node):
                raise invalid(node, srcs, "quantizing needs a contiguous result and whole blocks per row")
            need_rows(node, srcs, s)
            return (4, s.ne[0] // blck(node) * ts(node), path("DUP", "TO_Q"))
        raise unsupported(node, srcs)
    if st == dt:
        return (ts(s), 0, path("DUP", "PLAIN"))
    if st in _CONVERTIBLE and dt in _CONVERTIBLE or {st, dt} == {T.F32, T.I32}:
        return (4, 0, path("DUP", "PLAIN"))
    raise unsupported(node, srcs)


def rule_dup(node, srcs):
    s, = rules.dup(node, srcs)
    return Spec(ids.K.DUP, iparams=_dup_path(node, srcs, s), srcs=[s])


def _get_rows_types(node, srcs):
    a, idx = srcs
    need_types(node, srcs, idx.type == T.I32 and (
        (a.type == node.type and a.type in (T.F32, T.I32))
        or (node.type == T.F32 and a.type in (T.F16, T.BF16))
        or (node.type == T.F32 and ggml.is_quantized(a.type))))
    need_quant(node, srcs, a, to_float=True)


def rule_get_rows(node, srcs):
    a, idx = rules.get_rows(node, srcs, _get_rows_types)
    return Spec(ids.K.GET_ROWS, iparams=(row_bytes(a),), srcs=[a, idx])


def _set_rows_types(node, srcs):
    a, idx = srcs[0], srcs[1]
    need_types(node, srcs, a.type in (T.F32, T.F16) and idx.type in (T.I64, T.I32)
               and (node.type in (T.F32, T.F16, T.BF16) or ggml.is_quantized(node.type)))
    need_quant(node, srcs, node, from_float=True)


def rule_set_rows(node, srcs):
    a, idx = rules.set_rows(node, srcs, _set_rows_types)
    return Spec(ids.K.SET_ROWS, iparams=(row_bytes(a),), srcs=[a, idx])


def _repeat_types(node, srcs):
    s = srcs[0]
    need_types(node, srcs, s.type == node.type and not ggml.is_quantized(s.type))


def rule_repeat(node, srcs):
    s, = rules.repeat(node, srcs, _repeat_types)
    return Spec(ids.K.REPEAT, iparams=(ts(s),), srcs=[s])


def _concat_types(node, srcs):
    a, b = srcs
    need_types(node, srcs, a.type == b.type == node.type)


def rule_concat(node, srcs):
    a, b = rules.concat(node, srcs, _concat_types)
    return Spec(ids.K.CONCAT, iparams=(ts(a), blck(a)), srcs=[a, b])


def _acc_set_types(node, srcs):
    a, b = srcs
    types = (T.F32,) if node.op == Op.ACC else (T.F32, T.I32)
    need_types(node, srcs, a.type == b.type == node.type and a.type in types)


def rule_acc_set(node, srcs):
    used = rules.acc_set(node, srcs, _acc_set_types)
    return Spec(ids.K.ACC if node.op == Op.ACC else ids.K.SET, iparams=(4,), srcs=used)


def _arange_types(node, srcs):
    if node.type != T.F32 or not contiguous(node):
        raise unsupported(node, srcs)


def rule_arange(node, srcs):
    rules.arange(node, srcs, _arange_types)
    return Spec(ids.K.ARANGE)


RULES = {
    Op.DUP: rule_dup,
    Op.CONT: rule_dup,
    Op.CPY: rule_dup,
    Op.GET_ROWS: rule_get_rows,
    Op.SET_ROWS: rule_set_rows,
    Op.REPEAT: rule_repeat,
    Op.REPEAT_BACK: simple("REPEAT_BACK", rules.repeat_back, f32_only),
    Op.CONCAT: rule_concat,
    Op.PAD: simple("PAD", rules.pad, f32_only),
    Op.PAD_REFLECT_1D: simple("PAD_REFLECT_1D", rules.pad_reflect_1d, f32_only),
    Op.ROLL: simple("ROLL", rules.roll, f32_only),
    Op.ACC: rule_acc_set,
    Op.SET: rule_acc_set,
    Op.ARANGE: rule_arange,
    Op.TRI: simple("TRI", rules.tri, f32_only),
    Op.DIAG: simple("DIAG", rules.diag, f32_only),
    Op.TIMESTEP_EMBEDDING: simple("TIMESTEP_EMBEDDING", rules.timestep_embedding, f32_only),
}
