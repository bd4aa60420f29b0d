// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

/// @title Veriloco: on-chain referee for verifiable DiLoCoX training runs
/// @notice Holds stakes, orders epochs, binds trainers to their commitments, fixes audit seeds,
///         checks audit responses against revealed Merkle trace roots, collects verdicts, and lets
///         an epoch finalize only when every included trainer passed and no passing one was left out.
/// @dev Byte formats follow docs/protocol.md §3-§5. Epoch phases are derived from stored facts and
///      block.timestamp (never stored as an enum), so deadlines need no keeper transaction.
///      See docs/contract.md for the state machine, timing rules and the audit-seed bias discussion.
contract Veriloco {
    // ------------------------------------------------------------------ types

    /// @notice Phase of an epoch, as returned by epochStatus.
    enum Phase {
        NotStarted,
        Committing,
        Revealing,
        Auditing,
        Finalized,
        Aborted
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
    }

    struct Run {
        RunParams p;
        // one slot: read by nearly every call
        address creator; // zero for an unknown run id
        uint32 nextEpoch; // epochs [0, nextEpoch) are opened
        uint32 activeTrainers;
        uint32 trainerSlots; // high-water mark of slots; a withdrawn trainer's slot is handed out again
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
    }

    /// @dev One slot per member.
    struct Member {
        uint96 stake;
        uint32 slot; // trainer slot, or index+1 in the verifier list (0 = removed)
        uint32 joinEpoch;
        uint32 leaveEpoch; // NEVER_EPOCH while active
        uint48 leftAt;
        uint8 role; // ROLE_*
        bool pendingRemoval; // verifier left while an audit was running
    }

    // A trainer's epoch record is a 64-bit lane, four per storage word, indexed by trainer slot:
    // bits 0-23 leafCount, 24-31 state (SUB_*), 32-47 pass-vote mask, 48-63 fail-vote mask (bit j =
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

    uint8 internal constant ROLE_NONE = 0;
    uint8 internal constant ROLE_TRAINER = 1;
    uint8 internal constant ROLE_VERIFIER = 2;

    /// @notice Reasons carried by Slashed.
    uint8 public constant SLASH_NO_REVEAL = 1;
    uint8 public constant SLASH_NO_RESPONSE = 2;
    uint8 public constant SLASH_FAILED_AUDIT = 3;

    bytes32 public constant COMMIT_TAG = keccak256("veriloco.commit.v1");
    bytes32 public constant AUDIT_TAG = keccak256("veriloco.audit.v1");

    uint64 internal constant NEVER = type(uint64).max;
    uint32 internal constant NEVER_EPOCH = type(uint32).max;
    uint256 internal constant BPS = 10_000;
    uint256 internal constant MAX_LEAVES = (1 << 24) - 1;

    // ------------------------------------------------------------------ storage

    /// @notice Number of runs created; run ids are 1..runCount.
    uint256 public runCount;
    /// @notice Sum of all stakes the contract holds (active, leaving and unbonding).
    uint256 public totalStaked;
    /// @notice Sum of all claimable credits (slashed funds owed to run creators).
    uint256 public totalCredits;
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

    uint256 private locked = 1;

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
    /// @notice A state-changing call re-entered the contract.
    error Reentrancy();

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
    /// @notice A verifier judged a trainer.
    event VerdictSubmitted(uint256 indexed runId, uint256 indexed epoch, address indexed trainer, address verifier, bool passed, string evidenceCid);
    /// @notice The coordinator's new model was accepted.
    event EpochFinalized(uint256 indexed runId, uint256 indexed epoch, string modelCid, bytes32 modelDigest, uint256 included);
    /// @notice An epoch whose coordinator missed the finalize deadline was settled (slashes applied, no model).
    event EpochSettled(uint256 indexed runId, uint256 indexed epoch);
    /// @notice An assigned verifier voted against the majority verdict on `trainer` and lost `amount`
    ///         of its stake; it is also removed from the verifier list when the next audit is scheduled.
    event VerifierSlashed(uint256 indexed runId, uint256 indexed epoch, address indexed verifier, address trainer, uint256 amount);
    /// @notice A trainer lost `amount` of its stake for `reason` (SLASH_*); it is also removed from the run.
    event Slashed(uint256 indexed runId, uint256 indexed epoch, address indexed trainer, uint256 amount, uint8 reason);
    /// @notice A member withdrew its remaining stake.
    event Withdrawn(uint256 indexed runId, address indexed account, uint256 amount);
    /// @notice An account claimed its credits (slashed funds).
    event Claimed(address indexed account, uint256 amount);

    // ------------------------------------------------------------------ modifiers

    modifier nonReentrant() {
        if (locked != 1) revert Reentrancy();
        locked = 2;
        _;
        locked = 1;
    }

    // ------------------------------------------------------------------ runs

    /// @notice Create a run; the caller becomes its creator and receives slashed funds as credits.
    /// @param p The enforced config fields; the full config is the canonical JSON behind p.configCid.
    /// @return runId The new run's id (1-based).
    function createRun(RunParams calldata p) external returns (uint256 runId) {
        if (p.coordinator == address(0)) revert InvalidParams("coordinator");
        if (p.minTrainers == 0 || p.maxTrainers < p.minTrainers) revert InvalidParams("minTrainers/maxTrainers");
        if (p.maxVerifiers == 0) revert InvalidParams("maxVerifiers");
        if (p.quorum == 0 || p.quorum > 16) revert InvalidParams("quorum (1..16)");
        if (p.auditSteps == 0 || p.auditSteps > 64) revert InvalidParams("auditSteps (1..64)");
        if (p.finalCheckBps > BPS) revert InvalidParams("finalCheckBps");
        if (p.slashBps > BPS) revert InvalidParams("slashBps");
        if (p.commitWindow == 0 || p.revealWindow == 0 || p.responseWindow == 0 || p.verdictWindow == 0 || p.finalizeWindow == 0) {
            revert InvalidParams("windows must be positive");
        }
        if (p.trainerStake == 0 || p.verifierStake == 0 || p.trainerStake > type(uint96).max || p.verifierStake > type(uint96).max) {
            revert InvalidParams("stakes must be in 1..2^96-1 wei");
        }
        runId = ++runCount;
        Run storage r = runs[runId];
        r.p = p;
        r.creator = msg.sender;
        emit RunCreated(runId, msg.sender, p.coordinator, p.configCid, p.configDigest);
    }

    // ------------------------------------------------------------------ membership

    /// @notice Join a run as a trainer by sending exactly trainerStake; the trainer gets a free slot.
    /// @dev It takes part from the first epoch that has not opened yet.
    function joinTrainer(uint256 runId) external payable {
        Run storage r = _run(runId);
        Member storage m = members[runId][msg.sender];
        if (m.role != ROLE_NONE) revert AlreadyJoined(runId, msg.sender);
        if (msg.value != r.p.trainerStake) revert WrongStake(msg.value, r.p.trainerStake);
        if (r.activeTrainers >= r.p.maxTrainers) revert RunFull(runId, r.p.maxTrainers);
        // a withdrawn trainer's slot first: its epochs are all settled, and lanes are per epoch, so
        // the new holder's epochs (from nextEpoch on) never share a lane with the old holder's
        uint32[] storage free = freeSlots[runId];
        uint32 slot;
        if (free.length > 0) {
            slot = free[free.length - 1];
            free.pop();
        } else {
            slot = r.trainerSlots++;
        }
        slotPlusOne[runId][msg.sender] = slot + 1;
        slotTrainer[runId][slot] = msg.sender;
        r.activeTrainers += 1;
        m.stake = uint96(msg.value);
        m.slot = slot;
        m.joinEpoch = r.nextEpoch;
        m.leaveEpoch = NEVER_EPOCH;
        m.role = ROLE_TRAINER;
        totalStaked += msg.value;
        emit TrainerJoined(runId, msg.sender, slot, msg.value, r.nextEpoch);
    }

    /// @notice Join a run as a verifier by sending exactly verifierStake.
    function joinVerifier(uint256 runId) external payable {
        Run storage r = _run(runId);
        Member storage m = members[runId][msg.sender];
        if (m.role != ROLE_NONE) revert AlreadyJoined(runId, msg.sender);
        if (msg.value != r.p.verifierStake) revert WrongStake(msg.value, r.p.verifierStake);
        address[] storage list = verifierList[runId];
        if (list.length >= r.p.maxVerifiers) revert RunFull(runId, r.p.maxVerifiers);
        list.push(msg.sender);
        m.stake = uint96(msg.value);
        m.slot = uint32(list.length);
        m.joinEpoch = r.nextEpoch;
        m.leaveEpoch = NEVER_EPOCH;
        m.role = ROLE_VERIFIER;
        totalStaked += msg.value;
        emit VerifierJoined(runId, msg.sender, msg.value);
    }

    /// @notice Leave a run. A trainer stops at the next epoch that has not opened; a verifier leaves the
    ///         list at once, or when the running audit's seed is next fixed. Stake unbonds after
    ///         unbondingDelay and once the epochs the member took part in are settled.
    function leaveRun(uint256 runId) external {
        Run storage r = _run(runId);
        Member storage m = members[runId][msg.sender];
        if (m.role == ROLE_NONE || m.leaveEpoch != NEVER_EPOCH) {
            if (m.role == ROLE_VERIFIER) revert NotVerifier(runId, msg.sender);
            revert NotTrainer(runId, msg.sender);
        }
        m.leaveEpoch = r.nextEpoch;
        m.leftAt = uint48(block.timestamp);
        if (m.role == ROLE_TRAINER) {
            r.activeTrainers -= 1;
            emit TrainerLeft(runId, msg.sender, r.nextEpoch);
        } else if (_auditRunning(runId, r)) {
            m.pendingRemoval = true;
            pendingVerifierRemovals[runId].push(msg.sender);
            emit VerifierLeft(runId, msg.sender, false);
        } else {
            emit VerifierLeft(runId, msg.sender, true);
            _removeVerifier(runId, msg.sender);
        }
    }

    /// @notice Withdraw the remaining stake after leaving and unbonding (pull payment).
    function withdraw(uint256 runId) external nonReentrant {
        Run storage r = _run(runId);
        Member storage m = members[runId][msg.sender];
        if (m.role == ROLE_NONE || m.leaveEpoch == NEVER_EPOCH) revert NotLeaving(runId, msg.sender);
        uint256 availableAt = uint256(m.leftAt) + r.p.unbondingDelay;
        if (block.timestamp < availableAt) revert StillBonded(runId, msg.sender, availableAt, block.timestamp);
        if (m.role == ROLE_TRAINER) {
            // the last two epochs it may have taken part in must have applied their slashes
            uint256 le = m.leaveEpoch;
            for (uint256 k = 1; k <= 2 && k <= le; k++) {
                uint256 e = le - k;
                if (e >= m.joinEpoch && !_settled(runId, r, e)) revert EpochNotSettled(runId, e);
            }
        } else if (m.pendingRemoval) {
            if (_auditRunning(runId, r)) revert EpochNotSettled(runId, r.nextEpoch == 0 ? 0 : r.nextEpoch - 1);
            _removeVerifier(runId, msg.sender);
        }
        uint256 amount = m.stake;
        if (amount == 0) revert NothingToWithdraw(msg.sender);
        if (m.role == ROLE_TRAINER) {
            // every epoch it took part in is settled: its slot can serve the next trainer
            freeSlots[runId].push(m.slot);
            delete slotPlusOne[runId][msg.sender];
        }
        // effects: forget the membership entirely so the account may join again later
        delete members[runId][msg.sender];
        totalStaked -= amount;
        emit Withdrawn(runId, msg.sender, amount);
        (bool ok,) = msg.sender.call{value: amount}("");
        if (!ok) revert TransferFailed(msg.sender, amount);
    }

    /// @notice Claim credits (slashed funds owed to run creators).
    function claim() external nonReentrant {
        uint256 amount = credits[msg.sender];
        if (amount == 0) revert NothingToWithdraw(msg.sender);
        credits[msg.sender] = 0;
        totalCredits -= amount;
        emit Claimed(msg.sender, amount);
        (bool ok,) = msg.sender.call{value: amount}("");
        if (!ok) revert TransferFailed(msg.sender, amount);
    }

    // ------------------------------------------------------------------ commit / reveal

    /// @notice Commit to this epoch's payload and trace (docs/protocol.md §4). The first commitment
    ///         of an epoch opens it; epoch e+1 may open once epoch e is auditing.
    /// @param commitment keccak(abi.encode(COMMIT_TAG, chainid, this, runId, epoch, trainer,
    ///        payloadDigest, traceRoot, uint32 leafCount, salt)).
    function commit(uint256 runId, uint256 epoch, bytes32 commitment) external {
        Run storage r = _run(runId);
        if (commitment == bytes32(0)) revert ZeroCommitment();
        Member storage m = members[runId][msg.sender];
        if (m.role != ROLE_TRAINER) revert NotTrainer(runId, msg.sender);
        if (epoch == r.nextEpoch) _open(runId, r, epoch);
        Epoch storage ep = epochs[runId][epoch];
        Phase ph = _phase(runId, r, epoch);
        if (ph != Phase.Committing) revert WrongPhase(runId, epoch, uint8(ph), uint8(Phase.Committing));
        if (epoch < m.joinEpoch || epoch >= m.leaveEpoch) revert NotEligible(runId, epoch, msg.sender, m.joinEpoch, m.leaveEpoch);
        if (_lane(runId, epoch, m.slot) != 0) revert AlreadyCommitted(runId, epoch, msg.sender);
        hashes[runId][msg.sender][epoch % HASH_SLOTS] = commitment;
        _setLane(runId, epoch, m.slot, uint256(SUB_COMMITTED) << 24);
        uint32 c = ep.committed + 1;
        ep.committed = c;
        if (c == ep.expected) ep.allCommittedAt = uint64(block.timestamp);
        emit Committed(runId, epoch, msg.sender, commitment);
    }

    /// @notice Reveal what was committed. The last reveal of an epoch closes reveals and schedules the
    ///         audit seed: the hash of this very block, which nobody can know when signing the reveal.
    /// @param payloadCid CID of the published payload (kept in the Revealed event, not in storage).
    function reveal(
        uint256 runId,
        uint256 epoch,
        string calldata payloadCid,
        bytes32 payloadDigest,
        bytes32 traceRoot,
        uint32 leafCount,
        bytes32 salt
    ) external {
        Run storage r = _run(runId);
        Phase ph = _phase(runId, r, epoch);
        if (ph != Phase.Revealing) revert WrongPhase(runId, epoch, uint8(ph), uint8(Phase.Revealing));
        uint32 slot = _slotOf(runId, msg.sender);
        uint256 lane = _lane(runId, epoch, slot);
        uint8 st = uint8(lane >> 24);
        if (st == SUB_NONE) revert NotCommitted(runId, epoch, msg.sender);
        if (st != SUB_COMMITTED) revert AlreadyRevealed(runId, epoch, msg.sender);
        if (leafCount < 2 || leafCount > MAX_LEAVES) revert BadLeafCount(leafCount, 2, MAX_LEAVES);
        bytes32 c = commitmentOf(runId, epoch, msg.sender, payloadDigest, traceRoot, leafCount, salt);
        bytes32 committed = hashes[runId][msg.sender][epoch % HASH_SLOTS];
        if (c != committed) revert RevealMismatch(runId, epoch, msg.sender, c, committed);
        hashes[runId][msg.sender][epoch % HASH_SLOTS] = traceRoot;
        _setLane(runId, epoch, slot, (uint256(SUB_REVEALED) << 24) | leafCount);
        Epoch storage ep = epochs[runId][epoch];
        uint32 n = ep.revealed + 1;
        ep.revealed = n;
        emit Revealed(runId, epoch, msg.sender, payloadCid, payloadDigest, traceRoot, leafCount);
        if (n == ep.committed) {
            ep.allRevealedAt = uint64(block.timestamp);
            _scheduleSeed(runId, r, epoch, ep);
        }
    }

    /// @notice Move the audit seed of an epoch whose reveals have closed one step on (anyone may call):
    ///         schedule it (the seed block is this block) if nobody has yet, else fix it from the seed
    ///         block's hash once that block is in the past. Call again in a later block until
    ///         epochAudit reports it seeded; a seed block more than 256 blocks old is rescheduled.
    function startAudit(uint256 runId, uint256 epoch) external {
        Run storage r = _run(runId);
        Phase ph = _phase(runId, r, epoch);
        if (ph != Phase.Auditing) revert WrongPhase(runId, epoch, uint8(ph), uint8(Phase.Auditing));
        Epoch storage ep = epochs[runId][epoch];
        if (ep.seeded) return;
        uint256 seedBlock = uint256(ep.seed);
        if (seedBlock == 0) {
            _scheduleSeed(runId, r, epoch, ep);
        } else if (block.number > seedBlock) {
            bytes32 h = blockhash(seedBlock);
            if (h == bytes32(0)) {
                // out of blockhash's reach: draw from this block instead (list and count stay frozen)
                ep.seed = bytes32(block.number);
                emit AuditScheduled(runId, epoch, block.number, ep.verifierCount);
            } else {
                _fixSeed(runId, epoch, ep, h);
            }
        }
    }

    // ------------------------------------------------------------------ audit

    /// @notice Answer the audit: post the manifest CID and, for each challenged transition k->k+1 in
    ///         draw order, the digests of leaves k and k+1 (then leaf L-1 if the final check is drawn),
    ///         with their proofs flattened in the same order: a pair proof per transition, then a
    ///         plain proof of leaf L-1 (docs/protocol.md §5).
    /// @dev The seed must be fixed first (startAudit): the trainer needs it to know what to prove.
    function respond(uint256 runId, uint256 epoch, string calldata manifestCid, bytes32[] calldata leaves, bytes32[] calldata proofs) external {
        Run storage r = _run(runId);
        Phase ph = _phase(runId, r, epoch);
        if (ph != Phase.Auditing) revert WrongPhase(runId, epoch, uint8(ph), uint8(Phase.Auditing));
        Epoch storage ep = epochs[runId][epoch];
        uint256 deadline = _revealsClose(runId, r, epoch) + r.p.responseWindow;
        if (block.timestamp >= deadline) revert DeadlinePassed(runId, epoch, deadline, block.timestamp);
        uint32 slot = _slotOf(runId, msg.sender);
        uint256 lane = _lane(runId, epoch, slot);
        uint8 st = uint8(lane >> 24);
        if (st == SUB_RESPONDED) revert AlreadyResponded(runId, epoch, msg.sender);
        if (st != SUB_REVEALED) revert NotRevealed(runId, epoch, msg.sender);
        if (!ep.seeded) revert AuditSeedPending(runId, epoch, uint256(ep.seed));
        _checkResponse(runId, epoch, r.p, ep.seed, hashes[runId][msg.sender][epoch % HASH_SLOTS], uint32(lane & 0xFFFFFF), leaves, proofs);
        _setLane(runId, epoch, slot, (uint256(SUB_RESPONDED) << 24) | uint32(lane & 0xFFFFFF));
        ep.responded += 1;
        emit Responded(runId, epoch, msg.sender, manifestCid);
    }

    /// @notice Judge one trainer: only its assigned verifiers, once each, after it responded.
    function submitVerdict(uint256 runId, uint256 epoch, address trainer, bool passed, string calldata evidenceCid) external {
        Run storage r = _run(runId);
        Epoch storage ep = _verdictEpoch(runId, r, epoch);
        _verdict(runId, epoch, r, ep, trainer, passed, evidenceCid);
    }

    /// @notice Judge several trainers in one transaction (same rules as submitVerdict).
    function submitVerdicts(uint256 runId, uint256 epoch, address[] calldata trainers, bool[] calldata passed, string[] calldata evidenceCids) external {
        if (trainers.length != passed.length || trainers.length != evidenceCids.length) {
            revert BadResponseLength(trainers.length, passed.length, evidenceCids.length, trainers.length);
        }
        Run storage r = _run(runId);
        Epoch storage ep = _verdictEpoch(runId, r, epoch);
        for (uint256 i = 0; i < trainers.length; i++) {
            _verdict(runId, epoch, r, ep, trainers[i], passed[i], evidenceCids[i]);
        }
    }

    // ------------------------------------------------------------------ finalize / settle

    /// @notice Accept the coordinator's aggregate. Every included trainer must have a passing verdict
    ///         quorum and every passing trainer must be included; trainers that did not reveal, did
    ///         not respond or failed an audit are slashed. Allowed once every committed trainer is
    ///         decided or the verdict window closed, and before the finalize deadline.
    /// @param includedTrainers The passing trainers, strictly ascending by address.
    function finalize(uint256 runId, uint256 epoch, string calldata modelCid, bytes32 modelDigest, address[] calldata includedTrainers) external {
        Run storage r = _run(runId);
        if (msg.sender != r.p.coordinator) revert NotCoordinator(runId, msg.sender, r.p.coordinator);
        Phase ph = _phase(runId, r, epoch);
        if (ph != Phase.Auditing) revert WrongPhase(runId, epoch, uint8(ph), uint8(Phase.Auditing));
        Epoch storage ep = epochs[runId][epoch];
        uint256 verdictDeadline = _revealsClose(runId, r, epoch) + r.p.responseWindow + r.p.verdictWindow;
        uint256 decided = ep.passed + _failed(runId, r, epoch, ep);
        if (decided < ep.committed && block.timestamp < verdictDeadline) {
            revert NotReady(runId, epoch, decided, ep.committed, verdictDeadline);
        }
        _checkIncluded(runId, epoch, r, ep, includedTrainers);
        ep.finalized = true;
        ep.doneAt = uint64(block.timestamp);
        ep.modelCid = modelCid;
        ep.modelDigest = modelDigest;
        emit EpochFinalized(runId, epoch, modelCid, modelDigest, includedTrainers.length);
        _slashAll(runId, epoch, r, ep);
    }

    /// @notice Settle an epoch whose coordinator missed the finalize deadline: it becomes Aborted (no
    ///         new model; the next epoch builds on the last finalized one) and the same slashes apply.
    function settle(uint256 runId, uint256 epoch) external {
        Run storage r = _run(runId);
        Epoch storage ep = epochs[runId][epoch];
        Phase ph = _phase(runId, r, epoch);
        if (ph != Phase.Aborted || ep.settled) {
            if (ph == Phase.Auditing) {
                uint256 fd = _finalizeDeadline(runId, r, epoch);
                revert NotExpired(runId, epoch, fd, block.timestamp);
            }
            revert WrongPhase(runId, epoch, uint8(ph), uint8(Phase.Aborted));
        }
        _settle(runId, r, epoch, ep);
    }

    // ------------------------------------------------------------------ views
    // ------------------------------------------------------------------ views

    /// @notice The epoch trainers should commit to now: the newest opened epoch while it is still
    ///         committing or revealing, otherwise the next one.
    function currentEpoch(uint256 runId) external view returns (uint256) {
        Run storage r = _run(runId);
        if (r.nextEpoch == 0) return 0;
        uint256 last = r.nextEpoch - 1;
        Phase ph = _phase(runId, r, last);
        return (ph == Phase.Committing || ph == Phase.Revealing) ? last : last + 1;
    }

    /// @notice Phase, counts and finalized model CID of an epoch (DESIGN.md §3).
    function epochStatus(uint256 runId, uint256 epoch)
        external
        view
        returns (uint8 phase, uint32 committed, uint32 revealed, uint32 passed, uint32 failed, string memory modelCid)
    {
        Run storage r = _run(runId);
        Epoch storage ep = epochs[runId][epoch];
        phase = uint8(_phase(runId, r, epoch));
        committed = ep.committed;
        revealed = ep.revealed;
        passed = ep.passed;
        failed = epoch < r.nextEpoch ? _failed(runId, r, epoch, ep) : 0;
        modelCid = ep.modelCid;
    }

    /// @notice Timing and audit facts of an epoch; deadlines are 0 while not yet determined.
    function epochTimes(uint256 runId, uint256 epoch)
        external
        view
        returns (
            uint64 openedAt,
            uint64 commitsClose,
            uint64 revealsClose,
            uint64 responseDeadline,
            uint64 verdictDeadline,
            uint64 finalizeDeadline,
            uint64 doneAt
        )
    {
        Run storage r = _run(runId);
        Epoch storage ep = epochs[runId][epoch];
        if (epoch >= r.nextEpoch) return (0, 0, 0, 0, 0, 0, 0);
        openedAt = ep.openedAt;
        doneAt = ep.doneAt;
        uint64 cc = _commitsClose(runId, r, epoch);
        if (cc == NEVER) return (openedAt, 0, 0, 0, 0, 0, doneAt);
        commitsClose = cc;
        revealsClose = uint64(_revealsClose(runId, r, epoch));
        responseDeadline = revealsClose + r.p.responseWindow;
        verdictDeadline = responseDeadline + r.p.verdictWindow;
        finalizeDeadline = verdictDeadline + r.p.finalizeWindow;
    }

    /// @notice Audit facts of an epoch.
    function epochAudit(uint256 runId, uint256 epoch)
        external
        view
        returns (uint32 expected, uint32 responded, uint32 verifierCount, bool seeded, bytes32 seed, bytes32 modelDigest)
    {
        _run(runId);
        Epoch storage ep = epochs[runId][epoch];
        return (ep.expected, ep.responded, ep.verifierCount, ep.seeded, ep.seeded ? ep.seed : bytes32(0), ep.modelDigest);
    }

    /// @notice The enforced config of a run.
    function runParams(uint256 runId) external view returns (RunParams memory) {
        return _run(runId).p;
    }

    /// @notice The mutable state of a run.
    function runState(uint256 runId)
        external
        view
        returns (address creator, uint32 nextEpoch, uint32 activeTrainers, uint32 trainerSlots, uint32 verifierCount)
    {
        Run storage r = _run(runId);
        return (r.creator, r.nextEpoch, r.activeTrainers, r.trainerSlots, uint32(verifierList[runId].length));
    }

    /// @notice A member's record; role 0 none, 1 trainer, 2 verifier; leaveEpoch is 2^32-1 while active.
    function member(uint256 runId, address account)
        external
        view
        returns (uint8 role, uint96 stake, uint32 slot, uint32 joinEpoch, uint32 leaveEpoch, uint48 leftAt)
    {
        Member storage m = members[runId][account];
        return (m.role, m.stake, m.slot, m.joinEpoch, m.leaveEpoch, m.leftAt);
    }

    /// @notice Active trainers (by slot) and the verifier list (join order, as used for assignment).
    function participants(uint256 runId) external view returns (address[] memory trainers, address[] memory verifiers) {
        Run storage r = _run(runId);
        trainers = new address[](r.activeTrainers);
        uint256 n = 0;
        for (uint256 slot = 0; slot < r.trainerSlots && n < trainers.length; slot++) {
            address t = slotTrainer[runId][slot];
            Member storage m = members[runId][t];
            if (m.role == ROLE_TRAINER && m.slot == slot && m.leaveEpoch == NEVER_EPOCH) trainers[n++] = t;
        }
        verifiers = verifierList[runId];
    }

    /// @notice The trainer that holds a slot, or held it last (a withdrawn trainer's slot is reused).
    function trainerAt(uint256 runId, uint256 slot) external view returns (address) {
        return slotTrainer[runId][slot];
    }

    /// @notice A trainer's submission in an epoch. state: 0 none, 1 committed, 2 revealed, 3 responded.
    /// @dev After the reveal, the commitment and payload digest/CID are in the Committed/Revealed events;
    ///      once the trainer commits three epochs later, this epoch's hashes are in the events only.
    /// @return commitment The commitment while only committed, else zero.
    /// @return traceRoot The revealed trace root, else zero.
    function submission(uint256 runId, uint256 epoch, address trainer)
        external
        view
        returns (bytes32 commitment, bytes32 traceRoot, uint32 leafCount, uint8 state, uint16 passVotes, uint16 failVotes, bool passed)
    {
        Run storage r = _run(runId);
        uint32 sp = slotPlusOne[runId][trainer];
        if (sp == 0) return (commitment, traceRoot, 0, SUB_NONE, 0, 0, false);
        uint256 lane = _lane(runId, epoch, sp - 1);
        passed = _isPassed(r, lane, epochs[runId][epoch]);
        state = uint8(lane >> 24);
        bool reused = state != SUB_NONE && _lane(runId, epoch + HASH_SLOTS, sp - 1) != 0;
        bytes32 h = reused ? bytes32(0) : hashes[runId][trainer][epoch % HASH_SLOTS];
        if (state == SUB_COMMITTED) commitment = h;
        else traceRoot = h;
        leafCount = uint32(lane & 0xFFFFFF);
        passVotes = _popcount16(uint16(lane >> 32));
        failVotes = _popcount16(uint16(lane >> 48));
    }

    /// @notice A trainer's audit assignment (docs/protocol.md §5); empty until the seed is fixed.
    /// @return steps Challenged transitions k (k -> k+1), in draw order, duplicates kept.
    /// @return finalCheck Whether the end-state -> payload transition is checked.
    /// @return verifiers Assigned verifiers, assignment index order; empty once the epoch is finalized or settled.
    function assignment(uint256 runId, uint256 epoch, address trainer)
        external
        view
        returns (uint256[] memory steps, bool finalCheck, address[] memory verifiers)
    {
        Run storage r = _run(runId);
        Epoch storage ep = epochs[runId][epoch];
        uint32 sp = slotPlusOne[runId][trainer];
        uint32 leafCount = sp == 0 ? 0 : uint32(_lane(runId, epoch, sp - 1) & 0xFFFFFF);
        if (!ep.seeded || leafCount < 2) return (steps, false, verifiers);
        steps = new uint256[](r.p.auditSteps);
        for (uint256 j = 0; j < steps.length; j++) steps[j] = _stepIndex(ep.seed, trainer, j, leafCount);
        finalCheck = _finalCheck(ep.seed, trainer, r.p.finalCheckBps);
        // the list is frozen only until the epoch is finalized or settled; after that a removal may
        // have moved entries, and VerdictSubmitted events say who judged
        if (ep.finalized || ep.settled) return (steps, finalCheck, verifiers);
        uint256 q = _needed(r, ep);
        verifiers = new address[](q);
        uint256[] memory idx = _assigned(ep.seed, trainer, q, ep.verifierCount);
        address[] storage list = verifierList[runId];
        for (uint256 j = 0; j < q; j++) verifiers[j] = list[idx[j]];
    }

    /// @notice The commitment a trainer must post (docs/protocol.md §4).
    function commitmentOf(
        uint256 runId,
        uint256 epoch,
        address trainer,
        bytes32 payloadDigest,
        bytes32 traceRoot,
        uint32 leafCount,
        bytes32 salt
    ) public view returns (bytes32) {
        return keccak256(abi.encode(COMMIT_TAG, block.chainid, address(this), runId, epoch, trainer, payloadDigest, traceRoot, leafCount, salt));
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
        if (ep.finalized) return Phase.Finalized;
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

    function _finalizeDeadline(uint256 runId, Run storage r, uint256 epoch) internal view returns (uint256) {
        uint256 rc = _revealsClose(runId, r, epoch);
        if (rc == NEVER) return NEVER;
        return rc + r.p.responseWindow + r.p.verdictWindow + r.p.finalizeWindow;
    }

    /// @dev The time an opened epoch became Finalized or Aborted, or NEVER if it has not yet.
    function _doneAt(uint256 runId, Run storage r, uint256 epoch) internal view returns (uint64) {
        Epoch storage ep = epochs[runId][epoch];
        if (ep.doneAt != 0) return ep.doneAt;
        uint64 cc = _commitsClose(runId, r, epoch);
        if (cc == NEVER || block.timestamp < cc) return NEVER;
        if (ep.committed < r.p.minTrainers) return cc;
        uint256 fd = (ep.allRevealedAt != 0 ? ep.allRevealedAt : uint256(cc) + r.p.revealWindow) + r.p.responseWindow
            + r.p.verdictWindow + r.p.finalizeWindow;
        return block.timestamp >= fd ? uint64(fd) : NEVER;
    }

    /// @dev True once an epoch's slashes (if any) are applied: finalized, settled, or aborted for too few trainers.
    function _settled(uint256 runId, Run storage r, uint256 epoch) internal view returns (bool) {
        if (epoch >= r.nextEpoch) return true;
        Epoch storage ep = epochs[runId][epoch];
        if (ep.finalized || ep.settled) return true;
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
            if (ep.seed != bytes32(0) && !ep.finalized && !ep.settled) return true;
        }
        return false;
    }

    function _failed(uint256 runId, Run storage r, uint256 epoch, Epoch storage ep) internal view returns (uint32) {
        // an epoch aborted for too few trainers never reveals: nobody failed
        if (ep.committed < r.p.minTrainers) return 0;
        uint256 rc = _revealsClose(runId, r, epoch);
        if (rc == NEVER || block.timestamp < rc) return 0;
        uint32 f = (ep.committed - ep.revealed) + ep.failedVerdicts;
        if (block.timestamp >= rc + r.p.responseWindow) f += ep.revealed - ep.responded;
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
        ep.verifierCount = vc;
        ep.seed = bytes32(block.number);
        emit AuditScheduled(runId, epoch, block.number, vc);
    }

    /// @dev seed = keccak(abi.encode(AUDIT_TAG, chainid, this, runId, epoch, blockhash(seedBlock))).
    function _fixSeed(uint256 runId, uint256 epoch, Epoch storage ep, bytes32 blockHash) internal {
        bytes32 seed = keccak256(abi.encode(AUDIT_TAG, block.chainid, address(this), runId, epoch, blockHash));
        ep.seed = seed;
        ep.seeded = true;
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

    function _stepIndex(bytes32 seed, address trainer, uint256 j, uint32 leafCount) internal pure returns (uint256) {
        return uint256(keccak256(abi.encode(seed, trainer, "step", j))) % (uint256(leafCount) - 1);
    }

    function _finalCheck(bytes32 seed, address trainer, uint16 bps) internal pure returns (bool) {
        return uint256(keccak256(abi.encode(seed, trainer, "final"))) % BPS < bps;
    }

    /// @dev List indices of a trainer's q assigned verifiers, in assignment order: a partial
    ///      Fisher-Yates shuffle of 0..vc-1, draw j keyed by keccak(abi.encode(key, j)) with
    ///      key = keccak(abi.encode(seed, trainer, "verifiers")). The q are distinct and drawn
    ///      independently of list order, so verifiers who joined back to back are no likelier to
    ///      judge the same trainer than any other pair. O(q^2), q <= 16.
    function _assigned(bytes32 seed, address trainer, uint256 q, uint256 vc) internal pure returns (uint256[] memory idx) {
        idx = new uint256[](q);
        bytes32 key = keccak256(abi.encode(seed, trainer, "verifiers"));
        assembly ("memory-safe") {
            // pos[k] at tmp + 32k, val[k] at tmp + 512 + 32k: temporary memory past the free pointer
            // (q <= 16), written before it is read, so it needs no allocation or zeroing
            let tmp := mload(0x40)
            for { let j := 0 } lt(j, q) { j := add(j, 1) } {
                mstore(0x00, key)
                mstore(0x20, j)
                let r := add(j, mod(keccak256(0x00, 0x40), sub(vc, j)))
                let atR := r
                let atJ := j
                for { let k := 0 } lt(k, j) { k := add(k, 1) } {
                    let p := mload(add(tmp, shl(5, k)))
                    if eq(p, r) { atR := mload(add(tmp, add(512, shl(5, k)))) }
                    if eq(p, j) { atJ := mload(add(tmp, add(512, shl(5, k)))) }
                }
                mstore(add(idx, shl(5, add(j, 1))), atR)
                mstore(add(tmp, shl(5, j)), r)
                mstore(add(tmp, add(512, shl(5, j))), atJ)
            }
        }
    }

    function _needed(Run storage r, Epoch storage ep) internal view returns (uint256) {
        return r.p.quorum < ep.verifierCount ? r.p.quorum : ep.verifierCount;
    }

    /// @dev Passed: responded and pass votes from a majority of the q assigned verifiers (q = quorum
    ///      capped by the verifier count at scheduling; with no verifiers nobody passes). One lying
    ///      verifier can neither fail an honest trainer nor pass a cheater on its own once q >= 3.
    function _isPassed(Run storage r, uint256 lane, Epoch storage ep) internal view returns (bool) {
        uint256 q = _needed(r, ep);
        return uint8(lane >> 24) == SUB_RESPONDED && q > 0 && _popcount16(uint16(lane >> 32)) > q / 2;
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

    function _checkResponse(
        uint256 runId,
        uint256 epoch,
        RunParams storage p,
        bytes32 seed,
        bytes32 root,
        uint32 leafCount,
        bytes32[] calldata leaves,
        bytes32[] calldata proofs
    ) internal view {
        uint256 L = leafCount;
        uint256 depth = _ceilLog2(L);
        uint256 steps = p.auditSteps;
        bool fin = _finalCheck(seed, msg.sender, p.finalCheckBps);
        uint256 nLeaves = 2 * steps + (fin ? 1 : 0);
        uint256[] memory ks = new uint256[](steps);
        uint256 words = fin ? depth : 0;
        for (uint256 j = 0; j < steps; j++) {
            uint256 k = _stepIndex(seed, msg.sender, j, uint32(L));
            ks[j] = k;
            words += depth + _trailingOnes(k) - 1;
        }
        if (leaves.length != nLeaves || proofs.length != words) {
            revert BadResponseLength(leaves.length, nLeaves, proofs.length, words);
        }
        uint256 cur = 0;
        for (uint256 j = 0; j < steps; j++) {
            uint256 k = ks[j];
            uint256 l = _trailingOnes(k);
            uint256 n = depth + l - 1;
            if (!_verifyPair(root, leaves[2 * j], leaves[2 * j + 1], k, l, proofs[cur:cur + n])) {
                revert InvalidProof(runId, epoch, msg.sender, k);
            }
            cur += n;
        }
        if (fin && !_verifyLeaf(root, leaves[2 * steps], L - 1, proofs[cur:cur + depth])) {
            revert InvalidProof(runId, epoch, msg.sender, L - 1);
        }
    }

    function _trailingOnes(uint256 k) internal pure returns (uint256 n) {
        while (k & 1 == 1) {
            k >>= 1;
            n++;
        }
    }

    /// @dev Pair proof for adjacent leaves k and k+1 (docs/protocol.md §5): their paths merge at
    ///      level l = trailing ones of k, so the proof is k's l lower siblings, then k+1's l lower
    ///      siblings, then the depth-l-1 siblings they share above the merge (bottom up).
    function _verifyPair(bytes32 root, bytes32 dk, bytes32 dk1, uint256 k, uint256 l, bytes32[] calldata proof)
        internal
        pure
        returns (bool ok)
    {
        assembly ("memory-safe") {
            let buf := mload(0x40)
            mstore8(buf, 0x00)
            mstore(add(buf, 1), dk)
            let h1 := keccak256(buf, 33)
            mstore(add(buf, 1), dk1)
            let h2 := keccak256(buf, 33)
            mstore8(buf, 0x01)
            let p := proof.offset
            for { let i := 0 } lt(i, l) { i := add(i, 1) } {
                // k's low bits are ones: each node on its path is a right child
                mstore(add(buf, 1), calldataload(add(p, shl(5, i))))
                mstore(add(buf, 33), h1)
                h1 := keccak256(buf, 65)
            }
            for { let i := 0 } lt(i, l) { i := add(i, 1) } {
                // k+1's low bits are zeros: each node on its path is a left child
                mstore(add(buf, 1), h2)
                mstore(add(buf, 33), calldataload(add(p, shl(5, add(l, i)))))
                h2 := keccak256(buf, 65)
            }
            mstore(add(buf, 1), h1)
            mstore(add(buf, 33), h2)
            let h := keccak256(buf, 65)
            let idx := shr(add(l, 1), k)
            let q := add(p, shl(6, l))
            let end := add(p, shl(5, proof.length))
            for {} lt(q, end) { q := add(q, 32) } {
                switch and(idx, 1)
                case 1 {
                    mstore(add(buf, 1), calldataload(q))
                    mstore(add(buf, 33), h)
                }
                default {
                    mstore(add(buf, 1), h)
                    mstore(add(buf, 33), calldataload(q))
                }
                h := keccak256(buf, 65)
                idx := shr(1, idx)
            }
            ok := eq(h, root)
        }
    }

    /// @dev docs/protocol.md §3: leaf = keccak(0x00 || d), node = keccak(0x01 || l || r). Hashes in
    ///      the free memory area without allocating (a response checks dozens of nodes).
    function _verifyLeaf(bytes32 root, bytes32 digest, uint256 index, bytes32[] calldata proof) internal pure returns (bool ok) {
        assembly ("memory-safe") {
            let buf := mload(0x40)
            mstore8(buf, 0x00)
            mstore(add(buf, 1), digest)
            let h := keccak256(buf, 33)
            mstore8(buf, 0x01)
            let p := proof.offset
            let end := add(p, shl(5, proof.length))
            for {} lt(p, end) { p := add(p, 32) } {
                switch and(index, 1)
                case 1 {
                    mstore(add(buf, 1), calldataload(p))
                    mstore(add(buf, 33), h)
                }
                default {
                    mstore(add(buf, 1), h)
                    mstore(add(buf, 33), calldataload(p))
                }
                h := keccak256(buf, 65)
                index := shr(1, index)
            }
            ok := eq(h, root)
        }
    }

    function _ceilLog2(uint256 n) internal pure returns (uint256 d) {
        uint256 x = n - 1;
        while (x > 0) {
            d++;
            x >>= 1;
        }
    }

    function _verdictEpoch(uint256 runId, Run storage r, uint256 epoch) internal view returns (Epoch storage ep) {
        Phase ph = _phase(runId, r, epoch);
        if (ph != Phase.Auditing) revert WrongPhase(runId, epoch, uint8(ph), uint8(Phase.Auditing));
        uint256 deadline = _revealsClose(runId, r, epoch) + r.p.responseWindow + r.p.verdictWindow;
        if (block.timestamp >= deadline) revert DeadlinePassed(runId, epoch, deadline, block.timestamp);
        ep = epochs[runId][epoch];
    }

    function _verdict(uint256 runId, uint256 epoch, Run storage r, Epoch storage ep, address trainer, bool passed, string calldata evidenceCid) internal {
        uint32 sp = slotPlusOne[runId][trainer];
        uint256 lane = sp == 0 ? 0 : _lane(runId, epoch, sp - 1);
        if (uint8(lane >> 24) != SUB_RESPONDED) revert NotResponded(runId, epoch, trainer);
        uint256 q = _needed(r, ep);
        uint256[] memory idx = _assigned(ep.seed, trainer, q, ep.verifierCount);
        address[] storage list = verifierList[runId];
        uint256 j = 0;
        for (; j < q; j++) {
            if (list[idx[j]] == msg.sender) break;
        }
        if (j == q) revert NotAssigned(runId, epoch, trainer, msg.sender);
        uint256 passBit = uint256(1) << (32 + j);
        uint256 failBit = uint256(1) << (48 + j);
        if (lane & (passBit | failBit) != 0) revert AlreadyVoted(runId, epoch, trainer, msg.sender);
        // decided the moment one side reaches a majority of the q assigned verifiers
        if (passed) {
            lane |= passBit;
            if (_popcount16(uint16(lane >> 32)) == q / 2 + 1) ep.passed += 1;
        } else {
            lane |= failBit;
            if (_popcount16(uint16(lane >> 48)) == q / 2 + 1) ep.failedVerdicts += 1;
        }
        _setLane(runId, epoch, sp - 1, lane);
        emit VerdictSubmitted(runId, epoch, trainer, msg.sender, passed, evidenceCid);
    }

    function _checkIncluded(uint256 runId, uint256 epoch, Run storage r, Epoch storage ep, address[] calldata included) internal view {
        address prev = address(0);
        for (uint256 i = 0; i < included.length; i++) {
            address t = included[i];
            if (t <= prev) revert NotSorted(i);
            prev = t;
            uint32 sp = slotPlusOne[runId][t];
            if (sp == 0 || !_isPassed(r, _lane(runId, epoch, sp - 1), ep)) revert NotPassing(runId, epoch, t);
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
        if (!tooFew) _slashAll(runId, epoch, r, ep);
    }

    /// @dev Slash every committed trainer that did not reveal, did not respond or failed its audit by
    ///      majority, and every assigned verifier whose vote went against a majority verdict.
    function _slashAll(uint256 runId, uint256 epoch, Run storage r, Epoch storage ep) internal {
        uint256 words = (uint256(r.trainerSlots) + 3) >> 2;
        uint256 need = _needed(r, ep) / 2 + 1;
        uint256 toCreator = 0;
        mapping(uint256 => uint256) storage ws = lanes[runId][epoch];
        for (uint256 w = 0; w < words; w++) {
            uint256 word = ws[w];
            for (uint256 k = 0; word != 0; k++) {
                uint256 lane = word & LANE_MASK;
                word >>= 64;
                uint8 st = uint8(lane >> 24);
                if (st == SUB_NONE) continue;
                uint8 reason = SLASH_FAILED_AUDIT;
                if (st == SUB_COMMITTED) {
                    reason = SLASH_NO_REVEAL;
                } else if (st == SUB_REVEALED) {
                    reason = SLASH_NO_RESPONSE;
                } else {
                    uint16 passes = uint16(lane >> 32);
                    uint16 fails = uint16(lane >> 48);
                    bool failed = _popcount16(fails) >= need;
                    uint16 against = failed ? passes : (_popcount16(passes) >= need ? fails : 0);
                    if (against != 0) {
                        toCreator += _slashVerifiers(runId, epoch, r, ep, slotTrainer[runId][(w << 2) | k], against);
                    }
                    if (!failed) continue;
                }
                toCreator += _slashOne(runId, epoch, r, slotTrainer[runId][(w << 2) | k], reason);
            }
        }
        if (toCreator > 0) {
            totalStaked -= toCreator;
            totalCredits += toCreator;
            credits[r.creator] += toCreator;
        }
    }

    /// @dev Slash the assigned verifiers of `trainer` whose assignment index is set in `mask`.
    function _slashVerifiers(uint256 runId, uint256 epoch, Run storage r, Epoch storage ep, address trainer, uint16 mask)
        internal
        returns (uint256 total)
    {
        uint256[] memory idx = _assigned(ep.seed, trainer, _needed(r, ep), ep.verifierCount);
        address[] storage list = verifierList[runId];
        for (uint256 j = 0; mask != 0; j++) {
            if (mask & 1 == 1) {
                address v = list[idx[j]];
                Member storage m = members[runId][v];
                uint256 amount = (uint256(m.stake) * r.p.slashBps) / BPS;
                m.stake -= uint96(amount);
                total += amount;
                if (m.leaveEpoch == NEVER_EPOCH) {
                    // out of the list at the next scheduling (the running audit still indexes into it)
                    m.leaveEpoch = r.nextEpoch;
                    m.leftAt = uint48(block.timestamp);
                    m.pendingRemoval = true;
                    pendingVerifierRemovals[runId].push(v);
                    emit VerifierLeft(runId, v, false);
                }
                emit VerifierSlashed(runId, epoch, v, trainer, amount);
            }
            mask >>= 1;
        }
    }

    /// @dev Slash one committed trainer if it did not reveal, did not respond, or failed; returns the amount.
    function _slashOne(uint256 runId, uint256 epoch, Run storage r, address t, uint8 reason) internal returns (uint256 amount) {
        Member storage m = members[runId][t];
        amount = (uint256(m.stake) * r.p.slashBps) / BPS;
        m.stake -= uint96(amount);
        if (m.leaveEpoch == NEVER_EPOCH) {
            // a cheater is removed from the run at the next epoch boundary
            m.leaveEpoch = r.nextEpoch;
            m.leftAt = uint48(block.timestamp);
            r.activeTrainers -= 1;
            emit TrainerLeft(runId, t, r.nextEpoch);
        }
        emit Slashed(runId, epoch, t, amount, reason);
    }
}
