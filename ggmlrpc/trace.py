"""Recorded RPC sessions (.trc files): reading them and replaying them against a server.

A trace is one client connection recorded byte for byte by a transparent proxy:

    magic  b"GRPCTRC1"
    record | direction u8 | command u8 | length u64 | payload (length bytes) |

direction 0 is client to server (`command` is the RPC command byte, `payload` the
request payload without its header); direction 1 is server to client (`command`
255, `payload` one response without its size prefix). A session directory holds
`conn-00.trc`, `conn-01.trc`, ... in the order the client opened them.

Replaying sends one connection's requests in order over a fresh connection and
reads an answer after each command that has one. The recorded server's buffer
handles and base addresses are not the replay target's, so every request field
that names a buffer or an address is translated on the way out (see AddressMap),
and the answers are compared with the recorded ones (see compare_answer).

    python -m ggmlrpc.trace <session dir> <host:port> [--stop-before GRAPH_COMPUTE]
"""
from __future__ import annotations

import argparse
import mmap
import socket
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import ggml, protocol
from .errors import ConnectionLost, GgmlRpcError, ProtocolError
from .protocol import Cmd, RESPONSE_SIZE, TENSOR_SIZE
from .transport import Conn

MAGIC = b"GRPCTRC1"
RECORD = struct.Struct("<BBQ")  # | direction u8 | command u8 | length u64 |
TO_SERVER, TO_CLIENT = 0, 1
U64 = struct.Struct("<Q")
OFF_SIZE = struct.Struct("<QQ")
MAX_ANSWER = 1 << 34  # an answer size above this means the stream is out of step


class TraceError(GgmlRpcError):
    """A .trc file is malformed (bad magic, truncated record, answer without request)."""


# -- reading ----------------------------------------------------------------------

@dataclass(slots=True)
class Record:
    direction: int
    command: int
    payload: memoryview


@dataclass(slots=True)
class Exchange:
    """One request and, for commands that have one, the recorded answer (None when
    the command has no answer or the recording ended before it)."""

    index: int
    cmd: int
    request: memoryview
    answer: memoryview | None = None

    @property
    def name(self) -> str:
        return _cmd_name(self.cmd)


@dataclass
class Connection:
    name: str
    exchanges: list[Exchange]

    def first(self, cmd: int) -> int | None:
        """Index of the first request with this command, or None."""
        return next((e.index for e in self.exchanges if e.cmd == cmd), None)


def _cmd_name(cmd: int) -> str:
    try:
        return Cmd(cmd).name
    except ValueError:
        return f"command {cmd}"


def _has_answer(cmd: int) -> bool:
    return RESPONSE_SIZE.get(cmd) is not None


def _map(path: Path) -> memoryview:
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            return memoryview(b"")
        return memoryview(mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ))


def read_records(path) -> list[Record]:
    """Every record of a .trc file; payloads are views into a read-only mapping."""
    data = _map(Path(path))
    if bytes(data[:len(MAGIC)]) != MAGIC:
        raise TraceError(f"{path}: not a trace file (magic {bytes(data[:8])!r})")
    out = []
    off = len(MAGIC)
    while off < len(data):
        if len(data) - off < RECORD.size:
            raise TraceError(f"{path}: truncated record header at byte {off}")
        direction, command, n = RECORD.unpack_from(data, off)
        off += RECORD.size
        if direction not in (TO_SERVER, TO_CLIENT):
            raise TraceError(f"{path}: record at byte {off - RECORD.size} has direction {direction}")
        if n > len(data) - off:
            raise TraceError(f"{path}: record at byte {off - RECORD.size} claims {n} bytes, "
                             f"{len(data) - off} left")
        out.append(Record(direction, command, data[off:off + n]))
        off += n
    return out


def pair(records: list[Record], name: str = "?") -> list[Exchange]:
    """Requests with their answers. At most one answer is ever outstanding (the
    client waits for it), so an answer belongs to the last request that has one."""
    out: list[Exchange] = []
    pending: Exchange | None = None
    for r in records:
        if r.direction == TO_SERVER:
            if pending is not None:
                raise TraceError(f"{name}: request #{len(out)} sent while #{pending.index} "
                                 f"({pending.name}) still waited for its answer")
            e = Exchange(len(out), r.command, r.payload)
            out.append(e)
            if _has_answer(r.command):
                pending = e
        else:
            if pending is None:
                raise TraceError(f"{name}: an answer without a request after #{len(out) - 1}")
            pending.answer = r.payload
            pending = None
    return out


