"""The contract's hashing rules in pure Python: commitment (§4), audit seed and sampling (§5), and
the audit response layout the contract's `respond` checks.

Nodes call these instead of asking the chain, and the integration tests check that they agree with
the contract bit for bit. No network, no clock: the seed's block inputs are parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from eth_abi import encode
from eth_utils import to_checksum_address

from protocol import merkle
from protocol.digest import keccak
from protocol.types import Address, Digest

COMMIT_TAG = keccak(b"veriloco.commit.v1")
AUDIT_TAG = keccak(b"veriloco.audit.v1")
VERDICT_TAG = keccak(b"veriloco.verdict.v1")
BPS = 10_000
RATE_TAG = keccak(b"veriloco.audit.rate")  # the per-transition draw's domain (VerilocoAudit.RATE_TAG)
RATE_ONE = 1_000_000  # auditRate's unit: parts per million of the transitions
RATE_SCAN = 4096  # the transitions a per-step draw reaches (VerilocoAudit.RATE_SCAN): schedule.h_max's bound


def _b32(name: str, value: bytes) -> bytes:
    if len(value) != 32:
        raise ValueError(f"{name} must be 32 bytes, got {len(value)}")
    return value


def commitment(
    chain_id: int,
    contract: str,
    run_id: int,
    epoch: int,
    trainer: str,
    payload_digest: bytes,
    trace_root: bytes,
    leaf_count: int,
    salt: bytes,
) -> Digest:
    """keccak(abi.encode(COMMIT_TAG, chainId, contract, runId, epoch, trainer, payloadDigest, traceRoot, uint32 leafCount, salt))."""
    return keccak(
        encode(
            ["bytes32", "uint256", "address", "uint256", "uint256", "address", "bytes32", "bytes32", "uint32", "bytes32"],
            [
                COMMIT_TAG, chain_id, to_checksum_address(contract), run_id, epoch,
                to_checksum_address(trainer), _b32("payload_digest", payload_digest),
                _b32("trace_root", trace_root), leaf_count, _b32("salt", salt),
            ],
        )
    )


Verdict = tuple[str, bool, bytes]  # (trainer, passed, replay witness)


def verdict_body(verdicts: Sequence[Verdict]) -> Digest:
    """keccak(abi.encode(address[] trainers, bool[] passed, bytes32[] witnesses)), in the given order."""
    return keccak(encode(
        ["address[]", "bool[]", "bytes32[]"],
        [[to_checksum_address(t) for t, _, _ in verdicts], [bool(p) for _, p, _ in verdicts],
         [_b32("witness", w) for _, _, w in verdicts]],
    ))


def verdict_commitment(
    chain_id: int, contract: str, run_id: int, epoch: int, verifier: str, verdicts: Sequence[Verdict], salt: bytes,
) -> Digest:
    """keccak(abi.encode(VERDICT_TAG, chainId, contract, runId, epoch, verifier, verdict_body, salt))
    (docs/protocol.md §5.2); the evidence CID is not committed (it only travels in the reveal's event)."""
    return keccak(encode(
        ["bytes32", "uint256", "address", "uint256", "uint256", "address", "bytes32", "bytes32"],
        [VERDICT_TAG, chain_id, to_checksum_address(contract), run_id, epoch, to_checksum_address(verifier),
         verdict_body(verdicts), _b32("salt", salt)],
    ))


def audit_seed(block_hash: bytes, chain_id: int, contract: str, run_id: int, epoch: int) -> Digest:
    """keccak(abi.encode(AUDIT_TAG, chainId, contract, runId, epoch, blockhash(seedBlock))).

    The seed block is the block of the reveal that closed reveals (or of the startAudit call that
    scheduled the audit after the reveal window ran out): its hash does not exist yet when that
    transaction is signed, so a revealer cannot pick a favourable sample by timing its reveal.
    """
    return keccak(
        encode(["bytes32", "uint256", "address", "uint256", "uint256", "bytes32"],
               [AUDIT_TAG, chain_id, to_checksum_address(contract), run_id, epoch, _b32("block_hash", block_hash)])
    )


def draw(seed: bytes, trainer: str, label: str, *extra: int) -> int:
    """uint256(keccak(abi.encode(seed, trainer, label, *extra))): every public draw of an audit (§5)."""
    types = ["bytes32", "address", "string"] + ["uint256"] * len(extra)
    return int.from_bytes(keccak(encode(types, [_b32("seed", seed), to_checksum_address(trainer), label, *extra])), "big")


def challenged_steps(seed: bytes, trainer: str, audit_steps: int, leaf_count: int, rate: int = 0) -> list[int]:
    """The transitions k -> k+1 drawn for a trainer, in draw order. ``rate`` 0: ``audit_steps`` uniform
    draws (duplicates kept). Else each k is challenged on its own with probability ``rate / RATE_ONE``
    (``rate_drawn``), ascending, at most ``audit_steps`` of them: a step's chance of a challenge is the
    same whatever H is, so verification is priced per step of work (docs/protocol.md §5)."""
    if leaf_count < 2:
        raise ValueError(f"a trace needs at least 2 leaves, got {leaf_count}")
    if rate:
        return rate_drawn(seed, trainer, rate, min(leaf_count - 1, RATE_SCAN), audit_steps)
    return [draw(seed, trainer, "step", j) % (leaf_count - 1) for j in range(audit_steps)]


RATE_TAIL = 1e-6  # the most a run config lets the cap on an epoch's challenges bind (over_cap)


def over_cap(rate: int, transitions: int, cap: int) -> float:
    """P(more than ``cap`` of ``transitions`` independent draws at ``rate / RATE_ONE`` hit): the chance that
    the contract's cap (audit.challenges) cuts an epoch's later steps out of its draw."""
    p = rate / RATE_ONE
    return max(0.0, 1.0 - sum(math.comb(transitions, i) * p**i * (1 - p) ** (transitions - i)
                              for i in range(min(cap, transitions) + 1)))


def min_cap(rate: int, transitions: int) -> int:
    """The least cap (audit.challenges) that binds with probability at most RATE_TAIL over ``transitions``."""
    cap = 1
    while cap < transitions and over_cap(rate, transitions, cap) > RATE_TAIL:
        cap += 1
    return cap


def rate_draw(seed: bytes, trainer: str, k: int) -> int:
    """uint256(keccak(abi.encode(seed, trainer, RATE_TAG, k))) % RATE_ONE: transition k is challenged when
    this is below the run's auditRate (the contract hashes the same four words in assembly)."""
    word = _b32("seed", seed) + bytes(12) + bytes.fromhex(to_checksum_address(trainer)[2:]) + RATE_TAG + k.to_bytes(32, "big")
    return int.from_bytes(keccak(word), "big") % RATE_ONE


def rate_drawn(seed: bytes, trainer: str, rate: int, transitions: int, cap: int) -> list[int]:
    """Transitions 0..transitions-1 whose ``rate_draw`` is below ``rate``, ascending, the first ``cap``."""
    out: list[int] = []
    for k in range(transitions):
        if len(out) == cap:
            break
        if rate_draw(seed, trainer, k) < rate:
            out.append(k)
    return out


def final_check(seed: bytes, trainer: str, final_check_bps: int) -> bool:
    """Whether the end-state -> payload transition is checked for this trainer."""
    return draw(seed, trainer, "final") % BPS < final_check_bps


def assigned_verifiers(seed: bytes, trainer: str, verifiers: Sequence[str], quorum: int) -> list[Address]:
    """The verifiers judging this trainer, in assignment order: the first min(quorum, V) draws of a
    partial Fisher-Yates shuffle of `verifiers` (the frozen list, in the contract's order) keyed by
    keccak(abi.encode(key, j)), key = keccak(abi.encode(seed, trainer, "verifiers")) — distinct, and
    independent of list order."""
    v = len(verifiers)
    key = draw(seed, trainer, "verifiers").to_bytes(32, "big")
    moved: dict[int, int] = {}  # position -> list index now there, where it differs
    out: list[Address] = []
    for j in range(min(quorum, v)):
        r = j + int.from_bytes(keccak(encode(["bytes32", "uint256"], [key, j])), "big") % (v - j)
        out.append(Address(to_checksum_address(verifiers[moved.get(r, r)])))
        moved[r] = moved.get(j, j)
    return out


def response_indices(seed: bytes, trainer: str, audit_steps: int, leaf_count: int, final_check_bps: int,
                     rate: int = 0) -> list[int]:
    """Leaf indices an audit response must prove, in the order `respond` expects them."""
    out: list[int] = []
    for k in challenged_steps(seed, trainer, audit_steps, leaf_count, rate):
        out += [k, k + 1]
    if final_check(seed, trainer, final_check_bps):
        out.append(leaf_count - 1)
    return out


def trailing_ones(k: int) -> int:
    """The level at which the Merkle paths of leaves k and k+1 merge."""
    n = 0
    while k & 1:
        k >>= 1
        n += 1
    return n


def pair_proof(digests: Sequence[bytes], k: int) -> list[Digest]:
    """Proof of adjacent leaves k and k+1 together (§5): k's l lower siblings, k+1's l lower
    siblings, then the siblings above the level l where the two paths merge (l = trailing ones of k)."""
    if not 0 <= k < len(digests) - 1:
        raise merkle.MerkleError(f"transition {k} -> {k + 1} outside a trace of {len(digests)} leaves")
    lo, hi = merkle.prove(digests, k), merkle.prove(digests, k + 1)
    ell = trailing_ones(k)
    return lo[:ell] + hi[:ell] + lo[ell + 1:]


def verify_pair(root_: bytes, dk: bytes, dk1: bytes, k: int, leaf_count: int, proof: Sequence[bytes]) -> bool:
    """True when dk, dk1 are leaves k, k+1 of the `leaf_count`-leaf tree with root `root_`."""
    depth = merkle.proof_length(leaf_count)
    ell = trailing_ones(k)
    if not 0 <= k < leaf_count - 1 or len(proof) != depth + ell - 1 or any(len(x) != 32 for x in proof):
        return False
    h1, h2 = merkle.leaf_hash(dk), merkle.leaf_hash(dk1)
    for i in range(ell):
        h1 = merkle.node_hash(proof[i], h1)
        h2 = merkle.node_hash(h2, proof[ell + i])
    h = merkle.node_hash(h1, h2)
    idx = k >> (ell + 1)
    for sib in proof[2 * ell:]:
        h = merkle.node_hash(sib, h) if idx & 1 else merkle.node_hash(h, sib)
        idx >>= 1
    return h == root_


@dataclass(frozen=True)
class AuditResponse:
    """What `respond` takes besides the manifest CID: leaf digests and their flattened proofs.

    leaves: d(k_0), d(k_0+1), d(k_1), d(k_1+1), ..., then d(L-1) when the final check is drawn.
    proofs: pair_proof(k_0), pair_proof(k_1), ..., then merkle.prove(L-1) when drawn.
    """

    indices: tuple[int, ...]
    leaves: tuple[Digest, ...]
    proofs: tuple[Digest, ...]


def build_response(
    digests: Sequence[bytes], seed: bytes, trainer: str, audit_steps: int, final_check_bps: int, rate: int = 0
) -> AuditResponse:
    """Build the audit response for a trace of state digests d_0..d_H."""
    n = len(digests)
    idx = response_indices(seed, trainer, audit_steps, n, final_check_bps, rate)
    proofs: list[Digest] = []
    for k in challenged_steps(seed, trainer, audit_steps, n, rate):
        proofs += pair_proof(digests, k)
    if final_check(seed, trainer, final_check_bps):
        proofs += merkle.prove(digests, n - 1)
    return AuditResponse(tuple(idx), tuple(Digest(bytes(digests[i])) for i in idx), tuple(proofs))


def verify_response(
    root_: bytes, leaf_count: int, seed: bytes, trainer: str, audit_steps: int, final_check_bps: int,
    response: AuditResponse, rate: int = 0,
) -> bool:
    """What the contract's `respond` checks, in Python: layout, then every pair and final proof."""
    steps = challenged_steps(seed, trainer, audit_steps, leaf_count, rate)
    fin = final_check(seed, trainer, final_check_bps)
    depth = merkle.proof_length(leaf_count)
    lens = [depth + trailing_ones(k) - 1 for k in steps]
    leaves, proofs = response.leaves, response.proofs
    if len(leaves) != 2 * len(steps) + fin or len(proofs) != sum(lens) + (depth if fin else 0):
        return False
    cur = 0
    for j, (k, n) in enumerate(zip(steps, lens)):
        if not verify_pair(root_, leaves[2 * j], leaves[2 * j + 1], k, leaf_count, proofs[cur:cur + n]):
            return False
        cur += n
    return not fin or merkle.verify(root_, leaves[-1], leaf_count - 1, leaf_count, proofs[cur:])
