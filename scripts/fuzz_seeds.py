"""Record the single nodes the op tests run, as seeds for the guard-page fuzzer.

    python scripts/fuzz_seeds.py [pytest args...]     # default: tests/ops -q -x

Runs the op tests with the CPU planner wrapped: every node it accepts is written
(op, result and source types/ne/nb, op_params) to tests/data/fuzz_seeds.json,
at most SEEDS_PER_OP distinct ones per op, so tests/fuzz_guard.py mutates shapes
that are known to be valid rather than searching for them.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "data" / "fuzz_seeds.json"
SEEDS_PER_OP = 40


def _t(t):
    return None if t is None else [int(t.type), list(map(int, t.ne)), list(map(int, t.nb))]


class Recorder:
    def __init__(self):
        self.seeds: dict[tuple, dict] = {}

    def pytest_configure(self, config):
        from ggmlrpc.compute import cpu
        original = cpu.CpuExecutor.compile
        recorder = self

        def compile(executor, graph, *args, **kw):
            plan = original(executor, graph, *args, **kw)
            for node in graph.runnable():
                srcs = [graph.tensors[s] if s else None for s in node.src]
                while srcs and srcs[-1] is None:
                    srcs.pop()
                seed = {"op": int(node.op), "dst": _t(node), "op_params": list(map(int, node.op_params)),
                        "srcs": [_t(s) for s in srcs]}
                key = json.dumps(seed, sort_keys=True)
                recorder.seeds.setdefault(key, seed)
            return plan

        cpu.CpuExecutor.compile = compile

    def pytest_unconfigure(self, config):
        per_op: dict[int, list] = {}
        for seed in self.seeds.values():
            per_op.setdefault(seed["op"], []).append(seed)
        out = []
        for op in sorted(per_op):
            seeds = per_op[op]
            # keep the smallest graphs: the fuzzer runs them fastest
            seeds.sort(key=lambda s: sum(_extent(t) for t in [s["dst"]] + s["srcs"] if t))
            out += seeds[:SEEDS_PER_OP]
        OUT.write_text("[\n" + ",\n".join(json.dumps(s, separators=(",", ":")) for s in out) + "\n]\n")
        print(f"\n{len(out)} seeds over {len(per_op)} ops -> {OUT.relative_to(REPO)}")


def _extent(t):
    typ, ne, nb = t
    return sum((n - 1) * b for n, b in zip(ne, nb)) + nb[0]


if __name__ == "__main__":
    args = sys.argv[1:] or ["tests/ops", "-q", "-x", "-p", "no:cacheprovider"]
    raise SystemExit(pytest.main(args, plugins=[Recorder()]))
