"""`serve -np 4` and `llama-server -np 4` on the same model and RPC servers: through
each, four requests at once (one client hanging up mid-way) answer as each does
alone, and each answer alone is llama-server's (a difference only at a near-tie,
found from the top two log-probabilities and reported)."""
from __future__ import annotations

import pytest

from ggmlrpc.llm import synth
from ggmlrpc.llm.model import PIPE_MIN_UBATCH
from tests.conftest import server_procs
from tests.e2e.test_serve import CHATML, Serve, rpc  # noqa: F401  (rpc: fixture)
from tests.e2e.test_serve_batch import NOISE, QUESTIONS, at_once_as_alone, same_or_near_tie

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module")
def files(tmp_path_factory, ref_bin):
    """A model trained on 1024 positions (llama-server holds each slot to that)."""
    d = tmp_path_factory.mktemp("serve-batch-interop")
    shape = synth.LlamaShape(n_layer=3, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, n_ctx=1024)
    f32 = synth.write_llama(d / "f32.gguf", shape, "f32", seed=5)
    (d / "chatml.jinja").write_text(CHATML)
    return {"f32": f32, "q8_0": synth.quantize(ref_bin / "llama-quantize", f32, d / "q8_0.gguf", "Q8_0"),
            "template": d / "chatml.jinja"}


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_four_at_once_through_both(files, rpc, ref_llama_server, kind):  # noqa: F811
    # -ub 64: the micro-batches our host cuts a prompt into to pipeline it over two
    # servers (PIPE_MIN_UBATCH), so that llama-server runs the same graphs
    common = ["-c", "4096", "-ngl", "99", "--rpc", rpc, "--chat-template-file", str(files["template"]),
              "--jinja", "-np", "4", "-ub", str(PIPE_MIN_UBATCH)]
    ours = Serve(files[kind], *common, "-ts", "1,1")
    try:
        ref = ref_llama_server(files[kind], *common, "-ts", "1/1", "-t", "1", "--no-repack")
        # Q8_0 quantizes every activation, so the F16 rounding of another batch
        # shape (attention tiles, cell order) moves its log-probabilities by up to
        # ~0.05, llama-server's too when a request's prompt runs in other pieces
        bound = NOISE if kind == "f32" else 0.1
        theirs = at_once_as_alone(ref.url, bound)
        mine = at_once_as_alone(ours.url, bound)
        # llama-server leaves out the log-probabilities of a token that cuts a UTF-8
        # character (the next one's entry covers both), so across the two servers
        # the answers alone compare by text: the same graphs on the same servers
        for q, a, b in zip(QUESTIONS, theirs, mine):
            assert a.text == b.text, f"{kind}: {q}: {a.text!r} vs {b.text!r}"
    finally:
        ours.stop()


@pytest.fixture(scope="module")
def linked_rpc():
    """Two of our servers started with --peers."""
    yield from server_procs(2, "-t", "1", "--peers")


def test_four_at_once_over_linked_servers(files, linked_rpc, ref_llama_server):  # noqa: F811
    """serve -np 4 -sm row over servers that swap their pieces themselves: four at
    once answer as each alone, and each alone as llama-server's (layer split over the
    same servers, which it sees as plain v7 ones)."""
    common = ["-c", "4096", "-ngl", "99", "--rpc", linked_rpc, "--chat-template-file", str(files["template"]),
              "--jinja", "-np", "4", "-ub", str(PIPE_MIN_UBATCH)]
    ours = Serve(files["f32"], *common, "-ts", "1,1", "-sm", "row")
    try:
        assert "the 2 servers swap their results directly" in ours.output()[1]
        ref = ref_llama_server(files["f32"], *common, "-ts", "1/1", "-t", "1", "--no-repack")
        theirs = at_once_as_alone(ref.url)
        mine = at_once_as_alone(ours.url)
        for q, a, b in zip(QUESTIONS, theirs, mine):
            assert a.text == b.text, f"{q}: {a.text!r} vs {b.text!r}"
    finally:
        ours.stop()
