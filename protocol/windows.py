"""Windows of a trace: W aligned leaves whose root is a node of the trace tree (issue 48).

A trainer commits each window's root while it trains the next, so challenges can be drawn per window
from randomness that did not exist when the window was committed; it then keeps only what the
pending windows need (`Retention`) instead of an epoch of states. A window's root is an inner node of
the same tree `protocol.merkle` builds, so the epoch's trace root is recomputed from the posted window
roots (`root_from_windows`) and a leaf proof is a proof inside its window followed by the window's
proof in the trace: nothing about the existing audit proofs changes.

Window w holds leaves [w·W, (w + 1)·W) of the padded tree. The transition k -> k + 1 belongs to the
window of its *result*, leaf k + 1 (`transition_window`): its start leaf was committed in the same or
an earlier window, so every leaf a drawn transition opens was fixed before the draw. (Drawing it with
the window of leaf k would let a trainer learn whether a window's last transition is drawn before it
commits that transition's result, and skip it whenever it is not.) Pure: no chain, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from protocol import merkle
from protocol.types import Digest


class WindowError(ValueError):
    """A window width, index or root set that does not fit the trace."""


def check_width(W: int) -> int:
    """W must be a power of two (so a window is a subtree); returned unchanged."""
    if W < 1 or W & (W - 1):
        raise WindowError(f"a window width must be a power of two >= 1, got {W}")
    return W


def padded(leaf_count: int) -> int:
    """The leaves of the trace tree with its zero padding (a power of two)."""
    return 1 << merkle.proof_length(leaf_count)


def width(W: int, leaf_count: int) -> int:
    """The width in force for a trace: W, or the whole padded tree when W is larger (one window)."""
    return min(check_width(W), padded(leaf_count))


def window_count(leaf_count: int, W: int) -> int:
    """Windows holding at least one real leaf: the ones a trainer posts."""
    return -(-leaf_count // width(W, leaf_count))


def window_of(k: int, W: int) -> int:
    """The window of leaf k."""
    if k < 0:
        raise WindowError(f"leaf {k} is negative")
    return k // check_width(W)


def transition_window(k: int, W: int) -> int:
    """The window whose draw covers the transition k -> k + 1: the window of its result, leaf k + 1."""
    return window_of(k + 1, W)


def transitions(w: int, W: int, leaf_count: int) -> range:
    """The transitions k -> k + 1 drawn with window w: those whose result k + 1 is one of its leaves."""
    return range(max(0, w * W - 1), min((w + 1) * W, leaf_count) - 1)


def _zero(level: int) -> Digest:
    """The root of an all-padding subtree 2**level leaves wide (padding leaves are EMPTY, not hashed)."""
    h = merkle.EMPTY
    for _ in range(level):
        h = merkle.node_hash(h, h)
    return h


def _fold(nodes: list[Digest]) -> Digest:
    while len(nodes) > 1:
        nodes = [merkle.node_hash(nodes[i], nodes[i + 1]) for i in range(0, len(nodes), 2)]
    return nodes[0]


def window_root(digests: Sequence[bytes], w: int, W: int, leaf_count: int | None = None) -> Digest:
    """The root of window w over the trace digests d_0..d_H (leaves past the trace are padding).
    `leaf_count`: the whole trace's, where `digests` is the part trained so far (it must hold window w)."""
    n = len(digests) if leaf_count is None else leaf_count
    W = width(W, n)
    if not 0 <= w < window_count(n, W):
        raise WindowError(f"window {w} outside 0..{window_count(n, W) - 1} of a {n}-leaf trace at W = {W}")
    if len(digests) < min((w + 1) * W, n):
        raise WindowError(f"window {w} needs leaves up to {min((w + 1) * W, n) - 1}, {len(digests)} are trained")
    nodes = [merkle.leaf_hash(d) for d in digests[w * W:min((w + 1) * W, n)]]
    return _fold(nodes + [merkle.EMPTY] * (W - len(nodes)))


def window_roots(digests: Sequence[bytes], W: int) -> list[Digest]:
    return [window_root(digests, w, W) for w in range(window_count(len(digests), W))]


