"""The RPC server: the accept loop and admission (connection caps, the per-device
memory ledgers, throttled refusal lines).

One thread per connection; each connection is a session.Session, which owns its
buffers and its stored graph per device and frees everything it owns when it ends.
The graph watcher (graph_watch.GraphWatch) stops the graph of a client that hangs up.
"""
from __future__ import annotations

import errno
import itertools
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass

from . import peers, protocol
from .compute.work import DEFAULT_PER_BYTE
from .cache import TensorCache, cache_directory
from .graph_watch import GraphWatch
from .buffers import BASE_GAP, BASE_START, ServerBuffer
from .session import Session
from .transport import FD_RESERVE, in_fd_reserve

# the buffer layout and the cache directory are public here too
__all__ = ["BASE_GAP", "BASE_START", "CLIENT_RESERVE", "MEM_MARGIN", "Limits", "Server", "ServerBuffer",
           "cache_directory"]

log = logging.getLogger("ggmlrpc.server")

@dataclass
class Limits:
    """What one server lets its clients hold. None turns a limit off."""

    max_clients: int | None = 32          # connections served at once; more are refused
    max_per_address: int | None = 16      # of those, from one peer address (llama.cpp's
                                          # client opens one per server and process)
    hello_timeout: float | None = 10.0    # seconds from accept to a complete HELLO
    idle_timeout: float | None = None     # seconds without a byte from a connected client
    max_buffers: int | None = 1024        # live buffers per connection
    mem_limit: int | None = None          # bytes of buffers per device, all clients
                                          # together; None: the device's free memory at
                                          # start less MEM_MARGIN of it
    client_mem_limit: int | None = None   # of those, what one connection may hold (buffers
                                          # and stored-graph scratch); None: the device's
                                          # limit less 1/CLIENT_RESERVE of it
    max_graph_work: int | None = DEFAULT_PER_BYTE  # a graph's work per byte of the buffers it
                                          # uses (ggmlrpc.compute.work); None: no limit
    peers: bool = False                   # clients may link this server to other ggmlrpc
                                          # servers (ggmlrpc.peers, for -sm row)


MEM_MARGIN = 10  # percent of a device's free memory at start kept out of the default limit
CLIENT_RESERVE = 8  # 1/8 of a device's limit is never held by one connection (the others')
ACCEPT_BACKOFF_MAX = 0.25  # seconds between accept() retries while descriptors or threads run out


