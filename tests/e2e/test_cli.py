"""`ggml-rpc-server`: banner, options, errors, signals and logs, against llama.cpp's.

The reference binary runs with the same arguments (and port) wherever that is
cheap; what it prints is the contract. It fully buffers stdout into a pipe, so a
client connection (which makes it flush) comes before its banner is read.
"""
from __future__ import annotations

import collections
import os
import re
import signal
import struct
import subprocess
import time

import numpy as np
import pytest

from ggmlrpc import protocol
from ggmlrpc.client import RemoteBackend
from ggmlrpc.errors import ConnectionLost
from ggmlrpc.ggml import GGMLType
from ggmlrpc.protocol import Cmd
from tests.conftest import Proc, free_port, our_server_argv

CLOSED = "Client connection closed"


def wait_for(proc: Proc, needle: str, count: int = 1, timeout: float = 15.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        out, _ = proc.output()
        if out.count(needle) >= count or time.monotonic() > deadline:
            return out
        time.sleep(0.02)


def one_connection(argv, port, env=None) -> tuple[str, str]:
    """Start, connect one client and close it, stop: (stdout, stderr)."""
    p = Proc(argv, port, env=env)
    try:
        RemoteBackend(p.endpoint).close()
        wait_for(p, CLOSED)
    finally:
        out, err = p.stop()
    return out, err


def run(argv, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def env_without(*names, **values) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in names}
    env.update(values)
    return env


QUIET = env_without("GGML_RPC_DEBUG", "LLAMA_CACHE")


# -- banner -------------------------------------------------------------------------------

@pytest.mark.interop
@pytest.mark.parametrize("args", [(), ("-t", "1", "-d", "CPU"), ("-c",), ("-H", "0.0.0.0")],
                         ids=["default", "threads-device", "cache", "any-host"])
def test_banner_matches_reference(ref_bin, tmp_path, args):
    env = dict(QUIET, LLAMA_CACHE=str(tmp_path))
    port = free_port()
    ref_out, ref_err = one_connection([str(ref_bin / "ggml-rpc-server"), "-p", str(port), *args],
                                      port, env)
    our_out, our_err = one_connection(our_server_argv("-p", str(port), *args), port, env)
    assert our_out.splitlines() == ref_out.splitlines()
    assert ref_out.splitlines()[:2] == ["Starting RPC server v7.0.0",
                                        f"  endpoint       : {args[1] if args[:1] == ('-H',) else '127.0.0.1'}:{port}"]
    assert ref_out.splitlines()[-2:] == ["Accepted client connection", CLOSED]
    if args[:1] == ("-H",):
        # the loud warning, on stderr, exactly as llama.cpp prints it
        assert "WARNING: Host ('0.0.0.0') is != '127.0.0.1'" in ref_err
        assert our_err == ref_err
    else:
        assert "WARNING" not in our_err


def test_banner_shape(server_proc):
    p = server_proc("-d", "CPU", env=QUIET)
    lines = wait_for(p, "transport").splitlines()
    assert lines[:4] == ["Starting RPC server v7.0.0", f"  endpoint       : {p.endpoint}",
                         "  local cache    : n/a", "Devices:"]
    assert re.fullmatch(r"  CPU: .+ \(\d+ MiB, \d+ MiB free\)", lines[4])
    assert lines[5] == "  transport      : TCP"
    with RemoteBackend(p.endpoint) as rb:
        assert rb.device_count() == 1
        assert rb.get_alignment() == 32


# -- options and errors ----------------------------------------------------------------------

def usage_body(text: str) -> list[str]:
    """The usage text without the program name of its first line."""
    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("Usage: "))
    return [re.sub(r"^Usage: \S+", "Usage: PROG", lines[i])] + lines[i + 1:]


def same_usage(ours: str, ref: str) -> None:
    """llama.cpp's usage word for word, then a section of our own options after it."""
    body, ref_body = usage_body(ours), usage_body(ref)
    assert body[:len(ref_body)] == ref_body
    assert body[len(ref_body) - 1] == "" and body[len(ref_body)].startswith("ggmlrpc options")
    assert any(line.lstrip().startswith("--metrics") for line in body[len(ref_body):])


@pytest.mark.interop
def test_help(ref_bin):
    ours = run(our_server_argv("-h"), QUIET)
    assert ours.returncode == 0 and ours.stdout == ""
    body = usage_body(ours.stderr)
    assert body[0] == "Usage: PROG [options]"
    for opt in ("-h, --help", "-t, --threads N", "-d, --device", "-H, --host HOST", "-p, --port PORT",
                "-c, --cache"):
        assert any(line.lstrip().startswith(opt) for line in body), opt
    ref = run([str(ref_bin / "ggml-rpc-server"), "--help"], QUIET)
    assert ref.returncode == 0
    same_usage(ours.stderr, ref.stderr)


