"""Prometheus metrics (ggmlrpc.metrics): what a scrape of /metrics says after known traffic.

Every scrape goes over HTTP and through prometheus_client's parser. Request and
response sizes are the protocol's (docs/protocol.md), written out here from the frames
the raw client builds. A server counts a command once its response is sent, so
a test that reads counters of a live connection first completes one more command
(a fence) and asserts nothing about that one.
"""
from __future__ import annotations

import os
import socket
import struct
import sys
import textwrap
import time
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ggmlrpc import __version__, protocol
from ggmlrpc.client import RemoteBackend, op
from ggmlrpc.ggml import GGMLOp, GGMLType
from ggmlrpc.metrics import LATENCY_BUCKETS, Metrics, parse_endpoint
from tests.conftest import Proc, free_port, our_server_argv, start_server
from tests.protocol.rawclient import (DEVICE_COUNT, GET_ALIGNMENT, GET_MAX_SIZE, GET_TENSOR, HELLO_ANSWER, Raw,
                                      SET_TENSOR, frame, tensor, u32, wait_for)

TENSOR = 296  # rpc_tensor
HEAD = 9      # | cmd u8 | size u64 |
SIZE = 8      # | size u64 | of a response


class Scrape:
    """One parsed scrape: value(name, **labels) of any sample."""

    def __init__(self, text: str):
        self.text = text
        self.samples = {}
        self.types = {}
        for fam in text_string_to_metric_families(text):
            self.types[fam.name] = fam.type
            for s in fam.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def value(self, name: str, **labels) -> float:
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def series(self, name: str) -> dict:
        """{frozenset(labels): value} of every sample of that name."""
        return {labels: v for (n, labels), v in self.samples.items() if n == name}

    def reasons(self, name: str) -> dict[str, float]:
        return {dict(k)["reason"]: v for k, v in self.series(name).items()}


def scrape(port: int) -> Scrape:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        return Scrape(r.read().decode())


class Metered:
    """Our server in this process with metrics served on a free loopback port."""

    def __init__(self, codec_name="native", cache_dir=None, n_devices=1):
        self.server = start_server(codec_name, cache_dir=cache_dir, n_devices=n_devices)
        self.metrics = Metrics(self.server)
        self.server.metrics = self.metrics   # before the first connection
        self.port = self.metrics.serve("127.0.0.1", 0)
        self.endpoint = f"127.0.0.1:{self.server.port}"

    def scrape(self) -> Scrape:
        return scrape(self.port)

    def wait(self, what: str, pred) -> Scrape:
        """Scrape until pred(scrape) holds (connections end on their own threads)."""
        last = []

        def ok():
            last[:] = [self.scrape()]
            return pred(last[0])
        wait_for(ok, what=what)
        return last[0]

    def close(self):
        self.server.close()
        self.metrics.close()


@pytest.fixture
def metered():
    m = Metered()
    yield m
    m.close()


@pytest.fixture
def metered_any(codec_name):
    """With each codec: they send responses through different paths."""
    m = Metered(codec_name)
    yield m
    m.close()


def balanced(s: Scrape) -> bool:
    """accepted = open + refused + closed."""
    return s.value("ggmlrpc_connections_accepted_total") == (
        s.value("ggmlrpc_connections_open") + sum(s.reasons("ggmlrpc_connections_refused_total").values())
        + sum(s.reasons("ggmlrpc_connections_closed_total").values()))


# -- commands ----------------------------------------------------------------------------

