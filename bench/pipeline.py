"""Prompt speed with -sm layer over two servers: the micro-batches as a pipeline
(each server on its own micro-batch at once) against one after the other, and
against llama.cpp's client (llama-bench --rpc -ts 1/1, which pipelines too: its
RPC backend is asynchronous and has events).

Two of our servers, each pinned to its own core (taskset) with -t 1, the generated
bench model (bench/llama_bench.py: 12 layers, width 1024). Our host runs in this
process: Model.load, a warm-up prompt (its graphs built and sent once), then the
timed prompt of --pp tokens in micro-batches of --ubatch. Each round starts two fresh
servers and runs on them, in alternating order, `pipeline`, `one-by-one` and
llama-bench. `--rtt-ms 0.2 1` adds those round trips (netproxy.py). Prints JSON rows
and a table: median prompt tokens/s, and the median over the rounds of each round's
ratios. Asserts nothing.

    python bench/pipeline.py --types Q8_0 Q4_K_M --pp 2048 --rounds 3 --rtt-ms 0 1
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE.parent))   # an installed ggmlrpc first


import tensor_split as ts  # noqa: E402  (this script's folder is first on sys.path)

from ggmlrpc.llm.model import Model  # noqa: E402

MODES = {"pipeline": True, "one-by-one": False}


def ours(m: Path, pipeline: bool, eps: list[str], pp: int, ubatch: int) -> float:
    """Prompt tokens/s of our host: a prompt of pp tokens after a warm-up one."""
    ids = [1 + i % 200 for i in range(pp)]
    with Model.load(m, rpc=eps, tensor_split=[1, 1], n_ctx=pp, n_ubatch=ubatch, pipeline=pipeline) as model:
        model.eval(ids)
        model.reset()
        t0 = time.perf_counter()
        model.eval(ids)
        return pp / (time.perf_counter() - t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pp", type=int, default=2048)
    ap.add_argument("--ubatch", type=int, default=512)
    ts.add_round_args(ap, timeout=900)
    args = ap.parse_args(argv)
    results = []
    for ref, _, qtype, m, rtt in ts.cases(args):
        def run(name, eps):
            if name != "llama-bench":
                return ours(m, MODES[name], eps, args.pp, args.ubatch)
            return None if args.no_reference else ts.llama_bench(
                ref, m, eps, ["-p", str(args.pp), "-n", "0", "-ub", str(args.ubatch)], "pp", args.timeout)
        runs = ts.alternate([*MODES, "llama-bench"], args.rounds, rtt, run)
        row = ts.summarize({"type": qtype, "rtt_ms": rtt, "pp": args.pp, "ubatch": args.ubatch,
                            "rounds": args.rounds, "runs": runs},
                           runs, [("pipeline", "one-by-one"), ("pipeline", "llama-bench")])
        results.append(row)
        print(json.dumps(row), flush=True)
    ts.table(results, [("pipeline", "pipeline"), ("one-by-one", "1-by-1"), ("llama-bench", "llama"),
                       ("pipeline/one-by-one", "pipe/1-by-1"), ("pipeline/llama-bench", "pipe/llama")],
             "prompt tokens/s", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
