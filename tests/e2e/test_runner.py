"""The LLM runner on generated llama models: the same greedy tokens in-process and
through our servers (one, two with a tensor split, some layers kept on the CPU),
placement by free memory and by -ts read back from the servers' buffers, the
generation API, and the CLI's one-line errors."""
from __future__ import annotations

import os
import subprocess
import sys

import gguf
import numpy as np
import pytest

from ggmlrpc.cli.main import main
from ggmlrpc.errors import ConnectionLost
from ggmlrpc.llm import synth
from ggmlrpc.llm.archs import ARCHS
from ggmlrpc.llm.gguf_file import ModelError
from ggmlrpc.llm.model import Model, assign_layers
from tests.conftest import Proc, free_port, our_server_argv, start_server

# every architecture but llama, which the tests below cover in more ways (and gemma4's
# E2B: per-layer embeddings and layers reading an earlier layer's cache)
OTHER_ARCHS = [a for a in ARCHS if a != "llama"] + ["gemma4-e2b"]


def arch_shape(arch: str, n_embd: int) -> synth.ModelShape:
    """Two layers, or what the architecture's test_shape says (gemma3: seven, six
    sliding-window layers and one global, rope bases 1e4/1e6); `arch`: an
    architecture or one of synth's model names."""
    return synth.ModelShape(**{"n_layer": 2, "n_embd": n_embd, "n_ff": 2 * n_embd, "n_head": 4, "n_head_kv": 2,
                               **ARCHS[synth.ARCHS[arch][0] if arch in synth.ARCHS else arch].test_shape})


PROMPT = "the old fisherman lived in a small village by the sea"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("runner")
    return synth.write_llama(d / "llama.gguf", synth.LlamaShape(n_layer=4, n_embd=64, n_ff=128,
                                                                 n_head=4, n_head_kv=2, n_ctx=256))


@pytest.fixture
def servers():
    srvs = [start_server(), start_server()]
    yield srvs
    for s in srvs:
        s.close()


def greedy(path, n=12, **kw) -> tuple[list[bytes], str]:
    with Model.load(path, **kw) as m:
        pieces = list(m.generate(PROMPT, n, temp=0))
        return pieces, m.stop_reason


def test_same_tokens_everywhere(model_path, servers):
    eps = [f"127.0.0.1:{s.port}" for s in servers]
    local, why = greedy(model_path, n_gpu_layers=0)
    assert len(local) == 12 and why == "length"
    assert greedy(model_path, rpc=eps[0])[0] == local
    assert greedy(model_path, rpc=eps, tensor_split=[1, 1])[0] == local
    assert greedy(model_path, rpc=eps[0], n_gpu_layers=2)[0] == local   # layers 0-1 on the CPU
    assert greedy(model_path, rpc=",".join(eps), n_gpu_layers=4)[0] == local   # output on the CPU
    no_fa = greedy(model_path, flash_attn=False)[0]     # soft_max attention, transposed V cache
    assert len(no_fa) == 12 and greedy(model_path, rpc=eps, flash_attn=False)[0] == no_fa


@pytest.mark.parametrize("arch", OTHER_ARCHS)
def test_other_architectures_same_tokens_everywhere(tmp_path, servers, arch):
    path = synth.write_model(tmp_path / f"{arch}.gguf", arch,
                             arch_shape(arch, 64))
    local, _ = greedy(path, n_gpu_layers=0)
    assert len(local) == 12
    assert greedy(path, rpc=[f"127.0.0.1:{s.port}" for s in servers], n_gpu_layers=1)[0] == local


