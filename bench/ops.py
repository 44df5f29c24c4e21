"""One op at a time: our server against llama.cpp's on the same graph.

    python bench/ops.py                                   # MUL_MAT of Q8_0, Q4_0, Q4_K_M-sized Q4_K, F16
    python bench/ops.py --types Q8_0 --shapes 1024x2816x64 --threads 2 --reps 40
    python bench/ops.py --types "" --fa 128x1152,512x1536 # flash attention of a prompt's micro-batch
    python bench/ops.py --baseline ../other-checkout      # also our server from another tree (A/B)
    python bench/ops.py --json out.json

Each case builds the same single-node graph (same random weights and activations)
on both servers, computes it once, then times GRAPH_RECOMPUTE (plus the round trip
that waits for it) on the two servers in turn, `--reps` times each. A product of a
model's size takes milliseconds, so the round trip is a small part of it, and the
minimum over many alternating runs is steady even on a busy host where whole-model
numbers are not. The table gives the minimum and median milliseconds of each
server, the speed ratio reference/ours of the minimums and of the medians, and
whether the two results were the same bytes. `--fa QxKV` cases are FLASH_ATTN_EXT
of Q queries over KV cells (16 heads of 64, F16 keys and values, the queries the
last Q positions under a causal mask), as a prompt's micro-batch over a cache.
`--baseline PATH` adds our server run from another checkout (its `ggmlrpc`
package, built), timed in the same turns: the ratio baseline / ours is the change's.
Asserts nothing; see bench/README.md.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))   # the tests package; ggmlrpc itself as installed

from servers import emit_json  # noqa: E402  bench/servers.py
from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T  # noqa: E402
from tests.conftest import Proc, free_port, our_server_argv, reference_bin  # noqa: E402
from tests.ops.conftest import Ctx, f32_bits  # noqa: E402
from tests.ops.test_quants import random_blocks  # noqa: E402


def build(c: Ctx, qtype: int, K: int, M: int, N: int, seed: int):
    """MUL_MAT of (K, M) weights of qtype by (K, N) F32 activations."""
    rng = np.random.default_rng(seed)
    w = c.new(qtype, (K, M))
    if qtype in (T.F32, T.F16):
        c.write(w, rng.standard_normal((M, K)).astype(np.float32))
    else:
        c.rb.set_tensor(w, random_blocks(rng, qtype, K * M).tobytes())
    x = c.new(T.F32, (K, N), rng.standard_normal((N, K)).astype(np.float32))
    return c.op(Op.MUL_MAT, T.F32, (M, N), w, x)


FA_HEADS, FA_DIM = 16, 64


def build_fa(c: Ctx, n_q: int, n_kv: int, seed: int):
    """FLASH_ATTN_EXT of n_q F32 queries over n_kv F16 cells, the queries the last
    n_q positions under a causal mask (rows padded to 8, as llama.cpp's)."""
    rng = np.random.default_rng(seed)
    q = c.new(T.F32, (FA_DIM, n_q, FA_HEADS), rng.standard_normal((FA_HEADS, n_q, FA_DIM)).astype(np.float32))
    k, v = (c.new(T.F16, (FA_DIM, n_kv, FA_HEADS), rng.standard_normal((FA_HEADS, n_kv, FA_DIM)).astype(np.float16))
            for _ in range(2))
    rows = -(-n_q // 8) * 8
    m = np.zeros((rows, n_kv), np.float16)
    for i in range(n_q):
        m[i, n_kv - n_q + i + 1:] = -np.inf
    mask = c.new(T.F16, (n_kv, rows), m)
    return c.op(Op.FLASH_ATTN_EXT, T.F32, (FA_DIM, FA_HEADS, n_q, 1), q, k, v, mask,
                params=[f32_bits(FA_DIM ** -0.5), 0, 0, 10])


def run_case(endpoints: dict[str, str], qtype: int | None, shape: tuple[int, ...], reps: int) -> dict:
    """One case on every server: MUL_MAT of qtype (K, M, N), or with qtype None
    flash attention (Q, KV)."""
    if qtype is None:
        n_q, n_kv = shape
        size = FA_HEADS * FA_DIM * (n_q * 8 + n_kv * 4) + n_q * n_kv * 2 + (8 << 20)
    else:
        K, M, N = shape
        size = (K * M * 4 + K * N * 4 + M * N * 4) + (8 << 20)
    ctxs = {name: Ctx(ep, size=size) for name, ep in endpoints.items()}
    try:
        outs = {name: build_fa(c, *shape, seed=1) if qtype is None else build(c, qtype, *shape, seed=1)
                for name, c in ctxs.items()}
        for c in ctxs.values():
            c.compute()
        times: dict[str, list[float]] = {name: [] for name in ctxs}
        for _ in range(reps):
            for name, c in ctxs.items():
                t = time.perf_counter()
                c.recompute()
                times[name].append((time.perf_counter() - t) * 1e3)
        results = {name: bytes(c.rb.get_tensor(outs[name])) for name, c in ctxs.items()}
    finally:
        for c in ctxs.values():
            c.close()
    row = {"type": "FA F16" if qtype is None else T(qtype).name, "shape": "x".join(map(str, shape))}
    for name, ts in times.items():
        row[f"{name}_min_ms"] = round(min(ts), 3)
        row[f"{name}_median_ms"] = round(statistics.median(ts), 3)
    for other, key in (("reference", "ratio"), ("baseline", "baseline_ratio")):
        if other in times and "ours" in times:
            row[f"{key}_min"] = round(min(times[other]) / min(times["ours"]), 3)
            row[f"{key}_median"] = round(statistics.median(times[other]) / statistics.median(times["ours"]), 3)
            row[f"{key}_same_bytes" if other == "baseline" else "same_bytes"] = results["ours"] == results[other]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="Q8_0,Q4_0,Q4_K,F16")
    ap.add_argument("--shapes", default="1024x2816x64,1024x2816x1",
                    help="KxMxN products: K inner, M weight rows, N activation rows")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fa", default="", help="flash attention cases QxKV: queries x cells")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--peers", default="ours,reference")
    ap.add_argument("--baseline", help="a checkout of ggmlrpc whose server also runs (its built package)")
    ap.add_argument("--json", help="also write the JSON here")
    args = ap.parse_args(argv)

    argvs = {"ours": our_server_argv()}
    if "reference" in args.peers:
        ref = reference_bin()
        if ref is None:
            raise SystemExit("reference build missing: run scripts/build-reference.sh")
        argvs["reference"] = [str(ref / "ggml-rpc-server")]
    peers, envs = args.peers.split(","), {}
    if args.baseline:
        peers.append("baseline")
        argvs["baseline"] = [sys.executable, "-P", "-m", "ggmlrpc.cli.server"]
        envs["baseline"] = dict(os.environ, PYTHONPATH=str(Path(args.baseline).resolve()))
    procs = {}
    try:
        for name in peers:
            port = free_port()
            procs[name] = Proc([*argvs[name], "-p", str(port), "-t", str(args.threads)], port, env=envs.get(name))
        endpoints = {name: p.endpoint for name, p in procs.items()}
        cases = [(T[t], tuple(int(v) for v in s.split("x"))) for t in filter(None, args.types.split(","))
                 for s in args.shapes.split(",")]
        cases += [(None, tuple(int(v) for v in s.split("x"))) for s in filter(None, args.fa.split(","))]
        rows = [run_case(endpoints, qtype, shape, args.reps) for qtype, shape in cases]
    finally:
        for p in procs.values():
            p.stop()

    print(f"-t {args.threads}, {args.reps} alternating runs each (ms; ratio = reference / ours)")
    print(f"{'type':6} {'shape':>14} {'ours min':>9} {'ref min':>9} {'ratio':>6} {'ours med':>9} "
          f"{'ref med':>9} {'ratio':>6}  same bytes" + ("   base min  base/ours  same" if args.baseline else ""))
    for r in rows:
        print(f"{r['type']:6} {r['shape']:>14} {r.get('ours_min_ms', 0):9.3f} {r.get('reference_min_ms', 0):9.3f} "
              f"{r.get('ratio_min', 0):6.2f} {r.get('ours_median_ms', 0):9.3f} {r.get('reference_median_ms', 0):9.3f} "
              f"{r.get('ratio_median', 0):6.2f}  {str(r.get('same_bytes', '-')):5}" +
              (f"  {r.get('baseline_min_ms', 0):9.3f} {r.get('baseline_ratio_min', 0):9.2f}  "
               f"{r.get('baseline_ratio_same_bytes', '-')}" if args.baseline else ""))
    emit_json({"threads": args.threads, "reps": args.reps, "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
