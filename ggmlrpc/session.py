"""One client connection of the RPC server: its buffers, stored graphs and the
handlers of the protocol's commands.

Any malformed or hostile request raises inside the session, which logs the reason
and closes that connection only. Buffer handles and base addresses handed to
clients are opaque numbers of ours; every address a client sends back is checked
against the live buffers of its own connection.
"""
from __future__ import annotations

import ctypes
import itertools
import logging
import mmap
import socket
import struct
from time import perf_counter_ns
from typing import TYPE_CHECKING

from . import peers, protocol
from .buffers import BufferTable, ServerBuffer
from .errors import ConnectionLost, GgmlRpcError, ProtocolError, RpcTimeout, ValidationError
from .compute.cpu import cancel_token
from .graph import DECODE_FACTOR, graph_from_payload
from .metrics import SessionStats
from .protocol import (CONN_CAPS_SIZE, Cmd, CMD_COUNT, MAX_GRAPH_PAYLOAD, REQUEST_SIZE,
                       SET_TENSOR_HEADER_SIZE, TENSOR_SIZE)
from .transport import Conn, local_caps

if TYPE_CHECKING:
    from .server import Server

log = logging.getLogger("ggmlrpc.server")  # one logger for the whole server

U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
U64x2 = struct.Struct("<QQ")  # (handle, size), (free, total), (offset, size|hash)
GRAPH_CHUNK = 16 << 20           # graph payloads grow only as their bytes arrive
TRIM_AT = 64 << 20               # a graph whose decoding took this much gives it back to the OS
GRAPH_CACHE = 256                # compiled graphs a connection keeps per device (see cmd_graph_compute),
GRAPH_CACHE_BYTES = 64 << 20     # and the bytes of their payloads
ANNOUNCED_MAX = 16               # cache misses a connection may upload after (llama.cpp: one)


def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):   # not glibc
        return None


_trim = _malloc_trim()


def return_freed_memory() -> None:
    """Give the heap's free memory back to the OS (glibc's malloc_trim): the transient
    arrays of a large graph's decoding come from the heap once glibc has raised its
    mmap threshold, and the process would keep their pages after they are freed."""
    if _trim is not None:
        _trim(0)


class StoredGraph:
    """A compiled graph kept for GRAPH_RECOMPUTE and for a GRAPH_COMPUTE that repeats
    its payload: its plan (which keeps nothing of the decoded graph), its node count,
    and the bytes it holds (the plan's scratch, node records and names, and the
    payload it is kept under), counted in the device's ledger while it is stored."""
    __slots__ = ("plan", "n_nodes", "held")

    def __init__(self, plan, n_nodes: int, held: int):
        self.plan = plan
        self.n_nodes = n_nodes
        self.held = held


