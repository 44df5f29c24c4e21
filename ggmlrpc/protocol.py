"""ggml RPC protocol v7.0.0: commands, message layouts and the pure-Python codec.

Every request is  | cmd u8 | size u64 | payload |  and every response  | size u64 | payload |.
Integers are little endian and structs packed. The native codec in
``ggmlrpc._native.codec`` implements the same functions; ``codec()`` picks one and
the tests run against both.
"""
from __future__ import annotations

import enum
import os
import struct
from dataclasses import dataclass, field

from . import ggml
from ._native import commands as _commands
from .errors import ProtocolError, ValidationError

PROTO_MAJOR, PROTO_MINOR, PROTO_PATCH = 7, 0, 0
CONN_CAPS_SIZE = 24
HASH_THRESHOLD = 10 * 1024 * 1024  # the client hashes weight writes strictly above this
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MAX_SRC = 10


# The commands, their ids and payload sizes: one row each in csrc/common/commands.def,
# read here from the native table built from it.
Cmd = enum.IntEnum("Cmd", [(name, cid) for name, cid, _, _ in _commands.COMMANDS], module=__name__)
CMD_COUNT = len(Cmd)

# rpc_tensor (296 bytes)
#   0 id u64 | 8 type u32 | 12 buffer u64 | 20 ne u32[4] | 36 nb u32[4] | 52 op u32
#  56 op_params i32[16] | 120 flags i32 | 124 src u64[10] | 204 view_src u64
# 212 view_offs u64 | 220 data u64 | 228 name char[64] | 292 use_count i32
TENSOR_STRUCT = struct.Struct("<QIQ4I4II16ii10QQQQ64si")
TENSOR_SIZE = TENSOR_STRUCT.size
assert TENSOR_SIZE == 296

HEADER = struct.Struct("<BQ")  # | cmd u8 | size u64 |
SIZE = struct.Struct("<Q")     # | size u64 | (responses)
SET_TENSOR_HEADER_SIZE = TENSOR_SIZE + 1 + 8  # | rpc_tensor | cache_flag u8 | offset u64 |

# Fixed request payload sizes; None means variable (SET_TENSOR, GRAPH_COMPUTE).
REQUEST_SIZE: dict[int, int | None] = {
    Cmd(cid): None if req == _commands.SIZE_VAR else req for _, cid, req, _ in _commands.COMMANDS}

# Response payload sizes; None = the command has no response (fire and forget),
# -1 = variable (GET_TENSOR answers with the requested bytes).
RESPONSE_SIZE: dict[int, int | None] = {
    Cmd(cid): {_commands.SIZE_NONE: None, _commands.SIZE_VAR: -1}.get(rsp, rsp)
    for _, cid, _, rsp in _commands.COMMANDS}


@dataclass(slots=True)
class RpcTensor:
    """One rpc_tensor as it travels on the wire."""

    id: int = 0
    type: int = 0
    buffer: int = 0
    ne: tuple = (1, 1, 1, 1)
    nb: tuple = (4, 4, 4, 4)
    op: int = 0
    op_params: tuple = (0,) * 16
    flags: int = 0
    src: tuple = (0,) * MAX_SRC
    view_src: int = 0
    view_offs: int = 0
    data: int = 0
    name: bytes = b""
    use_count: int = 0
    # not on the wire: ggml_nbytes once validated
    nbytes: int = field(default=-1, compare=False)

    @property
    def name_str(self) -> str:
        return self.name.split(b"\0", 1)[0].decode("utf-8", "replace")


def encode_tensor(t: RpcTensor) -> bytes:
    name = t.name if isinstance(t.name, bytes) else str(t.name).encode()
    return TENSOR_STRUCT.pack(
        t.id, t.type, t.buffer, *t.ne, *t.nb, t.op, *t.op_params, t.flags, *t.src,
        t.view_src, t.view_offs, t.data, name[:63], t.use_count)


