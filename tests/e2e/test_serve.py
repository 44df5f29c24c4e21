"""`ggml-rpc-cli serve` over two of our RPC servers, driven by the official `openai`
client (streamed and whole) and by plain HTTP: the answers' shapes and counts,
sampling fields, every kind of bad input (an error object with its status, and the
server goes on serving), a client that hangs up mid-stream, a lost RPC server."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from ggmlrpc.llm import synth
from ggmlrpc.llm.chat_template import CHATML
from tests.conftest import Proc, free_port, our_server_argv, server_procs

N_CTX = 256
# it reads the system message before refusing it: a template that never reads one has
# it merged into the next message instead (llama.cpp's probe of the system role)
STRICT = ("{%- if messages[0].role == 'system' and messages[0].content -%}"
          "{{ raise_exception('no system messages here') }}"
          "{%- endif -%}" + CHATML)
MESSAGES = [{"role": "user", "content": "tell me about the old fisherman"}]
PROMPT = "the old fisherman lived in a small village by the sea"


def serve_argv(*args) -> list[str]:
    return [sys.executable, "-P", "-m", "ggmlrpc.cli.main", "serve", *args]


class Serve(Proc):
    """`ggml-rpc-cli serve` as a process on a free port."""

    def __init__(self, model, *args, host="127.0.0.1"):
        port = free_port()
        super().__init__(serve_argv("-m", str(model), "-c", str(N_CTX), "--host", host,
                                    "--port", str(port), *args), port, timeout=120)
        self.url = f"http://{host}:{port}"
        for _ in range(200):      # listening comes a moment before the app is ready
            try:
                if httpx.get(self.url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)

    def client(self, key="none") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0)

    def post(self, path, body=None, content=None, **kw) -> httpx.Response:
        return httpx.post(self.url + path, json=body, content=content, timeout=60, **kw)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics").text
        return {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines()
                if ln and not ln.startswith("#")}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve")
    model = synth.write_llama(d / "m.gguf", synth.LlamaShape(n_layer=2, n_embd=128, n_ff=256, n_head=4,
                                                              n_head_kv=2, n_ctx=N_CTX), "f32", seed=1)
    (d / "chatml.jinja").write_text(CHATML)
    (d / "strict.jinja").write_text(STRICT)
    return {"model": model, "chatml": d / "chatml.jinja", "strict": d / "strict.jinja"}


@pytest.fixture(scope="module")
def rpc():
    yield from server_procs(2, "-t", "1")


@pytest.fixture(scope="module")
def srv(files, rpc):
    s = Serve(files["model"], "--rpc", rpc, "-ts", "1,1", "--chat-template-file", str(files["chatml"]),
              "--jinja", "-np", "2", "-a", "synth,other")
    yield s
    s.stop()


def chat_text(client, stream: bool, **kw):
    r = client.chat.completions.create(model="synth", messages=MESSAGES, stream=stream, **kw)
    if not stream:
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage
    text, finish, usage, roles = "", None, None, []
    for c in r:
        if c.usage is not None:
            usage = c.usage
        if c.choices:
            d = c.choices[0].delta
            roles += [d.role] if d.role else []
            text += d.content or ""
            finish = c.choices[0].finish_reason or finish
    assert roles == ["assistant"]
    return text, finish, usage


def test_chat_streamed_and_whole(srv):
    client = srv.client()
    prompt = srv.post("/apply-template", {"messages": MESSAGES}).json()["prompt"]
    assert prompt == f"<|im_start|>user\n{MESSAGES[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
    n_prompt = len(srv.post("/tokenize", {"content": prompt, "add_special": True}).json()["tokens"])
    whole, finish, usage = chat_text(client, False, max_tokens=12, temperature=0)
    assert finish == "length" and whole
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (n_prompt, 12, n_prompt + 12)
    streamed, finish, usage = chat_text(client, True, max_tokens=12, temperature=0,
                                        stream_options={"include_usage": True})
    assert streamed == whole and finish == "length"
    assert (usage.prompt_tokens, usage.completion_tokens) == (n_prompt, 12)
    # the second run found its prompt in the context
    assert usage.prompt_tokens_details.cached_tokens == n_prompt - 1
    # the other alias names the same model
    assert client.chat.completions.create(model="other", messages=MESSAGES, max_tokens=12,
                                          temperature=0).choices[0].message.content == whole


def test_completions_streamed_and_whole(srv):
    client = srv.client()
    n_prompt = len(srv.post("/tokenize", {"content": PROMPT, "add_special": True}).json()["tokens"])
    r = client.completions.create(model="synth", prompt=PROMPT, max_tokens=10, temperature=0)
    whole = r.choices[0].text
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length" and whole
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (n_prompt, 10)
    chunks = list(client.completions.create(model="synth", prompt=PROMPT, max_tokens=10, temperature=0,
                                            stream=True))
    text = "".join(c.choices[0].text for c in chunks)
    # as in llama-server, a stream leaves out a character cut by the last token
    assert text == whole or (whole.startswith(text) and whole[len(text):] == "\ufffd")
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 10
    # a prompt given as token ids is the same prompt
    ids = srv.post("/tokenize", {"content": PROMPT, "add_special": True}).json()["tokens"]
    assert client.completions.create(model="synth", prompt=ids, max_tokens=10,
                                     temperature=0).choices[0].text == whole


def test_no_max_tokens_runs_to_the_end_of_the_context(srv):
    r = srv.post("/v1/completions", {"prompt": PROMPT, "temperature": 0}).json()
    u = r["usage"]
    # a random model seldom draws its end-of-text token; if it did, the reason says so
    if r["choices"][0]["finish_reason"] == "length":
        assert u["total_tokens"] == N_CTX
    else:
        assert r["choices"][0]["finish_reason"] == "stop" and u["total_tokens"] < N_CTX


def test_stop_strings(srv):
    client = srv.client()
    full = client.completions.create(model="synth", prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    word = full[len(full) // 2:len(full) // 2 + 3]
    cut = full[:full.index(word)]
    for stream in (False, True):
        r = client.completions.create(model="synth", prompt=PROMPT, max_tokens=24, temperature=0,
                                      stop=[word, "\x01never"], stream=stream)
        if stream:
            chunks = list(r)
            text, finish = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
        else:
            text, finish = r.choices[0].text, r.choices[0].finish_reason
        assert (text, finish) == (cut, "stop")


def test_sampling_fields(srv):
    client = srv.client()
    kw = dict(model="synth", prompt=PROMPT, max_tokens=16, temperature=1.5, top_p=1.0,
              extra_body={"top_k": 0, "min_p": 0.0})
    a = client.completions.create(seed=7, **kw).choices[0].text
    assert client.completions.create(seed=7, **kw).choices[0].text == a
    # a wide distribution and other seeds: some other text comes up
    assert any(client.completions.create(seed=s, **kw).choices[0].text != a for s in range(8, 12))
    # top_k 1 is greedy whatever the temperature
    greedy = client.completions.create(model="synth", prompt=PROMPT, max_tokens=16, temperature=0).choices[0].text
    assert client.completions.create(model="synth", prompt=PROMPT, max_tokens=16, temperature=2.0, seed=3,
                                     extra_body={"top_k": 1}).choices[0].text == greedy


def test_logprobs(srv):
    r = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                                     "logprobs": 3}).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == 4
    for e in content:
        top = e["top_logprobs"]
        assert len(top) == 3 and top[0]["id"] == e["id"]        # greedy: the drawn token is the top one
        assert all(a["logprob"] >= b["logprob"] for a, b in zip(top, top[1:]))
        assert e["logprob"] <= 0 and bytes(e["bytes"]).decode("utf-8", "replace") == e["token"]
    assert "".join(bytes(e["bytes"]).decode("latin-1") for e in content).encode("latin-1").decode(
        "utf-8", "replace") == r["choices"][0]["text"]
    c = srv.client().chat.completions.create(model="synth", messages=MESSAGES, max_tokens=3, temperature=0,
                                             logprobs=True, top_logprobs=2)
    assert [len(t.top_logprobs) for t in c.choices[0].logprobs.content] == [2, 2, 2]
    chunks = list(srv.client().chat.completions.create(model="synth", messages=MESSAGES, max_tokens=3,
                                                       temperature=0, logprobs=True, top_logprobs=2,
                                                       stream=True))
    streamed = [t for ch in chunks if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in c.choices[0].logprobs.content]


def test_other_routes(srv):
    assert httpx.get(srv.url + "/health").json() == {"status": "ok"}
    models = srv.client().models.list().data
    assert [m.id for m in models] == ["synth"]
    toks = srv.post("/tokenize", {"content": "hello the sea", "with_pieces": True}).json()["tokens"]
    ids = [t["id"] for t in toks]
    assert srv.post("/tokenize", {"content": "hello the sea"}).json()["tokens"] == ids
    assert "".join(t["piece"] for t in toks) == " hello the sea"     # SentencePiece's leading space
    assert srv.post("/detokenize", {"tokens": ids}).json() == {"content": " hello the sea"}
    page = httpx.get(srv.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    m = srv.metrics()
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total",
                 "llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds",
                 "llamacpp:requests_processing", "llamacpp:requests_deferred"):
        assert name in m
    before = m["llamacpp:tokens_predicted_total"]
    srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 5})
    assert srv.metrics()["llamacpp:tokens_predicted_total"] == before + 5


def test_a_warm_up_step_runs_before_the_first_request_and_leaves_nothing(files):
    """As llama-server, a step of BOS and EOS goes through the servers before the
    first request (--no-warmup: none); its cells are freed, so the first request
    reuses none of them, and its answer is the one a cold start gives."""
    from tests.e2e.test_metrics import Metered

    rpc = Metered()
    try:
        answers = {}
        for warm in (False, True):
            before = rpc.scrape().value("ggmlrpc_graph_computes_total", device="CPU", kind="compute")
            s = Serve(files["model"], "--rpc", rpc.endpoint, *(() if warm else ("--no-warmup",)))
            try:
                ran = rpc.scrape().value("ggmlrpc_graph_computes_total", device="CPU", kind="compute") - before
                assert (ran > 0) == warm, ran
                r = s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}).json()
                assert r["timings"]["cache_n"] == 0 and r["timings"]["prompt_n"] == r["usage"]["prompt_tokens"]
                assert s.metrics()["llamacpp:prompt_tokens_total"] == r["usage"]["prompt_tokens"]
                answers[warm] = r["choices"][0]["text"]
            finally:
                s.stop()
        assert answers[True] == answers[False]
    finally:
        rpc.close()


@pytest.mark.parametrize("args", [["-np", "0"], ["-b", "0"], ["--prefill-chunk", "-1"], ["--max-queue", "-1"],
                                  ["--request-timeout", "-2"], ["--port", "70000"]])
def test_a_bad_option_is_refused_with_its_error(files, args):
    r = subprocess.run(serve_argv("-m", str(files["model"]), *args), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"error: invalid {args[0]} " in r.stderr, r.stderr


def test_a_prompt_longer_than_a_micro_batch_takes_one_decode_while_none_generates(files, rpc):
    """With no slot generating, a step takes up to -b prompt tokens (default 2048):
    the prompt's -ub micro-batches go to the servers in one decode (as a pipeline)
    instead of one step each; `llamacpp:n_decode_total` counts the steps. Either way
    the answer is the same."""
    texts = []
    for batch in (None, 16):
        args = ["--rpc", rpc, "-ts", "1,1", "-ub", "16"] + (["-b", str(batch)] if batch else [])
        s = Serve(files["model"], *args)
        try:
            m0 = s.metrics()["llamacpp:n_decode_total"]
            r = s.post("/v1/completions", {"prompt": PROMPT * 4, "max_tokens": 3, "temperature": 0}).json()
            n_prompt = r["usage"]["prompt_tokens"]
            assert n_prompt > 2 * 16
            prompt_steps = 1 if batch is None else -(-n_prompt // 16)
            assert s.metrics()["llamacpp:n_decode_total"] - m0 == prompt_steps + 2
            texts.append(r["choices"][0]["text"])
        finally:
            s.stop()
    assert texts[0] == texts[1]


LONG = " ".join(["the old fisherman"] * 200)
BAD = [
    ("malformed JSON", "/v1/chat/completions", b'{"messages": [', 400),
    ("not an object", "/v1/chat/completions", b"[1, 2]", 400),
    ("no messages", "/v1/chat/completions", {"max_tokens": 2}, 400),
    ("empty messages", "/v1/chat/completions", {"messages": []}, 400),
    ("messages not a list", "/v1/chat/completions", {"messages": "hi"}, 400),
    ("unknown role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400),
    ("content a number", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400),
    ("max_tokens a string", "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": "many"}, 400),
    ("temperature a string", "/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400),
    ("stream a string", "/v1/completions", {"prompt": "hi", "stream": "yes"}, 400),
    ("stop a number", "/v1/completions", {"prompt": "hi", "stop": 3}, 400),
    ("no prompt", "/v1/completions", {"max_tokens": 2}, 400),
    ("token outside the vocabulary", "/v1/completions", {"prompt": [1, 10 ** 9]}, 400),
    ("prompt longer than the context", "/v1/completions", {"prompt": LONG, "max_tokens": 2}, 400),
    ("max_tokens past the context", "/v1/completions", {"prompt": "hi", "max_tokens": N_CTX}, 400),
    ("unknown model", "/v1/chat/completions", {"model": "gpt-9", "messages": MESSAGES}, 404),
    ("unknown route", "/v1/embeddings", {"input": "hi"}, 404),
    ("bad detokenize", "/detokenize", {"tokens": ["a"]}, 400),
]


@pytest.mark.parametrize("what,path,body,status", BAD, ids=[b[0] for b in BAD])
def test_bad_input(srv, what, path, body, status):
    for stream in (False, True):
        if stream and not isinstance(body, dict):
            continue
        r = srv.post(path, content=body if isinstance(body, bytes) else json.dumps(
            {**body, "stream": body.get("stream", stream)}).encode(),
                     headers={"Content-Type": "application/json"})
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err["code"] == status and err["message"] and err["type"]
        if "context" in what:
            assert err["type"] == "exceed_context_size_error"
    # and the server goes on serving
    assert srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2}).status_code == 200


def test_bad_input_through_openai(srv):
    client = srv.client()
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="exceeds the available context size"):
        client.completions.create(model="synth", prompt=LONG, max_tokens=2, stream=True)


def hang_up(srv, body: dict) -> None:
    """Send `body` to /v1/completions on a raw socket and close it: a stream after two
    chunks, a whole answer once the generation has begun."""
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
        if body["stream"]:
            got = s.recv(4096)
            assert got.startswith(b"HTTP/1.1 200"), got
            while got.count(b"data: ") < 2:
                more = s.recv(4096)
                assert more, got
                got += more
        else:
            for _ in range(200):
                if srv.metrics()["llamacpp:requests_processing"] == 1:
                    break
                time.sleep(0.01)


def settled(srv) -> dict:
    for _ in range(100):
        m = srv.metrics()
        if m["llamacpp:requests_processing"] == 0:
            return m
        time.sleep(0.05)
    raise AssertionError("the generation did not stop")


@pytest.mark.parametrize("stream", [True, False])
def test_hang_up(srv, stream):
    """The client closes its socket mid-stream (after two chunks), or while it waits
    for a whole answer: the generation stops at once (far fewer tokens than asked
    for are counted), and its context is freed."""
    m0 = srv.metrics()
    body = {"prompt": PROMPT, "max_tokens": 200, "stream": stream, "temperature": 0}
    hang_up(srv, body)
    m = settled(srv)
    assert m["llamacpp:kv_cache_tokens"] == 0
    n = m["llamacpp:tokens_predicted_total"] - m0["llamacpp:tokens_predicted_total"]
    time.sleep(0.3)
    assert srv.metrics()["llamacpp:tokens_predicted_total"] - m0["llamacpp:tokens_predicted_total"] == n < 100
    # the next client is served in full
    r = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 20, "temperature": 0}).json()
    assert r["usage"]["completion_tokens"] == 20


def test_clients_at_once_are_served_in_turn(srv):
    """Three clients at once (one streaming) on two slots: all get their whole
    answer, the same greedy text."""
    from concurrent.futures import ThreadPoolExecutor

    def ask(stream):
        body = {"prompt": PROMPT, "max_tokens": 30, "temperature": 0, "stream": stream}
        if not stream:
            return srv.post("/v1/completions", body).json()["choices"][0]["text"]
        return "".join(c.choices[0].text for c in srv.client().completions.create(model="synth", **body))

    with ThreadPoolExecutor(3) as pool:
        texts = list(pool.map(ask, [False, True, False]))
    assert texts[0] == texts[2] and texts[0].startswith(texts[1]) and len(texts[1]) > 0


def test_key_host_and_template_errors(files, rpc):
    """--api-key (401 without it, /health open), a --host other than 127.0.0.1 (the
    warning), a template that raises (400, and the next request is served)."""
    s = Serve(files["model"], "--rpc", rpc, "--api-key", "sesame", "--chat-template-file",
              str(files["strict"]), host="127.0.0.2")
    try:
        assert "WARNING: Host ('127.0.0.2') is != '127.0.0.1'" in s.output()[1]
        assert httpx.get(s.url + "/health").status_code == 200
        r = httpx.get(s.url + "/v1/models")
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        good = s.client("sesame")
        assert good.models.list().data[0].id == "m.gguf"
        with pytest.raises(openai.BadRequestError, match="no system messages here"):
            good.chat.completions.create(model="m.gguf", max_tokens=2,
                                         messages=[{"role": "system", "content": "x"}, *MESSAGES])
        r = good.chat.completions.create(model="m.gguf", messages=MESSAGES, max_tokens=3)
        assert r.usage.completion_tokens == 3
    finally:
        s.stop()


def test_lost_rpc_server(files):
    """Without --reconnect a lost server is an error object on the request it breaks
    (and the HTTP server stays up); with it, a server back in time is waited for and
    the answer is the one an uninterrupted run gives."""
    port = free_port()
    argv = our_server_argv("-p", str(port), "-t", "1")
    rpc = Proc(argv, port)
    s = Serve(files["model"], "--rpc", rpc.endpoint)
    try:
        rpc.stop()
        r = s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 4})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert httpx.get(s.url + "/health").status_code == 200
    finally:
        s.stop()
    rpc = Proc(argv, port)
    s = Serve(files["model"], "--rpc", rpc.endpoint, "--reconnect", "30")
    try:
        want = s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}).json()
        rpc.stop()
        rpc = Proc(argv, port)
        got = s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}).json()
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
    finally:
        s.stop()
        rpc.stop()


def test_cli_errors(tmp_path):
    import subprocess
    r = subprocess.run(serve_argv("-m", str(tmp_path / "missing.gguf")), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and r.stderr.startswith("error: ") and len(r.stderr.splitlines()) == 1
    r = subprocess.run(serve_argv("-m", "x.gguf", "--host", "not-an-ip"), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and r.stderr.startswith("error: invalid --host")
