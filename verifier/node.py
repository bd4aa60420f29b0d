"""The verifier node: judge the trainers the audit seed assigns to it, by replaying their work.

For each trainer that answered an audit it is assigned to, it fetches the manifest, the challenged
states and the payload (all checked against CIDs and on-chain digests), runs the checks of
verifier/replay.py, publishes the findings as evidence, and posts the verdict. Anything malformed a
trainer sends is a failed finding, never a crash. A pass also vouches for the payload's
availability: the verifier keeps its own copy and puts it back into the store whenever it goes
missing, until the epoch is over (verifier/keeper.py). A payload reported unavailable is fetched
by its availability committee; a member votes available (and keeps the copy) iff it gets the
revealed bytes, else unavailable (docs/protocol.md §10.2). After an epoch finalizes it recomputes
the coordinator's aggregate and reports a mismatch.

Run it with `veriloco verifier --run ID`.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from dilocox.delay import MergeBase, Offset, StartRule, epoch_merge_offset
from dilocox.device import check_device, resolve_device
from dilocox.inner import Params, State, TrainerError, configure_determinism
from dilocox.numerics import check_numerics
from dilocox.outer import global_params
from dilocox.round import RoundSpec, start_state
from protocol import shard_audit
from protocol.chain import errors as ce
from protocol.chain.binding import Assignment, Chain, ChainError, ChainUnavailable, Phase, Role, Sub
from protocol.chain.errors import WrongPhase
from protocol.chain.outage import TRANSIENT, through_outages
from protocol.cpumeter import RPC
from protocol.digest import state_digest
from protocol.errors import VerilocoError
from protocol.formats.codec import (
    AuditManifest,
    TensorSpec,
    canonical_json,
    decode_manifest,
    load_state,
    save_state,
    spec_of,
)
from protocol.formats.payload import open_publication
from protocol.leaf import block_count
from protocol.membership import check_joinable, verifier_shortfall
from protocol.run import (
    RunContext,
    initial_model,
    open_run,
    params_of,
    revealed_payload,
)
from protocol.statedir import run_dir
from protocol.store.backends import (
    DEFAULT_READ_CACHE,
    IntegrityError,
    Metered,
    NotFound,
    Store,
    StoreError,
    StoreTimeout,
)
from protocol.store.unixfs import cid_of
from protocol.types import Cid, Digest
from public.schedule import Schedule
from public.windowaudit import chain_windows, report_abandoned
from verifier.keeper import Keeper
from verifier.replay import (
    NO_WITNESS,
    Finding,
    check_final,
    check_leaf_count,
    check_payload,
    check_start_state,
    check_step,
    replay_witness,
)
from verifier.shard import Chained, audit_findings

Log = Callable[..., None]
MAX_MANIFEST_BYTES = 1 << 20
MAX_STATE_BYTES = 2 << 30
EVIDENCE_FORMAT = "veriloco.evidence.v2"  # one document per verifier per epoch: every verdict's findings


class ForeignInstance(VerilocoError):
    """The chain holds a commitment of this key that this node's folder did not make (issue 46 item 1)."""


@dataclass(frozen=True)
class Duty:
    """A trainer of an auditing epoch drawn to this verifier: what it revealed and what to check.
    Both are fixed while the epoch audits (reveals close before the seed is drawn, and the verifier
    list is frozen until the epoch is finalized: docs/contract.md), so they are read once."""

    reveal: Mapping[str, Any]
    assignment: Assignment


