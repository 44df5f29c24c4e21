"""The ids Python plans with come from csrc/cpu/kernels.def and names.def, in their
order, with nothing copied by hand (executor builds its dicts from ggmlrpc_exec_names)."""
from __future__ import annotations

import re
from pathlib import Path

from ggmlrpc import ggml
from ggmlrpc._native import executor as ex

CPU = Path(__file__).resolve().parents[2] / "csrc" / "cpu"


def _rows(path: Path, macro: str) -> list[list[str]]:
    text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
    return [[a.strip() for a in m.group(1).split(",")]
            for m in re.finditer(rf"^{macro}\((.*)\)\s*$", text, re.M)]


def test_kernel_ids_are_the_table_rows_in_order():
    names = [r[0] for r in _rows(CPU / "kernels.def", "GR_KERNEL")]
    assert list(ex.KERNEL) == names
    assert [ex.KERNEL[n] for n in names] == list(range(len(names)))
    assert ex.KERNEL["NOP"] == 0 and "MUL_MAT" in ex.KERNEL


def test_variants_are_the_table_rows():
    want: dict[str, dict[str, int]] = {}
    for kernel, name, value in _rows(CPU / "kernels.def", "GR_VARIANT"):
        assert kernel in ex.KERNEL, kernel
        want.setdefault(kernel, {})[name] = int(value)
    assert ex.VARIANT == want
    assert ex.VARIANT["RMS_NORM"] == {"RMS_NORM": 0, "L2_NORM": 1}
    assert ex.VARIANT["SUM_ROWS"]["MEAN"] == 1 and ex.VARIANT["ARGSORT"]["TOP_K"] == 1


def test_named_ints():
    assert ex.BINOP == {"ADD": 0, "SUB": 1, "MUL": 2, "DIV": 3}
    for op in ggml.GGMLUnaryOp:   # ggml's unary ops are their own ids
        assert ex.UNOP[op.name] == op.value
    for name in ("SQR", "SQRT", "LOG", "SIN", "COS", "LEAKY_RELU", "CLAMP"):
        assert ex.UNOP[name] >= 32
    assert ex.EXEC_ERROR["EINDEX"] == ex.EXEC_EINDEX == 1
    assert ex.EXEC_ECANCELED == ex.EXEC_ERROR["ECANCELED"]
    assert ex.FAMILIES is ex.FAMILY and ex.kernel_family().removesuffix(ex.ZEN) in ex.FAMILY
    assert set(ex.CONST) == {"DUP_MODE", "MM_ORDER", "FA_PATH"}
    for group, rows in ex.CONST.items():
        assert sorted(rows.values()) == list(range(len(rows))), group
