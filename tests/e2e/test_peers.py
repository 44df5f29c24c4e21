"""-sm row over servers linked to each other (ggmlrpc.peers): the same logits as the
host's combines and as one device, one write per server per token, plain v7 for
every peer that did not ask for the extension, and clean failures."""
from __future__ import annotations

import logging
import struct

import numpy as np
import pytest

from ggmlrpc import peers
from ggmlrpc.client import RemoteBackend
from ggmlrpc.errors import ConnectionLost, GgmlRpcError
from ggmlrpc.llm import synth
from ggmlrpc.llm.gguf_file import ModelError
from ggmlrpc.llm.model import Model
from ggmlrpc.server import Limits
from tests.conftest import nmse, start_server
from tests.e2e.test_row_split import PROMPT, SHAPE, logits
from tests.protocol.rawclient import HELLO, Raw, frame, wait_stats


@pytest.fixture(scope="module")
def linked():
    """Three of our servers started with --peers."""
    srvs = [start_server(limits=Limits(peers=True)) for _ in range(3)]
    yield [f"127.0.0.1:{s.port}" for s in srvs], srvs
    for s in srvs:
        s.close()


@pytest.mark.parametrize("arch,dtype", [("llama", "f32"), ("llama", "q8_0"), ("qwen3moe", "f32"),
                                        ("llama-moe", "q8_0")])
def test_linked_servers_give_the_hosts_logits(tmp_path, linked, arch, dtype):
    """Bit for bit the logits of the host's combines ("gather" cuts the same way),
    so within NMSE 1e-6 of one device: 2 and 3 servers, equal and unequal -ts, with and
    without flash attention, layers and the output layer left on the CPU; dense
    feed-forwards and routed experts (each expert cut by its rows)."""
    eps, _ = linked
    path = synth.write_model(tmp_path / "m.gguf", arch, SHAPE, dtype, seed=7)
    for fa in (True, False):
        one = logits(path, n_gpu_layers=0, flash_attn=fa)
        for kw in (dict(rpc=eps[:2], tensor_split=[1, 1]), dict(rpc=eps[:2], tensor_split=[3, 1]),
                   dict(rpc=eps, tensor_split=[2, 1, 1]), dict(rpc=eps[:2], tensor_split=[1, 1], n_gpu_layers=2),
                   dict(rpc=eps[:2], tensor_split=[1, 1], n_gpu_layers=3)):
            with Model.load(path, split_mode="row", flash_attn=fa, **kw) as m:
                assert m.rows.linked
            row = logits(path, split_mode="row", flash_attn=fa, **kw)
            host = logits(path, split_mode="row", flash_attn=fa, peers=False, **kw)
            assert all(np.array_equal(a, b) for a, b in zip(row, host)), (fa, kw)
            assert max(nmse(a, b) for a, b in zip(row, one)) <= 1e-6, (fa, kw)


@pytest.mark.parametrize("name", ["mistral3", "qwen2moe", "gemma2", "gemma3", "gpt-oss", "glm4moe", "llama4", "phi2", "phi3", "minimax-m2"])
def test_linked_servers_cut_other_architectures(tmp_path, linked, name):
    """The architectures cut as their own layers (the pieces gathered where they
    meet: heads before the attention's projection, each feed-forward's hidden rows,
    shared and routed experts included, and its output rows): the single device's
    logits bit for bit over linked servers, with and without flash attention
    (sliding-window layers too), equal and unequal -ts, a layer left on the CPU; and
    the same with the host putting the pieces together (--no-peers: the relay's
    segments, a round trip per gather and one per layer)."""
    import dataclasses
    from ggmlrpc.llm.archs import ARCHS
    eps, _ = linked
    arch = next(a for a in ARCHS.values() if name in a.synth)
    path = synth.write_model(tmp_path / "m.gguf", name, dataclasses.replace(SHAPE, **arch.test_shape), "f32", seed=5)
    for fa in (True, False):
        one = logits(path, n_gpu_layers=0, flash_attn=fa)
        for kw in (dict(tensor_split=[1, 1]), dict(tensor_split=[3, 1]), dict(tensor_split=[1, 1], n_gpu_layers=2)):
            row = logits(path, rpc=eps[:2], split_mode="row", flash_attn=fa, **kw)
            assert all(np.array_equal(a, b) for a, b in zip(row, one)), (fa, kw)
        host = logits(path, rpc=eps[:2], split_mode="row", flash_attn=fa, tensor_split=[3, 1], peers=False)
        assert all(np.array_equal(a, b) for a, b in zip(host, one)), fa


