"""Windows of a trace, the relay's signed roots and aggregates, per-window draws (issue 48)."""

from __future__ import annotations

import json

import pytest
from eth_account import Account

from protocol import merkle, relay, windowdraw, windows
from protocol.chain.audit import RATE_ONE, pair_proof, verify_pair
from protocol.digest import keccak

KEYS = [keccak(bytes([i + 1])) for i in range(4)]
TRAINERS = [Account.from_key(k).address for k in KEYS]
DOMAIN = relay.Domain(1337, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0", 1, 3)


def trace(n: int, salt: bytes = b"") -> list[bytes]:
    return [keccak(salt + i.to_bytes(4, "big")) for i in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 9, 17, 33, 257])
@pytest.mark.parametrize("W", [1, 2, 4, 16, 64, 1024])
def test_window_roots_rebuild_the_trace_root_and_split_every_proof(n: int, W: int) -> None:
    d = trace(n)
    roots = windows.window_roots(d, W)
    assert windows.root_from_windows(roots, n, W) == merkle.root(d)
    for k in {0, n // 2, n - 1}:
        lo, hi = windows.split_proof(merkle.prove(d, k), n, W)
        w = windows.window_of(k, windows.width(W, n))
        assert windows.verify_in_window(roots[w], d[k], k, W, n, lo)
        assert hi == windows.window_proof(roots, n, W, w)
        assert not windows.verify_in_window(roots[w], keccak(b"other"), k, W, n, lo)


def test_a_trace_that_differs_from_its_posted_windows_is_seen_even_across_a_boundary() -> None:
    n, W = 33, 8
    d = trace(n)
    posted = windows.window_roots(d, W)
    for k in (7, 8, 32):  # the last leaf of a window, the first of the next, the trace's last
        forged = list(d)
        forged[k] = keccak(b"forged")
        assert windows.root_from_windows(posted, n, W) != merkle.root(forged)
    with pytest.raises(windows.WindowError, match="window roots"):
        windows.root_from_windows(posted[:-1], n, W)


@pytest.mark.parametrize("n,W", [(9, 4), (257, 16), (5, 1), (9, 64)])
def test_each_transition_is_drawn_with_the_window_of_its_result_so_its_leaves_were_posted_first(n: int, W: int) -> None:
    """The defence against skipping a window's last step whenever the window's draw spares it: a drawn
    transition opens only leaves of its window and earlier ones."""
    W = windows.width(W, n)
    seen: list[int] = []
    for w in range(windows.window_count(n, W)):
        for k in windows.transitions(w, W, n):
            assert windows.transition_window(k, W) == w
            assert windows.window_of(k, W) <= w and windows.window_of(k + 1, W) == w
            seen.append(k)
    assert seen == list(range(n - 1))


def test_widths_are_powers_of_two_and_the_rule_prices_gas_per_trainer() -> None:
    for bad in (0, 3, 12, -4):
        with pytest.raises(windows.WindowError, match="power of two"):
            windows.check_width(bad)
    assert windows.width_rule(256, 64, 35_000, 10_000) == 16
    assert windows.width_rule(256, 1024, 35_000, 2_500) == 4
    assert windows.window_count(257, windows.width_rule(256, 4, 35_000, 10_000)) == 1  # few trainers: one window
    assert windows.width_rule(8, 4, 35_000, 150_000) == 1
    assert windows.width_rule(256, 64, 35_000, 10_000, cap=8) == 8
    assert windows.width_rule(500, 64, 35_000, 10) == 512


@pytest.mark.parametrize("H,W,lag", [(256, 16, 0), (256, 16, 5), (256, 4, 20), (64, 64, 3), (8, 1, 2)])
def test_retention_keeps_one_checkpoint_and_a_bounded_log_and_a_stall_keeps_everything(H: int, W: int, lag: int) -> None:
    r = windows.Retention(W, H + 1)
    done_at: dict[int, int] = {}  # window -> step at which its seed is safe
    peak = 0
    for k in range(1, H + 1):
        r.trained(k)
        peak = max(peak, r.logged_steps())  # logged before the seeds are read: the momentary peak
        for w in range(windows.window_count(H + 1, W)):
            if r.complete(w) and w not in done_at:
                done_at[w] = k + lag
            if w in done_at and done_at[w] <= k and w not in r.resolved:
                r.resolve(w)
        # every unresolved window's drawn transitions start at or after the kept checkpoint
        for w in range(windows.window_count(H + 1, W)):
            if w not in r.resolved and (t := windows.transitions(w, windows.width(W, H + 1), H + 1)):
                assert t.start >= r.checkpoint()
        peak = max(peak, r.logged_steps())
    assert peak == windows.peak_log_steps(H, W, lag)  # the bound is the peak, not just above it
    stalled = windows.Retention(W, H + 1)
    for k in range(1, H + 1):
        stalled.trained(k)
    assert stalled.checkpoint() == 0 and stalled.logged_steps() == H  # no seed: today's post-hoc budget
    with pytest.raises(windows.WindowError, match="out of order"):
        stalled.trained(H + 1)


def test_a_window_cannot_be_resolved_before_it_is_complete() -> None:
    r = windows.Retention(8, 33)
    for k in range(1, 7):
        r.trained(k)
    with pytest.raises(windows.WindowError, match="not complete"):
        r.resolve(0)
    r.trained(7)
    r.resolve(0)
    assert r.checkpoint() == 7
    # segments of 4 steps: window 1's first transition (7 -> 8) is challenged over the segment 4..8, so
    # the state at leaf 4 stays (what the node drops up to, trainer/node.py _answer_windows)
    assert r.checkpoint(segment=4) == 4 and r.checkpoint(segment=8) == 0


def test_a_signed_root_recovers_its_trainer_and_nothing_else_passes() -> None:
    msg = relay.sign_root(KEYS[0], DOMAIN, 2, keccak(b"root"))
    back = relay.from_wire(msg.to_wire())
    assert back.trainer == TRAINERS[0] and back.root == msg.root and back.domain == DOMAIN
    doc = json.loads(msg.to_wire())
    doc["root"] = "0x" + keccak(b"other").hex()  # a forged root under a real signature recovers a stranger
    assert relay.from_wire(json.dumps(doc).encode()).trainer != TRAINERS[0]
    for raw, what in ((b"x" * (relay.MAX_MESSAGE_BYTES + 1), "at most"), (b"{not json", "JSON"), (b"[1]", "JSON object"),
                      (json.dumps({**doc, "window": -1}).encode(), "window"),
                      (json.dumps({**doc, "signature": "0x00"}).encode(), "signature"),
                      (json.dumps({**doc, "contract": "nope"}).encode(), "contract")):
        with pytest.raises(relay.RelayError, match=what):
            relay.from_wire(raw)


def book(clock: list[float] | None = None) -> relay.WindowBook:
    t = clock if clock is not None else [0.0]
    return relay.WindowBook(DOMAIN, TRAINERS, clock=lambda: t[0])


def test_the_relay_refuses_replays_strangers_and_floods_and_keeps_equivocation_as_evidence() -> None:
    b = book()
    assert b.accept(relay.sign_root(KEYS[1], DOMAIN, 0, keccak(b"a")), 4)
    assert not b.accept(relay.sign_root(KEYS[1], DOMAIN, 0, keccak(b"a")), 4)  # a retry
    with pytest.raises(relay.RelayError, match="two roots"):
        b.accept(relay.sign_root(KEYS[1], DOMAIN, 0, keccak(b"b")), 4)
    assert len(b.equivocations) == 1 and b.roots[(0, TRAINERS[1])].root == keccak(b"a")
    other = relay.Domain(DOMAIN.chain_id, DOMAIN.contract, DOMAIN.run_id, DOMAIN.epoch - 1)
    with pytest.raises(relay.RelayError, match="collects"):  # another epoch's root replayed
        b.accept(relay.sign_root(KEYS[2], other, 0, keccak(b"a")), 4)
    with pytest.raises(relay.RelayError, match="not a trainer"):
        b.accept(relay.sign_root(keccak(b"stranger"), DOMAIN, 0, keccak(b"a")), 4)
    with pytest.raises(relay.RelayError, match="outside"):
        b.accept(relay.sign_root(KEYS[2], DOMAIN, 4, keccak(b"a")), 4)
    t = [0.0]
    flood = book(t)
    for w in range(flood.burst):
        flood.accept(relay.sign_root(KEYS[3], DOMAIN, w, keccak(b"a")), 64)
    with pytest.raises(relay.RelayError, match="faster"):
        flood.accept(relay.sign_root(KEYS[3], DOMAIN, flood.burst, keccak(b"a")), 64)
    t[0] += 2.0
    assert flood.accept(relay.sign_root(KEYS[3], DOMAIN, flood.burst, keccak(b"a")), 64)


def test_an_aggregate_proves_each_included_root_at_its_own_position_only() -> None:
    b = book()
    roots = {i: keccak(bytes([i])) for i in (0, 2, 3)}
    for i, r in roots.items():
        b.accept(relay.sign_root(KEYS[i], DOMAIN, 1, r), 4)
    agg = b.aggregate(1)
    assert agg.bitmap == 0b1101 and not agg.included(1)
    for i, r in roots.items():
        p = agg.proof(i)
        assert relay.verify_inclusion(agg.root, agg.bitmap, 4, i, TRAINERS[i], r, p)
        assert not relay.verify_inclusion(agg.root, agg.bitmap, 4, i, TRAINERS[(i + 1) % 4], r, p)
        assert not relay.verify_inclusion(agg.root, agg.bitmap, 4, i ^ 1, TRAINERS[i], r, p)
    with pytest.raises(relay.RelayError, match="not in window"):
        agg.proof(1)


def test_window_draws_are_per_step_independent_and_follow_the_seed() -> None:
    rate, n, W = 100_000, 257, 16
    hits, total = 0, 0
    for w in range(windows.window_count(n, W)):
        seed = windowdraw.window_seed(keccak(b"block" + bytes([w])), DOMAIN, w)
        got = windowdraw.window_challenges(seed, TRAINERS[0], rate, W, w, n)
        assert set(got) <= set(windows.transitions(w, W, n))
        hits, total = hits + len(got), total + len(windows.transitions(w, W, n))
    assert total == n - 1
    assert abs(hits / total - rate / RATE_ONE) < 0.07  # 256 Bernoulli(0.1): within 3.7 sigma
    a = windowdraw.window_seed(keccak(b"x"), DOMAIN, 0)
    assert a != windowdraw.window_seed(keccak(b"x"), DOMAIN, 1)  # the window is in the seed
    assert a != windowdraw.window_seed(keccak(b"y"), DOMAIN, 0)
    d = trace(n)
    for k in windowdraw.window_challenges(a, TRAINERS[1], RATE_ONE // 2, W, 0, n):
        assert verify_pair(merkle.root(d), d[k], d[k + 1], k, n, pair_proof(d, k))  # today's proofs still answer


def test_chain_ordering_waits_for_depth_uses_the_block_after_the_post_and_a_reorg_moves_it() -> None:
    head = [10]
    posted: dict[int, int] = {}
    hashes = {n: keccak(b"h" + bytes([n])) for n in range(64)}
    src = windowdraw.ChainOrdering(DOMAIN, posted.get, hashes.get, lambda: head[0], depth=2)
    assert src.seed(0) is None  # not posted
    posted[0] = 10
    assert src.seed(0) is None  # the seed block does not exist yet
    head[0] = 12
    assert src.seed(0) is None  # it exists but is one block deep
    head[0] = 13
    before = src.seed(0)
    assert before == windowdraw.window_seed(hashes[11], DOMAIN, 0)
    hashes[11] = keccak(b"reorged")  # a reorg before the trainer acted on it: another seed, which it now uses
    assert src.seed(0) not in (None, before)
    posted[0] = 12  # the post itself re-included later: the seed moves to the block after it
    assert src.seed(0) is None


def test_the_window_gas_benchmark_derives_w_and_each_trainers_share_from_measured_posts() -> None:
    from benchmarks.window_gas import derive, render

    gas = {"relay": {4: [31_000], 64: [31_000], 1024: [33_600], 4096: [44_600]}, "own": [29_900]}
    rows = {(r["K"], r["H"]): r for r in derive(gas)}
    r = rows[(64, 256)]
    assert (r["W"], r["windows"]) == (16, 17) and r["window_gas_per_trainer_per_epoch"] == round(17 * 31_000 / 64)
    assert rows[(1024, 256)]["W"] == 4 and rows[(1024, 256)]["window_gas_per_trainer_per_epoch"] <= 2_500
    md = render({"command": "benchmarks/window_gas.py --out x", "versions": {"anvil": "t"}, "own": [52_400, 32_300],
                 "direct_post_gas": 35_300, "rows": list(rows.values())})
    assert "| 64 | 31,000 | 256 |" in md and "Direct post: 35,300 gas" in md and "first ever 52,400" in md


def test_evidence_binds_only_signed_roots_at_their_positions_and_must_rebuild_the_post() -> None:
    b = book()
    for i in (0, 2):
        b.accept(relay.sign_root(KEYS[i], DOMAIN, 5, keccak(b"e%d" % i)), 8)
    agg, raw = b.aggregate(5), b.evidence(5)
    bound = relay.read_evidence(raw, DOMAIN, 5, agg.root, agg.bitmap)
    assert {i: (m.trainer, m.root) for i, m in bound.items()} == {0: (TRAINERS[0], keccak(b"e0")),
                                                                  2: (TRAINERS[2], keccak(b"e2"))}
    doc = json.loads(raw)
    cases = {
        "bitmap": (raw, agg.root, agg.bitmap | 0b10),  # a bit set for a trainer the evidence does not hold
        "rebuild": (raw, keccak(b"other root"), agg.bitmap),
        "position": (json.dumps({**doc, "messages": [doc["messages"][2], None, doc["messages"][0], None]}).encode(),
                     agg.root, agg.bitmap),  # messages moved to other trainers' positions
        "entry": (json.dumps({**doc, "messages": doc["messages"][:3]}).encode(), agg.root, agg.bitmap),
        "window 5": (json.dumps({**doc, "window": 6}).encode(), agg.root, agg.bitmap),
    }
    for (r, root, bits) in cases.values():
        with pytest.raises(relay.RelayError):
            relay.read_evidence(r, DOMAIN, 5, root, bits)
    other = relay.Domain(DOMAIN.chain_id, DOMAIN.contract, DOMAIN.run_id, DOMAIN.epoch + 1)
    with pytest.raises(relay.RelayError, match="not .* root of window"):
        relay.read_evidence(raw, other, 5, agg.root, agg.bitmap)


def test_a_trainer_is_bound_only_at_its_own_slot_and_needs_no_list_of_the_others() -> None:
    """A relay that moves trainer 0's signed root to trainer 2's slot (and posts the root that rebuilds)
    binds neither of them there: each reader looks at its own slot for its own signature."""
    b = book()
    b.accept(relay.sign_root(KEYS[0], DOMAIN, 5, keccak(b"e0")), 8)
    moved = relay.WindowBook(DOMAIN, ["", "", TRAINERS[0], ""], clock=lambda: 0.0)
    moved.accept(b.roots[(5, TRAINERS[0])], 8)
    agg = moved.aggregate(5)
    post = windowdraw.WindowPost(5, TRAINERS[3], agg.root, agg.bitmap, 1, 0, "cid")
    raw = moved.evidence(5)
    assert windowdraw.evidence_root(post, lambda _c: raw, DOMAIN, TRAINERS[0], 0) is None
    assert windowdraw.evidence_root(post, lambda _c: raw, DOMAIN, TRAINERS[2], 2) is None
    assert windowdraw.evidence_root(post, lambda _c: raw, DOMAIN, TRAINERS[0], 2) == keccak(b"e0")  # its slot were 2
    refused: list[Exception] = []
    assert windowdraw.evidence_root(post, lambda _c: b"{}", DOMAIN, TRAINERS[0], 0, refused.append) is None
    assert refused and "evidence" in str(refused[0])
