"""What `ggml-rpc-cli serve` does without HTTP: requests checked and turned into
generation jobs, one worker thread that owns the model and runs them in slots, several at once
(continuous batching, each slot's cache kept for the next request's prefix),
the text each token adds (llama-server's rules for stop strings and cut UTF-8), the
response objects in OpenAI's format with llama-server's fields, and the metrics.

The worker hands each event to the asyncio loop of the request that asked for it;
a job whose client went away is stopped before its next token, and the context it
filled is forgotten."""
from __future__ import annotations

import asyncio
import logging
import os
import queue
import secrets
import string
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import GgmlRpcError
from ..llm.chat_template import CHATML, ChatTemplate, TemplateError, prompt_text_tokens
from ..llm.gguf_file import ModelError
from ..llm.sampling import Sampler

log = logging.getLogger("ggmlrpc.serve")

# llama-server's error types and their HTTP status (format_error_response)
STATUS = {"invalid_request_error": 400, "authentication_error": 401, "not_found_error": 404,
          "server_error": 500, "permission_error": 403, "not_supported_error": 501,
          "unavailable_error": 503, "exceed_context_size_error": 400}

PREFILL_CHUNK = 128    # prompt tokens a step takes beside generating slots (--prefill-chunk)
ROLES = ("system", "developer", "user", "assistant", "tool")

class ApiError(Exception):
    """An error object for the client: {"error": {"code", "message", "type", ...}}."""

    def __init__(self, message: str, type: str = "invalid_request_error", **extra):
        super().__init__(message)
        self.type, self.extra = type, extra
        self.status = STATUS[type]

    def to_json(self) -> dict:
        return {"error": {"code": self.status, "message": str(self), "type": self.type, **self.extra}}


# -- request fields ------------------------------------------------------------------

_TYPE_NAMES = {bool: "boolean", int: "number", float: "number", str: "string", list: "array",
               dict: "object"}


def field_of(body: dict, name: str, kind, default=None):
    """body[name] if it is of `kind` (int and float are both numbers; bool is no
    number), `default` when absent or null."""
    v = body.get(name)
    if v is None:
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = any(isinstance(v, k) and not (k in (int, float) and isinstance(v, bool)) for k in kinds)
    if float in kinds and isinstance(v, int) and not isinstance(v, bool):
        ok = True
    if not ok:
        want = " or ".join(dict.fromkeys(_TYPE_NAMES[k] for k in kinds))
        got = _TYPE_NAMES.get(type(v), type(v).__name__)
        raise ApiError(f"Field '{name}': type must be {want}, but is {got}")
    return v


def message_text(i: int, msg) -> dict:
    """A chat message with its content as one string (text parts joined by newlines,
    as llama.cpp joins them for templates that take only strings)."""
    if not isinstance(msg, dict):
        raise ApiError(f"messages[{i}] must be an object")
    role = msg.get("role")
    if not isinstance(role, str):
        raise ApiError(f"messages[{i}]: 'role' must be a string")
    if role not in ROLES:
        raise ApiError(f"messages[{i}]: unknown role {role!r} (expected one of {', '.join(ROLES)})")
    content = msg.get("content")
    if content is None:
        if role != "assistant" or not msg.get("tool_calls"):
            raise ApiError("All non-assistant messages must contain 'content'" if role != "assistant"
                           else "Assistant message must contain either 'content' or 'tool_calls'!")
        content = ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(f"messages[{i}]: only text content parts are supported")
            texts.append(part["text"])
        content = "\n".join(texts)
    elif not isinstance(content, str):
        raise ApiError("Expected 'content' to be a string or an array")
    return {**msg, "content": content}


@dataclass
class Job:
    """One generation: the prompt's tokens and what to do with them."""
    kind: str                    # "chat" or "text"
    ids: list[int]
    n_predict: int
    sampling: dict
    stop: list[bytes]
    n_probs: int = 0
    stream: bool = False
    include_usage: bool = False
    cache_prompt: bool = True    # reuse what a slot holds of the prompt (llama-server's cache_prompt)
    id: str = field(default_factory=lambda: "chatcmpl-" + "".join(
        secrets.choice(string.ascii_letters + string.digits) for _ in range(32)))
    created: int = field(default_factory=lambda: int(time.time()))


