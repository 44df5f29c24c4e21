"""What turns inside a long node cost the long graph, and what they give a bystander.

    python bench/turns.py                     # slices of 10, 25 and 50 ms
    python bench/turns.py --slices 0.01 --reps 9 --json out.json

In one process, on one executor of two threads: a long graph of three prompt-sized
products (Q8_0 weights 1024 x 2048 by 2048 columns, some 60 ms a node on two cores)
runs alone `--reps` times, then as often again while a bystander thread recomputes a
small graph every 2 ms on the same executor. For each turn length (Turns.SLICE) it
gives the long graph's best time alone and beside the bystander (growth: how much
longer), and the bystander's median, 99th percentile and worst wait in ms. A slice
longer than the whole graph shows a device without turns. The host's other load
moves single figures: compare rows of one run. Asserts nothing.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))

from servers import emit_json  # noqa: E402
from ggmlrpc.compute.cpu import CpuExecutor  # noqa: E402
from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T  # noqa: E402
from tests.ops.test_quants import random_blocks  # noqa: E402
from tests.unit.test_cpu_executor import Builder  # noqa: E402
from tests.unit.test_turns import small_product  # noqa: E402

K, M, N, NODES = 1024, 2048, 2048, 3


def long_graph():
    rng = np.random.default_rng(0)
    b = Builder(size=NODES * M * N * 4 + K * M * 2 + K * N * 4 + (8 << 20))
    w = b.tensor(T.Q8_0, (K, M), data=random_blocks(rng, T.Q8_0, K * M))
    x = b.tensor(T.F32, (K, N), data=rng.standard_normal((N, K)).astype(np.float32))
    for _ in range(NODES):
        b.tensor(T.F32, (M, N), op=Op.MUL_MAT, src=(w, x))
    return b.graph()


def measure(slice_s: float, reps: int) -> dict:
    ex = CpuExecutor(2)
    ex.turns.SLICE = slice_s
    plan = ex.compile(long_graph())
    small = ex.compile(small_product()[0].graph())

    def timed():
        t = time.perf_counter()
        ex.run(plan)
        return time.perf_counter() - t

    timed()   # warm up
    alone = min(timed() for _ in range(reps))
    stop, waits = threading.Event(), []

    def bystander():
        while not stop.is_set():
            t = time.perf_counter()
            ex.run(small)
            waits.append(1000 * (time.perf_counter() - t))
            time.sleep(0.002)
    th = threading.Thread(target=bystander)
    th.start()
    try:
        beside = min(timed() for _ in range(reps))
    finally:
        stop.set()
        th.join()
    waits.sort()
    at = lambda q: round(waits[int(q * (len(waits) - 1))], 3)  # noqa: E731
    return {"slice_ms": slice_s * 1000, "alone_s": round(alone, 4), "beside_s": round(beside, 4),
            "growth": round(beside / alone - 1, 4), "graphs": len(waits),
            "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": round(waits[-1], 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slices", default="0.01,0.025,0.05", help="turn lengths in seconds")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows = [measure(float(s), args.reps) for s in args.slices.split(",")]
    emit_json({"threads": 2, "reps": args.reps, "results": rows}, args.json)
    print(f"{'slice ms':>9} {'alone s':>8} {'beside s':>9} {'growth':>7} {'graphs':>7} "
          f"{'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}")
    for r in rows:
        print(f"{r['slice_ms']:>9.0f} {r['alone_s']:>8.3f} {r['beside_s']:>9.3f} {100 * r['growth']:>+6.1f}% "
              f"{r['graphs']:>7} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['max_ms']:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
