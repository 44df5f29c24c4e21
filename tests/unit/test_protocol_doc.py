"""docs/protocol.md against the code: its tables and the limits it states are read
back from the text and compared with ggmlrpc.protocol and ggmlrpc.ggml, so that the
document cannot fall behind a change of the wire format."""
from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from ggmlrpc import ggml, protocol
from ggmlrpc.compute import work
from ggmlrpc.protocol import Cmd, RpcTensor

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text()


@pytest.fixture(scope="module")
def prose(doc) -> str:
    """The document with every run of whitespace one space (line breaks move)."""
    return " ".join(doc.split())


def section(text: str, title: str) -> str:
    """The text under a `## title` heading, up to the next heading of that level."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def table_rows(text: str, columns: int) -> list[list[str]]:
    """The body rows of the markdown tables in text that have `columns` cells."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == columns and not set(line) <= set("|-: "):
            rows.append(cells)
    return rows


def test_command_table_matches_the_code(doc):
    rows = table_rows(section(doc, "Commands"), 4)
    assert rows[0] == ["id", "command", "request", "response"]
    table = {name: (int(cid), req, rsp) for cid, name, req, rsp in rows[1:]}
    assert set(table) == {c.name for c in Cmd}, "every command of protocol.Cmd, and no other"
    for c in Cmd:
        cid, req, rsp = table[c.name]
        assert cid == c, c.name
        want_req = protocol.REQUEST_SIZE[c]
        assert req == ("var" if want_req is None else str(want_req)), c.name
        want_rsp = protocol.RESPONSE_SIZE[c]
        assert rsp == {None: "-", -1: "var"}.get(want_rsp, str(want_rsp)), c.name


def test_every_command_has_a_layout(doc):
    """Each command is drawn in a layout block as `NAME (id)`."""
    for c in Cmd:
        assert re.search(rf"^    {c.name} \({int(c)}\)", doc, re.M) or c == Cmd.HELLO, c.name
    assert "0 cmd u8 = 14 | 1 size u64 = 24 | 9 conn_caps[24]" in doc


def test_rpc_tensor_table_matches_the_struct(doc):
    rows = table_rows(section(doc, "rpc_tensor (296 bytes)"), 4)[1:]
    assert [r[1] for r in rows] == [f.name for f in fields(RpcTensor) if f.name != "nbytes"]
    sizes = {"u8": 1, "char": 1, "i32": 4, "u32": 4, "u64": 8}
    offset = 0
    for off, name, typ, _ in rows:
        assert int(off) == offset, name
        m = re.fullmatch(r"(\w+?)(?:\[(\d+)\])?", typ)
        offset += sizes[m.group(1)] * int(m.group(2) or 1)
    assert offset == protocol.TENSOR_SIZE == protocol.TENSOR_STRUCT.size


def test_type_table_matches_ggml(doc):
    cells = [c for r in table_rows(section(doc, "Tensor types"), 9)[1:] for c in (r[:4], r[5:])]
    listed = {int(i): (name, int(b), int(n)) for i, name, b, n in cells if i}
    want = {int(t): (ggml.type_name(t), *ggml.TYPE_TRAITS[t]) for t in ggml.TYPE_TRAITS}
    assert listed == want
    removed = re.search(r"\(([\d,\s]+)\) are removed types", doc).group(1)
    assert {int(x) for x in removed.split(",")} == set(range(ggml.TYPE_COUNT)) - set(want)


def test_stated_numbers_come_from_the_code(prose):
    v = f"{protocol.PROTO_MAJOR}.{protocol.PROTO_MINOR}.{protocol.PROTO_PATCH}"
    assert f"version **{v}**" in prose
    assert f"answers `{protocol.PROTO_MAJOR}, {protocol.PROTO_MINOR}, {protocol.PROTO_PATCH}`" in prose
    for n in (protocol.MAX_GRAPH_NODES, protocol.MAX_GRAPH_TENSORS, protocol.MAX_GRAPH_PAYLOAD,
              protocol.HASH_THRESHOLD, work.DEFAULT_PER_BYTE):
        assert f"{n:,}" in prose, n
    assert f"2^{work.FLOOR.bit_length() - 1} units" in prose
    assert f"`{protocol.FNV_OFFSET:#x}`" in prose and f"`{protocol.FNV_PRIME:#x}`" in prose
    answered = sum(1 for c in Cmd if protocol.RESPONSE_SIZE[c] is not None)
    assert f"Only {answered} of the {protocol.CMD_COUNT} commands have a response" in prose
    assert f"SET_TENSOR reads its {protocol.SET_TENSOR_HEADER_SIZE}-byte header" in prose
    assert f"a {protocol.HEADER.size}-byte header" in prose and f"an {protocol.SIZE.size}-byte size" in prose


def test_stated_server_facts_come_from_the_code(prose):
    from ggmlrpc import server
    from ggmlrpc.devices import cpu, cuda
    limits = server.Limits()
    assert f"`--max-buffers` buffers ({limits.max_buffers})" in prose
    assert f"`--hello-timeout` seconds ({limits.hello_timeout:g} by default)" in prose
    assert f"alignment {cpu.CPU_ALIGNMENT} on CPU, {cuda.CUDA_ALIGNMENT} on CUDA" in prose
    assert cpu.SIZE_MAX == cuda.SIZE_MAX == 2**64 - 1 and "max size 2^64 - 1" in prose
    assert f"not a multiple of {cuda.MATRIX_ROW_PADDING} gets room" in prose
    mib = server.BASE_GAP >> 20
    assert server.BASE_START % server.BASE_GAP == 0
    assert f"bases are multiples of {mib} MiB with a gap of at least {mib} MiB" in prose
