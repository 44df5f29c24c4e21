"""Requests at once: `ggml-rpc-cli serve -np N` against `llama-server --rpc -np N`,
both over the same two servers of ours, same generated model (llama_bench.py's,
quantized by llama-quantize), in the same run:

- both servers run at once over the same RPC servers and are measured in turns,
  --rounds of each (medians), so that a shared host's drifting load hits both;
- one request alone (generation tokens/s), then N concurrent greedy requests of
  --gen tokens each (random prompts of --prompt tokens): the aggregate tokens/s
  (every request's tokens over the wall time from sending to the last one done),
  its ratio to one request alone (each round's pair, median), the same for the
  decode alone (tokens after each request's first, from the first first token on:
  without the prompts, which dominate short runs on a CPU), and the p50/p99/max
  time per token (the gaps between a request's streamed chunks: the longest is
  the worst stall, e.g. while the others' long prompts run, --prompt 700), and
  the N requests' times to first token (their mean and the last, from the first
  request sent);
- the prefix cache: a request with a --prefix-token prompt, then one that shares
  that prefix (a different ending): the times to first token and their ratio.

Prints JSON rows and a table; asserts nothing.

    python bench/batch.py                         # Q8_0 and Q4_K_M, -np 4 and 16
    python bench/batch.py --types Q8_0 --np 4 --gen 64
    python bench/batch.py --threads 1 --pin       # speedup figures: server i on core i

With --pin each RPC server runs on its own core (taskset) with the batch
scheduling policy (runner.pinned); the HTTP servers and this client share the cores.
"""
from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import signal
import subprocess
import sys
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("serve_bench", HERE / "serve.py")
sb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sb)
runner, lb = sb.runner, sb.lb


def start(who: str, ref: Path, m: Path, eps: list[str], np_: int, args):
    port = lb.free_port()
    common = ["-m", str(m), "--rpc", ",".join(eps), "-ngl", "99", "-c", str(args.ctx),
              "--port", str(port), "-t", str(args.threads), "-np", str(np_)]
    if who == "ours":
        argv = [sys.executable, "-P", "-m", "ggmlrpc.cli.main", "serve", *common, "-ts", args.ts,
                *args.ours_args.split()]
    else:
        argv = [str(ref / "llama-server"), *common, "-ts", args.ts.replace(",", "/"), "--no-repack"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    sb.wait_ready(url, proc)
    return proc, url


def request(url: str, prompt: list[int], n_gen: int) -> dict:
    """A streamed greedy completion: when it was sent, each text chunk's time, when
    the last chunk came and how many tokens it generated (the final chunk's usage).
    A token that ends inside a character sends no chunk of its own (both servers hold
    its bytes for the next), so a request has fewer chunks than tokens, by a tenth or
    a quarter on the bench model: tokens/s is counted in tokens, never in chunks.
    Read with http.client: on a 2-core host every request's client shares the cores
    with the servers, and httpx's line iteration took five times the CPU per token."""
    u = urllib.parse.urlsplit(url)
    body = json.dumps({"prompt": prompt, "max_tokens": n_gen, "temperature": 0, "ignore_eos": True,
                       "stream": True})
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=900)
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"{url}: {r.status} {r.read().decode(errors='replace')}")
        times, t_end, n = [], None, None
        for line in r:
            if line.startswith(b"data: {"):
                d = json.loads(line[6:])
                if d["choices"] and d["choices"][0].get("finish_reason") is None:
                    times.append(time.perf_counter())
                else:
                    t_end = time.perf_counter()
                if d.get("usage"):
                    n = d["usage"]["completion_tokens"]
    finally:
        conn.close()
    if n is None or t_end is None:
        raise RuntimeError(f"{url}: the stream ended without its final chunk and usage")
    return {"t0": t0, "times": times, "t_end": t_end, "n": n}


