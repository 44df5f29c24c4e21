"""`ggml-rpc-cli serve` against `llama-server --rpc`, both over the same two servers of
ours, same generated model (llama_bench.py's, quantized by llama-quantize), one
request at a time, alternating between the two HTTP servers:

- time to first token of a streamed /v1/completions with an N-token prompt (token
  ids drawn at random for each round, so neither side has it cached);
- generation tokens/s as the client sees them (the chunks after the first);
- our HTTP and Python overhead per streamed token: the CPU time our server process
  (all its threads) spends per request, less what the bare model API
  (`Model.stream`, same prompt length, same sampler, in this process over the same
  servers) spends on the same work, per generated token; and, noisier on a busy
  host, our client-side time per token less the bare API's.

Prints JSON rows and a table; asserts nothing. `--profile` runs our server under
cProfile and prints its event-loop thread's top functions (the HTTP side; the
model's worker thread is not in it).

    python bench/serve.py                               # Q8_0 and Q4_K_M, pp512, tg64, 3 rounds
    python bench/serve.py --types Q8_0 --rounds 2 --prompt 128 --gen 32
    python bench/serve.py --before ../old-checkout   # also that tree's serve: before/after in one run
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("runner", HERE / "runner.py")
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)
lb = runner.lb

from ggmlrpc.llm.model import Model  # noqa: E402
from ggmlrpc.llm.sampling import Sampler  # noqa: E402
from ggmlrpc.llm.synth import LlamaShape  # noqa: E402


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready")


def start(who: str, ref: Path, m: Path, eps: list[str], args, profile: str | None = None):
    port = lb.free_port()
    common = ["-m", str(m), "--rpc", ",".join(eps), "-ngl", "99", "-c", str(args.ctx), "--port", str(port),
              "-t", str(args.threads)]
    env = None
    if who == "before":     # another source tree's serve (its compiled modules in place)
        env = dict(os.environ, PYTHONPATH=str(Path(args.before).resolve()))
    if who != "llama-server":
        pre = [sys.executable, "-P"] + (["-m", "cProfile", "-o", profile] if profile else [])
        argv = pre + ["-m", "ggmlrpc.cli.main", "serve", *common, "-ts", "1,1"]
    else:
        argv = [str(ref / "llama-server"), *common, "-ts", "1/1", "-np", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc)
    return proc, url


def cpu_ns(pid: int | None) -> tuple[int, int]:
    """CPU time of every thread of process `pid` (this process when None), and of its
    main thread (our server's event loop, where the HTTP side runs), in ns."""
    if pid is None:
        return time.process_time_ns(), 0
    total = main = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                ns = int(f.read().split()[0])
        except OSError:
            continue
        total += ns
        main += ns if int(t) == pid else 0
    return total, main


def one_request(url: str, prompt: list[int], n_gen: int, pid: int | None = None) -> dict:
    """A streamed completion: time to the first chunk, client-side tokens/s after it,
    and the server's CPU time per generated token when `pid` is given."""
    c0 = cpu_ns(pid) if pid else (0, 0)
    body = {"prompt": prompt, "max_tokens": n_gen, "temperature": 0, "ignore_eos": True, "stream": True}
    times, usage, timings, t_end = [], None, None, None
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: {r.status_code} {r.read().decode(errors='replace')}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d["choices"] and d["choices"][0].get("finish_reason") is None:
                times.append(time.perf_counter())
            else:
                t_end = time.perf_counter()
            usage = d.get("usage") or usage
            timings = d.get("timings") or timings
    # tokens, not chunks: a token that ends inside a character sends no chunk of its own
    n = usage["completion_tokens"]
    gen_s = t_end - times[0] if n > 1 else float("nan")
    out = {"ttft_ms": (times[0] - t0) * 1e3, "gen_tps": (n - 1) / gen_s, "n": n,
           "server_gen_tps": timings["predicted_per_second"] if timings else None}
    if pid:
        c1 = cpu_ns(pid)
        out["cpu_us_per_token"] = (c1[0] - c0[0]) / n / 1e3
        out["loop_cpu_us_per_token"] = (c1[1] - c0[1]) / n / 1e3
    return out


def bare_request(model: Model, prompt: list[int], n_gen: int) -> dict:
    """The bare model API (no HTTP) from an empty context, as each request of the
    benchmark starts: tokens/s after the first token, CPU time of this process per
    generated token."""
    times = []
    c0 = cpu_ns(None)[0]
    for _t, _ in model.stream(prompt, n_gen, Sampler(0.0, banned=model.tokenizer.eog)):
        times.append(time.perf_counter())
    return {"gen_tps": (len(times) - 1) / (times[-1] - times[0]),
            "cpu_us_per_token": (cpu_ns(None)[0] - c0) / len(times) / 1e3}


def bench_type(ref: Path, qtype: str, args) -> dict:
    shape = LlamaShape(args.layers, args.embd, args.ff, n_head=args.embd // 64, n_head_kv=args.embd // 64,
                       n_ctx=args.ctx)      # llama-server holds a context to what the model was trained on
    m = lb.model(ref, qtype, shape)
    rng = np.random.default_rng(0)
    row = {"type": qtype, "model": m.name, "prompt": args.prompt, "gen": args.gen}
    prof = os.path.join(tempfile.mkdtemp(), "serve.prof") if args.profile else None
    with runner.our_servers(2, args.threads) as (eps, _):
        procs, bare = {}, None
        try:
            for who in ("ours", "before", "llama-server") if args.before else ("ours", "llama-server"):
                procs[who] = start(who, ref, m, eps, args, prof if who == "ours" else None)
            bare = Model.load(m, rpc=eps, tensor_split=[1, 1], n_ctx=args.ctx, n_threads=args.threads)
            runs = {who: [] for who in (*procs, "bare API")}
            for i in range(args.rounds + 1):         # round 0 warms everything up
                prompt = [int(t) for t in rng.integers(3, 500, args.prompt)]
                order = list(runs) if i % 2 == 0 else list(runs)[::-1]
                for who in order:
                    # llama-server keeps working on the servers after it answers (it saves
                    # the prompt cache): the next run waits for the servers to be idle
                    time.sleep(args.pause)
                    if who == "bare API":
                        r = bare_request(bare, prompt, args.gen)
                    else:
                        proc, url = procs[who]
                        r = one_request(url, prompt, args.gen, proc.pid)
                    if i:
                        runs[who].append(r)
        finally:
            if bare is not None:
                bare.close()
            for proc, _ in procs.values():
                proc.send_signal(signal.SIGINT)       # (cProfile writes its file on the way out)
                proc.wait(30)
    for who, rs in runs.items():
        for k in ("ttft_ms", "gen_tps", "server_gen_tps", "cpu_us_per_token", "loop_cpu_us_per_token"):
            vals = [r[k] for r in rs if r.get(k) is not None]
            row[f"{who.replace(' ', '_')}_{k}"] = statistics.median(vals) if vals else None
    bare_tps, bare_cpu = row["bare_API_gen_tps"], row["bare_API_cpu_us_per_token"]
    row["bare_api_gen_ratio"] = bare_tps / row["llama-server_gen_tps"]
    row["bare_api_tps"] = bare_tps
    for who in ("ours", "before") if args.before else ("ours",):
        pre = "" if who == "ours" else "before_"
        row[pre + "gen_ratio"] = row[f"{who}_gen_tps"] / row["llama-server_gen_tps"]
        row[pre + "ttft_ratio"] = row[f"{who}_ttft_ms"] / row["llama-server_ttft_ms"]
        row[pre + "overhead_cpu_ms_per_token"] = (row[f"{who}_cpu_us_per_token"] - bare_cpu) / 1e3
        row[pre + "http_loop_cpu_ms_per_token"] = row[f"{who}_loop_cpu_us_per_token"] / 1e3
        row[pre + "overhead_wall_ms_per_token"] = 1e3 * (1 / row[f"{who}_gen_tps"] - 1 / bare_tps)
    if prof:
        import pstats
        print(f"--- {qtype}: our server's event-loop thread, top 15 by own time")
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", nargs="+", default=["Q8_0", "Q4_K_M"])
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    ap.add_argument("--gen", type=int, default=64, help="tokens generated per request")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="threads of each RPC server and client")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=1024)
    ap.add_argument("--ff", type=int, default=2816)
    ap.add_argument("--pause", type=float, default=1.0, help="seconds of quiet before each request")
    ap.add_argument("--profile", action="store_true", help="cProfile our server's HTTP side")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--before", metavar="TREE", help="also run the serve of this source tree (before/after)")
    args = ap.parse_args(argv)
    ref = lb.reference_bin()
    rows = [bench_type(ref, q, args) for q in args.types]
    print(json.dumps(rows, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    print("\n| type | TTFT ms ours / llama-server | ratio | gen t/s ours / llama-server | ratio "
          "| bare API t/s (ratio) | overhead ms/token: CPU, event loop CPU, wall |")
    print("| --- | --- | --: | --- | --: | --: | --: |")
    for r in rows:
        for who in ("ours", "before") if args.before else ("ours",):
            pre = "" if who == "ours" else "before_"
            print(f"| {r['type']}{' (before)' if pre else ''} | {r[f'{who}_ttft_ms']:.1f} / "
                  f"{r['llama-server_ttft_ms']:.1f} | {r[pre + 'ttft_ratio']:.3f} "
                  f"| {r[f'{who}_gen_tps']:.2f} / {r['llama-server_gen_tps']:.2f} | {r[pre + 'gen_ratio']:.3f} "
                  f"| {r['bare_api_tps']:.2f} ({r['bare_api_gen_ratio']:.3f}) "
                  f"| {r[pre + 'overhead_cpu_ms_per_token']:.3f}, {r[pre + 'http_loop_cpu_ms_per_token']:.3f}, "
                  f"{r[pre + 'overhead_wall_ms_per_token']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
