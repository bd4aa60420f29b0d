"""The model every role trains and replays: a small nanoGPT-like GPT over bytes (vocabulary 256).

Parameters live outside the module, as a plain ``dict[str, Tensor]`` named exactly like
``named_parameters()``; the module is only the computation (built on the meta device, so it holds
no memory) and is run on a given parameter dict with ``torch.func.functional_call``. That is what
lets a training state be a flat dict of tensors that digests, serialises and replays directly.

No dropout and no randomness in the forward pass: a step is a pure function of params and batch.
Run ``python -m protocol.model`` to print the presets and their parameter counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from protocol.errors import VerilocoError

VOCAB_SIZE = 256  # bytes


class ModelError(VerilocoError):
    """A model config or parameter dict that does not fit together."""


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the GPT. Everything else (init, forward) is derived from it."""

    n_layer: int
    n_head: int
    d_model: int
    seq_len: int  # context length T
    vocab_size: int = VOCAB_SIZE
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        if min(self.n_layer, self.n_head, self.d_model, self.seq_len, self.vocab_size) <= 0:
            raise ModelError(f"every GPTConfig dimension must be positive, got {self}")
        if self.d_model % self.n_head:
            raise ModelError(
                f"d_model={self.d_model} must be divisible by n_head={self.n_head}; "
                "pick a head count that divides it"
            )


PRESETS: dict[str, GPTConfig] = {
    # CI and the demo: trains in seconds on one CPU core (~0.13M params).
    "tiny": GPTConfig(n_layer=2, n_head=2, d_model=64, seq_len=64),
    # CPU benchmarks (~10.7M params).
    "small": GPTConfig(n_layer=6, n_head=6, d_model=384, seq_len=128),
    # The GPT-2 small shape (with a byte vocabulary, so ~85M params), for GPUs.
    "gpt2-124m": GPTConfig(n_layer=12, n_head=12, d_model=768, seq_len=1024),
}


def preset(name: str) -> GPTConfig:
    """Look up a preset by name with a helpful error."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ModelError(
            f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}"
        ) from None


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_head = cfg.n_head
        self.ln_1 = nn.LayerNorm(d, bias=False)
        self.attn_qkv = nn.Linear(d, 3 * d, bias=False)
        self.attn_proj = nn.Linear(d, d, bias=False)
        self.ln_2 = nn.LayerNorm(d, bias=False)
        self.mlp_fc = nn.Linear(d, cfg.mlp_ratio * d, bias=False)
        self.mlp_proj = nn.Linear(cfg.mlp_ratio * d, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape  # x: (B, T, D)
        q, k, v = self.attn_qkv(self.ln_1(x)).split(d, dim=2)  # each (B, T, D)
        hd = d // self.n_head
        q, k, v = (
            z.view(b, t, self.n_head, hd).transpose(1, 2) for z in (q, k, v)
        )  # (B, nh, T, hd)
        # Explicit attention (not SDPA) so the kernel choice cannot change between builds or devices.
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # (B, nh, T, T)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)  # (B, T, D)
        x = x + self.attn_proj(y)
        x = x + self.mlp_proj(F.gelu(self.mlp_fc(self.ln_2(x))))
        return x


class GPT(nn.Module):
    """Token + position embedding, n_layer blocks, final norm, untied LM head.

    The three pieces (``embed``, ``blocks``, ``head``) are separate methods so the pipeline can
    split the model into stages without renaming a parameter.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)  # (V, D)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)  # (T, D)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=False)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)  # (V, D)

    def embed(self, idx: Tensor) -> Tensor:
        t = idx.shape[1]  # idx: (B, T) int64
        if t > self.cfg.seq_len:
            raise ModelError(f"sequence length {t} exceeds the model context {self.cfg.seq_len}")
        pos = torch.arange(t, device=idx.device)
        return self.wte(idx) + self.wpe(pos)  # (B, T, D)

    def head(self, x: Tensor) -> Tensor:
        return self.lm_head(self.ln_f(x))  # (B, T, V)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)  # logits (B, T, V)


@lru_cache(maxsize=8)
def skeleton(cfg: GPTConfig) -> GPT:
    """The module without storage (meta device): only its structure and parameter names are used."""
    with torch.device("meta"):
        return GPT(cfg)


def param_shapes(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Parameter names (named_parameters order) and shapes."""
    return {n: tuple(p.shape) for n, p in skeleton(cfg).named_parameters()}


def n_params(cfg: GPTConfig) -> int:
    return sum(math.prod(s) for s in param_shapes(cfg).values())


def init_params(cfg: GPTConfig, seed: int) -> dict[str, Tensor]:
    """Deterministic fp32 init from a seed (GPT-2 scheme), on CPU, independent of global RNG state.

    Normal(0, 0.02) for weights, scaled by 1/sqrt(2 n_layer) for the projections that write into the
    residual stream; LayerNorm weights are ones. Parameters are drawn in named_parameters order
    from one generator, so the same (cfg, seed) always gives the same bytes.
    """
    g = torch.Generator().manual_seed(seed)
    resid_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    out: dict[str, Tensor] = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            out[name] = torch.ones(shape)
        else:
            std = resid_std if name.endswith(("attn_proj.weight", "mlp_proj.weight")) else 0.02
            out[name] = torch.empty(shape).normal_(0.0, std, generator=g)
    return out


def check_params(cfg: GPTConfig, params: dict[str, Tensor]) -> None:
    """Raise ModelError unless ``params`` has exactly the model's names and shapes, in float32."""
    shapes = param_shapes(cfg)
    missing, extra = shapes.keys() - params.keys(), params.keys() - shapes.keys()
    if missing or extra:
        raise ModelError(
            f"parameter names do not match the model: missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(extra)[:3]}; was the state made for another preset?"
        )
    for n, s in shapes.items():
        t = params[n]
        if tuple(t.shape) != s or t.dtype != torch.float32:
            raise ModelError(f"parameter {n!r} is {t.dtype} {tuple(t.shape)}, expected float32 {s}")


def forward(cfg: GPTConfig, params: dict[str, Tensor], idx: Tensor) -> Tensor:
    """Logits (B, T, V) for token ids ``idx`` (B, T), computed with the given parameters."""
    return functional_call(skeleton(cfg), params, (idx,), strict=True)  # type: ignore[no-any-return]


def loss_fn(cfg: GPTConfig, params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
    """Mean next-byte cross-entropy (nats) of targets ``y`` (B, T) given inputs ``x`` (B, T)."""
    logits = forward(cfg, params, x)
    return F.cross_entropy(logits.reshape(-1, cfg.vocab_size), y.reshape(-1))


if __name__ == "__main__":
    for name, c in PRESETS.items():
        print(f"{name:10s} {n_params(c) / 1e6:8.2f}M params  {c}")
