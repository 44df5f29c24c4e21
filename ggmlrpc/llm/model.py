"""A GGUF model of one of the architectures of ggmlrpc.llm.archs spread over the
local CPU and RPC servers: loading, the steps (and a lost server's recovery), and
generation.

    model = Model.load("model.gguf", rpc=["10.0.0.2:50052"], n_gpu_layers=99)
    for piece in model.generate("Once upon a time", n_predict=16, temp=0):
        print(piece.decode(errors="replace"), end="", flush=True)
    model.close()

Placement follows llama.cpp (ggmlrpc.llm.placement): the token embeddings stay on
the local CPU; the last `n_gpu_layers` layers go to the servers' devices, in
contiguous runs in proportion to `tensor_split` (default: each device's free
memory); the output layer goes with the last layer when every layer is offloaded,
else it stays on the CPU. Each layer's KV cache (F16) lives beside it;
sliding-window layers keep only the window and a micro-batch of cells, reused as a
ring in llama.cpp's order (ggmlrpc.llm.kv_cache). Rope scaling (linear, YaRN) comes
from the file's metadata. Every device runs one graph per step (its layers), built
with ggmlrpc.builder exactly as llama.cpp builds it (ggmlrpc.llm.blocks: same ops
in the same order, flash attention, the output rows picked before the last
feed-forward), so our CPU executor gives llama.cpp's logits bit for bit; the
residual stream moves between devices with GET_TENSOR / SET_TENSOR. A decode step
whose graphs have the shapes of the previous one reruns them with
GRAPH_RECOMPUTE after writing the new inputs; a device's SET_TENSOR, GRAPH_RECOMPUTE
and GET_TENSOR leave in one write, so a step costs one round trip per device (the
least the data flow allows: each device needs the previous one's output, and the
first needs the token sampled from the last one's logits).
"""
from __future__ import annotations

import time
from typing import Iterator, Sequence

import numpy as np

from ..client import RemoteBuffer
from ..errors import ConnectionLost, GgmlRpcError
from ..local import LocalBackend
from .archs import ARCHS, SUPPORTED_ARCHS
from .blocks import build, stage_weights
from .gguf_file import GGUFFile, ModelError
from .hparams import HParams
from .kv_cache import KV_PAD, KVCache, SwaCells
from .placement import (Device, Stage, StageGraph, alloc_stage, assign_layers, open_devices, plan_stages,
                        send_weights, stage_graph)
from .sampling import Sampler
from .tokenizer import Tokenizer

__all__ = ["Model", "HParams", "SwaCells", "KV_PAD", "N_UBATCH", "SUPPORTED_ARCHS", "Device", "Stage",
           "assign_layers", "ModelError"]

N_UBATCH = 512        # prompt tokens per graph (llama.cpp's default micro-batch)


