"""The DiLoCoX inner step: one AdamW step on a plain training state, replayable bit for bit.

A state is a flat ``dict[str, Tensor]`` named as docs/protocol.md §2 (``param/<p>``,
``adam.m/<p>``, ``adam.v/<p>``, ``ef/<p>``, ``meta/step``, ``meta/rng``), so
``protocol.digest.state_digest`` and safetensors apply to it directly. AdamW, warmup + cosine and
gradient-norm clipping are written out here in a fixed operation order instead of using
``torch.optim``, so the math a verifier replays is pinned by this file, not by torch internals.

Bitwise reproducibility holds on the same machine and build once ``configure_determinism`` has fixed
the thread count and selected deterministic kernels, and across x86-64 hosts of one numerics class
once the process has also pinned it (``protocol.numerics``). ``train_step`` never mutates its input.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from protocol.errors import VerilocoError
from protocol.model import GPTConfig, check_params, init_params, loss_fn

State = dict[str, Tensor]
Params = dict[str, Tensor]

PARAM, MOM1, MOM2, EF = "param/", "adam.m/", "adam.v/", "ef/"
STEP, RNG = "meta/step", "meta/rng"


class TrainerError(VerilocoError):
    """A training state, batch or config the inner step cannot use."""


@dataclass(frozen=True)
class InnerConfig:
    """AdamW with linear warmup then cosine decay to ``min_lr_ratio * lr`` at ``total_steps``."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1  # applied to matrices (dim >= 2) only
    warmup_steps: int = 20
    total_steps: int = 1000
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0  # max global L2 norm; <= 0 disables clipping

    def __post_init__(self) -> None:
        if self.lr <= 0 or not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1) or self.eps <= 0:
            raise TrainerError(f"invalid AdamW settings {self}: need lr>0, 0<=betas<1, eps>0")
        if self.warmup_steps < 0 or self.total_steps <= 0:
            raise TrainerError(f"warmup_steps must be >=0 and total_steps >0, got {self}")


def configure_determinism(threads: int = 1, device: str = "cpu") -> None:
    """Fix what makes float results depend on the run: thread count and kernel selection.

    Call once per process before training or replaying (on CUDA: before the first CUDA call, so
    the cuBLAS workspace setting takes effect); a verifier must use the same thread count as the
    trainer it checks (reductions split across threads sum in a different order).
    """
    if threads <= 0:
        raise TrainerError(f"threads must be positive, got {threads}")
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    if device == "cpu":  # oneDNN picks kernels by ISA and cache sizes; ATen's own serve the same layers
        torch.backends.mkldnn.enabled = False  # type: ignore[assignment]  # (the CPU numerics class)
    if device.startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


# ---- state layout -----------------------------------------------------------------------------


def init_state(model_cfg: GPTConfig, seed: int, device: str = "cpu") -> State:
    """The state before step 0: params from ``init_params``, zero moments and error buffer."""
    return state_from_params(init_params(model_cfg, seed), device=device)


def state_from_params(params: Mapping[str, Tensor], rng: int = 0, device: str = "cpu") -> State:
    s: State = {}
    for n, p in params.items():
        p = p.detach().to(device=device, dtype=torch.float32)
        s[PARAM + n] = p.clone()
        s[MOM1 + n] = torch.zeros_like(p)
        s[MOM2 + n] = torch.zeros_like(p)
        s[EF + n] = torch.zeros_like(p)
    s[STEP] = torch.zeros(1, dtype=torch.int64, device=device)
    s[RNG] = torch.tensor([rng], dtype=torch.int64, device=device)
    return s


def section(state: Mapping[str, Tensor], prefix: str) -> Params:
    """The tensors under ``prefix`` with the prefix stripped (e.g. ``section(s, PARAM)``)."""
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def with_section(state: Mapping[str, Tensor], prefix: str, values: Mapping[str, Tensor]) -> State:
    """A copy of ``state`` whose ``prefix`` entries are replaced by ``values`` (same names)."""
    out = dict(state)
    for n, v in values.items():
        if prefix + n not in out:
            raise TrainerError(f"{prefix}{n} is not in the state; the names must match the model")
        out[prefix + n] = v
    return out


def step_of(state: Mapping[str, Tensor]) -> int:
    return int(state[STEP].item())


def check_state(state: Mapping[str, Tensor], model_cfg: GPTConfig) -> None:
    """Raise TrainerError unless ``state`` has the §2 layout for this model."""
    params = section(state, PARAM)
    try:
        check_params(model_cfg, params)
    except VerilocoError as exc:
        raise TrainerError(f"state does not fit the model: {exc}") from exc
    for prefix in (MOM1, MOM2, EF):
        for n, p in params.items():
            t = state.get(prefix + n)
            if t is None or t.shape != p.shape or t.dtype != torch.float32:
                raise TrainerError(
                    f"state entry {prefix}{n} is missing or not float32 {tuple(p.shape)}"
                )
    for k in (STEP, RNG):
        t = state.get(k)
        if t is None or t.dtype != torch.int64 or tuple(t.shape) != (1,):
            raise TrainerError(f"state entry {k} must be int64 of shape [1]")
    expected = 4 * len(params) + 2
    if len(state) != expected:
        raise TrainerError(
            f"state has {len(state)} entries, expected {expected}; remove unknown keys"
        )


