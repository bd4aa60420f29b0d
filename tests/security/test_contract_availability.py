"""T17 on-chain: a payload nobody can produce is judged by an availability committee (py-evm).

A passing trainer that withholds its payload while the verifiers that passed it keep no copy would
stall its epoch. Any staked member reports it; the trainer's availability committee, q verifiers drawn
from the hash of the report's block among those not assigned to the trainer and not the reporter,
votes. "Unavailable" takes all q votes and slashes the trainer and its pass voters; "available" takes a
majority and slashes the reporter, unless a pass voter put the payload back during the vote. Where no
such committee can be formed the report is refused and nobody is slashed (docs/protocol.md §10.2,
docs/security.md §10.1).
"""

from __future__ import annotations

from typing import Any

import pytest
from eth_abi import encode

from protocol.chain import errors as ce
from protocol.chain.binding import assigned_verifiers
from protocol.digest import keccak
from tests.fixtures.chain import SALT, PyEvmNet, Run, make_run
from tests.fixtures.chain import assert_books as books

pytestmark = pytest.mark.integration

COORD, TRAINERS, VERIFIERS, OUTSIDER = 0, [1, 2], [3, 4, 5, 6, 7, 8, 9], 10
UNAVAILABLE, FALSE_REPORT = 4, 5  # Slashed reasons (Veriloco.SLASH_*)


@pytest.fixture
def fresh() -> Any:
    net = PyEvmNet(accounts=12)
    yield net
    net.close()


def audited_run(net: PyEvmNet, verifiers: list[int] = VERIFIERS, **over: Any) -> Run:
    """Quorum 3 of 7 verifiers: every trainer passed by its 3; a committee of 3 comes from the other 4."""
    r = make_run(net, TRAINERS, verifiers, COORD, quorum=3, **over)
    r.open_epoch(0)
    r.judge_all(0)
    return r


def expected_committee(r: Run, epoch: int, trainer: str, report_block: int) -> list[str]:
    """The committee recomputed off-chain from the report block's hash (the contract's rule)."""
    c = r.coord
    t = c.epoch_times(r.run_id, epoch)
    frozen = c.participants(r.run_id)[1][: t.verifier_count]
    h = bytes(r.net.w3.eth.get_block(report_block)["hash"])
    key = keccak(encode(["bytes32", "bytes32", "string"], [bytes(t.seed), h, "availability"]))
    draw = assigned_verifiers(key, trainer, frozen, min(16, len(frozen)))
    skip = set(c.assignment(r.run_id, epoch, trainer).verifiers) | {c.availability(r.run_id, epoch, trainer).reporter}
    return [v for v in draw if v not in skip][:3]