class VerifierNode:
    def __init__(
        self, chain: Chain, store: Store, run_id: int, workdir: Path, *,
        log: Log | None = None, poll_s: float = 0.25, threads: int = 1, device: str = "cpu",
    ) -> None:
        if chain.sender is None:
            raise TrainerError("a verifier node needs a signing key")
        self.device = resolve_device(device)  # where shard segments replay; checked against the run in run()
        self.chain, self.run_id = chain, run_id
        self.store = Metered(store, DEFAULT_READ_CACHE)  # what it fetches, and its CPU in fetching (``verified`` events)
        self.me = chain.sender
        self.log: Log = log or (lambda event, **kv: None)
        self.poll_s, self.threads = poll_s, threads
        self._models: dict[int, dict[str, Tensor]] = {}
        self.ledger = run_dir(chain, run_id, Path(workdir), self.log) / "verdicts.json"
        self.keeper = Keeper(self.ledger.parent / "kept", store)
        self._fetched: dict[str, tuple[Cid, bytes]] = {}  # "e:trainer" -> the payload `verify` checked
        self._duties: dict[int, tuple[bytes, dict[str, Duty]]] = {}  # the last few auditing epochs' (`_duties_of`)
        self._said: set[str] = set()

    def _once(self, key: str, event: str, **fields: Any) -> None:
        """Log `event` the first time `key` comes up: a condition retried every round says so once."""
        if key not in self._said:
            self._said.add(key)
            self.log(event, **fields)

    def _done(self) -> dict[str, Any]:
        try:
            return json.loads(self.ledger.read_text())
        except FileNotFoundError:
            return {}

    def _record(self, key: str, value: Any) -> None:
        done = {**self._done(), key: value}
        tmp = self.ledger.with_suffix(".tmp")
        tmp.write_text(json.dumps(done, sort_keys=True, indent=1))
        tmp.replace(self.ledger)

    def run(self) -> None:
        configure_determinism(self.threads, self.device.type)
        self.ctx: RunContext = open_run(self.chain, self.store, self.run_id)
        self.spec = RoundSpec.from_config(self.ctx.config)
        a = self.ctx.config.audit
        check_device(self.device, a.device, a.mode, a.unit, self.run_id)
        check_numerics(self.ctx.config, self.run_id)  # before it joins or stakes: its bits must be its peers'
        self.schedule = Schedule(self.chain, self.store, self.ctx, self.spec)
        m = self.chain.member(self.run_id, self.me)
        if m.role == Role.TRAINER:
            raise TrainerError(f"{self.me} is a trainer in run {self.run_id}; a verifier needs its own key")
        if m.role == Role.NONE:
            check_joinable(self.chain.run_info(self.run_id), self.ctx.config.schedule.epochs, "verifier")
            self.chain.join_verifier(self.run_id)
            self.log("joined")
        last = self.ctx.config.schedule.epochs - 1
        self.log("started")
        if (short := verifier_shortfall(self.chain.run_info(self.run_id))) is not None:
            self.log("too-few-verifiers", detail=short)
        try:
            while not through_outages(lambda: self._round(last), self.log, "audit round"):
                time.sleep(self.poll_s)
        except KeyboardInterrupt:  # a requested stop (veriloco.nodes.Stopped): the verdicts it owes come first
            self._keep_promises(last)
            raise
        self.log("finished", rpc_calls=RPC.calls, rpc_cpu_s=round(RPC.cpu_s, 3))  # this process's chain reads and writes

    def _owed(self) -> list[int]:
        """Auditing epochs, seeded, whose frozen verifier list holds this verifier and whose verdicts it has
        not revealed: each missing commitment or reveal is slashed (docs/protocol.md §5.2)."""
        nxt = self.chain.run_info(self.run_id).next_epoch
        done = self._done()
        return [e for e in range(max(0, nxt - 3), nxt)
                if self.chain.epoch_status(self.run_id, e).phase is Phase.AUDITING
                and self.chain.epoch_times(self.run_id, e).seeded
                and not (done.get(f"verdicts:{e}") or {}).get("revealed")
                and self.me in self.chain.frozen_verifiers(self.run_id, e)]

    def _keep_promises(self, last: int) -> None:
        """Before a requested stop, judge, commit and reveal the verdicts this verifier owes (until its
        epochs leave the audit, at the latest the verdict deadline). The signal handler has restored the
        default action, so a second signal ends the process at once."""
        owed = self._owed()
        if not owed:
            return
        self.log("draining", epochs=owed, detail="stopping once the verdicts it owes are committed and revealed; "
                 "a second signal stops at once, and a verdict it then misses is slashed")
        while self._owed():
            if through_outages(lambda: self._round(last), self.log, "draining"):
                return
            time.sleep(self.poll_s)

    def _round(self, last: int) -> bool:
        """Judge whatever is open; True once the run's last epoch is over."""
        nxt = self.chain.run_info(self.run_id).next_epoch
        self._keep()
        for e in range(max(0, nxt - 3), nxt):
            self._audit_epoch(e)
            self._report_abandoned(e)
            self._judge_availability(e)
            self._finalize_for_a_silent_coordinator(e)
            self._check_aggregate(e)
        if nxt > last and self.chain.epoch_status(self.run_id, last).phase in (Phase.FINALIZED, Phase.ABORTED):
            self._check_aggregate(last)
            for e in self.keeper.epochs():  # the run is over: nobody aggregates from our copies any more
                self.keeper.release(e)
            return True
        return self._removed(nxt)

    def _report_abandoned(self, e: int) -> None:
        """A windowed run: once epoch e's commits closed, report every trainer its window posts bound to
        commit it that did not (docs/protocol.md §5.4 step 7), once per epoch, beside the coordinator."""
        key = f"abandoned:{e}"
        if self.ctx.config.audit.window and key not in self._done() and report_abandoned(
                self.chain, self.store, self.run_id, e, self.log):
            self._record(key, True)

    def _removed(self, nxt: int) -> bool:
        """Whether this verifier is out of the run (slashed, or it left) and owes it nothing more: every
        epoch it may have been drawn for (those before its leave epoch) is over, finalized (its model
        confirmed: no attestation is due) or aborted. Its own check of those models ran this round."""
        m = self.chain.member(self.run_id, self.me)
        if m.leave_epoch is None:
            return False
        for e in range(max(0, m.leave_epoch - 3), min(m.leave_epoch, nxt)):
            if self.chain.epoch_status(self.run_id, e).phase not in (Phase.FINALIZED, Phase.ABORTED):
                return False
        for e in self.keeper.epochs():  # nothing of ours is aggregated from any more
            self.keeper.release(e)
        self.log("removed", leave_epoch=m.leave_epoch,
                 detail="off the verifier list, the audits it was drawn for are over; stopping")
        return True

    # ------------------------------------------------------------------ availability

    def _keep(self) -> None:
        """Put back the payloads we passed while their epoch is open; drop them once it is over.

        Over means aborted, or finalized and our own re-check of the aggregate done (that re-check
        needs the payloads too).
        """
        done = self._done()
        for e in self.keeper.epochs():
            phase = self.chain.epoch_status(self.run_id, e).phase
            if phase is Phase.ABORTED or (phase is Phase.FINALIZED and f"aggregate:{e}" in done):
                self.keeper.release(e)
                self.log("released", epoch=e)
                continue
            try:
                for cid in self.keeper.restore(e):
                    self.log("republished", epoch=e, payload=cid)
            except TRANSIENT:
                raise
            except (StoreError, OSError) as exc:
                self._once(f"keep:{e}", "keep-failed", epoch=e, error=str(exc))

    def _judge_availability(self, e: int) -> None:
        """Vote on every reported payload of epoch e whose availability committee we are on, once.

        Available iff we fetch the revealed bytes (CID and digest checked, within the store's
        timeouts) and keep them, like a pass; anything else a trainer did (nothing published,
        deleted, wrong bytes, too slow) is unavailable. Our own store or chain outage propagates:
        the vote is retried once the endpoint is back, never cast on our own failure.
        """
        if self.chain.epoch_status(self.run_id, e).phase is not Phase.AUDITING:
            return
        for ev in self.chain.events(["AvailabilityReported"], run_id=self.run_id, epoch=e):
            t = ev.args["trainer"]
            key = f"available:{e}:{t}"
            if key in self._said or key in self._done():
                continue
            a = self.chain.availability(self.run_id, e, t)
            if a.decision is not None:
                self._said.add(key)  # nothing for us to do, now or later
                continue
            if not a.committee:
                continue  # drawn from the report block's hash once that block is past: look again next poll
            if self.me.lower() not in {v.lower() for v in a.committee}:
                self._put_back(e, t, key)
                continue
            available, detail = self._fetch_reported(e, t)
            try:
                tx = self.chain.vote_availability(self.run_id, e, t, available)
            except ChainUnavailable:
                raise
            except ChainError as exc:  # voted before a restart, decided meanwhile, or the epoch moved on
                self._record(key, {"available": available, "error": str(exc)})
                self.log("availability-vote-failed", epoch=e, trainer=t, error=str(exc))
                continue
            self._record(key, {"available": available})
            self.log("availability-voted", epoch=e, trainer=t, available=available, detail=detail, gas=tx.gas_used)

    def _put_back(self, e: int, t: str, key: str) -> None:
        """Not on the committee: if we passed the reported trainer we keep its payload, so we put it
        back into the store and say so on chain; the committee then fetches it, and its "available"
        decision slashes nobody (the reporter was right when it reported)."""
        self._said.add(key)
        reveal = self.chain.revealed(self.run_id, e, t)
        if not reveal or Cid(reveal[0].args["payloadCid"]) not in self.keeper.held(e):
            return  # not ours to keep
        try:
            self.keeper.restore(e)
            tx = self.chain.vote_availability(self.run_id, e, t, True)
        except TRANSIENT:
            self._said.discard(key)
            raise
        except (ChainError, StoreError, OSError) as exc:  # decided meanwhile, or our disk
            self._record(key, {"put_back": False, "error": str(exc)})
            self.log("put-back-failed", epoch=e, trainer=t, error=str(exc))
            return
        self._record(key, {"put_back": True})
        self.log("payload-put-back", epoch=e, trainer=t, payload=reveal[0].args["payloadCid"], gas=tx.gas_used)

    def _fetch_reported(self, e: int, t: str) -> tuple[bool, str]:
        """(fetched and kept, why): the reported trainer's revealed payload, as a pass would check it."""
        try:
            reveal = self.chain.revealed(self.run_id, e, t)[0].args
            data = revealed_payload(self.store, reveal, fresh=True)  # the vote is on what the store serves
        except StoreTimeout as exc:  # the trainer's content, not our endpoint: too slow is unavailable
            return False, f"not retrievable in time: {exc}"
        except TRANSIENT:
            raise
        except (VerilocoError, IndexError, KeyError, ValueError, TypeError) as exc:
            return False, f"{type(exc).__name__}: {exc}"
        try:
            self.keeper.hold(e, Cid(reveal["payloadCid"]), data)
        except TRANSIENT:
            raise
        except (StoreError, OSError) as exc:  # our disk, not the trainer: the bytes were there
            self.log("keep-failed", epoch=e, trainer=t, error=str(exc))
        return True, "fetched and kept"

    # ------------------------------------------------------------------ audits

    def _audit_epoch(self, e: int) -> None:
        """Judge the trainers assigned to us, commit to all the verdicts at once, reveal them when
        reveals open (docs/protocol.md §5.2). Salt, verdicts and witnesses go to the ledger before the
        commitment is sent, so a restarted node reveals what it committed."""
        if self.chain.epoch_status(self.run_id, e).phase is not Phase.AUDITING:
            return
        done = self._done()
        batch = done.get(f"verdicts:{e}")
        if batch is None:
            times = self.chain.epoch_times(self.run_id, e)
            if not times.seeded or self.me not in self.chain.frozen_verifiers(self.run_id, e):
                return
            batch = self._judge_epoch(e, done, times.seed)
            if batch is None:
                return
            self._record(f"verdicts:{e}", batch)
        verdicts = [(t, bool(p), bytes.fromhex(w)) for t, p, w, _ in batch["verdicts"]]
        salt = bytes.fromhex(batch["salt"])
        if not batch.get("committed"):
            if not self._own_commitment(e, verdicts, salt):  # one sent before a crash, not yet recorded, is ours
                try:
                    tx = self.chain.commit_verdicts(self.run_id, e, verdicts, salt)
                except ChainUnavailable:
                    raise
                except ChainError as exc:  # too late (reveals open without us): nothing more to do
                    self._own_commitment(e, verdicts, salt)  # or AlreadyCommitted by another instance: stop
                    self._once(f"commit:{e}", "verdict-commit-failed", epoch=e, error=str(exc))
                    return
                self.log("verdicts-committed", epoch=e, count=len(verdicts), gas=tx.gas_used)
            batch = {**batch, "committed": True}
            self._record(f"verdicts:{e}", batch)
        if batch.get("revealed"):
            self._publish_evidence(e, batch)
            return
        try:  # an empty list too: a commitment left unrevealed is slashed (docs/protocol.md §5.2)
            tx = self.chain.submit_verdicts(self.run_id, e, verdicts, salt, batch["evidence"])
        except ChainUnavailable:
            raise  # not a refusal: the caller waits the outage out and tries again
        except ChainError as exc:  # not open yet (others still judging), or already revealed before a crash
            if isinstance(exc, ce.VerdictsNotOpen):  # expected while others judge: retried, not an error
                self._once(f"reveal:{e}:waiting", "verdict-reveal-waiting", epoch=e, detail=str(exc))
                return
            self._once(f"reveal:{e}:{type(exc).__name__}", "verdict-failed", epoch=e, error=str(exc))
            if any(ev.args["verifier"] == self.me
                   for ev in self.chain.events(["VerdictsRevealed"], run_id=self.run_id, epoch=e)):
                self._record(f"verdicts:{e}", {**batch, "revealed": True})
            return
        batch = {**batch, "revealed": True}
        self._record(f"verdicts:{e}", batch)
        self.log("verdicts", epoch=e, count=len(verdicts), gas=tx.gas_used)
        self._publish_evidence(e, batch)

    def _own_commitment(self, e: int, verdicts: list[tuple[str, bool, bytes]], salt: bytes) -> bool:
        """Whether the chain holds this key's verdict commitment for epoch e, which must be the one this
        folder's ledger would send (its verdicts and salt). Another one stops the node: another instance with
        this key (another machine, or another --workdir past the per-user lock) committed it, and only that
        instance can reveal it; an unrevealed commitment is slashed, so that one must keep running (issue 46)."""
        ours = bytes(self.chain.verdict_commitment_for(self.run_id, e, verdicts, salt))
        held = [bytes(ev.args["commitment"]) for ev in self.chain.events(["VerdictsCommitted"], run_id=self.run_id, epoch=e)
                if ev.args["verifier"] == self.me]
        if any(c != ours for c in held):
            raise ForeignInstance(
                f"the chain holds a verdict commitment of {self.me} for epoch {e} of run {self.run_id} that this state "
                f"folder ({self.ledger.parent}) did not make: another instance runs with this key (on another machine, or "
                "from another --workdir). Stopped before sending anything: keep the other instance running (only it can "
                "reveal that commitment, and an unrevealed one is slashed), or stop it and restart this one from its folder")
        return bool(held)

    def _publish_evidence(self, e: int, batch: dict[str, Any]) -> None:
        """Publish the evidence document of a revealed batch (once; a ledger from before issue 30 has
        none to publish: it went out at judging time)."""
        if batch.get("published") or "evidence_doc" not in batch:
            return
        cid = self.store.put(batch["evidence_doc"].encode())
        if cid != batch["evidence"]:  # the ledger keeps the document's exact text: never expected
            raise IntegrityError(f"the store named epoch {e}'s evidence {cid}, but the reveal named it {batch['evidence']}")
        self._record(f"verdicts:{e}", {**batch, "published": True})

    def _judge_epoch(self, e: int, done: dict[str, Any], seed: bytes) -> dict[str, Any] | None:
        """Verify every responded trainer assigned to us (each result kept in the ledger); the batch
        to commit once every revealed trainer assigned to us responded or the response window is
        over, else None (not ready: a later round continues)."""
        assigned = list(self._duties_of(e, seed))
        responded = {ev.args["trainer"]: ev.args["manifestCid"]
                     for ev in self.chain.events(["Responded"], run_id=self.run_id, epoch=e)}
        for t in assigned:
            key = f"{e}:{t}"
            if t not in responded or key in done:
                continue
            t0, cpu0 = time.monotonic(), time.process_time()
            rpc0, store0, got0 = RPC.snapshot(), self.store.cpu.cpu_s, self.store.received
            steps: list[bytes] = []
            findings = self.verify(e, t, responded[t], steps)
            passed = all(f.passed for f in findings)
            witness = replay_witness(steps) if self.ctx.config.audit.mode == "exact" else NO_WITNESS
            fetched = self._fetched.pop(key, None)
            if passed and fetched is not None:
                try:  # before the vote: a pass vouches that we can produce the payload
                    self.keeper.hold(e, *fetched)
                except TRANSIENT:
                    raise
                except (StoreError, OSError) as exc:
                    self.log("keep-failed", epoch=e, trainer=t, error=str(exc))
                    continue  # our problem, not the trainer's: no verdict yet, retried next round
            done[key] = [t, passed, witness.hex(), [f.to_json() for f in findings]]
            self._record(key, done[key])
            self.log("verified", epoch=e, trainer=t, passed=passed, seconds=round(time.monotonic() - t0, 3),
                     cpu_s=round(time.process_time() - cpu0, 3), rpc_calls=RPC.calls - rpc0[0],
                     rpc_cpu_s=round(RPC.cpu_s - rpc0[1], 3), store_cpu_s=round(self.store.cpu.cpu_s - store0, 3),
                     fetched_bytes=self.store.received - got0,
                     failed=[f"{f.check}: {f.detail}" for f in findings if not f.passed])
        over = self.chain.now() >= self.chain.epoch_times(self.run_id, e).response_deadline
        if not over and any(f"{e}:{t}" not in done for t in assigned):
            return None
        verdicts = [done[f"{e}:{t}"] for t in assigned if f"{e}:{t}" in done]
        evidence = canonical_json({
            "format": EVIDENCE_FORMAT, "run_id": self.run_id, "epoch": e, "verifier": self.me,
            "verdicts": [{"trainer": t, "passed": p, "findings": f} for t, p, _, f in verdicts],
        })
        # named now (the reveal carries the CID), published only once revealed: before that it would
        # show other verifiers our verdicts while they can still commit theirs
        return {"salt": os.urandom(32).hex(), "verdicts": verdicts, "evidence": cid_of(evidence),
                "evidence_doc": evidence.decode()}

    def _duties_of(self, e: int, seed: bytes) -> dict[str, Duty]:
        """The trainers of auditing epoch e drawn to us under the audit seed ``seed``, read once per
        seed: every poll round asked the chain for every revealed trainer's assignment again (K reads a
        round), for answers that cannot change. Keyed by the seed, so that a reorganised chain that
        drew another one is read again rather than judged from a stale draw."""
        if e not in self._duties or self._duties[e][0] != seed:
            mine = {}
            for ev in self.chain.revealed(self.run_id, e):
                a = self.chain.assignment(self.run_id, e, ev.args["trainer"])
                if self.me in a.verifiers:
                    mine[ev.args["trainer"]] = Duty(ev.args, a)
            self._duties = {**{k: v for k, v in self._duties.items() if k >= e - 3}, e: (seed, mine)}
        return self._duties[e][1]

    def _duty(self, e: int, t: str) -> Duty:
        """Trainer t's duty as ``_duties_of`` read it, or read now (``verify`` called on its own)."""
        known = self._duties[e][1].get(t) if e in self._duties else None
        return known or Duty(self.chain.revealed(self.run_id, e, t)[0].args, self.chain.assignment(self.run_id, e, t))

    def verify(self, e: int, trainer: str, manifest_cid: str, steps: list[bytes] | None = None) -> list[Finding]:
        """Every check for one trainer's epoch; failures to fetch or parse are failed findings.

        An unreachable chain or store is our problem, not the trainer's: that propagates, and the
        audit is retried once the endpoint is back. Content that cannot be fetched in time is the
        trainer's problem (withheld or never published): that fails. `steps` receives the gradient
        digest of every replayed step (the replay witness's input, exact audits only).
        """
        findings: list[Finding] = []
        try:
            self._verify(e, trainer, Cid(manifest_cid), findings, steps)
        except StoreTimeout as exc:
            findings.append(Finding("fetch", False, f"content not retrievable in time: {exc}"))
        except TRANSIENT:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever a trainer's data breaks, it fails
            findings.append(Finding("fetch", False, f"{type(exc).__name__}: {exc}"))
        return findings

    @functools.cached_property
    def state_spec(self) -> dict[str, TensorSpec]:
        """Names, dtypes and shapes every training state of this run has (a fresh start state's)."""
        return spec_of(start_state(self.spec, params_of(initial_model(self.ctx.config)), None, None))

    def _state(self, cid: str, digest: bytes) -> State:
        """A trainer's state, fetched, shaped like a training state of this run, and bound to its leaf."""
        state = load_state(self.store.get(cid, max_size=MAX_STATE_BYTES), expect=self.state_spec)
        if state_digest(state) != digest:
            raise TrainerError(f"state {cid} does not hash to its committed leaf digest")
        return state

    def _verify(self, e: int, t: str, manifest_cid: Cid, findings: list[Finding], grads: list[bytes] | None = None) -> None:
        run, spec = self.run_id, self.spec
        sub = self.chain.submission(run, e, t)
        slot = self.chain.member(run, t).slot
        rank, steps = self.schedule.for_epoch(e)
        duty = self._duty(e, t)
        reveal = duty.reveal
        findings.append(check_leaf_count(sub.leaf_count, steps))
        publication = revealed_payload(self.store, reveal)
        self._fetched[f"{e}:{t}"] = (Cid(reveal["payloadCid"]), publication)
        findings.append(check_payload(publication, run, e, t, self.ctx.param_shapes))
        if spec.shard:
            findings.extend(self._verify_shards(e, t, slot, rank, sub, manifest_cid, publication, grads, duty.assignment))
            return
        m: AuditManifest = decode_manifest(self.store.get(manifest_cid, max_size=MAX_MANIFEST_BYTES))
        a = duty.assignment
        bound = (m.run_id, m.epoch, m.trainer.lower(), m.trace_root, m.leaf_count, m.transitions, m.final) == (
            run, e, t.lower(), sub.trace_root, sub.leaf_count, tuple(sorted(set(a.transitions))), a.final_check)
        findings.append(Finding("manifest", bound, "matches the on-chain submission and assignment" if bound
                                else "manifest does not match the on-chain trace root, leaf count or challenges"))
        if not bound:
            return
        audit = self.ctx.config.audit
        if m.segment != audit.segment:
            findings.append(Finding("manifest", False, f"segment {m.segment}, the run audits {audit.segment} steps"))
            return
        start_finding, start = self._check_start(e, t, slot, m)
        findings.append(start_finding)
        # the merge rule folds G_e − S_e in at its step: G_e is final (epoch e's commits close only after
        # epoch e-1 is done, docs/contract.md), S_e is the start just recomputed
        g_e = self._model(e) if spec.rule is StartRule.MERGE else None
        merge = (MergeBase(g_e, start, self._merge_offset(e, t, bool(m.previous)))
                 if g_e is not None and start is not None else None)
        states = {s.leaf_index: self._state(s.cid, s.digest) for s in m.states}
        for k in m.transitions:
            end = m.end(k)
            findings.append(check_step(
                states[k], k, end.digest, spec, self.ctx.corpus, e, slot, steps=end.leaf_index - k,
                mode=audit.mode, tolerance=audit.tolerance,
                next_state=self._state(end.cid, end.digest) if audit.mode == "tolerant" else None,
                grad_digests=grads if audit.mode == "exact" else None, merge=merge,
            ))
        if m.final:
            last = states[m.leaf_count - 1]
            findings.append(check_final(states[0], last, Digest(bytes(reveal["payloadDigest"])), spec, run, e, slot, t,
                                        rank, g_e))

    def _verify_shards(
        self, e: int, t: str, slot: int, rank: int, sub: Any, manifest_cid: Cid, publication: bytes,
        grads: list[bytes] | None, assignment: Assignment,
    ) -> list[Finding]:
        """A shard audit (docs/protocol.md §5.3): one block per drawn segment, the final and start checks."""
        n = block_count(self.spec.model)
        m = shard_audit.decode_manifest(self.store.get(manifest_cid, max_size=MAX_MANIFEST_BYTES), n,
                                        max_bytes=MAX_MANIFEST_BYTES)
        prev = self.chain.submission(self.run_id, e - 1, t) if e >= 1 else None
        steps, seed_of, W = assignment.transitions, None, self.ctx.config.audit.window
        if W:  # the draws come from the window posts (docs/protocol.md §5.4), read as the trainer read them
            wa = chain_windows(self.chain, self.store, run_id=self.run_id, epoch=e, trainer=t, slot=slot,
                               claimed=m.window_roots if m.window_width == W else (), trace_root=sub.trace_root,
                               leaf_count=sub.leaf_count, W=W, depth=self.ctx.config.audit.window_depth)
            if wa.findings:
                return [Finding("windows", False, wa.findings[0])]
            steps, seed_of = tuple(wa.drawn), functools.partial(wa.seed_of, W=W)
        chained = Chained(
            trace_root=sub.trace_root, leaf_count=sub.leaf_count, seed=self.chain.epoch_times(self.run_id, e).seed,
            steps=steps, final_bps=self.ctx.info.params.final_check_bps,
            prev_revealed=prev is not None and prev.state >= Sub.REVEALED,
            prev_root=prev.trace_root if prev is not None else bytes(32),
            prev_leaf_count=prev.leaf_count if prev is not None else 0, window=W, seed_of=seed_of,
        )
        prev_rank = self.schedule.for_epoch(e - 1)[0] if e >= 1 else 0
        return audit_findings(
            m, chained, lambda cid, spec: load_state(self.store.get(cid, max_size=MAX_STATE_BYTES), expect=spec),
            self.spec, self.ctx.corpus, self._start_model(e), publication, run_id=self.run_id, epoch=e, slot=slot,
            trainer=t, rank=rank, prev_rank=prev_rank, grad_digests=grads, device=self.device,
            merged=self._model(e) if self.spec.rule is StartRule.MERGE else None,
            offset=self._merge_offset(e, t, bool(m.previous)),
        )

    def _check_start(self, e: int, t: str, slot: int, m: AuditManifest) -> tuple[Finding, State | None]:
        """Every audit, every epoch: leaf 0 follows the public start rule (docs/protocol.md §8); also
        the recomputed start (``check_start_state``).

        With `previous` the trainer claims to continue its revealed epoch e-1, whose first and last
        states must come from the trace it revealed; without, it claims a fresh start (epoch 0, e-1
        not revealed, or local state lost), a function of the global model alone.
        """
        g = self._start_model(e)
        if not m.previous:
            return check_start_state(m.start.digest, self.spec, g, None, None, self.run_id, e, slot, t, 0)
        prev = self.chain.submission(self.run_id, e - 1, t)
        if prev.state < Sub.REVEALED or m.previous_root != prev.trace_root or m.previous_leaf_count != prev.leaf_count:
            return Finding("start", False, "previous-epoch states are not from the trace the trainer revealed for e-1"), None
        p0, p_end = (self._state(s.cid, s.digest) for s in m.previous)
        prev_rank, _ = self.schedule.for_epoch(e - 1)
        return check_start_state(m.start.digest, self.spec, g, p0, p_end, self.run_id, e, slot, t, prev_rank)

    def _merge_offset(self, e: int, t: str, continued: bool) -> Offset | None:
        """With error feedback in the parameters, what trainer ``t``'s epoch e merge step adds
        (``dilocox.delay.epoch_merge_offset``), all public: its own e-1 payload as it revealed it.
        Computed once, when a replayed step first merges; None under a carried buffer."""
        if not self.spec.ef_in_params:
            return None

        def own() -> Params:
            cached = self._fetched.get(f"{e - 1}:{t}")
            pub = cached[1] if cached is not None else revealed_payload(self.store, self.chain.revealed(self.run_id, e - 1, t)[0].args)
            return open_publication(pub, self.ctx.param_shapes, run_id=self.run_id, epoch=e - 1, trainer=t)

        return functools.cache(lambda: epoch_merge_offset(e, continued, self._model(e), self._model, own))

    def _start_model(self, e: int) -> dict[str, Tensor]:
        """The global model epoch e starts from (G_0 for epoch 0)."""
        return self._model(e if self.spec.rule is StartRule.BLOCKING else e - 1)

    def _model(self, i: int) -> dict[str, Tensor]:
        """G_i (G_0 for i <= 0), recomputed from G_0 and the passing payloads (public/globals.py
        `VerifiedGlobals`), never a model someone else posted."""
        i = max(i, 0)
        if i not in self._models:  # keep this one and the one before (audits of two epochs overlap)
            g = global_params(self._globals().base(i))  # fixed once epochs < i are terminal, as base() requires
            self._models = {**{k: v for k, v in self._models.items() if k >= i - 1}, i: g}
        return self._models[i]

    # ------------------------------------------------------------------ aggregate re-check and attestation

    def _globals(self) -> Any:
        from public.globals import (
            VerifiedGlobals,  # the verifier re-runs the coordinator's aggregation
        )

        if not hasattr(self, "globals"):
            self.globals = VerifiedGlobals(self.chain, self.store, self.ctx, self.ledger.parent / "globals", log=self.log)
        return self.globals

    def _finalize_for_a_silent_coordinator(self, e: int) -> None:
        """Liveness: once the coordinator's half of the finalize window has passed (it is silent, or
        was slashed for a wrong model), finalize the recomputed aggregate ourselves; the contract lets
        any staked member do so, and the attestation committee checks our model like anyone's."""
        from public.globals import PayloadMissing, build_global

        status = self.chain.epoch_status(self.run_id, e)
        if status.phase is not Phase.AUDITING:
            return
        t = self.chain.epoch_times(self.run_id, e)
        window = self.ctx.info.params.finalize_window
        if self.chain.now() < t.finalize_deadline - window // 2:
            return
        try:
            state, included, digest = build_global(self.chain, self.store, self.ctx, e, self._globals())
        except TRANSIENT:
            raise
        except (VerilocoError, OSError) as exc:  # content missing for now: a passing verifier puts it back
            self._once(f"finalize-waiting:{e}", "finalize-waiting", epoch=e, error=str(exc))
            if isinstance(exc, PayloadMissing) and exc.epoch == e:
                self._report_for_a_silent_coordinator(e, exc)
            return
        cid = self.store.put(save_state(state))
        self.store.pin(cid)
        try:
            tx = self.chain.finalize(self.run_id, e, cid, digest, included)
        except ChainUnavailable:
            raise
        except WrongPhase as exc:  # another member finalized first: the race every stand-in runs, lost
            self._once(f"finalize:{e}", "finalize-lost", epoch=e, detail=f"another member finalized first: {exc}")
            return
        except ChainError as exc:  # the epoch is not ready yet, or refused otherwise
            self._once(f"finalize:{e}", "finalize-failed", epoch=e, error=str(exc))
            return
        self.log("finalized", epoch=e, included=len(included), model=cid, gas=tx.gas_used,
                 reason="the coordinator did not finalize in its window")

    def _report_for_a_silent_coordinator(self, e: int, missing: Any) -> None:
        """Past the coordinator's half of the finalize window a passing payload is still missing and
        nobody has reported it: report it once ourselves (docs/protocol.md §10.3), so the epoch does
        not depend on the coordinator to get rid of a withholder. The coordinator had its grace."""
        key = f"report:{e}:{missing.trainer}"
        if key in self._said:
            return
        if self.chain.availability(self.run_id, e, missing.trainer).reporter is None:
            try:
                tx = self.chain.report_unavailable(self.run_id, e, missing.trainer)
            except ChainUnavailable:
                raise
            except ChainError as exc:  # someone was first, or the epoch moved on
                self.log("report-failed", epoch=e, trainer=missing.trainer, error=str(exc))
            else:
                self.log("reported-unavailable", epoch=e, trainer=missing.trainer, payload=missing.cid,
                         gas=tx.gas_used, reason="the coordinator did not report it in its window")
        self._said.add(key)

    def _check_aggregate(self, e: int) -> None:
        """Recompute a finalized epoch's model; on its attestation committee, attest what we computed
        (publishing it, so a corrected model can be fetched), else just check and raise an alarm."""
        from public.globals import build_global

        key = f"aggregate:{e}"
        phase = self.chain.epoch_status(self.run_id, e).phase
        if key in self._done() or phase not in (Phase.CONFIRMING, Phase.FINALIZED):
            return
        try:
            state, _, digest = build_global(self.chain, self.store, self.ctx, e, self._globals())
            if phase is Phase.CONFIRMING:
                if f"attested:{e}" not in self._done() and self.me in self.chain.model_committee(self.run_id, e):
                    cid = self.store.put(save_state(state))
                    self.store.pin(cid)
                    matches = digest == self.chain.epoch_times(self.run_id, e).model_digest  # the finalizer's
                    try:
                        tx = self.chain.attest_model(self.run_id, e, digest, cid)
                        self.log("attested", epoch=e, model=cid, matches=matches, gas=tx.gas_used)
                    except ChainUnavailable:
                        raise
                    except WrongPhase as exc:  # the committee's majority finalized the model first: routine
                        late = self.chain.epoch_status(self.run_id, e).phase is Phase.FINALIZED
                        self.log("attest-late" if late else "attest-failed", epoch=e, error=str(exc))
                    except ChainError as exc:  # attested before a restart, or the window closed
                        self.log("attest-failed", epoch=e, error=str(exc))
                    self._record(f"attested:{e}", True)
                return  # judged once the committee has decided
            ok = digest == self.chain.epoch_times(self.run_id, e).model_digest
        except TRANSIENT:
            raise  # our endpoint, not the coordinator's fault: retried once it is back
        except (NotFound, IntegrityError) as exc:  # gone for now: a passing verifier puts it back
            self._once(key, "aggregate-waiting", epoch=e, error=str(exc))
            return
        except (VerilocoError, OSError, ValueError, RuntimeError) as exc:
            ok = False
            self.log("aggregate-error", epoch=e, error=str(exc))
        self._record(key, {"matches": ok})
        self.log("aggregate-checked", epoch=e, matches=ok)
        if not ok:
            self.log("alarm", epoch=e, detail="the finalized model is not the aggregate of the passing payloads")
