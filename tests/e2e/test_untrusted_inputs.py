"""`ggml-rpc-cli run` facing a server that reports nonsense and GGUF files whose
metadata lies: one `error:` line, no traceback, and the file case within bounded time
and memory (nothing is built from a count before the file's tensors back it)."""
from __future__ import annotations

import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ggmlrpc.cli.main import main
from ggmlrpc.client import RemoteBackend
from ggmlrpc.errors import ProtocolError
from ggmlrpc.llm import synth
from ggmlrpc import session
from ggmlrpc.protocol import Cmd
from tests.conftest import start_server

U64 = struct.Struct("<Q")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("untrusted")
    return synth.write_llama(d / "llama.gguf", synth.LlamaShape(n_layer=2, n_embd=64, n_ff=128,
                                                                 n_head=4, n_head_kv=2, n_ctx=128))


def run_cli(capsys, *args):
    rc = main(["run", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def one_error(rc: int, err: str, what: str) -> None:
    assert rc == 1 and err.startswith("error: ") and err.count("\n") == 1, err
    assert what in err and "Traceback" not in err, err


# -- what a server reports ------------------------------------------------------------------

LIES = {
    "alignment 0": ("alignment", lambda dev: lambda: 0),
    "alignment 2^40": ("alignment", lambda dev: lambda: 1 << 40),
    "alignment 48": ("alignment", lambda dev: lambda: 48),
    "max size 0": ("max_size", lambda dev: lambda: 0),
}


@pytest.fixture
def lying_server(monkeypatch, request):
    srv = start_server()
    lie = request.param
    handlers = list(session._HANDLER_LIST)
    if lie == "base near 2^64":
        session._HANDLER_LIST[Cmd.BUFFER_GET_BASE] = \
            lambda self, size: self.reply(U64.pack((1 << 64) - 4096))
    else:
        attr, make = LIES[lie]
        monkeypatch.setattr(srv.devices[0], attr, make(srv.devices[0]))
    yield f"127.0.0.1:{srv.port}", lie
    srv.close()
    session._HANDLER_LIST[:] = handlers


ALL_LIES = [*LIES, "base near 2^64"]


@pytest.mark.parametrize("lying_server", [lie for lie in ALL_LIES if lie != "max size 0"],
                         indirect=True)   # (the runner does not ask for the maximum size)
def test_run_refuses_what_a_server_reports(model_path, lying_server, capsys):
    endpoint, lie = lying_server
    rc, _, err = run_cli(capsys, "-m", str(model_path), "--rpc", endpoint, "-n", "2", "-p", "hi")
    one_error(rc, err, endpoint)


@pytest.mark.parametrize("lying_server", ALL_LIES, indirect=True)
def test_remote_backend_raises_protocol_error(lying_server):
    endpoint, lie = lying_server
    with RemoteBackend(endpoint) as rb, pytest.raises(ProtocolError):
        rb.get_alignment(0)
        rb.get_max_size(0)
        rb.alloc_buffer(1 << 20)


# -- what a GGUF file says ------------------------------------------------------------------

# the CLI in a child with 1 GiB of address space beyond what it starts with: a file whose
# metadata makes the runner build something big fails the test instead of the host
BOUNDED = textwrap.dedent("""
    import resource, sys
    with open("/proc/self/status") as f:
        vm = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
    from ggmlrpc.cli.main import main
    sys.exit(main(["run", "-m", sys.argv[1], "-n", "1", "-p", "hi"]))
""")


def run_bounded(path) -> tuple[int, str]:
    r = subprocess.run([sys.executable, "-P", "-c", BOUNDED, str(path)], capture_output=True, text=True,
                       timeout=120, errors="replace")
    return r.returncode, r.stderr


def lying_gguf(path, tokens: list[bytes], n_vocab: int = 32, n_embd: int = 64):
    import gguf
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_embedding_length(n_embd)
    w.add_token_list(tokens)
    w.add_tensor("token_embd.weight", np.zeros((n_vocab, n_embd), dtype=np.float32))
    for i in range(2):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_block_count_beyond_the_tensors(model_path, tmp_path):
    """A working 2-layer model whose metadata says 4e9 layers: refused before any
    per-layer list exists (it used to end in a MemoryError after 12 s)."""
    data = model_path.read_bytes()
    key = b"llama.block_count" + struct.pack("<II", 4, 2)      # type UINT32, value 2
    assert data.count(key) == 1
    bad = tmp_path / "layers.gguf"
    bad.write_bytes(data.replace(key, key[:-4] + struct.pack("<I", 4_000_000_000)))
    rc, err = run_bounded(bad)
    one_error(rc, err, "block_count")


def test_a_million_empty_tokens(tmp_path):
    """An 8 MB file of a million empty token strings over a 32-row embedding: refused
    before the token list is parsed (it took 40 s and 1.7 GiB before a clean error)."""
    rc, err = run_bounded(lying_gguf(tmp_path / "tokens.gguf", tokens=[b""] * 1_000_000))
    one_error(rc, err, "tokens")


@pytest.mark.parametrize("cut", [24, 200, -100])
def test_truncated_file(model_path, tmp_path, cut):
    """A GGUF cut short (in the header, in the metadata, in the tensor data)."""
    data = model_path.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:cut] if cut > 0 else data[:cut])
    rc, err = run_bounded(bad)
    one_error(rc, err, "cut.gguf")
