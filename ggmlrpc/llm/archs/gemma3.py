"""gemma3: gemma2's layer with per-head q/k norms, five sliding-window layers in six
with their own rope base, no soft-capping of the scores."""
from __future__ import annotations

from functools import partial

from . import ROPE_NEOX, Arch, gemma2


def hparams(key) -> dict:
    return {"n_swa": int(key("attention.sliding_window", 0)),
            "rope_base_swa": float(key("rope.freq_base_swa", 10000.0)),
            "final_softcap": float(key("final_logit_softcapping", 0.0))}


def keys(s) -> None:
    s.add_f32("gemma3.rope.freq_base_swa", 10000.0)


ARCH = Arch("gemma3", "gemma2's layer with q/k norms, five sliding-window layers in six with their "
            "own rope base, no soft-capped attention",
            ROPE_NEOX, gemma2.weights, partial(gemma2.layer, n_layer_27b=62), hparams,
            scale_embd=True, swa_pattern=6, synth={"gemma3": partial(gemma2.write, keys=keys, qk_norms=True)},
            test_shape={"n_layer": 7, "rope_base": 1e6})
