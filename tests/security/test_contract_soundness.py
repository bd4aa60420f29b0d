"""Soundness of the model attestation, finalizer succession, slash routing and membership bookkeeping
of the contract, on in-process py-evm.

Each test drives one behaviour end to end and checks chain state and events, then the accounting
invariant (balance == totalStaked + totalCredits + totalBurned): a slash that moves value must move
all of it, to a credit or to the burn, never to nowhere. Every transaction mines one block one
second after the last, so `until` can place a call at an exact block time.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from protocol.chain import errors as ce
from protocol.chain.binding import AuditResponse, Phase, TxResult
from protocol.digest import keccak
from tests.fixtures.chain import (
    MODEL,
    STAKE,
    VSTAKE,
    PyEvmNet,
    Run,
    Trainer,
    params,
)
from tests.fixtures.chain import assert_books as books
from tests.fixtures.chain import make_run as fixture_run

pytestmark = pytest.mark.integration

COORD, TRAINERS, VERIFIERS, OUTSIDER, CREATOR = 0, [1, 2, 3, 4, 5], [6, 7, 8, 9], 10, 11
NO_REVEAL, NO_RESPONSE, FAILED_AUDIT = 1, 2, 3  # Slashed reasons (Veriloco.SLASH_*)
WINDOW = 100  # every window of params(): commit, reveal, response, verdict, finalize
WRONG = keccak(b"a model that is not the mean of the passing payloads")


def make_run(net: PyEvmNet, n_trainers: int = 2, n_verifiers: int = 2, **over: Any) -> Run:
    return fixture_run(net, TRAINERS[:n_trainers], VERIFIERS[:n_verifiers], COORD, **over)


def ev(res: TxResult, name: str) -> list[dict[str, Any]]:
    """The args of the `name` events one transaction emitted, in log order."""
    return [e.args for e in res.events if e.name == name]


def until(net: PyEvmNet, t: int) -> None:
    """Mine up to block time t - 1, so the next transaction (or estimate) runs at t."""
    now = int(net.w3.eth.get_block("latest")["timestamp"])
    assert now <= t - 1, f"already at {now}, cannot reach {t}"
    if now < t - 1:
        net.advance(t - 1 - now)


def block_time(net: PyEvmNet, res: TxResult) -> int:
    return int(net.w3.eth.get_block(res.block_number)["timestamp"])


# ---------------------------------------------------------------- model attestation


def test_wrong_model_is_corrected_and_its_finalizer_pays_the_attesters(fresh: PyEvmNet) -> None:
    """A majority digest that differs replaces the coordinator's model; the coordinator's slashed
    stake is split among the winning attesters only (rounding burned), and it finalizes no more: a
    verifier takes over once the coordinator's half of the finalize window is over."""
    vstake = VSTAKE + 3  # odd slash: the one-wei rounding of the split must be burned, not lost
    r = make_run(fresh, n_trainers=2, n_verifiers=3, quorum=3, verifier_stake=vstake)
    rid, c = r.run_id, r.coord
    r.open_epoch(0)
    r.judge_all(0)
    c.finalize(rid, 0, "bafkreiwrong", WRONG, [t.address for t in r.trainers])
    assert c.epoch_status(rid, 0).phase == Phase.CONFIRMING
    sider, *honest = c.model_committee(rid, 0)
    assert len(honest) == 2
    r.verifier(sider).attest_model(rid, 0, WRONG, "bafkreiwrong")  # a minority siding with the finalizer
    first = r.verifier(honest[0]).attest_model(rid, 0, MODEL, "bafkreiright")
    assert ev(first, "ModelConfirmed") == [] and c.epoch_status(rid, 0).phase == Phase.CONFIRMING
    last = r.verifier(honest[1]).attest_model(rid, 0, MODEL, "bafkreiright")
    amount = vstake * 5_000 // 10_000
    share = amount // 2
    assert ev(last, "ModelConfirmed") == [
        {"runId": rid, "epoch": 0, "modelDigest": MODEL, "modelCid": "bafkreiright", "corrected": True, "slashed": amount}
    ]
    st = c.epoch_status(rid, 0)
    assert (st.phase, st.model_cid, c.epoch_times(rid, 0).model_digest) == (Phase.FINALIZED, "bafkreiright", MODEL)
    coord = c.member(rid, fresh.accounts[COORD])
    assert (coord.stake, coord.leave_epoch) == (vstake - amount, 1)
    assert [c.credits(a) for a in (sider, *honest)] == [0, share, share]
    assert c.totals()[1] == 2 * share and c.total_burned() == amount - 2 * share == 1
    books(c)
    claimed = r.verifier(honest[0]).claim()
    assert ev(claimed, "Claimed") == [{"account": honest[0], "amount": share}]
    books(c)

    r.open_epoch(1)
    r.judge_all(1)
    with pytest.raises(ce.NotStaked) as ns:  # its role ended with the correction
        c.finalize(rid, 1, "bafkreimodel", MODEL, [t.address for t in r.trainers])
    assert ns.value.account == c.sender
    half = c.epoch_times(rid, 1).finalize_deadline - WINDOW // 2
    v = r.verifiers[0]
    until(fresh, half - 1)
    with pytest.raises(ce.NotCoordinator) as nc:  # one second early
        v.finalize(rid, 1, "bafkreimodel", MODEL, [t.address for t in r.trainers])
    assert (nc.value.caller, nc.value.coordinator) == (v.sender, c.sender)
    until(fresh, half)
    res = v.finalize(rid, 1, "bafkreimodel", MODEL, [t.address for t in r.trainers])
    assert block_time(fresh, res) == half
    assert [e["included"] for e in ev(res, "EpochFinalized")] == [2]
    confirmed = r.attest(1, MODEL)[-1]
    assert [(e["corrected"], e["slashed"]) for e in ev(confirmed, "ModelConfirmed")] == [(False, 0)]
    assert c.epoch_status(rid, 1).phase == Phase.FINALIZED
    assert c.member(rid, fresh.accounts[VERIFIERS[0]]).stake == vstake  # a confirmed model costs its finalizer nothing
    books(c)


