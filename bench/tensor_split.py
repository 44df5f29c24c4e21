"""Generation speed with -sm row (tensor parallelism) against -sm layer over the
same two servers, and against llama.cpp's client (llama-bench --rpc, layer split).

Two of our servers, each pinned to its own core (taskset) with -t 1, the generated
bench model (bench/llama_bench.py: 12 layers, width 1024). Our host runs in this
process (Model.load + one eval per token, after a warm-up). Each round starts two
fresh servers and runs on them, in alternating order, `layer`, `row` (the
"gather" combine, the default), `row-reduce` (partial sums) and llama-bench -ngl
99 -ts 1/1 (llama.cpp's client, layer split). `--rtt-ms 0.2 1` adds those round
trips with netproxy.py (a process per server, on the same two cores). Each run's
profile (from the servers' --metrics) says where a token's time went: each
server's compute, its exchanges with the other (row-peers), and the rest (host
work, the wire, waiting for the slower server). Prints JSON rows and a table: median tokens/s, and the median over the rounds of each round's
ratios row / layer and row / llama-bench (a shared host's load moves a round's
runs together). Asserts nothing.

    python bench/tensor_split.py --types Q8_0 --tg 32 --rounds 2 --rtt-ms 0 0.2 1
"""
from __future__ import annotations

import argparse
import contextlib
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


lb, runner = _load("llama_bench"), _load("runner")

from ggmlrpc.llm.model import Model  # noqa: E402

MODES = {"layer": dict(split_mode="layer"), "row": dict(split_mode="row", peers=False),
         "row-reduce": dict(split_mode="row", row_combine="reduce"),
         "row-peers": dict(split_mode="row")}


