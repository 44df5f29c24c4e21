"""Golden bytes for every request and response, over a raw socket.

Requests are written by hand; responses are compared byte for byte, size prefix
included. Commands without a response are followed by DEVICE_COUNT, and the next
bytes on the socket must be exactly its 12-byte answer. The same session runs
against the reference llama.cpp server, whose answers must equal ours except for
buffer handles, base addresses and memory sizes: that makes these goldens llama.cpp's.
"""
from __future__ import annotations

import os
import struct

import pytest

from tests.protocol.rawclient import (
    BUFFER_CLEAR, COPY_TENSOR, F32, FREE_BUFFER, GET_ALIGNMENT, GET_ALLOC_SIZE,
    GET_MAX_SIZE, GET_TENSOR, GRAPH_COMPUTE, GRAPH_RECOMPUTE, HELLO_ANSWER, INIT_TENSOR,
    MEMSET_TENSOR, OP_VIEW, Q4_0, SET_TENSOR_HASH, Raw, fnv1a, frame, graph, tensor, u64)

PATTERN = bytes((i * 37 + 11) & 0xFF for i in range(64))
U64 = struct.Struct("<Q")


class Transcript:
    """Responses in order, each with the byte ranges that are host facts (masked when
    comparing two servers)."""

    def __init__(self):
        self.entries: list[tuple[str, bytes, tuple[slice, ...]]] = []

    def add(self, label: str, rsp: bytes, *masked: slice) -> bytes:
        self.entries.append((label, rsp, masked))
        return rsp

    def masked(self) -> list[tuple[str, bytes]]:
        out = []
        for label, rsp, masks in self.entries:
            b = bytearray(rsp)
            for m in masks:
                b[m] = b"\xee" * len(b[m])
            out.append((label, bytes(b)))
        return out


