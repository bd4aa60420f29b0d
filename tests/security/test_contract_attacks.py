"""Attacks on the contract itself, on in-process py-evm: each must revert with the named custom error
(checked with its arguments) or end in the slash docs/security.md promises.

One py-evm chain per module; every test runs on a snapshot that is reverted afterwards. Trainers
use random traces (tests/fixtures/chain.py `Trainer`): the contract never sees tensors, only digests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from eth_utils import to_checksum_address
from hexbytes import HexBytes

from protocol.chain import errors as ce
from protocol.chain.binding import (
    AuditResponse,
    Phase,
    assigned_verifiers,
    audit_seed,
    challenged_steps,
    commitment,
    decode_revert,
    deploy,
    revert_data,
)
from protocol.digest import keccak
from tests.fixtures.chain import SALT, STAKE, VSTAKE, PyEvmNet, Run, Trainer, params
from tests.fixtures.chain import make_run as fixture_run

pytestmark = pytest.mark.integration

COORD, TRAINERS, VERIFIERS, OUTSIDER = 0, [1, 2, 3, 4, 5], [6, 7, 8, 9], 10
NO_REVEAL, NO_RESPONSE, FAILED_AUDIT = 1, 2, 3  # Slashed reasons (Veriloco.SLASH_*)
WINDOW = 100  # every window of params(): commit, reveal, response, verdict, finalize
HERE = Path(__file__).resolve().parent


def make_run(net: Any, n_trainers: int = 3, n_verifiers: int = 2, **over: Any) -> Run:
    return fixture_run(net, TRAINERS[:n_trainers], VERIFIERS[:n_verifiers], COORD, **over)


def raw_revert(call: Any) -> ce.ChainError:
    """The decoded custom error of a raw web3 call that must revert (for calls the binding would tidy up)."""
    with pytest.raises(Exception) as ei:
        call()
    data = revert_data(ei.value)
    assert data is not None, f"no revert data in {ei.value!r}"
    return decode_revert(data)


# ---------------------------------------------------------------- trainers


def test_copied_commitment_cannot_be_revealed(fresh: PyEvmNet) -> None:
    """Copying before the reveal: the commitment binds the trainer, so the copy never opens."""
    r = make_run(fresh, n_trainers=3)
    rid = r.run_id
    victim, copier, other = r.trainers
    victim.commit(0)
    copier.chain.commit(rid, 0, victim.commitment(0))  # accepted: any non-zero word is a commitment
    other.commit(0)
    victim.reveal(0)
    m = victim.material(0)
    with pytest.raises(ce.RevealMismatch) as ei:
        copier.chain.reveal(rid, 0, "bafkreicopied", m.payload_digest, m.root, len(m.digests), m.salt)
    assert ei.value.expected == victim.commitment(0)
    assert ei.value.actual == copier.chain.commitment_for(rid, 0, m.payload_digest, m.root, len(m.digests), m.salt)
    other.reveal(0)
    r.net.advance(WINDOW + 1)  # reveals close without the copier
    r.coord.start_audit(rid, 0)
    for t in (victim, other):
        t.respond(0)
        r.judge(0, t, [True, True])
    r.reveal_verdicts(0)
    assert r.finalize(0, [victim, other]) == {copier.address: NO_REVEAL}
    assert r.coord.member(rid, copier.address).stake == STAKE // 2


def test_payload_cannot_be_copied_after_its_reveal(fresh: PyEvmNet) -> None:
    """Reveals open only once commits close: a late commitment to a revealed payload is out of phase.

    A copier that committed a placeholder cannot reveal the victim's values under its own salt either.
    """
    r = make_run(fresh, n_trainers=3)
    rid = r.run_id
    victim, copier, late = r.trainers
    victim.commit(0)
    copier.commit(0)  # a placeholder: it has no payload yet
    r.net.advance(WINDOW + 1)  # commits close with `late` missing
    victim.reveal(0)
    m = victim.material(0)
    stolen = late.chain.commitment_for(rid, 0, m.payload_digest, m.root, len(m.digests), m.salt)
    with pytest.raises(ce.WrongPhase) as wp:
        late.chain.commit(rid, 0, stolen)
    assert (wp.value.actual, wp.value.expected) == (Phase.REVEALING, Phase.COMMITTING)
    with pytest.raises(ce.RevealMismatch):
        copier.chain.reveal(rid, 0, "bafkreicopied", m.payload_digest, m.root, len(m.digests), copier.material(0).salt)


@pytest.mark.parametrize("where", ["run", "epoch", "contract", "chain"])
def test_replayed_commitment_does_not_open(fresh: PyEvmNet, where: str) -> None:
    """A commitment made for another run, epoch, contract or chain id reveals to a different hash."""
    r = make_run(fresh, n_trainers=2, n_verifiers=2)
    rid, t, other = r.run_id, r.trainers[0], r.trainers[1]
    m = t.material(0)
    args = (m.payload_digest, m.root, len(m.digests), m.salt)
    chain_id, address, run_id, epoch = t.chain.chain_id, t.chain.address, rid, 0
    if where == "run":
        run_id = t.chain.create_run(params(fresh.accounts[COORD]))
    elif where == "epoch":
        epoch = 1
    elif where == "contract":
        address = deploy(fresh.w3, fresh.accounts[COORD])
    else:
        chain_id += 1
    replayed = commitment(chain_id, address, run_id, epoch, t.address, *args)
    assert replayed != t.commitment(0)
    t.chain.commit(rid, 0, replayed)
    other.commit(0)
    with pytest.raises(ce.RevealMismatch) as ei:
        t.chain.reveal(rid, 0, "bafkreireplayed", *args)
    assert (ei.value.actual, ei.value.expected) == (t.commitment(0), replayed)


def test_late_reveal_is_rejected_and_no_reveal_is_slashed(fresh: PyEvmNet) -> None:
    r = make_run(fresh, n_trainers=2)
    rid = r.run_id
    honest, late = r.trainers
    honest.commit(0)
    late.commit(0)
    honest.reveal(0)
    r.net.advance(WINDOW + 1)
    with pytest.raises(ce.WrongPhase) as wp:
        late.reveal(0)
    assert (wp.value.actual, wp.value.expected) == (Phase.AUDITING, Phase.REVEALING)
    r.coord.start_audit(rid, 0)
    honest.respond(0)
    r.judge(0, honest, [True, True])
    r.reveal_verdicts(0)
    assert r.finalize(0, [honest]) == {late.address: NO_REVEAL}
    info = r.coord.member(rid, late.address)
    assert info.stake == STAKE // 2 and info.leave_epoch == 1  # removed from the run from epoch 1 on
    with pytest.raises(ce.NotEligible):
        late.commit(1)


def test_withholding_challenged_states_is_slashed(fresh: PyEvmNet) -> None:
    r = make_run(fresh, n_trainers=2)
    honest, silent = r.trainers
    r.open_epoch(0, trainers=[honest])
    r.judge(0, honest, [True, True])
    r.reveal_verdicts(0)
    with pytest.raises(ce.NotReady):  # the withholder is undecided until its response window closes
        r.finalize(0, [honest])
    r.net.advance(WINDOW + 1)
    with pytest.raises(ce.DeadlinePassed):
        silent.respond(0)
    assert r.coord.epoch_status(r.run_id, 0).failed == 1
    assert r.finalize(0, [honest]) == {silent.address: NO_RESPONSE}


def test_states_that_do_not_match_the_trace_are_rejected(fresh: PyEvmNet) -> None:
    """An answer must prove each challenged digest against the revealed root, at the drawn index."""
    r = make_run(fresh, n_trainers=1, n_verifiers=1, quorum=1)
    t = r.trainers[0]
    t.commit(0)
    t.reveal(0)
    good = t.response(0)
    forged = AuditResponse(good.indices, (keccak(b"a state it never had"),) + good.leaves[1:], good.proofs)
    with pytest.raises(ce.InvalidProof) as ip:
        t.chain.respond(r.run_id, 0, "bafkreim", forged)
    assert ip.value.leaf_index == good.indices[0]
    # a real leaf of the trace, but not the challenged one: the proof walks to another root
    other = next(i for i in range(len(t.material(0).digests)) if i not in good.indices)
    swapped = AuditResponse(good.indices, (t.material(0).digests[other],) + good.leaves[1:], good.proofs)
    with pytest.raises(ce.InvalidProof):
        t.chain.respond(r.run_id, 0, "bafkreim", swapped)
    with pytest.raises(ce.BadResponseLength) as bl:
        t.chain.respond(r.run_id, 0, "bafkreim", AuditResponse((), good.leaves[:-1], good.proofs))
    assert bl.value.expected_leaves == len(good.leaves)
    t.chain.respond(r.run_id, 0, "bafkreim", good)


def test_sybil_joins_need_the_full_stake(fresh: PyEvmNet) -> None:
    r = make_run(fresh, n_trainers=1, n_verifiers=1, max_trainers=2)
    rid = r.run_id
    sybil = fresh.chain(OUTSIDER)
    for value in (0, STAKE - 1, STAKE + 1):
        with pytest.raises(ce.WrongStake) as ws:
            sybil.join_trainer(rid, stake=value)
        assert (ws.value.actual, ws.value.expected) == (value, STAKE)
    with pytest.raises(ce.WrongStake):
        sybil.join_verifier(rid, stake=0)
    with pytest.raises(ce.NotTrainer):
        sybil.commit(rid, 0, keccak(b"free ride"))
    sybil.join_trainer(rid)
    with pytest.raises(ce.AlreadyJoined):
        sybil.join_verifier(rid)  # one role per account: a trainer cannot judge itself with the same key
    with pytest.raises(ce.RunFull) as rf:
        fresh.chain(OUTSIDER + 1).join_trainer(rid)
    assert rf.value.limit == 2
    staked, _ = r.coord.totals()
    assert staked == 2 * STAKE + 2 * VSTAKE  # 2 trainers, 1 verifier, the coordinator; every identity paid in full


# ---------------------------------------------------------------- verifiers


def _verifier_slashes(r: Run, epoch: int) -> dict[str, str]:
    """{slashed verifier: the trainer it misjudged} from the VerifierSlashed events of `epoch`."""
    return {e.args["verifier"]: e.args["trainer"] for e in r.coord.events(["VerifierSlashed"], run_id=r.run_id, epoch=epoch)}


def test_a_lying_verifier_cannot_fail_an_honest_trainer_and_is_slashed(fresh: PyEvmNet) -> None:
    """V1 with q = 3 of 4 verifiers: the honest majority passes the victim; the liar, outvoted, loses
    stake and its place in the verifier list (removed when the next audit is scheduled, which still
    has its quorum of three)."""
    r = make_run(fresh, n_trainers=2, n_verifiers=4, quorum=3)
    honest, victim = r.trainers
    r.open_epoch(0)
    r.judge(0, honest, [True, True, True])
    r.judge(0, victim, [True, True, False])  # the third assigned verifier lies
    r.reveal_verdicts(0)
    sub = r.coord.submission(r.run_id, 0, victim.address)
    assert (sub.pass_votes, sub.fail_votes, sub.passed) == (2, 1, True)
    liar = r.assigned(0, victim)[2].sender
    assert r.finalize(0, [honest, victim]) == {}
    assert r.coord.assignment(r.run_id, 0, victim.address).verifiers == ()  # the events say who judged
    assert _verifier_slashes(r, 0) == {liar: victim.address}
    assert r.coord.member(r.run_id, liar).stake == VSTAKE // 2 and r.coord.member(r.run_id, liar).leave_epoch == 1
    assert r.coord.totals()[1] == 0 and r.coord.total_burned() == VSTAKE // 2  # burned: the creator gains nothing
    r.open_epoch(1)  # scheduling epoch 1's audit drops the liar from the list
    assert liar not in r.coord.participants(r.run_id)[1]


def test_an_expired_epoch_still_slashes_the_outvoted_verifier(fresh: PyEvmNet) -> None:
    """Nobody finalizes: the epoch expires unsettled, and the liar tries to leave first. Leaving waits
    (the list its votes index into is frozen until the epoch is settled), and scheduling the next
    audit settles the expired epoch before it touches the list: the liar is slashed, then removed."""
    r = make_run(fresh, n_trainers=2, n_verifiers=4, quorum=3)
    honest, victim = r.trainers
    r.open_epoch(0)
    r.judge(0, honest, [True, True, True])
    r.judge(0, victim, [True, True, False])
    r.reveal_verdicts(0)
    liar = r.assigned(0, victim)[2]
    fresh.advance(3 * WINDOW + 1)  # past the finalize deadline
    assert r.coord.epoch_status(r.run_id, 0).phase == Phase.ABORTED
    left = liar.leave(r.run_id)
    assert [e.args["removed"] for e in left.events if e.name == "VerifierLeft"] == [False]
    assert liar.sender in r.coord.participants(r.run_id)[1]
    for t in r.trainers:
        t.commit(1)
    for t in r.trainers:
        t.reveal(1)
    r.coord.start_audit(r.run_id, 1)  # scheduling epoch 1's audit settles epoch 0 first
    assert _verifier_slashes(r, 0) == {liar.sender: victim.address}
    assert r.coord.member(r.run_id, liar.sender).stake == VSTAKE // 2
    assert liar.sender not in r.coord.participants(r.run_id)[1]


def test_a_split_vote_leaves_the_trainer_out_and_slashes_nobody(fresh: PyEvmNet) -> None:
    """V1 with q = 2: one pass, one fail is no majority either way. The trainer is not aggregated and
    not slashed, and nobody can tell the liar: a lone liar costs its victim one epoch, not its stake."""
    r = make_run(fresh, n_trainers=2, n_verifiers=2, quorum=2)
    honest, victim = r.trainers
    r.open_epoch(0)
    r.judge(0, honest, [True, True])
    r.judge(0, victim, [True, False])
    r.reveal_verdicts(0)
    assert not r.coord.submission(r.run_id, 0, victim.address).passed
    with pytest.raises(ce.NotReady):  # undecided: finalize waits for the verdict deadline
        r.finalize(0, [honest])
    fresh.advance(2 * WINDOW + 1)  # past the response and verdict windows
    with pytest.raises(ce.NotPassing):
        r.finalize(0, [honest, victim])
    assert r.finalize(0, [honest]) == {}
    assert _verifier_slashes(r, 0) == {}


def test_passing_a_cheater_needs_a_majority_of_its_verifiers(fresh: PyEvmNet) -> None:
    """V2: a corrupt verifier outvoted by honest ones is slashed with the cheater; a corrupt majority
    passes the cheater (the contract cannot tell) and the honest dissenter pays for it."""
    r = make_run(fresh, n_trainers=2, n_verifiers=4, quorum=3)
    caught, lucky = r.trainers
    r.open_epoch(0)
    r.judge(0, caught, [True, False, False])  # one corrupt verifier passes, the honest two fail it
    r.judge(0, lucky, [True, True, False])  # two corrupt verifiers out of three
    r.reveal_verdicts(0)
    assert not r.coord.submission(r.run_id, 0, caught.address).passed
    assert r.coord.submission(r.run_id, 0, lucky.address).passed
    # the assignment is a function of the audit seed, fixed after every reveal: nobody picks it
    seed = r.coord.epoch_times(r.run_id, 0).seed
    _, vlist = r.coord.participants(r.run_id)
    assert list(r.coord.assignment(r.run_id, 0, lucky.address).verifiers) == assigned_verifiers(seed, lucky.address, vlist, 3)
    outvoted = {r.assigned(0, caught)[0].sender: caught.address, r.assigned(0, lucky)[2].sender: lucky.address}
    assert r.finalize(0, [lucky]) == {caught.address: FAILED_AUDIT}
    assert _verifier_slashes(r, 0) == outvoted


def test_a_copied_verdict_is_impossible_once_verdicts_are_committed(fresh: PyEvmNet) -> None:
    """V3: verdicts are committed before any is revealed, and reveals open only once every verifier of
    the frozen list committed: a verifier that waits to copy a witness has nothing to copy, and after
    the reveals open it can no longer commit (nor reveal anything but what it committed)."""
    r = make_run(fresh, n_trainers=1, n_verifiers=2, quorum=2)
    t = r.trainers[0]
    rid = r.run_id
    r.open_epoch(0)
    first, copier = r.assigned(0, t)
    work = [(t.address, True, r.witness(0, t))]
    first.commit_verdicts(rid, 0, work, SALT)
    with pytest.raises(ce.VerdictsNotOpen) as no:  # the copier has not committed: nothing is public yet
        first.submit_verdicts(rid, 0, work, SALT)
    assert (no.value.commits, no.value.verifier_count) == (1, 2)
    with pytest.raises(ce.AlreadyCommitted):
        first.commit_verdicts(rid, 0, work, SALT)
    guess = [(t.address, True, bytes(32))]
    copier.commit_verdicts(rid, 0, guess, SALT)  # committed blind: it never replayed
    with pytest.raises(ce.VerdictCommitsClosed):  # reveals are open: no second commitment
        copier.commit_verdicts(rid, 0, work, SALT)
    first.submit_verdicts(rid, 0, work, SALT)
    with pytest.raises(ce.RevealMismatch) as rm:  # the witness it has now seen is not what it committed
        copier.submit_verdicts(rid, 0, [(t.address, True, r.witness(0, t))], SALT)
    assert rm.value.actual != rm.value.expected
    copier.submit_verdicts(rid, 0, guess, SALT)
    with pytest.raises(ce.AlreadyRevealed):
        copier.submit_verdicts(rid, 0, guess, SALT)
    assert r.coord.submission(rid, 0, t.address).passed
    # q = 2, one witness each: no majority witness, nobody is blamed (witness accountability needs q >= 3)
    assert r.finalize(0, [t]) == {} and _verifier_slashes(r, 0) == {}


def test_a_silent_verifier_delays_but_does_not_slash(fresh: PyEvmNet) -> None:
    r = make_run(fresh, n_trainers=2, n_verifiers=2, quorum=2)
    honest, stalled = r.trainers
    r.open_epoch(0)
    r.judge(0, honest, [True, True])
    r.judge(0, stalled, [True])  # its second verifier never answers
    r.reveal_verdicts(0)
    with pytest.raises(ce.NotReady) as nr:
        r.finalize(0, [honest])
    assert (nr.value.decided, nr.value.committed) == (1, 2)
    r.net.advance(2 * WINDOW + 1)  # response and verdict windows over
    late = r.assigned(0, stalled)[1]
    with pytest.raises(ce.DeadlinePassed):
        late.submit_verdicts(r.run_id, 0, [(stalled.address, True, r.witness(0, stalled))], SALT)
    assert r.finalize(0, [honest]) == {}  # left out of the aggregate, but not slashed
    assert r.coord.member(r.run_id, stalled.address).stake == STAKE


# ---------------------------------------------------------------- coordinator


def test_coordinator_cannot_choose_who_is_aggregated(fresh: PyEvmNet) -> None:
    r = make_run(fresh, n_trainers=3, n_verifiers=2, quorum=2)
    rid = r.run_id
    a, b, failed = r.trainers
    r.open_epoch(0)
    with pytest.raises(ce.NotReady):  # finalizing early, before any verdict
        r.finalize(0, [a, b])
    r.judge(0, a, [True, True])
    r.judge(0, b, [True, True])
    r.judge(0, failed, [False, False])
    r.reveal_verdicts(0)
    with pytest.raises(ce.PassingOmitted) as po:  # leaving out a passing trainer
        r.finalize(0, [a])
    assert (po.value.included, po.value.passed) == (1, 2)
    with pytest.raises(ce.NotPassing) as np_:  # including a failed one
        r.finalize(0, [a, b, failed])
    assert np_.value.trainer == failed.address
    outsider = fresh.accounts[OUTSIDER]
    with pytest.raises(ce.NotPassing):  # including someone who never took part
        r.coord.finalize(rid, 0, "m", keccak(b"m"), [a.address, b.address, outsider])
    dup = raw_revert(lambda: r.coord.contract.functions.finalize(
        rid, 0, "m", keccak(b"m"), [a.address, a.address, b.address]).call({"from": fresh.accounts[COORD]}))
    assert isinstance(dup, ce.NotSorted) and dup.index == 1  # counting one passing trainer twice
    with pytest.raises(ce.NotCoordinator):
        a.chain.finalize(rid, 0, "m", keccak(b"m"), [a.address, b.address])
    assert r.finalize(0, [a, b]) == {failed.address: FAILED_AUDIT}
    with pytest.raises(ce.WrongPhase) as wp:  # finalizing twice
        r.finalize(0, [a, b])
    assert wp.value.actual == Phase.FINALIZED


def test_coordinator_past_its_deadline_is_settled_without_a_model(fresh: PyEvmNet) -> None:
    r = make_run(fresh, n_trainers=1, n_verifiers=2, quorum=2)
    t = r.trainers[0]
    r.open_epoch(0)
    r.judge(0, t, [True, True])
    r.reveal_verdicts(0)
    r.net.advance(3 * WINDOW + 1)
    with pytest.raises(ce.WrongPhase) as wp:
        r.finalize(0, [t])
    assert wp.value.actual == Phase.ABORTED
    r.net.chain(OUTSIDER).settle(r.run_id, 0)
    st = r.coord.epoch_status(r.run_id, 0)
    assert st.phase == Phase.ABORTED and st.model_cid == ""


def test_contract_accepts_any_model_digest(fresh: PyEvmNet) -> None:
    """Known gap: `finalize` cannot check the aggregate; verifiers recompute it off-chain (alarm only)."""
    r = make_run(fresh, n_trainers=1, n_verifiers=2, quorum=2)
    t = r.trainers[0]
    r.open_epoch(0)
    r.judge(0, t, [True, True])
    r.reveal_verdicts(0)
    r.coord.finalize(r.run_id, 0, "bafkreinotthemean", keccak(b"whatever the coordinator likes"), [t.address])
    assert r.coord.epoch_times(r.run_id, 0).model_digest == keccak(b"whatever the coordinator likes")


# ---------------------------------------------------------------- anyone


def test_calls_out_of_phase_are_rejected(fresh: PyEvmNet) -> None:
    r = make_run(fresh, n_trainers=2, n_verifiers=2, quorum=2, unbonding_delay=50)
    rid = r.run_id
    a, b = r.trainers
    v = r.verifiers[0]
    with pytest.raises(ce.UnknownRun):
        a.chain.commit(rid + 7, 0, keccak(b"x"))
    with pytest.raises(ce.ZeroCommitment):
        a.chain.commit(rid, 0, bytes(32))
    with pytest.raises(ce.WrongPhase) as wp:
        a.reveal(0)
    assert (wp.value.actual, wp.value.expected) == (Phase.NOT_STARTED, Phase.REVEALING)
    a.commit(0)
    with pytest.raises(ce.AlreadyCommitted):
        a.commit(0)
    with pytest.raises(ce.EpochNotOpen):
        a.commit(1)
    with pytest.raises(ce.WrongPhase):
        a.reveal(0)  # still committing
    with pytest.raises(ce.WrongPhase):
        r.coord.start_audit(rid, 0)
    b.commit(0)
    a.reveal(0)
    with pytest.raises(ce.AlreadyRevealed):
        a.reveal(0)
    with pytest.raises(ce.WrongPhase) as rp:
        a.respond(0)  # b has not revealed: the audit has not started
    assert rp.value.actual == Phase.REVEALING
    b.reveal(0)
    with pytest.raises(ce.AuditSeedPending):  # nothing to judge before the seed: no verdict commitment
        v.commit_verdicts(rid, 0, [(a.address, True, bytes(32))], SALT)
    a.respond(0)
    with pytest.raises(ce.AlreadyResponded):
        a.respond(0)
    with pytest.raises(ce.NotExpired):
        r.coord.settle(rid, 0)
    with pytest.raises(ce.NotLeaving):
        a.chain.withdraw(rid)
    a.chain.leave(rid)
    with pytest.raises(ce.StillBonded):
        a.chain.withdraw(rid)
    r.net.advance(51)
    with pytest.raises(ce.EpochNotSettled) as ns:  # its epoch may still slash it
        a.chain.withdraw(rid)
    assert ns.value.epoch == 0
    with pytest.raises(ce.NothingToWithdraw):
        r.coord.claim()


# ---------------------------------------------------------------- reentrancy


def _attacker(net: PyEvmNet) -> Any:
    art = json.loads((HERE / "reenter.json").read_text())
    import hashlib

    src = (HERE / "Reenter.sol").read_bytes()
    assert hashlib.sha256(src).hexdigest() == art["sourceSha256"], "rebuild: node tests/security/build_reenter.js"
    factory = net.w3.eth.contract(abi=art["abi"], bytecode=art["bytecode"])
    tx = factory.constructor(to_checksum_address(net.address)).transact({"from": net.accounts[OUTSIDER]})
    address = net.w3.eth.wait_for_transaction_receipt(tx)["contractAddress"]
    return net.w3.eth.contract(address=address, abi=art["abi"])


@pytest.mark.parametrize("reenter", ["withdraw", "claim"])
def test_reentrancy_through_withdraw_is_refused(fresh: PyEvmNet, reenter: str) -> None:
    """A contract trainer re-enters from its receive(): the guard reverts the nested call, so it is
    paid once and the books still balance."""
    r = make_run(fresh, n_trainers=1, n_verifiers=1, quorum=1, unbonding_delay=10)
    rid, veri = r.run_id, r.coord.contract
    attacker = _attacker(fresh)
    me = {"from": fresh.accounts[OUTSIDER]}
    attacker.functions.exec(HexBytes(veri.encode_abi("joinTrainer", args=[rid]))).transact({**me, "value": STAKE})
    assert r.coord.member(rid, attacker.address).role == 1
    attacker.functions.exec(HexBytes(veri.encode_abi("leaveRun", args=[rid]))).transact(me)
    nested = veri.encode_abi("withdraw", args=[rid]) if reenter == "withdraw" else veri.encode_abi("claim", args=[])
    attacker.functions.setReentry(HexBytes(nested)).transact(me)
    fresh.advance(11)
    before = fresh.w3.eth.get_balance(attacker.address)
    attacker.functions.exec(HexBytes(veri.encode_abi("withdraw", args=[rid]))).transact(me)
    assert fresh.w3.eth.get_balance(attacker.address) - before == STAKE  # paid exactly once
    assert attacker.functions.received().call() == 1
    assert attacker.functions.reentryOk().call() is False
    err = decode_revert(bytes(attacker.functions.reentryResult().call()))
    assert isinstance(err, ce.Reentrancy)
    staked, credits = r.coord.totals()
    assert r.coord.balance() == staked + credits == STAKE + 2 * VSTAKE  # the honest trainer's, verifier's, coordinator's


def test_leaving_does_not_dodge_a_slash(fresh: PyEvmNet) -> None:
    """A cheater that leaves right after answering cannot withdraw before its epoch is judged."""
    r = make_run(fresh, n_trainers=2, n_verifiers=2, quorum=2, unbonding_delay=10)
    rid = r.run_id
    honest, cheat = r.trainers
    r.open_epoch(0)
    cheat.chain.leave(rid)
    r.net.advance(11)  # unbonded, but epoch 0 is still auditing
    with pytest.raises(ce.EpochNotSettled) as ns:
        cheat.chain.withdraw(rid)
    assert ns.value.epoch == 0
    r.judge(0, honest, [True, True])
    r.judge(0, cheat, [False, False])
    r.reveal_verdicts(0)
    assert r.finalize(0, [honest]) == {cheat.address: FAILED_AUDIT}
    res = cheat.chain.withdraw(rid)
    assert [e.args["amount"] for e in res.events if e.name == "Withdrawn"] == [STAKE // 2]


def test_the_last_revealer_cannot_predict_its_audit_sample(fresh: PyEvmNet) -> None:
    """A lazy trainer (half its transitions forged) reveals last and tries to time the startAudit that
    schedules the seed for a favourable sample. Under the old seed rule (prevrandao and parent hash
    of the closing block, both public a block early) it found one within a few blocks; now the seed
    hashes the scheduling block itself, which does not exist when the call is signed, so the best it
    can compute beforehand (the same rule over the newest block it sees) is not the seed."""
    r = make_run(fresh, n_trainers=2, n_verifiers=1, quorum=1, audit_steps=2)
    rid, c = r.run_id, r.coord
    honest, grinder = r.trainers
    forged = {0, 1, 2, 3}  # of the 8 transitions of a 9-leaf trace: escape chance 1/4 per honest draw
    honest.commit(0)
    grinder.commit(0)
    honest.reveal(0)
    grinder.reveal(0)  # reveals close; nothing is scheduled yet
    tries = 0
    while True:
        newest = bytes(fresh.w3.eth.get_block("latest")["hash"])
        predicted = audit_seed(newest, c.chain_id, c.address, rid, 0)
        if not forged & set(challenged_steps(predicted, grinder.address, 2, grinder.leaves)) or tries == 40:
            break
        fresh.advance(1)  # one more block, well inside the reveal window
        tries += 1
    closing = grinder.chain.start_audit(rid, 0)
    assert not c.epoch_times(rid, 0).seeded  # scheduled, not fixed, by the first startAudit
    actual = c.fix_audit_seed(rid, 0)
    own_block = bytes(fresh.w3.eth.get_block(closing.block_number)["hash"])
    assert actual == audit_seed(own_block, c.chain_id, c.address, rid, 0)
    assert actual != predicted, f"the closing revealer predicted the audit seed after {tries} blocks of waiting"


def test_the_verifier_list_is_frozen_between_scheduling_and_fixing_the_seed(fresh: PyEvmNet) -> None:
    """Once reveals close the seed block's hash is public before the seed is fixed: a verifier that
    joins or leaves in between must not change whom the audit assigns."""
    r = make_run(fresh, n_trainers=2, n_verifiers=3, quorum=2)
    rid, c = r.run_id, r.coord
    for t in r.trainers:
        t.commit(0)
    for t in r.trainers:
        t.reveal(0)
    c.start_audit(rid, 0)  # schedules: the seed block's hash is public from here until it is fixed
    _, before = c.participants(rid)
    fresh.chain(VERIFIERS[3]).join_verifier(rid)  # appended past the frozen count
    r.verifiers[0].leave(rid)  # waits: removing it would move the last entry into its place
    _, during = c.participants(rid)
    assert during[:3] == before and c.epoch_times(rid, 0).verifier_count == 3
    seed = c.fix_audit_seed(rid, 0)
    assert seed is not None
    for t in r.trainers:
        assert list(c.assignment(rid, 0, t.address).verifiers) == assigned_verifiers(seed, t.address, before, 2)


def _finalize_gas(net: PyEvmNet, idle: int) -> int:
    """Gas of finalizing a one-trainer epoch in a fresh run that `idle` passers-by joined and left first."""
    coord = net.chain(COORD)
    rid = coord.create_run(params(net.accounts[COORD], quorum=1, unbonding_delay=0))
    coord.stake_coordinator(rid)
    for k in range(idle):
        passer = net.chain(2 + k)
        passer.join_trainer(rid)
        passer.leave(rid)
        passer.withdraw(rid)
    t = Trainer(net.chain(1), rid)
    t.chain.join_trainer(rid)
    v = net.chain(len(net.accounts) - 1)
    v.join_verifier(rid)
    t.commit(0)
    t.reveal(0)
    t.respond(0)
    verdicts = [(t.address, True, keccak(b"witness"))]
    v.commit_verdicts(rid, 0, verdicts, SALT)
    v.submit_verdicts(rid, 0, verdicts, SALT)
    assert coord.run_info(rid).trainer_slots == 1  # each passer's slot went back to the free list
    return coord.finalize(rid, 0, "m", keccak(b"m"), [t.address]).gas_used


def test_finalize_cost_does_not_grow_with_departed_trainers(fresh: PyEvmNet) -> None:
    """Slot inflation (A5): join, leave and withdraw with fresh addresses over and over. Withdrawn
    slots are handed out again, so finalize scans the run's peak membership, not its history."""
    base = _finalize_gas(fresh, 0)
    grown = _finalize_gas(fresh, 8)
    assert grown - base < 1_000, f"8 departed trainers add {grown - base} gas to every finalize of the run"


