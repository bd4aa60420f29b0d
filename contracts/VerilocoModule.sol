// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {VerilocoBase} from "./VerilocoBase.sol";

/// @title VerilocoModule: runs, membership, settlement, model attestation and views of Veriloco
/// @dev Meant to run on Veriloco's storage: Veriloco's fallback DELEGATECALLs into it. Called on its
///      own address it acts on its own, empty storage, which no node reads (a stake sent there can be
///      withdrawn there). No immutables, so its code is the same in every deployment and clients can
///      check it (protocol/chain.py). Documented with Veriloco in docs/contract.md.
contract VerilocoModule is VerilocoBase {
    /// @notice Create a run; the caller becomes its creator (it may not verify in it, nor earn from the
    ///         pool). The value sent funds the run's reward pool.
    /// @param p The enforced config fields; the full config is the canonical JSON behind p.configCid.
    /// @return runId The new run's id (1-based).
    function createRun(RunParams calldata p) external payable returns (uint256 runId) {
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
        if (p.trainerReward > type(uint96).max || p.verifierReward > type(uint96).max) revert InvalidParams("rewards must be < 2^96 wei");
        if (msg.value > type(uint128).max) revert BadFunding(runCount + 1, msg.value, 0, type(uint128).max);
        runId = ++runCount;
        Run storage r = runs[runId];
        r.p = p;
        r.creator = msg.sender;
        emit RunCreated(runId, msg.sender, p.coordinator, p.configCid, p.configDigest);
        if (msg.value != 0) {
            r.pool = msg.value;
            totalPools += msg.value;
            emit RunFunded(runId, msg.sender, msg.value, msg.value);
        }
    }

    /// @notice Add the value sent to a run's reward pool (anyone may; it is paid out, never refunded).
    function fundRun(uint256 runId) external payable {
        Run storage r = _run(runId);
        uint256 pool = r.pool + msg.value;
        if (msg.value == 0 || pool > type(uint128).max) revert BadFunding(runId, msg.value, r.pool, type(uint128).max);
        r.pool = pool;
        totalPools += msg.value;
        emit RunFunded(runId, msg.sender, msg.value, pool);
    }

    /// @notice Join a run as a trainer by sending exactly trainerStake; the trainer gets a free slot.
    /// @dev It takes part from the first epoch that has not opened yet.
    function joinTrainer(uint256 runId) external payable {
        Run storage r = _run(runId);
        // they could finalize or fund what they earn from: neither trains (nor verifies) in its own run
        if (msg.sender == r.creator || msg.sender == r.p.coordinator) revert ConflictOfInterest(runId, msg.sender);
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
        if (msg.sender == r.creator || msg.sender == r.p.coordinator) revert ConflictOfInterest(runId, msg.sender);
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

    /// @notice The run's coordinator stakes verifierStake before it may finalize: a model the attestation
    ///         committee proves wrong costs it slashBps of that stake.
    function stakeCoordinator(uint256 runId) external payable {
        Run storage r = _run(runId);
        if (msg.sender != r.p.coordinator) revert NotCoordinator(runId, msg.sender, r.p.coordinator);
        Member storage m = members[runId][msg.sender];
        if (m.role != ROLE_NONE) revert AlreadyJoined(runId, msg.sender);
        if (msg.value != r.p.verifierStake) revert WrongStake(msg.value, r.p.verifierStake);
        m.stake = uint96(msg.value);
        m.joinEpoch = r.nextEpoch;
        m.leaveEpoch = NEVER_EPOCH;
        m.role = ROLE_COORDINATOR;
        totalStaked += msg.value;
        emit CoordinatorStaked(runId, msg.sender, msg.value);
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
        } else if (m.role == ROLE_COORDINATOR) {
            // it finalizes no more; its stake stays bonded until no model it finalized awaits attestation
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
        } else if (m.pendingRemoval || m.role == ROLE_COORDINATOR) {
            if (_auditRunning(runId, r)) revert EpochNotSettled(runId, r.nextEpoch == 0 ? 0 : r.nextEpoch - 1);
            if (m.pendingRemoval) _removeVerifier(runId, msg.sender);
        }
        // a fully slashed member withdraws nothing, but its record is cleared all the same
        uint256 amount = m.stake;
        if (m.role == ROLE_TRAINER) {
            // every epoch it took part in is settled: its slot can serve the next trainer
            freeSlots[runId].push(m.slot);
            delete slotPlusOne[runId][msg.sender];
        }
        // effects: forget the membership entirely so the account may join again later
        delete members[runId][msg.sender];
        totalStaked -= amount;
        emit Withdrawn(runId, msg.sender, amount);
        if (amount == 0) return;
        (bool ok,) = msg.sender.call{value: amount}("");
        if (!ok) revert TransferFailed(msg.sender, amount);
    }

    /// @notice Claim credits (bounties for proven faults).
    function claim() external nonReentrant {
        uint256 amount = credits[msg.sender];
        if (amount == 0) revert NothingToWithdraw(msg.sender);
        credits[msg.sender] = 0;
        totalCredits -= amount;
        emit Claimed(msg.sender, amount);
        (bool ok,) = msg.sender.call{value: amount}("");
        if (!ok) revert TransferFailed(msg.sender, amount);
    }

    /// @notice Attest the model digest recomputed from the epoch's passing payloads (docs/protocol.md
    ///         §9). Only the epoch's attestation committee (min(quorum, verifiers) members, drawn like a
    ///         trainer's verifiers with the contract's address in the trainer's place), once each, while
    ///         Confirming. The first digest a majority attests is the epoch's model: the finalizer's is
    ///         confirmed, or replaced (the finalizer loses slashBps of its stake to the attesters).
    /// @param modelCid Where the attested model is published (used only if it replaces the finalizer's).
    function attestModel(uint256 runId, uint256 epoch, bytes32 modelDigest, string calldata modelCid) external {
        Run storage r = _run(runId);
        Phase ph = _phase(runId, r, epoch);
        if (ph != Phase.Confirming) revert WrongPhase(runId, epoch, uint8(ph), uint8(Phase.Confirming));
        Epoch storage ep = epochs[runId][epoch];
        uint256 q = _needed(r, ep);
        uint256[] memory idx = _assigned(ep.seed, address(this), q, ep.verifierCount);
        address[] storage list = verifierList[runId];
        uint256 j = 0;
        while (j < q && list[idx[j]] != msg.sender) j++;
        if (j == q) revert NotAssigned(runId, epoch, address(this), msg.sender);
        uint16 bit = uint16(1 << j);
        if (ep.attested & bit != 0) revert AlreadyVoted(runId, epoch, address(this), msg.sender);
        ep.attested |= bit;
        uint256 votes = modelVotes[runId][epoch][modelDigest] | bit;
        modelVotes[runId][epoch][modelDigest] = votes;
        emit ModelAttested(runId, epoch, msg.sender, modelDigest);
        if (_popcount16(uint16(votes)) <= q / 2) return;
        if (modelDigest == ep.modelDigest) return _confirm(runId, epoch, ep, false, 0);
        ep.modelDigest = modelDigest;
        ep.modelCid = modelCid;
        Member storage fm = members[runId][ep.finalizer];
        uint256 amount = (uint256(fm.stake) * r.p.slashBps) / BPS;
        fm.stake -= uint96(amount);
        if (fm.leaveEpoch == NEVER_EPOCH) {
            // a proven-wrong finalizer finalizes no more (a trainer or verifier finalizer also leaves its role)
            fm.leaveEpoch = r.nextEpoch;
            fm.leftAt = uint48(block.timestamp);
            if (fm.role == ROLE_TRAINER) r.activeTrainers -= 1;
            if (fm.role == ROLE_VERIFIER) {
                fm.pendingRemoval = true;
                pendingVerifierRemovals[runId].push(ep.finalizer);
                emit VerifierLeft(runId, ep.finalizer, false);
            }
            if (fm.role == ROLE_TRAINER) emit TrainerLeft(runId, ep.finalizer, r.nextEpoch);
        }
        _settlePayout(amount, _pay(list, idx, uint16(votes), amount));
        _confirm(runId, epoch, ep, true, amount);
    }

    /// @notice Settle an epoch whose coordinator missed the finalize deadline: it becomes Aborted (no
    ///         new model; the next epoch builds on the last finalized one) and the same slashes apply.
    function settle(uint256 runId, uint256 epoch) external {
        Run storage r = _run(runId);
        Epoch storage ep = epochs[runId][epoch];
        Phase ph = _phase(runId, r, epoch);
        if (ph != Phase.Aborted || ep.settled || ep.finalized) {
            if (ph == Phase.Auditing) {
                uint256 fd = _finalizeDeadline(runId, r, epoch);
                revert NotExpired(runId, epoch, fd, block.timestamp);
            }
            revert WrongPhase(runId, epoch, uint8(ph), uint8(Phase.Aborted));
        }
        _settle(runId, r, epoch, ep);
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

    /// @notice The mutable state of a run; `pool` is the reward pool left (wei).
    function runState(uint256 runId)
        external
        view
        returns (address creator, uint32 nextEpoch, uint32 activeTrainers, uint32 trainerSlots, uint32 verifierCount, uint256 pool)
    {
        Run storage r = _run(runId);
        return (r.creator, r.nextEpoch, r.activeTrainers, r.trainerSlots, uint32(verifierList[runId].length), r.pool);
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
        // an epoch before the trainer's current membership belongs to its slot's earlier holder (or its own past)
        if (sp == 0 || epoch < members[runId][trainer].joinEpoch) return (commitment, traceRoot, 0, SUB_NONE, 0, 0, false);
        uint256 lane = _lane(runId, epoch, sp - 1);
        passed = _isPassed(r, lane, epochs[runId][epoch]);
        state = _state(lane);
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
        (steps, finalCheck) = _challenges(ep.seed, trainer, r.p.auditSteps, leafCount, r.p.finalCheckBps);
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
    ) external view returns (bytes32) {
        return _commitment(runId, epoch, trainer, payloadDigest, traceRoot, leafCount, salt);
    }

    // ------------------------------------------------------------------ availability (docs/protocol.md §10.2)

    /// @notice Vote on a reported payload: only its availability committee, once each, while the epoch
    ///         audits. "available" means you fetched it, checked its digest and keep it until the epoch
    ///         is final. The first side to reach a majority of the committee decides.
    function voteAvailability(uint256 runId, uint256 epoch, address trainer, bool available) external {
        Run storage r = _run(runId);
        Phase ph = _phase(runId, r, epoch);
        if (ph != Phase.Auditing) revert WrongPhase(runId, epoch, uint8(ph), uint8(Phase.Auditing));
        uint256 c = challenges[runId][epoch][trainer];
        if (c == 0 || c >> 192 != 0) revert NotReported(runId, epoch, trainer);
        Epoch storage ep = epochs[runId][epoch];
        uint256 lane = _lane(runId, epoch, slotPlusOne[runId][trainer] - 1);
        (uint256[] memory com, uint256[] memory idx) = _availabilityCommittee(r, ep, trainer, lane);
        address[] storage list = verifierList[runId];
        uint256 j = 0;
        while (j < com.length && list[com[j]] != msg.sender) j++;
        if (j == com.length) revert NotAssigned(runId, epoch, trainer, msg.sender);
        uint256 bit = uint256(1) << j;
        if ((c >> 160) & (bit | (bit << 16)) != 0) revert AlreadyVoted(runId, epoch, trainer, msg.sender);
        c |= bit << (available ? 160 : 176);
        emit AvailabilityVoted(runId, epoch, trainer, msg.sender, available);
        uint16 side = uint16(c >> (available ? 160 : 176));
        if (_popcount16(side) <= com.length / 2) {
            challenges[runId][epoch][trainer] = c;
            return;
        }
        challenges[runId][epoch][trainer] = c | (uint256(available ? 2 : 1) << 192);
        emit AvailabilityDecided(runId, epoch, trainer, available);
        uint256 slashed;
        if (available) {
            // a false report: the reporter pays the voters that did the fetching
            address reporter = address(uint160(c));
            Member storage rm = members[runId][reporter];
            slashed = (uint256(rm.stake) * r.p.slashBps) / BPS;
            rm.stake -= uint96(slashed);
            emit Slashed(runId, epoch, reporter, slashed, SLASH_FALSE_REPORT);
            return _settlePayout(slashed, _pay(list, com, side, slashed));
        }
        // nobody can produce it: out of the epoch; its stake to the voters; its pass voters broke their keep duty
        _setLane(runId, epoch, slotPlusOne[runId][trainer] - 1, (lane & ~(uint256(0xFF) << 24)) | (uint256(SUB_UNAVAILABLE) << 24));
        ep.passed -= 1;
        ep.failedVerdicts += 1;
        slashed = _slashOne(runId, epoch, r, trainer, SLASH_UNAVAILABLE);
        uint256 paid = _pay(list, com, side, slashed);
        slashed += _slashVerifiers(runId, epoch, r, list, idx, trainer, uint16(lane >> 32));
        _settlePayout(slashed, paid);
    }

}
