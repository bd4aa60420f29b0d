"""The shape of a model: `GPTConfig`, the presets and the precisions, without torch.

What a run config names and checks (protocol/config.py), apart from the modules that build the
model (protocol/model.py, which re-exports all of it): a config then reads without torch, and
`veriloco status` and `runs`, which read run configs, start without it (issue 32).
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.errors import VerilocoError

VOCAB_SIZE = 256  # bytes


class ModelError(VerilocoError):
    """A model config or parameter dict that does not fit together."""


ARCHS = ("gpt2", "llama")
# What the forward and backward compute in: "fp32" everywhere, or "bf16" autocast (matmuls and
# attention in bfloat16; norms, softmax, the loss, parameters, gradients and the optimizer in fp32).
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the model and the precision its forward runs in. Everything else (init, forward)
    is derived from it.

    ``n_kv_head`` (0: = n_head), ``d_ff`` (0: mlp_ratio * d_model), ``rope_theta`` and ``norm_eps``
    matter only for ``arch="llama"``, except d_ff which both use. ``precision`` is part of the math a
    verifier replays, so it is the run's, not a node's, choice (``model.precision`` in the run config).
    """

    n_layer: int
    n_head: int
    d_model: int
    seq_len: int  # context length T
    vocab_size: int = VOCAB_SIZE
    mlp_ratio: int = 4
    arch: str = "gpt2"
    n_kv_head: int = 0
    d_ff: int = 0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    precision: str = "fp32"

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ModelError(f"unknown architecture {self.arch!r}; choose one of {list(ARCHS)}")
        if self.precision not in PRECISIONS:
            raise ModelError(f"unknown precision {self.precision!r}; choose one of {list(PRECISIONS)}")
        if min(self.n_layer, self.n_head, self.d_model, self.seq_len, self.vocab_size) <= 0:
            raise ModelError(f"every GPTConfig dimension must be positive, got {self}")
        if self.n_kv_head < 0 or self.d_ff < 0:
            raise ModelError(f"n_kv_head and d_ff must be >= 0 (0: default), got {self}")
        if self.d_model % self.n_head:
            raise ModelError(
                f"d_model={self.d_model} must be divisible by n_head={self.n_head}; "
                "pick a head count that divides it"
            )
        if self.n_head % self.kv_heads:
            raise ModelError(f"n_head={self.n_head} must be a multiple of n_kv_head={self.kv_heads}")
        if self.arch == "llama" and self.head_dim % 2:
            raise ModelError(f"rotary embeddings need an even head size, got {self.head_dim}")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def ffn(self) -> int:
        return self.d_ff or self.mlp_ratio * self.d_model


ModelConfig = GPTConfig  # the name says GPT for history; it describes either architecture


PRESETS: dict[str, GPTConfig] = {
    # CI and the demo: trains in seconds on one CPU core (~0.13M params).
    "tiny": GPTConfig(n_layer=2, n_head=2, d_model=64, seq_len=64),
    # CPU benchmarks (~10.7M params).
    "small": GPTConfig(n_layer=6, n_head=6, d_model=384, seq_len=128),
    # The GPT-2 small shape (with a byte vocabulary, so ~85M params), for GPUs.
    "gpt2-124m": GPTConfig(n_layer=12, n_head=12, d_model=768, seq_len=1024),
    # Llama-style (RoPE, RMSNorm, SwiGLU, GQA); d_ff ~ 8/3 d_model as in Llama.
    "llama-tiny": GPTConfig(n_layer=2, n_head=2, d_model=64, seq_len=64, arch="llama", d_ff=176),
    "llama-small": GPTConfig(n_layer=6, n_head=6, d_model=384, seq_len=128, arch="llama", d_ff=1024),
    "llama-125m": GPTConfig(
        n_layer=12, n_head=12, d_model=768, seq_len=1024, arch="llama", n_kv_head=4, d_ff=2048
    ),
    "llama-1b": GPTConfig(
        n_layer=16, n_head=32, d_model=2048, seq_len=2048, arch="llama", n_kv_head=8, d_ff=8192,
        rope_theta=500000.0,
    ),
}


def preset(name: str) -> GPTConfig:
    """Look up a preset by name with a helpful error."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ModelError(
            f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}"
        ) from None