def decode_tensor(buf, offset: int = 0) -> RpcTensor:
    v = TENSOR_STRUCT.unpack_from(buf, offset)
    return RpcTensor(v[0], v[1], v[2], v[3:7], v[7:11], v[11], v[12:28], v[28], v[29:39],
                     v[39], v[40], v[41], v[42].split(b"\0", 1)[0], v[43])


def check_tensor_shape(t: RpcTensor) -> int:
    """Validate type, block multiple and overflow; store and return ggml_nbytes."""
    blck = ggml.blck_size(t.type)
    if blck == 0:
        raise ValidationError(f"invalid tensor type {t.type}")
    if t.ne[0] % blck:
        raise ValidationError(
            f"ne[0]={t.ne[0]} is not a multiple of the block size {blck} of {ggml.type_name(t.type)}")
    checked(t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3], "tensor element count", INT64_MAX)
    n = t.nbytes = checked(ggml.nbytes(t.type, t.ne, t.nb), "tensor byte size")
    return n


INT64_MAX = (1 << 63) - 1
SIZE_MAX = (1 << 64) - 1


def checked(n: int, what: str, limit: int = SIZE_MAX) -> int:
    """A size or count computed from client numbers, checked before anything uses it:
    n when 0 <= n <= limit, else ValidationError (the twin of csrc/common/checked.h,
    where C saturates instead; Python's integers do not wrap, so the check is the
    range a native size_t, or a bound of our own, can hold)."""
    if not 0 <= n <= limit:
        raise ValidationError(f"{what} overflows" if limit == SIZE_MAX or limit == INT64_MAX
                              else f"{what} of {n} is over the limit of {limit}")
    return n


def range_inside(data: int, size: int, base: int, buf_size: int) -> bool:
    """data .. data + size lies inside [base, base + buf_size)."""
    return data >= base and data - base <= buf_size and size <= buf_size - (data - base)


def fnv1a(data, h: int = FNV_OFFSET) -> int:
    mask = 0xFFFFFFFFFFFFFFFF
    for b in bytes(data):
        h = ((h ^ b) * FNV_PRIME) & mask
    return h


# Graph payload:
# | device u32 | n_nodes u32 | node_ids u64[n_nodes] | n_tensors u32 | rpc_tensor[n_tensors] |
#
# Caps checked while decoding, before anything is allocated for the counts: above
# the largest graphs llama.cpp builds (it reserves up to 160 nodes per token of a
# ubatch for its loopiest architectures, ~150k nodes at ubatch 3840), and low enough
# that one request cannot cost gigabytes of decoded objects (a graph at both caps
# decodes into ~350 MiB).
MAX_GRAPH_NODES = 1 << 18
MAX_GRAPH_TENSORS = 1 << 19
# the largest payload that can hold both (trailing bytes past it are never needed)
MAX_GRAPH_PAYLOAD = 8 + 8 * MAX_GRAPH_NODES + 4 + TENSOR_SIZE * MAX_GRAPH_TENSORS
def encode_graph(device: int, node_ids, tensors) -> bytes:
    parts = [struct.pack("<II", device, len(node_ids)),
             struct.pack(f"<{len(node_ids)}Q", *node_ids),
             struct.pack("<I", len(tensors))]
    parts.extend(encode_tensor(t) for t in tensors)
    return b"".join(parts)


def graph_layout(payload_size: int, head: bytes):
    """From the first 8 bytes: (device, n_nodes) and check the size can hold the node ids."""
    device, n_nodes = struct.unpack_from("<II", head)
    if n_nodes > MAX_GRAPH_NODES:
        raise ProtocolError(f"graph of {n_nodes} nodes (at most {MAX_GRAPH_NODES})")
    if payload_size < 8 + 8 * n_nodes + 4:
        raise ProtocolError(f"graph payload of {payload_size} bytes too short for {n_nodes} nodes")
    return device, n_nodes