def concurrent(url: str, prompts: list[list[int]], n_gen: int) -> dict:
    with ThreadPoolExecutor(len(prompts)) as pool:
        rs = list(pool.map(lambda p: request(url, p, n_gen), prompts))
    t0 = min(r["t0"] for r in rs)
    t1 = max(r["t_end"] for r in rs)
    n = sum(r["n"] for r in rs)
    gaps = np.concatenate([np.diff(r["times"]) for r in rs]) * 1e3
    # the decode alone: tokens after each request's first, from the first first token on
    t_first = min(r["times"][0] for r in rs)
    ttft = [(r["times"][0] - t0) * 1e3 for r in rs]     # from the first request sent
    return {"tps": n / (t1 - t0), "gen_tps": (n - len(rs)) / (t1 - t_first), "n": n,
            "ttft_ms": float(np.mean(ttft)), "ttft_last_ms": float(max(ttft)),
            "p50_ms": float(np.percentile(gaps, 50)), "p99_ms": float(np.percentile(gaps, 99)),
            "max_ms": float(gaps.max())}


def prefix(url: str, rng, args) -> dict:
    """Time to first token of a long prompt, then of one sharing its prefix."""
    head = [int(t) for t in rng.integers(3, 500, args.prefix)]
    a = request(url, head + [int(t) for t in rng.integers(3, 500, 8)], 4)
    b = request(url, head + [int(t) for t in rng.integers(3, 500, 8)], 4)
    ta, tb = (a["times"][0] - a["t0"]) * 1e3, (b["times"][0] - b["t0"]) * 1e3
    return {"ttft_first_ms": ta, "ttft_shared_ms": tb, "ttft_ratio": ta / tb}


