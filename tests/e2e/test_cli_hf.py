"""`-hf REPO[:QUANT]` (and `-hff FILE`): the model file chosen from a Hugging Face
repository as llama.cpp chooses it, found through huggingface_hub in a cache directory
this test lays out itself, offline (HF_HUB_OFFLINE=1); the text generated equals what
`-m` with the chosen file generates."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import httpx
import pytest

from ggmlrpc.cli.hf import pick
from ggmlrpc.llm import synth
from tests.conftest import Proc, free_port

REPO = "owner/tiny-GGUF"
REV = "0123456789abcdef0123456789abcdef01234567"
ARGS = ["-p", "the old fisherman", "-n", "8", "--temp", "0", "-t", "1", "-c", "128"]


def cache_repo(cache, repo: str, files: dict[str, bytes]) -> dict[str, str]:
    """huggingface_hub's cache layout for `repo` at REV: blobs named by their sha256,
    the snapshot's files linked to them, refs/main naming the snapshot; the paths."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "blobs").mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(REV)
    snap = root / "snapshots" / REV
    snap.mkdir(parents=True)
    paths = {}
    for name, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
        paths[name] = str(snap / name)
    return paths


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    shape = synth.LlamaShape(n_ctx=128)
    q8 = synth.write_llama(d / "q8.gguf", shape, "q8_0", seed=1).read_bytes()
    f16 = synth.write_llama(d / "f16.gguf", shape, "f16", seed=2).read_bytes()
    # a projector that names the quant is never the model; F16 stands in for its bytes
    paths = cache_repo(d / "cache", REPO, {"tiny-F16.gguf": f16, "tiny-Q8_0.gguf": q8,
                                           "mmproj-tiny-Q8_0.gguf": f16, "README.md": b"tiny\n",
                                           "big-Q4_0-00001-of-00002.gguf": f16[:4096],
                                           "big-Q4_0-00002-of-00002.gguf": f16[4096:8192]})
    env = {**os.environ, "HF_HOME": str(d / "home"), "HF_HUB_CACHE": str(d / "cache"),
           "HF_HUB_OFFLINE": "1"}
    return paths, env


def cli(env, *args, command="run") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "ggmlrpc.cli.main", command, *args], env=env,
                          capture_output=True, text=True, errors="replace", timeout=120, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def by_file(hub):
    """What `-m` generates with each model file of the repository."""
    paths, env = hub
    out = {}
    for name in ("tiny-Q8_0.gguf", "tiny-F16.gguf"):
        r = cli(env, "-m", paths[name], *ARGS)
        assert r.returncode == 0, r.stderr
        out[name] = r.stdout
    assert out["tiny-Q8_0.gguf"] != out["tiny-F16.gguf"]      # so a wrong pick shows
    return out


@pytest.mark.parametrize("args, chosen", [
    (["-hf", REPO + ":Q8_0"], "tiny-Q8_0.gguf"),
    (["-hf", REPO + ":q8_0"], "tiny-Q8_0.gguf"),                  # case-insensitive
    (["-hf", REPO], "tiny-Q8_0.gguf"),                            # no Q4_K_M: Q8_0 next
    (["-hf", REPO + ":F16"], "tiny-F16.gguf"),
    (["-hf", REPO + ":Q8_0", "-hff", "tiny-F16.gguf"], "tiny-F16.gguf"),   # -hff wins
])
def test_hf_runs_the_file_llama_cpp_would(hub, by_file, args, chosen):
    r = cli(hub[1], *args, *ARGS)
    assert r.returncode == 0, r.stderr
    assert r.stdout == by_file[chosen]


def test_bench_and_serve_take_hf(hub):
    paths, env = hub
    r = cli(env, "-hf", REPO + ":Q8_0", "-p", "8", "-n", "4", "-r", "1", "-o", "json", "-t", "1",
            command="bench")
    assert r.returncode == 0, r.stderr
    assert {row["model"] for row in json.loads(r.stdout)} == {"tiny-Q8_0.gguf"}
    port = free_port()
    p = Proc([sys.executable, "-P", "-m", "ggmlrpc.cli.main", "serve", "-hf", REPO + ":F16", "-c", "128",
              "-t", "1", "--port", str(port)], port, env=env)
    try:
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).json()
        assert models["data"][0]["id"] == "tiny-F16.gguf"
    finally:
        p.stop()


@pytest.mark.parametrize("args, message", [
    (["-hf", REPO + ":Q5_K_M"], "no GGUF file for quant 'Q5_K_M' in owner/tiny-GGUF"),
    (["-hf", REPO + ":q4_0"], "owner/tiny-GGUF: big-Q4_0-00001-of-00002.gguf is split in 2 files"),
    (["-hf", "owner/absent-GGUF:Q8_0"], "owner/absent-GGUF: "),
    (["-hf", "absent"], "invalid -hf 'absent': expected <user>/<model>[:quant]"),
    (["-hf", REPO, "-hff", "tiny-Q4_0.gguf"], "no file 'tiny-Q4_0.gguf' in owner/tiny-GGUF"),
    (["-m", "tiny-Q8_0.gguf", "-hff", "tiny-F16.gguf"], "-hff names a file of the -hf repository"),
])
def test_hf_errors_are_one_line(hub, args, message):
    paths, env = hub
    r = cli(env, *(paths.get(a, a) if a.endswith("Q8_0.gguf") else a for a in args), *ARGS)
    assert r.returncode == 1
    assert r.stderr.startswith("error: " + message), r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr


def test_model_or_hf_is_required(hub):
    for args in ([], ["-m", hub[0]["tiny-F16.gguf"], "-hf", REPO]):
        r = cli(hub[1], *args, *ARGS)
        assert r.returncode == 2 and "-hf" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("files, tag, chosen", [
    (["a-Q8_0.gguf", "a-Q4_K_M.gguf"], "", "a-Q4_K_M.gguf"),          # Q4_K_M first
    (["a-F16.gguf", "b.gguf"], "", "a-F16.gguf"),                      # else the first GGUF
    (["a-Q4_K_M.gguf"], "Q4_K", None),                                 # a tag is a whole tag
    (["x/a-Q4_K-00002-of-00002.gguf", "x/a-Q4_K-00001-of-00002.gguf"], "q4_k",
     "x/a-Q4_K-00001-of-00002.gguf"),                                  # a split's first part
    (["imatrix-Q8_0.gguf", "mmproj-Q8_0.gguf", "a-Q8_0.gguf"], "Q8_0", "a-Q8_0.gguf"),
    (["a-Q8_0.bin"], "", None),
])
def test_pick(files, tag, chosen):
    assert pick(files, tag) == chosen
