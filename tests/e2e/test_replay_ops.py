"""Op sessions recorded on a reference ggml-rpc-server built for one kernel family
(tests/data/op-traces/<family>/, written by scripts/record_op_traces.py from the cases
of tests/interop/test_ops_vs_reference.py) replayed against our server running that
family: every result read back must be the recorded bytes, on any x86-64 host or
none. The AVX2 sessions come from ggml built for AVX2/FMA/F16C without AVX-512
(GGMLRPC_REFERENCE_CPU=avx2 scripts/build-reference.sh): BF16 and F16 prompts through
tinyBLAS, decode four weight rows at a time, the Q4/Q5/Q8/IQ4_NL panels, the K-quant
panels, MUL_MAT_ID, attention, the ops on the family's vector primitives and the
scalar loops GCC compiles by the CPU it tunes for; x86-avx2-zen/ holds the latter
from the same sources built with -march=znver3 (a native build on Zen 3), whose
tuning keeps their multiply-add chains unfused. They are replayed with this CPU's
SIMD kernels, with the AVX2 quant kernels (what an AVX2 CPU runs) and with the
portable ones.
"""
from __future__ import annotations

import os
import re

import pytest

from ggmlrpc import protocol
from ggmlrpc.devices.cpu import CpuDevice
from ggmlrpc.protocol import Cmd
from ggmlrpc.server import Server
from ggmlrpc.trace import Replayer, load_connection
from tests.conftest import DATA

OP_TRACES = DATA / "op-traces"
SESSIONS = sorted((d.name, p.stem) for d in OP_TRACES.iterdir() if d.is_dir() for p in d.glob("*.trc"))


@pytest.fixture(scope="module")
def endpoint():
    """Our server, one CPU device of three threads (rows split unevenly)."""
    srv = Server([CpuDevice(3)], "127.0.0.1", 0, codec=protocol.codec("native"), out=open(os.devnull, "w"))
    srv.start()
    yield f"127.0.0.1:{srv.port}"
    srv.close()


@pytest.fixture(params=["simd", "avx2-quants", "portable"])
def kernels(request):
    """This CPU's SIMD kernels; with its AVX2 quant kernels (not the AVX-512 VNNI
    ones); the portable primitives (with the AVX2 quant kernels: the quant kernels'
    portable level sums in ggml's generic order, which no x86 build has). Returns the
    quant level in use."""
    from ggmlrpc._native import executor, quants
    old_simd, old_level = executor.set_simd(request.param != "portable"), quants.simd(-1)
    level = quants.simd(old_level if request.param == "simd" else 1)
    if request.param == "avx2-quants" and level < 1:
        pytest.skip("this CPU has no AVX2")
    yield level
    executor.set_simd(bool(old_simd))
    quants.simd(old_level)


def quantized(case: str) -> bool:
    return re.search(r"(?i)\b(i?q\d|tq\d|mxfp4)", case.replace("-", " ").replace("_", " _")) is not None


def replay(endpoint: str, family: str, case: str):
    from ggmlrpc._native import executor
    trace = load_connection(OP_TRACES / family / f"{case}.trc")
    old = executor.set_kernel_family(family)
    try:
        # an NMSE bound of 1e-30 admits only the recorded floats
        result = Replayer(endpoint, timeout=60, max_nmse=1e-30, tie=0.0).replay(trace)
    finally:
        executor.set_kernel_family(old)
    assert result.sent == len(trace.exchanges)
    assert any(e.cmd == Cmd.GRAPH_COMPUTE for e in trace.exchanges)
    assert sum(e.cmd == Cmd.GET_TENSOR for e in trace.exchanges) > 0
    return result


def test_sessions_present():
    assert len([s for s in SESSIONS if s[0] == "x86-avx2"]) >= 100
    assert len([s for s in SESSIONS if s[0] == "x86-avx2-zen"]) >= 10


@pytest.mark.parametrize("family, case", SESSIONS, ids=[f"{f}-{c}" for f, c in SESSIONS])
def test_recorded_results_bit_for_bit(endpoint, kernels, family, case):
    if kernels == 0 and quantized(case):
        pytest.skip("no SIMD quant kernels on this CPU: the portable ones sum in ggml's generic order")
    result = replay(endpoint, family, case)
    assert not result.differences, "\n".join(map(str, result.differences))


@pytest.mark.parametrize("recorded, ours, case", [
    ("x86-avx2", "x86-avx512", "mul_mat-bf16-k96"), ("x86-avx2", "x86-avx512", "mul_mat-f32-gemm"),
    ("x86-avx2", "x86-avx512", "soft_max-f32"), ("x86-avx2", "x86-avx2-zen", "solve_tri"),
    ("x86-avx2-zen", "x86-avx2", "dsv4_hc_pre"), ("x86-avx2-zen", "x86-avx2", "mul_mat-Q2_0-3blocks-n1")])
def test_another_family_differs(endpoint, recorded, ours, case):
    """The check can fail: sessions replayed with the orders of another family, or
    of the same family under the other tuning, do not give the recorded bytes."""
    from ggmlrpc._native import executor
    old = executor.set_kernel_family(ours)
    try:
        result = Replayer(endpoint, timeout=60, max_nmse=1e-30, tie=0.0).replay(
            load_connection(OP_TRACES / recorded / f"{case}.trc"))
    finally:
        executor.set_kernel_family(old)
    assert [d.command for d in result.differences] == ["GET_TENSOR"]
