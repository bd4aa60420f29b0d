// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {VerilocoBase} from "./VerilocoBase.sol";

/// @title Veriloco: on-chain referee for verifiable DiLoCoX training runs
/// @notice Holds stakes, orders epochs, binds trainers to their commitments, fixes audit seeds,
///         checks audit responses against revealed Merkle trace roots, collects verdicts, lets an
///         epoch finalize only when every included trainer passed and no passing one was left out,
///         and counts its model only once an attestation committee confirmed it.
/// @dev The per-epoch hot path lives here; membership, verdicts, attestation and availability live
///      in VerilocoModule, the views in VerilocoViews, and both run on this contract's storage through
///      the fallbacks (DELEGATECALL: Veriloco -> VerilocoModule -> VerilocoViews), so that each stays well
///      under the 24 KB code limit. Clients use the merged ABI (contracts/build.mjs).
///      See docs/contract.md for the state machine, timing rules and the audit-seed bias discussion.
contract Veriloco is VerilocoBase {
    /// @dev Creates VerilocoModule (nonce 1, see _module) and VerilocoViews (nonce 2, _views) from
    ///      blueprints: contracts whose code is one 0xFE byte and then the companion's creation code
    ///      (EIP-5202 style). One creation transaction could not carry all three under the 48 KB
    ///      initcode limit. A wrong blueprint makes wrong companions, which clients refuse: they compare
    ///      the code at both derived addresses with the build (protocol/chain/binding.py).
    constructor(address moduleBlueprint, address viewsBlueprint) {
        _fromBlueprint(moduleBlueprint);
        _fromBlueprint(viewsBlueprint);
    }

    function _fromBlueprint(address blueprint) private {
        assembly ("memory-safe") {
            let n := sub(extcodesize(blueprint), 1)
            let p := mload(0x40)
            extcodecopy(blueprint, p, 1, n)
            if iszero(create(0, p, n)) { revert(0, 0) }
        }
    }

    /// @notice Every function not defined here is VerilocoModule's (or VerilocoViews'), run on this
    ///         contract's storage.
    fallback() external payable {
        _delegate(_module());
    }

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
        _inPhase(runId, r, epoch, Phase.Committing);
        if (epoch < m.joinEpoch || epoch >= m.leaveEpoch) revert NotEligible(runId, epoch, msg.sender, m.joinEpoch, m.leaveEpoch);
        if (_lane(runId, epoch, m.slot) != 0) revert AlreadyCommitted(runId, epoch, msg.sender);
        hashes[runId][msg.sender][epoch % HASH_SLOTS] = commitment;
        _setLane(runId, epoch, m.slot, uint256(SUB_COMMITTED) << 24);
        uint32 c = ep.committed + 1;
        ep.committed = c;
        if (c == ep.expected) ep.allCommittedAt = uint64(block.timestamp);
        emit Committed(runId, epoch, msg.sender, commitment);
    }

    /// @notice Reveal what was committed. The last reveal of an epoch closes reveals; the audit seed is
    ///         scheduled by the next startAudit, so a reveal never carries the audit's bookkeeping.
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
        _inPhase(runId, r, epoch, Phase.Revealing);
        uint32 slot = _slotOf(runId, msg.sender);
        uint256 lane = _lane(runId, epoch, slot);
        uint8 st = _state(lane);
        if (st == SUB_NONE) revert NotCommitted(runId, epoch, msg.sender);
        if (st != SUB_COMMITTED) revert AlreadyRevealed(runId, epoch, msg.sender);
        if (leafCount < 2 || leafCount > MAX_LEAVES) revert BadLeafCount(leafCount, 2, MAX_LEAVES);
        bytes32 c = _commitment(runId, epoch, msg.sender, payloadDigest, traceRoot, leafCount, salt);
        bytes32 committed = hashes[runId][msg.sender][epoch % HASH_SLOTS];
        if (c != committed) revert RevealMismatch(runId, epoch, msg.sender, c, committed);
        hashes[runId][msg.sender][epoch % HASH_SLOTS] = traceRoot;
        _setLane(runId, epoch, slot, (uint256(SUB_REVEALED) << 24) | leafCount);
        Epoch storage ep = epochs[runId][epoch];
        uint32 n = ep.revealed + 1;
        ep.revealed = n;
        emit Revealed(runId, epoch, msg.sender, payloadCid, payloadDigest, traceRoot, leafCount);
        if (n == ep.committed) ep.allRevealedAt = uint64(block.timestamp);
    }

    /// @notice Move the audit seed of an epoch whose reveals have closed one step on (anyone may call):
    ///         schedule it (the seed block is this block; the previous epoch is settled and departed
    ///         verifiers leave the list first) if nobody has yet, else fix it from the seed block's hash
    ///         once that block is in the past. Call again in a later block until
    ///         epochAudit reports it seeded; a seed block more than 256 blocks old is rescheduled.
    function startAudit(uint256 runId, uint256 epoch) external {
        Run storage r = _run(runId);
        _inPhase(runId, r, epoch, Phase.Auditing);
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

    /// @notice Answer the audit: post the manifest CID and, for each challenged transition k->k+1 in
    ///         draw order, the digests of leaves k and k+1 (then leaf L-1 if the final check is drawn),
    ///         with their proofs flattened in the same order: a pair proof per transition, then a
    ///         plain proof of leaf L-1 (docs/protocol.md §5).
    /// @dev The seed must be fixed first (startAudit): the trainer needs it to know what to prove.
    function respond(uint256 runId, uint256 epoch, string calldata manifestCid, bytes32[] calldata leaves, bytes32[] calldata proofs) external {
        Run storage r = _run(runId);
        _inPhase(runId, r, epoch, Phase.Auditing);
        Epoch storage ep = epochs[runId][epoch];
        uint256 deadline = _responseDeadline(runId, r, epoch);
        if (block.timestamp >= deadline) revert DeadlinePassed(runId, epoch, deadline, block.timestamp);
        uint32 slot = _slotOf(runId, msg.sender);
        uint256 lane = _lane(runId, epoch, slot);
        uint8 st = _state(lane);
        if (st == SUB_RESPONDED) revert AlreadyResponded(runId, epoch, msg.sender);
        if (st != SUB_REVEALED) revert NotRevealed(runId, epoch, msg.sender);
        if (!ep.seeded) {
            // the responder fixes the seed itself when it can: nobody else has to be awake for it
            uint256 sb = uint256(ep.seed);
            bytes32 h = sb != 0 && block.number > sb ? blockhash(sb) : bytes32(0);
            if (h == bytes32(0)) revert AuditSeedPending(runId, epoch, sb);
            _fixSeed(runId, epoch, ep, h);
        }
        (uint256 nl, uint256 nw, uint256 bad) = _checkResponse(
            ep.seed, msg.sender, r.p.auditSteps, r.p.auditRate, r.p.finalCheckBps, hashes[runId][msg.sender][epoch % HASH_SLOTS], _leafCount(lane), leaves, proofs
        );
        if (leaves.length != nl || proofs.length != nw) revert BadResponseLength(leaves.length, nl, proofs.length, nw);
        if (bad != NO_BAD_LEAF) revert InvalidProof(runId, epoch, msg.sender, bad);
        _setLane(runId, epoch, slot, (uint256(SUB_RESPONDED) << 24) | _leafCount(lane));
        ep.responded += 1;
        emit Responded(runId, epoch, msg.sender, manifestCid);
    }

    /// @notice Propose the epoch's aggregate. Every included trainer must have a passing verdict
    ///         quorum and every passing trainer must be included; trainers that did not reveal, did
    ///         not respond or failed an audit are slashed, and so are verifiers that committed verdicts
    ///         and never revealed them. Allowed once every committed trainer is decided and every
    ///         committed verdict list revealed, or the verdict window closed, and before the finalize deadline: to the staked
    ///         coordinator, and in the second half of the finalize window to any staked member, so a
    ///         silent coordinator cannot stop the run. The model then awaits its attestation
    ///         committee (Confirming) before it counts.
    /// @param includedTrainers The passing trainers, strictly ascending by address.
    function finalize(uint256 runId, uint256 epoch, string calldata modelCid, bytes32 modelDigest, address[] calldata includedTrainers) external {
        Run storage r = _run(runId);
        Member storage fm = members[runId][msg.sender];
        if (msg.sender != r.p.coordinator) {
            if (block.timestamp < _finalizeDeadline(runId, r, epoch) - r.p.finalizeWindow / 2) {
                revert NotCoordinator(runId, msg.sender, r.p.coordinator);
            }
        }
        // the coordinator answers with its coordinator stake (not a trainer's); others with their member stake
        bool staked = msg.sender == r.p.coordinator ? fm.role == ROLE_COORDINATOR : fm.role != ROLE_NONE;
        if (!staked || fm.stake == 0 || fm.leaveEpoch != NEVER_EPOCH) revert NotStaked(runId, msg.sender);
        _inPhase(runId, r, epoch, Phase.Auditing);
        Epoch storage ep = epochs[runId][epoch];
        uint256 verdictDeadline = _responseDeadline(runId, r, epoch) + r.p.verdictWindow;
        uint256 decided = ep.passed + _failed(runId, r, epoch, ep);
        // every committed verdict is revealed first (one held back is slashed once the window is over)
        if ((decided < ep.committed || ep.verdictReveals < ep.verdictCommits) && block.timestamp < verdictDeadline) {
            revert NotReady(runId, epoch, decided, ep.committed, verdictDeadline);
        }
        // the attestation committee is drawn from the fixed seed: no finalize before the audit started
        if (!ep.seeded) revert AuditSeedPending(runId, epoch, uint256(ep.seed));
        _checkIncluded(runId, epoch, r, ep, includedTrainers);
        ep.finalized = true;
        ep.finalizer = msg.sender;
        ep.finalizedAt = uint64(block.timestamp);
        ep.modelCid = modelCid;
        ep.modelDigest = modelDigest;
        emit EpochFinalized(runId, epoch, modelCid, modelDigest, includedTrainers.length);
        _slashAll(runId, epoch, r, ep, true);
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

    /// @notice The relay's post of window `window`'s aggregate root (docs/protocol.md §5.4): the run's
    ///         coordinator only. Emits, stores nothing: readers take the first post of a window. Here, not
    ///         in a companion: a post is paid every window, and two delegatecalls would add about 5k gas.
    function postWindow(uint256 runId, uint256 epoch, uint256 window, bytes32 root, bytes calldata bitmap, string calldata evidenceCid)
        external
    {
        Run storage r = _run(runId);
        if (msg.sender != r.p.coordinator) revert NotCoordinator(runId, msg.sender, r.p.coordinator);
        _windowOpen(runId, r, epoch, window);
        emit WindowPosted(runId, epoch, window, root, bitmap, evidenceCid);
    }

    /// @notice A trainer's own window root, where the relay's aggregate left it out (or no relay posted).
    function postOwnWindow(uint256 runId, uint256 epoch, uint256 window, bytes32 root) external {
        Run storage r = _run(runId);
        Member storage m = members[runId][msg.sender];
        if (m.role != ROLE_TRAINER) revert NotTrainer(runId, msg.sender);
        if (epoch < m.joinEpoch || epoch >= m.leaveEpoch) revert NotEligible(runId, epoch, msg.sender, m.joinEpoch, m.leaveEpoch);
        _windowOpen(runId, r, epoch, window);
        uint256 mk = windowMarks[runId][msg.sender];
        if (uint128(mk) != epoch + 1) windowMarks[runId][msg.sender] = (mk >> 128 << 128) | (epoch + 1);
        emit OwnWindowPosted(runId, epoch, window, msg.sender, root);
    }

    /// @notice Slash a trainer that began an epoch's windows and never committed it (docs/protocol.md §5.4):
    ///         a window's draws are known once it is posted, so a trainer could otherwise forge steps and
    ///         walk away whenever a forged one is drawn. Its signature over a window root (a relay's
    ///         evidence holds it), or its own window post, is its promise to commit. Anyone may report once
    ///         the epoch's commits closed; the stake is burned, so no reporter (the trainer itself
    ///         included) gains. Reports of one trainer go in epoch order (one slash removes it anyway).
    function reportAbandoned(uint256 runId, uint256 epoch, address trainer, uint256 window, bytes32 root, bytes calldata sig)
        external
    {
        Run storage r = _run(runId);
        Phase ph = _phase(runId, r, epoch);
        if (ph <= Phase.Committing) revert WrongPhase(runId, epoch, uint8(ph), uint8(Phase.Revealing));
        uint256 mk = windowMarks[runId][trainer];
        if (uint128(mk) != epoch + 1) {
            bytes32 d = keccak256(abi.encode(WINDOW_TAG, block.chainid, address(this), runId, epoch, window, root));
            d = keccak256(abi.encodePacked("\x19Ethereum Signed Message:\n32", d));
            if (sig.length != 65 || ecrecover(d, uint8(sig[64]), bytes32(sig[0:32]), bytes32(sig[32:64])) != trainer) {
                revert NotSignedBy(runId, epoch, trainer);
            }
        }
        Member storage m = members[runId][trainer];
        bool bound = epoch < m.leaveEpoch || (epoch == m.leaveEpoch && m.pendingRemoval);
        if (m.role != ROLE_TRAINER || epoch < m.joinEpoch || !bound || _lane(runId, epoch, m.slot) != 0 || mk >> 128 > epoch) {
            revert NotAbandoned(runId, epoch, trainer);
        }
        windowMarks[runId][trainer] = ((epoch + 1) << 128) | uint128(mk);
        _settlePayout(_slashOne(runId, epoch, r, trainer, SLASH_ABANDONED), 0);
    }

    /// @dev Windows are posted while their epoch trains: the next epoch, or the newest opened one.
    function _windowOpen(uint256 runId, Run storage r, uint256 epoch, uint256 window) private view {
        if (epoch > r.nextEpoch || epoch + 1 < r.nextEpoch || window >= 4096) revert WindowClosed(runId, epoch, window, r.nextEpoch);
    }
}
