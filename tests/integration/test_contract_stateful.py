"""Hypothesis drives random action sequences from several accounts against the contract (py-evm).

Any action may be invalid at the time it is tried; the contract must then revert with one of its
custom errors (never anything else), and after every step these invariants hold:
- the contract's balance equals stakes held plus claimable credits (bounties and rewards) plus
  burned stake plus the reward pools, the run's pool is what the pools total, and the stakes held
  equal the sum of the members' stakes;
- an epoch's phase never goes back (NotStarted < Committing < Revealing < Auditing < Finalized|Aborted);
- a finalized epoch included exactly the trainers with a passing verdict quorum (no failed or
  unverified trainer included, no passing one omitted);
- a reveal succeeds only with the values committed (a dishonest reveal always reverts), and an audit
  response succeeds only with proofs of the revealed trace (a tampered one always reverts).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from protocol.chain import errors as ce
from protocol.chain.binding import AuditResponse, Chain, Phase, Verdict
from protocol.digest import keccak
from tests.fixtures.chain import PyEvmNet, Trainer, params

pytestmark = pytest.mark.integration

TRAINERS = [1, 2, 3, 4]
VERIFIERS = [5, 6, 7]
EPOCHS = st.integers(-1, 1)  # offset from the current epoch: where the action is meaningful
_NET: PyEvmNet | None = None
_ORDER = {
    Phase.NOT_STARTED: 0, Phase.COMMITTING: 1, Phase.REVEALING: 2, Phase.AUDITING: 3,
    Phase.CONFIRMING: 4, Phase.FINALIZED: 5, Phase.ABORTED: 5,
}
POOL = 10**16  # pays a few epochs in full, then runs dry (pro rata, then nothing)


def net() -> PyEvmNet:
    global _NET
    if _NET is None:
        _NET = PyEvmNet()
    return _NET


class ContractMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.net = net()
        self.snap = self.net.snapshot()
        self.coord = self.net.chain(0)
        self.run_id = self.coord.create_run(
            params(self.net.accounts[0], min_trainers=2, max_trainers=4, quorum=2, final_check_bps=5_000,
                   unbonding_delay=50, trainer_reward=10**15, verifier_reward=3 * 10**14),
            reward_pool=POOL,
        )
        self.trainers = [Trainer(self.net.chain(i), self.run_id, leaves=5) for i in TRAINERS]
        self.verifiers = [self.net.chain(i) for i in VERIFIERS]
        for t in self.trainers:
            t.chain.join_trainer(self.run_id)
        for v in self.verifiers:
            v.join_verifier(self.run_id)
        self.coord.stake_coordinator(self.run_id)
        self.phases: dict[int, Phase] = {}
        self.queued: dict[tuple[str, int], list[Verdict]] = {}  # verdicts a verifier will commit
        self.committed: dict[tuple[str, int], list[Verdict]] = {}  # what it committed (to reveal)

    def teardown(self) -> None:
        if hasattr(self, "snap"):
            try:
                staked, _ = self.coord.totals()
                held = sum(self.coord.member(self.run_id, self.net.accounts[k]).stake for k in [0] + TRAINERS + VERIFIERS)
                assert held == staked, "stakes held differ from the sum of the members' stakes"
            finally:
                self.net.revert(self.snap)

    def _epoch(self, offset: int) -> int:
        return max(0, self.coord.current_epoch(self.run_id) + offset)

    # ------------------------------------------------------------ actions

    @rule(i=st.integers(0, 3), epoch=EPOCHS, honest=st.booleans())
    def commit(self, i: int, epoch: int, honest: bool) -> None:
        epoch = self._epoch(epoch)
        t = self.trainers[i]
        c = t.commitment(epoch) if honest else keccak(b"junk%d" % epoch)
        try:
            t.chain.commit(self.run_id, epoch, c)
        except ce.ContractRevert:
            return
        if not honest:  # remember that this trainer's commitment is not its material
            t.epochs[epoch] = type(t.material(epoch))(t.material(epoch).digests, b"\x00" * 32, keccak(b"none"))

    @rule(i=st.integers(0, 3), epoch=EPOCHS, honest=st.booleans())
    def reveal(self, i: int, epoch: int, honest: bool) -> None:
        epoch = self._epoch(epoch)
        t = self.trainers[i]
        m = t.material(epoch)
        digest = m.payload_digest if honest else keccak(b"other")
        before = self.coord.submission(self.run_id, epoch, t.address)
        try:
            t.chain.reveal(self.run_id, epoch, "bafkreip", digest, m.root, len(m.digests), m.salt)
        except ce.ContractRevert:
            return
        # success only with exactly the committed values
        assert honest and before.state == 1
        assert before.commitment == t.commitment(epoch)

    @rule(i=st.integers(0, 3), epoch=EPOCHS, tamper=st.booleans())
    def respond(self, i: int, epoch: int, tamper: bool) -> None:
        epoch = self._epoch(epoch)
        t = self.trainers[i]
        if self.coord.submission(self.run_id, epoch, t.address).state != 2:
            with pytest.raises(ce.ContractRevert):
                t.chain.respond(self.run_id, epoch, "m", AuditResponse((), (), ()))
            return
        try:
            resp = t.response(epoch)
        except (ValueError, ce.ContractRevert):  # no seed yet (not auditing): nothing to answer
            return
        if tamper:
            resp = AuditResponse(resp.indices, (keccak(b"forged"),) + resp.leaves[1:], resp.proofs)
        try:
            t.chain.respond(self.run_id, epoch, "bafkreim", resp)
        except ce.ContractRevert:
            return
        assert not tamper, "a tampered audit response was accepted"
        event("responded")

    @rule(j=st.integers(0, 2), i=st.integers(0, 3), epoch=EPOCHS, ok=st.booleans(), lazy=st.booleans())
    def verdict(self, j: int, i: int, epoch: int, ok: bool, lazy: bool) -> None:
        """Queue a verdict (with the shared witness, or a lazy zero one) for verifier j's commitment."""
        epoch = self._epoch(epoch)
        t = self.trainers[i].address
        w = bytes(32) if lazy else keccak(b"witness %d " % epoch + t.encode())
        self.queued.setdefault((str(self.verifiers[j].sender), epoch), []).append((t, ok, w))

    @rule(j=st.integers(0, 2), epoch=EPOCHS, reveal=st.booleans())
    def send_verdicts(self, j: int, epoch: int, reveal: bool) -> None:
        """Commit verifier j's queued verdicts, or reveal what it committed."""
        self._send(self.verifiers[j], self._epoch(epoch), reveal)

    def _send(self, v: Chain, epoch: int, reveal: bool) -> None:
        key = (str(v.sender), epoch)
        salt = keccak(b"salt %d" % epoch)
        try:
            if reveal and key in self.committed:
                v.submit_verdicts(self.run_id, epoch, self.committed[key], salt)
                event("verdicts revealed")
            elif not reveal:
                v.commit_verdicts(self.run_id, epoch, self.queued.get(key, []), salt)
                self.committed[key] = self.queued.pop(key, [])
        except ce.ContractRevert:
            pass

    @rule(epoch=EPOCHS, mode=st.sampled_from(["passing", "all", "none", "first"]))
    def finalize(self, epoch: int, mode: str, offset: bool = True) -> None:
        epoch = self._epoch(epoch) if offset else epoch
        subs = {t.address: self.coord.submission(self.run_id, epoch, t.address) for t in self.trainers}
        passing = {a for a, s in subs.items() if s.passed}
        included = {"passing": passing, "all": set(subs), "none": set(), "first": set(list(subs)[:1])}[mode]
        try:
            res = self.coord.finalize(self.run_id, epoch, "bafkreimodel", keccak(b"m%d" % epoch), sorted(included))
        except ce.ContractRevert:
            return
        if any(e.name == "RewardsPaid" for e in res.events):
            event("finalize paid rewards")
        assert included == passing, "finalize accepted an included set other than exactly the passing trainers"
        event(f"finalized with {len(passing)} passing")
        assert self.coord.epoch_status(self.run_id, epoch).phase in (Phase.FINALIZED, Phase.CONFIRMING)

    @rule(epoch=EPOCHS)
    def settle(self, epoch: int) -> None:
        epoch = self._epoch(epoch)
        try:
            self.net.chain(8).settle(self.run_id, epoch)
        except ce.ContractRevert:
            pass

    @rule(epoch=EPOCHS)
    def start_audit(self, epoch: int) -> None:
        epoch = self._epoch(epoch)
        try:
            self.net.chain(8).start_audit(self.run_id, epoch)
        except ce.ContractRevert:
            pass

    @rule(k=st.integers(0, 6))
    def leave(self, k: int) -> None:
        c = self.net.chain((TRAINERS + VERIFIERS)[k])
        try:
            c.leave(self.run_id)
        except ce.ContractRevert:
            pass

    @rule(k=st.integers(0, 6))
    def withdraw(self, k: int) -> None:
        c = self.net.chain((TRAINERS + VERIFIERS)[k])
        try:
            c.withdraw(self.run_id)
        except ce.ContractRevert:
            pass

    @rule(k=st.integers(0, 7))
    def claim(self, k: int) -> None:
        try:
            self.net.chain(([0] + TRAINERS + VERIFIERS)[k]).claim()
        except ce.ContractRevert:
            pass

    @rule(wei=st.integers(0, 3 * 10**15))
    def fund(self, wei: int) -> None:
        try:
            self.net.chain(8).fund_run(self.run_id, wei)
        except ce.ContractRevert:
            assert wei == 0, "fundRun refused a positive amount"

    @rule(seconds=st.integers(1, 160))
    def wait(self, seconds: int) -> None:
        self.net.advance(seconds)

    @rule()
    def honest_progress(self) -> None:
        """Everyone does the right thing once for the current epoch (and judges the previous one)."""
        e = self.coord.current_epoch(self.run_id)
        for t in self.trainers:
            for action in (t.commit, t.reveal):
                try:
                    action(e)
                except ce.ContractRevert:
                    pass
        for epoch in {max(e - 1, 0), e}:
            for t in self.trainers:
                if self.coord.submission(self.run_id, epoch, t.address).state == 2:
                    try:
                        t.respond(epoch)
                    except (ce.ContractRevert, ValueError):
                        pass
                if self.coord.submission(self.run_id, epoch, t.address).state == 3:
                    for a in self.coord.assignment(self.run_id, epoch, t.address).verifiers:
                        w = keccak(b"witness %d " % epoch + t.address.encode())
                        self.queued.setdefault((str(a), epoch), []).append((t.address, True, w))
            for chain in self.verifiers:
                self._send(chain, epoch, reveal=False)
            for chain in self.verifiers:
                self._send(chain, epoch, reveal=True)
            self.finalize(epoch, "passing", offset=False)

    # ------------------------------------------------------------ invariants

    @invariant()
    def money_is_accounted_for(self) -> None:
        if not hasattr(self, "coord"):
            return
        staked, credits = self.coord.totals()
        pools = self.coord.total_pools()
        assert self.coord.balance() == staked + credits + self.coord.total_burned() + pools
        assert self.coord.run_info(self.run_id).pool == pools

    @invariant()
    def phases_never_go_back(self) -> None:
        if not hasattr(self, "coord"):
            return
        for e in range(4):
            ph = self.coord.epoch_status(self.run_id, e).phase
            old = self.phases.get(e, Phase.NOT_STARTED)
            assert _ORDER[ph] >= _ORDER[old], f"epoch {e} went back from {old.name} to {ph.name}"
            if _ORDER[old] == 5:
                assert ph == old, f"epoch {e} left terminal phase {old.name}"
            self.phases[e] = ph


ContractMachine.TestCase.settings = settings(
    max_examples=5, stateful_step_count=20, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_contract_state_machine = ContractMachine.TestCase
