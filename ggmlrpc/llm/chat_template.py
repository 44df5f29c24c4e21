"""Chat templates: the Jinja2 template a GGUF stores (`tokenizer.chat_template`) or one
given by file, rendered in a sandbox with the globals and filters real templates use,
so that a conversation becomes the prompt llama.cpp's server would build for it."""
from __future__ import annotations

import datetime
import json

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .gguf_file import ModelError


class TemplateError(ModelError):
    """A template that does not parse, or that raised while rendering."""


def _raise(message):
    raise TemplateError(f"chat template raised: {message}")


def _tojson(value, indent=None, ensure_ascii=False, separators=None, sort_keys=False):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, separators=separators,
                      sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    return env


class ChatTemplate:
    """A compiled chat template and the special tokens it is rendered with."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        self.source = source
        self.bos_token, self.eos_token = bos_token, eos_token
        try:
            self._t = _environment().from_string(source)
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template does not parse: {e}") from None

    @classmethod
    def from_gguf(cls, file, tokenizer, path: str | None = None) -> "ChatTemplate":
        """The template of `path` if given, else the model's own; the model's BOS and
        EOS token texts."""
        if path is not None:
            try:
                with open(path, encoding="utf-8") as f:
                    source = f.read()
            except OSError as e:
                raise TemplateError(f"cannot read chat template file: {e}") from None
        else:
            source = file.meta.get("tokenizer.chat_template")
            if not isinstance(source, str):
                raise TemplateError("the model has no chat template (give one with --chat-template-file)")
        def text(tid):
            if tid is None or not 0 <= tid < tokenizer.n_vocab:
                return ""
            return tokenizer.tokens[tid].decode("utf-8", "replace")   # token texts are bytes
        return cls(source, text(getattr(tokenizer, "bos", None)), text(getattr(tokenizer, "eos", None)))

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools=None,
               **extra) -> str:
        ctx = dict(messages=messages, add_generation_prompt=add_generation_prompt,
                   bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        if tools is not None:
            ctx["tools"] = tools
        try:
            return self._t.render(**ctx)
        except TemplateError:
            raise
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template failed: {e}") from None
