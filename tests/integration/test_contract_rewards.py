"""The reward pool on py-evm: funding, payouts at finalize, a pool running dry, aborted epochs.

A run's pool (createRun's value plus fundRun top-ups) pays each finalized epoch's included trainers
`trainerReward` and every verdict cast with the majority on a decided trainer `verifierReward`, as
claimable credits; pro rata when the pool cannot cover the epoch; nothing for an aborted epoch and
nothing to the creator or coordinator (docs/contract.md, "Rewards").
"""

from __future__ import annotations

from typing import Any

import pytest

from protocol.chain import errors as ce
from protocol.chain.binding import Chain
from tests.fixtures.chain import PyEvmNet, Run, make_run, params
from tests.fixtures.chain import assert_books as assert_accounted

pytestmark = pytest.mark.integration

COORD = 0
TRAINERS = [1, 2, 3]
VERIFIERS = [4, 5, 6]
OUTSIDER = 11
R_T = 10**15  # trainer reward (wei per epoch)
R_V = 10**14  # verifier reward (wei per majority verdict)


def rewarded_run(net: PyEvmNet, pool: int, **over: Any) -> Run:
    """Quorum 3 with 3 verifiers: every verifier judges every trainer, so the vote counts are fixed."""
    return make_run(net, TRAINERS, VERIFIERS, COORD, reward_pool=pool, quorum=3, trainer_reward=R_T,
                    verifier_reward=R_V, **over)


def credits(r: Run) -> dict[str, int]:
    return {a: r.coord.credits(a) for a in r.net.accounts}


def test_finalize_pays_included_trainers_and_majority_voters(fresh: PyEvmNet) -> None:
    pool = 10**18
    r = rewarded_run(fresh, pool)
    c, rid = r.coord, r.run_id
    assert c.run_info(rid).pool == pool == c.total_pools()
    assert_accounted(c)
    r.open_epoch(0)
    t0, t1, t2 = r.trainers
    r.judge(0, t0, [True, True, False])  # the third voter is outvoted: slashed, no reward for that vote
    r.judge(0, t1, [True, True, True])
    r.judge(0, t2, [False, False, False])  # failed: its voters earn the reward and the bounty
    dissenter = r.assigned(0, t0)[2].sender
    r.reveal_verdicts(0)
    before = credits(r)
    res = c.finalize(rid, 0, "bafkreimodel", b"\x11" * 32, [t0.address, t1.address])
    paid_ev = [e.args for e in res.events if e.name == "RewardsPaid"]
    assert paid_ev == [{"runId": rid, "epoch": 0, "trainers": 2, "votes": 8, "paid": 2 * R_T + 8 * R_V,
                        "poolLeft": pool - 2 * R_T - 8 * R_V}]
    bounty = {e.args["trainer"]: e.args["amount"] for e in res.events if e.name == "Slashed"}[t2.address] // 3
    after = credits(r)
    gain = {a: after[a] - before[a] for a in after}
    assert gain[t0.address] == gain[t1.address] == R_T and gain[t2.address] == 0
    for v in r.verifiers:
        majority_votes = 3 if v.sender != dissenter else 2
        assert gain[v.sender] == majority_votes * R_V + bounty, v.sender
    assert gain[fresh.accounts[COORD]] == 0
    assert c.run_info(rid).pool == pool - 2 * R_T - 8 * R_V
    assert_accounted(c)
    # a trainer claims its reward like any credit
    bal = fresh.w3.eth.get_balance(t0.address)
    claim = t0.chain.claim()
    assert claim.events[0].args["amount"] == R_T and c.credits(t0.address) == 0
    assert fresh.w3.eth.get_balance(t0.address) > bal
    assert_accounted(c)


def test_pool_running_dry_pays_the_rest_pro_rata_then_nothing(fresh: PyEvmNet) -> None:
    owed = 3 * R_T + 9 * R_V  # three passing trainers, nine majority verdicts
    pool = owed // 2 + 7  # not a round fraction: rounding stays in the pool
    r = rewarded_run(fresh, pool)
    c, rid = r.coord, r.run_id
    r.open_epoch(0)
    r.judge_all(0)
    r.finalize(0, r.trainers)
    share_t, share_v = R_T * pool // owed, 3 * R_V * pool // owed
    assert [c.credits(t.address) for t in r.trainers] == [share_t] * 3
    assert [c.credits(v.sender) for v in r.verifiers] == [share_v] * 3
    left = pool - 3 * share_t - 3 * share_v
    assert c.run_info(rid).pool == left and 0 <= left < 6  # at most one wei of rounding per earner
    assert_accounted(c)
    # the dust left is paid out the same way; an empty pool never blocks a finalize
    r.open_epoch(1)
    r.judge_all(1)
    r.finalize(1, r.trainers)
    dust_t, dust_v = R_T * left // owed, 3 * R_V * left // owed
    assert [c.credits(t.address) for t in r.trainers] == [share_t + dust_t] * 3
    left -= 3 * dust_t + 3 * dust_v
    assert c.run_info(rid).pool == left
    # anyone may top the pool up; the next epoch pays in full again
    res = fresh.chain(OUTSIDER).fund_run(rid, owed)
    assert res.events[0].name == "RunFunded" and res.events[0].args["pool"] == left + owed
    r.open_epoch(2)
    r.judge_all(2)
    r.finalize(2, r.trainers)
    assert [c.credits(t.address) for t in r.trainers] == [share_t + dust_t + R_T] * 3
    assert c.run_info(rid).pool == left
    assert_accounted(c)


