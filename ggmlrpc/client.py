"""RemoteBackend: drive any ggml RPC server (ours or llama.cpp's) from Python.

    rb = RemoteBackend("127.0.0.1:50052")
    buf = rb.alloc_buffer(1 << 20)
    x = buf.tensor(GGMLType.F32, (256, 4))
    rb.set_tensor(x, np.arange(1024, dtype=np.float32))
    y = rb.get_tensor(x)

Commands are sent exactly as llama.cpp's client sends them (same sizes, same
fire-and-forget commands, hash-first writes of weights above 10 MiB). Failures
raise typed exceptions from ggmlrpc.errors; nothing here aborts the process.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import socket
import struct
import threading
from typing import Iterable, Sequence

import numpy as np

from . import ggml, protocol
from . import peers as _peers
from .errors import ConnectionLost, ProtocolError, ServerClosed, VersionMismatch
from .ggml import GGMLOp, GGMLType, TensorFlag
from .protocol import Cmd, RpcTensor
from .transport import Conn, local_caps

_ids = itertools.count(1)
SENDV_MAX = 8      # byte strings per native writev (GR_SENDV_MAX in csrc/rpc.h)


class Tensor:
    """A tensor description for the wire: shape, strides, op and sources.

    Tensors in remote memory have `buffer` (a RemoteBuffer) and `data` (a server
    address); graph results do too once placed in a buffer.
    """

    def __init__(self, type: int, ne: Sequence[int], *, nb: Sequence[int] | None = None,
                 op: int = GGMLOp.NONE, src: Sequence["Tensor | None"] = (),
                 op_params: Sequence[int] = (), view_src: "Tensor | None" = None,
                 view_offs: int = 0, buffer: "RemoteBuffer | None" = None, data: int = 0,
                 name: str = "", flags: int = 0):
        ne = tuple(ne) + (1,) * (4 - len(ne))
        if ne[0] % ggml.blck_size(type):
            raise ValueError(f"ne[0]={ne[0]} not a multiple of the block size of {ggml.type_name(type)}")
        self.id = next(_ids)
        self.type = int(type)
        self.ne = ne
        self.nb = tuple(nb) if nb is not None else ggml.contiguous_strides(type, ne)
        self.op = int(op)
        self.src = list(src)
        self.op_params = list(op_params) + [0] * (16 - len(op_params))
        self.view_src = view_src
        self.view_offs = view_offs
        self.buffer = buffer
        self.data = data
        self.name = name
        self.flags = flags

    @functools.cached_property
    def nbytes(self) -> int:
        """ggml_nbytes (the shape and strides do not change after construction)."""
        return ggml.nbytes(self.type, self.ne, self.nb)

    def to_rpc(self, use_count: int = 0) -> RpcTensor:
        src = [s.id if s is not None else 0 for s in self.src]
        return RpcTensor(
            id=self.id, type=self.type, buffer=self.buffer.handle if self.buffer else 0,
            ne=self.ne, nb=tuple(int(x) & 0xFFFFFFFF for x in self.nb), op=self.op,
            op_params=tuple(int(p) for p in self.op_params), flags=self.flags,
            src=tuple(src + [0] * (protocol.MAX_SRC - len(src))),
            view_src=self.view_src.id if self.view_src is not None else 0,
            view_offs=self.view_offs, data=self.data if self.buffer else 0,
            name=self.name.encode()[:63], use_count=use_count)

    def view(self, ne: Sequence[int], nb: Sequence[int] | None = None, offset: int = 0,
             name: str = "") -> "Tensor":
        """A VIEW of this tensor's memory (ggml_view_4d)."""
        ne = tuple(ne) + (1,) * (4 - len(ne))
        nb = tuple(nb) if nb is not None else ggml.contiguous_strides(self.type, ne)
        v = Tensor(self.type, ne, nb=nb, op=GGMLOp.VIEW, src=[self], op_params=[offset],
                   view_src=self, view_offs=offset, buffer=self.buffer,
                   data=self.data + offset if self.buffer else 0, name=name or f"{self.name} (view)")
        return v

    def __repr__(self):
        return f"Tensor({self.name!r}, {ggml.type_name(self.type)}, ne={self.ne}, op={ggml.op_name(self.op)})"


