"""What ggml accepts, op by op: source counts, shapes, layouts and op_params.

These rules are backend-neutral: they name no kernel, and every backend that
computes a ggml graph starts from them (adding limits of its own where its
kernels have them). One function per op, grouped by op family in the modules of
this package (base.FAMILIES), takes a graph node and its sources, raises
ValidationError for what ggml itself rejects (its backends assert and abort the
process) and returns the sources the op reads (None for an absent optional one).
A few op parameters ask for something ggml has no code for (a rope mode, an
upscale mode, SOFT_MAX_BACK with ALiBi); those raise UnsupportedError.

Which types an op runs on is each backend's own matter. A check takes
`admit(node, srcs)`, the backend's type check, and calls it once the source
count is right, at one fixed point among its shape rules (for most ops before
them), so that a node wrong in both ways gets the same verdict from every
backend, the one the CPU executor always gave. A backend's rule
(compute/cpu_rules for the CPU) calls the check and then chooses its kernel;
called with the default admit, a check judges everything but the types.

The rules mirror the asserts of ggml's ggml.c and of its CPU backend at protocol
v7.0.0.
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
