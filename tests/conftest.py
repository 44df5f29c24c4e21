"""Shared fixtures: our server in-process or as a command, the reference llama.cpp peer."""
from __future__ import annotations

import ctypes
import functools
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
# recorded llama.cpp sessions and the small models they ran (tests/data/README.md)
DATA = REPO / "tests" / "data"
TRACES = DATA / "traces"
MODELS = DATA / "models"


def pytest_sessionstart(session):
    """GGMLRPC_KERNELS applies to the servers the tests start in this process as
    `ggml-rpc-server` applies it: with it and an AVX2 reference build
    (GGMLRPC_REFERENCE_CPU=avx2 scripts/build-reference.sh, then GGMLRPC_REFERENCE_BIN)
    the byte tests check the AVX2 family on any x86-64 host."""
    if os.environ.get("GGMLRPC_KERNELS"):
        from ggmlrpc.compute.cpu import select_kernel_family
        select_kernel_family()


def nmse(ours, ref) -> float:
    """Normalized mean squared error as test-backend-ops judges results (the plain
    squared error where the reference is all zeros)."""
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    den = float(np.sum(ref * ref))
    num = float(np.sum((ours - ref) ** 2))
    return num / den if den else num


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 20.0) -> None:
    """Wait until something listens on 127.0.0.1:port (without connecting to it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                local, state = parts[1], parts[3]
                if state == "0A" and int(local.split(":")[1], 16) == port:
                    return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port}")


@pytest.fixture
def seed(request):
    """A seed for random tests, printed so a failure can be replayed (GGMLRPC_SEED)."""
    s = int(os.environ.get("GGMLRPC_SEED", random.randrange(1 << 31)))
    print(f"\n[seed] {request.node.nodeid}: GGMLRPC_SEED={s}")
    return s


@pytest.fixture(params=["native", "python"])
def codec_name(request):
    return request.param


def start_server(codec_name="native", cache_dir=None, n_devices=1, limits=None, cache=None):
    from ggmlrpc import protocol
    from ggmlrpc.devices.cpu import CpuDevice
    from ggmlrpc.server import Server

    devices = [CpuDevice(1) for _ in range(n_devices)]
    srv = Server(devices, "127.0.0.1", 0, cache_dir=cache_dir, codec=protocol.codec(codec_name),
                 out=open(os.devnull, "w"), limits=limits, cache=cache)
    srv.start()
    return srv


@pytest.fixture
def server(codec_name):
    """Our server in this process on a free port, with the codec under test."""
    srv = start_server(codec_name)
    yield srv
    srv.close()


@pytest.fixture
def endpoint(server):
    return f"127.0.0.1:{server.port}"


class Proc:
    """A server process. Its stdout and stderr are drained as they come (a chatty
    server, GGML_RPC_DEBUG on, would otherwise block on a full pipe)."""

    def __init__(self, argv, port, env=None, timeout: float = 20.0):
        self.port = port
        self.endpoint = f"127.0.0.1:{port}"
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, errors="replace", env=env)
        self._out: list[str] = []
        self._err: list[str] = []
        self._readers = [threading.Thread(target=lambda f=f, acc=acc: acc.extend(f), daemon=True)
                         for f, acc in ((self.proc.stdout, self._out), (self.proc.stderr, self._err))]
        for t in self._readers:
            t.start()
        wait_port(port, self.proc, timeout)

    def output(self) -> tuple[str, str]:
        """(stdout, stderr) read so far, while the process runs."""
        return "".join(self._out), "".join(self._err)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for t in self._readers:
            t.join(10)
        return self.output()


def our_server_argv(*args):
    exe = shutil.which("ggml-rpc-server")
    if exe and os.environ.get("GGMLRPC_USE_MODULE") is None:
        return [exe, *args]
    return [sys.executable, "-P", "-m", "ggmlrpc.cli.server", *args]


def server_procs(n: int, *args):
    """n of our servers as processes (a generator for a fixture): yields their
    endpoints joined by commas (--rpc's form), stops them after."""
    procs = []
    for _ in range(n):
        port = free_port()
        procs.append(Proc(our_server_argv("-p", str(port), *args), port))
    yield ",".join(p.endpoint for p in procs)
    for p in procs:
        p.stop()


@pytest.fixture
def server_proc():
    """Factory: our `ggml-rpc-server` as a separate process."""
    procs = []

    def start(*args, env=None):
        port = free_port()
        p = Proc(our_server_argv("-p", str(port), *args), port, env=env)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()


@functools.lru_cache(maxsize=None)
def reference_bin() -> Path | None:
    """The reference build's bin directory if it is complete (GGMLRPC_REFERENCE_BIN, or
    scripts/build-reference.sh's cache for this CPU), else None. Never builds."""
    env = os.environ.get("GGMLRPC_REFERENCE_BIN")
    if env:
        return Path(env)
    out = subprocess.run(["bash", str(REPO / "scripts" / "build-reference.sh"), "--where"],
                         capture_output=True, text=True)
    return Path(out.stdout.strip()) if out.returncode == 0 else None


@pytest.fixture(scope="session")
def ref_bin():
    """The reference llama.cpp build. Built once by scripts/build-reference.sh into a cache
    outside the repo (20-25 minutes on 2 cores the first time) unless
    GGMLRPC_SKIP_REFERENCE is set, in which case the interop tests skip."""
    d = reference_bin()
    if d is None:
        if os.environ.get("GGMLRPC_SKIP_REFERENCE"):
            pytest.skip("reference build missing and GGMLRPC_SKIP_REFERENCE set")
        out = subprocess.run(["bash", str(REPO / "scripts" / "build-reference.sh")],
                             check=True, capture_output=True, text=True).stdout
        d = Path(out.strip().splitlines()[-1])
    return d


def host_cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


@functools.lru_cache(maxsize=None)
def reference_kernel_family(bin_dir: Path) -> str:
    """The kernel family ggml was compiled with in the reference build, asked from its CPU
    library (ggml_cpu_has_*, compile-time facts), in our executor's names: "x86-avx2"
    (AVX2 + FMA + F16C), "x86-avx512" (512-bit vector ops, other summation orders),
    "x86-avx512-bf16" (also VDPBF16PS for BF16), "x86-avx512-fp16" (also F16 vector
    arithmetic in half precision; ggml does not report AVX512-FP16, so a native AVX-512
    build on a CPU that has it is taken to use it), each with "-zen" where GCC tuned the
    build for AMD Zen (reference_zen_tuned), or "other"."""
    has = {n: reference_has(bin_dir, n) for n in ("avx512", "avx512_bf16", "avx2", "fma", "f16c")}
    zen = "-zen" if reference_zen_tuned(bin_dir) else ""
    if has["avx512"]:
        if not has["avx512_bf16"]:
            return "x86-avx512" + zen
        return ("x86-avx512-fp16" if "avx512_fp16" in host_cpu_flags() else "x86-avx512-bf16") + zen
    if has["avx2"] and has["fma"] and has["f16c"]:
        return "x86-avx2" + zen
    return "other"


@functools.lru_cache(maxsize=None)
def reference_zen_tuned(bin_dir: Path) -> bool:
    """Whether GCC tuned the reference build for AMD Zen (-march=native on such a CPU, or
    -march=znver* in its flags): Zen tunings keep the multiply-add chains of a few scalar
    loops unfused where generic and Intel tunings fuse them (read from its CMake cache;
    unknown: False)."""
    try:
        cache = (bin_dir.parent / "CMakeCache.txt").read_text(errors="replace")
    except OSError:
        return False
    flags = " ".join(line.split("=", 1)[1] for line in cache.splitlines()
                     if line.startswith(("CMAKE_C_FLAGS:", "CMAKE_CXX_FLAGS:")))
    if "-march=znver" in flags or "-mtune=znver" in flags:
        return True
    native = "GGML_NATIVE:BOOL=ON" in cache
    try:
        with open("/proc/cpuinfo") as f:
            amd = any(line.startswith("vendor_id") and "AuthenticAMD" in line for line in f)
    except OSError:
        amd = False
    return native and amd


def reference_has(bin_dir: Path, feature: str) -> bool:
    """ggml_cpu_has_<feature>() of the reference build's CPU library."""
    lib = next(iter(sorted(bin_dir.glob("libggml-cpu.so*"))), None)
    return bool(lib and getattr(ctypes.CDLL(str(lib)), f"ggml_cpu_has_{feature}")())


# Families whose bit-for-bit claim has been checked against a reference build for them
# (the loops that follow GCC's code generation can depend on the CPU it tuned for):
# AVX2 against GCC 12 builds for generic x86-64 with AVX2 (what GGML_NATIVE=OFF and
# Intel-tuned builds compile) and for Zen 3 (-march=znver3), AVX-512 with FP16 on
# Sapphire Rapids. A family not listed here gets the error bounds, not byte equality,
# until a session on such a host has run the byte tests and added it.
VERIFIED_FAMILIES = {"x86-avx2", "x86-avx2-zen", "x86-avx512-fp16"}


@pytest.fixture(scope="session")
def bit_exact(ref_bin) -> bool:
    """Whether our executor reproduces, bit for bit, the kernels ggml picked in the
    reference build on this host (its kernel family, portable twins included). Where it
    does, tests assert byte equality with the reference; elsewhere they assert
    test-backend-ops-style error bounds (and greedy text only where a recorded session
    from a reproduced family says what it must be)."""
    from ggmlrpc._native import executor

    family, ours = reference_kernel_family(ref_bin), executor.kernel_family()
    print(f"\n[kernels] reference: {family}, ours: {ours}")
    return family == ours and family in VERIFIED_FAMILIES


@pytest.fixture
def ref_server(ref_bin):
    """Factory: the reference ggml-rpc-server (serves one client at a time)."""
    procs = []

    def start(*args, env=None):
        port = free_port()
        p = Proc([str(ref_bin / "ggml-rpc-server"), "-p", str(port), *args], port, env=env)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()


@pytest.fixture
def ref_llama_server(ref_bin):
    """Factory: the reference llama-server on `model` with llama-server's `args`,
    ready (its /health answers 200); an object with .port, .url, .output(), .close()."""
    import urllib.error
    import urllib.request

    procs = []

    def start(model, *args, env=None):
        port = free_port()
        p = Proc([str(ref_bin / "llama-server"), "-m", str(model), "--port", str(port), *args], port,
                 env=dict(os.environ, GGML_NO_BACKTRACE="1") if env is None else env)
        p.url = f"http://127.0.0.1:{port}"
        p.close = p.stop
        procs.append(p)
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(p.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return p
            except (urllib.error.URLError, OSError):
                pass
            if p.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"llama-server did not come up: {p.output()[1][-2000:]}")
            time.sleep(0.1)

    yield start
    for p in procs:
        p.stop()