def test_a_silent_coordinator_is_replaced_by_a_staked_member(fresh: PyEvmNet) -> None:
    """Before the second half of the finalize window only the coordinator may finalize; after it any
    member with an active stake may (its stake answers for the model), an outsider never."""
    r = make_run(fresh, n_trainers=2, n_verifiers=2, quorum=2)
    rid, c = r.run_id, r.coord
    trainer, outsider = r.trainers[0], fresh.chain(OUTSIDER)
    included = [t.address for t in r.trainers]
    r.open_epoch(0)
    r.judge_all(0)
    half = c.epoch_times(rid, 0).finalize_deadline - WINDOW // 2
    until(fresh, half - 1)
    for early in (trainer.chain, outsider):
        with pytest.raises(ce.NotCoordinator) as nc:
            early.finalize(rid, 0, "bafkreimodel", MODEL, included)
        assert (nc.value.caller, nc.value.coordinator) == (early.sender, c.sender)
    until(fresh, half)
    with pytest.raises(ce.NotStaked) as ns:
        outsider.finalize(rid, 0, "bafkreimodel", MODEL, included)
    assert ns.value.account == outsider.sender
    res = trainer.chain.finalize(rid, 0, "bafkreimodel", MODEL, included)
    assert ev(res, "EpochFinalized") == [
        {"runId": rid, "epoch": 0, "modelCid": "bafkreimodel", "modelDigest": MODEL, "included": 2}
    ]
    with pytest.raises(ce.WrongPhase) as wp:  # the coordinator wakes up too late
        c.finalize(rid, 0, "bafkreimodel", MODEL, included)
    assert (wp.value.actual, wp.value.expected) == (Phase.CONFIRMING, Phase.AUDITING)
    r.attest(0, MODEL)
    assert c.epoch_status(rid, 0).phase == Phase.FINALIZED
    assert c.member(rid, trainer.address).stake == STAKE and c.member(rid, fresh.accounts[COORD]).stake == VSTAKE
    books(c)