# ---------------------------------------------------------------- V3: lazy verifiers


def test_a_lazy_verifier_is_slashed_even_when_everyone_is_honest(fresh: PyEvmNet) -> None:
    """V3, q = 3: every trainer is honest and every vote is "pass", but one verifier posts a witness
    it did not compute (zero). The majority witness convicts it: slashed, no bounty, off the list."""
    r = make_run(fresh, n_trainers=2, n_verifiers=4, quorum=3)
    a, b = r.trainers
    r.open_epoch(0)
    lazy = r.assigned(0, a)[1].sender
    pretended = 0
    for t in (a, b):
        assigned = [v.sender for v in r.assigned(0, t)]
        pretended += lazy in assigned  # 3 of 4 verifiers judge each trainer: b's draw may leave it out
        r.judge(0, t, [True] * 3, [bytes(32) if v == lazy else r.witness(0, t) for v in assigned])
    r.reveal_verdicts(0)
    assert r.coord.submission(r.run_id, 0, a.address).passed  # its vote agrees: it still counts as cast
    assert r.finalize(0, [a, b]) == {}
    slashes = [e.args["verifier"] for e in r.coord.events(["VerifierSlashed"], run_id=r.run_id, epoch=0)]
    assert slashes == [lazy] * pretended  # once per trainer it pretended to replay
    assert r.coord.member(r.run_id, lazy).stake == VSTAKE // 2**pretended and r.coord.member(r.run_id, lazy).leave_epoch == 1
    assert r.coord.totals()[1] == 0  # burned, nobody credited
    for v in r.verifiers:
        if v.sender != lazy:
            assert r.coord.member(r.run_id, v.sender).stake == VSTAKE
    r.open_epoch(1)
    assert lazy not in r.coord.participants(r.run_id)[1]


