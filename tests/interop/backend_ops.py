"""llama.cpp's test-backend-ops run against an RPC server, one op per fresh server.

test-backend-ops (from the reference build) compares every op over many shapes,
types and parameters on a backend with ggml's own CPU backend (NMSE per case). It
only tests registered backends, so `rpc_register.c` is preloaded into it: it adds
each server named in GGMLRPC_SERVERS as backend RPC0, RPC1, ... The shim is compiled
at first use against the reference build's shared ggml libraries.

llama.cpp's client aborts the whole program when a server closes its connection, so
each op runs against its own server process: a refused case ends only that op.

    python -m tests.interop.backend_ops                    # every op, our server and the reference
    python -m tests.interop.backend_ops --ours CONCAT NORM # some ops, our server only
"""
from __future__ import annotations

import argparse
import functools
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
THREADS = 2

# Every op test-backend-ops has cases for, by the name `-o` takes: ggml's ops (unary
# and GLU ops by their own names) and the suite's named compositions (CONV_1D_DW,
# MUL_MAT_HADAMARD, the W4A4/W4A8 products). `test-backend-ops support -b CPU` lists them.
OPS = """
ABS ACC ADD ADD_ID ARANGE ARGMAX ARGSORT CEIL CLAMP COL2IM_1D CONCAT CONT CONV_1D_DW CONV_2D
CONV_2D_DW CONV_3D CONV_TRANSPOSE_1D CONV_TRANSPOSE_2D COS COUNT_EQUAL CPY
CROSS_ENTROPY_LOSS CROSS_ENTROPY_LOSS_BACK CUMSUM DIAG DIAG_MASK_INF DIV DSV4_HC_COMB
DSV4_HC_POST DSV4_HC_PRE DUP ELU EXP EXPM1 FILL FLASH_ATTN_EXT FLOOR GATED_DELTA_NET
GATED_LINEAR_ATTN GEGLU GEGLU_ERF GEGLU_QUICK GELU GELU_ERF GELU_QUICK GET_ROWS
GET_ROWS_BACK GROUP_NORM HARDSIGMOID HARDSWISH IM2COL IM2COL_3D L2_NORM LEAKY_RELU
LIGHTNING_INDEXER LOG MEAN MUL MUL_MAT MUL_MAT_HADAMARD MUL_MAT_ID MUL_MAT_ID_W4A4
MUL_MAT_ID_W4A8 MUL_MAT_W4A4 MUL_MAT_W4A8 NEG NORM OPT_STEP_ADAMW OPT_STEP_SGD OUT_PROD PAD
PAD_REFLECT_1D POOL_1D POOL_2D REGLU RELU REPEAT REPEAT_BACK RMS_NORM RMS_NORM_BACK ROLL
ROPE ROPE_BACK ROUND RWKV_WKV6 RWKV_WKV7 SCALE SET SET_ROWS SGN SIGMOID SILU SILU_BACK SIN
SOFTPLUS SOFT_MAX SOFT_MAX_BACK SOLVE_TRI SQR SQRT SSM_CONV SSM_SCAN STEP SUB SUM SUM_ROWS
SWIGLU SWIGLU_CLAMP SWIGLU_OAI TANH TIMESTEP_EMBEDDING TOP_K TRI TRUNC UPSCALE XIELU
""".split()

# The heaviest ops run a subset of their cases (a `-p` regex over the case's parameter
# string) so that one op stays within a minute or two on two cores. The subsets keep
# every type and the odd shapes; they drop the repeats over batch sizes and head counts.
FILTERS = {
    "FLASH_ATTN_EXT": r"hsk=(64|128),hsv=(64|128),nh=4,nr23=\[[14],1\],kv=(113|512),nb=(1|3|35),.*type_K=(f16|q8_0|q4_0|bf16)",
    # every expert type, one and several routed rows, and 129 columns (ggml's tiled order)
    "MUL_MAT_ID": r"n_mats=4,n_used=(1|2),.*,m=512,n=(1|32|129),k=256",
    "MUL_MAT": r"type_a=[^,]+,type_b=f32,m=16,n=(1|9|16|64)?,k=256,bs=\[1,1\],nr=\[1,1\],per=\[0,1,2,3\],k_v=0,o=1",
    # Hadamard products up to 2048 wide (the 4096..16384 ones alone take minutes)
    "MUL_MAT_HADAMARD": r"m=([0-9]{1,3}|1024|2048),",
    # ROPE: the 2457-row vision and 8192-row cases once each, not for every frequency setting
    "ROPE": r"ne_a=\[(?!36,16,2457|16,16,8192)|fs=1\.000000,ef=0\.000000,af=1\.000000",
    "ROPE_BACK": r"ne_a=\[(?!36,16,2457|16,16,8192)|fs=1\.000000,ef=0\.000000,af=1\.000000",
    "LIGHTNING_INDEXER": r"kv=(?!256,nb=512)",
}