def test_a_token_is_one_write_per_server(tmp_path, linked):
    eps, _ = linked
    path = synth.write_model(tmp_path / "m.gguf", "qwen3", SHAPE, "q8_0", seed=7)
    with Model.load(path, rpc=eps[:2], split_mode="row", tensor_split=[1, 1]) as m:
        assert m.rows.linked
        lg = m.eval(m.tokenize(PROMPT))
        m.eval([int(np.argmax(lg))])                 # the decode graph goes out once
        bes = [sh.stage.device.backend for sh in m.rows.shards]
        before = [b.writes for b in bes]
        for t in range(3):
            m.eval([t + 5])
        assert [b.writes - w for b, w in zip(bes, before)] == [3, 3]
    with Model.load(path, rpc=eps[:2], split_mode="row", tensor_split=[1, 1], peers=False) as m:
        m.eval(m.tokenize(PROMPT))
        m.eval([5])
        bes = [sh.stage.device.backend for sh in m.rows.shards]
        before = [b.writes for b in bes]
        m.eval([6])
        assert all(b.writes - w > 3 * m.hp.n_layer for b, w in zip(bes, before))


def test_negotiation(linked, server_proc):
    """Only a client that asks gets the extension, and only from a server with --peers."""
    eps, _ = linked
    plain = start_server()
    try:
        for ep, ask, want in ((eps[0], True, True), (eps[0], False, False),
                              (f"127.0.0.1:{plain.port}", True, False)):
            with RemoteBackend(ep, peers=ask) as b:
                assert b.peers is want
                assert b.server_caps == (peers.PEER_CAPS if want else bytes(24))
    finally:
        plain.close()
    p = server_proc("--peers", "-t", "1")      # the command-line option
    with RemoteBackend(f"127.0.0.1:{p.port}", peers=True) as b:
        assert b.peers


def test_servers_without_the_option_combine_on_the_host(tmp_path, caplog):
    path = synth.write_model(tmp_path / "m.gguf", "llama", SHAPE, "f32", seed=7)
    srvs = [start_server(limits=Limits(peers=True)), start_server()]
    try:
        eps = [f"127.0.0.1:{s.port}" for s in srvs]
        with Model.load(path, rpc=eps, split_mode="row", tensor_split=[1, 1]) as m:
            assert not m.rows.linked
        row = logits(path, rpc=eps, split_mode="row", tensor_split=[1, 1])
        assert max(nmse(a, b) for a, b in zip(row, logits(path, n_gpu_layers=0))) <= 1e-6
    finally:
        for s in srvs:
            s.close()


def test_a_peer_that_cannot_be_reached(tmp_path, linked, caplog, monkeypatch):
    """A rank whose endpoint is not a linked server: every rank answers PEER_GROUP
    with 0 after logging why, and the host combines the results itself."""
    monkeypatch.setattr(peers, "LINK_TIMEOUT", 1.0)
    eps, srvs = linked
    caplog.set_level(logging.WARNING)
    plain = start_server()
    try:
        bes = [RemoteBackend(eps[0], peers=True), RemoteBackend(eps[1], peers=True)]
        names = [eps[0], eps[1], f"127.0.0.1:{plain.port}"]
        answers = [b.request_peer_group(99, r, names) for r, b in enumerate(bes)]
        assert [a() for a in answers] == [False, False]
        assert any("cannot link to rank 2" in r.getMessage() and "--peers" in r.getMessage()
                   for r in caplog.records)
        for b in bes:                      # the connections still work
            assert b.device_count() == 1
            b.close()
    finally:
        plain.close()