def test_a_lying_reference_witness_is_outvoted_by_the_two_that_agree(fresh: PyEvmNet) -> None:
    """V3: the first revealed witness is only the first group; with q = 3 a liar that reveals first
    is the odd one when the other two agree with each other, and it alone is slashed."""
    r = make_run(fresh, n_trainers=1, n_verifiers=3, quorum=3)
    t = r.trainers[0]
    rid = r.run_id
    r.open_epoch(0)
    liar, h1, h2 = r.assigned(0, t)
    good = r.witness(0, t)
    votes = {liar.sender: [(t.address, True, keccak(b"made up"))]}
    votes |= {v.sender: [(t.address, True, good)] for v in (h1, h2)}
    for v in (liar, h1, h2):
        v.commit_verdicts(rid, 0, votes[v.sender], SALT)
    for v in (liar, h1, h2):  # the liar's witness becomes the first (reference) group
        v.submit_verdicts(rid, 0, votes[v.sender], SALT)
    assert r.finalize(0, [t]) == {}
    assert _verifier_slashes(r, 0) == {liar.sender: t.address}


def test_witness_groups_sort_five_verifiers_in_any_reveal_order(fresh: PyEvmNet) -> None:
    """V3 with q = 5 and three witnesses: the first revealed (a liar) is group 0, the others are
    filed into groups 1 and 2; the witness three of five share is the majority, both liars are slashed."""
    r = fixture_run(fresh, [1], [6, 7, 8, 9, 10], COORD, quorum=5)
    t = r.trainers[0]
    rid = r.run_id
    r.open_epoch(0)
    vs = r.assigned(0, t)
    good = r.witness(0, t)
    ws = [keccak(b"liar one"), good, good, keccak(b"liar two"), good]
    for v, w in zip(vs, ws):
        v.commit_verdicts(rid, 0, [(t.address, True, w)], SALT)
    for v, w in zip(vs, ws):  # reveal in assignment order: the first liar becomes group 0
        v.submit_verdicts(rid, 0, [(t.address, True, w)], SALT)
    assert r.finalize(0, [t]) == {}
    assert _verifier_slashes(r, 0) == {vs[0].sender: t.address, vs[3].sender: t.address}


