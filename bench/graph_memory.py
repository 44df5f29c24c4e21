"""What a graph costs the server: memory held for a stored hostile graph, the server's
time per real graph, and a bystander's wait while huge graphs come and go.

Run it once per source tree to compare two (``PYTHONPATH=<tree> python -P bench/graph_memory.py``);
each run prints JSON rows and a short table:

- `stored`: RSS of a server process (ours, a fresh one per case) before and after a
  client that holds one 64 KiB buffer stores a graph: `unused` 524,285 tensors without
  a buffer (the most a graph may carry), `nodes` 262,144 runnable ADD nodes; with the
  bytes the server's ledger counts for that client (`counted`, 0 when the tree has no
  ledger entry for graphs).
  The same graphs against the reference ggml-rpc-server when it is built.
- `per_graph`: the server's time per GRAPH_COMPUTE (decode, validation, plan, run) of a
  generated llama model's prompt and generation graphs, medians (in process).
- `bystander`: p50/p99/max of a 64-byte GET_TENSOR round trip of a client while 0, 1
  or 3 idle clients hold a stored maximal `unused` graph and one more keeps sending
  small graphs (in process).

Asserts nothing.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))   # this tree's tests (an installed ggmlrpc first)

from tests.protocol.rawclient import GET_TENSOR, HELLO_ANSWER, Raw, tensor  # noqa: E402

# the attacker of this tree's tests, whichever tree is measured
_spec = importlib.util.spec_from_file_location(
    "hostile_graph_memory", REPO / "tests" / "protocol" / "test_hostile_graph_memory.py")
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
Attacker = _mod.Attacker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reference_server() -> str | None:
    """The reference build's ggml-rpc-server, or None when it is not built."""
    try:
        out = subprocess.run(["bash", str(REPO / "scripts" / "build-reference.sh"), "--where"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    exe = Path(out.splitlines()[-1]) / "ggml-rpc-server" if out else None
    return str(exe) if exe is not None and exe.exists() else None


def stored(n_nodes: int, n_fillers: int, reference: str | None = None) -> dict:
    port = free_port()
    argv = ([reference, "-p", str(port), "-t", "1"] if reference else
            [sys.executable, "-P", "-m", "ggmlrpc.cli.server", "-p", str(port), "-t", "1"])
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                a = Attacker(port)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        msg = a.graph(n_nodes, n_fillers)
        before = rss_of(proc.pid)
        t0 = time.perf_counter()
        a.raw.send(msg)
        a.raw.expect_no_response()
        took = time.perf_counter() - t0
        after = rss_of(proc.pid)
        a.raw.close()
        return {"case": "stored", "graph": "nodes" if n_nodes > 1 else "unused",
                "server": "reference" if reference else "ours", "n_nodes": n_nodes,
                "n_tensors": n_nodes + n_fillers + 2, "rss_before": before, "rss_after": after,
                "grown_mib": round((after - before) / 2**20, 1), "seconds": round(took, 2)}
    finally:
        proc.terminate()
        proc.wait(10)


def counted(n_nodes: int, n_fillers: int) -> int:
    """What the ledger counts for the attacker while its graph is stored (in process)."""
    from tests.conftest import start_server
    srv = start_server("native")
    try:
        a = Attacker(srv.port)
        a.raw.send(a.graph(n_nodes, n_fillers))
        a.raw.expect_no_response()
        held = max(h[0] for h in srv.memory()["held"])
        a.raw.close()
        return held
    finally:
        srv.close()


def per_graph(layers: int, embd: int, n_tokens: int, rounds: int) -> list[dict]:
    from ggmlrpc.llm import synth
    from ggmlrpc.llm.model import Model
    from ggmlrpc import session as sess
    from ggmlrpc.protocol import Cmd
    from tests.conftest import start_server

    times = {"pp": [], "tg": []}
    orig = sess._HANDLER_LIST[Cmd.GRAPH_COMPUTE]
    kind = ["pp"]

    def timed(self, size):
        t0 = time.perf_counter_ns()
        orig(self, size)
        times[kind[0]].append(time.perf_counter_ns() - t0)

    sess._HANDLER_LIST[Cmd.GRAPH_COMPUTE] = timed
    srv = start_server("native")
    try:
        with tempfile.TemporaryDirectory() as d:
            path = synth.write_llama(Path(d) / "m.gguf", synth.LlamaShape(
                n_layer=layers, n_embd=embd, n_ff=2 * embd, n_head=8, n_head_kv=4, n_ctx=512))
            with Model.load(path, rpc=f"127.0.0.1:{srv.port}") as m:
                gen = m.generate("the old fisherman " * (n_tokens // 3), 1, temp=0)
                next(gen)
                kind[0] = "tg"
                for _ in range(rounds):
                    gen = m.generate("the", 24, temp=0)
                    kind[0] = "pp"
                    next(gen)
                    kind[0] = "tg"
                    for _ in gen:
                        pass
    finally:
        sess._HANDLER_LIST[Cmd.GRAPH_COMPUTE] = orig
        srv.close()
    return [{"case": "per_graph", "graph": k, "n": len(v), "median_ms": round(statistics.median(v) / 1e6, 3)}
            for k, v in times.items() if v]


def bystander(stored: int, seconds: float) -> dict:
    """A bystander's 64-byte GET_TENSOR while `stored` idle clients each hold a stored
    graph of the most unused tensors a graph may carry, and one more client keeps
    sending small graphs (the allocations that set the cyclic collector going)."""
    from tests.conftest import start_server
    srv = start_server("native")
    stop = threading.Event()
    try:
        b = Raw(srv.port)
        assert b.hello() == HELLO_ANSWER
        h, base = b.alloc(4096)
        t = tensor(id=1, buffer=h, data=base, ne=(1024,))
        idle = [Attacker(srv.port) for _ in range(stored)]
        for a in idle:
            a.raw.send(a.graph(1, (1 << 19) - 3))
            a.raw.expect_no_response()
        churn = Attacker(srv.port)

        def loop():
            m = churn.graph(64, 4096)
            while not stop.is_set():
                churn.raw.send(m)
                churn.raw.expect_no_response()

        th = threading.Thread(target=loop, daemon=True)
        th.start()
        waits = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            b.call(GET_TENSOR, t + struct.pack("<QQ", 0, 64), 64)
            waits.append(time.perf_counter() - t0)
            time.sleep(0.002)
        stop.set()
        th.join(30)
        q = np.percentile(np.array(waits) * 1e3, [50, 99])
        return {"case": "bystander", "graph": f"{stored} stored", "n": len(waits),
                "p50_ms": round(q[0], 2), "p99_ms": round(q[1], 2), "max_ms": round(max(waits) * 1e3, 2)}
    finally:
        stop.set()
        srv.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=12, help="generations timed in per_graph")
    ap.add_argument("--skip", nargs="*", default=[], choices=["stored", "per_graph", "bystander"])
    a = ap.parse_args()
    if "PYTHONPATH" not in os.environ:
        sys.exit("set PYTHONPATH to the source tree to measure (its server runs as python -P -m)")
    rows = []
    if "stored" not in a.skip:
        ref = reference_server()
        for n_nodes, n_fillers in ((1, (1 << 19) - 3), (1 << 18, 0)):
            row = stored(n_nodes, n_fillers)
            row["counted_mib"] = round(counted(n_nodes, n_fillers) / 2**20, 1)
            rows.append(row)
            if ref:
                rows.append(stored(n_nodes, n_fillers, ref))
    if "per_graph" not in a.skip:
        rows += per_graph(a.layers, a.embd, a.tokens, a.rounds)
    if "bystander" not in a.skip:
        rows += [bystander(k, a.seconds) for k in (0, 1, 3)]
    for r in rows:
        print(json.dumps(r))
    print(f"\n{'case':10} {'graph':8} figures")
    for r in rows:
        rest = {k: v for k, v in r.items() if k not in ("case", "graph")}
        print(f"{r['case']:10} {r.get('graph', ''):8} " + ", ".join(f"{k} {v}" for k, v in rest.items()))


if __name__ == "__main__":
    main()
