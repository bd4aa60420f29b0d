"""The coordinator node: aggregate each epoch's verified pseudo-gradients and finalize it on-chain.

It waits until every committed trainer of an epoch is decided (or the verdict window closes),
builds the new global model from the passing payloads only (coordinator/build.py), publishes it,
and submits its CID and digest with the list of included trainers. The contract refuses the
finalization if that list is not exactly the passing set. Content it cannot get is logged once and
retried until the epoch expires; the coordinator never exits on it.

Run it with `veriloco coordinator --run ID`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from coordinator.build import ModelUnavailable, VerifiedGlobals, build_global
from coordinator.outer import global_params
from protocol.chain import Chain, ChainError, ChainUnavailable, Phase
from protocol.errors import VerilocoError
from protocol.formats import save_state
from protocol.outage import through_outages
from protocol.run import RunContext, eval_model, open_run
from protocol.store import Store

Log = Callable[..., None]
TERMINAL = (Phase.FINALIZED, Phase.ABORTED)


class CoordinatorError(VerilocoError):
    """The coordinator cannot act for this run (wrong key, unknown run)."""


class CoordinatorNode:
    def __init__(self, chain: Chain, store: Store, run_id: int, *, log: Log | None = None, poll_s: float = 0.25,
                 evaluate: bool = True) -> None:
        self.chain, self.store, self.run_id = chain, store, run_id
        self.log: Log = log or (lambda event, **kv: None)
        self.poll_s, self.evaluate = poll_s, evaluate
        self._unavailable: set[int] = set()  # epochs whose missing content was logged

    def run(self) -> None:
        self.ctx: RunContext = open_run(self.chain, self.store, self.run_id)
        coordinator = self.ctx.info.params.coordinator
        if self.chain.sender is None or self.chain.sender.lower() != coordinator.lower():
            raise CoordinatorError(f"run {self.run_id}'s coordinator is {coordinator}; start this node with that key")
        self.globals = VerifiedGlobals(self.chain, self.store, self.ctx, log=self.log)
        self.log("started")
        for e in range(self.ctx.config.schedule.epochs):
            while not through_outages(functools.partial(self._try_finalize, e), self.log, f"epoch {e}"):
                time.sleep(self.poll_s)
        self.log("finished")

    def _ready(self, e: int) -> bool:
        status = self.chain.epoch_status(self.run_id, e)
        if status.phase is not Phase.AUDITING:
            return False
        if status.passed + status.failed >= status.committed:
            return True
        return self.chain.now() >= self.chain.epoch_times(self.run_id, e).verdict_deadline

    def _try_finalize(self, e: int) -> bool:
        """True once epoch e is terminal (finalized by us or aborted)."""
        phase = self.chain.epoch_status(self.run_id, e).phase
        if phase in TERMINAL:
            return True
        if not self._ready(e):
            return False
        t0 = time.monotonic()
        try:
            state, included, digest = build_global(self.chain, self.store, self.ctx, e, self.globals)
        except ModelUnavailable as exc:
            if e not in self._unavailable:
                self._unavailable.add(e)
                self.log("model-unavailable", epoch=e, reason=str(exc))
            return False
        cid = self.store.put(save_state(state))
        self.store.pin(cid)
        try:
            tx = self.chain.finalize(self.run_id, e, cid, digest, included)
        except ChainUnavailable:
            raise  # not a refusal: the caller waits the outage out and tries again
        except ChainError as exc:
            self.log("finalize-failed", epoch=e, error=str(exc))
            return False
        fields: dict[str, object] = {"epoch": e, "included": len(included), "model": cid, "gas": tx.gas_used,
                                     "seconds": round(time.monotonic() - t0, 3)}
        if self.evaluate:
            fields["eval_loss"] = round(eval_model(self.ctx, global_params(state)), 4)
        self.log("finalized", **fields)
        return True
