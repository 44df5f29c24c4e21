"""Pipelined prompts with layer split: the micro-batches of one decode flow through
the servers at once (server B runs micro-batch i while A runs i + 1). The logits
are those of the one-after-the-other run, bit for bit (in-process CPU layers
before the servers too, several sequences in one decode); the host really has
requests out at two servers at once; a server lost on the way is recovered."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlrpc.client import RemoteBackend
from ggmlrpc.errors import ConnectionLost
from ggmlrpc.llm import synth
from ggmlrpc.llm.flow import Flow
from ggmlrpc.llm.model import Model
from tests.conftest import Proc, free_port, our_server_argv, start_server

PROMPT_IDS = [(7 * i + 3) % 250 + 2 for i in range(61)]     # 61 tokens: eight micro-batches of 8


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("pipeline")
    return synth.write_llama(d / "llama.gguf", synth.LlamaShape(n_layer=4, n_embd=64, n_ff=128, n_head=4,
                                                                 n_head_kv=2, n_ctx=256), "f32", seed=3)


@pytest.fixture
def servers():
    srvs = [start_server(), start_server(), start_server()]
    yield [f"127.0.0.1:{s.port}" for s in srvs]
    for s in srvs:
        s.close()


def run(path, eps, pipeline: bool, **kw) -> list[np.ndarray]:
    """The logits of a prefill of PROMPT_IDS in micro-batches of 8, of the greedy
    token after it, and of a second prefill of 20 tokens after both."""
    with Model.load(path, rpc=eps, n_ubatch=8, pipeline=pipeline, **kw) as m:
        assert m._pipelines() == (pipeline and len(eps) > 1)
        q = m.new_sequence()
        out = [q.prefill(PROMPT_IDS)]
        out.append(q.eval([int(np.argmax(out[-1]))]))
        out.append(q.eval(PROMPT_IDS[5:25]))
        return out


@pytest.mark.parametrize("n_servers,kw", [(2, {}), (3, dict(tensor_split=[2, 1, 1])),
                                          (2, dict(n_gpu_layers=3)), (3, dict(n_gpu_layers=2))],
                         ids=["2", "3-unequal", "2-cpu-layer", "3-cpu-layers"])
def test_pipelined_prompt_gives_the_same_logits(model_path, servers, n_servers, kw):
    eps = servers[:n_servers]
    one_by_one, pipelined = run(model_path, eps, False, **kw), run(model_path, eps, True, **kw)
    for a, b in zip(one_by_one, pipelined):
        assert np.array_equal(a, b)


def test_several_sequences_in_one_pipelined_decode(model_path, servers):
    """Two sequences' prompts in one decode (their tokens cut into the same
    micro-batches): each sequence's logits as one by one."""
    got = []
    for pipeline in (False, True):
        with Model.load(model_path, rpc=servers[:2], n_ubatch=8, n_seq=2, pipeline=pipeline) as m:
            a, b = m.new_sequence(), m.new_sequence()
            la, lb = m.decode([(a, PROMPT_IDS[:29]), (b, PROMPT_IDS[10:])])
            got.append((la, lb, a.eval([3]), b.eval([4])))
    for x, y in zip(*got):
        assert np.array_equal(x, y)


def requests_out(monkeypatch) -> list[int]:
    """[the most servers that had a request out at once], kept up to date (set it to
    0 to start over)."""
    waiting, most = set(), [0]
    send = RemoteBackend.issue_step

    def issue_step(self, *args):
        wait = send(self, *args)
        waiting.add(id(self))
        most[0] = max(most[0], len(waiting))

        def answer():
            try:
                return wait()
            finally:
                waiting.discard(id(self))
        return answer

    monkeypatch.setattr(RemoteBackend, "issue_step", issue_step)
    return most