class StepRequests:
    """A step's requests with their headers encoded once: everything but the input
    bytes of SET_TENSOR (over all of `span` at offset 0), GRAPH_COMPUTE of `wire` (or
    GRAPH_RECOMPUTE of `device`), GET_TENSOR of all of `out`. The tensors must not be
    moved afterwards (their placement is in the bytes)."""

    def __init__(self, span: Tensor, wire: bytes, out: Tensor, device: int):
        self.wire = wire
        self.set_head = (protocol.HEADER.pack(Cmd.SET_TENSOR, protocol.SET_TENSOR_HEADER_SIZE + span.nbytes)
                         + protocol.encode_tensor(span.to_rpc()) + struct.pack("<BQ", 0, 0))
        self.compute = protocol.HEADER.pack(Cmd.GRAPH_COMPUTE, len(wire)) + wire
        self.recompute = protocol.HEADER.pack(Cmd.GRAPH_RECOMPUTE, 4) + struct.pack("<I", device)
        self.size = out.nbytes
        get = protocol.encode_tensor(out.to_rpc()) + struct.pack("<QQ", 0, self.size)
        self.get = protocol.HEADER.pack(Cmd.GET_TENSOR, len(get)) + get


def op(op: int, type: int, ne: Sequence[int], *src: Tensor, params: Sequence[int] = (),
       name: str = "") -> Tensor:
    """A compute node: `op` over `src`, result of `type` and shape `ne`."""
    return Tensor(type, ne, op=op, src=src, op_params=params, name=name, flags=TensorFlag.COMPUTE)


def graph_tensors(nodes: Iterable[Tensor]) -> list[Tensor]:
    """Every node and, recursively, its sources and view sources, each once, in
    post-order (sources first), as llama.cpp's client lists them."""
    out: list[Tensor] = []
    seen: set[int] = set()

    def visit(t):
        if t is None or t.id in seen:
            return
        seen.add(t.id)
        for s in t.src:
            visit(s)
        visit(t.view_src)
        out.append(t)

    for n in nodes:
        visit(n)
    return out


def rpc_tensors(nodes: Sequence[Tensor]) -> list[RpcTensor]:
    """The wire records of every tensor a graph of `nodes` names, with use counts."""
    tensors = graph_tensors(nodes)
    uses: dict[int, int] = {}
    for t in tensors:
        for s in t.src:
            if s is not None:
                uses[s.id] = uses.get(s.id, 0) + 1
    return [t.to_rpc(uses.get(t.id, 0)) for t in tensors]


def serialize_graph(device: int, nodes: Sequence[Tensor]) -> bytes:
    return protocol.encode_graph(device, [n.id for n in nodes], rpc_tensors(nodes))


_DTYPES = {GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.I32: np.int32,
           GGMLType.I64: np.int64, GGMLType.I8: np.int8, GGMLType.I16: np.int16,
           GGMLType.F64: np.float64}


def tensor_array(tensor: Tensor, raw) -> np.ndarray:
    """A contiguous tensor's bytes as a numpy array (ne reversed, trailing 1s dropped;
    quantized types as raw uint8)."""
    if tensor.type not in _DTYPES:
        return np.frombuffer(raw, dtype=np.uint8)
    n_dims = max([i + 1 for i in range(4) if tensor.ne[i] != 1] or [1])
    return np.frombuffer(raw, dtype=_DTYPES[tensor.type]).reshape(tensor.ne[:n_dims][::-1])


def _cmd_name(cmd: int) -> str:
    return Cmd(cmd).name if cmd < protocol.CMD_COUNT else _peers.COMMAND_NAMES.get(cmd, f"command {cmd}")


def _closed_by_server(e: ConnectionLost) -> bool:
    """An orderly close, or a reset: a server that closes with our next request still
    unread in its socket makes the kernel answer RST (ECONNRESET, then EPIPE)."""
    msg = str(e)
    return any(s in msg for s in ("closed by peer", "reset by peer", "Broken pipe")) or \
        isinstance(e.__cause__, (ConnectionResetError, BrokenPipeError))