# -- text of the generated tokens -------------------------------------------------

def utf8_complete(b: bytes) -> int:
    """How many bytes of `b` can be sent: all but a multi-byte character cut at the end
    (llama-server's validate_utf8)."""
    n = len(b)
    for i in range(1, min(4, n) + 1):
        c = b[n - i]
        if (c & 0xE0) == 0xC0 and i < 2 or (c & 0xF0) == 0xE0 and i < 3 or (c & 0xF8) == 0xF0 and i < 4:
            return n - i
    return n


def partial_stop(text: bytes, word: bytes) -> int:
    """Where a prefix of `word` ends `text`, or -1."""
    for n in range(min(len(word), len(text)), 0, -1):
        if text.endswith(word[:n]):
            return len(text) - n
    return -1


class Text:
    """The generated bytes and how many have been sent: a stop string ends the text
    before it, and text that may be the start of one, or a cut UTF-8 character, is
    held back until the next token tells."""

    def __init__(self, stop: list[bytes]):
        self.stop = stop
        self.buf = bytearray()
        self.sent = 0
        self.stopped = False

    def add(self, piece: bytes, eog: bool) -> bytes:
        """The bytes that can be sent after `piece`; sets `stopped` on a stop string."""
        self.buf += piece
        if utf8_complete(self.buf) < len(self.buf):
            return b""
        tail = bytes(self.buf[self.sent:])
        if self.stop:
            hit = -1
            for w in self.stop:
                pos = tail.find(w, max(0, len(tail) - len(w) - len(piece)))
                if pos >= 0 and (hit < 0 or pos < hit):
                    hit = pos
            if hit >= 0:
                del self.buf[self.sent + hit:]
                self.stopped = True
                tail = tail[:hit]
            elif not eog and any(partial_stop(tail, w) >= 0 for w in self.stop):
                return b""
        self.sent += len(tail)
        return tail

    def rest(self) -> bytes:
        """What is still held back when generation ends."""
        tail = bytes(self.buf[self.sent:])
        self.sent = len(self.buf)
        return tail