def test_commands_counted_with_their_bytes(metered_any):
    metered = metered_any
    with Raw(metered.server.port) as raw:
        raw.hello()
        for _ in range(3):
            raw.call(DEVICE_COUNT, rsp_size=4)
        raw.call(GET_ALIGNMENT, u32(0), rsp_size=8)
        handle, base = raw.alloc(4096)                      # ALLOC_BUFFER, BUFFER_GET_BASE
        t = tensor(buffer=handle, ne=(1024,), data=base, name=b"t")
        raw.set_tensor(t, os.urandom(1000))                 # no response
        raw.get_tensor(t, 8, 300)
        raw.call(GET_MAX_SIZE, u32(0), rsp_size=8)          # the fence
        s = metered.scrape()

    want = {  # command: (count, request bytes, response bytes)
        "HELLO": (1, HEAD + 24, SIZE + 28),
        "DEVICE_COUNT": (3, 3 * HEAD, 3 * (SIZE + 4)),
        "GET_ALIGNMENT": (1, HEAD + 4, SIZE + 8),
        "ALLOC_BUFFER": (1, HEAD + 12, SIZE + 16),
        "BUFFER_GET_BASE": (1, HEAD + 8, SIZE + 8),
        "SET_TENSOR": (1, HEAD + TENSOR + 1 + 8 + 1000, 0),
        "GET_TENSOR": (1, HEAD + TENSOR + 16, SIZE + 300),
    }
    for cmd, (n, rx, tx) in want.items():
        got = (s.value("ggmlrpc_commands_total", command=cmd),
               s.value("ggmlrpc_command_request_bytes_total", command=cmd),
               s.value("ggmlrpc_command_response_bytes_total", command=cmd))
        assert got == (n, rx, tx), cmd
    seen = {dict(k)["command"] for k in s.series("ggmlrpc_commands_total")}
    assert seen - set(want) <= {"GET_MAX_SIZE"}      # nothing else, commands never seen absent

    # every timed command lands in exactly one latency bucket
    assert s.types["ggmlrpc_command_seconds"] == "histogram"
    for cmd, (n, _, _) in want.items():
        if cmd == "HELLO":
            continue
        series = {float(dict(k)["le"]): v for k, v in s.series("ggmlrpc_command_seconds_bucket").items()
                  if dict(k)["command"] == cmd}
        assert sorted(series) == [*LATENCY_BUCKETS, float("inf")]
        buckets = [series[le] for le in sorted(series)]
        assert buckets == sorted(buckets) and buckets[-1] == n, cmd
        assert s.value("ggmlrpc_command_seconds_count", command=cmd) == n
        assert s.value("ggmlrpc_command_seconds_sum", command=cmd) > 0


def test_closed_connections_fold_into_the_totals(metered):
    """Counters survive their connection: two clients' commands add up."""
    for _ in range(2):
        with RemoteBackend(metered.endpoint) as rb:
            rb.device_count()
    s = metered.wait("both closed",
                     lambda s: s.value("ggmlrpc_connections_closed_total", reason="client") == 2)
    assert s.value("ggmlrpc_commands_total", command="DEVICE_COUNT") == 2
    assert s.value("ggmlrpc_commands_total", command="HELLO") == 2
    assert s.value("ggmlrpc_connections_open") == 0 and balanced(s)


# -- connections and the reasons they ended ------------------------------------------------

def test_connections_by_reason(metered):
    srv = metered.server
    with Raw(srv.port) as raw:                       # the client hangs up
        raw.hello()
    with Raw(srv.port) as raw:                       # no HELLO first: refused
        raw.send(frame(DEVICE_COUNT))
        raw.expect_closed()
    with Raw(srv.port) as raw:                       # an unknown command
        raw.hello()
        raw.send(frame(200))
        raw.expect_closed()
    with Raw(srv.port) as raw:                       # a buffer it does not own
        raw.hello()
        raw.send(frame(GET_TENSOR, tensor(buffer=0x1234, data=0x1000) + struct.pack("<QQ", 0, 4)))
        raw.expect_closed()
    with Raw(srv.port) as raw:                       # a SET_TENSOR shorter than its header
        raw.hello()
        raw.send(frame(SET_TENSOR, b"", size=10) + bytes(10))
        raw.expect_closed()
    with RemoteBackend(metered.endpoint) as rb:      # an op the server cannot run
        buf = rb.alloc_buffer(1 << 16)
        a = buf.tensor(GGMLType.F32, (16,), offset=0, name="a")
        c = op(GGMLOp.FLASH_ATTN_BACK, GGMLType.F32, (16,), a, a, a, a, name="c")
        c.buffer, c.data = buf, buf.base + 4096
        rb.graph_compute([c])
        with pytest.raises(Exception):
            rb.device_count()
    stay = Raw(srv.port)
    stay.hello()
    want_closed = {"client": 1, "protocol": 2, "invalid": 1, "unsupported": 1}
    s = metered.wait("every reason counted", lambda s: all(
        s.value("ggmlrpc_connections_closed_total", reason=r) == n for r, n in want_closed.items()))
    assert s.reasons("ggmlrpc_connections_refused_total") == {"hello": 1}
    assert {r: v for r, v in s.reasons("ggmlrpc_connections_closed_total").items() if v} == want_closed
    assert s.value("ggmlrpc_connections_accepted_total") == 7
    assert s.value("ggmlrpc_connections_open") == 1 and balanced(s)

    srv.close()                                      # the last one ends with the server
    s = metered.wait("shutdown counted",
                     lambda s: s.value("ggmlrpc_connections_closed_total", reason="shutdown") == 1)
    assert s.value("ggmlrpc_connections_open") == 0 and balanced(s)
    stay.close()


