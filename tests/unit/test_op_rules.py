"""The layout of the op rules: ggml's rules (ggmlrpc.ops) are backend-neutral and
every CPU rule (ggmlrpc.compute.cpu_rules) stands on one of them.

The neutral package must run without the CPU executor: it imports nothing of
ggmlrpc.compute or ggmlrpc._native, so a CUDA executor can use it alone.
"""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

from ggmlrpc import ggml, ops
from ggmlrpc.compute import cpu_rules
from ggmlrpc.compute.cpu_rules import kernels
from ggmlrpc.ops.base import FAMILIES

OPS_DIR = pathlib.Path(ops.__file__).parent


def _imports(path: pathlib.Path):
    """The absolute name of every module a module of ggmlrpc.ops imports."""
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            yield from (a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            if n.level == 0:
                yield n.module
            else:   # ggmlrpc.ops is two levels below the top: level 1 = ggmlrpc.ops, 2 = ggmlrpc
                base = ["ggmlrpc", "ops"][:3 - n.level]
                mod = ".".join(base + ([n.module] if n.module else []))
                yield from (mod,) if n.module else (f"{mod}.{a.name}" for a in n.names)


@pytest.mark.parametrize("path", sorted(OPS_DIR.glob("*.py")), ids=lambda p: p.name)
def test_neutral_rules_import_no_backend(path):
    for mod in _imports(path):
        assert not mod.startswith(("ggmlrpc.compute", "ggmlrpc._native", "ggmlrpc.devices")), \
            f"{path.name} imports {mod}: ggml's rules must not depend on a backend"


def test_neutral_rules_load_without_the_executor():
    code = ("import sys, ggmlrpc.ops; "
            "bad = [m for m in sys.modules if m.startswith(('ggmlrpc.compute', 'ggmlrpc._native'))]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-P", "-c", code], check=True)


def test_every_cpu_rule_has_a_neutral_rule():
    missing = sorted(ggml.op_name(op) for op in cpu_rules.RULES if op not in ops.CHECKS)
    assert not missing, f"CPU rules without a ggml rule: {missing}"


@pytest.mark.parametrize("family", FAMILIES)
def test_cpu_families_mirror_the_neutral_ones(family):
    """compute/cpu_rules/<family>.py covers the ops of ops/<family>.py, no more."""
    import importlib
    neutral = importlib.import_module(f"ggmlrpc.ops.{family}").CHECKS
    cpu = importlib.import_module(f"ggmlrpc.compute.cpu_rules.{family}").RULES
    assert set(cpu) <= set(neutral), sorted(ggml.op_name(op) for op in set(cpu) - set(neutral))


def test_named_kernel_numbers_exist():
    """Every kernel a variant or a path names is a kernel of the C table, and every
    variant or path name a rule uses is exported by it."""
    import ast
    import pathlib
    ex = kernels.executor()
    for kernel in list(kernels.ids.VARIANT) + list(kernels.ids.PATH):
        assert kernel in ex.KERNEL, kernel
    used = set()
    for path in pathlib.Path(kernels.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("variant", "path")
                    and all(isinstance(a, ast.Constant) for a in node.args)):
                used.add((node.func.id, *(a.value for a in node.args)))
    assert used, "no variant()/path() calls found"
    for what, kernel, name in used:
        table = kernels.ids.VARIANT if what == "variant" else kernels.ids.PATH
        assert name in table.get(kernel, {}), (what, kernel, name)


class _T:
    """A tensor as the rules see it."""

    def __init__(self, type, ne, op=0, op_params=(0,) * 16):
        self.type, self.ne, self.op, self.op_params = type, tuple(ne), op, tuple(op_params)
        self.nb = ggml.contiguous_strides(type, self.ne)
        self.name_str = "t"


def test_a_check_alone_judges_all_but_types():
    """Without a backend's admit, ops.check passes any types and still rejects shapes."""
    from ggmlrpc.errors import ValidationError
    T = ggml.GGMLType
    w, x = _T(T.Q4_0, (64, 8, 1, 1)), _T(T.I32, (64, 3, 1, 1))
    node = _T(T.I8, (8, 3, 1, 1), op=ggml.GGMLOp.MUL_MAT)
    assert ops.check(node, [w, x]) == [w, x]
    with pytest.raises(ValidationError, match="inner dimensions differ"):
        ops.check(node, [w, _T(T.F32, (32, 3, 1, 1))])
