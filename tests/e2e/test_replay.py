"""Recorded llama.cpp sessions (tests/data/traces) replayed against our server and the reference.

Every connection of every session is replayed up to its first GRAPH_COMPUTE, with
the recorded answers compared and every weight write read back. The same prefixes
(and the whole sessions, logits included) replayed against llama.cpp's own server
prove the replayer right; the negative tests prove it can fail.
"""
from __future__ import annotations

import struct
import subprocess
import sys
import time

import numpy as np
import pytest

from ggmlrpc import protocol
from ggmlrpc.protocol import Cmd, RpcTensor, TENSOR_SIZE
from ggmlrpc.trace import (AddressMap, Connection, Exchange, Replayer, TraceError, compare_f32,
                           load_connection, load_session, main, pair, read_records)
from ggmlrpc.transport import NativeConn, PyConn
from tests.conftest import TRACES

SESSIONS = sorted(p.name for p in TRACES.iterdir() if (p / "conn-00.trc").exists())


def replay_prefixes(endpoint: str, session: str):
    rp = Replayer(endpoint, stop_before=Cmd.GRAPH_COMPUTE, verify_writes=True, timeout=30)
    return rp.replay_session(TRACES / session)


def assert_clean(results):
    diffs = [f"{r.name} {d}" for r in results for d in r.differences]
    assert not diffs, "\n".join(diffs)
    # the replay did the work: the model connection stopped at its first graph,
    # after comparing answers and reading back the weights it wrote
    model = results[-1]
    assert model.stopped_before is not None
    assert model.compared > 0 and model.verified > 0
    assert all(r.sent > 0 for r in results)


def wait_idle(server, timeout=10.0):
    deadline = time.monotonic() + timeout
    while server.stats()["sessions"] and time.monotonic() < deadline:
        time.sleep(0.02)
    return server.stats()


def test_traces_present():
    assert len(SESSIONS) >= 4, f"expected the recorded sessions in {TRACES}"


@pytest.mark.parametrize("session", SESSIONS)
def test_prefix_replays_on_our_server(server, endpoint, session):
    results = replay_prefixes(endpoint, session)
    assert len(results) == len(list((TRACES / session).glob("conn-*.trc")))
    assert_clean(results)
    # every replayed connection ended and took its buffers with it
    assert wait_idle(server) == {"sessions": 0, "buffers": 0, "buffer_bytes": 0}


@pytest.mark.interop
@pytest.mark.parametrize("session", SESSIONS)
def test_prefix_replays_on_reference(ref_server, session):
    ref = ref_server()
    assert_clean(replay_prefixes(ref.endpoint, session))


@pytest.mark.interop
@pytest.mark.parametrize("session", SESSIONS)
def test_whole_session_replays_on_reference(ref_server, session):
    """The full session, graphs and logits included: graph tensor rewriting is right
    when llama.cpp's server computes the recorded logits from the translated graphs."""
    ref = ref_server()
    results = Replayer(ref.endpoint, timeout=30).replay_session(TRACES / session)
    diffs = [f"{r.name} {d}" for r in results for d in r.differences]
    assert not diffs, "\n".join(diffs)
    model = load_connection(TRACES / session / results[-1].name)
    assert results[-1].sent == len(model.exchanges)
    assert any(e.cmd == Cmd.GET_TENSOR for e in model.exchanges)


# -- the replayer can fail --------------------------------------------------------

def model_connection(session=None) -> Connection:
    return load_session(TRACES / (session or SESSIONS[0]))[-1]


def test_tampered_answer_is_reported(endpoint):
    conn = model_connection()
    e = next(e for e in conn.exchanges if e.cmd == Cmd.GET_ALLOC_SIZE)
    (size,) = struct.unpack("<Q", e.answer)
    e.answer = memoryview(struct.pack("<Q", size + 32))
    r = Replayer(endpoint, stop_before=Cmd.GRAPH_COMPUTE).replay(conn)
    assert [(d.index, d.command) for d in r.differences] == [(e.index, "GET_ALLOC_SIZE")]
    assert str(size) in r.differences[0].message