def golden_session(port: int) -> tuple[Transcript, dict]:
    """Run every command once against the server on `port`, asserting the exact bytes
    that do not depend on the host. Returns the transcript and the host facts."""
    tr = Transcript()
    facts = {}
    with Raw(port) as c:
        # HELLO: | 0e | 24 u64 | 24 zero caps |  ->  | 28 u64 | 07 00 00 00 | 24 zero caps |
        c.send(bytes.fromhex("0e" "1800000000000000") + bytes(24))
        rsp = tr.add("hello", c.recv_exact(36))
        assert rsp == bytes.fromhex("1c00000000000000" "07000000") + bytes(24) == HELLO_ANSWER

        c.send(bytes.fromhex("0f" "0000000000000000"))
        assert tr.add("device_count", c.recv_exact(12)) == bytes.fromhex("0400000000000000" "01000000")

        c.send(bytes.fromhex("01" "0400000000000000" "00000000"))
        assert tr.add("alignment", c.recv_exact(16)) == bytes.fromhex("0800000000000000" "2000000000000000")

        c.send(bytes.fromhex("02" "0400000000000000" "00000000"))
        assert tr.add("max_size", c.recv_exact(16)) == bytes.fromhex("0800000000000000" "ffffffffffffffff")

        c.send(bytes.fromhex("0b" "0400000000000000" "00000000"))
        rsp = tr.add("device_memory", c.recv_exact(24), slice(8, 24))
        assert rsp[:8] == u64(16)
        facts["memory"] = struct.unpack_from("<QQ", rsp, 8)

        # ALLOC_BUFFER device 0, 4096 bytes  ->  | 16 | remote_ptr | remote_size = 4096 |
        c.send(bytes.fromhex("00" "0c00000000000000" "00000000" "0010000000000000"))
        rsp = tr.add("alloc", c.recv_exact(24), slice(8, 16))
        assert rsp[:8] == u64(16) and rsp[16:] == u64(4096)
        handle = U64.unpack_from(rsp, 8)[0]
        assert handle != 0

        c.send(bytes.fromhex("03" "0800000000000000") + u64(handle))
        rsp = tr.add("base", c.recv_exact(16), slice(8, 16))
        assert rsp[:8] == u64(8)
        base = facts["base"] = U64.unpack_from(rsp, 8)[0]
        assert base != 0

        # size 0: a valid handle, remote_size 0, base 0; freeing it answers nothing
        c.send(bytes.fromhex("00" "0c00000000000000" "00000000" "0000000000000000"))
        rsp = tr.add("alloc0", c.recv_exact(24), slice(8, 16))
        assert rsp[:8] == u64(16) and rsp[16:] == u64(0)
        empty = U64.unpack_from(rsp, 8)[0]
        assert empty not in (0, handle)
        c.send(bytes.fromhex("03" "0800000000000000") + u64(empty))
        assert tr.add("base0", c.recv_exact(16)) == u64(8) + u64(0)
        c.send(bytes.fromhex("04" "0800000000000000") + u64(empty))
        c.expect_no_response()

        # a failed allocation answers remote_ptr 0, remote_size 0, and nothing more
        c.send(bytes.fromhex("00" "0c00000000000000" "00000000" "ffffffffffffffff"))
        assert tr.add("alloc_fail", c.recv_exact(24)) == u64(16) + u64(0) + u64(0)
        c.expect_no_response()

        t1 = tensor(id=1, type=F32, buffer=handle, ne=(16,), data=base + 64, name=b"t1")
        t2 = tensor(id=2, type=F32, buffer=handle, ne=(16,), data=base + 1024, name=b"t2")

        # SET_TENSOR | rpc_tensor | cache_flag 0 | offset 0 | 64 bytes |: no answer
        c.send(bytes.fromhex("06") + u64(305 + 64) + t1 + b"\0" + u64(0) + PATTERN)
        c.expect_no_response()

        c.send(bytes.fromhex("08") + u64(312) + t1 + u64(0) + u64(64))
        assert tr.add("get", c.recv_exact(72)) == u64(64) + PATTERN
        c.send(bytes.fromhex("08") + u64(312) + t1 + u64(8) + u64(16))
        assert tr.add("get_part", c.recv_exact(24)) == u64(16) + PATTERN[8:24]
        c.send(bytes.fromhex("08") + u64(312) + t1 + u64(0) + u64(0))
        assert tr.add("get_empty", c.recv_exact(8)) == u64(0)

        # SET_TENSOR_HASH without a cache: | 1 | 00 |
        c.send(frame(SET_TENSOR_HASH, t1 + u64(0) + u64(fnv1a(PATTERN))))
        assert tr.add("set_hash", c.recv_exact(9)) == u64(1) + b"\x00"

        # COPY_TENSOR t1 -> t2: | 1 | 01 |
        c.send(frame(COPY_TENSOR, t1 + t2))
        assert tr.add("copy", c.recv_exact(9)) == u64(1) + b"\x01"
        assert tr.add("get_copy", c.call(GET_TENSOR, t2 + u64(0) + u64(64))) == u64(64) + PATTERN

        # MEMSET_TENSOR | rpc_tensor | offset 4 | size 8 | value ab |: no answer
        c.send(frame(MEMSET_TENSOR, t2 + u64(4) + u64(8) + b"\xab"))
        c.expect_no_response()
        assert tr.add("get_memset", c.call(GET_TENSOR, t2 + u64(0) + u64(64))) == (
            u64(64) + PATTERN[:4] + b"\xab" * 8 + PATTERN[12:])

        # BUFFER_CLEAR | remote_ptr | value 5a |: no answer, whole buffer filled
        c.send(frame(BUFFER_CLEAR, u64(handle) + b"\x5a"))
        c.expect_no_response()
        assert tr.add("get_clear", c.call(GET_TENSOR, t1 + u64(0) + u64(64))) == u64(64) + b"\x5a" * 64

        c.send(frame(INIT_TENSOR, t1))
        c.expect_no_response()

        # GET_ALLOC_SIZE | device | tensor | srcs[10] |: ggml_nbytes on CPU
        t3 = tensor(id=3, type=F32, buffer=handle, ne=(16, 4), data=base, name=b"t3")
        c.send(frame(GET_ALLOC_SIZE, struct.pack("<I", 0) + t3 + bytes(296 * 10)))
        assert tr.add("alloc_size", c.recv_exact(16)) == u64(8) + u64(256)
        q = tensor(id=4, type=Q4_0, ne=(96, 3), name=b"q", src=(5,))
        s = tensor(id=5, type=F32, ne=(96, 3), name=b"s")
        c.send(frame(GET_ALLOC_SIZE, struct.pack("<I", 0) + q + s + bytes(296 * 9)))
        assert tr.add("alloc_size_q", c.recv_exact(16)) == u64(8) + u64(3 * 3 * 18)

        # GRAPH_COMPUTE: a view node (nothing to run), then GRAPH_RECOMPUTE: no answers
        view = tensor(id=6, type=F32, buffer=handle, ne=(16,), data=base + 64, op=OP_VIEW,
                      src=(1,), view_src=1, name=b"v")
        c.send(frame(GRAPH_COMPUTE, graph(0, [6], [t1, view])))
        c.expect_no_response()
        c.send(frame(GRAPH_RECOMPUTE, struct.pack("<I", 0)))
        c.expect_no_response()

        # FREE_BUFFER drops the kept graph: GRAPH_RECOMPUTE now closes the connection
        c.send(frame(FREE_BUFFER, u64(handle)))
        c.expect_no_response()
        c.send(frame(GRAPH_RECOMPUTE, struct.pack("<I", 0)))
        c.expect_closed()

    # GRAPH_RECOMPUTE before any graph closes the connection
    with Raw(port) as c:
        assert c.hello() == HELLO_ANSWER
        c.send(frame(GRAPH_RECOMPUTE, struct.pack("<I", 0)))
        c.expect_closed()
    return tr, facts


