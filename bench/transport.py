"""Transport throughput and latency: our server against llama.cpp's, next to raw TCP.

    python bench/transport.py                      # default sizes 1, 16, 256, 1024 MiB
    python bench/transport.py --sizes 1,64 --reps 5 --latency-n 5000 --json out.json

For each payload size it times SET_TENSOR (plus the DEVICE_COUNT round trip that
proves the server consumed it) and GET_TENSOR on both servers, alternating runs,
through the same client (RemoteBackend, sending from and receiving into
preallocated numpy arrays), and a plain loopback socket pair pumping the same
bytes with the same native send/recv loops. Then the round-trip latency of small
commands (GET_ALIGNMENT, a 64-byte GET_TENSOR). Prints a table and a JSON
document; asserts nothing. See bench/README.md.
"""
from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time

import numpy as np

from ggmlrpc._native import sockio
from ggmlrpc.client import RemoteBackend
from ggmlrpc.ggml import GGMLType
from servers import emit_json, fixtures, server_argvs  # bench/servers.py

MiB = 1 << 20
LATENCY_COMMANDS = ("get_alignment", "get_tensor_64")


class Peer:
    """A server process and one client connection to it, with one buffer big enough
    for the largest payload."""

    def __init__(self, name: str, argv: list[str], fx, max_size: int, timeout: float | None):
        port = fx.free_port()
        self.name = name
        self.proc = fx.Proc([*argv, "-p", str(port), "-t", "1"], port)
        self.rb = RemoteBackend(self.proc.endpoint, timeout=timeout)
        self.buf = self.rb.alloc_buffer(max_size)
        if self.buf is None:
            raise SystemExit(f"{name}: cannot allocate {max_size} bytes")

    def tensor(self, size: int):
        return self.buf.tensor(GGMLType.I8, (size,))

    def set_once(self, src: np.ndarray) -> float:
        t = self.tensor(src.nbytes)
        t0 = time.perf_counter()
        self.rb.set_tensor(t, src)
        self.rb.synchronize()
        return time.perf_counter() - t0

    def get_once(self, dst: np.ndarray) -> float:
        t = self.tensor(dst.nbytes)
        t0 = time.perf_counter()
        self.rb.get_tensor(t, out=dst)
        return time.perf_counter() - t0

    def latency_us(self, n: int, command: str) -> list[float]:
        """Round trips of one small command: GET_ALIGNMENT, or a 64-byte GET_TENSOR
        (decode-time traffic: a tensor to decode and check on every request)."""
        rb = self.rb
        if command == "get_alignment":
            call = lambda: rb.get_alignment(0)  # noqa: E731
        else:
            t, out = self.tensor(64), np.empty(64, np.uint8)
            call = lambda: rb.get_tensor(t, out=out)  # noqa: E731
        times = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            call()
            times.append((time.perf_counter_ns() - t0) / 1000)
        return times

    def close(self):
        self.rb.close()
        self.proc.stop()


class RawLoopback:
    """A TCP loopback pair: one thread sends with the native send loop, the caller
    receives with the native recv loop; the ceiling for any server on this host."""

    name = "raw"

    def __init__(self):
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        self.tx = socket.create_connection(ls.getsockname())
        self.rx, _ = ls.accept()
        ls.close()
        for s in (self.tx, self.rx):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def pump(self, src: np.ndarray, dst: np.ndarray) -> float:
        t = threading.Thread(target=sockio.send_all, args=(self.tx.fileno(), src, -1))
        t0 = time.perf_counter()
        t.start()
        sockio.recv_into(self.rx.fileno(), dst, -1)
        elapsed = time.perf_counter() - t0
        t.join()
        return elapsed

    def close(self):
        self.tx.close()
        self.rx.close()


