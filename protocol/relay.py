"""Window roots from trainers to one relay, and the relay's one aggregated root per window (issue 48).

A trainer signs `(chain, contract, run, epoch, window, root)` with its key (EIP-191 over a tagged
digest, so any Ethereum client and the contract's `ecrecover` read the same signer). The signer is
*recovered*, never claimed: a message cannot place a root at another trainer's position, and the
domain (chain, contract, run, epoch, window) keeps a root from being replayed into another run,
epoch or window. The relay keeps at most one root per trainer and window: a second, different signed
root is equivocation, kept as evidence (both signatures), never a replacement.

The aggregate is a Merkle tree over the epoch's trainer positions (leaf = keccak(trainer, root),
padding where a trainer sent nothing) with an inclusion bitmap, so one post covers every trainer and
each trainer gets a proof of its own leaf; a trainer's position is its slot in the contract. With each
post the relay publishes the window's *evidence*: every signed message it aggregated, by position. A
leaf counts for a trainer only where the evidence holds that trainer's signature over its root at its
own slot (`read_evidence`): a relay cannot bind a trainer to a
root it never signed, and a trainer whose signed root the relay did aggregate cannot disown it later
(to re-roll its draw by posting another root itself). Pure: the transport and the clock are injected.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from eth_abi import encode
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_keys.exceptions import BadSignature
from eth_utils import to_checksum_address

from protocol import merkle
from protocol.digest import keccak
from protocol.errors import VerilocoError
from protocol.types import Address, Digest

WINDOW_TAG = keccak(b"veriloco.window.v1")
LEAF_TAG = keccak(b"veriloco.window.leaf.v1")
MAX_MESSAGE_BYTES = 1024  # a signed window root is about 400 bytes of JSON: anything larger is refused unread
MAX_TRAINERS = 4096  # positions an aggregate covers (the bitmap is one bit each)
EVIDENCE_FORMAT = "veriloco.window-evidence.v1"
MAX_EVIDENCE_BYTES = MAX_TRAINERS * (MAX_MESSAGE_BYTES + 8) + 4096


class RelayError(VerilocoError):
    """A window-root message or aggregate that is malformed, unsigned, out of its domain or over a bound."""


class RateLimited(RelayError):
    """A trainer sent more than its message budget: retry later."""


class Equivocated(RelayError):
    """A trainer signed a second, different root for a window: kept as evidence, refused."""


@dataclass(frozen=True)
class Domain:
    """Where a window root belongs: a message signed for one domain is worthless in any other."""

    chain_id: int
    contract: str
    run_id: int
    epoch: int


def window_digest(tag: bytes, domain: Domain, window: int, word: bytes) -> Digest:
    """keccak(abi.encode(tag, chainId, contract, runId, epoch, window, word)): a window's hashes, domain first."""
    if len(word) != 32:
        raise RelayError(f"a window's hashed word is 32 bytes, got {len(word)}")
    return keccak(encode(["bytes32", "uint256", "address", "uint256", "uint256", "uint256", "bytes32"],
                         [tag, domain.chain_id, to_checksum_address(domain.contract), domain.run_id, domain.epoch,
                          window, bytes(word)]))


def root_digest(domain: Domain, window: int, root: bytes) -> Digest:
    """What a trainer signs: `window_digest(WINDOW_TAG, domain, window, root)`."""
    return window_digest(WINDOW_TAG, domain, window, root)


def _json_object(raw: bytes, limit: int, what: str) -> dict:
    """One JSON object of at most `limit` bytes (refused unread past it)."""
    if len(raw) > limit:
        raise RelayError(f"{what} is at most {limit} bytes, got {len(raw)}")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RelayError(f"{what} is one JSON object: {exc}") from None
    if not isinstance(doc, dict):
        raise RelayError(f"{what} is one JSON object")
    return doc


@dataclass(frozen=True)
class SignedRoot:
    """One trainer's root of one window, with its signature; `trainer` is recovered from it."""

    domain: Domain
    window: int
    root: Digest
    signature: bytes
    trainer: Address

    def to_wire(self) -> bytes:
        return json.dumps({"chain_id": self.domain.chain_id, "contract": self.domain.contract,
                           "run_id": self.domain.run_id, "epoch": self.domain.epoch, "window": self.window,
                           "root": "0x" + self.root.hex(), "signature": "0x" + self.signature.hex()},
                          separators=(",", ":")).encode()