@contextlib.contextmanager
def pinned_servers(rtt_ms: float):
    """Two fresh servers of ours (with --peers), server i on core i with one thread
    (runner.pinned), each behind a delaying proxy when rtt_ms is set (their links to
    each other go through it too); yields their endpoints."""
    procs, proxies, eps = [], [], []
    try:
        for core in range(2):
            port, mport = lb.free_port(), lb.free_port()
            procs.append(subprocess.Popen([*runner.pinned(core),
                                           *runner.ours("ggml-rpc-server", "ggmlrpc.cli.server"),
                                           "-p", str(port), "-t", "1", "--peers", "--metrics", str(mport)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            lb.wait_listening(port, procs[-1])
            if rtt_ms:
                up, port = port, lb.free_port()
                proxies.append(subprocess.Popen([sys.executable, str(HERE / "netproxy.py"), "--listen", str(port),
                                                 "--upstream", f"127.0.0.1:{up}", "--rtt-ms", str(rtt_ms)],
                                                stdout=subprocess.DEVNULL))
                lb.wait_listening(port, proxies[-1])
            eps.append(f"127.0.0.1:{port}")
            METRICS[eps[-1]] = mport
        yield eps
    finally:
        for p in procs + proxies:
            p.terminate()
            p.wait(10)


HOST_CPU: dict[str, list] = {}    # mode -> our host's CPU ms per token, each run
METRICS: dict[str, int] = {}      # endpoint -> its server's metrics port
PROFILE: dict[str, list] = {}     # mode -> where a token's time went, each run (profile())


def server_seconds(ep: str) -> tuple[float, float]:
    """(seconds running graphs, of which in peer exchanges) of `ep`'s server so far."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS[ep]}/metrics", timeout=10) as r:
        fams = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    return (sum(s.value for s in fams["ggmlrpc_graph_seconds"].samples if s.name.endswith("_total")),
            sum(s.value for s in fams["ggmlrpc_peer_exchange_seconds"].samples if s.name.endswith("_total")))


def profile(eps: list[str], before: list, token_ms: float, tg: int, one_by_one: bool) -> dict:
    """Per token: each server's compute (graph time less exchanges), its exchanges
    (copies, sends and waits for the other), and the rest of the token (host work,
    the wire to and from the host, waiting for the slower server). `one_by_one`: the
    servers compute in turn (layer split), so the rest is what their sum leaves."""
    after = [server_seconds(ep) for ep in eps]
    per = [((g1 - g0 - (x1 - x0)) / tg * 1e3, (x1 - x0) / tg * 1e3) for (g0, x0), (g1, x1) in zip(before, after)]
    return {"token_ms": round(token_ms, 2), "compute_ms": [round(c, 2) for c, _ in per],
            "exchange_ms": [round(x, 2) for _, x in per],
            "host_and_wire_ms": round(token_ms - (sum if one_by_one else max)(c + x for c, x in per), 2)}


def ours(m: Path, mode: str, eps: list[str], tg: int) -> float:
    """Generation tokens/s of our host: tg evals of one token after a prompt of 8
    (and its CPU time per token into HOST_CPU)."""
    with Model.load(m, rpc=eps, tensor_split=[1, 1], n_ctx=256, **MODES[mode]) as model:
        if mode == "row-peers" and not model.rows.linked:
            raise RuntimeError("the servers did not link")
        model.eval(list(range(1, 9)))
        model.eval([1])                     # warm-up: the decode graphs built and sent once
        before = [server_seconds(ep) for ep in eps]
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(tg):
            model.eval([2 + i % 100])
        t = time.perf_counter() - t0
        HOST_CPU.setdefault(mode, []).append((time.process_time() - c0) / tg * 1e3)
        PROFILE.setdefault(mode, []).append(profile(eps, before, t / tg * 1e3, tg, mode == "layer"))
        return tg / t


def llama_bench(ref: Path, m: Path, eps: list[str], test: list[str], key: str, timeout: float) -> float | str:
    """llama-bench's `key` ("pp"/"tg") tokens/s over `eps` (-ngl 99 -ts 1/1) for the
    `test` options, or its error's tail."""
    cmd = [str(ref / "llama-bench"), "-m", str(m), *test, "-r", "2", "-o", "json",
           "-ngl", "99", "--rpc", ",".join(eps), "-ts", "1/1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        return r.stderr.strip()[-300:]
    return runner.rows(r.stdout)[key]


def alternate(names: list[str], rounds: int, rtt: float, run) -> dict[str, list]:
    """`run(name, endpoints)` for each name in every round, on two fresh pinned servers
    per round, the order reversed every other round: each name's results."""
    runs: dict[str, list] = {k: [] for k in names}
    for i in range(rounds):
        with pinned_servers(rtt) as eps:
            for name in names if i % 2 == 0 else names[::-1]:
                runs[name].append(run(name, eps))
    return runs


def summarize(row: dict, runs: dict[str, list], pairs) -> dict:
    """Into `row`: each name's median (and an error, if a run failed) and, for each
    (name, base) of `pairs`, the median of each round's ratio."""
    for name, vals in runs.items():
        ok = [v for v in vals if isinstance(v, float)]
        row[name] = statistics.median(ok) if ok else None
        if any(isinstance(v, str) for v in vals):
            row[name + "_error"] = next(v for v in vals if isinstance(v, str))
    for name, base in pairs:
        ratios = [a / b for a, b in zip(runs.get(name, []), runs.get(base, [])) if isinstance(a, float) and isinstance(b, float)]
        if ratios:
            row[f"{name}/{base}"] = round(statistics.median(ratios), 3)
    return row


def cases(args):
    """(reference bin, shape, type, model file, round trip) of each case of `args`:
    the generated bench model (12 layers, width 1024; --arch: a synth model name,
    llama-moe for Mixtral-style experts) in each type, each --rtt-ms."""
    ref = lb.reference_bin()
    shape = lb.model_shape(SimpleNamespace(layers=12, embd=1024, ff=2816))
    for qtype in args.types:
        m = lb.model(ref, qtype, shape, args.arch)
        for rtt in args.rtt_ms:
            yield ref, shape, qtype, m, rtt


def table(results: list[dict], columns: list[tuple[str, str]], what: str, json_path: str | None) -> None:
    """Print a row per result: type, round trip, then each (key, header) column;
    write the results as JSON to `json_path` if given."""
    heads = "".join(f" {h:>{max(8, len(h))}}" for _, h in columns)
    print(f"\n{'type':6} {'rtt ms':>6}{heads}  ({what}; ratios: medians of each round's)")
    for r in results:
        cells = "".join(f" {r[k]:{max(8, len(h))}.2f}" if r.get(k) else " " * max(8, len(h)) + "-"
                        for k, h in columns)
        print(f"{r['type']:6} {r['rtt_ms']:6.1f}{cells}")
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=1))


def add_round_args(ap: argparse.ArgumentParser, timeout: float = 600) -> None:
    """The options of a bench that runs rounds on two pinned servers against llama-bench."""
    ap.add_argument("--types", nargs="+", default=["Q8_0"])
    ap.add_argument("--arch", default="llama", help="the generated model: llama, or llama-moe (routed experts)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rtt-ms", nargs="+", type=float, default=[0.0])
    ap.add_argument("--no-reference", action="store_true", help="skip llama-bench")
    ap.add_argument("--timeout", type=float, default=timeout)
    ap.add_argument("--json", help="also write the results here")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tg", type=int, default=32)
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES),
                    help="which of our modes to run (default: all)")
    add_round_args(ap)
    args = ap.parse_args(argv)
    results = []
    for ref, shape, qtype, m, rtt in cases(args):
        def run(name, eps):
            if name != "llama-bench":
                return ours(m, name, eps, args.tg)
            return None if args.no_reference else llama_bench(ref, m, eps, ["-p", "0", "-n", str(args.tg)],
                                                               "tg", args.timeout)
        runs = alternate([*args.modes, "llama-bench"], args.rounds, rtt, run)
        row = {"type": qtype, "rtt_ms": rtt, "tg": args.tg, "rounds": args.rounds, "runs": runs,
               # host round trips per token to each server: one graph per layer split stage;
               # three combines per layer + the output layer; two + one
               "round_trips_per_token": {"layer": 1, "row": 3 * shape.n_layer + 1,
                                         "row-reduce": 2 * shape.n_layer + 1, "row-peers": 1},
               "host_cpu_ms_per_token": {k: round(statistics.median(v), 2) for k, v in HOST_CPU.items()},
               "profile": dict(PROFILE)}
        HOST_CPU.clear()
        PROFILE.clear()
        summarize(row, runs, [(a, b) for a in ("row", "row-reduce", "row-peers") for b in ("layer", "llama-bench")])
        results.append(row)
        print(json.dumps(row), flush=True)
    table(results, [("layer", "layer"), ("row", "row"), ("row-reduce", "reduce"), ("row-peers", "peers"),
                    ("llama-bench", "llama"), ("row/layer", "row/layer"), ("row-reduce/layer", "reduce/layer"),
                    ("row-peers/layer", "peers/layer"), ("row-peers/llama-bench", "peers/llama")],
          "generation tokens/s", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