def test_a_lost_peer_fails_the_step_not_the_servers(tmp_path):
    path = synth.write_model(tmp_path / "m.gguf", "llama", SHAPE, "f32", seed=7)
    srvs = [start_server(limits=Limits(peers=True)) for _ in range(2)]
    try:
        eps = [f"127.0.0.1:{s.port}" for s in srvs]
        m = Model.load(path, rpc=eps, split_mode="row", tensor_split=[1, 1])
        assert m.rows.linked
        m.eval(m.tokenize(PROMPT))
        srvs[1].close()
        with pytest.raises(GgmlRpcError):
            m.eval([3])
        m.close()
        wait_stats(srvs[0], sessions=0)
        with RemoteBackend(eps[0]) as b:               # the survivor serves new clients
            assert b.device_count() == 1
    finally:
        for s in srvs:
            s.close()


# -- hostile ----------------------------------------------------------------------------

def test_extension_commands_need_the_negotiation(linked):
    """On a plain-v7 connection PEER_GROUP and PEER_LINK are unknown commands."""
    _, srvs = linked
    for cmd in (peers.CMD_PEER_GROUP, peers.CMD_PEER_LINK):
        with Raw(srvs[0].port) as raw:
            raw.hello()
            raw.send(frame(cmd, peers.group_request(1, 0, ["127.0.0.1:1", "127.0.0.1:2"])))
            raw.expect_closed()


def negotiated(port: int) -> Raw:
    raw = Raw(port)
    rsp = raw.call(HELLO, peers.PEER_CAPS, 28)
    assert rsp[12:] == peers.PEER_CAPS
    return raw


@pytest.mark.parametrize("payload", [
    b"",                                                          # too short
    struct.pack("<QII", 1, 0, 1) + b"127.0.0.1:1".ljust(64, b"\0"),   # one rank
    struct.pack("<QII", 1, 2, 2) + b"\0" * 128,                   # rank out of range
    struct.pack("<QII", 1, 0, 2) + b"nohost".ljust(64, b"\0") * 2,    # not host:port
    struct.pack("<QII", 1, 0, 20) + b"\0" * 64 * 20,              # too many ranks
])
def test_bad_peer_group(linked, payload):
    _, srvs = linked
    with negotiated(srvs[0].port) as raw:
        raw.send(frame(peers.CMD_PEER_GROUP, payload))
        raw.expect_closed()
    with RemoteBackend(f"127.0.0.1:{srvs[0].port}") as b:
        assert b.device_count() == 1


def test_peer_link_to_an_unknown_group(linked, monkeypatch):
    monkeypatch.setattr(peers, "LINK_TIMEOUT", 0.3)
    _, srvs = linked
    with negotiated(srvs[0].port) as raw:
        assert raw.call(peers.CMD_PEER_LINK, struct.pack("<QI", 12345, 0), 1)[8:] == b"\0"
        raw.expect_closed()


def gather_graph(b: RemoteBackend, rank: int, bounds: list[int]) -> None:
    """A graph of one OP_GATHER node whose source (4 floats) and destination (8) are
    in a new buffer of `b`'s."""
    from ggmlrpc import builder as B
    from ggmlrpc.ggml import GGMLType
    buf = b.alloc_buffer(1 << 12)
    src = buf.tensor(GGMLType.F32, (4, 1), 0, name="src")
    dst = buf.tensor(GGMLType.F32, (8, 1), 64, name="dst")
    node = B._node(peers.OP_GATHER, GGMLType.F32, (8, 1), src, params=peers.gather_params(rank, bounds),
                   name="gather")
    node.buffer, node.data = dst.buffer, dst.data
    b.graph_compute([node])


