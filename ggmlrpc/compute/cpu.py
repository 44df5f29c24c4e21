"""CPU graph executor.

``compile(graph)`` turns a validated graph into a plan and ``run(plan)`` executes it.
An op or type without a kernel raises UnsupportedError naming it: llama.cpp's
client assumes every op is supported, so the server must close the connection
rather than compute something wrong. Kernels arrive with the executor work; until
then only graphs whose runnable nodes are all covered by KERNELS compile.
"""
from __future__ import annotations

from .. import ggml
from ..errors import UnsupportedError

# op -> kernel; filled by the native executor
KERNELS: dict[int, object] = {}


class CpuPlan:
    def __init__(self, graph, steps):
        self.graph = graph
        self.steps = steps


class CpuExecutor:
    def __init__(self, n_threads: int):
        self.n_threads = n_threads

    def compile(self, graph) -> CpuPlan:
        steps = []
        for node in graph.runnable():
            kernel = KERNELS.get(node.op)
            if kernel is None:
                srcs = [graph.tensors[s] for s in node.src if s]
                types = ", ".join(ggml.type_name(s.type) for s in srcs)
                raise UnsupportedError(
                    f"op {ggml.op_name(node.op)} ({ggml.type_name(node.type)} <- {types or '-'}) "
                    f"of node {node.name_str!r} is not supported by the CPU executor")
            steps.append((kernel, node))
        return CpuPlan(graph, steps)

    def run(self, plan: CpuPlan) -> None:
        for kernel, node in plan.steps:
            kernel(plan.graph, node)
