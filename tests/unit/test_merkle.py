"""Property tests for Merkle traces: every proof verifies, every tampering is rejected."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import merkle
from protocol.digest import keccak

pytestmark = pytest.mark.unit

digests = st.binary(min_size=32, max_size=32)
traces = st.lists(digests, min_size=1, max_size=70)


@st.composite
def trace_and_index(draw: st.DrawFn) -> tuple[list[bytes], int]:
    trace = draw(traces)
    return trace, draw(st.integers(0, len(trace) - 1))


@settings(max_examples=150, deadline=None)
@given(traces)
def test_every_proof_verifies(trace: list[bytes]) -> None:
    root = merkle.root(trace)
    for i, d in enumerate(trace):
        proof = merkle.prove(trace, i)
        assert len(proof) == merkle.proof_length(len(trace))
        assert merkle.verify(root, d, i, len(trace), proof)


@settings(max_examples=150, deadline=None)
@given(trace_and_index(), st.data())
def test_tampered_proofs_are_rejected(ti: tuple[list[bytes], int], data: st.DataObject) -> None:
    trace, i = ti
    n = len(trace)
    root = merkle.root(trace)
    proof = merkle.prove(trace, i)
    d = trace[i]
    other = data.draw(digests.filter(lambda x: x != d))
    assert not merkle.verify(root, other, i, n, proof)  # wrong leaf
    if proof:
        j = data.draw(st.integers(0, len(proof) - 1))
        bit = data.draw(st.integers(0, 255))
        bad = list(proof)
        bad[j] = bytes(b ^ (1 << (bit % 8)) if k == bit // 8 else b for k, b in enumerate(bad[j]))
        assert not merkle.verify(root, d, i, n, bad)  # flipped bit in a sibling
        assert not merkle.verify(root, d, i, n, proof[:-1])  # short proof
        if proof[::-1] != proof:
            assert not merkle.verify(root, d, i, n, proof[::-1])  # siblings out of order
        # a different index in range: the same proof leads elsewhere unless the leaves coincide
        k = data.draw(st.integers(0, n - 1).filter(lambda k: k != i))
        if trace[k] != d:
            assert not merkle.verify(root, d, k, n, proof)
    assert not merkle.verify(root, d, i, n, [*proof, bytes(32)])  # long proof
    assert not merkle.verify(root, d, n, n, proof)  # index out of range
    assert not merkle.verify(root, d, -1, n, proof)
    bad_root = keccak(root)
    assert not merkle.verify(bad_root, d, i, n, proof)


@settings(max_examples=100, deadline=None)
@given(trace_and_index())
def test_leaf_count_is_bound(ti: tuple[list[bytes], int]) -> None:
    """A proof for an n-leaf tree does not pass for a leaf count whose depth differs."""
    trace, i = ti
    n = len(trace)
    root = merkle.root(trace)
    proof = merkle.prove(trace, i)
    for m in (2 * n + 1, (n + 1) // 2 if n > 2 else 0):
        if m >= 1 and i < m and merkle.proof_length(m) != merkle.proof_length(n):
            assert not merkle.verify(root, trace[i], i, m, proof)


@settings(max_examples=60, deadline=None)
@given(traces, digests)
def test_root_changes_with_any_leaf_or_extra_leaf(trace: list[bytes], extra: bytes) -> None:
    root = merkle.root(trace)
    assert merkle.root([*trace, extra]) != root
    changed = [keccak(trace[0]), *trace[1:]]
    assert merkle.root(changed) != root


def test_padding_cannot_be_proven() -> None:
    trace = [keccak(bytes([i])) for i in range(5)]  # padded to 8
    root = merkle.root(trace)
    with pytest.raises(merkle.MerkleError):
        merkle.prove(trace, 5)
    # a proof "for" padded leaf 5, with the zero hash as the leaf digest, is refused by index
    assert not merkle.verify(root, bytes(32), 5, 5, merkle.prove(trace, 4))


def test_single_leaf_tree() -> None:
    d = keccak(b"s")
    assert merkle.root([d]) == merkle.leaf_hash(d)
    assert merkle.prove([d], 0) == []
    assert merkle.verify(merkle.root([d]), d, 0, 1, [])


def test_known_small_tree() -> None:
    a, b, c = (keccak(x) for x in (b"a", b"b", b"c"))
    la, lb, lc = (merkle.leaf_hash(x) for x in (a, b, c))
    expect = merkle.node_hash(merkle.node_hash(la, lb), merkle.node_hash(lc, merkle.EMPTY))
    assert merkle.root([a, b, c]) == expect
    assert merkle.prove([a, b, c], 2) == [merkle.EMPTY, merkle.node_hash(la, lb)]


def test_bad_inputs_raise_merkle_errors() -> None:
    with pytest.raises(merkle.MerkleError):
        merkle.root([])
    with pytest.raises(merkle.MerkleError):
        merkle.leaf_hash(b"short")
