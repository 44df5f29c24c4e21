"""Prometheus metrics of a running server (`ggml-rpc-server --metrics HOST:PORT`).

Counting stays off the hot path: each connection counts into its own counters,
written only by that connection's thread, without locks: per command a native
``CommandCounters`` (two clock reads and four additions in C around the
session's dispatch; ``PyCommandCounters`` is its pure-Python twin), and for the
rarer events (graphs, cache, GET_TENSOR bytes) plain ints in ``SessionStats``.
``Metrics`` folds them together when Prometheus scrapes: the live connections'
counters plus the totals of the connections that have ended, added in once, when
a connection ends. A scrape may see a connection's counters a command behind;
every number only ever grows. Response bytes follow from the protocol's response
sizes (RESPONSE_SIZE) and the GET_TENSOR bytes sent.

What is shown (the names as exposed):

    ggmlrpc_build_info{version,protocol,codec,transport}      1
    ggmlrpc_connections_open                                   gauge
    ggmlrpc_connections_accepted_total                         counter
    ggmlrpc_connections_refused_total{reason}                  counter
    ggmlrpc_connections_closed_total{reason}                   counter
    ggmlrpc_commands_total{command}                            counter
    ggmlrpc_command_request_bytes_total{command}               counter
    ggmlrpc_command_response_bytes_total{command}              counter
    ggmlrpc_command_seconds{command}                           histogram
    ggmlrpc_graph_computes_total{device,kind}                  counter
    ggmlrpc_graph_nodes_total{device,kind}                     counter
    ggmlrpc_graph_seconds_total{device,kind}                   counter
    ggmlrpc_peer_exchanges_total                               counter (--peers)
    ggmlrpc_peer_exchange_seconds_total                        counter (--peers: of the graph
                                                               seconds, those in exchanges)
    ggmlrpc_device_buffers{device}                             gauge
    ggmlrpc_device_buffer_bytes{device}                        gauge
    ggmlrpc_device_stored_plans{device}                        gauge
    ggmlrpc_device_scratch_bytes{device}                       gauge
    ggmlrpc_device_memory_total_bytes{device}                  gauge
    ggmlrpc_device_memory_limit_bytes{device}                  gauge (--mem-limit)
    ggmlrpc_device_memory_used_bytes{device}                   gauge (against the limit)
    ggmlrpc_device_memory_free_bytes{device}                   gauge
    ggmlrpc_cache_hits_total                                   counter
    ggmlrpc_cache_misses_total                                 counter
    ggmlrpc_cache_saved_bytes_total                            counter
    ggmlrpc_cache_stores_total                                 counter
    ggmlrpc_cache_files, ggmlrpc_cache_disk_bytes              gauge (with -c)

plus prometheus_client's process_* metrics of the server process.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import re
import sys
import threading
from bisect import bisect_left
from collections import Counter
from time import perf_counter_ns

from . import __version__, protocol
from .errors import (ConnectionLost, DeviceError, GgmlRpcError, ProtocolError, RpcTimeout,
                     UnsupportedError, ValidationError)
from .protocol import CMD_COUNT, CONN_CAPS_SIZE, HEADER, RESPONSE_SIZE, SIZE, Cmd
from .transport import in_fd_reserve

try:
    from ._native.counters import CommandCounters as _NativeCounters
except ImportError:  # pragma: no cover - only without the built extension
    _NativeCounters = None

log = logging.getLogger("ggmlrpc.metrics")

# Upper bounds of the command latency buckets, in seconds (+Inf follows).
LATENCY_BUCKETS = (10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
                   25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5, 5.0, 10.0)
_BOUNDS_NS = tuple(round(b * 1e9) for b in LATENCY_BUCKETS)
_NB = len(_BOUNDS_NS) + 1  # buckets per command, the last one +Inf

_HELLO_REQUEST = HEADER.size + CONN_CAPS_SIZE
_CACHE_FILE = re.compile(r"^[0-9a-f]{16}$")

# Why a connection ended, grouped by the exception the session logged.
REASONS = ("client", "shutdown", "timeout", "protocol", "invalid", "unsupported", "device",
           "error", "internal")


def close_reason(exc: BaseException | None, closing: bool) -> str:
    """The group of the reason a session ended with (its exception)."""
    if isinstance(exc, RpcTimeout):
        return "timeout"
    if isinstance(exc, ConnectionLost) or exc is None:
        return "shutdown" if closing else "client"
    if isinstance(exc, UnsupportedError):
        return "unsupported"
    if isinstance(exc, ValidationError):
        return "invalid"
    if isinstance(exc, ProtocolError):
        return "protocol"
    if isinstance(exc, DeviceError):
        return "device"
    if isinstance(exc, GgmlRpcError):
        return "error"
    return "internal"


class PyCommandCounters:
    """The pure-Python twin of ggmlrpc._native.counters.CommandCounters: `dispatch`
    stands in for a session's dispatch, times the real one and counts the command
    once it returns (a command that raises is not counted; the connection's close
    reason says why it ended)."""

    def __init__(self, dispatch, n_commands: int, bounds_ns, header_size: int):
        self._dispatch = dispatch
        self.bounds = tuple(bounds_ns)
        self.nb = len(self.bounds) + 1
        self.header = header_size
        self.count = [0] * n_commands
        self.rx = [0] * n_commands
        self.ns = [0] * n_commands
        self.hist = [0] * (n_commands * self.nb)

    def dispatch(self, cmd: int, size: int) -> None:
        t0 = perf_counter_ns()
        self._dispatch(cmd, size)
        dt = perf_counter_ns() - t0
        self.count[cmd] += 1
        self.rx[cmd] += self.header + size
        self.ns[cmd] += dt
        self.hist[cmd * self.nb + bisect_left(self.bounds, dt)] += 1  # le: dt <= bound

    def snapshot(self):
        return list(self.count), list(self.rx), list(self.ns), list(self.hist)


def command_counters(dispatch, native: bool):
    """Counters around `dispatch`: the native ones unless told otherwise or not built."""
    cls = _NativeCounters if native and _NativeCounters is not None else PyCommandCounters
    return cls(dispatch, CMD_COUNT, _BOUNDS_NS, HEADER.size)


class SessionStats:
    """One connection's counters, written only by the connection's own thread. The
    per-command ones (`commands`) exist only while a metrics collector is attached."""

    __slots__ = ("greeted", "commands", "get_tensor_bytes", "graphs", "cache_hits",
                 "cache_misses", "cache_saved", "cache_stores")

    def __init__(self):
        self.greeted = False
        self.commands = None              # PyCommandCounters or the native twin
        self.get_tensor_bytes = 0         # GET_TENSOR data sent (responses of variable size)
        self.graphs: dict[tuple[int, str], list] = {}  # (device, kind) -> [runs, nodes, ns]
        self.cache_hits = 0
        self.cache_misses = 0
        self.cache_saved = 0              # bytes a cache hit kept off the wire
        self.cache_stores = 0             # cache files written

    def hello(self) -> None:
        """The HELLO exchange went through: the connection is being served."""
        self.greeted = True

    def graph(self, device: int, kind: str, n_nodes: int, ns: int) -> None:
        g = self.graphs.get((device, kind))
        if g is None:
            g = self.graphs[(device, kind)] = [0, 0, 0]
        g[0] += 1
        g[1] += n_nodes
        g[2] += ns

    def cache_hit(self, n: int) -> None:
        self.cache_hits += 1
        self.cache_saved += n


class Totals:
    """Counters summed over connections: what a scrape shows."""

    def __init__(self):
        self.count = [0] * CMD_COUNT
        self.rx = [0] * CMD_COUNT
        self.ns = [0] * CMD_COUNT
        self.hist = [0] * (CMD_COUNT * _NB)
        self.get_tensor_bytes = 0
        self.graphs: dict[tuple[int, str], list] = {}
        self.cache = [0, 0, 0, 0]         # hits, misses, saved bytes, stores

    def add(self, stats: SessionStats | Totals) -> None:
        if isinstance(stats, Totals):
            parts = (stats.count, stats.rx, stats.ns, stats.hist)
            cache = stats.cache
        else:
            parts = stats.commands.snapshot() if stats.commands is not None else ()
            cache = (stats.cache_hits, stats.cache_misses, stats.cache_saved, stats.cache_stores)
            if stats.greeted:  # exchanged before the command loop: counted, not timed
                self.count[Cmd.HELLO] += 1
                self.rx[Cmd.HELLO] += _HELLO_REQUEST
        for mine, theirs in zip((self.count, self.rx, self.ns, self.hist), parts):
            for i, v in enumerate(theirs):
                if v:
                    mine[i] += v
        for key, g in list(stats.graphs.items()):
            mine = self.graphs.setdefault(key, [0, 0, 0])
            for i in range(3):
                mine[i] += g[i]
        self.get_tensor_bytes += stats.get_tensor_bytes
        self.cache = [a + b for a, b in zip(self.cache, cache)]

    def response_bytes(self, cmd: int) -> int:
        """Responses are fixed by the protocol but for GET_TENSOR's data."""
        size = RESPONSE_SIZE[cmd]
        if size is None:
            return 0
        if size < 0:
            return self.count[cmd] * SIZE.size + self.get_tensor_bytes
        return self.count[cmd] * (SIZE.size + size)


