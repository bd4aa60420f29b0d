"""The inner step cut into audit blocks: what a verifier can replay one block of, bit for bit.

A model is a chain of *audit blocks* (``protocol.leaf.block_names``: the embeddings, the
attention half and the MLP half of each transformer block, the final norm and head). The
block-wise step runs every block as its own autograd graph on a detached input, micro-batch by
micro-batch, so each block's part of the step is a pure function of (its state, its input
activations, the gradient arriving at its output) and of nothing else. The trainer records those *boundary tensors*; a verifier given one block's state
and its boundaries replays that block alone (``replay_block``) and gets the trainer's bits, because
it runs the very same ``BlockRun`` code on the very same inputs. Pipeline stages (trainer/stages.py)
run the same ``BlockRun``s in their own processes, so a pipelined trainer is bitwise equal to a
single-process one: the split changes where a block runs, never what it computes.

The step, per micro-batch m of M (rows ``m*B/M .. (m+1)*B/M``): forward through the blocks; the
head's output is ``cross_entropy / M``; backward in reverse. Per block, gradients accumulate over
micro-batches in order (``g_0 + g_1 + ...``); its squared norm ``sq_b`` sums its tensors in name
order; the global norm is ``sqrt(sq_0 + sq_1 + ...)`` in block order (fp32); then the same AdamW as
``dilocox.inner.apply_update``, elementwise, so updating block by block changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from dilocox.inner import (
    PARAM,
    STEP,
    InnerConfig,
    Params,
    State,
    TrainerError,
    apply_update,
    check_state,
    squared_norm,
)
from protocol.leaf import block_count, block_names
from protocol.model import ATTENTION, GPTConfig, compute_precision, half_of, model_class

Batch = tuple[Tensor, Tensor]


class _Embed(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cls = model_class(cfg)
        self.cfg = cfg
        self.cls.add_embed(self, cfg)

    def forward(self, idx: Tensor) -> Tensor:
        return self.cls.embed(self, idx)  # type: ignore[arg-type]


class _Half(nn.Module):
    """One half of transformer block i: ``attend`` (``ATTENTION``) or ``feed`` (``MLP``).

    Built from the model's own block so the names stay ``blocks.<i>.<module>``; the other half's
    submodules are dropped, so ``functional_call(strict=True)`` takes exactly this half's leaves.
    """

    def __init__(self, cfg: GPTConfig, i: int, half: int) -> None:
        super().__init__()
        block = model_class(cfg).block(cfg)
        for name in [n for n, _ in block.named_children() if half_of(n) != half]:
            delattr(block, name)
        self.blocks = nn.ModuleDict({str(i): block})
        self.i, self.part = str(i), half

    def forward(self, x: Tensor) -> Tensor:
        block = self.blocks[self.i]
        return block.attend(x) if self.part == ATTENTION else block.feed(x)  # type: ignore[operator,no-any-return]


class _Head(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cls = model_class(cfg)
        self.cfg = cfg
        self.cls.add_head(self, cfg)

    def forward(self, x: Tensor) -> Tensor:
        return self.cls.head(self, x)  # type: ignore[arg-type]


def block_module(cfg: GPTConfig, b: int) -> nn.Module:
    """A parameter-less (meta) module for audit block ``b``; names match the full model's."""
    with torch.device("meta"):
        if b == 0:
            return _Embed(cfg)
        if b <= 2 * cfg.n_layer:
            return _Half(cfg, (b - 1) // 2, (b - 1) % 2)
        return _Head(cfg)


class BlockRun:
    """Block ``b``'s forward on one micro-batch, kept for its backward.

    ``inp`` is the token ids (block 0) or the previous block's output activations; ``target`` the
    token targets, given to the head only. ``out`` is the activation handed to the next block, or,
    for the head, the micro-batch's ``cross_entropy / M`` (a 0-d tensor).
    """

    def __init__(
        self, cfg: GPTConfig, b: int, leaves: Mapping[str, Tensor], module: nn.Module,
        inp: Tensor, micro: int, target: Tensor | None = None,
    ) -> None:
        self.b, self.last = b, b == block_count(cfg) - 1
        self.leaves = leaves
        self.inp = inp if b == 0 else inp.detach().requires_grad_(True)
        with torch.enable_grad():
            with compute_precision(cfg, inp.device):
                out = functional_call(module, dict(leaves), (self.inp,), strict=True)
            if self.last:
                if target is None:
                    raise TrainerError("the head block needs the micro-batch's targets")
                self.loss = F.cross_entropy(out.float().reshape(-1, out.shape[-1]), target.reshape(-1))
                out = self.loss / micro
        self.out: Tensor = out

    def backward(self, g_out: Tensor | None) -> tuple[Params, Tensor | None]:
        """(the block's parameter gradients for this micro-batch, the gradient at its input)."""
        names = list(self.leaves)
        wrt = [self.leaves[n] for n in names] + ([self.inp] if self.b > 0 else [])
        if self.last:
            grads = torch.autograd.grad(self.out, wrt)
        else:
            if g_out is None or g_out.shape != self.out.shape:
                shape = None if g_out is None else tuple(g_out.shape)
                raise TrainerError(f"block {self.b} needs an output gradient of shape {tuple(self.out.shape)}, got {shape}")
            grads = torch.autograd.grad(self.out, wrt, grad_outputs=g_out)
        g_in = grads[len(names)] if self.b > 0 else None
        return dict(zip(names, grads[: len(names)])), g_in


def accumulate(acc: Params | None, g: Mapping[str, Tensor]) -> Params:
    """Micro-batch gradient accumulation in arrival order (the first is taken as is)."""
    return dict(g) if acc is None else {n: acc[n] + g[n] for n in acc}


def global_norm(sqs: Sequence[Tensor]) -> Tensor:
    """sqrt(sq_0 + sq_1 + ...) in block order, fp32: every block clips with this norm."""
    total = torch.zeros((), dtype=torch.float32, device=sqs[0].device)
    for s in sqs:
        total = total + s.to(torch.float32)
    return total.sqrt()


@dataclass
class BlockIO:
    """What audit block b exchanged in one step (all micro-batches concatenated along the batch).

    ``act``: its output activations (None for the head); ``grad_in``: the gradient at its input (None
    for the embeddings); ``sq``: its squared gradient norm, fp32, 0-d.
    """

    act: Tensor | None
    grad_in: Tensor | None
    sq: Tensor


def microbatches(batch: Batch, micro: int) -> list[Batch]:
    x, y = batch
    if micro < 1 or x.shape[0] % micro:
        raise TrainerError(f"batch size {x.shape[0]} is not divisible into {micro} micro-batches")
    return list(zip(x.chunk(micro), y.chunk(micro)))


def block_leaves(state: Mapping[str, Tensor], names: Sequence[str]) -> dict[str, Tensor]:
    return {n: state[PARAM + n].detach().requires_grad_(True) for n in names}


OnPartial = Callable[[int, int, Params], None]  # (block, group m, its gradient accumulated through m)


class Capture:
    """An ``on_partial`` hook that keeps block b's running sum before group m (``before``) and its total,
    and passes every call on to ``then`` (a leaf's ``PartialSums``): what an answer to a group audit reveals."""

    def __init__(self, b: int, m: int, micro: int, then: OnPartial | None = None) -> None:
        self.b, self.m, self.micro, self.then = b, m, micro, then
        self.before: Params | None = None
        self.total: Params | None = None

    def __call__(self, b: int, m: int, acc: Params) -> None:
        if self.then is not None:
            self.then(b, m, acc)
        if b == self.b:
            if m == self.m - 1:
                self.before = dict(acc)
            if m == self.micro - 1:
                self.total = dict(acc)


class Totals:
    """An ``on_partial`` hook that keeps every block's total gradient (its sum after the last group) and
    passes every call on to ``then``: what a gradient log keeps of a step (trainer/boundaries.py)."""

    def __init__(self, micro: int, then: OnPartial | None = None) -> None:
        self.micro, self.then = micro, then
        self.totals: dict[int, Params] = {}

    def __call__(self, b: int, m: int, acc: Params) -> None:
        if self.then is not None:
            self.then(b, m, acc)
        if m == self.micro - 1:
            self.totals[b] = acc


@dataclass
class GroupPass:
    """Groups 0..m of one step through every block, before any update: each block's gradient summed
    over them (``acc``), its output activations and input gradients per group, and the groups' losses."""

    acc: list[Params | None]
    acts: list[list[Tensor]]
    gins: list[list[Tensor]]
    losses: list[float]


def group_pass(
    state: Mapping[str, Tensor], batch: Batch, model_cfg: GPTConfig, micro: int, upto: int | None = None,
    on_partial: OnPartial | None = None,
) -> GroupPass:
    """Groups (micro-batches) 0..``upto`` (default: all) of a step, block by block, in the step's order.

    A group's forward and backward read only the state and its own rows, and the running sums only
    the groups before it, so stopping after group m gives group m's boundaries and the sums through m
    with the bits of the whole step: what an answer from the gradient log runs (trainer/engine.py)."""
    dev = state[STEP].device
    groups = block_names(model_cfg)
    mods = [block_module(model_cfg, b) for b in range(len(groups))]
    leaves = [block_leaves(state, names) for names in groups]
    out = GroupPass([None] * len(groups), [[] for _ in groups], [[] for _ in groups], [])
    for m, (x, y) in enumerate(microbatches(batch, micro)[: micro if upto is None else upto + 1]):
        x, y = x.to(dev), y.to(dev)
        runs: list[BlockRun] = []
        h = x
        for b in range(len(groups)):
            run = BlockRun(model_cfg, b, leaves[b], mods[b], h, micro, y if b == len(groups) - 1 else None)
            runs.append(run)
            h = run.out.detach()
            if not run.last:
                out.acts[b].append(h)
        out.losses.append(float(runs[-1].loss.detach()))
        g: Tensor | None = None
        for run in reversed(runs):
            grads, g = run.backward(g)
            out.acc[run.b] = summed = accumulate(out.acc[run.b], grads)
            if on_partial is not None:
                on_partial(run.b, m, summed)
            if g is not None:
                out.gins[run.b].append(g)
    return out


def blockwise_step(
    state: Mapping[str, Tensor], batch: Batch, model_cfg: GPTConfig, inner_cfg: InnerConfig, micro: int = 1,
    on_partial: OnPartial | None = None,
) -> tuple[State, float, list[BlockIO]]:
    """One inner step, block by block: (new state, loss before the step, every block's boundaries).

    ``on_partial(b, m, acc)`` sees each block's running sum after each group (micro-batch) m, the
    moment it exists: what a v4 leaf commits (protocol.leaf.PartialSums) or an answer reveals."""
    check_state(state, model_cfg)
    run = group_pass(state, batch, model_cfg, micro, None, on_partial)
    loss = sum(run.losses) / len(run.losses)
    if not math.isfinite(loss):
        raise TrainerError(f"loss is {loss} at step {int(state[STEP].item())}; lower the learning rate or check the data")
    grads_all = [a if a is not None else {} for a in run.acc]
    sqs = [squared_norm(a) for a in grads_all]
    new = step_update(state, {n: t for a in grads_all for n, t in a.items()}, inner_cfg, sqs)
    ios = [
        BlockIO(torch.cat(run.acts[b]) if run.acts[b] else None, torch.cat(run.gins[b]) if run.gins[b] else None, sqs[b])
        for b in range(len(grads_all))
    ]
    return new, loss, ios


def step_update(state: Mapping[str, Tensor], total: Params, inner_cfg: InnerConfig, sqs: Sequence[Tensor]) -> State:
    """The step's AdamW update of the whole state from every block's total gradient and squared norm:
    the step itself, and an answer that advances the state from logged totals without a forward pass."""
    return apply_update(state, total, inner_cfg, norm=global_norm(sqs))


def replay_block(
    block_state: Mapping[str, Tensor], b: int, batch: Batch, model_cfg: GPTConfig, inner_cfg: InnerConfig,
    micro: int, inp: Tensor | None, g_out: Tensor | None, sqs: Sequence[Tensor],
    on_grads: Callable[[Params], None] | None = None, on_partial: OnPartial | None = None,
) -> tuple[State, BlockIO]:
    """Block ``b``'s share of one step, alone: its new state and what it exchanged.

    ``block_state`` holds the block's ``param/``, ``adam.m/``, ``adam.v/`` entries (``ef/`` may be
    absent: an inner step does not touch it) and ``meta/step``. ``inp`` is the input activations of
    all micro-batches (None for block 0, which reads the batch's ids); ``g_out`` the gradient at its
    output (None for the head, which reads the targets); ``sqs`` every block's committed squared
    norm, of which this block's own entry is replaced by what the replay computes.
    """
    groups = block_names(model_cfg)
    if not 0 <= b < len(groups):
        raise TrainerError(f"audit block {b} does not exist; the model has {len(groups)}")
    if len(sqs) != len(groups):
        raise TrainerError(f"{len(sqs)} squared norms for {len(groups)} blocks")
    names = groups[b]
    dev = block_state[STEP].device
    mod = block_module(model_cfg, b)
    leaves = block_leaves(block_state, names)
    parts = microbatches(batch, micro)
    last = b == len(groups) - 1
    ins = [x.to(dev) for x, _ in parts] if b == 0 else _chunks(inp, micro, "input activations")
    gouts = [None] * micro if last else _chunks(g_out, micro, "output gradient")
    acc: Params | None = None
    acts: list[Tensor] = []
    gins: list[Tensor] = []
    for m, (_, y) in enumerate(parts):
        run = BlockRun(model_cfg, b, leaves, mod, ins[m], micro, y.to(dev) if last else None)
        if not last:
            acts.append(run.out.detach())
        grads, g_in = run.backward(gouts[m])
        acc = accumulate(acc, grads)
        if on_partial is not None:
            on_partial(b, m, acc)
        if g_in is not None:
            gins.append(g_in)
    assert acc is not None
    if on_grads is not None:
        on_grads(acc)
    new, sq = block_update(block_state, b, acc, inner_cfg, sqs)
    return new, BlockIO(torch.cat(acts) if acts else None, torch.cat(gins) if gins else None, sq)


def block_update(
    block_state: Mapping[str, Tensor], b: int, total: Params, inner_cfg: InnerConfig, sqs: Sequence[Tensor],
) -> tuple[State, Tensor]:
    """Block b's AdamW step from its total gradient: (new block state, its squared norm). The global
    norm takes every other block's committed ``sqs`` and this block's own, recomputed."""
    sq = squared_norm(total)
    norm = global_norm([sq if j == b else s.to(sq.device) for j, s in enumerate(sqs)])
    return apply_update(block_state, total, inner_cfg, norm=norm), sq


def replay_group(
    block_state: Mapping[str, Tensor], b: int, batch: Batch, model_cfg: GPTConfig, micro: int, m: int,
    inp: Tensor | None, g_out: Tensor | None,
) -> tuple[Params, Tensor | None, Tensor | None]:
    """Block b on group (micro-batch) m of a step, alone: (its parameter gradients g_m, its output
    activations, the gradient at its input), from the group's rows of its boundaries.

    The same ``BlockRun`` as the step, on the same rows: a v4 audit replays one group of U tokens
    whatever the batch (docs/protocol.md §5.3)."""
    groups = block_names(model_cfg)
    if not 0 <= b < len(groups) or not 0 <= m < micro:
        raise TrainerError(f"audit block {b} or group {m} does not exist ({len(groups)} blocks, {micro} groups)")
    dev = block_state[STEP].device
    x, y = microbatches(batch, micro)[m]
    last = b == len(groups) - 1
    if b > 0 and inp is None:
        raise TrainerError(f"block {b} needs its input activations")
    run = BlockRun(model_cfg, b, block_leaves(block_state, groups[b]), block_module(model_cfg, b),
                   x.to(dev) if b == 0 else inp, micro, y.to(dev) if last else None)  # type: ignore[arg-type]
    act = None if last else run.out.detach()
    grads, g_in = run.backward(g_out)
    return grads, act, g_in


def _chunks(t: Tensor | None, micro: int, what: str) -> list[Tensor]:
    if t is None or t.dim() < 1 or t.shape[0] % micro:
        raise TrainerError(f"{what} missing or not divisible into {micro} micro-batches")
    return list(t.chunk(micro))
