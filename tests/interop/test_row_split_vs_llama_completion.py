"""`run -sm row` prints llama-completion's greedy text on generated llama models
(F32, Q8_0, Q4_K_M), the layers cut over two of our servers (-ts 1,1 and 3,1) and
over two of llama.cpp's own ggml-rpc-server (plain v7 commands only), and over our
servers started with --peers, which swap the pieces themselves (ggmlrpc.peers)."""
from __future__ import annotations

import sys

import pytest

from ggmlrpc.cli.main import main
from ggmlrpc.llm import synth
from tests.interop.test_runner_vs_llama_completion import N, PROMPT, completion, ours, same_text

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module")
def models(tmp_path_factory, ref_bin):
    d = tmp_path_factory.mktemp("row-models")
    shape = synth.LlamaShape(n_layer=3, n_embd=256, n_ff=512, n_head=8, n_head_kv=4)
    f32 = synth.write_llama(d / "f32.gguf", shape, "f32", seed=11)
    return {"f32": f32, **{q.lower(): synth.quantize(ref_bin / "llama-quantize", f32, d / f"{q}.gguf", q)
                           for q in ("Q8_0", "Q4_K_M")}}


@pytest.mark.parametrize("kind", ["f32", "q8_0", "q4_k_m"])
def test_row_split_over_our_servers(ref_bin, models, kind, server_proc, capfdbinary):
    a, b = server_proc("-t", "1"), server_proc("-t", "1")
    ref = completion(ref_bin, models[kind], ["-ngl", "0", "-t", "2"])
    for ts in ("1,1", "3,1"):
        mine = ours(models[kind], ["--rpc", f"{a.endpoint},{b.endpoint}", "-sm", "row", "-ts", ts], capfdbinary)
        assert same_text(mine, ref), ts


def test_row_split_over_llama_servers(ref_bin, models, ref_server, capfdbinary):
    a, b = ref_server("-t", "1"), ref_server("-t", "1")
    for kind in ("f32", "q8_0"):
        ref = completion(ref_bin, models[kind], ["-ngl", "0", "-t", "2"])
        mine = ours(models[kind], ["--rpc", f"{a.endpoint},{b.endpoint}", "-sm", "row", "-ts", "1,1"], capfdbinary)
        assert same_text(mine, ref), kind


def test_row_split_over_linked_servers(ref_bin, models, server_proc, capfdbinary):
    srv = [server_proc("-t", "1", "--peers") for _ in range(3)]
    for kind in ("f32", "q8_0", "q4_k_m"):
        ref = completion(ref_bin, models[kind], ["-ngl", "0", "-t", "2"])
        for n, ts in ((2, "1,1"), (2, "3,1"), (3, "1,1,1")):
            eps = ",".join(s.endpoint for s in srv[:n])
            capfdbinary.readouterr()
            assert main(["run", "-m", str(models[kind]), "--temp", "0", "-p", PROMPT, "-n", str(N),
                         "--rpc", eps, "-sm", "row", "-ts", ts]) == 0
            sys.stdout.flush()
            mine, err = capfdbinary.readouterr()
            assert f"the {n} servers swap their results directly".encode() in err
            assert same_text(mine, ref), (kind, ts)


def test_llama_cpp_sees_plain_v7_on_both_sides(ref_bin, models, server_proc, ref_server, capfdbinary):
    """llama.cpp's client on our servers with --peers (it never asks for the
    extension) and our host asking llama.cpp's servers for it (they answer zero caps,
    the host combines): both print llama-completion's text."""
    a, b = server_proc("-t", "1", "--peers"), server_proc("-t", "1", "--peers")
    ref = completion(ref_bin, models["q8_0"], ["-ngl", "0", "-t", "2"])
    theirs = completion(ref_bin, models["q8_0"], ["-ngl", "99", "--rpc", f"{a.endpoint},{b.endpoint}"])
    assert same_text(theirs, ref)
    c, d = ref_server("-t", "1"), ref_server("-t", "1")
    mine = ours(models["q8_0"], ["--rpc", f"{c.endpoint},{d.endpoint}", "-sm", "row", "-ts", "1,1"], capfdbinary)
    assert same_text(mine, ref)


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory, ref_bin):
    """Routed experts: Mixtral-style (llama) and qwen3moe, F32 and Q8_0."""
    d = tmp_path_factory.mktemp("row-moe")
    shape = synth.ModelShape(n_layer=3, n_embd=256, n_ff=512, n_head=8, n_head_kv=4)
    out = {}
    for arch in ("llama-moe", "qwen3moe"):
        f32 = synth.write_model(d / f"{arch}-f32.gguf", arch, shape, "f32", seed=11)
        out[arch, "f32"] = f32
        out[arch, "q8_0"] = synth.quantize(ref_bin / "llama-quantize", f32, d / f"{arch}-q8_0.gguf", "Q8_0")
    return out


