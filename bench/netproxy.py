"""A user-space TCP proxy that simulates a network: each direction is delayed by
half the round trip and optionally capped in bandwidth (the kernel's netem is not
available everywhere).

    python bench/netproxy.py --listen 50100 --upstream 127.0.0.1:50052 --rtt-ms 5 --mbps 1000

or, from Python, `Proxy(upstream, rtt_ms, mbps).start()` -> the local port.

With `count=True` (`--count`) the proxy also reads the RPC framing of what the
clients send (`| cmd u8 | size u64 | payload |`) and counts the commands by id
(`Proxy.counts`); the commands that have a response are the client's round trips,
since a ggml RPC client waits for each response before it sends more.
"""
from __future__ import annotations

import argparse
import heapq
import socket
import threading
import time

from ggmlrpc.protocol import RESPONSE_SIZE, Cmd

# ggml RPC commands that are answered (docs/protocol.md): each one costs its
# client a round trip
ANSWERED = {int(c): c.name for c in Cmd if RESPONSE_SIZE[c] is not None}
SILENT = {int(c): c.name for c in Cmd if RESPONSE_SIZE[c] is None}


class FrameCounter:
    """Counts the commands in a client's byte stream as it passes (any chunking)."""

    def __init__(self, counts: dict, lock: threading.Lock):
        self.counts, self.lock = counts, lock
        self.head = b""        # a partial 9-byte header
        self.skip = 0          # payload bytes still to pass

    def feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n:
            if self.skip:
                step = min(self.skip, n - i)
                self.skip -= step
                i += step
                continue
            take = min(9 - len(self.head), n - i)
            self.head += data[i:i + take]
            i += take
            if len(self.head) == 9:
                cmd, self.skip = self.head[0], int.from_bytes(self.head[1:], "little")
                self.head = b""
                name = ANSWERED.get(cmd) or SILENT.get(cmd) or f"CMD{cmd}"
                with self.lock:
                    self.counts[name] = self.counts.get(name, 0) + 1


def round_trips(counts: dict) -> int:
    """The answered commands among `counts`."""
    return sum(v for k, v in counts.items() if k in ANSWERED.values())


class _Pipe:
    """One direction: bytes read from `src` reach `dst` after `delay` seconds, no
    faster than `rate` bytes per second (0: unlimited)."""

    def __init__(self, src: socket.socket, dst: socket.socket, delay: float, rate: float,
                 counter: FrameCounter | None = None):
        self.src, self.dst, self.delay, self.rate = src, dst, delay, rate
        self.counter = counter
        self.queue: list[tuple[float, int, bytes]] = []
        self.cv = threading.Condition()
        self.closed = False
        self.seq = 0
        self.busy_until = 0.0

    def reader(self):
        try:
            while True:
                data = self.src.recv(1 << 20)
                if not data:
                    break
                if self.counter is not None:
                    self.counter.feed(data)
                now = time.monotonic()
                start = max(now, self.busy_until)
                self.busy_until = start + (len(data) / self.rate if self.rate else 0.0)
                with self.cv:
                    heapq.heappush(self.queue, (self.busy_until + self.delay, self.seq, data))
                    self.seq += 1
                    self.cv.notify()
        except OSError:
            pass
        with self.cv:
            self.closed = True
            self.cv.notify()

    def writer(self):
        try:
            while True:
                with self.cv:
                    while not self.queue and not self.closed:
                        self.cv.wait()
                    if not self.queue:
                        break
                    at, _, data = self.queue[0]
                    wait = at - time.monotonic()
                    if wait > 0:
                        self.cv.wait(wait)
                        continue
                    heapq.heappop(self.queue)
                self.dst.sendall(data)
        except OSError:
            pass
        try:
            self.dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class Proxy:
    def __init__(self, upstream: str, rtt_ms: float = 0.0, mbps: float = 0.0, port: int = 0,
                 count: bool = False):
        host, _, p = upstream.rpartition(":")
        self.upstream = (host, int(p))
        self.delay = rtt_ms / 2000.0
        self.rate = mbps * 1e6 / 8
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.count = count
        self.counts: dict[str, int] = {}     # command name -> number sent by the clients
        self._lock = threading.Lock()

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def start(self) -> int:
        threading.Thread(target=self._accept, daemon=True).start()
        return self.port

    def _accept(self):
        with self.listener:
            for client in iter(self._next_client, None):
                self._connect(client)

    def _next_client(self) -> socket.socket | None:
        try:
            return self.listener.accept()[0]
        except OSError:    # closed
            return None

    def _connect(self, client: socket.socket) -> None:
        """Two delayed pipes between the client and a new upstream connection."""
        server = socket.create_connection(self.upstream)
        for end in (client, server):
            end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for a, b in ((client, server), (server, client)):
            counter = FrameCounter(self.counts, self._lock) if self.count and a is client else None
            pipe = _Pipe(a, b, self.delay, self.rate, counter)
            threading.Thread(target=pipe.reader, daemon=True).start()
            threading.Thread(target=pipe.writer, daemon=True).start()

    def close(self):
        self.listener.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", type=int, required=True)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--rtt-ms", type=float, default=1.0)
    ap.add_argument("--mbps", type=float, default=0.0, help="bandwidth cap per direction (0: none)")
    a = ap.parse_args(argv)
    Proxy(a.upstream, a.rtt_ms, a.mbps, a.listen).start()
    print(f"127.0.0.1:{a.listen} -> {a.upstream}, {a.rtt_ms} ms round trip", flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