# ---- the step ---------------------------------------------------------------------------------


def lr_at(step: int, cfg: InnerConfig) -> float:
    """Learning rate for 0-based inner step ``step``: linear warmup, then cosine to the floor."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(cfg.total_steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1.0 + math.cos(math.pi * progress))


def compute_grads(
    params: Mapping[str, Tensor], batch: tuple[Tensor, Tensor], model_cfg: GPTConfig
) -> tuple[Params, float]:
    """Gradients of the mean loss w.r.t. ``params`` (same names) and the loss value."""
    if not params:
        raise TrainerError("no parameters to train: the state has no param/* entries")
    leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
    dev = next(iter(leaves.values())).device
    x, y = (t.to(dev) for t in batch)
    if x.dtype != torch.int64 or x.shape != y.shape or x.dim() != 2:
        raise TrainerError(
            f"batch must be two int64 (B, T) tensors, got {x.dtype} {tuple(x.shape)} / {tuple(y.shape)}"
        )
    loss = loss_fn(model_cfg, leaves, x, y)
    names = list(leaves)
    grads = torch.autograd.grad(loss, [leaves[n] for n in names])
    return dict(zip(names, grads)), float(loss.detach())


def squared_norm(grads: Mapping[str, Tensor]) -> Tensor:
    """Sum of squared gradient entries, accumulated tensor by tensor in name order (a 0-d tensor)."""
    names = sorted(grads)
    total = torch.zeros((), dtype=torch.float32, device=grads[names[0]].device)
    for n in names:
        total = total + grads[n].pow(2).sum()
    return total


def clip_grads(
    grads: Mapping[str, Tensor], max_norm: float, norm: Tensor | None = None
) -> tuple[Params, float]:
    """Scale gradients so their global L2 norm is at most ``max_norm``.

    ``norm`` is the global norm when the gradients are only a part of the model (a pipeline stage);
    by default it is computed from ``grads``.
    """
    if norm is None:
        norm = squared_norm(grads).sqrt()
    if max_norm <= 0:
        return dict(grads), float(norm)
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    return {n: g * scale for n, g in grads.items()}, float(norm)


def apply_update(
    state: Mapping[str, Tensor],
    grads: Mapping[str, Tensor],
    cfg: InnerConfig,
    norm: Tensor | None = None,
) -> State:
    """One AdamW step (decoupled weight decay, bias-corrected) with clipped ``grads``; new state.

    Per parameter, in this order: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    p = p - lr wd p (matrices only); p = p - lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps).
    Only the parameters in ``grads`` are updated (a pipeline stage passes its own, with the global
    gradient ``norm``); the step counter always advances.
    """
    step = step_of(state)
    t = step + 1
    lr = lr_at(step, cfg)
    bc1, bc2 = 1.0 - cfg.beta1**t, 1.0 - cfg.beta2**t
    grads, _ = clip_grads(grads, cfg.grad_clip, norm)
    out = dict(state)
    for n, g in grads.items():
        p, m, v = state[PARAM + n], state[MOM1 + n], state[MOM2 + n]
        m = m * cfg.beta1 + g * (1.0 - cfg.beta1)
        v = v * cfg.beta2 + (g * g) * (1.0 - cfg.beta2)
        if p.dim() >= 2 and cfg.weight_decay:
            p = p - p * (lr * cfg.weight_decay)
        p = p - (m / bc1) / ((v / bc2).sqrt() + cfg.eps) * lr
        out[PARAM + n], out[MOM1 + n], out[MOM2 + n] = p, m, v
    out[STEP] = state[STEP] + 1
    return out


def train_step(
    state: Mapping[str, Tensor],
    batch: tuple[Tensor, Tensor],
    model_cfg: GPTConfig,
    inner_cfg: InnerConfig,
    on_grads: Callable[[Params], None] | None = None,
) -> tuple[State, float]:
    """One inner step: gradients on ``batch``, clip, AdamW. Returns (new state, loss before the step).

    The state is validated first (it may come from an untrusted trainer): TrainerError, not a crash.
    ``on_grads`` sees the raw gradients (before clipping) and nothing else: a verifier digests them
    into its replay witness (docs/protocol.md §5.2); the step's result does not depend on it.
    """
    check_state(state, model_cfg)
    grads, loss = compute_grads(section(state, PARAM), batch, model_cfg)
    if on_grads is not None:
        on_grads(grads)
    if not math.isfinite(loss):
        raise TrainerError(
            f"loss is {loss} at step {step_of(state)}; lower the learning rate or check the data"
        )
    return apply_update(state, grads, inner_cfg), loss
