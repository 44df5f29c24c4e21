"""The real llama.cpp client against our server, and our server against llama.cpp's.

`llama-completion --rpc` drives a server exactly as a llama.cpp cluster does: a
dozen short probe connections, then one session that allocates, uploads every
offloaded weight, and computes graphs. Both servers run with GGML_RPC_DEBUG and
the same assertions read their debug lines (the formats match), so the reference
run checks the test itself. Where our CPU executor still lacks an op of the
model's graph, our server must refuse that graph: log the op, close only that
connection, and serve the next client.
"""
from __future__ import annotations

import os
import re
import struct
import subprocess
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from ggmlrpc import ggml, protocol
from ggmlrpc.client import RemoteBackend, op
from ggmlrpc.errors import ServerClosed
from ggmlrpc.ggml import GGMLOp, GGMLType
from tests.conftest import MODELS, TRACES

pytestmark = pytest.mark.interop

HEX = r"(?:0x)?([0-9a-f]+)"


def trace_graph_ops(trace: str) -> set[int]:
    """Ops of the nodes a backend runs in the recorded session's graphs."""
    data = (TRACES / trace / "conn-12.trc").read_bytes()
    ops, off = set(), 8
    while off < len(data):
        direction, cmd, n = struct.unpack_from("<BBQ", data, off)
        off += 10
        if direction == 0 and cmd == protocol.Cmd.GRAPH_COMPUTE:
            _, node_ids, tensors = protocol.decode_graph(data[off:off + n])
            by_id = {t.id: t for t in tensors}
            ops.update(t.op for t in map(by_id.get, node_ids)
                       if t.flags & ggml.TensorFlag.COMPUTE and t.op not in ggml.VIEW_OPS and all(t.ne))
        off += n
    return ops


def unsupported_ops(ops: set[int]) -> set[int]:
    """The ops our CPU executor has no kernel for (empty once it covers the model).
    The executor's op table: compute.cpu_rules.RULES, or the older compute.cpu.KERNELS."""
    from ggmlrpc.compute import cpu

    table = getattr(cpu, "KERNELS", None)
    if table is None:
        from ggmlrpc.compute import cpu_rules
        table = cpu_rules.RULES
    return ops - set(table)


def offloaded_weights(model: Path) -> list[tuple[int, int, int]]:
    """(nbytes, ggml type, ne[0]) of the tensors `-ngl 99` puts on the RPC device:
    all but the token embeddings, which llama.cpp keeps in host memory."""
    import gguf

    reader = gguf.GGUFReader(model)
    return [(int(t.n_bytes), int(t.tensor_type), int(t.shape[0]))
            for t in reader.tensors if t.name != "token_embd.weight"]


class DebugLog:
    """GGML_RPC_DEBUG lines of a server (ours prints the reference's formats)."""

    def __init__(self, text: str):
        self.text = text

    def sessions(self) -> list["DebugLog"]:
        """The log cut at each HELLO: one piece per connection when connections do
        not overlap (the reference serves one at a time; llama.cpp's client opens
        its main session after closing its probes)."""
        pieces = re.split(r"(?m)^(?=\[hello\])", self.text)
        return [DebugLog(p) for p in pieces if p.startswith("[hello]")]

    def lines(self, tag: str) -> list[str]:
        return [line for line in self.text.splitlines() if line.startswith(f"[{tag}]")]

    def allocs(self) -> list[tuple[int, int]]:
        """(remote_ptr, size) of each successful ALLOC_BUFFER, in order."""
        pat = re.compile(r"size: (\d+) -> remote_ptr: " + HEX)
        return [(int(m[2], 16), int(m[1])) for m in map(pat.search, self.lines("alloc_buffer")) if m]

    def by_buffer(self, tag: str, field: str = "size") -> dict[int, list[int]]:
        """For set_tensor / init_tensor lines: buffer -> the `field` of each line."""
        pat = re.compile(r"buffer: " + HEX + rf".*\b{field}: " + HEX)
        out: dict[int, list[int]] = {}
        for line in self.lines(tag):
            m = pat.search(line)
            val = int(m[2]) if field == "size" else int(m[2], 16)
            out.setdefault(int(m[1], 16), []).append(val)
        return out


