"""Server-to-server exchange: an extension of v7 between ggmlrpc peers only.

With `-sm row` every server holds a slice of every layer, and the slices' results
must meet once or more per layer. Through plain v7 commands they meet on the host
(ggmlrpc.llm.rowsplit); with this extension the servers of one model link to each
other and swap the pieces themselves, inside the graph: a token costs the host one
write and one read per server.

Negotiation. A client that wants the extension sends PEER_CAPS as its HELLO
conn_caps: queue pair 0 (which no RDMA peer ever advertises, so an RDMA-capable
llama.cpp server that tries it fails and stays on TCP) and a tag in the GID bytes.
A ggmlrpc server started with `--peers` answers with the same 24 bytes; any other
server answers with zero caps (or its RDMA caps), and the client keeps to plain v7.
A llama.cpp client never sends the tag, so it never sees anything but v7: the
extension's commands and op are refused on its connections as unknown.

Commands (ids past v7's; only on a connection that negotiated the extension):

    PEER_GROUP (64)  token u64 | rank u32 | n u32 | n x endpoint char[64] ("host:port")
                     -> ok u8
        The host names the group (a random token), this server's rank and every
        rank's endpoint. The server links to each higher rank (a new connection:
        HELLO with PEER_CAPS, then PEER_LINK) and waits for a link from each lower
        one; it answers 1 once all n-1 links are up, 0 when one fails (its log says
        why). One group per connection; the group ends with that connection.
    PEER_LINK (65)   token u64 | rank u32  -> ok u8
        From a server of the group to another: after the answer the connection
        carries exchanges only.

The op. A graph node whose op is OP_GATHER (0x70000001, past ggml's ops) gathers
the ranks' pieces of an F32 tensor: its src[0] is this rank's piece, dst the whole
(contiguous F32), op_params | n i32 | rank i32 | bound i32[n + 1] | cut along
dim 0: rank r owns rows [bound[r], bound[r+1]) of every column. The executor's
PEER_GATHER kernel (csrc/cpu/ops/peers.c) copies its own piece into place, sends it
to every other rank and receives theirs, both ways at once without blocking:
| tag u32 | rank u32 | nbytes u64 | data |, the tag counting the group's exchanges,
so that two ranks that disagree on the graph fail at once instead of mixing
pieces. Any error (a lost link, a wrong header, EXCHANGE_TIMEOUT without a byte)
ends the group: each of its links closes, every rank's graph fails, and the host
sees its connections close.
"""
from __future__ import annotations

import socket
import struct
import threading

from . import protocol
from .errors import ProtocolError, ValidationError
from .transport import Conn

PEER_CAPS = bytes(8) + b"ggmlrpc-peers/1\0"
assert len(PEER_CAPS) == protocol.CONN_CAPS_SIZE

CMD_PEER_GROUP = 64
CMD_PEER_LINK = 65
COMMAND_NAMES = {CMD_PEER_GROUP: "PEER_GROUP", CMD_PEER_LINK: "PEER_LINK"}
OP_GATHER = 0x70000001
MAX_RANKS = 14                 # op_params: n, rank and n + 1 bounds in 16 int32
ENDPOINT = 64                  # bytes of one endpoint in PEER_GROUP
LINK_TIMEOUT = 10.0            # seconds to connect, and to wait for the other ranks' links
EXCHANGE_TIMEOUT = 30.0        # seconds one exchange may wait for a piece
SPIN_US = 500                   # an exchange polls this long before it sleeps in poll()
_GROUP = struct.Struct("<QII")
_LINK = struct.Struct("<QI")


def group_request(token: int, rank: int, endpoints: list[str]) -> bytes:
    body = b"".join(e.encode().ljust(ENDPOINT, b"\0") for e in endpoints)
    return _GROUP.pack(token, rank, len(endpoints)) + body


def gather_params(rank: int, bounds: list[int]) -> list[int]:
    return [len(bounds) - 1, rank, *bounds]


class Group:
    """This server's side of a group: a Conn to every other rank."""

    def __init__(self, token: int, rank: int, n: int):
        self.token, self.rank, self.n = token, rank, n
        self.links: dict[int, Conn] = {}
        self.native = None       # executor.PeerLinks once every link is up
        self.closed = threading.Event()
        self._cv = threading.Condition()

    def attach(self, rank: int, conn: Conn) -> bool:
        with self._cv:
            if self.closed.is_set() or rank in self.links or not 0 <= rank < self.n or rank == self.rank:
                return False
            self.links[rank] = conn
            self._cv.notify_all()
            return True

    def wait_links(self, timeout: float) -> bool:
        """Wait for every link; then the exchanges can start."""
        from ._native import executor
        with self._cv:
            if not self._cv.wait_for(lambda: len(self.links) == self.n - 1 or self.closed.is_set(), timeout) \
                    or self.closed.is_set():
                return False
            fds = [self.links[r].fd if r != self.rank else -1 for r in range(self.n)]
            self.native = executor.PeerLinks(self.rank, fds, int(EXCHANGE_TIMEOUT * 1000), SPIN_US)
            return True

    def close(self) -> None:
        with self._cv:
            if self.closed.is_set():
                return
            self.closed.set()
            if self.native is not None:
                self.native.fail()
            links, self.links = list(self.links.values()), {}
            self._cv.notify_all()
        for c in links:
            c.close()


