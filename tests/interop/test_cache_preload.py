"""llama.cpp's client against a read-only cache preloaded from the same GGUF file: every
weight it announces by hash is a hit (our preload hashes exactly what its loader
sends), nothing is uploaded or stored, and the text is the one the plain upload gives.
"""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from ggmlrpc.cache import INDEX_NAME
from ggmlrpc.llm import synth

pytestmark = pytest.mark.interop

# feed-forward matrices of 512 x 5632 F32 (11 MiB): over the 10 MiB hash threshold
SHAPE = synth.LlamaShape(n_layer=1, n_embd=512, n_ff=5632)
N_HASHED = 3  # ffn_gate, ffn_up, ffn_down


def completion(ref_bin, model, endpoint) -> str:
    argv = [str(ref_bin / "llama-completion"), "-m", str(model), "--rpc", endpoint, "-ngl", "99",
            "--temp", "0", "-s", "1", "-n", "8", "-no-cnv", "--simple-io", "-p", "hello world"]
    env = dict(os.environ, GGML_NO_BACKTRACE="1")
    for _ in range(4):  # the client now and then loses its output's tail when it exits
        r = subprocess.run(argv, capture_output=True, text=True, errors="replace", env=env,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        if r.stdout.endswith("\n\n"):
            break
    return r.stdout


def test_preloaded_readonly_cache_serves_llama_cpp(ref_bin, server_proc, tmp_path):
    model = synth.write_llama(tmp_path / "big-ffn.gguf", SHAPE, dtype="f32")
    cache_env = dict(os.environ, LLAMA_CACHE=str(tmp_path / "cache"), GGML_RPC_DEBUG="1")

    plain = server_proc("-t", "1")
    want = completion(ref_bin, model, plain.endpoint)
    plain.stop()

    srv = server_proc("-t", "1", "--cache-readonly", "--cache-preload", str(model), env=cache_env)
    got = completion(ref_bin, model, srv.endpoint)
    _, err = srv.stop()
    assert want.startswith("hello world") or want.startswith(" hello world"), want
    assert got == want
    hits = re.findall(r"^\[set_tensor_hash\] buffer: .* hash: ([0-9a-f]+)$", err, re.M)
    assert len(hits) == N_HASHED, err[-3000:]
    assert "not cached" not in err and "saved to" not in err
    assert f"preloaded {N_HASHED} tensors" in err
    files = sorted(n for n in os.listdir(tmp_path / "cache" / "rpc") if n != INDEX_NAME)
    assert sorted(int(f, 16) for f in files) == sorted(int(h, 16) for h in hits)
