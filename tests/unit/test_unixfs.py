"""CIDs computed without a node equal what `ipfs add` (default options) gives.

The reference CIDs below were produced by a real node (js-ipfs 0.66.1, `ipfs add` defaults) for
the deterministic pattern `_pattern(n)`; the integration suite re-checks them live against a node.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.store import unixfs
from protocol.store.unixfs import CHUNK_SIZE, CidBuilder, CidError, cid_of, validate_cid

pytestmark = pytest.mark.unit


def _pattern(n: int) -> bytes:
    return (np.arange(n, dtype=np.uint64) * 2654435761 >> 7).astype(np.uint8).tobytes()


REFERENCE = {
    0: "QmbFMke1KXqnYyBBWxB74N4c5SBnJMVAiMNRcGu6x1AwQH",
    1: "QmS9JArPwa55ePgDnyg6TzX24mYTS1b1vLqWNebyVotKxQ",
    CHUNK_SIZE: "QmNdDz17Ft5u6oFy7rvnBB8To6iX128BC5d9zqrk4nnPBu",
    CHUNK_SIZE + 1: "QmfCmNzEy7zU5f3j4EVDixZ6ZKh3iMFhzypoFQhy98hv4g",
    10 << 20: "QmTPpYmFye65je3YSDrsUJH2B1FC1hXtL8McC6iTsm5WkV",
    CHUNK_SIZE * 174: "QmRQwNtp7wDVhR8qMSaonJUvVv9TXD9DWKEwoBJmkg4agW",
    CHUNK_SIZE * 174 + 1: "QmVhMyUJYH4fiK8j1oVCBLZ1SHPndHHPNn7FhCJxAdBi5B",
}


def test_hello_world_matches_the_documented_cid() -> None:
    assert cid_of(b"hello world\n") == "QmT78zSuBmuS4z925WZfrqQ1qHaJ56DQaTfyMUF7F8ff5o"


@pytest.mark.parametrize("size", sorted(REFERENCE))
def test_reference_cids(size: int) -> None:
    assert cid_of(_pattern(size)) == REFERENCE[size]


def test_two_level_dag_streamed_in_odd_pieces() -> None:
    data = _pattern(CHUNK_SIZE * 174 + 1)
    b = CidBuilder()
    view = memoryview(data)
    step = 100_003
    for i in range(0, len(data), step):
        b.update(view[i : i + step])
    assert b.finish() == REFERENCE[CHUNK_SIZE * 174 + 1]
    assert b.size == len(data)


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=3 * CHUNK_SIZE // 2), st.lists(st.integers(1, CHUNK_SIZE), max_size=6))
def test_cid_does_not_depend_on_how_bytes_are_fed(data: bytes, cuts: list[int]) -> None:
    b = CidBuilder()
    pos = 0
    for c in cuts:
        b.update(data[pos : pos + c])
        pos += c
    b.update(data[pos:])
    assert b.finish() == cid_of(data)


def test_single_chunk_cid_is_the_hash_of_its_leaf_block() -> None:
    data = b"abc" * 1000
    block = unixfs.leaf_block(data)
    assert block == unixfs.dagpb_node(unixfs.unixfs_file(data, len(data)))
    assert cid_of(data) == unixfs.cid_of_block(block)
    mh = unixfs.multihash_of(cid_of(data))
    assert mh == b"\x12\x20" + hashlib.sha256(block).digest()


def test_one_changed_byte_changes_the_cid() -> None:
    data = bytearray(_pattern(CHUNK_SIZE + 5))
    before = cid_of(data)
    data[CHUNK_SIZE + 2] ^= 1
    assert cid_of(data) != before


@pytest.mark.parametrize(
    "bad",
    ["", "Qm", "bafkreifjjcie6lypi6ny7amxnfftagclbuxndqonfipmb64f2km2devei4", "Qm" + "0" * 44,
     "QmT78zSuBmuS4z925WZfrqQ1qHaJ56DQaTfyMUF7F8ff5", 17, None],
)
def test_malformed_cids_are_rejected(bad: object) -> None:
    with pytest.raises(CidError):
        validate_cid(bad)  # type: ignore[arg-type]


def test_builder_cannot_be_reused() -> None:
    b = CidBuilder()
    b.finish()
    with pytest.raises(RuntimeError):
        b.update(b"x")


@given(st.binary(max_size=64))
def test_base58_round_trip(raw: bytes) -> None:
    assert unixfs.b58decode(unixfs.b58encode(raw)) == raw


def _reference_cid(data: bytes, chunk_size: int, max_links: int) -> str:
    """The importer's algorithm written the obvious, non-streaming way: chunk everything, then group
    max_links at a time, level by level, until one node is left (a lone leaf stays itself)."""
    chunks = [data[i : i + chunk_size] for i in range(0, len(data), chunk_size)] or [b""]
    level: list[unixfs.Link] = []
    for c in chunks:
        block = unixfs.leaf_block(c)
        level.append(unixfs.Link(unixfs.multihash_of(unixfs.cid_of_block(block)), len(block), len(c)))
    while len(level) > 1:
        parents = []
        for i in range(0, len(level), max_links):
            group = level[i : i + max_links]
            filesize = sum(g.filesize for g in group)
            block = unixfs.dagpb_node(unixfs.unixfs_file(b"", filesize, [g.filesize for g in group]), group)
            mh = unixfs.multihash_of(unixfs.cid_of_block(block))
            parents.append(unixfs.Link(mh, len(block) + sum(g.tsize for g in group), filesize))
        level = parents
    return unixfs.b58encode(level[0].multihash)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 400),
    st.integers(1, 5),
    st.integers(2, 4),
    st.lists(st.integers(1, 30), max_size=8),
)
def test_streaming_tree_equals_level_by_level_reduction(
    n: int, chunk_size: int, max_links: int, cuts: list[int]
) -> None:
    """Small chunks and fan-out give deep trees (up to 8 levels) from a few hundred bytes."""
    data = bytes(range(256)) * 2
    data = data[:n]
    b = CidBuilder(chunk_size=chunk_size, max_links=max_links)
    pos = 0
    for c in cuts:
        b.update(data[pos : pos + c])
        pos += c
    b.update(data[pos:])
    assert b.finish() == _reference_cid(data, chunk_size, max_links)