@pytest.mark.interop
def test_unknown_argument_prints_usage(ref_bin):
    ours = run(our_server_argv("--bogus"), QUIET)
    assert "error: unknown argument: --bogus" in ours.stderr.splitlines()
    ref = run([str(ref_bin / "ggml-rpc-server"), "--bogus"], QUIET)
    same_usage(ours.stderr, ref.stderr)
    # llama.cpp exits 0 here; a typo in a supervisor's command line must not look
    # like success, so ours says so with 1
    assert ours.returncode == 1


@pytest.mark.interop
@pytest.mark.parametrize("args", [("-t", "0"), ("-p", "0"), ("-p", "70000"), ("-p",), ("-t",),
                                  ("-d", "NOPE"), ("-d", "CPU,NOPE")])
def test_rejected_like_reference(ref_bin, args):
    """Same exit status as llama.cpp, and every line it prints, ours prints too."""
    ours = run(our_server_argv(*args), QUIET)
    ref = run([str(ref_bin / "ggml-rpc-server"), *args], QUIET)
    assert ours.returncode == ref.returncode == 1
    assert "Starting RPC server" not in ours.stdout
    our_lines = set((ours.stdout + ours.stderr).splitlines())
    missing = [line for line in (ref.stdout + ref.stderr).splitlines() if line not in our_lines]
    assert not missing, ours.stderr


def test_unknown_device_lists_devices():
    r = run(our_server_argv("-d", "NOPE"), QUIET)
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert lines[:2] == ["error: unknown device: NOPE", "available devices:"]
    assert re.fullmatch(r"  CPU: .+ \(\d+ MiB, \d+ MiB free\)", lines[2])
    assert lines[-1] == "No devices found"


@pytest.mark.parametrize("args", [("-t", "x"), ("-p", "abc"), ("-H", "localhost"), ("-H", "1.2.3"),
                                  ("-H", "::1")])
def test_rejected_values(args):
    """llama.cpp aborts on non-numeric numbers and cannot bind a host name; ours refuses
    them before starting, with exit status 1."""
    r = run(our_server_argv("-p", str(free_port()), *args), QUIET)
    assert r.returncode == 1
    assert args[1] in r.stderr
    assert "Starting RPC server" not in r.stdout
    if args[0] == "-H":
        assert f"WARNING: Host ('{args[1]}') is != '127.0.0.1'" in r.stderr


def test_unknown_kernel_family_refused():
    r = run(our_server_argv("-p", str(free_port())), dict(QUIET, GGMLRPC_KERNELS="x86-avx3"))
    assert r.returncode == 1
    assert "GGMLRPC_KERNELS" in r.stderr and "x86-avx3" in r.stderr and "x86-avx2" in r.stderr
    assert "Starting RPC server" not in r.stdout


@pytest.mark.parametrize("family", ["x86-avx2", "x86-avx2-zen"])
def test_kernel_family_from_environment(server_proc, family):
    """GGMLRPC_KERNELS picks the ggml build the executor reproduces (said at debug level)."""
    p = server_proc(env=dict(os.environ, GGMLRPC_KERNELS=family, GGML_RPC_DEBUG="1"))
    with RemoteBackend(p.endpoint) as rb:
        assert rb.device_count() == 1
    p.stop()
    assert f"CPU kernels reproduce ggml's {family} build" in p.output()[1]


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
def test_threads_run_as_a_batch_job_unless_told(server_proc):
    """Every thread of the server, its connections' and compute threads too, runs under
    SCHED_BATCH (a woken one does not preempt another program's thread: a host on the
    same machine keeps its turn); --sched-normal keeps the default policy."""
    def policies(p) -> set[int]:
        with RemoteBackend(p.endpoint) as rb:     # a connection's thread, and a graph computed
            buf = rb.alloc_buffer(1 << 16)
            t = buf.tensor(GGMLType.F32, (64,), 0)
            rb.set_tensor(t, np.arange(64, dtype=np.float32))
            assert rb.device_count() == 1
            tids = os.listdir(f"/proc/{p.proc.pid}/task")
            return {os.sched_getscheduler(int(tid)) for tid in tids}
    assert policies(server_proc()) == {os.SCHED_BATCH}
    assert policies(server_proc("--sched-normal")) == {os.SCHED_OTHER}


def test_any_host_warning_on_stderr(server_proc):
    p = server_proc("-H", "0.0.0.0", env=QUIET)
    out = wait_for(p, "transport")
    assert f"  endpoint       : 0.0.0.0:{p.port}" in out.splitlines()
    _, err = p.output()
    assert "!" * 59 in err and "WARNING: Host ('0.0.0.0') is != '127.0.0.1'" in err
    assert "Never expose the RPC server to an open network!" in err
    assert "WARNING" not in out