def load_connection(path) -> Connection:
    path = Path(path)
    return Connection(path.name, pair(read_records(path), path.name))


def session_files(directory) -> list[Path]:
    return sorted(Path(directory).glob("conn-*.trc"))


def load_session(directory) -> list[Connection]:
    """The connections of a recorded session, in the order the client opened them."""
    files = session_files(directory)
    if not files:
        raise TraceError(f"{directory}: no conn-*.trc files")
    return [load_connection(p) for p in files]


# -- address translation ------------------------------------------------------------

# Requests that carry rpc_tensors, and where: command -> offsets of the tensors.
TENSOR_OFFSETS: dict[int, tuple[int, ...]] = {
    Cmd.SET_TENSOR: (0,),
    Cmd.SET_TENSOR_HASH: (0,),
    Cmd.GET_TENSOR: (0,),
    Cmd.MEMSET_TENSOR: (0,),
    Cmd.INIT_TENSOR: (0,),
    Cmd.COPY_TENSOR: (0, TENSOR_SIZE),
    # | device u32 | tensor | srcs[10] |
    Cmd.GET_ALLOC_SIZE: tuple(4 + i * TENSOR_SIZE for i in range(1 + protocol.MAX_SRC)),
}
# Requests whose first u64 is a buffer handle.
HANDLE_COMMANDS = (Cmd.FREE_BUFFER, Cmd.BUFFER_CLEAR, Cmd.BUFFER_GET_BASE)


class Untranslatable(GgmlRpcError):
    """A recorded address lies in no buffer whose base the replay has learned."""


