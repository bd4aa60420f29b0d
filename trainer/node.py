"""The trainer node: follow the run's epochs, train, publish, commit, reveal, answer audits.

A thin loop around the pure round functions (dilocox/round.py), talking only to an injected
`Chain` and `Store`. Per epoch: derive the start state (docs/protocol.md §8), train H steps
recording the state digest after each, compress, publish the payload, commit, reveal; then, while
the next epoch trains, answer the audit with the challenged states and their Merkle proofs. Every
step is recorded in the epoch directory before its transaction, and every transaction is preceded
by a look at the chain, so a node killed at any point resumes without double-submitting.

Run it with `veriloco trainer --run ID`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dilocox.delay import MergeBase, StartRule, epoch_merge_offset, public_history_end
from dilocox.device import check_device, resolve_device
from dilocox.inner import Params, State, TrainerError, configure_determinism
from dilocox.numerics import check_numerics
from dilocox.round import (
    Final,
    RoundSpec,
    compress_seed,
    epoch_batch,
    final_transition,
    merged_if_due,
    replay_step,
    start_state,
)
from protocol import merkle, shard_audit, windows
from protocol.chain.audit import build_response
from protocol.chain.binding import (
    SLASH_REASONS,
    Chain,
    ChainError,
    ChainUnavailable,
    ContractRevert,
    Phase,
    Role,
    Sub,
    TxResult,
)
from protocol.chain.errors import AlreadyCommitted, AlreadyJoined, NotEligible, TooFewVerifiers
from protocol.chain.outage import TRANSIENT, through_outages
from protocol.digest import keccak, state_digest
from protocol.errors import VerilocoError
from protocol.formats.codec import (
    build_state_manifest,
    encode_manifest,
    from_json_value,
    save_state,
    to_json_value,
)
from protocol.formats.payload import open_publication, wrap
from protocol.leaf import block_count
from protocol.membership import check_joinable, verifier_shortfall
from protocol.run import RunContext, open_run, params_of
from protocol.shard_audit import GroupOpening, SeedOf
from protocol.statedir import run_dir
from protocol.store.backends import DEFAULT_READ_CACHE, IntegrityError, Metered, Store
from protocol.types import Cid
from protocol.windowdraw import ChainOrdering, window_challenges
from public.globals import ModelUnavailable, VerifiedGlobals
from public.relaynet import RelayClient
from public.schedule import Schedule
from public.windowaudit import SeedsPending, chain_windows, domain_of
from trainer.answering import AnswerWorker, Built, FileSink, build
from trainer.boundaries import (
    DiskHeadroom,
    memory_headroom,
    quarter_of_free_disk,
    quarter_of_memory,
)
from trainer.checkpoints import ANSWER_SHARE, EpochDir, worst_replay
from trainer.engine import Engine, LocalEngine
from trainer.shard_response import Answer, answer_challenge, shard_response
from trainer.windowpost import WindowSender

if TYPE_CHECKING:
    from trainer.stages import PipelineSteps

Log = Callable[..., None]
TERMINAL = (Phase.FINALIZED, Phase.ABORTED)
REMOVAL_CHECK_S = 2.0  # while training: how often it reads whether it may still commit the epoch

# epoch directory statuses, in order
TRAINING, TRAINED, COMMITTING, COMMITTED, REVEALED, RESPONDED, CLOSED = (
    "training", "trained", "committing", "committed", "revealed", "responded", "closed",
)


class _Removed(Exception):
    """Raised between steps once the trainer may not commit the epoch it trains (logged `removed`)."""


class Behaviour:
    """How this trainer plays. The honest default; trainer/cheats.py holds adversaries for tests and demos."""

    name = "honest"

    def step(self, node: TrainerNode, state: State, epoch: int, k: int) -> tuple[State, float]:
        return node.inner_step(state, epoch, k)

    def engine(self, node: TrainerNode) -> Engine:
        """Where a sharded run's steps happen (``audit.unit = "shard"``; ``step`` is the whole-state hook)."""
        return node.make_engine()

    def publication(self, node: TrainerNode, final: Final, epoch: int) -> bytes:
        return final.publication

    def walks_away(self, node: TrainerNode, epoch: int) -> bool:
        """Whether it drops the epoch it trained instead of committing it (an honest trainer never does)."""
        return False

    def commitment(self, node: TrainerNode, epoch: int, meta: dict[str, Any]) -> bytes:
        return node.chain.commitment_for(
            node.run_id, epoch, bytes.fromhex(meta["payload_digest"]), bytes.fromhex(meta["trace_root"]),
            meta["leaf_count"], bytes.fromhex(meta["salt"]),
        )

    def reveal(self, node: TrainerNode, epoch: int, meta: dict[str, Any]) -> tuple[str, bytes, bytes, int, bytes]:
        """(payload CID, payload digest, trace root, leaf count, salt) as `Chain.reveal` takes them."""
        return (meta["payload_cid"], bytes.fromhex(meta["payload_digest"]), bytes.fromhex(meta["trace_root"]),
                meta["leaf_count"], bytes.fromhex(meta["salt"]))


