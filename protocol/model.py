"""The models every role trains and replays: a nanoGPT-like GPT-2 and a Llama-style transformer.

Two architectures share one config type and one calling convention. ``gpt2``: learned positions,
LayerNorm, GELU MLP. ``llama``: rotary position embeddings, RMSNorm, SwiGLU MLP, grouped-query
attention, no biases. Both default to the byte vocabulary (256); a run on a tokenized corpus sets
its own ``vocab_size`` (``protocol.config.RunConfig.model_config``).

Parameters live outside the module, as a plain ``dict[str, Tensor]`` named exactly like
``named_parameters()``; the module is only the computation (built on the meta device, so it holds
no memory) and is run on a given parameter dict with ``torch.func.functional_call``. That is what
lets a training state be a flat dict of tensors that digests, serialises and replays directly.

No dropout and no randomness in the forward pass: a step is a pure function of params and batch.
Run ``python -m protocol.model`` to print the presets and their parameter counts:

============  =====  =====  ====  ==  ==  =====  ====  ===========  ============
preset        arch   layer  d     h   kv  d_ff   seq   params V=256  params V=32K
============  =====  =====  ====  ==  ==  =====  ====  ===========  ============
tiny          gpt2   2      64    2   2   256    64    0.14M        4.2M
small         gpt2   6      384   6   6   1536   128   10.87M       35.2M
gpt2-124m     gpt2   12     768   12  12  3072   1024  86.13M       134.9M
llama-tiny    llama  2      64    2   2   176    64    0.13M        4.2M
llama-small   llama  6      384   6   6   1024   128   10.82M       35.2M
llama-125m    llama  12     768   12  4   2048   1024  75.91M       124.7M
llama-1b      llama  16     2048  32  8   8192   2048  974.19M      1104.2M
============  =====  =====  ====  ==  ==  =====  ====  ===========  ============

``llama-1b`` is the Llama-3.2-1B body (16 layers, d 2048, 32 query / 8 kv heads, d_ff 8192; that
model ties its 128K-vocabulary embeddings); ``llama-125m`` is named, like ``gpt2-124m``, for its size
with a BPE vocabulary. Bitwise replay is tested on CPU up to ``llama-125m``; ``llama-1b`` (16 GB of
fp32 training state) is defined for GPUs, its shapes tested on the meta device.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

# the shape of a model lives in protocol/modelconfig.py, without torch; its names stay importable from here
from protocol.modelconfig import (  # noqa: F401
    ARCHS,
    PRECISIONS,
    PRESETS,
    VOCAB_SIZE,
    GPTConfig,
    ModelConfig,
    ModelError,
    preset,
)


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Softmax attention with a causal mask; q, k, v (B, nh, T, hd) -> (B, nh, T, hd).

    Explicit (not SDPA) so the kernel choice cannot change between builds or devices.
    """
    t, hd = q.shape[-2], q.shape[-1]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # (B, nh, T, T)
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return att @ v


ATTENTION, MLP = 0, 1  # the two halves of a transformer block, in forward order


