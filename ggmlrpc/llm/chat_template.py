"""Chat templates: the Jinja2 template a GGUF stores (`tokenizer.chat_template`) or one
given by file, rendered in a sandbox so that a conversation becomes, byte for byte, the
prompt llama.cpp's server (`llama-server --jinja`) builds for it.

llama.cpp renders with its own Jinja engine (common/jinja) after preparing the inputs
(common/chat.cpp). The parts that change the bytes, reproduced here:

- the messages are re-read the OpenAI way and written back in one shape: role, content
  ("" when null or absent), reasoning_content / name / tool_call_id when not empty,
  tool_calls as {type, function: {name, arguments}, id}; tools as {type, function:
  {name, description, parameters}};
- what the template can do is probed once (its "caps"), by rendering it on fixed
  conversations and watching which inputs it reads: a template that never reads a
  system message gets it merged into the next message, one that reads tool-call
  arguments as an object gets string arguments parsed, one that only handles string
  content gets content parts joined with newlines (and one that only handles parts
  gets strings wrapped);
- the globals: bos_token, eos_token, enable_thinking, tools (when any), datetime and
  date_string (today, local time), add_generation_prompt (only when true), the
  chat_template_kwargs, raise_exception, strftime_now;
- printing: none, undefined and objects print nothing, a list prints its items run
  together, floats as C's %f without trailing zeros, tojson keeps key order and writes
  ", " / ": " separators, non-ASCII as is and floats as %g;
- a leading BOS text is cut when the vocabulary adds BOS itself (and a trailing EOS
  text when it adds EOS); a trailing assistant message is continued, not closed, its
  reasoning reopened with the markers llama.cpp's autoparser finds in the template;
- a model's "tool_use" template is taken for conversations with tools.

Jinja2 runs in ImmutableSandboxedEnvironment (lists may be appended to and popped
from, as llama.cpp allows; nothing else changes a value) with trim_blocks,
lstrip_blocks and loop controls (the settings llama.cpp's lexer applies). Missing
values are as lenient as llama.cpp's: `a.b.c` of something missing is missing, not an
error, `missing.items()` is empty, and a string plus none or missing is the string."""
from __future__ import annotations

import copy
import datetime
import functools
import json
import re
import time

import jinja2
import jinja2.ext
from jinja2 import pass_environment
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from .gguf_file import ModelError


class TemplateError(ModelError):
    """A template that does not parse, that raised while rendering, or messages it cannot
    take (the message says which)."""


CHATML = ("{%- for message in messages -%}\n"
          "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
          "{%- endfor -%}\n"
          "{%- if add_generation_prompt -%}\n"
          "  {{- '<|im_start|>assistant\n' -}}\n"
          "{%- endif -%}")

# checks in real templates that llama.cpp switches off before compiling them, because
# they reject the histories its server sends (gpt-oss, Mistral's [TOOL_CALLS] ones)
_PATCHES = (
    (("<|channel|>", "in message.content or"),
     "{%- if \"<|channel|>analysis<|message|>\" in message.content or "
     "\"<|channel|>final<|message|>\" in message.content %}"),
    (("[TOOL_CALLS]", "if (message['content'] is none or"),
     "{%- if (message['content'] is none or message['content'] == '' or "
     "message['content']|length == 0) and (message['tool_calls'] is not defined or "
     "message['tool_calls'] is none or message['tool_calls']|length == 0) %}"),
)


# -- values as llama.cpp's engine prints them -----------------------------------------

def _float_text(v: float) -> str:
    s = f"{v:f}".rstrip("0")
    return s + "0" if s.endswith(".") else s