def parse_endpoint(text: str) -> tuple[str, int]:
    """`HOST:PORT` or `PORT` (on 127.0.0.1): a numeric IPv4 address and a TCP port
    (0 picks a free one). Raises ValueError saying what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host = "127.0.0.1"
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(f"metrics host must be a numeric IPv4 address: {host!r}") from None
    try:
        p = int(port)
    except ValueError:
        raise ValueError(f"invalid metrics port: {port!r}") from None
    if not 0 <= p <= 65535:
        raise ValueError(f"invalid metrics port: {port!r}")
    return host, p


class Metrics:
    """The server's collector: attach it with ``server.metrics = Metrics(server)``
    before the server accepts, then ``serve(host, port)`` for the HTTP endpoint
    (or register it with a prometheus_client registry of your own)."""

    def __init__(self, server):
        self.server = server
        self._lock = threading.Lock()    # taken once per connection, never per command
        self._live: dict = {}            # Session -> SessionStats
        self._ended = Totals()           # the sum over connections that have ended
        self._accepted = 0
        self._refused: Counter[str] = Counter()
        self._closed: Counter[str] = Counter()
        names = [d.name for d in server.devices]
        self._labels = [n if names.count(n) == 1 else f"{n}#{i}" for i, n in enumerate(names)]
        self.httpd = None

    # -- hooks the server calls (once per connection) --------------------------
    def attach(self, session) -> None:
        """A connection was accepted: count its commands from now on."""
        stats = session.stats
        stats.commands = command_counters(session.dispatch, session.server.native)
        session.dispatch = stats.commands.dispatch
        with self._lock:
            self._accepted += 1
            self._live[session] = session.stats

    def detach(self, session) -> None:
        """A connection ended (session.end holds why): fold its counters in. One that
        failed its HELLO counts as refused, any other as closed."""
        stats = session.stats
        reason = close_reason(session.end, self.server._closing.is_set())
        with self._lock:
            if self._live.pop(session, None) is None:
                return
            self._ended.add(stats)
            if not stats.greeted and reason not in ("client", "shutdown", "timeout"):
                self._refused["hello"] += 1
            else:
                self._closed[reason] += 1

    def refused(self, reason: str) -> None:
        """A connection turned away before a session was made for it (a limit)."""
        with self._lock:
            self._accepted += 1
            self._refused[reason] += 1

    # -- the HTTP endpoint -----------------------------------------------------
    def serve(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Serve /metrics on host:port in a daemon thread; returns the port. At most
        HTTP_MAX_CONNECTIONS are served at once (more are closed on arrival), each
        has HTTP_TIMEOUT seconds per read or write, and none takes the server's
        descriptor reserve: the metrics port is no second way to starve the RPC one."""
        from wsgiref.simple_server import make_server

        from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        ProcessCollector(registry=registry)
        server_cls, handler_cls = _http_classes()
        self.httpd = make_server(host, port, make_wsgi_app(registry), server_cls,
                                 handler_class=handler_cls)
        threading.Thread(target=self.httpd.serve_forever, daemon=True, name="metrics-http").start()
        return self.httpd.server_address[1]

    def close(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    # -- the scrape --------------------------------------------------------------
    def snapshot(self):
        """(stats summed over every connection, live sessions, accepted, refused, closed)."""
        total = Totals()
        with self._lock:
            live = list(self._live.items())
            total.add(self._ended)
            accepted = self._accepted
            refused, closed = Counter(self._refused), Counter(self._closed)
        for _, stats in live:
            total.add(stats)
        return total, [s for s, _ in live], accepted, refused, closed

    def collect(self):
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily, InfoMetricFamily)

        srv = self.server
        total, sessions, accepted, refused, closed = self.snapshot()
        version = f"{protocol.PROTO_MAJOR}.{protocol.PROTO_MINOR}.{protocol.PROTO_PATCH}"
        yield InfoMetricFamily("ggmlrpc_build", "ggmlrpc and wire protocol versions",
                               value={"version": __version__, "protocol": version,
                                      "codec": srv.codec.name, "transport": "TCP"})

        yield GaugeMetricFamily("ggmlrpc_connections_open", "client connections being served",
                                value=len(sessions))
        yield CounterMetricFamily("ggmlrpc_connections_accepted", "client connections accepted",
                                  value=accepted)
        fam = CounterMetricFamily("ggmlrpc_connections_refused",
                                  "connections turned away before serving them", labels=["reason"])
        for reason in sorted(set(refused) | {"hello"}):
            fam.add_metric([reason], refused[reason])
        yield fam
        fam = CounterMetricFamily("ggmlrpc_connections_closed",
                                  "connections ended, by the reason the server logged",
                                  labels=["reason"])
        for reason in REASONS:
            fam.add_metric([reason], closed[reason])
        yield fam

        yield from self._commands(total, CounterMetricFamily, HistogramMetricFamily)
        yield from self._graphs(total, CounterMetricFamily)
        n, secs = srv.peer_groups.totals()
        yield CounterMetricFamily("ggmlrpc_peer_exchanges", "pieces swapped with linked servers (-sm row)",
                                  value=n)
        yield CounterMetricFamily("ggmlrpc_peer_exchange_seconds",
                                  "time graphs spent swapping pieces with linked servers, waits included",
                                  value=secs)
        yield from self._devices(sessions, GaugeMetricFamily)
        yield from self._cache(total, CounterMetricFamily, GaugeMetricFamily)

    def _commands(self, total, CounterMetricFamily, HistogramMetricFamily):
        names = [Cmd(c).name for c in range(CMD_COUNT)]
        seen = [c for c in range(CMD_COUNT) if total.count[c]]
        count, rx, tx = _families(CounterMetricFamily, ["command"], (
            ("ggmlrpc_commands", "commands served"),
            ("ggmlrpc_command_request_bytes", "request bytes received, headers included"),
            ("ggmlrpc_command_response_bytes", "response bytes sent, size fields included")))
        lat = HistogramMetricFamily("ggmlrpc_command_seconds",
                                    "time from a request's header to its response",
                                    labels=["command"])
        for c in seen:
            count.add_metric([names[c]], total.count[c])
            rx.add_metric([names[c]], total.rx[c])
            tx.add_metric([names[c]], total.response_bytes(c))
            if c == Cmd.HELLO:  # exchanged before the command loop, not timed
                continue
            acc, buckets = 0, []
            for b, le in enumerate((*LATENCY_BUCKETS, float("inf"))):
                acc += total.hist[c * _NB + b]
                buckets.append((_le(le), acc))
            lat.add_metric([names[c]], buckets, sum_value=total.ns[c] / 1e9)
        yield from (count, rx, tx, lat)

    def _graphs(self, total, CounterMetricFamily):
        runs, nodes, secs = _families(CounterMetricFamily, ["device", "kind"], (
            ("ggmlrpc_graph_computes",
             "graphs run: GRAPH_COMPUTE (compute) and GRAPH_RECOMPUTE (recompute)"),
            ("ggmlrpc_graph_nodes", "nodes of the graphs run"),
            ("ggmlrpc_graph_seconds", "time validating, compiling and running graphs")))
        for dev, label in enumerate(self._labels):
            for kind in ("compute", "recompute"):
                g = total.graphs.get((dev, kind), (0, 0, 0))
                runs.add_metric([label, kind], g[0])
                nodes.add_metric([label, kind], g[1])
                secs.add_metric([label, kind], g[2] / 1e9)
        yield from (runs, nodes, secs)

    def _devices(self, sessions, GaugeMetricFamily):
        n = len(self._labels)
        bufs, nbytes, plans, scratch = [0] * n, [0] * n, [0] * n, [0] * n
        for s in sessions:
            for b in list(s.buffers.values()):
                if b.device < n:
                    bufs[b.device] += 1
                    nbytes[b.device] += b.size
            for dev, g in list(s.graphs.items()):
                if dev < n:
                    plans[dev] += 1
                    scratch[dev] += getattr(g.plan, "scratch_bytes", 0)
        fams = []
        for name, doc, values in (
                ("buffers", "buffers allocated by clients", bufs),
                ("buffer_bytes", "bytes of the buffers allocated by clients", nbytes),
                ("stored_plans", "compiled graphs kept for GRAPH_RECOMPUTE", plans),
                ("scratch_bytes", "scratch memory of the stored plans", scratch)):
            fam = GaugeMetricFamily(f"ggmlrpc_device_{name}", doc, labels=["device"])
            for label, v in zip(self._labels, values):
                fam.add_metric([label], v)
            fams.append(fam)
        free, tot, limit, used = _families(GaugeMetricFamily, ["device"], (
            ("ggmlrpc_device_memory_free_bytes", "free memory the device reports to clients"),
            ("ggmlrpc_device_memory_total_bytes", "total memory the device reports to clients"),
            ("ggmlrpc_device_memory_limit_bytes",
             "buffer bytes all clients together may hold (--mem-limit)"),
            ("ggmlrpc_device_memory_used_bytes", "buffer bytes counted against the limit")))
        ledgers = getattr(self.server, "ledgers", [])
        for i, (label, dev) in enumerate(zip(self._labels, self.server.devices)):
            f, t = dev.memory()
            free.add_metric([label], f)
            tot.add_metric([label], t)
            if i < len(ledgers):
                limit.add_metric([label], ledgers[i].limit)
                used.add_metric([label], ledgers[i].used)
        yield from (*fams, free, tot, limit, used)

    def _cache(self, total, CounterMetricFamily, GaugeMetricFamily):
        hits, misses, saved, stores = total.cache
        yield CounterMetricFamily("ggmlrpc_cache_hits", "SET_TENSOR_HASH answered from the cache",
                                  value=hits)
        yield CounterMetricFamily("ggmlrpc_cache_misses",
                                  "SET_TENSOR_HASH answered 'not cached'", value=misses)
        yield CounterMetricFamily("ggmlrpc_cache_saved_bytes",
                                  "tensor bytes not transferred thanks to the cache", value=saved)
        yield CounterMetricFamily("ggmlrpc_cache_stores", "cache files written", value=stores)
        cache = self.server.cache
        if cache is None:
            return
        files = size = 0
        try:
            with os.scandir(cache.dir) as it:
                for e in it:
                    if _CACHE_FILE.match(e.name) and e.is_file(follow_symlinks=False):
                        files += 1
                        size += e.stat(follow_symlinks=False).st_size
        except OSError:
            pass
        yield GaugeMetricFamily("ggmlrpc_cache_files", "files in the local cache", value=files)
        yield GaugeMetricFamily("ggmlrpc_cache_disk_bytes", "bytes of the local cache's files",
                                value=size)