def test_untranslated_addresses_fail(endpoint, monkeypatch):
    """Our handles are not llama.cpp's pointers: without translation the first use
    of a recorded handle is rejected and the replay reports the closed connection."""
    monkeypatch.setattr(AddressMap, "rewrite", lambda self, cmd, req: (b"", memoryview(req)))
    r = Replayer(endpoint, stop_before=Cmd.GRAPH_COMPUTE).replay(model_connection())
    assert len(r.differences) == 1
    d = r.differences[0]
    assert d.command == "BUFFER_GET_BASE" and "connection lost" in d.message


def test_misplaced_writes_are_reported(endpoint, monkeypatch):
    """A server that stores one wrong byte per SET_TENSOR fails the read-back."""
    def corrupting(good):
        def recv_into_buffer(self, buffer, offset, n):
            good(self, buffer, offset, n)
            buffer.view()[offset] ^= 0x5A
        return recv_into_buffer

    for flavour in (NativeConn, PyConn):
        monkeypatch.setattr(flavour, "recv_into_buffer", corrupting(flavour.recv_into_buffer))
    r = Replayer(endpoint, stop_before=Cmd.GRAPH_COMPUTE, verify_writes=True).replay(model_connection())
    assert r.verified > 0
    assert len(r.differences) == r.verified
    assert all(d.command == "SET_TENSOR" and "first at byte 0" in d.message for d in r.differences)


def test_rejected_fire_and_forget_command_is_reported(endpoint):
    """A SET_TENSOR outside its buffer closes the connection without an answer; the
    final sync notices."""
    conn = model_connection()
    keep = []
    for e in conn.exchanges:
        keep.append(e)
        if e.cmd == Cmd.SET_TENSOR:
            req = bytearray(e.request)
            t = protocol.decode_tensor(req)
            t.data += 1 << 40
            req[:TENSOR_SIZE] = protocol.encode_tensor(t)
            keep[-1] = Exchange(e.index, e.cmd, memoryview(req))
            break
    r = Replayer(endpoint).replay(Connection("cut", keep))
    assert [d.command for d in r.differences] == ["sync"]


# -- comparison rules ---------------------------------------------------------------

def test_compare_f32(seed):
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal((3, 50)).astype(np.float32)
    assert compare_f32(ref.tobytes(), ref.tobytes(), 50, 1e-4, 1e-3) is None
    close = ref * (1 + 1e-4 * rng.standard_normal(ref.shape)).astype(np.float32)
    assert compare_f32(close.tobytes(), ref.tobytes(), 50, 1e-4, 1e-3) is None
    far = ref + 0.1 * rng.standard_normal(ref.shape).astype(np.float32)
    assert "NMSE" in compare_f32(far.tobytes(), ref.tobytes(), 50, 1e-4, 1e-3)
    # a changed top entry in row 1 that NMSE alone would accept
    ref[1, :2] = 5.0, 4.5
    top = ref.copy()
    top[1, 1] = 5.2
    assert compare_f32(top.tobytes(), ref.tobytes(), 50, 1e-2, 1e-3).startswith("row 1: top entry 1")
    # ...unless the two tops are a near-tie
    ref[2, :2] = 5.0, 4.9999
    tie = ref.copy()
    tie[2, 1] = 5.0001
    assert compare_f32(tie.tobytes(), ref.tobytes(), 50, 1e-4, 1e-3) is None
    nan = ref.copy()
    nan[0, 0] = np.nan
    assert compare_f32(nan.tobytes(), ref.tobytes(), 50, 1e-4, 1e-3) == "non-finite values differ"
    assert compare_f32(nan.tobytes(), nan.tobytes(), 50, 1e-4, 1e-3) is None


# -- address translation, field by field ---------------------------------------------