def test_requests_are_out_at_two_servers_at_once(model_path, servers, monkeypatch):
    """What makes the pipeline: while one server's answer is awaited, another server
    already has its request (one by one, never more than one is out)."""
    most = requests_out(monkeypatch)
    for pipeline, want in ((False, 1), (True, 2)):
        most[0] = 0
        with Model.load(model_path, rpc=servers[:2], n_ubatch=8, pipeline=pipeline) as m:
            m.eval(PROMPT_IDS)
            assert most[0] == want, pipeline
            most[0] = 0
            m.eval([5])             # one token: one micro-batch, nothing to overlap
            assert most[0] == 1


def test_server_lost_before_a_pipelined_prompt_and_back(model_path, monkeypatch):
    """The second server is restarted between two prompts: the pipelined decode
    meets the closed connection, drains the other server's answers, and runs the
    micro-batches one by one, where the server gets its layers again and the first
    prompt is replayed: the logits of an uninterrupted run."""
    ports = [free_port(), free_port()]
    argvs = [our_server_argv("-p", str(p), "-t", "1") for p in ports]
    procs = [Proc(a, p) for a, p in zip(argvs, ports)]
    eps = [f"127.0.0.1:{p}" for p in ports]
    try:
        with Model.load(model_path, rpc=eps, n_ubatch=8, reconnect=30) as m:
            m.eval(PROMPT_IDS)
            want = m.eval(PROMPT_IDS[3:40])
            m.reset()
            m.eval(PROMPT_IDS)
            procs[1].stop()
            procs[1] = Proc(argvs[1], ports[1])
            one_by_one = []
            step = Model._step
            monkeypatch.setattr(Model, "_step", lambda self, batch: one_by_one.append(batch) or step(self, batch))
            got = m.eval(PROMPT_IDS[3:40])
            assert len(one_by_one) == 5      # the pipeline gave up; its five micro-batches ran one by one
            assert np.array_equal(got, want)
    finally:
        for p in procs:
            p.stop()


def test_a_prompt_of_one_micro_batch_is_cut_for_the_pipeline(model_path, servers, monkeypatch):
    """A prompt that fits one -ub micro-batch still flows: over two servers it is cut
    into about four pieces per server (none under PIPE_MIN_UBATCH tokens), whose
    logits are those of that -ub run one by one, bit for bit, and within the noise of
    a -ub change of the uncut run's; without the pipeline -ub is kept."""
    from ggmlrpc.llm.model import PIPE_MIN_UBATCH
    ids = [(5 * i + 1) % 250 + 2 for i in range(4 * PIPE_MIN_UBATCH - 5)]
    sizes = []
    step = Model._issue

    def issue(self, st, key, values, x, hook=None, last=False):
        if st is self.stages[0]:
            sizes.append(len(values["inp_tokens"]) if "inp_tokens" in values else None)
        return step(self, st, key, values, x, hook, last)

    with Model.load(model_path, rpc=servers[:2], pipeline=False) as m:
        assert m.pipeline_ubatch(len(ids)) == m.n_ubatch == 256     # n_ctx bounds -ub
        want = m.eval(ids)
    with Model.load(model_path, rpc=servers[:2], n_ubatch=PIPE_MIN_UBATCH, pipeline=False) as m:
        one_by_one = m.eval(ids)
    monkeypatch.setattr(Model, "_issue", issue)
    with Model.load(model_path, rpc=servers[:2]) as m:
        assert m.pipeline_ubatch(len(ids)) == PIPE_MIN_UBATCH
        assert m.pipeline_ubatch(4000) == 256       # 4000 / 8 > -ub: -ub
        assert m.pipeline_ubatch(1000) == 125       # four per server: the embedding on this host is no stage of its own
        got = m.eval(ids)
    assert sizes == [PIPE_MIN_UBATCH] * 3 + [PIPE_MIN_UBATCH - 5]
    assert np.array_equal(got, one_by_one)
    # another -ub gives other attention tiles and F16 roundings (5e-7 here), as in llama.cpp
    nmse = float(np.sum((got - want) ** 2) / np.sum(want ** 2))
    assert nmse < 1e-5