class Session:
    """One client connection: its buffers, its stored graphs, its command loop."""

    _handles = itertools.count(1)

    def __init__(self, server: Server, sock: socket.socket):
        self.server = server
        self.codec = server.codec
        self.devices = server.devices
        self.conn = Conn(sock, native=server.native)
        self.buffers = BufferTable()
        self.graphs: dict[int, StoredGraph] = {}
        # compiled graphs by their GRAPH_COMPUTE payload, per device, oldest first
        self.compiled: list[dict[bytes, StoredGraph]] = [{} for _ in self.devices]
        self.request: bytearray | None = None  # payload of the current fixed-size request
        self.debug = server.debug
        self.limits = server.limits
        self.held = [0] * len(self.devices)  # bytes of buffers and plan scratch per device, in the ledgers
        self._noted: set[str] = set()
        self.announced: list[int] = []   # hashes answered "not cached", whose upload may be kept
        self.peer_ok = False             # negotiated the peer extension (ggmlrpc.peers)
        self.group: peers.Group | None = None   # the peer group this host connection made
        try:
            self.address, port = sock.getpeername()[:2]
            self.peer = "%s:%d" % (self.address, port)
        except OSError:
            self.address, self.peer = "?", "?"
        self.end: BaseException | None = None  # why the connection ended
        self.cancel = cancel_token()  # set to stop this session's running graph
        self.stats = SessionStats()  # plain counters; read by a metrics collector if any
        self.metrics = server.metrics  # a metrics.Metrics collector, or None
        if self.metrics is not None:
            self.metrics.attach(self)  # also counts each command from here on

    # -- plumbing ----------------------------------------------------------
    def run(self) -> None:
        try:
            self.conn.arm(self.limits.hello_timeout)
            self.hello()
            self.stats.hello()
            self.conn.disarm()
            self.conn.timeout = self.limits.idle_timeout
            while True:
                # a fixed-size request comes with its payload, read in the same call
                cmd, size, self.request = self.conn.recv_request()
                self.dispatch(cmd, size)
        except RpcTimeout:
            if not self.server._closing.is_set():
                what = ("no complete HELLO within %ss (hello timeout)" % self.limits.hello_timeout
                        if self.conn.deadline_ns else
                        "idle for %ss (--idle-timeout)" % self.limits.idle_timeout)
                log.warning("closing connection from %s: %s", self.peer, what)
        except ConnectionLost as e:
            self.end = e
            if not self.server._closing.is_set():
                if self.debug:
                    self.server.dbg("[%s] %s", self.peer, e)
        except GgmlRpcError as e:
            self.end = e
            log.error("closing connection from %s: %s", self.peer, e)
        except Exception as e:  # never let one client take the server down
            self.end = e
            log.exception("closing connection from %s after an internal error: %r", self.peer, e)
        finally:
            self.conn.close()
            # the tracebacks of the error (and of the errors it was raised from) hold
            # the frames of the command that failed, which hold this session and that
            # command's decoded graph: a cycle only a full collection would free, a
            # pause of every session as long as the graph is large
            e = self.end
            for _ in range(8):
                if e is None:
                    break
                e.__traceback__ = None
                e = e.__cause__ or e.__context__

    def release(self) -> None:
        if self.group is not None:
            self.group.close()
            self.server.peer_groups.remove(self.group)
        self.forget_graphs()
        for b in list(self.buffers.values()):
            self.drop(b)
        self.buffers.clear()

    def drop(self, b: ServerBuffer) -> None:
        """Free a buffer and return its bytes to the device's ledger."""
        self.buffers.pop(b.handle, None)
        if b.mem is not None:
            b.mem.free()
            b.mem = None
        self.held[b.device] -= b.size
        self.server.ledgers[b.device].release(b.size)

    def charge(self, device: int, n: int, what: str) -> None:
        """Count n bytes of `what` against the connection's share and the device's
        ledger; ValidationError (the connection closes) when either would pass its limit."""
        ledger = self.server.ledgers[device]
        if n > ledger.share - self.held[device]:
            raise ValidationError(f"{what} needs {n} bytes on device {device}, this connection "
                                  f"holds {self.held[device]} of the {ledger.share} bytes one client "
                                  "may (--client-mem-limit)")
        if n and not ledger.reserve(n):
            raise ValidationError(f"{what} needs {n} bytes on device {device}, {ledger.used} of "
                                  f"{ledger.limit} bytes in use (--mem-limit)")
        self.held[device] += n

    def uncharge(self, device: int, n: int) -> None:
        if n:
            self.held[device] -= n
            self.server.ledgers[device].release(n)

    def keep_graph(self, device: int, plan, n_nodes: int, payload: bytes) -> StoredGraph:
        """Store a compiled graph as the device's graph and among its compiled ones
        (under its payload), what it holds charged first; the oldest compiled graphs
        make room. A graph that would pass the memory limits alone is refused."""
        held = plan.held_bytes + len(payload)
        ledger = self.server.ledgers[device]
        compiled = self.compiled[device]
        while compiled and (len(compiled) >= GRAPH_CACHE or held > ledger.share - self.held[device]
                            or held > ledger.limit - ledger.used
                            or sum(map(len, compiled)) + len(payload) > GRAPH_CACHE_BYTES):
            self.forget_graph(device, next(iter(compiled)))
        self.charge(device, held, "graph (its plan and scratch memory)")
        stored = self.graphs[device] = compiled[payload] = StoredGraph(plan, n_nodes, held)
        return stored

    def forget_graph(self, device: int, payload: bytes) -> None:
        """Drop one compiled graph and return its bytes."""
        stored = self.compiled[device].pop(payload)
        if self.graphs.get(device) is stored:
            del self.graphs[device]
        self.uncharge(device, stored.held)

    def forget_graphs(self) -> None:
        """Drop every stored and compiled graph and return their bytes."""
        for dev, compiled in enumerate(self.compiled):
            for payload in list(compiled):
                self.forget_graph(dev, payload)
        self.graphs.clear()

    def note(self, key: str, fmt: str, *args) -> None:
        """A warning that a client can repeat at will: logged once per connection,
        then only at debug level (no log flood)."""
        if key in self._noted:
            log.debug(fmt, *args)
        else:
            self._noted.add(key)
            log.warning(fmt + " (further ones on this connection at debug level)", *args)

    def hello(self) -> None:
        head = self.conn.recv_exact(9)
        cmd, size = protocol.HEADER.unpack(head)
        if cmd != Cmd.HELLO:
            raise ProtocolError(f"expected HELLO first, got command {cmd}; the client needs an update")
        if size != CONN_CAPS_SIZE:
            raise ProtocolError(f"HELLO of {size} bytes (expected {CONN_CAPS_SIZE}): "
                                f"the client needs protocol v{protocol.PROTO_MAJOR}.x")
        client_caps = bytes(self.conn.recv_exact(CONN_CAPS_SIZE))
        self.peer_ok = client_caps == peers.PEER_CAPS and self.limits.peers
        caps = peers.PEER_CAPS if self.peer_ok else local_caps(self.conn.sock)
        if self.debug:
            self.server.dbg("[hello] version: %d.%d.%d", protocol.PROTO_MAJOR, protocol.PROTO_MINOR,
                            protocol.PROTO_PATCH)
        rsp = bytes([protocol.PROTO_MAJOR, protocol.PROTO_MINOR, protocol.PROTO_PATCH, 0]) + caps
        self.conn.send(protocol.SIZE.pack(len(rsp)), rsp)
        # The answer goes over TCP first; only then do the client's caps apply.
        # With zero local caps there is nothing to activate: stay on TCP.
        del client_caps

    def reply(self, payload: bytes) -> None:
        self.conn.send_sized(payload)

    def device_index(self, dev: int) -> int:
        if dev >= len(self.devices):
            raise ValidationError(f"device {dev} out of range ({len(self.devices)} devices)")
        return dev

    def buffer(self, handle: int) -> ServerBuffer:
        return self.buffers.lookup(handle)

    def tensor(self, buf, off: int = 0, need_buffer: bool = True, full: bool = False):
        """Decode and validate one rpc_tensor; returns (tensor, buffer or None).
        Without `full`, the tensor may carry only buffer, data, nbytes and name_str."""
        if full:
            t = self.codec.decode_tensor(buf, off)
            self.codec.check_tensor_shape(t)
        else:
            t = self.codec.decode_checked(buf, off)
        if t.buffer == 0:
            if need_buffer:
                raise ValidationError(f"tensor {t.name_str!r} has no buffer")
            return t, None
        b = self.buffer(t.buffer)
        if not self.codec.range_inside(t.data, t.nbytes, b.base, b.size):
            raise ValidationError(
                f"tensor {t.name_str!r} data {t.data:#x}+{t.nbytes} outside its buffer "
                f"[{b.base:#x}, {b.base + b.size:#x})")
        return t, b

    def region(self, t, b: ServerBuffer, offset: int, size: int) -> int:
        """Check [data + offset, + size) against the tensor and the buffer; returns the
        byte offset into the buffer. data + offset at the buffer's end is rejected even
        for size 0, as llama.cpp does."""
        if offset > t.nbytes or size > t.nbytes - offset:
            raise ValidationError(
                f"region offset={offset} size={size} outside tensor {t.name_str!r} of {t.nbytes} bytes")
        start = t.data + offset
        if start < b.base or start - b.base >= b.size or size > b.size - (start - b.base):
            raise ValidationError(f"region {start:#x}+{size} outside the buffer")
        return start - b.base

    # -- dispatch ----------------------------------------------------------
    def dispatch(self, cmd: int, size: int) -> None:
        """Run one command; self.request holds the payload of a fixed-size request,
        which the transport reads only when `size` is the command's size."""
        if cmd >= CMD_COUNT:
            if self.peer_ok and cmd in _PEER_HANDLERS:
                return _PEER_HANDLERS[cmd](self, size)
            raise ProtocolError(f"unknown command {cmd}")
        want = _FIXED_SIZE[cmd]
        if want is not None and self.request is None:
            raise ProtocolError(f"{Cmd(cmd).name} payload of {size} bytes (expected {want})")
        _HANDLER_LIST[cmd](self, size)

    def cmd_hello(self, size):
        raise ProtocolError("second HELLO on a connection")

    def cmd_device_count(self, size):
        if self.debug:
            self.server.dbg("[device_count] %d", len(self.devices))
        self.reply(U32.pack(len(self.devices)))

    def cmd_alloc_buffer(self, size):
        dev, req = struct.unpack("<IQ", self.request)
        self.device_index(dev)
        mem = None
        cap = self.limits.max_buffers
        if cap is not None and len(self.buffers) >= cap:
            self.note("buffers", "[alloc_buffer] %s: refused, %d buffers held (the limit per "
                      "connection, --max-buffers)", self.peer, len(self.buffers))
            return self.reply(U64x2.pack(0, 0))
        ledger = self.server.ledgers[dev]
        if not ledger.reserve(req):
            self.note("memory", "[alloc_buffer] %s: refused %d bytes on device %d: %d of %d bytes "
                      "in use (--mem-limit)", self.peer, req, dev, ledger.used, ledger.limit)
            return self.reply(U64x2.pack(0, 0))
        if req > ledger.share - self.held[dev]:
            ledger.release(req)
            self.note("share", "[alloc_buffer] %s: refused %d bytes on device %d: the connection "
                      "holds %d of the %d bytes one client may (--client-mem-limit)", self.peer,
                      req, dev, self.held[dev], ledger.share)
            return self.reply(U64x2.pack(0, 0))
        if req:
            mem = self.devices[dev].alloc_buffer(req)
            if mem is None:
                ledger.release(req)
                if self.debug:
                    self.server.dbg("[alloc_buffer] device: %d, size: %d -> failed", dev, req)
                return self.reply(U64x2.pack(0, 0))
        self.held[dev] += req
        handle = (next(Session._handles) << 4) | 0x5250_4300_0000_0000
        self.buffers.add(handle, req, dev, mem)
        if self.debug:
            self.server.dbg("[alloc_buffer] device: %d, size: %d -> remote_ptr: %x, remote_size: %d",
                            dev, req, handle, req)
        self.reply(U64x2.pack(handle, req))

    def _device_property(self, name: str) -> None:
        """GET_ALIGNMENT, GET_MAX_SIZE: a u32 device in, its `name`() out as a u64."""
        (dev,) = U32.unpack(self.request)
        v = getattr(self.devices[self.device_index(dev)], name)()
        if self.debug:
            self.server.dbg("[get_%s] device: %d, %s: %d", name, dev, name, v)
        self.reply(U64.pack(v))

    def cmd_get_alignment(self, size):
        self._device_property("alignment")

    def cmd_get_max_size(self, size):
        self._device_property("max_size")

    def cmd_buffer_get_base(self, size):
        (h,) = U64.unpack(self.request)
        b = self.buffer(h)
        if self.debug:
            self.server.dbg("[buffer_get_base] remote_ptr: %x -> %x", h, b.base)
        self.reply(U64.pack(b.base))

    def cmd_free_buffer(self, size):
        (h,) = U64.unpack(self.request)
        b = self.buffer(h)
        if self.debug:
            self.server.dbg("[free_buffer] remote_ptr: %x", h)
        # stored graphs may point into this buffer; like llama.cpp, drop them all
        self.forget_graphs()
        self.drop(b)

    def cmd_buffer_clear(self, size):
        h, value = struct.unpack("<QB", self.request)
        b = self.buffer(h)
        if self.debug:
            self.server.dbg("[buffer_clear] remote_ptr: %x, value: %d", h, value)
        if b.mem is not None:
            b.mem.fill(0, b.size, value)

    def cmd_set_tensor(self, size):
        if size < SET_TENSOR_HEADER_SIZE:
            raise ProtocolError(f"SET_TENSOR payload of {size} bytes is shorter than its header")
        head = self.conn.recv_exact(SET_TENSOR_HEADER_SIZE)
        t, b = self.tensor(head)
        cache_flag, offset = struct.unpack_from("<BQ", head, TENSOR_SIZE)
        n = size - SET_TENSOR_HEADER_SIZE
        at = self.region(t, b, offset, n)
        if self.debug:
            self.server.dbg("[set_tensor] buffer: %x, data: %x, offset: %d, size: %d",
                            b.handle, t.data, offset, n)
        if n:
            self.conn.recv_into_buffer(b.mem, at, n)
        cache = self.server.cache
        if cache is not None and cache_flag and n > protocol.HASH_THRESHOLD and self.announced:
            # kept only as llama.cpp's client asks for it: a weight over the threshold,
            # announced by a SET_TENSOR_HASH that this connection was told is not cached
            h = b.mem.fnv1a(at, n)
            if h not in self.announced:
                return
            self.announced.remove(h)
            try:
                path = cache.store(h, b.view()[at:at + n], owner=self.address)
            except OSError as e:
                # the data is in place; a full or broken cache must not cost the
                # client its connection (llama.cpp ignores a failed write as well)
                log.warning("[set_tensor] cannot write cache file for %016x: %s", h, e)
            else:
                if path is not None:
                    self.stats.cache_stores += 1
                    log.info("[set_tensor] saved to '%s'", path)

    def cmd_set_tensor_hash(self, size):
        req = self.request
        t, b = self.tensor(req)
        offset, h = U64x2.unpack_from(req, TENSOR_SIZE)
        cache = self.server.cache
        data = cache.load(h, peer=self.address) if cache is not None else None
        if data is None:
            self.stats.cache_misses += 1
            if len(self.announced) >= ANNOUNCED_MAX:
                self.announced.pop(0)
            self.announced.append(h)
            if self.debug:
                self.server.dbg("[set_tensor_hash] hash: %x -> not cached", h)
            self.reply(b"\x00")
            return
        try:
            n = len(data)
            at = self.region(t, b, offset, n)
            if self.debug:
                self.server.dbg("[set_tensor_hash] buffer: %x, data: %x, offset: %d, size: %d, hash: %x",
                                b.handle, t.data, offset, n, h)
            if n:
                b.mem.write(at, data)
        finally:
            if isinstance(data, mmap.mmap):
                data.close()
        self.stats.cache_hit(n)
        self.reply(b"\x01")

    def cmd_get_tensor(self, size):
        req = self.request
        t, b = self.tensor(req)
        offset, n = U64x2.unpack_from(req, TENSOR_SIZE)
        at = self.region(t, b, offset, n)
        if self.debug:
            self.server.dbg("[get_tensor] buffer: %x, data: %x, offset: %d, size: %d",
                            b.handle, t.data, offset, n)
        header = protocol.SIZE.pack(n)
        self.stats.get_tensor_bytes += n
        if n:
            self.conn.send_from_buffer(header, b.mem, at, n)
        else:
            self.conn.send(header)

    def cmd_memset_tensor(self, size):
        req = self.request
        t, b = self.tensor(req)
        offset, n = U64x2.unpack_from(req, TENSOR_SIZE)
        value = req[TENSOR_SIZE + 16]
        at = self.region(t, b, offset, n)
        if self.debug:
            self.server.dbg("[memset_tensor] buffer: %x, data: %x, offset: %d, size: %d, value: %d",
                            b.handle, t.data, offset, n, value)
        if n:
            b.mem.fill(at, n, value)

    def cmd_copy_tensor(self, size):
        req = self.request
        src, sb = self.tensor(req, 0)
        dst, db = self.tensor(req, TENSOR_SIZE)
        n = src.nbytes
        if not self.codec.range_inside(dst.data, n, db.base, db.size):
            raise ValidationError(
                f"COPY_TENSOR of {n} bytes would write past the destination buffer")
        if self.debug:
            self.server.dbg("[copy_tensor] src->buffer: %x, dst->buffer: %x", sb.handle, db.handle)
        ok = True
        if n:
            ok = db.mem.copy_from(dst.data - db.base, sb.mem, src.data - sb.base, n)
        self.reply(b"\x01" if ok else b"\x00")

    def cmd_init_tensor(self, size):
        req = self.request
        t, b = self.tensor(req, need_buffer=False, full=True)
        if self.debug:
            self.server.dbg("[init_tensor] buffer: %x, data: %x", b.handle if b else 0, t.data)
        if b is None:
            self.note("init0", "INIT_TENSOR for tensor %r without a buffer", t.name_str)
            return
        self.devices[b.device].init_tensor(b.mem, t, t.data - b.base)

    def cmd_get_alloc_size(self, size):
        req = self.request
        (dev,) = U32.unpack_from(req, 0)
        self.device_index(dev)
        t, b = self.tensor(req, 4, need_buffer=False, full=True)
        for i in range(protocol.MAX_SRC):
            off = 4 + TENSOR_SIZE * (1 + i)
            if U64.unpack_from(req, off)[0]:
                self.tensor(req, off, need_buffer=False)
        device = self.devices[b.device if b is not None else dev]
        n = device.alloc_size(t, t.nbytes)
        if self.debug:
            self.server.dbg("[get_alloc_size] device: %d, buffer: %x, data: %x -> %d",
                            dev, b.handle if b else 0, t.data, n)
        self.reply(U64.pack(n))

    def cmd_get_device_memory(self, size):
        (dev,) = U32.unpack(self.request)
        free, total = self.devices[self.device_index(dev)].memory()
        if self.debug:
            self.server.dbg("[get_device_memory] device: %d, free_mem: %d, total_mem: %d", dev, free, total)
        self.reply(U64x2.pack(free, total))

    def cmd_graph_compute(self, size):
        if size < 8:
            raise ProtocolError(f"GRAPH_COMPUTE payload of {size} bytes")
        if size > MAX_GRAPH_PAYLOAD:
            raise ProtocolError(f"GRAPH_COMPUTE payload of {size} bytes exceeds the limit")
        device, charged, received = self.recv_graph(size)   # its decoding is charged
        try:
            payload = bytes(received)
            del received
            t0 = perf_counter_ns()
            if self.debug:   # llama.cpp's line, from a header whose counts fit (the decoder refuses others)
                (n_nodes,) = U32.unpack_from(payload, 4)
                at = 8 + 8 * n_nodes
                if at + 4 <= len(payload):
                    self.debug_graph(device, n_nodes, U32.unpack_from(payload, at)[0])
            # a graph sent again byte for byte (a host that runs several graphs in turn
            # on one device, as -sm row does) was checked and compiled when it came first:
            # the buffers it names are still there (freeing any drops every compiled graph)
            stored = self.compiled[device].pop(payload, None)
            if stored is not None:
                self.compiled[device][payload] = self.graphs[device] = stored     # now the newest
            else:
                graph = graph_from_payload(self, payload)
                try:
                    plan = self.devices[device].executor().compile(
                        graph, self.limits.max_graph_work,
                        **({"ext_rules": {peers.OP_GATHER: self.gather_rule}} if self.group else {}))
                finally:
                    graph.release()
                n_nodes = graph.n_nodes
                del graph
        finally:
            self.uncharge(device, charged)
            if charged >= TRIM_AT:
                return_freed_memory()
        if stored is None:   # a failed run closes the connection, releasing it
            stored = self.keep_graph(device, plan, n_nodes, payload)
        with self.server.graph_watch.computing(self) as cancel:
            self.devices[device].executor().run(stored.plan, cancel)
        self.stats.graph(device, "compute", stored.n_nodes, perf_counter_ns() - t0)

    # -- the peer extension (ggmlrpc.peers) -----------------------------------
    def cmd_peer_group(self, size):
        if size > peers.GROUP_MAX:
            raise ProtocolError(f"PEER_GROUP payload of {size} bytes")
        if self.group is not None:
            raise ValidationError("a second PEER_GROUP on one connection")
        token, rank, endpoints = peers.parse_group(bytes(self.conn.recv_exact(size)))
        g = peers.Group(token, rank, len(endpoints))
        ok = self.server.peer_groups.add(g)
        if ok:
            self.group = g
            try:
                for r in range(rank + 1, g.n):
                    g.attach(r, peers.link_to(g, r, endpoints[r]))
                ok = g.wait_links(peers.LINK_TIMEOUT)
                if not ok:
                    log.error("peer group %016x: rank %d had %d of its %d links after %gs", token, rank,
                              len(g.links), g.n - 1, peers.LINK_TIMEOUT)
            except (OSError, GgmlRpcError) as e:
                log.error("peer group %016x: rank %d cannot link to rank %d: %s", token, rank, r, e)
                ok = False
            if not ok:
                g.close()
        self.reply(bytes([ok]))

    def cmd_peer_link(self, size):
        if size != peers.LINK_SIZE:
            raise ProtocolError(f"PEER_LINK payload of {size} bytes")
        token, rank = peers.parse_link(bytes(self.conn.recv_exact(size)))
        g = self.server.peer_groups.find(token, peers.LINK_TIMEOUT)
        self.conn.timeout = peers.EXCHANGE_TIMEOUT
        if g is None or rank >= g.rank or not g.attach(rank, self.conn):
            self.reply(b"\0")
            raise ValidationError(f"PEER_LINK to an unknown group or rank {rank}")
        self.reply(b"\1")
        g.closed.wait()     # the group reads and writes this connection from now on
        raise ConnectionLost("peer link closed")

    def gather_rule(self, node, srcs):
        return peers.gather_rule(self.group, node, srcs)

    def debug_graph(self, device: int, n_nodes: int, n_tensors: int) -> None:
        self.server.dbg("[graph_compute] device: %d, n_nodes: %d, n_tensors: %d", device, n_nodes, n_tensors)

    def cmd_graph_recompute(self, size):
        (dev,) = U32.unpack(self.request)
        self.device_index(dev)
        stored = self.graphs.get(dev)
        if stored is None:
            raise ValidationError(f"GRAPH_RECOMPUTE on device {dev} without a stored graph")
        if self.debug:
            self.server.dbg("[graph_recompute] device: %d", dev)
        t0 = perf_counter_ns()
        with self.server.graph_watch.computing(self) as cancel:
            self.devices[dev].executor().run(stored.plan, cancel)
        self.stats.graph(dev, "recompute", stored.n_nodes, perf_counter_ns() - t0)

    def recv_graph(self, size: int) -> tuple[int, int, bytearray]:
        """A graph payload, read in chunks so that memory grows only as bytes arrive:
        (device, bytes charged, payload). After the first chunk its counts are checked
        against the caps (a bogus count closes the connection before the rest is
        read) and the memory its decoding takes (graph.DECODE_FACTOR per byte kept) is
        charged to the device it names, until the caller uncharges it; bytes past the
        last tensor, which the decoder ignores as llama.cpp does, are read and dropped
        without being kept."""
        out = self.conn.recv_exact(min(size, GRAPH_CHUNK))
        device, n_nodes = protocol.graph_layout(size, out[:8])
        self.device_index(device)
        need, off = size, 8 + 8 * n_nodes
        if off + 4 <= len(out):
            (n_tensors,) = U32.unpack_from(out, off)
            if n_tensors > protocol.MAX_GRAPH_TENSORS:
                raise ProtocolError(f"graph of {n_tensors} tensors (at most "
                                    f"{protocol.MAX_GRAPH_TENSORS})")
            need = min(size, off + 4 + TENSOR_SIZE * n_tensors)
        charged = DECODE_FACTOR * need
        self.charge(device, charged, f"decoding a graph of {need} bytes")
        try:
            while len(out) < need:
                out += self.conn.recv_exact(min(need - len(out), GRAPH_CHUNK))
            if size > max(need, len(out)):
                self.conn.discard(size - max(need, len(out)))
        except BaseException:
            self.uncharge(device, charged)
            raise
        return device, charged, out


