"""What ggml accepts, op by op: source counts, shapes, layouts and op_params.

These rules are backend-neutral: they hold for every backend that computes a
ggml graph, and name no kernel. One function per op (grouped by op family in the
modules of this package, base.FAMILIES) takes a graph node and its sources,
raises ValidationError for what ggml itself would reject (its backends assert and
abort the process) and returns the sources the op reads (None for an absent
optional one). A few op parameters name a variant that ggml has no code for (a
rope mode, an upscale mode); those raise UnsupportedError.

Which types an op runs on is each backend's own matter: a check takes `admit`,
the backend's type check, and calls it once the sources are there, before the
shape rules that the types could make moot, so that a backend's verdict on the
types comes first where it always came. A backend's rule (compute/cpu_rules for
the CPU) calls the check and then chooses its kernel.

The rules mirror the asserts of ggml's ggml.c and ggml-cpu at protocol v7.0.0.
"""
from __future__ import annotations

from ..errors import ValidationError
from .base import accept, by_op, describe

# op -> check(node, srcs, admit=accept) -> the sources the op reads
CHECKS = by_op(__name__, "CHECKS")


def check(node, srcs, admit=accept):
    """Check a node against ggml's rules for its op; returns the sources it reads."""
    rule = CHECKS.get(node.op)
    if rule is None:
        raise ValidationError(describe(node, srcs, "has no rules here"))
    return rule(node, srcs, admit)
