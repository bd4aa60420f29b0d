"""More adversarial trainers for the security suite (docs/security.md); trainer/cheats.py has the first three.

Each keeps every inner step honest, so no step replay can catch it: only the final
end-state → payload check (drawn with probability finalCheckBps / 10 000) and the payload's
binding to (run, epoch, trainer) stand between it and the aggregate. That is the point of having
them: they measure what the final check is worth.

- `forge-final` (`ForgeFinal`): trains honestly, then publishes its own pseudo-gradient multiplied
  by `boost` — a well-formed, finite, correctly bound payload that would dominate the mean.
- `stale-copy` (`StaleCopy`): trains honestly, but publishes another trainer's payload of the
  previous epoch (public since its reveal), re-bound to its own run, epoch and address: copying
  *after* a reveal, the only copy commit-reveal leaves open.
- `planted-start` (`PlantedStartNode`): starts epoch 0 from G_0 with a planted error-feedback
  buffer instead of a zero one, then trains, encodes and answers honestly from it. Every step and
  the final check pass (they replay from the planted state); every payload it encodes carries the
  planted direction on top of its update. Only the start-state check sees it (docs/protocol.md §8).
  No Behaviour hook reaches the start state, so this one is a node subclass (`NODE_ADVERSARIES`).
- `planted-carry` (`PlantedCarryNode`): honest in epoch 0; at its first continued start (epoch 1)
  changes the error buffer it carries over in one block only, then trains, encodes and answers
  honestly. While the start check of a continued start drew one block, a buffer planted in another
  block was never checked; now every block's buffer is checked at every continued start (docs/protocol.md
  §5.3 checks 5 and 6: all zero with the error feedback in the parameters, recomputed with a carried
  buffer), so it fails in the epoch it is planted.

- `skip-merge` (`SkipMerge`): under the merge rule (``schedule.merge_step``), never folds the new
  global model in: it trains on from its own stale state at step m instead of waiting for G_e (the
  wait is the rule's whole cost, so skipping it is the tempting cheat). Its steps are honest
  otherwise and its payload is G_e − E_e as the rule says; only a replay of the segment covering
  step m catches it. In epoch 0 the merge adds G_0 − S_0 = 0, so skipping it there changes nothing.

The pure parts (`boost_publication`, `rebind_publication`, `plant_error_buffer`,
`plant_block_buffer`) are what the unit tests call.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from typing import Any

from dilocox.inner import EF, PARAM, Params, State, section, train_step, with_section
from dilocox.round import Final, epoch_batch
from protocol.formats.payload import encode, encode_raw, open_publication, unwrap, wrap
from protocol.leaf import block_names
from trainer.checkpoints import EpochDir
from trainer.engine import OFFSET, Engine, LocalEngine, save_merged
from trainer.node import Behaviour, TrainerNode

MAX_COPY_BYTES = 256 << 20
PLANT_SCALE = 0.01  # the planted buffer: this times the start parameters (a pull of the model towards zero)


def boost_publication(
    publication: bytes, run_id: int, epoch: int, trainer: str, shapes: Mapping[str, tuple[int, ...]], boost: float
) -> bytes:
    """The same pseudo-gradient times `boost`, re-encoded as raw float32 and wrapped for the same identity."""
    dense = open_publication(publication, shapes, run_id=run_id, epoch=epoch, trainer=trainer)
    body = encode([encode_raw(n, t * boost) for n, t in dense.items()])
    return wrap(run_id, epoch, trainer, body)


def rebind_publication(publication: bytes, run_id: int, epoch: int, trainer: str) -> bytes:
    """Someone else's published payload, re-wrapped as if `trainer` had produced it in `epoch`."""
    return wrap(run_id, epoch, trainer, unwrap(publication).body)


class ForgeFinal(Behaviour):
    """Honest steps, forged payload: the pseudo-gradient scaled by `boost`."""

    name = "forge-final"

    def __init__(self, boost: float = 25.0) -> None:
        self.boost = boost

    def publication(self, node: TrainerNode, final: Final, epoch: int) -> bytes:
        node.log("forging", epoch=epoch, boost=self.boost)
        return boost_publication(final.publication, node.run_id, epoch, node.me, node.ctx.param_shapes, self.boost)


class StaleCopy(Behaviour):
    """Honest steps; from epoch 1 on publishes a victim's previous-epoch payload under its own name."""

    name = "stale-copy"

    def publication(self, node: TrainerNode, final: Final, epoch: int) -> bytes:
        if epoch == 0:
            return final.publication
        deadline = time.monotonic() + 60  # the others reveal e-1 about when we finish training e
        while not (victims := [ev for ev in node.chain.revealed(node.run_id, epoch - 1) if ev.args["trainer"] != node.me]):
            if time.monotonic() > deadline:
                return final.publication
            time.sleep(node.poll_s)
        a = victims[0].args
        data = node.store.get(a["payloadCid"], max_size=MAX_COPY_BYTES, digest=bytes(a["payloadDigest"]))
        node.log("copying", epoch=epoch, victim=a["trainer"], from_epoch=epoch - 1)
        return rebind_publication(data, node.run_id, epoch, node.me)


