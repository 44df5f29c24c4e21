"""Micro-batches through the stages of a layer split as a pipeline, added as they come.

At each tick every stage runs at most one micro-batch, the oldest waiting for it,
and a micro-batch moves one stage per tick: while a server runs micro-batch i, the
server before it runs i + 1. Every request of a tick leaves before any answer is
read. Each server gets its micro-batches in the order they were added, with the
graph and inputs of one step at a time, so the logits are those of the same
micro-batches run one after the other.

`Model.decode` puts the micro-batches of one long decode through a Flow. `serve`
keeps one going between its steps: while one group of requests' micro-batch is on
the second server, the next group's runs on the first, and a group's next token
goes in as soon as its last one is sampled, so with as many groups as servers every
server works all the time (llama.cpp's client runs one batch through its servers
one after the other)."""
from __future__ import annotations

import dataclasses
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

    def __len__(self) -> int:
        return len(self.queue)

    def starts_now(self) -> bool:
        """Whether a micro-batch added now runs on the first stage at the next tick."""
        return all(mb.stage > self.first for mb in self.queue)

    def add(self, batch: tuple, tag=None) -> MicroBatch:
        """Queue a micro-batch (its KV cells are taken now)."""
        seqs, tokens, pos, out = batch
        key, values = self.model.kv.inputs(tokens, pos, seqs, out)
        mb = MicroBatch(batch, key, values, tag)
        self.queue.append(mb)
        return mb

    def tick(self) -> list[MicroBatch]:
        """Run one tick; the micro-batches that came out of the last stage, in order.
        A lost server: the other answers of the tick are read, and the error raised
        (the micro-batches in the queue then did not happen: `clear` them)."""
        m = self.model
        S = len(m.stages)
        for mb in self.queue:
            while self.inline[mb.stage]:
                answer, _ = m._issue(m.stages[mb.stage], mb.key, mb.values, mb.x)
                mb.x = bytes(answer())
                mb.stage += 1
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
                answer, hook = m._issue(m.stages[mb.stage], mb.key, mb.values, mb.x, hook, mb.stage == S - 1)
                waiting.append((mb, answer))
            done = []
            while waiting:
                mb, answer = waiting.pop(0)
                x = bytes(answer())     # the stage's result buffer is reused by its next micro-batch
                if mb.stage == S - 1:
                    mb.logits = m._logits(x, len(mb.batch[3]))
                    done.append(mb)
                else:
                    mb.x = x
                mb.stage += 1
        except ConnectionLost:
            for _, answer in waiting:
                try:
                    answer()
                except GgmlRpcError:
                    pass
            raise
        for mb in done:
            self.queue.remove(mb)
            m._batches.append(mb.batch)
        return done

    def clear(self) -> list[MicroBatch]:
        """Drop the queue (after an error); what it held."""
        dropped, self.queue = self.queue, []
        return dropped
