"""Window posts on the real contract (issue 48, docs/protocol.md §5.4): who may post, for which epochs, and
which post fixes a trainer's root and seed. py-evm only: the function emits, it has no state to diverge."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from protocol import relay, windowdraw
from protocol.chain import errors as ce
from protocol.digest import keccak
from tests.fixtures.chain import PyEvmNet, Run
from tests.fixtures.chain import make_run as fixture_run

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def net() -> Iterator[Any]:
    n = PyEvmNet()
    try:
        yield n
    finally:
        n.close()


@pytest.fixture
def run(net: Any) -> Iterator[Run]:
    snap = net.snapshot()
    try:
        yield fixture_run(net, [1, 2, 3], [7, 8, 9], 0)
    finally:
        net.revert(snap)


def test_the_relay_posts_aggregates_trainers_post_their_own_and_nobody_else_posts(run: Run) -> None:
    rid, c = run.run_id, run.coord
    t0, t1 = run.trainers[0].chain, run.trainers[1].chain
    c.post_window(rid, 0, 0, keccak(b"agg0"), 0b101, 3)
    t1.post_own_window(rid, 0, 0, keccak(b"own"))
    posts = c.window_posts(rid, 0)
    assert [(p.poster, p.bitmap) for p in posts] == [(c.sender, 0b101), (t1.sender, 0)]
    with pytest.raises(ce.NotCoordinator):
        t0.post_window(rid, 0, 1, keccak(b"x"), 1, 3)
    with pytest.raises(ce.NotTrainer):
        run.verifiers[0].post_own_window(rid, 0, 1, keccak(b"x"))
    with pytest.raises(ce.WindowClosed):
        t0.post_own_window(rid, 2, 0, keccak(b"x"))  # not the next epoch: nothing trains it yet
    with pytest.raises(ce.WindowClosed):
        t0.post_own_window(rid, 0, 4096, keccak(b"x"))


def test_the_first_post_fixes_a_trainers_root_and_a_later_one_cannot_re_roll_its_seed(run: Run) -> None:
    rid, c = run.run_id, run.coord
    ts = [t.chain for t in run.trainers]
    dom = relay.Domain(c.chain_id, c.address, rid, 0)
    c.post_window(rid, 0, 3, keccak(b"agg"), 0b011, 3)  # trainers 0 and 1 in the aggregate, 2 left out
    ts[2].post_own_window(rid, 0, 3, keccak(b"own2"))
    ts[0].post_own_window(rid, 0, 3, keccak(b"again0"))  # after the aggregate: a re-roll attempt, ignored
    posts = c.window_posts(rid, 0)
    for i, t in enumerate(ts):
        first = windowdraw.first_post(posts, 3, t.sender, i, c.sender)
        assert first is not None
        assert first.poster == (t.sender if i == 2 else c.sender)
    head = c.block_number()
    src = windowdraw.ChainOrdering(
        dom, lambda w: (p.block if (p := windowdraw.first_post(c.window_posts(rid, 0), w, ts[0].sender, 0, c.sender)) else None),
        c.block_hash, c.block_number, depth=1)
    agg_block = posts[0].block
    if head < agg_block + 2:  # the seed block (the one after the post) must be covered by one more
        run.net.advance(1)
        run.net.advance(1)
    assert src.seed(3) == windowdraw.window_seed(c.block_hash(agg_block + 1), dom, 3)
    assert src.seed(4) is None  # nothing posted for window 4


def test_windows_are_posted_for_the_epoch_in_training_and_refused_once_it_is_over(run: Run) -> None:
    rid, t = run.run_id, run.trainers[0]
    t.chain.post_own_window(rid, 0, 0, keccak(b"e0"))  # before anything opened: epoch 0 trains
    with pytest.raises(ce.WindowClosed):
        t.chain.post_own_window(rid, 1, 0, keccak(b"e1"))  # nobody trains epoch 1 yet
    run.open_epoch(0)  # committed, revealed, audited: epoch 1 trains now
    t.chain.post_own_window(rid, 1, 0, keccak(b"e1"))
    t.chain.post_own_window(rid, 0, 1, keccak(b"late"))  # the newest opened epoch still takes a late window
    for x in run.trainers:
        x.commit(1)  # epoch 1 opens: epoch 0 is over for windows
    with pytest.raises(ce.WindowClosed):
        t.chain.post_own_window(rid, 0, 2, keccak(b"too late"))
    assert [p.root for p in run.coord.window_posts(rid, 1)] == [keccak(b"e1")]
