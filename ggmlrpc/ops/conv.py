"""Convolutions and their image ops: IM2COL, IM2COL_3D, IM2COL_BACK, COL2IM_1D,
CONV_2D, CONV_3D, CONV_2D_DW, CONV_TRANSPOSE_1D/2D, POOL_1D, POOL_2D, POOL_2D_BACK,
UPSCALE."""
from __future__ import annotations

from ..ggml import GGMLOp as Op
from ..ggml import PoolOp, ScaleMode
from .base import (
    accept,
    contiguous,
    conv_out,
    invalid,
    need_rows,
    one_source,
    same_shape,
    sources,
    ts,
    unknown,
)

_POOL_OPS = frozenset(PoolOp)

_SCALE_MODES = frozenset(ScaleMode)


def conv_channels(node, k, x):
    """(input channels, batch, output channels) of CONV_2D / CONV_3D (CONV_3D keeps
    them in op_params[9..11], having folded them into dim 3)."""
    if node.op == Op.CONV_3D:
        return tuple(node.op_params[9:12])
    return x.ne[2], x.ne[3], k.ne[3]


def conv(node, srcs, admit=accept):
    """CONV_2D / CONV_3D; op_params: strides, paddings, dilations per spatial dim."""
    k, x = sources(node, srcs, 2)
    three = node.op == Op.CONV_3D
    admit(node, srcs)
    op = node.op_params
    nd = 3 if three else 2
    s, p, d = (op[0:3], op[3:6], op[6:9]) if three else (op[0:2], op[2:4], op[4:6])
    if min(s) <= 0 or min(d) <= 0 or min(p) < 0:
        raise invalid(node, srcs, "strides and dilations must be positive, paddings not negative")
    c, n, oc = conv_channels(node, k, x)
    if three:
        ok = c > 0 and n > 0 and oc > 0 and k.ne[3] == c * oc and x.ne[3] == c * n and node.ne[3] == oc * n
    else:
        ok = k.ne[2] == c and tuple(node.ne[2:]) == (oc, n)
    ok = ok and all(node.ne[i] == conv_out(x.ne[i], k.ne[i], s[i], p[i], d[i]) > 0 for i in range(nd))
    if not ok:
        raise invalid(node, srcs, "shapes of kernel, input and result do not agree")
    if not contiguous(k):
        raise invalid(node, srcs, "the kernel must be contiguous")
    return [k, x]


def conv_2d_dw(node, srcs, admit=accept):
    """Depthwise: one (KW, KH) kernel per channel; op_params: strides, paddings,
    dilations (x then y)."""
    k, x = sources(node, srcs, 2)
    admit(node, srcs)
    op = node.op_params
    C = x.ne[2]
    ok = (k.ne[2] == 1 and k.ne[3] == C and min(op[0], op[1], op[4], op[5]) > 0 and min(op[2], op[3]) >= 0
          and node.ne[0] == conv_out(x.ne[0], k.ne[0], op[0], op[2], op[4]) > 0
          and node.ne[1] == conv_out(x.ne[1], k.ne[1], op[1], op[3], op[5]) > 0
          and tuple(node.ne[2:]) == tuple(x.ne[2:]))
    if not ok:
        raise invalid(node, srcs, "shapes of kernel, input and result do not agree")
    return [k, x]


def conv_2d_dw_layout(k, x, node):
    """ggml's two layouts of a depthwise convolution: all contiguous (WHCN), or
    channels innermost throughout (CWHN); None for any other."""
    C = x.ne[2]
    tk = ts(k)
    if contiguous(x) and contiguous(k) and contiguous(node):
        return "WHCN"
    if (x.nb[2] == 4 and x.nb[0] == C * 4 and x.nb[1] == x.ne[0] * C * 4 and x.nb[3] == x.ne[1] * x.nb[1]
            and k.nb[3] == tk and k.nb[0] == C * tk and k.nb[1] == k.ne[0] * C * tk
            and node.nb[2] == 4 and node.nb[0] == C * 4 and node.nb[1] == node.ne[0] * C * 4
            and node.nb[3] == node.ne[1] * node.nb[1]):
        return "CWHN"
    return None


