"""Every number the CPU rules hand to the C executor, by name.

Kernel ids and element-wise function ids come from the native module
(executor.KERNEL, executor.UNOP), which takes them from the C kernel table; the
binary op ids, the variants of a kernel (its `sub`) and the path codes some
kernels read from iparams come from executor.BINOP, VARIANT and CONST, which the
table's csrc/cpu/kernels.def and names.def rows generate. Rules use the names (`ids.K.RMS_NORM`, `variant("RMS_NORM", "L2_NORM")`),
never the numbers. Loaded on first use, so importing the rules needs no native
build.
"""
from __future__ import annotations

# the kernels that read a strategy code from iparams, and the group of csrc/cpu/names.def
# that names those codes
_PATH_GROUPS = {"DUP": "DUP_MODE", "MUL_MAT": "MM_ORDER", "FLASH_ATTN": "FA_PATH"}

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
        self.BINOP = _Names(ex.BINOP)
        self.VARIANT = ex.VARIANT
        self.PATH = {kernel: ex.CONST[group] for kernel, group in _PATH_GROUPS.items()}
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
