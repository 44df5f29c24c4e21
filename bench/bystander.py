"""How long a well-behaved client waits while another client keeps the device busy.

    python bench/bystander.py                        # ours and the reference, -t 2, 10 s a phase
    python bench/bystander.py --seconds 5 --peers ours
    python bench/bystander.py --json out.json

A bystander keeps one 4 KiB buffer on the server and, in a loop, reads 64 bytes of it
(GET_TENSOR) and writes 256 (SET_TENSOR followed by a round trip), timing each
request. Three phases, each `--seconds` long:

- idle: nobody else on the server;
- busy: another client recomputes a chain of 512x512x512 F32 products without a
  pause (a graph of a few seconds, again and again);
- hang-up: that client starts its chain and drops the connection mid-run, once a
  second; the server must stop the orphaned graph (its cancel token).

The table gives the bystander's median, 99th percentile and worst latency in
milliseconds per phase. llama.cpp's server serves one connection at a time, so
under load its bystander waits for the other client to leave: requests that get
no answer within `--timeout` seconds are counted as timed out. Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))   # the tests package; ggmlrpc itself as installed

from servers import fixtures, server_argvs  # noqa: E402
from tests.conftest import Proc, free_port  # noqa: E402
from tests.e2e.test_cancel import long_chain as chain  # noqa: E402
from tests.ops.conftest import Ctx  # noqa: E402
from tests.protocol.rawclient import Bystander  # noqa: E402


def busy(endpoint: str, stop, hang_up: bool, count) -> None:
    """Keep the device computing: recompute a long chain (busy), or start it and hang up
    mid-run once a second (hang-up). Counts graphs started and errors met."""
    while not stop.is_set():
        c = None
        try:
            # buffers large enough that the chain fits the server's work limit
            # (--max-graph-work: units per byte of the buffers a graph uses)
            c = Ctx(endpoint, size=(1 << 30) if hang_up else (64 << 20))
            c.rb.graph_compute(chain(c, 1500 if not hang_up else 20000))
            count["graphs"] += 1
            if hang_up:
                stop.wait(1.0)
                continue
            c.rb.synchronize()
            while not stop.is_set():
                c.rb.graph_recompute(0)
                c.rb.synchronize()
                count["graphs"] += 1
        except Exception:   # the reference server may refuse or drop us; try again
            count["errors"] += 1
            stop.wait(0.2)
        finally:
            try:
                if c is not None:
                    c.close()
            except Exception:
                pass


def bystander(port: int, seconds: float, timeout: float) -> dict:
    lat, timed_out = [], 0
    b = Bystander(port)
    b.raw.sock.settimeout(timeout)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            t = time.perf_counter()
            try:
                b.raw.get_tensor(b.whole(), 0, 64)
                b.raw.set_tensor(b.whole(), b"\x01" * 256, offset=1024)
            except (socket.timeout, TimeoutError):
                timed_out += 1
                break     # the stream is out of step now; the rest of the phase is lost
            lat.append((time.perf_counter() - t) * 1e3)
    finally:
        b.close()
    lat.sort()
    return {"requests": len(lat), "timed_out": timed_out,
            "p50_ms": round(statistics.median(lat), 3) if lat else None,
            "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 3) if lat else None,
            "max_ms": round(lat[-1], 3) if lat else None}


def run_peer(argv: list[str], threads: int, seconds: float, timeout: float) -> dict:
    port = free_port()
    proc = Proc([*argv, "-p", str(port), "-t", str(threads)], port)
    out = {}
    try:
        for phase in ("idle", "busy", "hang-up"):
            # the load runs in a process of its own, so that building and sending its
            # graphs never holds the bystander's interpreter
            stop = mp.Event()
            load, count = None, mp.Manager().dict(graphs=0, errors=0)
            if phase != "idle":
                load = mp.Process(target=busy, args=(proc.endpoint, stop, phase == "hang-up", count),
                                  daemon=True)
                load.start()
                time.sleep(1.0)          # the load's graph is running
            try:
                out[phase] = bystander(port, seconds, timeout)
            except OSError as e:
                out[phase] = {"error": str(e)}
            stop.set()
            if load is not None:
                load.join(timeout + 30)
                out[phase]["load"] = dict(count)
    finally:
        proc.stop()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--peers", default="ours,reference")
    ap.add_argument("--json", help="also write the JSON here")
    args = ap.parse_args(argv)

    argvs = server_argvs(fixtures(), args.peers)
    res = {name: run_peer(argvs[name], args.threads, args.seconds, args.timeout)
           for name in args.peers.split(",")}

    print(f"bystander latency (GET 64 B + SET 256 B), -t {args.threads}, {args.seconds:g} s a phase (ms)")
    print(f"{'server':10} {'phase':8} {'requests':>8} {'p50':>8} {'p99':>8} {'max':>8}  timed out  load graphs")
    for name, phases in res.items():
        for phase, r in phases.items():
            if "error" in r:
                print(f"{name:10} {phase:8} error: {r['error']}")
                continue
            fmt = lambda v: f"{v:8.3f}" if v is not None else f"{'-':>8}"  # noqa: E731
            print(f"{name:10} {phase:8} {r['requests']:8d} {fmt(r['p50_ms'])} {fmt(r['p99_ms'])} "
                  f"{fmt(r['max_ms'])}  {r['timed_out']:9d}  {r.get('load', {}).get('graphs', '-')}")
    doc = json.dumps({"threads": args.threads, "seconds": args.seconds, "results": res}, indent=2)
    print(doc)
    if args.json:
        Path(args.json).write_text(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
