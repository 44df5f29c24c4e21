"""The HTTP side of `ggml-rpc-cli serve`: llama-server's routes on Starlette, kept
thin; everything about generation is in engine.py."""
from __future__ import annotations

import asyncio
import hmac
import json
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from ..llm.gguf_file import ModelError
from .engine import ApiError, Engine, field_of, text_of

STATIC = Path(__file__).resolve().parent / "static"
PUBLIC = {"/", "/health", "/v1/health"}       # no API key needed (llama-server's list)


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.to_json(), status_code=e.status)


def dumps(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


async def json_body(request: Request) -> dict:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(f"malformed JSON body: {e}") from None
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    return body


class ApiKey:
    """ASGI middleware: with keys set, every route outside PUBLIC needs one of them in
    `Authorization: Bearer KEY` (or `X-Api-Key: KEY`), else 401."""

    def __init__(self, app, keys: list[str]):
        self.app, self.keys = app, [k.encode() for k in keys]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.keys or scope["path"] in PUBLIC \
                or scope["method"] == "OPTIONS":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        key = headers.get(b"authorization") or headers.get(b"x-api-key") or b""
        if key.startswith(b"Bearer "):
            key = key[7:]
        if any(hmac.compare_digest(key, k) for k in self.keys):
            return await self.app(scope, receive, send)
        await error_response(ApiError("Invalid API Key", "authentication_error"))(scope, receive, send)


async def until_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def watch_disconnect(request: Request, gen) -> asyncio.Future:
    """A task that stops `gen` when the client hangs up."""
    watch = asyncio.ensure_future(until_disconnect(request.receive))
    watch.add_done_callback(lambda _: gen.cancel())
    return watch


class EventStream(Response):
    """Server-sent events from a generation, sent as they come. The generation stops
    when the client goes away (`watch` sees its disconnect, or a send fails)."""

    def __init__(self, gen, watch: asyncio.Future, first: bytes, chunks):
        self.status_code = 200
        self.raw_headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        self.gen, self.watch, self.first, self.chunks = gen, watch, first, chunks

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        pump = asyncio.ensure_future(self._pump(send))
        try:
            await asyncio.wait((pump, self.watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.gen.cancel()
            for t in (pump, self.watch):
                t.cancel()
            await asyncio.gather(pump, self.watch, return_exceptions=True)

    async def _pump(self, send):
        try:
            await send({"type": "http.response.body", "body": self.first, "more_body": True})
            async for data in self.chunks:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        except OSError:            # the client went away mid-send
            pass


def sse(obj) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


class Api:
    """The routes over one Engine."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(MetricsCollector(engine))

    # -- generation --------------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        body = await json_body(request)
        e = self.engine
        e.check_model(body)
        prompt = e.render(body)
        job = e.job("chat", body, e.prompt_tokens(prompt))
        return await self._respond(request, job)

    async def completions(self, request: Request) -> Response:
        body = await json_body(request)
        e = self.engine
        e.check_model(body)
        if "prompt" not in body:
            raise ApiError("'prompt' is required")
        prompt = body["prompt"]
        if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
            if len(prompt) > 1:
                raise ApiError("one prompt per request (an array of several prompts is not supported)")
            prompt = prompt[0]
        ids = e.tokenize_mixed(prompt, True, True)
        return await self._respond(request, e.job("text", body, ids))

    async def _respond(self, request: Request, job) -> Response:
        gen = self.engine.submit(job)
        watch = watch_disconnect(request, gen)
        head = {"id": job.id, "created": job.created, "model": self.engine.names[0],
                "system_fingerprint": "ggmlrpc"}
        if not job.stream:
            try:
                return await self._whole(gen, job.kind, head)
            finally:
                watch.cancel()
        try:
            # the first event decides the status: an error before any text is a plain error
            ev = await gen.events.get()
        except BaseException:
            watch.cancel()
            raise
        if ev[0] != "token" and ev[0] != "done":
            watch.cancel()
            return error_response(ev[1]) if ev[0] == "error" else Response(status_code=499)
        chunk = self._chunker(job, head)
        first = b"".join(chunk(ev))
        if job.kind == "chat":     # OpenAI's first chunk names the role
            first = sse(self._chunk_chat(head, {"role": "assistant", "content": None})) + first

        async def rest():
            e = ev
            while e[0] == "token":
                e = await gen.events.get()
                for data in chunk(e):
                    yield data
        return EventStream(gen, watch, first, rest())

    async def _whole(self, gen, kind: str, head: dict) -> Response:
        texts, probs = [], []
        while True:
            ev = await gen.events.get()
            if ev[0] == "cancelled":
                return Response(status_code=499)      # nobody reads it
            if ev[0] == "error":
                return error_response(ev[1])
            if ev[0] == "token":
                texts.append(ev[1])
                if ev[2] is not None:
                    probs.append(ev[2])
                continue
            done = ev[1]
            text = text_of(b"".join(texts) + done["rest"])
            logprobs = {"content": probs} if probs else None
            obj = "chat.completion" if kind == "chat" else "text_completion"
            if kind == "chat":
                choice = {"finish_reason": done["finish_reason"], "index": 0,
                          "message": {"role": "assistant", "content": text}}
                if logprobs:
                    choice["logprobs"] = logprobs
            else:
                choice = {"text": text, "index": 0, "logprobs": logprobs,
                          "finish_reason": done["finish_reason"]}
            return Response(dumps({"choices": [choice], **head, "object": obj, "usage": done["usage"],
                                   "timings": done["timings"]}), media_type="application/json")

    @staticmethod
    def _chunk_chat(head: dict, delta: dict, finish=None, logprobs=None) -> dict:
        choice = {"finish_reason": finish, "index": 0, "delta": delta}
        if logprobs is not None:
            choice["logprobs"] = {"content": [logprobs]}
        return {"choices": [choice], **head, "object": "chat.completion.chunk"}

    def _chunker(self, job, head: dict):
        """Events to SSE chunks in the job's format."""
        chat = job.kind == "chat"

        def chunk(ev) -> list[bytes]:
            kind = ev[0]
            if kind == "token":
                text, probs = text_of(ev[1]), ev[2]
                if chat:
                    return [sse(self._chunk_chat(head, {"content": text}, None, probs))]
                return [sse({"choices": [{"text": text, "index": 0,
                                          "logprobs": {"content": [probs]} if probs else None,
                                          "finish_reason": None}],
                             **head, "object": "text_completion"})]
            if kind == "error":
                return [sse(ev[1].to_json())]
            if kind == "cancelled":
                return []
            done = ev[1]
            out = []
            if chat:
                if done["rest"]:
                    out.append(sse(self._chunk_chat(head, {"content": text_of(done["rest"])})))
                last = self._chunk_chat(head, {}, done["finish_reason"])
                out_last = [last]
                if job.include_usage:
                    out_last.append({"choices": [], **head, "object": "chat.completion.chunk",
                                     "usage": done["usage"]})
                out_last[-1]["timings"] = done["timings"]
                return out + [sse(o) for o in out_last]
            return [sse({"choices": [{"text": text_of(done["rest"]), "index": 0, "logprobs": None,
                                      "finish_reason": done["finish_reason"]}],
                         **head, "object": "text_completion", "usage": done["usage"],
                         "timings": done["timings"]})]
        return chunk

    # -- the rest ----------------------------------------------------------------
    async def apply_template(self, request: Request) -> Response:
        return JSONResponse({"prompt": self.engine.render(await json_body(request))})

    async def tokenize(self, request: Request) -> Response:
        body = await json_body(request)
        e = self.engine
        if "content" not in body:
            return JSONResponse({"tokens": []})
        ids = e.tokenize_mixed(body["content"], field_of(body, "add_special", bool, False),
                               field_of(body, "parse_special", bool, True))
        if not field_of(body, "with_pieces", bool, False):
            return JSONResponse({"tokens": ids})
        tok, out = e.model.tokenizer, []
        for t in ids:
            piece = tok.token_to_piece(t, True)
            try:
                out.append({"id": t, "piece": piece.decode("utf-8")})
            except UnicodeDecodeError:
                out.append({"id": t, "piece": list(piece)})
        return JSONResponse({"tokens": out})

    async def detokenize(self, request: Request) -> Response:
        body = await json_body(request)
        tokens = body.get("tokens", [])
        if not isinstance(tokens, list):
            raise ApiError("Field 'tokens': must be an array of token ids")
        tok = self.engine.model.tokenizer
        data = b"".join(tok.token_to_piece(self.engine.check_token(t), True) for t in tokens)
        return JSONResponse({"content": data.decode("utf-8", "replace")})

    async def models(self, request: Request) -> Response:
        e = self.engine
        m = e.model
        meta = {"vocab_type": 2 if m.tokenizer.bpe else 1, "n_vocab": m.tokenizer.n_vocab,
                "n_ctx": m.n_ctx, "n_ctx_train": m.hp.n_ctx_train, "n_embd": m.hp.n_embd,
                "size": sum(t.nbytes for t in m.file.tensors.values())}
        return JSONResponse({"object": "list", "data": [
            {"id": e.names[0], "aliases": e.names, "tags": [], "object": "model",
             "created": e.stats.t_start, "owned_by": "llamacpp", "meta": meta}]})

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(self, request: Request) -> Response:
        return Response(generate_latest(self.registry), media_type="text/plain; version=0.0.4",
                        headers={"Process-Start-Time-Unix": str(self.engine.stats.t_start)})

    async def index(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html")


class MetricsCollector:
    """llama-server's /metrics (its llamacpp: names) from the engine's Stats."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def collect(self):
        st = self.engine.stats
        for name, doc, v in (
                ("prompt_tokens", "Number of prompt tokens processed, excluding cached tokens", st.prompt_tokens),
                ("prompt_tokens_cached", "Number of prompt tokens reused from the cache", st.prompt_cached),
                ("prompt_seconds", "Total time spent processing prompts", st.prompt_seconds),
                ("tokens_predicted", "Number of generation tokens processed", st.predicted),
                ("tokens_predicted_seconds", "Total time spent generating tokens", st.predicted_seconds),
                ("n_decode", "Total number of decode steps", st.n_decode)):
            yield CounterMetricFamily("llamacpp:" + name, doc, value=v)
        b = st.bucket
        prompt_ts = b[0] / b[1] if b[1] else 0.0
        predicted_ts = b[2] / b[3] if b[3] else 0.0
        st.bucket = [0, 0.0, 0, 0.0]        # averaged over the window between two scrapes
        for name, doc, v in (
                ("n_tokens_max", "Largest observed sequence length (prompt + generation)", st.n_tokens_max),
                ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", prompt_ts),
                ("predicted_tokens_seconds", "Average generation throughput in tokens/s", predicted_ts),
                ("requests_processing", "Number of requests processing", st.processing),
                ("requests_deferred", "Number of requests deferred", self.engine.deferred),
                ("kv_cache_tokens", "Tokens in the context (KV cache)", self.engine.kv_tokens)):
            yield GaugeMetricFamily("llamacpp:" + name, doc, value=v)


def create_app(engine: Engine, api_keys: list[str] | None = None):
    """The ASGI app serving `engine`."""
    api = Api(engine)

    async def api_error(request, exc: ApiError):
        return error_response(exc)

    async def http_error(request, exc: HTTPException):
        kind = {404: "not_found_error"}.get(exc.status_code, "invalid_request_error")
        return JSONResponse({"error": {"code": exc.status_code, "message": exc.detail, "type": kind}},
                            status_code=exc.status_code)

    async def model_error(request, exc: ModelError):
        return error_response(ApiError(str(exc)))

    async def server_error(request, exc: Exception):
        return error_response(ApiError(f"internal error: {type(exc).__name__}: {exc}", "server_error"))

    # each endpoint under all the paths llama-server answers it at
    routes = [Route(path, endpoint, methods=[method]) for method, endpoint, paths in (
        ("GET", api.index, ["/"]),
        ("GET", api.health, ["/health", "/v1/health"]),
        ("GET", api.metrics, ["/metrics"]),
        ("GET", api.models, ["/models", "/v1/models"]),
        ("POST", api.chat, ["/v1/chat/completions", "/chat/completions"]),
        ("POST", api.completions, ["/v1/completions"]),
        ("POST", api.tokenize, ["/tokenize"]),
        ("POST", api.detokenize, ["/detokenize"]),
        ("POST", api.apply_template, ["/apply-template"]),
    ) for path in paths]
    app = Starlette(routes=routes, exception_handlers={
        ApiError: api_error, HTTPException: http_error, ModelError: model_error, Exception: server_error})
    return ApiKey(app, api_keys or [])
