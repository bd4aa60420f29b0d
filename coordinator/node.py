"""The coordinator node: aggregate each epoch's verified pseudo-gradients and finalize it on-chain.

It waits until every committed trainer of an epoch is decided (or the verdict window closes),
builds the new global model from the passing payloads only (public/globals.py), publishes it,
and submits its CID and digest with the list of included trainers. The contract refuses the
finalization if that list is not exactly the passing set. Content it cannot get is logged once and
retried until the epoch expires; the coordinator never exits on it. It stops once it is out of the
run (it left, or was slashed for a model the attestation committee replaced): the contract would refuse
its finalize, so it says `removed` and ends (veriloco/nodes.py then says whether it was slashed).

Content it cannot get (a payload deleted after its pass, a model or config gone from the store,
bytes that do not match their CID or digest) never stops it: it says so in one line and tries again
every poll until the content is back (a passing verifier re-publishes the payloads it vouched for,
verifier/keeper.py) or the epoch's finalize deadline passes and the epoch is Aborted. A passing
trainer's payload that stays missing for a grace period (`report_after` of the time then left before
the finalize deadline, at least `MIN_REPORT_POLLS` polls) is reported once to its availability
committee (docs/protocol.md §10.2); once the committee judges it unavailable the trainer is no
longer passing, the aggregate leaves it out, and the epoch finalizes. The grace is what keeps an
honest coordinator from reporting a payload that is merely slow (a committee that fetches it
slashes the reporter), while leaving the committee most of the window to vote.

Run it with `veriloco coordinator --run ID`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import TypeVar

from dilocox.outer import global_params
from dilocox.round import RoundSpec
from protocol import windows
from protocol.chain import errors as ce
from protocol.chain.binding import Chain, ChainError, ChainUnavailable, Phase, Role
from protocol.chain.outage import TRANSIENT, through_outages
from protocol.errors import VerilocoError
from protocol.formats.codec import save_state
from protocol.membership import verifier_shortfall
from protocol.relay import Domain
from protocol.run import RunContext, eval_model, open_run
from protocol.store.backends import Store
from public import relaynet
from public.globals import PayloadMissing, VerifiedGlobals, build_global
from public.relaynet import EpochFacts, Relay, RelayPoster
from public.schedule import Schedule
from public.windowaudit import domain_of, epoch_positions, report_abandoned

Log = Callable[..., None]
T = TypeVar("T")
TERMINAL = (Phase.FINALIZED, Phase.ABORTED)
MIN_REPORT_POLLS = 8  # the shortest grace, in polls, before a missing payload is reported
NOT_CONTENT: tuple[type[BaseException], ...] = (ChainError, *TRANSIENT)  # a refusal or an outage keeps its own handling


class CoordinatorError(VerilocoError):
    """The coordinator cannot act for this run (wrong key, unknown run)."""


@dataclass(frozen=True)
class _Served:
    """The window relay a coordinator serves: its poster (which reads the relay's books) and HTTP server."""

    poster: RelayPoster
    server: ThreadingHTTPServer


class CoordinatorNode:
    def __init__(self, chain: Chain, store: Store, run_id: int, *, log: Log | None = None, poll_s: float = 0.25,
                 evaluate: bool = True, report_after: float = 0.25,
                 clock: Callable[[], float] = time.monotonic, relay_port: int | None = None,
                 relay_wait_s: float = 5.0) -> None:
        self.chain, self.store, self.run_id = chain, store, run_id
        self.log: Log = log or (lambda event, **kv: None)
        self.poll_s, self.evaluate = poll_s, evaluate
        self.report_after = report_after  # share of the time left before the finalize deadline
        self.clock = clock  # measures how long a payload has been missing
        self._missing: dict[str, float] = {}  # what -> when its content first went missing
        self._reveals_awaited: set[int] = set()  # epochs whose finalize waited for verdict reveals (said once)
        self._error: dict[str, VerilocoError] = {}  # what -> why it is missing now
        self._absent: dict[tuple[int, str], tuple[float, float]] = {}  # (epoch, trainer) -> (first seen, grace s)
        self._reported: set[tuple[int, str]] = set()
        # windowed runs (docs/protocol.md §5.4): the relay it serves on 127.0.0.1:relay_port (0: any free
        # port; None: none, trainers post their window roots themselves) and posts each window's aggregate
        self.relay_port, self.relay_wait_s = relay_port, relay_wait_s
        self.relay_url: str | None = None
        self._relay: _Served | None = None
        self._relay_facts: dict[Domain, EpochFacts] = {}
        self._abandon_checked: set[int] = set()  # windowed epochs whose bound trainers were checked once commits closed

    def _content(self, what: str, fetch: Callable[[], T]) -> T | None:
        """`fetch()`, or None (logged once per `what`) while the content it reads is missing or malformed.

        Chain errors are not content: a refusal or an outage keeps its own handling.
        """
        try:
            return fetch()
        except NOT_CONTENT:
            raise
        except VerilocoError as exc:  # store, digest, format, payload or aggregation errors
            self._error[what] = exc
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
        if self.chain.member(self.run_id, self.chain.sender).role == Role.NONE:
            tx = self.chain.stake_coordinator(self.run_id)  # the stake answers for the models it finalizes
            self.log("staked", gas=tx.gas_used)
        self._start_relay()
        self.log("started", **({"relay": self.relay_url} if self.relay_url else {}))
        if (short := verifier_shortfall(self.chain.run_info(self.run_id))) is not None:
            self.log("too-few-verifiers", detail=short)
        try:
            for e in range(self.ctx.config.schedule.epochs):
                if not self._follow(e):
                    return  # removed: the node's caller says whether it was slashed (veriloco/nodes.py)
            self.log("finished")
        finally:
            if self._relay is not None:
                self._relay.server.shutdown()
                self._relay.server.server_close()

    def _start_relay(self) -> None:
        """Serve the window relay when the run is windowed and a port was given."""
        if not self.ctx.config.audit.window or self.relay_port is None:
            return
        r = Relay(self._relay_facts.get)  # the HTTP threads only read facts this thread put there
        server = relaynet.start(r, self.relay_port)
        self._relay = _Served(RelayPoster(r, self.chain, self.store, self.relay_wait_s, self.log), server)
        self.relay_url = f"http://127.0.0.1:{server.server_address[1]}"
        self.schedule = Schedule(self.chain, self.store, self.ctx, RoundSpec.from_config(self.ctx.config))

    def _serve_relay(self) -> None:
        """Open the book of the epoch in training (its trainers by slot, its window count) and post every
        window whose roots are all in, or whose first root has waited `relay_wait_s`."""
        if self._relay is None:
            return
        e = self.chain.current_epoch(self.run_id)
        dom = domain_of(self.chain, self.run_id, e)
        if dom not in self._relay_facts and e < self.ctx.config.schedule.epochs:
            sched = self._content(f"schedule of epoch {e}", functools.partial(self.schedule.for_epoch, e))
            if sched is not None:  # else said once; trainers post their roots themselves meanwhile
                self._relay_facts[dom] = EpochFacts(epoch_positions(self.chain, self.run_id, e),
                                                    windows.window_count(sched[1] + 1, self.ctx.config.audit.window))
        self._relay.poster.poll()

    def _follow(self, e: int) -> bool:
        """Wait until epoch e is over, finalizing it once ready; False once this account may finalize no
        more (checked before every try, so a removed coordinator never sends a finalize the contract refuses)."""
        waiting = False
        while not through_outages(self._removed, self.log, "membership"):
            through_outages(self._serve_relay, self.log, "window relay")
            through_outages(functools.partial(self._report_abandoned, e), self.log, f"epoch {e}'s window promises")
            if through_outages(functools.partial(self._try_finalize, e), self.log, f"epoch {e}"):
                return True
            if not waiting:  # once per epoch: a readable console shows the wait's progress (veriloco/logs.py)
                self.log("waiting", what=f"epoch {e} to be ready to finalize")
                waiting = True
            time.sleep(self.poll_s)
        return False

    def _report_abandoned(self, e: int) -> None:
        """Once epoch e's commits closed, report every trainer a window post bound to commit it that did not
        (docs/protocol.md §5.4 step 7), once per epoch."""
        if self.ctx.config.audit.window and e not in self._abandon_checked and report_abandoned(
                self.chain, self.store, self.run_id, e, self.log):
            self._abandon_checked.add(e)

    def _removed(self) -> bool:
        """Whether this coordinator is out of the run: it left, or the attestation committee replaced a
        model it finalized (docs/contract.md, model confirmation). The contract then refuses its finalize
        (`NotStaked`); any staked member finalizes in the second half of each finalize window instead."""
        assert self.chain.sender is not None
        m = self.chain.member(self.run_id, self.chain.sender)
        if m.leave_epoch is None:
            return False
        self.log("removed", leave_epoch=m.leave_epoch,
                 detail="this account finalizes no more in this run (any staked member finalizes in the second "
                        "half of each finalize window; a verifier node does); stopping")
        return True

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
            self._report_if_withheld(e, self._error.get(f"epoch {e}"))
            return False
        state, included, digest = built
        cid = self.store.put(save_state(state))
        self.store.pin(cid)
        try:
            tx = self.chain.finalize(self.run_id, e, cid, digest, included)
        except ChainUnavailable:
            raise  # not a refusal: the caller waits the outage out and tries again
        except ce.NotReady as exc:  # verdict reveals still outstanding (before the deadline): retried, not an error
            if e not in self._reveals_awaited:
                self._reveals_awaited.add(e)
                self.log("finalize-waiting", epoch=e, detail=str(exc))
            return False
        except ce.WrongPhase as exc:  # a stand-in (past half the window) or another instance finalized first
            self.log("finalize-lost", epoch=e, detail=f"another member finalized epoch {e} first: {exc}")
            return False  # the next poll reads the epoch's phase and moves on
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

    def _report_if_withheld(self, e: int, why: VerilocoError | None) -> None:
        """Report a passing trainer of epoch e whose payload has stayed missing past its grace, once.

        Only this epoch's payloads (an earlier epoch is over: nothing to challenge), only while
        nobody has reported it yet. A refused report (the epoch left Auditing, someone else was
        first) is logged and not retried; an outage propagates and the next poll tries again.
        """
        if not isinstance(why, PayloadMissing) or why.epoch != e:
            return
        key = (e, why.trainer)
        if key in self._reported:
            return
        now = self.clock()
        if key not in self._absent:
            left = max(0, self.chain.epoch_times(self.run_id, e).finalize_deadline - self.chain.now())
            self._absent[key] = (now, max(self.report_after * left, MIN_REPORT_POLLS * self.poll_s))
        first, grace = self._absent[key]
        if now - first < grace:
            return
        if self.chain.availability(self.run_id, e, why.trainer).reporter is not None:
            self._reported.add(key)
            return  # already challenged: its committee is voting
        try:
            tx = self.chain.report_unavailable(self.run_id, e, why.trainer)
        except ChainUnavailable:
            raise  # not a refusal: the next poll tries again
        except ChainError as exc:
            self._reported.add(key)
            self.log("report-failed", epoch=e, trainer=why.trainer, error=str(exc))
            return
        self._reported.add(key)
        self.log("reported-unavailable", epoch=e, trainer=why.trainer, payload=why.cid,
                 missing_s=round(now - first, 1), gas=tx.gas_used)