# -- signals ----------------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_shuts_down_cleanly(server_proc, sig):
    p = server_proc(env=QUIET)
    rb = RemoteBackend(p.endpoint, timeout=10)
    buf = rb.alloc_buffer(1 << 20)
    x = buf.tensor(GGMLType.F32, (1024,))
    rb.set_tensor(x, np.ones(1024, dtype=np.float32))
    # a second client stalls in the middle of a SET_TENSOR
    stalled = RemoteBackend(p.endpoint, timeout=10)
    t = stalled.alloc_buffer(1 << 20).tensor(GGMLType.I8, (1 << 20,))
    head = protocol.encode_tensor(t.to_rpc()) + struct.pack("<BQ", 0, 0)
    stalled.conn.send(protocol.HEADER.pack(Cmd.SET_TENSOR, len(head) + (1 << 20)) + head, bytes(1000))
    wait_for(p, "Accepted client connection", count=2)
    p.proc.send_signal(sig)
    assert p.proc.wait(timeout=20) == 0
    with pytest.raises(ConnectionLost):
        rb.get_tensor(x)
    out, err = p.stop()
    assert out.count(CLOSED) == 2
    assert "Traceback" not in err


# -- logs -------------------------------------------------------------------------------------

def exercise(rb: RemoteBackend) -> collections.Counter:
    """One of each command that needs no graph; the commands sent, by debug tag."""
    sent = collections.Counter()

    def did(*tags):
        sent.update(tags)

    did("hello")  # RemoteBackend's connect
    rb.device_count(); did("device_count")
    rb.get_alignment(); did("get_alignment")
    rb.get_max_size(); did("get_max_size")
    rb.get_device_memory(); did("get_device_memory")
    a = rb.alloc_buffer(8192); did("alloc_buffer", "buffer_get_base")
    b = rb.alloc_buffer(8192); did("alloc_buffer", "buffer_get_base")
    x = a.tensor(GGMLType.F32, (1024,))
    y = b.tensor(GGMLType.F32, (1024,))
    q = a.tensor(GGMLType.Q8_0, (96,), offset=4096)
    rb.set_tensor(x, np.arange(1024, dtype=np.float32)); did("set_tensor")
    rb.memset_tensor(y, 0, 0, 64); did("memset_tensor")
    assert rb.copy_tensor(x, y); did("copy_tensor")
    assert np.array_equal(rb.get_array(y), np.arange(1024, dtype=np.float32)); did("get_tensor")
    rb.init_tensor(q); did("init_tensor")
    assert rb.get_alloc_size(q) == q.nbytes; did("get_alloc_size")
    assert rb.set_tensor_hash(x, 12345) is False; did("set_tensor_hash")
    b.clear(1); did("buffer_clear")
    b.free(); did("free_buffer")
    rb.device_count(); did("device_count")  # everything before it was processed
    return sent


def debug_tags(err: str) -> collections.Counter:
    return collections.Counter(m.group(1) for m in re.finditer(r"^\[(\w+)\]", err, re.M))


def test_debug_log_one_line_per_command(server_proc):
    p = server_proc(env=dict(QUIET, GGML_RPC_DEBUG="1"))
    with RemoteBackend(p.endpoint) as rb:
        sent = exercise(rb)
    wait_for(p, CLOSED)
    out, err = p.stop()
    assert debug_tags(err) == sent
    assert out.splitlines()[-2:] == ["Accepted client connection", CLOSED]


def test_no_debug_log_by_default(server_proc):
    p = server_proc(env=QUIET)
    with RemoteBackend(p.endpoint) as rb:
        exercise(rb)
    wait_for(p, CLOSED)
    _, err = p.stop()
    assert debug_tags(err) == {}


@pytest.mark.interop
def test_debug_tags_match_reference(ref_server):
    """llama.cpp logs the same tags, except DEVICE_COUNT, which it never logs, and
    SET_TENSOR_HASH, which it logs only on a cache hit."""
    p = ref_server(env=dict(QUIET, GGML_RPC_DEBUG="1"))
    with RemoteBackend(p.endpoint) as rb:
        sent = exercise(rb)
    wait_for(p, CLOSED)
    _, err = p.stop()
    del sent["device_count"], sent["set_tensor_hash"]
    assert debug_tags(err) == sent


def test_connection_lines_on_stdout(server_proc):
    p = server_proc(env=QUIET)
    for i in range(1, 4):
        RemoteBackend(p.endpoint).close()
        wait_for(p, CLOSED, count=i)
    out, err = p.stop()
    lines = out.splitlines()
    assert lines[-6:] == ["Accepted client connection", CLOSED] * 3
    assert "Accepted" not in err and "closed" not in err