REC_H, OUR_H = 0x5555_0000_1000, 0x42
REC_BASE, OUR_BASE = 0x7F00_0000_0000, 0x1000_0000_0000


def amap() -> AddressMap:
    m = AddressMap()
    m.allocated(REC_H, OUR_H, 1 << 20)
    m.based(REC_H, REC_BASE, OUR_BASE)
    return m


def rec_tensor(i: int, off: int = 0) -> RpcTensor:
    return RpcTensor(id=100 + i, buffer=REC_H, ne=(8, 1, 1, 1), nb=(4, 32, 32, 32),
                     data=REC_BASE + off, name=f"t{i}".encode(), src=(7,) + (0,) * 9)


def assert_translated(buf, off, i, data_off=0):
    t = protocol.decode_tensor(buf, off)
    want = rec_tensor(i, data_off)
    want.buffer, want.data = OUR_H, OUR_BASE + data_off
    assert protocol.encode_tensor(t) == protocol.encode_tensor(want)


def test_rewrite_handles():
    m = amap()
    for cmd, tail in ((Cmd.FREE_BUFFER, b""), (Cmd.BUFFER_GET_BASE, b""), (Cmd.BUFFER_CLEAR, b"\x07")):
        head, rest = m.rewrite(cmd, struct.pack("<Q", REC_H) + tail)
        assert bytes(head) + bytes(rest) == struct.pack("<Q", OUR_H) + tail
    # a handle the recording never allocated travels unchanged
    head, rest = m.rewrite(Cmd.FREE_BUFFER, struct.pack("<Q", 99))
    assert bytes(head) + bytes(rest) == struct.pack("<Q", 99)


def test_rewrite_set_tensor_keeps_data():
    data = bytes(range(256)) * 3
    req = protocol.encode_tensor(rec_tensor(0, 64)) + struct.pack("<BQ", 1, 16) + data
    head, rest = amap().rewrite(Cmd.SET_TENSOR, req)
    assert len(head) == protocol.SET_TENSOR_HEADER_SIZE and bytes(rest) == data
    assert_translated(head, 0, 0, 64)
    assert bytes(head[TENSOR_SIZE:]) == struct.pack("<BQ", 1, 16)


def test_rewrite_copy_and_alloc_size_tensors():
    req = protocol.encode_tensor(rec_tensor(0)) + protocol.encode_tensor(rec_tensor(1, 128))
    head, rest = amap().rewrite(Cmd.COPY_TENSOR, req)
    assert not rest
    assert_translated(head, 0, 0)
    assert_translated(head, TENSOR_SIZE, 1, 128)
    # GET_ALLOC_SIZE: device, the tensor and ten sources; absent sources stay zero
    srcs = [protocol.encode_tensor(rec_tensor(i, 32 * i)) if i % 3 else bytes(TENSOR_SIZE)
            for i in range(1, 11)]
    req = struct.pack("<I", 5) + protocol.encode_tensor(rec_tensor(0)) + b"".join(srcs)
    assert len(req) == protocol.REQUEST_SIZE[Cmd.GET_ALLOC_SIZE]
    head, rest = amap().rewrite(Cmd.GET_ALLOC_SIZE, req)
    assert bytes(head[:4]) == struct.pack("<I", 5) and not rest
    assert_translated(head, 4, 0)
    for i in range(1, 11):
        off = 4 + i * TENSOR_SIZE
        if i % 3:
            assert_translated(head, off, i, 32 * i)
        else:
            assert bytes(head[off:off + TENSOR_SIZE]) == bytes(TENSOR_SIZE)


def test_rewrite_graph_tensors_and_keep_trailing_bytes():
    local = RpcTensor(id=1, ne=(8, 1, 1, 1), nb=(4, 32, 32, 32), name=b"host")
    tensors = [local] + [rec_tensor(i, 64 * i) for i in range(1, 4)]
    payload = protocol.encode_graph(0, [102, 103], tensors) + b"trailing"
    head, rest = amap().rewrite(Cmd.GRAPH_COMPUTE, payload)
    assert bytes(rest) == b"trailing"
    off = 8 + 8 * 2 + 4
    assert bytes(head[:off]) == payload[:off]
    assert bytes(head[off:off + TENSOR_SIZE]) == protocol.encode_tensor(local)
    for i in range(1, 4):
        assert_translated(head, off + i * TENSOR_SIZE, i, 64 * i)


