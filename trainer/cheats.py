"""Adversarial trainers, for the demo's `--cheat` and the security tests. Each must be caught.

- `lazy`: trains only the first step of each epoch honestly and forges the rest (the step counter
  advances, the weights do not), then answers audits with its forged states. Any challenged forged
  transition fails replay, so with s sampled steps it escapes with probability (1/H)^s. In a sharded
  run (`audit.unit = "shard"`) it trains nothing and commits zero boundary tensors; any replayed
  block fails.
- `noise`: trains honestly but publishes a random payload of the right format and shapes. The
  final state → payload replay catches it whenever the final check is drawn (probability q).
- `abandon`: `lazy` that never commits, so nothing it forged is audited; in a windowed run it is
  slashed for the windows it began (docs/protocol.md §5.4).
- `copy`: does no work; commits to a placeholder, then at reveal time takes an honest trainer's
  revealed payload. The reveal does not match its commitment, so the contract rejects it, the
  copier misses its reveal and is slashed; its payload (bound to another trainer anyway) is never
  aggregated.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from dilocox.blockstep import Batch, BlockIO, OnPartial
from dilocox.compress import compress
from dilocox.inner import PARAM, STEP, State
from dilocox.round import Final, compress_seed
from protocol.formats.payload import wrap
from protocol.leaf import block_count, block_names
from trainer.engine import Engine, LocalEngine
from trainer.node import Behaviour, TrainerNode


class LazyEngine(LocalEngine):
    """A sharded trainer that does no work: the step counter advances, nothing else; zero boundaries."""

    def _step(self, state: State, batch: Batch, on_partial: OnPartial | None = None) -> tuple[State, float, list[BlockIO]]:
        forged = dict(state)
        forged[STEP] = state[STEP] + 1
        x = batch[0]
        zeros = torch.zeros(x.shape[0], x.shape[1], self.spec.model.d_model)
        n = block_count(self.spec.model)
        groups = block_names(self.spec.model)
        for b in range(n):  # no work: every running sum it claims is zero
            for m in range(self.spec.microbatches):
                if on_partial is not None:
                    on_partial(b, m, {g: torch.zeros_like(state[PARAM + g]) for g in groups[b]})
        return forged, 0.0, [BlockIO(zeros if b < n - 1 else None, zeros if b > 0 else None, torch.zeros(()))
                             for b in range(n)]


class Lazy(Behaviour):
    name = "lazy"

    def engine(self, node: TrainerNode) -> Engine:
        return LazyEngine(node.spec, node.shard_checkpoint_every)

    def step(self, node: TrainerNode, state: State, epoch: int, k: int) -> tuple[State, float]:
        if k == 0:
            return super().step(node, state, epoch, k)
        forged = dict(state)
        forged[STEP] = state[STEP] + 1
        return forged, 0.0


class Noise(Behaviour):
    name = "noise"

    def publication(self, node: TrainerNode, final: Final, epoch: int) -> bytes:
        g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
        shapes = node.ctx.param_shapes
        noise = {n: torch.randn(s, generator=g) * 0.05 for n, s in shapes.items()}
        c = compress(noise, {}, 4, compress_seed(node.spec.run_seed, epoch, node.slot), node.spec.compression)
        return wrap(node.run_id, epoch, node.me, c.payload)


class Copy(Behaviour):
    name = "copy"

    def step(self, node: TrainerNode, state: State, epoch: int, k: int) -> tuple[State, float]:
        forged = dict(state)
        forged[STEP] = state[STEP] + 1
        return forged, 0.0

    def commitment(self, node: TrainerNode, epoch: int, meta: dict[str, Any]) -> bytes:
        return os.urandom(32)  # it cannot know anyone's payload yet

    def reveal(self, node: TrainerNode, epoch: int, meta: dict[str, Any]) -> tuple[str, bytes, bytes, int, bytes]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            others = [ev for ev in node.chain.revealed(node.run_id, epoch) if ev.args["trainer"] != node.me]
            if others:
                a = others[0].args
                node.log("copying", epoch=epoch, victim=a["trainer"])
                return (a["payloadCid"], bytes(a["payloadDigest"]), bytes(a["traceRoot"]), int(a["leafCount"]),
                        bytes.fromhex(meta["salt"]))
            time.sleep(node.poll_s)
        return super().reveal(node, epoch, meta)


class Abandon(Lazy):
    """`lazy` in a windowed run, walking away from every epoch instead of committing it: it learns its
    windows' draws while it trains, and with every step forged any draw would catch it. Committing
    nothing escapes the audit; the window roots it signed (or posted) are its promise to commit, and
    the coordinator's `reportAbandoned` slashes it."""

    name = "abandon"

    def walks_away(self, node: TrainerNode, epoch: int) -> bool:
        return True


CHEATS: dict[str, type[Behaviour]] = {"lazy": Lazy, "noise": Noise, "copy": Copy, "abandon": Abandon}


def behaviours() -> dict[str, type[Behaviour]]:
    """Every adversary a trainer node can play (`veriloco trainer --cheat KIND`), by name."""
    from trainer.adversaries import ADVERSARIES

    return {**CHEATS, **ADVERSARIES}
