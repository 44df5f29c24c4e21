"""The native modules share one copy of the C core (libggmlrpc_core beside them):
state the core keeps, such as the level of the quant kernels, is the same whichever
module sets or reads it."""
from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

quants = pytest.importorskip("ggmlrpc._native.quants")
executor = pytest.importorskip("ggmlrpc._native.executor")


def test_quant_level_is_one_state():
    """quants.simd() sets the level in the one core library this process has loaded,
    the copy the executor (imported above) reads too."""
    mapped = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
              if line.endswith("libggmlrpc_core.so")}
    assert mapped == {str(Path(quants.__file__).with_name("libggmlrpc_core.so").resolve())}
    core = ctypes.CDLL(mapped.pop())
    top = quants.simd()
    try:
        for level in range(top + 1):  # the levels this CPU has, whichever it is
            assert quants.simd(level) == level
            assert core.ggmlrpc_quants_simd(-1) == level
            assert core.ggmlrpc_quants_simd(top) == top
            assert quants.simd() == top
    finally:
        quants.simd(top)


def test_command_table_is_the_c_table():
    """protocol's tables are the rows of commands.def, as the C server code reads them."""
    from ggmlrpc import protocol
    from ggmlrpc._native import commands

    assert [(c.name, int(c)) for c in protocol.Cmd] == [(n, i) for n, i, _, _ in commands.COMMANDS]
    for name, cid, req, rsp in commands.COMMANDS:
        assert protocol.REQUEST_SIZE[cid] == (None if req == commands.SIZE_VAR else req), name
        want = {commands.SIZE_NONE: None, commands.SIZE_VAR: -1}.get(rsp, rsp)
        assert protocol.RESPONSE_SIZE[cid] == want, name