@dataclass
class Result:
    op: str
    passed: int
    total: int          # -1 when the run ended before its summary line
    seconds: float
    output: str
    server_log: str

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.passed == self.total

    def summary(self) -> str:
        if self.total < 0:
            return f"aborted after {self.passed} OK"
        return f"{self.passed}/{self.total}"

    def failures(self, n: int = 3) -> list[str]:
        lines = [ln.strip() for ln in self.output.splitlines() if "FAIL" in ln or "not supported" in ln]
        why = [ln.strip() for ln in self.server_log.splitlines() if "clos" in ln.lower()]
        return lines[:n] + why[:n]


def build_shim(ref_bin: Path, out_dir: Path) -> Path:
    """Compile rpc_register.c against the reference build's shared ggml libraries."""
    if not (ref_bin / "libggml-rpc.so").exists():
        raise FileNotFoundError(f"{ref_bin} has no libggml-rpc.so (ggml built as shared libraries?)")
    so = out_dir / "rpc_register.so"
    lib = str(ref_bin.resolve())
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-o", str(so),
                    str(HERE / "rpc_register.c"), f"-L{lib}", "-lggml-rpc", "-lggml-base", "-lggml",
                    f"-Wl,-rpath,{lib}"], check=True, capture_output=True, text=True)
    return so


_SHIM_DIR = None


@functools.lru_cache(maxsize=None)
def log_flush_shim(ref_bin: Path) -> str | None:
    """The shim built once per run: preloaded with no servers named, it only drains
    llama.cpp's log at exit (a llama tool's log thread is never joined, so a short run
    can exit with nothing printed). None for a build without shared libraries."""
    global _SHIM_DIR
    if not (ref_bin / "libggml-rpc.so").exists():
        return None
    if _SHIM_DIR is None:
        _SHIM_DIR = tempfile.TemporaryDirectory(prefix="ggmlrpc-shim-")
    return str(build_shim(ref_bin, Path(_SHIM_DIR.name)))


def tool_env(ref_bin: Path, **extra: str) -> dict[str, str]:
    """The environment for a reference llama tool: no gdb backtrace on an abort,
    its whole log printed (`log_flush_shim`), and `extra`."""
    env = dict(os.environ, GGML_NO_BACKTRACE="1", **extra)
    env.pop("GGMLRPC_SERVERS", None)
    shim = log_flush_shim(ref_bin)
    if shim:
        env["LD_PRELOAD"] = shim
    return env


SUMMARY = re.compile(r"^\s*(\d+)/(\d+) tests passed", re.M)
CASE_OK = re.compile(r"^  \w+\(.*\): (?:\x1b\[[0-9;]*m)?OK", re.M)


def run_client(shim: Path, server_argv: list[str], argv: list[str], timeout: float) -> tuple[str, float, str]:
    """Start a server (server_argv gets `-p PORT`), run the reference program `argv`
    with the server registered as RPC0, stop the server: (program output, seconds,
    server stderr)."""
    from tests.conftest import Proc, free_port

    port = free_port()
    server = Proc([*server_argv, "-p", str(port)], port)
    # (no gdb backtrace when the client aborts: it costs seconds and says nothing here)
    env = dict(os.environ, GGMLRPC_SERVERS=server.endpoint, LD_PRELOAD=str(shim), GGML_NO_BACKTRACE="1")
    t0 = time.monotonic()
    try:
        out = subprocess.run(argv, capture_output=True, text=True, errors="replace", env=env,
                             timeout=timeout)
        text = out.stdout + out.stderr
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode(errors="replace") + "\n[timed out]"
    seconds = time.monotonic() - t0
    _, err = server.stop()
    return text, seconds, err


