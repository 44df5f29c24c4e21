"""Moving bytes: framed reads and writes on a TCP socket, HELLO caps, RDMA probe.

``Conn`` wraps a connected socket: ``NativeConn`` runs the recv/send loops in C
with the GIL released, ``PyConn`` uses socket.recv_into/sendall and exists so that
the same tests prove both; ``Conn(sock)`` picks one.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import resource
import socket
import time

from .errors import ConnectionLost, RpcTimeout
from .protocol import CMD_COUNT, CONN_CAPS_SIZE, HEADER, REQUEST_SIZE, SIZE

log = logging.getLogger("ggmlrpc.transport")

ZERO_CAPS = bytes(CONN_CAPS_SIZE)

try:
    from ._native import sockio as _wire
except ImportError:  # pragma: no cover - only without the built extension
    _wire = None


# Descriptors no accepted connection may take, on either of a server's ports (RPC and
# metrics): what the server itself needs whatever its clients do (cache files and
# their index, a scrape, log files, the spare descriptor that refuses connections).
FD_RESERVE = 32


def in_fd_reserve(fd: int) -> bool:
    """Whether a descriptor just accepted (`fd`) lies in the reserve. Descriptors are
    handed out lowest first, so fd n means at least n + 1 are open: a number within
    FD_RESERVE of the RLIMIT_NOFILE limit leaves fewer than FD_RESERVE free."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft != resource.RLIM_INFINITY and fd >= soft - FD_RESERVE


def _ms(timeout: float | None) -> int:
    return -1 if timeout is None else max(0, int(timeout * 1000))


