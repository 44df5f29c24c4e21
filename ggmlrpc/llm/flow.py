"""Micro-batches through the stages of a layer split as a pipeline, added as they come.

At each tick every stage runs at most one micro-batch, the oldest waiting for it,
and a micro-batch moves one stage per tick: while a server runs micro-batch i, the
server before it runs i + 1. Every request of a tick leaves before any answer is
read, and the answers are read as they come. A micro-batch that a small step takes
on to a server (a decode step: the graph the server holds rerun, a few kilobytes of
inputs) goes there as soon as its previous stage answers, behind that server's
request of this tick: the server starts it the moment it is done, rather than after
the whole tick's answers and the host's work between ticks. Each server gets its
micro-batches in the order they were added, with the graph and inputs of one step
at a time, so the logits are those of the same micro-batches run one after the
other.

`Model.decode` puts the micro-batches of one long decode through a Flow. `serve`
keeps one going between its steps: while one group of requests' micro-batch is on
the second server, the next group's runs on the first, and a group's next token
goes in as soon as its last one is sampled, so with as many groups as servers every
server works all the time (llama.cpp's client runs one batch through its servers
one after the other)."""
from __future__ import annotations

import dataclasses
import itertools
import select
from typing import TYPE_CHECKING

from ..client import RemoteBackend
from ..errors import ConnectionLost, GgmlRpcError

if TYPE_CHECKING:
    from .model import Model


@dataclasses.dataclass(eq=False)
class MicroBatch:
    batch: tuple            # (sequence ids, tokens, positions, output rows)
    key: tuple              # the graph key and input values of the batch
    values: dict
    tag: object = None      # the caller's
    stage: int = 0          # the next stage to run it
    x: bytes | None = None  # the previous stage's result
    logits: object = None   # the output rows' logits, once through the last stage
    answer: object = None   # its next stage's answer, where it went ahead (Flow._ahead)
    sent: int = 0           # when its request left (answers are read in this order per server)


def inline_stages(stages) -> list[bool]:
    """Which stages run inline, taking no tick of their own: one on this host with no
    layers (the token embedding: a row lookup) runs as its micro-batch goes on to the
    next stage. As a stage of its own it would cost a tick in every micro-batch's
    way through, and two groups of requests could not keep two servers busy."""
    return [k < len(stages) - 1 and not st.layers and not st.output
            and not isinstance(st.device.backend, RemoteBackend) for k, st in enumerate(stages)]