@pytest.mark.parametrize("n_layer,kw,caches", [
    (3, dict(n_gpu_layers=0), [[0, 1]]),
    (3, dict(tensor_split=[1, 1]), [[], [0, 1], [0]]),
    # layer 2's rows pass through the first server's stage on to the second's
    (7, dict(n_gpu_layers=5, tensor_split=[1, 2]), [[0, 1, 2], [2, 3], [2, 3]]),
], ids=["in-process", "two-servers", "cpu-and-two-servers"])
def test_shared_kv_layers_keep_no_cache(tmp_path, servers, n_layer, kw, caches):
    """gemma4 E2B: the last third of the layers keep no cache; each reads the last
    earlier cache of its kind (3 layers: layer 2 reads layer 0's): on its own stage
    that very tensor, on a later one the one copy that stage keeps, written from the
    rows the earlier stages pass on. Same tokens as in-process."""
    shape = synth.ModelShape(**{**vars(arch_shape("gemma4-e2b", 64)), "n_layer": n_layer})
    path = synth.write_model(tmp_path / "e2b.gguf", "gemma4-e2b", shape)
    eps = [f"127.0.0.1:{s.port}" for s in servers]
    kw = dict(kw, rpc=eps) if "tensor_split" in kw else kw
    with Model.load(path, **kw) as m:
        assert [sorted({int(k.name.rsplit("l", 1)[1]) for k, _ in st.kv.values()}) for st in m.stages] == caches
        for st in m.stages:
            assert all(st.kv[il] is st.kv[m.hp.kv_layer(il)] for il in st.layers)
    assert greedy(path, **kw)[0] == greedy(path, n_gpu_layers=0)[0]


def test_assign_layers():
    """llama.cpp's rule (each layer's device, then the output layer's): the output
    layer counts as a layer, in -ngl and in the split; the interop test
    test_layer_placement_equals_llama_completion checks it against llama.cpp's log."""
    assert assign_layers(4, 99, []) == [-1] * 5
    assert assign_layers(4, 99, [1.0, 1.0]) == [0, 0, 0, 1, 1]
    assert assign_layers(12, 99, [1.0, 1.0]) == [0] * 7 + [1] * 6
    assert assign_layers(4, 99, [3.0, 1.0]) == [0, 0, 0, 0, 1]
    assert assign_layers(4, 2, [1.0]) == [-1, -1, -1, 0, 0]
    assert assign_layers(4, 1, [1.0]) == [-1, -1, -1, -1, 0]
    assert assign_layers(4, 0, [1.0]) == [-1] * 5
    assert assign_layers(5, 99, [0.0, 1.0]) == [1] * 6


def test_split_read_back_from_servers(model_path, servers):
    eps = [f"127.0.0.1:{s.port}" for s in servers]
    # the output layer counts as a fifth: 0, 1, 2 on the first; 3 and the output on the second
    with Model.load(model_path, rpc=eps, tensor_split=[1, 1]) as m:
        assert [st.layers for st in m.stages[1:]] == [[0, 1, 2], [3]]
        a, b = (s.stats()["buffer_bytes"] for s in servers)
        f = m.file
        layer = sum(t.nbytes for n, t in f.tensors.items() if n.startswith("blk.0."))
        kv = 2 * 2 * m.hp.n_embd_kv * m.n_ctx
        out = f.tensors["output.weight"].nbytes + f.tensors["output_norm.weight"].nbytes
        # what each server holds is that stage's weights + cache, compute and input buffers
        sa, sb = m.stages[1], m.stages[2]
        for srv_bytes, st in ((a, sa), (b, sb)):
            assert srv_bytes == sum(x.size for x in (*st.buffers, st.compute, st.inputs_buf))
        # weights + cache: 3 layers against 1 layer and the output (alignment padding aside)
        wa, wb = sa.buffers[0].size, sb.buffers[0].size
        assert 0 <= wa - 3 * (layer + kv) < 1024
        assert 0 <= wb - (layer + kv + out) < 1024
    # equal free memory: as -ts 1,1; -ts 3,1 leaves the second the output layer alone
    with Model.load(model_path, rpc=eps) as m:
        assert [st.layers for st in m.stages[1:]] == [[0, 1, 2], [3]]
    with Model.load(model_path, rpc=eps, tensor_split=[3, 1]) as m:
        assert [(st.layers, st.output) for st in m.stages[1:]] == [([0, 1, 2, 3], False), ([], True)]


