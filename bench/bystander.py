"""How long a well-behaved client waits while another client keeps the device busy.

    python bench/bystander.py                        # ours and the reference, -t 2, 10 s a phase
    python bench/bystander.py --seconds 5 --peers ours
    python bench/bystander.py --json out.json

A bystander keeps one 4 KiB buffer on the server and, in a loop, reads 64 bytes of it
(GET_TENSOR) and writes 256 (SET_TENSOR followed by a round trip), timing each
request, then recomputes a small graph of its own (a 64 x 64 product, GRAPH_RECOMPUTE
and a round trip), timing that too. The phases, each `--seconds` long:

- idle: nobody else on the server;
- busy: another client recomputes a chain of 150 512x512x512 F32 products without
  a pause (a graph of about a second, again and again);
- hang-up: that client starts its chain and drops the connection mid-run, again
  and again; the server must stop the orphaned graph (its cancel token);
- iq-attack: that client sends 40 products of one IQ2_XS weight (about 1.3 MiB of
  tensors, half a minute of compute on kernels this slow) in a 1 GiB buffer it
  never touches otherwise, again and again (ours refuses it: the work estimate);
- prompt (with --prompt N, N > 0): the reference llama-bench runs an N-token prompt
  (-p N -n 0) of the bench model (bench/llama_bench.py's) through the server, again
  and again; its prompt speed alone (before the phase) and under the bystander are
  reported (growth: how much longer the prompt takes with the bystander).

The table gives the bystander's median, 99th percentile and worst latency in
milliseconds per phase, for the GET+SET pair and for the small graph. llama.cpp's server serves one connection at a time, so
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

from servers import emit_json, fixtures, server_argvs  # noqa: E402
from ggmlrpc.errors import GgmlRpcError  # noqa: E402
from tests.conftest import Proc, free_port  # noqa: E402
from tests.e2e.test_cancel import long_chain as chain  # noqa: E402
from tests.ops.conftest import Ctx  # noqa: E402
from tests.protocol.rawclient import Bystander  # noqa: E402


def iq_graph(c: Ctx) -> list:
    """40 products of one IQ2_XS weight by one activation, all into one output."""
    from ggmlrpc.client import op as make_op
    from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T
    w, x = c.new(T.IQ2_XS, (4096, 256)), c.new(T.F32, (4096, 64))
    nodes = [c.op(Op.MUL_MAT, T.F32, (256, 64), w, x)]
    for i in range(39):
        t = make_op(Op.MUL_MAT, T.F32, (256, 64), w, x, name=f"mm{i}")
        t.buffer, t.data = nodes[0].buffer, nodes[0].data
        nodes.append(t)
    return nodes


def prompt_speed(ref, model, port: int, n: int, threads: int) -> float | None:
    """Prompt tokens per second of one llama-bench -p n -n 0 run through the server."""
    import subprocess
    r = subprocess.run([str(ref / "llama-bench"), "-m", str(model), "-ngl", "99", "--rpc",
                        f"127.0.0.1:{port}", "-t", str(threads), "-p", str(n), "-n", "0",
                        "-r", "1", "-o", "json"], capture_output=True, text=True, timeout=1800)
    rows = json.loads(r.stdout) if r.returncode == 0 else []
    return rows[0]["avg_ts"] if rows else None


def prompt_load(ref, model, port: int, n: int, threads: int, stop, count) -> None:
    while not stop.is_set():
        ts = prompt_speed(ref, model, port, n, threads)
        if ts is None:
            count["errors"] += 1
        else:
            count["graphs"] += 1
            count["pp_ts"] = count.get("pp_ts", []) + [ts]


def busy(endpoint: str, stop, phase: str, count) -> None:
    """Keep the device computing: recompute a long chain (busy), start it and hang up
    mid-run once a second (hang-up), or send the IQ2_XS graph again and again
    (iq-attack; a refused graph drops the connection: connect again). Counts graphs
    started and errors met."""
    hang_up = phase == "hang-up"
    while not stop.is_set():
        c = None
        try:
            # 150 products over 4 MiB fit the server's work limit (--max-graph-work:
            # units per byte the nodes use); the IQ2_XS graph lies in 1 GiB it never uses
            c = Ctx(endpoint, size=(64 << 20) if phase != "iq-attack" else (1 << 30))
            if phase == "iq-attack":
                c.rb.graph_compute(iq_graph(c))
                c.rb.synchronize()
                count["graphs"] += 1
                continue
            c.rb.graph_compute(chain(c, 150))
            count["graphs"] += 1
            if hang_up:
                stop.wait(0.1)
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


def small_graph(endpoint: str) -> Ctx:
    """A client with a 64 x 64 product computed once (then recomputed)."""
    from ggmlrpc.ggml import GGMLOp as Op, GGMLType as T
    c = Ctx(endpoint, size=1 << 20)
    w, x = c.new(T.F32, (64, 64)), c.new(T.F32, (64, 64))
    c.op(Op.MUL_MAT, T.F32, (64, 64), w, x)
    c.compute()
    return c


def percentiles(lat: list[float]) -> dict:
    lat = sorted(lat)
    return {"requests": len(lat),
            "p50_ms": round(statistics.median(lat), 3) if lat else None,
            "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 3) if lat else None,
            "max_ms": round(lat[-1], 3) if lat else None}


def bystander(port: int, seconds: float, timeout: float, graphs: bool, pace: float = 0.0) -> dict:
    lat, glat, timed_out = [], [], 0
    b = Bystander(port)
    b.raw.sock.settimeout(timeout)
    g = None
    end = time.monotonic() + seconds
    try:
        if graphs:
            g = small_graph(f"127.0.0.1:{port}")
        while time.monotonic() < end:
            t = time.perf_counter()
            try:
                b.raw.get_tensor(b.whole(), 0, 64)
                b.raw.set_tensor(b.whole(), b"\x01" * 256, offset=1024)
                lat.append((time.perf_counter() - t) * 1e3)
                if g is not None:
                    t = time.perf_counter()
                    g.recompute()
                    glat.append((time.perf_counter() - t) * 1e3)
            except (socket.timeout, TimeoutError, ConnectionError, GgmlRpcError):
                timed_out += 1
                break     # the stream is out of step now; the rest of the phase is lost
            if pace:
                time.sleep(pace)
    finally:
        b.close()
        if g is not None:
            g.close()
    out = percentiles(lat) | {"timed_out": timed_out}
    if graphs:
        out["graph"] = percentiles(glat)
    return out


def run_peer(argv: list[str], args, prompt) -> dict:
    threads, seconds, timeout = args.threads, args.seconds, args.timeout
    port = free_port()
    proc = Proc([*argv, "-p", str(port), "-t", str(threads)], port)
    out = {}
    phases = [p for p in args.phases.split(",") if p != "prompt" or prompt]
    try:
        for phase in phases:
            # the load runs in a process of its own, so that building and sending its
            # graphs never holds the bystander's interpreter
            stop = mp.Event()
            load, count = None, mp.Manager().dict(graphs=0, errors=0)
            alone = None
            if phase == "prompt":
                # the best of two runs alone (the first one warms the server up)
                alone = max((prompt_speed(*prompt, port, args.prompt, threads) or 0) for _ in range(2))
                load = mp.Process(target=prompt_load, args=(*prompt, port, args.prompt, threads, stop, count),
                                  daemon=True)
            elif phase != "idle":
                load = mp.Process(target=busy, args=(proc.endpoint, stop, phase, count), daemon=True)
            if load is not None:
                load.start()
                time.sleep(1.0 if phase != "prompt" else 5.0)   # the load's graph is running
            try:
                out[phase] = bystander(port, seconds, timeout, graphs=not args.no_graph, pace=args.pace_ms / 1e3)
            except OSError as e:
                out[phase] = {"error": str(e)}
            stop.set()
            if load is not None:
                load.join(timeout + 30)
                out[phase]["load"] = dict(count)
            if alone and count.get("pp_ts"):
                under = statistics.median(count["pp_ts"])
                out[phase]["prompt"] = {"alone_ts": round(alone, 2), "with_bystander_ts": round(under, 2),
                                        "growth": round(alone / under - 1, 4)}
    finally:
        proc.stop()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--peers", default="ours,reference")
    ap.add_argument("--phases", default="idle,busy,hang-up,iq-attack,prompt")
    ap.add_argument("--prompt", type=int, default=2048,
                    help="tokens of the prompt phase's llama-bench run (0: no prompt phase)")
    ap.add_argument("--no-graph", action="store_true", help="GET+SET only, no small graph")
    ap.add_argument("--pace-ms", type=float, default=0.0,
                    help="pause between the bystander's rounds (default 0: back to back; on a 2-core host "
                         "its own process then takes a core's share from the long graph)")
    ap.add_argument("--json", help="also write the JSON here")
    args = ap.parse_args(argv)

    argvs = server_argvs(fixtures(), args.peers)
    prompt = None
    if args.prompt and "prompt" in args.phases:
        from llama_bench import model
        from ggmlrpc.llm.synth import LlamaShape
        ref = fixtures().reference_bin()
        prompt = (ref, model(ref, "Q8_0", LlamaShape(12, 1024, 2816, n_head=16, n_head_kv=16)))
    res = {name: run_peer(argvs[name], args, prompt) for name in args.peers.split(",")}

    print(f"bystander latency (GET 64 B + SET 256 B; graph: a 64x64 product), -t {args.threads}, "
          f"{args.seconds:g} s a phase (ms)")
    print(f"{'server':10} {'phase':9} {'requests':>8} {'p50':>8} {'p99':>8} {'max':>8}  timed out  load graphs"
          f"  graph p50  graph p99  prompt growth")
    for name, phases in res.items():
        for phase, r in phases.items():
            if "error" in r:
                print(f"{name:10} {phase:9} error: {r['error']}")
                continue
            fmt = lambda v: f"{v:8.3f}" if v is not None else f"{'-':>8}"  # noqa: E731
            gr = r.get("graph", {})
            growth = r.get("prompt", {}).get("growth")
            print(f"{name:10} {phase:9} {r['requests']:8d} {fmt(r['p50_ms'])} {fmt(r['p99_ms'])} "
                  f"{fmt(r['max_ms'])}  {r['timed_out']:9d}  {r.get('load', {}).get('graphs', '-'):>11} "
                  f"{fmt(gr.get('p50_ms'))}   {fmt(gr.get('p99_ms'))}  "
                  f"{f'{growth:+.1%}' if growth is not None else '-':>13}")
    emit_json({"threads": args.threads, "seconds": args.seconds, "results": res}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