def test_aborted_epoch_pays_nothing(fresh: PyEvmNet) -> None:
    pool = 10**18
    r = rewarded_run(fresh, pool)
    c, rid = r.coord, r.run_id
    r.open_epoch(0)
    r.judge_all(0)  # everyone passed, but nobody finalizes: the epoch expires
    fresh.advance(1_000)
    res = fresh.chain(OUTSIDER).settle(rid, 0)
    assert "RewardsPaid" not in [e.name for e in res.events]
    assert all(v == 0 for v in credits(r).values())
    assert c.run_info(rid).pool == pool == c.total_pools()
    assert_accounted(c)


def test_creator_and_coordinator_earn_nothing_from_the_pool(fresh: PyEvmNet) -> None:
    """Neither may train in its run (nor verify: test_contract_soundness), so neither earns from it."""
    creator = fresh.chain(OUTSIDER)
    rid = creator.create_run(params(fresh.accounts[COORD], quorum=3, trainer_reward=R_T, verifier_reward=R_V),
                             reward_pool=10**18)
    for who in (creator, fresh.chain(COORD)):
        with pytest.raises(ce.ConflictOfInterest):
            who.join_trainer(rid)
    assert_accounted(creator)


def test_funding_rules(fresh: PyEvmNet) -> None:
    c = fresh.chain(COORD)
    r = make_run(fresh, TRAINERS, VERIFIERS, COORD)  # no rewards, no pool: nothing changes for such runs
    assert c.run_info(r.run_id).pool == 0 and c.total_pools() == 0
    with pytest.raises(ce.BadFunding) as e:
        fresh.chain(OUTSIDER).fund_run(r.run_id, 0)
    assert (e.value.run_id, e.value.amount, e.value.pool, e.value.maximum) == (r.run_id, 0, 0, 2**128 - 1)
    with pytest.raises(ce.UnknownRun):
        fresh.chain(OUTSIDER).fund_run(99, 1)
    with pytest.raises(ce.InvalidParams) as e2:
        c.create_run(params(fresh.accounts[COORD], trainer_reward=2**96))
    assert "rewards" in e2.value.reason
    fresh.chain(OUTSIDER).fund_run(r.run_id, 5)
    assert c.run_info(r.run_id).pool == 5 == c.total_pools()
    r.open_epoch(0)
    r.judge_all(0)
    r.finalize(0, r.trainers)  # rewards are 0: the pool stays
    assert c.run_info(r.run_id).pool == 5
    assert all(c.credits(t.address) == 0 for t in r.trainers)
    assert_accounted(c)


def test_an_exactly_spent_pool_leaves_finalize_working(fresh: PyEvmNet) -> None:
    owed = 3 * R_T + 9 * R_V
    r = rewarded_run(fresh, owed)  # exactly one epoch's rewards
    c, rid = r.coord, r.run_id
    r.open_epoch(0)
    r.judge_all(0)
    r.finalize(0, r.trainers)
    assert c.run_info(rid).pool == 0 == c.total_pools()
    r.open_epoch(1)
    r.judge_all(1)
    res = c.finalize(rid, 1, "bafkreimodel", b"\x33" * 32, [t.address for t in r.trainers])
    assert "RewardsPaid" not in [e.name for e in res.events]
    assert [c.credits(t.address) for t in r.trainers] == [R_T] * 3
    assert [c.credits(v.sender) for v in r.verifiers] == [3 * R_V] * 3
    assert_accounted(c)


def test_an_unfunded_key_is_told_how_much_to_send(fresh: PyEvmNet) -> None:
    """Issue 46 item 9: a key without the stake and gas got the node's raw "insufficient funds" JSON-RPC error
    in wei; now one line naming its balance and the ETH to send it, rounded up, nothing sent."""
    from eth_account import Account

    rid = fresh.chain(0).create_run(params(fresh.accounts[0]))
    poor = Account.create()
    c = Chain(fresh.w3, fresh.address, "0x" + bytes(poor.key).hex())
    with pytest.raises(ce.InsufficientFunds) as got:
        c.join_trainer(rid)
    msg = str(got.value)
    assert f"{poor.address} holds 0 ETH" in msg and "send at least" in msg and msg.endswith(f"ETH to {poor.address}")
    assert fresh.chain(0).member(rid, poor.address).role == 0
