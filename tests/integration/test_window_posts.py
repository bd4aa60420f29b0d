"""Window posts on the real contract (issue 48, docs/protocol.md §5.4): who may post, for which epochs, and
which post fixes a trainer's root and seed. py-evm only: the function emits, it has no state to diverge."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import relay, windowdraw
from protocol.chain import errors as ce
from protocol.digest import keccak
from protocol.store.backends import LocalStore
from public import relaynet
from tests.fixtures.chain import PyEvmNet, Run
from tests.fixtures.chain import make_run as fixture_run
from trainer.windowpost import WindowRootConflict, WindowSender

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
    c.post_window(rid, 0, 0, keccak(b"agg0"), 0b101, 3, "bafyevidence")
    t1.post_own_window(rid, 0, 0, keccak(b"own"))
    posts = c.window_posts(rid, 0)
    assert [(p.poster, p.bitmap, p.evidence) for p in posts] == [(c.sender, 0b101, "bafyevidence"), (t1.sender, 0, "")]
    with pytest.raises(ce.NotCoordinator):
        t0.post_window(rid, 0, 1, keccak(b"x"), 1, 3, "bafyevidence")
    with pytest.raises(ce.NotTrainer):
        run.verifiers[0].post_own_window(rid, 0, 1, keccak(b"x"))
    with pytest.raises(ce.WindowClosed):
        t0.post_own_window(rid, 2, 0, keccak(b"x"))  # not the next epoch: nothing trains it yet
    with pytest.raises(ce.WindowClosed):
        t0.post_own_window(rid, 0, 4096, keccak(b"x"))


def key(i: int) -> bytes:
    return (i + 1).to_bytes(32, "big")  # eth-tester's account i


def test_the_first_post_fixes_a_trainers_root_and_a_later_one_cannot_re_roll_its_seed(run: Run, tmp_path: Path) -> None:
    rid, c = run.run_id, run.coord
    ts = [t.chain for t in run.trainers]
    dom = relay.Domain(c.chain_id, c.address, rid, 0)
    positions = [t.sender for t in ts]
    book = relay.WindowBook(dom, positions, clock=lambda: 0.0)
    for i in (0, 1):  # trainers 0 and 1 in the aggregate, 2 left out
        book.accept(relay.sign_root(key(i + 1), dom, 3, keccak(b"root%d" % i)), 8)
    agg, store = book.aggregate(3), LocalStore(tmp_path / "store")
    c.post_window(rid, 0, 3, agg.root, agg.bitmap, 3, store.put(book.evidence(3)))
    ts[2].post_own_window(rid, 0, 3, keccak(b"own2"))
    ts[0].post_own_window(rid, 0, 3, keccak(b"again0"))  # after the aggregate: a re-roll attempt, ignored
    posts = c.window_posts(rid, 0)

    def holds(who: str) -> Any:
        return lambda p: windowdraw.evidence_root(p, store.get, dom, who, positions.index(who))

    for i, t in enumerate(ts):
        first = windowdraw.first_post(posts, 3, t.sender, i, c.sender, holds(t.sender))
        assert first is not None
        assert first[0].poster == (t.sender if i == 2 else c.sender)
        assert first[1] == (keccak(b"own2") if i == 2 else keccak(b"root%d" % i))
    head = c.block_number()
    src = windowdraw.ChainOrdering(
        dom, lambda w: (f[0].block if (f := windowdraw.first_post(c.window_posts(rid, 0), w, ts[0].sender, 0, c.sender,
                                                                   holds(ts[0].sender))) else None),
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


class Relayed:
    """The relay as the coordinator would run it: HTTP on loopback, posting on the chain, evidence in the store."""

    def __init__(self, run: Run, store: LocalStore, wait_s: float = 0.0, **over: Any) -> None:
        c = run.coord
        self.dom = relay.Domain(c.chain_id, c.address, run.run_id, 0)
        self.positions = [t.chain.sender for t in run.trainers]
        self.relay = relaynet.Relay(lambda d: relaynet.EpochFacts(self.positions, 17) if d == self.dom else None)
        self.poster = relaynet.RelayPoster(self.relay, c, store, wait_s=wait_s)
        self.server = relaynet.start(self.relay)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def sender(self, run: Run, i: int, store: LocalStore, url: str | None = "", wait_s: float = 0.0) -> WindowSender:
        client = None if url is None else relaynet.RelayClient(url or self.url, timeout_s=5)
        return WindowSender(run.trainers[i].chain, key(i + 1), self.dom, i, run.coord.sender, store, client,
                            wait_s=wait_s)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def relayed(run: Run, tmp_path: Path) -> Iterator[tuple[Relayed, LocalStore]]:
    store = LocalStore(tmp_path / "store")
    r = Relayed(run, store)
    try:
        yield r, store
    finally:
        r.close()


def test_roots_travel_through_the_relay_and_a_left_out_trainer_posts_its_own(run: Run, relayed: Any) -> None:
    r, store = relayed
    senders = [r.sender(run, i, store) for i in range(3)]
    for i in (0, 1):
        senders[i].send(0, keccak(b"w0-%d" % i))
    assert r.poster.poll() == [(r.dom, 0)]  # the relay waits no longer (wait 0): trainer 2 is left out
    senders[2].send(0, keccak(b"w0-2"))  # late: the relay keeps it, never posts the window again
    assert r.poster.poll() == []
    fixed = [s.settle() for s in senders]
    assert fixed[0][0].poster == fixed[1][0].poster == run.coord.sender
    assert 0 not in fixed[2] and 0 in senders[2].own_posted  # its own post, at once (wait_s 0)
    assert senders[2].settle()[0].poster == senders[2].me
    assert all(0 not in s.own_posted for s in senders[:2])


def test_an_offline_relay_or_one_that_forges_a_leaf_binds_nobody_and_the_trainer_posts_itself(run: Run, relayed: Any) -> None:
    r, store = relayed
    offline = r.sender(run, 0, store, url="http://127.0.0.1:9")
    offline.send(1, keccak(b"w1-0"))
    assert 1 in offline.own_posted and offline.settle()[1].poster == offline.me
    # a relay that sets trainer 1's bit with a root it never signed: the evidence does not bind it
    forged = relay.WindowBook(r.dom, r.positions, clock=lambda: 0.0)
    forged.accept(relay.sign_root(key(3), r.dom, 2, keccak(b"w2-2")), 17)
    forged.roots[(2, r.positions[1])] = relay.SignedRoot(r.dom, 2, keccak(b"not mine"), bytes(65), r.positions[1])
    agg = forged.aggregate(2)
    run.coord.post_window(run.run_id, 0, 2, agg.root, agg.bitmap, 3, store.put(forged.evidence(2)))
    victim = r.sender(run, 1, store, url=None)  # no relay of its own: posts directly at once
    victim.sent[2] = (keccak(b"w2-1"), 0.0)
    assert victim.settle() == {} and 2 in victim.own_posted  # the forged leaf bound nothing
    assert victim.settle()[2].poster == victim.me


def test_a_verifier_derives_each_windows_post_its_draws_and_a_trace_changed_after_posting(run: Run, relayed: Any) -> None:
    from protocol import merkle, windows
    from protocol.chain.audit import RATE_ONE
    from public.windowaudit import audit_windows

    r, store = relayed
    W, n = 8, 33
    digests = [keccak(b"leaf%d" % i) for i in range(n)]
    roots = windows.window_roots(digests, W)
    s = r.sender(run, 0, store)
    for w in range(4):  # window 4 (the last leaf) is never posted: drawn after the epoch
        s.send(w, roots[w])
    r.poster.poll()
    assert set(s.settle()) == {0, 1, 2, 3}
    for _ in range(3):
        run.net.advance(1)
    c = run.coord

    def audit(claimed: list[bytes], trace_root: bytes, before: tuple[int, int] | None = None) -> Any:
        return audit_windows(posts=c.window_posts(run.run_id, 0), evidence=store.get, domain=r.dom,
                             position=0, relay_address=c.sender, trainer=s.me, claimed=claimed,
                             trace_root=trace_root, leaf_count=n, W=W, rate=RATE_ONE // 2,
                             audit_seed=keccak(b"audit seed"), block_hash=c.block_hash, head=c.block_number(), depth=1,
                             before=before)

    honest = audit(roots, merkle.root(digests))
    assert honest.findings == [] and sorted(honest.fixed) == [0, 1, 2, 3] and honest.post_hoc == [4]
    assert honest.pending == [] and set(honest.drawn) <= set(range(n - 1)) and honest.drawn
    assert honest.drawn == audit(roots, merkle.root(digests)).drawn  # every verifier draws the same
    changed = list(digests)
    changed[9] = keccak(b"after posting")  # window 1 changed after its root was posted
    moved = windows.window_roots(changed, W)
    assert "window 1's posted root" in audit(moved, merkle.root(changed)).findings[0]
    assert "do not rebuild" in audit(roots, merkle.root(changed)).findings[0]
    assert honest.seeds[4] == keccak(b"audit seed") and honest.seed_of(n - 2, W) == honest.seeds[4]
    # re-roll by posting late: the trainer saw the audit seed's draw of window 4 and posts it itself;
    # the post came after its reveal (here: the cut-off), so window 4 is still drawn from the audit seed
    cut = (c.block_number() + 1, 0)
    run.trainers[0].chain.post_own_window(run.run_id, 0, 4, roots[4])
    for _ in range(2):
        run.net.advance(1)
    assert audit(roots, merkle.root(digests)).post_hoc == []  # without the cut-off the late post would count
    late = audit(roots, merkle.root(digests), before=cut)
    assert late.post_hoc == [4] and late.drawn == honest.drawn


def test_a_reorg_before_the_seed_is_deep_enough_changes_nothing_a_trainer_acted_on(run: Run) -> None:
    """A revert of the chain (eth-tester's snapshot, as a reorg would) drops a post whose seed block was
    only one deep: the seed was never returned, so nothing was built on it; the post re-included later
    draws from its new block."""
    rid, c, t = run.run_id, run.coord, run.trainers[0].chain
    dom = relay.Domain(c.chain_id, c.address, rid, 0)

    def posted(w: int) -> int | None:
        got = windowdraw.first_post(c.window_posts(rid, 0), w, t.sender, 0, c.sender, lambda p: None)
        return got[0].block if got else None

    src = windowdraw.ChainOrdering(dom, posted, c.block_hash, c.block_number, depth=2)
    snap = run.net.snapshot()
    t.post_own_window(rid, 0, 5, keccak(b"w5"))
    run.net.advance(1)  # the seed block exists, one deep
    early = windowdraw.window_seed(c.block_hash(posted(5) + 1), dom, 5)  # what a hasty reader would use
    assert src.seed(5) is None
    run.net.revert(snap)  # the reorg: the post and its seed block are gone
    assert posted(5) is None and src.seed(5) is None
    run.net.advance(7)  # other blocks take those heights
    t.post_own_window(rid, 0, 5, keccak(b"w5"))
    for _ in range(3):
        run.net.advance(1)
    seed = src.seed(5)
    assert seed is not None and seed != early


def test_a_restarted_trainer_resumes_its_windows_from_the_chain_without_posting_twice(run: Run, relayed: Any) -> None:
    r, store = relayed
    roots = {w: keccak(b"restart%d" % w) for w in range(3)}
    before = r.sender(run, 0, store, url=None)  # no relay: every root its own post
    for w in (0, 1):
        before.send(w, roots[w])
    posts = len(run.coord.window_posts(run.run_id, 0))
    after = r.sender(run, 0, store, url=None)  # the restart: a fresh sender, nothing kept
    after.resume(roots)
    assert sorted(after.fixed) == [0, 1] and len(run.coord.window_posts(run.run_id, 0)) == posts + 1  # only window 2
    assert sorted(after.settle()) == [0, 1, 2]
    forged = r.sender(run, 0, store, url=None)
    with pytest.raises(WindowRootConflict, match="does not make"):
        forged.resume({0: keccak(b"another trace")})


def test_a_relay_offline_for_several_windows_costs_own_posts_until_it_returns(run: Run, relayed: Any) -> None:
    r, store = relayed
    s = r.sender(run, 0, store)
    port = r.server.server_address[1]
    r.close()  # the relay goes down for windows 0-2
    for w in range(3):
        s.send(w, keccak(b"down%d" % w))
    assert s.own_posted == {0, 1, 2}
    r.server = relaynet.start(r.relay, port)  # back on its port: window 3 travels through it again
    s.send(3, keccak(b"up3"))
    r.poster.poll()
    fixed = s.settle()
    assert sorted(fixed) == [0, 1, 2, 3] and 3 not in s.own_posted and fixed[3].poster == run.coord.sender


def test_a_trainer_that_began_an_epochs_windows_and_never_committed_it_is_slashed_once(run: Run) -> None:
    """Item 25 of docs/security.md §20: a window's draws are known once it is posted, so a trainer could
    forge, see a forged step drawn and walk away. Its signed root (a relay's evidence) or its own post
    binds it to commit; a report once commits closed slashes it (burned), once, and nobody else."""
    from tests.fixtures.chain import STAKE, assert_books

    rid, c, ts = run.run_id, run.coord, run.trainers
    dom = relay.Domain(c.chain_id, c.address, rid, 0)
    signed = relay.sign_root(key(1), dom, 2, keccak(b"forged"))  # trainer 0's root of window 2, in evidence
    for t in ts[1:]:
        t.commit(0)  # trainers 1 and 2 commit; trainer 0 walks away
    with pytest.raises(ce.WrongPhase):  # commits still open: it may yet commit
        c.report_abandoned(rid, 0, ts[0].address, 2, signed.root, signed.signature)
    run.net.advance(101)
    stranger = run.verifiers[0]
    with pytest.raises(ce.NotSignedBy):  # another trainer's signature does not bind trainer 0
        other = relay.sign_root(key(2), dom, 2, keccak(b"forged"))
        stranger.report_abandoned(rid, 0, ts[0].address, 2, other.root, other.signature)
    with pytest.raises(ce.NotSignedBy):  # nor does its signature over another epoch's domain
        old = relay.sign_root(key(1), relay.Domain(c.chain_id, c.address, rid, 1), 2, keccak(b"forged"))
        stranger.report_abandoned(rid, 0, ts[0].address, 2, old.root, old.signature)
    with pytest.raises(ce.NotAbandoned):  # trainer 1 committed what it signed
        s1 = relay.sign_root(key(2), dom, 0, keccak(b"honest"))
        stranger.report_abandoned(rid, 0, ts[1].address, 0, s1.root, s1.signature)
    burned, stake = c.total_burned(), c.member(rid, ts[0].address).stake
    stranger.report_abandoned(rid, 0, ts[0].address, 2, signed.root, signed.signature)
    slashed = [e for e in c.events(["Slashed"], run_id=rid, epoch=0)]
    assert [(e.args["trainer"], e.args["reason"]) for e in slashed] == [(ts[0].address, 6)]
    assert c.member(rid, ts[0].address).stake == stake // 2 and c.total_burned() == burned + stake // 2
    assert c.member(rid, ts[0].address).leave_epoch == 1 and stake == STAKE
    with pytest.raises(ce.NotAbandoned):  # once per epoch
        stranger.report_abandoned(rid, 0, ts[0].address, 2, signed.root, signed.signature)
    assert_books(c)


def test_an_own_window_post_binds_without_a_signature_and_leaving_does_not_unbind(run: Run) -> None:
    rid, c, ts = run.run_id, run.coord, run.trainers
    run.open_epoch(0)
    run.judge_all(0)
    run.finalize(0, ts)  # epoch 1 trains
    ts[0].chain.post_own_window(rid, 1, 0, keccak(b"own"))  # it knows window 0's draws from here
    dom = relay.Domain(c.chain_id, c.address, rid, 1)
    signed = relay.sign_root(key(2), dom, 1, keccak(b"relayed"))
    ts[1].chain.leave(rid)  # trainer 1 signed epoch 1's window, then left before committing it
    ts[2].commit(1)
    run.net.advance(101)
    with pytest.raises(ce.NotAbandoned):  # trainer 2 committed what it signed
        s2 = relay.sign_root(key(3), dom, 0, keccak(b"honest"))
        c.report_abandoned(rid, 1, ts[2].address, 0, s2.root, s2.signature)
    with pytest.raises(ce.NotSignedBy):  # no own post of trainer 1, and no signature
        c.report_abandoned(rid, 1, ts[1].address)
    c.report_abandoned(rid, 1, ts[0].address)  # its own post is the promise
    c.report_abandoned(rid, 1, ts[1].address, 1, signed.root, signed.signature)
    assert {(e.args["trainer"], e.args["reason"]) for e in c.events(["Slashed"], run_id=rid, epoch=1)} == {
        (ts[0].address, 6), (ts[1].address, 6)}
