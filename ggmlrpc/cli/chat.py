"""`ggml-rpc-cli chat`: a conversation in the terminal, as llama-cli holds one, with
the model's layers on RPC servers.

Each turn renders the whole conversation with the chat template (the model's, or
--chat-template-file's) and runs only what the context does not hold yet. When the
rendering extends the text the context holds (the last prompt and its answer as
the tokens were drawn), only the extension is tokenized, as llama.cpp's
conversation mode does: the answer's tokens stay as drawn even where tokenizing
their text would cut it differently, so a new turn prefills its own tokens and no
more. Otherwise (a template that rewrites earlier turns, /clear) the whole rendering
is tokenized and `Model.prefill` keeps the longest common prefix.

Ctrl-C stops the answer being written (what it wrote stays in the conversation, as
in llama-cli); a second one, or one at the prompt, leaves. A context that fills up
ends the conversation with a line saying so, and a new one starts (the system
prompt kept).
"""
from __future__ import annotations

import argparse
import importlib
import signal
import sys
import time

from .common import CliError
from .run import Progress, add_model_args, add_sampling_args, load_model, running, seed_of

HELP = """\
  /exit or Ctrl-D     leave (Ctrl-C at the prompt too)
  Ctrl-C              stop the answer being written
  /regen              write the last answer again
  /clear              start a new conversation (the system prompt stays)
  /read FILE          add a text file to the next message
  a line ending in \\ goes on on the next line
"""




def kept_by_prefill(model, ids: list[int]) -> int:
    """How many of `ids` `model.prefill` will keep from the context rather than run
    (for the speed line): the longest common prefix short of the last token, none
    where a sliding-window cache would have to drop tokens."""
    keep = 0
    for x, y in zip(model.tokens, ids[:-1]):
        if x != y:
            break
        keep += 1
    return 0 if keep < len(model.tokens) and model.swa is not None else keep


