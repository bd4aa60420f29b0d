"""CIDs exactly as `ipfs add` with default options computes them, without a node.

Default `ipfs add` means: CIDv0 (base58btc sha2-256 multihash), 256 KiB fixed-size chunks, leaves
that are dag-pb nodes holding a UnixFS File message with the chunk (raw leaves off), and a balanced
DAG whose nodes have at most 174 links. Kubo and js-ipfs build the same tree: leaves are grouped 174
at a time into parents, parents 174 at a time into grandparents, until one node is left; a file of
one chunk is just its leaf. Computing this ourselves lets `LocalStore` hand out the same names as a
real node, and lets every reader re-verify what any node returns before trusting it.

The builder is incremental (`CidBuilder.update` / `.finish`) so a file of any size is named in one
pass with memory bounded by one chunk plus a few hundred link records.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from protocol.errors import VerilocoError
from protocol.types import Cid

CHUNK_SIZE = 262144
MAX_LINKS = 174

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_INDEX = {c: i for i, c in enumerate(_B58)}
_SHA256_MH = b"\x12\x20"  # multihash: sha2-256, 32-byte digest
_UNIXFS_FILE = 2


class CidError(VerilocoError):
    """A string that is not a CID this protocol can verify (CIDv0, dag-pb, sha2-256)."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field_bytes(tag: int, value: bytes) -> bytes:
    return _varint(tag << 3 | 2) + _varint(len(value)) + value


def _field_varint(tag: int, value: int) -> bytes:
    return _varint(tag << 3) + _varint(value)


def b58encode(raw: bytes) -> str:
    n = int.from_bytes(raw, "big")
    out = []
    while n:
        n, r = divmod(n, 58)
        out.append(_B58[r])
    zeros = len(raw) - len(raw.lstrip(b"\x00"))
    return "1" * zeros + "".join(reversed(out))


def b58decode(text: str) -> bytes:
    n = 0
    for c in text:
        if c not in _B58_INDEX:
            raise CidError(f"{text!r} is not base58btc (bad character {c!r})")
        n = n * 58 + _B58_INDEX[c]
    zeros = len(text) - len(text.lstrip("1"))
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    return b"\x00" * zeros + body


def cid_of_block(block: bytes | memoryview) -> Cid:
    """CIDv0 of one dag-pb block: base58btc(sha2-256 multihash of the block bytes)."""
    return Cid(b58encode(_SHA256_MH + hashlib.sha256(block).digest()))


def multihash_of(cid: str) -> bytes:
    """The 34-byte sha2-256 multihash inside a CIDv0, or CidError if `cid` is not one."""
    if not isinstance(cid, str) or len(cid) != 46 or not cid.startswith("Qm"):
        raise CidError(
            f"{cid!r} is not a CIDv0 (46 characters starting with 'Qm'); veriloco names content "
            "with what `ipfs add` gives by default"
        )
    raw = b58decode(cid)
    if len(raw) != 34 or raw[:2] != _SHA256_MH:
        raise CidError(f"{cid!r} is not a sha2-256 CIDv0")
    return raw


def validate_cid(cid: str) -> Cid:
    """Return `cid` typed as Cid after checking it is a well-formed CIDv0."""
    multihash_of(cid)
    return Cid(cid)


def unixfs_file(data: bytes | memoryview, filesize: int, blocksizes: Iterable[int] = ()) -> bytes:
    """A UnixFS `Data` message of type File (proto2: blocksizes repeated, not packed)."""
    out = _field_varint(1, _UNIXFS_FILE)
    if len(data):
        out += _field_bytes(2, bytes(data))
    out += _field_varint(3, filesize)
    for b in blocksizes:
        out += _field_varint(4, b)
    return out


def dagpb_node(data: bytes, links: Iterable[Link] = ()) -> bytes:
    """A dag-pb PBNode in canonical order: Links (field 2) before Data (field 1)."""
    out = bytearray()
    for link in links:
        body = _field_bytes(1, link.multihash) + _field_bytes(2, b"") + _field_varint(3, link.tsize)
        out += _field_bytes(2, body)
    out += _field_bytes(1, data)
    return bytes(out)


@dataclass(frozen=True)
class Link:
    """One child of a DAG node: its multihash, cumulative block size (Tsize) and file bytes below it."""

    multihash: bytes
    tsize: int
    filesize: int


