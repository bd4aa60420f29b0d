"""Python exceptions for the contract's custom errors, plus the binding's own failures.

Every revert of the Veriloco contract is decoded into the exception class of the same name, with
the error's arguments as attributes (snake_case) and in `args`, so callers write
`except WrongPhase as e: e.actual`. The docstring of each class is the hint shown to users.
A unit test checks that every error in the committed ABI has a class here with the same arity.
"""

from __future__ import annotations

from typing import Any, ClassVar

from protocol.errors import VerilocoError


class ChainError(VerilocoError):
    """Root of every failure talking to the chain or the contract."""


class ChainUnavailable(ChainError):
    """The JSON-RPC endpoint cannot be reached."""


class WrongChain(ChainError):
    """The endpoint serves another chain than expected."""


class WrongContract(ChainError):
    """No Veriloco contract (or a different build of it) is deployed at the given address."""


class ArtifactMissing(ChainError):
    """The committed contract artifact is missing or unreadable."""


class TransactionFailed(ChainError):
    """A transaction reverted or failed without a decodable custom error."""


class InsufficientFunds(ChainError):
    """The sending key cannot pay a transaction's value and gas; says how much to send it."""


class ContractRevert(ChainError):
    """Base of the decoded custom errors; `fields` names the Solidity error's arguments."""

    fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *values: Any) -> None:
        super().__init__(*values)
        for name, value in zip(self.fields, values):
            setattr(self, name, value)

    def __str__(self) -> str:
        shown = ", ".join(f"{n}={_show(v)}" for n, v in zip(self.fields, self.args))
        hint = (type(self).__doc__ or "").strip().splitlines()[0] if type(self).__doc__ else ""
        return f"contract reverted with {type(self).__name__}({shown}): {hint}"


def _show(v: Any) -> str:
    if isinstance(v, bytes):
        return "0x" + v.hex()
    return str(v)


class UnknownRun(ContractRevert):
    """No run with this id exists; check --run (run ids start at 1) and the contract address."""

    fields = ("run_id",)


class InvalidParams(ContractRevert):
    """The run config has an unusable on-chain field (named by `reason`); fix it in run.toml."""

    fields = ("reason",)

    def __init__(self, reason: bytes | str) -> None:
        if isinstance(reason, bytes):
            reason = reason.rstrip(b"\0").decode("ascii", "replace")
        super().__init__(reason)


class WrongPhase(ContractRevert):
    """The epoch is not in the phase this call needs (0 NotStarted, 1 Committing, 2 Revealing, 3 Auditing, 4 Finalized, 5 Aborted)."""

    fields = ("run_id", "epoch", "actual", "expected")


class WrongStake(ContractRevert):
    """The value sent is not the run's required stake; send exactly `expected` wei."""

    fields = ("actual", "expected")


class AlreadyJoined(ContractRevert):
    """This account already has a role in the run; use another account or leave and withdraw first."""

    fields = ("run_id", "account")


class RunFull(ContractRevert):
    """The run already has its maximum number of members of this role."""

    fields = ("run_id", "limit")


class NotTrainer(ContractRevert):
    """The account is not an active trainer of this run; join it first."""

    fields = ("run_id", "account")


class NotVerifier(ContractRevert):
    """The account is not an active verifier of this run; join it first."""

    fields = ("run_id", "account")


class NotEligible(ContractRevert):
    """The trainer does not take part in this epoch (it joined later or has left)."""

    fields = ("run_id", "epoch", "trainer", "join_epoch", "leave_epoch")


class EpochNotOpen(ContractRevert):
    """This epoch cannot open yet: the previous one is still committing or revealing."""

    fields = ("run_id", "epoch", "next_epoch")


class ZeroCommitment(ContractRevert):
    """A commitment must not be zero; compute it with protocol.chain.binding.commitment()."""

    fields = ()


class AlreadyCommitted(ContractRevert):
    """The trainer already committed in this epoch."""

    fields = ("run_id", "epoch", "trainer")


class NotCommitted(ContractRevert):
    """The trainer has no commitment in this epoch, so there is nothing to reveal."""

    fields = ("run_id", "epoch", "trainer")


class AlreadyRevealed(ContractRevert):
    """The trainer already revealed in this epoch."""

    fields = ("run_id", "epoch", "trainer")


class RevealMismatch(ContractRevert):
    """The revealed values do not hash to the commitment; reveal exactly what was committed."""

    fields = ("run_id", "epoch", "trainer", "actual", "expected")


class BadLeafCount(ContractRevert):
    """A trace needs 2 to 2^24-1 leaves (the start state and at least one inner step)."""

    fields = ("actual", "minimum", "maximum")


class NotRevealed(ContractRevert):
    """The trainer did not reveal in this epoch."""

    fields = ("run_id", "epoch", "trainer")


class AlreadyResponded(ContractRevert):
    """The trainer already answered its audit."""

    fields = ("run_id", "epoch", "trainer")


class DeadlinePassed(ContractRevert):
    """The deadline for this action has passed."""

    fields = ("run_id", "epoch", "deadline", "now_ts")