def test_a_payload_nobody_can_produce_gets_its_trainer_and_passers_slashed(fresh: PyEvmNet) -> None:
    r = audited_run(fresh, reward_pool=10**18, trainer_reward=10**15, verifier_reward=10**14)
    c, rid = r.coord, r.run_id
    withholder, honest = r.trainers
    passers = {v.sender for v in r.assigned(0, withholder)}
    tx = c.report_unavailable(rid, 0, withholder.address)
    assert c.availability(rid, 0, withholder.address).committee == []  # drawn once the report's block is past
    fresh.advance(1)
    a = c.availability(rid, 0, withholder.address)
    assert a.reporter == c.sender and a.decision is None
    # drawn from the hash of the report's own block: nobody knew it when the report was sent
    assert list(a.committee) == expected_committee(r, 0, withholder.address, tx.block_number)
    assert len(a.committee) == 3 and not passers & set(a.committee)
    with pytest.raises(ce.PassingOmitted):  # still passing until the committee decides
        c.finalize(rid, 0, "bafkreimodel", b"\x11" * 32, [honest.address])
    for v in a.committee[:2]:  # two of three is a majority, but not enough to slash
        res = r.verifier(v).vote_availability(rid, 0, withholder.address, False)
        assert [e.name for e in res.events] == ["AvailabilityVoted"]
    stake_before = c.member(rid, withholder.address).stake
    res = r.verifier(a.committee[2]).vote_availability(rid, 0, withholder.address, False)
    names = [e.name for e in res.events]
    assert "AvailabilityDecided" in names
    slashed = {e.args["trainer"]: e.args["reason"] for e in res.events if e.name == "Slashed"}
    assert slashed == {withholder.address: UNAVAILABLE}
    assert {e.args["verifier"] for e in res.events if e.name == "VerifierSlashed"} == passers
    amount = stake_before - c.member(rid, withholder.address).stake
    assert [c.credits(v) for v in a.committee] == [amount // 3] * 3  # the voters that did the fetching
    assert c.availability(rid, 0, withholder.address).decision is False
    assert not c.submission(rid, 0, withholder.address).passed
    with pytest.raises(ce.NotPassing):
        c.finalize(rid, 0, "bafkreimodel", b"\x11" * 32, [withholder.address, honest.address])
    res = c.finalize(rid, 0, "bafkreimodel", b"\x11" * 32, [honest.address])
    assert [e.args["reason"] for e in res.events if e.name == "Slashed"] == []  # slashed once per offence
    paid = next(e.args for e in res.events if e.name == "RewardsPaid")
    assert paid["trainers"] == 1 and paid["votes"] == 3  # votes on the withheld payload earn nothing
    books(c)


def test_a_false_report_costs_the_reporter(fresh: PyEvmNet) -> None:
    r = audited_run(fresh)
    c, rid = r.coord, r.run_id
    t = r.trainers[0]
    reporter = r.trainers[1].chain  # any staked member may report
    reporter.report_unavailable(rid, 0, t.address)
    fresh.advance(1)
    a = c.availability(rid, 0, t.address)
    before = c.member(rid, reporter.sender).stake
    r.verifier(a.committee[0]).vote_availability(rid, 0, t.address, False)  # one liar changes nothing
    for v in a.committee[1:]:
        res = r.verifier(v).vote_availability(rid, 0, t.address, True)
    slashed = [(e.args["trainer"], e.args["reason"]) for e in res.events if e.name == "Slashed"]
    assert slashed == [(reporter.sender, FALSE_REPORT)]
    amount = before - c.member(rid, reporter.sender).stake
    assert amount > 0 and [c.credits(v) for v in a.committee] == [0] + [amount // 2] * 2
    assert c.availability(rid, 0, t.address).decision is True
    assert c.submission(rid, 0, t.address).passed
    r.finalize(0, r.trainers)  # kept in the aggregate
    books(c)


def test_who_may_report_and_vote(fresh: PyEvmNet) -> None:
    r = make_run(fresh, TRAINERS, VERIFIERS, COORD, quorum=3)
    c, rid = r.coord, r.run_id
    t, other = r.trainers
    r.open_epoch(0, [t])  # `other` never responds: it is not passing
    r.judge(0, t, [True] * 3)
    r.reveal_verdicts(0)
    with pytest.raises(ce.NotStaked):
        fresh.chain(OUTSIDER).report_unavailable(rid, 0, t.address)
    with pytest.raises(ce.NotPassing):
        c.report_unavailable(rid, 0, other.address)
    assert c.availability(rid, 0, t.address).committee == []  # no report, no committee
    c.report_unavailable(rid, 0, t.address)
    with pytest.raises(ce.AlreadyReported):
        c.report_unavailable(rid, 0, t.address)
    fresh.advance(1)
    a = c.availability(rid, 0, t.address)
    with pytest.raises(ce.NotAssigned):  # a pass voter vouched for it: it does not judge it unavailable
        r.assigned(0, t)[0].vote_availability(rid, 0, t.address, False)
    outsider = next(v for v in r.verifiers if v.sender not in a.committee and v.sender not in
                    {x.sender for x in r.assigned(0, t)})
    with pytest.raises(ce.NotAssigned):
        outsider.vote_availability(rid, 0, t.address, False)
    r.verifier(a.committee[0]).vote_availability(rid, 0, t.address, True)
    with pytest.raises(ce.AlreadyVoted):
        r.verifier(a.committee[0]).vote_availability(rid, 0, t.address, False)
    r.verifier(a.committee[1]).vote_availability(rid, 0, t.address, False)
    r.verifier(a.committee[2]).vote_availability(rid, 0, t.address, False)  # 2 of 3: no unanimity, nothing decided
    assert c.availability(rid, 0, t.address).decision is None
    assert c.submission(rid, 0, t.address).passed
    books(c)


@pytest.mark.parametrize("n_verifiers", [3, 4, 6])
def test_a_verifier_cannot_report_where_no_independent_committee_exists(fresh: PyEvmNet, n_verifiers: int) -> None:
    """Issue 30 item 1: with V = q or q + 1 (and up to 2q) the committee used to be the lone dissenter
    or the one verifier not assigned. Now a verifier's report needs q others besides the trainer's q:
    it is refused, nobody is slashed, and the epoch finalizes with the honest trainer in it."""
    r = audited_run(fresh, VERIFIERS[:n_verifiers])
    c, rid = r.coord, r.run_id
    t = r.trainers[0]
    attacker = next(v for v in r.verifiers if v.sender not in {x.sender for x in r.assigned(0, t)}) \
        if n_verifiers > 3 else r.verifiers[0]
    with pytest.raises(ce.TooFewVerifiers) as err:
        attacker.report_unavailable(rid, 0, t.address)
    assert (err.value.have, err.value.need) == (n_verifiers, 7)
    assert r.finalize(0, r.trainers) == {}
    assert all(c.member(rid, v.sender).stake == c.run_info(rid).params.verifier_stake for v in r.verifiers)
    assert c.totals()[1] == 0 and c.total_burned() == 0
    books(c)


def test_two_colluding_verifiers_on_the_committee_cannot_slash(fresh: PyEvmNet) -> None:
    """Two of the three committee members lie "unavailable" about an honest, available payload; the
    third fetched it. No unanimity: nothing is decided, nobody is slashed or paid, the trainer stays."""
    r = audited_run(fresh)
    c, rid = r.coord, r.run_id
    t = r.trainers[0]
    reporter = next(v for v in r.verifiers if v.sender not in {x.sender for x in r.assigned(0, t)})
    reporter.report_unavailable(rid, 0, t.address)
    fresh.advance(1)
    com = c.availability(rid, 0, t.address).committee
    r.verifier(com[0]).vote_availability(rid, 0, t.address, False)
    r.verifier(com[1]).vote_availability(rid, 0, t.address, False)
    r.verifier(com[2]).vote_availability(rid, 0, t.address, True)
    assert c.availability(rid, 0, t.address).decision is None
    assert r.finalize(0, r.trainers) == {}
    assert c.totals()[1] == 0 and c.total_burned() == 0
    books(c)


def test_a_pass_voter_that_puts_the_payload_back_voids_the_report(fresh: PyEvmNet) -> None:
    """The report was true when made; a pass voter re-publishes and says so; the committee then fetches
    it: decided "available", and nobody (not the reporter either) is slashed."""
    r = audited_run(fresh)
    c, rid = r.coord, r.run_id
    t = r.trainers[0]
    c.report_unavailable(rid, 0, t.address)
    fresh.advance(1)
    keeper = r.assigned(0, t)[1]
    res = keeper.vote_availability(rid, 0, t.address, True)
    assert [e.name for e in res.events] == ["AvailabilityVoted"]
    com = c.availability(rid, 0, t.address).committee
    r.verifier(com[0]).vote_availability(rid, 0, t.address, True)
    res = r.verifier(com[1]).vote_availability(rid, 0, t.address, True)
    assert "AvailabilityDecided" in [e.name for e in res.events]
    assert [e for e in res.events if e.name == "Slashed"] == []
    assert c.availability(rid, 0, t.address).decision is True
    assert c.member(rid, c.sender).stake == c.run_info(rid).params.verifier_stake
    r.finalize(0, r.trainers)
    books(c)


def test_a_pending_verdict_reveal_survives_an_unavailable_decision(fresh: PyEvmNet) -> None:
    """Issue 30 item 2: a verifier that had not revealed yet when its trainer was judged unavailable
    reveals afterwards; the reveal stands (its other verdicts count), the late vote decides nothing."""
    r = make_run(fresh, TRAINERS, VERIFIERS, COORD, quorum=3)
    c, rid = r.coord, r.run_id
    w, x = r.trainers
    r.open_epoch(0)
    late = r.assigned(0, w)[2]
    r.judge(0, w, [True] * 3)
    r.judge(0, x, [False] * 3)  # x cheated: all three fail it
    queued = {a: list(v) for a, v in r.pending[0].items()}
    r.reveal_verdicts(0, reveal=frozenset(c.frozen_verifiers(rid, 0)) - {late.sender})
    assert c.submission(rid, 0, w.address).passed  # 2 of 3 pass votes
    c.report_unavailable(rid, 0, w.address)
    fresh.advance(1)
    for v in c.availability(rid, 0, w.address).committee:
        r.verifier(v).vote_availability(rid, 0, w.address, False)
    assert c.availability(rid, 0, w.address).decision is False
    before = c.submission(rid, 0, x.address).fail_votes
    late.submit_verdicts(rid, 0, queued[late.sender], SALT, "bafkreievidence")  # reverted before issue 30
    mine = sum(1 for t, _, _ in queued[late.sender] if t == x.address)
    assert c.submission(rid, 0, x.address).fail_votes == before + mine
    assert c.submission(rid, 0, w.address).pass_votes == 3 and not c.submission(rid, 0, w.address).passed
    slashed = r.finalize(0, [])
    assert slashed == {x.address: 3}  # the cheater is still slashed (SLASH_FAILED_AUDIT)
    books(c)


def test_a_late_joined_reporter_cannot_withdraw_before_its_report_is_judged(fresh: PyEvmNet) -> None:
    """Issue 46 item 9: a member that joined after an epoch (so no epoch it trained in holds its stake)
    reports a payload of that epoch falsely, leaves and waits out the unbonding: its withdrawal waits for
    the epoch to settle, the committee's "available" slashes it first, and it leaves with the rest."""
    r = audited_run(fresh)
    c, rid = r.coord, r.run_id
    late = fresh.chain(11)
    late.join_trainer(rid)  # joins while epoch 0 audits: its first epoch is 1
    assert c.member(rid, late.sender).join_epoch == 1
    t = r.trainers[0]
    late.report_unavailable(rid, 0, t.address)
    fresh.advance(1)
    late.leave(rid)
    fresh.advance(51)  # past the unbonding delay
    with pytest.raises(ce.EpochNotSettled) as ns:  # before the fix: paid out in full, the report never judged
        late.withdraw(rid)
    assert ns.value.epoch == 0
    a = c.availability(rid, 0, t.address)
    before = c.member(rid, late.sender).stake
    for v in a.committee[:2]:
        res = r.verifier(v).vote_availability(rid, 0, t.address, True)
    assert [(e.args["trainer"], e.args["reason"]) for e in res.events if e.name == "Slashed"] == [(late.sender, FALSE_REPORT)]
    left = c.member(rid, late.sender).stake
    assert 0 < left < before
    r.finalize(0, r.trainers)
    res = late.withdraw(rid)
    assert [e.args["amount"] for e in res.events if e.name == "Withdrawn"] == [left]
    books(c)
