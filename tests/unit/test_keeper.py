"""verifier/keeper.py on a real LocalStore: held payloads come back after a deletion, and only they do."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.store.backends import LocalStore, NotFound, StoreError
from verifier.keeper import Keeper

pytestmark = pytest.mark.unit


def test_a_deleted_payload_is_put_back_until_released(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    data = b"payload bytes " * 1000
    cid = store.put(data)
    keeper = Keeper(tmp_path / "kept", store)
    keeper.hold(3, cid, data)
    assert keeper.epochs() == [3] and keeper.held(3) == [cid]
    assert keeper.restore(3) == []  # still there: nothing to do
    store.path_of(cid).unlink()  # the trainer deletes its payload after passing
    assert keeper.restore(3) == [cid]
    assert store.get(cid) == data
    keeper.release(3)
    store.path_of(cid).unlink()
    assert keeper.epochs() == [] and keeper.restore(3) == []
    with pytest.raises(NotFound):
        store.get(cid)


def test_hold_publishes_and_survives_a_restart(tmp_path: Path) -> None:
    source, mine = LocalStore(tmp_path / "theirs"), LocalStore(tmp_path / "mine")
    data = b"fetched from the trainer's store"
    cid = source.put(data)
    Keeper(tmp_path / "kept", mine).hold(0, cid, data)
    assert mine.get(cid) == data  # pinned where we serve from
    again = Keeper(tmp_path / "kept", mine)  # a restarted verifier keeps its duty
    mine.path_of(cid).unlink()
    assert again.restore(0) == [cid]


def test_drop_forgets_only_that_payload(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    a, b = b"a" * 10, b"b" * 10
    ca, cb = store.put(a), store.put(b)
    keeper = Keeper(tmp_path / "kept", store)
    keeper.hold(1, ca, a)
    keeper.hold(1, cb, b)
    keeper.drop(1, ca)
    assert keeper.held(1) == [cb]


def test_a_corrupted_copy_is_never_published_under_the_name(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    data = b"the real payload"
    cid = store.put(data)
    keeper = Keeper(tmp_path / "kept", store)
    keeper.hold(2, cid, data)
    (tmp_path / "kept" / "epoch-2" / cid).write_bytes(b"bit rot")
    store.path_of(cid).unlink()
    with pytest.raises(StoreError, match="hashes to"):
        keeper.restore(2)
    assert not store.has(cid)