@dataclass
class AddressMap:
    """Recorded buffer handles and base addresses -> the replay target's."""

    handles: dict[int, int] = field(default_factory=dict)       # recorded remote_ptr -> ours
    sizes: dict[int, int] = field(default_factory=dict)         # recorded remote_ptr -> size
    bases: dict[int, tuple[int, int]] = field(default_factory=dict)  # recorded remote_ptr -> (recorded base, our base)

    def allocated(self, rec_handle: int, our_handle: int, size: int) -> None:
        self.handles[rec_handle] = our_handle
        self.sizes[rec_handle] = size
        self.bases.pop(rec_handle, None)  # a reused recorded pointer names a new buffer

    def based(self, rec_handle: int, rec_base: int, our_base: int) -> None:
        self.bases[rec_handle] = (rec_base, our_base)

    def handle(self, rec: int) -> int:
        """Our handle for a recorded one; unknown handles (bogus, or 0) pass unchanged."""
        return self.handles.get(rec, rec)

    def address(self, rec_handle: int, data: int) -> int:
        """Translate a recorded address: `data - recorded_base + our_base`, with the base
        of the tensor's own buffer, else of the recorded buffer whose range holds it."""
        if data == 0:
            return 0
        if rec_handle in self.bases:
            rec_base, our_base = self.bases[rec_handle]
            return (data - rec_base + our_base) & 0xFFFFFFFFFFFFFFFF
        for h, (rec_base, our_base) in self.bases.items():
            if rec_base <= data <= rec_base + self.sizes.get(h, 0):
                return data - rec_base + our_base
        raise Untranslatable(f"address {data:#x} lies in no buffer with a known base")

    def tensor(self, t: protocol.RpcTensor) -> protocol.RpcTensor:
        t.data = self.address(t.buffer, t.data)
        t.buffer = self.handle(t.buffer)
        return t

    def rewrite_tensor(self, buf: bytearray, off: int) -> protocol.RpcTensor:
        """Rewrite `buffer` and `data` of the rpc_tensor at buf[off:] in place; returns it."""
        t = self.tensor(protocol.decode_tensor(buf, off))
        buf[off:off + TENSOR_SIZE] = protocol.encode_tensor(t)
        return t

    def rewrite(self, cmd: int, request) -> tuple[bytes | bytearray, memoryview]:
        """A request with every buffer handle and address translated, as (head, tail):
        the rewritten part and the untouched rest (SET_TENSOR data travels as is)."""
        request = memoryview(request)
        if cmd in HANDLE_COMMANDS and len(request) >= 8:
            head = bytearray(request[:8])
            U64.pack_into(head, 0, self.handle(U64.unpack_from(head)[0]))
            return head, request[8:]
        if cmd == Cmd.GRAPH_COMPUTE:
            return self._rewrite_graph(request)
        offsets = TENSOR_OFFSETS.get(cmd)
        if offsets is None:
            return b"", request
        # SET_TENSOR: only its header is rewritten, the data follows untouched
        end = protocol.SET_TENSOR_HEADER_SIZE if cmd == Cmd.SET_TENSOR else len(request)
        head = bytearray(request[:end])
        for off in offsets:
            if off + TENSOR_SIZE <= len(head) and any(head[off:off + TENSOR_SIZE]):
                self.rewrite_tensor(head, off)
        return head, request[end:]

    def _rewrite_graph(self, request: memoryview):
        # | device u32 | n_nodes u32 | node_ids u64[n_nodes] | n_tensors u32 | rpc_tensor[n_tensors] |
        if len(request) < 8:
            return b"", request
        try:
            _, n_nodes = protocol.graph_layout(len(request), request[:8])
        except ProtocolError:
            return b"", request  # malformed: send as recorded
        off = 8 + 8 * n_nodes
        (n_tensors,) = struct.unpack_from("<I", request, off)
        off += 4
        n_tensors = min(n_tensors, (len(request) - off) // TENSOR_SIZE)
        end = off + n_tensors * TENSOR_SIZE
        head = bytearray(request[:end])
        for i in range(n_tensors):
            self.rewrite_tensor(head, off + i * TENSOR_SIZE)
        return head, request[end:]


# -- comparing answers ----------------------------------------------------------------

@dataclass(slots=True)
class Difference:
    index: int      # request index in the connection
    command: str
    message: str

    def __str__(self) -> str:
        return f"#{self.index} {self.command}: {self.message}"


def nmse(ours: np.ndarray, ref: np.ndarray) -> float:
    """Normalized mean squared error, as ggml's test-backend-ops computes it."""
    ours = ours.astype(np.float64)
    ref = ref.astype(np.float64)
    den = float(np.sum(ref * ref))
    num = float(np.sum((ours - ref) ** 2))
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def compare_f32(ours, ref, row: int, max_nmse: float, tie: float) -> str | None:
    """F32 results: close by NMSE, and the same top entry in every row of `row`
    values unless the two tops are a near-tie (within `tie` of the row's largest
    magnitude). Returns what differs, or None."""
    a = np.frombuffer(ours, dtype="<f4")
    b = np.frombuffer(ref, dtype="<f4")
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not np.array_equal(fa, fb) or not np.array_equal(a[~fa], b[~fb], equal_nan=True):
        return "non-finite values differ"
    err = nmse(a[fa], b[fb])
    if not err < max_nmse:
        return f"NMSE {err:.3g} >= {max_nmse:g}"
    if row <= 0 or len(a) % row or not len(a):
        row = len(a) or 1
    for i, (ra, rb) in enumerate(zip(a.reshape(-1, row), b.reshape(-1, row))):
        ta, tb = int(np.argmax(ra)), int(np.argmax(rb))
        if ta != tb and rb[tb] - rb[ta] > tie * float(np.max(np.abs(rb))):
            return f"row {i}: top entry {ta} (recorded {tb}), NMSE {err:.3g}"
    return None


def _u(buf, fmt="<Q", off=0):
    return struct.unpack_from(fmt, buf, off)[0]


def compare_answer(e: Exchange, ours: bytes, *, max_nmse: float = 1e-4,
                   tie: float = 1e-3) -> str | None:
    """What differs between our answer and the recorded one by the README's rules,
    or None. Host facts (GET_DEVICE_MEMORY, GET_MAX_SIZE) and BUFFER_GET_BASE (an
    address, translated instead) are not compared."""
    ref = bytes(e.answer)
    cmd = e.cmd
    if len(ours) != len(ref):
        return f"answer of {len(ours)} bytes (recorded {len(ref)})"
    if cmd == Cmd.HELLO:
        if ours[:3] != ref[:3]:
            return f"version {tuple(ours[:3])} (recorded {tuple(ref[:3])})"
    elif cmd in (Cmd.DEVICE_COUNT, Cmd.GET_ALIGNMENT, Cmd.GET_ALLOC_SIZE, Cmd.COPY_TENSOR):
        if ours != ref:
            fmt = {1: "<B", 4: "<I"}.get(len(ref), "<Q")
            return f"answer {_u(ours, fmt)} (recorded {_u(ref, fmt)})"
    elif cmd == Cmd.ALLOC_BUFFER:
        (hp, size), (rp, rsize) = OFF_SIZE.unpack(ours), OFF_SIZE.unpack(ref)
        if (hp == 0) != (rp == 0):
            return "allocation failed" if hp == 0 else "allocation succeeded where the recording's failed"
        if size != rsize:
            return f"remote_size {size} (recorded {rsize})"
    elif cmd == Cmd.SET_TENSOR_HASH:
        # recorded 0 and ours 1 is harmless (the recorded SET_TENSOR follows and writes
        # the same bytes); recorded 1 and ours 0 leaves the tensor unwritten
        if ref[0] and not ours[0]:
            return "not cached here, but the recording's server had it"
    elif cmd == Cmd.GET_TENSOR:
        t = protocol.decode_tensor(e.request)
        if t.type == ggml.GGMLType.F32:
            return compare_f32(ours, ref, t.ne[0], max_nmse, tie)
        if ours != ref:
            first = next(i for i, (x, y) in enumerate(zip(ours, ref)) if x != y)
            return f"{ggml.type_name(t.type)} bytes differ (first at byte {first})"
    return None


# -- replaying ------------------------------------------------------------------------

@dataclass(slots=True)
class Write:
    """A SET_TENSOR the replay can read back: where (recorded buffer and address
    range) and what (the translated tensor, offset and the bytes)."""

    index: int
    rec_buffer: int
    start: int
    end: int
    tensor: bytes
    offset: int
    data: memoryview


@dataclass
class ReplayResult:
    name: str
    sent: int = 0            # requests sent
    compared: int = 0        # answers compared with the recording
    verified: int = 0        # writes read back (verify_writes)
    stopped_before: int | None = None
    differences: list[Difference] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        s = (f"{self.name}: {self.sent} requests sent, {self.compared} answers compared, "
             f"{self.verified} writes verified, {len(self.differences)} differences")
        if self.stopped_before is not None:
            s += f" (stopped before #{self.stopped_before})"
        return s


class Replayer:
    """Replays recorded connections against the server at `endpoint` ("host:port").

    stop_before: a command (Cmd.GRAPH_COMPUTE) before whose first occurrence a
    connection's replay stops. verify_writes: at the end, read back every
    SET_TENSOR that no later command overwrote and compare it with the recorded
    bytes. sync: after the last request, make sure the server is still there (a
    fire-and-forget command it rejected shows up as a closed connection).
    """

    def __init__(self, endpoint: str, *, stop_before: int | None = None, timeout: float | None = 60.0,
                 max_nmse: float = 1e-4, tie: float = 1e-3, verify_writes: bool = False,
                 sync: bool = True):
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"endpoint must be host:port, got {endpoint!r}")
        self.addr = (host, int(port))
        self.stop_before = stop_before
        self.timeout = timeout
        self.max_nmse = max_nmse
        self.tie = tie
        self.verify_writes = verify_writes
        self.sync = sync

    def replay_session(self, directory) -> list[ReplayResult]:
        return [self.replay(c) for c in load_session(directory)]

    def replay(self, conn: Connection) -> ReplayResult:
        result = ReplayResult(conn.name)
        try:
            sock = socket.create_connection(self.addr, timeout=self.timeout)
        except OSError as e:
            result.differences.append(Difference(0, "connect", f"cannot connect: {e}"))
            return result
        c = Conn(sock, self.timeout)
        try:
            _Run(self, c, conn, result).run()
        finally:
            c.close()
        return result