class Conn:
    """A connected TCP socket with exact-length reads. Timeouts in seconds or None.

    `timeout` bounds each wait for the peer (no byte for that long: RpcTimeout).
    `arm(seconds)` sets a deadline that bounds everything sent and received until the
    next arm() or disarm(), however the peer paces its bytes (natively, the server's
    device-buffer paths recv_into_buffer, send_from_buffer and discard keep to the
    per-wait timeout: the client never uses them, and the server arms only HELLO).

    `Conn(sock, ...)` makes a NativeConn when the extension is built (and `native` is
    not False), else a PyConn: the flavour is chosen once, here.
    """

    native = False

    def __new__(cls, sock: socket.socket, timeout: float | None = None, native: bool | None = None):
        if cls is Conn:
            cls = NativeConn if _wire is not None and (native is None or native) else PyConn
        return super().__new__(cls)

    def __init__(self, sock: socket.socket, timeout: float | None = None, native: bool | None = None):
        self.sock = sock
        self.fd = sock.fileno()
        self.timeout = timeout
        self.deadline_ns = 0  # time.monotonic_ns() value; 0: no deadline
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)  # blocking fd: the native loops poll for timeouts

    # -- deadlines ---------------------------------------------------------
    def arm(self, seconds: float | None) -> None:
        """Bound all I/O from now on by `seconds` in total (None: no deadline)."""
        self.deadline_ns = 0 if seconds is None else time.monotonic_ns() + max(1, int(seconds * 1e9))

    def disarm(self) -> None:
        self.arm(None)

    # -- the I/O of each flavour --------------------------------------------
    def recv_exact(self, n: int) -> bytearray:
        raise NotImplementedError

    def recv_request(self) -> tuple[int, int, bytearray | None]:
        """(cmd, size, payload): a request header and, when the command has a fixed
        payload size and `size` is it, the payload; otherwise the payload stays unread."""
        raise NotImplementedError

    def recv_into(self, buf) -> None:
        """Fill a writable buffer completely."""
        raise NotImplementedError

    def recv_into_buffer(self, buffer, offset: int, n: int) -> None:
        """Receive n bytes straight into a device buffer at offset (no staging copy)."""
        raise NotImplementedError

    def discard(self, n: int) -> None:
        raise NotImplementedError

    def send(self, *parts) -> None:
        """Send byte strings back to back (natively: one message, one writev)."""
        raise NotImplementedError

    def send_sized(self, payload) -> None:
        """A response: | size u64 | payload |."""
        raise NotImplementedError

    def send_from_buffer(self, header: bytes, buffer, offset: int, n: int) -> None:
        """Send header then n bytes of a device buffer, from the buffer's memory."""
        raise NotImplementedError

    # -- closing -------------------------------------------------------------
    def shutdown(self) -> None:
        """Wake any thread blocked on this socket (it sees EOF) without closing the fd,
        so that the fd number cannot be reused under that thread's feet."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.shutdown()
        self.sock.close()


class NativeConn(Conn):
    """The recv/send loops in C with the GIL released (ggmlrpc._native.sockio)."""

    native = True

    def __init__(self, sock: socket.socket, timeout: float | None = None, native: bool | None = None):
        super().__init__(sock, timeout)
        # reads go through a read-ahead buffer (one recv per small message); nothing
        # may read this socket around it
        self._rbuf = _wire.RecvBuffer()

    def arm(self, seconds: float | None) -> None:
        super().arm(seconds)
        self._rbuf.deadline_ns = self.deadline_ns

    def recv_exact(self, n: int) -> bytearray:
        return self._rbuf.read(self.fd, n, _ms(self.timeout))

    def recv_request(self) -> tuple[int, int, bytearray | None]:
        return self._rbuf.read_request(self.fd, _ms(self.timeout))

    def recv_into(self, buf) -> None:
        self._rbuf.read_into(self.fd, buf, _ms(self.timeout))

    def recv_into_buffer(self, buffer, offset: int, n: int) -> None:
        head = self._rbuf.take(n)  # the payload's start may be read ahead already
        if head:
            buffer.write(offset, head)
            offset, n = offset + len(head), n - len(head)
        if n:
            buffer.recv_into(self.fd, offset, n, _ms(self.timeout))

    def discard(self, n: int) -> None:
        self._rbuf.discard(self.fd, n, _ms(self.timeout))

    def send(self, *parts) -> None:
        _wire.sendv(self.fd, parts, _ms(self.timeout), self.deadline_ns)

    def send_sized(self, payload) -> None:
        _wire.send_sized(self.fd, payload, _ms(self.timeout), self.deadline_ns)

    def send_from_buffer(self, header: bytes, buffer, offset: int, n: int) -> None:
        buffer.send_from(self.fd, header, offset, n, _ms(self.timeout))


class PyConn(Conn):
    """socket.recv_into/sendall: the pure-Python twin, so that the same tests prove both."""

    def _wait_s(self) -> float | None:
        """The socket timeout for one wait."""
        if not self.deadline_ns:
            return self.timeout
        left = (self.deadline_ns - time.monotonic_ns()) / 1e9
        if left <= 0:
            raise RpcTimeout("deadline passed")
        return left if self.timeout is None else min(left, self.timeout)

    def recv_exact(self, n: int) -> bytearray:
        buf = bytearray(n)
        self._recv_view(memoryview(buf))
        return buf

    def recv_request(self) -> tuple[int, int, bytearray | None]:
        cmd, size = HEADER.unpack(self.recv_exact(9))
        if cmd < CMD_COUNT and REQUEST_SIZE[cmd] == size:
            return cmd, size, self.recv_exact(size)
        return cmd, size, None

    def recv_into(self, buf) -> None:
        self._recv_view(memoryview(buf).cast("B"))

    def recv_into_buffer(self, buffer, offset: int, n: int) -> None:
        self._recv_view(buffer.view()[offset:offset + n])

    def discard(self, n: int) -> None:
        scratch = memoryview(bytearray(min(n, 1 << 16) or 1))
        while n:
            k = min(n, len(scratch))
            self._recv_view(scratch[:k])
            n -= k

    def _recv_view(self, view: memoryview) -> None:
        try:
            while len(view):
                self.sock.settimeout(self._wait_s())
                k = self.sock.recv_into(view)
                if k == 0:
                    raise ConnectionLost("connection closed by peer")
                view = view[k:]
        except socket.timeout as e:
            raise RpcTimeout("recv timed out") from e
        except OSError as e:
            if isinstance(e, ConnectionLost):
                raise
            raise ConnectionLost(f"recv failed: {e}") from e
        finally:
            self._untimed()

    def _untimed(self) -> None:
        """Back to a blocking fd. Another thread may have closed the socket meanwhile
        (Server.close ends sessions so): the recv/send error stands, not EBADF here."""
        try:
            self.sock.settimeout(None)
        except OSError:
            pass

    def send(self, *parts) -> None:
        self._send_parts(parts)

    def send_sized(self, payload) -> None:
        self._send_parts((SIZE.pack(len(payload)), payload))

    def send_from_buffer(self, header: bytes, buffer, offset: int, n: int) -> None:
        self._send_parts((header, buffer.view()[offset:offset + n]))

    def _send_parts(self, parts) -> None:
        try:
            for p in parts:
                self._send_one(p)
        except socket.timeout as e:
            raise RpcTimeout("send timed out") from e
        except ConnectionLost:
            raise
        except OSError as e:
            raise ConnectionLost(f"send failed: {e}") from e
        finally:
            self._untimed()

    def _send_one(self, data) -> None:
        """sendall, with the deadline checked between the pieces the kernel takes."""
        if not self.deadline_ns:
            self.sock.settimeout(self.timeout)
            self.sock.sendall(data)
            return
        view = memoryview(data).cast("B")
        while len(view):
            self.sock.settimeout(self._wait_s())
            view = view[self.sock.send(view):]


# -- RDMA negotiation -------------------------------------------------------------

def rdma_disabled() -> bool:
    """GGML_RPC_NO_RDMA set to anything (even empty or 0) forces TCP."""
    return "GGML_RPC_NO_RDMA" in os.environ


def target_gid(sock: socket.socket) -> bytes | None:
    """The RoCE GID a device must carry to serve this socket's local address:
    ::ffff:a.b.c.d for IPv4, the address itself for IPv6."""
    try:
        addr = sock.getsockname()[0]
    except OSError:
        return None
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    if ip.version == 4:
        return bytes(10) + b"\xff\xff" + ip.packed
    return ip.packed


_PYVERBS: list = []


def _pyverbs():
    """pyverbs.device, or None when it is not installed (looked up once)."""
    if not _PYVERBS:
        try:
            import pyverbs.device as vd  # optional
        except ImportError:
            log.debug("RDMA: pyverbs not installed, staying on TCP")
            vd = None
        _PYVERBS.append(vd)
    return _PYVERBS[0]


def rdma_probe(sock: socket.socket) -> bytes | None:
    """Local RDMA caps (qpn u32 | psn u32 | gid[16]) when an RDMA path exists, else None.

    A path exists when pyverbs is installed and a verbs device has a GID equal to
    this socket's address. ggmlrpc does not carry tensor traffic over RDMA yet, so
    even then it advertises zero caps and stays on TCP: advertising caps it cannot
    honour would make an RDMA-capable llama.cpp peer switch transports alone.
    """
    if rdma_disabled():
        return None
    gid = target_gid(sock)
    if gid is None:
        return None
    vd = _pyverbs()
    if vd is None:
        return None
    try:
        for dev in vd.get_device_list():
            with vd.Context(name=dev.name.decode()) as ctx:
                port = ctx.query_port(1)
                for i in range(port.gid_tbl_len):
                    if ctx.query_gid(1, i).gid_bytes() == gid:  # pragma: no cover - needs RoCE
                        log.debug("RDMA: %s carries the socket's GID, but the RDMA data path "
                                  "is not implemented; staying on TCP", dev.name)
                        return None
    except Exception as e:  # pragma: no cover - needs verbs hardware
        log.debug("RDMA probe failed: %s", e)
    return None


def local_caps(sock: socket.socket) -> bytes:
    """The conn_caps this peer advertises in HELLO."""
    return rdma_probe(sock) or ZERO_CAPS