def llama_completion(ref_bin: Path, model: Path, endpoint: str, extra: list[str]):
    argv = [str(ref_bin / "llama-completion"), "-m", str(model), "--rpc", endpoint,
            "-ngl", "99", "--temp", "0", "-s", "1", "-n", "4", "-no-cnv", "--simple-io",
            "-p", "hello world", *extra]
    # the client aborts on a closed connection; skip its attempt to attach a debugger
    env = dict(os.environ, GGML_NO_BACKTRACE="1")
    return subprocess.run(argv, capture_output=True, text=True, errors="replace", env=env,
                          timeout=120)


def llama_completion_runs(ref_bin: Path, model: Path, endpoint: str, extra: list[str]) -> list:
    """Every attempt at one llama-completion run: the client now and then loses its
    output at exit (its stdout ends before the closing blank line, or is empty; seen with
    no RPC server at all), and such a run is repeated, at most four times in all. Each
    attempt is a session the server saw."""
    attempts = []
    for _ in range(4):
        attempts.append(llama_completion(ref_bin, model, endpoint, extra))
        if attempts[-1].returncode != 0 or attempts[-1].stdout.endswith("\n\n"):
            break
    return attempts


def wait_all_closed(srv, timeout: float = 10.0) -> None:
    """Until the server has printed the end of every connection it accepted."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out, _ = srv.output()
        if out.count("Client connection closed") == out.count("Accepted client connection"):
            return
        time.sleep(0.02)


MODEL_RUNS = [  # model file, its recorded session (same flash-attention choice), extra flags
    pytest.param("llama-f32.gguf", "llama-f32", [], id="f32"),
    pytest.param("llama-q4_0.gguf", "llama-q4_0-nofa", ["-fa", "off"], id="q4_0-nofa"),
]


@pytest.mark.parametrize("kind", ["reference", "ours"])
@pytest.mark.parametrize("model_file, trace, extra", MODEL_RUNS)
def test_llama_completion_session(request, ref_bin, server_proc, kind, model_file, trace, extra):
    model = MODELS / model_file
    start = request.getfixturevalue("ref_server") if kind == "reference" else server_proc
    srv = start("-t", "1", env=dict(os.environ, GGML_RPC_DEBUG="1"))
    missing = unsupported_ops(trace_graph_ops(trace)) if kind == "ours" else set()

    # ours serves clients concurrently: a bystander connection must outlive whatever
    # happens to the llama.cpp sessions (the reference would make them wait for it)
    bystander = RemoteBackend(srv.endpoint) if kind == "ours" else None
    if bystander:
        held = bystander.alloc_buffer(64).tensor(GGMLType.I32, (16,))
        bystander.set_tensor(held, np.arange(16, dtype=np.int32))
    tries = [llama_completion_runs(ref_bin, model, srv.endpoint, extra) for _ in range(2)]
    runs = [r for attempts in tries for r in attempts]
    if bystander:
        np.testing.assert_array_equal(bystander.get_array(held), np.arange(16))
        bystander.close()
    with RemoteBackend(srv.endpoint) as rb:  # still serving after both sessions
        assert rb.device_count() == 1
    wait_all_closed(srv)
    out, err = srv.stop()
    log = DebugLog(err)

    # probes and handshake: every connection said HELLO and was closed again
    n_conn = out.count("Accepted client connection")
    assert n_conn >= 2 * len(runs) + 1
    assert out.count("Client connection closed") == n_conn
    assert len(log.lines("hello")) == n_conn
    assert all(line.endswith("version: 7.0.0") for line in log.lines("hello"))
    if kind == "ours":  # the reference answers DEVICE_COUNT without a debug line
        assert len(log.lines("device_count")) >= 2
    assert log.lines("get_device_memory")
    assert any(line.endswith("alignment: 32") for line in log.lines("get_alignment"))
    assert log.lines("get_max_size")

    # each session put all offloaded weights in one buffer with SET_TENSOR
    # (and INIT_TENSOR for exactly the quantized ones with ne[0] % 512 != 0)
    weights = offloaded_weights(model)
    padded = sum(1 for _, t, ne0 in weights if ggml.is_quantized(t) and ne0 % 512)
    uploads = []
    for s in log.sessions():
        sets = s.by_buffer("set_tensor")
        inits = s.by_buffer("init_tensor", field="data")
        bases = {int(m[1], 16) for m in map(re.compile(r"remote_ptr: " + HEX).search,
                                             s.lines("buffer_get_base"))}
        uploads += [(h in bases, len(inits.get(h, []))) for h, _ in s.allocs()
                    if Counter(sets.get(h, [])) == Counter(n for n, _, _ in weights)]
    assert uploads == [(True, padded)] * len(runs), err[-3000:]

    # and reached GRAPH_COMPUTE
    assert len(log.lines("graph_compute")) >= len(runs)
    if not missing:
        assert all(r.returncode == 0 for r in runs), runs[-1].stderr[-3000:]
        for r in (attempts[-1] for attempts in tries):
            assert r.stdout.startswith(" hello world") and len(r.stdout) > len(" hello world")
        assert log.lines("graph_recompute") and log.lines("get_tensor")
    else:
        # Our executor lacks ops of this graph (until it lands): the server refuses
        # the graph, names the op, closes that connection; the client aborts.
        names = {ggml.op_name(o) for o in missing}
        refused = re.findall(r"op (\w+) .*not supported", err)
        assert len(refused) == len(runs) and set(refused) <= names, err[-3000:]
        for r in runs:
            assert r.returncode != 0
            assert "Remote RPC server crashed" in r.stderr, r.stderr[-3000:]


def command_script(rb: RemoteBackend) -> list[tuple[str, object]]:
    """A fixed sequence of commands; the answers with handles and addresses reduced
    to what both servers must agree on."""
    rng = np.random.default_rng(1234)
    seen: list[tuple[str, object]] = []

    def note(label, value):
        seen.append((label, value))

    note("version", rb.version)
    note("caps", rb.server_caps)
    note("device_count", rb.device_count())
    note("memory_total", rb.get_device_memory(0)[1])
    note("alignment", rb.get_alignment(0))
    note("max_size", rb.get_max_size(0))
    bufs = [rb.alloc_buffer(n) for n in (100_000, 4096, 0, 33)]
    note("alloc", [(b.size, b.handle != 0, b.base % 32 == 0, b.base != 0) for b in bufs])
    note("alloc_huge", rb.alloc_buffer(1 << 50))
    main = bufs[0]

    f = main.tensor(GGMLType.F32, (100, 7), offset=256)
    q4 = main.tensor(GGMLType.Q4_0, (160, 3), offset=8192)
    q8 = main.tensor(GGMLType.Q8_0, (96, 7), offset=16384)
    i8 = main.tensor(GGMLType.I8, (4096,), offset=32768)
    mm = op(GGMLOp.MUL_MAT, GGMLType.F32, (3, 7), q4, q8)
    note("alloc_size", [rb.get_alloc_size(t) for t in (q4, q8, mm)])
    rb.init_tensor(q4)
    rb.init_tensor(q8)

    values = rng.standard_normal((7, 100), dtype=np.float32)
    rb.set_tensor(f, values)
    rb.set_tensor(i8, rng.integers(-128, 128, 4096, dtype=np.int8))
    rb.set_tensor(q4, rng.integers(0, 256, q4.nbytes, dtype=np.uint8))
    note("get_f32", bytes(rb.get_tensor(f)))
    note("get_part", bytes(rb.get_tensor(f, offset=40, size=400)))
    note("get_empty", bytes(rb.get_tensor(f, offset=0, size=0)))
    rb.memset_tensor(i8, 0x7F, offset=100, size=1000)
    note("memset", bytes(rb.get_tensor(i8)))
    dst = bufs[1].tensor(GGMLType.Q4_0, (160, 3), offset=64)
    note("copy", rb.copy_tensor(q4, dst))
    note("copied", bytes(rb.get_tensor(dst)))  # fresh reference buffers hold garbage
    bufs[1].clear(0xEE)
    note("cleared", bytes(rb.get_tensor(bufs[1].tensor(GGMLType.I8, (4096,)))))
    note("hash_miss", rb.set_tensor_hash(q8, 0x0123456789ABCDEF))
    note("q4_after_init", bytes(rb.get_tensor(q4)))
    bufs[3].free()
    note("still_there", bytes(rb.get_tensor(f, size=64)))
    try:
        rb.buffer_get_base(bufs[3].handle)
        note("freed_handle", "answered")
    except ServerClosed:
        note("freed_handle", "closed")
    note("connected", rb.connected)
    return seen


def test_same_answers_from_both_servers(server_proc, ref_server):
    answers = {}
    for kind, start in (("reference", ref_server), ("ours", server_proc)):
        srv = start("-t", "1")
        with RemoteBackend(srv.endpoint) as rb:
            answers[kind] = command_script(rb)
        srv.stop()
    ref, ours = answers["reference"], answers["ours"]
    assert [label for label, _ in ours] == [label for label, _ in ref]
    for (label, want), (_, got) in zip(ref, ours):
        assert got == want, label
