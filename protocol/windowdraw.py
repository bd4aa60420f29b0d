"""Per-window challenge draws and the randomness behind them (issue 48).

A window's seed comes from the block *after* the one that holds its post: when the post is signed,
that hash does not exist, so neither the trainer nor the relay can pick which steps get drawn by
choosing what to post (a block producer can still grind its own block: the same trust the epoch's
audit seed already places in chain ordering, docs/security.md). Each transition of the window is
drawn on its own at the run's per-step rate (`protocol.chain.audit.rate_draw`, keyed by the step), so
draws are independent across steps and windows, and a step's chance is the same at every H and W.

The seed is only used once it is `depth` blocks deep (a reorg before that changes it; the trainer
keeps the window until then). `RandomnessSource` is the one interface the trainer and verifiers read:
a beacon with witness receipts can replace chain ordering on a chain whose finality is slow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from eth_utils import to_checksum_address

from protocol import relay, windows
from protocol.chain.audit import rate_draw
from protocol.digest import keccak
from protocol.errors import VerilocoError
from protocol.relay import Domain, window_digest
from protocol.types import Digest

WINDOW_SEED_TAG = keccak(b"veriloco.window.seed.v1")


def window_seed(block_hash: bytes, domain: Domain, window: int) -> Digest:
    """keccak(abi.encode(WINDOW_SEED_TAG, chainId, contract, runId, epoch, window, blockhash))."""
    return window_digest(WINDOW_SEED_TAG, domain, window, block_hash)


def window_challenges(seed: bytes, trainer: str, rate: int, W: int, window: int, leaf_count: int) -> list[int]:
    """Transitions k -> k + 1 of `window` drawn for `trainer`, ascending: each on its own at rate / 10^6."""
    return [k for k in windows.transitions(window, windows.width(W, leaf_count), leaf_count)
            if rate_draw(seed, trainer, k) < rate]


@dataclass(frozen=True)
class WindowPost:
    """One window post: a relay's aggregate (poster the coordinator, with a bitmap and its evidence's CID)
    or a trainer's own root (poster the trainer, bitmap 0, no evidence)."""

    window: int
    poster: str
    root: bytes
    bitmap: int
    block: int
    log_index: int
    evidence: str = ""


def first_post(posts: Sequence[WindowPost], window: int, trainer: str, position: int, relay: str,
               holds: Callable[[WindowPost], bytes | None]) -> tuple[WindowPost, bytes] | None:
    """The post that fixes `trainer`'s root of `window`, and that root: the first in chain order that is
    either the relay's aggregate whose evidence holds the trainer's signed root (`holds` returns it, or
    None: `protocol.relay.read_evidence`) or the trainer's own. Later ones never count: posting again
    (directly, after seeing a seed) cannot re-roll the draw, and a different root later is equivocation."""
    for p in sorted(posts, key=lambda p: (p.block, p.log_index)):
        if p.window != window:
            continue
        if p.poster == trainer and not p.bitmap:
            return p, p.root
        if p.poster == relay and p.bitmap >> position & 1 and (root := holds(p)) is not None:
            return p, root
    return None


def evidence_root(post: WindowPost, read: Callable[[str], bytes], domain: Domain, trainer: str, position: int,
                  refused: Callable[[VerilocoError], None] | None = None) -> bytes | None:
    """The root of `trainer`'s that an aggregate's evidence binds (`first_post`'s `holds`), or None: the
    evidence is missing, does not rebuild the posted root and bitmap, or has no signature of the trainer
    at its position (its slot). `read(cid)` fetches the evidence; `refused` hears why it was not taken."""
    try:
        bound = relay.read_evidence(read(post.evidence), domain, post.window, post.root, post.bitmap)
    except VerilocoError as exc:
        if refused is not None:
            refused(exc)
        return None
    m = bound.get(position)
    return bytes(m.root) if m is not None and m.trainer == to_checksum_address(trainer) else None


class RandomnessSource(Protocol):
    """Where a window's seed comes from. None until it is safe to act on (never a guess)."""

    def seed(self, window: int) -> Digest | None: ...


@dataclass(frozen=True)
class ChainOrdering:
    """The seed of a window is the hash of the block after its post, once `depth` blocks cover it.

    Edges injected: `posted_block(w)` (the block holding window w's aggregate or direct post, None
    while there is none), `block_hash(n)` and `head()`."""

    domain: Domain
    posted_block: Callable[[int], int | None]
    block_hash: Callable[[int], bytes | None]
    head: Callable[[], int]
    depth: int = 2

    def seed(self, window: int) -> Digest | None:
        posted = self.posted_block(window)
        if posted is None:
            return None
        seed_block = posted + 1
        if self.head() < seed_block + self.depth:
            return None
        h = self.block_hash(seed_block)
        return None if h is None else window_seed(h, self.domain, window)