def default_reps(size: int) -> int:
    """About 1 GiB per measurement series, at least 3 runs and at most 40."""
    return max(3, min(40, (1 << 30) // size))


def summarize(size: int, seconds: list[float]) -> dict:
    gbs = [size / s / 1e9 for s in seconds]
    return {"median_gbps": statistics.median(gbs), "best_gbps": max(gbs), "runs": len(gbs)}


def percentile(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,16,256,1024",
                    help="payload sizes in MiB, comma separated (empty: latency only)")
    ap.add_argument("--reps", type=int, default=0, help="runs per size and peer (0: by size)")
    ap.add_argument("--latency-n", type=int, default=4000, help="round trips per server")
    ap.add_argument("--peers", default="ours,reference",
                    help="servers to run: ours, reference, ours+metrics")
    ap.add_argument("--metrics", action="store_true",
                    help="also run ours with --metrics (peer ours+metrics) and report on/off ratios")
    ap.add_argument("--client-timeout", type=float, default=60.0,
                    help="RemoteBackend timeout in seconds (<= 0: none)")
    ap.add_argument("--json", metavar="PATH", help="also write the JSON document here")
    args = ap.parse_args(argv)

    sizes = [int(float(s) * MiB) for s in args.sizes.split(",") if s]
    fx = fixtures()
    if args.metrics and "ours+metrics" not in args.peers.split(","):
        args.peers += ",ours+metrics"
    argvs = server_argvs(fx, args.peers)
    timeout = args.client_timeout if args.client_timeout > 0 else None
    peers = [Peer(n, argvs[n], fx, max(sizes, default=MiB), timeout) for n in args.peers.split(",")]
    raw = RawLoopback()
    results: dict = {"sizes": {}, "latency_us": {}}
    try:
        src = np.empty(max(sizes, default=0), np.uint8)
        src[:] = np.arange(src.nbytes, dtype=np.uint64).astype(np.uint8)  # touch every page
        dst = np.zeros(src.nbytes, np.uint8)
        for size in sizes:
            reps = args.reps or default_reps(size)
            s, d = src[:size], dst[:size]
            times = {f"{p.name}_{op}": [] for p in peers for op in ("set", "get")}
            times["raw"] = []
            for i in range(reps):
                order = peers if i % 2 == 0 else peers[::-1]  # alternate who goes first
                for p in order:
                    times[f"{p.name}_set"].append(p.set_once(s))
                    times[f"{p.name}_get"].append(p.get_once(d))
                times["raw"].append(raw.pump(s, d))
            row = {k: summarize(size, v) for k, v in times.items()}
            results["sizes"][size // MiB] = row
            print(f"  {size // MiB:5d} MiB x {reps}: " + ", ".join(
                f"{k} {v['median_gbps']:.2f}" for k, v in row.items()), file=sys.stderr)
        # latency, alternating in chunks
        chunk = max(1, args.latency_n // 10)
        for command in LATENCY_COMMANDS:
            lat = {p.name: [] for p in peers}
            for p in peers:
                p.latency_us(200, command)  # warm up
            for i in range(10):
                for p in (peers if i % 2 == 0 else peers[::-1]):
                    lat[p.name] += p.latency_us(chunk, command)
            results["latency_us"][command] = {
                k: {"median": statistics.median(v), "p99": percentile(v, 0.99), "n": len(v)}
                for k, v in lat.items()}
    finally:
        for p in peers:
            p.close()
        raw.close()

    ratios = {}
    names = [p.name for p in peers]
    for size, row in results["sizes"].items():
        r = {}
        for op in ("set", "get"):
            if "ours" in names:
                r[f"{op}_ours_over_raw"] = row[f"ours_{op}"]["median_gbps"] / row["raw"]["median_gbps"]
            if {"ours", "reference"} <= set(names):
                r[f"{op}_ours_over_reference"] = (row[f"ours_{op}"]["median_gbps"]
                                                  / row[f"reference_{op}"]["median_gbps"])
            if {"ours", "ours+metrics"} <= set(names):
                r[f"{op}_metrics_on_over_off"] = (row[f"ours+metrics_{op}"]["median_gbps"]
                                                  / row[f"ours_{op}"]["median_gbps"])
        ratios[size] = r
    results["ratios"] = ratios
    for lat in results["latency_us"].values():
        if {"ours", "reference"} <= set(names):
            lat["ours_over_reference_median"] = lat["ours"]["median"] / lat["reference"]["median"]
        if {"ours", "ours+metrics"} <= set(names):
            lat["metrics_on_over_off_median"] = lat["ours+metrics"]["median"] / lat["ours"]["median"]

    print_table(results, names)
    emit_json(results, args.json)
    return 0


def print_table(results: dict, names: list[str]) -> None:
    cols = [f"{n} {op}" for op in ("set", "get") for n in names] + ["raw"]
    print(f"{'MiB':>6} | " + " | ".join(f"{c:>13}" for c in cols) + " | ratios (median GB/s)")
    for size, row in results["sizes"].items():
        cells = [row[f"{n}_{op}"]["median_gbps"] for op in ("set", "get") for n in names]
        cells.append(row["raw"]["median_gbps"])
        ratios = ", ".join(f"{k} {v:.2f}" for k, v in results["ratios"][size].items())
        print(f"{size:>6} | " + " | ".join(f"{c:>8.2f} GB/s" for c in cells) + f" | {ratios}")
    for command, lat in results["latency_us"].items():
        for name, v in lat.items():
            if isinstance(v, dict):
                print(f"round trip {command:>13} {name:>9}: median {v['median']:6.1f} us, "
                      f"p99 {v['p99']:7.1f} us (n={v['n']})")
            else:
                print(f"round trip {command:>13} {name}: {v:.2f}")


if __name__ == "__main__":
    sys.exit(main())
