// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {VerilocoAudit} from "./VerilocoAudit.sol";

/// @title VerilocoBase: the state, errors, events and internal rules Veriloco and VerilocoModule share
/// @dev Veriloco runs VerilocoModule's code by DELEGATECALL on its own storage, so both inherit this
///      one layout; nothing here may be reordered without redeploying both. Byte formats follow
///      docs/protocol.md §3-§5; phases are derived from stored facts and block.timestamp (never stored
///      as an enum), so deadlines need no keeper transaction. See docs/contract.md.
abstract contract VerilocoBase is VerilocoAudit {
    // ------------------------------------------------------------------ types

    /// @notice Phase of an epoch, as returned by epochStatus.
    enum Phase {
        NotStarted,
        Committing,
        Revealing,
        Auditing,
        Finalized,
        Aborted,
        Confirming // finalized, its model awaiting the attestation committee (appended: 0-5 keep their meaning)
    }

    /// @notice The fields of a run config the contract enforces (the rest lives behind configCid).
    struct RunParams {
        string configCid;
        bytes32 configDigest;
        string initModelCid;
        bytes32 initModelDigest;
        address coordinator;
        uint32 minTrainers;
        uint32 maxTrainers;
        uint32 maxVerifiers;
        uint32 commitWindow;
        uint32 revealWindow;
        uint32 responseWindow;
        uint32 verdictWindow;
        uint32 finalizeWindow;
        uint32 unbondingDelay;
        uint16 auditSteps;
        uint16 finalCheckBps;
        uint16 quorum;
        uint16 slashBps;
        uint128 trainerStake;
        uint128 verifierStake;
        // rewards out of the run's pool, per finalized epoch (0: none); at most 2^96-1 wei each
        uint128 trainerReward; // per included trainer
        uint128 verifierReward; // per verdict cast with the majority on a decided trainer
        bool testRun; // allows a quorum below 3 (a lone verifier decides): for devnets and tests only
        // 0: every epoch draws auditSteps transitions (with replacement). Else each transition is challenged
        // on its own with probability auditRate / 1e6, at most auditSteps per epoch (docs/protocol.md §5):
        // verification priced per step of work, whatever H is. auditSteps 0: no step drawn on chain (windowed)
        uint32 auditRate;
    }

    struct Run {
        RunParams p;
        // one slot: read by nearly every call
        address creator; // zero for an unknown run id
        uint32 nextEpoch; // epochs [0, nextEpoch) are opened
        uint32 activeTrainers;
        uint32 trainerSlots; // high-water mark of slots; a withdrawn trainer's slot is handed out again
        uint256 pool; // reward pool left (wei, < 2^128): funded by createRun and fundRun, paid out at finalize
    }

    struct Epoch {
        // slot A: timestamps (0 = not yet)
        uint64 openedAt;
        uint64 allCommittedAt;
        uint64 allRevealedAt;
        uint64 doneAt; // finalized, settled, or materialised abort time
        // slot B: counters
        uint32 expected;
        uint32 committed;
        uint32 revealed;
        uint32 responded;
        uint32 passed;
        uint32 failedVerdicts;
        uint32 verifierCount;
        bool finalized;
        bool settled;
        bool seeded;
        // further slots
        bytes32 seed; // before `seeded`: the number of the block whose hash will seed the audit (0 = not scheduled)
        bytes32 modelDigest;
        string modelCid;
        // slot C: model confirmation
        address finalizer; // who finalized: loses slashBps of its stake if the committee proves the model wrong
        uint64 finalizedAt; // the attestation window runs for verdictWindow from here
        uint16 attested; // committee members (by index) that attested
        bool confirmed;
        // slot D
        uint64 seededAt; // when the audit seed was fixed (a seed fixed late excuses missing responses)
        uint32 verdictCommits; // verifiers of the frozen list that committed their verdicts (reveals open at verifierCount)
        uint32 verdictReveals; // of those, the ones that revealed (finalize waits for all until the verdict deadline)
    }

    /// @dev One slot per member.
    struct Member {
        uint96 stake;
        uint32 slot; // trainer slot, or index+1 in the verifier list (0 = removed)
        uint32 joinEpoch;
        uint32 leaveEpoch; // NEVER_EPOCH while active
        uint48 leftAt;
        uint8 role; // ROLE_*
        bool pendingRemoval; // verifier: left while an audit was running; trainer: left by its own leaveRun
    }

    // A trainer's epoch record is a 64-bit lane, four per storage word, indexed by trainer slot:
    // bits 0-23 leafCount, 24-30 state (SUB_*), 31 SPLIT, 32-47 pass-vote mask, 48-63 fail-vote mask (bit j =
    // assignment index j). Its commitment, then its trace root, lives in `hashes`. Sharing words
    // keeps a trainer's epoch within the gas budget (a fresh slot costs 22k gas, a shared one 5k),
    // and so does reusing a trainer's hash slot every third epoch (HASH_SLOTS): at most three
    // epochs are ever live (e-1 whose trace the audit of e refers to, e auditing, e+1 committing).
    uint256 internal constant LANE_MASK = 0xFFFFFFFFFFFFFFFF;
    uint256 internal constant HASH_SLOTS = 3;
    uint8 internal constant SUB_NONE = 0;
    uint8 internal constant SUB_COMMITTED = 1;
    uint8 internal constant SUB_REVEALED = 2;
    uint8 internal constant SUB_RESPONDED = 3;
    uint8 internal constant SUB_UNAVAILABLE = 4; // passed, then judged unavailable by its availability committee
    /// @dev Lane flag (top bit of the state byte): the verdicts' replay witnesses disagree.
    uint256 internal constant SPLIT = uint256(1) << 31;

    uint8 internal constant ROLE_NONE = 0;
    uint8 internal constant ROLE_TRAINER = 1;
    uint8 internal constant ROLE_VERIFIER = 2;
    uint8 internal constant ROLE_COORDINATOR = 3;

    /// @notice Reasons carried by Slashed.
    uint8 public constant SLASH_NO_REVEAL = 1;
    uint8 public constant SLASH_NO_RESPONSE = 2;
    uint8 public constant SLASH_FAILED_AUDIT = 3;
    uint8 public constant SLASH_UNAVAILABLE = 4; // its payload could not be fetched (docs/protocol.md §10.2)
    uint8 public constant SLASH_FALSE_REPORT = 5; // reported an available payload as unavailable
    uint8 public constant SLASH_ABANDONED = 6; // began an epoch's windows and never committed it (docs/protocol.md §5.4)

    /// @notice Kinds carried by Credited: a passed trainer's reward, a verifier's reward for its
    ///         majority verdicts, a bounty (a share of the stake slashed from `source`), and a
    ///         compensation (a share of the trainer reward, taken from the stake of `source`, an assigned
    ///         verifier that cast no verdict on the trainer by the deadline).
    uint8 internal constant CREDIT_TRAINER_REWARD = 1;
    uint8 internal constant CREDIT_VERDICT_REWARD = 2;
    uint8 internal constant CREDIT_BOUNTY = 3;
    uint8 internal constant CREDIT_COMPENSATION = 4;

    bytes32 public constant COMMIT_TAG = keccak256("veriloco.commit.v1");
    bytes32 public constant AUDIT_TAG = keccak256("veriloco.audit.v1");
    bytes32 public constant VERDICT_TAG = keccak256("veriloco.verdict.v1");
    bytes32 public constant WINDOW_TAG = keccak256("veriloco.window.v1");
    uint256 internal constant MASK16 = 0xFFFF;

    uint64 internal constant NEVER = type(uint64).max;
    uint32 internal constant NEVER_EPOCH = type(uint32).max;
    uint256 internal constant MAX_LEAVES = (1 << 24) - 1;

    // ------------------------------------------------------------------ storage

    /// @notice Number of runs created; run ids are 1..runCount.
    uint256 public runCount;
    /// @notice Sum of all stakes the contract holds (active, leaving and unbonding).
    uint256 public totalStaked;
    /// @notice Sum of all claimable credits (bounties: slashed stake paid to the verifiers who proved the fault).
    uint256 public totalCredits;
    /// @notice Slashed stake nobody earned (missing reveals or responses, outvoted verifiers, rounding): locked forever.
    uint256 public totalBurned;
    /// @notice Sum of all runs' reward pools not yet paid out.
    uint256 public totalPools;
    /// @notice Claimable balance per account (pull payment).
    mapping(address => uint256) public credits;

    mapping(uint256 => Run) internal runs;
    mapping(uint256 => mapping(uint256 => Epoch)) internal epochs;
    /// @dev run => trainer => epoch % HASH_SLOTS => the commitment until the reveal, the trace root
    ///      after it (the commitment stays in the Committed event; the payload digest and CID are in
    ///      the Revealed event). Valid for an epoch while the trainer has not committed 3 epochs later.
    mapping(uint256 => mapping(address => mapping(uint256 => bytes32))) internal hashes;
    mapping(uint256 => mapping(uint256 => mapping(uint256 => uint256))) internal lanes;
    mapping(uint256 => mapping(address => uint32)) internal slotPlusOne; // until the trainer withdraws
    mapping(uint256 => mapping(address => Member)) internal members;
    mapping(uint256 => mapping(uint256 => address)) internal slotTrainer; // current or last holder
    /// @dev Slots of withdrawn trainers, handed out again first: finalize scans every slot, so join /
    ///      leave / withdraw churn must not grow the slot count (it is bounded by peak membership).
    mapping(uint256 => uint32[]) internal freeSlots;
    mapping(uint256 => address[]) internal verifierList;
    mapping(uint256 => address[]) internal pendingVerifierRemovals;
    /// @dev run => epoch => model digest => mask of attestation-committee indices that attested it.
    mapping(uint256 => mapping(uint256 => mapping(bytes32 => uint256))) internal modelVotes;
    /// @dev run => verifier => epoch % HASH_SLOTS => (epoch + 1) << 224 | the low 224 bits of its
    ///      verdict commitment (those bits zero once revealed). The epoch tag tells a live slot from
    ///      one left three epochs ago, so one word per verifier is reused forever.
    mapping(uint256 => mapping(address => mapping(uint256 => uint256))) internal verdictCommits;
    /// @dev run => trainer => epoch % HASH_SLOTS => group g => the high 240 bits of keccak(abi.encode(
    ///      epoch, W)) | 16-bit mask of the assignment indices that revealed witness W. Groups fill a
    ///      prefix in reveal order; the live prefix is the one whose masks add up to the trainer's
    ///      votes (a lane of this epoch), so stale groups of epoch - 3 are never read.
    mapping(uint256 => mapping(address => mapping(uint256 => mapping(uint256 => uint256)))) internal witnessGroups;

    /// @dev Availability challenges per run, epoch and trainer (docs/protocol.md §10.2): bits 0-159
    ///      the reporter, 160-175 "available" votes, 176-191 "unavailable" votes (bit j = committee
    ///      index j), 192-193 the decision (1 unavailable, 2 available; 0 open), 194 a pass voter put the
    ///      payload back, 200-255 the report's block (the committee is drawn from its hash).
    mapping(uint256 => mapping(uint256 => mapping(address => uint256))) internal challenges;

    uint256 private locked = 1;

    /// @dev Per run and member, the latest epoch (plus one) it reported a payload of as unavailable: its
    ///      stake stays bonded until that epoch and the one before are settled, so a false report is
    ///      judged before its reporter can withdraw, however late it joined (docs/security.md §18).
    mapping(uint256 => mapping(address => uint256)) internal reportedEpoch;

    /// @dev Per run and trainer: bits 0-127 the latest epoch (plus one) it posted a window of itself
    ///      (postOwnWindow: it knows that window's draws, as a signed root in a relay's evidence shows for
    ///      relayed ones), bits 128-255 the latest epoch (plus one) it was slashed for abandoning.
    mapping(uint256 => mapping(address => uint256)) internal windowMarks;

    // ------------------------------------------------------------------ errors

    /// @notice The run id does not exist.
    error UnknownRun(uint256 runId);
    /// @notice createRun was given an unusable parameter; `reason` (ASCII, zero-padded) names it.
    /// @dev bytes32, not string: some clients misread a lone-string custom error as Error(string).
    error InvalidParams(bytes32 reason);
    /// @notice The epoch is in phase `actual`, the call needs phase `expected`.
    error WrongPhase(uint256 runId, uint256 epoch, uint8 actual, uint8 expected);
    /// @notice The attached value is not the required stake.
    error WrongStake(uint256 actual, uint256 expected);
    /// @notice The account already has a role in this run.
    error AlreadyJoined(uint256 runId, address account);
    /// @notice The run already has `limit` active members of this role.
    error RunFull(uint256 runId, uint256 limit);
    /// @notice The account is not an active trainer of the run.
    error NotTrainer(uint256 runId, address account);
    /// @notice The account is not a verifier of the run.
    error NotVerifier(uint256 runId, address account);
    /// @notice The trainer does not take part in this epoch (joined later or left earlier).
    error NotEligible(uint256 runId, uint256 epoch, address trainer, uint256 joinEpoch, uint256 leaveEpoch);
    /// @notice Only the next epoch can open, and only once the previous one is auditing.
    error EpochNotOpen(uint256 runId, uint256 epoch, uint256 nextEpoch);
    /// @notice A commitment may not be zero.
    error ZeroCommitment();
    /// @notice The trainer already committed in this epoch.
    error AlreadyCommitted(uint256 runId, uint256 epoch, address trainer);
    /// @notice The trainer has not committed in this epoch.
    error NotCommitted(uint256 runId, uint256 epoch, address trainer);
    /// @notice The trainer already revealed in this epoch.
    error AlreadyRevealed(uint256 runId, uint256 epoch, address trainer);
    /// @notice The revealed values hash to `actual`, but the trainer committed `expected`.
    error RevealMismatch(uint256 runId, uint256 epoch, address trainer, bytes32 actual, bytes32 expected);
    /// @notice A trace needs between `minimum` (one inner step) and `maximum` leaves.
    error BadLeafCount(uint256 actual, uint256 minimum, uint256 maximum);
    /// @notice The trainer has not revealed in this epoch.
    error NotRevealed(uint256 runId, uint256 epoch, address trainer);
    /// @notice The trainer already answered its audit.
    error AlreadyResponded(uint256 runId, uint256 epoch, address trainer);
    /// @notice The deadline `deadline` has passed (block time `nowTs`).
    error DeadlinePassed(uint256 runId, uint256 epoch, uint256 deadline, uint256 nowTs);
    /// @notice An audit response has the wrong number of leaves or proof words.
    error BadResponseLength(uint256 leaves, uint256 expectedLeaves, uint256 proofWords, uint256 expectedProofWords);
    /// @notice The Merkle proof for leaf `leafIndex` does not lead to the revealed trace root.
    error InvalidProof(uint256 runId, uint256 epoch, address trainer, uint256 leafIndex);
    /// @notice The audit seed is not fixed yet: it is the hash of block `seedBlock` (0 = not scheduled),
    ///         fixed by a startAudit call in any later block. Call startAudit, then retry.
    error AuditSeedPending(uint256 runId, uint256 epoch, uint256 seedBlock);
    /// @notice The trainer has not answered its audit, so it cannot be judged yet.
    error NotResponded(uint256 runId, uint256 epoch, address trainer);
    /// @notice The verifier is not assigned to this trainer in this epoch.
    error NotAssigned(uint256 runId, uint256 epoch, address trainer, address verifier);
    /// @notice The verifier already judged this trainer in this epoch.
    error AlreadyVoted(uint256 runId, uint256 epoch, address trainer, address verifier);
    /// @notice Only the run's coordinator may finalize before the finalize deadline.
    error NotCoordinator(uint256 runId, address caller, address coordinator);
    /// @notice Verdicts are still outstanding: `decided` of `committed` trainers are decided, until `deadline`.
    error NotReady(uint256 runId, uint256 epoch, uint256 decided, uint256 committed, uint256 deadline);
    /// @notice includedTrainers must be strictly ascending by address; entry `index` is not.
    error NotSorted(uint256 index);
    /// @notice An included trainer has no passing verdict quorum.
    error NotPassing(uint256 runId, uint256 epoch, address trainer);
    /// @notice `included` trainers were included, but `passed` trainers passed: a passing trainer was left out.
    error PassingOmitted(uint256 runId, uint256 epoch, uint256 included, uint256 passed);
    /// @notice The epoch cannot be settled before its finalize deadline `deadline`.
    error NotExpired(uint256 runId, uint256 epoch, uint256 deadline, uint256 nowTs);
    /// @notice The account has not left the run, so its stake is still bonded.
    error NotLeaving(uint256 runId, address account);
    /// @notice The stake unbonds at `availableAt` (block time `nowTs`).
    error StillBonded(uint256 runId, address account, uint256 availableAt, uint256 nowTs);
    /// @notice Epoch `epoch` the account took part in is not settled yet; finalize or settle it first.
    error EpochNotSettled(uint256 runId, uint256 epoch);
    /// @notice The account has nothing to withdraw or claim.
    error NothingToWithdraw(address account);
    /// @notice Sending `amount` wei to `account` failed.
    error TransferFailed(address account, uint256 amount);
    /// @notice The run's creator and coordinator may not verify in it (they would judge their own run).
    error ConflictOfInterest(uint256 runId, address account);
    /// @notice The caller has no active stake in the run that would answer for a wrong model.
    error NotStaked(uint256 runId, address account);
    /// @notice fundRun needs a positive value, and a run's pool stays below 2^128 wei (`maximum`).
    error BadFunding(uint256 runId, uint256 amount, uint256 pool, uint256 maximum);
    /// @notice Verdict reveals open once all `verifierCount` verifiers of the frozen list committed
    ///         (`commits` did) or at `opensAt`; a commitment comes before that, never after.
    error VerdictsNotOpen(uint256 runId, uint256 epoch, uint256 commits, uint256 verifierCount, uint256 opensAt);
    /// @notice Verdict reveals are open (since `openedAt`, or all verifiers committed): too late to commit.
    error VerdictCommitsClosed(uint256 runId, uint256 epoch, uint256 commits, uint256 openedAt);
    /// @notice A state-changing call re-entered the contract.
    error Reentrancy();
    /// @notice A trainer's payload was already reported in this epoch (one challenge each).
    error AlreadyReported(uint256 runId, uint256 epoch, address trainer);
    /// @notice No open availability challenge for this trainer and epoch.
    error NotReported(uint256 runId, uint256 epoch, address trainer);
    /// @notice Only `have` verifiers can take part where `need` are required: an audit waits for verifiers
    ///         to join (the quorum); an availability challenge cannot be judged by a full committee.
    error TooFewVerifiers(uint256 runId, uint256 epoch, uint256 have, uint256 need);
    /// @notice A window post for an epoch that is over or not next (or a window past RATE_SCAN's 4,096).
    error WindowClosed(uint256 runId, uint256 epoch, uint256 window, uint256 nextEpoch);
    /// @notice The signature is not `trainer`'s over this window root (and it posted no window itself).
    error NotSignedBy(uint256 runId, uint256 epoch, address trainer);
    /// @notice `trainer` committed this epoch, could not (not eligible), or was already slashed for it.
    error NotAbandoned(uint256 runId, uint256 epoch, address trainer);

    // ------------------------------------------------------------------ events

    /// @notice A run was created.
    event RunCreated(uint256 indexed runId, address indexed creator, address indexed coordinator, string configCid, bytes32 configDigest);
    /// @notice A trainer staked and received `slot`; it takes part from `joinEpoch` on.
    event TrainerJoined(uint256 indexed runId, address indexed trainer, uint256 slot, uint256 stake, uint256 joinEpoch);
    /// @notice A verifier staked and joined the verifier list.
    event VerifierJoined(uint256 indexed runId, address indexed verifier, uint256 stake);
    /// @notice A trainer left; it takes no part in epochs from `leaveEpoch` on.
    event TrainerLeft(uint256 indexed runId, address indexed trainer, uint256 leaveEpoch);
    /// @notice A verifier left; `removed` is false while an audit still needs the list unchanged.
    event VerifierLeft(uint256 indexed runId, address indexed verifier, bool removed);
    /// @notice A verifier that had left was removed from the verifier list.
    event VerifierRemoved(uint256 indexed runId, address indexed verifier);
    /// @notice An epoch opened with `expected` eligible trainers (first commitment of the epoch).
    event EpochOpened(uint256 indexed runId, uint256 indexed epoch, uint256 expected, uint256 commitDeadline);
    /// @notice A trainer committed.
    event Committed(uint256 indexed runId, uint256 indexed epoch, address indexed trainer, bytes32 commitment);
    /// @notice A trainer revealed its payload and trace root.
    event Revealed(uint256 indexed runId, uint256 indexed epoch, address indexed trainer, string payloadCid, bytes32 payloadDigest, bytes32 traceRoot, uint32 leafCount);
    /// @notice Reveals closed: the audit seed will be the hash of block `seedBlock`, and assignment
    ///         draws from the first `verifierCount` verifiers of the list (frozen until the audit ends).
    event AuditScheduled(uint256 indexed runId, uint256 indexed epoch, uint256 seedBlock, uint256 verifierCount);
    /// @notice The audit seed of an epoch was fixed.
    event AuditStarted(uint256 indexed runId, uint256 indexed epoch, bytes32 seed, uint256 verifierCount);
    /// @notice A trainer answered its audit; the proven leaf digests are in the manifest (and the calldata).
    event Responded(uint256 indexed runId, uint256 indexed epoch, address indexed trainer, string manifestCid);
    /// @notice A verifier of the epoch's frozen list committed to its verdicts (docs/protocol.md §5.2).
    event VerdictsCommitted(uint256 indexed runId, uint256 indexed epoch, address indexed verifier, bytes32 commitment);
    /// @notice A verifier judged a trainer.
    event VerdictSubmitted(uint256 indexed runId, uint256 indexed epoch, address indexed trainer, address verifier, bool passed, bytes32 witness);
    /// @notice A verifier revealed its verdicts of an epoch; its findings for all of them are one evidence document.
    event VerdictsRevealed(uint256 indexed runId, uint256 indexed epoch, address indexed verifier, uint256 count, string evidenceCid);
    /// @notice The coordinator's new model was accepted.
    event EpochFinalized(uint256 indexed runId, uint256 indexed epoch, string modelCid, bytes32 modelDigest, uint256 included);
    /// @notice The run's coordinator staked; its stake answers for the models it finalizes.
    /// @notice A staked member reported a passing trainer's payload as unavailable: its availability committee votes.
    /// @notice A window's roots (docs/protocol.md §5.4): the relay's aggregate over the epoch's trainer
    ///         positions with its inclusion bitmap and the CID of its evidence (every signed root it
    ///         aggregated; the coordinator posts it), or one trainer's own root. Nothing is stored: the
    ///         first post that holds a trainer's signed root is the one that counts, and its seed is the
    ///         hash of the next block.
    event WindowPosted(uint256 indexed runId, uint256 indexed epoch, uint256 indexed window, bytes32 root, bytes bitmap, string evidenceCid);
    event OwnWindowPosted(uint256 indexed runId, uint256 indexed epoch, uint256 indexed window, address trainer, bytes32 root);
    event AvailabilityReported(uint256 indexed runId, uint256 indexed epoch, address indexed trainer, address reporter);
    event AvailabilityVoted(uint256 indexed runId, uint256 indexed epoch, address indexed trainer, address verifier, bool available);
    /// @notice The committee's majority: unavailable (the trainer and its pass voters slashed, left out) or available (the reporter slashed).
    event AvailabilityDecided(uint256 indexed runId, uint256 indexed epoch, address indexed trainer, bool available);
    event CoordinatorStaked(uint256 indexed runId, address indexed coordinator, uint256 stake);
    /// @notice A member of an epoch's attestation committee attested the model digest it recomputed.
    event ModelAttested(uint256 indexed runId, uint256 indexed epoch, address indexed verifier, bytes32 modelDigest);
    /// @notice A committee majority confirmed the epoch's model; `corrected` when it replaced the
    ///         finalizer's digest (the finalizer then lost `slashed` to the attesters).
    event ModelConfirmed(uint256 indexed runId, uint256 indexed epoch, bytes32 modelDigest, string modelCid, bool corrected, uint256 slashed);
    /// @notice An epoch whose coordinator missed the finalize deadline was settled (slashes applied, no model).
    event EpochSettled(uint256 indexed runId, uint256 indexed epoch);
    /// @notice An assigned verifier voted against the majority verdict on `trainer` and lost `amount`
    ///         of its stake; it is also removed from the verifier list when the next audit is scheduled.
    event VerifierSlashed(uint256 indexed runId, uint256 indexed epoch, address indexed verifier, address trainer, uint256 amount);
    /// @notice A trainer lost `amount` of its stake for `reason` (SLASH_*); it is also removed from the run.
    event Slashed(uint256 indexed runId, uint256 indexed epoch, address indexed trainer, uint256 amount, uint8 reason);
    /// @notice `amount` wei was added to a run's reward pool, which now holds `pool`.
    event RunFunded(uint256 indexed runId, address indexed funder, uint256 amount, uint256 pool);
    /// @notice A finalized epoch paid `paid` wei of rewards (credits) to `trainers` included trainers
    ///         and for `votes` majority verdicts, pro rata when the pool could not cover it all.
    event RewardsPaid(uint256 indexed runId, uint256 indexed epoch, uint256 trainers, uint256 votes, uint256 paid, uint256 poolLeft);
    /// @notice A member withdrew its remaining stake.
    event Withdrawn(uint256 indexed runId, address indexed account, uint256 amount);
    /// @notice An account claimed its credits (bounties).
    event Claimed(address indexed account, uint256 amount);
    /// @notice `account`'s credits grew by `amount` for `kind` (CREDIT_*): one event per credit, so an
    ///         account's earnings are readable from the logs alone; `source` is the slashed account a
    ///         bounty came from (zero for rewards).
    event Credited(uint256 indexed runId, uint256 indexed epoch, address indexed account, uint256 amount, uint8 kind, address source);

    // ------------------------------------------------------------------ modifiers

    modifier nonReentrant() {
        if (locked != 1) revert Reentrancy();
        locked = 2;
        _;
        locked = 1;
    }

    // ------------------------------------------------------------------ internals: companions

    /// @dev The module Veriloco creates from its constructor (its first creation, nonce 1), found from
    ///      Veriloco's own address: no storage, no immutable, so the runtime code is the same everywhere.
    function _module() internal view returns (address) {
        return _created(0x01);
    }

    /// @dev VerilocoViews: Veriloco's second creation (nonce 2); VerilocoModule's fallback delegates to it.
    function _views() internal view returns (address) {
        return _created(0x02);
    }

    function _created(bytes1 nonce) private view returns (address) {
        return address(uint160(uint256(keccak256(abi.encodePacked(bytes2(0xd694), address(this), nonce)))));
    }

    /// @dev Run the calldata on `target`'s code with this contract's storage and return what it returns.
    function _delegate(address target) internal {
        assembly ("memory-safe") {
            calldatacopy(0, 0, calldatasize())
            let ok := delegatecall(gas(), target, 0, calldatasize(), 0, 0)
            returndatacopy(0, 0, returndatasize())
            if iszero(ok) { revert(0, returndatasize()) }
            return(0, returndatasize())
        }
    }

    /// @dev docs/protocol.md §4.
    function _commitment(uint256 runId, uint256 epoch, address trainer, bytes32 payloadDigest, bytes32 traceRoot, uint32 leafCount, bytes32 salt)
        internal
        view
        returns (bytes32)
    {
        return keccak256(abi.encode(COMMIT_TAG, block.chainid, address(this), runId, epoch, trainer, payloadDigest, traceRoot, leafCount, salt));
    }

    // ------------------------------------------------------------------ internals: model confirmation

    function _confirm(uint256 runId, uint256 epoch, Epoch storage ep, bool corrected, uint256 slashed) internal {
        ep.confirmed = true;
        ep.doneAt = uint64(block.timestamp);
        emit ModelConfirmed(runId, epoch, ep.modelDigest, ep.modelCid, corrected, slashed);
    }


    // ------------------------------------------------------------------ internals: phases

    function _run(uint256 runId) internal view returns (Run storage r) {
        r = runs[runId];
        if (r.creator == address(0)) revert UnknownRun(runId);
    }

    function _open(uint256 runId, Run storage r, uint256 epoch) internal {
        if (epoch > 0) {
            Phase prev = _phase(runId, r, epoch - 1);
            if (prev == Phase.Committing || prev == Phase.Revealing) revert EpochNotOpen(runId, epoch, r.nextEpoch);
            if (epoch > 1) {
                // pin the done time of epoch-2 so later phase derivations recurse at most one level
                // and apply its slashes if its coordinator let it expire unsettled
                Epoch storage old = epochs[runId][epoch - 2];
                if (old.doneAt == 0) old.doneAt = _doneAt(runId, r, epoch - 2);
                if (!old.finalized && !old.settled) _settle(runId, r, epoch - 2, old);
            }
        }
        Epoch storage ep = epochs[runId][epoch];
        ep.openedAt = uint64(block.timestamp);
        ep.expected = r.activeTrainers;
        r.nextEpoch = uint32(epoch + 1);
        emit EpochOpened(runId, epoch, r.activeTrainers, block.timestamp + r.p.commitWindow);
    }

    function _phase(uint256 runId, Run storage r, uint256 epoch) internal view returns (Phase) {
        if (epoch >= r.nextEpoch) return Phase.NotStarted;
        Epoch storage ep = epochs[runId][epoch];
        if (ep.finalized) {
            if (ep.confirmed) return Phase.Finalized;
            return block.timestamp < uint256(ep.finalizedAt) + r.p.verdictWindow ? Phase.Confirming : Phase.Aborted;
        }
        if (ep.settled) return Phase.Aborted;
        uint64 cc = _commitsClose(runId, r, epoch);
        if (cc == NEVER || block.timestamp < cc) return Phase.Committing;
        if (ep.committed < r.p.minTrainers) return Phase.Aborted;
        uint256 rc = ep.allRevealedAt != 0 ? ep.allRevealedAt : uint256(cc) + r.p.revealWindow;
        if (block.timestamp < rc) return Phase.Revealing;
        if (block.timestamp >= rc + r.p.responseWindow + r.p.verdictWindow + r.p.finalizeWindow) return Phase.Aborted;
        return Phase.Auditing;
    }

    /// @dev When commits close: the own deadline (or the moment all expected trainers committed), but
    ///      never before the previous epoch is done (one-step delay: at most one epoch auditing while
    ///      the next commits). NEVER while the previous epoch is still open.
    function _commitsClose(uint256 runId, Run storage r, uint256 epoch) internal view returns (uint64) {
        Epoch storage ep = epochs[runId][epoch];
        uint64 own = ep.allCommittedAt != 0 ? ep.allCommittedAt : ep.openedAt + r.p.commitWindow;
        if (epoch == 0) return own;
        uint64 prevDone = _doneAt(runId, r, epoch - 1);
        return prevDone > own ? prevDone : own;
    }

    function _revealsClose(uint256 runId, Run storage r, uint256 epoch) internal view returns (uint256) {
        Epoch storage ep = epochs[runId][epoch];
        if (ep.allRevealedAt != 0) return ep.allRevealedAt;
        uint64 cc = _commitsClose(runId, r, epoch);
        if (cc == NEVER) return NEVER;
        return uint256(cc) + r.p.revealWindow;
    }

    /// @dev When audit answers are due: the response window after reveals close (the verdict window follows).
    function _responseDeadline(uint256 runId, Run storage r, uint256 epoch) internal view returns (uint256) {
        return _revealsClose(runId, r, epoch) + r.p.responseWindow;
    }

    function _finalizeDeadline(uint256 runId, Run storage r, uint256 epoch) internal view returns (uint256) {
        uint256 rc = _revealsClose(runId, r, epoch);
        if (rc == NEVER) return NEVER;
        return rc + r.p.responseWindow + r.p.verdictWindow + r.p.finalizeWindow;
    }

    /// @dev The time an opened epoch became Finalized (its model confirmed) or Aborted, or NEVER if it has not yet.
    function _doneAt(uint256 runId, Run storage r, uint256 epoch) internal view returns (uint64) {
        Epoch storage ep = epochs[runId][epoch];
        if (ep.doneAt != 0) return ep.doneAt;
        if (ep.finalized) {
            // unconfirmed: aborted when the attestation window ends without a majority
            uint256 end = uint256(ep.finalizedAt) + r.p.verdictWindow;
            return block.timestamp >= end ? uint64(end) : NEVER;
        }
        uint64 cc = _commitsClose(runId, r, epoch);
        if (cc == NEVER || block.timestamp < cc) return NEVER;
        if (ep.committed < r.p.minTrainers) return cc;
        uint256 fd = (ep.allRevealedAt != 0 ? ep.allRevealedAt : uint256(cc) + r.p.revealWindow) + r.p.responseWindow
            + r.p.verdictWindow + r.p.finalizeWindow;
        return block.timestamp >= fd ? uint64(fd) : NEVER;
    }

    /// @dev True once an epoch's slashes (if any) are applied and its model is decided: finalized and
    ///      confirmed (or its attestation window over: a finalizer answers for its model until then),
    ///      settled, or aborted for too few trainers.
    function _settled(uint256 runId, Run storage r, uint256 epoch) internal view returns (bool) {
        if (epoch >= r.nextEpoch) return true;
        Epoch storage ep = epochs[runId][epoch];
        if (ep.finalized) return _doneAt(runId, r, epoch) != NEVER;
        if (ep.settled) return true;
        uint64 cc = _commitsClose(runId, r, epoch);
        return cc != NEVER && block.timestamp >= cc && ep.committed < r.p.minTrainers;
    }

    /// @dev True while an epoch with a scheduled or fixed seed is not finalized or settled: the
    ///      verifier list must not change, since assignments (and the slashing of verifiers who voted
    ///      against the majority, applied at finalize or settle) index into it.
    function _auditRunning(uint256 runId, Run storage r) internal view returns (bool) {
        uint256 n = r.nextEpoch;
        for (uint256 k = 1; k <= 2 && k <= n; k++) {
            Epoch storage ep = epochs[runId][n - k];
            // the attestation committee indexes into the list too: frozen until the model is confirmed
            if (ep.seed != bytes32(0) && !ep.settled && (!ep.finalized || _doneAt(runId, r, n - k) == NEVER)) return true;
        }
        return false;
    }

    function _failed(uint256 runId, Run storage r, uint256 epoch, Epoch storage ep) internal view returns (uint32) {
        // an epoch aborted for too few trainers never reveals: nobody failed
        if (ep.committed < r.p.minTrainers) return 0;
        uint256 rc = _revealsClose(runId, r, epoch);
        if (rc == NEVER || block.timestamp < rc) return 0;
        uint32 f = (ep.committed - ep.revealed) + ep.failedVerdicts;
        // an epoch never seeded (too few verifiers) asked nobody to respond
        if (ep.seeded && block.timestamp >= rc + r.p.responseWindow) f += ep.revealed - ep.responded;
        return f;
    }

    // ------------------------------------------------------------------ internals: audit

    /// @dev Reveals closed: the seed will be this block's hash. The verifier list is frozen from here
    ///      (joins append past verifierCount; leaves wait), so nobody who learns the hash can steer
    ///      the assignment by reordering the list before the seed is fixed.
    function _scheduleSeed(uint256 runId, Run storage r, uint256 epoch, Epoch storage ep) internal {
        if (epoch > 0) {
            // the previous epoch is over (commits of this one closed after it was done); if it expired
            // unsettled, apply its slashes now, while the list its verdicts index into is unchanged
            Epoch storage prev = epochs[runId][epoch - 1];
            if (prev.seed != bytes32(0) && !prev.finalized && !prev.settled) _settle(runId, r, epoch - 1, prev);
        }
        // verifiers that left (or were slashed) during the previous audit leave the list now
        address[] storage pending = pendingVerifierRemovals[runId];
        while (pending.length > 0) {
            address v = pending[pending.length - 1];
            pending.pop();
            if (members[runId][v].pendingRemoval) _removeVerifier(runId, v);
        }
        uint32 vc = uint32(verifierList[runId].length);
        // never audit with fewer verifiers than the quorum: the epoch waits (and aborts unaudited, nobody
        // slashed for a missing response, at its deadline) until enough have joined
        if (vc < r.p.quorum) revert TooFewVerifiers(runId, epoch, vc, r.p.quorum);
        ep.verifierCount = vc;
        ep.seed = bytes32(block.number);
        emit AuditScheduled(runId, epoch, block.number, vc);
    }

    /// @dev seed = keccak(abi.encode(AUDIT_TAG, chainid, this, runId, epoch, blockhash(seedBlock))).
    function _fixSeed(uint256 runId, uint256 epoch, Epoch storage ep, bytes32 blockHash) internal {
        bytes32 seed = keccak256(abi.encode(AUDIT_TAG, block.chainid, address(this), runId, epoch, blockHash));
        ep.seed = seed;
        ep.seeded = true;
        ep.seededAt = uint64(block.timestamp);
        emit AuditStarted(runId, epoch, seed, ep.verifierCount);
    }

    function _removeVerifier(uint256 runId, address v) internal {
        Member storage m = members[runId][v];
        m.pendingRemoval = false;
        if (m.slot == 0) return;
        address[] storage list = verifierList[runId];
        uint256 idx = m.slot - 1;
        address last = list[list.length - 1];
        list[idx] = last;
        members[runId][last].slot = uint32(idx + 1);
        list.pop();
        m.slot = 0;
        emit VerifierRemoved(runId, v);
    }

    /// @dev Passed: responded and pass votes from a majority of the q = quorum assigned verifiers (an
    ///      audit never starts with fewer verifiers than the quorum: _scheduleSeed). One lying verifier
    ///      can neither fail an honest trainer nor pass a cheater on its own once q >= 3.
    function _isPassed(Run storage r, uint256 lane) internal view returns (bool) {
        return _state(lane) == SUB_RESPONDED && _popcount16(uint16(lane >> 32)) > r.p.quorum / 2;
    }

    /// @dev A lane's SUB_* state (without the SPLIT flag).
    function _state(uint256 lane) internal pure returns (uint8) {
        return uint8(lane >> 24) & 0x7F;
    }

    function _leafCount(uint256 lane) internal pure returns (uint32) {
        return uint32(lane & 0xFFFFFF);
    }

    function _popcount16(uint16 x) internal pure returns (uint16 n) {
        while (x != 0) {
            x &= x - 1;
            n++;
        }
    }

    function _slotOf(uint256 runId, address trainer) internal view returns (uint32) {
        uint32 sp = slotPlusOne[runId][trainer];
        if (sp == 0) revert NotTrainer(runId, trainer);
        return sp - 1;
    }

    function _lane(uint256 runId, uint256 epoch, uint256 slot) internal view returns (uint256) {
        return (lanes[runId][epoch][slot >> 2] >> ((slot & 3) << 6)) & LANE_MASK;
    }

    function _setLane(uint256 runId, uint256 epoch, uint256 slot, uint256 lane) internal {
        uint256 sh = (slot & 3) << 6;
        mapping(uint256 => uint256) storage ws = lanes[runId][epoch];
        ws[slot >> 2] = (ws[slot >> 2] & ~(LANE_MASK << sh)) | (lane << sh);
    }

    /// @dev The one phase guard: `epoch` must be in phase `want`.
    function _inPhase(uint256 runId, Run storage r, uint256 epoch, Phase want) internal view {
        Phase ph = _phase(runId, r, epoch);
        if (ph != want) revert WrongPhase(runId, epoch, uint8(ph), uint8(want));
    }

    function _verdictEpoch(uint256 runId, Run storage r, uint256 epoch) internal view returns (Epoch storage ep) {
        _inPhase(runId, r, epoch, Phase.Auditing);
        uint256 deadline = _responseDeadline(runId, r, epoch) + r.p.verdictWindow;
        if (block.timestamp >= deadline) revert DeadlinePassed(runId, epoch, deadline, block.timestamp);
        ep = epochs[runId][epoch];
    }

    /// @dev docs/protocol.md §5.2: keccak(abi.encode(VERDICT_TAG, chainid, this, runId, epoch, verifier,
    ///      keccak(abi.encode(trainers, passed, witnesses)), salt)).
    function _verdictCommitment(uint256 runId, uint256 epoch, address verifier, bytes32 body, bytes32 salt) internal view returns (bytes32) {
        return keccak256(abi.encode(VERDICT_TAG, block.chainid, address(this), runId, epoch, verifier, body, salt));
    }

    /// @dev When verdict reveals open if not every verifier of the frozen list has committed.
    function _verdictRevealsOpen(uint256 runId, Run storage r, uint256 epoch) internal view returns (uint256) {
        return _responseDeadline(runId, r, epoch) + r.p.verdictWindow / 2;
    }

    /// @dev File witness `w` of assignment index j on `trainer` into its witness groups; `voted` is
    ///      the mask of the indices that revealed before. Group 0 is the first witness revealed: its
    ///      word holds that witness's hash and, in the low 16 bits, the voters NOT in it (the other
    ///      groups' members), so a verdict that agrees with the first one writes nothing (the common,
    ///      honest case). Other groups keep their members' mask; they exist only once the lane's
    ///      SPLIT bit is set, and the union in group 0 says how many of them are live.
    function _witness(uint256 runId, uint256 epoch, address trainer, uint16 voted, uint256 j, bytes32 w) internal returns (bool split) {
        uint256 h = uint256(keccak256(abi.encode(epoch, w))) & ~MASK16;
        mapping(uint256 => uint256) storage gs = witnessGroups[runId][trainer][epoch % HASH_SLOTS];
        if (voted == 0) {
            gs[0] = h;
            return false;
        }
        uint256 v0 = gs[0];
        if (v0 & ~MASK16 == h) return false;
        uint256 bit = uint256(1) << j;
        gs[0] = v0 | bit;
        uint256 n = _popcount16(uint16(v0));
        uint256 g = 1;
        for (uint256 seen = 0; seen < n; g++) {
            uint256 v = gs[g];
            if (v & ~MASK16 == h) {
                gs[g] = v | bit;
                return true;
            }
            seen += _popcount16(uint16(v));
        }
        gs[g] = h | bit;
        return true;
    }

    /// @dev The voters (mask over assignment indices) whose witness differs from the one a majority of
    ///      the q assigned verifiers revealed; 0 when no witness has a majority (nobody is blamed then).
    ///      Only called for a SPLIT lane (otherwise every witness is group 0's).
    function _witnessOutliers(uint256 runId, uint256 epoch, address trainer, uint16 voted, uint256 q) internal view returns (uint16) {
        mapping(uint256 => uint256) storage gs = witnessGroups[runId][trainer][epoch % HASH_SLOTS];
        uint16 others = uint16(gs[0]) & voted;
        if (_popcount16(voted & ~others) > q / 2) return others;
        uint256 n = _popcount16(others);
        for (uint256 g = 1; n > 0; g++) {
            uint16 m = uint16(gs[g]);
            uint256 c = _popcount16(m);
            if (c > q / 2) return voted & ~m;
            n -= c;
        }
        return 0;
    }

    function _verdict(uint256 runId, uint256 epoch, Run storage r, Epoch storage ep, address trainer, bool passed, bytes32 witness) internal {
        uint32 sp = slotPlusOne[runId][trainer];
        uint256 lane = sp == 0 ? 0 : _lane(runId, epoch, sp - 1);
        uint8 st = _state(lane);
        if (st != SUB_RESPONDED && st != SUB_UNAVAILABLE) revert NotResponded(runId, epoch, trainer);
        uint256 q = r.p.quorum;
        uint256 j = _voterIndex(runId, epoch, ep, trainer, q);
        uint256 passBit = uint256(1) << (32 + j);
        uint256 failBit = uint256(1) << (48 + j);
        if (lane & (passBit | failBit) != 0) revert AlreadyVoted(runId, epoch, trainer, msg.sender);
        if (st == SUB_UNAVAILABLE) {
            // judged unavailable while this reveal was pending: the vote is kept (so the rest of the
            // reveal stands) but decides and earns nothing
            _setLane(runId, epoch, sp - 1, lane | (passed ? passBit : failBit));
            emit VerdictSubmitted(runId, epoch, trainer, msg.sender, passed, witness);
            return;
        }
        if (_witness(runId, epoch, trainer, uint16(lane >> 32) | uint16(lane >> 48), j, witness)) lane |= SPLIT;
        // decided the moment one side reaches a majority of the q assigned verifiers
        if (passed) {
            lane |= passBit;
            if (_popcount16(uint16(lane >> 32)) == q / 2 + 1) ep.passed += 1;
        } else {
            lane |= failBit;
            if (_popcount16(uint16(lane >> 48)) == q / 2 + 1) ep.failedVerdicts += 1;
        }
        _setLane(runId, epoch, sp - 1, lane);
        emit VerdictSubmitted(runId, epoch, trainer, msg.sender, passed, witness);
    }

    /// @dev The caller's assignment index among the q verifiers of `trainer`.
    function _voterIndex(uint256 runId, uint256 epoch, Epoch storage ep, address trainer, uint256 q) internal view returns (uint256 j) {
        uint256[] memory idx = _assigned(ep.seed, trainer, q, ep.verifierCount);
        address[] storage list = verifierList[runId];
        while (j < q && list[idx[j]] != msg.sender) j++;
        if (j == q) revert NotAssigned(runId, epoch, trainer, msg.sender);
    }

    /// @dev A reported trainer's availability committee (list indices) and its assignment: q verifiers
    ///      of the frozen list in an order drawn from the hash of the report's block, which nobody knew
    ///      when the report was sent, skipping the trainer's assigned verifiers (its pass voters are what
    ///      is being checked, its fail voters want it out, a silent one may still reveal) and the
    ///      reporter (the accuser). Empty until that block is past, once its hash is out of reach (256
    ///      blocks), or when fewer than q of the first 16 drawn are eligible: nobody is judged then.
    function _availabilityCommittee(uint256 runId, Run storage r, Epoch storage ep, address trainer, uint256 c)
        internal
        view
        returns (uint256[] memory com, uint256[] memory idx)
    {
        uint256 q = r.p.quorum;
        idx = _assigned(ep.seed, trainer, q, ep.verifierCount);
        com = new uint256[](q);
        bytes32 h = c == 0 ? bytes32(0) : blockhash(c >> 200);
        uint256 m = 0;
        if (h != bytes32(0)) {
            uint256 n = ep.verifierCount < 16 ? ep.verifierCount : 16;
            uint256[] memory draw = _assigned(keccak256(abi.encode(ep.seed, h, "availability")), trainer, n, ep.verifierCount);
            address[] storage list = verifierList[runId];
            for (uint256 i = 0; i < n && m < q; i++) {
                bool out = list[draw[i]] == address(uint160(c));
                for (uint256 j = 0; j < q; j++) {
                    if (idx[j] == draw[i]) out = true;
                }
                if (!out) com[m++] = draw[i];
            }
        }
        if (m < q) m = 0;
        assembly ("memory-safe") {
            mstore(com, m)
        }
    }

    function _checkIncluded(uint256 runId, uint256 epoch, Run storage r, Epoch storage ep, address[] calldata included) internal view {
        address prev = address(0);
        for (uint256 i = 0; i < included.length; i++) {
            address t = included[i];
            if (t <= prev) revert NotSorted(i);
            prev = t;
            uint32 sp = slotPlusOne[runId][t];
            if (sp == 0 || !_isPassed(r, _lane(runId, epoch, sp - 1))) revert NotPassing(runId, epoch, t);
        }
        if (included.length != ep.passed) revert PassingOmitted(runId, epoch, included.length, ep.passed);
    }

    // ------------------------------------------------------------------ internals: slashing

    /// @dev Mark an Aborted epoch settled; an expired one (coordinator missed the deadline) is slashed too.
    function _settle(uint256 runId, Run storage r, uint256 epoch, Epoch storage ep) internal {
        uint64 cc = _commitsClose(runId, r, epoch);
        bool tooFew = ep.committed < r.p.minTrainers;
        ep.settled = true;
        if (ep.doneAt == 0) ep.doneAt = tooFew ? cc : uint64(_finalizeDeadline(runId, r, epoch));
        emit EpochSettled(runId, epoch);
        if (!tooFew) _slashAll(runId, epoch, r, ep, false); // aborted: nothing is paid
    }

    /// @dev Slash every committed trainer that did not reveal, did not respond (when its seed was fixed
    ///      in time to answer) or failed its audit by majority, and every assigned verifier whose vote
    ///      went against a majority verdict. A failed trainer's stake goes to the verifiers that failed
    ///      it; the rest is burned, so nobody who can cause a slash profits from it. With `pay` (a
    ///      finalize, never an aborted epoch) the same scan pays the rewards: every passed trainer (the
    ///      creator and coordinator cannot train) and every majority vote on a decided trainer backed by
    ///      the majority witness. Votes are counted per verifier when revealed; the scan only takes back
    ///      the few that do not earn, so an agreeing, unanimous trainer costs one lane read.
    function _slashAll(uint256 runId, uint256 epoch, Run storage r, Epoch storage ep, bool pay) internal {
        uint256 words = (uint256(r.trainerSlots) + 3) >> 2;
        uint256 slashed = 0;
        uint256 paid = 0;
        // a seed fixed with less than half the response window left excuses a missing response
        bool responseDue = ep.seeded && uint256(ep.seededAt) + r.p.responseWindow / 2 <= _responseDeadline(runId, r, epoch);
        address[] storage list = verifierList[runId];
        Payout memory po;
        if (pay && r.pool != 0) po = _payout(runId, epoch, r, ep, list);
        po.finalized = pay;
        mapping(uint256 => uint256) storage ws = lanes[runId][epoch];
        for (uint256 w = 0; w < words; w++) {
            uint256 word = ws[w];
            for (uint256 k = 0; word != 0; k++) {
                uint256 lane = word & LANE_MASK;
                word >>= 64;
                uint8 st = _state(lane);
                if (st == SUB_NONE || (st == SUB_REVEALED && !responseDue)) continue;
                address t = slotTrainer[runId][(w << 2) | k];
                if (st == SUB_UNAVAILABLE) {
                    // slashed when judged unavailable; votes on it earn nothing
                    if (po.votes.length != 0) {
                        uint256[] memory vi = _assigned(ep.seed, t, r.p.quorum, ep.verifierCount);
                        po.nVotes -= _uncount(po.votes, vi, uint16(lane >> 32) | uint16(lane >> 48));
                    }
                    continue;
                }
                if (st == SUB_COMMITTED) {
                    slashed += _slashOne(runId, epoch, r, t, SLASH_NO_REVEAL);
                } else if (st == SUB_REVEALED) {
                    slashed += _slashOne(runId, epoch, r, t, SLASH_NO_RESPONSE);
                } else {
                    (uint256 s, uint256 p) = _settleResponded(runId, epoch, r, ep, list, po, t, lane);
                    slashed += s;
                    paid += p;
                }
            }
        }
        if (ep.verdictReveals < ep.verdictCommits) slashed += _slashSilent(runId, epoch, r, ep, list);
        _settlePayout(slashed, paid);
        if (po.nTrainers != 0 || po.nVotes != 0) _reward(runId, epoch, r, list, po);
    }

    /// @dev One responded trainer's outcome: slash a failed trainer (bounty to its fail voters) and the
    ///      votes against the majority or its witness; credit a passed trainer's reward and take back
    ///      the counted votes that earn nothing. Returns what was slashed and what of it was paid.
    function _settleResponded(
        uint256 runId,
        uint256 epoch,
        Run storage r,
        Epoch storage ep,
        address[] storage list,
        Payout memory po,
        address t,
        uint256 lane
    ) internal returns (uint256 slashed, uint256 paid) {
        uint256 q = r.p.quorum;
        uint16 passes = uint16(lane >> 32);
        uint16 fails = uint16(lane >> 48);
        bool failed = _popcount16(fails) > q / 2;
        bool passed = !failed && _popcount16(passes) > q / 2;
        uint16 against = failed ? passes : (passed ? fails : 0);
        // a verifier whose replay witness is not the majority's did not replay (or lied about it)
        uint16 wrong = lane & SPLIT != 0 ? _witnessOutliers(runId, epoch, t, passes | fails, q) : 0;
        uint16 idle = (passes | fails) & ~((failed ? fails : (passed ? passes : 0)) & ~wrong); // votes that earn nothing
        if (passed && po.trainerShare != 0) {
            credits[t] += po.trainerShare;
            po.nTrainers += 1;
            emit Credited(runId, epoch, t, po.trainerShare, CREDIT_TRAINER_REWARD, address(0));
        }
        if (!passed && fails == 0 && po.finalized && r.p.trainerReward != 0) {
            // undecided for want of votes, none against it: the silent assigned verifiers pay its reward
            uint256 fined = _compensate(runId, epoch, r, list, _assigned(ep.seed, t, q, ep.verifierCount), t, uint16((1 << q) - 1) & ~passes);
            slashed += fined;
            paid += fined;
        }
        if (against == 0 && wrong == 0 && !failed && (idle == 0 || po.votes.length == 0)) return (slashed, paid);
        uint256[] memory idx = _assigned(ep.seed, t, q, ep.verifierCount);
        if (po.votes.length != 0) po.nVotes -= _uncount(po.votes, idx, idle);
        if (against | wrong != 0) slashed += _slashVerifiers(runId, epoch, r, list, idx, t, against | wrong);
        if (failed) {
            uint256 amount = _slashOne(runId, epoch, r, t, SLASH_FAILED_AUDIT);
            slashed += amount;
            if (fails & ~wrong != 0) paid += _pay(runId, epoch, list, idx, fails & ~wrong, amount, t); // no bounty without the work
        }
    }

    /// @dev What a finalized epoch pays, fixed before the scan: in full while the pool covers the
    ///      epoch's gross claims (every passed trainer, every revealed vote), else every claim gets the
    ///      same fraction pool / gross, so nobody is favoured by slot or list order.
    struct Payout {
        uint256 trainerShare; // credited to each passed trainer
        uint256 voteShare; // per earning vote (before the pro-rata fraction, applied per verifier)
        uint256 gross;
        uint256 pool;
        uint256 nTrainers; // trainers credited by the scan
        uint256[] votes; // revealed votes per verifier-list index, minus those that do not earn
        uint256 nVotes;
        bool finalized; // a finalize's scan (an aborted epoch pays nothing, compensations included)
    }

    function _payout(uint256 runId, uint256 epoch, Run storage r, Epoch storage ep, address[] storage list) internal view returns (Payout memory po) {
        po.pool = r.pool;
        if (r.p.verifierReward != 0) {
            po.votes = new uint256[](ep.verifierCount);
            for (uint256 i = 0; i < po.votes.length; i++) {
                uint256 s = verdictCommits[runId][list[i]][epoch % HASH_SLOTS];
                if (s >> 224 != epoch + 1 || uint224(s) >> 32 != 0) continue; // not revealed
                po.votes[i] = uint32(s);
                po.nVotes += uint32(s);
            }
        }
        po.gross = uint256(ep.passed) * r.p.trainerReward + po.nVotes * r.p.verifierReward;
        po.voteShare = r.p.verifierReward;
        po.trainerShare = po.gross <= po.pool ? r.p.trainerReward : (uint256(r.p.trainerReward) * po.pool) / po.gross;
    }

    /// @dev Subtract one per set bit of `mask` from votes[idx[j]]; returns the number of bits.
    function _uncount(uint256[] memory votes, uint256[] memory idx, uint16 mask) internal pure returns (uint256 n) {
        for (uint256 j = 0; mask != 0; j++) {
            if (mask & 1 == 1) {
                votes[idx[j]] -= 1;
                n++;
            }
            mask >>= 1;
        }
    }

    /// @dev Credit the earning votes and book the epoch's payout against the pool (the trainers were
    ///      credited by the scan). Never reverts: pool < 2^128 and every due < 2^128 (rewards < 2^96,
    ///      votes < 2^32), so due * pool fits in 256 bits; what rounding leaves stays in the pool.
    function _reward(uint256 runId, uint256 epoch, Run storage r, address[] storage list, Payout memory po) internal {
        uint256 paid = po.trainerShare * po.nTrainers;
        for (uint256 i = 0; i < po.votes.length; i++) {
            if (po.votes[i] == 0) continue;
            uint256 due = po.votes[i] * po.voteShare;
            if (po.gross > po.pool) due = (due * po.pool) / po.gross;
            if (due == 0) continue;
            credits[list[i]] += due;
            paid += due;
            emit Credited(runId, epoch, list[i], due, CREDIT_VERDICT_REWARD, address(0));
        }
        r.pool = po.pool - paid;
        totalPools -= paid;
        totalCredits += paid;
        emit RewardsPaid(runId, epoch, po.nTrainers, po.nVotes, paid, po.pool - paid);
    }

    /// @dev Credit `amount`, slashed from `source`, in equal shares to the committee members
    ///      (list[idx[j]]) set in `mask`; returns what was credited (the rounding remainder is burned by
    ///      _settlePayout).
    function _pay(uint256 runId, uint256 epoch, address[] storage list, uint256[] memory idx, uint16 mask, uint256 amount, address source)
        internal
        returns (uint256 paid)
    {
        uint256 share = amount / _popcount16(mask);
        for (uint256 j = 0; mask != 0; j++) {
            if (mask & 1 == 1) {
                credits[list[idx[j]]] += share;
                paid += share;
                emit Credited(runId, epoch, list[idx[j]], share, CREDIT_BOUNTY, source);
            }
            mask >>= 1;
        }
    }

    /// @dev The trainer reward for responded trainer `t`, in equal shares from the stakes of its assigned
    ///      verifiers (list[idx[j]]) set in `mask`, which cast no verdict on it by the deadline: an honest
    ///      trainer's pay never depends on a late verdict, and the verifier that was late pays it, not the
    ///      pool. `t` is not included (nobody judged its work), so a trainer and silent verifiers acting
    ///      together only move their own stake (docs/security.md §18). Returns what was credited.
    function _compensate(uint256 runId, uint256 epoch, Run storage r, address[] storage list, uint256[] memory idx, address t, uint16 mask)
        internal
        returns (uint256 total)
    {
        uint256 share = r.p.trainerReward / _popcount16(mask);
        for (uint256 j = 0; mask != 0; j++) {
            if (mask & 1 == 1) {
                address v = list[idx[j]];
                Member storage m = members[runId][v];
                uint256 amount = share < m.stake ? share : m.stake;
                m.stake -= uint96(amount);
                total += amount;
                emit Credited(runId, epoch, t, amount, CREDIT_COMPENSATION, v);
            }
            mask >>= 1;
        }
        credits[t] += total;
    }

    /// @dev Move `slashed` out of the stakes: `paid` of it to credits, the rest burned.
    function _settlePayout(uint256 slashed, uint256 paid) internal {
        if (slashed == 0) return;
        totalStaked -= slashed;
        totalCredits += paid;
        totalBurned += slashed - paid;
    }

    /// @dev Slash the assigned verifiers (list[idx[j]]) of `trainer` whose index j is set in `mask`.
    function _slashVerifiers(
        uint256 runId,
        uint256 epoch,
        Run storage r,
        address[] storage list,
        uint256[] memory idx,
        address trainer,
        uint16 mask
    ) internal returns (uint256 total) {
        for (uint256 j = 0; mask != 0; j++) {
            if (mask & 1 == 1) total += _slashVerifier(runId, epoch, r, list[idx[j]], trainer);
            mask >>= 1;
        }
    }

    /// @dev Slash verifier `v` slashBps (for its vote on `trainer`; zero: for verdicts it never revealed)
    ///      and take it off the list at the next scheduling (the running audit still indexes into it).
    function _slashVerifier(uint256 runId, uint256 epoch, Run storage r, address v, address trainer) internal returns (uint256 amount) {
        Member storage m = members[runId][v];
        amount = (uint256(m.stake) * r.p.slashBps) / BPS;
        m.stake -= uint96(amount);
        if (m.leaveEpoch == NEVER_EPOCH) {
            m.leaveEpoch = r.nextEpoch;
            m.leftAt = uint48(block.timestamp);
            m.pendingRemoval = true;
            pendingVerifierRemovals[runId].push(v);
            emit VerifierLeft(runId, v, false);
        }
        emit VerifierSlashed(runId, epoch, v, trainer, amount);
    }

    /// @dev Slash every verifier of the frozen list that committed verdicts and never revealed them (the
    ///      verdict deadline passed: finalize waits for every reveal until then). A commitment held back
    ///      costs what a wrong vote costs, so nobody can look at the others' reveals and reveal only
    ///      when it agrees. Burned.
    function _slashSilent(uint256 runId, uint256 epoch, Run storage r, Epoch storage ep, address[] storage list) internal returns (uint256 total) {
        for (uint256 i = 0; i < ep.verifierCount; i++) {
            uint256 s = verdictCommits[runId][list[i]][epoch % HASH_SLOTS];
            if (s >> 224 == epoch + 1 && uint224(s) >> 32 != 0) total += _slashVerifier(runId, epoch, r, list[i], address(0));
        }
    }

    /// @dev Slash one committed trainer and remove it from every epoch after `epoch` (once per
    ///      offence: if the next epoch is still taking commitments it leaves that epoch too); returns
    ///      the amount.
    function _slashOne(uint256 runId, uint256 epoch, Run storage r, address t, uint8 reason) internal returns (uint256 amount) {
        Member storage m = members[runId][t];
        amount = (uint256(m.stake) * r.p.slashBps) / BPS;
        m.stake -= uint96(amount);
        uint256 next = epoch + 1;
        // slashed late (an expired epoch settled while the next one already audits): it still takes
        // part in that next epoch, so it stays bonded through it
        if (next < r.nextEpoch && _lane(runId, next, m.slot) != 0 && _phase(runId, r, next) != Phase.Committing) next += 1;
        if (m.leaveEpoch > next) {
            if (m.leaveEpoch == NEVER_EPOCH) {
                r.activeTrainers -= 1;
                m.leftAt = uint48(block.timestamp);
            }
            m.leaveEpoch = uint32(next);
            emit TrainerLeft(runId, t, next);
            if (next < r.nextEpoch && _phase(runId, r, next) == Phase.Committing) {
                // it was counted in the open epoch: take it out, commitment and all
                Epoch storage ne = epochs[runId][next];
                ne.expected -= 1;
                if (_lane(runId, next, m.slot) != 0) {
                    _setLane(runId, next, m.slot, 0);
                    ne.committed -= 1;
                }
                if (ne.committed == ne.expected && ne.allCommittedAt == 0) ne.allCommittedAt = uint64(block.timestamp);
            }
        }
        emit Slashed(runId, epoch, t, amount, reason);
    }
}