# -- graphs and memory ------------------------------------------------------------------------

def test_graphs_and_memory_by_device():
    m = Metered(n_devices=2)
    try:
        with RemoteBackend(m.endpoint) as rb:
            buf = rb.alloc_buffer(1 << 20, device=1)
            rb.alloc_buffer(4096, device=0)        # a buffer on the other device too
            a = buf.tensor(GGMLType.F32, (256, 4), offset=0, name="a")
            b = buf.tensor(GGMLType.F32, (256, 4), offset=4096, name="b")
            rb.set_tensor(a, np.ones(1024, np.float32))
            rb.set_tensor(b, np.arange(1024, dtype=np.float32))
            c = op(GGMLOp.ADD, GGMLType.F32, (256, 4), a, b, name="c")
            d = op(GGMLOp.MUL, GGMLType.F32, (256, 4), c, b, name="d")
            c.buffer, c.data = buf, buf.base + 8192
            d.buffer, d.data = buf, buf.base + 12288
            rb.graph_compute([c, d], device=1)
            rb.graph_recompute(device=1)
            rb.graph_recompute(device=1)
            rb.synchronize()
            s = m.scrape()
            dev = {"device": "CPU#1"}
            assert s.value("ggmlrpc_graph_computes_total", kind="compute", **dev) == 1
            assert s.value("ggmlrpc_graph_computes_total", kind="recompute", **dev) == 2
            assert s.value("ggmlrpc_graph_nodes_total", kind="compute", **dev) == 2
            assert s.value("ggmlrpc_graph_nodes_total", kind="recompute", **dev) == 4
            assert s.value("ggmlrpc_graph_seconds_total", kind="compute", **dev) > 0
            assert s.value("ggmlrpc_graph_computes_total", kind="compute", device="CPU#0") == 0
            assert s.value("ggmlrpc_device_buffers", **dev) == 1
            assert s.value("ggmlrpc_device_buffer_bytes", **dev) == 1 << 20
            assert s.value("ggmlrpc_device_buffer_bytes", device="CPU#0") == 4096
            assert s.value("ggmlrpc_device_stored_plans", **dev) == 1
            assert s.value("ggmlrpc_device_stored_plans", device="CPU#0") == 0
            assert s.value("ggmlrpc_device_memory_total_bytes", **dev) > 0
            assert s.value("ggmlrpc_device_memory_used_bytes", **dev) >= 1 << 20
            assert s.value("ggmlrpc_device_memory_used_bytes", device="CPU#0") >= 4096
            assert s.value("ggmlrpc_device_memory_limit_bytes", **dev) == m.server.ledgers[1].limit > 0

            buf.free()                       # drops the stored plans as well
            rb.synchronize()
            s = m.scrape()
            assert s.value("ggmlrpc_device_buffers", **dev) == 0
            assert s.value("ggmlrpc_device_stored_plans", **dev) == 0
            assert s.value("ggmlrpc_device_buffers", device="CPU#0") == 1
        s = m.wait("closed", lambda s: s.value("ggmlrpc_connections_open") == 0)
        assert s.value("ggmlrpc_device_buffers", device="CPU#0") == 0   # freed with the session
        assert s.value("ggmlrpc_device_memory_used_bytes", device="CPU#0") == 0
        assert s.value("ggmlrpc_graph_computes_total", kind="recompute", **dev) == 2  # kept
    finally:
        m.close()


def test_scrapes_during_traffic_only_grow(metered, seed):
    """Clients come and go, allocate, compute and free while scrapes run: every
    scrape parses, no counter ever goes back, and the connection counts balance."""
    import random
    import threading

    stop = threading.Event()
    errors = []

    def client(k):
        rng = random.Random(seed + k)
        try:
            while not stop.is_set():
                with RemoteBackend(metered.endpoint) as rb:
                    for _ in range(rng.randrange(1, 6)):
                        buf = rb.alloc_buffer(1 << 16)
                        a = buf.tensor(GGMLType.F32, (256,), offset=0, name="a")
                        rb.set_tensor(a, np.full(256, k, np.float32))
                        c = op(GGMLOp.ADD, GGMLType.F32, (256,), a, a, name="c")
                        c.buffer, c.data = buf, buf.base + 4096
                        rb.graph_compute([c])
                        rb.graph_recompute()
                        assert rb.get_array(c)[0] == 2 * k
                        buf.free()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    try:
        last = {}
        for _ in range(30):
            s = metered.scrape()
            assert balanced(s)
            counters = {k: v for k, v in s.samples.items()
                        if k[0].endswith(("_total", "_count", "_sum", "_bucket"))}
            for k, v in counters.items():
                assert v >= last.get(k, 0), k
            last = counters
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    s = metered.wait("all closed", lambda s: s.value("ggmlrpc_connections_open") == 0)
    assert s.value("ggmlrpc_graph_computes_total", device="CPU", kind="compute") == \
        s.value("ggmlrpc_graph_computes_total", device="CPU", kind="recompute") > 0
    assert s.value("ggmlrpc_device_buffers", device="CPU") == 0 and balanced(s)