def test_address_by_range_when_the_buffer_field_is_unknown():
    m = amap()
    assert m.address(0xDEAD, REC_BASE + 100) == OUR_BASE + 100
    assert m.address(REC_H, 0) == 0


# -- the file format -------------------------------------------------------------------

def write_trc(path, records, magic=b"GRPCTRC1"):
    with open(path, "wb") as f:
        f.write(magic)
        for d, c, p in records:
            f.write(struct.pack("<BBQ", d, c, len(p)) + p)


def test_records_and_pairing(tmp_path):
    p = tmp_path / "conn-00.trc"
    write_trc(p, [(0, Cmd.HELLO, bytes(24)), (1, 255, b"\x07\x00\x00\x00" + bytes(24)),
                  (0, Cmd.SET_TENSOR, b"x" * 400), (0, Cmd.DEVICE_COUNT, b""), (1, 255, b"\1\0\0\0")])
    recs = read_records(p)
    assert [(r.direction, r.command, len(r.payload)) for r in recs] == [
        (0, 14, 24), (1, 255, 28), (0, 6, 400), (0, 15, 0), (1, 255, 4)]
    ex = load_connection(p).exchanges
    assert [(e.cmd, None if e.answer is None else bytes(e.answer)) for e in ex] == [
        (14, b"\x07\x00\x00\x00" + bytes(24)), (6, None), (15, b"\1\0\0\0")]


@pytest.mark.parametrize("records, magic, what", [
    ([], b"GRPCTRC2", "not a trace"),
    ([(0, 15, b"")], b"GRPCTRC1", None),
    ([(1, 255, b"\0" * 4)], b"GRPCTRC1", "without a request"),
    ([(0, 15, b""), (0, 15, b"")], b"GRPCTRC1", "still waited"),
    ([(2, 15, b"")], b"GRPCTRC1", "direction 2"),
])
def test_malformed_traces(tmp_path, records, magic, what):
    p = tmp_path / "conn-00.trc"
    write_trc(p, records, magic)
    if what is None:
        assert [e.cmd for e in load_connection(p).exchanges] == [15]
        return
    with pytest.raises(TraceError, match=what):
        pair(read_records(p))


def test_truncated_record(tmp_path):
    p = tmp_path / "conn-00.trc"
    write_trc(p, [(0, Cmd.HELLO, bytes(24))])
    p.write_bytes(p.read_bytes()[:-1])
    with pytest.raises(TraceError, match="claims 24 bytes"):
        read_records(p)
    p.write_bytes(b"GRPCTRC1\0\x0e")
    with pytest.raises(TraceError, match="truncated record header"):
        read_records(p)


# -- command line ------------------------------------------------------------------------

def test_cli_replays_a_session(endpoint):
    session = TRACES / SESSIONS[-1]
    r = subprocess.run([sys.executable, "-P", "-m", "ggmlrpc.trace", str(session), endpoint,
                        "--stop-before", "GRAPH_COMPUTE", "--verify-writes"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    n = len(load_session(session))
    assert lines[-1] == f"{n} connections, 0 differences"
    assert sum(line.startswith("conn-") for line in lines) == n
    assert "stopped before" in lines[-2]


def test_cli_reports_differences(capsys, tmp_path):
    # nothing listens on a port we just held and released: every connection fails
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main([str(TRACES / SESSIONS[0]), f"127.0.0.1:{port}"]) == 1
    out = capsys.readouterr().out
    assert "cannot connect" in out
    assert main([str(tmp_path), f"127.0.0.1:{port}"]) == 2