def default_mem_limit(device) -> int:
    free = device.free_memory()
    return max(0, free - free * MEM_MARGIN // 100)


class MemoryLedger:
    """Bytes held on one device (buffers, and the scratch of stored plans), by all
    sessions, against a limit.

    A buffer is counted at its full size when it is allocated, before any memory is
    committed, so neither ALLOC_BUFFER nor BUFFER_CLEAR (which touches every page)
    can commit more than the limit.
    """

    def __init__(self, limit: int, share: int | None = None):
        self.limit = limit
        # what one connection may hold: by default all but an eighth, so that one client
        # (llama.cpp's holds all its weights on one connection) can use nearly the whole
        # device and still never starve the others
        self.share = min(limit, share) if share is not None else limit - limit // CLIENT_RESERVE
        self.used = 0
        self._lock = threading.Lock()

    def reserve(self, n: int) -> bool:
        with self._lock:
            if n > self.limit - self.used:
                return False
            self.used += n
            return True

    def release(self, n: int) -> None:
        with self._lock:
            self.used -= n


class _Throttle:
    """Log lines that a flood of connections could repeat at will: at most one per
    `interval` seconds per key, the lines held back counted into the next one.
    Used by the accept thread only."""

    def __init__(self, interval: float = 1.0):
        self.interval = interval
        self.last: dict[str, float] = {}
        self.held: dict[str, int] = {}

    def __call__(self, key: str, level: int, fmt: str, *args) -> None:
        now = time.monotonic()
        if key in self.last and now - self.last[key] < self.interval:
            self.held[key] = self.held.get(key, 0) + 1
            return
        self.last[key] = now
        n = self.held.pop(key, 0)
        log.log(level, fmt + (" (%d more since the last such line)" % n if n else ""), *args)


def _close_quietly(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


class Server:
    """Serves the given devices on host:port until close()."""

    def __init__(self, devices, host: str = "127.0.0.1", port: int = 50052,
                 cache_dir: str | None = None, codec=None, debug: bool | None = None,
                 out=None, limits: Limits | None = None, cache: TensorCache | None = None):
        if not devices:
            raise ValueError("a server needs at least one device")
        self.devices = list(devices)
        self.host = host
        self.port = port
        self.codec = codec or protocol.codec()
        self.native = self.codec.name == "native"
        if cache is None and cache_dir:
            cache = TensorCache(cache_dir)
        self.cache = cache
        self.limits = limits or Limits()
        self.ledgers = [MemoryLedger(self.limits.mem_limit if self.limits.mem_limit is not None
                                     else default_mem_limit(d), self.limits.client_mem_limit)
                        for d in self.devices]
        self.debug = ("GGML_RPC_DEBUG" in os.environ) if debug is None else debug
        self.out = out or sys.stdout
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._sessions: set[Session] = set()
        self._per_address: dict[str, int] = {}  # live sessions by peer address
        self._threads: set[threading.Thread] = set()
        self._closing = threading.Event()
        self.listener: socket.socket | None = None
        self.metrics = None  # a metrics.Metrics: told of each connection, counts its commands
        self._spare_fd: int | None = None  # released to refuse a connection when fds run out
        self._throttle = _Throttle()
        self.graph_watch = GraphWatch(self._closing)
        self.peer_groups = peers.Registry()

    # -- lifecycle ---------------------------------------------------------
    def bind(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, self.port))
        s.listen(16)
        self.listener = s
        self.port = s.getsockname()[1]
        self._spare_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    def serve_forever(self) -> None:
        """Accept connections until close(). Load never ends this loop: a connection
        over the cap, or one that cannot get a descriptor or a thread, is refused
        with a log line, and the loop backs off while resources are short."""
        if self.listener is None:
            self.bind()
        backoff = 0.0
        while not self._closing.is_set():
            if backoff:
                self._closing.wait(backoff)
            try:
                sock, addr = self.listener.accept()
            except OSError as e:
                if self._closing.is_set():
                    break
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if not self._refuse_pending(e):
                        backoff = min(ACCEPT_BACKOFF_MAX, backoff * 2 or 0.01)
                    continue
                if e.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EPERM):
                    continue  # that one connection went away before it was accepted
                log.error("accept() failed, listener closed: %s", e)
                raise
            peer = "%s:%d" % addr[:2]
            if in_fd_reserve(sock.fileno()):
                self._throttle("fds", logging.WARNING, "refusing connection from %s: fewer than "
                               "%d descriptors left (kept for the server)", peer, FD_RESERVE)
                _close_quietly(sock)
                self._count_refusal("resources")
                continue
            with self._lock:
                n = len(self._sessions)
                over = self.limits.max_clients is not None and n >= self.limits.max_clients
                mine = self._per_address.get(addr[0], 0)
                cap = self.limits.max_per_address
                over_address = not over and cap is not None and mine >= cap
            if over:
                self._throttle("cap", logging.WARNING, "refusing connection from %s: %d clients "
                               "connected (the limit, --max-clients)", peer, n)
                _close_quietly(sock)
                self._count_refusal("max_clients")
                continue
            if over_address:
                self._throttle("addr", logging.WARNING, "refusing connection from %s: %d "
                               "connections from that address (the limit, --max-per-address)",
                               peer, mine)
                _close_quietly(sock)
                self._count_refusal("max_per_address")
                continue
            try:
                self._spawn(sock, addr[0])
            except Exception as e:  # can't start new thread, no memory for the session
                self._throttle("spawn", logging.ERROR, "refusing connection from %s: cannot "
                               "start its session: %r", peer, e)
                _close_quietly(sock)
                self._count_refusal("resources")
                backoff = min(ACCEPT_BACKOFF_MAX, backoff * 2 or 0.01)
                continue
            backoff = 0.0

    def _spawn(self, sock: socket.socket, address: str) -> None:
        session = Session(self, sock)
        session.address = address
        t = threading.Thread(target=self._serve, args=(session,), daemon=True,
                             name=f"rpc-client-{next(self._ids)}")
        with self._lock:
            self._sessions.add(session)
            self._threads.add(t)
            self._per_address[address] = self._per_address.get(address, 0) + 1
        self.say("Accepted client connection")
        try:
            t.start()
        except BaseException:
            self._forget_session(session, t)
            self.say("Client connection closed")
            raise

    def _forget_session(self, session: "Session", thread: threading.Thread) -> None:
        with self._lock:
            self._sessions.discard(session)
            self._threads.discard(thread)
            left = self._per_address.pop(session.address, 1) - 1
            if left:
                self._per_address[session.address] = left

    def _count_refusal(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.refused(reason)

    def _refuse_pending(self, e: OSError) -> bool:
        """Out of descriptors: accept the waiting connection on a spare descriptor and
        close it at once, so that it gets an answer instead of hanging in the
        backlog. False when that was not possible (the caller backs off)."""
        spare, done = self._spare_fd, False
        if spare is not None:
            self._spare_fd = None
            os.close(spare)
            try:
                sock, addr = self.listener.accept()
            except OSError:
                pass
            else:
                self._throttle("fds", logging.WARNING, "refusing connection from %s: %s",
                               "%s:%d" % addr[:2], e.strerror)
                _close_quietly(sock)
                self._count_refusal("resources")
                done = True
            try:
                self._spare_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                done = False
        if not done:
            self._throttle("accept", logging.WARNING, "accept() failed: %s; backing off", e.strerror)
        return done

    def start(self) -> threading.Thread:
        """Bind and serve in a background thread (tests, embedding)."""
        self.bind()
        t = threading.Thread(target=self.serve_forever, daemon=True, name="rpc-accept")
        t.start()
        return t

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting, end every session and free what they hold; waits at most
        `timeout` seconds in all for the sessions to end."""
        self._closing.set()
        if self.listener is not None:
            try:
                self.listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.listener.close()
        if self._spare_fd is not None:
            os.close(self._spare_fd)
            self._spare_fd = None
        with self._lock:
            sessions = list(self._sessions)
            threads = list(self._threads)
        self.graph_watch.cancel_all()
        for s in sessions:
            s.conn.shutdown()  # each session thread closes its own socket
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def stats(self) -> dict:
        """Live sessions, buffers and buffer bytes (tests and monitoring)."""
        with self._lock:
            sessions = list(self._sessions)
        bufs = [b for s in sessions for b in list(s.buffers.values())]
        return {"sessions": len(sessions), "buffers": len(bufs),
                "buffer_bytes": sum(b.size for b in bufs)}

    def memory(self) -> dict:
        """Per device: the limit, the bytes counted against it, and each session's part."""
        with self._lock:
            sessions = list(self._sessions)
        return {"limit": [g.limit for g in self.ledgers], "used": [g.used for g in self.ledgers],
                "held": [list(s.held) for s in sessions]}

    def _serve(self, session: "Session") -> None:
        try:
            session.run()
        finally:
            session.release()
            if session.metrics is not None:
                session.metrics.detach(session)
            self._forget_session(session, threading.current_thread())
            self.say("Client connection closed")

    # One write per line: sessions print from their own threads, and print() writes
    # the text and its newline separately, so lines of two sessions could mix.
    def say(self, line: str) -> None:
        self.out.write(line + "\n")
        self.out.flush()

    def dbg(self, fmt: str, *args) -> None:
        if self.debug:
            sys.stderr.write(fmt % args + "\n")
            sys.stderr.flush()