def conv_transpose(node, srcs, admit=accept):
    """op_params[0]: the stride (1-D: then padding 0 and dilation 1, all ggml has)."""
    k, x = sources(node, srcs, 2)
    two = node.op == Op.CONV_TRANSPOSE_2D
    admit(node, srcs)
    st = node.op_params[0]
    if two:
        ok = (k.ne[3] == x.ne[2] and node.ne[0] == (x.ne[0] - 1) * st + k.ne[0]
              and node.ne[1] == (x.ne[1] - 1) * st + k.ne[1] and node.ne[2] == k.ne[2] and node.ne[3] == x.ne[3])
    else:
        ok = (k.ne[3] == 1 and x.ne[2] == 1 and x.ne[3] == 1 and k.ne[2] == x.ne[1]
              and node.op_params[1] == 0 and node.op_params[2] == 1
              and tuple(node.ne) == ((x.ne[0] - 1) * st + k.ne[0], k.ne[1], 1, 1))
    if st <= 0 or not ok:
        raise invalid(node, srcs, "shapes of kernel, input and result do not agree")
    if not contiguous(node):
        raise invalid(node, srcs, "the result must be contiguous")
    return [k, x]


def im2col(node, srcs, admit=accept):
    """op_params: s0, s1, p0, p1, d0, d1, is_2D; the kernel gives only its shape."""
    k, img = sources(node, srcs, 2)
    p = node.op_params
    is2d = p[6] == 1
    admit(node, srcs)
    N, IC = (img.ne[3], img.ne[2]) if is2d else (img.ne[2], img.ne[1])
    KH, KW = (k.ne[1], k.ne[0]) if is2d else (1, k.ne[0])
    want = (IC * KH * KW, node.ne[1], node.ne[2] if is2d else N, N if is2d else 1)
    if (tuple(node.ne) != want or not contiguous(node) or img.nb[0] != ts(img)
            or (is2d and img.nb[1] != img.ne[0] * ts(img)) or (not is2d and img.ne[3] != 1)
            or (is2d and k.ne[2] != IC) or (not is2d and k.ne[1] != IC)):
        raise invalid(node, srcs, "shapes of kernel, image and result do not agree")
    return [k, img]


def im2col_3d(node, srcs, admit=accept):
    """op_params: strides, paddings, dilations (3 each), then IC."""
    k, x = sources(node, srcs, 2)
    admit(node, srcs)
    op = node.op_params
    IC = op[9]
    if min(op[0:3]) <= 0 or min(op[6:9]) <= 0 or min(op[3:6]) < 0 or IC <= 0 or x.ne[3] % IC:
        raise invalid(node, srcs, "bad strides, paddings, dilations or channel count")
    N = x.ne[3] // IC
    outs = [conv_out(x.ne[i], k.ne[i], op[i], op[3 + i], op[6 + i]) for i in range(3)]
    if min(outs) <= 0 or tuple(node.ne) != (k.ne[0] * k.ne[1] * k.ne[2] * IC, outs[0], outs[1], outs[2] * N):
        raise invalid(node, srcs, "shapes of kernel, input and result do not agree")
    if not contiguous(node):
        raise invalid(node, srcs, "the result must be contiguous")
    return [k, x]