_HANDLERS = {
    Cmd.ALLOC_BUFFER: Session.cmd_alloc_buffer,
    Cmd.GET_ALIGNMENT: Session.cmd_get_alignment,
    Cmd.GET_MAX_SIZE: Session.cmd_get_max_size,
    Cmd.BUFFER_GET_BASE: Session.cmd_buffer_get_base,
    Cmd.FREE_BUFFER: Session.cmd_free_buffer,
    Cmd.BUFFER_CLEAR: Session.cmd_buffer_clear,
    Cmd.SET_TENSOR: Session.cmd_set_tensor,
    Cmd.SET_TENSOR_HASH: Session.cmd_set_tensor_hash,
    Cmd.GET_TENSOR: Session.cmd_get_tensor,
    Cmd.COPY_TENSOR: Session.cmd_copy_tensor,
    Cmd.GRAPH_COMPUTE: Session.cmd_graph_compute,
    Cmd.GET_DEVICE_MEMORY: Session.cmd_get_device_memory,
    Cmd.INIT_TENSOR: Session.cmd_init_tensor,
    Cmd.GET_ALLOC_SIZE: Session.cmd_get_alloc_size,
    Cmd.HELLO: Session.cmd_hello,
    Cmd.DEVICE_COUNT: Session.cmd_device_count,
    Cmd.GRAPH_RECOMPUTE: Session.cmd_graph_recompute,
    Cmd.MEMSET_TENSOR: Session.cmd_memset_tensor,
}
assert len(_HANDLERS) == CMD_COUNT
_HANDLER_LIST = [_HANDLERS[c] for c in range(CMD_COUNT)]
_FIXED_SIZE = [REQUEST_SIZE[c] for c in range(CMD_COUNT)]  # None: variable size

_PEER_HANDLERS = {peers.CMD_PEER_GROUP: Session.cmd_peer_group, peers.CMD_PEER_LINK: Session.cmd_peer_link}
