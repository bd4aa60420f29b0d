"""Merkle trees over trace digests, hashed exactly as the contract checks them (docs/protocol.md §3).

Leaves and inner nodes carry different prefixes, so a leaf can never pass for a node; the tree is
padded to a power of two with zero hashes, and a proof's length is fixed by the leaf count, so a
proof cannot point into the padding.
"""

from __future__ import annotations

from collections.abc import Sequence

from protocol.digest import keccak
from protocol.types import Digest

EMPTY = Digest(bytes(32))


class MerkleError(ValueError):
    """A proof or leaf set that does not fit the tree."""


def leaf_hash(d: bytes) -> Digest:
    if len(d) != 32:
        raise MerkleError(f"a leaf digest must be 32 bytes, got {len(d)}")
    return keccak(b"\x00" + d)


def node_hash(left: bytes, right: bytes) -> Digest:
    return keccak(b"\x01" + left + right)


def proof_length(leaf_count: int) -> int:
    """ceil(log2(leaf_count)): the number of siblings in every proof of a tree of that size."""
    if leaf_count < 1:
        raise MerkleError("a trace has at least one leaf")
    return (leaf_count - 1).bit_length()


def _levels(digests: Sequence[bytes]) -> list[list[Digest]]:
    level = [leaf_hash(d) for d in digests]
    level += [EMPTY] * ((1 << proof_length(len(digests))) - len(level))
    levels = [level]
    while len(level) > 1:
        level = [node_hash(level[i], level[i + 1]) for i in range(0, len(level), 2)]
        levels.append(level)
    return levels


def root(digests: Sequence[bytes]) -> Digest:
    """The trace root of state digests d_0..d_H."""
    return _levels(digests)[-1][0]


def prove(digests: Sequence[bytes], index: int) -> list[Digest]:
    """Sibling hashes from the bottom up for leaf `index`."""
    if not 0 <= index < len(digests):
        raise MerkleError(f"leaf index {index} outside 0..{len(digests) - 1}")
    proof = []
    for level in _levels(digests)[:-1]:
        proof.append(level[index ^ 1])
        index >>= 1
    return proof


def verify(root_: bytes, digest: bytes, index: int, leaf_count: int, proof: Sequence[bytes]) -> bool:
    """True when `digest` is leaf `index` of the `leaf_count`-leaf tree with root `root_`."""
    if not 0 <= index < leaf_count or len(proof) != proof_length(leaf_count):
        return False
    h = leaf_hash(digest)
    for sibling in proof:
        if len(sibling) != 32:
            return False
        h = node_hash(sibling, h) if index & 1 else node_hash(h, sibling)
        index >>= 1
    return h == root_
