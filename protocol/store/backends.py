"""The content store: put bytes, get them back by CID, verified. Nodes get a `Store` injected.

Two backends give the same CIDs (what `ipfs add` with default options gives, protocol/store/unixfs.py):

- `LocalStore(dir)`: a content-addressed directory, the embedded default for the demo and tests.
  Objects are whole files named by CID, written to a temp file and renamed into place, so several
  processes can share one directory and nobody ever sees a partial object.
- `IpfsStore(api)`: a real IPFS node through its Kubo RPC API (ipfshttpclient), the production path.

Nothing a backend returns is trusted: every byte is re-hashed into a CID (and, if the caller has an
on-chain keccak digest, into that too) before `get` returns or `get_to_file` renames the file into
place. Sizes are capped by `max_size` while reading, so an oversized object is refused without
being held. Large objects stream in bounded pieces.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import time
import warnings
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, Self

from Crypto.Hash import keccak as _keccak

from protocol.cpumeter import CpuMeter
from protocol.errors import VerilocoError
from protocol.store.unixfs import CidBuilder, CidError, validate_cid
from protocol.types import Cid

DEFAULT_MAX_SIZE = 4 << 30
READ_SIZE = 1 << 20
DEFAULT_IPFS_API = "/ip4/127.0.0.1/tcp/5001"

Progress = Callable[[int], None]  # called with the number of verified-or-not bytes read so far


class StoreError(VerilocoError):
    """Any failure of the content store."""


class NotFound(StoreError):
    """The store does not have the content."""


class IntegrityError(StoreError):
    """The bytes a backend returned do not match the CID (or the expected digest)."""


class TooLarge(StoreError):
    """The content is bigger than the caller's limit."""


class StoreUnavailable(StoreError):
    """The backend cannot be reached or stopped answering."""


class StoreTimeout(StoreUnavailable):
    """The backend did not deliver in time."""


class _Check:
    """Running verification of a download: size cap, CID, optional keccak digest."""

    def __init__(self, cid: Cid, max_size: int, digest: bytes | None, where: str) -> None:
        self.cid, self.max_size, self.digest, self.where = cid, max_size, digest, where
        self.builder = CidBuilder()
        self.keccak = _keccak.new(digest_bits=256) if digest is not None else None

    def update(self, chunk: bytes | memoryview) -> None:
        if self.builder.size + len(chunk) > self.max_size:
            raise TooLarge(
                f"{self.cid} from {self.where} is larger than the {self.max_size}-byte limit; "
                "raise max_size if this content is expected to be that big"
            )
        self.builder.update(chunk)
        if self.keccak is not None:
            self.keccak.update(chunk)

    def finish(self) -> int:
        got = self.builder.finish()
        if got != self.cid:
            raise IntegrityError(
                f"content returned by {self.where} for {self.cid} hashes to {got} "
                f"({self.builder.size} bytes): corrupt or substituted data; it was not used, "
                "fetch it again or from another source"
            )
        if self.keccak is not None and self.keccak.digest() != self.digest:
            raise IntegrityError(
                f"{self.cid} from {self.where} matches its CID but not the expected keccak digest "
                f"0x{bytes(self.digest or b'').hex()}: the CID published for it is wrong"
            )
        return self.builder.size


def _cid(cid: str) -> Cid:
    try:
        return validate_cid(cid)
    except CidError as exc:
        raise StoreError(str(exc)) from None


def _recheck(cid: Cid, data: bytes, max_size: int, digest: bytes | None, where: str) -> None:
    """What a fetch checks of content already verified against `cid`: its size cap and keccak digest."""
    if len(data) > max_size:
        raise TooLarge(f"{cid} from {where} is larger than the {max_size}-byte limit; "
                       "raise max_size if this content is expected to be that big")
    if digest is not None and _keccak.new(digest_bits=256, data=data).digest() != digest:
        raise IntegrityError(f"{cid} from {where} matches its CID but not the expected keccak digest "
                             f"0x{digest.hex()}: the CID published for it is wrong")


def _pieces(chunks: Iterable[bytes | bytearray | memoryview], size: int = 4 << 20) -> Iterator[memoryview]:
    """The same bytes as views of at most `size` bytes (so hashing and writing can overlap)."""
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        for i in range(0, len(view), size):
            yield view[i : i + size]


