"""Shared fixtures: our server in-process or as a command, the reference llama.cpp peer."""
from __future__ import annotations

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

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("GGMLRPC_SHARED", REPO.parent / "shared"))
TRACES = SHARED / "traces"
MODELS = SHARED / "models"


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

    def __init__(self, argv, port, env=None):
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
        wait_port(port, self.proc)

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
    return [sys.executable, "-m", "ggmlrpc.cli.server", *args]


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
