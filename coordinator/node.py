"""The coordinator node: aggregate each epoch's verified pseudo-gradients and finalize it on-chain.

It waits until every committed trainer of an epoch is decided (or the verdict window closes),
builds the new global model from the passing payloads only (coordinator/build.py), publishes it,
and submits its CID and digest with the list of included trainers. The contract refuses the
finalization if that list is not exactly the passing set. Content it cannot get is logged once and
retried until the epoch expires; the coordinator never exits on it.

Content it cannot get (a payload deleted after its pass, a model or config gone from the store,
bytes that do not match their CID or digest) never stops it: it says so in one line and tries again
every poll until the content is back (a passing verifier re-publishes the payloads it vouched for,
verifier/keeper.py) or the epoch's finalize deadline passes and the epoch is Aborted.

Run it with `veriloco coordinator --run ID`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TypeVar

from coordinator.build import VerifiedGlobals, build_global
from coordinator.outer import global_params
from protocol.chain import Chain, ChainError, ChainUnavailable, Phase
from protocol.errors import VerilocoError
from protocol.formats import save_state
from protocol.outage import TRANSIENT, through_outages
from protocol.run import RunContext, eval_model, open_run
from protocol.store import Store

Log = Callable[..., None]
T = TypeVar("T")
TERMINAL = (Phase.FINALIZED, Phase.ABORTED)
NOT_CONTENT: tuple[type[BaseException], ...] = (ChainError, *TRANSIENT)  # a refusal or an outage keeps its own handling


class CoordinatorError(VerilocoError):
    """The coordinator cannot act for this run (wrong key, unknown run)."""


class CoordinatorNode:
    def __init__(self, chain: Chain, store: Store, run_id: int, *, log: Log | None = None, poll_s: float = 0.25,
                 evaluate: bool = True) -> None:
        self.chain, self.store, self.run_id = chain, store, run_id
        self.log: Log = log or (lambda event, **kv: None)
        self.poll_s, self.evaluate = poll_s, evaluate
        self._missing: dict[str, float] = {}  # what -> when its content first went missing

    def _content(self, what: str, fetch: Callable[[], T]) -> T | None:
        """`fetch()`, or None (logged once per `what`) while the content it reads is missing or malformed.

        Chain errors are not content: a refusal or an outage keeps its own handling.
        """
        try:
            return fetch()
        except NOT_CONTENT:
            raise
        except VerilocoError as exc:  # store, digest, format, payload or aggregation errors
            if what not in self._missing:
                self._missing[what] = time.monotonic()
                self.log("content-missing", what=what, error=f"{type(exc).__name__}: {exc}", retry_s=self.poll_s)
            return None

    def run(self) -> None:
        opened = functools.partial(self._content, "run", functools.partial(open_run, self.chain, self.store, self.run_id))
        while (ctx := through_outages(opened, self.log, "opening the run")) is None:
            time.sleep(self.poll_s)
        self.ctx: RunContext = ctx
        coordinator = self.ctx.info.params.coordinator
        if self.chain.sender is None or self.chain.sender.lower() != coordinator.lower():
            raise CoordinatorError(f"run {self.run_id}'s coordinator is {coordinator}; start this node with that key")
        self.globals = VerifiedGlobals(self.chain, self.store, self.ctx, log=self.log)
        if self.chain.member(self.run_id, self.chain.sender).role == 0:
            tx = self.chain.stake_coordinator(self.run_id)  # the stake answers for the models it finalizes
            self.log("staked", gas=tx.gas_used)
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
            if phase is Phase.ABORTED and f"epoch {e}" in self._missing:
                self.log("aborted", epoch=e, reason="content still missing at the finalize deadline")
            return True
        if not self._ready(e):
            return False
        t0 = time.monotonic()
        built = self._content(f"epoch {e}", functools.partial(build_global, self.chain, self.store, self.ctx, e, self.globals))
        if built is None:
            return False
        state, included, digest = built
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
        if f"epoch {e}" in self._missing:
            fields["waited_for_content_s"] = round(time.monotonic() - self._missing[f"epoch {e}"], 1)
        if self.evaluate:
            fields["eval_loss"] = round(eval_model(self.ctx, global_params(state)), 4)
        self.log("finalized", **fields)
        return True