class _Run:
    """The state of one connection's replay."""

    def __init__(self, opts: Replayer, conn: Conn, trace: Connection, result: ReplayResult):
        self.opts = opts
        self.conn = conn
        self.trace = trace
        self.result = result
        self.map = AddressMap()
        self.writes: list[Write] = []
        self.graph_ranges: dict[int, list[tuple[int, int, int]]] = {}  # device -> written ranges

    def diff(self, e_index: int, cmd: str, msg: str) -> None:
        self.result.differences.append(Difference(e_index, cmd, msg))

    def run(self) -> None:
        last_answered = -1
        for e in self.trace.exchanges:
            if self.opts.stop_before is not None and e.cmd == self.opts.stop_before:
                self.result.stopped_before = e.index
                break
            try:
                ours = self.step(e)
            except ConnectionLost as ex:
                self.diff(e.index, e.name, f"connection lost ({ex}); last answered request "
                                           f"#{last_answered}")
                return
            except ProtocolError as ex:
                self.diff(e.index, e.name, str(ex))
                return
            if ours is not None:
                last_answered = e.index
        if self.opts.verify_writes:
            try:
                self.verify()
            except (ConnectionLost, ProtocolError) as ex:
                self.diff(self.result.sent, "GET_TENSOR", f"reading back writes: {ex}")
                return
        if self.opts.sync and self.trace.exchanges:
            try:
                self.call(Cmd.DEVICE_COUNT, b"", b"", 4)
            except (ConnectionLost, ProtocolError) as ex:
                self.diff(self.result.sent, "sync", f"server gone after the replay ({ex}); last "
                                                   f"answered request #{last_answered}")

    # -- wire ----------------------------------------------------------------
    def call(self, cmd: int, head, tail, answer_size: int | None) -> bytes | None:
        size = len(head) + len(tail)
        frame = protocol.HEADER.pack(cmd, size) + bytes(head)
        self.conn.send(frame, tail) if len(tail) else self.conn.send(frame)
        if answer_size is None:
            return None
        (n,) = protocol.SIZE.unpack(self.conn.recv_exact(8))
        if n != answer_size:
            raise ProtocolError(f"answer of {n} bytes (expected {answer_size})")
        return bytes(self.conn.recv_exact(n))

    def step(self, e: Exchange) -> bytes | None:
        try:
            head, tail = self.map.rewrite(e.cmd, e.request)
        except Untranslatable as ex:
            self.diff(e.index, e.name, f"{ex}; sent as recorded")
            head, tail = b"", e.request
        want = RESPONSE_SIZE.get(e.cmd)
        if want == -1:  # GET_TENSOR answers with the requested bytes
            want = OFF_SIZE.unpack_from(e.request, TENSOR_SIZE)[1] if len(e.request) >= TENSOR_SIZE + 16 else 0
            if want > MAX_ANSWER:
                raise ProtocolError(f"GET_TENSOR of {want} bytes")
        self.track(e, head)
        ours = self.call(e.cmd, head, tail, want)
        self.result.sent += 1
        if ours is None:
            return None
        self.learn(e, ours)
        if e.answer is not None:
            self.result.compared += 1
            msg = compare_answer(e, ours, max_nmse=self.opts.max_nmse, tie=self.opts.tie)
            if msg:
                self.diff(e.index, e.name, msg)
        return ours

    def learn(self, e: Exchange, ours: bytes) -> None:
        """Address mappings from ALLOC_BUFFER and BUFFER_GET_BASE answers."""
        if e.answer is None:
            return
        if e.cmd == Cmd.ALLOC_BUFFER:
            rec_ptr, rec_size = OFF_SIZE.unpack(e.answer)
            our_ptr, _ = OFF_SIZE.unpack(ours)
            if rec_ptr:
                self.map.allocated(rec_ptr, our_ptr, rec_size)
        elif e.cmd == Cmd.BUFFER_GET_BASE:
            (rec_handle,) = U64.unpack_from(e.request)
            self.map.based(rec_handle, U64.unpack(e.answer)[0], U64.unpack(ours)[0])
        elif e.cmd == Cmd.SET_TENSOR_HASH and ours[0] and len(e.request) >= TENSOR_SIZE:
            self.forget_buffer(protocol.decode_tensor(e.request).buffer)

    # -- read-back of writes -------------------------------------------------------
    def track(self, e: Exchange, head) -> None:
        """Keep the writes a later read-back can check; drop those overwritten since."""
        if not self.opts.verify_writes:
            return
        cmd, req = e.cmd, e.request
        if cmd in (Cmd.FREE_BUFFER, Cmd.BUFFER_CLEAR) and len(req) >= 8:
            self.forget_buffer(U64.unpack_from(req)[0])
        elif cmd == Cmd.SET_TENSOR and len(req) >= protocol.SET_TENSOR_HEADER_SIZE:
            t = protocol.decode_tensor(req)
            (offset,) = U64.unpack_from(req, TENSOR_SIZE + 1)
            data = req[protocol.SET_TENSOR_HEADER_SIZE:]
            start = t.data + offset
            self.forget(t.buffer, start, start + len(data))
            if len(data) and len(head) >= TENSOR_SIZE:
                self.writes.append(Write(e.index, t.buffer, start, start + len(data),
                                         bytes(head[:TENSOR_SIZE]), offset, data))
        elif cmd == Cmd.MEMSET_TENSOR and len(req) >= TENSOR_SIZE + 17:
            t = protocol.decode_tensor(req)
            offset, n = OFF_SIZE.unpack_from(req, TENSOR_SIZE)
            self.forget(t.buffer, t.data + offset, t.data + offset + n)
        elif cmd == Cmd.COPY_TENSOR and len(req) >= 2 * TENSOR_SIZE:
            src, dst = protocol.decode_tensor(req), protocol.decode_tensor(req, TENSOR_SIZE)
            self.forget(dst.buffer, dst.data, dst.data + ggml.nbytes(src.type, src.ne, src.nb))
        elif cmd == Cmd.GRAPH_COMPUTE and len(req) >= 8:
            try:
                device, _, tensors = protocol.decode_graph(req)
            except ProtocolError:
                return
            ranges = [(t.buffer, t.data, t.data + ggml.nbytes(t.type, t.ne, t.nb))
                      for t in tensors if t.buffer and t.op != ggml.GGMLOp.NONE]
            self.graph_ranges[device] = ranges
            for r in ranges:
                self.forget(*r)
        elif cmd == Cmd.GRAPH_RECOMPUTE and len(req) >= 4:
            for r in self.graph_ranges.get(_u(req, "<I"), ()):
                self.forget(*r)

    def forget(self, rec_buffer: int, start: int, end: int) -> None:
        self.writes = [w for w in self.writes
                       if not (w.rec_buffer == rec_buffer and w.start < end and start < w.end)]

    def forget_buffer(self, rec_buffer: int) -> None:
        self.writes = [w for w in self.writes if w.rec_buffer != rec_buffer]

    def verify(self) -> None:
        for w in self.writes:
            req = w.tensor + OFF_SIZE.pack(w.offset, len(w.data))
            ours = self.call(Cmd.GET_TENSOR, req, b"", len(w.data))
            self.result.verified += 1
            if ours != w.data:
                first = next(i for i, (x, y) in enumerate(zip(ours, w.data)) if x != y)
                self.diff(w.index, "SET_TENSOR", f"read back differs from the written bytes "
                                                 f"(first at byte {first} of {len(w.data)})")