def _output(v) -> str:
    """What `{{ v }}` writes: strings and numbers, a list's items run together, nothing
    for none, undefined, objects and functions."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _float_text(v)
    if isinstance(v, (list, tuple)):
        return "".join(_output(x) for x in v)
    return ""


def _json_str(s: str, ensure_ascii: bool) -> str:
    out = ['"']
    for ch in str(s):
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch in "\b\f\n\r\t":
            out.append({"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch])
        elif o < 0x20:
            out.append(f"\\u{o:04x}")
        elif ensure_ascii and o >= 0x80:
            if o > 0xFFFF:
                o -= 0x10000
                out.append(f"\\u{0xD800 + (o >> 10):04x}\\u{0xDC00 + (o & 0x3FF):04x}")
            else:
                out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def to_json(v, indent: int | None = None, item_sep: str | None = None, key_sep: str = ": ",
            ensure_ascii: bool = False, _level: int = 0) -> str:
    """JSON the way llama.cpp's `tojson` writes it: keys in their order, ", " and ": "
    (or "," and ": " when indented), floats as %g, undefined as null."""
    ind = -1 if indent is None else indent
    if item_sep is None:
        item_sep = ", " if ind < 0 else ","
    nl = "\n" if ind >= 0 else ""
    pad = " " * (ind * _level) if ind > 0 else ""
    step = " " * ind if ind > 0 else ""
    if v is None or isinstance(v, jinja2.Undefined):
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "%g" % v
    if isinstance(v, str):
        return _json_str(v, ensure_ascii)
    sub = dict(indent=indent, item_sep=item_sep, key_sep=key_sep, ensure_ascii=ensure_ascii,
               _level=_level + 1)
    if isinstance(v, (list, tuple)):
        if not v:
            return "[]"
        items = [pad + step + to_json(x, **sub) for x in v]
        return "[" + nl + (item_sep + nl).join(items) + nl + pad + "]"
    if isinstance(v, dict):
        if not v:
            return "{}"
        items = [pad + step + _json_str(str(k), ensure_ascii) + key_sep + to_json(x, **sub)
                 for k, x in v.items()]
        return "{" + nl + (item_sep + nl).join(items) + nl + pad + "}"
    return "null"


# -- the sandbox ------------------------------------------------------------------------

class _Probe:
    """What a template read while rendering a capability probe (llama.cpp keeps the
    same record on its values: which were used, and how)."""

    def __init__(self):
        self.keys: set = set()      # (id(container), key) read
        self.ops: dict = {}         # id(value) -> {"string", "array", "iterated"}
        self.deep: set = set()      # ids written out whole (tojson, string)

    def op(self, v, name):
        self.ops.setdefault(id(v), set()).add(name)

    def mark_deep(self, v):
        self.deep.add(id(v))
        for x in (v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()):
            self.mark_deep(x)

    def used(self, container, key) -> bool:
        return ((id(container), key) in self.keys or id(container) in self.deep
                or "iterated" in self.ops.get(id(container), ()))


class _Probed:
    """A container whose iteration its probe sees, as the op `_walk`."""

    _walk = ""

    def __init__(self, items, probe):
        super().__init__(items)
        self._probe = probe

    def _seen(self):
        self._probe.op(self, self._walk)

    def __iter__(self):
        self._seen()
        return super().__iter__()


class _PList(_Probed, list):
    """A list whose iteration a probe sees."""

    _walk = "array"


class _PDict(_Probed, dict):
    """A dict whose walking over (items, values, keys) a probe sees."""

    _walk = "iterated"

    def items(self):
        self._seen()
        return super().items()

    def values(self):
        self._seen()
        return super().values()


class _PStr(str):
    """Content given as a string to a template that may treat it as a list of parts:
    llama.cpp cannot iterate a string, so neither can this."""

    iterated = False

    def __iter__(self):
        self.iterated = True
        raise TypeError("cannot iterate over a string")


def _probe_value(v, probe):
    if isinstance(v, dict):
        return _PDict({k: _probe_value(x, probe) for k, x in v.items()}, probe)
    if isinstance(v, list):
        return _PList([_probe_value(x, probe) for x in v], probe)
    return v


_soft_str = jinja2.filters.FILTERS["string"]

# what llama.cpp's undefined answers to its methods: empty lists, strings and counts
_UNDEFINED_METHODS = dict.fromkeys(
    ("items", "list", "map", "reject", "rejectattr", "reverse", "select", "selectattr", "sort",
     "unique"), list) | dict.fromkeys(
    ("capitalize", "join", "lower", "replace", "safe", "string", "strip", "title", "truncate",
     "upper"), str) | dict.fromkeys(("length", "sum", "wordcount"), int)


class _Undefined(jinja2.ChainableUndefined):
    """Something missing, as llama.cpp has it: its attributes and items are missing
    too, and `missing.items()` (and the like) is empty rather than an error."""
    __slots__ = ()

    def __getattr__(self, name):
        if name in _UNDEFINED_METHODS:
            empty = _UNDEFINED_METHODS[name]
            return lambda *args, **kwargs: empty()
        return super().__getattr__(name)


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (Hugging Face's marker of the
    assistant's text) writes its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


class _Env(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["+"])
    probe: _Probe | None = None

    def getitem(self, obj, argument):
        if self.probe is not None:
            self.probe.keys.add((id(obj), argument))
            if isinstance(argument, int) and not isinstance(obj, dict):
                self.probe.op(obj, "array")
        return super().getitem(obj, argument)

    def getattr(self, obj, attribute):
        if self.probe is not None:
            self.probe.keys.add((id(obj), attribute))
        return super().getattr(obj, attribute)

    def is_safe_attribute(self, obj, attr, value):
        # llama.cpp's engine lets a template append to and pop from a list (Kimi K2's
        # do); nothing else that changes a value. The inputs are copies made per render.
        if isinstance(obj, list) and attr in ("append", "pop"):
            return True
        return super().is_safe_attribute(obj, attr, value)

    def unsafe_undefined(self, obj, attribute):
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__} is not allowed")

    def call_binop(self, context, operator, left, right):
        # llama.cpp: a string plus none or undefined is the string
        missing = (type(None), jinja2.Undefined)
        if isinstance(left, str) and isinstance(right, missing):
            return left
        if isinstance(right, str) and isinstance(left, missing):
            return right
        return super().call_binop(context, operator, left, right)


_MARKER = r"(?:<[^>]*>|\[[^\]]*\])"
_WS = " \t\r\n"


def _is_marker(seg: str) -> bool:
    return len(seg) > 1 and (seg[0], seg[-1]) in (("<", ">"), ("[", "]"))


def _segments(text: str) -> list[str]:
    """Text cut into markers (`<...>`, `[...]`) and the text between them."""
    return re.findall(r"<[^>]*>|\[[^\]]*\]|[^<\[]+|[<\[]", text)


def _segment_diff(a: str, b: str) -> tuple[str, str]:
    """What differs between two texts once the segments they start and end with alike
    are set aside: (a's part, b's part)."""
    sa, sb = _segments(a), _segments(b)
    i = 0
    while i < min(len(sa), len(sb)) and sa[i] == sb[i]:
        i += 1
    j = 0
    while j < min(len(sa), len(sb)) - i and sa[-1 - j] == sb[-1 - j]:
        j += 1
    return "".join(sa[i:len(sa) - j]), "".join(sb[i:len(sb) - j])


def _raise(message):
    raise TemplateError(f"chat template raised: {message}")


@pass_environment
def _tojson(env, value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    if env.probe is not None:
        env.probe.mark_deep(value)
    if sort_keys:
        raise TemplateError("chat template failed: tojson sort_keys=true is not supported")
    seps = list(separators) if isinstance(separators, (list, tuple)) else []
    return to_json(value, indent=indent if isinstance(indent, int) else None,
                   item_sep=seps[0] if seps else None, key_sep=seps[1] if len(seps) > 1 else ": ",
                   ensure_ascii=bool(ensure_ascii))


@pass_environment
def _string(env, value):
    if env.probe is not None and isinstance(value, (dict, list)):
        env.probe.mark_deep(value)
    return _output(value) if isinstance(value, (bool, float)) else _soft_str(value)


@jinja2.pass_context
def _selectattr(context, value, *args):
    if context.environment.probe is not None:
        context.environment.probe.op(value, "array")
    return jinja2.filters.FILTERS["selectattr"](context, value, *args)


@pass_environment
def _is_string(env, value):
    if env.probe is not None:
        env.probe.op(value, "string")
    return isinstance(value, str)


def _environment() -> _Env:
    env = _Env(trim_blocks=True, lstrip_blocks=True, undefined=_Undefined,
               extensions=["jinja2.ext.loopcontrols", _Generation], finalize=_output)
    env.globals.update(raise_exception=_raise, tojson=_tojson,
                       strftime_now=lambda fmt: time.strftime(str(fmt)))
    env.filters.update(tojson=_tojson, string=_string, selectattr=_selectattr)
    env.tests["string"] = _is_string
    return env


# -- the inputs as llama.cpp's server prepares them ---------------------------------------

def _bad(msg):
    raise TemplateError(msg)


def normalize_messages(messages) -> list[dict]:
    """OpenAI-style messages in the one shape llama.cpp hands its templates."""
    if not isinstance(messages, list):
        _bad("'messages' must be an array")
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            _bad("each message must be an object with a string 'role'")
        if "content" not in m and (m["role"] != "assistant" or "tool_calls" not in m):
            _bad("a message needs 'content' (an assistant's may have 'tool_calls' instead)")
        j = {"role": m["role"]}
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for p in content:
                if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                    _bad("content parts must be objects of type 'text' with a string 'text'")
                parts.append({"type": "text", "text": p["text"]})
            j["content"] = parts if parts else ""
        elif isinstance(content, str) or content is None:
            j["content"] = content or ""
        else:
            _bad("'content' must be a string, an array of parts or null")
        for key in ("reasoning_content", "name", "tool_call_id"):
            v = m.get(key)
            if v is not None and not isinstance(v, str):
                _bad(f"'{key}' must be a string")
            if v:
                j[key] = v
        calls = m.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                _bad("'tool_calls' must be an array")
            j["tool_calls"] = [_tool_call(c) for c in calls]
        out.append(j)
    return out


def _tool_call(c) -> dict:
    if not isinstance(c, dict) or c.get("type") != "function" or not isinstance(c.get("function"), dict):
        _bad("each tool call must be an object of type 'function' with a 'function' object")
    f = c["function"]
    if not isinstance(f.get("name"), str):
        _bad("a tool call's function needs a string 'name'")
    args = f.get("arguments")
    if not isinstance(args, str):   # llama.cpp keeps arguments as compact JSON text
        args = json.dumps(args, separators=(",", ":"), ensure_ascii=False)
    tc = {"type": "function", "function": {"name": f["name"], "arguments": args}}
    if c.get("id"):
        tc["id"] = str(c["id"])
    return tc


def normalize_tools(tools) -> list[dict]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        _bad("'tools' must be an array")
    out = []
    for t in tools:
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict) \
                or not isinstance(t["function"].get("name"), str):
            _bad("each tool must be an object of type 'function' with a named 'function'")
        f = t["function"]
        params = f.get("parameters")
        out.append({"type": "function", "function": {
            "name": f["name"], "description": f.get("description") or "",
            "parameters": copy.deepcopy(params) if params is not None else {}}})
    return out


def _join_parts(parts) -> str:
    return "\n".join(p["text"] for p in parts)


# -- the template -------------------------------------------------------------------------

_PROBE_TOOLS = [{"name": "tool", "type": "function", "function": {
    "name": "tool1", "description": "Tool description", "parameters": {
        "type": "object", "properties": {"arg": {"type": "string", "description": "Arg description"}},
        "required": ["arg"]}}}]


def _probe_calls(args):
    return [{"role": "user", "content": "User message"},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": "call00001", "type": "function", "function": {"name": "tool1", "arguments": args}}]},
            {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
            {"role": "assistant", "content": "The tool response was 'tool response'"},
            {"role": "user", "content": "User message"}]


class ChatTemplate:
    """A compiled chat template, what it can take (`caps`), and the special tokens it is
    rendered with."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "",
                 add_bos: bool = False, add_eos: bool = False, tool_use: str | None = None):
        if not source or source == "chatml":
            source = CHATML
        for (needles, check) in _PATCHES:
            if all(n in source for n in needles):
                source = source.replace(check, "{%- if false %}")
        self.source = source
        self.bos_token, self.eos_token = bos_token, eos_token
        self.add_bos, self.add_eos = add_bos, add_eos
        self._env = _environment()
        try:
            self._t = self._env.from_string(source)
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template does not parse: {e}") from None
        self.caps = self._probe_caps()
        # the model's second template, for conversations with tools (llama.cpp's
        # "tool_use" variant)
        self.tool_use = ChatTemplate(tool_use, bos_token, eos_token, add_bos, add_eos) \
            if tool_use else None

    @classmethod
    def from_gguf(cls, file, tokenizer, path: str | None = None) -> "ChatTemplate":
        """The template of `path` if given, else the model's own (its "tool_use" one when
        it has only that; TemplateError when it has none: llama.cpp takes ChatML then,
        `ChatTemplate("chatml", ...)`); the model's BOS and EOS texts and whether its
        vocabulary adds them (none without a `tokenizer`: only the template is read)."""
        if path is not None:
            try:
                with open(path, encoding="utf-8") as f:
                    source = f.read()
            except (OSError, UnicodeDecodeError) as e:
                raise TemplateError(f"cannot read chat template file: {e}") from None
            tool_use = None
        else:
            source = file.meta.get("tokenizer.chat_template")
            tool_use = file.meta.get("tokenizer.chat_template.tool_use")
            tool_use = tool_use if isinstance(tool_use, str) else None
            if not isinstance(source, str) or source == "chatml":
                source, tool_use = tool_use, None
            if source is None:
                raise TemplateError("the model has no chat template (give one with --chat-template-file)")

        def text(tid):
            if tokenizer is None or tid is None or not 0 <= tid < tokenizer.n_vocab:
                return ""
            return tokenizer.token_to_piece(tid, special=True).decode("utf-8", "replace")
        return cls(source, text(getattr(tokenizer, "bos", None)), text(getattr(tokenizer, "eos", None)),
                   bool(getattr(tokenizer, "add_bos", False)), bool(getattr(tokenizer, "add_eos", False)),
                   tool_use)

    # llama.cpp's jinja::caps_get: render fixed conversations and see what was read
    def _try(self, messages, tools=None, **extra) -> tuple[_Probe, bool, str, object, object]:
        probe = _Probe()
        msgs = _probe_value(messages, probe)
        tls = _probe_value(tools if tools is not None else [], probe)
        self._env.probe = probe
        try:
            out, ok = self._t.render(messages=msgs, tools=tls, bos_token="", eos_token="",
                                     add_generation_prompt=True, **extra), True
        except Exception:  # a probe that fails says something too
            out, ok = "", False
        finally:
            self._env.probe = None
        return probe, ok, out, msgs, tls

    def _probe_caps(self) -> dict:
        caps = dict(string_content=True, typed_content=False, system_role=True,
                    tool_calls=True, object_arguments=False)
        marker = "STRING_MARKER"
        content = _PStr(marker)
        p, ok, out, msgs, _ = self._try([{"role": "user", "content": content}])
        ops = p.ops.get(id(content), set()) | ({"array"} if content.iterated else set())
        if "array" in ops:
            caps["typed_content"] = True
        if not ok or ("array" in ops and marker not in out):
            caps["string_content"] = False
        if "string" in ops:
            p, ok, _, msgs, _ = self._try([{"role": "user", "content": []}])
            if ok and "array" in p.ops.get(id(msgs[0]["content"]), set()):
                caps["typed_content"] = True

        p, _, _, msgs, _ = self._try([{"role": "system", "content": "System message"},
                                      {"role": "user", "content": "User message"}])
        caps["system_role"] = p.used(msgs[0], "content") or id(msgs) in p.deep

        p, ok, _, msgs, _ = self._try(_probe_calls({"arg": "value"}), _PROBE_TOOLS)
        if ok:
            calls = msgs[1]["tool_calls"]
            caps["tool_calls"] = p.used(msgs[1], "tool_calls") or "array" in p.ops.get(id(calls), ())
            args = calls[0]["function"]["arguments"]
            caps["object_arguments"] = caps["tool_calls"] and p.used(args, "arg")
        if not caps["object_arguments"]:
            p, ok, _, msgs, _ = self._try(_probe_calls('{"arg": "value"}'), _PROBE_TOOLS)
            calls = msgs[1]["tool_calls"]
            caps["tool_calls"] = ok and (p.used(msgs[1], "tool_calls") or "array" in p.ops.get(id(calls), ()))
        return caps

    @functools.cached_property
    def reasoning_markers(self) -> tuple[str, str]:
        """The text that opens and closes the assistant's reasoning ("" when none is
        found), found as llama.cpp's chat autoparser finds them: an assistant turn is
        rendered with and without reasoning, and the markers (`<...>` or `[...]` with
        the whitespace around them) that wrap the reasoning are taken; older Qwen and
        DeepSeek templates, which drop reasoning, and Granite 3.3 are known to use
        <think></think>. Specialized formats llama.cpp handles apart (gpt-oss, Kimi K2,
        ...) are not covered."""
        src = self.source
        if ("content.split('</think>')" in src and "reasoning_content" not in src
                and "<SPECIAL_12>" not in src) or \
                "Write your thoughts between <think></think> and write your response between" in src:
            return "<think>", "</think>"
        user = {"role": "user", "content": "U_USER_MSG Hello END_U"}
        reply = {"role": "assistant", "content": "A_ASST_MSG I can help END_A"}
        thought = "REASON_PART I am thinking END_R"
        start = end = ""
        # 1. an assistant turn with reasoning: the markers around it
        out = self._quiet(messages=[user, dict(reply, reasoning_content=thought)], enable_thinking=True)
        if out is not None and thought in out:
            m = re.search(f"({_MARKER}[ \t\r\n]*){re.escape(thought)}([ \t\r\n]*{_MARKER}[ \t\r\n]*)", out)
            if m:
                start, end = m.group(1), m.group(2)
            else:
                m = re.search(f"{re.escape(thought)}[ \t\r\n]*({_MARKER}[ \t\r\n]*)", out)
                end = m.group(1) if m else ""
        # 2. the generation prompt with thinking off and on: what one adds
        a = self._quiet(messages=[user], add_generation_prompt=True, enable_thinking=False)
        b = self._quiet(messages=[user], add_generation_prompt=True, enable_thinking=True)
        if a is None or b is None:
            return start, end
        left, right = _segment_diff(a, b)
        lt, rt = left.strip(_WS), right.strip(_WS)
        if not lt and right:
            if rt and b.endswith(rt) and not start:
                start = right
        elif not rt and left:
            if lt and a.endswith(lt) and not end:
                seg = [x for x in _segments(a) if x.strip(_WS)]
                if len(seg) >= 2 and seg[-1] == lt and _is_marker(seg[-2]):
                    start = seg[-2]
                end = left
        elif lt and rt:
            for base, extended in ((b, a), (a, b)):
                anchor = base[-64:]
                pos = extended.rfind(anchor)
                if pos < 0 or pos + len(anchor) >= len(extended):
                    continue
                extra = extended[pos + len(anchor):].strip(_WS)
                seg = [x for x in _segments(extra) if x.strip(_WS)]
                if extra and len(seg) == 2 and all(map(_is_marker, seg)):
                    start, end = start or seg[0], end or seg[1]
                    break
        if "laguna_glm_thinking" in src:  # llama.cpp trims Laguna's markers to the tags
            start, end = start.strip(_WS), end.strip(_WS)
        return start, end

    def _quiet(self, **ctx) -> str | None:
        """The template on a probe conversation, or None where it fails."""
        try:
            return self._t.render(bos_token=self.bos_token, eos_token=self.eos_token, **ctx)
        except Exception:  # as llama.cpp: a template that fails on a probe tells nothing
            return None

    # -- rendering ------------------------------------------------------------------

    def _prepare(self, messages: list[dict]) -> list[dict]:
        only_string = self.caps["string_content"] and not self.caps["typed_content"]
        only_typed = self.caps["typed_content"] and not self.caps["string_content"]
        out = []
        for m in messages:
            m = dict(m)
            c = m.get("content")
            if only_string and isinstance(c, list):
                m["content"] = _join_parts(c)
            elif only_typed and isinstance(c, str):
                m["content"] = [{"type": "text", "text": c}]
            out.append(m)
        return out

    def _fix(self, msgs: list[dict]) -> list[dict]:
        if "<|channel|>" not in self.source:
            for m in msgs:
                if m["role"] == "developer":
                    m["role"] = "system"
        if not self.caps["system_role"] and msgs and msgs[0]["role"] == "system":
            if len(msgs) > 1:
                first, second = msgs[0]["content"], msgs[1]["content"]
                if not isinstance(first, str) or not isinstance(second, str):
                    _bad("the template has no system role and a system or next message is not a string")
                msgs[1] = dict(msgs[1], content=first + "\n" + second)
            msgs = msgs[1:]
        if self.caps["object_arguments"]:
            for m in msgs:
                if "tool_calls" in m:
                    m["tool_calls"] = [self._object_args(c) for c in m["tool_calls"]]
        return msgs

    @staticmethod
    def _object_args(c):
        args = c["function"]["arguments"]
        try:
            parsed = json.loads(args)
        except ValueError as e:
            _bad(f"tool call arguments are not JSON: {e}")
        return dict(c, function=dict(c["function"], arguments=parsed))

    def _apply(self, msgs, tools, add_generation_prompt, context, now) -> str:
        ctx = dict(messages=msgs, bos_token=self.bos_token, eos_token=self.eos_token)
        ctx.update(context)
        if tools:
            ctx["tools"] = tools
        if add_generation_prompt:
            ctx["add_generation_prompt"] = True
        if isinstance(ctx.get("preserve_reasoning"), bool):
            keep = ctx["preserve_reasoning"]
            ctx.update(preserve_thinking=keep, clear_thinking=not keep,
                       truncate_history_thinking=not keep, drop_thinking=not keep)
        if isinstance(ctx.get("reasoning_effort"), str) and ctx["reasoning_effort"]:
            ctx["reasoning_strength"] = ctx["reasoning_effort"]
        lt = time.localtime(now)
        ctx["strftime_now"] = lambda fmt: time.strftime(str(fmt), lt)
        try:
            text = self._t.render(**ctx)
        except TemplateError:
            raise
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template failed: {e}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        if self.add_eos and self.eos_token and text.endswith(self.eos_token):
            text = text[:-len(self.eos_token)]
        return text

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools=None,
               enable_thinking: bool | None = None, continue_final: bool | None = None,
               now: float | None = None, **extra) -> str:
        """The prompt llama-server's /apply-template (and /v1/chat/completions) builds
        for these OpenAI-style `messages` and `tools`.

        `enable_thinking` defaults to whether the template marks reasoning
        (`reasoning_markers`), as llama-server turns it on for templates that think.
        `continue_final` (default: when the last message is the assistant's) renders
        the conversation before it, the assistant's opening, then its text (its
        reasoning reopened first where `reasoning_markers` are known), so that
        generation continues it, as llama-server does. `extra` are the
        chat_template_kwargs (e.g. reasoning_effort). `now` (seconds since the epoch)
        fixes the date the template sees."""
        if tools and self.tool_use is not None:
            return self.tool_use.render(messages, add_generation_prompt, tools, enable_thinking,
                                        continue_final, now, **extra)
        msgs = normalize_messages(messages)
        tools = normalize_tools(tools)
        if continue_final is None:
            continue_final = bool(msgs) and msgs[-1]["role"] == "assistant"
            if continue_final and len(msgs) > 1 and msgs[-2]["role"] == "assistant":
                _bad("cannot have 2 or more assistant messages at the end of the list")
        if continue_final and msgs and msgs[-1].get("tool_calls"):
            _bad("cannot continue an assistant message that contains tool calls")
        last = msgs[-1] if continue_final and msgs else None
        msgs = self._prepare(msgs)
        if last is not None:
            msgs.pop()
        msgs = self._fix(msgs)
        now = time.time() if now is None else now
        day = datetime.datetime.fromtimestamp(now)
        context = {"enable_thinking": any(self.reasoning_markers) if enable_thinking is None
                   else bool(enable_thinking),
                   "datetime": day.strftime("%b %d %Y"), "date_string": day.strftime("%d %b %Y")}
        context.update(copy.deepcopy(extra))
        if not continue_final:
            return self._apply(msgs, tools, add_generation_prompt, context, now)
        closed = self._apply(msgs, tools, False, context, now)
        if last is None or len(last) == 2 and not last["content"]:
            return closed  # nothing to continue
        opened = self._apply(msgs, tools, True, context, now)
        n = 0
        while n < min(len(closed), len(opened)) and closed[n] == opened[n]:
            n += 1
        opening = opened[n:]
        c = last["content"]
        text = c if isinstance(c, str) else "\n\n".join(p["text"] for p in c)
        thought = last.get("reasoning_content", "")
        start, end = self.reasoning_markers
        if start:
            # the reasoning block is reopened (and closed again when the text follows)
            i = opening.find(start)
            opening = (opening[:i] if i >= 0 else opening) + start + thought
            if text or not thought:
                opening += end
        if text or not thought:
            opening += text
        return closed + opening

    def prompt_tokens(self, tokenizer, messages: list[dict], **kw) -> list[int]:
        """The tokens llama-server evaluates for this conversation: `render(messages,
        **kw)` tokenized with add_special=True (BOS when the vocabulary adds it; the
        render has already cut a BOS text the template wrote, so there is one) and
        parse_special=True (special-token texts in the prompt, the template's and the
        messages' alike, become their tokens)."""
        return prompt_text_tokens(tokenizer, self.render(messages, **kw))


def prompt_text_tokens(tokenizer, text: str) -> list[int]:
    """A rendered prompt's tokens as llama-server makes them (`render` has already cut
    a BOS/EOS text the vocabulary adds itself)."""
    return tokenizer.tokenize(text, add_special=True, parse_special=True)