def test_gather_nodes_that_are_refused(linked, caplog):
    """The extension's op on a connection that made no group is refused like any op
    past ggml's; in a group, one that does not fit it (bounds, rank) is refused too:
    the connection closes, the server serves on."""
    eps, srvs = linked
    caplog.set_level(logging.INFO, logger="ggmlrpc")
    with RemoteBackend(eps[0], peers=True) as b:
        gather_graph(b, 0, [0, 4, 8])
        with pytest.raises((ConnectionLost, GgmlRpcError)):
            b.device_count()
    assert any("invalid op" in r.getMessage() for r in caplog.records)
    for rank, bounds, why in ((0, [0, 2, 8], "is not rows"), (1, [0, 4, 8], "this server is rank 0"),
                              (0, [0, 4, 9], "do not cut")):
        bes = [RemoteBackend(ep, peers=True) for ep in eps[:2]]
        answers = [b.request_peer_group(7 + rank, r, eps[:2]) for r, b in enumerate(bes)]
        assert [a() for a in answers] == [True, True]
        gather_graph(bes[0], rank, bounds)
        with pytest.raises((ConnectionLost, GgmlRpcError)):
            bes[0].device_count()
        assert any(why in r.getMessage() for r in caplog.records), why
        for b in bes:
            b.close()
    with RemoteBackend(eps[0]) as b:
        assert b.device_count() == 1


def test_exchanges_in_the_metrics(tmp_path):
    """ggmlrpc_peer_exchanges_total counts four gathers per layer per token (the heads,
    the attention projection's rows, the hidden rows, the down rows; the output
    layer's rows come back to the host), and their seconds are part of the graph's."""
    from ggmlrpc.metrics import Metrics
    from tests.e2e.test_metrics import scrape
    path = synth.write_model(tmp_path / "m.gguf", "llama", SHAPE, "f32", seed=7)
    srvs = [start_server(limits=Limits(peers=True)) for _ in range(2)]
    ports = []
    for s in srvs:
        s.metrics = Metrics(s)
        ports.append(s.metrics.serve("127.0.0.1", 0))
    try:
        with Model.load(path, rpc=[f"127.0.0.1:{s.port}" for s in srvs], split_mode="row",
                        tensor_split=[1, 1]) as m:
            m.eval(m.tokenize(PROMPT))
            before = [scrape(p) for p in ports]
            for t in range(4):
                m.eval([t + 3])
            after = [scrape(p) for p in ports]
        for a, b in zip(before, after):
            assert b.value("ggmlrpc_peer_exchanges_total") - a.value("ggmlrpc_peer_exchanges_total") \
                == 4 * 4 * SHAPE.n_layer
            waited = b.value("ggmlrpc_peer_exchange_seconds_total") - a.value("ggmlrpc_peer_exchange_seconds_total")
            graphs = sum(b.value("ggmlrpc_graph_seconds_total", device=d, kind=k)
                         - a.value("ggmlrpc_graph_seconds_total", device=d, kind=k)
                         for d in ("CPU",) for k in ("compute", "recompute"))
            assert 0 < waited < graphs
    finally:
        for s in srvs:
            s.close()
            s.metrics.close()


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_linked_servers_run_several_sequences(tmp_path, linked, name):
    """serve -np: sequences of different lengths in one step, each one's logits those
    of the host's combines (bit for bit, llama) and within NMSE 1e-6 of one device
    (gemma2's sliding-window layers too, with and without flash attention: bit for
    bit)."""
    import dataclasses
    from ggmlrpc.llm.archs import ARCHS
    eps, _ = linked
    arch = next(a for a in ARCHS.values() if name in a.synth)
    path = synth.write_model(tmp_path / "m.gguf", name, dataclasses.replace(SHAPE, **arch.test_shape), "q8_0", seed=7)

    def run(**kw):
        with Model.load(path, n_seq=3, **kw) as m:
            a, b, c = m.seq, m.new_sequence(), m.new_sequence()
            out = m.decode([(a, [1, 5, 9, 20]), (b, [1, 7, 3]), (c, [2])])
            if kw.get("split_mode"):
                assert m.rows.linked is kw.get("peers", True)
            out += m.decode([(a, [11]), (c, [12, 13])]) + m.decode([(a, [4]), (b, [5]), (c, [6])])
            return out + m.decode([(a, list(range(20, 32))), (b, [8])])    # a past gemma2's window

    for fa in (True, False) if name != "llama" else (True,):
        one = run(n_gpu_layers=0, flash_attn=fa)
        row = run(rpc=eps[:2], split_mode="row", tensor_split=[1, 1], flash_attn=fa)
        if name == "llama":
            host = run(rpc=eps[:2], split_mode="row", tensor_split=[1, 1], peers=False)
            assert all(np.array_equal(a, b) for a, b in zip(row, host))
            assert max(nmse(a, b) for a, b in zip(row, one)) <= 1e-6
        else:
            assert all(np.array_equal(a, b) for a, b in zip(row, one)), fa


