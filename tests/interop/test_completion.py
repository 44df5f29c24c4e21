"""llama.cpp's llama-completion prints the same text through our server as on its own CPU.

For each shared model, with the prompt and flash-attention choice of its recorded
session: greedy decoding of 16 tokens with every layer on our server
(`--rpc ours -ngl 99`) against the same run on llama.cpp's local CPU backend
(`-ngl 0`, where this host's llama.cpp was built for the kernel family we reproduce),
and against the output recorded through an AVX2 build of llama.cpp's own RPC server
(tests/data/traces/<session>/stdout.txt, on every host). Greedy decoding turns the smallest logit
difference at a near-tie into different text, so equal text over 16 tokens is a
strong check of the whole executor.

With quantized KV caches (SET_ROWS into Q8_0/Q4_0, flash attention over them) the
comparison is with llama.cpp's RPC server run live: its local CPU backend takes
other code paths there (repacked weights) and is not even stable from run to run.
"""
from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import MODELS, TRACES
from tests.interop.backend_ops import tool_env

pytestmark = pytest.mark.interop

SESSIONS = {  # model file -> recorded session with the flags to reuse
    "llama-f32.gguf": "llama-f32",
    "llama-f16.gguf": "llama-f16-fa",
    "llama-q8_0.gguf": "llama-q8_0",
    "llama-q4_0.gguf": "llama-q4_0-nofa",
}


def recorded_args(session: str) -> list[str]:
    """The recorded command's flags after the model, minus the endpoint and -ngl:
    -p's value is everything up to the next flag (command.txt is not shell-quoted)."""
    words = (TRACES / session / "command.txt").read_text().split()
    words = words[words.index("-m") + 2:]
    out: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        if w in ("--rpc", "-ngl"):
            i += 2
            continue
        if w == "-p":
            j = i + 1
            while j < len(words) and not words[j].startswith("-"):
                j += 1
            out += ["-p", " ".join(words[i + 1:j])]
            i = j
            continue
        out.append(w)
        i += 1
    return out


def completion(ref_bin: Path, model: Path, args: list[str], rpc: str | None, extra=()) -> str:
    """llama-completion's stdout (its log drained at exit: `tool_env`). Should the
    client still lose the tail of its output, a run whose output does not end in its
    blank line is repeated."""
    argv = [str(ref_bin / "llama-completion"), "-m", str(model), *args, *extra]
    # the local CPU run keeps llama.cpp's plain CPU buffers (no repacked or AMX weights),
    # which is what an RPC server computes with
    argv += ["--rpc", rpc, "-ngl", "99"] if rpc else ["-ngl", "0", "--no-repack"]
    env = tool_env(ref_bin)
    for _ in range(8):   # a loaded CI host once lost the output of four runs in a row
        r = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, env=env, timeout=300)
        assert r.returncode == 0, f"{shlex.join(argv)}\n{r.stderr.decode(errors='replace')[-3000:]}"
        if r.stdout.endswith(b"\n\n"):
            break
    return r.stdout.decode("utf-8", "surrogateescape")


@pytest.mark.parametrize("model_file", sorted(SESSIONS))
def test_same_text_as_local_cpu(ref_bin, server_proc, bit_exact, model_file):
    session = SESSIONS[model_file]
    model = MODELS / model_file
    args = recorded_args(session)
    assert args[args.index("-n") + 1] == "16" and "-ngl" not in args
    # our server reproducing the AVX2 build the session was recorded with, on any host
    avx2 = server_proc("-t", "2", env=dict(os.environ, GGMLRPC_KERNELS="x86-avx2"))
    ours = completion(ref_bin, model, args, avx2.endpoint)
    recorded = (TRACES / session / "stdout.txt").read_bytes().decode("utf-8", "surrogateescape")
    prompt = args[args.index("-p") + 1]
    assert ours.startswith(" " + prompt) and len(ours) > len(prompt) + 1
    assert ours.strip() == recorded.strip()
    # and reproducing this host's llama.cpp build (random weights make greedy decoding
    # sensitive to summation order: equal text needs the same family)
    if bit_exact:
        native = completion(ref_bin, model, args, server_proc("-t", "2").endpoint)
        assert native == completion(ref_bin, model, args, None)


@pytest.mark.parametrize("kv", ["q8_0", "q4_0"])
@pytest.mark.parametrize("model_file", sorted(SESSIONS))
def test_quantized_kv_cache_same_text_as_reference_server(ref_bin, server_proc, ref_server, model_file, kv):
    args = recorded_args(SESSIONS[model_file])
    args = [a for i, a in enumerate(args) if a != "-fa" and (i == 0 or args[i - 1] != "-fa")]
    extra = ["-fa", "on", "-ctk", kv, "-ctv", kv]
    ours = completion(ref_bin, MODELS / model_file, args, server_proc("-t", "2").endpoint, extra)
    ref = completion(ref_bin, MODELS / model_file, args, ref_server("-t", "2").endpoint, extra)
    assert len(ours) > 20 and ours == ref
