"""The wire codec, run against both implementations: the pure-Python reference in
ggmlrpc.protocol and the native one in ggmlrpc._native.codec.

Expected values come from the protocol (docs/protocol.md) and from small independent
computations in this file (struct offsets, brute-force byte extents, a plain
FNV-1a loop), never from the code under test.
"""
from __future__ import annotations

import itertools
import random
import re
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggmlrpc import ggml, protocol
from ggmlrpc.errors import ProtocolError, ValidationError
from ggmlrpc.protocol import RpcTensor

REPO = Path(__file__).resolve().parents[2]
U64_MAX = (1 << 64) - 1
U32_MAX = (1 << 32) - 1
INT64_MAX = (1 << 63) - 1
REMOVED_TYPES = (4, 5, 31, 32, 33, 36, 37, 38)

# docs/protocol.md "Tensor types": id -> (block size, bytes per block)
SPEC_TYPES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
    14: (256, 210), 15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98),
    19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1),
    25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2), 34: (256, 54),
    35: (256, 66), 39: (32, 17), 40: (64, 36), 41: (128, 18), 42: (64, 18),
}

FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(params=["python", "native"])
def codec(request):
    if request.param == "python":
        return protocol.PurePythonCodec()
    return protocol.native_codec()


def tensor(**kw) -> RpcTensor:
    kw.setdefault("ne", (4, 3, 2, 1))
    if "nb" not in kw:
        kw["nb"] = ggml.contiguous_strides(kw.get("type", 0), kw["ne"])
    return RpcTensor(**kw)


# -- rpc_tensor layout --------------------------------------------------------------

def test_tensor_field_offsets(codec):
    """Every field lands at the offset docs/protocol.md gives it, read back independently."""
    t = RpcTensor(
        id=0x1122334455667788, type=30, buffer=0xA1A2A3A4A5A6A7A8,
        ne=(0x101, 0x102, 0x103, 0x104), nb=(0x201, 0x202, 0x203, 0x204), op=0x33,
        op_params=tuple(range(-8, 8)), flags=-5,
        src=tuple(0xC000 + i for i in range(10)), view_src=0xD1, view_offs=0xD2,
        data=0xE0E1E2E3E4E5E6E7, name=b"layer.0.attn", use_count=-7)
    raw = codec.encode_tensor(t)
    assert isinstance(raw, bytes) and len(raw) == 296
    assert struct.unpack_from("<Q", raw, 0)[0] == t.id
    assert struct.unpack_from("<I", raw, 8)[0] == 30
    assert struct.unpack_from("<Q", raw, 12)[0] == t.buffer
    assert struct.unpack_from("<4I", raw, 20) == t.ne
    assert struct.unpack_from("<4I", raw, 36) == t.nb
    assert struct.unpack_from("<I", raw, 52)[0] == 0x33
    assert struct.unpack_from("<16i", raw, 56) == t.op_params
    assert struct.unpack_from("<i", raw, 120)[0] == -5
    assert struct.unpack_from("<10Q", raw, 124) == t.src
    assert struct.unpack_from("<Q", raw, 204)[0] == 0xD1
    assert struct.unpack_from("<Q", raw, 212)[0] == 0xD2
    assert struct.unpack_from("<Q", raw, 220)[0] == t.data
    assert raw[228:292] == b"layer.0.attn".ljust(64, b"\0")
    assert struct.unpack_from("<i", raw, 292)[0] == -7


def random_tensor(rng: random.Random, name: bytes | None = None) -> RpcTensor:
    return RpcTensor(
        id=rng.getrandbits(64), type=rng.getrandbits(32), buffer=rng.getrandbits(64),
        ne=tuple(rng.getrandbits(32) for _ in range(4)),
        nb=tuple(rng.getrandbits(32) for _ in range(4)), op=rng.getrandbits(32),
        op_params=tuple(rng.randrange(-(1 << 31), 1 << 31) for _ in range(16)),
        flags=rng.randrange(-(1 << 31), 1 << 31),
        src=tuple(rng.getrandbits(64) for _ in range(10)), view_src=rng.getrandbits(64),
        view_offs=rng.getrandbits(64), data=rng.getrandbits(64),
        name=name if name is not None else bytes(rng.randrange(1, 256) for _ in range(rng.randrange(64))),
        use_count=rng.randrange(-(1 << 31), 1 << 31))


