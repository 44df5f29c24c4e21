"""What the CPU executor runs, op by op: the kernel, its variant and derived integers.

Each rule takes a graph node and its sources, checks them against ggml's rules
(ggmlrpc.ops, with the CPU's type check as `admit`) and returns a Spec (kernel
id, variant, derived integers, the sources the kernel reads), or raises:
UnsupportedError for valid ggml we have no kernel for, ValidationError for what
ggml itself would reject.

The kernels rely on these checks for memory safety: a kernel walks each tensor
only inside its own ne/nb, and the rules make sure that the shapes a kernel
combines (a row of src0 with a row of src1...) agree.

The modules are the op families of ggmlrpc.ops, one for one. A new kernel is one
entry in the C kernel table, one C kernel function and one rule here (its op in
the family module's RULES); every number the rules hand to C is named in
kernels.py.
"""
from __future__ import annotations

from ...ops.base import by_op, describe
from .base import Spec, unsupported

# op -> rule(node, srcs) -> Spec
RULES = by_op(__name__, "RULES")

__all__ = ["RULES", "Spec", "describe", "unsupported"]