class TrainerNode:
    def __init__(
        self, chain: Chain, store: Store, run_id: int, workdir: Path, *,
        behaviour: Behaviour | None = None, log: Log | None = None, poll_s: float = 0.25,
        checkpoint_every: int = 4, checkpoint_every_logged: int = 16, threads: int = 1, max_epochs: int | None = None,
        stages: int = 1, microbatches: int = 2, keep_boundaries: bool = True, boundary_log_ram: int | None = None,
        boundary_log_disk: int | None = None, device: str = "cpu", relay: str | None = None,
        window_wait_s: float = 30.0,
    ) -> None:
        if chain.sender is None:
            raise TrainerError("a trainer node needs a signing key")
        self.chain, self.run_id = chain, run_id
        self.store = Metered(store, DEFAULT_READ_CACHE)  # its traffic, logged with each event that moves content (`traffic`)
        self.me = chain.sender
        self.root = Path(workdir)
        self.behaviour = behaviour or Behaviour()
        self.log: Log = log or (lambda event, **kv: None)
        self.poll_s, self.every, self.threads, self.max_epochs = poll_s, max(1, checkpoint_every), threads, max_epochs
        self.every_logged = max(1, checkpoint_every_logged)  # a sharded run's spacing where its answer log holds the steps
        self._last_service = 0.0
        self._last_member_check = 0.0  # while training: when it last read whether it may still commit
        self._short_of_verifiers: set[int] = set()  # epochs whose audit waits for verifiers (said once)
        self.stages, self.microbatches = stages, microbatches
        # trainer/boundaries.py: memory (up to this many bytes), then disk (up to that many), for a cheaper
        # audit answer; past both a challenge replays whole steps
        self.keep_boundaries = keep_boundaries
        self.boundary_log_ram = quarter_of_memory() if boundary_log_ram is None else boundary_log_ram
        self.boundary_log_disk = quarter_of_free_disk(self.root) if boundary_log_disk is None else boundary_log_disk
        # the machine's headroom bounds them too, read at each step: trainers sharing a machine each have
        # their budgets, and together they must not exhaust its memory or fill its disk
        self.log_headroom = (memory_headroom, DiskHeadroom(self.root))
        self.pipeline: PipelineSteps | None = None  # tolerant whole-state audits, stages > 1
        self.engine: Engine | None = None  # sharded runs: where the training state lives
        self.answers = AnswerWorker(threads)  # shard answers built while the next epoch trains
        self.device = resolve_device(device)  # sharded runs only (make_engine); checked against the run in run()
        self._merge_bases: dict[int, MergeBase] = {}  # the merge rule's G_e and S_e of the last two epochs
        # windowed runs (docs/protocol.md §5.4): the relay's URL (None: every window root posted directly)
        # and how long a sent root may wait for an aggregate that holds it before it is posted directly
        self.relay, self.window_wait_s = relay, window_wait_s
        self._bound: int | None = None  # the epoch in training whose window roots it has sent (a promise to commit it)
        self._windows_seen: tuple[int, int] | None = None  # (epoch, block) of the last look at its window posts

    # ------------------------------------------------------------------ main loop

    def run(self) -> None:
        configure_determinism(self.threads, self.device.type)
        self.ctx: RunContext = open_run(self.chain, self.store, self.run_id)
        self.spec = RoundSpec.from_config(self.ctx.config)
        a = self.ctx.config.audit
        check_device(self.device, a.device, a.mode, a.unit, self.run_id)
        check_numerics(self.ctx.config, self.run_id)  # before it joins or stakes: its bits must be its peers'
        if self.spec.shard:
            self.engine = self.behaviour.engine(self)
        elif self.stages > 1:
            if self.ctx.config.audit.mode != "tolerant":
                raise TrainerError(
                    f"--stages {self.stages}: pipelined steps match a verifier's single-process replay only "
                    f"within fp32 tolerance, and run {self.run_id} audits in exact mode; use one stage"
                )
            # torch's pipelining takes about 1 s to import: only a pipelined trainer pays it
            from trainer.stages import PipelineSteps

            self.pipeline = PipelineSteps(self.spec, self.stages, self.microbatches, self.threads)
        try:
            self._run()
        finally:
            self.answers.close()  # before the engine: a worker may be replaying from it
            if self.pipeline is not None:
                self.pipeline.close()
            if self.engine is not None:
                self.engine.close()

    @property
    def shard_checkpoint_every(self) -> int:
        """Checkpoints of a sharded run: at most one per segment (audits start at segment boundaries,
        so a finer spacing buys no shorter replay, only disk: a `small` state is 174 MB)."""
        return max(self.every, self.spec.segment)

    def make_engine(self) -> Engine:
        """The sharded run's state holder: this process (S = 1) or S stage processes."""
        # a windowed run drops its answered windows: a checkpoint at every window start lets it drop up to
        # the oldest pending one (the log then holds about 2 W steps plus the seed's lag, not the epoch)
        W = self.ctx.config.audit.window
        every_logged = min(self.every_logged, W) if W else self.every_logged
        if self.stages == 1:
            return LocalEngine(self.spec, self.shard_checkpoint_every, every_logged=every_logged,
                               keep_boundaries=self.keep_boundaries,
                               log_ram_bytes=self.boundary_log_ram, log_disk_bytes=self.boundary_log_disk,
                               device=self.device, log_headroom=self.log_headroom)
        from trainer.stages import StagedEngine

        return StagedEngine(self.spec, self.shard_checkpoint_every, self.stages, self.threads, self.device.type,
                            every_logged=self.every_logged, keep_boundaries=self.keep_boundaries, log_ram_bytes=self.boundary_log_ram,
                            log_disk_bytes=self.boundary_log_disk, log_headroom=self.log_headroom)

    def inner_step(self, state: State, epoch: int, k: int) -> tuple[State, float]:
        """Inner step k of `epoch` on this trainer's batch: in this process, or across its pipeline stages.

        Under the merge rule, step m first folds in G_e (``merge_base``)."""
        merge = self.merge_base(epoch) if self.spec.merges_at(k, epoch) else None
        if self.pipeline is None:
            return replay_step(state, self.spec, self.ctx.corpus, epoch, self.slot, k, merge=merge)
        state = dict(merged_if_due(state, self.spec, k, epoch, merge))
        return self.pipeline.step(state, epoch_batch(self.spec, self.ctx.corpus, epoch, self.slot, k))

    def merge_base(self, e: int) -> MergeBase:
        """G_e and S_e (or the public offset) for epoch e's merge step in a whole-state run (docs/protocol.md §8)."""
        if e not in self._merge_bases:
            kept = {i: b for i, b in self._merge_bases.items() if i == e - 1}  # e-1's answer may still replay its merge
            g = self.merge_model(e)
            offset = functools.cache(functools.partial(self.merge_offset, e, g)) if self.spec.ef_in_params else None
            self._merge_bases = {**kept, e: MergeBase(g, self._dir(e).load("state-000000"), offset)}
        return self._merge_bases[e]

    def merge_offset(self, e: int, g_e: Params) -> Params:
        """With error feedback in the parameters, what epoch e's merge step adds
        (``dilocox.delay.epoch_merge_offset``): its own e-1 payload is the one it published (e-1 is
        kept while e runs: ``_prune``)."""
        return epoch_merge_offset(
            e, bool(self._dir(e).meta.get("continued")), g_e, lambda i: params_of(self.globals.base(i)),
            lambda: open_publication(self._dir(e - 1).read_bytes("payload.bin"), self.ctx.param_shapes,
                                     run_id=self.run_id, epoch=e - 1, trainer=self.me),
        )

    def merge_model(self, e: int) -> Params:
        """G_e, which epoch e folds in at its merge step.

        It needs epoch e-1 finalized: the node waits for it, answering e-1's audit meanwhile, then
        recomputes G_e itself (public/globals.py), as it does every model it trains on.
        """
        if e >= 1:
            self._wait(lambda: self._phase(e - 1) in TERMINAL, f"epoch {e - 1} to finalize (epoch {e} merges its model)")
        g = self.globals.base(e)
        self.log("merged", epoch=e, step=self.spec.merge_step_in(e), base_epoch=e, base_digest=state_digest(g).hex())
        return params_of(g)

    def _run(self) -> None:
        self.schedule = Schedule(self.chain, self.store, self.ctx, self.spec)
        self.rundir = run_dir(self.chain, self.run_id, self.root, self.log)
        self.globals = VerifiedGlobals(self.chain, self.store, self.ctx, self.rundir / "globals",
                                       log=self.log)
        member = self._join()
        self.slot = member.slot
        epochs = self.ctx.config.schedule.epochs
        if self.max_epochs is not None:
            epochs = min(epochs, member.join_epoch + self.max_epochs)
        if member.leave_epoch is not None:  # it left (`veriloco leave`): it takes part in no epoch from then on
            epochs = min(epochs, member.leave_epoch)
        e = max(member.join_epoch, self.chain.current_epoch(self.run_id))
        while self._dir(e).meta.get("status") in (COMMITTED, REVEALED, RESPONDED, CLOSED):
            e += 1  # resumed after a crash: that epoch is already in the chain's hands
        if (foreign := self._foreign(e, self._dir(e))) is not None:
            raise foreign  # committed from elsewhere: found before this one trains or sends anything
        self.log("started", slot=self.slot, epoch=e, behaviour=self.behaviour.name, stages=self.stages)
        if (short := verifier_shortfall(self.chain.run_info(self.run_id))) is not None:
            self.log("too-few-verifiers", detail=short)
        try:
            while e < epochs and through_outages(functools.partial(self._epoch, e), self.log, f"epoch {e}"):
                e += 1
        except KeyboardInterrupt:  # a requested stop (veriloco.nodes.Stopped): what it promised comes first
            self._keep_promises()
            raise
        through_outages(lambda: self._wait(lambda: not self._pending(), "the last audits to close"), self.log, "closing")
        unrevealed = through_outages(functools.partial(self._unrevealed, member.join_epoch, e), self.log, "closing")
        if unrevealed:  # its slash (no reveal) lands when they are decided: the node's ending says so then
            what = f"epoch(s) {', '.join(map(str, unrevealed))}, committed and never revealed, to be decided"
            through_outages(lambda: self._wait(lambda: not self._undecided(unrevealed), what), self.log, "closing")
        self.log("finished", epochs=e, **self.traffic())

    def _owed(self) -> list[int]:
        """Epochs this trainer committed to and has not yet answered: a reveal or an audit answer it owes."""
        return [e for e in self._pending() if self._dir(e).meta.get("status") in (COMMITTED, REVEALED)]

    def _keep_promises(self) -> None:
        """Before a requested stop, reveal and answer every epoch this trainer committed to: a missed
        one is slashed (issue 46), and a restart may not be ready in time. The epoch being trained is
        dropped uncommitted, which promises nothing, unless it sent window roots of it (a windowed run):
        then it is said, since only a restart that commits it in time escapes the abandonment slash. The
        signal handler has restored the default action, so a second signal ends the process at once."""
        if self._bound is not None:
            try:
                close = self.chain.epoch_times(self.run_id, self._bound).commits_close
            except ChainError:  # an outage: the warning goes out without the time
                close = 0
            close = close if 0 < close < 2**63 else 0  # an epoch nobody opened yet has no close time
            self.log("warning", epoch=self._bound, what="stopped while training a windowed epoch",
                     effect=f"its window roots are posted, so their draws are known: restart this node (the resume "
                            f"command below) and commit epoch {self._bound} before its commits close"
                            + (f" (chain time {close})" if close else "") + ", or it is slashed as abandoned")
        owed = self._owed()
        if not owed:
            return
        self.log("draining", epochs=owed, detail="stopping once what it committed to is revealed and answered; "
                 "a second signal stops at once, and an answer it then misses is slashed")
        through_outages(lambda: self._wait(lambda: not self._owed(), "its promised reveals and answers"), self.log, "draining")

    def _unrevealed(self, first: int, last: int) -> list[int]:
        """The epochs up to `last` this trainer committed to and never revealed (it was down through the
        reveal window, or the reveal was refused). Only the last few: opening epoch e+2 settles epoch e."""
        top = min(last, self.ctx.config.schedule.epochs - 1)
        return [e for e in range(max(first, top - 3), top + 1)
                if self.chain.submission(self.run_id, e, self.me).state == Sub.COMMITTED]

    def _undecided(self, epochs: list[int]) -> list[int]:
        """Those of `epochs` not yet finalized (their slashes applied), confirmed or aborted."""
        return [e for e in epochs if self._phase(e) not in (*TERMINAL, Phase.CONFIRMING)]

    def traffic(self) -> dict[str, int]:
        """Store bytes this process has sent and received so far (veriloco/traffic.py adds them up)."""
        return {"sent_bytes": self.store.sent, "received_bytes": self.store.received}

    def _join(self) -> Any:
        m = self.chain.member(self.run_id, self.me)
        if m.role in (Role.VERIFIER, Role.COORDINATOR):
            who = "the coordinator" if m.role == Role.COORDINATOR else "a verifier"
            raise TrainerError(f"{self.me} is {who} in run {self.run_id}; use another key for the trainer")
        if m.role == Role.NONE:
            check_joinable(self.chain.run_info(self.run_id), self.ctx.config.schedule.epochs, "trainer")
            try:
                self.chain.join_trainer(self.run_id)
            except AlreadyJoined:  # the same key joined from elsewhere meanwhile: a commitment tells them apart
                return self.chain.member(self.run_id, self.me)
            m = self.chain.member(self.run_id, self.me)
            self.log("joined", slot=m.slot, join_epoch=m.join_epoch)
        return m

    def _dir(self, epoch: int) -> EpochDir:
        return EpochDir(self.rundir, epoch)

    def _phase(self, epoch: int) -> Phase:
        return self.chain.epoch_status(self.run_id, epoch).phase

    def _wait(self, ready: Callable[[], bool], what: str, timeout: float | None = None) -> bool:
        """Poll `ready`, answering chain duties meanwhile; False on timeout."""
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        announced = False
        while not ready():
            if deadline is not None and time.monotonic() > deadline:
                return False
            if not announced:
                self.log("waiting", what=what)
                announced = True
            self.service(force=True)
            time.sleep(self.poll_s)
        if announced:  # how long the protocol held this trainer, in its own log
            self.log("waited", what=what, seconds=round(time.monotonic() - start, 1))
        return True

    # ------------------------------------------------------------------ one epoch

    def _epoch(self, e: int) -> bool:
        """Take part in epoch e; False once this trainer may take part in no further epoch."""
        d = self._dir(e)
        if d.meta.get("status") in (None, TRAINING):
            if not self._commit_still_possible(e):
                if (foreign := self._foreign(e, d)) is not None:
                    raise foreign  # closed by this key's commitment from elsewhere: the next start would not match
                self.log("skipped", epoch=e, reason="its commit phase has closed")
                self._close(d)
                return True
            # The schedule and the start state read epochs before e; a slash in them is known once they close.
            end = public_history_end(self.spec.rule, e)
            if end >= 1:
                self._wait(lambda: self._phase(end - 1) in TERMINAL, f"epoch {end - 1} to finalize")
            if self._removed(e):
                return False
            if not self._train(e, d):
                return False
        if d.meta["status"] == CLOSED:
            return True  # refused to build on what it was given (logged)
        if d.meta["status"] in (TRAINED, COMMITTING) and self._removed(e):
            self._close(d)  # slashed (or left) while it trained: the contract would refuse the commit
            return False
        if d.meta["status"] == TRAINED:
            self._publish(e, d)
        if d.meta["status"] == COMMITTING:
            self._commit(e, d)
        # Reveal before the next epoch starts: whether this epoch was revealed decides the next start rule.
        self._wait(lambda: d.meta.get("status") != COMMITTED, f"epoch {e} reveals")
        return True

    def _removed(self, e: int) -> bool:
        """Whether the contract excludes this trainer from epoch e on (it left, or was slashed and removed)."""
        m = self.chain.member(self.run_id, self.me)
        if m.role == Role.TRAINER and (m.leave_epoch is None or e < m.leave_epoch):
            return False
        slashes = [{"epoch": ev.args["epoch"], "reason": SLASH_REASONS.get(int(ev.args["reason"]), str(ev.args["reason"]))}
                   for ev in self.chain.events(["Slashed"], run_id=self.run_id, trainer=self.me)]
        self.log("removed", epoch=e, leave_epoch=m.leave_epoch, slashes=slashes,
                 detail="no part in this or later epochs; answering the audits still owed, then stopping "
                        "(withdraw the stake after the unbonding delay, then join again)")
        return True

    def _commit_still_possible(self, e: int) -> bool:
        ph = self._phase(e)
        return ph is Phase.COMMITTING or (ph is Phase.NOT_STARTED)

    def _base(self, e: int) -> tuple[Params, int, str, EpochDir | None]:
        """The verified global model epoch e builds on, its epoch and digest, and e-1's directory when
        e continues it (docs/protocol.md §8).

        The global model is this node's own recomputation (public/globals.py), not the one the
        coordinator finalized: a wrong aggregate is logged there and never trained on.
        """
        before = max(e if self.spec.rule is StartRule.BLOCKING else e - 1, 0)
        if before >= 1:
            self._wait(lambda: self._phase(before - 1) in TERMINAL, f"epoch {before - 1} to finalize")
        base = self.globals.base(before)
        g, base_digest = params_of(base), state_digest(base).hex()
        prev = self._dir(e - 1) if e >= 1 else None
        if prev is not None:  # the rule depends on whether e-1 was revealed: wait until that is settled
            self._wait(lambda: prev.meta.get("status") != COMMITTED, f"epoch {e - 1} reveals")
        revealed = e >= 1 and self.chain.submission(self.run_id, e - 1, self.me).state >= Sub.REVEALED
        has = prev is not None and (self.engine.has_states(prev) if self.engine else prev.has("state-000000") and prev.has("carried"))
        if revealed and not has:
            self.log("warning", epoch=e, detail="epoch e-1 was revealed but its local states are lost; starting fresh")
        return g, before, base_digest, prev if revealed and has else None

    def _start(self, e: int) -> tuple[State, int, str, bool]:
        """S_e, the epoch whose verified base it builds on, that base's digest, and whether it continues e-1."""
        g, before, base_digest, prev = self._base(e)
        if prev is not None:
            return start_state(self.spec, g, prev.load("state-000000"), prev.load("carried")), before, base_digest, True
        return start_state(self.spec, g, None, None), before, base_digest, False

    def _train(self, e: int, d: EpochDir) -> bool:
        """Train epoch e; a model or state this node cannot use closes the epoch for it instead of the node.
        False when it stopped training because it may not commit e (it left, or was slashed, meanwhile)."""
        try:
            self._train_steps(e, d)
        except (ModelUnavailable, TrainerError) as exc:
            self.log("refused", epoch=e, reason=f"{type(exc).__name__}: {exc}")
            self._close(d)
        except _Removed:
            self._close(d)
            return False
        return True

    def _still_in(self, e: int) -> None:
        """Between steps, every REMOVAL_CHECK_S: raise _Removed once the contract would refuse e's commit
        (`veriloco leave` while it trains, or a slash), so the node stops instead of finishing the epoch."""
        now = time.monotonic()
        if now - self._last_member_check < REMOVAL_CHECK_S:
            return
        self._last_member_check = now
        if through_outages(functools.partial(self._removed, e), self.log, f"epoch {e}"):
            raise _Removed(e)

    def _train_steps(self, e: int, d: EpochDir) -> None:
        if self.engine is not None:
            return self._train_shards(e, d, self.engine)
        meta = d.meta
        rank, steps = self.schedule.for_epoch(e)
        ckpts = d.checkpoints()
        if meta.get("status") == TRAINING and ckpts and "digests" in meta:
            k0 = max(c for c in ckpts if c < len(meta["digests"]))
            state = d.load(f"state-{k0:06d}")
            digests = [bytes.fromhex(x) for x in meta["digests"][: k0 + 1]]
            losses = list(meta.get("losses", []))[:k0]
            self.log("resumed", epoch=e, step=k0)
        else:
            state, base_epoch, base_digest, continued = self._start(e)
            k0, digests, losses = 0, [state_digest(state)], []
            d.save_step(0, state)
            meta = d.update(status=TRAINING, rank=rank, steps=steps, base_epoch=base_epoch, base_digest=base_digest,
                            continued=continued,
                            digests=[x.hex() for x in digests], losses=[])
        t0 = time.monotonic()
        compute_s = digest_s = 0.0
        step_wall_s = 0.0  # wall seconds inside steps and their commitments; the rest of a trainer's time is the protocol's
        for k in range(k0, steps):
            w, t = time.monotonic(), time.process_time()  # CPU seconds: what the work costs, not how long the machine was shared
            state, loss = self.behaviour.step(self, state, e, k)
            t_step = time.process_time()
            digests.append(state_digest(state))
            compute_s += t_step - t
            digest_s += time.process_time() - t_step
            step_wall_s += time.monotonic() - w
            losses.append(loss)
            if (k + 1) % self.every == 0 or k + 1 == steps:
                d.save_step(k + 1, state)
                d.update(digests=[x.hex() for x in digests], losses=losses)
            self.log("step", epoch=e, step=k + 1, of=steps, loss=round(loss, 4))
            self.service()
            self._still_in(e)
        start = d.load("state-000000")
        merged = self.merge_base(e).global_params if self.spec.rule is StartRule.MERGE else None
        final = final_transition(start, state, self.spec, self.run_id, e, self.slot, self.me, rank, merged)
        d.save("carried", final.carried)
        d.write_bytes("payload.bin", self.behaviour.publication(self, final, e))
        d.update(status=TRAINED, digests=[x.hex() for x in digests], losses=losses)
        self.log("trained", epoch=e, steps=steps, rank=rank, loss=round(sum(losses[-4:]) / max(1, len(losses[-4:])), 4),
                 seconds=round(time.monotonic() - t0, 2), compute_s=round(compute_s, 3), digest_s=round(digest_s, 3),
                 step_wall_s=round(step_wall_s, 3),
                 payload_bytes=final.stats.payload_bytes, dense_bytes=final.stats.dense_bytes,
                 base_epoch=meta.get("base_epoch"), base_digest=meta.get("base_digest"), **self.traffic())

    def _train_shards(self, e: int, d: EpochDir, eng: Engine) -> None:
        """A sharded epoch: the engine trains and keeps the state; the node keeps the leaves' preimages
        (checkpointed with them, so a killed node resumes at its last checkpoint)."""
        meta = d.meta
        rank, steps = self.schedule.for_epoch(e)
        if meta.get("status") == TRAINING and "leaves" in meta:
            preimages = [bytes.fromhex(x) for x in meta["leaves"]]
            k0, losses = len(preimages) - 1, list(meta.get("losses", []))[: len(preimages) - 1]
            eng.resume(d, steps, k0)
            self.log("resumed", epoch=e, step=k0)
        else:
            g, base_epoch, base_digest, prev = self._base(e)
            preimages, k0, losses = [eng.begin(d, steps, g, prev).encode()], 0, []
            meta = d.update(status=TRAINING, rank=rank, steps=steps, base_epoch=base_epoch, base_digest=base_digest,
                            continued=prev is not None, leaves=[x.hex() for x in preimages],
                            digests=[keccak(x).hex() for x in preimages], losses=[])
        sender = self._window_sender(e, preimages, steps + 1)
        t0, before, step_wall_s = time.monotonic(), dict(eng.timings), 0.0
        for k in range(k0, steps):
            if self.spec.merges_at(k, e):
                g = self.merge_model(e)
                eng.merge(d, g, self.merge_offset(e, g) if self.spec.ef_in_params else None)
            w = time.monotonic()  # wall seconds inside steps; the rest of a trainer's time is the protocol's
            loss, leaf = eng.step(d, k, epoch_batch(self.spec, self.ctx.corpus, e, self.slot, k))
            step_wall_s += time.monotonic() - w
            preimages.append(leaf.encode())
            losses.append(loss)
            if sender is not None:
                self._send_windows(sender, preimages, steps + 1)
                self._answer_windows(e, d, eng, sender, preimages, steps + 1)
            if eng.checkpoints.last == k + 1:  # the leaves a restart from that checkpoint resumes with
                d.update(leaves=[x.hex() for x in preimages], digests=[keccak(x).hex() for x in preimages], losses=losses)
            self.log("step", epoch=e, step=k + 1, of=steps, loss=round(loss, 4))
            self.service()
            self._still_in(e)
        if sender is not None:  # every window's root fixed on chain before the commit (and so before the reveal)
            self._wait(lambda: len(sender.settle()) == len(sender.sent), f"epoch {e}'s window roots to be posted")
            self._answer_windows(e, d, eng, sender, preimages, steps + 1)
        if eng.log_error:
            self.log("warning", epoch=e, what="boundary log", error=eng.log_error,
                     effect="audit answers of the steps it misses replay whole steps")
            eng.log_error = None
        if eng.checkpoints.error:
            self.log("warning", epoch=e, what="checkpoint", error=eng.checkpoints.error,
                     effect="audit answers and a restart replay from the checkpoint before it (free disk space)")
            eng.checkpoints.error = None
        log_bytes, unlogged = eng.boundary_log_bytes(d), eng.unlogged_steps(d)
        if unlogged:  # expected at large batches: said, not warned
            self.log("boundary-log-full", epoch=e, unlogged_steps=unlogged, of=steps, ram_budget=self.boundary_log_ram,
                     disk_budget=self.boundary_log_disk, effect="audit answers over those steps replay whole steps "
                     "(--boundary-log-ram, --boundary-log-disk raise the budgets; a log also stops short of leaving this "
                     "machine less than a quarter of its memory available or a tenth of its disk free)")
        replay = worst_replay(steps, d.checkpoints()) if unlogged or eng.log_kind(d) is None else 0
        need_s = replay * step_wall_s / max(1, steps - k0)
        window = self.ctx.info.params.response_window
        if need_s > ANSWER_SHARE * window:  # it could not answer in time: say so and stake nothing on it
            self.log("warning", epoch=e, what="answer at risk", replay_steps=replay, replay_s=round(need_s, 1),
                     response_window_s=window, effect="this epoch is not committed (an answer past the window is "
                     "slashed): free disk for checkpoints, raise --boundary-log-ram/--boundary-log-disk or lower "
                     "--checkpoint-every")
            self.log("skipped", epoch=e, reason=f"an audit answer could replay {replay} steps (~{need_s:.0f} s), over "
                     f"half the {window} s response window")
            self._close(d)
            return
        # what answering keeps beside the live state, at its peak: at the end of the epoch, unless a windowed
        # run dropped answered windows while it trained (then the peak it recorded then)
        held_peak = max(d.meta.get("answer_held_peak_bytes", 0), d.held_bytes() + sum(eng.boundary_log_bytes(d)))
        payload, stats = eng.finish(d, rank, compress_seed(self.spec.run_seed, e, self.slot))
        final = Final(wrap(self.run_id, e, self.me, payload), {}, stats)
        d.write_bytes("payload.bin", self.behaviour.publication(self, final, e))
        d.update(status=TRAINED, losses=losses)
        spent = {k: round(v - before.get(k, 0.0), 3) for k, v in eng.timings.items()}
        self.log("trained", epoch=e, steps=steps, rank=rank, loss=round(sum(losses[-4:]) / max(1, len(losses[-4:])), 4),
                 seconds=round(time.monotonic() - t0, 2), compute_s=spent.get("compute_s", 0.0),
                 digest_s=spent.get("commit_s", 0.0), log_s=spent.get("log_s", 0.0),
                 checkpoint_s=spent.get("checkpoint_s", 0.0),
                 boundary_log_bytes=sum(log_bytes), boundary_log_ram_bytes=log_bytes[0], boundary_log_unlogged_steps=unlogged,
                 answer_held_peak_bytes=held_peak,
                 answer_log=eng.log_kind(d),
                 step_wall_s=round(step_wall_s, 3),
                 payload_bytes=stats.payload_bytes, dense_bytes=stats.dense_bytes,
                 base_epoch=meta.get("base_epoch"), base_digest=meta.get("base_digest"), **self.traffic())

    def _window_sender(self, e: int, preimages: list[bytes], leaf_count: int) -> WindowSender | None:
        """A windowed run's sender for epoch e; after a restart it picks up what the chain holds already."""
        W = self.ctx.config.audit.window
        if not W:
            return None
        key = getattr(self.chain.account, "key", None)  # an account the chain node signs for has none here
        sender = WindowSender(self.chain, key, domain_of(self.chain, self.run_id, e), self.slot,
                              self.ctx.info.params.coordinator, self.store,
                              RelayClient(self.relay) if self.relay else None, wait_s=self.window_wait_s, log=self.log)
        digests, trained = [keccak(p) for p in preimages], windows.Retention(W, leaf_count, len(preimages) - 1)
        done = [w for w in range(windows.window_count(leaf_count, W)) if trained.complete(w)]
        if done:
            sender.resume({w: windows.window_root(digests, w, W, leaf_count) for w in done})
            self._bound = e  # a restart mid-epoch: the roots it sent before still bind it
        return sender

    def _send_windows(self, sender: WindowSender, preimages: list[bytes], leaf_count: int) -> None:
        """Send each window whose leaves are all trained (once: its root is fixed from then on)."""
        W, w = self.ctx.config.audit.window, len(sender.sent)
        if w < windows.window_count(leaf_count, W) and windows.Retention(W, leaf_count, len(preimages) - 1).complete(w):
            if self._phase(sender.domain.epoch) not in (Phase.NOT_STARTED, Phase.COMMITTING):
                return  # too late to commit it: a root sent now would only promise what it cannot keep
            self._bound = sender.domain.epoch
            sender.send(w, windows.window_root([keccak(p) for p in preimages], w, W, leaf_count))

    def _answer_windows(self, e: int, d: EpochDir, eng: Engine, sender: WindowSender, preimages: list[bytes],
                        leaf_count: int) -> None:
        """Retention (docs/protocol.md §5.4): answer each window's draws, in window order, once a post fixed
        its root and its seed is `audit.window_depth` blocks deep, publish the answers, and drop every
        checkpoint and logged step that only answered draws needed. A window with no safe seed yet (or
        never posted) stops the walk: from its first transition on everything stays, as a post-hoc draw
        needs. A segment whose last step belongs to the next window (segments longer than one step) waits
        for that window's seed, which picks that step's group. Answers and seeds are in the epoch's meta,
        so a restarted node never needs what it dropped."""
        head = self.chain.block_number()
        if self._windows_seen == (e, head):
            return  # no block since the last look: no new post, no seed deeper (the event query is skipped)
        self._windows_seen = (e, head)
        a, meta = self.ctx.config.audit, d.meta
        W, n, L, r = a.window, block_count(self.spec.model), leaf_count, self.spec.segment
        seeds: dict[int, bytes] = {int(w): bytes.fromhex(x) for w, x in meta.get("window_seeds", {}).items()}
        built: dict[str, Any] = dict(meta.get("prebuilt", {}))
        todo: list[list[int]] = [list(c) for c in meta.get("window_todo", [])]  # [start, end, block, window]
        sender.settle()
        src = ChainOrdering(sender.domain, lambda w: sender.fixed[w].block if w in sender.fixed else None,
                            self.chain.block_hash, self.chain.block_number, a.window_depth)
        count, changed = windows.window_count(L, W), False
        while len(seeds) < count and (seed := src.seed(len(seeds))) is not None:
            w = len(seeds)
            seeds[w], changed = bytes(seed), True
            draws = window_challenges(seed, self.me, self.ctx.info.params.audit_rate, W, w, L)
            todo += [[s_, e_, b, w] for s_, e_, b in shard_audit.shard_challenges(
                seed, self.me, draws, L, r, n, lambda k: seed)]  # a draw's block comes from its own window's seed
            self.log("window-drawn", epoch=e, window=w, transitions=draws)

        def seed_of(k: int) -> bytes:
            return seeds[windows.transition_window(k, W)]

        for c in [c for c in todo if windows.transition_window(c[1] - 1, W) in seeds]:
            s_, e_, b, w = c
            if f"{s_}:{e_}:{b}" not in built:
                cid, openings = answer_challenge(
                    eng, self.spec, e, self.me, d, preimages, seeds[w], seed_of,
                    lambda k: epoch_batch(self.spec, self.ctx.corpus, e, self.slot, k),
                    lambda data: self.store.put(data), s_, e_, b)
                built[f"{s_}:{e_}:{b}"] = {"cid": cid, "openings": to_json_value(openings)}
            todo.remove(c)
            changed = True
        if changed:
            d.update(window_seeds={str(k): v.hex() for k, v in seeds.items()}, prebuilt=built, window_todo=todo)
        kept = windows.Retention(W, L, len(preimages) - 1, set(seeds)).checkpoint(r)  # the oldest window not drawn
        eng.drop_before(d, min([kept] + [c[0] for c in todo]))
        held = d.held_bytes() + sum(eng.boundary_log_bytes(d))
        if held > meta.get("answer_held_peak_bytes", 0):
            d.update(answer_held_peak_bytes=held)

    def _prebuilt(self, d: EpochDir) -> dict[tuple[int, int, int], Answer]:
        """The answers a windowed trainer built while it trained (`_answer_windows`)."""
        out = {}
        for key, v in d.meta.get("prebuilt", {}).items():
            s_, e_, b = (int(x) for x in key.split(":"))
            out[(s_, e_, b)] = (Cid(v["cid"]), from_json_value(tuple[GroupOpening, ...], v["openings"]))
        return out

    def _publish(self, e: int, d: EpochDir) -> None:
        pub = d.read_bytes("payload.bin")
        cid = self.store.put(pub)
        self.store.pin(cid)
        digests = [bytes.fromhex(x) for x in d.meta["digests"]]
        d.update(status=COMMITTING, payload_cid=cid, payload_digest=keccak(pub).hex(),
                 trace_root=merkle.root(digests).hex(), leaf_count=len(digests), salt=os.urandom(32).hex())

    def _foreign(self, e: int, d: EpochDir) -> TrainerError | None:
        """None when the chain's submission of epoch e for this key is this folder's (or there is none);
        else the error to stop on: another instance sent it (the same key on another machine, or from
        another folder past the per-user lock), or this folder lost the record of it. Judged by the
        commitment this folder sent (kept before sending): against the chain's while committed, against
        the Committed event once revealed (the trace root alone is the same for every instance of a key)."""
        sub = self.chain.submission(self.run_id, e, self.me)
        if sub.state == Sub.NONE:
            return None
        m = d.meta
        sent = m.get("commitment") or (  # a folder from before the commitment was kept: recomputed from its record
            self.behaviour.commitment(self, e, m).hex() if m.get("status") in (COMMITTING, COMMITTED, REVEALED, RESPONDED)
            and "salt" in m else None)
        if sent is not None and sub.state == Sub.COMMITTED and sent == bytes(sub.commitment).hex():
            return None
        # once revealed, the chain holds the trace root, which another instance with this key computes alike
        # (same slot, data and start): only the salted commitment, kept in the Committed event, tells them apart
        if (sent is not None and sub.state >= Sub.REVEALED and m.get("trace_root") == bytes(sub.trace_root).hex()
                and any(bytes(ev.args["commitment"]).hex() == sent
                        for ev in self.chain.events(["Committed"], run_id=self.run_id, epoch=e, trainer=self.me))):
            return None
        return TrainerError(
            f"the chain holds a commitment of {self.me} for epoch {e} of run {self.run_id} that this state folder "
            f"({self.rundir}) did not send: another instance runs with this key (on another machine, or from another "
            "--workdir), or this folder lost its record. Stopped before sending anything: stop the other instance "
            "(two answer one audit, and one of them is slashed), or restart it from its own folder")

    def _commit(self, e: int, d: EpochDir) -> None:
        if self.chain.submission(self.run_id, e, self.me).state >= Sub.COMMITTED:
            if (foreign := self._foreign(e, d)) is not None:
                raise foreign
            d.update(status=COMMITTED)  # the commit landed before a crash
            return
        if self.behaviour.walks_away(self, e):
            self.log("walked-away", epoch=e, windows_sent=self._bound == e)
            self._close(d)
            return

        def can_commit() -> bool:
            ph = self._phase(e)
            if ph is Phase.COMMITTING:
                return True
            if ph is not Phase.NOT_STARTED:
                return True  # too late; handled below
            return e == 0 or self._phase(e - 1) not in (Phase.NOT_STARTED, Phase.COMMITTING, Phase.REVEALING)

        m = d.meta
        while True:  # a transaction that failed without the contract refusing it is retried while the phase is open
            self._wait(can_commit, f"epoch {e} to accept commitments")
            if self._phase(e) not in (Phase.COMMITTING, Phase.NOT_STARTED):
                if (foreign := self._foreign(e, d)) is not None:
                    raise foreign  # closed by this key's commitment from elsewhere, not by time
                self.log("skipped", epoch=e, reason="commit phase closed before we could commit" + (
                    "; its window roots were posted, so it is slashed as abandoned (docs/protocol.md §5.4): "
                    "a commit window shorter than this trainer's epoch is a setting to raise" if self._bound == e else ""))
                self._close(d)
                return
            commitment = self.behaviour.commitment(self, e, m)
            m = d.update(commitment=commitment.hex())  # kept before it is sent: a restart knows its own on chain
            tx = self._send("commit", d, lambda c=commitment: self.chain.commit(self.run_id, e, c))  # type: ignore[misc]
            if tx is not None or d.meta["status"] in (CLOSED, COMMITTED):
                break
            time.sleep(self.poll_s)
        if tx is None:
            return
        d.update(status=COMMITTED, gas_commit=tx.gas_used)
        self._bound = None
        self.log("committed", epoch=e, payload_cid=m["payload_cid"], gas=tx.gas_used, **self.traffic())

    def _send(self, what: str, d: EpochDir, send: Callable[[], TxResult]) -> TxResult | None:
        """Send a commit or reveal (None if it did not land). Only the contract's own refusal (a named
        error) closes the epoch; a transaction that failed otherwise (out of gas, dropped, a revert
        without a reason) leaves it open for the caller to retry while the phase lasts, and an
        outage propagates so the caller waits it out (the chain is re-checked first, so nothing is
        sent twice)."""
        try:
            return send()
        except ChainUnavailable:
            raise
        except ContractRevert as exc:
            if what == "commit" and (foreign := self._foreign(d.epoch, d)) is not None:
                # the same key committed elsewhere first (refused AlreadyCommitted, or WrongPhase when that
                # commitment closed the phase): stop before anything else
                raise foreign from None
            if what == "commit" and isinstance(exc, AlreadyCommitted):
                d.update(status=COMMITTED)  # its own commit, sent before and mined after all
                return None
            if isinstance(exc, NotEligible) and what == "commit":  # it left (or was removed): expected, not an error
                self.log("commit-skipped", epoch=d.epoch, detail=f"this key may no longer commit in the run: {exc}")
            else:
                self.log(f"{what}-failed", epoch=d.epoch, error=str(exc))
            self._close(d)
            return None
        except ChainError as exc:
            self.log(f"{what}-retry", epoch=d.epoch, error=str(exc))
            return None

    # ------------------------------------------------------------------ duties while training

    def _pending(self) -> list[int]:
        out = []
        for p in sorted(self.rundir.glob("epoch-*")):
            e = int(p.name.split("-")[1])
            if self._dir(e).meta.get("status") in (COMMITTED, REVEALED, RESPONDED):
                out.append(e)
        return out

    def service(self, force: bool = False) -> None:
        """Reveal, respond to audits and close epochs whose time has come (rate-limited)."""
        now = time.monotonic()
        if not force and now - self._last_service < self.poll_s:
            return
        self._last_service = now
        for e in self._pending():
            try:
                self._service_epoch(e)
            except TRANSIENT:
                raise  # the caller waits the outage out
            except TooFewVerifiers as exc:  # the run lacks verifiers: the audit waits (or aborts unslashed); said once
                if e not in self._short_of_verifiers:
                    self._short_of_verifiers.add(e)
                    self.log("too-few-verifiers", epoch=e, detail=str(exc))
            except (VerilocoError, OSError) as exc:
                self.log("error", epoch=e, error=f"{type(exc).__name__}: {exc}")

    def _service_epoch(self, e: int) -> None:
        d = self._dir(e)
        status = d.meta["status"]
        ph = self._phase(e)
        if status == COMMITTED:
            if self.chain.submission(self.run_id, e, self.me).state >= Sub.REVEALED:
                d.update(status=REVEALED)  # the reveal landed before a crash: the audit still needs an answer
            elif ph is Phase.REVEALING:
                args = self.behaviour.reveal(self, e, d.meta)
                tx = self._send("reveal", d, lambda: self.chain.reveal(self.run_id, e, *args))
                if tx is None:
                    return
                self.log("revealed", epoch=e, gas=tx.gas_used)
                d.update(status=REVEALED)
            elif ph not in (Phase.COMMITTING, Phase.NOT_STARTED):
                self._close(d)
        elif status == REVEALED:
            if ph is Phase.AUDITING:
                self._respond(e, d)
            elif ph in TERMINAL:
                self._close(d)
        elif status == RESPONDED and ph in TERMINAL:
            self._close(d)
            self._prune(e)

    def _respond(self, e: int, d: EpochDir) -> None:
        sub = self.chain.submission(self.run_id, e, self.me)
        if sub.state >= Sub.RESPONDED:
            d.update(status=RESPONDED)
            return
        if self.answers.busy(e):  # its answer is being built beside training
            return self._collect_answer(e, d)
        seed = self.chain.fix_audit_seed(self.run_id, e)
        if seed is None:
            return  # the seed block is not past yet: the next service round answers
        params = self.ctx.info.params
        digests = [bytes.fromhex(x) for x in d.meta["digests"]]
        response = build_response(digests, seed, self.me, params.audit_steps, params.final_check_bps, params.audit_rate)
        a = self.chain.assignment(self.run_id, e, self.me)
        if self.engine is not None:
            steps, seed_of = a.transitions, None
            if W := self.ctx.config.audit.window:
                try:
                    wa = chain_windows(self.chain, self.store, run_id=self.run_id, epoch=e, trainer=self.me,
                                       slot=self.slot, claimed=windows.window_roots(digests, W),
                                       trace_root=merkle.root(digests), leaf_count=len(digests), W=W,
                                       depth=self.ctx.config.audit.window_depth)
                except SeedsPending:
                    return  # a few blocks more: the next service round answers
                if wa.findings:
                    raise TrainerError(f"epoch {e}'s window posts do not match this node's trace: {wa.findings[0]}")
                steps, seed_of = tuple(wa.drawn), functools.partial(wa.seed_of, W=W)
            return self._respond_shards(e, d, seed, steps, response, self.engine, seed_of)
        cids: dict[int, Cid] = {}

        published = [0]

        def cid_of(directory: EpochDir, k: int) -> Cid:
            state = directory.state_at(k, lambda st, j: self.behaviour.step(self, st, directory.epoch, j))
            data = save_state(state)
            published[0] += len(data)
            return self.store.put(data)

        # Every audit checks the start state (docs/protocol.md §8): a start that continued e-1 publishes
        # e-1's first and last states; a fresh one publishes none and is checked against G alone.
        prev = self._dir(e - 1) if e >= 1 else None
        use_prev = bool(d.meta.get("continued")) and prev is not None and "digests" in prev.meta
        manifest = build_state_manifest(
            run_id=self.run_id, epoch=e, trainer=self.me, trace=digests, transitions=a.transitions, final=a.final_check,
            cid_of_leaf=lambda k: cids.setdefault(k, cid_of(d, k)),
            previous_trace=[bytes.fromhex(x) for x in prev.meta["digests"]] if use_prev and prev else (),
            previous_cid_of_leaf=(lambda k: cid_of(prev, k)) if use_prev and prev else None,
            segment=self.ctx.config.audit.segment, publish_ends=self.ctx.config.audit.mode == "tolerant",
        )
        encoded = encode_manifest(manifest)
        mcid = self.store.put(encoded)
        tx = self.chain.respond(self.run_id, e, mcid, response)
        d.update(status=RESPONDED, manifest_cid=mcid, gas_respond=tx.gas_used)
        self.log("responded", epoch=e, transitions=list(a.transitions), final=a.final_check, manifest=mcid, gas=tx.gas_used,
                 audit_bytes=published[0] + len(encoded), **self.traffic())

    def _answers_beside_training(self, eng: Engine) -> bool:
        """Whether audit answers are built on the worker thread: the engine allows it and the steps run
        on one thread, so each thread's CPU time is its own (trainer/engine.py ``own_cpu``)."""
        return eng.concurrent_audits and self.threads == 1

    def _respond_shards(self, e: int, d: EpochDir, seed: bytes, steps: tuple[int, ...], response: Any, eng: Engine,
                        seed_of: SeedOf | None = None) -> None:
        """Answer a shard audit (docs/protocol.md §5.3): one block per drawn segment, final and start check.

        Building the answer replays each drawn segment; where the engine allows, that runs on the
        answer worker while the next epoch trains (trainer/answering.py), and a later service round
        publishes it. Otherwise, and whenever half the response window is gone, the node waits for it.
        """
        make = functools.partial(self._shard_answer, e, d, seed, steps, eng, seed_of)
        if not self._answers_beside_training(eng):
            before = eng.timings.get("answer_cpu_s", 0.0)  # an engine whose answers run in other processes (stages)
            built = build(make, d.path, background=False)
            extra = eng.timings.get("answer_cpu_s", 0.0) - before  # counts their CPU, which this clock cannot see
            return self._send_answer(e, d, steps, response, dataclasses.replace(built, cpu_s=built.cpu_s + extra))
        deadline = self.chain.epoch_times(self.run_id, e).response_deadline
        self.answers.start(e, make, d.path, window_s=deadline - self.chain.now(), context=(steps, response))
        self.log("answering", epoch=e, transitions=list(steps), beside_training=True)

    def _collect_answer(self, e: int, d: EpochDir) -> None:
        """Send epoch e's answer once the worker has built it (waiting for it past half the window)."""
        waiting = not self.answers.ready(e)
        if waiting:
            if not self.answers.must_wait(e):
                return
            what, t0 = f"epoch {e}'s audit answer (half its response window has passed)", time.monotonic()
            self.log("waiting", what=what)
        built, (steps, response) = self.answers.take(e)
        if waiting:
            self.log("waited", what=what, seconds=round(time.monotonic() - t0, 1))
        self._send_answer(e, d, steps, response, built)

    def _shard_answer(self, e: int, d: EpochDir, seed: bytes, steps: tuple[int, ...], eng: Engine,
                      seed_of: SeedOf | None, publish: FileSink) -> shard_audit.ShardManifest:
        prev = self._dir(e - 1) if e >= 1 else None
        cont = bool(d.meta.get("continued")) and prev is not None and "leaves" in prev.meta
        return shard_response(
            engine=eng, spec=self.spec, run_id=self.run_id, epoch=e, trainer=self.me, d=d,
            preimages=[bytes.fromhex(x) for x in d.meta["leaves"]], seed=seed, steps=steps,
            final_bps=self.ctx.info.params.final_check_bps,
            batch_of=lambda k: epoch_batch(self.spec, self.ctx.corpus, e, self.slot, k), publish=publish,
            prev=prev if cont else None,
            prev_preimages=[bytes.fromhex(x) for x in prev.meta["leaves"]] if cont and prev else (),
            window=self.ctx.config.audit.window, seed_of=seed_of, prebuilt=self._prebuilt(d),
        )

    def _send_answer(self, e: int, d: EpochDir, steps: tuple[int, ...], response: Any, built: Built) -> None:
        """Publish a built answer's files, then its manifest, then the on-chain response."""
        file_bytes = built.file_bytes
        for path, cid in built.files:
            got = self.store.put_file(path)
            if got != cid:
                raise IntegrityError(f"{self.store.where} named audit file {path.name} {got}, its bytes hash to {cid}")
            path.unlink(missing_ok=True)
        m = built.manifest
        encoded = shard_audit.encode_manifest(m, block_count(self.spec.model))
        mcid = self.store.put(encoded)
        tx = self.chain.respond(self.run_id, e, mcid, response)
        d.update(status=RESPONDED, manifest_cid=mcid, gas_respond=tx.gas_used)
        if self.engine is not None:
            self.engine.forget_boundaries(d)
        self.log("responded", epoch=e, transitions=list(steps), final=m.final.block >= 0, manifest=mcid, gas=tx.gas_used,
                 blocks=[c.block for c in m.challenges], audit_bytes=file_bytes + len(encoded),
                 answer_s=round(built.seconds, 3), answer_cpu_s=round(built.cpu_s, 3),
                 beside_training=built.background, **self.traffic())
        if self.engine is not None and self.engine.log_error:  # the answer's own log trouble, if training has not said it
            self.log("warning", epoch=e, what="boundary log", error=self.engine.log_error,
                     effect="this answer replayed whole steps where the log failed it (slower, the same bytes)")
            self.engine.log_error = None

    def _close(self, d: EpochDir) -> None:
        """The epoch is over for this trainer: drop what it kept only to answer its audit (the log and
        the checkpoints between its first and last state)."""
        d.update(status=CLOSED)
        self.answers.forget(d.epoch)
        if self.engine is not None:
            self.engine.forget_boundaries(d)
        d.drop_between()

    def _prune(self, e: int) -> None:
        """Keep the last two epochs (the next start-rule check needs e-1); drop older checkpoints."""
        for p in self.rundir.glob("epoch-*"):
            old = int(p.name.split("-")[1])
            if old < e - 1 and self._dir(old).meta.get("status") == CLOSED:
                self._dir(old).remove()
