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
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE.parent))   # an installed ggmlrpc first


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


lb, runner, ts = _load("llama_bench"), _load("runner"), _load("tensor_split")

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


def reference(ref: Path, m: Path, eps: list[str], pp: int, ubatch: int, timeout: float) -> float | str:
    cmd = [str(ref / "llama-bench"), "-m", str(m), "-p", str(pp), "-n", "0", "-ub", str(ubatch), "-r", "2",
           "-o", "json", "-ngl", "99", "--rpc", ",".join(eps), "-ts", "1/1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        return r.stderr.strip()[-300:]
    return runner.rows(r.stdout)["pp"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", nargs="+", default=["Q8_0"])
    ap.add_argument("--pp", type=int, default=2048)
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rtt-ms", nargs="+", type=float, default=[0.0])
    ap.add_argument("--no-reference", action="store_true", help="skip llama-bench")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    ref = lb.reference_bin()
    shape = lb.model_shape(SimpleNamespace(layers=12, embd=1024, ff=2816))
    results = []
    for qtype in args.types:
        m = lb.model(ref, qtype, shape)
        for rtt in args.rtt_ms:
            runs: dict[str, list] = {k: [] for k in (*MODES, "llama-bench")}
            for i in range(args.rounds):
                names = list(runs) if i % 2 == 0 else list(runs)[::-1]
                with ts.pinned_servers(rtt) as eps:
                    for name in names:
                        if name == "llama-bench":
                            r = None if args.no_reference else reference(ref, m, eps, args.pp, args.ubatch,
                                                                          args.timeout)
                        else:
                            r = ours(m, MODES[name], eps, args.pp, args.ubatch)
                        runs[name].append(r)
            row = {"type": qtype, "rtt_ms": rtt, "pp": args.pp, "ubatch": args.ubatch, "rounds": args.rounds,
                   "runs": runs}
            for name, vals in runs.items():
                ok = [v for v in vals if isinstance(v, float)]
                row[name] = statistics.median(ok) if ok else None
                if any(isinstance(v, str) for v in vals):
                    row[name + "_error"] = next(v for v in vals if isinstance(v, str))
            for base in ("one-by-one", "llama-bench"):
                ratios = [a / b for a, b in zip(runs["pipeline"], runs[base])
                          if isinstance(a, float) and isinstance(b, float)]
                if ratios:
                    row[f"pipeline/{base}"] = round(statistics.median(ratios), 3)
            results.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{'type':6} {'rtt ms':>6} {'pipeline':>9} {'1-by-1':>8} {'llama':>8} {'pipe/1-by-1':>11} "
          f"{'pipe/llama':>10}  (prompt tokens/s; ratios: medians of each round's)")
    for r in results:
        def f(k, w):
            return f"{r[k]:{w}.2f}" if r.get(k) else " " * (w - 1) + "-"
        print(f"{r['type']:6} {r['rtt_ms']:6.1f} {f('pipeline', 9)} {f('one-by-one', 8)} {f('llama-bench', 8)} "
              f"{f('pipeline/one-by-one', 11)} {f('pipeline/llama-bench', 10)}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
