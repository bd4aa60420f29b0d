"""Pipeline parallelism inside one trainer: the GPT split into S stages over torch.distributed.

Each process (rank r of S) holds the part of the training state that belongs to stage r: the
parameters of a contiguous run of blocks (stage 0 also the embeddings, the last stage also the final
norm and LM head), their Adam moments and error buffer, and the step counter. A batch is cut into
micro-batches and run with ``torch.distributed.pipelining`` (``PipelineStage`` + ``ScheduleGPipe``),
gloo on CPU and NCCL on GPU. The gradient norm for clipping is all-reduced so every stage clips with
the global norm; then each stage applies the same explicit AdamW as ``dilocox.inner``.

The result equals the single-process ``train_step`` within fp32 tolerance (micro-batching and the
split norm change summation order), so pipelined training is for speed; bitwise replay by a verifier
uses the same S and micro-batch count. Parameter names are those of the full model, so the stages'
states merge back into one §2 state with ``merge_states``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

from dilocox.inner import (
    EF,
    MOM1,
    MOM2,
    PARAM,
    RNG,
    STEP,
    InnerConfig,
    State,
    TrainerError,
    apply_update,
    squared_norm,
)
from protocol.model import GPTConfig, model_class, param_shapes


def split_layers(n_layer: int, n_stages: int, unit: str = "layers") -> list[range]:
    """Contiguous ranges of ``n_layer`` items per stage, the first stages taking one more when uneven."""
    if not 1 <= n_stages <= n_layer:
        raise TrainerError(
            f"cannot split {n_layer} {unit} into {n_stages} stages; use 1..{n_layer} stages"
        )
    base, extra = divmod(n_layer, n_stages)
    out, start = [], 0
    for s in range(n_stages):
        size = base + (1 if s < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


class Stage(nn.Module):
    """One pipeline stage; attribute names mirror the model's so parameter names stay global."""

    def __init__(self, cfg: GPTConfig, stage: int, n_stages: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.first, self.last = stage == 0, stage == n_stages - 1
        model = model_class(cfg)
        if self.first:
            model.add_embed(self, cfg)
        self.blocks = nn.ModuleDict(
            {str(i): model.block(cfg) for i in split_layers(cfg.n_layer, n_stages)[stage]}
        )
        if self.last:
            model.add_head(self, cfg)

    def forward(self, x: Tensor) -> Tensor:
        model = model_class(self.cfg)
        if self.first:
            x = model.embed(self, x)  # type: ignore[arg-type]  # (B, T) ids -> (B, T, D)
        for block in self.blocks.values():
            x = block(x)  # (B, T, D)
        if self.last:
            x = model.head(self, x)  # type: ignore[arg-type]  # -> logits (B, T, V)
        return x


def stage_param_names(cfg: GPTConfig, stage: int, n_stages: int) -> list[str]:
    """The full-model parameter names stage ``stage`` owns."""
    with torch.device("meta"):
        names = [n for n, _ in Stage(cfg, stage, n_stages).named_parameters()]
    missing = set(names) - set(param_shapes(cfg))
    if missing:  # the split must never invent names
        raise TrainerError(f"stage parameters not in the model: {sorted(missing)}")
    return names


def stage_state(state: Mapping[str, Tensor], cfg: GPTConfig, stage: int, n_stages: int) -> State:
    """The part of a full §2 state that stage ``stage`` holds (its tensors, plus the meta entries)."""
    out: State = {}
    for n in stage_param_names(cfg, stage, n_stages):
        for prefix in (PARAM, MOM1, MOM2, EF):
            out[prefix + n] = state[prefix + n]
    out[STEP], out[RNG] = state[STEP], state[RNG]
    return out


def merge_states(parts: Sequence[Mapping[str, Tensor]]) -> State:
    """Reassemble per-stage states into one §2 state; meta entries must agree."""
    out: State = {}
    for p in parts:
        for k, v in p.items():
            if k in (STEP, RNG) and k in out:
                if not torch.equal(out[k], v):
                    raise TrainerError(f"stages disagree on {k}: {out[k].tolist()} vs {v.tolist()}")
                continue
            if k in out:
                raise TrainerError(f"two stages hold {k}")
            out[k] = v
    return out


def _microbatch_loss(logits: Tensor, target: Tensor) -> Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


@dataclass(frozen=True)
class PipelineConfig:
    stage: int
    n_stages: int
    n_microbatches: int


def pipeline_train_step(
    state: Mapping[str, Tensor],
    batch: tuple[Tensor, Tensor],
    model_cfg: GPTConfig,
    inner_cfg: InnerConfig,
    pcfg: PipelineConfig,
    group: dist.ProcessGroup | None = None,
) -> tuple[State, float]:
    """One inner step of this rank's stage; collective over the pipeline group (one rank per stage).

    ``state`` is this stage's part (``stage_state``); every rank passes the same batch (the shard
    function makes it locally computable). Returns the stage's new state and the batch loss (the
    mean over micro-batches, broadcast from the last stage).
    """
    x, y = batch
    if x.shape[0] % pcfg.n_microbatches:
        raise TrainerError(
            f"batch size {x.shape[0]} is not divisible by {pcfg.n_microbatches} micro-batches"
        )
    names = stage_param_names(model_cfg, pcfg.stage, pcfg.n_stages)
    dev = state[PARAM + names[0]].device
    module = Stage(model_cfg, pcfg.stage, pcfg.n_stages).to(dev)
    with torch.no_grad():
        for n, p in module.named_parameters():
            p.copy_(state[PARAM + n])
    stage = PipelineStage(module, pcfg.stage, pcfg.n_stages, dev, group=group)
    schedule = ScheduleGPipe(stage, pcfg.n_microbatches, loss_fn=_microbatch_loss, scale_grads=True)
    losses: list[Tensor] = []
    if pcfg.stage == 0 and pcfg.n_stages == 1:
        schedule.step(x.to(dev), target=y.to(dev), losses=losses)
    elif pcfg.stage == 0:
        schedule.step(x.to(dev))
    elif pcfg.stage == pcfg.n_stages - 1:
        schedule.step(target=y.to(dev), losses=losses)
    else:
        schedule.step()
    grads = {
        n: p.grad if p.grad is not None else torch.zeros_like(p)
        for n, p in module.named_parameters()
    }
    sq = squared_norm(grads)
    loss = torch.stack(losses).mean().detach() if losses else torch.zeros((), device=dev)
    if pcfg.n_stages > 1:
        dist.all_reduce(sq, group=group)
        dist.broadcast(loss, group_src=pcfg.n_stages - 1, group=group)
    new = apply_update(state, {n: g.detach() for n, g in grads.items()}, inner_cfg, norm=sq.sqrt())
    return new, float(loss)