def greedy_pair(m: Model, flow: bool, n: int = 6, after_prompts=None) -> list[np.ndarray]:
    """Two sequences' prompts, then n greedy tokens of each, taking turns: through a
    Flow (each sequence's next token goes in as soon as its last one lands, one
    micro-batch a stage behind the other's) or by one decode each."""
    a, b = m.new_sequence(), m.new_sequence()
    la, lb = m.decode([(a, PROMPT_IDS[:29]), (b, PROMPT_IDS[10:])])
    out, nxt = [la, lb], {a: la, b: lb}
    if after_prompts:
        after_prompts()
    if not flow:
        for _ in range(n):
            for q in (a, b):
                nxt[q] = m.decode([(q, [int(np.argmax(nxt[q]))])])[0]
                out.append(nxt[q])
        return out
    f = m.flow()
    assert f is not None
    todo = {a: n, b: n}
    for q in (a, b):
        m.add_to(f, [(q, [int(np.argmax(nxt[q]))])], q)
        todo[q] -= 1
        if q is a:
            assert f.tick() == []       # a's micro-batch goes on to the second server

    def land(mb):
        q = mb.tag
        nxt[q] = mb.logits[0]
        out.append(nxt[q])
        if todo[q]:
            m.add_to(f, [(q, [int(np.argmax(nxt[q]))])], q)
            todo[q] -= 1
    while f:
        if flow == "land":
            f.tick(land)
            continue
        for mb in f.tick():
            land(mb)
    return out


def test_a_flow_of_two_sequences_keeps_both_servers_busy(model_path, servers, monkeypatch):
    """serve's way with several requests: while one sequence's token is on the second
    server the other's runs on the first. The logits are those of the same
    micro-batches one by one, bit for bit, and two requests are out at once."""
    with Model.load(model_path, rpc=servers[:2], n_ubatch=8, n_seq=2, pipeline=False) as m:
        assert m.flow() is None
        want = greedy_pair(m, False)
    most = requests_out(monkeypatch)
    ticks, landed, tick = [0], [0], Flow.tick

    def counted(self):
        done = tick(self)
        ticks[0] += 1
        landed[0] += len(done)
        return done
    monkeypatch.setattr(Flow, "tick", counted)
    with Model.load(model_path, rpc=servers[:2], n_ubatch=8, n_seq=2) as m:
        assert len(m.stages) == 3 and m.flow().depth == 2     # the embedding on this host takes no tick
        got = greedy_pair(m, True, after_prompts=lambda: (most.__setitem__(0, 0), ticks.__setitem__(0, 0),
                                                          landed.__setitem__(0, 0)))
    assert len(got) == len(want) == 14
    for x, y in zip(want, got):
        assert np.array_equal(x, y)
    # after the first tick, one of the two lands at every tick: both servers always busy
    assert (ticks[0], landed[0]) == (13, 12)
    assert most[0] == 2


def test_a_decode_step_goes_ahead_to_the_busy_server(model_path, servers, monkeypatch):
    """A micro-batch whose first server answers goes on to the second at once, behind
    the request that server is still computing, rather than at the next tick: once
    the server holds the step's graph, the second server's request is out when each
    tick begins. The logits stay those of one by one."""
    with Model.load(model_path, rpc=servers[:2], n_ubatch=8, n_seq=2, pipeline=False) as m:
        want = greedy_pair(m, False)
    ahead, at_start, tick, go = [0], [], Flow.tick, Flow._ahead

    def counted_ahead(self, mb, active):
        go(self, mb, active)
        ahead[0] += mb.answer is not None

    def counted_tick(self):
        at_start.append(sum(mb.answer is not None for mb in self.queue))
        return tick(self)
    monkeypatch.setattr(Flow, "_ahead", counted_ahead)
    monkeypatch.setattr(Flow, "tick", counted_tick)
    with Model.load(model_path, rpc=servers[:2], n_ubatch=8, n_seq=2) as m:
        got = greedy_pair(m, True, after_prompts=lambda: (ahead.__setitem__(0, 0), at_start.clear()))
    for x, y in zip(want, got):
        assert np.array_equal(x, y)
    # 12 micro-batches cross from the first server to the second: the first with its
    # tick (that server does not hold a one-token graph yet: it goes with the step),
    # each of the others ahead of its tick
    assert ahead[0] == 11
    assert at_start == [0, 0] + [1] * 11


