"""Prompt processing and generation speed through our server vs llama.cpp's.

Runs the reference `llama-bench -ngl 99 --rpc` against the reference
`ggml-rpc-server` and against ours, same server threads, same model, alternating,
and prints pp/tg tokens per second and the ratio ours/reference (table + JSON).
The model is a generated llama (default 12 layers, width 1024, ff 2816, ~140M
parameters) quantized by llama-quantize, cached beside the reference build.

    python bench/llama_bench.py --types Q8_0 Q4_0 --threads 2 --rounds 3
    python bench/llama_bench.py --types Q4_K_M --depth 2048 --pp 0   # tg with 2048 tokens in the cache
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))   # an installed ggmlrpc first (a source tree holds no built modules)

from ggmlrpc.llm.synth import LlamaShape, ModelShape, quantize, write_llama, write_model  # noqa: E402


def reference_bin() -> Path:
    out = subprocess.run(["bash", str(REPO / "scripts" / "build-reference.sh")], check=True,
                         capture_output=True, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def model(ref: Path, qtype: str, shape: LlamaShape, arch: str = "llama") -> Path:
    """A generated model (`arch`: a model name of ggmlrpc.llm.synth), cached by shape."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ggmlrpc" / "models"
    cache.mkdir(parents=True, exist_ok=True)
    tag = f"{arch}-{shape.n_layer}x{shape.n_embd}-ff{shape.n_ff}"
    if shape.n_ctx != LlamaShape.n_ctx:
        tag += f"-ctx{shape.n_ctx}"
    dst = cache / f"{tag}-{qtype.lower()}.gguf"
    if not dst.exists():
        src = cache / f"{tag}-f16.gguf"
        if not src.exists():
            if arch == "llama":
                write_llama(src.with_suffix(".tmp"), shape, "f16")
            else:
                write_model(src.with_suffix(".tmp"), arch, ModelShape(**vars(shape)), "f16")
            src.with_suffix(".tmp").rename(src)
        if qtype.upper() == "F16":
            return src
        quantize(ref / "llama-quantize", src, dst.with_suffix(".tmp"), qtype)
        dst.with_suffix(".tmp").rename(dst)
    return dst


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("server exited early")
        with open("/proc/net/tcp") as f:
            if any(l.split()[3] == "0A" and int(l.split()[1].split(":")[1], 16) == port
                   for l in f.readlines()[1:]):
                return
        time.sleep(0.05)
    raise TimeoutError("server did not listen")