def test_a_witness_minority_that_fails_an_honest_trainer_earns_no_bounty(fresh: PyEvmNet) -> None:
    """V3 with a cheater: the two honest verifiers fail it with the majority witness and share its
    stake; a third that also fails it without replaying (zero witness) is slashed and paid nothing."""
    r = make_run(fresh, n_trainers=2, n_verifiers=3, quorum=3)
    honest, cheat = r.trainers
    r.open_epoch(0)
    lazy = r.assigned(0, cheat)[2].sender
    r.judge(0, honest, [True] * 3)
    r.judge(0, cheat, [False] * 3, [r.witness(0, cheat)] * 2 + [bytes(32)])
    r.reveal_verdicts(0)
    assert r.finalize(0, [honest]) == {cheat.address: FAILED_AUDIT}
    assert _verifier_slashes(r, 0) == {lazy: cheat.address}
    paid = [v.sender for v in r.assigned(0, cheat)[:2]]
    assert all(r.coord.credits(v) == STAKE // 4 for v in paid) and r.coord.credits(lazy) == 0


def test_verdict_reveals_wait_for_every_commitment_or_half_the_window(fresh: PyEvmNet) -> None:
    """Reveals open when every verifier of the frozen list committed (an unassigned one commits an
    empty list) or at responseDeadline + verdictWindow / 2; the commitment is the pure helper's."""
    r = make_run(fresh, n_trainers=1, n_verifiers=3, quorum=2)
    t = r.trainers[0]
    rid = r.run_id
    r.open_epoch(0)
    v1, v2 = r.assigned(0, t)
    idle = next(v for v in r.verifiers if v.sender not in (v1.sender, v2.sender))
    mine = [(t.address, True, r.witness(0, t))]
    v1.commit_verdicts(rid, 0, mine, SALT)
    v2.commit_verdicts(rid, 0, mine, SALT)
    with pytest.raises(ce.VerdictsNotOpen) as no:
        v1.submit_verdicts(rid, 0, mine, SALT)
    assert (no.value.commits, no.value.verifier_count) == (2, 3)
    with pytest.raises(ce.RevealMismatch) as rm:  # checked only once open: so open it by time
        fresh.advance(WINDOW + WINDOW // 2 + 1)  # past the response deadline + half the verdict window
        v1.submit_verdicts(rid, 0, mine, keccak(b"another salt"))
    assert rm.value.actual == v1.verdict_commitment_for(rid, 0, mine, keccak(b"another salt"))
    assert int.from_bytes(rm.value.expected, "big") == int.from_bytes(v1.verdict_commitment_for(rid, 0, mine, SALT)[4:], "big")
    with pytest.raises(ce.VerdictCommitsClosed):
        idle.commit_verdicts(rid, 0, [], SALT)
    v1.submit_verdicts(rid, 0, mine, SALT)
    v2.submit_verdicts(rid, 0, mine, SALT)
    assert r.coord.submission(rid, 0, t.address).passed
    with pytest.raises(ce.NotCommitted):
        idle.submit_verdicts(rid, 0, [], SALT)
