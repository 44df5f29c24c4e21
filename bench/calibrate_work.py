"""Calibrate the cost of a matrix product per weight type for the graph work estimate.

    python bench/calibrate_work.py                 # measure, print, rewrite the table
    python bench/calibrate_work.py --dry-run --reps 3

For every weight type the CPU executor multiplies (a vec_dot kernel), times a
MUL_MAT on our server (one thread, a prompt-like and a decode-like shape, the
minimum of `--reps` runs), and divides its time per multiply-add by Q8_0's. The
larger of the two ratios, never below 1, is the type's weight: what
ggmlrpc.compute.work charges per multiply-add of a product with that weight
type. Rewrites ggmlrpc/compute/matmul_cost.py unless --dry-run; prints JSON and a
table. tests/unit/test_graph_work.py checks the stored table against the kernels
(every type has a weight, relations that hold on any host).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))
sys.path.append(str(REPO / "bench"))

from ops import run_case  # noqa: E402
from ggmlrpc._native import executor  # noqa: E402
from ggmlrpc.ggml import GGMLType as T  # noqa: E402
from tests.conftest import Proc, free_port, our_server_argv  # noqa: E402

TABLE = REPO / "ggmlrpc" / "compute" / "matmul_cost.py"
SHAPES = ((1024, 256, 64), (4096, 1024, 1))   # K x M x N: prompt-like, decode-like


def weight_types() -> list[T]:
    return [t for t in T if executor.has_vec_dot(int(t))]


def measure(endpoint: str, reps: int) -> dict[str, list[float]]:
    """ns per multiply-add of each type, per shape."""
    out = {}
    for t in weight_types():
        out[t.name] = []
        for K, M, N in SHAPES:
            row = run_case({"ours": endpoint}, int(t), (K, M, N), reps)
            out[t.name].append(row["ours_min_ms"] * 1e6 / (K * M * N))
    return out


def weights(ns: dict[str, list[float]]) -> dict[str, float]:
    unit = ns["Q8_0"]
    return {name: round(max(1.0, *(v / u for v, u in zip(per, unit))), 1) for name, per in ns.items()}


def write_table(w: dict[str, float]) -> None:
    body = "".join(f"    {name!r}: {v},\n" for name, v in w.items())
    TABLE.write_text(
        '"""Cost of one multiply-add of a matrix product by weight type, relative to Q8_0\n'
        "(ggmlrpc.compute.work). Written by bench/calibrate_work.py on one host\n"
        f'({platform.machine()}, kernel family {executor.kernel_family()}); do not edit by hand."""\n\n'
        f"WEIGHTS = {{\n{body}}}\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dry-run", action="store_true", help="print only; leave the table as it is")
    args = ap.parse_args(argv)
    port = free_port()
    proc = Proc([*our_server_argv(), "-p", str(port), "-t", "1"], port)
    try:
        ns = measure(proc.endpoint, args.reps)
    finally:
        proc.stop()
    w = weights(ns)
    print(json.dumps({"ns_per_madd": ns, "weights": w}, indent=2))
    print(f"{'type':8} " + " ".join(f"{'x'.join(map(str, s)):>14}" for s in SHAPES) + "  weight")
    for name, per in ns.items():
        print(f"{name:8} " + " ".join(f"{v:12.4f}ns" for v in per) + f"  {w[name]:6.1f}")
    if not args.dry_run:
        write_table(w)
        print(f"wrote {TABLE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
