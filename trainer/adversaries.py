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

The pure parts (`boost_publication`, `rebind_publication`) are what the unit tests call.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from protocol.payload import decode, encode, encode_raw, unwrap, wrap
from trainer.node import Behaviour, TrainerNode
from trainer.round import Final

MAX_COPY_BYTES = 256 << 20


def boost_publication(
    publication: bytes, run_id: int, epoch: int, trainer: str, shapes: Mapping[str, tuple[int, ...]], boost: float
) -> bytes:
    """The same pseudo-gradient times `boost`, re-encoded as raw float32 and wrapped for the same identity."""
    dense = decode(unwrap(publication, run_id=run_id, epoch=epoch, trainer=trainer).body, dict(shapes))
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


ADVERSARIES: dict[str, type[Behaviour]] = {"forge-final": ForgeFinal, "stale-copy": StaleCopy}