def test_a_landed_token_goes_on_to_the_first_server_within_the_tick(model_path, servers, monkeypatch):
    """serve's way: as a micro-batch comes out of the last server, `tick(land)` hands it
    to `land` while the tick's other answer is still on its way; the next token that
    `land` adds goes to the first server at once (behind the micro-batch it runs), not
    at the next tick, so that server starts it the moment it is done. Every tick that
    waits runs the `on_wait` hook (serve's events go out there), even one whose
    requests all went ahead. The logits stay those of one by one."""
    with Model.load(model_path, rpc=servers[:2], n_ubatch=8, n_seq=2, pipeline=False) as m:
        want = greedy_pair(m, False)
    tick, sent_in_tick, hooks = Flow.tick, [], []

    def checked(self, land=None):
        mine, ran = [], []

        def landing(mb):
            n = len(self.queue)
            land(mb)
            mine.extend(self.queue[n:])     # what land added
        self.model.on_wait = lambda: ran.append(1)
        done = tick(self, landing if land is not None else None)
        hooks.append(len(ran))
        if land is not None:
            sent_in_tick.append([x.answer is not None for x in mine])
        return done
    monkeypatch.setattr(Flow, "tick", checked)
    with Model.load(model_path, rpc=servers[:2], n_ubatch=8, n_seq=2) as m:
        got = greedy_pair(m, "land")
    assert len(got) == len(want) == 14
    for x, y in zip(want, got):
        assert np.array_equal(x, y)
    # each token but the two last goes on from the landing of its sequence's last one;
    # all of them were sent to the first server before the tick that landed it ended
    assert sum(len(x) for x in sent_in_tick) == 10
    assert all(all(x) for x in sent_in_tick), sent_in_tick
    # the hook ran once in every tick (the prompts' included)
    assert len(hooks) > len(sent_in_tick) and set(hooks) == {1}, hooks


def test_a_server_lost_with_a_step_sent_ahead(model_path):
    """The second server stops while a step is out at it ahead of its tick: the tick
    raises, clear() reads what the first server still owes, so that its next answer
    is its next request's, and once the server is back a new sequence's logits are
    those of a run that never failed."""
    ports = [free_port(), free_port()]
    argvs = [our_server_argv("-p", str(p), "-t", "1") for p in ports]
    procs = [Proc(a, p) for a, p in zip(argvs, ports)]
    eps = [f"127.0.0.1:{p}" for p in ports]
    try:
        with Model.load(model_path, rpc=eps, n_ubatch=8, n_seq=3, reconnect=30) as m:
            want = m.decode([(m.new_sequence(), PROMPT_IDS[:20])])[0]
            a, b = m.new_sequence(), m.new_sequence()
            m.decode([(a, PROMPT_IDS[:9]), (b, PROMPT_IDS[9:18])])
            f = m.flow()
            m.add_to(f, [(a, [5])], a)
            f.tick()
            m.add_to(f, [(b, [6])], b)
            f.tick()      # a's step went ahead to the second server
            assert any(mb.answer is not None for mb in f.queue)
            procs[1].stop()
            with pytest.raises(ConnectionLost):
                for _ in range(4):
                    for mb in f.tick():
                        m.add_to(f, [(mb.tag, [7])], mb.tag)
            assert all(mb.answer is None for mb in f.clear())
            a.close(), b.close()
            procs[1] = Proc(argvs[1], ports[1])
            got = m.decode([(m.new_sequence(), PROMPT_IDS[:20])])[0]
            assert np.array_equal(got, want)
    finally:
        for p in procs:
            p.stop()
