"""The graph watcher: cancels the running graph of a session whose client hangs up."""
from __future__ import annotations

import contextlib
import select
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .session import Session


class GraphWatch:
    """Stops the graph of a session whose client goes away while it computes: a graph
    can run for seconds, its session thread is inside the executor meanwhile, so a
    thread of its own polls the sockets of the computing sessions for a hang-up and
    sets their cancel token (the executor stops at its next work chunk). Server.close()
    cancels every running graph the same way."""

    POLL_MS = 20
    GONE = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)

    def __init__(self, closing: threading.Event):
        self._closing = closing
        self._cv = threading.Condition()
        self._computing: dict[Session, int] = {}   # session -> its socket's fd
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def computing(self, session: "Session"):
        session.cancel.clear()
        with self._cv:
            self._computing[session] = session.conn.fd
            if self._closing.is_set():   # close() came while this graph was being compiled
                session.cancel.set()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True, name="rpc-graph-watch")
                self._thread.start()
            self._cv.notify()
        try:
            yield session.cancel
        finally:
            with self._cv:
                self._computing.pop(session, None)

    def cancel_all(self) -> None:
        with self._cv:
            for s in self._computing:
                s.cancel.set()
            self._cv.notify()

    def _loop(self) -> None:
        while not self._closing.is_set():
            with self._cv:
                while not self._computing and not self._closing.is_set():
                    self._cv.wait(1.0)
                watched = dict(self._computing)
            if self._closing.is_set():
                break
            poller = select.poll()
            for fd in set(watched.values()):
                poller.register(fd, self.GONE)
            gone = {fd for fd, ev in poller.poll(self.POLL_MS) if ev & self.GONE}
            for s, fd in watched.items():
                if fd in gone:
                    s.cancel.set()
            if gone:   # a hung-up socket stays readable: wait for its graph to stop
                self._closing.wait(self.POLL_MS / 1000)