# -- command line -------------------------------------------------------------------

def _command(name: str) -> int:
    try:
        return Cmd[name.upper()]
    except KeyError:
        try:
            return Cmd(int(name))
        except ValueError:
            raise argparse.ArgumentTypeError(f"unknown command {name!r}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m ggmlrpc.trace",
        description="Replay a recorded llama.cpp RPC session against a server and compare answers.")
    ap.add_argument("session", help="directory with conn-00.trc, conn-01.trc, ...")
    ap.add_argument("endpoint", help="host:port of the server to replay against")
    ap.add_argument("--stop-before", type=_command, default=None, metavar="CMD",
                    help="stop each connection before its first CMD (e.g. GRAPH_COMPUTE)")
    ap.add_argument("--verify-writes", action="store_true",
                    help="read back every SET_TENSOR that nothing overwrote and compare it")
    ap.add_argument("--nmse", type=float, default=1e-4, help="largest NMSE for F32 results")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each answer")
    args = ap.parse_args(argv)
    try:
        conns = load_session(args.session)
    except (OSError, TraceError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rp = Replayer(args.endpoint, stop_before=args.stop_before, timeout=args.timeout,
                  max_nmse=args.nmse, verify_writes=args.verify_writes)
    total = 0
    for c in conns:
        r = rp.replay(c)
        print(r.summary())
        for d in r.differences:
            print(f"  {d}")
        total += len(r.differences)
    print(f"{len(conns)} connections, {total} differences")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
