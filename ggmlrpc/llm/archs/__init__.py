"""The architectures the runner builds: one module each (as llama.cpp's src/models/),
found here by name. A module declares `ARCH = Arch(...)`: the GGUF architecture
name, its rope mode, what it reads from the metadata on top of the common
hyper-parameters, its per-layer weights, its layer graph (over ggmlrpc.llm.blocks),
how ggmlrpc.llm.synth writes a random model of it, and its README line.

    python -m ggmlrpc.llm.archs      # the README's table of architectures
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Callable

ROPE_NORM, ROPE_NEOX = 0, 2     # rope on consecutive pairs / on the two halves of each head


@dataclass(frozen=True)
class Arch:
    name: str                   # general.architecture
    about: str                  # what its graph adds, for the README's table
    rope_mode: int
    weights: Callable           # (HParams) -> the per-layer tensors, blk.N.<name>.weight, in upload order
    layer: Callable             # (blocks.Ctx, il, x) -> the layer's output
    hparams: Callable | None = None   # (key) -> HParams fields it reads on top; key(name, default)
    layer_weights: Callable | None = None   # (HParams, il) -> layer il's tensors (whole names: "ffn_up.weight") on top of `weights`
    layer_norm: bool = False    # LayerNorm with biases where the others take an RMS norm
    scale_embd: bool = False    # embeddings scaled by sqrt(n_embd)
    swa_pattern: int = 0        # layer il slides when il % swa_pattern < swa_pattern - 1 (0: none)
    # synth: the random models of it (name -> writer(_Synth)), the share of each head
    # those models rotate, and what a small test model changes in tests' shape
    synth: dict[str, Callable] = field(default_factory=dict)
    synth_rope_share: float = 1.0
    test_shape: dict = field(default_factory=dict)
    # a recurrent state beside the layers: (HParams, il) -> the shapes of layer il's F32
    # state tensors for one sequence (none: the layer keeps only its KV cache)
    state: Callable | None = None
    # values the layers read beside the residual stream, computed on the embeddings'
    # stage: (blocks.Ctx, x) -> {name: (rows, n_tokens) F32} (gemma4's per-layer
    # embeddings), from the file's `input_weights` where it has them
    inputs: Callable | None = None
    input_weights: tuple[str, ...] = ()


def _discover() -> dict[str, Arch]:
    found = {}
    for m in pkgutil.iter_modules(__path__):
        if m.name.startswith("_"):
            continue
        arch = importlib.import_module(f"{__name__}.{m.name}").ARCH
        found[arch.name] = arch
    return found


ARCHS: dict[str, Arch] = _discover()
SUPPORTED_ARCHS = tuple(ARCHS)


def readme_table() -> str:
    """The README's table: each architecture and what its graph adds."""
    rows = [f"| `{a.name}` | {a.about} |" for a in ARCHS.values()]
    return "\n".join(["| architecture | what its graph has |", "|---|---|", *rows])