def sign_root(key: bytes | str, domain: Domain, window: int, root: bytes) -> SignedRoot:
    signed = Account.sign_message(encode_defunct(primitive=root_digest(domain, window, root)), key)
    return SignedRoot(domain, window, Digest(bytes(root)), bytes(signed.signature),
                      Address(to_checksum_address(Account.from_key(key).address)))


def _uint(doc: dict, name: str) -> int:
    v = doc.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 64:
        raise RelayError(f"field {name!r} must be an unsigned integer, got {v!r}")
    return v


def _hex(doc: dict, name: str, size: int) -> bytes:
    v = doc.get(name)
    try:
        b = bytes.fromhex(v[2:]) if isinstance(v, str) and v.startswith("0x") else None
    except ValueError:
        b = None
    if b is None or len(b) != size:
        raise RelayError(f"field {name!r} must be 0x-hex of {size} bytes")
    return b


def from_wire(raw: bytes) -> SignedRoot:
    """Parse and authenticate a message: bounded size, every field typed, the signer recovered."""
    doc = _json_object(raw, MAX_MESSAGE_BYTES, "a window-root message")
    contract = doc.get("contract")
    try:
        contract = to_checksum_address(contract)
    except (TypeError, ValueError):
        raise RelayError(f"field 'contract' is not an address: {contract!r}") from None
    domain = Domain(_uint(doc, "chain_id"), contract, _uint(doc, "run_id"), _uint(doc, "epoch"))
    window, root, sig = _uint(doc, "window"), Digest(_hex(doc, "root", 32)), _hex(doc, "signature", 65)
    try:
        signer = Account.recover_message(encode_defunct(primitive=root_digest(domain, window, root)), signature=sig)
    except (BadSignature, ValueError) as exc:  # a bad v, r or s
        raise RelayError(f"the signature does not recover a signer: {exc}") from None
    return SignedRoot(domain, window, root, sig, Address(to_checksum_address(signer)))


def leaf(trainer: str, root: bytes) -> Digest:
    """A trainer's leaf in a window's aggregate: keccak(abi.encode(LEAF_TAG, trainer, root))."""
    return keccak(encode(["bytes32", "address", "bytes32"], [LEAF_TAG, to_checksum_address(trainer), bytes(root)]))


@dataclass(frozen=True)
class Equivocation:
    """Two different roots one trainer signed for one window: both messages, either proves it."""

    first: SignedRoot
    second: SignedRoot


@dataclass(frozen=True)
class Aggregate:
    """One window's post: the root over every trainer position and which positions are filled."""

    window: int
    root: Digest
    bitmap: int
    leaves: tuple[Digest, ...]  # per position, merkle.EMPTY where nobody sent

    def included(self, position: int) -> bool:
        return bool(self.bitmap >> position & 1)

    def proof(self, position: int) -> list[Digest]:
        if not self.included(position):
            raise RelayError(f"position {position} is not in window {self.window}'s aggregate")
        return merkle.prove(self.leaves, position)


def verify_inclusion(aggregate_root: bytes, bitmap: int, trainers: int, position: int, trainer: str, root: bytes,
                     proof: Sequence[bytes]) -> bool:
    """True when `trainer`'s `root` sits at `position` of an aggregate over `trainers` positions."""
    return bool(bitmap >> position & 1) and merkle.verify(aggregate_root, leaf(trainer, root), position, trainers, proof)


