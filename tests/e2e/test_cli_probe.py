"""`ggml-rpc-cli probe`: what servers (ours and llama.cpp's) say about themselves."""
from __future__ import annotations

import json
import shutil
import socket
import struct
import subprocess
import sys
import threading

import pytest

from ggmlrpc.cli.main import main
from ggmlrpc.protocol import RESPONSE_SIZE, Cmd
from tests.conftest import free_port


def probe(capsys, *args):
    rc = main(["probe", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_probe_our_server(server, capsys):
    ep = f"127.0.0.1:{server.port}"
    rc, out, err = probe(capsys, ep, "--json")
    assert rc == 0 and err == ""
    info = json.loads(out)
    dev = server.devices[0]
    free, total = dev.memory()
    assert info["version"] == "7.0.0"
    assert info["devices"] == [{"index": 0, "free": free, "total": total,
                                "alignment": dev.alignment(), "max_size": dev.max_size()}]
    assert info["rtt_ms"] > 0
    rc, out, _ = probe(capsys, ep)
    assert rc == 0
    assert out.startswith(f"{ep}: RPC v7.0.0, 1 device(s), round trip ")
    assert f"alignment {dev.alignment()}, max buffer unlimited" in out


def test_probe_unreachable_is_one_line_and_status_1(server, capsys):
    dead = f"127.0.0.1:{free_port()}"
    rc, out, err = probe(capsys, f"127.0.0.1:{server.port},{dead}")
    assert rc == 1
    assert out.startswith(f"127.0.0.1:{server.port}: RPC v7.0.0")   # the live one is still reported
    assert err.count("\n") == 1 and err.startswith(f"error: {dead}: server unreachable")


def test_probe_bad_endpoint(capsys):
    rc, _, err = probe(capsys, "nohostport")
    assert rc == 1 and "invalid endpoint 'nohostport'" in err


def test_probe_other_version(capsys):
    """A peer that answers HELLO as protocol 6.1.0 is refused with a clear message."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    port = lsock.getsockname()[1]

    def serve():
        conn, _ = lsock.accept()
        with conn:
            head = conn.recv(9, socket.MSG_WAITALL)
            cmd, size = struct.unpack("<BQ", head)
            assert cmd == Cmd.HELLO
            conn.recv(size, socket.MSG_WAITALL)
            rsp = bytes([6, 1, 0]) + bytes(RESPONSE_SIZE[Cmd.HELLO] - 3)   # version, then caps
            conn.sendall(struct.pack("<Q", len(rsp)) + rsp)
            conn.recv(1)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        rc, out, err = probe(capsys, f"127.0.0.1:{port}")
    finally:
        t.join(5)
        lsock.close()
    assert rc == 1 and out == ""
    assert "speaks RPC v6.1.0" in err and err.count("\n") == 1


def test_console_script(server):
    exe = shutil.which("ggml-rpc-cli")
    argv = [exe] if exe else [sys.executable, "-P", "-m", "ggmlrpc.cli.main"]
    r = subprocess.run([*argv, "probe", f"127.0.0.1:{server.port}"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "RPC v7.0.0" in r.stdout


@pytest.mark.interop
def test_probe_reference_server(ref_server, capsys):
    srv = ref_server()
    rc, out, err = probe(capsys, srv.endpoint, "--json")
    assert rc == 0, err
    info = json.loads(out)
    assert info["version"] == "7.0.0" and len(info["devices"]) == 1
    d = info["devices"][0]
    assert d["alignment"] == 32 and d["total"] > 0 and d["free"] > 0


def test_probe_speed_on_our_server_and_llama_cpps(server, ref_server, capsys):
    """--speed times a Q8_0 matrix-vector product on each device (what -sm auto
    measures), through plain v7 commands, so llama.cpp's server is timed too; the
    measuring buffer is freed after."""
    free = server.devices[0].memory()[0]
    for ep in (f"127.0.0.1:{server.port}", ref_server("-t", "1").endpoint):
        rc, out, err = probe(capsys, ep, "--speed", "--json")
        assert rc == 0 and err == ""
        info = json.loads(out)
        assert info["devices"][0]["q8_0_matvec_gb_s"] > 0 and info["speed_bytes"] == 64 << 20
        rc, out, _ = probe(capsys, ep, "--speed")
        assert rc == 0 and "GB/s" in out
    assert server.devices[0].memory()[0] == free
