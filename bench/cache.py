"""Local cache (`-c`) hits: what one SET_TENSOR_HASH that finds its file costs.

    python bench/cache.py                        # 16 and 256 MiB tensors
    python bench/cache.py --sizes 64 --reps 20 --json out.json

Each server (ours and the reference, separate processes with `-t 1 -c` and a cache
directory of their own) first receives the tensor once with the hash-first upload
(a miss, which stores the file); then the same client times SET_TENSOR_HASH hits
into a fresh tensor, alternating between the servers. A hit reads the cached file
into the tensor; ours checks the file against its index (size, mtime, inode)
instead of hashing it again. Prints a table and a JSON document; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from ggmlrpc import protocol
from ggmlrpc.client import RemoteBackend
from ggmlrpc.ggml import GGMLType
from servers import emit_json, fixtures, server_argvs  # bench/servers.py

MiB = 1 << 20


class Peer:
    def __init__(self, name: str, argv: list[str], fx, cache_dir: str, max_size: int):
        port = fx.free_port()
        self.name = name
        env = dict(os.environ, LLAMA_CACHE=cache_dir)
        env.pop("GGML_RPC_DEBUG", None)
        self.proc = fx.Proc([*argv, "-p", str(port), "-t", "1", "-c"], port, env=env)
        self.rb = RemoteBackend(self.proc.endpoint, timeout=600)
        self.buf = self.rb.alloc_buffer(max_size)
        if self.buf is None:
            raise SystemExit(f"{name}: cannot allocate {max_size} bytes")

    def store(self, data: np.ndarray) -> None:
        t = self.buf.tensor(GGMLType.I8, (data.nbytes,))
        self.rb.set_tensor(t, data, weights=True)
        self.rb.synchronize()

    def hit_once(self, size: int, h: int) -> float:
        t = self.buf.tensor(GGMLType.I8, (size,))
        t0 = time.perf_counter()
        ok = self.rb.set_tensor_hash(t, h)
        elapsed = time.perf_counter() - t0
        if not ok:
            raise SystemExit(f"{self.name}: no cache hit for {h:016x}")
        return elapsed

    def close(self) -> None:
        self.rb.close()
        self.proc.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="16,256", help="tensor sizes in MiB, comma separated")
    ap.add_argument("--reps", type=int, default=10, help="hits per size and server")
    ap.add_argument("--peers", default="ours,reference", help="servers to run: ours, reference")
    ap.add_argument("--json", metavar="PATH", help="also write the JSON document here")
    args = ap.parse_args(argv)

    sizes = [int(float(s) * MiB) for s in args.sizes.split(",") if s]
    fx = fixtures()
    argvs = server_argvs(fx, args.peers)
    results: dict = {"sizes": {}}
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        peers = [Peer(n, argvs[n], fx, os.path.join(tmp, n), max(sizes)) for n in args.peers.split(",")]
        try:
            rng = np.random.default_rng(0)
            for size in sizes:
                data = rng.integers(0, 256, size, dtype=np.uint8)
                h = protocol.codec().fnv1a(data)
                for p in peers:
                    p.store(data)
                times = {p.name: [] for p in peers}
                for i in range(args.reps):
                    for p in (peers if i % 2 == 0 else peers[::-1]):
                        times[p.name].append(p.hit_once(size, h))
                row = {k: {"median_ms": statistics.median(v) * 1e3, "best_ms": min(v) * 1e3,
                           "median_gbps": size / statistics.median(v) / 1e9, "runs": len(v)}
                       for k, v in times.items()}
                if {"ours", "reference"} <= set(times):
                    row["ours_over_reference_time"] = (row["ours"]["median_ms"]
                                                       / row["reference"]["median_ms"])
                results["sizes"][size // MiB] = row
        finally:
            for p in peers:
                p.close()

    for size, row in results["sizes"].items():
        cells = ", ".join(f"{k} {v['median_ms']:.1f} ms ({v['median_gbps']:.2f} GB/s)"
                          for k, v in row.items() if isinstance(v, dict))
        ratio = row.get("ours_over_reference_time")
        print(f"{size:>6} MiB hit: {cells}" + (f", ours/reference {ratio:.2f}" if ratio else ""))
    emit_json(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