def graph_tensors(payload, n_nodes: int) -> tuple[int, int]:
    """(offset, count) of the tensors of a graph payload after its n_nodes node ids,
    the count checked against the cap and the payload's size."""
    off = 8 + 8 * n_nodes
    (n_tensors,) = struct.unpack_from("<I", payload, off)
    if n_tensors > MAX_GRAPH_TENSORS:
        raise ProtocolError(f"graph of {n_tensors} tensors (at most {MAX_GRAPH_TENSORS})")
    if len(payload) < off + 4 + n_tensors * TENSOR_SIZE:
        raise ProtocolError(f"graph payload of {len(payload)} bytes too short for {n_tensors} tensors")
    return off + 4, n_tensors


def decode_graph(payload) -> tuple[int, list[int], list[RpcTensor]]:
    """Decode a whole graph payload (trailing bytes are ignored, as llama.cpp does)."""
    size = len(payload)
    if size < 8:
        raise ProtocolError("graph payload shorter than 8 bytes")
    device, n_nodes = graph_layout(size, payload[:8])
    nodes = list(struct.unpack_from(f"<{n_nodes}Q", payload, 8))
    if len(set(nodes)) != n_nodes:
        raise ValidationError("graph lists a node id more than once")
    off, n_tensors = graph_tensors(payload, n_nodes)
    tensors = [decode_tensor(payload, off + i * TENSOR_SIZE) for i in range(n_tensors)]
    return device, nodes, tensors


def decode_checked(buf, offset: int = 0) -> RpcTensor:
    """Decode a tensor and apply the shape checks (the native codec decodes only the
    fields data commands use)."""
    t = decode_tensor(buf, offset)
    check_tensor_shape(t)
    return t


def check_shapes(buf, offset: int, rows, nbytes) -> int:
    """The shape checks of the graph tensors at offset + TENSOR_SIZE * rows[k], their
    byte sizes written to nbytes[rows[k]]; returns the first row that fails, or -1."""
    for r in rows:
        try:
            nbytes[r] = check_tensor_shape(decode_tensor(buf, offset + TENSOR_SIZE * int(r)))
        except ValidationError:
            return int(r)
    return -1


def find_cycle(deps) -> int:
    """deps[i]: the rows tensor i depends on (-1: none). Returns the row of a tensor
    that depends on itself through them, or -1 (iterative depth-first search)."""
    state = bytearray(len(deps))  # 1: on the current path, 2: done
    for root in range(len(deps)):
        if state[root]:
            continue
        state[root] = 1
        stack = [(root, iter(deps[root].tolist()))]
        while stack:
            i, it = stack[-1]
            for d in it:
                if d < 0:
                    continue
                if state[d] == 1:
                    return d
                if not state[d]:
                    state[d] = 1
                    stack.append((d, iter(deps[d].tolist())))
                    break
            else:
                state[i] = 2
                stack.pop()
    return -1


class PurePythonCodec:
    """The reference implementation of the codec functions the native module provides."""

    name = "python"
    decode_tensor = staticmethod(decode_tensor)
    encode_tensor = staticmethod(encode_tensor)
    check_tensor_shape = staticmethod(check_tensor_shape)
    decode_graph = staticmethod(decode_graph)
    decode_checked = staticmethod(decode_checked)
    check_shapes = staticmethod(check_shapes)
    find_cycle = staticmethod(find_cycle)
    range_inside = staticmethod(range_inside)
    fnv1a = staticmethod(fnv1a)


def native_codec():
    from ._native import codec as native
    return native.NativeCodec()


def codec(name: str | None = None):
    """The codec to use: ``GGMLRPC_CODEC=python`` forces the pure-Python twin."""
    name = name or os.environ.get("GGMLRPC_CODEC", "native")
    if name == "python":
        return PurePythonCodec()
    try:
        return native_codec()
    except ImportError:
        if name == "native" and os.environ.get("GGMLRPC_CODEC"):
            raise
        return PurePythonCodec()
