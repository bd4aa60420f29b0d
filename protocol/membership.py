"""Whether a run can still take a new member: checked before a node stakes, so nobody locks a stake for nothing.

The contract takes a stake into any run that is not full, even one whose last epoch has opened (the
newcomer's first epoch would be one the run never has). The number of epochs lives in the run's
config, so this check belongs to the nodes that read it.
"""

from __future__ import annotations

import time

from protocol.chain.binding import EpochStatus, EpochTimes, Phase, Role, RunInfo
from protocol.errors import VerilocoError

ROLE_NAMES = {0: "none", 1: "trainer", 2: "verifier", 3: "coordinator"}


class NotJoinable(VerilocoError):
    """The run is finished or full: joining would stake for nothing."""


def check_joinable(info: RunInfo, epochs: int, role: str) -> None:
    """Raise NotJoinable unless an account joining now as `role` ("trainer"/"verifier") would take part."""
    rid = info.run_id
    if info.next_epoch >= epochs:
        raise NotJoinable(
            f"run {rid} has no epoch left to join: all {epochs} of its epochs have opened "
            f"(a {role} joining now would start at epoch {info.next_epoch}); nothing was staked. "
            "Pick another run (`veriloco runs`)"
        )
    if role == "trainer" and info.active_trainers >= info.params.max_trainers:
        raise NotJoinable(f"run {rid} is full: {info.active_trainers} of {info.params.max_trainers} trainer places "
                          "are taken; nothing was staked. Try again when a trainer leaves, or pick another run")
    if role == "verifier" and info.verifier_count >= info.params.max_verifiers:
        raise NotJoinable(f"run {rid} is full: {info.verifier_count} of {info.params.max_verifiers} verifier places "
                          "are taken; nothing was staked. Pick another run (`veriloco runs`)")


def check_test_run(info: RunInfo, role: int, allowed: bool) -> None:
    """Raise NotJoinable before a key stakes into a test run (``testRun``: a quorum of 1 or 2, the
    availability challenge's bounds relaxed) unless ``allowed``: there one or two verdicts decide, and
    a creator holding those keys decides them. A member already in the run (``role`` non-zero) goes on."""
    p = info.params
    if not p.test_run or role != Role.NONE or allowed:
        return
    raise NotJoinable(
        f"run {info.run_id} is a test run: quorum {p.quorum} (a majority of {p.quorum} verdict(s) decides, and its "
        f"creator may hold those keys), {p.max_verifiers} verifier place(s), {p.slash_bps / 100:g}% of a stake slashed "
        "per offence; nothing was staked. Join it only on a devnet or among keys you trust: pass --allow-test-run")


def verifier_shortfall(info: RunInfo) -> str | None:
    """What a run lacking a quorum of verifiers means, or None when it has one: no epoch is audited
    (the contract refuses to start an audit with fewer verifiers than the quorum), so each epoch
    aborts unaudited at its deadline, nobody slashed, until enough verifiers join."""
    have, q = info.verifier_count, info.params.quorum
    if have >= q:
        return None
    return (f"run {info.run_id} has {have} verifier(s) of its quorum {q}: no epoch is audited, and each aborts "
            f"unaudited at its deadline, until {q - have} more join (`veriloco verifier --run {info.run_id}`)")


def no_spare_verifier(info: RunInfo) -> str | None:
    """A warning while a run has exactly its quorum of verifiers, or None: it audits now, but one verifier
    leaving, or removed for a silent or outvoted verdict, leaves fewer than the quorum, and from the next
    scheduling every epoch aborts unaudited until another joins (issue 46, item 6). Not said of a test run
    (a devnet's or a test's, where a single verifier is the point)."""
    have, q = info.verifier_count, info.params.quorum
    if have != q or info.params.max_verifiers <= q or info.params.test_run:
        return None
    return (f"run {info.run_id} has no spare verifier ({have}, its quorum): one leaving or removed stops every "
            f"audit until another joins; a spare costs one more `veriloco verifier --run {info.run_id}`")


def no_availability_committee(info: RunInfo) -> str | None:
    """A warning while a run audits but cannot judge a withheld payload, or None: a report's committee is q
    verifiers outside the trainer's q and the reporter (docs/protocol.md §10.2), so below 2q verifiers
    (2q + 1 when a verifier reports) the contract refuses every report, and a trainer that passes and then
    withholds its payload makes its epoch abort at the finalize deadline, nobody slashed (issue 46, item 5).
    Not said of a test run, nor below the quorum (nothing is audited then: `verifier_shortfall`)."""
    have, q = info.verifier_count, info.params.quorum
    if have < q or have >= 2 * q + 1 or info.params.test_run:
        return None
    return (f"run {info.run_id} cannot judge a withheld payload ({have} verifier(s); a report's committee needs "
            f"{2 * q + 1}): a passing trainer that withholds its payload makes its epoch abort, nobody slashed; "
            f"{2 * q + 1 - have} more `veriloco verifier --run {info.run_id}` make it reportable")


def trainer_shortfall(info: RunInfo) -> str | None:
    """What a run with no active trainer means once it has begun, or None: nobody can commit, so no
    epoch opens (and a waiting coordinator waits for good) until a trainer joins."""
    if info.active_trainers > 0 or info.next_epoch == 0:
        return None
    return (f"run {info.run_id} has no active trainer (every one left or was slashed): no epoch can open until one "
            f"joins (`veriloco trainer --run {info.run_id}`)")


def silent_coordinator(info: RunInfo, epoch: int, status: EpochStatus, times: EpochTimes, now: int) -> str | None:
    """What it means when nobody finalized `epoch` in time, or None: still Auditing after the coordinator's
    half of the finalize window (any staked member may finalize until the deadline; a verifier node does),
    or Aborted with no model although its audit ran (nobody finalized by the deadline: no new model).

    `now` is chain time. The finalize window is the contract's: docs/contract.md, "Missing coordinator".
    """
    rid, who = info.run_id, info.params.coordinator
    act = (f"start a verifier node, which finalizes in the coordinator's place (`veriloco verifier --run {rid}`), "
           f"or the coordinator itself (`veriloco coordinator --run {rid}` with its key)")
    if status.phase is Phase.AUDITING:
        opened = times.finalize_deadline - info.params.finalize_window // 2
        if now < opened:
            return None
        until = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(times.finalize_deadline))
        return (f"epoch {epoch} waits for a finalize its coordinator {who} has not sent (its half of the finalize "
                f"window is over): any staked member may finalize it until {until} UTC chain time, or it aborts "
                f"with no new model; {act}")
    if status.phase is Phase.ABORTED and times.seeded and not status.model_cid:
        return (f"epoch {epoch} aborted: nobody finalized it by its deadline (its coordinator {who} was silent), so "
                f"it has no new model; for the next epochs {act}")
    return None
