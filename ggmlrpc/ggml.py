"""ggml enumerations and type traits at protocol v7.0.0 (GGML_OP_COUNT == 101)."""
from __future__ import annotations

import enum


class GGMLType(enum.IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42


TYPE_COUNT = 43

# type -> (block size in elements, bytes per block)
TYPE_TRAITS: dict[int, tuple[int, int]] = {
    GGMLType.F32: (1, 4), GGMLType.F16: (1, 2), GGMLType.Q4_0: (32, 18),
    GGMLType.Q4_1: (32, 20), GGMLType.Q5_0: (32, 22), GGMLType.Q5_1: (32, 24),
    GGMLType.Q8_0: (32, 34), GGMLType.Q8_1: (32, 36), GGMLType.Q2_K: (256, 84),
    GGMLType.Q3_K: (256, 110), GGMLType.Q4_K: (256, 144), GGMLType.Q5_K: (256, 176),
    GGMLType.Q6_K: (256, 210), GGMLType.Q8_K: (256, 292), GGMLType.IQ2_XXS: (256, 66),
    GGMLType.IQ2_XS: (256, 74), GGMLType.IQ3_XXS: (256, 98), GGMLType.IQ1_S: (256, 50),
    GGMLType.IQ4_NL: (32, 18), GGMLType.IQ3_S: (256, 110), GGMLType.IQ2_S: (256, 82),
    GGMLType.IQ4_XS: (256, 136), GGMLType.I8: (1, 1), GGMLType.I16: (1, 2),
    GGMLType.I32: (1, 4), GGMLType.I64: (1, 8), GGMLType.F64: (1, 8),
    GGMLType.IQ1_M: (256, 56), GGMLType.BF16: (1, 2), GGMLType.TQ1_0: (256, 54),
    GGMLType.TQ2_0: (256, 66), GGMLType.MXFP4: (32, 17), GGMLType.NVFP4: (64, 36),
    GGMLType.Q1_0: (128, 18), GGMLType.Q2_0: (64, 18),
}


def blck_size(t: int) -> int:
    return TYPE_TRAITS.get(t, (0, 0))[0]


def type_size(t: int) -> int:
    return TYPE_TRAITS.get(t, (0, 0))[1]


def is_quantized(t: int) -> bool:
    return blck_size(t) > 1


_OP_NAMES = """NONE DUP ADD ADD_ID ADD1 ACC SUB MUL DIV SQR SQRT LOG SIN COS SUM SUM_ROWS CUMSUM
MEAN ARGMAX COUNT_EQUAL REPEAT REPEAT_BACK CONCAT SILU_BACK NORM RMS_NORM RMS_NORM_BACK
GROUP_NORM L2_NORM MUL_MAT MUL_MAT_ID OUT_PROD SCALE SET CPY CONT RESHAPE VIEW PERMUTE
TRANSPOSE GET_ROWS GET_ROWS_BACK SET_ROWS DIAG DIAG_MASK_INF DIAG_MASK_ZERO SOFT_MAX
SOFT_MAX_BACK ROPE ROPE_BACK CLAMP CONV_TRANSPOSE_1D IM2COL IM2COL_BACK IM2COL_3D COL2IM_1D
CONV_2D CONV_3D CONV_2D_DW CONV_TRANSPOSE_2D POOL_1D POOL_2D POOL_2D_BACK UPSCALE PAD
PAD_REFLECT_1D ROLL ARANGE TIMESTEP_EMBEDDING ARGSORT TOP_K LEAKY_RELU TRI FILL
FLASH_ATTN_EXT FLASH_ATTN_BACK SSM_CONV SSM_SCAN WIN_PART WIN_UNPART GET_REL_POS
ADD_REL_POS RWKV_WKV6 GATED_LINEAR_ATTN RWKV_WKV7 SOLVE_TRI GATED_DELTA_NET
LIGHTNING_INDEXER DSV4_HC_COMB DSV4_HC_PRE DSV4_HC_POST UNARY MAP_CUSTOM1 MAP_CUSTOM2
MAP_CUSTOM3 CUSTOM CROSS_ENTROPY_LOSS CROSS_ENTROPY_LOSS_BACK OPT_STEP_ADAMW OPT_STEP_SGD
GLU""".split()

GGMLOp = enum.IntEnum("GGMLOp", {name: i for i, name in enumerate(_OP_NAMES)})
OP_COUNT = len(_OP_NAMES)
assert OP_COUNT == 101

GGMLUnaryOp = enum.IntEnum("GGMLUnaryOp", {name: i for i, name in enumerate(
    "ABS SGN NEG STEP TANH ELU RELU SIGMOID GELU GELU_QUICK SILU HARDSWISH HARDSIGMOID EXP "
    "EXPM1 SOFTPLUS GELU_ERF XIELU FLOOR CEIL ROUND TRUNC".split())})

GGMLGluOp = enum.IntEnum("GGMLGluOp", {name: i for i, name in enumerate(
    "REGLU GEGLU SWIGLU SWIGLU_OAI GEGLU_ERF GEGLU_QUICK SWIGLU_CLAMP".split())})

UNARY_OP_COUNT = len(GGMLUnaryOp)
GLU_OP_COUNT = len(GGMLGluOp)


class RopeMode(enum.IntEnum):
    """op_params[2] of ROPE / ROPE_BACK (ggml's GGML_ROPE_TYPE_*; MROPE is a bit the
    multi-section modes share)."""
    NORMAL = 0
    NEOX = 2
    MROPE = 8
    VISION = 24
    IMROPE = 40


class Prec(enum.IntEnum):
    """ggml_prec: the precision an op's client asked for (op_params of FLASH_ATTN_EXT...)."""
    DEFAULT = 0
    F32 = 10


SortOrder = enum.IntEnum("SortOrder", {"ASC": 0, "DESC": 1})        # ARGSORT's op_params[0]
PoolOp = enum.IntEnum("PoolOp", {"MAX": 0, "AVG": 1})                # op_params[0] of the POOL ops


class ScaleMode(enum.IntEnum):
    """The low byte of UPSCALE's op_params[0] (flags above it)."""
    NEAREST = 0
    BILINEAR = 1
    BICUBIC = 2


TRI_TYPE_COUNT = 4      # ggml_tri_type: UPPER_DIAG, UPPER, LOWER_DIAG, LOWER

# MUL_MAT's op_params[1]: a hint about src0; this one says it is a Hadamard matrix
MUL_MAT_HINT_NONE = 0
MUL_MAT_HINT_SRC0_IS_HADAMARD = 1

VIEW_OPS = frozenset({GGMLOp.NONE, GGMLOp.RESHAPE, GGMLOp.VIEW, GGMLOp.PERMUTE, GGMLOp.TRANSPOSE})
# ops whose op_params carry function pointers of the client process
FORBIDDEN_OPS = frozenset({GGMLOp.MAP_CUSTOM1, GGMLOp.MAP_CUSTOM2, GGMLOp.MAP_CUSTOM3, GGMLOp.CUSTOM})


class TensorFlag(enum.IntFlag):
    INPUT = 1
    OUTPUT = 2
    PARAM = 4
    LOSS = 8
    COMPUTE = 16


def op_name(op: int) -> str:
    return _OP_NAMES[op] if 0 <= op < OP_COUNT else f"op#{op}"


def type_name(t: int) -> str:
    try:
        return GGMLType(t).name
    except ValueError:
        return f"type#{t}"


def nbytes(t: int, ne, nb) -> int:
    """ggml_nbytes: byte extent of a tensor with strides nb (0 when any ne is 0)."""
    if any(n <= 0 for n in ne):
        return 0
    blck = blck_size(t)
    if blck == 1:
        return type_size(t) + sum((ne[i] - 1) * nb[i] for i in range(4))
    return ne[0] * nb[0] // blck + sum((ne[i] - 1) * nb[i] for i in range(1, 4))


def contiguous_strides(t: int, ne) -> tuple[int, int, int, int]:
    """Row-major strides of a freshly created tensor of type t and shape ne."""
    nb0 = type_size(t)
    nb1 = nb0 * (ne[0] // blck_size(t))
    nb2 = nb1 * ne[1]
    nb3 = nb2 * ne[2]
    return (nb0, nb1, nb2, nb3)