class Store(ABC):
    """Put content, get it back by CID, verified. Both backends name content identically."""

    @abstractmethod
    def put_stream(self, chunks: Iterable[bytes | bytearray | memoryview]) -> Cid:
        """Store the concatenation of `chunks`; returns its CID. Pieces may be any size."""

    def put(self, data: bytes | bytearray | memoryview) -> Cid:
        return self.put_stream([data])

    def close(self) -> None:
        """Release connections (nothing to do for a directory)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def put_file(self, path: Path | str) -> Cid:
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed by the `with` below
        except OSError as exc:
            raise StoreError(f"cannot publish {path}: {exc.strerror or exc}") from None
        with f:
            return self.put_stream(iter(lambda: f.read(READ_SIZE), b""))

    @abstractmethod
    def _stream(self, cid: Cid, max_size: int) -> Iterator[bytes]:
        """Raw, unverified bytes of `cid` (at most max_size + 1 of them are requested)."""

    @abstractmethod
    def has(self, cid: str) -> bool:
        """Whether the content is held by this store (without fetching it)."""

    @abstractmethod
    def pin(self, cid: str) -> None:
        """Keep the content from being garbage-collected."""

    @property
    @abstractmethod
    def where(self) -> str:
        """A short description of the backend for error messages."""

    def get(self, cid: str, *, max_size: int = DEFAULT_MAX_SIZE, digest: bytes | None = None,
            fresh: bool = False) -> bytes:
        """The verified bytes of `cid`; IntegrityError if they do not match it (or `digest`). ``fresh``: from the
        backend itself, past any cache in front of it (`Metered`'s): for a read that asks whether the store
        still serves the content (an availability vote), not for its bytes."""
        c = _cid(cid)
        check = _Check(c, max_size, digest, self.where)
        buf = io.BytesIO()
        for chunk in self._stream(c, max_size):
            check.update(chunk)
            buf.write(chunk)
        check.finish()
        return buf.getvalue()  # shares BytesIO's buffer: no second copy

    def get_to_file(
        self,
        cid: str,
        path: Path | str,
        *,
        max_size: int = DEFAULT_MAX_SIZE,
        digest: bytes | None = None,
        progress: Progress | None = None,
    ) -> int:
        """Stream `cid` into `path`; the file appears (atomically) only once verified. Returns its size."""
        c = _cid(cid)
        path = Path(path)
        check = _Check(c, max_size, digest, self.where)
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
        except OSError as exc:
            raise StoreError(f"cannot write {path} for {c}: {exc}") from None
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in self._stream(c, max_size):
                    check.update(chunk)
                    f.write(chunk)
                    if progress is not None:
                        progress(check.builder.size)
            size = check.finish()
            os.replace(tmp, path)
            return size
        except OSError as exc:
            raise StoreError(f"cannot write {path} for {c}: {exc}") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


class LocalStore(Store):
    """A content-addressed directory: `objects/<xy>/<cid>` files, written by atomic rename."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self._objects = self.root / "objects"
        self._tmp = self.root / "tmp"
        try:
            self._objects.mkdir(parents=True, exist_ok=True)
            self._tmp.mkdir(exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"cannot use {self.root} as a store directory: {exc}") from None

    @property
    def where(self) -> str:
        return f"local store {self.root}"

    def path_of(self, cid: Cid) -> Path:
        return self._objects / cid[-2:] / cid

    def put_stream(self, chunks: Iterable[bytes | bytearray | memoryview]) -> Cid:
        builder = CidBuilder()
        fd, tmp = tempfile.mkstemp(dir=self._tmp, suffix=".part")
        try:
            # write each piece on a second thread while this one hashes it: both release the GIL
            with os.fdopen(fd, "wb") as f, ThreadPoolExecutor(1) as writer:
                for piece in _pieces(chunks):
                    done = writer.submit(f.write, piece)
                    builder.update(piece)
                    done.result()
            cid = builder.finish()
            dest = self.path_of(cid)
            dest.parent.mkdir(exist_ok=True)
            os.replace(tmp, dest)  # atomic; a concurrent writer of the same CID wrote the same bytes
            return cid
        except OSError as exc:
            raise StoreUnavailable(f"cannot write to {self.where}: {exc}") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _open(self, cid: Cid, max_size: int) -> io.BufferedReader:
        try:
            f = open(self.path_of(cid), "rb")  # noqa: SIM115 - the caller's `with` closes it
        except FileNotFoundError:
            raise NotFound(f"{cid} is not in {self.where}; put it there or fetch it from IPFS") from None
        except OSError as exc:
            raise StoreUnavailable(f"cannot read {cid} from {self.where}: {exc}") from None
        size = os.fstat(f.fileno()).st_size
        if size > max_size:
            f.close()
            raise TooLarge(f"{cid} in {self.where} is {size} bytes, over the {max_size}-byte limit")
        return f

    def _stream(self, cid: Cid, max_size: int) -> Iterator[bytes]:
        with self._open(cid, max_size) as f:
            while chunk := f.read(READ_SIZE):
                yield chunk

    def get(self, cid: str, *, max_size: int = DEFAULT_MAX_SIZE, digest: bytes | None = None,
            fresh: bool = False) -> bytes:
        c = _cid(cid)
        with self._open(c, max_size) as f:
            data = f.read()  # one copy; verified through a view below
        check = _Check(c, max_size, digest, self.where)
        check.update(memoryview(data))
        self._finish(check, c)
        return data

    def get_to_file(
        self,
        cid: str,
        path: Path | str,
        *,
        max_size: int = DEFAULT_MAX_SIZE,
        digest: bytes | None = None,
        progress: Progress | None = None,
    ) -> int:
        try:
            return super().get_to_file(cid, path, max_size=max_size, digest=digest, progress=progress)
        except IntegrityError:
            self._quarantine(_cid(cid))
            raise

    def _finish(self, check: _Check, cid: Cid) -> None:
        try:
            check.finish()
        except IntegrityError:
            self._quarantine(cid)
            raise

    def _quarantine(self, cid: Cid) -> None:
        """Move a corrupt object out of the way so a later put can restore it."""
        src = self.path_of(cid)
        dst = self._tmp / f"corrupt-{cid}-{os.getpid()}-{time.monotonic_ns()}"
        with contextlib.suppress(FileNotFoundError):
            os.replace(src, dst)
            os.unlink(dst)

    def has(self, cid: str) -> bool:
        return self.path_of(_cid(cid)).is_file()

    def pin(self, cid: str) -> None:
        if not self.has(cid):
            raise NotFound(f"cannot pin {cid}: it is not in {self.where}")


def _transport_errors() -> tuple[type[BaseException], ...]:
    """What ipfshttpclient and the HTTP stack under it raise for a failed or broken request."""
    import ipfshttpclient.exceptions
    import requests
    import urllib3.exceptions

    return (
        ipfshttpclient.exceptions.Error,
        requests.RequestException,
        urllib3.exceptions.HTTPError,
        OSError,
    )


class IpfsStore(Store):
    """A real IPFS node's Kubo RPC API (e.g. /ip4/127.0.0.1/tcp/5001), through ipfshttpclient.

    `timeout` bounds each request's connect and each read; `deadline` bounds a whole transfer.
    """

    # explicit defaults, so a daemon configured otherwise (CIDv1, raw leaves) still agrees with us
    _ADD_OPTS: ClassVar[dict[str, str]] = {"cid-version": "0", "raw-leaves": "false", "chunker": "size-262144", "pin": "true"}

    def __init__(self, api: str = DEFAULT_IPFS_API, *, timeout: float = 30.0, deadline: float = 600.0):
        import ipfshttpclient  # imported here: only the production path needs it

        # ipfshttpclient 0.7 hands urllib3 2 a `strict` flag it only warns about, on every request; a
        # node operator can do nothing about it, so it is not printed
        warnings.filterwarnings("ignore", message="The 'strict' parameter is no longer needed", category=FutureWarning)

        self.api, self.timeout, self.deadline = api, timeout, deadline
        self._errors = _transport_errors()
        bad_address: tuple[type[BaseException], ...] = (*self._errors, ValueError, TypeError)
        try:
            # connect() rejects every current daemon version, so construct the client directly
            self._client: Any = ipfshttpclient.Client(api, timeout=timeout, chunk_size=READ_SIZE)
        except bad_address as exc:  # bad multiaddr and the like
            raise StoreUnavailable(f"cannot use IPFS API address {api!r}: {exc}") from None

    @property
    def where(self) -> str:
        return f"IPFS node at {self.api}"

    def close(self) -> None:
        self._client.close()

    def _translate(self, exc: BaseException, what: str, cid: str | None = None) -> StoreError:
        import ipfshttpclient.exceptions as ie

        name = type(exc).__name__
        subject = f"{what} {cid}" if cid else what
        if isinstance(exc, StoreError):
            return exc
        if isinstance(exc, ie.TimeoutError) or "Timeout" in name:
            return StoreTimeout(f"{subject}: {self.where} did not answer in time ({exc})")
        if isinstance(exc, ie.ErrorResponse):
            msg = str(exc)
            if "timed out" in msg:
                return StoreTimeout(f"{subject}: {self.where} gave up: {msg}")
            if cid and ("not found" in msg.lower() or "no link" in msg.lower()):
                return NotFound(f"{cid} is not available from {self.where}: {msg}")
            return StoreError(f"{subject}: {self.where} refused: {msg}")
        return StoreUnavailable(
            f"{subject}: lost contact with {self.where} ({name}: {exc}); is the daemon running? "
            "point --ipfs-api at a running Kubo RPC API"
        )

    def put_stream(self, chunks: Iterable[bytes | bytearray | memoryview]) -> Cid:
        builder = CidBuilder()

        def hashed() -> Iterator[memoryview]:  # the upload is streamed; we name it as it goes
            for piece in _pieces(chunks, READ_SIZE):
                builder.update(piece)
                yield piece

        try:
            res = self._client.add_bytes(hashed(), opts=dict(self._ADD_OPTS))
        except self._errors as exc:
            raise self._translate(exc, "adding content to") from None
        ours = builder.finish()
        theirs = res if isinstance(res, str) else res["Hash"]  # add_bytes gives the hash string
        if theirs != ours:
            raise IntegrityError(
                f"{self.where} named the added content {theirs} but its bytes hash to {ours}: the "
                "node does not add with default options (CIDv0, 256 KiB chunks, balanced DAG)"
            )
        return ours

    def _root_available(self, cid: Cid, wait: float) -> bool:
        """Whether the node has (or finds within `wait` s) the root block of `cid`."""
        try:
            self._client.block.stat(cid, opts={"timeout": f"{wait:g}s"}, timeout=wait + self.timeout)
            return True
        except self._errors as exc:
            err = self._translate(exc, "looking up", cid)
            if "timed out" in str(exc) or isinstance(err, NotFound):
                return False
            raise err from None

    def _stream(self, cid: Cid, max_size: int) -> Iterator[bytes]:
        if not self._root_available(cid, self.timeout):
            raise NotFound(
                f"{cid} could not be found by {self.where} within {self.timeout:g} s; check that "
                "the publisher's node is reachable, or raise the store timeout"
            )
        end = time.monotonic() + self.deadline
        try:
            stream = self._client.cat(
                cid,
                length=max_size + 1,  # never accept more than one byte over the limit
                opts={"timeout": f"{self.deadline:g}s"},
                stream=True,
                timeout=self.timeout,
            )
            for chunk in stream:
                if time.monotonic() > end:
                    raise StoreTimeout(
                        f"fetching {cid} from {self.where} took longer than {self.deadline:g} s"
                    )
                yield chunk
        except GeneratorExit:
            raise
        except self._errors as exc:
            raise self._translate(exc, "fetching", cid) from None

    def has(self, cid: str) -> bool:
        """Whether the node holds the root block (asks with a short server-side timeout)."""
        return self._root_available(_cid(cid), 1.0)

    def pin(self, cid: str) -> None:
        c = _cid(cid)
        if not self._root_available(c, self.timeout):
            raise NotFound(f"cannot pin {c}: {self.where} could not find it within {self.timeout:g} s")
        try:
            self._client.pin.add(c, opts={"timeout": f"{self.deadline:g}s"}, timeout=self.deadline)
        except self._errors as exc:
            raise self._translate(exc, "pinning", c) from None


class CidCache:
    """The newest verified objects a node got or put, by CID, within a byte budget (least recently used
    out first).

    Content addressing makes a hit as good as a fetch: the bytes were checked against their CID when
    they came in (or named by it when this node put them). A node reads each payload of an epoch twice
    (for the global model and for the public rank/H schedule) and its own once more; without this,
    each of those reads crosses the network again and counts as traffic.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._items: OrderedDict[Cid, bytes] = OrderedDict()
        self._held = 0
        self.hits = 0

    def get(self, cid: Cid) -> bytes | None:
        data = self._items.get(cid)
        if data is not None:
            self._items.move_to_end(cid)
            self.hits += 1
        return data

    def keep(self, cid: Cid, data: bytes) -> None:
        if len(data) > self.budget // 2 or cid in self._items:  # one object never takes the whole budget
            return
        self._items[cid] = data
        self._held += len(data)
        while self._held > self.budget:
            _, old = self._items.popitem(last=False)
            self._held -= len(old)


DEFAULT_READ_CACHE = 256 << 20  # a small run's payloads for a few epochs; a large model's payload is never held


class Metered(Store):
    """A store that counts the bytes a node sends (`put`) and receives (`get`) through it.

    What a node reports as its traffic is measured here, at the one edge all its content passes,
    rather than added up from what it thinks it published: nothing it uploads or downloads is missed.
    With ``cache_bytes``, whole-object reads and writes of up to half that size are kept (``CidCache``):
    a repeated read is answered locally, checked against ``max_size`` and ``digest`` as a fetch would be,
    and moves no byte.
    """

    def __init__(self, inner: Store, cache_bytes: int = 0) -> None:
        self.inner = inner
        self.sent = 0
        self.received = 0
        self.cpu = CpuMeter()  # this node's CPU in gets and puts: hashing, verifying, copying
        self.cache = CidCache(cache_bytes) if cache_bytes > 0 else None

    @property
    def where(self) -> str:
        return self.inner.where

    def close(self) -> None:
        self.inner.close()

    def put_stream(self, chunks: Iterable[bytes | bytearray | memoryview]) -> Cid:
        limit = self.cache.budget // 2 if self.cache is not None else -1
        held: list[bytes] | None = [] if limit >= 0 else None
        size = 0

        def counted() -> Iterator[bytes | bytearray | memoryview]:
            nonlocal held, size
            for chunk in chunks:
                n = memoryview(chunk).nbytes
                self.sent += n
                size += n
                if held is not None and size <= limit:
                    held.append(bytes(chunk))
                else:
                    held = None
                yield chunk

        with self.cpu.measure():
            cid = self.inner.put_stream(counted())
        if self.cache is not None and held is not None:
            self.cache.keep(cid, b"".join(held))
        return cid

    def _stream(self, cid: Cid, max_size: int) -> Iterator[bytes]:
        for chunk in self.inner._stream(cid, max_size):
            self.received += len(chunk)
            yield chunk

    def get(self, cid: str, *, max_size: int = DEFAULT_MAX_SIZE, digest: bytes | None = None,
            fresh: bool = False) -> bytes:
        c = _cid(cid)
        data = self.cache.get(c) if self.cache is not None and not fresh else None
        if data is not None:
            with self.cpu.measure():
                _recheck(c, data, max_size, digest, "this node's cache")
            return data
        with self.cpu.measure():
            data = self.inner.get(c, max_size=max_size, digest=digest, fresh=fresh)
        self.received += len(data)
        if self.cache is not None:
            self.cache.keep(c, data)
        return data

    def get_to_file(
        self,
        cid: str,
        path: Path | str,
        *,
        max_size: int = DEFAULT_MAX_SIZE,
        digest: bytes | None = None,
        progress: Progress | None = None,
    ) -> int:
        with self.cpu.measure():
            size = self.inner.get_to_file(cid, path, max_size=max_size, digest=digest, progress=progress)
        self.received += size
        return size

    def has(self, cid: str) -> bool:
        return self.inner.has(cid)

    def pin(self, cid: str) -> None:
        self.inner.pin(cid)