def test_an_unconfirmed_model_aborts_and_the_next_epoch_builds_on_the_last_confirmed(fresh: PyEvmNet) -> None:
    """A split committee confirms nothing: the epoch aborts when the attestation window ends, its
    finalize-time slash stays (applied once: settle refuses it), and the next epoch, which could
    commit but not close its commits meanwhile, proceeds with epoch 0 as the last confirmed model."""
    r = make_run(fresh, n_trainers=3, n_verifiers=2, quorum=2)
    rid, c = r.run_id, r.coord
    a, b, quiet = r.trainers
    r.open_epoch(0)
    r.judge_all(0)
    r.finalize(0, r.trainers)
    for t in r.trainers:
        t.commit(1)
    a.reveal(1)
    b.reveal(1)
    fresh.advance(WINDOW + 1)  # reveals close without `quiet`
    a.respond(1)
    b.respond(1)
    r.judge_all(1)
    res = c.finalize(rid, 1, "bafkreiunconfirmed", MODEL, [a.address, b.address])
    assert [(e["trainer"], e["reason"]) for e in ev(res, "Slashed")] == [(quiet.address, NO_REVEAL)]
    burned = c.total_burned()
    assert burned == STAKE // 2
    one, two = c.model_committee(rid, 1)
    r.verifier(one).attest_model(rid, 1, MODEL, "bafkreimodel")
    r.verifier(two).attest_model(rid, 1, WRONG, "bafkreiother")  # 1 of 2 each: no majority
    for t in (a, b):
        t.commit(2)  # allowed while epoch 1 is confirming
    with pytest.raises(ce.NotEligible):
        quiet.commit(2)
    assert c.epoch_times(rid, 2).expected == 2
    assert c.epoch_status(rid, 2).phase == Phase.COMMITTING  # all in, but epoch 1 is not done
    until(fresh, block_time(fresh, res) + WINDOW + 1)  # views read the latest block: the window has ended there
    assert c.epoch_status(rid, 1).phase == Phase.ABORTED
    assert c.epoch_status(rid, 2).phase == Phase.REVEALING
    with pytest.raises(ce.WrongPhase) as wp:
        r.verifier(one).attest_model(rid, 1, WRONG, "bafkreiother")
    assert (wp.value.actual, wp.value.expected) == (Phase.ABORTED, Phase.CONFIRMING)
    with pytest.raises(ce.WrongPhase):  # finalized once: settle cannot slash it a second time
        fresh.chain(OUTSIDER).settle(rid, 1)
    assert c.member(rid, quiet.address).stake == STAKE // 2 and c.total_burned() == burned
    for t in (a, b):
        t.reveal(2)
    for t in (a, b):
        t.respond(2)
    r.judge_all(2)
    assert r.finalize(2, [a, b]) == {}
    assert [c.epoch_status(rid, e).phase for e in range(3)] == [Phase.FINALIZED, Phase.ABORTED, Phase.FINALIZED]
    assert [e.args["epoch"] for e in c.events(["ModelConfirmed"], run_id=rid)] == [0, 2]
    books(c)


def test_only_the_attestation_committee_attests_once_each_while_confirming(fresh: PyEvmNet) -> None:
    r = make_run(fresh, n_trainers=1, n_verifiers=4, quorum=3)
    rid, c = r.run_id, r.coord
    r.open_epoch(0)
    r.judge_all(0)
    committee = c.model_committee(rid, 0)
    assert len(committee) == 3
    member = r.verifier(committee[0])
    with pytest.raises(ce.WrongPhase) as early:
        member.attest_model(rid, 0, MODEL, "bafkreimodel")
    assert (early.value.actual, early.value.expected) == (Phase.AUDITING, Phase.CONFIRMING)
    r.finalize(0, r.trainers, confirm=False)
    left_out = next(v for v in r.verifiers if v.sender not in committee)
    for stranger in (left_out, fresh.chain(OUTSIDER), c):
        with pytest.raises(ce.NotAssigned) as na:
            stranger.attest_model(rid, 0, MODEL, "bafkreimodel")
        assert (na.value.trainer, na.value.verifier) == (c.address, stranger.sender)
    assert ev(member.attest_model(rid, 0, MODEL, "bafkreimodel"), "ModelAttested") == [
        {"runId": rid, "epoch": 0, "verifier": member.sender, "modelDigest": MODEL}
    ]
    for digest in (MODEL, WRONG):  # one vote per member, whatever it names
        with pytest.raises(ce.AlreadyVoted) as av:
            member.attest_model(rid, 0, digest, "bafkreimodel")
        assert av.value.verifier == member.sender
    confirmed = r.verifier(committee[1]).attest_model(rid, 0, MODEL, "bafkreimodel")
    assert [e["corrected"] for e in ev(confirmed, "ModelConfirmed")] == [False]
    with pytest.raises(ce.WrongPhase) as late:
        r.verifier(committee[2]).attest_model(rid, 0, MODEL, "bafkreimodel")
    assert (late.value.actual, late.value.expected) == (Phase.FINALIZED, Phase.CONFIRMING)
    assert len(c.events(["ModelAttested"], run_id=rid)) == 2
    books(c)