def text_of(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def token_text(piece: bytes) -> str:
    return text_of(piece[:utf8_complete(piece)])


# -- the worker ----------------------------------------------------------------------

class Generation:
    """A job handed to the worker; its events come out of `events` on the loop that
    submitted it: ("token", bytes, logprobs entry or None), then ("done", final dict,
    its "rest" the bytes held back to the end), ("error", ApiError) or ("cancelled",). Bytes become
    text where they are sent: a chunk at a time, or all at once."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop):
        self.job = job
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.t_submit = time.monotonic()

    def put(self, ev) -> None:
        deliver(self.loop, [(self, ev)])

    def cancel(self) -> None:
        self.cancelled.set()


def deliver(loop: asyncio.AbstractEventLoop, evs: list[tuple[Generation, tuple]]) -> None:
    """Put each event into its generation's queue, on `loop` (from the worker thread)."""
    def put() -> None:
        for gen, ev in evs:
            gen.events.put_nowait(ev)
    try:
        loop.call_soon_threadsafe(put)
    except RuntimeError:        # the loop is gone: nobody listens any more
        for gen, _ in evs:
            gen.cancelled.set()


class Slot:
    """A sequence of the model's KV cache and the request it runs (None: free). What
    it holds stays after the request, for the next one that starts the same way."""

    def __init__(self, seq):
        self.seq = seq
        self.gen: Generation | None = None
        self.used = 0.0          # when it last took a request
        self.in_flight = 0       # its micro-batches in the model's Flow
        self.sent = 0            # of its prompt still to run (todo), the tokens in them
        self.error: Exception | None = None     # its request failed while a piece was in flight
        self.todo: list[int] = []   # its prompt's tokens still to run
        self.piece = 0           # its prompt's pieces while no slot generates
        self.deadline: float | None = None      # when its request times out (monotonic)

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now > self.deadline

    def ready(self, now: float) -> bool:
        """Whether its request has something to send now: a piece of its prompt not in
        flight yet, or, generating, its next token (none in flight); not where it failed,
        was cancelled or timed out."""
        return ((len(self.todo) > self.sent if self.todo else not self.in_flight) and self.error is None
                and not self.gen.cancelled.is_set() and not self.expired(now))


class Stats:
    """llama-server's metrics, counted by the worker in plain numbers."""

    def __init__(self):
        self.prompt_tokens = self.prompt_cached = self.predicted = self.n_decode = 0
        self.prompt_seconds = self.predicted_seconds = 0.0
        self.n_tokens_max = 0
        self.processing = 0
        # the throughput gauges average over the window between two scrapes
        self.bucket = [0, 0.0, 0, 0.0]    # prompt tokens, seconds, predicted tokens, seconds
        self.t_start = int(time.time())


class Engine:
    """The model, its chat template, and the worker thread that runs every job."""

    def __init__(self, model, names: list[str], template: ChatTemplate, model_path: str = "",
                 n_slots: int = 1, max_queue: int = 0, timeout: float = 0.0, n_batch: int = 2048,
                 prefill_chunk: int | None = None):
        """`n_slots` requests run at once, each in its own sequence of the KV cache
        (n_ctx / n_slots tokens each); `max_queue` more wait (0: no bound; beyond,
        503); `timeout`: seconds a request may take from its arrival (0: no limit);
        `n_batch`: prompt tokens a step may take while no slot generates, where the
        requests do not go through a Flow (one server, one slot, or no pipeline);
        `prefill_chunk`: prompt tokens a step (a micro-batch of the Flow) may take
        beside other requests (0: a whole micro-batch, -ub), so that a new request's
        prompt holds each generating slot up for that many tokens' time at most."""
        self.model = model
        self.n_batch = n_batch
        chunk = PREFILL_CHUNK if prefill_chunk is None else prefill_chunk
        self.prefill_chunk = min(chunk or model.n_ubatch, model.n_ubatch)
        # several requests over a pipelined layer split go through a Flow (None: one by one)
        self.flow = model.flow() if n_slots > 1 else None
        self.pipelined = self.flow is not None
        self.slots = [Slot(model.seq)] + [Slot(model.new_sequence()) for _ in range(n_slots - 1)]
        self.max_queue, self.timeout = max_queue, timeout
        self.names = names
        self.template = template
        self.model_path = model_path
        self.stats = Stats()
        self.jobs: queue.Queue = queue.Queue()
        # the events of a step go out while the servers compute the next one (the
        # event loop's work then needs no GIL the worker wants), or before the worker idles
        self.outbox: list[tuple[Generation, tuple]] = []
        model.on_wait = self._flush
        self.worker = threading.Thread(target=self._work, name="serve-worker", daemon=True)
        self.worker.start()

    @staticmethod
    def chat_template(model, path: str | None = None) -> ChatTemplate:
        """The template of `path`, else the model's, else ChatML (as llama.cpp does)."""
        if path is None and not isinstance(model.file.meta.get("tokenizer.chat_template"), str):
            tok = model.tokenizer

            def text(i):
                return text_of(tok.tokens[i]) if i is not None and 0 <= i < tok.n_vocab else ""
            return ChatTemplate(CHATML, text(getattr(tok, "bos", None)), text(getattr(tok, "eos", None)))
        return ChatTemplate.from_gguf(model.file, model.tokenizer, path)

    def close(self) -> None:
        self.jobs.put(None)
        self.worker.join(30)

    # -- requests ------------------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        """The context of one slot."""
        return self.model.n_ctx // len(self.slots)

    @property
    def kv_tokens(self) -> int:
        """Tokens in the KV cache, every slot's."""
        return sum(s.seq.n_past for s in self.slots)

    def check_model(self, body: dict) -> None:
        name = field_of(body, "model", str)
        if name is not None and name not in self.names and name != self.model_path:
            raise ApiError(f"model '{name}' not found (this server has {', '.join(self.names)})",
                           "not_found_error")

    def render(self, body: dict) -> str:
        """The prompt text of a chat request (llama-server's /apply-template)."""
        if "messages" not in body:
            raise ApiError("'messages' is required")
        messages = body["messages"]
        if not isinstance(messages, list):
            raise ApiError("Expected 'messages' to be an array")
        if not messages:
            raise ApiError("'messages' must not be empty")
        for i, m in enumerate(messages):
            message_text(i, m)  # checked here; the template takes them as sent (parts stay
            #                     parts for templates that read them, as llama-server's)
        kwargs = field_of(body, "chat_template_kwargs", dict, {})
        add_gen = field_of(body, "add_generation_prompt", bool, True)
        tools = field_of(body, "tools", list)
        try:
            return self.template.render(messages, add_generation_prompt=add_gen, tools=tools, **kwargs)
        except TemplateError as e:
            raise ApiError(str(e)) from None
        except TypeError as e:          # a kwarg that collides with the template's own
            raise ApiError(f"chat_template_kwargs: {e}") from None

    def prompt_tokens(self, text: str) -> list[int]:
        """The tokens of a rendered chat prompt."""
        return prompt_text_tokens(self.model.tokenizer, text)

    def tokenize_mixed(self, content, add_special: bool, parse_special: bool) -> list[int]:
        """A string, or a list of strings and token ids (llama-server's tokenize_mixed)."""
        if isinstance(content, str):
            return self.model.tokenize(content, add_special, parse_special)
        if not isinstance(content, list):
            raise ApiError("'content'/'prompt' must be a string or an array of strings and token ids")
        out: list[int] = []
        for i, p in enumerate(content):
            if isinstance(p, str):
                out += self.model.tokenize(p, add_special and i == 0, parse_special)
            elif isinstance(p, int) and not isinstance(p, bool):
                out.append(self.check_token(p))
            else:
                raise ApiError("'content'/'prompt' must be a string or an array of strings and token ids")
        return out

    def check_token(self, t) -> int:
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.model.tokenizer.n_vocab:
            raise ApiError(f"invalid token {t!r}: the vocabulary has {self.model.tokenizer.n_vocab} tokens")
        return t

    def job(self, kind: str, body: dict, ids: list[int]) -> Job:
        """A job from an OpenAI request's generation fields."""
        n_prompt = len(ids)
        if n_prompt == 0:
            raise ApiError("the prompt is empty")
        if n_prompt >= self.n_ctx:
            raise ApiError(f"request ({n_prompt} tokens) exceeds the available context size "
                           f"({self.n_ctx} tokens), try increasing it", "exceed_context_size_error",
                           n_prompt_tokens=n_prompt, n_ctx=self.n_ctx)
        n_predict = -1
        for name in ("max_tokens", "max_completion_tokens", "n_predict"):
            v = field_of(body, name, int)
            if v is not None:
                n_predict = v
        room = self.n_ctx - n_prompt
        if n_predict > room:
            raise ApiError(f"request ({n_prompt} prompt tokens + {n_predict} to generate) exceeds the "
                           f"available context size ({self.n_ctx} tokens)", "exceed_context_size_error",
                           n_prompt_tokens=n_prompt, n_ctx=self.n_ctx)
        n_predict = room if n_predict < 0 else n_predict
        stop = body.get("stop")
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        elif not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise ApiError("Field 'stop': must be a string or an array of strings")
        seed = field_of(body, "seed", int, -1)
        sampling = dict(temp=float(field_of(body, "temperature", float, 0.8)),
                        top_k=field_of(body, "top_k", int, 40),
                        top_p=float(field_of(body, "top_p", float, 0.95)),
                        min_p=float(field_of(body, "min_p", float, 0.05)),
                        seed=None if seed < 0 else seed & 0xFFFFFFFF)
        if field_of(body, "ignore_eos", bool, False):
            sampling["banned"] = self.model.tokenizer.eog
        if kind == "chat":
            if field_of(body, "logprobs", bool, False):
                n_probs = field_of(body, "top_logprobs", int, 20)
            elif body.get("top_logprobs") is not None:
                raise ApiError("top_logprobs requires logprobs to be set to true")
            else:
                n_probs = 0
        else:
            n_probs = field_of(body, "logprobs", int, 0)
        n_probs = field_of(body, "n_probs", int, n_probs)
        if n_probs < 0:
            raise ApiError("Field 'n_probs': must not be negative")
        stream = field_of(body, "stream", bool, False)
        opts = field_of(body, "stream_options", dict, {})
        return Job(kind, ids, n_predict, sampling, [s.encode() for s in stop if s],
                   min(n_probs, self.model.tokenizer.n_vocab), stream,
                   bool(field_of(opts, "include_usage", bool, False)),
                   field_of(body, "cache_prompt", bool, True))

    def submit(self, job: Job) -> Generation:
        if self.max_queue and self.jobs.qsize() >= self.max_queue:
            raise ApiError(f"the server is busy: {self.max_queue} requests already wait", "unavailable_error")
        gen = Generation(job, asyncio.get_running_loop())
        self.jobs.put(gen)
        return gen

    @property
    def deferred(self) -> int:
        return self.jobs.qsize()

    # -- generation ------------------------------------------------------------------
    def _work(self) -> None:
        """The slots' loop (llama-server's continuous batching): each step runs one
        token of every generating slot and the next piece of a new prompt, as many
        tokens as a micro-batch holds (n_batch while no slot generates), in one
        Model.decode, or over a pipelined split one tick of the Flow (_flow_step); a
        request that ends frees its slot for the next in the queue at once. A fault
        of this loop fails the requests it runs, not the worker."""
        while True:
            try:
                if not self._turn():
                    return
            except Exception as e:
                log.exception("serve: the worker's step failed")
                self._recover(e)

    def _turn(self) -> bool:
        """Take the waiting requests that free slots can run, then one step; False
        once the engine closes."""
        free = [s for s in self.slots if s.gen is None]
        self.stats.processing = len(self.slots) - len(free)
        while free:
            if len(free) == len(self.slots):
                self._flush()
            try:
                gen = self.jobs.get(block=len(free) == len(self.slots))
            except queue.Empty:
                break
            if gen is None:
                return False
            if gen.cancelled.is_set():
                gen.put(("cancelled",))
                continue
            slot = max(free, key=lambda s: (common_prefix(s.seq.tokens, gen.job.ids[:-1]), -s.used))
            free.remove(slot)
            self._start(slot, gen)
        self.stats.processing = len(self.slots) - len(free)
        if len(free) < len(self.slots):
            self._step()
        return True

    def _recover(self, e: Exception) -> None:
        """After a fault of the loop: every running request fails with it, and what
        is in the Flow is dropped (its servers' answers read, or the Flow given up
        for one step at a time, as after a lost server)."""
        if self.flow:
            try:
                self.flow.clear()
            except Exception:
                self.flow = None
        busy = [s for s in self.slots if s.gen is not None]
        for s in self.slots:
            s.in_flight = s.sent = 0
        try:
            self._failed(busy, e)
        except Exception:       # the sequences could not even be reset: drop the requests
            for s in busy:
                if s.gen is not None:
                    self.outbox.append((s.gen, ("error", ApiError(f"internal error: {e}", "server_error"))))
                    s.gen = None
        self._flush()

    def _start(self, slot: "Slot", gen: Generation) -> None:
        job, seq = gen.job, slot.seq
        slot.gen, slot.used = gen, time.monotonic()
        slot.sent, slot.error = 0, None
        cached = seq.common(job.ids) if job.cache_prompt else 0
        try:
            if cached < seq.n_past:
                seq.truncate(cached) if cached else seq.reset()
        except ModelError:
            seq.reset()
            cached = 0
        slot.cached, slot.todo = cached, list(job.ids[cached:])
        # its pieces while no slot generates: as a decode of the prompts not yet run
        # (its own and the others') would cut them, the same size all along
        slot.piece = self.model.pipeline_ubatch(
            len(slot.todo) + sum(len(o.todo) for o in self.slots if o.gen is not None and o is not slot))
        slot.sampler, slot.text = Sampler(**job.sampling), Text(job.stop)
        slot.n_gen, slot.last = 0, None
        slot.t0, slot.t_prompt = time.perf_counter(), None
        slot.deadline = gen.t_submit + self.timeout if self.timeout > 0 else None

    def _step(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.gen is None or slot.in_flight:    # a slot in flight is seen when it lands
                continue
            if slot.gen.cancelled.is_set():
                self._end(slot, ("cancelled",))
            elif slot.expired(now):
                self._end(slot, ("error", ApiError(f"request timed out after {self.timeout:g} s",
                                                   "unavailable_error")))
        busy = [s for s in self.slots if s.gen is not None]
        if not busy:
            return
        if self.flow is not None and (self.flow or self._flows(busy)):
            return self._flow_step(busy)
        parts = [(s, [s.last]) for s in busy if not s.todo]
        room = min(self.model.n_ubatch - len(parts), self.prefill_chunk) if parts else self.n_batch
        for s in busy:
            if s.todo and room > 0:
                parts.append((s, s.todo[:room]))
                room -= len(parts[-1][1])
        if not parts:
            return
        try:
            logits = self.model.decode([(s.seq, toks) for s, toks in parts])
            self.stats.n_decode += 1
        except Exception as e:     # never lose the worker: every request of the step fails
            return self._failed([s for s, _ in parts], e)
        if self.flow is None and self.pipelined:
            self.flow = self.model.flow()     # a lost server is back
        for (slot, toks), lg in zip(parts, logits):
            self._landed(slot, toks, lg)

    def _flows(self, busy: list["Slot"]) -> bool:
        """Whether a step of `busy` goes through the Flow: every step but that of one
        request alone generating (its token's stages run one after the other either
        way). A prompt goes in pieces, several in flight at once, so that a request
        that comes in meanwhile joins the next micro-batch instead of waiting for the
        whole prompt (requests sent at once reach this thread a few milliseconds
        apart; a short prompt sent during a long one goes in first)."""
        return len(busy) > 1 or bool(busy[0].todo)

    def _flow_step(self, busy: list["Slot"]) -> None:
        """A step over a pipelined layer split: the requests go in groups, one group
        per server, each group's micro-batch a stage behind the one before it; a
        generating slot's next token joins as soon as its last one lands, and the next
        piece of a prompt as soon as the first server is free (one slot's pieces
        follow each other through the servers in order). One tick of the Flow: every
        server runs one micro-batch."""
        now = time.monotonic()
        ready = [s for s in busy if s.ready(now)]
        if ready and self.flow.starts_now():
            share = -(-len(busy) // self.flow.depth)
            # beside other requests, every micro-batch's piece of prompt is short: a tick
            # lasts as long as its longest micro-batch, a generating slot gets a token
            # every `depth` ticks, and a request that comes in waits for the micro-batch
            # on the first server; with no slot generating, pieces as a decode of the
            # prompts would cut them where those are shorter (enough of them to keep
            # every server busy)
            parts, room = [], self.model.n_ubatch
            prompt = self.prefill_chunk if len(busy) > 1 else room
            if all(s.todo for s in busy):     # as a decode of what is left would cut it, no smaller
                waiting = self.model.pipeline_ubatch(sum(len(s.todo) for s in busy))
                prompt = min(prompt, max(waiting, min(s.piece for s in busy)))
            # a share of the generating slots (the groups), then pieces of the prompts in
            # every micro-batch while there are any: the shortest rest first (a short
            # prompt that comes in during a long one does not wait for all of it), then
            # in the order they came; the oldest keeps half the budget, so that new
            # short prompts never starve it
            for s in [s for s in ready if not s.todo][:share]:
                parts.append((s, [s.last]))
                room -= 1
            prompts = sorted((s for s in ready if s.todo), key=lambda s: (len(s.todo) - s.sent, s.gen.t_submit))
            oldest = min(prompts, key=lambda s: s.gen.t_submit) if prompts else None
            keep = min(len(oldest.todo) - oldest.sent, prompt // 2) if prompts and oldest is not prompts[0] else 0
            for s in prompts:
                if s is oldest:
                    keep = 0
                toks = s.todo[s.sent:s.sent + max(0, min(room, prompt) - keep)]
                if toks:
                    parts.append((s, toks))
                    prompt -= len(toks)
                    room -= len(toks)
            try:
                if parts:
                    self.model.add_to(self.flow, [(s.seq, toks) for s, toks in parts], parts)
            except Exception as e:     # these requests fail; one with a piece in flight once it lands
                for s, _ in parts:
                    s.error = e
                self._failed([s for s, _ in parts if not s.in_flight], e)
            else:
                for s, toks in parts:
                    s.in_flight += 1
                    if s.todo:
                        s.sent += len(toks)
            if not self.flow:
                return
        try:
            landed = self.flow.tick(self._land)
        except Exception as e:     # every request in flight fails
            dropped = list(dict.fromkeys(s for mb in self.flow.clear() for s, _ in mb.tag))
            for s in dropped:
                s.in_flight = s.sent = 0
            self.flow = None       # one by one from now: that is where a lost server comes back
            return self._failed(dropped, e)
        self.stats.n_decode += len(landed)

    def _land(self, mb) -> None:
        """A micro-batch of the Flow came out (its other answers still on their way):
        its requests' tokens are sampled, and the next token of those that go on is
        added to the Flow at once (it goes to the first server behind what that
        server runs). A group of decode steps stays together: its requests took
        turns with the other groups' so far, and go on doing so. A group whose
        prompts ended here, or any step while a prompt waits, is made between ticks
        (_flow_step), where the groups take their shares and prompts their pieces."""
        now = time.monotonic()
        again, decode = [], True
        for (slot, toks), lg in zip(mb.tag, mb.logits):
            decode = decode and not slot.todo
            slot.in_flight -= 1
            if slot.todo:
                slot.sent -= len(toks)
            if slot.error is not None or slot.gen.cancelled.is_set():
                if not slot.in_flight:     # its later pieces land first
                    if slot.error is not None:
                        self._failed([slot], slot.error)
                    else:
                        self._end(slot, ("cancelled",))
                continue
            self._landed(slot, toks, lg)
            if slot.gen is not None and not slot.todo and slot.ready(now):
                again.append(slot)
        if again and decode and not self._pending():
            parts = [(s, [s.last]) for s in again]
            try:
                self.model.add_to(self.flow, [(s.seq, toks) for s, toks in parts], parts)
            except Exception as e:     # these requests fail
                self._failed(again, e)
                return
            for s in again:
                s.in_flight += 1

    def _pending(self) -> bool:
        """Whether a prompt waits to go in (a piece of a running request's, or a new
        request a free slot can take): then the next micro-batch is made between ticks,
        where prompts and decode steps share it, not at once for the decode steps
        alone (a request sent while the others generate would wait for them all)."""
        free = False
        for s in self.slots:
            if s.gen is None:
                free = True
            elif s.todo and len(s.todo) > s.sent and s.error is None:
                return True
        return free and not self.jobs.empty()

    def _failed(self, slots: list["Slot"], e: Exception) -> None:
        msg = (f"generation failed: {e}" if isinstance(e, (ModelError, GgmlRpcError))
               else f"internal error: {type(e).__name__}: {e}")
        for s in slots:
            s.seq.reset()
            self._end(s, ("error", ApiError(msg, "server_error")))

    def _landed(self, slot: "Slot", toks: list[int], logits: np.ndarray) -> None:
        """A slot's tokens ran: the next piece of its prompt waits, or its next token
        is sampled from `logits`."""
        if slot.todo:
            del slot.todo[:len(toks)]
            if slot.todo:
                return            # more of the prompt to run
            slot.t_prompt = time.perf_counter()
        try:
            self._token(slot, logits)
        except Exception as e:     # never lose the worker
            slot.seq.reset()
            self._end(slot, ("error", ApiError(f"internal error: {type(e).__name__}: {e}", "server_error")))

    def _token(self, slot: "Slot", logits: np.ndarray) -> None:
        """Sample the slot's next token from `logits`, send its text, end the request
        where it stops."""
        job, tok = slot.gen.job, self.model.tokenizer
        if job.n_predict <= slot.n_gen:
            slot.seq.stop_reason = "length"
            return self._finish(slot)
        t = slot.sampler(logits)
        slot.n_gen += 1
        slot.last = t
        piece = tok.token_to_piece(t)
        out = slot.text.add(piece, tok.is_eog(t))
        probs = self._probs(t, logits, job.n_probs) if job.n_probs else None
        if out or probs is not None:
            self.outbox.append((slot.gen, ("token", out, probs)))
            if slot.n_gen == 1:
                self._flush()       # the first token at once: time to first token
        slot.seq.stop_reason = self.model.stop_after(slot.seq, t, slot.n_gen, job.n_predict)
        if slot.text.stopped or slot.seq.stop_reason:
            self._finish(slot)

    def _end(self, slot: "Slot", event: tuple) -> None:
        if event[0] == "cancelled":
            slot.seq.reset()        # the client is gone: its context is freed
        self.outbox.append((slot.gen, event))
        slot.gen = None

    def _flush(self) -> None:
        """Hand the step's events to their event loops: one wake-up per loop, not one
        per event (each wake-up is a write to the loop's self-pipe, and the woken loop
        takes the GIL from this thread while it runs the callback)."""
        out, self.outbox = self.outbox, []
        by_loop: dict = {}
        for gen, ev in out:
            by_loop.setdefault(gen.loop, []).append((gen, ev))
        for loop, evs in by_loop.items():
            deliver(loop, evs)

    def _finish(self, slot: "Slot") -> None:
        job, st, text = slot.gen.job, self.stats, slot.text
        t1 = time.perf_counter()
        t_prompt = slot.t_prompt or t1
        t0, cached, n_gen = slot.t0, slot.cached, slot.n_gen
        n_eval = len(job.ids) - cached
        st.prompt_tokens += n_eval
        st.prompt_cached += cached
        st.prompt_seconds += t_prompt - t0
        st.predicted += n_gen
        st.predicted_seconds += t1 - t_prompt
        st.n_tokens_max = max(st.n_tokens_max, len(job.ids) + n_gen)
        b = st.bucket
        b[0] += n_eval
        b[1] += t_prompt - t0
        b[2] += n_gen
        b[3] += t1 - t_prompt
        reason = "stop" if text.stopped or slot.seq.stop_reason == "eog" else "length"
        rest = text.rest()
        if job.kind == "chat" or job.stream:
            # a character cut by the end: llama-server's chat messages and streams leave
            # it out (a whole text completion keeps its bytes, shown as U+FFFD)
            rest = rest[:utf8_complete(rest)]
        prompt_ms, gen_ms = (t_prompt - t0) * 1e3, (t1 - t_prompt) * 1e3
        self._end(slot, ("done", {
            "rest": rest,
            "finish_reason": reason,
            "usage": {"completion_tokens": n_gen, "prompt_tokens": len(job.ids),
                      "total_tokens": n_gen + len(job.ids),
                      "prompt_tokens_details": {"cached_tokens": cached}},
            "timings": {"cache_n": cached, "prompt_n": n_eval, "prompt_ms": prompt_ms,
                        "prompt_per_token_ms": prompt_ms / max(n_eval, 1),
                        "prompt_per_second": 1e3 * n_eval / prompt_ms if prompt_ms else 0.0,
                        "predicted_n": n_gen, "predicted_ms": gen_ms,
                        "predicted_per_token_ms": gen_ms / max(n_gen, 1),
                        "predicted_per_second": 1e3 * n_gen / gen_ms if gen_ms else 0.0},
        }))

    def _probs(self, t: int, logits: np.ndarray, n: int) -> dict:
        """llama-server's probabilities before sampling: the soft-max of every logit,
        the drawn token's and the `n` highest."""
        x = logits.astype(np.float32)
        p = np.exp(x - x.max())
        p /= p.sum()
        top = np.argpartition(-p, n - 1)[:n] if n < p.size else np.arange(p.size)
        top = top[np.lexsort((top, -p[top]))]
        tok = self.model.tokenizer

        def entry(i: int) -> dict:
            piece = tok.token_to_piece(int(i))
            pi = float(p[i])
            return {"id": int(i), "token": token_text(piece), "bytes": list(piece),
                    "logprob": float(np.log(p[i])) if pi > 0 else -3.4028234663852886e38}

        return {**entry(t), "top_logprobs": [entry(i) for i in top]}


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def default_names(path: str, alias: str | None) -> list[str]:
    if alias:
        return [a.strip() for a in alias.split(",") if a.strip()]
    return [os.path.basename(path)]