def test_generate_api(model_path):
    with Model.load(model_path) as m:
        ids = m.tokenize(PROMPT)
        assert ids[0] == m.tokenizer.bos and m.detokenize(ids) == b" " + PROMPT.encode()
        echoed = list(m.generate(ids, 3, temp=0, echo=True))
        assert b"".join(echoed[:len(ids)]) == b" " + PROMPT.encode() and len(echoed) == len(ids) + 3
        assert m.n_past == len(ids) + 2      # the last token is not evaluated
        sampled = list(m.generate(PROMPT, 8, temp=0.9, seed=42))
        assert sampled == list(m.generate(PROMPT, 8, temp=0.9, seed=42))
        m.generate(PROMPT, 1, temp=0)
        with pytest.raises(ModelError, match="context full"):
            m.eval(list(range(3, 3 + m.n_ctx + 1)))


def run_cli(capsys, *args):
    rc = main(["run", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_errors(model_path, tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    import gguf

    other = tmp_path / "mamba.gguf"      # an architecture the runner does not build
    wr = gguf.GGUFWriter(str(other), "mamba")
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    for args, msg in ((["-m", str(tmp_path / "none.gguf")], "model file not found"),
                      (["-m", str(bad)], "is not a GGUF file"),
                      (["-m", str(other)], "architecture 'mamba' is not supported"),
                      (["-m", str(model_path), "--rpc", f"127.0.0.1:{free_port()}"], "server unreachable"),
                      (["-m", str(model_path), "--rpc", "nohost"], "invalid endpoint"),
                      (["-m", str(model_path), "-c", "8", "-p", PROMPT], "context full")):
        rc, out, err = run_cli(capsys, *args, "-n", "2")
        assert rc == 1 and msg in err and err.count("\n") == 1 and "Traceback" not in err, (args, err)


def test_cli_run_prints_prompt_and_blank_line(model_path, capfdbinary):
    rc = main(["run", "-m", str(model_path), "-p", PROMPT, "-n", "4", "--temp", "0"])
    out, _ = capfdbinary.readouterr()
    assert rc == 0 and out.startswith(b" " + PROMPT.encode()) and out.endswith(b"\n\n")


def test_second_load_comes_from_the_server_cache(tmp_path, server_proc):
    """Weights above 10 MiB go hash first: a server started with -c that has them
    cached is not sent them again, and run says how much came from the cache."""
    path = synth.write_llama(tmp_path / "big-vocab.gguf",
                             synth.LlamaShape(n_layer=1, n_embd=64, n_ff=64, n_head=2, n_head_kv=1,
                                              n_vocab=48000), "f32")
    srv = server_proc("-c", env={**os.environ, "LLAMA_CACHE": str(tmp_path / "cache")})
    argv = [sys.executable, "-P", "-m", "ggmlrpc.cli.main", "run", "-m", str(path), "--rpc", srv.endpoint,
            "-p", PROMPT, "-n", "4", "--temp", "0"]
    first = subprocess.run(argv, capture_output=True, timeout=300, cwd=tmp_path)
    second = subprocess.run(argv, capture_output=True, timeout=300, cwd=tmp_path)
    assert first.returncode == second.returncode == 0
    assert b"from the servers' caches" not in first.stderr
    out_mib = 48000 * 64 * 4 / 2**20
    assert f"{out_mib:.1f} MiB of weights came from the servers' caches".encode() in second.stderr
    assert first.stdout == second.stdout and first.stdout.startswith(b" " + PROMPT.encode())


def test_server_killed_mid_generation_and_back(model_path):
    """The server is killed after a few tokens and started again on the same port:
    generation goes on (its layers uploaded again, the context replayed batch by
    batch) and gives the text of an uninterrupted run."""
    port = free_port()
    argv = our_server_argv("-p", str(port), "-t", "1")
    srv = Proc(argv, port)
    try:
        with Model.load(model_path, rpc=f"127.0.0.1:{port}", reconnect=30) as m:
            want = list(m.generate(PROMPT, 12, temp=0))
            got = []
            for i, piece in enumerate(m.generate(PROMPT, 12, temp=0)):
                got.append(piece)
                if i == 4:
                    srv.stop()
                    srv = Proc(argv, port)
            assert got == want
    finally:
        srv.stop()


def test_server_that_never_comes_back(model_path, capsys):
    port = free_port()
    srv = Proc(our_server_argv("-p", str(port), "-t", "1"), port)
    try:
        with Model.load(model_path, rpc=f"127.0.0.1:{port}", reconnect=1.0) as m:
            gen = m.generate(PROMPT, 12, temp=0)
            next(gen)
            srv.stop()
            with pytest.raises(ModelError, match=rf"server 127.0.0.1:{port} lost and not back within 1 s"):
                list(gen)
    finally:
        srv.stop()
    # without reconnect the loss is an error at once
    srv = Proc(our_server_argv("-p", str(port), "-t", "1"), port)
    try:
        with Model.load(model_path, rpc=f"127.0.0.1:{port}") as m:
            gen = m.generate(PROMPT, 12, temp=0)
            next(gen)
            srv.stop()
            with pytest.raises(ConnectionLost):
                list(gen)
    finally:
        srv.stop()


def test_upload_progress_only_on_a_terminal():
    import io

    from ggmlrpc.cli.run import Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    quiet, tty = io.StringIO(), Tty()
    for stream in (quiet, tty):
        p = Progress(stream)
        p(1 << 20, 4 << 20)
        p(4 << 20, 4 << 20, 2 << 20)
    assert quiet.getvalue() == ""
    out = tty.getvalue()
    assert "4.0/4.0 MiB" in out and "MiB/s ETA" in out and "(2.0 MiB from server caches)" in out
    assert out.endswith("\n") and out.count("\r") == 2


def test_bench_reports_prompt_and_generation_speed(model_path, servers, capsys):
    import json

    assert main(["bench", "-m", str(model_path), "--rpc", f"127.0.0.1:{servers[0].port}",
                 "-p", "8", "-n", "4", "-r", "2", "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["test"] for r in rows] == ["pp8", "tg4"]
    assert all(r["avg_ts"] > 0 and len(r["samples_ns"]) == 2 and r["backend"] == "RPC" for r in rows)
    assert main(["bench", "-m", str(model_path), "-p", "8", "-n", "0", "-r", "1"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| model | size |") and "| pp8 |" in table[2] and len(table) == 3


def test_local_weights_stay_in_the_file_mapping(model_path):
    from ggmlrpc.errors import ValidationError

    with Model.load(model_path, n_gpu_layers=0) as m:
        (st,) = m.stages
        assert st.mapped and st.device.local
        kv = 2 * 2 * m.hp.n_embd_kv * m.n_ctx * m.hp.n_layer
        assert [b.size for b in st.buffers] == [kv]             # only the cache was allocated
        w = st.weights["blk.0.attn_q.weight"]
        assert w.buffer is m._mapped and w.data - w.buffer.base == \
            m.file.tensors["blk.0.attn_q.weight"].data.ctypes.data - m.file.reader.data.ctypes.data
        with pytest.raises(ValidationError, match="read-only"):
            st.device.backend.set_tensor(w, bytes(w.nbytes))
        assert len(list(m.generate(PROMPT, 4, temp=0))) == 4


def test_a_step_is_one_write_and_one_round_trip_per_server(model_path, servers):
    """Decoding reruns the held graph: per token and server one SET_TENSOR of the
    inputs, GRAPH_RECOMPUTE and the GET_TENSOR of the result, sent in one write, so
    the step waits for one response per server."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "netproxy", Path(__file__).resolve().parents[2] / "bench" / "netproxy.py")
    netproxy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(netproxy)
    proxies = [netproxy.Proxy(f"127.0.0.1:{s.port}", count=True) for s in servers]
    eps = [f"127.0.0.1:{p.start()}" for p in proxies]
    try:
        with Model.load(model_path, rpc=eps, tensor_split=[1, 1]) as m:
            m.eval(m.tokenize(PROMPT))
            m.eval([5])
            writes = [be.writes for be in m.backends[1:]]
            before = [p.snapshot() for p in proxies]
            for t in (6, 7, 8):
                m.eval([t])
            after = [p.snapshot() for p in proxies]
            assert [be.writes - n for be, n in zip(m.backends[1:], writes)] == [3, 3]
        for a, b in zip(before, after):
            assert {k: b[k] - a.get(k, 0) for k in b if b[k] != a.get(k, 0)} == \
                {"SET_TENSOR": 3, "GRAPH_RECOMPUTE": 3, "GET_TENSOR": 3}
    finally:
        for p in proxies:
            p.close()


def test_corked_commands_keep_their_order(servers):
    """Commands held back by corked() reach the server in call order, the queue goes
    with the next answered command or at the end of the block, and blocks nest."""
    import numpy as np

    from ggmlrpc.client import RemoteBackend
    from ggmlrpc.ggml import GGMLType

    with RemoteBackend(f"127.0.0.1:{servers[0].port}") as rb:
        buf = rb.alloc_buffer(4096)
        x = buf.tensor(GGMLType.F32, (16,))
        with rb.corked():
            rb.set_tensor(x, np.full(16, 1, np.float32))
            rb.set_tensor(x, np.arange(16, dtype=np.float32))
            with rb.corked():
                rb.memset_tensor(x, 0, offset=0, size=8)
            assert np.array_equal(rb.get_array(x), [0, 0] + list(range(2, 16)))
            rb.set_tensor(x, np.full(16, 7, np.float32))
        assert np.array_equal(rb.get_array(x), np.full(16, 7))
        with rb.corked():     # more byte strings than one native writev takes
            for i in range(12):
                rb.set_tensor(x, np.full(16, i, np.float32))
        assert np.array_equal(rb.get_array(x), np.full(16, 11))


def test_prefill_reuses_the_common_prefix(model_path, servers):
    """A context that shares a prefix with the next one runs only the rest: the logits
    are those of the same batches run from an empty context (bit for bit), and close to
    the whole sequence run as one batch."""
    with Model.load(model_path, rpc=f"127.0.0.1:{servers[0].port}") as m:
        a = m.tokenize(PROMPT)
        b = a + m.tokenize(" and his dog", add_special=False)
        c = a[:5] + m.tokenize(" a storm came", add_special=False)
        m.eval(a)
        b_split = m.eval(b[len(a):])
        m.reset()
        m.eval(a[:5])
        c_split = m.eval(c[5:])
        m.reset()
        c_whole = m.eval(c)
        m.reset()
        m.prefill(a)
        runs = len(m.history)
        assert (m.prefill(b) == b_split).all()
        assert len(m.history) == runs + 1 and m.history[-1] == b[len(a):]
        got = m.prefill(c)                       # diverges after 5 tokens
        assert m.tokens == c and m.n_past == len(c) and sum(map(len, m.history)) == len(c)
        assert (got == c_split).all() or np.allclose(got, c_split, rtol=1e-3, atol=1e-3)
        assert np.allclose(got, c_whole, rtol=1e-3, atol=1e-3)
        again = m.prefill(c)                     # the same context: its last token runs again
        assert m.n_past == len(c) and np.allclose(again, c_whole, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("change,msg", [(("nextn_predict_layers", 1), "nextn_predict_layers"),
                                        (("attention.temperature_scale", 0.5), "attention.temperature_scale")])
def test_deepseek2_files_it_cannot_run_are_one_error(tmp_path, capsys, change, msg):
    """A deepseek2 file the graph would run wrongly is refused: one `error:` line."""
    from ggmlrpc.llm.archs import deepseek2

    key, value = change
    path = tmp_path / "ds.gguf"
    s = synth._Synth(path, "deepseek2", arch_shape("deepseek2", 64), "f32", 0)
    deepseek2.write(s)
    s.w.add_key_value(f"deepseek2.{key}", value, gguf.GGUFValueType.UINT32 if isinstance(value, int)
                      else gguf.GGUFValueType.FLOAT32)
    s.finish()
    rc, out, err = run_cli(capsys, "-m", str(path), "-p", PROMPT, "-n", "2")
    assert rc == 1 and msg in err and err.startswith("error:") and err.count("\n") == 1, err
