"""The contract's hashing rules in pure Python: commitment (§4), audit seed and sampling (§5), and
the audit response layout the contract's `respond` checks.

Nodes call these instead of asking the chain, and the integration tests check that they agree with
the contract bit for bit. No network, no clock: the seed's block inputs are parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eth_abi import encode
from eth_utils import to_checksum_address

from protocol import merkle
from protocol.digest import keccak
from protocol.types import Address, Digest

COMMIT_TAG = keccak(b"veriloco.commit.v1")
AUDIT_TAG = keccak(b"veriloco.audit.v1")
BPS = 10_000


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


def audit_seed(prevrandao: bytes | int, parent_hash: bytes, run_id: int, epoch: int) -> Digest:
    """keccak(abi.encode(AUDIT_TAG, block.prevrandao, blockhash(block.number - 1), runId, epoch))."""
    rand = prevrandao if isinstance(prevrandao, int) else int.from_bytes(prevrandao, "big")
    return keccak(
        encode(["bytes32", "uint256", "bytes32", "uint256", "uint256"],
               [AUDIT_TAG, rand, _b32("parent_hash", parent_hash), run_id, epoch])
    )


def _draw(seed: bytes, trainer: str, label: str, *extra: int) -> int:
    types = ["bytes32", "address", "string"] + ["uint256"] * len(extra)
    return int.from_bytes(keccak(encode(types, [_b32("seed", seed), to_checksum_address(trainer), label, *extra])), "big")


def challenged_steps(seed: bytes, trainer: str, audit_steps: int, leaf_count: int) -> list[int]:
    """The transitions k -> k+1 drawn for a trainer, in draw order (duplicates kept)."""
    if leaf_count < 2:
        raise ValueError(f"a trace needs at least 2 leaves, got {leaf_count}")
    return [_draw(seed, trainer, "step", j) % (leaf_count - 1) for j in range(audit_steps)]


def final_check(seed: bytes, trainer: str, final_check_bps: int) -> bool:
    """Whether the end-state -> payload transition is checked for this trainer."""
    return _draw(seed, trainer, "final") % BPS < final_check_bps


def assigned_verifiers(seed: bytes, trainer: str, verifiers: Sequence[str], quorum: int) -> list[Address]:
    """The verifiers judging this trainer: `verifiers` is the list at seed time, in the contract's order."""
    v = len(verifiers)
    if v == 0:
        return []
    base = _draw(seed, trainer, "verifiers")
    return [Address(to_checksum_address(verifiers[(base + j) % v])) for j in range(min(quorum, v))]


def response_indices(seed: bytes, trainer: str, audit_steps: int, leaf_count: int, final_check_bps: int) -> list[int]:
    """Leaf indices an audit response must prove, in the order `respond` expects them."""
    out: list[int] = []
    for k in challenged_steps(seed, trainer, audit_steps, leaf_count):
        out += [k, k + 1]
    if final_check(seed, trainer, final_check_bps):
        out.append(leaf_count - 1)
    return out


@dataclass(frozen=True)
class AuditResponse:
    """What `respond` takes besides the manifest CID: leaf digests and their flattened proofs."""

    indices: tuple[int, ...]
    leaves: tuple[Digest, ...]
    proofs: tuple[Digest, ...]  # len(leaves) * ceil(log2 leafCount) siblings, bottom up per leaf


def build_response(
    digests: Sequence[bytes], seed: bytes, trainer: str, audit_steps: int, final_check_bps: int
) -> AuditResponse:
    """Build the audit response for a trace of state digests d_0..d_H."""
    idx = response_indices(seed, trainer, audit_steps, len(digests), final_check_bps)
    proofs: list[Digest] = []
    for i in idx:
        proofs += merkle.prove(digests, i)
    return AuditResponse(tuple(idx), tuple(Digest(bytes(digests[i])) for i in idx), tuple(proofs))