class RemoteBuffer:
    """A buffer on the server: handle (remote_ptr), size and base address."""

    def __init__(self, backend: "RemoteBackend", handle: int, size: int, base: int, device: int):
        self.backend = backend
        self.handle = handle
        self.size = size
        self.base = base
        self.device = device

    def tensor(self, type: int, ne: Sequence[int], offset: int = 0, name: str = "",
               nb: Sequence[int] | None = None) -> Tensor:
        """A tensor placed at `offset` in this buffer."""
        t = Tensor(type, ne, nb=nb, buffer=self, data=self.base + offset, name=name)
        return t

    def clear(self, value: int = 0) -> None:
        self.backend.buffer_clear(self, value)

    def free(self) -> None:
        self.backend.free_buffer(self)

    def __repr__(self):
        return f"RemoteBuffer(handle={self.handle:#x}, size={self.size}, base={self.base:#x})"


class RemoteBackend:
    """A connection to one RPC server (all its devices).

    endpoint: "host:port"; timeout: seconds that one request and its response may take
    in all, from the first byte sent to the last byte received (None = forever);
    RpcTimeout when a server is slower, even one that trickles bytes.
    Thread-safe: one command at a time, like llama.cpp's one worker per connection.
    """

    def __init__(self, endpoint: str, timeout: float | None = 60.0, connect: bool = True,
                 peers: bool = False):
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"endpoint must be host:port, got {endpoint!r}")
        self.endpoint = endpoint
        self.host, self.port = host, int(port)
        self.timeout = timeout
        self.conn: Conn | None = None
        self.version: tuple[int, int, int] | None = None
        self.server_caps = bytes(protocol.CONN_CAPS_SIZE)
        self.want_peers = peers              # ask for the peer extension in HELLO (ggmlrpc.peers)
        self._lock = threading.RLock()
        self._corked: list | None = None     # queued frames of unanswered commands
        self.writes = 0                      # socket writes so far (tests count them)
        # called once, in the calling thread, when a request is out and its response
        # is awaited next: host work that can overlap the server's (it must not raise)
        self.waiting = None
        if connect:
            self.connect()

    # -- connection --------------------------------------------------------
    def connect(self) -> None:
        """Open the connection and do HELLO; reopens a lost connection."""
        with self._lock:
            self.close()
            try:
                sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
            except OSError as e:
                raise ConnectionLost(f"cannot connect to {self.endpoint}: {e}") from e
            self.conn = Conn(sock, self.timeout)
            caps = _peers.PEER_CAPS if self.want_peers else local_caps(sock)
            rsp = self._call(Cmd.HELLO, caps)
            major, minor, patch = rsp[0], rsp[1], rsp[2]
            self.version = (major, minor, patch)
            self.server_caps = bytes(rsp[4:])
            if major != protocol.PROTO_MAJOR or minor > protocol.PROTO_MINOR:
                self.close()
                raise VersionMismatch(f"server speaks RPC v{major}.{minor}.{patch}, "
                                      f"this client v{protocol.PROTO_MAJOR}.{protocol.PROTO_MINOR}.x")

    reconnect = connect

    @property
    def peers(self) -> bool:
        """The server speaks the peer extension on this connection (ggmlrpc.peers)."""
        return self.want_peers and self.server_caps == _peers.PEER_CAPS

    def request_peer_group(self, token: int, rank: int, endpoints: list[str]):
        """Send PEER_GROUP (ggmlrpc.peers) and return a function that reads its answer
        (True: the server linked to every other rank): ask every server, then wait."""
        with self._lock:
            self._send(_peers.CMD_PEER_GROUP, _peers.group_request(token, rank, endpoints))

        def answer() -> bool:
            with self._lock:
                return bytes(self._recv_rsp(_peers.CMD_PEER_GROUP, 1)) == b"\1"
        return answer

    def close(self) -> None:
        with self._lock:
            self._corked = None
            if self.conn is not None:
                self.conn.close()
                self.conn = None

    @property
    def connected(self) -> bool:
        return self.conn is not None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _send(self, cmd: int, *payload) -> None:
        """Send one request; this starts its deadline (`timeout` bounds the request and
        its response together, however slowly the server sends or reads). Commands
        queued by `corked()` go first, in the same write."""
        self._send_parts(_cmd_name(cmd), (protocol.HEADER.pack(cmd, sum(len(p) for p in payload)), *payload))

    def _send_parts(self, what: str, parts: tuple) -> None:
        """_send of requests already framed (`what`: the last one's name)."""
        if self.conn is None:
            raise ConnectionLost("not connected")
        if self._corked:
            parts = (*self._corked, *parts)
            self._corked.clear()
        self.conn.arm(self.timeout)
        try:
            self._write(parts)
        except ConnectionLost as e:
            self._lost(e, f"before {what}")
            raise

    def _write(self, parts) -> None:
        """Byte strings back to back in as few writes as the native writev allows
        (SENDV_MAX parts each): small neighbours are joined first."""
        if len(parts) > SENDV_MAX:
            merged: list = []
            for p in parts:
                if merged and len(p) < 4096 and isinstance(merged[-1], bytearray):
                    merged[-1] += p
                elif len(p) < 4096:
                    merged.append(bytearray(p))
                else:
                    merged.append(p)
            parts = merged
        for i in range(0, len(parts), SENDV_MAX):
            self.conn.send(*parts[i:i + SENDV_MAX])
            self.writes += 1

    @contextlib.contextmanager
    def corked(self):
        """Hold back the commands that have no response and send them together with
        the next one that has (or at the end of the block), in one write: a token's
        SET_TENSOR, GRAPH_RECOMPUTE and GET_TENSOR reach the server as one message,
        and the server finds them all in one read. The order on the wire is the order
        of the calls; nothing waits in between except for a response. The payloads
        are referenced, not copied: they must not change until the block sends them."""
        with self._lock:
            if self._corked is not None:       # nested: the outer block sends
                yield self
                return
            self._corked = []
            try:
                yield self
                if self._corked:
                    parts = self._corked
                    self._corked = []
                    if self.conn is None:
                        raise ConnectionLost("not connected")
                    self.conn.arm(self.timeout)
                    try:
                        self._write(parts)
                    except ConnectionLost as e:
                        self._lost(e, "sending queued commands")
                        raise
            finally:
                self._corked = None

    def _lost(self, e: ConnectionLost, when: str) -> None:
        """Close after a failed send or receive; raise ServerClosed when the server
        closed its end (orderly or with a reset), else let the caller re-raise."""
        self.close()
        if _closed_by_server(e):
            raise ServerClosed(f"{self.endpoint} closed the connection {when}") from e

    def fileno(self) -> int | None:
        """The connection's socket (to poll whether an answer has begun to arrive);
        None when not connected."""
        return None if self.conn is None else self.conn.fd

    def run_waiting(self) -> None:
        """Run the `waiting` hook now, if one is set (it runs once)."""
        hook, self.waiting = self.waiting, None
        if hook is not None:
            hook()

    def _recv_rsp(self, cmd: int, size: int | None = None, into=None):
        want = protocol.RESPONSE_SIZE[cmd] if size is None else size
        self.run_waiting()
        try:
            (n,) = protocol.SIZE.unpack(self.conn.recv_exact(8))
            if n != want:
                raise ProtocolError(f"{_cmd_name(cmd)}: response of {n} bytes (expected {want})")
            if into is not None:
                self.conn.recv_into(into)
                return into
            return self.conn.recv_exact(n)
        except ConnectionLost as e:
            self._lost(e, f"after {_cmd_name(cmd)} (it rejects bad requests so)")
            raise
        except ProtocolError:
            self.close()
            raise

    def _call(self, cmd: int, payload: bytes = b"", rsp_size: int | None = None):
        with self._lock:
            self._send(cmd, payload)
            return self._recv_rsp(cmd, rsp_size)

    def _post(self, cmd: int, *payload) -> None:
        """A command without a response (queued inside `corked()`)."""
        with self._lock:
            if self._corked is not None:
                self._corked.append(protocol.HEADER.pack(cmd, sum(len(p) for p in payload)))
                self._corked.extend(payload)
                return
            self._send(cmd, *payload)

    # -- devices -------------------------------------------------------------
    def device_count(self) -> int:
        return struct.unpack("<I", self._call(Cmd.DEVICE_COUNT))[0]

    def get_device_memory(self, device: int = 0) -> tuple[int, int]:
        """(free, total) bytes."""
        return struct.unpack("<QQ", self._call(Cmd.GET_DEVICE_MEMORY, struct.pack("<I", device)))

    # What a server reports is checked before anything is laid out with it: a number
    # out of these bounds raises ProtocolError (ggml's alignments are powers of two of a
    # few hundred bytes at most; MAX_ALIGNMENT leaves ample room above them).
    MAX_ALIGNMENT = 1 << 16

    def get_alignment(self, device: int = 0) -> int:
        (a,) = struct.unpack("<Q", self._call(Cmd.GET_ALIGNMENT, struct.pack("<I", device)))
        if a == 0 or a & (a - 1) or a > self.MAX_ALIGNMENT:
            raise ProtocolError(f"{self.endpoint}: device {device} reports an alignment of {a} "
                                f"bytes (not a power of two up to {self.MAX_ALIGNMENT})")
        return a

    def get_max_size(self, device: int = 0) -> int:
        (m,) = struct.unpack("<Q", self._call(Cmd.GET_MAX_SIZE, struct.pack("<I", device)))
        if m == 0:
            raise ProtocolError(f"{self.endpoint}: device {device} reports a maximum buffer size of 0")
        return m

    # -- buffers -------------------------------------------------------------
    def alloc_buffer(self, size: int, device: int = 0) -> RemoteBuffer | None:
        """A new buffer, or None when the server could not allocate it."""
        with self._lock:
            handle, rsize = struct.unpack(
                "<QQ", self._call(Cmd.ALLOC_BUFFER, struct.pack("<IQ", device, size)))
            if handle == 0:
                return None
            base = self.buffer_get_base(handle)
        if rsize < size or (rsize and (base == 0 or base > (1 << 64) - rsize)):
            raise ProtocolError(f"{self.endpoint}: a buffer of {size} bytes came back as {rsize} "
                                f"bytes at {base:#x} (not inside the 64-bit address space)")
        return RemoteBuffer(self, handle, rsize, base, device)

    def buffer_get_base(self, handle: int) -> int:
        return struct.unpack("<Q", self._call(Cmd.BUFFER_GET_BASE, struct.pack("<Q", handle)))[0]

    def free_buffer(self, buffer: RemoteBuffer | int) -> None:
        h = buffer.handle if isinstance(buffer, RemoteBuffer) else buffer
        self._post(Cmd.FREE_BUFFER, struct.pack("<Q", h))

    def buffer_clear(self, buffer: RemoteBuffer | int, value: int = 0) -> None:
        h = buffer.handle if isinstance(buffer, RemoteBuffer) else buffer
        self._post(Cmd.BUFFER_CLEAR, struct.pack("<QB", h, value))

    # -- tensors -------------------------------------------------------------
    def set_tensor(self, tensor: Tensor, data, offset: int = 0, weights: bool = False) -> bool:
        """Write bytes into a tensor. With weights=True, writes above 10 MiB go hash
        first: SET_TENSOR_HASH, and the bytes only if the server has no cached copy.
        True when the server's cache supplied the bytes (nothing else was sent)."""
        mv = memoryview(data).cast("B") if not isinstance(data, np.ndarray) else \
            memoryview(np.ascontiguousarray(data)).cast("B")
        rt = protocol.encode_tensor(tensor.to_rpc())
        cache_flag = 0
        with self._lock:
            if weights and len(mv) > protocol.HASH_THRESHOLD:
                if self.set_tensor_hash(tensor, protocol.codec().fnv1a(mv), offset):
                    return True
                cache_flag = 1
            self._post(Cmd.SET_TENSOR, rt + struct.pack("<BQ", cache_flag, offset), mv)
        return False

    def set_tensor_hash(self, tensor: Tensor, hash: int, offset: int = 0) -> bool:
        """Ask the server to fill the tensor from its cache file for `hash` (FNV-1a
        of the bytes); True when it had the file and wrote it."""
        req = protocol.encode_tensor(tensor.to_rpc()) + struct.pack("<QQ", offset, hash)
        return bool(self._call(Cmd.SET_TENSOR_HASH, req)[0])

    def get_tensor(self, tensor: Tensor, offset: int = 0, size: int | None = None,
                   out=None):
        """Read bytes of a tensor (all of it by default) into `out` or a new bytearray."""
        if size is None:
            size = tensor.nbytes - offset
        req = protocol.encode_tensor(tensor.to_rpc()) + struct.pack("<QQ", offset, size)
        with self._lock:
            self._send(Cmd.GET_TENSOR, req)
            if out is None:
                out = bytearray(size)
            return self._recv_rsp(Cmd.GET_TENSOR, size, into=out)

    def request_tensor(self, tensor: Tensor, out=None):
        """Send GET_TENSOR for all of `tensor` (with what `corked()` holds) and return
        a function that reads the answer into `out`: a host asks every server before
        it waits for any. Nothing else may be sent on this connection in between."""
        size = tensor.nbytes
        req = protocol.encode_tensor(tensor.to_rpc()) + struct.pack("<QQ", 0, size)
        with self._lock:
            self._send(Cmd.GET_TENSOR, req)
        return self._answer(size, bytearray(size) if out is None else out)

    def _answer(self, size: int, out):
        """The reader of a GET_TENSOR answer of `size` bytes into `out`, sent before."""
        def answer():
            with self._lock:
                return self._recv_rsp(Cmd.GET_TENSOR, size, into=out)
        return answer

    def step_requests(self, span: Tensor, wire: bytes, out: Tensor, device: int = 0) -> "StepRequests":
        """The fixed bytes of a step that repeats with new inputs only (issue_step)."""
        return StepRequests(span, wire, out, device)

    def issue_step(self, req: "StepRequests", image, recompute: bool, out):
        """One step in one write (after what `corked()` holds): SET_TENSOR of `image`
        over the span, GRAPH_RECOMPUTE or GRAPH_COMPUTE of the serialized graph, and
        GET_TENSOR of the output; returns a function that reads the answer into `out`.
        The same messages as set_tensor, graph_compute_serialized and request_tensor,
        their headers encoded once (`req`)."""
        with self._lock:
            self._send_parts("GET_TENSOR", (req.set_head, image, req.recompute if recompute else req.compute,
                                            req.get))
        return self._answer(req.size, out)

    def get_array(self, tensor: Tensor) -> np.ndarray:
        """A contiguous tensor's contents as a numpy array (numpy order: ne reversed, trailing 1s dropped)."""
        return tensor_array(tensor, self.get_tensor(tensor))

    def memset_tensor(self, tensor: Tensor, value: int, offset: int = 0, size: int | None = None):
        if size is None:
            size = tensor.nbytes - offset
        self._post(Cmd.MEMSET_TENSOR, protocol.encode_tensor(tensor.to_rpc())
                   + struct.pack("<QQB", offset, size, value))

    def copy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        rsp = self._call(Cmd.COPY_TENSOR, protocol.encode_tensor(src.to_rpc())
                         + protocol.encode_tensor(dst.to_rpc()))
        return bool(rsp[0])

    def init_tensor(self, tensor: Tensor) -> None:
        self._post(Cmd.INIT_TENSOR, protocol.encode_tensor(tensor.to_rpc()))

    def get_alloc_size(self, tensor: Tensor, device: int = 0) -> int:
        srcs = [s.to_rpc() if s is not None else RpcTensor(id=0, ne=(0, 0, 0, 0), nb=(0,) * 4)
                for s in tensor.src[:protocol.MAX_SRC]]
        srcs += [None] * (protocol.MAX_SRC - len(srcs))
        zero = bytes(protocol.TENSOR_SIZE)
        payload = struct.pack("<I", device) + protocol.encode_tensor(tensor.to_rpc()) + b"".join(
            protocol.encode_tensor(s) if s is not None and s.id else zero for s in srcs)
        return struct.unpack("<Q", self._call(Cmd.GET_ALLOC_SIZE, payload))[0]

    # -- graphs --------------------------------------------------------------
    def graph_compute(self, nodes: Sequence[Tensor], device: int = 0) -> None:
        """Send a graph (its nodes in execution order) to run on `device`."""
        self._post(Cmd.GRAPH_COMPUTE, serialize_graph(device, nodes))

    def graph_compute_serialized(self, payload: bytes) -> None:
        """GRAPH_COMPUTE with a graph `serialize_graph` made before (sent again as is)."""
        self._post(Cmd.GRAPH_COMPUTE, payload)

    def graph_recompute(self, device: int = 0) -> None:
        self._post(Cmd.GRAPH_RECOMPUTE, struct.pack("<I", device))

    def synchronize(self) -> None:
        """Wait until the server has processed every command sent so far."""
        self.device_count()

    def ping(self) -> None:
        self.device_count()