class Chat:
    """A conversation: its messages, and the text and tokens the context holds (the
    last token drawn may still wait to run: the next prefill runs it)."""

    def __init__(self, model, template, a, system: str, out=None):
        self.model, self.template, self.a, self.system = model, template, a, system
        self.out = out if out is not None else sys.stdout.buffer
        self.answering = self.interrupted = False
        self.last_prompt: tuple[str, list[int]] = ("", [])
        self.clear()

    def clear(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.held_text, self.held_ids = "", []

    def say(self, text: str | bytes) -> None:
        self.out.write(text.encode() if isinstance(text, str) else text)
        self.out.flush()

    @staticmethod
    def error(text: str) -> None:
        print(f"error: {text}", file=sys.stderr, flush=True)

    def on_sigint(self, signum, frame) -> None:
        """The first Ctrl-C stops the answer between two tokens (a request to a server
        is never cut in half); a second one, or one at the prompt, leaves."""
        if self.answering and not self.interrupted:
            self.interrupted = True
        else:
            raise KeyboardInterrupt

    # -- a turn ----------------------------------------------------------------
    def prompt(self) -> tuple[str, list[int]]:
        """The conversation rendered for the next answer, and its tokens."""
        text = self.template.render(self.messages, add_generation_prompt=True)
        if self.held_text and text.startswith(self.held_text):
            new = text[len(self.held_text):]
            ids = self.model.tokenize(new, add_special=False, parse_special=True) if new else []
            return text, self.held_ids + ids
        from ..llm.chat_template import prompt_text_tokens
        return text, prompt_text_tokens(self.model.tokenizer, text)

    def turn(self, message: str | None) -> None:
        """Add the user's message (None: write the last answer again) and answer."""
        n_ctx = self.model.n_ctx
        if message is not None:
            self.messages.append({"role": "user", "content": message})
        text, ids = self.prompt()
        if len(ids) >= n_ctx and message is not None and len(self.messages) > 1 + bool(self.system):
            self.context_full()
            self.messages.append({"role": "user", "content": message})
            text, ids = self.prompt()
        if len(ids) >= n_ctx:
            self.messages.pop()
            self.error(f"the message does not fit the context ({len(ids)} tokens, the context holds {n_ctx})")
            return
        self.answer(text, ids)

    def answer(self, text: str, ids: list[int]) -> None:
        from ..llm.sampling import Sampler

        model, tok, a = self.model, self.model.tokenizer, self.a
        self.last_prompt = (text, ids)
        n_prompt = len(ids) - kept_by_prefill(model, ids)
        sampler = Sampler(a.temp, a.top_k, a.top_p, a.min_p, seed_of(a),
                          banned=tok.eog if a.ignore_eos else ())
        drawn: list[int] = []
        tail = b""       # the last piece shown
        t0 = time.perf_counter()
        t_first = t_last = t0
        self.interrupted, self.answering = False, True
        try:
            for t, _ in model.stream(ids, a.n_predict, sampler, reuse=True):
                t_last = time.perf_counter()
                if not drawn:
                    t_first = t_last
                drawn.append(t)
                piece = tok.token_to_piece(t).split(b"\0", 1)[0]   # as C strings print
                tail = piece or tail
                self.say(piece)
                if self.interrupted:
                    break
        finally:
            self.answering = False
        written = b"".join(tok.token_to_piece(t) for t in drawn)
        self.messages.append({"role": "assistant", "content": written.decode("utf-8", "replace")})
        spelled = b"".join(tok.token_to_piece(t, special=True) for t in drawn)
        self.held_text = text + spelled.decode("utf-8", "replace")
        self.held_ids = ids + drawn
        if not tail.endswith(b"\n"):
            self.say("\n")
        if a.show_timings:
            pp = n_prompt / max(t_first - t0, 1e-9)
            tg = (len(drawn) - 1) / (t_last - t_first) if len(drawn) > 1 and t_last > t_first else 0.0
            self.say(f"\n[ Prompt: {n_prompt} tokens, {pp:.1f} t/s | "
                     f"Generation: {len(drawn)} tokens, {tg:.1f} t/s ]\n")
        if model.stop_reason == "context" and not self.interrupted:
            self.context_full()

    def context_full(self) -> None:
        self.say(f"\n[ context full ({self.model.n_ctx} tokens): the conversation starts over"
                 f"{', the system prompt kept' if self.system else ''} ]\n")
        self.clear()

    # -- the loop --------------------------------------------------------------
    def read(self) -> str | None:
        """The user's next message; None at the end of input."""
        self.say("\n")
        lines = []
        try:
            line = input("> ")
            while line.endswith("\\"):
                lines.append(line[:-1])
                line = input()
        except EOFError:
            self.say("\n")
            return None
        lines.append(line)
        return "\n".join(lines)

    def run(self, first: str = "", single_turn: bool = False) -> int:
        from ..llm.gguf_file import ModelError

        name = self.model.file.path.name
        self.say(f"\nchatting with {name} (context {self.model.n_ctx} tokens)\n"
                 + ("using the system prompt given\n" if self.system else "") + "\n" + HELP)
        pending = ""     # files read for the next message
        while True:
            if first:
                message, first = first, ""
                self.say(f"\n> {message}\n")
            else:
                try:
                    message = self.read()
                except KeyboardInterrupt:
                    self.say("\n")
                    message = None
                if message is None:
                    break
            if not message:
                continue
            if message.startswith("/exit"):
                break
            if message.startswith("/clear"):
                self.clear()
                pending = ""
                self.say("the conversation starts over\n")
                continue
            if message.startswith("/read "):
                path = message[6:].strip()
                try:
                    with open(path, "rb") as f:
                        content = f.read().decode("utf-8", "replace")
                except OSError as e:
                    self.error(f"cannot read {path}: {e.strerror}")
                    continue
                pending += f"--- File: {path} ---\n{content}"
                self.say(f"read {path} ({len(content)} characters) for the next message\n")
                continue
            if message.startswith("/regen"):
                if not self.messages or self.messages[-1]["role"] != "assistant":
                    self.error("no answer to write again")
                    continue
                self.messages.pop()
                self.held_text, self.held_ids = self.last_prompt
                message = None
            else:
                message, pending = pending + message, ""
            try:
                self.turn(message)
            except ModelError as e:      # a template that refuses the conversation
                if message is not None and self.messages and self.messages[-1]["role"] == "user":
                    self.messages.pop()
                self.error(str(e))
                continue
            if single_turn:
                break
        self.say("\nExiting...\n")
        return 0


def read_text(path: str, what: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError as e:
        raise CliError(f"cannot read {what}: {e}") from None


def cmd_chat(a) -> int:
    from ..llm.chat_template import ChatTemplate
    from ..llm.gguf_file import GGUFFile, ModelError

    system = read_text(a.system_file, "system prompt file") if a.system_file else a.system
    try:    # a missing or broken template shows before the weights upload
        f = GGUFFile(a.model)
        try:
            ChatTemplate.from_gguf(f, None, a.chat_template_file)
        finally:
            f.close()
    except ModelError as e:
        raise CliError(str(e)) from None
    model = load_model(a, Progress(), warm_up=True)
    with running(model):
        template = ChatTemplate.from_gguf(model.file, model.tokenizer, a.chat_template_file)
        chat = Chat(model, template, a, system)
        if sys.stdin.isatty():
            try:
                importlib.import_module("readline")     # line editing and history for input()
            except ImportError:
                pass
        signal.signal(signal.SIGINT, chat.on_sigint)
        return chat.run(a.prompt, a.single_turn)


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="a conversation in the terminal (llama-cli's)")
    add_model_args(p)
    add_sampling_args(p)
    p.add_argument("-sys", "--system-prompt", dest="system", default="", help="system prompt")
    p.add_argument("-sysf", "--system-prompt-file", dest="system_file", default=None,
                   help="read the system prompt from a file")
    p.add_argument("--chat-template-file", default=None,
                   help="Jinja chat template to use (default: the model's)")
    p.add_argument("-p", "--prompt", default="", help="the first message")
    p.add_argument("-st", "--single-turn", action="store_true", help="leave after the first answer")
    p.add_argument("--show-timings", dest="show_timings", action=argparse.BooleanOptionalAction,
                   default=True, help="a line of prompt and generation speed after each answer")
    p.add_argument("--no-warmup", dest="no_warmup", action="store_true",
                   help="skip the warm-up step (BOS and EOS through every server) before the first turn")
    for flag in ("-cnv", "--conversation", "--jinja", "--simple-io"):
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)  # llama-cli's, no-ops
    p.set_defaults(func=cmd_chat)