class Flow:
    """Micro-batches of one model going through its stages as a pipeline."""

    def __init__(self, model: "Model"):
        self.model = model
        self.queue: list[MicroBatch] = []    # in the order they were added
        self.inline = inline_stages(model.stages)
        self.first = self.inline.index(False)     # the first stage that takes a tick
        self.depth = self.inline.count(False)     # the ticks a micro-batch takes
        self._sent = itertools.count(1)

    def __len__(self) -> int:
        return len(self.queue)

    def starts_now(self) -> bool:
        """Whether a micro-batch added now runs on the first stage at the next tick (or
        right after the one that stage runs now, with nothing else waiting for it)."""
        at = [mb for mb in self.queue if mb.stage <= self.first]
        return not at or len(at) == 1 and at[0].stage == self.first and at[0].answer is not None

    def add(self, batch: tuple, tag=None) -> MicroBatch:
        """Queue a micro-batch (its KV cells are taken now)."""
        seqs, tokens, pos, out = batch
        key, values = self.model.kv.inputs(tokens, pos, seqs, out)
        mb = MicroBatch(batch, key, values, tag)
        self.queue.append(mb)
        return mb

    def tick(self, land=None) -> list[MicroBatch]:
        """Run one tick; the micro-batches that came out of the last stage, in order.
        `land(mb)`, where given, is called as each one comes out, while the other
        answers of the tick are still on their way: the micro-batches it adds (the
        next tokens of the requests that landed) go to the first server at once,
        behind what that server runs (a small step), so that it starts them the
        moment it is done rather than after the tick; they are read next tick. A
        lost server: the other answers of the tick are read, and the error raised
        (the micro-batches in the queue then did not happen: `clear` them)."""
        m = self.model
        S = len(m.stages)
        for mb in self.queue:
            self._inline(mb)
        taken, active = set(), []
        for mb in self.queue:
            if mb.stage not in taken:
                taken.add(mb.stage)
                active.append(mb)
        # the servers' requests first, then the local graphs, then the answers
        active.sort(key=lambda mb: not isinstance(m.stages[mb.stage].device.backend, RemoteBackend))
        hook = m.on_wait
        waiting = []
        try:
            for mb in active:
                if mb.answer is None:      # else it went ahead last tick
                    mb.answer, hook = m._issue(m.stages[mb.stage], mb.key, mb.values, mb.x, hook, mb.stage == S - 1)
                    mb.sent = next(self._sent)
                waiting.append(mb)
            waiting.sort(key=lambda mb: mb.sent)
            if hook is not None:      # every request of the tick went ahead: it runs while we wait
                for mb in waiting:
                    be = m.stages[mb.stage].device.backend
                    if isinstance(be, RemoteBackend):
                        be.waiting = hook
                        break
            done = []
            while waiting:
                mb = self._ready(waiting)
                waiting.remove(mb)
                answer, mb.answer = mb.answer, None
                x = bytes(answer())     # the stage's result buffer is reused by its next micro-batch
                if mb.stage == S - 1:
                    mb.logits = m._logits(x, len(mb.batch[3]))
                    done.append(mb)
                else:
                    mb.x = x
                mb.stage += 1
                if mb.stage < S:
                    self._ahead(mb, active)
                elif land is not None:
                    self._out(mb)
                    land(mb)
                    for new in self.queue:
                        if new.answer is None and new not in active:
                            self._inline(new)
                            self._ahead(new, active)
        except ConnectionLost:
            _drain(waiting)
            raise
        for mb in done:
            if land is None:
                self._out(mb)
        return done

    def _out(self, mb: MicroBatch) -> None:
        """`mb` came out of the last stage: it leaves the queue."""
        self.queue.remove(mb)
        self.model._batches.append(mb.batch)

    def _inline(self, mb: MicroBatch) -> None:
        """Run `mb` through the inline stages it is at (on to the next stage that
        takes a tick)."""
        m = self.model
        while self.inline[mb.stage]:
            answer, _ = m._issue(m.stages[mb.stage], mb.key, mb.values, mb.x)
            mb.x = bytes(answer())
            mb.stage += 1

    def _ahead(self, mb: MicroBatch, active: list[MicroBatch]) -> None:
        """Send `mb` on to its next stage now, where that is a server's small step and
        mb is the oldest micro-batch the stage will take next (any other one there is
        this tick's, on its way out)."""
        m = self.model
        st = m.stages[mb.stage]
        if (self.inline[mb.stage] or not isinstance(st.device.backend, RemoteBackend)
                or not m._small_step(st, mb.key)):
            return
        for o in self.queue:
            if o is mb:
                break
            if o.stage == mb.stage and o not in active:
                return
        mb.answer, _ = m._issue(st, mb.key, mb.values, mb.x, None, mb.stage == len(m.stages) - 1)
        mb.sent = next(self._sent)

    def _ready(self, waiting: list[MicroBatch]) -> MicroBatch:
        """The waiting micro-batch whose answer to read next: of each server's oldest
        request, the first whose answer has begun to arrive (a local stage's is there),
        so that the one that finishes first moves on first."""
        m = self.model
        heads, fds = {}, {}
        for mb in waiting:
            be = m.stages[mb.stage].device.backend
            if id(be) in heads:
                continue
            heads[id(be)] = mb
            fd = be.fileno() if isinstance(be, RemoteBackend) else None
            if fd is None:
                return mb
            fds[fd] = mb
        if len(heads) == 1:
            return waiting[0]
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        ready = poller.poll(0)
        if not ready:
            for mb in heads.values():     # the caller's work while the servers compute
                m.stages[mb.stage].device.backend.run_waiting()
            ready = poller.poll(1000)
        if not ready:      # a slow server: wait on the first, under its own deadline
            return waiting[0]
        return min((fds[fd] for fd, _ in ready), key=lambda mb: mb.sent)

    def clear(self) -> list[MicroBatch]:
        """Drop the queue (after an error); what it held. The answers of micro-batches
        sent ahead are read first, so that each server's next answer is its next
        request's."""
        dropped, self.queue = self.queue, []
        _drain(sorted((mb for mb in dropped if mb.answer is not None), key=lambda mb: mb.sent))
        return dropped


def _drain(mbs) -> None:
    """Read and drop the answers the micro-batches still wait for, in order (a lost
    server's raise), so that each server's next answer is its next request's."""
    for mb in mbs:
        try:
            mb.answer()
        except GgmlRpcError:
            pass
        mb.answer = None