def test_a_peer_that_never_answers_stalls_no_one_else(tmp_path, monkeypatch):
    """A client makes a group of two servers and sends a gather graph to one only:
    that server's exchange waits for a piece that never comes, and meanwhile gives
    the device to the other clients (a bystander's graphs run as usual); after
    EXCHANGE_TIMEOUT it fails that connection alone."""
    import threading
    import time

    from ggmlrpc import builder as B
    from ggmlrpc.ggml import GGMLType
    monkeypatch.setattr(peers, "EXCHANGE_TIMEOUT", 4.0)
    srvs = [start_server(limits=Limits(peers=True)) for _ in range(2)]
    try:
        eps = [f"127.0.0.1:{s.port}" for s in srvs]
        bes = [RemoteBackend(ep, peers=True) for ep in eps]
        answers = [b.request_peer_group(5, r, eps) for r, b in enumerate(bes)]
        assert [a() for a in answers] == [True, True]
        stuck = {}

        def attacker():
            gather_graph(bes[0], 0, [0, 4, 8])
            try:
                bes[0].device_count()
            except GgmlRpcError as e:
                stuck["error"] = e
            stuck["done"] = time.monotonic()

        t = threading.Thread(target=attacker)
        t.start()
        time.sleep(0.5)                     # the exchange is waiting now
        with RemoteBackend(eps[0]) as b:    # a bystander on the same device
            buf = b.alloc_buffer(1 << 12)
            x = buf.tensor(GGMLType.F32, (8,), 0, name="x")
            b.set_tensor(x, np.arange(8, dtype=np.float32).tobytes())
            y = B.add(x, x, name="y")
            y.buffer, y.data = buf, buf.base + 64
            for _ in range(5):
                b.graph_compute([y])
                assert np.array_equal(np.frombuffer(b.get_tensor(y), np.float32), 2 * np.arange(8))
            assert "done" not in stuck          # all of it while the exchange still waited
        t.join(30)
        assert isinstance(stuck.get("error"), GgmlRpcError)
        for b in bes:
            b.close()
        wait_stats(srvs[0], sessions=0)
        with RemoteBackend(eps[0]) as b:
            assert b.device_count() == 1
    finally:
        for s in srvs:
            s.close()


def test_cli_says_when_linked_and_no_peers_turns_it_off(tmp_path, linked, capfd):
    from ggmlrpc.cli.main import main
    eps, _ = linked
    path = synth.write_model(tmp_path / "m.gguf", "llama", SHAPE, "f32", seed=7)
    outs = []
    for extra in ([], ["--no-peers"]):
        capfd.readouterr()
        assert main(["run", "-m", str(path), "--rpc", ",".join(eps[:2]), "-sm", "row", "-ts", "1,1",
                     "-p", PROMPT, "-n", "6", "--temp", "0", *extra]) == 0
        out, err = capfd.readouterr()
        assert ("the 2 servers swap their results directly" in err) == (not extra)
        outs.append(out)
    assert outs[0] == outs[1] and len(outs[0]) > len(PROMPT)