class Registry:
    """The groups of one server, by token (PEER_LINK finds its group here)."""

    def __init__(self):
        self._groups: dict[int, Group] = {}
        self._cv = threading.Condition()
        self._ended = [0, 0.0]      # exchanges and their seconds, of the groups that ended

    def totals(self) -> tuple[int, float]:
        """Exchanges so far and the seconds spent in them, every group together."""
        with self._cv:
            n, secs = self._ended
            for g in self._groups.values():
                if g.native is not None:
                    n, secs = n + g.native.exchanges, secs + g.native.seconds
        return n, secs

    def add(self, g: Group) -> bool:
        with self._cv:
            if g.token in self._groups:
                return False
            self._groups[g.token] = g
            self._cv.notify_all()
            return True

    def remove(self, g: Group) -> None:
        with self._cv:
            if self._groups.get(g.token) is g:
                del self._groups[g.token]
                if g.native is not None:
                    self._ended[0] += g.native.exchanges
                    self._ended[1] += g.native.seconds

    def find(self, token: int, timeout: float) -> Group | None:
        with self._cv:
            self._cv.wait_for(lambda: token in self._groups, timeout)
            return self._groups.get(token)


def parse_group(payload: bytes) -> tuple[int, int, list[tuple[str, int]]]:
    if len(payload) < _GROUP.size:
        raise ProtocolError("PEER_GROUP payload too short")
    token, rank, n = _GROUP.unpack_from(payload)
    if not 2 <= n <= MAX_RANKS or rank >= n or len(payload) != _GROUP.size + ENDPOINT * n:
        raise ValidationError(f"PEER_GROUP of {n} ranks (2..{MAX_RANKS}), rank {rank}, "
                              f"{len(payload)} bytes")
    eps = []
    for i in range(n):
        raw = payload[_GROUP.size + ENDPOINT * i:_GROUP.size + ENDPOINT * (i + 1)].split(b"\0", 1)[0]
        host, _, port = raw.decode("ascii", "replace").rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValidationError(f"PEER_GROUP: endpoint {i} is not host:port")
        eps.append((host, int(port)))
    return token, rank, eps


def link_to(group: Group, rank: int, endpoint: tuple[str, int]) -> Conn:
    """Open this server's link to a higher rank."""
    sock = socket.create_connection(endpoint, timeout=LINK_TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = Conn(sock, LINK_TIMEOUT)
    try:
        conn.send(protocol.HEADER.pack(protocol.Cmd.HELLO, len(PEER_CAPS)), PEER_CAPS)
        rsp = conn.recv_exact(8 + 4 + len(PEER_CAPS))
        if bytes(rsp[12:]) != PEER_CAPS:
            raise ProtocolError(f"{endpoint[0]}:{endpoint[1]} is not a ggmlrpc server with --peers")
        conn.send(protocol.HEADER.pack(CMD_PEER_LINK, _LINK.size), _LINK.pack(group.token, group.rank))
        if bytes(conn.recv_exact(9)) != protocol.SIZE.pack(1) + b"\1":
            raise ProtocolError(f"rank {rank} refused the link")
    except BaseException:
        conn.close()
        raise
    conn.timeout = EXCHANGE_TIMEOUT
    return conn


GROUP_MAX = _GROUP.size + ENDPOINT * MAX_RANKS
LINK_SIZE = _LINK.size


def parse_link(payload: bytes) -> tuple[int, int]:
    return _LINK.unpack(payload)


def gather_rule(group: Group, node, srcs):
    """The executor's rule for an OP_GATHER node (compute.cpu's ext_rules): its checks,
    then the PEER_GATHER kernel (csrc/cpu/ops/peers.c) pointed at the group's links."""
    from .compute.cpu_rules.base import Spec
    from .compute.cpu_rules.kernels import ids

    def bad(why):
        return ValidationError(f"node {node.name_str!r} (peer gather): {why}")
    p = list(node.op_params)
    n, rank = p[0], p[1]
    if group.native is None or group.closed.is_set():
        raise bad("the peer group is not linked")
    if n != group.n or rank != group.rank:
        raise bad(f"made for rank {rank} of {n}, this server is rank {group.rank} of {group.n}")
    bounds = p[2:3 + n]
    if len(srcs) != 1 or srcs[0] is None:
        raise bad("needs one source")
    src = srcs[0]
    if node.type != 0 or src.type != 0:
        raise bad("F32 only")
    if bounds[0] != 0 or bounds[-1] != node.ne[0] or any(a > b for a, b in zip(bounds, bounds[1:])):
        raise bad(f"bounds {bounds} do not cut {node.ne[0]} rows")
    if src.ne[0] != bounds[rank + 1] - bounds[rank] or tuple(src.ne[1:]) != tuple(node.ne[1:]):
        raise bad(f"source of shape {tuple(src.ne)} is not rows {bounds[rank]}..{bounds[rank + 1]} "
                  f"of {tuple(node.ne)}")
    if node.ne[2] != 1 or node.ne[3] != 1:
        raise bad("two dimensions at most")
    if node.nb[0] != 4 or node.nb[1] != 4 * node.ne[0] or src.nb[0] != 4 or src.nb[1] != 4 * src.ne[0]:
        raise bad("the source and the destination must be contiguous")
    return Spec(ids.K.PEER_GATHER, 0, (group.native.address,), [src])
