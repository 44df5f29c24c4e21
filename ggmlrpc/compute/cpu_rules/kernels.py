"""Every number the CPU rules hand to the C executor, by name.

Kernel ids and element-wise function ids come from the native module
(executor.KERNEL, executor.UNOP), which takes them from the C kernel table; the
binary op ids, the variants of a kernel (its `sub`) and the path codes some
kernels read from iparams come from executor.BINOP, VARIANT and PATH where the
table exports them, and until it does from the fallback tables below (a kernel
the export lacks falls back too; tests/unit/test_op_rules.py checks that both
agree). Rules use the names (`ids.K.RMS_NORM`, `variant("RMS_NORM", "L2_NORM")`),
never the numbers. Loaded on first use, so importing the rules needs no native
build.
"""
from __future__ import annotations

# until the C kernel table exports it (executor.BINOP): enum gr_binop
_BINOP_FALLBACK = {"ADD": 0, "SUB": 1, "MUL": 2, "DIV": 3}

# until the C kernel table exports it (executor.VARIANT): kernel -> {variant -> value}.
# `sub` of the kernels with several ops in one kernel:
_VARIANT_FALLBACK = {
    "RMS_NORM": {"RMS_NORM": 0, "L2_NORM": 1},
    "SUM_ROWS": {"SUM_ROWS": 0, "MEAN": 1},
    "ARGSORT": {"ARGSORT": 0, "TOP_K": 1},
    "DIAG_MASK": {"DIAG_MASK_INF": 0, "DIAG_MASK_ZERO": 1},
    "CROSS_ENTROPY": {"CROSS_ENTROPY_LOSS": 0, "CROSS_ENTROPY_LOSS_BACK": 1},
    "OPT_STEP": {"OPT_STEP_ADAMW": 0, "OPT_STEP_SGD": 1},
    "WIN_PART": {"WIN_PART": 0, "WIN_UNPART": 1},
    "CONV": {"CONV_2D": 0, "CONV_3D": 1},
    "CONV_TRANSPOSE": {"CONV_TRANSPOSE_1D": 0, "CONV_TRANSPOSE_2D": 1},
    "ADD_Q": {"ADD": 0, "ADD1": 1},
    "RWKV_WKV6": {"RWKV_WKV6": 0, "GATED_LINEAR_ATTN": 1},
    "ROPE": {"ROPE": 0, "ROPE_BACK": 1},
    # GLU's sub is the ggml_glu_op; SILU_BACK follows them
    "GLU": {"SILU_BACK": 7},
}

# until the C kernel table exports them: the path codes some kernels read from
# iparams (csrc/ops_basic.c DUP_*, csrc/ops_matmul.c MM_* and FA_*)
_PATH_FALLBACK = {
    "DUP": {"PLAIN": 0, "FROM_Q": 1, "TO_Q": 2, "FROM_Q_BLOCKS": 3},          # iparams[2]
    "MUL_MAT": {"VEC_DOT": 0, "GEMM": 1, "TILED": 2, "Q0_GEMM": 3},           # iparams[1]
    "FLASH_ATTN": {"ROWS": 0, "TILED": 1, "SPLIT": 2},                         # iparams[1]
}


_loaded = None


def _executor():
    global _loaded
    if _loaded is None:
        from ..._native import executor
        _loaded = executor
    return _loaded


class _Names:
    """Attribute access to a {name: value} table (K.MUL_MAT)."""

    def __init__(self, table):
        self.__dict__.update(table)


class _Ids:
    """K (kernels), UN (element-wise functions), BINOP, VARIANT and PATH, read from
    the native module on first use."""

    def __getattr__(self, name):
        ex = _executor()
        self.K = _Names(ex.KERNEL)
        self.UN = _Names(ex.UNOP)
        self.BINOP = _Names(getattr(ex, "BINOP", None) or _BINOP_FALLBACK)
        self.VARIANT = {**_VARIANT_FALLBACK, **(getattr(ex, "VARIANT", None) or {})}
        self.PATH = {**_PATH_FALLBACK, **(getattr(ex, "PATH", None) or {})}
        if name not in self.__dict__:
            raise AttributeError(name)
        return self.__dict__[name]


ids = _Ids()


def variant(kernel: str, name: str) -> int:
    """The `sub` that selects `name` inside `kernel`."""
    return ids.VARIANT[kernel][name]


def path(kernel: str, name: str) -> int:
    """The code of a kernel's strategy `name` (put in iparams)."""
    return ids.PATH[kernel][name]


def executor():
    """The native executor module (capability queries: vec_dot_type, has_to_float...)."""
    return _executor()
