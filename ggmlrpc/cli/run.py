"""`ggml-rpc-cli run` and `ggml-rpc-cli bench`: a GGUF model over the local CPU and
RPC servers. Options, defaults and output follow llama.cpp's llama-completion and
llama-bench."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

from ..errors import GgmlRpcError, UnsupportedError, VersionMismatch
from .common import CliError, split_endpoints


def _split(value: str) -> list[float]:
    try:
        return [float(x) for x in value.replace("/", ",").split(",") if x != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid tensor split {value!r}") from None


def _flash_attn(value: str) -> str:
    if value not in ("on", "off", "auto"):
        raise argparse.ArgumentTypeError("expected on, off or auto")
    return value


def add_model_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("-m", "--model", help="GGUF model file")
    src.add_argument("-hf", "-hfr", "--hf-repo", dest="hf_repo", metavar="<user>/<model>[:quant]",
                     help="a model from Hugging Face, downloaded into huggingface_hub's cache; quant: "
                          "case-insensitive, default Q4_K_M, else Q8_0, else the repository's first GGUF")
    p.add_argument("-hff", "--hf-file", dest="hf_file", default=None,
                   help="the file of the -hf repository to load (instead of the quant's)")
    p.add_argument("--rpc", default=None, help="RPC servers, host:port[,host:port...]")
    p.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="ngl", type=int, default=99,
                   help="layers to offload to the servers' devices (default: all)")
    p.add_argument("-ts", "--tensor-split", dest="ts", type=_split, default=None,
                   help="fraction of the offloaded layers per device, e.g. 3,1 (default: by free memory)")
    p.add_argument("-sm", "--split-mode", dest="sm", choices=("layer", "row", "auto"), default="layer",
                   help="layer: runs of layers per device (default); row: every offloaded layer cut "
                        "over all devices by -ts shares (heads, feed-forward rows, vocabulary rows); "
                        "auto: the one predicted faster from the servers' measured round trip and speed")
    p.add_argument("--no-pipeline", dest="pipeline", action="store_false",
                   help="with -sm layer over several servers, run a long prompt's micro-batches one "
                        "after the other (default: as a pipeline, each server working on its own "
                        "micro-batch at once)")
    p.add_argument("--no-peers", dest="peers", action="store_false",
                   help="with -sm row, combine the servers' results on this host even where the servers "
                        "could swap them themselves (ggml-rpc-server --peers)")
    p.add_argument("-t", "--threads", type=int, default=None, help="local CPU threads")
    p.add_argument("-c", "--ctx-size", dest="ctx", type=int, default=0,
                   help="context size (default: 0, the model's)")
    p.add_argument("-ub", "--ubatch-size", dest="ubatch", type=int, default=512,
                   help="prompt tokens per graph (default: 512)")
    p.add_argument("-fa", "--flash-attn", dest="fa", type=_flash_attn, default="auto",
                   help="flash attention: on, off or auto (default: auto, which is on)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait on a server")
    p.add_argument("--reconnect", type=float, default=0.0, metavar="SECONDS",
                   help="wait this long for a server lost during generation to come back "
                        "(it gets its layers again and the context is replayed; default 0: fail)")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """How many tokens to generate and how to draw them (llama.cpp's defaults)."""
    p.add_argument("-n", "--n-predict", dest="n_predict", type=int, default=-1,
                   help="tokens to generate (default: -1, until end of text or a full context)")
    p.add_argument("--temp", type=float, default=0.8, help="temperature (default 0.8; 0 = greedy)")
    p.add_argument("--top-k", dest="top_k", type=int, default=40)
    p.add_argument("--top-p", dest="top_p", type=float, default=0.95)
    p.add_argument("--min-p", dest="min_p", type=float, default=0.05)
    p.add_argument("-s", "--seed", type=int, default=-1, help="random seed (default: -1, random)")
    p.add_argument("--ignore-eos", action="store_true", help="never end at end-of-generation tokens")


def seed_of(a) -> int:
    """The seed given, or a random one for -1."""
    return a.seed if a.seed >= 0 else int.from_bytes(os.urandom(4), "little")


class Progress:
    """Upload progress on stderr (bytes, rate, ETA) when stderr is a terminal."""

    def __init__(self, stream=None):
        self.stream = stream = stream if stream is not None else sys.stderr
        self.tty = stream.isatty()
        self.t0 = time.monotonic()
        self.last = 0.0

    def __call__(self, done: int, total: int, cached: int = 0) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        el = max(now - self.t0, 1e-6)
        rate = done / el
        eta = (total - done) / rate if rate > 0 else 0.0
        width = 30
        fill = int(width * done / total) if total else width
        msg = (f"\rloading [{'#' * fill}{'.' * (width - fill)}] {done / 2**20:8.1f}/{total / 2**20:.1f} MiB "
               f"{rate / 2**20:7.1f} MiB/s ETA {eta:5.1f}s")
        if cached:
            msg += f" ({cached / 2**20:.1f} MiB from server caches)"
        self.stream.write(msg)
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def load_model(a, progress=None, warm_up: bool = False):
    """The model of the command's options, loaded onto its devices; with `warm_up`,
    then run through llama.cpp's warm-up step (Model.warm_up) unless --no-warmup."""
    from ..llm.gguf_file import ModelError
    from ..llm.model import Model

    if a.hf_repo:
        from .hf import resolve
        a.model = resolve(a.hf_repo, a.hf_file)
    elif a.hf_file:
        raise CliError("-hff names a file of the -hf repository: give -hf too")
    rpc = split_endpoints(a.rpc) if a.rpc else None
    try:
        model = Model.load(a.model, rpc=rpc, n_gpu_layers=a.ngl, tensor_split=a.ts, n_ctx=a.ctx,
                           n_threads=a.threads, flash_attn=a.fa != "off", timeout=a.timeout,
                           progress=progress, reconnect=a.reconnect, n_ubatch=a.ubatch,
                           n_seq=max(1, getattr(a, "parallel", 1)), split_mode=a.sm,
                           pipeline=a.pipeline, peers=getattr(a, "peers", True))
    except VersionMismatch as e:
        raise CliError(str(e)) from None
    except ModelError as e:
        raise CliError(str(e)) from None
    except GgmlRpcError as e:
        raise CliError(f"server unreachable or lost while loading: {e}") from None
    if model.cached_bytes:
        print(f"{model.cached_bytes / 2**20:.1f} MiB of weights came from the servers' caches",
              file=sys.stderr)
    if model.split_reason:
        print(f"split mode auto: {model.split_mode} ({model.split_reason})", file=sys.stderr)
    if model.rows is not None and model.rows.linked:
        print(f"split mode row: the {len(model.rows.shards)} servers swap their results directly (--peers)",
              file=sys.stderr)
    if warm_up and not a.no_warmup:
        try:
            model.warm_up()
        except BaseException:
            with running(model):     # closes the model; the error as one line, as a run's
                raise
    return model


@contextlib.contextmanager
def running(model):
    """Close `model` at the end; what goes wrong while it runs becomes one line."""
    from ..llm.gguf_file import ModelError

    try:
        yield model
    except ModelError as e:
        raise CliError(str(e)) from None
    except UnsupportedError as e:
        raise CliError(f"the local CPU cannot run this model: {e}") from None
    except GgmlRpcError as e:
        raise CliError(f"server lost during generation: {e}") from None
    finally:
        model.close()


def cmd_run(a) -> int:
    prompt = a.prompt
    if a.file:
        try:
            with open(a.file, "rb") as f:
                prompt = f.read().decode("utf-8", "surrogateescape")
        except OSError as e:
            raise CliError(f"cannot read prompt file: {e}") from None
    model = load_model(a, Progress(), warm_up=True)
    out = sys.stdout.buffer
    seed = seed_of(a)
    with running(model):
        for piece in model.generate(prompt, a.n_predict, temp=a.temp, top_k=a.top_k, top_p=a.top_p,
                                    min_p=a.min_p, seed=seed, ignore_eos=a.ignore_eos, echo=True):
            # llama-completion prints each piece as a C string: nothing from a NUL byte on
            out.write(piece.split(b"\0", 1)[0])
            out.flush()
        if model.stop_reason == "eog":
            out.write(b" [end of text]\n")
        out.write(b"\n\n")
        out.flush()
    return 0


def cmd_bench(a) -> int:
    import numpy as np

    model = load_model(a, Progress())
    rng = np.random.default_rng(0)
    results = []
    try:
        tests = []
        if a.n_prompt > 0:
            tests.append(("pp", a.n_prompt))
        if a.n_gen > 0:
            tests.append(("tg", a.n_gen))
        for kind, n in tests:
            times = []
            warm = 0 if a.no_warmup else 1
            for rep in range(a.repetitions + warm):     # the first run warms up
                toks = [int(t) for t in rng.integers(0, model.hp.n_vocab, n)]
                model.reset()
                t0 = time.perf_counter()
                if kind == "pp":
                    model.eval(toks)
                else:
                    for t in toks:
                        model.eval([t])
                if rep >= warm:
                    times.append(time.perf_counter() - t0)
            ts = [n / t for t in times]
            results.append({"test": f"{kind}{n}", "n": n, "avg_ts": statistics.mean(ts),
                            "stddev_ts": statistics.stdev(ts) if len(ts) > 1 else 0.0,
                            "samples_ns": [int(t * 1e9) for t in times]})
        info = {"model": os.path.basename(a.model), "size": sum(t.nbytes for t in model.file.tensors.values()),
                "backend": "RPC" if a.rpc else "CPU", "ngl": a.ngl if a.rpc else 0,
                "split_mode": model.split_mode}      # -sm auto: the mode it chose
    except GgmlRpcError as e:
        raise CliError(f"server lost during the benchmark: {e}") from None
    finally:
        model.close()
    if a.output == "json":
        print(json.dumps([{**info, **r} for r in results], indent=2))
        return 0
    sm = ("", "") if info["split_mode"] == "layer" else (" sm |", " -- |")   # llama-bench's column if not the default
    print(f"| model | size | backend | ngl |{sm[0]} test | t/s |")
    print(f"| ----- | ---: | ------- | --: |{sm[1]} ---: | --: |")
    mode = f" {info['split_mode']} |" if sm[0] else ""
    for r in results:
        print(f"| {info['model']} | {info['size'] / 2**20:.2f} MiB | {info['backend']} | {info['ngl']} "
              f"|{mode} {r['test']} | {r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} |")
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("run", help="generate text (llama-completion's options)")
    add_model_args(p)
    p.add_argument("-p", "--prompt", default="", help="prompt")
    p.add_argument("-f", "--file", default=None, help="read the prompt from a file")
    add_sampling_args(p)
    p.add_argument("--no-warmup", dest="no_warmup", action="store_true",
                   help="skip the warm-up step (BOS and EOS through every server) before the prompt")
    for flag in ("-no-cnv", "--no-conversation", "--simple-io", "--no-repack"):
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)  # llama-completion's, no-ops
    p.set_defaults(func=cmd_run)

    b = sub.add_parser("bench", help="prompt and generation speed (llama-bench's table)")
    add_model_args(b)
    b.add_argument("-p", "--n-prompt", dest="n_prompt", type=int, default=512)
    b.add_argument("-n", "--n-gen", dest="n_gen", type=int, default=128)
    b.add_argument("-r", "--repetitions", type=int, default=5)
    b.add_argument("-o", "--output", choices=["md", "json"], default="md")
    b.add_argument("--no-warmup", dest="no_warmup", action="store_true",
                   help="skip the warm-up run before each test")
    b.set_defaults(func=cmd_bench)