def test_creator_and_coordinator_cannot_verify_their_run(fresh: PyEvmNet) -> None:
    """A verifier judges the run's trainers and models: the accounts that run it may not."""
    creator, c = fresh.chain(CREATOR), fresh.chain(COORD)
    rid = creator.create_run(params(fresh.accounts[COORD]))
    for insider in (creator, c):
        with pytest.raises(ce.ConflictOfInterest) as coi:
            insider.join_verifier(rid)
        assert (coi.value.run_id, coi.value.account) == (rid, insider.sender)
    with pytest.raises(ce.NotCoordinator):
        creator.stake_coordinator(rid)
    assert ev(c.stake_coordinator(rid), "CoordinatorStaked") == [{"runId": rid, "coordinator": c.sender, "stake": VSTAKE}]
    with pytest.raises(ce.AlreadyJoined):
        c.join_verifier(rid)
    v = fresh.chain(VERIFIERS[0])
    v.join_verifier(rid)
    assert c.participants(rid)[1] == [v.sender]
    assert c.totals() == (2 * VSTAKE, 0)
    books(c)


# ---------------------------------------------------------------- audit seed timing


@pytest.mark.parametrize(("fixed_after", "excused"), [(WINDOW // 2, False), (WINDOW // 2 + 1, True), (None, True)])
def test_a_late_seed_excuses_a_missing_response(fresh: PyEvmNet, fixed_after: int | None, excused: bool) -> None:
    """A trainer cannot answer before the seed is fixed: fixed with at least half the response window
    left, a missing response is slashed; later (or never), it is not the trainer's fault."""
    r = make_run(fresh, n_trainers=2, n_verifiers=2, quorum=2)
    rid, c = r.run_id, r.coord
    answering, silent = r.trainers
    for t in r.trainers:
        t.commit(0)
    for t in r.trainers:
        t.reveal(0)
    rc = c.epoch_times(rid, 0).reveals_close
    included: list[Trainer] = []
    if fixed_after is None:
        with pytest.raises(ce.AuditSeedPending) as sp:  # nobody schedules it: nobody can answer
            answering.chain.respond(rid, 0, "bafkreimanifest", AuditResponse((), (), ()))
        assert sp.value.seed_block == 0
    else:
        until(fresh, rc + fixed_after - 1)
        c.start_audit(rid, 0)  # schedules
        fixed = c.start_audit(rid, 0)  # fixes
        assert block_time(fresh, fixed) == rc + fixed_after and len(ev(fixed, "AuditStarted")) == 1
        answering.respond(0)
        r.judge(0, answering, [True, True])
        r.reveal_verdicts(0)
        included = [answering]
    until(fresh, rc + WINDOW)  # the response window is over
    slashed = r.finalize(0, included)
    assert slashed == ({} if excused else {silent.address: NO_RESPONSE})
    assert c.member(rid, silent.address).stake == (STAKE if excused else STAKE // 2)
    assert c.member(rid, silent.address).leave_epoch == (None if excused else 1)
    assert c.total_burned() == (0 if excused else STAKE // 2)
    books(c)


# ---------------------------------------------------------------- removal and membership


def test_a_trainer_slashed_at_finalize_is_removed_from_the_committing_epoch(fresh: PyEvmNet) -> None:
    """Removed means removed: the next epoch, still committing, forgets its commitment and its count,
    so it cannot be slashed a second time there, and that epoch finalizes without it."""
    r = make_run(fresh, n_trainers=3, n_verifiers=2, quorum=2)
    rid, c = r.run_id, r.coord
    a, b, cheat = r.trainers
    r.open_epoch(0)
    r.judge_all(0, fail={cheat.address})
    a.commit(1)
    cheat.commit(1)
    assert (c.epoch_times(rid, 1).expected, c.epoch_status(rid, 1).committed) == (3, 2)
    assert c.submission(rid, 1, cheat.address).state == 1
    res = c.finalize(rid, 0, "bafkreimodel", MODEL, [a.address, b.address])
    assert [(e["trainer"], e["reason"], e["amount"]) for e in ev(res, "Slashed")] == [(cheat.address, FAILED_AUDIT, STAKE // 2)]
    assert ev(res, "TrainerLeft") == [{"runId": rid, "trainer": cheat.address, "leaveEpoch": 1}]
    assert (c.epoch_times(rid, 1).expected, c.epoch_status(rid, 1).committed) == (2, 1)
    assert c.submission(rid, 1, cheat.address).state == 0
    with pytest.raises(ce.NotEligible) as ne:
        cheat.commit(1)
    assert (ne.value.join_epoch, ne.value.leave_epoch) == (0, 1)
    r.attest(0, MODEL)
    b.commit(1)  # the last expected commitment closes commits at once
    assert c.epoch_status(rid, 1).phase == Phase.REVEALING
    with pytest.raises(ce.NotCommitted):
        cheat.reveal(1)
    for t in (a, b):
        t.reveal(1)
    for t in (a, b):
        t.respond(1)
    r.judge_all(1)
    assert r.finalize(1, [a, b]) == {}
    assert c.epoch_status(rid, 1).phase == Phase.FINALIZED
    assert len(c.events(["Slashed"], run_id=rid)) == 1
    assert c.member(rid, cheat.address).stake == STAKE // 2
    assert [c.credits(fresh.accounts[i]) for i in VERIFIERS[:2]] == [STAKE // 4, STAKE // 4]  # both failed it
    books(c)


def test_a_fully_slashed_trainer_withdraws_nothing_and_may_rejoin(fresh: PyEvmNet) -> None:
    """At slashBps 10000 the record is cleared on withdraw all the same, and submission() shows
    nobody an epoch from before their current membership: not the rejoined trainer its own past,
    not the newcomer that inherited the slot its predecessor's lane."""
    r = make_run(fresh, n_trainers=2, n_verifiers=2, quorum=2, slash_bps=10_000)
    rid, c = r.run_id, r.coord
    honest, cheat = r.trainers
    newcomer = Trainer(fresh.chain(OUTSIDER), rid)
    old_slot = c.member(rid, cheat.address).slot
    r.open_epoch(0)
    r.judge_all(0, fail={cheat.address})
    assert r.finalize(0, [honest]) == {cheat.address: FAILED_AUDIT}
    assert c.member(rid, cheat.address).stake == 0
    assert c.submission(rid, 0, cheat.address).state == 3
    fresh.advance(50)  # unbonding_delay
    res = cheat.chain.withdraw(rid)
    assert ev(res, "Withdrawn") == [{"runId": rid, "account": cheat.address, "amount": 0}]
    assert c.member(rid, cheat.address).role == 0
    books(c)
    with pytest.raises(ce.NotLeaving):
        cheat.chain.withdraw(rid)
    joined = newcomer.chain.join_trainer(rid)
    assert [(e["slot"], e["joinEpoch"]) for e in ev(joined, "TrainerJoined")] == [(old_slot, 1)]
    assert c.submission(rid, 0, newcomer.address).state == 0  # the slot's epoch-0 lane is the cheat's
    rejoined = cheat.chain.join_trainer(rid)
    assert [e["joinEpoch"] for e in ev(rejoined, "TrainerJoined")] == [1]
    assert c.submission(rid, 0, cheat.address) == c.submission(rid, 0, fresh.accounts[CREATOR])  # empty
    opened = cheat.commit(1)
    assert [e["expected"] for e in ev(opened, "EpochOpened")] == [3]  # the honest trainer, the newcomer, the cheat
    assert c.member(rid, cheat.address).stake == STAKE
    books(c)


# ---------------------------------------------------------------- contract bugs found here


def test_a_trainer_finalizer_cannot_withdraw_before_its_model_is_confirmed(fresh: PyEvmNet) -> None:
    """withdraw counts a Confirming epoch as settled, so a trainer that finalized a wrong model can
    leave at once and take its whole stake out (unbondingDelay 50 < attestation window 100) before
    the committee outvotes it: the correction then slashes nothing."""
    r = make_run(fresh, n_trainers=2, n_verifiers=2, quorum=2, unbonding_delay=50)
    rid, c = r.run_id, r.coord
    finalizer = r.trainers[0]
    r.open_epoch(0)
    r.judge_all(0)
    until(fresh, c.epoch_times(rid, 0).finalize_deadline - WINDOW // 2)
    finalizer.chain.finalize(rid, 0, "bafkreiwrong", WRONG, [t.address for t in r.trainers])
    finalizer.chain.leave(rid)
    fresh.advance(50)
    with contextlib.suppress(ce.ContractRevert):  # refusing is one fix; the check is what it pays
        finalizer.chain.withdraw(rid)
    confirmed = r.attest(0, MODEL)[-1]
    assert [(e["corrected"], e["slashed"]) for e in ev(confirmed, "ModelConfirmed")] == [(True, STAKE // 2)]
    books(c)


def test_a_finalizer_that_joined_after_the_epoch_opened_cannot_leave_before_it_is_judged(fresh: PyEvmNet) -> None:
    """Issue 30 item 7: a trainer that joined after epoch 0 opened takes no part in it, so the old
    withdraw check (epochs it took part in) skipped epoch 0; it finalized a wrong model, left and was
    gone before the committee corrected it. Now the epoch it finalized holds its stake until judged."""
    r = make_run(fresh, n_trainers=2, n_verifiers=2, quorum=2, unbonding_delay=50)
    rid, c = r.run_id, r.coord
    for t in r.trainers:
        t.commit(0)  # epoch 0 opens
    late = Trainer(fresh.chain(TRAINERS[2]), rid)
    late.chain.join_trainer(rid)
    assert c.member(rid, late.address).join_epoch == 1
    for t in r.trainers:
        t.reveal(0)
    for t in r.trainers:
        t.respond(0)
    r.judge_all(0)
    until(fresh, c.epoch_times(rid, 0).finalize_deadline - WINDOW // 2)
    late.chain.finalize(rid, 0, "bafkreiwrong", WRONG, [t.address for t in r.trainers])
    late.chain.leave(rid)
    fresh.advance(50)
    with pytest.raises(ce.EpochNotSettled) as ns:
        late.chain.withdraw(rid)
    assert ns.value.epoch == 0
    confirmed = r.attest(0, MODEL)[-1]
    assert [(e["corrected"], e["slashed"]) for e in ev(confirmed, "ModelConfirmed")] == [(True, STAKE // 2)]
    assert ev(late.chain.withdraw(rid), "Withdrawn")[0]["amount"] == STAKE // 2
    books(c)


def test_a_verdict_commitment_left_unrevealed_is_slashed(fresh: PyEvmNet) -> None:
    """Issue 30 item 6: a verifier that commits and then waits to see the others' reveals (revealing
    only when it agrees) holds finalize up until the verdict deadline, and is slashed then (burned)."""
    r = make_run(fresh, n_trainers=2, n_verifiers=3, quorum=3, test_run=False)
    rid, c = r.run_id, r.coord
    r.open_epoch(0)
    for t in r.trainers:
        r.judge(0, t, [True] * 3)
    silent = r.verifiers[2].sender
    r.reveal_verdicts(0, reveal=frozenset(v.sender for v in r.verifiers[:2]))
    assert all(c.submission(rid, 0, t.address).passed for t in r.trainers)  # decided without it
    with pytest.raises(ce.NotReady):
        c.finalize(rid, 0, "bafkreimodel", MODEL, [t.address for t in r.trainers])
    times = c.epoch_times(rid, 0)
    until(fresh, times.verdict_deadline)
    with pytest.raises(ce.DeadlinePassed):  # too late to reveal now
        r.verifier(silent).submit_verdicts(rid, 0, [], bytes(32), "bafkreievidence")
    res = c.finalize(rid, 0, "bafkreimodel", MODEL, [t.address for t in r.trainers])
    zero = "0x" + "00" * 20
    assert [(e["verifier"], e["trainer"]) for e in ev(res, "VerifierSlashed")] == [(silent, zero)]
    assert c.member(rid, silent).stake == VSTAKE // 2 and c.total_burned() == VSTAKE // 2
    assert ev(res, "Slashed") == []
    books(c)


def test_an_honest_trainer_its_verifiers_did_not_judge_in_time_is_paid_by_them(fresh: PyEvmNet) -> None:
    """Issue 46 item 4: two of a trainer's three verifiers cast no verdict on it by the deadline (slow,
    overloaded): it is neither passed nor failed, so not included, and it used to go unpaid. The two pay
    its trainer reward out of their stakes (Credited kind 4, source the verifier); a trainer with a fail
    vote against it gets nothing, a passed one its reward from the pool, and every wei is accounted."""
    reward = 10**15
    r = make_run(fresh, n_trainers=3, n_verifiers=4, quorum=3, test_run=False, reward_pool=10**18,
                 trainer_reward=reward, verifier_reward=10**14)
    rid, c = r.run_id, r.coord
    r.open_epoch(0)
    judged, slow, doubted = r.trainers
    r.judge(0, judged, [True] * 3)
    r.judge(0, slow, [True])  # one verdict of three in time, none against: undecided
    r.judge(0, doubted, [False])  # one fail of three: undecided, and somebody found a fault
    late = [v.sender for v in r.assigned(0, slow)[1:]]
    stakes = {v.sender: c.member(rid, v.sender).stake for v in r.verifiers}
    r.reveal_verdicts(0)
    until(fresh, c.epoch_times(rid, 0).verdict_deadline)  # verdicts are outstanding: finalize waits for the deadline
    res = c.finalize(rid, 0, "bafkreimodel", MODEL, [judged.address])
    paid = [(e["account"], e["source"], e["amount"]) for e in ev(res, "Credited") if e["kind"] == 4]
    assert sorted(paid) == sorted((slow.address, v, reward // 2) for v in late)
    assert c.credits(slow.address) == reward and c.credits(doubted.address) == 0
    assert c.credits(judged.address) == reward  # the pool's trainer reward, as before
    fined = {v: stakes[v] - c.member(rid, v).stake for v in stakes}
    assert {v: d for v, d in fined.items() if d} == dict.fromkeys(late, reward // 2)  # and nobody else's stake moved
    assert ev(res, "Slashed") == [] and ev(res, "VerifierSlashed") == []
    assert not c.submission(rid, 0, slow.address).passed
    books(c)


# ---------------------------------------------------------------- the quorum (issue 30 item 3)


def test_create_run_refuses_a_quorum_below_three_unless_it_is_a_test_run(fresh: PyEvmNet) -> None:
    c = fresh.chain(COORD)
    for q in (1, 2):
        with pytest.raises(ce.InvalidParams) as ip:
            c.create_run(params(c.sender, quorum=q, test_run=False))
        assert "testRun" in str(ip.value.reason)
    rid = c.create_run(params(c.sender, quorum=1, test_run=True))
    assert c.run_info(rid).params.test_run and c.run_info(rid).params.quorum == 1
    assert not c.run_info(c.create_run(params(c.sender, quorum=3, test_run=False))).params.test_run


def test_create_run_refuses_shapes_no_availability_committee_can_serve(fresh: PyEvmNet) -> None:
    """Issue 46 item 5: a payload report needs q verifiers of the first 16 drawn outside the trainer's q and
    the reporter. Quorum 8 to 16, or fewer than 2q + 1 verifier places, used to be accepted, and there a
    withheld payload could never be removed; createRun now refuses them, naming the bound."""
    c = fresh.chain(COORD)
    for q in (8, 9, 16):
        with pytest.raises(ce.InvalidParams) as ip:
            c.create_run(params(c.sender, quorum=q, test_run=False, max_verifiers=64))
        assert "quorum 3..7" in str(ip.value.reason)
    for q, places in ((3, 6), (3, 3), (7, 14), (1, 2)):
        with pytest.raises(ce.InvalidParams) as ip:
            c.create_run(params(c.sender, quorum=q, test_run=q < 3, max_verifiers=places))
        assert "maxVerifiers >= 2 x quorum + 1" in str(ip.value.reason)
    for q, places in ((3, 7), (7, 15), (1, 3)):
        rid = c.create_run(params(c.sender, quorum=q, test_run=q < 3, max_verifiers=places))
        assert c.run_info(rid).params.max_verifiers == places


def test_create_run_caps_the_members_a_reveal_and_finalize_must_fit_a_block_for(fresh: PyEvmNet) -> None:
    """Issue 46 item 7: a verifier reveals all its verdicts in one transaction (about 25k gas each, one per
    trainer at V = quorum) and finalize scans every slot; maxTrainers and maxVerifiers were uncapped, so an
    honest verifier of a large enough run could not reveal in a block and was slashed. Now capped, the
    config refusing the same before anything is published."""
    from protocol.config import MAX_TRAINERS, MAX_VERIFIERS, ConfigError, RunConfig

    c = fresh.chain(COORD)
    for over in ({"max_trainers": MAX_TRAINERS + 1}, {"max_verifiers": MAX_VERIFIERS + 1}):
        with pytest.raises(ce.InvalidParams) as ip:
            c.create_run(params(c.sender, **over))
        assert "maxTrainers 512 maxVerifiers 128" in str(ip.value.reason)
        with pytest.raises(ConfigError, match="max_trainers <= 512 and stakes.max_verifiers <= 128"):
            RunConfig().replace(stakes=over)
    rid = c.create_run(params(c.sender, max_trainers=MAX_TRAINERS, max_verifiers=MAX_VERIFIERS))
    assert c.run_info(rid).params.max_trainers == MAX_TRAINERS


def test_an_epoch_with_fewer_verifiers_than_its_quorum_is_never_audited_and_slashes_nobody(fresh: PyEvmNet) -> None:
    """A quorum-3 run with one verifier: the audit waits (TooFewVerifiers), no trainer can respond, no
    model can be finalized, and the epoch aborts at its deadline with nobody slashed. Two more
    verifiers join: the next epoch audits with its full quorum."""
    r = make_run(fresh, n_trainers=2, n_verifiers=1, quorum=3, test_run=False)
    rid, c = r.run_id, r.coord
    for t in r.trainers:
        t.commit(0)
    for t in r.trainers:
        t.reveal(0)
    with pytest.raises(ce.TooFewVerifiers) as tf:
        c.start_audit(rid, 0)
    assert (tf.value.have, tf.value.need) == (1, 3)
    with pytest.raises(ce.TooFewVerifiers):  # the client fixes the seed first: it says why it cannot
        r.trainers[0].respond(0)
    with pytest.raises(ce.TooFewVerifiers):
        c.finalize(rid, 0, "bafkreimodel", MODEL, [])
    until(fresh, c.epoch_times(rid, 0).finalize_deadline + 1)
    assert c.epoch_status(rid, 0).phase == Phase.ABORTED and c.epoch_status(rid, 0).failed == 0
    res = c.settle(rid, 0)
    assert ev(res, "Slashed") == [] and ev(res, "VerifierSlashed") == []
    for i in VERIFIERS[1:3]:
        fresh.chain(i).join_verifier(rid)
    r.verifiers.extend(fresh.chain(i) for i in VERIFIERS[1:3])
    r.open_epoch(1)
    assert len(c.assignment(rid, 1, r.trainers[0].address).verifiers) == 3
    r.judge_all(1)
    assert r.finalize(1, r.trainers) == {}
    assert all(c.member(rid, t.address).stake == STAKE for t in r.trainers)
    books(c)


def test_a_trainer_slashed_by_a_late_settle_cannot_pass_its_next_epoch_to_a_newcomer(fresh: PyEvmNet) -> None:
    """Epoch 0 expires unsettled; epoch 1 is already auditing when scheduling its seed settles epoch
    0 and slashes the no-reveal trainer (leaveEpoch 1). It is not taken out of epoch 1 (no longer
    Committing), yet withdraw only checks epochs leaveEpoch-1 and -2: it withdraws with a live lane
    in epoch 1, its slot goes to a newcomer, and epoch 1's finalize slashes the newcomer for it."""
    r = make_run(fresh, n_trainers=2, n_verifiers=2, quorum=2, unbonding_delay=50)
    rid, c = r.run_id, r.coord
    a, shirker = r.trainers
    newcomer = Trainer(fresh.chain(OUTSIDER), rid)
    a.commit(0)
    shirker.commit(0)
    a.reveal(0)
    fresh.advance(WINDOW + 1)  # reveals close without the shirker
    a.respond(0)
    r.judge(0, a, [True, True])
    r.reveal_verdicts(0)
    a.commit(1)
    shirker.commit(1)
    until(fresh, c.epoch_times(rid, 0).finalize_deadline + 1)  # epoch 0 expires, nobody settles it
    a.reveal(1)
    shirker.reveal(1)
    res = c.start_audit(rid, 1)  # settles epoch 0 first
    assert [(e["trainer"], e["epoch"]) for e in ev(res, "Slashed")] == [(shirker.address, 0)]
    assert c.fix_audit_seed(rid, 1) is not None  # on time: a missing response in epoch 1 is due
    fresh.advance(50)
    with contextlib.suppress(ce.ContractRevert):  # refusing is the fix; the check is who pays for epoch 1
        shirker.chain.withdraw(rid)
    newcomer.chain.join_trainer(rid)
    a.respond(1)  # the shirker does not answer epoch 1
    r.judge(1, a, [True, True])
    r.reveal_verdicts(1)
    until(fresh, c.epoch_times(rid, 1).response_deadline)
    slashed = r.finalize(1, [a])
    assert newcomer.address not in slashed
    assert c.member(rid, newcomer.address).stake == STAKE
    books(c)
