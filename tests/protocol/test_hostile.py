"""Hostile and malformed requests: each costs the offending connection and nothing else.

For every case a well-behaved client (the bystander) holds a buffer with known
bytes on the same server. The attacker connects, allocates a buffer of its own and
misbehaves; then the server must have closed the attacker's connection, logged a
reason, freed the attacker's buffers (server.stats()), and the bystander's bytes
must be intact and its connection fully working.
"""
from __future__ import annotations

import struct

import pytest

from tests.protocol.rawclient import (
    ALLOC_BUFFER, BUFFER_CLEAR, BUFFER_GET_BASE, COPY_TENSOR, DEVICE_COUNT, FREE_BUFFER,
    GET_ALIGNMENT, GET_ALLOC_SIZE, GET_DEVICE_MEMORY, GET_MAX_SIZE, GET_TENSOR, GRAPH_COMPUTE,
    GRAPH_RECOMPUTE, HELLO, HELLO_ANSWER, INIT_TENSOR, MEMSET_TENSOR, OP_ADD, OP_DUP, OP_VIEW, Q4_0,
    SET_TENSOR, SET_TENSOR_HASH, Raw, Watch, fnv1a, frame, graph, logged, tensor, u32, u64,
    wait_stats)
from ggmlrpc.cache import TensorCache
from ggmlrpc.protocol import MAX_GRAPH_NODES
from tests.conftest import start_server

U64_MAX = (1 << 64) - 1
VICTIM_SIZE = 1 << 16