@pytest.mark.parametrize("arch", ["llama-moe", "qwen3moe"])
def test_row_split_cuts_every_expert(ref_bin, moe_models, arch, server_proc, ref_server, capfdbinary):
    """Each expert cut by its rows over two of our servers (-ts 1,1 and 3,1), over
    llama.cpp's own servers (MUL_MAT_ID on the cut experts, plain v7) and over
    linked servers: llama-completion's text each time."""
    ours_ = [server_proc("-t", "1") for _ in range(2)]
    theirs = [ref_server("-t", "1") for _ in range(2)]
    linked = [server_proc("-t", "1", "--peers") for _ in range(2)]
    for kind in ("f32", "q8_0"):
        m = moe_models[arch, kind]
        ref = completion(ref_bin, m, ["-ngl", "0", "-t", "2"])
        for srv, ts in ((ours_, "1,1"), (ours_, "3,1"), (theirs, "1,1"), (linked, "1,1")):
            eps = ",".join(s.endpoint for s in srv)
            mine = ours(m, ["--rpc", eps, "-sm", "row", "-ts", ts], capfdbinary)
            assert same_text(mine, ref), (kind, ts, srv is theirs, srv is linked)


@pytest.mark.parametrize("arch", ["mistral3", "qwen2moe", "gemma2", "gpt-oss", "glm4moe", "llama4", "phi2", "phi3", "minimax-m2"])
def test_row_split_of_other_architectures_over_linked_servers(ref_bin, tmp_path, arch, server_proc, capfdbinary):
    """The architectures cut over linked servers only (their own layers, the pieces
    gathered on the servers): llama-completion's text, with flash attention on and
    off (gemma2 and gpt-oss: sliding-window layers, a prompt past the window)."""
    from tests.e2e.test_runner import arch_shape
    model = synth.write_model(tmp_path / f"{arch}.gguf", arch, arch_shape(arch, 128), "f16", seed=4)
    srv = [server_proc("-t", "1", "--peers") for _ in range(2)]
    eps = ",".join(s.endpoint for s in srv)
    for fa in ("on", "off"):
        ref = completion(ref_bin, model, ["-ngl", "0", "-fa", fa])
        capfdbinary.readouterr()
        assert main(["run", "-m", str(model), "--temp", "0", "-p", PROMPT, "-n", str(N), "--rpc", eps,
                     "-sm", "row", "-ts", "1,1", "-fa", fa]) == 0
        sys.stdout.flush()
        mine, err = capfdbinary.readouterr()
        assert b"the 2 servers swap their results directly" in err
        assert same_text(mine, ref), (arch, fa)


@pytest.mark.parametrize("arch", ["mistral3", "qwen2moe", "gemma2", "gpt-oss", "glm4moe", "llama4", "phi2", "phi3", "minimax-m2"])
def test_row_split_of_other_architectures_over_three_servers(ref_bin, tmp_path, arch, server_proc, capfdbinary):
    """The same architectures quantized (Q8_0) over three linked servers, unequal
    shares (-ts 2,1,1 of four KV heads): llama-completion's text."""
    from tests.e2e.test_runner import arch_shape
    shape = synth.ModelShape(**{**vars(arch_shape(arch, 256)), "n_head": 8, "n_head_kv": 4})
    f32 = synth.write_model(tmp_path / f"{arch}.gguf", arch, shape, "f32", seed=4)
    model = synth.quantize(ref_bin / "llama-quantize", f32, tmp_path / f"{arch}-q8_0.gguf", "Q8_0")
    srv = [server_proc("-t", "1", "--peers") for _ in range(3)]
    ref = completion(ref_bin, model, ["-ngl", "0"])
    mine = ours(model, ["--rpc", ",".join(s.endpoint for s in srv), "-sm", "row", "-ts", "2,1,1"], capfdbinary)
    assert same_text(mine, ref), arch


@pytest.mark.parametrize("arch", ["mistral3", "qwen2moe", "gemma2", "gpt-oss", "glm4moe", "llama4", "phi2", "phi3",
                                  "minimax-m2"])
def test_row_split_of_other_architectures_over_llama_servers(ref_bin, tmp_path, arch, ref_server, capfdbinary):
    """The same architectures over two of llama.cpp's own ggml-rpc-server (plain v7:
    the host puts each gather's pieces together and sends them with the next
    segment), with flash attention on and off: llama-completion's text."""
    from tests.e2e.test_runner import arch_shape
    model = synth.write_model(tmp_path / f"{arch}.gguf", arch, arch_shape(arch, 128), "f16", seed=4)
    srv = [ref_server("-t", "1") for _ in range(2)]
    for fa in ("on", "off"):
        ref = completion(ref_bin, model, ["-ngl", "0", "-fa", fa])
        mine = ours(model, ["--rpc", ",".join(s.endpoint for s in srv), "-sm", "row", "-ts", "1,1", "-fa", fa],
                    capfdbinary)
        assert same_text(mine, ref), (arch, fa)