def test_tensor_round_trip(codec, seed):
    rng = random.Random(seed)
    other = protocol.PurePythonCodec()
    for _ in range(200):
        t = random_tensor(rng, bytes(rng.randrange(1, 256) for _ in range(rng.randrange(64))))
        raw = codec.encode_tensor(t)
        assert raw == other.encode_tensor(t)
        back = codec.decode_tensor(raw)
        assert back == t
        # at an offset inside a larger buffer
        assert codec.decode_tensor(b"\xee" * 7 + raw + b"\xff", 7) == t


@pytest.mark.parametrize("name, wire, decoded", [
    (b"", b"", b""),
    (b"x" * 63, b"x" * 63, b"x" * 63),
    (b"y" * 64, b"y" * 63, b"y" * 63),       # truncated to 63 + NUL
    (b"z" * 200, b"z" * 63, b"z" * 63),
    ("w\u00e9ights", "w\u00e9ights".encode(), "w\u00e9ights".encode()),
])
def test_name_truncation(codec, name, wire, decoded):
    raw = codec.encode_tensor(tensor(name=name))
    assert raw[228:292] == wire.ljust(64, b"\0")
    assert raw[291] == 0  # always NUL-terminated
    t = codec.decode_tensor(raw)
    assert t.name == decoded
    assert t.name_str == decoded.decode()


def test_name_stops_at_first_nul(codec):
    raw = bytearray(codec.encode_tensor(tensor()))
    raw[228:292] = b"abc\0def\0".ljust(64, b"\xaa")
    assert codec.decode_tensor(bytes(raw)).name == b"abc"
    # 64 bytes without any NUL: both codecs keep all of them, nothing beyond
    raw[228:292] = b"n" * 64
    assert codec.decode_tensor(bytes(raw)).name == b"n" * 64


@FAST
@given(blob=st.binary(min_size=296, max_size=296))
def test_decode_arbitrary_bytes_agrees(codec, blob):
    """Any 296 bytes decode to the same tensor in both codecs."""
    t = codec.decode_tensor(blob)
    assert t == protocol.PurePythonCodec().decode_tensor(blob)
    assert struct.unpack_from("<Q", blob, 0)[0] == t.id
    assert struct.unpack_from("<Q", blob, 220)[0] == t.data


def test_decode_tensor_short_buffer(codec):
    raw = codec.encode_tensor(tensor())
    with pytest.raises((ProtocolError, struct.error)):
        codec.decode_tensor(raw[:295])
    with pytest.raises((ProtocolError, struct.error)):
        codec.decode_tensor(raw, 1)


# -- ggml_nbytes and shape checks ---------------------------------------------------

def brute_nbytes(type_id: int, ne, nb) -> int:
    """Byte extent by walking every row: highest row start + one row's bytes."""
    blck, size = SPEC_TYPES[type_id]
    if any(n == 0 for n in ne):
        return 0
    if blck == 1:
        last = max(sum(i * s for i, s in zip(idx, nb))
                   for idx in itertools.product(*(range(n) for n in ne)))
        return last + size
    row = ne[0] * nb[0] // blck
    last = max(sum(i * s for i, s in zip(idx, nb[1:]))
               for idx in itertools.product(*(range(n) for n in ne[1:])))
    return last + row


@pytest.mark.parametrize("type_id, ne, nb, expected", [
    (0, (4, 3, 2, 1), (4, 16, 48, 96), 96),            # F32 contiguous
    (0, (3, 2, 1, 1), (8, 4, 24, 24), 24),             # F32 transposed 2x3
    (0, (2, 3, 4, 1), (48, 16, 4, 96), 96),            # F32 permuted (2, 0, 1)
    (1, (5, 1, 1, 1), (2, 10, 10, 10), 10),            # F16 one row
    (0, (4, 1, 1, 1), (4, 0, 0, 0), 16),               # broadcast strides
    (0, (4, 0, 2, 1), (4, 16, 0, 0), 0),               # zero dim
    (0, (1, 1, 1, 0), (4, 4, 4, 4), 0),
    (2, (64, 2, 1, 1), (18, 36, 72, 72), 72),          # Q4_0: 2 blocks per row
    (2, (64, 2, 3, 1), (18, 108, 36, 216), 216),       # Q4_0 rows permuted with dim 2
    (12, (512, 3, 1, 1), (144, 288, 864, 864), 864),   # Q4_K
    (39, (32, 1, 1, 1), (17, 17, 17, 17), 17),         # MXFP4 single block
    (8, (0, 5, 1, 1), (34, 0, 0, 0), 0),               # Q8_0 with ne[0] == 0
    (41, (256, 2, 1, 1), (18, 36, 72, 72), 72),        # Q1_0: block of 128
])
def test_nbytes_pinned(codec, type_id, ne, nb, expected):
    assert brute_nbytes(type_id, ne, nb) == expected
    assert ggml.nbytes(type_id, ne, nb) == expected
    t = RpcTensor(type=type_id, ne=ne, nb=nb)
    assert codec.check_tensor_shape(t) == expected
    assert t.nbytes == expected


