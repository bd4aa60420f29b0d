// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {VerilocoBase} from "./VerilocoBase.sol";

/// @title VerilocoModule: runs, membership, verdicts, model attestation and payload availability of Veriloco
/// @dev Meant to run on Veriloco's storage: Veriloco's fallback DELEGATECALLs into it, and its own
///      fallback passes what it does not define on to VerilocoViews. Called on its own address it acts
///      on its own, empty storage, which no node reads (a stake sent there can be withdrawn there). No
///      immutables, so its code is the same in every deployment and clients can check it
///      (protocol/chain/binding.py). Documented with Veriloco in docs/contract.md.
contract VerilocoModule is VerilocoBase {
    /// @notice Every function defined in neither Veriloco nor here is VerilocoViews', run on Veriloco's storage.
    fallback() external payable {
        _delegate(_views());
    }

    /// @notice Create a run; the caller becomes its creator (it may not verify in it, nor earn from the
    ///         pool). The value sent funds the run's reward pool.
    /// @param p The enforced config fields; the full config is the canonical JSON behind p.configCid.
    /// @return runId The new run's id (1-based).
    function createRun(RunParams calldata p) external payable returns (uint256 runId) {
        if (p.coordinator == address(0)) revert InvalidParams("coordinator");
        if (p.minTrainers == 0 || p.maxTrainers < p.minTrainers) revert InvalidParams("minTrainers/maxTrainers");
        if (p.maxVerifiers == 0) revert InvalidParams("maxVerifiers");
        // below 3 one verifier decides alone (or two disagree forever): only where the run says it is a test
        // a payload report's committee is q verifiers of the first 16 drawn outside the trainer's q and the
        // reporter (_availabilityCommittee): past quorum 7, or with fewer than 2q + 1 verifier places, no
        // committee can ever form and a withheld payload could never be removed (docs/contract.md)
        if (p.quorum == 0 || p.quorum > 7 || (p.quorum < 3 && !p.testRun)) revert InvalidParams("quorum 3..7 (1..2: testRun)");
        if (p.maxVerifiers < 2 * uint32(p.quorum) + 1) revert InvalidParams("maxVerifiers >= 2 x quorum + 1");
        // a verifier reveals all its verdicts in one transaction (about 25k gas each: at V = quorum, one per
        // trainer) and finalize scans every slot: both must fit a 30M-gas block with room to spare
        if (p.maxTrainers > 512 || p.maxVerifiers > 128) revert InvalidParams("maxTrainers 512 maxVerifiers 128");
        // 0: no step is drawn on chain (a windowed run: each window's steps are drawn from a block after its
        // post, and verifiers judge them; the final check stays here, docs/protocol.md §5.4)
        if (p.auditSteps > 64) revert InvalidParams("auditSteps (0..64)");
        if (p.auditRate > RATE_ONE) revert InvalidParams("auditRate (0..1e6 per million)");
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
            m.pendingRemoval = true; // by choice: windows it began in its leave epoch stay its to commit
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
            // the last two epochs it may have taken part in must have applied their slashes, and one it
            // finalized (possibly from before it joined) must be past its attestation window
            uint256 le = m.leaveEpoch;
            for (uint256 k = 1; k <= 2 && k <= le; k++) {
                uint256 e = le - k;
                if ((e >= m.joinEpoch || epochs[runId][e].finalizer == msg.sender) && !_settled(runId, r, e)) revert EpochNotSettled(runId, e);
            }
        } else if (m.pendingRemoval || m.role == ROLE_COORDINATOR) {
            if (_auditRunning(runId, r)) revert EpochNotSettled(runId, r.nextEpoch == 0 ? 0 : r.nextEpoch - 1);
            if (m.pendingRemoval) _removeVerifier(runId, msg.sender);
        }
        // a report it made is judged first: reports are made while an epoch audits, at most two at once
        uint256 rp = reportedEpoch[runId][msg.sender];
        for (uint256 k = 1; k <= 2 && k <= rp; k++) {
            if (!_settled(runId, r, rp - k)) revert EpochNotSettled(runId, rp - k);
        }
        delete reportedEpoch[runId][msg.sender];
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

    /// @notice Commit to this epoch's verdicts before anyone reveals (docs/protocol.md §5.2): every
    ///         verifier of the frozen list (index < verifierCount) once, an empty list if nothing is
    ///         assigned to it. Reveals open when all have committed or at the middle of the verdict window.
    /// @param commitment keccak(abi.encode(VERDICT_TAG, chainid, this, runId, epoch, verifier,
    ///        keccak(abi.encode(address[] trainers, bool[] passed, bytes32[] witnesses)), salt)).
    function commitVerdicts(uint256 runId, uint256 epoch, bytes32 commitment) external {
        Run storage r = _run(runId);
        Epoch storage ep = _verdictEpoch(runId, r, epoch);
        if (uint224(uint256(commitment)) >> 32 == 0) revert ZeroCommitment(); // bits 32-223 tell a commitment from a revealed count
        if (!ep.seeded) revert AuditSeedPending(runId, epoch, uint256(ep.seed));
        uint32 vs = members[runId][msg.sender].slot;
        if (members[runId][msg.sender].role != ROLE_VERIFIER || vs == 0 || vs > ep.verifierCount) revert NotVerifier(runId, msg.sender);
        uint32 n = ep.verdictCommits;
        uint256 opens = _verdictRevealsOpen(runId, r, epoch);
        if (n == ep.verifierCount || block.timestamp >= opens) revert VerdictCommitsClosed(runId, epoch, n, opens);
        mapping(uint256 => uint256) storage slots = verdictCommits[runId][msg.sender];
        if (slots[epoch % HASH_SLOTS] >> 224 == epoch + 1) revert AlreadyCommitted(runId, epoch, msg.sender);
        slots[epoch % HASH_SLOTS] = ((epoch + 1) << 224) | uint224(uint256(commitment));
        ep.verdictCommits = n + 1;
        emit VerdictsCommitted(runId, epoch, msg.sender, commitment);
    }

    /// @notice Reveal the committed verdicts: for each trainer pass/fail and the replay witness (zero in
    ///         tolerant audits), checked against the commitment; only assigned verifiers, once each,
    ///         after the trainer responded. A witness that differs from its trainer's majority witness
    ///         is slashed at finalize or settle like an outvoted vote.
    function submitVerdicts(
        uint256 runId,
        uint256 epoch,
        address[] calldata trainers,
        bool[] calldata passed,
        bytes32[] calldata witnesses,
        string calldata evidenceCid,
        bytes32 salt
    ) external {
        if (trainers.length != passed.length || trainers.length != witnesses.length) {
            revert BadResponseLength(trainers.length, passed.length, witnesses.length, witnesses.length);
        }
        Run storage r = _run(runId);
        Epoch storage ep = _verdictEpoch(runId, r, epoch);
        _openVerdict(runId, epoch, r, ep, keccak256(abi.encode(trainers, passed, witnesses)), salt, trainers.length);
        emit VerdictsRevealed(runId, epoch, msg.sender, trainers.length, evidenceCid);
        for (uint256 i = 0; i < trainers.length; i++) {
            _verdict(runId, epoch, r, ep, trainers[i], passed[i], witnesses[i]);
        }
    }

    /// @dev Check the caller's reveal against its commitment and mark it revealed: the commitment
    ///      gives way to the number of verdicts revealed (what the verifier's rewards count).
    function _openVerdict(uint256 runId, uint256 epoch, Run storage r, Epoch storage ep, bytes32 body, bytes32 salt, uint256 count) internal {
        if (ep.verdictCommits < ep.verifierCount) {
            uint256 opens = _verdictRevealsOpen(runId, r, epoch);
            if (block.timestamp < opens) revert VerdictsNotOpen(runId, epoch, ep.verdictCommits, ep.verifierCount, opens);
        }
        mapping(uint256 => uint256) storage slots = verdictCommits[runId][msg.sender];
        uint256 s = slots[epoch % HASH_SLOTS];
        if (s >> 224 != epoch + 1) revert NotCommitted(runId, epoch, msg.sender);
        if (uint224(s) >> 32 == 0) revert AlreadyRevealed(runId, epoch, msg.sender);
        bytes32 c = _verdictCommitment(runId, epoch, msg.sender, body, salt);
        if (uint224(uint256(c)) != uint224(s)) revert RevealMismatch(runId, epoch, msg.sender, c, bytes32(uint256(uint224(s))));
        slots[epoch % HASH_SLOTS] = ((epoch + 1) << 224) | uint32(count);
        ep.verdictReveals += 1;
    }

    /// @notice Attest the model digest recomputed from the epoch's passing payloads (docs/protocol.md
    ///         §9). Only the epoch's attestation committee (min(quorum, verifiers) members, drawn like a
    ///         trainer's verifiers with the contract's address in the trainer's place), once each, while
    ///         Confirming. The first digest a majority attests is the epoch's model: the finalizer's is
    ///         confirmed, or replaced (the finalizer loses slashBps of its stake to the attesters).
    /// @param modelCid Where the attested model is published (used only if it replaces the finalizer's).
    function attestModel(uint256 runId, uint256 epoch, bytes32 modelDigest, string calldata modelCid) external {
        Run storage r = _run(runId);
        _inPhase(runId, r, epoch, Phase.Confirming);
        Epoch storage ep = epochs[runId][epoch];
        uint256 q = r.p.quorum;
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
        _settlePayout(amount, _pay(runId, epoch, list, idx, uint16(votes), amount, ep.finalizer));
        _confirm(runId, epoch, ep, true, amount);
    }

    // ------------------------------------------------------------------ availability (docs/protocol.md §10.2)

    /// @notice Report a passing trainer's payload as unavailable (the coordinator, or any staked member,
    ///         after failing to fetch it from every holder). Opens a vote of the trainer's availability
    ///         committee, drawn from this block's hash; until it decides, finalize must still include the
    ///         trainer. A report the committee rejects costs the reporter slashBps of its stake. Refused
    ///         (TooFewVerifiers) unless q verifiers besides the trainer's q assigned ones and the reporter
    ///         can sit on the committee.
    function reportUnavailable(uint256 runId, uint256 epoch, address trainer) external {
        Run storage r = _run(runId);
        _inPhase(runId, r, epoch, Phase.Auditing);
        Member storage m = members[runId][msg.sender];
        if (m.role == ROLE_NONE || m.stake == 0 || m.leaveEpoch != NEVER_EPOCH) revert NotStaked(runId, msg.sender);
        uint32 sp = slotPlusOne[runId][trainer];
        uint256 lane = sp == 0 ? 0 : _lane(runId, epoch, sp - 1);
        if (!_isPassed(r, lane)) revert NotPassing(runId, epoch, trainer);
        if (challenges[runId][epoch][trainer] != 0) revert AlreadyReported(runId, epoch, trainer);
        uint256 vc = epochs[runId][epoch].verifierCount;
        uint256 n = vc < 16 ? vc : 16; // the committee is drawn from the first 16 of a shuffle
        uint256 need = 2 * r.p.quorum + (m.role == ROLE_VERIFIER ? 1 : 0);
        if (n < need) revert TooFewVerifiers(runId, epoch, n, need);
        challenges[runId][epoch][trainer] = (block.number << 200) | uint160(msg.sender);
        if (epoch + 1 > reportedEpoch[runId][msg.sender]) reportedEpoch[runId][msg.sender] = epoch + 1;
        emit AvailabilityReported(runId, epoch, trainer, msg.sender);
    }

    /// @notice Vote on a reported payload: only its availability committee (drawn after the report), once
    ///         each, while the epoch audits. "available" means you fetched it, checked its digest and keep
    ///         it until the epoch is final. "unavailable" decides only with all q members (never fewer
    ///         than the pass voters it overrules), "available" with a majority; a pass voter of the trainer
    ///         may vote "available" too, saying it put the payload back: a later "available" decision then
    ///         slashes nobody (the report was true when made).
    function voteAvailability(uint256 runId, uint256 epoch, address trainer, bool available) external {
        Run storage r = _run(runId);
        _inPhase(runId, r, epoch, Phase.Auditing);
        uint256 c = challenges[runId][epoch][trainer];
        if (c == 0 || (c >> 192) & 3 != 0) revert NotReported(runId, epoch, trainer);
        Epoch storage ep = epochs[runId][epoch];
        uint256 lane = _lane(runId, epoch, slotPlusOne[runId][trainer] - 1);
        (uint256[] memory com, uint256[] memory idx) = _availabilityCommittee(runId, r, ep, trainer, c);
        address[] storage list = verifierList[runId];
        uint256 q = r.p.quorum;
        uint256 j = 0;
        while (j < com.length && list[com[j]] != msg.sender) j++;
        if (j == com.length) {
            uint256 k = 0;
            while (k < q && ((lane >> (32 + k)) & 1 == 0 || list[idx[k]] != msg.sender)) k++;
            if (k == q || !available) revert NotAssigned(runId, epoch, trainer, msg.sender);
            challenges[runId][epoch][trainer] = c | (uint256(1) << 194);
            emit AvailabilityVoted(runId, epoch, trainer, msg.sender, true);
            return;
        }
        uint256 bit = uint256(1) << j;
        if ((c >> 160) & (bit | (bit << 16)) != 0) revert AlreadyVoted(runId, epoch, trainer, msg.sender);
        c |= bit << (available ? 160 : 176);
        emit AvailabilityVoted(runId, epoch, trainer, msg.sender, available);
        uint16 side = uint16(c >> (available ? 160 : 176));
        if (_popcount16(side) <= (available ? q / 2 : q - 1)) {
            challenges[runId][epoch][trainer] = c;
            return;
        }
        challenges[runId][epoch][trainer] = c | (uint256(available ? 2 : 1) << 192);
        emit AvailabilityDecided(runId, epoch, trainer, available);
        uint256 slashed;
        if (available) {
            if ((c >> 194) & 1 == 1) return; // put back by a pass voter during the vote: nobody is at fault
            // a false report: the reporter pays the voters that did the fetching (a lone one is paid nothing)
            address reporter = address(uint160(c));
            Member storage rm = members[runId][reporter];
            slashed = (uint256(rm.stake) * r.p.slashBps) / BPS;
            rm.stake -= uint96(slashed);
            emit Slashed(runId, epoch, reporter, slashed, SLASH_FALSE_REPORT);
            return _settlePayout(slashed, q > 1 ? _pay(runId, epoch, list, com, side, slashed, reporter) : 0);
        }
        // nobody can produce it: out of the epoch; its stake to the voters; its pass voters broke their keep duty
        _setLane(runId, epoch, slotPlusOne[runId][trainer] - 1, (lane & ~(uint256(0xFF) << 24)) | (uint256(SUB_UNAVAILABLE) << 24));
        ep.passed -= 1;
        ep.failedVerdicts += 1;
        slashed = _slashOne(runId, epoch, r, trainer, SLASH_UNAVAILABLE);
        uint256 paid = q > 1 ? _pay(runId, epoch, list, com, side, slashed, trainer) : 0;
        slashed += _slashVerifiers(runId, epoch, r, list, idx, trainer, uint16(lane >> 32));
        _settlePayout(slashed, paid);
    }
}