@dataclass
class WindowBook:
    """What a relay holds for one domain: each trainer's signed root per window, the equivocations it
    saw, and a per-trainer message budget (a token bucket on the injected clock) so that no member
    can flood it. `positions[i]` is the trainer at contract slot i eligible in the epoch ("" for a slot
    nobody eligible holds): a trainer's position is its slot, which fixes its leaf and its bit."""

    domain: Domain
    positions: Sequence[str]
    clock: Callable[[], float]
    burst: int = 8
    per_second: float = 1.0
    roots: dict[tuple[int, str], SignedRoot] = field(default_factory=dict)
    equivocations: list[Equivocation] = field(default_factory=list)
    _bucket: dict[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.positions) > MAX_TRAINERS:
            raise RelayError(f"an aggregate covers at most {MAX_TRAINERS} trainers, got {len(self.positions)}")
        self._at = [to_checksum_address(t) if t else None for t in self.positions]
        self._index = {t: i for i, t in enumerate(self._at) if t}

    def _spend(self, who: str) -> None:
        now = self.clock()
        tokens, last = self._bucket.get(who, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - last) * self.per_second)
        if tokens < 1:
            raise RateLimited(f"{who} sends window roots faster than {self.per_second}/s: slow down and retry")
        self._bucket[who] = (tokens - 1, now)

    def accept(self, msg: SignedRoot, window_count: int) -> bool:
        """Keep a message; True when it is new. Refuses another domain, an unknown signer, a window
        outside the epoch, a flood; a second different root for a window is kept as evidence and refused."""
        if msg.domain != self.domain:
            raise RelayError(f"this relay collects {self.domain}, not {msg.domain}")
        if msg.trainer not in self._index:
            raise RelayError(f"{msg.trainer} is not a trainer of run {self.domain.run_id}, epoch {self.domain.epoch}")
        if not 0 <= msg.window < window_count:
            raise RelayError(f"window {msg.window} outside 0..{window_count - 1}")
        self._spend(msg.trainer)
        held = self.roots.get((msg.window, msg.trainer))
        if held is not None:
            if held.root == msg.root:
                return False  # a retry of the same root: harmless
            self.equivocations.append(Equivocation(held, msg))
            raise Equivocated(f"{msg.trainer} signed two roots for window {msg.window}: kept as evidence, the first stands")
        self.roots[(msg.window, msg.trainer)] = msg
        return True

    def aggregate(self, window: int) -> Aggregate:
        leaves, bitmap = [], 0
        for i, t in enumerate(self._at):
            m = self.roots.get((window, t)) if t else None
            leaves.append(leaf(m.trainer, m.root) if m else merkle.EMPTY)
            bitmap |= (m is not None) << i
        return Aggregate(window, merkle.root(leaves) if leaves else merkle.EMPTY, bitmap, tuple(leaves))

    def complete(self, window: int) -> bool:
        """Every eligible trainer's root of `window` is in."""
        return all((window, t) in self.roots for t in self._index)

    def evidence(self, window: int) -> bytes:
        """The document published with window's aggregate: each position's signed message (or null)."""
        msgs = [self.roots.get((window, t)) if t else None for t in self._at]
        return json.dumps({"format": EVIDENCE_FORMAT, "window": window,
                           "messages": [m.to_wire().decode() if m else None for m in msgs]},
                          separators=(",", ":")).encode()


def read_evidence(raw: bytes, domain: Domain, window: int, root: bytes, bitmap: int) -> dict[int, SignedRoot]:
    """The roots an aggregate post binds, by position: each entry of the window's evidence is a message
    its signer signed for this domain and window, and the evidence must rebuild the posted root and
    bitmap exactly; anything else (a message of another domain, window or signer, a root or bitmap
    that does not match) is a RelayError, and then the post binds nobody. A reader asks for its own
    position only (`protocol.windowdraw.evidence_root`): it needs no list of the other trainers, so two
    readers of one post never disagree about it because they read the membership at different times."""
    doc = _json_object(raw, MAX_EVIDENCE_BYTES, "window evidence")
    if doc.get("format") != EVIDENCE_FORMAT or doc.get("window") != window:
        raise RelayError(f"not the {EVIDENCE_FORMAT} document of window {window}")
    msgs = doc.get("messages")
    if not isinstance(msgs, list) or not 0 < len(msgs) <= MAX_TRAINERS:
        raise RelayError(f"window evidence must hold one entry per trainer position (1..{MAX_TRAINERS})")
    leaves, bits, bound = [], 0, {}
    for i, m in enumerate(msgs):
        if m is None:
            leaves.append(merkle.EMPTY)
            continue
        if not isinstance(m, str):
            raise RelayError(f"evidence entry {i} is not a message")
        sr = from_wire(m.encode())
        if sr.domain != domain or sr.window != window:
            raise RelayError(f"evidence entry {i} is not a root of window {window} in this epoch")
        leaves.append(leaf(sr.trainer, sr.root))
        bits |= 1 << i
        bound[i] = sr
    if bits != bitmap or merkle.root(leaves) != bytes(root):
        raise RelayError(f"window {window}'s evidence does not rebuild the posted root and bitmap")
    return bound