def col2im_1d(node, srcs, admit=accept):
    """op_params: s0, OC, p0."""
    a, = sources(node, srcs, 1)
    admit(node, srcs)
    s0, oc, p0 = node.op_params[:3]
    ok = (s0 > 0 and oc > 0 and p0 >= 0 and a.ne[0] % oc == 0 and a.ne[2] == a.ne[3] == 1
          and tuple(node.ne) == ((a.ne[1] - 1) * s0 + a.ne[0] // oc - 2 * p0, oc, 1, 1) and node.ne[0] > 0)
    if not ok:
        raise invalid(node, srcs, "shapes of columns and result do not agree")
    if not (contiguous(a) and contiguous(node)):
        raise invalid(node, srcs, "source and result must be contiguous")
    return [a]


def im2col_back(node, srcs, admit=accept):
    """The gradient of IM2COL (its op_params); src1 the kernel, for its shape."""
    g, k = sources(node, srcs, 2)
    admit(node, srcs)
    op = node.op_params
    two = op[6] == 1
    if min(op[0], op[1], op[4], op[5]) <= 0:
        raise invalid(node, srcs, "strides and dilations must be positive")
    N, IC = (node.ne[3], node.ne[2]) if two else (node.ne[2], node.ne[1])
    KH, KW = (k.ne[1] if two else 1), k.ne[0]
    ok = g.ne[0] == IC * KH * KW and (g.ne[3] == N if two else (g.ne[2] == N and g.ne[3] == 1 and node.ne[3] == 1))
    if not ok:
        raise invalid(node, srcs, "shapes of gradient, kernel and result do not agree")
    if not (contiguous(g) and contiguous(node)):
        raise invalid(node, srcs, "gradient and result must be contiguous")
    return [g, k]


def _pool_out(ins, k, st, p):
    """ggml_calc_pool_output_size, or -1 when the window is larger than the padded input
    (ggml would make a tensor of no elements; the loops over the taps would run on)."""
    num = ins + 2 * p - k
    return -1 if num < 0 or p < 0 else num // st + 1


def pool(node, srcs, admit=accept):
    """POOL_1D op_params: op, k0, s0, p0; POOL_2D: op, k0, k1, s0, s1, p0, p1."""
    s, = sources(node, srcs, 1)
    admit(node, srcs)
    p = node.op_params
    if p[0] not in _POOL_OPS:
        raise invalid(node, srcs, f"pool op {p[0]}")
    if node.op == Op.POOL_1D:
        if (tuple(node.ne[1:]) != tuple(s.ne[1:]) or p[1] <= 0 or p[2] <= 0
                or node.ne[0] != _pool_out(s.ne[0], p[1], p[2], p[3])):
            raise invalid(node, srcs, "pooling shape")
        need_rows(node, srcs, s, node)
        return [s]
    if (tuple(node.ne[2:]) != tuple(s.ne[2:]) or p[1] <= 0 or p[2] <= 0 or p[3] <= 0 or p[4] <= 0
            or node.ne[0] != _pool_out(s.ne[0], p[1], p[3], p[5])
            or node.ne[1] != _pool_out(s.ne[1], p[2], p[4], p[6])):
        raise invalid(node, srcs, "pooling shape")
    need_rows(node, srcs, node)
    return [s]


def pool_2d_back(node, srcs, admit=accept):
    """The gradient of POOL_2D (its op_params); src1 the forward input."""
    g, f = sources(node, srcs, 2)
    admit(node, srcs)
    op = node.op_params
    ok = (op[0] in _POOL_OPS and min(op[1:5]) > 0 and same_shape(f, node)
          and g.ne[2] == node.ne[2] and g.ne[3] == node.ne[3]
          and g.ne[0] == _pool_out(f.ne[0], op[1], op[3], op[5])
          and g.ne[1] == _pool_out(f.ne[1], op[2], op[4], op[6]))
    if not ok:
        raise invalid(node, srcs, "bad pooling or shapes of gradient, input and result do not agree")
    if not all(contiguous(t) for t in (g, f, node)):
        raise invalid(node, srcs, "gradient, input and result must be contiguous")
    return [g, f]


def upscale(node, srcs, admit=accept):
    """op_params[0]: the scale mode in its low byte, flags above; the source is read
    through its strides."""
    s = one_source(node, srcs, admit, same=False, rows=False)
    if (node.op_params[0] & 0xFF) not in _SCALE_MODES:
        raise unknown(node, srcs, f"has scale mode {node.op_params[0] & 0xFF}")
    return [s]


CHECKS = {
    Op.CONV_2D: conv,
    Op.CONV_3D: conv,
    Op.CONV_2D_DW: conv_2d_dw,
    Op.CONV_TRANSPOSE_1D: conv_transpose,
    Op.CONV_TRANSPOSE_2D: conv_transpose,
    Op.IM2COL: im2col,
    Op.IM2COL_3D: im2col_3d,
    Op.COL2IM_1D: col2im_1d,
    Op.IM2COL_BACK: im2col_back,
    Op.POOL_1D: pool,
    Op.POOL_2D: pool,
    Op.POOL_2D_BACK: pool_2d_back,
    Op.UPSCALE: upscale,
}
