// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {VerilocoBase} from "./VerilocoBase.sol";

/// @title VerilocoViews: the read-only interface of Veriloco (round status, runs, members, audits)
/// @dev Runs on Veriloco's storage: VerilocoModule's fallback DELEGATECALLs into it for every function
///      neither Veriloco nor the module defines. Nothing here writes. Documented in docs/contract.md.
contract VerilocoViews is VerilocoBase {
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
        passed = _isPassed(r, lane);
        state = _state(lane);
        bool reused = state != SUB_NONE && _lane(runId, epoch + HASH_SLOTS, sp - 1) != 0;
        bytes32 h = reused ? bytes32(0) : hashes[runId][trainer][epoch % HASH_SLOTS];
        if (state == SUB_COMMITTED) commitment = h;
        else traceRoot = h;
        leafCount = _leafCount(lane);
        passVotes = _popcount16(uint16(lane >> 32));
        failVotes = _popcount16(uint16(lane >> 48));
    }

    /// @notice A trainer's audit assignment (docs/protocol.md §5); empty until the seed is fixed.
    /// @return steps Challenged transitions k (k -> k+1), in draw order (duplicates kept; ascending, distinct under auditRate).
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
        uint32 leafCount = sp == 0 ? 0 : _leafCount(_lane(runId, epoch, sp - 1));
        if (!ep.seeded || leafCount < 2) return (steps, false, verifiers);
        (steps, finalCheck) = _challenges(ep.seed, trainer, r.p.auditSteps, r.p.auditRate, leafCount, r.p.finalCheckBps);
        // the list is frozen only until the epoch is finalized or settled; after that a removal may
        // have moved entries, and VerdictSubmitted events say who judged
        if (ep.finalized || ep.settled) return (steps, finalCheck, verifiers);
        uint256 q = r.p.quorum;
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

    /// @notice A trainer's availability committee (verifier-list addresses) and its challenge word.
    function availabilityCommittee(uint256 runId, uint256 epoch, address trainer) external view returns (address[] memory committee, uint256 challenge) {
        Run storage r = _run(runId);
        uint32 sp = slotPlusOne[runId][trainer];
        Epoch storage ep = epochs[runId][epoch];
        challenge = challenges[runId][epoch][trainer];
        if (sp == 0 || !ep.seeded) return (committee, challenge);
        (uint256[] memory com,) = _availabilityCommittee(runId, r, ep, trainer, challenge);
        committee = new address[](com.length);
        for (uint256 i = 0; i < com.length; i++) committee[i] = verifierList[runId][com[i]];
    }

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
}