class Attacker:
    """A raw connection after HELLO, with one buffer of its own (handle, base)."""

    def __init__(self, port: int, hello: bool = True, alloc: bool = True):
        self.raw = Raw(port)
        self.handle = self.base = 0
        self.size = 0
        if hello:
            assert self.raw.hello() == HELLO_ANSWER
        if alloc:
            self.handle, self.base = self.raw.alloc(VICTIM_SIZE)
            self.size = VICTIM_SIZE

    def t(self, **kw) -> bytes:
        """A tensor in the attacker's buffer (F32, 16 elements at the base by default)."""
        kw.setdefault("buffer", self.handle)
        kw.setdefault("data", self.base)
        kw.setdefault("ne", (16,))
        return tensor(**kw)

    def send(self, data: bytes) -> None:
        try:
            self.raw.send(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may close before all of a bad request arrived


class Arena(Watch):
    def attacker(self, hello: bool = True, alloc: bool = True) -> Attacker:
        a = Attacker(self.server.port, hello, alloc)
        wait_stats(self.server, sessions=2, buffers=1 + alloc)
        return a

    def settled(self, a: Attacker, reason: str | None, peer_closes: bool = False) -> None:
        """The attacker's connection is gone and freed; the bystander is unharmed."""
        if peer_closes:
            a.raw.close()
        else:
            a.raw.expect_closed()
            a.raw.close()
        if reason is not None:
            logged(self.caplog, reason)
        self.aftermath()

    def run(self, attack, reason: str | None, hello: bool = True, alloc: bool = True) -> None:
        a = self.attacker(hello, alloc)
        attack(a)
        self.settled(a, reason)


@pytest.fixture
def arena(server, caplog):
    a = Arena(server, caplog)
    yield a
    a.bystander.close()


# -- handshake and framing ---------------------------------------------------------

@pytest.mark.parametrize("first", [
    frame(DEVICE_COUNT),
    frame(ALLOC_BUFFER, u32(0) + u64(4096)),
    frame(GET_ALIGNMENT, u32(0)),
    frame(200, b"x" * 10),
])
def test_not_hello_first(arena, first):
    arena.run(lambda a: a.send(first), "expected HELLO", hello=False, alloc=False)


@pytest.mark.parametrize("size", [0, 23, 25, 28, U64_MAX])
def test_hello_wrong_size(arena, size):
    arena.run(lambda a: a.send(frame(HELLO, bytes(min(size, 64)), size=size)), "HELLO of",
              hello=False, alloc=False)


def test_second_hello(arena):
    arena.run(lambda a: a.send(frame(HELLO, bytes(24))), "second HELLO")


@pytest.mark.parametrize("cmd", [18, 19, 100, 255])
def test_unknown_command(arena, cmd):
    arena.run(lambda a: a.send(frame(cmd, b"")), "unknown command")


FIXED = {ALLOC_BUFFER: 12, GET_ALIGNMENT: 4, GET_MAX_SIZE: 4, BUFFER_GET_BASE: 8, FREE_BUFFER: 8,
         BUFFER_CLEAR: 9, SET_TENSOR_HASH: 312, GET_TENSOR: 312, COPY_TENSOR: 592,
         GET_DEVICE_MEMORY: 4, INIT_TENSOR: 296, GET_ALLOC_SIZE: 3260, DEVICE_COUNT: 0,
         GRAPH_RECOMPUTE: 4, MEMSET_TENSOR: 313}


@pytest.mark.parametrize("cmd, size", [(c, n + d) for c, n in FIXED.items() for d in (-1, 1) if n + d >= 0]
                         + [(DEVICE_COUNT, U64_MAX), (GET_TENSOR, 1 << 40)])
def test_fixed_size_command_with_wrong_size(arena, cmd, size):
    arena.run(lambda a: a.send(frame(cmd, bytes(min(size, 4096)), size=size)), "payload of")


# -- devices -------------------------------------------------------------------------

DEVICE_REQUESTS = {
    "alloc_buffer": lambda a, d: frame(ALLOC_BUFFER, u32(d) + u64(64)),
    "get_alignment": lambda a, d: frame(GET_ALIGNMENT, u32(d)),
    "get_max_size": lambda a, d: frame(GET_MAX_SIZE, u32(d)),
    "get_device_memory": lambda a, d: frame(GET_DEVICE_MEMORY, u32(d)),
    "get_alloc_size": lambda a, d: frame(GET_ALLOC_SIZE, u32(d) + a.t() + bytes(2960)),
    "graph_recompute": lambda a, d: frame(GRAPH_RECOMPUTE, u32(d)),
    "graph_compute": lambda a, d: frame(GRAPH_COMPUTE, graph(d, [1], [a.t(id=1)])),
}


@pytest.mark.parametrize("device", [1, 0xFFFFFFFF])
@pytest.mark.parametrize("cmd", sorted(DEVICE_REQUESTS))
def test_invalid_device(arena, cmd, device):
    arena.run(lambda a: a.send(DEVICE_REQUESTS[cmd](a, device)), "out of range")


# -- tensors -------------------------------------------------------------------------

def tensor_request(cmd: str, a: Attacker, t: bytes) -> bytes:
    """A request of kind `cmd` that carries tensor t (other fields valid)."""
    good = a.t(id=9, data=a.base + 4096)
    return {
        "get_tensor": lambda: frame(GET_TENSOR, t + u64(0) + u64(4)),
        "set_tensor": lambda: frame(SET_TENSOR, t + b"\0" + u64(0) + b"abcd"),
        "set_tensor_hash": lambda: frame(SET_TENSOR_HASH, t + u64(0) + u64(0x1234)),
        "memset_tensor": lambda: frame(MEMSET_TENSOR, t + u64(0) + u64(4) + b"\x01"),
        "init_tensor": lambda: frame(INIT_TENSOR, t),
        "copy_src": lambda: frame(COPY_TENSOR, t + good),
        "copy_dst": lambda: frame(COPY_TENSOR, good + t),
        "alloc_size": lambda: frame(GET_ALLOC_SIZE, u32(0) + t + bytes(2960)),
        "alloc_size_src": lambda: frame(GET_ALLOC_SIZE, u32(0) + good + t + bytes(2664)),
        "graph": lambda: frame(GRAPH_COMPUTE, graph(0, [3], [t])),
    }[cmd]()


TENSOR_COMMANDS = ["get_tensor", "set_tensor", "set_tensor_hash", "memset_tensor", "init_tensor",
                   "copy_src", "copy_dst", "alloc_size", "alloc_size_src", "graph"]


@pytest.mark.parametrize("type_id", [43, 44, 4, 5, 31, 32, 33, 36, 37, 38, 0xFFFFFFFF])
def test_invalid_type(arena, type_id):
    t = lambda a: a.t(id=3, type=type_id, nb=(4, 64, 64, 64))  # noqa: E731
    arena.run(lambda a: a.send(tensor_request("get_tensor", a, t(a))), "invalid tensor type")


@pytest.mark.parametrize("cmd", TENSOR_COMMANDS)
def test_invalid_type_in_each_command(arena, cmd):
    t = lambda a: a.t(id=3, type=43, nb=(4, 64, 64, 64))  # noqa: E731
    arena.run(lambda a: a.send(tensor_request(cmd, a, t(a))), "invalid tensor type")


@pytest.mark.parametrize("cmd", TENSOR_COMMANDS)
def test_ne0_not_multiple_of_block(arena, cmd):
    t = lambda a: a.t(id=3, type=Q4_0, ne=(33, 1), nb=(18, 36, 36, 36))  # noqa: E731
    arena.run(lambda a: a.send(tensor_request(cmd, a, t(a))), "block size")


@pytest.mark.parametrize("cmd", TENSOR_COMMANDS)
def test_element_count_overflow(arena, cmd):
    t = lambda a: a.t(id=3, ne=(0xFFFFFFFF,) * 4, nb=(0, 0, 0, 0))  # noqa: E731
    arena.run(lambda a: a.send(tensor_request(cmd, a, t(a))), "overflow")


@pytest.mark.parametrize("cmd", TENSOR_COMMANDS)
@pytest.mark.parametrize("where", ["past_end", "before_base", "zero", "wraps"])
def test_data_outside_buffer(arena, cmd, where):
    def data(a):
        return {"past_end": a.base + a.size - 32, "before_base": a.base - 4, "zero": 0,
                "wraps": U64_MAX - 31}[where]
    arena.run(lambda a: a.send(tensor_request(cmd, a, a.t(id=3, data=data(a)))), "outside")


@pytest.mark.parametrize("cmd, payload", [
    # tensor of 64 bytes at the base; offset/size wrap around u64
    ("get", lambda a: a.t() + u64(U64_MAX - 7) + u64(16)),
    ("get", lambda a: a.t() + u64(8) + u64(U64_MAX - 3)),
    ("memset", lambda a: a.t() + u64(U64_MAX) + u64(2) + b"\x01"),
    ("memset", lambda a: a.t() + u64(4) + u64(U64_MAX - 3) + b"\x01"),
    ("set", lambda a: a.t() + b"\0" + u64(U64_MAX - 1) + b"abcd"),
    # offset + size beyond nbytes(tensor), though inside the buffer
    ("get", lambda a: a.t() + u64(60) + u64(8)),
    ("get", lambda a: a.t() + u64(65) + u64(0)),
    ("memset", lambda a: a.t() + u64(64) + u64(1) + b"\x01"),
    ("set", lambda a: a.t() + b"\0" + u64(0) + bytes(65)),
    ("set", lambda a: a.t() + b"\0" + u64(62) + bytes(3)),
    # data + offset at the buffer's end, size 0
    ("get", lambda a: a.t(ne=(a.size // 4,)) + u64(a.size) + u64(0)),
    ("memset", lambda a: a.t(ne=(a.size // 4,)) + u64(a.size) + u64(0) + b"\x01"),
    ("set", lambda a: a.t(ne=(a.size // 4,)) + b"\0" + u64(a.size)),
])
def test_region_outside(arena, cmd, payload):
    code = {"get": GET_TENSOR, "memset": MEMSET_TENSOR, "set": SET_TENSOR}[cmd]
    arena.run(lambda a: a.send(frame(code, payload(a))), "outside")


@pytest.mark.parametrize("offset", [0, 32, U64_MAX - 1])
def test_set_tensor_hash_region_checked_with_cache(tmp_path, caplog, codec_name, offset):
    """With a cache hit, the cached file's length and the offset are checked against the
    tensor (without a cache the answer is 0 and nothing is written)."""
    blob = bytes(range(256)) * 2 if offset == 0 else bytes(range(64))  # the tensor holds 64
    TensorCache(str(tmp_path)).store(fnv1a(blob), blob)  # a file the server will serve
    srv = start_server(codec_name, cache_dir=str(tmp_path))
    try:
        arena = Arena(srv, caplog)
        arena.run(lambda a: a.send(frame(SET_TENSOR_HASH, a.t() + u64(offset) + u64(fnv1a(blob)))),
                  "outside")
        arena.bystander.close()
    finally:
        srv.close()


# -- buffers -------------------------------------------------------------------------

@pytest.mark.parametrize("request_of", [
    lambda a, h: frame(BUFFER_GET_BASE, u64(h)),
    lambda a, h: frame(FREE_BUFFER, u64(h)),
    lambda a, h: frame(BUFFER_CLEAR, u64(h) + b"\x77"),
    lambda a, h: frame(GET_TENSOR, a.t(buffer=h) + u64(0) + u64(4)),
    lambda a, h: frame(SET_TENSOR, a.t(buffer=h) + b"\0" + u64(0) + b"\x77" * 4),
    lambda a, h: frame(MEMSET_TENSOR, a.t(buffer=h) + u64(0) + u64(4) + b"\x77"),
    lambda a, h: frame(COPY_TENSOR, a.t() + a.t(buffer=h)),
    lambda a, h: frame(GRAPH_COMPUTE, graph(0, [1], [a.t(id=1, buffer=h)])),
], ids=["get_base", "free", "clear", "get", "set", "memset", "copy", "graph"])
@pytest.mark.parametrize("whose", ["random", "bystander"])
def test_unknown_buffer(arena, request_of, whose):
    """A handle this connection does not own, including another client's live handle."""
    h = 0xDEAD_BEEF_0000 if whose == "random" else arena.bystander.handle
    arena.run(lambda a: a.send(request_of(a, h)), "unknown buffer")


def test_tensor_without_buffer(arena):
    arena.run(lambda a: a.send(frame(GET_TENSOR, a.t(buffer=0, data=0) + u64(0) + u64(4))),
              "no buffer")


def test_double_free(arena):
    def attack(a):
        a.send(frame(FREE_BUFFER, u64(a.handle)))
        a.raw.expect_no_response()
        a.send(frame(FREE_BUFFER, u64(a.handle)))
    arena.run(attack, "unknown buffer")


@pytest.mark.parametrize("dst_at", ["end", "middle", "other_buffer"])
def test_copy_tensor_past_destination(arena, dst_at):
    def attack(a):
        src = a.t(id=1, ne=(256,))  # 1 KiB
        if dst_at == "other_buffer":
            h, base = a.raw.alloc(512)
            dst = a.t(id=2, ne=(1,), buffer=h, data=base)
        else:
            off = a.size - 4 if dst_at == "end" else a.size - 1000
            dst = a.t(id=2, ne=(1,), data=a.base + off)
        a.send(frame(COPY_TENSOR, src + dst))
    arena.run(attack, "past the destination")


def test_alloc_more_than_the_host_has(arena):
    """Not a close: remote_ptr 0, and the connection stays usable."""
    a = arena.attacker()
    phys = arena.server.devices[0].memory()[1]
    for size in (phys * 16, 1 << 62, U64_MAX):
        assert a.raw.call(ALLOC_BUFFER, u32(0) + u64(size)) == u64(16) + u64(0) + u64(0)
    a.raw.expect_no_response()
    assert arena.server.stats()["buffers"] == 2
    h, base = a.raw.alloc(128)
    assert h != a.handle and base != a.base
    arena.bystander.check()
    a.send(frame(FREE_BUFFER, u64(h)))
    a.raw.expect_no_response()
    a.send(frame(HELLO, bytes(24)))  # now end it the hostile way
    arena.settled(a, "second HELLO")


# -- graphs --------------------------------------------------------------------------

def leaf(a: Attacker, id: int = 1) -> bytes:
    return a.t(id=id, name=b"leaf")


def add(a: Attacker, id: int, *src: int, **kw) -> bytes:
    kw.setdefault("data", a.base + 1024)
    return a.t(id=id, op=OP_ADD, src=src, flags=16, name=b"add", **kw)


@pytest.mark.parametrize("case, reason", [
    ("data_no_buffer", "data but no buffer"),
    ("node_missing", "not in the tensor list"),
    ("node_zero", "node id 0"),
    ("tensor_id_zero", "id 0"),
    ("cycle", "a cycle"),
    ("self_source", "a cycle"),
    ("view_cycle", "a cycle"),
    ("source_missing", "not in the tensor list"),
    ("view_src_missing", "not in the tensor list"),
    ("view_other_buffer", "not inside the buffer"),
    ("op_101", "invalid op"),
    ("op_255", "invalid op"),
    ("op_max", "invalid op"),
    ("map_custom1", "not allowed"),
    ("map_custom2", "not allowed"),
    ("map_custom3", "not allowed"),
    ("custom", "not allowed"),
])
def test_bad_graph(arena, case, reason):
    def payload(a):
        if case == "data_no_buffer":
            return graph(0, [2], [a.t(id=1, buffer=0, data=0x1000), add(a, 2, 1)])
        if case == "node_missing":
            return graph(0, [2, 99], [leaf(a), add(a, 2, 1)])
        if case == "node_zero":
            return graph(0, [0], [leaf(a)])
        if case == "tensor_id_zero":
            return graph(0, [2], [leaf(a, 0), add(a, 2, 1)])
        if case == "cycle":
            return graph(0, [2], [add(a, 1, 2), add(a, 2, 1)])
        if case == "self_source":
            return graph(0, [1], [add(a, 1, 1)])
        if case == "view_cycle":
            return graph(0, [3], [a.t(id=1, op=OP_VIEW, view_src=2, src=(2,)),
                                  a.t(id=2, op=OP_VIEW, view_src=1, src=(1,)), add(a, 3, 1)])
        if case == "source_missing":
            return graph(0, [2], [add(a, 2, 1, 7), leaf(a)])
        if case == "view_src_missing":
            return graph(0, [2], [a.t(id=2, op=OP_VIEW, view_src=5, src=(5,))])
        if case == "view_other_buffer":
            h, base = a.raw.alloc(4096)
            return graph(0, [2], [leaf(a), a.t(id=2, op=OP_VIEW, view_src=1, src=(1,), buffer=h,
                                                 data=base)])
        op = {"op_101": 101, "op_255": 255, "op_max": 0xFFFFFFFF, "map_custom1": 92,
              "map_custom2": 93, "map_custom3": 94, "custom": 95}[case]
        return graph(0, [2], [leaf(a), a.t(id=2, op=op, src=(1,), flags=16, data=a.base + 1024)])
    arena.run(lambda a: a.send(frame(GRAPH_COMPUTE, payload(a))), reason)


def test_sources_after_their_user_are_computed(arena):
    """A source or view source may stand anywhere in the tensor list (llama.cpp's
    server resolves ids wherever they are; its client lists some views after their
    users): only a cycle is refused. Here both come after the node that reads them."""
    a = arena.attacker()
    x = struct.pack("<16f", *range(16))
    a.raw.set_tensor(leaf(a), x)
    view = a.t(id=2, op=OP_VIEW, view_src=1, src=(1,), name=b"view")
    a.send(frame(GRAPH_COMPUTE, graph(0, [3], [add(a, 3, 2, 1), view, leaf(a)])))
    a.raw.expect_no_response()
    out = a.raw.get_tensor(a.t(id=3, data=a.base + 1024), 0, 64)
    assert struct.unpack("<16f", out) == tuple(2.0 * i for i in range(16))
    arena.bystander.check()
    a.raw.close()


def test_cast_names_itself_as_destination(arena):
    """ggml_cast makes a CPY whose src[1] (the destination, not read) is the node
    itself: that is no cycle, and the copy is computed."""
    from ggmlrpc.ggml import GGMLOp
    a = arena.attacker()
    x = struct.pack("<16f", *range(16))
    a.raw.set_tensor(leaf(a), x)
    cast = a.t(id=2, op=GGMLOp.CPY, src=(1, 2), flags=16, data=a.base + 1024, name=b"leaf (copy)")
    a.send(frame(GRAPH_COMPUTE, graph(0, [2], [leaf(a), cast])))
    a.raw.expect_no_response()
    assert a.raw.get_tensor(cast, 0, 64) == x
    arena.bystander.check()
    a.raw.close()


@pytest.mark.parametrize("nb0", [0, 1, 9, 36])
def test_block_tensor_with_another_nb0(arena, nb0):
    """A Q4_0 row whose nb[0] is not the block size has a ggml_nbytes short of what a
    kernel reads (nb[0] = 0: no bytes at all): placed flush with the end of the buffer,
    DUP would read past it. The graph is refused before anything runs."""
    def payload(a):
        src = a.t(id=1, type=Q4_0, ne=(32,), nb=(nb0, 18, 18, 18), data=a.base + a.size - (nb0 * 32) // 32,
                  name=b"q")
        dup = a.t(id=2, op=OP_DUP, src=(1,), flags=16, ne=(32,), data=a.base, name=b"dup")
        return graph(0, [2], [src, dup])
    arena.run(lambda a: a.send(frame(GRAPH_COMPUTE, payload(a))), "nb[0] of a block type")


def test_graph_recompute_after_free(arena):
    def attack(a):
        h, base = a.raw.alloc(4096)
        view = a.t(id=2, op=OP_VIEW, src=(1,), view_src=1, buffer=h, data=base)
        a.send(frame(GRAPH_COMPUTE, graph(0, [2], [a.t(id=1, buffer=h, data=base), view])))
        a.raw.expect_no_response()
        a.send(frame(GRAPH_RECOMPUTE, u32(0)))
        a.raw.expect_no_response()  # the kept graph reruns
        a.send(frame(FREE_BUFFER, u64(h)))
        a.raw.expect_no_response()
        a.send(frame(GRAPH_RECOMPUTE, u32(0)))
    arena.run(attack, "without a stored graph")


@pytest.mark.parametrize("size", [1 << 40, U64_MAX])
def test_graph_compute_huge_size(arena, size):
    arena.run(lambda a: a.send(frame(GRAPH_COMPUTE, u32(0) + u32(1), size=size)), "exceeds")


def test_graph_compute_big_size_then_close(arena):
    """A payload size under the limit that never arrives: memory follows the bytes."""
    a = arena.attacker()
    a.send(frame(GRAPH_COMPUTE, u32(0) + u32(1) + bytes(1 << 20), size=200 << 20))
    arena.settled(a, None, peer_closes=True)


@pytest.mark.parametrize("size", [0, 7])
def test_graph_compute_shorter_than_header(arena, size):
    arena.run(lambda a: a.send(frame(GRAPH_COMPUTE, bytes(size))), "GRAPH_COMPUTE payload")


@pytest.mark.parametrize("n_nodes, n_tensors, reason", [
    (0xFFFFFFFF, 0, "at most"), (1, 0xFFFFFFFF, "at most"), (1000, 0, "too short"),
    (1, 1 << 18, "too short")])
def test_graph_counts_beyond_payload(arena, n_nodes, n_tensors, reason):
    """Counts beyond the caps are refused before the rest of the payload is looked at."""
    body = u32(0) + u32(n_nodes) + u64(1) + u32(n_tensors)
    arena.run(lambda a: a.send(frame(GRAPH_COMPUTE, body)), reason)


def test_graph_counts_checked_before_the_whole_payload(arena):
    """A GRAPH_COMPUTE that announces 100 MiB with a node count over the cap is closed
    once its first 16 MiB are in: the server does not wait for (or keep) the rest."""
    head = u32(0) + u32(MAX_GRAPH_NODES + 1)
    first = head + bytes((16 << 20) - len(head))
    arena.run(lambda a: a.send(frame(GRAPH_COMPUTE, size=100 << 20) + first), "at most")


def test_graph_trailing_bytes_are_dropped(arena):
    """Bytes past the last tensor are ignored, as llama.cpp ignores them, however many:
    the connection goes on."""
    a = arena.attacker()
    body = graph(0, [1], [tensor(id=1, ne=(4,))])
    a.send(frame(GRAPH_COMPUTE, body + b"\x5a" * ((20 << 20) - len(body))))
    a.raw.expect_no_response()
    a.raw.close()
    arena.aftermath()


# -- SET_TENSOR framing and truncated frames ---------------------------------------------

@pytest.mark.parametrize("size", [0, 9, 296, 304])
def test_set_tensor_shorter_than_header(arena, size):
    arena.run(lambda a: a.send(frame(SET_TENSOR, (a.t() + b"\0" + u64(0))[:size])),
              "shorter than its header")


@pytest.mark.parametrize("case", ["header", "hello_payload", "alloc", "get_tensor", "set_header",
                                  "set_data", "graph", "copy", "alloc_size"])
def test_truncated_frame(arena, case):
    """The peer closes mid-frame: its session ends and frees what it held."""
    hello = case != "hello_payload"
    a = arena.attacker(hello=hello, alloc=hello)
    part = {
        "header": lambda: frame(ALLOC_BUFFER, u32(0) + u64(64))[:5],
        "hello_payload": lambda: frame(HELLO, bytes(24))[:20],
        "alloc": lambda: frame(ALLOC_BUFFER, u32(0) + u64(64))[:14],
        "get_tensor": lambda: frame(GET_TENSOR, a.t() + u64(0) + u64(4))[:200],
        "set_header": lambda: frame(SET_TENSOR, a.t() + b"\0" + u64(0) + bytes(64))[:100],
        "set_data": lambda: frame(SET_TENSOR, a.t() + b"\0" + u64(0) + bytes(64))[:9 + 305 + 10],
        "graph": lambda: frame(GRAPH_COMPUTE, graph(0, [1], [a.t(id=1)]))[:9 + 20],
        "copy": lambda: frame(COPY_TENSOR, a.t() + a.t())[:400],
        "alloc_size": lambda: frame(GET_ALLOC_SIZE, u32(0) + a.t() + bytes(2960))[:1000],
    }[case]()
    a.send(part)
    arena.settled(a, None, peer_closes=True)


def test_many_buffers_freed_on_close(arena):
    a = arena.attacker()
    for _ in range(20):
        a.raw.alloc(4096)
    assert arena.server.stats()["buffers"] == 22
    a.send(frame(255))
    arena.settled(a, "unknown command")