def bench(ref: Path, qtype: str, np_: int, args) -> dict:
    """Both servers up at once over the same RPC servers, measured in turns
    (--rounds of each): on a shared host the load drifts, so each figure is the
    median of its rounds and both see the same drift."""
    shape = lb.LlamaShape(args.layers, args.embd, args.ff, n_head=args.embd // 64, n_head_kv=args.embd // 64,
                          n_ctx=args.ctx)
    m = lb.model(ref, qtype, shape)
    row = {"type": qtype, "np": np_, "prompt": args.prompt, "gen": args.gen, "rounds": args.rounds}
    who_all = ("ours", "llama-server")
    runs: dict = {(w, k): [] for w in who_all for k in ("one", "many")}
    with runner.our_servers(2, args.threads, args=tuple(args.server_args.split()), pin=args.pin) as (eps, _):
        procs, urls = [], {}
        try:
            for who in who_all:
                proc, urls[who] = start(who, ref, m, eps, np_, args)
                procs.append(proc)
                rng = np.random.default_rng(0)
                request(urls[who], [int(t) for t in rng.integers(3, 500, 8)], 4)     # warm-up
            for r in range(args.rounds):
                for who in who_all:
                    rng = np.random.default_rng(np_ * 1000 + r)
                    runs[who, "one"].append(concurrent(urls[who], [[int(t) for t in rng.integers(3, 500, args.prompt)]],
                                                       args.gen))
                    runs[who, "many"].append(concurrent(urls[who], [[int(t) for t in rng.integers(3, 500, args.prompt)]
                                                                    for _ in range(np_)], args.gen))
                    time.sleep(args.pause)
            for who in who_all:
                one = float(np.median([x["tps"] for x in runs[who, "one"]]))
                many = {k: float(np.median([x[k] for x in runs[who, "many"]]))
                        for k in ("tps", "gen_tps", "p50_ms", "p99_ms", "max_ms", "ttft_ms", "ttft_last_ms")}
                row[f"{who}_alone_tps"] = one
                row[f"{who}_alone_gen_tps"] = float(np.median([x["gen_tps"] for x in runs[who, "one"]]))
                row[f"{who}_gen_tps"] = many["gen_tps"]
                # the ratios to one alone pair each round's two runs (back to back, the same
                # drift), then take the median: a ratio of two medians mixes rounds
                pairs = list(zip(runs[who, "one"], runs[who, "many"]))
                row[f"{who}_gen_batch_ratio"] = float(np.median([m["gen_tps"] / o["gen_tps"] for o, m in pairs]))
                row[f"{who}_tps"] = many["tps"]
                row[f"{who}_p50_ms"], row[f"{who}_p99_ms"] = many["p50_ms"], many["p99_ms"]
                row[f"{who}_max_ms"] = many["max_ms"]
                row[f"{who}_ttft_ms"], row[f"{who}_ttft_last_ms"] = many["ttft_ms"], many["ttft_last_ms"]
                row[f"{who}_batch_ratios"] = [m["tps"] / o["tps"] for o, m in pairs]     # each round's
                row[f"{who}_batch_ratio"] = float(np.median(row[f"{who}_batch_ratios"]))
                if np_ == min(args.np) and args.prefix:
                    for k, v in prefix(urls[who], np.random.default_rng(np_), args).items():
                        row[f"{who}_{k}"] = v
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    row["tps_ratio"] = row["ours_tps"] / row["llama-server_tps"]
    row["gen_tps_ratio"] = row["ours_gen_tps"] / row["llama-server_gen_tps"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", nargs="+", default=["Q8_0", "Q4_K_M"])
    ap.add_argument("--np", nargs="+", type=int, default=[4, 16], help="slots = concurrent requests")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens of each request")
    ap.add_argument("--gen", type=int, default=128, help="tokens generated per request")
    ap.add_argument("--prefix", type=int, default=1000, help="shared prefix tokens (0: skip)")
    ap.add_argument("--ctx", type=int, default=4096, help="context of all slots (each: ctx / np)")
    ap.add_argument("--threads", type=int, default=2, help="threads of each RPC server and client")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=1024)
    ap.add_argument("--ff", type=int, default=2816)
    ap.add_argument("--pause", type=float, default=0.5, help="seconds of quiet between measurements")
    ap.add_argument("--rounds", type=int, default=3, help="turns of each server (figures: medians)")
    ap.add_argument("--ts", default="5,6",
                    help="-ts of both (llama.cpp's placement counts the output layer as a layer: 5,6 puts six "
                         "of the 12 layers on each server, the output layer on the second)")
    ap.add_argument("--ours-args", default="", help="more options of our serve, e.g. --no-pipeline")
    ap.add_argument("--pin", action="store_true", help="server i on core i (taskset), for speedup figures")
    ap.add_argument("--server-args", default="", help="more options of the RPC servers, e.g. --peers")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    ref = lb.reference_bin()
    rows = [bench(ref, q, n, args) for q in args.types for n in args.np]
    print(json.dumps(rows, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    print("\n| type | np | agg t/s ours / llama-server | ratio | ours vs alone | llama-server vs alone "
          "| decode t/s ours / ls (ratio) | decode vs alone ours / ls "
          "| p50 ms ours / ls | p99 ms ours / ls | max ms ours / ls | TTFT mean/last ms ours / ls "
          "| prefix TTFT first/shared ours (ratio) | llama-server (ratio) |")
    print("| --- | --: | --- | --: | --: | --: | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        pre = ("", "")
        if "ours_ttft_ratio" in r:
            pre = tuple(f"{r[w + '_ttft_first_ms']:.0f}/{r[w + '_ttft_shared_ms']:.0f} ({r[w + '_ttft_ratio']:.1f}x)"
                        for w in ("ours", "llama-server"))
        print(f"| {r['type']} | {r['np']} | {r['ours_tps']:.2f} / {r['llama-server_tps']:.2f} | {r['tps_ratio']:.2f} "
              f"| {r['ours_batch_ratio']:.2f}x | {r['llama-server_batch_ratio']:.2f}x "
              f"| {r['ours_gen_tps']:.1f} / {r['llama-server_gen_tps']:.1f} ({r['gen_tps_ratio']:.2f}) "
              f"| {r['ours_gen_batch_ratio']:.2f}x / {r['llama-server_gen_batch_ratio']:.2f}x "
              f"| {r['ours_p50_ms']:.1f} / {r['llama-server_p50_ms']:.1f} "
              f"| {r['ours_p99_ms']:.1f} / {r['llama-server_p99_ms']:.1f} "
              f"| {r['ours_max_ms']:.0f} / {r['llama-server_max_ms']:.0f} "
              f"| {r['ours_ttft_ms']:.0f}/{r['ours_ttft_last_ms']:.0f} / "
              f"{r['llama-server_ttft_ms']:.0f}/{r['llama-server_ttft_last_ms']:.0f} | {pre[0]} | {pre[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