def _families(cls, labels: list[str], named) -> list:
    """A metric family of type `cls` with these label names for each (name, help)."""
    return [cls(name, doc, labels=labels) for name, doc in named]


HTTP_MAX_CONNECTIONS = 4    # scrapes served at once; Prometheus sends one at a time
HTTP_TIMEOUT = 5.0          # seconds a scrape connection may stay silent


def _http_classes():
    """prometheus_client's threading WSGI server and silent handler, bounded."""
    from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

    class Handler(_SilentHandler):
        timeout = HTTP_TIMEOUT

    class BoundedServer(ThreadingWSGIServer):
        def __init__(self, *args, **kw):
            self.slots = threading.BoundedSemaphore(HTTP_MAX_CONNECTIONS)
            super().__init__(*args, **kw)

        def verify_request(self, request, client_address) -> bool:
            return not in_fd_reserve(request.fileno()) and self.slots.acquire(blocking=False)

        def process_request(self, request, client_address) -> None:
            try:
                super().process_request(request, client_address)
            except BaseException:   # no thread for it: the request is closed by the caller
                self.slots.release()
                raise

        def process_request_thread(self, request, client_address) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                self.slots.release()

        def handle_error(self, request, client_address) -> None:
            # a silent or vanished scrape connection: no traceback on stderr
            log.debug("metrics connection from %s:%d: %r", *client_address[:2], sys.exc_info()[1])

    return BoundedServer, Handler


def _le(bound: float) -> str:
    from prometheus_client.utils import floatToGoString
    return floatToGoString(bound)