def half_of(module: str) -> int:
    """Which half of a block a submodule (``ln_1``, ``attn_qkv``, ``mlp_fc``, ...) belongs to.

    Both architectures name the attention half ``ln_1`` + ``attn_*`` and the MLP half ``ln_2`` +
    ``mlp_*``; a block's ``attend`` reads only the first, ``feed`` only the second, so each half
    is an audit block of its own (``protocol.leaf.block_of``).
    """
    if module == "ln_1" or module.startswith("attn_"):
        return ATTENTION
    if module == "ln_2" or module.startswith("mlp_"):
        return MLP
    raise ModelError(f"block submodule {module!r} is in neither half (ln_1/attn_* or ln_2/mlp_*)")


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
        self.mlp_fc = nn.Linear(d, cfg.ffn, bias=False)
        self.mlp_proj = nn.Linear(cfg.ffn, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.feed(self.attend(x))

    def attend(self, x: Tensor) -> Tensor:
        """The attention half: x + attn(ln_1(x)) (its own audit block, ``half_of``)."""
        b, t, d = x.shape  # x: (B, T, D)
        q, k, v = self.attn_qkv(self.ln_1(x)).split(d, dim=2)  # each (B, T, D)
        hd = d // self.n_head
        q, k, v = (
            z.view(b, t, self.n_head, hd).transpose(1, 2) for z in (q, k, v)
        )  # (B, nh, T, hd)
        # Explicit attention (not SDPA) so the kernel choice cannot change between builds or devices.
        y = causal_attention(q, k, v).transpose(1, 2).reshape(b, t, d)  # (B, T, D)
        return x + self.attn_proj(y)

    def feed(self, x: Tensor) -> Tensor:
        """The MLP half: x + mlp(ln_2(x))."""
        return x + self.mlp_proj(F.gelu(self.mlp_fc(self.ln_2(x))))


class GPT(nn.Module):
    """Token + position embedding, n_layer blocks, final norm, untied LM head.

    The three pieces (``embed``, ``blocks``, ``head``) are separate methods so the pipeline can
    split the model into stages without renaming a parameter.
    """

    wte: nn.Embedding
    wpe: nn.Embedding
    ln_f: nn.Module  # LayerNorm here, RMSNorm in Llama
    lm_head: nn.Linear

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.add_embed(self, cfg)
        self.blocks = nn.ModuleList(self.block(cfg) for _ in range(cfg.n_layer))
        self.add_head(self, cfg)

    # add_embed / add_head / block are what a pipeline stage borrows to build its part of the model.
    @staticmethod
    def add_embed(m: nn.Module, cfg: GPTConfig) -> None:
        m.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)  # (V, D)
        m.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)  # (T, D)

    @staticmethod
    def add_head(m: nn.Module, cfg: GPTConfig) -> None:
        m.ln_f = nn.LayerNorm(cfg.d_model, bias=False)
        m.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)  # (V, D)

    @staticmethod
    def block(cfg: GPTConfig) -> nn.Module:
        return Block(cfg)

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


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 as Llama does (no mean subtraction, no bias)."""

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rotary(t: int, hd: int, theta: float, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos, sin (T, hd) of rotary embeddings, half-split layout (Hugging Face's ``rotate_half``).

    Recomputed each forward from (t, hd, theta): nothing but parameters lives in the state.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, device=device).float() / hd))  # (hd/2,)
    freqs = torch.outer(torch.arange(t, device=device).float(), inv_freq)  # (T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, hd)
    return emb.cos(), emb.sin()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (B, h, T, hd) by position: x * cos + rotate_half(x) * sin."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaBlock(nn.Module):
    """Pre-norm block: x + attn(rmsnorm(x)) with RoPE and grouped-query heads, then x + swiglu(rmsnorm(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        d, hd = cfg.d_model, cfg.head_dim
        self.cfg = cfg
        self.ln_1 = RMSNorm(d, cfg.norm_eps)
        self.attn_q = nn.Linear(d, cfg.n_head * hd, bias=False)
        self.attn_k = nn.Linear(d, cfg.kv_heads * hd, bias=False)
        self.attn_v = nn.Linear(d, cfg.kv_heads * hd, bias=False)
        self.attn_proj = nn.Linear(cfg.n_head * hd, d, bias=False)
        self.ln_2 = RMSNorm(d, cfg.norm_eps)
        self.mlp_gate = nn.Linear(d, cfg.ffn, bias=False)
        self.mlp_up = nn.Linear(d, cfg.ffn, bias=False)
        self.mlp_proj = nn.Linear(cfg.ffn, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.feed(self.attend(x))

    def attend(self, x: Tensor) -> Tensor:
        """The attention half: x + attn(rmsnorm(x)) (its own audit block, ``half_of``)."""
        c = self.cfg
        b, t, _ = x.shape  # x: (B, T, D)
        hd, rep = c.head_dim, c.n_head // c.kv_heads
        h = self.ln_1(x)
        q = self.attn_q(h).view(b, t, c.n_head, hd).transpose(1, 2)  # (B, nh, T, hd)
        k = self.attn_k(h).view(b, t, c.kv_heads, hd).transpose(1, 2)  # (B, nkv, T, hd)
        v = self.attn_v(h).view(b, t, c.kv_heads, hd).transpose(1, 2)
        cos, sin = rotary(t, hd, c.rope_theta, x.device)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if rep > 1:  # query head i reads kv head i // rep
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(b, t, c.n_head * hd)
        return x + self.attn_proj(y)

    def feed(self, x: Tensor) -> Tensor:
        """The SwiGLU half: x + swiglu(rmsnorm(x))."""
        h = self.ln_2(x)
        return x + self.mlp_proj(F.silu(self.mlp_gate(h)) * self.mlp_up(h))


class Llama(GPT):
    """Token embedding (no position table), n_layer Llama blocks, final RMSNorm, untied LM head.

    Parameter names follow ``GPT`` where the role is the same (wte, blocks.i.ln_1, attn_proj, ...);
    construction, ``head`` and ``forward`` are GPT's, only the parts differ.
    """

    @staticmethod
    def add_embed(m: nn.Module, cfg: GPTConfig) -> None:
        m.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)  # (V, D)

    @staticmethod
    def add_head(m: nn.Module, cfg: GPTConfig) -> None:
        m.ln_f = RMSNorm(cfg.d_model, cfg.norm_eps)
        m.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)  # (V, D)

    @staticmethod
    def block(cfg: GPTConfig) -> nn.Module:
        return LlamaBlock(cfg)

    def embed(self, idx: Tensor) -> Tensor:
        if idx.shape[1] > self.cfg.seq_len:
            raise ModelError(f"sequence length {idx.shape[1]} exceeds the model context {self.cfg.seq_len}")
        return self.wte(idx)  # (B, T, D)


def model_class(cfg: GPTConfig) -> type[GPT]:
    """The module class of ``cfg.arch``."""
    return Llama if cfg.arch == "llama" else GPT


@lru_cache(maxsize=8)
def skeleton(cfg: GPTConfig) -> nn.Module:
    """The module without storage (meta device): only its structure and parameter names are used."""
    with torch.device("meta"):
        return model_class(cfg)(cfg)


def param_shapes(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Parameter names (named_parameters order) and shapes."""
    return {n: tuple(p.shape) for n, p in skeleton(cfg).named_parameters()}


def n_params(cfg: GPTConfig) -> int:
    return sum(math.prod(s) for s in param_shapes(cfg).values())


def init_params(cfg: GPTConfig, seed: int) -> dict[str, Tensor]:
    """Deterministic fp32 init from a seed (GPT-2 scheme), on CPU, independent of global RNG state.

    Normal(0, 0.02) for weights, scaled by 1/sqrt(2 n_layer) for the projections that write into the
    residual stream; norm weights (LayerNorm or RMSNorm) are ones. Parameters are drawn in named_parameters order
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


def compute_precision(cfg: GPTConfig, device: torch.device) -> AbstractContextManager[object]:
    """The autocast region a forward on ``device`` runs in under ``cfg.precision`` (a no-op for fp32).

    Backward follows what the forward recorded, so wrapping the forward alone fixes both.
    """
    if cfg.precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def forward(cfg: GPTConfig, params: dict[str, Tensor], idx: Tensor) -> Tensor:
    """Logits (B, T, V) for token ids ``idx`` (B, T), computed with the given parameters."""
    with compute_precision(cfg, idx.device):
        return functional_call(skeleton(cfg), params, (idx,), strict=True)  # type: ignore[no-any-return]


def loss_fn(cfg: GPTConfig, params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
    """Mean next-token cross-entropy (nats) of targets ``y`` (B, T) given inputs ``x`` (B, T)."""
    logits = forward(cfg, params, x)
    return F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), y.reshape(-1))


if __name__ == "__main__":
    for name, c in PRESETS.items():
        print(f"{name:12s} {c.arch:5s} {n_params(c) / 1e6:9.2f}M params (V={c.vocab_size})  {c}")
