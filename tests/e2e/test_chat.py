"""`ggml-rpc-cli chat` driven through a pseudo-terminal as a person types: answers
are the greedy model's through the Python API, a new turn prefills only its own
tokens, Ctrl-C stops an answer and not the program, /exit, Ctrl-D and Ctrl-C at the
prompt leave with status 0, a full context says so, bad input is one error line."""
from __future__ import annotations

import os
import re
import sys
import termios

import gguf
import pexpect
import pytest

from ggmlrpc.cli.main import main
from ggmlrpc.llm import synth
from ggmlrpc.llm.chat_template import ChatTemplate
from ggmlrpc.llm.model import Model
from ggmlrpc.llm.sampling import Sampler
from tests.conftest import free_port, start_server

# a Zephyr-like template in the test vocabulary: its EOS ends each turn, the BOS is
# written by the template (and must not be added a second time)
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{{ eos_token }}\n"
            "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
SYSTEM = "you are a fisherman"
PROMPT = rb"\r\n(?:\x1b\[[0-9;?]*[A-Za-z])*> "          # "\n> ", readline's escapes aside
STATS = rb"\[ Prompt: (\d+) tokens, [\d.]+ t/s \| Generation: (\d+) tokens, [\d.]+ t/s \]"


def with_chat_template(src, dst, template: str):
    """A copy of the GGUF `src` whose metadata carries `template`."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = f.types[1]
            val = ([bytes(f.parts[i]) for i in f.data] if sub == gguf.GGUFValueType.STRING
                   else list(f.contents()))
            w.add_key_value(key, val, vtype, sub)
        else:
            w.add_key_value(key, f.contents(), vtype)
    w.add_chat_template(template)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("chat")
    plain = synth.write_llama(d / "plain.gguf", synth.LlamaShape(n_layer=2, n_embd=64, n_ff=128, n_head=4,
                                                                 n_head_kv=2, n_ctx=4096))
    return plain, with_chat_template(plain, d / "chat.gguf", TEMPLATE)


@pytest.fixture(scope="module")
def endpoint():
    srv = start_server()
    yield f"127.0.0.1:{srv.port}"
    srv.close()


def template_file(d) -> str:
    path = d / "template.jinja"
    path.write_text(TEMPLATE)
    return str(path)


def keep_output_on_interrupt():
    """In the child, before the program starts: the terminal keeps what was written
    when Ctrl-C arrives (NOFLSH). By default the pseudo-terminal drops written bytes
    its reader, the test, has not read yet, which would make the answer as shown
    lose tokens the program wrote."""
    attrs = termios.tcgetattr(0)
    attrs[3] |= termios.NOFLSH
    termios.tcsetattr(0, termios.TCSANOW, attrs)


@pytest.fixture
def spawn():
    """Factory: the command in a pseudo-terminal, at its first prompt unless told;
    whatever is still running at the end of the test is ended."""
    children = []

    def start(*args, prompt: bool = True) -> pexpect.spawn:
        child = pexpect.spawn(sys.executable, ["-P", "-m", "ggmlrpc.cli.main", "chat", *map(str, args)],
                              timeout=120, env={"TERM": "xterm", **os.environ},
                              preexec_fn=keep_output_on_interrupt)
        children.append(child)
        if prompt:
            child.expect(PROMPT)
        return child

    yield start
    for child in children:
        child.close(force=True)


def say(child, message: str, interrupt: bool = False) -> tuple[bytes, int, int]:
    """Type a message (and Ctrl-C once the answer shows); the answer as shown
    (newlines as written), and the token counts of the line after it."""
    child.sendline(message)
    child.expect_exact(message.encode() + b"\r\n")
    if interrupt:
        child.expect(rb"\S")        # the answer is being written
        before = child.before + child.after
        child.sendintr()
    child.expect(rb"\r\n\r\n" + STATS)
    if interrupt:
        child.before = before + child.before.replace(b"^C", b"")   # the terminal's echo of Ctrl-C
    answer = (child.before + b"\r\n").replace(b"\r\n", b"\n")   # ends in the newline that closes it
    n_prompt, n_gen = int(child.match.group(1)), int(child.match.group(2))
    child.expect(PROMPT)
    return answer, n_prompt, n_gen


def leave(child, how: str = "/exit") -> int:
    if how == "/exit":
        child.sendline("/exit")
    elif how == "eof":
        child.sendeof()
    else:
        child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    assert child.signalstatus is None
    return child.exitstatus


class Conversation:
    """The same conversation through the Python API: the context each turn runs is
    the last one's (prompt and answer tokens as drawn) followed by the tokens of
    the text the rendered conversation added."""

    def __init__(self, model: Model, ignore_eos: bool = False):
        self.m = model
        self.banned = model.tokenizer.eog if ignore_eos else ()
        self.t = ChatTemplate.from_gguf(model.file, model.tokenizer)
        self.messages = [{"role": "system", "content": SYSTEM}]
        self.held, self.ids = "", []
        self.prompt_len = 0

    def turn(self, message: str, n: int) -> tuple[bytes, int, int]:
        m, tok = self.m, self.m.tokenizer
        self.messages.append({"role": "user", "content": message})
        text = self.t.render(self.messages)
        if not self.held:   # the render has cut the template's BOS text: the vocabulary adds it
            ids = self.t.prompt_tokens(tok, self.messages)
        else:
            assert text.startswith(self.held)
            ids = self.ids + m.tokenize(text[len(self.held):], add_special=False, parse_special=True)
        assert ids.count(tok.bos) == 1
        n_run = len(ids) - max(len(self.ids) - 1, 0)   # the last token drawn has not run yet
        self.prompt_len = len(ids)
        drawn = []
        for t, _ in m.stream(ids, n, Sampler(temp=0, banned=self.banned), reuse=True):
            if not drawn:     # the prefill has run just these, in one batch
                assert m.history[-1] == ids[len(ids) - n_run:]
            drawn.append(t)
        answer = b"".join(tok.token_to_piece(t).split(b"\0", 1)[0] for t in drawn)
        self.messages.append({"role": "assistant", "content": answer.decode("utf-8", "replace")})
        self.held = text + b"".join(tok.token_to_piece(t, True) for t in drawn).decode("utf-8", "replace")
        self.ids = ids + drawn
        return answer if answer.endswith(b"\n") else answer + b"\n", n_run, len(drawn)


def test_two_turns_over_a_server(models, endpoint, spawn):
    """Each streamed answer is the greedy model's for the conversation so far; the
    second turn prefills only its own tokens (and the first answer's last token,
    drawn but not yet run); /regen runs nothing new but that token."""
    _, path = models
    child = spawn("-m", path, "--rpc", endpoint, "--temp", "0", "-n", "12", "-sys", SYSTEM)
    got1 = say(child, "hello there")
    got2 = say(child, "the old man and the sea")
    regen = say(child, "/regen")
    assert leave(child) == 0
    with Model.load(path, rpc=endpoint) as m:
        conv = Conversation(m)
        want1 = conv.turn("hello there", 12)
        want2 = conv.turn("the old man and the sea", 12)
    assert got1 == want1 and got1[1] > 20
    assert got2 == want2                                   # answer, prompt tokens run, tokens drawn
    assert got2[1] < conv.prompt_len - got1[1]             # not even the first turn's prompt again
    assert regen[1] == 1 and regen[2] == 12


def test_sliding_window_model(tmp_path, spawn):
    """A sliding-window cache keeps the turns too; /regen, which would drop tokens
    from it, runs the whole prompt again and the speed line says so."""
    plain = synth.write_model(tmp_path / "gemma2.gguf", "gemma2",
                              synth.ModelShape(n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=2))
    path = with_chat_template(plain, tmp_path / "gemma2-chat.gguf", TEMPLATE)
    child = spawn("-m", path, "--temp", "0", "-n", "10", "-sys", SYSTEM)
    got = [say(child, "hello there"), say(child, "the old man and the sea")]
    regen = say(child, "/regen")
    assert leave(child) == 0
    with Model.load(path) as m:
        conv = Conversation(m)
        assert [conv.turn("hello there", 10), conv.turn("the old man and the sea", 10)] == got
    assert regen[1] == conv.prompt_len


def test_ctrl_c_stops_the_answer_not_the_program(models, endpoint, spawn):
    """Ctrl-C mid-answer: what was written stays in the conversation, whose next turn
    goes on from the tokens drawn so far; the program carries on to /exit."""
    _, path = models
    child = spawn("-m", path, "--rpc", endpoint, "--temp", "0", "--ignore-eos", "-n", "3000",
                  "-sys", SYSTEM)
    got1 = say(child, "tell me a long story", interrupt=True)
    got2 = say(child, "and then", interrupt=True)
    assert leave(child) == 0
    assert 0 < got1[2] < 3000 and 0 < got2[2] < 3000
    with Model.load(path, rpc=endpoint) as m:
        conv = Conversation(m, ignore_eos=True)
        assert conv.turn("tell me a long story", got1[2]) == got1
        assert conv.turn("and then", got2[2]) == got2


@pytest.mark.parametrize("how", ["/exit", "eof", "ctrl-c"])
def test_leaving_at_the_prompt(models, how, spawn):
    _, path = models
    child = spawn("-m", path, "-n", "4")
    say(child, "hello")
    assert leave(child, how) == 0


def test_full_context_starts_over(models, tmp_path, spawn):
    """The answer stops where the context is full, a line says so, and the next
    message is answered in a new conversation (only the system prompt's tokens
    are kept); a message that cannot fit at all is refused with one error line."""
    plain, _ = models
    child = spawn("-m", plain, "--chat-template-file", template_file(tmp_path), "-c", "96",
                  "--ignore-eos", "--temp", "0", "-sys", SYSTEM)
    child.sendline("hello")
    child.expect(rb"\r\n\r\n" + STATS + rb"\r\n\r\n\[ context full \(96 tokens\): the conversation "
                 rb"starts over, the system prompt kept \]")
    n_prompt, n_gen = int(child.match.group(1)), int(child.match.group(2))
    assert n_prompt + n_gen == 96 + 1          # the last token drawn never ran
    child.expect(PROMPT)
    again = say(child, "hello")                # fills the context again
    assert again[1] == 1                       # the same first prompt: all but its last token kept
    child.sendline("the sea " * 60)
    child.expect(rb"error: the message does not fit the context \((\d+) tokens, the context holds 96\)")
    assert int(child.match.group(1)) > 96
    child.expect(PROMPT)
    assert leave(child, "eof") == 0


def test_read_and_clear(models, tmp_path, spawn):
    """/read puts a file before the next message; /clear forgets the conversation:
    the first message again is the first prompt again, all of it in the context
    but its last token."""
    _, path = models
    notes = tmp_path / "notes.txt"
    notes.write_text("the fisherman lived by the sea\n")

    def read():
        child.sendline(f"/read {notes}")
        child.expect_exact(f"read {notes} (31 characters) for the next message".encode())
        child.expect(PROMPT)

    child = spawn("-m", path, "--temp", "0", "-n", "6", "-sys", SYSTEM)
    read()
    first = say(child, "who lived there")
    say(child, "and then")
    child.sendline("/clear")
    child.expect_exact(b"the conversation starts over")
    child.expect(PROMPT)
    read()
    again = say(child, "who lived there")
    assert leave(child) == 0
    with Model.load(path) as m:
        message = f"--- File: {notes} ---\nthe fisherman lived by the sea\nwho lived there"
        assert Conversation(m).turn(message, 6) == first
    assert again[1] == 1


def test_first_message_and_single_turn(models, spawn):
    _, path = models
    child = spawn("-m", path, "-n", "4", "-p", "hello", "-st", prompt=False)
    child.expect_exact(b"\r\n> hello\r\n")
    child.expect(rb"\r\n\r\n" + STATS)
    child.expect_exact(b"Exiting...")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_a_template_that_refuses_the_conversation(models, tmp_path, spawn):
    """A template that raises (roles it does not take, ...) is one error line; the
    message is dropped and the conversation goes on."""
    plain, _ = models
    tmpl = tmp_path / "picky.jinja"
    tmpl.write_text("{% if messages[-1].content == 'boo' %}{{ raise_exception('not that') }}{% endif %}"
                    + TEMPLATE)
    child = spawn("-m", plain, "--chat-template-file", tmpl, "-n", "4")
    child.sendline("boo")
    child.expect_exact(b"error: chat template raised: not that\r\n")
    child.expect(PROMPT)
    assert say(child, "hello")[2] == 4
    assert leave(child) == 0


def test_bad_input_is_one_error_line(models, tmp_path, capsys):
    plain, path = models
    for args, msg in ((["-m", str(tmp_path / "none.gguf")], "model file not found"),
                      (["-m", str(plain)], "the model has no chat template (give one with --chat-template-file)"),
                      (["-m", str(plain), "--chat-template-file", str(tmp_path / "none.jinja")],
                       "cannot read chat template file"),
                      (["-m", str(path), "--rpc", f"127.0.0.1:{free_port()}"], "server unreachable"),
                      (["-m", str(path), "-sysf", str(tmp_path / "none.txt")], "cannot read system prompt file")):
        rc = main(["chat", *args])
        out, err = capsys.readouterr()
        assert rc == 1 and err.startswith("error: ") and msg in err, (args, err)
        assert err.count("\n") == 1 and "Traceback" not in err
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for %}")
    assert main(["chat", "-m", str(path), "--chat-template-file", str(bad)]) == 1
    assert re.match(r"error: chat template does not parse: .*\n$", capsys.readouterr().err)
