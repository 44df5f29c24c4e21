"""Metrics during a real llama.cpp session: the reference llama-completion loads a
generated model onto our server (`--rpc ours -ngl 99`) and generates, while the
test scrapes /metrics; the numbers must agree with what the session did.

The model (ggmlrpc.llm.synth, F32, one layer 1024 wide with a 2816 feed-forward)
has exactly three tensors above the client's 10 MiB hash threshold, the
feed-forward matrices, so the local cache (`-c`) has a known part to play: three
misses and three files on the first load, three hits on the second, and their
bytes not sent again. Every tensor but the token embeddings (kept on the main
host) goes to our server.

Generation runs with --ignore-eos and --no-warmup: the prompt is one batch and
each further token one decode, so the server runs exactly N_PREDICT graphs per
generation. The mid-run scrape uses llama-completion's interactive mode, which
waits on its stdin after generating: the connection is certain to be open and
its buffers loaded while the test looks.
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import gguf
import pytest

from ggmlrpc import protocol
from ggmlrpc.llm import synth
from tests.conftest import free_port
from tests.e2e.test_metrics import Scrape, balanced, scrape
from tests.protocol.rawclient import Raw, frame

pytestmark = pytest.mark.interop

SHAPE = synth.LlamaShape(n_layer=1, n_embd=1024, n_ff=2816, n_head=8, n_head_kv=4)
N_PREDICT = 8
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return synth.write_llama(tmp_path_factory.mktemp("metrics") / "llama-f32.gguf", SHAPE, "f32")


def offloaded_tensors(model: Path) -> dict[str, int]:
    """name -> bytes of every tensor llama.cpp puts on the RPC device with -ngl 99."""
    return {t.name: int(t.n_bytes) for t in gguf.GGUFReader(model).tensors
            if t.name != "token_embd.weight"}


def argv(ref_bin: Path, model: Path, endpoint: str, *extra: str) -> list[str]:
    return [str(ref_bin / "llama-completion"), "-m", str(model), "--temp", "0", "-s", "1",
            "-no-cnv", "--simple-io", "-p", PROMPT, "-n", str(N_PREDICT), "--ignore-eos",
            "--no-warmup", "-t", "1", "--rpc", endpoint, "-ngl", "99", *extra]


def total(s: Scrape, name: str) -> float:
    return sum(s.series(name).values())


def graph_runs(s: Scrape) -> float:
    return total(s, "ggmlrpc_graph_computes_total")


def wait_scrape(port: int, pred, what: str, proc=None, timeout: float = 240.0) -> Scrape:
    """Scrape until pred holds; a generous deadline only turns a hang into a failure."""
    deadline = time.monotonic() + timeout
    while True:
        s = scrape(port)
        if pred(s):
            return s
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"llama-completion exited with {proc.returncode} before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_scrape_during_completion(ref_bin, model, server_proc, tmp_path):
    mport = free_port()
    srv = server_proc("-t", "1", "-c", "--metrics", f"127.0.0.1:{mport}",
                      env=dict(os.environ, LLAMA_CACHE=str(tmp_path)))
    tensors = offloaded_tensors(model)
    big = [n for n in tensors.values() if n > protocol.HASH_THRESHOLD]
    assert len(big) == 3
    env = dict(os.environ, GGML_NO_BACKTRACE="1")
    s0 = scrape(mport)
    assert graph_runs(s0) == 0 and s0.value("ggmlrpc_connections_accepted_total") == 0

    # -- first load: through the empty cache ------------------------------------------
    r = subprocess.run(argv(ref_bin, model, srv.endpoint), capture_output=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]
    s1 = wait_scrape(mport, lambda s: s.value("ggmlrpc_connections_open") == 0, "the client's exit")
    rx1 = total(s1, "ggmlrpc_command_request_bytes_total")
    assert rx1 >= sum(tensors.values())
    assert s1.value("ggmlrpc_command_request_bytes_total", command="SET_TENSOR") >= sum(tensors.values())
    assert s1.value("ggmlrpc_cache_misses_total") == 3
    assert s1.value("ggmlrpc_cache_stores_total") == 3
    assert s1.value("ggmlrpc_cache_hits_total") == 0
    assert s1.value("ggmlrpc_cache_files") == 3
    assert s1.value("ggmlrpc_cache_disk_bytes") == sum(big)
    # one graph per token: the prompt's batch gives the first, each decode one more
    assert graph_runs(s1) == N_PREDICT
    assert s1.value("ggmlrpc_graph_computes_total", device="CPU", kind="compute") >= 1
    assert total(s1, "ggmlrpc_graph_nodes_total") > N_PREDICT
    log = r.stderr.decode(errors="replace")
    m = re.search(r"\beval time =.*/\s*(\d+) runs", log)
    if m:  # the client's own count, when its logger got it out before exiting
        assert graph_runs(s1) == 1 + int(m.group(1))
    # llama-completion probes with short connections, then holds one; all ended well
    accepted = s1.value("ggmlrpc_connections_accepted_total")
    assert accepted >= 1
    assert s1.value("ggmlrpc_connections_closed_total", reason="client") == accepted
    assert balanced(s1)
    assert s1.value("ggmlrpc_device_buffers", device="CPU") == 0

    # -- second load, interactive: scraped while it waits for input ------------------------
    with open(tmp_path / "out.txt", "wb") as out, open(tmp_path / "err.txt", "wb") as err:
        p = subprocess.Popen(argv(ref_bin, model, srv.endpoint, "-i"), stdin=subprocess.PIPE,
                             stdout=out, stderr=err, env=env)
        try:
            mid = wait_scrape(mport, lambda s: graph_runs(s) - graph_runs(s1) >= N_PREDICT,
                              "the second generation", proc=p)
            assert p.poll() is None                         # still waiting on its stdin
            assert mid.value("ggmlrpc_connections_open") == 1
            assert mid.value("ggmlrpc_cache_hits_total") == 3
            assert mid.value("ggmlrpc_cache_saved_bytes_total") == sum(big)
            assert mid.value("ggmlrpc_cache_misses_total") == 3       # none new
            assert mid.value("ggmlrpc_cache_stores_total") == 3
            rx2 = total(mid, "ggmlrpc_command_request_bytes_total") - rx1
            assert rx2 + sum(big) >= sum(tensors.values())           # the rest came by wire
            assert rx2 < sum(tensors.values()) - sum(big) / 2        # the cached bytes did not
            assert mid.value("ggmlrpc_device_buffer_bytes", device="CPU") >= sum(tensors.values())
            assert mid.value("ggmlrpc_device_stored_plans", device="CPU") == 1
            assert mid.value("ggmlrpc_device_scratch_bytes", device="CPU") > 0
            assert balanced(mid)
        finally:
            p.stdin.close()
            p.wait(120)
    assert p.returncode == 0, (tmp_path / "err.txt").read_text(errors="replace")[-3000:]
    s2 = wait_scrape(mport, lambda s: s.value("ggmlrpc_connections_open") == 0, "the client's exit")
    assert s2.value("ggmlrpc_device_buffers", device="CPU") == 0

    # -- a hostile frame: counted under its reason ------------------------------------------
    with Raw(srv.port) as raw:
        raw.hello()
        raw.send(frame(200))
        raw.expect_closed()
    s3 = wait_scrape(mport, lambda s: s.value("ggmlrpc_connections_closed_total", reason="protocol") == 1,
                     "the hostile connection's end")
    closed = {r: v for r, v in s3.reasons("ggmlrpc_connections_closed_total").items() if v}
    assert closed == {"client": s2.value("ggmlrpc_connections_accepted_total"), "protocol": 1}
    assert s3.value("ggmlrpc_connections_open") == 0 and balanced(s3)
    _, err = srv.output()
    assert "unknown command 200" in err