def run_op(ref_bin: Path, shim: Path, server_argv: list[str], op: str, timeout: float = 600,
           params: str | None = None) -> Result:
    """Run test-backend-ops -b RPC0 -o op against a fresh server (run_client). `params`
    overrides FILTERS for this op ("" runs every case)."""
    filt = FILTERS.get(op) if params is None else params
    argv = [str(ref_bin / "test-backend-ops"), "-b", "RPC0", "-o", op]
    if filt:
        argv += ["-p", filt]
    text, seconds, err = run_client(shim, server_argv, argv, timeout)
    m = SUMMARY.findall(text)
    if m:
        passed, total = map(int, m[-1])
    else:
        passed, total = len(CASE_OK.findall(text)), -1
    return Result(op, passed, total, seconds, text, err)


def reference_server_argv(ref_bin: Path) -> list[str]:
    return [str(ref_bin / "ggml-rpc-server"), "-t", str(THREADS)]


def our_server_argv() -> list[str]:
    from tests.conftest import our_server_argv as argv
    return argv("-t", str(THREADS))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ops", nargs="*", default=OPS, help="ops to run (default: all)")
    ap.add_argument("-p", dest="params", default=None, help="case filter for every op ('' = all cases)")
    add_side_args(ap)
    args = ap.parse_args(argv)
    return print_table("test-backend-ops", "op", args.ops, args,
                       lambda ref_bin, shim, server, op: run_op(ref_bin, shim, server, op, args.timeout, args.params))


def add_side_args(ap: argparse.ArgumentParser) -> None:
    """--ours / --reference (which servers to run; default both) and --timeout."""
    side = ap.add_mutually_exclusive_group()
    side.add_argument("--ours", action="store_true", help="only our server")
    side.add_argument("--reference", action="store_true", help="only the reference server")
    ap.add_argument("--timeout", type=float, default=600)


def shim_or_skip(ref_bin: Path, tool: str, tmp_path_factory) -> Path:
    """The LD_PRELOAD library, compiled against the reference build's shared libraries
    (a test's skip where the build has no `tool` or no shared ggml libraries)."""
    import pytest
    if not (ref_bin / tool).exists() or not (ref_bin / "libggml-rpc.so").exists():
        pytest.skip(f"{ref_bin} has no {tool} or shared ggml libraries (an older reference build)")
    return build_shim(ref_bin, tmp_path_factory.mktemp("shim"))


def assert_passes(name: str, r: Result, expected: int, output: str) -> None:
    """Every case of r passed, and as many ran as through the reference server."""
    why = "\n".join(r.failures())
    assert r.total > 0, f"{name}: {r.summary()}\n{why}\n{output[-2000:]}"
    assert r.passed == r.total, f"{name}: {r.summary()}\n{why}"
    assert r.total == expected, f"{name}: {r.total} cases, the reference server ran {expected}"


def print_table(tool: str, what: str, names: list[str], args, run) -> int:
    """Run `run(ref_bin, shim, server_argv, name)` for each name on the sides args
    selects (--ours, --reference, default both) and print a markdown table of the
    results, the failures' lines on stderr; 1 if any failed, 2 without a reference
    build that has `tool`."""
    from tests.conftest import reference_bin
    ref_bin = reference_bin()
    if ref_bin is None or not (ref_bin / tool).exists():
        print(f"no reference build with {tool} (scripts/build-reference.sh)", file=sys.stderr)
        return 2
    sides = {"ours": our_server_argv(), "reference": reference_server_argv(ref_bin)}
    if args.ours:
        del sides["reference"]
    if args.reference:
        del sides["ours"]
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        shim = build_shim(ref_bin, Path(tmp))
        print(f"| {what} | " + " | ".join(sides) + " |", flush=True)
        for name in names:
            cells = []
            for side, server in sides.items():
                r = run(ref_bin, shim, server, name)
                cells.append(f"{r.summary()} ({r.seconds:.0f}s)")
                if not r.ok:
                    bad += 1
                    for ln in r.failures():
                        print(f"  {side}: {ln}", file=sys.stderr)
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
