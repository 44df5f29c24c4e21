"""Our main host (`ggml-rpc-cli bench`) against llama.cpp's client (`llama-bench`).

Same generated model, same threads, alternating runs in one session:

- `rpc`:   every layer on one of our servers (a fresh server per run), our runner
           against `llama-bench -ngl 99 --rpc`;
- `rpc2`:  the same over two servers, `-ts 1,1`;
- `--rtt-ms 1 5`: the rpc modes again through netproxy.py, which delays each
           direction by half the round trip (a simulated network);
- `local`: in-process on the local CPU (`-ngl 0`) against `llama-bench -ngl 0
           --repack 0` (llama.cpp's repacked Q4_0/Q8_0 layouts are another kernel).

Prints JSON rows and a table of prompt (pp) and generation (tg) tokens/s: the
medians, the median of each round's ratio ours / llama.cpp with its smallest and
largest, and the ratio of the best runs. `--round-trips` first counts the commands
each client sends per generated token to each server (netproxy.py's counter).
Asserts nothing.

    python bench/runner.py --types Q8_0 --pp 64 --tg 32 --rounds 2
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("llama_bench", HERE / "llama_bench.py")
lb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lb)
_spec = importlib.util.spec_from_file_location("netproxy", HERE / "netproxy.py")
netproxy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(netproxy)


def ours(command: str, module: str) -> list[str]:
    exe = shutil.which(command)
    return [exe] if exe else [sys.executable, "-P", "-m", module]


def rows(out: str) -> dict:
    res = {}
    for row in json.loads(out):
        name = row.get("test") or ("pp" if row.get("n_prompt") else "tg")
        res[name[:2]] = row["avg_ts"]
    return res


def pinned(i: int) -> list[str]:
    """The command prefix that runs server i on core i (taskset), with the batch
    scheduling policy (chrt -b) where the host has it: on a host whose servers share
    the cores with the main host's process, a server woken by a request otherwise
    preempts that process on its core for a time slice (milliseconds) before it has
    sent the other servers theirs. Not a concern where each server has its own machine."""
    cmd = ["taskset", "-c", str(i % (os.cpu_count() or 1))]
    return (["chrt", "-b", "0"] if shutil.which("chrt") else []) + cmd


@contextlib.contextmanager
def our_servers(n: int, threads: int, rtt_ms: float = 0.0, count: bool = False, args: tuple = (),
                pin: bool = False):
    """`n` fresh servers of ours (with more options `args`), each behind a proxy when
    `rtt_ms` or `count` asks for one, server i on core i with `pin` (see `pinned`);
    yields (endpoints, proxies)."""
    procs, proxies, eps = [], [], []
    try:
        for i in range(n):
            port = lb.free_port()
            core = pinned(i) if pin else []
            srv = subprocess.Popen(core + ours("ggml-rpc-server", "ggmlrpc.cli.server")
                                   + ["-p", str(port), "-t", str(threads), *args],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(srv)
            lb.wait_listening(port, srv)
            if rtt_ms or count:
                proxies.append(netproxy.Proxy(f"127.0.0.1:{port}", rtt_ms, count=count))
                port = proxies[-1].start()
            eps.append(f"127.0.0.1:{port}")
        yield eps, proxies
    finally:
        for p in proxies:
            p.close()
        for srv in procs:
            srv.terminate()
            srv.wait(10)


def bench_cmd(ref: Path, who: str, m: Path, threads: int, pp: int, tg: int, reps: int,
              eps: list[str], extra: tuple = ()) -> list[str]:
    """One client's benchmark command: over `eps` (all layers offloaded, split evenly
    over two servers), or in-process when there are none."""
    if not eps:
        place = ["-ngl", "0"] if who == "ours" else ["-ngl", "0", "--repack", "0"]
    else:
        place = ["-ngl", "99", "--rpc", ",".join(eps)]
        if len(eps) == 2:
            place += ["-ts", "1,1" if who == "ours" else "1/1"]
    common = ["-m", str(m), "-t", str(threads), "-p", str(pp), "-n", str(tg), "-r", str(reps),
              "-o", "json", *place, *extra]
    if who == "ours":
        return ours("ggml-rpc-cli", "ggmlrpc.cli.main") + ["bench", *common]
    return [str(ref / "llama-bench"), *common]


def n_servers(mode: str) -> int:
    return {"rpc": 1, "rpc2": 2}.get(mode, 0)


def run_pair(ref: Path, m: Path, mode: str, rtt_ms: float, args) -> dict:
    """One run of each client; with `rpc`/`rpc2`, against one/two fresh servers of ours,
    reached through a proxy that adds `rtt_ms` of round trip when it is not 0."""
    out = {}
    for who in ("ours", "llama.cpp"):
        with our_servers(n_servers(mode), args.threads, rtt_ms) as (eps, _):
            cmd = bench_cmd(ref, who, m, args.threads, args.pp, args.tg, args.reps, eps)
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            out[who] = rows(r.stdout) if r.returncode == 0 else {"error": r.stderr.strip()[-300:]}
    return out


def round_trips(ref: Path, m: Path, mode: str, args, n1: int = 4, n2: int = 20) -> dict:
    """Commands per generated token on each server, for each client: runs of n1 and of
    n2 tokens (no warm-up, one repetition) through counting proxies; the difference
    over n2 - n1 leaves out the loading. `round_trips` counts the answered commands:
    each one is a wait of one network round trip."""
    out = {}
    for who in ("ours", "llama.cpp"):
        counts: dict = {}
        for n in (n1, n2):
            with our_servers(n_servers(mode), args.threads, count=True) as (eps, proxies):
                cmd = bench_cmd(ref, who, m, args.threads, 0, n, 1, eps, ("--no-warmup",))
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                if r.returncode:
                    counts = {"error": r.stderr.strip()[-300:]}
                    break
                counts[n] = [p.snapshot() for p in proxies]
        if "error" in counts:
            out[who] = counts
            continue
        per = []
        for a, b in zip(counts[n1], counts[n2]):
            d = {k: (b.get(k, 0) - a.get(k, 0)) / (n2 - n1) for k in set(a) | set(b)}
            d = {k: v for k, v in sorted(d.items()) if v}
            per.append({"round_trips": sum(v for k, v in d.items() if k in netproxy.ANSWERED.values()),
                        "commands": d})
        out[who] = per
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", nargs="+", default=["Q8_0"])
    ap.add_argument("--arch", default="llama", help="the generated model's architecture (ggmlrpc.llm.synth's)")
    ap.add_argument("--modes", nargs="+", default=["rpc", "local"], choices=["rpc", "rpc2", "local"])
    ap.add_argument("--rtt-ms", nargs="+", type=float, default=[0.0],
                    help="simulated round trips for the rpc modes (a proxy per server)")
    lb.add_run_args(ap)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--round-trips", action="store_true",
                    help="first count the commands per generated token on each server (rpc modes)")
    args = ap.parse_args(argv)
    ref = lb.reference_bin()
    shape = lb.model_shape(args)
    table = []
    for qtype in args.types:
        m = lb.model(ref, qtype, shape, args.arch)
        if args.round_trips:
            for mode in [mo for mo in args.modes if mo != "local"]:
                rt = round_trips(ref, m, mode, args)
                print(json.dumps({"type": qtype, "mode": mode, "per_token": rt}), flush=True)
                for who, per in rt.items():
                    if isinstance(per, list):
                        print(f"# {qtype} {mode} {who}: round trips per token per server "
                              f"{[p['round_trips'] for p in per]}", flush=True)
        for mode, rtt in [(mo, r) for mo in args.modes for r in (args.rtt_ms if mo != "local" else [0.0])]:
            runs = [run_pair(ref, m, mode, rtt, args) for _ in range(args.rounds)]
            row = {"arch": args.arch, "type": qtype, "mode": mode, "rtt_ms": rtt, "runs": runs}
            for k in ("pp", "tg"):
                pairs = [(r["ours"][k], r["llama.cpp"][k]) for r in runs
                         if k in r["ours"] and k in r["llama.cpp"]]
                if pairs:
                    o, t = [p[0] for p in pairs], [p[1] for p in pairs]
                    # each round's own ratio (both clients ran back to back), and the
                    # ratio of the best runs: on a shared host the load moves between
                    # rounds far more than within one
                    per_round = sorted(a / b for a, b in pairs)
                    row[k] = {"ours": statistics.median(o), "llama.cpp": statistics.median(t),
                              "ratio": statistics.median(per_round),
                              "ratio_min": per_round[0], "ratio_max": per_round[-1],
                              "ratio_best": max(o) / max(t), "rounds": len(pairs)}
            table.append(row)
            print(json.dumps(row), flush=True)
    print("\n| type | mode | rtt ms | test | ours t/s | llama.cpp t/s | ratio | rounds: min..max | best/best |\n"
          "|---|---|---:|---|---:|---:|---:|---:|---:|")
    for row in table:
        for k in ("pp", "tg"):
            if k in row:
                v = row[k]
                n = args.pp if k == "pp" else args.tg
                print(f"| {row['type']} | {row['mode']} | {row['rtt_ms']:g} | {k}{n} | {v['ours']:.1f} | "
                      f"{v['llama.cpp']:.1f} | {v['ratio']:.2f} | {v['rounds']}: {v['ratio_min']:.2f}.."
                      f"{v['ratio_max']:.2f} | {v['ratio_best']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