def _leaf_parts(chunk: bytes | bytearray | memoryview) -> tuple[bytes, bytes]:
    """The bytes around `chunk` in its leaf block, so the block is hashed without being copied."""
    n = len(chunk)
    data_field = (_varint(2 << 3 | 2) + _varint(n)) if n else b""
    tail = _field_varint(3, n)
    inner_len = len(_field_varint(1, _UNIXFS_FILE)) + len(data_field) + n + len(tail)
    head = _varint(1 << 3 | 2) + _varint(inner_len) + _field_varint(1, _UNIXFS_FILE) + data_field
    return head, tail


def leaf_block(chunk: bytes | bytearray | memoryview) -> bytes:
    """The dag-pb block of one leaf (a UnixFS File node holding `chunk`)."""
    head, tail = _leaf_parts(chunk)
    return head + bytes(chunk) + tail


def _leaf_link(chunk: bytes | bytearray | memoryview) -> Link:
    head, tail = _leaf_parts(chunk)
    h = hashlib.sha256(head)
    h.update(chunk)
    h.update(tail)
    return Link(_SHA256_MH + h.digest(), len(head) + len(chunk) + len(tail), len(chunk))


def _parent(children: list[Link]) -> tuple[bytes, Link]:
    filesize = sum(c.filesize for c in children)
    block = dagpb_node(unixfs_file(b"", filesize, [c.filesize for c in children]), children)
    mh = _SHA256_MH + hashlib.sha256(block).digest()
    return block, Link(mh, len(block) + sum(c.tsize for c in children), filesize)


class CidBuilder:
    """Feed bytes in any pieces; `finish()` returns the CID `ipfs add` would give for them all.

    `blocks` is an optional callback receiving every (multihash, block) as it is made, for stores
    that keep blocks; the CID itself needs none of them kept.
    """

    def __init__(self, *, chunk_size: int = CHUNK_SIZE, max_links: int = MAX_LINKS) -> None:
        if chunk_size < 1 or max_links < 2:
            raise ValueError("chunk_size must be >= 1 and max_links >= 2")
        self._chunk_size, self._max_links = chunk_size, max_links
        self._pending = bytearray()
        self._levels: list[list[Link]] = [[]]
        self._chunks = 0
        self._size = 0
        self._done = False

    @property
    def size(self) -> int:
        return self._size

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if self._done:
            raise RuntimeError("CidBuilder already finished")
        view = memoryview(data).cast("B")
        self._size += len(view)
        if self._pending:
            need = self._chunk_size - len(self._pending)
            self._pending += view[:need]
            view = view[need:]
            if len(self._pending) < self._chunk_size:
                return
            self._add_chunk(self._pending)
            self._pending = bytearray()
        # whole chunks straight from the caller's buffer; keep the last (possibly full) piece
        # pending so finish() sees at least one chunk and an exact multiple is not split wrongly
        while len(view) > self._chunk_size:
            self._add_chunk(view[: self._chunk_size])
            view = view[self._chunk_size :]
        self._pending += view

    def _add_chunk(self, chunk: bytes | bytearray | memoryview) -> None:
        self._chunks += 1
        self._push(0, _leaf_link(chunk))

    def _push(self, level: int, link: Link) -> None:
        if len(self._levels) == level:
            self._levels.append([])
        self._levels[level].append(link)
        if len(self._levels[level]) == self._max_links:
            children, self._levels[level] = self._levels[level], []
            self._push(level + 1, _parent(children)[1])

    def finish(self) -> Cid:
        if self._done:
            raise RuntimeError("CidBuilder already finished")
        self._done = True
        if self._pending or self._chunks == 0:  # an empty file is one empty leaf
            self._add_chunk(self._pending)
        level = 0
        while True:
            above = any(self._levels[level + 1 :])
            here = self._levels[level]
            if not above and len(here) == 1:
                return Cid(b58encode(here[0].multihash))
            if here:
                self._levels[level] = []
                self._push(level + 1, _parent(here)[1])
            level += 1


def cid_of(data: bytes | bytearray | memoryview) -> Cid:
    """The CID of `data` as `ipfs add` with default options gives it."""
    b = CidBuilder()
    b.update(data)
    return b.finish()


def cid_of_chunks(chunks: Iterable[bytes | bytearray | memoryview]) -> tuple[Cid, int]:
    """The CID and total size of the concatenation of `chunks`, in one streaming pass."""
    b = CidBuilder()
    for c in chunks:
        b.update(c)
    return b.finish(), b.size
