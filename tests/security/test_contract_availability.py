"""T17 on-chain: a payload nobody can produce is judged by an availability committee (py-evm).

A passing trainer that withholds its payload while the verifiers that passed it keep no copy would
stall its epoch. Any staked member reports it; the trainer's availability committee (verifiers that
did not vouch for it) votes; "unavailable" slashes the trainer and its pass voters and lets the
epoch finalize without it, "available" slashes the reporter instead (docs/protocol.md §10.2).
"""

from __future__ import annotations

from typing import Any

import pytest

from protocol.chain import errors as ce
from protocol.chain.binding import Chain
from tests.fixtures.chain import PyEvmNet, Run, make_run

pytestmark = pytest.mark.integration

COORD, TRAINERS, VERIFIERS, OUTSIDER = 0, [1, 2], [3, 4, 5, 6, 7], 8
UNAVAILABLE, FALSE_REPORT = 4, 5  # Slashed reasons (Veriloco.SLASH_*)


def books(c: Chain) -> None:
    staked, credits = c.totals()
    assert c.balance() == staked + credits + c.total_burned() + c.total_pools()


def audited_run(net: PyEvmNet, **over: Any) -> Run:
    """Quorum 3 of 5 verifiers: every trainer passed by its 3, so its committee is the other 2."""
    r = make_run(net, TRAINERS, VERIFIERS, COORD, quorum=3, **over)
    r.open_epoch(0)
    r.judge_all(0)
    return r


def test_a_payload_nobody_can_produce_gets_its_trainer_and_passers_slashed(fresh: PyEvmNet) -> None:
    r = audited_run(fresh, reward_pool=10**18, trainer_reward=10**15, verifier_reward=10**14)
    c, rid = r.coord, r.run_id
    withholder, honest = r.trainers
    passers = {v.sender for v in r.assigned(0, withholder)}
    c.report_unavailable(rid, 0, withholder.address)
    a = c.availability(rid, 0, withholder.address)
    assert a.reporter == c.sender and a.decision is None
    assert len(a.committee) == 2 and not passers & set(a.committee)
    with pytest.raises(ce.PassingOmitted):  # still passing until the committee decides
        c.finalize(rid, 0, "bafkreimodel", b"\x11" * 32, [honest.address])
    first = r.verifier(a.committee[0]).vote_availability(rid, 0, withholder.address, False)
    assert [e.name for e in first.events] == ["AvailabilityVoted"]
    stake_before = c.member(rid, withholder.address).stake
    res = r.verifier(a.committee[1]).vote_availability(rid, 0, withholder.address, False)
    names = [e.name for e in res.events]
    assert "AvailabilityDecided" in names
    slashed = {e.args["trainer"]: e.args["reason"] for e in res.events if e.name == "Slashed"}
    assert slashed == {withholder.address: UNAVAILABLE}
    assert {e.args["verifier"] for e in res.events if e.name == "VerifierSlashed"} == passers
    amount = stake_before - c.member(rid, withholder.address).stake
    assert [c.credits(v) for v in a.committee] == [amount // 2] * 2  # the voters that did the fetching
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
    a = c.availability(rid, 0, t.address)
    before = c.member(rid, reporter.sender).stake
    for v in a.committee:
        res = r.verifier(v).vote_availability(rid, 0, t.address, True)
    slashed = [(e.args["trainer"], e.args["reason"]) for e in res.events if e.name == "Slashed"]
    assert slashed == [(reporter.sender, FALSE_REPORT)]
    amount = before - c.member(rid, reporter.sender).stake
    assert amount > 0 and [c.credits(v) for v in a.committee] == [amount // 2] * 2
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
    a = c.availability(rid, 0, t.address)
    with pytest.raises(ce.NotReported):
        r.verifier(a.committee[0]).vote_availability(rid, 0, t.address, True)
    c.report_unavailable(rid, 0, t.address)
    with pytest.raises(ce.AlreadyReported):
        c.report_unavailable(rid, 0, t.address)
    with pytest.raises(ce.NotAssigned):  # a pass voter vouched for it: it does not judge itself
        r.assigned(0, t)[0].vote_availability(rid, 0, t.address, True)
    r.verifier(a.committee[0]).vote_availability(rid, 0, t.address, True)
    with pytest.raises(ce.AlreadyVoted):
        r.verifier(a.committee[0]).vote_availability(rid, 0, t.address, False)
    r.verifier(a.committee[1]).vote_availability(rid, 0, t.address, False)  # split: nothing decided
    assert c.availability(rid, 0, t.address).decision is None
    books(c)
