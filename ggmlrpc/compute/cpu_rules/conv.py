"""CPU kernels of the convolutions and image ops. CONV_2D and CONV_3D share ggml's
im2col + product kernel (patch by patch, in ggml's GEMM order when the shape allows);
the 1-D and 2-D transposed convolutions share one kernel too."""
from __future__ import annotations

from ... import ggml
from ...ggml import GGMLOp as Op
from ...ggml import GGMLType as T
from ...ops import conv as rules
from ...ops.base import nelements, ts
from .base import Spec, f32_only, need_types, simple, unsupported
from .kernels import executor, ids, variant

# ggml's CPU convolution builds each patch's columns in a work buffer of this size
_PATCH_BUFFER = 16 << 20


def _kernel_f32_f16(node, srcs):
    """An F32 or F16 kernel over F32 input and result."""
    k, x = srcs
    need_types(node, srcs, k.type in (T.F32, T.F16) and x.type == node.type == T.F32)


def rule_conv(node, srcs):
    k, x = rules.conv(node, srcs, _kernel_f32_f16)
    oc = rules.conv_channels(node, k, x)[2]
    K = nelements(k) // oc
    if K * ts(k) + oc * 4 > _PATCH_BUFFER:
        raise unsupported(node, srcs, "with patches over ggml's 16 MiB work buffer")
    gemm = int(K % executor().vec_lanes() == 0 and oc % 4 == 0)
    return Spec(ids.K.CONV, variant("CONV", ggml.op_name(node.op)), iparams=(0, gemm), srcs=[k, x])


def rule_conv_2d_dw(node, srcs):
    k, x = rules.conv_2d_dw(node, srcs, _kernel_f32_f16)
    if rules.conv_2d_dw_layout(k, x, node) is None:
        raise unsupported(node, srcs, "with a layout other than WHCN or channels innermost")
    return Spec(ids.K.CONV_2D_DW, srcs=[k, x])


def _im2col_types(node, srcs):
    img = srcs[1]
    need_types(node, srcs, img.type in (T.F32, T.F16) and (node.type == T.F16 or
                                                           (node.type == T.F32 and img.type == T.F32)))


def _im2col_3d_types(node, srcs):
    need_types(node, srcs, srcs[1].type == T.F32 and node.type in (T.F32, T.F16))


def _col2im_types(node, srcs):
    a = srcs[0]
    need_types(node, srcs, a.type == node.type and a.type in (T.F32, T.F16, T.BF16))


def _im2col_back_types(node, srcs):
    need_types(node, srcs, srcs[0].type == T.F32 and node.type == T.F32)


def _pool_types(node, srcs):
    need_types(node, srcs, srcs[0].type in (T.F32, T.F16) and node.type == T.F32)


RULES = {
    Op.CONV_2D: rule_conv,
    Op.CONV_3D: rule_conv,
    Op.CONV_2D_DW: rule_conv_2d_dw,
    Op.CONV_TRANSPOSE_1D: simple("CONV_TRANSPOSE", rules.conv_transpose, _kernel_f32_f16, variants=True),
    Op.CONV_TRANSPOSE_2D: simple("CONV_TRANSPOSE", rules.conv_transpose, _kernel_f32_f16, variants=True),
    Op.IM2COL: simple("IM2COL", rules.im2col, _im2col_types),
    Op.IM2COL_3D: simple("IM2COL_3D", rules.im2col_3d, _im2col_3d_types),
    Op.COL2IM_1D: simple("COL2IM_1D", rules.col2im_1d, _col2im_types),
    Op.IM2COL_BACK: simple("IM2COL_BACK", rules.im2col_back, _im2col_back_types),
    Op.POOL_1D: simple("POOL_1D", rules.pool, _pool_types),
    Op.POOL_2D: simple("POOL_2D", rules.pool, _pool_types),
    Op.POOL_2D_BACK: simple("POOL_2D_BACK", rules.pool_2d_back, f32_only),
    Op.UPSCALE: simple("UPSCALE", rules.upscale, f32_only),
}