def _upper(roots: Sequence[bytes], leaf_count: int, W: int) -> list[Digest]:
    W = width(W, leaf_count)
    if len(roots) != window_count(leaf_count, W) or any(len(r) != 32 for r in roots):
        raise WindowError(f"a {leaf_count}-leaf trace at W = {W} has {window_count(leaf_count, W)} window roots "
                          f"of 32 bytes, got {len(roots)}")
    zero = _zero(W.bit_length() - 1)
    return [Digest(bytes(r)) for r in roots] + [zero] * (padded(leaf_count) // W - len(roots))


def root_from_windows(roots: Sequence[bytes], leaf_count: int, W: int) -> Digest:
    """The trace root a reveal must name, rebuilt from the window roots the trainer posted."""
    return _fold(_upper(roots, leaf_count, W))


def window_proof(roots: Sequence[bytes], leaf_count: int, W: int, w: int) -> list[Digest]:
    """Sibling hashes from window w's root up to the trace root."""
    level = _upper(roots, leaf_count, W)
    if not 0 <= w < len(roots):
        raise WindowError(f"window {w} outside 0..{len(roots) - 1}")
    proof = []
    while len(level) > 1:
        proof.append(level[w ^ 1])
        level = [merkle.node_hash(level[i], level[i + 1]) for i in range(0, len(level), 2)]
        w >>= 1
    return proof


def split_proof(proof: Sequence[bytes], leaf_count: int, W: int) -> tuple[list[bytes], list[bytes]]:
    """A leaf's `merkle.prove` path as (its path inside its window, the window's path in the trace)."""
    lo = width(W, leaf_count).bit_length() - 1
    return list(proof[:lo]), list(proof[lo:])


def verify_in_window(window_root_: bytes, digest: bytes, k: int, W: int, leaf_count: int, proof: Sequence[bytes]) -> bool:
    """True when `digest` is leaf k of the window whose root is given (the lower part of a leaf proof)."""
    W = width(W, leaf_count)
    if not 0 <= k < leaf_count or len(proof) != W.bit_length() - 1 or any(len(x) != 32 for x in proof):
        return False
    h, i = merkle.leaf_hash(digest), k % W
    for sib in proof:
        h = merkle.node_hash(sib, h) if i & 1 else merkle.node_hash(h, sib)
        i >>= 1
    return h == window_root_


def width_rule(H: int, trainers: int, post_gas: int, gas_per_trainer_epoch: int, cap: int = 0) -> int:
    """The run's W: the narrowest power-of-two window whose posts (one aggregated post of ``post_gas``
    per window of the H + 1 leaves, shared by ``trainers``) cost each trainer at most
    ``gas_per_trainer_epoch`` an epoch; the whole trace (one window) when none does; at most ``cap``
    when given. Narrower windows keep fewer states; wider ones cost less gas."""
    if H < 1 or trainers < 1 or post_gas < 0 or gas_per_trainer_epoch < 1:
        raise WindowError(f"width_rule needs H, trainers and an allowance >= 1 (got H={H}, trainers={trainers}, "
                          f"allowance={gas_per_trainer_epoch})")
    W, top = 1, padded(H + 1)
    while W < top and window_count(H + 1, W) * post_gas > trainers * gas_per_trainer_epoch:
        W <<= 1
    return min(W, check_width(cap)) if cap else W


@dataclass
class Retention:
    """What a trainer keeps to answer per-window challenges: one checkpoint at the start of its oldest
    pending window and the answer log since then. A window is pending from its first step until its
    seed is safe and its drawn steps are answered; then it is dropped and the checkpoint rolls forward.
    With no seed (chain or relay stalled) windows simply stay pending: the trainer keeps what today's
    post-hoc draw needs, never less, so a stall costs disk, never an answer.

    Steps count from the epoch's start; `trained(k)` says leaf k (the state after k steps) exists."""

    W: int
    leaf_count: int
    steps: int = 0  # leaves past d_0 produced so far
    resolved: set[int] = field(default_factory=set)  # windows answered and dropped

    def __post_init__(self) -> None:
        self.W = width(self.W, self.leaf_count)

    def trained(self, k: int) -> None:
        if k != self.steps + 1 or k >= self.leaf_count:
            raise WindowError(f"step {k} out of order (last {self.steps}, trace of {self.leaf_count} leaves)")
        self.steps = k

    def complete(self, w: int) -> bool:
        """Whether every leaf of window w exists (its root can be posted)."""
        return min((w + 1) * self.W, self.leaf_count) - 1 <= self.steps

    def resolve(self, w: int) -> None:
        """Window w's drawn steps are answered: drop it (only once complete, never out of order of need)."""
        if not self.complete(w):
            raise WindowError(f"window {w} is not complete (trained to leaf {self.steps})")
        self.resolved.add(w)

    def checkpoint(self, segment: int = 1) -> int:
        """The leaf whose state must be kept: where the oldest unresolved window's first transition
        starts (the leaf before the window), or its segment, whose challenge replays from the segment's
        first leaf. A transition drawn later is rebuilt from there by the log."""
        w = 0
        while w in self.resolved:
            w += 1
        k = max(0, w * self.W - 1)
        return min(k - k % segment, self.steps)

    def logged_steps(self) -> int:
        """Steps of the answer log kept: from the checkpoint to the newest state."""
        return self.steps - self.checkpoint()


def peak_log_steps(H: int, W: int, lag_steps: int) -> int:
    """The most steps a windowed trainer logs at once when each window's seed is safe ``lag_steps``
    after the window's last leaf: from the leaf before the window (where its first transition starts)
    through the window and the steps trained meanwhile, W + lag, an epoch at most."""
    if lag_steps < 0:
        raise WindowError(f"a seed lag is >= 0 steps, got {lag_steps}")
    return min(H, width(W, H + 1) + lag_steps)
