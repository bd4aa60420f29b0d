"""The contract's state machine, end to end through the Python binding, on py-evm and on anvil.

Each test runs twice: on in-process py-evm (eth-tester) and on a real anvil from npm. The chain is
snapshotted before and reverted after each test, so tests are independent. Reverts are asserted by
the exception named after the custom error, with its arguments.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from eth_utils import to_checksum_address

from protocol.chain import errors as ce
from protocol.chain.audit import RATE_SCAN
from protocol.chain.binding import (
    Chain,
    Phase,
    assigned_verifiers,
    audit_seed,
    build_response,
    challenged_steps,
    commitment,
    decode_revert,
    final_check,
    revert_data,
)
from protocol.digest import keccak
from tests.fixtures.chain import SALT, STAKE, VSTAKE, AnvilNet, PyEvmNet, Run, params
from tests.fixtures.chain import make_run as fixture_run

pytestmark = pytest.mark.integration

COORD = 0
TRAINERS = [1, 2, 3, 4, 5, 6]
VERIFIERS = [7, 8, 9, 10]
OUTSIDER = 11


@pytest.fixture(scope="module", params=["py-evm", "anvil"])
def net(request: pytest.FixtureRequest) -> Iterator[Any]:
    n = PyEvmNet() if request.param == "py-evm" else AnvilNet()
    try:
        yield n
    finally:
        n.close()


@pytest.fixture
def fresh(net: Any) -> Iterator[Any]:
    snap = net.snapshot()
    try:
        yield net
    finally:
        net.revert(snap)


def make_run(net: Any, n_trainers: int = 3, n_verifiers: int = 3, **over: Any) -> Run:
    return fixture_run(net, TRAINERS[:n_trainers], VERIFIERS[:n_verifiers], COORD, **over)


def phase(r: Run, epoch: int) -> Phase:
    return r.coord.epoch_status(r.run_id, epoch).phase


def test_happy_path_and_one_step_delay(fresh: Any) -> None:
    r = make_run(fresh)
    rid = r.run_id
    assert r.coord.current_epoch(rid) == 0 and phase(r, 0) == Phase.NOT_STARTED
    seen = [phase(r, 0)]
    for t in r.trainers:
        t.commit(0)
        seen.append(phase(r, 0))
    # every expected trainer committed: reveals open at once, no waiting out the window
    assert seen == [Phase.NOT_STARTED, Phase.COMMITTING, Phase.COMMITTING, Phase.REVEALING]
    for t in r.trainers:
        res = t.reveal(0)
        assert res.events[0].name == "Revealed"
    assert phase(r, 0) == Phase.AUDITING
    # the closing reveal does no audit bookkeeping: the next startAudit schedules the seed
    assert not any(e.name == "AuditScheduled" for e in res.events)
    st = r.coord.epoch_status(rid, 0)
    assert (st.committed, st.revealed, st.passed, st.failed) == (3, 3, 0, 0)
    assert r.coord.current_epoch(rid) == 1

    # one-step delay: epoch 1 takes commitments while epoch 0 is auditing, but no further
    for t in r.trainers:
        t.commit(1)
    assert phase(r, 1) == Phase.COMMITTING  # all committed, but epoch 0 is not done yet
    with pytest.raises(ce.WrongPhase) as ei:
        r.trainers[0].reveal(1)
    assert (ei.value.epoch, ei.value.actual, ei.value.expected) == (1, Phase.COMMITTING, Phase.REVEALING)
    with pytest.raises(ce.EpochNotOpen) as no:
        r.trainers[0].chain.commit(rid, 2, keccak(b"x"))
    assert (no.value.epoch, no.value.next_epoch) == (2, 2)

    for t in r.trainers:
        t.respond(0)
    with pytest.raises(ce.NotReady) as nr:
        r.coord.finalize(rid, 0, "bafkreimodel1", keccak(b"m1"), [t.address for t in r.trainers])
    assert (nr.value.decided, nr.value.committed) == (0, 3)
    r.judge_all(0)
    assert r.coord.epoch_status(rid, 0).passed == 3
    for t in r.trainers:
        assert r.coord.submission(rid, 0, t.address).passed
    res = r.coord.finalize(rid, 0, "bafkreimodel1", keccak(b"m1"), [t.address for t in r.trainers])
    assert [e.name for e in res.events] == ["EpochFinalized"]
    # the model counts only once its attestation committee confirmed it: epoch 1 still waits
    assert phase(r, 0) == Phase.CONFIRMING and phase(r, 1) == Phase.COMMITTING
    confirmed = r.attest(0, keccak(b"m1"))[-1]
    assert [e.name for e in confirmed.events] == ["ModelAttested", "ModelConfirmed"]
    assert confirmed.events[1].args["corrected"] is False
    st = r.coord.epoch_status(rid, 0)
    assert st.phase == Phase.FINALIZED and st.model_cid == "bafkreimodel1"
    assert r.coord.epoch_times(rid, 0).model_digest == keccak(b"m1")
    # epoch 0 done: epoch 1's commit phase closes and its reveals open
    assert phase(r, 1) == Phase.REVEALING
    assert r.coord.current_epoch(rid) == 1
    # a generic client reading epochStatus directly
    raw = r.coord.contract.functions.epochStatus(rid, 0).call()
    assert raw == [4, 3, 3, 3, 0, "bafkreimodel1"] or tuple(raw) == (4, 3, 3, 3, 0, "bafkreimodel1")


def test_python_helpers_match_contract(fresh: Any) -> None:
    r = make_run(fresh, n_trainers=2, n_verifiers=4, final_check_bps=5_000, quorum=3, audit_steps=4)
    rid, c = r.run_id, r.coord
    t0 = r.trainers[0]
    m = t0.material(0)
    on_chain = c.contract.functions.commitmentOf(rid, 0, t0.address, m.payload_digest, m.root, len(m.digests), m.salt).call()
    assert bytes(on_chain) == commitment(c.chain_id, c.address, rid, 0, t0.address, m.payload_digest, m.root, len(m.digests), m.salt)
    for t in r.trainers:
        t.commit(0)
    for t in r.trainers:
        t.reveal(0)
    # the first startAudit only schedules the seed: its own block's hash, unknown when it was signed
    res = c.start_audit(rid, 0)
    scheduled = next(e for e in res.events if e.name == "AuditScheduled")
    assert scheduled.args["seedBlock"] == res.block_number and scheduled.args["verifierCount"] == 4
    assert not c.epoch_times(rid, 0).seeded and c.assignment(rid, 0, t0.address).transitions == ()
    # the seed follows from the scheduling block's hash, so a trainer can respond at once: its
    # respond fixes the seed itself (nobody else needs to be awake for it)
    block_hash = bytes(fresh.w3.eth.get_block(res.block_number)["hash"])
    seed = audit_seed(block_hash, c.chain_id, c.address, rid, 0)
    fresh.advance(1)  # a later block (anvil estimates gas in the latest block's context)
    answered = t0.chain.respond(rid, 0, "bafkreimanifest", build_response(m.digests, seed, t0.address, 4, 5_000))
    started = next(e for e in answered.events if e.name == "AuditStarted")
    assert started.args["seed"] == seed == c.epoch_times(rid, 0).seed == c.fix_audit_seed(rid, 0)
    _, vlist = c.participants(rid)
    for t in r.trainers:
        a = c.assignment(rid, 0, t.address)
        assert list(a.transitions) == challenged_steps(seed, t.address, 4, t.leaves)
        assert a.final_check == final_check(seed, t.address, 5_000)
        assert list(a.verifiers) == assigned_verifiers(seed, t.address, vlist, 3)
        assert len(set(a.verifiers)) == 3


def test_per_step_draws_match_the_contract_and_an_epoch_may_draw_none(fresh: Any) -> None:
    """auditRate: each transition challenged on its own, the first auditSteps of them; the contract's
    draw, the Python mirror and respond agree, an epoch with no challenge answers with no leaf, and a rate
    of one challenges the first auditSteps transitions."""
    r = make_run(fresh, n_trainers=4, n_verifiers=3, audit_steps=6, audit_rate=80_000, final_check_bps=0)
    for t, leaves in zip(r.trainers, (2, 33, 129, 257)):
        t.leaves = leaves
    r.open_epoch(0)
    seed = r.coord.epoch_times(r.run_id, 0).seed
    counts = []
    for t in r.trainers:
        a = r.coord.assignment(r.run_id, 0, t.address)
        mirror = challenged_steps(seed, t.address, 6, t.leaves, 80_000)
        assert list(a.transitions) == mirror == sorted(set(mirror)) and not a.final_check
        assert r.coord.submission(r.run_id, 0, t.address).state == 3  # responded, whatever it drew
        counts.append(len(mirror))
    assert counts[0] in (0, 1) and max(counts) > 0
    # an empty draw (one in a million a transition: 8 in a million for this trace): the response is no
    # leaf and no proof word, and respond takes it
    rare = make_run(fresh, n_trainers=1, n_verifiers=2, audit_steps=3, audit_rate=1, final_check_bps=0)
    rare.open_epoch(0)
    t = rare.trainers[0]
    assert rare.coord.assignment(rare.run_id, 0, t.address).transitions == ()
    assert t.response(0).leaves == () == t.response(0).proofs
    assert rare.coord.submission(rare.run_id, 0, t.address).state == 3
    ones = make_run(fresh, n_trainers=1, n_verifiers=2, audit_steps=3, audit_rate=1_000_000)
    ones.trainers[0].leaves = 17
    ones.open_epoch(0)
    assert list(ones.coord.assignment(ones.run_id, 0, ones.trainers[0].address).transitions) == [0, 1, 2]
    with pytest.raises(ce.InvalidParams) as ip:
        r.coord.create_run(params(fresh.accounts[COORD], audit_rate=1_000_001))
    assert "auditRate" in ip.value.reason
    # a leaf count far past any schedule (a trainer that lies, or grinds a verifier's gas): the draw reaches
    # the first RATE_SCAN transitions only, so neither respond nor a verifier's read scans 20,000
    long = make_run(fresh, n_trainers=1, n_verifiers=2, audit_steps=64, audit_rate=1_000, final_check_bps=0)
    long.trainers[0].leaves = 20_001
    long.open_epoch(0)
    ks = long.coord.assignment(long.run_id, 0, long.trainers[0].address).transitions
    assert all(k < RATE_SCAN for k in ks) and list(ks) == challenged_steps(
        long.coord.epoch_times(long.run_id, 0).seed, long.trainers[0].address, 64, 20_001, 1_000)


def test_a_windowed_run_draws_no_step_on_chain_and_keeps_the_final_check(fresh: Any) -> None:
    """auditSteps 0 (audit.window > 0): respond proves the final leaf alone, whatever the rate; the steps
    are drawn per window off chain (docs/protocol.md §5.4). Past 64 is still refused."""
    r = make_run(fresh, n_trainers=2, n_verifiers=3, audit_steps=0, audit_rate=1_000_000, final_check_bps=10_000)
    for t in r.trainers:
        t.leaves = 33
    r.open_epoch(0)
    for t in r.trainers:
        a = r.coord.assignment(r.run_id, 0, t.address)
        assert a.transitions == () and a.final_check
        assert len(t.response(0).leaves) == 1 and r.coord.submission(r.run_id, 0, t.address).state == 3
    with pytest.raises(ce.InvalidParams) as ip:
        r.coord.create_run(params(fresh.accounts[COORD], audit_steps=65))
    assert "auditSteps (0..64)" in ip.value.reason


@pytest.mark.parametrize("leaves", [2, 3, 5, 8, 33])
def test_merkle_proofs_accepted_and_tampering_rejected(fresh: Any, leaves: int) -> None:
    r = make_run(fresh, n_trainers=1, n_verifiers=1, quorum=1)
    t = r.trainers[0]
    t.leaves = leaves
    t.commit(0)
    t.reveal(0)
    good = t.response(0)
    # a wrong digest for the first challenged leaf
    bad_leaf = type(good)(good.indices, (keccak(b"forged"),) + good.leaves[1:], good.proofs)
    with pytest.raises(ce.InvalidProof) as ei:
        t.chain.respond(r.run_id, 0, "bafkreimanifest", bad_leaf)
    assert ei.value.leaf_index == good.indices[0]
    if good.proofs:
        bad_sib = type(good)(good.indices, good.leaves, good.proofs[:-1] + (keccak(b"sib"),))
        with pytest.raises(ce.InvalidProof):
            t.chain.respond(r.run_id, 0, "bafkreimanifest", bad_sib)
    short = type(good)(good.indices, good.leaves[:-1], good.proofs)
    with pytest.raises(ce.BadResponseLength):
        t.chain.respond(r.run_id, 0, "bafkreimanifest", short)
    t.chain.respond(r.run_id, 0, "bafkreimanifest", good)
    assert r.coord.submission(r.run_id, 0, t.address).state == 3


def test_cheaters_are_slashed_and_omissions_rejected(fresh: Any) -> None:
    r = make_run(fresh, n_trainers=4, n_verifiers=3)
    rid, c = r.run_id, r.coord
    honest, liar, silent, lazy = r.trainers
    for t in r.trainers:
        t.commit(0)
    # a reveal that does not match its commitment is rejected, with both hashes
    wrong = keccak(b"other payload")
    with pytest.raises(ce.RevealMismatch) as ei:
        m = liar.material(0)
        liar.chain.reveal(rid, 0, "bafkreix", wrong, m.root, len(m.digests), m.salt)
    assert ei.value.expected == liar.commitment(0) and ei.value.trainer == liar.address
    for t in (honest, liar, lazy):
        t.reveal(0)
    assert phase(r, 0) == Phase.REVEALING  # `silent` never reveals
    with pytest.raises(ce.WrongPhase):
        c.start_audit(rid, 0)
    r.net.advance(101)
    assert phase(r, 0) == Phase.AUDITING
    with pytest.raises(ce.WrongPhase) as late:
        silent.reveal(0)
    assert (late.value.actual, late.value.expected) == (Phase.AUDITING, Phase.REVEALING)
    c.start_audit(rid, 0)
    honest.respond(0)
    liar.respond(0)
    r.judge_all(0, fail={liar.address})
    st = c.epoch_status(rid, 0)
    assert (st.passed, st.failed) == (1, 2)  # liar (failed verdict) + silent (no reveal); lazy undecided
    outsider = fresh.chain(OUTSIDER)
    with pytest.raises(ce.NotVerifier):
        outsider.commit_verdicts(rid, 0, [(honest.address, True, bytes(32))], SALT)
    v = c.assignment(rid, 0, honest.address).verifiers[0]
    with pytest.raises(ce.AlreadyRevealed):  # one reveal per verifier per epoch
        r.verifier(v).submit_verdicts(rid, 0, [(honest.address, True, bytes(32))], SALT)
    with pytest.raises(ce.NotCoordinator) as nc:
        honest.chain.finalize(rid, 0, "m", keccak(b"m"), [honest.address])
    assert nc.value.coordinator == to_checksum_address(fresh.accounts[COORD])
    r.net.advance(100)  # response window over: lazy counts as failed too
    assert c.epoch_status(rid, 0).failed == 3
    with pytest.raises(ce.NotPassing):
        c.finalize(rid, 0, "m", keccak(b"m"), [honest.address, liar.address])
    with pytest.raises(ce.PassingOmitted) as po:
        c.finalize(rid, 0, "m", keccak(b"m"), [])
    assert (po.value.included, po.value.passed) == (0, 1)
    # the binding sorts `included`; a raw call with a duplicate shows the contract's own check
    with pytest.raises(Exception) as raw:
        c.contract.functions.finalize(rid, 0, "m", keccak(b"m"), [honest.address] * 2).call({"from": fresh.accounts[COORD]})
    data = revert_data(raw.value)
    assert data is not None
    err = decode_revert(data)
    assert isinstance(err, ce.NotSorted) and err.index == 1
    balance_before = c.balance()
    catchers = c.assignment(rid, 0, liar.address).verifiers  # all voted fail
    res = c.finalize(rid, 0, "bafkreimodel1", keccak(b"m"), [honest.address])
    slashed = {e.args["trainer"]: e.args["reason"] for e in res.events if e.name == "Slashed"}
    assert slashed == {liar.address: 3, silent.address: 1, lazy.address: 2}
    staked, credits = c.totals()
    assert c.balance() == balance_before == staked + credits + c.total_burned()
    # the liar's stake pays the verifiers that caught it; missed reveals and responses are burned;
    # the creator and coordinator gain nothing from any slash
    share = STAKE // 2 // len(catchers)
    assert [c.credits(v) for v in catchers] == [share] * len(catchers) and credits == share * len(catchers)
    assert c.total_burned() == STAKE + STAKE // 2 - credits
    assert c.credits(fresh.accounts[COORD]) == 0
    assert c.member(rid, liar.address).stake == STAKE // 2
    assert c.member(rid, liar.address).leave_epoch == 1  # removed at the next boundary
    assert c.member(rid, honest.address).stake == STAKE
    for v in catchers:
        r.verifier(v).claim()
    assert c.totals()[1] == 0 and c.balance() == c.totals()[0] + c.total_burned()


def test_too_few_trainers_aborts_and_next_epoch_opens(fresh: Any) -> None:
    r = make_run(fresh, n_trainers=3, min_trainers=2)
    rid = r.run_id
    r.trainers[0].commit(0)
    assert phase(r, 0) == Phase.COMMITTING
    r.net.advance(101)
    assert phase(r, 0) == Phase.ABORTED
    assert r.coord.current_epoch(rid) == 1
    r.net.advance(101)  # past where reveals would have closed: still nobody counted as failed
    st = r.coord.epoch_status(rid, 0)
    assert (st.phase, st.committed, st.failed) == (Phase.ABORTED, 1, 0)
    with pytest.raises(ce.WrongPhase):
        r.trainers[1].commit(0)
    for t in r.trainers:
        t.commit(1)
    assert phase(r, 1) == Phase.REVEALING


def test_missing_coordinator_settle_after_deadline(fresh: Any) -> None:
    r = make_run(fresh, n_trainers=2, n_verifiers=2)
    rid, c = r.run_id, r.coord
    for t in r.trainers:
        t.commit(0)
    for t in r.trainers:
        t.reveal(0)
    r.trainers[0].respond(0)  # the other never responds
    r.judge_all(0)
    with pytest.raises(ce.NotExpired):
        c.settle(rid, 0)
    r.net.advance(100 + 100 + 100 + 1)
    assert phase(r, 0) == Phase.ABORTED
    with pytest.raises(ce.WrongPhase) as ei:
        c.finalize(rid, 0, "m", keccak(b"m"), [r.trainers[0].address])
    assert (ei.value.actual, ei.value.expected) == (Phase.ABORTED, Phase.AUDITING)
    res = fresh.chain(OUTSIDER).settle(rid, 0)
    assert [e.name for e in res.events] == ["EpochSettled", "TrainerLeft", "Slashed"]
    assert phase(r, 0) == Phase.ABORTED and c.epoch_status(rid, 0).model_cid == ""
    with pytest.raises(ce.WrongPhase):
        c.settle(rid, 0)


def test_leave_unbond_withdraw(fresh: Any) -> None:
    r = make_run(fresh, n_trainers=2, n_verifiers=2, quorum=1)
    rid, c = r.run_id, r.coord
    a, b = r.trainers
    for t in r.trainers:
        t.commit(0)
    a.chain.leave(rid)
    assert c.member(rid, a.address).leave_epoch == 1
    with pytest.raises(ce.EpochNotOpen):
        a.chain.commit(rid, 1, keccak(b"c"))  # epoch 0 is still revealing
    with pytest.raises(ce.StillBonded):
        a.chain.withdraw(rid)
    r.net.advance(60)
    with pytest.raises(ce.EpochNotSettled) as ns:
        a.chain.withdraw(rid)  # epoch 0, which it took part in, has not settled
    assert ns.value.epoch == 0
    for t in r.trainers:
        t.reveal(0)
    with pytest.raises(ce.NotEligible) as ne:
        a.chain.commit(rid, 1, keccak(b"c"))  # epoch 0 audits, epoch 1 could open, but `a` left
    assert (ne.value.join_epoch, ne.value.leave_epoch) == (0, 1)
    for t in r.trainers:
        t.respond(0)
    r.judge_all(0)
    r.finalize(0, [a, b])
    before = fresh.w3.eth.get_balance(a.address)
    res = a.chain.withdraw(rid)
    assert res.events[0].name == "Withdrawn" and res.events[0].args["amount"] == STAKE
    assert fresh.w3.eth.get_balance(a.address) > before
    with pytest.raises(ce.NotLeaving):
        a.chain.withdraw(rid)
    # a verifier leaves while no audit runs: removed at once, withdraws after unbonding
    v = r.verifiers[0]
    v.leave(rid)
    assert v.sender not in c.participants(rid)[1]
    r.net.advance(60)
    v.withdraw(rid)
    staked, credits = c.totals()
    assert c.balance() == staked + credits == STAKE + 2 * VSTAKE  # b, the other verifier, the coordinator


def test_membership_and_access_errors(fresh: Any) -> None:
    r = make_run(fresh, n_trainers=1, n_verifiers=1, max_trainers=2)
    rid = r.run_id
    t = r.trainers[0]
    with pytest.raises(ce.AlreadyJoined):
        t.chain.join_verifier(rid)
    with pytest.raises(ce.WrongStake) as ws:
        fresh.chain(2).join_trainer(rid, stake=STAKE - 1)
    assert (ws.value.actual, ws.value.expected) == (STAKE - 1, STAKE)
    fresh.chain(2).join_trainer(rid)
    with pytest.raises(ce.RunFull) as rf:
        fresh.chain(3).join_trainer(rid)
    assert rf.value.limit == 2
    with pytest.raises(ce.UnknownRun) as ur:
        r.coord.epoch_status(999, 0)
    assert ur.value.run_id == 999
    with pytest.raises(ce.NotTrainer):
        fresh.chain(OUTSIDER).commit(rid, 0, keccak(b"c"))
    with pytest.raises(ce.ZeroCommitment):
        t.chain.commit(rid, 0, bytes(32))
    with pytest.raises(ce.InvalidParams) as ip:
        r.coord.create_run(params(fresh.accounts[COORD], quorum=0))
    assert "quorum" in ip.value.reason
    t.commit(0)
    with pytest.raises(ce.AlreadyCommitted):
        t.commit(0)
    fresh.advance(101)  # the commit window closes with one of two trainers committed
    with pytest.raises(ce.NotCommitted):
        fresh.chain(2).reveal(rid, 0, "x", keccak(b"p"), keccak(b"r"), 4, keccak(b"s"))


def test_binding_rejects_wrong_address_and_chain(fresh: Any) -> None:
    with pytest.raises(ce.WrongContract, match="no contract"):
        Chain(fresh.w3, fresh.accounts[5])
    with pytest.raises(ce.WrongContract, match="not a"):
        Chain(fresh.w3, "0x1234")
    with pytest.raises(ce.WrongChain):
        Chain(fresh.w3, fresh.address, chain_id=fresh.w3.eth.chain_id + 1)
    with pytest.raises(ce.ChainUnavailable):
        Chain("http://127.0.0.1:9", fresh.address)


def test_event_stream_survives_a_lost_connection(fresh: Any) -> None:
    from web3 import HTTPProvider, Web3

    r = make_run(fresh, n_trainers=3)
    start = fresh.w3.eth.block_number
    c = Chain(Web3(fresh.w3.provider), fresh.address)  # a reader with its own connection
    stream = c.stream(["Committed", "Revealed"], run_id=r.run_id, from_block=start)
    r.trainers[0].commit(0)
    got = stream.poll()
    assert [e.name for e in got] == ["Committed"]
    good = c.w3.provider
    c.w3.provider = HTTPProvider("http://127.0.0.1:9")  # the node becomes unreachable
    r.trainers[1].commit(0)  # sent through another client while this one is cut off
    with pytest.raises(ce.ChainUnavailable):
        stream.poll()
    c.w3.provider = good
    r.trainers[2].commit(0)
    got = stream.poll()
    assert [e.args["trainer"] for e in got] == [r.trainers[1].address, r.trainers[2].address]
    assert stream.poll() == []


def test_a_transaction_lost_in_an_outage_does_not_stall_the_key(fresh: Any) -> None:
    """The node accepts a transaction, goes away and comes back without it (a devnet restarted from
    an older dump): the sender sees ChainUnavailable, and its next transaction is not stuck behind
    a nonce gap."""
    from eth_account import Account
    from web3 import EthereumTesterProvider, HTTPProvider, Web3

    provider = EthereumTesterProvider(fresh.tester) if fresh.name == "py-evm" else HTTPProvider(fresh.node.url)
    forward, armed = provider.make_request, [False]

    def losing(method: Any, params: Any) -> Any:
        if armed[0] and method == "eth_sendRawTransaction":
            raw = bytes.fromhex(params[0][2:]) if isinstance(params[0], str) else bytes(params[0])
            return {"jsonrpc": "2.0", "id": 1, "result": "0x" + keccak(raw).hex()}  # accepted, then lost
        if armed[0] and method == "eth_getTransactionReceipt":
            raise ConnectionError("connection refused (the node is restarting)")
        return forward(method, params)

    provider.make_request = losing  # type: ignore[method-assign]
    r = make_run(fresh, n_trainers=0, n_verifiers=0)
    key = Account.create()
    fresh.w3.eth.send_transaction({"from": fresh.accounts[OUTSIDER], "to": key.address, "value": 10 * STAKE})
    c = Chain(Web3(provider), fresh.address, key, receipt_timeout=5)
    armed[0] = True
    with pytest.raises(ce.ChainUnavailable):
        c.join_trainer(r.run_id)
    armed[0] = False
    assert c.member(r.run_id, key.address).role == 0  # it really was lost
    c.join_trainer(r.run_id)  # same key, next transaction: goes through
    assert c.member(r.run_id, key.address).role == 1


def test_hash_slots_rotate_over_many_epochs(fresh: Any) -> None:
    r = make_run(fresh, n_trainers=2, n_verifiers=1, quorum=1)
    rid, c = r.run_id, r.coord
    roots = {}
    for e in range(4):
        for t in r.trainers:
            t.commit(e)
        if e == 3:
            # epoch 0's hash slot now holds epoch 3's commitment: the view says so by returning zero
            old = c.submission(rid, 0, r.trainers[0].address)
            assert old.state == 3 and old.passed and old.trace_root == bytes(32)
            assert c.submission(rid, 1, r.trainers[0].address).trace_root == roots[1]
        for t in r.trainers:
            t.reveal(e)
        roots[e] = r.trainers[0].material(e).root
        assert c.submission(rid, e, r.trainers[0].address).trace_root == roots[e]
        for t in r.trainers:
            t.respond(e)
        r.judge_all(e)
        r.finalize(e, r.trainers)
        assert phase(r, e) == Phase.FINALIZED
    # the previous epoch's root stays readable while the next epoch audits (verifiers rely on it)
    assert c.submission(rid, 2, r.trainers[1].address).trace_root == r.trainers[1].material(2).root


def test_audit_deadlines_and_single_use_errors(fresh: Any) -> None:
    r = make_run(fresh, n_trainers=2, n_verifiers=2)
    rid, c = r.run_id, r.coord
    a, b = r.trainers
    for t in r.trainers:
        t.commit(0)
    with pytest.raises(ce.BadLeafCount) as bl:
        a.chain.reveal(rid, 0, "x", keccak(b"p"), keccak(b"r"), 1, keccak(b"s"))
    assert (bl.value.actual, bl.value.minimum, bl.value.maximum) == (1, 2, 2**24 - 1)
    for t in r.trainers:
        t.reveal(0)
    with pytest.raises(ce.WrongPhase) as wp:
        a.reveal(0)  # reveals closed the moment both revealed
    assert wp.value.actual == Phase.AUDITING
    c.fix_audit_seed(rid, 0)
    assigned = c.assignment(rid, 0, a.address).verifiers
    v = r.verifier(assigned[0])
    mine = [(a.address, True, keccak(b"witness"))]
    for addr in c.frozen_verifiers(rid, 0):  # committed before `a` answered: allowed, revealing is not
        r.verifier(addr).commit_verdicts(rid, 0, mine if addr in assigned else [], SALT)
    with pytest.raises(ce.NotResponded):
        v.submit_verdicts(rid, 0, mine, SALT)
    a.respond(0)
    with pytest.raises(ce.AlreadyResponded):
        a.respond(0)
    times = c.epoch_times(rid, 0)
    r.net.advance(times.response_deadline - c.now() + 1)
    with pytest.raises(ce.DeadlinePassed) as dp:
        b.respond(0)
    assert dp.value.deadline == times.response_deadline and dp.value.now_ts >= dp.value.deadline
    for addr in assigned:  # verdicts are still open for the trainer that responded: the same reveal now lands
        r.verifier(addr).submit_verdicts(rid, 0, mine, SALT)
    assert c.epoch_status(rid, 0).passed == 1
    r.net.advance(times.verdict_deadline - c.now() + 1)
    with pytest.raises(ce.DeadlinePassed):
        v.submit_verdicts(rid, 0, [(b.address, True, bytes(32))], SALT)
    with pytest.raises(ce.NothingToWithdraw):
        fresh.chain(OUTSIDER).claim()


def test_signing_with_a_private_key(fresh: Any) -> None:
    """The binding signs raw transactions (and tracks nonces) when given a key instead of an address."""
    from eth_account import Account

    acct = Account.create()
    fresh.w3.eth.send_transaction({"from": fresh.accounts[COORD], "to": acct.address, "value": 10**19})
    signer = Chain(fresh.w3, fresh.address, "0x" + bytes(acct.key).hex())
    assert signer.sender == acct.address
    run_id = signer.create_run(params(acct.address, quorum=1))
    for _ in range(3):  # consecutive transactions: local nonce tracking
        run_id = signer.create_run(params(acct.address, quorum=1))
    assert signer.run_info(run_id).creator == acct.address
    signer._nonce = 0  # a stale nonce (e.g. the key used elsewhere): the node refuses it, the call resyncs
    assert signer.create_run(params(acct.address, quorum=1)) == run_id + 1
    assert signer.create_run(params(acct.address, quorum=1)) == run_id + 2


def test_event_queries_filter_by_run(fresh: Any) -> None:
    r1 = make_run(fresh, n_trainers=1, n_verifiers=0)
    r2 = make_run(fresh, n_trainers=0, n_verifiers=0)
    r1.trainers[0].commit(0)
    names = [e.name for e in r1.coord.events(run_id=r1.run_id)]
    assert names == ["RunCreated", "TrainerJoined", "CoordinatorStaked", "EpochOpened", "Committed"]
    assert [e.name for e in r1.coord.events(run_id=r2.run_id)] == ["RunCreated", "CoordinatorStaked"]
    assert len(r1.coord.events(["RunCreated"])) == 2
    assert [e.args["trainer"] for e in r1.coord.events(["Committed"], epoch=0)] == [r1.trainers[0].address]
