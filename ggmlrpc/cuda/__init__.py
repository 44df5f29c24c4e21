"""CUDA kernels: .cu sources in `kernels/`, compiled per device on first use.

`Kernels(source_module)` compiles each kernel file once through a PyCUDA-shaped
`source_module(source, include_dirs=..., no_extern_c=True)` (PyCUDA's SourceModule
on a device, with its on-disk cache; the SIMT emulator in the tests) and hands out
functions; `ops` holds the launchers (grid/block choice, argument types) that the
device and the tests share.
"""
from __future__ import annotations

import re
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
# kernel files by op family; each includes common.cuh
FAMILIES = ("elementwise", "norm", "softmax", "rope", "rows", "matmul", "flash_attn", "sort")


def kernel_source(family: str) -> str:
    return (KERNEL_DIR / f"{family}.cu").read_text()


def type_list(macro: str, family: str = "common") -> list[str]:
    """The kernel-name suffixes of an X-macro type list (`#define GR_ALL_TYPES(X) X(f32, tr_f32)
    ...`): the .cu/.cuh text is the one table of which types have which kernels."""
    name = "common.cuh" if family == "common" else f"{family}.cu"
    text = (KERNEL_DIR / name).read_text()
    m = re.search(r"#define\s+" + macro + r"\(X\)((?:[^\n]*\\\n)*[^\n]*)", text)
    if m is None:
        raise LookupError(f"no type list {macro} in {name}")
    return re.findall(r"X\((\w+),\s*\w+\)", m.group(1))


class Kernels:
    """The kernel files of one device, compiled when first used."""

    def __init__(self, source_module, **options):
        self._source_module = source_module
        self._options = options
        self._modules: dict[str, object] = {}
        self._functions: dict[tuple[str, str], object] = {}

    def module(self, family: str):
        mod = self._modules.get(family)
        if mod is None:
            mod = self._source_module(kernel_source(family), include_dirs=[str(KERNEL_DIR)],
                                      no_extern_c=True, **self._options)
            self._modules[family] = mod
        return mod

    def function(self, family: str, name: str):
        f = self._functions.get((family, name))
        if f is None:
            f = self._functions[(family, name)] = self.module(family).get_function(name)
        return f


def pycuda_kernels(device) -> Kernels:
    """Kernels compiled by PyCUDA for `device` (a pycuda.driver.Device) and cached on disk."""
    from pycuda.compiler import SourceModule

    major, minor = device.compute_capability()
    return Kernels(SourceModule, arch=f"sm_{major}{minor}", options=["-O3", "-lineinfo"])
