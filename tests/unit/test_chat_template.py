"""ChatTemplate without a server: the sandbox, errors, and the JSON its tojson writes
(tests/interop/test_chat_template_vs_llama_server.py compares whole prompts with llama-server's)."""
from __future__ import annotations

import json

import pytest

from ggmlrpc.llm.chat_template import ChatTemplate, TemplateError, to_json

USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__ }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ raise_exception.__globals__ }}",
    "{% for m in messages %}{{ m.__class__ }}{% endfor %}",
    "{{ messages[0].update({'role': 'system'}) }}",
    "{{ messages[0].content.__len__() }}",
])
def test_sandbox_refuses_python_internals(source):
    with pytest.raises(TemplateError, match="not allowed|unsafe"):
        ChatTemplate(source).render(USER)


def test_raise_exception_carries_the_templates_message():
    t = ChatTemplate("{% if messages[0].role != 'system' %}{{ raise_exception('a system "
                     "message comes first') }}{% endif %}")
    with pytest.raises(TemplateError, match="a system message comes first"):
        t.render(USER)


@pytest.mark.parametrize("source", ["{% for m in messages %}", "{{ messages[ }}", "{% endif %}"])
def test_a_template_that_does_not_parse(source):
    with pytest.raises(TemplateError, match="does not parse"):
        ChatTemplate(source)


@pytest.mark.parametrize("messages", [
    "hi", [{"content": "no role"}], [{"role": "user"}],
    [{"role": "user", "content": 3}],
    [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
    [{"role": "assistant", "tool_calls": [{"type": "function"}]}],
])
def test_malformed_messages_are_one_clear_error(messages):
    with pytest.raises(TemplateError):
        ChatTemplate("chatml").render(messages)


def test_a_template_without_system_role_gets_it_merged():
    # a template that never reads a system message (it refuses one) gets the system
    # text put before the first user message's, as llama.cpp does
    t = ChatTemplate("{% if messages[0].role == 'system' %}{{ raise_exception('no') }}{% endif %}"
                     "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    assert not t.caps["system_role"]
    got = t.render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert got == "[user]S\nU"


def test_bos_written_by_the_template_is_cut_when_the_vocabulary_adds_one():
    src = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"
    assert ChatTemplate(src, "<s>", "</s>", add_bos=True).render(USER) == "hi"
    assert ChatTemplate(src, "<s>", "</s>", add_bos=False).render(USER) == "<s>hi"


VALUES = [
    {"b": [1, "x", None, True, {"z": {}}], "a": "\u00e7\u2713\U0001f600 \"q\" \\ \n\t\x01", "e": []},
    ["plain", {"k": [False, -3]}],
]


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("indent", [None, 0, 2])
@pytest.mark.parametrize("ascii_", [False, True])
def test_tojson_agrees_with_python_json_on_key_order_and_separators(value, indent, ascii_):
    # floats aside (llama.cpp writes them as %g), its JSON is Python's with the keys
    # left in their order
    assert to_json(value, indent=indent, ensure_ascii=ascii_) == \
        json.dumps(value, indent=indent, ensure_ascii=ascii_)


def test_tojson_separators_in_a_template():
    t = ChatTemplate("{{ messages[0] | tojson(separators=(',', ':')) }}")
    assert t.render(USER) == json.dumps(USER[0], separators=(",", ":"))


def test_missing_values_are_lenient_as_in_llama_cpp():
    # a missing field's fields are missing too, its items() is empty, and a string plus
    # something missing is the string
    t = ChatTemplate("{% for k, v in messages[0].tool.parameters.items() %}x{% endfor %}"
                     "{{ messages[0].content + messages[0].name }}|{{ messages[0].nothing.more }}|")
    assert t.render(USER) == "hi||"