class Model:
    """A loaded model: tokenizer, weights on their devices, KV cache, generation."""

    def __init__(self):
        self.file: GGUFFile | None = None
        self.tokenizer: Tokenizer | None = None
        self.stages: list[Stage] = []
        self.backends: list = []
        self.n_past = 0
        self.tokens: list[int] = []
        self._held: dict[tuple, tuple] = {}    # (backend, device) -> (stage, key) of its graph
        self.cached_bytes = 0                  # weight bytes the servers' caches supplied
        self.history: list[list[int]] = []     # the batches run since the last reset
        self.reconnect = 0.0                   # seconds to wait for a lost server
        self.stop_reason: str | None = None
        self._mapped: RemoteBuffer | None = None   # the file mapping as a local buffer
        self.n_ubatch = N_UBATCH
        self.kv: KVCache | None = None

    @property
    def swa(self) -> SwaCells | None:
        """The sliding-window layers' cells (None: the model has none)."""
        return self.kv.swa if self.kv is not None else None

    # -- loading ---------------------------------------------------------------
    @classmethod
    def load(cls, path, rpc: Sequence[str] | str | None = None, n_gpu_layers: int = 99,
             tensor_split: Sequence[float] | None = None, n_ctx: int = 0,
             n_threads: int | None = None, flash_attn: bool = True, timeout: float = 120.0,
             progress=None, reconnect: float = 0.0, n_ubatch: int = N_UBATCH) -> "Model":
        """Open `path`, connect to `rpc` servers ("host:port", a list or a comma-separated
        string) and upload the weights (hash first: a server started with -c that has them
        cached is not sent the bytes). `progress(done, total, cached)` is called as
        bytes go. `reconnect`: seconds to wait for a server lost during generation
        (it gets its layers again and the context is replayed); 0 fails at once.
        `n_ubatch`: prompt tokens per graph (llama.cpp's -ub)."""
        m = cls()
        m.reconnect = reconnect
        m.n_ubatch = n_ubatch
        try:
            m._load(path, rpc, n_gpu_layers, tensor_split, n_ctx, n_threads, flash_attn,
                    timeout, progress)
        except BaseException:
            m.close()
            raise
        return m

    def _load(self, path, rpc, n_gpu_layers, tensor_split, n_ctx, n_threads, flash_attn,
              timeout, progress):
        f = self.file = GGUFFile(path)
        if f.arch not in SUPPORTED_ARCHS:
            raise ModelError(f"architecture {f.arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
        self.arch = ARCHS[f.arch]
        self.tokenizer = Tokenizer.from_gguf(f)
        hp = self.hp = HParams.from_gguf(f, self.tokenizer.n_vocab, self.arch)
        self.flash_attn = flash_attn
        self.n_ctx = n_ctx or hp.n_ctx_train
        if self.n_ubatch < 1:
            raise ModelError(f"micro-batch size must be at least 1, got {self.n_ubatch}")
        self.n_ubatch = min(self.n_ubatch, self.n_ctx)
        self.kv = KVCache(hp, self.n_ctx, self.n_ubatch, flash_attn)
        cpu, remote = open_devices(rpc, n_threads, timeout, self.backends)
        self.stages = plan_stages(cpu, remote, hp.n_layer, n_gpu_layers, tensor_split)
        self._upload(progress)

    def _upload(self, progress) -> None:
        total = sum(self._alloc_stage(st) for st in self.stages)
        done = 0

        def sent(nbytes: int, cached: bool) -> None:
            nonlocal done
            done += nbytes
            self._sent(nbytes, cached)
            if progress:
                progress(done, total, self.cached_bytes)

        for st in self.stages:
            send_weights(st, self.file, sent)
        # reserve the compute and input memory of the largest graph each stage runs
        for st in self.stages:
            self._graph(st, self.kv.largest(self.n_ubatch))
            st.graphs.clear()

    def _sent(self, nbytes: int, cached: bool) -> None:
        if cached:
            self.cached_bytes += nbytes

    def _alloc_stage(self, st: Stage) -> int:
        names = stage_weights(self.arch, self.hp, st, self.file.tensors)
        return alloc_stage(st, self.file, names, self.kv, self._file_buffer)

    def _file_buffer(self, be: LocalBackend) -> RemoteBuffer:
        """The whole file mapping as one read-only local buffer (made once)."""
        if self._mapped is None:
            self._mapped = be.map_buffer(self.file.reader.data)
        return self._mapped

    # -- graphs ----------------------------------------------------------------
    def _graph(self, st: Stage, key: tuple) -> StageGraph:
        return st.graphs.get(key) or stage_graph(st, key, self._build, self._held)

    def _build(self, st: Stage, key: tuple, align: int) -> StageGraph:
        return build(self.arch, self.hp, st, self.kv.cells, self.flash_attn, self.n_ctx, key, align)

    # -- evaluation ------------------------------------------------------------
    def reset(self) -> None:
        """Forget the context (cells past the new tokens are masked, never read)."""
        self.n_past = 0
        self.tokens = []
        self.history = []
        if self.kv is not None:
            self.kv.reset()

    def eval(self, tokens: Sequence[int]) -> np.ndarray:
        """Run `tokens` after the context so far; the logits of the last one (F32, n_vocab)."""
        tokens = list(tokens)
        if not tokens:
            raise ValueError("eval needs at least one token")
        if self.n_past + len(tokens) > self.n_ctx:
            raise ModelError(f"context full: {self.n_past} + {len(tokens)} tokens > n_ctx {self.n_ctx}")
        for t in tokens:
            if not 0 <= t < self.hp.n_vocab:
                raise ValueError(f"token {t} outside the vocabulary")
        logits = None
        for i in range(0, len(tokens), self.n_ubatch):
            logits = self._step(tokens[i:i + self.n_ubatch])
        return logits

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """Make the context exactly `tokens` and return the last one's logits, running
        only what the context does not already hold: the longest common prefix is kept
        (a chat's next turn, a prompt that shares a system prompt), the rest is
        dropped and the new tokens are evaluated. At least one token is always run,
        since its logits are the result. Sliding-window caches cannot take back a
        token, so a model with one starts over when the prefix diverges."""
        tokens = list(tokens)
        if not tokens:
            raise ValueError("prefill needs at least one token")
        keep = 0
        for keep, (a, b) in enumerate(zip(self.tokens, tokens[:-1])):
            if a != b:
                break
        else:
            keep = min(len(self.tokens), len(tokens) - 1)
        if keep < len(self.tokens):
            if self.swa is not None:
                self.reset()
                keep = 0
            else:
                self.truncate(keep)
        return self.eval(tokens[keep:])

    def truncate(self, n: int) -> None:
        """Forget the context after its first `n` tokens (their cells are masked from
        then on and overwritten by the next tokens)."""
        if not 0 <= n <= self.n_past:
            raise ValueError(f"cannot keep {n} of {self.n_past} tokens")
        if n == self.n_past:
            return
        if n == 0 or self.swa is not None:
            if n and self.swa is not None:
                raise ModelError("a sliding-window cache cannot drop its last tokens")
            self.reset()
            return
        history, left = [], n
        for batch in self.history:
            if left <= 0:
                break
            history.append(batch[:left])
            left -= len(batch)
        self.history = history
        self.n_past = n
        self.tokens = self.tokens[:n]

    def stream(self, ids: Sequence[int], n_predict: int, sampler: Sampler,
               reuse: bool = False) -> Iterator[tuple[int, np.ndarray]]:
        """Generate after the context `ids`: yields each new token with the logits it
        was drawn from. `reuse` keeps what the context already holds of `ids`
        (`prefill`); else the context starts empty. n_predict < 0: until an
        end-of-generation token or a full context. Sets `stop_reason` ("eog",
        "length" or "context") when it ends. The last token yielded is not yet in the
        context: the next `prefill` or `eval` runs it."""
        tok = self.tokenizer
        self.stop_reason = None
        if not reuse:
            self.reset()
        logits = self.prefill(ids)
        n = 0
        while True:
            if 0 <= n_predict <= n:
                self.stop_reason = "length"
                return
            t = sampler(logits)
            n += 1
            yield t, logits
            if tok.is_eog(t):
                self.stop_reason = "eog"
                return
            if self.n_past >= self.n_ctx:
                self.stop_reason = "context"
                return
            if 0 <= n_predict <= n:
                self.stop_reason = "length"
                return
            logits = self.eval([t])

    def _step(self, tokens: list[int]) -> np.ndarray:
        """One batch through every stage; a server lost on the way is waited for (up
        to `reconnect` seconds), given its layers again, and the context so far is
        replayed in the batches it was first run in, so the result is the same."""
        lost = None
        deadline = 0.0
        while True:
            try:
                if lost is not None:
                    self._recover(lost, deadline)
                return self._run_step(tokens)
            except ConnectionLost as e:
                if getattr(e, "backend", None) is None or self.reconnect <= 0:
                    raise
                if lost is not e.backend:
                    deadline = time.monotonic() + self.reconnect
                lost = e.backend

    def _recover(self, be, deadline: float) -> None:
        cause = None
        delay = 0.1
        while True:
            try:
                be.connect()
                for st in self.stages:
                    if st.device.backend is be:
                        self._alloc_stage(st)
                        send_weights(st, self.file, self._sent)
                break
            except ConnectionLost as e:
                if getattr(e, "backend", be) is not be:
                    raise
                cause = e
                if time.monotonic() + delay > deadline:
                    raise ModelError(f"server {be.endpoint} lost and not back within "
                                     f"{self.reconnect:g} s ({cause})") from None
                time.sleep(delay)
                delay = min(2 * delay, 2.0)
        self._held = {k: v for k, v in self._held.items() if k[0] != id(be)}
        history = self.history
        self.reset()
        try:
            for batch in history:
                self._run_step(batch)
        except BaseException:
            self.history = history      # replay again after the next recovery
            raise

    def _run_step(self, tokens: list[int]) -> np.ndarray:
        saved = self.kv.save()
        try:
            return self._run_stages(tokens)
        except BaseException:
            self.kv.restore(saved)     # the batch did not happen: its cells are free again
            raise

    def _run_stages(self, tokens: list[int]) -> np.ndarray:
        T = len(tokens)
        key, values = self.kv.inputs(tokens, self.n_past)
        x = None
        for st in self.stages:
            be, dev = st.device.backend, st.device.index
            try:
                g = self._graph(st, key)
                values["embd"] = x
                # inputs, graph and the read of its result leave in one write: one
                # round trip per device per step
                with be.corked():
                    g.write_inputs(be, values)
                    # a device holds one graph: rerun it when it is this stage's graph of this shape
                    held = (id(be), dev)
                    if self._held.get(held) == (id(st), key):
                        be.graph_recompute(dev)
                    else:
                        be.graph_compute(g.graph.nodes, dev)
                        self._held[held] = (id(st), key)
                    x = be.get_tensor(g.out, out=g.result)
            except ConnectionLost as e:
                e.backend = be
                raise
        self.n_past += T
        self.tokens += tokens
        self.history.append(list(tokens))
        return np.frombuffer(x, dtype=np.float32)[-self.hp.n_vocab:].copy()

    def generate(self, prompt: str | bytes | Sequence[int], n_predict: int = -1, *,
                 temp: float = 0.8, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 seed: int | None = None, ignore_eos: bool = False,
                 echo: bool = False) -> Iterator[bytes]:
        """Generate after `prompt` (text, tokenized with BOS and special tokens, or token
        ids), from an empty context; yields each new token's text (bytes, as llama.cpp
        prints it), the prompt's first when `echo`. n_predict < 0: until an
        end-of-generation token or a full context. `self.stop_reason` says why it ended
        ("eog", "length" or "context")."""
        ids = list(prompt) if not isinstance(prompt, (str, bytes)) else self.tokenize(prompt)
        tok = self.tokenizer
        sampler = Sampler(temp, top_k, top_p, min_p, seed, banned=tok.eog if ignore_eos else ())
        self.reset()
        self.stop_reason = None
        if echo:
            for t in ids:
                yield tok.token_to_piece(t)
        for t, _ in self.stream(ids, n_predict, sampler):
            yield tok.token_to_piece(t)

    # -- API -------------------------------------------------------------------
    def tokenize(self, text, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.tokenizer.tokenize(text, add_special, parse_special)

    def detokenize(self, tokens, remove_special: bool = False, unparse_special: bool = False) -> bytes:
        return self.tokenizer.detokenize(tokens, remove_special, unparse_special)

    def close(self) -> None:
        for st in self.stages:
            st.graphs.clear()
        for be in self.backends:
            try:
                be.close()
            except GgmlRpcError:
                pass
        self.backends.clear()
        self.stages = []
        self._mapped = None
        if self.file is not None:
            self.file.close()
            self.file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
