// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

/// @title VerilocoAudit: the pure audit arithmetic of the Veriloco contract
/// @notice Sampling of challenged steps, verifier assignment and Merkle (pair) proof checks
///         (docs/protocol.md §3, §5), mirrored off-chain by protocol/chain_audit.py.
abstract contract VerilocoAudit {
    /// @dev _checkResponse's badLeaf when every proof is valid.
    uint256 internal constant NO_BAD_LEAF = type(uint256).max;
    uint256 internal constant BPS = 10_000;
    /// @dev auditRate's unit: a transition is challenged with probability auditRate / RATE_ONE.
    uint256 internal constant RATE_ONE = 1_000_000;
    /// @dev Under auditRate only transitions 0..RATE_SCAN-1 are drawn: a revealed leaf count past a run's
    ///      schedule (which no verifier passes) cannot make a draw, or a verifier's read of it, run out of gas.
    ///      Run configs keep schedule.h_max within it (protocol/config.py).
    uint256 internal constant RATE_SCAN = 4096;
    /// @dev keccak256("veriloco.audit.rate"): the per-transition draw's domain (protocol/chain/audit.py RATE_TAG).
    bytes32 internal constant RATE_TAG = 0xf4304fb0f5010d25c84db27883baec591ccfc85fd86075d1bb33fad7a015484c;

    /// @dev Check an audit response (docs/protocol.md §5) against a revealed trace root.
    /// @return expectedLeaves The number of leaf digests the response must carry.
    /// @return expectedWords The number of proof words it must carry (lengths are checked first).
    /// @return badLeaf NO_BAD_LEAF when every proof leads to `root`, else the first leaf index that does not.
    function _checkResponse(
        bytes32 seed,
        address trainer,
        uint256 steps,
        uint32 rate,
        uint16 finalCheckBps,
        bytes32 root,
        uint32 leafCount,
        bytes32[] calldata leaves,
        bytes32[] calldata proofs
    ) internal pure returns (uint256 expectedLeaves, uint256 expectedWords, uint256 badLeaf) {
        uint256 L = leafCount;
        uint256 depth = _ceilLog2(L);
        bool fin = _finalCheck(seed, trainer, finalCheckBps);
        uint256[] memory ks = _drawn(seed, trainer, steps, rate, leafCount);
        steps = ks.length;
        expectedLeaves = 2 * steps + (fin ? 1 : 0);
        expectedWords = fin ? depth : 0;
        for (uint256 j = 0; j < steps; j++) expectedWords += depth + _trailingOnes(ks[j]) - 1;
        badLeaf = NO_BAD_LEAF;
        if (leaves.length != expectedLeaves || proofs.length != expectedWords) return (expectedLeaves, expectedWords, badLeaf);
        uint256 cur = 0;
        for (uint256 j = 0; j < steps; j++) {
            uint256 k = ks[j];
            uint256 l = _trailingOnes(k);
            uint256 n = depth + l - 1;
            if (!_verifyPair(root, leaves[2 * j], leaves[2 * j + 1], k, l, proofs[cur:cur + n])) return (expectedLeaves, expectedWords, k);
            cur += n;
        }
        if (fin && !_verifyLeaf(root, leaves[2 * steps], L - 1, proofs[cur:cur + depth])) badLeaf = L - 1;
    }

    /// @dev A trainer's challenged transitions (draw order, duplicates kept) and final-check flag.
    function _challenges(bytes32 seed, address trainer, uint256 steps, uint32 rate, uint32 leafCount, uint16 finalCheckBps)
        internal
        pure
        returns (uint256[] memory ks, bool finalCheck)
    {
        ks = _drawn(seed, trainer, steps, rate, leafCount);
        finalCheck = _finalCheck(seed, trainer, finalCheckBps);
    }

    /// @dev The challenged transitions: `steps` uniform draws (rate 0), or each k in 0..min(L-1, RATE_SCAN)-1
    ///      on its own with probability rate / RATE_ONE, keyed by keccak(abi.encode(seed, trainer, RATE_TAG, k)),
    ///      ascending, the first `steps` of them (the config keeps the chance of more below 1e-6).
    function _drawn(bytes32 seed, address trainer, uint256 steps, uint32 rate, uint32 leafCount)
        internal
        pure
        returns (uint256[] memory ks)
    {
        ks = new uint256[](steps);
        if (rate == 0) {
            for (uint256 j = 0; j < steps; j++) ks[j] = _stepIndex(seed, trainer, j, leafCount);
            return ks;
        }
        uint256 n = 0;
        assembly ("memory-safe") {
            let buf := mload(0x40)
            mstore(buf, seed)
            mstore(add(buf, 0x20), trainer)
            mstore(add(buf, 0x40), RATE_TAG)
            let transitions := sub(leafCount, 1)
            if gt(transitions, RATE_SCAN) { transitions := RATE_SCAN }
            for { let k := 0 } and(lt(k, transitions), lt(n, steps)) { k := add(k, 1) } {
                mstore(add(buf, 0x60), k)
                if lt(mod(keccak256(buf, 0x80), RATE_ONE), rate) {
                    n := add(n, 1)
                    mstore(add(ks, shl(5, n)), k)
                }
            }
            mstore(ks, n) // shrink to the drawn count (the words past it stay allocated, unused)
        }
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
}