# -- the local cache ------------------------------------------------------------------------

def test_cache_hits_misses_and_files(tmp_path, seed):
    cache_dir = tmp_path / "rpc"
    cache_dir.mkdir()
    m = Metered(cache_dir=str(cache_dir))
    data = np.random.default_rng(seed).integers(0, 256, protocol.HASH_THRESHOLD + 4096,
                                                dtype=np.uint8).tobytes()
    try:
        s = m.scrape()
        assert s.value("ggmlrpc_cache_files") == 0 and s.value("ggmlrpc_cache_disk_bytes") == 0
        with RemoteBackend(m.endpoint) as rb:
            buf = rb.alloc_buffer(len(data))
            t = buf.tensor(GGMLType.I8, (len(data),), name="w")
            assert rb.set_tensor(t, data, weights=True) is False     # miss, then stored
            rb.synchronize()
            s = m.scrape()
        assert (s.value("ggmlrpc_cache_misses_total"), s.value("ggmlrpc_cache_hits_total")) == (1, 0)
        assert s.value("ggmlrpc_cache_stores_total") == 1
        assert s.value("ggmlrpc_cache_files") == 1
        assert s.value("ggmlrpc_cache_disk_bytes") == len(data)
        assert s.value("ggmlrpc_cache_saved_bytes_total") == 0
        # the bytes came over the wire once
        assert s.value("ggmlrpc_command_request_bytes_total", command="SET_TENSOR") > len(data)

        with RemoteBackend(m.endpoint) as rb:
            buf = rb.alloc_buffer(len(data))
            t = buf.tensor(GGMLType.I8, (len(data),), name="w")
            assert rb.set_tensor(t, data, weights=True) is True      # hit
            rb.synchronize()
            s2 = m.scrape()
        assert (s2.value("ggmlrpc_cache_misses_total"), s2.value("ggmlrpc_cache_hits_total")) == (1, 1)
        assert s2.value("ggmlrpc_cache_saved_bytes_total") == len(data)
        assert s2.value("ggmlrpc_cache_files") == 1 and s2.value("ggmlrpc_cache_stores_total") == 1
        assert (s2.value("ggmlrpc_command_request_bytes_total", command="SET_TENSOR")
                == s.value("ggmlrpc_command_request_bytes_total", command="SET_TENSOR"))
    finally:
        m.close()


def test_no_cache_no_cache_gauges(metered):
    s = metered.scrape()
    assert "ggmlrpc_cache_files" not in s.types
    assert s.value("ggmlrpc_cache_hits_total") == 0


# -- info, the process, the command line -------------------------------------------------------

def test_build_info_and_process_metrics(metered_any, codec_name):
    s = metered_any.scrape()
    info = s.series("ggmlrpc_build_info")
    assert list(info.values()) == [1.0]
    labels = dict(next(iter(info)))
    assert labels == {"version": __version__, "protocol": "7.0.0", "codec": codec_name,
                      "transport": "TCP"}
    assert s.value("process_resident_memory_bytes") > 0


@pytest.mark.parametrize("text, want", [("9100", ("127.0.0.1", 9100)),
                                        ("127.0.0.1:0", ("127.0.0.1", 0)),
                                        ("10.0.0.2:9100", ("10.0.0.2", 9100))])
def test_parse_endpoint(text, want):
    assert parse_endpoint(text) == want


@pytest.mark.parametrize("text", ["localhost:9100", "1.2.3.4:x", "1.2.3.4:70000", ":", ""])
def test_parse_endpoint_rejects(text):
    with pytest.raises(ValueError):
        parse_endpoint(text)


def test_cli_metrics_option():
    port, mport = free_port(), free_port()
    p = Proc(our_server_argv("-p", str(port), "--metrics", f"127.0.0.1:{mport}"), port)
    try:
        with RemoteBackend(p.endpoint) as rb:
            rb.device_count()
            rb.synchronize()
            s = scrape(mport)
        assert s.value("ggmlrpc_connections_open") == 1
        assert s.value("ggmlrpc_commands_total", command="DEVICE_COUNT") >= 1
        out, err = p.output()
        assert f"  metrics        : http://127.0.0.1:{mport}/metrics" in out.splitlines()
        assert "WARNING" not in err
    finally:
        p.stop()


