"""What the CUDA executor launches, op by op.

Each rule takes a graph node, its sources and the compile-time Builder
(compute/cuda.py): it checks the node against ggml's rules (ggmlrpc.ops, with the
CUDA kernels' type check as `admit`), then records the node's launches from
ggmlrpc.cuda.ops with resolved device addresses, packing a strided source into
scratch where a kernel reads densely. It raises UnsupportedError for valid ggml
that no CUDA kernel covers, ValidationError for what ggml itself rejects.

The modules are the op families of ggmlrpc.ops, one for one; a family without
CUDA kernels has an empty RULES.
"""
from __future__ import annotations

from ...ops.base import by_op, describe
from .base import unsupported

# op -> rule(node, srcs, builder)
RULES = by_op(__name__, "RULES")

__all__ = ["RULES", "describe", "unsupported"]