def plant_error_buffer(state: State, scale: float = PLANT_SCALE) -> State:
    """`state` with its error-feedback buffer set to `scale` × its own parameters.

    The compressor encodes Δ + ef, so each payload carries the planted direction on top of the
    honest update, and what the sketch leaves out is carried on as the next buffer.
    """
    return with_section(state, EF, {n: scale * p for n, p in section(state, PARAM).items()})


class PlantedStart(Behaviour):
    """Honest steps and payloads: the cheat is in the start state (`PlantedStartNode`)."""

    name = "planted-start"


class PlantedStartNode(TrainerNode):
    """A trainer whose start state in `plant_epochs` carries a planted error-feedback buffer."""

    def __init__(self, *args: Any, plant_epochs: Collection[int] = (0,), scale: float = PLANT_SCALE, **kw: Any) -> None:
        kw["behaviour"] = kw.get("behaviour") or PlantedStart()
        super().__init__(*args, **kw)
        self.plant_epochs, self.scale = frozenset(plant_epochs), scale

    def _start(self, e: int) -> tuple[State, int, str, bool]:
        state, base_epoch, base_digest, continued = super()._start(e)
        return self._plant(e, state), base_epoch, base_digest, continued

    def _plant(self, e: int, state: State) -> State:
        if e not in self.plant_epochs:
            return state
        self.log("planting", epoch=e, scale=self.scale)
        return plant_error_buffer(state, self.scale)

    def make_engine(self) -> Engine:
        """In a sharded run the start state is built by the engine: plant it there."""
        node = self

        class Planted(LocalEngine):
            def start(self, d: EpochDir, g: Params, prev: EpochDir | None) -> State:
                return node._plant(d.epoch, super().start(d, g, prev))

        return Planted(self.spec, self.shard_checkpoint_every)


def plant_block_buffer(state: State, names: Collection[str], scale: float = PLANT_SCALE) -> State:
    """`state` with the error-feedback buffer of the parameters `names` (one audit block) moved by
    `scale` × those parameters; every other block's buffer unchanged."""
    ef, params = section(state, EF), section(state, PARAM)
    return with_section(state, EF, {n: ef[n] + scale * params[n] for n in names})


class PlantedCarry(Behaviour):
    """Honest steps and payloads: the cheat is in one block of a continued start (`PlantedCarryNode`)."""

    name = "planted-carry"


class PlantedCarryNode(PlantedStartNode):
    """A trainer that changes the carried error buffer of one block (default: the last, the final norm
    and head) at the start of `plant_epochs` (default epoch 1: its first continued start, since it
    revealed epoch 0). The check of a continued start once drew a single block; this is the cheat
    that left open, so it shows that every block is now checked (docs/protocol.md §5.3 checks 5 and 6)."""

    def __init__(self, *args: Any, plant_epochs: Collection[int] = (1,), block: int = -1, **kw: Any) -> None:
        kw["behaviour"] = kw.get("behaviour") or PlantedCarry()
        super().__init__(*args, plant_epochs=plant_epochs, **kw)
        self.block = block

    def _plant(self, e: int, state: State) -> State:
        if e not in self.plant_epochs:
            return state
        blocks = block_names(self.spec.model)
        b = self.block % len(blocks)
        self.log("planting", epoch=e, scale=self.scale, block=b)
        return plant_block_buffer(state, blocks[b], self.scale)


class SkipMerge(Behaviour):
    """Every step a plain step: the merge rule's step m does not fold G_e in (whole-state runs: nor wait for it)."""

    name = "skip-merge"

    def step(self, node: TrainerNode, state: State, epoch: int, k: int) -> tuple[State, float]:
        return train_step(state, epoch_batch(node.spec, node.ctx.corpus, epoch, node.slot, k), node.spec.model,
                          node.spec.inner)

    def engine(self, node: TrainerNode) -> Engine:
        """A sharded run: keep G_e for the honest-looking Δ = G_e − E_e, fold nothing in."""

        class Unmerged(LocalEngine):
            def merge(self, d: EpochDir, g: Params, offset: Params | None = None) -> None:
                save_merged(d, g)
                if offset is not None:
                    save_merged(d, offset, OFFSET)

        return Unmerged(node.spec, node.shard_checkpoint_every)


ADVERSARIES: dict[str, type[Behaviour]] = {"forge-final": ForgeFinal, "stale-copy": StaleCopy, "skip-merge": SkipMerge}
# adversaries that need more than a Behaviour: the node program to run instead of TrainerNode
NODE_ADVERSARIES: dict[str, type[TrainerNode]] = {"planted-start": PlantedStartNode, "planted-carry": PlantedCarryNode}
