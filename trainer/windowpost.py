"""A trainer's window roots onto the chain (issue 48, docs/protocol.md §5.4).

Each window's root goes to the relay, signed; the relay posts one aggregate per window with the
signed roots as evidence. The trainer then reads the chain: the first post that holds its signed root
fixes that root and its seed (`protocol.windowdraw.first_post`). Where the relay is unreachable or
refuses, the trainer posts its root itself at once; where no post holds its root `wait_s` after
sending (the relay left it out, forged its leaf, or withheld its evidence), likewise. Never twice:
one own post per window, so a trainer cannot re-roll its seed even by mistake.

It keeps nothing on disk: a window's root is recomputed from the trace digests the trainer keeps
anyway, and what was posted is on chain, so a restarted trainer `resume`s from the two (a pending
store that could be lost or corrupted does not exist).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from eth_account import Account
from eth_utils import to_checksum_address

from protocol import relay
from protocol.chain.binding import Chain
from protocol.errors import VerilocoError
from protocol.relay import Domain
from protocol.windowdraw import WindowPost, evidence_root, first_post
from public.relaynet import RelayClient, RelayUnavailable

Log = Callable[..., None]


class WindowRootConflict(VerilocoError):
    """A post fixes a root for this trainer that it did not send: another instance with its key."""


class WindowSender:
    """Sends a trainer's window roots and learns which post fixed each. `position` is the trainer's slot
    (its place in every aggregate); `relay_address` the account whose aggregates count (the run's
    coordinator)."""

    def __init__(self, chain: Chain, key: bytes | str | None, domain: Domain, position: int, relay_address: str,
                 store: Any, client: RelayClient | None, *, wait_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic, log: Log | None = None) -> None:
        """`key` None (an account the chain node signs for): no message can be signed, so every window is
        posted directly."""
        self.chain, self.key, self.domain, self.store = chain, key, domain, store
        self.client = client if key is not None else None
        self.me = to_checksum_address(Account.from_key(key).address if key is not None else str(chain.sender))
        self.position = position
        self.relay_address = to_checksum_address(relay_address)
        self.wait_s, self.clock = wait_s, clock
        self.log: Log = log or (lambda event, **kv: None)
        self.sent: dict[int, tuple[bytes, float]] = {}  # window -> (root, when sent)
        self.own_posted: set[int] = set()
        self.fixed: dict[int, WindowPost] = {}

    def send(self, window: int, root: bytes) -> None:
        self.sent[window] = (bytes(root), self.clock())
        if self.client is None or self.key is None:
            self._own(window, "no relay")
            return
        try:
            self.client.send(relay.sign_root(self.key, self.domain, window, root))
        except (RelayUnavailable, relay.RelayError) as exc:
            self._own(window, str(exc))

    def resume(self, roots: dict[int, bytes]) -> None:
        """After a restart: windows a post already holds are fixed without sending; the others are sent
        again (a relay that saw them already answers "not new"; an own post is made only where none is)."""
        posts = self.chain.window_posts(self.domain.run_id, self.domain.epoch)
        for w, root in sorted(roots.items()):
            got = first_post(posts, w, self.me, self.position, self.relay_address, self._holds)
            if got is None:
                if any(p.window == w and p.poster == self.me for p in posts):
                    self.own_posted.add(w)  # posted before the restart but not first: never post again
                self.send(w, root)
                continue
            self.sent[w] = (bytes(root), self.clock())
            self.own_posted.update({w} if got[0].poster == self.me else set())
            if got[1] != bytes(root):
                raise WindowRootConflict(
                    f"window {w} of epoch {self.domain.epoch} is fixed to a root this node's trace does not make: "
                    "another instance runs with this key, or this folder's trace is not the one it posted")
            self.fixed[w] = got[0]

    def _own(self, window: int, why: str) -> None:
        if window in self.own_posted:
            return
        tx = self.chain.post_own_window(self.domain.run_id, self.domain.epoch, window, self.sent[window][0])
        self.own_posted.add(window)
        self.log("window-posted-own", epoch=self.domain.epoch, window=window, gas=tx.gas_used, why=why)

    def _holds(self, post: WindowPost) -> bytes | None:
        """The root of ours that an aggregate's evidence binds, or None (evidence missing or not binding)."""
        return evidence_root(
            post, lambda cid: self.store.get(cid, max_size=relay.MAX_EVIDENCE_BYTES), self.domain, self.me,
            self.position, lambda exc: self.log("window-evidence-refused", epoch=self.domain.epoch, window=post.window,
                                          error=str(exc)))

    def settle(self) -> dict[int, WindowPost]:
        """Read the posts; a window whose root no post holds `wait_s` after sending gets our own post."""
        posts = self.chain.window_posts(self.domain.run_id, self.domain.epoch)
        for w, (sent, at) in sorted(self.sent.items()):
            if w in self.fixed:
                continue
            got = first_post(posts, w, self.me, self.position, self.relay_address, self._holds)
            if got is not None:
                post, root = got
                if root != sent:
                    raise WindowRootConflict(
                        f"window {w} of epoch {self.domain.epoch} is fixed to a root this node did not send: another "
                        "instance runs with this key; stop one of them")
                self.fixed[w] = post
            elif self.clock() - at >= self.wait_s:
                self._own(w, f"no post holds the root {self.wait_s:.0f} s after sending")
        return dict(self.fixed)