def test_nbytes_random_against_brute_force(codec, seed):
    rng = random.Random(seed)
    for _ in range(150):
        type_id = rng.choice(list(SPEC_TYPES))
        blck, size = SPEC_TYPES[type_id]
        ne = [rng.randrange(0, 4) * blck if blck > 1 else rng.randrange(0, 5)]
        ne += [rng.randrange(0, 4) for _ in range(3)]
        nb = [size] + [rng.randrange(0, 300) for _ in range(3)]
        rng.shuffle(nb) if blck == 1 else None  # non-block types: any permutation of strides
        t = RpcTensor(type=type_id, ne=tuple(ne), nb=tuple(nb))
        assert codec.check_tensor_shape(t) == brute_nbytes(type_id, ne, nb), (type_id, ne, nb)


@pytest.mark.parametrize("type_id", [43, 44, 100, 255, 1 << 16, U32_MAX, *REMOVED_TYPES])
def test_invalid_type_rejected(codec, type_id):
    t = RpcTensor(type=type_id, ne=(32, 1, 1, 1), nb=(4, 128, 128, 128))
    with pytest.raises(ValidationError, match="type"):
        codec.check_tensor_shape(t)


@pytest.mark.parametrize("type_id, ne0", [(2, 33), (2, 1), (2, 16), (10, 128), (10, 257),
                                           (40, 32), (41, 64), (42, 96), (23, 255)])
def test_ne0_not_multiple_of_block(codec, type_id, ne0):
    blck, size = SPEC_TYPES[type_id]
    t = RpcTensor(type=type_id, ne=(ne0, 1, 1, 1), nb=(size, size * 8, size * 8, size * 8))
    with pytest.raises(ValidationError, match="block"):
        codec.check_tensor_shape(t)


def test_every_valid_type_accepts_one_block(codec):
    for type_id, (blck, size) in SPEC_TYPES.items():
        t = RpcTensor(type=type_id, ne=(blck, 1, 1, 1), nb=(size, size, size, size))
        assert codec.check_tensor_shape(t) == size


# 2**63 - 1 = (7*7*73*127) * (337*92737) * 649657
INT64_MAX_SHAPE = (454279, 31252369, 649657, 1)


@pytest.mark.parametrize("ne, nb, ok", [
    (INT64_MAX_SHAPE, (4, 0, 0, 0), True),                # exactly INT64_MAX elements
    ((1 << 31, 1 << 31, 2, 1), (4, 0, 0, 0), False),      # 2**63 elements
    ((U32_MAX,) * 4, (4, 4, 4, 4), False),
    ((U32_MAX, U32_MAX, 1, 1), (1, 1, 1, 1), False),
    ((1, U32_MAX, 1 << 31, 1), (4, U32_MAX, U32_MAX, 0), False),  # bytes overflow u64
    ((1, 1 << 16, 1 << 16, 1 << 16), (4, U32_MAX, U32_MAX, U32_MAX), True),  # < 2**64 bytes
])
def test_element_and_byte_overflow(codec, ne, nb, ok):
    t = RpcTensor(type=0, ne=ne, nb=nb)
    exact = 4 + sum((n - 1) * s for n, s in zip(ne, nb))
    if ok:
        assert codec.check_tensor_shape(t) == exact
    else:
        with pytest.raises(ValidationError, match="overflow"):
            codec.check_tensor_shape(t)


@FAST
@given(type_id=st.sampled_from(sorted(SPEC_TYPES)),
       ne=st.tuples(*[st.integers(0, U32_MAX)] * 4),
       nb=st.tuples(*[st.integers(0, U32_MAX)] * 4))