class BadResponseLength(ContractRevert):
    """The audit response has the wrong number of leaves or proof words; build it with build_response()."""

    fields = ("leaves", "expected_leaves", "proof_words", "expected_proof_words")


class InvalidProof(ContractRevert):
    """A Merkle proof in the audit response does not lead to the revealed trace root."""

    fields = ("run_id", "epoch", "trainer", "leaf_index")


class AuditSeedPending(ContractRevert):
    """The audit seed is not fixed yet; call Chain.fix_audit_seed() (startAudit in a later block), then retry."""

    fields = ("run_id", "epoch", "seed_block")


class NotResponded(ContractRevert):
    """The trainer has not answered its audit yet, so it cannot be judged."""

    fields = ("run_id", "epoch", "trainer")


class NotAssigned(ContractRevert):
    """This verifier is not assigned to this trainer in this epoch; see Chain.assignment()."""

    fields = ("run_id", "epoch", "trainer", "verifier")


class AlreadyVoted(ContractRevert):
    """This verifier already judged this trainer in this epoch."""

    fields = ("run_id", "epoch", "trainer", "verifier")


class NotCoordinator(ContractRevert):
    """Only the run's coordinator may finalize (or post a window's aggregate); use the coordinator's key."""

    fields = ("run_id", "caller", "coordinator")


class NotReady(ContractRevert):
    """Verdicts are still outstanding; finalize after all are in or after the verdict deadline."""

    fields = ("run_id", "epoch", "decided", "committed", "deadline")


class NotSorted(ContractRevert):
    """includedTrainers must be strictly ascending by address (no duplicates)."""

    fields = ("index",)


class NotPassing(ContractRevert):
    """An included trainer has no passing verdict quorum; leave it out."""

    fields = ("run_id", "epoch", "trainer")


class PassingOmitted(ContractRevert):
    """A trainer with a passing verdict quorum was left out; include every passing trainer."""

    fields = ("run_id", "epoch", "included", "passed")


class NotExpired(ContractRevert):
    """The epoch can only be settled after its finalize deadline."""

    fields = ("run_id", "epoch", "deadline", "now_ts")


class NotLeaving(ContractRevert):
    """The account has not left the run; call leave first."""

    fields = ("run_id", "account")


class StillBonded(ContractRevert):
    """The stake is still unbonding; withdraw after `available_at`."""

    fields = ("run_id", "account", "available_at", "now_ts")


class EpochNotSettled(ContractRevert):
    """An epoch the account took part in is not settled yet; wait for finalize, or call settle after its deadline."""

    fields = ("run_id", "epoch")


class NothingToWithdraw(ContractRevert):
    """The account has nothing to withdraw or claim."""

    fields = ("account",)


class TransferFailed(ContractRevert):
    """Sending the funds failed (the receiving contract rejected them)."""

    fields = ("account", "amount")


class Reentrancy(ContractRevert):
    """A state-changing call re-entered the contract."""

    fields = ()


class ConflictOfInterest(ContractRevert):
    """The run's creator and coordinator may not verify in it; use a key with no other role in the run."""

    fields = ("run_id", "account")


class NotStaked(ContractRevert):
    """Finalizing needs an active stake in the run (the coordinator: `Chain.stake_coordinator`)."""

    fields = ("run_id", "account")


class BadFunding(ContractRevert):
    """fundRun needs a positive value, and a run's reward pool must stay below 2^128 wei (`maximum`)."""

    fields = ("run_id", "amount", "pool", "maximum")


class VerdictsNotOpen(ContractRevert):
    """Verdict reveals open once every verifier of the frozen list committed, or at `opens_at`."""

    fields = ("run_id", "epoch", "commits", "verifier_count", "opens_at")


class VerdictCommitsClosed(ContractRevert):
    """Verdict reveals are open (every verifier committed, or since `opened_at`): too late to commit."""

    fields = ("run_id", "epoch", "commits", "opened_at")


class AlreadyReported(ContractRevert):
    """This trainer's payload was already reported in this epoch: its availability committee is voting."""

    fields = ("run_id", "epoch", "trainer")


class NotReported(ContractRevert):
    """No open availability challenge for this trainer and epoch (never reported, or already decided)."""

    fields = ("run_id", "epoch", "trainer")


class TooFewVerifiers(ContractRevert):
    """Fewer verifiers than needed: the audit waits until the run has a quorum of verifiers (join more), or an availability committee of q cannot be formed (nobody is judged)."""

    fields = ("run_id", "epoch", "have", "need")


class WindowClosed(ContractRevert):
    """Window roots are posted while their epoch trains (the next epoch or the newest opened one), windows 0..4095."""

    fields = ("run_id", "epoch", "window", "next_epoch")


class NotSignedBy(ContractRevert):
    """The signature is not this trainer's over that window root of the epoch (and it posted no window of it itself)."""

    fields = ("run_id", "epoch", "trainer")


class NotAbandoned(ContractRevert):
    """The trainer committed the epoch, could not commit it (not eligible, removed by a slash), or was already slashed for leaving it."""

    fields = ("run_id", "epoch", "trainer")


REVERT_CLASSES: dict[str, type[ContractRevert]] = {
    cls.__name__: cls for cls in ContractRevert.__subclasses__()
}
