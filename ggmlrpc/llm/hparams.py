"""A model's hyper-parameters as llama.cpp reads them from the GGUF metadata (its
llama-hparams): sizes, norms, rope and its scaling; what one architecture reads on
top comes from that architecture's module (ggmlrpc.llm.archs)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from .gguf_file import GGUFFile, ModelError

if TYPE_CHECKING:
    from .archs import Arch


@dataclass
class HParams:
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    eps: float
    rope_base: float
    rope_scale: float
    n_expert: int = 0
    n_expert_used: int = 0
    n_ctx_orig: int = 0            # rope's original context (0: n_ctx_train)
    n_swa: int = 0                 # sliding window (0: none)
    swa_pattern: int = 0           # layer il slides when il % swa_pattern < swa_pattern - 1
    swa_layers: tuple[bool, ...] = ()   # a window flag per layer, where the file lists them
    swa_chunked: bool = False      # llama4: the window is the position's chunk of n_swa, not the last n_swa
    rope_base_swa: float = 10000.0
    rope_scale_swa: float = 1.0
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    attn_temp_scale: float = 0.0   # attention temperature tuning (llama4, mistral3; 0: none): the
    attn_temp_floor: int = 0       # queries times log(floor((pos + offset) / floor) + 1) * scale + 1
    attn_temp_offset: float = 0.0
    moe_step: int = 0              # llama4: experts in every moe_step-th layer
    no_rope_step: int = 0          # llama4: every no_rope_step-th layer has no rope
    rope_ext_factor: float = 0.0   # YaRN: 1 (mix of interpolated and extrapolated frequencies)
    rope_attn_factor: float = 1.0  # rope's magnitude factor
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    # routed experts: how they are chosen and weighted (llama.cpp's build_moe_ffn)
    expert_gating: int = 0         # GATING_SOFTMAX (0: the same) or GATING_SIGMOID
    expert_weights_norm: bool = False
    expert_weights_scale: float = 0.0   # 0 or 1: not scaled
    n_expert_groups: int = 0       # > 1: experts chosen among the n_group_used best groups
    n_group_used: int = 0
    n_layer_dense_lead: int = 0    # the first layers have a dense feed-forward
    # multi-head latent attention (deepseek2): the compressed KV and its head sizes
    n_lora_q: int = 0
    n_lora_kv: int = 0
    head_dim_v: int = 0            # a value head where it differs from a key head (0: head_dim)
    head_dim_mla: int = 0          # a query/key head decompressed (0: no MLA)
    head_dim_v_mla: int = 0
    rope_yarn_log_mul: float = 0.0
    # attention shaped per layer (gemma4): the sliding-window layers' head size and
    # rotated dims (0: as the others), a K/V head count per layer
    head_dim_swa: int = 0
    n_rot_swa: int = 0
    n_head_kv_arr: tuple[int, ...] = ()
    # gemma4 E2B/E4B: a per-layer embedding of n_embd_per_layer values beside the
    # residual stream; only the first n_layer_kv layers keep a KV cache (0: all), the
    # later ones attend the cache of the last earlier layer of their kind
    n_embd_per_layer: int = 0
    n_layer_kv: int = 0
    ssm: dict | None = None        # a recurrent architecture's sizes (its module's hparams)

    @property
    def n_embd_kv(self) -> int:
        return self.head_dim * self.n_head_kv

    @property
    def n_embd_v(self) -> int:
        return (self.head_dim_v or self.head_dim) * self.n_head_kv

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention: a K cache only, V is its first n_lora_kv values."""
        return bool(self.head_dim_mla and self.head_dim_v_mla)

    def is_swa(self, il: int) -> bool:
        """Whether layer il attends a sliding window (gemma2: the even ones; gemma3:
        all but every sixth; gemma4: as its per-layer flags say)."""
        if self.swa_layers:
            return bool(self.n_swa) and bool(self.swa_layers[il])
        n = self.swa_pattern
        return bool(self.n_swa) and il % n < n - 1

    def head_dim_of(self, il: int) -> int:
        return self.head_dim_swa if self.head_dim_swa and self.is_swa(il) else self.head_dim

    def n_rot_of(self, il: int) -> int:
        return self.n_rot_swa if self.n_rot_swa and self.is_swa(il) else self.n_rot

    def n_head_kv_of(self, il: int) -> int:
        return self.n_head_kv_arr[il] if self.n_head_kv_arr else self.n_head_kv

    def n_embd_kv_of(self, il: int) -> int:
        """Layer il's K (and V) row: its head size times its K/V heads."""
        return self.head_dim_of(il) * self.n_head_kv_of(il)

    def n_embd_v_of(self, il: int) -> int:
        """Layer il's V row: as its K row, unless value heads have their own size."""
        return self.head_dim_v * self.n_head_kv_of(il) if self.head_dim_v else self.n_embd_kv_of(il)

    def kv_layer(self, il: int) -> int:
        """The layer whose KV cache layer il attends: its own, or (past the first
        n_layer_kv) the last of those of its kind (llama.cpp's layer reuse)."""
        if not self.n_layer_kv or il < self.n_layer_kv:
            return il
        return self.n_layer_kv - (2 if self.is_swa(il) else 1)

    def v_width(self, swa: bool) -> int:
        """The V row of the sliding-window layers (`swa`) or of the others."""
        return self.n_embd_v if self.head_dim_v else self.kv_width(swa)

    def kv_width(self, swa: bool) -> int:
        """The K/V row of the sliding-window layers (`swa`) or of the others (every
        layer of a kind has the same)."""
        return next((self.n_embd_kv_of(il) for il in range(self.n_layer) if self.is_swa(il) == swa),
                    self.n_embd_kv)

    @classmethod
    def from_gguf(cls, f: GGUFFile, n_vocab: int, arch: "Arch | None" = None) -> "HParams":
        """The common keys, and what `arch` reads on top (`arch.hparams(key)`, through
        `key(name, default)`: the file's `<arch>.name`, or the default)."""
        a = f.arch
        extra = {"swa_pattern": arch.swa_pattern} if arch is not None and arch.swa_pattern else {}
        if arch is not None and arch.hparams is not None:
            extra.update(arch.hparams(lambda name, default: f.get(f"{a}.{name}", default)))

        def key(name, default=None):
            v = f.get(f"{a}.{name}", default)
            if v is None:
                raise ModelError(f"{f.path}: missing {a}.{name}")
            return v

        n_embd, n_head = int(key("embedding_length")), int(key("attention.head_count"))
        kv = key("attention.head_count_kv", n_head)     # one count, or one per layer
        n_head_kv = tuple(int(x) for x in kv) if isinstance(kv, list) else (int(kv),)
        head_dim = int(key("attention.key_length", n_embd // n_head))
        ff = key("feed_forward_length")     # one width, or one per layer (the blocks read the matrices')
        scale = f.get(f"{a}.rope.scaling.factor") or f.get(f"{a}.rope.scale_linear")
        kind = str(f.get(f"{a}.rope.scaling.type", "linear"))
        if kind == "none":
            scale = None
        return cls(n_vocab=n_vocab, n_ctx_train=int(key("context_length")), n_embd=n_embd,
                   # the NextN/MTP layers a file may carry after the others are not run
                   n_layer=int(key("block_count")) - int(key("nextn_predict_layers", 0)),
                   n_ff=int(max(ff) if isinstance(ff, list) else ff),
                   n_head=n_head, n_head_kv=n_head_kv[0], n_head_kv_arr=n_head_kv if len(n_head_kv) > 1 else (),
                   head_dim=head_dim, n_rot=int(key("rope.dimension_count", head_dim)),
                   eps=float(f.get(f"{a}.attention.layer_norm_rms_epsilon")
                             or key("attention.layer_norm_epsilon")),
                   rope_base=float(key("rope.freq_base", 10000.0)),
                   rope_scale=1.0 / float(scale) if scale else 1.0,
                   n_expert=int(key("expert_count", 0)), n_expert_used=int(key("expert_used_count", 0)),
                   n_ctx_orig=int(key("rope.scaling.original_context_length", 0)),
                   n_expert_groups=int(key("expert_group_count", 0)),
                   n_group_used=int(key("expert_group_used_count", 0)),
                   **{**yarn_hparams(kind, 1.0 / float(scale) if scale else 1.0,
                                     float(f.get(f"{a}.rope.scaling.attn_factor", 1.0))),
                      **extra})


GATING_SOFTMAX, GATING_SIGMOID = 1, 2     # llama.cpp's expert gating functions


def yarn_hparams(kind: str, freq_scale: float, attn_factor: float, mscale: float | None = None) -> dict:
    """llama.cpp's rope extension factors: YaRN mixes in extrapolated frequencies
    (ext_factor 1); ggml's rope then grows the magnitude by 1 + 0.1 ln(factor), which
    llama.cpp's attention factor cancels again (both in F32, as llama.cpp computes
    them), times the file's own attention factor. `mscale`: YaRN's magnitude where
    an architecture sets its own (default 1 + 0.1 ln(factor)); an arch's hparams
    may return these keys to replace the common ones."""
    f32 = np.float32
    if kind != "yarn":
        return {"rope_attn_factor": attn_factor}
    factor = f32(1.0) / f32(freq_scale)
    lnf = f32(math.log(factor))
    if mscale is None:
        mscale = f32(1.0) if factor <= 1.0 else f32(0.1) * lnf + f32(1.0)
    mscale = f32(mscale)
    cancel = f32(1.0) / (f32(1.0) + f32(0.1) * lnf)
    return {"rope_ext_factor": 1.0, "rope_attn_factor": float(f32(mscale * cancel) * f32(attn_factor))}


def inverse_scale(key: Callable) -> float:
    """1 / rope.scaling.factor, or 1 without one (the sliding-window layers' rope scale)."""
    scale = key("rope.scaling.factor", None)
    return 1.0 / float(scale) if scale else 1.0