def test_cli_metrics_other_host_warns():
    """Any host but 127.0.0.1 gets -H's loud warning (127.0.0.2 is still loopback)."""
    port, mport = free_port(), free_port()
    p = Proc(our_server_argv("-p", str(port), "--metrics", f"127.0.0.2:{mport}"), port)
    try:
        assert scrape_at("127.0.0.2", mport).value("ggmlrpc_connections_open") == 0
        _, err = p.output()
        assert "WARNING: Host ('127.0.0.2') is != '127.0.0.1'" in err
        assert "Never expose the metrics endpoint to an open network!" in err
    finally:
        p.stop()


def scrape_at(host: str, port: int) -> Scrape:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
        return Scrape(r.read().decode())


@pytest.mark.parametrize("value", ["nohost:1", "127.0.0.1:99999"])
def test_cli_metrics_bad_value(value):
    import subprocess
    r = subprocess.run(our_server_argv("--metrics", value), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1
    assert "error:" in r.stderr and "Invalid parameters" in r.stderr


def test_off_by_default(server_proc):
    p = server_proc()
    with RemoteBackend(p.endpoint) as rb:
        rb.device_count()
    out, _ = p.output()
    assert "metrics" not in out


def test_readme_names_every_metric(tmp_path):
    """Every ggmlrpc_* family a scrape shows is in the README's table."""
    from pathlib import Path
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    m = Metered(cache_dir=str(tmp_path))
    try:
        with RemoteBackend(m.endpoint) as rb:
            rb.device_count()
            rb.synchronize()
            s = m.scrape()
    finally:
        m.close()
    names = {n for n in s.types if n.startswith("ggmlrpc_")}
    assert len(names) >= 20
    for name in names:
        suffix = "_total" if s.types[name] == "counter" else ""
        assert f"`{name}{suffix}`" in readme, name


def test_connection_over_the_cap_counted_as_refused():
    """A connection turned away by --max-clients before any session exists is counted
    under its reason, and accepted = open + refused + closed still holds."""
    m = Metered()
    try:
        m.server.limits.max_clients = 1
        with RemoteBackend(m.endpoint) as held:
            assert held.device_count() == 1
            extra = Raw(m.server.port)    # the server closes it without a word
            try:
                s = m.wait("a refusal over the cap",
                           lambda s: s.value("ggmlrpc_connections_refused_total", reason="max_clients") == 1)
            finally:
                extra.close()
            assert s.value("ggmlrpc_connections_open") == 1
            closed = sum(s.reasons("ggmlrpc_connections_closed_total").values())
            refused = sum(s.reasons("ggmlrpc_connections_refused_total").values())
            assert s.value("ggmlrpc_connections_accepted_total") == 1 + refused + closed
    finally:
        m.close()


LOW_FDS = textwrap.dedent("""
    import resource, runpy, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    sys.argv = ["ggml-rpc-server", *sys.argv[1:]]
    runpy.run_module("ggmlrpc.cli.server", run_name="__main__")
""")


def test_idle_metrics_connections_leave_rpc_clients_served():
    """A server with 128 descriptors: 300 connections to the metrics port that never
    send a byte. The metrics port serves a few at a time and times them out, neither
    port takes the descriptor reserve, so an RPC client is still served meanwhile,
    and a scrape is answered once the idle ones are gone."""
    port, mport = free_port(), free_port()
    p = Proc([sys.executable, "-P", "-c", LOW_FDS, "-p", str(port), "--metrics", f"127.0.0.1:{mport}"], port)
    idle = []
    try:
        for _ in range(300):
            try:
                idle.append(socket.create_connection(("127.0.0.1", mport), timeout=5))
            except OSError:
                break   # refused, or nothing accepted any more: enough
        time.sleep(0.5)    # let the server accept what it will
        for _ in range(3):
            with Raw(port) as r:
                assert r.hello() == HELLO_ANSWER
        assert p.proc.poll() is None

        def scraped():
            try:
                return scrape(mport).value("ggmlrpc_connections_accepted_total") >= 1
            except OSError:
                return False
        wait_for(scraped, 60, "a scrape answered")
    finally:
        for s in idle:
            s.close()
        _, err = p.stop()
    assert "Traceback" not in err, err[-2000:]        # timed-out scrapes are no errors