def test_shape_check_agrees_with_bigints(codec, type_id, ne, nb):
    """Accept exactly when the block rule holds and the exact counts fit."""
    blck, size = SPEC_TYPES[type_id]
    t = RpcTensor(type=type_id, ne=ne, nb=nb)
    elems = ne[0] * ne[1] * ne[2] * ne[3]
    if ne[0] % blck:
        expect = "block"
    elif elems > INT64_MAX:
        expect = "overflow"
    else:
        expect = 0 if 0 in ne else (
            (size if blck == 1 else 0) + sum((ne[i] - 1) * nb[i] for i in range(1 if blck > 1 else 0, 4))
            + (ne[0] * nb[0] // blck if blck > 1 else 0))
        if expect > U64_MAX:
            expect = "overflow"
    if isinstance(expect, str):
        with pytest.raises(ValidationError, match=expect):
            codec.check_tensor_shape(t)
    else:
        assert codec.check_tensor_shape(t) == expect


# -- range_inside -------------------------------------------------------------------

@pytest.mark.parametrize("data, size, base, buf_size, inside", [
    (0x1000, 0x100, 0x1000, 0x100, True),          # exactly the buffer
    (0x1000, 0x101, 0x1000, 0x100, False),
    (0x10FF, 1, 0x1000, 0x100, True),              # last byte
    (0x1100, 0, 0x1000, 0x100, True),              # empty range at the end
    (0x1100, 1, 0x1000, 0x100, False),
    (0x1101, 0, 0x1000, 0x100, False),             # past the end
    (0x0FFF, 1, 0x1000, 0x100, False),             # before the start
    (0x0FFF, 0, 0x1000, 0x100, False),
    (0x1010, U64_MAX, 0x1000, 0x100, False),       # data + size wraps around
    (0x1010, U64_MAX - 0x100F, 0x1000, 0x100, False),  # wraps to exactly base
    (U64_MAX, 1, 0, U64_MAX, False),               # would end at 2**64
    (U64_MAX - 1, 1, 0, U64_MAX, True),
    (U64_MAX, 0, 0, U64_MAX, True),
    (0, 0, 0, 0, True),                            # empty buffer, empty range
    (0, 1, 0, 0, False),
    (U64_MAX, U64_MAX, U64_MAX, 0, False),
    (U64_MAX, 0, U64_MAX, 0, True),
])
def test_range_inside_edges(codec, data, size, base, buf_size, inside):
    assert codec.range_inside(data, size, base, buf_size) is inside
    assert (base <= data and data + size <= base + buf_size) is inside


u64_edge = st.one_of(st.integers(0, U64_MAX), st.integers(0, 64), st.integers(U64_MAX - 64, U64_MAX),
                     st.sampled_from([1 << 63, (1 << 63) - 1, 1 << 32, 0x1000]))


@FAST
@given(data=u64_edge, size=u64_edge, base=u64_edge, buf_size=u64_edge)
def test_range_inside_agrees_with_bigints(codec, data, size, base, buf_size):
    assert codec.range_inside(data, size, base, buf_size) == (
        base <= data and data + size <= base + buf_size)


# -- FNV-1a -------------------------------------------------------------------------

def fnv1a_ref(data: bytes, h: int = 0xCBF29CE484222325) -> int:
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) % (1 << 64)
    return h


@pytest.mark.parametrize("data, expected", [
    (b"", 0xCBF29CE484222325),   # published FNV-1a 64 test vectors
    (b"a", 0xAF63DC4C8601EC8C),
    (b"foobar", 0x85944171F73967E8),
])
def test_fnv1a_published_vectors(codec, data, expected):
    assert fnv1a_ref(data) == expected
    assert codec.fnv1a(data) == expected


def test_fnv1a_against_reference_loop(codec, seed):
    rng = random.Random(seed)
    for n in list(range(0, 34)) + [255, 4096, 65537]:
        data = rng.randbytes(n)
        assert codec.fnv1a(data) == fnv1a_ref(data), n
    data = rng.randbytes(1000)
    # continuing a hash equals hashing the concatenation; other buffer kinds work too
    assert codec.fnv1a(data[600:], codec.fnv1a(data[:600])) == fnv1a_ref(data)
    assert codec.fnv1a(bytearray(data)) == codec.fnv1a(memoryview(data)) == fnv1a_ref(data)


# -- graph payloads -----------------------------------------------------------------

def graph_bytes(device: int, node_ids, tensors_raw: list[bytes], n_tensors: int | None = None) -> bytes:
    """| device u32 | n_nodes u32 | node_ids u64[n] | n_tensors u32 | rpc_tensor[] |, by hand."""
    n_tensors = len(tensors_raw) if n_tensors is None else n_tensors
    return (struct.pack("<II", device, len(node_ids)) + struct.pack(f"<{len(node_ids)}Q", *node_ids)
            + struct.pack("<I", n_tensors) + b"".join(tensors_raw))


def sample_graph(codec):
    a = tensor(id=11, name=b"a", buffer=0x99, data=0x5000)
    b = tensor(id=12, name=b"b", op=ggml.GGMLOp.ADD, src=(11,) + (0,) * 9, flags=16, use_count=1)
    raw = [codec.encode_tensor(a), codec.encode_tensor(b)]
    return graph_bytes(3, [12, 11], raw), [a, b]


def test_decode_graph(codec):
    payload, tensors = sample_graph(codec)
    assert codec.decode_graph(payload) == (3, [12, 11], tensors)
    assert codec.decode_graph(bytearray(payload)) == (3, [12, 11], tensors)


def test_decode_graph_empty(codec):
    assert codec.decode_graph(graph_bytes(0, [], [])) == (0, [], [])


def test_decode_graph_ignores_trailing_bytes(codec):
    payload, tensors = sample_graph(codec)
    assert codec.decode_graph(payload + b"\x07" * 301) == (3, [12, 11], tensors)
    # a tensor count of 1 with two tensors present: the second is trailing junk
    short = graph_bytes(3, [12, 11], [codec.encode_tensor(t) for t in tensors], n_tensors=1)
    assert codec.decode_graph(short) == (3, [12, 11], tensors[:1])


def test_decode_graph_truncated(codec):
    payload, _ = sample_graph(codec)
    for cut in list(range(0, 40)) + [len(payload) - 296, len(payload) - 1]:
        with pytest.raises(ProtocolError):
            codec.decode_graph(payload[:cut])


@pytest.mark.parametrize("n_nodes, n_tensors", [(U32_MAX, 0), (1 << 28, 0), (0, U32_MAX), (1, 1 << 24)])
def test_decode_graph_huge_counts(codec, n_nodes, n_tensors):
    """Counts far beyond the payload fail on size, before any allocation."""
    payload = struct.pack("<IIQI", 0, n_nodes, 5, n_tensors) + b"\0" * 296
    with pytest.raises(ProtocolError):
        codec.decode_graph(payload)


def test_decode_graph_duplicate_node_ids(codec):
    """ggml lists each node once; a repeated id (which once cost the server a copy of
    the node per repetition) is refused while decoding."""
    payload, tensors = sample_graph(codec)
    raw = [codec.encode_tensor(t) for t in tensors]
    for ids in ([12, 11, 12], [11, 11], [12] * 1000):
        with pytest.raises(ValidationError, match="more than once"):
            codec.decode_graph(graph_bytes(3, ids, raw))


def test_decode_graph_count_caps(codec):
    """Counts over the caps fail even when the payload is long enough to hold them."""
    n = protocol.MAX_GRAPH_NODES + 1
    payload = struct.pack("<II", 0, n) + struct.pack(f"<{n}Q", *range(1, n + 1)) + struct.pack("<I", 0)
    with pytest.raises(ProtocolError, match="at most"):
        codec.decode_graph(payload)
    n_t = protocol.MAX_GRAPH_TENSORS + 1
    head = struct.pack("<IIQI", 0, 1, 1, n_t)
    with pytest.raises(ProtocolError, match="at most"):
        codec.decode_graph(head + bytes(296) * 4)
    # a small graph still decodes
    ok = struct.pack("<II", 0, 2) + struct.pack("<2Q", 11, 12) + struct.pack("<I", 0)
    assert codec.decode_graph(ok) == (0, [11, 12], [])


def test_encode_graph_matches_hand_layout(codec):
    payload, tensors = sample_graph(codec)
    assert protocol.encode_graph(3, [12, 11], tensors) == payload


# -- sizes pinned from Python ---------------------------------------------------------

# docs/protocol.md "Commands": payload bytes per request; None = variable
SPEC_REQUEST_SIZE = {0: 12, 1: 4, 2: 4, 3: 8, 4: 8, 5: 9, 6: None, 7: 312, 8: 312, 9: 592,
                     10: None, 11: 4, 12: 296, 13: 3260, 14: 24, 15: 0, 16: 4, 17: 313}
# None = no response, -1 = variable
SPEC_RESPONSE_SIZE = {0: 16, 1: 8, 2: 8, 3: 8, 4: None, 5: None, 6: None, 7: 1, 8: -1, 9: 1,
                      10: None, 11: 16, 12: None, 13: 8, 14: 28, 15: 4, 16: None, 17: None}
SPEC_COMMANDS = ("ALLOC_BUFFER GET_ALIGNMENT GET_MAX_SIZE BUFFER_GET_BASE FREE_BUFFER BUFFER_CLEAR "
                 "SET_TENSOR SET_TENSOR_HASH GET_TENSOR COPY_TENSOR GRAPH_COMPUTE GET_DEVICE_MEMORY "
                 "INIT_TENSOR GET_ALLOC_SIZE HELLO DEVICE_COUNT GRAPH_RECOMPUTE MEMSET_TENSOR").split()


def test_protocol_constants():
    assert protocol.TENSOR_SIZE == 296
    assert protocol.TENSOR_STRUCT.size == 296
    assert protocol.SET_TENSOR_HEADER_SIZE == 305
    assert protocol.HEADER.size == 9 and protocol.SIZE.size == 8
    assert (protocol.PROTO_MAJOR, protocol.PROTO_MINOR, protocol.PROTO_PATCH) == (7, 0, 0)
    assert protocol.CMD_COUNT == 18 == len(protocol.Cmd)
    assert [c.name for c in protocol.Cmd] == SPEC_COMMANDS
    assert [int(c) for c in protocol.Cmd] == list(range(18))
    assert protocol.HASH_THRESHOLD == 10 * 1024 * 1024
    assert {int(k): v for k, v in protocol.REQUEST_SIZE.items()} == SPEC_REQUEST_SIZE
    assert {int(k): v for k, v in protocol.RESPONSE_SIZE.items()} == SPEC_RESPONSE_SIZE


C_STRUCT_SIZES = {
    "rpc_tensor": 296, "rpc_msg_header": 9, "rpc_msg_hello_req": 24, "rpc_msg_hello_rsp": 28,
    "rpc_msg_alloc_buffer_req": 12, "rpc_msg_alloc_buffer_rsp": 16, "rpc_msg_device_req": 4,
    "rpc_msg_u64_rsp": 8, "rpc_msg_buffer_req": 8, "rpc_msg_buffer_clear_req": 9,
    "rpc_msg_set_tensor_hdr": 305, "rpc_msg_set_tensor_hash_req": 312,
    "rpc_msg_get_tensor_req": 312, "rpc_msg_copy_tensor_req": 592,
    "rpc_msg_get_device_memory_rsp": 16, "rpc_msg_get_alloc_size_req": 3260,
    "rpc_msg_memset_tensor_req": 313,
}


def test_c_struct_sizes():
    native = pytest.importorskip("ggmlrpc._native.codec")
    assert native.struct_sizes() == C_STRUCT_SIZES
    header = (REPO / "csrc" / "common" / "rpc.h").read_text()
    declared = set(re.findall(r"typedef struct (rpc_\w+)", header))
    assert declared == set(C_STRUCT_SIZES), "struct_sizes() must report every struct of rpc.h"


# -- type tables ----------------------------------------------------------------------

def test_type_table_matches_spec():
    assert ggml.TYPE_COUNT == 43
    assert {int(k): v for k, v in ggml.TYPE_TRAITS.items()} == SPEC_TYPES
    for t in range(0, 64):
        want = SPEC_TYPES.get(t, (0, 0))
        assert (ggml.blck_size(t), ggml.type_size(t)) == want, t
    assert set(REMOVED_TYPES) == set(range(43)) - set(SPEC_TYPES)


def test_native_type_table_matches():
    native = pytest.importorskip("ggmlrpc._native.codec")
    for t in list(range(0, 64)) + [255, U32_MAX]:
        assert (native.blck_size(t), native.type_size(t)) == (ggml.blck_size(t), ggml.type_size(t)), t


# gguf releases on PyPI still describe Q8_1 with float scales (4 + 4 + 32 bytes);
# ggml at protocol v7 packs two halves (static_assert: 2*sizeof(ggml_half) + QK8_1).
GGUF_STALE = {ggml.GGMLType.Q8_1: (32, 40)}


def test_type_table_matches_gguf():
    constants = pytest.importorskip("gguf.constants")
    known = {int(k): tuple(v) for k, v in constants.GGML_QUANT_SIZES.items()}
    assert len(known) >= 30
    for t, sizes in known.items():
        ours = (ggml.blck_size(t), ggml.type_size(t))
        if ours != sizes:
            assert GGUF_STALE.get(t) == sizes, (ggml.type_name(t), ours, sizes)
        name = constants.GGMLQuantizationType(t).name
        assert ggml.GGMLType(t).name == name