def physical_memory() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_golden_session(server):
    tr, facts = golden_session(server.port)
    assert facts["memory"] == (physical_memory(), physical_memory())
    assert facts["base"] % 32 == 0
    assert [e[0] for e in tr.entries][:3] == ["hello", "device_count", "alignment"]


def test_fire_and_forget_back_to_back(server):
    """Commands without answers may arrive in one burst; the answers that follow are in order."""
    with Raw(server.port) as c:
        assert c.hello() == HELLO_ANSWER
        handle, base = c.alloc(256)
        t = tensor(id=1, type=F32, buffer=handle, ne=(64,), data=base)
        burst = b"".join([
            frame(BUFFER_CLEAR, u64(handle) + b"\x11"),
            frame(MEMSET_TENSOR, t + u64(0) + u64(4) + b"\x22"),
            frame(INIT_TENSOR, t),
            frame(GET_ALIGNMENT, struct.pack("<I", 0)),
            frame(GET_TENSOR, t + u64(0) + u64(8)),
            frame(GET_MAX_SIZE, struct.pack("<I", 0)),
        ])
        c.send(burst)
        assert c.recv_exact(16 + 16 + 16) == (
            u64(8) + u64(32) + u64(8) + b"\x22" * 4 + b"\x11" * 4 + u64(8) + u64((1 << 64) - 1))
        c.expect_no_response()


@pytest.mark.interop
def test_golden_matches_reference(server, ref_server):
    """The reference llama.cpp server answers the same bytes, host facts aside."""
    ours, our_facts = golden_session(server.port)
    ref = ref_server("-t", "1", env={**os.environ, "GGML_RPC_NO_RDMA": "1"})
    theirs, their_facts = golden_session(ref.port)
    assert theirs.masked() == ours.masked()
    free, total = their_facts["memory"]
    assert free == total > 0