def run_once(ref: Path, server_argv: list[str], m: Path, args) -> dict:
    port = free_port()
    srv = subprocess.Popen(server_argv + ["-p", str(port), "-t", str(args.threads)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(port, srv)
        cmd = [str(ref / "llama-bench"), "-m", str(m), "-ngl", "99", "--rpc", f"127.0.0.1:{port}",
               "-t", str(args.threads), "-p", str(args.pp), "-n", str(args.tg), "-r", str(args.reps),
               "-o", "json"] + (["-d", str(args.depth)] if getattr(args, "depth", 0) else [])
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        if r.returncode != 0:
            lines = r.stderr.strip().splitlines()
            errs = [l for l in lines if "error" in l.lower() or "abort" in l.lower()]
            return {"error": (errs or lines or ["failed"])[0][:200]}
        res = {}
        for row in json.loads(r.stdout):
            key = "pp" if row["n_prompt"] else "tg"
            res[key] = row["avg_ts"]
        return res
    except subprocess.TimeoutExpired:
        return {"error": "timeout"}
    finally:
        srv.terminate()
        try:
            srv.wait(10)
        except subprocess.TimeoutExpired:
            srv.kill()


def add_run_args(ap: argparse.ArgumentParser) -> None:
    """The options of a run both comparisons share (this one and runner.py): threads,
    prompt and generation lengths, repetitions, rounds, and the generated model's size."""
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=64)
    ap.add_argument("--tg", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2, help="llama-bench -r")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per server")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=1024)
    ap.add_argument("--ff", type=int, default=2816)


def model_shape(args) -> LlamaShape:
    """The generated llama add_run_args' options describe (64-wide heads), with a
    context of 4096 where --depth and the lengths need more than the default."""
    need = sum(getattr(args, k, 0) for k in ("depth", "pp", "tg"))
    return LlamaShape(args.layers, args.embd, args.ff, n_head=args.embd // 64, n_head_kv=args.embd // 64,
                      **({"n_ctx": 4096} if need > LlamaShape.n_ctx else {}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", nargs="+", default=["Q8_0", "Q4_0"])
    add_run_args(ap)
    ap.add_argument("--depth", type=int, default=0,
                    help="llama-bench -d: tokens in the KV cache before each test (attention's share grows)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--metrics", action="store_true",
                    help="also run ours with --metrics (ours+metrics) and report on/off ratios")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)

    ref = reference_bin()
    ours = shutil.which("ggml-rpc-server")
    ours_argv = [ours] if ours and Path(ours).resolve() != (ref / "ggml-rpc-server").resolve() \
        else [sys.executable, "-P", "-m", "ggmlrpc.cli.server"]
    servers = {"reference": [str(ref / "ggml-rpc-server")], "ours": ours_argv}
    if args.metrics:  # every command counted; the endpoint on a free loopback port
        servers["ours+metrics"] = ours_argv + ["--metrics", "127.0.0.1:0"]
    shape = model_shape(args)
    results = []
    for qtype in args.types:
        m = model(ref, qtype, shape)
        runs = {name: [] for name in servers}
        for i in range(args.rounds):
            names = list(servers)
            for name in (names if i % 2 == 0 else names[::-1]):  # alternate who goes first
                runs[name].append(run_once(ref, servers[name], m, args))
        row = {"type": qtype, "model": m.name, "threads": args.threads}
        for name, rs in runs.items():
            ok = [r for r in rs if "error" not in r]
            for k in ("pp", "tg"):
                vals = [r[k] for r in ok if k in r]
                row[f"{name}_{k}"] = statistics.median(vals) if vals else None
            if not ok:
                row[f"{name}_error"] = rs[-1]["error"]
        for k in ("pp", "tg"):
            # the median of each round's ratio (the two servers ran back to back),
            # steadier than a ratio of medians when the host's speed drifts
            pairs = [(o[k], r[k]) for o, r in zip(runs["ours"], runs["reference"])
                     if k in o and k in r]
            row[f"ratio_{k}"] = statistics.median(o / r for o, r in pairs) if pairs else None
            row[f"rounds_{k}"] = [[round(o, 2), round(r, 2)] for o, r in pairs]
            if args.metrics:
                on = [(m_[k], o[k]) for m_, o in zip(runs["ours+metrics"], runs["ours"])
                      if k in m_ and k in o]
                row[f"metrics_{k}"] = [round(m_, 2) for m_, _ in on]
                row[f"metrics_on_over_off_{k}"] = (statistics.median(m_ / o for m_, o in on)
                                                   if on else None)
        results.append(row)

    print(f"{'type':6} {'ref pp' + str(args.pp):>11} {'ours pp':>9} {'ratio':>6}  "
          f"{'ref tg' + str(args.tg):>10} {'ours tg':>9} {'ratio':>6}")
    fmt = lambda v, w, p=1: f"{v:{w}.{p}f}" if isinstance(v, float) else f"{'-':>{w}}"
    for r in results:
        print(f"{r['type']:6} {fmt(r['reference_pp'], 11)} {fmt(r['ours_pp'], 9)} "
              f"{fmt(r['ratio_pp'], 6, 2)}  {fmt(r['reference_tg'], 10)} {fmt(r['ours_tg'], 9)} "
              f"{fmt(r['ratio_tg'], 6, 2)}")
        if r.get("ours_error"):
            print(f"  ours failed: {r['ours_error']}")
        if args.metrics:
            print(f"  metrics on/off: pp {fmt(r['metrics_on_over_off_pp'], 5, 3)}, "
                  f"tg {fmt(r['metrics_on_over_off_tg'], 5, 3)}")
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
